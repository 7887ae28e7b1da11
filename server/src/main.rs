// The server's code forbids `unsafe`; this entry point allows it for one allocator setting
// made before anything else runs (below).
#![deny(unsafe_code)]

fn main() -> anyhow::Result<()> {
    keep_large_allocations_returnable();
    coderoom_server::cli::main()
}

/// glibc serves allocations of 128 KiB and more with their own mappings, returned to the
/// system when freed, but raises that threshold to the size of each such block freed (up to
/// 32 MiB): after the first 1 MiB document is sent and freed, the next ones come from the heap,
/// where what is freed stays in the process. A server that sends a large document to each of
/// many joiners then keeps tens of MiB it no longer uses (`density.rs` saw 0 to 71 KiB per idle
/// joiner of a 1 MiB document from one run to the next). Fixed at glibc's default starting
/// value, the threshold no longer moves: large transient buffers go back when freed.
#[allow(unsafe_code)]
fn keep_large_allocations_returnable() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and changes the allocator's settings; it is called
    // before any other thread of this process exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

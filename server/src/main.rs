// The server's code forbids `unsafe`; this entry point allows it for the allocator's settings
// and the thread that gives freed memory back (below), made before anything else runs.
#![deny(unsafe_code)]

fn main() -> anyhow::Result<()> {
    keep_large_allocations_returnable();
    // Only for the commands that run for long. Not for the agent (`coderoom agent`: a sandbox's
    // machinery and the start of every command room code runs), which forks before any thread
    // exists and counts against the sandbox's limits; one-shot commands end first anyway.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|c| c == "serve" || c == "sandbox-host")
    {
        give_freed_memory_back();
    }
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

/// glibc gives back to the system only the free memory at the top of each arena: what a burst
/// freed below memory still in use (a room filling with 200 joiners, each one's presence sent
/// to all the others, the frames freed once written) stays resident as holes between what the
/// idle connections keep. `malloc_trim` releases the whole free pages of those holes too; a
/// thread looks every 5 s and trims when more lies free than the least seen since the last
/// trim: 4 MiB more while memory is still being freed, 1 MiB once a look finds no more freed
/// than the one before (what jemalloc's and mimalloc's background purging does, which glibc
/// lacks).
#[allow(unsafe_code)]
fn give_freed_memory_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const EVERY: std::time::Duration = std::time::Duration::from_secs(5);
        const WHILE_FREEING: usize = 4 << 20;
        const ONCE_QUIET: usize = 1 << 20;
        // SAFETY: mallinfo2 takes nothing and returns a plain struct.
        let free_now = || unsafe { libc::mallinfo2() }.fordblks;
        let spawned = std::thread::Builder::new()
            .name("malloc-trim".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                // The least free since the last trim (freed memory used again is resident
                // again), and what the last look found.
                let mut least = free_now();
                let mut last = least;
                loop {
                    std::thread::sleep(EVERY);
                    let free = free_now();
                    let more = free.saturating_sub(least);
                    if more >= WHILE_FREEING || (more >= ONCE_QUIET && free <= last) {
                        // SAFETY: malloc_trim takes an integer (the top padding to keep) and
                        // releases free pages; glibc locks each arena while it walks it.
                        unsafe {
                            libc::malloc_trim(0);
                        }
                        least = free_now();
                    } else {
                        least = least.min(free);
                    }
                    last = free;
                }
            });
        if let Err(e) = spawned {
            eprintln!("warning: no thread to give freed memory back: {e}");
        }
    }
}

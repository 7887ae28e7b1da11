//! The seccomp filter every sandboxed process runs under, compiled with `seccompiler` (the
//! rust-vmm / firecracker compiler) and handed to bubblewrap as a BPF program.
//!
//! Policy: deny-list. Calls that reach kernel attack surface a coding workspace never needs
//! (mounting, tracing, BPF, keyrings, kexec, perf, userfaultfd, module loading, namespace games,
//! clock and swap changes) fail with `EPERM`. Anything not of the native ABI is refused: the
//! i386 ABI (`int 0x80`) kills the process via the architecture check, and every x32 syscall
//! number (bit 30 set) fails with `EPERM`.
//!
//! The x32 numbers are refused by one bit test ahead of seccompiler's program (which has no
//! ranges, only numbers), as libseccomp does: listed one by one they made a program of ~3,000
//! instructions that the kernel took ~3 ms to load at every sandbox start, and that every
//! system call of room code walked (docs/benchmarks.md, "Sandbox cold start").

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use std::collections::BTreeMap;

/// Marks x32 ABI syscall numbers on x86_64.
const X32_SYSCALL_BIT: i64 = 0x4000_0000;
/// `AUDIT_ARCH_X86_64` (`linux/audit.h`): what `seccomp_data.arch` reads for the native ABI
/// and for x32 (which differs only by the bit in the number).
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

/// The denied native syscalls, by name (for the receipt) and number.
pub fn denied() -> Vec<(&'static str, i64)> {
    vec![
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("fsopen", libc::SYS_fsopen),
        ("fsmount", libc::SYS_fsmount),
        ("fsconfig", libc::SYS_fsconfig),
        ("fspick", libc::SYS_fspick),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("pivot_root", libc::SYS_pivot_root),
        ("chroot", libc::SYS_chroot),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("bpf", libc::SYS_bpf),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("reboot", libc::SYS_reboot),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("adjtimex", libc::SYS_adjtimex),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("lookup_dcookie", libc::SYS_lookup_dcookie),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("iopl", libc::SYS_iopl),
        ("ioperm", libc::SYS_ioperm),
        ("syslog", libc::SYS_syslog),
        ("vhangup", libc::SYS_vhangup),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("process_madvise", libc::SYS_process_madvise),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
    ]
}

/// Errors compiling the filter (a bug, not an environment problem: the policy is static).
#[derive(Debug, thiserror::Error)]
#[error("cannot compile the seccomp filter: {0}")]
pub struct FilterError(String);

/// Compiles the filter for this machine's architecture.
pub fn compile() -> Result<BpfProgram, FilterError> {
    let mut rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = BTreeMap::new();
    for (_, nr) in denied() {
        rules.insert(nr, Vec::new());
    }
    let arch =
        TargetArch::try_from(std::env::consts::ARCH).map_err(|e| FilterError(format!("{e:?}")))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| FilterError(e.to_string()))?;
    let listed = BpfProgram::try_from(filter).map_err(|e| FilterError(e.to_string()))?;
    if !cfg!(target_arch = "x86_64") {
        return Ok(listed);
    }
    let mut prog = x32_guard();
    prog.extend(listed);
    Ok(prog)
}

/// Refuses every x32 number with `EPERM`, then falls through to the program after it. BPF jumps
/// are relative and only forward, so seccompiler's program works unchanged after these five
/// instructions; a call of another architecture goes straight to it (and its architecture
/// check kills the process).
fn x32_guard() -> BpfProgram {
    let jump = |code: u32, k: u32, jt: u8, jf: u8| seccompiler::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let stmt = |code: u32, k: u32| jump(code, k, 0, 0);
    vec![
        // 0: A = arch
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, ARCH_OFFSET),
        // 1: not x86_64: on to the listed program (at 5)
        jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            AUDIT_ARCH_X86_64,
            0,
            3,
        ),
        // 2: A = number
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, NR_OFFSET),
        // 3: the x32 bit: refused (4); else on to the listed program (5)
        jump(
            libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
            X32_SYSCALL_BIT as u32,
            0,
            1,
        ),
        // 4:
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA),
        ),
    ]
}

/// The program as the bytes of `struct sock_filter[]`, the form `bwrap --seccomp FD` reads.
pub fn to_bytes(prog: &BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(prog.len() * 8);
    for ins in prog {
        out.extend_from_slice(&ins.code.to_ne_bytes());
        out.push(ins.jt);
        out.push(ins.jf);
        out.extend_from_slice(&ins.k.to_ne_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_within_the_kernel_limit() {
        let prog = compile().unwrap();
        // BPF_MAXINSNS: the kernel refuses longer programs; and every system call of room code
        // walks this one, so it stays short (the x32 numbers are one bit test, not a list).
        assert!(prog.len() <= 256, "{} instructions", prog.len());
        assert_eq!(to_bytes(&prog).len(), prog.len() * 8);
        let names: Vec<_> = denied().iter().map(|d| d.0).collect();
        for needed in [
            "mount",
            "ptrace",
            "bpf",
            "keyctl",
            "kexec_load",
            "perf_event_open",
            "userfaultfd",
            "add_key",
        ] {
            assert!(names.contains(&needed), "{needed}");
        }
    }
}

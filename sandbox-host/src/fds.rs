//! Descriptors that must not cross a boundary: between the server and the sandbox, and between
//! the agent and the processes it runs for room code.

use std::os::fd::RawFd;

/// Marks every descriptor from `first` up close-on-exec. Async-signal-safe (a system call or
/// two, no allocation), so it may run between fork and exec.
pub(crate) fn close_on_exec_from(first: RawFd) {
    let Ok(first) = libc::c_uint::try_from(first) else {
        return;
    };
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; no memory
    // is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    // Kernels before 5.11: every descriptor up to the limit, one by one.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer for getrlimit.
    let top = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(1 << 20)
    } else {
        1024
    };
    for fd in first..libc::c_uint::try_from(top).unwrap_or(1024) {
        let Ok(fd) = libc::c_int::try_from(fd) else {
            break;
        };
        // SAFETY: F_SETFD on a number that may not be open fails with EBADF, harmlessly.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn descriptors_from_a_number_up_close_on_exec() {
        let f = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: clearing the flag on a descriptor this test owns.
        unsafe {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFD, 0);
        }
        close_on_exec_from(f.as_raw_fd());
        // SAFETY: F_GETFD on an open descriptor.
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }
}

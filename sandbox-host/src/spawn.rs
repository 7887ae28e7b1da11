//! Starting host processes from the server without copying its address space.
//!
//! `fork` copies the calling process's page tables, and the server maps hundreds of megabytes
//! over many threads: milliseconds per sandbox start, twice (the user namespace's maker and
//! bubblewrap), where a small process forks in a fraction of one. Here the child shares the
//! server's memory (`CLONE_VM`) on a stack of its own, as glibc's `posix_spawn` does:
//!
//! - [`spawn`] also suspends the calling thread until the child has exec'd (`CLONE_VFORK`),
//!   which is what makes the child's steps (the [`ChildHooks`], its standard descriptors)
//!   possible at all where `posix_spawn` has no such steps;
//! - [`clone_vm`] lets the caller run beside the child, for a child that waits on the caller
//!   (the user namespace's maker, [`crate::userns`]).
//!
//! What a child does in the server's memory must touch no lock, no allocator, no thread-local
//! state of a thread that may be running beside it, and no glibc wrapper that acts on "every
//! thread of the process" (the credential calls, which would signal the server's threads):
//! only raw system calls on values prepared before the clone. Every signal is blocked from
//! before the clone, so no handler of the server's runs in the child; [`spawn`]'s child resets
//! the handlers to their defaults before it unblocks them for the program it execs.

use crate::process::ChildHooks;
use std::ffi::{c_int, c_void, CStr, CString};
use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use tokio::io::unix::AsyncFd;

/// The child's stack: ample for the hooks' few frames (none large); its lowest page is a guard.
const STACK_BYTES: usize = 128 * 1024;

/// A stack for a child that shares this process's memory, unmapped when dropped (only once the
/// child has exec'd or ended: the callers below see to it).
pub(crate) struct Stack {
    base: *mut c_void,
}

impl Stack {
    pub(crate) fn new() -> Result<Stack> {
        // SAFETY: a fresh anonymous private mapping, not aliased by anything.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::last_os_error());
        }
        let stack = Stack { base };
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        // SAFETY: the lowest page of the mapping made above.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(Error::last_os_error());
        }
        Ok(stack)
    }

    fn top(&self) -> *mut c_void {
        // The mapping's size is a multiple of the page size, so its end is 16-byte aligned.
        self.base.wrapping_byte_add(STACK_BYTES)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer in use by any child.
        unsafe {
            libc::munmap(self.base, STACK_BYTES);
        }
    }
}

extern "C" fn trampoline<F: FnMut() -> c_int>(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `&mut F` `clone_raw` passed, alive for as long as the child uses the
    // caller's memory (the callers' contracts).
    let f = unsafe { &mut *arg.cast::<F>() };
    f()
}

/// Every signal blocked on the calling thread until dropped (then the thread's mask as it was).
struct Blocked(libc::sigset_t);

impl Blocked {
    fn all() -> Result<Blocked> {
        // SAFETY: plain sigset_t values on this frame.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            let r = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            if r != 0 {
                return Err(Error::from_raw_os_error(r));
            }
            Ok(Blocked(old))
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved in `all`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

/// Clones a child that shares this process's memory and runs `f` on `stack`, with every signal
/// blocked (it must end with `_exit` or an exec, never return into anything else). `flags` are
/// added to `CLONE_VM | SIGCHLD`; with `CLONE_PIDFD` the child's pidfd is returned too.
///
/// # Safety
/// `f` must follow the module's rules for a child in the server's memory, and `stack` and
/// everything `f` uses must outlive the child's use of them: until it has exec'd (`CLONE_VFORK`
/// sees to that) or has ended and been reaped.
unsafe fn clone_raw<F: FnMut() -> c_int>(
    stack: &Stack,
    flags: c_int,
    f: &mut F,
) -> Result<(libc::pid_t, Option<OwnedFd>)> {
    let _blocked = Blocked::all()?;
    let mut pidfd: c_int = -1;
    // SAFETY: the stack is ours and unused; `f` lives on the caller's frame, which the
    // caller's contract keeps alive while the child runs.
    let pid = unsafe {
        libc::clone(
            trampoline::<F>,
            stack.top(),
            libc::CLONE_VM | libc::SIGCHLD | flags,
            (f as *mut F).cast(),
            &mut pidfd as *mut c_int,
        )
    };
    if pid < 0 {
        return Err(Error::last_os_error());
    }
    if flags & libc::CLONE_PIDFD == 0 {
        return Ok((pid, None));
    }
    if pidfd < 0 {
        // A kernel before 5.2 ignores CLONE_PIDFD: the child runs (or has exec'd) all the same.
        reap(pid, true);
        return Err(Error::other(
            "this kernel gives no pidfd (Linux 5.2 or newer is needed)",
        ));
    }
    // SAFETY: with CLONE_PIDFD the kernel wrote a new descriptor that nothing else owns.
    Ok((pid, Some(unsafe { OwnedFd::from_raw_fd(pidfd) })))
}

/// Kills (with `kill`) and reaps the child `pid`, retrying an interrupted wait; false if it
/// could not be reaped.
pub(crate) fn reap(pid: libc::pid_t, kill: bool) -> bool {
    // SAFETY: signalling and waiting for a child of this process.
    unsafe {
        if kill {
            libc::kill(pid, libc::SIGKILL);
        }
        loop {
            if libc::waitpid(pid, std::ptr::null_mut(), 0) == pid {
                return true;
            }
            if Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return false;
            }
        }
    }
}

/// Whether this process was dumpable before any child changed credentials in its memory.
static DUMPABLE: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();

/// Read before a child that may change credentials is cloned: such a child shares this
/// process's memory, and the kernel marks that memory not dumpable when the child's
/// effective ids change (as it does for any process), which would leave the server so.
pub(crate) fn note_dumpable() {
    // SAFETY: prctl with constant arguments.
    DUMPABLE.get_or_init(|| unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) });
}

/// Gives this process back the dumpable flag it had (once the child that changed credentials
/// in its memory has exec'd or ended).
pub(crate) fn restore_dumpable() {
    if let Some(&d) = DUMPABLE.get() {
        // SAFETY: prctl with constant arguments.
        let now = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
        if d >= 0 && now != d {
            // SAFETY: prctl with a value PR_GET_DUMPABLE gave.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, d as libc::c_ulong, 0, 0, 0) };
        }
    }
}

/// Clones a child that shares this process's memory and runs `f`, while the caller goes on.
/// Returns its pid; the caller reaps it (`waitpid`), and only then drops `stack`.
///
/// # Safety
/// As [`clone_raw`]: `f` only makes raw system calls that leave `errno` alone (rustix's), on
/// values prepared before the call, and ends with `_exit`; `stack` and what `f` uses live until
/// the child is reaped.
pub(crate) unsafe fn clone_vm<F: FnMut() -> c_int>(
    stack: &Stack,
    f: &mut F,
) -> Result<libc::pid_t> {
    // SAFETY: passed on from the caller.
    unsafe { clone_raw(stack, 0, f) }.map(|(pid, _)| pid)
}

/// A started process: its pidfd, the read end of its stderr, and its status once reaped. Killed
/// (and reaped in the background) when dropped before it ended, as tokio's `kill_on_drop`.
pub(crate) struct Child {
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
    pub(crate) stderr: Option<tokio::net::unix::pipe::Receiver>,
}

/// Starts `program` with `args` (after `argv[0]`, which is `program`), an empty environment,
/// stdin and stdout on `/dev/null` and stderr on a pipe (`Child::stderr`), after `hooks` ran in
/// the child. Needs a tokio runtime (the pidfd is watched by it).
pub(crate) fn spawn(program: &CStr, args: &[CString], hooks: &ChildHooks) -> Result<Child> {
    let mut argv: Vec<*const libc::c_char> = Vec::with_capacity(args.len() + 2);
    argv.push(program.as_ptr());
    argv.extend(args.iter().map(|a| a.as_ptr()));
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let null = rustix::fs::open(
        c"/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let stdio: [RawFd; 3] = [null.as_raw_fd(), null.as_raw_fd(), err_w.as_raw_fd()];
    let failed = AtomicI32::new(0);
    let stack = Stack::new()?;
    let mut child = || -> c_int {
        // SAFETY: raw system calls on values prepared above; the parent's thread is suspended
        // until this exec's or exits (CLONE_VFORK), so `errno` is this child's to use.
        unsafe {
            let errno = child_steps(&stdio, hooks);
            if errno == 0 {
                libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
            failed.store(
                if errno == 0 {
                    *libc::__errno_location()
                } else {
                    errno
                },
                Ordering::Relaxed,
            );
            libc::_exit(127)
        }
    };
    note_dumpable();
    // SAFETY: `child` follows the module's rules (see `child_steps`); with CLONE_VFORK this
    // returns only once it has exec'd or ended, so the stack and the values it uses outlive it.
    let cloned = unsafe { clone_raw(&stack, libc::CLONE_VFORK | libc::CLONE_PIDFD, &mut child) };
    restore_dumpable();
    let (pid, pidfd) = cloned?;
    drop(stack);
    drop((null, err_w));
    let Some(pidfd) = pidfd else {
        reap(pid, true);
        return Err(Error::other("clone gave no pidfd"));
    };
    let errno = failed.load(Ordering::Relaxed);
    if errno != 0 {
        // It exited: reap it.
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(pidfd.as_fd()),
            rustix::process::WaitIdOptions::EXITED,
        );
        return Err(Error::from_raw_os_error(errno));
    }
    if tokio::runtime::Handle::try_current().is_err() {
        reap(pid, true);
        return Err(Error::other("spawn needs a tokio runtime"));
    }
    // SAFETY: an OwnedFd's descriptor stays open and the same while the AsyncFd owns it.
    let pidfd =
        match unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) } {
            Ok(fd) => fd,
            Err(e) => {
                reap(pid, true);
                return Err(Error::from(e));
            }
        };
    // From here on, dropping the child kills and reaps it.
    let mut child = Child {
        pidfd: Some(pidfd),
        status: None,
        stderr: None,
    };
    child.stderr = Some(tokio::net::unix::pipe::Receiver::from_owned_fd(err_r)?);
    Ok(child)
}

/// The spawned child's steps before its exec: default signal handlers, then its standard
/// descriptors, the hooks, and an empty signal mask. Returns 0, or the errno of the step that
/// failed.
///
/// # Safety
/// Only in [`spawn`]'s child.
unsafe fn child_steps(stdio: &[RawFd; 3], hooks: &ChildHooks) -> c_int {
    // SAFETY: sigaction with values on this frame; dup2 on descriptors the parent opened.
    unsafe {
        for sig in 1..libc::SIGRTMAX() + 1 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            // glibc refuses its own two (thread cancellation and credential broadcast); they
            // are sent only to the server's threads, never to this process.
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            // Handled ones: a handler of the server's would run here in its memory. SIGPIPE:
            // the server ignores it, and the program should start with the default.
            if old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = libc::SIG_DFL;
                if libc::sigaction(sig, &new, std::ptr::null_mut()) != 0 {
                    return *libc::__errno_location();
                }
            }
        }
        for (target, &fd) in stdio.iter().enumerate() {
            let target = target as c_int;
            let r = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            };
            if r < 0 {
                return *libc::__errno_location();
            }
        }
        if let Err(e) = hooks.run() {
            // Never 0: that would let the exec go ahead.
            return e.raw_os_error().filter(|&c| c != 0).unwrap_or(libc::EIO);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
            return *libc::__errno_location();
        }
        0
    }
}

/// A wait status as `waitpid` gives it, from what `waitid` says.
fn exit_status(s: rustix::process::WaitIdStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match (s.exit_status(), s.terminating_signal()) {
        (Some(code), _) => ExitStatus::from_raw((code & 0xff) << 8),
        (None, Some(sig)) => ExitStatus::from_raw(sig & 0x7f),
        (None, None) => ExitStatus::from_raw(0xff << 8),
    }
}

impl Child {
    /// Waits for the process to end and reaps it.
    pub(crate) async fn wait(&mut self) -> Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let Some(pidfd) = &self.pidfd else {
            return Err(Error::new(
                ErrorKind::NotFound,
                "the process was not started",
            ));
        };
        loop {
            let mut ready = pidfd.readable().await?;
            match rustix::process::waitid(
                rustix::process::WaitId::PidFd(pidfd.get_ref().as_fd()),
                rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
            ) {
                Ok(Some(s)) => {
                    let s = exit_status(s);
                    self.status = Some(s);
                    return Ok(s);
                }
                Ok(None) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends SIGKILL (nothing once it has been reaped).
    pub(crate) fn start_kill(&mut self) -> Result<()> {
        match (&self.pidfd, self.status) {
            (Some(fd), None) => Ok(rustix::process::pidfd_send_signal(
                fd.get_ref(),
                rustix::process::Signal::KILL,
            )?),
            _ => Ok(()),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let _ = self.start_kill();
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        // Reaped once it has died: in the background where a runtime runs, else here (SIGKILL
        // was sent, so not for long).
        let reap = |fd: &OwnedFd| {
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(fd.as_fd()),
                rustix::process::WaitIdOptions::EXITED,
            );
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = pidfd.readable().await;
                    reap(pidfd.get_ref());
                });
            }
            Err(_) => reap(pidfd.get_ref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn hooks(inherit: Vec<RawFd>) -> ChildHooks {
        ChildHooks {
            procs: Vec::new(),
            inherit,
            run_as: None,
            fsize: u64::MAX,
            nproc: None,
            groups: Vec::new(),
        }
    }

    async fn stderr_of(child: &mut Child) -> String {
        let mut err = String::new();
        let mut pipe = child.stderr.take().unwrap();
        pipe.read_to_string(&mut err).await.unwrap();
        err
    }

    fn args(a: &[&str]) -> Vec<CString> {
        a.iter().map(|s| CString::new(*s).unwrap()).collect()
    }

    #[tokio::test]
    async fn a_spawned_program_gets_its_arguments_descriptors_and_status() {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        let kept = w.as_raw_fd();
        // Not inherited: close-on-exec, not listed.
        let stray = std::fs::File::open("/dev/null").unwrap();
        // (dash's `>&N` takes one digit only: the pipe is reached by its /proc path.)
        let out = format!("/proc/self/fd/{kept}");
        let script = format!(
            "echo to-stderr >&2; echo listed >{out}; \
             [ -e /proc/self/fd/{} ] && echo stray >{out}; \
             tr -d '\\0' </proc/$$/environ | grep -q . && echo environment >{out}; \
             read x || echo stdin-empty >{out}; exit 7",
            stray.as_raw_fd()
        );
        let mut child = spawn(c"/bin/sh", &args(&["-c", &script]), &hooks(vec![kept])).unwrap();
        drop(w);
        let err = stderr_of(&mut child).await;
        assert_eq!(err, "to-stderr\n");
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut out).unwrap();
        assert_eq!(out, "listed\nstdin-empty\n");
        // Waiting again gives the same status; killing a reaped child does nothing.
        assert_eq!(child.wait().await.unwrap().code(), Some(7));
        child.start_kill().unwrap();
    }

    #[tokio::test]
    async fn a_program_that_cannot_run_is_an_error_and_a_killed_one_says_so() {
        let e = match spawn(c"/nonexistent/program", &[], &hooks(Vec::new())) {
            Err(e) => e,
            Ok(_) => panic!("a missing program was started"),
        };
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let mut child = spawn(c"/bin/sleep", &args(&["60"]), &hooks(Vec::new())).unwrap();
        child.start_kill().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().await.unwrap().signal(), Some(libc::SIGKILL));
    }

    #[tokio::test]
    async fn a_program_starts_with_default_signal_dispositions_and_no_blocked_signals() {
        // The test process ignores SIGPIPE (Rust's runtime does), and this thread blocks
        // SIGUSR2 while it spawns; the program must see neither.
        // SAFETY: sigset_t values on this frame.
        let mut usr2: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: a signal set on this frame; blocking on this thread only.
        unsafe {
            libc::sigemptyset(&mut usr2);
            libc::sigaddset(&mut usr2, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, &usr2, std::ptr::null_mut());
        }
        let script = "grep -E '^(SigBlk|SigIgn)' /proc/self/status >&2";
        let spawned = spawn(c"/bin/sh", &args(&["-c", script]), &hooks(Vec::new()));
        // SAFETY: as above.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &usr2, std::ptr::null_mut()) };
        let mut child = spawned.unwrap();
        let err = stderr_of(&mut child).await;
        assert!(child.wait().await.unwrap().success());
        // sh itself ignores nothing at start; SIGPIPE is bit 13 (0x1000).
        for line in err.lines() {
            let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
            assert_eq!(mask & 0x1000, 0, "{line}");
            if line.starts_with("SigBlk") {
                assert_eq!(mask, 0, "{line}");
            }
        }
    }

    /// A child that changes its credentials in this process's memory leaves this process as
    /// dumpable as it was (the kernel marks shared memory not dumpable at such a change).
    #[tokio::test]
    async fn a_child_that_changes_credentials_leaves_this_process_dumpable() {
        if !rustix::process::geteuid().is_root() {
            crate::test_skip::skip("ROOT", "changing a child's credentials needs root");
            return;
        }
        // SAFETY: prctl with constant arguments.
        let before = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
        let mut as_nobody = hooks(Vec::new());
        as_nobody.run_as = Some(65534);
        let mut child = spawn(c"/bin/sh", &args(&["-c", "id -u >&2"]), &as_nobody).unwrap();
        assert_eq!(stderr_of(&mut child).await, "65534\n");
        assert!(child.wait().await.unwrap().success());
        // SAFETY: as above.
        let after = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
        assert_eq!(after, before);
    }

    #[tokio::test]
    async fn dropping_a_running_child_kills_and_reaps_it() {
        let child = spawn(c"/bin/sleep", &args(&["60"]), &hooks(Vec::new())).unwrap();
        let pidfd = child.pidfd.as_ref().unwrap().get_ref().as_raw_fd();
        let pid = std::fs::read_to_string(format!("/proc/self/fdinfo/{pidfd}"))
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("Pid:")
                    .map(|p| p.trim().parse::<i32>().unwrap())
            })
            .unwrap();
        drop(child);
        // Gone from the process table (not a zombie) once reaped in the background.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(std::time::Instant::now() < deadline, "{pid} was not reaped");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

//! A user namespace per sandbox with two users in it, made by the server before bubblewrap
//! joins it (`bwrap --userns`): the sandbox's own machinery (the reaper, PID 1, and the agent)
//! is root inside, and room code runs as `coder` ([`INSIDE_ID`](crate::namespace)) under a host
//! uid of its own room. Room code can then neither signal the agent (`kill -STOP`) nor open the
//! memory or descriptors of any machinery process, whatever they do about dumpability; and one
//! room's processes never count against another's per-uid limits.
//!
//! bubblewrap, unprivileged, maps one uid; mapping two needs root outside, which writes the map
//! for a namespace that a process running as the unprivileged owner has just created (so that
//! owner, bubblewrap's user, has the capabilities needed to join it), or, for a server that is
//! not root, shadow's `newuidmap` and `newgidmap` with a subordinate range the administrator
//! gave the server's user (`/etc/subuid`, `/etc/subgid`). The creating process also caps the
//! namespaces that can be created inside at zero, which is what `bwrap --disable-userns` does
//! for a namespace bubblewrap makes itself.

use std::io::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd};

/// How long the namespace's creating process may take to answer each step.
const ANSWER_WITHIN_MS: libc::c_int = 5000;

/// Who writes the namespace's maps.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Maps {
    /// Root outside writes them; the namespace's owner (inside root) is host uid and gid
    /// `owner`, room code's is `room`.
    Root { owner: u32, room: u32 },
    /// `newuidmap` / `newgidmap` write them for this (unprivileged) process's user: inside root
    /// is this user, room code is `uid`/`gid` from its subordinate ranges.
    Helpers { uid: u32, gid: u32 },
}

/// Creates the namespace with inside root and `inside` (room code) mapped as `maps` says.
/// Returns a descriptor of it (for `bwrap --userns`).
pub(crate) fn create(maps: Maps, inside: u32) -> Result<OwnedFd> {
    let owner = match maps {
        Maps::Root { owner, .. } => Some(owner),
        Maps::Helpers { .. } => None,
    };
    let cloexec = rustix::pipe::PipeFlags::CLOEXEC;
    let (to_parent_r, to_parent_w) = rustix::pipe::pipe_with(cloexec)?;
    let (to_child_r, to_child_w) = rustix::pipe::pipe_with(cloexec)?;
    let sysctl = c"/proc/sys/user/max_user_namespaces";
    let (w, r) = (to_parent_w.as_raw_fd(), to_child_r.as_raw_fd());
    // The maker shares the server's memory (crate::spawn): no copy of the server's page tables,
    // which was most of a start's time here. So it makes only raw calls that leave errno (a
    // server thread's, running beside it) alone: rustix's, and close_range on ranges that
    // cannot fail.
    let mut maker = || -> libc::c_int {
        use rustix::fd::BorrowedFd;
        // SAFETY: `w` and `r` are the pipe ends opened above, open in this child's copy of the
        // descriptor table until it exits.
        let (w, r) = unsafe { (BorrowedFd::borrow_raw(w), BorrowedFd::borrow_raw(r)) };
        // Nothing else the server holds stays open here (another sandbox's pipes, say: a
        // process waiting on one would wait on this one too).
        let (lo, hi) = {
            let (a, b) = (w.as_raw_fd() as libc::c_uint, r.as_raw_fd() as libc::c_uint);
            (a.min(b), a.max(b))
        };
        let close = |from: libc::c_uint, to: libc::c_uint| {
            if from <= to {
                // SAFETY: closes descriptors of this child's own table; no memory is passed.
                unsafe { libc::syscall(libc::SYS_close_range, from, to, 0 as libc::c_uint) };
            }
        };
        close(3, lo - 1);
        close(lo + 1, hi - 1);
        close(hi + 1, libc::c_uint::MAX);
        let become_owner = match owner {
            Some(o) => {
                let (uid, gid) = (
                    rustix::process::Uid::from_raw(o),
                    rustix::process::Gid::from_raw(o),
                );
                rustix::thread::set_thread_groups(&[]).is_ok()
                    && rustix::thread::set_thread_res_gid(gid, gid, gid).is_ok()
                    && rustix::thread::set_thread_res_uid(uid, uid, uid).is_ok()
            }
            None => true,
        };
        // SAFETY: this child is a process of its own with one thread.
        let unshared =
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER) };
        let mut ok = [u8::from(become_owner && unshared.is_ok())];
        let _ = rustix::io::write(w, &ok);
        // The parent writes the maps; then this process is root in the namespace and caps the
        // namespaces that may be created in it.
        let mut go = [0u8];
        if ok[0] == 1 && rustix::io::read(r, &mut go) == Ok(1) {
            let capped = rustix::fs::open(
                sysctl,
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map(|fd| {
                let written = rustix::io::write(&fd, b"0") == Ok(1);
                // Closed by the exit, not by OwnedFd's drop (glibc's close, which may set errno).
                std::mem::forget(fd);
                written
            });
            ok[0] = u8::from(capped == Ok(true));
            let _ = rustix::io::write(w, &ok);
            // Held until the parent has a descriptor of the namespace (a byte, or the parent's
            // end closing when it gave up).
            let _ = rustix::io::read(r, &mut go);
        }
        // SAFETY: ends this child, which shares no stack frame with anything.
        unsafe { libc::_exit(0) }
    };
    let stack = crate::spawn::Stack::new()?;
    crate::spawn::note_dumpable();
    // SAFETY: `maker` makes only raw calls that leave errno alone on values prepared above and
    // ends with `_exit`; it and `stack` live until the child is reaped below.
    let pid = unsafe { crate::spawn::clone_vm(&stack, &mut maker) }?;
    drop((to_parent_w, to_child_r));
    let result = (|| {
        // The child answers at once; one that does not (stuck, or killed) is given up on, never
        // waited for: this runs on a thread of the server's runtime.
        let read_ok = |what: &str| -> Result<()> {
            let mut fds = [libc::pollfd {
                fd: to_parent_r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd for a descriptor this function owns.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, ANSWER_WITHIN_MS) };
            if ready != 1 {
                return Err(Error::other(format!("cannot {what}: no answer")));
            }
            let mut b = [0u8; 1];
            match rustix::io::read(&to_parent_r, &mut b) {
                Ok(1) if b[0] == 1 => Ok(()),
                _ => Err(Error::other(format!("cannot {what}"))),
            }
        };
        read_ok("create a user namespace for the sandbox")?;
        match maps {
            Maps::Root { owner, room } => {
                let map = format!("0 {owner} 1\n{inside} {room} 1\n");
                // One write each: the kernel takes a map in a single write.
                std::fs::write(format!("/proc/{pid}/uid_map"), &map)?;
                std::fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
                std::fs::write(format!("/proc/{pid}/gid_map"), &map)?;
            }
            Maps::Helpers { uid, gid } => {
                let me = (
                    rustix::process::getuid().as_raw(),
                    rustix::process::getgid().as_raw(),
                );
                for (helper, own, room) in [("newuidmap", me.0, uid), ("newgidmap", me.1, gid)] {
                    let out = std::process::Command::new(helper)
                        .args([pid.to_string(), "0".into(), own.to_string(), "1".into()])
                        .args([inside.to_string(), room.to_string(), "1".into()])
                        .stdin(std::process::Stdio::null())
                        .output()?;
                    if !out.status.success() {
                        return Err(Error::other(format!(
                            "{helper}: {}",
                            String::from_utf8_lossy(&out.stderr).trim()
                        )));
                    }
                }
            }
        }
        rustix::io::write(&to_child_w, &[1])?;
        read_ok("cap the user namespaces inside the sandbox")?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        rustix::io::write(&to_child_w, &[1])?;
        Ok(OwnedFd::from(ns))
    })();
    drop(to_child_w);
    // Ending (if it has not ended) and reaping the child: only then is its stack free. One that
    // cannot be reaped may still run on it, so the stack is left mapped.
    if crate::spawn::reap(pid, result.is_err()) {
        drop(stack);
    } else {
        std::mem::forget(stack);
    }
    // Its credential change marked the memory it shared with this process not dumpable.
    crate::spawn::restore_dumpable();
    result
}

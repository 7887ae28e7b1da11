//! What both local tiers need for the host processes they start (bubblewrap for a namespace
//! sandbox, a VMM for a microVM): finding the program, the room uids they run as, what the
//! child does between fork and exec, and how its end is put in words.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Host uids of room code when the server runs as root: one per running sandbox, from this
/// range (far above the uids and subordinate ranges a host hands out), so room code never
/// shares a uid with the sandbox's machinery (which runs as
/// [`crate::namespace::UNPRIVILEGED`]) or with another room.
pub const ROOM_UIDS: std::ops::Range<u32> = 0x7000_0000..0x7001_0000;
/// Open files per process.
const NOFILE: u64 = 4096;

/// Finds a program: the configured path, else `name` on `PATH`.
pub fn find_program(configured: Option<&Path>, name: &str) -> Option<PathBuf> {
    if let Some(p) = configured {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// A slot for a sandbox's room uid, held for as long as the sandbox lives.
pub(crate) struct RoomUid {
    pub(crate) slot: u32,
    taken: Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>,
}

impl RoomUid {
    pub(crate) fn take(
        taken: &Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>,
        slots: u32,
    ) -> Option<RoomUid> {
        let mut set = taken.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (0..slots).find(|u| !set.contains(u))?;
        set.insert(slot);
        Some(RoomUid {
            slot,
            taken: taken.clone(),
        })
    }
}

impl Drop for RoomUid {
    fn drop(&mut self) {
        self.taken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.slot);
    }
}

/// How a process ended, in words (an exit status of 128 + N is taken for signal N, as a shell
/// reports a child killed by it).
pub(crate) fn describe(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) if c > 128 => format!("killed by signal {}", c - 128),
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "unknown status".into(),
    }
}

/// What the child does before exec'ing bwrap or a VMM (forked, or cloned in the server's memory:
/// crate::spawn). Holds only plain values; does only raw system calls, no allocation.
pub(crate) struct ChildHooks {
    pub(crate) procs: Vec<RawFd>,
    pub(crate) inherit: Vec<RawFd>,
    pub(crate) run_as: Option<u32>,
    pub(crate) fsize: u64,
    pub(crate) nproc: Option<u64>,
    /// Supplementary groups kept with `run_as` (a VMM's: the group that opens `/dev/kvm`).
    pub(crate) groups: Vec<libc::gid_t>,
}

impl ChildHooks {
    pub(crate) fn run(&self) -> std::io::Result<()> {
        let check = |r: libc::c_int| {
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let check_long = |r: libc::c_long| check(if r < 0 { -1 } else { 0 });
        // Nothing the server inherited or opened crosses into the sandbox but what is listed in
        // `inherit`: every other descriptor (say one a parent left open without close-on-exec)
        // closes at exec. Done before RLIMIT_NOFILE is lowered, so the fallback for old
        // kernels reaches every descriptor the server may hold.
        crate::fds::close_on_exec_from(3);
        for &fd in &self.procs {
            // SAFETY: `fd` is an open cgroup.procs file; writing "0" moves this process.
            let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if n != 1 {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
        }
        let limits = [
            (libc::RLIMIT_NOFILE, Some(NOFILE)),
            (libc::RLIMIT_CORE, Some(0)),
            (libc::RLIMIT_FSIZE, Some(self.fsize)),
            (libc::RLIMIT_NPROC, self.nproc),
        ];
        for (res, v) in limits {
            let Some(v) = v else { continue };
            let lim = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            // SAFETY: a valid rlimit struct for a known resource.
            check(unsafe { libc::setrlimit(res, &lim) })?;
        }
        if let Some(id) = self.run_as {
            // Raw system calls, not glibc's wrappers: those change every thread of what they
            // take for this process, signalling the server's threads from a child that shares
            // its memory (crate::spawn).
            let (ngroups, groups) = (self.groups.len(), self.groups.as_ptr());
            // SAFETY: plain credential calls; `groups` points at `ngroups` gids. Order: groups,
            // gid, uid.
            unsafe {
                check_long(libc::syscall(libc::SYS_setgroups, ngroups, groups))?;
                check_long(libc::syscall(libc::SYS_setresgid, id, id, id))?;
                check_long(libc::syscall(libc::SYS_setresuid, id, id, id))?;
            }
        }
        for &fd in &self.inherit {
            // SAFETY: clears FD_CLOEXEC on a descriptor this child owns, so bwrap inherits it.
            check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) })?;
        }
        Ok(())
    }
}

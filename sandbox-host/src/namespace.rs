//! The namespace tier: bubblewrap (`bwrap`, Debian's package) builds the user, mount, pid, net,
//! ipc, uts and cgroup namespaces, the read-only base, the workspace and the seccomp filter;
//! this module adds cgroup limits, rlimits, an unprivileged host uid, and the agent's stream.
//!
//! Why bubblewrap: it is small, setuid-free here, audited, packaged by Debian and used by
//! Flatpak for exactly this job; hand-written namespace code would re-derive its ordering rules
//! (mount propagation, `/proc` after the pid namespace, no_new_privs before seccomp).

use crate::cgroup::{CgroupError, Layout};
use crate::handle::{Ended, Event, Sandbox};
pub use crate::process::ROOM_UIDS;
use crate::process::{describe, find_program, ChildHooks};
use crate::{Limits, Receipt, StartError, Starting, Tier, TierBackend};
use spare::{Spare, Users};

mod spare;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

/// Host uid/gid sandboxes run as when the server runs as root (`nobody`): root outside must
/// never be what a sandbox's user maps to.
pub(crate) const UNPRIVILEGED: u32 = 65534;
/// The sandbox user's uid and gid inside.
pub(crate) const INSIDE_ID: u32 = 1000;
/// Private `/tmp` size.
const TMP_BYTES: u64 = 64 << 20;
/// Where the agent binary appears inside.
const AGENT_PATH: &str = "/.coderoom/agent";
/// Where the agent keeps the trust bundle (see [`crate::proto::TRUST_FILE`]).
const TRUST_DIR: &str = "/run/coderoom";
/// Room for the system's roots and the room's authority.
const TRUST_BYTES: u64 = 4 << 20;
/// Time the agent gets to answer its first hello.
const READY_WITHIN: Duration = Duration::from_secs(20);
/// bwrap diagnostics kept for the error message.
const STDERR_KEEP: usize = 4096;
/// Host directories mirrored read-only when no rootfs is given.
const BASE_DIRS: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
/// Appends bubblewrap's arguments for the host's base directories (each a symlink where the
/// host has one, else bound read-only); the mounts, for the receipt.
fn base_dirs(a: &mut Vec<String>) -> Vec<String> {
    let mut mounts = Vec::new();
    for dir in BASE_DIRS {
        let p = Path::new(dir);
        if let Ok(target) = std::fs::read_link(p) {
            a.extend([
                "--symlink".into(),
                target.to_string_lossy().into_owned(),
                dir.into(),
            ]);
        } else if p.is_dir() {
            a.extend(["--ro-bind".into(), dir.into(), dir.into()]);
            mounts.push(format!("{dir} (read-only, host)"));
        }
    }
    mounts
}

/// The floor a start of this tier is measured against: plain `bwrap` with the sandbox's
/// namespaces and base mounts (its base directories as a sandbox has them, `/proc`, `/dev`, a
/// tmpfs `/tmp` and `/workspace`) running `command`, nothing of Coderoom's own.
pub fn bwrap_floor(command: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
    ]
    .map(String::from)
    .into();
    base_dirs(&mut a);
    a.extend(
        [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/workspace",
            "--chdir",
            "/workspace",
            "--",
        ]
        .map(String::from),
    );
    a.extend(command.iter().map(|c| (*c).to_owned()));
    a
}

/// A host directory among the `/etc` essentials is copied into the sandbox when it holds at
/// most this many entries in all (its subdirectories' included), each a small file, a symlink
/// or a directory; otherwise it is bound read-only (one mount).
const ETC_COPY_ENTRIES: usize = 16;
/// The largest file copied (`/etc/ld.so.cache` is the biggest, ~50 KB on Debian).
const ETC_COPY_BYTES: u64 = 1 << 20;

/// One piece of the sandbox's `/etc`, planned from the host's files (each at the same path as
/// on the host). Small files are copied (`bwrap --file` from the host's file, opened at each
/// start: no mount, and the sandbox sees the file as it was at its start, not the host's live
/// one), symlinks stay symlinks, and only large directories are bound: each bind costs
/// bubblewrap ~0.1 ms (path resolution, the mount, its read-only remount), and the fifteen it
/// once made were ~1.4 ms of a start (docs/benchmarks.md, "Sandbox cold start").
#[derive(Debug, Clone, PartialEq)]
enum EtcPlan {
    Dir(String),
    Symlink { target: String, at: String },
    File { at: String, mode: u32 },
    Bind(String),
}

/// A piece of `/etc` for one start: the plan's, with the copied file opened.
#[derive(Debug)]
enum EtcPart {
    Plan(EtcPlan),
    File {
        data: OwnedFd,
        at: String,
        mode: u32,
    },
}

/// One path a plan was made from, with how it looked when the plan looked at it (before
/// reading it): (inode, size, mode, modified, changed), zeros when absent. The `/etc`
/// essentials are looked at through their symlinks (as a bind would), what a copied directory
/// holds as it is.
#[derive(Debug, Clone, PartialEq)]
struct Source {
    path: PathBuf,
    follow: bool,
    seen: [i64; 5],
}

impl Source {
    fn look(path: &Path, follow: bool) -> Source {
        let meta = if follow {
            std::fs::metadata(path)
        } else {
            std::fs::symlink_metadata(path)
        };
        Source {
            path: path.to_path_buf(),
            follow,
            seen: meta.as_ref().map_or([0; 5], stamp),
        }
    }

    /// The path still looks as it did.
    fn unchanged(&self) -> bool {
        Source::look(&self.path, self.follow).seen == self.seen
    }
}

fn stamp(m: &std::fs::Metadata) -> [i64; 5] {
    use std::os::unix::fs::MetadataExt;
    [
        m.ino() as i64,
        m.size() as i64,
        i64::from(m.mode()),
        m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        m.ctime() * 1_000_000_000 + m.ctime_nsec(),
    ]
}

/// A plan and what it was made from. Planning reads the large directories (hundreds of entries
/// in `/etc/alternatives` and `/etc/ssl/certs`, ~0.3 ms); telling whether a plan is still good
/// is a stat of each source. Each source was looked at before it was read, so a change made
/// while planning shows as a change at the next start.
#[derive(Debug)]
struct EtcKept {
    from: Vec<Source>,
    plan: Arc<Vec<EtcPlan>>,
}

/// The last plan.
#[derive(Debug, Default)]
struct EtcCache(std::sync::Mutex<Option<EtcKept>>);

impl EtcCache {
    /// The plan for the host's `/etc` as it is now: the last one while nothing it was made
    /// from changed.
    fn plan(&self) -> Result<Arc<Vec<EtcPlan>>, StartError> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kept.as_ref() {
            if k.from.iter().all(Source::unchanged) {
                return Ok(k.plan.clone());
            }
        }
        let (plan, from) = plan_etc()?;
        let plan = Arc::new(plan);
        *kept = Some(EtcKept {
            from,
            plan: plan.clone(),
        });
        Ok(plan)
    }
}

/// The sandbox's `/etc` from the host's essentials, parents first; and what the plan was made
/// from.
fn plan_etc() -> Result<(Vec<EtcPlan>, Vec<Source>), StartError> {
    // `/etc` itself always: the generated passwd and group go there.
    let mut plan = vec![EtcPlan::Dir("/etc".into())];
    let mut from = Vec::new();
    let mut made = std::collections::BTreeSet::from([PathBuf::from("/etc")]);
    for f in ETC_FILES {
        let path = Path::new(f);
        // Through a symlink, as a bind of it would be (a link into a directory the sandbox
        // does not have would dangle there).
        let Ok(meta) = std::fs::metadata(path) else {
            // Absent: the plan changes when it appears.
            from.push(Source::look(path, true));
            continue;
        };
        // Directories are made first, with their mode: bwrap would make them on the first file
        // bound into them, closed to everyone but root (room code's shell could not read its
        // rc file).
        let parents: Vec<&Path> = path
            .ancestors()
            .skip(1)
            .take_while(|d| *d != Path::new("/"))
            .collect();
        for dir in parents.into_iter().rev() {
            if made.insert(dir.to_path_buf()) {
                plan.push(EtcPlan::Dir(dir.to_string_lossy().into_owned()));
            }
        }
        let mut budget = ETC_COPY_ENTRIES;
        // `plan_entry` looks at the essential itself first: a bound one keeps only that look
        // (what a bind shows follows the host by itself).
        let looked = from.len() + 1;
        match plan_entry(path, &meta, true, &mut budget, &mut from)? {
            Some(mut copied) => plan.append(&mut copied),
            None => {
                from.truncate(looked);
                plan.push(EtcPlan::Bind((*f).to_owned()));
            }
        }
    }
    Ok((plan, from))
}

/// How to copy `path` (with its metadata `meta`, taken before it is read, through a symlink
/// when `follow`) into the sandbox, spending `budget` entries; `None` when it is too large to
/// copy, of a kind that is not copied, or not readable by everyone (a bind keeps the host's
/// owner and mode; a copy would not), and is bound instead. Each entry copied is added to
/// `from`.
fn plan_entry(
    path: &Path,
    meta: &std::fs::Metadata,
    follow: bool,
    budget: &mut usize,
    from: &mut Vec<Source>,
) -> Result<Option<Vec<EtcPlan>>, StartError> {
    use std::os::unix::fs::PermissionsExt;
    let at = path.to_string_lossy().into_owned();
    if *budget == 0 {
        return Ok(None);
    }
    *budget -= 1;
    from.push(Source {
        path: path.to_path_buf(),
        follow,
        seen: stamp(meta),
    });
    let mode = meta.permissions().mode();
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(path).map_err(StartError::Host)?;
        return Ok(Some(vec![EtcPlan::Symlink {
            target: target.to_string_lossy().into_owned(),
            at,
        }]));
    }
    if meta.is_file() {
        let copyable = meta.len() <= ETC_COPY_BYTES && mode & 0o004 != 0;
        return Ok(copyable.then(|| {
            vec![EtcPlan::File {
                at,
                mode: mode & 0o777,
            }]
        }));
    }
    if !meta.is_dir() || mode & 0o005 != 0o005 {
        return Ok(None);
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(path).map_err(StartError::Host)? {
        let entry = entry.map_err(StartError::Host)?;
        if names.len() == *budget {
            return Ok(None);
        }
        names.push(entry.file_name());
    }
    names.sort();
    let mut plan = vec![EtcPlan::Dir(at)];
    for name in names {
        let child = path.join(name);
        let Ok(m) = std::fs::symlink_metadata(&child) else {
            continue;
        };
        match plan_entry(&child, &m, false, budget, from)? {
            Some(mut more) => plan.append(&mut more),
            None => return Ok(None),
        }
    }
    Ok(Some(plan))
}

/// Opens the copied files of `plan` for one start.
fn etc_parts(plan: &[EtcPlan]) -> Result<Vec<EtcPart>, StartError> {
    plan.iter()
        .map(|p| match p {
            EtcPlan::File { at, mode } => Ok(EtcPart::File {
                data: open_host_file(Path::new(at))?,
                at: at.clone(),
                mode: *mode,
            }),
            other => Ok(EtcPart::Plan(other.clone())),
        })
        .collect()
}

/// The host's file at `path`, open for bubblewrap to copy from (read-only; the server reads
/// nothing of it itself).
fn open_host_file(path: &Path) -> Result<OwnedFd, StartError> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(StartError::Host)
}

/// The `/etc` essentials: dynamic linking, certificates, time zone, shell setup, alternatives.
/// Never passwd/shadow/group: the sandbox gets its own; of `/etc/ssl`, the public certificates
/// and the OpenSSL configuration, never the host's `private` keys.
const ETC_FILES: [&str; 13] = [
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/bash.bashrc",
    "/etc/profile",
    "/etc/inputrc",
    "/etc/terminfo",
];

/// How to start the agent inside: a binary and the arguments before `--fd N`.
#[derive(Debug, Clone)]
pub struct AgentCommand {
    /// The executable on the host (bound read-only into the sandbox).
    pub exe: PathBuf,
    /// Arguments before `--fd N` (e.g. `["agent"]` when the server binary is the agent).
    pub args: Vec<String>,
}

/// How long a standalone agent may take to say which build it is.
const ASK_BUILD_WITHIN: Duration = Duration::from_secs(5);

impl AgentCommand {
    /// The agent for the sandboxes of the server binary `server`: the standalone
    /// `coderoom-agent` installed beside it when it was built from the same sources (it maps
    /// and relocates a much smaller binary: about half a millisecond of every start on a
    /// 2-core host), else `server` itself as `coderoom agent`. Also says which, and why.
    pub fn beside(server: &Path) -> (AgentCommand, String) {
        let own = AgentCommand {
            exe: server.to_path_buf(),
            args: vec!["agent".into()],
        };
        let standalone = server.with_file_name("coderoom-agent");
        if !standalone.is_file() {
            return (
                own,
                format!("the server binary (no {})", standalone.display()),
            );
        }
        match build_of(&standalone) {
            Ok(b) if b == crate::AGENT_BUILD => (
                AgentCommand {
                    exe: standalone.clone(),
                    args: Vec::new(),
                },
                format!("{} (the server's build)", standalone.display()),
            ),
            Ok(b) => (
                own,
                format!(
                    "the server binary ({} is another build: {b:?}, the server's {})",
                    standalone.display(),
                    crate::AGENT_BUILD
                ),
            ),
            Err(e) => (
                own,
                format!(
                    "the server binary (cannot ask {}: {e})",
                    standalone.display()
                ),
            ),
        }
    }
}

/// What `exe --build` says (an agent older than the question says nothing on stdout).
fn build_of(exe: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut child = std::process::Command::new(exe)
        .arg("--build")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let deadline = std::time::Instant::now() + ASK_BUILD_WITHIN;
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("no answer"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // What it wrote before it ended, without waiting for the pipe's end: a process it left
    // behind may hold it open.
    let mut out = Vec::new();
    if let Some(o) = child.stdout.take() {
        rustix::io::ioctl_fionbio(&o, true)?;
        let _ = o.take(256).read_to_end(&mut out);
    }
    Ok(String::from_utf8_lossy(&out).trim().to_owned())
}

/// The namespace backend.
#[derive(Debug)]
pub struct Namespace {
    bwrap: PathBuf,
    bwrap_version: String,
    agent: AgentCommand,
    rootfs: Option<PathBuf>,
    cgroups: Result<Layout, CgroupError>,
    run_as: Option<u32>,
    filter: Vec<u8>,
    /// Slots of running sandboxes' room uids.
    room_uids: Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>,
    /// Not root: the subordinate uid and gid ranges of the server's user, when `newuidmap` and
    /// `newgidmap` can map them (then sandboxes get two users inside, as under root).
    subids: Option<SubIds>,
    /// How the sandbox's `/etc` is made from the host's (no rootfs).
    etc: EtcCache,
    /// What the next start needs that does not depend on its room, made ahead of need.
    spare: Arc<std::sync::Mutex<Spare>>,
}

/// A user's subordinate ids (`/etc/subuid`, `/etc/subgid`): room code's host uid and gid are
/// `uid + slot` and `gid + slot`.
#[derive(Debug, Clone, Copy)]
struct SubIds {
    uid: u32,
    gid: u32,
    count: u32,
}

impl SubIds {
    /// The server user's ranges, if it has both and the helpers to map them.
    fn find() -> Option<SubIds> {
        find_in_path("newuidmap")?;
        find_in_path("newgidmap")?;
        let uid = rustix::process::getuid().as_raw();
        let name = std::fs::read_to_string("/etc/passwd").ok().and_then(|p| {
            p.lines().find_map(|l| {
                let mut f = l.split(':');
                let n = f.next()?;
                (f.nth(1)? == uid.to_string()).then(|| n.to_owned())
            })
        });
        let range = |file: &str, id: u32| -> Option<(u32, u32)> {
            std::fs::read_to_string(file).ok()?.lines().find_map(|l| {
                let mut f = l.trim().split(':');
                let who = f.next()?;
                let start = f.next()?.parse().ok()?;
                let count = f.next()?.parse().ok()?;
                (Some(who) == name.as_deref() || who == id.to_string()).then_some((start, count))
            })
        };
        let (u, uc) = range("/etc/subuid", uid)?;
        let (g, gc) = range("/etc/subgid", uid)?;
        let count = uc.min(gc);
        (count > 0).then_some(SubIds {
            uid: u,
            gid: g,
            count,
        })
    }
}

/// What [`Namespace::prepare_rest`] makes for a start.
struct Prepared {
    /// The control stream: the server's end, and the agent's (inherited by bubblewrap).
    ours: std::os::unix::net::UnixStream,
    theirs: OwnedFd,
    seccomp: OwnedFd,
    passwd: OwnedFd,
    group: OwnedFd,
    etc: Vec<EtcPart>,
    room_uid: Option<Users>,
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    find_program(None, name)
}

impl Namespace {
    /// Prepares the backend: finds `bwrap`, compiles the seccomp filter, detects cgroups.
    pub fn new(agent: AgentCommand, rootfs: Option<PathBuf>) -> Result<Namespace, StartError> {
        let bwrap = find_in_path("bwrap")
            .ok_or_else(|| StartError::Unavailable("bubblewrap (bwrap) is not installed".into()))?;
        let out = std::process::Command::new(&bwrap)
            .arg("--version")
            .output()
            .map_err(|e| StartError::Unavailable(format!("cannot run bwrap: {e}")))?;
        let bwrap_version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if let Some(root) = &rootfs {
            if !root.join("usr").is_dir() {
                return Err(StartError::Unavailable(format!(
                    "{} does not look like a root filesystem (no usr/)",
                    root.display()
                )));
            }
        }
        let filter = crate::seccomp::compile()
            .map(|p| crate::seccomp::to_bytes(&p))
            .map_err(|e| StartError::Unavailable(e.to_string()))?;
        let root = rustix::process::geteuid().is_root();
        let mut agent = agent;
        if root {
            // Sandboxes then start as uid 65534, which must be able to reach the agent binary;
            // the server's own may sit in a directory only root can enter.
            agent.exe = reachable_copy(&agent.exe).map_err(|e| {
                StartError::Unavailable(format!("cannot place the agent binary: {e}"))
            })?;
        }
        Ok(Namespace {
            bwrap,
            bwrap_version,
            agent,
            rootfs,
            cgroups: if root {
                Layout::detect()
            } else {
                Layout::delegated()
            },
            run_as: root.then_some(UNPRIVILEGED),
            filter,
            room_uids: Arc::default(),
            subids: if root { None } else { SubIds::find() },
            etc: EtcCache::default(),
            spare: Arc::default(),
        })
        .inspect(|ns| {
            if let Ok(layout) = &ns.cgroups {
                crate::cgroup::remove_orphan_spares(layout);
            }
            // The first start finds one too (a server's start-up pays for it).
            *ns.spare.lock().unwrap_or_else(|e| e.into_inner()) =
                ns.spare_maker(&Limits::default()).make();
        })
    }

    /// Where limits are enforced: the cgroup layout, or why cgroups are unavailable.
    pub fn cgroups(&self) -> Result<&Layout, &CgroupError> {
        self.cgroups.as_ref()
    }

    /// What a start needs besides its cgroup: the control stream's two ends, the seccomp
    /// filter, passwd and group, the /etc plan's files, and the room uid with its user
    /// namespace (when the sandbox gets two users).
    fn prepare_rest(&self, users: Option<Users>) -> Result<Prepared, StartError> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(StartError::Host)?;
        let seccomp = memfd("coderoom-seccomp", &self.filter)?;
        let passwd = memfd(
            "coderoom-passwd",
            format!("root:x:0:0:root:/root:/bin/sh\ncoder:x:{INSIDE_ID}:{INSIDE_ID}:coder:/workspace:/bin/bash\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n").as_bytes(),
        )?;
        let group = memfd(
            "coderoom-group",
            format!("root:x:0:\ncoder:x:{INSIDE_ID}:\nnogroup:x:65534:\n").as_bytes(),
        )?;
        let etc = if self.rootfs.is_none() {
            etc_parts(&self.etc.plan()?)?
        } else {
            Vec::new()
        };
        let theirs: OwnedFd = theirs.into();
        // Root outside, or subordinate ids: the sandbox gets a user namespace with two users
        // (crate::userns), the machinery root inside and room code under a host uid of its own:
        // the spare's (spare.rs), else made now.
        let room_uid = match users {
            Some(made) => Some(made),
            None => self.spare_maker(&Limits::default()).users()?,
        };
        Ok(Prepared {
            ours,
            theirs,
            seccomp,
            passwd,
            group,
            etc,
            room_uid,
        })
    }

    /// Starts a sandbox named `name` (a room id: letters and digits) and waits until its agent
    /// answers.
    pub async fn start(
        &self,
        name: &str,
        limits: &Limits,
    ) -> Result<(Sandbox, mpsc::Receiver<Event>, Receipt), StartError> {
        if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(StartError::Invalid(
                "sandbox names are 1 to 64 letters or digits",
            ));
        }
        let began = std::time::Instant::now();
        // The cgroup: the spare's, renamed (here: it is quick), else made on a blocking thread
        // (directories and limits in cgroupfs, the larger half of this preparation) while this
        // one prepares the rest.
        let (spare_group, spare_users) = {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            (spare.group.take(), spare.users.take())
        };
        let layout = self.cgroups.as_ref().ok().cloned();
        let making = spare_group.is_none().then(|| {
            let (layout, name, limits) = (layout.clone(), name.to_owned(), limits.clone());
            tokio::task::spawn_blocking(move || {
                crate::cgroup::prepare(layout.as_ref(), &name, &limits, None)
            })
        });
        let rest = self.prepare_rest(spare_users);
        let grouped = match making {
            Some(task) => task.await.unwrap_or_else(|e| Err(std::io::Error::other(e))),
            None => crate::cgroup::prepare(layout.as_ref(), name, limits, spare_group),
        }
        .map_err(StartError::Host);
        let ((cgroup, procs), p) = match (grouped, rest) {
            (Ok(g), Ok(r)) => (g, r),
            (Ok((cgroup, _)), Err(e)) => {
                if let Some(cg) = cgroup {
                    tokio::task::spawn_blocking(move || cg.remove());
                }
                return Err(e);
            }
            (Err(e), _) => return Err(e),
        };
        let mut inherit = vec![
            p.theirs.as_raw_fd(),
            p.seccomp.as_raw_fd(),
            p.passwd.as_raw_fd(),
            p.group.as_raw_fd(),
        ];
        if let Some((_, ns)) = &p.room_uid {
            inherit.push(ns.as_raw_fd());
        }
        inherit.extend(p.etc.iter().filter_map(|part| match part {
            EtcPart::File { data, .. } => Some(data.as_raw_fd()),
            _ => None,
        }));

        let (args, mounts) = self.bwrap_args(limits, &inherit, p.room_uid.is_some(), &p.etc);
        let c = |s: &std::ffi::OsStr| {
            std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(s))
                .map_err(|_| StartError::Host(std::io::Error::other("a NUL in bwrap's arguments")))
        };
        let program = c(self.bwrap.as_os_str())?;
        let args = args
            .iter()
            .map(|a| c(a.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let hooks = ChildHooks {
            procs: procs.iter().map(|f| f.as_raw_fd()).collect(),
            inherit: inherit.clone(),
            run_as: self.run_as,
            fsize: limits.workspace_bytes,
            nproc: cgroup.is_none().then_some(limits.pids),
            groups: Vec::new(),
        };
        let spawning = std::time::Instant::now();
        // Without copying the server's page tables (crate::spawn); an empty environment,
        // stdin and stdout on /dev/null, stderr kept for the reason it failed.
        let mut child = crate::spawn::spawn(&program, &args, &hooks).map_err(StartError::Host)?;
        let spawned = std::time::Instant::now();
        let (room_uid, userns) = match p.room_uid {
            Some(((slot, host), ns)) => (Some((slot, host)), Some(ns)),
            None => (None, None),
        };
        let host_uid = room_uid.as_ref().map(|(_, host)| *host);
        drop((p.theirs, p.seccomp, p.passwd, p.group, procs, userns, p.etc));
        let mut stderr = child.stderr.take();

        p.ours.set_nonblocking(true).map_err(StartError::Host)?;
        let stream = tokio::net::UnixStream::from_std(p.ours).map_err(StartError::Host)?;
        let (sandbox, events, control) = Sandbox::wire(stream);
        if let Some(cg) = &cgroup {
            let cg = cg.clone();
            sandbox.set_pressure(Box::new(move || cg.pressure()));
        }
        let reaper_cgroup = cgroup.clone();
        let mut killed = control.killed;
        let ended = control.ended;
        let diag = Arc::new(std::sync::Mutex::new(String::new()));
        let diag_w = diag.clone();
        tokio::spawn(async move {
            if let Some(mut s) = stderr.take() {
                let mut kept = Vec::new();
                let mut buf = [0u8; 1024];
                // Drain to the end so bwrap never blocks on a full pipe; keep the start.
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let room = STDERR_KEEP.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                *diag_w.lock().unwrap_or_else(|e| e.into_inner()) =
                    String::from_utf8_lossy(&kept).trim().to_owned();
            }
        });
        tokio::spawn(async move {
            // The room uid is free again once the sandbox has ended.
            let _room_uid = room_uid;
            let mut stopped = false;
            let status = tokio::select! {
                s = child.wait() => s.ok(),
                _ = async { let _ = killed.wait_for(|k| *k).await; } => {
                    stopped = true;
                    None
                }
            };
            let status = if stopped {
                let _ = child.start_kill();
                child.wait().await.ok()
            } else {
                status
            };
            let pressure = crate::cgroup::finish(reaper_cgroup).await;
            let outcome = if stopped {
                Ended::Stopped
            } else {
                let how = match status {
                    Some(s) => describe(s),
                    None => "unknown status".into(),
                };
                let mut reason = format!("the agent ended: {how}");
                if pressure.oom_kills > 0 {
                    reason.push_str(&format!(
                        "; the out-of-memory killer had killed {} process(es) in this sandbox",
                        pressure.oom_kills
                    ));
                }
                if pressure.pids_refused > 0 {
                    reason.push_str(&format!(
                        "; {} fork(s) had been refused at the process limit",
                        pressure.pids_refused
                    ));
                }
                Ended::Died { reason }
            };
            let _ = ended.send(Some(outcome));
        });

        match sandbox.ready(READY_WITHIN).await {
            Ok(_) => {}
            Err(e) => {
                sandbox.kill();
                let _ = sandbox.ended().await;
                let why = diag.lock().unwrap_or_else(|e| e.into_inner()).clone();
                return Err(StartError::NotReady(if why.is_empty() {
                    e.to_string()
                } else {
                    format!("{e}: {why}")
                }));
            }
        }
        self.refill_spare(limits);
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let start = crate::StartTimes {
            prepare_us: micros(spawning - began),
            spawn_us: micros(spawned - spawning),
            agent_us: micros(spawned.elapsed()),
        };
        let receipt = Receipt {
            tier: "namespace".into(),
            implementation: format!("{}, coderoom-agent {}", self.bwrap_version, crate::VERSION),
            mounts,
            limits: limits.clone(),
            network: format!(
                "private network namespace with loopback only; the only way out is the agent's \
                 forwarder on 127.0.0.1:{} to the control plane's egress proxy (default deny)",
                crate::proto::EGRESS_PORT
            ),
            seccomp: format!(
                "deny-list of {} syscalls (EPERM), x32 ABI refused, other ABIs killed",
                crate::seccomp::denied().len()
            ),
            cgroups: match &self.cgroups {
                Ok(l) => l.name().to_owned(),
                Err(why) => format!("unavailable: {}", crate::Chain(why)),
            },
            host_uid: host_uid
                .or(self.run_as)
                .unwrap_or_else(|| rustix::process::geteuid().as_raw()),
            vm: None,
            host: None,
            start: Some(start),
        };
        Ok((sandbox, events, receipt))
    }

    /// `inherit`: the agent's stream, the seccomp filter, passwd, group, the user namespace to
    /// join when the server made one (`userns`), then the copied files of `etc`.
    fn bwrap_args(
        &self,
        limits: &Limits,
        inherit: &[RawFd],
        userns: bool,
        etc: &[EtcPart],
    ) -> (Vec<String>, Vec<String>) {
        let (agent_fd, seccomp_fd, passwd_fd, group_fd) =
            (inherit[0], inherit[1], inherit[2], inherit[3]);
        let userns = userns.then(|| inherit[4]);
        let mut a: Vec<String> = Vec::new();
        let mut mounts = Vec::new();
        let push = |a: &mut Vec<String>, parts: &[&str]| {
            a.extend(parts.iter().map(|s| (*s).to_owned()));
        };
        push(
            &mut a,
            &[
                // --unshare-all but the user namespace, which is one of two kinds (below).
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--as-pid-1",
                "--new-session",
                // The sandbox dies with bwrap, even when its agent is stopped or wedged.
                "--die-with-parent",
            ],
        );
        match userns {
            // The machinery is root inside, with what it needs to run room code as `coder`
            // and hand it the workspace; nothing else (no user namespace can be made inside:
            // crate::userns caps them at zero).
            Some(fd) => push(
                &mut a,
                &[
                    "--userns",
                    &fd.to_string(),
                    "--uid",
                    "0",
                    "--gid",
                    "0",
                    "--cap-drop",
                    "ALL",
                    "--cap-add",
                    "CAP_SETUID",
                    "--cap-add",
                    "CAP_SETGID",
                    "--cap-add",
                    "CAP_CHOWN",
                    // To stop what it started (an exec's process group at its timeout).
                    "--cap-add",
                    "CAP_KILL",
                ],
            ),
            None => {
                let id = INSIDE_ID.to_string();
                push(
                    &mut a,
                    &[
                        "--unshare-user",
                        "--disable-userns",
                        "--uid",
                        &id,
                        "--gid",
                        &id,
                    ],
                );
            }
        }
        push(&mut a, &["--hostname", "coderoom"]);
        match &self.rootfs {
            Some(root) => {
                if let Ok(rd) = std::fs::read_dir(root) {
                    for entry in rd.flatten() {
                        let name = entry.file_name().to_string_lossy().into_owned();
                        if ["proc", "dev", "sys", "tmp", "workspace", "run", ".coderoom"]
                            .contains(&name.as_str())
                        {
                            continue;
                        }
                        let src = entry.path();
                        let dst = format!("/{name}");
                        if let Ok(target) = std::fs::read_link(&src) {
                            push(&mut a, &["--symlink", &target.to_string_lossy(), &dst]);
                        } else {
                            push(&mut a, &["--ro-bind", &src.to_string_lossy(), &dst]);
                        }
                        mounts.push(format!("{dst} (read-only, from {})", src.display()));
                    }
                }
            }
            None => {
                mounts.extend(base_dirs(&mut a));
                for part in etc {
                    match part {
                        EtcPart::Plan(EtcPlan::Dir(d)) => {
                            push(&mut a, &["--perms", "0755", "--dir", d]);
                        }
                        EtcPart::Plan(EtcPlan::Symlink { target, at }) => {
                            push(&mut a, &["--symlink", target, at]);
                        }
                        EtcPart::File { data, at, mode } => {
                            let mode = format!("{mode:04o}");
                            let fd = data.as_raw_fd().to_string();
                            push(&mut a, &["--perms", &mode, "--file", &fd, at]);
                            mounts.push(format!("{at} (copied from the host at start)"));
                        }
                        EtcPart::Plan(EtcPlan::Bind(d)) => {
                            push(&mut a, &["--ro-bind", d, d]);
                            mounts.push(format!("{d} (read-only, host)"));
                        }
                        // Opened for the start ([`etc_parts`]).
                        EtcPart::Plan(EtcPlan::File { .. }) => {}
                    }
                }
            }
        }
        // Readable by all, as on any system (bwrap makes data files 0600 unless told). Copied
        // into the sandbox's own root (read-only once it is remounted, below); bound over a
        // rootfs's own files, whose `/etc` is a read-only bind.
        let data = if self.rootfs.is_some() {
            "--ro-bind-data"
        } else {
            "--file"
        };
        for (fd, at) in [(passwd_fd, "/etc/passwd"), (group_fd, "/etc/group")] {
            push(&mut a, &["--perms", "0644", data, &fd.to_string(), at]);
        }
        push(&mut a, &["--proc", "/proc", "--dev", "/dev"]);
        push(
            &mut a,
            &[
                "--perms",
                "1777",
                "--size",
                &TMP_BYTES.to_string(),
                "--tmpfs",
                "/tmp",
            ],
        );
        push(
            &mut a,
            &[
                "--size",
                &limits.workspace_bytes.to_string(),
                "--tmpfs",
                "/workspace",
            ],
        );
        // The trust bundle the agent writes (root's, readable by room code).
        push(
            &mut a,
            &[
                "--perms",
                "0755",
                "--size",
                &TRUST_BYTES.to_string(),
                "--tmpfs",
                TRUST_DIR,
            ],
        );
        // Room code's terminal program starts through the agent binary (`--exec-as`), so its
        // directory is open to room code's user too.
        let agent_dir = Path::new(AGENT_PATH)
            .parent()
            .map_or_else(|| "/".into(), |d| d.to_string_lossy().into_owned());
        push(&mut a, &["--perms", "0755", "--dir", &agent_dir]);
        push(
            &mut a,
            &["--ro-bind", &self.agent.exe.to_string_lossy(), AGENT_PATH],
        );
        push(&mut a, &["--remount-ro", "/"]);
        mounts.push("/etc/passwd, /etc/group (generated)".into());
        mounts.push("/proc (private pid namespace), /dev (minimal)".into());
        mounts.push(format!("/tmp (private tmpfs, {TMP_BYTES} bytes)"));
        mounts.push(format!(
            "/workspace (tmpfs, {} bytes)",
            limits.workspace_bytes
        ));
        mounts.push(format!("{AGENT_PATH} (read-only)"));
        mounts.push(format!(
            "{TRUST_DIR} (tmpfs, {TRUST_BYTES} bytes: the trust bundle)"
        ));
        push(&mut a, &["--seccomp", &seccomp_fd.to_string()]);
        push(&mut a, &["--chdir", "/workspace", "--"]);
        a.push(AGENT_PATH.to_owned());
        a.extend(self.agent.args.iter().cloned());
        push(&mut a, &["--fd", &agent_fd.to_string()]);
        (a, mounts)
    }
}

impl TierBackend for Namespace {
    fn tier(&self) -> Tier {
        Tier::Namespace
    }

    fn resume<'a>(
        &'a self,
        name: &'a str,
        limits: &'a Limits,
        _tag: Option<&'a str>,
    ) -> Starting<'a> {
        // Nothing is kept between runs here: every start is afresh, whatever the tag.
        Box::pin(Namespace::start(self, name, limits))
    }
}

/// `exe` itself when any user can reach it; otherwise a copy that any user can execute, in a
/// root-owned directory under the system's temporary directory (named after the binary's size and modification time, so a rebuilt
/// binary gets a fresh copy). An existing directory of that name is used only if root owns it
/// and nobody else can write to it.
fn reachable_copy(exe: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let exe = std::fs::canonicalize(exe)?;
    let meta = std::fs::metadata(&exe)?;
    // Already reachable by anyone (every directory above searchable, the file readable and
    // executable by others): used in place.
    let others_can =
        |p: &Path, bits: u32| std::fs::metadata(p).is_ok_and(|m| m.mode() & bits == bits);
    if others_can(&exe, 0o005) && exe.ancestors().skip(1).all(|d| others_can(d, 0o001)) {
        return Ok(exe);
    }
    let dir = std::env::temp_dir().join(format!(
        "coderoom-agent-{}-{}.{}",
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    ));
    match std::fs::create_dir(&dir) {
        Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(&dir)?;
            if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
                return Err(std::io::Error::other(format!(
                    "{} exists and is not a root-owned directory",
                    dir.display()
                )));
            }
        }
        Err(e) => return Err(e),
    }
    let target = dir.join("coderoom-agent");
    if std::fs::metadata(&target).is_ok_and(|m| m.len() == meta.len()) {
        return Ok(target);
    }
    let partial = dir.join(format!("coderoom-agent.{}.partial", std::process::id()));
    std::fs::copy(&exe, &partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o555))?;
    std::fs::rename(&partial, &target)?;
    Ok(target)
}

/// A sealed in-memory file holding `data`, readable from offset 0.
fn memfd(name: &str, data: &[u8]) -> Result<OwnedFd, StartError> {
    use std::io::{Seek, Write};
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| StartError::Host(e.into()))?;
    let mut f = std::fs::File::from(fd);
    f.write_all(data).map_err(StartError::Host)?;
    f.rewind().map_err(StartError::Host)?;
    Ok(f.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn plan_of(dir: &Path) -> (Option<Vec<EtcPlan>>, Vec<Source>) {
        let meta = std::fs::metadata(dir).unwrap();
        let (mut budget, mut from) = (ETC_COPY_ENTRIES, Vec::new());
        let plan = plan_entry(dir, &meta, true, &mut budget, &mut from).unwrap();
        (plan, from)
    }

    #[test]
    fn small_readable_directories_are_copied_and_the_rest_bound() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("conf.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("a.conf"), "a").unwrap();
        std::os::unix::fs::symlink("/usr/share/x", d.join("link")).unwrap();
        let (plan, from) = plan_of(&d);
        let plan = plan.expect("copied");
        assert!(plan.contains(&EtcPlan::File {
            at: d.join("a.conf").to_string_lossy().into_owned(),
            mode: 0o644,
        }));
        assert!(plan.contains(&EtcPlan::Symlink {
            target: "/usr/share/x".into(),
            at: d.join("link").to_string_lossy().into_owned(),
        }));
        assert!(from.iter().all(Source::unchanged));

        // A change the plan was made from shows: a new entry, a file's mode.
        std::fs::write(d.join("b.conf"), "b").unwrap();
        assert!(!from.iter().all(Source::unchanged));
        let (_, from) = plan_of(&d);
        std::fs::set_permissions(d.join("a.conf"), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(!from.iter().all(Source::unchanged));

        // A file others may not read is not copied (a bind keeps its owner and mode).
        assert_eq!(plan_of(&d).0, None);
        std::fs::set_permissions(d.join("a.conf"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(plan_of(&d).0.is_some());

        // Too many entries: bound.
        for i in 0..ETC_COPY_ENTRIES {
            std::fs::write(d.join(format!("n{i}")), "n").unwrap();
        }
        assert_eq!(plan_of(&d).0, None);
    }
}

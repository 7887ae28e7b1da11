//! Memory, pids and CPU limits through cgroups: the v1 hierarchy (one mount per controller) or
//! the unified v2 hierarchy, whichever holds the controllers on this host.

use crate::Limits;
use std::path::{Path, PathBuf};

/// CFS period used for the CPU quota.
const CPU_PERIOD_US: u64 = 100_000;
/// Name of the directory under each controller that holds every sandbox's group.
const PARENT: &str = "coderoom";

/// Why sandboxes get no cgroup limits on this host.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Neither hierarchy holds the controllers.
    #[error("no cgroup v1 controllers and no cgroup v2 hierarchy")]
    NoHierarchy,
    /// The unified hierarchy lacks memory, pids or cpu.
    #[error("cgroup v2 lacks controllers (has: {has})")]
    MissingControllers {
        /// The controllers it has.
        has: String,
    },
    /// A server that is not root could not move itself into a leaf of its own group.
    #[error("the server's cgroup is not delegated to it")]
    NotDelegated(#[source] std::io::Error),
    /// A server that is not root could not make the group its sandboxes' groups go under.
    #[error("the server is not root and its cgroup is not delegated to it ({})", .0.display())]
    ParentNotDelegated(PathBuf, #[source] std::io::Error),
    /// The microVM tier limits its VMM processes only when the server is root.
    #[error("not root: cgroup limits need the server to run as root")]
    NotRoot,
}

/// Which cgroup layout this host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Controllers mounted separately (`/sys/fs/cgroup/memory`, `.../pids`, `.../cpu`).
    V1 {
        /// The memory controller's mount.
        memory: PathBuf,
        /// The pids controller's mount.
        pids: PathBuf,
        /// The cpu controller's mount.
        cpu: PathBuf,
    },
    /// The unified hierarchy with memory, pids and cpu available.
    V2 {
        /// The hierarchy's root.
        root: PathBuf,
    },
}

impl Layout {
    /// For a server that is not root: the layout, if its own groups were delegated to it (made
    /// writable by its user, as systemd's `Delegate=yes` does), so it creates its sandboxes'
    /// groups inside its own. On v2 the server first moves itself into a leaf of its group
    /// (`<own>/server`): a group whose children use controllers may hold no processes itself.
    pub fn delegated() -> Result<Layout, CgroupError> {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Self::delegated_in(Path::new("/sys/fs/cgroup"), &own)
    }

    /// [`Layout::delegated`] for the hierarchy at `base`, `own` being this process's
    /// `/proc/self/cgroup`.
    fn delegated_in(base: &Path, own: &str) -> Result<Layout, CgroupError> {
        let layout = Self::detect_in(base, own)?;
        let layout = match layout {
            Layout::V1 { .. } => layout,
            Layout::V2 { root } => {
                let mine = own
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .unwrap_or("/")
                    .trim_start_matches('/');
                let group = root.join(mine);
                let leaf = group.join("server");
                std::fs::create_dir_all(&leaf)
                    .and_then(|()| write(&leaf.join("cgroup.procs"), "0"))
                    .map_err(CgroupError::NotDelegated)?;
                Layout::V2 { root: group }
            }
        };
        for dir in layout.roots() {
            let parent = dir.join(PARENT);
            std::fs::create_dir_all(&parent)
                .map_err(|source| CgroupError::ParentNotDelegated(parent, source))?;
        }
        Ok(layout)
    }

    /// The groups under which sandboxes' groups are made.
    fn roots(&self) -> Vec<&Path> {
        match self {
            Layout::V1 { memory, pids, cpu } => vec![memory, pids, cpu],
            Layout::V2 { root } => vec![root],
        }
    }

    /// Finds the controllers under `/sys/fs/cgroup`, or says why there are none.
    pub fn detect() -> Result<Layout, CgroupError> {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Self::detect_in(Path::new("/sys/fs/cgroup"), &own)
    }

    /// `own` is this process's `/proc/self/cgroup`.
    fn detect_in(base: &Path, own: &str) -> Result<Layout, CgroupError> {
        // On v1 each sandbox's group nests under the server's own group of that controller,
        // so whatever limits the server's service also bounds its sandboxes.
        let v1 = |c: &str| {
            let mine = own
                .lines()
                .filter_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let _id = parts.next()?;
                    Some((parts.next()?, parts.next()?))
                })
                .find(|(ctrls, _)| ctrls.split(',').any(|x| x == c))
                .map(|(_, path)| path.trim_start_matches('/').to_owned())
                .unwrap_or_default();
            base.join(c).join(mine)
        };
        if v1("memory").join("memory.limit_in_bytes").exists()
            && v1("pids").join("cgroup.procs").exists()
            && base.join("pids").join("cgroup.procs").exists()
            && v1("cpu").join("cpu.cfs_quota_us").exists()
        {
            return Ok(Layout::V1 {
                memory: v1("memory"),
                pids: v1("pids"),
                cpu: v1("cpu"),
            });
        }
        let controllers = std::fs::read_to_string(base.join("cgroup.controllers"))
            .map_err(|_| CgroupError::NoHierarchy)?;
        let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
        if has("memory") && has("pids") && has("cpu") {
            Ok(Layout::V2 {
                root: base.to_owned(),
            })
        } else {
            Err(CgroupError::MissingControllers {
                has: controllers.trim().to_owned(),
            })
        }
    }

    /// The directories of the group `name`, as [`Cgroup::create`] makes them: memory, pids and
    /// cpu on v1 (in that order), the one group on v2.
    pub fn group_dirs(&self, name: &str) -> Vec<PathBuf> {
        self.parents().into_iter().map(|p| p.join(name)).collect()
    }

    /// The directories the sandboxes' groups are made in, in [`Layout::group_dirs`]'s order.
    fn parents(&self) -> Vec<PathBuf> {
        match self {
            Layout::V1 { memory, pids, cpu } => [memory, pids, cpu]
                .into_iter()
                .map(|root| root.join(PARENT))
                .collect(),
            Layout::V2 { root } => vec![root.join(PARENT)],
        }
    }

    /// Short name for receipts.
    pub fn name(&self) -> &'static str {
        match self {
            Layout::V1 { .. } => "cgroup-v1",
            Layout::V2 { .. } => "cgroup-v2",
        }
    }
}

/// One sandbox's cgroup (a directory per controller on v1, one directory on v2).
#[derive(Debug)]
pub struct Cgroup {
    layout: Layout,
    dirs: Vec<PathBuf>,
}

/// What the kernel reported about limits being hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// Processes killed by the OOM killer.
    pub oom_kills: u64,
    /// Forks refused by the pids limit.
    pub pids_refused: u64,
}

/// Makes `dir` (and what is missing above it): true if it was made here, false if it was
/// there already.
fn made(dir: &Path) -> std::io::Result<bool> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn counter(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

impl Cgroup {
    /// Creates the group `name` with `limits` (replacing a leftover one of the same name).
    pub fn create(layout: &Layout, name: &str, limits: &Limits) -> std::io::Result<Cgroup> {
        // Whether every directory of the group was made here (none left by a crashed server).
        let mut fresh = true;
        let dirs = match layout {
            Layout::V1 { .. } => {
                let dirs = layout.group_dirs(name);
                if dirs.len() != 3 {
                    return Err(std::io::Error::other("cgroup v1 needs three controllers"));
                }
                for dir in &dirs {
                    fresh &= made(dir)?;
                }
                dirs
            }
            Layout::V2 { root } => {
                let parent = root.join(PARENT);
                std::fs::create_dir_all(&parent)?;
                // Controllers must be enabled on every level above the group.
                let _ = write(&root.join("cgroup.subtree_control"), "+memory +pids +cpu");
                write(&parent.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
                let g = layout.group_dirs(name).remove(0);
                fresh &= made(&g)?;
                vec![g]
            }
        };
        let group = Cgroup {
            layout: layout.clone(),
            dirs,
        };
        // A new group starts with the kernel's default CFS period, which is ours.
        group.limit(limits, !fresh)?;
        // A group left behind by a crashed server may still hold its sandbox's processes.
        if !fresh {
            group.kill_all();
        }
        Ok(group)
    }

    /// Writes `limits` (and, with `period`, the CFS period: on v1 it is a file of its own).
    pub(crate) fn limit(&self, limits: &Limits, period: bool) -> std::io::Result<()> {
        let cpu_quota = (limits.cpu_millis.max(10) * CPU_PERIOD_US) / 1000;
        match (&self.layout, self.dirs.as_slice()) {
            (Layout::V1 { .. }, [m, p, c]) => {
                let memory = m.join("memory.limit_in_bytes");
                let value = limits.memory_bytes.to_string();
                // With swap accounting, swap counts too (without it the file is absent). The
                // kernel keeps memory <= memory+swap at every write: raising both, the second
                // goes first.
                let memsw = m.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    let now = std::fs::read_to_string(&memory)
                        .ok()
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .unwrap_or(u64::MAX);
                    if limits.memory_bytes > now {
                        write(&memsw, &value)?;
                        write(&memory, &value)?;
                    } else {
                        write(&memory, &value)?;
                        write(&memsw, &value)?;
                    }
                } else {
                    write(&memory, &value)?;
                }
                write(&p.join("pids.max"), &limits.pids.to_string())?;
                if period {
                    write(&c.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                }
                write(&c.join("cpu.cfs_quota_us"), &cpu_quota.to_string())
            }
            (Layout::V2 { .. }, [g]) => {
                write(&g.join("memory.max"), &limits.memory_bytes.to_string())?;
                let swap = g.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
                write(&g.join("pids.max"), &limits.pids.to_string())?;
                write(&g.join("cpu.max"), &format!("{cpu_quota} {CPU_PERIOD_US}"))
            }
            _ => Err(std::io::Error::other("a cgroup of an unknown shape")),
        }
    }

    /// Renames the group to `name` (a group made ahead of need, under a name of its own, taken
    /// by a sandbox). Only v1 renames groups; a name that is taken is an error, and the group
    /// keeps its name.
    pub(crate) fn rename(&mut self, name: &str) -> std::io::Result<()> {
        if !matches!(self.layout, Layout::V1 { .. }) {
            return Err(std::io::Error::other("cgroup v2 does not rename groups"));
        }
        let to = self.layout.group_dirs(name);
        for (i, (from, dest)) in self.dirs.iter().zip(&to).enumerate() {
            if let Err(e) = std::fs::rename(from, dest) {
                for (f, d) in self.dirs.iter().zip(&to).take(i) {
                    let _ = std::fs::rename(d, f);
                }
                return Err(e);
            }
        }
        self.dirs = to;
        Ok(())
    }

    /// Kills every process in the group; true if there were any.
    fn kill_all(&self) -> bool {
        let mut any = false;
        for dir in &self.dirs {
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    any = true;
                    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
            }
        }
        any
    }

    /// The `cgroup.procs` files a new process writes `0` to, to join the group.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Limits hit so far.
    pub fn pressure(&self) -> Pressure {
        match &self.layout {
            Layout::V1 { .. } => Pressure {
                oom_kills: counter(&self.dirs[0].join("memory.oom_control"), "oom_kill"),
                pids_refused: counter(&self.dirs[1].join("pids.events"), "max"),
            },
            Layout::V2 { .. } => Pressure {
                oom_kills: counter(&self.dirs[0].join("memory.events"), "oom_kill"),
                pids_refused: counter(&self.dirs[0].join("pids.events"), "max"),
            },
        }
    }

    /// Current memory use in bytes.
    pub fn memory_bytes(&self) -> u64 {
        let file = match &self.layout {
            Layout::V1 { .. } => self.dirs[0].join("memory.usage_in_bytes"),
            Layout::V2 { .. } => self.dirs[0].join("memory.current"),
        };
        std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills whatever is left in the group and removes it.
    pub fn remove(&self) {
        for _ in 0..50 {
            if !self.kill_all() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The names of groups made ahead of need, `spare<pid>x<n>`: with the server's pid, so that a
/// crashed server's are found and removed ([`remove_orphan_spares`]).
const SPARE: &str = "spare";

/// The name of this process's `n`th spare group: `spare<pid>x<instance>x<n>`, the instance a
/// random number of this process (a restarted server in a container often has the same pid).
pub(crate) fn spare_name(n: u64) -> String {
    format!("{SPARE}{}x{:x}x{n}", std::process::id(), instance())
}

fn instance() -> u64 {
    static INSTANCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *INSTANCE.get_or_init(|| {
        use std::hash::BuildHasher as _;
        std::collections::hash_map::RandomState::new().hash_one(std::process::id())
    })
}

/// Removes spare groups of processes that no longer run (a group still holding a process is
/// not removed: the kernel refuses).
pub(crate) fn remove_orphan_spares(layout: &Layout) {
    for parent in layout.parents() {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some((pid, rest)) = name
                .to_str()
                .and_then(|n| n.strip_prefix(SPARE))
                .and_then(|n| n.split_once('x'))
                .and_then(|(pid, rest)| Some((pid.parse::<u32>().ok()?, rest)))
            else {
                continue;
            };
            let ours = format!("{:x}x", instance());
            let gone = if pid == std::process::id() {
                // This pid's, of another instance: one that ran before this one.
                !rest.starts_with(&ours)
            } else {
                !Path::new(&format!("/proc/{pid}")).exists()
            };
            if gone {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

/// A new sandbox's group `name` with `limits`, when the host has cgroups (`layout`), with its
/// `cgroup.procs` files opened: the sandbox's first process writes itself into them between
/// fork and exec.
/// A `spare` group made ahead of need (and the limits it was given) is renamed to `name` and
/// given `limits` where they differ; when it cannot be (its name is taken), it is removed and
/// the group made as without one.
pub(crate) fn prepare(
    layout: Option<&Layout>,
    name: &str,
    limits: &Limits,
    spare: Option<(Cgroup, Limits)>,
) -> std::io::Result<(Option<std::sync::Arc<Cgroup>>, Vec<std::fs::File>)> {
    let Some(layout) = layout else {
        return Ok((None, Vec::new()));
    };
    let taken = spare.and_then(|(mut g, given)| match g.rename(name) {
        Ok(()) => Some((g, given)),
        Err(_) => {
            g.remove();
            None
        }
    });
    let group = match taken {
        Some((g, given)) if given == *limits => g,
        Some((g, _)) => match g.limit(limits, false) {
            Ok(()) => g,
            Err(_) => {
                // Made again from nothing, as without a spare.
                g.remove();
                Cgroup::create(layout, name, limits)?
            }
        },
        None => Cgroup::create(layout, name, limits)?,
    };
    let group = std::sync::Arc::new(group);
    let procs = group
        .procs_files()
        .iter()
        .map(|p| std::fs::OpenOptions::new().write(true).open(p))
        .collect::<Result<_, _>>()?;
    Ok((Some(group), procs))
}

/// Once a sandbox has ended: what its group saw, then the group removed.
pub(crate) async fn finish(group: Option<std::sync::Arc<Cgroup>>) -> Pressure {
    let Some(group) = group else {
        return Pressure::default();
    };
    let pressure = group.pressure();
    let _ = tokio::task::spawn_blocking(move || group.remove()).await;
    pressure
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose name is taken again (a crashed server's, say) is emptied first, and the
    /// new group gets its limits; a fresh group is not searched for processes.
    #[test]
    fn a_group_found_in_place_is_emptied_and_limited_again() {
        use std::os::unix::process::ExitStatusExt;
        let layout = match Layout::detect() {
            Ok(l) if rustix::process::geteuid().is_root() => l,
            _ => {
                crate::test_skip::skip("CGROUPS", "needs root and a cgroup hierarchy");
                return;
            }
        };
        let name = format!("cgtest{}", std::process::id());
        let limits = Limits::default();
        let left = Cgroup::create(&layout, &name, &limits).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        for f in left.procs_files() {
            std::fs::write(f, child.id().to_string()).unwrap();
        }
        if let Layout::V1 { .. } = layout {
            std::fs::write(left.dirs[2].join("cpu.cfs_period_us"), "50000").unwrap();
        }
        let again = Cgroup::create(&layout, &name, &limits).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                again.remove();
                panic!("the process in the group found in place was left running");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        if let Layout::V1 { .. } = layout {
            let period = std::fs::read_to_string(again.dirs[2].join("cpu.cfs_period_us"));
            assert_eq!(period.unwrap().trim(), CPU_PERIOD_US.to_string());
        }
        again.remove();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        assert!(again.dirs.iter().all(|d| !d.exists()));
    }

    /// A group made ahead of need becomes the sandbox's by a rename, with the sandbox's limits
    /// where they differ; where the sandbox's name is taken, the spare goes and the group is
    /// made as without one. Orphaned spares (of a process that is gone) are removed.
    #[test]
    fn a_spare_group_is_renamed_to_the_sandbox_and_limited() {
        let layout = match Layout::detect() {
            Ok(l @ Layout::V1 { .. }) if rustix::process::geteuid().is_root() => l,
            _ => {
                crate::test_skip::skip("CGROUPS", "needs root and cgroup v1 controllers");
                return;
            }
        };
        let made_with = Limits::default();
        // More memory than the spare was given: with swap accounting, memory+swap is raised
        // first.
        let wanted = Limits {
            pids: made_with.pids + 7,
            memory_bytes: made_with.memory_bytes * 2,
            ..Limits::default()
        };
        let spare = Cgroup::create(&layout, &spare_name(1_000_001), &made_with).unwrap();
        let spare_dirs = spare.dirs.clone();
        // A mark that tells the spare itself from a group made again.
        std::fs::write(spare.dirs[2].join("cpu.shares"), "777").unwrap();
        let name = format!("cgspare{}", std::process::id());
        let (group, procs) = prepare(
            Some(&layout),
            &name,
            &wanted,
            Some((spare, made_with.clone())),
        )
        .unwrap();
        let group = group.unwrap();
        assert_eq!(group.dirs, layout.group_dirs(&name));
        assert!(spare_dirs.iter().all(|d| !d.exists()));
        assert_eq!(procs.len(), 3);
        let pids = std::fs::read_to_string(group.dirs[1].join("pids.max")).unwrap();
        assert_eq!(pids.trim(), wanted.pids.to_string());
        let memory = std::fs::read_to_string(group.dirs[0].join("memory.limit_in_bytes"));
        assert_eq!(memory.unwrap().trim(), wanted.memory_bytes.to_string());
        let shares = std::fs::read_to_string(group.dirs[2].join("cpu.shares")).unwrap();
        assert_eq!(shares.trim(), "777", "the spare was not the group taken");

        // The name is taken now: a second spare is not renamed onto it.
        let spare = Cgroup::create(&layout, &spare_name(1_000_002), &made_with).unwrap();
        let spare_dirs = spare.dirs.clone();
        let (again, _) = prepare(Some(&layout), &name, &wanted, Some((spare, made_with))).unwrap();
        assert!(spare_dirs.iter().all(|d| !d.exists()));
        assert_eq!(again.unwrap().dirs, group.dirs);
        group.remove();

        // A spare of a pid that does not run is an orphan.
        let orphan = layout.group_dirs(&format!("{SPARE}{}x1x0", u32::MAX - 1));
        for d in &orphan {
            std::fs::create_dir(d).unwrap();
        }
        remove_orphan_spares(&layout);
        assert!(orphan.iter().all(|d| !d.exists()));
    }

    #[test]
    fn layouts_are_told_apart() {
        let v1 = tempfile::tempdir().unwrap();
        for (c, f) in [
            ("memory", "memory.limit_in_bytes"),
            ("pids", "cgroup.procs"),
            ("cpu", "cpu.cfs_quota_us"),
        ] {
            std::fs::create_dir_all(v1.path().join(c)).unwrap();
            std::fs::write(v1.path().join(c).join(f), "max").unwrap();
        }
        assert!(matches!(
            Layout::detect_in(v1.path(), "4:memory:/\n"),
            Ok(Layout::V1 { .. })
        ));

        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(
            v2.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        assert!(matches!(
            Layout::detect_in(v2.path(), "0::/\n"),
            Ok(Layout::V2 { .. })
        ));

        let poor = tempfile::tempdir().unwrap();
        std::fs::write(poor.path().join("cgroup.controllers"), "hugetlb\n").unwrap();
        let err = Layout::detect_in(poor.path(), "").unwrap_err();
        assert!(err.to_string().contains("hugetlb"), "{err}");
    }

    /// The v2 path of a server that is not root, on a stand-in hierarchy (this host's v2 mount
    /// has no controllers, so the kernel's side is not exercised here): the server moves itself
    /// into `<own>/server`, sandboxes' groups go under `<own>/coderoom`, with the controllers
    /// enabled above them and the room's limits written.
    #[test]
    fn a_delegated_v2_group_gets_a_leaf_for_the_server_and_the_sandboxes_beside_it() {
        let v2 = tempfile::tempdir().unwrap();
        let own = v2.path().join("system.slice/coderoom.service");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(
            v2.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        let layout =
            Layout::delegated_in(v2.path(), "0::/system.slice/coderoom.service\n").unwrap();
        let Layout::V2 { root } = &layout else {
            panic!("{layout:?}")
        };
        assert_eq!(root, &own);
        assert_eq!(
            std::fs::read_to_string(own.join("server/cgroup.procs")).unwrap(),
            "0"
        );
        assert!(own.join(PARENT).is_dir());
        let limits = Limits::default();
        let g = Cgroup::create(&layout, "room1", &limits).unwrap();
        let dir = own.join(PARENT).join("room1");
        assert_eq!(g.procs_files(), vec![dir.join("cgroup.procs")]);
        for level in [&own, &own.join(PARENT)] {
            assert_eq!(
                std::fs::read_to_string(level.join("cgroup.subtree_control")).unwrap(),
                "+memory +pids +cpu"
            );
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.max")).unwrap(),
            limits.memory_bytes.to_string()
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("pids.max")).unwrap(),
            limits.pids.to_string()
        );
        assert!(std::fs::read_to_string(dir.join("cpu.max"))
            .unwrap()
            .ends_with(" 100000"));
    }

    #[test]
    fn counters_are_read_by_key() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("memory.oom_control");
        std::fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        assert_eq!(counter(&f, "oom_kill"), 3);
        assert_eq!(counter(&f, "missing"), 0);
    }
}

//! What the host sees of the fixture's sandboxes: the server's process tree, what each
//! sandbox's processes cost (proportional set size), their cgroups, and the floors the fixture
//! compares against (plain `bwrap`, the same step run on the host).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A process: its id and start time (ticks since boot), which together name it for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Proc {
    pub(super) pid: u32,
    start: u64,
}

fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything; fields follow the last ')'.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split(' ').collect();
    // After the name: state(0) ppid(1) ... starttime(19).
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

/// Whether `p` still runs (the same process, not a reused id).
pub(super) fn alive(p: Proc) -> bool {
    stat_of(p.pid).is_some_and(|(_, start)| start == p.start)
}

/// Every process below `root` (not `root` itself), grouped by the child of `root` it descends
/// from.
pub(super) fn subtrees(root: u32) -> BTreeMap<Proc, Vec<Proc>> {
    let mut parent = BTreeMap::new();
    let mut start = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, st)) = stat_of(pid) {
                parent.insert(pid, ppid);
                start.insert(pid, st);
            }
        }
    }
    let mut out: BTreeMap<Proc, Vec<Proc>> = BTreeMap::new();
    for &pid in parent.keys() {
        // Walk up to `root`, remembering the step just below it.
        let (mut at, mut below) = (pid, None);
        let mut hops = 0;
        while at != root && at > 1 && hops < 64 {
            below = Some(at);
            at = parent.get(&at).copied().unwrap_or(0);
            hops += 1;
        }
        if at != root {
            continue;
        }
        let Some(top) = below else { continue };
        let top = Proc {
            pid: top,
            start: start[&top],
        };
        out.entry(top).or_default().push(Proc {
            pid,
            start: start[&pid],
        });
    }
    out
}

/// Whether `p` is a sandbox's first process (bubblewrap or a VMM), not a helper the server
/// runs (git, tar).
pub(super) fn is_sandbox_root(p: Proc) -> bool {
    // The executable's name, or where it cannot be read (another uid, a setuid bwrap) the
    // command name the kernel keeps (cut at 15 bytes).
    let name = std::fs::read_link(format!("/proc/{}/exe", p.pid))
        .ok()
        .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| {
            let s = std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).ok()?;
            Some(s.get(s.find('(')? + 1..s.rfind(')')?)?.to_owned())
        })
        .unwrap_or_default();
    name == "bwrap" || name.starts_with("qemu-system") || name.starts_with("cloud-hyperviso")
}

/// The sandboxes below the server `server`: each as its processes.
pub(super) fn sandboxes(server: u32) -> Vec<Vec<Proc>> {
    subtrees(server)
        .into_iter()
        .filter(|(top, _)| is_sandbox_root(*top))
        .map(|(_, all)| all)
        .collect()
}

/// What `p`'s memory costs in bytes: its proportional set size (its private pages and its
/// share of shared ones) and its private pages alone (what one more such process adds).
pub(super) fn pss_and_private(p: Proc) -> (u64, u64) {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", p.pid)) else {
        return (0, 0);
    };
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (
        field("Pss:"),
        field("Private_Clean:") + field("Private_Dirty:"),
    )
}

/// The cgroup directories `p` is in (one per v1 hierarchy, or the v2 one), as host paths.
pub(super) fn cgroups_of(p: Proc) -> Vec<PathBuf> {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in s.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if path == "/" || path.is_empty() {
            continue;
        }
        let rel = path.trim_start_matches('/');
        let dirs: Vec<PathBuf> = if ctrls.is_empty() {
            cgroup2_mounts().into_iter().map(|m| m.join(rel)).collect()
        } else {
            ctrls
                .split(',')
                .map(|c| {
                    Path::new("/sys/fs/cgroup")
                        .join(c.trim_start_matches("name="))
                        .join(rel)
                })
                .collect()
        };
        out.extend(dirs.into_iter().filter(|d| d.is_dir()));
    }
    out
}

fn cgroup2_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .collect()
}

/// What the memory cgroup of a sandbox is charged (v1 `memory.usage_in_bytes`, v2
/// `memory.current`), where it has one of its own: not one it shares with the server.
pub(super) fn cgroup_memory(procs: &[Proc], server: u32) -> Option<u64> {
    let theirs: BTreeSet<PathBuf> = stat_of(server)
        .map(|(_, start)| cgroups_of(Proc { pid: server, start }))
        .unwrap_or_default()
        .into_iter()
        .collect();
    let dirs: BTreeSet<PathBuf> = procs
        .iter()
        .flat_map(|p| cgroups_of(*p))
        .filter(|d| !theirs.contains(d))
        .collect();
    dirs.iter().find_map(|d| {
        ["memory.current", "memory.usage_in_bytes"]
            .iter()
            .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
            .and_then(|v| v.trim().parse().ok())
    })
}

/// This host's own addresses but loopback (IPv4 and IPv6), which no sandbox's network may
/// show.
pub(super) fn host_addresses() -> Vec<String> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    for a in addrs {
        let Some(addr) = a.address else { continue };
        let ip: Option<std::net::IpAddr> = if let Some(v4) = addr.as_sockaddr_in() {
            Some(v4.ip().into())
        } else {
            addr.as_sockaddr_in6().map(|v6| v6.ip().into())
        };
        if let Some(ip) = ip.filter(|ip| !ip.is_loopback() && !ip.is_unspecified()) {
            // IPv6 link-local addresses are derived from a MAC and may repeat in a VM guest
            // with the same virtual card; the host's global ones do not.
            if let std::net::IpAddr::V6(v6) = ip {
                if v6.segments()[0] & 0xffc0 == 0xfe80 {
                    continue;
                }
            }
            out.insert(ip.to_string());
        }
    }
    out.into_iter().collect()
}

/// Runs `argv` on the host, timing it; an error when it fails.
pub(super) fn time_on_host(argv: &[&str], dir: &Path) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let out = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()?;
    let took = started.elapsed();
    if !out.status.success() {
        anyhow::bail!(
            "{argv:?} on the host: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(took)
}

/// The floor of the namespace tier's start: plain `bwrap` with the same namespaces and base
/// mounts, starting `true`.
pub(super) fn bwrap_floor(dir: &Path) -> anyhow::Result<Duration> {
    let argv = coderoom_sandbox::namespace::bwrap_floor(&["/bin/true"]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    time_on_host(&argv, dir)
}

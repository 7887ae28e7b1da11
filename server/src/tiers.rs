//! `coderoom bench tiers`: one fixture through every sandbox tier this host can run, one
//! table. Each tier gets servers of its own (this binary's `serve`, on a data directory of
//! the run's), driven from outside through the public API as clients drive it, and watched
//! from the host as an operator would: what a start costs beside its floor, what a sandbox
//! costs at rest, what room code can reach (the canaries, run as room code), what deletion
//! leaves behind, and what a killed server leaves running.
//!
//! A tier that cannot run here is a row saying why, in the words of `coderoom doctor`.

mod canaries;
mod fixture;
mod host;
mod server;

use crate::config::TiersArgs;
use canaries::Verdict;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How many times each figure is taken.
pub(crate) struct Runs {
    cold: usize,
    repeat: usize,
    steps: usize,
    resume: usize,
    burst: usize,
    kill9: usize,
}

impl Runs {
    fn new(short: bool, burst: Option<usize>) -> Runs {
        if short {
            Runs {
                cold: 2,
                repeat: 5,
                steps: 1,
                resume: 1,
                burst: burst.unwrap_or(3),
                kill9: 2,
            }
        } else {
            Runs {
                cold: 10,
                repeat: 10,
                steps: 3,
                resume: 3,
                burst: burst.unwrap_or(20),
                kill9: 3,
            }
        }
    }
}

/// Durations in one figure: median, 95th percentile and worst.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Spread {
    n: usize,
    #[serde(serialize_with = "ms")]
    median: Duration,
    #[serde(serialize_with = "ms")]
    p95: Duration,
    #[serde(serialize_with = "ms")]
    max: Duration,
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e5).round() / 100.0)
}

impl Spread {
    fn of(mut v: Vec<Duration>) -> Spread {
        v.sort_unstable();
        if v.is_empty() {
            return Spread::default();
        }
        let at = |q: usize| {
            v[((v.len() * q).div_ceil(100))
                .saturating_sub(1)
                .min(v.len() - 1)]
        };
        Spread {
            n: v.len(),
            median: v[v.len() / 2],
            p95: at(95),
            max: v[v.len() - 1],
        }
    }
}

fn fmt_ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms:.1}")
    }
}

/// What an idle sandbox costs.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Memory {
    sandboxes: usize,
    pss_median: Option<u64>,
    private_median: Option<u64>,
    cgroup_median: Option<u64>,
}

/// Everything one tier's fixture measured.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Figures {
    running_command: Option<Spread>,
    /// The cold rooms' sandboxes' own starts, by their receipts (the namespace tier's).
    sandbox_start: Option<Spread>,
    /// Plain bwrap's start (the floor), timed just before each of those cold starts.
    start_floor: Option<Spread>,
    cold_first_command: Option<Spread>,
    warm_first_command: Option<Spread>,
    /// On the warm pool's server: a command in a room that has run for a while, timed just
    /// before each of those first commands.
    warm_running_command: Option<Spread>,
    resume_first_command: Option<Spread>,
    fork_first_command: Option<Spread>,
    /// Rooms asked at once, their first commands, failures.
    burst: Option<(usize, Spread, usize)>,
    /// In the sandbox (less a running room's command), on the host.
    cpu_step: Option<(Spread, Spread)>,
    file_step: Option<(Spread, Spread)>,
    idle_memory: Option<Memory>,
    canaries: Vec<Verdict>,
    /// Beside the canaries: deletion, kill -9, clean stop.
    checks: Vec<Verdict>,
}

impl Figures {
    /// Every canary's and check's verdict.
    fn verdicts(&self) -> impl Iterator<Item = &Verdict> {
        self.canaries.iter().chain(&self.checks)
    }

    /// Every canary and check held.
    fn all_held(&self) -> bool {
        self.verdicts().all(|v| v.held)
    }
}

/// A tier's row: its figures, or why it did not run.
#[derive(Debug, Serialize)]
struct Tier {
    tier: String,
    /// The flags its servers were started with.
    flags: Vec<String>,
    ran: bool,
    /// Why it did not run, or the error that stopped it.
    reason: Option<String>,
    figures: Option<Figures>,
    /// Every canary and check held.
    ok: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    /// When the run ended (Unix ms).
    at: i64,
    host: HostInfo,
    short: bool,
    tiers: Vec<Tier>,
    ok: bool,
}

#[derive(Debug, Serialize)]
struct HostInfo {
    kernel: String,
    cpus: usize,
    memory_mib: u64,
    binary: String,
    /// Plain `bwrap` starting `true` with the same namespaces and base mounts (median).
    bwrap_floor: Option<Spread>,
}

/// The tiers the fixture knows, by name.
const TIER_NAMES: &[&str] = &[
    "namespace",
    "microvm-qemu",
    "microvm-cloud-hypervisor",
    "sandbox-host",
];

/// Runs the fixture; whether every canary and check held in every tier that ran.
pub(crate) async fn run(args: TiersArgs) -> anyhow::Result<bool> {
    for t in &args.tiers {
        if !TIER_NAMES.contains(&t.as_str()) {
            anyhow::bail!("unknown tier {t:?}: one of {}", TIER_NAMES.join(", "));
        }
    }
    let runs = Runs::new(args.short, args.burst);
    let (dir, made) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "coderoom-tiers-{}",
                hex::encode(rand::random::<[u8; 6]>())
            )),
            true,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    let floors = dir.join("floor");
    std::fs::create_dir_all(&floors)?;
    let bwrap_floor = (0..runs.repeat)
        .map(|_| host::bwrap_floor(&floors))
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .map(Spread::of);
    let host = HostInfo {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_mib: std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024),
        binary: format!("coderoom {}", env!("CARGO_PKG_VERSION")),
        bwrap_floor,
    };
    let mut tiers = Vec::new();
    for name in TIER_NAMES {
        if !args.tiers.is_empty() && !args.tiers.iter().any(|t| t == name) {
            continue;
        }
        let (flags, why_not) = match available(name, &args, &dir).await {
            Ok(flags) => (flags, None),
            Err(NotHere(why)) => (Vec::new(), Some(why)),
        };
        if let Some(why) = why_not {
            if !args.json {
                eprintln!("tiers: {name}: not run here: {why}");
            }
            tiers.push(Tier {
                tier: (*name).to_owned(),
                flags,
                ran: false,
                reason: Some(why),
                figures: None,
                // Named on the command line, a tier that cannot run fails the run.
                ok: !args.tiers.iter().any(|t| t == name),
            });
            continue;
        }
        eprintln!("tiers: {name}: running the fixture ({})", flags.join(" "));
        let mut all = flags.clone();
        all.extend(args.serve_args.iter().cloned());
        let outcome = fixture::run(&dir.join(name), &all, &runs, *name == "sandbox-host").await;
        let tier = match outcome {
            Ok(figures) => Tier {
                tier: (*name).to_owned(),
                flags,
                ran: true,
                reason: None,
                ok: figures.all_held(),
                figures: Some(figures),
            },
            Err(e) => Tier {
                tier: (*name).to_owned(),
                flags,
                ran: true,
                reason: Some(format!("the fixture stopped: {e:#}")),
                figures: None,
                ok: false,
            },
        };
        eprintln!(
            "tiers: {name}: {}",
            if tier.ok {
                "every canary held"
            } else {
                "FAILED"
            }
        );
        tiers.push(tier);
    }
    let ok = tiers.iter().all(|t| t.ok) && tiers.iter().any(|t| t.ran);
    let report = Report {
        at: crate::clock::Clock::system().now_ms(),
        host,
        short: args.short,
        tiers,
        ok,
    };
    let json = serde_json::to_string_pretty(&report)?;
    if args.json {
        println!("{json}");
    } else {
        print!("{}", markdown(&report));
    }
    // For the receipts of this host's server (`sandbox::receipt`).
    if args.data_dir.is_dir() {
        let record = args.data_dir.join(crate::sandbox::receipt::FIXTURE_RECORD);
        match record_run(&record, &report) {
            Ok(()) => eprintln!("tiers: recorded in {}", record.display()),
            Err(e) => eprintln!("tiers: cannot record in {}: {e}", record.display()),
        }
    }
    if made && !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(ok)
}

/// Writes `report` to `record` (whole, through a rename: the server reads it at every start),
/// keeping the last run of each tier this run did not run, each tier with its run's time.
fn record_run(record: &Path, report: &Report) -> anyhow::Result<()> {
    let ran: Vec<&str> = report
        .tiers
        .iter()
        .filter(|t| t.ran)
        .map(|t| t.tier.as_str())
        .collect();
    let mut tiers: Vec<serde_json::Value> = Vec::new();
    let old = std::fs::read_to_string(record)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
    for t in old
        .as_ref()
        .and_then(|o| o["tiers"].as_array())
        .into_iter()
        .flatten()
    {
        let name = t["tier"].as_str().unwrap_or_default();
        if t["ran"] == true && !ran.contains(&name) && t["at"].is_i64() {
            tiers.push(t.clone());
        }
    }
    for t in &report.tiers {
        let mut v = serde_json::to_value(t)?;
        v["at"] = report.at.into();
        v["short"] = report.short.into();
        tiers.push(v);
    }
    let mut whole = serde_json::to_value(report)?;
    whole["tiers"] = tiers.into();
    let partial = record.with_extension("json.partial");
    std::fs::write(&partial, serde_json::to_vec_pretty(&whole)?)?;
    std::fs::rename(&partial, record)?;
    Ok(())
}

/// Why a tier cannot run on this host (in `coderoom doctor`'s words where it has them).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NotHere(String);

/// The flags a tier's servers run with, or why it cannot run here.
async fn available(name: &str, args: &TiersArgs, dir: &Path) -> Result<Vec<String>, NotHere> {
    use coderoom_sandbox::vm::{Accel, VmConfig, VmmKind};
    use coderoom_sandbox::{AgentCommand, Backend, Tier};
    let agent = AgentCommand {
        exe: std::env::current_exe().unwrap_or_else(|_| "coderoom".into()),
        args: vec!["agent".into()],
    };
    let image_dir = args
        .image_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("./data/images"));
    let vm = |kind: VmmKind| VmConfig {
        vmm: Some(kind),
        accel: (kind == VmmKind::Qemu && args.vm_accel_tcg).then_some(Accel::Tcg),
        cloud_hypervisor_bin: args.cloud_hypervisor_bin.clone(),
        qemu_bin: args.qemu_bin.clone(),
        image_dir: image_dir.clone(),
        state_dir: dir.join("vm-probe"),
        inputs: coderoom_sandbox::vm::Inputs {
            kernel_deb: None,
            busybox: None,
            agent: None,
        },
        build_on_need: false,
    };
    let vm_flags = |vmm: &str| {
        let mut f = vec![
            "--sandbox-tier".to_owned(),
            "microvm".to_owned(),
            "--vmm".to_owned(),
            vmm.to_owned(),
            "--image-dir".to_owned(),
            image_dir.to_string_lossy().into_owned(),
        ];
        if let Some(b) = &args.qemu_bin {
            f.extend(["--qemu-bin".to_owned(), b.to_string_lossy().into_owned()]);
        }
        if let Some(b) = &args.cloud_hypervisor_bin {
            f.extend([
                "--cloud-hypervisor-bin".to_owned(),
                b.to_string_lossy().into_owned(),
            ]);
        }
        if vmm == "qemu" && args.vm_accel_tcg {
            f.extend(["--vm-accel".to_owned(), "tcg".to_owned()]);
        }
        f
    };
    match name {
        "namespace" => match Backend::namespace(agent, None) {
            (Backend::Namespace(_), _) => Ok(vec!["--sandbox-tier".into(), "namespace".into()]),
            (_, why) => Err(NotHere(why)),
        },
        "microvm-qemu" | "microvm-cloud-hypervisor" => {
            let (kind, vmm) = if name == "microvm-qemu" {
                (VmmKind::Qemu, "qemu")
            } else {
                (VmmKind::CloudHypervisor, "cloud-hypervisor")
            };
            if coderoom_sandbox::vm::GuestImage::current(&image_dir).is_none() {
                return Err(NotHere(format!(
                    "no guest image in {} (`coderoom image build`, then --image-dir)",
                    image_dir.display()
                )));
            }
            match Backend::select(Tier::Microvm, agent, None, &vm(kind)).await {
                (Backend::Microvm(_), _) => Ok(vm_flags(vmm)),
                (_, why) => Err(NotHere(why)),
            }
        }
        "sandbox-host" => {
            if args.sandbox_hosts.is_empty() {
                return Err(NotHere(
                    "no sandbox host named (--sandbox-hosts, with --sandbox-host-ca, \
                     --sandbox-host-cert and --sandbox-host-key)"
                        .into(),
                ));
            }
            let mut f = vec!["--sandbox-hosts".to_owned(), args.sandbox_hosts.join(",")];
            for (flag, v) in [
                ("--sandbox-host-ca", &args.sandbox_host_ca),
                ("--sandbox-host-cert", &args.sandbox_host_cert),
                ("--sandbox-host-key", &args.sandbox_host_key),
            ] {
                match v {
                    Some(p) => f.extend([flag.to_owned(), p.to_string_lossy().into_owned()]),
                    None => return Err(NotHere(format!("{flag} is needed with --sandbox-hosts"))),
                }
            }
            Ok(f)
        }
        _ => Err(NotHere("unknown tier".into())),
    }
}

fn markdown(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Sandbox tiers on this host ({}, {} CPUs, {} MiB, {}{})\n",
        r.host.kernel,
        r.host.cpus,
        r.host.memory_mib,
        r.host.binary,
        if r.short { ", short fixture" } else { "" }
    );
    let ran: Vec<&Tier> = r.tiers.iter().filter(|t| t.figures.is_some()).collect();
    for t in r.tiers.iter().filter(|t| t.figures.is_none()) {
        let _ = writeln!(
            s,
            "- **{}**: {}",
            t.tier,
            t.reason.as_deref().unwrap_or("not run")
        );
    }
    if !ran.is_empty() {
        let _ = writeln!(s);
        let head: Vec<&str> = ran.iter().map(|t| t.tier.as_str()).collect();
        let _ = writeln!(
            s,
            "| figure (ms: median / p95 / max) | {} |",
            head.join(" | ")
        );
        let _ = writeln!(s, "|---|{}", "---|".repeat(ran.len()));
        let spread = |o: &Option<Spread>| {
            o.as_ref().map_or("-".to_owned(), |x| {
                format!(
                    "{} / {} / {} (n={})",
                    fmt_ms(x.median),
                    fmt_ms(x.p95),
                    fmt_ms(x.max),
                    x.n
                )
            })
        };
        type Cell = Box<dyn Fn(&Figures) -> String>;
        let rows: Vec<(&str, Cell)> = vec![
            (
                "command in a running room",
                Box::new(move |f: &Figures| spread(&f.running_command)),
            ),
            (
                "first command in a new room, cold",
                Box::new(move |f: &Figures| spread(&f.cold_first_command)),
            ),
            (
                "its sandbox's start: asking the tier to the agent's first answer (receipts)",
                Box::new(move |f: &Figures| spread(&f.sandbox_start)),
            ),
            (
                "first command in a new room, from the warm pool",
                Box::new(move |f: &Figures| spread(&f.warm_first_command)),
            ),
            (
                "command in a running room of that server, timed just before each",
                Box::new(move |f: &Figures| spread(&f.warm_running_command)),
            ),
            (
                "first command after resuming from a snapshot",
                Box::new(move |f: &Figures| spread(&f.resume_first_command)),
            ),
            (
                "first command in a fork of a checkpoint",
                Box::new(move |f: &Figures| spread(&f.fork_first_command)),
            ),
            (
                "rooms at once: each one's first command",
                Box::new(move |f: &Figures| {
                    f.burst.as_ref().map_or("-".into(), |(n, sp, failed)| {
                        format!(
                            "{n} rooms: {} / {} / {}, {failed} failed",
                            fmt_ms(sp.median),
                            fmt_ms(sp.p95),
                            fmt_ms(sp.max)
                        )
                    })
                }),
            ),
            (
                "CPU step: sandbox / host",
                Box::new(move |f: &Figures| ratio(&f.cpu_step)),
            ),
            (
                "file step: sandbox / host",
                Box::new(move |f: &Figures| ratio(&f.file_step)),
            ),
            (
                "idle sandbox: PSS / private pages of its processes / its cgroup's charge",
                Box::new(move |f: &Figures| {
                    f.idle_memory.as_ref().map_or("-".into(), |m| {
                        let kib = |b: Option<u64>| {
                            b.map_or("-".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
                        };
                        format!(
                            "{} / {} / {} (median of {})",
                            kib(m.pss_median),
                            kib(m.private_median),
                            kib(m.cgroup_median),
                            m.sandboxes
                        )
                    })
                }),
            ),
        ];
        for (name, cell) in &rows {
            let cells: Vec<String> = ran
                .iter()
                .map(|t| t.figures.as_ref().map_or("-".into(), cell))
                .collect();
            let _ = writeln!(s, "| {name} | {} |", cells.join(" | "));
        }
        if let Some(b) = &r.host.bwrap_floor {
            let _ = writeln!(
                s,
                "\nFloor on this host: plain `bwrap` with the same namespaces and base mounts \
                 starting `true`: {} ms median ({} max).",
                fmt_ms(b.median),
                fmt_ms(b.max)
            );
        }
        for t in &ran {
            let Some(f) = t.figures.as_ref() else {
                continue;
            };
            if let (Some(first), Some(running)) = (&f.warm_first_command, &f.warm_running_command) {
                let _ = writeln!(
                    s,
                    "The {} tier's first command in a new room from the warm pool is {:.2}x a \
                     command in a running room of that server timed just before each ({} ms \
                     median beside {} ms).",
                    t.tier,
                    first.median.as_secs_f64() / running.median.as_secs_f64().max(1e-9),
                    fmt_ms(first.median),
                    fmt_ms(running.median),
                );
            }
            let (Some(start), Some(floor)) = (&f.sandbox_start, &f.start_floor) else {
                continue;
            };
            let _ = writeln!(
                s,
                "The {} tier's sandbox start is {:.2}x the floor timed just before each of its \
                 cold starts ({} ms median beside {} ms).",
                t.tier,
                start.median.as_secs_f64() / floor.median.as_secs_f64().max(1e-9),
                fmt_ms(start.median),
                fmt_ms(floor.median),
            );
        }
        let _ = writeln!(s, "\n| canary or check | {} |", head.join(" | "));
        let _ = writeln!(s, "|---|{}", "---|".repeat(ran.len()));
        let figures: Vec<&Figures> = ran.iter().filter_map(|t| t.figures.as_ref()).collect();
        let mut names: Vec<&str> = Vec::new();
        for v in figures.iter().flat_map(|f| f.verdicts()) {
            if !names.contains(&v.name.as_str()) {
                names.push(&v.name);
            }
        }
        for n in &names {
            let cells: Vec<String> = figures
                .iter()
                .map(|f| {
                    f.verdicts().find(|v| v.name == *n).map_or("-".into(), |v| {
                        format!(
                            "{} {}",
                            if v.held { "held:" } else { "**FAILED**:" },
                            v.detail.replace('|', "\\|")
                        )
                    })
                })
                .collect();
            let _ = writeln!(s, "| {n} | {} |", cells.join(" | "));
        }
    }
    let _ = writeln!(
        s,
        "\n{}",
        if r.ok {
            "Every canary and check held."
        } else {
            "**Something did not hold** (above)."
        }
    );
    s
}

fn ratio(o: &Option<(Spread, Spread)>) -> String {
    o.as_ref().map_or("-".into(), |(inside, outside)| {
        let x = inside.median.as_secs_f64() / outside.median.as_secs_f64().max(1e-6);
        format!(
            "{} / {} ({x:.2}x)",
            fmt_ms(inside.median),
            fmt_ms(outside.median)
        )
    })
}

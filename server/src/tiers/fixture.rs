//! The fixture, run through one tier: every figure and every check of `coderoom bench tiers`,
//! taken from outside the server as its clients and its host see it.

use super::canaries::{self, Verdict};
use super::host::{self, Proc};
use super::server::Server;
use super::{Figures, Runs, Spread};
use anyhow::{anyhow, bail, Context as _};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// The small project every room of the fixture starts from.
const PROJECT: &[(&str, &str)] = &[
    ("project/README.md", "# tiers fixture\n\nA small project.\n"),
    (
        "project/main.sh",
        "#!/bin/sh\nfor i in 1 2 3; do echo \"step $i\"; done\n",
    ),
    ("project/data.csv", "id,name\n1,one\n2,two\n3,three\n"),
    ("project/src/lib.txt", "library text\n"),
];

/// The CPU-bound step: a shell loop, the same on the host and in the sandbox.
const CPU_STEP: &str = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done";

/// The file-bound step in `$1`: 300 small files written, read back and removed.
const FILE_STEP: &str = "d=$1/.tiers-files; mkdir -p $d; i=0; \
     while [ $i -lt 300 ]; do echo \"line $i\" > $d/f$i; i=$((i+1)); done; \
     cat $d/* > /dev/null; rm -rf $d";

/// The limits the fixture's servers give each sandbox (small, so that the memory canary and
/// twenty rooms at once stay light on any host).
pub(super) const MEMORY_MB: u64 = 256;
pub(super) const PIDS: u64 = 64;

/// Runs the fixture on servers started with `args` (the tier's own flags) in `dir`.
/// `remote`: the sandboxes run on a sandbox host, not under the fixture's servers (what the
/// host sees of them is not measured here).
pub(super) async fn run(
    dir: &Path,
    args: &[String],
    runs: &Runs,
    remote: bool,
) -> anyhow::Result<Figures> {
    let mut f = Figures::default();
    let mut base = args.to_vec();
    base.extend(
        [
            "--sandbox-memory-mb",
            &MEMORY_MB.to_string(),
            "--sandbox-pids",
            &PIDS.to_string(),
            "--sandbox-warm-pool",
            "0",
        ]
        .map(str::to_owned),
    );
    let mut server = Server::start(&dir.join("cold"), base.clone()).await?;
    let outcome = on_server(&mut server, runs, remote, &mut f).await;
    let left = match &outcome {
        Ok(()) => stop_leaves(server).await,
        Err(_) => {
            server.stop().await;
            Ok(0)
        }
    };
    outcome?;
    f.checks.push(Verdict::new(
        "clean stop",
        left.as_ref().is_ok_and(|n| *n == 0),
        match left {
            Ok(0) => "SIGTERM: no sandbox process left".to_owned(),
            Ok(n) => format!("SIGTERM: {n} sandbox process(es) still running after 10 s"),
            Err(e) => format!("{e:#}"),
        },
    ));

    // The warm pool: a server that keeps one sandbox started ahead of need.
    let mut pooled = base;
    if let Some(i) = pooled.iter().position(|a| a == "--sandbox-warm-pool") {
        pooled[i + 1] = "1".into();
    }
    let server = Server::start(&dir.join("warm"), pooled).await?;
    let outcome = warm_pool(&server, runs).await;
    server.stop().await;
    let (first, running) = outcome?;
    f.warm_first_command = Some(first);
    f.warm_running_command = Some(running);
    Ok(f)
}

async fn on_server(
    server: &mut Server,
    runs: &Runs,
    remote: bool,
    f: &mut Figures,
) -> anyhow::Result<()> {
    let pid = server
        .pid()
        .ok_or_else(|| anyhow!("the server has no pid"))?;
    // The project room: cold start, then commands in a running room.
    let project = server.room("tiers project").await?;
    for (path, content) in PROJECT {
        server.put_file(&project, path, content).await?;
    }
    // Plain bwrap's start is timed just before each cold start, so both see the host as it
    // is at that moment (its load, its caches, the kernel's cgroup lock warm or cold).
    let floors_dir = server.data_dir.join("floor");
    std::fs::create_dir_all(&floors_dir)?;
    let floor = || {
        let dir = floors_dir.clone();
        async move {
            let timed = tokio::task::spawn_blocking(move || host::bwrap_floor(&dir))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r);
            // Without a floor the run goes on; the reason is said.
            timed
                .map_err(|e| eprintln!("tiers: plain bwrap (the floor) did not run: {e:#}"))
                .ok()
        }
    };
    let mut floors: Vec<Duration> = floor().await.into_iter().collect();
    let (_, first) = server.exec(&project, "true").await?;
    let mut cold = vec![first];
    let mut starts: Vec<Duration> = start_of(server, &project).await?.into_iter().collect();
    for i in 1..runs.cold {
        let room = server.room(&format!("tiers cold {i}")).await?;
        floors.extend(floor().await);
        let (e, took) = server.exec(&room, "true").await?;
        e.ok()?;
        cold.push(took);
        starts.extend(start_of(server, &room).await?);
        stop_sandbox(server, &room).await?;
    }
    f.cold_first_command = Some(Spread::of(cold));
    f.sandbox_start = (!starts.is_empty()).then(|| Spread::of(starts));
    f.start_floor = (!floors.is_empty()).then(|| Spread::of(floors));
    let mut running = Vec::new();
    for _ in 0..runs.repeat {
        let (e, took) = server.exec(&project, "true").await?;
        e.ok()?;
        running.push(took);
    }
    let running = Spread::of(running);
    let floor = running.median;
    f.running_command = Some(running);

    // The steps, in the sandbox and on the host.
    let host_dir = server.data_dir.join("host-steps");
    std::fs::create_dir_all(&host_dir)?;
    let (mut cpu_in, mut cpu_out, mut file_in, mut file_out) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs.steps {
        let (e, took) = server.exec(&project, CPU_STEP).await?;
        e.ok().context("the CPU step in the sandbox")?;
        cpu_in.push(took.saturating_sub(floor));
        cpu_out.push(host::time_on_host(&["sh", "-c", CPU_STEP], &host_dir)?);
        let (e, took) = server
            .exec_argv(&project, &["sh", "-c", FILE_STEP, "step", "/tmp"])
            .await?;
        e.ok().context("the file step in the sandbox")?;
        file_in.push(took.saturating_sub(floor));
        let d = host_dir.to_string_lossy().into_owned();
        file_out.push(host::time_on_host(
            &["sh", "-c", FILE_STEP, "step", &d],
            &host_dir,
        )?);
    }
    f.cpu_step = Some((Spread::of(cpu_in), Spread::of(cpu_out)));
    f.file_step = Some((Spread::of(file_in), Spread::of(file_out)));

    // The canaries, in a room of their own, with a secret, beside the project room.
    let other = format!("tiers-other-{}.txt", hex::encode(rand::random::<[u8; 8]>()));
    server
        .put_file(&project, &other, "another room's file\n")
        .await?;
    let canary_room = server.room("tiers canaries").await?;
    let secret = hex::encode(rand::random::<[u8; 24]>());
    server
        .json(
            "POST",
            &format!("/api/rooms/{canary_room}/secrets"),
            json!({"name": "TIERS_CANARY", "value": secret, "hosts": ["api.example.com"],
                   "header": "Authorization", "format": "Bearer {}"}),
            201,
        )
        .await?;
    let port: u16 = server
        .addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow!("no port in {}", server.addr))?;
    let input = canaries::input(
        &server.data_dir.to_string_lossy(),
        port,
        &other,
        MEMORY_MB << 20,
        PIDS,
        &host::host_addresses(),
    );
    server
        .put_file(&canary_room, canaries::INPUT, &input)
        .await?;
    // Everything allowed out, address literals one by one: what stops loopback, the metadata
    // address and the host's own addresses is then the proxy's refusal, not the default deny.
    let mut allow = vec![
        "*".to_owned(),
        "127.0.0.1".to_owned(),
        format!("127.0.0.1:{port}"),
        "169.254.169.254".to_owned(),
    ];
    allow.extend(
        host::host_addresses()
            .into_iter()
            .filter(|a| a.contains('.'))
            .flat_map(|a| [a.clone(), format!("{a}:{port}")]),
    );
    server
        .json(
            "PUT",
            &format!("/api/rooms/{canary_room}/egress"),
            json!({ "allow": allow }),
            200,
        )
        .await
        .context("opening the canary room's egress allowlist")?;
    let (e, _) = server
        .exec_within(
            &canary_room,
            &["sh", "-c", canaries::SCRIPT],
            canaries::TIMEOUT_MS,
        )
        .await?;
    let mut verdicts = canaries::verdicts(&e.stdout);
    if verdicts.iter().any(|v| !v.held) && !e.stderr.is_empty() {
        tracing::debug!(stderr = %e.stderr, "canary script");
    }
    let (dump, _) = server.exec(&canary_room, canaries::DUMP).await?;
    let found = dump.stdout.contains(&secret) || dump.stderr.contains(&secret);
    verdicts.push(Verdict::new(
        "secret",
        !found,
        if found {
            "the room secret's value is readable inside the sandbox".to_owned()
        } else {
            format!(
                "the room secret's value is in no environment, command line or small file ({} bytes read)",
                dump.stdout.len()
            )
        },
    ));
    // After the fork bomb and the memory hog, the sandbox still answers.
    let after = server.exec(&canary_room, "echo alive").await;
    let alive = after
        .as_ref()
        .is_ok_and(|(e, _)| e.code == 0 && e.stdout.trim() == "alive");
    verdicts.push(Verdict::new(
        "survives",
        alive,
        if alive {
            "the sandbox answers after the fork bomb and the memory hog".to_owned()
        } else {
            format!(
                "the sandbox did not answer after them: {}",
                match after {
                    Ok((e, _)) => format!("exit {} {}", e.code, e.stderr.trim()),
                    Err(e) => format!("{e:#}"),
                }
            )
        },
    ));
    f.canaries = verdicts;

    // Resume from a snapshot: the project room stopped (its workspace snapshotted), then its
    // next command.
    let mut resumed = Vec::new();
    for _ in 0..runs.resume {
        stop_sandbox(server, &project).await?;
        let (e, took) = server.exec(&project, "cat project/README.md").await?;
        if e.code != 0 || e.stdout != PROJECT[0].1 {
            bail!(
                "resumed from a snapshot, the project's README reads {:?}",
                e.stdout
            );
        }
        resumed.push(took);
    }
    f.resume_first_command = Some(Spread::of(resumed));

    // A fork of a checkpoint: its first command.
    let mut forked = Vec::new();
    let mut forks = Vec::new();
    let cp = server
        .json(
            "POST",
            &format!("/api/rooms/{project}/checkpoints"),
            json!({"name": "tiers"}),
            201,
        )
        .await?;
    let cid = cp["id"].as_str().unwrap_or_default().to_owned();
    for _ in 0..runs.resume {
        let fork = server
            .json(
                "POST",
                &format!("/api/rooms/{project}/fork"),
                json!({"checkpoint": cid}),
                201,
            )
            .await?;
        let room = fork["id"].as_str().unwrap_or_default().to_owned();
        let (e, took) = server.exec(&room, "cat project/README.md").await?;
        if e.code != 0 || e.stdout != PROJECT[0].1 {
            bail!(
                "in a fork of a checkpoint, the project's README reads {:?}",
                e.stdout
            );
        }
        forked.push(took);
        forks.push(room);
    }
    f.fork_first_command = Some(Spread::of(forked));

    // Rooms created at once: each one's first command, all asked together.
    let mut rooms = Vec::new();
    for i in 0..runs.burst {
        rooms.push(server.room(&format!("tiers burst {i}")).await?);
    }
    let s: &Server = server;
    let answers = futures_util::future::join_all(rooms.iter().map(|r| async move {
        let started = Instant::now();
        let ok = s.exec(r, "true").await.is_ok_and(|(e, _)| e.code == 0);
        (ok, started.elapsed())
    }))
    .await;
    let failures = answers.iter().filter(|(ok, _)| !ok).count();
    f.burst = Some((
        runs.burst,
        Spread::of(
            answers
                .iter()
                .filter(|(ok, _)| *ok)
                .map(|(_, d)| *d)
                .collect(),
        ),
        failures,
    ));

    // What an idle sandbox costs the host: every sandbox of the server, a moment after its
    // last command.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let boxes = host::sandboxes(pid);
    let costs: Vec<(u64, u64)> = boxes
        .iter()
        .map(|procs| {
            procs
                .iter()
                .map(|p| host::pss_and_private(*p))
                .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
        })
        .collect();
    let mut pss: Vec<u64> = costs.iter().map(|c| c.0).collect();
    let mut private: Vec<u64> = costs.iter().map(|c| c.1).collect();
    private.sort_unstable();
    let mut charged: Vec<u64> = boxes
        .iter()
        .filter_map(|p| host::cgroup_memory(p, pid))
        .collect();
    pss.sort_unstable();
    charged.sort_unstable();
    f.idle_memory = Some(super::Memory {
        sandboxes: boxes.len(),
        pss_median: pss.get(pss.len() / 2).copied(),
        private_median: private.get(private.len() / 2).copied(),
        cgroup_median: charged.get(charged.len() / 2).copied(),
    });

    // Deletion of a fork whose sandbox runs: the receipt, and nothing of it left on disk or
    // in the cgroup tree.
    let victim = forks
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("no fork to delete"))?;
    f.checks.push(delete(server, pid, &victim, remote).await?);

    // kill -9 of the server with rooms running a detached process each: none left orphaned,
    // every room back with its files.
    f.checks.extend(kill9(server, runs, remote).await?);
    Ok(())
}

/// Waits up to `within` for `done` to hold.
async fn until(within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline && !done() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long the room's running sandbox took to start, by its receipt (`start`: from asking the
/// tier to the agent's first answer; the namespace tier says it).
async fn start_of(server: &Server, room: &str) -> anyhow::Result<Option<Duration>> {
    let a = server
        .call("GET", &format!("/api/rooms/{room}/sandbox"), None)
        .await?;
    if a.status != 200 {
        bail!("GET {room}'s sandbox: {} {}", a.status, a.text());
    }
    let start = &a.json()["receipt"]["start"];
    let us = ["prepare_us", "spawn_us", "agent_us"]
        .iter()
        .map(|k| start[k].as_u64())
        .sum::<Option<u64>>();
    Ok(us.map(Duration::from_micros))
}

/// Stops a room's sandbox (snapshotting its workspace).
async fn stop_sandbox(server: &Server, room: &str) -> anyhow::Result<()> {
    let a = server
        .call("POST", &format!("/api/rooms/{room}/sandbox/stop"), None)
        .await?;
    if !(200..300).contains(&a.status) {
        bail!("stopping {room}'s sandbox: {}", a.status);
    }
    Ok(())
}

/// The sandbox of `room` among the server's, by its cgroup (named after the room), with the
/// cgroup directories it is in.
fn sandbox_of(pid: u32, room: &str) -> Option<(Vec<Proc>, Vec<std::path::PathBuf>)> {
    host::sandboxes(pid).into_iter().find_map(|procs| {
        let dirs = procs
            .first()
            .map(|p| host::cgroups_of(*p))
            .unwrap_or_default();
        dirs.iter()
            .any(|d| d.to_string_lossy().contains(room))
            .then_some((procs, dirs))
    })
}

async fn delete(server: &Server, pid: u32, room: &str, remote: bool) -> anyhow::Result<Verdict> {
    let before = sandbox_of(pid, room);
    let asked = server
        .json("DELETE", &format!("/api/rooms/{room}"), json!({}), 202)
        .await?;
    let id = asked["deletion_id"].as_str().unwrap_or_default().to_owned();
    let done = server
        .json(
            "POST",
            &format!("/api/deletions/{id}/confirm"),
            json!({}),
            200,
        )
        .await?;
    let receipt = &done["receipt"];
    let artifacts = receipt["artifacts"].as_array().cloned().unwrap_or_default();
    let mut problems = Vec::new();
    if receipt["complete"] != json!(true) {
        problems.push(format!("the receipt is not complete: {receipt}"));
    }
    for a in &artifacts {
        let status = a["status"].as_str().unwrap_or("");
        if !matches!(status, "destroyed" | "none" | "unloaded") {
            problems.push(format!("{} is {status:?}", a["artifact"]));
        }
    }
    // Nothing named after the room under the data directory.
    let mut left = Vec::new();
    find_named(&server.data_dir, room, &mut left, 0);
    problems.extend(
        left.iter()
            .map(|p| format!("{} is still on disk", p.display())),
    );
    // Its sandbox's processes and cgroups are gone (within 10 s).
    if before.is_none() && !remote {
        problems.push("its sandbox was not found under the server before the deletion".into());
    }
    if let Some((procs, dirs)) = before {
        until(Duration::from_secs(10), || {
            !procs.iter().any(|p| host::alive(*p)) && !dirs.iter().any(|d| d.exists())
        })
        .await;
        if procs.iter().any(|p| host::alive(*p)) {
            problems.push("its sandbox's processes still run".into());
        }
        problems.extend(
            dirs.iter()
                .filter(|d| d.exists())
                .map(|d| format!("cgroup {} is still there", d.display())),
        );
    }
    let names: Vec<String> = artifacts
        .iter()
        .map(|a| {
            format!(
                "{} {}",
                a["artifact"].as_str().unwrap_or("?"),
                a["status"].as_str().unwrap_or("?")
            )
        })
        .collect();
    Ok(Verdict::new(
        "deletion",
        problems.is_empty(),
        if problems.is_empty() {
            format!(
                "receipt lists {} artifacts ({}); nothing of the room left on disk or in cgroups",
                artifacts.len(),
                names.join(", ")
            )
        } else {
            problems.join("; ")
        },
    ))
}

fn find_named(dir: &Path, needle: &str, out: &mut Vec<std::path::PathBuf>, depth: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_name().to_string_lossy().contains(needle) {
            out.push(p.clone());
        }
        if depth < 12 && e.file_type().is_ok_and(|t| t.is_dir()) {
            find_named(&p, needle, out, depth + 1);
        }
    }
}

async fn kill9(server: &mut Server, runs: &Runs, remote: bool) -> anyhow::Result<Vec<Verdict>> {
    let pid = server
        .pid()
        .ok_or_else(|| anyhow!("the server has no pid"))?;
    let mut rooms = Vec::new();
    for i in 0..runs.kill9 {
        let room = server.room(&format!("tiers kill9 {i}")).await?;
        server
            .put_file(&room, "kept.txt", &format!("room {i}\n"))
            .await?;
        // A process that outlives its command, as a dev server would.
        server
            .exec(&room, "setsid sleep 600 </dev/null >/dev/null 2>&1 &")
            .await?
            .0
            .ok()?;
        rooms.push(room);
    }
    let before: Vec<Proc> = host::sandboxes(pid).into_iter().flatten().collect();
    server.kill9_and_restart().await?;
    until(Duration::from_secs(15), || {
        !before.iter().any(|p| host::alive(*p))
    })
    .await;
    let orphans: Vec<u32> = before
        .iter()
        .filter(|p| host::alive(**p))
        .map(|p| p.pid)
        .collect();
    let mut back = 0;
    let mut problems = Vec::new();
    for (i, room) in rooms.iter().enumerate() {
        match server.exec(room, "cat kept.txt").await {
            Ok((e, _)) if e.code == 0 && e.stdout == format!("room {i}\n") => back += 1,
            Ok((e, _)) => problems.push(format!(
                "room {i}: exit {} {:?} {}",
                e.code,
                e.stdout,
                e.stderr.trim()
            )),
            Err(e) => problems.push(format!("room {i}: {e:#}")),
        }
    }
    Ok(vec![
        Verdict::new(
            "kill -9: no orphan",
            orphans.is_empty() && (remote || !before.is_empty()),
            if before.is_empty() && !remote {
                "no sandbox process found under the server before the kill".to_owned()
            } else if before.is_empty() {
                "no sandbox runs under this server (they run on a sandbox host, which keeps \
                 them through its attach grace): see rooms back"
                    .to_owned()
            } else if orphans.is_empty() {
                format!(
                    "all {} sandbox processes of the server (its {} rooms' among them) gone with it",
                    before.len(),
                    rooms.len()
                )
            } else {
                format!("still running after 15 s: {orphans:?}")
            },
        ),
        Verdict::new(
            "kill -9: rooms back",
            back == rooms.len(),
            if problems.is_empty() {
                format!(
                    "{back}/{} rooms answer after the restart, their files intact",
                    rooms.len()
                )
            } else {
                problems.join("; ")
            },
        ),
    ])
}

/// Stops the server with SIGTERM; how many of its sandboxes' processes are left 10 s on.
async fn stop_leaves(server: Server) -> anyhow::Result<usize> {
    let pid = server
        .pid()
        .ok_or_else(|| anyhow!("the server has no pid"))?;
    let before: Vec<Proc> = host::sandboxes(pid).into_iter().flatten().collect();
    server.stop().await;
    until(Duration::from_secs(10), || {
        !before.iter().any(|p| host::alive(*p))
    })
    .await;
    Ok(before.iter().filter(|p| host::alive(**p)).count())
}

/// A new room's first command on a server with a warm pool, waiting each time for the pool;
/// and, paired with each, the same command in a room of that server that has run for a while,
/// timed just before it (the host as it is at that moment, as the start's floor is).
async fn warm_pool(server: &Server, runs: &Runs) -> anyhow::Result<(Spread, Spread)> {
    let mut firsts = Vec::new();
    let mut runnings = Vec::new();
    let steady = server.room("tiers warm, running").await?;
    for _ in 0..3 {
        server.exec(&steady, "true").await?.0.ok()?;
    }
    for i in 0..runs.cold {
        pool_ready(server).await?;
        let (e, took) = server.exec(&steady, "true").await?;
        e.ok()?;
        runnings.push(took);
        let room = server.room(&format!("tiers warm {i}")).await?;
        let (e, took) = server.exec(&room, "true").await?;
        e.ok()?;
        firsts.push(took);
        stop_sandbox(server, &room).await?;
    }
    Ok((Spread::of(firsts), Spread::of(runnings)))
}

/// Waits until the warm pool holds a sandbox (it starts one 250 ms after one is taken).
async fn pool_ready(server: &Server) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let m = server.metrics().await?;
        if m.lines().any(|l| l == "coderoom_sandbox_pool_ready 1") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the warm pool held no sandbox within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! Benchmark (ignored by default): sandbox cold start to ready, beside plain bubblewrap and
//! unshare starting a shell, in the same run. Reproduce with
//! `cargo test --release -p coderoom-sandbox --test bench_cold_start -- --ignored --nocapture`.
#![allow(clippy::unwrap_used)]

use coderoom_sandbox::{AgentCommand, Backend, Limits};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

const RUNS: usize = 30;

fn summary(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "| {name} | {:.1} | {:.1} | {:.1} |",
        ms(v[v.len() / 2]),
        ms(v[v.len() * 9 / 10]),
        ms(v[v.len() - 1])
    );
}

fn run_floor(args: &[&str]) -> Duration {
    let started = Instant::now();
    let mut cmd = std::process::Command::new(args[0]);
    cmd.args(&args[1..]);
    if rustix::process::geteuid().is_root() {
        cmd.uid(65534).gid(65534);
    }
    let status = cmd.status().unwrap();
    assert!(status.success(), "{args:?}");
    started.elapsed()
}

#[tokio::test]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn cold_start() {
    let agent = AgentCommand {
        exe: env!("CARGO_BIN_EXE_coderoom-agent").into(),
        args: vec![],
    };
    let (Backend::Namespace(ns), _) = Backend::namespace(agent, None) else {
        panic!("the namespace tier is needed");
    };
    let bwrap = coderoom_sandbox::namespace::bwrap_floor(&["/bin/sh", "-c", "true"]);
    let bwrap: Vec<&str> = bwrap.iter().map(String::as_str).collect();
    let unshare = ["unshare", "-Urpfn", "--mount-proc", "/bin/sh", "-c", "true"];
    // Interleaved, one of each per round: the host's drift (a busy neighbour, the page cache)
    // falls on all three alike.
    let (mut ours, mut stages, mut floor_bwrap, mut floor_unshare) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..RUNS {
        let started = Instant::now();
        let (sb, _ev, receipt) = ns
            .start(&format!("bench{i}"), &Limits::default())
            .await
            .unwrap();
        ours.push(started.elapsed());
        stages.push(
            receipt
                .start
                .expect("a namespace receipt has its start's times"),
        );
        sb.kill();
        sb.ended().await;
        floor_bwrap.push(run_floor(&bwrap));
        floor_unshare.push(run_floor(&unshare));
    }
    // Milliseconds.
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2] as f64 / 1000.0
    };
    let micros = |v: &[Duration]| v.iter().map(|d| d.as_micros() as u64).collect();
    let ratio = median(micros(&ours)) / median(micros(&floor_bwrap));
    println!("| start to ready ({RUNS} runs) | median ms | p90 ms | max ms |");
    println!("|---|---|---|---|");
    summary(
        "coderoom namespace sandbox (cgroups, seccomp, agent answers hello)",
        ours,
    );
    summary(
        "plain `bwrap` of a shell, same namespaces and base mounts",
        floor_bwrap,
    );
    summary(
        "plain `unshare -Urpfn --mount-proc` of a shell",
        floor_unshare,
    );
    println!();
    println!("Coderoom's start over plain `bwrap`'s, medians: {ratio:.2}x");
    println!(
        "Where Coderoom's start went (medians, from its receipts): before bwrap (cgroups, /etc \
         planned, user namespace) {:.2} ms; spawning bwrap {:.2} ms; bwrap's exec to the agent's \
         first answer {:.2} ms",
        median(stages.iter().map(|s| s.prepare_us).collect()),
        median(stages.iter().map(|s| s.spawn_us).collect()),
        median(stages.iter().map(|s| s.agent_us).collect()),
    );
}

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
    let mut ours = Vec::new();
    for i in 0..RUNS {
        let started = Instant::now();
        let (sb, _ev, _) = ns
            .start(&format!("bench{i}"), &Limits::default())
            .await
            .unwrap();
        ours.push(started.elapsed());
        sb.kill();
        sb.ended().await;
    }
    let bwrap = coderoom_sandbox::namespace::bwrap_floor(&["/bin/sh", "-c", "true"]);
    let bwrap: Vec<&str> = bwrap.iter().map(String::as_str).collect();
    let floor_bwrap: Vec<Duration> = (0..RUNS).map(|_| run_floor(&bwrap)).collect();
    let unshare = ["unshare", "-Urpfn", "--mount-proc", "/bin/sh", "-c", "true"];
    let floor_unshare: Vec<Duration> = (0..RUNS).map(|_| run_floor(&unshare)).collect();
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
}

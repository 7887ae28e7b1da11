//! Time to a ready sandbox (issue 20): started is not ready. A room whose readiness step
//! installs dependencies (writes `BENCH_DEP_FILES` files of 10 KB under `node_modules/`, which
//! the file sync does not mirror) is started cold (an empty workspace: the step runs), resumed
//! from its own snapshot (the step is skipped), and forked from a checkpoint taken once it was
//! ready (the fork's first start restores the archive and skips the step). Side by side, a room
//! with no readiness step started cold: the floor. Each is timed from the start request to the
//! status saying ready (polled every 5 ms), `BENCH_ROUNDS` times; prints medians and maxima as
//! JSON.
//!
//! `cargo test --release -p coderoom-server --test bench_ready -- --ignored --nocapture`
//! Figures: `docs/benchmarks.md`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Starts the room's sandbox and waits until it is ready (or just running, for a room with no
/// readiness step). Returns the seconds it took and whether the step was skipped.
async fn start_until_ready(server: &Server, token: &str, room: &str) -> (f64, bool) {
    let has_step =
        !get_json(server, token, &format!("/api/rooms/{room}")).await["readiness"].is_null();
    let t0 = Instant::now();
    let (status, body) = post(
        server,
        token,
        &format!("/api/rooms/{room}/sandbox/start"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    loop {
        let s = get_json(server, token, &format!("/api/rooms/{room}/sandbox")).await;
        let r = &s["readiness"];
        if !has_step && s["state"] == "running" {
            return (t0.elapsed().as_secs_f64(), false);
        }
        match r["state"].as_str() {
            Some("ready") => return (t0.elapsed().as_secs_f64(), r["skipped"] == true),
            Some("failed") => panic!("the readiness step failed: {r}"),
            _ => {}
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "never ready: {s}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn stop(server: &Server, token: &str, room: &str) {
    let (status, body) = post(
        server,
        token,
        &format!("/api/rooms/{room}/sandbox/stop"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

fn summary(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let ms = |s: f64| (s * 1000.0).round();
    serde_json::json!({
        "median_ms": ms(v[v.len() / 2]),
        "max_ms": ms(*v.last().unwrap()),
        "runs": v.len(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand (see the module docs)"]
async fn time_to_a_ready_sandbox() {
    let rounds = knob("BENCH_ROUNDS", 5);
    let files = knob("BENCH_DEP_FILES", 2000);
    let storage = Storage::new(&Backend::Sqlite).await;
    let token = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &[]).await;
    let step = format!(
        "mkdir -p node_modules && i=0; while [ $i -lt {files} ]; do \
         head -c 10000 /dev/urandom > node_modules/dep$i; i=$((i+1)); done"
    );
    let body = serde_json::json!({ "command": step }).to_string();

    let (mut bare, mut cold, mut resumed, mut forked) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        // The floor: no readiness step.
        let room = create_room(&server, &token).await;
        let (s, _) = start_until_ready(&server, &token, &room).await;
        bare.push(s);
        stop(&server, &token, &room).await;

        // Cold, with the step.
        let room = create_room(&server, &token).await;
        let (status, _) = http(
            &server.url(&format!("/api/rooms/{room}/readiness")),
            "PUT",
            Some(&token),
            Some(&body),
        )
        .await;
        assert_eq!(status, 200);
        let (s, skipped) = start_until_ready(&server, &token, &room).await;
        assert!(!skipped);
        cold.push(s);
        // A checkpoint of the ready workspace, then the room resumes from its own snapshot.
        let (status, cp) = post(
            &server,
            &token,
            &format!("/api/rooms/{room}/checkpoints"),
            r#"{"name":"ready"}"#,
        )
        .await;
        assert_eq!(status, 201, "{cp}");
        stop(&server, &token, &room).await;
        let (s, skipped) = start_until_ready(&server, &token, &room).await;
        assert!(skipped);
        resumed.push(s);
        stop(&server, &token, &room).await;
        // A fork of the checkpoint: its first start.
        let fork = format!(r#"{{"checkpoint":"{}"}}"#, cp["id"].as_str().unwrap());
        let (status, f) = post(&server, &token, &format!("/api/rooms/{room}/fork"), &fork).await;
        assert_eq!(status, 201, "{f}");
        let new = f["id"].as_str().unwrap().to_owned();
        let (s, skipped) = start_until_ready(&server, &token, &new).await;
        assert!(skipped);
        forked.push(s);
        let (_, out) = exec(&server, &token, &new, "ls node_modules | wc -l").await;
        assert_eq!(out["stdout"].as_str().unwrap().trim(), files.to_string());
        stop(&server, &token, &new).await;
    }
    // The same two starts with a warm pool of one: the sandbox is started ahead of need.
    let server = Server::start(&storage, &["--sandbox-warm-pool", "1"]).await;
    let pool_ready = |server: &Server| {
        let url = server.url("/metrics");
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let m = http(&url, "GET", None, None).await.1;
                if m.lines().any(|l| l == "coderoom_sandbox_pool_ready 1") {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the warm pool was not ready within 60 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let ready_room = create_room(&server, &token).await;
    let (status, _) = http(
        &server.url(&format!("/api/rooms/{ready_room}/readiness")),
        "PUT",
        Some(&token),
        Some(&body),
    )
    .await;
    assert_eq!(status, 200);
    start_until_ready(&server, &token, &ready_room).await;
    let (status, cp) = post(
        &server,
        &token,
        &format!("/api/rooms/{ready_room}/checkpoints"),
        r#"{"name":"ready"}"#,
    )
    .await;
    assert_eq!(status, 201, "{cp}");
    let (mut pooled_bare, mut pooled_fork) = (vec![], vec![]);
    for _ in 0..rounds {
        pool_ready(&server).await;
        let room = create_room(&server, &token).await;
        let (s, _) = start_until_ready(&server, &token, &room).await;
        pooled_bare.push(s);
        stop(&server, &token, &room).await;
        pool_ready(&server).await;
        let fork = format!(r#"{{"checkpoint":"{}"}}"#, cp["id"].as_str().unwrap());
        let (status, f) = post(
            &server,
            &token,
            &format!("/api/rooms/{ready_room}/fork"),
            &fork,
        )
        .await;
        assert_eq!(status, 201, "{f}");
        let new = f["id"].as_str().unwrap().to_owned();
        let (s, skipped) = start_until_ready(&server, &token, &new).await;
        assert!(skipped);
        pooled_fork.push(s);
        stop(&server, &token, &new).await;
    }
    let report = serde_json::json!({
        "warm_pool_no_readiness_step": summary(pooled_bare),
        "warm_pool_fork_of_a_ready_checkpoint": summary(pooled_fork),
        "tier": get_json(&server, &token, &format!("/api/rooms/{}/sandbox", create_room(&server, &token).await)).await["tier"],
        "dependency_files": files,
        "no_readiness_step_cold": summary(bare),
        "cold_with_step": summary(cold),
        "resumed_from_own_snapshot": summary(resumed),
        "fork_of_a_ready_checkpoint": summary(forked),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

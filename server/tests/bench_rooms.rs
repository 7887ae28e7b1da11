//! Edit-to-peer latency with many rooms busy at once, every update durable before any peer
//! sees it: K rooms, each with one writer and R readers (yrs clients), the writer paced at N
//! updates a second. Each update appends a numbered token to the text; a reader that applies it
//! reads the newest token and records, for every number it had not seen, the time since its
//! writer sent it. Prints per-room p50/p99 and their spread over rooms as JSON.
//!
//! `cargo test --release -p coderoom-server --test bench_rooms -- --ignored --nocapture`
//! (`BENCH_ROOMS`, `BENCH_READERS`, `BENCH_RATE`, `BENCH_SECS` change the shape; defaults 40,
//! 4, 50, 10: the "40 rooms x 5 connections x 50 updates/s"). Figures and how they
//! compare: `docs/benchmarks.md`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use yrs::{GetString, Transact};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The newest token's number in `text` ("…|00000042|").
fn newest(text: &str) -> Option<usize> {
    let t = text.strip_suffix('|')?;
    t.rsplit('|').next()?.parse().ok()
}

/// Alternates group commit across rooms (the default) with one transaction per room's batch
/// (`CODEROOM_MAX_COMMIT_GROUP=1`), twice each, in one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
async fn many_rooms_paced() {
    for round in 0..2 {
        for group in ["1", "256"] {
            let report = run(group).await;
            println!(
                "{}",
                serde_json::json!({ "round": round, "max_commit_group": group, "report": report })
            );
        }
    }
}

async fn run(group: &str) -> serde_json::Value {
    let (rooms, readers, rate, secs) = (
        knob("BENCH_ROOMS", 40),
        knob("BENCH_READERS", 4),
        knob("BENCH_RATE", 50),
        knob("BENCH_SECS", 10),
    );
    let total = rate * secs;
    let storage = Storage::new(&Backend::Sqlite).await;
    let token = storage.token("ana@example.com").await;
    let server =
        Server::start_with_env(&storage, &[], &[("CODEROOM_MAX_COMMIT_GROUP", group)]).await;
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..rooms {
        let room = create_room(&server, &token).await;
        let mut writer = Client::connect(&server, &room, &token).await;
        writer.synced().await;
        let mut rs = Vec::new();
        for _ in 0..readers {
            let mut r = Client::connect(&server, &room, &token).await;
            r.synced().await;
            rs.push(r);
        }
        clients.push((writer, rs));
    }
    let start = Instant::now() + Duration::from_millis(500);
    let mut all = Vec::new();
    for (mut writer, rs) in clients {
        let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; total]));
        let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
        for mut r in rs {
            let (sent, latencies) = (sent.clone(), latencies.clone());
            tasks.push(tokio::spawn(async move {
                let mut seen = 0usize;
                while seen < total {
                    if let Event::Closed(c) = r.next().await {
                        panic!("a reader was closed ({c:?})");
                    }
                    let now = Instant::now();
                    let Some(n) = newest(&r.content("t")) else {
                        continue;
                    };
                    let sent = sent.lock().unwrap();
                    let mut l = latencies.lock().unwrap();
                    for s in seen..=n {
                        if let Some(at) = sent[s] {
                            l.push(now.duration_since(at).as_secs_f64() * 1000.0);
                        }
                    }
                    seen = n + 1;
                }
            }));
        }
        let s = sent.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..total {
                let at = start + Duration::from_secs_f64(n as f64 / rate as f64);
                tokio::time::sleep_until(at.into()).await;
                let end = {
                    let t = writer.text("t");
                    let txn = writer.doc.transact();
                    t.get_string(&txn).len() as u32
                };
                s.lock().unwrap()[n] = Some(Instant::now());
                writer.insert("t", end, &format!("{n:08}|")).await;
            }
            // Keep the writer's socket open until the readers are done.
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(writer);
        }));
        all.push(latencies);
    }
    // Readers finish when they have every update; writers are cut short after that.
    let deadline = Instant::now() + Duration::from_secs((secs + 60) as u64);
    loop {
        let done = all
            .iter()
            .all(|l| l.lock().unwrap().len() >= total * readers);
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in &tasks {
        t.abort();
    }
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut delivered = 0;
    for l in &all {
        let mut v = l.lock().unwrap().clone();
        delivered += v.len();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        p50s.push(percentile(&v, 0.5));
        p99s.push(percentile(&v, 0.99));
    }
    p50s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    p99s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let report = serde_json::json!({
        "rooms": rooms, "readers_per_room": readers, "updates_per_s_per_room": rate, "secs": secs,
        "delivered": delivered, "expected": total * readers * rooms,
        "room_p50_ms": { "median": percentile(&p50s, 0.5), "worst": p50s.last() },
        "room_p99_ms": { "median": percentile(&p99s, 0.5), "worst": p99s.last() },
    });
    assert_eq!(
        delivered,
        total * readers * rooms,
        "every update reaches every reader"
    );
    drop(server);
    report
}

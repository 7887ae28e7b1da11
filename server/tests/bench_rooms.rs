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
/// (`serve --max-commit-group 1`), twice each, in one run.
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

/// A load: `rooms` rooms, each with one writer and `readers` readers, the writer paced at
/// `rate` updates a second for `secs` seconds.
#[derive(Clone, Copy)]
struct Shape {
    rooms: usize,
    readers: usize,
    rate: usize,
    secs: usize,
}

async fn run(group: &str) -> serde_json::Value {
    let shape = Shape {
        rooms: knob("BENCH_ROOMS", 40),
        readers: knob("BENCH_READERS", 4),
        rate: knob("BENCH_RATE", 50),
        secs: knob("BENCH_SECS", 10),
    };
    let storage = Storage::new(&Backend::Sqlite).await;
    let server = Server::start(&storage, &["--max-commit-group", group]).await;
    let report = load(&storage, &server, shape).await;
    drop(server);
    report
}

/// The load generator's smoke mode, in every test run (and so in `.ci/run`): a few seconds of
/// a small shape, asserting that every update reaches every reader and that every reader ends
/// with the writer's text. Not speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_every_update_reaches_every_reader() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let server = Server::start(&storage, &[]).await;
    let shape = Shape {
        rooms: 4,
        readers: 3,
        rate: 20,
        secs: 2,
    };
    let report = load(&storage, &server, shape).await;
    assert_eq!(report["delivered"], report["expected"], "{report}");
    // Where the time went is in /metrics, stage by stage, for every update that went through.
    for stage in ["decode", "apply", "commit", "broadcast", "queue", "write"] {
        let name = format!("coderoom_doc_stage_seconds_count{{stage=\"{stage}\"}}");
        let count = server.metric(&name).await;
        assert!(count >= 40.0, "{name} = {count}");
    }
}

/// Runs `shape` against `server`: returns the latency report; panics unless every update
/// reached every reader and every reader converged on its writer's text.
async fn load(storage: &Storage, server: &Server, shape: Shape) -> serde_json::Value {
    let Shape {
        rooms,
        readers,
        rate,
        secs,
    } = shape;
    let total = rate * secs;
    let token = storage.token("ana@example.com").await;
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..rooms {
        let room = create_room(server, &token).await;
        let mut writer = Client::connect(server, &room, &token).await;
        writer.synced().await;
        let mut rs = Vec::new();
        for _ in 0..readers {
            let mut r = Client::connect(server, &room, &token).await;
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
        let finals: Arc<Mutex<Vec<String>>> = Arc::default();
        for mut r in rs {
            let (sent, latencies, finals) = (sent.clone(), latencies.clone(), finals.clone());
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
                finals.lock().unwrap().push(r.content("t"));
            }));
        }
        let s = sent.clone();
        let written = finals.clone();
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
            // The text every reader must end with, first in the list.
            written.lock().unwrap().insert(0, writer.content("t"));
            // Keep the writer's socket open until the readers are done.
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(writer);
        }));
        all.push((latencies, finals));
    }
    // Readers finish when they have every update; writers are cut short after that.
    let deadline = Instant::now() + Duration::from_secs((secs + 60) as u64);
    loop {
        let done = all.iter().all(|(l, f)| {
            l.lock().unwrap().len() >= total * readers && f.lock().unwrap().len() > readers
        });
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
    for (l, f) in &all {
        let f = f.lock().unwrap();
        assert!(
            f.len() == readers + 1 && f.iter().all(|t| *t == f[0]),
            "a reader did not converge on its writer's text"
        );
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
    report
}

/// Durable before any peer sees it, under load: the many-rooms benchmark's shape (40 rooms x
/// (1 writer + 4 readers) x 50 updates/s), every room compacting its log every 20 updates (so
/// snapshots land in the log writer's group transactions, and folded rows are being deleted,
/// all through the run) and the WAL starting over every 64 frames (so the writer copies the
/// rest of checkpoints between its groups all through the run too), the server killed with
/// SIGKILL mid-stream; after a restart each room's text holds every update any of its readers
/// had received, in order, with no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_under_paced_load_loses_nothing_a_peer_received() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (rooms, readers, rate) = (40, 4, 50);
    let storage = Storage::new(&Backend::Sqlite).await;
    let token = storage.token("ana@example.com").await;
    let args = ["--compact-every", "20", "--sqlite-wal-restart-frames", "64"];
    let server = Server::start(&storage, &args).await;
    let mut writers = Vec::new();
    let mut reader_tasks = Vec::new();
    let mut seen_by_room = Vec::new();
    for _ in 0..rooms {
        let room = create_room(&server, &token).await;
        let mut writer = Client::connect(&server, &room, &token).await;
        writer.synced().await;
        // The highest token number any reader of this room received (+1; 0: none).
        let seen = Arc::new(AtomicUsize::new(0));
        for _ in 0..readers {
            let mut r = Client::connect(&server, &room, &token).await;
            r.synced().await;
            let seen = seen.clone();
            reader_tasks.push(tokio::spawn(async move {
                while let Event::Y(_) = r.next().await {
                    if let Some(n) = newest(&r.content("t")) {
                        seen.fetch_max(n + 1, Ordering::SeqCst);
                    }
                }
            }));
        }
        writers.push(tokio::spawn(async move {
            for n in 0.. {
                let end = {
                    let t = writer.text("t");
                    let txn = writer.doc.transact();
                    t.get_string(&txn).len() as u32
                };
                writer.insert("t", end, &format!("{n:08}|")).await;
                tokio::time::sleep(Duration::from_secs_f64(1.0 / f64::from(rate))).await;
            }
        }));
        seen_by_room.push((room, seen));
    }
    // Killed once every room's readers have received a good part of the stream, and the WAL
    // has started over at least twice (its header's checkpoint sequence number, bytes 12..16,
    // counts the starts).
    let wal = storage.dir.path().join("coderoom.db-wal");
    let sequence = || {
        use std::io::Read;
        let mut head = [0u8; 16];
        std::fs::File::open(&wal).ok()?.read_exact(&mut head).ok()?;
        Some(u32::from_be_bytes([head[12], head[13], head[14], head[15]]))
    };
    let first = sequence();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen_by_room
        .iter()
        .any(|(_, s)| s.load(Ordering::SeqCst) < 75)
        || sequence()
            .zip(first)
            .is_none_or(|(now, first)| now.wrapping_sub(first) < 2)
    {
        assert!(
            Instant::now() < deadline,
            "the load never got going (WAL sequence {first:?} -> {:?})",
            sequence()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill9().await;
    for w in &writers {
        w.abort();
    }
    // Readers end with their sockets; what they received before is what counts.
    for r in reader_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), r).await;
    }
    let server = Server::start(&storage, &args).await;
    for (room, seen) in &seen_by_room {
        let seen = seen.load(Ordering::SeqCst);
        let mut c = Client::connect(&server, room, &token).await;
        c.synced().await;
        let text = c.content("t");
        let tokens: Vec<usize> = text
            .split('|')
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().unwrap())
            .collect();
        assert!(
            tokens.iter().enumerate().all(|(i, n)| i == *n),
            "room {room}: the text has a gap or is out of order"
        );
        assert!(
            tokens.len() >= seen,
            "room {room}: readers had received {seen} updates, the restarted server holds {}",
            tokens.len()
        );
    }
}

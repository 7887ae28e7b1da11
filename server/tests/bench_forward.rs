//! What forwarding to a room's owner costs (issue 18): two servers on one PostgreSQL, the room
//! owned by the first. One writer on the owner types a marker; two readers receive it, one
//! connected to the owner directly, one through the second server (which forwards the socket
//! byte for byte). Each round times the marker from the writer's send to each reader's receipt,
//! `BENCH_ROUNDS` times; then the time from opening a socket to the end of the sync, direct and
//! forwarded, as many times. Prints medians and 99th percentiles as JSON.
//!
//! `CODEROOM_TEST_POSTGRES_URL=... cargo test --release -p coderoom-server --test bench_forward
//! -- --ignored --nocapture`. Figures: `docs/benchmarks.md`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::time::{Duration, Instant};

fn rounds() -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn summary(mut xs: Vec<f64>) -> serde_json::Value {
    xs.sort_by(f64::total_cmp);
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize] * 1000.0;
    serde_json::json!({ "median_ms": at(0.5), "p99_ms": at(0.99), "n": xs.len() })
}

/// Receives until `c`'s text `t` ends with `marker`; the time it arrived.
async fn until_marker(c: &mut Client, marker: &str) -> Instant {
    loop {
        if c.content("t").ends_with(marker) {
            return Instant::now();
        }
        if let Event::Closed(code) = c.next().await {
            panic!("closed ({code:?})");
        }
    }
}

#[tokio::test]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn forwarding_to_the_owner() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let token = storage.token("bench@example.com").await;
    let owner = Server::start(&storage, &[]).await;
    let other_dir = storage.sharing();
    let other = Server::start(&other_dir, &[]).await;
    let room = create_room(&owner, &token).await;
    let mut writer = Client::connect(&owner, &room, &token).await;
    writer.synced().await;
    let mut direct = Client::connect(&owner, &room, &token).await;
    direct.synced().await;
    let mut forwarded = Client::connect(&other, &room, &token).await;
    forwarded.synced().await;
    assert_eq!(other.metric("coderoom_rooms_loaded").await, 0.0);

    let (mut d, mut f) = (Vec::new(), Vec::new());
    for i in 0..rounds() {
        let marker = format!("<{i}>");
        let at = writer.content("t").chars().count() as u32;
        let sent = Instant::now();
        writer.insert("t", at, &marker).await;
        let (a, b) = tokio::join!(
            until_marker(&mut direct, &marker),
            until_marker(&mut forwarded, &marker)
        );
        d.push((a - sent).as_secs_f64());
        f.push((b - sent).as_secs_f64());
        // The writer hears nothing of its own edits; keep it from falling behind on nothing.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    let (mut dc, mut fc) = (Vec::new(), Vec::new());
    for _ in 0..rounds() / 10 {
        for (server, out) in [(&owner, &mut dc), (&other, &mut fc)] {
            let t0 = Instant::now();
            let mut c = Client::connect(server, &room, &token).await;
            c.synced().await;
            out.push(t0.elapsed().as_secs_f64());
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "edit_to_peer": { "direct": summary(d), "forwarded": summary(f) },
            "connect_and_sync": { "direct": summary(dc), "forwarded": summary(fc) },
        })
    );
    storage.drop_db().await;
}

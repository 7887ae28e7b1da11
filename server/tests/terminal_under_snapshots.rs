//! The terminal while the workspace is snapshotted: every byte of a flood arrives and keys echo
//! as fast as without snapshots. Its own test binary, so no other test shares the machine with
//! it while it times keystrokes (cargo runs test binaries one after another). Needs bubblewrap
//! and root, as the other sandbox tests. Figures: docs/benchmarks.md.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// What one flood-while-typing run measured.
struct FloodRun {
    /// Output bytes of the program (`y`s) the watching viewer received, of 6,000,000.
    ys: usize,
    /// Keystroke-to-echo latencies of the typist, in order.
    echoes: Vec<Duration>,
    /// When a workspace snapshot was last taken, before and after the flood (Unix ms).
    snapshot_at: (Option<i64>, Option<i64>),
}

/// Fills the room's workspace with 300 MB, then runs `yes | head -c 12000000` in the shared
/// terminal while a viewer counts every output byte and a typist sends a key every 20 ms and
/// times its echo (the terminal echoes keys in the middle of the flood).
async fn flood_while_typing(extra: &[&str]) -> FloodRun {
    let storage = Storage::new(&Backend::Sqlite).await;
    // The output bound at 2 MiB/s: both of this test's readers (a debug build, on the same two
    // cores as the server) keep up with it however busy the machine is, so a key's echo waits
    // behind the server's queues, which is what is measured, and not behind this process's
    // own reading (at the default 8 MiB/s the echo's p99 swung between 0.2 and 3.7 s on this
    // machine, and a reader that fell behind was cut off).
    let mut flags = vec![
        "--sandbox-workspace-mb",
        "400",
        "--sandbox-memory-mb",
        "1536",
        "--terminal-output-bytes-per-s",
        "2097152",
    ];
    flags.extend_from_slice(extra);
    let t = team_with(&storage, &flags).await;
    let (server, room) = (&t.server, &t.room);
    let fill = serde_json::json!({
        "argv": ["sh", "-c", "for f in a b c; do head -c 100000000 /dev/urandom > $f.bin || exit 1; done"],
        "timeout_ms": 120000,
    });
    let (status, out) = http(
        &server.url(&format!("/api/rooms/{room}/exec")),
        "POST",
        Some(&t.ben),
        Some(&fill.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert!(out.contains("\"exit_code\":0"), "{out}");
    let mut viewer = terminal_ws(server, room, &t.cy).await;
    let typist_ws = terminal_ws(server, room, &t.ben).await;
    let (mut keys, mut screen) = typist_ws.split();
    // The viewer counts the program's bytes between the two markers, reading as it goes (the
    // flood is 18 MB on the wire: `y\r\n` 6 million times).
    let counting = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut ys = 0usize;
        let mut started = false;
        let r = tokio::time::timeout(Duration::from_secs(240), async {
            while let Some(Ok(msg)) = viewer.next().await {
                let Message::Binary(b) = msg else { continue };
                seen.extend_from_slice(&b);
                let text = String::from_utf8_lossy(&seen).into_owned();
                if !started {
                    if let Some(at) = text.find("START-42") {
                        started = true;
                        seen.drain(..at + "START-42".len());
                    } else {
                        let keep = seen.len().saturating_sub(16);
                        seen.drain(..keep);
                    }
                    continue;
                }
                if let Some(at) = text.find("DONE-42") {
                    ys += text[..at].bytes().filter(|b| *b == b'y').count();
                    return;
                }
                // Keep a tail that may hold the start of the marker.
                let keep = seen.len().saturating_sub(8);
                ys += seen[..keep].iter().filter(|b| **b == b'y').count();
                seen.drain(..keep);
            }
        })
        .await;
        assert!(r.is_ok(), "the viewer never saw the end of the flood");
        ys
    });
    let before = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await
        ["snapshot_at"]
        .as_i64();
    keys.send(Message::Binary(
        b"echo START-$((40+2)); yes | head -c 12000000; echo DONE-$((40+2))\n"
            .to_vec()
            .into(),
    ))
    .await
    .unwrap();
    // The typist reads its own copy of the screen: once the flood runs, a key every 20 ms; each
    // `k` the terminal echoes before the end marker is matched, in order, with its key.
    let sent: std::sync::Arc<std::sync::Mutex<Vec<std::time::Instant>>> = Default::default();
    let typing = tokio::sync::watch::channel(false);
    let (go, mut go_rx) = typing;
    let sent_by_typist = sent.clone();
    let typist = tokio::spawn(async move {
        while !*go_rx.borrow_and_update() {
            if go_rx.changed().await.is_err() {
                return keys;
            }
        }
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = go_rx.changed() => return keys,
            }
            if !*go_rx.borrow() {
                return keys;
            }
            sent_by_typist
                .lock()
                .unwrap()
                .push(std::time::Instant::now());
            if keys
                .send(Message::Binary(b"k".to_vec().into()))
                .await
                .is_err()
            {
                return keys;
            }
        }
    });
    let mut echoes = Vec::new();
    let mut window = String::new();
    let mut flooding = false;
    let r = tokio::time::timeout(Duration::from_secs(240), async {
        while let Some(msg) = screen.next().await {
            let b = match msg {
                Ok(Message::Binary(b)) => b,
                Ok(Message::Close(f)) => panic!("the typist was closed: {f:?}"),
                Ok(_) => continue,
                Err(e) => panic!("the typist's socket failed: {e}"),
            };
            let now = std::time::Instant::now();
            let text = String::from_utf8_lossy(&b);
            window.push_str(&text);
            if !flooding {
                if window.contains("START-42") {
                    flooding = true;
                    go.send_replace(true);
                }
                let keep = window.len().saturating_sub(16);
                window = window[keep..].to_owned();
                continue;
            }
            let end = window.find("DONE-42");
            let counted = &window[..end.unwrap_or(window.len())];
            for _ in counted.bytes().filter(|b| *b == b'k') {
                let i = echoes.len();
                let at = sent.lock().unwrap().get(i).copied();
                match at {
                    Some(at) => echoes.push(now.duration_since(at)),
                    None => panic!("an echo with no key sent ({i})"),
                }
            }
            if end.is_some() {
                go.send_replace(false);
                return;
            }
            window = window[window.len().saturating_sub(8)..].to_owned();
            // What stays in the window was already counted if it held a `k`.
            window = window.replace('k', ".");
        }
    })
    .await;
    assert!(
        r.is_ok() && !*go.borrow(),
        "the typist never saw the end of the flood"
    );
    drop(typist.await.unwrap());
    let ys = counting.await.unwrap();
    let after = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await
        ["snapshot_at"]
        .as_i64();
    FloodRun {
        ys,
        echoes,
        snapshot_at: (before, after),
    }
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

/// A workspace snapshot never holds up the terminal: while a 300 MB workspace is snapshotted
/// again and again, every byte of a 12 MB flood reaches a viewer, and no keystroke waits behind
/// a whole snapshot. The echo's 99th percentile with and without snapshots is printed (and kept
/// in docs/benchmarks.md); the bound is a second, not a close comparison: two runs of a flood on
/// a busy 2-core machine differ by up to ~100 ms on their own (a 50 ms bound failed once that
/// way: 158 against 96 ms), while a key stuck behind a 300 MB tar waits seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_never_holds_up_the_terminal() {
    let quiet = flood_while_typing(&[]).await;
    let busy = flood_while_typing(&["--sandbox-snapshot-every-ms", "3000"]).await;
    for (name, run) in [("without snapshots", &quiet), ("with snapshots", &busy)] {
        assert_eq!(run.ys, 6_000_000, "{name}: output bytes were lost");
        assert!(
            run.echoes.len() >= 20,
            "{name}: only {} keystrokes echoed during the flood",
            run.echoes.len()
        );
    }
    // The snapshots really ran while the flood did.
    let (before, after) = busy.snapshot_at;
    assert!(
        after.is_some() && after > before,
        "no snapshot was taken during the flood: {before:?} -> {after:?}"
    );
    let (q, b) = (p99(quiet.echoes.clone()), p99(busy.echoes.clone()));
    println!(
        "keystroke to echo, p99: {:.1} ms without snapshots ({} keys), {:.1} ms with snapshots ({} keys)",
        q.as_secs_f64() * 1000.0,
        quiet.echoes.len(),
        b.as_secs_f64() * 1000.0,
        busy.echoes.len()
    );
    assert!(
        b <= q + Duration::from_millis(1000),
        "keys waited behind snapshots: p99 {b:?} with, {q:?} without"
    );
}

//! Benchmark (ignored by default): terminal output throughput from a program in the room's
//! sandbox to 1 and 20 WebSocket viewers, beside reading a PTY directly on the host and reading
//! the agent's PTY stream without the server, in the same run. Reproduce with
//! `cargo test --release -p coderoom-server --test bench_terminal -- --ignored --nocapture`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use std::io::Read;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Bytes of text the program prints (base64 lines of 100 characters).
const TEXT_BYTES: usize = 16_000_000;
const MARK: &str = "END-42";

fn mib_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

/// Reading the PTY's master directly on the host: the floor.
fn direct_pty(file: &std::path::Path) -> (usize, Duration) {
    let pty = portable_pty::native_pty_system()
        .openpty(portable_pty::PtySize {
            rows: 30,
            cols: 100,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    let mut cmd = portable_pty::CommandBuilder::new("cat");
    cmd.arg(file);
    let started = Instant::now();
    let mut child = pty.slave.spawn_command(cmd).unwrap();
    drop(pty.slave);
    let mut reader = pty.master.try_clone_reader().unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0;
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
        if total >= TEXT_BYTES {
            break;
        }
    }
    let took = started.elapsed();
    let _ = child.kill();
    (total, took)
}

/// Reads until the marker; returns bytes received.
async fn drain(mut ws: Ws) -> usize {
    let mut total = 0;
    let mut tail: Vec<u8> = Vec::new();
    while let Some(Ok(msg)) = ws.next().await {
        if let Message::Binary(b) = msg {
            total += b.len();
            tail.extend_from_slice(&b[b.len().saturating_sub(64)..]);
            if tail.len() > 128 {
                tail.drain(..tail.len() - 64);
            }
            if tail.windows(MARK.len()).any(|w| w == MARK.as_bytes()) {
                return total;
            }
        }
    }
    panic!("viewer closed before the marker after {total} bytes");
}

async fn through_server(
    server: &Server,
    room: &str,
    token: &str,
    viewers: usize,
) -> (usize, Duration) {
    let mut typer = terminal_ws(server, room, token).await;
    let mut watchers = Vec::new();
    for _ in 1..viewers {
        watchers.push(terminal_ws(server, room, token).await);
    }
    // Let the scrollback replays of the joins pass, for every viewer, before anything is typed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for w in watchers.iter_mut().chain(std::iter::once(&mut typer)) {
        while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_millis(50), w.next()).await
        {
        }
    }
    let drains: Vec<_> = watchers
        .into_iter()
        .map(|w| tokio::spawn(drain(w)))
        .collect();
    let started = Instant::now();
    typer
        .send(Message::Binary(
            b"cat /tmp/big; echo END-$((40+2))\n".to_vec().into(),
        ))
        .await
        .unwrap();
    let mut counts = vec![drain(typer).await];
    for d in drains {
        counts.push(d.await.unwrap());
    }
    let took = started.elapsed();
    (*counts.iter().min().unwrap(), took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn terminal_throughput() {
    // The same text on the host, for the direct PTY floor.
    let host = tempfile::tempdir().unwrap();
    let file = host.path().join("big");
    let text: String = (0..TEXT_BYTES / 101)
        .map(|i| format!("{:0100}\n", i))
        .collect();
    std::fs::write(&file, &text).unwrap();
    let (direct_bytes, direct) = direct_pty(&file);

    let storage = Storage::new(&Backend::Sqlite).await;
    let token = storage.token("bench@example.com").await;
    let mut rows = vec![(
        "PTY read directly on the host (floor)".to_owned(),
        direct_bytes,
        direct,
    )];
    for (bound, label) in [
        ("1073741824", "unbounded"),
        ("8388608", "default 8 MiB/s bound"),
    ] {
        let server = Server::start(&storage, &["--terminal-output-bytes-per-s", bound]).await;
        let room = create_room(&server, &token).await;
        let body = serde_json::json!({
            "argv": ["sh", "-c", format!("for i in $(seq 0 {}); do printf '%0100d\\n' $i; done > /tmp/big", TEXT_BYTES / 101 - 1)],
            "timeout_ms": 120000
        })
        .to_string();
        let (status, out) = http(
            &server.url(&format!("/api/rooms/{room}/exec")),
            "POST",
            Some(&token),
            Some(&body),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        for viewers in [1usize, 20] {
            let (bytes, took) = through_server(&server, &room, &token, viewers).await;
            rows.push((format!("server, {viewers} viewer(s), {label}"), bytes, took));
        }
        server.terminate().await;
    }
    println!("| path | bytes per viewer | seconds | MiB/s per viewer |");
    println!("|---|---|---|---|");
    for (name, bytes, took) in rows {
        println!(
            "| {name} | {bytes} | {:.2} | {:.1} |",
            took.as_secs_f64(),
            mib_s(bytes, took)
        );
    }
}

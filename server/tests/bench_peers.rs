//! Edit-to-peer latency and burst throughput: Coderoom (every update durable before any peer
//! sees it) against the y-websocket reference server and Hocuspocus (both in memory), driven by
//! the same Rust load generator of yrs clients in the same run, alternated.
//!
//! Each room has writers and readers. Each writer appends tokens (`WWNNNNNN|`: writer `WW`,
//! its update `NNNNNN`) to a text, from updates it encoded before the clock started; a reader
//! finds the newest token of each writer in each update it receives (in the update's bytes,
//! without reading the text back) and records, for every number it had not seen, the time since
//! that writer sent it. Readers keep what they receive and apply it after the run: every
//! reader's text must equal all writers' updates merged (convergence), and every update must
//! have reached every reader (no loss).
//!
//! The generator speaks the y-websocket protocol (Coderoom, the reference server) and
//! Hocuspocus's (each message prefixed by the document's name, an authentication message
//! first, its `SyncReply` read as sync). The peers come from `tests/bench/peers` (`npm ci`
//! there).
//!
//! `cargo test --release -p coderoom-server --test bench_peers -- --ignored --nocapture`
//! (`BENCH_SECS` per run, default 5; `BENCH_REPEAT`, default 3; `BENCH_SHAPES`, a comma list
//! of `fanout`, `fast`, `rooms`, `rooms-procs` (each room's clients a process), `burst1`, `burst`, `burst100` (the default), `team` (4
//! writers); `BENCH_PEERS`, a comma list of
//! `coderoom`, `coderoom-pg` (with `CODEROOM_TEST_POSTGRES_URL`), either followed by a lever
//! switched off (`-normal`, `-inline`, `-each`, `-nogroup`, `-aftermerge`, `-rows`, `-nocompact`, `-longlease`, `-walgrows`: see
//! `LEVERS`), `reference`, `hocuspocus`; default `coderoom,coderoom-pg,reference,hocuspocus`;
//! `BENCH_OUT`, a directory for the markdown, `BENCH_TITLE` its name; `BENCH_WARMUP_MS`, how
//! long after the start updates are delivered and checked but not timed, default 0).
//! `tests/bench/regenerate` runs it for `docs/benchmarks.md`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use yrs::encoding::read::Cursor;
use yrs::sync::protocol::{Message as YMessage, SyncMessage};
use yrs::updates::decoder::{Decode, DecoderV1};
use yrs::updates::encoder::Encode;
use yrs::{GetString, ReadTxn, Text, Transact, Update};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How a peer frames the y-protocol.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
enum Proto {
    /// y-websocket: one message per frame, the room in the URL.
    YWebsocket,
    /// Hocuspocus: each message prefixed by the document's name.
    Hocuspocus,
}

/// One room's endpoint.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Endpoint {
    url: String,
    bearer: Option<String>,
    proto: Proto,
    doc: String,
}

fn write_var_uint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn read_var_uint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut n = 0u64;
    let mut shift = 0;
    loop {
        let byte = *b.get(*at)?;
        *at += 1;
        n |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(n);
        }
        shift += 7;
    }
}

impl Endpoint {
    /// A y-protocol message as this peer takes it.
    fn frame(&self, y: &[u8]) -> Vec<u8> {
        match self.proto {
            Proto::YWebsocket => y.to_vec(),
            Proto::Hocuspocus => {
                let mut out = Vec::with_capacity(y.len() + self.doc.len() + 2);
                write_var_uint(&mut out, self.doc.len() as u64);
                out.extend_from_slice(self.doc.as_bytes());
                out.extend_from_slice(y);
                out
            }
        }
    }

    /// The y-protocol sync message in a frame from this peer, if it is one.
    fn sync_of(&self, b: &[u8]) -> Option<SyncMessage> {
        let mut at = 0;
        if self.proto == Proto::Hocuspocus {
            let len = read_var_uint(b, &mut at)? as usize;
            at += len;
        }
        let kind = read_var_uint(b, &mut at)?;
        // Hocuspocus answers a sync step 1 as `SyncReply` (4); the rest is the same.
        if kind != 0 && !(kind == 4 && self.proto == Proto::Hocuspocus) {
            return None;
        }
        let mut decoder = DecoderV1::new(Cursor::new(&b[at..]));
        SyncMessage::decode(&mut decoder).ok()
    }

    async fn connect(&self) -> Ws {
        let mut req = self.url.as_str().into_client_request().unwrap();
        if let Some(t) = &self.bearer {
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        let cfg = WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .max_frame_size(Some(64 << 20));
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(cfg), true)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.url));
        if self.proto == Proto::Hocuspocus {
            // Authentication first (an empty token: the server has no auth hook).
            let mut auth = Vec::new();
            write_var_uint(&mut auth, self.doc.len() as u64);
            auth.extend_from_slice(self.doc.as_bytes());
            auth.extend_from_slice(&[2, 0, 0]);
            ws.send(Message::Binary(auth.into())).await.unwrap();
        }
        ws
    }
}

/// A connection that has synced: sends its step 1, waits for the peer's step 2.
async fn joined(ep: &Endpoint) -> Ws {
    let mut ws = ep.connect().await;
    let step1 = YMessage::Sync(SyncMessage::SyncStep1(yrs::StateVector::default())).encode_v1();
    ws.send(Message::Binary(ep.frame(&step1).into()))
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => {
                if let Some(SyncMessage::SyncStep2(_)) = ep.sync_of(&b) {
                    return ws;
                }
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("{} did not sync: {other:?}", ep.url),
        }
    }
}

/// Tokens are `WWNNNNNN|`: the writer `WW`, its update number `NNNNNN`.
const PER_WRITER: usize = 1_000_000;

/// The newest token of each writer in an update's bytes, as (writer, number) pairs.
fn newest_tokens(b: &[u8]) -> Vec<(usize, usize)> {
    let mut best: Vec<(usize, usize)> = Vec::new();
    let mut i = b.len();
    while i > 8 {
        i -= 1;
        if b[i] == b'|' && b[i - 8..i].iter().all(u8::is_ascii_digit) {
            let t = b[i - 8..i]
                .iter()
                .fold(0usize, |t, d| t * 10 + usize::from(d - b'0'));
            let (w, n) = (t / PER_WRITER, t % PER_WRITER);
            match best.iter_mut().find(|(bw, _)| *bw == w) {
                Some((_, bn)) => *bn = (*bn).max(n),
                None => best.push((w, n)),
            }
            i -= 8;
        }
    }
    best
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A load: `rooms` rooms, each with one writer and `readers` readers; the writer sends `total`
/// updates, paced at `rate` a second (`None`: as fast as it can).
#[derive(Clone, Copy, Debug)]
struct Shape {
    name: &'static str,
    rooms: usize,
    /// Writers per room, each sending `total` updates at `rate`.
    writers: usize,
    readers: usize,
    rate: Option<usize>,
    total: usize,
    /// Each room's clients in a process of their own (as real clients are separate machines),
    /// not tasks of this one.
    procs: bool,
}

/// What one run of a shape measured.
#[derive(Debug)]
struct Outcome {
    p50: f64,
    p99: f64,
    max: f64,
    /// Each room's p99, in the order of the rooms.
    rooms_p99: Vec<f64>,
    delivered: usize,
    expected: usize,
    /// Updates sent per second over the sending (burst: until the last reader had them all).
    updates_per_s: f64,
    converged: bool,
    /// Per second of sending (by when the update was sent), how many of the readers' samples
    /// took over [`SLOW_MS`]: when in a run the tail happened.
    slow_by_second: Vec<u64>,
}

/// A sample over this many milliseconds counts in [`Outcome::slow_by_second`].
const SLOW_MS: f64 = 3.0;

/// Adds `b`'s counts into `a`, second by second.
fn add_seconds(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Writer `w`'s `total` updates as y-protocol messages, each appending its token
/// (`WWNNNNNN|`) to the text `t` of a document of its own.
fn writer_script(w: usize, total: usize) -> Vec<Vec<u8>> {
    let doc = yrs::Doc::new();
    let text = doc.get_or_insert_text("t");
    let mut script = Vec::with_capacity(total);
    for n in 0..total {
        let sv = doc.transact().state_vector();
        {
            let mut txn = doc.transact_mut();
            let end = text.len(&txn);
            text.insert(&mut txn, end, &format!("{:08}|", w * PER_WRITER + n));
        }
        let update = doc.transact().encode_diff_v1(&sv);
        script.push(YMessage::Sync(SyncMessage::Update(update)).encode_v1());
    }
    script
}

/// The text every reader must end with: all writers' updates merged.
fn merged_text(scripts: &[Vec<Vec<u8>>]) -> String {
    let doc = yrs::Doc::new();
    let text = doc.get_or_insert_text("t");
    for y in scripts.iter().flatten() {
        let mut decoder = DecoderV1::new(Cursor::new(y));
        let Ok(YMessage::Sync(SyncMessage::Update(u))) = YMessage::decode(&mut decoder) else {
            panic!("a writer's script holds sync updates only");
        };
        doc.transact_mut()
            .apply_update(Update::decode_v1(&u).unwrap())
            .unwrap();
    }
    let merged = text.get_string(&doc.transact());
    merged
}

/// Runs `shape` on the rooms at `eps` (one endpoint per room): its clients as tasks of this
/// process, or with `shape.procs` each room's in a process of its own.
async fn drive(eps: Vec<Endpoint>, shape: Shape) -> Outcome {
    if shape.procs {
        drive_procs(eps, shape).await
    } else {
        drive_here(eps, shape, Start::Soon).await.0
    }
}

/// When a run's writers start sending.
enum Start {
    /// 300 ms after every client has synced.
    Soon,
    /// When the parent says: `BENCH:ready` on stdout once synced, then a line on stdin with
    /// the start as nanoseconds since the Unix epoch (the same instant for every process),
    /// this long after it.
    Told(Duration),
}

/// The wall clock now, in nanoseconds since the Unix epoch.
fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// One room's clients in a process, as the parent sees them.
struct Child {
    proc: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    /// The next `BENCH:` line the child prints (the test harness prints its own too).
    async fn said(&mut self) -> String {
        while let Some(l) = self.lines.next_line().await.unwrap() {
            // libtest may have begun the line (`test room_clients ... `).
            if let Some(at) = l.find("BENCH:") {
                return l[at + "BENCH:".len()..].to_owned();
            }
        }
        panic!("a room's client process ended without its figures");
    }
}

/// `drive`, each room's writer and readers in a process of their own: this test executable
/// run again as `room_clients` (`BENCH_CHILD` says which room and what load). The processes
/// connect and sync, then start on one wall-clock instant; each reports its room's
/// latencies, and the run's figures are computed here over all rooms.
async fn drive_procs(eps: Vec<Endpoint>, shape: Shape) -> Outcome {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for (i, ep) in eps.iter().enumerate() {
        // Independent clients do not send in step: each room's writer starts its period at
        // its own phase, spread evenly over one period.
        let phase = shape.rate.map_or(0, |r| {
            (1_000_000_000u64 / r as u64) * i as u64 / eps.len() as u64
        });
        let spec = serde_json::json!({
            "ep": ep, "writers": shape.writers, "readers": shape.readers,
            "rate": shape.rate, "total": shape.total, "phase_ns": phase,
        });
        let mut proc = tokio::process::Command::new(&exe)
            .args([
                "room_clients",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("BENCH_CHILD", spec.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = proc.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(proc.stdout.take().unwrap()).lines();
        children.push(Child { proc, stdin, lines });
    }
    for c in &mut children {
        assert_eq!(c.said().await, "ready");
    }
    let start = unix_ns() + 500_000_000;
    for c in &mut children {
        c.stdin
            .write_all(format!("{start}\n").as_bytes())
            .await
            .unwrap();
    }
    let mut all = Vec::new();
    let mut rooms_p99 = Vec::new();
    let (mut delivered, mut expected, mut converged, mut last) = (0, 0, true, 0.0f64);
    let mut slow_by_second = Vec::new();
    for c in &mut children {
        let r: serde_json::Value = serde_json::from_str(&c.said().await).unwrap();
        let slow: Vec<u64> = serde_json::from_value(r["slow_by_second"].clone()).unwrap();
        add_seconds(&mut slow_by_second, &slow);
        let mut mine: Vec<f64> = serde_json::from_value(r["latencies"].clone()).unwrap();
        mine.sort_by(|a, b| a.partial_cmp(b).unwrap());
        rooms_p99.push(percentile(&mine, 0.99));
        all.extend(mine);
        delivered += r["delivered"].as_u64().unwrap() as usize;
        expected += r["expected"].as_u64().unwrap() as usize;
        converged &= r["converged"].as_bool().unwrap();
        last = last.max(r["last_s"].as_f64().unwrap());
    }
    for c in &mut children {
        let _ = c.proc.wait().await;
    }
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let sent = (shape.total * shape.writers * eps.len()) as f64;
    Outcome {
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
        max: all.last().copied().unwrap_or(f64::NAN),
        rooms_p99,
        delivered,
        expected,
        updates_per_s: sent
            / match shape.rate {
                Some(r) => shape.total as f64 / r as f64,
                None => last.max(1e-3),
            },
        converged,
        slow_by_second,
    }
}

/// A room's clients as a process of their own (see `drive_procs`); without `BENCH_CHILD`
/// (a plain `--ignored` run) it does nothing.
#[tokio::test(flavor = "current_thread")]
#[ignore = "a room's clients for drive_procs, run by it"]
async fn room_clients() {
    let Ok(spec) = std::env::var("BENCH_CHILD") else {
        return;
    };
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    let ep: Endpoint = serde_json::from_value(spec["ep"].clone()).unwrap();
    let n = |k: &str| spec[k].as_u64().map(|v| v as usize);
    let shape = Shape {
        name: "child",
        rooms: 1,
        writers: n("writers").unwrap(),
        readers: n("readers").unwrap(),
        rate: n("rate"),
        total: n("total").unwrap(),
        procs: false,
    };
    let phase = Duration::from_nanos(spec["phase_ns"].as_u64().unwrap_or(0));
    let (o, latencies) = drive_here(vec![ep], shape, Start::Told(phase)).await;
    println!(
        "BENCH:{}",
        serde_json::json!({
            "latencies": latencies, "delivered": o.delivered, "expected": o.expected,
            "converged": o.converged, "slow_by_second": o.slow_by_second,
            "last_s": if shape.rate.is_none() { o.updates_per_s.recip() * (shape.total * shape.writers) as f64 } else { 0.0 },
        })
    );
}

/// Runs `shape` on the rooms at `eps` with the clients as tasks of this process; the outcome
/// and every latency measured.
async fn drive_here(eps: Vec<Endpoint>, shape: Shape, when: Start) -> (Outcome, Vec<f64>) {
    let total = shape.total;
    let writers = shape.writers;
    assert!(total < PER_WRITER && writers < 100, "tokens are WWNNNNNN");
    let mut rooms = Vec::new();
    for ep in &eps {
        let mut ws = Vec::new();
        for _ in 0..writers {
            ws.push(joined(ep).await);
        }
        let mut readers = Vec::new();
        for _ in 0..shape.readers {
            readers.push(joined(ep).await);
        }
        rooms.push((ep.clone(), ws, readers));
    }
    // What every writer sends, made before the clock starts: a yrs text encodes an update at
    // its end in time that grows with the text, so a writer making them as it goes is what
    // limits a burst (about 6,000 a second here), not the server.
    let scripts: Vec<Vec<Vec<u8>>> = (0..writers).map(|w| writer_script(w, total)).collect();
    let written = merged_text(&scripts);
    let base = Instant::now();
    let start = match when {
        Start::Soon => base + Duration::from_millis(300),
        Start::Told(phase) => {
            use std::io::BufRead;
            println!("BENCH:ready");
            let mut line = String::new();
            // The parent answers once every process has synced.
            let line = tokio::task::spawn_blocking(move || {
                std::io::stdin().lock().read_line(&mut line).unwrap();
                line
            })
            .await
            .unwrap();
            let at: u128 = line.trim().parse().unwrap();
            let now = unix_ns();
            Instant::now() + Duration::from_nanos(at.saturating_sub(now) as u64) + phase
        }
    };
    let rooms_latencies: Vec<Arc<Mutex<Vec<f64>>>> =
        (0..eps.len()).map(|_| Arc::default()).collect();
    let start_ns = start.duration_since(base).as_nanos() as u64;
    // Updates sent before this are delivered and checked but not timed (`BENCH_WARMUP_MS`).
    let timed_from = start_ns + knob("BENCH_WARMUP_MS", 0) as u64 * 1_000_000;
    let slow: Arc<Mutex<Vec<u64>>> = Arc::default();
    let got = Arc::new(AtomicUsize::new(0));
    let expected = total * writers * shape.readers * eps.len();
    let last_at = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let mut finals = Vec::new();
    for ((ep, ws, readers), latencies) in rooms.into_iter().zip(rooms_latencies.iter()) {
        // When each writer sent each of its updates.
        let sent: Arc<Vec<Vec<AtomicU64>>> = Arc::new(
            (0..writers)
                .map(|_| (0..total).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        );
        // What each reader received, in order; applied after the run (so a reader's cost while
        // measuring is finding the tokens, and the generator is not what limits a burst).
        let received: Arc<Mutex<Vec<Vec<Vec<u8>>>>> = Arc::default();
        for mut r in readers {
            let (ep, sent, received) = (ep.clone(), sent.clone(), received.clone());
            let (latencies, got, last_at) = (latencies.clone(), got.clone(), last_at.clone());
            let slow = slow.clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = vec![0usize; writers];
                let mut left = total * writers;
                let mut mine = Vec::with_capacity(left);
                let mut updates = Vec::with_capacity(left);
                let mut slow_here: Vec<u64> = Vec::new();
                while left > 0 {
                    let Some(Ok(msg)) = r.next().await else { break };
                    let Message::Binary(b) = msg else { continue };
                    let now = Instant::now();
                    let Some(SyncMessage::SyncStep2(u) | SyncMessage::Update(u)) = ep.sync_of(&b)
                    else {
                        continue;
                    };
                    let newest = newest_tokens(&u);
                    updates.push(u);
                    let now_ns = now.duration_since(base).as_nanos() as u64;
                    for (w, n) in newest {
                        if w >= writers || n >= total || n < seen[w] {
                            continue;
                        }
                        for s in seen[w]..=n {
                            let at = sent[w][s].load(Ordering::Acquire);
                            let took = now_ns.saturating_sub(at) as f64 / 1e6;
                            if at >= timed_from {
                                mine.push(took);
                            }
                            if took > SLOW_MS {
                                let second = (at.saturating_sub(start_ns) / 1_000_000_000) as usize;
                                if slow_here.len() <= second {
                                    slow_here.resize(second + 1, 0);
                                }
                                slow_here[second] += 1;
                            }
                        }
                        let fresh = n + 1 - seen[w];
                        got.fetch_add(fresh, Ordering::AcqRel);
                        left -= fresh;
                        seen[w] = n + 1;
                    }
                    last_at.fetch_max(now_ns, Ordering::AcqRel);
                }
                latencies.lock().unwrap().extend(mine);
                add_seconds(&mut slow.lock().unwrap(), &slow_here);
                received.lock().unwrap().push(updates);
            }));
        }
        for (w, writer) in ws.into_iter().enumerate() {
            let (mut sink, mut stream) = writer.split();
            // A writer reads (and drops) what it is sent, so its socket keeps flowing.
            tasks.push(tokio::spawn(async move {
                while stream.next().await.is_some() {}
            }));
            let frames: Vec<Vec<u8>> = scripts[w].iter().map(|y| ep.frame(y)).collect();
            let sent = sent.clone();
            tasks.push(tokio::spawn(async move {
                // Every shape starts on the clock (a burst's rate counts from `start`).
                tokio::time::sleep_until(start.into()).await;
                for (n, frame) in frames.into_iter().enumerate() {
                    if let Some(rate) = shape.rate {
                        // Writers of a room take turns within each period.
                        let at = (n as f64 + w as f64 / writers as f64) / rate as f64;
                        tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into())
                            .await;
                    }
                    sent[w][n].store(base.elapsed().as_nanos() as u64, Ordering::Release);
                    if sink.send(Message::Binary(frame.into())).await.is_err() {
                        break;
                    }
                }
                // Open until the readers are done.
                tokio::time::sleep(Duration::from_secs(600)).await;
                drop(sink);
            }));
        }
        finals.push(received);
    }
    let send_secs = shape.rate.map_or(0.0, |r| total as f64 / r as f64);
    let deadline = Instant::now() + Duration::from_secs_f64(send_secs + 60.0);
    while got.load(Ordering::Acquire) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Readers record their figures as they finish.
    let until = Instant::now() + Duration::from_secs(10);
    while finals
        .iter()
        .any(|r| r.lock().unwrap().len() < shape.readers)
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in &tasks {
        t.abort();
    }
    // Convergence: every reader's updates, applied in the order received, give its writer's
    // text.
    let converged = finals.iter().all(|r| {
        let r = r.lock().unwrap();
        r.len() == shape.readers
            && r.iter().all(|updates| {
                let doc = yrs::Doc::new();
                let text = doc.get_or_insert_text("t");
                for u in updates {
                    let Ok(u) = Update::decode_v1(u) else {
                        return false;
                    };
                    if doc.transact_mut().apply_update(u).is_err() {
                        return false;
                    }
                }
                let got = text.get_string(&doc.transact());
                got == written
            })
    });
    let mut rooms_p99 = Vec::new();
    let mut l = Vec::new();
    for room in &rooms_latencies {
        let mut mine = room.lock().unwrap().clone();
        mine.sort_by(|a, b| a.partial_cmp(b).unwrap());
        rooms_p99.push(percentile(&mine, 0.99));
        l.extend(mine);
    }
    let every = l.clone();
    l.sort_by(|a, b| a.partial_cmp(b).unwrap());
    // From the clock's start (every writer's first send) to the last reader's last update.
    let last =
        last_at.load(Ordering::Acquire) as f64 / 1e9 - start.duration_since(base).as_secs_f64();
    let o = Outcome {
        p50: percentile(&l, 0.5),
        p99: percentile(&l, 0.99),
        max: l.last().copied().unwrap_or(f64::NAN),
        rooms_p99,
        delivered: got.load(Ordering::Acquire),
        expected,
        updates_per_s: (total * writers * eps.len()) as f64
            / if shape.rate.is_some() {
                send_secs
            } else {
                last.max(1e-3)
            },
        converged,
        slow_by_second: slow.lock().unwrap().clone(),
    };
    (o, every)
}

/// The peers this run compares: Coderoom and, where `tests/bench/peers` is installed, the
/// reference server and Hocuspocus.
enum Peer {
    Coderoom {
        storage: Storage,
        server: Server,
        token: String,
        /// `coderoom (SQLite)`, `coderoom (PostgreSQL, an INSERT per row)`, ...
        name: String,
    },
    Node {
        name: &'static str,
        child: tokio::process::Child,
        port: u16,
        proto: Proto,
    },
}

const PEERS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/bench/peers");

async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Starts a peer from `tests/bench/peers`; `None` when it is not installed.
async fn node_peer(name: &'static str) -> Option<Peer> {
    let (script, proto) = match name {
        "reference" => (
            format!("{PEERS_DIR}/node_modules/@y/websocket-server/src/server.js"),
            Proto::YWebsocket,
        ),
        _ => (format!("{PEERS_DIR}/hocuspocus.mjs"), Proto::Hocuspocus),
    };
    if !std::path::Path::new(&format!("{PEERS_DIR}/node_modules")).exists() {
        return None;
    }
    let port = free_port().await;
    let child = tokio::process::Command::new("node")
        .arg(&script)
        .arg(port.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .current_dir(PEERS_DIR)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let until = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < until, "{name} did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Some(Peer::Node {
        name,
        child,
        port,
        proto,
    })
}

/// CPU seconds process `pid` (all its threads) has used, and the host's busy CPU seconds (all
/// CPUs), from /proc; `None` where /proc does not say.
fn cpu_seconds(pid: Option<u32>) -> Option<(f64, f64)> {
    // USER_HZ is 100 on every Linux this runs on.
    let tick = 0.01;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // Fields after the command's closing parenthesis, from the state (field 3): utime and
    // stime are fields 14 and 15.
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let field = |n: usize| f.get(n - 3)?.parse::<f64>().ok();
    let own = (field(14)? + field(15)?) * tick;
    let host = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<f64> = host
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user and nice):
    // all but idle and iowait.
    let busy = cpu.iter().take(8).sum::<f64>() - cpu.get(3)? - cpu.get(4)?;
    Some((own, busy * tick))
}

impl Peer {
    /// The server's process.
    fn pid(&self) -> Option<u32> {
        match self {
            Peer::Coderoom { server, .. } => server.child.id(),
            Peer::Node { child, .. } => child.id(),
        }
    }

    fn name(&self) -> String {
        match self {
            Peer::Coderoom { name, .. } => name.clone(),
            Peer::Node {
                name: "reference", ..
            } => "reference @y/websocket-server (memory)".into(),
            Peer::Node { .. } => "Hocuspocus 4.7 (memory)".into(),
        }
    }

    /// `n` fresh rooms.
    async fn rooms(&self, n: usize) -> Vec<Endpoint> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(match self {
                Peer::Coderoom { server, token, .. } => {
                    let room = create_room(server, token).await;
                    Endpoint {
                        url: format!("ws://{}/api/rooms/{room}/doc", server.addr),
                        bearer: Some(token.clone()),
                        proto: Proto::YWebsocket,
                        doc: room,
                    }
                }
                Peer::Node { port, proto, .. } => {
                    let doc = format!("bench-{:016x}", rand_u64());
                    let url = match proto {
                        Proto::YWebsocket => format!("ws://127.0.0.1:{port}/{doc}"),
                        Proto::Hocuspocus => format!("ws://127.0.0.1:{port}"),
                    };
                    Endpoint {
                        url,
                        bearer: None,
                        proto: *proto,
                        doc,
                    }
                }
            });
        }
        out
    }

    async fn stop(self) {
        match self {
            Peer::Coderoom {
                server, storage, ..
            } => {
                server.terminate().await;
                storage.drop_db().await;
            }
            Peer::Node { mut child, .. } => {
                let _ = child.kill().await;
            }
        }
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

/// A lever a Coderoom variant switches off, for this comparison only.
struct Lever {
    /// Its name after `coderoom-` or `coderoom-pg-`.
    name: &'static str,
    label: &'static str,
    args: &'static [&'static str],
}

const LEVERS: &[Lever] = &[
    Lever {
        name: "",
        label: "",
        args: &[],
    },
    Lever {
        name: "normal",
        label: ", synchronous=NORMAL",
        args: &["--sqlite-synchronous", "normal"],
    },
    Lever {
        name: "inline",
        label: ", checkpoints inside commits",
        args: &["--sqlite-inline-checkpoint"],
    },
    Lever {
        name: "each",
        label: ", a flush per frame",
        args: &["--write-each-frame"],
    },
    Lever {
        name: "nogroup",
        label: ", a transaction per room's batch",
        args: &["--max-commit-group", "1"],
    },
    Lever {
        name: "aftermerge",
        label: ", updates encoded after yrs merges blocks",
        args: &["--encode-after-merge"],
    },
    Lever {
        name: "nocompact",
        label: ", no compaction",
        args: &["--compact-every", "100000000"],
    },
    Lever {
        name: "longlease",
        label: ", long lease",
        args: &["--room-lease-ms", "600000"],
    },
    Lever {
        name: "rows",
        label: ", an INSERT per row",
        args: &["--log-row-each"],
    },
    Lever {
        name: "walgrows",
        label: ", a WAL that grows under steady writes",
        args: &["--sqlite-wal-restart-frames", "0"],
    },
    Lever {
        name: "pooled",
        label: ", the log through sqlx's pool",
        args: &["--log-on-pool"],
    },
];

async fn start(which: &str) -> Option<Peer> {
    let Some(rest) = which.strip_prefix("coderoom") else {
        return node_peer(if which == "reference" {
            "reference"
        } else {
            "hocuspocus"
        })
        .await;
    };
    let (pg, lever) = match rest.strip_prefix("-pg") {
        Some(l) => (true, l),
        None => (false, rest),
    };
    let lever = lever.strip_prefix('-').unwrap_or(lever);
    let Some(Lever { label, args, .. }) = LEVERS.iter().find(|l| l.name == lever) else {
        panic!("no such peer: {which}");
    };
    let backend = if pg {
        Backend::Postgres(std::env::var("CODEROOM_TEST_POSTGRES_URL").ok()?)
    } else {
        Backend::Sqlite
    };
    let storage = Storage::new(&backend).await;
    let server = Server::start(&storage, args).await;
    let token = storage.token("bench@example.com").await;
    let db = if pg { "PostgreSQL" } else { "SQLite" };
    Some(Peer::Coderoom {
        storage,
        server,
        token,
        name: format!("coderoom ({db}{label})"),
    })
}

fn shapes(secs: usize) -> Vec<Shape> {
    vec![
        // Not in the default run (`BENCH_SHAPES=team`): a team typing at once.
        Shape {
            writers: 4,
            name: "team",
            rooms: 1,
            readers: 8,
            rate: Some(100),
            total: 100 * secs,
            procs: false,
        },
        Shape {
            writers: 1,
            name: "fanout",
            rooms: 1,
            readers: 100,
            rate: Some(500),
            total: 500 * secs,
            procs: false,
        },
        Shape {
            writers: 1,
            name: "fast",
            rooms: 1,
            readers: 10,
            rate: Some(2000),
            total: 2000 * secs,
            procs: false,
        },
        Shape {
            writers: 1,
            name: "rooms",
            rooms: 40,
            readers: 4,
            rate: Some(50),
            total: 50 * secs,
            procs: false,
        },
        // The rooms again, each room's clients in a process of their own (as real clients
        // are), for `BENCH_ROOMS_SECS` (30).
        Shape {
            writers: 1,
            name: "rooms-procs",
            rooms: 40,
            readers: 4,
            rate: Some(50),
            total: 50 * knob("BENCH_ROOMS_SECS", 30),
            procs: true,
        },
        Shape {
            writers: 1,
            name: "burst1",
            rooms: 1,
            readers: 1,
            rate: None,
            total: 20_000,
            procs: false,
        },
        Shape {
            writers: 1,
            name: "burst",
            rooms: 1,
            readers: 10,
            rate: None,
            total: 20_000,
            procs: false,
        },
        Shape {
            writers: 1,
            name: "burst100",
            rooms: 1,
            readers: 100,
            rate: None,
            total: 20_000,
            procs: false,
        },
    ]
}

/// The comparison: every shape, each peer in turn, `BENCH_REPEAT` rounds; a JSON line per run
/// and a markdown table at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
async fn peers_side_by_side() {
    let secs = knob("BENCH_SECS", 5);
    let repeat = knob("BENCH_REPEAT", 3);
    let wanted = std::env::var("BENCH_SHAPES").unwrap_or_default();
    let peers = std::env::var("BENCH_PEERS")
        .unwrap_or_else(|_| "coderoom,coderoom-pg,reference,hocuspocus".into());
    let mut rows = Vec::new();
    for shape in shapes(secs) {
        let picked = match wanted.as_str() {
            "" => shape.name != "team",
            w => w.split(',').any(|w| w == shape.name),
        };
        if !picked {
            continue;
        }
        for round in 0..repeat {
            for which in peers.split(',') {
                let Some(peer) = start(which).await else {
                    let need = if which == "coderoom-pg" {
                        Need::Postgres
                    } else {
                        Need::BenchPeers
                    };
                    skip(
                        need,
                        &format!("{which}: not installed (tests/bench/peers: npm ci) or no CODEROOM_TEST_POSTGRES_URL"),
                    );
                    continue;
                };
                let eps = peer.rooms(shape.rooms).await;
                // The host's dirty pages (the build's, the last peer's) written first: a peer
                // that syncs its commits must not pay for writeback that is not its own.
                let _ = tokio::process::Command::new("sync").status().await;
                let cpu_before = cpu_seconds(peer.pid());
                let o = drive(eps, shape).await;
                // What the server and the whole host (clients included) spent on the run.
                let cpu = cpu_seconds(peer.pid())
                    .zip(cpu_before)
                    .map(|((own, busy), (own0, busy0))| (own - own0, busy - busy0));
                let name = peer.name();
                let stages = match &peer {
                    Peer::Coderoom { server, .. } => stage_times(server).await,
                    Peer::Node { .. } => serde_json::Value::Null,
                };
                peer.stop().await;
                println!(
                    "{}",
                    serde_json::json!({
                        "shape": shape.name, "round": round, "peer": name, "stages": stages,
                        "p50_ms": o.p50, "p99_ms": o.p99, "max_ms": o.max,
                        "delivered": o.delivered, "expected": o.expected,
                        "updates_per_s": o.updates_per_s, "converged": o.converged,
                        "slow_by_second": o.slow_by_second,
                        "server_cpu_s": cpu.map(|c| c.0), "host_cpu_s": cpu.map(|c| c.1),
                    })
                );
                rows.push(Row {
                    shape,
                    which: which.to_owned(),
                    name,
                    o,
                    stages,
                });
            }
        }
    }
    let title = std::env::var("BENCH_TITLE").unwrap_or_else(|_| "peers".into());
    report(&title, &summary(&rows, repeat));
    if rows.iter().any(|r| r.which == "coderoom") {
        report(&format!("{title}-stages"), &stage_table(&rows));
    }
    if rows.iter().any(|r| r.shape.procs) {
        report(&format!("{title}-rooms"), &rooms_table(&rows));
    }
}

/// The many-rooms shapes with clients in processes of their own, room by room: each round's
/// median and worst of the rooms' p99, per server, and the goals judged on them (the median
/// of the rooms' p99 within 1.5x Hocuspocus's, the worst room's within 2x Hocuspocus's worst
/// and under 10 ms).
fn rooms_table(rows: &[Row]) -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "| shape | server | round | rooms' p99, median | rooms' p99, worst | p50 ms | delivered, converged |\n|---|---|---|---|---|---|---|\n",
    );
    let stats = |o: &Outcome| {
        (
            median(o.rooms_p99.clone()),
            o.rooms_p99.iter().copied().fold(f64::NAN, f64::max),
        )
    };
    let mut shapes: Vec<&Shape> = Vec::new();
    for r in rows.iter().filter(|r| r.shape.procs) {
        if !shapes.iter().any(|s| s.name == r.shape.name) {
            shapes.push(&r.shape);
        }
    }
    let mut goals = Vec::new();
    for shape in shapes {
        let what = format!(
            "{} rooms x ({} writer + {} readers), {}/s each, {} s, a process per room",
            shape.rooms,
            shape.writers,
            shape.readers,
            shape.rate.unwrap_or(0),
            shape.total / shape.rate.unwrap_or(1).max(1)
        );
        let mut first = true;
        let mut per: Vec<(String, String, f64, f64)> = Vec::new();
        let mut order: Vec<&str> = Vec::new();
        for r in rows.iter().filter(|r| r.shape.name == shape.name) {
            if !order.contains(&r.which.as_str()) {
                order.push(&r.which);
            }
        }
        for w in order {
            let mine: Vec<&Row> = rows
                .iter()
                .filter(|r| r.shape.name == shape.name && r.which == w)
                .collect();
            for (round, r) in mine.iter().enumerate() {
                let (mid, worst) = stats(&r.o);
                let health = format!(
                    "{}, {}",
                    if r.o.delivered == r.o.expected {
                        "all"
                    } else {
                        "LOST SOME"
                    },
                    if r.o.converged { "yes" } else { "NO" }
                );
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {mid:.2} | {worst:.2} | {:.2} | {health} |",
                    if first { what.as_str() } else { "" },
                    r.name,
                    round + 1,
                    r.o.p50
                );
                first = false;
            }
            let mids = median(mine.iter().map(|r| stats(&r.o).0).collect());
            let worst = mine.iter().map(|r| stats(&r.o).1).fold(f64::NAN, f64::max);
            per.push((w.to_owned(), mine[0].name.clone(), mids, worst));
        }
        if let Some((_, _, hm, hw)) = per.iter().find(|p| p.0 == "hocuspocus").cloned() {
            for (w, name, m, worst) in per.iter().filter(|p| p.0.starts_with("coderoom")) {
                let ok = *m <= 1.5 * hm && *worst <= 2.0 * hw && *worst < 10.0;
                goals.push(format!(
                    "- {name}: rooms' p99 median {m:.2} ms ({:.2}x Hocuspocus's {hm:.2}), worst room {worst:.2} ms ({:.2}x Hocuspocus's worst {hw:.2}): {}{}",
                    m / hm,
                    worst / hw,
                    if ok { "met" } else { "NOT met" },
                    if w == "coderoom" { "" } else { " (not the default)" }
                ));
            }
        }
    }
    if !goals.is_empty() {
        let _ = writeln!(
            out,
            "\nGoals (median of the rounds' medians within 1.5x Hocuspocus's; worst room of every round within 2x Hocuspocus's worst and under 10 ms):\n"
        );
        for g in goals {
            let _ = writeln!(out, "{g}");
        }
    }
    out
}

/// One run's figures.
struct Row {
    shape: Shape,
    which: String,
    name: String,
    o: Outcome,
    /// Coderoom's per-stage histograms after the run (`stage_times`); null for the peers.
    stages: serde_json::Value,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The run as markdown: per shape and server the median of the rounds (each round in
/// brackets), and ratios to the reference server and Hocuspocus where they ran, or else to
/// the first server of the run. Paced shapes compare p99 (lower is better: a ratio below 1 is
/// faster than the peer), bursts compare updates/s (higher is better).
fn summary(rows: &[Row], repeat: usize) -> String {
    use std::fmt::Write;
    let mut order: Vec<&str> = Vec::new();
    for r in rows {
        if !order.contains(&r.which.as_str()) {
            order.push(&r.which);
        }
    }
    let mut bases: Vec<&str> = order
        .iter()
        .copied()
        .filter(|w| *w == "reference" || *w == "hocuspocus")
        .collect();
    if bases.is_empty() {
        bases.extend(order.first());
    }
    let label = |w: &str| match w {
        "reference" => "the reference".to_owned(),
        "hocuspocus" => "Hocuspocus".to_owned(),
        other => format!("`{other}`"),
    };
    let mut shapes: Vec<Shape> = Vec::new();
    for r in rows {
        if !shapes.iter().any(|s| s.name == r.shape.name) {
            shapes.push(r.shape);
        }
    }
    let mut out = String::new();
    let fig = |shape: &Shape, o: &Outcome| match shape.rate {
        Some(_) => o.p99,
        None => o.updates_per_s,
    };
    let of = |shape: &Shape, w: &str| -> Vec<&Outcome> {
        rows.iter()
            .filter(|r| r.shape.name == shape.name && r.which == w)
            .map(|r| &r.o)
            .collect()
    };
    for paced in [true, false] {
        let ours: Vec<&Shape> = shapes
            .iter()
            .filter(|s| s.rate.is_some() == paced)
            .collect();
        if ours.is_empty() {
            continue;
        }
        let ratio_heads: String = bases
            .iter()
            .map(|b| format!(" vs {} |", label(b)))
            .collect();
        if paced {
            let _ = writeln!(
                out,
                "| shape | server | p50 ms | p99 ms, median (each round) | max ms |{ratio_heads} delivered, converged |"
            );
        } else {
            let _ = writeln!(
                out,
                "| shape | server | updates/s to every reader, median (each round) |{ratio_heads} delivered, converged |"
            );
        }
        let _ = writeln!(
            out,
            "|---|---|---|{}---|",
            "---|".repeat(bases.len() + usize::from(paced) * 2)
        );
        for shape in ours {
            let what = match shape.rate {
                Some(r) => format!(
                    "{} room{} x ({} writer{} + {} readers), {r} updates/s each",
                    shape.rooms,
                    if shape.rooms == 1 { "" } else { "s" },
                    shape.writers,
                    if shape.writers == 1 { "" } else { "s" },
                    shape.readers
                ),
                None => format!(
                    "burst: {} writer{}, {} reader{}, {} updates each",
                    shape.writers,
                    if shape.writers == 1 { "" } else { "s" },
                    shape.readers,
                    if shape.readers == 1 { "" } else { "s" },
                    shape.total
                ),
            };
            let mut first = true;
            for w in &order {
                let os = of(shape, w);
                if os.is_empty() {
                    continue;
                }
                let name = rows
                    .iter()
                    .find(|r| r.which == *w)
                    .map_or("", |r| r.name.as_str());
                let figs: Vec<f64> = os.iter().map(|o| fig(shape, o)).collect();
                let mid = median(figs.clone());
                let rounds = figs
                    .iter()
                    .map(|f| {
                        if paced {
                            format!("{f:.2}")
                        } else {
                            format!("{f:.0}")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut ratios = String::new();
                for b in &bases {
                    let base = median(of(shape, b).iter().map(|o| fig(shape, o)).collect());
                    if b == w || !base.is_finite() {
                        ratios.push_str(" |");
                    } else {
                        let _ = write!(ratios, " {:.2}x |", mid / base);
                    }
                }
                let all = os.iter().all(|o| o.delivered == o.expected);
                let conv = os.iter().all(|o| o.converged);
                let health = format!(
                    "{}, {}",
                    if all { "all" } else { "LOST SOME" },
                    if conv { "yes" } else { "NO" }
                );
                let shape_cell = if first { what.as_str() } else { "" };
                first = false;
                if paced {
                    let p50 = median(os.iter().map(|o| o.p50).collect());
                    let max = median(os.iter().map(|o| o.max).collect());
                    let _ = writeln!(
                        out,
                        "| {shape_cell} | {name} | {p50:.2} | **{mid:.2}** ({rounds}) | {max:.1} |{ratios} {health} |"
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "| {shape_cell} | {name} | **{mid:.0}** ({rounds}) |{ratios} {health} |"
                    );
                }
            }
        }
        out.push('\n');
    }
    // The goals, judged on this run's medians: paced p99 at or below Hocuspocus's (and
    // under 5 ms with 100 readers), bursts at least 2x both peers.
    if bases.len() == 2 {
        let _ = writeln!(out, "Goals, judged on this run's medians:\n");
        for w in order.iter().filter(|w| w.starts_with("coderoom")) {
            let name = rows
                .iter()
                .find(|r| r.which == *w)
                .map_or("", |r| r.name.as_str());
            let mut parts = Vec::new();
            for shape in &shapes {
                let mine = median(of(shape, w).iter().map(|o| fig(shape, o)).collect());
                let peer = |b: &str| median(of(shape, b).iter().map(|o| fig(shape, o)).collect());
                if !mine.is_finite() {
                    continue;
                }
                let part = match shape.rate {
                    Some(rate) => {
                        let h = peer("hocuspocus");
                        let mut verdict = if mine <= h { "met" } else { "NOT met" }.to_owned();
                        if shape.readers >= 100 && mine >= 5.0 {
                            verdict = format!("{verdict}; not under 5 ms");
                        }
                        format!(
                            "{}x{}x{rate}/s p99 {mine:.2} ms vs Hocuspocus {h:.2}: {verdict}",
                            shape.rooms, shape.readers
                        )
                    }
                    None => {
                        let (r, h) = (mine / peer("reference"), mine / peer("hocuspocus"));
                        let verdict = if r >= 2.0 && h >= 2.0 {
                            "met"
                        } else {
                            "NOT met"
                        };
                        format!(
                            "burst with {} reader(s) {r:.2}x the reference, {h:.2}x Hocuspocus: {verdict}",
                            shape.readers
                        )
                    }
                };
                parts.push(part);
            }
            let _ = writeln!(out, "- {name}: {}", parts.join("; "));
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "{repeat} round(s); each round runs every server in turn; paced runs send for the time \
         set by `BENCH_SECS`. Ratios: paced, this p99 over the peer's (below 1: lower latency \
         than the peer); burst, this rate over the peer's (above 1: faster). With an even \
         number of rounds the median is the higher of the middle two."
    );
    out
}

/// Where Coderoom's time went (SQLite, default settings): each stage's mean and p99 in the
/// last round of each paced shape, beside the edit-to-peer latency the generator saw.
fn stage_table(rows: &[Row]) -> String {
    use std::fmt::Write;
    let runs: Vec<&Row> = {
        let mut last: Vec<&Row> = Vec::new();
        for r in rows
            .iter()
            .filter(|r| r.which == "coderoom" && r.shape.rate.is_some())
        {
            match last.iter_mut().find(|l| l.shape.name == r.shape.name) {
                Some(l) => *l = r,
                None => last.push(r),
            }
        }
        last
    };
    let mut out = String::from("| stage |");
    for r in &runs {
        let _ = write!(
            out,
            " {} room(s) x ({} writer(s) + {} readers) x {}/s: mean / p99 ms |",
            r.shape.rooms,
            r.shape.writers,
            r.shape.readers,
            r.shape.rate.unwrap_or(0)
        );
    }
    let _ = writeln!(out, "\n|---|{}", "---|".repeat(runs.len()));
    for (stage, what) in STAGES {
        let _ = write!(out, "| {stage} ({what}) |");
        for r in &runs {
            let st = &r.stages[stage];
            let _ = write!(
                out,
                " {:.3} / {:.2} |",
                st["mean_ms"].as_f64().unwrap_or(f64::NAN),
                st["p99_ms"].as_f64().unwrap_or(f64::NAN)
            );
        }
        out.push('\n');
    }
    out.push_str("| edit-to-peer, as the generator saw it |");
    for r in &runs {
        let _ = write!(out, " p50 {:.2}, p99 {:.2} |", r.o.p50, r.o.p99);
    }
    out.push_str(
        "\n\nQuantiles of the stages are the upper edges of the histogram buckets they fall in.\n",
    );
    out
}

/// Coderoom's stages (`doc_stage_seconds{stage}`), in the order an update meets them.
const STAGES: [(&str, &str); 11] = [
    ("decode", "a client's frame parsed"),
    ("receive", "its messages waiting for the room"),
    ("apply", "the room applying it"),
    ("commit", "the log append a batch waits for, in all"),
    ("log_wait", "of which: waiting for the log's writer"),
    (
        "log_write",
        "of which: the writer's statement and fsync, per group",
    ),
    (
        "log_checkpoint",
        "the writer copying the rest of the WAL, groups waiting",
    ),
    (
        "upkeep",
        "a room renewing its lease or compacting, its updates waiting",
    ),
    ("broadcast", "framing and queueing for every peer"),
    ("queue", "a frame waiting for its connection's writer"),
    ("write", "handing it to the socket"),
];

/// Coderoom's `doc_stage_seconds` histograms as `{stage: {"count", "mean_ms", "p50_ms",
/// "p99_ms"}}` (quantiles are the upper edges of the buckets they fall in).
async fn stage_times(server: &Server) -> serde_json::Value {
    let (_, body) = http(&server.url("/metrics"), "GET", None, None).await;
    let mut out = serde_json::Map::new();
    for stage in STAGES.iter().map(|(s, _)| *s) {
        let tag = format!("stage=\"{stage}\"");
        let value = |metric: &str| -> f64 {
            body.lines()
                .find(|l| l.starts_with(metric) && l.contains(&tag))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0.0)
        };
        let count = value("coderoom_doc_stage_seconds_count");
        let sum = value("coderoom_doc_stage_seconds_sum");
        let buckets: Vec<(f64, f64)> = body
            .lines()
            .filter(|l| l.starts_with("coderoom_doc_stage_seconds_bucket") && l.contains(&tag))
            .filter_map(|l| {
                let le = l.split("le=\"").nth(1)?.split('"').next()?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, l.rsplit(' ').next()?.parse().ok()?))
            })
            .collect();
        let q = |p: f64| {
            buckets
                .iter()
                .find(|(_, n)| *n >= p * count)
                .map_or(f64::NAN, |(le, _)| le * 1000.0)
        };
        out.insert(
            stage.into(),
            serde_json::json!({
                "count": count, "mean_ms": if count > 0.0 { sum / count * 1000.0 } else { 0.0 },
                "p50_ms": q(0.5), "p99_ms": q(0.99),
            }),
        );
    }
    serde_json::Value::Object(out)
}

/// The generator's smoke mode, in every test run (and so in `.ci/run`): a second of a small
/// shape against each peer that is installed, asserting that every update reached every reader
/// and every reader converged. Not speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_every_peer_gets_every_update() {
    let shape = Shape {
        writers: 2,
        name: "smoke",
        rooms: 2,
        readers: 3,
        rate: Some(100),
        total: 100,
        procs: false,
    };
    for which in ["coderoom", "reference", "hocuspocus"] {
        let Some(peer) = start(which).await else {
            skip(
                Need::BenchPeers,
                &format!("{which}: tests/bench/peers is not installed (npm ci there)"),
            );
            continue;
        };
        let eps = peer.rooms(shape.rooms).await;
        let o = drive(eps, shape).await;
        // Each room's clients in a process of their own, as the many-rooms benchmark runs them.
        let procs = Shape {
            procs: true,
            ..shape
        };
        let eps = peer.rooms(shape.rooms).await;
        let p = drive(eps, procs).await;
        let name = peer.name();
        peer.stop().await;
        for o in [o, p] {
            assert_eq!(o.delivered, o.expected, "{name}: {o:?}");
            assert!(o.converged, "{name}: {o:?}");
            assert_eq!(o.rooms_p99.len(), shape.rooms, "{name}: {o:?}");
        }
    }
}

#[test]
fn tokens_are_found_in_update_bytes() {
    assert_eq!(
        newest_tokens(b"\x01\x02abc00000007|00000012|01000003|\x00"),
        vec![(1, 3), (0, 12)]
    );
    assert_eq!(newest_tokens(b"0000001|"), vec![]);
    assert_eq!(newest_tokens(b""), vec![]);
    let mut v = Vec::new();
    write_var_uint(&mut v, 300);
    let mut at = 0;
    assert_eq!(read_var_uint(&v, &mut at), Some(300));
}

//! The E2B door's cost beside the project's own REST API (issue 39), in one run: a command's
//! round trip (`commands.run("true")` through the stock Python SDK, against `POST /exec` of
//! the same argv the SDK sends, `/bin/bash -l -c true`) and a 1 MB file write
//! (`files.write` against `PUT /files/{path}`), `BENCH_CALLS` calls each (200), interleaved so
//! both paths see the same machine. The client is one Python process of its own (the SDK's,
//! with `httpx` for REST: the library the SDK's own file calls use), as a harness is.
//!
//! `CODEROOM_E2B_PYTHON=... cargo test --release -p coderoom-server --test bench_e2b -- --ignored --nocapture`
//! Figures: `docs/benchmarks.md`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;

const SCRIPT: &str = r#"
import json, os, statistics, sys, time
import httpx
from e2b import Sandbox
calls = int(sys.argv[1])
base, room, key = os.environ["BENCH_BASE"], os.environ["BENCH_ROOM"], os.environ["E2B_API_KEY"]
rest = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)
sbx = Sandbox.create()
blob = os.urandom(1 << 20)
argv = {"argv": ["/bin/bash", "-l", "-c", "true"]}
times = {"rest_exec": [], "e2b_run": [], "rest_write": [], "e2b_write": []}
def timed(name, f):
    t0 = time.perf_counter()
    f()
    times[name].append((time.perf_counter() - t0) * 1000)
for _ in range(5):
    rest.post(f"/api/rooms/{room}/exec", json=argv).raise_for_status()
    sbx.commands.run("true")
for i in range(calls):
    timed("rest_exec", lambda: rest.post(f"/api/rooms/{room}/exec", json=argv).raise_for_status())
    timed("e2b_run", lambda: sbx.commands.run("true"))
    timed("rest_write", lambda: rest.put(f"/api/rooms/{room}/files/blob-rest.bin", content=blob).raise_for_status())
    timed("e2b_write", lambda: sbx.files.write("/home/user/blob-e2b.bin", blob))
def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]
print(json.dumps({k: {"median": statistics.median(v), "p99": q(v, 0.99)} for k, v in times.items()}))
"#;

#[tokio::test]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn bench_e2b() {
    let python = std::env::var("CODEROOM_E2B_PYTHON").unwrap_or_else(|_| "python3".into());
    let calls = knob("BENCH_CALLS", 200);
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let body = r#"{"name":"bench","capabilities":["observe","edit","type"],"ttl_s":3600}"#;
    let (status, a) = post(server, &t.ana, &format!("/api/rooms/{room}/agents"), body).await;
    assert_eq!(status, 201, "{a}");
    let key = a["token"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.py");
    std::fs::write(&path, SCRIPT).unwrap();
    let out = tokio::process::Command::new(&python)
        .arg(&path)
        .arg(calls.to_string())
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", server.url("/api/e2b"))
        .env("E2B_SANDBOX_URL", server.url("/api/e2b/envd"))
        .env("BENCH_BASE", server.url(""))
        .env("BENCH_ROOM", room)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let row = |what: &str, rest: &str, e2b: &str| {
        let (r, e) = (&v[rest], &v[e2b]);
        let ratio = e["median"].as_f64().unwrap() / r["median"].as_f64().unwrap();
        format!(
            "| {what} | {:.2} / {:.2} | {:.2} / {:.2} | {ratio:.2}x |\n",
            r["median"].as_f64().unwrap(),
            r["p99"].as_f64().unwrap(),
            e["median"].as_f64().unwrap(),
            e["p99"].as_f64().unwrap(),
        )
    };
    let mut md = format!(
        "{calls} calls each, interleaved; one Python client process (ms, median / p99)\n\n\
         | call | REST | E2B SDK | E2B / REST (median) |\n|---|---|---|---|\n"
    );
    md.push_str(&row(
        "a command (`/bin/bash -l -c true`)",
        "rest_exec",
        "e2b_run",
    ));
    md.push_str(&row("a 1 MB file write", "rest_write", "e2b_write"));
    report("e2b", &md);
}

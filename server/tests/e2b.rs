//! The E2B-compatible door (issue 39), driven by the stock Python SDK (`e2b`, pinned in
//! `.ci/run`) as a harness would: only `E2B_API_KEY`, `E2B_API_URL` and `E2B_SANDBOX_URL` are
//! set. The SDK's Python comes from `CODEROOM_E2B_PYTHON` (a virtual environment), else
//! `python3` if it has the SDK; without it the tests are skipped (or fail where `.ci/run`
//! promised it: `CODEROOM_REQUIRE_E2B_SDK=1`).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::time::Duration;

/// The Python that has the SDK, or `None` (the test is then reported skipped).
fn sdk_python() -> Option<String> {
    let python = std::env::var("CODEROOM_E2B_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import e2b"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(python)
    } else {
        skip(Need::E2bSdk, &format!("{python} cannot import the e2b SDK"));
        None
    }
}

/// Runs `script` with the SDK against `server` as `key`; the JSON object its last line prints.
async fn harness(python: &str, server: &Server, key: &str, script: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("harness.py");
    std::fs::write(&path, script).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(python)
            .arg(&path)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("E2B_API_KEY", key)
            .env("E2B_API_URL", server.url("/api/e2b"))
            .env("E2B_SANDBOX_URL", server.url("/api/e2b/envd"))
            .output(),
    )
    .await
    .expect("the harness hung")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|_| {
        panic!("the harness printed no result:\nstdout: {stdout}\nstderr: {stderr}")
    })
}

/// A new agent's key in `t`'s room, holding `caps` (a JSON list), sponsored by Ana.
async fn agent_key(t: &Room, name: &str, caps: &str) -> String {
    let agents = format!("/api/rooms/{}/agents", t.room);
    let body = format!(r#"{{"name":"{name}","capabilities":{caps},"ttl_s":3600}}"#);
    let (status, a) = post(&t.server, &t.ana, &agents, &body).await;
    assert_eq!(status, 201, "{a}");
    a["token"].as_str().unwrap().to_owned()
}

/// Commands typed in the room (into the terminal or into commands' input) as its audit log
/// counts them.
async fn typed_commands(server: &Server, token: &str, room: &str) -> u64 {
    audit(server, token, room)
        .await
        .iter()
        .filter(|r| r["action"] == "run_command" && r["details"]["terminal"] == true)
        .map(|r| r["details"]["commands"].as_u64().unwrap())
        .sum()
}

/// The SDK's Python, a team's room (kept with its storage) and an agent's key that may
/// observe, edit and type there; `None` when the SDK is missing (reported skipped).
async fn harnessed() -> Option<(String, Storage, Room, String)> {
    let python = sdk_python()?;
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let key = agent_key(&t, "harness", r#"["observe","edit","type"]"#).await;
    Some((python, storage, t, key))
}

/// An agent's key, its room, and what its sponsor (Ana, the owner) sees: the stock SDK creates
/// the room's sandbox, runs commands with their output streamed as printed (a chunk arrives
/// while the command still sleeps), exit codes (a failing command raises the SDK's
/// `CommandExitException`), environment and working directory, and writes and reads files
/// under `/home/user`, the room's workspace: the file it wrote is in the room's document. An
/// observe-only agent reads but is refused running and writing, with the SDK's own errors.
/// `kill()` ends the agent's session, not the room.
#[tokio::test]
async fn the_stock_python_sdk_drives_a_room() {
    let Some((python, _storage, t, key)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);

    let script = r#"
import json, time
from e2b import Sandbox, CommandExitException
sbx = Sandbox.create()
seen = []
start = time.time()
def on_out(d):
    seen.append((round(time.time() - start, 2), d))
r = sbx.commands.run("echo one; sleep 1.5; echo two", on_stdout=on_out)
out = {"id": sbx.sandbox_id, "stdout": r.stdout, "exit": r.exit_code, "seen": seen}
try:
    sbx.commands.run("echo bad >&2; exit 3")
    out["failed"] = None
except CommandExitException as e:
    out["failed"] = [e.exit_code, e.stderr]
r = sbx.commands.run("echo $GREETING from $(pwd)", envs={"GREETING": "hello"}, cwd="/home/user/sub")
out["env"] = r.stdout
sbx.files.write("/home/user/hello.py", "print(6 * 7)\n")
out["read"] = sbx.files.read("/home/user/hello.py")
out["ran"] = sbx.commands.run("python3 hello.py").stdout
out["killed"] = sbx.kill()
print(json.dumps(out))
"#;
    // (The working directory must exist.)
    let (status, v) = exec(server, &t.ana, room, "mkdir -p sub").await;
    assert_eq!(status, 200, "{v}");
    let out = harness(&python, server, &key, script).await;
    assert_eq!(out["id"], room.as_str(), "{out}");
    assert_eq!(out["stdout"], "one\ntwo\n", "{out}");
    assert_eq!(out["exit"], 0, "{out}");
    // Streamed: the first line came a good while before the second.
    let seen = out["seen"].as_array().unwrap();
    assert_eq!(seen.len(), 2, "{out}");
    let gap = seen[1][0].as_f64().unwrap() - seen[0][0].as_f64().unwrap();
    assert!(gap > 1.0, "output came at the end, not as printed: {out}");
    assert_eq!(out["failed"], serde_json::json!([3, "bad\n"]), "{out}");
    assert_eq!(out["env"], "hello from /workspace/sub\n", "{out}");
    assert_eq!(out["read"], "print(6 * 7)\n", "{out}");
    assert_eq!(out["ran"], "42\n", "{out}");
    assert_eq!(out["killed"], true, "{out}");
    // What it wrote is in the room's document, as people see it in the editor.
    let mut doc = Client::connect(server, room, &t.ana).await;
    doc.synced().await;
    doc.wait_for_file("hello.py", "print(6 * 7)\n").await;
    // Its commands are the room's commands: audited, naming the agent.
    let records = audit(server, &t.ana, room).await;
    let ran = records
        .iter()
        .filter(|r| r["action"] == "run_command" && r["decision"] == "allow")
        .count();
    assert!(ran >= 4, "{records:?}");

    // Parity with REST: the same command, through `POST /exec` and through the SDK, is one
    // decision and one audit entry of the same shape (the door is not in it).
    let argv = serde_json::json!({ "argv": ["/bin/bash", "-l", "-c", "echo parity"] }).to_string();
    let (status, v) = post(server, &key, &format!("/api/rooms/{room}/exec"), &argv).await;
    assert_eq!(status, 200, "{v}");
    let script = r#"
import json
from e2b import Sandbox
print(json.dumps({"out": Sandbox.create().commands.run("echo parity").stdout}))
"#;
    assert_eq!(
        harness(&python, server, &key, script).await["out"],
        "parity\n"
    );
    let records = audit(server, &t.ana, room).await;
    let shape = |r: &Value| {
        let mut r = r.clone();
        for volatile in ["id", "seq", "at", "at_ms", "hash", "prev_hash", "prev"] {
            r.as_object_mut().unwrap().remove(volatile);
        }
        r
    };
    let runs: Vec<Value> = records
        .iter()
        .filter(|r| r["action"] == "run_command" && r.to_string().contains("/bin/bash"))
        .map(shape)
        .collect();
    assert!(runs.len() >= 2, "{records:?}");
    assert_eq!(runs[runs.len() - 1], runs[runs.len() - 2], "{runs:?}");

    // An observe-only agent may read, never run or write.
    let watcher = agent_key(&t, "watcher", r#"["observe"]"#).await;
    let script = r#"
import json
from e2b import Sandbox
sbx = Sandbox.create()
out = {"read": sbx.files.read("/home/user/hello.py")}
for name, call in [("run", lambda: sbx.commands.run("touch /home/user/nope")),
                   ("write", lambda: sbx.files.write("/home/user/nope", "x"))]:
    try:
        call()
        out[name] = "allowed"
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
print(json.dumps(out))
"#;
    let out = harness(&python, server, &watcher, script).await;
    assert_eq!(out["read"], "print(6 * 7)\n", "{out}");
    for name in ["run", "write"] {
        let refused = out[name]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: {out}"));
        assert!(
            refused[0].as_str().unwrap().ends_with("Exception"),
            "{name}: {out}"
        );
    }
    let (_, v) = exec(server, &t.ana, room, "ls nope 2>&1 || true").await;
    assert!(
        v["stdout"].as_str().unwrap().contains("No such file"),
        "{v}"
    );

    // A person's key names the room; anything else is a clear 400.
    let script = r#"
import json, os
from e2b import Sandbox
out = {}
try:
    Sandbox.create()
except Exception as e:
    out["unnamed"] = [type(e).__name__, str(e)]
sbx = Sandbox.create(metadata={"room": os.environ["ROOM"]})
out["id"] = sbx.sandbox_id
out["who"] = sbx.commands.run("echo $((6*7))").stdout
print(json.dumps(out))
"#
    .replace("os.environ[\"ROOM\"]", &format!("{room:?}"));
    let out = harness(&python, server, &t.ben, &script).await;
    assert!(
        out["unnamed"][1].as_str().unwrap().contains("metadata"),
        "{out}"
    );
    assert_eq!(out["id"], room.as_str(), "{out}");
    assert_eq!(out["who"], "42\n", "{out}");
}

/// The SDK's file system calls and commands addressed by pid, on the room's workspace: list
/// (with depth), exists, get_info, make_dir (False when it is there), rename, remove; a
/// background command listed, killed (its wait raises with exit code -1), gone from the list.
/// Each is the room's operation: an observe-only key lists but cannot make, move or remove.
#[tokio::test]
async fn the_sdk_files_and_processes_calls_work_on_the_workspace() {
    let Some((python, _storage, t, key)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);
    let script = r#"
import json, time
from e2b import Sandbox, CommandExitException
sbx = Sandbox.create()
out = {}
sbx.files.write("/home/user/src/app.py", "x = 1\n")
sbx.files.write("/home/user/zipped.txt", "sent as gzip\n", gzip=True)
out["zipped"] = sbx.files.read("/home/user/zipped.txt")
sbx.files.remove("/home/user/zipped.txt")
out["made"] = sbx.files.make_dir("/home/user/data/raw")
out["made_again"] = sbx.files.make_dir("/home/user/data/raw")
out["list1"] = sorted((e.name, e.type.value, e.path) for e in sbx.files.list("/home/user"))
out["list2"] = sorted(e.path for e in sbx.files.list("/home/user", depth=2))
out["exists"] = [sbx.files.exists("/home/user/src/app.py"), sbx.files.exists("/home/user/nope")]
info = sbx.files.get_info("/home/user/src/app.py")
out["info"] = [info.name, info.type.value, info.size]
moved = sbx.files.rename("/home/user/src/app.py", "/home/user/src/main.py")
out["moved"] = moved.path
out["read_moved"] = sbx.files.read("/home/user/src/main.py")
sbx.files.remove("/home/user/data/raw")
out["after_remove"] = sbx.files.exists("/home/user/data/raw")
try:
    sbx.files.read("/etc/passwd")
    out["outside"] = "read"
except Exception as e:
    out["outside"] = type(e).__name__
h = sbx.commands.run("echo started; sleep 60", background=True)
time.sleep(0.5)
out["listed"] = [p.pid == h.pid for p in sbx.commands.list()]
out["killed"] = sbx.commands.kill(h.pid)
try:
    h.wait()
    out["waited"] = "finished"
except CommandExitException as e:
    out["waited"] = e.exit_code
out["listed_after"] = len(sbx.commands.list())
out["kill_again"] = sbx.commands.kill(h.pid)
print(json.dumps(out))
"#;
    let out = harness(&python, server, &key, script).await;
    assert_eq!(out["zipped"], "sent as gzip\n", "{out}");
    assert_eq!(out["made"], true, "{out}");
    assert_eq!(out["made_again"], false, "{out}");
    let list1 = serde_json::json!([
        ["data", "dir", "/home/user/data"],
        ["src", "dir", "/home/user/src"]
    ]);
    assert_eq!(out["list1"], list1, "{out}");
    let list2 = serde_json::json!([
        "/home/user/data",
        "/home/user/data/raw",
        "/home/user/src",
        "/home/user/src/app.py"
    ]);
    assert_eq!(out["list2"], list2, "{out}");
    assert_eq!(out["exists"], serde_json::json!([true, false]), "{out}");
    assert_eq!(
        out["info"],
        serde_json::json!(["app.py", "file", 6]),
        "{out}"
    );
    assert_eq!(out["moved"], "/home/user/src/main.py", "{out}");
    assert_eq!(out["read_moved"], "x = 1\n", "{out}");
    assert_eq!(out["after_remove"], false, "{out}");
    assert!(
        out["outside"].as_str().unwrap().ends_with("Exception"),
        "{out}"
    );
    assert_eq!(out["listed"], serde_json::json!([true]), "{out}");
    assert_eq!(out["killed"], true, "{out}");
    assert_eq!(out["waited"], -1, "{out}");
    assert_eq!(out["listed_after"], 0, "{out}");
    assert_eq!(out["kill_again"], false, "{out}");
    // The killed command's unit is gone.
    let (_, v) = exec(server, &t.ana, room, "pgrep -f 'sleep 6[0]' || echo none").await;
    assert_eq!(v["stdout"], "none\n", "{v}");

    let watcher = agent_key(&t, "watcher", r#"["observe"]"#).await;
    let script = r#"
import json
from e2b import Sandbox
sbx = Sandbox.create()
out = {"list": sorted(e.name for e in sbx.files.list("/home/user"))}
for name, call in [("make_dir", lambda: sbx.files.make_dir("/home/user/x")),
                   ("rename", lambda: sbx.files.rename("/home/user/src", "/home/user/y")),
                   ("remove", lambda: sbx.files.remove("/home/user/src"))]:
    try:
        call()
        out[name] = "allowed"
    except Exception as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"#;
    let out = harness(&python, server, &watcher, script).await;
    assert_eq!(out["list"], serde_json::json!(["data", "src"]), "{out}");
    for name in ["make_dir", "rename", "remove"] {
        assert!(
            out[name].as_str().unwrap().ends_with("Exception"),
            "{name}: {out}"
        );
    }
}

/// A command's standard input (`stdin=True`, `send_stdin`, `close_stdin`), attaching to a
/// running command (`commands.connect`: its output from then on, and its end), and a PTY
/// (`pty.create`, `resize`, keys typed with `send_stdin`: the shell in it sees the new size
/// and runs what was typed; `kill`), through the stock SDK. What the agent typed was charged
/// as commands, one per line, as at the room's terminal.
#[tokio::test]
async fn the_sdk_feeds_commands_and_drives_ptys() {
    let Some((python, _storage, t, key)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);
    let script = r#"
import json, time
from e2b import Sandbox, CommandExitException
from e2b.sandbox.commands.command_handle import PtySize
sbx = Sandbox.create()
out = {}
h = sbx.commands.run("cat; echo done >&2", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "hello\n")
sbx.commands.send_stdin(h.pid, "world\n")
sbx.commands.close_stdin(h.pid)
r = h.wait()
out["cat"] = [r.stdout, r.stderr, r.exit_code]
try:
    sbx.commands.send_stdin(sbx.commands.run("sleep 5", background=True).pid, "x")
    out["no_stdin"] = "sent"
except Exception as e:
    out["no_stdin"] = type(e).__name__
h2 = sbx.commands.run("echo one; sleep 1.5; echo two; exit 3", background=True)
time.sleep(0.5)
c = sbx.commands.connect(h2.pid)
try:
    c.wait()
    out["connected"] = "exit 0"
except CommandExitException as e:
    out["connected"] = [e.stdout, e.exit_code]
p = sbx.pty.create(PtySize(rows=24, cols=80))
sbx.pty.resize(p.pid, PtySize(rows=30, cols=100))
sbx.pty.send_stdin(p.pid, b"stty size; echo $((6*7))x\n")
seen = ""
deadline = time.time() + 30
for _, _, data in p:
    if data:
        seen += data.decode(errors="replace")
    if "30 100" in seen and "42x" in seen or time.time() > deadline:
        break
out["pty"] = ["30 100" in seen, "42x" in seen]
out["pty_listed"] = any(x.pid == p.pid for x in sbx.commands.list())
out["pty_killed"] = sbx.pty.kill(p.pid)
print(json.dumps(out))
"#;
    let out = harness(&python, server, &key, script).await;
    assert_eq!(
        out["cat"],
        serde_json::json!(["hello\nworld\n", "done\n", 0]),
        "{out}"
    );
    assert!(
        out["no_stdin"].as_str().unwrap().ends_with("Exception"),
        "{out}"
    );
    assert_eq!(out["connected"], serde_json::json!(["two\n", 3]), "{out}");
    assert_eq!(out["pty"], serde_json::json!([true, true]), "{out}");
    assert_eq!(out["pty_listed"], true, "{out}");
    assert_eq!(out["pty_killed"], true, "{out}");
    // The PTY's shell is gone with its unit.
    let (_, v) = exec(server, &t.ana, room, "pgrep -f 'bash -[i] -l' || echo none").await;
    assert_eq!(v["stdout"], "none\n", "{v}");
    // Each line the agent typed (the two into `cat`, the one into the PTY) was decided and
    // charged as a command typed at a terminal is.
    let typed = typed_commands(server, &t.ana, room).await;
    assert_eq!(typed, 3);
}

/// `files.watch_dir`, both ways the SDKs watch: the sync SDK's watcher (`CreateWatcher`, then
/// `GetWatcherEvents`) and the async SDK's stream (`WatchDir`). What the agent writes, renames
/// and removes, and what its commands do to the workspace, are its events, named relative to the
/// watched directory; a recursive watch sees below it.
#[tokio::test]
async fn the_sdk_watches_the_workspace() {
    let Some((python, _storage, t, key)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);
    let script = r#"
import json, time, asyncio
from e2b import Sandbox, AsyncSandbox
sbx = Sandbox.create()
sbx.files.make_dir("/home/user/src/deep")
w = sbx.files.watch_dir("/home/user/src")
r = sbx.files.watch_dir("/home/user", recursive=True)
sbx.files.write("/home/user/src/a.txt", "a")
sbx.files.write("/home/user/src/deep/b.txt", "b")
sbx.commands.run("touch src/c.txt")
def drain(watcher, want):
    seen = []
    deadline = time.time() + 20
    while time.time() < deadline and not all(x in seen for x in want):
        seen += [[e.name, e.type.name] for e in watcher.get_new_events()]
        time.sleep(0.2)
    return seen
out = {}
out["flat"] = drain(w, [["a.txt", "CREATE"], ["c.txt", "CREATE"]])
out["deep"] = drain(r, [["src/deep/b.txt", "CREATE"]])
sbx.files.rename("/home/user/src/a.txt", "/home/user/src/a2.txt")
sbx.files.remove("/home/user/src/c.txt")
out["flat2"] = drain(w, [["a.txt", "REMOVE"], ["a2.txt", "CREATE"], ["c.txt", "REMOVE"]])
w.stop()
r.stop()
try:
    w.get_new_events()
    out["after_stop"] = "events"
except Exception as e:
    out["after_stop"] = type(e).__name__

async def stream():
    a = await AsyncSandbox.connect(sbx.sandbox_id)
    got = []
    h = await a.files.watch_dir("/home/user/src", lambda e: got.append([e.name, e.type.name]))
    await a.files.write("/home/user/src/s.txt", "s")
    for _ in range(100):
        if ["s.txt", "CREATE"] in got:
            break
        await asyncio.sleep(0.2)
    await h.stop()
    return got
out["stream"] = asyncio.run(stream())
print(json.dumps(out))
"#;
    let out = harness(&python, server, &key, script).await;
    let has = |list: &str, name: &str, kind: &str| {
        out[list]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!([name, kind]))
    };
    assert!(has("flat", "a.txt", "CREATE"), "{out}");
    assert!(has("flat", "c.txt", "CREATE"), "{out}");
    // Not recursive: what is below `deep` is not its business.
    assert!(!has("flat", "deep/b.txt", "CREATE"), "{out}");
    assert!(has("deep", "src/deep/b.txt", "CREATE"), "{out}");
    assert!(has("flat2", "a.txt", "REMOVE"), "{out}");
    assert!(has("flat2", "a2.txt", "CREATE"), "{out}");
    assert!(has("flat2", "c.txt", "REMOVE"), "{out}");
    assert!(
        out["after_stop"].as_str().unwrap().ends_with("Exception"),
        "{out}"
    );
    assert!(has("stream", "s.txt", "CREATE"), "{out}");
    let _ = room;
}

/// `e2b_code_interpreter`'s `run_code`: Python inside the room's sandbox, stateful (a name
/// defined in one call is there in the next), stdout and stderr streamed as printed, the last
/// expression's value as the result's `text`, an exception as `error` (name, value,
/// traceback), `envs`, and separate contexts (created, listed, restarted: names gone,
/// removed). Each cell was decided and charged as a command the agent typed. An observe-only
/// agent's `run_code` is refused with the SDK's exception; `kill()` ends the interpreter.
#[tokio::test]
async fn the_code_interpreter_runs_python_statefully() {
    let Some((python, _storage, t, key)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);
    let script = r#"
import json, time
from e2b_code_interpreter import Sandbox
sbx = Sandbox.create()
out = {}
e = sbx.run_code("x = 41\nprint('hi')\nx + 1")
out["first"] = [e.logs.stdout, e.text, e.error is None]
out["state"] = sbx.run_code("x * 2").text
e = sbx.run_code("import sys\nprint('oops', file=sys.stderr)\n1/0")
out["error"] = [e.error.name, e.error.value, "ZeroDivisionError" in e.error.traceback, e.logs.stderr]
seen = []
sbx.run_code("import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.7)",
             on_stdout=lambda m: seen.append(time.time()))
out["spread"] = seen[-1] - seen[0] if len(seen) >= 2 else 0
out["env"] = sbx.run_code("import os\nos.environ.get('GREETING')", envs={"GREETING": "hey"}).text
ctx = sbx.create_code_context()
sbx.run_code("y = 5", context=ctx)
out["contexts"] = [sbx.run_code("y", context=ctx).text,
                   sbx.run_code("'y' in globals()").text,
                   sorted(c.id == ctx.id for c in sbx.list_code_contexts())]
sbx.restart_code_context(ctx)
out["restarted"] = sbx.run_code("'y' in globals()", context=ctx).text
sbx.remove_code_context(ctx)
out["after_remove"] = [c.id for c in sbx.list_code_contexts()] == ["default"] or len(sbx.list_code_contexts())
print(json.dumps(out))
"#;
    let out = harness(&python, server, &key, script).await;
    assert_eq!(
        out["first"],
        serde_json::json!([["hi\n"], "42", true]),
        "{out}"
    );
    assert_eq!(out["state"], "82", "{out}");
    assert_eq!(
        out["error"],
        serde_json::json!(["ZeroDivisionError", "division by zero", true, ["oops\n"]]),
        "{out}"
    );
    // Printed 0.7 s apart, seen apart: streamed, not sent at the end.
    assert!(out["spread"].as_f64().unwrap() > 1.0, "{out}");
    assert_eq!(out["env"], "'hey'", "{out}");
    assert_eq!(
        out["contexts"],
        serde_json::json!(["5", "False", [false, true]]),
        "{out}"
    );
    assert_eq!(out["restarted"], "False", "{out}");
    assert_eq!(out["after_remove"], true, "{out}");
    // Each cell, one line typed into the interpreter, was decided and charged as a command.
    let typed = typed_commands(server, &t.ana, room).await;
    assert_eq!(typed, 9);

    let watcher = agent_key(&t, "watcher", r#"["observe"]"#).await;
    let script = r#"
import json
from e2b_code_interpreter import Sandbox
sbx = Sandbox.create()
try:
    sbx.run_code("1 + 1")
    out = "ran"
except Exception as e:
    out = type(e).__name__
print(json.dumps({"run": out}))
"#;
    let out = harness(&python, server, &watcher, script).await;
    assert!(out["run"].as_str().unwrap().ends_with("Exception"), "{out}");

    let script = r#"
import json
from e2b_code_interpreter import Sandbox
sbx = Sandbox.create()
sbx.run_code("z = 1")
sbx.kill()
sbx = Sandbox.create()
# Two cells at once on a context not yet started: one interpreter runs both.
import threading
cells = [threading.Thread(target=sbx.run_code, args=(f"v{n} = {n}",)) for n in range(2)]
for c in cells: c.start()
for c in cells: c.join()
out = {"z": sbx.run_code("'z' in globals()").text}
out["both"] = sbx.run_code("[n for n in ('v0', 'v1') if n in globals()]").text
out["contexts"] = len(sbx.list_code_contexts())
print(json.dumps(out))
"#;
    let out = harness(&python, server, &key, script).await;
    assert_eq!(out["z"], "False", "{out}");
    assert_eq!(out["both"], "['v0', 'v1']", "{out}");
    assert_eq!(out["contexts"], 1, "{out}");
}

/// The control plane's other calls, through the stock SDK: `Sandbox.connect(id)` (a fresh
/// access token: the old one opens nothing), `get_info()`, `Sandbox.list()`, `set_timeout()`
/// (the session's end moves), and a session that times out ends what it ran.
#[tokio::test]
async fn connect_info_list_and_timeouts_work_through_the_sdk() {
    let Some((python, _storage, t, key)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);
    let script = r#"
import json, time
from datetime import datetime
from e2b import Sandbox
sbx = Sandbox.create(timeout=120)
out = {}
info = sbx.get_info()
out["info"] = [info.sandbox_id, info.state.value if hasattr(info.state, "value") else str(info.state)]
out["life"] = round((info.end_at - info.started_at).total_seconds())
sbx.set_timeout(600)
info = sbx.get_info()
out["life_after"] = round((info.end_at - datetime.now(info.end_at.tzinfo)).total_seconds())
out["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()]
again = Sandbox.connect(sbx.sandbox_id)
out["again"] = again.commands.run("echo connected").stdout
try:
    sbx.commands.run("echo old token")
    out["old_token"] = "worked"
except Exception as e:
    out["old_token"] = type(e).__name__
again.commands.run("sleep 300", background=True)
again.set_timeout(2)
print(json.dumps(out))
"#;
    let out = harness(&python, server, &key, script).await;
    assert_eq!(out["info"], serde_json::json!([room, "running"]), "{out}");
    assert_eq!(out["life"], 120, "{out}");
    let after = out["life_after"].as_i64().unwrap();
    assert!((590..=600).contains(&after), "{out}");
    assert_eq!(out["listed"], serde_json::json!([room]), "{out}");
    assert_eq!(out["again"], "connected\n", "{out}");
    assert!(
        out["old_token"].as_str().unwrap().ends_with("Exception"),
        "{out}"
    );
    // What the door does not serve says so (never the app's pages).
    let pause = format!("/api/e2b/sandboxes/{room}/pause");
    let (status, body) = post(server, &key, &pause, "{}").await;
    assert_eq!(status, 501, "{body}");
    assert!(body.to_string().contains("not supported"), "{body}");
    // The session timed out: what it ran goes, the room's sandbox does not.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = exec(server, &t.ana, room, "pgrep -f 'sleep 30[0]' || echo none").await;
        if v["stdout"] == "none\n" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still running: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `get_host(port)` with the URL variables and previews on: the preview origin is the
/// sandboxes' domain, and `{port}-{room}.<preview host>` is that port of the room's sandbox
/// under the preview rules: nobody without the session's token reaches a port that is not
/// public; the session does (as a room preview, made for it: the agent holds `publish`), and
/// what listens there never sees the token.
#[tokio::test]
async fn get_host_names_a_port_the_session_reaches() {
    let Some(python) = sdk_python() else {
        return;
    };
    let storage = Storage::new(&Backend::Sqlite).await;
    let (t, port) = preview_team(&storage, &[]).await;
    let key = agent_key(&t, "harness", r#"["observe","edit","type","publish"]"#).await;
    let (server, room) = (&t.server, &t.room);
    // The port's app answers with the headers it was sent.
    let app = r#"import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(sorted(k.lower() for k in self.headers.keys())).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 3000), H).serve_forever()
"#;
    let script = format!(
        r#"
import json, time, httpx
from e2b import Sandbox
sbx = Sandbox.create()
sbx.files.write("/home/user/headers.py", {app:?})
sbx.commands.run("exec python3 headers.py", background=True)
host = sbx.get_host(3000)
def get(headers):
    for _ in range(100):
        r = httpx.get("http://127.0.0.1:{port}/", headers={{"Host": host, **headers}})
        if r.status_code not in (502, 503):
            return [r.status_code, r.text]
        time.sleep(0.2)
    return ["never up"]
out = {{"host": host, "stranger": get({{}})[0],
       "mine": get({{"E2B-Traffic-Access-Token": sbx.traffic_access_token}})}}
print(json.dumps(out))
"#
    );
    let out = harness(&python, server, &key, &script).await;
    assert_eq!(
        out["host"],
        format!("3000-{room}.preview.localhost:{port}"),
        "{out}"
    );
    assert_eq!(out["stranger"], 403, "{out}");
    assert_eq!(out["mine"][0], 200, "{out}");
    let seen: Vec<String> = serde_json::from_str(out["mine"][1].as_str().unwrap()).unwrap();
    assert!(
        !seen
            .iter()
            .any(|h| h.contains("token") || h == "authorization"),
        "the port's app saw the caller's token: {seen:?}"
    );
}

/// The pending approval of a command whose argv holds `needle`, once someone can see it.
async fn pending_command(t: &Room, needle: &str) -> String {
    let path = format!("/api/rooms/{}/approvals", t.room);
    for _ in 0..400 {
        let items = get_json(&t.server, &t.ana, &path).await;
        let found = items.as_array().unwrap().iter().find(|a| {
            a["state"] == "pending"
                && a["action"] == "run_command"
                && a["params"].to_string().contains(needle)
        });
        if let Some(a) = found {
            return a["id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pending approval for a command with {needle}");
}

/// Ana decides approval `id`.
async fn decide(t: &Room, id: &str, approve: bool) {
    let path = format!("/api/rooms/{}/approvals/{id}/decision", t.room);
    let body = format!(r#"{{"approve":{approve}}}"#);
    let (status, v) = post(&t.server, &t.ana, &path, &body).await;
    assert_eq!(status, 200, "{v}");
}

/// An agent in approval mode, through the stock SDK: `commands.run` waits (it has no "ask
/// again later") until a person decides on exactly that command; approved, it runs and the
/// call answers its output; denied, it never runs and the SDK raises.
#[tokio::test]
async fn an_approval_mode_agents_command_waits_for_a_person() {
    let Some((python, _storage, t, _)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);
    let agents = format!("/api/rooms/{room}/agents");
    let body = r#"{"name":"careful","capabilities":["observe","edit","type"],"ttl_s":3600,"approval_mode":true}"#;
    let (status, a) = post(server, &t.ana, &agents, body).await;
    assert_eq!(status, 201, "{a}");
    let key = a["token"].as_str().unwrap().to_owned();
    let script = r#"
import json
from e2b import Sandbox
sbx = Sandbox.create()
out = {"ran": sbx.commands.run("echo yes > approved.txt; echo ran").stdout}
try:
    sbx.commands.run("touch denied.txt")
    out["denied"] = "ran"
except Exception as e:
    out["denied"] = [type(e).__name__, str(e)]
print(json.dumps(out))
"#;
    let harnessing = harness(&python, server, &key, script);
    let deciding = async {
        let first = pending_command(&t, "approved.txt").await;
        // Nothing ran while it waited.
        let (_, v) = exec(server, &t.ana, room, "ls approved.txt 2>&1 || true").await;
        assert!(
            v["stdout"].as_str().unwrap().contains("No such file"),
            "{v}"
        );
        decide(&t, &first, true).await;
        let second = pending_command(&t, "denied.txt").await;
        decide(&t, &second, false).await;
    };
    let (out, ()) = tokio::join!(harnessing, deciding);
    assert_eq!(out["ran"], "ran\n", "{out}");
    assert!(
        out["denied"][1].as_str().unwrap().contains("denied"),
        "{out}"
    );
    let (_, v) = exec(
        server,
        &t.ana,
        room,
        "cat approved.txt; ls denied.txt 2>&1 || true",
    )
    .await;
    let stdout = v["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with("yes\n") && stdout.contains("No such file"),
        "{v}"
    );
}

/// From where an agent's key stands: its budget stops a loop of SDK commands (the refusal the
/// SDK raises names the budget), and revoking the agent ends the command it is running
/// through the SDK at once (the call fails; the command's processes are gone).
#[tokio::test]
async fn budgets_and_revocation_reach_the_sdks_commands() {
    let Some((python, _storage, t, _)) = harnessed().await else {
        return;
    };
    let (server, room) = (&t.server, &t.room);
    let agents = format!("/api/rooms/{room}/agents");
    let body = r#"{"name":"frugal","capabilities":["observe","edit","type","spend"],"ttl_s":3600,"budget":{"execs":3}}"#;
    let (status, a) = post(server, &t.ana, &agents, body).await;
    assert_eq!(status, 201, "{a}");
    let key = a["token"].as_str().unwrap().to_owned();
    let script = r#"
import json
from e2b import Sandbox
sbx = Sandbox.create()
ran = 0
refused = None
for i in range(10):
    try:
        sbx.commands.run("true")
        ran += 1
    except Exception as e:
        refused = [type(e).__name__, str(e)]
        break
print(json.dumps({"ran": ran, "refused": refused}))
"#;
    let out = harness(&python, server, &key, script).await;
    assert_eq!(out["ran"], 3, "{out}");
    assert!(
        out["refused"][1].as_str().unwrap().contains("budget"),
        "{out}"
    );

    let (status, a) = post(
        server,
        &t.ana,
        &agents,
        r#"{"name":"leaver","capabilities":["observe","edit","type"],"ttl_s":3600}"#,
    )
    .await;
    assert_eq!(status, 201, "{a}");
    let (key, agent_id) = (
        a["token"].as_str().unwrap().to_owned(),
        a["agent_id"].as_str().unwrap().to_owned(),
    );
    let script = r#"
import json, time
from e2b import Sandbox
sbx = Sandbox.create()
start = time.time()
try:
    sbx.commands.run("echo started > started.txt; sleep 30; touch finished.txt")
    out = {"ended": "finished"}
except Exception as e:
    out = {"ended": [type(e).__name__, str(e)]}
out["took"] = time.time() - start
print(json.dumps(out))
"#;
    let harnessing = harness(&python, server, &key, script);
    let revoking = async {
        let started = server.url(&format!("/api/rooms/{room}/files/started.txt"));
        for _ in 0..400 {
            if http(&started, "GET", Some(&t.ana), None).await.0 == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let url = server.url(&format!("{agents}/{agent_id}"));
        let (status, v) = http(&url, "DELETE", Some(&t.ana), None).await;
        assert!(status == 204 || status == 200, "{v}");
    };
    let (out, ()) = tokio::join!(harnessing, revoking);
    assert!(out["ended"].is_array(), "the command ran to its end: {out}");
    assert!(out["took"].as_f64().unwrap() < 15.0, "{out}");
    let (_, v) = exec(
        server,
        &t.ana,
        room,
        "pgrep -f 'sleep 3[0]' || echo none; ls finished.txt 2>&1 || true",
    )
    .await;
    let stdout = v["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with("none\n") && stdout.contains("No such file"),
        "{v}"
    );
}

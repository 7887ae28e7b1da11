//! The namespace tier against the real kernel: bubblewrap, seccomp, cgroups, the agent.
#![allow(clippy::unwrap_used)]

use coderoom_sandbox::proto::{Op, Reply};
use coderoom_sandbox::{AgentCommand, Backend, Event, Limits, Namespace, Sandbox};
use serde_bytes::ByteBuf;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn backend() -> Namespace {
    let agent = AgentCommand {
        exe: env!("CARGO_BIN_EXE_coderoom-agent").into(),
        args: vec![],
    };
    match Backend::namespace(agent, None) {
        (Backend::Namespace(ns), _) => *ns,
        (_, why) => panic!("the namespace tier must work on this host: {why}"),
    }
}

fn name(tag: &str) -> String {
    format!("t{}{}", tag, std::process::id())
}

/// Asserts a command ran to exit code 0.
fn ran(r: &Reply) {
    assert!(
        matches!(
            r,
            Reply::Exec {
                exit_code: Some(0),
                ..
            }
        ),
        "{r:?}"
    );
}

async fn sh(sb: &Sandbox, script: &str) -> (Option<i32>, String, String) {
    let op = Op::Exec {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        cwd: String::new(),
        timeout_ms: 20_000,
        max_output: 1 << 20,
        actor: String::new(),
    };
    match sb.call(op, T).await.unwrap() {
        Reply::Exec {
            exit_code,
            stdout,
            stderr,
            ..
        } => (
            exit_code,
            String::from_utf8_lossy(&stdout).into_owned(),
            String::from_utf8_lossy(&stderr).into_owned(),
        ),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn files_exec_pty_and_snapshots() {
    let ns = backend();
    let (sb, mut events, receipt) = ns.start(&name("a"), &Limits::default()).await.unwrap();
    assert_eq!(receipt.tier, "namespace");
    assert!(receipt.implementation.contains("bubblewrap"), "{receipt:?}");

    let (code, out, _) = sh(
        &sb,
        "echo hello; id -u; echo $$; cat /proc/1/cmdline | tr '\\0' ' '",
    )
    .await;
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hello");
    assert_eq!(lines[1], "1000");
    assert!(lines[3].contains("/.coderoom/agent"), "{out}");

    let write = Op::WriteFile {
        path: "src/main.rs".into(),
        data: ByteBuf::from(b"fn main() {}\n".to_vec()),
    };
    assert_eq!(sb.call(write, T).await.unwrap(), Reply::Done);
    let (_, out, _) = sh(&sb, "cat /workspace/src/main.rs").await;
    assert_eq!(out, "fn main() {}\n");
    let read = Op::ReadFile {
        path: "src/main.rs".into(),
        max_bytes: 100,
    };
    assert_eq!(
        sb.call(read, T).await.unwrap(),
        Reply::File(ByteBuf::from(b"fn main() {}\n".to_vec()))
    );
    // A symlink out of the workspace is not followed by file operations.
    sh(&sb, "ln -s /etc/passwd leak; ln -s src/main.rs inside").await;
    let leak = Op::ReadFile {
        path: "leak".into(),
        max_bytes: 1 << 20,
    };
    let err = sb.call(leak, T).await.unwrap_err();
    assert!(err.to_string().contains("leaves the workspace"), "{err}");
    let inside = Op::ReadFile {
        path: "inside".into(),
        max_bytes: 100,
    };
    assert!(matches!(sb.call(inside, T).await.unwrap(), Reply::File(_)));
    let bad = Op::ReadFile {
        path: "../etc/passwd".into(),
        max_bytes: 100,
    };
    assert!(sb
        .call(bad, T)
        .await
        .unwrap_err()
        .to_string()
        .contains("invalid path"));

    // PTY: input reaches the shell, output comes back as events.
    let open = Op::PtyOpen {
        argv: vec!["/bin/sh".into()],
        cols: 80,
        rows: 24,
    };
    assert_eq!(sb.call(open, T).await.unwrap(), Reply::Done);
    sb.send(Op::PtyInput(ByteBuf::from(b"echo pty-$((6*7))\n".to_vec())))
        .await
        .unwrap();
    let mut seen = String::new();
    tokio::time::timeout(T, async {
        while !seen.contains("pty-42") {
            if let Some(Event::PtyOutput(d)) = events.recv().await {
                seen.push_str(&String::from_utf8_lossy(&d));
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no PTY output: {seen:?}"));

    // Snapshot, then restore into a fresh sandbox.
    let mut tar = Vec::new();
    let n = sb.snapshot(&mut tar, 64 << 20, T).await.unwrap();
    assert_eq!(n as usize, tar.len());
    sb.kill();
    assert_eq!(sb.ended().await, coderoom_sandbox::Ended::Stopped);

    let (sb2, _ev, _) = ns.start(&name("b"), &Limits::default()).await.unwrap();
    sb2.restore(&mut &tar[..], T).await.unwrap();
    let (_, out, _) = sh(&sb2, "cat src/main.rs; readlink inside").await;
    assert_eq!(out, "fn main() {}\nsrc/main.rs\n");
    sb2.kill();
    sb2.ended().await;
}

/// Every way out that a room's code might try, run inside a real sandbox.
#[tokio::test]
async fn escape_canaries_all_fail() {
    let ns = backend();
    let (sb, _events, receipt) = ns.start(&name("c"), &Limits::default()).await.unwrap();
    assert!(receipt.network.contains("loopback only"));

    // A host file outside the mounts, e.g. a server's data directory.
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("coderoom.db");
    std::fs::write(&secret, "host secret").unwrap();
    let (code, _, err) = sh(&sb, &format!("cat {}", secret.display())).await;
    assert_ne!(code, Some(0));
    assert!(err.contains("No such file"), "{err}");
    let (_, out, _) = sh(
        &sb,
        "ls / | tr '\\n' ' '; ls /root /home /var /srv 2>&1 | head -3",
    )
    .await;
    assert!(!out.contains("coderoom.db"));
    assert!(out.contains("No such file"), "{out}");

    // Writes to the base root.
    for target in [
        "/usr/canary",
        "/canary",
        "/etc/canary",
        "/bin/canary",
        "/.coderoom/canary",
    ] {
        let (code, _, err) = sh(&sb, &format!("echo x > {target}")).await;
        assert_ne!(code, Some(0), "{target} was writable");
        assert!(
            err.contains("Read-only") || err.contains("Permission denied"),
            "{target}: {err}"
        );
    }

    // Any TCP address, including a listener on the host's loopback.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let probe = format!(
        "import socket\nfor a in [('127.0.0.1',{port}),('10.0.2.2',80),('1.1.1.1',443)]:\n  s=socket.socket(); s.settimeout(2)\n  try:\n    s.connect(a); print('CONNECTED', a)\n  except OSError as e: print('refused', a, e.errno)\n"
    );
    let (_, out, err) = sh(&sb, &format!("python3 -c \"{probe}\"")).await;
    assert!(!out.contains("CONNECTED"), "{out}{err}");
    assert_eq!(out.matches("refused").count(), 3, "{out}{err}");
    assert!(
        listener.accept().is_err(),
        "the host listener saw a connection"
    );

    // Host processes are invisible, so they cannot be signalled; ptrace is filtered.
    let me = std::process::id();
    let (code, _, _) = sh(&sb, &format!("kill -0 {me}")).await;
    assert_ne!(code, Some(0));
    let (_, out, _) = sh(&sb, "ls /proc | grep -E '^[0-9]+$' | wc -l").await;
    let visible: u32 = out.trim().parse().unwrap();
    assert!(visible < 10, "{visible} processes visible");

    // Denied syscalls fail with EPERM (numbers for x86_64); mount too. Every x32 number does,
    // even one no kernel assigns (which would otherwise fail with ENOSYS).
    let calls = "import ctypes,os\nlibc=ctypes.CDLL(None,use_errno=True)\nfor name,nr in [('ptrace',101),('mount',165),('bpf',321),('keyctl',250),('add_key',248),('kexec_load',246),('perf_event_open',298),('userfaultfd',323),('unshare',272),('x32-getpid',0x40000000|39),('x32-mount',0x40000000|165),('x32-rt_sigaction',0x40000000|512),('x32-last',0x40000000|547),('x32-unassigned',0x40000000|4000)]:\n  ctypes.set_errno(0)\n  r=libc.syscall(nr,16,1,0,0,0,0)\n  print(name, r, ctypes.get_errno())\n";
    let (_, out, err) = sh(&sb, &format!("python3 -c \"{calls}\"")).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 14, "{out}{err}");
    for line in lines {
        assert!(line.ends_with(" -1 1"), "not refused with EPERM: {line}");
    }
    let (code, _, _) = sh(&sb, "mount -t tmpfs none /tmp").await;
    assert_ne!(code, Some(0));

    // The 32-bit ABI kills the caller (SIGSYS).
    let c = "int main(void){int r; __asm__ volatile(\\\"int \\$0x80\\\":\\\"=a\\\"(r):\\\"a\\\"(20)); return 0;}";
    let (code, out, err) = sh(
        &sb,
        &format!("echo \"{c}\" > /tmp/i.c && gcc -o /tmp/i /tmp/i.c && /tmp/i; echo status $?"),
    )
    .await;
    if err.contains("gcc: not found") {
        panic!("gcc is needed inside the sandbox for the 32-bit canary: {err}");
    }
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("status 159"),
        "int 0x80 was not killed: {out}{err}"
    );

    // Every sandbox process runs filtered and without new privileges.
    let (_, out, _) = sh(
        &sb,
        "sleep 5 & for p in 1 $$ $!; do grep -E '^(Seccomp|NoNewPrivs):' /proc/$p/status; done",
    )
    .await;
    assert_eq!(out.matches("Seccomp:\t2").count(), 3, "{out}");
    assert_eq!(out.matches("NoNewPrivs:\t1").count(), 3, "{out}");

    sb.kill();
    sb.ended().await;
}

/// The directories of a sandbox's cgroup, where the code makes them on this host (v1: memory,
/// pids, cpu; v2: one).
fn cgroup_dirs(sandbox: &str) -> Vec<std::path::PathBuf> {
    coderoom_sandbox::cgroup::Layout::detect()
        .expect("these tests run as root with cgroups")
        .group_dirs(sandbox)
}

/// Host pids of a sandbox's processes and their pids inside (from its cgroup).
fn sandbox_pids(sandbox: &str) -> Vec<(u32, u32)> {
    let procs = cgroup_dirs(sandbox)
        .into_iter()
        .find_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .unwrap_or_default();
    procs
        .lines()
        .filter_map(|l| {
            let host: u32 = l.trim().parse().ok()?;
            let status = std::fs::read_to_string(format!("/proc/{host}/status")).ok()?;
            let ns = status.lines().find(|l| l.starts_with("NSpid:"))?;
            let inner: u32 = ns.split_whitespace().last()?.parse().ok()?;
            Some((host, inner))
        })
        .collect()
}

#[tokio::test]
async fn fork_bombs_memory_hogs_and_disk_fillers_are_contained() {
    let ns = backend();
    ns.cgroups().expect("these tests run as root with cgroups");
    let limits = Limits {
        memory_bytes: 192 << 20,
        pids: 64,
        cpu_millis: 500,
        workspace_bytes: 16 << 20,
    };
    let n = name("l");
    let (sb, _events, _) = ns.start(&n, &limits).await.unwrap();

    // Fork bomb: forks are refused at the pids limit; the sandbox still answers afterwards.
    let bomb = Op::Exec {
        argv: vec![
            "/bin/bash".into(),
            "-c".into(),
            "b(){ b|b& }; b; sleep 2".into(),
        ],
        cwd: String::new(),
        timeout_ms: 3000,
        max_output: 4096,
        actor: String::new(),
    };
    sb.call(bomb, T).await.unwrap();
    assert!(sb.pressure().pids_refused > 0, "{:?}", sb.pressure());
    let (code, out, _) = sh(&sb, "echo alive").await;
    assert_eq!((code, out.as_str()), (Some(0), "alive\n"));

    // Memory hog: killed by the OOM killer inside the group; the agent survives.
    let (code, _, _) = sh(&sb, "python3 -c \"a = b'x' * (400 << 20); print(len(a))\"").await;
    assert_ne!(code, Some(0));
    assert!(sb.pressure().oom_kills > 0, "{:?}", sb.pressure());
    let (code, _, _) = sh(&sb, "true").await;
    assert_eq!(code, Some(0));

    // Disk filler: the workspace quota stops it.
    let (code, _, err) = sh(&sb, "dd if=/dev/zero of=/workspace/fill bs=1M count=64").await;
    assert_ne!(code, Some(0));
    assert!(err.contains("File size limit exceeded"), "{err}");
    let (code, _, err) = sh(
        &sb,
        "for i in 1 2 3 4; do dd if=/dev/zero of=/workspace/f$i bs=1M count=6 || exit 1; done",
    )
    .await;
    assert_ne!(code, Some(0));
    assert!(err.contains("No space left"), "{err}");
    let (_, out, _) = sh(
        &sb,
        "rm /workspace/f*; echo ok > /workspace/after; cat /workspace/after",
    )
    .await;
    assert_eq!(out, "ok\n");

    // Endless output is capped and the command ends at its timeout.
    let yes = Op::Exec {
        argv: vec!["yes".into()],
        cwd: String::new(),
        timeout_ms: 500,
        max_output: 1 << 16,
        actor: String::new(),
    };
    match sb.call(yes, T).await.unwrap() {
        Reply::Exec {
            stdout,
            truncated,
            timed_out,
            ..
        } => {
            assert_eq!(stdout.len(), 1 << 16);
            assert!(truncated && timed_out);
        }
        other => panic!("{other:?}"),
    }

    // Every directory of its cgroup exists while it runs (memory, pids and cpu on v1)...
    let dirs = cgroup_dirs(&n);
    assert!(
        !dirs.is_empty() && dirs.iter().all(|d| d.exists()),
        "{dirs:?}"
    );
    // ...and its CPU is held to the limit: half a CPU is 50 ms of every 100 ms period, and
    // two busy loops (up to two CPUs' worth) are throttled to it.
    let cpu = |file: &str| {
        dirs.iter()
            .find_map(|d| std::fs::read_to_string(d.join(file)).ok())
            .map(|v| v.trim().to_owned())
    };
    match (
        cpu("cpu.max"),
        cpu("cpu.cfs_quota_us"),
        cpu("cpu.cfs_period_us"),
    ) {
        (Some(max), _, _) => assert_eq!(max, "50000 100000"),
        (None, Some(quota), Some(period)) => {
            assert_eq!((quota.as_str(), period.as_str()), ("50000", "100000"))
        }
        other => panic!("no CPU limit in {dirs:?}: {other:?}"),
    }
    let (code, _, _) = sh(
        &sb,
        "for i in 1 2; do timeout 2 sh -c 'while :; do :; done' & done; wait",
    )
    .await;
    assert_eq!(code, Some(0));
    let stat = cpu("cpu.stat").expect("cpu.stat");
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(throttled > 0, "busy loops were never throttled: {stat}");
    // kill -9 of the serving agent (pid 2 inside) from the host ends the sandbox, observed.
    let agent = sandbox_pids(&n)
        .into_iter()
        .find(|(_, inner)| *inner == 2)
        .expect("agent pid");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(agent.0 as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    match tokio::time::timeout(T, sb.ended()).await.unwrap() {
        coderoom_sandbox::Ended::Died { reason } => {
            assert!(reason.contains("signal 9"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(sb.call(Op::Hello, T).await.is_err());
    // ...and every one is gone with it.
    for d in &dirs {
        assert!(!d.exists(), "{} is left behind", d.display());
    }
}

/// PID 1 reaps orphans: no zombie is left behind by commands that background children.
#[tokio::test]
async fn orphans_are_reaped() {
    let ns = backend();
    let (sb, _events, _) = ns.start(&name("z"), &Limits::default()).await.unwrap();
    for _ in 0..5 {
        sh(&sb, "(sleep 0.1 &) ; (true &) ; true").await;
    }
    // Once the orphans have exited, and been reaped: a broken reaper leaves zombies for good,
    // and this never holds.
    let count = "z=$(grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l); \
                 s=$(grep -l '^Name:.*sleep' /proc/[0-9]*/status 2>/dev/null | wc -l); echo $z $s";
    let mut last = String::new();
    let clean = tokio::time::timeout(T, async {
        loop {
            let (_, out, _) = sh(&sb, count).await;
            if out.trim() == "0 0" {
                return;
            }
            last = out;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(clean.is_ok(), "zombies and sleeps left: {last}");
    sb.kill();
    sb.ended().await;
}

/// What each connection out counts to, seen by the control plane.
fn counted(sb: &Sandbox) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use tokio::io::AsyncWriteExt;
    let actors = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = actors.clone();
    sb.on_outbound(std::sync::Arc::new(move |mut conn, actor| {
        seen.lock().unwrap().push(actor);
        tokio::spawn(async move {
            let _ = conn.write_all(b"ok\n").await;
        });
    }));
    actors
}

/// Waits until `actors` holds `n` connections, and takes them.
async fn taken(actors: &std::sync::Mutex<Vec<String>>, n: usize) -> Vec<String> {
    tokio::time::timeout(T, async {
        loop {
            if actors.lock().unwrap().len() >= n {
                return std::mem::take(&mut *actors.lock().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("connections seen: {:?}", actors.lock().unwrap()))
}

/// Every process runs for someone: a command's whole unit (`setsid`, `nohup`, a double fork)
/// for its caller, what it detached too, after the command (and stopped with its caller),
/// while what stayed in its group ends with it; a terminal job for whoever ended the
/// line it started after, however it detaches; and stopping a participant ends exactly what
/// runs for them, the terminal's shell aside.
#[tokio::test]
async fn every_process_runs_for_its_participant_and_stops_with_it() {
    let ns = backend();
    let (sb, mut events, _) = ns.start(&name("w"), &Limits::default()).await.unwrap();
    let actors = counted(&sb);
    sh(
        &sb,
        "echo 'import socket; print(socket.create_connection((\"127.0.0.1\", 3128)).recv(9))' > /workspace/c.py",
    )
    .await;
    let connect = "python3 /workspace/c.py";
    let as_ana = |script: String| Op::Exec {
        argv: vec!["/bin/sh".into(), "-c".into(), script],
        cwd: String::new(),
        timeout_ms: 20_000,
        max_output: 1 << 20,
        actor: "ana".into(),
    };
    for script in [
        format!("setsid {connect}"),
        format!("nohup {connect}"),
        format!("( {connect} > /tmp/df & ) ; while ! grep -q ok /tmp/df 2>/dev/null; do sleep 0.02; done"),
        format!("setsid -f sh -c 'sleep 0.2; {connect} > /tmp/sf' ; while ! grep -q ok /tmp/sf 2>/dev/null; do sleep 0.02; done"),
    ] {
        let r = sb.call(as_ana(script.clone()), T).await.unwrap();
        assert!(matches!(r, Reply::Exec { exit_code: Some(0), .. }), "{script}: {r:?}");
    }
    assert_eq!(taken(&actors, 4).await, vec!["ana"; 4]);
    // What a command leaves in its group ends with it; what it detached runs on (a server it
    // started), still ana's: its connections count to her, and stopping her ends it.
    let r = sb
        .call(
            as_ana(format!("setsid sleep 1001 >/dev/null 2>&1 & nohup sleep 1002 >/dev/null 2>&1 & (sleep 1003 &) ; setsid sh -c 'touch /tmp/up; sleep 0.3; {connect}' >/dev/null 2>&1 & while [ ! -e /tmp/up ] || ! pgrep -f '^sleep 1001' >/dev/null; do sleep 0.01; done")),
            T,
        )
        .await
        .unwrap();
    ran(&r);
    let (_, left, _) = sh(&sb, "pgrep -f '^sleep 100[123]' || echo none").await;
    assert_eq!(left.lines().count(), 1, "{left}");
    assert_ne!(left, "none\n");
    assert_eq!(taken(&actors, 1).await, vec!["ana"]);
    let r = sb
        .call(
            Op::StopUnits {
                actor: "ana".into(),
            },
            T,
        )
        .await
        .unwrap();
    assert!(
        matches!(r, Reply::Stopped { processes } if processes >= 1),
        "{r:?}"
    );
    let (_, left, _) = sh(&sb, "pgrep -f '^sleep 100[123]' || echo none").await;
    assert_eq!(left, "none\n");
    // The terminal: lines ended by bo, then by cy.
    let open = Op::PtyOpen {
        argv: vec!["/bin/sh".into()],
        cols: 80,
        rows: 24,
    };
    sb.call(open, T).await.unwrap();
    let typed = |actor: &str, line: String| Op::PtyTyped {
        data: ByteBuf::from(format!("{line}\n").into_bytes()),
        actor: actor.into(),
    };
    sb.send(typed("bo", connect.into())).await.unwrap();
    assert_eq!(taken(&actors, 1).await, vec!["bo"]);
    sb.send(typed(
        "bo",
        "setsid sh -c 'while :; do echo x >> /workspace/tick; sleep 0.05; done' &".into(),
    ))
    .await
    .unwrap();
    // (Once it runs: a job counts to whoever ended the last line before it started, told
    // apart to the clock tick of its start: lines ended within one tick count to the later.)
    let wait =
        "while [ \"$(wc -l < /workspace/tick 2>/dev/null || echo 0)\" -lt 3 ]; do sleep 0.02; done";
    let (code, _, _) = sh(&sb, wait).await;
    assert_eq!(code, Some(0));
    sb.send(typed(
        "cy",
        format!("setsid -f sh -c 'sleep 0.3; {connect}'; sleep 1004 &"),
    ))
    .await
    .unwrap();
    assert_eq!(taken(&actors, 1).await, vec!["cy"]);
    // Stopping bo ends bo's loop and nothing of cy's, nor the shell.
    let r = sb
        .call(Op::StopUnits { actor: "bo".into() }, T)
        .await
        .unwrap();
    assert!(
        matches!(r, Reply::Stopped { processes } if processes >= 1),
        "{r:?}"
    );
    let (_, ticks, _) = sh(&sb, "wc -l < /workspace/tick; sleep 0.5; wc -l < /workspace/tick; pgrep -f 'sleep 100[4]' >/dev/null && echo cy-runs").await;
    let lines: Vec<&str> = ticks.lines().collect();
    assert_eq!(lines.len(), 3, "{ticks}");
    assert_eq!(lines[0], lines[1], "bo's loop went on: {ticks}");
    assert_eq!(lines[2], "cy-runs");
    sb.send(typed("cy", "echo shell-$((6*7))".into()))
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("shell-42") {
        match tokio::time::timeout(T, events.recv()).await {
            Ok(Some(Event::PtyOutput(b))) => seen.push_str(&String::from_utf8_lossy(&b)),
            Ok(Some(_)) => {}
            _ => panic!("the terminal said {seen:?}"),
        }
    }
    let r = sb
        .call(Op::StopUnits { actor: "cy".into() }, T)
        .await
        .unwrap();
    assert!(
        matches!(r, Reply::Stopped { processes } if processes >= 1),
        "{r:?}"
    );
    let (_, left, _) = sh(&sb, "pgrep -f 'sleep 100[4]' || echo none").await;
    assert_eq!(left, "none\n");
    sb.kill();
    sb.ended().await;
}

/// A port inside the sandbox is reachable through the agent only (the sandbox has no network).
#[tokio::test]
async fn ports_inside_are_reached_through_the_agent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ns = backend();
    let (sb, mut events, _) = ns.start(&name("p"), &Limits::default()).await.unwrap();
    // Nothing listens yet.
    let err = sb.connect(8000, T).await.unwrap_err();
    assert!(err.to_string().contains("cannot connect"), "{err}");
    sh(&sb, "echo 'hello from inside' > /workspace/index.html").await;
    // A long-running server lives in the terminal (exec kills what it leaves behind).
    let open = Op::PtyOpen {
        argv: vec!["/bin/sh".into()],
        cols: 80,
        rows: 24,
    };
    sb.call(open, T).await.unwrap();
    sb.send(Op::PtyInput(ByteBuf::from(
        b"python3 -m http.server 8000 --bind 127.0.0.1\n".to_vec(),
    )))
    .await
    .unwrap();
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let mut conn = None;
    for _ in 0..100 {
        if let Ok(c) = sb.connect(8000, T).await {
            conn = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut conn = conn.expect("the server inside never listened");
    conn.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(T, conn.read_to_end(&mut response))
        .await
        .unwrap()
        .unwrap();
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    assert!(response.ends_with("hello from inside\n"), "{response}");
    sb.kill();
    sb.ended().await;
}

/// Flow control on carried connections: a reader that reads slowly gets all of a long download
/// (nothing is reset for being slow), a second download of the same sandbox runs at full speed
/// beside it, and an upload to a program that reads slowly arrives whole.
#[tokio::test]
async fn slow_readers_slow_only_their_own_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MIB: usize = 1 << 20;
    let ns = backend();
    let (sb, mut events, _) = ns.start(&name("f"), &Limits::default()).await.unwrap();
    let server = r#"
import socket, threading, time
def serve(c):
    kind = c.recv(1)
    if kind == b'D':
        chunk = b'x' * 65536
        for _ in range(512):
            c.sendall(chunk)
    elif kind == b'U':
        n = 0
        while True:
            b = c.recv(65536)
            if not b:
                break
            n += len(b)
            time.sleep(0.001)
        c.sendall(str(n).encode())
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8100))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;
    sh(
        &sb,
        &format!("cat > /workspace/server.py <<'EOF'\n{server}\nEOF"),
    )
    .await;
    let open = Op::PtyOpen {
        argv: vec!["/bin/sh".into()],
        cols: 80,
        rows: 24,
    };
    sb.call(open, T).await.unwrap();
    sb.send(Op::PtyInput(ByteBuf::from(
        b"python3 /workspace/server.py\n".to_vec(),
    )))
    .await
    .unwrap();
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let mut ready = false;
    for _ in 0..100 {
        if sb.connect(8100, T).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the server inside never listened");

    let download = |slow: bool| {
        let sb = sb.clone();
        async move {
            let mut c = sb.connect(8100, T).await.unwrap();
            c.write_all(b"D").await.unwrap();
            let mut got = 0usize;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = c.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got += n;
                if slow {
                    tokio::time::sleep(Duration::from_millis(4)).await;
                }
            }
            (got, std::time::Instant::now())
        }
    };
    let slow = tokio::spawn(download(true));
    let fast = tokio::spawn(download(false));
    let (fast_bytes, fast_done) = tokio::time::timeout(Duration::from_secs(60), fast)
        .await
        .unwrap()
        .unwrap();
    let (slow_bytes, slow_done) = tokio::time::timeout(Duration::from_secs(120), slow)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((fast_bytes, slow_bytes), (32 * MIB, 32 * MIB));
    assert!(
        fast_done < slow_done,
        "the fast download waited for the slow one"
    );

    let mut up = sb.connect(8100, T).await.unwrap();
    up.write_all(b"U").await.unwrap();
    let chunk = vec![7u8; MIB];
    for _ in 0..16 {
        up.write_all(&chunk).await.unwrap();
    }
    up.shutdown().await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(120), up.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer, (16 * MIB).to_string());
    sb.kill();
    sb.ended().await;
}

/// The only way out of a sandbox: code inside connects to the agent's forwarder (named by the
/// proxy variables of its environment), and the control plane gets the connection as a
/// stream. Until the control plane takes them, such connections close at once; connections
/// that skip the forwarder find no network at all.
#[tokio::test]
async fn outbound_connections_leave_only_through_the_forwarder() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let ns = backend();
    let (sb, _events, _) = ns.start(&name("o"), &Limits::default()).await.unwrap();
    let client = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"hello from inside\n")
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    got += b
sys.stdout.write(got.decode())
"#;
    sh(
        &sb,
        &format!("cat > /workspace/client.py <<'EOF'\n{client}\nEOF"),
    )
    .await;
    // Nobody takes them yet: the connection is closed, nothing comes back.
    let (code, out, err) = sh(&sb, "python3 /workspace/client.py").await;
    assert_eq!((code, out.as_str()), (Some(0), ""), "{err}");

    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = taken.clone();
    let actors = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = actors.clone();
    sb.on_outbound(std::sync::Arc::new(move |conn, actor| {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        seen.lock().unwrap().push(actor);
        tokio::spawn(async move {
            let (rd, mut wr) = tokio::io::split(conn);
            let mut line = String::new();
            let _ = tokio::io::BufReader::new(rd).read_line(&mut line).await;
            let _ = wr
                .write_all(format!("control plane got: {line}").as_bytes())
                .await;
        });
    }));
    let (code, out, err) = sh(&sb, "python3 /workspace/client.py").await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "control plane got: hello from inside\n");
    assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Connections are attributed to the actor of the exec whose unit opened them; a process
    // that leaves its session stays in its unit.
    let as_ana = |script: &str| Op::Exec {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        cwd: String::new(),
        timeout_ms: 20_000,
        max_output: 1 << 20,
        actor: "ana".into(),
    };
    let r = sb
        .call(as_ana("python3 /workspace/client.py"), T)
        .await
        .unwrap();
    ran(&r);
    let r = sb
        .call(as_ana("setsid python3 /workspace/client.py"), T)
        .await
        .unwrap();
    ran(&r);
    assert_eq!(
        *actors.lock().unwrap(),
        vec![String::new(), "ana".to_owned(), "ana".to_owned()]
    );

    // What code inside is told, and what happens when it ignores it.
    let (_, env, _) = sh(&sb, "printenv HTTPS_PROXY http_proxy NO_PROXY").await;
    assert_eq!(
        env,
        "http://127.0.0.1:3128\nhttp://127.0.0.1:3128\nlocalhost,127.0.0.1,::1\n"
    );
    let direct = r#"python3 -c '
import socket
for addr in [("1.1.1.1", 443), ("10.0.0.1", 80), ("::ffff:8.8.8.8", 53)]:
    try:
        socket.create_connection(addr, timeout=5)
        print("connected", addr)
    except OSError as e:
        print("refused", addr, e.errno)
'"#;
    let (_, out, err) = sh(&sb, direct).await;
    assert!(!out.contains("connected"), "{out}{err}");
    assert_eq!(out.matches("refused").count(), 3, "{out}{err}");
    sb.kill();
    sb.ended().await;
}

/// Things code inside may leave in the workspace or do to the agent's requests: sockets, FIFOs,
/// unreadable files, huge output. None of them wedges the agent or breaks a snapshot.
#[tokio::test]
async fn hostile_workspace_contents_do_not_break_the_agent() {
    let ns = backend();
    let (sb, _events, _) = ns.start(&name("h"), &Limits::default()).await.unwrap();
    let (code, _, err) = sh(
        &sb,
        "echo keep > keep.txt && mkfifo pipe && chmod 000 keep.txt && echo ok > ok.txt && \
         python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\" && \
         mkdir -p d/e && echo deep > d/e/f.txt && ln -s d/e/f.txt link",
    )
    .await;
    assert_eq!(code, Some(0), "{err}");

    // A FIFO is refused at once, and the agent answers meanwhile.
    let fifo = Op::ReadFile {
        path: "pipe".into(),
        max_bytes: 100,
    };
    let r = tokio::time::timeout(Duration::from_secs(5), sb.call(fifo, T))
        .await
        .unwrap();
    assert!(r.unwrap_err().to_string().contains("not a regular file"));

    // Commands do not inherit the agent's control socket.
    let (_, out, _) = sh(&sb, "ls -l /proc/$$/fd | grep -c socket || true").await;
    assert_eq!(out.trim(), "0", "the control socket leaked into a command");

    // Output bigger than the cap comes back truncated, promptly.
    let big = Op::Exec {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "head -c 3000000 /dev/zero | tr '\\0' y".into(),
        ],
        cwd: String::new(),
        timeout_ms: 20_000,
        max_output: 1 << 20,
        actor: String::new(),
    };
    match tokio::time::timeout(Duration::from_secs(10), sb.call(big, T))
        .await
        .unwrap()
        .unwrap()
    {
        Reply::Exec {
            stdout, truncated, ..
        } => {
            assert_eq!(stdout.len(), 1 << 20);
            assert!(truncated);
        }
        other => panic!("{other:?}"),
    }

    // The snapshot skips what cannot be archived and keeps the rest.
    let mut tar = Vec::new();
    sb.snapshot(&mut tar, 64 << 20, T).await.unwrap();
    sb.kill();
    sb.ended().await;
    let (sb2, _ev, _) = ns.start(&name("h2"), &Limits::default()).await.unwrap();
    sb2.restore(&mut &tar[..], T).await.unwrap();
    let (_, out, _) = sh(&sb2, "cat ok.txt d/e/f.txt link; ls -a | tr '\\n' ' '").await;
    assert!(out.starts_with("ok\ndeep\ndeep\n"), "{out}");
    assert!(!out.contains("sock") && !out.contains("pipe"), "{out}");
    sb2.kill();
    sb2.ended().await;
}

/// `--sandbox-rootfs`: the sandbox's base is the given tree, not the host's `/usr`.
#[tokio::test]
async fn a_rootfs_replaces_the_host_base() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    // A minimal tree: dash, the C libraries the agent and dash link against, the loader.
    let libdir = r.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::create_dir_all(r.join("usr/bin")).unwrap();
    std::fs::create_dir_all(r.join("lib64")).unwrap();
    std::fs::copy("/usr/bin/dash", r.join("usr/bin/sh")).unwrap();
    for lib in [
        "libc.so.6",
        "libm.so.6",
        "libgcc_s.so.1",
        "ld-linux-x86-64.so.2",
    ] {
        std::fs::copy(format!("/lib/x86_64-linux-gnu/{lib}"), libdir.join(lib)).unwrap();
    }
    std::fs::copy(
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        r.join("lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    std::os::unix::fs::symlink("usr/bin", r.join("bin")).unwrap();
    std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
    std::fs::write(r.join("usr/marker"), "from the rootfs\n").unwrap();
    // The unprivileged sandbox user must be able to read the tree.
    std::process::Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(r)
        .status()
        .unwrap();

    let agent = AgentCommand {
        exe: env!("CARGO_BIN_EXE_coderoom-agent").into(),
        args: vec![],
    };
    let (Backend::Namespace(ns), why) = Backend::namespace(agent, Some(r.to_owned())) else {
        panic!("the namespace tier must work on this host");
    };
    assert!(why.contains("namespace"), "{why}");
    let (sb, _events, receipt) = ns.start(&name("r"), &Limits::default()).await.unwrap();
    assert!(
        receipt
            .mounts
            .iter()
            .any(|m| m.contains("from") && m.contains(&r.display().to_string())),
        "{receipt:?}"
    );
    let op = Op::Exec {
        argv: vec!["/bin/sh".into(), "-c".into(), "read m < /usr/marker; echo $m; [ -e /usr/bin/python3 ] && echo host-usr-visible; echo x > /usr/y || echo read-only".into()],
        cwd: String::new(),
        timeout_ms: 10_000,
        max_output: 4096,
        actor: String::new(),
    };
    match sb.call(op, T).await.unwrap() {
        Reply::Exec { stdout, .. } => {
            let out = String::from_utf8_lossy(&stdout);
            assert_eq!(out, "from the rootfs\nread-only\n", "{out}");
        }
        other => panic!("{other:?}"),
    }
    sb.kill();
    sb.ended().await;
}

/// The server's binary may live where the sandbox's unprivileged uid cannot enter (a checkout
/// under /root): the agent still starts.
#[tokio::test]
async fn an_agent_in_a_private_directory_still_starts() {
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        private.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let exe = private.path().join("coderoom-agent");
    std::fs::copy(env!("CARGO_BIN_EXE_coderoom-agent"), &exe).unwrap();
    runs_a_command(AgentCommand { exe, args: vec![] }, "v").await;
}

/// A backend with `agent` starts a sandbox (named with `tag`) whose commands run.
async fn runs_a_command(agent: AgentCommand, tag: &str) {
    let (Backend::Namespace(ns), _) = Backend::namespace(agent, None) else {
        panic!("the namespace tier must work on this host");
    };
    let (sb, _events, _) = ns.start(&name(tag), &Limits::default()).await.unwrap();
    let (code, out, _) = sh(&sb, "echo up").await;
    assert_eq!((code, out.as_str()), (Some(0), "up\n"));
    sb.kill();
    sb.ended().await;
}

/// With a root server, room code runs under a uid of its own inside (`coder`), apart from the
/// sandbox's machinery (root inside, under another host uid): it can neither signal the reaper
/// or the agent nor read their memory or descriptors, in an exec or in the terminal.
#[tokio::test]
async fn room_code_runs_apart_from_the_machinery() {
    let ns = backend();
    let (sb, mut events, receipt) = ns.start(&name("u"), &Limits::default()).await.unwrap();
    let probe = "echo uid=$(id -u); grep -h '^Uid:' /proc/1/status; \
        for p in $(ls /proc | grep -E '^[0-9]+$'); do \
          u=$(awk '/^Uid:/{print $2}' /proc/$p/status 2>/dev/null); \
          [ \"$u\" = 0 ] && { kill -STOP $p 2>/dev/null && echo sto\"\"pped-$p; \
            cat /proc/$p/environ >/dev/null 2>&1 && echo re\"\"ad-$p; \
            ls /proc/$p/fd >/dev/null 2>&1 && echo f\"\"ds-$p; }; \
        done; echo probe\"\"-done";
    let (code, out, _) = sh(&sb, probe).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("uid=1000\nUid:\t0\t0\t0\t0\n"), "{out}");
    assert!(
        !out.contains("stopped-") && !out.contains("read-") && !out.contains("fds-"),
        "{out}"
    );
    assert!(out.ends_with("probe-done\n"), "{out}");
    // What the sandbox gives room code of the system, room code can read (a shell's rc files
    // were once behind an /etc only root could open).
    let files = "ls /etc >/dev/null || echo unreadable-/etc; \
        for f in /etc/* /etc/ssl/*; do \
          if [ -d \"$f\" ]; then ls \"$f\" >/dev/null 2>&1 || echo unreadable-$f; \
          else cat \"$f\" >/dev/null 2>&1 || echo unreadable-$f; fi; echo checked-$f; \
        done";
    let (code, out, _) = sh(&sb, files).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("unreadable-"), "{out}");
    for f in [
        "/etc/passwd",
        "/etc/group",
        "/etc/bash.bashrc",
        "/etc/ssl/certs",
    ] {
        assert!(
            out.contains(&format!("checked-{f}\n")),
            "{f} was not checked: {out}"
        );
    }
    // The host's private keys are not there at all.
    assert!(!out.contains("/etc/ssl/private"), "{out}");
    // Room code's host uid is its own, not the machinery's.
    assert!(
        coderoom_sandbox::namespace::ROOM_UIDS.contains(&receipt.host_uid),
        "{}",
        receipt.host_uid
    );
    // The terminal's shell too.
    let open = Op::PtyOpen {
        argv: vec!["/bin/sh".into()],
        cols: 80,
        rows: 24,
    };
    sb.call(open, T).await.unwrap();
    sb.send(Op::PtyInput(ByteBuf::from(
        format!("{probe}\n").into_bytes(),
    )))
    .await
    .unwrap();
    let mut seen = String::new();
    while !seen.contains("probe-done\r\n") {
        match tokio::time::timeout(T, events.recv()).await {
            Ok(Some(Event::PtyOutput(b))) => seen.push_str(&String::from_utf8_lossy(&b)),
            Ok(Some(_)) => {}
            _ => panic!("the terminal said {seen:?}"),
        }
    }
    assert!(seen.contains("uid=1000\r\n"), "{seen}");
    assert!(
        !seen.contains("stopped-") && !seen.contains("read-") && !seen.contains("fds-"),
        "{seen}"
    );
}

/// The agent's side of a VM save, driven through the namespace tier's agent (the same
/// program): after `Quiesce` it answers nothing, so the saved stream ends on a frame's
/// boundary, and `Resumed` lets everything held go out, in order. The namespace tier itself
/// keeps nothing: parking it is refused before the agent is touched.
#[tokio::test]
async fn a_quiesced_agent_holds_its_replies_until_resumed() {
    let ns = backend();
    let (sb, _events, _) = ns.start(&name("q"), &Limits::default()).await.unwrap();
    assert_eq!(
        sb.park(coderoom_sandbox::Keep::Disk, "t", T).await,
        Err(coderoom_sandbox::ParkError::Unsupported)
    );
    assert!(matches!(sb.call(Op::Quiesce, T).await, Ok(Reply::Done)));
    let held = {
        let sb = sb.clone();
        tokio::spawn(async move { sh(&sb, "echo held-then-sent").await })
    };
    // Nothing comes while quiesced (the exec runs, its answer waits).
    assert!(matches!(
        sb.call(Op::Hello, Duration::from_millis(800)).await,
        Err(coderoom_sandbox::CallError::Timeout)
    ));
    assert!(!held.is_finished());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // The clock is the host's already: the agent leaves it.
    match sb.call(Op::Resumed { now_ms }, T).await.unwrap() {
        Reply::Resumed { pty_open } => assert!(!pty_open),
        other => panic!("unexpected {other:?}"),
    }
    let (code, out, _) = held.await.unwrap();
    assert_eq!((code, out.as_str()), (Some(0), "held-then-sent\n"));
    let (_, out, _) = sh(&sb, "echo after").await;
    assert_eq!(out, "after\n");
    sb.kill();
    sb.ended().await;
}

/// The file system operations the E2B door uses, from where hostile workspace contents stand:
/// a symlink out of the workspace is described, never followed (neither listed through nor
/// opened as a directory), and making, moving and listing stay beneath the workspace.
#[tokio::test]
async fn entries_are_described_and_moved_beneath_the_workspace_only() {
    use coderoom_sandbox::proto::{AgentError, EntryKind};
    use coderoom_sandbox::CallError;
    let ns = backend();
    let (sb, _events, _) = ns.start(&name("e"), &Limits::default()).await.unwrap();
    sh(&sb, "mkdir -p src && echo hi > src/a.txt && ln -s /etc out").await;
    let r = sb.call(Op::Stat { path: "out".into() }, T).await.unwrap();
    let Reply::Entry(e) = r else { panic!("{r:?}") };
    assert_eq!(
        (e.kind, e.target.as_deref()),
        (EntryKind::Symlink, Some("/etc"))
    );
    let r = sb
        .call(
            Op::Stat {
                path: String::new(),
            },
            T,
        )
        .await
        .unwrap();
    assert!(
        matches!(r, Reply::Entry(ref e) if e.kind == EntryKind::Dir),
        "{r:?}"
    );
    let list = |path: &str, depth| Op::ListDir {
        path: path.into(),
        depth,
    };
    let r = sb.call(list("", 5), T).await.unwrap();
    let Reply::Entries { entries, truncated } = r else {
        panic!("{r:?}")
    };
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!((paths, truncated), (vec!["out", "src", "src/a.txt"], false));
    let r = sb.call(list("out", 1), T).await;
    assert!(
        matches!(r, Err(CallError::Agent(AgentError::InvalidPath(_)))),
        "{r:?}"
    );
    let mk = |path: &str| Op::MakeDir { path: path.into() };
    assert_eq!(sb.call(mk("a/b"), T).await.unwrap(), Reply::Done);
    let r = sb.call(mk("a/b"), T).await;
    assert!(
        matches!(r, Err(CallError::Agent(AgentError::Exists))),
        "{r:?}"
    );
    let r = sb.call(mk("out/evil"), T).await;
    assert!(r.is_err(), "made a directory through the symlink: {r:?}");
    let mv = Op::Move {
        from: "src/a.txt".into(),
        to: "c/d.txt".into(),
    };
    assert_eq!(sb.call(mv, T).await.unwrap(), Reply::Done);
    let mv = Op::Move {
        from: "c/d.txt".into(),
        to: "out/d.txt".into(),
    };
    assert!(sb.call(mv, T).await.is_err(), "moved through the symlink");
    let (_, left, _) = sh(&sb, "cat c/d.txt; ls /etc/d.txt 2>&1 | head -1").await;
    assert!(
        left.starts_with("hi\n") && left.contains("No such file"),
        "{left}"
    );
    sb.kill();
    sb.ended().await;
}

/// A server uses the standalone agent installed beside it only when it is of the server's own
/// build; otherwise (absent, another build, one too old to say) the server binary itself.
#[tokio::test]
async fn the_agent_beside_the_server_is_used_only_when_it_is_the_same_build() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let server = dir.path().join("coderoom");
    let beside = dir.path().join("coderoom-agent");
    let (agent, why) = AgentCommand::beside(&server);
    assert_eq!(
        (agent.exe.as_path(), agent.args.as_slice()),
        (server.as_path(), &["agent".to_owned()][..]),
        "{why}"
    );
    assert!(why.contains("no "), "{why}");

    for (script, said) in [
        ("#!/bin/sh\necho 0123456789abcdef\n", "another build"),
        ("#!/bin/sh\necho usage >&2\nexit 64\n", "another build"),
    ] {
        std::fs::write(&beside, script).unwrap();
        std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (agent, why) = AgentCommand::beside(&server);
        assert_eq!(agent.exe, server, "{why}");
        assert!(why.contains(said), "{why}");
    }

    std::fs::remove_file(&beside).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_coderoom-agent"), &beside).unwrap();
    let (agent, why) = AgentCommand::beside(&server);
    assert_eq!(agent.exe, beside, "{why}");
    assert!(agent.args.is_empty());
    // And it runs sandboxes.
    runs_a_command(agent, "b").await;
}

//! Sandbox hosts in processes of their own (`coderoom sandbox-host`), reached by a room server
//! over mutual TLS: the terminal, exec and files work through one; a host killed with
//! SIGKILL is told to the room, and the sandbox starts again from its last snapshot on the
//! other host. Needs what the namespace tier needs (bubblewrap, root), as in CI.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt as _;

/// A running `coderoom sandbox-host`.
struct Host {
    child: tokio::process::Child,
    address: String,
}

/// `coderoom certs` for `name` into `dir`: a sandbox host's when it has `sans`, else a room
/// server's.
fn certs(dir: &Path, name: &str, sans: &[&str]) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_coderoom"));
    cmd.args(["certs", "--dir"]).arg(dir).args(["--name", name]);
    // A host's certificate names it; a room server's names nobody.
    cmd.args([
        "--role",
        if sans.is_empty() {
            "room-server"
        } else {
            "sandbox-host"
        },
    ]);
    for s in sans {
        cmd.args(["--san", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts a sandbox host named `id` with the certificate `cert` (issued in `dir`); its
/// address once it listens.
async fn host(dir: &Path, id: &str, cert: &str, capacity: usize) -> Host {
    host_with(dir, id, cert, capacity, &[]).await
}

/// [`host`] with extra flags.
async fn host_with(dir: &Path, id: &str, cert: &str, capacity: usize, extra: &[&str]) -> Host {
    let data = dir.join(format!("data-{id}"));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_coderoom"))
        .arg("sandbox-host")
        .args(extra)
        .args(["--listen", "127.0.0.1:0", "--id", id])
        .args(["--capacity", &capacity.to_string()])
        .args(["--sandbox-tier", "namespace"])
        .arg("--tls-cert")
        .arg(dir.join(format!("{cert}.pem")))
        .arg("--tls-key")
        .arg(dir.join(format!("{cert}.key")))
        .arg("--tls-ca")
        .arg(dir.join("ca.pem"))
        .arg("--data-dir")
        .arg(&data)
        .env("CODEROOM_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let address = tokio::time::timeout(TIMEOUT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some((_, a)) = line.split_once(" listening on ") {
                return a.to_owned();
            }
        }
        panic!("the sandbox host {id} exited before listening");
    })
    .await
    .expect("the sandbox host listens");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Host { child, address }
}

fn server_flags(dir: &Path, hosts: &[&Host]) -> Vec<String> {
    server_flags_for("namespace", dir, hosts)
}

/// [`server_flags`] for rooms of the sandbox tier `tier`.
fn server_flags_for(tier: &str, dir: &Path, hosts: &[&Host]) -> Vec<String> {
    let addresses: Vec<&str> = hosts.iter().map(|h| h.address.as_str()).collect();
    vec![
        "--sandbox-tier".into(),
        tier.into(),
        "--sandbox-hosts".into(),
        addresses.join(","),
        "--sandbox-host-ca".into(),
        dir.join("ca.pem").display().to_string(),
        "--sandbox-host-cert".into(),
        dir.join("server.pem").display().to_string(),
        "--sandbox-host-key".into(),
        dir.join("server.key").display().to_string(),
    ]
}

/// The line of the server's log (`log`) that says why a sandbox did not start.
fn failed_start(log: &Path) -> String {
    let logged = std::fs::read_to_string(log).unwrap();
    logged
        .lines()
        .find(|l| l.contains("sandbox start failed"))
        .unwrap_or_else(|| panic!("{logged}"))
        .to_owned()
}

/// The sandbox host a room's sandbox runs on, as its receipt says (its `--id`).
async fn placed_on(server: &Server, token: &str, room: &str) -> String {
    let status = get_json(server, token, &format!("/api/rooms/{room}/sandbox")).await;
    status["receipt"]["host"]
        .as_str()
        .unwrap_or_else(|| panic!("no host in the receipt: {status}"))
        .to_owned()
}

#[tokio::test]
async fn a_room_works_through_a_sandbox_host_and_moves_when_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path(), "host-a", &["127.0.0.1"]);
    certs(dir.path(), "host-b", &["127.0.0.1"]);
    certs(dir.path(), "server", &[]);
    let mut a = host(dir.path(), "host-a", "host-a", 4).await;
    let mut b = host(dir.path(), "host-b", "host-b", 4).await;
    let storage = Storage::new(&Backend::Sqlite).await;
    let flags = server_flags(dir.path(), &[&a, &b]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let t = team_with(&storage, &flags).await;
    let (server, room) = (&t.server, &t.room);

    // Exec, through the host (the first use starts the sandbox there).
    let (status, out) = exec(
        server,
        &t.ben,
        room,
        "echo made-there > /workspace/there.txt; echo $((6*7))",
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["stdout"], "42\n", "{out}");
    let first = placed_on(server, &t.ana, room).await;
    assert!(first == "host-a" || first == "host-b", "{first}");
    assert!(
        !first.contains("127.0.0.1"),
        "room members see no internal address"
    );

    // Files both ways: an editor's file reaches the workspace, a file made inside reaches the
    // editor.
    let mut ana = Client::connect(server, room, &t.ana).await;
    ana.synced().await;
    ana.put_file("notes.md", "written in the editor\n").await;
    let on_disk = stdout_until(server, &t.ben, room, "cat notes.md", "written").await;
    assert_eq!(on_disk, "written in the editor\n");
    ana.wait_for_file("there.txt", "made-there\n").await;

    // The shared terminal.
    let mut typer = term(server, room, &t.ben).await;
    typer.send(b"echo through-$((40+2))-the-host\n").await;
    typer.output_contains("through-42-the-host").await;
    drop(typer);

    // A stop snapshots the workspace; the next start may land anywhere.
    assert_eq!(lifecycle(server, &t.ana, room, "stop").await.0, 200);
    assert_eq!(lifecycle(server, &t.ana, room, "start").await.0, 200);
    let on = placed_on(server, &t.ana, room).await;
    let (dying, other) = if on.starts_with("host-a") {
        (&mut a, "host-b")
    } else {
        (&mut b, "host-a")
    };

    // kill -9 of the host that runs it: everyone watching is told, in words naming the host.
    let mut watcher = term(server, room, &t.ana).await;
    watcher.output_contains("$").await;
    dying.child.start_kill().unwrap();
    dying.child.wait().await.unwrap();
    watcher
        .until("told the sandbox failed", |t| {
            t.events.iter().any(|e| {
                e["type"] == "exit"
                    && e["reason"].as_str().is_some_and(|r| {
                        r.contains(&format!("the connection to sandbox host {on} was lost"))
                            && !r.contains("127.0.0.1")
                    })
            })
        })
        .await;

    // Started again: on the other host, from the last snapshot.
    assert_eq!(lifecycle(server, &t.ana, room, "start").await.0, 200);
    let again = placed_on(server, &t.ana, room).await;
    assert!(again.starts_with(other), "{again} after {on} died");
    let (_, out) = exec(server, &t.ben, room, "cat there.txt notes.md").await;
    assert_eq!(
        out["stdout"], "made-there\nwritten in the editor\n",
        "{out}"
    );
    let records = audit(server, &t.ana, room).await;
    let start: Value = records
        .iter()
        .rev()
        .find(|r| r["action"] == "sandbox_start")
        .map(|r| match &r["details"] {
            Value::String(s) => serde_json::from_str(s).unwrap(),
            d => d.clone(),
        })
        .unwrap();
    assert!(start["resumed_from"].is_string(), "{start}");
    assert!(
        start["receipt"]["host"]
            .as_str()
            .is_some_and(|h| h.starts_with(other)),
        "the placement is recorded with the start: {start}"
    );
}

/// Only room servers with a certificate from the hosts' authority are served, and a room
/// server trusts only hosts whose certificate that authority signed; a full host sends the
/// sandbox to the next; with no host left, starting says why for each.
#[tokio::test]
async fn hosts_serve_only_their_authority_and_placement_says_why_it_failed() {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path(), "host-a", &["127.0.0.1"]);
    certs(dir.path(), "server", &[]);
    let stranger = dir.path().join("stranger");
    certs(&stranger, "server", &[]);
    certs(&stranger, "host-x", &["127.0.0.1"]);
    let a = host(dir.path(), "host-a", "host-a", 1).await;
    // A host whose certificate another authority signed.
    let x = host(&stranger, "host-x", "host-x", 4).await;

    // A room server with a stranger's client certificate is refused by host-a. (Why a start
    // failed is logged for the operator, not shown to the room: it names internal addresses.)
    let storage = Storage::new(&Backend::Sqlite).await;
    let log = dir.path().join("stranger.log");
    let flags = server_flags(&stranger, &[&a]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start_logging_with(&storage, &log, &flags).await;
    let ana = storage.token("ana@example.com").await;
    let room = create_room(&server, &ana).await;
    let (status, out) = exec(&server, &ana, &room, "true").await;
    assert_eq!(status, 503, "{out}");
    assert_eq!(out["error"], "the sandbox could not start");
    let line = failed_start(&log);
    assert!(line.contains(&a.address), "{line}");
    drop(server);

    // Our room server: host-x is not trusted, host-a takes one sandbox (the stranger took no
    // slot of its one) and is then full.
    let storage = Storage::new(&Backend::Sqlite).await;
    let log = dir.path().join("ours.log");
    let flags = server_flags(dir.path(), &[&x, &a]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start_logging_with(&storage, &log, &flags).await;
    let ana = storage.token("ana@example.com").await;
    let room = create_room(&server, &ana).await;
    let (status, out) = exec(&server, &ana, &room, "echo ok").await;
    assert_eq!(status, 200, "{out}");
    assert!(placed_on(&server, &ana, &room).await.starts_with("host-a"));
    let second = create_room(&server, &ana).await;
    let (status, out) = exec(&server, &ana, &second, "echo ok").await;
    assert_eq!(status, 503, "{out}");
    let line = failed_start(&log);
    assert!(line.contains("no sandbox host can take it"), "{line}");
    assert!(line.contains("full (1 of 1)"), "{line}");
    assert!(line.contains(&x.address) && line.contains("TLS"), "{line}");
}

/// Placement by load and tier: each sandbox goes to the host with the smallest share of its
/// capacity in use, and never to a host of another tier than the room's (the start fails,
/// saying so, rather than run the room in a weaker sandbox).
#[tokio::test]
async fn placement_follows_the_load_and_never_crosses_tiers() {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path(), "host-a", &["127.0.0.1"]);
    certs(dir.path(), "host-b", &["127.0.0.1"]);
    certs(dir.path(), "server", &[]);
    let a = host(dir.path(), "host-a", "host-a", 2).await;
    let b = host(dir.path(), "host-b", "host-b", 4).await;
    let storage = Storage::new(&Backend::Sqlite).await;
    let flags = server_flags(dir.path(), &[&a, &b]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start(&storage, &flags).await;
    let ana = storage.token("ana@example.com").await;
    let mut placed = Vec::new();
    for _ in 0..3 {
        let room = create_room(&server, &ana).await;
        let (status, out) = exec(&server, &ana, &room, "echo ok").await;
        assert_eq!(status, 200, "{out}");
        placed.push(placed_on(&server, &ana, &room).await);
    }
    // Both empty: either first; the second goes to the other (nothing in use beats a share);
    // the third to host-b (1 of 4 in use beats 1 of 2).
    assert_ne!(placed[0], placed[1], "{placed:?}");
    assert!(placed[2].starts_with("host-b"), "{placed:?}");
    drop(server);

    // A room server whose rooms are microVMs finds only namespace hosts: no start.
    let storage = Storage::new(&Backend::Sqlite).await;
    let log = dir.path().join("microvm.log");
    let flags = server_flags_for("microvm", dir.path(), &[&a, &b]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start_logging_with(&storage, &log, &flags).await;
    let ana = storage.token("ana@example.com").await;
    let room = create_room(&server, &ana).await;
    let (status, out) = exec(&server, &ana, &room, "echo ok").await;
    assert_eq!(status, 503, "{out}");
    let line = failed_start(&log);
    for h in [&a, &b] {
        assert!(
            line.contains(&format!("{}: runs the namespace tier", h.address)),
            "{line}"
        );
    }
}

/// A TLS connection to the host at `address`, trusting the authority in `ca_dir` and
/// presenting `client` (`dir`, `name`: a certificate `coderoom certs` issued), or nothing.
async fn peer_of(
    ca_dir: &Path,
    client: Option<(&Path, &str)>,
    address: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca_dir.join("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some((dir, name)) => {
            let chain = CertificateDer::pem_file_iter(dir.join(format!("{name}.pem")))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// Asks the host at `address` for its status over TLS, trusting the authority in `ca_dir` and
/// presenting `client` (`dir`, `name`: a certificate `coderoom certs` issued), or nothing.
async fn status_as(
    ca_dir: &Path,
    client: Option<(&Path, &str)>,
    address: &str,
) -> Result<Value, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tls = peer_of(ca_dir, client, address).await?;
    // TLS 1.3: a refused client certificate shows on the first read.
    tls.write_all(b"{\"op\":\"status\"}\n")
        .await
        .map_err(|e| e.to_string())?;
    tls.flush().await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&answer).map_err(|e| format!("{e}: {answer:?}"))?;
    Ok(v["status"].clone())
}

/// A rogue room server's connection: this directory's room-server certificate, every byte as
/// the test writes it. Sends `bytes`, then reads what the host answers until it closes (or
/// 10 s pass: a host that keeps a hostile connection open fails the test).
async fn rogue(dir: &Path, address: &str, bytes: &[u8]) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut tls = rogue_sent(dir, address, bytes).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "the host kept a hostile connection open after {:?}: {:?}",
        String::from_utf8_lossy(&bytes[..bytes.len().min(80)]),
        String::from_utf8_lossy(&answer)
    );
    String::from_utf8_lossy(&answer).into_owned()
}

/// [`rogue`]'s connection once `bytes` are sent.
async fn rogue_sent(
    dir: &Path,
    address: &str,
    bytes: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt as _;
    let mut tls = peer_of(dir, Some((dir, "server")), address).await.unwrap();
    let _ = tls.write_all(bytes).await;
    let _ = tls.flush().await;
    tls
}

/// How many sandboxes the host at `address` runs, as it answers this directory's room server.
async fn host_running(dir: &Path, address: &str) -> u64 {
    status_as(dir, Some((dir, "server")), address)
        .await
        .unwrap()["running"]
        .as_u64()
        .unwrap()
}

/// The host checks room servers' certificates itself: only a room server's certificate from
/// its authority gets an answer (not none, not another authority's, not another host's); and
/// a sandbox's slot is the host's again once the room stops it or its room server goes.
#[tokio::test]
async fn a_host_answers_only_room_servers_of_its_authority_and_frees_slots() {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path(), "host-a", &["127.0.0.1"]);
    certs(dir.path(), "host-b", &["127.0.0.1"]);
    certs(dir.path(), "server", &[]);
    let stranger = dir.path().join("stranger");
    certs(&stranger, "server", &[]);
    let a = host(dir.path(), "host-a", "host-a", 1).await;

    let ok = status_as(dir.path(), Some((dir.path(), "server")), &a.address)
        .await
        .unwrap();
    assert_eq!(
        (
            ok["id"].as_str(),
            ok["capacity"].as_u64(),
            ok["running"].as_u64()
        ),
        (Some("host-a"), Some(1), Some(0)),
        "{ok}"
    );
    assert_eq!(ok["tier"], "namespace");
    let refused = [
        (
            "no certificate",
            status_as(dir.path(), None, &a.address).await,
        ),
        (
            "another authority's",
            status_as(dir.path(), Some((&stranger, "server")), &a.address).await,
        ),
        (
            "a host's own kind",
            status_as(dir.path(), Some((dir.path(), "host-b")), &a.address).await,
        ),
    ];
    for (what, r) in refused {
        assert!(r.is_err(), "{what}: answered {r:?}");
    }

    // One slot: taken by a room's sandbox, free again when the room stops it, taken by
    // another room's, free again when the room server goes.
    let storage = Storage::new(&Backend::Sqlite).await;
    let flags = server_flags(dir.path(), &[&a]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let t = team_with(&storage, &flags).await;
    let running = || host_running(dir.path(), &a.address);
    let until_running = |n: u64| async move {
        let since = std::time::Instant::now();
        while running().await != n {
            assert!(since.elapsed() < TIMEOUT, "the host never ran {n}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let (status, out) = exec(&t.server, &t.ben, &t.room, "true").await;
    assert_eq!(status, 200, "{out}");
    until_running(1).await;
    assert_eq!(lifecycle(&t.server, &t.ana, &t.room, "stop").await.0, 200);
    until_running(0).await;
    let second = create_room(&t.server, &t.ana).await;
    let (status, out) = exec(&t.server, &t.ana, &second, "true").await;
    assert_eq!(status, 200, "{out}");
    until_running(1).await;
    // A room server that shuts down stops its sandboxes (they do not wait for it).
    assert!(t.server.terminate().await.success());
    until_running(0).await;
}

/// One sandbox host (`host-a`, keeping a broken connection's sandbox `grace` ms) and a room
/// server using it, whose new room ran `command` there.
struct OneHost {
    dir: tempfile::TempDir,
    a: Host,
    storage: Storage,
    flags: Vec<String>,
    ana: String,
    server: Server,
    room: String,
}

async fn one_host(grace: &str, command: &str) -> OneHost {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path(), "host-a", &["127.0.0.1"]);
    certs(dir.path(), "server", &[]);
    let a = host_with(
        dir.path(),
        "host-a",
        "host-a",
        4,
        &["--attach-grace-ms", grace],
    )
    .await;
    let storage = Storage::new(&Backend::Sqlite).await;
    let flags = server_flags(dir.path(), &[&a]);
    let ana = storage.token("ana@example.com").await;
    let server = {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Server::start(&storage, &flags).await
    };
    let room = create_room(&server, &ana).await;
    let (status, out) = exec(&server, &ana, &room, command).await;
    assert_eq!(status, 200, "{out}");
    OneHost {
        dir,
        a,
        storage,
        flags,
        ana,
        server,
        room,
    }
}

/// A room server that dies (kill -9) leaves its sandboxes running on their hosts, which keep
/// them for the server to attach again: restarted, it carries on with the same sandbox (the
/// terminal's shell and a process started before, a file no snapshot has); one whose server
/// never comes back is killed when the grace runs out.
#[tokio::test]
async fn a_restarted_room_server_attaches_again_to_its_running_sandbox() {
    let OneHost {
        dir,
        a,
        storage,
        flags,
        ana,
        server,
        room,
    } = one_host("3000", "echo unsaved > /workspace/live.txt").await;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut typer = term(&server, &room, &ana).await;
    let pid = leave_a_shell_running(&mut typer, "kept-in-the-shell").await;
    drop(typer);
    let running = || host_running(dir.path(), &a.address);
    assert_eq!(running().await, 1);

    server.kill9().await;
    assert_eq!(
        running().await,
        1,
        "the host keeps the sandbox of a server that died"
    );
    let server = Server::start(&storage, &flags).await;
    let mut typer = term(&server, &room, &ana).await;
    typer
        .send(format!("echo again-$X; kill -0 {pid} && echo alive-{pid}\n").as_bytes())
        .await;
    // The typed line's echo reads `again-$X` and `echo alive-PID`: the answers are lines of
    // their own.
    typer.output_contains("again-kept-in-the-shell").await;
    let alive = format!("alive-{pid}");
    typer
        .until("the process started before still runs", |t| {
            t.output.lines().any(|l| l.trim() == alive)
        })
        .await;
    drop(typer);
    let (_, out) = exec(&server, &ana, &room, "cat /workspace/live.txt").await;
    assert_eq!(out["stdout"], "unsaved\n", "{out}");
    assert_eq!(running().await, 1, "the same sandbox, not a second one");
    let start = audit(&server, &ana, &room)
        .await
        .into_iter()
        .rev()
        .find(|r| r["action"] == "sandbox_start")
        .map(|r| match &r["details"] {
            Value::String(s) => serde_json::from_str::<Value>(s).unwrap(),
            d => d.clone(),
        })
        .unwrap();
    assert_eq!(start["resumed_from_kept"], "memory", "{start}");
    assert_eq!(start["receipt"]["host"], "host-a", "{start}");

    // A clean stop ends it on the host (nothing waits for an attach).
    let until_none = || async {
        let since = std::time::Instant::now();
        while running().await != 0 {
            assert!(
                since.elapsed() < TIMEOUT,
                "the sandbox still runs on its host"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    assert_eq!(lifecycle(&server, &ana, &room, "stop").await.0, 200);
    until_none().await;

    // A server that dies and does not come back: its sandbox ends when the grace runs out.
    let (status, out) = exec(&server, &ana, &room, "true").await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(running().await, 1);
    server.kill9().await;
    // Kept through the grace (3 s from when the host saw the server go, which is after the
    // kill): the time to its end is measured, not sampled after a sleep.
    let killed = std::time::Instant::now();
    until_none().await;
    assert!(
        killed.elapsed() >= std::time::Duration::from_millis(3000),
        "ended {:?} after its server died, inside the grace",
        killed.elapsed()
    );
}

/// A peer holding a valid room server's certificate is a room server, no more: it cannot take
/// another room's running sandbox (by starting one of the same name, by attaching with a wrong
/// token, or with that room's own token under another name, or by replaying the attach its
/// room server already made), and malformed, oversized and out-of-order lines and frames end
/// its own connection, not the host. The room's sandbox carries on throughout.
#[tokio::test]
async fn a_rogue_room_server_takes_nothing_and_breaks_nothing() {
    let OneHost {
        dir,
        a,
        storage,
        flags,
        ana,
        server,
        room,
    } = one_host("30000", "echo mine > /workspace/mine.txt").await;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let running = || host_running(dir.path(), &a.address);
    assert_eq!(running().await, 1);
    let (d, address) = (dir.path(), a.address.as_str());
    let line = |v: Value| format!("{v}\n").into_bytes();
    let limits = serde_json::json!({"memory_bytes": 268435456, "pids": 64, "cpu_millis": 500,
        "workspace_bytes": 16777216});

    // A start under the room's own name is refused: one sandbox per name on a host.
    let answer = rogue(
        d,
        address,
        &line(serde_json::json!({"op": "start", "name": room, "limits": limits})),
    )
    .await;
    assert!(
        answer.contains("\"refused\"") && answer.contains("is already here"),
        "{answer}"
    );
    // Attaching to it without its token, or under another name with it, is refused.
    let record = storage
        .dir
        .path()
        .join("sandbox-hosts")
        .read_dir()
        .unwrap()
        .flatten()
        .map(|server_dir| server_dir.path().join(format!("{room}.json")))
        .find(|p| p.is_file())
        .expect("the room server's attach record");
    let token = serde_json::from_slice::<Value>(&std::fs::read(&record).unwrap()).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for (name, token) in [
        (room.as_str(), "0".repeat(32)),
        ("someoneelse", token.clone()),
    ] {
        let answer = rogue(
            d,
            address,
            &line(serde_json::json!({"op": "attach", "name": name, "token": token})),
        )
        .await;
        assert!(answer.contains("waits here"), "{answer}");
    }
    // Malformed and overlong first lines: refused, or the connection ends.
    let answer = rogue(d, address, b"{\"op\":\"start\",\"name\":\n").await;
    assert!(answer.contains("a malformed request"), "{answer}");
    let answer = rogue(d, address, &vec![b'x'; (64 << 10) + 1]).await;
    assert!(!answer.contains("started"), "{answer}");
    // Its own sandbox, then frames the protocol never sends: an oversized length, then
    // garbage of a plausible length. Each ends its connection and its sandbox, nothing else.
    let start =
        |name: &str| line(serde_json::json!({"op": "start", "name": name, "limits": limits}));
    let mut bytes = start("rogue1");
    bytes.extend(((64u32 << 20) + 1).to_be_bytes());
    let answer = rogue(d, address, &bytes).await;
    assert!(answer.contains("\"started\""), "{answer}");
    // Garbage in a frame of a plausible length reaches only its own agent, which refuses it;
    // the rogue then leaves, and its sandbox ends with its connection.
    let mut bytes = start("rogue2");
    bytes.extend(12u32.to_be_bytes());
    bytes.extend([0xff; 12]);
    let mut conn = rogue_sent(d, address, &bytes).await;
    let mut answer = String::new();
    let read = tokio::time::timeout(
        TIMEOUT,
        tokio::io::AsyncBufReadExt::read_line(
            &mut tokio::io::BufReader::new(&mut conn),
            &mut answer,
        ),
    )
    .await;
    assert!(matches!(read, Ok(Ok(n)) if n > 0), "{read:?}");
    assert!(answer.contains("\"started\""), "{answer}");
    // Leaving cleanly (close_notify) ends it; a dropped connection would wait for an attach.
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut conn).await;
    drop(conn);
    // The room's sandbox is the only one left, and it is as it was.
    let waited = std::time::Instant::now();
    while running().await != 1 {
        assert!(
            waited.elapsed() < TIMEOUT,
            "the rogue's sandboxes were not ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, out) = exec(&server, &ana, &room, "cat /workspace/mine.txt").await;
    assert_eq!(out["stdout"], "mine\n", "{out}");

    // The room server dies and comes back: it attaches again with its record; a replay of that
    // attach finds nothing waiting.
    server.kill9().await;
    let server = Server::start(&storage, &flags).await;
    let (_, out) = exec(&server, &ana, &room, "cat /workspace/mine.txt").await;
    assert_eq!(out["stdout"], "mine\n", "{out}");
    let answer = rogue(
        d,
        address,
        &line(serde_json::json!({"op": "attach", "name": room, "token": token})),
    )
    .await;
    assert!(answer.contains("waits here"), "a replayed attach: {answer}");
    let (_, out) = exec(&server, &ana, &room, "echo still").await;
    assert_eq!(out["stdout"], "still\n", "{out}");
    assert_eq!(running().await, 1);
}

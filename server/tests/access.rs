//! Authorization end to end: invites, live downgrades and removals, refused edits, and the
//! tamper-evident audit chain checked by `coderoom audit verify`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::time::Duration;
use yrs::sync::protocol::{Message as YMessage, SyncMessage};

async fn verify_cli(storage: &Storage) -> (bool, String) {
    let out = tokio::process::Command::new(BIN)
        .args(["audit", "verify"])
        .args(storage.args())
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn invites_never_exceed_their_issuer() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let v = get_json(&t.server, &t.ben, &format!("/api/rooms/{}", t.room)).await;
    assert_eq!(
        v["my_capabilities"],
        serde_json::json!(["observe", "edit", "type"])
    );
    assert_eq!(v["participants"].as_array().unwrap().len(), 3);
    // An editor holds no `invite`; with `invite` granted, still no owner invites.
    assert_eq!(invite(&t.server, &t.ben, &t.room, "viewer", 1).await.0, 403);
    let grant = r#"{"grant":["invite"]}"#;
    assert_eq!(
        set_role(&t.server, &t.ana, &t.room, &t.ben_id, grant).await,
        200
    );
    assert_eq!(invite(&t.server, &t.ben, &t.room, "owner", 1).await.0, 403);
    let (status, ben_invite) = invite(&t.server, &t.ben, &t.room, "editor", 5).await;
    assert_eq!(status, 201);
    // Revoked links stop at once; so do links of an issuer who lost `invite`.
    let (_, ana_invite) = invite(&t.server, &t.ana, &t.room, "viewer", 5).await;
    let del = http(
        &t.server.url(&format!("/api/invites/{ana_invite}")),
        "DELETE",
        Some(&t.ana),
        None,
    )
    .await;
    assert_eq!(del.0, 204);
    let dan = storage.token("dan@example.com").await;
    assert_eq!(accept(&t.server, &dan, &ana_invite).await, 410);
    assert_eq!(
        set_role(
            &t.server,
            &t.ana,
            &t.room,
            &t.ben_id,
            r#"{"revoke":["invite"]}"#
        )
        .await,
        200
    );
    assert_eq!(accept(&t.server, &dan, &ben_invite).await, 410);
    // Viewers cannot raise themselves, editors cannot lower others.
    let cy_id = me(&t.server, &t.cy).await;
    assert_eq!(
        set_role(&t.server, &t.cy, &t.room, &cy_id, r#"{"role":"owner"}"#).await,
        403
    );
    assert_eq!(
        set_role(
            &t.server,
            &t.ben,
            &t.room,
            &cy_id,
            r#"{"revoke":["observe"]}"#
        )
        .await,
        403
    );
    let denials = audit(&t.server, &t.ana, &t.room).await;
    assert!(denials.iter().filter(|r| r["decision"] == "deny").count() >= 4);
    assert!(verify_cli(&storage).await.0);
    t.server.terminate().await;
}

#[tokio::test]
async fn viewers_cannot_edit_and_downgrades_bite_on_the_next_frame() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let mut ana = Client::connect(&t.server, &t.room, &t.ana).await;
    ana.synced().await;
    ana.insert("main.rs", 0, "seed").await;
    eventually(&t.server, &t.room, &t.ana, "main.rs", "seed").await;

    // A viewer's update (as `update` and as `sync step 2`) is refused: nothing changes and
    // nothing reaches the peers.
    let mut cy = Client::connect(&t.server, &t.room, &t.cy).await;
    cy.synced().await;
    let before = snapshot(&t.server, &t.room, &t.ana, "main.rs").await.1;
    cy.insert("main.rs", 0, "viewer was here").await;
    let step2 = {
        use yrs::{ReadTxn, Transact};
        cy.doc
            .transact()
            .encode_state_as_update_v1(&yrs::StateVector::default())
    };
    cy.send(YMessage::Sync(SyncMessage::SyncStep2(step2))).await;
    let quiet = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            if let Event::Y(YMessage::Sync(SyncMessage::Update(_))) = ana.next().await {
                return;
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "a peer received the viewer's update");
    let (text, after) = snapshot(&t.server, &t.room, &t.ana, "main.rs").await;
    assert_eq!((text.as_str(), after), ("seed", before));
    let mut audited = false;
    for _ in 0..50 {
        let log = audit(&t.server, &t.ana, &t.room).await;
        if log
            .iter()
            .any(|r| r["action"] == "edit" && r["decision"] == "deny")
        {
            audited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(audited, "the refused edit was not audited");

    // Ben edits, is downgraded, and his very next edit is refused.
    let mut ben = Client::connect(&t.server, &t.room, &t.ben).await;
    ben.synced().await;
    ben.insert("main.rs", 4, "!").await;
    eventually(&t.server, &t.room, &t.ana, "main.rs", "seed!").await;
    assert_eq!(
        set_role(
            &t.server,
            &t.ana,
            &t.room,
            &t.ben_id,
            r#"{"role":"viewer"}"#
        )
        .await,
        200
    );
    ben.insert("main.rs", 5, "?").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        snapshot(&t.server, &t.room, &t.ana, "main.rs").await.0,
        "seed!"
    );

    // Removal closes his sockets within a second, and reconnecting fails.
    let started = std::time::Instant::now();
    let del = http(
        &t.server
            .url(&format!("/api/rooms/{}/participants/{}", t.room, t.ben_id)),
        "DELETE",
        Some(&t.ana),
        None,
    )
    .await;
    assert_eq!(del.0, 204);
    let code = tokio::time::timeout(Duration::from_secs(1), ben.closed())
        .await
        .expect("socket still open after 1 s");
    assert_eq!(code, Some(4003));
    assert!(started.elapsed() < Duration::from_secs(1));
    let doc = format!("/api/rooms/{}/doc", t.room);
    assert_eq!(
        http(&t.server.url(&doc), "GET", Some(&t.ben), None).await.0,
        404
    );
    assert_eq!(
        http(
            &t.server.url(&format!("/api/rooms/{}", t.room)),
            "GET",
            Some(&t.ben),
            None
        )
        .await
        .0,
        404
    );
    assert!(verify_cli(&storage).await.0);
    t.server.terminate().await;
}

#[tokio::test]
async fn audit_verify_names_tampered_records() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    // 50 concurrent sensitive actions: exactly 50 records, and a chain that verifies.
    let before = audit(&t.server, &t.ana, &t.room).await.len();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (url, ana) = (
            t.server
                .url(&format!("/api/rooms/{}/participants/{}", t.room, t.ben_id)),
            t.ana.clone(),
        );
        let body = if i % 2 == 0 {
            r#"{"grant":["invite"]}"#
        } else {
            r#"{"revoke":["invite"]}"#
        };
        tasks.push(tokio::spawn(async move {
            http(&url, "PATCH", Some(&ana), Some(body)).await.0
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 200);
    }
    let log = audit(&t.server, &t.ana, &t.room).await;
    assert_eq!(log.len(), before + 50);
    let (ok, text) = verify_cli(&storage).await;
    assert!(ok, "{text}");
    t.server.terminate().await;

    let mut conn = storage.sqlite().await;
    let snapshot_rows = sqlx::query_as::<_, (i64, String, String)>(
        "SELECT seq, details, hash FROM audit_log WHERE chain = $1 ORDER BY seq",
    )
    .bind(&t.room)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let n = snapshot_rows.len() as i64;

    // A flipped byte.
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET at = at + 1 WHERE chain = $1 AND seq = 10",
    )
    .await;
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains("record 10"), "{text}");
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET at = at - 1 WHERE chain = $1 AND seq = 10",
    )
    .await;
    assert!(verify_cli(&storage).await.0);

    // A swapped pair.
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET seq = -1 WHERE chain = $1 AND seq = 20",
    )
    .await;
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET seq = 20 WHERE chain = $1 AND seq = 21",
    )
    .await;
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET seq = 21 WHERE chain = $1 AND seq = -1",
    )
    .await;
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains("record 20"), "{text}");
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET seq = -1 WHERE chain = $1 AND seq = 20",
    )
    .await;
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET seq = 20 WHERE chain = $1 AND seq = 21",
    )
    .await;
    exec(
        &mut conn,
        &t.room,
        "UPDATE audit_log SET seq = 21 WHERE chain = $1 AND seq = -1",
    )
    .await;
    assert!(verify_cli(&storage).await.0);

    // Truncation: the tail is gone, caught against the checkpoint outside the table.
    sqlx::query("DELETE FROM audit_log WHERE chain = $1 AND seq > $2")
        .bind(&t.room)
        .bind(n - 3)
        .execute(&mut conn)
        .await
        .unwrap();
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains(&format!("record {}", n - 2)), "{text}");

    // A deleted record in the middle.
    exec(
        &mut conn,
        &t.room,
        "DELETE FROM audit_log WHERE chain = $1 AND seq = 5",
    )
    .await;
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains("record 5"), "{text}");
}

/// Without its checkpoint a chain cannot show that its last records were deleted, so verify
/// fails instead of passing a truncated chain (it used to print `ok`), unless told
/// `--no-checkpoint`, which says what it cannot detect.
#[tokio::test]
async fn audit_verify_needs_the_checkpoint() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    t.server.terminate().await;
    assert!(verify_cli(&storage).await.0);
    let mut conn = storage.sqlite().await;
    sqlx::query("DELETE FROM audit_log WHERE chain = $1 AND seq > 1")
        .bind(&t.room)
        .execute(&mut conn)
        .await
        .unwrap();
    let checkpoint = storage.dir.path().join("audit-checkpoint.json");
    for kept in [None, Some("{}")] {
        match kept {
            None => std::fs::remove_file(&checkpoint).unwrap_or(()),
            Some(text) => std::fs::write(&checkpoint, text).unwrap(),
        }
        let (ok, text) = verify_cli(&storage).await;
        assert!(
            !ok,
            "a truncated chain passed without its checkpoint: {text}"
        );
        assert!(text.contains("has no checkpoint"), "{text}");
    }
    let out = tokio::process::Command::new(BIN)
        .args(["audit", "verify", "--no-checkpoint"])
        .args(storage.args())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("last records were deleted passes"), "{err}");
}

#[tokio::test]
async fn sensitive_actions_fail_closed_without_the_database() {
    let Some(Backend::Postgres(admin)) = backends()
        .into_iter()
        .find(|b| matches!(b, Backend::Postgres(_)))
    else {
        return;
    };
    let storage = Storage::new(&Backend::Postgres(admin)).await;
    let t = team(&storage).await;
    storage.drop_db().await;
    let body = r#"{"role":"viewer"}"#;
    let url = t
        .server
        .url(&format!("/api/rooms/{}/participants/{}", t.room, t.ben_id));
    let (status, _) = http(&url, "PATCH", Some(&t.ana), Some(body)).await;
    assert_eq!(status, 503);
    let (status, _) = http(
        &t.server.url(&format!("/api/rooms/{}/invites", t.room)),
        "POST",
        Some(&t.ana),
        Some(r#"{"role":"viewer","ttl_s":60,"max_uses":1}"#),
    )
    .await;
    assert_eq!(status, 503);
    let _ = t.cy;
    t.server.kill9().await;
}

async fn exec(conn: &mut sqlx::SqliteConnection, room: &str, sql: &str) {
    sqlx::query(sql).bind(room).execute(conn).await.unwrap();
}

#[tokio::test]
async fn approvals_bind_to_another_approver_and_the_exact_parameters() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    // Ana writes a file the way the editor does: files map -> Y.Text.
    let mut ana = Client::connect(&t.server, &t.room, &t.ana).await;
    ana.synced().await;
    let update = {
        use yrs::{Map, Transact};
        let files = ana.doc.get_or_insert_map("files");
        let mut txn = ana.doc.transact_mut();
        files.insert(&mut txn, "main.rs", yrs::TextPrelim::new("fn main() {}"));
        txn.encode_update_v1()
    };
    ana.send(YMessage::Sync(SyncMessage::Update(update))).await;
    // No acknowledgements in y-websocket: wait until a fresh client sees the file.
    let mut seen = false;
    for _ in 0..100 {
        let mut c = Client::connect(&t.server, &t.room, &t.ana).await;
        c.synced().await;
        let has = {
            use yrs::{Map, Transact};
            let files = c.doc.get_or_insert_map("files");
            let txn = c.doc.transact();
            files.get(&txn, "main.rs").is_some()
        };
        if has {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen);
    let grant = r#"{"grant":["export"]}"#;
    assert_eq!(
        set_role(&t.server, &t.ana, &t.room, &t.ben_id, grant).await,
        200
    );

    let exports = t.server.url(&format!("/api/rooms/{}/exports", t.room));
    let (status, body) = http(
        &exports,
        "POST",
        Some(&t.ben),
        Some(r#"{"files":["main.rs"]}"#),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Not usable before a decision.
    let with = |files: &str| format!(r#"{{"files":{files},"approval_id":"{id}"}}"#);
    assert_eq!(
        http(
            &exports,
            "POST",
            Some(&t.ben),
            Some(&with(r#"["main.rs"]"#))
        )
        .await
        .0,
        403
    );

    let decision = t
        .server
        .url(&format!("/api/rooms/{}/approvals/{id}/decision", t.room));
    assert_eq!(
        http(&decision, "POST", Some(&t.ben), Some(r#"{"approve":true}"#))
            .await
            .0,
        403,
        "self-approval"
    );
    assert_eq!(
        http(&decision, "POST", Some(&t.cy), Some(r#"{"approve":true}"#))
            .await
            .0,
        403,
        "no approve capability"
    );
    assert_eq!(
        http(&decision, "POST", Some(&t.ana), Some(r#"{"approve":true}"#))
            .await
            .0,
        200
    );
    assert_eq!(
        http(
            &decision,
            "POST",
            Some(&t.ana),
            Some(r#"{"approve":false}"#)
        )
        .await
        .0,
        403,
        "decided once"
    );

    // Other parameters need a new approval; the approved ones work once.
    assert_eq!(
        http(
            &exports,
            "POST",
            Some(&t.ben),
            Some(&with(r#"["main.rs","secret.env"]"#))
        )
        .await
        .0,
        403
    );
    let (status, body) = http(
        &exports,
        "POST",
        Some(&t.ben),
        Some(&with(r#"["main.rs"]"#)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["files"]["main.rs"], "fn main() {}");
    assert_eq!(
        http(
            &exports,
            "POST",
            Some(&t.ben),
            Some(&with(r#"["main.rs"]"#))
        )
        .await
        .0,
        403,
        "single use"
    );

    // Expired requests can be neither decided nor used.
    let (_, body) = http(
        &exports,
        "POST",
        Some(&t.ben),
        Some(r#"{"files":["main.rs"]}"#),
    )
    .await;
    let late = serde_json::from_str::<serde_json::Value>(&body).unwrap()["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut conn = storage.sqlite().await;
    sqlx::query("UPDATE approvals SET expires_at = 1 WHERE id = $1")
        .bind(&late)
        .execute(&mut conn)
        .await
        .unwrap();
    let late_decision = t
        .server
        .url(&format!("/api/rooms/{}/approvals/{late}/decision", t.room));
    assert_eq!(
        http(
            &late_decision,
            "POST",
            Some(&t.ana),
            Some(r#"{"approve":true}"#)
        )
        .await
        .0,
        403
    );
    let list = get_json(
        &t.server,
        &t.cy,
        &format!("/api/rooms/{}/approvals", t.room),
    )
    .await;
    let states: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["used", "expired"]);
    assert!(verify_cli(&storage).await.0);
    t.server.terminate().await;
}

#[tokio::test]
async fn expiry_removal_and_logout_hold_on_open_sockets() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let cy_id = me(&t.server, &t.cy).await;
    let url = |u: &str| {
        t.server
            .url(&format!("/api/rooms/{}/participants/{u}", t.room))
    };

    // Outsiders change nothing, not even a no-op, and learn nothing.
    let zed = storage.token("zed@example.com").await;
    assert_eq!(
        http(
            &url(&t.ben_id),
            "PATCH",
            Some(&zed),
            Some(r#"{"grant":["observe"]}"#)
        )
        .await
        .0,
        404
    );
    // An expiry applies to granted capabilities only.
    let in_a_minute = store_now() + 60_000;
    let body = format!(r#"{{"role":"editor","expires_at":{in_a_minute}}}"#);
    assert_eq!(
        http(&url(&cy_id), "PATCH", Some(&t.ana), Some(&body))
            .await
            .0,
        400
    );
    // A temporary grant cannot be made permanent by its holder.
    let body = format!(r#"{{"grant":["approve"],"expires_at":{in_a_minute}}}"#);
    assert_eq!(
        http(&url(&t.ben_id), "PATCH", Some(&t.ana), Some(&body))
            .await
            .0,
        200
    );
    assert_eq!(
        http(
            &url(&t.ben_id),
            "PATCH",
            Some(&t.ben),
            Some(r#"{"grant":["approve"]}"#)
        )
        .await
        .0,
        403
    );

    // Cy may edit for 1.5 s; an open socket loses the right when it lapses.
    let soon = store_now() + 1500;
    let body = format!(r#"{{"grant":["edit"],"expires_at":{soon}}}"#);
    assert_eq!(
        http(&url(&cy_id), "PATCH", Some(&t.ana), Some(&body))
            .await
            .0,
        200
    );
    let mut cy = Client::connect(&t.server, &t.room, &t.cy).await;
    cy.synced().await;
    cy.insert("notes", 0, "early").await;
    eventually(&t.server, &t.room, &t.ana, "notes", "early").await;
    while store_now() <= soon + 50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cy.insert("notes", 5, " late").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        snapshot(&t.server, &t.room, &t.ana, "notes").await.0,
        "early"
    );

    // Logging out closes the sockets that session opened.
    let out = http(&t.server.url("/api/auth/logout"), "POST", Some(&t.cy), None).await;
    assert_eq!(out.0, 204);
    let code = tokio::time::timeout(Duration::from_secs(1), cy.closed())
        .await
        .unwrap();
    assert_eq!(code, Some(4001));

    // A removed participant cannot come back through an old link; a new invite works.
    let (_, old_link) = invite(&t.server, &t.ana, &t.room, "viewer", 10).await;
    let ben_del = http(&url(&t.ben_id), "DELETE", Some(&t.ana), None).await;
    assert_eq!(ben_del.0, 204);
    assert_eq!(accept(&t.server, &t.ben, &old_link).await, 410);
    let (_, new_link) = invite(&t.server, &t.ana, &t.room, "viewer", 1).await;
    assert_eq!(accept(&t.server, &t.ben, &new_link).await, 200);
    assert!(verify_cli(&storage).await.0);
    t.server.terminate().await;
}

fn store_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

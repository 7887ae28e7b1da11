//! Authorization end to end: invites, live downgrades and removals, refused edits, and the
//! tamper-evident audit chain checked by `coderoom audit verify`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::time::Duration;
use yrs::sync::protocol::{Message as YMessage, SyncMessage};

async fn verify_cli(storage: &Storage) -> (bool, String) {
    storage.cli(&["audit", "verify"]).await
}

async fn invites_never_exceed_their_issuer_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
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
    // Shown before it is accepted: the room, who invited, the role; gone links say why.
    let shown = |token: &str| {
        let url = t.server.url(&format!("/api/invites/{token}"));
        let dan = dan.clone();
        async move { http(&url, "GET", Some(&dan), None).await }
    };
    let (status, body) = shown(&ben_invite).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["room_id"], t.room.as_str());
    assert_eq!(v["invited_by"], "ben@example.com");
    assert_eq!(
        (v["role"].as_str(), v["uses_left"].as_i64()),
        (Some("editor"), Some(5))
    );
    assert!(v["room_name"].is_string());
    let (status, body) = shown(&ana_invite).await;
    assert_eq!(status, 410);
    assert!(body.contains("revoked"), "{body}");
    let unknown = format!("inv_{}", "0".repeat(64));
    assert_eq!(shown(&unknown).await.0, 404);
    let anonymous = http(
        &t.server.url(&format!("/api/invites/{ben_invite}")),
        "GET",
        None,
        None,
    )
    .await;
    assert_eq!(anonymous.0, 401);
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

on_each_backend!(
    invites_never_exceed_their_issuer,
    invites_never_exceed_their_issuer_on
);

async fn viewers_cannot_edit_and_downgrades_bite_on_the_next_frame_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
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
    fence(&mut cy, &mut ana, "after-viewer-edits").await;
    // The viewer is told, once, that its changes were not kept (its page drops them).
    let reason = cy.told().await;
    assert!(reason.contains("not kept"), "{reason}");
    assert_eq!(
        ana.content("main.rs"),
        "seed",
        "a peer received the viewer's update"
    );
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
    fence(&mut ben, &mut ana, "after-downgrade").await;
    assert_eq!(ana.content("main.rs"), "seed!");
    assert_eq!(
        snapshot(&t.server, &t.room, &t.ana, "main.rs").await.0,
        "seed!"
    );
    denial_audited(&t.server, &t.ana, &t.room, &t.ben_id).await;

    // Removal closes his sockets within a second, seen from his end (from the owner's request
    // to his client reading the close), and reconnecting fails.
    let asked = std::time::Instant::now();
    let del = http(
        &t.server
            .url(&format!("/api/rooms/{}/participants/{}", t.room, t.ben_id)),
        "DELETE",
        Some(&t.ana),
        None,
    )
    .await;
    assert_eq!(del.0, 204);
    assert_eq!(ben.closed().await, Some(4003));
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(1),
        "his socket closed {:?} after the removal was asked",
        asked.elapsed()
    );
    // The log names him by email though he is no longer in the room (not part of the hash).
    let log = audit(&t.server, &t.ana, &t.room).await;
    let removal = log
        .iter()
        .rev()
        .find(|r| r["action"] == "remove_participant")
        .expect("the removal is logged");
    assert_eq!(removal["target_email"], "ben@example.com", "{removal}");
    assert_eq!(removal["actor_email"], "ana@example.com", "{removal}");
    closed_within_a_second(&t.server, 1.0).await;
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

on_each_backend!(
    viewers_cannot_edit_and_downgrades_bite_on_the_next_frame,
    viewers_cannot_edit_and_downgrades_bite_on_the_next_frame_on
);

async fn audit_verify_names_tampered_records_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
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

    let n = storage
        .query_i64(
            "SELECT COUNT(*) FROM audit_log WHERE chain = $1",
            &[(&t.room).into()],
        )
        .await;

    // A flipped byte.
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET at = at + 1 WHERE chain = $1 AND seq = 10",
    )
    .await;
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains("record 10"), "{text}");
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET at = at - 1 WHERE chain = $1 AND seq = 10",
    )
    .await;
    assert!(verify_cli(&storage).await.0);

    // A swapped pair.
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET seq = -1 WHERE chain = $1 AND seq = 20",
    )
    .await;
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET seq = 20 WHERE chain = $1 AND seq = 21",
    )
    .await;
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET seq = 21 WHERE chain = $1 AND seq = -1",
    )
    .await;
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains("record 20"), "{text}");
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET seq = -1 WHERE chain = $1 AND seq = 20",
    )
    .await;
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET seq = 20 WHERE chain = $1 AND seq = 21",
    )
    .await;
    exec(
        &storage,
        &t.room,
        "UPDATE audit_log SET seq = 21 WHERE chain = $1 AND seq = -1",
    )
    .await;
    assert!(verify_cli(&storage).await.0);

    // Truncation: the tail is gone, caught against the checkpoint outside the table.
    storage
        .execute(
            "DELETE FROM audit_log WHERE chain = $1 AND seq > $2",
            &[(&t.room).into(), (n - 3).into()],
        )
        .await;
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains(&format!("record {}", n - 2)), "{text}");

    // A deleted record in the middle.
    exec(
        &storage,
        &t.room,
        "DELETE FROM audit_log WHERE chain = $1 AND seq = 5",
    )
    .await;
    let (ok, text) = verify_cli(&storage).await;
    assert!(!ok && text.contains("record 5"), "{text}");
}

on_each_backend!(
    audit_verify_names_tampered_records,
    audit_verify_names_tampered_records_on
);

/// Without its checkpoint a chain cannot show that its last records were deleted, so verify
/// fails instead of passing a truncated chain (it used to print `ok`), unless told
/// `--no-checkpoint`, which says what it cannot detect.
async fn audit_verify_needs_the_checkpoint_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let t = team(&storage).await;
    t.server.terminate().await;
    assert!(verify_cli(&storage).await.0);
    storage
        .execute(
            "DELETE FROM audit_log WHERE chain = $1 AND seq > 1",
            &[(&t.room).into()],
        )
        .await;
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
    let (ok, text) = storage.cli(&["audit", "verify", "--no-checkpoint"]).await;
    assert!(ok, "{text}");
    assert!(text.contains("last records were deleted passes"), "{text}");
}

on_each_backend!(
    audit_verify_needs_the_checkpoint,
    audit_verify_needs_the_checkpoint_on
);

#[tokio::test]
async fn sensitive_actions_fail_closed_without_the_database() {
    let Some(postgres) = postgres() else {
        return;
    };
    let storage = Storage::new(&postgres).await;
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

/// A viewer whose client repeats what the room has (its sync step 2 on every reconnect carries
/// the whole document and its deletions) is not told its changes were not kept: its page would
/// start again with a false notice on every reconnect.
#[tokio::test]
async fn a_viewer_repeating_what_the_room_has_is_told_nothing() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let mut ana = Client::connect(&t.server, &t.room, &t.ana).await;
    ana.synced().await;
    ana.insert("main.rs", 0, "abcdef").await;
    ana.remove("main.rs", 1, 2).await;
    eventually(&t.server, &t.room, &t.ana, "main.rs", "adef").await;
    let mut cy = Client::connect(&t.server, &t.room, &t.cy).await;
    cy.synced().await;
    let everything = {
        use yrs::{ReadTxn, Transact};
        cy.doc
            .transact()
            .encode_state_as_update_v1(&yrs::StateVector::default())
    };
    cy.send(YMessage::Sync(SyncMessage::SyncStep2(everything)))
        .await;
    // A presence state from ana, sent after cy's step 2 was handled, ends the wait.
    fence(&mut cy, &mut ana, "cy-step2-handled").await;
    let told = fence(&mut ana, &mut cy, "back-to-cy").await;
    assert!(told.is_empty(), "told {told:?}");
    t.server.terminate().await;
}

/// Sends a presence state carrying `marker` from `from` and reads `to` until it arrives. A room
/// handles one connection's frames in order and sends a batch's updates before its presence,
/// so any edit `from` sent earlier that the room accepted has reached `to` by then. Returns what
/// `to` was told meanwhile (y-protocols' permission-denied reasons).
async fn fence(from: &mut Client, to: &mut Client, marker: &str) -> Vec<Option<String>> {
    // Each fence is newer than the last (a presence state that is not newer is not relayed).
    static CLOCK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let state = serde_json::json!({ "marker": marker }).to_string();
    let id = from.doc.client_id();
    let clients = [(
        id,
        yrs::sync::awareness::AwarenessUpdateEntry {
            clock: CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            json: state.into(),
        },
    )]
    .into_iter()
    .collect();
    from.send(YMessage::Awareness(yrs::sync::AwarenessUpdate { clients }))
        .await;
    let mut told = Vec::new();
    loop {
        match to.next().await {
            Event::Y(YMessage::Awareness(u))
                if u.clients.values().any(|e| e.json.contains(marker)) =>
            {
                return told
            }
            Event::Y(YMessage::Auth(reason)) => told.push(reason),
            Event::Y(_) => {}
            Event::Closed(code) => panic!("closed ({code:?}) waiting for the fence {marker:?}"),
        }
    }
}

/// Waits for the room's audit chain to hold a refused edit by `user`.
async fn denial_audited(server: &Server, token: &str, room: &str, user: &str) {
    for _ in 0..300 {
        let log = audit(server, token, room).await;
        if log
            .iter()
            .any(|r| r["action"] == "edit" && r["decision"] == "deny" && r["actor"] == user)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the refused edit by {user} was never audited");
}

/// The `n` sockets access decisions have closed so far each closed within a second of the
/// decision, measured by the server (`coderoom_access_close_seconds`), not by this client.
async fn closed_within_a_second(server: &Server, n: f64) {
    let count = server.metric("coderoom_access_close_seconds_count").await;
    let within = server
        .metric("coderoom_access_close_seconds_bucket{le=\"1.0\"}")
        .await;
    assert_eq!((count, within), (n, n));
}

/// A writer of the data directory can delete a chain's last records and rewrite the checkpoint
/// to match: `audit verify` then passes. The heads the server anchored at start and stop in a
/// file outside the data directory catch it (`--anchor`), naming the chain and record; and a
/// record whose column was given the wrong type is named by chain and record too.
async fn audit_anchors_catch_a_rewritten_checkpoint_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let outside = tempfile::tempdir().unwrap();
    let anchors = outside.path().join("anchors.jsonl");
    let anchor_arg = anchors.display().to_string();
    let t = team_with(&storage, &["--audit-anchor-file", &anchor_arg]).await;
    for _ in 0..3 {
        let url = t
            .server
            .url(&format!("/api/rooms/{}/participants/{}", t.room, t.ben_id));
        let body = Some(r#"{"grant":["invite"]}"#);
        assert_eq!(http(&url, "PATCH", Some(&t.ana), body).await.0, 200);
    }
    assert!(t.server.terminate().await.success());
    let (ok, text) = storage
        .cli(&["audit", "verify", "--anchor", &anchor_arg])
        .await;
    assert!(ok, "{text}");

    // Delete the room chain's last two records, and make the checkpoint agree.
    let n = storage
        .query_i64(
            "SELECT MAX(seq) FROM audit_log WHERE chain = $1",
            &[(&t.room).into()],
        )
        .await;
    storage
        .execute(
            "DELETE FROM audit_log WHERE chain = $1 AND seq > $2",
            &[(&t.room).into(), (n - 2).into()],
        )
        .await;
    let (ok, text) = storage.cli(&["audit", "verify"]).await;
    assert!(!ok, "the truncation passed against the checkpoint: {text}");
    // The new last record, read as any client would (the restart anchors nothing outside:
    // it has no --audit-anchor-file).
    let records = {
        let server = Server::start(&storage, &[]).await;
        let log = audit(&server, &t.ana, &t.room).await;
        assert!(server.terminate().await.success());
        log
    };
    let last = records.iter().max_by_key(|r| r["seq"].as_i64()).unwrap();
    let checkpoint = storage.dir.path().join("audit-checkpoint.json");
    let mut heads: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    heads[&t.room] = serde_json::json!([last["seq"], last["hash"]]);
    std::fs::write(&checkpoint, serde_json::to_vec(&heads).unwrap()).unwrap();
    // Without the anchors, nothing shows.
    let (ok, text) = storage.cli(&["audit", "verify"]).await;
    assert!(ok, "{text}");
    // With them, the chain and the first missing anchored record are named.
    let (ok, text) = storage
        .cli(&["audit", "verify", "--anchor", &anchor_arg])
        .await;
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("audit chain {}", t.room)) && text.contains("anchor"),
        "{text}"
    );
}

on_each_backend!(
    audit_anchors_catch_a_rewritten_checkpoint,
    audit_anchors_catch_a_rewritten_checkpoint_on
);

/// SQLite stores whatever it is given: a record whose `at` was set to text is named by chain
/// and record, not reported as a bare database error. (PostgreSQL refuses such a write.)
#[tokio::test]
async fn audit_verify_names_a_record_with_a_mistyped_column() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    t.server.terminate().await;
    storage
        .execute(
            "UPDATE audit_log SET at = 'noon' WHERE chain = $1 AND seq = 2",
            &[(&t.room).into()],
        )
        .await;
    let (ok, text) = storage.cli(&["audit", "verify"]).await;
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("audit chain {}: record 2: column `at`", t.room)),
        "{text}"
    );
}

async fn exec(storage: &Storage, room: &str, sql: &str) {
    storage.execute(sql, &[room.into()]).await;
}

async fn approvals_bind_to_another_approver_and_the_exact_parameters_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
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
    // An approval asked for lives an hour (from its decision; its row is stamped when written,
    // a moment later).
    let lives = storage
        .query_i64(
            "SELECT expires_at - created_at FROM approvals WHERE id = $1",
            &[(&late).into()],
        )
        .await;
    assert!(
        (60 * 60 * 1000 - 1000..=60 * 60 * 1000).contains(&lives),
        "{lives}"
    );
    storage
        .execute(
            "UPDATE approvals SET expires_at = 1 WHERE id = $1",
            &[(&late).into()],
        )
        .await;
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

on_each_backend!(
    approvals_bind_to_another_approver_and_the_exact_parameters,
    approvals_bind_to_another_approver_and_the_exact_parameters_on
);

async fn expiry_removal_and_logout_hold_on_open_sockets_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
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
    let in_a_minute = now_ms() + 60_000;
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
    let soon = now_ms() + 1500;
    let body = format!(r#"{{"grant":["edit"],"expires_at":{soon}}}"#);
    assert_eq!(
        http(&url(&cy_id), "PATCH", Some(&t.ana), Some(&body))
            .await
            .0,
        200
    );
    let mut ana = Client::connect(&t.server, &t.room, &t.ana).await;
    ana.synced().await;
    let mut cy = Client::connect(&t.server, &t.room, &t.cy).await;
    cy.synced().await;
    cy.insert("notes", 0, "early").await;
    eventually(&t.server, &t.room, &t.ana, "notes", "early").await;
    while now_ms() <= soon + 50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cy.insert("notes", 5, " late").await;
    fence(&mut cy, &mut ana, "after-lapse").await;
    assert_eq!(ana.content("notes"), "early");
    assert_eq!(
        snapshot(&t.server, &t.room, &t.ana, "notes").await.0,
        "early"
    );
    denial_audited(&t.server, &t.ana, &t.room, &cy_id).await;

    // Logging out closes the sockets that session opened, within a second of the logout.
    let out = http(&t.server.url("/api/auth/logout"), "POST", Some(&t.cy), None).await;
    assert_eq!(out.0, 204);
    assert_eq!(cy.closed().await, Some(4001));
    closed_within_a_second(&t.server, 1.0).await;

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

on_each_backend!(
    expiry_removal_and_logout_hold_on_open_sockets,
    expiry_removal_and_logout_hold_on_open_sockets_on
);

/// Anyone may leave a room (and it is recorded as their own removal); the room's last owner
/// may not. The room list says what each room is to its reader.
#[tokio::test]
async fn anyone_may_leave_but_the_last_owner() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let (status, list) = send_json(&t.server, &t.ben, "GET", "/api/rooms", "").await;
    assert_eq!(status, 200);
    let item = &list[0];
    assert_eq!(item["role"], "editor", "{item}");
    assert_eq!(item["members"], 3, "{item}");
    assert!(
        item["last_activity"].as_i64() >= item["created_at"].as_i64(),
        "{item}"
    );
    assert!(item["sandbox"].is_null(), "{item}");

    let leave = |who: &str| format!("/api/rooms/{}/participants/{who}", t.room);
    let (status, _) = http(
        &t.server.url(&leave(&t.ben_id)),
        "DELETE",
        Some(&t.ben),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let ana_id = me(&t.server, &t.ana).await;
    let (status, body) = http(&t.server.url(&leave(&ana_id)), "DELETE", Some(&t.ana), None).await;
    assert_eq!(status, 403, "{body}");
    let log = audit(&t.server, &t.ana, &t.room).await;
    assert!(log.iter().any(|r| r["action"] == "remove_participant"
        && r["actor"] == t.ben_id.as_str()
        && r["decision"] == "allow"));
}

on_each_backend!(
    invites_choose_capabilities_and_go_to_one_address,
    invites_choose_capabilities_and_go_to_one_address_on
);

/// An invite may hold chosen capabilities (never more than its issuer holds), and may be sent
/// to one address: mailed the link, and only that account may accept it.
async fn invites_choose_capabilities_and_go_to_one_address_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let t = team(&storage).await;
    let post = |token: String, body: String| {
        let url = t.server.url(&format!("/api/rooms/{}/invites", t.room));
        async move { http(&url, "POST", Some(&token), Some(&body)).await }
    };
    let grant = r#"{"grant":["invite"]}"#;
    assert_eq!(
        set_role(&t.server, &t.ana, &t.room, &t.ben_id, grant).await,
        200
    );
    // Never more than the issuer holds; observe always; known names only.
    let body = |caps: &str| {
        format!(r#"{{"role":"viewer","ttl_s":3600,"max_uses":1,"capabilities":{caps}}}"#)
    };
    let (status, _) = post(t.ben.clone(), body(r#"["observe","edit","publish"]"#)).await;
    assert_eq!(status, 403);
    assert_eq!(post(t.ben.clone(), body(r#"["edit"]"#)).await.0, 400);
    assert_eq!(
        post(t.ben.clone(), body(r#"["observe","fly"]"#)).await.0,
        400
    );
    let (status, made) = post(t.ben.clone(), body(r#"["observe","edit"]"#)).await;
    assert_eq!(status, 201, "{made}");
    let token = serde_json::from_str::<serde_json::Value>(&made).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let dan = storage.token("dan@example.com").await;
    let shown = get_json(&t.server, &dan, &format!("/api/invites/{token}")).await;
    assert_eq!(
        shown["capabilities"],
        serde_json::json!(["observe", "edit"])
    );
    assert_eq!(accept(&t.server, &dan, &token).await, 200);
    let v = get_json(&t.server, &dan, &format!("/api/rooms/{}", t.room)).await;
    assert_eq!(v["my_capabilities"], serde_json::json!(["observe", "edit"]));

    // To one address: mailed, and nobody else gets in with the link.
    let to_eve = r#"{"role":"viewer","ttl_s":3600,"max_uses":1,"capabilities":["observe","export"],"email":" Eve@Example.com "}"#;
    let many = to_eve.replace(r#""max_uses":1"#, r#""max_uses":5"#);
    assert_eq!(post(t.ana.clone(), many).await.0, 400);
    let bad = to_eve.replace("Eve@Example.com", "not an address");
    assert_eq!(post(t.ana.clone(), bad).await.0, 400);
    let (status, made) = post(t.ana.clone(), to_eve.into()).await;
    assert_eq!(status, 201, "{made}");
    let made: serde_json::Value = serde_json::from_str(&made).unwrap();
    assert_eq!(made["sent_to"], "eve@example.com");
    let token = made["token"].as_str().unwrap();
    let mail = wait_for_mail(&storage, "eve@example.com", "invites you").await;
    assert!(
        mail.contains(&format!("/invite/{token}")) && mail.contains("ana@example.com"),
        "{mail}"
    );
    let fay = storage.token("fay@example.com").await;
    assert_eq!(accept(&t.server, &fay, token).await, 403);
    // Nor does anyone else learn what it offers, or to whom.
    let url = t.server.url(&format!("/api/invites/{token}"));
    let (status, body) = http(&url, "GET", Some(&fay), None).await;
    assert_eq!(status, 403);
    assert!(!body.contains("eve@example.com"), "{body}");
    let eve = storage.token("eve@example.com").await;
    let shown = get_json(&t.server, &eve, &format!("/api/invites/{token}")).await;
    assert_eq!(shown["email"], "eve@example.com");
    assert_eq!(accept(&t.server, &eve, token).await, 200);
    let v = get_json(&t.server, &eve, &format!("/api/rooms/{}", t.room)).await;
    assert_eq!(
        v["my_capabilities"],
        serde_json::json!(["observe", "export"])
    );
    let entries = audit(&t.server, &t.ana, &t.room).await;
    assert!(entries.iter().any(|e| e["action"] == "create_invite"
        && e["details"]["email"] == "eve@example.com"
        && e["details"]["capabilities"] == serde_json::json!(["observe", "export"])));
    assert!(verify_cli(&storage).await.0);
    t.server.terminate().await;
}

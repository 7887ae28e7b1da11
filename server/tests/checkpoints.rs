//! Checkpoints and rollback (issue 20): a checkpoint holds the document and the workspace; a
//! restore makes every connected client's text and the files on disk read as they did, as one
//! change by whoever restored it, and the audit says so. Needs bubblewrap and root, as the
//! sandbox tests do.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use yrs::sync::protocol::{Message as YMessage, SyncMessage};
use yrs::{GetString, Map, Out, Transact};

/// Path -> text of a client's document.
fn texts(c: &Client) -> BTreeMap<String, String> {
    let files = c.doc.get_or_insert_map("files");
    let txn = c.doc.transact();
    files
        .iter(&txn)
        .filter_map(|(p, v)| match v {
            Out::YText(t) => Some((p.to_owned(), t.get_string(&txn))),
            _ => None,
        })
        .collect()
}

/// Receives until `c`'s files read `want`.
async fn wait_for_texts(c: &mut Client, want: &BTreeMap<String, String>) {
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while texts(c) != *want {
            if let Event::Closed(code) = c.next().await {
                panic!("closed ({code:?})");
            }
        }
    })
    .await;
    assert!(r.is_ok(), "the files read {:?}, not {want:?}", texts(c));
}

on_each_backend!(
    a_restore_brings_back_the_files_in_every_client_and_on_disk,
    a_restore_brings_back_the_files_in_every_client_and_on_disk_on
);

async fn a_restore_brings_back_the_files_in_every_client_and_on_disk_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let mut ana = Client::connect(server, room, &t.ana).await;
    ana.synced().await;
    let mut ben = Client::connect(server, room, &t.ben).await;
    ben.synced().await;
    ana.put_file("main.rs", "fn main() {\n    println!(\"one\");\n}\n")
        .await;
    ana.put_file("notes.txt", "keep me").await;
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "printf 'bin\\000ary' > blob.bin && echo made > inside.txt && echo ok",
    )
    .await;
    assert_eq!(out["stdout"], "ok\n");
    // Ben's client applies frames as it reads them: it waits for each file it must hold.
    ben.wait_for_file("inside.txt", "made\n").await;
    ben.wait_for_file("notes.txt", "keep me").await;
    ben.wait_for_file("main.rs", "fn main() {\n    println!(\"one\");\n}\n")
        .await;
    stdout_until(server, &t.ben, room, "cat notes.txt", "keep me").await;
    let then = texts(&ben);
    assert_eq!(then.len(), 3, "{then:?}");

    let (status, cp) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/checkpoints"),
        r#"{"name":"before the risky step"}"#,
    )
    .await;
    assert_eq!(status, 201, "{cp}");
    let id = cp["id"].as_str().unwrap().to_owned();
    assert_eq!(cp["name"], "before the risky step");
    assert!(
        cp["bytes"].as_i64().unwrap() > 0 && cp["at"].is_i64(),
        "{cp}"
    );
    // A viewer sees the list but cannot make or restore one.
    let list = get_json(server, &t.cy, &format!("/api/rooms/{room}/checkpoints")).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["id"], id.as_str());
    let path = format!("/api/rooms/{room}/checkpoints");
    assert_eq!(post(server, &t.cy, &path, r#"{"name":"x"}"#).await.0, 403);
    let restore = format!("/api/rooms/{room}/checkpoints/{id}/restore");
    assert_eq!(post(server, &t.cy, &restore, "").await.0, 403);
    assert_eq!(post(server, &t.ana, &path, r#"{"name":""}"#).await.0, 400);
    let missing = format!("/api/rooms/{room}/checkpoints/{}/restore", "0".repeat(32));
    assert_eq!(post(server, &t.ana, &missing, "").await.0, 404);

    // The risky step: in the editor and in the terminal.
    ana.edit_file("main.rs", 0, "// broken\n").await;
    let removed = {
        let files = ana.doc.get_or_insert_map("files");
        let mut txn = ana.doc.transact_mut();
        files.remove(&mut txn, "notes.txt");
        txn.encode_update_v1()
    };
    ana.send(yrs::sync::protocol::Message::Sync(
        yrs::sync::protocol::SyncMessage::Update(removed),
    ))
    .await;
    ana.put_file("extra.txt", "new").await;
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "echo changed > inside.txt && rm blob.bin && echo junk > junk.txt && echo ok",
    )
    .await;
    assert_eq!(out["stdout"], "ok\n");
    ben.wait_for_file("junk.txt", "junk\n").await;
    ben.wait_for_file("inside.txt", "changed\n").await;
    ben.wait_for_file("extra.txt", "new").await;
    assert!(ben.file("notes.txt").is_none());

    let (status, body) = post(server, &t.ana, &restore, "").await;
    assert_eq!(status, 200, "{body}");
    // Every connected client reads the checkpoint's files, live.
    wait_for_texts(&mut ben, &then).await;
    wait_for_texts(&mut ana, &then).await;
    // So does the workspace, binary files too; what was made after is gone.
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "ls; cat inside.txt notes.txt; od -An -c blob.bin",
    )
    .await;
    assert_eq!(
        out["stdout"].as_str().unwrap(),
        "blob.bin\ninside.txt\nmain.rs\nnotes.txt\nmade\nkeep me   b   i   n  \\0   a   r   y\n",
        "{out}"
    );
    // And a client that joins now.
    let mut cy = Client::connect(server, room, &t.cy).await;
    cy.synced().await;
    assert_eq!(texts(&cy), then);
    // The audit names who restored what.
    let audit = get_json(server, &t.ana, &format!("/api/rooms/{room}/audit")).await;
    let ana_id = me(server, &t.ana).await;
    let restored = audit
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "restore_checkpoint" && r["decision"] == "allow")
        .unwrap_or_else(|| panic!("no restore in {audit}"));
    assert_eq!(restored["actor"], ana_id.as_str(), "{restored}");
    assert_eq!(restored["details"]["checkpoint"], id.as_str(), "{restored}");
    assert!(audit
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["action"] == "create_checkpoint" && r["actor"] == ana_id.as_str()));
}

on_each_backend!(
    a_fork_copies_files_never_authority_and_outlives_its_parent,
    a_fork_copies_files_never_authority_and_outlives_its_parent_on
);

/// A fork copies files, never authority: the new room has the parent's files (document and
/// workspace) and only its creator; the parent's chain records the fork and the fork's chain
/// starts with the parent's id and chain head; both verify; deleting the parent leaves the fork.
async fn a_fork_copies_files_never_authority_and_outlives_its_parent_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let root = storage.token("root@example.com").await;
    let t = team_with(&storage, &["--admin-emails", "root@example.com"]).await;
    let (server, room) = (&t.server, &t.room);
    let mut ana = Client::connect(server, room, &t.ana).await;
    ana.synced().await;
    ana.put_file("src/main.rs", "fn main() {}\n").await;
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "printf 'bin\\000ary' > blob.bin && echo ok",
    )
    .await;
    assert_eq!(out["stdout"], "ok\n");
    stdout_until(server, &t.ben, room, "cat src/main.rs", "fn main").await;
    // Authority the fork must not take: an open invite and a pending approval.
    let (status, _) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/invites"),
        r#"{"role":"editor","ttl_s":600,"max_uses":5}"#,
    )
    .await;
    assert_eq!(status, 201);
    let (status, _) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/exports"),
        r#"{"files":["src/main.rs"]}"#,
    )
    .await;
    assert_eq!(status, 202);

    // The owner holds `export` and forks at once.
    let fork = format!("/api/rooms/{room}/fork");
    let (status, f) = post(server, &t.ana, &fork, r#"{"name":"experiment"}"#).await;
    assert_eq!(status, 201, "{f}");
    let new = f["id"].as_str().unwrap().to_owned();
    assert_eq!(f["parent"]["room"], room.as_str());
    let checkpoint = f["parent"]["checkpoint"].as_str().unwrap().to_owned();

    let v = get_json(server, &t.ana, &format!("/api/rooms/{new}")).await;
    assert_eq!(v["name"], "experiment");
    let people = v["participants"].as_array().unwrap();
    assert_eq!(people.len(), 1, "{v}");
    assert_eq!(people[0]["email"], "ana@example.com");
    assert_eq!(people[0]["role"], "owner");
    assert_eq!(v["repos"], serde_json::json!([]));
    assert_eq!(v["secret_rules"], serde_json::json!([]));
    assert_eq!(v["budget"], Value::Null);
    assert_eq!(v["parent"]["room"], room.as_str());
    assert_eq!(v["parent"]["dropped"]["participants"], 2, "{v}");
    assert!(
        v["parent"]["dropped"]["invites"].as_i64().unwrap() >= 1,
        "{v}"
    );
    assert_eq!(v["parent"]["dropped"]["approvals"], 1, "{v}");
    for who in [&t.ben, &t.cy] {
        let (status, _) = http(
            &server.url(&format!("/api/rooms/{new}")),
            "GET",
            Some(who),
            None,
        )
        .await;
        assert_eq!(status, 404, "a parent's participant sees the fork");
    }
    let approvals = get_json(server, &t.ana, &format!("/api/rooms/{new}/approvals")).await;
    assert_eq!(approvals, serde_json::json!([]));
    let checkpoints = get_json(server, &t.ana, &format!("/api/rooms/{new}/checkpoints")).await;
    assert_eq!(checkpoints, serde_json::json!([]));

    // The files: in the document and in the workspace.
    let mut c = Client::connect(server, &new, &t.ana).await;
    c.synced().await;
    assert_eq!(texts(&c), texts(&ana));
    let (_, out) = exec(server, &t.ana, &new, "cat src/main.rs; od -An -c blob.bin").await;
    assert_eq!(
        out["stdout"], "fn main() {}\n   b   i   n  \\0   a   r   y\n",
        "{out}"
    );

    // Parentage in both chains.
    let parent_audit = get_json(server, &t.ana, &format!("/api/rooms/{room}/audit")).await;
    let forked = parent_audit
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "fork")
        .unwrap_or_else(|| panic!("no fork in {parent_audit}"))
        .clone();
    assert_eq!(forked["details"]["room"], new.as_str());
    assert_eq!(forked["details"]["checkpoint"], checkpoint.as_str());
    let audit = get_json(server, &t.ana, &format!("/api/rooms/{new}/audit")).await;
    let first = &audit[0];
    assert_eq!(first["action"], "create_room", "{audit}");
    assert_eq!(first["details"]["parent"]["room"], room.as_str());
    assert_eq!(
        first["details"]["parent"]["checkpoint"],
        checkpoint.as_str()
    );
    assert_eq!(first["details"]["parent"]["chain_head"], forked["hash"]);
    assert_eq!(f["parent"]["chain_head"], forked["hash"]);
    let (ok, text) = storage.cli(&["audit", "verify"]).await;
    assert!(ok, "{text}");

    // Without `export`, a fork waits for someone else's approval, and is ben's own once made.
    let (status, pending) = post(server, &t.ben, &fork, "{}").await;
    assert_eq!(status, 202, "{pending}");
    let id = pending["approval_id"].as_str().unwrap().to_owned();
    let with = format!(r#"{{"approval_id":"{id}"}}"#);
    assert_eq!(
        post(server, &t.ben, &fork, &with).await.0,
        403,
        "not approved yet"
    );
    let decision = format!("/api/rooms/{room}/approvals/{id}/decision");
    assert_eq!(
        post(server, &t.ana, &decision, r#"{"approve":true}"#)
            .await
            .0,
        200
    );
    let (status, f2) = post(server, &t.ben, &fork, &with).await;
    assert_eq!(status, 201, "{f2}");
    let v = get_json(
        server,
        &t.ben,
        &format!("/api/rooms/{}", f2["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(v["participants"][0]["email"], "ben@example.com", "{v}");
    assert_eq!(v["participants"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(
        post(server, &t.ben, &fork, &with).await.0,
        403,
        "an approval is spent once"
    );

    // The parent goes; the fork stays whole.
    delete_room(server, &t.ana, &root, room).await;
    let (status, _) = http(
        &server.url(&format!("/api/rooms/{room}")),
        "GET",
        Some(&t.ana),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let mut c = Client::connect(server, &new, &t.ana).await;
    c.synced().await;
    assert_eq!(
        c.file_content("src/main.rs").as_deref(),
        Some("fn main() {}\n")
    );
    assert_eq!(lifecycle_stop(server, &t.ana, &new).await, 200);
    let (_, out) = exec(server, &t.ana, &new, "cat src/main.rs; od -An -c blob.bin").await;
    assert_eq!(
        out["stdout"], "fn main() {}\n   b   i   n  \\0   a   r   y\n",
        "{out}"
    );
    let (ok, text) = storage.cli(&["audit", "verify"]).await;
    assert!(ok, "{text}");
}

async fn lifecycle_stop(server: &Server, token: &str, room: &str) -> u16 {
    post(
        server,
        token,
        &format!("/api/rooms/{room}/sandbox/stop"),
        "",
    )
    .await
    .0
}

/// Polls the sandbox's readiness until it leaves `preparing` (20 s at most).
async fn readiness_settled(server: &Server, token: &str, room: &str) -> Value {
    let mut r = Value::Null;
    for _ in 0..400 {
        r = get_json(server, token, &format!("/api/rooms/{room}/sandbox")).await["readiness"]
            .clone();
        if r["state"] != "preparing" && r["state"] != "none" {
            return r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the readiness step never settled: {r}");
}

/// Asserts the readiness step is done (`skipped` or not) and the workspace's `.runs` reads
/// `runs` (each run of the step adds a line).
async fn assert_ready(server: &Server, token: &str, room: &str, skipped: bool, runs: &str) {
    let r = readiness_settled(server, token, room).await;
    assert_eq!(
        (r["state"].as_str(), r["skipped"].as_bool()),
        (Some("ready"), Some(skipped)),
        "{r}"
    );
    let (_, out) = exec(server, token, room, "cat .runs").await;
    assert_eq!(out["stdout"], runs);
}

async fn restart(server: &Server, token: &str, room: &str) {
    let stop = format!("/api/rooms/{room}/sandbox/stop");
    assert_eq!(post(server, token, &stop, "").await.0, 200);
    let start = format!("/api/rooms/{room}/sandbox/start");
    assert_eq!(post(server, token, &start, "").await.0, 200);
}

/// Ready means ready: the room's readiness command runs after every start; a failure is shown
/// with its output and the room stays usable; a workspace saved after it completed (a stop's
/// snapshot, a checkpoint, a fork of one) starts without running it again, until the command
/// changes.
#[tokio::test]
async fn readiness_runs_after_start_shows_failures_and_ready_workspaces_skip_it() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let path = format!("/api/rooms/{room}/readiness");
    let failing = r#"{"command":"echo preparing; echo oops >&2; exit 3"}"#;
    assert_eq!(put(server, &t.cy, &path, failing).await.0, 403);
    let too_long = format!(r#"{{"command":"{}"}}"#, "x".repeat(5000));
    assert_eq!(put(server, &t.ben, &path, &too_long).await.0, 400);
    let (status, body) = put(server, &t.ben, &path, failing).await;
    assert_eq!(status, 200, "{body}");
    let v = get_json(server, &t.ben, &format!("/api/rooms/{room}")).await;
    assert_eq!(v["readiness"], "echo preparing; echo oops >&2; exit 3");
    // Those who may not run commands see neither the command nor its output.
    let v = get_json(server, &t.cy, &format!("/api/rooms/{room}")).await;
    assert_eq!(v["readiness"], Value::Null);

    // A failing step: shown with its output; the room works regardless.
    let (_, out) = exec(server, &t.ben, room, "echo usable").await;
    assert_eq!(out["stdout"], "usable\n");
    let r = readiness_settled(server, &t.ben, room).await;
    assert_eq!(r["state"], "failed", "{r}");
    assert_eq!(r["exit_code"], 3, "{r}");
    let output = r["output"].as_str().unwrap();
    assert!(
        output.contains("preparing") && output.contains("oops"),
        "{r}"
    );
    let seen = get_json(server, &t.cy, &format!("/api/rooms/{room}/sandbox")).await;
    let r = &seen["readiness"];
    assert_eq!(
        (r["state"].as_str(), r["output"].as_str()),
        (Some("failed"), Some("")),
        "{seen}"
    );
    assert_eq!(r["command"], "", "{seen}");
    let (_, out) = exec(server, &t.ben, room, "echo still usable").await;
    assert_eq!(out["stdout"], "still usable\n");

    // A working step runs once per workspace that has not had it.
    // Assignments before the program may hold a token: the audit names the program only.
    let prepare = r#"{"command":"TOKEN=s3cr3t-t0ken sh -c 'echo run >> .runs'"}"#;
    assert_eq!(put(server, &t.ben, &path, prepare).await.0, 200);
    restart(server, &t.ben, room).await;
    assert_ready(server, &t.ben, room, false, "run\n").await;
    // Resumed from its own snapshot: already ready.
    restart(server, &t.ben, room).await;
    assert_ready(server, &t.ben, room, true, "run\n").await;
    // A checkpoint of a ready workspace: restoring it, or forking it, skips the step too.
    let (status, cp) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/checkpoints"),
        r#"{"name":"ready"}"#,
    )
    .await;
    assert_eq!(status, 201, "{cp}");
    let (_, out) = exec(server, &t.ben, room, "echo junk > .runs").await;
    assert_eq!(out["exit_code"], 0);
    let restore = format!(
        "/api/rooms/{room}/checkpoints/{}/restore",
        cp["id"].as_str().unwrap()
    );
    assert_eq!(post(server, &t.ana, &restore, "").await.0, 200);
    assert_ready(server, &t.ben, room, true, "run\n").await;
    let fork = format!("/api/rooms/{room}/fork");
    let body = format!(r#"{{"checkpoint":"{}"}}"#, cp["id"].as_str().unwrap());
    let (status, f) = post(server, &t.ana, &fork, &body).await;
    assert_eq!(status, 201, "{f}");
    let new = f["id"].as_str().unwrap();
    let (_, out) = exec(server, &t.ana, new, "true").await;
    assert_eq!(out["exit_code"], 0);
    assert_ready(server, &t.ana, new, true, "run\n").await;
    // A new command runs again.
    let other = r#"{"command":"echo again >> .runs"}"#;
    assert_eq!(put(server, &t.ben, &path, other).await.0, 200);
    restart(server, &t.ben, room).await;
    assert_ready(server, &t.ben, room, false, "run\nagain\n").await;
    let audit = get_json(server, &t.ana, &format!("/api/rooms/{room}/audit")).await;
    let set = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "set_readiness" && r["decision"] == "allow")
        .count();
    assert_eq!(set, 3, "{audit}");
    // The viewer's refusal is recorded under the same name (one act, one name).
    assert!(audit
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["action"] == "set_readiness"
            && r["decision"] == "deny"
            && r["actor_email"] == "cy@example.com"));
    assert!(!audit.to_string().contains("s3cr3t-t0ken"), "{audit}");
    assert!(audit
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["action"] == "set_readiness" && r["details"]["program"] == "sh"));
}

on_each_backend!(
    a_checkpoint_of_a_sleeping_room_keeps_the_edits_made_since_its_snapshot,
    a_checkpoint_of_a_sleeping_room_keeps_the_edits_made_since_its_snapshot_on
);

/// A checkpoint of a sleeping room whose document moved on since its last snapshot keeps the
/// document's text: restored (and forked), the files read as the document did, not as the
/// older workspace archive did. (The archive's record once claimed it agreed with the newer
/// document, and the restored workspace's older text was taken in as a change inside.)
async fn a_checkpoint_of_a_sleeping_room_keeps_the_edits_made_since_its_snapshot_on(
    backend: &Backend,
) {
    let storage = Storage::new(backend).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let mut ana = Client::connect(server, room, &t.ana).await;
    ana.synced().await;
    ana.put_file("main.rs", "v1").await;
    stdout_until(server, &t.ben, room, "cat main.rs", "v1").await;
    let stop = format!("/api/rooms/{room}/sandbox/stop");
    assert_eq!(post(server, &t.ana, &stop, "").await.0, 200);
    // The sandbox sleeps; the document moves on.
    ana.edit_file("main.rs", 2, " then v2").await;
    let mut ben = Client::connect(server, room, &t.ben).await;
    ben.synced().await;
    ben.wait_for_file("main.rs", "v1 then v2").await;
    let (status, cp) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/checkpoints"),
        r#"{"name":"asleep"}"#,
    )
    .await;
    assert_eq!(status, 201, "{cp}");
    let id = cp["id"].as_str().unwrap();
    let restore = format!("/api/rooms/{room}/checkpoints/{id}/restore");
    assert_eq!(post(server, &t.ana, &restore, "").await.0, 200);
    // The sync writes the document's text over the archive's older one.
    let out = stdout_until(server, &t.ben, room, "cat main.rs", "v1 then v2").await;
    assert_eq!(out, "v1 then v2");
    // The sync has agreed by now (its first scan follows its first agreement).
    let (_, out) = exec(server, &t.ben, room, "echo x > probe.txt").await;
    assert_eq!(out["exit_code"], 0);
    ben.wait_for_file("probe.txt", "x\n").await;
    assert_eq!(ben.file_content("main.rs").as_deref(), Some("v1 then v2"));
    let fork = format!("/api/rooms/{room}/fork");
    let (status, f) = post(
        server,
        &t.ana,
        &fork,
        &format!(r#"{{"checkpoint":"{id}"}}"#),
    )
    .await;
    assert_eq!(status, 201, "{f}");
    let new = f["id"].as_str().unwrap();
    let out = stdout_until(server, &t.ana, new, "cat main.rs", "v1 then v2").await;
    assert_eq!(out, "v1 then v2");
    let (_, out) = exec(server, &t.ana, new, "echo y > probe.txt").await;
    assert_eq!(out["exit_code"], 0);
    let mut c = Client::connect(server, new, &t.ana).await;
    c.synced().await;
    c.wait_for_file("probe.txt", "y\n").await;
    assert_eq!(c.file_content("main.rs").as_deref(), Some("v1 then v2"));
}

on_each_backend!(
    a_schedule_makes_checkpoints_and_old_ones_are_pruned_by_age,
    a_schedule_makes_checkpoints_and_old_ones_are_pruned_by_age_on
);

/// A room's checkpoint policy: a schedule makes checkpoints (by `system`, kept apart from the
/// ones people make, so they never push those out), and an age past which checkpoints are
/// pruned, recorded as such.
async fn a_schedule_makes_checkpoints_and_old_ones_are_pruned_by_age_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let ana = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &["--checkpoint-min-every-ms", "1000"]).await;
    let room = create_room(&server, &ana).await;
    let list = format!("/api/rooms/{room}/checkpoints");
    let (status, mine) = post(&server, &ana, &list, r#"{"name":"mine"}"#).await;
    assert_eq!(status, 201, "{mine}");
    let path = format!("/api/rooms/{room}/checkpoint-policy");
    for bad in [
        r#"{"every_s":0,"keep_days":null}"#,
        r#"{"every_s":null,"keep_days":0}"#,
    ] {
        assert_eq!(put(&server, &ana, &path, bad).await.0, 400, "{bad}");
    }
    let (status, p) = put(&server, &ana, &path, r#"{"every_s":1,"keep_days":null}"#).await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["every_s"], 1);
    let scheduled = |rows: &Value| {
        rows.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["scheduled"] == true && r["author"] == "system")
            .count()
    };
    let next_at = |v: &Value| v["checkpoint_policy"]["next_at"].as_i64().unwrap();
    // Waits until the schedule has come round `ticks` more times; the checkpoints then.
    let after_ticks = |ticks: i64| {
        let (server, ana, room, list) = (&server, &ana, &room, &list);
        async move {
            let room_path = format!("/api/rooms/{room}");
            let start = next_at(&get_json(server, ana, &room_path).await);
            for _ in 0..300 {
                let v = get_json(server, ana, &room_path).await;
                if next_at(&v) >= start + ticks * 1000 {
                    return get_json(server, ana, list).await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            panic!("the schedule never came round");
        }
    };
    // The first tick takes one; later ticks on an unchanged room take none.
    let rows = after_ticks(3).await;
    assert_eq!(scheduled(&rows), 1, "{rows}");
    // A change to the files: the next tick takes another.
    let mut c = Client::connect(&server, &room, &ana).await;
    c.synced().await;
    c.put_file("new.txt", "changed").await;
    let mut rows = Value::Null;
    for _ in 0..300 {
        rows = get_json(&server, &ana, &list).await;
        if scheduled(&rows) >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(scheduled(&rows), 2, "{rows}");
    let v = get_json(&server, &ana, &format!("/api/rooms/{room}")).await;
    assert_eq!(v["checkpoint_policy"]["every_s"], 1, "{v}");
    // The schedule stops; ana's checkpoint is made old; an age policy prunes it (and only it).
    let (status, _) = put(&server, &ana, &path, r#"{"every_s":null,"keep_days":null}"#).await;
    assert_eq!(status, 200);
    let old = 1_000_000_i64;
    let changed = storage
        .execute(
            "UPDATE checkpoints SET at = $1 WHERE id = $2",
            &[Arg::Int(old), mine["id"].as_str().unwrap().into()],
        )
        .await;
    assert_eq!(changed, 1);
    let before = get_json(&server, &ana, &list).await;
    let (status, _) = put(&server, &ana, &path, r#"{"every_s":null,"keep_days":30}"#).await;
    assert_eq!(status, 200);
    let after = get_json(&server, &ana, &list).await;
    assert_eq!(
        after.as_array().unwrap().len() + 1,
        before.as_array().unwrap().len(),
        "{after}"
    );
    assert!(after
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["id"] != mine["id"]));
    let dir = storage
        .dir
        .path()
        .join("rooms")
        .join(&room)
        .join("checkpoints");
    assert!(!dir.join(mine["id"].as_str().unwrap()).exists());
    let audit = get_json(&server, &ana, &format!("/api/rooms/{room}/audit")).await;
    let pruned = audit
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "prune_checkpoint")
        .unwrap_or_else(|| panic!("{audit}"));
    assert_eq!(pruned["details"]["by"], "age");
    assert!(audit
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["action"] == "create_checkpoint" && r["actor"] == "system"));
}

on_each_backend!(
    a_room_can_ask_for_an_approval_before_a_restore,
    a_room_can_ask_for_an_approval_before_a_restore_on
);

/// Where the room's policy says so, a restore waits for someone else's approval, bound to that
/// checkpoint and spent once.
async fn a_room_can_ask_for_an_approval_before_a_restore_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let mut ana = Client::connect(server, room, &t.ana).await;
    ana.synced().await;
    ana.put_file("a.txt", "one").await;
    let mut ben = Client::connect(server, room, &t.ben).await;
    ben.synced().await;
    ben.wait_for_file("a.txt", "one").await;
    let (status, cp) = post(
        server,
        &t.ben,
        &format!("/api/rooms/{room}/checkpoints"),
        r#"{"name":"one"}"#,
    )
    .await;
    assert_eq!(status, 201, "{cp}");
    // Only someone who holds approve sets the policy: those it restrains cannot lift it.
    let policy = format!("/api/rooms/{room}/checkpoint-policy");
    let body = r#"{"restore_needs_approval":true}"#;
    assert_eq!(put(server, &t.ben, &policy, body).await.0, 403);
    assert_eq!(put(server, &t.ana, &policy, body).await.0, 200);
    let off = r#"{"restore_needs_approval":false}"#;
    assert_eq!(put(server, &t.ben, &policy, off).await.0, 403);
    // Other fields left out stay as they are.
    let (status, p) = put(server, &t.ana, &policy, r#"{"keep_days":30}"#).await;
    assert_eq!(
        (status, p["restore_needs_approval"].as_bool()),
        (200, Some(true)),
        "{p}"
    );
    ana.edit_file("a.txt", 3, " two").await;
    ben.wait_for_file("a.txt", "one two").await;

    let restore = format!(
        "/api/rooms/{room}/checkpoints/{}/restore",
        cp["id"].as_str().unwrap()
    );
    assert_eq!(post(server, &t.cy, &restore, "").await.0, 403);
    let (status, pending) = post(server, &t.ben, &restore, "").await;
    assert_eq!(status, 202, "{pending}");
    assert_eq!(pending["state"], "pending_approval");
    let id = pending["approval_id"].as_str().unwrap().to_owned();
    let with = format!(r#"{{"approval_id":"{id}"}}"#);
    // Not decided yet; the requester cannot decide it.
    assert_eq!(post(server, &t.ben, &restore, &with).await.0, 403);
    let decision = format!("/api/rooms/{room}/approvals/{id}/decision");
    assert_eq!(
        post(server, &t.ben, &decision, r#"{"approve":true}"#)
            .await
            .0,
        403
    );
    assert_eq!(
        post(server, &t.ana, &decision, r#"{"approve":true}"#)
            .await
            .0,
        200
    );
    // Approved for this checkpoint only, by ben only, once.
    assert_eq!(post(server, &t.ana, &restore, &with).await.0, 403);
    let (status, body) = post(server, &t.ben, &restore, &with).await;
    assert_eq!(status, 200, "{body}");
    ben.wait_for_file("a.txt", "one").await;
    assert_eq!(post(server, &t.ben, &restore, &with).await.0, 403);
    // An approval is not spent on what needs none (a fork by the owner, who holds export).
    let (status, again) = post(server, &t.ben, &restore, "").await;
    assert_eq!(status, 202, "{again}");
    let second = again["approval_id"].as_str().unwrap().to_owned();
    let decision = format!("/api/rooms/{room}/approvals/{second}/decision");
    assert_eq!(
        post(server, &t.ana, &decision, r#"{"approve":true}"#)
            .await
            .0,
        200
    );
    let fork = format!("/api/rooms/{room}/fork");
    let stolen = format!(r#"{{"approval_id":"{second}"}}"#);
    assert_eq!(post(server, &t.ana, &fork, &stolen).await.0, 400);
    let with = stolen;
    let (status, body) = post(server, &t.ben, &restore, &with).await;
    assert_eq!(status, 200, "ben's approval is still his to use: {body}");
    let audit = get_json(server, &t.ana, &format!("/api/rooms/{room}/audit")).await;
    let restored = audit
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["action"] == "restore_checkpoint" && r["decision"] == "allow")
        .unwrap_or_else(|| panic!("{audit}"));
    assert_eq!(restored["details"]["approval_id"], id.as_str());
}

/// Asks for the workspace download as `who`, has `approver` approve it, then downloads it:
/// the response, unpacked by GNU tar into a fresh directory (which is returned with it).
async fn download_workspace(
    server: &Server,
    room: &str,
    who: &str,
    approver: &str,
) -> (Resp, tempfile::TempDir) {
    let exports = server.url(&format!("/api/rooms/{room}/exports"));
    let (status, body) = http(&exports, "POST", Some(who), Some(r#"{"workspace":true}"#)).await;
    assert_eq!(
        status, 202,
        "someone else approves a workspace export: {body}"
    );
    let id = serde_json::from_str::<Value>(&body).unwrap()["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let decision = format!("/api/rooms/{room}/approvals/{id}/decision");
    assert_eq!(
        post(server, approver, &decision, r#"{"approve":true}"#)
            .await
            .0,
        200
    );
    let with = format!(r#"{{"workspace":true,"approval_id":"{id}"}}"#);
    let auth = format!("Bearer {who}");
    let resp = request(&exports, "POST", &[("Authorization", &auth)], Some(&with)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header("content-type"), Some("application/gzip"));
    assert_eq!(
        resp.header("content-disposition"),
        Some("attachment; filename=\"test.tar.gz\"")
    );
    // The approval was spent on it.
    let again = http(&exports, "POST", Some(who), Some(&with)).await;
    assert_eq!(again.0, 403, "{}", again.1);
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("download.tar.gz");
    std::fs::write(&archive, &resp.raw).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let tar = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        tar.status.success(),
        "{}",
        String::from_utf8_lossy(&tar.stderr)
    );
    (resp, dir)
}

on_each_backend!(
    the_workspace_downloads_as_an_archive_after_an_approval,
    the_workspace_downloads_as_an_archive_after_an_approval_on
);

/// Issue 19 (downloads): the whole workspace as a `.tar.gz`, behind `export` and someone
/// else's approval like every export: what the sandbox made (binaries included) from its disk,
/// the texts as the document holds them (edits a sleeping sandbox has not taken in yet
/// included, files deleted in the room left out), recorded with its size.
async fn the_workspace_downloads_as_an_archive_after_an_approval_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let exports = server.url(&format!("/api/rooms/{room}/exports"));
    // Bad requests, and a viewer without `export`.
    for body in [
        r#"{}"#,
        r#"{"workspace":true,"files":["a"]}"#,
        r#"{"workspace":false}"#,
    ] {
        let (status, text) = http(&exports, "POST", Some(&t.ana), Some(body)).await;
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains("one of the two"), "{text}");
    }
    let (status, _) = http(&exports, "POST", Some(&t.cy), Some(r#"{"workspace":true}"#)).await;
    assert_eq!(status, 403);

    let mut ana = Client::connect(server, room, &t.ana).await;
    ana.synced().await;
    ana.put_file("src/main.rs", "fn main() {}\n").await;
    ana.put_file("old.txt", "to be deleted\n").await;
    stdout_until(server, &t.ben, room, "cat src/main.rs old.txt", "deleted").await;
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "printf 'bin\\000ary' > blob.bin && ln -s src/main.rs link && echo ok",
    )
    .await;
    assert_eq!(out["stdout"], "ok\n", "{out}");
    let grant = r#"{"grant":["export"]}"#;
    assert_eq!(set_role(server, &t.ana, room, &t.ben_id, grant).await, 200);

    // From the running sandbox.
    let (resp, dir) = download_workspace(server, room, &t.ben, &t.ana).await;
    let out = dir.path().join("out");
    let read = |p: &str| std::fs::read(out.join(p)).unwrap();
    assert_eq!(read("src/main.rs"), b"fn main() {}\n");
    assert_eq!(read("blob.bin"), b"bin\0ary");
    assert_eq!(
        std::fs::read_link(out.join("link")).unwrap(),
        std::path::Path::new("src/main.rs")
    );
    let exported = audit(server, &t.ana, room)
        .await
        .into_iter()
        .rfind(|r| r["action"] == "export" && r["decision"] == "allow")
        .expect("the export is recorded");
    assert_eq!(
        exported["details"]["params"]["workspace"], true,
        "{exported}"
    );
    assert_eq!(exported["details"]["bytes"], resp.raw.len(), "{exported}");
    assert_eq!(exported["details"]["skipped"], 0, "{exported}");

    // Asleep: the document moved on since the stop's snapshot.
    assert_eq!(lifecycle_stop(server, &t.ana, room).await, 200);
    ana.edit_file("src/main.rs", 0, "// edited while asleep\n")
        .await;
    ana.put_file("notes.md", "# typed while asleep\n").await;
    let update = {
        let files = ana.doc.get_or_insert_map("files");
        let mut txn = ana.doc.transact_mut();
        files.remove(&mut txn, "old.txt");
        txn.encode_update_v1()
    };
    ana.send(YMessage::Sync(SyncMessage::Update(update))).await;
    let mut ben = Client::connect(server, room, &t.ben).await;
    ben.synced().await;
    ben.wait_for_file("notes.md", "# typed while asleep\n")
        .await;
    ben.wait_for_file("src/main.rs", "// edited while asleep\nfn main() {}\n")
        .await;
    let state = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await;
    assert_ne!(state["state"], "running", "{state}");

    let (_, dir) = download_workspace(server, room, &t.ben, &t.ana).await;
    let out = dir.path().join("out");
    let read = |p: &str| std::fs::read(out.join(p)).unwrap();
    assert_eq!(
        read("src/main.rs"),
        b"// edited while asleep\nfn main() {}\n"
    );
    assert_eq!(read("notes.md"), b"# typed while asleep\n");
    assert_eq!(read("blob.bin"), b"bin\0ary");
    assert!(!out.join("old.txt").exists(), "deleted in the room");
    // Downloading did not wake the sandbox.
    let state = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await;
    assert_ne!(state["state"], "running", "{state}");
}

/// A text file that room code turns into something else (here: binary) leaves the document
/// (only text is mirrored), and nothing puts the document's old text back over its bytes: not
/// the download, not the sandbox's next start from its snapshot. Grown past the mirror's size
/// cap, the same. (The export used to write the document's stale text over it, and a restart
/// wrote it to the disk.)
#[tokio::test]
async fn a_file_that_stops_being_text_keeps_its_bytes() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let grant = r#"{"grant":["export"]}"#;
    assert_eq!(set_role(server, &t.ana, room, &t.ben_id, grant).await, 200);
    let mut ana = Client::connect(server, room, &t.ana).await;
    ana.synced().await;
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "printf 'plain\\n' > data.bin && printf 'small\\n' > big.log && echo ok",
    )
    .await;
    assert_eq!(out["stdout"], "ok\n", "{out}");
    ana.wait_for_file("data.bin", "plain\n").await;
    ana.wait_for_file("big.log", "small\n").await;
    let (_, out) = exec(
        server,
        &t.ben,
        room,
        "head -c 4096 /dev/urandom > data.bin && yes grown | head -c 2000000 > big.log && \
         cat data.bin big.log | sha256sum",
    )
    .await;
    assert_eq!(out["exit_code"], 0, "{out}");
    let sum = out["stdout"].as_str().unwrap().to_owned();
    ana.wait_for_no_file("data.bin").await;
    ana.wait_for_no_file("big.log").await;

    let (_, dir) = download_workspace(server, room, &t.ben, &t.ana).await;
    let out = dir.path().join("out");
    let read = |p: &str| std::fs::read(out.join(p)).unwrap();
    assert_eq!(read("data.bin").len(), 4096, "the bytes, not the old text");
    assert_eq!(read("big.log").len(), 2_000_000);

    // Stopped (snapshotted) and started again: the disk is as room code left it.
    assert_eq!(lifecycle_stop(server, &t.ana, room).await, 200);
    let (_, out) = exec(server, &t.ben, room, "cat data.bin big.log | sha256sum").await;
    assert_eq!(out["stdout"].as_str(), Some(sum.as_str()), "{out}");
    assert_eq!(ana.file_content("data.bin"), None);
    assert_eq!(ana.file_content("big.log"), None);
}

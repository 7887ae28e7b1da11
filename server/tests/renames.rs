//! Renames and deletions lose nobody's edits: text typed into a file by someone who had not yet
//! seen it renamed (or deleted) is carried to where the file went, with yrs clients against the
//! real binary. A rename is what every Yjs client does: one transaction writes a new text with
//! the same content under the new key and deletes the old one.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use yrs::sync::protocol::{Message as YMessage, SyncMessage};
use yrs::{GetString, Map, ReadTxn, Text, TextPrelim, Transact};

/// A room with `files` set up, and three connected clients: `a` renames, `b` edits without
/// seeing it, `c` watches.
async fn room_with(
    backend: &Backend,
    files: &[(&str, &str)],
) -> (Storage, Server, String, String, [Client; 3]) {
    let storage = Storage::new(backend).await;
    let token = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &[]).await;
    let room = create_room(&server, &token).await;
    let mut a = Client::connect(&server, &room, &token).await;
    a.synced().await;
    for (path, content) in files {
        a.put_file(path, content).await;
    }
    let mut b = Client::connect(&server, &room, &token).await;
    let mut c = Client::connect(&server, &room, &token).await;
    b.synced().await;
    c.synced().await;
    for (path, content) in files {
        b.wait_for_file(path, content).await;
        c.wait_for_file(path, content).await;
    }
    (storage, server, room, token, [a, b, c])
}

/// Renames files in one transaction, as the browser and stock clients do, and sends it.
async fn rename(client: &mut Client, moves: &[(&str, &str)]) {
    let update = {
        let files = client.doc.get_or_insert_map("files");
        let mut txn = client.doc.transact_mut();
        for (from, to) in moves {
            let content = match files.get(&txn, from) {
                Some(yrs::Out::YText(t)) => t.get_string(&txn),
                _ => panic!("{from} is not a file"),
            };
            files.insert(&mut txn, *to, TextPrelim::new(content));
            files.remove(&mut txn, from);
        }
        txn.encode_update_v1()
    };
    client
        .send(YMessage::Sync(SyncMessage::Update(update)))
        .await;
}

async fn delete_file(client: &mut Client, path: &str) {
    let update = {
        let files = client.doc.get_or_insert_map("files");
        let mut txn = client.doc.transact_mut();
        files.remove(&mut txn, path);
        txn.encode_update_v1()
    };
    client
        .send(YMessage::Sync(SyncMessage::Update(update)))
        .await;
}

/// Edits a file locally without sending: what a client does before it hears of a rename (its
/// update is on the wire) or while offline. Returns the update.
fn edit_unsent(client: &Client, path: &str, at: u32, insert: &str, delete: u32) -> Vec<u8> {
    let text = client.file(path).expect("the file exists");
    let mut txn = client.doc.transact_mut();
    if delete > 0 {
        text.remove_range(&mut txn, at, delete);
    }
    if !insert.is_empty() {
        text.insert(&mut txn, at, insert);
    }
    txn.encode_update_v1()
}

async fn send_update(client: &mut Client, update: Vec<u8>) {
    client
        .send(YMessage::Sync(SyncMessage::Update(update)))
        .await;
}

/// Connects again with the same document, as a client coming back online does: its sync step
/// 2 carries everything it did offline.
async fn reconnect(server: &Server, room: &str, token: &str, client: Client) -> Client {
    let Client { mut ws, doc } = client;
    let _ = futures_util::SinkExt::close(&mut ws).await;
    let mut c = Client {
        ws: raw_ws(server, room, token).await,
        doc,
    };
    let sv = c.doc.transact().state_vector();
    c.send(YMessage::Sync(SyncMessage::SyncStep1(sv))).await;
    c.synced().await;
    c
}

/// Every file of a client's document.
fn listing(client: &Client) -> Vec<(String, String)> {
    let files = client.doc.get_or_insert_map("files");
    let txn = client.doc.transact();
    let mut out: Vec<(String, String)> = files
        .iter(&txn)
        .filter_map(|(k, v)| match v {
            yrs::Out::YText(t) => Some((k.to_string(), t.get_string(&txn))),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// Receives until the client's files are exactly `expected`.
async fn wait_listing(client: &mut Client, expected: &[(&str, &str)]) {
    let want: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let r = tokio::time::timeout(TIMEOUT, async {
        while listing(client) != want {
            if let Event::Closed(c) = client.next().await {
                panic!("closed ({c:?}) waiting for {want:?}");
            }
        }
    })
    .await;
    assert!(
        r.is_ok(),
        "files never became {want:?}; they are {:?}",
        listing(client)
    );
}

/// What a fresh client sees once the room has `expected` (polled: no acknowledgements).
async fn server_listing(server: &Server, room: &str, token: &str, expected: &[(&str, &str)]) {
    let want: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let mut last = Vec::new();
    for _ in 0..200 {
        let mut c = Client::connect(server, room, token).await;
        if c.try_synced().await.is_ok() {
            last = listing(&c);
            if last == want {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("the room never held {want:?}; last {last:?}");
}

on_each_backend!(
    typing_into_a_file_renamed_meanwhile_lands_in_the_new_name,
    typing_into_a_file_renamed_meanwhile_lands_in_the_new_name_on
);

async fn typing_into_a_file_renamed_meanwhile_lands_in_the_new_name_on(backend: &Backend) {
    let (_storage, server, room, token, [mut a, mut b, mut c]) =
        room_with(backend, &[("a.txt", "hello world")]).await;
    // b types before it hears of the rename: its update is built on the old text.
    let typed = edit_unsent(&b, "a.txt", 5, ", dear", 0);
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    c.wait_for_file("b.txt", "hello world").await;
    send_update(&mut b, typed).await;
    // Then it types again on what it still shows (the old text), one character at a time.
    for (i, ch) in ["!", "?"].iter().enumerate() {
        let more = edit_unsent(&b, "a.txt", 11 + i as u32, ch, 0);
        send_update(&mut b, more).await;
    }
    let want = [("b.txt", "hello, dear!? world")];
    wait_listing(&mut c, &want).await;
    wait_listing(&mut b, &want).await;
    wait_listing(&mut a, &want).await;
    server_listing(&server, &room, &token, &want).await;
    assert!(server.metric("coderoom_edits_carried_total").await >= 3.0);
    assert_eq!(server.metric("coderoom_edits_unplaced_total").await, 0.0);
}

on_each_backend!(
    an_offline_client_coming_back_after_renames_keeps_its_edits,
    an_offline_client_coming_back_after_renames_keeps_its_edits_on
);

async fn an_offline_client_coming_back_after_renames_keeps_its_edits_on(backend: &Backend) {
    let (_storage, server, room, token, [mut a, b, mut c]) =
        room_with(backend, &[("a.txt", "one two three")]).await;
    // b goes offline and edits: typing, a deletion, more typing after its own text.
    let _ = edit_unsent(&b, "a.txt", 3, " and a half", 0);
    let _ = edit_unsent(&b, "a.txt", 14, "", 4);
    let _ = edit_unsent(&b, "a.txt", 0, ">> ", 0);
    // Meanwhile the file is renamed twice, and someone edits it under its new name.
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    c.wait_for_file("b.txt", "one two three").await;
    c.edit_file("b.txt", 13, ".").await;
    a.wait_for_file("b.txt", "one two three.").await;
    rename(&mut a, &[("b.txt", "docs/c.txt")]).await;
    c.wait_for_file("docs/c.txt", "one two three.").await;
    // b comes back.
    let mut b = reconnect(&server, &room, &token, b).await;
    let want = [("docs/c.txt", ">> one and a half three.")];
    wait_listing(&mut c, &want).await;
    wait_listing(&mut b, &want).await;
    server_listing(&server, &room, &token, &want).await;
    // A client that saw the renames and reconnects repeats its whole delete set, the renames'
    // deletions included: that must not be taken for deletions in the new file.
    let c = reconnect(&server, &room, &token, c).await;
    drop(c);
    let b = reconnect(&server, &room, &token, b).await;
    drop(b);
    server_listing(&server, &room, &token, &want).await;
}

on_each_backend!(
    a_folder_rename_carries_edits_to_each_file,
    a_folder_rename_carries_edits_to_each_file_on
);

async fn a_folder_rename_carries_edits_to_each_file_on(backend: &Backend) {
    let (_storage, server, room, token, [mut a, mut b, mut c]) = room_with(
        backend,
        &[("src/x.rs", "fn x() {}"), ("src/y.rs", "fn y() {}")],
    )
    .await;
    let x = edit_unsent(&b, "src/x.rs", 8, "1", 0);
    let y = edit_unsent(&b, "src/y.rs", 8, "2", 0);
    rename(
        &mut a,
        &[("src/x.rs", "lib/x.rs"), ("src/y.rs", "lib/y.rs")],
    )
    .await;
    c.wait_for_file("lib/y.rs", "fn y() {}").await;
    send_update(&mut b, x).await;
    send_update(&mut b, y).await;
    let want = [("lib/x.rs", "fn x() {1}"), ("lib/y.rs", "fn y() {2}")];
    wait_listing(&mut c, &want).await;
    wait_listing(&mut b, &want).await;
    server_listing(&server, &room, &token, &want).await;
}

on_each_backend!(
    an_edit_to_a_deleted_file_brings_it_back,
    an_edit_to_a_deleted_file_brings_it_back_on
);

async fn an_edit_to_a_deleted_file_brings_it_back_on(backend: &Backend) {
    let (_storage, server, room, token, [mut a, mut b, mut c]) =
        room_with(backend, &[("notes.md", "keep this"), ("other.md", "x")]).await;
    let typed = edit_unsent(&b, "notes.md", 9, " too", 0);
    delete_file(&mut a, "notes.md").await;
    wait_listing(&mut c, &[("other.md", "x")]).await;
    send_update(&mut b, typed).await;
    let want = [("notes.md", "keep this too"), ("other.md", "x")];
    wait_listing(&mut c, &want).await;
    wait_listing(&mut b, &want).await;
    wait_listing(&mut a, &want).await;
    server_listing(&server, &room, &token, &want).await;
    // Deleted again, and meanwhile someone creates a new file under the same name: the next
    // stale edit brings the old file back beside it, not into it.
    let typed = edit_unsent(&b, "notes.md", 0, "# ", 0);
    delete_file(&mut a, "notes.md").await;
    wait_listing(&mut c, &[("other.md", "x")]).await;
    a.put_file("notes.md", "new").await;
    wait_listing(&mut c, &[("notes.md", "new"), ("other.md", "x")]).await;
    send_update(&mut b, typed).await;
    let want = [
        ("notes (2).md", "# keep this too"),
        ("notes.md", "new"),
        ("other.md", "x"),
    ];
    wait_listing(&mut c, &want).await;
    server_listing(&server, &room, &token, &want).await;
}

on_each_backend!(
    deletions_made_in_the_old_file_are_carried_too,
    deletions_made_in_the_old_file_are_carried_too_on
);

async fn deletions_made_in_the_old_file_are_carried_too_on(backend: &Backend) {
    let (_storage, server, room, token, [mut a, mut b, mut c]) =
        room_with(backend, &[("a.txt", "keep DROP keep")]).await;
    let typed = edit_unsent(&b, "a.txt", 5, "", 5);
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    c.wait_for_file("b.txt", "keep DROP keep").await;
    send_update(&mut b, typed).await;
    let want = [("b.txt", "keep keep")];
    wait_listing(&mut c, &want).await;
    server_listing(&server, &room, &token, &want).await;
}

on_each_backend!(
    carried_edits_survive_a_restart,
    carried_edits_survive_a_restart_on
);

async fn carried_edits_survive_a_restart_on(backend: &Backend) {
    let (storage, server, room, token, [mut a, mut b, mut c]) =
        room_with(backend, &[("a.txt", "abc")]).await;
    let typed = edit_unsent(&b, "a.txt", 3, "def", 0);
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    c.wait_for_file("b.txt", "abc").await;
    send_update(&mut b, typed).await;
    wait_listing(&mut c, &[("b.txt", "abcdef")]).await;
    drop((a, b, c));
    assert!(server.terminate().await.success());
    let server = Server::start(&storage, &[]).await;
    server_listing(&server, &room, &token, &[("b.txt", "abcdef")]).await;
}

on_each_backend!(
    an_edit_with_nowhere_known_to_go_is_kept_in_recovered,
    an_edit_with_nowhere_known_to_go_is_kept_in_recovered_on
);

/// The room forgets departed files when it unloads; an edit that arrives for one after that has
/// nowhere known to go, and is kept in `recovered/`, not dropped.
async fn an_edit_with_nowhere_known_to_go_is_kept_in_recovered_on(backend: &Backend) {
    let (storage, server, room, token, [mut a, b, mut c]) =
        room_with(backend, &[("a.txt", "abc")]).await;
    let _ = edit_unsent(&b, "a.txt", 3, "XYZ", 0);
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    c.wait_for_file("b.txt", "abc").await;
    drop((a, c));
    assert!(server.terminate().await.success());
    let server = Server::start(&storage, &[]).await;
    let mut b = reconnect(&server, &room, &token, b).await;
    let r = tokio::time::timeout(TIMEOUT, async {
        loop {
            let files = listing(&b);
            if files.len() == 2 {
                return files;
            }
            if let Event::Closed(c) = b.next().await {
                panic!("closed ({c:?})");
            }
        }
    })
    .await
    .expect("nothing was recovered");
    assert_eq!(r[0], ("b.txt".into(), "abc".into()));
    assert!(r[1].0.starts_with("recovered/edits-"), "{r:?}");
    assert_eq!(r[1].1, "XYZ");
    assert_eq!(server.metric("coderoom_edits_unplaced_total").await, 1.0);
}

on_each_backend!(
    a_rename_or_deletion_built_without_someones_typing_keeps_it,
    a_rename_or_deletion_built_without_someones_typing_keeps_it_on
);

/// The other order: the typing reaches the room first, then a rename (or a deletion) by someone
/// who had not seen it. The rename copies only what its author saw; the typing is carried into
/// the new file, and a deleted file with unseen typing in it comes back.
async fn a_rename_or_deletion_built_without_someones_typing_keeps_it_on(backend: &Backend) {
    let (_storage, server, room, token, [mut a, mut b, mut c]) =
        room_with(backend, &[("a.txt", "hello world"), ("gone.txt", "old")]).await;
    b.edit_file("a.txt", 5, ", dear").await;
    b.edit_file("a.txt", 0, "> ").await;
    b.edit_file("gone.txt", 3, " but edited").await;
    c.wait_for_file("a.txt", "> hello, dear world").await;
    c.wait_for_file("gone.txt", "old but edited").await;
    // `a` has not read any of that: its rename and deletion are built on what it saw.
    assert_eq!(a.file_content("a.txt").as_deref(), Some("hello world"));
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    delete_file(&mut a, "gone.txt").await;
    let want = [
        ("b.txt", "> hello, dear world"),
        ("gone.txt", "old but edited"),
    ];
    wait_listing(&mut c, &want).await;
    wait_listing(&mut a, &want).await;
    wait_listing(&mut b, &want).await;
    server_listing(&server, &room, &token, &want).await;
    // A deletion by someone who saw everything in the file is a deletion (`a` has: its own
    // deletion left it without the file until the room brought it back).
    delete_file(&mut a, "gone.txt").await;
    wait_listing(&mut c, &[("b.txt", "> hello, dear world")]).await;
    server_listing(&server, &room, &token, &[("b.txt", "> hello, dear world")]).await;
}

on_each_backend!(
    a_huge_stale_edit_is_carried_up_to_a_bound_and_the_rest_recovered,
    a_huge_stale_edit_is_carried_up_to_a_bound_and_the_rest_recovered_on
);

/// One update carries a bounded number of runs one by one (each is placed by a walk of its
/// text); the rest of its lost text is kept in `recovered/`, in one file.
async fn a_huge_stale_edit_is_carried_up_to_a_bound_and_the_rest_recovered_on(backend: &Backend) {
    let base = "x".repeat(1200);
    let (_storage, server, room, token, [mut a, mut b, mut c]) =
        room_with(backend, &[("a.txt", base.as_str())]).await;
    // 1100 separate insertions, one after each of the first 1100 characters, in one update.
    let typed = {
        let text = b.file("a.txt").unwrap();
        let mut txn = b.doc.transact_mut();
        for i in (0..1100u32).rev() {
            text.insert(&mut txn, i + 1, "y");
        }
        txn.encode_update_v1()
    };
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    c.wait_for_file("b.txt", &base).await;
    send_update(&mut b, typed).await;
    let r = tokio::time::timeout(TIMEOUT, async {
        loop {
            let files = listing(&c);
            if files.len() == 2 && files[0].1.len() > 1200 {
                return files;
            }
            if let Event::Closed(code) = c.next().await {
                panic!("closed ({code:?})");
            }
        }
    })
    .await
    .expect("the stale edit was not carried");
    assert_eq!(r[0].0, "b.txt");
    assert_eq!(r[0].1.matches('y').count(), 1000);
    assert!(r[1].0.starts_with("recovered/edits-"), "{r:?}");
    assert_eq!(r[1].1.matches('y').count(), 100);
    assert_eq!(server.metric("coderoom_edits_carried_total").await, 1000.0);
    assert_eq!(server.metric("coderoom_edits_unplaced_total").await, 100.0);
    server_listing(
        &server,
        &room,
        &token,
        &[(&r[0].0, &r[0].1), (&r[1].0, &r[1].1)],
    )
    .await;
}

on_each_backend!(
    a_path_created_twice_at_once_resolves_as_yjs_does,
    a_path_created_twice_at_once_resolves_as_yjs_does_on
);

/// Two people creating one path at the same moment is not a departure: Yjs keeps one of the two
/// texts (the same on every replica), whichever arrives first, and the room adds nothing.
async fn a_path_created_twice_at_once_resolves_as_yjs_does_on(backend: &Backend) {
    let (_storage, server, room, token, [_, _, mut c]) =
        room_with(backend, &[("x.txt", "x")]).await;
    // Yjs keeps the text of the higher client id: 2's. Both orders of arrival.
    for (first, second, path) in [(2u64, 1u64, "n1.md"), (1, 2, "n2.md")] {
        let mut clients = Vec::new();
        for id in [first, second] {
            let mut cl = Client {
                ws: raw_ws(&server, &room, &token).await,
                doc: yrs::Doc::with_client_id(id + 1000 * u64::from(path == "n2.md")),
            };
            let sv = cl.doc.transact().state_vector();
            cl.send(YMessage::Sync(SyncMessage::SyncStep1(sv))).await;
            cl.synced().await;
            clients.push(cl);
        }
        let content = |id: u64| format!("by {id}");
        clients[0].put_file(path, &content(first)).await;
        c.wait_for_file(path, &content(first)).await;
        clients[1].put_file(path, &content(second)).await;
        c.wait_for_file(path, &content(2)).await;
    }
    let want = [("n1.md", "by 2"), ("n2.md", "by 2"), ("x.txt", "x")];
    server_listing(&server, &room, &token, &want).await;
    wait_listing(&mut c, &want).await;
    assert_eq!(server.metric("coderoom_edits_unplaced_total").await, 0.0);
}

on_each_backend!(
    file_operations_are_audited_and_deleted_files_can_be_restored,
    file_operations_are_audited_and_deleted_files_can_be_restored_on
);

/// Every file created, renamed, moved and deleted through the document is one audit entry by
/// whoever did it; a deleted file waits in the room's trash, naming who deleted it, until
/// someone who may edit puts it back (once), under its path or beside the file that took it.
async fn file_operations_are_audited_and_deleted_files_can_be_restored_on(backend: &Backend) {
    let (storage, server, room, token, [mut a, _b, mut c]) =
        room_with(backend, &[("a.txt", "alpha"), ("notes.md", "keep me")]).await;
    rename(&mut a, &[("a.txt", "b.txt")]).await;
    rename(&mut a, &[("b.txt", "src/b.txt")]).await;
    delete_file(&mut a, "notes.md").await;
    wait_listing(&mut c, &[("src/b.txt", "alpha")]).await;
    let ana = me(&server, &token).await;
    let file_entries = || async {
        audit(&server, &token, &room)
            .await
            .into_iter()
            .filter(|e| e["action"].as_str().unwrap().ends_with("_file"))
            .map(|e| {
                assert_eq!(e["actor"], ana.as_str());
                (
                    e["action"].as_str().unwrap().to_owned(),
                    e["details"]["path"].as_str().unwrap().to_owned(),
                    e["details"]["to"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    let want = |extra: &[(&str, &str, &str)]| {
        let mut w: Vec<(String, String, String)> = [
            ("create_file", "a.txt", ""),
            ("create_file", "notes.md", ""),
            ("rename_file", "a.txt", "b.txt"),
            ("move_file", "b.txt", "src/b.txt"),
            ("delete_file", "notes.md", ""),
        ]
        .iter()
        .chain(extra)
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
        w.sort();
        w
    };
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = file_entries().await;
        seen.sort();
        if seen == want(&[]) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(seen, want(&[]));

    // The trash names the file and who deleted it; a viewer sees it but cannot restore it.
    let trash = get_json(&server, &token, &format!("/api/rooms/{room}/trash")).await;
    let item = &trash.as_array().unwrap()[0];
    assert_eq!(item["path"], "notes.md");
    assert_eq!(item["deleted_by_name"], "ana@example.com");
    assert_eq!(item["bytes"], 7);
    assert!(
        item.get("content").is_none(),
        "the list does not carry the text"
    );
    let id = item["id"].as_str().unwrap().to_owned();
    let (_, viewer_invite) = invite(&server, &token, &room, "viewer", 1).await;
    let vic = storage.token("vic@example.com").await;
    assert_eq!(accept(&server, &vic, &viewer_invite).await, 200);
    let restore_url = server.url(&format!("/api/rooms/{room}/trash/{id}/restore"));
    let (status, _) = http(&restore_url, "POST", Some(&vic), None).await;
    assert_eq!(status, 403);
    let (status, _) = http(
        &server.url(&format!("/api/rooms/{room}/trash")),
        "GET",
        Some(&vic),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let stranger = storage.token("sam@example.com").await;
    let (status, _) = http(&restore_url, "POST", Some(&stranger), None).await;
    assert_eq!(status, 404);

    // Someone made a new notes.md meanwhile: the restored one goes beside it.
    a.put_file("notes.md", "new").await;
    wait_listing(&mut c, &[("notes.md", "new"), ("src/b.txt", "alpha")]).await;
    let (status, body) = http(&restore_url, "POST", Some(&token), None).await;
    assert_eq!(status, 200, "{body}");
    let restored: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(restored["path"], "notes (2).md");
    let want_files = [
        ("notes (2).md", "keep me"),
        ("notes.md", "new"),
        ("src/b.txt", "alpha"),
    ];
    wait_listing(&mut c, &want_files).await;
    server_listing(&server, &room, &token, &want_files).await;
    // Once: it left the trash.
    let (status, _) = http(&restore_url, "POST", Some(&token), None).await;
    assert_eq!(status, 404);
    let trash = get_json(&server, &token, &format!("/api/rooms/{room}/trash")).await;
    assert_eq!(trash, serde_json::json!([]));
    // The restore is one entry of its own (the file it wrote is not a second one); the new
    // notes.md is a creation.
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = file_entries().await;
        seen.sort();
        if seen.len() >= 7 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(
        seen,
        want(&[
            ("create_file", "notes.md", ""),
            ("restore_file", "notes (2).md", "")
        ])
    );
}

/// A flood of file operations is journaled one by one up to the room's budget, and the rest
/// as one summary entry by whoever sent them: the audit chain does not grow with the flood.
#[tokio::test]
async fn a_flood_of_file_operations_is_summarised() {
    let (_storage, server, room, token, [mut a, _b, mut c]) =
        room_with(&Backend::Sqlite, &[("keep.txt", "k")]).await;
    let update = {
        let files = a.doc.get_or_insert_map("files");
        let mut txn = a.doc.transact_mut();
        for i in 0..400 {
            files.insert(&mut txn, format!("gen/{i}.txt"), TextPrelim::new("x"));
        }
        txn.encode_update_v1()
    };
    a.send(YMessage::Sync(SyncMessage::Update(update))).await;
    c.wait_for_file("gen/399.txt", "x").await;
    let mut entries = Vec::new();
    for _ in 0..200 {
        entries = audit(&server, &token, &room).await;
        if entries
            .iter()
            .any(|e| e["action"] == "file_operations_unrecorded")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let created = entries
        .iter()
        .filter(|e| e["action"] == "create_file")
        .count();
    let summary: Vec<_> = entries
        .iter()
        .filter(|e| e["action"] == "file_operations_unrecorded")
        .collect();
    // keep.txt, then 199 of the flood within the burst of 200 (a token or a few more when the
    // budget refilled, at 20 a second, between keep.txt and the flood on a busy machine); the
    // rest summarised, and nothing uncounted.
    assert!(
        (200..=210).contains(&created),
        "{created} creations journaled one by one"
    );
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert_eq!(
        summary[0]["details"]["count"].as_u64(),
        Some(401 - created as u64),
        "{summary:?}"
    );
}

//! The document WebSocket against the real binary: sync, persistence, limits and bad input.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::collections::HashMap;
use std::time::Duration;
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::protocol::{Message as YMessage, SyncMessage};
use yrs::sync::AwarenessUpdate;
use yrs::updates::encoder::Encode;
use yrs::ClientID;

on_each_backend!(
    edits_reach_peers_and_survive_restart,
    edits_reach_peers_and_survive_restart_on
);

async fn edits_reach_peers_and_survive_restart_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let token = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &[]).await;
    let room = create_room(&server, &token).await;
    let mut a = Client::connect(&server, &room, &token).await;
    let mut b = Client::connect(&server, &room, &token).await;
    a.synced().await;
    b.synced().await;
    a.insert("main.rs", 0, "fn main() {}").await;
    b.wait_for("main.rs", "fn main() {}").await;
    b.insert("main.rs", 0, "// hi\n").await;
    a.wait_for("main.rs", "// hi\nfn main() {}").await;
    assert!(server.metric("coderoom_updates_applied_total").await >= 2.0);
    assert!(server.metric("coderoom_bytes_persisted_total").await > 0.0);
    assert_eq!(server.metric("coderoom_connections").await, 2.0);
    let status = server.terminate().await;
    assert!(status.success(), "SIGTERM must exit 0, got {status:?}");

    let server = Server::start(&storage, &[]).await;
    let (text, _) = snapshot(&server, &room, &token, "main.rs").await;
    assert_eq!(text, "// hi\nfn main() {}", "{backend:?}");
    assert!(server.terminate().await.success());
    storage.drop_db().await;
}

#[tokio::test]
async fn rooms_need_a_participant_token() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let ana = storage.token("ana@example.com").await;
    let ben = storage.token("ben@example.com").await;
    let server = Server::start(&storage, &[]).await;
    let room = create_room(&server, &ana).await;
    assert_eq!(
        http(&server.url("/api/rooms"), "GET", None, None).await.0,
        401
    );
    assert_eq!(
        http(&server.url("/api/rooms"), "GET", Some("crt_forged"), None)
            .await
            .0,
        401
    );
    let path = format!("/api/rooms/{room}");
    assert_eq!(
        http(&server.url(&path), "GET", Some(&ben), None).await.0,
        404
    );
    let (status, body) = http(&server.url(&path), "GET", Some(&ana), None).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["participants"][0]["role"], "owner");
    assert_eq!(v["my_capabilities"].as_array().unwrap().len(), 12);
    let (_, list) = http(&server.url("/api/rooms"), "GET", Some(&ben), None).await;
    assert_eq!(list, "[]");
    let doc = format!("/api/rooms/{room}/doc");
    assert_eq!(http(&server.url(&doc), "GET", None, None).await.0, 401);
    assert_eq!(
        http(&server.url(&doc), "GET", Some(&ben), None).await.0,
        404
    );
    let bad = http(
        &server.url("/api/rooms"),
        "POST",
        Some(&ana),
        Some(r#"{"name":""}"#),
    )
    .await;
    assert_eq!(bad.0, 400);
    let (status, _) = http(&server.url("/healthz"), "GET", None, None).await;
    assert_eq!(status, 200);
    server.terminate().await;
}

/// Opens a room with `seed` in main.rs; returns the server, token, room and a synced client.
async fn seeded(storage: &Storage, extra: &[&str]) -> (Server, String, String) {
    let token = storage.token("ana@example.com").await;
    let server = Server::start(storage, extra).await;
    let room = create_room(&server, &token).await;
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    c.insert("main.rs", 0, "seed").await;
    eventually(&server, &room, &token, "main.rs", "seed").await;
    (server, token, room)
}

async fn assert_unchanged(server: &Server, room: &str, token: &str) {
    let (text, _) = snapshot(server, room, token, "main.rs").await;
    assert_eq!(text, "seed", "document changed by refused input");
}

/// A message far over the cap (3 MiB against the default 2 MiB) still gets its 1009 close frame:
/// the server reads what is already on its way before letting go of the socket, so the
/// client is not cut off with a reset (1006) before the frame reaches it.
#[tokio::test]
async fn a_far_oversized_message_still_closes_1009() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &[]).await;
    for attempt in 0..10 {
        let mut c = Client::connect(&server, &room, &token).await;
        c.synced().await;
        c.send_raw(vec![0u8; 3 << 20]).await;
        assert_eq!(c.closed().await, Some(1009), "attempt {attempt}");
    }
    assert_unchanged(&server, &room, &token).await;
    server.terminate().await;
}

/// The frame of an update that pastes `text` at the start of `main.rs` in `c`'s document.
fn paste_frame(c: &Client, text: &str) -> Vec<u8> {
    use yrs::{Text, Transact};
    let t = c.text("main.rs");
    let mut txn = c.doc.transact_mut();
    t.insert(&mut txn, 0, text);
    YMessage::Sync(SyncMessage::Update(txn.encode_update_v1())).encode_v1()
}

#[tokio::test]
async fn oversized_message_closes_1009() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &["--max-message-bytes", "65536"]).await;
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    c.send_raw(paste_frame(&c, &"x".repeat(70_000))).await;
    assert_eq!(c.closed().await, Some(1009));
    assert_unchanged(&server, &room, &token).await;
    // A paste whose message is just under the cap fits, whole.
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    let paste = "a".repeat(65_400);
    let frame = paste_frame(&c, &paste);
    assert!(
        frame.len() > 65_000 && frame.len() <= 65_536,
        "{}",
        frame.len()
    );
    c.send_raw(frame).await;
    eventually(&server, &room, &token, "main.rs", &format!("{paste}seed")).await;
    server.terminate().await;
}

#[tokio::test]
async fn malformed_frames_close_1008_and_change_nothing() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &[]).await;
    let update_tag = |body: Vec<u8>| YMessage::Sync(SyncMessage::Update(body)).encode_v1();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("unknown sync type", vec![0, 7, 1, 0], 1008),
        ("truncated varint", vec![0x80], 1008),
        (
            "garbage update",
            update_tag(vec![0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]),
            1008,
        ),
        ("update length past end", vec![0, 2, 50, 1, 2, 3], 1008),
        ("auth message from client", vec![2, 1], 1008),
        ("custom message type", vec![9, 0], 1008),
        ("empty frame", vec![], 1008),
    ];
    for (name, frame, code) in cases {
        let mut c = Client::connect(&server, &room, &token).await;
        c.synced().await;
        c.send_raw(frame).await;
        assert_eq!(c.closed().await, Some(code), "{name}");
        assert_unchanged(&server, &room, &token).await;
    }
    // A text frame is not part of the protocol.
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    futures_util::SinkExt::send(
        &mut c.ws,
        tokio_tungstenite::tungstenite::Message::Text("hi".into()),
    )
    .await
    .unwrap();
    assert_eq!(c.closed().await, Some(1003));
    assert!(server.metric("coderoom_protocol_errors_total").await >= 8.0);
    assert_unchanged(&server, &room, &token).await;
    server.terminate().await;
}

/// A full room refuses growth without closing the socket (a stock client would reconnect and
/// resend it in a loop): the client is told once, keeps reading, and the room keeps editing
/// within its cap. A deletion is let through, and once the room has compacted it, the space is
/// free again.
#[tokio::test]
async fn a_full_room_refuses_growth_keeps_readers_and_lets_deletions_free_space() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &["--max-doc-bytes", "8192"]).await;
    let mut a = Client::connect(&server, &room, &token).await;
    a.synced().await;
    a.insert("fill.txt", 0, &"a".repeat(6000)).await;
    eventually(&server, &room, &token, "fill.txt", &"a".repeat(6000)).await;
    // Past the cap: refused, told, still connected.
    a.insert("main.rs", 0, &"y".repeat(5000)).await;
    assert!(a.told().await.contains("This room is full"));
    assert_unchanged(&server, &room, &token).await;
    assert_eq!(
        server.metric("coderoom_updates_refused_full_total").await,
        1.0
    );
    // Reads work: the full client hears another client's presence (and the socket is open).
    let mut b = Client::connect(&server, &room, &token).await;
    b.synced().await;
    b.send(awareness(&[(4343, 1, r#"{"user":{}}"#)])).await;
    eventually_presence(&mut a, 4343).await;
    // A deletion goes through, and compaction gives the space back: a new 4 KB fits.
    b.remove("fill.txt", 0, 5000).await;
    eventually(&server, &room, &token, "fill.txt", &"a".repeat(1000)).await;
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    c.insert("new.txt", 0, &"c".repeat(4000)).await;
    eventually(&server, &room, &token, "new.txt", &"c".repeat(4000)).await;
    server.terminate().await;
}

/// A deletion that lands within a second of the last compaction frees its space a second later
/// on its own: the room does not wait for another command (which would be refused for want of
/// the very space the deletion freed).
#[tokio::test]
async fn a_deletion_held_by_the_once_a_second_rule_frees_space_without_another_command() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &["--max-doc-bytes", "8192"]).await;
    let mut a = Client::connect(&server, &room, &token).await;
    a.synced().await;
    a.insert("fill.txt", 0, &"a".repeat(6000)).await;
    eventually(&server, &room, &token, "fill.txt", &"a".repeat(6000)).await;
    a.insert("main.rs", 0, &"y".repeat(5000)).await;
    assert!(a.told().await.contains("This room is full"));
    // A first deletion compacts at once.
    let mut b = Client::connect(&server, &room, &token).await;
    b.synced().await;
    let before = server.metric("coderoom_compactions_total").await;
    b.remove("fill.txt", 0, 1000).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.metric("coderoom_compactions_total").await < before + 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first deletion did not compact within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Full again, and a second deletion at once: held by the once-a-second rule. Nothing else
    // is sent to the room (only /metrics is read) until it has compacted again.
    b.insert("main.rs", 0, &"z".repeat(5000)).await;
    assert!(b.told().await.contains("This room is full"));
    b.remove("fill.txt", 0, 4000).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.metric("coderoom_compactions_total").await < before + 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the held deletion never compacted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    c.insert("new.txt", 0, &"c".repeat(4000)).await;
    eventually(&server, &room, &token, "new.txt", &"c".repeat(4000)).await;
    server.terminate().await;
}

fn awareness(entries: &[(u64, u32, &str)]) -> YMessage {
    let clients: HashMap<_, _> = entries
        .iter()
        .map(|(id, clock, json)| {
            (
                ClientID::new(*id),
                AwarenessUpdateEntry {
                    clock: *clock,
                    json: (*json).into(),
                },
            )
        })
        .collect();
    YMessage::Awareness(AwarenessUpdate { clients })
}

#[tokio::test]
async fn awareness_limits() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &[]).await;

    // A normal presence state reaches the other peer.
    let mut a = Client::connect(&server, &room, &token).await;
    let mut b = Client::connect(&server, &room, &token).await;
    a.synced().await;
    b.synced().await;
    // The client claims to be someone else, with someone else's colour: the server states who
    // the connection belongs to, keeping the client's other fields.
    a.send(awareness(&[(
        1,
        1,
        r##"{"user":{"name":"ben@example.com","color":"#000000","cursor":7}}"##,
    )]))
    .await;
    let ana_id = me(&server, &token).await;
    let stamped = |json: &str| -> serde_json::Value { serde_json::from_str(json).unwrap() };
    loop {
        if let Event::Y(YMessage::Awareness(u)) = b.next().await {
            if let Some(e) = u.clients.get(&ClientID::new(1)) {
                let v = stamped(&e.json);
                assert_eq!(v["user"]["name"], "ana@example.com", "{v}");
                assert_eq!(v["user"]["id"], ana_id.as_str(), "{v}");
                assert_ne!(v["user"]["color"], "#000000", "{v}");
                assert_eq!(v["user"]["cursor"], 7, "{v}");
                break;
            }
        }
    }

    // Stock clients relay the presence they receive; a relay (even a forged newer state) of an
    // id owned by another connection is ignored, not applied and not an error. So is a relayed
    // removal. Neither counts towards the relaying connection's own ids.
    for i in 0..6u32 {
        b.send(awareness(&[(1, 2 + i, r#"{"user":{"name":"mallory"}}"#)]))
            .await;
        b.send(awareness(&[(1, 2 + i, "null")])).await;
    }
    b.send(YMessage::AwarenessQuery).await;
    loop {
        match b.next().await {
            Event::Y(YMessage::Awareness(u)) => {
                if let Some(e) = u.clients.get(&ClientID::new(1)) {
                    let v = stamped(&e.json);
                    assert_eq!(
                        v["user"]["name"], "ana@example.com",
                        "relay overwrote presence"
                    );
                    assert_eq!(v["user"]["cursor"], 7, "relay overwrote presence");
                    break;
                }
            }
            Event::Y(_) => {}
            Event::Closed(c) => panic!("relaying connection was closed ({c:?})"),
        }
    }

    // An entry of exactly 4 KiB is someone's presence; one byte more closes the connection.
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    let full = format!(r#"{{"pad":"{}"}}"#, "p".repeat(4096 - 10));
    assert_eq!(full.len(), 4096);
    c.send(awareness(&[(10, 1, &full)])).await;
    let mut watcher = Client::connect(&server, &room, &token).await;
    watcher.synced().await;
    eventually_presence(&mut watcher, 10).await;
    let big = format!(r#"{{"pad":"{}"}}"#, "p".repeat(4096 - 9));
    c.send(awareness(&[(10, 2, &big)])).await;
    assert_eq!(c.closed().await, Some(1008));

    // More client ids than one connection may own.
    let mut d = Client::connect(&server, &room, &token).await;
    d.synced().await;
    let many: Vec<(u64, u32, &str)> = (100..105).map(|i| (i, 1, "{}")).collect();
    d.send(awareness(&many)).await;
    assert_eq!(d.closed().await, Some(1008));

    // Not JSON.
    let mut e = Client::connect(&server, &room, &token).await;
    e.synced().await;
    e.send(awareness(&[(200, 1, "{nope")])).await;
    assert_eq!(e.closed().await, Some(1008));

    // JSON a lax parser accepts but ours refuses (out-of-range number, lone surrogate, deep
    // nesting): a peer might read an unstamped identity claim out of it, so it is refused and
    // never forwarded.
    let deep = format!(
        r#"{{"user":{{"name":"ben@example.com"}},"d":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    for (i, bad) in [
        r#"{"user":{"name":"ben@example.com"},"n":1e400}"#.to_owned(),
        r#"{"user":{"name":"ben@example.com"},"s":"\ud800"}"#.to_owned(),
        deep,
    ]
    .iter()
    .enumerate()
    {
        let mut x = Client::connect(&server, &room, &token).await;
        x.synced().await;
        x.send(awareness(&[(300 + i as u64, 1, bad.as_str())]))
            .await;
        assert_eq!(x.closed().await, Some(1008), "{bad}");
    }

    // When the owner leaves, its presence is removed for the others.
    let mut f = Client::connect(&server, &room, &token).await;
    f.synced().await;
    let _ = a.ws.close(None).await;
    loop {
        if let Event::Y(YMessage::Awareness(u)) = f.next().await {
            if let Some(entry) = u.clients.get(&ClientID::new(1)) {
                if &*entry.json == "null" {
                    break;
                }
            }
        }
    }
    assert_unchanged(&server, &room, &token).await;
    server.terminate().await;
}

#[tokio::test]
async fn client_that_stops_reading_is_dropped() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(
        &storage,
        &[
            "--outbound-queue-bytes",
            "65536",
            "--write-stall-ms",
            "1000",
        ],
    )
    .await;
    // The slow client joins and then never reads again: held back, then dropped once its socket
    // has accepted nothing for a second.
    let slow = raw_ws(&server, &room, &token).await;
    let mut w = Client::connect(&server, &room, &token).await;
    w.synced().await;
    let chunk = "z".repeat(16 * 1024);
    let mut dropped = false;
    for i in 0..2000u32 {
        w.insert("big.txt", 0, &chunk).await;
        if i % 20 == 0
            && server
                .metric("coderoom_connections_dropped_slow_total")
                .await
                >= 1.0
        {
            dropped = true;
            break;
        }
    }
    assert!(dropped, "a client that never reads was not disconnected");
    // The writer is unaffected and the server still answers.
    w.insert("main.rs", 4, "!").await;
    eventually(&server, &room, &token, "main.rs", "seed!").await;
    let mut settled = false;
    for _ in 0..100 {
        if server.metric("coderoom_connections").await == 1.0 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(settled, "only the writer should remain connected");
    drop(slow);
    server.terminate().await;
}

on_each_backend!(
    idle_room_unloads_and_reloads,
    idle_room_unloads_and_reloads_on
);

async fn idle_room_unloads_and_reloads_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let (server, token, room) =
        seeded(&storage, &["--room-idle-ms", "200", "--compact-every", "3"]).await;
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    for i in 0..10 {
        c.insert("main.rs", 4, &i.to_string()).await;
    }
    eventually(&server, &room, &token, "main.rs", "seed9876543210").await;
    let _ = c.ws.close(None).await;
    drop(c);
    // Unloaded after --room-idle-ms without a connection, not sooner.
    let closed = std::time::Instant::now();
    let mut unloaded = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if server.metric("coderoom_rooms_loaded").await == 0.0 {
            unloaded = Some(closed.elapsed());
            break;
        }
    }
    let unloaded = unloaded.expect("idle room was not unloaded");
    assert!(
        unloaded >= Duration::from_millis(200) && unloaded < Duration::from_secs(3),
        "unloaded {unloaded:?} after the last connection closed"
    );
    assert!(server.metric("coderoom_compactions_total").await >= 1.0);
    let (text, _) = snapshot(&server, &room, &token, "main.rs").await;
    assert_eq!(text, "seed9876543210");
    assert!(server.terminate().await.success());
    storage.drop_db().await;
}

#[tokio::test]
async fn refused_updates_change_nothing_in_the_room() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &["--max-doc-bytes", "4096"]).await;

    // An update whose items hang off content the room never saw (yrs would park it as
    // "pending": unlogged, unbounded, and leaked into sync replies).
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    let orphan = {
        use yrs::{ReadTxn, Text, Transact};
        let local = yrs::Doc::with_client_id(4242);
        let t = local.get_or_insert_text("main.rs");
        t.push(&mut local.transact_mut(), "never sent ");
        let sv = local.transact().state_vector();
        t.push(&mut local.transact_mut(), "depends on it");
        let orphan = local.transact().encode_state_as_update_v1(&sv);
        orphan
    };
    c.send(YMessage::Sync(SyncMessage::Update(orphan))).await;
    assert_eq!(c.closed().await, Some(1008));
    assert_unchanged(&server, &room, &token).await;

    // A frame that carries a refused update (it would grow the full room) and then one built
    // on it: neither is applied.
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    let update_of = |c: &Client, at: u32, s: &str| {
        use yrs::{Text, Transact};
        let t = c.text("main.rs");
        let mut txn = c.doc.transact_mut();
        t.insert(&mut txn, at, s);
        txn.encode_update_v1()
    };
    let too_big = update_of(&c, 0, &"y".repeat(5000));
    let small = update_of(&c, 0, "X");
    let frame = [
        YMessage::Sync(SyncMessage::Update(too_big)).encode_v1(),
        YMessage::Sync(SyncMessage::Update(small)).encode_v1(),
    ]
    .concat();
    c.send_raw(frame).await;
    // The room is full: the client is told, and stays connected; the update built on the
    // refused one is refused the same way.
    assert!(c.told().await.contains("This room is full"));
    assert_unchanged(&server, &room, &token).await;
    server.terminate().await;
}

#[tokio::test]
async fn sync_request_floods_get_one_answer_per_batch() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &[]).await;
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    let one = YMessage::Sync(SyncMessage::SyncStep1(yrs::StateVector::default())).encode_v1();
    c.send_raw(one.repeat(16)).await;
    c.synced().await;
    // Nothing else may follow: the 15 other copies of the document were never built. A
    // presence query after the flood is answered after every sync reply the flood got (a room
    // sends a batch's sync replies before its presence replies), so read up to that answer.
    c.send(awareness(&[(777, 1, r#"{"fence":true}"#)])).await;
    c.send(YMessage::AwarenessQuery).await;
    loop {
        match c.next().await {
            Event::Y(YMessage::Sync(SyncMessage::SyncStep2(_))) => {
                panic!("a second sync step 2 answered the same batch")
            }
            Event::Y(YMessage::Awareness(u)) if u.clients.contains_key(&ClientID::new(777)) => {
                break
            }
            Event::Y(_) => {}
            Event::Closed(code) => panic!("closed ({code:?})"),
        }
    }
    server.terminate().await;
}

#[tokio::test]
async fn presence_edge_cases_keep_the_room_alive() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &[]).await;
    // Five owners, one relayer that relays all five: relays never count as its own ids.
    let mut owners = Vec::new();
    for i in 0..5u64 {
        let mut o = Client::connect(&server, &room, &token).await;
        o.synced().await;
        o.send(awareness(&[(500 + i, 1, r#"{"user":{}}"#)])).await;
        owners.push(o);
    }
    let mut relayer = Client::connect(&server, &room, &token).await;
    relayer.synced().await;
    let relayed: Vec<(u64, u32, &str)> =
        (500..505).map(|i| (i, 9, r#"{"user":{"x":1}}"#)).collect();
    eventually_presence(&mut relayer, 504).await;
    relayer.send(awareness(&relayed)).await;
    relayer.send(YMessage::AwarenessQuery).await;
    // Still connected: it answers the query.
    loop {
        match relayer.next().await {
            Event::Y(YMessage::Awareness(u)) if u.clients.len() >= 5 => break,
            Event::Y(_) => {}
            Event::Closed(c) => panic!("relayer closed ({c:?})"),
        }
    }

    // A client-chosen clock at u32::MAX must not overflow when its owner leaves.
    let mut maxed = Client::connect(&server, &room, &token).await;
    maxed.synced().await;
    maxed
        .send(awareness(&[(900, u32::MAX, r#"{"user":{}}"#)]))
        .await;
    eventually_presence(&mut relayer, 900).await;
    let _ = maxed.ws.close(None).await;
    loop {
        if let Event::Y(YMessage::Awareness(u)) = relayer.next().await {
            if u.clients
                .get(&ClientID::new(900))
                .is_some_and(|e| &*e.json == "null")
            {
                break;
            }
        }
    }
    assert_eq!(server.metric("coderoom_room_panics_total").await, 0.0);

    // A client that clears its own presence and leaves at once (as y-websocket does on
    // destroy): the others still learn it is gone.
    let mut leaver = Client::connect(&server, &room, &token).await;
    leaver.synced().await;
    leaver.send(awareness(&[(950, 1, r#"{"user":{}}"#)])).await;
    eventually_presence(&mut relayer, 950).await;
    leaver.send(awareness(&[(950, 2, "null")])).await;
    let _ = leaver.ws.close(None).await;
    loop {
        if let Event::Y(YMessage::Awareness(u)) = relayer.next().await {
            if u.clients
                .get(&ClientID::new(950))
                .is_some_and(|e| &*e.json == "null")
            {
                break;
            }
        }
    }

    // Text that is not UTF-8 closes with 1007.
    let mut t = raw_ws(&server, &room, &token).await;
    let bad = tokio_tungstenite::tungstenite::protocol::frame::Frame::message(
        vec![0xff, 0xfe],
        tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode::Data(
            tokio_tungstenite::tungstenite::protocol::frame::coding::Data::Text,
        ),
        true,
    );
    futures_util::SinkExt::send(&mut t, tokio_tungstenite::tungstenite::Message::Frame(bad))
        .await
        .unwrap();
    let mut code = None;
    while let Ok(Some(Ok(m))) =
        tokio::time::timeout(TIMEOUT, futures_util::StreamExt::next(&mut t)).await
    {
        if let tokio_tungstenite::tungstenite::Message::Close(f) = m {
            code = f.map(|f| u16::from(f.code));
            break;
        }
    }
    assert_eq!(code, Some(1007));
    assert_unchanged(&server, &room, &token).await;
    server.terminate().await;
}

/// Reads until a presence state for `id` has been seen.
async fn eventually_presence(c: &mut Client, id: u64) {
    c.send(YMessage::AwarenessQuery).await;
    loop {
        match c.next().await {
            Event::Y(YMessage::Awareness(u)) if u.clients.contains_key(&ClientID::new(id)) => {
                return
            }
            Event::Y(_) => {}
            Event::Closed(code) => panic!("closed ({code:?}) waiting for presence {id}"),
        }
    }
}

#[tokio::test]
async fn a_reader_that_falls_behind_catches_up_instead_of_being_dropped() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &["--outbound-queue-bytes", "65536"]).await;
    let mut reader = Client::connect(&server, &room, &token).await;
    reader.synced().await;
    let mut writer = Client::connect(&server, &room, &token).await;
    writer.synced().await;
    // A burst twelve times the reader's broadcast budget, sent as fast as possible.
    let chunk = "b".repeat(16 * 1024);
    for _ in 0..50 {
        writer.insert("big.txt", 0, &chunk).await;
    }
    writer.insert("main.rs", 4, "!").await;
    let expected = writer.content("big.txt");
    // The reader ends up with everything, still connected (each read waits TIMEOUT at most).
    while reader.content("big.txt") != expected || reader.content("main.rs") != "seed!" {
        if let Event::Closed(code) = reader.next().await {
            panic!("reader was dropped ({code:?})");
        }
    }
    assert_eq!(
        server
            .metric("coderoom_connections_dropped_slow_total")
            .await,
        0.0
    );
    // ...through the hold-back path: it did fall behind, and was caught up.
    assert!(
        server.metric("coderoom_connections_held_back_total").await >= 1.0,
        "the reader never fell behind: this test did not test the catch-up"
    );
    server.terminate().await;
}

/// A reader held back while someone left learns of the departure when it catches up (the
/// removal was among the broadcasts it missed); before, its client showed the departed person
/// until its own 30-second timeout.
#[tokio::test]
async fn a_held_back_reader_learns_who_left_meanwhile() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &["--outbound-queue-bytes", "65536"]).await;
    let mut reader = Client::connect(&server, &room, &token).await;
    reader.synced().await;
    let mut leaver = Client::connect(&server, &room, &token).await;
    leaver.synced().await;
    leaver
        .send(awareness(&[(4242, 1, r#"{"user":{"name":"leaver"}}"#)]))
        .await;
    eventually_presence(&mut reader, 4242).await;
    // The reader stops reading while 3 MiB go by: more than its queue's budget and the
    // loopback socket's buffers together, so it falls behind and stays behind (its queue cannot
    // drain into a socket nobody reads) until it reads again.
    let mut writer = Client::connect(&server, &room, &token).await;
    writer.synced().await;
    let chunk = "b".repeat(16 * 1024);
    for _ in 0..200 {
        writer.insert("big.txt", 0, &chunk).await;
    }
    for _ in 0..200 {
        if server.metric("coderoom_connections_held_back_total").await >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(server.metric("coderoom_connections_held_back_total").await >= 1.0);
    // Someone leaves while the reader is held back.
    drop(leaver);
    writer.insert("main.rs", 4, "!").await;
    // Reading again: the reader catches up, and hears that 4242 left.
    loop {
        match reader.next().await {
            Event::Y(YMessage::Awareness(u))
                if u.clients
                    .get(&ClientID::new(4242))
                    .is_some_and(|e| &*e.json == "null") =>
            {
                break
            }
            Event::Y(_) => {}
            Event::Closed(code) => panic!("reader closed ({code:?}) before hearing who left"),
        }
    }
    // And it has the edits made meanwhile (the last one may come after the catch-up).
    reader.wait_for("main.rs", "seed!").await;
    server.terminate().await;
}

/// A room takes `--max-connections-per-room` connections at once; one more is closed with 1013
/// (try again later) before it joins, and a place that frees up can be taken again.
#[tokio::test]
async fn a_full_room_closes_1013() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let (server, token, room) = seeded(&storage, &["--max-connections-per-room", "2"]).await;
    // Joins once a place is free (the seeding connection's departure may still be on its way).
    let join_when_free = || async {
        for _ in 0..100 {
            let mut c = Client::connect(&server, &room, &token).await;
            match c.try_synced().await {
                Ok(()) => return c,
                Err(Some(1013)) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(other) => panic!("closed with {other:?}"),
            }
        }
        panic!("no place in the room freed up");
    };
    let a = join_when_free().await;
    let b = join_when_free().await;
    let mut c = Client::connect(&server, &room, &token).await;
    assert_eq!(c.try_synced().await, Err(Some(1013)));
    drop(b);
    // The room notices the departure; then a newcomer gets in.
    let _d = join_when_free().await;
    drop(a);
    server.terminate().await;
}

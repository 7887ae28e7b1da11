//! kill -9 at arbitrary moments, and aimed at compaction and at room unload: every update any
//! peer had received must survive the restart.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use rand::Rng;
use std::time::Duration;
use yrs::{StateVector, Transact};

const ROUNDS: usize = 9;

/// Where a round's kill lands.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// At a random moment while the writer writes.
    Random,
    /// Inside a compaction's transaction (snapshot written, log not yet trimmed).
    InCompaction,
    /// As an idle room leaves memory, after its last compaction.
    AtUnload,
}

/// Whether `a` covers everything `b` has seen.
fn dominates(a: &StateVector, b: &StateVector) -> bool {
    b.iter().all(|(client, clock)| a.get(client) >= *clock)
}

on_each_backend!(
    kill_9_loses_nothing_a_peer_received,
    kill_9_loses_nothing_a_peer_received_on
);

async fn kill_9_loses_nothing_a_peer_received_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let token = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &[]).await;
    let room = create_room(&server, &token).await;
    assert!(server.terminate().await.success());
    let mut restarted = None;
    for round in 0..ROUNDS {
        let kill = [Kill::Random, Kill::InCompaction, Kill::AtUnload][round % 3];
        let srv = match kill {
            Kill::Random => match restarted.take() {
                Some(s) => s,
                None => Server::start(&storage, &[]).await,
            },
            Kill::InCompaction | Kill::AtUnload => {
                if let Some(s) = restarted.take() {
                    assert!(Server::terminate(s).await.success());
                }
                let point = match kill {
                    Kill::InCompaction => "compaction",
                    _ => "room_unload",
                };
                Server::start_with_env(
                    &storage,
                    &["--compact-every", "16", "--room-idle-ms", "100"],
                    &[("CODEROOM_FAULT_PAUSE_AT", point)],
                )
                .await
            }
        };
        let mut writer = Client::connect(&srv, &room, &token).await;
        let mut peer = Client::connect(&srv, &room, &token).await;
        writer.synced().await;
        peer.synced().await;
        let before = peer.content("log");
        // The writer appends as fast as it can from its own task.
        let writing = tokio::spawn(async move {
            let mut i = 0u32;
            loop {
                let len = {
                    let t = writer.text("log");
                    let txn = writer.doc.transact();
                    yrs::Text::len(&t, &txn)
                };
                writer.insert("log", len, &format!("r{round}.{i};")).await;
                i += 1;
                tokio::time::sleep(Duration::from_micros(300)).await;
            }
        });
        // Everything the peer receives counts as received, up to the connection's end (or
        // until told to stop reading, when it leaves). What it has is its state vector and text.
        let (received_tx, mut received_rx) = tokio::sync::watch::channel(0usize);
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let reading = tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = peer.next() => match event {
                        Event::Closed(_) => break,
                        Event::Y(yrs::sync::Message::Sync(yrs::sync::SyncMessage::Update(_))) => {
                            received_tx.send_modify(|n| *n += 1);
                        }
                        Event::Y(_) => {}
                    },
                    _ = &mut stop_rx => break,
                }
            }
            (peer.state_vector(), peer.content("log"))
        });
        // Every kill comes after the peer has received something this round.
        tokio::time::timeout(TIMEOUT, received_rx.wait_for(|n| *n >= 1))
            .await
            .expect("the peer received nothing")
            .unwrap();
        match kill {
            Kill::Random => {
                let after = Duration::from_millis(rand::thread_rng().gen_range(0..300));
                tokio::time::sleep(after).await;
            }
            Kill::InCompaction => srv.stopped_at("compaction").await,
            Kill::AtUnload => {
                // Both leave; the idle room compacts and unloads, and dies on its way out.
                writing.abort();
                let _ = stop_tx.send(());
                srv.stopped_at("room_unload").await;
            }
        }
        srv.kill9().await;
        let (received, seen) = tokio::time::timeout(TIMEOUT, reading)
            .await
            .unwrap()
            .unwrap();
        writing.abort();
        assert!(
            seen.len() > before.len(),
            "{kill:?} round {round}: the peer saw nothing new before the kill"
        );

        let server = Server::start(&storage, &[]).await;
        let (text, sv) = snapshot(&server, &room, &token, "log").await;
        assert!(
            dominates(&sv, &received),
            "{backend:?} {kill:?} round {round}: server lost updates the peer had received \
             (server {sv:?}, peer {received:?})"
        );
        assert!(
            text.starts_with(&seen),
            "{backend:?} {kill:?} round {round}: stored text does not contain what the peer saw"
        );
        restarted = Some(server);
    }
    assert!(restarted.take().unwrap().terminate().await.success());
    storage.drop_db().await;
}

#[tokio::test]
async fn a_corrupt_log_entry_fails_closed_and_deletes_nothing() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let token = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &["--room-idle-ms", "100"]).await;
    let room = create_room(&server, &token).await;
    let mut c = Client::connect(&server, &room, &token).await;
    c.synced().await;
    c.insert("main.rs", 0, "precious").await;
    eventually(&server, &room, &token, "main.rs", "precious").await;
    assert!(server.terminate().await.success());

    let mut conn = storage.sqlite().await;
    sqlx::query("INSERT INTO doc_updates (room_id, seq, data) VALUES ($1, 1000000, $2)")
        .bind(&room)
        .bind(vec![0xffu8, 0xff, 0xff, 0x01])
        .execute(&mut conn)
        .await
        .unwrap();
    let before = stored_rows(&mut conn, &room).await;

    let server = Server::start(&storage, &["--room-idle-ms", "100"]).await;
    let mut c = Client::connect(&server, &room, &token).await;
    assert_eq!(
        c.closed().await,
        Some(1011),
        "a room that cannot load must refuse joins"
    );
    // A graceful stop compacts every loaded room that logged anything: past it, a room that
    // had loaded part of its history would have compacted that loss away.
    assert!(server.terminate().await.success());
    // Nothing was compacted away: the good history is still there for an operator to repair.
    assert_eq!(stored_rows(&mut conn, &room).await, before);
}

async fn stored_rows(conn: &mut sqlx::SqliteConnection, room: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM doc_updates WHERE room_id = $1) \
         + (SELECT COUNT(*) FROM doc_snapshots WHERE room_id = $1)",
    )
    .bind(room)
    .fetch_one(conn)
    .await
    .unwrap();
    n
}

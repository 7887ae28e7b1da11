//! kill -9 at arbitrary moments: every update any peer had received must survive the restart.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use rand::Rng;
use std::time::Duration;
use yrs::{StateVector, Transact};

const ROUNDS: usize = 8;

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
    let mut server = Some(server);
    let mut total_seen = 0;
    for round in 0..ROUNDS {
        let srv = server.take().unwrap();
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
        let kill_after = Duration::from_millis(rand::thread_rng().gen_range(50..400));
        let reading = tokio::spawn(async move {
            // Everything the peer receives counts as received, up to the connection's end.
            loop {
                if let Event::Closed(_) = peer.next().await {
                    break;
                }
            }
            peer
        });
        tokio::time::sleep(kill_after).await;
        srv.kill9().await;
        let peer = tokio::time::timeout(TIMEOUT, reading)
            .await
            .unwrap()
            .unwrap();
        writing.abort();
        let received = peer.state_vector();
        let seen = peer.content("log");
        assert!(seen.len() >= before.len());

        let restarted = Server::start(&storage, &[]).await;
        let (text, sv) = snapshot(&restarted, &room, &token, "log").await;
        assert!(
            dominates(&sv, &received),
            "{backend:?} round {round}: server lost updates the peer had received \
             (server {sv:?}, peer {received:?})"
        );
        assert!(
            text.starts_with(&seen),
            "{backend:?} round {round}: stored text does not contain what the peer saw"
        );
        total_seen = seen.len();
        server = Some(restarted);
    }
    assert!(total_seen > 0, "the writer never got an edit through");
    assert!(server.take().unwrap().terminate().await.success());
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
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Nothing was compacted away: the good history is still there for an operator to repair.
    assert_eq!(stored_rows(&mut conn, &room).await, before);
    assert!(server.terminate().await.success());
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

//! Every input in `server/fuzz/known-yrs-crashes/` (updates that make yrs 0.28 use freed
//! memory, found by fuzzing), sent over the WebSocket by an editor as a hostile client would.
//! Each is refused before it reaches a document (`room::protocol::walk_update`: one section per
//! client, no clock past 2^31 - 1), and must leave the server up, the hit room whole and other
//! rooms editing (see `docs/threat-model.md`, issue 13 item 6). A new input must say what the
//! server does with it.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::path::PathBuf;

/// What the server does with each known input.
#[derive(Debug, PartialEq)]
enum Disposition {
    /// Refused before any document sees it: the connection closes with 1008.
    Refused,
}

const KNOWN: &[(&str, Disposition)] = &[
    // A clock gap yrs fills wrongly: refused as skipping clocks.
    ("uaf-integrate-item-clock-gap", Disposition::Refused),
    // Clients repeated across sections: yrs integrates blocks twice (fuzzing found it).
    ("uaf-resolve-conflict", Disposition::Refused),
    // The smallest such update (25 bytes; issue 13 item 6's reproducer).
    ("uaf-repeated-client-minimal", Disposition::Refused),
    // A GC block of 2^32 - 1 clocks, then text: clocks wrap in a release build.
    ("clock-wrap-release", Disposition::Refused),
];

fn inputs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/known-yrs-crashes")
}

/// A new input cannot be added without saying what happens to it.
#[test]
fn every_known_input_has_a_disposition() {
    let mut found: Vec<String> = std::fs::read_dir(inputs_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    found.sort();
    let mut listed: Vec<&str> = KNOWN.iter().map(|(name, _)| *name).collect();
    listed.sort();
    assert_eq!(found, listed);
}

/// Sends each input of `disposition` into a room of its own as an editor, then checks that the
/// server is up, the hit room still holds what it had, and another room still edits.
async fn send_known_inputs(disposition: Disposition) {
    let storage = Storage::new(&Backend::Sqlite).await;
    let token = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &[]).await;
    let other = create_room(&server, &token).await;
    let mut bystander = Client::connect(&server, &other, &token).await;
    bystander.synced().await;
    for (name, _) in KNOWN.iter().filter(|(_, d)| *d == disposition) {
        let frame = std::fs::read(inputs_dir().join(name)).unwrap();
        let room = create_room(&server, &token).await;
        let mut c = Client::connect(&server, &room, &token).await;
        c.synced().await;
        c.insert("main.rs", 0, "kept").await;
        eventually(&server, &room, &token, "main.rs", "kept").await;
        let mut hostile = Client::connect(&server, &room, &token).await;
        hostile.synced().await;
        hostile.send_raw(frame).await;
        if disposition == Disposition::Refused {
            assert_eq!(hostile.closed().await, Some(1008), "{name}");
        }
        // The server is up and the hit room still holds what its peers received.
        assert_eq!(
            http(&server.url("/healthz"), "GET", None, None).await.0,
            200
        );
        assert_eq!(snapshot(&server, &room, &token, "main.rs").await.0, "kept");
        // Another room still edits.
        bystander.insert("notes", 0, name).await;
        eventually(
            &server,
            &other,
            &token,
            "notes",
            &bystander.content("notes"),
        )
        .await;
    }
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn refused_crash_inputs_leave_the_server_and_other_rooms_up() {
    send_known_inputs(Disposition::Refused).await;
}

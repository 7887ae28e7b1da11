//! Loading a room: its lease first, then its document rebuilt from the stored snapshot and
//! log, and the observer that collects what each transaction changes.

use super::{lease_duration, Room, RoomDeps, Tombstones};
use crate::ids::RoomId;
use crate::store::{StoreError, StoredDoc};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use yrs::updates::decoder::Decode;
use yrs::{Doc, StateVector, Transact, Update};

/// Why a stored document cannot be rebuilt.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DocError {
    #[error("a stored update does not decode")]
    Decode(#[from] yrs::encoding::read::Error),
    #[error("a stored update does not apply")]
    Apply(#[from] yrs::error::UpdateError),
}

/// Why a room could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the stored document is corrupt")]
    Corrupt(#[from] DocError),
    #[error("cannot follow the document's changes")]
    Observe,
    /// Another server owns the room (its lease is live): connections go there.
    #[error("the room is loaded on another server ({})", .0.server)]
    Elsewhere(crate::store::Owner),
}

/// Collects what each transaction on `doc` changed, encoded as a v1 update, into `sink`.
///
/// Encoded when the transaction's body is done, before yrs merges the new blocks into their
/// neighbours, not from `observe_update_v1` (which encodes after that merge): a typist's
/// insert at the end of a text is by then part of one long merged block, and encoding a slice
/// of it walks the block's string from its start, so each update cost time in proportion to the
/// text's length (85% of the server's CPU in a one-writer burst, `yrs::block::split_str`). The
/// two encodings hold the same change (`produced_updates_match_yrs_own` checks it).
///
/// `after_merge` (`serve --encode-after-merge`) encodes after the merge instead, for the
/// benchmark's comparison only (docs/benchmarks.md).
pub(crate) fn observe_produced(
    doc: &Doc,
    sink: Arc<Mutex<Vec<Vec<u8>>>>,
    after_merge: bool,
) -> Result<(), yrs::TransactionAcqError> {
    let keep = move |update: Vec<u8>| match sink.lock() {
        Ok(mut v) => v.push(update),
        Err(poisoned) => poisoned.into_inner().push(update),
    };
    if after_merge {
        return doc.observe_update_v1("log", move |_, event| keep(event.update.clone()));
    }
    doc.observe_after_transaction("log", move |txn| {
        if !txn.delete_set().is_empty() || txn.after_state() != txn.before_state() {
            keep(txn.encode_update_v1());
        }
    })
}

/// Rebuilds a room's document from its snapshot and log, failing on any entry that does not
/// decode or apply. Returns the document and the stored bytes it came from.
///
/// One transaction per entry: applied in one transaction, a long log grew worse than
/// quadratically (yrs squashes runs of text only when a transaction commits): 40,000 entries
/// took 11.8 s, now 62 ms (`load_tests`, docs/benchmarks.md).
pub(crate) fn doc_from_stored(stored: &StoredDoc) -> Result<(Doc, usize), DocError> {
    let doc = Doc::new();
    let mut bytes = 0;
    let parts = stored
        .snapshot
        .iter()
        .map(Vec::as_slice)
        .chain(stored.updates.iter().map(|(_, d)| d.as_slice()));
    for data in parts {
        bytes += data.len();
        let update = Update::decode_v1(data)?;
        doc.transact_mut().apply_update(update)?;
    }
    Ok((doc, bytes))
}

impl Room {
    /// Loads the room's document from storage.
    pub(crate) async fn load(id: RoomId, deps: RoomDeps) -> Result<Room, LoadError> {
        // Ownership first, then the log: whatever a previous owner appended under its lease is
        // in the log before this load reads it (its later appends are refused).
        let asked = Instant::now();
        let lease = match deps
            .store
            .claim_room(&id, &deps.server, deps.lease_ms)
            .await?
        {
            crate::store::Claim::Won(lease) => lease,
            crate::store::Claim::Held(owner) => return Err(LoadError::Elsewhere(owner)),
        };
        let lease_until = asked + lease_duration(deps.lease_ms);
        let stored = match deps.store.load_doc(&id).await {
            Ok(stored) => stored,
            Err(e) => {
                let _ = deps.store.release_room(&id, lease).await;
                return Err(e.into());
            }
        };
        // Fail closed: a room loaded without part of its history would compact that loss into
        // its next snapshot and delete the log that still holds it.
        let (doc, stored_bytes) = match doc_from_stored(&stored) {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::error!(room = %id, error = %e, "stored document is corrupt; room not loaded");
                let _ = deps.store.release_room(&id, lease).await;
                return Err(e.into());
            }
        };
        let next_seq = stored
            .updates
            .last()
            .map_or(stored.snapshot_seq, |(seq, _)| *seq)
            + 1;
        let produced: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let sink = produced.clone();
        observe_produced(&doc, sink, deps.limits.encode_after_merge)
            .map_err(|_| LoadError::Observe)?;
        let file_keys = crate::room::journal::Keys::observe(&doc);
        Ok(Room {
            id,
            deps,
            lease,
            lease_until,
            moved: false,
            doc,
            produced,
            conns: HashMap::new(),
            presence: HashMap::new(),
            tombstones: Tombstones::default(),
            next_seq,
            logged_since_snapshot: stored.updates.len() as u64,
            stored_bytes,
            batch_sv: StateVector::default(),
            batch_departures: 0,
            presence_sent: 0,
            batch: Vec::new(),
            departed: Default::default(),
            file_keys,
            journal_budget: Default::default(),
            unrecorded: Default::default(),
            last_summary: None,
            replies: Vec::new(),
            sync_requests: Vec::new(),
            presence_queries: HashSet::new(),
            presence_changes: HashMap::new(),
            closing: Vec::new(),
            full: false,
            told_full: HashSet::new(),
            told_not_kept: HashSet::new(),
            shrink_pending: false,
            last_shrink: None,
            close_decided: HashMap::new(),
            refused: HashSet::new(),
            denials: HashMap::new(),
            denials_audited: HashMap::new(),
            audits_in_flight: Arc::default(),
        })
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;
    use yrs::{GetString, ReadTxn, Text, WriteTxn};

    /// A log of `n` updates, each appending ten characters to one text (as a typist would).
    fn log_of(n: usize) -> StoredDoc {
        let doc = Doc::new();
        let text = doc.get_or_insert_text("files/big.txt");
        let mut updates = Vec::with_capacity(n);
        for i in 0..n {
            let sv = doc.transact().state_vector();
            {
                let mut txn = doc.transact_mut();
                let end = text.len(&txn);
                text.insert(&mut txn, end, "0123456789");
            }
            updates.push((i as i64, doc.transact().encode_diff_v1(&sv)));
        }
        StoredDoc {
            snapshot: None,
            snapshot_seq: 0,
            updates,
        }
    }

    /// What `observe_produced` records for each transaction holds the same change as yrs's own
    /// `observe_update_v1`: replaying either list into a fresh document gives the same
    /// document after every transaction. The edits are the room's: texts inside the `files`
    /// map typed at the end and at the start, ranges deleted, a file (a map entry holding a
    /// text) removed, which yrs collects; remote updates inserting, deleting, and typing into a
    /// file the room has removed (integrated as deleted); and a remote update whose parts
    /// depend on content the room lacks, pruned from the pending store as the room does.
    #[test]
    fn produced_updates_match_yrs_own() {
        use yrs::types::ToJson;
        use yrs::{Map, MapRef, ReadTxn, TextPrelim, TextRef, Transact, Update};
        let doc = Doc::new();
        let ours: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        observe_produced(&doc, ours.clone(), false).unwrap();
        let theirs: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let sink = theirs.clone();
        doc.observe_update_v1("yrs", move |_, e| {
            sink.lock().unwrap().push(e.update.clone())
        })
        .unwrap();
        let files = doc.get_or_insert_map("files");
        let file = |d: &Doc, m: &MapRef, name: &str| -> Option<TextRef> {
            m.get(&d.transact(), name)
                .and_then(|v| v.cast::<TextRef>().ok())
        };
        // A remote peer that syncs with the room both ways.
        let remote = Doc::new();
        let rfiles = remote.get_or_insert_map("files");
        let sync = |from: &Doc, to: &Doc| {
            let u = from
                .transact()
                .encode_diff_v1(&to.transact().state_vector());
            to.transact_mut()
                .apply_update(Update::decode_v1(&u).unwrap())
                .unwrap();
        };
        let (a, b) = (Doc::new(), Doc::new());
        let mut replayed = 0;
        let mut check = |step: u32| {
            let ours = ours.lock().unwrap().clone();
            let theirs = theirs.lock().unwrap().clone();
            assert_eq!(
                ours.len(),
                theirs.len(),
                "step {step}: one update per change"
            );
            for (x, y) in ours[replayed..].iter().zip(&theirs[replayed..]) {
                a.transact_mut()
                    .apply_update(Update::decode_v1(x).unwrap())
                    .unwrap();
                b.transact_mut()
                    .apply_update(Update::decode_v1(y).unwrap())
                    .unwrap();
            }
            replayed = ours.len();
            let json = |d: &Doc| d.get_or_insert_map("files").to_json(&d.transact());
            assert_eq!(json(&a), json(&b), "step {step}");
            assert_eq!(json(&a), json(&doc), "step {step}");
            assert_eq!(a.transact().state_vector(), b.transact().state_vector());
            assert_eq!(
                a.transact().snapshot().delete_set,
                b.transact().snapshot().delete_set,
                "step {step}"
            );
        };
        for i in 0..120u32 {
            let name = format!("f{}", i % 5);
            match i % 8 {
                0 => {
                    // A new file, or typing at the end of one.
                    let mut t = doc.transact_mut();
                    match files.get(&t, &name).and_then(|v| v.cast::<TextRef>().ok()) {
                        Some(text) => {
                            let end = text.len(&t);
                            text.insert(&mut t, end, &format!("{i:04}é|"));
                        }
                        None => {
                            files.insert(&mut t, name.clone(), TextPrelim::new("start|"));
                        }
                    }
                }
                1 | 2 => {
                    if let Some(text) = file(&doc, &files, &name) {
                        let mut t = doc.transact_mut();
                        let end = text.len(&t);
                        text.insert(&mut t, end, &format!("{i:04}|"));
                        // Typed at the start (ASCII there: byte offsets split no character),
                        // and a range deleted.
                        text.insert(&mut t, 0, "ab");
                        text.remove_range(&mut t, 1, 2);
                    }
                }
                3 => {
                    // Typed and deleted in one transaction, which yrs collects.
                    if let Some(text) = file(&doc, &files, &name) {
                        let mut t = doc.transact_mut();
                        let end = text.len(&t);
                        text.insert(&mut t, end, "gone");
                        text.remove_range(&mut t, end, 4);
                    }
                }
                4 => {
                    // The remote peer types and deletes; the room applies it.
                    sync(&doc, &remote);
                    if let Some(text) = file(&remote, &rfiles, &name) {
                        let mut t = remote.transact_mut();
                        let end = text.len(&t);
                        text.insert(&mut t, end, "remote|");
                        if end > 3 {
                            text.remove_range(&mut t, 0, 1);
                        }
                    }
                    sync(&remote, &doc);
                }
                5 => {
                    // The remote peer types into a file the room removes meanwhile.
                    sync(&doc, &remote);
                    if let Some(text) = file(&remote, &rfiles, &name) {
                        {
                            let mut t = remote.transact_mut();
                            let end = text.len(&t);
                            text.insert(&mut t, end, "late|");
                        }
                        files.remove(&mut doc.transact_mut(), &name);
                        sync(&remote, &doc);
                    }
                }
                6 => {
                    // An update that depends on one the room never got: its parts go pending
                    // and are pruned, as the room does.
                    let third = Doc::new();
                    let tt = third.get_or_insert_text("orphan");
                    tt.insert(&mut third.transact_mut(), 0, "first");
                    let sv = third.transact().state_vector();
                    tt.insert(&mut third.transact_mut(), 5, "second");
                    let u = third.transact().encode_diff_v1(&sv);
                    let mut t = doc.transact_mut();
                    t.apply_update(Update::decode_v1(&u).unwrap()).unwrap();
                    assert!(t.prune_pending().is_some());
                }
                _ => {
                    // A transaction that changes nothing produces nothing.
                    drop(doc.transact_mut());
                }
            }
            check(i);
        }
        assert!(replayed >= 40, "{replayed} updates");
    }

    /// Loading a long log takes time in proportion to it (run with --release --ignored
    /// --nocapture to see the figures: 10k, 20k, 40k entries in 9.7, 29.3, 61.5 ms here; in
    /// one transaction they took 353, 1,369 and 11,849 ms).
    #[test]
    #[ignore = "measurement: run with --release --ignored --nocapture"]
    fn long_logs_load_in_proportion() {
        for n in [10_000, 20_000, 40_000] {
            let stored = log_of(n);
            let started = std::time::Instant::now();
            let (doc, _) = doc_from_stored(&stored).unwrap();
            let took = started.elapsed();
            let text = doc.get_or_insert_text("files/big.txt");
            assert_eq!(text.get_string(&doc.transact()).len(), n * 10);
            println!("{n} updates: {:.1} ms", took.as_secs_f64() * 1000.0);
        }
    }
}

//! Edits to a file that is gone: carried, never dropped.
//!
//! The document's `files` map holds one `Y.Text` per path, and a rename, the way every Yjs client
//! does it, writes a new text under the new path and deletes the old key in one transaction. Yjs
//! integrates an edit made to the old text by someone who had not yet seen the rename (typing at
//! that moment, or offline) into the deleted text, where it is invisible to everyone. The same
//! happens to an edit of a file someone deleted.
//!
//! The room remembers the files that left the map: for each, which characters it held (by their
//! Yjs ids) and, when the same transaction wrote a text with the same content under another key
//! (or the same key), which characters of that text they became. When an update adds text that
//! the document at once counts as deleted, although the update itself did not delete it, the
//! room reads that text from the update and inserts it again where it belongs: after the
//! character its author typed it after, followed through every rename since. An edit to a
//! deleted file brings the file back, with what it held when it was deleted. Deletions a stale
//! client made in a departed file are carried the same way. Text with nowhere known to go (the
//! room was reloaded since the file left) is kept in `recovered/`, never dropped.
//!
//! The memory is bounded ([`MAX_RECORDS`], [`MAX_KEPT_BYTES`]) and lives as long as the loaded
//! room. `docs/design.md` argues the choice.

use crate::room::protocol::Piece;
use std::collections::{HashMap, VecDeque};
use yrs::types::text::{ChangeKind, YChange};
use yrs::types::TypeRef;
use yrs::{
    Any, Assoc, BranchID, ClientID, Doc, GetString, IdSet, IndexScope, Map, MapRef, Out, ReadTxn,
    Snapshot, StateVector, StickyIndex, Text, TextPrelim, TextRef, Transact, TransactionMut, ID,
};

/// Departed files remembered per room, the oldest forgotten first.
const MAX_RECORDS: usize = 256;
/// Text and layouts kept for departed files, in bytes, the oldest forgotten first.
const MAX_KEPT_BYTES: usize = 16 << 20;
/// Carried runs remembered (what later edits built on a carried run are placed by).
const MAX_CARRIED: usize = 4096;
/// Runs of text one update may have carried one by one (each is placed by a walk of its text);
/// the rest of a larger update's lost text is kept in `recovered/`, in one file.
const MAX_CARRIED_PIECES: usize = 1000;
/// Characters deleted in departed files that one update may carry (each is placed on its own,
/// by a walk of its text); beyond, the text stays (the safe side).
const MAX_CARRIED_DELETIONS: usize = 1000;
/// Passes over one update's lost pieces, each placing those whose anchors are placed.
const MAX_PASSES: usize = 16;
/// Renames followed from a character to where it is now.
const MAX_HOPS: usize = 64;
/// Where text with nowhere known to go is kept.
const RECOVERED_DIR: &str = "recovered";

/// A run of consecutive ids: `len` clock units from `id`, at UTF-16 position `at` of its text.
#[derive(Debug, Clone, Copy)]
struct Run {
    id: ID,
    len: u32,
    at: u32,
}

/// Where each visible character of a text was, as runs of consecutive ids in text order.
#[derive(Debug, Default)]
struct Layout {
    runs: Vec<Run>,
    /// Per client, indexes into `runs` sorted by clock.
    by_client: HashMap<ClientID, Vec<usize>>,
}

impl Layout {
    /// The layout of `text` and the text of each run; `None` when it holds anything but plain
    /// text.
    /// `now` is the document's snapshot (one for many texts: it costs a pass over the document).
    fn of(
        txn: &mut TransactionMut<'_>,
        now: &Snapshot,
        text: &TextRef,
    ) -> Option<(Layout, Vec<String>)> {
        let before = Snapshot::new(StateVector::default(), IdSet::new());
        // Against an empty snapshot every visible item is "added", and the diff names each one
        // by its first id.
        let chunks = text.diff_range(txn, Some(now), Some(&before), |c: YChange| c);
        let mut runs = Vec::new();
        let mut texts = Vec::new();
        let mut at: u32 = 0;
        for chunk in chunks {
            let (Out::Any(Any::String(s)), Some(change)) = (&chunk.insert, &chunk.ychange) else {
                return None;
            };
            if change.kind != ChangeKind::Added {
                return None;
            }
            let len = u32::try_from(s.encode_utf16().count()).ok()?;
            runs.push(Run {
                id: change.id,
                len,
                at,
            });
            at = at.checked_add(len)?;
            texts.push(s.to_string());
        }
        Some((Layout::from_runs(runs), texts))
    }

    /// A layout of `runs`, each placed right after the one before.
    fn from_runs(runs: Vec<Run>) -> Layout {
        let mut layout = Layout {
            runs,
            by_client: HashMap::new(),
        };
        for (i, r) in layout.runs.iter().enumerate() {
            layout.by_client.entry(r.id.client).or_default().push(i);
        }
        for runs in layout.by_client.values_mut() {
            runs.sort_by_key(|i| layout.runs[*i].id.clock);
        }
        layout
    }

    /// UTF-16 position of the character `id`, if this layout holds it.
    fn position(&self, id: &ID) -> Option<u32> {
        let runs = self.by_client.get(&id.client)?;
        let i = runs.partition_point(|i| self.runs[*i].id.clock <= id.clock);
        let r = self.runs[*runs.get(i.checked_sub(1)?)?];
        (id.clock < r.id.clock + r.len).then(|| r.at + (id.clock - r.id.clock))
    }

    /// The id of the character at UTF-16 position `at`.
    fn id_at(&self, at: u32) -> Option<ID> {
        let i = self.runs.partition_point(|r| r.at <= at);
        let r = self.runs.get(i.checked_sub(1)?)?;
        (at < r.at + r.len).then(|| ID::new(r.id.client, r.id.clock + (at - r.at)))
    }

    fn bytes(&self) -> usize {
        self.runs.len() * std::mem::size_of::<Run>() * 2
    }
}

/// A file leaving the map in the update being applied, read before it is applied.
pub(crate) struct Departure {
    path: String,
    branch: ID,
    layout: Layout,
    /// The text of each run of `layout`.
    texts: Vec<String>,
}

/// A departing file as the author of its departure knew it.
struct Seen {
    /// The characters it saw, in order: what a text it wrote in its place copies.
    layout: Layout,
    content: String,
    /// Runs typed meanwhile that it never saw, each after the character before it.
    unseen: Vec<Piece>,
}

impl Departure {
    fn content(&self) -> String {
        self.texts.concat()
    }

    /// Splits the file into what the departing update's author saw and what it did not. Yjs
    /// clients (the npm package and yrs alike) delete a text by deleting each character they
    /// have of it, so the update's delete set names exactly the characters its author saw; the
    /// others were typed meanwhile by someone else, and reached the room first.
    fn seen_by(&self, ds: &IdSet) -> Seen {
        let mut runs: Vec<Run> = Vec::new();
        let mut content = String::new();
        let mut unseen: Vec<Piece> = Vec::new();
        let mut at = 0;
        let mut before: Option<ID> = None;
        let mut last_unseen: Option<ID> = None;
        for (run, text) in self.layout.runs.iter().zip(&self.texts) {
            let mut offset = 0;
            for ch in text.chars() {
                let id = ID::new(run.id.client, run.id.clock + offset);
                let units = ch.len_utf16() as u32;
                if ds.contains(&id) {
                    match runs.last_mut() {
                        Some(r)
                            if r.id.client == id.client
                                && r.id.clock + r.len == id.clock
                                && r.at + r.len == at =>
                        {
                            r.len += units;
                        }
                        _ => runs.push(Run { id, len: units, at }),
                    }
                    at += units;
                    content.push(ch);
                } else {
                    match unseen.last_mut() {
                        Some(p) if before == last_unseen && before.is_some() => p.text.push(ch),
                        _ => unseen.push(Piece {
                            id,
                            origin: before,
                            right: None,
                            parent: Some(self.branch),
                            text: ch.to_string(),
                        }),
                    }
                    last_unseen = Some(ID::new(id.client, id.clock + units - 1));
                }
                before = Some(ID::new(id.client, id.clock + units - 1));
                offset += units;
            }
        }
        Seen {
            layout: Layout::from_runs(runs),
            content,
            unseen,
        }
    }
}

struct Record {
    /// The departed text's item (its key's entry in `files`).
    branch: ID,
    path: String,
    layout: Layout,
    /// What it held, kept for a deleted file until an edit brings it back.
    content: Option<String>,
    /// The text it became: its item and the layout it had then (same content, same positions).
    successor: Option<(ID, Layout)>,
}

impl Record {
    fn bytes(&self) -> usize {
        self.path.len()
            + self.layout.bytes()
            + self.content.as_ref().map_or(0, String::len)
            + self.successor.as_ref().map_or(0, |(_, l)| l.bytes())
    }
}

/// A run of text carried: the ids its author gave it, and those of the copy the room inserted.
struct Carried {
    from: ID,
    len: u32,
    to: ID,
    /// The departed text it was typed into.
    lost_in: ID,
}

/// Where a character is now.
enum Now {
    /// In a text that has not departed (or that the room does not know departed).
    Here(ID),
    /// In a departed file with nothing it became: the record's index.
    Gone(usize),
}

/// What one update's carrying did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub carried: u64,
    pub unplaced: u64,
    pub restored: Vec<String>,
    /// Files that left the map with what they became: (from, to).
    pub moved: Vec<(String, String)>,
    /// Files that left the map for nothing: (path, what it held, whether it came back at once).
    pub deleted: Vec<(String, String, bool)>,
}

#[derive(Default)]
pub(crate) struct Departed {
    records: VecDeque<Record>,
    kept_bytes: usize,
    carried: VecDeque<Carried>,
}

fn files(doc: &Doc) -> MapRef {
    doc.get_or_insert_map("files")
}

fn branch_item(text: &TextRef) -> Option<ID> {
    match AsRef::<yrs::branch::Branch>::as_ref(text).id() {
        BranchID::Nested(id) => Some(id),
        BranchID::Root(_) => None,
    }
}

/// The files of `doc` whose entries the delete set `ds` removes, read as they are now.
pub(crate) fn departing(doc: &Doc, ds: &IdSet) -> Vec<Departure> {
    let files = files(doc);
    let leaving: Vec<(String, TextRef, ID)> = files
        .iter(&doc.transact())
        .filter_map(|(path, value)| match value {
            Out::YText(t) => {
                let id = branch_item(&t)?;
                ds.contains(&id).then(|| (path.to_string(), t, id))
            }
            _ => None,
        })
        .collect();
    if leaving.is_empty() {
        return Vec::new();
    }
    let mut txn = doc.transact_mut();
    let now = txn.snapshot();
    leaving
        .into_iter()
        .filter_map(|(path, text, branch)| {
            let (layout, texts) = Layout::of(&mut txn, &now, &text)?;
            Some(Departure {
                path,
                branch,
                layout,
                texts,
            })
        })
        .collect()
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

impl Departed {
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records files that just left the map, by the update with delete set `ds` that inserted
    /// `inserted`. A text the same update wrote with the content the file had for its author
    /// (one each, the same file name first: a folder rename) is what the file became; what
    /// others typed into the file meanwhile, unseen by that author, is carried into it. A file
    /// deleted with such unseen typing in it comes back at once.
    pub(crate) fn depart(
        &mut self,
        doc: &Doc,
        departures: Vec<Departure>,
        ds: &IdSet,
        inserted: &IdSet,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let me = doc.client_id();
        let files = files(doc);
        let mut txn = doc.transact_mut();
        let mut fresh: Vec<(String, TextRef, ID, String)> = files
            .iter(&txn)
            .filter_map(|(path, value)| match value {
                Out::YText(t) => {
                    let id = branch_item(&t)?;
                    if !inserted.contains(&id) {
                        return None;
                    }
                    let content = t.get_string(&txn);
                    Some((path.to_string(), t, id, content))
                }
                _ => None,
            })
            .collect();
        // Restoring a file below adds to the document; the successors are read before that.
        let now = txn.snapshot();
        for d in departures {
            // Read before the update was applied: an update refused part way (content it
            // depends on missing) may not have removed the file after all.
            if live_text(&txn, &d.branch).is_some() {
                continue;
            }
            let seen = d.seen_by(ds);
            tracing::debug!(path = %d.path, seen = %seen.content, unseen = seen.unseen.len(), "a file leaves the document");
            let same = |f: &(String, TextRef, ID, String)| f.3 == seen.content;
            let pick = fresh
                .iter()
                .position(|f| same(f) && file_name(&f.0) == file_name(&d.path))
                .or_else(|| fresh.iter().position(same));
            let successor = pick.and_then(|i| {
                let (to, text, id, _) = fresh.swap_remove(i);
                let (layout, _) = Layout::of(&mut txn, &now, &text)?;
                Some((id, layout, to))
            });
            // Past the limit on carried runs, the file comes back whole instead (one insertion).
            let successor = successor.filter(|_| seen.unseen.len() <= MAX_CARRIED_PIECES);
            if let Some((id, layout, to)) = successor {
                outcome.moved.push((d.path.clone(), to));
                let successor = Some((id, layout));
                self.keep(Record {
                    branch: d.branch,
                    path: d.path,
                    layout: seen.layout,
                    content: None,
                    successor,
                });
                for piece in &seen.unseen {
                    if self.place(&mut txn, &files, me, piece, &mut outcome) {
                        outcome.carried += 1;
                    }
                }
            } else {
                let content = d.content();
                outcome
                    .deleted
                    .push((d.path.clone(), content.clone(), !seen.unseen.is_empty()));
                self.keep(Record {
                    branch: d.branch,
                    path: d.path,
                    layout: d.layout,
                    content: Some(content),
                    successor: None,
                });
                if !seen.unseen.is_empty() {
                    let i = self.records.len() - 1;
                    if self.restore(&mut txn, &files, i, &mut outcome) {
                        outcome.carried += seen.unseen.len() as u64;
                    }
                }
            }
        }
        outcome
    }

    fn keep(&mut self, record: Record) {
        self.kept_bytes += record.bytes();
        self.records.push_back(record);
        while self.records.len() > MAX_RECORDS || self.kept_bytes > MAX_KEPT_BYTES {
            let Some(old) = self.records.pop_front() else {
                break;
            };
            self.kept_bytes = self.kept_bytes.saturating_sub(old.bytes());
        }
    }

    /// The newest carried run that holds the character `id`.
    fn carried_at(&self, id: &ID) -> Option<&Carried> {
        self.carried
            .iter()
            .rev()
            .find(|c| within(c.from, c.len, id))
    }

    fn record_of(&self, branch: &ID) -> Option<usize> {
        self.records.iter().rposition(|r| &r.branch == branch)
    }

    /// Follows the character `id` through carried runs and departed files to where it is now.
    fn follow(&self, mut id: ID) -> Now {
        for _ in 0..MAX_HOPS {
            if let Some(c) = self.carried_at(&id) {
                id = ID::new(c.to.client, c.to.clock + (id.clock - c.from.clock));
                continue;
            }
            let found = self
                .records
                .iter()
                .enumerate()
                .rev()
                .find_map(|(i, r)| r.layout.position(&id).map(|at| (i, at)));
            match found {
                None => return Now::Here(id),
                Some((i, at)) => match self.records[i].successor.as_ref() {
                    Some((_, layout)) => match layout.id_at(at) {
                        Some(next) => id = next,
                        None => return Now::Gone(i),
                    },
                    None => return Now::Gone(i),
                },
            }
        }
        Now::Here(id)
    }

    /// Carries what `update` (already applied) added to or deleted from departed files. `lost`
    /// is the text it added that the document counts as deleted although the update did not
    /// delete it; `ds` the update's own delete set; `inserted` what it inserted.
    pub(crate) fn carry(
        &mut self,
        doc: &Doc,
        update: &[u8],
        lost: &IdSet,
        ds: &IdSet,
        inserted: &IdSet,
        now_ms: i64,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let pieces: Vec<Piece> = if lost.is_empty() {
            Vec::new()
        } else {
            match crate::room::protocol::pieces(update) {
                Ok(p) => without_new_files(
                    p.into_iter()
                        .filter(|p| overlaps(lost, p.id, p.clocks()))
                        .collect(),
                    inserted,
                ),
                Err(_) => Vec::new(),
            }
        };
        // Deletions in departed files are found without a transaction: most updates (every
        // backspace, once a file has departed) have none.
        let deletions = if ds.is_empty() || self.records.is_empty() {
            Vec::new()
        } else {
            self.deletions_in_departed(ds)
        };
        if pieces.is_empty() && deletions.is_empty() {
            return outcome;
        }
        let me = doc.client_id();
        let files = files(doc);
        let mut txn = doc.transact_mut();
        // A piece built on another lost piece waits until that one is placed: a few passes
        // settle any order (a client's own typing comes in order, and takes one).
        #[derive(Clone, Copy, PartialEq)]
        enum State {
            Waiting,
            Placed,
            Unplaced,
        }
        let mut state: Vec<State> = (0..pieces.len())
            .map(|i| {
                if i < MAX_CARRIED_PIECES {
                    State::Waiting
                } else {
                    State::Unplaced
                }
            })
            .collect();
        let mut by_client: HashMap<ClientID, Vec<usize>> = HashMap::new();
        for (i, p) in pieces.iter().enumerate() {
            by_client.entry(p.id.client).or_default().push(i);
        }
        for _ in 0..MAX_PASSES {
            let mut progress = false;
            for i in 0..pieces.len() {
                if state[i] != State::Waiting {
                    continue;
                }
                let blocked = |anchor: Option<ID>| {
                    anchor.is_some_and(|id| {
                        by_client.get(&id.client).is_some_and(|js| {
                            js.iter().any(|&j| {
                                j != i
                                    && state[j] == State::Waiting
                                    && within(pieces[j].id, pieces[j].clocks(), &id)
                            })
                        })
                    })
                };
                let piece = &pieces[i];
                if blocked(piece.origin) || blocked(piece.right) {
                    continue;
                }
                progress = true;
                state[i] = if self.place(&mut txn, &files, me, piece, &mut outcome) {
                    outcome.carried += 1;
                    State::Placed
                } else {
                    State::Unplaced
                };
            }
            if !progress {
                break;
            }
        }
        let unplaced: Vec<&Piece> = pieces
            .iter()
            .zip(&state)
            .filter(|(_, s)| **s != State::Placed)
            .map(|(p, _)| p)
            .collect();
        if !unplaced.is_empty() {
            outcome.unplaced = unplaced.len() as u64;
            let text = unplaced
                .iter()
                .map(|p| p.text.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            let path = free_path(&format!("{RECOVERED_DIR}/edits-{now_ms}.txt"), |p| {
                files.contains_key(&txn, p)
            });
            files.insert(&mut txn, path.as_str(), TextPrelim::new(text));
            outcome.restored.push(path);
        }
        for id in deletions {
            if let Now::Here(at) = self.follow(id) {
                delete_char(&mut txn, at);
            }
        }
        outcome
    }

    /// Inserts one lost piece where it belongs: after the character its author typed it after
    /// (or before the one it was typed before, or at the start of the text it was the first
    /// text of), followed to where that character is now. Returns false when that is unknown.
    fn place(
        &mut self,
        txn: &mut TransactionMut<'_>,
        files: &MapRef,
        me: ClientID,
        piece: &Piece,
        outcome: &mut Outcome,
    ) -> bool {
        let anchors = [(piece.origin, Assoc::Before), (piece.right, Assoc::After)];
        for (anchor, assoc) in anchors {
            let Some(anchor) = anchor else { continue };
            let lost_in = self.departed_of(&anchor);
            let mut now = self.follow(anchor);
            if let Now::Gone(i) = now {
                if !self.restore(txn, files, i, outcome) {
                    continue;
                }
                now = self.follow(anchor);
            }
            let Now::Here(at) = now else { continue };
            let Some(offset) = StickyIndex::new(IndexScope::Relative(at), assoc).get_offset(txn)
            else {
                continue;
            };
            if !is_live_text(&offset.branch) {
                continue;
            }
            let text = TextRef::from(offset.branch);
            self.insert(txn, me, &text, offset.index, piece, lost_in);
            return true;
        }
        // The first text of an empty file names the file.
        let Some(i) = piece.parent.as_ref().and_then(|p| self.record_of(p)) else {
            return false;
        };
        if self.records[i].successor.is_none() && !self.restore(txn, files, i, outcome) {
            return false;
        }
        let Some((branch, _)) = self.records[i].successor.as_ref() else {
            return false;
        };
        let lost_in = Some(self.records[i].branch);
        let Some(text) = live_text(txn, branch) else {
            return false;
        };
        self.insert(txn, me, &text, 0, piece, lost_in);
        true
    }

    fn insert(
        &mut self,
        txn: &mut TransactionMut<'_>,
        me: ClientID,
        text: &TextRef,
        index: u32,
        piece: &Piece,
        lost_in: Option<ID>,
    ) {
        let clock = txn.state_vector().get(&me);
        text.insert(txn, index, &piece.text);
        self.carried.push_back(Carried {
            from: piece.id,
            len: piece.clocks(),
            to: ID::new(me, clock),
            lost_in: lost_in.unwrap_or(piece.id),
        });
        if self.carried.len() > MAX_CARRIED {
            self.carried.pop_front();
        }
    }

    /// The departed text the character `id` was in (through carried runs), if the room knows.
    fn departed_of(&self, id: &ID) -> Option<ID> {
        if let Some(c) = self.carried_at(id) {
            return Some(c.lost_in);
        }
        self.records
            .iter()
            .rev()
            .find(|r| r.layout.position(id).is_some())
            .map(|r| r.branch)
    }

    /// Brings a deleted file back under its path (or a free one next to it) with what it held.
    fn restore(
        &mut self,
        txn: &mut TransactionMut<'_>,
        files: &MapRef,
        i: usize,
        outcome: &mut Outcome,
    ) -> bool {
        let record = &self.records[i];
        let Some(content) = record.content.as_deref() else {
            return false;
        };
        let path = free_path(&record.path, |p| files.contains_key(txn, p));
        let text = files.insert(txn, path.as_str(), TextPrelim::new(content));
        let Some(branch) = branch_item(&text) else {
            return false;
        };
        let now = txn.snapshot();
        let Some((layout, _)) = Layout::of(txn, &now, &text) else {
            return false;
        };
        let record = &mut self.records[i];
        self.kept_bytes = self.kept_bytes.saturating_sub(record.bytes());
        record.content = None;
        record.successor = Some((branch, layout));
        self.kept_bytes += record.bytes();
        tracing::info!(path = %path, "an edit to a deleted file brought it back");
        outcome.restored.push(path);
        true
    }

    /// The characters a stale client deleted in departed files (or in text carried out of
    /// them), at most [`MAX_CARRIED_DELETIONS`]; each is carried to the character it became. An
    /// update that deletes a departed file's own entry knows of its departure (the departure
    /// itself, or a client's sync repeating it): its deletions in that file are the
    /// departure's, not the client's, and stay where they are.
    fn deletions_in_departed(&self, ds: &IdSet) -> Vec<ID> {
        let mut ids: Vec<ID> = Vec::new();
        let take = |client: ClientID, a: u32, b: u32, ids: &mut Vec<ID>| {
            let room = MAX_CARRIED_DELETIONS.saturating_sub(ids.len());
            ids.extend((a..b).take(room).map(|clock| ID::new(client, clock)));
        };
        'collect: for (client, ranges) in ds.iter() {
            for range in ranges.iter() {
                let (start, end) = (range.start, range.end);
                for r in self.records.iter().filter(|r| !ds.contains(&r.branch)) {
                    let Some(runs) = r.layout.by_client.get(client) else {
                        continue;
                    };
                    for run in runs.iter().map(|i| r.layout.runs[*i]) {
                        let (a, b) = (run.id.clock.max(start), (run.id.clock + run.len).min(end));
                        take(*client, a, b, &mut ids);
                    }
                }
                for c in self
                    .carried
                    .iter()
                    .filter(|c| c.from.client == *client && !ds.contains(&c.lost_in))
                {
                    let (a, b) = (c.from.clock.max(start), (c.from.clock + c.len).min(end));
                    take(*client, a, b, &mut ids);
                }
                if ids.len() >= MAX_CARRIED_DELETIONS {
                    break 'collect;
                }
            }
        }
        ids
    }
}

/// Deletes the character `id` if it is still there, in a file that is.
fn delete_char(txn: &mut TransactionMut<'_>, id: ID) {
    let offset = |assoc| StickyIndex::new(IndexScope::Relative(id), assoc).get_offset(txn);
    let (Some(start), Some(end)) = (offset(Assoc::After), offset(Assoc::Before)) else {
        return;
    };
    if end.index > start.index && is_live_text(&start.branch) {
        TextRef::from(start.branch).remove_range(txn, start.index, end.index - start.index);
    }
}

fn is_live_text(branch: &yrs::branch::BranchPtr) -> bool {
    !branch.is_deleted() && matches!(branch.type_ref(), TypeRef::Text)
}

/// The text whose item is `branch`, if it is still in the document.
fn live_text(txn: &TransactionMut<'_>, branch: &ID) -> Option<TextRef> {
    let ptr = yrs::branch::BranchID::get_nested(txn, branch)?;
    is_live_text(&ptr).then(|| TextRef::from(ptr))
}

/// `pieces` less the text of files the same update created: such a file's text is dropped at
/// once only when another text took its path at the same moment (two people creating one file:
/// Yjs keeps one, the same on every replica). That is the document's rule for one path, not
/// text typed into a file that has gone, and it is not carried.
fn without_new_files(pieces: Vec<Piece>, inserted: &IdSet) -> Vec<Piece> {
    let mut new_file: Vec<bool> = pieces
        .iter()
        .map(|p| p.parent.is_some_and(|b| inserted.contains(&b)))
        .collect();
    // Text typed after such text is in the same file (a few passes settle any order).
    for _ in 0..MAX_PASSES {
        let mut runs: HashMap<ClientID, Vec<(u32, u32)>> = HashMap::new();
        for (p, _) in pieces.iter().zip(&new_file).filter(|(_, n)| **n) {
            runs.entry(p.id.client)
                .or_default()
                .push((p.id.clock, p.clocks()));
        }
        for r in runs.values_mut() {
            r.sort_unstable();
        }
        let in_new = |anchor: Option<ID>| {
            anchor.is_some_and(|a| {
                runs.get(&a.client).is_some_and(|r| {
                    let i = r.partition_point(|(start, _)| *start <= a.clock);
                    i > 0 && a.clock < r[i - 1].0.saturating_add(r[i - 1].1)
                })
            })
        };
        let mut changed = false;
        for i in 0..pieces.len() {
            if !new_file[i] && (in_new(pieces[i].origin) || in_new(pieces[i].right)) {
                new_file[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    pieces
        .into_iter()
        .zip(new_file)
        .filter(|(_, n)| !n)
        .map(|(p, _)| p)
        .collect()
}

fn within(start: ID, len: u32, id: &ID) -> bool {
    start.client == id.client && (start.clock..start.clock.saturating_add(len)).contains(&id.clock)
}

fn overlaps(set: &IdSet, id: ID, len: u32) -> bool {
    set.get(&id.client).is_some_and(|ranges| {
        ranges
            .iter()
            .any(|(r, _)| r.start < id.clock.saturating_add(len) && id.clock < r.end)
    })
}

/// `path`, or the same name with " (2)", " (3)"… before its extension, whichever is not
/// `taken` (a file brought back beside one that took its path, here and from the trash).
pub(crate) fn free_path(path: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(path) {
        return path.to_string();
    }
    let (dir, name) = match path.rfind('/') {
        Some(i) => (&path[..=i], &path[i + 1..]),
        None => ("", path),
    };
    let (stem, ext) = match name.rfind('.') {
        Some(i) if i > 0 => (&name[..i], &name[i..]),
        _ => (name, ""),
    };
    (2..)
        .map(|n| format!("{dir}{stem} ({n}){ext}"))
        .find(|p| !taken(p))
        .unwrap_or_else(|| path.to_string())
}

#[cfg(test)]
mod free_path_tests {
    use super::free_path;

    #[test]
    fn a_taken_path_gets_a_number() {
        let taken = ["a.txt", "src/b.rs", "src/b (2).rs", "Makefile"];
        let is_taken = |p: &str| taken.contains(&p);
        assert_eq!(free_path("c.txt", is_taken), "c.txt");
        assert_eq!(free_path("a.txt", is_taken), "a (2).txt");
        assert_eq!(free_path("src/b.rs", is_taken), "src/b (3).rs");
        assert_eq!(free_path("Makefile", is_taken), "Makefile (2)");
        assert_eq!(free_path(".env", |p| p == ".env"), ".env (2)");
    }
}

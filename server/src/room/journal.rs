//! The room's file operations as they happen in its document: a file created, renamed or
//! moved, deleted (issue 41). The room reads them off each update a participant sends and
//! hands them, with who sent it, to whoever journals them (the application layer audits each
//! and keeps deleted files in the room's trash). Reading them costs nothing for an update that
//! touches no path: the `files` map's observer fires only when a path is added or removed.
//!
//! Bounded everywhere, because any editor can send file operations as fast as it likes: a
//! room journals at most [`BURST`] operations at once and [`PER_SECOND`] a second after that;
//! the rest, and whatever finds the queue full, are counted and recorded as one summary entry
//! per actor. The queue holds at most [`QUEUE`] updates and [`MAX_QUEUED_BYTES`] of deleted
//! text; a deleted file's text that does not fit (or is larger than [`MAX_KEPT_BYTES`]) is not
//! kept, and its entry says so. One queue keeps the room's order: nothing is sent around it.

use crate::ids::RoomId;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use yrs::types::EntryChange;
use yrs::{Doc, Observable};

/// Updates waiting to be journaled, across rooms.
pub(crate) const QUEUE: usize = 1024;
/// Deleted text waiting in the queue, across rooms.
pub(crate) const MAX_QUEUED_BYTES: usize = 64 << 20;
/// The largest deleted file whose text is kept in the trash.
pub(crate) const MAX_KEPT_BYTES: usize = 1 << 20;
/// Operations a room journals one by one at once, and a second after that.
pub(crate) const BURST: f64 = 200.0;
pub(crate) const PER_SECOND: f64 = 20.0;
/// Paths one batch of transactions may report; beyond them, they are counted.
const MAX_KEYS: usize = 10_000;

/// One file operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileOp {
    Created {
        path: String,
    },
    /// Renamed (same folder) or moved.
    Moved {
        from: String,
        to: String,
    },
    /// Deleted. `content`: what it held, when it is kept (`None`: too large to keep, or no
    /// room in the queue); `bytes`: its size either way. `came_back`: someone's typing its
    /// author had not seen brought it back at once (a copy is kept all the same).
    Deleted {
        path: String,
        content: Option<String>,
        bytes: usize,
        came_back: bool,
    },
}

/// The file operations of one update, or the count of those not journaled one by one.
#[derive(Debug, Clone)]
pub(crate) struct FileChanges {
    pub room: RoomId,
    /// The user (or agent) whose update it was.
    pub actor: String,
    pub at: i64,
    pub ops: Vec<FileOp>,
    /// Operations of this actor's not journaled one by one since the last summary.
    pub unrecorded: u64,
}

impl FileChanges {
    /// Deleted text it carries.
    pub(crate) fn bytes(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                FileOp::Deleted {
                    content: Some(c), ..
                } => c.len(),
                _ => 0,
            })
            .sum()
    }
}

/// Where file operations go: a bounded queue, bounded in deleted text too.
#[derive(Clone)]
pub(crate) struct Journal {
    tx: mpsc::Sender<FileChanges>,
    queued_bytes: Arc<AtomicUsize>,
}

impl Journal {
    pub(crate) fn new() -> (Journal, mpsc::Receiver<FileChanges>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (
            Journal {
                tx,
                queued_bytes: Arc::default(),
            },
            rx,
        )
    }

    /// Queues `changes`, keeping deleted text only while the queue has room for it. `Err`:
    /// the queue is full (or gone); nothing was queued.
    pub(crate) fn offer(&self, mut changes: FileChanges) -> Result<(), FileChanges> {
        let mut room = MAX_QUEUED_BYTES.saturating_sub(self.queued_bytes.load(Ordering::Acquire));
        for op in &mut changes.ops {
            if let FileOp::Deleted { content, .. } = op {
                match content {
                    Some(c) if c.len() <= room => room -= c.len(),
                    _ => *content = None,
                }
            }
        }
        let bytes = changes.bytes();
        self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.tx.try_send(changes).map_err(|e| {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            match e {
                mpsc::error::TrySendError::Full(c) | mpsc::error::TrySendError::Closed(c) => c,
            }
        })
    }

    /// `changes` left the queue (the journal took them).
    pub(crate) fn taken(&self, changes: &FileChanges) {
        self.queued_bytes
            .fetch_sub(changes.bytes(), Ordering::AcqRel);
    }
}

/// A room's allowance of operations journaled one by one (a token bucket).
pub(crate) struct Budget {
    tokens: f64,
    at: std::time::Instant,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            tokens: BURST,
            at: std::time::Instant::now(),
        }
    }
}

impl Budget {
    /// How many of `wanted` operations may be journaled one by one now.
    pub(crate) fn take(&mut self, wanted: usize, now: std::time::Instant) -> usize {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + secs * PER_SECOND).min(BURST);
        let granted = (wanted as f64).min(self.tokens.floor()).max(0.0);
        self.tokens -= granted;
        granted as usize
    }
}

/// What the observer saw since the last [`Keys::take`]: paths added, paths removed, and how
/// many more it did not keep.
#[derive(Default)]
pub(crate) struct Seen {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub overflow: u64,
}

impl Seen {
    pub(crate) fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.overflow == 0
    }
}

/// Paths added to and removed from the `files` map by the transactions since the last
/// [`Keys::take`] (at most [`MAX_KEYS`]; the rest counted).
#[derive(Clone, Default)]
pub(crate) struct Keys(Arc<Mutex<Seen>>);

impl Keys {
    /// Starts observing `doc`'s `files` map.
    pub(crate) fn observe(doc: &Doc) -> Keys {
        let keys = Keys::default();
        let sink = keys.clone();
        doc.get_or_insert_map("files")
            .observe("journal", move |txn, event| {
                let mut k = match sink.0.lock() {
                    Ok(k) => k,
                    Err(poisoned) => poisoned.into_inner(),
                };
                for (key, change) in event.keys(txn) {
                    let list = match change {
                        EntryChange::Inserted(_) => &mut k.added,
                        EntryChange::Removed(_) => &mut k.removed,
                        // The same path's text replaced: an edit of the file, not a file
                        // operation.
                        EntryChange::Updated(_, _) => continue,
                    };
                    if list.len() < MAX_KEYS {
                        list.push(key.to_string());
                    } else {
                        k.overflow += 1;
                    }
                }
            });
        keys
    }

    /// What was seen since the last call.
    pub(crate) fn take(&self) -> Seen {
        let mut k = match self.0.lock() {
            Ok(k) => k,
            Err(poisoned) => poisoned.into_inner(),
        };
        std::mem::take(&mut *k)
    }
}

/// What one update did to paths: `seen` as the map saw it, `moved` and `deleted` as the room's
/// departures paired them (a removed path with what it became, or with its content and
/// whether it came back), `restored` the paths the room brought back itself. Deletions come
/// first (they matter most if the list is cut), then moves, then creations.
pub(crate) fn ops_of(
    seen: &Seen,
    moved: Vec<(String, String)>,
    deleted: Vec<(String, String, bool)>,
    restored: &[String],
) -> Vec<FileOp> {
    let became: HashSet<&str> = moved.iter().map(|(_, to)| to.as_str()).collect();
    let paired: HashSet<&str> = moved
        .iter()
        .map(|(from, _)| from.as_str())
        .chain(deleted.iter().map(|(path, _, _)| path.as_str()))
        .collect();
    let restored: HashSet<&str> = restored.iter().map(String::as_str).collect();
    let added: HashSet<&str> = seen.added.iter().map(String::as_str).collect();
    let mut ops: Vec<FileOp> = deleted
        .iter()
        .map(|(path, content, came_back)| FileOp::Deleted {
            path: path.clone(),
            bytes: content.len(),
            content: (content.len() <= MAX_KEPT_BYTES).then(|| content.clone()),
            came_back: *came_back,
        })
        .collect();
    // Removed without a departure record (not a text, or one the room could not read): still
    // a deletion, with nothing to keep.
    ops.extend(
        seen.removed
            .iter()
            .filter(|p| !paired.contains(p.as_str()) && !added.contains(p.as_str()))
            .map(|path| FileOp::Deleted {
                path: path.clone(),
                content: None,
                bytes: 0,
                came_back: false,
            }),
    );
    ops.extend(
        moved
            .iter()
            .filter(|(from, to)| from != to)
            .map(|(from, to)| FileOp::Moved {
                from: from.clone(),
                to: to.clone(),
            }),
    );
    ops.extend(
        seen.added
            .iter()
            .filter(|p| !became.contains(p.as_str()) && !restored.contains(p.as_str()))
            .map(|path| FileOp::Created { path: path.clone() }),
    );
    ops
}

/// Operations not journaled one by one, per actor, until they are recorded as a summary.
#[derive(Default)]
pub(crate) struct Unrecorded(HashMap<String, u64>);

impl Unrecorded {
    pub(crate) fn add(&mut self, actor: &str, n: u64) {
        if n > 0 {
            *self.0.entry(actor.to_owned()).or_default() += n;
        }
    }

    /// The count kept for `actor`, taken.
    pub(crate) fn take(&mut self, actor: &str) -> u64 {
        self.0.remove(actor).unwrap_or(0)
    }

    pub(crate) fn actors(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn an_update_s_paths_become_operations_deletions_first() {
        // A rename, a folder move of one file, a creation, a deletion, a restore by the room.
        let seen = Seen {
            added: s(&["b.txt", "lib/x.txt", "new.txt", "gone.txt"]),
            removed: s(&["a.txt", "src/x.txt", "old.txt"]),
            overflow: 0,
        };
        let ops = ops_of(
            &seen,
            vec![
                ("a.txt".into(), "b.txt".into()),
                ("src/x.txt".into(), "lib/x.txt".into()),
            ],
            vec![("old.txt".into(), "was".into(), false)],
            &s(&["gone.txt"]),
        );
        assert_eq!(
            ops,
            vec![
                FileOp::Deleted {
                    path: "old.txt".into(),
                    content: Some("was".into()),
                    bytes: 3,
                    came_back: false
                },
                FileOp::Moved {
                    from: "a.txt".into(),
                    to: "b.txt".into()
                },
                FileOp::Moved {
                    from: "src/x.txt".into(),
                    to: "lib/x.txt".into()
                },
                FileOp::Created {
                    path: "new.txt".into()
                },
            ]
        );
        // A path removed with no record of it is still a deletion; a huge file's text is
        // not kept.
        let seen = Seen {
            added: s(&["c.txt"]),
            removed: s(&["d.txt"]),
            overflow: 0,
        };
        let big = "x".repeat(MAX_KEPT_BYTES + 1);
        let ops = ops_of(&seen, vec![], vec![("e.txt".into(), big, false)], &[]);
        assert_eq!(
            ops,
            vec![
                FileOp::Deleted {
                    path: "e.txt".into(),
                    content: None,
                    bytes: MAX_KEPT_BYTES + 1,
                    came_back: false
                },
                FileOp::Deleted {
                    path: "d.txt".into(),
                    content: None,
                    bytes: 0,
                    came_back: false
                },
                FileOp::Created {
                    path: "c.txt".into()
                },
            ]
        );
    }

    #[test]
    fn the_budget_allows_a_burst_then_a_rate() {
        let t0 = std::time::Instant::now();
        let mut b = Budget {
            tokens: BURST,
            at: t0,
        };
        assert_eq!(b.take(150, t0), 150);
        assert_eq!(b.take(100, t0), 50);
        assert_eq!(b.take(10, t0), 0);
        let later = t0 + std::time::Duration::from_millis(500);
        assert_eq!(b.take(100, later), 10);
        let much_later = later + std::time::Duration::from_secs(3600);
        assert_eq!(b.take(1000, much_later), BURST as usize);
    }

    #[test]
    fn the_queue_keeps_deleted_text_only_while_it_has_room() {
        let (j, mut rx) = Journal::new();
        let del = |n: usize| FileOp::Deleted {
            path: "f".into(),
            content: Some("x".repeat(n)),
            bytes: n,
            came_back: false,
        };
        let changes = |ops| FileChanges {
            room: RoomId::fresh(),
            actor: "u".into(),
            at: 0,
            ops,
            unrecorded: 0,
        };
        for _ in 0..(MAX_QUEUED_BYTES / MAX_KEPT_BYTES) {
            j.offer(changes(vec![del(MAX_KEPT_BYTES)])).unwrap();
        }
        // Full of text: the next deletion is queued without its text.
        j.offer(changes(vec![del(10)])).unwrap();
        let mut last = None;
        while let Ok(c) = rx.try_recv() {
            j.taken(&c);
            last = Some(c);
        }
        assert!(matches!(
            &last.unwrap().ops[0],
            FileOp::Deleted {
                content: None,
                bytes: 10,
                ..
            }
        ));
        assert_eq!(j.queued_bytes.load(Ordering::Acquire), 0);
        // Taken out, there is room again.
        j.offer(changes(vec![del(10)])).unwrap();
        assert!(matches!(
            &rx.try_recv().unwrap().ops[0],
            FileOp::Deleted {
                content: Some(_),
                ..
            }
        ));
    }
}

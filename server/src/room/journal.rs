//! The room's file operations as they happen in its document: a file created, renamed or
//! moved, deleted (issue 41). The room reads them off each update a participant sends and
//! hands them, with who sent it, to whoever journals them (the application layer audits each
//! and keeps deleted files in the room's trash). Reading them costs nothing for an update that
//! touches no path: the `files` map's observer fires only when a path is added or removed.

use crate::ids::RoomId;
use std::sync::{Arc, Mutex};
use yrs::types::EntryChange;
use yrs::{Doc, Observable};

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
    /// Deleted, with what it held. `came_back`: someone's typing its author had not seen
    /// brought it back at once (nothing goes to the trash).
    Deleted {
        path: String,
        content: String,
        came_back: bool,
    },
}

/// The file operations of one update.
#[derive(Debug, Clone)]
pub(crate) struct FileChanges {
    pub room: RoomId,
    /// The user (or agent) whose update it was.
    pub actor: String,
    pub at: i64,
    pub ops: Vec<FileOp>,
}

/// Where file operations go. Bounded: see [`send`].
pub(crate) type Journal = tokio::sync::mpsc::Sender<FileChanges>;

/// Operations one update may journal one by one; beyond them, the rest are dropped from the
/// journal with a count (a generated tree deleted at once is one act).
pub(crate) const MAX_OPS_PER_UPDATE: usize = 200;

/// Paths added to and removed from the `files` map by the transactions since the last
/// [`Keys::take`].
#[derive(Clone, Default)]
pub(crate) struct Keys(Arc<Mutex<(Vec<String>, Vec<String>)>>);

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
                    match change {
                        EntryChange::Inserted(_) => k.0.push(key.to_string()),
                        EntryChange::Removed(_) => k.1.push(key.to_string()),
                        // The same path's text replaced: an edit of the file, not a file operation.
                        EntryChange::Updated(_, _) => {}
                    }
                }
            });
        keys
    }

    /// The paths added and removed since the last call.
    pub(crate) fn take(&self) -> (Vec<String>, Vec<String>) {
        let mut k = match self.0.lock() {
            Ok(k) => k,
            Err(poisoned) => poisoned.into_inner(),
        };
        std::mem::take(&mut *k)
    }
}

/// What one update did to paths: `added` and `removed` as the map saw them, `moved` and
/// `deleted` as the room's departures paired them (a removed path with what it became, or
/// with its content), `restored` the paths the room brought back itself.
pub(crate) fn ops_of(
    (added, removed): (Vec<String>, Vec<String>),
    moved: Vec<(String, String)>,
    deleted: Vec<(String, String, bool)>,
    restored: &[String],
) -> Vec<FileOp> {
    let became: Vec<String> = moved.iter().map(|(_, to)| to.clone()).collect();
    let paired: Vec<String> = moved
        .iter()
        .map(|(from, _)| from.clone())
        .chain(deleted.iter().map(|(path, _, _)| path.clone()))
        .collect();
    let mut ops: Vec<FileOp> = added
        .iter()
        .filter(|p| !became.contains(p) && !restored.contains(p))
        .map(|path| FileOp::Created { path: path.clone() })
        .collect();
    ops.extend(
        moved
            .into_iter()
            .filter(|(from, to)| from != to)
            .map(|(from, to)| FileOp::Moved { from, to }),
    );
    ops.extend(
        deleted
            .into_iter()
            .map(|(path, content, came_back)| FileOp::Deleted {
                path,
                content,
                came_back,
            }),
    );
    // Removed without a departure record (a text the room could not read): still a deletion.
    ops.extend(
        removed
            .into_iter()
            .filter(|p| !paired.contains(p) && !added.contains(p))
            .map(|path| FileOp::Deleted {
                path,
                content: String::new(),
                came_back: false,
            }),
    );
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn an_update_s_paths_become_operations() {
        // A rename, a folder move of one file, a creation, a deletion, a restore by the room.
        let ops = ops_of(
            (
                s(&["b.txt", "lib/x.txt", "new.txt", "gone.txt"]),
                s(&["a.txt", "src/x.txt", "old.txt"]),
            ),
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
                FileOp::Created {
                    path: "new.txt".into()
                },
                FileOp::Moved {
                    from: "a.txt".into(),
                    to: "b.txt".into()
                },
                FileOp::Moved {
                    from: "src/x.txt".into(),
                    to: "lib/x.txt".into()
                },
                FileOp::Deleted {
                    path: "old.txt".into(),
                    content: "was".into(),
                    came_back: false
                },
            ]
        );
        // A path removed with no record of it is still a deletion.
        let ops = ops_of((s(&["c.txt"]), s(&["d.txt"])), vec![], vec![], &[]);
        assert_eq!(
            ops,
            vec![
                FileOp::Created {
                    path: "c.txt".into()
                },
                FileOp::Deleted {
                    path: "d.txt".into(),
                    content: String::new(),
                    came_back: false
                }
            ]
        );
    }
}

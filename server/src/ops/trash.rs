//! File operations in the room's document, journaled (issue 41): every file created, renamed,
//! moved or deleted through the document (a browser, a stock Yjs client, an agent's MCP
//! `write_file`) is one audit entry in the room's chain, by whoever's update did it; a deleted
//! file is kept in the room's trash (its newest 100) with who deleted it, and can be restored
//! (`edit`) under its path, or beside a file that took the path meanwhile.
//!
//! The room reads the operations off the updates it applies ([`crate::room::journal`]) and
//! hands them here; what they mean for the chain and the trash is decided here, as for every
//! other act.

use crate::ids::{IssuedId, RoomId};
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops};
use crate::room::journal::{FileChanges, FileOp};
use crate::store::{Change, TrashRow};
use coderoom_authz::{Action, Capability};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// File operations waiting to be journaled, across rooms.
pub(crate) const JOURNAL_QUEUE: usize = 1024;

/// At shutdown, the journal keeps taking what rooms flush until it has been idle this long.
const DRAIN_IDLE: Duration = Duration::from_millis(500);

/// A deleted file as `GET /api/rooms/{id}/trash` lists it (without its text).
#[derive(Debug, Serialize)]
pub(crate) struct Trashed {
    pub id: String,
    pub path: String,
    pub bytes: usize,
    pub deleted_by: String,
    /// Who deleted it, in words: an account's email, or an agent's name.
    pub deleted_by_name: String,
    pub deleted_at: i64,
}

/// `POST /api/rooms/{id}/trash/{tid}/restore`: where the file is now.
#[derive(Debug, Serialize)]
pub(crate) struct Restored {
    pub path: String,
}

/// Starts journaling what the rooms report, until shutdown (and what they flush then).
pub(crate) fn start_journal(
    ops: Ops,
    mut rx: mpsc::Receiver<FileChanges>,
    tracker: &tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
) {
    tracker.spawn(async move {
        loop {
            let changes = tokio::select! {
                c = rx.recv() => c,
                () = shutdown.cancelled() => break,
            };
            let Some(changes) = changes else { return };
            ops.journal(changes).await;
        }
        while let Ok(Some(changes)) = tokio::time::timeout(DRAIN_IDLE, rx.recv()).await {
            ops.journal(changes).await;
        }
    });
}

fn folder(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// `path` made free of `taken`: itself, or `name (2).ext`, `name (3).ext`, ...
fn free_path(path: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(path) {
        return path.to_owned();
    }
    let (dir, name) = match path.rsplit_once('/') {
        Some((d, n)) => (format!("{d}/"), n),
        None => (String::new(), path),
    };
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s, format!(".{e}")),
        _ => (name, String::new()),
    };
    (2..)
        .map(|n| format!("{dir}{stem} ({n}){ext}"))
        .find(|p| !taken(p))
        .unwrap_or_default()
}

impl Ops {
    /// Records one update's file operations in its room's chain, keeping deleted files.
    async fn journal(&self, changes: FileChanges) {
        let FileChanges {
            room,
            actor,
            at,
            ops,
        } = changes;
        for op in ops {
            let (act, details, change) = match op {
                FileOp::Created { path } => {
                    (Act::CreateFile, json!({ "path": path }), Change::None)
                }
                FileOp::Moved { from, to } => {
                    let act = if folder(&from) == folder(&to) {
                        Act::RenameFile
                    } else {
                        Act::MoveFile
                    };
                    (act, json!({ "path": from, "to": to }), Change::None)
                }
                FileOp::Deleted {
                    path,
                    content,
                    came_back,
                } => {
                    // Kept even when it came back at once: a copy as it was deleted, and the
                    // trash is where anyone learns who deleted it.
                    let id = IssuedId::fresh().to_string();
                    let mut details =
                        json!({ "path": path, "bytes": content.len(), "trash_id": id });
                    if came_back {
                        details["came_back"] = json!(true);
                    }
                    let row = TrashRow {
                        id,
                        room_id: room.clone(),
                        path,
                        content,
                        deleted_by: actor.clone(),
                        deleted_at: at,
                    };
                    (Act::DeleteFile, details, Change::Trash(row))
                }
            };
            let entry = Entry::act(act, Verdict::Allow, details);
            match self.record(&room, &actor, entry, change).await {
                Ok(_) => {}
                // The room was deleted meanwhile: nothing of it is kept.
                Err(OpError::Store(e)) if self.store.room(&room).await.ok().flatten().is_none() => {
                    tracing::debug!(room = %room, error = %e, "file operation of a deleted room not journaled");
                }
                Err(e) => {
                    tracing::error!(room = %room, error = %e, "cannot journal a file operation")
                }
            }
        }
    }

    /// The room's deleted files, newest first (`observe`).
    pub(crate) async fn trash(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<Vec<Trashed>, OpError> {
        self.capabilities(room_id, actor).await?;
        let agents: std::collections::HashMap<String, String> = self
            .store
            .agents(room_id)
            .await?
            .into_iter()
            .map(|a| (a.agent_id.to_string(), a.name))
            .collect();
        let mut names: std::collections::HashMap<String, String> = Default::default();
        let mut out = Vec::new();
        for row in self.store.trash(room_id).await? {
            let name = match names.get(&row.deleted_by) {
                Some(n) => n.clone(),
                None => {
                    let n = match agents.get(&row.deleted_by) {
                        Some(agent) => agent.clone(),
                        None => self
                            .store
                            .user_email(&row.deleted_by)
                            .await?
                            .unwrap_or_else(|| "someone no longer here".into()),
                    };
                    names.insert(row.deleted_by.clone(), n.clone());
                    n
                }
            };
            out.push(Trashed {
                id: row.id,
                path: row.path,
                bytes: row.content.len(),
                deleted_by: row.deleted_by,
                deleted_by_name: name,
                deleted_at: row.deleted_at,
            });
        }
        Ok(out)
    }

    /// Puts deleted file `id` back into the room's document (`edit`): under its path, or
    /// `name (2).ext` when a file took the path meanwhile. One audit entry; the file leaves
    /// the trash.
    pub(crate) async fn restore_trashed(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        id: &str,
    ) -> Result<Restored, OpError> {
        let row = {
            let locked = self.audit.lock().await;
            let Some(row) = self.store.trashed(room_id, id).await? else {
                // Decided first, so an outsider learns nothing from a missing id.
                self.authorize_locked(
                    &locked,
                    room_id,
                    actor,
                    Action::Use(Capability::Edit),
                    json!({ "trash_id": id }),
                )
                .await?;
                return Err(OpError::NotFound);
            };
            self.authorize_locked(
                &locked,
                room_id,
                actor,
                Action::Use(Capability::Edit),
                json!({ "trash_id": id, "path": row.path }),
            )
            .await?;
            row
        };
        let mut visit = crate::room::visit::Visit::start_unjournaled(
            &self.rooms,
            &self.limits,
            room_id,
            (actor.id.as_str(), &actor.email),
        )
        .await
        .map_err(|e| OpError::Sandbox(e.into()))?;
        let paths = crate::room::visit::texts_of(&visit.doc);
        let path = free_path(&row.path, |p| paths.contains_key(p));
        // Out of the trash first, under the lock with its entry: two restores at once put the
        // file back once.
        let entry = Entry::act(
            Act::RestoreFile,
            Verdict::Allow,
            json!({ "path": path, "trash_id": id, "deleted_path": row.path }),
        );
        let untrash = Change::Untrash {
            room_id: room_id.clone(),
            id: id.to_owned(),
        };
        match self.record(room_id, &actor.id, entry, untrash).await {
            Ok(_) => {}
            Err(OpError::Store(crate::store::StoreError::Conflict)) => {
                visit.leave().await;
                return Err(OpError::Conflict("that file was restored already".into()));
            }
            Err(e) => {
                visit.leave().await;
                return Err(e);
            }
        }
        let written = visit.write_file(&path, &row.content).await;
        visit.leave().await;
        if let Err(e) = written {
            // Back into the trash: nothing is lost to a failed restore.
            tracing::warn!(room = %room_id, error = %e, "restoring a deleted file failed");
            let entry = Entry::act(
                Act::RestoreFile,
                Verdict::Deny,
                json!({ "path": path, "trash_id": id }),
            )
            .because(e.to_string());
            self.record(room_id, &actor.id, entry, Change::Trash(row))
                .await?;
            return Err(OpError::Sandbox(e.into()));
        }
        Ok(Restored { path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

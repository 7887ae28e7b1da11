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
use crate::room::journal::{FileChanges, FileOp, Journal};
use crate::store::{Change, TrashRow};
use coderoom_authz::{Action, Capability};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// At shutdown, the journal keeps taking what rooms flush until it has been idle this long.
const DRAIN_IDLE: Duration = Duration::from_millis(500);

/// A deleted file as `GET /api/rooms/{id}/trash` lists it (without its text).
#[derive(Debug, Serialize)]
pub(crate) struct Trashed {
    pub id: String,
    pub path: String,
    pub bytes: i64,
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
/// The rooms hold the queue's sender for the server's life, so at shutdown the journal takes
/// what they flush until the queue has been idle for [`DRAIN_IDLE`].
pub(crate) fn start_journal(
    ops: Ops,
    (journal, mut rx): (Journal, mpsc::Receiver<FileChanges>),
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
            journal.taken(&changes);
            ops.journal(changes).await;
        }
        while let Ok(Some(changes)) = tokio::time::timeout(DRAIN_IDLE, rx.recv()).await {
            journal.taken(&changes);
            ops.journal(changes).await;
        }
    });
}

fn folder(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

impl Ops {
    /// Records one update's file operations in its room's chain, keeping deleted files (and
    /// a summary of those its room did not journal one by one).
    async fn journal(&self, changes: FileChanges) {
        let FileChanges {
            room,
            actor,
            at,
            ops,
            unrecorded,
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
                    bytes,
                    came_back,
                } => {
                    let mut details = json!({ "path": path, "bytes": bytes });
                    if came_back {
                        details["came_back"] = json!(true);
                    }
                    match content {
                        // Kept even when it came back at once: a copy as it was deleted, and
                        // the trash is where anyone learns who deleted it.
                        Some(content) => {
                            let id = IssuedId::fresh().to_string();
                            details["trash_id"] = json!(id);
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
                        None => {
                            details["not_kept"] = json!(true);
                            (Act::DeleteFile, details, Change::None)
                        }
                    }
                }
            };
            let entry = Entry::act(act, Verdict::Allow, details);
            self.journal_entry(&room, &actor, entry, change).await;
        }
        if unrecorded > 0 {
            let entry = Entry::act(
                Act::FileOpsUnrecorded,
                Verdict::Allow,
                json!({ "count": unrecorded }),
            );
            self.journal_entry(&room, &actor, entry, Change::None).await;
        }
    }

    /// Records one journal entry; a deleted file the trash cannot take is still recorded.
    async fn journal_entry(&self, room: &RoomId, actor: &str, entry: Entry, change: Change) {
        // Only a deletion the trash might refuse is recorded again, without it.
        let retry = matches!(change, Change::Trash(_)).then(|| entry.clone());
        match self.record(room, actor, entry, change).await {
            Ok(_) => {}
            Err(e) if self.store.room(room).await.ok().flatten().is_none() => {
                // The room was deleted meanwhile: nothing of it is kept.
                tracing::debug!(room = %room, error = %e, "file operation of a deleted room not journaled");
            }
            Err(e) if retry.is_some() => {
                tracing::warn!(room = %room, error = %e, "the trash could not keep a deleted file; recording the deletion alone");
                let Some(mut entry) = retry else { return };
                entry.details["not_kept"] = json!(true);
                if let Some(d) = entry.details.as_object_mut() {
                    d.remove("trash_id");
                }
                if let Err(e) = self.record(room, actor, entry, Change::None).await {
                    tracing::error!(room = %room, error = %e, "cannot journal a file operation");
                }
            }
            Err(e) => tracing::error!(room = %room, error = %e, "cannot journal a file operation"),
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
                bytes: row.bytes,
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
            let row = self.store.trashed(room_id, id).await?;
            // Decided before a missing id is told, so an outsider learns nothing from it.
            let mut details = json!({ "trash_id": id });
            if let Some(r) = &row {
                details["path"] = json!(r.path);
            }
            self.authorize_locked(
                &locked,
                room_id,
                actor,
                Action::Use(Capability::Edit),
                details,
            )
            .await?;
            row.ok_or(OpError::NotFound)?
        };
        // Its own task: a caller that goes away mid-restore does not cut it short.
        let ops = self.clone();
        let (room, who) = (room_id.clone(), (actor.id.to_string(), actor.email.clone()));
        tokio::spawn(async move { ops.put_back(&room, (&who.0, &who.1), row).await })
            .await
            .map_err(|_| OpError::Internal)?
    }

    /// Writes deleted file `row` into the room's document, then takes it out of the trash
    /// with its entry: a restore that fails part way leaves it in the trash.
    async fn put_back(
        &self,
        room_id: &RoomId,
        (actor, email): (&str, &str),
        row: TrashRow,
    ) -> Result<Restored, OpError> {
        let mut visit = crate::room::visit::Visit::start_unjournaled(
            &self.rooms,
            &self.limits,
            room_id,
            (actor, email),
        )
        .await
        .map_err(|e| OpError::Sandbox(e.into()))?;
        let paths = crate::room::visit::texts_of(&visit.doc);
        let path = crate::room::departed::free_path(&row.path, |p| paths.contains_key(p));
        let written = visit.write_file(&path, &row.content).await;
        visit.leave().await;
        if let Err(e) = written {
            tracing::warn!(room = %room_id, error = %e, "restoring a deleted file failed; it stays in the trash");
            return Err(OpError::Sandbox(e.into()));
        }
        let details = json!({ "path": path, "trash_id": row.id, "deleted_path": row.path });
        let entry = Entry::act(Act::RestoreFile, Verdict::Allow, details);
        let untrash = Change::Untrash {
            room_id: room_id.clone(),
            id: row.id.clone(),
        };
        match self.record(room_id, actor, entry.clone(), untrash).await {
            Ok(_) => {}
            // Restored at the same moment by someone else too: both copies are in the
            // document, and this one is recorded as well.
            Err(OpError::Store(crate::store::StoreError::Conflict)) => {
                let mut entry = entry;
                entry.details["again"] = json!(true);
                self.record(room_id, actor, entry, Change::None).await?;
            }
            Err(e) => return Err(e),
        }
        Ok(Restored { path })
    }
}

//! Rooms' named checkpoints (their files live under `DATA_DIR/rooms/<room>/checkpoints/`).

use super::*;
use crate::ids::RoomId;

/// A checkpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct CheckpointRow {
    pub id: String,
    pub name: String,
    /// The user who made it.
    pub author: String,
    /// When it was made (Unix ms).
    pub at: i64,
    /// Its files' size: the document and the workspace archive.
    pub bytes: i64,
    /// Made by the room's schedule, not by someone.
    pub scheduled: bool,
}

/// A room's checkpoint policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub(crate) struct CheckpointPolicy {
    /// A checkpoint this often (ms), if any.
    pub every_ms: Option<i64>,
    /// Checkpoints older than this (ms) are pruned, if set.
    pub keep_ms: Option<i64>,
    /// When the next scheduled one is due.
    pub due_at: Option<i64>,
    /// A restore needs an approval by someone else.
    pub restore_needs_approval: bool,
}

fn checkpoint_row(r: &sqlx::any::AnyRow) -> Result<CheckpointRow, StoreError> {
    Ok(CheckpointRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        author: r.try_get("author")?,
        at: r.try_get("at")?,
        bytes: r.try_get("bytes")?,
        scheduled: r.try_get::<i64, _>("scheduled")? != 0,
    })
}

impl Store {
    /// The room's checkpoints, oldest first.
    pub(crate) async fn checkpoints(
        &self,
        room_id: &RoomId,
    ) -> Result<Vec<CheckpointRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, name, author, at, bytes, scheduled FROM checkpoints WHERE room_id = $1 \
             ORDER BY at, id",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(checkpoint_row).collect()
    }

    pub(crate) async fn checkpoint(
        &self,
        room_id: &RoomId,
        id: &str,
    ) -> Result<Option<CheckpointRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, name, author, at, bytes, scheduled FROM checkpoints \
             WHERE room_id = $1 AND id = $2",
        )
        .bind(room_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(checkpoint_row).transpose()
    }

    pub(crate) async fn checkpoint_policy(
        &self,
        room_id: &RoomId,
    ) -> Result<CheckpointPolicy, StoreError> {
        let row = sqlx::query(
            "SELECT checkpoint_every_ms, checkpoint_keep_ms, checkpoint_due_at, \
             checkpoint_restore_approval FROM rooms WHERE id = $1",
        )
        .bind(room_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map_or(Ok(CheckpointPolicy::default()), |r| {
            Ok(CheckpointPolicy {
                every_ms: r.try_get("checkpoint_every_ms")?,
                keep_ms: r.try_get("checkpoint_keep_ms")?,
                due_at: r.try_get("checkpoint_due_at")?,
                restore_needs_approval: r.try_get::<i64, _>("checkpoint_restore_approval")? != 0,
            })
        })
    }

    /// Rooms whose scheduled checkpoint is due at `now`.
    pub(crate) async fn due_checkpoints(&self, now: i64) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT id FROM rooms WHERE checkpoint_every_ms IS NOT NULL AND checkpoint_due_at <= $1",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
    }

    /// When the room's next scheduled checkpoint is due. Not audited: the checkpoint is.
    pub(crate) async fn set_checkpoint_due(
        &self,
        room_id: &RoomId,
        at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE rooms SET checkpoint_due_at = $1 WHERE id = $2")
            .bind(at)
            .bind(room_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

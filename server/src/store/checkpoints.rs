//! Rooms' named checkpoints (their files live under `DATA_DIR/rooms/<room>/checkpoints/`).

use super::*;

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
}

fn checkpoint_row(r: &sqlx::any::AnyRow) -> Result<CheckpointRow, StoreError> {
    Ok(CheckpointRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        author: r.try_get("author")?,
        at: r.try_get("at")?,
        bytes: r.try_get("bytes")?,
    })
}

impl Store {
    /// The room's checkpoints, oldest first.
    pub(crate) async fn checkpoints(
        &self,
        room_id: &str,
    ) -> Result<Vec<CheckpointRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, name, author, at, bytes FROM checkpoints WHERE room_id = $1 ORDER BY at, id",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(checkpoint_row).collect()
    }

    pub(crate) async fn checkpoint(
        &self,
        room_id: &str,
        id: &str,
    ) -> Result<Option<CheckpointRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, name, author, at, bytes FROM checkpoints WHERE room_id = $1 AND id = $2",
        )
        .bind(room_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(checkpoint_row).transpose()
    }
}

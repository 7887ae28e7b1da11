//! Files deleted from rooms' documents, kept so they can be restored (issue 41): the newest
//! [`MAX_TRASH_PER_ROOM`] of each room.

use super::*;
use crate::ids::RoomId;

/// Deleted files a room keeps; the oldest go first.
pub(crate) const MAX_TRASH_PER_ROOM: i64 = 100;

/// A deleted file, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TrashRow {
    pub id: String,
    pub room_id: RoomId,
    pub path: String,
    pub content: String,
    pub deleted_by: String,
    pub deleted_at: i64,
}

/// A deleted file as listed: without its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TrashListed {
    pub id: String,
    pub path: String,
    pub bytes: i64,
    pub deleted_by: String,
    pub deleted_at: i64,
}

fn row_of(r: &sqlx::any::AnyRow) -> Result<TrashRow, StoreError> {
    let content: Vec<u8> = r.try_get("content")?;
    Ok(TrashRow {
        id: r.try_get("id")?,
        room_id: r.try_get("room_id")?,
        path: r.try_get("path")?,
        content: String::from_utf8(content).map_err(|_| StoreError::Corrupt)?,
        deleted_by: r.try_get("deleted_by")?,
        deleted_at: r.try_get("deleted_at")?,
    })
}

const COLUMNS: &str = "id, room_id, path, content, deleted_by, deleted_at";

impl Store {
    /// The room's deleted files, newest first, without their text.
    pub(crate) async fn trash(&self, room_id: &RoomId) -> Result<Vec<TrashListed>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, path, bytes, deleted_by, deleted_at FROM file_trash WHERE room_id = $1 \
             ORDER BY deleted_at DESC, id DESC",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(TrashListed {
                    id: r.try_get("id")?,
                    path: r.try_get("path")?,
                    bytes: r.try_get("bytes")?,
                    deleted_by: r.try_get("deleted_by")?,
                    deleted_at: r.try_get("deleted_at")?,
                })
            })
            .collect()
    }

    /// One of the room's deleted files.
    pub(crate) async fn trashed(
        &self,
        room_id: &RoomId,
        id: &str,
    ) -> Result<Option<TrashRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM file_trash WHERE room_id = $1 AND id = $2"
        ))
        .bind(room_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(row_of).transpose()
    }
}

/// Keeps `t`, and forgets the room's oldest beyond [`MAX_TRASH_PER_ROOM`].
pub(super) async fn insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    t: &TrashRow,
) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO file_trash ({COLUMNS}, bytes) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    ))
    .bind(&t.id)
    .bind(&t.room_id)
    // A path is text: a NUL in one (only a rogue client makes such a path) is shown as U+FFFD.
    .bind(t.path.replace('\0', "\u{FFFD}"))
    .bind(t.content.as_bytes().to_vec())
    .bind(&t.deleted_by)
    .bind(t.deleted_at)
    .bind(i64::try_from(t.content.len()).unwrap_or(i64::MAX))
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "DELETE FROM file_trash WHERE room_id = $1 AND id NOT IN (SELECT id FROM file_trash \
         WHERE room_id = $1 ORDER BY deleted_at DESC, id DESC LIMIT $2)",
    )
    .bind(&t.room_id)
    .bind(MAX_TRASH_PER_ROOM)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Forgets a deleted file (it was restored). `false` when it was not there (restored already).
pub(super) async fn remove(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    room_id: &RoomId,
    id: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query("DELETE FROM file_trash WHERE room_id = $1 AND id = $2")
        .bind(room_id)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() > 0)
}

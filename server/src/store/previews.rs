//! Rooms' previews (see `crate::http::previews`).

use super::*;
use crate::ids::RoomId;

stored_enum! {
    /// Where a preview stands, as stored.
    PreviewState {
        Active = "active",
        /// A public preview waiting for someone else's approval.
        PendingApproval = "pending_approval",
        Revoked = "revoked",
    }
}

/// A preview, as stored and shown (without its URL, which the edge makes).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct PreviewRow {
    pub id: String,
    #[serde(skip)]
    pub room_id: RoomId,
    pub port: i64,
    /// `room` or `public`.
    pub visibility: String,
    /// An active one past `expires_at` is expired.
    pub state: PreviewState,
    pub approval_id: Option<String>,
    pub ttl_ms: i64,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    /// Requests answered (those not yet written are added by the edge when it lists).
    pub hits: i64,
}

fn row_of(r: &sqlx::any::AnyRow) -> Result<PreviewRow, StoreError> {
    Ok(PreviewRow {
        id: r.try_get("id")?,
        room_id: r.try_get("room_id")?,
        port: r.try_get("port")?,
        visibility: r.try_get("visibility")?,
        state: r.try_get("state")?,
        approval_id: r.try_get("approval_id")?,
        ttl_ms: r.try_get("ttl_ms")?,
        created_by: r.try_get("created_by")?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        hits: r.try_get("hits")?,
    })
}

const COLUMNS: &str =
    "id, room_id, port, visibility, state, approval_id, ttl_ms, created_by, created_at, expires_at";
/// What is read: the inserted columns and the counter.
const READ: &str = "id, room_id, port, visibility, state, approval_id, ttl_ms, created_by, \
                    created_at, expires_at, hits";

impl Store {
    /// The room's previews, newest first.
    pub(crate) async fn previews(&self, room_id: &RoomId) -> Result<Vec<PreviewRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {READ} FROM previews WHERE room_id = $1 ORDER BY created_at DESC, id"
        ))
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_of).collect()
    }

    /// A preview by its id (whatever its room).
    pub(crate) async fn preview(&self, id: &str) -> Result<Option<PreviewRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {READ} FROM previews WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(row_of).transpose()
    }

    /// Adds requests answered to previews' counters (a preview gone meanwhile is skipped).
    pub(crate) async fn add_preview_hits(&self, hits: &[(String, i64)]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for (id, n) in hits {
            sqlx::query("UPDATE previews SET hits = hits + $1 WHERE id = $2")
                .bind(*n)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

pub(super) async fn insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    p: &PreviewRow,
) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO previews ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
    ))
    .bind(&p.id)
    .bind(&p.room_id)
    .bind(p.port)
    .bind(&p.visibility)
    .bind(p.state)
    .bind(p.approval_id.as_deref())
    .bind(p.ttl_ms)
    .bind(&p.created_by)
    .bind(p.created_at)
    .bind(p.expires_at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

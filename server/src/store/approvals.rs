//! Approvals bound to exact parameters.

use super::*;
use crate::ids::RoomId;

pub(super) fn approval_row(r: &sqlx::any::AnyRow) -> Result<Approval, StoreError> {
    let decided_by: Option<String> = r.try_get("decided_by")?;
    let approved: Option<i64> = r.try_get("approved")?;
    Ok(Approval {
        id: r.try_get("id")?,
        requester: r.try_get("requester")?,
        action: r.try_get("action")?,
        params: r.try_get("params")?,
        expires_at: r.try_get("expires_at")?,
        decided: decided_by.map(|by| (by, approved == Some(1))),
        used: r.try_get::<Option<i64>, _>("used_at")?.is_some(),
    })
}

impl Store {
    pub(crate) async fn approval(
        &self,
        room_id: &RoomId,
        id: &str,
    ) -> Result<Option<Approval>, StoreError> {
        let row = sqlx::query(
            "SELECT id, requester, action, params, expires_at, decided_by, approved, used_at \
             FROM approvals WHERE room_id = $1 AND id = $2",
        )
        .bind(room_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(approval_row).transpose()
    }

    pub(crate) async fn approvals(
        &self,
        room_id: &RoomId,
    ) -> Result<Vec<(Approval, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, requester, action, params, expires_at, decided_by, approved, used_at, created_at \
             FROM approvals WHERE room_id = $1 ORDER BY created_at, id",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((approval_row(r)?, r.try_get("created_at")?)))
            .collect()
    }
}

//! Rooms' spend: the running sums of their `metered` audit records, and their budgets (see
//! `crate::spend`).

use super::*;
use crate::ids::RoomId;

/// The room's rows: use per (who, meter, amount), and its budget (JSON; `None`: none).
pub(crate) type StoredSpend = (Vec<(String, String, i64)>, Option<String>);

impl Store {
    /// The room's use per (who, meter) and its budget (JSON), as written.
    pub(crate) async fn spend_of(&self, room_id: &RoomId) -> Result<StoredSpend, StoreError> {
        let rows = sqlx::query("SELECT who, meter, amount FROM spend WHERE room_id = $1")
            .bind(room_id)
            .fetch_all(&self.pool)
            .await?;
        let used = rows
            .iter()
            .map(|r| Ok((r.try_get("who")?, r.try_get("meter")?, r.try_get("amount")?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        let budget: Option<Option<String>> =
            sqlx::query_scalar("SELECT budget FROM rooms WHERE id = $1")
                .bind(room_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok((used, budget.flatten()))
    }
}

impl Store {
    /// Whether the room is moderated (agents type only while an approver is in it).
    pub(crate) async fn room_moderated(&self, room_id: &RoomId) -> Result<bool, StoreError> {
        let v: Option<i64> = sqlx::query_scalar("SELECT moderated FROM rooms WHERE id = $1")
            .bind(room_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(v.unwrap_or(0) != 0)
    }
}

/// Adds the charges of one `metered` record to the room's sums.
pub(super) async fn add(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    room_id: &RoomId,
    charges: &[(String, String, i64)],
) -> Result<(), StoreError> {
    for (who, meter, amount) in charges {
        sqlx::query(
            "INSERT INTO spend (room_id, who, meter, amount) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (room_id, who, meter) DO UPDATE SET amount = spend.amount + excluded.amount",
        )
        .bind(room_id)
        .bind(who)
        .bind(meter)
        .bind(*amount)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

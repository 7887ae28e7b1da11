//! Room deletions and their step-by-step receipts.

use super::*;
use crate::ids::RoomId;

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct DeletionRow {
    pub id: String,
    pub room_id: RoomId,
    pub state: DeletionState,
    pub requested_by: String,
    pub receipt: Option<String>,
}

stored_enum! {
    /// Where a deletion stands, as stored.
    DeletionState {
        /// Asked by an owner; an admin confirms it.
        PendingConfirmation = "pending_confirmation",
        /// Confirmed; its steps run (and resume after a crash).
        Confirmed = "confirmed",
        Done = "done",
    }
}

/// A deletion as the admin console lists it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ListedDeletion {
    pub id: String,
    pub room_id: RoomId,
    pub room_name: Option<String>,
    pub state: DeletionState,
    pub requested_by: String,
    pub requested_by_email: Option<String>,
    pub requested_at: i64,
    pub confirmed_by: Option<String>,
    pub confirmed_at: Option<i64>,
}

impl Store {
    /// The deletion of `room_id` in progress or pending, if any.
    pub(crate) async fn open_deletion(
        &self,
        room_id: &RoomId,
    ) -> Result<Option<DeletionRow>, StoreError> {
        Ok(sqlx::query_as::<_, DeletionRow>(
            "SELECT id, room_id, state, requested_by, receipt FROM deletions \
             WHERE room_id = $1 AND state <> 'done' ORDER BY requested_at LIMIT 1",
        )
        .bind(room_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    pub(crate) async fn deletion(&self, id: &str) -> Result<Option<DeletionRow>, StoreError> {
        Ok(sqlx::query_as::<_, DeletionRow>(
            "SELECT id, room_id, state, requested_by, receipt FROM deletions WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Every deletion, pending ones first, then the newest, at most `limit`, with the room's
    /// name while the room is there and when it was asked for and confirmed.
    pub(crate) async fn deletions_listed(
        &self,
        limit: i64,
    ) -> Result<Vec<ListedDeletion>, StoreError> {
        Ok(sqlx::query_as::<_, ListedDeletion>(
            "SELECT d.id, d.room_id, COALESCE(r.name, d.room_name) AS room_name, d.state, d.requested_by, \
             u.email AS requested_by_email, d.requested_at, d.confirmed_by, d.confirmed_at \
             FROM deletions d LEFT JOIN rooms r ON r.id = d.room_id \
             LEFT JOIN users u ON u.id = d.requested_by \
             ORDER BY CASE WHEN d.state = 'pending_confirmation' THEN 0 ELSE 1 END, d.requested_at DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Deletions confirmed but not finished: all of them (`None`), or those `Some(me)` may
    /// carry out: no live server's claim is on them (a crash interrupted them), or the claim is
    /// `me`'s from before a restart.
    pub(crate) async fn unfinished_deletions(
        &self,
        me: Option<&str>,
    ) -> Result<Vec<DeletionRow>, StoreError> {
        let now = super::leases::db_now(self.backend);
        // A room another live server holds is that server's to delete (its sockets and its
        // sandbox are there): its own sweeper finishes it.
        let sql = format!(
            "SELECT id, room_id, state, requested_by, receipt FROM deletions d \
             WHERE state = 'confirmed' AND ($1 IS NULL OR ((runner IS NULL OR runner = $1 \
             OR runner_until <= {now}) AND NOT EXISTS (SELECT 1 FROM room_leases l \
             WHERE l.room_id = d.room_id AND l.expires_at > {now} AND l.owner <> $1)))"
        );
        Ok(sqlx::query_as::<_, DeletionRow>(&sql)
            .bind(me)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Confirms a deletion, claimed for `me` to carry out for `ttl_ms` (see
    /// [`Store::claim_deletion`]).
    pub(crate) async fn confirm_deletion(
        &self,
        id: &str,
        by: &str,
        me: &str,
        ttl_ms: i64,
    ) -> Result<(), StoreError> {
        let now = super::leases::db_now(self.backend);
        let sql = format!(
            "UPDATE deletions SET state = 'confirmed', confirmed_by = $1, confirmed_at = $2, \
             runner = $4, runner_until = {now} + $5 \
             WHERE id = $3 AND state = 'pending_confirmation'"
        );
        sqlx::query(&sql)
            .bind(by)
            .bind(now_ms())
            .bind(id)
            .bind(me)
            .bind(ttl_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Claims (or renews the claim on) confirmed deletion `id` for `me` for `ttl_ms` of the
    /// database's clock: it succeeds when no server holds it, when the holder's claim has
    /// lapsed (it died part way), or when it is `me`'s already. `false`: another live server
    /// carries it out, or it is done.
    pub(crate) async fn claim_deletion(
        &self,
        id: &str,
        me: &str,
        ttl_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = super::leases::db_now(self.backend);
        let sql = format!(
            "UPDATE deletions SET runner = $2, runner_until = {now} + $3 \
             WHERE id = $1 AND state = 'confirmed' \
             AND (runner IS NULL OR runner = $2 OR runner_until <= {now})"
        );
        let done = sqlx::query(&sql)
            .bind(id)
            .bind(me)
            .bind(ttl_ms)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Steps of a deletion already carried out: (artifact, status, count).
    pub(crate) async fn deletion_steps(
        &self,
        id: &str,
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        let rows = sqlx::query("SELECT artifact, status, count FROM deletion_steps WHERE deletion_id = $1 ORDER BY at, artifact")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("artifact")?,
                    r.try_get("status")?,
                    r.try_get("count")?,
                ))
            })
            .collect()
    }

    /// Runs `delete_sql` (bound to the room id) and records the step, in one transaction.
    pub(crate) async fn deletion_step(
        &self,
        deletion_id: &str,
        room_id: &RoomId,
        artifact: &str,
        delete_sql: Option<&str>,
        status_if_none: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let count = match delete_sql {
            Some(sql) => sqlx::query(sql)
                .bind(room_id)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
            None => 0,
        };
        if delete_sql.is_some() {
            crate::fault::point("deletion_step").await;
        }
        let status = if count > 0 {
            "destroyed"
        } else {
            status_if_none
        };
        sqlx::query(
            "INSERT INTO deletion_steps (deletion_id, artifact, status, count, at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (deletion_id, artifact) DO NOTHING",
        )
        .bind(deletion_id)
        .bind(artifact)
        .bind(status)
        .bind(i64::try_from(count).unwrap_or(i64::MAX))
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a step whose work happened outside the database.
    pub(crate) async fn deletion_step_done(
        &self,
        deletion_id: &str,
        artifact: &str,
        status: &str,
        count: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO deletion_steps (deletion_id, artifact, status, count, at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (deletion_id, artifact) DO NOTHING",
        )
        .bind(deletion_id)
        .bind(artifact)
        .bind(status)
        .bind(count)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(crate) async fn finish_deletion(
        &self,
        id: &str,
        receipt: &str,
        receipt_hash: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE deletions SET state = 'done', receipt = $1, receipt_hash = $2 WHERE id = $3",
        )
        .bind(receipt)
        .bind(receipt_hash)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

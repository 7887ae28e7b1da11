//! Rooms' sandboxes: lifecycle state, latest snapshot, the durable idle timer.

use super::*;
use crate::ids::RoomId;

stored_enum! {
    /// Where a room's sandbox is in its lifecycle (stored and shown by these names).
    #[derive(Default)]
    SandboxState {
        /// Never started.
        #[default]
        Absent = "absent",
        Running = "running",
        /// Snapshotted and stopped at a server shutdown; resumes on first need.
        Suspended = "suspended",
        Stopped = "stopped",
        /// Failed (OOM, killed agent...); waits for an explicit restart.
        Failed = "failed",
    }
}

/// A room's sandbox as stored: lifecycle state, latest snapshot and the idle timer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SandboxRow {
    pub state: SandboxState,
    /// Why it is in this state (shown to participants).
    pub reason: String,
    /// The receipt of its last start (JSON).
    pub receipt: String,
    /// File name of the latest workspace snapshot.
    pub snapshot: Option<String>,
    pub snapshot_at: Option<i64>,
    /// When the idle timer stops it (Unix ms), if armed.
    pub stop_at: Option<i64>,
}

impl Store {
    /// The room's sandbox row, if it ever had a sandbox.
    pub(crate) async fn sandbox(&self, room_id: &RoomId) -> Result<Option<SandboxRow>, StoreError> {
        let row = sqlx::query(
            "SELECT state, reason, receipt, snapshot, snapshot_at, stop_at FROM sandboxes WHERE room_id = $1",
        )
        .bind(room_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(SandboxRow {
                state: SandboxState::parse(r.try_get("state")?)?,
                reason: r.try_get("reason")?,
                receipt: r.try_get("receipt")?,
                snapshot: r.try_get("snapshot")?,
                snapshot_at: r.try_get("snapshot_at")?,
                stop_at: r.try_get("stop_at")?,
            })
        })
        .transpose()
    }

    /// Arms (or with `None` disarms) a sandbox's idle timer. Not audited: the stop it leads to is.
    pub(crate) async fn set_idle_timer(
        &self,
        room_id: &RoomId,
        stop_at: Option<i64>,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE sandboxes SET stop_at = $1 WHERE room_id = $2")
            .bind(stop_at)
            .bind(room_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Points the room's sandbox at a newer snapshot (a periodic one, taken while running).
    pub(crate) async fn set_snapshot(
        &self,
        room_id: &RoomId,
        name: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE sandboxes SET snapshot = $1, snapshot_at = $2 WHERE room_id = $3")
            .bind(name)
            .bind(at)
            .bind(room_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Rooms whose sandbox idle timer is due at `now`.
    pub(crate) async fn due_sandboxes(
        &self,
        now: i64,
        me: &str,
    ) -> Result<Vec<RoomId>, StoreError> {
        // A room another live server holds is left to it (its sandbox may run there).
        let db_now = super::leases::db_now(self.backend);
        let sql = format!(
            "SELECT s.room_id FROM sandboxes s WHERE s.stop_at IS NOT NULL AND s.stop_at <= $1 \
             AND NOT EXISTS (SELECT 1 FROM room_leases l WHERE l.room_id = s.room_id \
             AND l.expires_at > {db_now} AND l.owner <> $2) LIMIT 100"
        );
        let rows = sqlx::query(&sql)
            .bind(now)
            .bind(me)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok(r.try_get("room_id")?)).collect()
    }
}

//! Rooms' documents: the update log and its snapshots.

use super::*;

/// A room's stored document: the snapshot (if any) and the log entries after it, in order.
#[derive(Debug, Default)]
pub(crate) struct StoredDoc {
    pub snapshot: Option<Vec<u8>>,
    pub snapshot_seq: i64,
    pub updates: Vec<(i64, Vec<u8>)>,
}

impl Store {
    pub(crate) async fn load_doc(&self, room_id: &str) -> Result<StoredDoc, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let snap = sqlx::query("SELECT upto_seq, data FROM doc_snapshots WHERE room_id = $1")
            .bind(room_id)
            .fetch_optional(&mut *conn)
            .await?;
        let (snapshot, snapshot_seq) = match snap {
            Some(r) => (
                Some(r.try_get::<Vec<u8>, _>("data")?),
                r.try_get("upto_seq")?,
            ),
            None => (None, 0),
        };
        let rows = sqlx::query(
            "SELECT seq, data FROM doc_updates WHERE room_id = $1 AND seq > $2 ORDER BY seq",
        )
        .bind(room_id)
        .bind(snapshot_seq)
        .fetch_all(&mut *conn)
        .await?;
        let updates = rows
            .iter()
            .map(|r| Ok((r.try_get("seq")?, r.try_get("data")?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(StoredDoc {
            snapshot,
            snapshot_seq,
            updates,
        })
    }

    /// Appends a batch of updates in one transaction (one fsync for the whole batch).
    pub(crate) async fn append_updates(
        &self,
        room_id: &str,
        batch: &[(i64, &[u8])],
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        for (seq, data) in batch {
            sqlx::query("INSERT INTO doc_updates (room_id, seq, data) VALUES ($1, $2, $3)")
                .bind(room_id)
                .bind(*seq)
                .bind(*data)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Replaces the snapshot with `data` (covering every update up to `upto_seq`) and drops the
    /// folded log entries, atomically.
    pub(crate) async fn compact(
        &self,
        room_id: &str,
        upto_seq: i64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO doc_snapshots (room_id, upto_seq, data, updated_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (room_id) DO UPDATE SET upto_seq = excluded.upto_seq, \
             data = excluded.data, updated_at = excluded.updated_at",
        )
        .bind(room_id)
        .bind(upto_seq)
        .bind(data)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        crate::fault::point("compaction").await;
        sqlx::query("DELETE FROM doc_updates WHERE room_id = $1 AND seq <= $2")
            .bind(room_id)
            .bind(upto_seq)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

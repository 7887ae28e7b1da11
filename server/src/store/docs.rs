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

    /// Appends a room's batch of updates, durably, and returns once it is. Batches of every
    /// room go through one writer, which gathers those waiting into one transaction (group
    /// commit across rooms): forty busy rooms pay one fsync, not forty, and never queue for
    /// SQLite's single write lock one by one.
    pub(crate) async fn append_updates(
        &self,
        room_id: &str,
        batch: &[(i64, &[u8])],
    ) -> Result<(), StoreError> {
        let (done, result) = tokio::sync::oneshot::channel();
        let append = Append {
            room: room_id.to_owned(),
            rows: batch.iter().map(|(seq, d)| (*seq, d.to_vec())).collect(),
            done,
        };
        let writer = self.appender.get_or_init(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(APPEND_QUEUE);
            let writer = Writer {
                pool: self.pool.clone(),
                backend: self.backend,
            };
            tokio::spawn(writer.run(rx));
            tx
        });
        writer
            .send(append)
            .await
            .map_err(|_| StoreError::Closed("the update log's writer has stopped"))?;
        result
            .await
            .map_err(|_| StoreError::Closed("the update log's writer has stopped"))?
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

/// Batches waiting for the writer, across rooms; a room's commit waits while it is full.
const APPEND_QUEUE: usize = 1024;
/// Most batches one transaction takes. `CODEROOM_MAX_COMMIT_GROUP` lowers it for benchmarks
/// (1: every room's batch in a transaction of its own, as before group commit).
const MAX_GROUP: usize = 256;

fn max_group() -> usize {
    std::env::var("CODEROOM_MAX_COMMIT_GROUP")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(MAX_GROUP, |n: usize| n.clamp(1, MAX_GROUP))
}

/// One room's batch waiting for the writer.
#[derive(Debug)]
pub(crate) struct Append {
    room: String,
    rows: Vec<(i64, Vec<u8>)>,
    done: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
}

/// The update log's one writer: it holds no `Store` (whose handle to it would keep it alive).
struct Writer {
    pool: AnyPool,
    backend: Backend,
}

impl Writer {
    async fn run(self, mut rx: tokio::sync::mpsc::Receiver<Append>) {
        let max = max_group();
        while let Some(first) = rx.recv().await {
            let mut group = vec![first];
            while group.len() < max {
                match rx.try_recv() {
                    Ok(a) => group.push(a),
                    Err(_) => break,
                }
            }
            match self.write(&group).await {
                Ok(()) => {
                    for a in group {
                        let _ = a.done.send(Ok(()));
                    }
                }
                Err(e) if group.len() == 1 => {
                    let _ = group.pop().map(|a| a.done.send(Err(e)));
                }
                // One room's failure must not fail the others: each alone, for its own answer.
                Err(_) => {
                    for a in group {
                        let r = self.write(std::slice::from_ref(&a)).await;
                        let _ = a.done.send(r);
                    }
                }
            }
        }
    }

    async fn write(&self, group: &[Append]) -> Result<(), StoreError> {
        let mut tx = super::begin_write(&self.pool, self.backend).await?;
        for a in group {
            for (seq, data) in &a.rows {
                sqlx::query("INSERT INTO doc_updates (room_id, seq, data) VALUES ($1, $2, $3)")
                    .bind(&a.room)
                    .bind(*seq)
                    .bind(data.as_slice())
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}

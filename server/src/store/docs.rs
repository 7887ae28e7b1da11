//! Rooms' documents: the update log and its snapshots.

use super::log_writer::{Append, Job, LogTimes};
use super::*;
use crate::ids::RoomId;

/// A room's stored document: the snapshot (if any) and the log entries after it, in order.
#[derive(Debug, Default)]
pub(crate) struct StoredDoc {
    pub snapshot: Option<Vec<u8>>,
    pub snapshot_seq: i64,
    pub updates: Vec<(i64, Vec<u8>)>,
}

impl Store {
    pub(crate) async fn load_doc(&self, room_id: &RoomId) -> Result<StoredDoc, StoreError> {
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

    /// Whether anything of the room's document was ever stored (an update or a snapshot). A
    /// document never stored holds no files: no peer was ever sent one (updates are stored
    /// before they are broadcast).
    pub(crate) async fn doc_stored(&self, room_id: &RoomId) -> Result<bool, StoreError> {
        let row = sqlx::query(
            "SELECT 1 AS one FROM doc_updates WHERE room_id = $1 \
             UNION ALL SELECT 1 AS one FROM doc_snapshots WHERE room_id = $1 LIMIT 1",
        )
        .bind(room_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.is_some())
    }

    /// Appends a room's batch of updates, durably, and returns once it is. Batches of every
    /// room go through one writer, which gathers those waiting into one transaction (group
    /// commit across rooms): forty busy rooms pay one fsync, not forty, and never queue for
    /// SQLite's single write lock one by one.
    ///
    /// `lease` is the room's fencing token ([`super::leases`]): a batch under a token that is
    /// no longer the room's current one is refused whole (`StoreError::Fenced`).
    pub(crate) async fn append_updates(
        &self,
        room_id: &RoomId,
        lease: Lease,
        batch: &[(i64, &[u8])],
    ) -> Result<(), StoreError> {
        self.ask_writer(|done| {
            Job::Append(Append {
                room: room_id.clone(),
                token: lease.token,
                rows: batch.iter().map(|(seq, d)| (*seq, d.to_vec())).collect(),
                done,
                queued: std::time::Instant::now(),
            })
        })
        .await
    }

    /// Hands the job `make` builds to the update log's one writer and waits for its answer.
    pub(super) async fn ask_writer<T>(
        &self,
        make: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, StoreError>>) -> Job,
    ) -> Result<T, StoreError> {
        let (done, answer) = tokio::sync::oneshot::channel();
        self.to_writer(make(done)).await?;
        answer
            .await
            .map_err(|_| StoreError::Closed("the update log's writer has stopped"))?
    }

    /// Hands `job` to the update log's one writer (started on first use).
    async fn to_writer(&self, job: Job) -> Result<(), StoreError> {
        let writer = self.appender.get_or_init(|| super::log_writer::start(self));
        writer
            .send(job)
            .await
            .map_err(|_| StoreError::Closed("the update log's writer has stopped"))
    }

    /// Where the update log's time goes from now on: how long a batch waits for the writer,
    /// and how long the writer's statement (with its fsync) takes.
    pub(crate) fn observe_log(&self, times: LogTimes) {
        let _ = self.log_times.set(times);
    }

    /// Replaces the snapshot with `data` (covering every update up to `upto_seq`) and drops the
    /// folded log entries, atomically, while `lease` is still the room's (else
    /// `StoreError::Fenced`, and nothing changes). Written by the update log's writer, between
    /// its groups: on SQLite a compaction beside the writer would wait for the write lock in
    /// SQLite's busy handler, which sleeps up to 100 ms at a time while the writer keeps
    /// taking the lock (a busy server's compaction waited a second, and its room with it).
    pub(crate) async fn compact(
        &self,
        room_id: &RoomId,
        lease: Lease,
        upto_seq: i64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        self.ask_writer(|done| Job::Compact {
            room: room_id.clone(),
            token: lease.token,
            upto_seq,
            data: data.to_vec(),
            done,
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::store::each_database!(
        /// Batches of many rooms appended at once all land, in order: groups that fit one
        /// multi-row `INSERT`, a batch larger than one statement takes (a transaction of
        /// several), and a batch that collides with a stored row fails alone while the others
        /// of its group land.
        grouped_appends_land_whole_and_a_bad_batch_fails_alone,
        |url: String| async move { super::grouped_appends(&url).await }
    );

    crate::store::each_database!(
        /// A closed store's writer is gone: what it was given before lands, an append after
        /// the close fails, and nothing of it is written.
        a_closed_store_appends_nothing_more,
        |url: String| async move { super::closed_store(&url).await }
    );

    async fn closed_store(url: &str) {
        let store = super::super::with_user(url).await;
        let room = crate::ids::RoomId::known("r");
        sqlx::query(
            "INSERT INTO rooms (id, name, created_by, created_at) VALUES ('r', 'r', 'u', 0)",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        let me = super::super::ServerId {
            id: "t".into(),
            address: "http://t".into(),
        };
        let super::super::Claim::Won(lease) = store.claim_room(&room, &me, 60_000).await.unwrap()
        else {
            panic!("not claimed")
        };
        store
            .append_updates(&room, lease, &[(1, b"kept".as_slice())])
            .await
            .unwrap();
        store.close().await;
        let after = store
            .append_updates(&room, lease, &[(2, b"after".as_slice())])
            .await;
        assert!(matches!(after, Err(StoreError::Closed(_))), "{after:?}");
        let again = super::super::Store::connect(url).await.unwrap();
        let stored = again.load_doc(&room).await.unwrap();
        assert_eq!(stored.updates, vec![(1, b"kept".to_vec())]);
        again.close().await;
    }

    async fn grouped_appends(url: &str) {
        let store = super::super::with_user(url).await;
        let rooms: Vec<crate::ids::RoomId> = (0..30)
            .map(|i| crate::ids::RoomId::known(format!("r{i}")))
            .collect();
        for r in &rooms {
            sqlx::query(
                "INSERT INTO rooms (id, name, created_by, created_at) VALUES ($1, $1, 'u', 0)",
            )
            .bind(r)
            .execute(&store.pool)
            .await
            .unwrap();
        }
        let me = super::super::ServerId {
            id: "t".into(),
            address: "http://t".into(),
        };
        let mut leases = std::collections::HashMap::new();
        for r in &rooms {
            let super::super::Claim::Won(lease) = store.claim_room(r, &me, 60_000).await.unwrap()
            else {
                panic!("not claimed")
            };
            leases.insert(r.clone(), lease);
        }
        // r2 is claimed again (a claim raises the token): the lease kept for it is stale.
        let super::super::Claim::Won(_) = store
            .claim_room(&crate::ids::RoomId::known("r2"), &me, 60_000)
            .await
            .unwrap()
        else {
            panic!("not claimed")
        };
        let data = |room: &str, seq: i64| format!("{room}:{seq}").into_bytes();
        // r0 holds seq 1 already: its batch below (seq 1-3) collides.
        store
            .append_updates(
                &crate::ids::RoomId::known("r0"),
                leases["r0"],
                &[(1, b"first".as_slice())],
            )
            .await
            .unwrap();
        let big = super::super::log_writer::ROWS_PER_STATEMENT * 2 + 7;
        let leases = &leases;
        let appends = rooms.iter().map(|r| {
            let store = store.clone();
            let r = r.clone();
            async move {
                let n = if r == "r1" { big } else { 3 };
                let rows: Vec<(i64, Vec<u8>)> = (1..=n as i64).map(|s| (s, data(&r, s))).collect();
                let refs: Vec<(i64, &[u8])> =
                    rows.iter().map(|(s, d)| (*s, d.as_slice())).collect();
                let lease = leases[&r];
                (r.clone(), store.append_updates(&r, lease, &refs).await)
            }
        });
        let results = futures_util::future::join_all(appends).await;
        for (room, result) in results {
            let stored = store.load_doc(&room).await.unwrap();
            if room == "r2" {
                assert!(matches!(result, Err(StoreError::Fenced)), "{result:?}");
                assert!(stored.updates.is_empty(), "nothing of a stale batch lands");
                continue;
            }
            if room == "r0" {
                assert!(result.is_err(), "r0's batch collides with its stored row");
                assert_eq!(
                    stored.updates,
                    vec![(1, b"first".to_vec())],
                    "nothing of it landed"
                );
                continue;
            }
            result.unwrap();
            let n = if room == "r1" { big } else { 3 };
            let want: Vec<(i64, Vec<u8>)> = (1..=n as i64).map(|s| (s, data(&room, s))).collect();
            assert_eq!(stored.updates, want, "{room}");
        }
        store.close().await;
    }
}

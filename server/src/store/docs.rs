//! Rooms' documents: the update log and its snapshots.

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
        let writer = self.appender.get_or_init(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(APPEND_QUEUE);
            let writer = Writer {
                pool: self.pool.clone(),
                conn: None,
                closing: self.closing.clone(),
                backend: self.backend,
                multi_row: self.options.multi_row,
                max_group: self.options.max_commit_group.clamp(1, MAX_COMMIT_GROUP),
                times: self.log_times.clone(),
            };
            tokio::spawn(writer.run(rx));
            tx
        });
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

/// The update log's histograms (`doc_stage_seconds`): `wait`, a batch waiting for the writer;
/// `write`, the writer's statement and its fsync.
#[derive(Clone, Debug)]
pub(crate) struct LogTimes {
    pub wait: prometheus_client::metrics::histogram::Histogram,
    pub write: prometheus_client::metrics::histogram::Histogram,
}

/// What the update log's writer does: rooms' appends, gathered; the rest in turn between them.
#[derive(Debug)]
pub(crate) enum Job {
    Append(Append),
    Compact {
        room: RoomId,
        token: i64,
        upto_seq: i64,
        data: Vec<u8>,
        done: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
    },
    /// A room's lease renewal (`leases::renew_room`): on SQLite a write too.
    Renew {
        room: RoomId,
        token: i64,
        ttl_ms: i64,
        done: tokio::sync::oneshot::Sender<Result<bool, StoreError>>,
    },
}

/// Batches waiting for the writer, across rooms; a room's commit waits while it is full.
const APPEND_QUEUE: usize = 1024;
/// Most batches one transaction takes: one fsync for many rooms' batches, a quarter of what
/// may wait. `serve --max-commit-group` lowers it for the benchmarks' comparison (1: every
/// room's batch in a transaction of its own, as before group commit).
pub(crate) const MAX_COMMIT_GROUP: usize = 256;

/// One room's batch waiting for the writer.
#[derive(Debug)]
pub(crate) struct Append {
    room: RoomId,
    /// The room's fencing token.
    token: i64,
    rows: Vec<(i64, Vec<u8>)>,
    done: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
    /// When the room handed it over.
    queued: std::time::Instant,
}

/// The update log's one writer: it holds no `Store` (whose handle to it would keep it alive).
struct Writer {
    pool: AnyPool,
    /// The connection the writer keeps between groups. Taken from the pool for every group, a
    /// connection costs two more round trips to SQLite's worker thread (sqlx pings it when
    /// handing it out and again, in a task of its own, when it comes back): thread wake-ups
    /// every room's commit waited for on a busy machine. Given back after an error, and on
    /// PostgreSQL whenever the writer waits for work, so a broken connection is replaced.
    conn: Option<sqlx::pool::PoolConnection<sqlx::Any>>,
    /// The store is closing: keep no connection.
    closing: tokio_util::sync::CancellationToken,
    backend: Backend,
    /// Multi-row `INSERT`s (false only for the benchmark's comparison).
    multi_row: bool,
    /// Most batches one transaction takes, within 1..=[`MAX_COMMIT_GROUP`].
    max_group: usize,
    times: std::sync::Arc<std::sync::OnceLock<LogTimes>>,
}

impl Writer {
    async fn run(mut self, mut rx: tokio::sync::mpsc::Receiver<Job>) {
        use tokio::sync::mpsc::error::TryRecvError;
        // Compacted rooms whose folded log rows are still to delete, with how far.
        let mut prune: std::collections::VecDeque<(RoomId, i64)> = Default::default();
        loop {
            let first = match rx.try_recv() {
                Ok(job) => job,
                Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => {
                    if let Some((room, upto)) = prune.front().cloned() {
                        // Nothing waits: delete a chunk of a compacted log.
                        let pruned = match self.conn().await {
                            Ok(conn) => prune_chunk(conn, &room, upto).await,
                            Err(e) => Err(e.into()),
                        };
                        self.keep_if(pruned.is_ok());
                        match pruned {
                            Ok(false) => {}
                            Ok(true) => {
                                prune.pop_front();
                            }
                            Err(e) => {
                                // Left for the room's next compaction, which covers these.
                                tracing::warn!(room = %room, error = %e, "cannot delete a compacted log's rows");
                                prune.pop_front();
                            }
                        }
                        continue;
                    }
                    // PostgreSQL may end a connection that sat idle: the writer gives its
                    // own back while it waits (SQLite's is a file in this process).
                    if self.backend == Backend::Postgres {
                        self.conn = None;
                    }
                    let job = tokio::select! {
                        job = rx.recv() => job,
                        () = self.closing.cancelled(), if self.conn.is_some() => {
                            self.conn = None;
                            continue;
                        }
                    };
                    match job {
                        Some(job) => job,
                        None => return,
                    }
                }
            };
            let mut jobs = vec![first];
            while jobs.len() < self.max_group {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            if let Some(t) = self.times.get() {
                for j in &jobs {
                    if let Job::Append(a) = j {
                        t.wait.observe(a.queued.elapsed().as_secs_f64());
                    }
                }
            }
            for (room, upto) in self.jobs(jobs).await {
                match prune.iter_mut().find(|(r, _)| *r == room) {
                    Some(p) => p.1 = p.1.max(upto),
                    None => prune.push_back((room, upto)),
                }
            }
        }
    }

    /// The writer's connection, taken from the pool when it has none.
    async fn conn(&mut self) -> Result<&mut sqlx::AnyConnection, sqlx::Error> {
        if self.conn.is_none() {
            self.conn = Some(self.pool.acquire().await?);
        }
        match self.conn.as_deref_mut() {
            Some(conn) => Ok(conn),
            None => Err(sqlx::Error::PoolClosed),
        }
    }

    /// Gives the connection back to the pool unless the last use of it went well.
    fn keep_if(&mut self, ok: bool) {
        if !ok || self.closing.is_cancelled() {
            self.conn = None;
        }
    }

    /// A group of jobs: rooms' appends alone in one statement where they fit one, else every
    /// job in one transaction (one fsync for the group, compactions and renewals included);
    /// when that fails, each job alone (one room's failure must not fail the others). The
    /// rooms whose compaction landed, and how far.
    async fn jobs(&mut self, jobs: Vec<Job>) -> Vec<(RoomId, i64)> {
        let started = std::time::Instant::now();
        let together = self.together(&jobs).await;
        if let Some(t) = self.times.get() {
            t.write.observe(started.elapsed().as_secs_f64());
        }
        let mut compacted = Vec::new();
        match together {
            Ok(renewed) => {
                let mut renewed = renewed.into_iter();
                for job in jobs {
                    job.succeed(&mut renewed, &mut compacted);
                }
            }
            Err(e) if jobs.len() == 1 => {
                if let Some(job) = jobs.into_iter().next() {
                    job.fail(e);
                }
            }
            Err(_) => {
                for job in jobs {
                    match self.together(std::slice::from_ref(&job)).await {
                        Ok(renewed) => job.succeed(&mut renewed.into_iter(), &mut compacted),
                        Err(e) => job.fail(e),
                    }
                }
            }
        }
        compacted
    }

    /// Writes `jobs` (see [`Writer::jobs`]); each renewal's answer, in order. A stale token
    /// refuses the whole write (`StoreError::Fenced`).
    async fn together(&mut self, jobs: &[Job]) -> Result<Vec<bool>, StoreError> {
        let done = self.together_on(jobs).await;
        self.keep_if(done.is_ok());
        done
    }

    async fn together_on(&mut self, jobs: &[Job]) -> Result<Vec<bool>, StoreError> {
        let rows: Vec<LogRow<'_>> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Append(a) => Some(a),
                _ => None,
            })
            .flat_map(|a| {
                a.rows.iter().map(|(seq, data)| LogRow {
                    room: a.room.as_str(),
                    token: a.token,
                    seq: *seq,
                    data: data.as_slice(),
                })
            })
            .collect();
        let only_appends = jobs.iter().all(|j| matches!(j, Job::Append(_)));
        let per_statement = if self.multi_row {
            ROWS_PER_STATEMENT
        } else {
            1
        };
        if only_appends && rows.is_empty() {
            return Ok(Vec::new());
        }
        // A single statement commits on its own: one round trip to the database, not a
        // `BEGIN`, the statements and a `COMMIT`.
        if only_appends && self.multi_row && rows.len() <= per_statement {
            let backend = self.backend;
            fenced(insert_rows(self.conn().await?, backend, &rows).await?)?;
            return Ok(Vec::new());
        }
        // Dropping the transaction (on any error below) rolls back what it wrote.
        let backend = self.backend;
        let mut tx = super::begin_write_on(self.conn().await?, backend).await?;
        for chunk in rows.chunks(per_statement) {
            fenced(insert_rows(&mut *tx, backend, chunk).await?)?;
        }
        let mut renewed = Vec::new();
        for job in jobs {
            match job {
                Job::Append(_) => {}
                Job::Compact {
                    room,
                    token,
                    upto_seq,
                    data,
                    ..
                } => snapshot(&mut tx, backend, room, *token, *upto_seq, data).await?,
                Job::Renew {
                    room,
                    token,
                    ttl_ms,
                    ..
                } => renewed.push(
                    super::leases::renew_now(&mut *tx, backend, room, *token, *ttl_ms).await?,
                ),
            }
        }
        tx.commit().await?;
        Ok(renewed)
    }
}

impl Job {
    /// Tells the job's room it landed (a renewal: whether the lease was still its own, the
    /// next of `renewed`); a compaction is noted in `compacted`.
    fn succeed(self, renewed: &mut impl Iterator<Item = bool>, compacted: &mut Vec<(RoomId, i64)>) {
        match self {
            Job::Append(a) => {
                let _ = a.done.send(Ok(()));
            }
            Job::Compact {
                room,
                upto_seq,
                done,
                ..
            } => {
                compacted.push((room, upto_seq));
                let _ = done.send(Ok(()));
            }
            Job::Renew { done, .. } => {
                let _ = done.send(Ok(renewed.next().unwrap_or(false)));
            }
        }
    }

    fn fail(self, e: StoreError) {
        match self {
            Job::Append(a) => {
                let _ = a.done.send(Err(e));
            }
            Job::Compact { done, .. } => {
                let _ = done.send(Err(e));
            }
            Job::Renew { done, .. } => {
                let _ = done.send(Err(e));
            }
        }
    }
}

/// Rows of a compacted log one delete takes: the writer deletes them between groups, a chunk
/// at a time, so a compaction never holds up the rooms' appends for long.
const PRUNE_CHUNK: i64 = 256;

/// Deletes up to [`PRUNE_CHUNK`] of `room`'s log rows folded into its snapshot (`seq <=
/// upto`). Whether none are left.
async fn prune_chunk(
    conn: &mut sqlx::AnyConnection,
    room: &RoomId,
    upto: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "DELETE FROM doc_updates WHERE room_id = $1 AND seq IN \
         (SELECT seq FROM doc_updates WHERE room_id = $1 AND seq <= $2 ORDER BY seq LIMIT $3)",
    )
    .bind(room)
    .bind(upto)
    .bind(PRUNE_CHUNK)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() < PRUNE_CHUNK as u64)
}

/// A compaction's snapshot, in the writer's transaction `tx`, while `token` is the room's
/// lease (else `StoreError::Fenced`). The log rows it folds are deleted later
/// ([`prune_chunk`]); a load reads only those after the snapshot.
async fn snapshot(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    backend: Backend,
    room_id: &RoomId,
    token: i64,
    upto_seq: i64,
    data: &[u8],
) -> Result<(), StoreError> {
    // Holds the lease row until the commit (PostgreSQL; SQLite's write lock already does):
    // a takeover waits for this compaction, or this one sees the new token and stops.
    let lock = match backend {
        Backend::Sqlite => "",
        Backend::Postgres => " FOR UPDATE",
    };
    let held = sqlx::query(&format!(
        "SELECT token FROM room_leases WHERE room_id = $1 AND token = $2{lock}"
    ))
    .bind(room_id)
    .bind(token)
    .fetch_optional(&mut **tx)
    .await?;
    if held.is_none() {
        return Err(StoreError::Fenced);
    }
    sqlx::query(
        "INSERT INTO doc_snapshots (room_id, upto_seq, data, updated_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (room_id) DO UPDATE SET upto_seq = excluded.upto_seq, \
         data = excluded.data, updated_at = excluded.updated_at",
    )
    .bind(room_id)
    .bind(upto_seq)
    .bind(data)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    crate::fault::point("compaction").await;
    Ok(())
}

/// Rows one `INSERT` takes (four parameters each: far below SQLite's 32,766 and PostgreSQL's
/// 65,535).
const ROWS_PER_STATEMENT: usize = 500;

/// Row counts whose `INSERT` stays prepared on the connection.
const PREPARED_UP_TO: usize = 32;

/// One log row to append, with its room's fencing token.
struct LogRow<'a> {
    room: &'a str,
    token: i64,
    seq: i64,
    data: &'a [u8],
}

fn fenced(landed: bool) -> Result<(), StoreError> {
    if landed {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    }
}

/// Inserts `rows` in one statement if every row's token is its room's current lease token, else
/// inserts nothing. Returns whether they landed.
///
/// The check is in the statement itself, not before it: on PostgreSQL the lease rows are read
/// `FOR SHARE`, so a takeover (which updates the row) waits for this statement's transaction,
/// or this statement waits for the takeover and then sees its new token; SQLite runs one
/// writer at a time.
async fn insert_rows<'e, E>(
    db: E,
    backend: Backend,
    rows: &[LogRow<'_>],
) -> Result<bool, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    use std::fmt::Write;
    let mut sql = String::from("WITH v (room_id, token, seq, data) AS (VALUES ");
    for i in 0..rows.len() {
        let n = i * 4;
        let sep = if i > 0 { ", " } else { "" };
        let _ = write!(sql, "{sep}(${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4);
    }
    let lock = match backend {
        Backend::Sqlite => "",
        Backend::Postgres => " FOR SHARE",
    };
    let _ = write!(
        sql,
        "), l AS (SELECT room_id, token FROM room_leases \
         WHERE room_id IN (SELECT room_id FROM v){lock}) \
         INSERT INTO doc_updates (room_id, seq, data) SELECT room_id, seq, data FROM v \
         WHERE (SELECT COUNT(*) FROM v JOIN l ON l.room_id = v.room_id AND l.token = v.token) \
         = ${}",
        rows.len() * 4 + 1
    );
    // Each row count is a statement of its own: only the common small ones are kept prepared,
    // so bursts of every size up to 500 never churn the connection's statement cache (100).
    let mut q = sqlx::query(&sql).persistent(rows.len() <= PREPARED_UP_TO);
    for r in rows {
        q = q.bind(r.room).bind(r.token).bind(r.seq).bind(r.data);
    }
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    let done = q.bind(n).execute(db).await?;
    Ok(done.rows_affected() == rows.len() as u64)
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
        let big = ROWS_PER_STATEMENT * 2 + 7;
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

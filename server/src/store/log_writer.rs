//! The update log's one writer: every room's appends, gathered into one transaction (group
//! commit across rooms), and the rooms' compactions and lease renewals between them.
//!
//! On an SQLite file the writer runs on a thread of its own with a connection of its own
//! (rusqlite): a statement is a call on that thread. Through sqlx, each statement was a round
//! trip to the connection's worker thread and back to the writer's task, two thread wake-ups
//! more for every group that every room's commit waited for on a busy machine
//! (docs/benchmarks.md, issue 40). PostgreSQL (and an SQLite database with no file) keeps a
//! pool connection on the server's runtime.

use super::{begin_write_on, Backend, Store, StoreError};
use crate::ids::RoomId;
use std::path::PathBuf;
use tokio::sync::{mpsc, oneshot};

/// The update log's histograms (`doc_stage_seconds`): `wait`, a batch waiting for the writer;
/// `write`, the writer's statement and its fsync.
#[derive(Clone, Debug)]
pub(crate) struct LogTimes {
    pub wait: prometheus_client::metrics::histogram::Histogram,
    pub write: prometheus_client::metrics::histogram::Histogram,
    /// `log_checkpoint`: the writer copying the rest of the WAL, groups waiting behind it.
    pub checkpoint: prometheus_client::metrics::histogram::Histogram,
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
        done: oneshot::Sender<Result<(), StoreError>>,
    },
    /// A room's lease renewal (`leases::renew_room`): on SQLite a write too.
    Renew {
        room: RoomId,
        token: i64,
        ttl_ms: i64,
        done: oneshot::Sender<Result<bool, StoreError>>,
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
    pub(super) room: RoomId,
    /// The room's fencing token.
    pub(super) token: i64,
    pub(super) rows: Vec<(i64, Vec<u8>)>,
    pub(super) done: oneshot::Sender<Result<(), StoreError>>,
    /// When the room handed it over.
    pub(super) queued: std::time::Instant,
}

/// Starts the writer of `store`'s update log; its queue.
pub(super) fn start(store: &Store) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel(APPEND_QUEUE);
    // Dropped when the writer ends, however it ends: `Store::close` waits for that.
    let (ended, ended_rx) = oneshot::channel::<()>();
    match store.writer_ended.lock() {
        Ok(mut e) => *e = Some(ended_rx),
        Err(poisoned) => *poisoned.into_inner() = Some(ended_rx),
    }
    let file = match (&store.sqlite_file, store.options.log_on_pool) {
        (Some(path), false) => Some(path.clone()),
        _ => None,
    };
    let mut writer = Writer {
        db: Db::Pool {
            pool: store.pool.clone(),
            conn: None,
        },
        closing: store.closing.clone(),
        backend: store.backend,
        multi_row: store.options.multi_row,
        max_group: store.options.max_commit_group.clamp(1, MAX_COMMIT_GROUP),
        times: store.log_times.clone(),
        wal_copied: store.wal_copied.clone(),
        wal_rest_since: None,
    };
    let Some(path) = file else {
        tokio::spawn(async move {
            writer.run(rx).await;
            drop(ended);
        });
        return tx;
    };
    writer.db = Db::File {
        path,
        pragmas: super::sqlite_pragmas(store.options),
        conn: None,
    };
    let thread = std::thread::Builder::new()
        .name("update-log".into())
        .spawn(move || {
            // The writer's own runtime: its queue and the closing signal are awaited here, and
            // its statements block nothing but this thread.
            match tokio::runtime::Builder::new_current_thread().build() {
                Ok(rt) => rt.block_on(writer.run(rx)),
                Err(e) => tracing::error!(error = %e, "the update log's writer cannot start"),
            }
            drop(ended);
        });
    if let Err(e) = thread {
        // The queue's receiver went with the closure: every append says the writer stopped.
        tracing::error!(error = %e, "the update log's writer cannot start");
    }
    tx
}

/// Where the writer writes.
enum Db {
    /// A pool connection, kept between groups: taken from the pool for every group, a
    /// connection costs two more round trips to SQLite's worker thread (sqlx pings it when
    /// handing it out and again, in a task of its own, when it comes back). Given back after an
    /// error, and on PostgreSQL whenever the writer waits for work, so a broken connection is
    /// replaced.
    Pool {
        pool: sqlx::AnyPool,
        conn: Option<sqlx::pool::PoolConnection<sqlx::Any>>,
    },
    /// An SQLite file, through a connection of the writer's own (opened again after an error).
    File {
        path: PathBuf,
        /// What every connection of the store is set up with.
        pragmas: String,
        conn: Option<rusqlite::Connection>,
    },
}

/// The writer's connection, as [`Db::conn`] hands it out.
enum Conn<'c> {
    Pool(&'c mut sqlx::AnyConnection),
    File(&'c mut rusqlite::Connection),
}

impl Db {
    /// The connection the writer keeps: taken from the pool, or opened, when it has none.
    async fn conn(
        &mut self,
        closing: &tokio_util::sync::CancellationToken,
    ) -> Result<Conn<'_>, StoreError> {
        match self {
            Db::Pool { pool, conn } => {
                if conn.is_none() {
                    *conn = Some(pool.acquire().await?);
                }
                conn.as_deref_mut()
                    .map(Conn::Pool)
                    .ok_or_else(|| sqlx::Error::PoolClosed.into())
            }
            Db::File {
                path,
                pragmas,
                conn,
            } => file_conn(conn, path, pragmas, closing).map(Conn::File),
        }
    }
}

/// The update log's one writer: it holds no `Store` (whose handle to it would keep it alive).
struct Writer {
    db: Db,
    /// The store is closing: keep no connection.
    closing: tokio_util::sync::CancellationToken,
    backend: Backend,
    /// Multi-row `INSERT`s (false only for the benchmark's comparison).
    multi_row: bool,
    /// Most batches one transaction takes, within 1..=[`MAX_COMMIT_GROUP`].
    max_group: usize,
    times: std::sync::Arc<std::sync::OnceLock<LogTimes>>,
    /// Set by the store's checkpointer after a pass that left a large WAL (SQLite only): what
    /// was appended while it ran is still to copy ([`Writer::finish_checkpoint`]).
    wal_copied: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Since when the rest of a checkpoint has waited for a moment with no job waiting.
    wal_rest_since: Option<std::time::Instant>,
}

/// How long the rest of a checkpoint waits for the writer to have nothing to do before it is
/// copied between two groups anyway.
const WAL_REST_WAITS_AT_MOST: std::time::Duration = std::time::Duration::from_secs(1);

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        use tokio::sync::mpsc::error::TryRecvError;
        // Compacted rooms whose folded log rows are still to delete, with how far.
        let mut prune: std::collections::VecDeque<(RoomId, i64)> = Default::default();
        loop {
            let first = match rx.try_recv() {
                Ok(job) => job,
                Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => {
                    if self.wal_rest_due(false) {
                        self.finish_checkpoint().await;
                        continue;
                    }
                    // A closing store deletes nothing more (the next load reads only the rows
                    // after the snapshot; the room's next compaction covers these).
                    let pending = prune.front().filter(|_| !self.closing.is_cancelled());
                    if let Some((room, upto)) = pending.cloned() {
                        // Nothing waits: delete a chunk of a compacted log.
                        let pruned = self.prune_chunk(&room, upto).await;
                        self.keep_after(&pruned);
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
                        self.drop_conn();
                    }
                    // The store closing ends the writer (with its connection): appends after
                    // it fail, as they would on a closed pool.
                    let job = tokio::select! {
                        job = rx.recv() => job,
                        () = self.closing.cancelled() => return,
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
            // A writer that never runs out of work copies the rest anyway, now and then.
            if self.wal_rest_due(true) {
                self.finish_checkpoint().await;
            }
        }
    }

    /// Whether to copy the rest of the WAL now: at once when nothing waits (`busy` false), or
    /// when it has waited [`WAL_REST_WAITS_AT_MOST`].
    fn wal_rest_due(&mut self, busy: bool) -> bool {
        use std::sync::atomic::Ordering;
        let Some(copied) = &self.wal_copied else {
            return false;
        };
        if self.wal_rest_since.is_none() && copied.swap(false, Ordering::AcqRel) {
            self.wal_rest_since = Some(std::time::Instant::now());
        }
        match self.wal_rest_since {
            None => false,
            Some(_) if self.closing.is_cancelled() => false,
            Some(since) => !busy || since.elapsed() >= WAL_REST_WAITS_AT_MOST,
        }
    }

    /// Copies into the database what was appended to the WAL while the checkpointer ran, on the
    /// writer's own connection between two groups: with no append beside it, this checkpoint
    /// copies all of the WAL, and the next append starts it over (SQLite restarts a WAL only
    /// once all of it is copied; one growing without end also costs every fsync the file's
    /// metadata). Its time, groups waiting behind it, is `log_checkpoint`.
    async fn finish_checkpoint(&mut self) {
        self.wal_rest_since = None;
        let started = std::time::Instant::now();
        let done = self.copy_wal_rest().await;
        self.keep_after(&done);
        if let Err(e) = done {
            tracing::warn!(error = %e, "cannot finish a WAL checkpoint; the next pass tries again");
        }
        if let Some(t) = self.times.get() {
            t.checkpoint.observe(started.elapsed().as_secs_f64());
        }
    }

    async fn copy_wal_rest(&mut self) -> Result<(), StoreError> {
        match self.db.conn(&self.closing).await? {
            Conn::Pool(c) => {
                sqlx::query(FINISH_CHECKPOINT).execute(c).await?;
            }
            Conn::File(c) => c.query_row(FINISH_CHECKPOINT, [], |_| Ok(()))?,
        }
        Ok(())
    }

    fn drop_conn(&mut self) {
        match &mut self.db {
            Db::Pool { conn, .. } => *conn = None,
            Db::File { conn, .. } => *conn = None,
        }
    }

    /// Lets the connection go after an error (a fenced write is an answer, not a broken
    /// connection), or once the store is closing.
    fn keep_after<T>(&mut self, done: &Result<T, StoreError>) {
        let broken = matches!(done, Err(e) if !matches!(e, StoreError::Fenced));
        if broken || self.closing.is_cancelled() {
            self.drop_conn();
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
        if only_appends && rows.is_empty() {
            return Ok(Vec::new());
        }
        let per_statement = if self.multi_row {
            ROWS_PER_STATEMENT
        } else {
            1
        };
        // A single statement commits on its own: one call, not a `BEGIN`, the statements and
        // a `COMMIT`.
        let alone = only_appends && self.multi_row && rows.len() <= per_statement;
        let backend = self.backend;
        let done = match self.db.conn(&self.closing).await {
            Ok(Conn::Pool(c)) => pooled(c, backend, jobs, &rows, per_statement, alone).await,
            Ok(Conn::File(c)) => in_file(c, jobs, &rows, per_statement, alone),
            Err(e) => Err(e),
        };
        self.keep_after(&done);
        done
    }

    /// Deletes up to [`PRUNE_CHUNK`] of `room`'s log rows folded into its snapshot (`seq <=
    /// upto`). Whether none are left.
    async fn prune_chunk(&mut self, room: &RoomId, upto: i64) -> Result<bool, StoreError> {
        let deleted = match self.db.conn(&self.closing).await? {
            Conn::Pool(c) => sqlx::query(PRUNE)
                .bind(room)
                .bind(upto)
                .bind(PRUNE_CHUNK)
                .execute(c)
                .await?
                .rows_affected(),
            Conn::File(c) => c.prepare_cached(PRUNE)?.execute(
                rusqlite::named_params! {"$1": room.as_str(), "$2": upto, "$3": PRUNE_CHUNK},
            )? as u64,
        };
        Ok(deleted < PRUNE_CHUNK as u64)
    }
}

/// The writer's SQLite connection, opened (and set up as the store's) when it has none; none
/// once the store is closing.
fn file_conn<'c>(
    conn: &'c mut Option<rusqlite::Connection>,
    path: &std::path::Path,
    pragmas: &str,
    closing: &tokio_util::sync::CancellationToken,
) -> Result<&'c mut rusqlite::Connection, StoreError> {
    if closing.is_cancelled() {
        *conn = None;
        return Err(StoreError::Closed("the store is closed"));
    }
    if conn.is_none() {
        use rusqlite::OpenFlags;
        // The store made the file and ran its migrations: open it, never create it.
        let c = rusqlite::Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        c.execute_batch(pragmas)?;
        // Every row count up to `PREPARED_UP_TO` stays prepared, besides the rest.
        c.set_prepared_statement_cache_capacity(PREPARED_UP_TO + 8);
        *conn = Some(c);
    }
    conn.as_mut()
        .ok_or(StoreError::Closed("the update log's connection"))
}

/// [`Writer::together`] through sqlx.
async fn pooled(
    conn: &mut sqlx::AnyConnection,
    backend: Backend,
    jobs: &[Job],
    rows: &[LogRow<'_>],
    per_statement: usize,
    alone: bool,
) -> Result<Vec<bool>, StoreError> {
    if alone {
        fenced(insert_rows(conn, backend, rows).await?)?;
        return Ok(Vec::new());
    }
    // Dropping the transaction (on any error below) rolls back what it wrote.
    let mut tx = begin_write_on(conn, backend).await?;
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
            } => {
                let held = sqlx::query(&held_sql(backend))
                    .bind(room)
                    .bind(token)
                    .fetch_optional(&mut *tx)
                    .await?;
                if held.is_none() {
                    return Err(StoreError::Fenced);
                }
                sqlx::query(SNAPSHOT)
                    .bind(room)
                    .bind(upto_seq)
                    .bind(data.as_slice())
                    .bind(crate::clock::system_now_ms())
                    .execute(&mut *tx)
                    .await?;
                crate::fault::point("compaction").await;
            }
            Job::Renew {
                room,
                token,
                ttl_ms,
                ..
            } => renewed
                .push(super::leases::renew_now(&mut *tx, backend, room, *token, *ttl_ms).await?),
        }
    }
    tx.commit().await?;
    Ok(renewed)
}

/// [`Writer::together`] on the writer's own SQLite connection.
fn in_file(
    conn: &mut rusqlite::Connection,
    jobs: &[Job],
    rows: &[LogRow<'_>],
    per_statement: usize,
    alone: bool,
) -> Result<Vec<bool>, StoreError> {
    if alone {
        fenced(insert_rows_in(conn, rows)?)?;
        return Ok(Vec::new());
    }
    // Dropping the transaction (on any error below) rolls back what it wrote.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for chunk in rows.chunks(per_statement) {
        fenced(insert_rows_in(&tx, chunk)?)?;
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
            } => {
                let held = tx
                    .prepare_cached(&held_sql(Backend::Sqlite))?
                    .exists(rusqlite::named_params! {"$1": room.as_str(), "$2": token})?;
                if !held {
                    return Err(StoreError::Fenced);
                }
                tx.prepare_cached(SNAPSHOT)?
                    .execute(rusqlite::named_params! {
                        "$1": room.as_str(),
                        "$2": upto_seq,
                        "$3": data,
                        "$4": crate::clock::system_now_ms(),
                    })?;
                // Stops this thread here, the transaction open, when a test asks.
                crate::fault::point_blocking("compaction");
            }
            Job::Renew {
                room,
                token,
                ttl_ms,
                ..
            } => {
                let n = tx
                    .prepare_cached(&super::leases::renew_sql(Backend::Sqlite))?
                    .execute(
                        rusqlite::named_params! {"$1": room.as_str(), "$2": token, "$3": ttl_ms},
                    )?;
                renewed.push(n == 1);
            }
        }
    }
    tx.commit()?;
    Ok(renewed)
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

/// The rest of a checkpoint: passive, so it never waits (the store's checkpointer may hold the
/// checkpoint lock; then the next pass copies it).
const FINISH_CHECKPOINT: &str = "PRAGMA wal_checkpoint(PASSIVE)";

/// Rows of a compacted log one delete takes: the writer deletes them between groups, a chunk
/// at a time, so a compaction never holds up the rooms' appends for long.
const PRUNE_CHUNK: i64 = 256;

/// Deletes a chunk of a room's log rows folded into its snapshot: `$1` the room, `$2` up to
/// which sequence number, `$3` how many at most.
const PRUNE: &str = "DELETE FROM doc_updates WHERE room_id = $1 AND seq IN \
     (SELECT seq FROM doc_updates WHERE room_id = $1 AND seq <= $2 ORDER BY seq LIMIT $3)";

/// A compaction's snapshot (`$1` room, `$2` up to which sequence number, `$3` the data, `$4`
/// when). The log rows it folds are deleted later (`PRUNE`); a load reads only those after the
/// snapshot.
const SNAPSHOT: &str =
    "INSERT INTO doc_snapshots (room_id, upto_seq, data, updated_at) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (room_id) DO UPDATE SET upto_seq = excluded.upto_seq, \
     data = excluded.data, updated_at = excluded.updated_at";

/// Whether `$2` is still room `$1`'s lease token. On PostgreSQL it holds the lease row until the
/// commit (SQLite's write lock already does): a takeover waits for this compaction, or this one
/// sees the new token and stops.
fn held_sql(backend: Backend) -> String {
    let lock = match backend {
        Backend::Sqlite => "",
        Backend::Postgres => " FOR UPDATE",
    };
    format!("SELECT token FROM room_leases WHERE room_id = $1 AND token = $2{lock}")
}

/// Rows one `INSERT` takes (four parameters each: far below SQLite's 32,766 and PostgreSQL's
/// 65,535).
pub(super) const ROWS_PER_STATEMENT: usize = 500;

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

/// The `INSERT` of `rows` rows: all of them if every row's token is its room's current lease
/// token (the last parameter is the row count), else none.
///
/// The check is in the statement itself, not before it: on PostgreSQL the lease rows are read
/// `FOR SHARE`, so a takeover (which updates the row) waits for this statement's transaction,
/// or this statement waits for the takeover and then sees its new token; SQLite runs one
/// writer at a time.
fn insert_sql(backend: Backend, rows: usize) -> String {
    use std::fmt::Write;
    let mut sql = String::from("WITH v (room_id, token, seq, data) AS (VALUES ");
    for i in 0..rows {
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
        rows * 4 + 1
    );
    sql
}

/// Inserts `rows` in one statement ([`insert_sql`]) through sqlx; whether they landed.
async fn insert_rows<'e, E>(
    db: E,
    backend: Backend,
    rows: &[LogRow<'_>],
) -> Result<bool, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    // Each row count is a statement of its own: only the common small ones are kept prepared,
    // so bursts of every size up to 500 never churn the connection's statement cache (100).
    let sql = insert_sql(backend, rows.len());
    let mut q = sqlx::query(&sql).persistent(rows.len() <= PREPARED_UP_TO);
    for r in rows {
        q = q.bind(r.room).bind(r.token).bind(r.seq).bind(r.data);
    }
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    let done = q.bind(n).execute(db).await?;
    Ok(done.rows_affected() == rows.len() as u64)
}

/// [`insert_rows`] on the writer's own SQLite connection (`$N` parameters are numbered in the
/// order they first appear, which is their order here).
fn insert_rows_in(conn: &rusqlite::Connection, rows: &[LogRow<'_>]) -> Result<bool, StoreError> {
    let sql = insert_sql(Backend::Sqlite, rows.len());
    let (mut cached, mut once);
    let stmt: &mut rusqlite::Statement<'_> = if rows.len() <= PREPARED_UP_TO {
        cached = conn.prepare_cached(&sql)?;
        &mut cached
    } else {
        // A large group's statement is rarely met again: not kept.
        once = conn.prepare(&sql)?;
        &mut once
    };
    let mut i = 0;
    for r in rows {
        stmt.raw_bind_parameter(i + 1, r.room)?;
        stmt.raw_bind_parameter(i + 2, r.token)?;
        stmt.raw_bind_parameter(i + 3, r.seq)?;
        stmt.raw_bind_parameter(i + 4, r.data)?;
        i += 4;
    }
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    stmt.raw_bind_parameter(i + 1, n)?;
    let done = stmt.raw_execute()?;
    Ok(done == rows.len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::{Durability, Options};

    /// The writer's own connection is set up as the store's: a commit survives power loss
    /// unless `synchronous=NORMAL` was asked for, and no checkpoint runs inside a commit.
    #[tokio::test]
    async fn the_writers_connection_keeps_the_stores_durability() {
        for (durability, want) in [(Durability::PowerLoss, 2), (Durability::Crash, 1)] {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}/t.db", dir.path().display());
            let options = Options {
                durability,
                ..Options::default()
            };
            let store = Store::connect_with(&url, options).await.unwrap();
            store.migrate().await.unwrap();
            let mut conn = None;
            let path = store.sqlite_file.clone().unwrap();
            let open = Default::default();
            let c = file_conn(
                &mut conn,
                &path,
                &super::super::sqlite_pragmas(options),
                &open,
            )
            .unwrap();
            let pragma = |name: &str| -> i64 {
                c.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                    .unwrap()
            };
            assert_eq!(pragma("synchronous"), want, "{durability:?}");
            assert_eq!(pragma("wal_autocheckpoint"), 0);
            assert_eq!(pragma("foreign_keys"), 1);
            assert_eq!(pragma("busy_timeout"), 5000);
            let mode: String = c
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
            store.close().await;
        }
    }
}

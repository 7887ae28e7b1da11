//! Durable state behind one sqlx `Any` pool, for SQLite (embedded default) and PostgreSQL.
//!
//! Queries use `$N` placeholders, which both backends accept, so one code path serves both and
//! the same test suite runs against each. Times are Unix milliseconds. One file per table group
//! under `store/`, each adding to `impl Store`.

use coderoom_authz::{audit, Approval, CapabilitySet, Grant, Participant, Role, RoomState};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Executor, Row};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;
// Storage's own bookkeeping columns (created_at, updated_at) read the system clock.
use crate::clock::system_now_ms as now_ms;

/// An enum stored (and shown) by name: each variant's text, `as_str`/`parse`, and its column
/// type, so rows read it typed and a name this build does not know reads as corrupt.
macro_rules! stored_enum {
    ($(#[$meta:meta])* $name:ident {
        $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub(crate) enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            pub(crate) fn parse(s: &str) -> Result<Self, StoreError> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(StoreError::Corrupt),
                }
            }
        }

        crate::ids::sql_text!($name, |v: &$name| v.as_str().to_owned(), |text: String| $name::parse(&text));
    };
}

mod accounts;
mod agents;
mod approvals;
mod audit_log;
mod changes;
mod checkpoints;
mod deletions;
mod docs;
mod leases;
mod log_writer;
mod previews;
mod repos;
mod rooms;
mod sandboxes;
mod secrets;
mod spend;
mod trash;

pub(crate) use accounts::{LoginCode, UserRow};
pub(crate) use agents::{AgentRow, AGENT_DOMAIN};
pub(crate) use changes::Change;
pub(crate) use checkpoints::{CheckpointPolicy, CheckpointRow};
pub(crate) use deletions::DeletionState;
pub(crate) use docs::StoredDoc;
pub(crate) use leases::{Claim, Lease, Owner, ServerId};
pub(crate) use log_writer::{LogTimes, MAX_COMMIT_GROUP};
pub(crate) use previews::{PreviewRow, PreviewState};
pub(crate) use repos::RepoRow;
pub(crate) use rooms::InviteRow;
pub(crate) use sandboxes::{SandboxRow, SandboxState};
pub(crate) use secrets::{SealedSecret, SecretRule};
pub(crate) use trash::TrashRow;

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");

static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

/// How long a pool waits for a free connection before the request fails (and `/healthz` says so).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// What an SQLite commit survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Power loss (`synchronous=FULL`): the default.
    PowerLoss,
    /// The process dying, not the machine (`synchronous=NORMAL`).
    Crash,
}

/// How a store is opened (`coderoom serve`'s flags): what a commit survives, and the levers the
/// benchmarks turn off one at a time to measure what each is worth (docs/benchmarks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    pub durability: Durability,
    /// SQLite's own WAL checkpoints, inside whichever commit crosses 1,000 pages, instead of
    /// the checkpointer's beside the commits (for the comparison only).
    pub inline_checkpoints: bool,
    /// Most rooms' batches one update-log transaction takes, within 1..=[`MAX_COMMIT_GROUP`]
    /// (1, for the comparison: a transaction per room's batch).
    pub max_commit_group: usize,
    /// Update-log rows appended by multi-row `INSERT`s (false, for the comparison: a statement
    /// per row inside a transaction).
    pub multi_row: bool,
    /// The update log written through a pool connection on the server's runtime, as on
    /// PostgreSQL, not by a thread of its own with its own connection (SQLite, for the
    /// comparison only).
    pub log_on_pool: bool,
    /// WAL frames past which the update log's writer finishes the checkpointer's passes (0:
    /// never; see [`WAL_RESTART_FRAMES`]).
    pub wal_restart_frames: i64,
}

/// WAL frames (pages) past which the update log's writer copies the rest of a checkpoint
/// itself, so the WAL starts over: 32 MiB of 4 KiB pages, half the WAL's size limit. Each such
/// copy holds the writer for a sync of the database file (1.4-1.7 ms here), so it is done once
/// the WAL is this large, not after every pass (10-11 times in a 30 s round of the 40-room
/// benchmark, whose writes grow the WAL by 14 MB a second).
pub(crate) const WAL_RESTART_FRAMES: i64 = 8192;

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::PowerLoss,
            inline_checkpoints: false,
            max_commit_group: MAX_COMMIT_GROUP,
            multi_row: true,
            log_on_pool: false,
            wal_restart_frames: WAL_RESTART_FRAMES,
        }
    }
}

/// Which database a URL points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("database URL must start with sqlite:// or postgres://")]
    UnsupportedUrl,
    #[error("database error")]
    Db(#[from] sqlx::Error),
    /// The update log's own SQLite connection (see `log_writer`).
    #[error("database error")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data is corrupt")]
    Corrupt,
    #[error("the change conflicts with another one")]
    Conflict,
    #[error("cannot create the database directory")]
    Io(#[from] std::io::Error),
    /// A write under a room's fencing token that is no longer current: another server owns
    /// the room now, and nothing of the write landed.
    #[error("another server owns the room now")]
    Fenced,
    /// A part of the store that serves every room (the update log's writer) has stopped.
    #[error("{0}")]
    Closed(&'static str),
    /// An audit record whose stored columns do not read as what they must be (tampering or
    /// damage), named by its chain and sequence number.
    #[error("audit chain {chain}: record {seq}: column `{column}` does not read: {problem}")]
    BadAuditRecord {
        chain: String,
        /// The record's sequence number, as stored (it may be the unreadable column).
        seq: String,
        column: &'static str,
        problem: String,
    },
}

/// A write transaction on `pool` (see [`Store::begin_write`]).
async fn begin_write(
    pool: &AnyPool,
    backend: Backend,
) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
    match backend {
        Backend::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
        Backend::Postgres => pool.begin().await,
    }
}

/// [`begin_write`] on a connection the caller keeps (the update log's writer).
async fn begin_write_on(
    conn: &mut sqlx::AnyConnection,
    backend: Backend,
) -> Result<sqlx::Transaction<'_, sqlx::Any>, sqlx::Error> {
    match backend {
        Backend::Sqlite => sqlx::Connection::begin_with(conn, "BEGIN IMMEDIATE").await,
        Backend::Postgres => sqlx::Connection::begin(conn).await,
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Store {
    pool: AnyPool,
    backend: Backend,
    options: Options,
    /// The SQLite database's file, for the update log's own connection (none on PostgreSQL,
    /// for a database in memory, or a URL with options of its own: see [`writer_file`]).
    sqlite_file: Option<std::path::PathBuf>,
    /// Resolves once the update log's writer has ended (set when it starts): [`Store::close`]
    /// waits for it, so a closed store writes nothing more and holds no connection.
    writer_ended: std::sync::Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>>,
    /// The one writer of every room's update log (group commit across rooms), started on the
    /// first append.
    appender: std::sync::Arc<std::sync::OnceLock<tokio::sync::mpsc::Sender<log_writer::Job>>>,
    /// Where the update log's writer reports its times, once the server says.
    log_times: std::sync::Arc<std::sync::OnceLock<log_writer::LogTimes>>,
    /// Cancelled by [`Store::close`]: the writer gives back the connection it keeps (closing
    /// the pool waits for every connection).
    closing: tokio_util::sync::CancellationToken,
    /// Set by the checkpointer after a pass that left the WAL over `wal_restart_frames` (SQLite,
    /// checkpoints beside the commits): the update log's writer then copies the rest, so the
    /// WAL starts over.
    wal_copied: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Store {
    /// Connects (creating the SQLite file and its directory when needed). Does not migrate.
    /// Every commit survives power loss.
    pub(crate) async fn connect(url: &str) -> Result<Self, StoreError> {
        Store::connect_with(url, Options::default()).await
    }

    /// [`Store::connect`], with the options asked for: the SQLite durability (PostgreSQL keeps
    /// its own `synchronous_commit`) and the comparison levers.
    pub(crate) async fn connect_with(url: &str, options: Options) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(StoreError::UnsupportedUrl);
        };
        let url = match backend {
            Backend::Sqlite => {
                if let Some(parent) = sqlite_path(url).and_then(|p| p.parent().map(Path::to_owned))
                {
                    if !parent.as_os_str().is_empty() {
                        std::fs::create_dir_all(parent)?;
                    }
                }
                if url.contains('?') {
                    url.to_owned()
                } else {
                    format!("{url}?mode=rwc")
                }
            }
            Backend::Postgres => url.to_owned(),
        };
        let connect = AnyConnectOptions::from_str(&url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(match backend {
                // SQLite serialises writers anyway; a few readers beside the writer suffice.
                Backend::Sqlite => 4,
                Backend::Postgres => 16,
            })
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // An SQLite connection is a file in this process: a ping finds nothing wrong, and
            // costs a round trip to the connection's worker thread before every query.
            .test_before_acquire(backend == Backend::Postgres)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        conn.execute(sqlite_pragmas(options).as_str()).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect)
            .await?;
        let wal_copied = (backend == Backend::Sqlite && !options.inline_checkpoints)
            .then(|| std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
        if let Some(copied) = &wal_copied {
            checkpointer(pool.clone(), copied.clone(), options.wal_restart_frames);
        }
        Ok(Store {
            pool,
            backend,
            options,
            sqlite_file: match backend {
                Backend::Sqlite => writer_file(&url),
                Backend::Postgres => None,
            },
            appender: Default::default(),
            writer_ended: Default::default(),
            log_times: Default::default(),
            closing: Default::default(),
            wal_copied,
        })
    }

    /// A write transaction. On SQLite it takes the write lock at once (`BEGIN IMMEDIATE`): a
    /// deferred transaction that reads and then writes fails with SQLITE_BUSY at once, without
    /// waiting, when another connection wrote in between.
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        begin_write(&self.pool, self.backend).await
    }

    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        match self.backend {
            Backend::Sqlite => SQLITE_MIGRATIONS.run(&self.pool).await?,
            Backend::Postgres => POSTGRES_MIGRATIONS.run(&self.pool).await?,
        }
        Ok(())
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes the store: the update log's writer ends (what it was writing lands; what comes
    /// after fails), then every pool connection.
    pub(crate) async fn close(&self) {
        self.closing.cancel();
        let ended = match self.writer_ended.lock() {
            Ok(mut e) => e.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(ended) = ended {
            // An error is the writer gone already.
            let _ = ended.await;
        }
        self.pool.close().await;
    }
}

/// The file the update log's writer opens beside the pool (as sqlx reads the URL): only for a
/// plain file URL. One with options of its own (`mode=memory`, `immutable`, `vfs`, ...) is
/// left to sqlx, whose connections honour them.
fn writer_file(url: &str) -> Option<std::path::PathBuf> {
    url.starts_with("sqlite:").then_some(())?;
    let query = url.split_once('?').map_or("", |(_, q)| q);
    if !matches!(query, "" | "mode=rwc" | "mode=rw") {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    let file = options.get_filename();
    // A database in memory is named `:memory:`, or a `file:` URI of sqlx's making.
    let named = file
        .to_str()
        .is_none_or(|f| f != ":memory:" && !f.starts_with("file:"));
    (named && !file.as_os_str().is_empty()).then(|| file.to_owned())
}

/// What every SQLite connection of a store is set up with.
fn sqlite_pragmas(options: Options) -> String {
    // WAL: readers never block the writer. synchronous=FULL: a committed batch survives power
    // loss too, and batching keeps the fsync count low. NORMAL (asked for): a commit survives
    // the process dying (kill -9), not the machine losing power; the WAL is synced at
    // checkpoints.
    let sync = match options.durability {
        Durability::PowerLoss => "FULL",
        Durability::Crash => "NORMAL",
    };
    // No checkpoint inside a commit (SQLite's default runs one in whichever commit crosses
    // 1,000 WAL pages, holding up that room's broadcast): the checkpointer runs them beside the
    // commits.
    let auto = if options.inline_checkpoints { 1000 } else { 0 };
    format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}; PRAGMA foreign_keys=ON; \
         PRAGMA busy_timeout=5000; PRAGMA wal_autocheckpoint={auto}; \
         PRAGMA journal_size_limit=67108864;"
    )
}

/// How often the WAL is checkpointed into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// Checkpoints SQLite's WAL beside the commits, never inside one: a passive checkpoint copies
/// what no reader still needs into the database (and syncs it) while the update log's writer
/// goes on appending. The WAL starts over only once a checkpoint has copied all of it, which one
/// running beside a busy writer never does (the WAL grew by 14 MB a second under the 40-room
/// benchmark, and every fsync wrote the grown file's metadata too): after a pass that leaves
/// the WAL over `restart_frames` frames, `copied` is set, and the writer copies the rest between
/// two of its groups (`log_writer`). Ends with the pool.
fn checkpointer(
    pool: AnyPool,
    copied: std::sync::Arc<std::sync::atomic::AtomicBool>,
    restart_frames: i64,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if pool.is_closed() {
                return;
            }
            // (busy, frames in the WAL, frames copied)
            match sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_one(&pool)
                .await
            {
                Ok((_, frames, _)) => {
                    if restart_frames > 0 && frames >= restart_frames {
                        copied.store(true, std::sync::atomic::Ordering::Release);
                    }
                }
                Err(e) => {
                    if pool.is_closed() {
                        return;
                    }
                    tracing::warn!(error = %e, "WAL checkpoint failed; trying again");
                }
            }
        }
    });
}

/// The file path of a `sqlite://` URL, when it names one.
fn sqlite_path(url: &str) -> Option<&Path> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next()?;
    (!path.is_empty() && path != ":memory:").then(|| Path::new(path))
}

/// A migrated store at `url` with one user, `u` (what rooms in tests are created by).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) async fn with_user(url: &str) -> Store {
    let store = Store::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("INSERT INTO users (id, email, created_at) VALUES ('u', 'u@example.com', 0)")
        .execute(&store.pool)
        .await
        .unwrap();
    store
}

/// A test of storage on each backend: `$name::sqlite` and `$name::postgres`, each running
/// `$run(url)` on a fresh database of its own. Without PostgreSQL
/// (`CODEROOM_TEST_POSTGRES_URL`) the `postgres` test reports itself skipped, never passes
/// silently (see `crate::test_skip`).
#[cfg(test)]
macro_rules! each_database {
    ($(#[$meta:meta])* $name:ident, $run:expr) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test]
            async fn sqlite() {
                let dir = tempfile::tempdir().unwrap();
                ($run)(format!("sqlite://{}/t.db", dir.path().display())).await;
            }

            #[tokio::test]
            async fn postgres() {
                let Some(db) = crate::store::PostgresDb::make().await else {
                    return;
                };
                ($run)(db.url.clone()).await;
                db.drop().await;
            }
        }
    };
}
#[cfg(test)]
pub(crate) use each_database;

/// A PostgreSQL database of a test's own, on the server `CODEROOM_TEST_POSTGRES_URL` names.
#[cfg(test)]
pub(crate) struct PostgresDb {
    pub(crate) url: String,
    name: String,
    root: Store,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
impl PostgresDb {
    /// A fresh database, or `None` after reporting the test skipped (no PostgreSQL).
    pub(crate) async fn make() -> Option<PostgresDb> {
        let Ok(admin) = std::env::var("CODEROOM_TEST_POSTGRES_URL") else {
            crate::test_skip::skip("POSTGRES", "CODEROOM_TEST_POSTGRES_URL is not set");
            return None;
        };
        let name = format!("coderoom_u_{}", uuid::Uuid::new_v4().simple());
        let root = Store::connect(&admin).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&root.pool)
            .await
            .unwrap();
        let base = admin.rsplit_once('/').unwrap().0;
        Some(PostgresDb {
            url: format!("{base}/{name}"),
            name,
            root,
        })
    }

    pub(crate) async fn drop(self) {
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&self.root.pool)
            .await
            .unwrap();
        self.root.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    each_database!(
        /// Ids and stored states bind and read as text on both backends.
        ids_and_stored_states_bind_and_read_as_text,
        |url: String| async move {
            let store = Store::connect(&url).await.unwrap();
            let room = crate::ids::RoomId::fresh();
            let read = |text: &'static str| {
                let pool = store.pool.clone();
                async move {
                    sqlx::query(&format!("SELECT CAST('{text}' AS TEXT) AS v"))
                        .fetch_one(&pool)
                        .await
                        .unwrap()
                }
            };
            let row = sqlx::query("SELECT CAST($1 AS TEXT) AS v")
                .bind(&room)
                .fetch_one(&store.pool)
                .await
                .unwrap();
            assert_eq!(row.try_get::<crate::ids::RoomId, _>("v").unwrap(), room);
            let row = sqlx::query("SELECT CAST($1 AS TEXT) AS v")
                .bind(PreviewState::PendingApproval)
                .fetch_one(&store.pool)
                .await
                .unwrap();
            assert_eq!(row.try_get::<String, _>("v").unwrap(), "pending_approval");
            let done = read("done").await.try_get::<DeletionState, _>("v");
            assert_eq!(done.unwrap(), DeletionState::Done);
            // A state this build does not know is an error, never a default.
            let unknown = read("paused").await.try_get::<PreviewState, _>("v");
            assert!(unknown.is_err(), "{unknown:?}");
            store.close().await;
        }
    );

    #[test]
    fn sqlite_paths() {
        assert_eq!(
            sqlite_path("sqlite://data/x.db"),
            Some(Path::new("data/x.db"))
        );
        assert_eq!(
            sqlite_path("sqlite:///tmp/x.db?mode=rwc"),
            Some(Path::new("/tmp/x.db"))
        );
        assert_eq!(sqlite_path("sqlite::memory:"), None);
    }

    /// The update log's own connection opens the file sqlx opens, and only for a plain file
    /// URL: a database in memory or one with options of its own is left to the pool.
    #[test]
    fn the_writer_opens_the_file_sqlx_opens() {
        let file = |url: &str| writer_file(url).map(|p| p.display().to_string());
        assert_eq!(file("sqlite://data/x.db").as_deref(), Some("data/x.db"));
        assert_eq!(
            file("sqlite:///tmp/x.db?mode=rwc").as_deref(),
            Some("/tmp/x.db")
        );
        assert_eq!(
            file("sqlite:///tmp/a%20b.db").as_deref(),
            Some("/tmp/a b.db")
        );
        assert_eq!(file("sqlite::memory:"), None);
        assert_eq!(file("sqlite:///tmp/x.db?mode=memory"), None);
        assert_eq!(file("sqlite:///tmp/x.db?immutable=true"), None);
        assert_eq!(file("postgres://u@localhost/db"), None);
    }

    /// Commits never checkpoint; the checkpointer does, beside them: what was committed
    /// reaches the database file within a moment.
    #[tokio::test]
    async fn the_wal_is_checkpointed_beside_the_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let store = Store::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        let auto: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(auto, 0, "no checkpoint inside a commit");
        sqlx::query("CREATE TABLE t (b BLOB)")
            .execute(&store.pool)
            .await
            .unwrap();
        for _ in 0..200 {
            sqlx::query("INSERT INTO t (b) VALUES (zeroblob(32768))")
                .execute(&store.pool)
                .await
                .unwrap();
        }
        // 6.4 MB committed: in the WAL first, in the database file after a checkpoint.
        let until = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let size = std::fs::metadata(&path).unwrap().len();
            if size > 6 << 20 {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "never checkpointed: {size} bytes"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        store.close().await;
    }

    /// Under appends that never pause, SQLite's WAL still starts over: the checkpointer's
    /// passes never copy all of it (frames land while they run), so the update log's writer
    /// copies the rest between two groups once the WAL is past `wal_restart_frames`. Each start
    /// over bumps the checkpoint sequence number in the WAL's header. The same with the log
    /// written through the pool (`serve --log-on-pool`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_starts_over_under_steady_appends() {
        for log_on_pool in [false, true] {
            wal_starts_over(Options {
                wal_restart_frames: 64,
                log_on_pool,
                ..Options::default()
            })
            .await;
        }
    }

    async fn wal_starts_over(options: Options) {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let store = Store::connect_with(&format!("sqlite://{}", path.display()), options)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        sqlx::query("INSERT INTO users (id, email, created_at) VALUES ('u', 'u@example.com', 0)")
            .execute(&store.pool)
            .await
            .unwrap();
        let me = ServerId {
            id: "t".into(),
            address: "http://t".into(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let appended = Arc::new(AtomicU64::new(0));
        let mut appenders = Vec::new();
        for i in 0..4 {
            let room = crate::ids::RoomId::known(format!("r{i}"));
            sqlx::query(
                "INSERT INTO rooms (id, name, created_by, created_at) VALUES ($1, $1, 'u', 0)",
            )
            .bind(&room)
            .execute(&store.pool)
            .await
            .unwrap();
            let Claim::Won(lease) = store.claim_room(&room, &me, 600_000).await.unwrap() else {
                panic!("not claimed")
            };
            let (store, stop, appended) = (store.clone(), stop.clone(), appended.clone());
            appenders.push(tokio::spawn(async move {
                let data = vec![7u8; 4096];
                let mut seq = 0;
                while !stop.load(Ordering::Acquire) {
                    seq += 1;
                    store
                        .append_updates(&room, lease, &[(seq, data.as_slice())])
                        .await
                        .unwrap();
                    appended.fetch_add(data.len() as u64, Ordering::AcqRel);
                }
            }));
        }
        let wal = dir.path().join("w.db-wal");
        // The WAL header's checkpoint sequence number (big-endian, bytes 12..16).
        let sequence = || {
            use std::io::Read;
            let mut head = [0u8; 16];
            std::fs::File::open(&wal).ok()?.read_exact(&mut head).ok()?;
            Some(u32::from_be_bytes([head[12], head[13], head[14], head[15]]))
        };
        let first = loop {
            if let Some(s) = sequence() {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let until = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let now = sequence().unwrap_or(first);
            if now.wrapping_sub(first) >= 3 {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "the WAL started over {} times in 60 s ({} MB appended, the WAL at {} bytes, \
                 {options:?})",
                now.wrapping_sub(first),
                appended.load(Ordering::Acquire) >> 20,
                std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.store(true, Ordering::Release);
        for a in appenders {
            a.await.unwrap();
        }
        store.close().await;
    }

    /// The value of `pragma` on a fresh SQLite store opened with `options`.
    async fn pragma_with(dir: &Path, options: Options, pragma: &str) -> i64 {
        let url = format!("sqlite://{}/{}.db", dir.display(), uuid::Uuid::new_v4());
        let store = Store::connect_with(&url, options).await.unwrap();
        let value: i64 = sqlx::query_scalar(&format!("PRAGMA {pragma}"))
            .fetch_one(&store.pool)
            .await
            .unwrap();
        store.close().await;
        value
    }

    /// The update log becomes one b-tree keyed by (room, seq) (migration 23) and keeps every
    /// row a database made before it held.
    #[tokio::test]
    async fn the_update_log_keeps_its_rows_when_it_loses_its_rowid() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db", dir.path().display());
        let store = Store::connect(&url).await.unwrap();
        let before: Vec<_> = SQLITE_MIGRATIONS
            .migrations
            .iter()
            .filter(|m| m.version < 23)
            .cloned()
            .collect();
        assert_eq!(before.len(), 22);
        let older = Migrator {
            migrations: std::borrow::Cow::Owned(before),
            ..Migrator::DEFAULT
        };
        older.run(&store.pool).await.unwrap();
        sqlx::query("INSERT INTO users (id, email, created_at) VALUES ('u', 'u@example.com', 0)")
            .execute(&store.pool)
            .await
            .unwrap();
        for room in ["a", "b"] {
            sqlx::query(
                "INSERT INTO rooms (id, name, created_by, created_at) VALUES ($1, $1, 'u', 0)",
            )
            .bind(room)
            .execute(&store.pool)
            .await
            .unwrap();
            for seq in 1..=3_i64 {
                sqlx::query("INSERT INTO doc_updates (room_id, seq, data) VALUES ($1, $2, $3)")
                    .bind(room)
                    .bind(seq)
                    .bind(format!("{room}{seq}").into_bytes())
                    .execute(&store.pool)
                    .await
                    .unwrap();
            }
        }
        store.migrate().await.unwrap();
        let ddl: String =
            sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'doc_updates'")
                .fetch_one(&store.pool)
                .await
                .unwrap();
        assert!(ddl.ends_with("WITHOUT ROWID"), "{ddl}");
        for room in ["a", "b"] {
            let doc = store
                .load_doc(&crate::ids::RoomId::known(room))
                .await
                .unwrap();
            let want: Vec<_> = (1..=3_i64)
                .map(|seq| (seq, format!("{room}{seq}").into_bytes()))
                .collect();
            assert_eq!(doc.updates, want);
        }
        store.close().await;
    }

    /// Power-loss durable by default; `synchronous=NORMAL` only when asked for.
    #[tokio::test]
    async fn sqlite_durability_is_what_was_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        for (durability, expected) in [(Durability::PowerLoss, 2i64), (Durability::Crash, 1)] {
            let options = Options {
                durability,
                ..Options::default()
            };
            let sync = pragma_with(dir.path(), options, "synchronous").await;
            assert_eq!(sync, expected, "{durability:?}");
        }
        let sync = pragma_with(dir.path(), Options::default(), "synchronous").await;
        assert_eq!(sync, 2, "FULL by default");
    }

    /// SQLite checkpoints its WAL inside commits only when the comparison asks for it
    /// (`serve --sqlite-inline-checkpoint`); by default the checkpointer does, beside them.
    #[tokio::test]
    async fn inline_checkpoints_only_when_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        for (inline_checkpoints, expected) in [(false, 0i64), (true, 1000)] {
            let options = Options {
                inline_checkpoints,
                ..Options::default()
            };
            let auto = pragma_with(dir.path(), options, "wal_autocheckpoint").await;
            assert_eq!(auto, expected, "inline_checkpoints: {inline_checkpoints}");
        }
    }
}

//! Durable state behind one sqlx `Any` pool, for SQLite (embedded default) and PostgreSQL.
//!
//! Queries use `$N` placeholders, which both backends accept, so one code path serves both and
//! the same test suite runs against each. Times are Unix milliseconds.

use coderoom_authz::{audit, Approval, CapabilitySet, Grant, Participant, Role, RoomState};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Executor, Row};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

/// How long a pool waits for a free connection before the request fails (and `/healthz` says so).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

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
    #[error("migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data is corrupt")]
    Corrupt,
    #[error("the change conflicts with another one")]
    Conflict,
    #[error("cannot create the database directory")]
    Io(#[from] std::io::Error),
}

/// A room's stored document: the snapshot (if any) and the log entries after it, in order.
#[derive(Debug, Default)]
pub(crate) struct StoredDoc {
    pub snapshot: Option<Vec<u8>>,
    pub snapshot_seq: i64,
    pub updates: Vec<(i64, Vec<u8>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoomRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParticipantRow {
    pub user_id: String,
    pub email: String,
    pub role: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserRow {
    pub id: String,
    pub email: String,
}

/// A live login code: only its hash is ever stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoginCode {
    pub code_hash: String,
    pub expires_at: i64,
    pub attempts: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct Store {
    pool: AnyPool,
    backend: Backend,
}

pub(crate) fn now_ms() -> i64 {
    crate::clock::system_now_ms()
}

impl Store {
    /// Connects (creating the SQLite file and its directory when needed). Does not migrate.
    pub(crate) async fn connect(url: &str) -> Result<Self, StoreError> {
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
        let options = AnyConnectOptions::from_str(&url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(match backend {
                // SQLite serialises writers anyway; a few readers beside the writer suffice.
                Backend::Sqlite => 4,
                Backend::Postgres => 16,
            })
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // WAL: readers never block the writer. synchronous=FULL: a committed
                        // batch survives power loss too, and batching keeps the fsync count low.
                        conn.execute(
                            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; \
                             PRAGMA foreign_keys=ON; PRAGMA busy_timeout=5000;",
                        )
                        .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        Ok(Store { pool, backend })
    }

    /// A write transaction. On SQLite it takes the write lock at once (`BEGIN IMMEDIATE`): a
    /// deferred transaction that reads and then writes fails with SQLITE_BUSY at once, without
    /// waiting, when another connection wrote in between.
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            Backend::Postgres => self.pool.begin().await,
        }
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

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }

    // ---- users and sessions ----

    pub(crate) async fn upsert_user(&self, id: &str, email: &str) -> Result<UserRow, StoreError> {
        sqlx::query(
            "INSERT INTO users (id, email, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (email) DO NOTHING",
        )
        .bind(id)
        .bind(email)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT id, email FROM users WHERE email = $1")
            .bind(email)
            .fetch_one(&self.pool)
            .await?;
        Ok(UserRow {
            id: row.try_get("id")?,
            email: row.try_get("email")?,
        })
    }

    pub(crate) async fn insert_session(
        &self,
        token_hash: &str,
        user_id: &str,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sessions (token_hash, user_id, created_at, expires_at, last_seen_at) \
             VALUES ($1, $2, $3, $4, $3)",
        )
        .bind(token_hash)
        .bind(user_id)
        .bind(now_ms())
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The user of an unexpired, recently used session; refreshes its last use (at most once a
    /// minute, so reads do not turn into a write per request).
    pub(crate) async fn live_session_user(
        &self,
        token_hash: &str,
        now: i64,
        idle_ms: i64,
    ) -> Result<Option<UserRow>, StoreError> {
        let row = sqlx::query(
            "SELECT u.id, u.email, s.last_seen_at FROM sessions s JOIN users u ON u.id = s.user_id \
             WHERE s.token_hash = $1 AND s.expires_at > $2 AND u.disabled_at IS NULL \
             AND s.last_seen_at > $3",
        )
        .bind(token_hash)
        .bind(now)
        .bind(now - idle_ms)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        let last: i64 = r.try_get("last_seen_at")?;
        if now - last > 60_000 {
            sqlx::query("UPDATE sessions SET last_seen_at = $1 WHERE token_hash = $2")
                .bind(now)
                .bind(token_hash)
                .execute(&self.pool)
                .await?;
        }
        Ok(Some(UserRow {
            id: r.try_get("id")?,
            email: r.try_get("email")?,
        }))
    }

    pub(crate) async fn delete_session(&self, token_hash: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sessions WHERE token_hash = $1")
            .bind(token_hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(crate) async fn user_disabled(&self, email: &str) -> Result<bool, StoreError> {
        let row =
            sqlx::query("SELECT 1 AS x FROM users WHERE email = $1 AND disabled_at IS NOT NULL")
                .bind(email)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.is_some())
    }

    // ---- login codes ----

    pub(crate) async fn recent_issuance(
        &self,
        email: &str,
        since: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let rows = sqlx::query("SELECT at FROM code_issuance WHERE email = $1 AND at > $2")
            .bind(email)
            .bind(since)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get("at"))
            .collect::<Result<_, _>>()?)
    }

    pub(crate) async fn record_issuance(&self, email: &str, at: i64) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        // History older than the longest cap window is of no use.
        sqlx::query("DELETE FROM code_issuance WHERE email = $1 AND at < $2")
            .bind(email)
            .bind(at - 3_600_000)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO code_issuance (email, at) VALUES ($1, $2)")
            .bind(email)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Stores the one live code for `email`, voiding any earlier one.
    pub(crate) async fn put_login_code(
        &self,
        email: &str,
        code_hash: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO login_codes (email, code_hash, created_at, expires_at, attempts) \
             VALUES ($1, $2, $3, $4, 0) ON CONFLICT (email) DO UPDATE SET \
             code_hash = excluded.code_hash, created_at = excluded.created_at, \
             expires_at = excluded.expires_at, attempts = 0",
        )
        .bind(email)
        .bind(code_hash)
        .bind(now)
        .bind(expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(crate) async fn login_code(&self, email: &str) -> Result<Option<LoginCode>, StoreError> {
        let row =
            sqlx::query("SELECT code_hash, expires_at, attempts FROM login_codes WHERE email = $1")
                .bind(email)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|r| {
            Ok(LoginCode {
                code_hash: r.try_get("code_hash")?,
                expires_at: r.try_get("expires_at")?,
                attempts: r.try_get("attempts")?,
            })
        })
        .transpose()
    }

    /// Spends one try of this exact code; false when none is left (or the code changed).
    pub(crate) async fn take_attempt(
        &self,
        email: &str,
        code_hash: &str,
        max: i64,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE login_codes SET attempts = attempts + 1 \
             WHERE email = $1 AND code_hash = $2 AND attempts < $3",
        )
        .bind(email)
        .bind(code_hash)
        .bind(max)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes this exact code; true for the one caller that deleted it.
    pub(crate) async fn void_login_code(
        &self,
        email: &str,
        code_hash: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM login_codes WHERE email = $1 AND code_hash = $2")
            .bind(email)
            .bind(code_hash)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records an authentication event. Never given a code or a token.
    pub(crate) async fn auth_event(
        &self,
        kind: &str,
        email: Option<&str>,
        user_id: Option<&str>,
        ip: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO auth_events (at, kind, email, user_id, ip) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(now_ms())
        .bind(kind)
        .bind(email)
        .bind(user_id)
        .bind(ip)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    // ---- authorization state ----

    /// The room's sandbox row, if it ever had a sandbox.
    pub(crate) async fn sandbox(&self, room_id: &str) -> Result<Option<SandboxRow>, StoreError> {
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
        room_id: &str,
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
        room_id: &str,
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
    pub(crate) async fn due_sandboxes(&self, now: i64) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT room_id FROM sandboxes WHERE stop_at IS NOT NULL AND stop_at <= $1 LIMIT 100",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get("room_id")?)).collect()
    }

    /// The room's participants with their grants.
    pub(crate) async fn room_state(&self, room_id: &str) -> Result<RoomState, StoreError> {
        let rows = sqlx::query(
            "SELECT user_id, role, extra, removed FROM participants WHERE room_id = $1",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        let mut state = RoomState::default();
        for r in rows {
            let user: String = r.try_get("user_id")?;
            let p = participant_from(
                &r.try_get::<String, _>("role")?,
                &r.try_get::<String, _>("extra")?,
                &r.try_get::<String, _>("removed")?,
            )?;
            state.participants.insert(user, p);
        }
        Ok(state)
    }

    /// Every audit chain id.
    pub(crate) async fn audit_chains(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT DISTINCT chain FROM audit_log ORDER BY chain")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get("chain"))
            .collect::<Result<_, _>>()?)
    }

    /// A chain's records, oldest first.
    pub(crate) async fn audit_records(
        &self,
        chain: &str,
    ) -> Result<Vec<audit::Record>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, at, actor, action, decision, reason, details, prev_hash, hash \
             FROM audit_log WHERE chain = $1 ORDER BY seq",
        )
        .bind(chain)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(audit::Record {
                    seq: r.try_get("seq")?,
                    fields: audit::Fields {
                        at: r.try_get("at")?,
                        actor: r.try_get("actor")?,
                        action: r.try_get("action")?,
                        decision: r.try_get("decision")?,
                        reason: r.try_get("reason")?,
                        details: r.try_get("details")?,
                    },
                    prev_hash: r.try_get("prev_hash")?,
                    hash: r.try_get("hash")?,
                })
            })
            .collect()
    }

    /// Applies `change` and appends its audit record to `chain`, in one transaction.
    pub(crate) async fn record(
        &self,
        chain: &str,
        fields: audit::Fields,
        change: &Change,
    ) -> Result<audit::Record, StoreError> {
        let mut tx = self.begin_write().await?;
        apply_change(&mut tx, change).await?;
        let head = sqlx::query(
            "SELECT seq, hash FROM audit_log WHERE chain = $1 ORDER BY seq DESC LIMIT 1",
        )
        .bind(chain)
        .fetch_optional(&mut *tx)
        .await?;
        let head = match head {
            Some(r) => Some((r.try_get::<i64, _>("seq")?, r.try_get::<String, _>("hash")?)),
            None => None,
        };
        let rec = audit::seal(chain, head.as_ref().map(|(s, h)| (*s, h.as_str())), fields);
        sqlx::query(
            "INSERT INTO audit_log (chain, seq, at, actor, action, decision, reason, details, prev_hash, hash) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(chain)
        .bind(rec.seq)
        .bind(rec.fields.at)
        .bind(&rec.fields.actor)
        .bind(&rec.fields.action)
        .bind(&rec.fields.decision)
        .bind(&rec.fields.reason)
        .bind(&rec.fields.details)
        .bind(&rec.prev_hash)
        .bind(&rec.hash)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rec)
    }

    pub(crate) async fn invite(&self, token_hash: &str) -> Result<Option<InviteRow>, StoreError> {
        let row = sqlx::query(
            "SELECT room_id, role, created_by, expires_at, max_uses, uses, revoked_at \
             FROM invites WHERE token_hash = $1",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(InviteRow {
                room_id: r.try_get("room_id")?,
                role: r.try_get("role")?,
                created_by: r.try_get("created_by")?,
                expires_at: r.try_get("expires_at")?,
                max_uses: r.try_get("max_uses")?,
                uses: r.try_get("uses")?,
                revoked: r.try_get::<Option<i64>, _>("revoked_at")?.is_some(),
            })
        })
        .transpose()
    }

    // ---- approvals ----

    pub(crate) async fn approval(
        &self,
        room_id: &str,
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
        room_id: &str,
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

    // ---- deletions ----

    /// The deletion of `room_id` in progress or pending, if any.
    pub(crate) async fn open_deletion(
        &self,
        room_id: &str,
    ) -> Result<Option<DeletionRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, room_id, state, requested_by, receipt FROM deletions \
             WHERE room_id = $1 AND state <> 'done' ORDER BY requested_at LIMIT 1",
        )
        .bind(room_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(deletion_row).transpose()
    }

    pub(crate) async fn deletion(&self, id: &str) -> Result<Option<DeletionRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, room_id, state, requested_by, receipt FROM deletions WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(deletion_row).transpose()
    }

    /// Deletions confirmed but not finished (a crash interrupted them).
    pub(crate) async fn unfinished_deletions(&self) -> Result<Vec<DeletionRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, room_id, state, requested_by, receipt FROM deletions WHERE state = 'confirmed'",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(deletion_row).collect()
    }

    pub(crate) async fn confirm_deletion(&self, id: &str, by: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE deletions SET state = 'confirmed', confirmed_by = $1, confirmed_at = $2 \
             WHERE id = $3 AND state = 'pending_confirmation'",
        )
        .bind(by)
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
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
        room_id: &str,
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

    // ---- rooms ----

    pub(crate) async fn rooms_of(&self, user_id: &str) -> Result<Vec<RoomRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT r.id, r.name, r.created_at FROM rooms r \
             JOIN participants p ON p.room_id = r.id WHERE p.user_id = $1 \
             ORDER BY r.created_at, r.id",
        )
        .bind(user_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(room_row).collect()
    }

    pub(crate) async fn room(&self, id: &str) -> Result<Option<RoomRow>, StoreError> {
        let row = sqlx::query("SELECT id, name, created_at FROM rooms WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(room_row).transpose()
    }

    pub(crate) async fn participants(
        &self,
        room_id: &str,
    ) -> Result<Vec<ParticipantRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT p.user_id, u.email, p.role FROM participants p \
             JOIN users u ON u.id = p.user_id WHERE p.room_id = $1 ORDER BY p.created_at, u.email",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ParticipantRow {
                    user_id: r.try_get("user_id")?,
                    email: r.try_get("email")?,
                    role: r.try_get("role")?,
                })
            })
            .collect()
    }

    // ---- document log ----

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
        sqlx::query("DELETE FROM doc_updates WHERE room_id = $1 AND seq <= $2")
            .bind(room_id)
            .bind(upto_seq)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// A state change recorded together with its audit record.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    /// Only the audit record (a denial, or an action with no stored effect).
    None,
    /// Store a participant's rights (insert or replace).
    SetParticipant {
        room_id: String,
        user_id: String,
        participant: Participant,
    },
    RemoveParticipant {
        room_id: String,
        user_id: String,
        now: i64,
    },
    CreateInvite {
        token_hash: String,
        room_id: String,
        role: String,
        created_by: String,
        expires_at: i64,
        max_uses: i64,
    },
    /// Spend one use of an invite and add its participant (unless already one).
    AcceptInvite {
        token_hash: String,
        room_id: String,
        user_id: String,
        participant: Participant,
        now: i64,
    },
    RevokeInvite {
        token_hash: String,
        now: i64,
    },
    /// A new room and its owner.
    CreateRoom {
        id: String,
        name: String,
        owner: String,
    },
    /// A pending deletion request.
    CreateDeletion {
        id: String,
        room_id: String,
        requested_by: String,
    },
    CreateApproval {
        id: String,
        room_id: String,
        requester: String,
        action: String,
        params: String,
        expires_at: i64,
    },
    /// Records a decision on a request nobody decided yet.
    DecideApproval {
        id: String,
        by: String,
        approved: bool,
    },
    /// Spends an approved request (single use).
    UseApproval {
        id: String,
    },
    /// A sandbox lifecycle transition: the room's whole sandbox row afterwards.
    SandboxState {
        room_id: String,
        row: SandboxRow,
    },
}

/// Where a room's sandbox is in its lifecycle (stored and shown by these names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SandboxState {
    /// Never started.
    #[default]
    Absent,
    Running,
    /// Snapshotted and stopped at a server shutdown; resumes on first need.
    Suspended,
    Stopped,
    /// Failed (OOM, killed agent...); waits for an explicit restart.
    Failed,
}

impl SandboxState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SandboxState::Absent => "absent",
            SandboxState::Running => "running",
            SandboxState::Suspended => "suspended",
            SandboxState::Stopped => "stopped",
            SandboxState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "absent" => SandboxState::Absent,
            "running" => SandboxState::Running,
            "suspended" => SandboxState::Suspended,
            "stopped" => SandboxState::Stopped,
            "failed" => SandboxState::Failed,
            _ => return Err(StoreError::Corrupt),
        })
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

#[derive(Debug, Clone)]
pub(crate) struct InviteRow {
    pub room_id: String,
    pub role: String,
    pub created_by: String,
    pub expires_at: i64,
    pub max_uses: i64,
    pub uses: i64,
    pub revoked: bool,
}

async fn apply_change(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    change: &Change,
) -> Result<(), StoreError> {
    match change {
        Change::None => {}
        Change::SetParticipant {
            room_id,
            user_id,
            participant,
        } => {
            // Only an existing participant changes; a removal is never undone by a change.
            let (role, extra, removed) = participant_columns(participant);
            let done = sqlx::query(
                "UPDATE participants SET role = $1, extra = $2, removed = $3 \
                 WHERE room_id = $4 AND user_id = $5",
            )
            .bind(role)
            .bind(extra)
            .bind(removed)
            .bind(room_id)
            .bind(user_id)
            .execute(&mut **tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::RemoveParticipant {
            room_id,
            user_id,
            now,
        } => {
            sqlx::query("DELETE FROM participants WHERE room_id = $1 AND user_id = $2")
                .bind(room_id)
                .bind(user_id)
                .execute(&mut **tx)
                .await?;
            sqlx::query(
                "INSERT INTO removals (room_id, user_id, at) VALUES ($1, $2, $3) \
                 ON CONFLICT (room_id, user_id) DO UPDATE SET at = excluded.at",
            )
            .bind(room_id)
            .bind(user_id)
            .bind(*now)
            .execute(&mut **tx)
            .await?;
        }
        Change::CreateInvite {
            token_hash,
            room_id,
            role,
            created_by,
            expires_at,
            max_uses,
        } => {
            sqlx::query(
                "INSERT INTO invites (token_hash, room_id, role, created_by, created_at, expires_at, max_uses) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(token_hash)
            .bind(room_id)
            .bind(role)
            .bind(created_by)
            .bind(now_ms())
            .bind(expires_at)
            .bind(max_uses)
            .execute(&mut **tx)
            .await?;
        }
        Change::AcceptInvite {
            token_hash,
            room_id,
            user_id,
            participant,
            now,
        } => {
            let used = sqlx::query(
                "UPDATE invites SET uses = uses + 1 WHERE token_hash = $1 AND uses < max_uses \
                 AND revoked_at IS NULL AND expires_at > $2 AND NOT EXISTS (SELECT 1 FROM removals r \
                 WHERE r.room_id = invites.room_id AND r.user_id = $3 AND r.at >= invites.created_at)",
            )
            .bind(token_hash)
            .bind(*now)
            .bind(user_id)
            .execute(&mut **tx)
            .await?;
            if used.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
            let (role, extra, removed) = participant_columns(participant);
            sqlx::query(
                "INSERT INTO participants (room_id, user_id, role, created_at, extra, removed) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (room_id, user_id) DO NOTHING",
            )
            .bind(room_id)
            .bind(user_id)
            .bind(role)
            .bind(*now)
            .bind(extra)
            .bind(removed)
            .execute(&mut **tx)
            .await?;
        }
        Change::CreateRoom { id, name, owner } => {
            let now = now_ms();
            sqlx::query(
                "INSERT INTO rooms (id, name, created_by, created_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(id)
            .bind(name)
            .bind(owner)
            .bind(now)
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "INSERT INTO participants (room_id, user_id, role, created_at) VALUES ($1, $2, 'owner', $3)",
            )
            .bind(id)
            .bind(owner)
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
        Change::CreateDeletion {
            id,
            room_id,
            requested_by,
        } => {
            sqlx::query(
                "INSERT INTO deletions (id, room_id, requested_by, requested_at, state) \
                 VALUES ($1, $2, $3, $4, 'pending_confirmation')",
            )
            .bind(id)
            .bind(room_id)
            .bind(requested_by)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        }
        Change::CreateApproval {
            id,
            room_id,
            requester,
            action,
            params,
            expires_at,
        } => {
            sqlx::query(
                "INSERT INTO approvals (id, room_id, requester, action, params, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id)
            .bind(room_id)
            .bind(requester)
            .bind(action)
            .bind(params)
            .bind(now_ms())
            .bind(*expires_at)
            .execute(&mut **tx)
            .await?;
        }
        Change::DecideApproval { id, by, approved } => {
            let done = sqlx::query(
                "UPDATE approvals SET decided_by = $1, decided_at = $2, approved = $3 \
                 WHERE id = $4 AND decided_by IS NULL",
            )
            .bind(by)
            .bind(now_ms())
            .bind(i64::from(*approved))
            .bind(id)
            .execute(&mut **tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::SandboxState { room_id, row } => {
            sqlx::query(
                "INSERT INTO sandboxes (room_id, state, reason, receipt, snapshot, snapshot_at, stop_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (room_id) DO UPDATE SET state = excluded.state, reason = excluded.reason, \
                 receipt = excluded.receipt, snapshot = excluded.snapshot, snapshot_at = excluded.snapshot_at, \
                 stop_at = excluded.stop_at, updated_at = excluded.updated_at",
            )
            .bind(room_id)
            .bind(row.state.as_str())
            .bind(&row.reason)
            .bind(&row.receipt)
            .bind(row.snapshot.clone())
            .bind(row.snapshot_at)
            .bind(row.stop_at)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        }
        Change::UseApproval { id } => {
            let done = sqlx::query(
                "UPDATE approvals SET used_at = $1 WHERE id = $2 AND approved = 1 AND used_at IS NULL",
            )
            .bind(now_ms())
            .bind(id)
            .execute(&mut **tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::RevokeInvite { token_hash, now } => {
            sqlx::query(
                "UPDATE invites SET revoked_at = $1 WHERE token_hash = $2 AND revoked_at IS NULL",
            )
            .bind(*now)
            .bind(token_hash)
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(())
}

fn participant_columns(p: &Participant) -> (&'static str, String, String) {
    let extra: Vec<serde_json::Value> = p
        .extra
        .iter()
        .map(|g| serde_json::json!({ "capability": g.capability.as_str(), "expires_at": g.expires_at }))
        .collect();
    (
        p.role.as_str(),
        serde_json::Value::Array(extra).to_string(),
        p.removed.names().join(","),
    )
}

fn participant_from(role: &str, extra: &str, removed: &str) -> Result<Participant, StoreError> {
    let role: Role = role.parse().map_err(|_| StoreError::Corrupt)?;
    let extra: Vec<serde_json::Value> =
        serde_json::from_str(extra).map_err(|_| StoreError::Corrupt)?;
    let extra = extra
        .iter()
        .map(|g| {
            let capability = g["capability"]
                .as_str()
                .and_then(|c| c.parse().ok())
                .ok_or(StoreError::Corrupt)?;
            Ok(Grant {
                capability,
                expires_at: g["expires_at"].as_i64(),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let names: Vec<&str> = removed.split(',').filter(|n| !n.is_empty()).collect();
    let removed = CapabilitySet::parse_names(&names).map_err(|_| StoreError::Corrupt)?;
    Ok(Participant {
        role,
        extra,
        removed,
    })
}

fn approval_row(r: &sqlx::any::AnyRow) -> Result<Approval, StoreError> {
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

#[derive(Debug, Clone)]
pub(crate) struct DeletionRow {
    pub id: String,
    pub room_id: String,
    pub state: String,
    pub requested_by: String,
    pub receipt: Option<String>,
}

fn deletion_row(r: &sqlx::any::AnyRow) -> Result<DeletionRow, StoreError> {
    Ok(DeletionRow {
        id: r.try_get("id")?,
        room_id: r.try_get("room_id")?,
        state: r.try_get("state")?,
        requested_by: r.try_get("requested_by")?,
        receipt: r.try_get("receipt")?,
    })
}

fn room_row(r: &sqlx::any::AnyRow) -> Result<RoomRow, StoreError> {
    Ok(RoomRow {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        created_at: r.try_get("created_at")?,
    })
}

/// The file path of a `sqlite://` URL, when it names one.
fn sqlite_path(url: &str) -> Option<&Path> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next()?;
    (!path.is_empty() && path != ":memory:").then(|| Path::new(path))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

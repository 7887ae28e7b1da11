//! Users, sessions, login codes and the record of login events.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct UserRow {
    pub id: String,
    pub email: String,
}

/// An account as the admin console lists it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct AdminUserRow {
    pub id: String,
    pub email: String,
    pub created_at: i64,
    /// When its newest session began (`None`: no session left).
    pub last_login: Option<i64>,
    /// When an admin revoked it everywhere (`None`: it may log in).
    pub revoked_at: Option<i64>,
}

/// A live login code: only its hash is ever stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct LoginCode {
    pub code_hash: String,
    pub expires_at: i64,
    pub attempts: i64,
}

impl Store {
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
        Ok(
            sqlx::query_as::<_, UserRow>("SELECT id, email FROM users WHERE email = $1")
                .bind(email)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The name `id` chose to be shown by, if they did (and exist).
    pub(crate) async fn display_name(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT display_name FROM users WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => r.try_get::<Option<String>, _>("display_name")?,
            None => None,
        })
    }

    /// Sets (or, with `None`, clears) the name `id` is shown by.
    pub(crate) async fn set_display_name(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE users SET display_name = $1 WHERE id = $2")
            .bind(name)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether an account other than `id` is shown by `name` (any case).
    pub(crate) async fn display_name_taken(
        &self,
        id: &str,
        name: &str,
    ) -> Result<bool, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n FROM users WHERE LOWER(display_name) = LOWER($1) AND id != $2",
        )
        .bind(name)
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>("n")? > 0)
    }

    /// The email of the user with `id`, if there is one.
    pub(crate) async fn user_email(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar::<_, String>("SELECT email FROM users WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
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

    /// Accounts for the admin console: those whose email contains `q` (all when empty), by
    /// email, at most `limit`, each with when it last logged in (its newest session's start).
    pub(crate) async fn users_matching(
        &self,
        q: &str,
        limit: i64,
    ) -> Result<Vec<AdminUserRow>, StoreError> {
        Ok(sqlx::query_as::<_, AdminUserRow>(
            "SELECT u.id, u.email, u.created_at, u.disabled_at AS revoked_at, \
             (SELECT MAX(s.created_at) FROM sessions s WHERE s.user_id = u.id) AS last_login \
             FROM users u WHERE LOWER(u.email) LIKE $1 ESCAPE '\\' ORDER BY u.email LIMIT $2",
        )
        .bind(contains_pattern(q))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The rooms of every account whose email contains `q` (as [`Store::users_matching`]):
    /// (user id, room id, room name, role), oldest room first. One query for the whole list.
    pub(crate) async fn memberships_matching(
        &self,
        q: &str,
    ) -> Result<Vec<(String, String, String, String)>, StoreError> {
        Ok(sqlx::query_as::<_, (String, String, String, String)>(
            "SELECT p.user_id, r.id, r.name, p.role FROM participants p \
             JOIN rooms r ON r.id = p.room_id JOIN users u ON u.id = p.user_id \
             WHERE LOWER(u.email) LIKE $1 ESCAPE '\\' ORDER BY r.created_at, r.id",
        )
        .bind(contains_pattern(q))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Ends every session of `user_id`; returns their hashes (their sockets close on them).
    pub(crate) async fn delete_sessions_of(
        &self,
        user_id: &str,
    ) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("DELETE FROM sessions WHERE user_id = $1 RETURNING token_hash")
            .bind(user_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("token_hash")?))
            .collect()
    }

    /// Whether the session `token_hash` still exists (not logged out, not ended by an admin).
    pub(crate) async fn session_exists(&self, token_hash: &str) -> Result<bool, StoreError> {
        Ok(
            sqlx::query("SELECT 1 AS one FROM sessions WHERE token_hash = $1")
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await?
                .is_some(),
        )
    }

    /// Says `payload` on PostgreSQL's notification channel `channel` (every server listening
    /// on it hears it).
    pub(crate) async fn notify(&self, channel: &str, payload: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
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
        Ok(sqlx::query_as::<_, LoginCode>(
            "SELECT code_hash, expires_at, attempts FROM login_codes WHERE email = $1",
        )
        .bind(email)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Spends one try of this exact code and returns how many are spent now (this one
    /// included), or `None` when none is left (or the code changed). Concurrent callers each get
    /// their own count, so exactly one of them sees the last try.
    pub(crate) async fn take_attempt(
        &self,
        email: &str,
        code_hash: &str,
        max: i64,
    ) -> Result<Option<i64>, StoreError> {
        Ok(sqlx::query_scalar::<_, i64>(
            "UPDATE login_codes SET attempts = attempts + 1 \
             WHERE email = $1 AND code_hash = $2 AND attempts < $3 RETURNING attempts",
        )
        .bind(email)
        .bind(code_hash)
        .bind(max)
        .fetch_optional(&self.pool)
        .await?)
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
}

/// A LIKE pattern for emails containing `q`, any case, its `%`, `_` and `\\` taken literally.
fn contains_pattern(q: &str) -> String {
    let q = q
        .to_lowercase()
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    format!("%{q}%")
}

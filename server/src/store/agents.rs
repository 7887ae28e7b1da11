//! Agents: participants sponsored by a person (see `crate::http::agents`).

use super::*;
use crate::ids::{RoomId, UserId};
use coderoom_authz::{Agent, CapabilitySet};

/// The domain of agents' own user rows: never a mailbox, never able to log in.
pub(crate) const AGENT_DOMAIN: &str = "agents.invalid";

/// An agent, as stored and listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct AgentRow {
    /// Its user id (the actor of everything it does).
    pub agent_id: UserId,
    #[serde(skip)]
    pub room_id: RoomId,
    pub name: String,
    /// Who brought it in.
    pub sponsor: UserId,
    /// What it was given (it holds no more than its sponsor holds now).
    pub capabilities: Vec<String>,
    pub budget: serde_json::Value,
    pub created_at: i64,
    pub expires_at: i64,
    pub revoked_at: Option<i64>,
    /// Each command it runs waits for someone's approval.
    pub approval_mode: bool,
}

impl AgentRow {
    /// Its entry in the room's authorization state.
    pub(crate) fn agent(&self) -> Agent {
        Agent {
            sponsor: self.sponsor.to_string(),
            capabilities: CapabilitySet::parse_names(&self.capabilities).unwrap_or_default(),
            expires_at: self.expires_at,
            approval_mode: self.approval_mode,
        }
    }
}

fn row_of(r: &sqlx::any::AnyRow) -> Result<AgentRow, StoreError> {
    let caps: String = r.try_get("capabilities")?;
    let budget: String = r.try_get("budget")?;
    Ok(AgentRow {
        agent_id: r.try_get("user_id")?,
        room_id: r.try_get("room_id")?,
        name: r.try_get("name")?,
        sponsor: r.try_get("sponsor")?,
        capabilities: serde_json::from_str(&caps).map_err(|_| StoreError::Corrupt)?,
        budget: serde_json::from_str(&budget).map_err(|_| StoreError::Corrupt)?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        revoked_at: r.try_get("revoked_at")?,
        approval_mode: r.try_get::<i64, _>("approval_mode")? != 0,
    })
}

const COLUMNS: &str = "user_id, room_id, name, sponsor, capabilities, budget, created_at, \
                       expires_at, revoked_at, approval_mode";

impl Store {
    /// The room's agents (revoked ones included), oldest first.
    pub(crate) async fn agents(&self, room_id: &RoomId) -> Result<Vec<AgentRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM agents WHERE room_id = $1 ORDER BY created_at, user_id"
        ))
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_of).collect()
    }

    /// An agent by its user id, whatever its room.
    pub(crate) async fn agent(&self, user_id: &str) -> Result<Option<AgentRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM agents WHERE user_id = $1"))
            .bind(user_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(row_of).transpose()
    }

    /// The room's live agents, for its authorization state.
    pub(super) async fn live_agents(
        &self,
        room_id: &RoomId,
    ) -> Result<Vec<(String, Agent)>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM agents WHERE room_id = $1 AND revoked_at IS NULL"
        ))
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| row_of(r).map(|a| (a.agent_id.to_string(), a.agent())))
            .collect()
    }
}

/// A new agent: its user, its row and its token's session, in one transaction.
pub(super) async fn insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    a: &AgentRow,
    token_hash: &str,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO users (id, email, created_at) VALUES ($1, $2, $3)")
        .bind(&a.agent_id)
        .bind(format!("agent-{}@{AGENT_DOMAIN}", a.agent_id))
        .bind(a.created_at)
        .execute(&mut **tx)
        .await?;
    sqlx::query(&format!(
        "INSERT INTO agents ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, $9)"
    ))
    .bind(&a.agent_id)
    .bind(&a.room_id)
    .bind(&a.name)
    .bind(&a.sponsor)
    .bind(serde_json::to_string(&a.capabilities).map_err(|_| StoreError::Corrupt)?)
    .bind(a.budget.to_string())
    .bind(a.created_at)
    .bind(a.expires_at)
    .bind(i64::from(a.approval_mode))
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO sessions (token_hash, user_id, created_at, expires_at, last_seen_at) \
         VALUES ($1, $2, $3, $4, $3)",
    )
    .bind(token_hash)
    .bind(&a.agent_id)
    .bind(a.created_at)
    .bind(a.expires_at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Ends agents: those `which` selects (`user_id = $2` or `sponsor = $2`) in room `$1`, still
/// live: revoked at `now`, their tokens gone.
pub(super) async fn revoke(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    room_id: &RoomId,
    column: &str,
    who: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "DELETE FROM sessions WHERE user_id IN (SELECT user_id FROM agents \
         WHERE room_id = $1 AND {column} = $2 AND revoked_at IS NULL)"
    ))
    .bind(room_id)
    .bind(who)
    .execute(&mut **tx)
    .await?;
    sqlx::query(&format!(
        "UPDATE agents SET revoked_at = $3 WHERE room_id = $1 AND {column} = $2 \
         AND revoked_at IS NULL"
    ))
    .bind(room_id)
    .bind(who)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

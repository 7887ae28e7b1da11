//! Agents as participants: brought in by someone who holds `invite` (who becomes its
//! sponsor), holding what it was given that its sponsor holds at that moment (the authorization
//! layer intersects them on every decision), ending with its sponsor's removal, bound to its
//! room; revoked by its sponsor, or by anyone who holds `revoke`.

use crate::ids::{RoomId, UserId};
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops};
use crate::store::{AgentRow, Change};
use coderoom_authz::{Action, Capability, CapabilitySet};
use serde_json::{json, Value};

/// Longest an agent may live.
const MAX_TTL_S: i64 = 30 * 24 * 3600;
/// Agents one room may have had (revoked ones included).
const MAX_AGENTS: usize = 100;

/// An agent as asked for (the body of `POST .../agents`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewAgent {
    pub(crate) name: String,
    pub(crate) capabilities: Vec<String>,
    #[serde(default)]
    pub(crate) budget: Option<Value>,
    pub(crate) ttl_s: i64,
    /// Each command it runs waits for someone's approval of exactly that command.
    #[serde(default)]
    pub(crate) approval_mode: bool,
}

/// An agent's budget cannot cap sandbox time: that is the room's (charged to its sandbox, not
/// to whoever started it).
pub(crate) fn agent_budget(b: &crate::spend::Budget) -> Result<(), OpError> {
    if b.limit(crate::spend::Meter::SandboxSeconds).is_some() {
        return Err(OpError::Bad(
            "an agent's budget cannot hold sandbox_seconds: sandbox time is the room's budget",
        ));
    }
    Ok(())
}

impl Ops {
    /// Brings an agent into the room, sponsored by `actor`: the agent, and its token (shown
    /// this once; stored hashed).
    pub(crate) async fn create_agent(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        new: NewAgent,
    ) -> Result<(AgentRow, String), OpError> {
        let name = new.name.trim();
        if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
            return Err(OpError::Bad(
                "name is 1 to 64 characters, none of them control characters",
            ));
        }
        if !(60..=MAX_TTL_S).contains(&new.ttl_s) {
            return Err(OpError::Bad("ttl_s must be from 60 to 2592000 (30 days)"));
        }
        let given = CapabilitySet::parse_names(&new.capabilities)
            .map_err(|e| OpError::Invalid(e.to_string()))?;
        if !given.contains(Capability::Observe) {
            return Err(OpError::Bad("an agent needs observe"));
        }
        // Limits per meter (`crate::spend`): what the agent may use, whatever the room has left.
        let budget = crate::spend::Budget::parse(&new.budget.unwrap_or(Value::Null))
            .map_err(|e| OpError::Invalid(e.0))?;
        agent_budget(&budget)?;
        let budget = budget.to_json();
        let details = json!({
            "name": name,
            "capabilities": given.names(),
            "ttl_s": new.ttl_s,
            "approval_mode": new.approval_mode,
        });
        // Bringing an agent in is inviting it: `invite`, and nothing beyond what the sponsor
        // holds.
        let proof = self
            .authorize(
                room_id,
                actor,
                Action::CreateInvite { grants: given },
                details.clone(),
            )
            .await?;
        if self.store.agents(room_id).await?.len() >= MAX_AGENTS {
            return Err(OpError::Invalid(format!(
                "a room has at most {MAX_AGENTS} agents"
            )));
        }
        let now = self.now_ms();
        let token = crate::accounts::sessions::fresh_token();
        let agent = AgentRow {
            agent_id: UserId::fresh(),
            room_id: room_id.clone(),
            name: name.to_owned(),
            sponsor: UserId::known(proof.actor()),
            capabilities: given.names().into_iter().map(str::to_owned).collect(),
            budget,
            created_at: now,
            expires_at: now + new.ttl_s * 1000,
            revoked_at: None,
            approval_mode: new.approval_mode,
        };
        let mut details = details;
        details["agent_id"] = json!(agent.agent_id);
        let change = Change::CreateAgent {
            agent: agent.clone(),
            token_hash: crate::accounts::sessions::hash_token(&token),
        };
        let entry = Entry::act(Act::CreateAgent, Verdict::Allow, details);
        self.record(room_id, proof.actor(), entry, change).await?;
        Ok((agent, token))
    }

    /// Revokes agent `agent_id` of the room as `actor` (its sponsor always may; anyone else
    /// needs `revoke`); its sockets follow at once.
    pub(crate) async fn revoke_agent(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        agent_id: &str,
    ) -> Result<(), OpError> {
        let agent = match self.store.agent(agent_id).await? {
            Some(a) if a.room_id == room_id.as_str() && a.revoked_at.is_none() => a,
            _ => return Err(OpError::NotFound),
        };
        let details = json!({ "agent_id": agent.agent_id, "name": agent.name });
        let need = if agent.sponsor == actor.id {
            Capability::Observe
        } else {
            Capability::Revoke
        };
        let proof = self
            .authorize(room_id, actor, Action::Use(need), details.clone())
            .await?;
        let change = Change::RevokeAgent {
            room_id: room_id.clone(),
            agent_id: agent.agent_id.clone(),
            now: self.now_ms(),
        };
        let entry = Entry::act(Act::RevokeAgent, Verdict::Allow, details);
        self.record(room_id, proof.actor(), entry, change).await?;
        self.agents_changed(room_id, &[agent.agent_id.to_string()])
            .await;
        Ok(())
    }

    /// The agents `sponsor` brought into the room (live or just ended).
    pub(crate) async fn sponsored_by(&self, room_id: &RoomId, sponsor: &str) -> Vec<String> {
        self.store
            .agents(room_id)
            .await
            .map(|all| {
                all.into_iter()
                    .filter(|a| a.sponsor == sponsor)
                    .map(|a| a.agent_id.to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Tells the room and the sockets that `agents`' rights changed (their sponsor's did, or
    /// they ended): open connections follow at once, as for people.
    pub(crate) async fn agents_changed(&self, room_id: &RoomId, agents: &[String]) {
        for agent in agents {
            crate::ops::events::access_changed(self, room_id.clone(), agent.clone(), None).await;
        }
        crate::ops::events::refresh_rights(self, room_id, agents).await;
    }
}

//! Agents as participants: `POST /api/rooms/{id}/agents` `{"name", "capabilities", "budget",
//! "ttl_s"}` (needs `invite`; the caller becomes the sponsor) answers the agent's token once.
//! An agent holds what it was given that its sponsor holds at that moment (the authorization
//! layer intersects them on every decision), ends with its sponsor's removal, and is bound to
//! its room: its token opens nothing else. `GET` lists the room's agents, `DELETE
//! .../agents/{agent_id}` revokes one (its sponsor, or anyone who holds `revoke`).

use crate::http::extract::Ids;
use crate::http::guard::{authorize, room_capabilities};
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::{RoomId, UserId};
use crate::store::{AgentRow, Change};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use coderoom_authz::{Action, Capability, CapabilitySet};
use serde::Deserialize;
use serde_json::{json, Value};

/// Longest an agent may live.
const MAX_TTL_S: i64 = 30 * 24 * 3600;
/// Agents one room may have had (revoked ones included).
const MAX_AGENTS: usize = 100;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/agents", get(list).post(create))
        .route("/api/rooms/{id}/agents/{agent}", delete(revoke))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Create {
    name: String,
    capabilities: Vec<String>,
    #[serde(default)]
    budget: Option<Value>,
    ttl_s: i64,
    /// Each command it runs waits for someone's approval of exactly that command.
    #[serde(default)]
    approval_mode: bool,
}

async fn create(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<Create>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(
            "name is 1 to 64 characters, none of them control characters",
        ));
    }
    if !(60..=MAX_TTL_S).contains(&body.ttl_s) {
        return Err(ApiError::BadRequest(
            "ttl_s must be from 60 to 2592000 (30 days)",
        ));
    }
    let given = CapabilitySet::parse_names(&body.capabilities)
        .map_err(|e| ApiError::Invalid(e.to_string()))?;
    if !given.contains(Capability::Observe) {
        return Err(ApiError::BadRequest("an agent needs observe"));
    }
    // Limits per meter (`crate::spend`): what the agent may use, whatever the room has left.
    let budget = crate::spend::Budget::parse(&body.budget.unwrap_or(Value::Null))
        .map_err(|e| ApiError::Invalid(e.0))?;
    crate::http::spend::agent_budget(&budget)?;
    let budget = budget.to_json();
    let details = json!({
        "name": name,
        "capabilities": given.names(),
        "ttl_s": body.ttl_s,
        "approval_mode": body.approval_mode,
    });
    // Bringing an agent in is inviting it: `invite`, and nothing beyond what the sponsor holds.
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::CreateInvite { grants: given },
        details.clone(),
    )
    .await?;
    if app.store.agents(&room_id).await?.len() >= MAX_AGENTS {
        return Err(ApiError::Invalid(format!(
            "a room has at most {MAX_AGENTS} agents"
        )));
    }
    let now = app.clock.now_ms();
    let token = crate::accounts::sessions::fresh_token();
    let agent = AgentRow {
        agent_id: UserId::fresh().to_string(),
        room_id: room_id.to_string(),
        name: name.to_owned(),
        sponsor: proof.actor().to_owned(),
        capabilities: given.names().into_iter().map(str::to_owned).collect(),
        budget,
        created_at: now,
        expires_at: now + body.ttl_s * 1000,
        revoked_at: None,
        approval_mode: body.approval_mode,
    };
    let mut details = details;
    details["agent_id"] = json!(agent.agent_id);
    app.audit
        .record(
            &room_id,
            proof.actor(),
            "create_agent",
            "allow",
            "",
            details,
            Change::CreateAgent {
                agent: agent.clone(),
                token_hash: crate::accounts::sessions::hash_token(&token),
            },
        )
        .await?;
    let mut v = json!(agent);
    v["token"] = json!(token);
    Ok((StatusCode::CREATED, Json(v)))
}

async fn list(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Vec<Value>>, ApiError> {
    room_capabilities(&app, &room_id, &user).await?;
    let state = app.store.room_state(&room_id).await?;
    let now = app.clock.now_ms();
    let out = app
        .store
        .agents(&room_id)
        .await?
        .into_iter()
        .map(|a| {
            let holds = state.capabilities_of(&a.agent_id, now).names();
            let standing = match (a.revoked_at, a.expires_at <= now) {
                (Some(_), _) => "revoked",
                (None, true) => "expired",
                (None, false) => "active",
            };
            let mut v = json!(a);
            v["holds"] = json!(holds);
            v["state"] = json!(standing);
            v
        })
        .collect();
    Ok(Json(out))
}

async fn revoke(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, agent_id)): Ids<(RoomId, UserId)>,
) -> Result<StatusCode, ApiError> {
    let agent = match app.store.agent(&agent_id).await? {
        Some(a) if a.room_id == room_id.as_str() && a.revoked_at.is_none() => a,
        _ => return Err(ApiError::NotFound),
    };
    let details = json!({ "agent_id": agent.agent_id, "name": agent.name });
    // Its sponsor may always end it; anyone else needs revoke.
    let need = if agent.sponsor == user.id {
        Capability::Observe
    } else {
        Capability::Revoke
    };
    let proof = authorize(&app, &room_id, &user, Action::Use(need), details.clone()).await?;
    app.audit
        .record(
            &room_id,
            proof.actor(),
            "revoke_agent",
            "allow",
            "",
            details,
            Change::RevokeAgent {
                room_id: room_id.to_string(),
                agent_id: agent.agent_id.clone(),
                now: app.clock.now_ms(),
            },
        )
        .await?;
    rights_changed(&app, &room_id, std::slice::from_ref(&agent.agent_id)).await;
    Ok(StatusCode::NO_CONTENT)
}

/// The agents `sponsor` brought into the room (live or just ended).
pub(crate) async fn sponsored_by(app: &AppState, room_id: &RoomId, sponsor: &str) -> Vec<String> {
    app.store
        .agents(room_id)
        .await
        .map(|all| {
            all.into_iter()
                .filter(|a| a.sponsor == sponsor)
                .map(|a| a.agent_id)
                .collect()
        })
        .unwrap_or_default()
}

/// Tells the room and the sockets that `agents`' rights changed (their sponsor's did, or they
/// ended): open connections follow at once, as for people.
pub(crate) async fn rights_changed(app: &AppState, room_id: &RoomId, agents: &[String]) {
    for agent in agents {
        crate::http::events::access_changed(app, room_id.to_string(), agent.clone(), None).await;
    }
    crate::http::events::refresh_rights(app, room_id, agents).await;
}

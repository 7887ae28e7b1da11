//! Agents as participants (`crate::ops::agents`): `POST /api/rooms/{id}/agents` `{"name", "capabilities", "budget",
//! "ttl_s"}` (needs `invite`; the caller becomes the sponsor) answers the agent's token once.
//! An agent holds what it was given that its sponsor holds at that moment (the authorization
//! layer intersects them on every decision), ends with its sponsor's removal, and is bound to
//! its room: its token opens nothing else. `GET` lists the room's agents, `DELETE
//! .../agents/{agent_id}` revokes one (its sponsor, or anyone who holds `revoke`).

use crate::http::extract::Caller;
use crate::http::extract::Ids;
use crate::http::extract::{Observing, OnRoom};
use crate::http::{ApiError, AppState};
use crate::ids::{RoomId, UserId};
use crate::ops::agents::NewAgent;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde_json::{json, Value};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/agents", get(list).post(create))
        .route("/api/rooms/{id}/agents/{agent}", delete(revoke))
}

async fn create(
    on: OnRoom,
    Json(new): Json<NewAgent>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let (agent, token) = on.ops.create_agent(&on.room, &on.actor, new).await?;
    let mut v = json!(agent);
    v["token"] = json!(token);
    Ok((StatusCode::CREATED, Json(v)))
}

async fn list(seen: Observing) -> Result<Json<Vec<Value>>, ApiError> {
    let state = seen.ops.store.room_state(&seen.room).await?;
    let now = seen.ops.clock.now_ms();
    let out = seen
        .ops
        .store
        .agents(&seen.room)
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
    by: Caller,
    Ids((room_id, agent_id)): Ids<(RoomId, UserId)>,
) -> Result<StatusCode, ApiError> {
    by.ops.revoke_agent(&room_id, &by.actor, &agent_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

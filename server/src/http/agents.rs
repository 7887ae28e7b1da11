//! Agents as participants (`crate::ops::agents`): `POST /api/rooms/{id}/agents` `{"name", "capabilities", "budget",
//! "ttl_s"}` (needs `invite`; the caller becomes the sponsor) answers the agent's token once.
//! An agent holds what it was given that its sponsor holds at that moment (the authorization
//! layer intersects them on every decision), ends with its sponsor's removal, and is bound to
//! its room: its token opens nothing else. `GET` lists the room's agents, `DELETE
//! .../agents/{agent_id}` revokes one (its sponsor, or anyone who holds `revoke`).

use crate::http::extract::Acting;
use crate::http::extract::Ids;
use crate::http::guard::room_capabilities;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::{RoomId, UserId};
use crate::ops::agents::NewAgent;
use axum::extract::State;
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
    State(app): State<AppState>,
    Acting(actor): Acting,
    Ids(room_id): Ids<RoomId>,
    Json(new): Json<NewAgent>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let (agent, token) = app.ops.create_agent(&room_id, &actor, new).await?;
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
    let state = app.ops.store.room_state(&room_id).await?;
    let now = app.ops.clock.now_ms();
    let out = app
        .ops
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
    Acting(actor): Acting,
    Ids((room_id, agent_id)): Ids<(RoomId, UserId)>,
) -> Result<StatusCode, ApiError> {
    app.ops.revoke_agent(&room_id, &actor, &agent_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

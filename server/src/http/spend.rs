//! The room's spend (`crate::ops::spend`): `GET /api/rooms/{id}/spend` (its meters, per
//! participant, and its budget), `PUT /api/rooms/{id}/budget` (the room's budget or an
//! agent's: needs `spend`; a raise needs someone else's approval).

use crate::http::extract::Acting;
use crate::http::extract::Ids;
use crate::http::guard::room_capabilities;
use crate::http::sandbox::render;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/spend", get(show))
        .route("/api/rooms/{id}/budget", put(set_budget))
}

async fn show(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Value>, ApiError> {
    room_capabilities(&app, &room_id, &user).await?;
    Ok(Json(app.ops.spend_view(&room_id).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetBudget {
    /// The limits (`null`: none); see [`Budget::parse`].
    budget: Value,
    /// An agent's budget instead of the room's.
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    approval_id: Option<String>,
}

/// `PUT /api/rooms/{id}/budget`: sets the room's budget (or an agent's) (`crate::ops::spend`):
/// a raise answers 202 with the approval it waits for.
async fn set_budget(
    State(app): State<AppState>,
    Acting(actor): Acting,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<SetBudget>,
) -> Result<Response, ApiError> {
    let set = app
        .ops
        .set_budget(
            &room_id,
            &actor,
            (&body.budget, body.agent_id),
            body.approval_id.as_deref(),
        )
        .await?;
    Ok(render(set))
}

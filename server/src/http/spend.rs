//! The room's spend (`crate::ops::spend`): `GET /api/rooms/{id}/spend` (its meters, per
//! participant, and its budget), `PUT /api/rooms/{id}/budget` (the room's budget or an
//! agent's: needs `spend`; a raise needs someone else's approval).

use crate::http::extract::{Observing, OnRoom};
use crate::http::sandbox::render;
use crate::http::{ApiError, AppState};
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

async fn show(seen: Observing) -> Result<Json<Value>, ApiError> {
    Ok(Json(seen.ops.spend_view(&seen.room).await?))
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
async fn set_budget(on: OnRoom, Json(body): Json<SetBudget>) -> Result<Response, ApiError> {
    let set = on
        .ops
        .set_budget(
            &on.room,
            &on.actor,
            (&body.budget, body.agent_id),
            body.approval_id.as_deref(),
        )
        .await?;
    Ok(render(set))
}

//! The room's network (`crate::ops::egress`): `GET /api/rooms/{id}/egress` (its allowlist,
//! presets, recent refusals and counters), `PUT /api/rooms/{id}/egress` (the whole policy) and
//! `POST /api/rooms/{id}/egress/allow` (one rule, at once or after someone else's approval).

use crate::http::extract::OnRoom;
use crate::http::sandbox::render;
use crate::http::{ApiError, AppState};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/egress", get(show).put(change))
        .route("/api/rooms/{id}/egress/allow", axum::routing::post(allow))
}

async fn show(on: OnRoom) -> Result<Json<Value>, ApiError> {
    Ok(Json(on.ops.egress(&on.room, &on.actor).await?))
}

/// The change: either list may be left out (unchanged).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangeEgress {
    allow: Option<Vec<String>>,
    presets: Option<Vec<String>>,
}

async fn change(on: OnRoom, Json(body): Json<ChangeEgress>) -> Result<Json<Value>, ApiError> {
    let view = on
        .ops
        .set_egress(&on.room, &on.actor, body.allow, body.presets)
        .await?;
    Ok(Json(view))
}

/// The ask: one rule to add.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AllowRule {
    rule: String,
    /// An approval of exactly this rule, for a caller without `approve`.
    #[serde(default)]
    approval_id: Option<String>,
}

/// `POST /api/rooms/{id}/egress/allow` `{"rule"}`: holders of `approve` add it at once;
/// holders of `edit` get `202 {"approval_id", "state": "pending_approval"}` and, once someone
/// else who holds `approve` agrees, add it by asking again with the `approval_id`.
async fn allow(on: OnRoom, Json(body): Json<AllowRule>) -> Result<Response, ApiError> {
    let added = on
        .ops
        .allow_egress(&on.room, &on.actor, &body.rule, body.approval_id.as_deref())
        .await?;
    Ok(render(added))
}

//! Secrets (`crate::ops::secrets`): `POST /api/rooms/{id}/secrets`, `GET` (their rules, never
//! their values), `DELETE /api/rooms/{id}/secrets/{name}`, `PUT .../secrets-policy`.

use crate::http::extract::Caller;
use crate::http::extract::{Observing, OnRoom};
use crate::http::sandbox::render;
use crate::http::{ApiError, AppState};
use crate::ids::RoomId;
use crate::ops::secrets::NewSecret;
use crate::ops::Outcome;
use crate::store::SecretRule;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::Json;
use axum::Router;
use serde::Deserialize;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/secrets", get(list).post(add))
        .route("/api/rooms/{id}/secrets/{name}", delete(remove))
        .route(
            "/api/rooms/{id}/secrets-policy",
            axum::routing::put(set_policy),
        )
}

/// The request. No `Debug`: it holds the value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddSecret {
    name: String,
    value: String,
    hosts: Vec<String>,
    #[serde(default = "default_header")]
    header: String,
    #[serde(default = "default_format")]
    format: String,
    /// An approval of exactly this rule, where the room's policy asks for one.
    #[serde(default)]
    approval_id: Option<String>,
}

fn default_header() -> String {
    "Authorization".into()
}

fn default_format() -> String {
    "Bearer {}".into()
}

async fn add(on: OnRoom, Json(body): Json<AddSecret>) -> Result<Response, ApiError> {
    let new = NewSecret {
        name: body.name,
        value: body.value,
        hosts: body.hosts,
        header: body.header,
        format: body.format,
    };
    let added = on
        .ops
        .add_secret(&on.room, &on.actor, new, body.approval_id.as_deref())
        .await?;
    Ok(match added {
        Outcome::Done(rule) => (StatusCode::CREATED, Json(rule)).into_response(),
        Outcome::Pending(id) => render::<()>(Outcome::Pending(id)),
    })
}

/// `PUT /api/rooms/{id}/secrets-policy` `{"add_needs_approval": true | false}`.
async fn set_policy(
    on: OnRoom,
    Json(body): Json<SecretsPolicy>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let set = on
        .ops
        .set_secrets_policy(&on.room, &on.actor, body.add_needs_approval)
        .await?;
    Ok(Json(set))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretsPolicy {
    add_needs_approval: bool,
}

async fn list(seen: Observing) -> Result<Json<Vec<SecretRule>>, ApiError> {
    Ok(Json(seen.ops.store.secret_rules(&seen.room).await?))
}

async fn remove(
    by: Caller,
    Path((room, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    by.ops.remove_secret(&room_id, &by.actor, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

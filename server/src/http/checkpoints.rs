//! Checkpoints (`crate::ops::checkpoints`): `POST`/`GET /api/rooms/{id}/checkpoints`,
//! `POST /api/rooms/{id}/checkpoints/{cid}/restore`, `POST /api/rooms/{id}/fork` and
//! `PUT /api/rooms/{id}/checkpoint-policy`.

use crate::http::extract::Caller;
use crate::http::extract::Ids;
use crate::http::extract::{Observing, OnRoom};
use crate::http::sandbox::render;
use crate::http::{ApiError, AppState};
use crate::ids::{IssuedId, RoomId};
use crate::ops::checkpoints::ForkAsked;
use crate::ops::Outcome;
use crate::store::CheckpointRow;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use serde::Deserialize;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/checkpoints", get(list).post(create))
        .route("/api/rooms/{id}/checkpoints/{cid}/restore", post(restore))
        .route("/api/rooms/{id}/fork", post(fork))
        .route(
            "/api/rooms/{id}/checkpoint-policy",
            axum::routing::put(set_policy),
        )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateCheckpoint {
    name: String,
}

async fn create(
    on: OnRoom,
    Json(body): Json<CreateCheckpoint>,
) -> Result<(StatusCode, Json<CheckpointRow>), ApiError> {
    let row = on
        .ops
        .create_checkpoint(&on.room, &on.actor, &body.name)
        .await?;
    Ok((StatusCode::CREATED, Json(row)))
}

async fn list(seen: Observing) -> Result<Json<Vec<CheckpointRow>>, ApiError> {
    Ok(Json(seen.ops.store.checkpoints(&seen.room).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreBody {
    approval_id: Option<String>,
}

async fn restore(
    by: Caller,
    Ids((room_id, cid)): Ids<(RoomId, IssuedId)>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    // `{"approval_id"}` where the room's policy asks for an approval; otherwise no body.
    let approval_id = if body.is_empty() {
        None
    } else {
        let v: RestoreBody = serde_json::from_slice(&body)
            .map_err(|_| ApiError::BadRequest("the body may only hold {\"approval_id\"}"))?;
        v.approval_id
    };
    let restored = by
        .ops
        .restore_checkpoint(&room_id, &by.actor, &cid, approval_id.as_deref())
        .await?;
    Ok(render(restored))
}

/// `POST /api/rooms/{id}/fork`: a new room owned by the caller (`crate::ops::Ops::fork_room`).
async fn fork(on: OnRoom, Json(asked): Json<ForkAsked>) -> Result<Response, ApiError> {
    Ok(match on.ops.fork_room(&on.room, &on.actor, asked).await? {
        Outcome::Done(made) => (StatusCode::CREATED, Json(made)).into_response(),
        Outcome::Pending(id) => render::<()>(Outcome::Pending(id)),
    })
}

/// `PUT /api/rooms/{id}/checkpoint-policy` `{"every_s": 3600 | null, "keep_days": 30 | null,
/// "restore_needs_approval": true | false}`, each optional (absent: unchanged): scheduled
/// checkpoints (kept 20, apart from the ones people make), an age past which checkpoints are
/// pruned, and whether a restore needs someone else's approval. Room governance: needs
/// `approve` (owners hold it), so those a policy restrains cannot lift it. Audited.
async fn set_policy(
    on: OnRoom,
    Json(body): Json<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(
        on.ops
            .set_checkpoint_policy(&on.room, &on.actor, body)
            .await?,
    ))
}

//! Repositories (`crate::ops::repositories`): `POST /api/rooms/{id}/repos` (connect), `GET`
//! (list), `POST .../repos/{rid}/pull`, `.../push` and `.../export`, `DELETE .../repos/{rid}`
//! (disconnect).

use crate::http::extract::Caller;
use crate::http::extract::{Observing, OnRoom};
use crate::http::sandbox::render;
use crate::http::{ApiError, AppState};
use crate::ids::RoomId;
use crate::ops::repositories::{Connect, Push};
use crate::ops::Outcome;
use crate::store::RepoRow;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/repos", get(list).post(connect))
        .route(
            "/api/rooms/{id}/repos/{rid}",
            axum::routing::delete(disconnect),
        )
        .route("/api/rooms/{id}/repos/{rid}/pull", post(pull))
        .route("/api/rooms/{id}/repos/{rid}/push", post(push))
        .route("/api/rooms/{id}/repos/{rid}/export", post(export))
}

async fn connect(
    on: OnRoom,
    Json(asked): Json<Connect>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let made = on.ops.connect_repo(&on.room, &on.actor, asked).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

async fn list(seen: Observing) -> Result<Json<Vec<RepoRow>>, ApiError> {
    Ok(Json(seen.ops.store.repos(&seen.room).await?))
}

async fn pull(
    by: Caller,
    Path((room, rid)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    Ok(Json(by.ops.pull_repo(&room_id, &by.actor, &rid).await?))
}

async fn push(
    by: Caller,
    Path((room, rid)): Path<(String, String)>,
    Json(asked): Json<Push>,
) -> Result<Response, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    Ok(render(
        by.ops.push_repo(&room_id, &by.actor, &rid, asked).await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportBody {
    /// `bundle` (a git bundle) or `patch` (a patch series).
    format: String,
    /// The approval of exactly this export.
    #[serde(default)]
    approval_id: Option<String>,
}

/// `POST .../repos/{rid}/export` `{"format": "bundle" | "patch"}`: the room's changes since
/// the last pull or push, as one commit authored by the caller, in a git bundle or a patch.
/// Needs `export` and someone else's approval of exactly this export (202 until then), like
/// every export.
async fn export(
    by: Caller,
    Path((room, rid)): Path<(String, String)>,
    Json(body): Json<ExportBody>,
) -> Result<Response, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    let what = (body.format.as_str(), body.approval_id.as_deref());
    Ok(
        match by.ops.export_repo(&room_id, &by.actor, &rid, what).await? {
            Outcome::Done(export) => (
                [
                    (axum::http::header::CONTENT_TYPE, export.kind.to_owned()),
                    (
                        axum::http::header::CONTENT_DISPOSITION,
                        format!("attachment; filename=\"{}\"", export.file_name),
                    ),
                ],
                export.data,
            )
                .into_response(),
            Outcome::Pending(id) => render::<()>(Outcome::Pending(id)),
        },
    )
}

async fn disconnect(
    by: Caller,
    Path((room, rid)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    by.ops.disconnect_repo(&room_id, &by.actor, &rid).await?;
    Ok(StatusCode::NO_CONTENT)
}

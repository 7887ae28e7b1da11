//! Approvals (`crate::ops::approvals`) and exports (`crate::ops::export`):
//! `POST /api/rooms/{id}/exports {"files": [...]}` (those files' texts, as JSON) or
//! `{"workspace": true}` (the whole workspace as a `.tar.gz`), 202 `pending_approval` until
//! someone else approves it; `GET .../approvals`; `POST .../approvals/{approval_id}/decision`.

use crate::http::extract::{Caller, Ids};
use crate::http::extract::{Observing, OnRoom};
use crate::http::ApiError;
use crate::http::AppState;
use crate::ids::{IssuedId, RoomId};
use crate::ops::export::{ExportAsked, Exported};
use crate::ops::Outcome;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/exports", post(export))
        .route("/api/rooms/{id}/approvals", get(list))
        .route(
            "/api/rooms/{id}/approvals/{approval_id}/decision",
            post(decide_request),
        )
}

pub(crate) async fn export(
    on: OnRoom,
    Json(asked): Json<ExportAsked>,
) -> Result<Response, ApiError> {
    Ok(match on.ops.export(&on.room, &on.actor, asked).await? {
        Outcome::Done(Exported::Files(files)) => Json(Export { files }).into_response(),
        Outcome::Done(Exported::Workspace {
            file,
            bytes,
            file_name,
            lapse,
        }) => (
            [
                (
                    axum::http::header::CONTENT_TYPE,
                    "application/gzip".to_owned(),
                ),
                (axum::http::header::CONTENT_LENGTH, bytes.to_string()),
                (
                    axum::http::header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{file_name}\""),
                ),
            ],
            axum::body::Body::from_stream(until_lapsed(file, lapse)),
        )
            .into_response(),
        Outcome::Pending(id) => crate::http::sandbox::render::<()>(Outcome::Pending(id)),
    })
}

/// The file's bytes until `lapse` is cancelled; then an error, which cuts the response short
/// of its length (a client sees a failed download, never a shorter one that looks whole).
fn until_lapsed(
    file: tokio::fs::File,
    lapse: crate::ops::commands::Lapse,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    use futures_util::StreamExt as _;
    let chunks = tokio_util::io::ReaderStream::new(file);
    futures_util::stream::unfold(Some((chunks, lapse)), |state| async move {
        let (mut chunks, lapse) = state?;
        tokio::select! {
            biased;
            () = lapse.stop.cancelled() => {
                let why = std::io::Error::other(crate::ops::export::LAPSED);
                Some((Err(why), None))
            }
            next = chunks.next() => next.map(|chunk| (chunk, Some((chunks, lapse)))),
        }
    })
}

pub(crate) async fn list(seen: Observing) -> Result<Json<Vec<ApprovalItem>>, ApiError> {
    let now = seen.ops.clock.now_ms();
    let items = seen
        .ops
        .store
        .approvals(&seen.room)
        .await?
        .into_iter()
        .map(|(a, created_at)| {
            let state = match (&a.decided, a.used) {
                (_, true) => "used",
                (Some((_, true)), _) if a.expires_at <= now => "expired",
                (Some((_, true)), _) => "approved",
                (Some((_, false)), _) => "denied",
                (None, _) if a.expires_at <= now => "expired",
                (None, _) => "pending",
            };
            ApprovalItem {
                params: serde_json::from_str::<Value>(&a.params).unwrap_or(Value::Null),
                id: a.id,
                action: a.action,
                requester: a.requester,
                state,
                decided_by: a.decided.map(|(by, _)| by),
                created_at,
                expires_at: a.expires_at,
            }
        })
        .collect();
    Ok(Json(items))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionBody {
    approve: bool,
}

pub(crate) async fn decide_request(
    by: Caller,
    Ids((room_id, id)): Ids<(RoomId, IssuedId)>,
    Json(body): Json<DecisionBody>,
) -> Result<Json<Decided>, ApiError> {
    by.ops
        .decide_approval(&room_id, &by.actor, &id, body.approve)
        .await?;
    Ok(Json(Decided {
        id: id.to_string(),
        state: if body.approve { "approved" } else { "denied" },
    }))
}

/// `200` from `POST /api/rooms/{id}/exports`: each named file's text (`null`: not in the room).
#[derive(Serialize)]
pub(crate) struct Export {
    files: BTreeMap<String, Option<String>>,
}

/// One entry of `GET /api/rooms/{id}/approvals`.
#[derive(Serialize)]
pub(crate) struct ApprovalItem {
    id: String,
    action: String,
    params: Value,
    requester: String,
    /// `pending`, `approved`, `denied`, `expired` or `used`.
    state: &'static str,
    decided_by: Option<String>,
    created_at: i64,
    expires_at: i64,
}

/// `POST /api/rooms/{id}/approvals/{approval_id}/decision`.
#[derive(Serialize)]
pub(crate) struct Decided {
    id: String,
    /// `approved` or `denied`.
    state: &'static str,
}

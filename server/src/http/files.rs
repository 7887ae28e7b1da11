//! `/api/rooms/{id}/files/{path}`: reading, writing and removing workspace files through the
//! sandbox's agent. Paths are checked before anything reaches the sandbox.

use crate::http::extract::Ids;
use crate::http::guard::authorize;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use coderoom_authz::{Action, Capability};
use coderoom_sandbox::path::WorkspacePath;
use coderoom_sandbox::proto::{Op, Reply};
use serde_json::json;
use std::time::Duration;

/// Largest file read or written through the API.
pub(crate) const MAX_FILE_BYTES: u64 = 16 << 20;
/// Time a file operation may take.
const FILE_WITHIN: Duration = Duration::from_secs(30);

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/api/rooms/{id}/files/{*path}",
            get(read_file).put(write_file).delete(remove_file),
        )
        .layer(DefaultBodyLimit::max(MAX_FILE_BYTES as usize))
}

pub(crate) fn check_path(raw: &str) -> Result<WorkspacePath, ApiError> {
    WorkspacePath::parse(raw).map_err(|e| ApiError::Invalid(format!("invalid path: {e}")))
}

/// Checks the path, decides `cap` for the caller and runs the file operation `make` builds.
async fn file_op(
    app: &AppState,
    user: &AuthUser,
    room_id: &RoomId,
    raw: &str,
    cap: Capability,
    make: impl FnOnce(String) -> Op,
) -> Result<Reply, ApiError> {
    let path = check_path(raw)?;
    let details = json!({ "path": path.as_str() });
    authorize(app, room_id, user, Action::Use(cap), details).await?;
    let op = make(path.as_str().to_owned());
    Ok(app.sandboxes.op(room_id, op, FILE_WITHIN).await?)
}

pub(crate) async fn read_file(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, raw)): Ids<(RoomId, String)>,
) -> Result<Response, ApiError> {
    let make = |path| Op::ReadFile {
        path,
        max_bytes: MAX_FILE_BYTES,
    };
    match file_op(&app, &user, &room_id, &raw, Capability::Observe, make).await? {
        Reply::File(data) => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            data.into_vec(),
        )
            .into_response()),
        _ => Err(ApiError::Internal),
    }
}

pub(crate) async fn write_file(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, raw)): Ids<(RoomId, String)>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let make = |path| Op::WriteFile {
        path,
        data: serde_bytes::ByteBuf::from(body.to_vec()),
    };
    file_op(&app, &user, &room_id, &raw, Capability::Edit, make).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn remove_file(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, raw)): Ids<(RoomId, String)>,
) -> Result<StatusCode, ApiError> {
    let make = |path| Op::RemoveFile { path };
    file_op(&app, &user, &room_id, &raw, Capability::Edit, make).await?;
    Ok(StatusCode::NO_CONTENT)
}

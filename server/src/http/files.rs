//! `/api/rooms/{id}/files/{path}`: reading, writing and removing workspace files through the
//! sandbox's agent. Paths are checked before anything reaches the sandbox.

use crate::http::extract::Ids;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use coderoom_authz::Capability;
use coderoom_sandbox::proto::{Op, Reply};

/// Largest file read or written through the API.
pub(crate) const MAX_FILE_BYTES: u64 = 16 << 20;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/api/rooms/{id}/files/{*path}",
            get(read_file).put(write_file).delete(remove_file),
        )
        .layer(DefaultBodyLimit::max(MAX_FILE_BYTES as usize))
}

/// Decides and runs the file operation `make` builds (`crate::ops::Ops::file_op`).
async fn file_op(
    app: &AppState,
    user: &AuthUser,
    room_id: &RoomId,
    what: (&str, Capability, Option<usize>),
    make: impl FnOnce(String) -> Op,
) -> Result<Reply, ApiError> {
    let actor = user.actor(app).await?;
    Ok(app.ops.file_op(room_id, &actor, what, make).await?)
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
    match file_op(
        &app,
        &user,
        &room_id,
        (&raw, Capability::Observe, None),
        make,
    )
    .await?
    {
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
    let bytes = Some(body.len());
    let make = |path| Op::WriteFile {
        path,
        data: serde_bytes::ByteBuf::from(body.to_vec()),
    };
    file_op(&app, &user, &room_id, (&raw, Capability::Edit, bytes), make).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn remove_file(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, raw)): Ids<(RoomId, String)>,
) -> Result<StatusCode, ApiError> {
    let make = |path| Op::RemoveFile { path };
    file_op(&app, &user, &room_id, (&raw, Capability::Edit, None), make).await?;
    Ok(StatusCode::NO_CONTENT)
}

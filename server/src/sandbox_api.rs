//! Typed sandbox operations over HTTP: `/exec`, `/files/{path}`, `/sandbox`, `/sandbox/stop`,
//! `/sandbox/start`. Paths are checked before anything reaches the sandbox.

use crate::access::authorize;
use crate::app::AppState;
use crate::auth::AuthUser;
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use coderoom_authz::{Action, Capability};
use coderoom_sandbox::path::WorkspacePath;
use coderoom_sandbox::proto::{Op, Reply};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;

/// Longest a command may run.
const MAX_EXEC_MS: u64 = 10 * 60 * 1000;
/// When the request names no timeout.
const DEFAULT_EXEC_MS: u64 = 10_000;
/// Output kept per stream of one command.
const MAX_EXEC_OUTPUT: u32 = 1 << 20;
/// Arguments and their total size.
const MAX_ARGS: usize = 1024;
const MAX_ARGV_BYTES: usize = 256 << 10;
/// Largest file read or written through the API.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Time a file operation may take.
const FILE_WITHIN: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    argv: Vec<String>,
    #[serde(default)]
    cwd: String,
    timeout_ms: Option<u64>,
}

fn check_path(raw: &str) -> Result<WorkspacePath, ApiError> {
    WorkspacePath::parse(raw).map_err(|e| ApiError::Invalid(format!("invalid path: {e}")))
}

pub async fn exec(
    State(app): State<AppState>,
    user: AuthUser,
    Path(room_id): Path<String>,
    Json(req): Json<ExecRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.argv.is_empty() || req.argv.len() > MAX_ARGS {
        return Err(ApiError::BadRequest("argv must hold 1 to 1024 arguments"));
    }
    if req.argv.iter().map(String::len).sum::<usize>() > MAX_ARGV_BYTES
        || req.argv.iter().any(|a| a.contains('\0'))
    {
        return Err(ApiError::BadRequest(
            "argv is too long or contains NUL characters",
        ));
    }
    if !req.cwd.is_empty() {
        check_path(&req.cwd)?;
    }
    let timeout_ms = req.timeout_ms.unwrap_or(DEFAULT_EXEC_MS);
    if timeout_ms == 0 || timeout_ms > MAX_EXEC_MS {
        return Err(ApiError::BadRequest(
            "timeout_ms must be between 1 and 600000",
        ));
    }
    // The command line is the user's own content and may hold anything; the audit names the
    // program and the shape, not the arguments.
    let details = json!({ "program": req.argv[0], "args": req.argv.len() - 1, "cwd": req.cwd });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Type),
        details.clone(),
    )
    .await?;
    app.audit
        .record(
            &room_id,
            proof.actor(),
            "exec",
            "allow",
            "",
            details,
            crate::store::Change::None,
        )
        .await?;
    let op = Op::Exec {
        argv: req.argv,
        cwd: req.cwd,
        timeout_ms,
        max_output: MAX_EXEC_OUTPUT,
    };
    // The agent enforces the timeout; the extra margin covers a start from a snapshot.
    let within = Duration::from_millis(timeout_ms) + Duration::from_secs(30);
    match app.sandboxes.op(&room_id, op, within).await? {
        Reply::Exec {
            exit_code,
            stdout,
            stderr,
            truncated,
            timed_out,
        } => Ok(Json(json!({
            "exit_code": exit_code,
            "stdout": String::from_utf8_lossy(&stdout),
            "stderr": String::from_utf8_lossy(&stderr),
            "truncated": truncated,
            "timed_out": timed_out,
        }))),
        _ => Err(ApiError::Internal),
    }
}

/// Checks the path, decides `cap` for the caller and runs the file operation `make` builds.
async fn file_op(
    app: &AppState,
    user: &AuthUser,
    room_id: &str,
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

pub async fn read_file(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room_id, raw)): Path<(String, String)>,
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

pub async fn write_file(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room_id, raw)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let make = |path| Op::WriteFile {
        path,
        data: serde_bytes::ByteBuf::from(body.to_vec()),
    };
    file_op(&app, &user, &room_id, &raw, Capability::Edit, make).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn remove_file(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room_id, raw)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let make = |path| Op::RemoveFile { path };
    file_op(&app, &user, &room_id, &raw, Capability::Edit, make).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn status(
    State(app): State<AppState>,
    user: AuthUser,
    Path(room_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    crate::api::room_capabilities(&app, &room_id, &user).await?;
    Ok(Json(app.sandboxes.status(&room_id).await?))
}

/// Stop and start need `type`: they change what everyone's terminal runs in.
async fn lifecycle(
    app: &AppState,
    user: &AuthUser,
    room_id: &str,
    start: bool,
) -> Result<Json<Value>, ApiError> {
    let which = if start { "start" } else { "stop" };
    let details = json!({ "sandbox": which });
    let proof = authorize(app, room_id, user, Action::Use(Capability::Type), details).await?;
    let status = if start {
        app.sandboxes.start(room_id, proof.actor()).await?
    } else {
        app.sandboxes.stop(room_id, proof.actor()).await?
    };
    Ok(Json(status))
}

pub async fn stop(
    State(app): State<AppState>,
    user: AuthUser,
    Path(room_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    lifecycle(&app, &user, &room_id, false).await
}

pub async fn start(
    State(app): State<AppState>,
    user: AuthUser,
    Path(room_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    lifecycle(&app, &user, &room_id, true).await
}

//! Typed sandbox operations over HTTP: `/exec`, `/sandbox`, `/sandbox/stop`, `/sandbox/start`.
//! Paths are checked before anything reaches the sandbox.

use crate::http::extract::Ids;
use crate::http::files::check_path;
use crate::http::guard::authorize;
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::RoomId;
use crate::sandbox::SandboxStatus;
use axum::extract::State;
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use coderoom_authz::{Action, Capability};
use coderoom_sandbox::proto::{Op, Reply};
use serde::{Deserialize, Serialize};
use serde_json::json;
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

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/exec", post(exec))
        .route("/api/rooms/{id}/sandbox", get(status))
        .route("/api/rooms/{id}/sandbox/stop", post(stop))
        .route("/api/rooms/{id}/sandbox/start", post(start))
        .route(
            "/api/rooms/{id}/readiness",
            axum::routing::put(set_readiness),
        )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecRequest {
    argv: Vec<String>,
    #[serde(default)]
    cwd: String,
    timeout_ms: Option<u64>,
    /// Where the caller (an agent in approval mode) must have this command approved first.
    #[serde(default)]
    pub(crate) approval_id: Option<String>,
}

/// What became of a command: it ran, or it waits for an approval (its id).
pub(crate) enum Ran {
    Done(Executed),
    Pending(String),
}

/// `POST /api/rooms/{id}/exec` `{"argv", "cwd"?, "timeout_ms"?, "approval_id"?}`: runs it and
/// answers how it ended; an agent in approval mode gets `202 {"approval_id", "state":
/// "pending_approval"}` until someone approves exactly this command (argv and cwd).
pub(crate) async fn exec(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(req): Json<ExecRequest>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    Ok(match run(&app, &room_id, &user, req).await? {
        Ran::Done(out) => Json(out).into_response(),
        Ran::Pending(id) => (
            axum::http::StatusCode::ACCEPTED,
            Json(json!({ "approval_id": id, "state": "pending_approval" })),
        )
            .into_response(),
    })
}

/// Decides, records and runs a command (see [`exec`]).
pub(crate) async fn run(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    req: ExecRequest,
) -> Result<Ran, ApiError> {
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
    // Metered: in a room with a budget it needs `spend`, and none of the budgets it draws on
    // may be used up.
    crate::http::spend::may_start(
        app,
        room_id,
        user,
        &[
            crate::spend::Meter::Execs,
            crate::spend::Meter::SandboxSeconds,
        ],
    )
    .await?;
    // The command line is the user's own content and may hold anything; the audit names the
    // program and the shape, not the arguments.
    let details = json!({ "program": req.argv[0], "args": req.argv.len() - 1, "cwd": req.cwd });
    // The exact command, for an approval (it is shown to whoever decides, and only there).
    let params = json!({ "argv": req.argv, "cwd": req.cwd }).to_string();
    let approval =
        crate::http::approvals::presented(app, room_id, req.approval_id.as_deref()).await?;
    let action = Action::RunCommand { params, approval };
    let (proof, approval) =
        match crate::http::approvals::ask(app, room_id, user, action, details.clone()).await? {
            crate::http::approvals::Asked::Allowed { proof, approval } => (proof, approval),
            crate::http::approvals::Asked::Pending(id) => return Ok(Ran::Pending(id)),
        };
    let mut details = details;
    if !approval.is_empty() {
        details["approval_id"] = json!(approval);
    }
    // Checked and charged in one step: commands at once cannot all pass the last one left.
    let execs = crate::spend::Meter::Execs;
    app.spend
        .try_charge(room_id, proof.actor(), execs, 1)
        .await?
        .map_err(ApiError::Spent)?;
    let recorded = app
        .audit
        .record(
            room_id,
            proof.actor(),
            "exec",
            "allow",
            "",
            details,
            crate::store::Change::None.spending(approval),
        )
        .await;
    if recorded.is_err() {
        app.spend.refund(room_id, proof.actor(), execs, 1);
    }
    crate::http::approvals::spent(recorded)?;
    let op = Op::Exec {
        argv: req.argv,
        cwd: req.cwd,
        timeout_ms,
        max_output: MAX_EXEC_OUTPUT,
        // Its connections out count to whoever ran it.
        actor: proof.actor().to_owned(),
    };
    // The agent enforces the timeout; the extra margin covers a start from a snapshot.
    let within = Duration::from_millis(timeout_ms) + Duration::from_secs(30);
    match app.sandboxes.op(room_id, op, within).await? {
        Reply::Exec {
            exit_code,
            stdout,
            stderr,
            truncated,
            timed_out,
        } => Ok(Ran::Done(Executed {
            exit_code,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            truncated,
            timed_out,
        })),
        _ => Err(ApiError::Internal),
    }
}

/// Longest readiness command.
const MAX_READINESS_BYTES: usize = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadinessBody {
    command: Option<String>,
}

/// `PUT /api/rooms/{id}/readiness` `{"command": "npm ci" | null}`: the command the room's sandbox
/// runs (as `sh -c`) after every start or resume, before the room says it is ready. Needs
/// `type` (it runs code); takes effect at the next start; audited (the program, not the whole
/// command line, which may hold anything).
pub(crate) async fn set_readiness(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<ReadinessBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let command = body
        .command
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    if let Some(c) = &command {
        if c.len() > MAX_READINESS_BYTES || c.contains('\0') {
            return Err(ApiError::BadRequest(
                "command must be at most 4096 bytes, without NUL characters",
            ));
        }
    }
    let details = match &command {
        // The program, past any leading `NAME=value` assignments (which may hold a token).
        Some(c) => json!({
            "program": c.split_whitespace().find(|w| !w.contains('=')).unwrap_or_default(),
            "bytes": c.len(),
        }),
        None => json!({ "cleared": true }),
    };
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
            "set_readiness",
            "allow",
            "",
            details,
            crate::store::Change::SetReadiness {
                room_id: room_id.to_string(),
                command: command.clone(),
            },
        )
        .await?;
    Ok(Json(json!({ "command": command })))
}

pub(crate) async fn status(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<SandboxStatus>, ApiError> {
    let caps = crate::http::guard::room_capabilities(&app, &room_id, &user).await?;
    let status = app.sandboxes.status(&room_id).await?;
    Ok(Json(if caps.contains(Capability::Type) {
        status
    } else {
        status.without_readiness_details()
    }))
}

/// Stop and start need `type`: they change what everyone's terminal runs in.
async fn lifecycle(
    app: &AppState,
    user: &AuthUser,
    room_id: &RoomId,
    start: bool,
) -> Result<Json<SandboxStatus>, ApiError> {
    let which = if start { "start" } else { "stop" };
    let details = json!({ "sandbox": which });
    let proof = authorize(app, room_id, user, Action::Use(Capability::Type), details).await?;
    let status = if start {
        crate::http::spend::may_start(app, room_id, user, &[crate::spend::Meter::SandboxSeconds])
            .await?;
        app.sandboxes.start(room_id, proof.actor()).await?
    } else {
        app.sandboxes.stop(room_id, proof.actor()).await?
    };
    Ok(Json(status))
}

pub(crate) async fn stop(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<SandboxStatus>, ApiError> {
    lifecycle(&app, &user, &room_id, false).await
}

pub(crate) async fn start(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<SandboxStatus>, ApiError> {
    lifecycle(&app, &user, &room_id, true).await
}

/// `POST /api/rooms/{id}/exec`: how the command ended and what it printed (as text; invalid
/// UTF-8 replaced).
#[derive(Serialize)]
pub(crate) struct Executed {
    exit_code: Option<i32>,
    stdout: String,
    stderr: String,
    truncated: bool,
    timed_out: bool,
}

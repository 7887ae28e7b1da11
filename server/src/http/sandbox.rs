//! Sandbox routes: `/exec`, `/sandbox`, `/sandbox/stop`, `/sandbox/start`, `/readiness`. Each
//! parses, calls the application layer (`crate::ops::commands`, `crate::ops::sandbox`) and
//! renders its outcome.

use crate::http::extract::{Observing, OnRoom};
use crate::http::ApiError;
use crate::http::AppState;
use crate::ops::commands::{Command, Executed};
use crate::ops::Outcome;
use crate::sandbox::SandboxStatus;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use coderoom_authz::Capability;
use serde::{Deserialize, Serialize};

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
    pub(crate) argv: Vec<String>,
    #[serde(default)]
    pub(crate) cwd: String,
    pub(crate) timeout_ms: Option<u64>,
    /// Where the caller (an agent in approval mode) must have this command approved first.
    #[serde(default)]
    pub(crate) approval_id: Option<String>,
}

impl ExecRequest {
    pub(crate) fn command(self) -> (Command, Option<String>) {
        let cmd = Command::new(self.argv, self.cwd, self.timeout_ms);
        (cmd, self.approval_id)
    }
}

/// `202 {"approval_id", "state": "pending_approval"}`: what an action waits for.
#[derive(Serialize)]
pub(crate) struct Pending {
    pub(crate) approval_id: String,
    pub(crate) state: &'static str,
}

/// An outcome as HTTP: the result as JSON, or 202 with the approval it waits for.
pub(crate) fn render<T: Serialize>(outcome: Outcome<T>) -> Response {
    match outcome {
        Outcome::Done(v) => Json(v).into_response(),
        Outcome::Pending(approval_id) => (
            StatusCode::ACCEPTED,
            Json(Pending {
                approval_id,
                state: "pending_approval",
            }),
        )
            .into_response(),
    }
}

/// `POST /api/rooms/{id}/exec` `{"argv", "cwd"?, "timeout_ms"?, "approval_id"?}`: runs it and
/// answers how it ended; an agent in approval mode gets `202 {"approval_id", "state":
/// "pending_approval"}` until someone approves exactly this command (argv and cwd).
pub(crate) async fn exec(on: OnRoom, Json(req): Json<ExecRequest>) -> Result<Response, ApiError> {
    let (cmd, approval) = req.command();
    let ran: Outcome<Executed> = on
        .ops
        .run_command(&on.room, &on.actor, cmd, approval.as_deref())
        .await?;
    Ok(render(ran))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadinessBody {
    command: Option<String>,
    #[serde(default)]
    approval_id: Option<String>,
}

/// `PUT /api/rooms/{id}/readiness` `{"command": "npm ci" | null, "approval_id"?}`: the command
/// the room's sandbox runs (as `sh -c`) after every start or resume, before the room says it
/// is ready (`crate::ops::Ops::set_readiness`: decided as a command of whoever sets it).
pub(crate) async fn set_readiness(
    on: OnRoom,
    Json(body): Json<ReadinessBody>,
) -> Result<Response, ApiError> {
    let set = on
        .ops
        .set_readiness(
            &on.room,
            &on.actor,
            body.command,
            body.approval_id.as_deref(),
        )
        .await?;
    Ok(match set {
        Outcome::Done(command) => Json(serde_json::json!({ "command": command })).into_response(),
        Outcome::Pending(id) => render::<()>(Outcome::Pending(id)),
    })
}

pub(crate) async fn status(seen: Observing) -> Result<Json<SandboxStatus>, ApiError> {
    let status = seen.ops.sandboxes.status(&seen.room).await?;
    Ok(Json(if seen.caps.contains(Capability::Type) {
        status
    } else {
        status.without_readiness_details()
    }))
}

pub(crate) async fn stop(on: OnRoom) -> Result<Json<SandboxStatus>, ApiError> {
    Ok(Json(on.ops.stop_sandbox(&on.room, &on.actor).await?))
}

pub(crate) async fn start(on: OnRoom) -> Result<Json<SandboxStatus>, ApiError> {
    Ok(Json(on.ops.start_sandbox(&on.room, &on.actor).await?))
}

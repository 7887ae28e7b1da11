//! The one place where errors become HTTP responses. Clients get a safe message; the real
//! error is logged with the request.

use crate::sandbox::SandboxError;
use crate::store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use coderoom_sandbox::proto::AgentError;
use coderoom_sandbox::CallError;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("authentication required")]
    Unauthorized,
    #[error("not allowed")]
    Forbidden,
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    BadRequest(&'static str),
    #[error("too many requests")]
    TooMany,
    /// Too many requests, and when the next one will be taken (seconds; `Retry-After`).
    #[error("too many requests: try again in {0} s")]
    TooManyFor(u64),
    #[error("{0}")]
    Denied(String),
    #[error("this link no longer works")]
    Gone,
    /// Gone, and why (a sentence for the person holding the link).
    #[error("{0}")]
    GoneBecause(&'static str),
    #[error("storage unavailable")]
    Store(#[from] StoreError),
    /// Bad input with a message built by the server (never from internal errors).
    #[error("{0}")]
    Invalid(String),
    #[error("internal error")]
    Internal,
    /// A bounded resource is busy (login hashing); the client should retry.
    #[error("try again shortly")]
    Busy,
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
    #[error("{0}")]
    Repo(#[from] crate::repos::RepoError),
    /// The request collides with the state of things (a merge conflict); the message says how.
    #[error("{0}")]
    Conflict(String),
    /// Metered work past a budget: 402 with the meter, its use and the budget.
    #[error("{0}")]
    Spent(crate::spend::Exhausted),
}

impl From<crate::ops::OpError> for ApiError {
    fn from(e: crate::ops::OpError) -> Self {
        use crate::ops::OpError;
        match e {
            OpError::NotFound => ApiError::NotFound,
            OpError::Refused(why) => ApiError::Denied(why),
            OpError::Bad(why) => ApiError::BadRequest(why),
            OpError::Invalid(why) => ApiError::Invalid(why),
            OpError::Gone => ApiError::Gone,
            OpError::Spent(e) => ApiError::Spent(e),
            OpError::Conflict(why) => ApiError::Conflict(why),
            OpError::Store(e) => ApiError::Store(e),
            OpError::Repo(e) => ApiError::Repo(e),
            OpError::Sandbox(e) => ApiError::Sandbox(e),
            OpError::Internal => ApiError::Internal,
        }
    }
}

/// The body of every error response.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody {
    /// A stable, safe message.
    pub(crate) error: String,
    /// Names the log line with the details, when there are details a client must not see.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_id: Option<String>,
}

/// What a client is told of an agent's refusal. The agent runs inside the sandbox and is
/// untrusted: its text never reaches a client. Each kind gets a stable message and an error id;
/// the agent's text goes to the log under that id.
pub(crate) fn agent_error(e: &AgentError) -> ErrorBody {
    let error = match e {
        AgentError::InvalidPath(_) => "invalid path in the workspace",
        AgentError::NotFound => "not found",
        AgentError::TooLarge => "too large",
        AgentError::Invalid(_) => "the operation is not possible in the sandbox now",
        AgentError::Failed(_) => "the operation failed inside the sandbox",
        AgentError::Cancelled => "the command was stopped",
        AgentError::Exists => "already exists",
    };
    let error_id = match e {
        AgentError::NotFound
        | AgentError::TooLarge
        | AgentError::Cancelled
        | AgentError::Exists => None,
        AgentError::InvalidPath(_) | AgentError::Invalid(_) | AgentError::Failed(_) => {
            let id = crate::ids::error_id();
            tracing::info!(error_id = %id, agent_said = ?e.to_string(), "sandbox operation refused");
            Some(id)
        }
    };
    ErrorBody {
        error: error.to_owned(),
        error_id,
    }
}

fn sandbox_status(e: &SandboxError) -> StatusCode {
    match e {
        SandboxError::Unavailable(_)
        | SandboxError::Start
        | SandboxError::ShuttingDown
        | SandboxError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::Failed(_) => StatusCode::CONFLICT,
        SandboxError::Budget(_) => StatusCode::PAYMENT_REQUIRED,
        SandboxError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::Document(crate::room::visit::VisitError::Refused) => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        SandboxError::Document(_) => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::Call(c) => match c {
            CallError::Agent(AgentError::NotFound) => StatusCode::NOT_FOUND,
            CallError::Agent(AgentError::InvalidPath(_)) => StatusCode::BAD_REQUEST,
            CallError::Agent(AgentError::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
            CallError::Agent(AgentError::Invalid(_) | AgentError::Exists) => StatusCode::CONFLICT,
            CallError::Agent(AgentError::Failed(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            CallError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            CallError::Gone | CallError::Protocol => StatusCode::SERVICE_UNAVAILABLE,
            // Stopped because its caller lost the right (ops say so before this is reached).
            CallError::Agent(AgentError::Cancelled) | CallError::Cancelled => StatusCode::FORBIDDEN,
        },
    }
}

impl ApiError {
    /// The status and the body a client is told: what every door answers, in its own shape.
    pub(crate) fn status_and_body(&self) -> (StatusCode, ErrorBody) {
        let status = match &self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::TooMany | ApiError::TooManyFor(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Denied(_) => StatusCode::FORBIDDEN,
            ApiError::Gone | ApiError::GoneBecause(_) => StatusCode::GONE,
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Busy => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Sandbox(e) => {
                if let SandboxError::Store(e) = e {
                    tracing::error!(error = ?e, "storage error");
                }
                sandbox_status(e)
            }
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Spent(_) => StatusCode::PAYMENT_REQUIRED,
            ApiError::Repo(e) => {
                use crate::repos::RepoError as R;
                match e {
                    R::BadUrl(_) | R::NoBranch(_) => StatusCode::BAD_REQUEST,
                    R::Refused(_) => StatusCode::FORBIDDEN,
                    R::Rejected => StatusCode::CONFLICT,
                    R::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                    R::Auth | R::Failed(_) => StatusCode::BAD_GATEWAY,
                    R::Timeout => StatusCode::GATEWAY_TIMEOUT,
                }
            }
            // Fail closed: when the database does not answer, nothing happens.
            ApiError::Store(e) => {
                tracing::error!(error = ?e, "storage error");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let body = match &self {
            ApiError::Sandbox(SandboxError::Call(CallError::Agent(e))) => agent_error(e),
            ApiError::Internal | ApiError::Store(_) => ErrorBody {
                error: self.to_string(),
                error_id: Some(crate::ids::error_id()),
            },
            _ => ErrorBody {
                error: self.to_string(),
                error_id: None,
            },
        };
        (status, body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = self.status_and_body();
        if let Some(id) = &body.error_id {
            tracing::warn!(error_id = %id, error = ?self, "request failed");
        }
        if let ApiError::Spent(e) | ApiError::Sandbox(SandboxError::Budget(e)) = &self {
            // Which meter, how much of it was used, and the budget: enough to ask for a raise.
            let body = serde_json::json!({
                "error": body.error,
                "meter": e.meter,
                "used": e.used,
                "budget": e.budget,
                "scope": e.scope,
            });
            return (status, Json(body)).into_response();
        }
        let mut resp = (status, Json(body)).into_response();
        if let ApiError::TooManyFor(secs) = self {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(e: ApiError) -> (StatusCode, serde_json::Value) {
        let resp = e.into_response();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// Whatever the agent inside the sandbox says stays in the log: the client gets a stable
    /// message and the id of the log line.
    #[tokio::test]
    async fn text_from_inside_the_sandbox_never_reaches_the_client() {
        let said = "ATTACKER-TEXT <script>alert(1)</script>";
        for agent in [
            AgentError::Failed(said.into()),
            AgentError::Invalid(said.into()),
            AgentError::InvalidPath(said.into()),
        ] {
            let e = ApiError::Sandbox(SandboxError::Call(CallError::Agent(agent.clone())));
            let (status, body) = body_of(e).await;
            let text = body.to_string();
            assert!(!text.contains("ATTACKER"), "{agent:?} leaked: {text}");
            assert!(body["error"].as_str().is_some_and(|m| !m.is_empty()));
            let id = body["error_id"].as_str().unwrap();
            assert_eq!(id.len(), 16, "{body}");
            assert!(status.is_client_error(), "{status}");
        }
        let (status, body) = body_of(ApiError::Sandbox(SandboxError::Call(CallError::Agent(
            AgentError::NotFound,
        ))))
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"], "not found");
        assert!(body.get("error_id").is_none());
    }
}

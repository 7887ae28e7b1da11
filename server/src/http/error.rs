//! The one place where errors become HTTP responses. Clients get a safe message; the real
//! error is logged with the request.

use crate::sandbox::SandboxError;
use crate::store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

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
    #[error("{0}")]
    Denied(String),
    #[error("this link no longer works")]
    Gone,
    #[error("storage unavailable")]
    Store(#[from] StoreError),
    /// Bad input with a message built by the server (never from internal errors).
    #[error("{0}")]
    Invalid(String),
    #[error("internal error")]
    Internal,
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
}

fn sandbox_status(e: &SandboxError) -> StatusCode {
    use coderoom_sandbox::proto::AgentError;
    use coderoom_sandbox::CallError;
    match e {
        SandboxError::Unavailable(_) | SandboxError::Start | SandboxError::ShuttingDown => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        SandboxError::Failed(_) => StatusCode::CONFLICT,
        SandboxError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        SandboxError::Call(c) => match c {
            CallError::Agent(AgentError::NotFound) => StatusCode::NOT_FOUND,
            CallError::Agent(AgentError::InvalidPath(_)) => StatusCode::BAD_REQUEST,
            CallError::Agent(AgentError::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
            CallError::Agent(AgentError::Invalid(_)) => StatusCode::CONFLICT,
            CallError::Agent(AgentError::Failed(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            CallError::Timeout => StatusCode::GATEWAY_TIMEOUT,
            CallError::Gone | CallError::Protocol => StatusCode::SERVICE_UNAVAILABLE,
        },
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::TooMany => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Denied(_) => StatusCode::FORBIDDEN,
            ApiError::Gone => StatusCode::GONE,
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Sandbox(e) => {
                if let SandboxError::Store(e) = e {
                    tracing::error!(error = ?e, "storage error");
                }
                sandbox_status(e)
            }
            // Fail closed: when the database does not answer, nothing happens.
            ApiError::Store(e) => {
                tracing::error!(error = ?e, "storage error");
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let mut resp = (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

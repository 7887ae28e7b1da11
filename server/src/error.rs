//! The one place where errors become HTTP responses. Clients get a safe message; the real
//! error is logged with the request.

use crate::store::StoreError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
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

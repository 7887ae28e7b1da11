//! Bearer-token sessions. Tokens are 256 random bits; only their SHA-256 is stored, so a
//! database leak does not hand out live sessions.

use crate::app::AppState;
use crate::error::ApiError;
use crate::store::{now_ms, Store, StoreError, UserRow};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use rand::RngCore;
use sha2::{Digest, Sha256};

const TOKEN_PREFIX: &str = "crt_";

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct AuthUser {
    pub id: String,
    pub email: String,
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Creates a session for the user and returns the token (shown once, never stored).
pub async fn issue_token(store: &Store, user_id: &str, ttl_s: u64) -> Result<String, StoreError> {
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    let token = format!("{TOKEN_PREFIX}{}", hex::encode(raw));
    let ttl_ms = i64::try_from(ttl_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    store
        .insert_session(
            &hash_token(&token),
            user_id,
            now_ms().saturating_add(ttl_ms),
        )
        .await?;
    Ok(token)
}

/// Creates the user if needed and returns it.
pub async fn ensure_user(store: &Store, email: &str) -> Result<UserRow, StoreError> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    store
        .upsert_user(&id, &email.trim().to_ascii_lowercase())
        .await
}

impl FromRequestParts<AppState> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(ApiError::Unauthorized)?;
        let token = header
            .strip_prefix("Bearer ")
            .map(str::trim)
            .filter(|t| t.starts_with(TOKEN_PREFIX) && t.len() <= 128)
            .ok_or(ApiError::Unauthorized)?;
        let user = state
            .store
            .session_user(&hash_token(token), now_ms())
            .await?
            .ok_or(ApiError::Unauthorized)?;
        Ok(AuthUser {
            id: user.id,
            email: user.email,
        })
    }
}

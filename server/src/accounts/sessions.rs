//! Sessions: opaque 256-bit tokens, stored only as SHA-256, presented either as a bearer token
//! (agents, scripts) or as the session cookie (browsers).
//!
//! Cookie-authenticated requests that change state, and WebSocket upgrades, must carry an
//! `Origin` equal to the server's public origin: a page on another site can make the browser
//! send the cookie, but not forge the Origin (cross-site request forgery and cross-site
//! WebSocket hijacking). Bearer tokens are not sent automatically by browsers, so they need no
//! Origin.

use crate::store::{Store, StoreError, UserRow};
use axum::http::{HeaderMap, HeaderValue};
use rand::RngCore;
use sha2::{Digest, Sha256};

const TOKEN_PREFIX: &str = "crt_";
/// Absolute session lifetime.
pub(crate) const SESSION_ABSOLUTE_S: u64 = 30 * 24 * 3600;
/// A session unused for this long is dead.
pub(crate) const SESSION_IDLE_MS: i64 = 7 * 24 * 3600 * 1000;

/// The session cookie's name and attributes, fixed by `--public-url`.
#[derive(Debug, Clone)]
pub(crate) struct CookieConfig {
    name: &'static str,
    secure: bool,
}

/// The names the app's session cookie has (HTTPS deployments take the `__Host-` one): never
/// forwarded to a preview's app, whatever scope a deployment gave the cookie.
pub(crate) const SESSION_COOKIE_NAMES: [&str; 2] = ["__Host-coderoom_session", "coderoom_session"];

impl CookieConfig {
    /// HTTPS deployments get `Secure` and the `__Host-` prefix (no Domain, Path=/, Secure).
    pub(crate) fn for_origin(origin: &str) -> Self {
        let secure = origin.starts_with("https://");
        CookieConfig {
            name: if secure {
                SESSION_COOKIE_NAMES[0]
            } else {
                SESSION_COOKIE_NAMES[1]
            },
            secure,
        }
    }

    pub(crate) fn set(&self, token: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let v = format!(
            "{}={token}; Path=/; HttpOnly; SameSite=Lax; Max-Age={SESSION_ABSOLUTE_S}{secure}",
            self.name
        );
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    pub(crate) fn clear(&self) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let v = format!(
            "{}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{secure}",
            self.name
        );
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

pub(crate) fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new session token (256 random bits): shown once, stored only as its hash.
pub(crate) fn fresh_token() -> String {
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    format!("{TOKEN_PREFIX}{}", hex::encode(raw))
}

/// Creates a session for the user, valid for `ttl_s` from `now` (Unix ms), and returns the
/// token (shown once, never stored).
pub(crate) async fn issue_token(
    store: &Store,
    user_id: &str,
    ttl_s: u64,
    now: i64,
) -> Result<String, StoreError> {
    let token = fresh_token();
    let ttl_ms = i64::try_from(ttl_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    store
        .insert_session(&hash_token(&token), user_id, now.saturating_add(ttl_ms))
        .await?;
    Ok(token)
}

/// Creates the user if needed and returns it. `email` must be canonical (see `email.rs`).
pub(crate) async fn ensure_user(store: &Store, email: &str) -> Result<UserRow, StoreError> {
    let id = crate::ids::UserId::fresh().to_string();
    store.upsert_user(&id, email).await
}

pub(crate) fn well_formed(token: &str) -> bool {
    token.starts_with(TOKEN_PREFIX)
        && token.len() == TOKEN_PREFIX.len() + 64
        && token[TOKEN_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

/// The session token in the request's cookie, if any.
pub(crate) fn session_cookie(headers: &HeaderMap, cookie: &CookieConfig) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, v)| *k == cookie.name && well_formed(v))
        .map(|(_, v)| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_attributes_follow_the_public_origin() {
        let https = CookieConfig::for_origin("https://rooms.example.com");
        let v = https.set("crt_x");
        let v = v.to_str().unwrap();
        assert!(v.starts_with("__Host-coderoom_session=crt_x; Path=/; HttpOnly; SameSite=Lax"));
        assert!(v.ends_with("; Secure"));
        let http = CookieConfig::for_origin("http://127.0.0.1:8080");
        let v = http.set("crt_x");
        assert!(v.to_str().unwrap().starts_with("coderoom_session=crt_x;"));
        assert!(!v.to_str().unwrap().contains("Secure"));
    }

    #[test]
    fn cookie_parsing_ignores_other_and_malformed_cookies() {
        let c = CookieConfig::for_origin("http://x");
        let good = format!("crt_{}", "a".repeat(64));
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&format!(
                "a=b; coderoom_session=junk; coderoom_session={good}"
            ))
            .unwrap(),
        );
        assert_eq!(session_cookie(&h, &c), Some(good));
    }
}

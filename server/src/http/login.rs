//! Email magic-code login: `POST /api/auth/code`, `/verify`, `/logout`, `GET /api/me`. The
//! codes themselves are `accounts::codes`; `/api/auth/*` is rate limited per client address.

use crate::accounts::codes::{
    dummy_hash, gate, issue_wait_ms, new_code, Gate, HashError, CODE_TTL_MS, ISSUE_CAPS,
    MAX_ATTEMPTS,
};
use crate::accounts::email::canonicalize;
use crate::accounts::mail::Mail;
use crate::accounts::sessions as auth;
use crate::http::extract::ClientIp;
use crate::http::{ApiError, AppState, AuthUser};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let limits = &state.limits;
    let governor = tower_governor::governor::GovernorConfigBuilder::default()
        .key_extractor(crate::http::extract::ClientIpKey(
            state.trusted_proxies.clone(),
        ))
        .period(std::time::Duration::from_millis(
            limits.auth_replenish_ms.max(1),
        ))
        .burst_size(limits.auth_burst.max(1))
        .finish()
        .map(Arc::new);
    // Only the routes that take a code are limited: they cost argon2 work and guard accounts.
    // Logging out and asking who one is never are (a shared office address that spent its
    // burst must not keep anyone logged in).
    let mut auth = Router::new()
        .route("/api/auth/code", post(request_code))
        .route("/api/auth/verify", post(verify_code));
    if let Some(config) = governor {
        // Forget idle client keys, so distinct addresses cannot grow the limiter without bound.
        let limiter = config.limiter().clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                limiter.retain_recent();
                limiter.shrink_to_fit();
            }
        });
        // Refused before any handler (so before any argon2 work) runs, saying when to come
        // back (the limiter's own wait, at least a second).
        auth = auth.layer(
            tower_governor::GovernorLayer::new(config).error_handler(|e| match e {
                tower_governor::GovernorError::TooManyRequests { wait_time, .. } => {
                    ApiError::TooManyFor(wait_time.max(1)).into_response()
                }
                _ => ApiError::TooMany.into_response(),
            }),
        );
    }
    auth.route("/api/auth/logout", post(logout))
        .route("/api/me", get(me).put(set_me))
}

#[derive(Deserialize)]
pub(crate) struct CodeRequest {
    email: String,
}

#[derive(Deserialize)]
pub(crate) struct VerifyRequest {
    email: String,
    code: String,
}

fn accepted() -> Response {
    (StatusCode::ACCEPTED, Json(Sent { status: "sent" })).into_response()
}

fn unauthorized() -> Response {
    ApiError::Unauthorized.into_response()
}

fn hash_error(e: HashError) -> Response {
    tracing::warn!(error = %e, "login hashing unavailable");
    ApiError::Busy.into_response()
}

pub(crate) async fn request_code(
    State(app): State<AppState>,
    ip: ClientIp,
    Json(body): Json<CodeRequest>,
) -> Result<Response, ApiError> {
    let email =
        canonicalize(&body.email).map_err(|_| ApiError::BadRequest("invalid email address"))?;
    let now = app.ops.clock.now_ms();
    {
        let _one_at_a_time = app.issuance.lock().await;
        let recent = app
            .ops
            .store
            .recent_issuance(&email, now - ISSUE_CAPS[1].0)
            .await?;
        let wait = issue_wait_ms(&recent, now);
        if wait > 0 {
            app.ops
                .store
                .auth_event("code_rate_limited", Some(&email), None, &ip.to_string())
                .await?;
            // Whole seconds, rounded up: asking again after them is taken.
            return Err(ApiError::TooManyFor((wait as u64).div_ceil(1000)));
        }
        app.ops.store.record_issuance(&email, now).await?;
    }
    let code = new_code();
    let hash = match app.hasher.hash(code.clone()).await {
        Ok(h) => h,
        Err(e) => return Ok(hash_error(e)),
    };
    // The same work for every address: known, unknown and disabled accounts all get a stored
    // code; only the mail is skipped for a disabled account (queued off the request path).
    app.ops
        .store
        .put_login_code(&email, &hash, now, now + CODE_TTL_MS)
        .await?;
    let disabled = app.ops.store.user_disabled(&email).await?;
    app.ops
        .store
        .auth_event("code_issued", Some(&email), None, &ip.to_string())
        .await?;
    if !disabled {
        app.mailer.send(Mail {
            to: email.clone(),
            subject: "Your Coderoom login code".into(),
            body: format!(
                "Your Coderoom login code is {code}\r\n\r\nIt works once, for 10 minutes.\r\n\
                 If you did not ask for it, ignore this mail.\r\n"
            ),
        });
    }
    Ok(accepted())
}

pub(crate) async fn verify_code(
    State(app): State<AppState>,
    ip: ClientIp,
    headers: HeaderMap,
    Json(body): Json<VerifyRequest>,
) -> Result<Response, ApiError> {
    let ip = ip.to_string();
    let Ok(email) = canonicalize(&body.email) else {
        return Ok(unauthorized());
    };
    let well_formed = body.code.len() == 6 && body.code.bytes().all(|b| b.is_ascii_digit());
    let stored = app.ops.store.login_code(&email).await?;
    let now = app.ops.clock.now_ms();
    let checkable = well_formed && gate(stored.as_ref(), now) == Gate::Check;
    let (hash, reserved) = match (&stored, checkable) {
        // Take one try before hashing, atomically, so concurrent guesses cannot exceed five.
        (Some(c), true) => (
            c.code_hash.clone(),
            app.ops
                .store
                .take_attempt(&email, &c.code_hash, MAX_ATTEMPTS)
                .await?,
        ),
        _ => (dummy_hash(), None),
    };
    let verified = app.hasher.verify(body.code.clone(), hash.clone()).await;
    let ok = matches!(verified, Ok(true)) && reserved.is_some();
    // The count this request's own try reached (not the one read before it: concurrent guesses
    // read the same), so exactly one request spends the last try; unless it was right, it voids
    // the code and says so, even when hashing was refused (that try is spent all the same).
    if !ok && reserved.is_some_and(|attempts| attempts >= MAX_ATTEMPTS) {
        app.ops.store.void_login_code(&email, &hash).await?;
        app.ops
            .store
            .auth_event("code_locked", Some(&email), None, &ip)
            .await?;
    }
    if let Err(e) = verified {
        return Ok(hash_error(e));
    }
    if !ok {
        app.ops
            .store
            .auth_event("login_failed", Some(&email), None, &ip)
            .await?;
        return Ok(unauthorized());
    }
    // Single use: only the request that deletes the row logs in.
    if !app.ops.store.void_login_code(&email, &hash).await? {
        app.ops
            .store
            .auth_event("login_failed", Some(&email), None, &ip)
            .await?;
        return Ok(unauthorized());
    }
    let user = auth::ensure_user(&app.ops.store, &email).await?;
    if app.ops.store.user_disabled(&email).await? {
        app.ops
            .store
            .auth_event("login_failed", Some(&email), Some(&user.id), &ip)
            .await?;
        return Ok(unauthorized());
    }
    // Rotate: a session presented with this request ends; a new one begins.
    if let Some(old) = auth::session_cookie(&headers, &app.cookie) {
        app.ops
            .store
            .delete_session(&auth::hash_token(&old))
            .await?;
    }
    let token = auth::issue_token(
        &app.ops.store,
        &user.id,
        auth::SESSION_ABSOLUTE_S,
        app.ops.clock.now_ms(),
    )
    .await?;
    app.ops
        .store
        .auth_event("login_ok", Some(&email), Some(&user.id), &ip)
        .await?;
    let mut resp = Json(LoggedIn {
        user: Me {
            id: user.id,
            email: user.email,
            is_admin: None,
            display_name: None,
        },
    })
    .into_response();
    resp.headers_mut()
        .insert(axum::http::header::SET_COOKIE, app.cookie.set(&token));
    Ok(resp)
}

pub(crate) async fn logout(
    State(app): State<AppState>,
    user: AuthUser,
) -> Result<Response, ApiError> {
    app.ops.store.delete_session(&user.session_hash).await?;
    app.ops
        .store
        .auth_event("logout", Some(&user.email), Some(&user.id), "")
        .await?;
    // Sockets opened with this session end too.
    crate::ops::events::session_ended(
        &app.ops,
        user.session_hash.clone(),
        std::time::Instant::now(),
    )
    .await;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut()
        .insert(axum::http::header::SET_COOKIE, app.cookie.clear());
    Ok(resp)
}

pub(crate) async fn me(State(app): State<AppState>, user: AuthUser) -> Result<Json<Me>, ApiError> {
    let is_admin = app.ops.admin_emails.contains(&user.email);
    let display_name = app.ops.store.display_name(&user.id).await?;
    Ok(Json(Me {
        id: user.id,
        email: user.email,
        is_admin: Some(is_admin),
        display_name: Some(display_name),
    }))
}

/// `PUT /api/me` `{"display_name": "Ana Lima" | null}`: the name the caller is shown by.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MeChange {
    display_name: Option<String>,
}

pub(crate) async fn set_me(
    State(app): State<AppState>,
    user: AuthUser,
    Json(change): Json<MeChange>,
) -> Result<Json<Me>, ApiError> {
    // An agent is shown by the name it was brought in with, never one it picks.
    if user
        .email
        .ends_with(&format!("@{}", crate::store::AGENT_DOMAIN))
    {
        return Err(ApiError::Denied(
            "an agent is shown by the name it was brought in with".into(),
        ));
    }
    let name = app
        .ops
        .set_display_name(&user.id, change.display_name.as_deref())
        .await?;
    Ok(Json(Me {
        is_admin: Some(app.ops.admin_emails.contains(&user.email)),
        id: user.id,
        email: user.email,
        display_name: Some(name),
    }))
}

/// `202` from `POST /api/auth/code` (for every address alike).
#[derive(Serialize)]
pub(crate) struct Sent {
    status: &'static str,
}

/// `POST /api/auth/verify`: who is now logged in (the cookie carries the session).
#[derive(Serialize)]
pub(crate) struct LoggedIn {
    user: Me,
}

/// `GET /api/me` (and the user of a login).
#[derive(Serialize)]
pub(crate) struct Me {
    id: String,
    email: String,
    /// Said by `GET /api/me` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    is_admin: Option<bool>,
    /// The name chosen to be shown by (`GET`/`PUT /api/me`; null until chosen).
    #[serde(skip_serializing_if = "Option::is_none")]
    display_name: Option<Option<String>>,
}

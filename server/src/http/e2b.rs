//! The E2B-compatible door (issue 39): the stock E2B SDKs drive a room's sandbox unchanged,
//! under the room's authority. An adapter over the room operations with no policy of its own:
//! a command is `Ops::run_command` (rights, approval mode, budget, moderation, audit), a file
//! is `Ops::file_op`, a start is `Ops::start_sandbox`, whatever the SDK calls them.
//!
//! What the SDKs send is in `../shared/spec/e2b.md`; how a sandbox id maps to a room and what
//! is supported, in `docs/e2b.md`. In short: the API key (`X-API-KEY`) and the envd access
//! token (`X-Access-Token`) are a Coderoom bearer token; the sandbox id is the room's id; an
//! agent's key opens its own room, a person's names the room in the create call's metadata
//! (`{"room": "<id>"}`). A sandbox "created" is the caller's session in the room: `kill()` and
//! the timeout end that session (everything the caller runs there stops), never the room.
//!
//! Routes: the control plane under `/api/e2b` (`E2B_API_URL=<origin>/api/e2b`), envd under
//! `/api/e2b/envd` (`E2B_SANDBOX_URL=<origin>/api/e2b/envd`, the sandbox named by the
//! `E2b-Sandbox-Id` header).

mod connect;
mod filesystem;
mod interpreter;
mod process;
mod watch;

pub(crate) use interpreter::Kernels;
pub(crate) use process::Running;
pub(crate) use watch::Watchers;

use crate::http::extract::{token_user, AuthUser};
use crate::http::{ApiError, AppState};
use crate::ids::RoomId;
use crate::ops::Actor;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use connect::{Code, ConnectError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Mutex;

mod files;

/// The envd version this door answers: the features it implements (the SDKs compare it: stdin
/// 0.3.0, a default user 0.4.0, closing stdin 0.5.2, octet-stream uploads 0.5.7; not file
/// metadata, 0.6.2, nor entry info in watch events, 0.6.3).
const ENVD_VERSION: &str = "0.5.7";
/// A session's life when the create call names none (E2B's default), and the longest.
const DEFAULT_TIMEOUT_S: u64 = 300;
const MAX_TIMEOUT_S: u64 = 24 * 3600;
/// Sessions one server keeps at once.
const MAX_SESSIONS: usize = 10_000;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/e2b/sandboxes", post(create))
        .route("/api/e2b/v2/sandboxes", post(create).get(list))
        .route("/api/e2b/sandboxes/{id}", get(info).delete(kill))
        .route("/api/e2b/sandboxes/{id}/timeout", post(set_timeout))
        .route("/api/e2b/v2/sandboxes/{id}/connect", post(reconnect))
        .route("/api/e2b/envd/health", get(health))
        .merge(files::routes())
        .merge(process::routes())
        .merge(watch::routes())
        .merge(interpreter::routes())
        .merge(filesystem::routes())
        .route("/api/e2b/envd/{service}/{method}", post(unimplemented))
        .route("/api/e2b/{*rest}", axum::routing::any(plane_unimplemented))
}

/// A control-plane call this door does not serve (pausing, snapshots, metrics, templates...):
/// a 501 that says so (never the app's pages).
async fn plane_unimplemented(Path(rest): Path<String>) -> PlaneError {
    let name: String = rest.chars().take(100).collect();
    PlaneError(
        StatusCode::NOT_IMPLEMENTED,
        format!("/{name} is not supported by this server (see docs/e2b.md)"),
    )
}

/// Callers' sessions in rooms, by (room, user): when each started and when it ends, and the
/// hash of its envd access token (a fresh token per session, shown once in the create answer:
/// it opens envd for that room and caller only, and dies with the session).
#[derive(Default)]
pub(crate) struct Sessions {
    all: Mutex<HashMap<(RoomId, String), Session>>,
    /// `--e2b-domain` (lowercase): its hosts are the door's alone.
    domain: Option<String>,
    /// What create answers as `domain` (the SDKs build `{port}-{id}.{domain}` from it).
    answered: String,
}

/// The sandboxes' domain when neither `--e2b-domain` nor previews give one: it resolves
/// nowhere (RFC 6761), never to E2B's own (where the SDK would otherwise send).
const NO_DOMAIN: &str = "e2b.invalid";

/// Domains of E2B's own, never answered as a sandbox's domain (the SDK would send there).
const E2B_DOMAINS: [&str; 3] = ["e2b.app", "e2b.dev", "e2b-staging.dev"];

#[derive(Debug, Clone)]
struct Session {
    started_ms: i64,
    end_ms: i64,
    template: String,
    metadata: Value,
    email: String,
    token_hash: String,
}

impl Sessions {
    /// Sessions, with the sandboxes' domain: `--e2b-domain` `domain` (checked: a DNS name of
    /// the operator's, neither E2B's nor the app's host, above or below it), else the preview
    /// origin's (`{port}-{room}.` names there are rooms' ports), else a name that resolves
    /// nowhere (`get_host` then names nothing that answers: ports need one of the two).
    pub(crate) fn for_domain(
        domain: Option<&str>,
        app_origin: &str,
        previews: Option<&crate::http::previews::PreviewOrigin>,
    ) -> anyhow::Result<Sessions> {
        let Some(domain) = domain else {
            let answered = previews.map_or_else(|| NO_DOMAIN.to_owned(), |p| p.e2b_domain());
            return Ok(Sessions {
                all: Mutex::default(),
                domain: None,
                answered,
            });
        };
        let domain = domain.trim().trim_end_matches('.').to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if domain.len() > 200 || !domain.contains('.') || !domain.split('.').all(label_ok) {
            anyhow::bail!("--e2b-domain must be a DNS name like e2b.example.com, not {domain:?}");
        }
        if E2B_DOMAINS
            .iter()
            .any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
        {
            anyhow::bail!("--e2b-domain must be a domain of yours, not E2B's ({domain})");
        }
        let app_host = crate::http::previews::origin_host(app_origin);
        // Code in a sandbox serves pages under this domain: they must not set cookies the
        // app's host would get (as for previews, another site altogether is best).
        if domain == app_host
            || app_host.ends_with(&format!(".{domain}"))
            || domain.ends_with(&format!(".{app_host}"))
        {
            anyhow::bail!(
                "--e2b-domain must be neither the app's host ({app_host}) nor above or below it"
            );
        }
        Ok(Sessions {
            all: Mutex::default(),
            answered: domain.clone(),
            domain: Some(domain),
        })
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<(RoomId, String), Session>> {
        self.all.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live session whose envd token hashes to `hash`: its room, user and email.
    fn by_token(&self, hash: &str, now_ms: i64) -> Option<(RoomId, String, String)> {
        self.locked()
            .iter()
            .find(|(_, s)| s.token_hash == hash && s.end_ms > now_ms)
            .map(|((r, u), s)| (r.clone(), u.clone(), s.email.clone()))
    }

    /// Whether `user` has a live session in `room`.
    fn alive(&self, room: &RoomId, user: &str, now_ms: i64) -> bool {
        self.locked()
            .get(&(room.clone(), user.to_owned()))
            .is_some_and(|s| s.end_ms > now_ms)
    }

    /// Sessions past their end, taken out.
    fn expired(&self, now_ms: i64) -> Vec<(RoomId, String)> {
        let mut all = self.locked();
        let gone: Vec<_> = all
            .iter()
            .filter(|(_, s)| s.end_ms <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &gone {
            all.remove(k);
        }
        gone
    }
}

/// Ends sessions at their timeout: what the caller runs in the room stops (its commands, the
/// terminal jobs it started), the room and its sandbox go on. Runs for the server's life.
pub(crate) fn start_sweeper(state: AppState) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = state.shutdown.cancelled() => return,
            }
            for (room, user) in state.e2b.expired(state.ops.now_ms()) {
                state
                    .ops
                    .stop_units(&room, &user, "its E2B session timed out")
                    .await;
            }
        }
    });
}

/// A control-plane error as the SDKs read it: `{"code": <status>, "message"}`.
pub(crate) struct PlaneError(StatusCode, String);

impl From<ApiError> for PlaneError {
    fn from(e: ApiError) -> PlaneError {
        let (status, body) = e.status_and_body();
        PlaneError(status, body.error)
    }
}

impl From<crate::ops::OpError> for PlaneError {
    fn from(e: crate::ops::OpError) -> PlaneError {
        PlaneError::from(ApiError::from(e))
    }
}

impl From<ConnectError> for PlaneError {
    fn from(e: ConnectError) -> PlaneError {
        PlaneError(StatusCode::BAD_REQUEST, e.message)
    }
}

/// Also envd's plain-HTTP errors (`/files`): the SDKs read them the same way.
impl IntoResponse for PlaneError {
    fn into_response(self) -> Response {
        let body = json!({ "code": self.0.as_u16(), "message": self.1 });
        (self.0, Json(body)).into_response()
    }
}

fn bad(message: &str) -> PlaneError {
    PlaneError(StatusCode::BAD_REQUEST, message.to_owned())
}

/// Whoever calls, by the token in `X-API-KEY` (the control plane), `X-Access-Token` (envd) or
/// `Authorization: Bearer`; an agent's token is bound to its room.
pub(crate) struct E2bCaller {
    user: AuthUser,
    bound: Option<RoomId>,
}

impl FromRequestParts<AppState> for E2bCaller {
    type Rejection = PlaneError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, PlaneError> {
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        };
        let token = header("x-api-key")
            .or_else(|| header("x-access-token"))
            .or_else(|| header("authorization").and_then(|h| h.strip_prefix("Bearer ")))
            .ok_or_else(|| {
                PlaneError(
                    StatusCode::UNAUTHORIZED,
                    "an API key is needed: a Coderoom token in E2B_API_KEY".into(),
                )
            })?;
        let (user, bound) = token_user(state, token).await?;
        Ok(E2bCaller { user, bound })
    }
}

impl E2bCaller {
    async fn actor(&self, app: &AppState) -> Result<Actor, ApiError> {
        self.user.actor(app).await
    }

    /// The room sandbox id `id` names, if this caller may see it (an agent: its own room).
    async fn room(&self, app: &AppState, id: &str) -> Result<(RoomId, Actor), ApiError> {
        let room = RoomId::parse(id).ok_or(ApiError::NotFound)?;
        if self.bound.as_ref().is_some_and(|b| *b != room) {
            return Err(ApiError::NotFound);
        }
        let actor = self.actor(app).await?;
        app.ops.capabilities(&room, &actor).await?;
        Ok((room, actor))
    }
}

/// What the create and connect calls take (the rest of E2B's fields are ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Create {
    #[serde(rename = "templateID", default)]
    template_id: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    timeout: Option<u64>,
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: the caller's session in a room, its sandbox
/// started (through the one start operation) when the caller may start it.
async fn create(
    State(app): State<AppState>,
    caller: E2bCaller,
    body: axum::body::Bytes,
) -> Result<Response, PlaneError> {
    let asked: Create = if body.is_empty() {
        Create::default()
    } else {
        serde_json::from_slice(&body).map_err(|_| bad("the body is not a sandbox to create"))?
    };
    let named = asked
        .metadata
        .as_ref()
        .and_then(|m| m.get("room"))
        .and_then(Value::as_str);
    let room = match (&caller.bound, named) {
        (Some(own), Some(n)) if n != own.as_str() => {
            return Err(bad("an agent's key is bound to its own room; leave metadata.room out"))
        }
        (Some(own), _) => own.as_str().to_owned(),
        (None, Some(n)) => n.to_owned(),
        (None, None) => {
            return Err(bad(
                "name the room in the sandbox's metadata: {\"room\": \"<room id>\"} (an agent's key needs none)",
            ))
        }
    };
    attach(&app, &caller, &room, &asked).await
}

/// `POST /v2/sandboxes/{id}/connect`: the caller's session in that room, made or extended.
async fn reconnect(
    State(app): State<AppState>,
    caller: E2bCaller,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, PlaneError> {
    let asked: Create = serde_json::from_slice(&body).unwrap_or_default();
    attach(&app, &caller, &id, &asked).await
}

/// The caller's session in room `id` (its sandbox started when the caller may start it),
/// answered as the create call's 201.
async fn attach(
    app: &AppState,
    caller: &E2bCaller,
    id: &str,
    asked: &Create,
) -> Result<Response, PlaneError> {
    let (room, actor) = caller.room(app, id).await?;
    app.ops.attach_sandbox(&room, &actor).await?;
    let (session, token) = open_session(app, &room, &caller.user, asked)?;
    Ok((
        StatusCode::CREATED,
        Json(created(app, &room, &session, &token)),
    )
        .into_response())
}

/// Opens (or extends) `user`'s session in `room`, with a fresh envd access token.
fn open_session(
    app: &AppState,
    room: &RoomId,
    user: &AuthUser,
    asked: &Create,
) -> Result<(Session, String), PlaneError> {
    let token = crate::accounts::sessions::fresh_token();
    let token_hash = crate::accounts::sessions::hash_token(&token);
    let now = app.ops.now_ms();
    let timeout = asked
        .timeout
        .unwrap_or(DEFAULT_TIMEOUT_S)
        .clamp(1, MAX_TIMEOUT_S);
    let mut all = app.e2b.locked();
    let key = (room.clone(), user.id.clone());
    if all.len() >= MAX_SESSIONS && !all.contains_key(&key) {
        return Err(PlaneError(
            StatusCode::TOO_MANY_REQUESTS,
            "too many sandbox sessions on this server".into(),
        ));
    }
    let session = all.entry(key).or_insert_with(|| Session {
        started_ms: now,
        end_ms: now,
        template: asked.template_id.clone().unwrap_or_else(|| "base".into()),
        metadata: asked.metadata.clone().unwrap_or_else(|| json!({})),
        email: user.email.clone(),
        token_hash: String::new(),
    });
    session.end_ms = now + i64::try_from(timeout * 1000).unwrap_or(i64::MAX);
    // A new token each time: whoever held an earlier one of this session holds nothing now.
    session.token_hash = token_hash;
    Ok((session.clone(), token))
}

/// The create answer: the room is the sandbox; envd calls carry `token` as `X-Access-Token`.
fn created(app: &AppState, room: &RoomId, session: &Session, token: &str) -> Value {
    let mut v = json!({
        "templateID": session.template,
        "sandboxID": room.as_str(),
        "clientID": "coderoom",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        // What the code interpreter's calls carry (they send no envd token).
        "trafficAccessToken": token,
    });
    // Where the SDK finds the sandbox's envd and ports when no E2B_SANDBOX_URL says (never
    // left out: the SDK would fall back to E2B's own).
    v["domain"] = json!(app.e2b.answered);
    v
}

/// `GET /sandboxes/{id}`.
async fn info(
    State(app): State<AppState>,
    caller: E2bCaller,
    Path(id): Path<String>,
) -> Result<Response, PlaneError> {
    let (room, _) = caller.room(&app, &id).await?;
    let session = app
        .e2b
        .locked()
        .get(&(room.clone(), caller.user.id.clone()))
        .cloned();
    Ok(Json(detail(&app, &room, session.as_ref()).await).into_response())
}

/// `GET /v2/sandboxes`: the caller's sessions.
async fn list(State(app): State<AppState>, caller: E2bCaller) -> Result<Response, PlaneError> {
    let mine: Vec<(RoomId, Session)> = app
        .e2b
        .locked()
        .iter()
        .filter(|((_, u), _)| *u == caller.user.id)
        .map(|((r, _), s)| (r.clone(), s.clone()))
        .collect();
    let mut out = Vec::new();
    for (room, session) in mine {
        out.push(detail(&app, &room, Some(&session)).await);
    }
    Ok(Json(out).into_response())
}

async fn detail(app: &AppState, room: &RoomId, session: Option<&Session>) -> Value {
    let now = app.ops.now_ms();
    let status = app.ops.sandboxes.status(room).await.ok();
    let running = status.as_ref().is_some_and(|s| s.running());
    let limits = status
        .as_ref()
        .map(|s| s.limits().clone())
        .unwrap_or_default();
    let (started, end) = session.map_or((now, now), |s| (s.started_ms, s.end_ms));
    json!({
        "templateID": session.map_or("base", |s| s.template.as_str()),
        "sandboxID": room.as_str(),
        "clientID": "coderoom",
        "startedAt": rfc3339(started),
        "endAt": rfc3339(end),
        "envdVersion": ENVD_VERSION,
        "cpuCount": limits.cpu_millis.div_ceil(1000).max(1),
        "memoryMB": limits.memory_bytes >> 20,
        "diskSizeMB": limits.workspace_bytes >> 20,
        "state": if running { "running" } else { "paused" },
        "metadata": session.map_or_else(|| json!({}), |s| s.metadata.clone()),
    })
}

fn rfc3339(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// `DELETE /sandboxes/{id}`: ends the caller's session (everything it runs in the room
/// stops); the room and its sandbox go on for whoever else is there.
async fn kill(
    State(app): State<AppState>,
    caller: E2bCaller,
    Path(id): Path<String>,
) -> Result<Response, PlaneError> {
    let (room, _) = caller.room(&app, &id).await?;
    let had = app
        .e2b
        .locked()
        .remove(&(room.clone(), caller.user.id.clone()))
        .is_some();
    if !had {
        return Err(PlaneError(
            StatusCode::NOT_FOUND,
            "no sandbox session of yours in this room".into(),
        ));
    }
    app.ops
        .stop_units(&room, &caller.user.id, "its E2B session was killed")
        .await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct Timeout {
    timeout: u64,
}

/// `POST /sandboxes/{id}/timeout`: when the caller's session ends, counted from now.
async fn set_timeout(
    State(app): State<AppState>,
    caller: E2bCaller,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, PlaneError> {
    let asked: Timeout = serde_json::from_slice(&body)
        .map_err(|_| bad("the body must be {\"timeout\": seconds}"))?;
    let (room, _) = caller.room(&app, &id).await?;
    let now = app.ops.now_ms();
    let mut all = app.e2b.locked();
    let Some(session) = all.get_mut(&(room, caller.user.id.clone())) else {
        return Err(PlaneError(
            StatusCode::NOT_FOUND,
            "no sandbox session of yours in this room".into(),
        ));
    };
    let secs = asked.timeout.clamp(1, MAX_TIMEOUT_S);
    session.end_ms = now + i64::try_from(secs * 1000).unwrap_or(i64::MAX);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// envd's `GET /health`.
async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// An envd call this door does not implement: Connect's `unimplemented`.
async fn unimplemented(Path((service, method)): Path<(String, String)>) -> Response {
    let name: String = format!("{service}/{method}").chars().take(100).collect();
    ConnectError::new(
        Code::Unimplemented,
        format!("{name} is not supported by this server (see docs/e2b.md)"),
    )
    .into_response()
}

/// The E2B SDKs' own address shape under `--e2b-domain` D (before routing): `api.D` is the
/// control plane (`/api/e2b`), `49983-{room}.D` and `49999-{room}.D` the room's envd and code
/// interpreter (`/api/e2b/envd`, the room named as `E2b-Sandbox-Id`), and `{port}-{room}.D`
/// another port (`previews::e2b_port`). A request for any host under D reaches nothing else.
pub(crate) async fn wildcard(
    State(app): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(domain) = app.e2b.domain.as_deref() else {
        return next.run(req).await;
    };
    let host = crate::http::previews::host_name(
        req.headers()
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().host())
            .unwrap_or_default(),
    );
    if host != domain && !host.ends_with(&format!(".{domain}")) {
        return next.run(req).await;
    }
    let not_found =
        || PlaneError(StatusCode::NOT_FOUND, "no such sandbox host".into()).into_response();
    let sub = host
        .strip_suffix(domain)
        .and_then(|s| s.strip_suffix('.'))
        .unwrap_or_default();
    if sub == "api" {
        return match rewritten(req, "/api/e2b", None) {
            Some(req) => next.run(req).await,
            None => not_found(),
        };
    }
    let Some((port, room)) = port_and_room(sub) else {
        return not_found();
    };
    if matches!(port, ENVD_PORT | INTERPRETER_PORT) {
        return match rewritten(req, "/api/e2b/envd", Some(&room)) {
            Some(req) => next.run(req).await,
            None => not_found(),
        };
    }
    let (mut parts, body) = req.into_parts();
    let caller = port_caller(&app, &mut parts, &room).await;
    let req = axum::extract::Request::from_parts(parts, body);
    crate::http::previews::e2b_port(&app, &room, port, caller, req)
        .await
        .map(axum::body::Body::new)
}

/// Who asks for a port of `room` (a live session's token in `E2B-Traffic-Access-Token`,
/// `X-Access-Token` or `Authorization: Bearer`), if anyone; the request keeps none of those
/// headers (what listens on the port never sees a caller's token).
pub(crate) async fn port_caller(app: &AppState, parts: &mut Parts, room: &RoomId) -> Option<Actor> {
    let token = ["e2b-traffic-access-token", "x-access-token"]
        .iter()
        .find_map(|h| parts.headers.get(*h).and_then(|v| v.to_str().ok()))
        .or_else(|| {
            parts
                .headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(|t| t.trim().to_owned());
    for h in [
        "e2b-traffic-access-token",
        "x-access-token",
        "authorization",
    ] {
        parts.headers.remove(h);
    }
    let caller = EnvdCaller::of_token(app, &token?, Some(room.as_str())).await;
    caller.ok().map(|c| c.actor)
}

/// The port and room a host's first label names as the SDKs build it (`{port}-{room}`).
pub(crate) fn port_and_room(label: &str) -> Option<(u16, RoomId)> {
    let (port, room) = label.split_once('-')?;
    Some((port.parse().ok()?, RoomId::parse(room)?))
}

/// envd's port and the code interpreter's, as the SDKs name them.
const ENVD_PORT: u16 = 49983;
const INTERPRETER_PORT: u16 = 49999;

/// `req` with `prefix` before its path, the room named in `E2b-Sandbox-Id` (whatever it
/// said), and no `Cookie` (the app's session never rides along to a sandbox's host).
fn rewritten(
    req: axum::extract::Request,
    prefix: &str,
    room: Option<&RoomId>,
) -> Option<axum::extract::Request> {
    let (mut parts, body) = req.into_parts();
    // No way out of the prefix.
    if parts.uri.path().split('/').any(|s| s == "..") {
        return None;
    }
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", axum::http::uri::PathAndQuery::as_str);
    parts.uri = format!("{prefix}{path_and_query}").parse().ok()?;
    if let Some(room) = room {
        parts.headers.insert(
            "e2b-sandbox-id",
            axum::http::HeaderValue::from_str(room.as_str()).ok()?,
        );
    }
    if !prefix.is_empty() {
        parts.headers.remove(axum::http::header::COOKIE);
    }
    Some(axum::extract::Request::from_parts(parts, body))
}

/// The caller of an envd call and the room its `E2b-Sandbox-Id` names.
pub(crate) struct EnvdCaller {
    pub(crate) room: RoomId,
    pub(crate) actor: Actor,
}

impl FromRequestParts<AppState> for EnvdCaller {
    type Rejection = ConnectError;

    /// The session the access token opens (its room must be the one `E2b-Sandbox-Id` names),
    /// its caller's rights in the room looked up again, as at every call.
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ConnectError> {
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        // The code interpreter's calls carry the session's token as the traffic token.
        let token = header("x-access-token")
            .or_else(|| header("e2b-traffic-access-token"))
            .ok_or_else(unauthenticated)?;
        EnvdCaller::of_token(state, token, header("e2b-sandbox-id")).await
    }
}

impl EnvdCaller {
    /// The caller of the live session whose token is `token` (its room must be `named`, when
    /// a request names one), its rights in the room looked up again, as at every call.
    async fn of_token(
        state: &AppState,
        token: &str,
        named: Option<&str>,
    ) -> Result<EnvdCaller, ConnectError> {
        let hash = crate::accounts::sessions::hash_token(token.trim());
        let (room, user, email) = state
            .e2b
            .by_token(&hash, state.ops.now_ms())
            .ok_or_else(unauthenticated)?;
        if named.is_some_and(|id| id != room.as_str()) {
            return Err(ConnectError::new(
                Code::NotFound,
                "this access token is for another sandbox",
            ));
        }
        let actor = state
            .ops
            .actor(&user, &email)
            .await
            .map_err(ApiError::from)?;
        state
            .ops
            .capabilities(&room, &actor)
            .await
            .map_err(ApiError::from)?;
        Ok(EnvdCaller { room, actor })
    }
}

/// No live session for the token an envd call carries.
fn unauthenticated() -> ConnectError {
    ConnectError::new(
        Code::Unauthenticated,
        "no live sandbox session for this access token: create or connect the sandbox",
    )
}

/// A path as the SDKs send it (absolute under `/home/user`, the room's workspace, or relative
/// to it) as the workspace path the room operations take.
pub(crate) fn workspace_path(raw: &str) -> Result<String, ConnectError> {
    const HOME: &str = "/home/user";
    let rel = if raw == HOME {
        ""
    } else if let Some(rest) = raw.strip_prefix(HOME).and_then(|r| r.strip_prefix('/')) {
        rest
    } else if raw.starts_with('/') {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!(
                "only the room's workspace, {HOME}, is reachable: {}",
                shown(raw)
            ),
        ));
    } else {
        raw
    };
    Ok(rel.trim_end_matches('/').to_owned())
}

/// A path for a message: bounded, whatever was sent.
fn shown(raw: &str) -> String {
    raw.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandboxes_domain_is_ours() {
        let d = Sessions::for_domain(None, "http://127.0.0.1:8080", None).unwrap();
        assert_eq!(
            (d.domain.as_deref(), d.answered.as_str()),
            (None, NO_DOMAIN)
        );
        let d = Sessions::for_domain(Some("E2B.Example.net."), "https://app.example.com", None)
            .unwrap();
        assert_eq!(d.domain.as_deref(), Some("e2b.example.net"));
        assert_eq!(d.answered, "e2b.example.net");
        for bad in [
            "e2b.app",
            "x.e2b.dev",
            "app.example.com",
            "example.com",
            "sub.app.example.com",
            "no_underscores.example",
            "-a.example",
            "nodot",
        ] {
            let made = Sessions::for_domain(Some(bad), "https://app.example.com", None);
            assert!(made.is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_map_into_the_workspace_and_nowhere_else() {
        assert_eq!(workspace_path("/home/user/a/b.py").unwrap(), "a/b.py");
        assert_eq!(workspace_path("a/b.py").unwrap(), "a/b.py");
        assert_eq!(workspace_path("/home/user").unwrap(), "");
        assert_eq!(workspace_path("/home/user/").unwrap(), "");
        assert!(workspace_path("/etc/passwd").is_err());
        assert!(workspace_path("/home/username/x").is_err());
    }
}

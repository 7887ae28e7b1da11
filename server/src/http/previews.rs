//! Previews: a port inside a room's sandbox, served on a separate origin (`--preview-url`,
//! `http://{id}.preview.localhost:8081` by example) by a listener of its own, so a preview can
//! never read or set the app's session cookie (host-only, on another host).
//!
//! API: `POST /api/rooms/{id}/previews` `{"port", "visibility": "room" | "public", "ttl_s"}`
//! (needs `publish`; a public one also someone else's approval, and waits as
//! `pending_approval`), `GET` (list), `DELETE .../previews/{pid}` (revoke: within a second every
//! open connection of it ends), `POST .../previews/{pid}/open` (a room preview's one-time link).
//!
//! Room previews are for members who may observe: the app hands out a one-time token (60 s),
//! the preview origin trades it for a cookie of its own host and redirects to the same URL
//! without it; every request checks the member still may observe, and open WebSockets are
//! checked every second.

use crate::http::bucket::Bucket;
use crate::http::extract::{Observing, OnRoom};
use crate::http::guard::room_capabilities;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use crate::ops::previews::NewPreview;
use crate::store::{PreviewRow, PreviewState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A one-time link's life.
const TOKEN_MS: i64 = 60_000;
/// A preview cookie's life.
const SESSION_MS: i64 = 8 * 3600 * 1000;
/// Live tokens and sessions kept (the oldest go first).
const MAX_LIVE: usize = 10_000;
/// The preview origin's cookie.
const COOKIE: &str = "coderoom_preview";
/// The one-time token's query parameter.
const TOKEN_PARAM: &str = "coderoom_preview_token";
/// How often an open WebSocket of a room preview checks its viewer may still observe.
const RECHECK: Duration = Duration::from_secs(1);
/// How often the requests previews answered are written to their counters.
const HITS_EVERY: Duration = Duration::from_secs(5);

/// Where previews are served: `scheme://{id}.<suffix>:<port>`.
#[derive(Debug, Clone)]
pub(crate) struct PreviewOrigin {
    scheme: String,
    /// The host after `{id}.`.
    suffix: String,
    /// `:port`, or empty.
    port: String,
}

impl PreviewOrigin {
    /// Reads `--preview-url`; the host must start with `{id}.` and differ from the app's.
    pub(crate) fn parse(url: &str, app_origin: &str) -> anyhow::Result<PreviewOrigin> {
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| *s == "http" || *s == "https")
            .ok_or_else(|| anyhow::anyhow!("--preview-url must start with http:// or https://"))?;
        let authority = rest.split('/').next().unwrap_or_default();
        let suffix_port = authority
            .strip_prefix("{id}.")
            .ok_or_else(|| anyhow::anyhow!("--preview-url's host must start with {{id}}."))?;
        let (suffix, port) = match suffix_port.rsplit_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), format!(":{p}")),
            None => (suffix_port.to_ascii_lowercase(), String::new()),
        };
        let app_host = origin_host(app_origin);
        if suffix.is_empty() || suffix == app_host {
            anyhow::bail!("--preview-url must be on another host than the app ({app_host})");
        }
        Ok(PreviewOrigin {
            scheme: scheme.to_owned(),
            suffix,
            port,
        })
    }

    /// The preview cookie's scope. Where browsers take `Secure` (https, and `*.localhost`,
    /// which they count as secure) it is partitioned by the top-level site: sent to a
    /// preview framed by the room's pane and to one opened in its own tab, never when another
    /// site frames or posts to it. Elsewhere (plain http) it is `SameSite=Lax`, and the pane
    /// cannot hold it: the preview opens in its own tab.
    fn cookie_scope(&self) -> &'static str {
        if self.scheme == "https"
            || self.suffix == "localhost"
            || self.suffix.ends_with(".localhost")
        {
            "SameSite=None; Secure; Partitioned"
        } else {
            "SameSite=Lax"
        }
    }

    /// Every preview's origin as a CSP source (`http://*.preview.localhost:8081`).
    pub(crate) fn frame_source(&self) -> String {
        format!("{}://*.{}{}", self.scheme, self.suffix, self.port)
    }

    /// The port in `--preview-url`, if it names one.
    pub(crate) fn port(&self) -> Option<u16> {
        self.port.strip_prefix(':').and_then(|p| p.parse().ok())
    }

    /// The preview's URL.
    pub(crate) fn url(&self, id: &str) -> String {
        format!("{}://{id}.{}{}/", self.scheme, self.suffix, self.port)
    }

    /// What the E2B door answers as its sandboxes' domain when previews are on and no
    /// `--e2b-domain` is given: `{port}-{room}.` names of this origin are rooms' ports.
    pub(crate) fn e2b_domain(&self) -> String {
        format!("{}{}", self.suffix, self.port)
    }

    /// The port and room a request's `Host` names as `{port}-{room}.<suffix>`, if it does.
    fn e2b_port_of(&self, host: &str) -> Option<(u16, RoomId)> {
        let host = host_name(host);
        crate::http::e2b::port_and_room(host.strip_suffix(&format!(".{}", self.suffix))?)
    }

    /// The preview id a request's `Host` names, if it is one of ours.
    fn id_of(&self, host: &str) -> Option<String> {
        let host = host_name(host);
        let id = host.strip_suffix(&format!(".{}", self.suffix))?;
        (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
    }
}

/// A `Host` header's name: lowercase, without its port.
pub(crate) fn host_name(host: &str) -> String {
    host.rsplit_once(':')
        .map_or(host, |(h, _)| h)
        .to_ascii_lowercase()
}

/// The host name of an origin (`scheme://host[:port]`).
pub(crate) fn origin_host(origin: &str) -> String {
    origin
        .split_once("://")
        .map(|(_, a)| host_name(a))
        .unwrap_or_default()
}

/// Bounds on each public preview (`--preview-rate`, `--preview-bandwidth`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreviewLimits {
    /// Requests per second (a burst of ten times that).
    pub rate: u32,
    /// Bytes per second, both directions and all viewers together (a burst of one second's).
    pub bandwidth: u64,
}

impl Default for PreviewLimits {
    fn default() -> Self {
        PreviewLimits {
            rate: 20,
            bandwidth: 5_000_000,
        }
    }
}

/// A public preview's bounds as they stand.
struct Meters {
    requests: Bucket,
    bytes: Arc<Bucket>,
}

/// What the preview origin holds in memory: one-time tokens, viewers' sessions, each open
/// preview's cancellation (revoking one ends its connections), public previews' meters and
/// the requests answered since the counters were last written.
#[derive(Default)]
pub(crate) struct Previews {
    pub origin: Option<PreviewOrigin>,
    limits: PreviewLimits,
    meters: Mutex<HashMap<String, Arc<Meters>>>,
    hits: Mutex<HashMap<String, i64>>,
    /// Token hash -> (preview, user, expires).
    tokens: Mutex<HashMap<String, (String, String, i64)>>,
    /// Session hash -> (preview, user, expires).
    sessions: Mutex<HashMap<String, (String, String, i64)>>,
    cancels: Mutex<HashMap<String, CancellationToken>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Previews {
    pub(crate) fn new(origin: Option<PreviewOrigin>, limits: PreviewLimits) -> Previews {
        Previews {
            origin,
            limits,
            ..Previews::default()
        }
    }

    /// The token that ends preview `id`'s connections: when it is revoked, and by itself at
    /// `expires_at`.
    fn cancel_of(&self, id: &str, expires_at: i64, now: i64) -> CancellationToken {
        let mut cancels = lock(&self.cancels);
        if let Some(c) = cancels.get(id) {
            return c.clone();
        }
        let c = CancellationToken::new();
        cancels.insert(id.to_owned(), c.clone());
        let timer = c.clone();
        let left = Duration::from_millis(u64::try_from(expires_at - now).unwrap_or(0));
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(left) => timer.cancel(),
                () = timer.cancelled() => {}
            }
        });
        c
    }

    /// A public preview's meters.
    fn meters_of(&self, id: &str) -> Arc<Meters> {
        let l = self.limits;
        lock(&self.meters)
            .entry(id.to_owned())
            .or_insert_with(|| {
                let rate = f64::from(l.rate);
                let bandwidth = l.bandwidth as f64;
                Arc::new(Meters {
                    requests: Bucket::new(rate, rate * 10.0),
                    bytes: Arc::new(Bucket::new(bandwidth, bandwidth)),
                })
            })
            .clone()
    }

    fn revoke(&self, id: &str) {
        if let Some(c) = lock(&self.cancels).remove(id) {
            c.cancel();
        }
        lock(&self.sessions).retain(|_, (p, _, _)| p != id);
        lock(&self.meters).remove(id);
    }

    fn hit(&self, id: &str) {
        *lock(&self.hits).entry(id.to_owned()).or_default() += 1;
    }

    /// Requests answered and not yet written.
    fn unwritten_hits(&self, id: &str) -> i64 {
        lock(&self.hits).get(id).copied().unwrap_or(0)
    }

    /// Writes the counted requests; what cannot be written now is counted again.
    async fn write_hits(&self, store: &crate::store::Store) {
        let taken: Vec<(String, i64)> = lock(&self.hits).drain().collect();
        if taken.is_empty() {
            return;
        }
        if store.add_preview_hits(&taken).await.is_err() {
            let mut hits = lock(&self.hits);
            for (id, n) in taken {
                *hits.entry(id).or_default() += n;
            }
        }
    }

    fn issue(
        map: &Mutex<HashMap<String, (String, String, i64)>>,
        preview: &str,
        user: &str,
        until: i64,
        now: i64,
    ) -> String {
        let token =
            crate::ids::IssuedId::fresh().to_string() + &crate::ids::IssuedId::fresh().to_string();
        let mut m = lock(map);
        m.retain(|_, (_, _, exp)| *exp > now);
        if m.len() >= MAX_LIVE {
            if let Some(oldest) = m.iter().min_by_key(|(_, v)| v.2).map(|(k, _)| k.clone()) {
                m.remove(&oldest);
            }
        }
        m.insert(
            crate::accounts::sessions::hash_token(&token),
            (preview.to_owned(), user.to_owned(), until),
        );
        token
    }
}

/// How a preview stands now.
fn standing(p: &PreviewRow, now: i64) -> &'static str {
    match p.state {
        PreviewState::Revoked | PreviewState::PendingApproval => p.state.as_str(),
        PreviewState::Active if p.expires_at <= now => "expired",
        PreviewState::Active => "active",
    }
}

fn view(app: &AppState, p: &PreviewRow) -> Value {
    let mut v = json!(p);
    v["hits"] = json!(p.hits + app.previews.unwritten_hits(&p.id));
    v["state"] = json!(standing(p, app.ops.clock.now_ms()));
    v["url"] = json!(app.previews.origin.as_ref().map(|o| o.url(&p.id)));
    v
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/previews", get(list).post(create))
        .route(
            "/api/rooms/{id}/previews/{pid}",
            axum::routing::delete(revoke),
        )
        .route("/api/rooms/{id}/previews/{pid}/open", post(open))
        .route("/api/rooms/{id}/sandbox/ports", get(ports))
}

/// `GET /api/rooms/{id}/sandbox/ports`: `{"running", "listening": [port, ...]}`, the TCP ports
/// something in the room's sandbox listens on (any participant). It neither starts a stopped
/// sandbox nor keeps a running one from its idle stop.
async fn ports(State(app): State<AppState>, seen: Observing) -> Result<Json<Value>, ApiError> {
    let op = coderoom_sandbox::proto::Op::Listening;
    // Whether this server can preview a port at all (the page offers only what it can do).
    let previews = app.previews.origin.is_some();
    match seen
        .ops
        .sandboxes
        .peek(&seen.room, op, Duration::from_secs(5))
        .await
    {
        Ok(coderoom_sandbox::proto::Reply::Listening(ports)) => Ok(Json(
            json!({ "running": true, "listening": ports, "previews": previews }),
        )),
        Err(crate::sandbox::SandboxError::Stopped) => Ok(Json(
            json!({ "running": false, "listening": [], "previews": previews }),
        )),
        Ok(_) => Err(ApiError::Internal),
        Err(e) => Err(e.into()),
    }
}

/// Previews are served only where the server has a preview origin (`--preview-url`).
pub(crate) fn enabled(app: &AppState) -> Result<(), ApiError> {
    if app.previews.origin.is_none() {
        return Err(ApiError::Invalid(
            "previews are off on this server (start it with --preview-url)".into(),
        ));
    }
    Ok(())
}

async fn create(
    State(app): State<AppState>,
    on: OnRoom,
    Json(body): Json<NewPreview>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    enabled(&app)?;
    let row = on.ops.create_preview(&on.room, &on.actor, body).await?;
    Ok((StatusCode::CREATED, Json(view(&app, &row))))
}

async fn list(State(app): State<AppState>, seen: Observing) -> Result<Json<Vec<Value>>, ApiError> {
    let mut out = Vec::new();
    for p in seen.ops.store.previews(&seen.room).await? {
        let p = seen.ops.activate_if_approved(p).await?;
        out.push(view(&app, &p));
    }
    Ok(Json(out))
}

async fn revoke(
    State(app): State<AppState>,
    on: OnRoom,
    Path((_, pid)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let p = on.ops.revoke_preview(&on.room, &on.actor, &pid).await?;
    app.previews.revoke(&p.id);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST .../previews/{pid}/open`: the URL to open: for a room preview with a one-time token
/// (any member who may observe), for a public one the plain URL.
async fn open(
    State(app): State<AppState>,
    on: OnRoom,
    Path((_, pid)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(link(&app, &on.room, &on.actor, &pid).await?))
}

/// `{"url", "state"}`: where `actor` opens preview `pid` (see [`open`]); MCP's
/// `request_preview` answers with it too.
pub(crate) async fn link(
    app: &AppState,
    room_id: &RoomId,
    actor: &crate::ops::Actor,
    pid: &str,
) -> Result<Value, ApiError> {
    app.ops.capabilities(room_id, actor).await?;
    let p = app.ops.preview(room_id, pid).await?;
    let p = app.ops.activate_if_approved(p).await?;
    let origin = app.previews.origin.as_ref().ok_or(ApiError::NotFound)?;
    let now = app.ops.clock.now_ms();
    let url = if p.visibility == "room" {
        let token = Previews::issue(&app.previews.tokens, &p.id, &actor.id, now + TOKEN_MS, now);
        format!("{}?{TOKEN_PARAM}={token}", origin.url(&p.id))
    } else {
        origin.url(&p.id)
    };
    Ok(json!({ "url": url, "state": standing(&p, now) }))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// A page of the preview origin itself (never the app's).
fn page(status: StatusCode, text: &str, retry: bool) -> hyper::Response<Body> {
    let refresh = if retry {
        "<meta http-equiv=\"refresh\" content=\"2\">"
    } else {
        ""
    };
    let html = format!(
        "<!doctype html><meta charset=\"utf-8\">{refresh}<title>Coderoom preview</title>\
         <body style=\"font-family:sans-serif;margin:3rem\"><h1>Coderoom preview</h1><p>{text}</p></body>"
    );
    let mut r = hyper::Response::new(
        Full::new(Bytes::from(html))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        "referrer-policy",
        hyper::header::HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    r
}

/// Serves the preview origin on `listener` until shutdown.
pub(crate) fn serve(app: AppState, listener: tokio::net::TcpListener) {
    let counters = app.clone();
    tokio::spawn(async move {
        loop {
            let stop = tokio::select! {
                () = counters.shutdown.cancelled() => true,
                () = tokio::time::sleep(HITS_EVERY) => false,
            };
            counters.previews.write_hits(&counters.ops.store).await;
            if stop {
                return;
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                () = app.shutdown.cancelled() => return,
                a = listener.accept() => match a {
                    Ok((tcp, _)) => tcp,
                    Err(_) => { tokio::time::sleep(Duration::from_millis(100)).await; continue; }
                },
            };
            let app = app.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let app = app.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(&app, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
}

fn cookie_of(req: &hyper::Request<hyper::body::Incoming>) -> Option<String> {
    req.headers()
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            c.trim()
                .strip_prefix(&format!("{COOKIE}="))
                .map(str::to_owned)
        })
}

/// Whether `user` may still observe the preview's room.
async fn may_observe(app: &AppState, room_id: &RoomId, user: &str) -> bool {
    let Some(room) = RoomId::parse(room_id) else {
        return false;
    };
    let who = AuthUser {
        id: user.to_owned(),
        email: String::new(),
        session_hash: String::new(),
    };
    room_capabilities(app, &room, &who).await.is_ok()
}

async fn handle(
    app: &AppState,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Body> {
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Some(origin) = app.previews.origin.as_ref() else {
        return page(StatusCode::NOT_FOUND, "No such preview.", false);
    };
    // A room's port as the E2B SDKs name it (`get_host`), when no `--e2b-domain` is given.
    if let Some((port, room)) = origin.e2b_port_of(&host) {
        let (mut parts, body) = req.into_parts();
        let caller = crate::http::e2b::port_caller(app, &mut parts, &room).await;
        return e2b_port(
            app,
            &room,
            port,
            caller,
            hyper::Request::from_parts(parts, body),
        )
        .await;
    }
    let Some(id) = origin.id_of(&host) else {
        return page(StatusCode::NOT_FOUND, "No such preview.", false);
    };
    let p = match app.ops.store.preview(&id).await {
        Ok(Some(p)) => p,
        Ok(None) => return page(StatusCode::NOT_FOUND, "No such preview.", false),
        Err(_) => return page(StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.", true),
    };
    let Ok(p) = app.ops.activate_if_approved(p).await else {
        return page(StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.", true);
    };
    let now = app.ops.clock.now_ms();
    match standing(&p, now) {
        "revoked" => return page(StatusCode::GONE, "This preview was revoked.", false),
        "expired" => return page(StatusCode::GONE, "This preview has expired.", false),
        "pending_approval" => {
            return page(
                StatusCode::FORBIDDEN,
                "This preview waits for an owner's approval.",
                true,
            )
        }
        _ => {}
    }
    // A public preview answers at most so many requests a second.
    let meters = match metered(app, &p) {
        Ok(m) => m,
        Err(wait) => return too_busy(wait),
    };
    let mut viewer = None;
    if p.visibility == "room" {
        // The one-time token: traded for this origin's own cookie, then gone from the URL.
        let query = req.uri().query().unwrap_or_default().to_owned();
        let token = query.split('&').find_map(|kv| {
            kv.strip_prefix(&format!("{TOKEN_PARAM}="))
                .map(str::to_owned)
        });
        if let Some(token) = token {
            let taken =
                lock(&app.previews.tokens).remove(&crate::accounts::sessions::hash_token(&token));
            let Some((pid, user, until)) =
                taken.filter(|(pid, _, until)| *pid == p.id && *until > now)
            else {
                return page(
                    StatusCode::NOT_FOUND,
                    "This link was used or has expired: open the preview from the room again.",
                    false,
                );
            };
            if !may_observe(app, &p.room_id, &user).await {
                return page(StatusCode::NOT_FOUND, "No such preview.", false);
            }
            let session = Previews::issue(
                &app.previews.sessions,
                &pid,
                &user,
                until.max(now) + SESSION_MS,
                now,
            );
            let rest: Vec<&str> = query
                .split('&')
                .filter(|kv| !kv.starts_with(TOKEN_PARAM) && !kv.is_empty())
                .collect();
            let location = if rest.is_empty() {
                req.uri().path().to_owned()
            } else {
                format!("{}?{}", req.uri().path(), rest.join("&"))
            };
            let mut r = page(StatusCode::SEE_OTHER, "Opening the preview.", false);
            let cookie = format!(
                "{COOKIE}={session}; Path=/; HttpOnly; {}",
                origin.cookie_scope()
            );
            if let (Ok(c), Ok(l)) = (
                hyper::header::HeaderValue::from_str(&cookie),
                hyper::header::HeaderValue::from_str(&location),
            ) {
                r.headers_mut().insert(hyper::header::SET_COOKIE, c);
                r.headers_mut().insert(hyper::header::LOCATION, l);
            }
            return r;
        }
        let session = cookie_of(&req).and_then(|c| {
            lock(&app.previews.sessions)
                .get(&crate::accounts::sessions::hash_token(&c))
                .filter(|(pid, _, until)| *pid == p.id && *until > now)
                .map(|(_, user, _)| user.clone())
        });
        let Some(user) = session else {
            // Not signed in here: the room is where a preview is opened from.
            let mut r = page(
                StatusCode::SEE_OTHER,
                "Sign in and open the preview from its room.",
                false,
            );
            if let Ok(l) = hyper::header::HeaderValue::from_str(&format!(
                "{}/rooms/{}",
                app.public_origin, p.room_id
            )) {
                r.headers_mut().insert(hyper::header::LOCATION, l);
            }
            return r;
        };
        if !may_observe(app, &p.room_id, &user).await {
            return page(StatusCode::NOT_FOUND, "No such preview.", false);
        }
        viewer = Some(user);
    }
    proxy(app, &p, viewer, meters, req).await
}

/// A public preview's meters, once it may answer one more request (a room preview has none);
/// how long to wait, when it may not.
fn metered(app: &AppState, p: &PreviewRow) -> Result<Option<Arc<Meters>>, Duration> {
    if p.visibility != "public" {
        return Ok(None);
    }
    let m = app.previews.meters_of(&p.id);
    m.requests.try_take()?;
    Ok(Some(m))
}

/// The page saying a public preview answers too many requests.
fn too_busy(wait: Duration) -> hyper::Response<Body> {
    let mut r = page(
        StatusCode::TOO_MANY_REQUESTS,
        "This preview is answering too many requests: try again in a moment.",
        false,
    );
    r.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from(wait.as_secs().max(1)),
    );
    r
}

/// A room's port at the E2B door's `{port}-{room}.<--e2b-domain>` host (what the SDKs'
/// `get_host(port)` names), under the preview rules: an active public preview of that port
/// (approved by someone else) answers anyone; otherwise the caller of a live E2B session
/// (its token as `E2B-Traffic-Access-Token` or `X-Access-Token`) reaches it as a room preview,
/// one made for it when there is none (`publish`, recorded like any other).
pub(crate) async fn e2b_port<B>(
    app: &AppState,
    room: &RoomId,
    port: u16,
    caller: Option<crate::ops::Actor>,
    req: hyper::Request<B>,
) -> hyper::Response<Body>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let now = app.ops.clock.now_ms();
    let rows = match app.ops.store.previews(room).await {
        Ok(rows) => rows,
        Err(_) => return page(StatusCode::SERVICE_UNAVAILABLE, "Try again shortly.", true),
    };
    let mut active = Vec::new();
    for p in rows.into_iter().filter(|p| p.port == i64::from(port)) {
        if let Ok(p) = app.ops.activate_if_approved(p).await {
            if standing(&p, now) == "active" {
                active.push(p);
            }
        }
    }
    if let Some(p) = active.iter().find(|p| p.visibility == "public") {
        let meters = match metered(app, p) {
            Ok(m) => m,
            Err(wait) => return too_busy(wait),
        };
        return proxy(app, p, None, meters, req).await;
    }
    let Some(actor) = caller else {
        return page(
            StatusCode::FORBIDDEN,
            &format!(
                "Port {port} of this sandbox is not public: a public preview of it needs \
                 someone else's approval; the sandbox's own session reaches it with its \
                 access token."
            ),
            false,
        );
    };
    let p = match active.into_iter().find(|p| p.visibility == "room") {
        Some(p) => p,
        None => {
            let new = NewPreview {
                port,
                visibility: "room".into(),
                ttl_s: 3600,
            };
            match app.ops.create_preview(room, &actor, new).await {
                Ok(p) => p,
                Err(e) => {
                    let (status, body) = ApiError::from(e).status_and_body();
                    return page(status, &body.error, false);
                }
            }
        }
    };
    if !may_observe(app, room, actor.id.as_str()).await {
        return page(StatusCode::NOT_FOUND, "No such preview.", false);
    }
    proxy(app, &p, Some(actor.id.to_string()), None, req).await
}

/// Carries one request (and its upgrade, if any) to the preview's port in its room's sandbox,
/// for `viewer` (a room preview's member, whose rights an open socket keeps checking).
async fn proxy<B>(
    app: &AppState,
    p: &PreviewRow,
    viewer: Option<String>,
    meters: Option<Arc<Meters>>,
    mut req: hyper::Request<B>,
) -> hyper::Response<Body>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let now = app.ops.clock.now_ms();
    let port = u16::try_from(p.port).unwrap_or(0);
    let conn = match app
        .ops
        .sandboxes
        .connect(&p.room_id, port, p.visibility == "room")
        .await
    {
        Ok(c) => c,
        Err(crate::sandbox::SandboxError::Stopped) => {
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "The room's sandbox is stopped: a member opening this preview starts it.",
                true,
            )
        }
        Err(_) => {
            return page(
                StatusCode::BAD_GATEWAY,
                &format!(
                "Nothing listens on port {port} in the room yet. This page tries again by itself."
            ),
                true,
            )
        }
    };
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake::<_, B>(hyper_util::rt::TokioIo::new(conn)).await
    else {
        return page(StatusCode::BAD_GATEWAY, "The app did not answer.", true);
    };
    app.previews.hit(&p.id);
    let cancel = app.previews.cancel_of(&p.id, p.expires_at, now);
    let watched = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = connection.with_upgrades() => {}
            () = watched.cancelled() => {}
        }
    });
    // The app gets its own cookies, never this origin's, nor the app's session cookie (which
    // a deployment that gave it a `Domain` would have the browser send here too).
    let ours = |c: &str| {
        let name = c.split('=').next().unwrap_or_default().trim();
        name == COOKIE || crate::accounts::sessions::SESSION_COOKIE_NAMES.contains(&name)
    };
    let kept: Vec<String> = req
        .headers()
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !ours(c))
        .map(str::to_owned)
        .collect();
    req.headers_mut().remove(hyper::header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&kept.join("; ")) {
            req.headers_mut().insert(hyper::header::COOKIE, v);
        }
    }
    let upgrade = req
        .headers()
        .get(hyper::header::UPGRADE)
        .is_some()
        .then(|| hyper::upgrade::on(&mut req));
    let mut resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(_) => {
            return page(
                StatusCode::BAD_GATEWAY,
                "The app closed the connection.",
                true,
            )
        }
    };
    let bytes = meters.map(|m| m.bytes.clone());
    if let (Some(client_side), StatusCode::SWITCHING_PROTOCOLS) = (upgrade, resp.status()) {
        let app_side = hyper::upgrade::on(&mut resp);
        let (app2, room, cancel) = (app.clone(), p.room_id.clone(), cancel.clone());
        let bytes = bytes.clone();
        tokio::spawn(async move {
            let (Ok(a), Ok(b)) = (client_side.await, app_side.await) else {
                return;
            };
            let (mut a, mut b) = (
                hyper_util::rt::TokioIo::new(a),
                hyper_util::rt::TokioIo::new(b),
            );
            let watch = async {
                // A room preview's viewer who loses access loses the socket as soon as their
                // rights change (removal, a role change, an account revoked everywhere), and in
                // any case within a second (an expiry is noticed by the recheck).
                let Some(user) = viewer else {
                    return std::future::pending::<()>().await;
                };
                let mut changes = app2.ops.access_changed.subscribe();
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(RECHECK) => {}
                        changed = changes.recv() => match changed {
                            Ok(c) if c.room != room || c.user != user => continue,
                            // Theirs, or some missed: look now.
                            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                tokio::time::sleep(RECHECK).await;
                            }
                        },
                    }
                    if !may_observe(&app2, &room, &user).await {
                        return;
                    }
                }
            };
            tokio::select! {
                () = splice(&mut a, &mut b, bytes) => {}
                () = cancel.cancelled() => {}
                () = watch => {}
            }
        });
    }
    let h = resp.headers_mut();
    // A preview cannot set a cookie for any other host: only host-only cookies pass.
    let cookies: Vec<_> = h
        .get_all(hyper::header::SET_COOKIE)
        .iter()
        .cloned()
        .collect();
    h.remove(hyper::header::SET_COOKIE);
    for c in cookies {
        let domain = c
            .to_str()
            .map(|s| {
                s.to_ascii_lowercase()
                    .split(';')
                    .any(|a| a.trim().starts_with("domain="))
            })
            .unwrap_or(true);
        if !domain {
            h.append(hyper::header::SET_COOKIE, c);
        }
    }
    h.insert(
        "referrer-policy",
        hyper::header::HeaderValue::from_static("no-referrer"),
    );
    if p.visibility == "room" {
        // A room preview may be framed by the room (its preview pane), by nobody else.
        if let Ok(v) = hyper::header::HeaderValue::from_str(&format!(
            "frame-ancestors 'self' {}",
            app.public_origin
        )) {
            h.append(hyper::header::CONTENT_SECURITY_POLICY, v);
        }
    }
    let (parts, body) = resp.into_parts();
    let body = Guarded {
        inner: body,
        cancel: Box::pin(cancel.cancelled_owned()),
        bytes,
        held: None,
    };
    hyper::Response::from_parts(parts, body.boxed())
}

/// Carries bytes both ways between a viewer's upgraded connection and the app's until either
/// side ends; `bytes` (a public preview's bandwidth) paces both directions.
async fn splice<A, B>(a: &mut A, b: &mut B, bytes: Option<Arc<Bucket>>)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Some(bytes) = bytes else {
        let _ = tokio::io::copy_bidirectional(a, b).await;
        return;
    };
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    tokio::select! {
        () = paced(&mut ar, &mut bw, &bytes) => {}
        () = paced(&mut br, &mut aw, &bytes) => {}
    }
}

/// Copies `from` to `to`, waiting as `bytes` says after each read.
async fn paced<R, W>(from: &mut R, to: &mut W, bytes: &Bucket)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        tokio::time::sleep(bytes.reserve(n)).await;
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            return;
        }
    }
}

/// A response body that fails (the connection is cut, not ended cleanly) when its preview is
/// revoked or expires, and is paced by a public preview's bandwidth.
struct Guarded<B> {
    inner: B,
    cancel: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    bytes: Option<Arc<Bucket>>,
    /// A frame waiting for its turn.
    held: Option<(
        hyper::body::Frame<Bytes>,
        std::pin::Pin<Box<tokio::time::Sleep>>,
    )>,
}

impl<B> hyper::body::Body for Guarded<B>
where
    B: hyper::body::Body<Data = Bytes, Error = hyper::Error> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        use std::future::Future;
        use std::task::Poll;
        if std::future::Future::poll(self.cancel.as_mut(), cx).is_ready() {
            return Poll::Ready(Some(Err("the preview was revoked or expired".into())));
        }
        if let Some((_, wait)) = self.held.as_mut() {
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            return Poll::Ready(self.held.take().map(|(frame, _)| Ok(frame)));
        }
        let frame = match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e) as BoxError))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let wait = match (&self.bytes, frame.data_ref()) {
            (Some(bytes), Some(data)) => bytes.reserve(data.len()),
            _ => Duration::ZERO,
        };
        if wait.is_zero() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let mut sleep = Box::pin(tokio::time::sleep(wait));
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Ok(frame)));
        }
        self.held = Some((frame, sleep));
        Poll::Pending
    }
}

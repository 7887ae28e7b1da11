//! Who is calling: the authenticated user (bearer token or session cookie, with the Origin
//! check for cookies) and the client address the rate limits key on.
//!
//! Cookie-authenticated requests that change state, and WebSocket upgrades, must carry an
//! `Origin` equal to the server's public origin: a page on another site can make the browser
//! send the cookie, but not forge the Origin (cross-site request forgery and cross-site
//! WebSocket hijacking). Bearer tokens are not sent automatically by browsers, so they need no
//! Origin.

use crate::accounts::proxies::TrustedProxies;
use crate::accounts::sessions::{hash_token, session_cookie, well_formed, SESSION_IDLE_MS};
use crate::http::{ApiError, AppState};
use crate::ids::RoomId;
use crate::ops::{Actor, Ops};
use axum::extract::{ConnectInfo, FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::http::{Method, Request};
use coderoom_authz::CapabilitySet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::GovernorError;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub(crate) struct AuthUser {
    pub id: String,
    pub email: String,
    /// Hash of the presented token, to end this session on logout.
    pub session_hash: String,
}

fn needs_origin(parts: &Parts) -> bool {
    let safe = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
    let upgrade = parts
        .headers
        .get(axum::http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    !safe || upgrade
}

impl FromRequestParts<AppState> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bearer = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim);
        let token = match bearer {
            Some(t) if well_formed(t) => t.to_owned(),
            Some(_) => return Err(ApiError::Unauthorized),
            None => {
                let t =
                    session_cookie(&parts.headers, &state.cookie).ok_or(ApiError::Unauthorized)?;
                if needs_origin(parts) {
                    let origin = parts
                        .headers
                        .get(axum::http::header::ORIGIN)
                        .and_then(|v| v.to_str().ok());
                    if origin != Some(state.public_origin.as_str()) {
                        tracing::info!(?origin, "cookie request refused: Origin does not match");
                        return Err(ApiError::Forbidden);
                    }
                }
                t
            }
        };
        let (user, bound) = token_user(state, &token).await?;
        // An agent's token opens its room and nothing else (no other room, no new room).
        if let Some(room) = bound {
            let own = format!("/api/rooms/{room}");
            let path = parts.uri.path();
            let inside = path == own || path.starts_with(&format!("{own}/"));
            if !inside && path != "/api/me" {
                return Err(ApiError::Forbidden);
            }
        }
        Ok(user)
    }
}

/// The user a bearer token belongs to (a live session), and for an agent's token the room it
/// is bound to (a revoked agent's token is no token).
pub(crate) async fn token_user(
    state: &AppState,
    token: &str,
) -> Result<(AuthUser, Option<RoomId>), ApiError> {
    if !well_formed(token) {
        return Err(ApiError::Unauthorized);
    }
    let session_hash = hash_token(token);
    let user = state
        .ops
        .store
        .live_session_user(&session_hash, state.ops.clock.now_ms(), SESSION_IDLE_MS)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    let mut bound = None;
    if user
        .email
        .ends_with(&format!("@{}", crate::store::AGENT_DOMAIN))
    {
        let agent = state
            .ops
            .store
            .agent(&user.id)
            .await?
            .filter(|a| a.revoked_at.is_none())
            .ok_or(ApiError::Unauthorized)?;
        bound = Some(agent.room_id);
    }
    Ok((
        AuthUser {
            id: user.id,
            email: user.email,
            session_hash,
        },
        bound,
    ))
}

/// The caller's address as the limits see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientIp(pub IpAddr);

impl fmt::Display for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
            .ok_or(ApiError::BadRequest("no peer address"))?;
        Ok(ClientIp(
            state.trusted_proxies.client_ip(peer, &parts.headers),
        ))
    }
}

/// tower-governor key: the same client address.
#[derive(Debug, Clone)]
pub(crate) struct ClientIpKey(pub TrustedProxies);

impl KeyExtractor for ClientIpKey {
    type Key = IpAddr;

    fn extract<T>(&self, req: &Request<T>) -> Result<IpAddr, GovernorError> {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
            .ok_or(GovernorError::UnableToExtractKey)?;
        Ok(self.0.client_ip(peer, req.headers()))
    }
}

/// Ids from the path, each checked by its type (`RoomId`, `UserId`, `IssuedId`). A path whose
/// ids do not have their form names nothing: 404, like a room the caller cannot see.
pub(crate) struct Ids<T>(pub(crate) T);

impl<T, S> FromRequestParts<S> for Ids<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(ids)) => Ok(Ids(ids)),
            Err(_) => Err(ApiError::NotFound),
        }
    }
}

impl AuthUser {
    /// Who this account is to the application layer (a person, or an agent and its sponsor).
    pub(crate) async fn actor(
        &self,
        app: &crate::http::AppState,
    ) -> Result<crate::ops::Actor, crate::http::ApiError> {
        Ok(app.ops.actor(&self.id, &self.email).await?)
    }
}

/// The authenticated caller as the application layer knows it (an [`AuthUser`] made an
/// [`crate::ops::Actor`]), with the layer: what a route that performs an operation takes.
pub(crate) struct Caller {
    pub(crate) ops: Ops,
    pub(crate) actor: Actor,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let user = AuthUser::from_request_parts(parts, state).await?;
        let actor = user.actor(state).await?;
        Ok(Caller {
            ops: state.ops.clone(),
            actor,
        })
    }
}

/// The room a path names in its `{id}`: 404 when it has not a room id's form.
async fn path_room(parts: &mut Parts, state: &AppState) -> Result<RoomId, ApiError> {
    let params = RawPathParams::from_request_parts(parts, state)
        .await
        .map_err(|_| ApiError::NotFound)?;
    params
        .iter()
        .find(|(name, _)| *name == "id")
        .and_then(|(_, value)| RoomId::parse(value))
        .ok_or(ApiError::NotFound)
}

/// A room operation as a route receives it: the layer, who acts, and the room the path names
/// (`{id}`; a route's other ids come with [`Ids`]). What every route that acts on a room takes.
pub(crate) struct OnRoom {
    pub(crate) ops: Ops,
    pub(crate) actor: Actor,
    pub(crate) room: RoomId,
}

impl FromRequestParts<AppState> for OnRoom {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller { ops, actor } = Caller::from_request_parts(parts, state).await?;
        let room = path_room(parts, state).await?;
        Ok(OnRoom { ops, actor, room })
    }
}

/// A read of a room: an [`OnRoom`] whose caller may observe the room (404 otherwise, as for a
/// room that does not exist), with its capabilities there.
pub(crate) struct Observing {
    pub(crate) ops: Ops,
    pub(crate) room: RoomId,
    pub(crate) caps: CapabilitySet,
}

impl FromRequestParts<AppState> for Observing {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let on = OnRoom::from_request_parts(parts, state).await?;
        let caps = on.ops.capabilities(&on.room, &on.actor).await?;
        let OnRoom { ops, room, .. } = on;
        Ok(Observing { ops, room, caps })
    }
}

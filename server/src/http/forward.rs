//! Scale-out (issue 18): a request about a room that another live server owns is forwarded to
//! that server, WebSocket upgrades included, so every connection of a room meets the one
//! process holding its document, its sandbox and its terminal.
//!
//! Forwarded, not redirected: browsers do not follow redirects on a WebSocket upgrade, so a
//! redirect would break every stock y-websocket client (`docs/design.md`, "Scale-out").
//!
//! The request goes on as it came (method, path, headers, body; the owner authenticates the
//! caller and checks the Origin itself, from the same headers), over a connection of its own
//! to the owner's `--internal-url`, marked with [`FORWARDED_BY`] so that it is never forwarded
//! twice: a server handed a forwarded request serves it only if no other live server owns the
//! room (the header, which any client can send, never makes a second owner), else answers 503
//! and the client retries. An upgrade is answered with the owner's own `101` and
//! the two connections are then joined byte for byte.
//!
//! Only on PostgreSQL: an SQLite database has one server.

use crate::http::AppState;
use crate::ids::RoomId;
use crate::store::Owner;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use std::time::Duration;

/// Marks a request one server forwarded to another (the value: the forwarding server's id).
pub(crate) const FORWARDED_BY: &str = "x-coderoom-forwarded-by";

/// Longest wait for the owner to accept the connection.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// The room a path is about: `/api/rooms/{id}` and everything under it.
pub(crate) fn room_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/api/rooms/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// The deletion a path confirms: `/api/deletions/{id}/confirm`. A deletion is carried out where
/// its room is loaded, which closes the room's sockets and destroys its sandbox there.
fn deletion_of(path: &str) -> Option<&str> {
    let id = path
        .strip_prefix("/api/deletions/")?
        .strip_suffix("/confirm")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The room a request is about, if it is about one.
async fn room_for(app: &AppState, path: &str) -> Result<Option<RoomId>, crate::store::StoreError> {
    if let Some(room) = room_of(path) {
        // A path whose id has not a room id's form names no room (the route answers 404).
        return Ok(RoomId::parse(room));
    }
    match deletion_of(path) {
        Some(id) => Ok(app.ops.store.deletion(id).await?.map(|d| d.room_id)),
        None => Ok(None),
    }
}

/// The middleware: serves the request here unless another live server owns its room.
pub(crate) async fn to_owner(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if app.ops.store.backend() != crate::store::Backend::Postgres {
        return next.run(req).await;
    }
    let room = match room_for(&app, req.uri().path()).await {
        Ok(Some(room)) => room,
        Ok(None) => return next.run(req).await,
        Err(e) => return crate::http::ApiError::Store(e).into_response(),
    };
    let owner = match app.ops.store.room_owner(&room).await {
        Ok(owner) => owner,
        Err(e) => return crate::http::ApiError::Store(e).into_response(),
    };
    match owner {
        // Forwarded already (or a client saying so): never a second hop, and never served by a
        // server that does not own the room (that would be a second owner).
        Some(owner)
            if owner.server != app.ops.server.id && req.headers().contains_key(FORWARDED_BY) =>
        {
            tracing::info!(owner = %owner.server, "a forwarded request for a room another server owns; the client retries");
            unavailable()
        }
        Some(owner) if owner.server != app.ops.server.id => {
            app.metrics.requests_forwarded.inc();
            forward(req, &owner, &app.ops.server.id).await
        }
        _ => next.run(req).await,
    }
}

/// Sends `req` to `owner` and answers with what it answers.
async fn forward(mut req: Request, owner: &Owner, me: &str) -> Response {
    let Some(authority) = owner.address.strip_prefix("http://") else {
        tracing::error!(address = %owner.address, "a room's owner has an address this server cannot reach");
        return unavailable();
    };
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let from_client = upgrade.then(|| hyper::upgrade::on(&mut req));
    let Ok(me) = HeaderValue::from_str(me) else {
        return unavailable();
    };
    req.headers_mut().insert(FORWARDED_BY, me);
    if !upgrade {
        strip_hop_by_hop(req.headers_mut());
    }
    let connected = tokio::time::timeout(CONNECT_WITHIN, async {
        let tcp = tokio::net::TcpStream::connect(authority).await?;
        tcp.set_nodelay(true)?;
        // A socket to an owner whose host vanished ends within about a minute instead of
        // holding a joined WebSocket open forever.
        socket2::SockRef::from(&tcp).set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(Duration::from_secs(30))
                .with_interval(Duration::from_secs(10))
                .with_retries(3),
        )?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(std::io::Error::other)?;
        Ok::<_, std::io::Error>((send, conn))
    })
    .await;
    let (mut send, conn) = match connected {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::warn!(owner = %owner.server, address = %owner.address, error = %e, "cannot reach the room's owner");
            return unavailable();
        }
        Err(_) => {
            tracing::warn!(owner = %owner.server, address = %owner.address, "the room's owner did not answer in time");
            return unavailable();
        }
    };
    // The connection runs until the response (and, for an upgrade, the joined streams) end.
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "forwarded connection ended");
        }
    });
    // No deadline on the answer: a command run in the sandbox, or an archive being written,
    // takes as long through here as it takes at the owner (which bounds each itself).
    let answer = match send.send_request(req).await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(owner = %owner.server, error = %e, "the room's owner failed the forwarded request");
            return unavailable();
        }
    };
    let (parts, body) = answer.into_parts();
    let mut answer = hyper::Response::from_parts(parts, ());
    if let (Some(from_client), StatusCode::SWITCHING_PROTOCOLS) = (from_client, answer.status()) {
        let from_owner = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            let (Ok(client), Ok(owner)) = (from_client.await, from_owner.await) else {
                return;
            };
            let (mut client, mut owner) = (TokioIo::new(client), TokioIo::new(owner));
            let _ = tokio::io::copy_bidirectional(&mut client, &mut owner).await;
        });
        let (parts, ()) = answer.into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let (mut parts, ()) = answer.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, Body::new(body))
}

/// Headers about one connection, not the request: each hop sets its own.
fn strip_hop_by_hop(headers: &mut axum::http::HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        axum::Json(serde_json::json!({
            "error": "the server that holds this room cannot be reached; try again shortly"
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_are_read_from_their_paths() {
        assert_eq!(room_of("/api/rooms/abc"), Some("abc"));
        assert_eq!(room_of("/api/rooms/abc/doc"), Some("abc"));
        assert_eq!(room_of("/api/rooms/abc/terminal/recording"), Some("abc"));
        assert_eq!(room_of("/api/rooms"), None);
        assert_eq!(room_of("/api/rooms/"), None);
        assert_eq!(room_of("/api/invites/x"), None);
        assert_eq!(deletion_of("/api/deletions/abc/confirm"), Some("abc"));
        assert_eq!(deletion_of("/api/deletions/abc"), None);
        assert_eq!(deletion_of("/api/deletions//confirm"), None);
        assert_eq!(deletion_of("/api/deletions/a/b/confirm"), None);
    }
}

//! Events every server must hear (scale-out, issue 18): a session that ended (logout, an
//! account revoked everywhere) and a participant's rights that changed. The server where it
//! happened acts on its own sockets at once, as a lone server does, and announces it on
//! PostgreSQL's `LISTEN/NOTIFY` channel `coderoom_events`; every other server hears it and does
//! the same to the sockets it holds: closes those of an ended session, and gives a room the
//! participant's rights as the database now has them (which closes their sockets when they no
//! longer observe).
//!
//! Nothing is missed across a lost connection to the database: each time the listener
//! (re)connects it catches up from the database itself, for what it holds: every open
//! socket's session is looked up (gone: closed), and every participant with a room open here
//! gets their rights as stored. The same catch-up runs every 30 s as a backstop for an
//! announcement that never went out (a server that died between a change and its notify).
//!
//! On SQLite there is one server and nothing to announce.

use crate::ids::RoomId;
use crate::ops::Ops;
use crate::room::RoomCmd;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The channel every server listens on.
const CHANNEL: &str = "coderoom_events";
/// Wait before listening again after the connection failed.
const RETRY: Duration = Duration::from_secs(1);
/// How often the catch-up also runs while listening: an announcement lost between a change's
/// commit and its `pg_notify` (a crash, a failed statement) still bites within this.
const CATCH_UP_EVERY: Duration = Duration::from_secs(30);

/// A session that ended, announced to the sockets it opened.
#[derive(Clone, Debug)]
pub(crate) struct SessionEnded {
    /// The session's hash (what sockets know their session by).
    pub hash: String,
    /// When the server decided: each socket's close is measured from here
    /// (`coderoom_access_close_seconds`).
    pub at: std::time::Instant,
}

/// A participant's rights in a room changed, announced to the open terminals.
#[derive(Clone, Debug)]
pub(crate) struct AccessChanged {
    pub room: RoomId,
    pub user: String,
    /// Who changed them (their email), when someone did: the viewer is told.
    pub by: Option<String>,
    /// When the server decided (a terminal it closes is measured from here).
    pub at: std::time::Instant,
}

/// What one server tells the others.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Event {
    SessionEnded {
        hash: String,
    },
    AccessChanged {
        room: RoomId,
        user: String,
        by: Option<String>,
    },
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    /// The announcing server's id: it does not act on its own announcement twice.
    from: String,
    event: Event,
}

/// Announces `event` to the other servers (nothing on SQLite). A failure is logged: the other
/// servers catch up when their listener reconnects, not sooner.
pub(crate) async fn announce(app: &Ops, event: Event) {
    if app.store.backend() != crate::store::Backend::Postgres {
        return;
    }
    let envelope = Envelope {
        from: app.server.id.clone(),
        event,
    };
    let Ok(payload) = serde_json::to_string(&envelope) else {
        return;
    };
    if let Err(e) = app.store.notify(CHANNEL, &payload).await {
        tracing::error!(error = %e, "cannot announce an event to the other servers");
    }
}

/// A participant's rights in a room changed: the sockets here are told at once, and the other
/// servers through [`announce`].
pub(crate) async fn access_changed(app: &Ops, room: RoomId, user: String, by: Option<String>) {
    let _ = app.access_changed.send(AccessChanged {
        room: room.clone(),
        user: user.clone(),
        by: by.clone(),
        at: std::time::Instant::now(),
    });
    announce(app, Event::AccessChanged { room, user, by }).await;
}

/// A session ended (a logout, an account revoked everywhere): its sockets here close at once,
/// and on the other servers through [`announce`].
pub(crate) async fn session_ended(app: &Ops, hash: String, at: std::time::Instant) {
    let _ = app.sessions_ended.send(SessionEnded {
        hash: hash.clone(),
        at,
    });
    announce(app, Event::SessionEnded { hash }).await;
}

/// The sessions of this server's open sockets, for the catch-up.
pub(crate) type OpenSessions = crate::ops::counted::Counted<String>;

/// Listens for the other servers' events until shutdown (PostgreSQL only).
pub(crate) fn start_listening(
    app: &Ops,
    database_url: &str,
    (tracker, shutdown): (
        &tokio_util::task::TaskTracker,
        &tokio_util::sync::CancellationToken,
    ),
) {
    if app.store.backend() != crate::store::Backend::Postgres {
        return;
    }
    let app = app.clone();
    let url = database_url.to_owned();
    let shutdown = shutdown.clone();
    tracker.spawn(async move {
        tokio::select! {
            () = listen(&app, &url) => {}
            () = shutdown.cancelled() => {}
        }
    });
}

async fn listen(app: &Ops, url: &str) {
    loop {
        let mut listener = match sqlx::postgres::PgListener::connect(url).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for the other servers' events; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        // Without automatic reconnection: a lost connection comes back here, through the
        // catch-up, instead of silently skipping what was said meanwhile.
        listener.ignore_pool_close_event(true);
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::warn!(error = %e, "cannot listen for the other servers' events; retrying");
            tokio::time::sleep(RETRY).await;
            continue;
        }
        catch_up(app).await;
        let mut backstop = tokio::time::interval(CATCH_UP_EVERY);
        backstop.reset();
        loop {
            let received = tokio::select! {
                r = listener.try_recv() => r,
                _ = backstop.tick() => {
                    catch_up(app).await;
                    continue;
                }
            };
            match received {
                Ok(Some(n)) => match serde_json::from_str::<Envelope>(n.payload()) {
                    Ok(e) if e.from != app.server.id => act(app, e.event).await,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "an event from another server does not read")
                    }
                },
                Ok(None) => {
                    tracing::warn!("lost the connection that hears the other servers; catching up once it is back");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lost the connection that hears the other servers; catching up once it is back");
                    break;
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Does here what another server announced.
async fn act(app: &Ops, event: Event) {
    match event {
        Event::SessionEnded { hash } => {
            let _ = app.sessions_ended.send(SessionEnded {
                hash,
                at: std::time::Instant::now(),
            });
        }
        Event::AccessChanged { room, user, by } => {
            refresh_rights(app, &room, std::slice::from_ref(&user)).await;
            let _ = app.access_changed.send(AccessChanged {
                room,
                user,
                by,
                at: std::time::Instant::now(),
            });
        }
    }
}

/// Gives a room loaded here `users`' rights as stored (none, once removed): what every
/// change of rights ends with, on the server where it happened and on the others.
pub(crate) async fn refresh_rights(app: &Ops, room: &RoomId, users: &[String]) {
    let state = match app.store.room_state(room).await {
        Ok(state) => state,
        Err(e) => {
            tracing::warn!(room = %room, error = %e, "cannot read a room's rights to give them to it");
            return;
        }
    };
    let now = app.clock.now_ms();
    for user in users {
        let rights = crate::room::task::Rights::of_state(
            &state,
            user,
            coderoom_authz::Capability::Edit,
            now,
        );
        app.rooms
            .notify(
                room,
                RoomCmd::Access {
                    user_id: user.clone(),
                    rights,
                    decided: std::time::Instant::now(),
                },
            )
            .await;
    }
}

/// What may have been announced while this server was not listening, read from the database
/// for what this server holds.
async fn catch_up(app: &Ops) {
    for hash in app.open_sessions.keys() {
        match app.store.session_exists(&hash).await {
            Ok(true) => {}
            Ok(false) => act(app, Event::SessionEnded { hash }).await,
            Err(e) => tracing::warn!(error = %e, "cannot look up an open socket's session"),
        }
    }
    for (room, user) in app.present.keys() {
        act(
            app,
            Event::AccessChanged {
                room,
                user,
                by: None,
            },
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn events_read_back_as_written() {
        for event in [
            Event::SessionEnded { hash: "h".into() },
            Event::AccessChanged {
                room: RoomId::known("r"),
                user: "u".into(),
                by: Some("ana@example.com".into()),
            },
        ] {
            let text = serde_json::to_string(&Envelope {
                from: "s".into(),
                event: event.clone(),
            })
            .unwrap();
            let back: Envelope = serde_json::from_str(&text).unwrap();
            assert_eq!((back.from.as_str(), back.event), ("s", event));
        }
    }
}

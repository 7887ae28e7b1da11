//! envd's directory watching: `filesystem.Filesystem/WatchDir` (a stream, the async SDKs) and
//! `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher` (the sync SDK polls). Watching is
//! looking: each look is the room's listing (`Ops::entry_op` with `observe`, the rights looked
//! up again each time), every [`POLL`]; what changed between two looks is the events: an
//! entry new (`CREATE`), gone (`REMOVE`), a file's size or time changed (`WRITE`), its mode
//! (`CHMOD`). A rename shows as the old name's `REMOVE` and the new one's `CREATE`. A watch
//! ends with the caller's session, its rights, or its removal.

use super::connect::{self, Code, ConnectError};
use super::{workspace_path, EnvdCaller};
use crate::http::{ApiError, AppState};
use crate::ids::RoomId;
use crate::ops::Actor;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use coderoom_authz::Capability;
use coderoom_sandbox::proto::{EntryKind, Op, Reply};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a watch looks.
const POLL: Duration = Duration::from_millis(500);
/// Levels a recursive watch looks down.
const RECURSIVE_DEPTH: u32 = 64;
/// Events a watcher keeps until they are fetched; older ones are dropped past it.
const MAX_QUEUED: usize = 10_000;
/// Watchers one caller may have in a room, and one server.
const MAX_MINE: usize = 16;
const MAX_ALL: usize = 4096;
/// A watcher nobody fetched from for this long is removed.
const UNREAD: Duration = Duration::from_secs(600);

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/api/e2b/envd/filesystem.Filesystem/WatchDir",
            post(watch_dir),
        )
        .route(
            "/api/e2b/envd/filesystem.Filesystem/CreateWatcher",
            post(create_watcher),
        )
        .route(
            "/api/e2b/envd/filesystem.Filesystem/GetWatcherEvents",
            post(get_events),
        )
        .route(
            "/api/e2b/envd/filesystem.Filesystem/RemoveWatcher",
            post(remove_watcher),
        )
}

/// The sync SDK's watchers, by id.
#[derive(Default)]
pub(crate) struct Watchers {
    all: Mutex<HashMap<String, Watcher>>,
}

struct Watcher {
    room: RoomId,
    user: String,
    events: Arc<Mutex<Queued>>,
    stop: tokio_util::sync::CancellationToken,
}

#[derive(Default)]
struct Queued {
    events: VecDeque<Value>,
    read_at: Option<tokio::time::Instant>,
}

impl Watchers {
    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watcher>> {
        self.all.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a look saw: each entry's kind, size, modification time and mode, by path.
type Seen = HashMap<String, (EntryKind, u64, i128, u32)>;

/// What is under `path` now (with `truncated`: more was there than one listing holds). The
/// first look may start the room's sandbox (as any listing may); the repeated ones only look
/// (`Ops::entry_peek`: a watch neither starts nor keeps awake a sandbox), and answer `None`
/// while it is stopped.
async fn look(
    app: &AppState,
    room: &RoomId,
    actor: &Actor,
    (path, recursive): (&str, bool),
    again: bool,
) -> Result<Option<(Seen, bool)>, ConnectError> {
    let depth = if recursive { RECURSIVE_DEPTH } else { 1 };
    let make = |path| Op::ListDir { path, depth };
    let at = (path, Capability::Observe);
    let reply = if again {
        app.ops.entry_peek(room, actor, at, make).await
    } else {
        app.ops.entry_op(room, actor, at, make).await
    };
    let reply = match reply {
        Ok(r) => r,
        Err(crate::ops::OpError::Sandbox(crate::sandbox::SandboxError::Stopped)) if again => {
            return Ok(None)
        }
        Err(e) => return Err(ConnectError::from(ApiError::from(e))),
    };
    match reply {
        Reply::Entries { entries, truncated } => Ok(Some((
            entries
                .into_iter()
                .map(|e| (e.path, (e.kind, e.size, e.mtime_ns, e.mode)))
                .collect(),
            truncated,
        ))),
        _ => Err(ConnectError::new(
            Code::Internal,
            "the sandbox answered no listing",
        )),
    }
}

/// Where a watch's events go.
enum Sink {
    /// A `WatchDir` stream: each event a frame, waited for (a slow reader slows the watch).
    Stream(tokio::sync::mpsc::Sender<Bytes>),
    /// A watcher's queue, fetched by `GetWatcherEvents`.
    Queue(Arc<Mutex<Queued>>),
}

impl Sink {
    /// Hands `events` on; `false` once the client went.
    async fn take(&self, events: Vec<Value>) -> bool {
        match self {
            Sink::Stream(frames) => {
                for e in events {
                    let frame = connect::frame(&json!({ "filesystem": e }));
                    if frames.send(frame).await.is_err() {
                        return false;
                    }
                }
                true
            }
            Sink::Queue(queue) => {
                let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
                q.events.extend(events);
                while q.events.len() > MAX_QUEUED {
                    q.events.pop_front();
                }
                true
            }
        }
    }

    /// Whether anyone still takes what is seen (a stream's client, or someone who fetched
    /// from the queue within [`UNREAD`]).
    fn wanted(&self) -> bool {
        match self {
            Sink::Stream(frames) => !frames.is_closed(),
            Sink::Queue(queue) => queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .read_at
                .is_none_or(|at| at.elapsed() <= UNREAD),
        }
    }
}

/// The events between two looks at `base`, named relative to it.
fn changes(before: &Seen, after: &Seen, base: &str, truncated: bool) -> Vec<Value> {
    let name = |path: &str| {
        if base.is_empty() {
            path.to_owned()
        } else {
            path.strip_prefix(base)
                .and_then(|p| p.strip_prefix('/'))
                .unwrap_or(path)
                .to_owned()
        }
    };
    let event = |path: &str, kind: &str| json!({ "name": name(path), "type": kind });
    let mut out = Vec::new();
    let mut paths: Vec<&String> = after.keys().collect();
    paths.sort();
    for path in paths {
        let now = &after[path];
        match before.get(path) {
            None => out.push(event(path, "EVENT_TYPE_CREATE")),
            Some(was) => {
                if now.0 == EntryKind::File && (was.1 != now.1 || was.2 != now.2) {
                    out.push(event(path, "EVENT_TYPE_WRITE"));
                }
                if was.3 != now.3 {
                    out.push(event(path, "EVENT_TYPE_CHMOD"));
                }
            }
        }
    }
    // A listing cut short cannot tell what is gone.
    if !truncated {
        let mut gone: Vec<&String> = before.keys().filter(|p| !after.contains_key(*p)).collect();
        gone.sort();
        out.extend(gone.into_iter().map(|p| event(p, "EVENT_TYPE_REMOVE")));
    }
    out
}

/// What a watch request asks: the directory (workspace-relative) and whether to look down.
fn asked(req: &Value) -> Result<(String, bool), ConnectError> {
    let path = workspace_path(req.get("path").and_then(Value::as_str).unwrap_or_default())?;
    let recursive = req
        .get("recursive")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((path, recursive))
}

/// Whether the caller's session in the room is still there.
fn live(app: &AppState, room: &RoomId, user: &str) -> bool {
    app.e2b.alive(room, user, app.ops.now_ms())
}

/// Looks every [`POLL`] and hands each change to `sink` until `stop`, the session ends, a
/// look is refused (that error) or nobody takes them any more.
async fn follow(
    app: &AppState,
    caller: &EnvdCaller,
    (path, recursive): (&str, bool),
    mut seen: Seen,
    stop: &tokio_util::sync::CancellationToken,
    sink: Sink,
) -> Option<ConnectError> {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return None,
        }
        if !live(app, &caller.room, caller.actor.id.as_str()) {
            return Some(ConnectError::new(
                Code::NotFound,
                "the sandbox session ended: the watch with it",
            ));
        }
        if !sink.wanted() {
            return None;
        }
        let at = (path, recursive);
        let (now, truncated) = match look(app, &caller.room, &caller.actor, at, true).await {
            Ok(Some(l)) => l,
            // Stopped: nothing changes in it meanwhile.
            Ok(None) => continue,
            Err(e) => return Some(e),
        };
        let events = changes(&seen, &now, path, truncated);
        seen = now;
        if !events.is_empty() && !sink.take(events).await {
            return None;
        }
    }
}

/// `WatchDir`: a stream of `start`, then `filesystem` events as they are seen, keepalives.
async fn watch_dir(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (frames, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let asked = async {
        let caller = caller?;
        let (path, recursive) = asked(&connect::enveloped(&body)?)?;
        let (seen, _) = look(&app, &caller.room, &caller.actor, (&path, recursive), false)
            .await?
            .unwrap_or_default();
        Ok::<_, ConnectError>((caller, path, recursive, seen))
    };
    let (caller, path, recursive, seen) = match asked.await {
        Ok(a) => a,
        Err(e) => {
            let _ = frames.try_send(connect::end(Some(&e)));
            return connect::streaming(rx);
        }
    };
    let (_, keepalive) = super::process::deadlines(&headers);
    let _ = frames.try_send(connect::frame(&json!({ "start": {} })));
    tokio::spawn(async move {
        let stop = tokio_util::sync::CancellationToken::new();
        // Keepalives beside the looks; a client gone ends both.
        let beat = {
            let (frames, stop) = (frames.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(keepalive);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = stop.cancelled() => return,
                    }
                    let beat = connect::frame(&json!({ "keepalive": {} }));
                    if frames.send(beat).await.is_err() {
                        stop.cancel();
                        return;
                    }
                }
            })
        };
        let sink = Sink::Stream(frames.clone());
        let ended = follow(&app, &caller, (&path, recursive), seen, &stop, sink).await;
        stop.cancel();
        let _ = beat.await;
        let _ = frames.send(connect::end(ended.as_ref())).await;
    });
    connect::streaming(rx)
}

/// `CreateWatcher`: a watcher whose events `GetWatcherEvents` fetches.
async fn create_watcher(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    body: Bytes,
) -> Response {
    let made = async {
        let caller = caller?;
        let (path, recursive) = asked(&connect::plain(&body)?)?;
        {
            let all = app.e2b_watchers.locked();
            let mine = all
                .values()
                .filter(|w| w.room == caller.room && w.user == caller.actor.id.as_str())
                .count();
            if mine >= MAX_MINE || all.len() >= MAX_ALL {
                return Err(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("at most {MAX_MINE} watchers each: remove one first"),
                ));
            }
        }
        let (seen, _) = look(&app, &caller.room, &caller.actor, (&path, recursive), false)
            .await?
            .unwrap_or_default();
        let id = crate::accounts::sessions::fresh_token();
        let events = Arc::new(Mutex::new(Queued {
            read_at: Some(tokio::time::Instant::now()),
            ..Queued::default()
        }));
        let stop = tokio_util::sync::CancellationToken::new();
        app.e2b_watchers.locked().insert(
            id.clone(),
            Watcher {
                room: caller.room.clone(),
                user: caller.actor.id.to_string(),
                events: events.clone(),
                stop: stop.clone(),
            },
        );
        let (app2, id2) = (app.clone(), id.clone());
        tokio::spawn(async move {
            let sink = Sink::Queue(events);
            let ended = follow(&app2, &caller, (&path, recursive), seen, &stop, sink).await;
            if let Some(e) = ended {
                tracing::debug!(error = %e.message, "an E2B watcher ended");
            }
            // Ended (removed, unread, its session or rights gone): it is no more.
            app2.e2b_watchers.locked().remove(&id2);
        });
        Ok(id)
    };
    match made.await {
        Ok(id) => connect::unary(json!({ "watcherId": id })),
        Err(e) => e.into_response(),
    }
}

/// The caller's watcher a request names.
fn mine(
    app: &AppState,
    caller: &EnvdCaller,
    req: &Value,
) -> Result<
    (
        String,
        Arc<Mutex<Queued>>,
        tokio_util::sync::CancellationToken,
    ),
    ConnectError,
> {
    let id = req
        .get("watcherId")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let all = app.e2b_watchers.locked();
    all.get(id)
        .filter(|w| w.room == caller.room && w.user == caller.actor.id.as_str())
        .map(|w| (id.to_owned(), w.events.clone(), w.stop.clone()))
        .ok_or_else(|| ConnectError::new(Code::NotFound, "no such watcher of yours"))
}

/// `GetWatcherEvents`: what was seen since the last fetch.
async fn get_events(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    body: Bytes,
) -> Response {
    let got = caller.and_then(|c| {
        let req = connect::plain(&body)?;
        let (_, events, _) = mine(&app, &c, &req)?;
        let mut q = events.lock().unwrap_or_else(|e| e.into_inner());
        q.read_at = Some(tokio::time::Instant::now());
        Ok(q.events.drain(..).collect::<Vec<Value>>())
    });
    match got {
        Ok(events) => connect::unary(json!({ "events": events })),
        Err(e) => e.into_response(),
    }
}

/// `RemoveWatcher`.
async fn remove_watcher(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    body: Bytes,
) -> Response {
    let removed = caller.and_then(|c| {
        let req = connect::plain(&body)?;
        let (id, _, stop) = mine(&app, &c, &req)?;
        stop.cancel();
        app.e2b_watchers.locked().remove(&id);
        Ok(())
    });
    match removed {
        Ok(()) => connect::unary(json!({})),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_between_two_looks_are_events() {
        let seen = |items: &[(&str, u64, u32)]| -> Seen {
            items
                .iter()
                .map(|(p, size, mode)| ((*p).to_owned(), (EntryKind::File, *size, 1, *mode)))
                .collect()
        };
        let before = seen(&[("d/a", 1, 0o644), ("d/b", 1, 0o644), ("d/c", 1, 0o644)]);
        let after = seen(&[("d/a", 2, 0o644), ("d/b", 1, 0o755), ("d/new", 0, 0o644)]);
        let names: Vec<(String, String)> = changes(&before, &after, "d", false)
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().into(),
                    e["type"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want = [
            ("a", "EVENT_TYPE_WRITE"),
            ("b", "EVENT_TYPE_CHMOD"),
            ("new", "EVENT_TYPE_CREATE"),
            ("c", "EVENT_TYPE_REMOVE"),
        ];
        assert_eq!(
            names,
            want.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec()
        );
        // Cut short, nothing is said gone.
        assert_eq!(changes(&before, &after, "d", true).len(), 3);
    }
}

//! The code interpreter (`e2b_code_interpreter`'s `run_code`, and its contexts): Python, run
//! inside the room's sandbox as room code. A context is one Python process (`interpreter.py`)
//! started for its caller as a command (`Ops::run_command`: rights, approval mode, budget,
//! audit, its own unit), its names kept from one call to the next. Each `run_code` is one line
//! typed into it (`Ops::type_keys`, as input to any command: an agent's line is decided and
//! charged as a command, and in approval mode waits for a person). The process ends with the
//! caller's session, its right to run code, a restart or removal of the context, or after
//! the longest a command runs (then the next call starts a fresh one).
//!
//! The SDK reaches these calls at `{E2B_SANDBOX_URL}/execute` and `/contexts` (port 49999,
//! named in a header), carrying the session's token as its traffic token.

use super::connect::{Code, ConnectError};
use super::process::{approved, type_in, INPUT_QUEUE};
use super::{workspace_path, EnvdCaller, PlaneError};
use crate::http::{ApiError, AppState};
use crate::ids::RoomId;
use crate::ops::commands::Command;
use crate::ops::typing::Typist;
use crate::ops::Outcome;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The interpreter's program, given on its command line (what an approver sees).
const DRIVER: &str = include_str!("interpreter.py");
/// The longest an interpreter runs (the room's cap on any command).
const LIFETIME_MS: u64 = 10 * 60 * 1000;
/// How long a call waits for its cell when the client names no deadline.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Contexts one caller may have in a room.
const MAX_CONTEXTS: usize = 8;
/// Largest cell.
const MAX_CODE: usize = 1 << 20;
/// Lines of a cell's output waiting for a slow client before more are dropped.
const LINES_QUEUE: usize = 1024;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/e2b/envd/execute", post(execute))
        .route(
            "/api/e2b/envd/contexts",
            post(create_context).get(list_contexts),
        )
        .route("/api/e2b/envd/contexts/{id}", delete(remove_context))
        .route("/api/e2b/envd/contexts/{id}/restart", post(restart_context))
}

/// Interpreters by (room, user, context id): each a slot, locked while its interpreter starts
/// (so two calls at once start one), emptied (and taken out) once it ends.
#[derive(Default)]
pub(crate) struct Kernels {
    all: Mutex<HashMap<Key, Slot>>,
}

type Key = (RoomId, String, String);
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Kernel>>>>;

impl Kernels {
    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Slot>> {
        self.all.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `key` out if it still holds `k` (which ended) and nobody is using the slot.
    fn forget(&self, key: &Key, k: &Arc<Kernel>) {
        let mut all = self.locked();
        let gone = all.get(key).is_some_and(|slot| {
            slot.try_lock()
                .is_ok_and(|held| held.as_ref().is_none_or(|h| Arc::ptr_eq(h, k)))
        });
        if gone {
            all.remove(key);
        }
    }

    /// The live interpreters of `user` in `room`, by context id.
    fn of(&self, room: &RoomId, user: &str) -> Vec<(String, Arc<Kernel>)> {
        self.locked()
            .iter()
            .filter(|((r, u, _), _)| r == room && u == user)
            .filter_map(|((_, _, id), slot)| {
                let held = slot.try_lock().ok()?;
                let k = held.as_ref()?;
                (!k.ended.is_cancelled()).then(|| (id.clone(), k.clone()))
            })
            .collect()
    }
}

struct Kernel {
    /// Workspace-relative working directory.
    cwd: String,
    typist: tokio::sync::Mutex<Typist>,
    /// The running cell: where its lines go (lines of another are dropped).
    sink: Mutex<Option<Cell>>,
    /// One cell at a time.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Cancelled once the process ended.
    ended: CancellationToken,
    /// Ends the process.
    kill: CancellationToken,
}

/// The cell running in an interpreter.
struct Cell {
    id: String,
    /// Its lines, as they come (a client that does not read loses some).
    lines: tokio::sync::mpsc::Sender<Value>,
    /// Told when it ends (never lost with a line).
    end: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Kernel {
    fn shown(&self, id: &str) -> Value {
        let cwd = format!("/home/user/{}", self.cwd);
        json!({ "id": id, "language": "python", "cwd": cwd.trim_end_matches('/') })
    }
}

fn refused(e: ConnectError) -> PlaneError {
    PlaneError(
        match e.code {
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        },
        e.message,
    )
}

/// Only Python is served.
fn python(language: Option<&Value>) -> Result<(), PlaneError> {
    match language.and_then(Value::as_str) {
        None | Some("python" | "python3") => Ok(()),
        Some(other) => Err(PlaneError(
            StatusCode::BAD_REQUEST,
            format!(
                "only Python runs here, not {}",
                other.chars().take(40).collect::<String>()
            ),
        )),
    }
}

/// The caller's interpreter for context `id`: the running one, or one started (in `cwd`, or
/// where the context's last one ran). A context other than "default" must have been made.
async fn kernel(
    app: &AppState,
    caller: &EnvdCaller,
    id: &str,
    cwd: Option<String>,
    wait: Duration,
) -> Result<Arc<Kernel>, PlaneError> {
    let key: Key = (
        caller.room.clone(),
        caller.actor.id.to_string(),
        id.to_owned(),
    );
    let slot = {
        let mut all = app.e2b_kernels.locked();
        match all.get(&key) {
            Some(slot) => slot.clone(),
            None => {
                if id != "default" && cwd.is_none() {
                    return Err(PlaneError(
                        StatusCode::NOT_FOUND,
                        "no such context of yours".into(),
                    ));
                }
                let mine = all
                    .keys()
                    .filter(|(r, u, _)| *r == key.0 && *u == key.1)
                    .count();
                if mine >= MAX_CONTEXTS {
                    return Err(PlaneError(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!("at most {MAX_CONTEXTS} contexts each: remove one first"),
                    ));
                }
                let slot = Slot::default();
                all.insert(key.clone(), slot.clone());
                slot
            }
        }
    };
    let mut held = slot.lock().await;
    if let Some(k) = held.as_ref().filter(|k| !k.ended.is_cancelled()) {
        return Ok(k.clone());
    }
    let cwd = cwd
        .or_else(|| held.as_ref().map(|k| k.cwd.clone()))
        .unwrap_or_default();
    match start(app, caller, &key, cwd, wait).await {
        Ok(k) => {
            *held = Some(k.clone());
            Ok(k)
        }
        Err(e) => {
            // Nothing started: the slot goes unless an interpreter of it ran before.
            if held.is_none() {
                drop(held);
                app.e2b_kernels.locked().remove(&key);
            }
            Err(e)
        }
    }
}

/// Ends the interpreter it guards unless disarmed (a start its caller gave up on).
struct KillOnDrop(Option<CancellationToken>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(kill) = self.0.take() {
            kill.cancel();
        }
    }
}

/// Starts an interpreter for `caller` (deciding it as a command; an agent in approval mode
/// waits up to `wait` for a person), once it is on its way to the sandbox.
async fn start(
    app: &AppState,
    caller: &EnvdCaller,
    key: &Key,
    cwd: String,
    wait: Duration,
) -> Result<Arc<Kernel>, PlaneError> {
    let (to, from) = tokio::sync::mpsc::channel(INPUT_QUEUE);
    let (output, mut printed) = tokio::sync::mpsc::channel::<Vec<u8>>(LINES_QUEUE);
    let started = Arc::new(tokio::sync::Notify::new());
    let argv = vec!["python3".into(), "-u".into(), "-c".into(), DRIVER.into()];
    let mut cmd = Command::new(argv, cwd.clone(), Some(LIFETIME_MS));
    cmd.input = Some(Arc::new(Mutex::new(Some(from))));
    cmd.output = Some(output);
    cmd.started = Some(started.clone());
    let kill = CancellationToken::new();
    cmd.kill = Some(kill.clone());
    let mut guard = KillOnDrop(Some(kill.clone()));
    let k = Arc::new(Kernel {
        cwd,
        typist: tokio::sync::Mutex::new(Typist::at_command(caller.actor.clone(), to)),
        sink: Mutex::new(None),
        turn: Arc::default(),
        ended: CancellationToken::new(),
        kill,
    });
    let (ready, is_ready) = tokio::sync::oneshot::channel::<Result<(), ConnectError>>();
    let (app2, room, actor, k2, key2) = (
        app.clone(),
        caller.room.clone(),
        caller.actor.clone(),
        k.clone(),
        key.clone(),
    );
    tokio::spawn(async move {
        let mut ready = Some(ready);
        let mut approval: Option<String> = None;
        let ran = loop {
            let given = approval.clone();
            let r = {
                let run = app2
                    .ops
                    .run_command(&room, &actor, cmd.clone(), given.as_deref());
                tokio::pin!(run);
                tokio::select! {
                    r = &mut run => r,
                    () = started.notified() => {
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(Ok(()));
                        }
                        run.await
                    }
                }
            };
            match r {
                Ok(Outcome::Pending(_)) if k2.kill.is_cancelled() => {
                    break Err(ConnectError::new(
                        Code::Unavailable,
                        "the start was given up",
                    ))
                }
                Ok(Outcome::Pending(id)) if approval.is_none() => {
                    let undone = "the interpreter did not start";
                    match approved(&app2, &room, &id, wait, undone).await {
                        Ok(()) => approval = Some(id),
                        Err(e) => break Err(e),
                    }
                }
                Ok(Outcome::Pending(id)) => {
                    break Err(ConnectError::new(
                        Code::FailedPrecondition,
                        format!("the interpreter still needs an approval (approval {id})"),
                    ))
                }
                Ok(Outcome::Done(_)) => break Ok(()),
                Err(e) => break Err(ConnectError::from(ApiError::from(e))),
            }
        };
        k2.ended.cancel();
        app2.e2b_kernels.forget(&key2, &k2);
        if let Some(ready) = ready.take() {
            let _ = ready.send(match ran {
                Ok(()) => Err(ConnectError::new(
                    Code::Unavailable,
                    "the interpreter ended as it started",
                )),
                Err(e) => Err(e),
            });
        }
    });
    // Its lines, to whichever cell is running.
    let reader = k.clone();
    tokio::spawn(async move {
        let mut held: Vec<u8> = Vec::new();
        while let Some(chunk) = printed.recv().await {
            let Some((&1, bytes)) = chunk.split_first() else {
                continue;
            };
            held.extend_from_slice(bytes);
            while let Some(at) = held.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = held.drain(..=at).collect();
                reader.pass_on(&line);
            }
            if held.len() > 4 * MAX_CODE {
                held.clear();
            }
        }
        reader.ended.cancel();
    });
    match is_ready.await {
        Ok(Ok(())) => {
            guard.0 = None;
            Ok(k)
        }
        Ok(Err(e)) => Err(refused(e)),
        Err(_) => Err(PlaneError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the interpreter did not start".into(),
        )),
    }
}

impl Kernel {
    /// One line the interpreter wrote: to the running cell, if it is that cell's.
    fn pass_on(&self, line: &[u8]) {
        let Ok(mut v) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        let Some(cell) = sink.as_mut() else {
            return;
        };
        if v.get("id").and_then(Value::as_str) != Some(cell.id.as_str()) {
            return;
        }
        if v.get("type").and_then(Value::as_str) == Some("end") {
            if let Some(end) = cell.end.take() {
                let _ = end.send(());
            }
            return;
        }
        if let Some(o) = v.as_object_mut() {
            o.remove("id");
        }
        let _ = cell.lines.try_send(v);
    }
}

/// How long the call may wait: the client's deadline (`Connect-Timeout-Ms`, or the request's
/// own), else [`DEFAULT_WAIT`].
fn wait_of(headers: &axum::http::HeaderMap) -> Duration {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(DEFAULT_WAIT, |ms| {
            Duration::from_millis(ms.min(LIFETIME_MS))
        })
}

/// `POST /execute`: `{"code", "language"?, "context_id"?, "env_vars"?}`, answered with the
/// cell's lines (NDJSON) as they come.
async fn execute(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, PlaneError> {
    let caller = caller.map_err(refused)?;
    let req: Value = serde_json::from_slice(&body)
        .map_err(|_| PlaneError(StatusCode::BAD_REQUEST, "the body is not JSON".into()))?;
    let code = req.get("code").and_then(Value::as_str).unwrap_or_default();
    if code.len() > MAX_CODE {
        return Err(PlaneError(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the code is larger than 1 MiB".into(),
        ));
    }
    if req.get("context_id").is_some_and(|c| !c.is_null())
        && req.get("language").is_some_and(|l| !l.is_null())
    {
        return Err(PlaneError(
            StatusCode::BAD_REQUEST,
            "name a context or a language, not both".into(),
        ));
    }
    python(req.get("language"))?;
    let mut env = serde_json::Map::new();
    if let Some(vars) = req.get("env_vars").and_then(Value::as_object) {
        for (k, v) in vars {
            let v = v.as_str().ok_or_else(|| {
                PlaneError(
                    StatusCode::BAD_REQUEST,
                    "env_vars values must be strings".into(),
                )
            })?;
            env.insert(k.clone(), json!(v));
        }
    }
    let context = req
        .get("context_id")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    let wait = wait_of(&headers);
    let k = kernel(&app, &caller, &context, None, wait).await?;
    let turn = k.turn.clone().lock_owned().await;
    let cell = crate::accounts::sessions::fresh_token();
    let (lines, mut cell_lines) = tokio::sync::mpsc::channel::<Value>(LINES_QUEUE);
    let (end, mut ended_cell) = tokio::sync::oneshot::channel();
    *k.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(Cell {
        id: cell.clone(),
        lines,
        end: Some(end),
    });
    let mut line = json!({ "id": cell, "code": code, "env": env }).to_string();
    line.push('\n');
    type_in(&app, &caller, &k.typist, Bytes::from(line), wait)
        .await
        .map_err(refused)?;
    let (out, body) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let _turn = turn;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let next = tokio::select! {
                biased;
                v = cell_lines.recv() => v,
                _ = &mut ended_cell => {
                    // The cell's end came after its lines: those still queued go first.
                    while let Ok(v) = cell_lines.try_recv() {
                        let _ = out.send(ndjson(&v)).await;
                    }
                    break;
                }
                () = k.ended.cancelled() => None,
                () = tokio::time::sleep_until(deadline) => None,
            };
            let Some(v) = next else {
                // The interpreter ended (or the wait did) before the cell: said as its error.
                let why = if k.ended.is_cancelled() {
                    "the interpreter ended (its time ran out, it was stopped, or it crashed): its names are gone"
                } else {
                    "the cell did not end in time"
                };
                let error = json!({ "type": "error", "name": "InterpreterEnded", "value": why, "traceback": why });
                let _ = out.send(ndjson(&error)).await;
                break;
            };
            // A client that went leaves the cell to run on; its lines are dropped.
            let _ = out.send(ndjson(&v)).await;
        }
        *k.sink.lock().unwrap_or_else(|e| e.into_inner()) = None;
    });
    let stream = futures_util::stream::unfold(body, |mut rx| async move {
        rx.recv()
            .await
            .map(|f| (Ok::<Bytes, std::convert::Infallible>(f), rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

fn ndjson(v: &Value) -> Bytes {
    let mut line = v.to_string();
    line.push('\n');
    Bytes::from(line)
}

/// `POST /contexts`: a new context (`{"language"?, "cwd"?}`), its interpreter started.
async fn create_context(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, PlaneError> {
    let caller = caller.map_err(refused)?;
    let req: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(&body)
            .map_err(|_| PlaneError(StatusCode::BAD_REQUEST, "the body is not JSON".into()))?
    };
    python(req.get("language"))?;
    let cwd = match req.get("cwd").and_then(Value::as_str) {
        Some(c) if !c.is_empty() => workspace_path(c).map_err(refused)?,
        _ => String::new(),
    };
    let id = crate::accounts::sessions::fresh_token()
        .chars()
        .rev()
        .take(16)
        .collect::<String>();
    let k = kernel(&app, &caller, &id, Some(cwd), wait_of(&headers)).await?;
    Ok(Json(k.shown(&id)).into_response())
}

/// `GET /contexts`: the caller's contexts in the room.
async fn list_contexts(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
) -> Result<Response, PlaneError> {
    let caller = caller.map_err(refused)?;
    let mine: Vec<Value> = app
        .e2b_kernels
        .of(&caller.room, caller.actor.id.as_str())
        .iter()
        .map(|(id, k)| k.shown(id))
        .collect();
    Ok(Json(mine).into_response())
}

/// Takes the caller's context `id` out, its interpreter ended.
async fn take(app: &AppState, caller: &EnvdCaller, id: &str) -> Result<Arc<Kernel>, PlaneError> {
    let key: Key = (
        caller.room.clone(),
        caller.actor.id.to_string(),
        id.to_owned(),
    );
    let slot = app.e2b_kernels.locked().remove(&key);
    let gone = || PlaneError(StatusCode::NOT_FOUND, "no such context of yours".into());
    let slot = slot.ok_or_else(gone)?;
    let k = slot.lock().await.take().ok_or_else(gone)?;
    k.kill.cancel();
    Ok(k)
}

/// `DELETE /contexts/{id}`.
async fn remove_context(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    Path(id): Path<String>,
) -> Result<Response, PlaneError> {
    let caller = caller.map_err(refused)?;
    take(&app, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /contexts/{id}/restart`: a fresh interpreter, its names gone.
async fn restart_context(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, PlaneError> {
    let caller = caller.map_err(refused)?;
    let old = take(&app, &caller, &id).await?;
    let _ = tokio::time::timeout(Duration::from_secs(10), old.ended.cancelled()).await;
    kernel(&app, &caller, &id, Some(old.cwd.clone()), wait_of(&headers)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

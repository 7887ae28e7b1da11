//! envd's `process.Process` service: `Start` runs a command as the room's command operation
//! (`Ops::run_command`: the caller's rights, approval mode, budget, moderation, audit) and
//! streams its output as it is printed.

use super::connect::{self, Code, ConnectError};
use super::{workspace_path, EnvdCaller};
use crate::http::{ApiError, AppState};
use crate::ops::approvals::Waited;
use crate::ops::commands::{Command, Executed};
use crate::ops::typing::{Typed, Typist};
use crate::ops::{OpError, Outcome};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use bytes::Bytes;
use coderoom_authz::Capability;
use coderoom_sandbox::proto::{RunInput, RUN_PTY, RUN_STDERR};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest a command runs (the room's cap on any command), and the default for a call with no
/// deadline.
const MAX_RUN_MS: u64 = 10 * 60 * 1000;
/// Keepalives when the client names no interval, and the bounds on what it may name.
const DEFAULT_KEEPALIVE_S: u64 = 30;
/// Output chunks waiting for a slow client before more are dropped.
const OUTPUT_QUEUE: usize = 256;
/// Frames a command's stream holds for its client before output is dropped.
const FRAMES_QUEUE: usize = 1024;
/// How long a command's end waits for a client that does not read.
const END_WAIT: Duration = Duration::from_secs(30);

/// Process ids this door hands out (not the sandbox's own: they name a command's stream).
static NEXT_PID: AtomicU32 = AtomicU32::new(1000);

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/e2b/envd/process.Process/Start", post(start))
        .route("/api/e2b/envd/process.Process/Connect", post(attach))
        .route("/api/e2b/envd/process.Process/List", post(list))
        .route("/api/e2b/envd/process.Process/SendSignal", post(signal))
        .route("/api/e2b/envd/process.Process/SendInput", post(send_input))
        .route(
            "/api/e2b/envd/process.Process/StreamInput",
            post(stream_input),
        )
        .route(
            "/api/e2b/envd/process.Process/CloseStdin",
            post(close_stdin),
        )
        .route("/api/e2b/envd/process.Process/Update", post(update))
}

/// Commands started through this door and still running, by the pid it gave them.
#[derive(Default)]
pub(crate) struct Running {
    all: std::sync::Mutex<std::collections::HashMap<u32, Started>>,
}

struct Started {
    room: crate::ids::RoomId,
    user: String,
    /// What `List` shows of it (`ProcessConfig`).
    config: Value,
    kill: tokio_util::sync::CancellationToken,
    /// Its events (`data`, `end`) as they happen, for `Connect`ed streams.
    events: tokio::sync::broadcast::Sender<Value>,
    /// How it takes input, when it was started with some (`stdin`, or a PTY).
    input: Option<Fed>,
}

/// A running command's input: keys and bytes through the caller's typist (the room's typing
/// operation decides them), the rest (end of input, a terminal's size) straight to it.
#[derive(Clone)]
struct Fed {
    typist: Arc<tokio::sync::Mutex<Typist>>,
    control: tokio::sync::mpsc::Sender<RunInput>,
    pty: bool,
}

/// Input chunks waiting for a command before the sender waits.
pub(super) const INPUT_QUEUE: usize = 64;
/// Events a `Connect`ed stream may fall behind before it misses some.
const EVENTS_QUEUE: usize = 256;

impl Running {
    fn locked(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, Started>> {
        self.all.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `f` takes of the caller's command `pid` (`not_found` for another's, or none).
    fn mine<T>(
        &self,
        caller: &EnvdCaller,
        pid: Option<u32>,
        f: impl FnOnce(&Started) -> T,
    ) -> Result<T, ConnectError> {
        let running = self.locked();
        pid.and_then(|p| running.get(&p))
            .filter(|s| s.room == caller.room && s.user == caller.actor.id.as_str())
            .map(f)
            .ok_or_else(|| ConnectError::new(Code::NotFound, "no such process of yours"))
    }
}

/// The pid a request's `ProcessSelector` names.
fn selected(req: &Value) -> Option<u32> {
    req.pointer("/process/pid")
        .and_then(|p| p.as_u64().or_else(|| p.as_str()?.parse().ok()))
        .and_then(|p| u32::try_from(p).ok())
}

/// Takes a command out of [`Running`] when it ends, however its task ends.
struct Registered<'a>(&'a Running, u32);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.locked().remove(&self.1);
    }
}

/// `process.Process/List`: the caller's commands running in this room.
async fn list(State(app): State<AppState>, caller: Result<EnvdCaller, ConnectError>) -> Response {
    let caller = match caller {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let processes: Vec<Value> = app
        .e2b_running
        .locked()
        .iter()
        .filter(|(_, s)| s.room == caller.room && s.user == caller.actor.id.as_str())
        .map(|(pid, s)| json!({ "pid": pid, "config": s.config }))
        .collect();
    connect::unary(json!({ "processes": processes }))
}

/// `process.Process/SendSignal`: `SIGKILL` or `SIGTERM` ends one of the caller's commands
/// (its whole unit; it answers as killed, exit code -1). Another's, or none: `not_found`.
async fn signal(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    body: Bytes,
) -> Response {
    let asked = caller.and_then(|c| Ok((c, connect::plain(&body)?)));
    let (caller, req) = match asked {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let pid = selected(&req);
    let sig = req
        .get("signal")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !matches!(sig, "SIGNAL_SIGKILL" | "SIGNAL_SIGTERM") {
        return ConnectError::new(Code::InvalidArgument, "only SIGKILL and SIGTERM are sent")
            .into_response();
    }
    match app.e2b_running.mine(&caller, pid, |s| s.kill.cancel()) {
        Ok(()) => connect::unary(json!({})),
        Err(e) => e.into_response(),
    }
}

/// The caller, its request, and the input of the command it names.
async fn fed(
    app: &AppState,
    caller: Result<EnvdCaller, ConnectError>,
    body: &[u8],
) -> Result<(EnvdCaller, Value, Fed), ConnectError> {
    let caller = caller?;
    let req = connect::plain(body)?;
    let fed = app
        .e2b_running
        .mine(&caller, selected(&req), |s| s.input.clone())?
        .ok_or_else(|| {
            ConnectError::new(
                Code::FailedPrecondition,
                "this process takes no input: start it with stdin (or a PTY)",
            )
        })?;
    Ok((caller, req, fed))
}

/// `process.Process/SendInput`: bytes for a command's standard input or its PTY, typed as the
/// caller types at the room's terminal (see `Ops::type_keys`).
async fn send_input(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (caller, req, fed) = match fed(&app, caller, &body).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let data = match input_bytes(req.get("input")) {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let (run_ms, _) = deadlines(&headers);
    match type_in(
        &app,
        &caller,
        &fed.typist,
        data,
        Duration::from_millis(run_ms),
    )
    .await
    {
        Ok(()) => connect::unary(json!({})),
        Err(e) => e.into_response(),
    }
}

/// The bytes of a `ProcessInput` (`{"stdin": b64}` or `{"pty": b64}`).
fn input_bytes(input: Option<&Value>) -> Result<Bytes, ConnectError> {
    let encoded = input
        .and_then(|i| i.get("stdin").or_else(|| i.get("pty")))
        .and_then(Value::as_str)
        .unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map(Bytes::from)
        .map_err(|_| ConnectError::new(Code::InvalidArgument, "input is not base64"))
}

/// Types `data` into the command through the caller's typist; an agent's line that waits for
/// an approval is held (as the command itself was) until a person decides, then typed.
pub(super) async fn type_in(
    app: &AppState,
    caller: &EnvdCaller,
    typist: &tokio::sync::Mutex<Typist>,
    data: Bytes,
    wait: Duration,
) -> Result<(), ConnectError> {
    if data.is_empty() {
        return Ok(());
    }
    let mut typist = typist.lock().await;
    let mut retried = false;
    loop {
        let (rights, _) = app
            .ops
            .rights(&caller.room, &caller.actor, Capability::Type)
            .await
            .map_err(ApiError::from)?;
        let may_type = rights.may_act(app.ops.clock.now_ms());
        let typed = app
            .ops
            .type_keys(&caller.room, &mut typist, may_type, data.clone())
            .await
            .map_err(ApiError::from)?;
        match typed {
            Typed::Sent { .. } => return Ok(()),
            Typed::NoType => {
                return Err(ConnectError::new(
                    Code::PermissionDenied,
                    "missing capability type: nothing was typed",
                ))
            }
            Typed::Refused(why) => {
                return Err(ConnectError::new(
                    Code::PermissionDenied,
                    format!("{why}: nothing was typed"),
                ))
            }
            Typed::Pending(id) if !retried => {
                retried = true;
                approved(app, &caller.room, &id, wait, "nothing was typed").await?;
            }
            Typed::Pending(id) => {
                return Err(ConnectError::new(
                    Code::FailedPrecondition,
                    format!("the line still needs an approval (approval {id}): send it whole"),
                ))
            }
        }
    }
}

/// Waits up to `wait` for a person's decision on approval `id`: approved, or the error the
/// SDK gets (`undone` says what did not happen).
pub(super) async fn approved(
    app: &AppState,
    room: &crate::ids::RoomId,
    id: &str,
    wait: Duration,
    undone: &str,
) -> Result<(), ConnectError> {
    match app.ops.wait_for_decision(room, id, wait).await {
        Ok(Waited::Approved) => Ok(()),
        Ok(Waited::Denied(by)) => Err(ConnectError::new(
            Code::PermissionDenied,
            format!("denied (by {by}): {undone}"),
        )),
        Ok(Waited::Expired | Waited::Undecided) => Err(ConnectError::new(
            Code::DeadlineExceeded,
            format!("approval {id} was not given in time: {undone}"),
        )),
        Err(e) => Err(ConnectError::from(ApiError::from(e))),
    }
}

/// `process.Process/StreamInput`: a client stream of `start` (the process), then `data`
/// (typed as `SendInput` types) and `keepalive`s; answered with one empty message once the
/// client's stream ends.
async fn stream_input(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let (frames, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    let (run_ms, _) = deadlines(&headers);
    let fed = async {
        let caller = caller?;
        let mut reader = connect::FrameReader::new(body);
        let mut fed: Option<Fed> = None;
        while let Some(msg) = reader.next().await? {
            if let Some(start) = msg.get("start") {
                let input = app
                    .e2b_running
                    .mine(&caller, selected(start), |s| s.input.clone())?;
                fed = Some(input.ok_or_else(|| {
                    ConnectError::new(Code::FailedPrecondition, "this process takes no input")
                })?);
            } else if let Some(data) = msg.get("data") {
                let to = fed.as_ref().ok_or_else(|| {
                    ConnectError::new(Code::InvalidArgument, "data before the stream's start")
                })?;
                let bytes = input_bytes(data.get("input"))?;
                type_in(
                    &app,
                    &caller,
                    &to.typist,
                    bytes,
                    Duration::from_millis(run_ms),
                )
                .await?;
            }
        }
        Ok::<(), ConnectError>(())
    };
    let end = fed.await.err();
    if end.is_none() {
        let _ = frames.try_send(connect::frame(&json!({})));
    }
    let _ = frames.try_send(connect::end(end.as_ref()));
    connect::streaming(rx)
}

/// `process.Process/CloseStdin`: the command's standard input ends.
async fn close_stdin(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    body: Bytes,
) -> Response {
    match fed(&app, caller, &body).await {
        Ok((_, _, fed)) => {
            let _ = fed.control.send(RunInput::Close).await;
            connect::unary(json!({}))
        }
        Err(e) => e.into_response(),
    }
}

/// `process.Process/Update`: a PTY's new size.
async fn update(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    body: Bytes,
) -> Response {
    let (_, req, fed) = match fed(&app, caller, &body).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let Some((cols, rows)) = pty_size(&req) else {
        return ConnectError::new(Code::InvalidArgument, "no pty.size to set").into_response();
    };
    if !fed.pty {
        return ConnectError::new(Code::FailedPrecondition, "this process has no PTY")
            .into_response();
    }
    let _ = fed.control.send(RunInput::Resize(cols, rows)).await;
    connect::unary(json!({}))
}

/// `{"pty": {"size": {"cols", "rows"}}}`.
fn pty_size(req: &Value) -> Option<(u16, u16)> {
    let size = req.pointer("/pty/size")?;
    let n = |k: &str| {
        size.get(k)
            .and_then(Value::as_u64)
            .map(|v| u16::try_from(v.clamp(1, 1000)).unwrap_or(1000))
    };
    Some((n("cols")?, n("rows")?))
}

/// `process.Process/Connect`: a stream of a running command's events from now on (its `start`
/// first, then its output, keepalives, its `end`).
async fn attach(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (frames, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let events = caller.and_then(|c| {
        let req = connect::enveloped(&body)?;
        let pid = selected(&req);
        let events = app.e2b_running.mine(&c, pid, |s| s.events.subscribe())?;
        Ok((pid.unwrap_or_default(), events))
    });
    let (pid, mut events) = match events {
        Ok(e) => e,
        Err(e) => {
            let _ = frames.try_send(connect::end(Some(&e)));
            return connect::streaming(rx);
        }
    };
    let (_, keepalive) = deadlines(&headers);
    tokio::spawn(async move {
        let event = |e: Value| connect::frame(&json!({ "event": e }));
        if frames
            .send(event(json!({ "start": { "pid": pid } })))
            .await
            .is_err()
        {
            return;
        }
        let mut ticks = tokio::time::interval(keepalive);
        ticks.tick().await;
        loop {
            let next = tokio::select! {
                e = events.recv() => e,
                _ = ticks.tick() => Ok(json!({ "keepalive": {} })),
            };
            let e = match next {
                Ok(e) => e,
                // Behind: what it missed is gone; it goes on from here.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            };
            let last = e.get("end").is_some();
            if frames.send(event(e)).await.is_err() || last {
                break;
            }
        }
        let _ = frames.send(connect::end(None)).await;
    });
    connect::streaming(rx)
}

/// What `Start` asks for.
struct Asked {
    argv: Vec<String>,
    cwd: String,
    envs: Vec<(String, String)>,
    /// It takes input (`stdin`; a PTY always does).
    stdin: bool,
    pty: Option<(u16, u16)>,
}

fn asked(req: &Value) -> Result<Asked, ConnectError> {
    let bad = |why: &str| ConnectError::new(Code::InvalidArgument, why);
    let pty = match req.get("pty") {
        None | Some(Value::Null) => None,
        Some(_) => Some(pty_size(req).ok_or_else(|| bad("a PTY needs pty.size"))?),
    };
    let stdin = pty.is_some() || req.get("stdin").and_then(Value::as_bool).unwrap_or(false);
    let process = req.get("process").ok_or_else(|| bad("no process"))?;
    let cmd = process
        .get("cmd")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("no process.cmd"))?;
    let mut argv = vec![cmd.to_owned()];
    for a in process
        .get("args")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
    {
        argv.push(
            a.as_str()
                .ok_or_else(|| bad("process.args must be strings"))?
                .to_owned(),
        );
    }
    let cwd = match process.get("cwd").and_then(Value::as_str) {
        Some(c) if !c.is_empty() => workspace_path(c)?,
        _ => String::new(),
    };
    let mut envs = Vec::new();
    if let Some(map) = process.get("envs").and_then(Value::as_object) {
        for (k, v) in map {
            let v = v
                .as_str()
                .ok_or_else(|| bad("process.envs values must be strings"))?;
            envs.push((k.clone(), v.to_owned()));
        }
    }
    Ok(Asked {
        argv,
        cwd,
        envs,
        stdin,
        pty,
    })
}

/// How long the call may run (`Connect-Timeout-Ms`, none or 0: the longest a command runs),
/// and how often a keepalive goes out (`Keepalive-Ping-Interval`, seconds).
pub(super) fn deadlines(headers: &HeaderMap) -> (u64, Duration) {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let run_ms = match number("connect-timeout-ms") {
        Some(ms) if ms > 0 => ms.min(MAX_RUN_MS),
        _ => MAX_RUN_MS,
    };
    let keepalive = number("keepalive-ping-interval")
        .unwrap_or(DEFAULT_KEEPALIVE_S)
        .clamp(1, 3600);
    (run_ms, Duration::from_secs(keepalive))
}

/// `process.Process/Start`: a server stream of the command's `start` (once it is decided and
/// sent), `data` as printed, `keepalive`s, and its `end`; a refusal is the stream's error.
async fn start(
    State(app): State<AppState>,
    caller: Result<EnvdCaller, ConnectError>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (frames, rx) = tokio::sync::mpsc::channel::<Bytes>(FRAMES_QUEUE);
    let asked = caller.and_then(|c| {
        let req = connect::enveloped(&body)?;
        Ok((c, asked(&req)?))
    });
    let (caller, asked) = match asked {
        Ok(a) => a,
        Err(e) => {
            let _ = frames.try_send(connect::end(Some(&e)));
            return connect::streaming(rx);
        }
    };
    let (run_ms, keepalive) = deadlines(&headers);
    tokio::spawn(run(app, caller, asked, (run_ms, keepalive), frames));
    connect::streaming(rx)
}

/// Runs the command and tells the stream. A client that went away does not stop it (as
/// envd's processes outlive their stream): it runs to its end or its deadline.
async fn run(
    app: AppState,
    caller: EnvdCaller,
    asked: Asked,
    (run_ms, keepalive): (u64, Duration),
    frames: tokio::sync::mpsc::Sender<Bytes>,
) {
    let pid = NEXT_PID.fetch_add(1, Ordering::Relaxed);
    let (output, mut printed) = tokio::sync::mpsc::channel::<Vec<u8>>(OUTPUT_QUEUE);
    let started = Arc::new(tokio::sync::Notify::new());
    let kill = tokio_util::sync::CancellationToken::new();
    let config = json!({
        "cmd": asked.argv[0],
        "args": asked.argv[1..],
        "envs": asked.envs.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<String, Value>>(),
        "cwd": format!("/home/user/{}", asked.cwd).trim_end_matches('/'),
    });
    let (events, _) = tokio::sync::broadcast::channel(EVENTS_QUEUE);
    let mut cmd = Command::new(asked.argv, asked.cwd, Some(run_ms));
    let input = asked.stdin.then(|| {
        let (to, from) = tokio::sync::mpsc::channel(INPUT_QUEUE);
        cmd.input = Some(Arc::new(std::sync::Mutex::new(Some(from))));
        Fed {
            typist: Arc::new(tokio::sync::Mutex::new(Typist::at_command(
                caller.actor.clone(),
                to.clone(),
            ))),
            control: to,
            pty: asked.pty.is_some(),
        }
    });
    app.e2b_running.locked().insert(
        pid,
        Started {
            room: caller.room.clone(),
            user: caller.actor.id.to_string(),
            config,
            kill: kill.clone(),
            events: events.clone(),
            input,
        },
    );
    let _registered = Registered(&app.e2b_running, pid);
    cmd.envs = asked.envs;
    cmd.pty = asked.pty;
    cmd.output = Some(output);
    cmd.started = Some(started.clone());
    cmd.kill = Some(kill);
    let mut stream = Stream {
        frames: frames.clone(),
        events,
        pid,
        announced: false,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(run_ms);
    let mut approval: Option<String> = None;
    let end = loop {
        let ran = app.ops.run_command(
            &caller.room,
            &caller.actor,
            cmd.clone(),
            approval.as_deref(),
        );
        let result = stream.follow(ran, &started, &mut printed, keepalive).await;
        match result {
            Ok(Outcome::Done(done)) => {
                stream.announce().await;
                while let Ok(chunk) = printed.try_recv() {
                    stream.send(data_event(&chunk)).await;
                }
                stream.send(end_event(done.exit_code, done.timed_out)).await;
                break None;
            }
            // An agent in approval mode: the call waits (the SDK has no "ask again later")
            // for a person's decision on exactly this command, then runs it.
            Ok(Outcome::Pending(id)) if approval.is_none() => {
                let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
                match approved(&app, &caller.room, &id, wait, "the command did not run").await {
                    Ok(()) => approval = Some(id),
                    Err(e) => break Some(e),
                }
            }
            Ok(Outcome::Pending(id)) => {
                break Some(ConnectError::new(
                    Code::FailedPrecondition,
                    format!("the command still needs an approval (approval {id})"),
                ))
            }
            Err(e) => break Some(ConnectError::from(ApiError::from(e))),
        }
    };
    let _ = tokio::time::timeout(END_WAIT, frames.send(connect::end(end.as_ref()))).await;
}

/// A command's stream to the SDK: its `start` goes first, once.
struct Stream {
    frames: tokio::sync::mpsc::Sender<Bytes>,
    /// The same events, for `Connect`ed streams.
    events: tokio::sync::broadcast::Sender<Value>,
    pid: u32,
    announced: bool,
}

impl Stream {
    async fn send(&self, event: Value) {
        let _ = self.events.send(event.clone());
        let frame = connect::frame(&json!({ "event": event }));
        if event.get("end").is_some() {
            // The end is waited for (a while: a client that never reads does not hold the
            // command's record forever).
            let _ = tokio::time::timeout(END_WAIT, self.frames.send(frame)).await;
        } else {
            // A client that does not read (a background handle never waited on) loses output
            // past its queue, and holds up neither the command nor those attached to it.
            let _ = self.frames.try_send(frame);
        }
    }

    async fn announce(&mut self) {
        if !self.announced {
            self.announced = true;
            self.send(json!({ "start": { "pid": self.pid } })).await;
        }
    }

    /// Follows one run of the command: its `start` once it is sent to the sandbox, its output
    /// as printed, keepalives; what the run answered.
    async fn follow(
        &mut self,
        ran: impl std::future::Future<Output = Result<Outcome<Executed>, OpError>>,
        started: &tokio::sync::Notify,
        printed: &mut tokio::sync::mpsc::Receiver<Vec<u8>>,
        keepalive: Duration,
    ) -> Result<Outcome<Executed>, OpError> {
        tokio::pin!(ran);
        let mut ticks = tokio::time::interval(keepalive);
        ticks.tick().await;
        loop {
            tokio::select! {
                r = &mut ran => return r,
                () = started.notified(), if !self.announced => self.announce().await,
                Some(chunk) = printed.recv() => {
                    self.announce().await;
                    self.send(data_event(&chunk)).await;
                }
                _ = ticks.tick() => {
                    if self.announced {
                        self.send(json!({ "keepalive": {} })).await;
                    }
                }
            }
        }
    }
}

/// A `data` event: standard output or error (the chunk's first byte), base64 as proto3 JSON
/// carries bytes.
fn data_event(chunk: &[u8]) -> Value {
    let (which, bytes) = match chunk.split_first() {
        Some((&RUN_STDERR, rest)) => ("stderr", rest),
        Some((&RUN_PTY, rest)) => ("pty", rest),
        Some((_, rest)) => ("stdout", rest),
        None => ("stdout", &[][..]),
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    json!({ "data": { which: encoded } })
}

/// The `end` event: the exit code (proto3 JSON leaves a zero out), or -1 for a process that
/// was killed (its timeout, a signal).
fn end_event(exit_code: Option<i32>, timed_out: bool) -> Value {
    let mut end = match exit_code {
        Some(code) => json!({ "exited": true, "status": format!("exit status {code}") }),
        None => json!({ "exitCode": -1, "exited": false, "status": "signal: killed" }),
    };
    if let Some(code) = exit_code.filter(|c| *c != 0) {
        end["exitCode"] = json!(code);
    }
    if timed_out {
        end["error"] = json!("the command ran out of time and was killed");
    }
    json!({ "end": end })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_proto3_json() {
        assert_eq!(data_event(b"\x01hi"), json!({"data": {"stdout": "aGk="}}));
        assert_eq!(data_event(b"\x02hi"), json!({"data": {"stderr": "aGk="}}));
        assert_eq!(
            end_event(Some(0), false),
            json!({"end": {"exited": true, "status": "exit status 0"}})
        );
        assert_eq!(end_event(Some(3), false)["end"]["exitCode"], 3);
        assert_eq!(end_event(None, true)["end"]["exitCode"], -1);
    }
}

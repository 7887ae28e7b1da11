//! Room sandboxes, control-plane side. One supervisor task per room owns the room's sandbox
//! handle, its lifecycle (start on first need, idle stop with a durable timer, snapshot on stop,
//! resume from the latest snapshot, failure), and the shared terminal hub. Requests reach it
//! through a bounded channel; nothing outside holds its state.
//!
//! Lifecycle, in the `sandboxes` table and the room's audit chain (every transition is one
//! record with the sandbox's receipt, written in the same transaction as the new state):
//!
//! ```text
//!  (none) --first need--> running --stop / idle--> stopped --first need / start--> running
//!                            |  \--server shutdown--> suspended --first need--> running
//!                            \--agent died, OOM...--> failed --start--> running
//! ```

use crate::audit::Audit;
use crate::config::SandboxArgs;
use crate::store::{now_ms, Change, SandboxRow, Store, StoreError};
use crate::terminal::Recorder;
use crate::terminal::{Joined, TermOut};
use bytes::Bytes;
use coderoom_sandbox::proto::{Op, Reply};
use coderoom_sandbox::{Backend, CallError, Ended, Event, Receipt, Sandbox};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Requests queued for one room's supervisor before callers wait.
const ACTOR_QUEUE: usize = 256;
/// Terminal chunks queued for one viewer (PTY reads, mostly 4 KiB: about 1 MiB); a viewer this
/// far behind is dropped and catches up from the scrollback when it reconnects, so it never
/// slows the others.
const VIEWER_QUEUE: usize = 256;
/// Time a snapshot (and a restore) may take.
const SNAPSHOT_WITHIN: Duration = Duration::from_secs(120);
/// Time the sandbox gets to end after being killed.
const KILL_WITHIN: Duration = Duration::from_secs(10);
/// Time the file sync gets to write pending edits before a snapshot.
const SYNC_STOP_WITHIN: Duration = Duration::from_secs(10);
/// Snapshots kept per room (the newest ones).
const KEEP_SNAPSHOTS: usize = 2;
/// How often the idle scheduler looks for due timers.
const IDLE_POLL: Duration = Duration::from_millis(250);
/// The idle timer is re-armed in the database at most this often while operations arrive.
const REARM_EVERY_MS: i64 = 1000;
/// Idle stops whose snapshot fails before the sandbox is stopped without one.
const IDLE_STOP_ATTEMPTS: u32 = 3;
/// Terminal output held by the pump for the supervisor; past it the pump waits (that is the
/// terminal's flow control) for at most [`PUMP_STALL`].
const PUMP_PENDING: usize = 1 << 20;
/// How long the pump waits on a supervisor that takes nothing before dropping output instead,
/// so the agent's stream (which also carries snapshots) never stalls behind a busy supervisor.
const PUMP_STALL: Duration = Duration::from_millis(200);
/// Attempts at reaching a supervisor that is exiting at that moment.
const SEND_ATTEMPTS: usize = 3;

/// Why a sandbox request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SandboxError {
    /// This server runs without sandboxes.
    #[error("sandboxes are unavailable on this server: {0}")]
    Unavailable(String),
    /// The sandbox failed and waits for an explicit restart.
    #[error("the sandbox failed ({0}); POST /api/rooms/{{id}}/sandbox/start restarts it from the last snapshot")]
    Failed(String),
    /// Starting failed (details are logged, not shown).
    #[error("the sandbox could not start")]
    Start,
    /// The operation inside failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// Storage did not answer.
    #[error("storage unavailable")]
    Store(#[from] StoreError),
    /// The server is stopping.
    #[error("the server is shutting down")]
    ShuttingDown,
}

enum Cmd {
    Op {
        op: Op,
        within: Duration,
        reply: oneshot::Sender<Result<Reply, SandboxError>>,
    },
    Status {
        reply: oneshot::Sender<Value>,
    },
    Stop {
        actor: String,
        reply: oneshot::Sender<Result<Value, SandboxError>>,
    },
    Start {
        actor: String,
        reply: oneshot::Sender<Result<Value, SandboxError>>,
    },
    Join {
        cols: u16,
        rows: u16,
        reply: oneshot::Sender<Result<Joined, SandboxError>>,
    },
    Leave {
        viewer: u64,
    },
    Input {
        viewer: u64,
        user_id: String,
        email: String,
        data: Vec<u8>,
    },
    Resize {
        cols: u16,
        rows: u16,
    },
    Output {
        generation: u64,
        data: Vec<u8>,
    },
    PtyExit {
        generation: u64,
        code: Option<i32>,
    },
    Ended {
        generation: u64,
        how: Ended,
    },
    IdleDue,
    Suspend {
        reply: oneshot::Sender<()>,
    },
    Destroy {
        reply: oneshot::Sender<bool>,
    },
}

/// What the supervisors need from the rest of the server.
#[derive(Clone)]
pub(crate) struct Deps {
    pub rooms: crate::room::Rooms,
    pub limits: Arc<crate::config::Limits>,
    pub store: Store,
    pub audit: Audit,
    pub data_dir: PathBuf,
    pub cfg: Arc<SandboxArgs>,
    pub shutdown: CancellationToken,
}

struct Inner {
    backend: Backend,
    /// Why this tier was chosen (`--sandbox-tier auto` says what it found), for the panel.
    tier_reason: String,
    deps: Deps,
    supervisors: crate::registry::Registry<Cmd>,
    /// Numbers each sandbox a supervisor starts, so events of an old one are told apart.
    next_generation: AtomicU64,
}

/// Every room's sandbox supervisor.
#[derive(Clone)]
pub(crate) struct Sandboxes {
    inner: Arc<Inner>,
}

impl Sandboxes {
    pub(crate) fn new(backend: Backend, tier_reason: String, deps: Deps) -> Self {
        Sandboxes {
            inner: Arc::new(Inner {
                backend,
                tier_reason,
                deps,
                supervisors: crate::registry::Registry::default(),
                next_generation: AtomicU64::new(1),
            }),
        }
    }

    /// The tier in use (`namespace` or `none`).
    pub(crate) fn tier(&self) -> &'static str {
        self.inner.backend.tier().name()
    }

    /// Starts the scheduler that fires durable idle timers (including those armed before a
    /// restart).
    pub(crate) fn start_idle_scheduler(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            let shutdown = this.inner.deps.shutdown.clone();
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(IDLE_POLL) => {}
                }
                match this.inner.deps.store.due_sandboxes(now_ms()).await {
                    Ok(rooms) => {
                        for room in rooms {
                            this.send(&room, || Cmd::IdleDue).await;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "idle scheduler: storage unavailable"),
                }
            }
        });
    }

    fn supervisor(&self, room_id: &str) -> mpsc::Sender<Cmd> {
        let owner = self.clone();
        self.inner
            .supervisors
            .get_or_start(room_id, ACTOR_QUEUE, |tx, rx, generation| {
                let actor = Actor::new(room_id.to_owned(), owner, tx.downgrade());
                tokio::spawn(actor.run(rx, generation));
            })
    }

    /// Sends a command without waiting for an answer.
    async fn send(&self, room_id: &str, make: impl Fn() -> Cmd) {
        let _ = self.supervisor(room_id).send(make()).await;
    }

    /// Sends a command and waits for its answer, retrying when the supervisor was exiting.
    async fn ask<T>(
        &self,
        room_id: &str,
        make: impl Fn(oneshot::Sender<T>) -> Cmd,
    ) -> Result<T, SandboxError> {
        for _ in 0..SEND_ATTEMPTS {
            let (tx, rx) = oneshot::channel();
            if self.supervisor(room_id).send(make(tx)).await.is_err() {
                continue;
            }
            if let Ok(v) = rx.await {
                return Ok(v);
            }
        }
        Err(SandboxError::ShuttingDown)
    }

    /// Runs a typed operation inside the room's sandbox, starting it if needed.
    pub(crate) async fn op(
        &self,
        room_id: &str,
        op: Op,
        within: Duration,
    ) -> Result<Reply, SandboxError> {
        let op = Arc::new(op);
        self.ask(room_id, |reply| Cmd::Op {
            op: (*op).clone(),
            within,
            reply,
        })
        .await?
    }

    /// `{"tier", "state", "limits", "receipt", ...}` of the room's sandbox.
    pub(crate) async fn status(&self, room_id: &str) -> Result<Value, SandboxError> {
        self.ask(room_id, |reply| Cmd::Status { reply }).await
    }

    /// Snapshots and stops the room's sandbox.
    pub(crate) async fn stop(&self, room_id: &str, actor: &str) -> Result<Value, SandboxError> {
        self.ask(room_id, |reply| Cmd::Stop {
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// Starts (resumes, or restarts after a failure) the room's sandbox.
    pub(crate) async fn start(&self, room_id: &str, actor: &str) -> Result<Value, SandboxError> {
        self.ask(room_id, |reply| Cmd::Start {
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// Joins the terminal (starting the sandbox and its PTY if needed).
    pub(crate) async fn join(
        &self,
        room_id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<Joined, SandboxError> {
        self.ask(room_id, |reply| Cmd::Join { cols, rows, reply })
            .await?
    }

    pub(crate) async fn leave(&self, room_id: &str, viewer: u64) {
        self.send(room_id, || Cmd::Leave { viewer }).await;
    }

    /// Terminal input from `user_id` (shown to viewers as `email`), already authorised for
    /// `type`.
    pub(crate) async fn input(
        &self,
        room_id: &str,
        viewer: u64,
        (user_id, email): (&str, &str),
        data: Vec<u8>,
    ) {
        let data = Arc::new(data);
        self.send(room_id, || Cmd::Input {
            viewer,
            user_id: user_id.to_owned(),
            email: email.to_owned(),
            data: (*data).clone(),
        })
        .await;
    }

    pub(crate) async fn resize(&self, room_id: &str, cols: u16, rows: u16) {
        self.send(room_id, || Cmd::Resize { cols, rows }).await;
    }

    /// Server shutdown: snapshots and stops every running sandbox.
    pub(crate) async fn suspend_all(&self) {
        let txs = self.inner.supervisors.all();
        let mut waits = Vec::new();
        for tx in txs {
            let (reply, rx) = oneshot::channel();
            if tx.send(Cmd::Suspend { reply }).await.is_ok() {
                waits.push(rx);
            }
        }
        for rx in waits {
            let _ = rx.await;
        }
    }

    /// Room deletion: kills the sandbox without a snapshot and closes its terminals. Returns
    /// whether a sandbox was running.
    pub(crate) async fn destroy(&self, room_id: &str) -> bool {
        let tx = self.inner.supervisors.get(room_id);
        let Some(tx) = tx else { return false };
        let (reply, rx) = oneshot::channel();
        if tx.send(Cmd::Destroy { reply }).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

enum Life {
    /// Not running (never started, stopped, suspended, or the server restarted).
    Dormant,
    Running {
        sandbox: Sandbox,
        generation: u64,
        /// Boxed: the largest part, and `Life` is mostly not `Running`.
        receipt: Box<Receipt>,
        /// When the snapshot its workspace was restored from was taken (`None` for a fresh
        /// workspace), so viewers can be told it was resumed.
        resumed_from: Option<i64>,
        /// The document <-> workspace sync of this sandbox.
        sync: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    },
    Failed(String),
}

struct Hub {
    scrollback: VecDeque<u8>,
    viewers: HashMap<u64, mpsc::Sender<TermOut>>,
    next_viewer: u64,
    pty_open: bool,
    size: (u16, u16),
    /// When each typist was last announced to viewers (`typing` events, at most one per user
    /// per [`TYPING_EVERY`]).
    typists: HashMap<String, tokio::time::Instant>,
}

/// How often viewers hear that someone is still typing.
const TYPING_EVERY: Duration = Duration::from_secs(1);

struct Actor {
    room_id: String,
    owner: Sandboxes,
    me: mpsc::WeakSender<Cmd>,
    life: Life,
    row: Option<SandboxRow>,
    generation: u64,
    hub: Hub,
    recorder: Recorder,
    last_armed: Option<i64>,
    destroyed: bool,
    failed_idle_stops: u32,
}

impl Drop for Actor {
    /// A supervisor that ends (even by a panic) takes its sandbox with it: no sandbox outlives
    /// the task that accounts for it.
    fn drop(&mut self) {
        if let Life::Running { sandbox, sync, .. } = &self.life {
            if let Some((cancel, _)) = sync {
                cancel.cancel();
            }
            sandbox.kill();
        }
    }
}

impl Actor {
    fn new(room_id: String, owner: Sandboxes, me: mpsc::WeakSender<Cmd>) -> Self {
        let deps = &owner.inner.deps;
        let recorder = Recorder::new(
            deps.data_dir
                .join("rooms")
                .join(&room_id)
                .join("recordings"),
            deps.cfg.recording_max_bytes,
        );
        Actor {
            room_id,
            me,
            life: Life::Dormant,
            row: None,
            generation: 0,
            hub: Hub {
                scrollback: VecDeque::new(),
                viewers: HashMap::new(),
                next_viewer: 1,
                pty_open: false,
                size: (80, 24),
                typists: HashMap::new(),
            },
            recorder,
            last_armed: None,
            destroyed: false,
            failed_idle_stops: 0,
            owner,
        }
    }

    fn deps(&self) -> &Deps {
        &self.owner.inner.deps
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>, generation: u64) {
        match self.deps().store.sandbox(&self.room_id).await {
            Ok(row) => {
                if let Some(r) = &row {
                    if r.state == "failed" {
                        self.life = Life::Failed(r.reason.clone());
                    }
                    self.last_armed = r.stop_at;
                }
                self.row = row;
            }
            Err(e) => {
                tracing::error!(room = %self.room_id, error = %e, "cannot load the sandbox state");
                // Answer what is queued with an error by dropping it, then let callers retry.
            }
        }
        let every = Duration::from_millis(self.deps().cfg.sandbox_snapshot_every_ms.max(1000));
        let mut next_snapshot = tokio::time::Instant::now() + every;
        loop {
            let running = matches!(self.life, Life::Running { .. });
            let cmd = tokio::select! {
                cmd = rx.recv() => cmd,
                () = tokio::time::sleep_until(next_snapshot), if running => {
                    self.periodic_snapshot().await;
                    next_snapshot = tokio::time::Instant::now() + every;
                    continue;
                }
            };
            let Some(cmd) = cmd else { break };
            self.handle(cmd).await;
            let running = matches!(self.life, Life::Running { .. });
            let idle = !running && self.hub.viewers.is_empty();
            if (idle || self.destroyed)
                && self
                    .owner
                    .inner
                    .supervisors
                    .release(&self.room_id, generation, &rx)
            {
                break;
            }
        }
    }

    async fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Op { op, within, reply } => {
                let sandbox = match self.ensure_running("first use").await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                self.touch().await;
                tokio::spawn(async move {
                    let r = sandbox.call(op, within).await.map_err(SandboxError::from);
                    let _ = reply.send(r);
                });
            }
            Cmd::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Cmd::Stop { actor, reply } => {
                let r = self
                    .stop(
                        &actor,
                        &format!("stop requested by {actor}"),
                        "stopped",
                        false,
                    )
                    .await
                    .map(|()| self.status());
                let _ = reply.send(r);
            }
            Cmd::Start { actor, reply } => {
                let reason = match &self.life {
                    Life::Failed(_) => format!("restart after failure, requested by {actor}"),
                    _ => format!("start requested by {actor}"),
                };
                if matches!(self.life, Life::Failed(_)) {
                    self.life = Life::Dormant;
                }
                let r = self.ensure_running(&reason).await.map(|_| self.status());
                let _ = reply.send(r);
            }
            Cmd::Join { cols, rows, reply } => {
                let r = self.join(cols, rows).await;
                let _ = reply.send(r);
            }
            Cmd::Leave { viewer } => {
                self.hub.viewers.remove(&viewer);
                self.touch().await;
            }
            Cmd::Input {
                viewer,
                user_id,
                email,
                data,
            } => {
                self.announce_typing(&user_id, &email);
                self.input(viewer, &user_id, data).await;
            }
            Cmd::Resize { cols, rows } => {
                self.hub.size = (cols, rows);
                if let Life::Running { sandbox, .. } = &self.life {
                    let _ = sandbox.send(Op::PtyResize { cols, rows }).await;
                }
            }
            Cmd::Output { generation, data } => {
                if generation == self.generation {
                    self.output(data);
                }
            }
            Cmd::PtyExit { generation, code } => {
                if generation == self.generation {
                    self.hub.pty_open = false;
                    self.broadcast_event(json!({ "type": "exit", "code": code }));
                }
            }
            Cmd::Ended { generation, how } => self.ended(generation, how).await,
            Cmd::IdleDue => self.idle_due().await,
            Cmd::Suspend { reply } => {
                if let Err(e) = self
                    .stop("system", "server shutdown", "suspended", true)
                    .await
                {
                    tracing::error!(room = %self.room_id, error = %e, "cannot suspend the sandbox");
                }
                let _ = reply.send(());
            }
            Cmd::Destroy { reply } => {
                let was = matches!(self.life, Life::Running { .. });
                if let Life::Running { sandbox, sync, .. } = &self.life {
                    if let Some((cancel, _)) = sync {
                        cancel.cancel();
                    }
                    sandbox.kill();
                    let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
                }
                self.life = Life::Dormant;
                for (_, tx) in self.hub.viewers.drain() {
                    let _ = tx.try_send(TermOut::Close(4004, "room deleted"));
                }
                self.destroyed = true;
                let _ = reply.send(was);
            }
        }
    }

    fn status(&self) -> Value {
        let limits = self.deps().cfg.limits();
        let (state, reason) = match &self.life {
            Life::Running { .. } => ("running".to_owned(), self.row_reason()),
            Life::Failed(r) => ("failed".to_owned(), r.clone()),
            Life::Dormant => match &self.row {
                None => ("absent".to_owned(), String::new()),
                // A row left `running` by a crash is a sandbox that is not running now.
                Some(r) if r.state == "running" => ("suspended".to_owned(), r.reason.clone()),
                Some(r) => (r.state.clone(), r.reason.clone()),
            },
        };
        let receipt: Value = match &self.life {
            Life::Running { receipt, .. } => json!(receipt),
            _ => self
                .row
                .as_ref()
                .and_then(|r| serde_json::from_str(&r.receipt).ok())
                .unwrap_or(Value::Null),
        };
        let usage = match &self.life {
            Life::Running { sandbox, .. } => {
                let p = sandbox.pressure();
                json!({ "oom_kills": p.oom_kills, "forks_refused": p.pids_refused })
            }
            _ => Value::Null,
        };
        json!({
            "tier": self.owner.tier(),
            "tier_reason": self.owner.inner.tier_reason,
            "state": state,
            "reason": reason,
            "limits": limits,
            "receipt": receipt,
            "snapshot_at": self.row.as_ref().and_then(|r| r.snapshot_at),
            // Running on a workspace restored from the snapshot taken at this time.
            "resumed_from": match &self.life {
                Life::Running { resumed_from, .. } => *resumed_from,
                _ => None,
            },
            "idle_stop_at": self.row.as_ref().and_then(|r| r.stop_at),
            "usage": usage,
        })
    }

    fn row_reason(&self) -> String {
        self.row
            .as_ref()
            .map(|r| r.reason.clone())
            .unwrap_or_default()
    }

    async fn ensure_running(&mut self, reason: &str) -> Result<Sandbox, SandboxError> {
        if self.deps().shutdown.is_cancelled() {
            return Err(SandboxError::ShuttingDown);
        }
        match &self.life {
            Life::Running { sandbox, .. } => return Ok(sandbox.clone()),
            Life::Failed(r) => return Err(SandboxError::Failed(r.clone())),
            Life::Dormant => {}
        }
        if let Backend::None(why) = &self.owner.inner.backend {
            return Err(SandboxError::Unavailable(why.clone()));
        }
        // The latest snapshot first, then older ones, then an empty workspace: a snapshot that
        // does not restore (it was written by the untrusted agent) never locks the room out.
        // The document holds every text file anyway and wins at the next sync.
        let mut candidates: Vec<Option<String>> =
            self.snapshots().await.into_iter().map(Some).collect();
        let latest = self.row.as_ref().and_then(|r| r.snapshot.clone());
        if let Some(l) = &latest {
            candidates.retain(|c| c.as_ref() != Some(l));
            candidates.insert(0, Some(l.clone()));
        }
        candidates.push(None);
        let mut failures = Vec::new();
        let mut started = None;
        for candidate in candidates {
            let (sandbox, events, receipt) = self
                .owner
                .inner
                .backend
                .start(&self.room_id, &self.deps().cfg.limits())
                .await
                .map_err(|e| {
                    tracing::error!(room = %self.room_id, error = %e, "sandbox start failed");
                    SandboxError::Start
                })?;
            let Some(name) = &candidate else {
                started = Some((sandbox, events, receipt, candidate));
                break;
            };
            let path = self.snapshot_dir().join(name);
            let restored = match tokio::fs::File::open(&path).await {
                Ok(mut f) => sandbox
                    .restore(&mut f, SNAPSHOT_WITHIN)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match restored {
                Ok(()) => {
                    started = Some((sandbox, events, receipt, candidate));
                    break;
                }
                Err(e) => {
                    tracing::error!(room = %self.room_id, snapshot = %name, error = %e, "cannot restore the snapshot");
                    failures.push(json!({ "snapshot": name, "error": e }));
                    sandbox.kill();
                    // Its cgroup is removed before the next attempt creates it again.
                    let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
                }
            }
        }
        let Some((sandbox, events, receipt, snapshot)) = started else {
            return Err(SandboxError::Start);
        };
        self.generation = self
            .owner
            .inner
            .next_generation
            .fetch_add(1, Ordering::Relaxed);
        let generation = self.generation;
        let now = now_ms();
        let stop_at = self.hub.viewers.is_empty().then(|| now + self.idle_ms());
        // The snapshot actually restored (an older one, or none, when the latest failed).
        let resumed_from = snapshot.as_deref().and_then(snapshot_time);
        let row = SandboxRow {
            state: "running".into(),
            reason: reason.to_owned(),
            receipt: serde_json::to_string(&receipt).unwrap_or_default(),
            snapshot_at: resumed_from,
            snapshot: snapshot.clone(),
            stop_at,
        };
        let details = json!({
            "reason": reason,
            "resumed_from": snapshot,
            "restore_failures": failures,
            "receipt": receipt,
        });
        if let Err(e) = self
            .transition("sandbox_start", "system", details, row)
            .await
        {
            sandbox.kill();
            return Err(e);
        }
        self.last_armed = stop_at;
        if let Some(me) = self.me.upgrade() {
            let rate = self.deps().cfg.terminal_output_bytes_per_s.max(1024);
            tokio::spawn(pump(events, generation, rate, me.clone()));
            let watched = sandbox.clone();
            tokio::spawn(async move {
                let how = watched.ended().await;
                let _ = me.send(Cmd::Ended { generation, how }).await;
            });
        }
        tracing::info!(room = %self.room_id, tier = %receipt.tier, "sandbox running");
        let sync = Some(self.start_sync(&sandbox));
        self.life = Life::Running {
            sandbox: sandbox.clone(),
            generation,
            receipt: Box::new(receipt),
            resumed_from,
            sync,
        };
        self.hub.pty_open = false;
        self.broadcast_event(json!({ "type": "sandbox", "state": "running" }));
        Ok(sandbox)
    }

    /// Starts the document <-> workspace sync of a running sandbox.
    fn start_sync(&self, sandbox: &Sandbox) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let cancel = CancellationToken::new();
        let task = tokio::spawn(crate::sandbox::filesync::run(
            crate::sandbox::filesync::SyncCtx {
                rooms: self.deps().rooms.clone(),
                limits: self.deps().limits.clone(),
                room_id: self.room_id.clone(),
                sandbox: sandbox.clone(),
                cancel: cancel.clone(),
            },
        ));
        (cancel, task)
    }

    fn idle_ms(&self) -> i64 {
        i64::try_from(self.deps().cfg.sandbox_idle_ms).unwrap_or(i64::MAX / 2)
    }

    fn snapshot_dir(&self) -> PathBuf {
        self.deps()
            .data_dir
            .join("rooms")
            .join(&self.room_id)
            .join("workspace")
    }

    /// Records a lifecycle transition and the new row in one transaction.
    async fn transition(
        &mut self,
        action: &str,
        actor: &str,
        details: Value,
        row: SandboxRow,
    ) -> Result<(), SandboxError> {
        self.deps()
            .audit
            .record(
                &self.room_id,
                actor,
                action,
                "allow",
                "",
                details,
                Change::SandboxState {
                    room_id: self.room_id.clone(),
                    row: row.clone(),
                },
            )
            .await?;
        self.row = Some(row);
        Ok(())
    }

    /// Snapshots the workspace and stops the sandbox. A failed snapshot keeps it running
    /// (nothing is lost), except at server shutdown, where the previous snapshot stands.
    async fn stop(
        &mut self,
        actor: &str,
        reason: &str,
        state: &str,
        force: bool,
    ) -> Result<(), SandboxError> {
        let Life::Running {
            sandbox,
            receipt,
            sync,
            ..
        } = &mut self.life
        else {
            return Ok(());
        };
        let (sandbox, receipt) = (sandbox.clone(), receipt.clone());
        // The sync writes the last document edits to disk as it stops: the snapshot has them.
        if let Some((cancel, task)) = sync.take() {
            cancel.cancel();
            let _ = tokio::time::timeout(SYNC_STOP_WITHIN, task).await;
        }
        let snap = self.take_snapshot(&sandbox).await;
        let (snapshot, snapshot_at, bytes) = match snap {
            // A snapshot's time is the one in its name, everywhere it is shown.
            Ok((name, bytes)) => {
                let at = snapshot_time(&name).unwrap_or_else(now_ms);
                (Some(name), Some(at), bytes)
            }
            Err(e) if force => {
                tracing::error!(room = %self.room_id, error = %e, "snapshot failed; stopping anyway, the previous snapshot stands");
                (
                    self.row.as_ref().and_then(|r| r.snapshot.clone()),
                    self.row.as_ref().and_then(|r| r.snapshot_at),
                    0,
                )
            }
            Err(e) => {
                tracing::error!(room = %self.room_id, error = %e, "snapshot failed; the sandbox keeps running");
                let restarted = self.start_sync(&sandbox);
                if let Life::Running { sync, .. } = &mut self.life {
                    *sync = Some(restarted);
                }
                return Err(e);
            }
        };
        sandbox.kill();
        let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
        self.life = Life::Dormant;
        self.hub.pty_open = false;
        let row = SandboxRow {
            state: state.to_owned(),
            reason: reason.to_owned(),
            receipt: serde_json::to_string(&receipt).unwrap_or_default(),
            snapshot: snapshot.clone(),
            snapshot_at,
            // A suspended sandbox keeps its idle timer: it fires after the restart.
            stop_at: if state == "suspended" {
                self.row.as_ref().and_then(|r| r.stop_at)
            } else {
                None
            },
        };
        let details = json!({
            "reason": reason,
            "snapshot": snapshot,
            "snapshot_bytes": bytes,
            "receipt": receipt,
        });
        self.transition("sandbox_stop", actor, details, row).await?;
        self.last_armed = self.row.as_ref().and_then(|r| r.stop_at);
        self.prune_snapshots().await;
        self.broadcast_event(json!({ "type": "sandbox", "state": state, "reason": reason }));
        Ok(())
    }

    /// A snapshot while running, so a crash of the server loses at most this period of the
    /// workspace (the document loses nothing). Not a lifecycle transition: no audit record.
    async fn periodic_snapshot(&mut self) {
        let Life::Running { sandbox, .. } = &self.life else {
            return;
        };
        let sandbox = sandbox.clone();
        match self.take_snapshot(&sandbox).await {
            Ok((name, _)) => {
                let at = snapshot_time(&name).unwrap_or_else(now_ms);
                match self
                    .deps()
                    .store
                    .set_snapshot(&self.room_id, &name, at)
                    .await
                {
                    Ok(()) => {
                        if let Some(r) = self.row.as_mut() {
                            r.snapshot = Some(name);
                            r.snapshot_at = Some(at);
                        }
                        self.prune_snapshots().await;
                    }
                    Err(e) => {
                        tracing::warn!(room = %self.room_id, error = %e, "cannot record the snapshot")
                    }
                }
            }
            Err(e) => tracing::warn!(room = %self.room_id, error = %e, "periodic snapshot failed"),
        }
    }

    async fn take_snapshot(&self, sandbox: &Sandbox) -> Result<(String, u64), SandboxError> {
        let dir = self.snapshot_dir();
        let io = |e: std::io::Error| SandboxError::Store(StoreError::Io(e));
        tokio::fs::create_dir_all(&dir).await.map_err(io)?;
        let name = format!("{SNAPSHOT_PREFIX}{:013}{SNAPSHOT_SUFFIX}", now_ms());
        let partial = dir.join(format!("{name}.partial"));
        let mut file = tokio::fs::File::create(&partial).await.map_err(io)?;
        // Tar headers add to the workspace's size; twice the quota bounds any honest archive.
        let max = self.deps().cfg.limits().workspace_bytes * 2 + (16 << 20);
        let result = sandbox.snapshot(&mut file, max, SNAPSHOT_WITHIN).await;
        let bytes = match result {
            Ok(b) => b,
            Err(e) => {
                drop(file);
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(e.into());
            }
        };
        use tokio::io::AsyncWriteExt;
        file.flush().await.map_err(io)?;
        file.sync_all().await.map_err(io)?;
        drop(file);
        tokio::fs::rename(&partial, dir.join(&name))
            .await
            .map_err(io)?;
        if let Ok(d) = tokio::fs::File::open(&dir).await {
            let _ = d.sync_all().await;
        }
        Ok((name, bytes))
    }

    /// The room's snapshot files, newest first.
    async fn snapshots(&self) -> Vec<String> {
        let Ok(mut rd) = tokio::fs::read_dir(self.snapshot_dir()).await else {
            return Vec::new();
        };
        let mut names = Vec::new();
        while let Ok(Some(e)) = rd.next_entry().await {
            let name = e.file_name().to_string_lossy().into_owned();
            if snapshot_time(&name).is_some() {
                names.push(name);
            }
        }
        names.sort();
        names.reverse();
        names
    }

    async fn prune_snapshots(&self) {
        let dir = self.snapshot_dir();
        let mut names = self.snapshots().await;
        names.reverse();
        let current = self.row.as_ref().and_then(|r| r.snapshot.clone());
        let keep_from = names.len().saturating_sub(KEEP_SNAPSHOTS);
        for (i, name) in names.iter().enumerate() {
            if i < keep_from && Some(name) != current.as_ref() {
                let _ = tokio::fs::remove_file(dir.join(name)).await;
            }
        }
    }

    async fn ended(&mut self, generation: u64, how: Ended) {
        let Life::Running {
            generation: current,
            receipt,
            sync,
            ..
        } = &self.life
        else {
            return;
        };
        if *current != generation {
            return;
        }
        if let Some((cancel, _)) = sync {
            cancel.cancel();
        }
        let receipt = receipt.clone();
        let reason = match how {
            Ended::Stopped => "stopped".to_owned(),
            Ended::Died { reason } => reason,
            Ended::ProtocolViolation(v) => format!("the agent broke the protocol: {v}"),
        };
        tracing::warn!(room = %self.room_id, %reason, "sandbox failed");
        self.life = Life::Failed(reason.clone());
        self.hub.pty_open = false;
        let row = SandboxRow {
            state: "failed".into(),
            reason: reason.clone(),
            receipt: serde_json::to_string(&receipt).unwrap_or_default(),
            snapshot: self.row.as_ref().and_then(|r| r.snapshot.clone()),
            snapshot_at: self.row.as_ref().and_then(|r| r.snapshot_at),
            stop_at: None,
        };
        let details = json!({ "reason": reason, "receipt": receipt });
        if let Err(e) = self
            .transition("sandbox_failed", "system", details, row)
            .await
        {
            tracing::error!(room = %self.room_id, error = %e, "cannot record the sandbox failure");
        }
        self.last_armed = None;
        self.broadcast_event(json!({
            "type": "exit",
            "reason": reason,
            "restart": format!("POST /api/rooms/{}/sandbox/start", self.room_id),
        }));
    }

    async fn idle_due(&mut self) {
        let row = match self.deps().store.sandbox(&self.room_id).await {
            Ok(Some(r)) => r,
            _ => return,
        };
        let now = now_ms();
        match row.stop_at {
            Some(at) if at <= now => {}
            _ => return,
        }
        if !self.hub.viewers.is_empty() {
            self.arm(None).await;
            return;
        }
        self.row = Some(row);
        let reason = "idle: no terminal and no operation for the idle period";
        match self.life {
            Life::Running { .. } => {
                // A sandbox whose snapshots keep failing (a wedged agent) is stopped anyway at
                // the third attempt: the previous snapshot and the document stand.
                let force = self.failed_idle_stops >= IDLE_STOP_ATTEMPTS - 1;
                match self.stop("system", reason, "stopped", force).await {
                    Ok(()) => self.failed_idle_stops = 0,
                    Err(e) => {
                        self.failed_idle_stops += 1;
                        tracing::error!(room = %self.room_id, error = %e, "idle stop failed");
                        // Try again after another idle period rather than every poll.
                        let next = now + self.idle_ms();
                        self.arm(Some(next)).await;
                    }
                }
            }
            Life::Dormant | Life::Failed(_) => {
                // Not running here: suspended at a shutdown, or lost with a crashed server.
                // The timer still ends its life as a recorded stop.
                let Some(mut row) = self.row.clone() else {
                    return;
                };
                row.state = if matches!(self.life, Life::Failed(_)) {
                    "failed".into()
                } else {
                    "stopped".into()
                };
                row.reason = format!("{reason} (the timer fired after a server restart)");
                row.stop_at = None;
                let details = json!({
                    "reason": row.reason,
                    "snapshot": row.snapshot,
                    "receipt": serde_json::from_str::<Value>(&row.receipt).unwrap_or(Value::Null),
                });
                if let Err(e) = self
                    .transition("sandbox_stop", "system", details, row)
                    .await
                {
                    tracing::error!(room = %self.room_id, error = %e, "cannot record the idle stop");
                }
                self.last_armed = None;
            }
        }
    }

    /// Sets the durable idle timer (or clears it).
    async fn arm(&mut self, stop_at: Option<i64>) {
        if self.last_armed == stop_at {
            return;
        }
        match self
            .deps()
            .store
            .set_idle_timer(&self.room_id, stop_at)
            .await
        {
            Ok(()) => {
                self.last_armed = stop_at;
                if let Some(r) = self.row.as_mut() {
                    r.stop_at = stop_at;
                }
            }
            Err(e) => tracing::warn!(room = %self.room_id, error = %e, "cannot arm the idle timer"),
        }
    }

    /// Activity: pushes the idle timer back (only while nobody watches the terminal).
    async fn touch(&mut self) {
        if !matches!(self.life, Life::Running { .. }) {
            return;
        }
        if !self.hub.viewers.is_empty() {
            self.arm(None).await;
            return;
        }
        let next = now_ms() + self.idle_ms();
        if self.last_armed.is_none_or(|at| next - at >= REARM_EVERY_MS) {
            self.arm(Some(next)).await;
        }
    }

    async fn open_pty(&mut self) -> Result<(), SandboxError> {
        let Life::Running { sandbox, .. } = &self.life else {
            return Ok(());
        };
        if self.hub.pty_open {
            return Ok(());
        }
        let (cols, rows) = self.hub.size;
        let shell = vec!["/bin/bash".to_owned(), "-i".to_owned()];
        match sandbox
            .call(
                Op::PtyOpen {
                    argv: shell,
                    cols,
                    rows,
                },
                Duration::from_secs(10),
            )
            .await
        {
            Ok(_) => {}
            // bash may be absent from a custom rootfs.
            Err(CallError::Agent(_)) => {
                sandbox
                    .call(
                        Op::PtyOpen {
                            argv: vec!["/bin/sh".into()],
                            cols,
                            rows,
                        },
                        Duration::from_secs(10),
                    )
                    .await?;
            }
            Err(e) => return Err(e.into()),
        }
        self.hub.pty_open = true;
        Ok(())
    }

    async fn join(&mut self, cols: u16, rows: u16) -> Result<Joined, SandboxError> {
        let mut events = Vec::new();
        match self.ensure_running("terminal opened").await {
            Ok(_) => {
                if self.hub.viewers.is_empty() {
                    self.hub.size = (cols, rows);
                }
                self.open_pty().await?;
                events.push(json!({ "type": "sandbox", "state": "running" }).to_string());
            }
            Err(SandboxError::Failed(reason)) => {
                events.push(
                    json!({
                        "type": "exit",
                        "reason": reason,
                        "restart": format!("POST /api/rooms/{}/sandbox/start", self.room_id),
                    })
                    .to_string(),
                );
            }
            Err(e) => return Err(e),
        }
        let viewer = self.hub.next_viewer;
        self.hub.next_viewer += 1;
        let (tx, rx) = mpsc::channel(VIEWER_QUEUE);
        self.hub.viewers.insert(viewer, tx);
        self.arm(None).await;
        Ok(Joined {
            viewer,
            scrollback: self.hub.scrollback.iter().copied().collect(),
            events,
            rx,
        })
    }

    async fn input(&mut self, viewer: u64, user_id: &str, data: Vec<u8>) {
        if !matches!(self.life, Life::Running { .. }) {
            let reason = match &self.life {
                Life::Failed(r) => format!("the sandbox failed: {r}"),
                _ => "the sandbox is not running".to_owned(),
            };
            if let Some(tx) = self.hub.viewers.get(&viewer) {
                let _ = tx.try_send(TermOut::Event(
                    json!({ "type": "error", "reason": reason }).to_string(),
                ));
            }
            return;
        }
        if !self.hub.pty_open {
            if let Err(e) = self.open_pty().await {
                tracing::warn!(room = %self.room_id, error = %e, "cannot reopen the terminal");
                return;
            }
        }
        self.recorder.input(user_id, &data);
        if let Life::Running { sandbox, .. } = &self.life {
            let _ = sandbox
                .send(Op::PtyInput(serde_bytes::ByteBuf::from(data)))
                .await;
        }
    }

    fn output(&mut self, data: Vec<u8>) {
        let cap = self.deps().cfg.terminal_scrollback_bytes;
        self.hub.scrollback.extend(data.iter().copied());
        let excess = self.hub.scrollback.len().saturating_sub(cap);
        self.hub.scrollback.drain(..excess);
        self.recorder.output(&data, self.hub.size);
        let bytes = Bytes::from(data);
        self.hub.viewers.retain(|_, tx| {
            match tx.try_send(TermOut::Output(bytes.clone())) {
                Ok(()) => true,
                // Too far behind: dropped; it reconnects and catches up from the scrollback.
                Err(mpsc::error::TrySendError::Full(_)) => false,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// Tells every viewer who is typing (the people panel shows it), at most once a second per
    /// typist.
    fn announce_typing(&mut self, user_id: &str, email: &str) {
        let now = tokio::time::Instant::now();
        if let Some(last) = self.hub.typists.get(user_id) {
            if now.duration_since(*last) < TYPING_EVERY {
                return;
            }
        }
        self.hub
            .typists
            .retain(|_, t| now.duration_since(*t) < TYPING_EVERY);
        self.hub.typists.insert(user_id.to_owned(), now);
        self.broadcast_event(json!({ "type": "typing", "user_id": user_id, "email": email }));
    }

    fn broadcast_event(&mut self, event: Value) {
        let text = event.to_string();
        self.hub
            .viewers
            .retain(|_, tx| tx.try_send(TermOut::Event(text.clone())).is_ok());
    }
}

const SNAPSHOT_PREFIX: &str = "snapshot-";
const SNAPSHOT_SUFFIX: &str = ".tar";

/// When a snapshot file was taken (Unix ms), from its name; `None` for any other file.
fn snapshot_time(name: &str) -> Option<i64> {
    name.strip_prefix(SNAPSHOT_PREFIX)?
        .strip_suffix(SNAPSHOT_SUFFIX)?
        .parse()
        .ok()
}

/// Forwards the sandbox's events to its supervisor at no more than `rate` bytes of terminal
/// output per second. Slowing down here fills the agent's queue and then the PTY, so a program
/// that writes without end is slowed, never buffered. While the supervisor is busy for long (a
/// snapshot), output is dropped here instead of held up: the agent's stream, which also carries
/// the snapshot, never waits on the supervisor for more than [`PUMP_STALL`].
async fn pump(
    mut events: mpsc::Receiver<Event>,
    generation: u64,
    rate: u64,
    tx: mpsc::Sender<Cmd>,
) {
    let rate = rate as f64;
    // A burst of a tenth of a second: a screenful passes at once, a flood is paced from the
    // start (so viewers' queues never see a second's worth at once).
    let burst = (rate / 10.0).max(64.0 * 1024.0);
    let mut tokens = burst;
    let mut last = tokio::time::Instant::now();
    let mut pending: VecDeque<u8> = VecDeque::new();
    let mut exit: Option<Option<i32>> = None;
    let mut closed = false;
    loop {
        if closed && pending.is_empty() && exit.is_none() {
            break;
        }
        let full = pending.len() >= PUMP_PENDING;
        tokio::select! {
            biased;
            permit = tx.reserve(), if !pending.is_empty() || exit.is_some() => {
                let Ok(permit) = permit else { break };
                if pending.is_empty() {
                    if let Some(code) = exit.take() {
                        permit.send(Cmd::PtyExit { generation, code });
                    }
                } else {
                    let n = pending.len().min(coderoom_sandbox::proto::MAX_PTY_CHUNK);
                    let data: Vec<u8> = pending.drain(..n).collect();
                    permit.send(Cmd::Output { generation, data });
                }
            }
            // The supervisor has taken nothing for a while (it is taking a snapshot): the
            // oldest half of what waits is dropped and reading goes on, so the agent's stream
            // never stalls behind it.
            () = tokio::time::sleep(PUMP_STALL), if full => {
                let n = pending.len() / 2;
                pending.drain(..n);
            }
            ev = events.recv(), if !closed && !full => match ev {
                None => closed = true,
                Some(Event::PtyOutput(data)) => {
                    let now = tokio::time::Instant::now();
                    tokens = (tokens + now.duration_since(last).as_secs_f64() * rate).min(burst);
                    last = now;
                    tokens -= data.len() as f64;
                    if tokens < 0.0 {
                        tokio::time::sleep(Duration::from_secs_f64(-tokens / rate)).await;
                    }
                    pending.extend(data);
                }
                Some(Event::PtyExit { code }) => exit = Some(code),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output beyond the rate waits at the source: 10 MiB at 1 MiB/s take ~9.9 s (a tenth of a
    /// second of burst), measured on the paused test clock.
    #[tokio::test(start_paused = true)]
    async fn terminal_output_is_held_to_its_rate() {
        let (ev_tx, ev_rx) = mpsc::channel(4);
        let (tx, mut rx) = mpsc::channel(4);
        tokio::spawn(pump(ev_rx, 7, 1 << 20, tx));
        let started = tokio::time::Instant::now();
        tokio::spawn(async move {
            for _ in 0..10 {
                ev_tx
                    .send(Event::PtyOutput(vec![b'x'; 1 << 20]))
                    .await
                    .unwrap();
            }
        });
        let mut bytes = 0;
        while bytes < 10 << 20 {
            match rx.recv().await {
                Some(Cmd::Output {
                    generation: 7,
                    data,
                }) => bytes += data.len(),
                Some(_) => panic!("unexpected command"),
                None => panic!("the pump ended after {bytes} bytes"),
            }
        }
        let took = started.elapsed().as_secs_f64();
        assert!((9.8..10.1).contains(&took), "{took}");
    }

    /// A supervisor that takes nothing (busy with a snapshot) never stops the pump from
    /// reading the agent's events: output is dropped instead.
    #[tokio::test(start_paused = true)]
    async fn a_busy_supervisor_never_stalls_the_agent_stream() {
        let (ev_tx, ev_rx) = mpsc::channel(4);
        let (tx, _rx_never_read) = mpsc::channel(4);
        tokio::spawn(pump(ev_rx, 1, 1 << 30, tx));
        let sent = tokio::time::timeout(Duration::from_secs(30), async {
            for _ in 0..200 {
                ev_tx
                    .send(Event::PtyOutput(vec![b'x'; 64 << 10]))
                    .await
                    .unwrap();
            }
        })
        .await;
        assert!(sent.is_ok(), "the pump stopped reading events");
    }

    #[test]
    fn snapshot_files_are_told_by_name() {
        assert_eq!(
            snapshot_time("snapshot-1795961758998.tar"),
            Some(1_795_961_758_998)
        );
        assert_eq!(snapshot_time("snapshot-1795961758998.tar.partial"), None);
        assert_eq!(snapshot_time("notes.tar"), None);
    }
}

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
use crate::close::CloseCode;
use crate::config::SandboxArgs;
use crate::sandbox::snapshots::{self, Meta, Snapshots};
use crate::store::{Change, SandboxRow, SandboxState, Store, StoreError};
use crate::terminal::hub::{pty_port, pump, HubConfig};
use crate::terminal::{Hub, Joined, Link, Recorder, TermEvent};
use coderoom_sandbox::proto::{AgentError, Op, Reply};
use coderoom_sandbox::{Backend, CallError, Ended, Receipt, Sandbox};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Requests queued for one room's supervisor before callers wait.
const ACTOR_QUEUE: usize = 256;
/// Time the sandbox gets to end after being killed.
const KILL_WITHIN: Duration = Duration::from_secs(10);
/// Time a stopping sandbox gets to be kept (a VM's memory is written out under software
/// emulation too), per step.
const PARK_WITHIN: Duration = Duration::from_secs(150);
/// Time a connection to a port inside may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// Time the agent has to take the room's egress settings.
const EGRESS_WITHIN: Duration = Duration::from_secs(10);
/// Time the file sync gets to write pending edits before a snapshot.
const SYNC_STOP_WITHIN: Duration = Duration::from_secs(10);
/// How often the idle scheduler looks for due timers.
const IDLE_POLL: Duration = Duration::from_millis(250);
/// The idle timer is re-armed in the database at most this often while operations arrive.
const REARM_EVERY_MS: i64 = 1000;
/// Idle stops whose snapshot fails before the sandbox is stopped without one.
const IDLE_STOP_ATTEMPTS: u32 = 3;
/// Attempts at reaching a supervisor that is exiting at that moment.
const SEND_ATTEMPTS: usize = 3;

/// Why a snapshot did not restore. The messages are stable: the details, which may come from
/// inside the sandbox, go to the log only.
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    #[error("the snapshot file cannot be read")]
    File(std::io::Error),
    #[error("the sandbox did not unpack the snapshot")]
    Sandbox(CallError),
}

/// A room's sandbox as `GET /api/rooms/{id}/sandbox` (and the room's manifest) show it.
#[derive(Debug, Serialize)]
pub(crate) struct SandboxStatus {
    tier: &'static str,
    /// Why this tier was chosen.
    tier_reason: String,
    state: SandboxState,
    reason: String,
    limits: coderoom_sandbox::Limits,
    /// The receipt of the last start: what the sandbox was given.
    receipt: Option<Value>,
    /// When the latest workspace snapshot was taken (Unix ms).
    snapshot_at: Option<i64>,
    /// Running on a workspace restored from the snapshot taken at this time.
    resumed_from: Option<i64>,
    /// When the idle timer stops it.
    idle_stop_at: Option<i64>,
    /// Limits the sandbox ran into, while it runs.
    usage: Option<Usage>,
    /// The workspace's text files in the document, and those left out past the cap.
    file_sync: FileSync,
    /// The room's readiness step in the running sandbox.
    readiness: Readiness,
    /// The running sandbox was started ahead of need, in the warm pool.
    from_warm_pool: bool,
}

/// Where the room's readiness step (its manifest's command, run after every start or resume)
/// is, for the running sandbox. The room is usable throughout; "ready" says the workspace is
/// prepared.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Readiness {
    /// No sandbox runs, or the room has no readiness command.
    #[default]
    None,
    Preparing {
        command: String,
        since: i64,
    },
    /// `skipped`: the workspace was restored from one in which the command had completed.
    Ready {
        command: String,
        at: i64,
        skipped: bool,
    },
    /// The command failed: its exit code (none when it was killed or timed out) and the end of
    /// its output.
    Failed {
        command: String,
        at: i64,
        exit_code: Option<i32>,
        timed_out: bool,
        output: String,
    },
}

/// Longest a readiness command may run.
const READINESS_MS: u64 = 10 * 60 * 1000;
/// How much of a failed readiness command's output is kept (its end).
const READINESS_OUTPUT: usize = 8 << 10;

impl SandboxStatus {
    /// Whether the sandbox runs (its workspace may change at any moment).
    pub(crate) fn running(&self) -> bool {
        self.state == SandboxState::Running
    }

    /// When its latest workspace snapshot was taken.
    pub(crate) fn snapshot_at(&self) -> Option<i64> {
        self.snapshot_at
    }

    /// For someone who may not run commands: where the readiness step is, without the command
    /// line or its output (either may hold what only those who run code should see).
    pub(crate) fn without_readiness_details(mut self) -> Self {
        match &mut self.readiness {
            Readiness::None => {}
            Readiness::Preparing { command, .. } | Readiness::Ready { command, .. } => {
                command.clear();
            }
            Readiness::Failed {
                command, output, ..
            } => {
                command.clear();
                output.clear();
            }
        }
        self
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct FileSync {
    files: usize,
    cap: usize,
    not_mirrored: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct Usage {
    oom_kills: u64,
    forks_refused: u64,
}

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
    /// The room's sandbox is not running (and the caller would not start it).
    #[error("the room's sandbox is stopped")]
    Stopped,
    /// The room's document could not be read or rewritten (a checkpoint, a rollback).
    #[error("the room's document: {0}")]
    Document(#[from] crate::room::visit::VisitError),
    /// The room's budget of sandbox seconds is used up.
    #[error("{0}")]
    Budget(crate::spend::Exhausted),
}

enum Cmd {
    Op {
        op: Op,
        within: Duration,
        /// Only where the sandbox runs already, and not counted as use (the idle timer is
        /// left alone): a look that must neither start nor keep alive a sandbox.
        peek: bool,
        reply: oneshot::Sender<Result<Reply, SandboxError>>,
    },
    Status {
        reply: oneshot::Sender<SandboxStatus>,
    },
    Stop {
        actor: String,
        /// Why, for the room (`None`: "stop requested by ACTOR").
        why: Option<String>,
        reply: oneshot::Sender<Result<SandboxStatus, SandboxError>>,
    },
    /// An event for everyone watching the room's terminal.
    Notice {
        event: TermEvent,
        done: oneshot::Sender<()>,
    },
    Start {
        actor: String,
        reply: oneshot::Sender<Result<SandboxStatus, SandboxError>>,
    },
    Join {
        cols: u16,
        rows: u16,
        /// The viewer may start a sandbox that is not running (decided by the caller).
        start: bool,
        reply: oneshot::Sender<Result<(Hub, Joined), SandboxError>>,
    },
    /// A viewer left the hub: the idle timer may start.
    Left,
    Ended {
        generation: u64,
        how: Ended,
    },
    IdleDue,
    /// The room is held by another server now: the sandbox here ends, and nothing is written
    /// to the room's shared sandbox record (the server holding the room owns it; a sandbox it
    /// started meanwhile must not be recorded stopped).
    Abandon {
        why: String,
    },
    Suspend {
        reply: oneshot::Sender<()>,
    },
    Destroy {
        reply: oneshot::Sender<Destroyed>,
    },
    /// Writes the workspace as it is to `dest` (a checkpoint's archive).
    Archive {
        dest: PathBuf,
        reply: oneshot::Sender<Result<(u64, Meta), SandboxError>>,
    },
    /// The readiness command of sandbox `generation` ended.
    Prepared {
        generation: u64,
        command: String,
        outcome: Result<Reply, SandboxError>,
    },
    /// Restores a checkpoint: the document and the workspace.
    Rewind(Arc<Rewind>, oneshot::Sender<Result<(), SandboxError>>),
    /// The room's secrets changed: a running sandbox gets the new placeholders.
    Egress,
    /// Opens a connection to a port inside (a preview): `start` starts a stopped sandbox.
    Connect {
        port: u16,
        start: bool,
        reply: oneshot::Sender<Result<tokio::io::DuplexStream, SandboxError>>,
    },
    /// Gives a new room (a fork) its first workspace: `archive`, described by `meta`.
    Seed {
        archive: PathBuf,
        meta: Arc<Meta>,
        reply: oneshot::Sender<Result<(), SandboxError>>,
    },
}

/// A checkpoint to restore, and who asked.
pub(crate) struct Rewind {
    /// The checkpoint's workspace archive.
    pub archive: PathBuf,
    /// Its text files (path -> text): the document is made to read them.
    pub texts: std::collections::BTreeMap<String, String>,
    /// Who restores it (user id, shown name): the document's change is theirs.
    pub who: (String, String),
    /// What the terminal and the sandbox's reason say (`checkpoint "NAME"`).
    pub what: String,
    /// What the server knew of the checkpoint's workspace when it was archived.
    pub meta: Meta,
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
    /// The time of day for the terminal's recording.
    pub clock: crate::clock::Clock,
    /// Started sandboxes waiting in the warm pool (a metric).
    pub pool_ready: prometheus_client::metrics::gauge::Gauge,
    /// Takes the connections code inside opens to the outside.
    pub egress: crate::egress::Egress,
    /// Sandbox time is metered; a room out of it does not start.
    pub spend: crate::spend::Spend,
    /// This server, as room leases name it: a room another live server holds is that server's
    /// to stop when it idles.
    pub server_id: String,
}

struct Inner {
    backend: Backend,
    /// Why this tier was chosen (`--sandbox-tier auto` says what it found), for the panel.
    tier_reason: String,
    deps: Deps,
    supervisors: crate::registry::Registry<Cmd>,
    /// Numbers each sandbox a supervisor starts, so events of an old one are told apart.
    next_generation: AtomicU64,
    /// The warm pool: started sandboxes no room has had, each given to one room once.
    pool: std::sync::Mutex<Vec<coderoom_sandbox::Started>>,
    /// Told when a pooled sandbox is taken (time to start another).
    pool_taken: tokio::sync::Notify,
}

/// Most sandboxes the warm pool holds, whatever `--sandbox-warm-pool` says.
const MAX_WARM_POOL: usize = 16;

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
                pool: std::sync::Mutex::default(),
                pool_taken: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Keeps `--sandbox-warm-pool` sandboxes started and unassigned until shutdown, when the
    /// unassigned ones are killed.
    pub(crate) fn start_warm_pool(&self) {
        let size = self.inner.deps.cfg.sandbox_warm_pool.min(MAX_WARM_POOL);
        if size == 0 || matches!(self.inner.backend, Backend::None(_)) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let inner = &this.inner;
            let shutdown = inner.deps.shutdown.clone();
            let mut made = 0u64;
            while !shutdown.is_cancelled() {
                let have = inner.pool.lock().unwrap_or_else(|e| e.into_inner()).len();
                if have < size {
                    made += 1;
                    let started = inner
                        .backend
                        .start(&format!("pool{made}"), &inner.deps.cfg.limits())
                        .await;
                    match started {
                        Ok(s) => {
                            let mut pool = inner.pool.lock().unwrap_or_else(|e| e.into_inner());
                            pool.push(s);
                            inner.deps.pool_ready.set(pool.len() as i64);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot start a sandbox for the warm pool");
                            tokio::select! {
                                () = shutdown.cancelled() => {}
                                () = tokio::time::sleep(Duration::from_secs(5)) => {}
                            }
                        }
                    }
                    continue;
                }
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = inner.pool_taken.notified() => {}
                }
            }
            let left = std::mem::take(&mut *inner.pool.lock().unwrap_or_else(|e| e.into_inner()));
            for (sandbox, _, _) in &left {
                sandbox.kill();
            }
            inner.deps.pool_ready.set(0);
        });
    }

    /// A sandbox for `room_id`: one from the warm pool if one is waiting (and still alive),
    /// else a new one. Says which.
    /// A sandbox for `room_id`: resumed from what its last stop kept under `tag` (the
    /// snapshot it would restore) when the backend has it, else a warm one from the pool, else
    /// a new one. The flag says it came from the pool.
    async fn take_sandbox(
        &self,
        room_id: &str,
        tag: Option<&str>,
    ) -> Result<(coderoom_sandbox::Started, bool), coderoom_sandbox::StartError> {
        let inner = &self.inner;
        if tag.is_some() && inner.backend.has_kept(room_id) {
            let started = inner
                .backend
                .resume(room_id, &inner.deps.cfg.limits(), tag)
                .await?;
            return Ok((started, false));
        }
        loop {
            let pooled = {
                let mut pool = inner.pool.lock().unwrap_or_else(|e| e.into_inner());
                let s = pool.pop();
                inner.deps.pool_ready.set(pool.len() as i64);
                s
            };
            let Some(started) = pooled else { break };
            inner.pool_taken.notify_one();
            if started.0.has_ended() {
                continue;
            }
            return Ok((started, true));
        }
        let started = inner
            .backend
            .start(room_id, &inner.deps.cfg.limits())
            .await?;
        Ok((started, false))
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
                match this
                    .inner
                    .deps
                    .store
                    .due_sandboxes(this.inner.deps.clock.now_ms(), &this.inner.deps.server_id)
                    .await
                {
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
                let (actor, pty_wanted) = Actor::new(room_id.to_owned(), owner, tx.downgrade());
                tokio::spawn(actor.run(rx, pty_wanted, generation));
            })
    }

    /// Tells a running sandbox of the room that its secrets changed (nothing when none runs).
    pub(crate) async fn egress_changed(&self, room_id: &str) {
        if let Some(tx) = self.inner.supervisors.get(room_id) {
            let _ = tx.send(Cmd::Egress).await;
        }
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
        self.run_op(room_id, op, within, false).await
    }

    /// Runs a typed operation where the room's sandbox is running already (else
    /// [`SandboxError::Stopped`]), without counting it as use.
    pub(crate) async fn peek(
        &self,
        room_id: &str,
        op: Op,
        within: Duration,
    ) -> Result<Reply, SandboxError> {
        self.run_op(room_id, op, within, true).await
    }

    async fn run_op(
        &self,
        room_id: &str,
        op: Op,
        within: Duration,
        peek: bool,
    ) -> Result<Reply, SandboxError> {
        let op = Arc::new(op);
        self.ask(room_id, |reply| Cmd::Op {
            op: (*op).clone(),
            within,
            peek,
            reply,
        })
        .await?
    }

    /// A connection to `port` inside the room's sandbox; `start` starts a stopped one first
    /// (a member opening a preview), else a stopped sandbox is an error.
    pub(crate) async fn connect(
        &self,
        room_id: &str,
        port: u16,
        start: bool,
    ) -> Result<tokio::io::DuplexStream, SandboxError> {
        self.ask(room_id, |reply| Cmd::Connect { port, start, reply })
            .await?
    }

    /// `{"tier", "state", "limits", "receipt", ...}` of the room's sandbox.
    pub(crate) async fn status(&self, room_id: &str) -> Result<SandboxStatus, SandboxError> {
        self.ask(room_id, |reply| Cmd::Status { reply }).await
    }

    /// Snapshots and stops the room's sandbox.
    pub(crate) async fn stop(
        &self,
        room_id: &str,
        actor: &str,
    ) -> Result<SandboxStatus, SandboxError> {
        self.ask(room_id, |reply| Cmd::Stop {
            actor: actor.to_owned(),
            why: None,
            reply,
        })
        .await?
    }

    /// Snapshots and stops the room's sandbox for `why` (the room's budget is spent, the room
    /// moved to another server), where it runs.
    pub(crate) async fn stop_because(
        &self,
        room_id: &str,
        actor: &str,
        why: String,
    ) -> Result<SandboxStatus, SandboxError> {
        self.ask(room_id, |reply| Cmd::Stop {
            actor: actor.to_owned(),
            why: Some(why.clone()),
            reply,
        })
        .await?
    }

    /// Ends the room's sandbox here without writing its shared record (see `Cmd::Abandon`).
    pub(crate) async fn abandon(&self, room_id: &str, why: &str) {
        if let Some(tx) = self.inner.supervisors.get(room_id) {
            let _ = tx
                .send(Cmd::Abandon {
                    why: why.to_owned(),
                })
                .await;
        }
    }

    /// Tells everyone watching the room's terminal.
    pub(crate) async fn notice(&self, room_id: &str, event: TermEvent) {
        let _ = self
            .ask(room_id, |done| Cmd::Notice {
                event: event.clone(),
                done,
            })
            .await;
    }

    /// Starts (resumes, or restarts after a failure) the room's sandbox.
    pub(crate) async fn start(
        &self,
        room_id: &str,
        actor: &str,
    ) -> Result<SandboxStatus, SandboxError> {
        self.ask(room_id, |reply| Cmd::Start {
            actor: actor.to_owned(),
            reply,
        })
        .await?
    }

    /// Writes the room's workspace as it is now to `dest`: from the running sandbox, else from
    /// its latest snapshot, else an empty archive. Returns its size, and what the server knows
    /// of it (what it agreed with the document on, the readiness command completed in it).
    pub(crate) async fn archive(
        &self,
        room_id: &str,
        dest: PathBuf,
    ) -> Result<(u64, Meta), SandboxError> {
        self.ask(room_id, |reply| Cmd::Archive {
            dest: dest.clone(),
            reply,
        })
        .await?
    }

    /// Gives a new room (a fork) its first workspace: a copy of `archive`, described by `meta`
    /// (what its document agrees on), resumed from when its sandbox first starts.
    pub(crate) async fn seed(
        &self,
        room_id: &str,
        archive: PathBuf,
        meta: Meta,
    ) -> Result<(), SandboxError> {
        let meta = Arc::new(meta);
        self.ask(room_id, |reply| Cmd::Seed {
            archive: archive.clone(),
            meta: meta.clone(),
            reply,
        })
        .await?
    }

    /// Restores a checkpoint into the room (see [`Actor::rewind`]).
    pub(crate) async fn rewind(&self, room_id: &str, rewind: Rewind) -> Result<(), SandboxError> {
        let rewind = Arc::new(rewind);
        self.ask(room_id, |reply| Cmd::Rewind(rewind.clone(), reply))
            .await?
    }

    /// Joins the terminal (starting the sandbox and its PTY if needed).
    pub(crate) async fn join(
        &self,
        room_id: &str,
        cols: u16,
        rows: u16,
        start: bool,
    ) -> Result<(Hub, Joined), SandboxError> {
        self.ask(room_id, |reply| Cmd::Join {
            cols,
            rows,
            start,
            reply,
        })
        .await?
    }

    /// A viewer left `hub`: it is told first, then the supervisor (which may start the idle
    /// timer).
    pub(crate) async fn leave(&self, room_id: &str, hub: &Hub, viewer: u64) {
        hub.leave(viewer).await;
        self.send(room_id, || Cmd::Left).await;
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
    pub(crate) async fn destroy(&self, room_id: &str) -> Destroyed {
        let tx = self.inner.supervisors.get(room_id);
        let Some(tx) = tx else {
            return Destroyed::default();
        };
        let (reply, rx) = oneshot::channel();
        if tx.send(Cmd::Destroy { reply }).await.is_err() {
            return Destroyed::default();
        }
        rx.await.unwrap_or_default()
    }
}

/// What destroying a room's sandbox destroyed.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Destroyed {
    /// A sandbox was running (and was killed).
    pub(crate) running: bool,
    /// It was a VM, whose workspace disk was removed with it.
    pub(crate) vm_disk: bool,
}

/// What a viewer who may not start the sandbox sees while it is not running.
const NOT_STARTED: &str = "the sandbox is not running: someone who may type starts it";

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

struct Actor {
    room_id: String,
    owner: Sandboxes,
    me: mpsc::WeakSender<Cmd>,
    life: Life,
    row: Option<SandboxRow>,
    generation: u64,
    /// The room's terminal hub (its own task).
    hub: Hub,
    /// Whether the PTY of the running sandbox is open.
    pty_open: bool,
    /// The room's workspace snapshots on disk.
    snapshots: Snapshots,
    /// What the document <-> workspace sync mirrors.
    sync_stats: Arc<crate::sandbox::filesync::SyncStats>,
    /// What the document and the workspace agree on, kept current by the sync; stored with
    /// every snapshot.
    sync_agreed: crate::sandbox::filesync::Digests,
    /// The readiness step of the running sandbox.
    readiness: Readiness,
    /// Whether the running sandbox came from the warm pool.
    from_pool: bool,
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
    /// The supervisor and its hub; the receiver hears when a key needs a PTY.
    fn new(
        room_id: String,
        owner: Sandboxes,
        me: mpsc::WeakSender<Cmd>,
    ) -> (Self, mpsc::Receiver<()>) {
        let deps = &owner.inner.deps;
        let recorder = Recorder::new(
            deps.data_dir
                .join("rooms")
                .join(&room_id)
                .join("recordings"),
            deps.cfg.recording_max_bytes,
        );
        let (pty_wanted, pty_wanted_rx) = mpsc::channel(1);
        let hub = Hub::start(HubConfig {
            scrollback_bytes: deps.cfg.terminal_scrollback_bytes,
            recorder,
            clock: deps.clock.clone(),
            pty_wanted,
        });
        let snapshots = Snapshots::new(
            deps.data_dir.join("rooms").join(&room_id).join("workspace"),
            // Tar headers add to the workspace's size; twice the quota bounds any honest archive.
            deps.cfg.limits().workspace_bytes * 2 + (16 << 20),
            deps.clock.clone(),
        );
        let actor = Actor {
            sync_stats: Arc::default(),
            sync_agreed: Arc::default(),
            readiness: Readiness::None,
            from_pool: false,
            snapshots,
            room_id,
            me,
            life: Life::Dormant,
            row: None,
            generation: 0,
            hub,
            pty_open: false,
            last_armed: None,
            destroyed: false,
            failed_idle_stops: 0,
            owner,
        };
        (actor, pty_wanted_rx)
    }

    fn deps(&self) -> &Deps {
        &self.owner.inner.deps
    }

    /// Gives the sandbox the room's egress authority (its TLS clients trust it) and the
    /// placeholders of the room's secrets. A failure is logged: the sandbox works, and a
    /// request to a secret's host fails its certificate check instead of leaking anything.
    async fn configure_egress(&self, sandbox: &Sandbox) {
        let egress = &self.deps().egress;
        let ca_pem = match egress.authority(&self.room_id) {
            Ok(ca) => ca.pem.clone(),
            Err(e) => {
                tracing::error!(room = %self.room_id, error = %e, "cannot make the room's egress authority");
                String::new()
            }
        };
        let env = egress.room_env(&self.room_id).await;
        if let Err(e) = sandbox
            .call(Op::Egress { ca_pem, env }, EGRESS_WITHIN)
            .await
        {
            tracing::warn!(room = %self.room_id, error = %e, "the sandbox did not take its egress settings");
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Cmd>,
        mut pty_wanted: mpsc::Receiver<()>,
        generation: u64,
    ) {
        match self.deps().store.sandbox(&self.room_id).await {
            Ok(row) => {
                if let Some(r) = &row {
                    if r.state == SandboxState::Failed {
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
                Some(()) = pty_wanted.recv() => {
                    self.reopen_pty().await;
                    continue;
                }
            };
            let Some(cmd) = cmd else { break };
            self.handle(cmd).await;
            let running = matches!(self.life, Life::Running { .. });
            let idle = !running && self.hub.viewers() == 0;
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
            Cmd::Connect { port, start, reply } => {
                let sandbox = match &self.life {
                    Life::Running { sandbox, .. } => Ok(sandbox.clone()),
                    _ if start => self.ensure_running("a preview was opened").await,
                    _ => Err(SandboxError::Stopped),
                };
                let sandbox = match sandbox {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                self.touch().await;
                tokio::spawn(async move {
                    let r = sandbox
                        .connect(port, CONNECT_WITHIN)
                        .await
                        .map_err(SandboxError::from);
                    let _ = reply.send(r);
                });
            }
            Cmd::Op {
                op,
                within,
                peek,
                reply,
            } => {
                let sandbox = match (&self.life, peek) {
                    (Life::Running { sandbox, .. }, true) => Ok(sandbox.clone()),
                    (_, true) => Err(SandboxError::Stopped),
                    (_, false) => self.ensure_running("first use").await,
                };
                let sandbox = match sandbox {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                if !peek {
                    self.touch().await;
                }
                tokio::spawn(async move {
                    let r = sandbox.call(op, within).await.map_err(SandboxError::from);
                    let _ = reply.send(r);
                });
            }
            Cmd::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Cmd::Notice { event, done } => {
                self.hub.event(event).await;
                let _ = done.send(());
            }
            Cmd::Stop { actor, why, reply } => {
                let why = why.unwrap_or_else(|| format!("stop requested by {actor}"));
                let r = self
                    .stop(&actor, &why, SandboxState::Stopped, false)
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
            Cmd::Join {
                cols,
                rows,
                start,
                reply,
            } => self.join(cols, rows, start, reply).await,
            Cmd::Left => self.touch().await,
            Cmd::Egress => {
                if let Life::Running { sandbox, .. } = &self.life {
                    let sandbox = sandbox.clone();
                    self.configure_egress(&sandbox).await;
                }
            }
            Cmd::Ended { generation, how } => self.ended(generation, how).await,
            Cmd::IdleDue => self.idle_due().await,
            Cmd::Abandon { why } => {
                if let Life::Running { sandbox, sync, .. } = &self.life {
                    if let Some((cancel, _)) = sync {
                        cancel.cancel();
                    }
                    sandbox.kill();
                    let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
                    tracing::warn!(room = %self.room_id, %why, "sandbox ended here");
                    let details = json!({ "reason": why, "server": self.deps().server_id });
                    if let Err(e) = self
                        .deps()
                        .audit
                        .record(
                            &self.room_id,
                            "system",
                            "sandbox_abandoned",
                            "allow",
                            "",
                            details,
                            crate::store::Change::None,
                        )
                        .await
                    {
                        tracing::error!(room = %self.room_id, error = %e, "cannot record the abandoned sandbox");
                    }
                }
                self.life = Life::Dormant;
                self.pty_open = false;
                self.hub.link(Link::Down(why)).await;
            }
            Cmd::Suspend { reply } => {
                if let Err(e) = self
                    .stop("system", "server shutdown", SandboxState::Suspended, true)
                    .await
                {
                    tracing::error!(room = %self.room_id, error = %e, "cannot suspend the sandbox");
                }
                let _ = reply.send(());
            }
            Cmd::Archive { dest, reply } => {
                let _ = reply.send(self.archive(&dest).await);
            }
            Cmd::Rewind(rewind, reply) => {
                let _ = reply.send(self.rewind(&rewind).await);
            }
            Cmd::Prepared {
                generation,
                command,
                outcome,
            } => self.prepared(generation, command, outcome).await,
            Cmd::Seed {
                archive,
                meta,
                reply,
            } => {
                let _ = reply.send(self.install_latest(&archive, &meta).await);
            }
            Cmd::Destroy { reply } => {
                let was = Destroyed {
                    running: matches!(self.life, Life::Running { .. }),
                    // A VM's disk goes with it (its watcher removes it before `ended`).
                    vm_disk: matches!(&self.life, Life::Running { receipt, .. } if receipt.vm.is_some()),
                };
                if let Life::Running { sandbox, sync, .. } = &self.life {
                    if let Some((cancel, _)) = sync {
                        cancel.cancel();
                    }
                    sandbox.kill();
                    let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
                }
                self.life = Life::Dormant;
                self.pty_open = false;
                self.hub.link(Link::Down("room deleted".into())).await;
                self.hub.close_all(CloseCode::Deleted).await;
                self.destroyed = true;
                let _ = reply.send(was);
            }
        }
    }

    fn status(&self) -> SandboxStatus {
        let (state, reason) = match &self.life {
            Life::Running { .. } => (SandboxState::Running, self.row_reason()),
            Life::Failed(r) => (SandboxState::Failed, r.clone()),
            Life::Dormant => match &self.row {
                None => (SandboxState::Absent, String::new()),
                // A row left `running` by a crash is a sandbox that is not running now.
                Some(r) if r.state == SandboxState::Running => {
                    (SandboxState::Suspended, r.reason.clone())
                }
                Some(r) => (r.state, r.reason.clone()),
            },
        };
        let receipt = match &self.life {
            Life::Running { receipt, .. } => serde_json::to_value(receipt).ok(),
            _ => self
                .row
                .as_ref()
                .and_then(|r| serde_json::from_str(&r.receipt).ok()),
        };
        let usage = match &self.life {
            Life::Running { sandbox, .. } => {
                let p = sandbox.pressure();
                Some(Usage {
                    oom_kills: p.oom_kills,
                    forks_refused: p.pids_refused,
                })
            }
            _ => None,
        };
        SandboxStatus {
            tier: self.owner.tier(),
            tier_reason: self.owner.inner.tier_reason.clone(),
            state,
            reason,
            limits: self.deps().cfg.limits(),
            receipt,
            snapshot_at: self.row.as_ref().and_then(|r| r.snapshot_at),
            resumed_from: match &self.life {
                Life::Running { resumed_from, .. } => *resumed_from,
                _ => None,
            },
            idle_stop_at: self.row.as_ref().and_then(|r| r.stop_at),
            usage,
            file_sync: {
                let (files, not_mirrored) = self.sync_stats.read();
                FileSync {
                    files,
                    cap: self.deps().limits.max_synced_files,
                    not_mirrored,
                }
            },
            readiness: match &self.life {
                Life::Running { .. } => self.readiness.clone(),
                _ => Readiness::None,
            },
            from_warm_pool: matches!(self.life, Life::Running { .. }) && self.from_pool,
        }
    }

    fn row_reason(&self) -> String {
        self.row
            .as_ref()
            .map(|r| r.reason.clone())
            .unwrap_or_default()
    }

    /// The running sandbox, started (or resumed from its latest snapshot) if it is not. Keys
    /// typed meanwhile wait in the hub; a terminal someone watches is opened once it runs.
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
        // A room whose sandbox time is used up does not start (a raise lets it).
        let within = self
            .deps()
            .spend
            .check(&self.room_id, "", &[crate::spend::Meter::SandboxSeconds])
            .await?;
        if let Err(e) = within {
            let e = SandboxError::Budget(e);
            self.hub.link(Link::Down(e.to_string())).await;
            return Err(e);
        }
        self.hub.link(Link::Pending).await;
        match self.start(reason).await {
            Ok(sandbox) => {
                if self.hub.viewers() > 0 {
                    // The hub says "running" once the terminal is there.
                    self.open_terminal().await;
                } else {
                    self.hub
                        .event(TermEvent::Sandbox {
                            state: "running",
                            reason: None,
                        })
                        .await;
                    self.hub.link(Link::Idle).await;
                }
                Ok(sandbox)
            }
            Err(e) => {
                self.hub.link(Link::Down(e.to_string())).await;
                Err(e)
            }
        }
    }

    /// Starts a sandbox for a dormant room: restores the newest snapshot that restores, records
    /// the transition, and wires its events to the hub and this supervisor.
    async fn start(&mut self, reason: &str) -> Result<Sandbox, SandboxError> {
        // The latest snapshot first, then older ones, then an empty workspace: a snapshot that
        // does not restore (it was written by the untrusted agent) never locks the room out.
        // The document holds every text file anyway and wins at the next sync.
        let mut candidates: Vec<Option<String>> =
            self.snapshots.list().await.into_iter().map(Some).collect();
        let latest = self.row.as_ref().and_then(|r| r.snapshot.clone());
        if let Some(l) = &latest {
            candidates.retain(|c| c.as_ref() != Some(l));
            candidates.insert(0, Some(l.clone()));
        }
        candidates.push(None);
        let mut failures = Vec::new();
        let mut started = None;
        let mut kept = None;
        for candidate in candidates {
            // Only the latest snapshot can have been kept (a stop keeps what it snapshotted).
            let tag = candidate
                .as_deref()
                .filter(|c| latest.as_deref() == Some(*c));
            let ((sandbox, events, receipt), pooled) = self
                .owner
                .take_sandbox(&self.room_id, tag)
                .await
                .map_err(|e| {
                    tracing::error!(room = %self.room_id, error = %e, "sandbox start failed");
                    SandboxError::Start
                })?;
            self.from_pool = pooled;
            let Some(name) = &candidate else {
                // Nothing to restore; a sandbox that carried on (a room server attached again
                // to one running on a sandbox host) says so all the same.
                kept = sandbox.resumed().map(|r| r.from.name());
                started = Some((sandbox, events, receipt, candidate));
                break;
            };
            // Resumed from its own disk (or memory): the workspace is there already.
            if let Some(r) = sandbox.resumed().filter(|r| &r.tag == name) {
                kept = Some(r.from.name());
                started = Some((sandbox, events, receipt, candidate));
                break;
            }
            let path = self.snapshots.path(name);
            let restored = match tokio::fs::File::open(&path).await {
                Ok(mut f) => sandbox
                    .restore(&mut f, snapshots::WITHIN)
                    .await
                    .map_err(RestoreError::Sandbox),
                Err(e) => Err(RestoreError::File(e)),
            };
            match restored {
                Ok(()) => {
                    started = Some((sandbox, events, receipt, candidate));
                    break;
                }
                Err(e) => {
                    // The audit chain is shown to room members: it gets a stable reason and
                    // the id of the log line with the details (which may be the agent's text).
                    let error_id = crate::ids::error_id();
                    tracing::error!(room = %self.room_id, snapshot = %name, %error_id, error = ?e, "cannot restore the snapshot");
                    failures.push(
                        json!({ "snapshot": name, "error": e.to_string(), "error_id": error_id }),
                    );
                    sandbox.kill();
                    // Its cgroup is removed before the next attempt creates it again.
                    let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
                }
            }
        }
        let Some((sandbox, events, receipt, snapshot)) = started else {
            return Err(SandboxError::Start);
        };
        // From now on the sandbox's way out is this room's egress policy (a pooled sandbox had
        // none: its connections were closed).
        sandbox.on_outbound(self.deps().egress.taker(self.room_id.to_string()));
        self.configure_egress(&sandbox).await;
        self.generation = self
            .owner
            .inner
            .next_generation
            .fetch_add(1, Ordering::Relaxed);
        let generation = self.generation;
        let now = self.deps().clock.now_ms();
        let stop_at = (self.hub.viewers() == 0).then(|| now + self.idle_ms());
        // The snapshot actually restored (an older one, or none, when the latest failed).
        let resumed_from = snapshot.as_deref().and_then(snapshots::time_of);
        let row = SandboxRow {
            state: SandboxState::Running,
            reason: reason.to_owned(),
            receipt: serde_json::to_string(&receipt).unwrap_or_default(),
            snapshot_at: resumed_from,
            snapshot: snapshot.clone(),
            stop_at,
        };
        let mut details = json!({
            "reason": reason,
            "resumed_from": snapshot,
            "restore_failures": failures,
            "from_warm_pool": self.from_pool,
            "receipt": receipt,
        });
        if let Some(kept) = kept {
            details["resumed_from_kept"] = json!(kept);
        }
        if let Err(e) = self
            .transition("sandbox_start", "system", details, row)
            .await
        {
            sandbox.kill();
            return Err(e);
        }
        self.last_armed = stop_at;
        let rate = self.deps().cfg.terminal_output_bytes_per_s.max(1024);
        tokio::spawn(pump(events, generation, rate, self.hub.clone()));
        let spend = self.deps().spend.clone();
        spend.sandbox_running(&self.room_id, self.owner.tier(), generation);
        let watched = sandbox.clone();
        let me = self.me.clone();
        let room_id = self.room_id.clone();
        tokio::spawn(async move {
            let how = watched.ended().await;
            // Its time is charged up to here, however it ended.
            spend.sandbox_ended(&room_id, generation);
            if let Some(me) = me.upgrade() {
                let _ = me.send(Cmd::Ended { generation, how }).await;
            }
        });
        tracing::info!(room = %self.room_id, tier = %receipt.tier, "sandbox running");
        let restored = match &snapshot {
            Some(name) => self.snapshots.meta(name).await,
            None => Meta::default(),
        };
        let sync = Some(self.start_sync(&sandbox, restored.agreed));
        self.life = Life::Running {
            sandbox: sandbox.clone(),
            generation,
            receipt: Box::new(receipt),
            resumed_from,
            sync,
        };
        self.pty_open = false;
        self.begin_readiness(&sandbox, generation, restored.ready_for)
            .await;
        Ok(sandbox)
    }

    /// Runs the room's readiness command in the sandbox just started, unless the workspace was
    /// restored from one in which that same command had completed. It runs beside whatever
    /// else the room does (the terminal and commands work meanwhile); its outcome comes back
    /// as [`Cmd::Prepared`].
    async fn begin_readiness(
        &mut self,
        sandbox: &Sandbox,
        generation: u64,
        ready_for: Option<String>,
    ) {
        let now = self.deps().clock.now_ms();
        let command = match self.deps().store.room(&self.room_id).await {
            Ok(row) => row.and_then(|r| r.readiness),
            Err(e) => {
                tracing::warn!(room = %self.room_id, error = %e, "cannot read the readiness command");
                None
            }
        };
        self.readiness = match command {
            None => Readiness::None,
            Some(command) if ready_for.as_deref() == Some(command.as_str()) => Readiness::Ready {
                command,
                at: now,
                skipped: true,
            },
            Some(command) => {
                let op = Op::Exec {
                    argv: vec!["sh".into(), "-c".into(), command.clone()],
                    cwd: String::new(),
                    timeout_ms: READINESS_MS,
                    max_output: u32::try_from(READINESS_OUTPUT).unwrap_or(u32::MAX),
                    actor: "readiness".into(),
                };
                let (sandbox, me) = (sandbox.clone(), self.me.clone());
                let ran = command.clone();
                tokio::spawn(async move {
                    let within = Duration::from_millis(READINESS_MS) + Duration::from_secs(30);
                    let outcome = sandbox.call(op, within).await.map_err(SandboxError::from);
                    if let Some(me) = me.upgrade() {
                        let _ = me
                            .send(Cmd::Prepared {
                                generation,
                                command: ran,
                                outcome,
                            })
                            .await;
                    }
                });
                Readiness::Preparing {
                    command,
                    since: now,
                }
            }
        };
        let state = match &self.readiness {
            Readiness::None => return,
            Readiness::Preparing { .. } => "preparing",
            _ => "ready",
        };
        self.hub
            .event(TermEvent::Sandbox {
                state,
                reason: None,
            })
            .await;
    }

    /// The readiness command of sandbox `generation` ended.
    async fn prepared(
        &mut self,
        generation: u64,
        command: String,
        outcome: Result<Reply, SandboxError>,
    ) {
        let current = matches!(&self.life, Life::Running { generation: g, .. } if *g == generation);
        if !current
            || !matches!(&self.readiness, Readiness::Preparing { command: c, .. } if *c == command)
        {
            return;
        }
        let at = self.deps().clock.now_ms();
        self.readiness = match outcome {
            Ok(Reply::Exec {
                exit_code: Some(0),
                timed_out: false,
                ..
            }) => Readiness::Ready {
                command,
                at,
                skipped: false,
            },
            Ok(Reply::Exec {
                exit_code,
                stdout,
                stderr,
                timed_out,
                ..
            }) => {
                let mut all = String::from_utf8_lossy(&stdout).into_owned();
                all.push_str(&String::from_utf8_lossy(&stderr));
                let mut from = all.len().saturating_sub(READINESS_OUTPUT);
                while !all.is_char_boundary(from) {
                    from += 1;
                }
                Readiness::Failed {
                    command,
                    at,
                    exit_code,
                    timed_out,
                    output: all[from..].to_owned(),
                }
            }
            Ok(_) => Readiness::Failed {
                command,
                at,
                exit_code: None,
                timed_out: false,
                output: "the sandbox answered out of turn".into(),
            },
            Err(e) => Readiness::Failed {
                command,
                at,
                exit_code: None,
                timed_out: false,
                output: e.to_string(),
            },
        };
        let (state, reason) = match &self.readiness {
            Readiness::Ready { .. } => ("ready", None),
            Readiness::Failed {
                exit_code,
                timed_out,
                ..
            } => (
                "not_ready",
                Some(match (exit_code, timed_out) {
                    (_, true) => "the readiness command timed out".to_owned(),
                    (Some(code), _) => format!("the readiness command exited with {code}"),
                    (None, _) => "the readiness command did not complete".to_owned(),
                }),
            ),
            _ => return,
        };
        tracing::info!(room = %self.room_id, state, "readiness");
        self.hub.event(TermEvent::Sandbox { state, reason }).await;
    }

    /// The readiness command that has completed in the running sandbox's workspace.
    fn ready_for(&self) -> Option<String> {
        match &self.readiness {
            Readiness::Ready { command, .. } => Some(command.clone()),
            _ => None,
        }
    }

    /// What a snapshot of the running sandbox's workspace is, for its record.
    fn meta_now(&self) -> Meta {
        Meta {
            agreed: self.agreed_now(),
            ready_for: self.ready_for(),
        }
    }

    /// Starts the document <-> workspace sync of a running sandbox; `restored` is what the
    /// two agreed on when its workspace was saved.
    fn start_sync(
        &self,
        sandbox: &Sandbox,
        restored: std::collections::HashMap<String, String>,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let cancel = CancellationToken::new();
        let task = tokio::spawn(crate::sandbox::filesync::run(
            crate::sandbox::filesync::SyncCtx {
                rooms: self.deps().rooms.clone(),
                limits: self.deps().limits.clone(),
                room_id: self.room_id.clone(),
                sandbox: sandbox.clone(),
                cancel: cancel.clone(),
                stats: self.sync_stats.clone(),
                agreed: self.sync_agreed.clone(),
                restored,
                moved: {
                    let (owner, room) = (self.owner.clone(), self.room_id.clone());
                    Arc::new(move || {
                        let (owner, room) = (owner.clone(), room.clone());
                        tokio::spawn(async move {
                            owner
                                .abandon(&room, "the room moved to another server")
                                .await;
                        });
                    })
                },
            },
        ));
        (cancel, task)
    }

    /// What the document and the workspace agree on now (as the sync last recorded it).
    fn agreed_now(&self) -> std::collections::HashMap<String, String> {
        self.sync_agreed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn idle_ms(&self) -> i64 {
        i64::try_from(self.deps().cfg.sandbox_idle_ms).unwrap_or(i64::MAX / 2)
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
        state: SandboxState,
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
        let snap = self.snapshots.take(&sandbox, &self.meta_now()).await;
        let (snapshot, snapshot_at, bytes) = match snap {
            Ok(taken) => (Some(taken.name), Some(taken.at), taken.bytes),
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
                // Where the stopped sync left the agreement.
                let agreed = self.agreed_now();
                let restarted = self.start_sync(&sandbox, agreed);
                if let Life::Running { sync, .. } = &mut self.life {
                    *sync = Some(restarted);
                }
                return Err(e);
            }
        };
        let kept = self.park(&sandbox, snapshot.as_deref()).await;
        if kept.is_none() {
            sandbox.kill();
        }
        let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
        self.life = Life::Dormant;
        self.pty_open = false;
        self.hub
            .link(Link::Down("the sandbox is not running".into()))
            .await;
        let row = SandboxRow {
            state: state.to_owned(),
            reason: reason.to_owned(),
            receipt: serde_json::to_string(&receipt).unwrap_or_default(),
            snapshot: snapshot.clone(),
            snapshot_at,
            // A suspended sandbox keeps its idle timer: it fires after the restart.
            stop_at: if state == SandboxState::Suspended {
                self.row.as_ref().and_then(|r| r.stop_at)
            } else {
                None
            },
        };
        let mut details = json!({
            "reason": reason,
            "snapshot": snapshot,
            "snapshot_bytes": bytes,
            "receipt": receipt,
        });
        if let Some(k) = &kept {
            details["kept"] = json!(k.kept.name());
            details["kept_bytes"] = json!(k.bytes);
            if let Some(note) = &k.note {
                details["kept_note"] = json!(note);
            }
        }
        self.transition("sandbox_stop", actor, details, row).await?;
        self.last_armed = self.row.as_ref().and_then(|r| r.stop_at);
        self.snapshots
            .prune(self.row.as_ref().and_then(|r| r.snapshot.as_deref()))
            .await;
        self.hub
            .event(TermEvent::Sandbox {
                state: state.as_str(),
                reason: Some(reason.to_owned()),
            })
            .await;
        Ok(())
    }

    /// Stops `sandbox` keeping what `--sandbox-keep` asks for, under the name of the snapshot
    /// just taken (`tag`), so the next start resumes from it instead of restoring that
    /// snapshot. `None` when nothing was kept: the caller kills the sandbox.
    async fn park(&self, sandbox: &Sandbox, tag: Option<&str>) -> Option<coderoom_sandbox::Parked> {
        let keep = self.deps().cfg.sandbox_keep.keep()?;
        let tag = tag?;
        match sandbox.park(keep, tag, PARK_WITHIN).await {
            Ok(parked) => {
                tracing::info!(room = %self.room_id, kept = parked.kept.name(), bytes = parked.bytes, "sandbox parked");
                Some(parked)
            }
            Err(coderoom_sandbox::ParkError::Unsupported) => None,
            Err(e) => {
                tracing::warn!(room = %self.room_id, error = %e, "cannot keep the sandbox; its snapshot stands");
                None
            }
        }
    }

    /// The workspace as it is now, written to `dest`: archived from the running sandbox, else
    /// copied from the latest snapshot, else an empty archive (the room never had a sandbox).
    async fn archive(&mut self, dest: &std::path::Path) -> Result<(u64, Meta), SandboxError> {
        if let Life::Running { sandbox, .. } = &self.life {
            // The agreement as the archive starts: what changes on disk while it is written
            // reads, on a restore, as a change inside (and is taken in).
            let (sandbox, meta) = (sandbox.clone(), self.meta_now());
            return Ok((self.snapshots.archive(&sandbox, dest).await?, meta));
        }
        match self.row.as_ref().and_then(|r| r.snapshot.clone()) {
            Some(name) => {
                let bytes = snapshots::copy_durably(&self.snapshots.path(&name), dest).await?;
                Ok((bytes, self.snapshots.meta(&name).await))
            }
            None => {
                // An empty tar archive: two zero blocks.
                let empty = [0u8; 1024];
                snapshots::write_durably(dest, &empty).await?;
                Ok((1024, Meta::default()))
            }
        }
    }

    /// Restores a checkpoint. The sandbox stops first (snapshotting what it had, so nothing of
    /// it is lost), so no sync runs while the document is rewritten; the document is made to
    /// read the checkpoint's files, as one change by whoever asked, which every client receives
    /// live; the checkpoint's archive becomes the newest snapshot, with an agreement record
    /// naming the checkpoint's texts (a file the document no longer has is then removed from
    /// the restored workspace, not taken in again); and the sandbox starts again if it ran.
    async fn rewind(&mut self, rewind: &Rewind) -> Result<(), SandboxError> {
        let was_running = matches!(self.life, Life::Running { .. });
        let reason = format!("restoring {}", rewind.what);
        if was_running {
            self.stop(&rewind.who.0, &reason, SandboxState::Stopped, false)
                .await?;
        }
        let rewritten = async {
            let deps = self.deps();
            let mut visit = crate::room::visit::Visit::start(
                &deps.rooms,
                &deps.limits,
                &self.room_id,
                (&rewind.who.0, &rewind.who.1),
            )
            .await?;
            visit.rewrite(&rewind.texts).await?;
            visit.leave().await;
            Ok::<_, SandboxError>(())
        };
        let mut result = rewritten.await;
        if result.is_ok() {
            result = self.install_latest(&rewind.archive, &rewind.meta).await;
        }
        if was_running {
            // Running again either way: on the restored workspace, or on its own if the
            // restore failed.
            let how = if result.is_ok() {
                format!("restored {}", rewind.what)
            } else {
                format!("after a failed restore of {}", rewind.what)
            };
            if let Err(e) = self.ensure_running(&how).await {
                tracing::warn!(room = %self.room_id, error = %e, "cannot start the sandbox again after a restore");
            }
        }
        result
    }

    /// A snapshot while running, so a crash of the server loses at most this period of the
    /// workspace (the document loses nothing). Not a lifecycle transition: no audit record.
    async fn periodic_snapshot(&mut self) {
        let Life::Running { sandbox, .. } = &self.life else {
            return;
        };
        let sandbox = sandbox.clone();
        match self.snapshots.take(&sandbox, &self.meta_now()).await {
            Ok(taken) => {
                if let Err(e) = self.make_latest(taken).await {
                    tracing::warn!(room = %self.room_id, error = %e, "cannot record the snapshot")
                }
            }
            Err(e) => tracing::warn!(room = %self.room_id, error = %e, "periodic snapshot failed"),
        }
    }

    /// Makes a copy of the archive at `src`, described by `meta`, the room's latest snapshot.
    async fn install_latest(
        &mut self,
        src: &std::path::Path,
        meta: &Meta,
    ) -> Result<(), SandboxError> {
        let taken = self.snapshots.install(src, meta).await?;
        Ok(self.make_latest(taken).await?)
    }

    /// Records `taken` as the room's latest snapshot (a sandbox starting next resumes from it)
    /// and prunes older ones.
    async fn make_latest(&mut self, taken: snapshots::Taken) -> Result<(), StoreError> {
        let snapshots::Taken { name, at, .. } = taken;
        self.deps()
            .store
            .set_snapshot(&self.room_id, &name, at)
            .await?;
        if let Some(r) = self.row.as_mut() {
            r.snapshot = Some(name);
            r.snapshot_at = Some(at);
        }
        self.snapshots
            .prune(self.row.as_ref().and_then(|r| r.snapshot.as_deref()))
            .await;
        Ok(())
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
        self.pty_open = false;
        self.hub
            .link(Link::Down(format!("the sandbox failed: {reason}")))
            .await;
        let row = SandboxRow {
            state: SandboxState::Failed,
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
        self.hub.event(self.restart_event(&reason)).await;
    }

    /// `{"type":"exit","reason",...,"restart":...}`: the sandbox failed and how to restart it.
    fn restart_event(&self, reason: &str) -> TermEvent {
        TermEvent::SandboxFailed {
            reason: reason.to_owned(),
            restart: format!("POST /api/rooms/{}/sandbox/start", self.room_id),
        }
    }

    async fn idle_due(&mut self) {
        let row = match self.deps().store.sandbox(&self.room_id).await {
            Ok(Some(r)) => r,
            _ => return,
        };
        let now = self.deps().clock.now_ms();
        match row.stop_at {
            Some(at) if at <= now => {}
            _ => return,
        }
        if self.hub.viewers() > 0 {
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
                match self
                    .stop("system", reason, SandboxState::Stopped, force)
                    .await
                {
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
                // The timer still ends its life as a recorded stop, unless another live
                // server holds the room: a sandbox holds its room loaded where it runs, so it
                // may run there, and is that server's to stop.
                match self.deps().store.room_owner(&self.room_id).await {
                    Ok(Some(owner)) if owner.server != self.deps().server_id => return,
                    Ok(_) => {}
                    Err(_) => return,
                }
                let Some(mut row) = self.row.clone() else {
                    return;
                };
                row.state = if matches!(self.life, Life::Failed(_)) {
                    SandboxState::Failed
                } else {
                    SandboxState::Stopped
                };
                row.reason = format!(
                    "{reason} (the timer fired where the sandbox no longer ran: its server had stopped or gone)"
                );
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
        if self.hub.viewers() > 0 {
            self.arm(None).await;
            return;
        }
        let next = self.deps().clock.now_ms() + self.idle_ms();
        if self.last_armed.is_none_or(|at| next - at >= REARM_EVERY_MS) {
            self.arm(Some(next)).await;
        }
    }

    /// Opens the running sandbox's PTY at the hub's size and links the hub to it.
    async fn open_pty(&mut self) -> Result<(), SandboxError> {
        let Life::Running {
            sandbox,
            generation,
            ..
        } = &self.life
        else {
            return Ok(());
        };
        if self.pty_open {
            return Ok(());
        }
        let (sandbox, generation) = (sandbox.clone(), *generation);
        let (cols, rows) = self.hub.size().await;
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
            // One is open already (the hub asked while a reopen was on its way): use it.
            Err(CallError::Agent(AgentError::Invalid(_))) => {}
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
        self.pty_open = true;
        let input = pty_port(sandbox);
        self.hub.link(Link::Attached { generation, input }).await;
        Ok(())
    }

    /// [`Self::open_pty`], telling the viewers when it fails.
    async fn open_terminal(&mut self) {
        if let Err(e) = self.open_pty().await {
            tracing::warn!(room = %self.room_id, error = %e, "cannot open the terminal");
            let reason = "the terminal could not be opened".to_owned();
            self.hub.link(Link::Down(reason.clone())).await;
            self.hub.event(TermEvent::error(reason)).await;
        }
    }

    /// A key is waiting for a PTY (the shell exited): a new one, if the sandbox still runs.
    /// The hub asks only when its shell is gone, so the PTY this supervisor opened last is
    /// not assumed open any more.
    async fn reopen_pty(&mut self) {
        match &self.life {
            Life::Running { .. } => {
                self.pty_open = false;
                self.open_terminal().await;
            }
            Life::Failed(r) => {
                let reason = format!("the sandbox failed: {r}");
                self.hub.link(Link::Down(reason)).await;
            }
            Life::Dormant => {
                let reason = "the sandbox is not running".to_owned();
                self.hub.link(Link::Down(reason)).await;
            }
        }
    }

    /// Adds a viewer to the hub and answers at once; then starts the sandbox and opens the
    /// terminal if they are not, while the viewer already watches ("starting") and its keys
    /// wait in the hub.
    async fn join(
        &mut self,
        cols: u16,
        rows: u16,
        start: bool,
        reply: oneshot::Sender<Result<(Hub, Joined), SandboxError>>,
    ) {
        if self.deps().shutdown.is_cancelled() {
            let _ = reply.send(Err(SandboxError::ShuttingDown));
            return;
        }
        if let Backend::None(why) = &self.owner.inner.backend {
            let _ = reply.send(Err(SandboxError::Unavailable(why.clone())));
            return;
        }
        let failed = match &self.life {
            Life::Failed(r) => Some(r.clone()),
            _ => None,
        };
        // A viewer who may not start the sandbox watches it as it is: a stopped one stays so.
        let stays_down = !start && matches!(self.life, Life::Dormant);
        match &failed {
            Some(r) => {
                let reason = format!("the sandbox failed: {r}");
                self.hub.link(Link::Down(reason)).await;
            }
            None if stays_down && !self.pty_open => {
                self.hub.link(Link::Down(NOT_STARTED.into())).await;
            }
            None if !self.pty_open => self.hub.link(Link::Pending).await,
            None => {}
        }
        let Some(joined) = self.hub.join(cols, rows).await else {
            let _ = reply.send(Err(SandboxError::ShuttingDown));
            return;
        };
        // Watched: no idle stop.
        self.arm(None).await;
        let viewer = joined.viewer;
        if reply.send(Ok((self.hub.clone(), joined))).is_err() {
            // The socket gave up meanwhile: it does not watch.
            self.hub.leave(viewer).await;
        }
        if let Some(r) = failed {
            let event = self.restart_event(&r);
            self.hub.event(event).await;
            return;
        }
        if stays_down {
            let event = TermEvent::Sandbox {
                state: "stopped",
                reason: Some(NOT_STARTED.into()),
            };
            self.hub.event(event).await;
            return;
        }
        match self.ensure_running("terminal opened").await {
            Ok(_) => {
                if !self.pty_open {
                    self.open_terminal().await;
                }
            }
            Err(SandboxError::Failed(r)) => {
                let event = self.restart_event(&r);
                self.hub.event(event).await;
            }
            Err(SandboxError::ShuttingDown) => {
                self.hub.close_all(CloseCode::Away).await;
            }
            Err(e) => {
                self.hub.event(TermEvent::error(e.to_string())).await;
                self.hub.close_all(CloseCode::Internal).await;
            }
        }
    }
}

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
use crate::ids::RoomId;
use crate::sandbox::snapshots::{Meta, Snapshots};
use crate::store::{SandboxRow, SandboxState, Store, StoreError};
use crate::terminal::{Hub, Joined, TermEvent};
use coderoom_sandbox::proto::{Op, Reply, RunInput};
use coderoom_sandbox::{Backend, CallError, Ended, Sandbox};
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

mod actor;
mod idle;
mod parking;
mod pty;
mod readiness;
mod warm;

/// Requests queued for one room's supervisor before callers wait.
const ACTOR_QUEUE: usize = 256;
/// Attempts at reaching a supervisor that is exiting at that moment.
const SEND_ATTEMPTS: usize = 3;
/// How long an operation on a just-started sandbox waits for the sync to write the
/// document's files into its workspace (a workspace of thousands of files takes seconds).
const FIRST_SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Whether a started sandbox's sync has written the document's files into its workspace once,
/// and until when operations wait for it: one deadline per start, so a sync that cannot
/// reconcile (its room full, say) holds operations up once, not each one.
#[derive(Clone)]
struct FirstSync {
    done: tokio::sync::watch::Receiver<bool>,
    by: tokio::time::Instant,
}

impl FirstSync {
    /// Done already (no sandbox started yet, or one whose files are in place).
    fn done() -> FirstSync {
        FirstSync {
            done: tokio::sync::watch::channel(true).1,
            by: tokio::time::Instant::now(),
        }
    }

    /// Waits until the first reconciliation is done, or the start's deadline.
    async fn wait(mut self) {
        let _ = tokio::time::timeout_at(self.by, self.done.wait_for(|done| *done)).await;
    }
}

/// Asks to settle a running sandbox's sync may queue (each is answered, or given up by its
/// asker within [`SETTLE_WAIT`]).
const SETTLE_ASKS: usize = 64;
/// How long a write through the workspace waits for the document to hold it.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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

impl SandboxStatus {
    /// Whether the sandbox runs (its workspace may change at any moment).
    /// The limits the sandbox runs (or would run) under.
    pub(crate) fn limits(&self) -> &coderoom_sandbox::Limits {
        &self.limits
    }

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

/// An [`Op::Run`]'s ends on this side: where its output goes as it is printed, and where its
/// input (standard input, terminal keys and size) comes from, taken by the one call that runs
/// it.
#[derive(Clone, Debug)]
pub(crate) struct Streamed {
    pub(crate) output: tokio::sync::mpsc::Sender<Vec<u8>>,
    pub(crate) input: Arc<std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<RunInput>>>>,
}

impl Streamed {
    pub(super) fn take_input(&self) -> Option<tokio::sync::mpsc::Receiver<RunInput>> {
        self.input.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

enum Cmd {
    Op {
        op: Op,
        within: Duration,
        /// Only where the sandbox runs already, and not counted as use (the idle timer is
        /// left alone): a look that must neither start nor keep alive a sandbox.
        peek: bool,
        /// Ends the command when cancelled (its caller lost the right to run it).
        stop: Option<tokio_util::sync::CancellationToken>,
        /// Where an [`Op::Run`]'s output goes as it is printed, and its input comes from.
        output: Option<Streamed>,
        reply: oneshot::Sender<Result<Reply, SandboxError>>,
    },
    Status {
        reply: oneshot::Sender<SandboxStatus>,
    },
    /// The running sandbox's way to ask its sync for a scan whose imports are durable.
    Settler {
        reply: oneshot::Sender<Option<crate::sandbox::filesync::Settle>>,
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

    /// The tier in use (`namespace` or `none`).
    pub(crate) fn tier(&self) -> &'static str {
        self.inner.backend.tier().name()
    }

    fn supervisor(&self, room_id: &RoomId) -> mpsc::Sender<Cmd> {
        let owner = self.clone();
        self.inner
            .supervisors
            .get_or_start(room_id, ACTOR_QUEUE, |tx, rx, generation| {
                let (actor, pty_wanted) = Actor::new(room_id.to_owned(), owner, tx.downgrade());
                tokio::spawn(actor.run(rx, pty_wanted, generation));
            })
    }

    /// Tells a running sandbox of the room that its secrets changed (nothing when none runs).
    pub(crate) async fn egress_changed(&self, room_id: &RoomId) {
        if let Some(tx) = self.inner.supervisors.get(room_id) {
            let _ = tx.send(Cmd::Egress).await;
        }
    }

    /// Sends a command without waiting for an answer.
    async fn send(&self, room_id: &RoomId, make: impl Fn() -> Cmd) {
        let _ = self.supervisor(room_id).send(make()).await;
    }

    /// Sends a command and waits for its answer, retrying when the supervisor was exiting.
    async fn ask<T>(
        &self,
        room_id: &RoomId,
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
        room_id: &RoomId,
        op: Op,
        within: Duration,
    ) -> Result<Reply, SandboxError> {
        self.run_op(room_id, op, within, false, None, None).await
    }

    /// Runs a typed operation where the room's sandbox is running already (else
    /// [`SandboxError::Stopped`]), without counting it as use.
    pub(crate) async fn peek(
        &self,
        room_id: &RoomId,
        op: Op,
        within: Duration,
    ) -> Result<Reply, SandboxError> {
        self.run_op(room_id, op, within, true, None, None).await
    }

    /// [`Sandboxes::op`], ended once `stop` is cancelled: the agent kills the command's
    /// process group and the call fails with [`CallError::Cancelled`] at once.
    pub(crate) async fn op_until(
        &self,
        room_id: &RoomId,
        op: Op,
        within: Duration,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<Reply, SandboxError> {
        self.run_op(room_id, op, within, false, Some(stop), None)
            .await
    }

    /// [`Sandboxes::op_until`] for an [`Op::Run`]: its output chunks go to `output` as they
    /// come, and its input comes from it (see `Sandbox::call_streaming`).
    pub(crate) async fn op_streaming(
        &self,
        room_id: &RoomId,
        op: Op,
        within: Duration,
        stop: &tokio_util::sync::CancellationToken,
        output: Streamed,
    ) -> Result<Reply, SandboxError> {
        self.run_op(room_id, op, within, false, Some(stop), Some(output))
            .await
    }

    async fn run_op(
        &self,
        room_id: &RoomId,
        op: Op,
        within: Duration,
        peek: bool,
        stop: Option<&tokio_util::sync::CancellationToken>,
        output: Option<Streamed>,
    ) -> Result<Reply, SandboxError> {
        let op = Arc::new(op);
        self.ask(room_id, |reply| Cmd::Op {
            op: (*op).clone(),
            within,
            peek,
            stop: stop.cloned(),
            output: output.clone(),
            reply,
        })
        .await?
    }

    /// A connection to `port` inside the room's sandbox; `start` starts a stopped one first
    /// (a member opening a preview), else a stopped sandbox is an error.
    pub(crate) async fn connect(
        &self,
        room_id: &RoomId,
        port: u16,
        start: bool,
    ) -> Result<tokio::io::DuplexStream, SandboxError> {
        self.ask(room_id, |reply| Cmd::Connect { port, start, reply })
            .await?
    }

    /// `{"tier", "state", "limits", "receipt", ...}` of the room's sandbox.
    pub(crate) async fn status(&self, room_id: &RoomId) -> Result<SandboxStatus, SandboxError> {
        self.ask(room_id, |reply| Cmd::Status { reply }).await
    }

    /// Waits (up to [`SETTLE_WAIT`]) until the room's document holds, durably, what the
    /// running sandbox's workspace holds now: a scan of the workspace, its imports committed.
    /// A write through the workspace is then as safe from a crash as an edit. `false` when no
    /// sync runs or it did not answer in time.
    pub(crate) async fn settle(&self, room_id: &RoomId) -> bool {
        let Ok(Some(settle)) = self.ask(room_id, |reply| Cmd::Settler { reply }).await else {
            return false;
        };
        let (done, settled) = oneshot::channel();
        // The asking too is bounded: a sync that cannot join its room reads no asks.
        let asked = async {
            settle.send(done).await.ok()?;
            settled.await.ok()
        };
        matches!(tokio::time::timeout(SETTLE_WAIT, asked).await, Ok(Some(())))
    }

    /// Snapshots and stops the room's sandbox.
    pub(crate) async fn stop(
        &self,
        room_id: &RoomId,
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
        room_id: &RoomId,
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
    pub(crate) async fn abandon(&self, room_id: &RoomId, why: &str) {
        if let Some(tx) = self.inner.supervisors.get(room_id) {
            let _ = tx
                .send(Cmd::Abandon {
                    why: why.to_owned(),
                })
                .await;
        }
    }

    /// Tells everyone watching the room's terminal.
    pub(crate) async fn notice(&self, room_id: &RoomId, event: TermEvent) {
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
        room_id: &RoomId,
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
        room_id: &RoomId,
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
        room_id: &RoomId,
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
    pub(crate) async fn rewind(
        &self,
        room_id: &RoomId,
        rewind: Rewind,
    ) -> Result<(), SandboxError> {
        let rewind = Arc::new(rewind);
        self.ask(room_id, |reply| Cmd::Rewind(rewind.clone(), reply))
            .await?
    }

    /// Joins the terminal (starting the sandbox and its PTY if needed).
    pub(crate) async fn join(
        &self,
        room_id: &RoomId,
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
    pub(crate) async fn leave(&self, room_id: &RoomId, hub: &Hub, viewer: u64) {
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
    pub(crate) async fn destroy(&self, room_id: &RoomId) -> Destroyed {
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

enum Life {
    /// Not running (never started, stopped, suspended, or the server restarted).
    Dormant,
    Running {
        sandbox: Sandbox,
        generation: u64,
        /// Boxed: the largest part, and `Life` is mostly not `Running`.
        receipt: Box<crate::sandbox::receipt::RoomReceipt>,
        /// When the snapshot its workspace was restored from was taken (`None` for a fresh
        /// workspace), so viewers can be told it was resumed.
        resumed_from: Option<i64>,
        /// The document <-> workspace sync of this sandbox.
        sync: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    },
    Failed(String),
}

struct Actor {
    room_id: RoomId,
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
    /// Whether the running sandbox's sync has written the document's files into its workspace
    /// once: operations on the workspace wait for it (see [`FIRST_SYNC_WAIT`]).
    first_sync: FirstSync,
    /// Dropped when the running sandbox's first operation is answered (its sync may wait for
    /// that: see `SyncCtx::first_answer`).
    first_answered: Option<tokio::sync::oneshot::Sender<()>>,
    /// The running sandbox's sync, asked to settle (see [`Sandboxes::settle`]).
    settle: Option<crate::sandbox::filesync::Settle>,
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

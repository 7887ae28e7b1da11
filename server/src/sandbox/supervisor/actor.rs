//! The per-room actor: one task per room owns the room's sandbox and its lifecycle, and runs
//! the commands sent to it one at a time (starts, stops, operations, the sandbox's end).

use super::{
    Actor, Cmd, Deps, Destroyed, FileSync, Life, Readiness, SandboxError, SandboxStatus, Sandboxes,
    Usage,
};
use crate::close::CloseCode;
use crate::ids::RoomId;
use crate::sandbox::snapshots::{self, Meta, Snapshots};
use crate::store::{Change, SandboxRow, SandboxState};
use crate::terminal::hub::{pump, HubConfig};
use crate::terminal::{Hub, Link, Recorder, TermEvent};
use coderoom_sandbox::proto::Op;
use coderoom_sandbox::{Backend, CallError, Ended, Sandbox};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Time the sandbox gets to end after being killed.
const KILL_WITHIN: Duration = Duration::from_secs(10);
/// Time a connection to a port inside may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// Time the agent has to take the room's egress settings.
const EGRESS_WITHIN: Duration = Duration::from_secs(10);
/// Time the file sync gets to write pending edits before a snapshot.
const SYNC_STOP_WITHIN: Duration = Duration::from_secs(10);

/// Why a snapshot did not restore. The messages are stable: the details, which may come from
/// inside the sandbox, go to the log only.
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    #[error("the snapshot file cannot be read")]
    File(std::io::Error),
    #[error("the sandbox did not unpack the snapshot")]
    Sandbox(CallError),
}

impl Actor {
    /// The supervisor and its hub; the receiver hears when a key needs a PTY.
    pub(super) fn new(
        room_id: RoomId,
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
            first_sync: super::FirstSync::done(),
            first_answered: None,
            settle: None,
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

    pub(super) fn deps(&self) -> &Deps {
        &self.owner.inner.deps
    }

    /// Gives the sandbox the room's egress authority (its TLS clients trust it) and the
    /// placeholders of the room's secrets. A failure is logged: the sandbox works, and a
    /// request to a secret's host fails its certificate check instead of leaking anything.
    /// `starting`: a sandbox that just started, which trusts the system's roots and has no
    /// room variables; a room without secrets then has nothing to tell it (the proxy opens only
    /// connections to hosts the room has secrets for, and a secret added later sends all of
    /// this again), so nothing is sent. (A future of its own, borrowing nothing: a start runs
    /// it beside the first agreement of the workspace's sync.)
    fn configure_egress(
        &self,
        sandbox: &Sandbox,
        starting: bool,
    ) -> impl std::future::Future<Output = ()> {
        let egress = self.deps().egress.clone();
        let (room_id, sandbox) = (self.room_id.clone(), sandbox.clone());
        async move {
            let env = egress.room_env(&room_id).await;
            if starting && env.is_empty() {
                return;
            }
            let ca_pem = match egress.authority(&room_id) {
                Ok(ca) => ca.pem.clone(),
                Err(e) => {
                    tracing::error!(room = %room_id, error = %e, "cannot make the room's egress authority");
                    String::new()
                }
            };
            if let Err(e) = sandbox
                .call(Op::Egress { ca_pem, env }, EGRESS_WITHIN)
                .await
            {
                tracing::warn!(room = %room_id, error = %e, "the sandbox did not take its egress settings");
            }
        }
    }

    pub(super) async fn run(
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
                stop,
                output,
                reply,
            } => {
                let sandbox = match (&self.life, peek) {
                    (Life::Running { sandbox, .. }, true) => Ok((sandbox.clone(), None)),
                    (_, true) => Err(SandboxError::Stopped),
                    (_, false) => self.ensure_started("first use").await,
                };
                let (sandbox, recording) = match sandbox {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                // The operation runs while the sandbox's start is recorded; it is answered once
                // the record is written (an error, when it cannot be).
                let (written, start_recorded) = match &recording {
                    Some(_) => {
                        let (tx, rx) = tokio::sync::oneshot::channel::<bool>();
                        (Some(tx), Some(rx))
                    }
                    None => (None, None),
                };
                let first_sync = self.first_sync.clone();
                let first_answered = self.first_answered.take();
                tokio::spawn(async move {
                    // A started (or restarted) sandbox's workspace holds the document's files
                    // before any command sees it. A sync that ends or stalls does not hold
                    // operations up past the start's deadline.
                    first_sync.wait().await;
                    let r = match (stop, output) {
                        (Some(stop), Some(streamed)) => {
                            let input = streamed.take_input();
                            sandbox
                                .call_streaming(
                                    op,
                                    within,
                                    streamed.output,
                                    input,
                                    stop.cancelled_owned(),
                                )
                                .await
                        }
                        (Some(stop), None) => {
                            sandbox.call_until(op, within, stop.cancelled_owned()).await
                        }
                        (None, _) => sandbox.call(op, within).await,
                    };
                    let r = r.map_err(SandboxError::from);
                    let r = match start_recorded {
                        Some(rx) => match rx.await {
                            Ok(true) => r,
                            _ => r.and(Err(SandboxError::Start)),
                        },
                        None => r,
                    };
                    let _ = reply.send(r);
                    drop(first_answered);
                });
                if let (Some(recording), Some(written)) = (recording, written) {
                    let _ = written.send(self.recorded(recording).await.is_ok());
                }
                if !peek {
                    self.touch().await;
                }
            }
            Cmd::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Cmd::Settler { reply } => {
                let running = matches!(self.life, Life::Running { .. });
                let _ = reply.send(self.settle.clone().filter(|_| running));
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
                    self.configure_egress(&sandbox, false).await;
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
                self.discard_running().await;
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

    /// The running sandbox, started (or resumed from its latest snapshot) if it is not, its
    /// start recorded. Keys typed meanwhile wait in the hub; a terminal someone watches is
    /// opened once it runs.
    pub(super) async fn ensure_running(&mut self, reason: &str) -> Result<Sandbox, SandboxError> {
        let (sandbox, recording) = self.ensure_started(reason).await?;
        if let Some(recording) = recording {
            self.recorded(recording).await?;
        }
        Ok(sandbox)
    }

    /// [`Actor::ensure_running`], with the record of a start still being written (`None` when
    /// the sandbox ran already): the caller may use the sandbox meanwhile, and hands the record
    /// to [`Actor::recorded`] before anything else.
    pub(super) async fn ensure_started(
        &mut self,
        reason: &str,
    ) -> Result<(Sandbox, Option<Recording>), SandboxError> {
        if self.deps().shutdown.is_cancelled() {
            return Err(SandboxError::ShuttingDown);
        }
        match &self.life {
            Life::Running { sandbox, .. } => return Ok((sandbox.clone(), None)),
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
            Ok((sandbox, recording)) => Ok((sandbox, Some(recording))),
            Err(e) => {
                self.hub.link(Link::Down(e.to_string())).await;
                Err(e)
            }
        }
    }

    /// Ends the running sandbox without a snapshot (its sync cancelled, the sandbox killed and
    /// waited for, so its cgroup is gone before another start makes it again): dormant.
    async fn discard_running(&mut self) {
        if let Life::Running { sandbox, sync, .. } = &self.life {
            if let Some((cancel, _)) = sync {
                cancel.cancel();
            }
            sandbox.kill();
            let _ = tokio::time::timeout(KILL_WITHIN, sandbox.ended()).await;
        }
        self.life = Life::Dormant;
        self.pty_open = false;
    }

    /// Waits for the record of a start: once it is written the room is told the sandbox runs;
    /// a start that cannot be recorded is undone (the sandbox killed, the room told why).
    pub(super) async fn recorded(&mut self, recording: Recording) -> Result<(), SandboxError> {
        let Recording { write, before } = recording;
        let written = write.await.unwrap_or(Err(SandboxError::Start));
        if let Err(e) = written {
            tracing::error!(room = %self.room_id, error = %e, "cannot record the sandbox's start; stopping it");
            self.discard_running().await;
            self.row = before;
            self.hub.link(Link::Down(e.to_string())).await;
            return Err(e);
        }
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
        Ok(())
    }

    /// Starts a sandbox for a dormant room: restores the newest snapshot that restores, wires
    /// its events to the hub and this supervisor, and starts recording the transition (the
    /// returned [`Recording`], for [`Actor::recorded`]).
    pub(super) async fn start(
        &mut self,
        reason: &str,
    ) -> Result<(Sandbox, Recording), SandboxError> {
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
        // Nothing restored and nothing kept: the workspace is empty.
        let fresh = kept.is_none() && snapshot.is_none();
        let restored = match &snapshot {
            Some(name) => self.snapshots.meta(name).await,
            None => Meta::default(),
        };
        let receipt = crate::sandbox::receipt::RoomReceipt::new(
            receipt,
            &self.owner.inner.tier_reason,
            crate::sandbox::receipt::StartedFrom {
                kind: match (&kept, &snapshot) {
                    (Some(k), _) => format!("kept {k}"),
                    (None, Some(_)) => "snapshot".into(),
                    (None, None) => "empty".into(),
                },
                snapshot: snapshot.clone(),
                sha256: restored.sha256.clone(),
                warm_pool: self.from_pool,
            },
            &self.deps().data_dir,
        )
        .await;
        // From now on the sandbox's way out is this room's egress policy (a pooled sandbox had
        // none: its connections were closed).
        sandbox.on_outbound(self.deps().egress.taker(self.room_id.clone()));
        // The workspace's sync joins the room (loading it, when it is not loaded yet) while the
        // sandbox takes its egress settings and the start is recorded: the three need nothing
        // of each other. Commands wait for the first two; their answers, for the record.
        let (cancel_sync, sync_task) = self.start_sync(&sandbox, restored.agreed, false, fresh);
        // A sandbox resumed as it was (kept) may hold an earlier room's settings: it is told.
        let egress = self.configure_egress(&sandbox, kept.is_none());
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
        let write = {
            let (audit, room_id) = (self.deps().audit.clone(), self.room_id.clone());
            let change = Change::SandboxState {
                room_id: room_id.clone(),
                row: row.clone(),
            };
            // Written from now on, beside the egress settings and the rest of the start.
            tokio::spawn(async move {
                crate::fault::point("sandbox_start_record").await;
                audit
                    .record(
                        &room_id,
                        "system",
                        "sandbox_start",
                        "allow",
                        "",
                        details,
                        change,
                    )
                    .await
                    .map(|_| ())
                    .map_err(SandboxError::from)
            })
        };
        let recording = Recording {
            write,
            before: self.row.replace(row),
        };
        egress.await;
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
        let sync = Some((cancel_sync, sync_task));
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
        Ok((sandbox, recording))
    }

    /// What a snapshot of the running sandbox's workspace is, for its record.
    pub(super) fn meta_now(&self) -> Meta {
        Meta {
            agreed: self.agreed_now(),
            ready_for: self.ready_for(),
            sha256: None,
        }
    }

    /// Starts the document <-> workspace sync of a running sandbox; `restored` is what the
    /// two agreed on when its workspace was saved.
    /// `again`: on the same sandbox as the sync before (stopped for a snapshot that failed).
    /// `fresh`: the workspace started empty (see [`crate::sandbox::filesync::SyncCtx::fresh`]).
    fn start_sync(
        &mut self,
        sandbox: &Sandbox,
        restored: std::collections::HashMap<String, String>,
        again: bool,
        fresh: bool,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let cancel = CancellationToken::new();
        // A sync started again on a sandbox whose files are in place (after a failed
        // snapshot) holds nothing up.
        let already = again && *self.first_sync.done.borrow();
        let (synced, done) = tokio::sync::watch::channel(already);
        self.first_sync = super::FirstSync {
            done,
            by: tokio::time::Instant::now() + super::FIRST_SYNC_WAIT,
        };
        let (settle, asks) = tokio::sync::mpsc::channel(super::SETTLE_ASKS);
        self.settle = Some(settle);
        let (answered, first_answer) = tokio::sync::oneshot::channel();
        self.first_answered = Some(answered);
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
                synced,
                fresh,
                first_answer: Some(first_answer),
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
            asks,
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

    /// Records a lifecycle transition and the new row in one transaction.
    pub(super) async fn transition(
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
    pub(super) async fn stop(
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
                let restarted = self.start_sync(&sandbox, agreed, true, false);
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
    pub(super) fn restart_event(&self, reason: &str) -> TermEvent {
        TermEvent::SandboxFailed {
            reason: reason.to_owned(),
            restart: format!("POST /api/rooms/{}/sandbox/start", self.room_id),
        }
    }
}

/// The record of a sandbox's start being written (see [`Actor::start`]), and the room's row as
/// it was before, for a start that cannot be recorded.
pub(super) struct Recording {
    write: tokio::task::JoinHandle<Result<(), SandboxError>>,
    before: Option<SandboxRow>,
}

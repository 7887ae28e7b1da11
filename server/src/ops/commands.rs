//! Running code in the room's sandbox: a command (REST `exec`, MCP `exec`) and the room's
//! readiness step, which is a command too. One policy for every way an actor causes code to
//! run: `type`; an agent in a moderated room only while someone who can approve is there; an
//! agent in approval mode only with someone's approval of exactly that command; in a budgeted
//! room `spend`, and the command budgets, charged before it runs.

use crate::ids::RoomId;
use crate::ops::approvals::Allowed;
use crate::ops::record::{Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::spend::Meter;
use crate::store::Change;
use coderoom_authz::{Action, Authorized, Capability};
use coderoom_sandbox::path::WorkspacePath;
use coderoom_sandbox::proto::{Op, Reply};
use serde::Serialize;
use serde_json::{json, Value};
use std::time::Duration;

/// Longest a command may run.
const MAX_EXEC_MS: u64 = 10 * 60 * 1000;
/// When the request names no timeout.
const DEFAULT_EXEC_MS: u64 = 10_000;
/// Output kept per stream of one command.
const MAX_EXEC_OUTPUT: u32 = 1 << 20;
/// Arguments and their total size.
const MAX_ARGS: usize = 1024;
const MAX_ARGV_BYTES: usize = 256 << 10;
/// Longest readiness command.
const MAX_READINESS_BYTES: usize = 4096;

/// What the caller of a command stopped because its right lapsed is told.
const LAPSED: &str =
    "your right to run commands in this room ended while the command ran: it was stopped";

/// A command as a door hands it over.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    pub(crate) argv: Vec<String>,
    pub(crate) cwd: String,
    pub(crate) timeout_ms: Option<u64>,
    /// Variables added to its environment (part of what an approval covers).
    pub(crate) envs: Vec<(String, String)>,
    /// Where its output goes as it is printed (chunks: a stream number, 1 or 2, then bytes;
    /// a reader that falls behind loses some); `None`: kept for the answer.
    pub(crate) output: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    /// Told once the command is decided, recorded and on its way to the sandbox.
    pub(crate) started: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// Its caller's kill switch: cancelled, the command's unit ends and it answers as killed.
    pub(crate) kill: Option<tokio_util::sync::CancellationToken>,
    /// It takes input while it runs (with `output` only): what arrives here is its standard
    /// input, or keys typed into its terminal. Whoever feeds it types through
    /// [`Ops::type_keys`] (the door's own typist), so an agent's lines are decided there.
    pub(crate) input: Option<InputPort>,
    /// It runs on a terminal of its own, this many columns and rows (with `output` only).
    pub(crate) pty: Option<(u16, u16)>,
}

/// Where a running command's input comes from (taken by the call that runs it).
pub(crate) type InputPort = std::sync::Arc<
    std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<coderoom_sandbox::proto::RunInput>>>,
>;

impl Command {
    /// `argv` in the workspace, with the default timeout, its output kept.
    pub(crate) fn new(argv: Vec<String>, cwd: String, timeout_ms: Option<u64>) -> Command {
        Command {
            argv,
            cwd,
            timeout_ms,
            envs: Vec::new(),
            output: None,
            started: None,
            kill: None,
            input: None,
            pty: None,
        }
    }
}

/// How a command ended and what it printed (as text; invalid UTF-8 replaced; nothing when its
/// output was streamed).
#[derive(Debug, Serialize)]
pub(crate) struct Executed {
    pub(crate) exit_code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) truncated: bool,
    pub(crate) timed_out: bool,
}

/// A workspace path as the layer takes it: checked before anything reaches the sandbox.
pub(crate) fn workspace_path(raw: &str) -> Result<WorkspacePath, OpError> {
    WorkspacePath::parse(raw).map_err(|e| OpError::Invalid(format!("invalid path: {e}")))
}

impl Ops {
    /// Starting metered work (`meters`) as `actor`: in a room with a budget it needs `spend`
    /// (refused and recorded otherwise), and no budget of those meters, the room's or the
    /// agent's, may be used up.
    pub(crate) async fn may_meter(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        meters: &[Meter],
    ) -> Result<(), OpError> {
        if self.spend.has_budget(room_id).await? {
            self.authorize(
                room_id,
                actor,
                Action::Use(Capability::Spend),
                json!({ "meters": meters }),
            )
            .await?;
        }
        // Only agents have budgets of their own: a person's is not looked up.
        let who = if actor.is_agent() {
            actor.id.as_str()
        } else {
            ""
        };
        self.spend
            .check(room_id, who, meters)
            .await?
            .map_err(OpError::Spent)
    }

    /// Charges `commands` commands to `actor`, checked and charged in one step (commands at
    /// once cannot all pass the last one left).
    pub(crate) async fn charge_commands(
        &self,
        room_id: &RoomId,
        actor: &str,
        commands: u64,
    ) -> Result<(), OpError> {
        if commands == 0 {
            return Ok(());
        }
        self.spend
            .try_charge(room_id, actor, Meter::Execs, commands)
            .await?
            .map_err(OpError::Spent)
    }

    /// What every way of running code does once it is allowed: `commands` commands charged to
    /// the actor, then the act recorded with `change`, spending the approval it rested on (the
    /// approval's id added to `details`); the charge is given back when the record fails (an
    /// approval a concurrent request spent first, storage).
    pub(crate) async fn commit_commands(
        &self,
        room_id: &RoomId,
        Allowed { proof, approval }: Allowed,
        details: Value,
        commands: u64,
        change: Change,
    ) -> Result<Authorized, OpError> {
        self.charge_commands(room_id, proof.actor(), commands)
            .await?;
        let mut details = details;
        if !approval.is_empty() {
            details["approval_id"] = json!(approval);
        }
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        if let Err(e) = self
            .record_allowed(room_id, &proof, entry, change, &approval)
            .await
        {
            self.spend
                .refund(room_id, proof.actor(), Meter::Execs, commands);
            return Err(e);
        }
        Ok(proof)
    }

    /// Decides, records and runs a command: how it ended, or the approval it waits for (an
    /// agent in approval mode, until someone approves exactly this command: argv and cwd).
    pub(crate) async fn run_command(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        cmd: Command,
        approval_id: Option<&str>,
    ) -> Result<Outcome<Executed>, OpError> {
        if cmd.argv.is_empty() || cmd.argv.len() > MAX_ARGS {
            return Err(OpError::Bad("argv must hold 1 to 1024 arguments"));
        }
        if cmd.argv.iter().map(String::len).sum::<usize>() > MAX_ARGV_BYTES
            || cmd.argv.iter().any(|a| a.contains('\0'))
        {
            return Err(OpError::Bad("argv is too long or contains NUL characters"));
        }
        if !cmd.cwd.is_empty() {
            workspace_path(&cmd.cwd)?;
        }
        if !coderoom_sandbox::proto::run_envs_ok(&cmd.envs) {
            return Err(OpError::Bad(
                "environment variables: at most 128, names of letters, digits and _, values \
                 without NUL and under 32 KiB",
            ));
        }
        let timeout_ms = cmd.timeout_ms.unwrap_or(DEFAULT_EXEC_MS);
        if timeout_ms == 0 || timeout_ms > MAX_EXEC_MS {
            return Err(OpError::Bad("timeout_ms must be between 1 and 600000"));
        }
        self.moderated(room_id, actor).await?;
        self.may_meter(room_id, actor, &[Meter::Execs, Meter::SandboxSeconds])
            .await?;
        // The command line is the user's own content and may hold anything; the record names
        // the program and the shape, not the arguments.
        let details = json!({ "program": cmd.argv[0], "args": cmd.argv.len() - 1, "cwd": cmd.cwd });
        // The exact command, for an approval (it is shown to whoever decides, and only there).
        let mut params = json!({ "argv": cmd.argv, "cwd": cmd.cwd });
        if !cmd.envs.is_empty() {
            params["envs"] = json!(cmd.envs);
        }
        // Whoever approves sees that it takes input (what is typed into it later is decided
        // as typing is).
        if let Some((cols, rows)) = cmd.pty {
            params["terminal"] = json!([cols, rows]);
        } else if cmd.input.is_some() {
            params["stdin"] = json!(true);
        }
        let params = params.to_string();
        let approval = self.presented(room_id, approval_id).await?;
        let action = Action::RunCommand { params, approval };
        let allowed = match self.ask(room_id, actor, action, details.clone()).await? {
            Outcome::Done(a) => a,
            Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
        };
        // Listening before the command is recorded and sent: a removal from then on ends it, as
        // does its caller's kill switch.
        let stop = cmd
            .kill
            .as_ref()
            .map_or_else(tokio_util::sync::CancellationToken::new, |k| {
                k.child_token()
            });
        let lapsed = self.when_right_lapses_into(room_id, actor, Capability::Type, stop);
        let proof = self
            .commit_commands(room_id, allowed, details, 1, Change::None)
            .await?;
        // Its connections out count to whoever ran it.
        let actor_id = proof.actor().to_owned();
        if let Some(started) = &cmd.started {
            started.notify_one();
        }
        // The agent enforces the timeout; the extra margin covers a start from a snapshot.
        let within = Duration::from_millis(timeout_ms) + Duration::from_secs(30);
        let ran = match cmd.output {
            None => {
                let op = Op::Exec {
                    argv: cmd.argv,
                    cwd: cmd.cwd,
                    timeout_ms,
                    max_output: MAX_EXEC_OUTPUT,
                    actor: actor_id,
                };
                self.sandboxes
                    .op_until(room_id, op, within, &lapsed.stop)
                    .await
            }
            Some(output) => {
                let op = Op::Run {
                    argv: cmd.argv,
                    cwd: cmd.cwd,
                    envs: cmd.envs,
                    timeout_ms,
                    actor: actor_id,
                    stdin: cmd.input.is_some(),
                    pty: cmd.pty,
                };
                let streamed = crate::sandbox::Streamed {
                    output,
                    input: cmd.input.unwrap_or_default(),
                };
                self.sandboxes
                    .op_streaming(room_id, op, within, &lapsed.stop, streamed)
                    .await
            }
        };
        let killed = cmd.kill.as_ref().is_some_and(|k| k.is_cancelled());
        // A command its caller's lapsed right stopped: its processes' end (the sandbox ends
        // them on the change) and the lapse's watch race each other; whichever is heard first,
        // the caller is told why.
        let stopped_for_lapse = matches!(
            &ran,
            Ok(Reply::Exec {
                exit_code: None,
                timed_out: false,
                ..
            })
        ) && !killed
            && (lapsed.stop.is_cancelled()
                || !self.may_still(room_id, actor, Capability::Type).await);
        drop(lapsed);
        if stopped_for_lapse {
            return Err(OpError::Refused(LAPSED.into()));
        }
        let reply = match ran {
            // Its caller killed it: it ended as a killed process does.
            Err(crate::sandbox::SandboxError::Call(coderoom_sandbox::CallError::Cancelled))
                if killed =>
            {
                return Ok(Outcome::Done(Executed {
                    exit_code: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    truncated: false,
                    timed_out: false,
                }))
            }
            Err(crate::sandbox::SandboxError::Call(coderoom_sandbox::CallError::Cancelled)) => {
                return Err(OpError::Refused(LAPSED.into()))
            }
            r => r?,
        };
        match reply {
            Reply::Exec {
                exit_code,
                stdout,
                stderr,
                truncated,
                timed_out,
            } => Ok(Outcome::Done(Executed {
                exit_code,
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
                truncated,
                timed_out,
            })),
            _ => Err(OpError::Internal),
        }
    }

    /// Sets (or clears, `None`) the command the room's sandbox runs (as `sh -c`) after every
    /// start or resume, before the room says it is ready; it takes effect at the next start.
    /// Setting one is running a command: decided like [`Ops::run_command`] for whoever sets it
    /// (so an agent that may not run commands cannot leave one to run later), charged one
    /// command, and recorded with the program, not the whole command line (which may hold
    /// anything). Clearing it needs `type`.
    pub(crate) async fn set_readiness(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        command: Option<String>,
        approval_id: Option<&str>,
    ) -> Result<Outcome<Option<String>>, OpError> {
        let command = command
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty());
        let Some(c) = command else {
            let details = json!({ "cleared": true });
            let cleared = Action::SetReadiness {
                params: String::new(),
                approval: None,
            };
            let entry = Entry::of(&cleared, Verdict::Allow, details);
            let change = Change::SetReadiness {
                room_id: room_id.clone(),
                command: None,
            };
            self.use_and_record(room_id, actor, Capability::Type, entry, change)
                .await?;
            return Ok(Outcome::Done(None));
        };
        if c.len() > MAX_READINESS_BYTES || c.contains('\0') {
            return Err(OpError::Bad(
                "command must be at most 4096 bytes, without NUL characters",
            ));
        }
        // The program, past any leading `NAME=value` assignments (which may hold a token).
        let details = json!({
            "program": c.split_whitespace().find(|w| !w.contains('=')).unwrap_or_default(),
            "bytes": c.len(),
        });
        self.moderated(room_id, actor).await?;
        self.may_meter(room_id, actor, &[Meter::Execs, Meter::SandboxSeconds])
            .await?;
        let params = json!({ "readiness": c }).to_string();
        let approval = self.presented(room_id, approval_id).await?;
        let action = Action::SetReadiness { params, approval };
        let allowed = match self.ask(room_id, actor, action, details.clone()).await? {
            Outcome::Done(a) => a,
            Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
        };
        let change = Change::SetReadiness {
            room_id: room_id.clone(),
            command: Some(c.clone()),
        };
        self.commit_commands(room_id, allowed, details, 1, change)
            .await?;
        Ok(Outcome::Done(Some(c)))
    }
}

/// A call's stop switch, cancelled when its caller may no longer do what it asked in the room
/// (run a command, export); the watch ends when this is dropped (the call is over) or with the
/// switch.
#[derive(Debug)]
pub(crate) struct Lapse {
    pub(crate) stop: tokio_util::sync::CancellationToken,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Lapse {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Ops {
    /// A switch cancelled once `actor` may no longer use `cap` in the room: removed, its
    /// account revoked (which removes it everywhere), `cap` taken away, or, for an agent, its
    /// sponsor gone. Subscribed at once, so no change after this call is missed; each change of
    /// the actor's rights there is looked up as every door decides it.
    pub(crate) fn when_right_lapses(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        cap: Capability,
    ) -> Lapse {
        let stop = tokio_util::sync::CancellationToken::new();
        self.when_right_lapses_into(room_id, actor, cap, stop)
    }

    /// [`Ops::when_right_lapses`], cancelling `stop` (which others may cancel too).
    fn when_right_lapses_into(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        cap: Capability,
        stop: tokio_util::sync::CancellationToken,
    ) -> Lapse {
        let mut changes = self.access_changed.subscribe();
        let (ops, room, actor, switch) =
            (self.clone(), room_id.clone(), actor.clone(), stop.clone());
        let watch = tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match changes.recv().await {
                    Ok(c) if c.room == room && c.user == actor.id.as_str() => {}
                    Ok(_) => continue,
                    // Some changes were missed: look.
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                }
                if !ops.may_still(&room, &actor, cap).await {
                    tracing::info!(room = %room, user = %actor.id, right = cap.as_str(), "a call's caller lost the right to make it; stopping it");
                    switch.cancel();
                    return;
                }
            }
        });
        Lapse { stop, watch }
    }
}

/// How long the sandbox has to end a participant's processes.
const STOP_UNITS_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

impl Ops {
    /// Ends what participants run in a room's sandbox once they may no longer run anything
    /// there (removed, revoked, `type` taken away, an agent whose sponsor is gone): their
    /// commands' processes and the terminal jobs they started (see the agent's units). Runs
    /// for the server's life, on every change of anyone's rights.
    pub(crate) fn stop_units_that_lapse(&self) {
        let mut changes = self.access_changed.subscribe();
        let ops = self.clone();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match changes.recv().await {
                    Ok(c) => {
                        let ops = ops.clone();
                        tokio::spawn(async move { ops.stop_if_lapsed(&c.room, &c.user).await });
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "changes of rights missed: processes of those who lost them are not stopped");
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
    }

    async fn stop_if_lapsed(&self, room_id: &RoomId, user: &str) {
        let Ok(actor) = self.actor(user, "").await else {
            return;
        };
        if !self.may_still(room_id, &actor, Capability::Type).await {
            self.stop_units(room_id, user, "its right to run commands ended")
                .await;
        }
    }

    /// Whether `actor` may still use `cap` in the room, as every door decides it; when storage
    /// cannot say now, yes (nothing is stopped on a guess: the next change looks again).
    async fn may_still(&self, room_id: &RoomId, actor: &Actor, cap: Capability) -> bool {
        match self.rights(room_id, actor, cap).await {
            Ok((rights, _)) => rights.may_act(self.now_ms()),
            Err(OpError::NotFound) => false,
            Err(_) => true,
        }
    }

    /// Ends every process that runs for `user` in the room's sandbox, if it is running.
    pub(crate) async fn stop_units(&self, room_id: &RoomId, user: &str, why: &str) {
        let op = Op::StopUnits {
            actor: user.to_owned(),
        };
        match self.sandboxes.peek(room_id, op, STOP_UNITS_WITHIN).await {
            Ok(Reply::Stopped { processes }) if processes > 0 => {
                tracing::info!(room = %room_id, user, processes, why, "stopped what a participant ran");
            }
            Ok(_) | Err(crate::sandbox::SandboxError::Stopped) => {}
            Err(e) => {
                tracing::warn!(room = %room_id, user, error = %e, "cannot stop what a participant ran");
            }
        }
    }
}

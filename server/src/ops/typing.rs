//! Typing into the room's shared terminal: one operation for the terminal socket and MCP
//! `terminal_send`. Keys reach the terminal only from someone holding `type` (others' keys are
//! refused, their refusals recorded in batches), through the floor (the hub's), and from an
//! agent only as code it may run: in a moderated room while someone who can approve is there,
//! each line it ends charged as a command (Enter, Ctrl-J, Ctrl-O, pasted lines:
//! `terminal::lines`), and, in approval mode, each line held until it ends and typed only
//! with someone's approval of exactly that line (a line waiting for one is dropped, never run;
//! typed again once approved, it runs).

use crate::ids::RoomId;
use crate::ops::approvals::Allowed;
use crate::ops::record::{Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::spend::Meter;
use crate::store::Change;
use crate::terminal::lines::{LineScanner, INTERRUPT};
use crate::terminal::Hub;
use bytes::Bytes;
use coderoom_authz::{Action, Capability};
use coderoom_sandbox::proto::RunInput;
use serde_json::json;
use std::time::Duration;

/// A typist without `type` gets its refusals recorded at most this often (with a count), so a
/// held-down key cannot flood the audit chain.
const DENIAL_RECORD_EVERY: Duration = Duration::from_secs(10);
/// Longest line an agent in approval mode may hold before it ends.
const MAX_HELD_LINE: usize = 64 << 10;

/// One typist at one terminal seat (a socket, an MCP call): who types, where, and what the
/// typing so far left open.
pub(crate) struct Typist {
    pub(crate) actor: Actor,
    /// How the typist's keys are attributed in the terminal and its recording.
    name: String,
    seat: Seat,
    scanner: LineScanner,
    /// An agent in approval mode: its line so far, not yet typed.
    held: Vec<u8>,
    denials: Denials,
}

/// What became of typed keys.
#[derive(Debug)]
pub(crate) enum Typed {
    /// Handed to the terminal (or held until their line ends); `commands` lines were charged.
    Sent { commands: u64 },
    /// Refused, none of it typed: the reason, for the typist.
    Refused(String),
    /// The typist may not type in this room (recorded).
    NoType,
    /// A line waits for this approval: it was dropped, not typed.
    Pending(String),
}

/// Where a typist's keys go.
enum Seat {
    /// The room's shared terminal, through the floor.
    Terminal { hub: Hub, viewer: u64 },
    /// A command of the typist's own that takes input (its standard input or its terminal).
    Command(tokio::sync::mpsc::Sender<RunInput>),
}

impl Typist {
    pub(crate) fn new(actor: Actor, hub: Hub, viewer: u64) -> Typist {
        Typist::at(actor, Seat::Terminal { hub, viewer })
    }

    /// Typing into a command of the typist's own that runs with input (`to` feeds it): the
    /// same decisions as at the room's terminal (an agent's lines charged as commands, and in
    /// approval mode each one typed only once approved).
    pub(crate) fn at_command(actor: Actor, to: tokio::sync::mpsc::Sender<RunInput>) -> Typist {
        Typist::at(actor, Seat::Command(to))
    }

    fn at(actor: Actor, seat: Seat) -> Typist {
        Typist {
            name: actor.email.clone(),
            actor,
            seat,
            scanner: LineScanner::default(),
            held: Vec::new(),
            denials: Denials::default(),
        }
    }

    /// Attributed as `name` instead of the account's email (an agent, by its name).
    pub(crate) fn shown_as(mut self, name: String) -> Typist {
        self.name = name;
        self
    }

    async fn send(&self, data: Bytes) {
        match &self.seat {
            Seat::Terminal { hub, viewer } => {
                hub.input(*viewer, (&self.actor.id, &self.name), data).await;
            }
            Seat::Command(to) => {
                // A command that ended, or is not reading, takes no more.
                let _ = to.send(RunInput::Data(data.to_vec().into())).await;
            }
        }
    }
}

impl Ops {
    /// Types `data` as `typist`. `may_type`: whether the typist holds `type` now, as its door
    /// keeps it current (the terminal socket follows every change of rights).
    pub(crate) async fn type_keys(
        &self,
        room_id: &RoomId,
        typist: &mut Typist,
        may_type: bool,
        data: Bytes,
    ) -> Result<Typed, OpError> {
        if !may_type {
            typist.denials.add(data.len());
            if typist.denials.due() {
                self.record_denials(room_id, typist).await;
            }
            return Ok(Typed::NoType);
        }
        if !typist.actor.is_agent() {
            typist.send(data).await;
            return Ok(Typed::Sent { commands: 0 });
        }
        if let Err(OpError::Refused(why)) = self.moderated(room_id, &typist.actor).await {
            return Ok(Typed::Refused(why));
        }
        if typist.actor.needs_approvals() {
            return self.type_approved(room_id, typist, &data).await;
        }
        let commands = typist.scanner.commands(&data);
        if let Some(refused) = self.charge_typed(room_id, typist, commands, None).await? {
            return Ok(refused);
        }
        typist.send(data).await;
        Ok(Typed::Sent { commands })
    }

    /// An agent in approval mode: each line typed only once approved.
    async fn type_approved(
        &self,
        room_id: &RoomId,
        typist: &mut Typist,
        data: &[u8],
    ) -> Result<Typed, OpError> {
        let mut start = 0;
        let mut charged = 0;
        for piece in typist.scanner.split(data) {
            let part = &data[start..piece.end];
            start = piece.end;
            if !piece.runs {
                if part.contains(&INTERRUPT) {
                    // Ctrl-C: the held line is dropped, and the shell told.
                    typist.held.clear();
                    typist.send(Bytes::from_static(&[INTERRUPT])).await;
                    continue;
                }
                typist.held.extend_from_slice(part);
                if typist.held.len() > MAX_HELD_LINE {
                    typist.held.clear();
                    return Ok(Typed::Refused(
                        "the line is too long to ask for an approval; it was dropped".into(),
                    ));
                }
                continue;
            }
            let mut line = std::mem::take(&mut typist.held);
            line.extend_from_slice(part);
            let text = String::from_utf8_lossy(&line).into_owned();
            let params = json!({ "terminal": text }).to_string();
            let approval = self
                .granted(room_id, &typist.actor.id, "run_command", &params)
                .await?;
            if let Some(refused) = self
                .charge_typed(room_id, typist, piece.commands, Some((params, approval)))
                .await?
            {
                return Ok(refused);
            }
            charged += piece.commands;
            typist.send(Bytes::from(line)).await;
        }
        Ok(Typed::Sent { commands: charged })
    }

    /// Decides, charges and records `commands` commands typed by an agent (with the line and
    /// the approval it may rest on, in approval mode): `Some` when they may not run.
    async fn charge_typed(
        &self,
        room_id: &RoomId,
        typist: &Typist,
        commands: u64,
        line: Option<(String, Option<coderoom_authz::Approval>)>,
    ) -> Result<Option<Typed>, OpError> {
        if commands == 0 {
            return Ok(None);
        }
        let actor = &typist.actor;
        let allowed = async {
            self.may_meter(room_id, actor, &[Meter::Execs, Meter::SandboxSeconds])
                .await?;
            // What was typed is the typist's own content: the record says how much, not what.
            let details = json!({ "terminal": true, "commands": commands });
            let allowed = match line {
                Some((params, approval)) => {
                    let action = Action::RunCommand { params, approval };
                    match self.ask(room_id, actor, action, details.clone()).await? {
                        Outcome::Done(allowed) => allowed,
                        Outcome::Pending(id) => return Ok(Some(Typed::Pending(id))),
                    }
                }
                None => {
                    let action = Action::RunCommand {
                        params: String::new(),
                        approval: None,
                    };
                    let proof = self
                        .authorize(room_id, actor, action, details.clone())
                        .await?;
                    Allowed {
                        proof,
                        approval: String::new(),
                    }
                }
            };
            self.commit_commands(room_id, allowed, details, commands, Change::None)
                .await?;
            Ok(None)
        };
        match allowed.await {
            Err(OpError::Refused(why)) => Ok(Some(Typed::Refused(why))),
            Err(OpError::Spent(e)) => Ok(Some(Typed::Refused(e.to_string()))),
            other => other,
        }
    }

    /// Typed commands the floor refused (nothing reached the shell): their charge is given
    /// back.
    pub(crate) fn untyped(&self, room_id: &RoomId, typist: &Typist, commands: u64) {
        self.spend
            .refund(room_id, &typist.actor.id, Meter::Execs, commands);
    }

    /// The typist is done: refusals not yet recorded are.
    pub(crate) async fn leave_terminal(&self, room_id: &RoomId, mut typist: Typist) {
        self.record_denials(room_id, &mut typist).await;
        if let Seat::Terminal { hub, viewer } = &typist.seat {
            self.sandboxes.leave(room_id, hub, *viewer).await;
        }
    }

    async fn record_denials(&self, room_id: &RoomId, typist: &mut Typist) {
        let Some(details) = typist.denials.take() else {
            return;
        };
        let action = Action::Use(Capability::Type);
        let reason = coderoom_authz::DenyReason::Missing(Capability::Type).to_string();
        let entry = Entry::of(&action, Verdict::Deny, details).because(reason);
        if let Err(e) = self
            .record(room_id, &typist.actor.id, entry, Change::None)
            .await
        {
            tracing::error!(error = ?e, "cannot record refused terminal input");
        }
    }
}

/// Refused input of one typist, recorded in batches.
#[derive(Default)]
struct Denials {
    last: Option<tokio::time::Instant>,
    chunks: u64,
    bytes: u64,
}

impl Denials {
    fn add(&mut self, bytes: usize) {
        self.chunks += 1;
        self.bytes += bytes as u64;
    }

    fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= DENIAL_RECORD_EVERY)
    }

    fn take(&mut self) -> Option<serde_json::Value> {
        if self.chunks == 0 {
            return None;
        }
        self.last = Some(tokio::time::Instant::now());
        let details = json!({ "chunks": self.chunks, "bytes": self.bytes });
        self.chunks = 0;
        self.bytes = 0;
        Some(details)
    }
}

//! Readiness: the room's readiness command, run beside everything else after a start,
//! unless the workspace was restored from one in which it had completed.

use super::{Actor, Cmd, Life, Readiness, SandboxError};
use crate::terminal::TermEvent;
use coderoom_sandbox::proto::{Op, Reply};
use coderoom_sandbox::Sandbox;
use std::time::Duration;

/// Longest a readiness command may run.
const READINESS_MS: u64 = 10 * 60 * 1000;
/// How much of a failed readiness command's output is kept (its end).
const READINESS_OUTPUT: usize = 8 << 10;

impl Actor {
    /// Runs the room's readiness command in the sandbox just started, unless the workspace was
    /// restored from one in which that same command had completed. It runs beside whatever
    /// else the room does (the terminal and commands work meanwhile); its outcome comes back
    /// as [`Cmd::Prepared`].
    pub(super) async fn begin_readiness(
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
                let first_sync = self.first_sync.clone();
                tokio::spawn(async move {
                    // The step prepares the project: it runs once the project's files are in.
                    first_sync.wait().await;
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
    pub(super) async fn prepared(
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
    pub(super) fn ready_for(&self) -> Option<String> {
        match &self.readiness {
            Readiness::Ready { command, .. } => Some(command.clone()),
            _ => None,
        }
    }
}

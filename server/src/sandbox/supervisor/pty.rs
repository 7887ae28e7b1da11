//! The shared terminal: the running sandbox's PTY linked to the room's hub, and viewers
//! joining it.

use super::{Actor, Life, SandboxError};
use crate::close::CloseCode;
use crate::terminal::hub::pty_port;
use crate::terminal::{Hub, Joined, Link, TermEvent};
use coderoom_sandbox::proto::{AgentError, Op};
use coderoom_sandbox::{Backend, CallError};
use std::time::Duration;
use tokio::sync::oneshot;

/// What a viewer who may not start the sandbox sees while it is not running.
const NOT_STARTED: &str = "the sandbox is not running: someone who may type starts it";

impl Actor {
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
    pub(super) async fn open_terminal(&mut self) {
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
    pub(super) async fn reopen_pty(&mut self) {
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
    pub(super) async fn join(
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

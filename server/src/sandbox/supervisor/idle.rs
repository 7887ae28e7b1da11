//! The idle stop: a durable timer per room (in the `sandboxes` table), armed while nobody
//! watches the terminal and pushed back by activity, and one scheduler for every room that
//! fires the due ones, those armed before a restart too.

use super::{Actor, Cmd, Life, Sandboxes};
use crate::store::SandboxState;
use serde_json::{json, Value};
use std::time::Duration;

/// How often the idle scheduler looks for due timers.
const IDLE_POLL: Duration = Duration::from_millis(250);
/// The idle timer is re-armed in the database at most this often while operations arrive.
const REARM_EVERY_MS: i64 = 1000;
/// Idle stops whose snapshot fails before the sandbox is stopped without one.
const IDLE_STOP_ATTEMPTS: u32 = 3;

impl Sandboxes {
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
}

impl Actor {
    pub(super) fn idle_ms(&self) -> i64 {
        i64::try_from(self.deps().cfg.sandbox_idle_ms).unwrap_or(i64::MAX / 2)
    }

    pub(super) async fn idle_due(&mut self) {
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
    pub(super) async fn arm(&mut self, stop_at: Option<i64>) {
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
    pub(super) async fn touch(&mut self) {
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
}

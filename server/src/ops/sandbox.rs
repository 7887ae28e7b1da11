//! Starting and stopping the room's sandbox: one operation with one set of rights, however it
//! is asked for (`POST .../sandbox/start`, opening the terminal, an MCP call). Starting needs
//! `type` (it runs the room's code, its readiness step included) and, in a room with a budget,
//! `spend` and sandbox time left; stopping needs `type` (it changes what everyone's terminal
//! runs in).

use crate::ids::RoomId;
use crate::ops::{Actor, OpError, Ops};
use crate::sandbox::SandboxStatus;
use crate::spend::Meter;
use crate::terminal::{Hub, Joined};
use coderoom_authz::{Action, Capability};
use serde_json::json;

impl Ops {
    /// Starts the room's sandbox (a running one stays as it is) as `actor`. A refusal is
    /// recorded.
    pub(crate) async fn start_sandbox(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<SandboxStatus, OpError> {
        let details = json!({ "sandbox": "start" });
        let proof = self
            .authorize(room_id, actor, Action::Use(Capability::Type), details)
            .await?;
        self.may_meter(room_id, actor, &[Meter::SandboxSeconds])
            .await?;
        Ok(self.sandboxes.start(room_id, proof.actor()).await?)
    }

    /// Snapshots and stops the room's sandbox as `actor`. A refusal is recorded.
    pub(crate) async fn stop_sandbox(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<SandboxStatus, OpError> {
        let details = json!({ "sandbox": "stop" });
        let proof = self
            .authorize(room_id, actor, Action::Use(Capability::Type), details)
            .await?;
        Ok(self.sandboxes.stop(room_id, proof.actor()).await?)
    }

    /// Attaches `actor` to the room's sandbox (an E2B "create"): started, as
    /// [`Ops::start_sandbox`] does, when the actor may start it; anyone else finds what is
    /// there (a stopped sandbox stays stopped), as with the terminal and files.
    pub(crate) async fn attach_sandbox(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<(), OpError> {
        if self.may_start_sandbox(room_id, actor).await {
            self.start_sandbox(room_id, actor).await?;
        }
        Ok(())
    }

    /// Whether `actor` may start the sandbox now, asked without recording anything (a viewer
    /// opening the terminal attempts nothing): the same rights as [`Ops::start_sandbox`].
    pub(crate) async fn may_start_sandbox(&self, room_id: &RoomId, actor: &Actor) -> bool {
        let Ok(caps) = self.capabilities(room_id, actor).await else {
            return false;
        };
        if !caps.contains(Capability::Type) {
            return false;
        }
        match self.spend.has_budget(room_id).await {
            Ok(false) => {}
            Ok(true) if caps.contains(Capability::Spend) => {}
            _ => return false,
        }
        matches!(
            self.spend
                .check(room_id, &actor.id, &[Meter::SandboxSeconds])
                .await,
            Ok(Ok(()))
        )
    }

    /// Joins the room's terminal as `actor` (at `cols` x `rows`): the sandbox is started for
    /// it only when it may start it; anyone else watches what is there (a stopped sandbox
    /// stays stopped, and they are told so).
    pub(crate) async fn join_terminal(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        (cols, rows): (u16, u16),
    ) -> Result<(Hub, Joined), OpError> {
        let start = self.may_start_sandbox(room_id, actor).await;
        Ok(self.sandboxes.join(room_id, cols, rows, start).await?)
    }
}

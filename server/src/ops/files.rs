//! Workspace files: read (`observe`), written and removed (`edit`) in the sandbox's workspace
//! (REST `/files`), or written through the room's document (MCP `write_file`, `edit_file`).
//! One decision for each, whichever door; a refusal is recorded under the capability's name.
//! A file operation starts a stopped sandbox only for someone who may start it
//! ([`Ops::may_start_sandbox`]); anyone else finds it stopped.

use crate::ids::RoomId;
use crate::ops::commands::workspace_path;
use crate::ops::{Actor, OpError, Ops};
use coderoom_authz::{Action, Capability};
use coderoom_sandbox::path::WorkspacePath;
use coderoom_sandbox::proto::{Op, Reply};
use serde_json::json;
use std::time::Duration;

/// Time a file operation may take.
const FILE_WITHIN: Duration = Duration::from_secs(30);

impl Ops {
    /// Decides `cap` on workspace path `raw` for `actor` (`bytes`: the size of what a write
    /// puts there): the checked path.
    pub(crate) async fn may_touch_file(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        raw: &str,
        cap: Capability,
        bytes: Option<usize>,
    ) -> Result<WorkspacePath, OpError> {
        let path = workspace_path(raw)?;
        let mut details = json!({ "path": path.as_str() });
        if let Some(n) = bytes {
            details["bytes"] = json!(n);
        }
        self.authorize(room_id, actor, Action::Use(cap), details)
            .await?;
        Ok(path)
    }

    /// Runs the file operation `make` builds for path `raw` in the room's sandbox, once `cap`
    /// is decided for `actor` (see [`Ops::may_touch_file`]).
    pub(crate) async fn file_op(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        (raw, cap, bytes): (&str, Capability, Option<usize>),
        make: impl FnOnce(String) -> Op,
    ) -> Result<Reply, OpError> {
        let path = self.may_touch_file(room_id, actor, raw, cap, bytes).await?;
        let op = make(path.as_str().to_owned());
        let changes = matches!(op, Op::WriteFile { .. } | Op::RemoveFile { .. });
        let reply = self.in_workspace(room_id, actor, op).await?;
        if changes {
            // Answered once the document holds the change (a text file the sync mirrors):
            // a server killed right after the answer keeps it, as it keeps an edit.
            self.sandboxes.settle(room_id).await;
        }
        Ok(reply)
    }

    /// [`Ops::file_op`] where the path may also be the workspace itself (empty): asking what
    /// is there, listing it.
    pub(crate) async fn entry_op(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        at: (&str, Capability),
        make: impl FnOnce(String) -> Op,
    ) -> Result<Reply, OpError> {
        let op = make(self.may_touch_entry(room_id, actor, at).await?);
        self.in_workspace(room_id, actor, op).await
    }

    /// [`Ops::entry_op`] that neither starts the room's sandbox nor keeps it awake: a look
    /// repeated on its own (a directory watch); a stopped sandbox answers
    /// [`crate::sandbox::SandboxError::Stopped`].
    pub(crate) async fn entry_peek(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        at: (&str, Capability),
        make: impl FnOnce(String) -> Op,
    ) -> Result<Reply, OpError> {
        let op = make(self.may_touch_entry(room_id, actor, at).await?);
        Ok(self.sandboxes.peek(room_id, op, FILE_WITHIN).await?)
    }

    /// [`Ops::may_touch_file`] for a path that may be the workspace itself (empty).
    async fn may_touch_entry(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        (raw, cap): (&str, Capability),
    ) -> Result<String, OpError> {
        if raw.is_empty() {
            self.authorize(room_id, actor, Action::Use(cap), json!({ "path": "" }))
                .await?;
            return Ok(String::new());
        }
        let path = self.may_touch_file(room_id, actor, raw, cap, None).await?;
        Ok(path.as_str().to_owned())
    }

    /// Renames workspace entry `from` to `to`: `edit` on both.
    pub(crate) async fn move_entry(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        from: &str,
        to: &str,
    ) -> Result<Reply, OpError> {
        let from = self
            .may_touch_file(room_id, actor, from, Capability::Edit, None)
            .await?;
        let to = self
            .may_touch_file(room_id, actor, to, Capability::Edit, None)
            .await?;
        let op = Op::Move {
            from: from.as_str().to_owned(),
            to: to.as_str().to_owned(),
        };
        let reply = self.in_workspace(room_id, actor, op).await?;
        // As a write: answered once the document holds the move.
        self.sandboxes.settle(room_id).await;
        Ok(reply)
    }

    /// Runs a decided file operation: a stopped sandbox is started only for someone who may
    /// start it.
    async fn in_workspace(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        op: Op,
    ) -> Result<Reply, OpError> {
        Ok(if self.may_start_sandbox(room_id, actor).await {
            self.sandboxes.op(room_id, op, FILE_WITHIN).await?
        } else {
            self.sandboxes.peek(room_id, op, FILE_WITHIN).await?
        })
    }
}

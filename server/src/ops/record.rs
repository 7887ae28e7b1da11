//! Typed audit entries: what an operation records. The act is named by `coderoom_authz`
//! (`Action::name`) or, for acts `decide` has no variant of, by [`Act`]; the decision is a
//! [`Verdict`]. So one act has one name in a chain, whether it was refused, asked for or done.

use crate::audit::Locked;
use crate::ops::{OpError, Ops};
use crate::store::Change;
use coderoom_authz::audit::Record;
use coderoom_authz::Action;
use serde_json::Value;

/// How an act came out, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Done.
    Allow,
    /// Refused (nothing changed).
    Deny,
    /// Waits for someone's approval (the request is stored).
    NeedsApproval,
    /// A request approved (by the record's actor).
    Approve,
    /// A request refused (by the record's actor).
    Reject,
}

impl Verdict {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::NeedsApproval => "needs_approval",
            Verdict::Approve => "approve",
            Verdict::Reject => "reject",
        }
    }
}

/// The room operations `coderoom_authz::Action` has no variant of (they are decided as a
/// `Use` of one capability, or not at all), named for the audit chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    CreateRoom,
    SetModeration,
    SetEgress,
    RevokePreview,
    ActivatePreview,
    SetSecretsPolicy,
    RemoveSecret,
    CreateAgent,
    RevokeAgent,
    BudgetReached,
    RevokeInvite,
    RevokeUser,
    RestoreUser,
    RoomDeleted,
    CreateCheckpoint,
    PruneCheckpoint,
    RestoreCheckpointFailed,
    SetCheckpointPolicy,
    ConnectRepo,
    PullRepo,
    PushRepo,
    DisconnectRepo,
    ToolCall,
    CreateFile,
    RenameFile,
    MoveFile,
    DeleteFile,
    RestoreFile,
    FileOpsUnrecorded,
}

impl Act {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Act::CreateRoom => "create_room",
            Act::SetModeration => "set_moderation",
            Act::SetEgress => "set_egress",
            Act::RevokePreview => "revoke_preview",
            Act::ActivatePreview => "activate_preview",
            Act::SetSecretsPolicy => "set_secrets_policy",
            Act::RemoveSecret => "remove_secret",
            Act::CreateAgent => "create_agent",
            Act::RevokeAgent => "revoke_agent",
            Act::BudgetReached => "budget_reached",
            Act::RevokeInvite => "revoke_invite",
            Act::RevokeUser => "revoke_user",
            Act::RestoreUser => "restore_user",
            Act::RoomDeleted => "room_deleted",
            Act::CreateCheckpoint => "create_checkpoint",
            Act::PruneCheckpoint => "prune_checkpoint",
            Act::RestoreCheckpointFailed => "restore_checkpoint_failed",
            Act::SetCheckpointPolicy => "set_checkpoint_policy",
            Act::ConnectRepo => "connect_repo",
            Act::PullRepo => "pull_repo",
            Act::PushRepo => "push_repo",
            Act::DisconnectRepo => "disconnect_repo",
            Act::ToolCall => "tool_call",
            Act::CreateFile => "create_file",
            Act::RenameFile => "rename_file",
            Act::MoveFile => "move_file",
            Act::DeleteFile => "delete_file",
            Act::RestoreFile => "restore_file",
            Act::FileOpsUnrecorded => "file_operations_unrecorded",
        }
    }
}

/// One audit entry, before it is sealed into the chain.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) action: &'static str,
    pub(crate) verdict: Verdict,
    pub(crate) reason: String,
    pub(crate) details: Value,
}

impl Entry {
    /// An entry for a decided action, named as `coderoom_authz` names it.
    pub(crate) fn of(action: &Action, verdict: Verdict, details: Value) -> Entry {
        Entry {
            action: action.name(),
            verdict,
            reason: String::new(),
            details,
        }
    }

    /// An entry for one of the layer's own acts.
    pub(crate) fn act(act: Act, verdict: Verdict, details: Value) -> Entry {
        Entry {
            action: act.name(),
            verdict,
            reason: String::new(),
            details,
        }
    }

    /// With the reason a refusal gives.
    pub(crate) fn because(mut self, reason: String) -> Entry {
        self.reason = reason;
        self
    }
}

impl Ops {
    /// Performs `change` and records `entry` in `chain`, in one transaction, under `locked`.
    pub(crate) async fn write(
        &self,
        locked: &Locked<'_>,
        chain: &str,
        actor: &str,
        entry: Entry,
        change: Change,
    ) -> Result<Record, OpError> {
        Ok(locked
            .record(
                chain,
                actor,
                entry.action,
                entry.verdict.as_str(),
                &entry.reason,
                entry.details,
                change,
            )
            .await?)
    }

    /// [`Ops::write`], taking the lock for this one record.
    pub(crate) async fn record(
        &self,
        chain: &str,
        actor: &str,
        entry: Entry,
        change: Change,
    ) -> Result<Record, OpError> {
        let locked = self.audit.lock().await;
        self.write(&locked, chain, actor, entry, change).await
    }
}

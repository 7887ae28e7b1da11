//! The one error of the application layer. Each door renders it in its own protocol (an HTTP
//! status, a close code, an MCP tool error); `http/error.rs` is the HTTP one.

use crate::sandbox::SandboxError;
use crate::spend::Exhausted;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum OpError {
    /// No such room (or thing in it), or one the actor may not know of.
    #[error("not found")]
    NotFound,
    /// Refused by the room's policy; the reason is safe to show (it was recorded).
    #[error("{0}")]
    Refused(String),
    /// Bad input, said in a fixed sentence.
    #[error("{0}")]
    Bad(&'static str),
    /// Bad input, said in a sentence the server built (never from internal errors).
    #[error("{0}")]
    Invalid(String),
    /// What the request names no longer works (an invite link used up, expired or revoked).
    #[error("this link no longer works")]
    Gone,
    /// Metered work past a budget.
    #[error("{0}")]
    Spent(Exhausted),
    /// The request collides with the state of things (a merge conflict); the message says how.
    #[error("{0}")]
    Conflict(String),
    #[error("storage unavailable")]
    Store(#[from] StoreError),
    /// A repository's remote or the git work on it.
    #[error("{0}")]
    Repo(#[from] crate::repos::RepoError),
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
    #[error("internal error")]
    Internal,
}

impl OpError {
    /// An approval another request spent first: the action is refused as already decided.
    pub(crate) fn spent_approval(e: impl Into<OpError>) -> OpError {
        match e.into() {
            OpError::Store(StoreError::Conflict) => {
                OpError::Refused(coderoom_authz::DenyReason::AlreadyDecided.to_string())
            }
            e => e,
        }
    }
}

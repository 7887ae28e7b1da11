//! Who acts: a person, or an agent acting for its sponsor.

use crate::ops::{OpError, Ops};
use coderoom_authz::Principal;

/// An agent's standing: who answers for it, and whether each command it causes waits for a
/// person's approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sponsored {
    pub(crate) sponsor: String,
    pub(crate) approval_mode: bool,
}

/// Who asks for an operation, as every door names it: the account (a person's, or an agent's,
/// whose account is its token's) and, for an agent, its sponsor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Actor {
    pub(crate) id: crate::ids::UserId,
    pub(crate) email: String,
    pub(crate) agent: Option<Sponsored>,
    pub(crate) is_admin: bool,
}

impl Actor {
    /// As `coderoom_authz` knows it.
    pub(crate) fn principal(&self) -> Principal {
        Principal {
            user: self.id.to_string(),
            is_admin: self.is_admin,
        }
    }

    pub(crate) fn is_agent(&self) -> bool {
        self.agent.is_some()
    }

    /// An agent in approval mode: every command it causes waits for a person's approval.
    pub(crate) fn needs_approvals(&self) -> bool {
        self.agent.as_ref().is_some_and(|a| a.approval_mode)
    }
}

impl Ops {
    /// The actor behind an authenticated account (`id`, `email`): an agent when the account is
    /// one (its sponsor and mode read now).
    pub(crate) async fn actor(&self, id: &str, email: &str) -> Result<Actor, OpError> {
        let agent = self.store.agent(id).await?.map(|a| Sponsored {
            sponsor: a.sponsor.to_string(),
            approval_mode: a.approval_mode,
        });
        Ok(Actor {
            id: crate::ids::UserId::known(id),
            email: email.to_owned(),
            // An agent is never an admin, whatever its token's account is called.
            is_admin: agent.is_none() && self.admin_emails.iter().any(|e| e == email),
            agent,
        })
    }
}

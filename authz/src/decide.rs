//! The one decision function. Every HTTP route and every WebSocket message that acts on a room
//! asks it, and the code that performs an action requires the [`Authorized`] value it returns.

use crate::{Capability, CapabilitySet, RoomState};
use std::fmt;

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user id.
    pub user: String,
    /// A system admin: may remove anyone and confirm deletions, but sees no room content
    /// unless also a participant with `observe`.
    pub is_admin: bool,
}

/// What is being attempted, with the parameters the decision depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Use one capability on the room (read the document, send an edit, type, ...).
    Use(Capability),
    /// Create an invite link that will grant `grants` to whoever accepts it.
    CreateInvite {
        /// What the invite grants.
        grants: CapabilitySet,
    },
    /// Accept an invite created by `issuer` granting `grants`. Decided for the issuer's rights
    /// at acceptance time: an invite never grants more than its issuer still holds.
    AcceptInvite {
        /// The invite's creator.
        issuer: String,
        /// What the invite grants.
        grants: CapabilitySet,
    },
    /// Replace `target`'s rights with `after` (a role change, grant or revoke, built with
    /// [`crate::Participant::granting`] / [`crate::Participant::revoking`]). Compared capability
    /// by capability on how long each is held: anything held shorter (or not at all) is a
    /// lowering and needs `revoke`; anything held longer is a raise and the actor must hold that
    /// capability at least as long.
    ChangeParticipant {
        /// The participant whose rights change.
        target: String,
        /// The participant's rights afterwards.
        after: crate::Participant,
    },
    /// Remove `target` from the room.
    RemoveParticipant {
        /// The participant to remove.
        target: String,
    },
    /// Ask for the room to be deleted (an admin confirms).
    RequestDeletion,
    /// Export room content with `params` (canonical JSON). Needs `export` and an approval by
    /// another holder of `approve`, bound to exactly these parameters.
    Export {
        /// The export's parameters, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
    },
    /// Restore a checkpoint (`params`: canonical JSON naming it). Needs `edit` and `type` (it
    /// rewrites everyone's files and restarts the sandbox); where the room's policy asks for it
    /// (`approval_required`), also an approval by another holder of `approve`, bound to exactly
    /// these parameters.
    RestoreCheckpoint {
        /// The restore's parameters, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
        /// The room's policy asks for an approval.
        approval_required: bool,
    },
    /// Fork the room into a new one of the principal's own (`params`: canonical JSON naming the
    /// checkpoint). Needs `observe` plus `export`, or, without `export`, an approval by another
    /// holder of `approve`, bound to exactly these parameters.
    Fork {
        /// The fork's parameters, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
    },
    /// Add one rule to the room's egress allowlist (`params`: canonical JSON naming it). Holders
    /// of `approve` add it directly; holders of `edit` ask, and an approval by another holder of
    /// `approve`, bound to exactly this rule, lets them.
    AllowEgress {
        /// The rule, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
    },
    /// Replace a repository branch's history with the room's version (`params`: canonical JSON
    /// naming the repository, the branch and the commit message). Needs `edit` and an approval
    /// by another holder of `approve`, bound to exactly these parameters.
    ForcePush {
        /// The push's parameters, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
    },
    /// Add a secret to the room (`params`: canonical JSON of its rule, never its value). Needs
    /// `add_secret`; where the room's policy asks for it (`approval_required`), also an approval
    /// by another holder of `approve`, bound to exactly this rule.
    AddSecret {
        /// The secret's rule, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
        /// The room's policy asks for an approval.
        approval_required: bool,
    },
    /// Publish a preview to everyone (`params`: canonical JSON of its port, visibility and
    /// lifetime). Needs `publish` and always an approval by another holder of `approve`, bound to
    /// exactly these parameters.
    PublicPreview {
        /// The preview's parameters, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
    },
    /// Run a command in the room's sandbox. Needs `type`; an agent in approval mode also
    /// someone's approval of exactly that command.
    RunCommand {
        /// The command (argv and working directory), canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
    },
    /// Set the command the room's sandbox runs after every start (its readiness step). A
    /// command like any other: needs `type`; an agent in approval mode also someone's approval
    /// of exactly that command.
    SetReadiness {
        /// The command, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
    },
    /// Set the room's budget or an agent's (`params`: canonical JSON naming whose and the
    /// limits). Needs `spend`; a raise (a limit lifted or increased) also an approval by another
    /// holder of `approve`, bound to exactly these parameters.
    SetBudget {
        /// Whose budget and its limits, canonical JSON.
        params: String,
        /// The approval presented with the request, if any.
        approval: Option<Approval>,
        /// The change allows more than the budget in force.
        raise: bool,
    },
    /// Approve or deny a pending request.
    DecideApproval {
        /// The request being decided.
        approval: Approval,
    },
    /// Confirm a pending deletion.
    ConfirmDeletion,
}

impl Action {
    /// The approval this action presents, if it is one that can.
    pub fn approval(&self) -> Option<&Approval> {
        match self {
            Action::Export { approval, .. }
            | Action::RestoreCheckpoint { approval, .. }
            | Action::Fork { approval, .. }
            | Action::AllowEgress { approval, .. }
            | Action::ForcePush { approval, .. }
            | Action::AddSecret { approval, .. }
            | Action::PublicPreview { approval, .. }
            | Action::SetBudget { approval, .. }
            | Action::RunCommand { approval, .. }
            | Action::SetReadiness { approval, .. } => approval.as_ref(),
            Action::Use(_)
            | Action::CreateInvite { .. }
            | Action::AcceptInvite { .. }
            | Action::ChangeParticipant { .. }
            | Action::RemoveParticipant { .. }
            | Action::RequestDeletion
            | Action::DecideApproval { .. }
            | Action::ConfirmDeletion => None,
        }
    }

    /// The name recorded in the audit log.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Use(c) => c.as_str(),
            Action::CreateInvite { .. } => "create_invite",
            Action::AcceptInvite { .. } => "accept_invite",
            Action::ChangeParticipant { .. } => "change_participant",
            Action::RemoveParticipant { .. } => "remove_participant",
            Action::RequestDeletion => "request_deletion",
            Action::Export { .. } => "export",
            Action::RestoreCheckpoint { .. } => "restore_checkpoint",
            Action::Fork { .. } => "fork",
            Action::AllowEgress { .. } => "allow_egress",
            Action::ForcePush { .. } => "force_push",
            Action::AddSecret { .. } => "add_secret",
            Action::PublicPreview { .. } => "public_preview",
            Action::RunCommand { .. } => "run_command",
            Action::SetReadiness { .. } => "set_readiness",
            Action::SetBudget { .. } => "set_budget",
            Action::DecideApproval { .. } => "decide_approval",
            Action::ConfirmDeletion => "confirm_deletion",
        }
    }
}

/// Why an action was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// The principal is not a participant of the room.
    NotParticipant,
    /// The principal lacks this capability.
    Missing(Capability),
    /// The principal would hand out capabilities it does not hold.
    ExceedsOwn(CapabilitySet),
    /// The target is not a participant.
    NoSuchParticipant,
    /// The room would be left with nobody who can revoke.
    LastRevoker,
    /// Only system admins may do this.
    AdminOnly,
    /// A requester cannot approve its own request.
    SelfApproval,
    /// A sponsor cannot approve its agent's request where someone else's approval is needed.
    SponsorApproval,
    /// Agents never decide approvals.
    AgentApproval,
    /// The approval has expired.
    ApprovalExpired,
    /// The approval was already decided (or used).
    AlreadyDecided,
    /// The approval is for another action, requester or parameters, or was not granted.
    ApprovalMismatch,
    /// Agents never own rooms (a fork would be one no person can open).
    AgentOwner,
}

/// A request that needs someone else's approval, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The request id.
    pub id: String,
    /// Who asked.
    pub requester: String,
    /// The action's audit name.
    pub action: String,
    /// The exact parameters, canonical JSON.
    pub params: String,
    /// Unix ms after which the request (and an approval of it) is void.
    pub expires_at: i64,
    /// `(approver, approved)` once decided.
    pub decided: Option<(String, bool)>,
    /// Whether an approved request was already carried out (approvals are single use).
    pub used: bool,
}

/// What [`decide`] asks to be stored when an action needs approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// The action's audit name.
    pub action: &'static str,
    /// The exact parameters, canonical JSON.
    pub params: String,
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::NotParticipant => f.write_str("not a participant"),
            DenyReason::Missing(c) => write!(f, "missing capability {c}"),
            DenyReason::ExceedsOwn(caps) => {
                write!(
                    f,
                    "cannot grant what you do not hold: {}",
                    caps.names().join(",")
                )
            }
            DenyReason::NoSuchParticipant => f.write_str("no such participant"),
            DenyReason::LastRevoker => {
                f.write_str("the room must keep a participant who can revoke")
            }
            DenyReason::AdminOnly => f.write_str("system admins only"),
            DenyReason::SelfApproval => f.write_str("a requester cannot approve its own request"),
            DenyReason::SponsorApproval => f.write_str(
                "an agent's request needs another person who holds approve: its sponsor's approval \
                 is its own",
            ),
            DenyReason::AgentApproval => f.write_str("an agent cannot decide approvals"),
            DenyReason::ApprovalExpired => f.write_str("the request has expired"),
            DenyReason::AlreadyDecided => f.write_str("the request was already decided or used"),
            DenyReason::AgentOwner => f.write_str("an agent cannot make rooms: its sponsor can"),
            DenyReason::ApprovalMismatch => {
                f.write_str("the approval does not cover this action with these parameters")
            }
        }
    }
}

/// Proof that [`decide`] allowed an action. Only this module can make one, so code that
/// requires it cannot run without the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    action: Action,
    actor: String,
    actor_caps: CapabilitySet,
    /// The approval the decision rested on (checked: granted by someone else, for this action,
    /// requester and parameters), which the action's record must spend.
    approval: Option<String>,
}

impl Authorized {
    /// The id of the approval this decision rested on, if it needed one.
    pub fn approval(&self) -> Option<&str> {
        self.approval.as_deref()
    }

    /// The action that was allowed.
    pub fn action(&self) -> &Action {
        &self.action
    }

    /// The user it was allowed for.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// The actor's capabilities when it was decided.
    pub fn actor_capabilities(&self) -> CapabilitySet {
        self.actor_caps
    }
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Go ahead, holding this proof.
    Allow(Authorized),
    /// Refused, for this reason.
    Deny(DenyReason),
    /// Allowed once another holder of `approve` approves exactly this request.
    NeedsApproval(ApprovalRequest),
}

/// Decides whether `principal` may perform `action` on the room in `room` at `now`.
pub fn decide(principal: &Principal, action: &Action, room: &RoomState, now: i64) -> Decision {
    let caps = room.capabilities_of(&principal.user, now);
    let member = room.is_member(&principal.user);
    let need = |cap: Capability| -> Result<(), DenyReason> {
        if !member {
            Err(DenyReason::NotParticipant)
        } else if caps.contains(cap) {
            Ok(())
        } else {
            Err(DenyReason::Missing(cap))
        }
    };
    let within_own = |grants: CapabilitySet, holder: CapabilitySet| -> Result<(), DenyReason> {
        let excess = grants.minus(holder);
        if excess.is_empty() {
            Ok(())
        } else {
            Err(DenyReason::ExceedsOwn(excess))
        }
    };
    // A room always keeps someone who can revoke for good (not through a grant that lapses),
    // so it can never become unmanageable by its members.
    let keeps_revoker =
        |target: &str, after: Option<&crate::Participant>| -> Result<(), DenyReason> {
            let keeps = after.is_some_and(|p| p.holds_permanently(Capability::Revoke));
            if keeps || room.permanent_holders_besides(Capability::Revoke, target) > 0 {
                Ok(())
            } else {
                Err(DenyReason::LastRevoker)
            }
        };
    let result = match action {
        Action::Use(cap) => need(*cap),
        Action::CreateInvite { grants } => {
            need(Capability::Invite).and_then(|()| within_own(*grants, caps))
        }
        Action::AcceptInvite { issuer, grants } => {
            let issuer_caps = room.capabilities_of(issuer, now);
            if !issuer_caps.contains(Capability::Invite) {
                Err(DenyReason::Missing(Capability::Invite))
            } else {
                within_own(*grants, issuer_caps)
            }
        }
        Action::ChangeParticipant { target, after } => match room.participants.get(target) {
            _ if !member && !principal.is_admin => Err(DenyReason::NotParticipant),
            None => Err(DenyReason::NoSuchParticipant),
            Some(before) => {
                let actor = room.participants.get(&principal.user);
                let mut lowered = CapabilitySet::EMPTY;
                let mut beyond_actor = CapabilitySet::EMPTY;
                let mut raised = CapabilitySet::EMPTY;
                for cap in Capability::ALL {
                    let (was, will) = (before.until(cap, now), after.until(cap, now));
                    if will < was {
                        lowered = lowered.with(cap);
                    }
                    if will > was {
                        raised = raised.with(cap);
                        if actor.is_none_or(|a| a.until(cap, now) < will) {
                            beyond_actor = beyond_actor.with(cap);
                        }
                    }
                }
                let lower_ok = if !lowered.is_empty() && !principal.is_admin {
                    need(Capability::Revoke)
                } else {
                    Ok(())
                };
                lower_ok
                    .and_then(|()| {
                        if raised.is_empty() {
                            Ok(())
                        } else if !member {
                            Err(DenyReason::NotParticipant)
                        } else if !beyond_actor.is_empty() {
                            Err(DenyReason::ExceedsOwn(beyond_actor))
                        } else {
                            Ok(())
                        }
                    })
                    .and_then(|()| keeps_revoker(target, Some(after)))
            }
        },
        Action::RemoveParticipant { target } => {
            if !room.participants.contains_key(target) {
                Err(DenyReason::NoSuchParticipant)
            } else if principal.is_admin {
                Ok(())
            } else if *target == principal.user {
                // Leaving: anyone may, but the room's last permanent revoker, who hands over
                // first (or asks for the room's deletion).
                keeps_revoker(target, None)
            } else {
                need(Capability::Revoke).and_then(|()| keeps_revoker(target, None))
            }
        }
        Action::RequestDeletion => need(Capability::Delete),
        // Their approvals are checked below, once the capabilities hold.
        Action::Export { .. } => need(Capability::Export),
        Action::RestoreCheckpoint { .. } => {
            need(Capability::Edit).and_then(|()| need(Capability::Type))
        }
        // A room is a person's: an agent's fork would be a room no person can open.
        Action::Fork { .. } if room.agents.contains_key(&principal.user) => {
            Err(DenyReason::AgentOwner)
        }
        Action::Fork { .. } => need(Capability::Observe),
        Action::AllowEgress { .. } if caps.contains(Capability::Approve) => Ok(()),
        Action::AllowEgress { .. } | Action::ForcePush { .. } => need(Capability::Edit),
        Action::AddSecret { .. } => need(Capability::AddSecret),
        Action::PublicPreview { .. } => need(Capability::Publish),
        Action::RunCommand { .. } | Action::SetReadiness { .. } => need(Capability::Type),
        Action::SetBudget { .. } => need(Capability::Spend),
        Action::DecideApproval { approval } => need(Capability::Approve).and_then(|()| {
            if approval.requester == principal.user {
                Err(DenyReason::SelfApproval)
            } else if needs_another_person(&approval.action)
                && room.same_party(&approval.requester, &principal.user)
            {
                Err(DenyReason::SponsorApproval)
            } else if room.agents.contains_key(&principal.user) {
                // An approval is a person's judgement: an agent holding `approve` through its
                // sponsor would otherwise approve its sponsor's requests, or its own budget.
                Err(DenyReason::AgentApproval)
            } else if approval.expires_at <= now {
                Err(DenyReason::ApprovalExpired)
            } else if approval.decided.is_some() || approval.used {
                Err(DenyReason::AlreadyDecided)
            } else {
                Ok(())
            }
        }),
        Action::ConfirmDeletion => {
            if principal.is_admin {
                Ok(())
            } else {
                Err(DenyReason::AdminOnly)
            }
        }
    };
    // Actions bound to an approval: one must be presented, granted by someone else, for
    // exactly these parameters.
    let gated = match action {
        Action::Export { params, approval }
        | Action::RestoreCheckpoint {
            params,
            approval,
            approval_required: true,
        } => Some((params, approval)),
        Action::Fork { params, approval } if !caps.contains(Capability::Export) => {
            Some((params, approval))
        }
        Action::AllowEgress { params, approval } if !caps.contains(Capability::Approve) => {
            Some((params, approval))
        }
        Action::ForcePush { params, approval } | Action::PublicPreview { params, approval } => {
            Some((params, approval))
        }
        Action::AddSecret {
            params,
            approval,
            approval_required: true,
        }
        | Action::SetBudget {
            params,
            approval,
            raise: true,
        } => Some((params, approval)),
        Action::RunCommand { params, approval } | Action::SetReadiness { params, approval }
            if room
                .agents
                .get(&principal.user)
                .is_some_and(|a| a.approval_mode) =>
        {
            Some((params, approval))
        }
        _ => None,
    };
    let mut rested_on = None;
    let result = match (result, gated) {
        (Ok(()), Some((params, approval))) => {
            match approved(
                principal,
                action.name(),
                params,
                approval.as_ref(),
                room,
                now,
            ) {
                Some(r) => {
                    rested_on = approval.as_ref().map(|a| a.id.clone());
                    r
                }
                None => {
                    return Decision::NeedsApproval(ApprovalRequest {
                        action: action.name(),
                        params: params.clone(),
                    })
                }
            }
        }
        (result, _) => result,
    };
    match result {
        Ok(()) => Decision::Allow(Authorized {
            action: action.clone(),
            actor: principal.user.clone(),
            actor_caps: caps,
            approval: rested_on,
        }),
        Err(reason) => Decision::Deny(reason),
    }
}

/// Whether an approval of `action` must come from another person than the requester's own
/// party (the requester, and an agent's sponsor): the acts that need someone else's approval
/// whoever asks (an export, a restore where the room asks for one, a forced push, a public
/// preview, a secret where the room asks for one, a budget raise). Not the approvals that stand
/// in for a right the requester lacks (an egress ask without `approve`, a fork without
/// `export`), which a sponsor holding it may give, nor a command an agent in approval mode waits
/// on, which its sponsor, watching it, may approve.
pub fn needs_another_person(action: &str) -> bool {
    matches!(
        action,
        "export"
            | "restore_checkpoint"
            | "force_push"
            | "public_preview"
            | "add_secret"
            | "set_budget"
    )
}

/// Whether `a` was approved by someone its rules accept: never its requester, nor, where the
/// action needs another person, the requester's own party ([`RoomState::same_party`]).
pub fn granted_by_another(a: &Approval, room: &RoomState) -> bool {
    match &a.decided {
        Some((by, true)) => {
            *by != a.requester
                && !(needs_another_person(&a.action) && room.same_party(&a.requester, by))
        }
        _ => false,
    }
}

/// Whether `approval` lets `principal` do `action` with `params` now: `None` when there is none
/// (one must be asked for), else the verdict.
fn approved(
    principal: &Principal,
    action: &str,
    params: &str,
    approval: Option<&Approval>,
    room: &RoomState,
    now: i64,
) -> Option<Result<(), DenyReason>> {
    let a = approval?;
    let granted = granted_by_another(a, room);
    Some(if a.expires_at <= now {
        Err(DenyReason::ApprovalExpired)
    } else if a.used {
        Err(DenyReason::AlreadyDecided)
    } else if !granted || a.action != action || a.requester != principal.user || a.params != params
    {
        Err(DenyReason::ApprovalMismatch)
    } else {
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Grant, Participant, Role};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn user(u: &str) -> Principal {
        Principal {
            user: u.into(),
            is_admin: false,
        }
    }

    fn room(ps: &[(&str, Role)]) -> RoomState {
        RoomState {
            participants: ps
                .iter()
                .map(|(u, r)| ((*u).to_owned(), Participant::with_role(*r)))
                .collect(),
            agents: Default::default(),
        }
    }

    /// An approval ben asked for, for `action` with `params`, granted by ana, valid until 100.
    fn approved_by_ana(action: &str, params: &str) -> Approval {
        Approval {
            id: "1".into(),
            requester: "ben".into(),
            action: action.into(),
            params: params.into(),
            expires_at: 100,
            decided: Some(("ana".into(), true)),
            used: false,
        }
    }

    fn allowed(d: &Decision) -> bool {
        matches!(d, Decision::Allow(_))
    }

    /// An agent never decides an approval, whatever its sponsor holds: not its sponsor's
    /// requests, not its own budget.
    #[test]
    fn anyone_may_leave_but_the_last_owner() {
        let leave = |who: &str| Action::RemoveParticipant { target: who.into() };
        let r = room(&[
            ("ana", Role::Owner),
            ("ben", Role::Editor),
            ("cy", Role::Viewer),
        ]);
        assert!(allowed(&decide(&user("ben"), &leave("ben"), &r, 0)));
        assert!(allowed(&decide(&user("cy"), &leave("cy"), &r, 0)));
        // Leaving is not removing others.
        assert_eq!(
            decide(&user("ben"), &leave("cy"), &r, 0),
            Decision::Deny(DenyReason::Missing(Capability::Revoke))
        );
        // The last owner hands over first.
        assert_eq!(
            decide(&user("ana"), &leave("ana"), &r, 0),
            Decision::Deny(DenyReason::LastRevoker)
        );
        let two = room(&[("ana", Role::Owner), ("dan", Role::Owner)]);
        assert!(allowed(&decide(&user("ana"), &leave("ana"), &two, 0)));
    }

    /// Two owners, ana and ben, and `bot`, ana's agent given everything.
    fn owners_and_anas_bot(approval_mode: bool) -> RoomState {
        let mut r = room(&[("ana", Role::Owner), ("ben", Role::Owner)]);
        r.agents.insert(
            "bot".into(),
            crate::Agent {
                sponsor: "ana".into(),
                capabilities: CapabilitySet::of(&Capability::ALL),
                expires_at: 1_000,
                approval_mode,
            },
        );
        r
    }

    #[test]
    fn agents_never_decide_approvals() {
        let r = owners_and_anas_bot(false);
        let mut pending = approved_by_ana("set_budget", "{}");
        pending.requester = "ana".into();
        pending.decided = None;
        let decide_it = Action::DecideApproval { approval: pending };
        assert_eq!(
            decide(&user("bot"), &decide_it, &r, 0),
            Decision::Deny(DenyReason::AgentApproval)
        );
        assert!(allowed(&decide(&user("ben"), &decide_it, &r, 0)));
    }

    /// A readiness step is a command: `type`, and in approval mode an approval of exactly it;
    /// an agent makes no room, not even a fork of its own room.
    #[test]
    fn readiness_is_a_command_and_agents_make_no_rooms() {
        let mut r = room(&[("ana", Role::Owner)]);
        let agent = |caps: &[Capability], approval_mode| crate::Agent {
            sponsor: "ana".into(),
            capabilities: CapabilitySet::of(caps),
            expires_at: 1_000,
            approval_mode,
        };
        use Capability::{Edit, Observe, Type};
        r.agents
            .insert("careful".into(), agent(&[Observe, Edit, Type], true));
        r.agents.insert("watcher".into(), agent(&[Observe], false));
        r.agents
            .insert("helper".into(), agent(&[Observe, Edit, Type], false));
        let ready = Action::SetReadiness {
            params: r#"{"readiness":"npm ci"}"#.into(),
            approval: None,
        };
        assert_eq!(
            decide(&user("watcher"), &ready, &r, 0),
            Decision::Deny(DenyReason::Missing(Type))
        );
        assert!(matches!(
            decide(&user("careful"), &ready, &r, 0),
            Decision::NeedsApproval(ApprovalRequest {
                action: "set_readiness",
                ..
            })
        ));
        assert!(allowed(&decide(&user("helper"), &ready, &r, 0)));
        assert!(allowed(&decide(&user("ana"), &ready, &r, 0)));
        let fork = Action::Fork {
            params: "{}".into(),
            approval: None,
        };
        for bot in ["careful", "watcher", "helper"] {
            assert_eq!(
                decide(&user(bot), &fork, &r, 0),
                Decision::Deny(DenyReason::AgentOwner)
            );
        }
        assert!(allowed(&decide(&user("ana"), &fork, &r, 0)));
    }

    /// Budgets need `spend`; lowering one is immediate, a raise needs someone else's approval
    /// of exactly that budget, even an owner's.
    #[test]
    fn budget_raises_need_an_approval() {
        let r = room(&[("ana", Role::Owner), ("ben", Role::Editor)]);
        let params = r#"{"agent":null,"budget":{"execs":10}}"#.to_owned();
        let set = |approval, raise| Action::SetBudget {
            params: params.clone(),
            approval,
            raise,
        };
        assert!(allowed(&decide(&user("ana"), &set(None, false), &r, 0)));
        assert_eq!(
            decide(&user("ben"), &set(None, false), &r, 0),
            Decision::Deny(DenyReason::Missing(Capability::Spend))
        );
        assert!(matches!(
            decide(&user("ana"), &set(None, true), &r, 0),
            Decision::NeedsApproval(ApprovalRequest {
                action: "set_budget",
                ..
            })
        ));
        let mut by_ben = approved_by_ana("set_budget", &params);
        by_ben.requester = "ana".into();
        by_ben.decided = Some(("ben".into(), true));
        assert!(allowed(&decide(
            &user("ana"),
            &set(Some(by_ben.clone()), true),
            &r,
            50
        )));
        // Bound to exactly those limits.
        by_ben.params = r#"{"agent":null,"budget":{"execs":1000}}"#.into();
        assert!(!allowed(&decide(
            &user("ana"),
            &set(Some(by_ben), true),
            &r,
            50
        )));
    }

    /// A fork needs `observe` and `export`, or an approval by someone else for that checkpoint.
    #[test]
    fn forks_need_export_or_an_approval() {
        let r = room(&[("ana", Role::Owner), ("ben", Role::Editor)]);
        let params = r#"{"checkpoint":"c1"}"#.to_owned();
        let fork = |approval| Action::Fork {
            params: params.clone(),
            approval,
        };
        assert!(allowed(&decide(&user("ana"), &fork(None), &r, 0)));
        assert!(matches!(
            decide(&user("ben"), &fork(None), &r, 0),
            Decision::NeedsApproval(ApprovalRequest { action: "fork", .. })
        ));
        let approved = approved_by_ana("fork", &params);
        assert!(allowed(&decide(
            &user("ben"),
            &fork(Some(approved)),
            &r,
            50
        )));
        assert_eq!(
            decide(&user("zed"), &fork(None), &r, 0),
            Decision::Deny(DenyReason::NotParticipant)
        );
    }

    /// Owners open the network directly; editors ask and need someone else's approval of that
    /// very rule; viewers cannot ask. A force push always needs an approval, even an owner's.
    #[test]
    fn egress_asks_and_force_pushes_need_approvals() {
        let r = room(&[
            ("ana", Role::Owner),
            ("ben", Role::Editor),
            ("cy", Role::Viewer),
        ]);
        let params = r#"{"rule":"registry.npmjs.org"}"#.to_owned();
        let allow = |approval| Action::AllowEgress {
            params: params.clone(),
            approval,
        };
        assert!(allowed(&decide(&user("ana"), &allow(None), &r, 0)));
        assert!(matches!(
            decide(&user("ben"), &allow(None), &r, 0),
            Decision::NeedsApproval(ApprovalRequest {
                action: "allow_egress",
                ..
            })
        ));
        assert!(allowed(&decide(
            &user("ben"),
            &allow(Some(approved_by_ana("allow_egress", &params))),
            &r,
            50
        )));
        let other = approved_by_ana("allow_egress", r#"{"rule":"*"}"#);
        assert_eq!(
            decide(&user("ben"), &allow(Some(other)), &r, 50),
            Decision::Deny(DenyReason::ApprovalMismatch)
        );
        assert_eq!(
            decide(&user("cy"), &allow(None), &r, 0),
            Decision::Deny(DenyReason::Missing(Capability::Edit))
        );
        let push = r#"{"repo":"r1","branch":"main","message":"m"}"#.to_owned();
        let force = |approval| Action::ForcePush {
            params: push.clone(),
            approval,
        };
        assert!(matches!(
            decide(&user("ana"), &force(None), &r, 0),
            Decision::NeedsApproval(ApprovalRequest {
                action: "force_push",
                ..
            })
        ));
        assert!(allowed(&decide(
            &user("ben"),
            &force(Some(approved_by_ana("force_push", &push))),
            &r,
            50
        )));
    }

    /// A secret needs `add_secret`; where the room's policy asks, also someone else's approval
    /// of exactly that rule.
    #[test]
    fn secrets_need_an_approval_where_the_room_asks() {
        let r = room(&[("ana", Role::Owner), ("ben", Role::Editor)]);
        let params = r#"{"name":"KEY","hosts":["api.example.com"]}"#.to_owned();
        let add = |approval, approval_required| Action::AddSecret {
            params: params.clone(),
            approval,
            approval_required,
        };
        assert!(allowed(&decide(&user("ana"), &add(None, false), &r, 0)));
        assert!(matches!(
            decide(&user("ana"), &add(None, true), &r, 0),
            Decision::NeedsApproval(ApprovalRequest {
                action: "add_secret",
                ..
            })
        ));
        assert_eq!(
            decide(&user("ben"), &add(None, false), &r, 0),
            Decision::Deny(DenyReason::Missing(Capability::AddSecret))
        );
    }

    /// A restore needs `edit` and `type`; where the room's policy asks, also an approval by
    /// someone else for exactly that checkpoint (an approval for an export does not do).
    #[test]
    fn restores_need_edit_type_and_an_approval_where_the_room_asks() {
        let r = room(&[
            ("ana", Role::Owner),
            ("ben", Role::Editor),
            ("cy", Role::Viewer),
        ]);
        let params = r#"{"checkpoint":"c1"}"#.to_owned();
        let restore = |approval, approval_required| Action::RestoreCheckpoint {
            params: params.clone(),
            approval,
            approval_required,
        };
        assert!(allowed(&decide(&user("ben"), &restore(None, false), &r, 0)));
        assert_eq!(
            decide(&user("cy"), &restore(None, false), &r, 0),
            Decision::Deny(DenyReason::Missing(Capability::Edit))
        );
        assert!(matches!(
            decide(&user("ben"), &restore(None, true), &r, 0),
            Decision::NeedsApproval(ApprovalRequest {
                action: "restore_checkpoint",
                ..
            })
        ));
        let approved = approved_by_ana("restore_checkpoint", &params);
        assert!(allowed(&decide(
            &user("ben"),
            &restore(Some(approved.clone()), true),
            &r,
            50
        )));
        let for_export = Approval {
            action: "export".into(),
            ..approved.clone()
        };
        assert_eq!(
            decide(&user("ben"), &restore(Some(for_export), true), &r, 50),
            Decision::Deny(DenyReason::ApprovalMismatch)
        );
        let other = Approval {
            params: r#"{"checkpoint":"c2"}"#.into(),
            ..approved
        };
        assert_eq!(
            decide(&user("ben"), &restore(Some(other), true), &r, 50),
            Decision::Deny(DenyReason::ApprovalMismatch)
        );
    }

    /// An agent's request is its sponsor's: where someone else's approval is needed, its
    /// sponsor cannot give it (neither by deciding nor as an approval presented), another owner
    /// can; an approval-mode command, which waits for a person, its sponsor may approve.
    #[test]
    fn an_agents_sponsor_is_not_someone_else() {
        let r = owners_and_anas_bot(true);
        let pending = |action: &str| Approval {
            id: "1".into(),
            requester: "bot".into(),
            action: action.into(),
            params: "{}".into(),
            expires_at: 100,
            decided: None,
            used: false,
        };
        let decide_it = |by: &str, a: Approval| {
            decide(&user(by), &Action::DecideApproval { approval: a }, &r, 0)
        };
        for action in [
            "public_preview",
            "export",
            "set_budget",
            "restore_checkpoint",
        ] {
            assert_eq!(
                decide_it("ana", pending(action)),
                Decision::Deny(DenyReason::SponsorApproval),
                "{action}"
            );
            assert!(allowed(&decide_it("ben", pending(action))), "{action}");
        }
        for action in ["run_command", "allow_egress"] {
            assert!(allowed(&decide_it("ana", pending(action))), "{action}");
        }
        // An approval its sponsor granted (stored before this rule, say) lets nothing run.
        let by_sponsor = Approval {
            action: "export".into(),
            decided: Some(("ana".into(), true)),
            ..pending("export")
        };
        assert!(!granted_by_another(&by_sponsor, &r));
        let export = Action::Export {
            params: "{}".into(),
            approval: Some(by_sponsor.clone()),
        };
        assert_eq!(
            decide(&user("bot"), &export, &r, 0),
            Decision::Deny(DenyReason::ApprovalMismatch)
        );
        let by_ben = Approval {
            decided: Some(("ben".into(), true)),
            ..by_sponsor
        };
        assert!(granted_by_another(&by_ben, &r));
        let export = Action::Export {
            params: "{}".into(),
            approval: Some(by_ben),
        };
        assert!(allowed(&decide(&user("bot"), &export, &r, 0)));
    }

    #[test]
    fn approvals_are_bound_to_another_approver_and_the_parameters() {
        let r = room(&[("ana", Role::Owner), ("ben", Role::Owner)]);
        let params = r#"{"files":["a"]}"#.to_owned();
        let export = |approval| Action::Export {
            params: params.clone(),
            approval,
        };
        assert!(matches!(
            decide(&user("ben"), &export(None), &r, 0),
            Decision::NeedsApproval(_)
        ));
        let pending = Approval {
            id: "1".into(),
            requester: "ben".into(),
            action: "export".into(),
            params: params.clone(),
            expires_at: 100,
            decided: None,
            used: false,
        };
        let decide_it = |who: &str, now| {
            decide(
                &user(who),
                &Action::DecideApproval {
                    approval: pending.clone(),
                },
                &r,
                now,
            )
        };
        assert_eq!(
            decide_it("ben", 0),
            Decision::Deny(DenyReason::SelfApproval)
        );
        assert_eq!(
            decide_it("ana", 100),
            Decision::Deny(DenyReason::ApprovalExpired)
        );
        assert!(allowed(&decide_it("ana", 0)));
        let approved = Approval {
            decided: Some(("ana".into(), true)),
            ..pending.clone()
        };
        assert!(allowed(&decide(
            &user("ben"),
            &export(Some(approved.clone())),
            &r,
            50
        )));
        let other = Action::Export {
            params: r#"{"files":["a","b"]}"#.into(),
            approval: Some(approved.clone()),
        };
        assert_eq!(
            decide(&user("ben"), &other, &r, 50),
            Decision::Deny(DenyReason::ApprovalMismatch)
        );
        assert_eq!(
            decide(&user("ana"), &export(Some(approved.clone())), &r, 50),
            Decision::Deny(DenyReason::ApprovalMismatch)
        );
        assert_eq!(
            decide(&user("ben"), &export(Some(approved.clone())), &r, 100),
            Decision::Deny(DenyReason::ApprovalExpired)
        );
        let used = Approval {
            used: true,
            ..approved
        };
        assert_eq!(
            decide(&user("ben"), &export(Some(used)), &r, 50),
            Decision::Deny(DenyReason::AlreadyDecided)
        );
        let self_approved = Approval {
            decided: Some(("ben".into(), true)),
            ..pending
        };
        assert_eq!(
            decide(&user("ben"), &export(Some(self_approved)), &r, 50),
            Decision::Deny(DenyReason::ApprovalMismatch)
        );
    }

    #[test]
    fn presets_and_admins() {
        let r = room(&[
            ("ana", Role::Owner),
            ("ben", Role::Editor),
            ("cy", Role::Viewer),
        ]);
        assert!(allowed(&decide(
            &user("ben"),
            &Action::Use(Capability::Edit),
            &r,
            0
        )));
        assert_eq!(
            decide(&user("cy"), &Action::Use(Capability::Edit), &r, 0),
            Decision::Deny(DenyReason::Missing(Capability::Edit))
        );
        let admin = Principal {
            user: "root".into(),
            is_admin: true,
        };
        // Admins see no content, but can remove anyone and confirm deletions.
        assert_eq!(
            decide(&admin, &Action::Use(Capability::Observe), &r, 0),
            Decision::Deny(DenyReason::NotParticipant)
        );
        assert!(allowed(&decide(
            &admin,
            &Action::RemoveParticipant {
                target: "ben".into()
            },
            &r,
            0
        )));
        assert!(allowed(&decide(&admin, &Action::ConfirmDeletion, &r, 0)));
        assert!(!allowed(&decide(
            &user("ana"),
            &Action::ConfirmDeletion,
            &r,
            0
        )));
    }

    #[test]
    fn lowering_needs_revoke_and_raising_needs_the_capability() {
        let r = room(&[
            ("ana", Role::Owner),
            ("ben", Role::Editor),
            ("cy", Role::Viewer),
        ]);
        let viewer = Role::Viewer.capabilities();
        assert!(allowed(&decide(
            &user("ana"),
            &Action::ChangeParticipant {
                target: "ben".into(),
                after: Participant::with_role(Role::Viewer),
            },
            &r,
            0
        )));
        assert!(!allowed(&decide(
            &user("ben"),
            &Action::ChangeParticipant {
                target: "cy".into(),
                after: Participant::with_role(Role::Viewer).revoking(viewer),
            },
            &r,
            0
        )));
        // An editor can pass on edit, never approve.
        let cy_edit = viewer.with(Capability::Edit);
        let ben = {
            let mut r = r.clone();
            if let Some(p) = r.participants.get_mut("ben") {
                p.extra.push(Grant {
                    capability: Capability::Invite,
                    expires_at: None,
                });
            }
            r
        };
        assert!(allowed(&decide(
            &user("ben"),
            &Action::ChangeParticipant {
                target: "cy".into(),
                after: Participant::with_role(Role::Viewer).granting(cy_edit, None),
            },
            &r,
            0
        )));
        assert_eq!(
            decide(
                &user("ben"),
                &Action::CreateInvite {
                    grants: Role::Owner.capabilities()
                },
                &ben,
                0
            ),
            Decision::Deny(DenyReason::ExceedsOwn(
                Role::Owner
                    .capabilities()
                    .minus(Role::Editor.capabilities().with(Capability::Invite))
            ))
        );
        // The last owner cannot be demoted or removed.
        assert_eq!(
            decide(
                &user("ana"),
                &Action::RemoveParticipant {
                    target: "ana".into()
                },
                &r,
                0
            ),
            Decision::Deny(DenyReason::LastRevoker)
        );
    }

    #[test]
    fn expiry_changes_are_lowerings_or_raises_and_outsiders_change_nothing() {
        let mut r = room(&[("ana", Role::Owner), ("ben", Role::Editor)]);
        let approve = CapabilitySet::of(&[Capability::Approve]);
        let ben_temp = Participant::with_role(Role::Editor).granting(approve, Some(100));
        r.participants.insert("ben".into(), ben_temp.clone());
        // Ben cannot make his own temporary grant permanent (or longer).
        for after in [
            ben_temp.granting(approve, None),
            ben_temp.granting(approve, Some(200)),
        ] {
            assert_eq!(
                decide(
                    &user("ben"),
                    &Action::ChangeParticipant {
                        target: "ben".into(),
                        after
                    },
                    &r,
                    0
                ),
                Decision::Deny(DenyReason::ExceedsOwn(approve))
            );
        }
        // Nobody outside the room changes anything, not even "nothing".
        let same = Action::ChangeParticipant {
            target: "ben".into(),
            after: ben_temp.clone(),
        };
        assert_eq!(
            decide(&user("zed"), &same, &r, 0),
            Decision::Deny(DenyReason::NotParticipant)
        );
        // Shortening someone's grant is a lowering: it needs revoke.
        let shorter = Participant::with_role(Role::Editor).granting(approve, Some(10));
        let cut = Action::ChangeParticipant {
            target: "ben".into(),
            after: shorter,
        };
        assert_eq!(
            decide(&user("ben"), &cut, &r, 0),
            Decision::Deny(DenyReason::Missing(Capability::Revoke))
        );
        assert!(allowed(&decide(&user("ana"), &cut, &r, 0)));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Change {
            actor: usize,
            target: usize,
            to: u16,
            expires: Option<i64>,
        },
        Remove {
            actor: usize,
            target: usize,
        },
        Invite {
            issuer: usize,
            grants: u16,
            acceptor: usize,
        },
        Tick(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                0..5usize,
                0..5usize,
                0u16..4096,
                proptest::option::of(0i64..1000)
            )
                .prop_map(|(actor, target, to, expires)| Op::Change {
                    actor,
                    target,
                    to,
                    expires
                }),
            (0..5usize, 0..5usize).prop_map(|(actor, target)| Op::Remove { actor, target }),
            (0..5usize, 0u16..4096, 0..5usize).prop_map(|(issuer, grants, acceptor)| Op::Invite {
                issuer,
                grants,
                acceptor
            }),
            (0i64..300).prop_map(Op::Tick),
        ]
    }

    fn set_of(bits: u16) -> CapabilitySet {
        CapabilitySet::of(
            &Capability::ALL
                .into_iter()
                .enumerate()
                .filter(|(i, _)| bits & (1 << i) != 0)
                .map(|(_, c)| c)
                .collect::<Vec<_>>(),
        )
    }

    fn apply(room: &mut RoomState, target: &str, to: CapabilitySet) {
        let nothing = Participant::with_role(Role::Viewer).revoking(Role::Viewer.capabilities());
        room.participants
            .insert(target.to_owned(), nothing.granting(to, None));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// No principal ever holds a capability that was not granted to it by someone who held
        /// it at the time; invites never exceed their issuer.
        #[test]
        fn nobody_holds_what_nobody_who_had_it_gave(ops in proptest::collection::vec(op(), 1..60)) {
            let users = ["u0", "u1", "u2", "u3", "u4"];
            let mut r = room(&[("u0", Role::Owner)]);
            // Independent ledger: which (user, capability) pairs were ever legitimately given.
            let mut ledger: BTreeMap<&str, BTreeSet<Capability>> = BTreeMap::new();
            ledger.insert("u0", Capability::ALL.into_iter().collect());
            let mut now = 0i64;
            for op in ops {
                match op {
                    Op::Tick(d) => now += d,
                    Op::Change { actor, target, to, expires } => {
                        let (a, t) = (users[actor], users[target]);
                        let Some(before) = r.participants.get(t).cloned() else { continue };
                        // Bits 12-13 pick the kind of change, the low bits the capabilities.
                        let after = match to >> 12 {
                            0 => Participant::with_role([Role::Owner, Role::Editor, Role::Viewer][usize::from(to % 3)]),
                            1 => before.revoking(set_of(to)),
                            _ => before.granting(set_of(to), expires),
                        };
                        let d = decide(&user(a), &Action::ChangeParticipant { target: t.into(), after: after.clone() }, &r, now);
                        if allowed(&d) {
                            for c in Capability::ALL {
                                if after.until(c, now) > before.until(c, now) {
                                    prop_assert!(
                                        r.participants.get(a).is_some_and(|p| p.until(c, now) >= after.until(c, now)),
                                        "{a} gave {c} beyond its own holding"
                                    );
                                    prop_assert!(ledger.get(a).is_some_and(|l| l.contains(&c)));
                                    ledger.entry(t).or_default().insert(c);
                                }
                            }
                            r.participants.insert(t.to_owned(), after);
                        }
                    }
                    Op::Remove { actor, target } => {
                        let (a, t) = (users[actor], users[target]);
                        if allowed(&decide(&user(a), &Action::RemoveParticipant { target: t.into() }, &r, now)) {
                            r.participants.remove(t);
                        }
                    }
                    Op::Invite { issuer, grants, acceptor } => {
                        let (i, u, g) = (users[issuer], users[acceptor], set_of(grants));
                        let created = allowed(&decide(&user(i), &Action::CreateInvite { grants: g }, &r, now));
                        if created && !r.participants.contains_key(u) {
                            let accepted = decide(
                                &user(u),
                                &Action::AcceptInvite { issuer: i.into(), grants: g },
                                &r,
                                now,
                            );
                            if allowed(&accepted) {
                                prop_assert!(g.is_subset_of(r.capabilities_of(i, now)), "invite exceeded its issuer");
                                for c in g.iter() {
                                    prop_assert!(ledger.get(i).is_some_and(|l| l.contains(&c)));
                                    ledger.entry(u).or_default().insert(c);
                                }
                                apply(&mut r, u, g);
                            }
                        }
                    }
                }
                for (u, p) in &r.participants {
                    let held = p.capabilities(now);
                    let given = ledger.get(u.as_str()).cloned().unwrap_or_default();
                    for c in held.iter() {
                        prop_assert!(given.contains(&c), "{u} holds {c} that nobody who had it gave");
                    }
                }
                // Someone can always still revoke, and will be able to whatever the clock does.
                prop_assert!(r.permanent_holders_besides(Capability::Revoke, "") >= 1);
            }
        }
    }
}

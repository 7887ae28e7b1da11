//! Approvals: an action that needs someone else's approval is stored as a request with its
//! exact parameters (recorded `needs_approval`); another holder of `approve` decides it; the
//! requester then repeats the action presenting it, and it runs only with exactly those
//! parameters, before the request expires, once (its record spends it in the same
//! transaction).

use crate::ids::{IssuedId, RoomId, UserId};
use crate::ops::record::{Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::store::Change;
use coderoom_authz::{Action, Approval, Authorized};
use serde_json::{json, Value};

/// How often a caller waiting for a decision looks again.
const WAIT_STEP: std::time::Duration = std::time::Duration::from_millis(250);

/// How an approval a caller waited for turned out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Waited {
    Approved,
    /// Denied, by this person.
    Denied(String),
    Expired,
    /// Nobody decided within the wait.
    Undecided,
}

/// A request waits this long for a decision; an approval lapses with it.
pub(crate) const APPROVAL_TTL_MS: i64 = 60 * 60 * 1000;

/// An allowed action, and the approval it rests on (empty: none), which its record spends.
pub(crate) struct Allowed {
    pub(crate) proof: Authorized,
    pub(crate) approval: String,
}

impl Ops {
    /// Decides an action that may need an approval: one is asked for when needed (stored with
    /// the action's exact parameters, recorded `needs_approval`), a refusal is recorded, and an
    /// allowed action is left to the caller to perform and record (spending the approval).
    pub(crate) async fn ask(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        action: Action,
        details: Value,
    ) -> Result<Outcome<Allowed>, OpError> {
        let presented = action.approval().map(|a| a.id.clone());
        let locked = self.audit.lock().await;
        // A refusal records the approval presented and the parameters.
        let denied = json!({ "approval_id": presented, "params": details });
        match self
            .decide_locked(&locked, room_id, actor, &action, denied)
            .await?
        {
            Err(request) => {
                let id = IssuedId::fresh().to_string();
                let change = Change::CreateApproval {
                    id: id.clone(),
                    room_id: room_id.clone(),
                    requester: actor.id.clone(),
                    action: request.action.to_owned(),
                    params: request.params,
                    expires_at: self.now_ms() + APPROVAL_TTL_MS,
                };
                let details = json!({ "approval_id": id, "params": details });
                let entry = Entry::of(&action, Verdict::NeedsApproval, details);
                self.write(&locked, room_id, &actor.id, entry, change)
                    .await?;
                Ok(Outcome::Pending(id))
            }
            Ok(proof) => {
                // An approval the decision did not need is not spent on it (it may be someone
                // else's, for something else).
                if presented.is_some() && proof.approval().is_none() {
                    return Err(OpError::Bad(
                        "this needs no approval: send it without approval_id",
                    ));
                }
                let approval = proof.approval().unwrap_or_default().to_owned();
                Ok(Outcome::Done(Allowed { proof, approval }))
            }
        }
    }

    /// The approval named `id` in the room (not found for an id of the wrong form or not
    /// there).
    pub(crate) async fn presented(
        &self,
        room_id: &RoomId,
        id: Option<&str>,
    ) -> Result<Option<Approval>, OpError> {
        match id {
            Some(id) if IssuedId::parse(id).is_some() => Ok(Some(
                self.store
                    .approval(room_id, id)
                    .await?
                    .ok_or(OpError::NotFound)?,
            )),
            Some(_) => Err(OpError::NotFound),
            None => Ok(None),
        }
    }

    /// An approval granted to `requester` for exactly `action` with `params`, not yet used nor
    /// expired: what a door that cannot name an approval (keys typed into the terminal)
    /// presents when the same thing is asked again.
    pub(crate) async fn granted(
        &self,
        room_id: &RoomId,
        requester: &str,
        action: &str,
        params: &str,
    ) -> Result<Option<Approval>, OpError> {
        let now = self.now_ms();
        Ok(self
            .store
            .approvals(room_id)
            .await?
            .into_iter()
            .map(|(a, _)| a)
            .find(|a| {
                a.requester == requester
                    && a.action == action
                    && a.params == params
                    && !a.used
                    && a.expires_at > now
                    && matches!(a.decided, Some((_, true)))
            }))
    }

    /// Records an allowed action, spending in the same transaction the approval it rested on
    /// (`approval`; empty: none). An approval a concurrent request spent first refuses it.
    pub(crate) async fn record_allowed(
        &self,
        room_id: &RoomId,
        proof: &Authorized,
        entry: Entry,
        change: Change,
        approval: &str,
    ) -> Result<coderoom_authz::audit::Record, OpError> {
        self.record(
            room_id,
            proof.actor(),
            entry,
            change.spending(approval.to_owned()),
        )
        .await
        .map_err(OpError::spent_approval)
    }

    /// Approves (or refuses) request `id` of the room as `actor`: someone who holds `approve`,
    /// is a person, and is not the requester; once, before it expires.
    pub(crate) async fn decide_approval(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        id: &str,
        approve: bool,
    ) -> Result<(), OpError> {
        self.capabilities(room_id, actor).await?;
        let approval = self
            .store
            .approval(room_id, id)
            .await?
            .ok_or(OpError::NotFound)?;
        let details = json!({ "approval_id": id, "approve": approve, "params": approval.params });
        let action = Action::DecideApproval { approval };
        let locked = self.audit.lock().await;
        let proof = self
            .authorize_locked(&locked, room_id, actor, action, details.clone())
            .await?;
        let change = Change::DecideApproval {
            id: id.to_owned(),
            by: UserId::known(proof.actor()),
            approved: approve,
        };
        let verdict = if approve {
            Verdict::Approve
        } else {
            Verdict::Reject
        };
        let entry = Entry::of(proof.action(), verdict, details);
        self.write(&locked, room_id, proof.actor(), entry, change)
            .await
            .map_err(OpError::spent_approval)?;
        Ok(())
    }

    /// Waits at most `wait` for approval `id` to be decided: a door whose callers cannot be
    /// told "ask again later" (an MCP tool call, an E2B command) holds the call meanwhile.
    pub(crate) async fn wait_for_decision(
        &self,
        room_id: &RoomId,
        id: &str,
        wait: std::time::Duration,
    ) -> Result<Waited, OpError> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let a = self
                .store
                .approval(room_id, id)
                .await?
                .ok_or(OpError::NotFound)?;
            match a.decided {
                Some((_, true)) => return Ok(Waited::Approved),
                Some((by, false)) => return Ok(Waited::Denied(by)),
                None if a.expires_at <= self.clock.now_ms() => return Ok(Waited::Expired),
                None => {}
            }
            if tokio::time::Instant::now() >= until {
                return Ok(Waited::Undecided);
            }
            tokio::time::sleep(WAIT_STEP).await;
        }
    }
}

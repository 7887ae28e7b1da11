//! Deciding: the one place an action on a room is decided for an actor (and a participant's
//! refusal recorded). Callers get an `Authorized` proof, an approval to ask for, or an error;
//! rooms the actor cannot observe are reported missing.

use crate::audit::Locked;
use crate::ids::RoomId;
use crate::ops::record::{Entry, Verdict};
use crate::ops::{Actor, OpError, Ops};
use crate::room::task::Rights;
use coderoom_authz::{
    decide, Action, ApprovalRequest, Authorized, Capability, CapabilitySet, Decision, DenyReason,
    RoomState,
};
use serde_json::Value;

impl Ops {
    /// Decides `action` in `room_id` for `actor` under the audit lock; a participant's refusal
    /// is recorded in the room's chain (an outsider's only logged, so outsiders cannot fill a
    /// chain) and reported as [`OpError::NotFound`] for outsiders (the room's existence does
    /// not leak) and [`OpError::Refused`] otherwise. `Err` of the inner result: the approval to
    /// ask for.
    pub(crate) async fn decide_locked(
        &self,
        locked: &Locked<'_>,
        room_id: &RoomId,
        actor: &Actor,
        action: &Action,
        details: Value,
    ) -> Result<Result<Authorized, ApprovalRequest>, OpError> {
        if self.store.room(room_id).await?.is_none() {
            return Err(OpError::NotFound);
        }
        let state = self.store.room_state(room_id).await?;
        let who = actor.principal();
        match decide(&who, action, &state, self.now_ms()) {
            Decision::Allow(proof) => Ok(Ok(proof)),
            Decision::Deny(DenyReason::NotParticipant) if !who.is_admin => {
                tracing::info!(room = %room_id, user = %actor.id, action = action.name(), "outsider refused");
                Err(OpError::NotFound)
            }
            Decision::Deny(reason) => {
                let entry = Entry::of(action, Verdict::Deny, details).because(reason.to_string());
                self.write(
                    locked,
                    room_id,
                    &actor.id,
                    entry,
                    crate::store::Change::None,
                )
                .await?;
                Err(OpError::Refused(reason.to_string()))
            }
            Decision::NeedsApproval(request) => Ok(Err(request)),
        }
    }

    /// [`Ops::decide_locked`] for an action that never needs an approval.
    pub(crate) async fn authorize_locked(
        &self,
        locked: &Locked<'_>,
        room_id: &RoomId,
        actor: &Actor,
        action: Action,
        details: Value,
    ) -> Result<Authorized, OpError> {
        self.decide_locked(locked, room_id, actor, &action, details)
            .await?
            .map_err(|_| OpError::Refused("this action needs an approval".into()))
    }

    /// [`Ops::authorize_locked`] for a check that is not followed by a change under the lock.
    pub(crate) async fn authorize(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        action: Action,
        details: Value,
    ) -> Result<Authorized, OpError> {
        let locked = self.audit.lock().await;
        self.authorize_locked(&locked, room_id, actor, action, details)
            .await
    }

    /// Decides `Use(cap)` for `actor` and, allowed, records `entry` and performs `change` in
    /// the room's chain under the same lock (a refusal is recorded by the decision). For room
    /// settings a holder of one capability changes directly.
    pub(crate) async fn use_and_record(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        cap: Capability,
        entry: Entry,
        change: crate::store::Change,
    ) -> Result<(), OpError> {
        let locked = self.audit.lock().await;
        let action = Action::Use(cap);
        let proof = self
            .authorize_locked(&locked, room_id, actor, action, entry.details.clone())
            .await?;
        self.write(&locked, room_id, proof.actor(), entry, change)
            .await?;
        Ok(())
    }

    /// The room's state and the actor's proof of `observe`, decided like every other action.
    /// Rooms the actor cannot observe are reported missing, so their existence does not leak.
    async fn observed(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<(RoomState, Authorized), OpError> {
        let state = self.store.room_state(room_id).await?;
        match decide(
            &actor.principal(),
            &Action::Use(Capability::Observe),
            &state,
            self.now_ms(),
        ) {
            Decision::Allow(proof) => Ok((state, proof)),
            Decision::Deny(_) | Decision::NeedsApproval(_) => Err(OpError::NotFound),
        }
    }

    /// The actor's capabilities in the room ([`OpError::NotFound`] unless it may observe it).
    pub(crate) async fn capabilities(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<CapabilitySet, OpError> {
        Ok(self.observed(room_id, actor).await?.1.actor_capabilities())
    }

    /// Until when the actor may use `cap` (never past its `observe`) and until when it may
    /// observe, and its capabilities, from one look at the room; not found unless it may
    /// observe now.
    pub(crate) async fn rights(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        cap: Capability,
    ) -> Result<(Rights, CapabilitySet), OpError> {
        let (state, proof) = self.observed(room_id, actor).await?;
        if !state.is_member(&actor.id) {
            return Err(OpError::NotFound);
        }
        Ok((
            Rights::of_state(&state, &actor.id, cap, self.now_ms()),
            proof.actor_capabilities(),
        ))
    }
}

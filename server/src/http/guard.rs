//! The authorization guard of the edge: who the caller is to `coderoom_authz`, and the one
//! place where a route's action is decided (and a participant's denial recorded). Handlers get
//! an `Authorized` proof or an error; rooms the caller cannot observe are reported missing.

use crate::audit::Locked;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use crate::room::task::Rights;
use coderoom_authz::{
    decide, Action, ApprovalRequest, Authorized, Capability, CapabilitySet, Decision, DenyReason,
    Principal, RoomState,
};
use serde_json::Value;

pub(crate) fn principal(app: &AppState, user: &AuthUser) -> Principal {
    Principal {
        user: user.id.clone(),
        is_admin: app.admin_emails.contains(&user.email),
    }
}

/// Decides `action` in `room_id` for `user` under the audit lock; a participant's denial is
/// recorded in the room's chain (an outsider's only logged, so outsiders cannot fill a chain)
/// and answered 404 for outsiders (the room's existence does not leak) and 403 otherwise.
pub(crate) async fn authorize_locked(
    app: &AppState,
    locked: &Locked<'_>,
    room_id: &RoomId,
    user: &AuthUser,
    action: Action,
    details: Value,
) -> Result<Authorized, ApiError> {
    // Routes whose actions can need approval handle that outcome themselves (`decide_locked`).
    decide_locked(app, locked, room_id, user, &action, details)
        .await?
        .map_err(|_| ApiError::Denied("this action needs an approval".into()))
}

/// [`authorize_locked`], with an action that may need an approval: that outcome is the
/// caller's to handle (`Err` of the inner result: the approval to ask for).
pub(crate) async fn decide_locked(
    app: &AppState,
    locked: &Locked<'_>,
    room_id: &RoomId,
    user: &AuthUser,
    action: &Action,
    details: Value,
) -> Result<Result<Authorized, ApprovalRequest>, ApiError> {
    if app.store.room(room_id).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    let state = app.store.room_state(room_id).await?;
    let who = principal(app, user);
    match decide(&who, action, &state, app.clock.now_ms()) {
        Decision::Allow(proof) => Ok(Ok(proof)),
        Decision::Deny(DenyReason::NotParticipant) if !who.is_admin => {
            tracing::info!(room = %room_id, user = %user.id, action = action.name(), "outsider refused");
            Err(ApiError::NotFound)
        }
        Decision::Deny(reason) => {
            locked
                .deny(
                    room_id,
                    &user.id,
                    action.name(),
                    &reason.to_string(),
                    details,
                )
                .await?;
            Err(ApiError::Denied(reason.to_string()))
        }
        Decision::NeedsApproval(request) => Ok(Err(request)),
    }
}

/// [`authorize_locked`] for a check that is not followed by a change.
pub(crate) async fn authorize(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    action: Action,
    details: Value,
) -> Result<Authorized, ApiError> {
    let locked = app.audit.lock().await;
    authorize_locked(app, &locked, room_id, user, action, details).await
}

/// Decides `Use(cap)` for `user` and, allowed, records `name` with `details` and `change` in
/// the room's chain under the same lock (a refusal is recorded by the decision). For room
/// settings a holder of one capability changes directly.
pub(crate) async fn use_and_record(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    (cap, name): (Capability, &str),
    details: Value,
    change: crate::store::Change,
) -> Result<(), ApiError> {
    let locked = app.audit.lock().await;
    let action = Action::Use(cap);
    let proof = authorize_locked(app, &locked, room_id, user, action, details.clone()).await?;
    locked
        .record(room_id, proof.actor(), name, "allow", "", details, change)
        .await?;
    Ok(())
}

/// The room's state and the caller's proof of `observe`, decided like every other action.
/// Rooms the caller cannot observe are reported as missing, so their existence does not leak.
async fn observed(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
) -> Result<(RoomState, Authorized), ApiError> {
    let state = app.store.room_state(room_id).await?;
    let who = principal(app, user);
    match decide(
        &who,
        &Action::Use(Capability::Observe),
        &state,
        app.clock.now_ms(),
    ) {
        Decision::Allow(proof) => Ok((state, proof)),
        Decision::Deny(_) | Decision::NeedsApproval(_) => Err(ApiError::NotFound),
    }
}

/// The caller's capabilities in the room (404 unless it may observe it).
pub(crate) async fn room_capabilities(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
) -> Result<CapabilitySet, ApiError> {
    Ok(observed(app, room_id, user).await?.1.actor_capabilities())
}

/// Until when the caller may edit and observe in the room.
pub(crate) async fn room_access(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
) -> Result<Rights, ApiError> {
    room_until(app, room_id, user, Capability::Edit).await
}

/// Until when the caller may use `cap` (never past its `observe`) and until when it may
/// observe; 404 unless it may observe now.
pub(crate) async fn room_until(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    cap: Capability,
) -> Result<Rights, ApiError> {
    Ok(room_rights(app, room_id, user, cap).await?.0)
}

/// [`room_until`] and the caller's capabilities, from one look at the room.
pub(crate) async fn room_rights(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    cap: Capability,
) -> Result<(Rights, CapabilitySet), ApiError> {
    let (state, proof) = observed(app, room_id, user).await?;
    if !state.is_member(&user.id) {
        return Err(ApiError::NotFound);
    }
    Ok((
        Rights::of_state(&state, &user.id, cap, app.clock.now_ms()),
        proof.actor_capabilities(),
    ))
}

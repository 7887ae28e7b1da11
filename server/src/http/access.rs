//! Who may do what in a room: invites, participant changes and removals, and the audit log.
//! Every route asks `coderoom_authz::decide`, records the decision (allowed or denied) in the
//! room's audit chain in the same transaction as the change, and tells the loaded room so the
//! change applies to open connections from their next frame.

use crate::accounts::sessions::hash_token;
use crate::http::extract::Ids;
use crate::http::guard::{authorize_locked, principal};
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::{RoomId, UserId};
use crate::room::RoomCmd;
use crate::store::{Change, InviteRow, StoreError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, patch, post};
use axum::Json;
use axum::Router;
use coderoom_authz::{decide, Action, Capability, CapabilitySet, Decision, Participant, Role};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Longest invite lifetime.
const MAX_INVITE_TTL_S: u64 = 30 * 24 * 3600;
/// Most uses one invite may allow.
const MAX_INVITE_USES: i64 = 1000;
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/invites", post(create_invite))
        .route("/api/invites/{token}/accept", post(accept_invite))
        .route(
            "/api/invites/{token}",
            get(show_invite).delete(revoke_invite),
        )
        .route(
            "/api/rooms/{id}/participants/{user_id}",
            patch(change_participant).delete(remove_participant),
        )
        .route("/api/rooms/{id}/audit", get(room_audit))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateInvite {
    role: String,
    ttl_s: u64,
    max_uses: i64,
}

pub(crate) async fn create_invite(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<CreateInvite>,
) -> Result<(StatusCode, Json<InviteCreated>), ApiError> {
    let role: Role = body
        .role
        .parse()
        .map_err(|_| ApiError::BadRequest("role must be owner, editor or viewer"))?;
    if body.ttl_s == 0 || body.ttl_s > MAX_INVITE_TTL_S {
        return Err(ApiError::BadRequest("ttl_s must be 1 to 2592000"));
    }
    if !(1..=MAX_INVITE_USES).contains(&body.max_uses) {
        return Err(ApiError::BadRequest("max_uses must be 1 to 1000"));
    }
    let details = json!({ "role": role.as_str(), "ttl_s": body.ttl_s, "max_uses": body.max_uses });
    let action = Action::CreateInvite {
        grants: role.capabilities(),
    };
    let locked = app.audit.lock().await;
    let proof = authorize_locked(&app, &locked, &room_id, &user, action, details.clone()).await?;
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    let token = format!("inv_{}", hex::encode(raw));
    let ttl_ms = i64::try_from(body.ttl_s * 1000).unwrap_or(i64::MAX);
    let change = Change::CreateInvite {
        token_hash: hash_token(&token),
        room_id: room_id.to_string(),
        role: role.as_str().into(),
        created_by: proof.actor().to_owned(),
        expires_at: app.clock.now_ms() + ttl_ms,
        max_uses: body.max_uses,
    };
    locked
        .record(
            &room_id,
            proof.actor(),
            "create_invite",
            "allow",
            "",
            details,
            change,
        )
        .await?;
    let url = format!("{}/invite/{token}", app.public_origin);
    Ok((StatusCode::CREATED, Json(InviteCreated { token, url })))
}

/// What an invite link offers, shown before it is accepted.
#[derive(Serialize)]
pub(crate) struct InviteShown {
    room_id: String,
    room_name: String,
    /// The inviter's email (null if that account is gone).
    invited_by: Option<String>,
    role: String,
    expires_at: i64,
    uses_left: i64,
}

/// `GET /api/invites/{token}`: the room, who invited, the role; 410 saying why when the link
/// no longer works (used up, expired, revoked). Needs a login, like accepting; shows nothing
/// the link's holder could not learn by accepting it.
pub(crate) async fn show_invite(
    State(app): State<AppState>,
    _user: AuthUser,
    Path(token): Path<String>,
) -> Result<Json<InviteShown>, ApiError> {
    let (_, invite) = invite_by_token(&app, &token).await?;
    if let Some(why) = unusable(&invite, app.clock.now_ms()) {
        return Err(ApiError::GoneBecause(why));
    }
    let room = app
        .store
        .room(&invite.room_id)
        .await?
        .ok_or(ApiError::Gone)?;
    let invited_by = app.store.user_email(&invite.created_by).await?;
    Ok(Json(InviteShown {
        room_id: invite.room_id,
        room_name: room.name,
        invited_by,
        role: invite.role,
        expires_at: invite.expires_at,
        uses_left: invite.max_uses - invite.uses,
    }))
}

/// Why an invite can no longer be used at `now` (revoked, used up, expired), as a sentence for
/// the person holding the link; `None` while it can.
fn unusable(invite: &InviteRow, now: i64) -> Option<&'static str> {
    if invite.revoked_at.is_some() {
        Some("This invite link was revoked.")
    } else if invite.uses >= invite.max_uses {
        Some("This invite link is used up: it was already used as many times as it allows.")
    } else if invite.expires_at <= now {
        Some("This invite link has expired.")
    } else {
        None
    }
}

/// The invite a link's token names (looked up by the token's hash).
async fn invite_by_token(app: &AppState, token: &str) -> Result<(String, InviteRow), ApiError> {
    if !invite_token_ok(token) {
        return Err(ApiError::NotFound);
    }
    let token_hash = hash_token(token);
    let invite = app
        .store
        .invite(&token_hash)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok((token_hash, invite))
}

fn invite_token_ok(token: &str) -> bool {
    token.len() == 68
        && token.starts_with("inv_")
        && token[4..].bytes().all(|b| b.is_ascii_hexdigit())
}

pub(crate) async fn accept_invite(
    State(app): State<AppState>,
    user: AuthUser,
    Path(token): Path<String>,
) -> Result<Json<Joined>, ApiError> {
    let locked = app.audit.lock().await;
    let (token_hash, invite) = invite_by_token(&app, &token).await?;
    let now = app.clock.now_ms();
    if unusable(&invite, now).is_some() {
        return Err(ApiError::Gone);
    }
    let role: Role = invite
        .role
        .parse()
        .map_err(|_| ApiError::Store(StoreError::Corrupt))?;
    let state = app.store.room_state(&invite.room_id).await?;
    if state.participants.contains_key(&user.id) {
        // Already in: an invite never changes existing rights.
        return Ok(Json(Joined {
            room_id: invite.room_id,
        }));
    }
    let action = Action::AcceptInvite {
        issuer: invite.created_by.clone(),
        grants: role.capabilities(),
    };
    let details = json!({ "role": role.as_str(), "issuer": invite.created_by });
    let proof = match decide(&principal(&app, &user).await?, &action, &state, now) {
        Decision::Allow(p) => p,
        Decision::Deny(reason) => {
            let reason = reason.to_string();
            locked
                .deny(&invite.room_id, &user.id, "accept_invite", &reason, details)
                .await?;
            return Err(ApiError::Gone);
        }
        Decision::NeedsApproval(_) => return Err(ApiError::Gone),
    };
    let change = Change::AcceptInvite {
        token_hash,
        room_id: invite.room_id.to_string(),
        user_id: proof.actor().to_owned(),
        participant: Participant::with_role(role),
        now,
    };
    match locked
        .record(
            &invite.room_id,
            proof.actor(),
            "accept_invite",
            "allow",
            "",
            details,
            change,
        )
        .await
    {
        Ok(_) => {
            drop(locked);
            // Everyone in the room sees the newcomer at once (their people panels look again).
            crate::http::events::access_changed(
                &app,
                invite.room_id.clone(),
                proof.actor().to_owned(),
                None,
            )
            .await;
            Ok(Json(Joined {
                room_id: invite.room_id,
            }))
        }
        // Used up, revoked, or the user was removed after the link was made.
        Err(StoreError::Conflict) => Err(ApiError::Gone),
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn revoke_invite(
    State(app): State<AppState>,
    user: AuthUser,
    Path(token): Path<String>,
) -> Result<StatusCode, ApiError> {
    let locked = app.audit.lock().await;
    let (token_hash, invite) = invite_by_token(&app, &token).await?;
    // The creator may withdraw it; so may anyone who could have created it.
    if invite.created_by != user.id {
        let action = Action::Use(Capability::Invite);
        let room_id = RoomId::parse(&invite.room_id).ok_or(ApiError::Store(StoreError::Corrupt))?;
        authorize_locked(
            &app,
            &locked,
            &room_id,
            &user,
            action,
            json!({ "revoke_invite": true }),
        )
        .await?;
    }
    let change = Change::RevokeInvite {
        token_hash,
        now: app.clock.now_ms(),
    };
    locked
        .record(
            &invite.room_id,
            &user.id,
            "revoke_invite",
            "allow",
            "",
            json!({ "role": invite.role }),
            change,
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangeBody {
    role: Option<String>,
    #[serde(default)]
    grant: Vec<String>,
    #[serde(default)]
    revoke: Vec<String>,
    /// When the granted capabilities lapse (Unix ms); absent for no expiry.
    expires_at: Option<i64>,
}

pub(crate) async fn change_participant(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, target)): Ids<(RoomId, UserId)>,
    Json(body): Json<ChangeBody>,
) -> Result<Json<Rights>, ApiError> {
    let grant = CapabilitySet::parse_names(&body.grant)
        .map_err(|_| ApiError::BadRequest("unknown capability"))?;
    let revoke = CapabilitySet::parse_names(&body.revoke)
        .map_err(|_| ApiError::BadRequest("unknown capability"))?;
    let now = app.clock.now_ms();
    if body.expires_at.is_some_and(|t| t <= now) {
        return Err(ApiError::BadRequest("expires_at must be in the future"));
    }
    if body.expires_at.is_some() && grant.is_empty() {
        return Err(ApiError::BadRequest(
            "expires_at applies to granted capabilities",
        ));
    }
    if body.role.is_none() && grant.is_empty() && revoke.is_empty() {
        return Err(ApiError::BadRequest(
            "give a role, or capabilities to grant or revoke",
        ));
    }
    let role = body
        .role
        .as_deref()
        .map(str::parse::<Role>)
        .transpose()
        .map_err(|_| ApiError::BadRequest("role must be owner, editor or viewer"))?;
    let locked = app.audit.lock().await;
    let state = app.store.room_state(&room_id).await?;
    let before = state.participants.get(target.as_str()).cloned();
    let base = match (role, &before) {
        (Some(r), _) => Participant::with_role(r),
        (None, Some(p)) => p.clone(),
        // Decided below (outsiders get 404, participants "no such participant").
        (None, None) => Participant::with_role(Role::Viewer),
    };
    let after = base.granting(grant, body.expires_at).revoking(revoke);
    let details = json!({
        "target": target,
        "from": before.as_ref().map(|p| p.capabilities(now).names()),
        "to": after.capabilities(now).names(),
        "expires_at": body.expires_at,
    });
    let action = Action::ChangeParticipant {
        target: target.to_string(),
        after: after.clone(),
    };
    let proof = authorize_locked(&app, &locked, &room_id, &user, action, details.clone()).await?;
    let change = Change::SetParticipant {
        room_id: room_id.to_string(),
        user_id: target.to_string(),
        participant: after.clone(),
    };
    locked
        .record(
            &room_id,
            proof.actor(),
            "change_participant",
            "allow",
            "",
            details,
            change,
        )
        .await?;
    drop(locked);
    let rights = crate::room::task::Rights::of(&after, Capability::Edit, now);
    crate::http::events::access_changed(
        &app,
        room_id.to_string(),
        target.to_string(),
        Some(user.email.clone()),
    )
    .await;
    app.rooms
        .notify(
            &room_id,
            RoomCmd::Access {
                user_id: target.to_string(),
                rights,
                decided: std::time::Instant::now(),
            },
        )
        .await;
    let agents = crate::http::agents::sponsored_by(&app, &room_id, &target).await;
    crate::http::agents::rights_changed(&app, &room_id, &agents).await;
    Ok(Json(Rights {
        capabilities: after.capabilities(now).names(),
        user_id: target.to_string(),
    }))
}

pub(crate) async fn remove_participant(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, target)): Ids<(RoomId, UserId)>,
) -> Result<StatusCode, ApiError> {
    remove_from_room(&app, &room_id, &target, &user).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Removes `target` from `room_id` as `user` decides (authorized and recorded in the room's
/// chain); their sockets in the room close, and the agents they sponsor there lose their rights.
pub(crate) async fn remove_from_room(
    app: &AppState,
    room_id: &RoomId,
    target: &UserId,
    user: &AuthUser,
) -> Result<(), ApiError> {
    let details = json!({ "target": target });
    let action = Action::RemoveParticipant {
        target: target.to_string(),
    };
    let locked = app.audit.lock().await;
    let proof = authorize_locked(app, &locked, room_id, user, action, details.clone()).await?;
    let change = Change::RemoveParticipant {
        room_id: room_id.to_string(),
        user_id: target.to_string(),
        now: app.clock.now_ms(),
    };
    locked
        .record(
            room_id,
            proof.actor(),
            "remove_participant",
            "allow",
            "",
            details,
            change,
        )
        .await?;
    drop(locked);
    crate::http::events::access_changed(
        app,
        room_id.to_string(),
        target.to_string(),
        Some(user.email.clone()),
    )
    .await;
    app.rooms
        .notify(
            room_id,
            RoomCmd::Access {
                user_id: target.to_string(),
                rights: crate::room::task::Rights::NONE,
                decided: std::time::Instant::now(),
            },
        )
        .await;
    let agents = crate::http::agents::sponsored_by(app, room_id, target).await;
    crate::http::agents::rights_changed(app, room_id, &agents).await;
    Ok(())
}

pub(crate) async fn room_audit(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Vec<AuditEntry>>, ApiError> {
    let who = principal(&app, &user).await?;
    // Participants who observe, and system admins (who revoke and delete), read the chain.
    let state = app.store.room_state(&room_id).await?;
    let allowed = who.is_admin
        || matches!(
            decide(
                &who,
                &Action::Use(Capability::Observe),
                &state,
                app.clock.now_ms()
            ),
            Decision::Allow(_)
        );
    if !allowed || app.store.room(&room_id).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    Ok(Json(chain_entries(&app, &room_id).await?))
}

/// Every record of audit chain `chain` (a room's id, or `system`), as the API gives them.
pub(crate) async fn chain_entries(
    app: &AppState,
    chain: &str,
) -> Result<Vec<AuditEntry>, ApiError> {
    let records = app.store.audit_records(chain).await?;
    // People by email, a removed one too (the log outlives their participation).
    let mut emails: std::collections::HashMap<String, Option<String>> = Default::default();
    let mut entries = Vec::with_capacity(records.len());
    for r in records {
        let details: Value = serde_json::from_str(&r.fields.details).unwrap_or(Value::Null);
        let target = details["target"].as_str().map(str::to_owned);
        let mut email_of = async |id: &str| -> Result<Option<String>, ApiError> {
            if let Some(known) = emails.get(id) {
                return Ok(known.clone());
            }
            let found = app.store.user_email(id).await?;
            emails.insert(id.to_owned(), found.clone());
            Ok(found)
        };
        let actor_email = email_of(&r.fields.actor).await?;
        let target_email = match &target {
            Some(t) => email_of(t).await?,
            None => None,
        };
        entries.push(AuditEntry {
            seq: r.seq,
            at: r.fields.at,
            details,
            actor: r.fields.actor,
            actor_email,
            target_email,
            action: r.fields.action,
            decision: r.fields.decision,
            reason: r.fields.reason,
            details_json: r.fields.details,
            prev_hash: r.prev_hash,
            hash: r.hash,
        });
    }
    Ok(entries)
}

/// `POST /api/rooms/{id}/invites`: the link, shown once.
#[derive(Serialize)]
pub(crate) struct InviteCreated {
    token: String,
    url: String,
}

/// `PATCH /api/rooms/{id}/participants/{user_id}`: what the participant may do now.
#[derive(Serialize)]
pub(crate) struct Rights {
    user_id: String,
    capabilities: Vec<&'static str>,
}

/// `POST /api/invites/{token}/accept`: the room the caller is now in.
#[derive(Serialize)]
pub(crate) struct Joined {
    room_id: String,
}

/// One record of `GET /api/rooms/{id}/audit`.
#[derive(Serialize)]
pub(crate) struct AuditEntry {
    seq: i64,
    at: i64,
    actor: String,
    /// The actor's email, when the actor is an account (not covered by the hash).
    #[serde(skip_serializing_if = "Option::is_none")]
    actor_email: Option<String>,
    /// The email of the account `details.target` names, when it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    target_email: Option<String>,
    action: String,
    decision: String,
    reason: String,
    details: Value,
    /// The exact text the hash covers, so a client can verify the chain itself.
    details_json: String,
    prev_hash: String,
    hash: String,
}

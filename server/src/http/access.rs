//! Who may do what in a room (`crate::ops::access`): invites, participant changes and
//! removals, and the audit log.

use crate::http::extract::OnRoom;
use crate::http::extract::{Caller, Ids};
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::{RoomId, UserId};
use crate::ops::access::{
    unusable, AuditEntry, InviteCreated, Joined, ParticipantRights, RightsChange,
};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, patch, post};
use axum::Json;
use axum::Router;
use serde::Serialize;

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

async fn create_invite(
    on: OnRoom,
    Json(body): Json<crate::ops::access::InviteAsked>,
) -> Result<(StatusCode, Json<InviteCreated>), ApiError> {
    let made = on.ops.create_invite(&on.room, &on.actor, body).await?;
    Ok((StatusCode::CREATED, Json(made)))
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
    /// What it grants (its role's, or those chosen).
    capabilities: Vec<String>,
    /// The one address that may accept it, when it was sent to one.
    #[serde(skip_serializing_if = "Option::is_none")]
    email: Option<String>,
}

/// `GET /api/invites/{token}`: the room, who invited, the role; 410 saying why when the link
/// no longer works (used up, expired, revoked). Needs a login, like accepting; shows nothing
/// the link's holder could not learn by accepting it.
pub(crate) async fn show_invite(
    State(app): State<AppState>,
    user: AuthUser,
    Path(token): Path<String>,
) -> Result<Json<InviteShown>, ApiError> {
    let (_, invite) = app.ops.invite_by_token(&token).await?;
    if let Some(why) = unusable(&invite, app.ops.clock.now_ms()) {
        return Err(ApiError::GoneBecause(why));
    }
    // Sent to one address: nobody else learns what it offers, or to whom.
    if invite.email.as_ref().is_some_and(|e| *e != user.email) {
        return Err(ApiError::Denied(
            "this invite was sent to someone else: log in as the address it was sent to".into(),
        ));
    }
    let room = app
        .ops
        .store
        .room(&invite.room_id)
        .await?
        .ok_or(ApiError::Gone)?;
    let invited_by = app.ops.store.user_email(&invite.created_by).await?;
    Ok(Json(InviteShown {
        room_id: invite.room_id.to_string(),
        room_name: room.name,
        invited_by,
        capabilities: match &invite.capabilities {
            Some(c) => c.split(',').map(str::to_owned).collect(),
            None => invite
                .role
                .parse::<coderoom_authz::Role>()
                .map(|r| {
                    r.capabilities()
                        .names()
                        .iter()
                        .map(|n| n.to_string())
                        .collect()
                })
                .unwrap_or_default(),
        },
        email: invite.email.clone(),
        role: invite.role,
        expires_at: invite.expires_at,
        uses_left: invite.max_uses - invite.uses,
    }))
}

async fn accept_invite(by: Caller, Path(token): Path<String>) -> Result<Json<Joined>, ApiError> {
    Ok(Json(by.ops.accept_invite(&by.actor, &token).await?))
}

async fn revoke_invite(by: Caller, Path(token): Path<String>) -> Result<StatusCode, ApiError> {
    by.ops.revoke_invite(&by.actor, &token).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn change_participant(
    by: Caller,
    Ids((room_id, target)): Ids<(RoomId, UserId)>,
    Json(asked): Json<RightsChange>,
) -> Result<Json<ParticipantRights>, ApiError> {
    let rights = by
        .ops
        .change_participant(&room_id, &by.actor, &target, asked)
        .await?;
    Ok(Json(rights))
}

async fn remove_participant(
    by: Caller,
    Ids((room_id, target)): Ids<(RoomId, UserId)>,
) -> Result<StatusCode, ApiError> {
    by.ops
        .remove_participant(&room_id, &by.actor, &target)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn room_audit(on: OnRoom) -> Result<Json<Vec<AuditEntry>>, ApiError> {
    Ok(Json(on.ops.room_audit(&on.room, &on.actor).await?))
}

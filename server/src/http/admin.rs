//! The admin console's API (system admins, `--admin-emails`): the accounts and the rooms they
//! are in, revoking an account everywhere, and every room deletion. Anyone else gets 403.

use crate::http::extract::Ids;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::UserId;
use crate::ops::admin::{Restored, Revoked};
use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

/// Accounts listed at most at once.
const MAX_USERS: i64 = 200;
/// Deletions listed at most at once.
const MAX_DELETIONS: i64 = 200;
/// Longest search text.
const MAX_QUERY: usize = 200;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/admin/users", get(users))
        .route("/api/admin/users/{id}/revoke", post(revoke))
        .route("/api/admin/users/{id}/restore", post(restore))
        .route("/api/admin/deletions", get(deletions))
        .route("/api/admin/audit", get(system_audit))
}

/// `GET /api/admin/audit`: the system chain (logins' anchors, revocations, deletions'
/// confirmations), in the shape of a room's `GET .../audit`, for the console to verify.
pub(crate) async fn system_audit(
    State(app): State<AppState>,
    user: AuthUser,
) -> Result<Json<Vec<crate::ops::access::AuditEntry>>, ApiError> {
    admin_only(&app, &user).await?;
    Ok(Json(app.ops.chain_entries("system").await?))
}

/// System admins only, decided as everywhere (`crate::ops::Actor::is_admin`).
async fn admin_only(app: &AppState, user: &AuthUser) -> Result<(), ApiError> {
    if user.actor(app).await?.is_admin {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

#[derive(Deserialize)]
pub(crate) struct UsersQuery {
    /// Part of an email (any case); all accounts when absent.
    #[serde(default)]
    q: String,
}

/// `POST /api/admin/users/{id}/restore` (`crate::ops::Ops::restore_user`).
pub(crate) async fn restore(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(target): Ids<UserId>,
) -> Result<Json<Restored>, ApiError> {
    admin_only(&app, &user).await?;
    let actor = user.actor(&app).await?;
    Ok(Json(app.ops.restore_user(&actor, &target).await?))
}

#[derive(Serialize)]
pub(crate) struct AdminUser {
    id: String,
    email: String,
    created_at: i64,
    /// When its newest live session began; `null` when it has none.
    last_login: Option<i64>,
    /// When it was revoked everywhere (null: it may log in).
    revoked_at: Option<i64>,
    rooms: Vec<Membership>,
}

#[derive(Serialize)]
pub(crate) struct Membership {
    id: String,
    name: String,
    role: String,
}

/// `GET /api/admin/users?q=TEXT`: accounts whose email contains `q`, by email, each with the
/// rooms it is in (at most 200 accounts).
pub(crate) async fn users(
    State(app): State<AppState>,
    user: AuthUser,
    Query(query): Query<UsersQuery>,
) -> Result<Json<Vec<AdminUser>>, ApiError> {
    admin_only(&app, &user).await?;
    if query.q.chars().count() > MAX_QUERY {
        return Err(ApiError::BadRequest("the search is too long"));
    }
    let q = query.q.trim();
    let rows = app.ops.store.users_matching(q, MAX_USERS).await?;
    let mut rooms: std::collections::HashMap<String, Vec<Membership>> = Default::default();
    for (user, id, name, role) in app.ops.store.memberships_matching(q).await? {
        rooms
            .entry(user)
            .or_default()
            .push(Membership { id, name, role });
    }
    Ok(Json(
        rows.into_iter()
            .map(|r| AdminUser {
                rooms: rooms.remove(&r.id).unwrap_or_default(),
                id: r.id,
                email: r.email,
                created_at: r.created_at,
                last_login: r.last_login,
                revoked_at: r.revoked_at,
            })
            .collect(),
    ))
}

/// `POST /api/admin/users/{id}/revoke` (`crate::ops::Ops::revoke_user`).
pub(crate) async fn revoke(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(target): Ids<UserId>,
) -> Result<Json<Revoked>, ApiError> {
    admin_only(&app, &user).await?;
    let actor = user.actor(&app).await?;
    Ok(Json(app.ops.revoke_user(&actor, &target).await?))
}

#[derive(Serialize)]
pub(crate) struct AdminDeletion {
    id: String,
    room_id: String,
    /// `null` once the room is gone.
    room_name: Option<String>,
    /// `pending_confirmation`, `confirmed` (under way) or `done`.
    state: crate::store::DeletionState,
    requested_by: String,
    requested_by_email: Option<String>,
    requested_at: i64,
    confirmed_by: Option<String>,
    confirmed_at: Option<i64>,
}

/// `GET /api/admin/deletions`: every room deletion, those waiting for confirmation first, then
/// the newest (at most 200); each one's receipt is at `GET /api/deletions/{id}`.
pub(crate) async fn deletions(
    State(app): State<AppState>,
    user: AuthUser,
) -> Result<Json<Vec<AdminDeletion>>, ApiError> {
    admin_only(&app, &user).await?;
    let rows = app.ops.store.deletions_listed(MAX_DELETIONS).await?;
    Ok(Json(
        rows.into_iter()
            .map(|d| AdminDeletion {
                id: d.id,
                room_id: d.room_id.to_string(),
                room_name: d.room_name,
                state: d.state,
                requested_by: d.requested_by,
                requested_by_email: d.requested_by_email,
                requested_at: d.requested_at,
                confirmed_by: d.confirmed_by,
                confirmed_at: d.confirmed_at,
            })
            .collect(),
    ))
}

//! The admin console's API (system admins, `--admin-emails`): the accounts and the rooms they
//! are in, revoking an account everywhere, and every room deletion. Anyone else gets 403.

use crate::http::access::remove_from_room;
use crate::http::extract::Ids;
use crate::http::state::SessionEnded;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::{RoomId, UserId};
use crate::store::Change;
use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

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
        .route("/api/admin/deletions", get(deletions))
        .route("/api/admin/audit", get(system_audit))
}

/// `GET /api/admin/audit`: the system chain (logins' anchors, revocations, deletions'
/// confirmations), in the shape of a room's `GET .../audit`, for the console to verify.
pub(crate) async fn system_audit(
    State(app): State<AppState>,
    user: AuthUser,
) -> Result<Json<Vec<crate::http::access::AuditEntry>>, ApiError> {
    admin_only(&app, &user).await?;
    Ok(Json(
        crate::http::access::chain_entries(&app, "system").await?,
    ))
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

#[derive(Serialize)]
pub(crate) struct AdminUser {
    id: String,
    email: String,
    created_at: i64,
    /// When its newest live session began; `null` when it has none.
    last_login: Option<i64>,
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
    let rows = app.store.users_matching(q, MAX_USERS).await?;
    let mut rooms: std::collections::HashMap<String, Vec<Membership>> = Default::default();
    for (user, id, name, role) in app.store.memberships_matching(q).await? {
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
            })
            .collect(),
    ))
}

#[derive(Serialize)]
pub(crate) struct Revoked {
    user_id: String,
    email: String,
    /// The rooms they were removed from.
    rooms: Vec<String>,
    /// Sessions ended (each one's sockets close).
    sessions: usize,
}

/// `POST /api/admin/users/{id}/revoke`: removes the account from every room (each removal
/// recorded in that room's chain, its sockets there closed), ends every session it has (every
/// socket it opened closes), and records the whole in the system chain. The account stays: it
/// may log in again, into no room. An admin cannot revoke themself here.
pub(crate) async fn revoke(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(target): Ids<UserId>,
) -> Result<Json<Revoked>, ApiError> {
    admin_only(&app, &user).await?;
    let email = app
        .store
        .user_email(&target)
        .await?
        .ok_or(ApiError::NotFound)?;
    if target.to_string() == user.id {
        return Err(ApiError::BadRequest("you cannot revoke your own account"));
    }
    let mut rooms = Vec::new();
    for room in app.store.rooms_of(&target).await? {
        let Some(room_id) = RoomId::parse(&room.id) else {
            continue;
        };
        remove_from_room(&app, &room_id, &target, &user).await?;
        rooms.push(room.id);
    }
    let ended = app.store.delete_sessions_of(&target).await?;
    let at = std::time::Instant::now();
    for hash in &ended {
        let _ = app.sessions_ended.send(SessionEnded {
            hash: hash.clone(),
            at,
        });
        crate::http::events::announce(
            &app,
            crate::http::events::Event::SessionEnded { hash: hash.clone() },
        )
        .await;
    }
    let details = json!({
        "target": target,
        "email": email,
        "rooms": rooms,
        "sessions": ended.len(),
    });
    app.audit
        .record(
            "system",
            &user.id,
            "revoke_user",
            "allow",
            "",
            details,
            Change::None,
        )
        .await?;
    tracing::info!(admin = %user.email, user = %email, rooms = rooms.len(), sessions = ended.len(), "account revoked everywhere");
    Ok(Json(Revoked {
        user_id: target.to_string(),
        email,
        rooms,
        sessions: ended.len(),
    }))
}

#[derive(Serialize)]
pub(crate) struct AdminDeletion {
    id: String,
    room_id: String,
    /// `null` once the room is gone.
    room_name: Option<String>,
    /// `pending_confirmation`, `confirmed` (under way) or `done`.
    state: String,
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
    let rows = app.store.deletions_listed(MAX_DELETIONS).await?;
    Ok(Json(
        rows.into_iter()
            .map(|d| AdminDeletion {
                id: d.id,
                room_id: d.room_id,
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

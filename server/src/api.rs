//! Room routes of the public API.

use crate::app::AppState;
use crate::auth::AuthUser;
use crate::error::ApiError;
use crate::store::now_ms;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use coderoom_authz::{decide, Action, Authorized, Capability, CapabilitySet, Decision, RoomState};
use serde::Deserialize;
use serde_json::{json, Value};

/// Longest room name, in characters.
const MAX_ROOM_NAME: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRoom {
    name: String,
}

pub async fn create_room(
    State(app): State<AppState>,
    user: AuthUser,
    Json(body): Json<CreateRoom>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > MAX_ROOM_NAME || name.chars().any(char::is_control)
    {
        return Err(ApiError::BadRequest(
            "name must be 1 to 100 printable characters",
        ));
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let change = crate::store::Change::CreateRoom {
        id: id.clone(),
        name: name.to_owned(),
        owner: user.id.clone(),
    };
    let details = json!({ "name": name });
    app.audit
        .record(&id, &user.id, "create_room", "allow", "", details, change)
        .await?;
    tracing::info!(room = %id, user = %user.id, "room created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

pub async fn list_rooms(
    State(app): State<AppState>,
    user: AuthUser,
) -> Result<Json<Value>, ApiError> {
    let rooms = app.store.rooms_of(&user.id).await?;
    Ok(Json(Value::Array(
        rooms
            .into_iter()
            .map(|r| json!({ "id": r.id, "name": r.name, "created_at": r.created_at }))
            .collect(),
    )))
}

pub async fn get_room(
    State(app): State<AppState>,
    user: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mine = room_capabilities(&app, &id, &user).await?;
    let room = app.store.room(&id).await?.ok_or(ApiError::NotFound)?;
    let state = app.store.room_state(&id).await?;
    let now = now_ms();
    let participants: Vec<Value> = app
        .store
        .participants(&id)
        .await?
        .into_iter()
        .map(|p| {
            let caps = state.capabilities_of(&p.user_id, now);
            json!({
                "user_id": p.user_id,
                "email": p.email,
                "role": p.role,
                "capabilities": caps.names(),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": room.id,
        "name": room.name,
        "participants": participants,
        "my_capabilities": mine.names(),
        // The room manifest: only an authorised, audited change alters it; joining never does.
        // Repositories, secret rules, egress and budgets come with the features that use them;
        // until then a room has none.
        "repos": [],
        "secret_rules": [],
        "egress_allowlist": [],
        "budget": null,
        "sandbox": app.sandboxes.status(&id).await?,
    })))
}

/// The room's state and the caller's proof of `observe`, decided like every other action.
/// Rooms the caller cannot observe are reported as missing, so their existence does not leak.
async fn observed(
    app: &AppState,
    room_id: &str,
    user: &AuthUser,
) -> Result<(RoomState, Authorized), ApiError> {
    if !crate::access::valid_id(room_id) {
        return Err(ApiError::NotFound);
    }
    let state = app.store.room_state(room_id).await?;
    let who = crate::access::principal(app, user);
    match decide(&who, &Action::Use(Capability::Observe), &state, now_ms()) {
        Decision::Allow(proof) => Ok((state, proof)),
        Decision::Deny(_) | Decision::NeedsApproval(_) => Err(ApiError::NotFound),
    }
}

/// The caller's capabilities in the room (404 unless it may observe it).
pub async fn room_capabilities(
    app: &AppState,
    room_id: &str,
    user: &AuthUser,
) -> Result<CapabilitySet, ApiError> {
    Ok(observed(app, room_id, user).await?.1.actor_capabilities())
}

/// Until when the caller may edit and observe in the room (see `room::until_pair`).
pub async fn room_access(
    app: &AppState,
    room_id: &str,
    user: &AuthUser,
) -> Result<(i64, i64), ApiError> {
    room_until(app, room_id, user, Capability::Edit).await
}

/// Until when (Unix ms; `i64::MAX` for ever, 0 for not at all) the caller may use `cap` (never
/// past its `observe`) and until when it may observe; 404 unless it may observe now.
pub async fn room_until(
    app: &AppState,
    room_id: &str,
    user: &AuthUser,
    cap: Capability,
) -> Result<(i64, i64), ApiError> {
    Ok(room_rights(app, room_id, user, cap).await?.0)
}

/// [`room_until`] and the caller's capabilities, from one look at the room.
pub async fn room_rights(
    app: &AppState,
    room_id: &str,
    user: &AuthUser,
    cap: Capability,
) -> Result<((i64, i64), CapabilitySet), ApiError> {
    let (state, proof) = observed(app, room_id, user).await?;
    let p = state.participants.get(&user.id).ok_or(ApiError::NotFound)?;
    Ok((
        crate::room::until_of(p, cap, now_ms()),
        proof.actor_capabilities(),
    ))
}

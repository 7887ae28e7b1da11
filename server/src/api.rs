//! Room routes of the public API.

use crate::app::AppState;
use crate::auth::AuthUser;
use crate::error::ApiError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use coderoom_authz::{Capability, CapabilitySet, Role};
use serde::Deserialize;
use serde_json::{json, Value};

/// Longest room name, in characters.
const MAX_ROOM_NAME: usize = 100;
/// Longest room id accepted in a path (ids we issue are 32 hex characters).
const MAX_ROOM_ID: usize = 64;

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
    app.store.create_room(&id, name, &user.id).await?;
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
    let participants = app.store.participants(&id).await?;
    let participants: Vec<Value> = participants
        .into_iter()
        .map(|p| {
            let caps = p
                .role
                .parse::<Role>()
                .map(Role::capabilities)
                .unwrap_or(CapabilitySet::EMPTY);
            json!({
                "user_id": p.user_id,
                "email": p.email,
                "role": p.role,
                "capabilities": cap_names(caps),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": room.id,
        "name": room.name,
        "participants": participants,
        "my_capabilities": cap_names(mine),
        "sandbox": { "tier": "none", "state": "absent" },
    })))
}

fn cap_names(caps: CapabilitySet) -> Vec<&'static str> {
    caps.iter().map(Capability::as_str).collect()
}

/// The caller's capabilities in the room. Rooms the caller is not in are reported as missing,
/// so their existence does not leak.
pub async fn room_capabilities(
    app: &AppState,
    room_id: &str,
    user: &AuthUser,
) -> Result<CapabilitySet, ApiError> {
    if room_id.len() > MAX_ROOM_ID || !room_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ApiError::NotFound);
    }
    let role = app
        .store
        .role_of(room_id, &user.id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let caps = role
        .parse::<Role>()
        .map(Role::capabilities)
        .map_err(|_| ApiError::Forbidden)?;
    if !caps.contains(Capability::Observe) {
        return Err(ApiError::NotFound);
    }
    Ok(caps)
}

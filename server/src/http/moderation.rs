//! Moderated rooms: an agent types in the shared terminal only while a person who holds
//! `approve` is in the room (has the room's document or terminal open).
//! `PUT /api/rooms/{id}/moderation` `{"moderated": true | false}` needs `approve`; audited.

use crate::http::extract::Ids;
use crate::http::guard::use_and_record;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use crate::store::Change;
use axum::extract::State;
use axum::routing::put;
use axum::{Json, Router};
use coderoom_authz::Capability;
use serde::Deserialize;
use serde_json::json;

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/api/rooms/{id}/moderation", put(set))
}

/// Who has a room open now: connections per (room, user).
pub(crate) type Present = crate::http::counted::Counted<(String, String)>;

/// Who has the room open now.
fn in_room(present: &Present, room_id: &str) -> Vec<String> {
    present
        .keys()
        .into_iter()
        .filter(|(r, _)| r == room_id)
        .map(|(_, u)| u)
        .collect()
}

/// Why an agent may not type now.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unmoderated(pub &'static str);

/// Whether `user_id` may type in the room's terminal now: anyone may, except an agent in a
/// moderated room while no person who holds `approve` has the room open.
pub(crate) async fn may_type(
    app: &AppState,
    room_id: &RoomId,
    user_id: &str,
) -> Result<Result<(), Unmoderated>, ApiError> {
    if !app.store.room_moderated(room_id).await? {
        return Ok(Ok(()));
    }
    let state = app.store.room_state(room_id).await?;
    if !state.agents.contains_key(user_id) {
        return Ok(Ok(()));
    }
    let now = app.clock.now_ms();
    let watched = in_room(&app.present, room_id).iter().any(|u| {
        !state.agents.contains_key(u) && state.capabilities_of(u, now).contains(Capability::Approve)
    });
    Ok(if watched {
        Ok(())
    } else {
        Err(Unmoderated(
            "this room is moderated: an agent types in the terminal only while someone who can approve is in the room",
        ))
    })
}

/// Why keys typed by `who` may not reach the terminal now (`None`: they may): the room's
/// moderation, then the budgets, each line the keys end checked and charged as a command in one
/// step (keys within a line are checked only). For agents, on their terminal socket and through
/// MCP `terminal_send`.
pub(crate) async fn may_type_lines(
    app: &AppState,
    room_id: &RoomId,
    who: &str,
    data: &[u8],
) -> Option<String> {
    use crate::spend::Meter;
    match may_type(app, room_id, who).await {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Some(why.0.to_owned()),
        Err(_) => return Some("the room's moderation cannot be read now".to_owned()),
    }
    let commands = crate::spend::lines(data);
    match app
        .spend
        .try_charge(room_id, who, Meter::Execs, commands)
        .await
    {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("the room's spend cannot be read now".to_owned()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Moderation {
    moderated: bool,
}

async fn set(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<Moderation>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let details = json!({ "moderated": body.moderated });
    let change = Change::SetModerated {
        room_id: room_id.to_string(),
        moderated: body.moderated,
    };
    let what = (Capability::Approve, "set_moderation");
    use_and_record(&app, &room_id, &user, what, details.clone(), change).await?;
    Ok(Json(details))
}

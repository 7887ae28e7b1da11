//! Moderated rooms (`crate::ops::moderation`): `PUT /api/rooms/{id}/moderation`
//! `{"moderated": true | false}` needs `approve`; recorded.

use crate::http::extract::OnRoom;
use crate::http::{ApiError, AppState};
use crate::ops::record::{Act, Entry, Verdict};
use crate::store::Change;
use axum::routing::put;
use axum::{Json, Router};
use coderoom_authz::Capability;
use serde::Deserialize;
use serde_json::json;

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/api/rooms/{id}/moderation", put(set))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Moderation {
    moderated: bool,
}

async fn set(
    on: OnRoom,
    Json(body): Json<Moderation>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let details = json!({ "moderated": body.moderated });
    let change = Change::SetModerated {
        room_id: on.room.clone(),
        moderated: body.moderated,
    };
    let entry = Entry::act(Act::SetModeration, Verdict::Allow, details.clone());
    on.ops
        .use_and_record(&on.room, &on.actor, Capability::Approve, entry, change)
        .await?;
    Ok(Json(details))
}

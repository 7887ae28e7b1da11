//! Moderated rooms (`crate::ops::moderation`): `PUT /api/rooms/{id}/moderation`
//! `{"moderated": true | false}` needs `approve`; recorded.

use crate::http::extract::Acting;
use crate::http::extract::Ids;
use crate::http::{ApiError, AppState};
use crate::ids::RoomId;
use crate::ops::record::{Act, Entry, Verdict};
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Moderation {
    moderated: bool,
}

async fn set(
    State(app): State<AppState>,
    Acting(actor): Acting,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<Moderation>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let details = json!({ "moderated": body.moderated });
    let change = Change::SetModerated {
        room_id: room_id.to_string(),
        moderated: body.moderated,
    };
    let entry = Entry::act(Act::SetModeration, Verdict::Allow, details.clone());
    app.ops
        .use_and_record(&room_id, &actor, Capability::Approve, entry, change)
        .await?;
    Ok(Json(details))
}

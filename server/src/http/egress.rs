//! The room's network: `GET /api/rooms/{id}/egress` (its allowlist, presets, recent refusals
//! and counters) and `PUT /api/rooms/{id}/egress` (an audited change of the allowlist; needs
//! `approve`, so joining a room never widens what its sandbox reaches).

use crate::egress::policy::PRESETS;
use crate::egress::Policy;
use crate::http::extract::Ids;
use crate::http::guard::{authorize, room_capabilities};
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use crate::store::Change;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use coderoom_authz::{Action, Capability};
use serde::Deserialize;
use serde_json::{json, Value};

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/api/rooms/{id}/egress", get(show).put(change))
}

/// The room's egress as the API shows it.
async fn view(app: &AppState, room_id: &str) -> Value {
    let policy = app.egress.policy(room_id).await;
    let presets: Vec<Value> = PRESETS
        .iter()
        .map(|(name, label, hosts)| json!({ "name": name, "label": label, "hosts": hosts }))
        .collect();
    let mut v = json!({
        "allow": policy.allow,
        "presets": policy.presets,
        "available_presets": presets,
    });
    if let (Some(out), Value::Object(activity)) = (v.as_object_mut(), app.egress.activity(room_id))
    {
        out.extend(activity);
    }
    v
}

async fn show(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Value>, ApiError> {
    room_capabilities(&app, &room_id, &user).await?;
    Ok(Json(view(&app, &room_id).await))
}

/// The change: either list may be left out (unchanged).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangeEgress {
    allow: Option<Vec<String>>,
    presets: Option<Vec<String>>,
}

async fn change(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<ChangeEgress>,
) -> Result<Json<Value>, ApiError> {
    let before = app.egress.policy(&room_id).await;
    let after = Policy {
        allow: body.allow.unwrap_or_else(|| before.allow.clone()),
        presets: body.presets.unwrap_or_else(|| before.presets.clone()),
    }
    .checked()
    .map_err(|e| ApiError::Invalid(e.to_string()))?;
    let added: Vec<&String> = after
        .allow
        .iter()
        .chain(&after.presets)
        .filter(|r| !before.allow.contains(r) && !before.presets.contains(r))
        .collect();
    let removed: Vec<&String> = before
        .allow
        .iter()
        .chain(&before.presets)
        .filter(|r| !after.allow.contains(r) && !after.presets.contains(r))
        .collect();
    let details = json!({
        "allow": after.allow, "presets": after.presets, "added": added, "removed": removed,
    });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Approve),
        details.clone(),
    )
    .await?;
    let stored = serde_json::to_string(&after).map_err(|_| ApiError::Internal)?;
    app.audit
        .record(
            &room_id,
            proof.actor(),
            "set_egress",
            "allow",
            "",
            details,
            Change::SetEgress {
                room_id: room_id.to_string(),
                policy: stored,
            },
        )
        .await?;
    Ok(Json(view(&app, &room_id).await))
}

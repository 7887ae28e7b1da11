//! The room's network: `GET /api/rooms/{id}/egress` (its allowlist, presets, recent refusals
//! and counters) and `PUT /api/rooms/{id}/egress` (an audited change of the allowlist; needs
//! `approve`, so joining a room never widens what its sandbox reaches).

use crate::egress::policy::Rule;
use crate::egress::policy::PRESETS;
use crate::egress::Policy;
use crate::http::extract::Ids;
use crate::http::guard::{authorize_locked, room_capabilities};
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
    Router::new()
        .route("/api/rooms/{id}/egress", get(show).put(change))
        .route("/api/rooms/{id}/egress/allow", axum::routing::post(allow))
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

/// What a change of the policy did, for the audit record.
fn diff(before: &Policy, after: &Policy) -> Value {
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
    json!({
        "allow": after.allow, "presets": after.presets, "added": added, "removed": removed,
    })
}

fn stored(room_id: &RoomId, p: &Policy) -> Result<Change, ApiError> {
    Ok(Change::SetEgress {
        room_id: room_id.to_string(),
        policy: serde_json::to_string(p).map_err(|_| ApiError::Internal)?,
    })
}

/// `PUT`: the whole policy (either list may be left out). Read, decided and written under the
/// audit lock, so a concurrent change is never lost.
async fn change(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<ChangeEgress>,
) -> Result<Json<Value>, ApiError> {
    let locked = app.audit.lock().await;
    let before = app.egress.policy(&room_id).await;
    let after = Policy {
        allow: body.allow.unwrap_or_else(|| before.allow.clone()),
        presets: body.presets.unwrap_or_else(|| before.presets.clone()),
    }
    .checked()
    .map_err(|e| ApiError::Invalid(e.to_string()))?;
    let details = diff(&before, &after);
    let proof = authorize_locked(
        &app,
        &locked,
        &room_id,
        &user,
        Action::Use(Capability::Approve),
        details.clone(),
    )
    .await?;
    locked
        .record(
            &room_id,
            proof.actor(),
            "set_egress",
            "allow",
            "",
            details,
            stored(&room_id, &after)?,
        )
        .await?;
    drop(locked);
    Ok(Json(view(&app, &room_id).await))
}

/// The ask: one rule to add.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AllowRule {
    rule: String,
    /// An approval of exactly this rule, for a caller without `approve`.
    #[serde(default)]
    approval_id: Option<String>,
}

/// `POST /api/rooms/{id}/egress/allow` `{"rule"}`: adds one rule. Holders of `approve` add it
/// at once; holders of `edit` get `202 {"approval_id", "state": "pending_approval"}` and, once
/// someone else who holds `approve` agrees, add it by asking again with the `approval_id`.
pub(crate) async fn allow(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<AllowRule>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let rule = body.rule.trim().to_ascii_lowercase();
    Rule::parse(&rule).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let params = json!({ "rule": rule }).to_string();
    let approval =
        crate::http::approvals::presented(&app, &room_id, body.approval_id.as_deref()).await?;
    let action = Action::AllowEgress { params, approval };
    let gate = crate::http::approvals::gate(&app, &room_id, &user, action, json!({ "rule": rule }))
        .await?;
    let (proof, approval) = match gate {
        crate::http::approvals::Gate::Allowed { proof, approval } => (proof, approval),
        crate::http::approvals::Gate::Pending(response) => return Ok(response),
    };
    let locked = app.audit.lock().await;
    let before = app.egress.policy(&room_id).await;
    let mut after = before.clone();
    if !after.allow.contains(&rule) {
        after.allow.push(rule.clone());
    }
    let after = after
        .checked()
        .map_err(|e| ApiError::Invalid(e.to_string()))?;
    let mut details = diff(&before, &after);
    details["approval_id"] = json!(approval);
    let change = stored(&room_id, &after)?;
    // The approval is spent with the change, in one transaction.
    let change = change.spending(approval);
    crate::http::approvals::spent(
        locked
            .record(
                &room_id,
                proof.actor(),
                "allow_egress",
                "allow",
                "",
                details,
                change,
            )
            .await,
    )?;
    drop(locked);
    Ok(Json(view(&app, &room_id).await).into_response())
}

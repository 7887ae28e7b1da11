//! The room's spend: `GET /api/rooms/{id}/spend` (its meters, per participant, and its
//! budget), `PUT /api/rooms/{id}/budget` (the room's budget or an agent's: needs `spend`; a
//! raise needs someone else's approval), and the gate metered work passes (see
//! `crate::spend`).

use crate::http::extract::Ids;
use crate::http::guard::room_capabilities;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use crate::spend::{Budget, Meter, Reached};
use crate::store::Change;
use crate::terminal::TermEvent;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use coderoom_authz::Action;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/spend", get(show))
        .route("/api/rooms/{id}/budget", put(set_budget))
}

/// An agent's budget cannot cap sandbox time: that is the room's (charged to its sandbox, not
/// to whoever started it).
pub(crate) fn agent_budget(b: &Budget) -> Result<(), ApiError> {
    if b.limit(Meter::SandboxSeconds).is_some() {
        return Err(ApiError::BadRequest(
            "an agent's budget cannot hold sandbox_seconds: sandbox time is the room's budget",
        ));
    }
    Ok(())
}

fn meters_json(used: impl Fn(Meter) -> u64) -> Value {
    Value::Object(
        Meter::ALL
            .into_iter()
            .map(|m| (m.as_str().to_owned(), json!(used(m))))
            .collect::<Map<_, _>>(),
    )
}

async fn show(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Value>, ApiError> {
    room_capabilities(&app, &room_id, &user).await?;
    Ok(Json(view(&app, &room_id).await?))
}

/// `{"budget", "used", "remaining", "by_tier", "participants": [...]}`: everything charged so
/// far is written first, so the figures are the sums of the room's `metered` audit records.
pub(crate) async fn view(app: &AppState, room_id: &RoomId) -> Result<Value, ApiError> {
    let used = app.spend.written(room_id).await?;
    let budget = app.spend.budget(room_id).await?;
    let people: BTreeMap<String, String> = app
        .store
        .participants(room_id)
        .await?
        .into_iter()
        .map(|p| (p.user_id, p.email))
        .collect();
    let agents = app.store.agents(room_id).await?;
    let total = |m: Meter| crate::spend::total(&used, m);
    let mut whos: Vec<&String> = used.keys().map(|(w, _)| w).collect();
    whos.dedup();
    let mut by_tier = Map::new();
    let participants: Vec<Value> = whos
        .into_iter()
        .map(|who| {
            let of = |m: Meter| used.get(&(who.clone(), m)).copied().unwrap_or(0);
            let agent = agents.iter().find(|a| &a.agent_id == who);
            let (kind, name, budget) = if let Some(tier) = who.strip_prefix("sandbox:") {
                by_tier.insert(tier.to_owned(), json!(of(Meter::SandboxSeconds)));
                ("sandbox", format!("the sandbox ({tier} tier)"), Value::Null)
            } else if let Some(a) = agent {
                let b = Budget::parse(&a.budget).unwrap_or_default();
                ("agent", format!("{} (agent)", a.name), b.to_json())
            } else if let Some(email) = people.get(who) {
                ("person", email.clone(), Value::Null)
            } else {
                match who.as_str() {
                    "terminal" => ("code", "the shared terminal".to_owned(), Value::Null),
                    "readiness" => ("code", "the readiness step".to_owned(), Value::Null),
                    "sandbox" | "other" => ("code", "code in the sandbox".to_owned(), Value::Null),
                    // A participant since removed: still shown, by id.
                    _ => ("person", who.clone(), Value::Null),
                }
            };
            json!({ "who": who, "kind": kind, "name": name, "used": meters_json(of), "budget": budget })
        })
        .collect();
    let remaining = Value::Object(
        Meter::ALL
            .into_iter()
            .filter_map(|m| {
                budget
                    .limit(m)
                    .map(|l| (m.as_str().to_owned(), json!(l.saturating_sub(total(m)))))
            })
            .collect::<Map<_, _>>(),
    );
    Ok(json!({
        "budget": if budget.is_empty() { Value::Null } else { budget.to_json() },
        "used": meters_json(total),
        "remaining": remaining,
        "by_tier": by_tier,
        "participants": participants,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetBudget {
    /// The limits (`null`: none); see [`Budget::parse`].
    budget: Value,
    /// An agent's budget instead of the room's.
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    approval_id: Option<String>,
}

/// `PUT /api/rooms/{id}/budget`: sets the room's budget (or an agent's). Lowering takes effect
/// at once; a raise answers 202 with an approval to ask someone else for, and takes effect when
/// called again with that approval.
async fn set_budget(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<SetBudget>,
) -> Result<Response, ApiError> {
    let after = Budget::parse(&body.budget).map_err(|e| ApiError::Invalid(e.0))?;
    if body.agent_id.is_some() {
        agent_budget(&after)?;
    }
    let before = match &body.agent_id {
        None => app.spend.budget(&room_id).await?,
        Some(id) => match app.store.agent(id).await? {
            Some(a) if a.room_id == room_id.as_str() => {
                Budget::parse(&a.budget).unwrap_or_default()
            }
            _ => return Err(ApiError::NotFound),
        },
    };
    // A limit lifted or increased is a raise; a first budget, or a lower one, is not.
    let raise = before.raised_by(&after);
    let params = json!({ "agent": body.agent_id, "budget": after.to_json() }).to_string();
    let approval =
        crate::http::approvals::presented(&app, &room_id, body.approval_id.as_deref()).await?;
    let action = Action::SetBudget {
        params,
        approval,
        raise,
    };
    let details = json!({
        "agent": body.agent_id,
        "before": before.to_json(),
        "after": after.to_json(),
        "raise": raise,
    });
    let gate = crate::http::approvals::gate(&app, &room_id, &user, action, details.clone()).await?;
    let (proof, approval) = match gate {
        crate::http::approvals::Gate::Allowed { proof, approval } => (proof, approval),
        crate::http::approvals::Gate::Pending(response) => return Ok(response),
    };
    let stored = after.to_json().to_string();
    let change = match &body.agent_id {
        None => Change::SetBudget {
            room_id: room_id.to_string(),
            budget: (!after.is_empty()).then_some(stored),
        },
        Some(id) => Change::SetAgentBudget {
            user_id: id.clone(),
            budget: stored,
        },
    };
    let mut details = details;
    details["approval_id"] = json!(approval);
    crate::http::approvals::spent(
        app.audit
            .record(
                &room_id,
                proof.actor(),
                "set_budget",
                "allow",
                "",
                details,
                change.spending(approval),
            )
            .await,
    )?;
    app.spend
        .budget_set(&room_id, body.agent_id.as_deref(), after.clone());
    let event = TermEvent::Budget {
        agent: body.agent_id.clone(),
        budget: after.to_json(),
    };
    app.sandboxes.notice(&room_id, event).await;
    Ok(Json(view(&app, &room_id).await?).into_response())
}

/// Tells each room of a budget it reached (a `spent` terminal event and an audit record), and
/// stops the sandbox of a room out of sandbox seconds (snapshotted first: nothing is lost).
pub(crate) fn announce(app: AppState, mut reached: tokio::sync::mpsc::UnboundedReceiver<Reached>) {
    tokio::spawn(async move {
        while let Some(r) = reached.recv().await {
            // Each on its own: one room's stop (a snapshot) holds up no other room's notice.
            tokio::spawn(reached_one(app.clone(), r));
        }
    });
}

/// One budget reached: recorded, told to the room, and a room out of sandbox time stopped
/// (announced again a while later when its stop failed, so it is tried again).
async fn reached_one(app: AppState, r: Reached) {
    let Some(room_id) = RoomId::parse(&r.room_id) else {
        return;
    };
    let message = r.exhausted.to_string();
    let details = json!({
        "agent": r.agent,
        "meter": r.exhausted.meter,
        "used": r.exhausted.used,
        "budget": r.exhausted.budget,
        "scope": r.exhausted.scope,
    });
    if let Err(e) = app
        .audit
        .record(
            &room_id,
            "system",
            "budget_reached",
            "allow",
            "",
            details,
            Change::None,
        )
        .await
    {
        tracing::error!(room = %room_id, error = %e, "cannot audit a budget reached");
    }
    let event = TermEvent::Spent {
        agent: r.agent.clone(),
        exhausted: r.exhausted.clone(),
        reason: message.clone(),
    };
    app.sandboxes.notice(&room_id, event).await;
    if r.agent.is_none() && r.exhausted.meter == Meter::SandboxSeconds {
        if let Err(e) = app
            .sandboxes
            .stop_because(&room_id, "system", message)
            .await
        {
            // Its snapshot failed: it keeps running (nothing is lost) and is asked again.
            tracing::warn!(room = %room_id, error = %e, "cannot stop a sandbox out of budget; again in 30 s");
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            app.spend.untell(&room_id, None, Meter::SandboxSeconds);
        }
    }
}

//! Room routes of the public API.

use crate::http::extract::Ids;
use crate::http::guard::room_capabilities;
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::RoomId;
use crate::sandbox::SandboxStatus;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Json;
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms", get(list_rooms).post(create_room))
        .route(
            "/api/rooms/{id}",
            get(get_room).delete(crate::http::deletion::request),
        )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRoom {
    name: String,
}

pub(crate) async fn create_room(
    State(app): State<AppState>,
    user: AuthUser,
    Json(body): Json<CreateRoom>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let actor = app.ops.actor(&user.id, &user.email).await?;
    let id = app.ops.create_room(&actor, &body.name).await?.to_string();
    Ok((StatusCode::CREATED, Json(Created { id })))
}

pub(crate) async fn list_rooms(
    State(app): State<AppState>,
    user: AuthUser,
) -> Result<Json<Vec<RoomItem>>, ApiError> {
    let rooms = app.ops.store.room_list(&user.id).await?;
    Ok(Json(
        rooms
            .into_iter()
            .map(|r| RoomItem {
                last_activity: r.last_activity.unwrap_or(r.created_at),
                id: r.id,
                name: r.name,
                created_at: r.created_at,
                role: r.role,
                members: r.members,
                sandbox: r.sandbox,
            })
            .collect(),
    ))
}

async fn get_room(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(id): Ids<RoomId>,
) -> Result<Json<RoomView>, ApiError> {
    Ok(Json(room_view(&app, &user, &id).await?))
}

/// The room as `user` sees it (`GET /api/rooms/{id}`, MCP's `read_manifest`): not found
/// unless it may observe it.
pub(crate) async fn room_view(
    app: &AppState,
    user: &AuthUser,
    id: &RoomId,
) -> Result<RoomView, ApiError> {
    let mine = room_capabilities(app, id, user).await?;
    let room = app.ops.store.room(id).await?.ok_or(ApiError::NotFound)?;
    let state = app.ops.store.room_state(id).await?;
    let now = app.ops.clock.now_ms();
    let participants = app
        .ops
        .store
        .participants(id)
        .await?
        .into_iter()
        .map(|p| {
            let caps = state.capabilities_of(&p.user_id, now);
            ParticipantView {
                user_id: p.user_id,
                email: p.email,
                display_name: p.display_name,
                role: p.role,
                capabilities: caps.names(),
            }
        })
        .collect::<Vec<ParticipantView>>();
    // The live agents, each with its sponsor and what it holds now.
    let agents = app
        .ops
        .store
        .agents(id)
        .await?
        .into_iter()
        .filter(|a| a.revoked_at.is_none() && a.expires_at > now)
        .map(|a| AgentView {
            sponsor_email: participants
                .iter()
                .find(|p| p.user_id == a.sponsor)
                .map(|p| p.email.clone())
                .unwrap_or_default(),
            capabilities: state.capabilities_of(&a.agent_id, now).names(),
            agent_id: a.agent_id.to_string(),
            name: a.name,
            sponsor: a.sponsor.to_string(),
            approval_mode: a.approval_mode,
            expires_at: a.expires_at,
        })
        .collect();
    // An owner's request to delete the room, until an admin confirms it and it is done.
    let pending_deletion = app.ops.store.open_deletion(id).await?.map(|d| {
        let email = participants
            .iter()
            .find(|p| p.user_id == d.requested_by)
            .map(|p| p.email.clone());
        json!({ "id": d.id, "state": d.state, "requested_by": d.requested_by, "requested_by_email": email })
    });
    Ok(RoomView {
        id: room.id,
        name: room.name,
        pending_deletion,
        participants,
        agents,
        my_capabilities: mine.names(),
        repos: Vec::new(),
        secret_rules: app
            .ops.store
            .secret_rules(id)
            .await?
            .into_iter()
            .map(|r| serde_json::json!({ "name": r.name, "hosts": r.hosts, "header": r.header, "format": r.format }))
            .collect(),
        egress_allowlist: app.ops.egress.policy(id).await.in_force(),
        budget: {
            let b = app.ops.spend.budget(id).await?;
            (!b.is_empty()).then(|| b.to_json())
        },
        // The readiness command and its output are for those who may run commands.
        sandbox: if mine.contains(coderoom_authz::Capability::Type) {
            app.ops.sandboxes.status(id).await?
        } else {
            app.ops.sandboxes.status(id).await?.without_readiness_details()
        },
        parent: room
            .parent
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok()),
        readiness: room
            .readiness
            .filter(|_| mine.contains(coderoom_authz::Capability::Type)),
        checkpoint_policy: crate::ops::checkpoints::policy_view(
            &app.ops.store.checkpoint_policy(id).await?,
        ),
        secrets_need_approval: app.ops.store.secrets_need_approval(id).await?,
        moderated: app.ops.store.room_moderated(id).await?,
    })
}

/// An agent, as the room shows it.
#[derive(Serialize)]
pub(crate) struct AgentView {
    agent_id: String,
    name: String,
    sponsor: String,
    sponsor_email: String,
    /// What it holds now (what it was given that its sponsor holds).
    capabilities: Vec<&'static str>,
    approval_mode: bool,
    expires_at: i64,
}

/// `201` from `POST /api/rooms`.
#[derive(Serialize)]
pub(crate) struct Created {
    id: String,
}

/// One entry of `GET /api/rooms`.
#[derive(Serialize)]
pub(crate) struct RoomItem {
    id: String,
    name: String,
    created_at: i64,
    /// The caller's role preset in the room.
    role: String,
    /// How many people are in it.
    members: i64,
    /// When the room's audit chain last recorded something (else its creation).
    last_activity: i64,
    /// Its sandbox's state, `null` before its first start.
    sandbox: Option<String>,
}

/// `GET /api/rooms/{id}`: the room, its people and its manifest.
#[derive(Serialize)]
pub(crate) struct RoomView {
    id: String,
    name: String,
    /// `{"id", "state", "requested_by", "requested_by_email"}` while a deletion of the room
    /// waits for an admin (`pending_confirmation`) or is under way (`confirmed`); else `null`.
    pending_deletion: Option<Value>,
    participants: Vec<ParticipantView>,
    /// Agents in the room now (see `crate::http::agents`).
    agents: Vec<AgentView>,
    my_capabilities: Vec<&'static str>,
    // The room manifest: only an authorised, audited change alters it; joining never does.
    // Repositories come with the feature that uses them; until then a room has none. `budget`
    // is the room's (`PUT .../budget`), `null` when it has none. `egress_allowlist` is every rule in force (the room's own and its presets' hosts).
    repos: Vec<Value>,
    secret_rules: Vec<Value>,
    egress_allowlist: Vec<String>,
    budget: Option<Value>,
    sandbox: SandboxStatus,
    /// A fork's parentage: `{"room", "checkpoint", "chain_head", "dropped"}` (`dropped` counts
    /// what of the parent's authority the fork did not take); `null` for a room made from
    /// scratch.
    parent: Option<Value>,
    /// The readiness command run after every start of the room's sandbox (`sandbox.readiness`
    /// says where it is).
    readiness: Option<String>,
    /// `{"every_s", "keep_days", "next_at"}` (`PUT .../checkpoint-policy`).
    checkpoint_policy: Value,
    /// Whether adding a secret needs someone else's approval (`PUT .../secrets-policy`).
    secrets_need_approval: bool,
    /// Agents type in the terminal only while a person who holds `approve` is in the room
    /// (`PUT .../moderation`).
    moderated: bool,
}

#[derive(Serialize)]
pub(crate) struct ParticipantView {
    user_id: String,
    email: String,
    /// The name they chose to be shown by, when they chose one.
    #[serde(skip_serializing_if = "Option::is_none")]
    display_name: Option<String>,
    role: String,
    capabilities: Vec<&'static str>,
}

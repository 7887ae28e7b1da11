//! Checkpoints: `POST`/`GET /api/rooms/{id}/checkpoints`, and
//! `POST /api/rooms/{id}/checkpoints/{cid}/restore`.
//!
//! A checkpoint is the room's document and its workspace at one moment, in files under
//! `DATA_DIR/rooms/<room>/checkpoints/<id>/`: `doc.bin` (the document as one Yjs update) and
//! `workspace.tar` (the workspace archive). Restoring one rewrites the document through an
//! ordinary update, made by whoever restores it, and puts the archive back as the sandbox's
//! workspace (see `Actor::rewind`).

use crate::http::extract::Ids;
use crate::http::guard::{authorize, room_capabilities};
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::{IssuedId, RoomId};
use crate::sandbox::snapshots::Meta;
use crate::store::{Change, CheckpointRow};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use coderoom_authz::{Action, Capability};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use yrs::updates::decoder::Decode;
use yrs::{ReadTxn, StateVector, Transact};

/// Longest checkpoint name, in characters.
const MAX_NAME: usize = 100;
/// Checkpoints a room keeps: making one more prunes the oldest (audited).
pub(crate) const MAX_CHECKPOINTS: usize = 20;
const DOC_FILE: &str = "doc.bin";
const WORKSPACE_FILE: &str = "workspace.tar";
/// What the server knows of the archive (a snapshot record: `{"agreed", "ready_for"}`).
const WORKSPACE_META_FILE: &str = "workspace.json";

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/checkpoints", get(list).post(create))
        .route("/api/rooms/{id}/checkpoints/{cid}/restore", post(restore))
        .route("/api/rooms/{id}/fork", post(fork))
        .route(
            "/api/rooms/{id}/checkpoint-policy",
            axum::routing::put(set_policy),
        )
}

/// A checkpoint's or a fork's name: 1 to [`MAX_NAME`] printable characters.
fn checked_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(
            "name must be 1 to 100 printable characters",
        ));
    }
    Ok(())
}

/// Where a room's checkpoints are.
pub(crate) fn dir_of(app: &AppState, room_id: &str) -> PathBuf {
    app.data_dir.join("rooms").join(room_id).join("checkpoints")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateCheckpoint {
    name: String,
}

async fn create(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<CreateCheckpoint>,
) -> Result<(StatusCode, Json<CheckpointRow>), ApiError> {
    let name = body.name.trim().to_owned();
    checked_name(&name)?;
    let details = json!({ "name": name });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Edit),
        details,
    )
    .await?;
    let lock = room_lock(&app, &room_id);
    let _held = lock.lock().await;
    let row = make(&app, &room_id, Maker::person(&user, proof.actor()), name).await?;
    Ok((StatusCode::CREATED, Json(row)))
}

/// The room's checkpoint lock: making, pruning, restoring and forking one at a time per room
/// (a prune never removes a checkpoint a restore or a fork is reading).
pub(crate) fn room_lock(app: &AppState, room_id: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    app.ops.room_lock(room_id)
}

/// Who makes a checkpoint: a person (their id and email: the document is read as them), or
/// the room's schedule.
struct Maker<'a> {
    who: (&'a str, &'a str),
    actor: &'a str,
    scheduled: bool,
}

impl<'a> Maker<'a> {
    fn person(user: &'a AuthUser, actor: &'a str) -> Self {
        Maker {
            who: (&user.id, &user.email),
            actor,
            scheduled: false,
        }
    }

    const SCHEDULE: Maker<'static> = Maker {
        who: ("system", "scheduled checkpoints"),
        actor: "system",
        scheduled: true,
    };
}

/// Makes a checkpoint of the room as it is now: its files, its row, its record.
async fn make(
    app: &AppState,
    room_id: &RoomId,
    maker: Maker<'_>,
    name: String,
) -> Result<CheckpointRow, ApiError> {
    let actor = maker.actor;
    let id = IssuedId::fresh().to_string();
    let dir = dir_of(app, room_id).join(&id);
    let made = write_files(app, room_id, maker.who, &dir).await;
    let bytes = match made {
        Ok(b) => b,
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            return Err(e);
        }
    };
    let row = CheckpointRow {
        id: id.clone(),
        name: name.clone(),
        author: actor.to_owned(),
        at: app.clock.now_ms(),
        bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
        scheduled: maker.scheduled,
    };
    let details =
        json!({ "checkpoint": id, "name": name, "bytes": row.bytes, "scheduled": row.scheduled });
    let recorded = app
        .audit
        .record(
            room_id,
            actor,
            "create_checkpoint",
            "allow",
            "",
            details,
            Change::AddCheckpoint {
                room_id: room_id.to_string(),
                row: row.clone(),
            },
        )
        .await;
    if let Err(e) = recorded {
        let _ = tokio::fs::remove_dir_all(&dir).await;
        return Err(e.into());
    }
    prune(app, room_id).await?;
    Ok(row)
}

/// Writes a checkpoint's files into `dir`: the document (as the room holds it now, read as a
/// participant) and the workspace. Returns their size.
async fn write_files(
    app: &AppState,
    room_id: &RoomId,
    who: (&str, &str),
    dir: &std::path::Path,
) -> Result<u64, ApiError> {
    tokio::fs::create_dir_all(dir).await.map_err(store_io)?;
    let visit = crate::room::visit::Visit::start(&app.rooms, &app.limits, room_id, who)
        .await
        .map_err(|e| ApiError::Sandbox(e.into()))?;
    let doc = visit
        .doc
        .transact()
        .encode_state_as_update_v1(&StateVector::default());
    visit.leave().await;
    crate::sandbox::snapshots::write_durably(&dir.join(DOC_FILE), &doc).await?;
    let (workspace, meta) = app
        .sandboxes
        .archive(room_id, dir.join(WORKSPACE_FILE))
        .await?;
    let meta = serde_json::to_vec(&meta).map_err(|e| store_io(std::io::Error::other(e)))?;
    crate::sandbox::snapshots::write_durably(&dir.join(WORKSPACE_META_FILE), &meta).await?;
    Ok(doc.len() as u64 + workspace)
}

fn store_io(e: std::io::Error) -> ApiError {
    ApiError::Store(crate::store::StoreError::Io(e))
}

/// Keeps the newest [`MAX_CHECKPOINTS`] of each kind (made by people, made by the schedule,
/// so a schedule never pushes out what people made), and none older than the room's policy
/// says: the others are recorded as pruned, then removed.
async fn prune(app: &AppState, room_id: &RoomId) -> Result<(), ApiError> {
    let rows = app.store.checkpoints(room_id).await?;
    let keep_ms = app.store.checkpoint_policy(room_id).await?.keep_ms;
    let now = app.clock.now_ms();
    let mut gone = Vec::new();
    for scheduled in [false, true] {
        let kind: Vec<&CheckpointRow> = rows.iter().filter(|r| r.scheduled == scheduled).collect();
        let over = kind.len().saturating_sub(MAX_CHECKPOINTS);
        for (i, r) in kind.into_iter().enumerate() {
            let too_old = keep_ms.is_some_and(|k| r.at < now - k);
            if i < over || too_old {
                let why = if i < over { "count" } else { "age" };
                gone.push((r.clone(), why));
            }
        }
    }
    for (old, why) in gone {
        let details = json!({
            "checkpoint": old.id, "name": old.name, "by": why,
            "kept": MAX_CHECKPOINTS, "keep_ms": keep_ms,
        });
        let pruned = app
            .audit
            .record(
                room_id,
                "system",
                "prune_checkpoint",
                "allow",
                "",
                details,
                Change::RemoveCheckpoint {
                    room_id: room_id.to_string(),
                    id: old.id.clone(),
                },
            )
            .await;
        match pruned {
            Ok(_) => {}
            // Pruned by another request first.
            Err(crate::store::StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
        let _ = tokio::fs::remove_dir_all(dir_of(app, room_id).join(&old.id)).await;
    }
    Ok(())
}

/// What the server knew of the workspace archive of the checkpoint in `dir`: what it agreed with
/// the document on (so a restore or a fork takes in what only the archive had changed, and
/// keeps what only the document had), and the readiness command completed in it.
async fn workspace_meta(dir: &std::path::Path) -> Meta {
    tokio::fs::read(dir.join(WORKSPACE_META_FILE))
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The text files (path -> text) of the checkpoint in `dir`.
async fn texts_in(dir: &std::path::Path) -> Result<BTreeMap<String, String>, ApiError> {
    let corrupt = || ApiError::Store(crate::store::StoreError::Corrupt);
    let doc = tokio::fs::read(dir.join(DOC_FILE))
        .await
        .map_err(store_io)?;
    let d = yrs::Doc::new();
    let update = yrs::Update::decode_v1(&doc).map_err(|_| corrupt())?;
    d.transact_mut()
        .apply_update(update)
        .map_err(|_| corrupt())?;
    Ok(crate::room::visit::texts_of(&d))
}

async fn list(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Vec<CheckpointRow>>, ApiError> {
    room_capabilities(&app, &room_id, &user).await?;
    Ok(Json(app.store.checkpoints(&room_id).await?))
}

async fn restore(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, cid)): Ids<(RoomId, IssuedId)>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    // `{"approval_id"}` where the room's policy asks for an approval; otherwise no body.
    let approval_id = if body.is_empty() {
        None
    } else {
        let v: RestoreBody = serde_json::from_slice(&body)
            .map_err(|_| ApiError::BadRequest("the body may only hold {\"approval_id\"}"))?;
        v.approval_id
    };
    let policy = app.store.checkpoint_policy(&room_id).await?;
    let approval =
        crate::http::approvals::presented(&app, &room_id, approval_id.as_deref()).await?;
    // A checkpoint that is not there gets no approval asked for it.
    if app.store.checkpoint(&room_id, &cid).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    // Files for everyone (`edit`), and the workspace with its running programs (`type`, as a
    // stop and start of the sandbox needs); an approval where the room asks for one.
    let params = json!({ "checkpoint": cid.as_str() }).to_string();
    let action = Action::RestoreCheckpoint {
        params,
        approval,
        approval_required: policy.restore_needs_approval,
    };
    let details = json!({ "checkpoint": cid.as_str() });
    let (proof, approval) =
        match crate::http::approvals::gate(&app, &room_id, &user, action, details).await? {
            crate::http::approvals::Gate::Allowed { proof, approval } => (proof, approval),
            crate::http::approvals::Gate::Pending(response) => return Ok(response),
        };
    let lock = room_lock(&app, &room_id);
    let _held = lock.lock().await;
    let row = app
        .store
        .checkpoint(&room_id, &cid)
        .await?
        .ok_or(ApiError::NotFound)?;
    let dir = dir_of(&app, &room_id).join(cid.as_str());
    let texts = texts_in(&dir).await?;
    let files = texts.len();
    let meta = workspace_meta(&dir).await;
    // On record (and the approval spent, once) before anything changes: a restore is never
    // done without its record, and one approval never restores twice.
    let details = json!({
        "checkpoint": row.id, "name": row.name, "at": row.at, "files": files,
        "approval_id": approval,
    });
    crate::http::approvals::record_allowed(&app, &room_id, &proof, details, &approval).await?;
    let rewound = app
        .sandboxes
        .rewind(
            &room_id,
            crate::sandbox::supervisor::Rewind {
                archive: dir.join(WORKSPACE_FILE),
                texts,
                who: (user.id.clone(), user.email.clone()),
                what: format!("checkpoint {:?}", row.name),
                meta,
            },
        )
        .await;
    if let Err(e) = rewound {
        // Part of it may have happened (the document rewritten, the workspace not): on record.
        let details = json!({ "checkpoint": row.id, "name": row.name, "error": e.to_string() });
        app.audit
            .record(
                &room_id,
                proof.actor(),
                "restore_checkpoint_failed",
                "allow",
                "",
                details,
                Change::None,
            )
            .await?;
        return Err(e.into());
    }
    Ok(
        Json(json!({ "id": row.id, "name": row.name, "at": row.at, "restored": true }))
            .into_response(),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreBody {
    approval_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkBody {
    #[serde(default)]
    checkpoint: Option<String>,
    #[serde(default)]
    name: Option<String>,
    /// An approval of this fork, for a caller without `export`.
    #[serde(default)]
    approval_id: Option<String>,
}

/// `POST /api/rooms/{id}/fork`: a new room owned by the caller, with the files of a checkpoint
/// (the one named, or one made now) and nothing of the parent's authority: no participants,
/// grants, invites, approvals, checkpoints (nor secrets, repositories, previews or budgets,
/// when rooms have them). The parent's chain records the fork; the new room's first record
/// names the parent, the checkpoint and the parent's chain head after that record.
async fn fork(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<ForkBody>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    // A checkpoint that is not there gets no approval asked for it.
    if let Some(cid) = &body.checkpoint {
        let cid = IssuedId::parse(cid).ok_or(ApiError::NotFound)?;
        if app.store.checkpoint(&room_id, &cid).await?.is_none() {
            return Err(ApiError::NotFound);
        }
    }
    // `observe` plus `export`, or an approval of exactly this fork (202 until there is one).
    let params = json!({ "checkpoint": body.checkpoint }).to_string();
    let approval =
        crate::http::approvals::presented(&app, &room_id, body.approval_id.as_deref()).await?;
    let action = Action::Fork { params, approval };
    let details = json!({ "checkpoint": body.checkpoint });
    let gate = crate::http::approvals::gate(&app, &room_id, &user, action, details).await?;
    let (proof, approval) = match gate {
        crate::http::approvals::Gate::Allowed { proof, approval } => (proof, approval),
        crate::http::approvals::Gate::Pending(response) => return Ok(response),
    };
    let parent = app.store.room(&room_id).await?.ok_or(ApiError::NotFound)?;
    let name = match body.name.as_deref().map(str::trim) {
        Some(n) => n.to_owned(),
        None => {
            let mut n: String = parent.name.chars().take(MAX_NAME - 7).collect();
            n.push_str(" (fork)");
            n
        }
    };
    checked_name(&name)?;
    let lock = room_lock(&app, &room_id);
    let _held = lock.lock().await;
    let checkpoint = match &body.checkpoint {
        Some(cid) => {
            let cid = IssuedId::parse(cid).ok_or(ApiError::NotFound)?;
            app.store
                .checkpoint(&room_id, &cid)
                .await?
                .ok_or(ApiError::NotFound)?
        }
        None => {
            // A checkpoint made for the fork: making one needs `edit`.
            let details = json!({ "fork": null });
            authorize(
                &app,
                &room_id,
                &user,
                Action::Use(Capability::Edit),
                details,
            )
            .await?;
            make(
                &app,
                &room_id,
                Maker::person(&user, proof.actor()),
                format!("fork as {name:?}"),
            )
            .await?
        }
    };
    let dir = dir_of(&app, &room_id).join(&checkpoint.id);
    let texts = texts_in(&dir).await?;
    // A document of its own: the files, none of the parent's history.
    let doc = {
        let d = yrs::Doc::new();
        let files = d.get_or_insert_map("files");
        let mut txn = d.transact_mut();
        for (path, text) in &texts {
            yrs::Map::insert(
                &files,
                &mut txn,
                path.as_str(),
                yrs::TextPrelim::new(text.as_str()),
            );
        }
        txn.encode_update_v1()
    };
    let dropped = json!({
        "participants": app.store.participants(&room_id).await?.len().saturating_sub(1),
        "invites": app.store.invite_count(&room_id).await?,
        "approvals": app.store.approvals(&room_id).await?.len(),
        "checkpoints": app.store.checkpoints(&room_id).await?.len(),
        "secrets": app.store.secret_rules(&room_id).await?.len(),
        "repositories": 0,
        "previews": 0,
        "budgets": 0,
    });
    let new_id = RoomId::fresh();
    let details = json!({
        "room": new_id.as_str(), "checkpoint": checkpoint.id, "name": name,
        "approval_id": approval,
    });
    let forked =
        crate::http::approvals::record_allowed(&app, &room_id, &proof, details, &approval).await?;
    let parentage = json!({
        "room": room_id.as_str(),
        "checkpoint": checkpoint.id,
        "chain_head": forked.hash,
        "dropped": dropped,
    });
    app.audit
        .record(
            &new_id,
            &user.id,
            "create_room",
            "allow",
            "",
            json!({ "name": name, "parent": parentage }),
            Change::ForkRoom {
                id: new_id.to_string(),
                name: name.clone(),
                owner: user.id.clone(),
                parent: parentage.to_string(),
                doc,
                readiness: parent.readiness.clone(),
            },
        )
        .await?;
    let meta = workspace_meta(&dir).await;
    app.sandboxes
        .seed(&new_id, dir.join(WORKSPACE_FILE), meta)
        .await?;
    tracing::info!(room = %new_id, parent = %room_id, user = %user.id, "room forked");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": new_id.as_str(),
            "name": name,
            "parent": { "room": room_id.as_str(), "checkpoint": checkpoint.id, "chain_head": forked.hash },
        })),
    )
        .into_response())
}

/// Longest schedule, and longest age kept.
const MAX_EVERY_MS: i64 = 7 * 24 * 3600 * 1000;
const MAX_KEEP_MS: i64 = 365 * 24 * 3600 * 1000;
/// How often due schedules are looked for.
const SCHEDULE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// A field of the policy body: absent (keep what the room has), `null`, or a value.
fn field<T: serde::de::DeserializeOwned>(
    body: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<Option<Option<T>>, ApiError> {
    match body.get(key) {
        None => Ok(None),
        Some(serde_json::Value::Null) => Ok(Some(None)),
        Some(v) => serde_json::from_value(v.clone())
            .map(|t| Some(Some(t)))
            .map_err(|_| ApiError::BadRequest("every_s and keep_days are numbers or null, restore_needs_approval true or false")),
    }
}

/// `PUT /api/rooms/{id}/checkpoint-policy` `{"every_s": 3600 | null, "keep_days": 30 | null,
/// "restore_needs_approval": true | false}`, each optional (absent: unchanged): scheduled
/// checkpoints (kept 20, apart from the ones people make), an age past which checkpoints are
/// pruned, and whether a restore needs someone else's approval. Room governance: needs
/// `approve` (owners hold it), so those a policy restrains cannot lift it. Audited.
async fn set_policy(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    const KEYS: [&str; 3] = ["every_s", "keep_days", "restore_needs_approval"];
    if body.keys().any(|k| !KEYS.contains(&k.as_str())) {
        return Err(ApiError::BadRequest(
            "the policy holds every_s, keep_days and restore_needs_approval only",
        ));
    }
    let every_s: Option<Option<i64>> = field(&body, "every_s")?;
    let keep_days: Option<Option<i64>> = field(&body, "keep_days")?;
    let approval: Option<Option<bool>> = field(&body, "restore_needs_approval")?;
    let every_ms = every_s.map(|v| v.map(|s| s.saturating_mul(1000)));
    if every_ms
        .flatten()
        .is_some_and(|e| e < app.limits.checkpoint_min_every_ms || e > MAX_EVERY_MS)
    {
        return Err(ApiError::BadRequest(
            "every_s must be from 300 (five minutes) to 604800 (a week), or null",
        ));
    }
    let keep_ms = keep_days.map(|v| v.map(|d| d.saturating_mul(24 * 3600 * 1000)));
    if keep_ms.flatten().is_some_and(|k| k <= 0 || k > MAX_KEEP_MS) {
        return Err(ApiError::BadRequest(
            "keep_days must be from 1 to 365, or null",
        ));
    }
    let details = serde_json::Value::Object(body.clone());
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Approve),
        details.clone(),
    )
    .await?;
    let now_policy = app.store.checkpoint_policy(&room_id).await?;
    let every_ms = every_ms.unwrap_or(now_policy.every_ms);
    let policy = crate::store::CheckpointPolicy {
        every_ms,
        keep_ms: keep_ms.unwrap_or(now_policy.keep_ms),
        due_at: match every_s {
            // A new schedule starts from now; an unchanged one keeps its next time.
            Some(_) => every_ms.map(|e| app.clock.now_ms() + e),
            None => now_policy.due_at,
        },
        restore_needs_approval: approval
            .map_or(now_policy.restore_needs_approval, |a| a.unwrap_or(false)),
    };
    app.audit
        .record(
            &room_id,
            proof.actor(),
            "set_checkpoint_policy",
            "allow",
            "",
            details,
            Change::SetCheckpointPolicy {
                room_id: room_id.to_string(),
                policy,
            },
        )
        .await?;
    let lock = room_lock(&app, &room_id);
    let _held = lock.lock().await;
    prune(&app, &room_id).await?;
    Ok(Json(policy_view(&policy)))
}

/// A policy as the API shows it.
pub(crate) fn policy_view(p: &crate::store::CheckpointPolicy) -> serde_json::Value {
    json!({
        "every_s": p.every_ms.map(|e| e / 1000),
        "keep_days": p.keep_ms.map(|k| k / (24 * 3600 * 1000)),
        "next_at": p.every_ms.and(p.due_at),
        "restore_needs_approval": p.restore_needs_approval,
    })
}

/// Makes the checkpoints rooms' schedules call for, until shutdown. A room whose checkpoint
/// fails is tried again at its next time (and the failure logged).
pub(crate) fn start_scheduler(app: AppState) {
    tokio::spawn(async move {
        let shutdown = app.shutdown.clone();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(SCHEDULE_POLL) => {}
            }
            let now = app.clock.now_ms();
            let due = match app.store.due_checkpoints(now).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "checkpoint schedule: storage unavailable");
                    continue;
                }
            };
            for room in due {
                let Some(room_id) = RoomId::parse(&room) else {
                    continue;
                };
                if let Err(e) = scheduled(&app, &room_id, now).await {
                    tracing::warn!(room = %room_id, error = %e, "scheduled checkpoint failed");
                }
            }
        }
    });
}

async fn scheduled(app: &AppState, room_id: &RoomId, now: i64) -> Result<(), ApiError> {
    let policy = app.store.checkpoint_policy(room_id).await?;
    let Some(every) = policy.every_ms else {
        return Ok(());
    };
    // The next time first: a failure waits for it rather than retrying at once.
    app.store.set_checkpoint_due(room_id, now + every).await?;
    let lock = room_lock(app, room_id);
    let _held = lock.lock().await;
    // A room being deleted gets no more checkpoints (the deletion removes their files under
    // this same lock).
    let deleting = app.store.unfinished_deletions(None).await?;
    if deleting.iter().any(|d| d.room_id == room_id.as_str()) {
        return Ok(());
    }
    if unchanged_since_last(app, room_id).await? {
        return Ok(());
    }
    let name = format!("scheduled {}", now);
    make(app, room_id, Maker::SCHEDULE, name).await?;
    Ok(())
}

/// Whether nothing changed since the room's last scheduled checkpoint: the same files in the
/// document, and a workspace that has not run since (no sandbox running, no snapshot newer).
/// A schedule on an idle room then takes nothing, instead of copies of one state.
async fn unchanged_since_last(app: &AppState, room_id: &RoomId) -> Result<bool, ApiError> {
    let rows = app.store.checkpoints(room_id).await?;
    let Some(last) = rows.iter().rev().find(|r| r.scheduled) else {
        return Ok(false);
    };
    let status = app.sandboxes.status(room_id).await?;
    if status.running() || status.snapshot_at().is_some_and(|t| t > last.at) {
        return Ok(false);
    }
    let visit =
        crate::room::visit::Visit::start(&app.rooms, &app.limits, room_id, Maker::SCHEDULE.who)
            .await
            .map_err(|e| ApiError::Sandbox(e.into()))?;
    let now = crate::room::visit::texts_of(&visit.doc);
    visit.leave().await;
    Ok(texts_in(&dir_of(app, room_id).join(&last.id)).await? == now)
}

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
use crate::store::{Change, CheckpointRow};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use coderoom_authz::{Action, Capability};
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;
use yrs::updates::decoder::Decode;
use yrs::{ReadTxn, StateVector, Transact};

/// Longest checkpoint name, in characters.
const MAX_NAME: usize = 100;
/// Checkpoints a room keeps: making one more prunes the oldest (audited).
pub(crate) const MAX_CHECKPOINTS: usize = 20;
const DOC_FILE: &str = "doc.bin";
const WORKSPACE_FILE: &str = "workspace.tar";

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/checkpoints", get(list).post(create))
        .route("/api/rooms/{id}/checkpoints/{cid}/restore", post(restore))
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
    if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(
            "name must be 1 to 100 printable characters",
        ));
    }
    let details = json!({ "name": name });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Edit),
        details,
    )
    .await?;
    let id = IssuedId::fresh().to_string();
    let dir = dir_of(&app, &room_id).join(&id);
    let made = write_files(&app, &room_id, &user, &dir).await;
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
        author: proof.actor().to_owned(),
        at: app.clock.now_ms(),
        bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
    };
    let details = json!({ "checkpoint": id, "name": name, "bytes": row.bytes });
    let recorded = app
        .audit
        .record(
            &room_id,
            proof.actor(),
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
    prune(&app, &room_id).await?;
    Ok((StatusCode::CREATED, Json(row)))
}

/// Writes a checkpoint's files into `dir`: the document (as the room holds it now, read as a
/// participant) and the workspace. Returns their size.
async fn write_files(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    dir: &std::path::Path,
) -> Result<u64, ApiError> {
    tokio::fs::create_dir_all(dir).await.map_err(store_io)?;
    let visit =
        crate::room::visit::Visit::start(&app.rooms, &app.limits, room_id, (&user.id, &user.email))
            .await
            .map_err(|e| ApiError::Sandbox(e.into()))?;
    let doc = visit
        .doc
        .transact()
        .encode_state_as_update_v1(&StateVector::default());
    visit.leave().await;
    write_durably(&dir.join(DOC_FILE), &doc).await?;
    let workspace = app
        .sandboxes
        .archive(room_id, dir.join(WORKSPACE_FILE))
        .await?;
    Ok(doc.len() as u64 + workspace)
}

async fn write_durably(path: &std::path::Path, data: &[u8]) -> Result<(), ApiError> {
    use tokio::io::AsyncWriteExt as _;
    let mut f = tokio::fs::File::create(path).await.map_err(store_io)?;
    f.write_all(data).await.map_err(store_io)?;
    f.sync_all().await.map_err(store_io)?;
    Ok(())
}

fn store_io(e: std::io::Error) -> ApiError {
    ApiError::Store(crate::store::StoreError::Io(e))
}

/// Keeps the newest [`MAX_CHECKPOINTS`]: older ones are recorded as pruned, then removed.
async fn prune(app: &AppState, room_id: &RoomId) -> Result<(), ApiError> {
    let rows = app.store.checkpoints(room_id).await?;
    let over = rows.len().saturating_sub(MAX_CHECKPOINTS);
    for old in rows.into_iter().take(over) {
        let details = json!({ "checkpoint": old.id, "name": old.name, "kept": MAX_CHECKPOINTS });
        app.audit
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
            .await?;
        let _ = tokio::fs::remove_dir_all(dir_of(app, room_id).join(&old.id)).await;
    }
    Ok(())
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
) -> Result<Json<serde_json::Value>, ApiError> {
    let details = json!({ "checkpoint": cid.as_str() });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Edit),
        details,
    )
    .await?;
    let row = app
        .store
        .checkpoint(&room_id, &cid)
        .await?
        .ok_or(ApiError::NotFound)?;
    let dir = dir_of(&app, &room_id).join(cid.as_str());
    let doc = tokio::fs::read(dir.join(DOC_FILE))
        .await
        .map_err(store_io)?;
    let texts = {
        let d = yrs::Doc::new();
        let update = yrs::Update::decode_v1(&doc)
            .map_err(|_| ApiError::Store(crate::store::StoreError::Corrupt))?;
        d.transact_mut()
            .apply_update(update)
            .map_err(|_| ApiError::Store(crate::store::StoreError::Corrupt))?;
        crate::room::visit::texts_of(&d)
    };
    let files = texts.len();
    app.sandboxes
        .rewind(
            &room_id,
            crate::sandbox::supervisor::Rewind {
                archive: dir.join(WORKSPACE_FILE),
                texts,
                who: (user.id.clone(), user.email.clone()),
                what: format!("checkpoint {:?}", row.name),
            },
        )
        .await?;
    let details = json!({ "checkpoint": row.id, "name": row.name, "at": row.at, "files": files });
    app.audit
        .record(
            &room_id,
            proof.actor(),
            "restore_checkpoint",
            "allow",
            "",
            details,
            Change::None,
        )
        .await?;
    Ok(Json(
        json!({ "id": row.id, "name": row.name, "at": row.at, "restored": true }),
    ))
}

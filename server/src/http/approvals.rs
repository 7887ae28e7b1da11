//! Approvals, and the first action that needs one: exporting room content.
//!
//! `POST /api/rooms/{id}/exports {"files": [...]}` (those files' texts, as JSON) or
//! `{"workspace": true}` (the whole workspace as a `.tar.gz`, see [`crate::sandbox::download`])
//! from a holder of `export` is stored as a request with its exact parameters (202,
//! `pending_approval`). Another holder of `approve`
//! decides it (`POST /api/rooms/{id}/approvals/{approval_id}/decision`); a requester never
//! decides its own. The requester then repeats the export with `"approval_id"`: it runs only
//! with exactly the approved parameters, before the request expires, once.

use crate::http::extract::Ids;
use crate::http::guard::authorize;
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::{IssuedId, RoomId};
use crate::ops::approvals::Allowed;
use crate::ops::record::{Entry, Verdict};
use crate::ops::Outcome;
use crate::store::{Change, StoreError};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use axum::Router;
use coderoom_authz::{Action, Capability};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use yrs::{GetString, Map, Transact};

/// Most files one export names.
const MAX_EXPORT_FILES: usize = 100;
/// Longest path in a file list.
const MAX_PATH: usize = 1024;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/exports", post(export))
        .route("/api/rooms/{id}/approvals", get(list))
        .route(
            "/api/rooms/{id}/approvals/{approval_id}/decision",
            post(decide_request),
        )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportBody {
    files: Option<Vec<String>>,
    #[serde(default)]
    workspace: bool,
    approval_id: Option<String>,
}

/// The canonical parameters: `{"workspace": true}`, or the set of files, sorted.
fn export_params(body: &ExportBody) -> Result<String, ApiError> {
    let files =
        match (&body.files, body.workspace) {
            (None, true) => return Ok(json!({ "workspace": true }).to_string()),
            (Some(files), false) => files,
            _ => return Err(ApiError::BadRequest(
                "name the files, or ask for the workspace (\"workspace\": true): one of the two",
            )),
        };
    if files.is_empty() || files.len() > MAX_EXPORT_FILES {
        return Err(ApiError::BadRequest("files must list 1 to 100 paths"));
    }
    if files
        .iter()
        .any(|f| f.is_empty() || f.len() > MAX_PATH || f.contains('\0'))
    {
        return Err(ApiError::BadRequest("invalid path in files"));
    }
    let mut files = files.to_vec();
    files.sort();
    files.dedup();
    Ok(json!({ "files": files }).to_string())
}

pub(crate) async fn export(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<ExportBody>,
) -> Result<Response, ApiError> {
    // Membership and `export` first (a denial is audited there).
    authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Export),
        json!({}),
    )
    .await?;
    let params = export_params(&body)?;
    let approval = presented(&app, &room_id, body.approval_id.as_deref()).await?;
    let action = Action::Export {
        params: params.clone(),
        approval,
    };
    let details: Value = serde_json::from_str(&params).unwrap_or(Value::Null);
    let (proof, approval_id) = match gate(&app, &room_id, &user, action, details.clone()).await? {
        Gate::Allowed { proof, approval } => (proof, approval),
        Gate::Pending(response) => return Ok(response),
    };
    let Some(names) = &body.files else {
        return workspace_download(&app, &room_id, &proof, details, &approval_id).await;
    };
    let details = json!({ "approval_id": approval_id, "params": details });
    record_allowed(&app, &room_id, &proof, details, &approval_id).await?;
    let files = read_files(&app, &room_id, names).await?;
    Ok(Json(Export { files }).into_response())
}

/// Removes the files named when dropped (a download's scratch files, however it ends).
struct Scratch(Vec<std::path::PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The approved workspace export: the archive is written (the running sandbox's workspace, else
/// its latest snapshot) with the document laid over it, then the export is recorded with what
/// it holds (spending the approval), then sent. Scratch space is `DATA_DIR/exports/<server>/`,
/// emptied at every start of that server too.
async fn workspace_download(
    app: &AppState,
    room_id: &RoomId,
    proof: &coderoom_authz::Authorized,
    params: Value,
    approval_id: &str,
) -> Result<Response, ApiError> {
    let dir = exports_dir(&app.ops.data_dir, &app.ops.server.id);
    tokio::fs::create_dir_all(&dir).await.map_err(store_io)?;
    let id = IssuedId::fresh();
    let raw = dir.join(format!("{id}.tar"));
    let out = dir.join(format!("{id}.tar.gz"));
    let _scratch = Scratch(vec![raw.clone(), out.clone()]);
    let (_, meta) = app.ops.sandboxes.archive(room_id, raw.clone()).await?;
    let texts = doc_texts(app, room_id).await?;
    let mtime = u64::try_from(app.ops.clock.now_ms() / 1000).unwrap_or(0);
    let target = out.clone();
    let bundled = tokio::task::spawn_blocking(move || {
        crate::sandbox::download::bundle(&raw, &meta.agreed, &texts, mtime, &target)
    })
    .await
    .map_err(|_| ApiError::Internal)?
    .map_err(|e| {
        tracing::warn!(room = %room_id, error = %e, "cannot write the workspace download");
        if e.kind() == std::io::ErrorKind::InvalidData {
            // The archive came from inside the sandbox: what was wrong with it is logged only.
            ApiError::Sandbox(crate::sandbox::SandboxError::Call(
                coderoom_sandbox::CallError::Protocol,
            ))
        } else {
            store_io(e)
        }
    })?;
    let details = json!({
        "approval_id": approval_id,
        "params": params,
        "bytes": bundled.bytes,
        "files": bundled.files,
        "from_document": bundled.from_document,
        "skipped": bundled.skipped,
    });
    record_allowed(app, room_id, proof, details, approval_id).await?;
    // Open, then let the scratch guard unlink it: the open file is read to its end.
    let file = tokio::fs::File::open(&out).await.map_err(store_io)?;
    let room = app.ops.store.room(room_id).await?;
    let name = download_name(room.as_ref().map_or("", |r| r.name.as_str()));
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/gzip".to_owned(),
            ),
            (
                axum::http::header::CONTENT_LENGTH,
                bundled.bytes.to_string(),
            ),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}.tar.gz\""),
            ),
        ],
        axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(file)),
    )
        .into_response())
}

/// Where this server writes downloads before they are sent: a directory of its own, since
/// servers sharing a database may share the data directory too.
pub(crate) fn exports_dir(data_dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    data_dir.join("exports").join(server)
}

/// A file name from a room's name: letters, digits, `.`, `_` and `-` kept, anything else a `-`
/// (nothing that could end the header's quoted string), never empty.
fn download_name(room: &str) -> String {
    let name: String = room
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches(|c| c == '-' || c == '.');
    if name.is_empty() {
        "workspace".to_owned()
    } else {
        name.to_owned()
    }
}

fn store_io(e: std::io::Error) -> ApiError {
    ApiError::Store(StoreError::Io(e))
}

/// What [`gate`] decided.
pub(crate) enum Gate {
    /// Go ahead; `approval` is the id of the approval presented (empty: none), which the
    /// action's record spends.
    Allowed {
        proof: coderoom_authz::Authorized,
        approval: String,
    },
    /// An approval was asked for: the answer to give (202, `pending_approval`).
    Pending(Response),
}

/// `crate::ops::Ops::ask` for the caller, a pending outcome answered 202.
pub(crate) async fn gate(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    action: Action,
    details: Value,
) -> Result<Gate, ApiError> {
    Ok(match ask(app, room_id, user, action, details).await? {
        Outcome::Done(Allowed { proof, approval }) => Gate::Allowed { proof, approval },
        Outcome::Pending(id) => {
            Gate::Pending(crate::http::sandbox::render::<()>(Outcome::Pending(id)))
        }
    })
}

/// `crate::ops::Ops::ask` for the caller.
pub(crate) async fn ask(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    action: Action,
    details: Value,
) -> Result<Outcome<Allowed>, ApiError> {
    let actor = user.actor(app).await?;
    Ok(app.ops.ask(room_id, &actor, action, details).await?)
}

/// Records an action [`gate`] allowed, under the name of the action decided, spending in the
/// same transaction the approval it rested on (`approval`; empty: none).
pub(crate) async fn record_allowed(
    app: &AppState,
    room_id: &RoomId,
    proof: &coderoom_authz::Authorized,
    details: Value,
    approval: &str,
) -> Result<coderoom_authz::audit::Record, ApiError> {
    let entry = Entry::of(proof.action(), Verdict::Allow, details);
    Ok(app
        .ops
        .record_allowed(room_id, proof, entry, Change::None, approval)
        .await?)
}

/// The approval named `id` in the room (404 for an id of the wrong form or not there).
pub(crate) async fn presented(
    app: &AppState,
    room_id: &RoomId,
    id: Option<&str>,
) -> Result<Option<coderoom_authz::Approval>, ApiError> {
    Ok(app.ops.presented(room_id, id).await?)
}

/// The named files' text as stored (what every peer has been sent).
async fn read_files(
    app: &AppState,
    room_id: &str,
    names: &[String],
) -> Result<BTreeMap<String, Option<String>>, ApiError> {
    let all = doc_texts(app, room_id).await?;
    Ok(names
        .iter()
        .map(|name| (name.clone(), all.get(name).cloned()))
        .collect())
}

/// Every file the room's document holds (path -> text), as stored: what every peer was sent.
async fn doc_texts(app: &AppState, room_id: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let stored = app.ops.store.load_doc(room_id).await?;
    let (doc, _) = crate::room::task::doc_from_stored(&stored)
        .map_err(|_| ApiError::Store(StoreError::Corrupt))?;
    let files = doc.get_or_insert_map("files");
    let txn = doc.transact();
    Ok(files
        .iter(&txn)
        .filter_map(|(name, value)| match value {
            yrs::Out::YText(t) => Some((name.to_owned(), t.get_string(&txn))),
            _ => None,
        })
        .collect())
}

pub(crate) async fn list(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Vec<ApprovalItem>>, ApiError> {
    crate::http::guard::room_capabilities(&app, &room_id, &user).await?;
    let now = app.ops.clock.now_ms();
    let items = app
        .ops
        .store
        .approvals(&room_id)
        .await?
        .into_iter()
        .map(|(a, created_at)| {
            let state = match (&a.decided, a.used) {
                (_, true) => "used",
                (Some((_, true)), _) if a.expires_at <= now => "expired",
                (Some((_, true)), _) => "approved",
                (Some((_, false)), _) => "denied",
                (None, _) if a.expires_at <= now => "expired",
                (None, _) => "pending",
            };
            ApprovalItem {
                params: serde_json::from_str::<Value>(&a.params).unwrap_or(Value::Null),
                id: a.id,
                action: a.action,
                requester: a.requester,
                state,
                decided_by: a.decided.map(|(by, _)| by),
                created_at,
                expires_at: a.expires_at,
            }
        })
        .collect();
    Ok(Json(items))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionBody {
    approve: bool,
}

pub(crate) async fn decide_request(
    State(app): State<AppState>,
    user: AuthUser,
    Ids((room_id, id)): Ids<(RoomId, IssuedId)>,
    Json(body): Json<DecisionBody>,
) -> Result<Json<Decided>, ApiError> {
    let actor = user.actor(&app).await?;
    app.ops
        .decide_approval(&room_id, &actor, &id, body.approve)
        .await?;
    Ok(Json(Decided {
        id: id.to_string(),
        state: if body.approve { "approved" } else { "denied" },
    }))
}

/// `200` from `POST /api/rooms/{id}/exports`: each named file's text (`null`: not in the room).
#[derive(Serialize)]
pub(crate) struct Export {
    files: BTreeMap<String, Option<String>>,
}

/// One entry of `GET /api/rooms/{id}/approvals`.
#[derive(Serialize)]
pub(crate) struct ApprovalItem {
    id: String,
    action: String,
    params: Value,
    requester: String,
    /// `pending`, `approved`, `denied`, `expired` or `used`.
    state: &'static str,
    decided_by: Option<String>,
    created_at: i64,
    expires_at: i64,
}

/// `POST /api/rooms/{id}/approvals/{approval_id}/decision`.
#[derive(Serialize)]
pub(crate) struct Decided {
    id: String,
    /// `approved` or `denied`.
    state: &'static str,
}

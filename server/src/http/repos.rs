//! Repositories: `POST /api/rooms/{id}/repos` (connect: needs `connect_repo`), `GET` (list),
//! `POST .../repos/{rid}/pull` and `.../push` (need `edit`; a push needs the repository
//! connected with `push` access), `DELETE .../repos/{rid}` (disconnect: `connect_repo`). The git
//! work is `crate::repos`; here are the rights, the room's files and the audit.

use crate::http::extract::Ids;
use crate::http::guard::{authorize, room_capabilities};
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::{IssuedId, RoomId};
use crate::repos::{
    parse_url, valid_branch, Bare, Person, Remote, RepoError, MAX_FILES, MAX_FILE_BYTES,
};
use crate::store::{Change, RepoRow};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use coderoom_authz::{Action, Capability};
use coderoom_sandbox::path::WorkspacePath;
use coderoom_sandbox::proto::{Op, Reply};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;

/// Repositories one room may connect.
const MAX_REPOS: usize = 20;
/// Time one workspace operation may take.
const OP_WITHIN: Duration = Duration::from_secs(30);
/// Longest commit message.
const MAX_MESSAGE: usize = 10_000;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/repos", get(list).post(connect))
        .route(
            "/api/rooms/{id}/repos/{rid}",
            axum::routing::delete(disconnect),
        )
        .route("/api/rooms/{id}/repos/{rid}/pull", post(pull))
        .route("/api/rooms/{id}/repos/{rid}/push", post(push))
        .route("/api/rooms/{id}/repos/{rid}/export", post(export))
}

fn bare(app: &AppState, room_id: &str, id: &str) -> Bare {
    Bare::at(
        app.ops
            .data_dir
            .join("rooms")
            .join(room_id)
            .join("repos")
            .join(format!("{id}.git")),
    )
}

/// The room as committer: pushes carry the person as author and the room as committer.
fn committer(room_id: &str) -> Person {
    Person {
        name: "Coderoom room".into(),
        email: format!("room-{room_id}@coderoom.invalid"),
    }
}

fn author(user: &AuthUser) -> Person {
    Person {
        name: user.email.split('@').next().unwrap_or("someone").to_owned(),
        email: user.email.clone(),
    }
}

/// The remote of a stored repository, with its credential.
async fn remote_of(app: &AppState, room_id: &str, repo: &RepoRow) -> Result<Remote, ApiError> {
    let header = match &repo.secret {
        Some(name) => Some(
            app.ops
                .egress
                .secret_header(room_id, name)
                .await
                .map_err(|e| ApiError::Invalid(e.0))?
                .ok_or_else(|| {
                    ApiError::Invalid(format!(
                        "the secret {name} is gone: add it again, or reconnect"
                    ))
                })?,
        ),
        None => None,
    };
    Ok(Remote::checked(&app.ops.egress, &repo.url, header).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Connect {
    url: String,
    branch: String,
    secret: Option<String>,
    access: String,
    /// Where the files go in the workspace (default: the repository's name).
    path: Option<String>,
}

async fn connect(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<Connect>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let (_, _, name) = parse_url(&body.url)?;
    if !valid_branch(&body.branch) {
        return Err(ApiError::BadRequest("branch must be a plain branch name"));
    }
    if body.access != "read" && body.access != "push" {
        return Err(ApiError::BadRequest("access is \"read\" or \"push\""));
    }
    let path = body.path.clone().unwrap_or(name);
    let path = WorkspacePath::parse(&path)
        .map_err(|_| ApiError::BadRequest("path must be a relative path in the workspace"))?
        .as_str()
        .to_owned();
    let details = json!({
        "url": body.url, "branch": body.branch, "secret": body.secret, "access": body.access,
        "path": path,
    });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::ConnectRepo),
        details.clone(),
    )
    .await?;
    let existing = app.ops.store.repos(&room_id).await?;
    if existing.len() >= MAX_REPOS {
        return Err(ApiError::Invalid(format!(
            "a room connects at most {MAX_REPOS} repositories"
        )));
    }
    if existing.iter().any(|r| {
        r.path == path
            || path.starts_with(&format!("{}/", r.path))
            || r.path.starts_with(&format!("{path}/"))
    }) {
        return Err(ApiError::Conflict(format!(
            "another repository already has {path}"
        )));
    }
    let id = IssuedId::fresh().to_string();
    let mut repo = RepoRow {
        id: id.clone(),
        url: body.url,
        branch: body.branch,
        secret: body.secret,
        access: body.access,
        path,
        base: String::new(),
        created_by: proof.actor().to_owned(),
        created_at: app.ops.clock.now_ms(),
    };
    let remote = remote_of(&app, &room_id, &repo).await?;
    let lock = app.ops.room_lock(&room_id);
    let _held = lock.lock().await;
    let git = bare(&app, &room_id, &id);
    let placed = async {
        let head = git.clone_from(&remote, &repo.branch).await?;
        let empty = git.empty_tree().await?;
        let tree = git.tree_of(&head).await?;
        let skipped = write_changes(&app, &room_id, &git, &repo.path, &empty, &tree).await?;
        Ok::<_, ApiError>((head, skipped))
    }
    .await;
    let (head, skipped) = match placed {
        Ok(p) => p,
        Err(e) => {
            git.remove().await;
            return Err(e);
        }
    };
    repo.base = head;
    let mut details = details;
    details["id"] = json!(id);
    details["head"] = json!(repo.base);
    app.ops
        .audit
        .record(
            &room_id,
            proof.actor(),
            "connect_repo",
            "allow",
            "",
            details,
            Change::PutRepo {
                room_id: room_id.to_string(),
                repo: repo.clone(),
            },
        )
        .await?;
    let mut out = json!(repo);
    out["skipped"] = json!(skipped);
    Ok((StatusCode::CREATED, Json(out)))
}

async fn list(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Vec<RepoRow>>, ApiError> {
    room_capabilities(&app, &room_id, &user).await?;
    Ok(Json(app.ops.store.repos(&room_id).await?))
}

/// The repository `rid` of the room, or 404.
async fn repo_of(app: &AppState, room_id: &RoomId, rid: &str) -> Result<RepoRow, ApiError> {
    if rid.len() > 64 {
        return Err(ApiError::NotFound);
    }
    app.ops
        .store
        .repo(room_id, rid)
        .await?
        .ok_or(ApiError::NotFound)
}

/// Writes the changes from tree `from` to tree `to` into the workspace under `dir`. Files too
/// big to place are left out and named.
async fn write_changes(
    app: &AppState,
    room_id: &str,
    git: &Bare,
    dir: &str,
    from: &str,
    to: &str,
) -> Result<Vec<String>, ApiError> {
    let changes = git.changes(from, to).await?;
    if changes.len() > MAX_FILES {
        return Err(RepoError::TooLarge(format!(
            "{} files change; the room takes at most {MAX_FILES} at once",
            changes.len()
        ))
        .into());
    }
    let mut skipped = Vec::new();
    for (path, blob) in changes {
        let full = format!("{dir}/{path}");
        if WorkspacePath::parse(&full).is_err() {
            skipped.push(path);
            continue;
        }
        let op = match blob {
            Some(sha) => {
                let data = git.blob(&sha).await?;
                if data.len() as u64 > MAX_FILE_BYTES {
                    skipped.push(path);
                    continue;
                }
                Op::WriteFile {
                    path: full,
                    data: data.into(),
                }
            }
            None => Op::RemoveFile { path: full },
        };
        match app.ops.sandboxes.op(room_id, op, OP_WITHIN).await {
            Ok(_) => {}
            // Already gone from the workspace: nothing to remove.
            Err(crate::sandbox::SandboxError::Call(coderoom_sandbox::CallError::Agent(
                coderoom_sandbox::proto::AgentError::NotFound,
            ))) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(skipped)
}

/// The room's files of the repository (under its directory), as they are now.
async fn workspace_files(
    app: &AppState,
    room_id: &str,
    dir: &str,
) -> Result<Vec<(String, Vec<u8>)>, ApiError> {
    let listed = app
        .ops
        .sandboxes
        .op(
            room_id,
            Op::ListFiles {
                max_entries: 50_000,
            },
            OP_WITHIN,
        )
        .await?;
    let Reply::Files { entries, truncated } = listed else {
        return Err(ApiError::Internal);
    };
    if truncated {
        return Err(
            RepoError::TooLarge("the workspace holds too many files to read".into()).into(),
        );
    }
    let prefix = format!("{dir}/");
    let mine: Vec<_> = entries
        .into_iter()
        .filter(|e| e.path.starts_with(&prefix))
        .collect();
    if mine.len() > MAX_FILES {
        return Err(RepoError::TooLarge(format!("{dir} holds more than {MAX_FILES} files")).into());
    }
    let mut files = Vec::with_capacity(mine.len());
    for e in mine {
        if e.size > MAX_FILE_BYTES {
            return Err(RepoError::TooLarge(format!(
                "{} is bigger than {} MiB",
                e.path,
                MAX_FILE_BYTES >> 20
            ))
            .into());
        }
        let op = Op::ReadFile {
            path: e.path.clone(),
            max_bytes: MAX_FILE_BYTES,
        };
        match app.ops.sandboxes.op(room_id, op, OP_WITHIN).await? {
            Reply::File(data) => files.push((e.path[prefix.len()..].to_owned(), data.into_vec())),
            _ => return Err(ApiError::Internal),
        }
    }
    Ok(files)
}

async fn pull(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room, rid)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    let repo = repo_of(&app, &room_id, &rid).await?;
    let details = json!({ "id": repo.id, "url": repo.url, "branch": repo.branch });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::Edit),
        details.clone(),
    )
    .await?;
    let remote = remote_of(&app, &room_id, &repo).await?;
    let lock = app.ops.room_lock(&room_id);
    let _held = lock.lock().await;
    let git = bare(&app, &room_id, &repo.id);
    let theirs = git.fetch(&remote, &repo.branch).await?;
    if theirs == repo.base {
        return Ok(Json(json!({ "state": "up_to_date", "base": repo.base })));
    }
    let files = workspace_files(&app, &room_id, &repo.path).await?;
    let base_tree = git.tree_of(&repo.base).await?;
    let ours_tree = git.tree_from(&repo.base, &files).await?;
    // Local changes are kept: merged with what arrived, or the pull is refused with the paths
    // that conflict (nothing is changed then).
    let target = if ours_tree == base_tree {
        git.tree_of(&theirs).await?
    } else {
        let ours = git
            .commit(
                &ours_tree,
                &[&repo.base],
                "changes in the room",
                &author(&user),
                &committer(&room_id),
            )
            .await?;
        match git.merge(&ours, &theirs).await? {
            Ok(tree) => tree,
            Err(conflicts) => {
                return Err(ApiError::Conflict(format!(
                    "the pull conflicts with changes in the room in: {}",
                    conflicts.join(", ")
                )))
            }
        }
    };
    let skipped = write_changes(&app, &room_id, &git, &repo.path, &ours_tree, &target).await?;
    git.set_branch(&repo.branch, &theirs).await?;
    let mut details = details;
    details["from"] = json!(repo.base);
    details["to"] = json!(theirs);
    app.ops
        .audit
        .record(
            &room_id,
            proof.actor(),
            "pull_repo",
            "allow",
            "",
            details,
            Change::SetRepoBase {
                room_id: room_id.to_string(),
                id: repo.id.clone(),
                base: theirs.clone(),
            },
        )
        .await?;
    Ok(Json(
        json!({ "state": "pulled", "base": theirs, "merged": ours_tree != base_tree, "skipped": skipped }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Push {
    message: String,
    /// Replace the branch with the room's version even when it moved (needs an approval).
    #[serde(default)]
    force: bool,
    /// The approval of exactly this forced push.
    #[serde(default)]
    approval_id: Option<String>,
}

async fn push(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room, rid)): Path<(String, String)>,
    Json(body): Json<Push>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    let repo = repo_of(&app, &room_id, &rid).await?;
    let message = body.message.trim().to_owned();
    if message.is_empty() || message.len() > MAX_MESSAGE {
        return Err(ApiError::BadRequest(
            "a push needs a commit message (at most 10,000 bytes)",
        ));
    }
    let details = json!({
        "id": repo.id, "url": repo.url, "branch": repo.branch, "force": body.force,
    });
    // A forced push replaces what others pushed: someone else who holds `approve` agrees to
    // exactly this one first.
    let (proof, approval) = if body.force {
        let params =
            json!({ "repo": repo.id, "branch": repo.branch, "message": message }).to_string();
        let approval =
            crate::http::approvals::presented(&app, &room_id, body.approval_id.as_deref()).await?;
        let action = Action::ForcePush { params, approval };
        match crate::http::approvals::gate(&app, &room_id, &user, action, details.clone()).await? {
            crate::http::approvals::Gate::Allowed { proof, approval } => (proof, approval),
            crate::http::approvals::Gate::Pending(response) => return Ok(response),
        }
    } else {
        let proof = authorize(
            &app,
            &room_id,
            &user,
            Action::Use(Capability::Edit),
            details.clone(),
        )
        .await?;
        (proof, String::new())
    };
    if repo.access != "push" {
        app.ops
            .audit
            .record(
                &room_id,
                proof.actor(),
                "push_repo",
                "deny",
                "the repository is connected read-only",
                details,
                Change::None,
            )
            .await?;
        return Err(ApiError::Denied(
            "the repository is connected read-only".into(),
        ));
    }
    let remote = remote_of(&app, &room_id, &repo).await?;
    let lock = app.ops.room_lock(&room_id);
    let _held = lock.lock().await;
    // The approval is spent before the push, once: a second push cannot ride on it.
    if !approval.is_empty() {
        crate::http::approvals::record_allowed(&app, &room_id, &proof, details.clone(), &approval)
            .await?;
    }
    let git = bare(&app, &room_id, &repo.id);
    let files = workspace_files(&app, &room_id, &repo.path).await?;
    let tree = git.tree_from(&repo.base, &files).await?;
    if tree == git.tree_of(&repo.base).await? && !body.force {
        return Ok(Json(json!({ "state": "nothing_to_push", "base": repo.base })).into_response());
    }
    let commit = git
        .commit(
            &tree,
            &[&repo.base],
            &message,
            &author(&user),
            &committer(&room_id),
        )
        .await?;
    git.push(&remote, &commit, &repo.branch, body.force).await?;
    git.set_branch(&repo.branch, &commit).await?;
    let mut details = details;
    details["commit"] = json!(commit);
    details["author"] = json!(user.email);
    details["approval_id"] = json!(approval);
    let change = Change::SetRepoBase {
        room_id: room_id.to_string(),
        id: repo.id.clone(),
        base: commit.clone(),
    };
    app.ops
        .audit
        .record(
            &room_id,
            proof.actor(),
            "push_repo",
            "allow",
            "",
            details,
            change,
        )
        .await?;
    Ok(Json(json!({ "state": "pushed", "commit": commit, "forced": body.force })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Export {
    /// `bundle` (a git bundle) or `patch` (a patch series).
    format: String,
    /// The approval of exactly this export.
    #[serde(default)]
    approval_id: Option<String>,
}

/// `POST .../repos/{rid}/export` `{"format": "bundle" | "patch"}`: the room's changes since
/// the last pull or push, as one commit authored by the caller, in a git bundle or a patch.
/// Needs `export` and someone else's approval of exactly this export (202 until then), like
/// every export.
async fn export(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room, rid)): Path<(String, String)>,
    Json(body): Json<Export>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    let repo = repo_of(&app, &room_id, &rid).await?;
    if body.format != "bundle" && body.format != "patch" {
        return Err(ApiError::BadRequest("format is \"bundle\" or \"patch\""));
    }
    let params = json!({ "repo": repo.id, "format": body.format }).to_string();
    let approval =
        crate::http::approvals::presented(&app, &room_id, body.approval_id.as_deref()).await?;
    let action = Action::Export { params, approval };
    let details = json!({ "repo": repo.id, "format": body.format });
    let (proof, approval) =
        match crate::http::approvals::gate(&app, &room_id, &user, action, details.clone()).await? {
            crate::http::approvals::Gate::Allowed { proof, approval } => (proof, approval),
            crate::http::approvals::Gate::Pending(response) => return Ok(response),
        };
    let lock = app.ops.room_lock(&room_id);
    let _held = lock.lock().await;
    let git = bare(&app, &room_id, &repo.id);
    let files = workspace_files(&app, &room_id, &repo.path).await?;
    let tree = git.tree_from(&repo.base, &files).await?;
    if tree == git.tree_of(&repo.base).await? {
        return Err(ApiError::Conflict(
            "nothing to export: the files match the last commit pulled or pushed".into(),
        ));
    }
    let commit = git
        .commit(
            &tree,
            &[&repo.base],
            "Changes from the room",
            &author(&user),
            &committer(&room_id),
        )
        .await?;
    let (data, kind, extension) = if body.format == "bundle" {
        (
            git.bundle(&repo.base, &commit).await?,
            "application/octet-stream",
            "bundle",
        )
    } else {
        (
            git.patch(&repo.base, &commit).await?,
            "text/x-patch; charset=utf-8",
            "patch",
        )
    };
    // Spent once the export exists, with what it holds.
    let mut details = details;
    details["commit"] = json!(commit);
    details["bytes"] = json!(data.len());
    crate::http::approvals::record_allowed(&app, &room_id, &proof, details, &approval).await?;
    let name = repo.path.replace('/', "-");
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, kind.to_owned()),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}.{extension}\""),
            ),
        ],
        data,
    )
        .into_response())
}

async fn disconnect(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room, rid)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    let repo = repo_of(&app, &room_id, &rid).await?;
    let details = json!({ "id": repo.id, "url": repo.url });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::ConnectRepo),
        details.clone(),
    )
    .await?;
    let lock = app.ops.room_lock(&room_id);
    let _held = lock.lock().await;
    app.ops
        .audit
        .record(
            &room_id,
            proof.actor(),
            "disconnect_repo",
            "allow",
            "",
            details,
            Change::RemoveRepo {
                room_id: room_id.to_string(),
                id: repo.id.clone(),
            },
        )
        .await?;
    // The room's files stay; the server's clone goes.
    bare(&app, &room_id, &repo.id).remove().await;
    Ok(StatusCode::NO_CONTENT)
}

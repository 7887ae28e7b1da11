//! Repositories (their routes are `http::repos`): connected and disconnected by a holder of
//! `connect_repo`; pulled and pushed by a holder of `edit` (a push needs the repository
//! connected with `push` access; a forced one someone else's approval); the room's changes
//! exported with `export` and someone else's approval. The git work is `crate::repos`; here
//! are the rights, the room's files and the audit.

use crate::ids::{IssuedId, RoomId};
use crate::ops::approvals::Allowed;
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::repos::{
    parse_url, valid_branch, Bare, Person, Remote, RepoError, MAX_FILES, MAX_FILE_BYTES,
};
use crate::store::{Change, RepoRow};
use coderoom_authz::{Action, Capability};
use coderoom_sandbox::path::WorkspacePath;
use coderoom_sandbox::proto::{Op, Reply};
use serde_json::{json, Value};
use std::time::Duration;

/// Repositories one room may connect.
const MAX_REPOS: usize = 20;
/// Time one workspace operation may take.
const OP_WITHIN: Duration = Duration::from_secs(30);
/// Longest commit message.
const MAX_MESSAGE: usize = 10_000;

fn bare(app: &Ops, room_id: &RoomId, id: &str) -> Bare {
    Bare::at(
        app.data_dir
            .join("rooms")
            .join(room_id)
            .join("repos")
            .join(format!("{id}.git")),
    )
}

/// The room as committer: pushes carry the person as author and the room as committer.
fn committer(room_id: &RoomId) -> Person {
    Person {
        name: "Coderoom room".into(),
        email: format!("room-{room_id}@coderoom.invalid"),
    }
}

fn author(actor: &Actor) -> Person {
    Person {
        name: actor
            .email
            .split('@')
            .next()
            .unwrap_or("someone")
            .to_owned(),
        email: actor.email.clone(),
    }
}

/// The remote of a stored repository, with its credential.
async fn remote_of(app: &Ops, room_id: &RoomId, repo: &RepoRow) -> Result<Remote, OpError> {
    let header = match &repo.secret {
        Some(name) => Some(
            app.egress
                .secret_header(room_id, name)
                .await
                .map_err(|e| OpError::Invalid(e.0))?
                .ok_or_else(|| {
                    OpError::Invalid(format!(
                        "the secret {name} is gone: add it again, or reconnect"
                    ))
                })?,
        ),
        None => None,
    };
    Ok(Remote::checked(&app.egress, &repo.url, header).await?)
}

/// A repository to connect (the body of `POST .../repos`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Connect {
    pub(crate) url: String,
    pub(crate) branch: String,
    pub(crate) secret: Option<String>,
    pub(crate) access: String,
    /// Where the files go in the workspace (default: the repository's name).
    pub(crate) path: Option<String>,
}

impl Ops {
    /// Connects a repository to the room as `actor` (`connect_repo`): cloned, its files placed in
    /// the workspace. The repository, and the files left out.
    pub(crate) async fn connect_repo(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        body: Connect,
    ) -> Result<Value, OpError> {
        let app = self;
        let (_, _, name) = parse_url(&body.url)?;
        if !valid_branch(&body.branch) {
            return Err(OpError::Bad("branch must be a plain branch name"));
        }
        if body.access != "read" && body.access != "push" {
            return Err(OpError::Bad("access is \"read\" or \"push\""));
        }
        let path = body.path.clone().unwrap_or(name);
        let path = WorkspacePath::parse(&path)
            .map_err(|_| OpError::Bad("path must be a relative path in the workspace"))?
            .as_str()
            .to_owned();
        let details = json!({
            "url": body.url, "branch": body.branch, "secret": body.secret, "access": body.access,
            "path": path,
        });
        let proof = app
            .authorize(
                room_id,
                actor,
                Action::Use(Capability::ConnectRepo),
                details.clone(),
            )
            .await?;
        let existing = app.store.repos(room_id).await?;
        if existing.len() >= MAX_REPOS {
            return Err(OpError::Invalid(format!(
                "a room connects at most {MAX_REPOS} repositories"
            )));
        }
        if existing.iter().any(|r| {
            r.path == path
                || path.starts_with(&format!("{}/", r.path))
                || r.path.starts_with(&format!("{path}/"))
        }) {
            return Err(OpError::Conflict(format!(
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
            created_at: app.clock.now_ms(),
        };
        let remote = remote_of(app, room_id, &repo).await?;
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        let git = bare(app, room_id, &id);
        let placed = async {
            let head = git.clone_from(&remote, &repo.branch).await?;
            let empty = git.empty_tree().await?;
            let tree = git.tree_of(&head).await?;
            let skipped = write_changes(app, room_id, &git, &repo.path, &empty, &tree).await?;
            Ok::<_, OpError>((head, skipped))
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
        let change = Change::PutRepo {
            room_id: room_id.clone(),
            repo: repo.clone(),
        };
        let entry = Entry::act(Act::ConnectRepo, Verdict::Allow, details);
        app.record(room_id, proof.actor(), entry, change).await?;
        let mut out = json!(repo);
        out["skipped"] = json!(skipped);
        Ok(out)
    }
}

/// The repository `rid` of the room, or not found.
async fn repo_of(app: &Ops, room_id: &RoomId, rid: &str) -> Result<RepoRow, OpError> {
    if rid.len() > 64 {
        return Err(OpError::NotFound);
    }
    app.store.repo(room_id, rid).await?.ok_or(OpError::NotFound)
}

/// Writes the changes from tree `from` to tree `to` into the workspace under `dir`. Files too
/// big to place are left out and named.
async fn write_changes(
    app: &Ops,
    room_id: &RoomId,
    git: &Bare,
    dir: &str,
    from: &str,
    to: &str,
) -> Result<Vec<String>, OpError> {
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
        match app.sandboxes.op(room_id, op, OP_WITHIN).await {
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
    app: &Ops,
    room_id: &RoomId,
    dir: &str,
) -> Result<Vec<(String, Vec<u8>)>, OpError> {
    let listed = app
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
        return Err(OpError::Internal);
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
        match app.sandboxes.op(room_id, op, OP_WITHIN).await? {
            Reply::File(data) => files.push((e.path[prefix.len()..].to_owned(), data.into_vec())),
            _ => return Err(OpError::Internal),
        }
    }
    Ok(files)
}

impl Ops {
    /// Pulls repository `rid` as `actor` (`edit`): the room's changes are kept, merged with what
    /// arrived, or the pull is refused naming the paths that conflict.
    pub(crate) async fn pull_repo(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        rid: &str,
    ) -> Result<Value, OpError> {
        let app = self;
        let repo = repo_of(app, room_id, rid).await?;
        let details = json!({ "id": repo.id, "url": repo.url, "branch": repo.branch });
        let proof = app
            .authorize(
                room_id,
                actor,
                Action::Use(Capability::Edit),
                details.clone(),
            )
            .await?;
        let remote = remote_of(app, room_id, &repo).await?;
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        let git = bare(app, room_id, &repo.id);
        let theirs = git.fetch(&remote, &repo.branch).await?;
        if theirs == repo.base {
            return Ok(json!({ "state": "up_to_date", "base": repo.base }));
        }
        let files = workspace_files(app, room_id, &repo.path).await?;
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
                    &author(actor),
                    &committer(room_id),
                )
                .await?;
            match git.merge(&ours, &theirs).await? {
                Ok(tree) => tree,
                Err(conflicts) => {
                    return Err(OpError::Conflict(format!(
                        "the pull conflicts with changes in the room in: {}",
                        conflicts.join(", ")
                    )))
                }
            }
        };
        let skipped = write_changes(app, room_id, &git, &repo.path, &ours_tree, &target).await?;
        git.set_branch(&repo.branch, &theirs).await?;
        let mut details = details;
        details["from"] = json!(repo.base);
        details["to"] = json!(theirs);
        let change = Change::SetRepoBase {
            room_id: room_id.clone(),
            id: repo.id.clone(),
            base: theirs.clone(),
        };
        let entry = Entry::act(Act::PullRepo, Verdict::Allow, details);
        app.record(room_id, proof.actor(), entry, change).await?;
        Ok(
            json!({ "state": "pulled", "base": theirs, "merged": ours_tree != base_tree, "skipped": skipped }),
        )
    }
}

/// A push as asked for (the body of `POST .../repos/ID/push`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Push {
    pub(crate) message: String,
    /// Replace the branch with the room's version even when it moved (needs an approval).
    #[serde(default)]
    pub(crate) force: bool,
    /// The approval of exactly this forced push.
    #[serde(default)]
    pub(crate) approval_id: Option<String>,
}

impl Ops {
    /// Pushes the room's version of repository `rid` as `actor` (see the module's text).
    pub(crate) async fn push_repo(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        rid: &str,
        body: Push,
    ) -> Result<Outcome<Value>, OpError> {
        let app = self;
        let repo = repo_of(app, room_id, rid).await?;
        let message = body.message.trim().to_owned();
        if message.is_empty() || message.len() > MAX_MESSAGE {
            return Err(OpError::Bad(
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
            let approval = app.presented(room_id, body.approval_id.as_deref()).await?;
            let action = Action::ForcePush { params, approval };
            match app.ask(room_id, actor, action, details.clone()).await? {
                Outcome::Done(Allowed { proof, approval }) => (proof, approval),
                Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
            }
        } else {
            let proof = app
                .authorize(
                    room_id,
                    actor,
                    Action::Use(Capability::Edit),
                    details.clone(),
                )
                .await?;
            (proof, String::new())
        };
        if repo.access != "push" {
            let why = "the repository is connected read-only";
            let entry = Entry::act(Act::PushRepo, Verdict::Deny, details).because(why.into());
            app.record(room_id, proof.actor(), entry, Change::None)
                .await?;
            return Err(OpError::Refused(why.into()));
        }
        let remote = remote_of(app, room_id, &repo).await?;
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        // The approval is spent before the push, once: a second push cannot ride on it.
        if !approval.is_empty() {
            let entry = Entry::of(proof.action(), Verdict::Allow, details.clone());
            app.record_allowed(room_id, &proof, entry, Change::None, &approval)
                .await?;
        }
        let git = bare(app, room_id, &repo.id);
        let files = workspace_files(app, room_id, &repo.path).await?;
        let tree = git.tree_from(&repo.base, &files).await?;
        if tree == git.tree_of(&repo.base).await? && !body.force {
            return Ok(Outcome::Done(
                json!({ "state": "nothing_to_push", "base": repo.base }),
            ));
        }
        let commit = git
            .commit(
                &tree,
                &[&repo.base],
                &message,
                &author(actor),
                &committer(room_id),
            )
            .await?;
        git.push(&remote, &commit, &repo.branch, body.force).await?;
        git.set_branch(&repo.branch, &commit).await?;
        let mut details = details;
        details["commit"] = json!(commit);
        details["author"] = json!(actor.email);
        details["approval_id"] = json!(approval);
        let change = Change::SetRepoBase {
            room_id: room_id.clone(),
            id: repo.id.clone(),
            base: commit.clone(),
        };
        let entry = Entry::act(Act::PushRepo, Verdict::Allow, details);
        app.record(room_id, proof.actor(), entry, change).await?;
        Ok(Outcome::Done(
            json!({ "state": "pushed", "commit": commit, "forced": body.force }),
        ))
    }
}

/// What an export of a repository's changes made: the data, its media type and the file name
/// it is offered under.
#[derive(Debug)]
pub(crate) struct RepoExport {
    pub(crate) data: Vec<u8>,
    pub(crate) kind: &'static str,
    pub(crate) file_name: String,
}

impl Ops {
    /// `POST .../repos/{rid}/export` `{"format": "bundle" | "patch"}`: the room's changes since
    /// the last pull or push, as one commit authored by the caller, in a git bundle or a patch.
    /// Needs `export` and someone else's approval of exactly this export (202 until then), like
    /// every export.
    pub(crate) async fn export_repo(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        rid: &str,
        (format, approval_id): (&str, Option<&str>),
    ) -> Result<Outcome<RepoExport>, OpError> {
        let app = self;
        let repo = repo_of(app, room_id, rid).await?;
        if format != "bundle" && format != "patch" {
            return Err(OpError::Bad("format is \"bundle\" or \"patch\""));
        }
        let params = json!({ "repo": repo.id, "format": format }).to_string();
        let approval = app.presented(room_id, approval_id).await?;
        let action = Action::Export { params, approval };
        let details = json!({ "repo": repo.id, "format": format });
        let Allowed { proof, approval } =
            match app.ask(room_id, actor, action, details.clone()).await? {
                Outcome::Done(allowed) => allowed,
                Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
            };
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        let git = bare(app, room_id, &repo.id);
        let files = workspace_files(app, room_id, &repo.path).await?;
        let tree = git.tree_from(&repo.base, &files).await?;
        if tree == git.tree_of(&repo.base).await? {
            return Err(OpError::Conflict(
                "nothing to export: the files match the last commit pulled or pushed".into(),
            ));
        }
        let commit = git
            .commit(
                &tree,
                &[&repo.base],
                "Changes from the room",
                &author(actor),
                &committer(room_id),
            )
            .await?;
        let (data, kind, extension) = if format == "bundle" {
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
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        app.record_allowed(room_id, &proof, entry, Change::None, &approval)
            .await?;
        let name = repo.path.replace('/', "-");
        Ok(Outcome::Done(RepoExport {
            data,
            kind,
            file_name: format!("{name}.{extension}"),
        }))
    }
}

impl Ops {
    /// Disconnects repository `rid` as `actor` (`connect_repo`): the room's files stay; the
    /// server's clone goes.
    pub(crate) async fn disconnect_repo(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        rid: &str,
    ) -> Result<(), OpError> {
        let app = self;
        let repo = repo_of(app, room_id, rid).await?;
        let details = json!({ "id": repo.id, "url": repo.url });
        let proof = app
            .authorize(
                room_id,
                actor,
                Action::Use(Capability::ConnectRepo),
                details.clone(),
            )
            .await?;
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        let change = Change::RemoveRepo {
            room_id: room_id.clone(),
            id: repo.id.clone(),
        };
        let entry = Entry::act(Act::DisconnectRepo, Verdict::Allow, details);
        app.record(room_id, proof.actor(), entry, change).await?;
        // The room's files stay; the server's clone goes.
        bare(app, room_id, &repo.id).remove().await;
        Ok(())
    }
}

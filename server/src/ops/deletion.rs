//! Room deletion: an owner asks (`DELETE /api/rooms/{id}`), a system admin confirms
//! (`POST /api/deletions/{id}/confirm`), and the server destroys every artifact of the room,
//! one step at a time. Each step and its result are recorded in one transaction, so a rerun
//! after a crash skips what is done, the receipt lists every artifact, and a deletion is never
//! reported done before its last step. Confirmed deletions left unfinished by a crash resume
//! when the server starts. The audit chain keeps a tombstone with the receipt's hash.

use crate::ids::{IssuedId, RoomId, UserId};
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops};
use crate::room::RoomCmd;
use crate::store::{Change, DeletionState, StoreError};
use coderoom_authz::{decide, Action, Decision, RoomState};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long the room task gets to close its connections and stop.
const STOP_ROOM_WAIT: Duration = Duration::from_secs(5);

/// The artifacts of a room, in the order they are destroyed, with the SQL that destroys each
/// (`None`: nothing of that kind is stored by this server version, so the receipt says `none`).
/// Participants go first, so nobody can join while the rest is destroyed; the room row goes
/// last, and its foreign keys sweep up anything written in between.
const STEPS: &[(&str, Option<&str>)] = &[
    (
        "participants",
        Some("DELETE FROM participants WHERE room_id = $1"),
    ),
    ("sessions", None),
    ("documents", None),
    ("invites", Some("DELETE FROM invites WHERE room_id = $1")),
    (
        "update_log",
        Some("DELETE FROM doc_updates WHERE room_id = $1"),
    ),
    (
        "snapshots",
        Some("DELETE FROM doc_snapshots WHERE room_id = $1"),
    ),
    // The running sandbox goes before its workspace snapshots and recordings, so nothing writes
    // a new one behind the deletion.
    ("sandbox", None),
    // A VM's workspace disk (the microVM tier), and any a crashed server left behind.
    ("vm_disks", None),
    ("workspace", None),
    ("recordings", None),
    // Checkpoints' files; their rows go with the room row.
    ("checkpoints", None),
    ("secrets", Some("DELETE FROM secrets WHERE room_id = $1")),
    // The server's clones of the room's repositories (their rows go with the room row; their
    // credentials are the secrets above).
    ("repositories", None),
    ("previews", Some("DELETE FROM previews WHERE room_id = $1")),
    // Files deleted from its document, kept for restoring.
    ("trash", Some("DELETE FROM file_trash WHERE room_id = $1")),
    // Its meters (the sums of its `metered` records; the records are in the chain, which stays).
    ("spend", Some("DELETE FROM spend WHERE room_id = $1")),
    // Agents are users of their own, bound to this room: they go, tokens and all.
    (
        "agents",
        Some("DELETE FROM users WHERE id IN (SELECT user_id FROM agents WHERE room_id = $1)"),
    ),
    ("room", Some("DELETE FROM rooms WHERE id = $1")),
];

impl Ops {
    /// Asks for the room's deletion as `actor` (`delete`); a system admin confirms it. An
    /// open request is answered again rather than doubled.
    pub(crate) async fn request_deletion(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<Requested, OpError> {
        let locked = self.audit.lock().await;
        let proof = self
            .authorize_locked(&locked, room_id, actor, Action::RequestDeletion, json!({}))
            .await?;
        let id = match self.store.open_deletion(room_id).await? {
            Some(d) => d.id,
            None => {
                let id = IssuedId::fresh().to_string();
                let change = Change::CreateDeletion {
                    id: id.to_string(),
                    room_id: room_id.clone(),
                    requested_by: UserId::known(proof.actor()),
                };
                let details = json!({ "deletion_id": id });
                let entry = Entry::of(proof.action(), Verdict::Allow, details);
                self.write(&locked, room_id, proof.actor(), entry, change)
                    .await?;
                drop(locked);
                self.tell_admins(room_id, actor).await?;
                id
            }
        };
        Ok(Requested {
            deletion_id: id,
            state: DeletionState::PendingConfirmation,
        })
    }

    /// A new deletion request reaches the system admins (`--admin-emails`), who alone confirm
    /// it: a mail each, naming the room, who asked, and where to confirm.
    async fn tell_admins(&self, room_id: &RoomId, requester: &Actor) -> Result<(), OpError> {
        let name = self
            .store
            .room(room_id)
            .await?
            .map(|r| r.name)
            .unwrap_or_default();
        for admin in self.admin_emails.iter() {
            self.mailer.send(crate::accounts::mail::Mail {
                to: admin.clone(),
                subject: "A room's deletion waits for your confirmation".into(),
                body: format!(
                    "{} asks to delete the room \"{name}\" ({room_id}) and everything of it.\r\n\r\n\
                     Confirm or leave it in the admin console: {}/admin\r\n",
                    requester.email, self.public_origin,
                ),
            });
        }
        Ok(())
    }

    /// Confirms deletion `id` as `actor` (system admins only; the request stands only while
    /// its requester may still delete the room) and carries it out: its receipt.
    pub(crate) async fn confirm_deletion(
        &self,
        actor: &Actor,
        id: &IssuedId,
    ) -> Result<Deletion, OpError> {
        let action = Action::ConfirmDeletion;
        if let Decision::Deny(reason) = decide(
            &actor.principal(),
            &action,
            &RoomState::default(),
            self.now_ms(),
        ) {
            let details = json!({ "deletion_id": id });
            let entry = Entry::of(&action, Verdict::Deny, details).because(reason.to_string());
            self.record("system", &actor.id, entry, Change::None)
                .await?;
            return Err(OpError::Refused(reason.to_string()));
        }
        let _one_deletion_at_a_time = self.deletions.lock().await;
        let deletion = self.store.deletion(id).await?.ok_or(OpError::NotFound)?;
        if deletion.state == DeletionState::PendingConfirmation {
            // The request stands only while its requester may still delete the room.
            let state = self.store.room_state(&deletion.room_id).await?;
            let requester = coderoom_authz::Principal {
                user: deletion.requested_by.clone(),
                is_admin: false,
            };
            let still = decide(&requester, &Action::RequestDeletion, &state, self.now_ms());
            let details = json!({ "deletion_id": id, "room_id": deletion.room_id });
            if !matches!(still, Decision::Allow(_)) {
                let reason = "the requester no longer holds delete";
                let entry = Entry::of(&action, Verdict::Deny, details).because(reason.into());
                self.record("system", &actor.id, entry, Change::None)
                    .await?;
                return Err(OpError::Refused(reason.into()));
            }
            let entry = Entry::of(&action, Verdict::Allow, details);
            self.record("system", &actor.id, entry, Change::None)
                .await?;
        }
        if deletion.state != DeletionState::Done {
            self.store
                .confirm_deletion(id, &actor.id, &self.server.id, claim_ms(self))
                .await?;
            run(self, id, &deletion.room_id).await?;
        }
        receipt_of(self, id).await
    }

    /// Deletion `id` and its receipt so far, for its requester and system admins.
    pub(crate) async fn deletion(&self, actor: &Actor, id: &IssuedId) -> Result<Deletion, OpError> {
        let deletion = self.store.deletion(id).await?.ok_or(OpError::NotFound)?;
        if deletion.requested_by != actor.id && !actor.is_admin {
            return Err(OpError::NotFound);
        }
        receipt_of(self, id).await
    }
}

async fn receipt_of(app: &Ops, id: &str) -> Result<Deletion, OpError> {
    let d = app.store.deletion(id).await?.ok_or(OpError::NotFound)?;
    let receipt = match &d.receipt {
        Some(r) => serde_json::from_str(r).map_err(|_| OpError::Store(StoreError::Corrupt))?,
        // Not done: what has been destroyed so far, never presented as complete.
        None => receipt_body(&d.room_id, id, &app.store.deletion_steps(id).await?, false),
    };
    Ok(Deletion {
        deletion_id: id.to_owned(),
        state: d.state,
        receipt,
    })
}

fn receipt_body(
    room_id: &RoomId,
    id: &str,
    steps: &[(String, String, i64)],
    complete: bool,
) -> Receipt {
    Receipt {
        artifacts: steps
            .iter()
            .map(|(artifact, status, count)| Artifact {
                artifact: artifact.clone(),
                count: *count,
                status: status.clone(),
            })
            .collect(),
        complete,
        deletion_id: id.to_owned(),
        room_id: room_id.to_string(),
    }
}

/// `202` from `DELETE /api/rooms/{id}`: the deletion waits for an admin.
#[derive(Serialize)]
pub(crate) struct Requested {
    deletion_id: String,
    state: DeletionState,
}

/// `GET /api/deletions/{id}` and the confirmation's answer.
#[derive(Serialize)]
pub(crate) struct Deletion {
    deletion_id: String,
    state: DeletionState,
    receipt: Receipt,
}

/// What a deletion destroyed. Stored as text and hashed into the audit chains, so its fields
/// are in alphabetical order: the stored text is what any JSON re-encoding with sorted keys
/// gives.
#[derive(Serialize, Deserialize)]
pub(crate) struct Receipt {
    artifacts: Vec<Artifact>,
    complete: bool,
    deletion_id: String,
    room_id: String,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Artifact {
    artifact: String,
    count: i64,
    status: String,
}

/// Carries out (or resumes) a confirmed deletion.
/// How long a server's claim on a deletion it carries out lasts without renewal: three room
/// leases (a dead runner's deletion is picked up about that long after it died).
fn claim_ms(app: &Ops) -> i64 {
    app.rooms.lease_ms().saturating_mul(3)
}

/// Aborts its task when dropped (however the function holding it returns).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Claims (or renews this server's claim on) deletion `id`; `false` when another server has it.
async fn claim(app: &Ops, id: &str) -> Result<bool, StoreError> {
    app.store
        .claim_deletion(id, &app.server.id, claim_ms(app))
        .await
}

/// Carries out confirmed deletion `id` of `room_id`, from the first step not yet done, while
/// this server holds its claim (renewed after every step); returns without doing anything when
/// another live server carries it out.
pub(crate) async fn run(app: &Ops, id: &str, room_id: &RoomId) -> Result<(), OpError> {
    if !claim(app, id).await? {
        tracing::info!(deletion = %id, room = %room_id, "another server carries out this deletion");
        return Ok(());
    }
    // Renewed in the background too, so one long step (a large workspace on a slow volume)
    // never lets the claim lapse while this server works on it.
    let renewing = {
        let (app, id) = (app.clone(), id.to_owned());
        let every = std::time::Duration::from_millis(
            u64::try_from(claim_ms(&app) / 3).unwrap_or(1000).max(100),
        );
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if !matches!(claim(&app, &id).await, Ok(true)) {
                    break;
                }
            }
        })
    };
    let _renewing = AbortOnDrop(renewing);
    let mut executed = 0usize;
    // VM disks the sandbox step removed with their VM (this run; a resumed run finds any left).
    let mut vm_disks = 0i64;
    let done: Vec<String> = app
        .store
        .deletion_steps(id)
        .await?
        .into_iter()
        .map(|(a, _, _)| a)
        .collect();
    for (artifact, sql) in STEPS {
        if done.iter().any(|d| d == artifact) {
            continue;
        }
        match *artifact {
            "sessions" => {
                // Live connections: the room task closes them (4004) and unloads.
                let (tx, rx) = oneshot::channel();
                let loaded = app
                    .rooms
                    .notify(room_id, RoomCmd::Delete { done: tx })
                    .await;
                let closed = if loaded {
                    tokio::time::timeout(STOP_ROOM_WAIT, rx)
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or(0)
                } else {
                    0
                };
                let status = if closed > 0 { "destroyed" } else { "none" };
                app.store
                    .deletion_step_done(id, artifact, status, closed as i64)
                    .await?;
            }
            "documents" => {
                // The in-memory document went with the room task; its stored form is the
                // update log and the snapshot, below.
                app.store
                    .deletion_step_done(id, artifact, "unloaded", 0)
                    .await?;
            }
            "sandbox" => {
                let destroyed = app.sandboxes.destroy(room_id).await;
                let was_running = destroyed.running;
                vm_disks += i64::from(destroyed.vm_disk);
                // No sandbox, no connections: the room's counters go with it.
                app.egress.forget(room_id);
                app.spend.forget(room_id);
                let status = if was_running { "destroyed" } else { "none" };
                app.store
                    .deletion_step_done(id, artifact, status, i64::from(was_running))
                    .await?;
            }
            "vm_disks" => {
                // What the sandbox step's VM left, if anything (or a crashed server's).
                let vms = crate::config::vm_state_dir(&app.data_dir);
                let room = room_id.to_owned();
                let left = tokio::task::spawn_blocking(move || {
                    coderoom_sandbox::vm::remove_disks(&vms, &room)
                })
                .await
                .map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX));
                let count = vm_disks + left;
                let status = if count > 0 { "destroyed" } else { "none" };
                app.store
                    .deletion_step_done(id, artifact, status, count)
                    .await?;
            }
            "workspace" | "recordings" | "checkpoints" | "repositories" => {
                // A checkpoint being made finishes first, and none starts after (the schedule
                // skips a room being deleted).
                let lock = app.room_lock(room_id);
                let _held = if *artifact == "checkpoints" {
                    Some(lock.lock().await)
                } else {
                    None
                };
                let name = if *artifact == "repositories" {
                    "repos"
                } else {
                    artifact
                };
                let dir = app.data_dir.join("rooms").join(room_id).join(name);
                // The receipt says how many files went (snapshots, recordings), not just that
                // the directory did.
                let counted = dir.clone();
                let files = tokio::task::spawn_blocking(move || count_files(&counted))
                    .await
                    .unwrap_or(0);
                let status = match tokio::fs::remove_dir_all(&dir).await {
                    Ok(()) => "destroyed",
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => "none",
                    Err(e) => return Err(StoreError::Io(e).into()),
                };
                app.store
                    .deletion_step_done(id, artifact, status, files)
                    .await?;
            }
            _ => {
                app.store
                    .deletion_step(id, room_id, artifact, *sql, "none")
                    .await?
            }
        }
        executed += 1;
        // Test hook (see `crate::fault`): a crash after this many newly executed steps.
        crate::fault::point(&format!("deletion_after_steps_{executed}")).await;
        if !claim(app, id).await? {
            // Paused past the claim, and another server has taken over: it finishes.
            tracing::warn!(deletion = %id, room = %room_id, "another server took over this deletion");
            return Ok(());
        }
    }
    let _ = tokio::fs::remove_dir(app.data_dir.join("rooms").join(room_id)).await;
    let steps = app.store.deletion_steps(id).await?;
    let receipt = receipt_body(room_id, id, &steps, true);
    let text = serde_json::to_string(&receipt).map_err(|_| StoreError::Corrupt)?;
    let hash = hex::encode(Sha256::digest(text.as_bytes()));
    let details = json!({ "deletion_id": id, "receipt_hash": hash });
    // Tombstones: in the room's own chain (kept, it holds no content) and in the system chain.
    let tombstone = |details| Entry::act(Act::RoomDeleted, Verdict::Allow, details);
    app.record(room_id, "system", tombstone(details), Change::None)
        .await?;
    let details = json!({ "room_id": room_id, "deletion_id": id, "receipt_hash": hash });
    app.record("system", "system", tombstone(details), Change::None)
        .await?;
    app.store.finish_deletion(id, &text, &hash).await?;
    tracing::info!(room = %room_id, deletion = %id, "room deleted");
    Ok(())
}

/// Resumes deletions a crash interrupted: those no live server carries out (their claim has
/// lapsed, or is this server's from before a restart).
pub(crate) async fn resume(app: &Ops) -> Result<(), OpError> {
    let _one_deletion_at_a_time = app.deletions.lock().await;
    for d in app.store.unfinished_deletions(Some(&app.server.id)).await? {
        tracing::warn!(deletion = %d.id, room = %d.room_id, "resuming an interrupted deletion");
        run(app, &d.id, &d.room_id).await?;
    }
    Ok(())
}

/// Picks up, while the server runs, deletions another server left part way (it died): every
/// room lease period, a claim on each unfinished deletion whose runner's claim has lapsed.
/// `sweeps` counts the passes (`coderoom_deletion_sweeps_total`).
pub(crate) fn start_sweeper(
    app: Ops,
    sweeps: prometheus_client::metrics::counter::Counter,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let every = std::time::Duration::from_millis(
        u64::try_from(app.rooms.lease_ms())
            .unwrap_or(10_000)
            .max(250),
    );
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(every) => {}
            }
            if let Err(e) = resume(&app).await {
                tracing::warn!(error = %e, "resuming deletions failed; trying again later");
            }
            sweeps.inc();
        }
    });
}

/// Regular files under `dir` (0 when it does not exist); symlinks are not followed.
fn count_files(dir: &std::path::Path) -> i64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

//! Checkpoints (their routes are `http::checkpoints`): made by a holder of `edit` or by the
//! room's schedule, restored (`edit` and `type`, and someone else's approval where the room's
//! policy asks), forked into a room of the forker's own (`observe` and `export`, or an
//! approval; never by an agent), pruned by count and age.
//!
//! A checkpoint is the room's document and its workspace at one moment, in files under
//! `DATA_DIR/rooms/<room>/checkpoints/<id>/`: `doc.bin` (the document as one Yjs update) and
//! `workspace.tar` (the workspace archive). Restoring one rewrites the document through an
//! ordinary update, made by whoever restores it, and puts the archive back as the sandbox's
//! workspace (see `Actor::rewind`).

use crate::ids::{IssuedId, RoomId};
use crate::ops::approvals::Allowed;
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::sandbox::snapshots::Meta;
use crate::store::{Change, CheckpointRow};
use coderoom_authz::{Action, Capability};
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

/// A checkpoint's or a fork's name: 1 to [`MAX_NAME`] printable characters.
fn checked_name(name: &str) -> Result<(), OpError> {
    if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(OpError::Bad("name must be 1 to 100 printable characters"));
    }
    Ok(())
}

/// Where a room's checkpoints are.
pub(crate) fn dir_of(app: &Ops, room_id: &RoomId) -> PathBuf {
    app.data_dir.join("rooms").join(room_id).join("checkpoints")
}

/// Who makes a checkpoint: a person (their id and email: the document is read as them), or
/// the room's schedule.
struct Maker<'a> {
    who: (&'a str, &'a str),
    actor: &'a str,
    scheduled: bool,
}

impl<'a> Maker<'a> {
    fn person(actor: &'a Actor, proven: &'a str) -> Self {
        Maker {
            who: (&actor.id, &actor.email),
            actor: proven,
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
    app: &Ops,
    room_id: &RoomId,
    maker: Maker<'_>,
    name: String,
) -> Result<CheckpointRow, OpError> {
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
    let change = Change::AddCheckpoint {
        room_id: room_id.clone(),
        row: row.clone(),
    };
    let entry = Entry::act(Act::CreateCheckpoint, Verdict::Allow, details);
    if let Err(e) = app.record(room_id, actor, entry, change).await {
        let _ = tokio::fs::remove_dir_all(&dir).await;
        return Err(e);
    }
    prune(app, room_id).await?;
    Ok(row)
}

/// Writes a checkpoint's files into `dir`: the document (as the room holds it now, read as a
/// participant) and the workspace. Returns their size.
async fn write_files(
    app: &Ops,
    room_id: &RoomId,
    who: (&str, &str),
    dir: &std::path::Path,
) -> Result<u64, OpError> {
    tokio::fs::create_dir_all(dir).await.map_err(store_io)?;
    let visit = crate::room::visit::Visit::start(&app.rooms, &app.limits, room_id, who)
        .await
        .map_err(|e| OpError::Sandbox(e.into()))?;
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

fn store_io(e: std::io::Error) -> OpError {
    OpError::Store(crate::store::StoreError::Io(e))
}

/// Keeps the newest [`MAX_CHECKPOINTS`] of each kind (made by people, made by the schedule,
/// so a schedule never pushes out what people made), and none older than the room's policy
/// says: the others are recorded as pruned, then removed.
async fn prune(app: &Ops, room_id: &RoomId) -> Result<(), OpError> {
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
        let change = Change::RemoveCheckpoint {
            room_id: room_id.clone(),
            id: old.id.clone(),
        };
        let entry = Entry::act(Act::PruneCheckpoint, Verdict::Allow, details);
        match app.record(room_id, "system", entry, change).await {
            Ok(_) => {}
            // Pruned by another request first.
            Err(OpError::Store(crate::store::StoreError::Conflict)) => continue,
            Err(e) => return Err(e),
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
async fn texts_in(dir: &std::path::Path) -> Result<BTreeMap<String, String>, OpError> {
    let corrupt = || OpError::Store(crate::store::StoreError::Corrupt);
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

impl Ops {
    /// Makes a checkpoint of the room as `actor` (`edit`).
    pub(crate) async fn create_checkpoint(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        name: &str,
    ) -> Result<CheckpointRow, OpError> {
        let name = name.trim().to_owned();
        checked_name(&name)?;
        let details = json!({ "name": name });
        let proof = self
            .authorize(room_id, actor, Action::Use(Capability::Edit), details)
            .await?;
        let lock = self.room_lock(room_id);
        let _held = lock.lock().await;
        make(self, room_id, Maker::person(actor, proof.actor()), name).await
    }

    /// Restores checkpoint `cid` as `actor`: files for everyone (`edit`), and the workspace
    /// with its running programs (`type`, as a stop and start of the sandbox needs); an
    /// approval where the room asks for one.
    pub(crate) async fn restore_checkpoint(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        cid: &IssuedId,
        approval_id: Option<&str>,
    ) -> Result<Outcome<serde_json::Value>, OpError> {
        let app = self;
        let policy = app.store.checkpoint_policy(room_id).await?;
        let approval = app.presented(room_id, approval_id).await?;
        // A checkpoint that is not there gets no approval asked for it.
        if app.store.checkpoint(room_id, cid).await?.is_none() {
            return Err(OpError::NotFound);
        }
        let params = json!({ "checkpoint": cid.as_str() }).to_string();
        let action = Action::RestoreCheckpoint {
            params,
            approval,
            approval_required: policy.restore_needs_approval,
        };
        let details = json!({ "checkpoint": cid.as_str() });
        let Allowed { proof, approval } = match app.ask(room_id, actor, action, details).await? {
            Outcome::Done(allowed) => allowed,
            Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
        };
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        let row = app
            .store
            .checkpoint(room_id, cid)
            .await?
            .ok_or(OpError::NotFound)?;
        let dir = dir_of(app, room_id).join(cid.as_str());
        let texts = texts_in(&dir).await?;
        let files = texts.len();
        let meta = workspace_meta(&dir).await;
        // The room as it is now, kept first: restoring it undoes this restore (nothing anyone
        // wrote since the checkpoint is lost to it).
        let shown: String = row.name.chars().take(MAX_NAME - 30).collect();
        let before = make(
            app,
            room_id,
            Maker::person(actor, proof.actor()),
            format!("before restoring \"{shown}\""),
        )
        .await?;
        // On record (and the approval spent, once) before anything changes: a restore is never
        // done without its record, and one approval never restores twice.
        let details = json!({
            "checkpoint": row.id, "name": row.name, "at": row.at, "files": files,
            "approval_id": approval, "undo": before.id,
        });
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        app.record_allowed(room_id, &proof, entry, Change::None, &approval)
            .await?;
        let rewound = app
            .sandboxes
            .rewind(
                room_id,
                crate::sandbox::supervisor::Rewind {
                    archive: dir.join(WORKSPACE_FILE),
                    texts,
                    who: (actor.id.to_string(), actor.email.clone()),
                    what: format!("checkpoint {:?}", row.name),
                    meta,
                },
            )
            .await;
        if let Err(e) = rewound {
            // Part of it may have happened (the document rewritten, the workspace not): on
            // record.
            let details = json!({ "checkpoint": row.id, "name": row.name, "error": e.to_string() });
            let entry = Entry::act(Act::RestoreCheckpointFailed, Verdict::Allow, details);
            app.record(room_id, proof.actor(), entry, Change::None)
                .await?;
            return Err(e.into());
        }
        // Everyone in the room is told who restored what, and how to undo it.
        let event = crate::terminal::TermEvent::Restored {
            by: actor.email.clone(),
            checkpoint: row.name.clone(),
            undo: before.id.clone(),
        };
        app.sandboxes.notice(room_id, event).await;
        Ok(Outcome::Done(json!({
            "id": row.id, "name": row.name, "at": row.at, "restored": true, "undo": before.id,
        })))
    }

    /// A new room owned by `actor`, with the files of a checkpoint
    /// (the one named, or one made now) and nothing of the parent's authority: no participants,
    /// grants, invites, approvals, checkpoints (nor secrets, repositories, previews or budgets,
    /// when rooms have them). The parent's chain records the fork; the new room's first record
    /// names the parent, the checkpoint and the parent's chain head after that record.
    pub(crate) async fn fork_room(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        body: ForkAsked,
    ) -> Result<Outcome<serde_json::Value>, OpError> {
        let app = self;
        // A checkpoint that is not there gets no approval asked for it.
        if let Some(cid) = &body.checkpoint {
            let cid = IssuedId::parse(cid).ok_or(OpError::NotFound)?;
            if app.store.checkpoint(room_id, &cid).await?.is_none() {
                return Err(OpError::NotFound);
            }
        }
        // `observe` plus `export`, or an approval of exactly this fork (202 until there is one).
        let params = json!({ "checkpoint": body.checkpoint }).to_string();
        let approval = app.presented(room_id, body.approval_id.as_deref()).await?;
        let action = Action::Fork { params, approval };
        let details = json!({ "checkpoint": body.checkpoint });
        let Allowed { proof, approval } = match app.ask(room_id, actor, action, details).await? {
            Outcome::Done(allowed) => allowed,
            Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
        };
        let parent = app.store.room(room_id).await?.ok_or(OpError::NotFound)?;
        let name = match body.name.as_deref().map(str::trim) {
            Some(n) => n.to_owned(),
            None => {
                let mut n: String = parent.name.chars().take(MAX_NAME - 7).collect();
                n.push_str(" (fork)");
                n
            }
        };
        checked_name(&name)?;
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        let checkpoint = match &body.checkpoint {
            Some(cid) => {
                let cid = IssuedId::parse(cid).ok_or(OpError::NotFound)?;
                app.store
                    .checkpoint(room_id, &cid)
                    .await?
                    .ok_or(OpError::NotFound)?
            }
            None => {
                // A checkpoint made for the fork: making one needs `edit`.
                let details = json!({ "fork": null });
                app.authorize(room_id, actor, Action::Use(Capability::Edit), details)
                    .await?;
                make(
                    app,
                    room_id,
                    Maker::person(actor, proof.actor()),
                    format!("fork as {name:?}"),
                )
                .await?
            }
        };
        let dir = dir_of(app, room_id).join(&checkpoint.id);
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
            "participants": app.store.participants(room_id).await?.len().saturating_sub(1),
            "invites": app.store.invite_count(room_id).await?,
            "approvals": app.store.approvals(room_id).await?.len(),
            "checkpoints": app.store.checkpoints(room_id).await?.len(),
            "secrets": app.store.secret_rules(room_id).await?.len(),
            "repositories": 0,
            "previews": 0,
            "budgets": 0,
        });
        let new_id = RoomId::fresh();
        let details = json!({
            "room": new_id.as_str(), "checkpoint": checkpoint.id, "name": name,
            "approval_id": approval,
        });
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        let forked = app
            .record_allowed(room_id, &proof, entry, Change::None, &approval)
            .await?;
        let parentage = json!({
            "room": room_id.as_str(),
            "checkpoint": checkpoint.id,
            "chain_head": forked.hash,
            "dropped": dropped,
        });
        let change = Change::ForkRoom {
            id: new_id.clone(),
            name: name.clone(),
            owner: actor.id.clone(),
            parent: parentage.to_string(),
            doc,
            readiness: parent.readiness.clone(),
        };
        let details = json!({ "name": name, "parent": parentage });
        let entry = Entry::act(Act::CreateRoom, Verdict::Allow, details);
        app.record(&new_id, &actor.id, entry, change).await?;
        let meta = workspace_meta(&dir).await;
        app.sandboxes
            .seed(&new_id, dir.join(WORKSPACE_FILE), meta)
            .await?;
        tracing::info!(room = %new_id, parent = %room_id, user = %actor.id, "room forked");
        Ok(Outcome::Done(json!({
            "id": new_id.as_str(),
            "name": name,
            "parent": { "room": room_id.as_str(), "checkpoint": checkpoint.id, "chain_head": forked.hash },
        })))
    }
}

/// A fork as asked for: of checkpoint `checkpoint` (one made now when `None`), named `name`
/// (the parent's name and " (fork)" when `None`), presenting `approval_id`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkAsked {
    #[serde(default)]
    pub(crate) checkpoint: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// An approval of this fork, for a caller without `export`.
    #[serde(default)]
    pub(crate) approval_id: Option<String>,
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
) -> Result<Option<Option<T>>, OpError> {
    match body.get(key) {
        None => Ok(None),
        Some(serde_json::Value::Null) => Ok(Some(None)),
        Some(v) => serde_json::from_value(v.clone())
            .map(|t| Some(Some(t)))
            .map_err(|_| OpError::Bad("every_s and keep_days are numbers or null, restore_needs_approval true or false")),
    }
}

/// `PUT /api/rooms/{id}/checkpoint-policy` `{"every_s": 3600 | null, "keep_days": 30 | null,
/// "restore_needs_approval": true | false}`, each optional (absent: unchanged): scheduled
/// checkpoints (kept 20, apart from the ones people make), an age past which checkpoints are
/// pruned, and whether a restore needs someone else's approval. Room governance: needs
/// `approve` (owners hold it), so those a policy restrains cannot lift it. Audited.
impl Ops {
    pub(crate) async fn set_checkpoint_policy(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        body: serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Value, OpError> {
        let app = self;
        const KEYS: [&str; 3] = ["every_s", "keep_days", "restore_needs_approval"];
        if body.keys().any(|k| !KEYS.contains(&k.as_str())) {
            return Err(OpError::Bad(
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
            return Err(OpError::Bad(
                "every_s must be from 300 (five minutes) to 604800 (a week), or null",
            ));
        }
        let keep_ms = keep_days.map(|v| v.map(|d| d.saturating_mul(24 * 3600 * 1000)));
        if keep_ms.flatten().is_some_and(|k| k <= 0 || k > MAX_KEEP_MS) {
            return Err(OpError::Bad("keep_days must be from 1 to 365, or null"));
        }
        let details = serde_json::Value::Object(body.clone());
        let proof = app
            .authorize(
                room_id,
                actor,
                Action::Use(Capability::Approve),
                details.clone(),
            )
            .await?;
        let now_policy = app.store.checkpoint_policy(room_id).await?;
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
        let change = Change::SetCheckpointPolicy {
            room_id: room_id.clone(),
            policy,
        };
        let entry = Entry::act(Act::SetCheckpointPolicy, Verdict::Allow, details);
        app.record(room_id, proof.actor(), entry, change).await?;
        let lock = app.room_lock(room_id);
        let _held = lock.lock().await;
        prune(app, room_id).await?;
        Ok(policy_view(&policy))
    }
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
pub(crate) fn start_scheduler(app: Ops, shutdown: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
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

async fn scheduled(app: &Ops, room_id: &RoomId, now: i64) -> Result<(), OpError> {
    let policy = app.store.checkpoint_policy(room_id).await?;
    let Some(every) = policy.every_ms else {
        return Ok(());
    };
    // The next time first: a failure waits for it rather than retrying at once.
    app.store.set_checkpoint_due(room_id, now + every).await?;
    let lock = app.room_lock(room_id);
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
async fn unchanged_since_last(app: &Ops, room_id: &RoomId) -> Result<bool, OpError> {
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
            .map_err(|e| OpError::Sandbox(e.into()))?;
    let now = crate::room::visit::texts_of(&visit.doc);
    visit.leave().await;
    Ok(texts_in(&dir_of(app, room_id).join(&last.id)).await? == now)
}

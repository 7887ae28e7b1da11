//! The state changes recorded together with their audit records, applied in the same transaction.

use super::rooms::participant_columns;
use super::*;
use crate::ids::{RoomId, UserId};

/// A state change recorded together with its audit record.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    /// Only the audit record (a denial, or an action with no stored effect).
    None,
    /// Add a `metered` record's charges (who, meter, amount) to the room's sums.
    Spend {
        room_id: RoomId,
        charges: Vec<(String, String, i64)>,
    },
    /// Set the room's budget (JSON; `None`: no budget).
    SetBudget {
        room_id: RoomId,
        budget: Option<String>,
    },
    /// Set an agent's budget (JSON).
    SetAgentBudget {
        user_id: UserId,
        budget: String,
    },
    /// Whether agents type only while a person who holds `approve` is in the room.
    SetModerated {
        room_id: RoomId,
        moderated: bool,
    },
    /// Store a participant's rights (insert or replace).
    SetParticipant {
        room_id: RoomId,
        user_id: UserId,
        participant: Participant,
    },
    RemoveParticipant {
        room_id: RoomId,
        user_id: UserId,
        now: i64,
    },
    CreateInvite {
        token_hash: String,
        room_id: RoomId,
        role: String,
        created_by: UserId,
        expires_at: i64,
        max_uses: i64,
        /// Chosen capabilities, comma-separated (`None`: the role's).
        capabilities: Option<String>,
        /// The one address that may accept it.
        email: Option<String>,
    },
    /// Spend one use of an invite and add its participant (unless already one).
    AcceptInvite {
        token_hash: String,
        room_id: RoomId,
        user_id: UserId,
        participant: Participant,
        now: i64,
    },
    RevokeInvite {
        token_hash: String,
        now: i64,
    },
    /// A new room and its owner.
    CreateRoom {
        id: RoomId,
        name: String,
        owner: UserId,
    },
    /// A fork: a new room, its owner, its parentage (JSON) and its first document (one Yjs
    /// update: the files it was forked with).
    ForkRoom {
        id: RoomId,
        name: String,
        owner: UserId,
        parent: String,
        doc: Vec<u8>,
        /// The parent's readiness command (setup, not authority: a fork keeps it).
        readiness: Option<String>,
    },
    /// A pending deletion request.
    CreateDeletion {
        id: String,
        room_id: RoomId,
        requested_by: UserId,
    },
    CreateApproval {
        id: String,
        room_id: RoomId,
        requester: UserId,
        action: String,
        params: String,
        expires_at: i64,
    },
    /// Records a decision on a request nobody decided yet.
    DecideApproval {
        id: String,
        by: UserId,
        approved: bool,
    },
    /// Spends an approved request (single use).
    UseApproval {
        id: String,
    },
    /// A sandbox lifecycle transition: the room's whole sandbox row afterwards.
    SandboxState {
        room_id: RoomId,
        row: SandboxRow,
    },
    /// A new checkpoint (its files are already written).
    AddCheckpoint {
        room_id: RoomId,
        row: super::CheckpointRow,
    },
    /// Adds a secret, or replaces the one of that name.
    PutSecret {
        room_id: RoomId,
        rule: super::SecretRule,
        sealed: super::SealedSecret,
    },
    RemoveSecret {
        room_id: RoomId,
        name: String,
    },
    /// The room's readiness command (`None`: no readiness step).
    SetReadiness {
        room_id: RoomId,
        command: Option<String>,
    },
    /// The room's checkpoint policy.
    SetCheckpointPolicy {
        room_id: RoomId,
        policy: super::CheckpointPolicy,
    },
    /// A checkpoint pruned by the room's retention (its files go after the record).
    RemoveCheckpoint {
        room_id: RoomId,
        id: String,
    },
    /// A repository connected to the room.
    PutRepo {
        room_id: RoomId,
        repo: super::RepoRow,
    },
    /// The commit a repository's files are now in step with (a pull or a push).
    SetRepoBase {
        room_id: RoomId,
        id: String,
        base: String,
    },
    /// A repository disconnected.
    RemoveRepo {
        room_id: RoomId,
        id: String,
    },
    /// Whether adding a secret needs an approval.
    SetSecretsPolicy {
        room_id: RoomId,
        needs_approval: bool,
    },
    /// A preview made.
    CreatePreview(super::PreviewRow),
    /// A file deleted from the document, kept in the room's trash.
    Trash(super::TrashRow),
    /// A file taken out of the trash (restored): a conflict when it is not there.
    Untrash {
        room_id: RoomId,
        id: String,
    },
    /// An agent brought in, with its token's hash.
    CreateAgent {
        agent: super::AgentRow,
        token_hash: String,
    },
    /// An agent ended: revoked, its token gone.
    RevokeAgent {
        room_id: RoomId,
        agent_id: UserId,
        now: i64,
    },
    /// A preview's state (and its expiry: an approved public preview's lifetime starts then).
    SetPreviewState {
        id: String,
        state: super::PreviewState,
        expires_at: i64,
    },
    /// Two changes in the one transaction (an action and the approval it spends).
    Both(Box<Change>, Box<Change>),
    /// An account revoked everywhere (`Some(when)`: it logs in no more) or restored (`None`).
    SetUserDisabled {
        user_id: UserId,
        at: Option<i64>,
    },
    /// The room's egress policy (JSON, checked by the egress proxy's policy).
    SetEgress {
        room_id: RoomId,
        policy: String,
    },
}

impl Change {
    /// This change, and the spending of `approval` (an id; empty: none) in the same
    /// transaction.
    pub(crate) fn spending(self, approval: String) -> Change {
        if approval.is_empty() {
            self
        } else {
            Change::Both(
                Box::new(self),
                Box::new(Change::UseApproval { id: approval }),
            )
        }
    }
}

pub(super) async fn apply_change(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    change: &Change,
) -> Result<(), StoreError> {
    match change {
        Change::None => {}
        Change::Spend { room_id, charges } => super::spend::add(tx, room_id, charges).await?,
        Change::SetBudget { room_id, budget } => {
            sqlx::query("UPDATE rooms SET budget = $1 WHERE id = $2")
                .bind(budget.as_deref())
                .bind(room_id)
                .execute(&mut **tx)
                .await?;
        }
        Change::SetModerated { room_id, moderated } => {
            sqlx::query("UPDATE rooms SET moderated = $1 WHERE id = $2")
                .bind(i64::from(*moderated))
                .bind(room_id)
                .execute(&mut **tx)
                .await?;
        }
        Change::SetAgentBudget { user_id, budget } => {
            sqlx::query("UPDATE agents SET budget = $1 WHERE user_id = $2")
                .bind(budget)
                .bind(user_id)
                .execute(&mut **tx)
                .await?;
        }
        Change::SetParticipant {
            room_id,
            user_id,
            participant,
        } => {
            // Only an existing participant changes; a removal is never undone by a change.
            let (role, extra, removed) = participant_columns(participant);
            let done = sqlx::query(
                "UPDATE participants SET role = $1, extra = $2, removed = $3 \
                 WHERE room_id = $4 AND user_id = $5",
            )
            .bind(role)
            .bind(extra)
            .bind(removed)
            .bind(room_id)
            .bind(user_id)
            .execute(&mut **tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::RemoveParticipant {
            room_id,
            user_id,
            now,
        } => {
            sqlx::query("DELETE FROM participants WHERE room_id = $1 AND user_id = $2")
                .bind(room_id)
                .bind(user_id)
                .execute(&mut **tx)
                .await?;
            // Their agents go with them.
            super::agents::revoke(tx, room_id, "sponsor", user_id, *now).await?;
            sqlx::query(
                "INSERT INTO removals (room_id, user_id, at) VALUES ($1, $2, $3) \
                 ON CONFLICT (room_id, user_id) DO UPDATE SET at = excluded.at",
            )
            .bind(room_id)
            .bind(user_id)
            .bind(*now)
            .execute(&mut **tx)
            .await?;
        }
        Change::CreateInvite {
            token_hash,
            room_id,
            role,
            created_by,
            expires_at,
            max_uses,
            capabilities,
            email,
        } => {
            sqlx::query(
                "INSERT INTO invites (token_hash, room_id, role, created_by, created_at, expires_at, \
                 max_uses, capabilities, email) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(token_hash)
            .bind(room_id)
            .bind(role)
            .bind(created_by)
            .bind(now_ms())
            .bind(expires_at)
            .bind(max_uses)
            .bind(capabilities.as_deref())
            .bind(email.as_deref())
            .execute(&mut **tx)
            .await?;
        }
        Change::AcceptInvite {
            token_hash,
            room_id,
            user_id,
            participant,
            now,
        } => {
            let used = sqlx::query(
                "UPDATE invites SET uses = uses + 1 WHERE token_hash = $1 AND uses < max_uses \
                 AND revoked_at IS NULL AND expires_at > $2 AND NOT EXISTS (SELECT 1 FROM removals r \
                 WHERE r.room_id = invites.room_id AND r.user_id = $3 AND r.at >= invites.created_at)",
            )
            .bind(token_hash)
            .bind(*now)
            .bind(user_id)
            .execute(&mut **tx)
            .await?;
            if used.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
            let (role, extra, removed) = participant_columns(participant);
            sqlx::query(
                "INSERT INTO participants (room_id, user_id, role, created_at, extra, removed) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (room_id, user_id) DO NOTHING",
            )
            .bind(room_id)
            .bind(user_id)
            .bind(role)
            .bind(*now)
            .bind(extra)
            .bind(removed)
            .execute(&mut **tx)
            .await?;
        }
        Change::AddCheckpoint { room_id, row } => {
            sqlx::query(
                "INSERT INTO checkpoints (id, room_id, name, author, at, bytes, scheduled) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&row.id)
            .bind(room_id)
            .bind(&row.name)
            .bind(&row.author)
            .bind(row.at)
            .bind(row.bytes)
            .bind(i64::from(row.scheduled))
            .execute(&mut **tx)
            .await?;
        }
        Change::PutSecret {
            room_id,
            rule,
            sealed,
        } => {
            let hosts = serde_json::to_string(&rule.hosts).map_err(|_| StoreError::Corrupt)?;
            sqlx::query("DELETE FROM secrets WHERE room_id = $1 AND name = $2")
                .bind(room_id)
                .bind(&rule.name)
                .execute(&mut **tx)
                .await?;
            sqlx::query(
                "INSERT INTO secrets (room_id, name, hosts, header, format, key_id, nonce, \
                 sealed, created_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(room_id)
            .bind(&rule.name)
            .bind(hosts)
            .bind(&rule.header)
            .bind(&rule.format)
            .bind(&sealed.key_id)
            .bind(sealed.nonce.as_slice())
            .bind(sealed.sealed.as_slice())
            .bind(&rule.created_by)
            .bind(rule.created_at)
            .execute(&mut **tx)
            .await?;
        }
        Change::RemoveSecret { room_id, name } => {
            let done = sqlx::query("DELETE FROM secrets WHERE room_id = $1 AND name = $2")
                .bind(room_id)
                .bind(name)
                .execute(&mut **tx)
                .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::SetReadiness { room_id, command } => {
            sqlx::query("UPDATE rooms SET readiness = $1 WHERE id = $2")
                .bind(command.as_deref())
                .bind(room_id)
                .execute(&mut **tx)
                .await?;
        }
        Change::PutRepo { room_id, repo } => super::repos::insert(tx, room_id, repo).await?,
        Change::SetRepoBase { room_id, id, base } => {
            let done = sqlx::query("UPDATE repos SET base = $1 WHERE room_id = $2 AND id = $3")
                .bind(base)
                .bind(room_id)
                .bind(id)
                .execute(&mut **tx)
                .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::RemoveRepo { room_id, id } => {
            let done = sqlx::query("DELETE FROM repos WHERE room_id = $1 AND id = $2")
                .bind(room_id)
                .bind(id)
                .execute(&mut **tx)
                .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::SetSecretsPolicy {
            room_id,
            needs_approval,
        } => {
            sqlx::query("UPDATE rooms SET secrets_need_approval = $1 WHERE id = $2")
                .bind(i64::from(*needs_approval))
                .bind(room_id)
                .execute(&mut **tx)
                .await?;
        }
        Change::CreatePreview(p) => super::previews::insert(tx, p).await?,
        Change::Trash(t) => super::trash::insert(tx, t).await?,
        Change::Untrash { room_id, id } => {
            if !super::trash::remove(tx, room_id, id).await? {
                return Err(StoreError::Conflict);
            }
        }
        Change::CreateAgent { agent, token_hash } => {
            super::agents::insert(tx, agent, token_hash).await?;
        }
        Change::RevokeAgent {
            room_id,
            agent_id,
            now,
        } => super::agents::revoke(tx, room_id, "user_id", agent_id, *now).await?,
        Change::SetPreviewState {
            id,
            state,
            expires_at,
        } => {
            sqlx::query("UPDATE previews SET state = $1, expires_at = $2 WHERE id = $3")
                .bind(state)
                .bind(expires_at)
                .bind(id)
                .execute(&mut **tx)
                .await?;
        }
        Change::Both(first, second) => {
            Box::pin(apply_change(tx, first)).await?;
            Box::pin(apply_change(tx, second)).await?;
        }
        Change::SetUserDisabled { user_id, at } => {
            sqlx::query("UPDATE users SET disabled_at = $1 WHERE id = $2")
                .bind(*at)
                .bind(user_id)
                .execute(&mut **tx)
                .await?;
        }
        Change::SetEgress { room_id, policy } => {
            sqlx::query("UPDATE rooms SET egress = $1 WHERE id = $2")
                .bind(policy)
                .bind(room_id)
                .execute(&mut **tx)
                .await?;
        }
        Change::SetCheckpointPolicy { room_id, policy } => {
            sqlx::query(
                "UPDATE rooms SET checkpoint_every_ms = $1, checkpoint_keep_ms = $2, \
                 checkpoint_due_at = $3, checkpoint_restore_approval = $4 WHERE id = $5",
            )
            .bind(policy.every_ms)
            .bind(policy.keep_ms)
            .bind(policy.due_at)
            .bind(i64::from(policy.restore_needs_approval))
            .bind(room_id)
            .execute(&mut **tx)
            .await?;
        }
        Change::RemoveCheckpoint { room_id, id } => {
            let done = sqlx::query("DELETE FROM checkpoints WHERE room_id = $1 AND id = $2")
                .bind(room_id)
                .bind(id)
                .execute(&mut **tx)
                .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::CreateRoom { id, name, owner } => {
            insert_room(tx, id, name, owner, (None, None)).await?;
        }
        Change::ForkRoom {
            id,
            name,
            owner,
            parent,
            doc,
            readiness,
        } => {
            insert_room(tx, id, name, owner, (Some(parent), readiness.as_deref())).await?;
            sqlx::query("INSERT INTO doc_updates (room_id, seq, data) VALUES ($1, 1, $2)")
                .bind(id)
                .bind(doc.as_slice())
                .execute(&mut **tx)
                .await?;
        }
        Change::CreateDeletion {
            id,
            room_id,
            requested_by,
        } => {
            sqlx::query(
                "INSERT INTO deletions (id, room_id, requested_by, requested_at, state, room_name) \
                 SELECT $1, $2, $3, $4, 'pending_confirmation', \
                 (SELECT name FROM rooms WHERE id = $2)",
            )
            .bind(id)
            .bind(room_id)
            .bind(requested_by)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        }
        Change::CreateApproval {
            id,
            room_id,
            requester,
            action,
            params,
            expires_at,
        } => {
            sqlx::query(
                "INSERT INTO approvals (id, room_id, requester, action, params, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id)
            .bind(room_id)
            .bind(requester)
            .bind(action)
            .bind(params)
            .bind(now_ms())
            .bind(*expires_at)
            .execute(&mut **tx)
            .await?;
        }
        Change::DecideApproval { id, by, approved } => {
            let done = sqlx::query(
                "UPDATE approvals SET decided_by = $1, decided_at = $2, approved = $3 \
                 WHERE id = $4 AND decided_by IS NULL",
            )
            .bind(by)
            .bind(now_ms())
            .bind(i64::from(*approved))
            .bind(id)
            .execute(&mut **tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::SandboxState { room_id, row } => {
            sqlx::query(
                "INSERT INTO sandboxes (room_id, state, reason, receipt, snapshot, snapshot_at, stop_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (room_id) DO UPDATE SET state = excluded.state, reason = excluded.reason, \
                 receipt = excluded.receipt, snapshot = excluded.snapshot, snapshot_at = excluded.snapshot_at, \
                 stop_at = excluded.stop_at, updated_at = excluded.updated_at",
            )
            .bind(room_id)
            .bind(row.state.as_str())
            .bind(&row.reason)
            .bind(&row.receipt)
            .bind(row.snapshot.clone())
            .bind(row.snapshot_at)
            .bind(row.stop_at)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        }
        Change::UseApproval { id } => {
            let done = sqlx::query(
                "UPDATE approvals SET used_at = $1 WHERE id = $2 AND approved = 1 AND used_at IS NULL",
            )
            .bind(now_ms())
            .bind(id)
            .execute(&mut **tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        Change::RevokeInvite { token_hash, now } => {
            sqlx::query(
                "UPDATE invites SET revoked_at = $1 WHERE token_hash = $2 AND revoked_at IS NULL",
            )
            .bind(*now)
            .bind(token_hash)
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(())
}

/// A new room row (with a fork's parentage and readiness command) and its owner.
async fn insert_room(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &str,
    name: &str,
    owner: &str,
    (parent, readiness): (Option<&str>, Option<&str>),
) -> Result<(), StoreError> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO rooms (id, name, created_by, created_at, parent, readiness) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(name)
    .bind(owner)
    .bind(now)
    .bind(parent)
    .bind(readiness)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO participants (room_id, user_id, role, created_at) VALUES ($1, $2, 'owner', $3)",
    )
    .bind(id)
    .bind(owner)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

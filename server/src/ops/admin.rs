//! What system admins do across rooms: revoking an account everywhere (each removal decided and
//! recorded in its room's chain, the whole in the system chain).

use crate::ids::{RoomId, UserId};
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops};
use crate::store::Change;
use serde::Serialize;
use serde_json::json;

/// `POST /api/admin/users/{id}/restore`'s answer.
#[derive(Serialize)]
pub(crate) struct Restored {
    user_id: String,
    email: String,
}

#[derive(Serialize)]
pub(crate) struct Revoked {
    user_id: String,
    email: String,
    /// The rooms they were removed from.
    rooms: Vec<String>,
    /// Sessions ended (each one's sockets close).
    sessions: usize,
}

impl Ops {
    /// The email of account `target`, for an admin's act on it (system admins only; 404 for no
    /// such account).
    async fn admins_target(&self, actor: &Actor, target: &UserId) -> Result<String, OpError> {
        if !actor.is_admin {
            return Err(OpError::Refused(
                coderoom_authz::DenyReason::AdminOnly.to_string(),
            ));
        }
        self.store
            .user_email(target)
            .await?
            .ok_or(OpError::NotFound)
    }

    /// Removes account `target` from every room (each removal authorized as `actor` and
    /// recorded in that room's chain, its sockets there closed), ends every session it has
    /// (every socket it opened closes), and disables it, recorded with the whole in the system
    /// chain: it logs in no more (a login answers as for any address) until an admin restores it
    /// ([`Ops::restore_user`]). System admins only; not their own account.
    pub(crate) async fn revoke_user(
        &self,
        actor: &Actor,
        target: &UserId,
    ) -> Result<Revoked, OpError> {
        let email = self.admins_target(actor, target).await?;
        if target.as_str() == actor.id {
            return Err(OpError::Bad("you cannot revoke your own account"));
        }
        let mut rooms = Vec::new();
        for room in self.store.rooms_of(target).await? {
            let Some(room_id) = RoomId::parse(&room.id) else {
                continue;
            };
            self.remove_participant(&room_id, actor, target).await?;
            rooms.push(room.id);
        }
        let ended = self.store.delete_sessions_of(target).await?;
        let at = std::time::Instant::now();
        for hash in &ended {
            crate::ops::events::session_ended(self, hash.clone(), at).await;
        }
        let details = json!({
            "target": target,
            "email": email,
            "rooms": rooms,
            "sessions": ended.len(),
        });
        let entry = Entry::act(Act::RevokeUser, Verdict::Allow, details);
        let change = Change::SetUserDisabled {
            user_id: target.clone(),
            at: Some(self.now_ms()),
        };
        self.record("system", &actor.id, entry, change).await?;
        // A session that began while the rooms were being left ends too.
        for hash in self.store.delete_sessions_of(target).await? {
            crate::ops::events::session_ended(self, hash, std::time::Instant::now()).await;
        }
        tracing::info!(admin = %actor.email, user = %email, rooms = rooms.len(), sessions = ended.len(), "account revoked everywhere");
        Ok(Revoked {
            user_id: target.to_string(),
            email,
            rooms,
            sessions: ended.len(),
        })
    }

    /// Lets account `target`, revoked everywhere, log in again (into no room: its rooms were
    /// left when it was revoked), recorded in the system chain. System admins only.
    pub(crate) async fn restore_user(
        &self,
        actor: &Actor,
        target: &UserId,
    ) -> Result<Restored, OpError> {
        let email = self.admins_target(actor, target).await?;
        if !self.store.user_disabled(&email).await? {
            return Err(OpError::Bad("this account is not revoked"));
        }
        let details = json!({ "target": target, "email": email });
        let entry = Entry::act(Act::RestoreUser, Verdict::Allow, details);
        let change = Change::SetUserDisabled {
            user_id: target.clone(),
            at: None,
        };
        self.record("system", &actor.id, entry, change).await?;
        tracing::info!(admin = %actor.email, user = %email, "account restored");
        Ok(Restored {
            user_id: target.to_string(),
            email,
        })
    }
}

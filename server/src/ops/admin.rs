//! What system admins do across rooms: revoking an account everywhere (each removal decided and
//! recorded in its room's chain, the whole in the system chain).

use crate::ids::{RoomId, UserId};
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops};
use crate::store::Change;
use serde::Serialize;
use serde_json::json;

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
    /// Removes account `target` from every room (each removal authorized as `actor` and
    /// recorded in that room's chain, its sockets there closed), ends every session it has
    /// (every socket it opened closes), and records the whole in the system chain. The account
    /// stays: it may log in again, into no room. System admins only; not their own account.
    pub(crate) async fn revoke_user(
        &self,
        actor: &Actor,
        target: &UserId,
    ) -> Result<Revoked, OpError> {
        if !actor.is_admin {
            return Err(OpError::Refused(
                coderoom_authz::DenyReason::AdminOnly.to_string(),
            ));
        }
        let email = self
            .store
            .user_email(target)
            .await?
            .ok_or(OpError::NotFound)?;
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
        self.record("system", &actor.id, entry, Change::None)
            .await?;
        tracing::info!(admin = %actor.email, user = %email, rooms = rooms.len(), sessions = ended.len(), "account revoked everywhere");
        Ok(Revoked {
            user_id: target.to_string(),
            email,
            rooms,
            sessions: ended.len(),
        })
    }
}

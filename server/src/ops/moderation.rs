//! Moderated rooms: an agent runs code (types in the shared terminal, runs a command, sets the
//! readiness step) only while a person who holds `approve` is in the room (has its document or
//! terminal open).

use crate::ids::RoomId;
use crate::ops::{Actor, OpError, Ops};
use coderoom_authz::Capability;

/// Who has a room open now: connections per (room, user).
pub(crate) type Present = crate::ops::counted::Counted<(RoomId, String)>;

/// Who has the room open now.
fn in_room(present: &Present, room_id: &RoomId) -> Vec<String> {
    present
        .keys()
        .into_iter()
        .filter(|(r, _)| r == room_id)
        .map(|(_, u)| u)
        .collect()
}

/// Why an agent may not run code now.
pub(crate) const UNWATCHED: &str =
    "this room is moderated: an agent runs code only while someone who can approve is in the room";

impl Ops {
    /// Whether `actor` may run code in the room now: anyone may, except an agent in a
    /// moderated room while no person who holds `approve` has the room open
    /// ([`OpError::Refused`], not recorded: nothing was attempted beyond the moment).
    pub(crate) async fn moderated(&self, room_id: &RoomId, actor: &Actor) -> Result<(), OpError> {
        if !actor.is_agent() || !self.store.room_moderated(room_id).await? {
            return Ok(());
        }
        let state = self.store.room_state(room_id).await?;
        let now = self.now_ms();
        let watched = in_room(&self.present, room_id).iter().any(|u| {
            !state.agents.contains_key(u)
                && state.capabilities_of(u, now).contains(Capability::Approve)
        });
        if watched {
            Ok(())
        } else {
            Err(OpError::Refused(UNWATCHED.to_owned()))
        }
    }
}

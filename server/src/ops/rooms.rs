//! Making rooms. A room is a person's: an agent's token makes none (a room owned by an agent
//! is one no person can open), whether it creates one or forks one (`decide` refuses the fork).

use crate::ops::{Actor, OpError};

impl Actor {
    /// Whether this actor may make a room of its own.
    pub(crate) fn may_make_rooms(&self) -> Result<(), OpError> {
        if self.is_agent() {
            return Err(OpError::Refused(
                coderoom_authz::DenyReason::AgentOwner.to_string(),
            ));
        }
        Ok(())
    }
}

/// Longest room name, in characters.
const MAX_ROOM_NAME: usize = 100;

impl crate::ops::Ops {
    /// Creates a room owned by `actor` (a person): its id.
    pub(crate) async fn create_room(
        &self,
        actor: &Actor,
        name: &str,
    ) -> Result<crate::ids::RoomId, OpError> {
        actor.may_make_rooms()?;
        let name = name.trim();
        if name.is_empty()
            || name.chars().count() > MAX_ROOM_NAME
            || name.chars().any(char::is_control)
        {
            return Err(OpError::Bad("name must be 1 to 100 printable characters"));
        }
        let id = crate::ids::RoomId::fresh();
        let change = crate::store::Change::CreateRoom {
            id: id.clone(),
            name: name.to_owned(),
            owner: actor.id.clone(),
        };
        let details = serde_json::json!({ "name": name });
        let entry = crate::ops::record::Entry::act(
            crate::ops::record::Act::CreateRoom,
            crate::ops::record::Verdict::Allow,
            details,
        );
        self.record(&id, &actor.id, entry, change).await?;
        // A new room has no budget and has spent nothing: its first command need not read so.
        self.spend.created(&id);
        tracing::info!(room = %id, user = %actor.id, "room created");
        Ok(id)
    }
}

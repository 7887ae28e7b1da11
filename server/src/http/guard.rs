//! The edge's reads of the caller's standing in a room (`crate::ops::rights`): its
//! capabilities and rights, for the routes that only read and the sockets that follow them.
//! Nothing is decided or recorded here.

use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use crate::room::task::Rights;
use coderoom_authz::{Capability, CapabilitySet};

/// The caller's capabilities in the room (404 unless it may observe it).
pub(crate) async fn room_capabilities(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
) -> Result<CapabilitySet, ApiError> {
    let actor = user.actor(app).await?;
    Ok(app.ops.capabilities(room_id, &actor).await?)
}

/// Until when the caller may edit and observe in the room.
pub(crate) async fn room_access(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
) -> Result<Rights, ApiError> {
    Ok(room_rights(app, room_id, user, Capability::Edit).await?.0)
}

/// Until when the caller may use `cap` (never past its `observe`) and until when it may
/// observe, and its capabilities; 404 unless it may observe now.
pub(crate) async fn room_rights(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    cap: Capability,
) -> Result<(Rights, CapabilitySet), ApiError> {
    let actor = user.actor(app).await?;
    Ok(app.ops.rights(room_id, &actor, cap).await?)
}

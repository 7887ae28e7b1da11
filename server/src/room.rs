//! Rooms: one task per loaded room owns its Yjs document, presence and connections; the
//! registry starts and finds them; the wire protocol, outbound queues and presence identities
//! are theirs.

pub(crate) mod departed;
pub(crate) mod journal;
pub(crate) mod merge;
pub(crate) mod outbox;
pub(crate) mod presence;
pub mod protocol;
pub(crate) mod registry;
pub(crate) mod task;
pub(crate) mod visit;

pub(crate) use registry::Rooms;
pub(crate) use task::{ConnId, RoomCmd, RoomDeps};

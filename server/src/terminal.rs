//! The shared terminal of a room: what its viewers receive, and its recording.

pub(crate) mod events;
pub(crate) mod floor;
pub(crate) mod hub;
pub(crate) mod lines;
pub(crate) mod recorder;

pub(crate) use events::{Joined, TermEvent, TermOut};
pub(crate) use hub::{Hub, Link};
pub(crate) use recorder::Recorder;

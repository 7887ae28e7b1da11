//! The shared terminal of a room: what its viewers receive, and its recording.

pub(crate) mod events;
pub(crate) mod recorder;

pub(crate) use events::{Joined, TermOut};
pub(crate) use recorder::Recorder;

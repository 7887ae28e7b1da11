//! Room sandboxes, control-plane side: one supervisor per room (lifecycle, snapshots, the
//! terminal hub) and the document <-> workspace file sync.

pub(crate) mod download;
pub(crate) mod filesync;
pub(crate) mod hosts;
pub(crate) mod receipt;
pub(crate) mod snapshots;
pub(crate) mod supervisor;

pub(crate) use supervisor::{Deps, SandboxError, SandboxStatus, Sandboxes, Streamed};

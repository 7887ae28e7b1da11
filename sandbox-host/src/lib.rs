//! Coderoom room sandboxes: the namespace and microVM backends and the guest agent.
//!
//! Not built yet: the sandbox issue fills this crate. Until then the server runs with the
//! `none` tier and this crate only names the tiers the server's configuration accepts.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// The isolation tier a room's sandbox runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Pick the best tier the host supports.
    Auto,
    /// Linux namespaces + seccomp + cgroups.
    Namespace,
    /// A microVM (cloud-hypervisor or QEMU).
    Microvm,
    /// No sandbox: terminal and exec are unavailable.
    None,
}

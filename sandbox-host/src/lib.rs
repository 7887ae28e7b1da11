//! Coderoom room sandboxes: the backends that isolate a room's workspace, the typed operations
//! the control plane sends into a sandbox, and the guest agent that performs them.
//!
//! The control plane never touches a backend's mechanics: it picks a [`Backend`], starts a
//! sandbox (getting a [`Sandbox`] handle that is ready only once its agent answers), and then
//! drives it with the closed set of operations in [`proto::Op`]. Lifecycle in one place:
//!
//! | step            | how                                   | legal when      |
//! |-----------------|---------------------------------------|-----------------|
//! | create + start  | [`Backend::start`]                    | no sandbox runs |
//! | resume          | [`Backend::start`] then [`Sandbox::restore`] of the latest snapshot | no sandbox runs |
//! | operations      | [`Sandbox::call`] / [`Sandbox::send`] with an [`proto::Op`] | running |
//! | connect to a port inside | [`Sandbox::connect`] | running |
//! | stop            | [`Sandbox::snapshot`] then [`Sandbox::kill`] | running   |
//! | delete          | kill, then the caller removes its snapshots | any        |
#![deny(unsafe_op_in_unsafe_fn)]

pub mod agent;
mod bridge;
pub mod cgroup;
mod chain;
mod fds;
pub mod handle;
pub mod namespace;
pub mod path;
mod process;
pub mod proto;
#[cfg(feature = "remote")]
pub mod remote;
pub mod seccomp;
mod spawn;
#[cfg(test)]
#[path = "../../server/tests/common/skip_log.rs"]
mod test_skip;
mod userns;
pub mod vm;

pub use chain::Chain;
pub use handle::{CallError, Ended, Event, Keep, OutboundFn, ParkError, Parked, Resumed, Sandbox};
pub use namespace::{AgentCommand, Namespace};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use tokio::sync::mpsc;

/// This crate's version, reported in receipts.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The identity of the sources the agent is built from (a hash made by build.rs): the server
/// and a standalone `coderoom-agent` built together say the same.
pub const AGENT_BUILD: &str = env!("CODEROOM_AGENT_BUILD");

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

impl Tier {
    /// The tier's name as the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Auto => "auto",
            Tier::Namespace => "namespace",
            Tier::Microvm => "microvm",
            Tier::None => "none",
        }
    }
}

/// Resource limits of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory, including the workspace tmpfs and `/tmp`, in bytes.
    pub memory_bytes: u64,
    /// Processes and threads at once.
    pub pids: u64,
    /// CPU time per wall second, in thousandths of a core.
    pub cpu_millis: u64,
    /// Workspace size in bytes (the disk quota).
    pub workspace_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 1 << 30,
            pids: 512,
            cpu_millis: 1000,
            workspace_bytes: 512 << 20,
        }
    }
}

/// What a sandbox was started with, recorded in the audit log with every transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// `namespace` or `microvm`.
    pub tier: String,
    /// Implementation and versions.
    pub implementation: String,
    /// Every mount inside, with its mode and source.
    pub mounts: Vec<String>,
    /// The limits applied.
    pub limits: Limits,
    /// Network policy.
    pub network: String,
    /// The syscall filter.
    pub seccomp: String,
    /// How memory, pids and CPU are limited.
    pub cgroups: String,
    /// Host uid the sandbox's processes run as.
    pub host_uid: u32,
    /// The microVM tier: the VMM, the guest kernel and the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<vm::VmReceipt>,
    /// The sandbox host it runs on (its `--id`), when not in the room server's process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Where the start's time went (the namespace tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartTimes>,
}

/// Where a namespace sandbox's start went, in microseconds (docs/benchmarks.md, "Sandbox cold
/// start", sets them beside plain bubblewrap's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StartTimes {
    /// Before bubblewrap runs: the cgroups made, `/etc` planned, the user namespace made.
    pub prepare_us: u64,
    /// Spawning bubblewrap: the fork, joining the cgroups, the exec.
    pub spawn_us: u64,
    /// From bubblewrap's exec to the agent's first answer: the namespaces, the mounts, the
    /// seccomp filter, the agent's start and one round trip.
    pub agent_us: u64,
}

impl StartTimes {
    /// The whole start, from asking to the agent's first answer.
    pub fn total_us(&self) -> u64 {
        self.prepare_us + self.spawn_us + self.agent_us
    }
}

/// Why a sandbox could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// This host cannot run the tier.
    #[error("the sandbox tier is unavailable: {0}")]
    Unavailable(String),
    /// The request was malformed.
    #[error("{0}")]
    Invalid(&'static str),
    /// The host refused a step (cgroup, socket, spawn).
    #[error("the host refused to start the sandbox")]
    Host(#[source] std::io::Error),
    /// It started but its agent never answered.
    #[error("the sandbox did not become ready: {0}")]
    NotReady(String),
}

/// The backend chosen for this server.
#[derive(Debug)]
pub enum Backend {
    /// Linux namespaces through bubblewrap.
    Namespace(Box<Namespace>),
    /// A microVM per sandbox.
    Microvm(Box<vm::Microvm>),
    /// Sandboxes on sandbox hosts of their own (`coderoom sandbox-host`).
    #[cfg(feature = "remote")]
    Remote(Box<remote::Hosts>),
    /// No sandbox; the reason is shown to clients.
    None(String),
}

/// A started sandbox: its handle, its events and its receipt.
pub type Started = (Sandbox, mpsc::Receiver<Event>, Receipt);

/// A start under way in some tier (boxed, so that [`TierBackend`] can be used as a trait object).
pub(crate) type Starting<'a> =
    Pin<Box<dyn Future<Output = Result<Started, StartError>> + Send + 'a>>;

/// What each tier that runs sandboxes offers [`Backend`], which hands every lifecycle call to
/// the one in use rather than spelling each call out per tier.
pub(crate) trait TierBackend: Send + Sync {
    /// The tier its sandboxes run in.
    fn tier(&self) -> Tier;

    /// Starts a sandbox named `name` with `limits`, from what a park kept under `tag` where the
    /// tier keeps anything and it still fits; else afresh (see [`Backend::resume`]).
    fn resume<'a>(
        &'a self,
        name: &'a str,
        limits: &'a Limits,
        tag: Option<&'a str>,
    ) -> Starting<'a>;

    /// Whether a stopped sandbox `name` left something to resume from. The namespace tier
    /// keeps nothing.
    fn has_kept(&self, _name: &str) -> bool {
        false
    }
}

impl Backend {
    /// Chooses the backend for `tier`; returns it with a sentence saying what was chosen and
    /// why. `auto` prefers a microVM that boots a real guest to its agent here (see
    /// [`vm::choose`]), then namespaces, then none.
    pub async fn select(
        tier: Tier,
        agent: AgentCommand,
        rootfs: Option<PathBuf>,
        vms: &vm::VmConfig,
    ) -> (Backend, String) {
        match tier {
            Tier::None => (
                Backend::None("sandboxes are disabled (--sandbox-tier none)".into()),
                "sandbox tier none: chosen by configuration".into(),
            ),
            Tier::Microvm => match vm::choose(vms, false).await {
                Ok((m, why)) => (
                    Backend::Microvm(Box::new(m)),
                    format!("sandbox tier microvm: {why}"),
                ),
                Err(why) => {
                    let why = Chain(&why);
                    (
                        Backend::None(format!("the microVM tier is unavailable: {why}")),
                        format!("sandbox tier none: the microVM tier is unavailable: {why}"),
                    )
                }
            },
            Tier::Namespace | Tier::Auto => {
                let why = if tier == Tier::Auto {
                    match vm::choose(vms, true).await {
                        Ok((m, why)) => {
                            return (
                                Backend::Microvm(Box::new(m)),
                                format!("sandbox tier microvm: {why}"),
                            )
                        }
                        Err(why) => format!("no microVM ({})", Chain(&why)),
                    }
                } else {
                    "chosen by configuration".to_owned()
                };
                Self::namespace_because(&why, agent, rootfs)
            }
        }
    }

    /// The namespace tier, chosen by configuration (what `--sandbox-tier namespace` gets).
    pub fn namespace(agent: AgentCommand, rootfs: Option<PathBuf>) -> (Backend, String) {
        Self::namespace_because("chosen by configuration", agent, rootfs)
    }

    fn namespace_because(
        why: &str,
        agent: AgentCommand,
        rootfs: Option<PathBuf>,
    ) -> (Backend, String) {
        match Namespace::new(agent, rootfs) {
            Ok(ns) => {
                let limits = limits_note(&ns);
                (
                    Backend::Namespace(Box::new(ns)),
                    format!("sandbox tier namespace: {why}; {limits}"),
                )
            }
            Err(e) => (
                Backend::None(e.to_string()),
                format!("sandbox tier none: {why}; namespace tier: {e}"),
            ),
        }
    }

    /// The tier that runs this backend's sandboxes, or why there is none.
    fn tiered(&self) -> Result<&dyn TierBackend, &str> {
        match self {
            Backend::Namespace(ns) => Ok(&**ns),
            Backend::Microvm(vm) => Ok(&**vm),
            #[cfg(feature = "remote")]
            Backend::Remote(hosts) => Ok(&**hosts),
            Backend::None(why) => Err(why),
        }
    }

    /// The tier in use.
    pub fn tier(&self) -> Tier {
        self.tiered().map_or(Tier::None, |t| t.tier())
    }

    /// Starts a sandbox named `name` with `limits`.
    pub async fn start(&self, name: &str, limits: &Limits) -> Result<Started, StartError> {
        self.resume(name, limits, None).await
    }

    /// Starts a sandbox named `name` from what [`Sandbox::park`] kept under `tag`, where the
    /// backend keeps anything (the microVM tier) and it still fits; else as [`Backend::start`].
    /// [`Sandbox::resumed`] says which.
    pub async fn resume(
        &self,
        name: &str,
        limits: &Limits,
        tag: Option<&str>,
    ) -> Result<Started, StartError> {
        let tier = self
            .tiered()
            .map_err(|why| StartError::Unavailable(why.to_owned()))?;
        tier.resume(name, limits, tag).await
    }

    /// Whether a stopped sandbox `name` left something to resume from.
    pub fn has_kept(&self, name: &str) -> bool {
        self.tiered().is_ok_and(|t| t.has_kept(name))
    }
}

fn limits_note(ns: &Namespace) -> String {
    match ns.cgroups() {
        Ok(l) => format!("limits through {}", l.name()),
        Err(why) => format!("cgroup limits unavailable ({}); rlimits only", Chain(why)),
    }
}

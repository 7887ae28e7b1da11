//! The application layer: every room operation, whichever door asks for it.
//!
//! A door (the REST handlers, the document and terminal sockets, MCP, and any door added
//! later) parses its input, names who acts ([`Actor`]), calls one operation here and renders
//! what comes back in its own protocol. The operation is the one place that loads the room's
//! state, decides (`coderoom_authz::decide`), asks for an approval or charges a budget where
//! the policy says so, performs the work through the mechanisms (rooms, terminal, sandboxes,
//! storage) and records one typed audit entry ([`record::Entry`]), in the same transaction as
//! the change where there is one. So a policy is written once, and a new door cannot forget
//! one: it has nothing to decide.
//!
//! The layer imports the domain and what is below it; the edge imports the layer; nothing here
//! imports the edge (`server/tests/layers.rs`).

pub(crate) mod access;
pub(crate) mod actor;
pub(crate) mod admin;
pub(crate) mod agents;
pub(crate) mod approvals;
pub(crate) mod checkpoints;
pub(crate) mod commands;
pub(crate) mod counted;
pub(crate) mod deletion;
pub(crate) mod egress;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod export;
pub(crate) mod files;
pub(crate) mod moderation;
pub(crate) mod previews;
pub(crate) mod record;
pub(crate) mod repositories;
pub(crate) mod rights;
pub(crate) mod rooms;
pub(crate) mod sandbox;
pub(crate) mod secrets;
pub(crate) mod spend;
pub(crate) mod trash;
pub(crate) mod typing;

pub(crate) use actor::Actor;
pub(crate) use error::OpError;

use crate::audit::Audit;
use crate::clock::Clock;
use crate::sandbox::Sandboxes;
use crate::spend::Spend;
use crate::store::Store;
use std::sync::Arc;

/// Announcements of ended sessions and changed rights a socket may lag behind before it
/// looks its state up again.
const EVENTS_QUEUE: usize = 256;

/// What an operation that may need someone's approval came to.
#[derive(Debug)]
pub(crate) enum Outcome<T> {
    /// Done; here is its result.
    Done(T),
    /// Waiting for an approval: its id. Nothing was performed.
    Pending(String),
}

/// What the layer is built over: the mechanisms and the server's settings.
pub(crate) struct Parts {
    pub(crate) clock: Clock,
    pub(crate) store: Store,
    pub(crate) audit: Audit,
    pub(crate) sandboxes: Sandboxes,
    pub(crate) spend: Spend,
    pub(crate) egress: crate::egress::Egress,
    pub(crate) rooms: crate::room::Rooms,
    pub(crate) vault: Arc<crate::secrets::Vault>,
    pub(crate) mailer: crate::accounts::mail::Mailer,
    pub(crate) admin_emails: Arc<Vec<String>>,
    pub(crate) public_origin: String,
    pub(crate) server: crate::store::ServerId,
    pub(crate) data_dir: std::path::PathBuf,
    pub(crate) limits: Arc<crate::config::Limits>,
}

/// The application layer's handles on the mechanisms. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Ops {
    pub(crate) clock: Clock,
    pub(crate) store: Store,
    pub(crate) audit: Audit,
    pub(crate) sandboxes: Sandboxes,
    pub(crate) spend: Spend,
    /// The egress proxy (policies, counters).
    pub(crate) egress: crate::egress::Egress,
    /// Who has each room open now (moderated rooms ask).
    pub(crate) present: moderation::Present,
    /// System admins, by canonical email.
    pub(crate) admin_emails: Arc<Vec<String>>,
    /// Seals room secrets.
    pub(crate) vault: Arc<crate::secrets::Vault>,
    /// The rooms loaded here (rights changes reach their sockets).
    pub(crate) rooms: crate::room::Rooms,
    /// This server, as room leases name it (it does not act twice on its own announcements).
    pub(crate) server: crate::store::ServerId,
    /// Sessions that just ended (logout, revocation): their open sockets close.
    pub(crate) sessions_ended: tokio::sync::broadcast::Sender<events::SessionEnded>,
    /// Whose rights in which room just changed: open terminals look them up again.
    pub(crate) access_changed: tokio::sync::broadcast::Sender<events::AccessChanged>,
    /// The sessions of the sockets open here (scale-out's catch-up looks them up).
    pub(crate) open_sessions: events::OpenSessions,
    /// One checkpoint operation (make, prune, restore, fork, a repository's import or push)
    /// at a time per room, and none while the room is being deleted.
    room_locks: Arc<
        std::sync::Mutex<
            std::collections::HashMap<crate::ids::RoomId, Arc<tokio::sync::Mutex<()>>>,
        >,
    >,
    /// One deletion run at a time.
    pub(crate) deletions: Arc<tokio::sync::Mutex<()>>,
    /// Local state (`--data-dir`): checkpoints, recordings, repositories, VM disks.
    pub(crate) data_dir: std::path::PathBuf,
    /// The server's bounds (document sizes, the checkpoint schedule's floor, ...).
    pub(crate) limits: Arc<crate::config::Limits>,
    /// Mail to people (approvers told of what waits for them).
    pub(crate) mailer: crate::accounts::mail::Mailer,
    /// `scheme://host[:port]` of `--public-url`, for links in mail.
    pub(crate) public_origin: String,
}

impl Ops {
    /// The layer over the mechanisms in `parts`; its own state (who is present, the open
    /// sessions, the announcements, the per-room and deletion locks) starts empty.
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            clock,
            store,
            audit,
            sandboxes,
            spend,
            egress,
            rooms,
            vault,
            mailer,
            admin_emails,
            public_origin,
            server,
            data_dir,
            limits,
        } = parts;
        Ops {
            clock,
            store,
            audit,
            sandboxes,
            spend,
            egress,
            present: moderation::Present::default(),
            admin_emails,
            vault,
            mailer,
            public_origin,
            rooms,
            server,
            // Bounded: a socket that falls this far behind looks its rights up again.
            sessions_ended: tokio::sync::broadcast::channel(EVENTS_QUEUE).0,
            access_changed: tokio::sync::broadcast::channel(EVENTS_QUEUE).0,
            open_sessions: events::OpenSessions::default(),
            room_locks: Arc::default(),
            deletions: Arc::default(),
            data_dir,
            limits,
        }
    }

    /// The room's checkpoint lock (see [`Ops`]'s `room_locks`): a prune never removes a
    /// checkpoint a restore or a fork is reading.
    pub(crate) fn room_lock(&self, room_id: &crate::ids::RoomId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.room_locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(room_id.clone()).or_default().clone()
    }

    /// The time every decision is made at.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}

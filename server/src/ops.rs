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

pub(crate) mod actor;
pub(crate) mod approvals;
pub(crate) mod commands;
pub(crate) mod counted;
pub(crate) mod egress;
pub(crate) mod error;
pub(crate) mod files;
pub(crate) mod moderation;
pub(crate) mod previews;
pub(crate) mod record;
pub(crate) mod rights;
pub(crate) mod rooms;
pub(crate) mod sandbox;
pub(crate) mod secrets;
pub(crate) mod typing;

pub(crate) use actor::Actor;
pub(crate) use error::OpError;

use crate::audit::Audit;
use crate::clock::Clock;
use crate::sandbox::Sandboxes;
use crate::spend::Spend;
use crate::store::Store;
use std::sync::Arc;

/// What an operation that may need someone's approval came to.
#[derive(Debug)]
pub(crate) enum Outcome<T> {
    /// Done; here is its result.
    Done(T),
    /// Waiting for an approval: its id. Nothing was performed.
    Pending(String),
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
    /// Mail to people (approvers told of what waits for them).
    pub(crate) mailer: crate::accounts::mail::Mailer,
    /// `scheme://host[:port]` of `--public-url`, for links in mail.
    pub(crate) public_origin: String,
}

impl Ops {
    pub(crate) fn new(
        (clock, store, audit): (Clock, Store, Audit),
        (sandboxes, spend, egress): (Sandboxes, Spend, crate::egress::Egress),
        (admin_emails, vault): (Arc<Vec<String>>, Arc<crate::secrets::Vault>),
        (mailer, public_origin): (crate::accounts::mail::Mailer, String),
    ) -> Self {
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
        }
    }

    /// The time every decision is made at.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}

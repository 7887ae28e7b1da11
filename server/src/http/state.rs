//! The state every handler shares: the domain's handles, the edge's settings.

use crate::accounts::codes::Hasher;
use crate::accounts::mail::Mailer;
use crate::accounts::proxies::TrustedProxies;
use crate::accounts::sessions::CookieConfig;
use crate::config::Limits;
use crate::metrics::Metrics;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Handlers take the whole state, or only the part they use (`State<Metrics>`, ...:
/// `FromRef` for each field); what the room operations need is the layer's (`ops`).
#[derive(Clone, axum::extract::FromRef)]
pub(crate) struct AppState {
    /// The application layer: every room operation, and the mechanisms under it.
    #[from_ref(skip)]
    pub ops: crate::ops::Ops,
    pub metrics: Metrics,
    pub limits: Arc<Limits>,
    pub shutdown: CancellationToken,
    /// Tracks room tasks and WebSocket connections, so shutdown waits for their close frames.
    pub tracker: TaskTracker,
    pub hasher: Hasher,
    pub mailer: Mailer,
    pub cookie: CookieConfig,
    /// `scheme://host[:port]` of `--public-url`: the only Origin cookie requests may carry.
    pub public_origin: String,
    pub trusted_proxies: TrustedProxies,
    /// Serialises the per-email issuance check with its record (no racing past the caps).
    #[from_ref(skip)]
    pub issuance: Arc<tokio::sync::Mutex<()>>,
    /// The preview origin's tokens, sessions and cancellations.
    #[from_ref(skip)]
    pub previews: Arc<crate::http::previews::Previews>,
    /// The E2B door's sessions (a caller's "sandbox" in a room).
    #[from_ref(skip)]
    pub e2b: Arc<crate::http::e2b::Sessions>,
    /// The E2B door's running commands, by the pid it gave them.
    #[from_ref(skip)]
    pub e2b_running: Arc<crate::http::e2b::Running>,
    /// E2B directory watchers (the sync SDK's), by id.
    #[from_ref(skip)]
    pub e2b_watchers: Arc<crate::http::e2b::Watchers>,
    /// E2B code interpreters, by room, user and context.
    #[from_ref(skip)]
    pub e2b_kernels: Arc<crate::http::e2b::Kernels>,
}

//! The state every handler shares: the domain's handles, the edge's settings.

use crate::accounts::codes::Hasher;
use crate::accounts::mail::Mailer;
use crate::accounts::proxies::TrustedProxies;
use crate::accounts::sessions::CookieConfig;
use crate::audit::Audit;
use crate::config::Limits;
use crate::metrics::Metrics;
use crate::room::Rooms;
use crate::sandbox::Sandboxes;
use crate::store::Store;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Handlers take the whole state, or only the part they use (`State<Store>`,
/// `State<Metrics>`, ...: `FromRef` for each field).
#[derive(Clone, axum::extract::FromRef)]
pub(crate) struct AppState {
    /// The application layer: every room operation goes through it.
    #[from_ref(skip)]
    pub ops: crate::ops::Ops,
    /// The time of day every decision is made at.
    pub clock: crate::clock::Clock,
    pub store: Store,
    pub rooms: Rooms,
    pub metrics: Metrics,
    pub limits: Arc<Limits>,
    pub shutdown: CancellationToken,
    /// Tracks room tasks and WebSocket connections, so shutdown waits for their close frames.
    pub tracker: TaskTracker,
    pub hasher: Hasher,
    pub audit: Audit,
    pub mailer: Mailer,
    pub cookie: CookieConfig,
    /// `scheme://host[:port]` of `--public-url`: the only Origin cookie requests may carry.
    pub public_origin: String,
    pub admin_emails: Arc<Vec<String>>,
    pub trusted_proxies: TrustedProxies,
    pub data_dir: std::path::PathBuf,
    /// This server, as room leases name it (scale-out).
    pub server: crate::store::ServerId,
    /// Serialises the per-email issuance check with its record (no racing past the caps).
    #[from_ref(skip)]
    pub issuance: Arc<tokio::sync::Mutex<()>>,
    /// Every room's sandbox supervisor.
    pub sandboxes: Sandboxes,
    /// The egress proxy (policy views, counters).
    #[from_ref(skip)]
    pub egress: crate::egress::Egress,
    /// Meters and budgets.
    #[from_ref(skip)]
    pub spend: crate::spend::Spend,
    /// The preview origin's tokens, sessions and cancellations.
    #[from_ref(skip)]
    pub previews: Arc<crate::http::previews::Previews>,
}

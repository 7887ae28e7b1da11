//! The server: shared state, routes, and the serve loop with graceful shutdown.

use crate::config::{Limits, ServeArgs};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::room::RoomDeps;
use crate::rooms::Rooms;
use crate::store::Store;
use crate::{access, api, approvals, deletion, login, sandbox_api, terminal, web, ws};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Largest JSON body the API accepts.
const MAX_API_BODY: usize = 64 << 10;

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub rooms: Rooms,
    pub metrics: Metrics,
    pub limits: Arc<Limits>,
    pub shutdown: CancellationToken,
    /// Tracks room tasks and WebSocket connections, so shutdown waits for their close frames.
    pub tracker: TaskTracker,
    pub hasher: crate::login::Hasher,
    pub audit: crate::audit::Audit,
    pub mailer: crate::mail::Mailer,
    pub cookie: crate::auth::CookieConfig,
    /// `scheme://host[:port]` of `--public-url`: the only Origin cookie requests may carry.
    pub public_origin: String,
    pub admin_emails: Arc<Vec<String>>,
    pub trusted_proxies: crate::ratelimit::TrustedProxies,
    pub data_dir: std::path::PathBuf,
    /// Serialises the per-email issuance check with its record (no racing past the caps).
    pub issuance: Arc<tokio::sync::Mutex<()>>,
    /// One deletion run at a time.
    pub deletions: Arc<tokio::sync::Mutex<()>>,
    /// Hashes of sessions that just ended (logout): their open sockets close.
    pub sessions_ended: tokio::sync::broadcast::Sender<String>,
    /// `(room, user)` whose rights just changed: open terminals look them up again.
    pub access_changed: tokio::sync::broadcast::Sender<(String, String)>,
    /// Every room's sandbox supervisor.
    pub sandboxes: crate::sandbox::Sandboxes,
}

pub fn router(state: AppState) -> Router {
    let limits = &state.limits;
    let governor = tower_governor::governor::GovernorConfigBuilder::default()
        .key_extractor(crate::ratelimit::ClientIpKey(state.trusted_proxies.clone()))
        .period(std::time::Duration::from_millis(
            limits.auth_replenish_ms.max(1),
        ))
        .burst_size(limits.auth_burst.max(1))
        .finish()
        .map(Arc::new);
    let mut auth = Router::new()
        .route("/api/auth/code", post(login::request_code))
        .route("/api/auth/verify", post(login::verify_code))
        .route("/api/auth/logout", post(login::logout));
    if let Some(config) = governor {
        // Forget idle client keys, so distinct addresses cannot grow the limiter without bound.
        let limiter = config.limiter().clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                limiter.retain_recent();
                limiter.shrink_to_fit();
            }
        });
        // Refused before any handler (so before any argon2 work) runs.
        auth = auth.layer(
            tower_governor::GovernorLayer::new(config)
                .error_handler(|_| ApiError::TooMany.into_response()),
        );
    }
    Router::new()
        .merge(auth)
        .route("/api/me", get(login::me))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/api/rooms", get(api::list_rooms).post(api::create_room))
        .route(
            "/api/rooms/{id}",
            get(api::get_room).delete(deletion::request),
        )
        .route("/api/deletions/{id}/confirm", post(deletion::confirm))
        .route("/api/deletions/{id}", get(deletion::get))
        .route("/api/rooms/{id}/invites", post(access::create_invite))
        .route("/api/invites/{token}/accept", post(access::accept_invite))
        .route(
            "/api/invites/{token}",
            axum::routing::delete(access::revoke_invite),
        )
        .route(
            "/api/rooms/{id}/participants/{user_id}",
            axum::routing::patch(access::change_participant).delete(access::remove_participant),
        )
        .route("/api/rooms/{id}/audit", get(access::room_audit))
        .route("/api/rooms/{id}/exports", post(approvals::export))
        .route("/api/rooms/{id}/approvals", get(approvals::list))
        .route(
            "/api/rooms/{id}/approvals/{approval_id}/decision",
            post(approvals::decide_request),
        )
        .route("/api/rooms/{id}/doc", get(ws::doc_socket))
        .route("/api/rooms/{id}/terminal", get(terminal::terminal_socket))
        .route(
            "/api/rooms/{id}/terminal/recording",
            get(terminal::recording),
        )
        .route(
            "/api/rooms/{id}/terminal/recording/inputs",
            get(terminal::recording_inputs),
        )
        .route("/api/rooms/{id}/exec", post(sandbox_api::exec))
        .route("/api/rooms/{id}/sandbox", get(sandbox_api::status))
        .route("/api/rooms/{id}/sandbox/stop", post(sandbox_api::stop))
        .route("/api/rooms/{id}/sandbox/start", post(sandbox_api::start))
        .layer(DefaultBodyLimit::max(MAX_API_BODY))
        // File contents are bigger than API bodies.
        .merge(
            Router::new()
                .route(
                    "/api/rooms/{id}/files/{*path}",
                    get(sandbox_api::read_file)
                        .put(sandbox_api::write_file)
                        .delete(sandbox_api::remove_file),
                )
                .layer(DefaultBodyLimit::max(sandbox_api::MAX_FILE_BYTES as usize)),
        )
        // The client's assets (a megabyte of JavaScript) go out gzipped to browsers that ask.
        .fallback_service(tower_http::compression::Compression::new(
            axum::handler::Handler::with_state(web::fallback, state.clone()),
        ))
        .with_state(state)
}

async fn healthz(State(app): State<AppState>) -> impl IntoResponse {
    match app.store.ping().await {
        Ok(()) => (StatusCode::OK, "ok\n"),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database does not answer");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n")
        }
    }
}

async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
}

/// Runs `coderoom serve` until SIGTERM or SIGINT; then stops accepting, flushes every room and
/// returns.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    warn_unbuilt(&args);
    let store = Store::connect(&args.storage.database_url()).await?;
    store.migrate().await?;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let metrics = Metrics::new();
    let limits = Arc::new(args.limits.clone());
    let metrics_for_hasher = metrics.clone();
    let audit = crate::audit::Audit::new(store.clone(), &args.storage.data_dir);
    let rooms = Rooms::new(
        RoomDeps {
            store: store.clone(),
            audit: audit.clone(),
            tracker: tracker.clone(),
            metrics: metrics.clone(),
            limits: limits.clone(),
            shutdown: shutdown.clone(),
        },
        tracker.clone(),
    );
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let public_origin = public_origin(args.public_url.as_deref(), addr)?;
    let host = public_origin.split("://").nth(1).unwrap_or("localhost");
    let host = host.split(':').next().unwrap_or("localhost");
    let domain = if host.contains('.') && host.parse::<std::net::IpAddr>().is_err() {
        host
    } else {
        "localhost.localdomain"
    };
    let from = format!("Coderoom <noreply@{domain}>")
        .parse()
        .map_err(|_| anyhow::anyhow!("cannot build a sender address from --public-url"))?;
    let mailer = crate::mail::Mailer::start(
        args.smtp_url.as_deref(),
        args.storage.data_dir.join("outbox"),
        from,
        &tracker,
        shutdown.clone(),
    )?;
    let permits = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sandboxes = sandboxes(&args, &store, &audit, &rooms, &shutdown)?;
    let admin_emails = args
        .admin_emails
        .iter()
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            crate::email::canonicalize(e)
                .map_err(|_| anyhow::anyhow!("invalid --admin-emails entry {e:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let state = AppState {
        store: store.clone(),
        rooms,
        metrics,
        limits,
        shutdown: shutdown.clone(),
        tracker: tracker.clone(),
        hasher: crate::login::Hasher::new(permits, metrics_for_hasher),
        audit,
        mailer,
        cookie: crate::auth::CookieConfig::for_origin(&public_origin),
        public_origin,
        admin_emails: Arc::new(admin_emails),
        trusted_proxies: crate::ratelimit::TrustedProxies::parse(&args.trusted_proxies)?,
        data_dir: args.storage.data_dir.clone(),
        sessions_ended: tokio::sync::broadcast::channel(256).0,
        access_changed: tokio::sync::broadcast::channel(256).0,
        sandboxes: sandboxes.clone(),
        issuance: Arc::default(),
        deletions: Arc::default(),
    };
    // Deletions a crash interrupted are finished before anything else touches those rooms.
    deletion::resume(&state).await?;
    sandboxes.start_idle_scheduler();
    // Tests and scripts read this exact line to find the port.
    println!("listening on http://{addr}");
    tracing::info!(%addr, backend = ?store.backend(), "serving");

    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: flushing rooms");
        signal.cancel();
    });
    let graceful = shutdown.clone();
    // Keystrokes are tiny frames: without TCP_NODELAY, Nagle's algorithm holds a broadcast back
    // until the previous one is acknowledged, which with delayed ACKs adds ~40 ms at the tail.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(
        listener,
        router(state).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move { graceful.cancelled().await })
    .await?;
    // Every running sandbox is snapshotted (its idle timer survives in the database).
    sandboxes.suspend_all().await;
    tracker.close();
    tracker.wait().await;
    store.close().await;
    tracing::info!("shutdown complete");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Flags of the public contract whose features later work fills in: accepted now so scripts
/// written against the contract start, and said out loud so nobody believes they act.
fn warn_unbuilt(args: &ServeArgs) {
    let set: [(&str, bool); 3] = [
        (
            "--cloud-hypervisor-bin",
            args.cloud_hypervisor_bin.is_some(),
        ),
        ("--preview-url", args.preview_url.is_some()),
        ("--secret-key-file", args.secret_key_file.is_some()),
    ];
    for (flag, given) in set {
        if given {
            tracing::warn!(flag, "flag accepted but its feature is not built yet");
        }
    }
}

/// Picks the sandbox backend and says what it chose and why.
fn sandboxes(
    args: &ServeArgs,
    store: &Store,
    audit: &crate::audit::Audit,
    rooms: &Rooms,
    shutdown: &CancellationToken,
) -> anyhow::Result<crate::sandbox::Sandboxes> {
    use coderoom_sandbox::{AgentCommand, Backend, Tier};
    let tier = match args.sandbox_tier.as_str() {
        "auto" => Tier::Auto,
        "namespace" => Tier::Namespace,
        "microvm" => Tier::Microvm,
        "none" => Tier::None,
        other => {
            anyhow::bail!("--sandbox-tier must be auto, namespace, microvm or none, not {other:?}")
        }
    };
    // The server binary is also the guest agent (`coderoom agent`), bound read-only inside.
    let agent = AgentCommand {
        exe: std::env::current_exe()?,
        args: vec!["agent".into()],
    };
    let (backend, why) = Backend::select(tier, agent, args.sandbox_rootfs.clone());
    if tier != Tier::Auto && backend.tier() != tier {
        anyhow::bail!("{why}");
    }
    tracing::info!(requested = %args.sandbox_tier, vmm = %args.vmm, "{why}");
    Ok(crate::sandbox::Sandboxes::new(
        backend,
        why,
        crate::sandbox::Deps {
            rooms: rooms.clone(),
            limits: Arc::new(args.limits.clone()),
            store: store.clone(),
            audit: audit.clone(),
            data_dir: args.storage.data_dir.clone(),
            cfg: Arc::new(args.sandbox.clone()),
            shutdown: shutdown.clone(),
        },
    ))
}

/// `scheme://host[:port]` of the public URL, or of the bound address when none is given.
fn public_origin(public_url: Option<&str>, bound: std::net::SocketAddr) -> anyhow::Result<String> {
    let Some(url) = public_url else {
        return Ok(format!("http://{bound}"));
    };
    let (scheme, rest) = url
        .split_once("://")
        .filter(|(s, _)| *s == "http" || *s == "https")
        .ok_or_else(|| anyhow::anyhow!("--public-url must start with http:// or https://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') {
        anyhow::bail!("--public-url must name a host (and no credentials)");
    }
    Ok(format!("{scheme}://{}", authority.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::public_origin;

    #[test]
    fn origins() {
        let bound = "127.0.0.1:9000".parse().unwrap();
        assert_eq!(public_origin(None, bound).unwrap(), "http://127.0.0.1:9000");
        assert_eq!(
            public_origin(Some("https://Rooms.Example.com/app/"), bound).unwrap(),
            "https://rooms.example.com"
        );
        assert!(public_origin(Some("ftp://x"), bound).is_err());
        assert!(public_origin(Some("https://u:p@x"), bound).is_err());
    }
}

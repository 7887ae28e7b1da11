//! The server: shared state, routes, and the serve loop with graceful shutdown.

use crate::config::{Limits, ServeArgs};
use crate::metrics::Metrics;
use crate::room::RoomDeps;
use crate::rooms::Rooms;
use crate::store::Store;
use crate::{api, ws};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
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
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/api/rooms", get(api::list_rooms).post(api::create_room))
        .route("/api/rooms/{id}", get(api::get_room))
        .route("/api/rooms/{id}/doc", get(ws::doc_socket))
        .layer(DefaultBodyLimit::max(MAX_API_BODY))
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
    let rooms = Rooms::new(
        RoomDeps {
            store: store.clone(),
            metrics: metrics.clone(),
            limits: limits.clone(),
            shutdown: shutdown.clone(),
        },
        tracker.clone(),
    );
    let state = AppState {
        store: store.clone(),
        rooms,
        metrics,
        limits,
        shutdown: shutdown.clone(),
        tracker: tracker.clone(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
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
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { graceful.cancelled().await })
        .await?;
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
    let set: [(&str, bool); 8] = [
        ("--smtp-url", args.smtp_url.is_some()),
        ("--admin-emails", !args.admin_emails.is_empty()),
        (
            "--cloud-hypervisor-bin",
            args.cloud_hypervisor_bin.is_some(),
        ),
        ("--sandbox-rootfs", args.sandbox_rootfs.is_some()),
        ("--preview-url", args.preview_url.is_some()),
        ("--trusted-proxies", !args.trusted_proxies.is_empty()),
        ("--secret-key-file", args.secret_key_file.is_some()),
        ("--public-url", args.public_url.is_some()),
    ];
    for (flag, given) in set {
        if given {
            tracing::warn!(flag, "flag accepted but its feature is not built yet");
        }
    }
    tracing::info!(
        requested = %args.sandbox_tier,
        vmm = %args.vmm,
        "sandbox tier: none (no sandbox backend is built yet; terminal and exec are unavailable)"
    );
}

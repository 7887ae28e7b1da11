//! `coderoom serve`: builds the domain and the edge, serves until a signal, then shuts down
//! gracefully.

use crate::config::ServeArgs;
use crate::http::{router, AppState};
use crate::metrics::Metrics;
use crate::room::{RoomDeps, Rooms};
use crate::store::Store;
use axum::serve::ListenerExt;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Runs `coderoom serve` until SIGTERM or SIGINT; then stops accepting, flushes every room and
/// returns.
pub(crate) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::http::listener::raise_open_file_limit();
    crate::fault::announce();
    let store = Store::connect_with(&args.storage.database_url(), args.store_options()).await?;
    store.migrate().await?;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let metrics = Metrics::new();
    store.observe_log(crate::store::LogTimes {
        wait: metrics.stage_log_wait.clone(),
        write: metrics.stage_log_write.clone(),
        checkpoint: metrics.stage_log_checkpoint.clone(),
    });
    let limits = Arc::new(args.limits.clone());
    let metrics_for_hasher = metrics.clone();
    let metrics_for_listener = metrics.clone();
    // The one clock of the server: rights, timers, audit records and recordings read it.
    let clock = crate::clock::Clock::system();
    let audit = crate::audit::Audit::new(store.clone(), &args.storage.data_dir, clock.clone());
    // Every chain's head, anchored at start (and again at a graceful stop). A failure is loud
    // but does not keep the server down: the chains and their checkpoint still guard the log.
    let anchor_file = args.audit_anchor_file.clone();
    if let Err(e) = audit.anchor(anchor_file.as_deref()).await {
        tracing::error!(error = %e, "cannot anchor the audit chain heads at start");
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    // On PostgreSQL other servers may forward here: they must be able to reach this one.
    anyhow::ensure!(
        store.backend() != crate::store::Backend::Postgres
            || !addr.ip().is_unspecified()
            || args.internal_url.is_some(),
        "--listen is a wildcard address ({addr}) and the database is PostgreSQL, which other \
         servers may share: set --internal-url to the address they reach this one at"
    );
    let server = server_id(
        &args.storage.data_dir,
        args.server_id.as_deref(),
        args.internal_url.as_deref(),
        addr,
    )
    .await?;
    tracing::info!(server = %server.id, internal_url = %server.address, "server identity for room leases");
    // Downloads a crash left half-written (each one is removed once sent).
    let _ = tokio::fs::remove_dir_all(crate::ops::export::exports_dir(
        &args.storage.data_dir,
        &server.id,
    ))
    .await;
    // Participants' file operations, which the rooms read off their updates, journaled by the
    // application layer (started below, once it exists).
    let (journal, journaled) = crate::room::journal::Journal::new();
    let rooms = Rooms::new(
        RoomDeps {
            store: store.clone(),
            audit: audit.clone(),
            tracker: tracker.clone(),
            metrics: metrics.clone(),
            limits: limits.clone(),
            shutdown: shutdown.clone(),
            clock: clock.clone(),
            server: server.clone(),
            lease_ms: args.room_lease_ms,
            journal: Some(journal.clone()),
        },
        tracker.clone(),
    );
    let public_origin = public_origin(args.public_url.as_deref(), addr)?;
    // The preview origin: its own listener, on another host than the app.
    let (preview_origin, preview_listener) = match &args.preview_url {
        Some(url) => {
            let origin = crate::http::previews::PreviewOrigin::parse(url, &public_origin)?;
            let bind = match &args.preview_listen {
                Some(b) => b.clone(),
                None => format!("127.0.0.1:{}", origin.port().unwrap_or(80)),
            };
            let listener = tokio::net::TcpListener::bind(&bind)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen for previews on {bind}: {e}"))?;
            (Some(origin), Some(listener))
        }
        None => (None, None),
    };
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
    let mailer = crate::accounts::mail::Mailer::start(
        args.smtp_url.as_deref(),
        args.smtp_ca_file.as_deref(),
        args.storage.data_dir.join("outbox"),
        from,
        &tracker,
        shutdown.clone(),
    )?;
    let permits = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool_ready = metrics.sandbox_pool_ready.clone();
    // Counted, not read: start-up does not load every sealed value.
    let stored = usize::try_from(store.secret_count().await?).unwrap_or(usize::MAX);
    let vault = Arc::new(crate::secrets::Vault::open_or_create(
        &args.secret_key_path(),
        stored,
    )?);
    let extra_ca = match &args.egress_extra_ca {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            anyhow::anyhow!("cannot read --egress-extra-ca {}: {e}", path.display())
        })?),
        None => None,
    };
    // Meters and budgets: charged as work happens, written to the audit chains every
    // `--spend-flush-ms`; a budget reached is told to the room (and stops its sandbox when it
    // is the room's sandbox time).
    let (spend, reached) = crate::spend::Spend::new(store.clone(), audit.clone(), metrics.clone());
    let egress = crate::egress::Egress::new(
        (store.clone(), audit.clone(), clock.clone()),
        spend.clone(),
        resolver(&args)?,
        vault.clone(),
        crate::egress::tls::client_config(extra_ca.as_deref())?,
    );
    let sandboxes = sandboxes(
        &args,
        &server.id,
        &store,
        &audit,
        &rooms,
        (&shutdown, &clock),
        (&pool_ready, &egress, &spend),
    )
    .await?;
    let admin_emails = args
        .admin_emails
        .iter()
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            crate::accounts::email::canonicalize(e)
                .map_err(|_| anyhow::anyhow!("invalid --admin-emails entry {e:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let admin_emails = Arc::new(admin_emails);
    let ops = crate::ops::Ops::new(crate::ops::Parts {
        clock: clock.clone(),
        store: store.clone(),
        audit: audit.clone(),
        sandboxes: sandboxes.clone(),
        spend: spend.clone(),
        egress: egress.clone(),
        rooms: rooms.clone(),
        vault: vault.clone(),
        mailer: mailer.clone(),
        admin_emails: admin_emails.clone(),
        public_origin: public_origin.clone(),
        server: server.clone(),
        data_dir: args.storage.data_dir.clone(),
        limits: limits.clone(),
    });
    let e2b = Arc::new(crate::http::e2b::Sessions::for_domain(
        args.e2b_domain.as_deref(),
        &public_origin,
        preview_origin.as_ref(),
    )?);
    let state = AppState {
        ops,
        metrics,
        limits,
        shutdown: shutdown.clone(),
        tracker: tracker.clone(),
        hasher: crate::accounts::codes::Hasher::new(permits, metrics_for_hasher),
        mailer,
        cookie: crate::accounts::sessions::CookieConfig::for_origin(&public_origin),
        public_origin,
        trusted_proxies: crate::accounts::proxies::TrustedProxies::parse(&args.trusted_proxies)?,
        issuance: Arc::default(),
        previews: Arc::new(crate::http::previews::Previews::new(
            preview_origin,
            crate::http::previews::PreviewLimits {
                rate: args.preview_rate,
                bandwidth: args.preview_bandwidth,
            },
        )),
        e2b,
        e2b_running: Arc::default(),
        e2b_watchers: Arc::default(),
        e2b_kernels: Arc::default(),
    };
    crate::http::e2b::start_sweeper(state.clone());
    crate::ops::trash::start_journal(
        state.ops.clone(),
        (journal, journaled),
        &tracker,
        shutdown.clone(),
    );
    // What other servers on the same PostgreSQL announce (scale-out).
    crate::ops::events::start_listening(
        &state.ops,
        &args.storage.database_url(),
        (&tracker, &shutdown),
    );
    // Deletions a crash interrupted are finished before anything else touches those rooms.
    crate::ops::deletion::resume(&state.ops).await?;
    crate::ops::deletion::start_sweeper(
        state.ops.clone(),
        state.metrics.deletion_sweeps.clone(),
        shutdown.clone(),
    );
    sandboxes.start_idle_scheduler();
    sandboxes.start_warm_pool();
    crate::ops::checkpoints::start_scheduler(state.ops.clone(), shutdown.clone());
    if let Some(listener) = preview_listener {
        // Tests and scripts read this line to find the preview origin's port.
        println!("previews on http://{}", listener.local_addr()?);
        crate::http::previews::serve(state.clone(), listener);
    }
    let egress_window = std::time::Duration::from_millis(args.egress_audit_every_ms.max(100));
    egress.start_auditor(egress_window, shutdown.clone());
    spend.start(
        std::time::Duration::from_millis(args.spend_flush_ms.max(100)),
        shutdown.clone(),
    );
    crate::ops::spend::announce(state.ops.clone(), reached);
    state.ops.stop_units_that_lapse();
    // The handlers are in place before anyone can know where to send a signal: a SIGTERM right
    // after the line below still shuts down gracefully.
    let signals = install_signal_handlers();
    // Tests and scripts read this exact line to find the port.
    println!("listening on http://{addr}");
    tracing::info!(%addr, backend = ?store.backend(), "serving");

    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal(signals).await;
        tracing::info!("shutdown requested: flushing rooms");
        signal.cancel();
    });
    let graceful = shutdown.clone();
    // `tap_io` also gives the connection's address to `ConnectInfo` (axum provides that for
    // its own listeners and for tapped ones).
    let listener = crate::http::listener::Listener::new(listener, metrics_for_listener)
        .tap_io(crate::http::listener::no_delay);
    axum::serve(
        listener,
        router(state).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move { graceful.cancelled().await })
    .await?;
    // Every running sandbox is snapshotted (its idle timer survives in the database).
    sandboxes.suspend_all().await;
    // After the sandboxes: their last seconds are charged, then every charge is written.
    spend.stop().await;
    egress
        .flush(u64::try_from(egress_window.as_millis()).unwrap_or(u64::MAX))
        .await;
    tracker.close();
    tracker.wait().await;
    if let Err(e) = audit.anchor(anchor_file.as_deref()).await {
        tracing::error!(error = %e, "cannot anchor the audit chain heads at shutdown");
    }
    store.close().await;
    tracing::info!("shutdown complete");
    Ok(())
}

type Signals = Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>;

/// SIGTERM and SIGINT handlers, installed now (their default would kill the process).
fn install_signal_handlers() -> Signals {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => Some((term, int)),
        _ => {
            tracing::error!("cannot install signal handlers");
            None
        }
    }
}

async fn wait_for_signal(signals: Signals) {
    let Some((mut term, mut int)) = signals else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The egress proxy's resolver: the system's, or in the tests' builds the names they set.
#[cfg(feature = "egress-test-resolve")]
fn resolver(args: &ServeArgs) -> anyhow::Result<crate::egress::Resolver> {
    crate::egress::Resolver::with_overrides(&args.egress_test_resolve)
}

/// The egress proxy's resolver: the system's.
#[cfg(not(feature = "egress-test-resolve"))]
fn resolver(_: &ServeArgs) -> anyhow::Result<crate::egress::Resolver> {
    Ok(crate::egress::Resolver::default())
}

async fn sandboxes(
    args: &ServeArgs,
    server_id: &str,
    store: &Store,
    audit: &crate::audit::Audit,
    rooms: &Rooms,
    (shutdown, clock): (&CancellationToken, &crate::clock::Clock),
    (pool_ready, egress, spend): (
        &prometheus_client::metrics::gauge::Gauge,
        &crate::egress::Egress,
        &crate::spend::Spend,
    ),
) -> anyhow::Result<crate::sandbox::Sandboxes> {
    use coderoom_sandbox::{AgentCommand, Backend, Tier};
    let tier = args.sandbox_tier.tier();
    // The standalone agent beside the server when it is the same build, else the server
    // binary itself (`coderoom agent`); bound read-only inside.
    let (agent, agent_why) = AgentCommand::beside(&std::env::current_exe()?);
    tracing::info!(agent = %agent_why, "the namespace tier's agent");
    let vms = args.vm.config(&args.storage.data_dir);
    let (backend, why) = if args.sandbox_hosts.is_empty() {
        Backend::select(tier, agent, args.sandbox_rootfs.clone(), &vms).await
    } else {
        remote_backend(args, server_id, tier)?
    };
    if tier != Tier::Auto && backend.tier() != tier {
        anyhow::bail!("{why}");
    }
    tracing::info!(requested = tier.name(), vmm = ?args.vm.vmm, "{why}");
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
            clock: clock.clone(),
            pool_ready: pool_ready.clone(),
            egress: egress.clone(),
            spend: spend.clone(),
            server_id: server_id.to_owned(),
        },
    ))
}

/// Sandboxes on the sandbox hosts of `--sandbox-hosts`, reached over mutual TLS.
fn remote_backend(
    args: &ServeArgs,
    server_id: &str,
    tier: coderoom_sandbox::Tier,
) -> anyhow::Result<(coderoom_sandbox::Backend, String)> {
    use coderoom_sandbox::{remote::Hosts, Backend, Tier};
    let (Some(ca), Some(cert), Some(key)) = (
        &args.sandbox_host_ca,
        &args.sandbox_host_cert,
        &args.sandbox_host_key,
    ) else {
        anyhow::bail!(
            "--sandbox-hosts needs --sandbox-host-ca, --sandbox-host-cert and --sandbox-host-key (coderoom certs makes them)"
        );
    };
    if tier == Tier::None {
        anyhow::bail!("--sandbox-hosts with --sandbox-tier none: choose one");
    }
    for a in &args.sandbox_hosts {
        if a.rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            anyhow::bail!("--sandbox-hosts: {a:?} is not host:port");
        }
    }
    let tls = crate::sandbox::hosts::client_config(ca, cert, key)?;
    // Shown to room members: the count, not the internal addresses (logged here instead).
    tracing::info!(hosts = %args.sandbox_hosts.join(","), "sandbox hosts");
    let why = format!(
        "sandbox tier {} on {} sandbox host(s): chosen by configuration",
        tier.name(),
        args.sandbox_hosts.len()
    );
    Ok((
        Backend::Remote(Box::new(
            Hosts::new(args.sandbox_hosts.clone(), tier, tls)
                .with_records(args.storage.data_dir.join("sandbox-hosts").join(server_id)),
        )),
        why,
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

/// This server's identity in room leases, and where the others reach it (`--internal-url`,
/// else the listen address). The id is kept in `DATA_DIR/server-id` (made on first start): a
/// server restarted after a crash takes its rooms back at once instead of waiting for its own
/// leases to lapse (each claim still raises the fencing token). Servers sharing a database
/// each have their own data directory, so their own id.
async fn server_id(
    data_dir: &std::path::Path,
    given: Option<&str>,
    internal_url: Option<&str>,
    addr: std::net::SocketAddr,
) -> anyhow::Result<crate::store::ServerId> {
    let address = match internal_url {
        Some(url) => {
            let url = url.trim_end_matches('/');
            anyhow::ensure!(
                url.starts_with("http://")
                    && url.len() > "http://".len()
                    && !url[7..].contains('/'),
                "--internal-url must be http://HOST:PORT, with no path"
            );
            url.to_owned()
        }
        None if addr.ip().is_unspecified() => {
            // Enough for one server; others sharing the database could not reach it there.
            tracing::warn!(%addr, "listening on a wildcard address without --internal-url: other servers sharing this database cannot forward connections here");
            format!("http://127.0.0.1:{}", addr.port())
        }
        None => format!("http://{addr}"),
    };
    if let Some(id) = given {
        anyhow::ensure!(
            (1..=128).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
            "--server-id must be 1-128 letters, digits, '.', '_' or '-'"
        );
        return Ok(crate::store::ServerId {
            id: id.to_owned(),
            address,
        });
    }
    let file = data_dir.join("server-id");
    let id = match tokio::fs::read_to_string(&file).await {
        Ok(id) if crate::ids::IssuedId::parse(id.trim()).is_some() => id.trim().to_owned(),
        Ok(_) => anyhow::bail!(
            "{} is not a server id: remove it to make a new one",
            file.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = crate::ids::IssuedId::fresh().to_string();
            crate::sandbox::snapshots::write_durably(&file, id.as_bytes()).await?;
            id
        }
        Err(e) => return Err(e.into()),
    };
    Ok(crate::store::ServerId { id, address })
}

#[cfg(test)]
mod tests {
    use super::{public_origin, server_id};

    #[tokio::test]
    async fn a_server_keeps_its_id_and_checks_its_internal_url() {
        let dir = tempfile::tempdir().unwrap();
        let bound = "127.0.0.1:9000".parse().unwrap();
        let first = server_id(dir.path(), None, None, bound).await.unwrap();
        assert_eq!(first.address, "http://127.0.0.1:9000");
        let again = server_id(dir.path(), None, Some("http://10.0.0.5:8080/"), bound)
            .await
            .unwrap();
        assert_eq!(again.id, first.id, "restarted, it is the same owner");
        assert_eq!(again.address, "http://10.0.0.5:8080");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            server_id(other.path(), None, None, bound).await.unwrap().id,
            first.id
        );
        for bad in ["https://x:1", "http://", "http://x:1/path", "x:1"] {
            assert!(
                server_id(dir.path(), None, Some(bad), bound).await.is_err(),
                "{bad}"
            );
        }
        let named = server_id(dir.path(), Some("coderoom-7d9f-abc12"), None, bound)
            .await
            .unwrap();
        assert_eq!(named.id, "coderoom-7d9f-abc12");
        for bad in ["", "a b", "a/b", &"x".repeat(129)] {
            assert!(
                server_id(dir.path(), Some(bad), None, bound).await.is_err(),
                "{bad}"
            );
        }
        let wildcard = "0.0.0.0:9000".parse().unwrap();
        assert_eq!(
            server_id(dir.path(), None, None, wildcard)
                .await
                .unwrap()
                .address,
            "http://127.0.0.1:9000"
        );
        std::fs::write(dir.path().join("server-id"), "not an id").unwrap();
        assert!(server_id(dir.path(), None, None, bound).await.is_err());
    }

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

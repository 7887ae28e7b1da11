//! The process contract of `../shared/spec/api.md`: subcommands, flags and their env twins,
//! migrations, health.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tokio::process::Command;

#[tokio::test]
async fn every_contract_flag_has_its_env_twin() {
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "listen",
        "data-dir",
        "database-url",
        "public-url",
        "smtp-url",
        "admin-emails",
        "sandbox-tier",
        "vmm",
        "cloud-hypervisor-bin",
        "sandbox-rootfs",
        "preview-url",
        "trusted-proxies",
        "secret-key-file",
    ] {
        let env = format!("CODEROOM_{}", flag.replace('-', "_").to_uppercase());
        assert!(help.contains(&format!("--{flag}")), "missing --{flag}");
        assert!(
            help.contains(&format!("env: {env}")),
            "missing env twin {env}"
        );
    }
}

#[tokio::test]
async fn env_twin_configures_the_listen_address() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(storage.args())
        .env("CODEROOM_LISTEN", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");
    assert!(!line.ends_with(":8080"));
    child.kill().await.unwrap();
}

on_each_backend!(
    migrate_then_serve_and_health_follows_the_database,
    migrate_then_serve_and_health_follows_the_database_on
);

async fn migrate_then_serve_and_health_follows_the_database_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let (ok, text) = storage.cli(&["migrate"]).await;
    assert!(ok, "{text}");
    if matches!(backend, Backend::Sqlite) {
        assert!(storage.dir.path().join("coderoom.db").exists());
    }
    let server = Server::start(&storage, &[]).await;
    assert_eq!(
        http(&server.url("/healthz"), "GET", None, None).await.0,
        200
    );
    let metrics = http(&server.url("/metrics"), "GET", None, None).await.1;
    for name in [
        "coderoom_rooms_loaded",
        "coderoom_connections",
        "coderoom_updates_applied_total",
        "coderoom_bytes_persisted_total",
        "coderoom_persist_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "metric {name} missing");
    }
    if let Backend::Postgres(_) = backend {
        // The database goes away under the server: health says so.
        storage.drop_db().await;
        let (status, body) = http(&server.url("/healthz"), "GET", None, None).await;
        assert_eq!(status, 503, "{body}");
    }
    assert!(server.terminate().await.success());
    storage.drop_db().await;
}

#[tokio::test]
async fn bad_database_url_is_a_clear_error() {
    let out = Command::new(BIN)
        .args(["migrate", "--database-url", "mysql://nope"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sqlite:// or postgres://"), "{err}");
}

/// Enumerated flags are checked when parsed: a misspelt tier or log format stops the server
/// before it does anything, naming the values it accepts.
#[tokio::test]
async fn enumerated_flags_refuse_unknown_values() {
    for (flag, bad, accepted) in [
        ("--sandbox-tier", "namespaces", "namespace"),
        ("--log-format", "xml", "json"),
        ("--vmm", "firecracker", "cloud-hypervisor"),
    ] {
        let out = Command::new(BIN)
            .args(["serve", flag, bad])
            .output()
            .await
            .unwrap();
        assert!(!out.status.success(), "{flag} {bad} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(bad) && err.contains(accepted),
            "{flag} {bad}: {err}"
        );
    }
}

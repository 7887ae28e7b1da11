//! `coderoom bench tiers` on its short fixture, as CI runs it: every canary and check holds in
//! every tier this host runs (the namespace tier; the microVM under QEMU where a guest image
//! is built), and a sandbox broken on purpose fails the fixture.
//!
//! The full fixture and its table: `coderoom bench tiers` (docs/tiers.md).

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::PathBuf;

/// Every canary the fixture runs as room code, and the checks beside them.
const VERDICTS: &[&str] = &[
    "descriptors",
    "proc-1-mem",
    "proc-1-root",
    "data-dir",
    "server-process",
    "other-room",
    "server-port",
    "egress-proxy",
    "network-namespace",
    "read-only-base",
    "fork-bomb",
    "memory",
    "secret",
    "survives",
];
const CHECKS: &[&str] = &[
    "deletion",
    "kill -9: no orphan",
    "kill -9: rooms back",
    "clean stop",
];

/// Runs the short fixture with `args`: whether it exited 0, and its JSON report.
async fn tiers(args: &[&str]) -> (bool, Value) {
    let out = tokio::process::Command::new(BIN)
        .args(["bench", "tiers", "--short", "--json"])
        .args(args)
        .env_remove("CODEROOM_DATABASE_URL")
        // Recorded only where a test names a data directory.
        .env_remove("CODEROOM_DATA_DIR")
        .output()
        .await
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), report)
}

/// The one tier of `report`, with every verdict named, by name: (held, detail).
fn verdicts(report: &Value, tier: &str) -> std::collections::BTreeMap<String, (bool, String)> {
    let t = report["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tier"] == tier)
        .unwrap_or_else(|| panic!("no {tier} in {report:#}"));
    let f = &t["figures"];
    assert!(f.is_object(), "{tier} did not run: {}", t["reason"]);
    f["canaries"]
        .as_array()
        .unwrap()
        .iter()
        .chain(f["checks"].as_array().unwrap())
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                (
                    v["held"].as_bool().unwrap(),
                    v["detail"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

fn assert_all_held(report: &Value, tier: &str) {
    let v = verdicts(report, tier);
    for name in VERDICTS.iter().chain(CHECKS) {
        let (held, detail) = v
            .get(*name)
            .unwrap_or_else(|| panic!("{tier}: no verdict for {name}: {v:#?}"));
        assert!(held, "{tier}: {name} did not hold: {detail}");
    }
    let f = &report["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tier"] == tier)
        .unwrap()["figures"];
    // The figures were taken, not left out.
    for figure in [
        "running_command",
        "cold_first_command",
        "warm_first_command",
        "warm_running_command",
        "resume_first_command",
        "fork_first_command",
        "cpu_step",
        "file_step",
    ] {
        assert!(!f[figure].is_null(), "{tier}: no {figure}");
    }
    assert_eq!(
        f["burst"][2], 0,
        "{tier}: rooms at once failed: {}",
        f["burst"]
    );
    assert!(
        f["idle_memory"]["pss_median"].as_u64().unwrap_or(0) > 0,
        "{tier}: no memory figure: {}",
        f["idle_memory"]
    );
}

/// The receipt of the room's sandbox.
async fn receipt_of(t: &Room) -> Value {
    let (_, status) = http(
        &t.server.url(&format!("/api/rooms/{}/sandbox", t.room)),
        "GET",
        Some(&t.ana),
        None,
    )
    .await;
    serde_json::from_str::<Value>(&status).unwrap()["receipt"].clone()
}

/// Also: the run is recorded in the host's data directory, and a sandbox that server starts
/// then says in its receipt why its tier, where secrets go, what it started from, and this
/// last run of its tier's fixture.
#[tokio::test]
async fn every_canary_holds_in_the_namespace_tier() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let data_dir = storage.dir.path().to_string_lossy().into_owned();
    let (ok, report) = tiers(&["--tiers", "namespace", "--data-dir", &data_dir]).await;
    assert_all_held(&report, "namespace");
    assert!(ok, "exit status: {report:#}");
    // The namespace tier's own start, from its sandboxes' receipts, beside the bwrap floor.
    let figures = &report["tiers"][0]["figures"];
    assert!(
        figures["sandbox_start"]["median"].as_f64().unwrap_or(0.0) > 0.0,
        "no sandbox start figure: {figures}"
    );
    assert!(
        figures["start_floor"]["median"].as_f64().unwrap_or(0.0) > 0.0,
        "no floor timed beside the starts: {figures}"
    );
    assert_eq!(report["ok"], true);

    let t = team_with(&storage, &["--sandbox-tier", "namespace"]).await;
    let (_, out) = exec(&t.server, &t.ben, &t.room, "echo up").await;
    assert_eq!(out["stdout"], "up\n");
    let receipt = &receipt_of(&t).await;
    assert!(
        receipt["tier_chosen"]
            .as_str()
            .unwrap()
            .contains("namespace"),
        "{receipt:#}"
    );
    assert!(receipt["secrets"]
        .as_str()
        .unwrap()
        .contains("egress proxy"));
    assert_eq!(receipt["started_from"]["kind"], "empty", "{receipt:#}");
    let fixture = &receipt["fixture"];
    assert_eq!(fixture["tier"], "namespace", "{receipt:#}");
    assert_eq!(fixture["held"], true);
    assert_eq!(fixture["short"], true);
    assert_eq!(fixture["at"], report["at"]);
    assert_eq!(fixture["passed"], fixture["of"]);

    // Stopped (a snapshot with its hash recorded) and started again: from that snapshot.
    let (code, _) = http(
        &t.server.url(&format!("/api/rooms/{}/sandbox/stop", t.room)),
        "POST",
        Some(&t.ana),
        None,
    )
    .await;
    assert_eq!(code, 200);
    exec(&t.server, &t.ben, &t.room, "true").await;
    let from = &receipt_of(&t).await["started_from"];
    assert_eq!(from["kind"], "snapshot", "{from:#}");
    let name = from["snapshot"].as_str().unwrap();
    let archive = storage
        .dir
        .path()
        .join("rooms")
        .join(&t.room)
        .join("workspace")
        .join(name);
    let want = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(std::fs::read(&archive).unwrap()))
    };
    assert_eq!(from["sha256"], want.as_str());
}

#[tokio::test]
async fn every_canary_holds_in_the_microvm_tier_under_qemu() {
    let Some(dir) = std::env::var_os("CODEROOM_TEST_IMAGE_DIR").map(PathBuf::from) else {
        skip(
            Need::Qemu,
            "CODEROOM_TEST_IMAGE_DIR is not set (no guest image)",
        );
        return;
    };
    let dir = dir.to_string_lossy().into_owned();
    let (ok, report) = tiers(&[
        "--tiers",
        "microvm-qemu",
        "--vm-accel-tcg",
        "--image-dir",
        &dir,
    ])
    .await;
    assert_all_held(&report, "microvm-qemu");
    assert!(ok, "exit status: {report:#}");
}

/// A sandbox broken on purpose: the operator's `--sandbox-rootfs /` shows the host's whole
/// root inside, the server's data directory (under /var/tmp, not the sandbox's own /tmp)
/// among it. The data-directory canary fails, and with it the fixture's exit status.
#[tokio::test]
async fn a_sandbox_that_shows_the_host_fails_the_fixture() {
    let work = tempfile::Builder::new()
        .prefix("coderoom-tiers-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let dir = work.path().to_string_lossy().into_owned();
    let (ok, report) = tiers(&[
        "--tiers",
        "namespace",
        "--dir",
        &dir,
        "--serve-arg=--sandbox-rootfs=/",
    ])
    .await;
    let v = verdicts(&report, "namespace");
    let (held, detail) = &v["data-dir"];
    assert!(!held, "the data directory was visible, yet: {detail}");
    assert!(detail.contains(&dir), "{detail}");
    assert!(!ok, "the fixture exited 0 with a canary down");
    assert_eq!(report["ok"], false);
}

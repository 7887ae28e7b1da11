//! A room sandbox's receipt: what the tier says it gave the sandbox (`coderoom_sandbox::Receipt`:
//! implementation and versions, mounts, limits, network, syscall filter, cgroups, uid), and what
//! the room server adds, which an operator needs beside it: why this tier, where secrets go,
//! the state the sandbox started from, and the last run of the tier fixture on this host.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Where `coderoom bench tiers` records its last run, under the data directory.
pub(crate) const FIXTURE_RECORD: &str = "tiers-last.json";

/// Largest record read (one run of every tier is tens of KiB).
const MAX_RECORD_BYTES: u64 = 4 << 20;

/// How room secrets reach the outside, the same for every tier.
const SECRETS: &str = "never in the sandbox: the egress proxy, outside it, adds each secret to \
                       requests for that secret's hosts only";

/// The receipt recorded with every start, shown by `GET /api/rooms/{id}/sandbox`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RoomReceipt {
    #[serde(flatten)]
    pub(crate) sandbox: coderoom_sandbox::Receipt,
    /// Why this tier (`--sandbox-tier` and what `auto` found).
    pub(crate) tier_chosen: String,
    /// Where room secrets go.
    pub(crate) secrets: String,
    /// The workspace it started from.
    pub(crate) started_from: StartedFrom,
    /// The last fixture run on this host, for this tier.
    pub(crate) fixture: Option<FixtureRun>,
}

impl std::ops::Deref for RoomReceipt {
    type Target = coderoom_sandbox::Receipt;
    fn deref(&self) -> &Self::Target {
        &self.sandbox
    }
}

/// The workspace a sandbox started from.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct StartedFrom {
    /// `empty`, `snapshot`, or what a stopped VM kept (`kept disk`, `kept memory`; a sandbox
    /// host's sandbox attached again after a crash says how it was kept).
    pub(crate) kind: String,
    /// The snapshot restored (or that the kept state was parked with).
    pub(crate) snapshot: Option<String>,
    /// SHA-256 of the snapshot archive, as recorded when it was written (a restored
    /// checkpoint's archive is copied unchanged, so it is the checkpoint's hash too).
    pub(crate) sha256: Option<String>,
    /// Taken from the warm pool.
    pub(crate) warm_pool: bool,
}

/// The tier fixture's last run on this host, as `coderoom bench tiers` recorded it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FixtureRun {
    /// The fixture's name for the tier.
    pub(crate) tier: String,
    /// When it ran (Unix ms).
    pub(crate) at: i64,
    /// Every canary and check held.
    pub(crate) held: bool,
    /// The short (CI) fixture or the full one.
    pub(crate) short: bool,
    /// Canaries and checks that held, of how many.
    pub(crate) passed: usize,
    pub(crate) of: usize,
}

impl RoomReceipt {
    pub(crate) async fn new(
        sandbox: coderoom_sandbox::Receipt,
        tier_chosen: &str,
        started_from: StartedFrom,
        data_dir: &Path,
    ) -> RoomReceipt {
        let fixture = fixture_run(data_dir, &fixture_tier(&sandbox)).await;
        RoomReceipt {
            sandbox,
            tier_chosen: tier_chosen.to_owned(),
            secrets: SECRETS.to_owned(),
            started_from,
            fixture,
        }
    }
}

/// The fixture's name for the tier `r` ran in.
fn fixture_tier(r: &coderoom_sandbox::Receipt) -> String {
    if r.host.is_some() {
        return "sandbox-host".to_owned();
    }
    match &r.vm {
        Some(vm) => format!("microvm-{}", vm.vmm),
        None => r.tier.clone(),
    }
}

/// The record of the last fixture run for `tier`, if `coderoom bench tiers` left one in
/// `data_dir` and it ran that tier.
async fn fixture_run(data_dir: &Path, tier: &str) -> Option<FixtureRun> {
    use tokio::io::AsyncReadExt as _;
    let mut text = String::new();
    tokio::fs::File::open(data_dir.join(FIXTURE_RECORD))
        .await
        .ok()?
        .take(MAX_RECORD_BYTES)
        .read_to_string(&mut text)
        .await
        .ok()?;
    let report: serde_json::Value = serde_json::from_str(&text).ok()?;
    // Each tier's last run, with its own time (a run of other tiers keeps it).
    let t = report["tiers"]
        .as_array()?
        .iter()
        .find(|t| t["tier"] == tier && t["ran"] == true)?;
    let verdicts: Vec<bool> = ["canaries", "checks"]
        .iter()
        .flat_map(|k| t["figures"][k].as_array().cloned().unwrap_or_default())
        .map(|v| v["held"] == true)
        .collect();
    Some(FixtureRun {
        tier: tier.to_owned(),
        at: t["at"].as_i64().or_else(|| report["at"].as_i64())?,
        held: t["ok"] == true,
        short: t.get("short").unwrap_or(&report["short"]) == true,
        passed: verdicts.iter().filter(|h| **h).count(),
        of: verdicts.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_last_fixture_run_of_the_tier_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(fixture_run(dir.path(), "namespace").await.is_none());
        std::fs::write(
            dir.path().join(FIXTURE_RECORD),
            serde_json::json!({
                "at": 1_700_000_000_000_i64, "short": true, "ok": false,
                "tiers": [
                    {"tier": "namespace", "ran": true, "ok": false, "figures": {
                        "canaries": [{"held": true}, {"held": false}],
                        "checks": [{"held": true}]}},
                    {"tier": "microvm-qemu", "ran": false, "ok": true, "figures": null}
                ]
            })
            .to_string(),
        )
        .unwrap();
        let run = fixture_run(dir.path(), "namespace").await.unwrap();
        assert_eq!(
            (run.at, run.held, run.short),
            (1_700_000_000_000, false, true)
        );
        assert_eq!((run.passed, run.of), (2, 3));
        assert!(
            fixture_run(dir.path(), "microvm-qemu").await.is_none(),
            "not run"
        );
    }
}

//! The audit service: appends records to the hash chains (each in the same transaction as the
//! change it describes), one append at a time, and keeps a checkpoint of every chain head in
//! `DATA_DIR/audit-checkpoint.json`, outside the database, so a truncated chain is detected.

use crate::store::{Change, Store, StoreError};
use coderoom_authz::audit::{self, Fields, Record};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::Mutex;

pub(crate) const CHECKPOINT_FILE: &str = "audit-checkpoint.json";

#[derive(Clone)]
pub(crate) struct Audit {
    store: Store,
    /// One append at a time: each reads its chain head and links to it.
    lock: Arc<Mutex<()>>,
    checkpoint: PathBuf,
    clock: crate::clock::Clock,
}

impl Audit {
    pub(crate) fn new(store: Store, data_dir: &Path, clock: crate::clock::Clock) -> Self {
        Audit {
            store,
            lock: Arc::default(),
            checkpoint: data_dir.join(CHECKPOINT_FILE),
            clock,
        }
    }

    /// Takes the append lock. Routes that decide on the room's state hold it from reading the
    /// state to recording the change, so no decision is made on state another change is about
    /// to replace.
    pub(crate) async fn lock(&self) -> Locked<'_> {
        Locked {
            audit: self,
            _guard: self.lock.lock().await,
        }
    }

    /// Performs `change` and records it (or a denial, with `Change::None`) in `chain`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record(
        &self,
        chain: &str,
        actor: &str,
        action: &str,
        decision: &str,
        reason: &str,
        details: serde_json::Value,
        change: Change,
    ) -> Result<Record, StoreError> {
        self.lock()
            .await
            .record(chain, actor, action, decision, reason, details, change)
            .await
    }
}

/// The audit log, held for a read-decide-write sequence.
pub(crate) struct Locked<'a> {
    audit: &'a Audit,
    _guard: tokio::sync::MutexGuard<'a, ()>,
}

impl Locked<'_> {
    /// Performs `change` and records it in `chain`, in one transaction.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record(
        &self,
        chain: &str,
        actor: &str,
        action: &str,
        decision: &str,
        reason: &str,
        details: serde_json::Value,
        change: Change,
    ) -> Result<Record, StoreError> {
        let fields = Fields {
            at: self.audit.clock.now_ms(),
            actor: actor.to_owned(),
            action: action.to_owned(),
            decision: decision.to_owned(),
            reason: reason.to_owned(),
            details: details.to_string(),
        };
        let rec = self.audit.store.record(chain, fields, &change).await?;
        if let Err(e) = write_checkpoint(&self.audit.checkpoint, chain, rec.seq, &rec.hash).await {
            // The record is committed; a stale checkpoint only weakens truncation detection.
            tracing::error!(error = %e, "cannot update the audit checkpoint");
        }
        Ok(rec)
    }
}

impl Locked<'_> {
    /// Records a refusal of `action` by `actor` in `chain` (nothing changes).
    pub(crate) async fn deny(
        &self,
        chain: &str,
        actor: &str,
        action: &str,
        reason: &str,
        details: serde_json::Value,
    ) -> Result<(), StoreError> {
        self.record(chain, actor, action, "deny", reason, details, Change::None)
            .await
            .map(drop)
    }
}

type Checkpoints = BTreeMap<String, (i64, String)>;

pub(crate) fn read_checkpoints(path: &Path) -> std::io::Result<Checkpoints> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoints::new()),
        Err(e) => Err(e),
    }
}

async fn write_checkpoint(path: &Path, chain: &str, seq: i64, hash: &str) -> std::io::Result<()> {
    let mut all = read_checkpoints(path)?;
    all.insert(chain.to_owned(), (seq, hash.to_owned()));
    let tmp = path.with_extension("json.tmp");
    tokio::fs::write(
        &tmp,
        serde_json::to_vec(&all).map_err(std::io::Error::other)?,
    )
    .await?;
    tokio::fs::rename(&tmp, path).await
}

/// Whether a chain must have a checkpoint to pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checkpoint {
    /// A chain without one fails: its truncation could not be detected.
    Required,
    /// Links and hashes only for a chain without one (`--no-checkpoint`).
    Optional,
}

/// Why verification failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    #[error(transparent)]
    Chain(#[from] audit::ChainError),
    #[error(
        "audit chain {0} has no checkpoint: the deletion of its last records could not be \
         detected (`coderoom audit verify --no-checkpoint` checks links and hashes only)"
    )]
    NoCheckpoint(String),
}

/// `coderoom audit verify`: checks every chain (or one), against the checkpoints. Returns the
/// number of chains verified, or the first failure.
pub(crate) async fn verify_all(
    store: &Store,
    data_dir: &Path,
    only: Option<&str>,
    need: Checkpoint,
) -> anyhow::Result<Result<usize, VerifyError>> {
    let checkpoints = read_checkpoints(&data_dir.join(CHECKPOINT_FILE))?;
    let mut chains = store.audit_chains().await?;
    // A chain wiped from the table entirely still has its checkpoint.
    for c in checkpoints.keys() {
        if !chains.contains(c) {
            chains.push(c.clone());
        }
    }
    if let Some(one) = only {
        chains.retain(|c| c == one);
    }
    for chain in &chains {
        let records = store.audit_records(chain).await?;
        let cp = checkpoints.get(chain).map(|(s, h)| (*s, h.as_str()));
        if let Err(e) = audit::verify(chain, &records, cp) {
            return Ok(Err(e.into()));
        }
        if cp.is_none() && !records.is_empty() && need == Checkpoint::Required {
            return Ok(Err(VerifyError::NoCheckpoint(chain.clone())));
        }
    }
    Ok(Ok(chains.len()))
}

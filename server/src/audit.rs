//! The audit service: appends records to the hash chains (each in the same transaction as the
//! change it describes), one append at a time, and keeps a checkpoint of every chain head in
//! `DATA_DIR/audit-checkpoint.json`, outside the database, so a truncated chain is detected.

use crate::store::{Change, Store, StoreError};
use coderoom_authz::audit::{self, Fields, Record};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
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
        // An agent's records name its sponsor too: whoever answers for it.
        let mut details = details;
        if let (Some(obj), Some(agent)) = (
            details.as_object_mut(),
            self.audit.store.agent(actor).await?,
        ) {
            obj.insert(
                "sponsor".into(),
                serde_json::Value::String(agent.sponsor.to_string()),
            );
        }
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

type Checkpoints = BTreeMap<String, (i64, String)>;

/// One line of an anchor file: every chain's head at a moment.
#[derive(Serialize, Deserialize)]
struct AnchorLine {
    at: i64,
    heads: Checkpoints,
}

impl Audit {
    /// Anchors every chain's head where a writer of the data directory cannot silently rewrite
    /// it together with the chains and the checkpoint: their digest goes into the system chain,
    /// whose new head is logged (logs leave the machine), and the heads are appended to `file`
    /// when the operator names one. Run at each start and stop.
    pub(crate) async fn anchor(&self, file: Option<&Path>) -> anyhow::Result<()> {
        // The heads as stored; a checkpoint that disagrees is said out loud.
        let heads = self.stored_heads().await?;
        if let Ok(checkpoint) = read_checkpoints(&self.checkpoint) {
            let differ = heads
                .iter()
                .filter(|(chain, head)| checkpoint.get(*chain) != Some(head))
                .count();
            if differ > 0 {
                tracing::warn!(
                    chains = differ,
                    "audit chain heads differ from the checkpoint; `coderoom audit verify` says which"
                );
            }
        }
        let digest = hex::encode(Sha256::digest(serde_json::to_vec(&heads)?));
        let details = serde_json::json!({ "chains": heads.len(), "heads_sha256": digest });
        let record = self
            .record(
                "system",
                "system",
                "audit_anchor",
                "allow",
                "",
                details,
                Change::None,
            )
            .await?;
        tracing::info!(
            system_head_seq = record.seq,
            system_head_hash = %record.hash,
            heads_sha256 = %digest,
            "audit chain heads anchored"
        );
        if let Some(file) = file {
            // The heads now, the anchoring record included.
            let line = AnchorLine {
                at: self.clock.now_ms(),
                heads: self.stored_heads().await?,
            };
            let text = serde_json::to_string(&line)?;
            let file = file.to_owned();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                use std::io::{Read, Seek, SeekFrom, Write};
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .read(true)
                    .open(&file)?;
                // A line an interrupted append left unfinished is closed first, so this one
                // stands on its own (and `verify --anchor` skips the broken one).
                let mut last = [0u8; 1];
                let len = f.seek(SeekFrom::End(0))?;
                let mut lead = "";
                if len > 0 {
                    f.seek(SeekFrom::Start(len - 1))?;
                    f.read_exact(&mut last)?;
                    if last[0] != b'\n' {
                        lead = "\n";
                    }
                }
                f.write_all(format!("{lead}{text}\n").as_bytes())?;
                f.sync_data()
            })
            .await??;
        }
        Ok(())
    }

    async fn stored_heads(&self) -> Result<Checkpoints, StoreError> {
        Ok(self
            .store
            .audit_heads()
            .await?
            .into_iter()
            .map(|(chain, seq, hash)| (chain, (seq, hash)))
            .collect())
    }
}

/// Every anchored head, by chain: seq -> (hash, when it was anchored).
type Anchors = std::collections::HashMap<String, std::collections::HashMap<i64, (String, i64)>>;

/// Reads an anchor file. A line that is not an anchor (an append cut short by a full disk or a
/// crash) is said and skipped; a file with no anchor at all is an error.
fn read_anchors(path: &Path) -> anyhow::Result<Anchors> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the anchor file {}: {e}", path.display()))?;
    let mut out = Anchors::new();
    let mut read = 0;
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match serde_json::from_str::<AnchorLine>(line) {
            Ok(a) => {
                read += 1;
                for (chain, (seq, hash)) in a.heads {
                    out.entry(chain).or_default().insert(seq, (hash, a.at));
                }
            }
            Err(e) => eprintln!(
                "warning: anchor file {} line {} is not an anchor ({e}); skipped",
                path.display(),
                n + 1
            ),
        }
    }
    if read == 0 {
        anyhow::bail!("anchor file {} holds no anchor", path.display());
    }
    Ok(out)
}

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
    let bytes = serde_json::to_vec(&all).map_err(std::io::Error::other)?;
    // Written, synced, then renamed over the old one: a power cut leaves the old checkpoint or
    // the new one, never an empty file.
    let mut f = tokio::fs::File::create(&tmp).await?;
    tokio::io::AsyncWriteExt::write_all(&mut f, &bytes).await?;
    f.sync_all().await?;
    drop(f);
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
    /// A record whose columns do not read (named by chain and sequence number).
    #[error("{0}")]
    Unreadable(String),
    #[error(
        "audit chain {chain}: record {seq} does not match the anchor written at {at} ms \
         (the record, or the chain after it, was rewritten or deleted)"
    )]
    Anchor { chain: String, seq: i64, at: i64 },
}

/// `coderoom audit verify`: checks every chain (or one), against the checkpoints. Returns the
/// number of chains verified, or the first failure.
pub(crate) async fn verify_all(
    store: &Store,
    data_dir: &Path,
    only: Option<&str>,
    need: Checkpoint,
    anchor_file: Option<&Path>,
) -> anyhow::Result<Result<usize, VerifyError>> {
    let checkpoints = read_checkpoints(&data_dir.join(CHECKPOINT_FILE))?;
    let anchors = match anchor_file {
        Some(path) => read_anchors(path)?,
        None => Anchors::new(),
    };
    let mut chains = store.audit_chains().await?;
    // A chain wiped from the table entirely still has its checkpoint, or its anchors.
    let known: std::collections::HashSet<String> = chains.iter().cloned().collect();
    let missing: std::collections::BTreeSet<&String> = checkpoints
        .keys()
        .chain(anchors.keys())
        .filter(|c| !known.contains(*c))
        .collect();
    chains.extend(missing.into_iter().cloned());
    if let Some(one) = only {
        chains.retain(|c| c == one);
    }
    for chain in &chains {
        let records = match store.audit_records(chain).await {
            Ok(r) => r,
            Err(e @ StoreError::BadAuditRecord { .. }) => {
                return Ok(Err(VerifyError::Unreadable(e.to_string())))
            }
            Err(e) => return Err(e.into()),
        };
        let cp = checkpoints.get(chain).map(|(s, h)| (*s, h.as_str()));
        if let Err(e) = audit::verify(chain, &records, cp) {
            return Ok(Err(e.into()));
        }
        if cp.is_none() && !records.is_empty() && need == Checkpoint::Required {
            return Ok(Err(VerifyError::NoCheckpoint(chain.clone())));
        }
        // Every anchored head is still there, unchanged (the chain's links then vouch for
        // everything before it). Each one, not only the newest: a chain rewritten and then
        // anchored again still fails on the older anchors.
        if let Some(anchored) = anchors.get(chain) {
            let stored: std::collections::HashMap<i64, &str> =
                records.iter().map(|r| (r.seq, r.hash.as_str())).collect();
            let mut bad: Vec<(i64, i64)> = anchored
                .iter()
                .filter(|(seq, (hash, _))| stored.get(seq) != Some(&hash.as_str()))
                .map(|(seq, (_, at))| (*seq, *at))
                .collect();
            bad.sort();
            if let Some((seq, at)) = bad.first() {
                return Ok(Err(VerifyError::Anchor {
                    chain: chain.clone(),
                    seq: *seq,
                    at: *at,
                }));
            }
        }
    }
    Ok(Ok(chains.len()))
}

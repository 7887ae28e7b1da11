//! A room's workspace snapshots on disk: tar archives streamed out of the sandbox by its
//! agent, named by the time they were taken, written to a `.partial` file and renamed once
//! complete and synced, the newest few kept. Beside each, `NAME.meta.json` ([`Meta`]): what the
//! room's document and that workspace last agreed on (path -> digest; see `filesync`), and the
//! readiness command that had completed in it, written by the server, never by the agent.

use crate::clock::Clock;
use crate::sandbox::SandboxError;
use crate::store::StoreError;
use coderoom_sandbox::Sandbox;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt};

/// Time a snapshot (and a restore) may take.
pub(crate) const WITHIN: Duration = Duration::from_secs(120);
/// Snapshots kept per room (the newest ones, and the one the room's row names).
const KEEP: usize = 2;
const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".tar";
/// Beside a snapshot: its [`Meta`].
const META_SUFFIX: &str = ".meta.json";
/// Largest record read back (a digest per mirrored file is far less).
const MAX_META_BYTES: u64 = 64 << 20;

/// What the server knows of a saved workspace, kept beside it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Meta {
    /// What the document and the workspace last agreed on (path -> digest).
    #[serde(default)]
    pub agreed: HashMap<String, String>,
    /// The readiness command that had completed in this workspace, if one had: a start from
    /// it with the same command skips it.
    #[serde(default)]
    pub ready_for: Option<String>,
    /// SHA-256 of the archive, recorded once it is written (none for a snapshot from before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// When a snapshot file was taken (Unix ms), from its name; `None` for any other file.
pub(crate) fn time_of(name: &str) -> Option<i64> {
    name.strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)?
        .parse()
        .ok()
}

/// A snapshot just written.
pub(crate) struct Taken {
    pub(crate) name: String,
    /// When it was taken (Unix ms), as its name says.
    pub(crate) at: i64,
    pub(crate) bytes: u64,
}

/// One room's snapshot directory.
pub(crate) struct Snapshots {
    dir: PathBuf,
    /// Largest archive accepted.
    max_bytes: u64,
    clock: Clock,
}

impl Snapshots {
    pub(crate) fn new(dir: PathBuf, max_bytes: u64, clock: Clock) -> Self {
        Snapshots {
            dir,
            max_bytes,
            clock,
        }
    }

    /// Where the snapshot called `name` is.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Streams a snapshot of `sandbox`'s workspace to a new file, with `agreed` (what the
    /// document and the workspace agreed on as it starts) beside it: its name, the time in that
    /// name (a snapshot's time everywhere it is shown), and its size.
    pub(crate) async fn take(&self, sandbox: &Sandbox, meta: &Meta) -> Result<Taken, SandboxError> {
        let (name, at) = self.begin(meta).await?;
        match self.archive(sandbox, &self.dir.join(&name)).await {
            Ok(bytes) => {
                self.record_hash(&name, meta).await;
                Ok(Taken { name, at, bytes })
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(self.record_path(&name)).await;
                Err(e)
            }
        }
    }

    /// Adds the archive's SHA-256 to snapshot `name`'s record (for receipts). A record that
    /// cannot be rewritten keeps what it had: the hash is for showing, not for restoring.
    async fn record_hash(&self, name: &str, meta: &Meta) {
        let path = self.dir.join(name);
        let hashed = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            use sha2::Digest as _;
            let mut hasher = sha2::Sha256::new();
            std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
            Ok(hex::encode(hasher.finalize()))
        })
        .await;
        if let Ok(Ok(sha256)) = hashed {
            let meta = Meta {
                sha256: Some(sha256),
                ..meta.clone()
            };
            if let Ok(record) = serde_json::to_vec(&meta) {
                let _ = write_durably(&self.record_path(name), &record).await;
            }
        }
    }

    /// Makes a copy of the archive at `src` the newest snapshot, with `agreed` beside it (a
    /// checkpoint being restored).
    pub(crate) async fn install(&self, src: &Path, meta: &Meta) -> Result<Taken, SandboxError> {
        let (name, at) = self.begin(meta).await?;
        match copy_durably(src, &self.dir.join(&name)).await {
            Ok(bytes) => {
                self.record_hash(&name, meta).await;
                Ok(Taken { name, at, bytes })
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(self.record_path(&name)).await;
                Err(e)
            }
        }
    }

    /// A new snapshot's name and time, with its agreement record written (a snapshot is never
    /// there without one).
    async fn begin(&self, meta: &Meta) -> Result<(String, i64), SandboxError> {
        tokio::fs::create_dir_all(&self.dir).await.map_err(io)?;
        let at = self.clock.now_ms();
        let name = format!("{PREFIX}{at:013}{SUFFIX}");
        let record = serde_json::to_vec(meta).map_err(|e| io(std::io::Error::other(e)))?;
        write_durably(&self.record_path(&name), &record).await?;
        Ok((name, at))
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}{META_SUFFIX}"))
    }

    /// Streams `sandbox`'s workspace archive to `dest` (written to `dest.partial`, synced,
    /// renamed once complete). Returns its size.
    pub(crate) async fn archive(
        &self,
        sandbox: &Sandbox,
        dest: &Path,
    ) -> Result<u64, SandboxError> {
        if let Some(dir) = dest.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(io)?;
        }
        let partial = partial_of(dest);
        let mut file = tokio::fs::File::create(&partial).await.map_err(io)?;
        let bytes = match sandbox.snapshot(&mut file, self.max_bytes, WITHIN).await {
            Ok(b) => b,
            Err(e) => {
                drop(file);
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(e.into());
            }
        };
        file.flush().await.map_err(io)?;
        file.sync_all().await.map_err(io)?;
        drop(file);
        tokio::fs::rename(&partial, dest).await.map_err(io)?;
        if let Some(dir) = dest.parent() {
            sync_dir(dir).await;
        }
        Ok(bytes)
    }

    /// What the server knew of snapshot `name` when it was taken; empty when the record is
    /// missing (a snapshot from before records were kept) or unreadable.
    pub(crate) async fn meta(&self, name: &str) -> Meta {
        let path = self.record_path(name);
        let read = async {
            let f = tokio::fs::File::open(&path).await?;
            let mut bytes = Vec::new();
            f.take(MAX_META_BYTES).read_to_end(&mut bytes).await?;
            serde_json::from_slice(&bytes).map_err(std::io::Error::other)
        };
        match read.await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Meta::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read a snapshot's record; files on disk only will be imported");
                Meta::default()
            }
        }
    }

    /// The room's snapshot files, newest first.
    pub(crate) async fn list(&self) -> Vec<String> {
        let Ok(mut rd) = tokio::fs::read_dir(&self.dir).await else {
            return Vec::new();
        };
        let mut names = Vec::new();
        while let Ok(Some(e)) = rd.next_entry().await {
            let name = e.file_name().to_string_lossy().into_owned();
            if time_of(&name).is_some() {
                names.push(name);
            }
        }
        names.sort();
        names.reverse();
        names
    }

    /// Removes all but the newest [`KEEP`] snapshots, never `current`.
    pub(crate) async fn prune(&self, current: Option<&str>) {
        let names = self.list().await;
        for name in names.iter().skip(KEEP) {
            if Some(name.as_str()) != current {
                let _ = tokio::fs::remove_file(self.dir.join(name)).await;
                let _ = tokio::fs::remove_file(self.record_path(name)).await;
            }
        }
    }
}

/// Copies `src` to `dest` (through `dest.partial`, synced, renamed, the directory synced).
pub(crate) async fn copy_durably(src: &Path, dest: &Path) -> Result<u64, SandboxError> {
    let partial = partial_of(dest);
    let copied = async {
        if let Some(dir) = dest.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let bytes = tokio::fs::copy(src, &partial).await?;
        tokio::fs::File::open(&partial).await?.sync_all().await?;
        tokio::fs::rename(&partial, dest).await?;
        Ok::<_, std::io::Error>(bytes)
    };
    match copied.await {
        Ok(bytes) => {
            if let Some(dir) = dest.parent() {
                sync_dir(dir).await;
            }
            Ok(bytes)
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&partial).await;
            Err(io(e))
        }
    }
}

/// Writes `data` to `dest` (through `dest.partial`, synced, renamed, the directory synced).
pub(crate) async fn write_durably(dest: &Path, data: &[u8]) -> Result<(), SandboxError> {
    let partial = partial_of(dest);
    let written = async {
        if let Some(dir) = dest.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let mut f = tokio::fs::File::create(&partial).await?;
        f.write_all(data).await?;
        f.sync_all().await?;
        drop(f);
        tokio::fs::rename(&partial, dest).await
    };
    match written.await {
        Ok(()) => {
            if let Some(dir) = dest.parent() {
                sync_dir(dir).await;
            }
            Ok(())
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&partial).await;
            Err(io(e))
        }
    }
}

fn io(e: std::io::Error) -> SandboxError {
    SandboxError::Store(StoreError::Io(e))
}

/// Where `path` is written before it is complete.
pub(crate) fn partial_of(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

/// Makes a rename in `dir` durable (best effort).
pub(crate) async fn sync_dir(dir: &Path) {
    if let Ok(d) = tokio::fs::File::open(dir).await {
        let _ = d.sync_all().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_files_are_told_by_name() {
        assert_eq!(
            time_of("snapshot-1795961758998.tar"),
            Some(1_795_961_758_998)
        );
        assert_eq!(time_of("snapshot-1795961758998.tar.partial"), None);
        assert_eq!(time_of("notes.tar"), None);
    }

    /// The newest two stay, and so does the one the room's row names, however old.
    #[tokio::test]
    async fn pruning_keeps_the_newest_and_the_current() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshots::new(dir.path().to_owned(), 1 << 20, Clock::manual(0));
        for t in [1, 2, 3, 4] {
            std::fs::write(dir.path().join(format!("snapshot-{t:013}.tar")), b"x").unwrap();
            std::fs::write(
                dir.path().join(format!("snapshot-{t:013}.tar.meta.json")),
                format!(r#"{{"agreed":{{"a.txt":"{t}"}},"ready_for":"make"}}"#),
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("notes.tar"), b"x").unwrap();
        snaps.prune(Some("snapshot-0000000000001.tar")).await;
        // Each kept snapshot keeps its agreement record; a pruned one's goes with it.
        let kept = snaps.meta("snapshot-0000000000001.tar").await;
        assert_eq!(kept.agreed.get("a.txt").map(String::as_str), Some("1"));
        assert_eq!(kept.ready_for.as_deref(), Some("make"));
        assert_eq!(
            snaps.meta("snapshot-0000000000002.tar").await,
            Meta::default()
        );
        assert!(!dir
            .path()
            .join("snapshot-0000000000002.tar.meta.json")
            .exists());
        assert_eq!(
            snaps.list().await,
            [
                "snapshot-0000000000004.tar",
                "snapshot-0000000000003.tar",
                "snapshot-0000000000001.tar"
            ]
        );
        assert!(dir.path().join("notes.tar").exists());
    }
}

//! What a sandbox keeps of its workspace: a stopping one parked under its snapshot's name,
//! archives, rewinds to a checkpoint, periodic snapshots and the room's latest one.

use super::{Actor, Life, Rewind, SandboxError};
use crate::sandbox::snapshots::{self, Meta};
use crate::store::{SandboxState, StoreError};
use coderoom_sandbox::Sandbox;
use std::time::Duration;

/// Time a stopping sandbox gets to be kept (a VM's memory is written out under software
/// emulation too), per step.
const PARK_WITHIN: Duration = Duration::from_secs(150);

impl Actor {
    /// Stops `sandbox` keeping what `--sandbox-keep` asks for, under the name of the snapshot
    /// just taken (`tag`), so the next start resumes from it instead of restoring that
    /// snapshot. `None` when nothing was kept: the caller kills the sandbox.
    pub(super) async fn park(
        &self,
        sandbox: &Sandbox,
        tag: Option<&str>,
    ) -> Option<coderoom_sandbox::Parked> {
        let keep = self.deps().cfg.sandbox_keep.keep()?;
        let tag = tag?;
        match sandbox.park(keep, tag, PARK_WITHIN).await {
            Ok(parked) => {
                tracing::info!(room = %self.room_id, kept = parked.kept.name(), bytes = parked.bytes, "sandbox parked");
                Some(parked)
            }
            Err(coderoom_sandbox::ParkError::Unsupported) => None,
            Err(e) => {
                tracing::warn!(room = %self.room_id, error = %e, "cannot keep the sandbox; its snapshot stands");
                None
            }
        }
    }

    /// The workspace as it is now, written to `dest`: archived from the running sandbox, else
    /// copied from the latest snapshot, else an empty archive (the room never had a sandbox).
    pub(super) async fn archive(
        &mut self,
        dest: &std::path::Path,
    ) -> Result<(u64, Meta), SandboxError> {
        if let Life::Running { sandbox, .. } = &self.life {
            // The agreement as the archive starts: what changes on disk while it is written
            // reads, on a restore, as a change inside (and is taken in).
            let (sandbox, meta) = (sandbox.clone(), self.meta_now());
            return Ok((self.snapshots.archive(&sandbox, dest).await?, meta));
        }
        match self.row.as_ref().and_then(|r| r.snapshot.clone()) {
            Some(name) => {
                let bytes = snapshots::copy_durably(&self.snapshots.path(&name), dest).await?;
                Ok((bytes, self.snapshots.meta(&name).await))
            }
            None => {
                // An empty tar archive: two zero blocks.
                let empty = [0u8; 1024];
                snapshots::write_durably(dest, &empty).await?;
                Ok((1024, Meta::default()))
            }
        }
    }

    /// Restores a checkpoint. The sandbox stops first (snapshotting what it had, so nothing of
    /// it is lost), so no sync runs while the document is rewritten; the document is made to
    /// read the checkpoint's files, as one change by whoever asked, which every client receives
    /// live; the checkpoint's archive becomes the newest snapshot, with an agreement record
    /// naming the checkpoint's texts (a file the document no longer has is then removed from
    /// the restored workspace, not taken in again); and the sandbox starts again if it ran.
    pub(super) async fn rewind(&mut self, rewind: &Rewind) -> Result<(), SandboxError> {
        let was_running = matches!(self.life, Life::Running { .. });
        let reason = format!("restoring {}", rewind.what);
        if was_running {
            self.stop(&rewind.who.0, &reason, SandboxState::Stopped, false)
                .await?;
        }
        let rewritten = async {
            let deps = self.deps();
            let mut visit = crate::room::visit::Visit::start_unjournaled(
                &deps.rooms,
                &deps.limits,
                &self.room_id,
                (&rewind.who.0, &rewind.who.1),
            )
            .await?;
            visit.rewrite(&rewind.texts).await?;
            visit.leave().await;
            Ok::<_, SandboxError>(())
        };
        let mut result = rewritten.await;
        if result.is_ok() {
            result = self.install_latest(&rewind.archive, &rewind.meta).await;
        }
        if was_running {
            // Running again either way: on the restored workspace, or on its own if the
            // restore failed.
            let how = if result.is_ok() {
                format!("restored {}", rewind.what)
            } else {
                format!("after a failed restore of {}", rewind.what)
            };
            if let Err(e) = self.ensure_running(&how).await {
                tracing::warn!(room = %self.room_id, error = %e, "cannot start the sandbox again after a restore");
            }
        }
        result
    }

    /// A snapshot while running, so a crash of the server loses at most this period of the
    /// workspace (the document loses nothing). Not a lifecycle transition: no audit record.
    pub(super) async fn periodic_snapshot(&mut self) {
        let Life::Running { sandbox, .. } = &self.life else {
            return;
        };
        let sandbox = sandbox.clone();
        match self.snapshots.take(&sandbox, &self.meta_now()).await {
            Ok(taken) => {
                if let Err(e) = self.make_latest(taken).await {
                    tracing::warn!(room = %self.room_id, error = %e, "cannot record the snapshot")
                }
            }
            Err(e) => tracing::warn!(room = %self.room_id, error = %e, "periodic snapshot failed"),
        }
    }

    /// Makes a copy of the archive at `src`, described by `meta`, the room's latest snapshot.
    pub(super) async fn install_latest(
        &mut self,
        src: &std::path::Path,
        meta: &Meta,
    ) -> Result<(), SandboxError> {
        let taken = self.snapshots.install(src, meta).await?;
        Ok(self.make_latest(taken).await?)
    }

    /// Records `taken` as the room's latest snapshot (a sandbox starting next resumes from it)
    /// and prunes older ones.
    async fn make_latest(&mut self, taken: snapshots::Taken) -> Result<(), StoreError> {
        let snapshots::Taken { name, at, .. } = taken;
        self.deps()
            .store
            .set_snapshot(&self.room_id, &name, at)
            .await?;
        if let Some(r) = self.row.as_mut() {
            r.snapshot = Some(name);
            r.snapshot_at = Some(at);
        }
        self.snapshots
            .prune(self.row.as_ref().and_then(|r| r.snapshot.as_deref()))
            .await;
        Ok(())
    }
}

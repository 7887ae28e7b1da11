//! The warm pool: sandboxes started ahead of need and given to no room yet, so a room's
//! sandbox starts in the time of a restore, not a boot; each is given to one room once.

use super::Sandboxes;
use crate::ids::RoomId;
use coderoom_sandbox::Backend;
use std::time::Duration;

/// Most sandboxes the warm pool holds, whatever `--sandbox-warm-pool` says.
const MAX_WARM_POOL: usize = 16;
/// How long the pool waits after a sandbox is taken before starting the next: the room that
/// took it is running its first command then, and a start beside it competes with that for the
/// host's CPUs (on two, the fixture's warm-pool figure was a cold start's).
const REFILL_PAUSE: Duration = Duration::from_millis(250);

impl Sandboxes {
    /// Keeps `--sandbox-warm-pool` sandboxes started and unassigned until shutdown, when the
    /// unassigned ones are killed.
    pub(crate) fn start_warm_pool(&self) {
        let size = self.inner.deps.cfg.sandbox_warm_pool.min(MAX_WARM_POOL);
        if size == 0 || matches!(self.inner.backend, Backend::None(_)) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let inner = &this.inner;
            let shutdown = inner.deps.shutdown.clone();
            while !shutdown.is_cancelled() {
                let have = inner.pool.lock().unwrap_or_else(|e| e.into_inner()).len();
                if have < size {
                    // Named for this host, not this server: a sandbox's cgroup is named after
                    // it, and another server here (a second room server, a sandbox host) that
                    // made a group of the same name would take it for a crashed run's and
                    // kill what is in it.
                    let name = format!("pool{}", uuid::Uuid::new_v4().simple());
                    let started = inner.backend.start(&name, &inner.deps.cfg.limits()).await;
                    match started {
                        Ok(s) => {
                            let mut pool = inner.pool.lock().unwrap_or_else(|e| e.into_inner());
                            pool.push(s);
                            inner.deps.pool_ready.set(pool.len() as i64);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot start a sandbox for the warm pool");
                            tokio::select! {
                                () = shutdown.cancelled() => {}
                                () = tokio::time::sleep(Duration::from_secs(5)) => {}
                            }
                        }
                    }
                    continue;
                }
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = inner.pool_taken.notified() => {
                        tokio::select! {
                            () = shutdown.cancelled() => {}
                            () = tokio::time::sleep(REFILL_PAUSE) => {}
                        }
                    }
                }
            }
            let left = std::mem::take(&mut *inner.pool.lock().unwrap_or_else(|e| e.into_inner()));
            for (sandbox, _, _) in &left {
                sandbox.kill();
            }
            inner.deps.pool_ready.set(0);
        });
    }

    /// A sandbox for `room_id`: resumed from what its last stop kept under `tag` (the
    /// snapshot it would restore) when the backend has it, else a warm one from the pool, else
    /// a new one. The flag says it came from the pool.
    pub(super) async fn take_sandbox(
        &self,
        room_id: &RoomId,
        tag: Option<&str>,
    ) -> Result<(coderoom_sandbox::Started, bool), coderoom_sandbox::StartError> {
        let inner = &self.inner;
        if tag.is_some() && inner.backend.has_kept(room_id) {
            let started = inner
                .backend
                .resume(room_id, &inner.deps.cfg.limits(), tag)
                .await?;
            return Ok((started, false));
        }
        loop {
            let pooled = {
                let mut pool = inner.pool.lock().unwrap_or_else(|e| e.into_inner());
                let s = pool.pop();
                inner.deps.pool_ready.set(pool.len() as i64);
                s
            };
            let Some(started) = pooled else { break };
            inner.pool_taken.notify_one();
            if started.0.has_ended() {
                continue;
            }
            return Ok((started, true));
        }
        let started = inner
            .backend
            .start(room_id, &inner.deps.cfg.limits())
            .await?;
        Ok((started, false))
    }
}

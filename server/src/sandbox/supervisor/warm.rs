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
/// How long the command that warms a pool sandbox may take.
const WARM_WITHIN: Duration = Duration::from_secs(30);

/// Runs one command in a sandbox started for the pool: the agent's first spawn (its first use
/// of that path, a shell's first start in that sandbox) is paid here, not by the first command
/// of the room that takes it. Nothing of it stays in the workspace.
async fn warm(sandbox: &coderoom_sandbox::Sandbox) -> Result<(), WarmError> {
    let op = coderoom_sandbox::proto::Op::Exec {
        argv: vec!["sh".into(), "-c".into(), ":".into()],
        cwd: String::new(),
        timeout_ms: 10_000,
        max_output: 1024,
        actor: "system".into(),
    };
    match sandbox.call(op, WARM_WITHIN).await {
        Ok(coderoom_sandbox::proto::Reply::Exec {
            exit_code: Some(0), ..
        }) => Ok(()),
        Ok(_) => Err(WarmError::Failed),
        Err(e) => Err(WarmError::Call(e)),
    }
}

/// The memory available to this server's sandboxes, in bytes: the host's (`MemAvailable` in
/// `/proc/meminfo`), or less where the server's own cgroup (a container's) has a memory limit
/// closer to its use.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    let host = kib << 10;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| own_group_room(&c, |p| std::fs::read_to_string(p).ok()));
    Some(own.map_or(host, |o| o.min(host)))
}

/// What the cgroup named in `proc_self_cgroup` (as `/proc/self/cgroup` reads) has left under
/// its memory limit; `None` without a limit. `read` reads a file of the hierarchy.
fn own_group_room(proc_self_cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut files = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let dir = format!("/sys/fs/cgroup/memory{path}");
            files = Some((
                format!("{dir}/memory.limit_in_bytes"),
                format!("{dir}/memory.usage_in_bytes"),
            ));
            break;
        }
        if controllers.is_empty() && files.is_none() {
            let dir = format!("/sys/fs/cgroup{path}");
            files = Some((format!("{dir}/memory.max"), format!("{dir}/memory.current")));
        }
    }
    let (limit, usage) = files?;
    let limit: u64 = read(&limit)?.trim().parse().ok()?;
    let usage: u64 = read(&usage)?.trim().parse().ok()?;
    Some(limit.saturating_sub(usage))
}

/// Why a sandbox could not be readied for the pool.
#[derive(Debug, thiserror::Error)]
enum WarmError {
    #[error("cannot start it: {0}")]
    Start(#[from] coderoom_sandbox::StartError),
    #[error("its warming command did not run: {0}")]
    Call(coderoom_sandbox::CallError),
    #[error("its warming command failed")]
    Failed,
}

impl Sandboxes {
    /// Keeps `--sandbox-warm-pool` sandboxes started and unassigned until shutdown, when the
    /// unassigned ones are killed.
    pub(crate) fn start_warm_pool(&self) {
        if matches!(self.inner.backend, Backend::None(_)) {
            return;
        }
        let size = self
            .inner
            .deps
            .cfg
            .warm_pool_size(mem_available())
            .min(MAX_WARM_POOL);
        if size == 0 {
            return;
        }
        tracing::info!(size, "warm pool");
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
                    let started = match inner.backend.start(&name, &inner.deps.cfg.limits()).await {
                        Ok(s) => match warm(&s.0).await {
                            Ok(()) => Ok(s),
                            Err(e) => {
                                s.0.kill();
                                let _ = tokio::time::timeout(WARM_WITHIN, s.0.ended()).await;
                                Err(e)
                            }
                        },
                        Err(e) => Err(WarmError::from(e)),
                    };
                    match started {
                        Ok(s) => {
                            let mut pool = inner.pool.lock().unwrap_or_else(|e| e.into_inner());
                            pool.push(s);
                            inner.deps.pool_ready.set(pool.len() as i64);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot ready a sandbox for the warm pool");
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

#[cfg(test)]
mod tests {
    use super::own_group_room;

    #[test]
    fn a_containers_memory_limit_bounds_what_the_pool_counts_on() {
        let files = |limit: &'static str, usage: &'static str| {
            move |p: &str| {
                Some(
                    if p.ends_with("limit_in_bytes") || p.ends_with("memory.max") {
                        limit.to_owned()
                    } else {
                        usage.to_owned()
                    },
                )
            }
        };
        // v2 (a container's namespace: its own group is the root).
        assert_eq!(
            own_group_room("0::/\n", files("2147483648\n", "1073741824\n")),
            Some(1 << 30)
        );
        assert_eq!(
            own_group_room("0::/\n", files("max\n", "1073741824\n")),
            None
        );
        // v1, the memory controller's line wins over the unified one.
        let v1 = "12:cpu,cpuacct:/x\n9:memory:/kubepods/pod1\n0::/kubepods/pod1\n";
        let seen = std::cell::RefCell::new(Vec::new());
        let read = |p: &str| {
            seen.borrow_mut().push(p.to_owned());
            files("3000", "1000")(p)
        };
        assert_eq!(own_group_room(v1, read), Some(2000));
        assert!(seen
            .borrow()
            .iter()
            .all(|p| p.starts_with("/sys/fs/cgroup/memory/kubepods/pod1/")));
        // Unreadable or unknown: no limit known.
        assert_eq!(own_group_room("0::/\n", |_| None), None);
        assert_eq!(own_group_room("", files("1", "0")), None);
    }
}

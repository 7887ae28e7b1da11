//! Test hooks: named points where the server stops making progress, so that a test can
//! `kill -9` it exactly there and check that a restart loses nothing.
//!
//! `CODEROOM_FAULT_PAUSE_AT` lists the points to stop at, comma-separated. Reaching a listed
//! point prints `fault point reached: NAME` on stdout and parks the task that reached it for
//! good (whatever it holds open, a database transaction included, stays open until the process
//! dies). Unset, a point costs one look at an empty list. Release builds ignore the variable
//! (and say so at start): a leftover setting in a unit file cannot park a production server
//! inside a transaction. The tests run debug builds. The points:
//!
//! - `compaction`: inside the transaction that replaces a room's snapshot, after the new
//!   snapshot is written and before the folded log entries are deleted.
//! - `room_unload`: an idle room has compacted its log and is leaving memory.
//! - `deletion_step`: inside the transaction of one database step of a room deletion, after
//!   the rows are deleted and before the step is recorded.
//! - `deletion_after_steps_N`: a room deletion has carried out N steps in this run.
//! - `sandbox_start_record`: a sandbox has started and its start is about to be recorded.

use std::io::Write;
use std::sync::OnceLock;

const ENV: &str = "CODEROOM_FAULT_PAUSE_AT";

fn points() -> &'static [String] {
    static POINTS: OnceLock<Vec<String>> = OnceLock::new();
    POINTS.get_or_init(|| {
        std::env::var(ENV)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Says at start when the variable is set: a warning in a debug build (the points are live),
/// an error in a release build (they are not).
pub(crate) fn announce() {
    if points().is_empty() {
        return;
    }
    if cfg!(debug_assertions) {
        tracing::warn!(points = ?points(), "{ENV} is set: this server stops at those test points");
    } else {
        tracing::error!("{ENV} is set, and ignored: test points exist in debug builds only");
    }
}

/// Parks the calling task forever when `name` is one of the points the environment lists
/// (debug builds only).
pub(crate) async fn point(name: &str) {
    if reached(name) {
        std::future::pending::<()>().await;
    }
}

/// [`point`] for code on a thread of its own (the update log's writer): parks the thread.
pub(crate) fn point_blocking(name: &str) {
    if reached(name) {
        loop {
            std::thread::park();
        }
    }
}

/// Whether `name` is a point to stop at; says so when it is.
fn reached(name: &str) -> bool {
    if !cfg!(debug_assertions) || !points().iter().any(|p| p == name) {
        return false;
    }
    tracing::error!("{ENV}: stopping at {name}");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "fault point reached: {name}");
    let _ = out.flush();
    true
}

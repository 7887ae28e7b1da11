//! Prometheus metrics, served as text at `GET /metrics`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone)]
pub(crate) struct Metrics {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    registry: Registry,
    pub rooms_loaded: Gauge,
    /// Requests (and WebSocket upgrades) sent on to the server that owns their room.
    pub requests_forwarded: Counter,
    /// Rooms closed here because another server took them over (a lapsed lease).
    pub rooms_moved: Counter,
    /// Passes of the deletion sweeper (each picks up deletions a dead server left part way).
    pub deletion_sweeps: Counter,
    /// Started sandboxes waiting in the warm pool.
    pub sandbox_pool_ready: Gauge,
    pub connections: Gauge,
    pub updates_applied: Counter,
    pub updates_denied: Counter,
    pub updates_refused_full: Counter,
    pub edits_carried: Counter,
    pub edits_unplaced: Counter,
    pub bytes_persisted: Counter,
    pub persist_seconds: Histogram,
    pub compactions: Counter,
    pub room_panics: Counter,
    pub connections_dropped_slow: Counter,
    pub connections_held_back: Counter,
    pub protocol_errors: Counter,
    pub argon2_operations: Counter,
    pub access_close_seconds: Histogram,
    pub descriptors_exhausted: Counter,
    pub outbound_queued_bytes: Gauge,
    /// Where a document update's time goes, stage by stage (see `doc_stage_seconds`).
    pub stage_decode: Histogram,
    pub stage_receive: Histogram,
    pub stage_apply: Histogram,
    pub stage_commit: Histogram,
    pub stage_log_wait: Histogram,
    pub stage_log_write: Histogram,
    pub stage_log_checkpoint: Histogram,
    pub stage_upkeep: Histogram,
    pub stage_broadcast: Histogram,
    pub stage_queue: Histogram,
    pub stage_write: Histogram,
    /// Metered use (`crate::spend`), by meter.
    pub spend: Family<Vec<(String, String)>, Counter>,
    /// Metered work refused at a budget, by meter.
    pub budget_refusals: Family<Vec<(String, String)>, Counter>,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("coderoom");
        let rooms_loaded = Gauge::default();
        let requests_forwarded = Counter::default();
        let rooms_moved = Counter::default();
        let deletion_sweeps = Counter::default();
        registry.register(
            "deletion_sweeps",
            "Passes of the sweeper that picks up deletions a dead server left part way",
            deletion_sweeps.clone(),
        );
        let sandbox_pool_ready = Gauge::default();
        let connections = Gauge::default();
        let updates_applied = Counter::default();
        let updates_denied = Counter::default();
        let updates_refused_full = Counter::default();
        let edits_carried = Counter::default();
        let edits_unplaced = Counter::default();
        registry.register(
            "edits_carried",
            "Runs of text typed into a file that was renamed or deleted meanwhile, carried into the file it became (or brought back)",
            edits_carried.clone(),
        );
        registry.register(
            "edits_unplaced",
            "Runs of text typed into a file that is gone, with nowhere known to carry them: kept in recovered/",
            edits_unplaced.clone(),
        );
        let bytes_persisted = Counter::default();
        // 100 µs .. ~3 s: a batched SQLite fsync is around 1 ms, a busy PostgreSQL more.
        let persist_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let compactions = Counter::default();
        let room_panics = Counter::default();
        let connections_dropped_slow = Counter::default();
        let connections_held_back = Counter::default();
        let protocol_errors = Counter::default();
        let argon2_operations = Counter::default();
        let descriptors_exhausted = Counter::default();
        registry.register(
            "descriptors_exhausted",
            "Connections answered 503 because the process was out of file descriptors",
            descriptors_exhausted.clone(),
        );
        let outbound_queued_bytes = Gauge::default();
        registry.register(
            "outbound_queued_bytes",
            "Bytes waiting in document connections' outbound queues (each WebSocket also holds \
             a read buffer of 4 KiB, or the largest frame its client sent, and a write buffer of \
             at most 16 KiB)",
            outbound_queued_bytes.clone(),
        );
        // 1 ms .. 10 s, with an edge at 1 s: the bound the contract promises for removals.
        let access_close_seconds =
            Histogram::new([0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]);
        registry.register(
            "access_close_seconds",
            "Time from an access decision (removal, lapse of observe, logout) to the moment the \
             close of each document or terminal socket it ends is handed to that socket",
            access_close_seconds.clone(),
        );
        registry.register(
            "argon2_operations",
            "Login code hashes and verifications run",
            argon2_operations.clone(),
        );
        registry.register("rooms_loaded", "Rooms held in memory", rooms_loaded.clone());
        registry.register(
            "requests_forwarded",
            "Requests sent on to the server that owns their room",
            requests_forwarded.clone(),
        );
        registry.register(
            "rooms_moved",
            "Rooms closed here because another server took them over",
            rooms_moved.clone(),
        );
        registry.register(
            "sandbox_pool_ready",
            "Started sandboxes waiting in the warm pool",
            sandbox_pool_ready.clone(),
        );
        registry.register(
            "connections",
            "Open document WebSocket connections",
            connections.clone(),
        );
        registry.register(
            "updates_applied",
            "Document updates applied and logged",
            updates_applied.clone(),
        );
        registry.register(
            "updates_denied",
            "Document updates refused for lack of edit",
            updates_denied.clone(),
        );
        registry.register(
            "updates_refused_full",
            "Document updates refused because the room is at its size cap",
            updates_refused_full.clone(),
        );
        registry.register(
            "bytes_persisted",
            "Bytes of document updates appended to storage",
            bytes_persisted.clone(),
        );
        registry.register(
            "persist_seconds",
            "Latency of one batched update-log append",
            persist_seconds.clone(),
        );
        registry.register(
            "compactions",
            "Update-log compactions into a snapshot",
            compactions.clone(),
        );
        registry.register(
            "room_panics",
            "Room tasks that panicked and were unloaded",
            room_panics.clone(),
        );
        registry.register(
            "connections_dropped_slow",
            "Connections dropped because their outbound queue was full",
            connections_dropped_slow.clone(),
        );
        registry.register(
            "connections_held_back",
            "Times a connection fell behind and had broadcasts held back until it caught up",
            connections_held_back.clone(),
        );
        registry.register(
            "protocol_errors",
            "Connections closed for malformed or refused frames",
            protocol_errors.clone(),
        );
        // 5 µs .. ~10 s, each bucket 1.5x the one before (a p99 read off the buckets is
        // within 50% of the true one): a frame's decode is microseconds, a commit milliseconds.
        let stages: Family<Vec<(String, String)>, Histogram> = Family::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_005, 1.5, 36))
        });
        registry.register(
            "doc_stage_seconds",
            "Where document updates spend their time, by stage: decode (a client's frame parsed \
             on its socket), receive (its messages waiting for the room), apply (the room \
             applying a connection's messages), commit (the update log append a batch waits \
             for, in all), log_wait (a batch waiting for the log's writer), log_write (the \
             writer's statement and its fsync, per group of rooms' batches), log_checkpoint (the \
             writer copying the rest of SQLite's WAL into the database, groups waiting behind \
             it), upkeep (a room renewing its lease or compacting its log, its updates waiting \
             meanwhile), broadcast (framing a committed batch and queueing it for every peer), \
             queue (a frame waiting in a connection's queue), write (handing a frame to the \
             socket)",
            stages.clone(),
        );
        let stage = |name: &str| {
            stages
                .get_or_create(&vec![("stage".to_owned(), name.to_owned())])
                .clone()
        };
        let (stage_decode, stage_apply, stage_commit) =
            (stage("decode"), stage("apply"), stage("commit"));
        let (stage_receive, stage_upkeep) = (stage("receive"), stage("upkeep"));
        let (stage_log_wait, stage_log_write) = (stage("log_wait"), stage("log_write"));
        let stage_log_checkpoint = stage("log_checkpoint");
        let (stage_broadcast, stage_queue, stage_write) =
            (stage("broadcast"), stage("queue"), stage("write"));
        let spend = Family::default();
        registry.register(
            "spend",
            "Metered use by meter (sandbox_seconds, execs, egress_bytes, model_tokens, tool_calls), \
             all rooms; GET /api/rooms/{id}/spend has each room's, per participant",
            spend.clone(),
        );
        let budget_refusals = Family::default();
        registry.register(
            "budget_refusals",
            "Metered work refused because a budget of that meter was used up",
            budget_refusals.clone(),
        );
        Metrics {
            inner: Arc::new(Inner {
                stage_decode,
                stage_receive,
                stage_apply,
                stage_commit,
                stage_log_wait,
                stage_log_write,
                stage_log_checkpoint,
                stage_upkeep,
                stage_broadcast,
                stage_queue,
                stage_write,
                spend,
                budget_refusals,
                registry,
                rooms_loaded,
                requests_forwarded,
                rooms_moved,
                deletion_sweeps,
                sandbox_pool_ready,
                connections,
                updates_applied,
                updates_denied,
                updates_refused_full,
                edits_carried,
                edits_unplaced,
                bytes_persisted,
                persist_seconds,
                compactions,
                room_panics,
                connections_dropped_slow,
                connections_held_back,
                protocol_errors,
                argon2_operations,
                access_close_seconds,
                descriptors_exhausted,
                outbound_queued_bytes,
            }),
        }
    }

    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.inner.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for Metrics {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

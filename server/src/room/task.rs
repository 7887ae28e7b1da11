//! One task per loaded room. It owns the `yrs::Doc`, the presence table and the subscribers;
//! connections talk to it only through its bounded command channel.
//!
//! Durability rule: an update is appended to the database before any peer is sent anything that
//! depends on it. The task drains every command that is waiting, applies them, appends all the
//! resulting updates in one transaction, and only then releases the replies and broadcasts the
//! batch produced (group commit: under load one fsync covers many keystrokes).

use crate::audit::Audit;
use crate::close::CloseCode;
use crate::config::Limits;
use crate::metrics::Metrics;
use crate::room::outbox::{Class, Outbound, Outbox};
use crate::room::protocol::Inbound;
use crate::store::{Change, Store, StoreError, StoredDoc};
use bytes::Bytes;
use coderoom_authz::{Capability, Participant, RoomState, Until};
use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::protocol::{Message, SyncMessage};
use yrs::sync::AwarenessUpdate;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{ClientID, Doc, ReadTxn, StateVector, Transact, Update, WriteTxn};

/// Commands waiting for a room; senders wait (backpressure) when it is full.
pub(crate) const ROOM_QUEUE: usize = 1024;
/// Commands handled before the batch is committed, so one huge burst still commits regularly.
const MAX_BATCH_COMMANDS: usize = 512;
/// Attempts to append a batch before the room gives up and restarts from storage.
const PERSIST_ATTEMPTS: u32 = 3;
/// Delete ranges one update may carry into a room at its size cap.
const MAX_DELETE_RANGES_AT_CAP: usize = 1024;
/// What a client whose edit was refused for want of `edit` is told.
pub(crate) const NOT_KEPT: &str =
    "You do not hold edit in this room: your latest changes were not kept";
/// What a client whose edit would grow a full room is told.
pub(crate) const ROOM_FULL: &str =
    "This room is full: delete files or ask an owner to raise the cap";

/// One connection to a room (a socket, or the workspace sync), unique in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub(crate) struct ConnId(u64);

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// A connection id no other connection of this process has.
pub(crate) fn next_conn_id() -> ConnId {
    ConnId(NEXT_CONN.fetch_add(1, Ordering::Relaxed))
}

pub(crate) enum RoomCmd {
    Join {
        conn: ConnId,
        user_id: String,
        /// The name shown with this connection's presence (the login email).
        name: String,
        rights: Rights,
        out: Outbox,
        reply: oneshot::Sender<Result<(), JoinError>>,
    },
    Inbound {
        conn: ConnId,
        messages: Vec<Inbound>,
    },
    Leave {
        conn: ConnId,
    },
    /// The room is being deleted: close every connection, log nothing more, unload.
    Delete {
        done: oneshot::Sender<usize>,
    },
    /// A participant's rights changed: until when they may edit and observe. Applies from the
    /// next frame on.
    Access {
        user_id: String,
        rights: Rights,
        /// When the server decided: a socket this closes is measured from here
        /// (`coderoom_access_close_seconds`).
        decided: Instant,
    },
    /// Test hook: makes the room task panic, as a bug in it would.
    #[cfg(test)]
    Panic,
}

#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinError {
    #[error("room is full")]
    Full,
}

/// Why a stored document cannot be rebuilt.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DocError {
    #[error("a stored update does not decode")]
    Decode(#[from] yrs::encoding::read::Error),
    #[error("a stored update does not apply")]
    Apply(#[from] yrs::error::UpdateError),
}

/// Why a room could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the stored document is corrupt")]
    Corrupt(#[from] DocError),
    #[error("cannot follow the document's changes")]
    Observe,
    /// Another server owns the room (its lease is live): connections go there.
    #[error("the room is loaded on another server ({})", .0.server)]
    Elsewhere(crate::store::Owner),
}

/// Collects what each transaction on `doc` changed, encoded as a v1 update, into `sink`.
///
/// Encoded when the transaction's body is done, before yrs merges the new blocks into their
/// neighbours, not from `observe_update_v1` (which encodes after that merge): a typist's
/// insert at the end of a text is by then part of one long merged block, and encoding a slice
/// of it walks the block's string from its start, so each update cost time in proportion to the
/// text's length (85% of the server's CPU in a one-writer burst, `yrs::block::split_str`). The
/// two encodings hold the same change (`produced_updates_match_yrs_own` checks it).
///
/// `after_merge` (`serve --encode-after-merge`) encodes after the merge instead, for the
/// benchmark's comparison only (docs/benchmarks.md).
pub(crate) fn observe_produced(
    doc: &Doc,
    sink: Arc<Mutex<Vec<Vec<u8>>>>,
    after_merge: bool,
) -> Result<(), yrs::TransactionAcqError> {
    let keep = move |update: Vec<u8>| match sink.lock() {
        Ok(mut v) => v.push(update),
        Err(poisoned) => poisoned.into_inner().push(update),
    };
    if after_merge {
        return doc.observe_update_v1("log", move |_, event| keep(event.update.clone()));
    }
    doc.observe_after_transaction("log", move |txn| {
        if !txn.delete_set().is_empty() || txn.after_state() != txn.before_state() {
            keep(txn.encode_update_v1());
        }
    })
}

/// Rebuilds a room's document from its snapshot and log, failing on any entry that does not
/// decode or apply. Returns the document and the stored bytes it came from.
///
/// One transaction per entry: applied in one transaction, a long log grew worse than
/// quadratically (yrs squashes runs of text only when a transaction commits): 40,000 entries
/// took 11.8 s, now 62 ms (`load_tests`, docs/benchmarks.md).
pub(crate) fn doc_from_stored(stored: &StoredDoc) -> Result<(Doc, usize), DocError> {
    let doc = Doc::new();
    let mut bytes = 0;
    let parts = stored
        .snapshot
        .iter()
        .map(Vec::as_slice)
        .chain(stored.updates.iter().map(|(_, d)| d.as_slice()));
    for data in parts {
        bytes += data.len();
        let update = Update::decode_v1(data)?;
        doc.transact_mut().apply_update(update)?;
    }
    Ok((doc, bytes))
}

/// Until when a connection may act (edit the document, type in the terminal) and observe,
/// checked against the clock on every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rights {
    pub(crate) act: Until,
    pub(crate) observe: Until,
}

impl Rights {
    /// Out of the room.
    pub(crate) const NONE: Rights = Rights {
        act: Until::Never,
        observe: Until::Never,
    };
    /// The server's own participants (the workspace sync).
    pub(crate) const FULL: Rights = Rights {
        act: Until::Forever,
        observe: Until::Forever,
    };

    /// `p`'s rights to use `cap` (never past its `observe`) and to observe.
    pub(crate) fn of(p: &Participant, cap: Capability, now: i64) -> Self {
        let observe = p.until(Capability::Observe, now);
        Rights {
            act: p.until(cap, now).min(observe),
            observe,
        }
    }

    /// `user`'s rights in `state` (a participant's or an agent's) to use `cap` and to observe.
    pub(crate) fn of_state(state: &RoomState, user: &str, cap: Capability, now: i64) -> Self {
        let observe = state.until(user, Capability::Observe, now);
        Rights {
            act: state.until(user, cap, now).min(observe),
            observe,
        }
    }

    pub(crate) fn may_act(self, now: i64) -> bool {
        self.act.holds_at(now)
    }

    pub(crate) fn may_observe(self, now: i64) -> bool {
        self.observe.holds_at(now)
    }
}

/// What a room needs from the rest of the server.
#[derive(Clone)]
pub(crate) struct RoomDeps {
    pub store: Store,
    pub audit: Audit,
    pub tracker: tokio_util::task::TaskTracker,
    pub metrics: Metrics,
    pub limits: Arc<Limits>,
    pub shutdown: CancellationToken,
    /// The time of day the room's rights are checked against.
    pub clock: crate::clock::Clock,
    /// This server, as room leases name it.
    pub server: crate::store::ServerId,
    /// How long a room's lease lasts unless renewed (a third of it between renewals): how long
    /// a room whose server died stays unavailable before another server takes it.
    pub lease_ms: i64,
}

struct Conn {
    user_id: String,
    /// Stamped into every presence state this connection announces.
    identity: crate::room::presence::Identity,
    /// Until when this connection's user may edit and observe.
    rights: Rights,
    out: Outbox,
    awareness_ids: HashSet<ClientID>,
    /// Set while broadcasts to this connection are held back because it fell behind: the
    /// document state it is known to have been sent up to. Once its queue drains it gets the
    /// difference in one update, instead of being dropped.
    lag_from: Option<StateVector>,
    /// While held back: the departures mark when it fell behind, so the catch-up also tells it
    /// who left meanwhile (their removals were among the broadcasts it missed).
    lag_departures: u64,
}

struct Presence {
    clock: u32,
    json: Option<Arc<str>>,
    owner: ConnId,
}

enum Target {
    One(ConnId),
    All,
    AllBut(ConnId),
}

/// A connection's refused edits are audited at most this often (the first one at once).
const DENIAL_AUDIT_EVERY_MS: i64 = 60_000;
/// Audit appends of refused edits one room may have waiting.
const MAX_AUDITS_IN_FLIGHT: usize = 4;

/// Departed presence ids remembered per room; the oldest are forgotten first.
const MAX_TOMBSTONES: usize = 1024;

#[derive(Default)]
struct Tombstones {
    /// Each departed id's last clock, and when it departed (a count of departures).
    clocks: HashMap<ClientID, (u32, u64)>,
    order: std::collections::VecDeque<ClientID>,
    departures: u64,
}

impl Tombstones {
    fn get(&self, id: &ClientID) -> Option<u32> {
        self.clocks.get(id).map(|(clock, _)| *clock)
    }

    /// A mark to ask later what departed since ([`Tombstones::since`]).
    fn mark(&self) -> u64 {
        self.departures
    }

    /// The ids that departed since `mark`, with their last clocks.
    fn since(&self, mark: u64) -> impl Iterator<Item = (ClientID, u32)> + '_ {
        self.clocks
            .iter()
            .filter(move |(_, (_, at))| *at >= mark)
            .map(|(id, (clock, _))| (*id, *clock))
    }

    fn insert(&mut self, id: ClientID, clock: u32) {
        let at = self.departures;
        self.departures += 1;
        if self.clocks.insert(id, (clock, at)).is_some() {
            // Departed again: it is the newest now, the last to be forgotten.
            self.order.retain(|x| *x != id);
        }
        self.order.push_back(id);
        while self.order.len() > MAX_TOMBSTONES {
            if let Some(old) = self.order.pop_front() {
                self.clocks.remove(&old);
            }
        }
    }

    fn remove(&mut self, id: &ClientID) {
        if self.clocks.remove(id).is_some() {
            self.order.retain(|x| x != id);
        }
    }
}

/// Why the room task ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    Idle,
    Shutdown,
    Failed,
    Deleted,
    /// Another server took the room over (this server's lease lapsed): nothing more is
    /// written, and clients reconnect to the new owner.
    Moved,
}

pub(crate) struct Room {
    id: String,
    deps: RoomDeps,
    /// This server's lease on the room: every append and compaction carries its token.
    lease: crate::store::Lease,
    /// Until when the lease is known to hold (from before the last renewal was asked).
    lease_until: Instant,
    /// A write was refused for a stale lease: the room ends at the next turn of its loop.
    moved: bool,
    doc: Doc,
    /// Updates produced by the doc's transactions, waiting to be logged.
    produced: Arc<Mutex<Vec<Vec<u8>>>>,
    conns: HashMap<ConnId, Conn>,
    presence: HashMap<ClientID, Presence>,
    /// Last clocks of departed presence ids, so relayed stale states do not resurrect them.
    tombstones: Tombstones,
    next_seq: i64,
    logged_since_snapshot: u64,
    /// Snapshot plus logged updates, the figure the document size cap applies to.
    stored_bytes: usize,
    /// The document's state vector when the current batch began: what a connection that falls
    /// behind during the batch is known to have been sent.
    batch_sv: StateVector,
    /// The departures mark ([`Tombstones::mark`]) at the start of the batch: a connection that
    /// falls behind on this batch's broadcasts missed its departures too.
    batch_departures: u64,
    /// Updates produced this batch: (seq, bytes, origin connection; none for the room's own,
    /// which everyone is sent).
    batch: Vec<(i64, Bytes, Option<ConnId>)>,
    /// Files that left the document, so edits made to them meanwhile are carried, not lost.
    departed: crate::room::departed::Departed,
    /// Small replies built while handling (join greetings).
    replies: Vec<(Target, Bytes)>,
    /// Sync step 1 requests of this batch, one per connection, answered after the commit. Built
    /// there, one at a time, each checked against its connection's budget as soon as it exists,
    /// so a flood of requests never holds many copies of the document.
    sync_requests: Vec<(ConnId, StateVector)>,
    /// Connections that asked for (or just joined and need) the full presence table.
    presence_queries: HashSet<ConnId>,
    /// Presence changes of this batch, coalesced per client id, broadcast after the commit.
    presence_changes: HashMap<ClientID, AwarenessUpdateEntry>,
    /// Refused edits of this batch by connection: (user, count), audited after the commit.
    denials: HashMap<ConnId, (String, u64)>,
    /// When each connection's refusals were last audited.
    denials_audited: HashMap<ConnId, i64>,
    audits_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections refused this batch; nothing more of theirs is handled.
    closing: Vec<(ConnId, Option<&'static str>)>,
    /// Whether the room has refused growth since it last compacted below its cap.
    full: bool,
    /// Connections told that the room is full (once each, while it is).
    told_full: HashSet<ConnId>,
    /// Connections told that an edit of theirs was refused for want of `edit` (once each).
    told_not_kept: HashSet<ConnId>,
    /// A deletion landed while the room was refusing growth: compact after this batch, which is
    /// what gives the space back.
    shrink_pending: bool,
    /// When the room last compacted for a deletion: at most once a second (each compaction
    /// encodes the whole document, and deletions are cheap to send).
    last_shrink: Option<Instant>,
    /// When the server decided to close each connection of `closing` that lost `observe`.
    close_decided: HashMap<ConnId, Instant>,
    refused: HashSet<ConnId>,
}

impl Room {
    /// Loads the room's document from storage.
    pub(crate) async fn load(id: String, deps: RoomDeps) -> Result<Room, LoadError> {
        // Ownership first, then the log: whatever a previous owner appended under its lease is
        // in the log before this load reads it (its later appends are refused).
        let asked = Instant::now();
        let lease = match deps
            .store
            .claim_room(&id, &deps.server, deps.lease_ms)
            .await?
        {
            crate::store::Claim::Won(lease) => lease,
            crate::store::Claim::Held(owner) => return Err(LoadError::Elsewhere(owner)),
        };
        let lease_until = asked + lease_duration(deps.lease_ms);
        let stored = match deps.store.load_doc(&id).await {
            Ok(stored) => stored,
            Err(e) => {
                let _ = deps.store.release_room(&id, lease).await;
                return Err(e.into());
            }
        };
        // Fail closed: a room loaded without part of its history would compact that loss into
        // its next snapshot and delete the log that still holds it.
        let (doc, stored_bytes) = match doc_from_stored(&stored) {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::error!(room = %id, error = %e, "stored document is corrupt; room not loaded");
                let _ = deps.store.release_room(&id, lease).await;
                return Err(e.into());
            }
        };
        let next_seq = stored
            .updates
            .last()
            .map_or(stored.snapshot_seq, |(seq, _)| *seq)
            + 1;
        let produced: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let sink = produced.clone();
        observe_produced(&doc, sink, deps.limits.encode_after_merge)
            .map_err(|_| LoadError::Observe)?;
        Ok(Room {
            id,
            deps,
            lease,
            lease_until,
            moved: false,
            doc,
            produced,
            conns: HashMap::new(),
            presence: HashMap::new(),
            tombstones: Tombstones::default(),
            next_seq,
            logged_since_snapshot: stored.updates.len() as u64,
            stored_bytes,
            batch_sv: StateVector::default(),
            batch_departures: 0,
            batch: Vec::new(),
            departed: Default::default(),
            replies: Vec::new(),
            sync_requests: Vec::new(),
            presence_queries: HashSet::new(),
            presence_changes: HashMap::new(),
            closing: Vec::new(),
            full: false,
            told_full: HashSet::new(),
            told_not_kept: HashSet::new(),
            shrink_pending: false,
            last_shrink: None,
            close_decided: HashMap::new(),
            refused: HashSet::new(),
            denials: HashMap::new(),
            denials_audited: HashMap::new(),
            audits_in_flight: Arc::default(),
        })
    }

    /// The room's main loop. Returns when the room is idle long enough, at shutdown, or when
    /// storage keeps failing.
    ///
    /// `release` is called when the room has been idle for the configured delay and its log is
    /// compacted: it unregisters the room if no command is waiting, and returns whether it did.
    pub(crate) async fn run(
        mut self,
        rx: &mut mpsc::Receiver<RoomCmd>,
        release: &(dyn Fn(&mpsc::Receiver<RoomCmd>) -> bool + Send + Sync),
    ) -> Exit {
        let idle = Duration::from_millis(self.deps.limits.room_idle_ms);
        let mut idle_since = Some(tokio::time::Instant::now());
        let mut lagging = false;
        // The first renewal right away: a long load must not eat the lease.
        let mut renew = tokio::time::interval(lease_duration(self.deps.lease_ms) / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.moved {
                return self.finish(Exit::Moved).await;
            }
            let first = tokio::select! {
                cmd = rx.recv() => cmd,
                _ = renew.tick() => {
                    self.renew().await;
                    continue;
                }
                () = lag_tick(lagging) => {
                    lagging = self.catch_up();
                    continue;
                }
                () = sleep_until_ms(&self.deps.clock, self.next_expiry()) => {
                    self.expire(self.deps.clock.now_ms(), None);
                    if !self.commit().await {
                        return self.finish(Exit::Failed).await;
                    }
                    continue;
                }
                () = sleep_until_shrink(self.shrink_due()) => {
                    // A deletion in a full room waited out the once-a-second rule: compact now,
                    // not on the next command (which would be refused for want of the space).
                    self.shrink_pending = false;
                    self.last_shrink = Some(Instant::now());
                    self.compact().await;
                    continue;
                }
                () = sleep_until_idle(idle_since, idle) => {
                    if self.logged_since_snapshot > 0 {
                        self.compact().await;
                    }
                    if release(rx) {
                        crate::fault::point("room_unload").await;
                        return self.finish(Exit::Idle).await;
                    }
                    idle_since = Some(tokio::time::Instant::now());
                    continue;
                }
                () = self.deps.shutdown.cancelled() => {
                    // Edits already received are applied and logged before the room closes.
                    for _ in 0..ROOM_QUEUE {
                        match rx.try_recv() {
                            Ok(cmd) => self.handle(cmd),
                            Err(_) => break,
                        }
                    }
                    if !self.commit().await {
                        return self.finish(Exit::Failed).await;
                    }
                    return self.finish(Exit::Shutdown).await;
                }
            };
            let Some(first) = first else {
                return self.finish(Exit::Shutdown).await;
            };
            if let RoomCmd::Delete { done } = first {
                return self.delete(done);
            }
            self.batch_sv = self.doc.transact().state_vector();
            self.batch_departures = self.tombstones.mark();
            self.handle(first);
            let mut handled = 1;
            while handled < MAX_BATCH_COMMANDS {
                match rx.try_recv() {
                    // Nothing of this batch is logged once deletion is asked for.
                    Ok(RoomCmd::Delete { done }) => return self.delete(done),
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => break,
                }
                handled += 1;
            }
            if !self.commit().await {
                return self.finish(Exit::Failed).await;
            }
            if self.moved {
                return self.finish(Exit::Moved).await;
            }
            lagging = self.catch_up();
            idle_since = self.conns.is_empty().then(tokio::time::Instant::now);
            let shrink_now = self.shrink_pending
                && self.logged_since_snapshot > 0
                && self
                    .last_shrink
                    .is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
            if shrink_now {
                self.shrink_pending = false;
                self.last_shrink = Some(Instant::now());
            }
            if shrink_now || self.logged_since_snapshot >= self.deps.limits.compact_every {
                self.compact().await;
            }
        }
    }

    fn handle(&mut self, cmd: RoomCmd) {
        match cmd {
            RoomCmd::Join {
                conn,
                user_id,
                name,
                rights,
                out,
                reply,
            } => {
                if self.conns.len() >= self.deps.limits.max_connections_per_room {
                    let _ = reply.send(Err(JoinError::Full));
                    return;
                }
                tracing::debug!(room = %self.id, %conn, user = %user_id, "joined");
                self.conns.insert(
                    conn,
                    Conn {
                        identity: crate::room::presence::Identity::new(&user_id, &name),
                        user_id,
                        rights,
                        out,
                        awareness_ids: HashSet::new(),
                        lag_from: None,
                        lag_departures: 0,
                    },
                );
                self.deps.metrics.connections.inc();
                let _ = reply.send(Ok(()));
                // Like the reference server: our state vector first, so the client sends what we
                // lack, then everyone's presence.
                let sv = self.doc.transact().state_vector();
                self.reply(Target::One(conn), Message::Sync(SyncMessage::SyncStep1(sv)));
                self.presence_queries.insert(conn);
            }
            RoomCmd::Inbound { conn, messages } => {
                let started = Instant::now();
                for message in messages {
                    if !self.conns.contains_key(&conn) || self.refused.contains(&conn) {
                        break;
                    }
                    self.inbound(conn, message);
                }
                let took = started.elapsed().as_secs_f64();
                self.deps.metrics.stage_apply.observe(took);
            }
            RoomCmd::Leave { conn } => self.leave(conn),
            RoomCmd::Access {
                user_id,
                rights,
                decided,
            } => self.access(&user_id, rights, decided),
            // Handled by the loop before anything else of its batch.
            RoomCmd::Delete { done } => {
                let _ = done.send(0);
            }
            #[cfg(test)]
            RoomCmd::Panic => panic!("room panic requested by test"),
        }
    }

    fn inbound(&mut self, conn: ConnId, message: Inbound) {
        match message {
            Inbound::SyncStep1(sv) => {
                if !self.sync_requests.iter().any(|(c, _)| *c == conn) {
                    self.sync_requests.push((conn, sv));
                }
            }
            Inbound::Update { update, bytes } => self.apply(conn, update, &bytes),
            Inbound::Awareness(update) => self.awareness(conn, update),
            Inbound::AwarenessQuery => {
                self.presence_queries.insert(conn);
            }
        }
    }

    fn access(&mut self, user_id: &str, rights: Rights, decided: Instant) {
        for c in self.conns.values_mut().filter(|c| c.user_id == user_id) {
            c.rights = rights;
        }
        self.expire(self.deps.clock.now_ms(), Some((user_id, decided)));
    }

    /// Closes connections whose user may no longer observe. `decided` is the user whose right
    /// the server just took away, and when; for any other connection (a grant lapsed) the
    /// moment it lapsed counts.
    fn expire(&mut self, now: i64, decided: Option<(&str, Instant)>) {
        let gone: Vec<(ConnId, Instant)> = self
            .conns
            .iter()
            .filter(|(id, c)| !c.rights.may_observe(now) && !self.refused.contains(*id))
            .map(|(id, c)| {
                let at = match decided {
                    Some((user, at)) if user == c.user_id => at,
                    _ => {
                        let end = c.rights.observe.ends_at().unwrap_or(now);
                        let late = u64::try_from(now.saturating_sub(end)).unwrap_or(0);
                        Instant::now()
                            .checked_sub(Duration::from_millis(late))
                            .unwrap_or_else(Instant::now)
                    }
                };
                (*id, at)
            })
            .collect();
        for (id, at) in gone {
            self.refused.insert(id);
            // `None`: removed (4003), not refused.
            self.closing.push((id, None));
            self.close_decided.insert(id, at);
        }
    }

    /// The next moment a connection's `observe` lapses, if any.
    fn next_expiry(&self) -> Option<i64> {
        self.conns
            .values()
            .filter_map(|c| c.rights.observe.ends_at())
            .min()
    }

    fn apply(&mut self, conn: ConnId, update: Update, bytes: &[u8]) {
        let len = bytes.len();
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let inserts = update.insertions(true);
        let have = self.doc.transact().state_vector();
        // Content the room already has is nothing new: a client's sync step 2 (on every
        // reconnect) repeats all it has.
        let have_all = inserts
            .iter()
            .all(|(client, ranges)| ranges.iter().all(|r| r.end <= have.get(client)));
        if !c.rights.may_act(self.deps.clock.now_ms()) {
            // Refused, not fatal: the connection keeps receiving, the document is untouched.
            // An empty update (a viewer's sync step 2 with nothing new) changes nothing.
            if !update.is_empty() {
                self.deps.metrics.updates_denied.inc();
                let user = c.user_id.clone();
                self.denials.entry(conn).or_insert((user, 0)).1 += 1;
                // Told once, so its page can drop what was not kept (stock clients log it);
                // only for content the room lacks, not a reconnect repeating what it has.
                if !have_all && self.told_not_kept.insert(conn) {
                    self.reply(Target::One(conn), Message::Auth(Some(NOT_KEPT.into())));
                }
            }
            return;
        }
        // Deletions and nothing else (an empty update, such as a sync step 2 with nothing new,
        // is neither).
        let deletes_only = inserts.is_empty() && !update.delete_set().is_empty();
        let at_cap = self.stored_bytes.saturating_add(len) > self.deps.limits.max_doc_bytes;
        // At the cap, growth is refused; so is a delete set of many ranges, which splits the
        // text into as many blocks (a cheap way to grow the document without inserting).
        let many_deletes = || {
            update
                .delete_set()
                .iter()
                .map(|(_, ranges)| ranges.iter().count())
                .sum::<usize>()
                > MAX_DELETE_RANGES_AT_CAP
        };
        if at_cap && (!have_all || many_deletes()) {
            self.refuse_growth(conn);
            return;
        }
        if crate::room::protocol::skips_clocks(&update, &have) {
            if self.full && self.told_full.contains(&conn) {
                // Most likely built on the growth the full room refused it: refused the same way
                // (never applied), without closing, or a stock client would reconnect and
                // resend on every edit.
                self.refuse_growth(conn);
                return;
            }
            tracing::info!(room = %self.id, %conn, "update skips clocks");
            self.refuse(conn, "update depends on missing content");
            return;
        }
        let ds = update.delete_set().clone();
        // Files this update removes from the map, read before it does.
        let departing = if ds.is_empty() {
            Vec::new()
        } else {
            crate::room::departed::departing(&self.doc, &ds)
        };
        let applied = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut txn = self.doc.transact_mut();
            let result = txn.apply_update(update);
            // Parts that reference content the room does not have would wait in yrs's pending
            // store: unlogged, unbounded, and leaked into every sync reply. Drop them instead;
            // a client whose update depended on them is out of step and must resync.
            let dangling = txn.prune_pending().is_some();
            // What it added that is deleted at once though it did not delete it: content typed
            // into a text that is gone (yrs integrates it there as deleted).
            let lost = txn.insert_set().intersect(txn.delete_set()).diff(&ds);
            (result, dangling, lost)
        }));
        let mut lost = yrs::IdSet::new();
        match applied {
            Ok((Ok(()), false, l)) => lost = l,
            Ok((Ok(()), true, _)) => {
                tracing::info!(room = %self.id, %conn, "update depends on missing content");
                self.refuse(conn, "update depends on missing content");
            }
            Ok((Err(e), _, _)) => {
                tracing::warn!(room = %self.id, %conn, error = %e, "update does not apply");
                self.refuse(conn, "malformed update");
            }
            Err(_) => {
                // The document may be half-changed: nothing from this update has been logged,
                // so restart the room from storage (resume_unwind lets the supervisor see it).
                tracing::error!(room = %self.id, %conn, "applying an update panicked");
                self.drain_produced();
                std::panic::resume_unwind(Box::new("update application panicked"));
            }
        }
        let produced = self.drain_produced();
        if deletes_only && self.full && !produced.is_empty() {
            // The room refused growth: a deletion that changed something is what frees space,
            // once compacted.
            self.shrink_pending = true;
        }
        self.log(produced, Some(conn));
        if !departing.is_empty()
            || !lost.is_empty()
            || (!ds.is_empty() && !self.departed.is_empty())
        {
            let now = self.deps.clock.now_ms();
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut o = crate::room::departed::Outcome::default();
                if !departing.is_empty() {
                    o = self.departed.depart(&self.doc, departing, &ds, &inserts);
                }
                let more = self
                    .departed
                    .carry(&self.doc, bytes, &lost, &ds, &inserts, now);
                o.carried += more.carried;
                o.unplaced += more.unplaced;
                o.restored.extend(more.restored);
                o
            }));
            match outcome {
                Ok(o) => {
                    let m = &self.deps.metrics;
                    m.edits_carried.inc_by(o.carried);
                    m.edits_unplaced.inc_by(o.unplaced);
                    if o.carried + o.unplaced > 0 {
                        tracing::info!(room = %self.id, %conn, carried = o.carried, unplaced = o.unplaced, restored = ?o.restored, "carried edits made to files that are gone");
                    }
                }
                Err(_) => {
                    tracing::error!(room = %self.id, %conn, "carrying edits to departed files panicked");
                    self.drain_produced();
                    std::panic::resume_unwind(Box::new("carrying edits panicked"));
                }
            }
            let produced = self.drain_produced();
            self.log(produced, None);
        }
    }

    /// Queues updates produced by the document for the log and the broadcast.
    fn log(&mut self, produced: Vec<Vec<u8>>, origin: Option<ConnId>) {
        for update in produced {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.stored_bytes += update.len();
            self.batch.push((seq, Bytes::from(update), origin));
        }
    }

    /// When a pending shrink may run: a second after the last one.
    fn shrink_due(&self) -> Option<Instant> {
        (self.shrink_pending && self.logged_since_snapshot > 0).then(|| {
            self.last_shrink
                .map_or_else(Instant::now, |at| at + Duration::from_secs(1))
        })
    }

    fn drain_produced(&mut self) -> Vec<Vec<u8>> {
        match self.produced.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    /// Applies a presence update from `conn`.
    ///
    /// A connection owns the client ids it announced first. Stock y-websocket clients relay every
    /// presence change they receive, other clients' included, so entries for ids owned by
    /// another connection are relays: ignored, never an error, never applied (nobody can
    /// overwrite another connection's presence). Removals and stale states of departed ids
    /// (remembered as tombstones) are ignored likewise.
    fn awareness(&mut self, conn: ConnId, update: AwarenessUpdate) {
        let max_ids = self.deps.limits.max_awareness_clients_per_conn;
        for (client, entry) in update.clients {
            let removal = entry.json.as_ref() == "null";
            match self.presence.get(&client) {
                Some(p) if p.owner != conn => continue,
                Some(_) => {}
                None => {
                    let stale = self
                        .tombstones
                        .get(&client)
                        .is_some_and(|c| entry.clock <= c);
                    if removal || stale {
                        continue;
                    }
                    let Some(c) = self.conns.get_mut(&conn) else {
                        return;
                    };
                    if c.awareness_ids.len() >= max_ids {
                        self.refuse(conn, "too many awareness states");
                        return;
                    }
                    c.awareness_ids.insert(client);
                    self.tombstones.remove(&client);
                }
            }
            let json = if removal {
                None
            } else {
                let Some(c) = self.conns.get(&conn) else {
                    return;
                };
                match c.identity.stamp(&entry.json) {
                    Some(json) => Some(json),
                    None => {
                        self.refuse(conn, "malformed presence state");
                        return;
                    }
                }
            };
            let current = self.presence.get(&client);
            let newer = match current {
                None => true,
                Some(p) => {
                    p.clock < entry.clock
                        || (p.clock == entry.clock && json.is_none() && p.json.is_some())
                }
            };
            if newer {
                let entry = AwarenessUpdateEntry {
                    clock: entry.clock,
                    json: json.clone().unwrap_or(entry.json),
                };
                self.presence.insert(
                    client,
                    Presence {
                        clock: entry.clock,
                        json,
                        owner: conn,
                    },
                );
                self.presence_changes.insert(client, entry);
            }
        }
    }

    /// What a connection that was held back missed of presence: every current state, every
    /// state cleared meanwhile, and the removal of everyone who left since `departures` (a
    /// [`Tombstones::mark`]). Without the removals its client would show people who left until
    /// its own 30-second timeout.
    fn catch_up_presence(&self, departures: u64) -> Option<AwarenessUpdate> {
        let null = || -> std::sync::Arc<str> { "null".into() };
        let mut clients: HashMap<_, _> = self
            .presence
            .iter()
            .map(|(id, p)| {
                let json = p.json.clone().unwrap_or_else(null);
                (
                    *id,
                    AwarenessUpdateEntry {
                        clock: p.clock,
                        json,
                    },
                )
            })
            .collect();
        for (id, clock) in self.tombstones.since(departures) {
            clients.entry(id).or_insert(AwarenessUpdateEntry {
                clock,
                json: null(),
            });
        }
        (!clients.is_empty()).then_some(AwarenessUpdate { clients })
    }

    /// Every current presence state, `None` when there is none.
    fn presence_update(&self) -> Option<AwarenessUpdate> {
        let clients: HashMap<_, _> = self
            .presence
            .iter()
            .filter_map(|(id, p)| {
                let json = p.json.clone()?;
                Some((
                    *id,
                    AwarenessUpdateEntry {
                        clock: p.clock,
                        json,
                    },
                ))
            })
            .collect();
        (!clients.is_empty()).then_some(AwarenessUpdate { clients })
    }

    fn leave(&mut self, conn: ConnId) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        self.deps.metrics.connections.dec();
        self.denials_audited.remove(&conn);
        self.told_full.remove(&conn);
        self.told_not_kept.remove(&conn);
        for client in c.awareness_ids {
            if let Some(p) = self.presence.remove(&client) {
                // Clocks come from clients: saturate rather than overflow.
                let clock = p.clock.saturating_add(1);
                self.tombstones.insert(client, clock);
                // A state already cleared by the client has its removal queued or sent.
                if p.json.is_some() {
                    let json = "null".into();
                    self.presence_changes
                        .insert(client, AwarenessUpdateEntry { clock, json });
                }
            }
        }
    }

    fn reply(&mut self, target: Target, message: Message) {
        self.replies
            .push((target, Bytes::from(message.encode_v1())));
    }

    /// The room is full: growth is refused, but the connection stays (a stock client whose
    /// socket closed would reconnect and resend the same growth in a loop; this one keeps
    /// reading, and can still delete). It is told once, with y-protocols' permission-denied
    /// message, which stock clients log and Coderoom's browser client shows.
    fn refuse_growth(&mut self, conn: ConnId) {
        self.deps.metrics.updates_refused_full.inc();
        self.full = true;
        if self.told_full.insert(conn) {
            self.reply(Target::One(conn), Message::Auth(Some(ROOM_FULL.into())));
        }
    }

    /// Refuses a connection's input (1008, saying what was refused): it gets nothing more.
    fn refuse(&mut self, conn: ConnId, why: &'static str) {
        self.deps.metrics.protocol_errors.inc();
        if self.refused.insert(conn) {
            self.closing.push((conn, Some(why)));
        }
    }

    /// Appends the batch, then releases replies and broadcasts. Returns false when storage
    /// failed for good; nothing of the failed batch was sent to anyone.
    async fn commit(&mut self) -> bool {
        if !self.batch.is_empty() {
            let started = Instant::now();
            let rows: Vec<(i64, &[u8])> = self
                .batch
                .iter()
                .map(|(seq, b, _)| (*seq, b.as_ref()))
                .collect();
            let mut attempt = 0;
            loop {
                attempt += 1;
                match self
                    .deps
                    .store
                    .append_updates(&self.id, self.lease, &rows)
                    .await
                {
                    Ok(()) => break,
                    Err(StoreError::Fenced) => {
                        // Another server owns the room now: nothing of this batch was logged,
                        // so nothing of it is sent; its clients resend it to the new owner.
                        tracing::warn!(room = %self.id, "another server took the room over; closing it here");
                        self.moved = true;
                        self.batch.clear();
                        self.replies.clear();
                        self.sync_requests.clear();
                        self.presence_changes.clear();
                        return true;
                    }
                    Err(e) if attempt < PERSIST_ATTEMPTS => {
                        tracing::warn!(room = %self.id, error = %e, attempt, "update log append failed, retrying");
                        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    }
                    Err(e) => {
                        tracing::error!(room = %self.id, error = %e, "update log append failed; restarting room");
                        return false;
                    }
                }
            }
            let m = &self.deps.metrics;
            m.persist_seconds.observe(started.elapsed().as_secs_f64());
            m.stage_commit.observe(started.elapsed().as_secs_f64());
            m.updates_applied.inc_by(self.batch.len() as u64);
            m.bytes_persisted
                .inc_by(self.batch.iter().map(|(_, b, _)| b.len() as u64).sum());
            self.logged_since_snapshot += self.batch.len() as u64;
        }
        // Refused connections get nothing more: close them first.
        for (conn, refused) in std::mem::take(&mut self.closing) {
            let decided = self.close_decided.remove(&conn);
            if let Some(c) = self.conns.get(&conn) {
                match refused {
                    Some(why) => c.out.refuse(why),
                    None => c.out.close(CloseCode::Removed),
                }
                // Measured when the close is handed to the connection's writer.
                if let Some(at) = decided {
                    self.deps
                        .metrics
                        .access_close_seconds
                        .observe(at.elapsed().as_secs_f64());
                }
            }
            self.leave(conn);
        }
        self.refused.clear();
        // Replies next (they answer what a client asked), then the updates in log order, then
        // presence.
        for (target, bytes) in std::mem::take(&mut self.replies) {
            self.send(&target, &bytes);
        }
        for (conn, sv) in std::mem::take(&mut self.sync_requests) {
            if !self.conns.contains_key(&conn) {
                continue;
            }
            let diff = self.doc.transact().encode_state_as_update_v1(&sv);
            let frame = Bytes::from(Message::Sync(SyncMessage::SyncStep2(diff)).encode_v1());
            self.send(&Target::One(conn), &frame);
        }
        let queries = std::mem::take(&mut self.presence_queries);
        if !queries.is_empty() {
            if let Some(update) = self.presence_update() {
                let frame = Bytes::from(Message::Awareness(update).encode_v1());
                for conn in queries {
                    self.send(&Target::One(conn), &frame);
                }
            }
        }
        let started = Instant::now();
        let batch = std::mem::take(&mut self.batch);
        let broadcast = !batch.is_empty();
        for (_, update, origin) in batch {
            let frame =
                Bytes::from(Message::Sync(SyncMessage::Update(update.to_vec())).encode_v1());
            match origin {
                Some(origin) => self.send(&Target::AllBut(origin), &frame),
                None => self.send(&Target::All, &frame),
            }
        }
        if broadcast {
            let took = started.elapsed().as_secs_f64();
            self.deps.metrics.stage_broadcast.observe(took);
        }
        self.flush_presence();
        self.audit_denials();
        true
    }

    /// Audits refused edits: a connection's first refusal at once, later ones summed at most
    /// once a minute, with a few appends in flight per room at most, so a flood of refused
    /// edits can neither grow memory nor fill the chain.
    fn audit_denials(&mut self) {
        let now = self.deps.clock.now_ms();
        let due: Vec<ConnId> = self
            .denials
            .keys()
            .filter(|c| {
                self.denials_audited
                    .get(*c)
                    .is_none_or(|t| now - t >= DENIAL_AUDIT_EVERY_MS)
            })
            .copied()
            .collect();
        for conn in due {
            if self
                .audits_in_flight
                .load(std::sync::atomic::Ordering::Acquire)
                >= MAX_AUDITS_IN_FLIGHT
            {
                return;
            }
            let Some((user, count)) = self.denials.remove(&conn) else {
                continue;
            };
            self.denials_audited.insert(conn, now);
            let (audit, room) = (self.deps.audit.clone(), self.id.clone());
            let in_flight = self.audits_in_flight.clone();
            in_flight.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            // Off the room task: the append waits on the audit lock and the database.
            self.deps.tracker.spawn(async move {
                let details = serde_json::json!({ "updates_refused": count, "connection": conn });
                let reason = "missing capability edit";
                if let Err(e) = audit
                    .record(&room, &user, "edit", "deny", reason, details, Change::None)
                    .await
                {
                    tracing::error!(room = %room, error = %e, "cannot audit a refused edit");
                }
                in_flight.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            });
        }
    }

    /// Broadcasts this batch's presence changes (and the departures of dropped connections),
    /// to everyone: y-websocket clients treat any message as keep-alive, and their own
    /// presence echo is harmless.
    fn flush_presence(&mut self) {
        // Dropping a slow connection adds its departure; a few rounds settle it.
        for _ in 0..4 {
            if self.presence_changes.is_empty() {
                return;
            }
            let clients = std::mem::take(&mut self.presence_changes);
            let frame = Bytes::from(Message::Awareness(AwarenessUpdate { clients }).encode_v1());
            self.send(&Target::All, &frame);
        }
    }

    fn send(&mut self, target: &Target, frame: &Bytes) {
        let class = match target {
            Target::One(_) => Class::Reply,
            Target::All | Target::AllBut(_) => Class::Broadcast,
        };
        let mut stuck = Vec::new();
        let mut behind = Vec::new();
        let mut deliver = |id: ConnId, c: &Conn| {
            if class == Class::Broadcast && c.lag_from.is_some() {
                return; // held back; caught up once its queue drains
            }
            if c.out.push(Outbound::Frame(class, frame.clone())).is_err() {
                match class {
                    Class::Broadcast => behind.push(id),
                    Class::Reply => stuck.push(id),
                }
            }
        };
        match target {
            Target::One(id) => {
                if let Some(c) = self.conns.get(id) {
                    deliver(*id, c);
                }
            }
            Target::All => self.conns.iter().for_each(|(id, c)| deliver(*id, c)),
            Target::AllBut(origin) => self
                .conns
                .iter()
                .filter(|(id, _)| *id != origin)
                .for_each(|(id, c)| deliver(*id, c)),
        }
        for id in behind {
            // It has been sent everything up to this batch; what follows waits.
            if let Some(c) = self.conns.get_mut(&id) {
                tracing::debug!(room = %self.id, conn = %id, "connection fell behind; holding broadcasts");
                self.deps.metrics.connections_held_back.inc();
                c.lag_from = Some(self.batch_sv.clone());
                c.lag_departures = self.batch_departures;
            }
        }
        for id in stuck {
            // A reply (a whole document at most) does not fit: the client is not reading.
            tracing::info!(room = %self.id, conn = %id, "dropping connection: outbound queue full");
            self.deps.metrics.connections_dropped_slow.inc();
            if let Some(c) = self.conns.get(&id) {
                c.out.kill();
            }
            self.leave(id);
        }
    }

    /// Sends lagging connections whose queues drained what they missed, in one update, and the
    /// presence table. Returns whether some connection is still behind.
    fn catch_up(&mut self) -> bool {
        let ready: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.lag_from.is_some() && c.out.broadcast_idle())
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            let Some((from, departures)) = self
                .conns
                .get_mut(&id)
                .and_then(|c| Some((c.lag_from.take()?, c.lag_departures)))
            else {
                continue;
            };
            let diff = self.doc.transact().encode_state_as_update_v1(&from);
            let frame = Bytes::from(Message::Sync(SyncMessage::Update(diff)).encode_v1());
            self.send(&Target::One(id), &frame);
            if let Some(update) = self.catch_up_presence(departures) {
                let frame = Bytes::from(Message::Awareness(update).encode_v1());
                self.send(&Target::One(id), &frame);
            }
        }
        self.conns.values().any(|c| c.lag_from.is_some())
    }

    /// Folds the update log into one snapshot.
    async fn compact(&mut self) {
        let upto = self.next_seq - 1;
        let snapshot = self
            .doc
            .transact()
            .encode_state_as_update_v1(&StateVector::default());
        match self
            .deps
            .store
            .compact(&self.id, self.lease, upto, &snapshot)
            .await
        {
            Ok(()) => {
                self.deps.metrics.compactions.inc();
                self.logged_since_snapshot = 0;
                self.stored_bytes = snapshot.len();
                if self.full && self.stored_bytes < self.deps.limits.max_doc_bytes {
                    // Room again: whoever is refused next is told again.
                    self.full = false;
                    self.told_full.clear();
                }
            }
            Err(StoreError::Fenced) => {
                tracing::warn!(room = %self.id, "another server took the room over; closing it here");
                self.moved = true;
            }
            Err(e) => tracing::warn!(room = %self.id, error = %e, "compaction failed; log kept"),
        }
    }

    /// Renews the room's lease. A lease another server took over, or one that could not be
    /// renewed before it lapsed, ends the room here.
    async fn renew(&mut self) {
        let asked = Instant::now();
        // Never waits past the lease: a database that does not answer ends the room in time.
        let left = self.lease_until.saturating_duration_since(asked);
        let renewed = tokio::time::timeout(
            left,
            self.deps
                .store
                .renew_room(&self.id, self.lease, self.deps.lease_ms),
        )
        .await
        .unwrap_or(Err(StoreError::Closed(
            "the lease renewal did not answer in time",
        )));
        match renewed {
            Ok(true) => self.lease_until = asked + lease_duration(self.deps.lease_ms),
            Ok(false) => {
                tracing::warn!(room = %self.id, "the room's lease was taken over; closing it here");
                self.moved = true;
            }
            Err(e) if Instant::now() >= self.lease_until => {
                tracing::error!(room = %self.id, error = %e, "cannot renew the room's lease before it lapses; closing it here");
                self.moved = true;
            }
            Err(e) => {
                tracing::warn!(room = %self.id, error = %e, "cannot renew the room's lease; retrying")
            }
        }
    }

    fn delete(self, done: oneshot::Sender<usize>) -> Exit {
        for c in self.conns.values() {
            c.out.close(CloseCode::Deleted);
        }
        let _ = done.send(self.conns.len());
        Exit::Deleted
    }

    async fn finish(mut self, exit: Exit) -> Exit {
        if exit == Exit::Shutdown && self.logged_since_snapshot > 0 {
            self.compact().await;
        }
        if exit == Exit::Moved {
            self.deps.metrics.rooms_moved.inc();
        }
        let code = match exit {
            Exit::Shutdown => CloseCode::Away,
            Exit::Idle | Exit::Failed => CloseCode::Internal,
            Exit::Deleted => CloseCode::Deleted,
            Exit::Moved => CloseCode::Moved,
        };
        for c in self.conns.values() {
            c.out.close(code);
        }
        if exit != Exit::Moved && !self.moved {
            // Another server may load the room at once, not after the lease lapses.
            if let Err(e) = self.deps.store.release_room(&self.id, self.lease).await {
                tracing::warn!(room = %self.id, error = %e, "cannot release the room's lease; it lapses on its own");
            }
        }
        exit
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        // Runs on every exit, panics included, so the gauge never drifts.
        self.deps
            .metrics
            .connections
            .dec_by(self.conns.len() as i64);
    }
}

/// A lease length in milliseconds as a duration (a second at least).
fn lease_duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1000))
}

/// While a connection is behind, wakes the room often enough to catch it up soon after its
/// queue drains, even when nothing else happens.
async fn lag_tick(lagging: bool) {
    if lagging {
        tokio::time::sleep(Duration::from_millis(50)).await;
    } else {
        std::future::pending().await
    }
}

/// Sleeps until the given Unix millisecond (forever for `None`).
async fn sleep_until_ms(clock: &crate::clock::Clock, at: Option<i64>) {
    match at {
        Some(t) => {
            let wait = t.saturating_sub(clock.now_ms()).max(0);
            tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0) + 1)).await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until_shrink(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_idle(since: Option<tokio::time::Instant>, idle: Duration) {
    match since {
        Some(t) => tokio::time::sleep_until(t + idle).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;
    use yrs::{GetString, Text};

    /// A log of `n` updates, each appending ten characters to one text (as a typist would).
    fn log_of(n: usize) -> StoredDoc {
        let doc = Doc::new();
        let text = doc.get_or_insert_text("files/big.txt");
        let mut updates = Vec::with_capacity(n);
        for i in 0..n {
            let sv = doc.transact().state_vector();
            {
                let mut txn = doc.transact_mut();
                let end = text.len(&txn);
                text.insert(&mut txn, end, "0123456789");
            }
            updates.push((i as i64, doc.transact().encode_diff_v1(&sv)));
        }
        StoredDoc {
            snapshot: None,
            snapshot_seq: 0,
            updates,
        }
    }

    /// What `observe_produced` records for each transaction holds the same change as yrs's own
    /// `observe_update_v1`: replaying either list into a fresh document gives the same
    /// document after every transaction. The edits are the room's: texts inside the `files`
    /// map typed at the end and at the start, ranges deleted, a file (a map entry holding a
    /// text) removed, which yrs collects; remote updates inserting, deleting, and typing into a
    /// file the room has removed (integrated as deleted); and a remote update whose parts
    /// depend on content the room lacks, pruned from the pending store as the room does.
    #[test]
    fn produced_updates_match_yrs_own() {
        use yrs::types::ToJson;
        use yrs::{Map, MapRef, ReadTxn, TextPrelim, TextRef, Transact, Update};
        let doc = Doc::new();
        let ours: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        observe_produced(&doc, ours.clone(), false).unwrap();
        let theirs: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let sink = theirs.clone();
        doc.observe_update_v1("yrs", move |_, e| {
            sink.lock().unwrap().push(e.update.clone())
        })
        .unwrap();
        let files = doc.get_or_insert_map("files");
        let file = |d: &Doc, m: &MapRef, name: &str| -> Option<TextRef> {
            m.get(&d.transact(), name)
                .and_then(|v| v.cast::<TextRef>().ok())
        };
        // A remote peer that syncs with the room both ways.
        let remote = Doc::new();
        let rfiles = remote.get_or_insert_map("files");
        let sync = |from: &Doc, to: &Doc| {
            let u = from
                .transact()
                .encode_diff_v1(&to.transact().state_vector());
            to.transact_mut()
                .apply_update(Update::decode_v1(&u).unwrap())
                .unwrap();
        };
        let (a, b) = (Doc::new(), Doc::new());
        let mut replayed = 0;
        let mut check = |step: u32| {
            let ours = ours.lock().unwrap().clone();
            let theirs = theirs.lock().unwrap().clone();
            assert_eq!(
                ours.len(),
                theirs.len(),
                "step {step}: one update per change"
            );
            for (x, y) in ours[replayed..].iter().zip(&theirs[replayed..]) {
                a.transact_mut()
                    .apply_update(Update::decode_v1(x).unwrap())
                    .unwrap();
                b.transact_mut()
                    .apply_update(Update::decode_v1(y).unwrap())
                    .unwrap();
            }
            replayed = ours.len();
            let json = |d: &Doc| d.get_or_insert_map("files").to_json(&d.transact());
            assert_eq!(json(&a), json(&b), "step {step}");
            assert_eq!(json(&a), json(&doc), "step {step}");
            assert_eq!(a.transact().state_vector(), b.transact().state_vector());
            assert_eq!(
                a.transact().snapshot().delete_set,
                b.transact().snapshot().delete_set,
                "step {step}"
            );
        };
        for i in 0..120u32 {
            let name = format!("f{}", i % 5);
            match i % 8 {
                0 => {
                    // A new file, or typing at the end of one.
                    let mut t = doc.transact_mut();
                    match files.get(&t, &name).and_then(|v| v.cast::<TextRef>().ok()) {
                        Some(text) => {
                            let end = text.len(&t);
                            text.insert(&mut t, end, &format!("{i:04}é|"));
                        }
                        None => {
                            files.insert(&mut t, name.clone(), TextPrelim::new("start|"));
                        }
                    }
                }
                1 | 2 => {
                    if let Some(text) = file(&doc, &files, &name) {
                        let mut t = doc.transact_mut();
                        let end = text.len(&t);
                        text.insert(&mut t, end, &format!("{i:04}|"));
                        // Typed at the start (ASCII there: byte offsets split no character),
                        // and a range deleted.
                        text.insert(&mut t, 0, "ab");
                        text.remove_range(&mut t, 1, 2);
                    }
                }
                3 => {
                    // Typed and deleted in one transaction, which yrs collects.
                    if let Some(text) = file(&doc, &files, &name) {
                        let mut t = doc.transact_mut();
                        let end = text.len(&t);
                        text.insert(&mut t, end, "gone");
                        text.remove_range(&mut t, end, 4);
                    }
                }
                4 => {
                    // The remote peer types and deletes; the room applies it.
                    sync(&doc, &remote);
                    if let Some(text) = file(&remote, &rfiles, &name) {
                        let mut t = remote.transact_mut();
                        let end = text.len(&t);
                        text.insert(&mut t, end, "remote|");
                        if end > 3 {
                            text.remove_range(&mut t, 0, 1);
                        }
                    }
                    sync(&remote, &doc);
                }
                5 => {
                    // The remote peer types into a file the room removes meanwhile.
                    sync(&doc, &remote);
                    if let Some(text) = file(&remote, &rfiles, &name) {
                        {
                            let mut t = remote.transact_mut();
                            let end = text.len(&t);
                            text.insert(&mut t, end, "late|");
                        }
                        files.remove(&mut doc.transact_mut(), &name);
                        sync(&remote, &doc);
                    }
                }
                6 => {
                    // An update that depends on one the room never got: its parts go pending
                    // and are pruned, as the room does.
                    let third = Doc::new();
                    let tt = third.get_or_insert_text("orphan");
                    tt.insert(&mut third.transact_mut(), 0, "first");
                    let sv = third.transact().state_vector();
                    tt.insert(&mut third.transact_mut(), 5, "second");
                    let u = third.transact().encode_diff_v1(&sv);
                    let mut t = doc.transact_mut();
                    t.apply_update(Update::decode_v1(&u).unwrap()).unwrap();
                    assert!(t.prune_pending().is_some());
                }
                _ => {
                    // A transaction that changes nothing produces nothing.
                    drop(doc.transact_mut());
                }
            }
            check(i);
        }
        assert!(replayed >= 40, "{replayed} updates");
    }

    /// Loading a long log takes time in proportion to it (run with --release --ignored
    /// --nocapture to see the figures: 10k, 20k, 40k entries in 9.7, 29.3, 61.5 ms here; in
    /// one transaction they took 353, 1,369 and 11,849 ms).
    #[test]
    #[ignore = "measurement: run with --release --ignored --nocapture"]
    fn long_logs_load_in_proportion() {
        for n in [10_000, 20_000, 40_000] {
            let stored = log_of(n);
            let started = std::time::Instant::now();
            let (doc, _) = doc_from_stored(&stored).unwrap();
            let took = started.elapsed();
            let text = doc.get_or_insert_text("files/big.txt");
            assert_eq!(text.get_string(&doc.transact()).len(), n * 10);
            println!("{n} updates: {:.1} ms", took.as_secs_f64() * 1000.0);
        }
    }
}

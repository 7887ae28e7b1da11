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
use crate::ids::RoomId;
use crate::metrics::Metrics;
use crate::room::outbox::Outbox;
use crate::room::protocol::Inbound;
use crate::store::Store;
use bytes::Bytes;
use coderoom_authz::{Capability, Participant, RoomState, Until};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::protocol::{Message, SyncMessage};
use yrs::{ClientID, Doc, ReadTxn, StateVector, Transact};

mod frames;
mod load;
mod persist;

pub(crate) use load::{doc_from_stored, LoadError};

/// Commands waiting for a room; senders wait (backpressure) when it is full.
pub(crate) const ROOM_QUEUE: usize = 1024;
/// Commands handled before the batch is committed, so one huge burst still commits regularly.
const MAX_BATCH_COMMANDS: usize = 512;
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
        /// Whether the file operations this connection makes are journaled (audited, deleted
        /// files kept): people's and agents' are; the server's own sync of the workspace and a
        /// checkpoint's restore (audited as what they are) are not.
        journaled: bool,
        out: Outbox,
        reply: oneshot::Sender<Result<(), JoinError>>,
    },
    Inbound {
        conn: ConnId,
        messages: Vec<Inbound>,
        /// When its socket handed it over (`doc_stage_seconds{stage="receive"}`).
        received: Instant,
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
    /// Where participants' file operations go (none: not journaled).
    pub journal: Option<crate::room::journal::Journal>,
}

struct Conn {
    user_id: String,
    /// Stamped into every presence state this connection announces.
    identity: crate::room::presence::Identity,
    /// Until when this connection's user may edit and observe.
    rights: Rights,
    /// Whether its file operations are journaled (see [`RoomCmd::Join`]).
    journaled: bool,
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

/// A room summarises file operations it did not journal one by one at most this often.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

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
    id: RoomId,
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
    /// The departures mark when presence was last flushed: every departure before it has been
    /// sent to each connection not held back then.
    presence_sent: u64,
    /// Updates produced this batch: (seq, bytes, origin connection; none for the room's own,
    /// which everyone is sent).
    batch: Vec<(i64, Bytes, Option<ConnId>)>,
    /// Files that left the document, so edits made to them meanwhile are carried, not lost.
    departed: crate::room::departed::Departed,
    /// Paths added to and removed from the document, read off each update (the journal).
    file_keys: crate::room::journal::Keys,
    /// How many file operations the room may still journal one by one.
    journal_budget: crate::room::journal::Budget,
    /// File operations not journaled one by one, per actor, until summarised.
    unrecorded: crate::room::journal::Unrecorded,
    /// When the last summary of them was queued (at most one per [`SUMMARY_EVERY`]).
    last_summary: Option<Instant>,
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

impl RoomCmd {
    /// A connection's messages, handed over now.
    pub(crate) fn inbound(conn: ConnId, messages: Vec<Inbound>) -> Self {
        RoomCmd::Inbound {
            conn,
            messages,
            received: Instant::now(),
        }
    }
}

impl Room {
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
                journaled,
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
                        journaled,
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
            RoomCmd::Inbound {
                conn,
                messages,
                received,
            } => {
                let started = Instant::now();
                self.deps
                    .metrics
                    .stage_receive
                    .observe(started.saturating_duration_since(received).as_secs_f64());
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

    fn delete(self, done: oneshot::Sender<usize>) -> Exit {
        for c in self.conns.values() {
            c.out.close(CloseCode::Deleted);
        }
        let _ = done.send(self.conns.len());
        Exit::Deleted
    }

    async fn finish(mut self, exit: Exit) -> Exit {
        // What was not journaled one by one is summarised before the room goes.
        self.last_summary = None;
        self.flush_unrecorded();
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

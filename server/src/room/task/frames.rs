//! Frames: what a connection sends (document updates, presence) checked and applied, and
//! what the room sends back (replies, broadcasts, catch-ups of connections that fell behind).

use super::{Conn, ConnId, Presence, Room, Target, NOT_KEPT, ROOM_FULL};
use crate::room::outbox::{Class, Outbound};
use crate::room::protocol::Inbound;
use bytes::Bytes;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::time::Instant;
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::protocol::{Message, SyncMessage};
use yrs::sync::AwarenessUpdate;
use yrs::updates::encoder::Encode;
use yrs::{ReadTxn, Transact, Update, WriteTxn};

/// Delete ranges one update may carry into a room at its size cap.
const MAX_DELETE_RANGES_AT_CAP: usize = 1024;

impl Room {
    pub(super) fn inbound(&mut self, conn: ConnId, message: Inbound) {
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
        // Whatever earlier transactions did to paths is not this update's.
        self.file_keys.take();
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
        let mut paired = crate::room::departed::Outcome::default();
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
                    paired = o;
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
        self.journal(conn, paired);
    }

    /// Hands the file operations of the update `conn` just sent to the journal, within the
    /// room's budget; the rest are counted, to be recorded as a summary.
    fn journal(&mut self, conn: ConnId, paired: crate::room::departed::Outcome) {
        use crate::room::journal::{ops_of, FileChanges};
        let seen = self.file_keys.take();
        if seen.is_empty() && paired.moved.is_empty() {
            return;
        }
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if !c.journaled || self.deps.journal.is_none() {
            return;
        }
        let actor = c.user_id.clone();
        let mut ops = ops_of(&seen, paired.moved, paired.deleted, &paired.restored);
        let allowed = self.journal_budget.take(ops.len(), Instant::now());
        let over = (ops.len() - allowed) as u64 + seen.overflow;
        if over > 0 {
            tracing::info!(room = %self.id, %conn, over, "file operations past the room's journal budget: summarised");
        }
        ops.truncate(allowed);
        self.unrecorded.add(&actor, over);
        if ops.is_empty() {
            return;
        }
        let changes = FileChanges {
            room: self.id.clone(),
            unrecorded: self.unrecorded.take(&actor),
            actor,
            at: self.deps.clock.now_ms(),
            ops,
        };
        self.offer_journal(changes);
    }

    /// Queues `changes`, never waiting on the room task: a full queue counts them instead.
    pub(super) fn offer_journal(&mut self, changes: crate::room::journal::FileChanges) {
        let Some(journal) = &self.deps.journal else {
            return;
        };
        if let Err(back) = journal.offer(changes) {
            let n = back.ops.len() as u64 + back.unrecorded;
            self.unrecorded.add(&back.actor, n);
        }
    }

    /// Queues the summaries of operations not journaled one by one: after a batch, at most
    /// once per [`super::SUMMARY_EVERY`], and when the room goes.
    pub(super) fn flush_unrecorded(&mut self) {
        let actors = self.unrecorded.actors();
        if actors.is_empty()
            || self
                .last_summary
                .is_some_and(|t| t.elapsed() < super::SUMMARY_EVERY)
        {
            return;
        }
        self.last_summary = Some(Instant::now());
        for actor in actors {
            let n = self.unrecorded.take(&actor);
            let changes = crate::room::journal::FileChanges {
                room: self.id.clone(),
                actor,
                at: self.deps.clock.now_ms(),
                ops: Vec::new(),
                unrecorded: n,
            };
            self.offer_journal(changes);
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
    pub(super) fn presence_update(&self) -> Option<AwarenessUpdate> {
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

    pub(super) fn reply(&mut self, target: Target, message: Message) {
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
    pub(super) fn refuse(&mut self, conn: ConnId, why: &'static str) {
        self.deps.metrics.protocol_errors.inc();
        if self.refused.insert(conn) {
            self.closing.push((conn, Some(why)));
        }
    }

    /// Broadcasts this batch's presence changes (and the departures of dropped connections),
    /// to everyone: y-websocket clients treat any message as keep-alive, and their own
    /// presence echo is harmless.
    pub(super) fn flush_presence(&mut self) {
        // Dropping a slow connection adds its departure; a few rounds settle it.
        for _ in 0..4 {
            if self.presence_changes.is_empty() {
                // Every departure so far has been sent to everyone not held back.
                self.presence_sent = self.tombstones.mark();
                return;
            }
            let clients = std::mem::take(&mut self.presence_changes);
            let frame = Bytes::from(Message::Awareness(AwarenessUpdate { clients }).encode_v1());
            self.send(&Target::All, &frame);
        }
    }

    pub(super) fn send(&mut self, target: &Target, frame: &Bytes) {
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
                // Departures it may not have been sent: those of this batch, and any still
                // waiting for the next presence flush (a connection dropped between batches,
                // while another caught up).
                c.lag_departures = self.batch_departures.min(self.presence_sent);
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
    pub(super) fn catch_up(&mut self) -> bool {
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
}

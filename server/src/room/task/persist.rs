//! Persistence: the batch's updates appended under the room's lease before anything that
//! depends on them is sent (the durability rule), refused edits audited, the log compacted
//! into the snapshot, and the lease renewed.

use super::{lease_duration, ConnId, Room, Target};
use crate::close::CloseCode;
use crate::store::{Change, StoreError};
use bytes::Bytes;
use std::time::{Duration, Instant};
use yrs::sync::protocol::{Message, SyncMessage};
use yrs::updates::encoder::Encode;
use yrs::{ReadTxn, StateVector, Transact};

/// Attempts to append a batch before the room gives up and restarts from storage.
const PERSIST_ATTEMPTS: u32 = 3;

/// A connection's refused edits are audited at most this often (the first one at once).
const DENIAL_AUDIT_EVERY_MS: i64 = 60_000;

/// Audit appends of refused edits one room may have waiting.
const MAX_AUDITS_IN_FLIGHT: usize = 4;

impl Room {
    /// Queues updates produced by the document for the log and the broadcast.
    pub(super) fn log(&mut self, produced: Vec<Vec<u8>>, origin: Option<ConnId>) {
        for update in produced {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.stored_bytes += update.len();
            self.batch.push((seq, Bytes::from(update), origin));
        }
    }

    /// When a pending shrink may run: a second after the last one.
    pub(super) fn shrink_due(&self) -> Option<Instant> {
        (self.shrink_pending && self.logged_since_snapshot > 0).then(|| {
            self.last_shrink
                .map_or_else(Instant::now, |at| at + Duration::from_secs(1))
        })
    }

    pub(super) fn drain_produced(&mut self) -> Vec<Vec<u8>> {
        match self.produced.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    /// Appends the batch, then releases replies and broadcasts. Returns false when storage
    /// failed for good; nothing of the failed batch was sent to anyone.
    pub(super) async fn commit(&mut self) -> bool {
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
        self.flush_unrecorded();
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

    /// Folds the update log into one snapshot.
    pub(super) async fn compact(&mut self) {
        let started = Instant::now();
        self.compact_log().await;
        let took = started.elapsed().as_secs_f64();
        self.deps.metrics.stage_upkeep.observe(took);
    }

    async fn compact_log(&mut self) {
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
    pub(super) async fn renew(&mut self) {
        let asked = Instant::now();
        self.renew_lease(asked).await;
        let took = asked.elapsed().as_secs_f64();
        self.deps.metrics.stage_upkeep.observe(took);
    }

    async fn renew_lease(&mut self, asked: Instant) {
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
}

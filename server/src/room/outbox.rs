//! The bounded queue between a room and one connection's socket writer.
//!
//! Bounded by message count and by queued bytes. A push that would exceed a bound fails, and the
//! room then kills the connection: a client that stops reading is disconnected, it never grows
//! server memory.
//!
//! Bytes are counted in two classes. Broadcasts (other peers' edits and presence) get the
//! configured budget. Replies to the client's own requests (the sync step 2 that carries the
//! whole document to a joiner) get their own budget of one full document plus the broadcast
//! budget, so a joiner of a large, busy room is not cut off while it downloads the document,
//! and a client that keeps asking without reading is still bounded.

use crate::close::CloseCode;
use bytes::Bytes;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Messages queued for one connection, whatever their size.
const QUEUE_MESSAGES: usize = 4096;

#[derive(Debug)]
pub(crate) enum Outbound {
    Frame(Class, Bytes),
    Close(CloseCode, &'static str),
}

/// Which byte budget a frame counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Answers to this client's own requests.
    Reply,
    /// Everyone else's traffic.
    Broadcast,
}

struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    fn take(&self, len: usize) -> bool {
        let before = self.used.fetch_add(len, Ordering::AcqRel);
        if before + len > self.limit {
            self.used.fetch_sub(len, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn give(&self, len: usize) {
        self.used.fetch_sub(len, Ordering::AcqRel);
    }
}

struct Budgets {
    reply: Budget,
    broadcast: Budget,
    /// Bytes queued across every connection (`coderoom_outbound_queued_bytes`).
    queued: Gauge,
}

impl Drop for Budgets {
    fn drop(&mut self) {
        // A connection dropped with frames still queued: they are freed with it.
        let left =
            self.reply.used.load(Ordering::Acquire) + self.broadcast.used.load(Ordering::Acquire);
        self.queued.dec_by(i64::try_from(left).unwrap_or(i64::MAX));
    }
}

impl Budgets {
    fn of(&self, class: Class) -> &Budget {
        match class {
            Class::Reply => &self.reply,
            Class::Broadcast => &self.broadcast,
        }
    }
}

/// The queue was full: the connection is not keeping up.
#[derive(Debug)]
pub(crate) struct Stuck;

/// Room left in an emptied queue: a queue that grew for a burst (a room's joins, everyone's
/// presence at once) gives the rest back, so an idle connection keeps a few slots, not the
/// burst's (a channel's blocks of 32 slots stayed allocated: most of an idle connection's
/// cost, docs/benchmarks.md).
const KEEP_SLOTS: usize = 4;

/// What the room's handles and the connection's writer share.
struct Shared {
    queue: std::sync::Mutex<std::collections::VecDeque<(Outbound, std::time::Instant)>>,
    /// Wakes the writer: something was queued, or the last handle went.
    wake: tokio::sync::Notify,
    budgets: Budgets,
    /// Handles ([`Outbox`]) alive; none left and nothing queued ends the writer.
    senders: AtomicUsize,
    /// The writer ([`OutboxRx`]) is gone: nothing more is taken.
    writer_gone: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn queue(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(Outbound, std::time::Instant)>> {
        // Nothing panics while holding it; a poisoned queue is still a queue.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `msg` unless the queue is full or the writer is gone.
    fn enqueue(&self, msg: Outbound) -> Result<(), Stuck> {
        if self.writer_gone.load(Ordering::Acquire) {
            return Err(Stuck);
        }
        {
            let mut q = self.queue();
            if q.len() >= QUEUE_MESSAGES {
                return Err(Stuck);
            }
            q.push_back((msg, std::time::Instant::now()));
        }
        self.wake.notify_one();
        Ok(())
    }
}

pub(crate) struct Outbox {
    shared: Arc<Shared>,
    kill: CancellationToken,
    /// Cancelled once a close was requested: the connection's reader stops taking input.
    closing: CancellationToken,
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::AcqRel);
        Outbox {
            shared: self.shared.clone(),
            kill: self.kill.clone(),
            closing: self.closing.clone(),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last handle: the writer sends what is queued, then ends.
            self.shared.wake.notify_one();
        }
    }
}

pub(crate) struct OutboxRx {
    shared: Arc<Shared>,
    kill: CancellationToken,
}

impl Drop for OutboxRx {
    fn drop(&mut self) {
        self.shared.writer_gone.store(true, Ordering::Release);
    }
}

impl Outbox {
    /// `broadcast_bytes`: the configured per-connection budget; `max_doc_bytes`: the largest
    /// document a reply can carry; `queued`: the process-wide gauge of queued bytes.
    pub(crate) fn new(
        broadcast_bytes: usize,
        max_doc_bytes: usize,
        queued: Gauge,
    ) -> (Outbox, OutboxRx) {
        let shared = Arc::new(Shared {
            queue: std::sync::Mutex::new(std::collections::VecDeque::new()),
            wake: tokio::sync::Notify::new(),
            budgets: Budgets {
                reply: Budget {
                    used: AtomicUsize::new(0),
                    // A sync step 2 is the whole document plus a little framing.
                    limit: max_doc_bytes.saturating_add(broadcast_bytes),
                },
                broadcast: Budget {
                    used: AtomicUsize::new(0),
                    limit: broadcast_bytes,
                },
                queued,
            },
            senders: AtomicUsize::new(1),
            writer_gone: std::sync::atomic::AtomicBool::new(false),
        });
        let kill = CancellationToken::new();
        (
            Outbox {
                shared: shared.clone(),
                kill: kill.clone(),
                closing: CancellationToken::new(),
            },
            OutboxRx { shared, kill },
        )
    }

    /// Queues a message without waiting.
    pub(crate) fn push(&self, msg: Outbound) -> Result<(), Stuck> {
        let charge = match &msg {
            Outbound::Frame(class, b) => Some((*class, b.len())),
            Outbound::Close(..) => None,
        };
        let budgets = &self.shared.budgets;
        if let Some((class, len)) = charge {
            if !budgets.of(class).take(len) {
                return Err(Stuck);
            }
            budgets.queued.inc_by(len as i64);
        }
        self.shared.enqueue(msg).inspect_err(|_| {
            if let Some((class, len)) = charge {
                budgets.of(class).give(len);
                budgets.queued.dec_by(len as i64);
            }
        })
    }

    /// Asks the writer to send a close frame after what is queued; kills the connection when
    /// even that cannot be queued.
    pub(crate) fn close(&self, code: CloseCode) {
        self.close_with(code, code.reason());
    }

    /// [`Self::close`] with 1008 and what was refused (the one code whose reason says more).
    pub(crate) fn refuse(&self, why: &'static str) {
        self.close_with(CloseCode::Policy, why);
    }

    fn close_with(&self, code: CloseCode, reason: &'static str) {
        self.closing.cancel();
        if self.shared.enqueue(Outbound::Close(code, reason)).is_err() {
            self.kill();
        }
    }

    /// Whether no broadcast bytes are waiting: a lagging connection has caught up with its
    /// queue and can be sent what it missed.
    pub(crate) fn broadcast_idle(&self) -> bool {
        self.shared.budgets.broadcast.used.load(Ordering::Acquire) == 0
    }

    /// Resolves once a close was requested (by the room or by the reader itself).
    pub(crate) fn closing(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.closing.cancelled()
    }

    /// Drops the connection at once, discarding what is queued.
    pub(crate) fn kill(&self) {
        self.kill.cancel();
    }
}

impl OutboxRx {
    /// The next message to write; `None` once the connection was killed or every sender is gone
    /// (the room unloaded or failed).
    pub(crate) async fn recv(&mut self) -> Option<Outbound> {
        self.recv_timed().await.map(|(msg, _)| msg)
    }

    /// [`Self::recv`], with how long the message waited in the queue.
    pub(crate) async fn recv_timed(&mut self) -> Option<(Outbound, std::time::Duration)> {
        loop {
            if self.kill.is_cancelled() {
                return None;
            }
            if let Some(next) = self.take() {
                return Some(next);
            }
            if self.shared.senders.load(Ordering::Acquire) == 0 {
                // Sent after the last look? Then it is still to write.
                return self.take();
            }
            // A push between the look above and this wait left a permit: no wake-up is lost.
            tokio::select! {
                biased;
                () = self.kill.cancelled() => return None,
                () = self.shared.wake.notified() => {}
            }
        }
    }

    /// The next message if one is already queued (with how long it waited), without waiting.
    pub(crate) fn try_recv_timed(&mut self) -> Option<(Outbound, std::time::Duration)> {
        if self.kill.is_cancelled() {
            return None;
        }
        self.take()
    }

    fn take(&self) -> Option<(Outbound, std::time::Duration)> {
        let (msg, queued_at) = {
            let mut q = self.shared.queue();
            let next = q.pop_front();
            if q.is_empty() && q.capacity() > KEEP_SLOTS {
                q.shrink_to(KEEP_SLOTS);
            }
            next?
        };
        if let Outbound::Frame(class, b) = &msg {
            let budgets = &self.shared.budgets;
            budgets.of(*class).give(b.len());
            budgets.queued.dec_by(b.len() as i64);
        }
        Some((msg, queued_at.elapsed()))
    }

    pub(crate) fn is_killed(&self) -> bool {
        self.kill.is_cancelled()
    }

    pub(crate) fn kill_token(&self) -> CancellationToken {
        self.kill.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(class: Class, n: usize) -> Outbound {
        Outbound::Frame(class, Bytes::from(vec![0; n]))
    }

    #[tokio::test]
    async fn budgets_refuse_and_recover() {
        let (out, mut rx) = Outbox::new(100, 1000, Gauge::default());
        out.push(frame(Class::Broadcast, 60)).unwrap();
        assert!(out.push(frame(Class::Broadcast, 60)).is_err());
        // A whole-document reply fits its own budget while broadcasts are queued.
        out.push(frame(Class::Reply, 1000)).unwrap();
        assert!(out.push(frame(Class::Reply, 200)).is_err());
        assert!(matches!(
            rx.recv().await,
            Some(Outbound::Frame(Class::Broadcast, _))
        ));
        out.push(frame(Class::Broadcast, 100)).unwrap();
        assert!(matches!(
            rx.recv().await,
            Some(Outbound::Frame(Class::Reply, _))
        ));
        out.push(frame(Class::Reply, 1000)).unwrap();
    }

    #[tokio::test]
    async fn kill_ends_the_writer() {
        let (out, mut rx) = Outbox::new(100, 100, Gauge::default());
        out.push(frame(Class::Broadcast, 1)).unwrap();
        out.kill();
        assert!(rx.recv().await.is_none());
        assert!(rx.is_killed());
    }

    #[tokio::test]
    async fn the_last_handle_going_ends_the_writer_after_what_is_queued() {
        let (out, mut rx) = Outbox::new(100, 100, Gauge::default());
        let other = out.clone();
        out.push(frame(Class::Broadcast, 1)).unwrap();
        drop(out);
        other.push(frame(Class::Broadcast, 2)).unwrap();
        let waiting = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(Outbound::Frame(_, b)) = rx.recv().await {
                got.push(b.len());
            }
            got
        });
        tokio::task::yield_now().await;
        drop(other);
        assert_eq!(waiting.await.unwrap(), vec![1, 2]);
    }

    #[tokio::test]
    async fn a_gone_writer_takes_nothing_more() {
        let (out, rx) = Outbox::new(100, 100, Gauge::default());
        drop(rx);
        assert!(out.push(frame(Class::Broadcast, 1)).is_err());
        // Its bytes were given back.
        assert!(out.broadcast_idle());
    }

    #[tokio::test]
    async fn a_burst_is_given_back_once_sent() {
        let (out, mut rx) = Outbox::new(1 << 20, 100, Gauge::default());
        for _ in 0..1000 {
            out.push(frame(Class::Broadcast, 10)).unwrap();
        }
        assert!(out.shared.queue().capacity() >= 1000);
        for _ in 0..1000 {
            assert!(rx.recv().await.is_some());
        }
        assert!(out.shared.queue().capacity() <= KEEP_SLOTS);
        // And a full queue refuses (the room then drops the connection).
        for _ in 0..QUEUE_MESSAGES {
            out.push(frame(Class::Broadcast, 1)).unwrap();
        }
        assert!(out.push(frame(Class::Broadcast, 1)).is_err());
    }
}

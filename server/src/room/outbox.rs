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
use tokio::sync::mpsc;
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

#[derive(Clone)]
pub(crate) struct Outbox {
    /// Each message with when it was queued (the writer measures the wait).
    tx: mpsc::Sender<(Outbound, std::time::Instant)>,
    budgets: Arc<Budgets>,
    kill: CancellationToken,
    /// Cancelled once a close was requested: the connection's reader stops taking input.
    closing: CancellationToken,
}

pub(crate) struct OutboxRx {
    rx: mpsc::Receiver<(Outbound, std::time::Instant)>,
    budgets: Arc<Budgets>,
    kill: CancellationToken,
}

impl Outbox {
    /// `broadcast_bytes`: the configured per-connection budget; `max_doc_bytes`: the largest
    /// document a reply can carry; `queued`: the process-wide gauge of queued bytes.
    pub(crate) fn new(
        broadcast_bytes: usize,
        max_doc_bytes: usize,
        queued: Gauge,
    ) -> (Outbox, OutboxRx) {
        let (tx, rx) = mpsc::channel(QUEUE_MESSAGES);
        let budgets = Arc::new(Budgets {
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
        });
        let kill = CancellationToken::new();
        (
            Outbox {
                tx,
                budgets: budgets.clone(),
                kill: kill.clone(),
                closing: CancellationToken::new(),
            },
            OutboxRx { rx, budgets, kill },
        )
    }

    /// Queues a message without waiting.
    pub(crate) fn push(&self, msg: Outbound) -> Result<(), Stuck> {
        let charge = match &msg {
            Outbound::Frame(class, b) => Some((*class, b.len())),
            Outbound::Close(..) => None,
        };
        if let Some((class, len)) = charge {
            if !self.budgets.of(class).take(len) {
                return Err(Stuck);
            }
            self.budgets.queued.inc_by(len as i64);
        }
        self.tx
            .try_send((msg, std::time::Instant::now()))
            .map_err(|_| {
                if let Some((class, len)) = charge {
                    self.budgets.of(class).give(len);
                    self.budgets.queued.dec_by(len as i64);
                }
                Stuck
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
        let close = (Outbound::Close(code, reason), std::time::Instant::now());
        if self.tx.try_send(close).is_err() {
            self.kill();
        }
    }

    /// Whether no broadcast bytes are waiting: a lagging connection has caught up with its
    /// queue and can be sent what it missed.
    pub(crate) fn broadcast_idle(&self) -> bool {
        self.budgets.broadcast.used.load(Ordering::Acquire) == 0
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
        tokio::select! {
            biased;
            () = self.kill.cancelled() => None,
            msg = self.rx.recv() => {
                let (msg, queued_at) = msg?;
                if let Outbound::Frame(class, b) = &msg {
                    self.budgets.of(*class).give(b.len());
                    self.budgets.queued.dec_by(b.len() as i64);
                }
                Some((msg, queued_at.elapsed()))
            }
        }
    }

    /// The next message if one is already queued (with how long it waited), without waiting.
    pub(crate) fn try_recv_timed(&mut self) -> Option<(Outbound, std::time::Duration)> {
        if self.kill.is_cancelled() {
            return None;
        }
        let (msg, queued_at) = self.rx.try_recv().ok()?;
        if let Outbound::Frame(class, b) = &msg {
            self.budgets.of(*class).give(b.len());
            self.budgets.queued.dec_by(b.len() as i64);
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
}

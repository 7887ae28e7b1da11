//! Byte streams carried over the framed protocol (port connections and outbound
//! connections), the same way on both ends, with credit-based flow control: a side sends at most
//! [`WINDOW`] bytes of a stream that the other side has not yet passed on (to its socket, or to
//! the local reader), and each chunk passed on is acknowledged. So a slow reader slows only its
//! own stream, and nothing is buffered without bound or cut for being slow.

use serde_bytes::ByteBuf;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

/// Bytes of one stream a side may send before the other acknowledges them.
pub(crate) const WINDOW: usize = 1 << 20;
/// Largest read from a socket: the window is spent in steps of at most this much.
const STEP: usize = 64 << 10;
/// Chunks of one stream queued on the receiving side before the sender is taken to ignore its
/// window (the stream is then reset). Far above what a window of real reads makes.
pub(crate) const QUEUE: usize = 1024;

/// What a stream may still send, in bytes.
#[derive(Clone)]
pub(crate) struct Credit(Arc<Semaphore>);

impl Credit {
    /// A full window.
    pub(crate) fn new() -> Credit {
        Credit(Arc::new(Semaphore::new(WINDOW)))
    }

    /// The other side passed on `bytes`: that much may be sent again (never more than a
    /// window in all, whatever the other side claims).
    pub(crate) fn returned(&self, bytes: u32) {
        let room = WINDOW.saturating_sub(self.0.available_permits());
        self.0.add_permits((bytes as usize).min(room));
    }

    /// Stops the sender (the stream is gone).
    pub(crate) fn close(&self) {
        self.0.close();
    }
}

/// One end of a carried stream: where its incoming chunks go (none once the other side closed
/// its sending half), and the credit of what this end sends.
pub(crate) struct End {
    pub queue: Option<mpsc::Sender<Vec<u8>>>,
    pub credit: Credit,
    /// This end has sent all it will (its reader reached the end).
    sent_all: bool,
}

/// The ends of a side's streams, by id. An end is forgotten once both halves are done: this
/// side sent all it will ([`sent_all`]) and the other side said so too ([`received_all`]).
pub(crate) type Ends = std::collections::HashMap<u32, End>;

/// This side sent all it will on `stream`.
pub(crate) fn sent_all(ends: &mut Ends, stream: u32) {
    match ends.get_mut(&stream) {
        Some(e) if e.queue.is_some() => e.sent_all = true,
        _ => {
            ends.remove(&stream);
        }
    }
}

/// The other side sent all it will on `stream`: the local reader gets the end of the stream.
pub(crate) fn received_all(ends: &mut Ends, stream: u32) {
    match ends.get_mut(&stream) {
        Some(e) if !e.sent_all => e.queue = None,
        _ => {
            ends.remove(&stream);
        }
    }
}

impl End {
    /// A new end, and the receiving half of its queue.
    pub(crate) fn new() -> (End, mpsc::Receiver<Vec<u8>>) {
        let (queue, rx) = mpsc::channel(QUEUE);
        (
            End {
                queue: Some(queue),
                credit: Credit::new(),
                sent_all: false,
            },
            rx,
        )
    }

    /// Queues a chunk from the other side; `false` when the stream must be reset (the other
    /// side ignored its window, or nobody reads here any more).
    pub(crate) fn deliver(&self, data: Vec<u8>) -> bool {
        match &self.queue {
            Some(q) => q.try_send(data).is_ok(),
            // Data after the other side said it was done sending: nothing reads it.
            None => true,
        }
    }
}

/// Writes queued chunks to `wr` until the queue closes, then shuts its write half. After each
/// chunk is written, `ack` builds the acknowledgement sent on `acks`.
pub(crate) async fn drain_into<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Vec<u8>>,
    mut wr: W,
    acks: mpsc::Sender<Vec<u8>>,
    ack: impl Fn(u32) -> Option<Vec<u8>>,
) {
    while let Some(chunk) = rx.recv().await {
        if wr.write_all(&chunk).await.is_err() {
            return;
        }
        let n = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
        if let Some(frame) = ack(n) {
            if acks.send(frame).await.is_err() {
                return;
            }
        }
    }
    let _ = wr.shutdown().await;
}

/// Reads `rd` while `credit` allows, sending each chunk as the frame `frame` builds, and `end`
/// after the end of the stream (unless the frame queue closed, or the credit was closed, first).
pub(crate) async fn frames_from<R: AsyncRead + Unpin>(
    mut rd: R,
    out: mpsc::Sender<Vec<u8>>,
    credit: Credit,
    frame: impl Fn(ByteBuf) -> Option<Vec<u8>>,
    end: Option<Vec<u8>>,
) {
    let mut buf = vec![0u8; STEP];
    loop {
        // A step of credit first: a reader that does not keep up holds this stream here.
        let Ok(permit) = credit.0.acquire_many(STEP as u32).await else {
            return;
        };
        let n = match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        permit.forget();
        credit.0.add_permits(STEP - n);
        let Some(f) = frame(ByteBuf::from(buf[..n].to_vec())) else {
            break;
        };
        if out.send(f).await.is_err() {
            return;
        }
    }
    if let Some(end) = end {
        let _ = out.send(end).await;
    }
}

//! Byte streams carried over the framed protocol (port connections), the same way on both
//! ends.

use crate::proto::CHUNK;
use serde_bytes::ByteBuf;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Writes queued chunks to `wr` until the queue closes, then shuts its write half.
pub(crate) async fn drain_into<W: AsyncWrite + Unpin>(mut rx: mpsc::Receiver<Vec<u8>>, mut wr: W) {
    while let Some(chunk) = rx.recv().await {
        if wr.write_all(&chunk).await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// Reads `rd` in chunks, sending each as the frame `frame` builds, and `end` after the end of
/// the stream (unless the frame queue closed first).
pub(crate) async fn frames_from<R: AsyncRead + Unpin>(
    mut rd: R,
    out: mpsc::Sender<Vec<u8>>,
    frame: impl Fn(ByteBuf) -> Option<Vec<u8>>,
    end: Option<Vec<u8>>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let Some(f) = frame(ByteBuf::from(buf[..n].to_vec())) else {
                    break;
                };
                if out.send(f).await.is_err() {
                    return;
                }
            }
        }
    }
    if let Some(end) = end {
        let _ = out.send(end).await;
    }
}

//! A WebSocket upgrade served by tokio-tungstenite directly, for the document socket: axum's
//! `WebSocket` sends every message as one frame, and tungstenite keeps its write buffer at the
//! size of the largest frame it ever wrote, so every joiner sent a whole document in one frame
//! would hold that much for as long as it stays. With the stream in hand, large messages go out
//! as fragments: [`DOC_FRAGMENT_BYTES`] on the document socket, [`FRAGMENT_BYTES`] elsewhere.
//!
//! The checks are axum's: `GET`, `Connection: upgrade`, `Upgrade: websocket`,
//! `Sec-WebSocket-Version: 13` and a key; the answers to a request that is not an upgrade are the
//! same statuses axum gives (405, 400, 426).

use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::SinkExt;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

use crate::http::reframe::Reframe;

/// The server's end of an upgraded connection.
pub(crate) type Socket = WebSocketStream<Lingering>;

/// How long a connection the server let go of may still take the client's bytes, and how many.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 8 << 20;

/// An upgraded connection that gathers what is written between two flushes into one write,
/// and closes lingering.
///
/// Gathering: tungstenite keeps no write buffer here (its buffer keeps the capacity of the most
/// it ever gathered, which every idle connection would then hold, see `doc_socket`), so it
/// writes each frame as it is fed; the frames a writer feeds before one flush are gathered
/// here ([`Gather`]) and go to the socket in one system call, and nothing is kept after the
/// flush. Written one by one, a burst to 100 readers took 2,000,000 system calls for 20,000
/// updates (docs/benchmarks.md).
///
/// Lingering: once the server lets go of it, its sending side is shut (what was written goes
/// out first) and what the client still sends is read and dropped, for at most [`LINGER`] and
/// [`LINGER_BYTES`], until the client closes too. Dropped at once instead, a socket with unread
/// input is reset by the kernel, and a client still sending (the rest of a message over the
/// size cap) can see the reset before the close frame: 1006 instead of 1009.
///
/// Reading: what the client sends goes to tungstenite in frames that fit its read buffer
/// ([`Reframe`]), so that buffer stays at its configured size whatever the client sends.
pub(crate) struct Lingering {
    io: Option<TokioIo<Upgraded>>,
    out: Gather,
    read: Reframe,
}

impl Lingering {
    fn new(io: TokioIo<Upgraded>, config: &WebSocketConfig) -> Self {
        let max_frame = config.max_frame_size.unwrap_or(usize::MAX);
        Lingering {
            io: Some(io),
            out: Gather::default(),
            read: Reframe::new(config.read_buffer_size, max_frame),
        }
    }

    fn parts(&mut self) -> std::io::Result<(&mut TokioIo<Upgraded>, &mut Gather)> {
        match self.io.as_mut() {
            Some(io) => Ok((io, &mut self.out)),
            None => Err(std::io::Error::from(std::io::ErrorKind::NotConnected)),
        }
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let (Some(mut io), Ok(rt)) = (self.io.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let unsent = self.out.take_unsent();
        rt.spawn(async move {
            let drain = async {
                if io.write_all(&unsent).await.is_err() || io.shutdown().await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 16 * 1024];
                let mut read = 0;
                while read < LINGER_BYTES {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read += n,
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
        });
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let Some(io) = this.io.as_mut() else {
            return Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()));
        };
        this.read.poll_read(io, cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let (io, out) = self.parts()?;
        out.poll_write(io, cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let (io, out) = self.parts()?;
        out.poll_flush(io, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let (io, out) = self.parts()?;
        std::task::ready!(out.poll_drain(io, cx))?;
        Pin::new(io).poll_shutdown(cx)
    }
}

/// Most bytes gathered before they are written without waiting for the flush (a large fragment;
/// the gathered buffer is given back at every flush, so it costs an idle connection nothing).
const GATHER_BYTES: usize = FRAGMENT_BYTES;

/// What was written since the last flush, to go out in one write ([`Lingering`]).
#[derive(Default)]
struct Gather {
    buf: Vec<u8>,
    /// How much of `buf` the socket took already.
    sent: usize,
}

impl Gather {
    fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.buf.len() + data.len() > GATHER_BYTES {
            std::task::ready!(self.poll_drain(io, cx))?;
            if data.len() >= GATHER_BYTES {
                return Pin::new(io).poll_write(cx, data);
            }
        }
        self.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    /// Writes out what is gathered; then keeps no buffer (an idle connection holds none).
    fn poll_drain<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = std::task::ready!(Pin::new(&mut *io).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.buf = Vec::new();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    fn poll_flush<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.poll_drain(io, cx))?;
        Pin::new(io).poll_flush(cx)
    }

    /// What the socket has not taken yet (for the lingering close).
    fn take_unsent(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.drain(..self.sent.min(buf.len()));
        self.sent = 0;
        buf
    }
}

/// Largest frame the terminal socket writes: a larger message goes out as fragments of this
/// size, so no connection's write buffer grows past it (clients reassemble fragments
/// transparently). Terminal output is a stream of large messages to a few viewers.
pub(crate) const FRAGMENT_BYTES: usize = 16 * 1024;

/// Largest frame the document socket writes. tungstenite's write buffer keeps the capacity of
/// the largest frame it ever wrote, and every joiner of a room is sent the whole presence table
/// and the document: with 16 KiB fragments, 2,000 idle presence-showing clients kept 2.7 KiB of
/// write buffer each (docs/benchmarks.md). Edits and presence states are tens to hundreds of
/// bytes, so they still go out whole; a 1 MB document goes out as about a thousand frames, 4
/// bytes of header each, gathered into large writes all the same.
pub(crate) const DOC_FRAGMENT_BYTES: usize = 1024;

pub(crate) struct Upgrade {
    accept: HeaderValue,
    on_upgrade: hyper::upgrade::OnUpgrade,
}

fn header_has(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|part| part.trim().eq_ignore_ascii_case(token))
        })
    })
}

fn refuse(status: StatusCode, why: &'static str) -> Response {
    (status, why).into_response()
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if parts.method != Method::GET {
            return Err(refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                "Request method must be `GET`",
            ));
        }
        if !header_has(&parts.headers, header::CONNECTION, "upgrade") {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "Connection header did not include 'upgrade'",
            ));
        }
        if !header_has(&parts.headers, header::UPGRADE, "websocket") {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "`Upgrade` header did not include 'websocket'",
            ));
        }
        if parts
            .headers
            .get(header::SEC_WEBSOCKET_VERSION)
            .is_none_or(|v| v != "13")
        {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "`Sec-WebSocket-Version` header did not include '13'",
            ));
        }
        let Some(key) = parts.headers.get(header::SEC_WEBSOCKET_KEY) else {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "`Sec-WebSocket-Key` header missing",
            ));
        };
        let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
        let Ok(accept) = HeaderValue::from_str(&accept) else {
            return Err(refuse(StatusCode::BAD_REQUEST, "bad `Sec-WebSocket-Key`"));
        };
        let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(refuse(
                StatusCode::UPGRADE_REQUIRED,
                "WebSocket request couldn't be upgraded since no upgrade state was present",
            ));
        };
        Ok(Upgrade { accept, on_upgrade })
    }
}

impl Upgrade {
    /// Answers 101 and runs `serve` on the connection once the upgrade completes.
    pub(crate) fn on_upgrade<F, Fut>(self, config: WebSocketConfig, serve: F) -> Response
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let on_upgrade = self.on_upgrade;
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(upgraded) => {
                    let socket = WebSocketStream::from_raw_socket(
                        Lingering::new(TokioIo::new(upgraded), &config),
                        Role::Server,
                        Some(config),
                    )
                    .await;
                    serve(socket).await;
                }
                Err(e) => tracing::debug!(error = %e, "websocket upgrade failed"),
            }
        });
        let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
        let h = resp.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::SEC_WEBSOCKET_ACCEPT, self.accept);
        resp
    }
}

/// Sends a binary message, as fragments of at most [`FRAGMENT_BYTES`] when it is larger.
pub(crate) async fn send_binary<S>(
    sink: &mut S,
    bytes: bytes::Bytes,
) -> Result<(), tungstenite::Error>
where
    S: futures_util::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    feed_binary(sink, bytes, FRAGMENT_BYTES).await?;
    sink.flush().await
}

/// Feeds a binary message, as fragments of at most `fragment` bytes when it is larger, without
/// the flush: messages fed one after another go out together at the next flush (or as the
/// gathered bytes fill), in fewer system calls.
pub(crate) async fn feed_binary<S>(
    sink: &mut S,
    bytes: bytes::Bytes,
    fragment: usize,
) -> Result<(), tungstenite::Error>
where
    S: futures_util::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    let fragment = fragment.max(1);
    if bytes.len() <= fragment {
        return sink.feed(Message::Binary(bytes)).await;
    }
    let mut rest = bytes;
    let mut opcode = OpCode::Data(Data::Binary);
    while !rest.is_empty() {
        let piece = rest.split_to(rest.len().min(fragment));
        let last = rest.is_empty();
        sink.feed(Message::Frame(Frame::message(piece, opcode, last)))
            .await?;
        opcode = OpCode::Data(Data::Continue);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A socket that records each write it is given, taking at most `take` bytes of each.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        take: Option<usize>,
        flushes: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = self.take.map_or(buf.len(), |t| t.min(buf.len()));
            self.writes.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn write(g: &mut Gather, io: &mut Recorder, data: &[u8]) -> usize {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match g.poll_write(io, &mut cx, data) {
            Poll::Ready(r) => r.unwrap(),
            Poll::Pending => panic!("pending"),
        }
    }

    fn flush(g: &mut Gather, io: &mut Recorder) {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(g.poll_flush(io, &mut cx), Poll::Ready(Ok(()))));
    }

    /// Frames written between two flushes reach the socket in one write, in order; after the
    /// flush nothing is kept; a socket that takes part of a write gets the rest, in order.
    #[test]
    fn frames_between_flushes_go_out_in_one_write() {
        let mut g = Gather::default();
        let mut io = Recorder::default();
        for frame in [&b"one"[..], b"two", b"three"] {
            assert_eq!(write(&mut g, &mut io, frame), frame.len());
        }
        assert!(io.writes.is_empty(), "nothing written before the flush");
        flush(&mut g, &mut io);
        assert_eq!(io.writes, vec![b"onetwothree".to_vec()]);
        assert_eq!(io.flushes, 1);
        assert_eq!(g.buf.capacity(), 0, "an idle connection keeps no buffer");

        let mut io = Recorder {
            take: Some(4),
            ..Recorder::default()
        };
        write(&mut g, &mut io, b"abcdefghij");
        flush(&mut g, &mut io);
        assert_eq!(io.writes.concat(), b"abcdefghij".to_vec());
        assert_eq!(io.writes.len(), 3);
    }

    /// More than a fragment's worth is written without waiting for the flush, and a write as
    /// large as the bound goes straight through, after what was gathered before it.
    #[test]
    fn a_full_gather_is_written_before_more_is_taken() {
        let mut g = Gather::default();
        let mut io = Recorder::default();
        let small = vec![1u8; GATHER_BYTES / 2 + 1];
        write(&mut g, &mut io, &small);
        write(&mut g, &mut io, &small);
        assert_eq!(io.writes.len(), 1, "the first half went out to make room");
        let big = vec![2u8; GATHER_BYTES];
        write(&mut g, &mut io, &big);
        assert_eq!(io.writes.len(), 3);
        assert_eq!(io.writes[1], small);
        assert_eq!(io.writes[2], big);
        flush(&mut g, &mut io);
        assert_eq!(io.writes.len(), 3, "nothing was left to write");
        assert_eq!(g.take_unsent(), Vec::<u8>::new());
    }
}

//! What a client sends, handed to tungstenite in frames small enough for its read buffer.
//!
//! tungstenite reads every frame whole into one buffer, and that buffer never shrinks: it keeps
//! the capacity of the largest frame the client ever sent, doubled when the frame arrived
//! behind others (it reserves a frame's length again on top of the bytes of it already read).
//! Stock y-websocket clients send back every presence update they receive, so after a few
//! rounds of a room's presence renewals each idle connection kept 7 KiB of read buffer on
//! average, and one that pasted a large file kept twice the file (docs/benchmarks.md).
//!
//! [`Reframe`] sits between the socket and tungstenite and passes on the same messages in
//! frames of at most [`Reframe::piece`] payload bytes: a larger data frame goes on as
//! fragments of it (each with the client's mask turned to where the fragment starts, so
//! tungstenite unmasks the same bytes), and every header is handed on alone, before its
//! payload. So tungstenite's buffer never holds more than one small frame, and never grows
//! past its starting size. Everything else passes unchanged for tungstenite to judge: control
//! frames, frames with reserved bits or opcodes, unmasked frames, and frames over the size
//! limit (refused by their header, as before, without reading them). Nothing here decides
//! whether input is valid; tungstenite still reads and checks every byte.
//!
//! The bytes read from the socket ahead of what was handed on wait in a buffer that is given
//! back once drained, so an idle connection holds none.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};

/// The most one read from the socket takes (into the transient buffer).
const READ_CHUNK: usize = 4096;

/// The longest frame header: 2 bytes, an 8-byte length and a 4-byte mask.
pub(crate) const MAX_HEADER: usize = 14;

/// The opcodes of data frames: continuation, text, binary.
fn is_data(opcode: u8) -> bool {
    opcode <= 2
}

/// A header being handed on (the client's own, or one made for a fragment).
#[derive(Default)]
struct Header {
    bytes: [u8; MAX_HEADER],
    len: usize,
    at: usize,
}

/// Where in the client's stream the reader is.
enum Phase {
    /// At the start of a frame: its header is read next.
    Header,
    /// Handing on a payload: `piece` bytes of the current (handed-on) frame are still to come;
    /// `split` is set while a client's frame goes on as fragments.
    Payload { piece: u64, split: Option<Split> },
    /// The client's stream ended (or failed) in the middle of a header: what was read of it is
    /// handed on as it is, then the end.
    Ended,
}

/// A client's data frame going on as fragments.
struct Split {
    /// The client's mask.
    key: [u8; 4],
    /// Payload bytes handed on so far (where the next fragment starts).
    offset: u64,
    /// Payload bytes after the current fragment.
    rest: u64,
    /// Whether the client's frame ended its message.
    fin: bool,
}

/// The reading side of an upgraded connection, re-framing as described in the module's
/// documentation.
pub(crate) struct Reframe {
    /// Bytes read from the socket and not yet handed on: `stash[at..]`. Given back when drained.
    stash: Vec<u8>,
    at: usize,
    header: Header,
    phase: Phase,
    /// The most payload bytes a handed-on data frame carries.
    piece: usize,
    /// Frames longer than this go on unchanged (tungstenite refuses them by their header).
    max_frame: u64,
}

impl Reframe {
    /// `read_buffer`: tungstenite's configured read buffer (fragments fit in it beside their
    /// header); `max_frame`: the frame size tungstenite refuses above.
    pub(crate) fn new(read_buffer: usize, max_frame: usize) -> Self {
        Reframe {
            stash: Vec::new(),
            at: 0,
            header: Header::default(),
            phase: Phase::Header,
            // At least one frame of the 16-bit length form, at most the largest.
            piece: read_buffer.saturating_sub(MAX_HEADER).clamp(126, 65_535),
            max_frame: u64::try_from(max_frame).unwrap_or(u64::MAX),
        }
    }

    fn stashed(&self) -> &[u8] {
        &self.stash[self.at..]
    }

    fn consume(&mut self, n: usize) {
        self.at += n;
        if self.at >= self.stash.len() {
            // Drained: an idle connection keeps no buffer.
            self.stash = Vec::new();
            self.at = 0;
        }
    }

    /// Reads until at least `n` bytes are stashed; `false` when the stream ended first.
    fn poll_stash<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
        n: usize,
    ) -> Poll<std::io::Result<bool>> {
        while self.stashed().len() < n {
            if self.at > 0 {
                self.stash.drain(..self.at);
                self.at = 0;
            }
            let have = self.stash.len();
            self.stash.resize(have.max(READ_CHUNK), 0);
            let mut buf = ReadBuf::new(&mut self.stash[have..]);
            let read = Pin::new(&mut *io).poll_read(cx, &mut buf);
            let got = buf.filled().len();
            self.stash.truncate(have + got);
            if !matches!(read, Poll::Ready(Ok(()))) || got == 0 {
                // Waiting (an idle connection waits here) or ended: keep only what was read.
                self.stash.shrink_to_fit();
            }
            std::task::ready!(read)?;
            if got == 0 {
                return Poll::Ready(Ok(false));
            }
        }
        Poll::Ready(Ok(true))
    }

    /// The size of the header at the front of the stash, once its first two bytes are there.
    fn header_len(b1: u8) -> usize {
        let ext = match b1 & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
        2 + ext + mask
    }

    /// Reads until the next frame's header is stashed whole: its length, or `None` when the
    /// stream ended first.
    fn poll_header<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<Option<usize>>> {
        if !std::task::ready!(self.poll_stash(io, cx, 2))? {
            return Poll::Ready(Ok(None));
        }
        let len = Self::header_len(self.stashed()[1]);
        let whole = std::task::ready!(self.poll_stash(io, cx, len))?;
        Poll::Ready(Ok(whole.then_some(len)))
    }

    /// Takes the header at the front of the stash (all of it is there) and decides how its
    /// frame goes on.
    fn take_header(&mut self, len: usize) {
        let h = &self.stash[self.at..self.at + len];
        let (b0, b1) = (h[0], h[1]);
        let payload = match b1 & 0x7f {
            126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            127 => u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
            n => u64::from(n),
        };
        let masked = b1 & 0x80 != 0;
        let (fin, rsv, opcode) = (b0 & 0x80 != 0, b0 & 0x70, b0 & 0x0f);
        let piece = self.piece as u64;
        if masked && rsv == 0 && is_data(opcode) && payload > piece && payload <= self.max_frame {
            let mut key = [0u8; 4];
            key.copy_from_slice(&h[len - 4..len]);
            self.set_header(opcode, false, &key, self.piece);
            self.phase = Phase::Payload {
                piece,
                split: Some(Split {
                    key,
                    offset: piece,
                    rest: payload - piece,
                    fin,
                }),
            };
        } else {
            // As the client sent it.
            self.header.bytes[..len].copy_from_slice(h);
            self.header.len = len;
            self.header.at = 0;
            self.phase = Phase::Payload {
                piece: payload,
                split: None,
            };
        }
        self.consume(len);
    }

    /// A masked frame's header: `payload` bytes (at most [`Reframe::piece`]), masked by `key`.
    fn set_header(&mut self, opcode: u8, fin: bool, key: &[u8; 4], payload: usize) {
        debug_assert!(payload <= usize::from(u16::MAX));
        let b = &mut self.header.bytes;
        b[0] = if fin { 0x80 } else { 0 } | opcode;
        let mut n = 2;
        if payload < 126 {
            b[1] = 0x80 | payload as u8;
        } else {
            b[1] = 0x80 | 126;
            let len = u16::try_from(payload).unwrap_or(u16::MAX).to_be_bytes();
            b[2..4].copy_from_slice(&len);
            n = 4;
        }
        b[n..n + 4].copy_from_slice(key);
        self.header.len = n + 4;
        self.header.at = 0;
    }

    pub(crate) fn poll_read<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            // A header goes on alone: tungstenite then reserves room for its payload while its
            // buffer holds nothing else.
            if self.header.at < self.header.len {
                let h = &self.header;
                let n = (h.len - h.at).min(buf.remaining());
                buf.put_slice(&h.bytes[h.at..h.at + n]);
                self.header.at += n;
                return Poll::Ready(Ok(()));
            }
            match &mut self.phase {
                Phase::Ended => {
                    let n = self.stashed().len().min(buf.remaining());
                    buf.put_slice(&self.stash[self.at..self.at + n]);
                    self.consume(n);
                    return Poll::Ready(Ok(()));
                }
                Phase::Payload { piece: 0, .. } => {
                    let Phase::Payload {
                        split: Some(mut s), ..
                    } = std::mem::replace(&mut self.phase, Phase::Header)
                    else {
                        continue;
                    };
                    if s.rest == 0 {
                        continue;
                    }
                    // The next fragment: a continuation, its mask turned to where it starts.
                    let n = s.rest.min(self.piece as u64);
                    let turn = (s.offset % 4) as usize;
                    let key: [u8; 4] = std::array::from_fn(|i| s.key[(turn + i) % 4]);
                    let fin = s.fin && n == s.rest;
                    s.offset += n;
                    s.rest -= n;
                    self.set_header(0, fin, &key, n as usize);
                    self.phase = Phase::Payload {
                        piece: n,
                        split: Some(s),
                    };
                }
                Phase::Payload { piece, split } => {
                    let want = usize::try_from(*piece)
                        .unwrap_or(usize::MAX)
                        .min(buf.remaining());
                    // More of the client's frame than this read takes: read ahead a chunk, so a
                    // large frame costs a system call per chunk, not per fragment.
                    let beyond = (*piece - want as u64) + split.as_ref().map_or(0, |s| s.rest);
                    if self.stashed().is_empty()
                        && beyond > 0
                        && !std::task::ready!(self.poll_stash(io, cx, 1))?
                    {
                        // The stream ended.
                        return Poll::Ready(Ok(()));
                    }
                    let n = if self.stashed().is_empty() {
                        // Straight from the socket, no more than this frame's.
                        let dst = buf.initialize_unfilled_to(want);
                        let mut part = ReadBuf::new(dst);
                        std::task::ready!(Pin::new(&mut *io).poll_read(cx, &mut part))?;
                        let n = part.filled().len();
                        buf.advance(n);
                        n
                    } else {
                        let n = want.min(self.stashed().len());
                        buf.put_slice(&self.stash[self.at..self.at + n]);
                        self.consume(n);
                        n
                    };
                    if let Phase::Payload { piece, .. } = &mut self.phase {
                        *piece -= n as u64;
                    }
                    // Nothing handed on (n == 0) tells tungstenite the stream ended.
                    return Poll::Ready(Ok(()));
                }
                Phase::Header => {
                    let header = match std::task::ready!(self.poll_header(io, cx)) {
                        Ok(header) => header,
                        Err(e) if self.stashed().is_empty() => return Poll::Ready(Err(e)),
                        Err(_) => None,
                    };
                    match header {
                        Some(len) => self.take_header(len),
                        None => {
                            // The end (or a failure) mid-header: what there is goes on as it
                            // is, then the end.
                            self.phase = Phase::Ended;
                            if self.stashed().is_empty() {
                                return Poll::Ready(Ok(()));
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::{Rng, SeedableRng};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::{Role, WebSocket, WebSocketConfig};
    use tokio_tungstenite::tungstenite::{Bytes, Error, Message};

    /// A client's bytes, given out in chunks of the sizes `chunk` picks (now and then nothing
    /// yet: `Pending`, with a wake-up).
    struct Chunked<F> {
        data: Vec<u8>,
        at: usize,
        chunk: F,
    }

    impl<F: FnMut() -> usize + Unpin> AsyncRead for Chunked<F> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let k = (self.chunk)();
            if k == 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = k.min(buf.remaining()).min(self.data.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// What tungstenite reads: [`Reframe`] over the client's bytes, every read it hands on kept.
    struct Reader<F> {
        reframe: Reframe,
        io: Chunked<F>,
        reads: Vec<Vec<u8>>,
    }

    impl<F: FnMut() -> usize + Unpin> std::io::Read for Reader<F> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let waker = futures_util::task::noop_waker();
            let mut cx = Context::from_waker(&waker);
            let mut buf = ReadBuf::new(out);
            match self.reframe.poll_read(&mut self.io, &mut cx, &mut buf) {
                Poll::Ready(Ok(())) => {
                    self.reads.push(buf.filled().to_vec());
                    Ok(buf.filled().len())
                }
                Poll::Ready(Err(e)) => Err(e),
                Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
            }
        }
    }

    impl<F> std::io::Write for Reader<F> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The bytes a client sends for `frames` (masked, as clients do).
    fn client_bytes(frames: Vec<Frame>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut ws = WebSocket::from_raw_socket(std::io::Cursor::new(&mut out), Role::Client, None);
        for f in frames {
            ws.write(Message::Frame(f)).unwrap();
        }
        ws.flush().unwrap();
        drop(ws);
        out
    }

    /// Reads every message tungstenite makes of `data` through a [`Reframe`] with a 1 KiB read
    /// buffer, until the end or an error.
    fn read_all(
        data: Vec<u8>,
        chunk: impl FnMut() -> usize + Unpin,
        max: usize,
    ) -> (Vec<Message>, Option<Error>, Vec<Vec<u8>>) {
        read_all_with(data, chunk, max, 1024)
    }

    fn read_all_with(
        data: Vec<u8>,
        chunk: impl FnMut() -> usize + Unpin,
        max: usize,
        read_buffer: usize,
    ) -> (Vec<Message>, Option<Error>, Vec<Vec<u8>>) {
        let config = WebSocketConfig::default()
            .read_buffer_size(read_buffer)
            .max_frame_size(Some(max))
            .max_message_size(Some(max));
        let reader = Reader {
            reframe: Reframe::new(read_buffer, max),
            io: Chunked { data, at: 0, chunk },
            reads: Vec::new(),
        };
        let mut ws = WebSocket::from_raw_socket(reader, Role::Server, Some(config));
        let mut got = Vec::new();
        let err = loop {
            match ws.read() {
                Ok(m) => got.push(m),
                Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => break Some(e),
            }
        };
        let reads = std::mem::take(&mut ws.get_mut().reads);
        (got, err, reads)
    }

    /// Each read handed on is a whole header or part of one frame's payload: parses the reads
    /// and returns the payload length of every frame handed on.
    fn frames_handed_on(reads: &[Vec<u8>]) -> Vec<(u8, usize)> {
        let stream: Vec<u8> = reads.concat();
        let mut frames = Vec::new();
        let mut at = 0;
        let mut read_ends: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
        read_ends.insert(0);
        let mut end = 0;
        for r in reads {
            end += r.len();
            read_ends.insert(end);
        }
        while at + 2 <= stream.len() {
            let b1 = stream[at + 1];
            let hlen = Reframe::header_len(b1);
            let payload = match b1 & 0x7f {
                126 => usize::from(u16::from_be_bytes([stream[at + 2], stream[at + 3]])),
                127 => usize::try_from(u64::from_be_bytes(
                    stream[at + 2..at + 10].try_into().unwrap(),
                ))
                .unwrap(),
                n => usize::from(n),
            };
            assert!(
                read_ends.contains(&at) && read_ends.contains(&(at + hlen)),
                "a header was not handed on alone"
            );
            frames.push((stream[at] & 0x0f, payload));
            at += hlen + payload;
        }
        frames
    }

    fn payload(rng: &mut rand::rngs::StdRng, n: std::ops::Range<usize>) -> Bytes {
        let n = rng.gen_range(n);
        (0..n).map(|_| rng.gen::<u8>()).collect::<Vec<u8>>().into()
    }

    /// Whatever a client sends and however the socket cuts it, tungstenite reads the same
    /// messages through the re-framing, in data frames of at most the piece, each header
    /// handed on alone.
    #[test]
    fn the_same_messages_arrive_in_small_frames() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..40 {
            let mut frames = Vec::new();
            let mut sent = Vec::new();
            for _ in 0..rng.gen_range(1..12) {
                match rng.gen_range(0..5) {
                    0 => {
                        let p = payload(&mut rng, 0..60);
                        sent.push(Message::Binary(p.clone()));
                        frames.push(Frame::message(p, OpCode::Data(Data::Binary), true));
                    }
                    1 | 2 => {
                        let p = payload(&mut rng, 900..70_000);
                        sent.push(Message::Binary(p.clone()));
                        frames.push(Frame::message(p, OpCode::Data(Data::Binary), true));
                    }
                    3 => {
                        // A message the client fragmented itself, a ping in the middle.
                        let a = payload(&mut rng, 0..3000);
                        let b = payload(&mut rng, 0..3000);
                        let whole: Vec<u8> = [a.as_ref(), b.as_ref()].concat();
                        sent.push(Message::Ping(Bytes::from_static(b"hi")));
                        sent.push(Message::Binary(whole.into()));
                        frames.push(Frame::message(a, OpCode::Data(Data::Binary), false));
                        frames.push(Frame::ping(Bytes::from_static(b"hi")));
                        frames.push(Frame::message(b, OpCode::Data(Data::Continue), true));
                    }
                    _ => {
                        let text = "é€😀a".repeat(rng.gen_range(1..800));
                        sent.push(Message::Text(text.clone().into()));
                        frames.push(Frame::message(
                            text.into_bytes(),
                            OpCode::Data(Data::Text),
                            true,
                        ));
                    }
                }
            }
            let data = client_bytes(frames);
            let mut chunks = rand::rngs::StdRng::seed_from_u64(round);
            let chunk = move || match chunks.gen_range(0..10) {
                0 => 0,
                1 => 1,
                2..=5 => chunks.gen_range(1..40),
                _ => chunks.gen_range(1..9000),
            };
            // The production read buffer, and a larger one.
            let read_buffer =
                [crate::http::doc_socket::SOCKET_READ_BUFFER, 1024][round as usize % 2];
            let (got, err, reads) = read_all_with(data, chunk, 1 << 20, read_buffer);
            assert_eq!(got, sent, "round {round}");
            assert!(
                matches!(err, Some(Error::ConnectionClosed | Error::Protocol(_))),
                "round {round}: {err:?}"
            );
            for (opcode, len) in frames_handed_on(&reads) {
                assert!(
                    len <= read_buffer - MAX_HEADER,
                    "round {round}: opcode {opcode}, {len}"
                );
            }
        }
    }

    /// Frames tungstenite refuses reach it as the client sent them: one over the size limit is
    /// refused by its header (nothing of it is read), an unmasked one is refused as such.
    #[test]
    fn what_tungstenite_refuses_reaches_it_unchanged() {
        let big = Frame::message(vec![1u8; 5000], OpCode::Data(Data::Binary), true);
        let data = client_bytes(vec![big]);
        let (got, err, reads) = read_all(data, || 100_000, 4000);
        assert!(got.is_empty());
        assert!(matches!(err, Some(Error::Capacity(_))), "{err:?}");
        assert_eq!(reads.concat().len(), 8, "only the header was handed on");

        let mut plain = Vec::new();
        Frame::message(vec![2u8; 3000], OpCode::Data(Data::Binary), true)
            .format(&mut plain)
            .unwrap();
        let (got, err, _) = read_all(plain, || 100_000, 1 << 20);
        assert!(got.is_empty());
        assert!(matches!(err, Some(Error::Protocol(_))), "{err:?}");
    }

    /// A client's own header in its longest form (a 64-bit length for a few bytes) goes on as
    /// it came; one for a large payload is split like any other; a stream that ends in the
    /// middle of a header ends there for tungstenite too.
    #[test]
    fn long_headers_and_cut_streams() {
        fn frame_with_long_length(payload: &[u8], key: [u8; 4]) -> Vec<u8> {
            let mut out = vec![0x82, 0x80 | 127];
            out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
            out
        }
        let small = b"hello".to_vec();
        let large: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut data = frame_with_long_length(&small, [1, 2, 3, 4]);
        data.extend(frame_with_long_length(&large, [9, 8, 7, 6]));
        let (got, _, reads) = read_all(data.clone(), || 7, 1 << 20);
        assert_eq!(
            got,
            vec![Message::Binary(small.into()), Message::Binary(large.into())]
        );
        assert_eq!(reads[0].len(), 14, "the first header as the client sent it");
        for (_, len) in frames_handed_on(&reads) {
            assert!(len <= 1024 - MAX_HEADER);
        }

        // Cut three bytes into the second frame's header.
        data.truncate(14 + 5 + 3);
        let (got, err, _) = read_all(data, || 100_000, 1 << 20);
        assert_eq!(got.len(), 1);
        assert!(
            matches!(err, Some(Error::Protocol(_) | Error::ConnectionClosed)),
            "{err:?}"
        );
    }

    /// A connection that read large frames gives its transient buffer back.
    #[test]
    fn nothing_is_kept_once_handed_on() {
        let p = vec![3u8; 50_000];
        let data = client_bytes(vec![Frame::message(p, OpCode::Data(Data::Binary), true)]);
        let mut r = Reframe::new(1024, 1 << 20);
        let mut io = Chunked {
            data,
            at: 0,
            chunk: || 3000,
        };
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut total = 0;
        loop {
            let mut space = [0u8; 1024];
            let mut buf = ReadBuf::new(&mut space);
            assert!(r.poll_read(&mut io, &mut cx, &mut buf).is_ready());
            if buf.filled().is_empty() {
                break;
            }
            total += buf.filled().len();
        }
        assert!(total > 50_000);
        assert_eq!(r.stash.capacity(), 0);

        // Nor does one waiting for input (what an idle connection does).
        let mut r = Reframe::new(1024, 1 << 20);
        let mut idle = Chunked {
            data: Vec::new(),
            at: 0,
            chunk: || 0,
        };
        let mut space = [0u8; 1024];
        let mut buf = ReadBuf::new(&mut space);
        assert!(r.poll_read(&mut idle, &mut cx, &mut buf).is_pending());
        assert_eq!(r.stash.capacity(), 0);
    }
}

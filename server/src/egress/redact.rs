//! Takes the room's secrets out of what a bound host answers, before code inside reads it: an
//! upstream that echoes a request (its headers in a JSON body, an error quoting the credential)
//! must not hand the value back into the sandbox, its terminal or the terminal's recording.
//!
//! The body is read as it streams: a compressed answer (`gzip`, `deflate`) is decoded first
//! (the proxy asks for `identity`; an upstream that compresses anyway is decoded, one whose
//! encoding the proxy cannot read is refused before its body is read). Each value is replaced by
//! its placeholder, also when it is split across chunks: the last `longest value - 1` bytes are
//! held back until more arrive or the body ends. What was replaced is counted per secret (never
//! the value) and reported when the body ends.

use bytes::Bytes;
use hyper::body::{Body, Frame};
use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A secret's value and what stands in for it.
#[derive(Clone)]
pub(crate) struct Swap {
    pub name: String,
    pub value: Vec<u8>,
    pub placeholder: Vec<u8>,
}

impl std::fmt::Debug for Swap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Swap")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How the upstream encoded the body.
enum Decoder {
    Identity,
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
}

/// What the redactor cannot read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RedactError {
    #[error("the upstream answered in an encoding the proxy cannot check ({0})")]
    Encoding(String),
    #[error("the upstream's compressed answer is malformed")]
    Malformed(#[source] std::io::Error),
    #[error("the upstream's answer failed")]
    Upstream(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Decoder {
    /// The decoder for a `Content-Encoding` (none: identity).
    fn for_encoding(encoding: Option<&str>) -> Result<Decoder, RedactError> {
        let Some(encoding) = encoding.map(str::trim).filter(|e| !e.is_empty()) else {
            return Ok(Decoder::Identity);
        };
        match encoding.to_ascii_lowercase().as_str() {
            "identity" => Ok(Decoder::Identity),
            "gzip" | "x-gzip" => Ok(Decoder::Gzip(
                flate2::write::MultiGzDecoder::new(Vec::new()),
            )),
            "deflate" => Ok(Decoder::Deflate(
                flate2::write::ZlibDecoder::new(Vec::new()),
            )),
            other => Err(RedactError::Encoding(other.to_owned())),
        }
    }

    /// The plain bytes `data` decodes to so far.
    fn decode(&mut self, data: &[u8]) -> Result<Vec<u8>, RedactError> {
        let out = match self {
            Decoder::Identity => return Ok(data.to_vec()),
            Decoder::Gzip(d) => {
                d.write_all(data).map_err(RedactError::Malformed)?;
                d.get_mut()
            }
            Decoder::Deflate(d) => {
                d.write_all(data).map_err(RedactError::Malformed)?;
                d.get_mut()
            }
        };
        Ok(std::mem::take(out))
    }

    /// What is left once the body ended.
    fn finish(&mut self) -> Result<Vec<u8>, RedactError> {
        let out = match self {
            Decoder::Identity => return Ok(Vec::new()),
            Decoder::Gzip(d) => {
                d.try_finish().map_err(RedactError::Malformed)?;
                d.get_mut()
            }
            Decoder::Deflate(d) => {
                d.try_finish().map_err(RedactError::Malformed)?;
                d.get_mut()
            }
        };
        Ok(std::mem::take(out))
    }
}

/// Replaces every value in `buf` by its placeholder, counting each (`counts[i]` for
/// `swaps[i]`): what the body below and the answer's headers (`intercept::redact`) both do.
pub(crate) fn swap_all(buf: &[u8], swaps: &[Swap], counts: &mut [u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(buf.len());
    let mut i = 0;
    'scan: while i < buf.len() {
        for (n, s) in swaps.iter().enumerate() {
            if !s.value.is_empty() && buf[i..].starts_with(&s.value) {
                out.extend_from_slice(&s.placeholder);
                counts[n] += 1;
                i += s.value.len();
                continue 'scan;
            }
        }
        out.push(buf[i]);
        i += 1;
    }
    out
}

/// The counts by secret name, those that took something out.
pub(crate) fn by_name(swaps: &[Swap], counts: &[u64]) -> Vec<(String, u64)> {
    swaps
        .iter()
        .zip(counts)
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| (s.name.clone(), *n))
        .collect()
}

/// A response body with the secrets' values taken out (see the module's text).
pub(crate) struct Redacted<B, F: FnOnce(Vec<(String, u64)>)> {
    inner: B,
    decoder: Decoder,
    swaps: Vec<Swap>,
    /// Bytes held back: a value may continue in the next chunk.
    held: Vec<u8>,
    /// The longest value, less one: how much is held back.
    keep: usize,
    counts: Vec<u64>,
    /// Trailers waiting for the held bytes to go first.
    trailers: Option<Frame<Bytes>>,
    ended: bool,
    report: Option<F>,
}

impl<B, F: FnOnce(Vec<(String, u64)>)> Redacted<B, F> {
    /// Redacts `inner`, encoded as `encoding` (its `Content-Encoding`); `report` is told, once
    /// the body ends, how many of each secret's values were replaced. The caller removes the
    /// answer's `Content-Encoding` and `Content-Length` (the body is plain and its length
    /// changes).
    pub(crate) fn new(
        inner: B,
        encoding: Option<&str>,
        swaps: Vec<Swap>,
        report: F,
    ) -> Result<Self, RedactError> {
        let keep = swaps
            .iter()
            .map(|s| s.value.len())
            .max()
            .unwrap_or(0)
            .saturating_sub(1);
        Ok(Redacted {
            inner,
            decoder: Decoder::for_encoding(encoding)?,
            counts: vec![0; swaps.len()],
            swaps,
            held: Vec::new(),
            keep,
            trailers: None,
            ended: false,
            report: Some(report),
        })
    }

    /// Adds plain bytes; the part that can go now (values in it replaced).
    fn push(&mut self, plain: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(plain);
        let swapped = swap_all(&self.held, &self.swaps, &mut self.counts);
        // A value that starts in the last `keep` bytes may end in the next chunk.
        let cut = swapped.len().saturating_sub(self.keep);
        let rest = swapped[cut..].to_vec();
        let mut ready = swapped;
        ready.truncate(cut);
        self.held = rest;
        ready
    }

    /// Everything held, once nothing more can come.
    fn drain(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        swap_all(&held, &self.swaps, &mut self.counts)
    }

    fn tell(&mut self) {
        if let Some(report) = self.report.take() {
            report(by_name(&self.swaps, &self.counts));
        }
    }
}

impl<B, F: FnOnce(Vec<(String, u64)>)> Drop for Redacted<B, F> {
    fn drop(&mut self) {
        self.tell();
    }
}

impl<B, F> Body for Redacted<B, F>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    F: FnOnce(Vec<(String, u64)>) + Unpin,
{
    type Data = Bytes;
    type Error = RedactError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RedactError>>> {
        loop {
            if let Some(t) = self.trailers.take() {
                return Poll::Ready(Some(Ok(t)));
            }
            if self.ended {
                self.tell();
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Some(Err(RedactError::Upstream(e.into()))))
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let plain = match self.decoder.decode(&data) {
                            Ok(p) => p,
                            Err(e) => return Poll::Ready(Some(Err(e))),
                        };
                        let ready = self.push(&plain);
                        if !ready.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(ready)))));
                        }
                    }
                    Err(trailers) => {
                        // The body's bytes end here: what is held goes before the trailers.
                        self.trailers = Some(trailers);
                        self.ended = true;
                        let rest = self.drain();
                        if !rest.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                        }
                    }
                },
                Poll::Ready(None) => {
                    self.ended = true;
                    let tail = match self.decoder.finish() {
                        Ok(t) => t,
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    };
                    let mut rest = self.push(&tail);
                    rest.extend(self.drain());
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn swap() -> Vec<Swap> {
        vec![Swap {
            name: "api".into(),
            value: b"sk-live-0123456789abcdef".to_vec(),
            placeholder: b"CODEROOM_SECRET_api_x".to_vec(),
        }]
    }

    /// Runs `body` cut into chunks of `size` bytes through the redactor; the text code inside
    /// would read and the counts reported.
    async fn through(
        body: &[u8],
        size: usize,
        encoding: Option<&str>,
    ) -> (String, Vec<(String, u64)>) {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = body
            .chunks(size)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let inner = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = told.clone();
        let redacted =
            Redacted::new(inner, encoding, swap(), move |c| *out.lock().unwrap() = c).unwrap();
        let bytes = redacted.collect().await.unwrap().to_bytes();
        let counts = told.lock().unwrap().clone();
        (String::from_utf8(bytes.to_vec()).unwrap(), counts)
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[tokio::test]
    async fn a_value_is_replaced_in_any_chunking_and_encoding() {
        let echo = br#"{"headers":{"authorization":"Bearer sk-live-0123456789abcdef","x":"sk-live-0123456789abcdef!"}}"#;
        for size in [1, 2, 7, 13, 24, 25, 4096] {
            for (encoding, body) in [
                (None, echo.to_vec()),
                (Some("gzip"), gzip(echo)),
                (Some("identity"), echo.to_vec()),
            ] {
                let (text, counts) = through(&body, size, encoding).await;
                assert!(!text.contains("sk-live"), "{size} {encoding:?}: {text}");
                assert_eq!(
                    text,
                    r#"{"headers":{"authorization":"Bearer CODEROOM_SECRET_api_x","x":"CODEROOM_SECRET_api_x!"}}"#
                );
                assert_eq!(counts, vec![("api".to_owned(), 2)], "{size} {encoding:?}");
            }
        }
    }

    #[tokio::test]
    async fn text_without_a_value_passes_as_it_is() {
        let plain = b"sk-live-0123 and sk-live-0123456789abcde (one short), nothing else";
        let (text, counts) = through(plain, 5, None).await;
        assert_eq!(text.as_bytes(), plain);
        assert!(counts.is_empty());
    }

    #[test]
    fn an_encoding_it_cannot_read_is_refused() {
        let inner = http_body_util::Empty::<Bytes>::new();
        assert!(matches!(
            Redacted::new(inner, Some("br"), swap(), |_| {}),
            Err(RedactError::Encoding(e)) if e == "br"
        ));
    }

    #[tokio::test]
    async fn a_malformed_compressed_answer_is_an_error_not_a_leak() {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![Ok(Frame::data(
            Bytes::from_static(b"not gzip sk-live-0123456789abcdef"),
        ))];
        let inner = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let redacted = Redacted::new(inner, Some("gzip"), swap(), |_| {}).unwrap();
        assert!(redacted.collect().await.is_err());
    }
}

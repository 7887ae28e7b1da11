//! Model token meters: the proxy reads the `usage` a model provider reports in its responses
//! (OpenAI- and Anthropic-style, whole JSON bodies and server-sent event streams) as they pass,
//! without holding them up, and counts the tokens for the room.

use bytes::Bytes;
use hyper::body::{Body, Frame};
use serde_json::Value;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Most bytes of a JSON body kept to read its usage (a bigger one is passed on unread).
const MAX_JSON: usize = 1 << 20;
/// Longest event-stream line kept.
const MAX_LINE: usize = 1 << 20;

/// Tokens one response reported.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Tokens {
    pub input: u64,
    pub output: u64,
}

impl Tokens {
    pub(crate) fn add(&mut self, o: Tokens) {
        self.input = self.input.saturating_add(o.input);
        self.output = self.output.saturating_add(o.output);
    }
}

/// The usage an event or body reports: the largest input and output counts seen (streams
/// report cumulative counts, some more than once).
fn read_usage(v: &Value, seen: &mut Tokens) {
    let n = |u: &Value, k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    for u in [
        v.get("usage"),
        v.get("message").and_then(|m| m.get("usage")),
        v.get("response").and_then(|m| m.get("usage")),
    ]
    .into_iter()
    .flatten()
    {
        // Numbers come from the upstream: added without overflowing.
        let input = n(u, "prompt_tokens")
            .saturating_add(n(u, "input_tokens"))
            .saturating_add(n(u, "cache_creation_input_tokens"))
            .saturating_add(n(u, "cache_read_input_tokens"));
        let output = n(u, "completion_tokens").saturating_add(n(u, "output_tokens"));
        seen.input = seen.input.max(input);
        seen.output = seen.output.max(output);
    }
}

/// How the body is read.
enum Mode {
    Json(Vec<u8>),
    Events(Vec<u8>),
    /// Too big, or not a kind that reports usage.
    Off,
}

/// A response body passed through unchanged while its usage is read; `report` gets the tokens
/// when the body ends (or is dropped, for a client that hung up).
pub(crate) struct Metered<B, F: FnOnce(Tokens)> {
    inner: B,
    mode: Mode,
    seen: Tokens,
    report: Option<F>,
}

impl<B, F: FnOnce(Tokens)> Metered<B, F> {
    /// Meters a body of `content_type` (`application/json` or `text/event-stream`; others
    /// pass unread).
    pub(crate) fn new(inner: B, content_type: &str, report: F) -> Self {
        let ct = content_type.to_ascii_lowercase();
        let mode = if ct.starts_with("text/event-stream") {
            Mode::Events(Vec::new())
        } else if ct.starts_with("application/json") {
            Mode::Json(Vec::new())
        } else {
            Mode::Off
        };
        Metered {
            inner,
            mode,
            seen: Tokens::default(),
            report: Some(report),
        }
    }

    fn feed(&mut self, data: &[u8]) {
        match &mut self.mode {
            Mode::Json(buf) => {
                if buf.len() + data.len() > MAX_JSON {
                    self.mode = Mode::Off;
                } else {
                    buf.extend_from_slice(data);
                }
            }
            Mode::Events(line) => {
                for &b in data {
                    if b == b'\n' {
                        if let Some(json) = line.strip_prefix(b"data:") {
                            if let Ok(v) = serde_json::from_slice::<Value>(json.trim_ascii()) {
                                read_usage(&v, &mut self.seen);
                            }
                        }
                        line.clear();
                    } else if line.len() < MAX_LINE {
                        line.push(b);
                    }
                }
            }
            Mode::Off => {}
        }
    }

    fn finish(&mut self) {
        if let Mode::Json(buf) = &self.mode {
            if let Ok(v) = serde_json::from_slice::<Value>(buf) {
                read_usage(&v, &mut self.seen);
            }
        }
        self.mode = Mode::Off;
        if let Some(report) = self.report.take() {
            if self.seen != Tokens::default() {
                report(self.seen);
            }
        }
    }
}

impl<B, F: FnOnce(Tokens)> Drop for Metered<B, F> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl<B, F> Body for Metered<B, F>
where
    B: Body<Data = Bytes> + Unpin,
    F: FnOnce(Tokens) + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    self.feed(&data);
                }
            }
            Poll::Ready(None) => self.finish(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Reads a whole body's usage (tests).
#[cfg(test)]
async fn usage_of(content_type: &str, chunks: &[&str]) -> Tokens {
    use http_body_util::BodyExt as _;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Tokens::default()));
    let out = seen.clone();
    let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::from(c.to_string()))))
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    let metered = Metered::new(body, content_type, move |t| *out.lock().unwrap() = t);
    let _ = metered.collect().await;
    let t = *seen.lock().unwrap();
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn openai_and_anthropic_usage_is_read_whole_and_streamed() {
        let openai = r#"{"id":"x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#;
        // Split mid-number: the body is read whole.
        let (a, b) = openai.split_at(60);
        assert_eq!(
            usage_of("application/json; charset=utf-8", &[a, b]).await,
            Tokens {
                input: 11,
                output: 7
            }
        );
        let anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n";
        let (a, b) = anthropic.split_at(37);
        assert_eq!(
            usage_of("text/event-stream", &[a, b]).await,
            Tokens {
                input: 25,
                output: 15
            }
        );
        let openai_stream = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n";
        assert_eq!(
            usage_of("text/event-stream", &[openai_stream]).await,
            Tokens {
                input: 3,
                output: 4
            }
        );
        assert_eq!(usage_of("text/html", &[openai]).await, Tokens::default());
        assert_eq!(
            usage_of("application/json", &["{not json"]).await,
            Tokens::default()
        );
    }
}

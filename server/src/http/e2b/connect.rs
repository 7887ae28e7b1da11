//! The Connect protocol as envd speaks it to the stock E2B SDKs (JSON codec, HTTP/1.1): an
//! error outside a stream is a non-200 answer with `{"code", "message"}`; server streams are `application/connect+json`, each message framed as one flag byte, a
//! 4-byte big-endian length and the JSON, the last frame flagged `0x02` holding `{}` or
//! `{"error": {...}}`. A streaming request's body is one such frame.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Value};

/// Largest request message read (the SDK's requests are small; files go over `/files`).
pub(crate) const MAX_MESSAGE: usize = 1 << 20;
/// The end-of-stream flag.
const END_STREAM: u8 = 0x02;

/// A Connect error code (its JSON name) and the HTTP status a unary answer carries it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    ResourceExhausted,
    Unimplemented,
    Unavailable,
    DeadlineExceeded,
    Internal,
}

impl Code {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::Internal => "internal",
        }
    }

    const fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The code for an HTTP status a room operation answered with.
    pub(crate) fn of_status(status: StatusCode) -> Code {
        match status.as_u16() {
            400 | 413 | 422 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            402 | 429 => Code::ResourceExhausted,
            403 => Code::PermissionDenied,
            404 | 410 => Code::NotFound,
            409 => Code::FailedPrecondition,
            503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        }
    }
}

/// A Connect error: a code and a message for the caller.
#[derive(Debug, Clone)]
pub(crate) struct ConnectError {
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl ConnectError {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    fn body(&self) -> Value {
        json!({ "code": self.code.name(), "message": self.message })
    }
}

impl From<crate::http::ApiError> for ConnectError {
    fn from(e: crate::http::ApiError) -> ConnectError {
        use coderoom_sandbox::proto::AgentError;
        use coderoom_sandbox::CallError;
        let exists = matches!(
            e,
            crate::http::ApiError::Sandbox(crate::sandbox::SandboxError::Call(CallError::Agent(
                AgentError::Exists
            )))
        );
        let (status, body) = e.status_and_body();
        let code = if exists {
            Code::AlreadyExists
        } else {
            Code::of_status(status)
        };
        ConnectError::new(code, body.error)
    }
}

impl IntoResponse for ConnectError {
    /// A unary call's error.
    fn into_response(self) -> Response {
        (self.code.status(), axum::Json(self.body())).into_response()
    }
}

/// A unary call's answer.
pub(crate) fn unary(v: Value) -> Response {
    axum::Json(v).into_response()
}

/// Reads a unary call's request (an empty body is `{}`).
pub(crate) fn plain(body: &[u8]) -> Result<Value, ConnectError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body)
        .map_err(|_| ConnectError::new(Code::InvalidArgument, "the request is not JSON"))
}

/// Reads a streaming call's request: one frame (flags, length, JSON).
pub(crate) fn enveloped(body: &[u8]) -> Result<Value, ConnectError> {
    let bad = |why: &str| ConnectError::new(Code::InvalidArgument, why);
    if body.len() < 5 {
        return Err(bad("the request is not a Connect message"));
    }
    if body[0] & 0x01 != 0 {
        return Err(bad("compressed messages are not taken"));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_MESSAGE || body.len() != 5 + len {
        return Err(bad("the request's length does not match its frame"));
    }
    serde_json::from_slice(&body[5..]).map_err(|_| bad("the request is not JSON"))
}

/// One message of a server stream.
pub(crate) fn frame(v: &Value) -> Bytes {
    framed(0, v)
}

/// The stream's last frame: its end, or the error it ended with.
pub(crate) fn end(error: Option<&ConnectError>) -> Bytes {
    let v = match error {
        None => json!({}),
        Some(e) => json!({ "error": e.body() }),
    };
    framed(END_STREAM, &v)
}

fn framed(flags: u8, v: &Value) -> Bytes {
    let json = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = BytesMut::with_capacity(5 + json.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(json.len()).unwrap_or(u32::MAX));
    out.put_slice(&json);
    out.freeze()
}

/// A server stream's answer: its frames as they come from `frames`.
pub(crate) fn streaming(frames: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let body = futures_util::stream::unfold(frames, |mut rx| async move {
        rx.recv()
            .await
            .map(|f| (Ok::<Bytes, std::convert::Infallible>(f), rx))
    });
    (
        [(header::CONTENT_TYPE, "application/connect+json")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// Reads a client stream's messages (enveloped, as [`enveloped`] reads one) as they arrive.
pub(crate) struct FrameReader {
    body: axum::body::BodyDataStream,
    buf: BytesMut,
}

impl FrameReader {
    pub(crate) fn new(body: axum::body::Body) -> FrameReader {
        FrameReader {
            body: body.into_data_stream(),
            buf: BytesMut::new(),
        }
    }

    /// The next message, or `None` once the client's stream ended between messages.
    pub(crate) async fn next(&mut self) -> Result<Option<Value>, ConnectError> {
        use futures_util::StreamExt as _;
        let bad = |why: &str| ConnectError::new(Code::InvalidArgument, why);
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if len > MAX_MESSAGE {
                    return Err(bad("a message of the stream is too large"));
                }
                if self.buf.len() >= 5 + len {
                    let frame = self.buf.split_to(5 + len);
                    return enveloped(&frame).map(Some);
                }
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(_)) => return Err(bad("the request stream broke off")),
                None if self.buf.is_empty() => return Ok(None),
                None => return Err(bad("the request stream ended inside a message")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let f = frame(&json!({"a": 1}));
        assert_eq!(enveloped(&f).unwrap(), json!({"a": 1}));
        assert_eq!(end(None)[0], END_STREAM);
        assert!(enveloped(b"\x00\x00\x00\x00\x09{}").is_err());
        assert!(enveloped(b"\x01\x00\x00\x00\x02{}").is_err());
        assert!(enveloped(b"{}").is_err());
        assert_eq!(plain(b"  ").unwrap(), json!({}));
    }
}

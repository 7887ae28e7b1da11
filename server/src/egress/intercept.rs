//! The tunnel to a host that has secret rules: the proxy is the TLS server code inside talks to
//! (with a certificate from the room's authority) and the TLS client the upstream sees (having
//! checked its certificate for that host). Between the two, each HTTP/1.1 request gets the
//! room's secrets for that host, and only if the client asked for that very host (its SNI and
//! `Host` match the tunnel's).

use super::redact::{by_name, swap_all, RedactError, Redacted, Swap};
use super::Egress;
use crate::ids::RoomId;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// A secret the proxy adds to requests for one host.
pub(crate) struct Injection {
    pub name: String,
    pub header: hyper::header::HeaderName,
    /// The header's value (the format with the value in it).
    pub value: hyper::header::HeaderValue,
    /// The value alone, for placeholders written into headers by code inside.
    pub raw: String,
    /// What code inside sees instead of the value.
    pub placeholder: String,
}

impl std::fmt::Debug for Injection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injection")
            .field("name", &self.name)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

type Body = BoxBody<Bytes, RedactError>;

fn answer(status: StatusCode, reason: &str) -> Response<Body> {
    let body = format!("coderoom egress proxy: {reason}\n");
    let mut r = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        "x-coderoom-egress",
        hyper::header::HeaderValue::from_static("refused"),
    );
    r
}

/// Whether the request names `host` (and no other): its `Host` header, and its URI's
/// authority when it has one, ignoring case, a trailing dot and the default port.
fn names_host<B>(req: &Request<B>, host: &str, port: u16) -> bool {
    let same = |authority: &str| {
        let (h, p) = super::addr::split_port(authority);
        let h = h.to_ascii_lowercase();
        let h = h.strip_suffix('.').unwrap_or(&h);
        h == host && p.is_none_or(|p| p.parse::<u16>().ok() == Some(port))
    };
    let header = req
        .headers()
        .get_all(hyper::header::HOST)
        .iter()
        .collect::<Vec<_>>();
    let header_ok = match header.as_slice() {
        [one] => one.to_str().is_ok_and(same),
        _ => false,
    };
    let uri_ok = req.uri().authority().is_none_or(|a| same(a.as_str()));
    header_ok && uri_ok
}

/// A request whose placeholder stands where the value must not go: refused, sent nowhere.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum Misframed {
    #[error("the placeholder of secret {0} may only stand as the whole value of its header")]
    InUrl(String),
    #[error("the placeholder of secret {secret} may only stand in its header, {header}")]
    OtherHeader { secret: String, header: String },
    #[error("the placeholder of secret {secret} may only stand as \"{framed}\" in {header}")]
    Framed {
        secret: String,
        framed: String,
        header: String,
    },
}

/// Whether `bytes` holds `needle`.
fn holds(bytes: &[u8], needle: &str) -> bool {
    !needle.is_empty() && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Adds the secrets, each in its rule's header only, as the rule formats it (whatever code inside
/// set that header to). Code inside never frames the value: a placeholder anywhere but as
/// exactly the rule's format (`Bearer <placeholder>`) in the rule's header (framed otherwise,
/// `x<placeholder>x`; in another header; in the URL) refuses the request, since it could make
/// the credential invalid and have the host quote it back.
fn inject<B>(req: &mut Request<B>, secrets: &[Injection]) -> Result<Vec<String>, Misframed> {
    let uri = req.uri().to_string();
    for s in secrets {
        if holds(uri.as_bytes(), &s.placeholder) {
            return Err(Misframed::InUrl(s.name.clone()));
        }
        for (name, v) in req.headers() {
            if *name != s.header && holds(v.as_bytes(), &s.placeholder) {
                return Err(Misframed::OtherHeader {
                    secret: s.name.clone(),
                    header: s.header.to_string(),
                });
            }
        }
        let framed = String::from_utf8_lossy(s.value.as_bytes()).replace(&s.raw, &s.placeholder);
        let misframed = req
            .headers()
            .get_all(&s.header)
            .iter()
            .any(|v| holds(v.as_bytes(), &s.placeholder) && v.as_bytes() != framed.as_bytes());
        if misframed {
            return Err(Misframed::Framed {
                secret: s.name.clone(),
                framed,
                header: s.header.to_string(),
            });
        }
    }
    let mut used = Vec::new();
    for s in secrets {
        req.headers_mut().insert(s.header.clone(), s.value.clone());
        used.push(s.name.clone());
    }
    Ok(used)
}

/// What stands in for each secret's value in an answer.
fn swaps(secrets: &[Injection]) -> Vec<Swap> {
    secrets
        .iter()
        .map(|s| Swap {
            name: s.name.clone(),
            value: s.raw.as_bytes().to_vec(),
            placeholder: s.placeholder.as_bytes().to_vec(),
        })
        .collect()
}

/// Takes every secret's value out of the answer's headers (an upstream that echoes a request
/// header back must not hand the value to code inside): the placeholder stands in for it. How
/// many of each were taken out (`counts[i]` for `swaps[i]`).
fn redact<B>(resp: &mut Response<B>, swaps: &[Swap]) -> Vec<u64> {
    let mut counts = vec![0; swaps.len()];
    let names: Vec<_> = resp.headers().keys().cloned().collect();
    for name in names {
        let before: u64 = counts.iter().sum();
        let swapped: Vec<Vec<u8>> = resp
            .headers()
            .get_all(&name)
            .iter()
            .map(|v| swap_all(v.as_bytes(), swaps, &mut counts))
            .collect();
        if counts.iter().sum::<u64>() == before {
            continue;
        }
        resp.headers_mut().remove(&name);
        for v in swapped {
            if let Ok(v) = hyper::header::HeaderValue::from_bytes(&v) {
                resp.headers_mut().append(name.clone(), v);
            }
        }
    }
    counts
}

/// Serves the decrypted side of a tunnel to `host:port`: each request that names the host gets
/// its secrets and goes to the upstream over `upstream` (TLS already checked); anything else is
/// answered here and goes nowhere.
pub(crate) async fn serve<C, U>(
    egress: &Egress,
    (room_id, who): (&RoomId, &str),
    (host, port): (&str, u16),
    client: C,
    upstream: U,
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok((sender, conn)) =
        hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream)).await
    else {
        return;
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let (egress, room_id, host, who) = (
        egress.clone(),
        room_id.clone(),
        host.to_owned(),
        who.to_owned(),
    );
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let sender = sender.clone();
        let (egress, room_id, host, who) =
            (egress.clone(), room_id.clone(), host.clone(), who.clone());
        async move {
            if !names_host(&req, &host, port) {
                return Ok::<_, hyper::Error>(answer(
                    StatusCode::MISDIRECTED_REQUEST,
                    &format!("this tunnel is for {host}; the request names another host"),
                ));
            }
            // The policy and the secrets as they are now: a change reaches open tunnels too.
            let named = super::addr::Host::Name(host.clone());
            if !egress.policy(&room_id).await.allows(&named, port) {
                return Ok(answer(
                    StatusCode::FORBIDDEN,
                    &format!("{host} is no longer on the room's egress allowlist"),
                ));
            }
            let secrets = egress.injections(&room_id, &host).await;
            let used = match inject(&mut req, &secrets) {
                Ok(used) => used,
                Err(why) => return Ok(answer(StatusCode::FORBIDDEN, &why.to_string())),
            };
            // Uncompressed answers, so their token usage can be read on the way back.
            req.headers_mut().remove(hyper::header::ACCEPT_ENCODING);
            egress.used_secrets(&room_id, &used).await;
            let mut sender = sender.lock().await;
            if sender.ready().await.is_err() {
                return Ok(answer(
                    StatusCode::BAD_GATEWAY,
                    "the upstream closed the connection",
                ));
            }
            match sender.send_request(req).await {
                Ok(mut resp) => {
                    let swaps = swaps(&secrets);
                    let in_headers = redact(&mut resp, &swaps);
                    egress.record_redacted(&room_id, by_name(&swaps, &in_headers));
                    let kind = resp
                        .headers()
                        .get(hyper::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    // The body, decoded and with every value taken out, as it streams.
                    let encoding = resp
                        .headers()
                        .get(hyper::header::CONTENT_ENCODING)
                        .map(|v| v.to_str().unwrap_or("(not text)").to_owned());
                    let (mut parts, body) = resp.into_parts();
                    let told = (egress.clone(), room_id.clone());
                    let tell = move |counts| told.0.record_redacted(&told.1, counts);
                    let body = match Redacted::new(body, encoding.as_deref(), swaps, tell) {
                        Ok(b) => b,
                        Err(e) => return Ok(answer(StatusCode::BAD_GATEWAY, &e.to_string())),
                    };
                    parts.headers.remove(hyper::header::CONTENT_ENCODING);
                    parts.headers.remove(hyper::header::CONTENT_LENGTH);
                    let (egress, room_id) = (egress.clone(), room_id.clone());
                    let report = move |t| egress.record_tokens(&room_id, &who, t);
                    let body = super::usage::Metered::new(body, &kind, report).boxed();
                    Ok(Response::from_parts(parts, body))
                }
                Err(e) => Ok(answer(
                    StatusCode::BAD_GATEWAY,
                    &format!("upstream error: {e}"),
                )),
            }
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Injection {
        Injection {
            name: "KEY".into(),
            header: hyper::header::AUTHORIZATION,
            value: hyper::header::HeaderValue::from_static("Bearer real-value"),
            raw: "real-value".into(),
            placeholder: "crs_placeholder_KEY_0123".into(),
        }
    }

    fn req(host: &str, uri: &str) -> Request<()> {
        Request::builder()
            .uri(uri)
            .header("host", host)
            .body(())
            .unwrap()
    }

    #[test]
    fn only_requests_for_the_tunnel_host_qualify() {
        for ok in ["api.example.com", "API.Example.com.", "api.example.com:443"] {
            assert!(names_host(&req(ok, "/v1"), "api.example.com", 443), "{ok}");
        }
        for bad in [
            "evil.example",
            "api.example.com:8443",
            "api.example.com.evil",
        ] {
            assert!(
                !names_host(&req(bad, "/v1"), "api.example.com", 443),
                "{bad}"
            );
        }
        // An absolute URI naming another host, or two Host headers, never qualify.
        assert!(!names_host(
            &req("api.example.com", "https://evil.example/v1"),
            "api.example.com",
            443
        ));
        let mut two = req("api.example.com", "/v1");
        two.headers_mut().append(
            "host",
            hyper::header::HeaderValue::from_static("evil.example"),
        );
        assert!(!names_host(&two, "api.example.com", 443));
    }

    #[test]
    fn placeholders_are_swapped_and_missing_headers_set() {
        let with = |name: &'static str, value: &'static str| {
            let mut r = req("api.example.com", "/");
            r.headers_mut()
                .insert(name, hyper::header::HeaderValue::from_static(value));
            r
        };
        // The rule's format with the placeholder in it: the value.
        let mut r = with("authorization", "Bearer crs_placeholder_KEY_0123");
        assert_eq!(inject(&mut r, &[secret()]), Ok(vec!["KEY".to_owned()]));
        assert_eq!(r.headers()["authorization"], "Bearer real-value");
        // Framed otherwise, or anywhere else: refused, nothing sent.
        for (name, value) in [
            ("authorization", "token crs_placeholder_KEY_0123"),
            ("authorization", "Bearer xcrs_placeholder_KEY_0123x"),
            ("origin", "crs_placeholder_KEY_0123"),
        ] {
            let mut r = with(name, value);
            assert!(inject(&mut r, &[secret()]).is_err(), "{name}: {value}");
        }
        let mut r = req("api.example.com", "/v1?key=crs_placeholder_KEY_0123");
        assert!(inject(&mut r, &[secret()]).is_err());
        let mut echoed = Response::new(());
        echoed.headers_mut().insert(
            "x-echo",
            hyper::header::HeaderValue::from_static("you sent Bearer real-value"),
        );
        assert_eq!(redact(&mut echoed, &swaps(&[secret()])), vec![1]);
        assert_eq!(
            echoed.headers()["x-echo"],
            "you sent Bearer crs_placeholder_KEY_0123"
        );
        let mut r = req("api.example.com", "/");
        r.headers_mut().insert(
            "authorization",
            hyper::header::HeaderValue::from_static("Bearer something-else"),
        );
        assert!(inject(&mut r, &[secret()]).is_ok());
        assert_eq!(r.headers()["authorization"], "Bearer real-value");
    }
}

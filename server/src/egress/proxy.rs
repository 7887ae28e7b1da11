//! One outbound connection from a sandbox: an HTTP proxy request (`CONNECT host:port`, or a
//! plain-HTTP request in absolute form), judged, then carried or refused with a clear answer.

use super::addr::{self, Host};
use super::{Answer, Egress, Outcome};
use crate::ids::RoomId;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Largest request head read from code inside.
const MAX_HEAD: usize = 16 << 10;
/// Time code inside has to send its request head.
const HEAD_WITHIN: Duration = Duration::from_secs(30);
/// Time a name may take to resolve.
const RESOLVE_WITHIN: Duration = Duration::from_secs(10);
/// Time an upstream connection may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// Headers read from one request head.
const MAX_HEADERS: usize = 64;

/// A request head from code inside.
#[derive(Debug)]
pub(super) struct Head {
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    /// Bytes read past the head (a body, or a TLS hello sent right after `CONNECT`).
    rest: Vec<u8>,
}

/// What the request asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// `CONNECT host:port`: a tunnel.
    Tunnel { host: String, port: u16 },
    /// `GET http://host[:port]/path`: one plain-HTTP request.
    Forward {
        host: String,
        port: u16,
        /// The authority as written (the upstream's `Host`).
        authority: String,
        /// The path and query.
        path: String,
    },
}

/// A refusal or failure, answered to code inside.
pub(super) struct Refusal {
    status: &'static str,
    pub(super) reason: String,
    /// Refused by the policy or the address checks (else: it failed).
    denied: bool,
}

fn refuse(reason: impl Into<String>) -> Refusal {
    Refusal {
        status: "403 Forbidden",
        reason: reason.into(),
        denied: true,
    }
}

fn fail(status: &'static str, reason: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason: reason.into(),
        denied: false,
    }
}

pub(super) async fn serve<S>(egress: &Egress, room_id: &RoomId, who: &str, mut conn: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut outcome = Outcome {
        who: who.to_owned(),
        host: "(malformed request)".into(),
        port: 0,
        allowed: false,
        reason: String::new(),
        bytes_out: 0,
        bytes_in: 0,
    };
    let head = tokio::time::timeout(HEAD_WITHIN, read_head(&mut conn))
        .await
        .unwrap_or(Err("no request in time"));
    let target = head.and_then(|head| Ok((target_of(&head)?, head)));
    let (target, head) = match target {
        Ok(t) => t,
        Err(why) => {
            let _ = answer(&mut conn, "400 Bad Request", why).await;
            outcome.reason = why.to_owned();
            egress.record(room_id, outcome);
            return;
        }
    };
    let (host_raw, port) = match &target {
        Target::Tunnel { host, port } | Target::Forward { host, port, .. } => (host.clone(), *port),
    };
    // Whatever code inside sent, the counters keep a bounded name.
    outcome.host = host_raw.chars().take(253).collect();
    outcome.port = port;
    // Past the budget nothing more goes out (what is open finishes).
    if let Err(why) = egress.within_budget(room_id, who).await {
        let _ = answer(&mut conn, "402 Payment Required", &why.0).await;
        outcome.reason = why.0;
        egress.record(room_id, outcome);
        return;
    }
    let (host, upstream) = match judge_and_connect(egress, room_id, &host_raw, port).await {
        Ok(judged) => judged,
        Err(r) => {
            outcome.allowed = !r.denied;
            outcome.reason = r.reason.clone();
            tracing::info!(room = %room_id, host = %host_raw, port, reason = %r.reason, "egress refused");
            let _ = answer(&mut conn, r.status, &r.reason).await;
            egress.record(room_id, outcome);
            return;
        }
    };
    outcome.host = host.to_string();
    let _ = upstream.set_nodelay(true);
    let counters = Counters::default();
    let upstream = Counted {
        inner: upstream,
        counters: counters.clone(),
    };
    // A tunnel to a host the room has secrets for is opened here; any other is carried as is.
    let secrets = match (&target, &host) {
        (Target::Tunnel { .. }, Host::Name(name)) => {
            Some((name, egress.injections(room_id, name).await))
        }
        _ => None,
    };
    let result = match secrets {
        Some((name, secrets)) if !secrets.is_empty() => {
            intercepted(
                egress,
                (room_id, who),
                (name, port),
                conn,
                head.rest,
                upstream,
            )
            .await
        }
        _ => {
            carry(conn, upstream, &head, &target).await;
            Ok(())
        }
    };
    if let Err(r) = result {
        outcome.allowed = !r.denied;
        outcome.reason = r.reason;
    } else {
        outcome.allowed = true;
    }
    outcome.bytes_out = counters.written.load(Ordering::Relaxed);
    outcome.bytes_in = counters.read.load(Ordering::Relaxed);
    egress.record(room_id, outcome);
}

/// Bytes through a connection, each way.
#[derive(Clone, Default)]
struct Counters {
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

/// A stream that counts what passes.
struct Counted<S> {
    inner: S,
    counters: Counters,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let n = (buf.filled().len() - before) as u64;
            self.counters.read.fetch_add(n, Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &r {
            self.counters
                .written
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream whose first bytes were already read (sent right behind the `CONNECT`).
struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Answers the refusal `r` to code inside, and returns it.
async fn told<S: AsyncWrite + Unpin>(conn: &mut S, r: Refusal) -> Result<(), Refusal> {
    let _ = answer(conn, r.status, &r.reason).await;
    Err(r)
}

/// A tunnel to `host`, which the room has secrets for: the upstream's certificate is checked
/// for `host` first (no secret goes to a server that cannot prove it is the host), then code
/// inside gets the tunnel, and TLS from the room's authority once its TLS names `host` too.
async fn intercepted<S>(
    egress: &Egress,
    (room_id, who): (&RoomId, &str),
    (host, port): (&str, u16),
    mut conn: S,
    rest: Vec<u8>,
    upstream: Counted<tokio::net::TcpStream>,
) -> Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(server_name) = rustls::pki_types::ServerName::try_from(host.to_owned()) else {
        return told(&mut conn, fail("400 Bad Request", "not a TLS host name")).await;
    };
    let connector = tokio_rustls::TlsConnector::from(egress.inner.upstream_tls.clone());
    let up = match tokio::time::timeout(CONNECT_WITHIN, connector.connect(server_name, upstream))
        .await
    {
        Ok(Ok(up)) => up,
        Ok(Err(e)) => {
            return told(
                &mut conn,
                fail(
                    "502 Bad Gateway",
                    format!("{host} did not prove it is {host} ({e}); nothing was sent to it"),
                ),
            )
            .await
        }
        Err(_) => {
            return told(
                &mut conn,
                fail("504 Gateway Timeout", format!("TLS with {host} timed out")),
            )
            .await
        }
    };
    let config = match egress
        .authority(room_id)
        .and_then(|ca| ca.server_config(host))
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(room = %room_id, error = %e, "cannot make the room's certificate");
            return told(
                &mut conn,
                fail(
                    "500 Internal Server Error",
                    "the proxy cannot make a certificate",
                ),
            )
            .await;
        }
    };
    if conn
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return Ok(());
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let client = Prefixed {
        prefix: rest,
        at: 0,
        inner: conn,
    };
    let client = match tokio::time::timeout(HEAD_WITHIN, acceptor.accept(client)).await {
        Ok(Ok(c)) => c,
        _ => return Err(fail("400 Bad Request", "no TLS handshake in the tunnel")),
    };
    let sni = client
        .get_ref()
        .1
        .server_name()
        .map(|s| s.trim_end_matches('.').to_ascii_lowercase());
    if sni.as_deref() != Some(host) {
        return Err(refuse(format!(
            "the tunnel is for {host} but its TLS asked for {}",
            sni.as_deref().unwrap_or("no name")
        )));
    }
    super::intercept::serve(egress, (room_id, who), (host, port), client, up).await;
    Ok(())
}

/// Applies the room's policy and the address checks, then connects to the checked address.
async fn judge_and_connect(
    egress: &Egress,
    room_id: &RoomId,
    host_raw: &str,
    port: u16,
) -> Result<(Host, tokio::net::TcpStream), Refusal> {
    let bad = |why: &str| Refusal {
        status: "400 Bad Request",
        reason: why.to_owned(),
        denied: true,
    };
    let host = addr::parse_host(host_raw).map_err(bad)?;
    if port == 0 {
        return Err(bad("port 0"));
    }
    let policy = egress.policy(room_id).await;
    if !policy.allows(&host, port) {
        return Err(refuse(format!(
            "{host}:{port} is not on the room's egress allowlist (an owner can allow it in the \
             Network panel)"
        )));
    }
    let to = checked_address(egress, &host, port).await?;
    match tokio::time::timeout(CONNECT_WITHIN, tokio::net::TcpStream::connect(to)).await {
        Ok(Ok(s)) => Ok((host, s)),
        Ok(Err(e)) => Err(fail(
            "502 Bad Gateway",
            format!("cannot connect to {host}:{port}: {e}"),
        )),
        Err(_) => Err(fail(
            "504 Gateway Timeout",
            format!("connecting to {host}:{port} timed out"),
        )),
    }
}

/// Where a connection to `host:port` may go: resolved once, every answer checked (see the
/// module's rules); the address to connect to, and nothing else.
pub(super) async fn checked_address(
    egress: &Egress,
    host: &Host,
    port: u16,
) -> Result<SocketAddr, Refusal> {
    let answer = match host {
        Host::Ip(ip) => Answer::Addrs(vec![*ip]),
        Host::Name(name) => {
            match tokio::time::timeout(RESOLVE_WITHIN, egress.inner.resolver.resolve(name, port))
                .await
            {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => {
                    return Err(fail(
                        "502 Bad Gateway",
                        format!("cannot resolve {name}: {e}"),
                    ))
                }
                Err(_) => {
                    return Err(fail(
                        "504 Gateway Timeout",
                        format!("resolving {name} timed out"),
                    ))
                }
            }
        }
    };
    let to: SocketAddr = match answer {
        #[cfg(feature = "egress-test-resolve")]
        Answer::StandIn(s) => s,
        Answer::Addrs(addrs) => {
            if addrs.is_empty() {
                return Err(fail("502 Bad Gateway", format!("{host} has no address")));
            }
            let own = super::host_addresses();
            // Every answer is checked: a name that mixes a public address with a private one
            // is refused as a whole, not tried address by address.
            let says = |what: &str, ip| match host {
                Host::Ip(_) => format!("{host} is {what}"),
                Host::Name(_) => format!("{host} resolves to {what} ({ip})"),
            };
            for ip in &addrs {
                let ip = addr::canonical(*ip);
                // Loopback is refused below as loopback; the others are named for what they
                // are to this server (they may be private or public addresses too).
                if own
                    .iter()
                    .any(|o| !o.is_loopback() && addr::canonical(*o) == ip)
                {
                    return Err(refuse(says("this server's own address", ip)));
                }
                if let Some(why) = addr::refused(ip) {
                    return Err(refuse(says(why, ip)));
                }
            }
            // Pinned: the connection goes to the address checked above, never to a fresh
            // answer (no rebinding between the check and the connect).
            SocketAddr::new(addr::canonical(addrs[0]), port)
        }
    };
    Ok(to)
}

/// Carries the connection as it is.
async fn carry<S, U>(mut conn: S, mut upstream: U, head: &Head, target: &Target)
where
    S: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let first = match target {
        Target::Tunnel { .. } => {
            if conn
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            head.rest.clone()
        }
        Target::Forward {
            authority, path, ..
        } => {
            let mut out = forwarded_head(head, authority, path);
            out.extend_from_slice(&head.rest);
            out
        }
    };
    if upstream.write_all(&first).await.is_err() {
        return;
    }
    pipe(conn, upstream).await;
}

/// After one side of a carried connection has finished, how long the other may go on: a
/// program that hung up must not keep a download running on its room's account.
const AFTER_ONE_SIDE: Duration = Duration::from_secs(30);

/// Copies both ways until both sides finish, or one has and the other takes too long.
async fn pipe<S, U>(conn: S, upstream: U)
where
    S: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(conn);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let out = async {
        let _ = tokio::io::copy(&mut cr, &mut uw).await;
        let _ = uw.shutdown().await;
    };
    let back = async {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::pin!(out, back);
    tokio::select! {
        () = &mut out => { let _ = tokio::time::timeout(AFTER_ONE_SIDE, back).await; }
        () = &mut back => { let _ = tokio::time::timeout(AFTER_ONE_SIDE, out).await; }
    }
}

/// Headers that belong to one hop (this proxy), never forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// The request head sent upstream: origin-form, `Host` from the URL, one request per
/// connection.
fn forwarded_head(head: &Head, authority: &str, path: &str) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        head.method, path, authority
    )
    .into_bytes();
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if lower == "host" || HOP_BY_HOP.contains(&lower.as_str()) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// Answers code inside with `status` and a one-line reason, then the connection ends.
async fn answer<S: AsyncWrite + Unpin>(
    conn: &mut S,
    status: &str,
    reason: &str,
) -> std::io::Result<()> {
    let body = format!("coderoom egress proxy: {reason}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         X-Coderoom-Egress: refused\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(msg.as_bytes()).await?;
    conn.shutdown().await
}

/// Reads one request head.
pub(super) async fn read_head<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Head, &'static str> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = rd
            .read(&mut chunk)
            .await
            .map_err(|_| "the request could not be read")?;
        if n == 0 {
            return Err("the connection ended before a request");
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
                return Err("the request head is too large")
            }
            Ok(httparse::Status::Complete(len)) => {
                let method = req.method.unwrap_or_default().to_owned();
                let target = req.path.unwrap_or_default().to_owned();
                let headers = req
                    .headers
                    .iter()
                    .map(|h| (h.name.to_owned(), h.value.to_vec()))
                    .collect();
                return Ok(Head {
                    method,
                    target,
                    headers,
                    rest: buf[len..].to_vec(),
                });
            }
            Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => {}
            Ok(httparse::Status::Partial) => return Err("the request head is too large"),
            Err(_) => return Err("malformed proxy request"),
        }
    }
}

/// What a request head asks for.
pub(super) fn target_of(head: &Head) -> Result<Target, &'static str> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(&head.target).ok_or("CONNECT needs host:port")?;
        let port = port.ok_or("CONNECT needs host:port")?;
        return Ok(Target::Tunnel { host, port });
    }
    let lower = head.target.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err("https:// goes through CONNECT (set HTTPS_PROXY)");
    }
    let rest = lower
        .strip_prefix("http://")
        .map(|_| &head.target["http://".len()..])
        .ok_or("only CONNECT and http:// requests go through this proxy")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err("credentials in the URL are not forwarded");
    }
    let (host, port) = split_authority(authority).ok_or("malformed URL")?;
    let path = match &rest[end..] {
        "" => "/".to_owned(),
        p if p.starts_with('/') => p.split('#').next().unwrap_or("/").to_owned(),
        p => format!("/{}", p.split('#').next().unwrap_or("")),
    };
    Ok(Target::Forward {
        host,
        port: port.unwrap_or(80),
        authority: authority.to_owned(),
        path,
    })
}

/// `host[:port]` or `[v6][:port]`; `None` when the port is not a number.
fn split_authority(a: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = addr::split_port(a);
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    Some((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn head(raw: &str) -> Result<Head, &'static str> {
        read_head(&mut raw.as_bytes()).await
    }

    #[tokio::test]
    async fn targets() {
        let h = head("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nTLS")
            .await
            .unwrap();
        assert_eq!(
            target_of(&h).unwrap(),
            Target::Tunnel {
                host: "example.com".into(),
                port: 443
            }
        );
        assert_eq!(h.rest, b"TLS");
        let h = head("CONNECT [::ffff:127.0.0.1]:80 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(
            target_of(&h).unwrap(),
            Target::Tunnel {
                host: "[::ffff:127.0.0.1]".into(),
                port: 80
            }
        );
        let h = head("GET http://Example.com:8080/a?b=1#frag HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(
            target_of(&h).unwrap(),
            Target::Forward {
                host: "Example.com".into(),
                port: 8080,
                authority: "Example.com:8080".into(),
                path: "/a?b=1".into()
            }
        );
        let h = head("GET http://example.com HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert!(
            matches!(target_of(&h).unwrap(), Target::Forward { port: 80, ref path, .. } if path == "/")
        );
        for bad in [
            "CONNECT example.com HTTP/1.1\r\n\r\n",
            "CONNECT example.com:99999 HTTP/1.1\r\n\r\n",
            "GET /relative HTTP/1.1\r\n\r\n",
            "GET https://example.com/ HTTP/1.1\r\n\r\n",
            "GET http://allowed.example@evil.example/ HTTP/1.1\r\n\r\n",
            "GET ftp://example.com/ HTTP/1.1\r\n\r\n",
        ] {
            let h = head(bad).await.unwrap();
            assert!(target_of(&h).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn heads_are_bounded_and_checked() {
        assert!(head("NOT A REQUEST\r\n\r\n").await.is_err());
        assert!(
            head("GET http://x/ HTTP/1.1\r\n").await.is_err(),
            "ended early"
        );
        let long = format!(
            "GET http://x/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        assert_eq!(
            head(&long).await.err(),
            Some("the request head is too large")
        );
    }

    #[tokio::test]
    async fn forwarded_heads_drop_hop_by_hop_headers() {
        let h = head(
            "POST http://api.example/v1 HTTP/1.1\r\nHost: evil.example\r\nProxy-Authorization: Basic eA==\r\n\
             Connection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
        )
        .await
        .unwrap();
        let out = String::from_utf8(forwarded_head(&h, "api.example", "/v1")).unwrap();
        assert_eq!(
            out,
            "POST /v1 HTTP/1.1\r\nHost: api.example\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
    }
}

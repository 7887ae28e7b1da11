//! Sandbox hosts: the sandbox backends in a process of their own (`coderoom sandbox-host`),
//! on another machine if need be, serving room servers over mutual TLS.
//!
//! One TLS connection carries one sandbox. The room server opens it with one JSON line (a
//! [`HostRequest`]) and the host answers with one JSON line (a [`HostAnswer`]); after
//! [`HostAnswer::Started`] the connection carries the agent's own framed protocol
//! ([`crate::proto`]) both ways, relayed by the host: frames from the room server go to the
//! agent as they are, and messages from the agent are decoded, checked and re-encoded before
//! they leave (a hostile agent cannot send the room server more than a local one could). The
//! host's last frame, when the sandbox ends there, is [`Message::HostEnded`] with the reason.
//! Closing the connection kills the sandbox; a host that dies closes it, and the room server's
//! handle ends with "the connection to the sandbox host was lost".
//!
//! Placement is by the hosts' own word: before each start the room server asks every host for
//! its [`HostStatus`] (tier, capacity, sandboxes running) and places the sandbox on the least
//! loaded host of the room's tier that has room, trying the next on refusal.

use crate::handle::Sandbox;
use crate::proto::{self, Message, MAX_FRAME};
use crate::{Backend, Ended, Limits, Receipt, StartError, Started, Starting, Tier, TierBackend};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest handshake line either side reads.
const MAX_LINE: usize = 64 << 10;
/// Time to connect to a host and finish the TLS handshake.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);
/// Time for a host to answer a status request.
const STATUS_WITHIN: Duration = Duration::from_secs(5);
/// Time for a host to start a sandbox (a VM under software emulation takes the longest).
const START_WITHIN: Duration = Duration::from_secs(180);
/// Time for the relayed agent to answer its first hello.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Bytes buffered between the room server's handle and the TLS connection.
const PIPE: usize = 256 << 10;
/// Longest a relayed frame may wait for the agent to take it: an agent that stops reading its
/// control stream is killed rather than left running with nobody able to reach it.
const RELAY_STALL: Duration = Duration::from_secs(30);
/// How long a room server waits for a host to end a sandbox it closed.
const ENDED_WITHIN: Duration = Duration::from_secs(20);
/// TLS handshakes in progress at once (the rest wait to be accepted).
const HANDSHAKES: usize = 64;

/// TCP keepalive: a peer whose machine vanished is noticed within about a minute.
fn keepalive(tcp: &tokio::net::TcpStream) {
    use rustix::net::sockopt;
    let _ = sockopt::set_socket_keepalive(tcp, true);
    let _ = sockopt::set_tcp_keepidle(tcp, Duration::from_secs(30));
    let _ = sockopt::set_tcp_keepintvl(tcp, Duration::from_secs(10));
    let _ = sockopt::set_tcp_keepcnt(tcp, 3);
    let _ = tcp.set_nodelay(true);
}

/// What a room server asks a sandbox host, as the connection's first line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum HostRequest {
    /// The host's tier, capacity and load.
    Status,
    /// Start a sandbox named `name` with `limits` and relay its agent on this connection.
    Start {
        /// The sandbox's name (the room's id).
        name: String,
        /// Its limits.
        limits: Limits,
    },
    /// Relay again, on this connection, the running sandbox `name` whose room server's
    /// connection broke (`token`: what [`HostAnswer::Started`] said).
    Attach {
        /// The sandbox's name.
        name: String,
        /// Its attach token.
        token: String,
    },
}

/// A sandbox host's tier, capacity and load.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostStatus {
    /// The host's name (`--id`, else its hostname).
    pub id: String,
    /// The tier its sandboxes run in (`namespace`, `microvm`, `none`).
    pub tier: String,
    /// Why that tier, in words.
    pub tier_reason: String,
    /// Sandboxes it runs at most.
    pub capacity: usize,
    /// Sandboxes it runs now.
    pub running: usize,
    /// Its version.
    pub version: String,
}

/// A sandbox host's one-line answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum HostAnswer {
    /// To [`HostRequest::Status`].
    Status {
        /// The status.
        status: HostStatus,
    },
    /// The sandbox runs; the agent's protocol follows on this connection.
    Started {
        /// What it was started with.
        receipt: Box<Receipt>,
        /// What attaches to it again if this connection breaks (not closes).
        #[serde(default)]
        token: String,
        /// The first request id the room server's handle may use (after an attach: above every
        /// id the earlier connection used, whose late answers are dropped).
        #[serde(default)]
        first_id: u64,
    },
    /// Not done, and why.
    Refused {
        /// Why, in words.
        error: String,
        /// The host is full (another host may take it).
        #[serde(default)]
        full: bool,
    },
}

/// A sandbox host: its backend, how many sandboxes it runs at most, and its TLS identity
/// (which also verifies room servers' client certificates).
pub struct Host {
    backend: Backend,
    tier_reason: String,
    id: String,
    capacity: usize,
    running: Arc<AtomicUsize>,
    /// The names of the sandboxes here (running, detached or still ending): a name is one
    /// sandbox, so a peer cannot start a second one under a room's name beside (or over) it.
    names: Names,
    tls: tokio_rustls::TlsAcceptor,
    /// Sandboxes whose room server's connection broke, by attach token, for `grace`.
    detached: std::sync::Mutex<std::collections::HashMap<String, Session>>,
    grace: Duration,
}

/// A sandbox this host relays: everything needed to relay it again on another connection.
struct Session {
    name: String,
    token: String,
    receipt: Receipt,
    sandbox: Sandbox,
    to_agent: tokio::sync::mpsc::Sender<Vec<u8>>,
    from_agent: tokio::sync::mpsc::Receiver<crate::handle::Relayed>,
    /// The highest request id any connection has used.
    last_id: u64,
    /// Counts the session's detaches: a grace timer ends only the detach it was set for.
    detaches: u64,
    _slot: Slot,
    /// Released last, once the sandbox has ended.
    _name: NameHeld,
}

/// How a relay on one connection ended.
enum Relay {
    /// The sandbox ended (the host's last frame said why).
    Ended,
    /// The room server closed the connection: it is done with the sandbox.
    Closed,
    /// The connection broke (no TLS close: the room server died, or the network): the sandbox
    /// waits for an attach.
    Broken,
}

impl Host {
    /// A host serving `backend` (chosen because `tier_reason`) as `id`, at most `capacity`
    /// sandboxes at once, with `tls` (which must require client certificates).
    pub fn new(
        backend: Backend,
        tier_reason: String,
        id: String,
        capacity: usize,
        tls: Arc<rustls::ServerConfig>,
    ) -> Host {
        Host {
            backend,
            tier_reason,
            id,
            capacity,
            running: Arc::default(),
            names: Names::default(),
            tls: tokio_rustls::TlsAcceptor::from(tls),
            detached: std::sync::Mutex::default(),
            grace: Duration::from_secs(120),
        }
    }

    /// How long a sandbox whose room server's connection broke waits for an attach (default
    /// 2 minutes) before it is killed.
    pub fn with_grace(mut self, grace: Duration) -> Host {
        self.grace = grace;
        self
    }

    fn detached(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Session>> {
        self.detached.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host's status now.
    pub fn status(&self) -> HostStatus {
        HostStatus {
            id: self.id.clone(),
            tier: self.backend.tier().name().to_owned(),
            tier_reason: self.tier_reason.clone(),
            capacity: self.capacity,
            running: self.running.load(Ordering::SeqCst),
            version: crate::VERSION.to_owned(),
        }
    }

    /// Serves room servers on `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        let handshakes = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        loop {
            let Ok(permit) = handshakes.clone().acquire_owned().await else {
                return;
            };
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            keepalive(&tcp);
            let host = self.clone();
            tokio::spawn(async move {
                let accepted = tokio::time::timeout(CONNECT_WITHIN, host.tls.accept(tcp)).await;
                drop(permit);
                let tls = match accepted {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, error = %e, "a connection failed TLS (no valid client certificate?)");
                        return;
                    }
                    Err(_) => return,
                };
                host.serve_one(tls, peer).await;
            });
        }
    }

    async fn serve_one<S>(self: Arc<Self>, mut conn: S, peer: std::net::SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let request = match tokio::time::timeout(STATUS_WITHIN, read_line(&mut conn)).await {
            Ok(Ok(line)) => serde_json::from_slice::<HostRequest>(&line),
            _ => return,
        };
        let session = match request {
            Ok(HostRequest::Status) => {
                let status = self.status();
                let _ = write_line(&mut conn, &HostAnswer::Status { status }).await;
                let _ = conn.shutdown().await;
                return;
            }
            Ok(HostRequest::Start { name, limits }) => {
                match self.start(&mut conn, &name, &limits, peer).await {
                    Some(s) => s,
                    None => return,
                }
            }
            Ok(HostRequest::Attach { name, token }) => {
                let found = {
                    let mut detached = self.detached();
                    match detached.get(&token) {
                        Some(s) if s.name == name => detached.remove(&token),
                        _ => None,
                    }
                };
                match found {
                    Some(s) => {
                        tracing::info!(sandbox = %name, %peer, "a room server attached again");
                        s
                    }
                    None => {
                        let _ =
                            refuse(&mut conn, format!("no sandbox {name} waits here"), false).await;
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = refuse(&mut conn, format!("a malformed request: {e}"), false).await;
                return;
            }
        };
        let answer = HostAnswer::Started {
            receipt: Box::new(session.receipt.clone()),
            token: session.token.clone(),
            first_id: session.last_id.saturating_add(1),
        };
        if write_line(&mut conn, &answer).await.is_err() {
            self.detach(session);
            return;
        }
        let (session, how) = relay(session, conn).await;
        match how {
            Relay::Broken => {
                tracing::warn!(sandbox = %session.name, %peer, "the room server's connection broke; the sandbox waits for it");
                self.detach(session);
            }
            Relay::Closed | Relay::Ended => {
                session.sandbox.kill();
                let _ = session.sandbox.ended().await;
            }
        }
    }

    /// Starts `name` for a room server, or answers why not.
    async fn start<S>(
        &self,
        conn: &mut S,
        name: &str,
        limits: &Limits,
        peer: std::net::SocketAddr,
    ) -> Option<Session>
    where
        S: AsyncWrite + Unpin,
    {
        // One sandbox per name: a second start of a room's sandbox (a peer claiming it, or a
        // start racing its own end) is refused, never run beside it.
        let Some(held) = NameHeld::take(&self.names, name) else {
            let _ = refuse(
                conn,
                format!("a sandbox named {name} is already here"),
                false,
            )
            .await;
            return None;
        };
        // A slot, or a refusal the room server takes to the next host.
        let taken = self
            .running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        if taken.is_err() {
            let full = format!(
                "sandbox host {} is at its capacity ({})",
                self.id, self.capacity
            );
            let _ = refuse(conn, full, true).await;
            return None;
        }
        let slot = Slot(self.running.clone());
        let (sandbox, events, receipt) = match self.backend.start(name, limits).await {
            Ok(s) => s,
            Err(e) => {
                // The whole chain: "the host refused to start the sandbox" alone says nothing
                // an operator can act on.
                let why = crate::Chain(&e).to_string();
                tracing::warn!(sandbox = %name, error = %why, "cannot start a sandbox");
                let _ = refuse(conn, why, false).await;
                return None;
            }
        };
        tracing::info!(sandbox = %name, %peer, "sandbox started for a room server");
        // Everything the agent sends goes to the room server from here on.
        drop(events);
        let (to_agent, from_agent) = sandbox.relay();
        let mut token = [0u8; 16];
        if rustix::rand::getrandom(&mut token, rustix::rand::GetRandomFlags::empty()).is_err() {
            sandbox.kill();
            let _ = refuse(conn, "no randomness for a token".into(), false).await;
            return None;
        }
        Some(Session {
            name: name.to_owned(),
            token: hex::encode(token),
            receipt,
            sandbox,
            to_agent,
            from_agent,
            last_id: 0,
            detaches: 0,
            _slot: slot,
            _name: held,
        })
    }

    /// Keeps `session` for an attach, for the grace period; then kills it.
    fn detach(self: &Arc<Self>, mut session: Session) {
        session.detaches += 1;
        let this = session.detaches;
        let token = session.token.clone();
        self.detached().insert(token.clone(), session);
        let host = Arc::downgrade(self);
        let grace = self.grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            // Only if still detached since this detach (an attach and a later detach have a
            // timer of their own).
            let expired = host.upgrade().and_then(|h| {
                let mut detached = h.detached();
                match detached.get(&token) {
                    Some(s) if s.detaches == this => detached.remove(&token),
                    _ => None,
                }
            });
            if let Some(s) = expired {
                tracing::warn!(sandbox = %s.name, "no room server attached again in time; killing the sandbox");
                s.sandbox.kill();
                let _ = s.sandbox.ended().await;
            }
        });
    }
}

/// The id of the request in a room server's frame (postcard: the id is the first field).
fn request_id(frame: &[u8]) -> Option<u64> {
    postcard::take_from_bytes::<u64>(frame.get(4..)?)
        .ok()
        .map(|(id, _)| id)
}

/// Relays `session` on `conn` until the sandbox ends or the connection ends; gives the session
/// back with how.
async fn relay<S>(mut session: Session, conn: S) -> (Session, Relay)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(conn);
    // Requests this connection sent and the agent has not answered: answers to any other id
    // (an earlier connection's, arriving late) are dropped, not taken for this one's.
    let asked = Arc::new(std::sync::Mutex::new(
        std::collections::HashSet::<u64>::new(),
    ));
    let last_id = Arc::new(std::sync::atomic::AtomicU64::new(session.last_id));
    // The room server's frames, whole, to the agent. Its closing the connection ends the
    // relay; so does an agent that leaves a frame untaken (it stopped reading).
    let mut inbound = {
        let (to_agent, asked, last_id) = (session.to_agent.clone(), asked.clone(), last_id.clone());
        tokio::spawn(async move {
            let mut buf = Vec::new();
            loop {
                let frame = match read_raw_frame(&mut rd, &mut buf).await {
                    Ok(Some(f)) => f,
                    Ok(None) => return Relay::Closed,
                    // A frame the protocol forbids is no broken network: the peer that sent it
                    // gets no attach, and its sandbox ends now rather than after the grace.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                        tracing::warn!(error = %e, "a room server broke the protocol; its sandbox ends");
                        return Relay::Closed;
                    }
                    Err(_) => return Relay::Broken,
                };
                if let Some(id) = request_id(&frame).filter(|id| *id != 0) {
                    asked.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
                    last_id.fetch_max(id, Ordering::SeqCst);
                }
                match tokio::time::timeout(RELAY_STALL, to_agent.send(frame)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Relay::Closed,
                    Err(_) => {
                        tracing::warn!("a sandbox's agent stopped taking its frames; killing it");
                        return Relay::Closed;
                    }
                }
            }
        })
    };
    let how = loop {
        tokio::select! {
            biased;
            relayed = session.from_agent.recv() => {
                let Some(m) = relayed else { break Relay::Ended };
                if let Some((id, last)) = m.answers {
                    let mut asked = asked.lock().unwrap_or_else(|e| e.into_inner());
                    let ours = if last { asked.remove(&id) } else { asked.contains(&id) };
                    if !ours {
                        continue;
                    }
                }
                let mut sent = wr.write_all(&m.frame).await;
                // TLS holds written records until flushed: flushed whenever nothing else
                // waits, so the last frame of a burst is not held back.
                if sent.is_ok() && session.from_agent.is_empty() {
                    sent = wr.flush().await;
                }
                if sent.is_err() {
                    break Relay::Broken;
                }
            }
            how = &mut inbound => break how.unwrap_or(Relay::Closed),
            how = session.sandbox.ended() => {
                while let Ok(m) = session.from_agent.try_recv() {
                    let _ = wr.write_all(&m.frame).await;
                }
                let reason = match how {
                    Ended::Stopped => "stopped on its sandbox host".to_owned(),
                    Ended::Died { reason } => reason,
                    Ended::ProtocolViolation(v) => format!("the agent broke the protocol: {v}"),
                };
                tracing::info!(sandbox = %session.name, %reason, "sandbox ended");
                if let Ok(last) = proto::encode(&Message::HostEnded { reason }) {
                    let _ = wr.write_all(&last).await;
                }
                let _ = wr.flush().await;
                break Relay::Ended;
            }
        }
    };
    inbound.abort();
    if matches!(how, Relay::Closed) {
        // Ended before the connection closes: the room server waits for the close, so a
        // start of the same room after a stop never meets this one's leftovers (its cgroup).
        session.sandbox.kill();
        let _ = session.sandbox.ended().await;
    }
    if matches!(how, Relay::Closed | Relay::Ended) {
        let _ = wr.shutdown().await;
    }
    session.last_id = last_id.load(Ordering::SeqCst);
    (session, how)
}

/// A sandbox counted in a host's load until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The sandbox names a host holds.
type Names = Arc<std::sync::Mutex<std::collections::HashSet<String>>>;

/// A sandbox name held on this host until the session that holds it is gone.
struct NameHeld(Names, String);

impl NameHeld {
    /// Holds `name`, unless a sandbox of that name is here already.
    fn take(names: &Names, name: &str) -> Option<NameHeld> {
        let mut held = names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.insert(name.to_owned())
            .then(|| NameHeld(names.clone(), name.to_owned()))
    }
}

impl Drop for NameHeld {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.1);
    }
}

async fn refuse<W: AsyncWrite + Unpin>(
    w: &mut W,
    error: String,
    full: bool,
) -> std::io::Result<()> {
    write_line(w, &HostAnswer::Refused { error, full }).await?;
    w.shutdown().await
}

async fn write_line<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, v: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await
}

/// One line (without its newline), read byte by byte so nothing after it is taken; at most
/// [`MAX_LINE`] bytes.
async fn read_line<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        if r.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if byte[0] == b'\n' {
            return Ok(line);
        }
        if line.len() >= MAX_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "an overlong line",
            ));
        }
        line.push(byte[0]);
    }
}

/// One whole frame, length prefix included, not decoded; `Ok(None)` at a clean end between
/// frames (over TLS: the peer's close_notify; a connection that just drops is an error).
async fn read_raw_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    if !read_all(r, &mut len).await? {
        return Ok(None);
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a frame over the limit",
        ));
    }
    buf.clear();
    buf.extend_from_slice(&len);
    buf.resize(4 + n, 0);
    if !read_all(r, &mut buf[4..]).await? {
        return Ok(None);
    }
    Ok(Some(buf.clone()))
}

/// Fills `buf`; `false` at a clean end (over TLS the peer's close_notify), even part way: a
/// room server closing in the middle of a frame it will never finish is done, not broken.
async fn read_all<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let n = r.read(&mut buf[got..]).await?;
        if n == 0 {
            return Ok(false);
        }
        got += n;
    }
    Ok(true)
}

/// Why a sandbox host did not answer a request, or did not start (or attach to) a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The address is not `host:port`.
    #[error("not host:port")]
    Address,
    /// The host part is not a name a certificate can name.
    #[error("not a name a certificate can name")]
    ServerName(#[source] rustls::pki_types::InvalidDnsNameError),
    /// The TCP connection failed.
    #[error("cannot connect")]
    Connect(#[source] std::io::Error),
    /// The TLS handshake failed (the host's certificate, or ours, was refused).
    #[error("TLS")]
    Tls(#[source] std::io::Error),
    /// No connection within the time allowed.
    #[error("no connection in time")]
    ConnectTimeout,
    /// The request could not be sent.
    #[error("cannot send the request")]
    Send(#[source] std::io::Error),
    /// The host closed the connection before its answer.
    #[error("the host closed the connection")]
    Closed(#[source] std::io::Error),
    /// The host refused, in its own words.
    #[error("{0}")]
    Refused(String),
    /// The host answered with something that does not answer this request.
    #[error("an answer out of turn")]
    OutOfTurn,
    /// The host's answer did not parse.
    #[error("a malformed answer")]
    Malformed(#[source] serde_json::Error),
    /// No status within the time allowed.
    #[error("no status in time")]
    StatusTimeout,
    /// No answer to a start or an attach within the time allowed.
    #[error("no answer in time")]
    StartTimeout,
    /// The sandbox's agent, relayed by the host, did not answer its hello.
    #[error("its agent did not answer")]
    NotReady(#[source] crate::CallError),
}

/// The room server's side: the sandbox hosts it places sandboxes on.
pub struct Hosts {
    addresses: Vec<String>,
    tier: Tier,
    tls: tokio_rustls::TlsConnector,
    /// Where each running sandbox's host and attach token are kept (one file per sandbox,
    /// 0600), so a room server restarted after a crash attaches to its sandboxes again.
    records: Option<std::path::PathBuf>,
}

/// What attaches a room server to a sandbox on a host again (`RECORDS/<name>.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    address: String,
    host: String,
    token: String,
}

impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosts")
            .field("addresses", &self.addresses)
            .field("tier", &self.tier)
            .finish_non_exhaustive()
    }
}

/// A stream to a sandbox host.
type Conn = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

impl Hosts {
    /// Sandbox hosts at `addresses` (`host:port`, the host as its certificate names it), whose
    /// sandboxes must run in `tier` (`Auto`: any), reached with `tls` (which presents this room
    /// server's client certificate and trusts the hosts' CA).
    pub fn new(addresses: Vec<String>, tier: Tier, tls: Arc<rustls::ClientConfig>) -> Hosts {
        Hosts {
            addresses,
            tier,
            tls: tokio_rustls::TlsConnector::from(tls),
            records: None,
        }
    }

    /// Keeps attach records in `dir` (made 0700 when missing): a sandbox whose room server
    /// died is attached again by the next start of its name, while its host keeps it.
    pub fn with_records(mut self, dir: std::path::PathBuf) -> Hosts {
        self.records = Some(dir);
        self
    }

    fn record_path(&self, name: &str) -> Option<std::path::PathBuf> {
        // A warm pool's sandboxes ("pool" and a fresh id) are nobody's: never recorded, never
        // attached to, so a restarted server can never hand one room's running sandbox to
        // another.
        let ok = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric())
            && !name.starts_with("pool");
        self.records
            .as_ref()
            .filter(|_| ok)
            .map(|d| d.join(format!("{name}.json")))
    }

    fn record(&self, name: &str) -> Option<Record> {
        let path = self.record_path(name)?;
        let bytes = std::fs::read(path).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn keep_record(&self, name: &str, record: &Record) {
        use std::os::unix::fs::DirBuilderExt as _;
        let (Some(dir), Some(_)) = (self.records.as_ref(), self.record_path(name)) else {
            return;
        };
        let kept = (|| -> std::io::Result<()> {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
            crate::vm::write_durably(dir, &format!("{name}.json"), &bytes)
        })();
        if let Err(e) = kept {
            tracing::warn!(sandbox = %name, error = %e, "cannot keep the sandbox's attach record");
        }
    }

    /// Whether a sandbox of `name` may be waiting on a host for this server to attach.
    pub fn has_kept(&self, name: &str) -> bool {
        self.record_path(name).is_some_and(|p| p.is_file())
    }

    /// Attaches again to `name` where its record says it runs, else starts it as
    /// [`Hosts::start`]; an attached sandbox says it carries on ([`Sandbox::resumed`], with
    /// `tag`: the control plane restores nothing into it).
    pub async fn resume(
        &self,
        name: &str,
        limits: &Limits,
        tag: Option<&str>,
    ) -> Result<Started, StartError> {
        if let Some(record) = self.record(name) {
            let request = HostRequest::Attach {
                name: name.to_owned(),
                token: record.token.clone(),
            };
            match self
                .open(&record.address, &record.host, name, &request)
                .await
            {
                Ok(started) => {
                    tracing::info!(sandbox = %name, host = %record.host, "attached again to a running sandbox");
                    started.0.set_resumed(crate::Resumed {
                        from: crate::Keep::Memory,
                        tag: tag.unwrap_or_default().to_owned(),
                    });
                    return Ok(started);
                }
                Err(e) => {
                    tracing::info!(sandbox = %name, host = %record.host, error = %crate::Chain(&e), "no sandbox to attach to; starting one");
                    if let Some(p) = self.record_path(name) {
                        let _ = std::fs::remove_file(p);
                    }
                }
            }
        }
        self.start(name, limits).await
    }

    /// The tier the hosts must run.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    async fn connect(&self, address: &str) -> Result<Conn, HostError> {
        let host = match address.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
            None => return Err(HostError::Address),
        };
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(HostError::ServerName)?;
        let connected = async {
            let tcp = tokio::net::TcpStream::connect(address)
                .await
                .map_err(HostError::Connect)?;
            keepalive(&tcp);
            self.tls.connect(name, tcp).await.map_err(HostError::Tls)
        };
        tokio::time::timeout(CONNECT_WITHIN, connected)
            .await
            .map_err(|_| HostError::ConnectTimeout)?
    }

    /// Asks the host at `address` for its status.
    pub async fn status(&self, address: &str) -> Result<HostStatus, HostError> {
        let asked = async {
            let mut conn = self.connect(address).await?;
            write_line(&mut conn, &HostRequest::Status)
                .await
                .map_err(HostError::Send)?;
            let line = read_line(&mut conn).await.map_err(HostError::Closed)?;
            match serde_json::from_slice::<HostAnswer>(&line) {
                Ok(HostAnswer::Status { status }) => Ok(status),
                Ok(HostAnswer::Refused { error, .. }) => Err(HostError::Refused(error)),
                Ok(_) => Err(HostError::OutOfTurn),
                Err(e) => Err(HostError::Malformed(e)),
            }
        };
        tokio::time::timeout(STATUS_WITHIN, asked)
            .await
            .map_err(|_| HostError::StatusTimeout)?
    }

    /// Starts a sandbox named `name` on the least loaded host of the tier that has room, and
    /// relays its agent here.
    pub async fn start(&self, name: &str, limits: &Limits) -> Result<Started, StartError> {
        let asked = futures_util::future::join_all(
            self.addresses
                .iter()
                .map(|a| async move { (a, self.status(a).await) }),
        )
        .await;
        let mut why = Vec::new();
        let mut candidates = Vec::new();
        for (address, status) in asked {
            match status {
                Ok(s) if self.tier != Tier::Auto && s.tier != self.tier.name() => {
                    why.push(format!("{address}: runs the {} tier", s.tier));
                }
                Ok(s) if s.running >= s.capacity => {
                    why.push(format!("{address}: full ({} of {})", s.running, s.capacity));
                }
                Ok(s) => candidates.push((address, s)),
                Err(e) => why.push(format!("{address}: {}", crate::Chain(&e))),
            }
        }
        // Least loaded first (by share of capacity), then by address, for a stable choice.
        candidates.sort_by(|(a, x), (b, y)| {
            let load = |s: &HostStatus| s.running as f64 / s.capacity.max(1) as f64;
            load(x).total_cmp(&load(y)).then_with(|| a.cmp(b))
        });
        // Any refusal sends the sandbox to the next host: one host that fails every start
        // (and so always looks least loaded) must not stop the others from taking rooms.
        for (address, status) in candidates {
            match self.start_on(address, &status, name, limits).await {
                Ok(started) => return Ok(started),
                Err(e) => why.push(format!("{address}: {}", crate::Chain(&e))),
            }
        }
        Err(StartError::Unavailable(if why.is_empty() {
            "no sandbox host is configured".into()
        } else {
            format!("no sandbox host can take it: {}", why.join("; "))
        }))
    }

    /// Starts `name` on the host at `address`, or says why not.
    async fn start_on(
        &self,
        address: &str,
        status: &HostStatus,
        name: &str,
        limits: &Limits,
    ) -> Result<Started, HostError> {
        let request = HostRequest::Start {
            name: name.to_owned(),
            limits: limits.clone(),
        };
        self.open(address, &status.id, name, &request).await
    }

    /// Sends `request` (a start or an attach of `name`) to the host `who` at `address` and
    /// relays the sandbox it answers with.
    async fn open(
        &self,
        address: &str,
        who: &str,
        name: &str,
        request: &HostRequest,
    ) -> Result<Started, HostError> {
        let mut conn = self.connect(address).await?;
        write_line(&mut conn, request)
            .await
            .map_err(HostError::Send)?;
        let line = tokio::time::timeout(START_WITHIN, read_line(&mut conn))
            .await
            .map_err(|_| HostError::StartTimeout)?
            .map_err(HostError::Closed)?;
        let (mut receipt, token, first_id) = match serde_json::from_slice::<HostAnswer>(&line) {
            Ok(HostAnswer::Started {
                receipt,
                token,
                first_id,
            }) => (*receipt, token, first_id),
            Ok(HostAnswer::Refused { error, .. }) => return Err(HostError::Refused(error)),
            Ok(_) => return Err(HostError::OutOfTurn),
            Err(e) => return Err(HostError::Malformed(e)),
        };
        // Room members see the host's name; its address is for the operator's log.
        let who = who.to_owned();
        receipt.host = Some(who.clone());
        tracing::info!(sandbox = %name, host = %who, %address, "sandbox placed");
        let (ours, theirs) = tokio::io::duplex(PIPE);
        let (sandbox, events, control) = Sandbox::wire_from(ours, first_id);
        let host_ended = sandbox.host_ended_cell();
        let record = self.record_path(name);
        let kept = Record {
            address: address.to_owned(),
            host: who.clone(),
            token,
        };
        tokio::spawn(async move {
            let mut killed = control.killed;
            let mut closed = control.stream_closed;
            let (mut from_here, mut to_here) = tokio::io::split(theirs);
            let (mut from_host, mut to_host) = tokio::io::split(conn);
            let stopped = tokio::select! {
                _ = tokio::io::copy(&mut from_host, &mut to_here) => false,
                _ = tokio::io::copy(&mut from_here, &mut to_host) => false,
                _ = killed.wait_for(|k| *k) => true,
            };
            // The host kills the sandbox when its connection closes, and closes its side once
            // the sandbox has ended there: that is waited for (bounded), as a local stop waits
            // for its sandbox to end.
            let _ = to_host.shutdown().await;
            if stopped {
                let _ = tokio::time::timeout(
                    ENDED_WITHIN,
                    tokio::io::copy(&mut from_host, &mut to_here),
                )
                .await;
            }
            drop((from_host, to_host));
            let _ = to_here.shutdown().await;
            drop((from_here, to_here));
            let _ = closed.wait_for(|c| *c).await;
            // Whatever ended the relay here, there is nothing to attach to any more (a room
            // server that dies never gets here: its record stays for its next start).
            if let Some(p) = record {
                let _ = std::fs::remove_file(p);
            }
            let outcome = if stopped || *killed.borrow() {
                Ended::Stopped
            } else {
                let said = host_ended.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Ended::Died {
                    reason: match said {
                        Some(r) => format!("{r} (on sandbox host {who})"),
                        None => format!("the connection to sandbox host {who} was lost"),
                    },
                }
            };
            let _ = control.ended.send(Some(outcome));
        });
        if let Err(e) = sandbox.ready(READY_WITHIN).await {
            sandbox.kill();
            let _ = sandbox.ended().await;
            return Err(HostError::NotReady(e));
        }
        if !kept.token.is_empty() {
            self.keep_record(name, &kept);
        }
        Ok((sandbox, events, receipt))
    }
}

impl TierBackend for Hosts {
    fn tier(&self) -> Tier {
        match Hosts::tier(self) {
            // Any tier the hosts run: the namespace tier's guarantees at least.
            Tier::Auto => Tier::Namespace,
            t => t,
        }
    }

    fn resume<'a>(
        &'a self,
        name: &'a str,
        limits: &'a Limits,
        tag: Option<&'a str>,
    ) -> Starting<'a> {
        Box::pin(Hosts::resume(self, name, limits, tag))
    }

    fn has_kept(&self, name: &str) -> bool {
        Hosts::has_kept(self, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_lines_read_as_documented() {
        let start = serde_json::to_value(HostRequest::Start {
            name: "room1".into(),
            limits: Limits::default(),
        })
        .expect("json");
        assert_eq!(start["op"], "start");
        assert_eq!(start["limits"]["pids"], 512);
        assert_eq!(
            serde_json::to_value(HostRequest::Status).expect("json"),
            serde_json::json!({"op": "status"})
        );
        let refused: HostAnswer =
            serde_json::from_str(r#"{"answer":"refused","error":"no"}"#).expect("parsed");
        assert_eq!(
            refused,
            HostAnswer::Refused {
                error: "no".into(),
                full: false
            }
        );
    }

    #[tokio::test]
    async fn raw_frames_pass_whole_and_overlong_ones_are_refused() {
        let frame = proto::encode(&Message::PtyExit { code: Some(3) }).expect("frame");
        let mut two = frame.clone();
        two.extend(&frame);
        let mut r = &two[..];
        let mut buf = Vec::new();
        assert_eq!(
            read_raw_frame(&mut r, &mut buf).await.expect("one"),
            Some(frame.clone())
        );
        assert_eq!(
            read_raw_frame(&mut r, &mut buf).await.expect("two"),
            Some(frame)
        );
        assert_eq!(read_raw_frame(&mut r, &mut buf).await.expect("end"), None);
        let huge = ((MAX_FRAME + 1) as u32).to_be_bytes();
        let mut r = &huge[..];
        assert!(read_raw_frame(&mut r, &mut buf).await.is_err());
        let long = vec![b'x'; MAX_LINE + 1];
        let mut r = &long[..];
        assert!(read_line(&mut r).await.is_err());
    }
}

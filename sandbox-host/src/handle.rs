//! The control plane's handle on one running sandbox: it speaks to the guest agent over the
//! framed stream, pairs replies with requests, and reports output and the sandbox's end as
//! [`Event`]s. The agent is untrusted: a malformed or oversized frame ends the sandbox.

use crate::cgroup::Pressure;
use crate::proto::{self, AgentError, Message, Op, Reply, Request, CHUNK, PROTOCOL_VERSION};
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

/// Requests queued for the agent before callers wait.
const REQUEST_QUEUE: usize = 256;
/// Events queued for the control plane before reading from the agent pauses (which in turn
/// pauses the agent's PTY reader: terminal flow control).
const EVENT_QUEUE: usize = 64;
/// Frames a relay holds between the agent and a sandbox host's connection.
#[cfg(feature = "remote")]
const RELAYED: usize = 2;
/// Outbound connections (see [`Sandbox::on_outbound`]) open at once; the agent keeps its own
/// cap too.
const MAX_OUTBOUND: usize = 64;
/// Snapshot chunks queued between the agent and the file they are written to.
const MAX_PENDING_CHUNKS: usize = 64;
/// Time the agent gets to answer `Quiesce` (a sync of the guest's file systems): a guest that
/// does not answer is killed instead of kept, and cannot hold up a stop for longer.
const QUIESCE_WITHIN: Duration = Duration::from_secs(15);

/// Locks `m`, carrying on past a poisoned lock (its maps stay consistent: every critical
/// section is a single insert, remove or lookup).
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Something the sandbox reports without being asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Terminal output.
    PtyOutput(Vec<u8>),
    /// The terminal's program ended.
    PtyExit {
        /// Its exit code, if it exited normally.
        code: Option<i32>,
    },
}

/// How a sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The control plane stopped it.
    Stopped,
    /// The agent (PID 1) exited or was killed; `reason` says what the host observed.
    Died {
        /// Human-readable cause: OOM, pids limit, exit status.
        reason: String,
    },
    /// The agent broke the protocol; the sandbox was killed.
    ProtocolViolation(String),
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The agent refused or failed the operation.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The sandbox is gone.
    #[error("the sandbox is not running")]
    Gone,
    /// No answer in time.
    #[error("the sandbox did not answer in time")]
    Timeout,
    /// The caller stopped waiting ([`Sandbox::call_until`]); the agent was told to end the
    /// command.
    #[error("the command was stopped")]
    Cancelled,
    /// The answer had the wrong shape (the sandbox is then killed).
    #[error("the sandbox answered out of protocol")]
    Protocol,
}

struct Pending {
    reply: oneshot::Sender<Result<Reply, AgentError>>,
    chunks: Option<Chunks>,
}

/// Where a request's chunks go.
#[derive(Clone)]
struct Chunks {
    sink: mpsc::Sender<Vec<u8>>,
    /// A full sink loses the chunk (a command's output for a reader that fell behind) instead
    /// of holding up everything the agent sends (a snapshot's chunks wait: they must all land).
    lossy: bool,
}

struct Inner {
    requests: mpsc::Sender<Vec<u8>>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    ended: watch::Receiver<Option<Ended>>,
    kill: watch::Sender<bool>,
    pressure: Mutex<Option<PressureFn>>,
    /// Set when the agent's stream has ended: no reply will ever come.
    closed: std::sync::atomic::AtomicBool,
    /// Open port connections: where their incoming bytes go.
    streams: Mutex<HashMap<u32, crate::bridge::End>>,
    next_stream: std::sync::atomic::AtomicU32,
    /// Who takes the connections code inside opens to the egress forwarder; until set, they
    /// are closed at once.
    outbound: Mutex<Option<OutboundFn>>,
    /// The last frame the agent gets ([`Op::Quiesce`]): the writer sends it and nothing after.
    seal: Mutex<Option<oneshot::Sender<Vec<u8>>>>,
    /// The backend's side of [`Sandbox::park`], when it can keep a stopped sandbox.
    parker: Mutex<Option<mpsc::Sender<ParkRequest>>>,
    /// How this sandbox came back, when the backend resumed it from what it kept.
    resumed: Mutex<Option<Resumed>>,
    /// Where every message from the agent goes instead of being handled here, once a sandbox
    /// host relays this sandbox to a room server ([`Sandbox::relay`]).
    relay: Mutex<Option<mpsc::Sender<Relayed>>>,
    /// What the sandbox host said when the sandbox ended there ([`Message::HostEnded`]).
    host_ended: Arc<Mutex<Option<String>>>,
}

/// A message of the agent on its way to a relay: its frame, and which request it answers
/// (`(id, true)` for the reply that closes request `id`, `(id, false)` for a chunk of it).
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub(crate) struct Relayed {
    pub(crate) answers: Option<(u64, bool)>,
    pub(crate) frame: Vec<u8>,
}

/// What a backend keeps of a sandbox it stops with [`Sandbox::park`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// The workspace disk: the next start boots from it instead of restoring a snapshot.
    Disk,
    /// The disk and the guest's memory: the next start carries on where it stopped, with every
    /// process still running.
    Memory,
}

impl Keep {
    /// `disk` or `memory`.
    pub fn name(self) -> &'static str {
        match self {
            Keep::Disk => "disk",
            Keep::Memory => "memory",
        }
    }
}

/// What [`Sandbox::park`] kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    /// What was kept (memory may have fallen back to the disk alone).
    pub kept: Keep,
    /// Bytes kept on the host (the disk's allocated blocks, and the memory image).
    pub bytes: u64,
    /// Why memory was asked for and only the disk was kept.
    pub note: Option<String>,
}

/// How a sandbox was resumed from what its backend kept (see [`Sandbox::resumed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resumed {
    /// What it was resumed from.
    pub from: Keep,
    /// The tag the sandbox was parked with (the control plane's snapshot name).
    pub tag: String,
}

/// Why [`Sandbox::park`] did not keep the sandbox. The sandbox may still run: the caller
/// kills it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParkError {
    /// The backend keeps nothing (the namespace tier).
    #[error("this sandbox tier keeps nothing between runs")]
    Unsupported,
    /// A step failed.
    #[error("the sandbox could not be kept: {0}")]
    Failed(String),
}

/// A park asked of the backend, once the agent is quiet.
pub(crate) struct ParkRequest {
    pub(crate) keep: Keep,
    pub(crate) tag: String,
    pub(crate) reply: oneshot::Sender<Result<Parked, ParkError>>,
}

type PressureFn = Box<dyn Fn() -> Pressure + Send + Sync>;
/// Takes one outbound connection from inside the sandbox, with whose process opened it (the
/// agent's `actor`, empty when it could not tell).
pub type OutboundFn = Arc<dyn Fn(tokio::io::DuplexStream, String) + Send + Sync>;

/// A running sandbox. Cheap to clone; every clone drives the same agent.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").finish_non_exhaustive()
    }
}

/// The other half of a connection, for the backend: it must call `ended` with what it observed
/// when the sandbox's process ends, and may watch `killed` to kill it on request.
pub(crate) struct Control {
    pub(crate) ended: watch::Sender<Option<Ended>>,
    pub(crate) killed: watch::Receiver<bool>,
    /// Becomes true when the agent's stream has ended (a VM's guest may end without its VMM
    /// process ending: cloud-hypervisor reboots a guest that panics).
    pub(crate) stream_closed: watch::Receiver<bool>,
}

impl Control {
    /// Lets `sandbox` be parked: its requests arrive on the returned receiver.
    pub(crate) fn parking(sandbox: &Sandbox) -> mpsc::Receiver<ParkRequest> {
        let (tx, rx) = mpsc::channel(1);
        *locked(&sandbox.inner.parker) = Some(tx);
        rx
    }
}

impl Sandbox {
    /// Wires a handle to an agent stream. Returns the handle, its events, and the backend's
    /// control half.
    pub(crate) fn wire<S>(stream: S) -> (Sandbox, mpsc::Receiver<Event>, Control)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::wire_from(stream, 1)
    }

    /// [`Sandbox::wire`], numbering requests from `first_id` (a handle that takes over an agent
    /// another handle spoke to must not reuse that one's ids: its late replies would be taken
    /// for answers).
    pub(crate) fn wire_from<S>(
        stream: S,
        first_id: u64,
    ) -> (Sandbox, mpsc::Receiver<Event>, Control)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, mut wr) = tokio::io::split(stream);
        let (requests, mut req_rx) = mpsc::channel::<Vec<u8>>(REQUEST_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let (ended_tx, ended) = watch::channel(None);
        let (kill, killed) = watch::channel(false);
        let (seal, mut sealed) = oneshot::channel::<Vec<u8>>();
        let inner = Arc::new(Inner {
            requests,
            pending: Mutex::default(),
            next_id: AtomicU64::new(first_id.max(1)),
            ended,
            kill,
            pressure: Mutex::default(),
            closed: Default::default(),
            streams: Mutex::default(),
            next_stream: std::sync::atomic::AtomicU32::new(1),
            outbound: Mutex::default(),
            seal: Mutex::new(Some(seal)),
            parker: Mutex::default(),
            resumed: Mutex::default(),
            relay: Mutex::default(),
            host_ended: Arc::default(),
        });
        tokio::spawn(async move {
            let mut sealing = true;
            loop {
                tokio::select! {
                    biased;
                    last = &mut sealed, if sealing => {
                        sealing = false;
                        let Ok(last) = last else { continue };
                        // The agent's stream stays open (a closed stream would end it) but
                        // carries nothing more: a frame cut off by the save would reach the
                        // restored agent as garbage.
                        let _ = wr.write_all(&last).await;
                        let _ = wr.flush().await;
                        while req_rx.recv().await.is_some() {}
                        break;
                    }
                    frame = req_rx.recv() => {
                        let Some(frame) = frame else { break };
                        if wr.write_all(&frame).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = wr.shutdown().await;
        });
        let weak = Arc::downgrade(&inner);
        let (closed_tx, stream_closed) = watch::channel(false);
        tokio::spawn(async move {
            let err = read_loop(rd, &weak, events_tx).await;
            let _ = closed_tx.send(true);
            if let Some(inner) = weak.upgrade() {
                inner.closed.store(true, Ordering::SeqCst);
                locked(&inner.pending).clear();
                if let Some(violation) = err {
                    tracing::warn!(%violation, "sandbox agent broke the protocol; killing it");
                    let _ = inner.kill.send(true);
                }
            }
        });
        (
            Sandbox { inner },
            events,
            Control {
                ended: ended_tx,
                killed,
                stream_closed,
            },
        )
    }

    /// Waits for the agent's hello; the sandbox is ready only once it answers.
    pub async fn ready(&self, within: Duration) -> Result<u32, CallError> {
        match self.call(Op::Hello, within).await? {
            Reply::Hello { version, pid } if version == PROTOCOL_VERSION => Ok(pid),
            _ => {
                self.kill();
                Err(CallError::Protocol)
            }
        }
    }

    /// Sends `op` and waits up to `within` for its reply.
    pub async fn call(&self, op: Op, within: Duration) -> Result<Reply, CallError> {
        self.call_with_chunks(op, within, None, std::future::pending())
            .await
    }

    /// [`Sandbox::call`], unless `stop` resolves first: then the agent is told to end the
    /// command ([`Op::Cancel`]: its process group is killed) and the call fails with
    /// [`CallError::Cancelled`] at once.
    pub async fn call_until(
        &self,
        op: Op,
        within: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<Reply, CallError> {
        self.call_with_chunks(op, within, None, stop).await
    }

    /// [`Sandbox::call_until`] for an [`Op::Run`]: the command's output chunks go to `output`
    /// as they come (each a stream number, 1 or 2, then the bytes); one that finds `output`
    /// full is dropped, so a reader that falls behind loses output but holds up nothing else.
    ///
    /// What `input` yields goes to the command as [`Op::RunInput`] while it runs.
    pub async fn call_streaming(
        &self,
        op: Op,
        within: Duration,
        output: mpsc::Sender<Vec<u8>>,
        input: Option<mpsc::Receiver<crate::proto::RunInput>>,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<Reply, CallError> {
        let chunks = Chunks {
            sink: output,
            lossy: true,
        };
        self.call_fed(op, within, Some(chunks), input, stop).await
    }

    async fn call_with_chunks(
        &self,
        op: Op,
        within: Duration,
        chunks: Option<Chunks>,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<Reply, CallError> {
        self.call_fed(op, within, chunks, None, stop).await
    }

    async fn call_fed(
        &self,
        op: Op,
        within: Duration,
        chunks: Option<Chunks>,
        mut input: Option<mpsc::Receiver<crate::proto::RunInput>>,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<Reply, CallError> {
        let (id, rx) = self.register(chunks)?;
        let frame = match proto::encode(&Request { id, op }) {
            Ok(frame) => frame,
            Err(_) => {
                self.forget(id);
                return Err(CallError::Agent(AgentError::TooLarge));
            }
        };
        // Sent before anything else is (input for it must reach the agent after it).
        let deadline = tokio::time::Instant::now() + within;
        let sent = tokio::time::timeout_at(deadline, self.inner.requests.send(frame)).await;
        let answered = async {
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Ok(Err(CallError::Gone)),
                Err(e) => return Err(e),
            }
            tokio::time::timeout_at(deadline, async { rx.await.map_err(|_| CallError::Gone) }).await
        };
        tokio::pin!(answered, stop);
        let result = loop {
            tokio::select! {
                r = &mut answered => break r,
                () = &mut stop => {
                    self.forget(id);
                    let _ = self.send(Op::Cancel { id }).await;
                    return Err(CallError::Cancelled);
                }
                given = async { input.as_mut()?.recv().await }, if input.is_some() => match given {
                    Some(given) => {
                        // Bounded by the call's deadline, as everything else it waits for.
                        let sent = self.send(Op::RunInput { id, input: given });
                        let _ = tokio::time::timeout_at(deadline, sent).await;
                    }
                    None => input = None,
                },
            }
        };
        self.forget(id);
        match result {
            Ok(Ok(r)) => r.map_err(CallError::Agent),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// A fresh request id whose reply (and chunks, if any) will be routed back; `Gone` once the
    /// agent's stream has ended, since no reply would ever come.
    fn register(
        &self,
        chunks: Option<Chunks>,
    ) -> Result<(u64, oneshot::Receiver<Result<Reply, AgentError>>), CallError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        locked(&self.inner.pending).insert(id, Pending { reply: tx, chunks });
        if self.inner.closed.load(Ordering::SeqCst) {
            self.forget(id);
            return Err(CallError::Gone);
        }
        Ok((id, rx))
    }

    fn forget(&self, id: u64) {
        locked(&self.inner.pending).remove(&id);
    }

    /// Sends an operation that gets no reply (terminal input, resize).
    pub async fn send(&self, op: Op) -> Result<(), CallError> {
        let frame = proto::encode(&Request { id: 0, op })
            .map_err(|_| CallError::Agent(AgentError::TooLarge))?;
        self.inner
            .requests
            .send(frame)
            .await
            .map_err(|_| CallError::Gone)
    }

    /// Streams a tar archive of the workspace into `sink`; fails past `max_bytes`.
    pub async fn snapshot<W: AsyncWrite + Unpin>(
        &self,
        sink: &mut W,
        max_bytes: u64,
        within: Duration,
    ) -> Result<u64, CallError> {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(MAX_PENDING_CHUNKS);
        let chunks = Chunks {
            sink: tx,
            lossy: false,
        };
        let call = self.call_with_chunks(
            Op::Snapshot { max_bytes },
            within,
            Some(chunks),
            std::future::pending(),
        );
        tokio::pin!(call);
        let mut stored = Stored {
            written: 0,
            max: max_bytes,
            failed: false,
        };
        let reply = loop {
            tokio::select! {
                r = &mut call => break r,
                Some(chunk) = rx.recv() => stored.store(sink, &chunk).await,
            }
        };
        // Chunks sent before the reply are already queued here.
        while let Ok(chunk) = rx.try_recv() {
            stored.store(sink, &chunk).await;
        }
        let (written, write_failed) = (stored.written, stored.failed);
        match reply? {
            Reply::Snapshot { bytes } if bytes == written && !write_failed => Ok(written),
            Reply::Snapshot { .. } if write_failed => Err(CallError::Agent(AgentError::Failed(
                "cannot store the snapshot".into(),
            ))),
            _ => Err(CallError::Protocol),
        }
    }

    /// Unpacks a tar archive read from `source` into the workspace.
    pub async fn restore<R: AsyncRead + Unpin>(
        &self,
        source: &mut R,
        within: Duration,
    ) -> Result<(), CallError> {
        let (id, rx) = self.register(None)?;
        let work = async {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let mut filled = 0;
                while filled < buf.len() {
                    let n = source.read(&mut buf[filled..]).await.map_err(|_| {
                        CallError::Agent(AgentError::Failed("cannot read the snapshot".into()))
                    })?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                let last = filled < buf.len();
                let op = Op::Restore {
                    data: ByteBuf::from(buf[..filled].to_vec()),
                    last,
                };
                let frame = proto::encode(&Request { id, op }).map_err(|_| CallError::Protocol)?;
                self.inner
                    .requests
                    .send(frame)
                    .await
                    .map_err(|_| CallError::Gone)?;
                if last {
                    break;
                }
            }
            rx.await.map_err(|_| CallError::Gone)
        };
        let result = tokio::time::timeout(within, work).await;
        self.forget(id);
        match result {
            Ok(Ok(Ok(Reply::Done))) => Ok(()),
            Ok(Ok(Ok(_))) => Err(CallError::Protocol),
            Ok(Ok(Err(e))) => Err(CallError::Agent(e)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CallError::Timeout),
        }
    }

    pub(crate) fn set_pressure(&self, f: PressureFn) {
        *locked(&self.inner.pressure) = Some(f);
    }

    /// Limits hit so far (zero when the backend cannot tell).
    pub fn pressure(&self) -> Pressure {
        locked(&self.inner.pressure)
            .as_ref()
            .map(|f| f())
            .unwrap_or_default()
    }

    /// Opens a TCP connection to `127.0.0.1:port` inside the sandbox. The returned stream
    /// carries its bytes both ways; dropping it closes the connection. A caller that reads
    /// slowly slows that connection only (flow control, see [`crate::bridge`]): nothing else in
    /// the sandbox waits for it, and nothing is cut.
    pub async fn connect(
        &self,
        port: u16,
        within: Duration,
    ) -> Result<tokio::io::DuplexStream, CallError> {
        let stream =
            self.inner.next_stream.fetch_add(1, Ordering::Relaxed) & !proto::OUTBOUND_STREAM;
        let (end, rx) = crate::bridge::End::new();
        locked(&self.inner.streams).insert(stream, end);
        let forget = || {
            locked(&self.inner.streams).remove(&stream);
        };
        match self.call(Op::Connect { stream, port }, within).await {
            Ok(Reply::Done) => {}
            Ok(_) => {
                forget();
                self.kill();
                return Err(CallError::Protocol);
            }
            Err(e) => {
                forget();
                return Err(e);
            }
        }
        Ok(bridge(&self.inner, stream, rx))
    }

    /// Hands every connection code inside makes to the egress forwarder
    /// ([`proto::EGRESS_PORT`]) to `f`, as a stream carrying its bytes both ways. Replaces any
    /// earlier taker; before the first, such connections are closed at once.
    pub fn on_outbound(&self, f: OutboundFn) {
        *locked(&self.inner.outbound) = Some(f);
    }

    /// Stops the sandbox keeping what the backend can (`keep`), under `tag`: a later start of
    /// the same name given the same tag resumes from it (see [`Sandbox::resumed`]). The agent
    /// is quiesced first, so its stream is cut on a frame's boundary. On `Err` the sandbox may
    /// still run, quiesced: kill it. The agent gets [`QUIESCE_WITHIN`] to answer, the backend
    /// `within` to keep what it keeps.
    pub async fn park(&self, keep: Keep, tag: &str, within: Duration) -> Result<Parked, ParkError> {
        let parker = locked(&self.inner.parker)
            .clone()
            .ok_or(ParkError::Unsupported)?;
        let seal = locked(&self.inner.seal)
            .take()
            .ok_or_else(|| ParkError::Failed("already parked".into()))?;
        let fail = |e: CallError| ParkError::Failed(format!("quiescing the agent: {e}"));
        let (id, rx) = self.register(None).map_err(fail)?;
        let frame = proto::encode(&Request {
            id,
            op: Op::Quiesce,
        })
        .map_err(|_| fail(CallError::Protocol))?;
        let _ = seal.send(frame);
        let quiet = tokio::time::timeout(QUIESCE_WITHIN.min(within), rx).await;
        self.forget(id);
        match quiet {
            Ok(Ok(Ok(Reply::Done))) => {}
            Ok(Ok(Ok(_))) => return Err(fail(CallError::Protocol)),
            Ok(Ok(Err(e))) => return Err(fail(CallError::Agent(e))),
            Ok(Err(_)) => return Err(fail(CallError::Gone)),
            Err(_) => return Err(fail(CallError::Timeout)),
        }
        let (reply, answer) = oneshot::channel();
        let asked = ParkRequest {
            keep,
            tag: tag.to_owned(),
            reply,
        };
        if parker.send(asked).await.is_err() {
            return Err(ParkError::Failed("the sandbox has ended".into()));
        }
        match tokio::time::timeout(within, answer).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ParkError::Failed("the sandbox has ended".into())),
            Err(_) => Err(ParkError::Failed("no answer in time".into())),
        }
    }

    /// How this sandbox came back, when its backend resumed it from what [`Sandbox::park`]
    /// kept (the control plane then restores nothing).
    pub fn resumed(&self) -> Option<Resumed> {
        locked(&self.inner.resumed).clone()
    }

    pub(crate) fn set_resumed(&self, r: Resumed) {
        *locked(&self.inner.resumed) = Some(r);
    }

    /// Hands this sandbox's agent to a relay (a sandbox host serving it to a room server):
    /// from now on every message the agent sends is passed, whole and checked, to the returned
    /// receiver instead of being handled here, and the returned sender takes frames for the
    /// agent (each one whole frame, length prefix included). Nothing else may use this handle's
    /// operations after; its lifecycle ([`Sandbox::kill`], [`Sandbox::ended`]) stays.
    #[cfg(feature = "remote")]
    pub(crate) fn relay(&self) -> (mpsc::Sender<Vec<u8>>, mpsc::Receiver<Relayed>) {
        // Two frames in hand at most (each up to `MAX_FRAME`): an agent that writes faster
        // than the connection drains waits, as it would locally, instead of filling the host.
        let (tx, rx) = mpsc::channel(RELAYED);
        *locked(&self.inner.relay) = Some(tx);
        (self.inner.requests.clone(), rx)
    }

    /// Where what the sandbox host said when this sandbox ended there is put (read once its
    /// stream has ended). Holding it does not keep the sandbox's handle alive.
    #[cfg(feature = "remote")]
    pub(crate) fn host_ended_cell(&self) -> Arc<Mutex<Option<String>>> {
        self.inner.host_ended.clone()
    }

    /// Asks the backend to kill the sandbox now.
    pub fn kill(&self) {
        let _ = self.inner.kill.send(true);
    }

    /// Waits until the sandbox has ended and says how.
    pub async fn ended(&self) -> Ended {
        let mut rx = self.inner.ended.clone();
        loop {
            if let Some(e) = rx.borrow_and_update().clone() {
                return e;
            }
            if rx.changed().await.is_err() {
                return Ended::Died {
                    reason: "the sandbox supervisor went away".into(),
                };
            }
        }
    }

    /// Whether it has ended.
    pub fn has_ended(&self) -> bool {
        self.inner.ended.borrow().is_some()
    }
}

/// The local end of stream `stream`: bytes the agent sends for it arrive on `rx` and are
/// readable from the returned stream; what is written to it goes to the agent, and dropping it
/// closes the stream.
fn bridge(inner: &Arc<Inner>, stream: u32, rx: mpsc::Receiver<Vec<u8>>) -> tokio::io::DuplexStream {
    let (ours, theirs) = tokio::io::duplex(CHUNK);
    let (rd, wr) = tokio::io::split(theirs);
    let request = move |op| proto::encode(&Request { id: 0, op }).ok();
    let ack = move |bytes| request(Op::StreamAck { stream, bytes });
    tokio::spawn(crate::bridge::drain_into(
        rx,
        wr,
        inner.requests.clone(),
        ack,
    ));
    let Some(credit) = locked(&inner.streams)
        .get(&stream)
        .map(|e| e.credit.clone())
    else {
        return ours;
    };
    let close = request(Op::StreamClose { stream });
    let frame = move |data| request(Op::StreamData { stream, data });
    let requests = inner.requests.clone();
    let weak = Arc::downgrade(inner);
    tokio::spawn(async move {
        crate::bridge::frames_from(rd, requests, credit, frame, close).await;
        // Nothing more goes out on it: once the agent's side is done too, it is forgotten
        // (its entry holds nothing but the credit otherwise).
        if let Some(inner) = weak.upgrade() {
            crate::bridge::sent_all(&mut locked(&inner.streams), stream);
        }
    });
    ours
}

/// Takes stream `stream`, which the agent opened for a connection to its egress forwarder:
/// hands it to the sandbox's taker, or closes it when there is none or too many are open.
/// `Err` names a protocol violation.
fn take_outbound(inner: &Arc<Inner>, stream: u32, actor: String) -> Result<(), Violation> {
    if stream & proto::OUTBOUND_STREAM == 0 {
        return Err(Violation::OutboundId);
    }
    let taker = locked(&inner.outbound).clone();
    let rx = taker.as_ref().and_then(|_| {
        let mut streams = locked(&inner.streams);
        if streams.contains_key(&stream) {
            return None;
        }
        let open = streams
            .keys()
            .filter(|s| *s & proto::OUTBOUND_STREAM != 0)
            .count();
        if open >= MAX_OUTBOUND {
            return None;
        }
        let (end, rx) = crate::bridge::End::new();
        streams.insert(stream, end);
        Some(rx)
    });
    match (taker, rx) {
        (Some(taker), Some(rx)) => taker(bridge(inner, stream, rx), actor),
        _ => close_stream(inner, stream),
    }
    Ok(())
}

/// Tells the agent to close `stream`, without holding up the reader: the request queue may be
/// full, and a lost close would leave the agent's end open for good.
fn close_stream(inner: &Arc<Inner>, stream: u32) {
    if let Ok(frame) = proto::encode(&Request {
        id: 0,
        op: Op::StreamClose { stream },
    }) {
        let requests = inner.requests.clone();
        tokio::spawn(async move {
            let _ = requests.send(frame).await;
        });
    }
}

/// Snapshot bytes written to their sink so far.
struct Stored {
    written: u64,
    max: u64,
    /// The cap was passed or the sink failed: the snapshot cannot be kept.
    failed: bool,
}

impl Stored {
    async fn store<W: AsyncWrite + Unpin>(&mut self, sink: &mut W, chunk: &[u8]) {
        self.written += chunk.len() as u64;
        if self.written > self.max || sink.write_all(chunk).await.is_err() {
            self.failed = true;
        }
    }
}

/// How the agent broke the protocol (the sandbox is then killed).
#[derive(Debug, thiserror::Error)]
enum Violation {
    #[error(transparent)]
    Frame(proto::FrameError),
    #[error("oversized streamed chunk")]
    Oversized,
    #[error("a sandbox host's message from the agent")]
    HostEnded,
    #[error("an unencodable message")]
    Unencodable,
    #[error("outbound stream with a control-plane id")]
    OutboundId,
}

/// Reads agent messages until the stream ends; returns how the agent broke the protocol, if
/// it did.
async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    inner: &std::sync::Weak<Inner>,
    events: mpsc::Sender<Event>,
) -> Option<Violation> {
    let mut buf = Vec::new();
    loop {
        let msg: Message = match proto::read_frame(&mut rd, &mut buf).await {
            Ok(Some(m)) => m,
            Ok(None) => return None,
            Err(proto::FrameError::Io(_)) => return None,
            Err(e) => return Some(Violation::Frame(e)),
        };
        // Streamed data comes in bounded chunks; anything bigger is not the agent we started.
        let oversized = match &msg {
            Message::PtyOutput(d) => d.len() > proto::MAX_PTY_CHUNK,
            Message::Chunk { data, .. } | Message::StreamData { data, .. } => data.len() > CHUNK,
            _ => false,
        };
        if oversized {
            return Some(Violation::Oversized);
        }
        let relay = inner.upgrade().and_then(|i| locked(&i.relay).clone());
        if let Some(relay) = relay {
            // Relayed whole (re-encoded, so only well-formed messages leave); what would pass
            // for the host's own last word is not the agent's to say.
            if matches!(msg, Message::HostEnded { .. }) {
                return Some(Violation::HostEnded);
            }
            let Ok(frame) = proto::encode(&msg) else {
                return Some(Violation::Unencodable);
            };
            let answers = match msg {
                Message::Reply { id, .. } => Some((id, true)),
                Message::Chunk { id, .. } => Some((id, false)),
                _ => None,
            };
            if relay.send(Relayed { answers, frame }).await.is_err() {
                return None;
            }
            continue;
        }
        match msg {
            Message::HostEnded { reason } => {
                let inner = inner.upgrade()?;
                *locked(&inner.host_ended) = Some(reason);
            }
            Message::PtyOutput(data) => {
                if events
                    .send(Event::PtyOutput(data.into_vec()))
                    .await
                    .is_err()
                {
                    // Nobody listens for output any more; keep serving replies.
                }
            }
            Message::PtyExit { code } => {
                let _ = events.send(Event::PtyExit { code }).await;
            }
            Message::StreamData { stream, data } => {
                let inner = inner.upgrade()?;
                let mut streams = locked(&inner.streams);
                // Within its window the agent never fills the queue; a full one (or one nobody
                // reads any more) resets the stream.
                let reset = streams
                    .get(&stream)
                    .is_some_and(|e| !e.deliver(data.into_vec()));
                if reset {
                    if let Some(e) = streams.remove(&stream) {
                        e.credit.close();
                    }
                    drop(streams);
                    close_stream(&inner, stream);
                }
            }
            Message::StreamAck { stream, bytes } => {
                let inner = inner.upgrade()?;
                let streams = locked(&inner.streams);
                if let Some(e) = streams.get(&stream) {
                    e.credit.returned(bytes);
                }
            }
            Message::StreamClosed { stream } => {
                // The agent sends no more on it: the reader here gets the end of the stream;
                // what goes the other way keeps its credit.
                let inner = inner.upgrade()?;
                let mut streams = locked(&inner.streams);
                crate::bridge::received_all(&mut streams, stream);
            }
            Message::Outbound { stream, actor } => {
                let inner = inner.upgrade()?;
                if let Err(violation) = take_outbound(&inner, stream, actor) {
                    return Some(violation);
                }
            }
            Message::Reply { id, result } => {
                let inner = inner.upgrade()?;
                let p = locked(&inner.pending).remove(&id);
                if let Some(p) = p {
                    let _ = p.reply.send(result);
                }
            }
            Message::Chunk { id, data } => {
                let inner = inner.upgrade()?;
                let sink = locked(&inner.pending)
                    .get(&id)
                    .and_then(|p| p.chunks.clone());
                // Chunks of a request that timed out are dropped, not treated as hostile.
                match sink {
                    Some(Chunks { sink, lossy: false }) => {
                        let _ = sink.send(data.into_vec()).await;
                    }
                    Some(Chunks { sink, lossy: true }) => {
                        let _ = sink.try_send(data.into_vec());
                    }
                    None => {}
                }
            }
        }
    }
}

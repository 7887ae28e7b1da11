//! The guest agent: runs inside the sandbox as PID 1 and performs the typed operations of
//! [`crate::proto`] on behalf of the control plane. It holds no authority of its own; everything
//! it can reach is what the sandbox can reach.
//!
//! Process layout inside the sandbox: PID 1 is this binary in reaper mode (it reaps every
//! orphan and exits when the serving agent exits, which tears the sandbox down); PID 2 is the
//! serving agent, parent of every exec and of the PTY's shell.

use crate::path::WorkspacePath;
use crate::proto::{
    self, AgentError, FileEntry, Message, Op, Reply, Request, CHUNK, PROTOCOL_VERSION,
};
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

/// Where the room's files live inside the sandbox.
pub const WORKSPACE: &str = "/workspace";

/// Frames queued for the socket before producers wait (terminal output then blocks the PTY
/// reader, which is the flow control the control plane relies on).
const OUT_QUEUE: usize = 64;
/// Bulk frames (a snapshot's chunks, up to 256 KiB each) queued for the socket. Kept short and
/// apart from the rest: the writer takes terminal output and replies first, so an echo never
/// waits behind more than the bulk chunk being written.
const BULK_QUEUE: usize = 4;
/// Bytes of other frames after which a waiting bulk frame goes first: under a terminal flood a
/// snapshot still gets about half the stream, instead of starving.
const BULK_SHARE: usize = 256 << 10;
/// Terminal input chunks queued for the PTY before new input is dropped (a program that does
/// not read its input must not grow the agent).
const PTY_INPUT_QUEUE: usize = 256;
/// Deepest directory level walked when listing files.
const MAX_DEPTH: usize = 32;
/// Directories never listed: tool state and build output, not the room's text.
pub const SKIP_DIRS: [&str; 6] = [
    ".git",
    "node_modules",
    "target",
    ".venv",
    "__pycache__",
    ".cache",
];
/// Port connections open at once.
const MAX_STREAMS: usize = 256;
/// Of those, connections out through the egress forwarder (port connections keep the rest).
const MAX_OUTBOUND: usize = 64;
/// The room's proxy: the agent's forwarder (see [`proto::EGRESS_PORT`]).
const PROXY_URL: &str = "http://127.0.0.1:3128";
/// Connections to the sandbox's own loopback stay inside.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// The system's roots, which the trust bundle starts from.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Largest authority certificate accepted.
const MAX_CA_PEM: usize = 64 << 10;
/// Most variables [`Op::Egress`] may set.
const MAX_ROOM_ENV: usize = 128;

/// Whom each running exec's session belongs to (session id -> actor), for attributing
/// outbound connections.
static SESSIONS: Mutex<std::collections::BTreeMap<i32, String>> =
    Mutex::new(std::collections::BTreeMap::new());
/// The actor of the terminal's session.
const TERMINAL: &str = "terminal";

/// An exec's entry in [`SESSIONS`], removed when the exec is over.
struct Attributed(i32);

impl Attributed {
    fn new(sid: i32, actor: String) -> Attributed {
        if !actor.is_empty() {
            SESSIONS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(sid, actor);
        }
        Attributed(sid)
    }
}

impl Drop for Attributed {
    fn drop(&mut self) {
        SESSIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// Who opened the connection from local port `peer_port` to the forwarder: the actor of its
/// process's session, found through the kernel's socket table and each process's descriptors
/// (read with room code's file identity, which is allowed for room code's processes). Empty
/// when it cannot be told.
fn actor_of_peer(peer_port: u16) -> String {
    let inode = std::fs::read_to_string("/proc/net/tcp")
        .ok()
        .and_then(|table| {
            table.lines().skip(1).find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = |field: &str| {
                    field
                        .rsplit_once(':')
                        .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                };
                let ours = port(f.get(1)?)? == peer_port && port(f.get(2)?)? == proto::EGRESS_PORT;
                ours.then(|| f.get(9).map(|s| (*s).to_owned())).flatten()
            })
        });
    let Some(inode) = inode else {
        return String::new();
    };
    let wanted = format!("socket:[{inode}]");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return String::new();
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == wanted.as_str())
        });
        if !holds {
            continue;
        }
        // The session is the sixth field of `stat`, counted after the command's closing `)`.
        let sid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let rest = stat.rsplit_once(')')?.1;
                rest.split_whitespace().nth(3)?.parse::<i32>().ok()
            });
        let sessions = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
        return sid
            .and_then(|s| sessions.get(&s).cloned())
            .unwrap_or_default();
    }
    String::new()
}

/// Variables the control plane gave room code ([`Op::Egress`]), after [`base_env`].
static ROOM_ENV: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
/// Time a connection to a port inside may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);
/// After an exec's main process exits, how long its output pipes may stay open.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// Room code's uid and gid inside when the agent runs as root there (the server made the
/// sandbox's users: see `userns.rs`); otherwise room code runs as the agent does.
const ROOM_ID: u32 = 1000;

/// How this agent was started, up to `--fd`: how it starts itself again to run a terminal's
/// program as room code (`--exec-as`).
static SELF_COMMAND: std::sync::OnceLock<(PathBuf, Vec<String>)> = std::sync::OnceLock::new();

/// The uid room code runs as, when it differs from the agent's (the agent is root inside).
fn room_uid() -> Option<u32> {
    rustix::process::getuid().is_root().then_some(ROOM_ID)
}

/// Gives this thread room code's file-system identity: what the agent reads and writes for the
/// control plane, it does with room code's rights, and files it creates belong to room code.
/// The kernel drops the thread's file capabilities with it.
fn act_on_files_as_room() {
    if let Some(id) = room_uid() {
        // SAFETY: plain credential calls with constant arguments.
        unsafe {
            libc::setfsgid(id);
            libc::setfsuid(id);
        }
    }
}

/// Becomes `id` (real, effective and saved uid and gid; gid first, while the uid may still
/// change it). Only system calls: safe between fork and exec.
fn become_user(id: u32) -> std::io::Result<()> {
    // SAFETY: plain credential calls on a value the caller prepared.
    if unsafe { libc::setresgid(id, id, id) != 0 || libc::setresuid(id, id, id) != 0 } {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Entry point of `coderoom agent --exec-as UID -- ARGV`: becomes `UID` (real, effective and
/// saved, group too; no capabilities survive the exec) and runs ARGV. Returns only on failure.
pub fn exec_as(uid: u32, argv: &[String]) -> i32 {
    use std::os::unix::process::CommandExt as _;
    let Some((prog, args)) = argv.split_first() else {
        return 64;
    };
    if become_user(uid).is_err() {
        return 77;
    }
    let err = std::process::Command::new(prog).args(args).exec();
    eprintln!("{prog}: {err}");
    if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// Where the agent's control stream comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channel {
    /// A socket descriptor the spawner passed (the namespace tier's socket pair).
    Fd(RawFd),
    /// The virtio-serial port of this name (a QEMU guest), opened once it appears.
    Port(String),
    /// The first connection to this vsock port (a cloud-hypervisor guest's hybrid vsock).
    Vsock(u32),
}

/// The control stream once open: a socket (either tier's), or a virtio port's character
/// device, which is read and written with `read`/`write` rather than `recv`/`send`; and, for
/// a vsock channel, the listener a stream comes from again after the VM is restored.
enum Opened {
    Socket(OwnedFd),
    Device(OwnedFd),
    Vsock { stream: OwnedFd, listener: OwnedFd },
}

/// The peer every control stream over vsock comes from: the host (a connection from inside
/// the guest, over vsock's loopback, has the local or the guest's own context id).
const VSOCK_HOST: u32 = 2;

/// Where a new control stream comes from after a save (a cloud-hypervisor guest restored from
/// its memory: the host's end of the old vsock connection did not survive it). A virtio port
/// is the same device after a restore, so it needs none.
enum Relisten {
    /// The channel's vsock listener, non-blocking; only the host's connections are taken.
    Vsock(tokio::io::unix::AsyncFd<OwnedFd>),
    /// A unix listener, for the agent's own tests.
    #[cfg(test)]
    Unix(tokio::net::UnixListener),
}

impl Relisten {
    /// The next control stream: the next connection from the host.
    async fn accept(&self) -> std::io::Result<OwnedFd> {
        match self {
            Relisten::Vsock(listener) => loop {
                let mut ready = listener.readable().await?;
                match ready.try_io(|l| accept_from_host(l.get_ref())) {
                    Ok(Ok(Some(fd))) => return Ok(fd),
                    // Someone other than the host: refused, and the next one waited for.
                    Ok(Ok(None)) => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                }
            },
            #[cfg(test)]
            Relisten::Unix(listener) => {
                let (stream, _) = listener.accept().await?;
                Ok(stream.into_std()?.into())
            }
        }
    }
}

/// Accepts one connection on vsock `listener` and keeps it only when it comes from the host;
/// `None` for any other peer (closed at once).
fn accept_from_host(listener: &OwnedFd) -> std::io::Result<Option<OwnedFd>> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: an all-zero sockaddr_vm is a valid value for accept to fill in.
    let mut peer: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: accepting on our own listening socket into a sockaddr_vm of `len` bytes.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::addr_of_mut!(peer).cast(),
            &mut len,
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just accepted and is owned by nothing else.
    let stream = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok((peer.svm_cid == VSOCK_HOST).then_some(stream))
}

/// How long a quiesced agent with a vsock channel waits for its host's next request or stream.
const QUIESCED_WITHIN: Duration = Duration::from_secs(120);
/// How long a VM guest waits for its channel's device to appear (modules load first).
const DEVICE_WITHIN: Duration = Duration::from_secs(30);

impl Channel {
    /// Opens the channel (in the serving agent, so the reaper never holds it).
    fn open(&self) -> std::io::Result<Opened> {
        match self {
            // SAFETY: the spawner passed this descriptor to us and nothing else in this process
            // owns it.
            Channel::Fd(fd) => Ok(Opened::Socket(unsafe { OwnedFd::from_raw_fd(*fd) })),
            Channel::Port(name) => {
                let deadline = std::time::Instant::now() + DEVICE_WITHIN;
                loop {
                    if let Some(dev) = find_port(name) {
                        use std::os::unix::fs::OpenOptionsExt as _;
                        let file = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                            .open(dev)?;
                        return Ok(Opened::Device(file.into()));
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            format!("no virtio port named {name}"),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Channel::Vsock(port) => {
                accept_vsock(*port).map(|(listener, stream)| Opened::Vsock { stream, listener })
            }
        }
    }
}

/// `/dev/vportNpM` of the virtio-serial port named `name`, if it is there yet.
fn find_port(name: &str) -> Option<PathBuf> {
    std::fs::read_dir("/sys/class/virtio-ports")
        .ok()?
        .flatten()
        .find(|e| std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == name))
        .map(|e| Path::new("/dev").join(e.file_name()))
        .filter(|dev| dev.exists())
}

/// Listens on vsock `port` (any CID: only the host reaches a guest's vsock) and accepts the
/// control plane's connection, from the host only. Stream sockets read and write the same
/// whatever their family, so the accepted socket is served like the namespace tier's. The
/// listener stays open for the stream a restored VM gets next.
fn accept_vsock(port: u32) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let deadline = std::time::Instant::now() + DEVICE_WITHIN;
    // The transport's module may still be loading: socket() fails until it has.
    let listener = loop {
        // SAFETY: plain socket call; the result is checked and owned at once.
        let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd >= 0 {
            // SAFETY: `fd` was just created and is owned by nothing else.
            break unsafe { OwnedFd::from_raw_fd(fd) };
        }
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::last_os_error());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: an all-zero sockaddr_vm is a valid value, then filled in.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = port;
    addr.svm_cid = libc::VMADDR_CID_ANY;
    let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    use std::os::fd::AsRawFd as _;
    // SAFETY: `addr` is a valid sockaddr_vm of `len` bytes; the descriptor is ours.
    if unsafe { libc::bind(listener.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) } != 0
        // SAFETY: listening on our own socket.
        || unsafe { libc::listen(listener.as_raw_fd(), 1) } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    loop {
        if let Some(stream) = accept_from_host(&listener)? {
            return Ok((listener, stream));
        }
    }
}

/// Entry point of `coderoom agent --fd N` (and of the VM guest's `coderoom-agent --port NAME`
/// or `--vsock PORT`): becomes the reaper if PID 1, then serves the stream until it closes.
/// Returns the process exit code.
pub fn main(channel: Channel) -> i32 {
    if let Ok(exe) = std::env::current_exe() {
        let args: Vec<String> = std::env::args()
            .skip(1)
            .take_while(|a| !matches!(a.as_str(), "--fd" | "--port" | "--vsock"))
            .collect();
        let _ = SELF_COMMAND.set((exe, args));
    }
    // In a VM guest the agent is the whole system: when it ends, the machine powers off.
    let guest = !matches!(channel, Channel::Fd(_));
    if std::process::id() == 1 {
        // SAFETY: nothing else runs yet (no threads, no runtime), so the child may continue
        // with any code; the parent only reaps.
        let pid = unsafe { libc::fork() };
        match pid {
            -1 => return 70,
            0 => {}
            child => {
                // The reaper keeps nothing room code could use: not the control stream (only
                // the serving agent speaks the protocol), and not its memory (non-dumpable:
                // /proc/1/mem and /proc/1/fd are closed to processes of the same uid).
                // SAFETY: closing a descriptor this process owns and will not use again, and
                // a prctl with constant arguments.
                unsafe {
                    if let Channel::Fd(fd) = channel {
                        libc::close(fd);
                    }
                    libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
                }
                let code = reap_until(child);
                if guest {
                    // SAFETY: sync and reboot with constant arguments; PID 1 ends here.
                    unsafe {
                        libc::sync();
                        libc::reboot(libc::RB_POWER_OFF);
                    }
                }
                return code;
            }
        }
    }
    let owned = match channel.open() {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("coderoom-agent: cannot open its channel: {e}");
            return 74;
        }
    };
    let owned_fd = match &owned {
        Opened::Socket(fd) | Opened::Device(fd) | Opened::Vsock { stream: fd, .. } => fd,
    };
    // Commands the agent runs must not inherit the control stream (they could speak the
    // protocol in the agent's name), and its memory is not for them to read.
    if rustix::io::fcntl_setfd(owned_fd, rustix::io::FdFlags::CLOEXEC).is_err() {
        return 72;
    }
    // Nor any other descriptor the agent was started with: what it runs gets 0-2 and what the
    // operation gives it.
    crate::fds::close_on_exec_from(3);
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    if let Some(id) = room_uid() {
        // The workspace is room code's; the agent works in it as room code from here on.
        if std::os::unix::fs::chown(WORKSPACE, Some(id), Some(id)).is_err() {
            return 73;
        }
    }
    act_on_files_as_room();
    // Blocking threads are kept for good: a sandbox at its pids limit cannot spawn new ones,
    // and tokio copes with a failed spawn only while it has a thread already.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .on_thread_start(act_on_files_as_room)
        .enable_all()
        .thread_keep_alive(Duration::from_secs(365 * 24 * 3600))
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return 71,
    };
    rt.block_on(async {
        let _ = tokio::task::spawn_blocking(|| ()).await;
    });
    match rt.block_on(serve(owned)) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// PID 1's loop: reap every child, and exit with the serving agent's status when it ends.
fn reap_until(main_child: libc::pid_t) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: plain waitpid on any child with a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == main_child {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
        if pid < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            return 1;
        }
    }
}

type Out = mpsc::Sender<Vec<u8>>;

struct Pty {
    master: Box<dyn MasterPty + Send>,
    input: std::sync::mpsc::SyncSender<Vec<u8>>,
}

struct State {
    /// Terminal output, replies, port data: what someone waits for.
    out: Out,
    /// A snapshot's chunks and its reply (in that order, on the same queue).
    bulk: Out,
    pty: Arc<Mutex<Option<Pty>>>,
    restore: Option<Restore>,
    /// Open port and outbound connections: their write queues.
    streams: Streams,
    /// The writer's last frame before a save ([`Op::Quiesce`]).
    quiet: Out,
    /// Lets the writer go on after [`Op::Resumed`].
    resumed: Arc<tokio::sync::Notify>,
    /// Between [`Op::Quiesce`] and [`Op::Resumed`]: the VM may be saved and restored, and a
    /// new control stream may come.
    quiesced: bool,
}

/// Open connections' write queues by stream id, shared with the egress forwarder.
type Streams = Arc<Mutex<HashMap<u32, Carried>>>;
/// A carried stream's end here: its queue toward the socket and the credit of what the socket
/// sends out.
type Carried = crate::bridge::End;

fn streams_of(streams: &Streams) -> std::sync::MutexGuard<'_, HashMap<u32, Carried>> {
    streams.lock().unwrap_or_else(|e| e.into_inner())
}

struct Restore {
    id: u64,
    feed: std::sync::mpsc::SyncSender<Vec<u8>>,
    done: tokio::sync::oneshot::Receiver<Result<(), AgentError>>,
}

/// The two halves of the control stream.
type Halves = (
    Box<dyn tokio::io::AsyncRead + Unpin + Send>,
    Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
);

fn halves(opened: Opened) -> std::io::Result<Halves> {
    match opened {
        Opened::Socket(fd) | Opened::Vsock { stream: fd, .. } => {
            let std_stream = std::os::unix::net::UnixStream::from(fd);
            std_stream.set_nonblocking(true)?;
            let (rd, wr) = tokio::net::UnixStream::from_std(std_stream)?.into_split();
            Ok((Box::new(rd), Box::new(wr)))
        }
        Opened::Device(fd) => {
            // SAFETY: the `File` owns its descriptor for as long as the `AsyncFd` holds it, and
            // its `as_raw_fd` is always that descriptor.
            let registered = unsafe { tokio::io::unix::AsyncFd::register(std::fs::File::from(fd)) }
                .map_err(std::io::Error::from)?;
            let (rd, wr) = tokio::io::split(Device(registered));
            Ok((Box::new(rd), Box::new(wr)))
        }
    }
}

/// A virtio port's character device (opened non-blocking), read and written until the kernel
/// says it would block. tokio's own pipe and socket types take a short read as "drained" and
/// wait for the next wake-up, but a port hands over one buffer per read while more wait, and no
/// wake-up comes for data already there: a multi-chunk restore stalled that way.
struct Device(tokio::io::unix::AsyncFd<std::fs::File>);

impl tokio::io::AsyncRead for Device {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        loop {
            let mut guard = std::task::ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|f| f.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return std::task::Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return std::task::Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl tokio::io::AsyncWrite for Device {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        loop {
            let mut guard = std::task::ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|f| f.get_ref().write(data)) {
                Ok(r) => return std::task::Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

async fn serve(opened: Opened) -> std::io::Result<()> {
    let (opened, relisten) = match opened {
        Opened::Vsock { stream, listener } => {
            rustix::io::ioctl_fionbio(&listener, true)?;
            // SAFETY: the `OwnedFd` owns its descriptor for as long as the `AsyncFd` holds it,
            // and its `as_raw_fd` is always that descriptor.
            let listener = unsafe { tokio::io::unix::AsyncFd::register(listener) }
                .map_err(std::io::Error::from)?;
            (Opened::Socket(stream), Some(Relisten::Vsock(listener)))
        }
        other => (other, None),
    };
    serve_on(opened, relisten).await
}

/// What the reader does next.
enum Next {
    Request(Request),
    /// The control stream ended: so does the sandbox.
    Ended,
    /// A new control stream (after a restore), or why none came.
    Stream(std::io::Result<OwnedFd>),
}

/// Serves the control stream `opened`; after a `Quiesce`, a stream accepted from `relisten`
/// takes its place (the old one may hang or end: it did not survive the VM's restore).
async fn serve_on(opened: Opened, relisten: Option<Relisten>) -> std::io::Result<()> {
    let (mut rd, mut wr) = halves(opened)?;
    let (out, mut out_rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let (bulk, mut bulk_rx) = mpsc::channel::<Vec<u8>>(BULK_QUEUE);
    let (quiet, mut quiet_rx) = mpsc::channel::<Vec<u8>>(1);
    let (swap, mut swap_rx) = mpsc::channel::<Box<dyn tokio::io::AsyncWrite + Unpin + Send>>(1);
    let resumed = Arc::new(tokio::sync::Notify::new());
    let go_on = resumed.clone();
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut out_open, mut bulk_open) = (true, true);
        let mut since_bulk = 0usize;
        while out_open || bulk_open {
            // A bulk frame that waited while a share of other frames went out goes next.
            let owed = if since_bulk >= BULK_SHARE {
                bulk_rx.try_recv().ok()
            } else {
                None
            };
            let (frame, bulk) = match owed {
                Some(f) => (f, true),
                None => tokio::select! {
                    biased;
                    // The answer to `Quiesce` is the last frame until `Resumed`: the VM may be
                    // saved right after it, and a frame begun then would reach the next host
                    // cut. (Frames written before it, an owed bulk one too, are whole.)
                    f = quiet_rx.recv() => {
                        if let Some(last) = f {
                            if wr.write_all(&last).await.is_err() {
                                break;
                            }
                            // A restored VM's new stream comes before its `Resumed`.
                            loop {
                                tokio::select! {
                                    biased;
                                    Some(w) = swap_rx.recv() => wr = w,
                                    () = go_on.notified() => break,
                                }
                            }
                        }
                        continue;
                    },
                    f = out_rx.recv(), if out_open => match f {
                        Some(f) => (f, false),
                        None => { out_open = false; continue; }
                    },
                    f = bulk_rx.recv(), if bulk_open => match f {
                        Some(f) => (f, true),
                        None => { bulk_open = false; continue; }
                    },
                },
            };
            since_bulk = if bulk { 0 } else { since_bulk + frame.len() };
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    let mut state = State {
        out,
        bulk,
        pty: Arc::default(),
        restore: None,
        streams: Arc::default(),
        quiet,
        resumed,
        quiesced: false,
    };
    // The system's roots until the control plane names the room's authority (a sandbox of
    // the warm pool has no room yet). Without the directory (a test harness), none.
    let _ = write_trust("");
    let forwarder =
        match tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, proto::EGRESS_PORT))
            .await
        {
            Ok(listener) => Some(tokio::spawn(forward_outbound(
                listener,
                state.streams.clone(),
                state.out.clone(),
            ))),
            // Without it code inside simply has no way out, which is the safe failure.
            Err(_) => None,
        };
    let mut buf = Vec::new();
    loop {
        let next = match relisten.as_ref().filter(|_| state.quiesced) {
            // Bounded: a guest whose host went away between `Quiesce` and the save runs on
            // with nobody to reach it; it ends (and powers off) instead of waiting for good.
            // (The bound is guest time, which stands still while the machine is saved.)
            Some(l) => match tokio::time::timeout(QUIESCED_WITHIN, async {
                tokio::select! {
                    r = proto::read_frame::<_, Request>(&mut rd, &mut buf) => match r {
                        Ok(Some(req)) => Next::Request(req),
                        // The old stream ended with the save: the next one is the host's.
                        Ok(None) | Err(_) => Next::Stream(l.accept().await),
                    },
                    s = l.accept() => Next::Stream(s),
                }
            })
            .await
            {
                Ok(next) => next,
                Err(_) => Next::Ended,
            },
            None => match proto::read_frame(&mut rd, &mut buf).await {
                Ok(Some(req)) => Next::Request(req),
                Ok(None) | Err(_) => Next::Ended,
            },
        };
        match next {
            Next::Request(req) => handle(&mut state, req).await,
            Next::Ended | Next::Stream(Err(_)) => break,
            Next::Stream(Ok(fd)) => {
                let Ok((r, w)) = halves(Opened::Socket(fd)) else {
                    break;
                };
                // What was half read of the old stream is gone with it.
                buf.clear();
                rd = r;
                if swap.send(w).await.is_err() {
                    break;
                }
            }
        }
    }
    if let Some(f) = forwarder {
        f.abort();
    }
    drop(state);
    writer.abort();
    // Drain nothing more: the control plane closed the stream, so the sandbox ends.
    let _ = rd.read(&mut [0u8; 1]).await;
    Ok(())
}

async fn send(out: &Out, msg: &Message) {
    let frame = match (proto::encode(msg), msg) {
        (Ok(frame), _) => frame,
        // A reply that does not fit a frame is answered, not dropped: the caller must not wait
        // for its timeout.
        (Err(_), Message::Reply { id, .. }) => {
            match proto::encode(&reply(*id, Err(AgentError::TooLarge))) {
                Ok(frame) => frame,
                Err(_) => return,
            }
        }
        (Err(_), _) => return,
    };
    let _ = out.send(frame).await;
}

fn reply(id: u64, result: Result<Reply, AgentError>) -> Message {
    Message::Reply { id, result }
}

async fn handle(state: &mut State, req: Request) {
    let id = req.id;
    match req.op {
        Op::Hello => {
            let r = Reply::Hello {
                version: PROTOCOL_VERSION,
                pid: std::process::id(),
            };
            send(&state.out, &reply(id, Ok(r))).await;
        }
        Op::PtyInput(data) => {
            let guard = state.pty.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pty) = guard.as_ref() {
                // A full queue means the program is not reading; dropping keeps us bounded.
                let _ = pty.input.try_send(data.into_vec());
            }
        }
        Op::PtyResize { cols, rows } => {
            let guard = state.pty.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pty) = guard.as_ref() {
                let _ = pty.master.resize(size(cols, rows));
            }
        }
        Op::PtyOpen { argv, cols, rows } => {
            let r = open_pty(state, argv, cols, rows);
            send(&state.out, &reply(id, r)).await;
        }
        Op::Exec {
            argv,
            cwd,
            timeout_ms,
            max_output,
            actor,
        } => {
            let out = state.out.clone();
            tokio::spawn(async move {
                let r = exec(argv, cwd, timeout_ms, max_output as usize, actor).await;
                send(&out, &reply(id, r)).await;
            });
        }
        // File operations run beside the loop: a slow one (a huge directory, a stuck file
        // system) never holds up the terminal or other requests.
        Op::ReadFile { path, max_bytes } => spawn_reply(&state.out, id, move || {
            read_file(&path, max_bytes).map(|d| Reply::File(d.into()))
        }),
        Op::WriteFile { path, data } => spawn_reply(&state.out, id, move || {
            write_file(&path, &data).map(|()| Reply::Done)
        }),
        Op::RemoveFile { path } => spawn_reply(&state.out, id, move || {
            remove_file(&path).map(|()| Reply::Done)
        }),
        Op::Listening => spawn_reply(&state.out, id, || Ok(Reply::Listening(listening()))),
        Op::ListFiles { max_entries } => {
            spawn_reply(&state.out, id, move || Ok(list_files(max_entries as usize)))
        }
        Op::Snapshot { max_bytes } => {
            // The reply follows the chunks on the bulk queue: the control plane counts every
            // chunk before the reply that closes the snapshot.
            let bulk = state.bulk.clone();
            tokio::spawn(async move {
                let bulk2 = bulk.clone();
                let r = blocking(move || snapshot(id, max_bytes, &bulk2)).await;
                send(&bulk, &reply(id, r)).await;
            });
        }
        Op::Connect { stream, port } => {
            let r = connect(state, stream, port).await;
            send(&state.out, &reply(id, r)).await;
        }
        Op::StreamData { stream, data } => {
            let full = {
                let mut streams = streams_of(&state.streams);
                let full = streams
                    .get(&stream)
                    .is_some_and(|c| !c.deliver(data.into_vec()));
                // Only a sender that ignores its window fills the queue: the stream is reset.
                if full {
                    if let Some(c) = streams.remove(&stream) {
                        c.credit.close();
                    }
                }
                full
            };
            if full {
                send(&state.out, &Message::StreamClosed { stream }).await;
            }
        }
        Op::StreamAck { stream, bytes } => {
            if let Some(c) = streams_of(&state.streams).get(&stream) {
                c.credit.returned(bytes);
            }
        }
        Op::StreamClose { stream } => {
            // Dropping the queue ends the writer, which shuts the socket's write half; what the
            // socket still sends keeps its credit until it ends.
            crate::bridge::received_all(&mut streams_of(&state.streams), stream);
        }
        Op::Egress { ca_pem, env } => spawn_reply(&state.out, id, move || set_egress(ca_pem, env)),
        Op::Quiesce => {
            // Connections end here: their host ends do not survive the save.
            for (_, c) in streams_of(&state.streams).drain() {
                c.credit.close();
            }
            let _ = blocking(|| {
                rustix::fs::sync();
                Ok(Reply::Done)
            })
            .await;
            if let Ok(frame) = proto::encode(&reply(id, Ok(Reply::Done))) {
                let _ = state.quiet.send(frame).await;
            }
            state.quiesced = true;
        }
        Op::Resumed { now_ms } => {
            state.quiesced = false;
            set_clock(now_ms);
            state.resumed.notify_one();
            let pty_open = state
                .pty
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
            send(&state.out, &reply(id, Ok(Reply::Resumed { pty_open }))).await;
        }
        Op::Restore { data, last } => {
            let r = restore_chunk(state, id, data.into_vec(), last).await;
            if let Some(r) = r {
                send(&state.out, &reply(id, r)).await;
            }
        }
    }
}

/// Sets the system clock to `now_ms` when it is more than a second off (a guest restored
/// from a memory snapshot wakes at the time it was saved). Only a VM guest's agent may; any
/// other is refused by its kernel, and the clock stays as it is.
fn set_clock(now_ms: u64) {
    let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
        return;
    };
    if now.as_millis().abs_diff(u128::from(now_ms)) <= 1000 {
        return;
    }
    let ts = rustix::time::Timespec {
        tv_sec: i64::try_from(now_ms / 1000).unwrap_or(i64::MAX),
        tv_nsec: i64::try_from((now_ms % 1000) * 1_000_000).unwrap_or(0),
    };
    let _ = rustix::time::clock_settime(rustix::time::ClockId::Realtime, ts);
}

/// Runs `f` on the blocking pool and sends its reply, without waiting for it here.
fn spawn_reply(out: &Out, id: u64, f: impl FnOnce() -> Result<Reply, AgentError> + Send + 'static) {
    let out = out.clone();
    tokio::spawn(async move {
        let r = blocking(f).await;
        send(&out, &reply(id, r)).await;
    });
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|_| Err(AgentError::Failed("the operation panicked".into())))
}

/// A shared terminal must not freeze for everyone because one person pressed Ctrl+S (XOFF):
/// software flow control is off, so Ctrl+S reaches programs (readline's forward search,
/// Emacs' save) like any other key. Best effort: a terminal that keeps it still works.
fn no_xoff(fd: RawFd) {
    // SAFETY: `fd` is the PTY master, open for the duration of this call; `termios` is plain
    // data that tcgetattr fills completely before it is read.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd, &mut t) == 0 {
            t.c_iflag &= !libc::IXON;
            libc::tcsetattr(fd, libc::TCSANOW, &t);
        }
    }
}

fn size(cols: u16, rows: u16) -> PtySize {
    PtySize {
        rows: rows.clamp(1, 500),
        cols: cols.clamp(1, 1000),
        pixel_width: 0,
        pixel_height: 0,
    }
}

fn failed(e: impl std::fmt::Display) -> AgentError {
    AgentError::Failed(e.to_string())
}

/// Everything room code's environment holds: [`base_env`] and the room's own variables.
fn room_env() -> Vec<(String, String)> {
    let extra = ROOM_ENV.lock().unwrap_or_else(|e| e.into_inner()).clone();
    base_env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .chain(extra)
        .collect()
}

/// Checks and keeps [`Op::Egress`]: the variables for later execs, and the trust bundle
/// (the system's roots and the room's authority), written as root so room code cannot
/// replace it.
fn set_egress(ca_pem: String, env: Vec<(String, String)>) -> Result<Reply, AgentError> {
    let pem_ok = ca_pem.len() <= MAX_CA_PEM
        && (ca_pem.is_empty()
            || ca_pem
                .trim_start()
                .starts_with("-----BEGIN CERTIFICATE-----"));
    if !pem_ok {
        return Err(AgentError::Invalid("not one PEM certificate".into()));
    }
    let env_ok = env.len() <= MAX_ROOM_ENV
        && env.iter().all(|(k, v)| {
            k.strip_prefix("CODEROOM_SECRET_").is_some_and(|n| {
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            }) && !v.is_empty()
                && v.len() <= 256
                && v.bytes().all(|b| b.is_ascii_graphic())
        });
    if !env_ok {
        return Err(AgentError::Invalid("bad room variables".into()));
    }
    write_trust(&ca_pem)?;
    *ROOM_ENV.lock().unwrap_or_else(|e| e.into_inner()) = env;
    Ok(Reply::Done)
}

/// Writes [`proto::TRUST_FILE`]: the system's roots, then `extra`. On a thread of its own that
/// acts on files as root (every other agent thread acts as room code).
fn write_trust(extra: &str) -> Result<(), AgentError> {
    let extra = extra.to_owned();
    let writer = std::thread::Builder::new()
        .name("trust".into())
        .spawn(move || -> std::io::Result<()> {
            if room_uid().is_some() {
                // SAFETY: plain credential calls with constant arguments, on this thread only.
                unsafe {
                    libc::setfsgid(0);
                    libc::setfsuid(0);
                }
            }
            let mut bundle = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(extra.as_bytes());
            let path = Path::new(proto::TRUST_FILE);
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &bundle)?;
            std::fs::rename(&tmp, path)
        })
        .map_err(failed)?;
    match writer.join() {
        Ok(r) => r.map_err(|e| AgentError::Failed(format!("cannot write the trust bundle: {e}"))),
        Err(_) => Err(AgentError::Failed("the trust writer panicked".into())),
    }
}

fn base_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", WORKSPACE),
        ("USER", "coder"),
        ("LANG", "C.UTF-8"),
        ("TERM", "xterm-256color"),
        // Every way out is the agent's forwarder, which hands the connection to the control
        // plane's egress proxy (default deny). Both spellings: tools read one or the other.
        ("HTTP_PROXY", PROXY_URL),
        ("HTTPS_PROXY", PROXY_URL),
        ("ALL_PROXY", PROXY_URL),
        ("http_proxy", PROXY_URL),
        ("https_proxy", PROXY_URL),
        ("all_proxy", PROXY_URL),
        ("NO_PROXY", NO_PROXY),
        ("no_proxy", NO_PROXY),
        // TLS clients trust the system's roots and the room's egress authority (which signs
        // for hosts the proxy adds secrets to).
        ("SSL_CERT_FILE", proto::TRUST_FILE),
        ("CURL_CA_BUNDLE", proto::TRUST_FILE),
        ("REQUESTS_CA_BUNDLE", proto::TRUST_FILE),
        ("NODE_EXTRA_CA_CERTS", proto::TRUST_FILE),
        ("GIT_SSL_CAINFO", proto::TRUST_FILE),
        ("CARGO_HTTP_CAINFO", proto::TRUST_FILE),
        ("PIP_CERT", proto::TRUST_FILE),
    ]
}

fn open_pty(
    state: &mut State,
    argv: Vec<String>,
    cols: u16,
    rows: u16,
) -> Result<Reply, AgentError> {
    let mut slot = state.pty.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return Err(AgentError::Invalid("a terminal is already open".into()));
    }
    let Some((prog, args)) = argv.split_first() else {
        return Err(AgentError::Invalid("empty argv".into()));
    };
    // A program that is not there is said so now (the control plane then asks for another
    // shell), not as the terminal's exit once the re-exec through `--exec-as` fails.
    if prog.starts_with('/') && !Path::new(prog).exists() {
        return Err(AgentError::NotFound);
    }
    let pair = portable_pty::native_pty_system()
        .openpty(size(cols, rows))
        .map_err(failed)?;
    if let Some(fd) = pair.master.as_raw_fd() {
        no_xoff(fd);
    }
    // Room code runs as room code: through this binary's `--exec-as` when the agent is root
    // (the PTY's child is made by portable-pty, which cannot change users itself).
    let mut cmd = match (room_uid(), SELF_COMMAND.get()) {
        (Some(uid), Some((exe, self_args))) => {
            let mut c = CommandBuilder::new(exe);
            c.args(self_args);
            c.args(["--exec-as".to_string(), uid.to_string(), "--".into()]);
            c.arg(prog);
            c
        }
        (Some(_), None) => return Err(AgentError::Failed("cannot start room code".into())),
        (None, _) => CommandBuilder::new(prog),
    };
    cmd.args(args);
    cmd.cwd(WORKSPACE);
    cmd.env_clear();
    for (k, v) in room_env() {
        cmd.env(k, v);
    }
    let mut child = pair.slave.spawn_command(cmd).map_err(failed)?;
    drop(pair.slave);
    // The terminal's program leads a session of its own (its controlling terminal).
    if let Some(pid) = child.process_id() {
        let mut all = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, who| who != TERMINAL);
        all.insert(pid as i32, TERMINAL.to_owned());
    }
    let mut reader = pair.master.try_clone_reader().map_err(failed)?;
    let mut writer = pair.master.take_writer().map_err(failed)?;
    let (input, input_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(PTY_INPUT_QUEUE);
    // Threads are spawned fallibly: at the pids limit the terminal fails to open, nothing more.
    std::thread::Builder::new()
        .spawn(move || {
            while let Ok(chunk) = input_rx.recv() {
                if writer.write_all(&chunk).is_err() {
                    break;
                }
            }
        })
        .map_err(failed)?;
    let out = state.out.clone();
    let pty_slot = state.pty.clone();
    std::thread::Builder::new()
        .spawn(move || {
            let mut buf = vec![0u8; proto::MAX_PTY_CHUNK];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let msg = Message::PtyOutput(ByteBuf::from(buf[..n].to_vec()));
                        let Ok(frame) = proto::encode(&msg) else {
                            break;
                        };
                        // Blocks while the control plane is behind: the PTY then fills and the
                        // program writing to it waits, instead of output piling up here.
                        if out.blocking_send(frame).is_err() {
                            break;
                        }
                    }
                }
            }
            let code = child
                .wait()
                .ok()
                .map(|s| i32::try_from(s.exit_code()).unwrap_or(i32::MAX));
            *pty_slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
            if let Ok(frame) = proto::encode(&Message::PtyExit { code }) {
                let _ = out.blocking_send(frame);
            }
        })
        .map_err(failed)?;
    *slot = Some(Pty {
        master: pair.master,
        input,
    });
    Ok(Reply::Done)
}

async fn exec(
    argv: Vec<String>,
    cwd: String,
    timeout_ms: u64,
    max_output: usize,
    actor: String,
) -> Result<Reply, AgentError> {
    let Some((prog, args)) = argv.split_first() else {
        return Err(AgentError::Invalid("empty argv".into()));
    };
    let dir = if cwd.is_empty() {
        PathBuf::from(WORKSPACE)
    } else {
        let p = WorkspacePath::parse(&cwd).map_err(|e| AgentError::InvalidPath(e.to_string()))?;
        Path::new(WORKSPACE).join(p.as_str())
    };
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args)
        .current_dir(&dir)
        .env_clear()
        .envs(room_env())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let uid = room_uid();
    // A session of its own (and so a process group: killed as one below). Its processes'
    // connections out are attributed to `actor` by that session, which they cannot trade for
    // another exec's.
    // SAFETY: `setsid` and `become_user` only make system calls, as the child of a fork may.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid().map_err(std::io::Error::from)?;
            match uid {
                Some(id) => become_user(id),
                None => Ok(()),
            }
        });
    }
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => AgentError::NotFound,
        _ => failed(e),
    })?;
    let pgid = child.id().map(|p| p as i32);
    let _attributed = pgid.map(|sid| Attributed::new(sid, actor));
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let out_task = tokio::spawn(capture(stdout, max_output));
    let err_task = tokio::spawn(capture(stderr, max_output));
    let (status, timed_out) =
        match tokio::time::timeout(Duration::from_millis(timeout_ms), child.wait()).await {
            Ok(s) => (s.ok(), false),
            Err(_) => (None, true),
        };
    // The command is over: whatever it left running in its group goes with it.
    if let Some(pgid) = pgid {
        let _ = rustix::process::kill_process_group(
            rustix::process::Pid::from_raw(pgid).ok_or_else(|| failed("bad pid"))?,
            rustix::process::Signal::KILL,
        );
    }
    if timed_out {
        let _ = child.wait().await;
    }
    let (stdout, t1) = tokio::time::timeout(DRAIN_GRACE, out_task)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let (stderr, t2) = tokio::time::timeout(DRAIN_GRACE, err_task)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    Ok(Reply::Exec {
        exit_code: status.and_then(|s| s.code()),
        stdout: stdout.into(),
        stderr: stderr.into(),
        truncated: t1 || t2,
        timed_out,
    })
}

async fn capture(pipe: Option<impl tokio::io::AsyncRead + Unpin>, max: usize) -> (Vec<u8>, bool) {
    let Some(mut pipe) = pipe else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (kept, truncated)
}

fn workspace_dir() -> Result<OwnedFd, AgentError> {
    rustix::fs::open(
        WORKSPACE,
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(failed)
}

fn io_error(e: rustix::io::Errno) -> AgentError {
    match e {
        rustix::io::Errno::NOENT => AgentError::NotFound,
        // RESOLVE_BENEATH refuses a path that leaves the workspace with EXDEV.
        rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => {
            AgentError::InvalidPath("the path leaves the workspace".into())
        }
        e => failed(e),
    }
}

/// Opens `path` beneath the workspace: symlinks may point within it, never out of it.
fn open_beneath(path: &str, flags: rustix::fs::OFlags) -> Result<OwnedFd, AgentError> {
    let p = WorkspacePath::parse(path).map_err(|e| AgentError::InvalidPath(e.to_string()))?;
    let dir = workspace_dir()?;
    rustix::fs::openat2(
        dir.as_fd(),
        p.as_str(),
        flags | rustix::fs::OFlags::CLOEXEC,
        // openat2 refuses a mode without O_CREAT.
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(io_error)
}

fn read_file(path: &str, max: u64) -> Result<Vec<u8>, AgentError> {
    // NONBLOCK: opening a FIFO must not wait for a writer; the type is checked right after.
    let fd = open_beneath(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK,
    )?;
    let st = rustix::fs::fstat(&fd).map_err(failed)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(AgentError::Invalid("not a regular file".into()));
    }
    if st.st_size as u64 > max {
        return Err(AgentError::TooLarge);
    }
    let mut data = Vec::new();
    std::fs::File::from(fd)
        .take(max + 1)
        .read_to_end(&mut data)
        .map_err(failed)?;
    if data.len() as u64 > max {
        return Err(AgentError::TooLarge);
    }
    Ok(data)
}

/// Splits a checked path into its parent directory (opened, created as needed, beneath the
/// workspace) and its final name.
fn parent_of(path: &str) -> Result<(OwnedFd, String), AgentError> {
    let p = WorkspacePath::parse(path).map_err(|e| AgentError::InvalidPath(e.to_string()))?;
    let (parent, name) = match p.as_str().rsplit_once('/') {
        Some((parent, name)) => (Some(parent), name),
        None => (None, p.as_str()),
    };
    let mut dir = workspace_dir()?;
    if let Some(parent) = parent {
        for part in parent.split('/') {
            match rustix::fs::mkdirat(&dir, part, rustix::fs::Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io_error(e)),
            }
            dir = rustix::fs::openat2(
                dir.as_fd(),
                part,
                rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
                rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_MAGICLINKS,
            )
            .map_err(io_error)?;
        }
    }
    Ok((dir, name.to_owned()))
}

fn write_file(path: &str, data: &[u8]) -> Result<(), AgentError> {
    let (dir, name) = parent_of(path)?;
    // Written beside and renamed over, so readers (and the change watcher) never see half.
    let tmp = temp_name(&name);
    let fd = rustix::fs::openat2(
        dir.as_fd(),
        tmp.as_str(),
        rustix::fs::OFlags::WRONLY
            | rustix::fs::OFlags::CREATE
            | rustix::fs::OFlags::TRUNC
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o644),
        rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
    )
    .map_err(io_error)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(data).map_err(failed)?;
    drop(file);
    rustix::fs::renameat(&dir, tmp.as_str(), &dir, name.as_str()).map_err(io_error)
}

/// The name a file is written under before it is renamed over `name`: hidden, marked, and
/// short enough for any file system (the name cut to at most 200 bytes, at a character
/// boundary: a name is UTF-8, and cutting inside a character panicked the agent).
fn temp_name(name: &str) -> String {
    let mut cut = name.len().min(200);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}.coderoom-tmp", &name[..cut])
}

fn remove_file(path: &str) -> Result<(), AgentError> {
    let (dir, name) = parent_of(path)?;
    match rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty()) {
        Err(rustix::io::Errno::ISDIR) => {
            rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::REMOVEDIR)
                .map_err(io_error)
        }
        r => r.map_err(io_error),
    }
}

/// The TCP ports listened on inside (this network namespace's `/proc/net/tcp` and `tcp6`),
/// the forwarder's aside.
fn listening() -> Vec<u16> {
    let mut ports = std::collections::BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            ports.extend(listening_in(&text));
        }
    }
    ports.remove(&proto::EGRESS_PORT);
    ports.into_iter().take(proto::MAX_LISTENING).collect()
}

/// Local ports of the sockets in state `0A` (LISTEN) of a `/proc/net/tcp`-style table.
fn listening_in(table: &str) -> impl Iterator<Item = u16> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let mut fields = line.split_whitespace();
        let local = fields.nth(1)?;
        let state = fields.nth(1)?;
        if state != "0A" {
            return None;
        }
        u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()
    })
}

fn list_files(max: usize) -> Reply {
    let mut entries = Vec::new();
    let mut truncated = false;
    // Breadth first: when the cap is reached, what is missing is the deepest, not a sibling
    // of a huge directory.
    let mut queue =
        std::collections::VecDeque::from([(PathBuf::from(WORKSPACE), String::new(), 0usize)]);
    while let Some((dir, rel, depth)) = queue.pop_front() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in rd.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if meta.is_dir() {
                if depth >= MAX_DEPTH {
                    truncated = true;
                } else if !SKIP_DIRS.contains(&name.as_str()) {
                    queue.push_back((entry.path(), path, depth + 1));
                }
            } else if meta.is_file() && WorkspacePath::parse(&path).is_ok() {
                if entries.len() >= max {
                    truncated = true;
                    break;
                }
                use std::os::unix::fs::MetadataExt;
                entries.push(FileEntry {
                    path,
                    size: meta.len(),
                    mtime_ns: i128::from(meta.mtime()) * 1_000_000_000
                        + i128::from(meta.mtime_nsec()),
                });
            }
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Reply::Files { entries, truncated }
}

/// Sends written bytes as [`Message::Chunk`] frames and enforces the size cap.
struct ChunkWriter<'a> {
    id: u64,
    out: &'a Out,
    buf: Vec<u8>,
    total: u64,
    max: u64,
    /// Set when writing failed (cap reached, control plane gone): the snapshot is over.
    broken: &'a std::cell::Cell<bool>,
}

impl ChunkWriter<'_> {
    fn flush_chunk(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let msg = Message::Chunk {
            id: self.id,
            data: ByteBuf::from(std::mem::take(&mut self.buf)),
        };
        let frame = proto::encode(&msg).map_err(std::io::Error::other)?;
        self.out.blocking_send(frame).map_err(|_| {
            self.broken.set(true);
            std::io::Error::other("control plane gone")
        })
    }
}

impl Write for ChunkWriter<'_> {
    /// Takes at most what fills the current chunk (a short write; `write_all` comes back for
    /// the rest): the control plane treats a chunk over [`CHUNK`] as a hostile agent.
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let data = &data[..data.len().min(CHUNK - self.buf.len())];
        self.total += data.len() as u64;
        if self.total > self.max {
            self.broken.set(true);
            return Err(std::io::Error::other("snapshot too large"));
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush_chunk()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.flush_chunk()
    }
}

fn snapshot(id: u64, max: u64, out: &Out) -> Result<Reply, AgentError> {
    let broken = std::cell::Cell::new(false);
    let mut w = ChunkWriter {
        id,
        out,
        buf: Vec::with_capacity(CHUNK),
        total: 0,
        max,
        broken: &broken,
    };
    let mut b = tar::Builder::new(&mut w);
    b.follow_symlinks(false);
    let r = append_tree(&mut b, Path::new(WORKSPACE), Path::new(""), 0, &broken)
        .and_then(|()| b.finish());
    drop(b);
    if let Err(e) = r {
        return Err(if w.total > w.max {
            AgentError::TooLarge
        } else {
            failed(e)
        });
    }
    w.flush().map_err(failed)?;
    Ok(Reply::Snapshot { bytes: w.total })
}

/// Reads that fail end the data early instead of failing the archive.
struct Lenient<R>(R);

impl<R: Read> Read for Lenient<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Ok(self.0.read(buf).unwrap_or(0))
    }
}

/// Archives `dir` as `rel`: directories, regular files and symlinks. What cannot be archived
/// (sockets, FIFOs, devices, unreadable or vanished entries) is skipped, and a file that changes
/// size while it is read is archived at the size it had, padded or cut, so the archive is
/// always well formed. Only the writer failing (the cap, the control plane gone) is an error.
fn append_tree<W: Write>(
    b: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
    depth: usize,
    broken: &std::cell::Cell<bool>,
) -> std::io::Result<()> {
    let check = |r: std::io::Result<()>| if broken.get() { r } else { Ok(()) };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let name = rel.join(entry.file_name());
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let ft = meta.file_type();
        let mut header = tar::Header::new_gnu();
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Deterministic);
        if ft.is_dir() {
            header.set_size(0);
            check(b.append_data(&mut header, &name, std::io::empty()))?;
            if depth < MAX_DEPTH {
                append_tree(b, &path, &name, depth + 1, broken)?;
            }
        } else if ft.is_file() {
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let len = meta.len();
            header.set_size(len);
            let data = Lenient(file).take(len).chain(std::io::repeat(0)).take(len);
            check(b.append_data(&mut header, &name, data))?;
        } else if ft.is_symlink() {
            let Ok(target) = std::fs::read_link(&path) else {
                continue;
            };
            header.set_size(0);
            check(b.append_link(&mut header, &name, &target))?;
        }
    }
    Ok(())
}

/// Opens a TCP connection inside the sandbox and wires it to stream `stream`.
async fn connect(state: &mut State, stream: u32, port: u16) -> Result<Reply, AgentError> {
    if stream & proto::OUTBOUND_STREAM != 0 {
        return Err(AgentError::Invalid("stream id out of range".into()));
    }
    {
        let streams = streams_of(&state.streams);
        if streams.len() >= MAX_STREAMS {
            return Err(AgentError::Invalid("too many open connections".into()));
        }
        if streams.contains_key(&stream) {
            return Err(AgentError::Invalid("stream id in use".into()));
        }
    }
    let tcp = tokio::time::timeout(
        CONNECT_WITHIN,
        tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)),
    )
    .await
    .map_err(|_| AgentError::Failed("connection timed out".into()))?
    .map_err(|e| AgentError::Failed(format!("cannot connect to port {port}: {e}")))?;
    let rx = open_stream(&state.streams, stream);
    carry(tcp, stream, rx, state.streams.clone(), state.out.clone());
    Ok(Reply::Done)
}

/// Registers stream `stream`: its queue toward the socket (returned) and its credit.
fn open_stream(streams: &Streams, stream: u32) -> mpsc::Receiver<Vec<u8>> {
    let (end, rx) = Carried::new();
    streams_of(streams).insert(stream, end);
    rx
}

/// Carries a connection's bytes as stream `stream`: what arrives on `rx` is written to it (each
/// chunk acknowledged), and what it sends goes out as [`Message::StreamData`] as the control
/// plane's acknowledgements allow, then [`Message::StreamClosed`]; the stream is forgotten once
/// the socket has nothing more to send.
fn carry(
    tcp: tokio::net::TcpStream,
    stream: u32,
    rx: mpsc::Receiver<Vec<u8>>,
    streams: Streams,
    out: Out,
) {
    let Some(credit) = streams_of(&streams).get(&stream).map(|c| c.credit.clone()) else {
        return;
    };
    let (rd, wr) = tcp.into_split();
    let ack = move |bytes| proto::encode(&Message::StreamAck { stream, bytes }).ok();
    tokio::spawn(crate::bridge::drain_into(rx, wr, out.clone(), ack));
    let closed = proto::encode(&Message::StreamClosed { stream }).ok();
    let frame = move |data| proto::encode(&Message::StreamData { stream, data }).ok();
    tokio::spawn(async move {
        crate::bridge::frames_from(rd, out, credit, frame, closed).await;
        crate::bridge::sent_all(&mut streams_of(&streams), stream);
    });
}

/// The egress forwarder: every connection code inside makes to [`proto::EGRESS_PORT`] becomes
/// an outbound stream to the control plane, which alone decides where it goes. Nothing here
/// reads or judges the bytes.
async fn forward_outbound(listener: tokio::net::TcpListener, streams: Streams, out: Out) {
    let mut next: u32 = 0;
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // Out of descriptors, most likely: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let stream = proto::OUTBOUND_STREAM | (next & !proto::OUTBOUND_STREAM);
        next = next.wrapping_add(1);
        {
            let open = streams_of(&streams);
            let outbound = open
                .keys()
                .filter(|s| *s & proto::OUTBOUND_STREAM != 0)
                .count();
            if open.len() >= MAX_STREAMS || outbound >= MAX_OUTBOUND || open.contains_key(&stream) {
                // Dropping the connection tells the program inside; nothing is queued.
                continue;
            }
        }
        let rx = open_stream(&streams, stream);
        let port = tcp.peer_addr().map(|a| a.port()).unwrap_or(0);
        let actor = tokio::task::spawn_blocking(move || actor_of_peer(port))
            .await
            .unwrap_or_default();
        // The control plane hears of the stream before any of its data.
        send(&out, &Message::Outbound { stream, actor }).await;
        carry(tcp, stream, rx, streams.clone(), out.clone());
    }
}

/// Feeds restore chunks to an unpacking thread; answers when the last chunk is unpacked.
async fn restore_chunk(
    state: &mut State,
    id: u64,
    data: Vec<u8>,
    last: bool,
) -> Option<Result<Reply, AgentError>> {
    if state.restore.as_ref().is_some_and(|r| r.id != id) {
        return Some(Err(AgentError::Invalid(
            "another restore is running".into(),
        )));
    }
    if state.restore.is_none() {
        let (feed, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(8);
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new().spawn(move || {
            let reader = ChannelReader {
                rx,
                cur: Vec::new(),
                pos: 0,
            };
            let mut archive = tar::Archive::new(reader);
            archive.set_preserve_permissions(true);
            archive.set_overwrite(true);
            let r = archive.unpack(WORKSPACE).map_err(failed);
            let _ = done_tx.send(r);
        });
        if let Err(e) = spawned {
            return Some(Err(failed(e)));
        }
        state.restore = Some(Restore { id, feed, done });
    }
    let job = state.restore.as_ref()?;
    let feed = job.feed.clone();
    let sent = tokio::task::spawn_blocking(move || feed.send(data).is_ok())
        .await
        .unwrap_or(false);
    if !last && sent {
        return None;
    }
    let job = state.restore.take()?;
    drop(job.feed);
    let r = job
        .done
        .await
        .unwrap_or_else(|_| Err(failed("unpacking stopped")));
    Some(r.map(|()| Reply::Done))
}

struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.cur.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.cur = next;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn ask(host: &mut tokio::net::UnixStream, id: u64, op: Op) {
        use tokio::io::AsyncWriteExt as _;
        let frame = proto::encode(&Request { id, op }).expect("frame");
        host.write_all(&frame).await.expect("sent");
    }

    async fn answer(host: &mut tokio::net::UnixStream) -> Message {
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), proto::read_frame(host, &mut buf))
            .await
            .expect("an answer in time")
            .expect("a frame")
            .expect("not the end")
    }

    fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    /// A restored VM's agent (cloud-hypervisor: the host's end of the vsock connection did not
    /// survive the save) is reached again through its listener: after `Quiesce`, a new
    /// connection takes the control stream's place, whether the old one hangs or has ended,
    /// `Resumed` comes over it, and everything after goes over it too.
    #[tokio::test]
    async fn after_a_save_the_control_stream_comes_again_from_the_listener() {
        for old_one_ends in [false, true] {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("agent.sock");
            let listener = tokio::net::UnixListener::bind(&path).expect("listener");
            let (agent_end, mut host) = tokio::net::UnixStream::pair().expect("pair");
            let agent_end: OwnedFd = agent_end.into_std().expect("std").into();
            let served = tokio::spawn(serve_on(
                Opened::Socket(agent_end),
                Some(Relisten::Unix(listener)),
            ));
            ask(&mut host, 1, Op::Hello).await;
            assert!(matches!(
                answer(&mut host).await,
                Message::Reply {
                    id: 1,
                    result: Ok(Reply::Hello { .. })
                }
            ));
            ask(&mut host, 2, Op::Quiesce).await;
            assert!(matches!(
                answer(&mut host).await,
                Message::Reply {
                    id: 2,
                    result: Ok(Reply::Done)
                }
            ));
            // The old stream ends, or hangs (its other end is gone with the old VMM).
            let _old = if old_one_ends {
                drop(host);
                None
            } else {
                Some(host)
            };
            let mut fresh = tokio::net::UnixStream::connect(&path).await.expect("again");
            ask(&mut fresh, 3, Op::Resumed { now_ms: now_ms() }).await;
            let m = answer(&mut fresh).await;
            assert!(
                matches!(
                    m,
                    Message::Reply {
                        id: 3,
                        result: Ok(Reply::Resumed { pty_open: false })
                    }
                ),
                "{m:?}"
            );
            ask(&mut fresh, 4, Op::Hello).await;
            assert!(matches!(
                answer(&mut fresh).await,
                Message::Reply {
                    id: 4,
                    result: Ok(Reply::Hello { .. })
                }
            ));
            drop(fresh);
            tokio::time::timeout(Duration::from_secs(10), served)
                .await
                .expect("the agent ends with its stream")
                .expect("task")
                .expect("served");
        }
    }

    #[test]
    fn the_proxy_variables_name_the_forwarder() {
        assert_eq!(
            PROXY_URL,
            format!("http://127.0.0.1:{}", proto::EGRESS_PORT)
        );
        for name in ["HTTP_PROXY", "https_proxy", "ALL_PROXY"] {
            assert!(base_env().contains(&(name, PROXY_URL)), "{name}");
        }
    }

    /// Only LISTEN sockets count, on any address, IPv4 or IPv6; junk lines are skipped.
    #[test]
    fn listening_ports_are_read_from_the_tables() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1
   1: 00000000:1435 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1
   2: 0100007F:1F40 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000  1000        0 3 1
   3: garbage
";
        let v6 = "  sl  local_address remote_address st
   0: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 0
";
        assert_eq!(listening_in(v4).collect::<Vec<_>>(), vec![8000, 5173]);
        assert_eq!(listening_in(v6).collect::<Vec<_>>(), vec![3000]);
    }

    /// Any UTF-8 name, however its characters fall around byte 200, gets a temporary name
    /// (no panic), valid UTF-8, short enough for a file system, and never the name itself.
    #[test]
    fn temporary_names_never_cut_a_character() {
        let mut names: Vec<String> = Vec::new();
        // Every alignment of 2-, 3- and 4-byte characters against the cut.
        for filler in 190..=205 {
            for ch in ['é', '€', '😀'] {
                names.push(format!(
                    "{}{}",
                    "a".repeat(filler),
                    ch.to_string().repeat(20)
                ));
            }
        }
        for name in names {
            let tmp = temp_name(&name);
            assert!(tmp.len() <= 255, "{} bytes", tmp.len());
            assert!(tmp.starts_with('.') && tmp.ends_with(".coderoom-tmp"));
            assert_ne!(tmp, name);
        }
    }

    proptest::proptest! {
        /// Arbitrary UTF-8 names, of any length up to a file system's limit.
        #[test]
        fn temporary_names_of_any_utf8_name(name in "\\PC{1,255}") {
            let tmp = temp_name(&name);
            proptest::prop_assert!(tmp.len() <= 255);
            proptest::prop_assert!(tmp.ends_with(".coderoom-tmp"));
        }
    }

    /// Big writes (a large file's contents) are cut at the chunk size: an oversized chunk makes
    /// the control plane kill the sandbox as hostile, so a big workspace could never be
    /// snapshotted.
    #[test]
    fn snapshot_chunks_never_exceed_the_limit() {
        let (out, mut frames) = mpsc::channel::<Vec<u8>>(64);
        let broken = std::cell::Cell::new(false);
        let mut w = ChunkWriter {
            id: 9,
            out: &out,
            buf: Vec::new(),
            total: 0,
            max: u64::MAX,
            broken: &broken,
        };
        let piece = vec![7u8; CHUNK / 2 + 1000];
        for _ in 0..5 {
            w.write_all(&piece).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        drop(out);
        let mut total = 0;
        while let Some(frame) = frames.blocking_recv() {
            let msg: Message = postcard::from_bytes(&frame[4..]).unwrap();
            let Message::Chunk { id: 9, data } = msg else {
                panic!("not a chunk of the snapshot")
            };
            assert!(data.len() <= CHUNK, "a chunk of {} bytes", data.len());
            total += data.len();
        }
        assert_eq!(total, piece.len() * 5);
        assert!(!broken.get());
    }
}

//! The wire protocol between the control plane and the guest agent: one byte stream (a unix
//! socket pair in the namespace tier, vsock or virtio-serial in the microVM tier), carrying
//! frames of a 4-byte big-endian length followed by a postcard-encoded message.
//!
//! Both ends treat the other as untrusted: a frame longer than [`MAX_FRAME`] or one that does
//! not decode ends the connection.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Protocol version the agent announces in [`Reply::Hello`]; the server refuses any other.
pub const PROTOCOL_VERSION: u32 = 8;

/// Largest frame body either side accepts: a reply carrying a whole file (the API reads up to
/// 16 MiB) or two captured output streams. Streamed data (terminal output, snapshots, port
/// connections) travels in chunks of at most [`CHUNK`] bytes, which the control plane enforces.
pub const MAX_FRAME: usize = 20 << 20;

/// Largest terminal output chunk the agent may send (it reads the PTY 64 KiB at a time).
pub const MAX_PTY_CHUNK: usize = 64 << 10;

/// Largest payload chunk of bulk data in one frame.
pub const CHUNK: usize = 256 << 10;

/// Port on the sandbox's loopback where the agent accepts outbound connections (the room's
/// `HTTP_PROXY`): each one is carried to the control plane as an [`Message::Outbound`] stream,
/// and the control plane's egress proxy alone decides where, if anywhere, it goes.
pub const EGRESS_PORT: u16 = 3128;

/// Set in the ids of streams the agent opens ([`Message::Outbound`]); never in the ids the
/// control plane picks for [`Op::Connect`], so the two never collide.
pub const OUTBOUND_STREAM: u32 = 1 << 31;

/// A request from the control plane. `id` pairs it with its [`Reply`]; requests that get no
/// reply (terminal input and resize) use id 0.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    /// Correlates the reply.
    pub id: u64,
    /// What to do.
    pub op: Op,
}

/// The typed operations the agent performs. Paths are relative to `/workspace` and checked by
/// [`crate::path::WorkspacePath`] on both sides.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Op {
    /// Liveness and version check; the sandbox is ready once this is answered.
    Hello,
    /// Run a command to completion, capturing output.
    Exec {
        /// Program and arguments (`argv[0]` is looked up in `PATH`).
        argv: Vec<String>,
        /// Working directory relative to `/workspace` (empty for the workspace itself).
        cwd: String,
        /// The process group is killed after this long.
        timeout_ms: u64,
        /// Bytes of stdout and of stderr kept each; the rest is discarded.
        max_output: u32,
        /// Whom the control plane runs it for: connections its processes open through the
        /// egress forwarder are attributed to them (empty: to nobody in particular).
        actor: String,
    },
    /// Open the room's PTY running `argv` (replaces none: fails if one is open).
    PtyOpen {
        /// The shell to run.
        argv: Vec<String>,
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// Bytes typed into the PTY (no reply).
    PtyInput(ByteBuf),
    /// New PTY size (no reply).
    PtyResize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// Read a file of at most `max_bytes`.
    ReadFile {
        /// Workspace-relative path.
        path: String,
        /// Larger files are refused with [`AgentError::TooLarge`].
        max_bytes: u64,
    },
    /// Create or replace a file (parents are created).
    WriteFile {
        /// Workspace-relative path.
        path: String,
        /// New content.
        data: ByteBuf,
    },
    /// Remove a file or an empty directory.
    RemoveFile {
        /// Workspace-relative path.
        path: String,
    },
    /// List regular files under the workspace with their size and modification time.
    ListFiles {
        /// At most this many entries are returned; `truncated` says when more exist.
        max_entries: u32,
    },
    /// Archive the workspace as a tar stream, sent as [`Message::Chunk`] frames with this
    /// request's id, then the reply. Fails when the archive would exceed `max_bytes`.
    Snapshot {
        /// Cap on the archive size.
        max_bytes: u64,
    },
    /// One chunk of a tar archive to unpack into the workspace; `last` unpacks and replies.
    Restore {
        /// Archive bytes.
        data: ByteBuf,
        /// The final chunk.
        last: bool,
    },
    /// Open a TCP connection to `127.0.0.1:port` inside the sandbox as stream `stream` (an id
    /// the control plane picks). Replies once connected; data then flows as
    /// [`Op::StreamData`] / [`Message::StreamData`].
    Connect {
        /// The control plane's id for this stream.
        stream: u32,
        /// Port inside the sandbox.
        port: u16,
    },
    /// Bytes for an open stream (no reply).
    StreamData {
        /// The stream.
        stream: u32,
        /// Bytes.
        data: ByteBuf,
    },
    /// Close an open stream (no reply).
    StreamClose {
        /// The stream.
        stream: u32,
    },
    /// `bytes` of stream `stream` were passed on to the socket inside: that much more may be
    /// sent (see [`crate::bridge`]). No reply.
    StreamAck {
        /// The stream.
        stream: u32,
        /// Bytes passed on.
        bytes: u32,
    },
    /// What the outside looks like to room code from now on: the certificate of the room's
    /// egress authority (added to the trust bundle at [`TRUST_FILE`]), and the variables every
    /// later exec and terminal gets (secret placeholders: `CODEROOM_SECRET_*`, never values).
    Egress {
        /// One PEM certificate.
        ca_pem: String,
        /// `CODEROOM_SECRET_<NAME>` = placeholder.
        env: Vec<(String, String)>,
    },
    /// The TCP ports something inside listens on (IPv4 and IPv6, any address), the agent's
    /// own forwarder ([`EGRESS_PORT`]) aside: the room offers to preview them.
    Listening,
    /// The VM is about to be saved (its disk, and perhaps its memory): the agent closes every
    /// port connection (their host ends will be gone), flushes the guest's file systems,
    /// answers [`Reply::Done`], and from then on sends nothing until [`Op::Resumed`], so the
    /// saved stream ends on a frame's boundary.
    Quiesce,
    /// The VM was restored from a memory snapshot and a new control plane holds the channel:
    /// the agent sets the guest's clock to `now_ms` (milliseconds since the Unix epoch; the
    /// guest's stood still while it was saved), sends again, and answers [`Reply::Resumed`].
    Resumed {
        /// The host's time.
        now_ms: u64,
    },
    /// Ends the command of request `id` (an [`Op::Exec`] still running): its whole process
    /// group is killed and that request answered [`AgentError::Cancelled`]. Sent with id 0
    /// (no reply of its own); a request already answered is left alone.
    Cancel {
        /// The request whose command ends.
        id: u64,
    },
    /// Bytes typed into the PTY by `actor` (no reply): the terminal's jobs started after a
    /// line `actor` ended run for `actor` (see the agent's units).
    PtyTyped {
        /// Bytes.
        data: ByteBuf,
        /// Who typed them.
        actor: String,
    },
    /// [`Op::Exec`] with its output streamed as it is printed: each read of standard output or
    /// error goes out as a [`Message::Chunk`] of this request (its first byte 1 or 2 says
    /// which), then the reply, a [`Reply::Exec`] with nothing kept in it.
    Run {
        /// Program and arguments (`argv[0]` is looked up in `PATH`).
        argv: Vec<String>,
        /// Working directory relative to `/workspace` (empty for the workspace itself).
        cwd: String,
        /// Variables added to room code's environment (the room's own win over them).
        envs: Vec<(String, String)>,
        /// The command's unit is ended after this long.
        timeout_ms: u64,
        /// Whom it runs for (see [`Op::Exec`]).
        actor: String,
        /// Its standard input is a pipe fed by [`Op::RunInput`] (otherwise it reads as empty).
        stdin: bool,
        /// It runs on a terminal of its own of this size (columns, rows): its output comes as
        /// chunks whose first byte is 3, and its input, when `stdin`, is typed into it.
        pty: Option<(u16, u16)>,
    },
    /// Input for the command of request `id` (an [`Op::Run`] still running). No reply; for a
    /// request that is not running it is dropped.
    RunInput {
        /// The request whose command it is for.
        id: u64,
        /// What.
        input: RunInput,
    },
    /// What `path` is (the workspace itself when empty); a symlink is described, not followed.
    Stat {
        /// Workspace-relative path, or empty.
        path: String,
    },
    /// The entries under directory `path` (the workspace when empty), `depth` levels down
    /// (1: its own entries); symlinks are listed, never followed. Answers [`Reply::Entries`].
    ListDir {
        /// Workspace-relative path, or empty.
        path: String,
        /// Levels listed, at least 1.
        depth: u32,
    },
    /// Makes directory `path` and any parents missing; [`AgentError::Exists`] when it is there.
    MakeDir {
        /// Workspace-relative path.
        path: String,
    },
    /// Renames `from` to `to` (parents of `to` made as needed).
    Move {
        /// Workspace-relative path.
        from: String,
        /// Workspace-relative path.
        to: String,
    },
    /// Ends every process that runs for `actor`: its commands' and the terminal's jobs it
    /// started (the terminal's program stays). Answers [`Reply::Stopped`].
    StopUnits {
        /// The participant.
        actor: String,
    },
}

/// Input for a running [`Op::Run`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum RunInput {
    /// Bytes for its standard input (or typed into its terminal).
    Data(ByteBuf),
    /// Its standard input ends (a terminal's stays open: its program reads on).
    Close,
    /// Its terminal's new size (columns, rows).
    Resize(u16, u16),
}

/// The first byte of an [`Op::Run`]'s output chunk: which stream it is from.
pub const RUN_STDOUT: u8 = 1;
/// See [`RUN_STDOUT`].
pub const RUN_STDERR: u8 = 2;
/// See [`RUN_STDOUT`]: the command's terminal.
pub const RUN_PTY: u8 = 3;

/// The trust bundle room code's TLS clients are pointed at (`SSL_CERT_FILE` and friends): the
/// system's roots, plus the room's egress authority once [`Op::Egress`] names it.
pub const TRUST_FILE: &str = "/run/coderoom/ca-certificates.crt";

/// A message from the agent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Message {
    /// The outcome of request `id`.
    Reply {
        /// The request's id.
        id: u64,
        /// What happened.
        result: Result<Reply, AgentError>,
    },
    /// Bulk data belonging to request `id` (a snapshot).
    Chunk {
        /// The request's id.
        id: u64,
        /// Bytes.
        data: ByteBuf,
    },
    /// Terminal output.
    PtyOutput(ByteBuf),
    /// Bytes from a connection opened with [`Op::Connect`].
    StreamData {
        /// The stream.
        stream: u32,
        /// Bytes.
        data: ByteBuf,
    },
    /// The connection ended (or was refused after all).
    StreamClosed {
        /// The stream.
        stream: u32,
    },
    /// The PTY's program ended.
    PtyExit {
        /// Its exit code, when it exited rather than being killed by a signal.
        code: Option<i32>,
    },
    /// `bytes` of stream `stream` were passed on to its reader in the control plane: that much
    /// more may be sent (see [`crate::bridge`]).
    StreamAck {
        /// The stream.
        stream: u32,
        /// Bytes passed on.
        bytes: u32,
    },
    /// Code inside connected to [`EGRESS_PORT`]: a new stream (its id has [`OUTBOUND_STREAM`]
    /// set) whose bytes then flow as [`Op::StreamData`] / [`Message::StreamData`]. The control
    /// plane closes it with [`Op::StreamClose`] when it will not carry it.
    Outbound {
        /// The agent's id for this stream.
        stream: u32,
        /// Whose process opened it: the `actor` of the exec whose session the process is in,
        /// `terminal` for the terminal's, empty when the agent cannot tell (a process that left
        /// its session). Processes cannot join another session, so they can drop their
        /// attribution but never take someone else's.
        actor: String,
    },
    /// The sandbox ended on its sandbox host, and why: the last frame a sandbox host sends a
    /// room server before closing the connection (see [`crate::remote`]). Never an agent's: a
    /// sandbox host drops it when its agent sends it.
    HostEnded {
        /// How it ended, in words.
        reason: String,
    },
}

/// Successful replies, one shape per [`Op`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Reply {
    /// Answer to [`Op::Hello`].
    Hello {
        /// [`PROTOCOL_VERSION`] of the agent.
        version: u32,
        /// The agent's process id inside the sandbox (1 when it is init).
        pid: u32,
    },
    /// The operation succeeded with nothing to report.
    Done,
    /// Answer to [`Op::Exec`].
    Exec {
        /// Exit code, or `None` when killed by a signal.
        exit_code: Option<i32>,
        /// Captured standard output.
        stdout: ByteBuf,
        /// Captured standard error.
        stderr: ByteBuf,
        /// Output beyond `max_output` was discarded.
        truncated: bool,
        /// The timeout killed it.
        timed_out: bool,
    },
    /// Answer to [`Op::ReadFile`].
    File(ByteBuf),
    /// Answer to [`Op::ListFiles`].
    Files {
        /// The files found.
        entries: Vec<FileEntry>,
        /// More files exist than were listed.
        truncated: bool,
    },
    /// Answer to [`Op::Snapshot`] after its chunks.
    Snapshot {
        /// Total archive bytes sent.
        bytes: u64,
    },
    /// Answer to [`Op::Listening`]: ascending, at most [`MAX_LISTENING`].
    Listening(Vec<u16>),
    /// Answer to [`Op::Stat`].
    Entry(Entry),
    /// Answer to [`Op::ListDir`].
    Entries {
        /// What was found, sorted by path.
        entries: Vec<Entry>,
        /// More was there than [`MAX_ENTRIES`].
        truncated: bool,
    },
    /// Answer to [`Op::StopUnits`].
    Stopped {
        /// Processes ended.
        processes: u32,
    },
    /// Answer to [`Op::Resumed`].
    Resumed {
        /// The terminal opened before the save is still open (its program kept running).
        pty_open: bool,
    },
}

/// Most entries [`Op::ListDir`] answers.
pub const MAX_ENTRIES: usize = 10_000;

/// What a workspace entry is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else (a FIFO, a socket, a device).
    Other,
}

/// One workspace entry, as [`Op::Stat`] and [`Op::ListDir`] describe it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    /// Workspace-relative path (empty: the workspace).
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o7777` of `st_mode`).
    pub mode: u32,
    /// Owner and group ids inside the sandbox.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// A symlink's target, as written.
    pub target: Option<String>,
}

/// Most variables [`Op::Run`] may add, and the longest name and value.
pub const MAX_RUN_ENVS: usize = 128;
/// See [`MAX_RUN_ENVS`].
pub const MAX_RUN_ENV_BYTES: usize = 32 << 10;

/// Whether [`Op::Run`]'s variables are well formed: at most [`MAX_RUN_ENVS`], names of letters,
/// digits and `_` not starting with a digit, no NUL in a value, none longer than
/// [`MAX_RUN_ENV_BYTES`].
pub fn run_envs_ok(envs: &[(String, String)]) -> bool {
    envs.len() <= MAX_RUN_ENVS
        && envs.iter().all(|(k, v)| {
            !k.is_empty()
                && k.len() <= 256
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && v.len() <= MAX_RUN_ENV_BYTES
                && !v.contains('\0')
        })
}

/// Most ports [`Reply::Listening`] names.
pub const MAX_LISTENING: usize = 64;

/// One regular file of the workspace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    /// Workspace-relative path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

/// Why the agent refused or failed an operation. The text is safe to show to room members: it
/// describes their own workspace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The path is not a valid workspace path.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// No such file.
    #[error("not found")]
    NotFound,
    /// The file or output is larger than allowed.
    #[error("too large")]
    TooLarge,
    /// What would be made is there already.
    #[error("already exists")]
    Exists,
    /// The operation is not valid now (e.g. a second PTY).
    #[error("{0}")]
    Invalid(String),
    /// An I/O or process error inside the sandbox.
    #[error("{0}")]
    Failed(String),
    /// The command was ended on the control plane's word ([`Op::Cancel`]).
    #[error("the command was stopped")]
    Cancelled,
}

/// Errors reading or writing frames.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream failed or closed.
    #[error("stream failed")]
    Io(#[from] std::io::Error),
    /// A frame was longer than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit")]
    TooLong(usize),
    /// A frame did not decode.
    #[error("malformed frame")]
    Malformed(#[from] postcard::Error),
}

/// Encodes one frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let mut out = postcard::to_extend(msg, vec![0u8; 4])?;
    let len = out.len() - 4;
    if len > MAX_FRAME {
        return Err(FrameError::TooLong(len));
    }
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> Result<(), FrameError> {
    let bytes = encode(msg)?;
    w.write_all(&bytes).await?;
    Ok(())
}

/// Reads one frame; `Ok(None)` at a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<T>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLong(len));
    }
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(Some(postcard::from_bytes(buf)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_refuse_garbage() {
        let req = Request {
            id: 7,
            op: Op::WriteFile {
                path: "a/b.txt".into(),
                data: ByteBuf::from(vec![1, 2, 3]),
            },
        };
        let bytes = encode(&req).unwrap();
        let mut r = &bytes[..];
        let mut buf = Vec::new();
        let back: Request = read_frame(&mut r, &mut buf).await.unwrap().unwrap();
        assert_eq!(back, req);
        let end: Option<Request> = read_frame(&mut r, &mut buf).await.unwrap();
        assert!(end.is_none());

        let mut huge = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        let mut r = &huge[..];
        let err = read_frame::<_, Request>(&mut r, &mut buf)
            .await
            .unwrap_err();
        assert!(matches!(err, FrameError::TooLong(_)));

        let garbage = [0u8, 0, 0, 3, 0xff, 0xff, 0xff];
        let mut r = &garbage[..];
        let err = read_frame::<_, Message>(&mut r, &mut buf)
            .await
            .unwrap_err();
        assert!(matches!(err, FrameError::Malformed(_)));

        let oversized = Request {
            id: 1,
            op: Op::PtyInput(ByteBuf::from(vec![0; MAX_FRAME + 1])),
        };
        const { assert!(MAX_PTY_CHUNK <= CHUNK) };
        assert!(matches!(encode(&oversized), Err(FrameError::TooLong(_))));
    }
}

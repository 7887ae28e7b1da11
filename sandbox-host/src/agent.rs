//! The guest agent: runs inside the sandbox as PID 1 and performs the typed operations of
//! [`crate::proto`] on behalf of the control plane. It holds no authority of its own; everything
//! it can reach is what the sandbox can reach.
//!
//! Process layout inside the sandbox: PID 1 is this binary in reaper mode (it reaps every
//! orphan and exits when the serving agent exits, which tears the sandbox down); PID 2 is the
//! serving agent, parent of every exec and of the PTY's shell.

mod archive;
mod channel;
mod env;
mod files;
mod run;
mod streams;
mod units;

use crate::proto::{self, AgentError, Message, Op, Reply, Request, PROTOCOL_VERSION};
use portable_pty::{MasterPty, PtySize};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use archive::{restore_chunk, snapshot};
pub use channel::Channel;
use channel::{halves, Opened, Relisten, QUIESCED_WITHIN};
use env::{link_system_trust, set_egress};
use files::{list_dir, list_files, make_dir, move_entry, read_file, remove_file, stat, write_file};
use run::{exec, open_pty};
use streams::{connect, forward_outbound, listening};

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

/// Signals a unit's keeper ignores: the terminal's job control and interrupts are for its
/// program (which gets them back at their defaults).
const KEEPER_IGNORES: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGHUP,
];

/// Entry point of `coderoom agent --exec-as UID [--status-fd N] -- ARGV`: keeps a unit (see
/// [`units`]). This process stays the agent's user, becomes a child subreaper and starts ARGV
/// as `UID` (real, effective and saved, group too; no capabilities survive the exec).
///
/// With `status_fd` (a command): ARGV leads a session of its own; once it ends, its process
/// group goes with it, its wait status (4 bytes, native order) is written to `status_fd`, and
/// the keeper stays, reaping, while what the command detached (`setsid`, a daemon) runs on:
/// those still count to the unit's participant, and are ended when it is stopped. Without (the
/// terminal's program): once ARGV ends, whatever the unit still runs is ended and the keeper
/// exits as ARGV did.
pub fn exec_as(uid: u32, argv: &[String], status_fd: Option<i32>) -> i32 {
    use std::os::unix::process::CommandExt as _;
    let Some((prog, args)) = argv.split_first() else {
        return 64;
    };
    // A session of its own for a command's unit (the terminal's keeper leads one already, with
    // the PTY as its controlling terminal): nothing of the unit shares the agent's.
    if rustix::process::getsid(None).ok() != Some(rustix::process::getpid()) {
        let _ = rustix::process::setsid();
    }
    // SAFETY: prctl and signal with constant arguments, before any thread exists.
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return 71;
        }
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        for sig in KEEPER_IGNORES {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    // SAFETY: single-threaded here (the keeper runs before any thread is made), so the child
    // may run any code.
    let program = unsafe { libc::fork() };
    if program < 0 {
        return 71;
    }
    if program == 0 {
        // SAFETY: as above; restoring dispositions this process set, closing the status
        // descriptor (the command never holds it), and leading a group the end can kill.
        unsafe {
            for sig in KEEPER_IGNORES {
                libc::signal(sig, libc::SIG_DFL);
            }
            if let Some(fd) = status_fd {
                libc::close(fd);
                libc::setsid();
                // A command on a terminal of its own: it is the session's controlling
                // terminal, so the program gets its job control and its ^C.
                if libc::isatty(0) == 1 {
                    libc::ioctl(0, libc::TIOCSCTTY, 0);
                }
            }
        }
        if become_user(uid).is_err() {
            // SAFETY: ends the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(77) };
        }
        let err = std::process::Command::new(prog).args(args).exec();
        eprintln!("{prog}: {err}");
        let code = if err.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        };
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    let Some(status) = reap_all_until(program) else {
        return 70;
    };
    if let Some(fd) = status_fd {
        // SAFETY: killing the command's own process group (it led one), then writing four
        // bytes from a local to a descriptor this process owns, and closing it.
        unsafe {
            libc::kill(-program, libc::SIGKILL);
            let bytes = status.to_ne_bytes();
            libc::write(fd, bytes.as_ptr().cast(), bytes.len());
            libc::close(fd);
        }
        // What it detached runs on under this keeper until it ends (or is stopped).
        reap_rest();
        return 0;
    }
    units::end_below(std::process::id() as i32);
    // The killed ones, now zombies.
    reap_rest();
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: restores a default disposition and signals this process, as its program
        // ended; if it survives that, the exit code says which signal.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
        }
        return 128 + sig;
    }
    libc::WEXITSTATUS(status)
}

/// The agent's command line: `--fd N | --port NAME | --vsock PORT` to serve a control stream,
/// or `--exec-as UID [--status-fd N] -- ARGV` to start room code as `UID`. Parsed by hand, not
/// with the server's full command line: every command room code runs starts through it, and
/// building the server's whole argument parser cost ~0.7 ms of each (docs/benchmarks.md).
/// Returns the exit code.
pub fn run_command_line(args: impl Iterator<Item = std::ffi::OsString>) -> i32 {
    // Arguments come from the control plane (UTF-8 throughout); anything else is replaced, not
    // a panic.
    let mut args = args.map(|a| a.to_string_lossy().into_owned());
    let mut channel = None;
    let mut run_as = None;
    let mut status_fd = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fd" => channel = args.next().and_then(|v| v.parse().ok()).map(Channel::Fd),
            "--port" => channel = args.next().map(Channel::Port),
            "--vsock" => channel = args.next().and_then(|v| v.parse().ok()).map(Channel::Vsock),
            "--exec-as" => run_as = args.next().and_then(|v| v.parse().ok()),
            "--status-fd" => status_fd = args.next().and_then(|v| v.parse().ok()),
            // Which sources this agent was built from (`AgentCommand::beside` asks).
            "--build" => {
                println!("{}", crate::AGENT_BUILD);
                return 0;
            }
            "--" => break,
            _ => {}
        }
    }
    if let Some(uid) = run_as {
        let argv: Vec<String> = args.collect();
        return exec_as(uid, &argv, status_fd);
    }
    let Some(channel) = channel else {
        eprintln!(
            "usage: coderoom-agent --fd N | --port NAME | --vsock PORT | --exec-as UID [--status-fd N] -- ARGV | --build"
        );
        return 64;
    };
    main(channel)
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
    // The system's roots until the control plane names the room's authority (a sandbox of
    // the warm pool has no room yet).
    link_system_trust();
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
    // Made now (the thread is spawned with the task), not waited for.
    drop(rt.spawn_blocking(|| ()));
    match rt.block_on(serve(owned)) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// PID 1's loop: reap every child, and exit with the serving agent's status when it ends.
fn reap_until(main_child: libc::pid_t) -> i32 {
    match reap_all_until(main_child) {
        Some(status) if libc::WIFEXITED(status) => libc::WEXITSTATUS(status),
        Some(status) => 128 + libc::WTERMSIG(status),
        None => 1,
    }
}

/// Reaps every child until none is left.
fn reap_rest() {
    // SAFETY: plain waitpid on any child, its status not kept.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) } > 0 {}
}

/// Reaps every child (orphans included) until `main_child` ends: its wait status, or `None`
/// once there is no child left to wait for.
fn reap_all_until(main_child: libc::pid_t) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: plain waitpid on any child with a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == main_child {
            return Some(status);
        }
        if pid < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            return None;
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
    /// Commands running, by request id: [`Op::Cancel`] ends one.
    running: Running,
}

/// Running commands, by request id: their cancel switches, and where [`Op::RunInput`] for
/// them goes (a command started with input).
type Running = Arc<Mutex<HashMap<u64, Started>>>;

struct Started {
    cancel: tokio::sync::oneshot::Sender<()>,
    input: Option<mpsc::Sender<proto::RunInput>>,
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
        running: Arc::default(),
    };
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
        Op::PtyInput(data) => typed(state, data.into_vec(), None),
        Op::PtyTyped { data, actor } => typed(state, data.into_vec(), Some(&actor)),
        Op::StopUnits { actor } => spawn_reply(&state.out, id, move || {
            let processes = u32::try_from(units::stop(&actor)).unwrap_or(u32::MAX);
            Ok(Reply::Stopped { processes })
        }),
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
            let cmd = run::Cmd {
                argv,
                cwd,
                envs: Vec::new(),
                timeout_ms,
                actor,
                stdin: false,
                pty: None,
            };
            start_command(state, id, cmd, run::Output::Kept(max_output as usize));
        }
        Op::Run {
            argv,
            cwd,
            envs,
            timeout_ms,
            actor,
            stdin,
            pty,
        } => {
            if !proto::run_envs_ok(&envs) {
                let bad = AgentError::Invalid("bad environment variables".into());
                send(&state.out, &reply(id, Err(bad))).await;
                return;
            }
            let cmd = run::Cmd {
                argv,
                cwd,
                envs,
                timeout_ms,
                actor,
                stdin,
                pty,
            };
            let output = run::Output::Streamed {
                out: state.out.clone(),
                id,
            };
            start_command(state, id, cmd, output);
        }
        Op::RunInput { id: which, input } => {
            let to = state
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&which)
                .and_then(|s| s.input.clone());
            if let Some(to) = to {
                // The end of its input (and a size) is never lost: it waits its turn after
                // what is queued, beside the loop. Bytes for a command that is not reading its
                // input (its queue full) are dropped: the agent stays bounded, as at the
                // terminal.
                if let Err(mpsc::error::TrySendError::Full(
                    input @ (proto::RunInput::Close | proto::RunInput::Resize(..)),
                )) = to.try_send(input)
                {
                    tokio::spawn(async move {
                        let _ = to.send(input).await;
                    });
                }
            }
        }
        Op::Cancel { id: which } => {
            let started = state
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&which);
            if let Some(started) = started {
                let _ = started.cancel.send(());
            }
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
        Op::Stat { path } => spawn_reply(&state.out, id, move || stat(&path)),
        Op::ListDir { path, depth } => spawn_reply(&state.out, id, move || list_dir(&path, depth)),
        Op::MakeDir { path } => spawn_reply(&state.out, id, move || {
            make_dir(&path).map(|()| Reply::Done)
        }),
        Op::Move { from, to } => spawn_reply(&state.out, id, move || {
            move_entry(&from, &to).map(|()| Reply::Done)
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

/// Runs a command beside the loop, cancellable by request id ([`Op::Cancel`]).
fn start_command(state: &State, id: u64, cmd: run::Cmd, output: run::Output) {
    let out = state.out.clone();
    let (cancel, cancelled) = tokio::sync::oneshot::channel();
    let (input, input_rx) = if cmd.stdin || cmd.pty.is_some() {
        let (tx, rx) = mpsc::channel(run::INPUT_QUEUE);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let running = state.running.clone();
    running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, Started { cancel, input });
    tokio::spawn(async move {
        let r = exec(cmd, output, input_rx, cancelled).await;
        running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        send(&out, &reply(id, r)).await;
    });
}

/// Hands typed bytes to the terminal; a line they end runs for `actor` (see [`units`]).
fn typed(state: &State, data: Vec<u8>, actor: Option<&str>) {
    let guard = state.pty.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pty) = guard.as_ref() {
        if units::ends_line(&data) {
            units::line_typed(actor.unwrap_or(units::TERMINAL));
        }
        // A full queue means the program is not reading; dropping keeps us bounded.
        let _ = pty.input.try_send(data);
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
}

//! Running room code: the shared terminal's program on a PTY, and one-off commands with their
//! output captured.

use super::env::room_env;
use super::units::Unit;
use super::{failed, room_uid, size, Pty, State, SELF_COMMAND, WORKSPACE};
use crate::path::WorkspacePath;
use crate::proto::{self, AgentError, Message, Reply};
use portable_pty::CommandBuilder;
use serde_bytes::ByteBuf;
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncReadExt as _;

/// Terminal input chunks queued for the PTY before new input is dropped (a program that does
/// not read its input must not grow the agent).
const PTY_INPUT_QUEUE: usize = 256;
/// After an exec's main process exits, how long its output pipes may stay open.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

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

pub(super) fn open_pty(
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
    // Room code runs as room code, in the terminal's unit: through this binary's `--exec-as`
    // (the PTY's child is made by portable-pty, which can neither change users nor keep a
    // unit itself).
    let mut cmd = CommandBuilder::new(keeper()?);
    cmd.args(keeper_args(prog, None));
    cmd.args(args);
    cmd.cwd(WORKSPACE);
    cmd.env_clear();
    for (k, v) in room_env() {
        cmd.env(k, v);
    }
    let mut child = pair.slave.spawn_command(cmd).map_err(failed)?;
    drop(pair.slave);
    let unit = child.process_id().map(|pid| Unit::terminal(pid as i32));
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
            drop(unit);
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

/// A command to run: [`Op::Exec`](crate::proto::Op::Exec) or
/// [`Op::Run`](crate::proto::Op::Run).
pub(super) struct Cmd {
    pub(super) argv: Vec<String>,
    pub(super) cwd: String,
    pub(super) envs: Vec<(String, String)>,
    pub(super) timeout_ms: u64,
    pub(super) actor: String,
    /// Its standard input is fed by [`Op::RunInput`](crate::proto::Op::RunInput).
    pub(super) stdin: bool,
    /// It runs on a terminal of its own, this many columns and rows.
    pub(super) pty: Option<(u16, u16)>,
}

/// Input chunks queued for a command before more are dropped.
pub(super) const INPUT_QUEUE: usize = 256;

/// What becomes of a command's output.
pub(super) enum Output {
    /// Kept, up to this many bytes of each stream, for the reply.
    Kept(usize),
    /// Sent as it is read, as chunks of request `id`.
    Streamed { out: super::Out, id: u64 },
}

pub(super) async fn exec(
    cmd: Cmd,
    output: Output,
    input: Option<tokio::sync::mpsc::Receiver<proto::RunInput>>,
    cancelled: tokio::sync::oneshot::Receiver<()>,
) -> Result<Reply, AgentError> {
    let Cmd {
        argv,
        cwd,
        envs,
        timeout_ms,
        actor,
        stdin,
        pty,
    } = cmd;
    let Some((prog, args)) = argv.split_first() else {
        return Err(AgentError::Invalid("empty argv".into()));
    };
    let dir = if cwd.is_empty() {
        PathBuf::from(WORKSPACE)
    } else {
        let p = WorkspacePath::parse(&cwd).map_err(|e| AgentError::InvalidPath(e.to_string()))?;
        Path::new(WORKSPACE).join(p.as_str())
    };
    // Said now, as the keeper would only say it as the command's exit.
    if !on_path(prog, &dir) {
        return Err(AgentError::NotFound);
    }
    // The keeper tells the command's end on a pipe (its own exit waits for what the command
    // detached).
    let (status_rd, status_wr) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(failed)?;
    let mut cmd = tokio::process::Command::new(keeper()?);
    cmd.args(keeper_args(prog, Some(STATUS_FD)))
        .args(args)
        .current_dir(&dir)
        .env_clear()
        .envs(envs)
        .envs(room_env());
    // Its terminal's master end, when it runs on one.
    let master = match pty {
        Some((cols, rows)) => {
            let (master, slave) = open_terminal(cols, rows)?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map(std::process::Stdio::from)
                    .map_err(failed)
            };
            cmd.stdin(dup(&slave)?)
                .stdout(dup(&slave)?)
                .stderr(std::process::Stdio::from(slave));
            cmd.env("TERM", "xterm-256color");
            Some(master)
        }
        None => {
            let stdin = if stdin {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            };
            cmd.stdin(stdin)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            None
        }
    };
    {
        use std::os::fd::AsRawFd as _;
        let wr = status_wr.as_raw_fd();
        // SAFETY: dup2 only, as the child of a fork may: the write end becomes descriptor 3,
        // open across the exec (dup2 clears close-on-exec on the copy).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(wr, STATUS_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(failed)?;
    // Our copies of the terminal's slave end go: its output ends when the command's do.
    drop(cmd);
    drop(status_wr);
    // A unit of its own: its processes' connections out count to `actor` for as long as any
    // of them runs.
    let unit = child.id().map(|pid| Unit::command(pid as i32, actor));
    let (stdout, terminal) = match &master {
        Some(m) => {
            let reader = m.try_clone().map_err(failed)?;
            (
                None,
                Some(tokio::fs::File::from_std(std::fs::File::from(reader))),
            )
        }
        None => (child.stdout.take(), None),
    };
    let stderr = child.stderr.take();
    let (out_task, err_task) = match &output {
        Output::Kept(max) => (
            tokio::spawn(capture(stdout, *max, None)),
            tokio::spawn(capture(stderr, *max, None)),
        ),
        Output::Streamed { out, id } => (
            match terminal {
                Some(t) => tokio::spawn(capture(
                    Some(t),
                    0,
                    Some((out.clone(), *id, proto::RUN_PTY)),
                )),
                None => tokio::spawn(capture(
                    stdout,
                    0,
                    Some((out.clone(), *id, proto::RUN_STDOUT)),
                )),
            },
            tokio::spawn(capture(
                stderr,
                0,
                Some((out.clone(), *id, proto::RUN_STDERR)),
            )),
        ),
    };
    let feeding = input.map(|input| tokio::spawn(feed(input, child.stdin.take(), master)));
    // Until it exits, its time runs out, or the control plane ends it ([`Op::Cancel`]; a
    // dropped switch, the request forgotten, is no cancel).
    let cancel = async {
        if cancelled.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let (status, timed_out, was_cancelled) = tokio::select! {
        waited = tokio::time::timeout(Duration::from_millis(timeout_ms), ended(status_rd)) => match waited {
            Ok(s) => (s, false, false),
            Err(_) => (None, true, false),
        },
        () = cancel => (None, false, true),
    };
    let keeper_pid = unit.as_ref().map(Unit::keeper);
    if timed_out || was_cancelled {
        // Stopped before its end: the whole unit goes, detached or not; its keeper then ends.
        if let Some(keeper) = keeper_pid {
            let _ = tokio::task::spawn_blocking(move || super::units::end_below(keeper)).await;
        }
        let _ = child.wait().await;
        drop(unit);
    } else {
        // What it detached runs on, still its caller's, until it ends or is stopped: the
        // unit is forgotten when its keeper exits.
        tokio::spawn(async move {
            let _ = child.wait().await;
            drop(unit);
        });
    }
    if let Some(feeding) = feeding {
        feeding.abort();
    }
    if was_cancelled {
        return Err(AgentError::Cancelled);
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
        exit_code: status
            .filter(|s| libc::WIFEXITED(*s))
            .map(|s| libc::WEXITSTATUS(s)),
        stdout: stdout.into(),
        stderr: stderr.into(),
        truncated: t1 || t2,
        timed_out,
    })
}

/// A terminal's size, within bounds.
fn winsize(cols: u16, rows: u16) -> libc::winsize {
    let sized = size(cols, rows);
    libc::winsize {
        ws_row: sized.rows,
        ws_col: sized.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A terminal of `cols` x `rows` for a command: its master and slave ends.
fn open_terminal(cols: u16, rows: u16) -> Result<(OwnedFd, OwnedFd), AgentError> {
    use std::os::fd::FromRawFd as _;
    let winsize = winsize(cols, rows);
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two descriptors it opened into the locals; `winsize` is read only.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &winsize,
        )
    };
    if r != 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just opened by openpty and are owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
    }
    no_xoff(master.as_raw_fd());
    Ok((master, slave))
}

/// Hands [`Op::RunInput`](crate::proto::Op::RunInput) to a command: its standard input, or
/// its terminal (typed into it, resized).
async fn feed(
    mut input: tokio::sync::mpsc::Receiver<proto::RunInput>,
    mut stdin: Option<tokio::process::ChildStdin>,
    master: Option<OwnedFd>,
) {
    use tokio::io::AsyncWriteExt as _;
    let mut terminal = match &master {
        Some(m) => m
            .try_clone()
            .ok()
            .map(|fd| tokio::fs::File::from_std(std::fs::File::from(fd))),
        None => None,
    };
    while let Some(what) = input.recv().await {
        match what {
            proto::RunInput::Data(data) => {
                let wrote = match (&mut terminal, &mut stdin) {
                    (Some(t), _) => t.write_all(&data).await.and(t.flush().await),
                    (None, Some(s)) => s.write_all(&data).await,
                    (None, None) => Ok(()),
                };
                if wrote.is_err() {
                    // It stopped reading (it ended, or closed its input): no more to give.
                    stdin = None;
                    terminal = None;
                }
            }
            proto::RunInput::Close => stdin = None,
            proto::RunInput::Resize(cols, rows) => {
                if let Some(m) = &master {
                    let winsize = winsize(cols, rows);
                    // SAFETY: TIOCSWINSZ on a terminal master this task holds, reading a local.
                    unsafe { libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &winsize) };
                }
            }
        }
    }
}

/// Where a command's keeper writes its wait status.
const STATUS_FD: i32 = 3;

/// The command's wait status, as its keeper writes it once the command ends (`None`: the
/// keeper ended without saying, so the command was killed with it).
async fn ended(status: std::os::fd::OwnedFd) -> Option<i32> {
    use tokio::io::AsyncReadExt as _;
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(status).ok()?;
    let mut bytes = [0u8; 4];
    pipe.read_exact(&mut bytes).await.ok()?;
    Some(i32::from_ne_bytes(bytes))
}

/// The unit keeper: this binary, as it was started.
fn keeper() -> Result<PathBuf, AgentError> {
    SELF_COMMAND
        .get()
        .map(|(exe, _)| exe.clone())
        .ok_or_else(|| AgentError::Failed("cannot start room code".into()))
}

/// The keeper's arguments up to `prog` (room code's user: its own when the agent is not root).
fn keeper_args(prog: &str, status_fd: Option<i32>) -> Vec<String> {
    let uid = room_uid().unwrap_or_else(|| rustix::process::getuid().as_raw());
    let mut args = SELF_COMMAND
        .get()
        .map(|(_, a)| a.clone())
        .unwrap_or_default();
    args.extend(["--exec-as".into(), uid.to_string()]);
    if let Some(fd) = status_fd {
        args.extend(["--status-fd".into(), fd.to_string()]);
    }
    args.extend(["--".into(), prog.into()]);
    args
}

/// Whether `prog` names a program: a path (from `dir` when relative), or a name found on
/// room code's `PATH`.
fn on_path(prog: &str, dir: &Path) -> bool {
    if prog.contains('/') {
        return dir.join(prog).is_file();
    }
    let path = room_env()
        .into_iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v)
        .unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(prog).is_file())
}

/// Reads `pipe` to its end: keeps up to `max` bytes, or sends each read on as a chunk of
/// `forward`'s request, its first byte the stream's number.
async fn capture(
    pipe: Option<impl tokio::io::AsyncRead + Unpin>,
    max: usize,
    forward: Option<(super::Out, u64, u8)>,
) -> (Vec<u8>, bool) {
    let Some(mut pipe) = pipe else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) if forward.is_some() => {
                if let Some((out, id, fd)) = &forward {
                    let mut data = Vec::with_capacity(n + 1);
                    data.push(*fd);
                    data.extend_from_slice(&buf[..n]);
                    let chunk = Message::Chunk {
                        id: *id,
                        data: ByteBuf::from(data),
                    };
                    super::send(out, &chunk).await;
                }
            }
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

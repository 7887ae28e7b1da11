//! The QEMU driver: a q35 machine with no network device and no default devices, the guest
//! image as kernel and initramfs, the workspace disk on virtio-blk, the agent's channel on a
//! virtio-serial port, QMP on a second socket. Everything QEMU touches is handed to it as an
//! open descriptor, so the unprivileged user it runs as needs no path on the host.

use super::{Accel, Instance, SaveError, SetupError, SAVE_WITHIN};
use serde_json::{json, Value};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The translation cache under TCG, in MiB (QEMU's default is 1 GiB, which would count
/// against the VMM's memory limit).
const TCG_TB_MIB: u64 = 64;
/// Longest QMP line accepted.
const MAX_QMP_LINE: usize = 64 << 10;

/// The version `qemu-system-x86_64 --version` prints (`7.2.22`), or why it cannot be run.
pub(super) fn version(bin: &Path) -> Result<String, SetupError> {
    super::probe::version_after(bin, "QEMU emulator version ")
}

/// The descriptors QEMU gets, open in the server until the child has them.
pub(super) struct Fds {
    pub(super) kernel: OwnedFd,
    pub(super) initramfs: OwnedFd,
    pub(super) disk: OwnedFd,
    /// The disk again, read-only: QEMU's block layer asks for both modes from the fd set.
    pub(super) disk_ro: OwnedFd,
    /// The image's read-only userland disk, when it has one.
    pub(super) userland: Option<OwnedFd>,
    pub(super) agent: OwnedFd,
    pub(super) qmp: OwnedFd,
    /// A saved machine to load instead of booting (`-incoming`).
    pub(super) incoming: Option<OwnedFd>,
}

impl Fds {
    pub(super) fn raw(&self) -> Vec<i32> {
        [
            &self.kernel,
            &self.initramfs,
            &self.disk,
            &self.disk_ro,
            &self.agent,
            &self.qmp,
        ]
        .into_iter()
        .chain(self.userland.as_ref())
        .chain(self.incoming.as_ref())
        .map(|f| f.as_raw_fd())
        .collect()
    }
}

/// The command line for `vm` (the child inherits `fds` under the same numbers).
pub(super) fn args(vm: &Instance, accel: Accel, fds: &Fds) -> Vec<String> {
    let mem_mib = (vm.limits.memory_bytes >> 20).max(128);
    let cpus = vm.vcpus();
    let (accel_arg, cpu) = match accel {
        Accel::Tcg => (format!("tcg,tb-size={TCG_TB_MIB}"), "max"),
        Accel::Kvm => ("kvm".to_owned(), "host"),
    };
    let append = format!(
        "console=ttyS0 quiet panic=-1 coderoom.channel=port:{} coderoom.pids={}",
        super::image::AGENT_PORT_NAME,
        vm.limits.pids
    );
    let mut a: Vec<String> = vec![
        "-name".into(),
        format!("coderoom-{},process=coderoom-vm", vm.name),
        "-M".into(),
        "q35".into(),
        "-accel".into(),
        accel_arg,
        "-cpu".into(),
        cpu.into(),
        "-m".into(),
        format!("{mem_mib}M"),
        "-smp".into(),
        cpus.to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-no-reboot".into(),
        "-display".into(),
        "none".into(),
        "-nic".into(),
        "none".into(),
        // The VMM process may not run programs, raise privileges or use obsolete calls.
        "-sandbox".into(),
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
        "-kernel".into(),
        format!("/proc/self/fd/{}", fds.kernel.as_raw_fd()),
        "-initrd".into(),
        format!("/proc/self/fd/{}", fds.initramfs.as_raw_fd()),
        "-append".into(),
        append,
        // The guest's console is QEMU's standard output, which the server reads.
        "-serial".into(),
        "stdio".into(),
        "-add-fd".into(),
        format!("fd={},set=1", fds.disk.as_raw_fd()),
        "-add-fd".into(),
        format!("fd={},set=1", fds.disk_ro.as_raw_fd()),
        "-drive".into(),
        // A failed write is the guest's to see (werror=report), never a silently paused VM.
        "file=/dev/fdset/1,if=none,id=workspace,format=raw,discard=unmap,werror=report,rerror=report".into(),
        "-device".into(),
        "virtio-blk-pci,drive=workspace".into(),
    ];
    if let Some(u) = &fds.userland {
        a.extend([
            "-add-fd".into(),
            format!("fd={},set=2", u.as_raw_fd()),
            "-drive".into(),
            // Every VM reads the same image file, which nothing writes (it is the image's,
            // content-addressed): QEMU's image locks would only have VMs refuse each other.
            "file=/dev/fdset/2,if=none,id=userland,format=raw,readonly=on,file.locking=off".into(),
            "-device".into(),
            "virtio-blk-pci,drive=userland".into(),
        ]);
    }
    a.extend([
        "-device".into(),
        "virtio-serial-pci".into(),
        "-chardev".into(),
        format!("socket,id=agent,fd={}", fds.agent.as_raw_fd()),
        "-device".into(),
        format!(
            "virtserialport,chardev=agent,name={}",
            super::image::AGENT_PORT_NAME
        ),
        "-chardev".into(),
        format!("socket,id=qmp,fd={}", fds.qmp.as_raw_fd()),
        "-mon".into(),
        "chardev=qmp,mode=control".into(),
    ]);
    if let Some(m) = &fds.incoming {
        a.extend(["-incoming".into(), format!("fd:{}", m.as_raw_fd())]);
    }
    a
}

/// A QMP session (QEMU's machine protocol: one JSON object per line).
pub(super) struct Qmp {
    rd: BufReader<tokio::net::unix::OwnedReadHalf>,
    wr: tokio::net::unix::OwnedWriteHalf,
    /// The version QEMU greeted with (`7.2.22`).
    pub(super) version: String,
}

/// Why a QMP exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket failed.
    #[error("the QMP stream failed")]
    Io(#[from] std::io::Error),
    /// QEMU's answer did not parse or had the wrong shape.
    #[error("QMP answered out of protocol: {0}")]
    Protocol(String),
    /// QEMU refused the command.
    #[error("QMP refused {command}: {desc}")]
    Refused {
        /// The command.
        command: String,
        /// QEMU's description of the error.
        desc: String,
    },
}

impl Qmp {
    /// Reads the greeting and leaves capabilities negotiation.
    pub(super) async fn connect(stream: tokio::net::UnixStream) -> Result<Qmp, QmpError> {
        let (rd, wr) = stream.into_split();
        let mut q = Qmp {
            rd: BufReader::new(rd),
            wr,
            version: String::new(),
        };
        let greeting = q.line().await?;
        let v = &greeting["QMP"]["version"]["qemu"];
        if v.is_null() {
            return Err(QmpError::Protocol(format!("no greeting: {greeting}")));
        }
        q.version = format!("{}.{}.{}", v["major"], v["minor"], v["micro"]);
        q.execute("qmp_capabilities", Value::Null).await?;
        Ok(q)
    }

    async fn line(&mut self) -> Result<Value, QmpError> {
        let mut buf = Vec::new();
        let n = (&mut self.rd)
            .take(MAX_QMP_LINE as u64)
            .read_until(b'\n', &mut buf)
            .await?;
        if n == 0 {
            return Err(QmpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        serde_json::from_slice(&buf).map_err(|e| QmpError::Protocol(e.to_string()))
    }

    /// Runs `command` and returns its `return` value (events in between are skipped).
    pub(super) async fn execute(&mut self, command: &str, args: Value) -> Result<Value, QmpError> {
        let line = command_line(command, args)?;
        self.wr.write_all(&line).await?;
        self.answer(command).await
    }

    /// Runs `command` with `fd` passed beside it (`getfd`): QEMU takes a descriptor with the
    /// bytes it arrives with, so the whole command goes in one message.
    async fn execute_with_fd(
        &mut self,
        command: &str,
        args: Value,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Value, QmpError> {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let line = command_line(command, args)?;
        let stream: &tokio::net::UnixStream = self.wr.as_ref();
        let sent = loop {
            stream.writable().await?;
            let once = stream.try_io(tokio::io::Interest::WRITABLE, || {
                let mut space =
                    [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut ancillary = SendAncillaryBuffer::new(&mut space);
                let fds = [fd];
                ancillary.push(SendAncillaryMessage::ScmRights(&fds));
                rustix::net::sendmsg(
                    stream,
                    &[std::io::IoSlice::new(&line)],
                    &mut ancillary,
                    SendFlags::NOSIGNAL,
                )
                .map_err(std::io::Error::from)
            });
            match once {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            }
        };
        self.wr.write_all(&line[sent..]).await?;
        self.answer(command).await
    }

    /// The answer to `command`, just sent.
    async fn answer(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            let v = self.line().await?;
            if v.get("event").is_some() {
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(QmpError::Refused {
                    command: command.to_owned(),
                    desc: e["desc"].as_str().unwrap_or("no description").to_owned(),
                });
            }
            return Err(QmpError::Protocol(v.to_string()));
        }
    }

    /// The machine's run state (`running`, `paused`, `shutdown`, ...).
    pub(super) async fn status(&mut self, within: Duration) -> Result<String, QmpError> {
        let r = bounded(within, self.execute("query-status", Value::Null)).await?;
        Ok(r["status"].as_str().unwrap_or("unknown").to_owned())
    }

    /// Saves the paused guest's memory and devices into `file` (a migration to a file): the
    /// guest is stopped first, so the image is one pass over its RAM and, with the disk that
    /// QEMU flushes as the migration completes, a consistent whole. Returns the bytes written.
    pub(super) async fn save(
        &mut self,
        file: &std::fs::File,
        within: Duration,
    ) -> Result<u64, QmpError> {
        use std::os::fd::AsFd as _;
        let work = async {
            self.execute("stop", Value::Null).await?;
            self.execute_with_fd("getfd", json!({ "fdname": "memory" }), file.as_fd())
                .await?;
            self.execute("migrate", json!({ "uri": "fd:memory" }))
                .await?;
            loop {
                let r = self.execute("query-migrate", Value::Null).await?;
                match r["status"].as_str() {
                    Some("completed") => return Ok(r["ram"]["transferred"].as_u64().unwrap_or(0)),
                    Some("failed" | "cancelled") => {
                        return Err(QmpError::Refused {
                            command: "migrate".into(),
                            desc: r["error-desc"].as_str().unwrap_or("failed").to_owned(),
                        })
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        };
        bounded(within, work).await
    }

    /// Waits for an incoming migration (`-incoming`) to finish loading, then lets the guest
    /// run (it was saved paused, and stays paused until told).
    pub(super) async fn resume_incoming(&mut self, within: Duration) -> Result<(), QmpError> {
        let work = async {
            loop {
                let state = self.status(within).await?;
                match state.as_str() {
                    "inmigrate" => tokio::time::sleep(Duration::from_millis(10)).await,
                    "paused" | "prelaunch" => {
                        self.execute("cont", Value::Null).await?;
                        return Ok(());
                    }
                    "running" => return Ok(()),
                    other => {
                        return Err(QmpError::Protocol(format!(
                            "the saved machine did not load (state {other})"
                        )))
                    }
                }
            }
        };
        bounded(within, work).await
    }

    /// Asks QEMU to exit now (the guest's disk is written through; nothing else is kept).
    pub(super) async fn quit(&mut self, within: Duration) -> Result<(), QmpError> {
        bounded(within, self.execute("quit", Value::Null))
            .await
            .map(|_| ())
    }
}

/// `work`'s outcome, or a timeout after `within`.
async fn bounded<T>(
    within: Duration,
    work: impl std::future::Future<Output = Result<T, QmpError>>,
) -> Result<T, QmpError> {
    tokio::time::timeout(within, work)
        .await
        .map_err(|_| QmpError::Io(std::io::ErrorKind::TimedOut.into()))?
}

/// One QMP command as the line sent.
fn command_line(command: &str, args: Value) -> Result<Vec<u8>, QmpError> {
    let mut msg = json!({ "execute": command });
    if !args.is_null() {
        msg["arguments"] = args;
    }
    let mut line = serde_json::to_vec(&msg).map_err(|e| QmpError::Protocol(e.to_string()))?;
    line.push(b'\n');
    Ok(line)
}

use tokio::io::AsyncReadExt as _;

/// Saves a paused guest's memory to `path` (made here, 0600, synced to the host's disk).
pub(super) async fn save_memory(q: &mut Qmp, path: &Path) -> Result<u64, SaveError> {
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| SaveError::Create(path.to_path_buf(), source))?
    };
    let bytes = q.save(&file, SAVE_WITHIN).await?;
    tokio::task::spawn_blocking(move || file.sync_all())
        .await
        .map_err(SaveError::Task)?
        .map_err(|source| SaveError::Sync {
            what: "the memory image",
            source,
        })?;
    Ok(bytes)
}

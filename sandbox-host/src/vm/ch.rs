//! The cloud-hypervisor driver: its REST API over a unix socket (request bodies typed after
//! the OpenAPI schemas in `cloud-hypervisor-openapi.yaml`), the guest's console on the VMM's
//! standard output, the agent's channel over hybrid vsock (the host connects to a unix socket
//! and says `CONNECT <port>`; the guest's agent listens on that vsock port).
//!
//! cloud-hypervisor may exit 0 after a vCPU error ("Cloud Hypervisor exited successfully"):
//! whether a guest runs is read from `vm.info` and the agent's answer, never from the exit code.

use super::{Booted, Instance, SaveError, SetupError};
use crate::process::ChildHooks;
use crate::StartError;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The API version this driver speaks (the path prefix).
const API: &str = "/api/v1";
/// Longest API answer read.
const MAX_ANSWER: usize = 1 << 20;
/// Time for one API call.
const CALL_WITHIN: Duration = Duration::from_secs(10);
/// The guest's vsock context id (any value from 3; each VM has its own device).
const GUEST_CID: u64 = 3;

/// `GET /vmm.ping`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct VmmPingResponse {
    /// The VMM's version (`v54.0.0` or similar).
    pub version: String,
    /// Its build.
    #[serde(default)]
    pub build_version: Option<String>,
    /// Its process id.
    #[serde(default)]
    pub pid: Option<i64>,
    /// Compiled-in features.
    #[serde(default)]
    pub features: Vec<String>,
}

/// `CpusConfig`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpusConfig {
    /// vCPUs at boot.
    pub boot_vcpus: u32,
    /// vCPUs at most.
    pub max_vcpus: u32,
}

/// `MemoryConfig`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Guest RAM in bytes.
    pub size: u64,
}

/// `PayloadConfig`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PayloadConfig {
    /// The kernel (bzImage or vmlinux).
    pub kernel: String,
    /// The initramfs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initramfs: Option<String>,
    /// The kernel's command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
}

/// `DiskConfig`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskConfig {
    /// The image file.
    pub path: String,
    /// Read only.
    #[serde(default)]
    pub readonly: bool,
}

/// `VsockConfig`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VsockConfig {
    /// The guest's context id.
    pub cid: u64,
    /// The host's unix socket that proxies connections.
    pub socket: String,
}

/// `ConsoleConfig` (also used for `serial`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// `Off`, `Pty`, `Tty`, `File`, `Socket` or `Null`.
    pub mode: String,
    /// The file, for `File`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// `VmConfig`: what this driver sets (no network device: `net` stays absent).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmConfig {
    /// CPUs.
    pub cpus: CpusConfig,
    /// RAM.
    pub memory: MemoryConfig,
    /// Kernel, initramfs and command line.
    pub payload: PayloadConfig,
    /// Disks.
    #[serde(default)]
    pub disks: Vec<DiskConfig>,
    /// The agent's channel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockConfig>,
    /// The serial port (the guest's console).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<ConsoleConfig>,
    /// The virtio console.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console: Option<ConsoleConfig>,
}

/// `VmSnapshotConfig`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmSnapshotConfig {
    /// Where the snapshot goes: `file://` and an existing directory.
    pub destination_url: String,
}

/// `RestoreConfig` (the parts set).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RestoreConfig {
    /// The snapshot's directory, as `file://` URL.
    pub source_url: String,
    /// Fault the whole memory in before running (off: pages load as touched).
    #[serde(default)]
    pub prefault: bool,
    /// Run the restored guest at once.
    #[serde(default)]
    pub resume: bool,
}

/// `GET /vm.info` (the parts read).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct VmInfo {
    /// `Created`, `Running`, `Shutdown`, `Paused` or `BreakPoint`.
    pub state: String,
    /// The configuration as the VMM holds it.
    pub config: serde_json::Value,
}

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The socket could not be reached.
    #[error("cannot reach cloud-hypervisor's API socket")]
    Connect(#[source] std::io::Error),
    /// HTTP failed.
    #[error("cloud-hypervisor's API: {0}")]
    Http(String),
    /// The VMM refused the request.
    #[error("cloud-hypervisor refused {path}: HTTP {status}: {body}")]
    Refused {
        /// The endpoint.
        path: String,
        /// The status.
        status: u16,
        /// What it said.
        body: String,
    },
    /// The answer did not parse.
    #[error("cloud-hypervisor answered {path} out of schema: {detail}")]
    Schema {
        /// The endpoint.
        path: String,
        /// The parse error.
        detail: String,
    },
    /// No answer in time.
    #[error("cloud-hypervisor's API did not answer in time")]
    Timeout,
    /// The configuration saved with a machine cannot be given to this VMM.
    #[error("the saved machine cannot be restored")]
    Saved(#[from] SavedError),
}

/// Why the configuration saved with a machine is not pointed at a new VMM (see [`repoint`]).
#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    /// The file could not be read.
    #[error("cannot read {}", .0.display())]
    Read(PathBuf, #[source] std::io::Error),
    /// The file is larger than any configuration this driver saves.
    #[error("{} is too large", .path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not JSON.
    #[error("{} does not parse", .0.display())]
    Parse(PathBuf, #[source] serde_json::Error),
    /// It configures a device this driver never configures (one that names host files).
    #[error("the saved machine has {0}, which this driver never configures")]
    Device(&'static str),
    /// Its serial port or console names a host file or socket.
    #[error("the saved machine's {0} names a host file")]
    HostFile(&'static str),
    /// Its entropy source is not the one this driver gives.
    #[error("the saved machine's entropy source is not /dev/urandom")]
    Entropy,
    /// Its RAM or vCPUs differ from the new VM's.
    #[error("the saved machine's memory or vCPUs are not this VM's")]
    Shape,
    /// A part the new VM needs is missing (`payload`, `disks`, `vsock device`).
    #[error("the saved machine has no {0}")]
    Missing(&'static str),
    /// It has another number of disks than the new VM.
    #[error("the saved machine has {saved} disks, this VM {now}")]
    DiskCount {
        /// The saved machine's disks.
        saved: usize,
        /// The new VM's.
        now: usize,
    },
    /// A disk is not a JSON object.
    #[error("a saved disk is not an object")]
    DiskShape,
    /// Its disks are not the new VM's (one read-only where the other is not).
    #[error("the saved machine's disks are not this VM's")]
    Disks,
    /// The new configuration could not be encoded.
    #[error("cannot encode the new configuration")]
    Encode(#[source] serde_json::Error),
    /// The new configuration could not be written.
    #[error("cannot write {}", .0.display())]
    Write(PathBuf, #[source] std::io::Error),
    /// The snapshot directory's owner, who must read the new file, could not be read.
    #[error("cannot read the owner of {}", .0.display())]
    Owner(PathBuf, #[source] std::io::Error),
    /// The new file could not be given to the directory's owner.
    #[error("cannot give {} to the VMM", .0.display())]
    GiveToVmm(PathBuf, #[source] std::io::Error),
}

/// Why the guest's agent was not reached over hybrid vsock.
#[derive(Debug, thiserror::Error)]
enum VsockError {
    /// The VMM ended first.
    #[error("cloud-hypervisor exited ({0}) before the agent answered")]
    Exited(std::process::ExitStatus),
    /// The boot deadline passed; `last` is the last attempt's failure.
    #[error("the agent did not answer within {secs} s")]
    Deadline {
        /// The deadline, in seconds.
        secs: u64,
        /// Why the last attempt failed.
        #[source]
        last: Box<VsockError>,
    },
    /// No attempt was made before the deadline.
    #[error("the guest never listened")]
    NeverListened,
    /// The VMM's vsock socket could not be reached.
    #[error("cannot connect to the VMM's vsock socket")]
    Connect(#[source] std::io::Error),
    /// `CONNECT` could not be sent, or its answer read.
    #[error("the vsock socket failed")]
    Io(#[source] std::io::Error),
    /// `CONNECT` got no answer before the deadline.
    #[error("no answer to CONNECT")]
    NoAnswer,
    /// The VMM closed the connection: nothing listens on the port yet.
    #[error("the VMM closed the connection (nothing listens yet)")]
    Closed,
    /// The answer was longer than any `OK <port>`.
    #[error("an overlong answer to CONNECT")]
    Overlong,
    /// The VMM answered something other than `OK`.
    #[error("CONNECT answered {0}")]
    Refused(String),
}

/// A client of one VMM's API socket.
#[derive(Debug, Clone)]
pub struct Api {
    socket: PathBuf,
}

impl Api {
    /// A client of the API at `socket`.
    pub fn new(socket: &Path) -> Api {
        Api {
            socket: socket.to_path_buf(),
        }
    }

    async fn call(
        &self,
        method: hyper::Method,
        endpoint: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ApiError> {
        self.call_within(CALL_WITHIN, method, endpoint, body).await
    }

    async fn call_within(
        &self,
        within: Duration,
        method: hyper::Method,
        endpoint: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ApiError> {
        tokio::time::timeout(within, self.call_now(method, endpoint, body))
            .await
            .map_err(|_| ApiError::Timeout)?
    }

    async fn call_now(
        &self,
        method: hyper::Method,
        endpoint: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ApiError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(ApiError::Connect)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| ApiError::Http(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{API}/{endpoint}"))
            .header(hyper::header::HOST, "localhost");
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ApiError::Http(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ApiError::Http(e.to_string()))?;
        let status = resp.status().as_u16();
        let limited = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER);
        let bytes = limited
            .collect()
            .await
            .map_err(|e| ApiError::Http(e.to_string()))?
            .to_bytes();
        if !(200..300).contains(&status) {
            return Err(ApiError::Refused {
                path: endpoint.to_owned(),
                status,
                body: refusal(&bytes),
            });
        }
        Ok((status, bytes))
    }

    async fn put(&self, endpoint: &str, body: Option<Vec<u8>>) -> Result<(), ApiError> {
        self.call(hyper::Method::PUT, endpoint, body)
            .await
            .map(|_| ())
    }

    fn parse<T: for<'de> Deserialize<'de>>(endpoint: &str, bytes: &[u8]) -> Result<T, ApiError> {
        serde_json::from_slice(bytes).map_err(|e| ApiError::Schema {
            path: endpoint.to_owned(),
            detail: e.to_string(),
        })
    }

    /// `GET vmm.ping`.
    pub async fn ping(&self) -> Result<VmmPingResponse, ApiError> {
        let (_, b) = self.call(hyper::Method::GET, "vmm.ping", None).await?;
        Self::parse("vmm.ping", &b)
    }

    /// `PUT vm.create`.
    pub async fn create(&self, config: &VmConfig) -> Result<(), ApiError> {
        let body = serde_json::to_vec(config).map_err(|e| ApiError::Http(e.to_string()))?;
        self.put("vm.create", Some(body)).await
    }

    /// `PUT vm.boot`.
    pub async fn boot(&self) -> Result<(), ApiError> {
        self.put("vm.boot", None).await
    }

    /// `GET vm.info`.
    pub async fn info(&self) -> Result<VmInfo, ApiError> {
        let (_, b) = self.call(hyper::Method::GET, "vm.info", None).await?;
        Self::parse("vm.info", &b)
    }

    /// `PUT vm.shutdown`.
    pub async fn shutdown(&self) -> Result<(), ApiError> {
        self.put("vm.shutdown", None).await
    }

    /// `PUT vm.delete`.
    pub async fn delete(&self) -> Result<(), ApiError> {
        self.put("vm.delete", None).await
    }

    /// `PUT vm.pause`.
    pub async fn pause(&self) -> Result<(), ApiError> {
        self.put("vm.pause", None).await
    }

    /// `PUT vm.resume`.
    pub async fn resume(&self) -> Result<(), ApiError> {
        self.put("vm.resume", None).await
    }

    /// `PUT vm.snapshot` of the paused VM into the existing directory `dir`, within `within`
    /// (it writes the whole guest memory).
    pub async fn snapshot(&self, dir: &Path, within: Duration) -> Result<(), ApiError> {
        let body = VmSnapshotConfig {
            destination_url: file_url(dir),
        };
        let body = serde_json::to_vec(&body).map_err(|e| ApiError::Http(e.to_string()))?;
        self.call_within(within, hyper::Method::PUT, "vm.snapshot", Some(body))
            .await
            .map(|_| ())
    }

    /// `PUT vm.restore` from the snapshot in `dir`, run at once when `resume`, within `within`.
    pub async fn restore(
        &self,
        dir: &Path,
        resume: bool,
        within: Duration,
    ) -> Result<(), ApiError> {
        let body = RestoreConfig {
            source_url: file_url(dir),
            prefault: false,
            resume,
        };
        let body = serde_json::to_vec(&body).map_err(|e| ApiError::Http(e.to_string()))?;
        self.call_within(within, hyper::Method::PUT, "vm.restore", Some(body))
            .await
            .map(|_| ())
    }

    /// `PUT vmm.shutdown` within `within`.
    pub async fn shutdown_vmm(&self, within: Duration) -> Result<(), ApiError> {
        tokio::time::timeout(within, self.put("vmm.shutdown", None))
            .await
            .map_err(|_| ApiError::Timeout)?
    }
}

/// Longest refusal text kept.
const MAX_REFUSAL: usize = 600;

/// What a refusal says, in one line: cloud-hypervisor answers a JSON array of its error chain,
/// the innermost with a stack backtrace; the chain is kept, joined, without the backtrace.
fn refusal(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<Vec<String>>(body) {
        Ok(chain) => chain
            .iter()
            .map(|e| e.split("\n\n").next().unwrap_or_default().trim())
            .filter(|e| !e.is_empty())
            .collect::<Vec<_>>()
            .join(": "),
        Err(_) => String::from_utf8_lossy(body).trim().to_owned(),
    };
    let mut text: String = text.chars().filter(|c| !c.is_control()).collect();
    if text.len() > MAX_REFUSAL {
        let mut cut = MAX_REFUSAL;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// The version `cloud-hypervisor --version` prints (`v54.0.0`), or why it cannot be run.
pub fn version(bin: &Path) -> Result<String, SetupError> {
    super::probe::version_after(bin, "cloud-hypervisor ")
}

/// The configuration of `vm`: guest image, workspace disk, vsock, console on standard output.
pub fn vm_config(
    kernel: &str,
    initramfs: &str,
    disk: &str,
    vsock: &str,
    memory_bytes: u64,
    cpus: u32,
    pids: u64,
) -> VmConfig {
    VmConfig {
        cpus: CpusConfig {
            boot_vcpus: cpus,
            max_vcpus: cpus,
        },
        memory: MemoryConfig {
            size: memory_bytes.max(128 << 20),
        },
        payload: PayloadConfig {
            kernel: kernel.to_owned(),
            initramfs: Some(initramfs.to_owned()),
            cmdline: Some(format!(
                "console=ttyS0 quiet panic=-1 coderoom.channel=vsock:{} coderoom.pids={pids}",
                super::image::AGENT_VSOCK_PORT
            )),
        },
        disks: vec![DiskConfig {
            path: disk.to_owned(),
            readonly: false,
        }],
        vsock: Some(VsockConfig {
            cid: GUEST_CID,
            socket: vsock.to_owned(),
        }),
        serial: Some(ConsoleConfig {
            mode: "Tty".into(),
            file: None,
        }),
        console: Some(ConsoleConfig {
            mode: "Off".into(),
            file: None,
        }),
    }
}

/// Starts cloud-hypervisor for `vm`, creates and boots the guest through the API, and connects
/// to the agent's vsock port (retrying while the guest boots).
pub(super) async fn spawn(
    bin: &Path,
    image: &super::GuestImage,
    vm: &Instance,
    hooks: impl Fn(Vec<i32>) -> ChildHooks,
) -> Result<Booted, StartError> {
    // The sockets live where the VMM's uid can create them: a fresh directory of its own
    // (0700, short enough for a socket's path) under the system's temporary directory.
    let run = private_dir(vm.uid)?;
    let api_path = run.join("api.sock");
    let vsock_path = run.join("vsock.sock");
    let listener = std::os::unix::net::UnixListener::bind(&api_path).map_err(StartError::Host)?;
    let open = |p: &Path| -> Result<OwnedFd, StartError> {
        Ok(std::fs::File::open(p).map_err(StartError::Host)?.into())
    };
    let kernel = open(&image.kernel())?;
    let initramfs = open(&image.initramfs())?;
    let userland = image.userland().as_deref().map(open).transpose()?;
    // The disk by descriptor too (the VMM reopens it through /proc/self/fd: it is the VMM's).
    let disk: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&vm.disk)
        .map_err(StartError::Host)?
        .into();
    let api_fd: OwnedFd = listener.into();
    let mut inherit = vec![
        kernel.as_raw_fd(),
        initramfs.as_raw_fd(),
        api_fd.as_raw_fd(),
    ];
    inherit.push(disk.as_raw_fd());
    inherit.extend(userland.as_ref().map(|u| u.as_raw_fd()));
    let hooks = hooks(inherit);
    let child = super::spawn_vmm(
        bin,
        &[
            "--api-socket".to_owned(),
            format!("fd={}", api_fd.as_raw_fd()),
        ],
        hooks,
    )?;
    // Only the VMM holds the listening socket now: if it dies, calls fail at once.
    drop(api_fd);
    let api = Api::new(&api_path);
    let mut child = child;
    let mut console = super::console::merge(child.stdout.take(), child.stderr.take());
    let booted = async {
        let ping = api.ping().await?;
        check_version(&ping.version)?;
        tracing::debug!(version = %ping.version, "cloud-hypervisor answered");
        let mut config = vm_config(
            &format!("/proc/self/fd/{}", kernel.as_raw_fd()),
            &format!("/proc/self/fd/{}", initramfs.as_raw_fd()),
            &format!("/proc/self/fd/{}", disk.as_raw_fd()),
            &vsock_path.to_string_lossy(),
            vm.limits.memory_bytes,
            vm.vcpus(),
            vm.limits.pids,
        );
        if let Some(u) = &userland {
            config.disks.push(DiskConfig {
                path: format!("/proc/self/fd/{}", u.as_raw_fd()),
                readonly: true,
            });
        }
        match &vm.memory {
            // A saved machine: pointed at this process's descriptors and sockets, restored,
            // and run on from where it was saved.
            Some(saved) => {
                let (saved, config) = (saved.clone(), config.clone());
                tokio::task::spawn_blocking(move || repoint(&saved, &config))
                    .await
                    .map_err(|e| ApiError::Http(e.to_string()))??;
                api.restore(saved_dir(vm)?, true, super::LOAD_WITHIN)
                    .await?;
            }
            None => {
                api.create(&config).await?;
                api.boot().await?;
            }
        }
        Ok::<_, ApiError>(())
    }
    .await;
    drop((kernel, initramfs, userland, disk));
    if let Err(e) = booted {
        let _ = child.kill().await;
        let _ = std::fs::remove_dir_all(&run);
        let log = log_errors(&mut console).await;
        let e = crate::Chain(&e);
        return Err(StartError::NotReady(if log.is_empty() {
            e.to_string()
        } else {
            format!("{e}; the VMM's log: {log}")
        }));
    }
    // The guest's agent listens once it has booted; until then the VMM refuses the CONNECT.
    let agent = connect_agent(&vsock_path, &mut child).await;
    match agent {
        Ok(stream) => Ok(Booted {
            child,
            agent: Box::new(stream),
            console,
            qmp: None,
            ch_api: Some(api),
            // The API socket stays for the stop (vmm.shutdown); the directory goes after.
            run_dir: Some(run),
        }),
        Err(why) => {
            let _ = child.kill().await;
            let _ = std::fs::remove_dir_all(&run);
            let log = log_errors(&mut console).await;
            let why = crate::Chain(&why);
            Err(StartError::NotReady(if log.is_empty() {
                why.to_string()
            } else {
                format!("{why}; the VMM's log: {log}")
            }))
        }
    }
}

/// The directory of `vm`'s saved machine.
fn saved_dir(vm: &Instance) -> Result<&Path, ApiError> {
    vm.memory
        .as_deref()
        .ok_or_else(|| ApiError::Http("no saved machine".into()))
}

/// `file://` and `dir` (cloud-hypervisor takes the rest of the URL as the path, undecoded).
fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// The file of a snapshot that holds the VM's configuration.
const SNAPSHOT_CONFIG: &str = "config.json";
/// Largest saved configuration read.
const MAX_SNAPSHOT_CONFIG: u64 = 1 << 20;

/// Parts of a saved configuration that name host files, sockets or devices: a VM of this
/// driver has none, and a saved machine that names any (its VMM's uid wrote the file) is
/// refused rather than given to a new VMM.
const NO_HOST_PATHS: [&str; 9] = [
    "net",
    "fs",
    "pmem",
    "devices",
    "user_devices",
    "vdpa",
    "tpm",
    "sgx_epc",
    "preserved_fds",
];

/// Refuses a saved configuration that reaches beyond what this driver configures: host
/// devices or sockets, console files, another RAM size or vCPU count than `now`'s.
fn check_saved(saved: &serde_json::Value, now: &VmConfig) -> Result<(), SavedError> {
    let empty = |v: &serde_json::Value| {
        v.is_null()
            || v.as_array().is_some_and(Vec::is_empty)
            || v.as_object().is_some_and(serde_json::Map::is_empty)
    };
    for key in NO_HOST_PATHS {
        if !empty(&saved[key]) {
            return Err(SavedError::Device(key));
        }
    }
    for key in ["serial", "console", "debug_console"] {
        if !saved[key]["file"].is_null() || !saved[key]["socket"].is_null() {
            return Err(SavedError::HostFile(key));
        }
    }
    if !saved["rng"]["src"].is_null() && saved["rng"]["src"] != "/dev/urandom" {
        return Err(SavedError::Entropy);
    }
    if saved["memory"]["size"] != now.memory.size
        || !empty(&saved["memory"]["zones"])
        || saved["cpus"]["boot_vcpus"] != now.cpus.boot_vcpus
    {
        return Err(SavedError::Shape);
    }
    Ok(())
}

/// Points the configuration saved with a machine (`dir/config.json`) at `now`'s kernel,
/// initramfs, disks and vsock socket: the saved one names the old process's descriptors and
/// its socket, which are gone. Everything else (memory, vCPUs, devices) stays as saved, and a
/// saved machine whose disks differ from `now`'s is refused.
pub fn repoint(dir: &Path, now: &VmConfig) -> Result<(), SavedError> {
    use std::io::Read as _;
    let path = dir.join(SNAPSHOT_CONFIG);
    // Written by the old VMM's uid: read only as a plain file, and only so much of it.
    let mut bytes = Vec::new();
    super::disk::open_plain(&path, false)
        .and_then(|f| f.take(MAX_SNAPSHOT_CONFIG + 1).read_to_end(&mut bytes))
        .map_err(|source| SavedError::Read(path.clone(), source))?;
    if bytes.len() as u64 > MAX_SNAPSHOT_CONFIG {
        return Err(SavedError::TooLarge { path });
    }
    let mut saved: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|source| SavedError::Parse(path.clone(), source))?;
    check_saved(&saved, now)?;
    let payload = saved
        .get_mut("payload")
        .and_then(|p| p.as_object_mut())
        .ok_or(SavedError::Missing("payload"))?;
    payload.insert("kernel".into(), now.payload.kernel.clone().into());
    if let Some(i) = &now.payload.initramfs {
        payload.insert("initramfs".into(), i.clone().into());
    }
    let disks = saved
        .get_mut("disks")
        .and_then(|d| d.as_array_mut())
        .ok_or(SavedError::Missing("disks"))?;
    if disks.len() != now.disks.len() {
        return Err(SavedError::DiskCount {
            saved: disks.len(),
            now: now.disks.len(),
        });
    }
    for (d, n) in disks.iter_mut().zip(&now.disks) {
        let d = d.as_object_mut().ok_or(SavedError::DiskShape)?;
        if d.get("readonly").and_then(|r| r.as_bool()).unwrap_or(false) != n.readonly {
            return Err(SavedError::Disks);
        }
        d.insert("path".into(), n.path.clone().into());
    }
    if let Some(v) = &now.vsock {
        let vsock = saved
            .get_mut("vsock")
            .and_then(|v| v.as_object_mut())
            .ok_or(SavedError::Missing("vsock device"))?;
        vsock.insert("socket".into(), v.socket.clone().into());
    }
    let out = serde_json::to_vec(&saved).map_err(SavedError::Encode)?;
    // A new file renamed over the old name: whatever the old name was, nothing is written
    // through it.
    let tmp = dir.join(format!(".{SNAPSHOT_CONFIG}.new"));
    let _ = std::fs::remove_file(&tmp);
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SavedError::Write(path, source)
    };
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(write_error(&tmp))?;
        // The new VMM reads it as the directory's owner.
        use std::os::unix::fs::MetadataExt as _;
        let owner = std::fs::symlink_metadata(dir)
            .map_err(|source| SavedError::Owner(dir.to_path_buf(), source))?;
        std::os::unix::fs::fchown(&f, Some(owner.uid()), Some(owner.gid()))
            .map_err(|source| SavedError::GiveToVmm(tmp.clone(), source))?;
        f.write_all(&out).map_err(write_error(&tmp))?;
    }
    std::fs::rename(&tmp, &path).map_err(write_error(&path))
}

/// Saves the running guest's whole machine (memory, vCPUs, devices) into the new directory
/// `dir` (0700, given to the VMM's `uid`): `vm.pause`, then `vm.snapshot`, then every file
/// synced to the host's disk. Returns the bytes it takes. On failure nothing is left in `dir`
/// and the guest stays paused (it is stopped next).
pub async fn save_memory(
    api: &Api,
    dir: &Path,
    uid: Option<u32>,
    within: Duration,
) -> Result<u64, SaveError> {
    {
        use std::os::unix::fs::DirBuilderExt as _;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|source| SaveError::Create(dir.to_path_buf(), source))?;
        if let Some(uid) = uid {
            std::os::unix::fs::lchown(dir, Some(uid), Some(uid))
                .map_err(|source| SaveError::GiveToVmm(dir.to_path_buf(), source))?;
        }
    }
    let saved = async {
        api.pause().await?;
        api.snapshot(dir, within).await
    }
    .await;
    if let Err(e) = saved {
        let _ = std::fs::remove_dir_all(dir);
        return Err(e.into());
    }
    let d = dir.to_path_buf();
    tokio::task::spawn_blocking(move || super::disk::sync_tree(&d))
        .await
        .map_err(SaveError::Task)?
        .map_err(|source| SaveError::Sync {
            what: "the saved machine",
            source,
        })
}

/// A new 0700 directory `coderoom-vm-<random>` under the temporary directory, the VMM's.
fn private_dir(uid: Option<u32>) -> Result<PathBuf, StartError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let mut last = None;
    for _ in 0..8 {
        let mut bytes = [0u8; 6];
        rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| StartError::Host(e.into()))?;
        let dir = std::env::temp_dir().join(format!("coderoom-vm-{}", hex::encode(bytes)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                if let Some(uid) = uid {
                    std::os::unix::fs::chown(&dir, Some(uid), Some(uid))
                        .map_err(StartError::Host)?;
                }
                return Ok(dir);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(StartError::Host(last.unwrap_or_else(|| {
        std::io::Error::other("no private directory for the VMM")
    })))
}

/// The error lines of a VMM's output once it has ended (a second at most).
async fn log_errors(console: &mut tokio::sync::mpsc::Receiver<Vec<u8>>) -> String {
    let mut all = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(chunk) = console.recv().await {
            all.extend_from_slice(&chunk);
            if all.len() > 64 << 10 {
                break;
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&all);
    let errors: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("rror") || l.contains("failed") || l.contains("panic"))
        .collect();
    let picked = if errors.is_empty() {
        text.lines().rev().take(3).collect::<Vec<_>>()
    } else {
        errors.into_iter().rev().take(3).collect()
    };
    picked.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// The oldest cloud-hypervisor whose API this driver's bodies match (the payload, vsock and
/// console schemas as in `cloud-hypervisor-openapi.yaml`).
const OLDEST_MAJOR: u32 = 40;

/// Refuses a VMM older than the API this driver speaks, by what `vmm.ping` says.
fn check_version(version: &str) -> Result<(), ApiError> {
    let major = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    match major {
        Some(m) if m >= OLDEST_MAJOR => Ok(()),
        _ => Err(ApiError::Schema {
            path: "vmm.ping".into(),
            detail: format!(
                "version {version:?}: this driver needs cloud-hypervisor v{OLDEST_MAJOR} or newer"
            ),
        }),
    }
}

/// Connects to the guest's agent through the hybrid vsock socket, retrying until the guest
/// listens, the VMM exits, or the boot deadline passes.
async fn connect_agent(
    vsock: &Path,
    child: &mut tokio::process::Child,
) -> Result<tokio::net::UnixStream, VsockError> {
    let deadline = tokio::time::Instant::now() + super::READY_KVM;
    let mut last = VsockError::NeverListened;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(VsockError::Exited(status));
        }
        match try_connect(vsock, deadline).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(VsockError::Deadline {
        secs: super::READY_KVM.as_secs(),
        last: Box::new(last),
    })
}

async fn try_connect(
    vsock: &Path,
    deadline: tokio::time::Instant,
) -> Result<tokio::net::UnixStream, VsockError> {
    let mut s = tokio::net::UnixStream::connect(vsock)
        .await
        .map_err(VsockError::Connect)?;
    s.write_all(format!("CONNECT {}\n", super::image::AGENT_VSOCK_PORT).as_bytes())
        .await
        .map_err(VsockError::Io)?;
    // The answer is one line, `OK <host port>`; read it byte by byte so nothing of the agent's
    // stream is taken with it.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        use tokio::io::AsyncReadExt as _;
        // Once the guest has accepted, dropping the connection would leave its agent serving
        // a dead stream: the answer is awaited as long as the boot may take.
        let n = tokio::time::timeout_at(deadline, s.read(&mut byte))
            .await
            .map_err(|_| VsockError::NoAnswer)?
            .map_err(VsockError::Io)?;
        if n == 0 {
            return Err(VsockError::Closed);
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() > 64 {
            return Err(VsockError::Overlong);
        }
    }
    if line.starts_with(b"OK ") {
        Ok(s)
    } else {
        Err(VsockError::Refused(
            String::from_utf8_lossy(&line).into_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_or_odd_versions_are_refused() {
        assert!(check_version("v54.0.0").is_ok());
        assert!(check_version("v40.0").is_ok());
        assert!(check_version("v39.1.0").is_err());
        assert!(check_version("garbage").is_err());
    }

    /// The refusal as cloud-hypervisor v54 words it (a snapshot this host's KVM cannot take).
    #[test]
    fn a_refusal_reads_as_its_error_chain_without_the_backtrace() {
        let body = br#"["Error from API","The VM could not be snapshotted","Cannot snapshot VM","Could not get vCPU state GetNestedState(Invalid argument (os error 22)\n\nStack backtrace:\n   0: <unknown>\n  11: clone3)"]"#;
        assert_eq!(
            refusal(body),
            "Error from API: The VM could not be snapshotted: Cannot snapshot VM: Could not get vCPU state GetNestedState(Invalid argument (os error 22)"
        );
        assert_eq!(refusal(b"  plain words\n"), "plain words");
        assert!(refusal("é".repeat(1000).as_bytes()).chars().count() <= MAX_REFUSAL / 2 + 1);
    }

    /// A saved machine's configuration is pointed at the new process's descriptors and
    /// socket, keeping everything else; one with other disks is refused.
    #[test]
    fn a_saved_configuration_is_pointed_at_the_new_vmm() {
        let dir = tempfile::tempdir().expect("dir");
        let mut old = serde_json::to_value(vm_config(
            "/proc/self/fd/5",
            "/proc/self/fd/6",
            "/proc/self/fd/7",
            "/old/vsock.sock",
            256 << 20,
            1,
            64,
        ))
        .expect("json");
        old["disks"]
            .as_array_mut()
            .expect("disks")
            .push(serde_json::json!({"path": "/proc/self/fd/8", "readonly": true, "id": "_disk1"}));
        old["memory"]["shared"] = false.into();
        std::fs::write(
            dir.path().join(SNAPSHOT_CONFIG),
            serde_json::to_vec(&old).expect("bytes"),
        )
        .expect("write");
        let mut now = vm_config(
            "/proc/self/fd/11",
            "/proc/self/fd/12",
            "/proc/self/fd/13",
            "/new/vsock.sock",
            256 << 20,
            1,
            64,
        );
        now.disks.push(DiskConfig {
            path: "/proc/self/fd/14".into(),
            readonly: true,
        });
        repoint(dir.path(), &now).expect("repointed");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(SNAPSHOT_CONFIG)).expect("read"))
                .expect("json");
        assert_eq!(v["payload"]["kernel"], "/proc/self/fd/11");
        assert_eq!(v["payload"]["initramfs"], "/proc/self/fd/12");
        assert_eq!(v["disks"][0]["path"], "/proc/self/fd/13");
        assert_eq!(v["disks"][1]["path"], "/proc/self/fd/14");
        assert_eq!(v["disks"][1]["id"], "_disk1", "the rest of a disk stays");
        assert_eq!(v["vsock"]["socket"], "/new/vsock.sock");
        assert_eq!(
            v["memory"]["shared"], false,
            "the rest of the machine stays"
        );
        assert_eq!(v["payload"]["cmdline"], old["payload"]["cmdline"]);
        now.disks.pop();
        assert!(repoint(dir.path(), &now)
            .unwrap_err()
            .to_string()
            .contains("2 disks, this VM 1"));

        // A saved machine that reaches beyond this driver's configuration is refused, and so
        // is a configuration file that is not a plain file.
        now.disks.push(DiskConfig {
            path: "/proc/self/fd/14".into(),
            readonly: true,
        });
        let config = dir.path().join(SNAPSHOT_CONFIG);
        let good = std::fs::read(&config).expect("read");
        for (key, value) in [
            ("net", serde_json::json!([{"tap": "tap0"}])),
            ("pmem", serde_json::json!([{"file": "/etc/shadow"}])),
            (
                "serial",
                serde_json::json!({"mode": "File", "file": "/etc/passwd"}),
            ),
            ("memory", serde_json::json!({"size": 512u64 << 20})),
        ] {
            let mut v: serde_json::Value = serde_json::from_slice(&good).expect("json");
            v[key] = value;
            std::fs::write(&config, serde_json::to_vec(&v).expect("bytes")).expect("write");
            assert!(repoint(dir.path(), &now).is_err(), "{key} let through");
        }
        std::fs::remove_file(&config).expect("rm");
        std::os::unix::fs::symlink("/etc/hostname", &config).expect("symlink");
        assert!(repoint(dir.path(), &now).is_err(), "a symlink followed");
        assert!(std::fs::symlink_metadata(&config)
            .expect("there")
            .file_type()
            .is_symlink());
    }

    #[test]
    fn the_config_matches_the_openapi_names() {
        let c = vm_config("/k", "/i", "/d", "/v", 256 << 20, 1, 64);
        let v = serde_json::to_value(&c).expect("json");
        assert_eq!(v["cpus"]["boot_vcpus"], 1);
        assert_eq!(v["memory"]["size"], 256u64 << 20);
        assert_eq!(v["payload"]["kernel"], "/k");
        assert_eq!(v["payload"]["initramfs"], "/i");
        assert!(v["payload"]["cmdline"]
            .as_str()
            .is_some_and(|c| c.contains("coderoom.channel=vsock:1024")));
        assert_eq!(v["disks"][0]["path"], "/d");
        assert_eq!(v["vsock"]["socket"], "/v");
        assert_eq!(v["serial"]["mode"], "Tty");
        assert!(v.get("net").is_none(), "no network device");
    }
}

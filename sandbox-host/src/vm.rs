//! The microVM tier: one VM per room sandbox, with its own kernel, the guest image's userland,
//! a workspace disk of its own and no network device. The control plane reaches the guest only
//! through the agent's channel (a virtio-serial port under QEMU, hybrid vsock under
//! cloud-hypervisor), with the same typed operations as the namespace tier.
//!
//! Each VM runs as a VMM process (QEMU or cloud-hypervisor) under an unprivileged host uid of
//! its own (when the server is root), in a cgroup that bounds its memory (the guest's plus the
//! VMM's overhead), CPU and threads. Its workspace disk is a sparse ext4 image sized from the
//! room's limits, made for the VM at start and removed when it ends: the workspace's durable
//! form is the agent's snapshot the control plane keeps for every tier, restored into the new
//! disk at resume.

pub mod ch;
mod console;
mod disk;
pub mod image;
mod probe;
mod qemu;

use crate::cgroup::{CgroupError, Layout};
use crate::handle::{Ended, Sandbox};
pub use crate::process::find_program;
use crate::process::{ChildHooks, RoomUid, ROOM_UIDS};
use crate::{Limits, Receipt, StartError, Started, Starting, Tier, TierBackend};
use console::{merge, Console};
pub use disk::remove_disks;
#[cfg(feature = "remote")]
pub(crate) use disk::write_durably;
use disk::{
    adopt_kept, keep_files, kept_dir, make_disk, remove_orphans, take_kept, Fingerprint, Kept,
};
pub use image::{GuestImage, ImageError, Inputs, Manifest};
pub use probe::{choose, image_for, SetupError};
pub use qemu::QmpError;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Memory a VMM process may use beyond its guest's RAM (device emulation, the translation
/// cache under TCG, page tables).
const VMM_OVERHEAD: u64 = 320 << 20;
/// Threads of one VMM process.
const VMM_PIDS: u64 = 128;
/// Time to reach the agent when the guest runs at hardware speed.
const READY_KVM: Duration = Duration::from_secs(20);
/// Time to reach the agent under software emulation (a few seconds idle, much more on a busy
/// two-core machine).
const READY_TCG: Duration = Duration::from_secs(90);
/// Smallest workspace disk (ext4 needs room for its journal and tables).
const MIN_DISK: u64 = 64 << 20;
/// A saved machine's memory and devices, in a VM's directory and in what a park keeps:
/// one file under QEMU, a directory of its snapshot's files under cloud-hypervisor.
const MEMORY_FILE: &str = "memory.bin";
/// A VM's workspace disk, in its directory and in what a park keeps.
const DISK_FILE: &str = "workspace.img";
/// The record of what a park kept; written last, so a directory without it holds nothing.
const KEPT_RECORD: &str = "kept.json";
/// Time to save a guest's memory (one pass over its RAM, written to the host's disk).
const SAVE_WITHIN: Duration = Duration::from_secs(120);
/// Time to load a saved machine.
const LOAD_WITHIN: Duration = Duration::from_secs(120);

/// Why a guest's memory was not saved (the park then keeps its disk alone).
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// Neither QMP nor cloud-hypervisor's API answered when the VM was started.
    #[error("the VMM's control socket did not answer")]
    NoControl,
    /// The file or directory the save goes to could not be made.
    #[error("cannot make {}", .0.display())]
    Create(PathBuf, #[source] std::io::Error),
    /// The save's directory could not be given to the VMM's uid.
    #[error("cannot give {} to the VMM", .0.display())]
    GiveToVmm(PathBuf, #[source] std::io::Error),
    /// QEMU did not save the machine.
    #[error(transparent)]
    Qmp(#[from] QmpError),
    /// cloud-hypervisor did not pause or snapshot the machine.
    #[error(transparent)]
    Api(#[from] ch::ApiError),
    /// What was saved could not be synced to the host's disk.
    #[error("cannot sync {what}")]
    Sync {
        /// What was saved (`the memory image`, `the saved machine`).
        what: &'static str,
        /// Why it was not synced.
        #[source]
        source: std::io::Error,
    },
    /// The sync's blocking task did not finish.
    #[error("the sync of the saved machine did not finish")]
    Task(#[source] tokio::task::JoinError),
}

/// Which VMM runs the guests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VmmKind {
    /// cloud-hypervisor (needs hardware KVM).
    CloudHypervisor,
    /// QEMU (KVM, or software emulation where KVM cannot run the guest).
    Qemu,
}

impl VmmKind {
    /// The name the configuration uses.
    pub fn name(self) -> &'static str {
        match self {
            VmmKind::CloudHypervisor => "cloud-hypervisor",
            VmmKind::Qemu => "qemu",
        }
    }
}

/// How QEMU runs the guest's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// Software emulation (about 16 times slower than the host for shell work).
    Tcg,
}

impl Accel {
    /// `kvm` or `tcg`, as receipts say it.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Settings of the tier, from the server's flags.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// `--vmm`: `None` picks (see [`crate::Backend::select`]).
    pub vmm: Option<VmmKind>,
    /// QEMU's accelerator; `None` uses KVM when a probe boot reaches the agent under it, else
    /// software emulation.
    pub accel: Option<Accel>,
    /// `--cloud-hypervisor-bin` (else `cloud-hypervisor` on `PATH`).
    pub cloud_hypervisor_bin: Option<PathBuf>,
    /// `--qemu-bin` (else `qemu-system-x86_64` on `PATH`).
    pub qemu_bin: Option<PathBuf>,
    /// Where guest images are built and kept.
    pub image_dir: PathBuf,
    /// Where the VMs' disks live while they run.
    pub state_dir: PathBuf,
    /// Inputs for building the image on first need.
    pub inputs: Inputs,
    /// Build the image when none is there (else the tier is unavailable).
    pub build_on_need: bool,
}

/// What a VM's receipt says beyond the common fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmReceipt {
    /// `qemu` or `cloud-hypervisor`.
    pub vmm: String,
    /// The VMM's version.
    pub vmm_version: String,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// The guest kernel's release.
    pub guest_kernel: String,
    /// The guest image's content hash.
    pub image: String,
    /// The workspace disk's size in bytes.
    pub disk_bytes: u64,
}

#[derive(Debug, Clone)]
pub(crate) enum Driver {
    Qemu {
        bin: PathBuf,
        version: String,
        accel: Accel,
    },
    CloudHypervisor {
        bin: PathBuf,
        version: String,
    },
}

impl Driver {
    fn kind(&self) -> VmmKind {
        match self {
            Driver::Qemu { .. } => VmmKind::Qemu,
            Driver::CloudHypervisor { .. } => VmmKind::CloudHypervisor,
        }
    }

    fn version(&self) -> &str {
        match self {
            Driver::Qemu { version, .. } | Driver::CloudHypervisor { version, .. } => version,
        }
    }

    fn accel(&self) -> Accel {
        match self {
            Driver::Qemu { accel, .. } => *accel,
            Driver::CloudHypervisor { .. } => Accel::Kvm,
        }
    }
}

/// The microVM backend.
#[derive(Debug)]
pub struct Microvm {
    driver: Driver,
    image: GuestImage,
    state_dir: PathBuf,
    cgroups: Result<Layout, CgroupError>,
    /// Root: each VMM runs under a host uid of its own from [`ROOM_UIDS`].
    root: bool,
    uids: Arc<Mutex<std::collections::BTreeSet<u32>>>,
    next: AtomicU64,
}

/// One VM being started: what the drivers need.
pub(crate) struct Instance {
    pub(crate) name: String,
    pub(crate) limits: Limits,
    /// Its directory (the disk, and under cloud-hypervisor its sockets).
    pub(crate) dir: PathBuf,
    pub(crate) disk: PathBuf,
    /// The VMM's host uid, when the server is root.
    pub(crate) uid: Option<u32>,
    /// `dir/lock`, locked for as long as the VM lives.
    pub(crate) lock: std::fs::File,
    /// A saved machine to load instead of booting (QEMU only).
    pub(crate) memory: Option<PathBuf>,
    /// What a park records, so a later start can tell whether the saved machine fits.
    fingerprint: Fingerprint,
}

impl Instance {
    /// vCPUs: the room's CPU share rounded up to whole cores, 1 to 8.
    pub(crate) fn vcpus(&self) -> u32 {
        vcpus_for(&self.limits)
    }
}

fn vcpus_for(limits: &Limits) -> u32 {
    u32::try_from(limits.cpu_millis.div_ceil(1000).clamp(1, 8)).unwrap_or(1)
}

/// The group owning `/dev/kvm`, when it is not root's.
fn kvm_group() -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/dev/kvm")
        .ok()
        .map(|m| m.gid())
        .filter(|g| *g != 0)
}

/// Whether `/dev/kvm` can be opened for use.
pub fn kvm_usable() -> Result<(), SetupError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(|_| ())
        .map_err(SetupError::Kvm)
}

impl Microvm {
    /// The backend for `driver` with `image`.
    pub(crate) fn new(
        driver: Driver,
        image: GuestImage,
        state_dir: &Path,
    ) -> Result<Microvm, SetupError> {
        std::fs::create_dir_all(state_dir)
            .map_err(|source| SetupError::StateDir(state_dir.to_path_buf(), source))?;
        remove_orphans(state_dir);
        let root = rustix::process::geteuid().is_root();
        Ok(Microvm {
            driver,
            image,
            state_dir: state_dir.to_path_buf(),
            cgroups: if root {
                Layout::detect()
            } else {
                Err(CgroupError::NotRoot)
            },
            root,
            uids: Arc::default(),
            next: AtomicU64::new(1),
        })
    }

    /// A sentence naming the VMM, its version and the guest.
    pub fn describe(&self) -> String {
        format!(
            "{} {} ({}), guest kernel {}, image {}",
            self.driver.kind().name(),
            self.driver.version(),
            match self.driver.accel() {
                Accel::Kvm => "hardware KVM",
                Accel::Tcg => "software emulation",
            },
            self.image.manifest.kernel_release,
            &self.image.manifest.hash[..12],
        )
    }

    /// Starts a VM named `name` (a room id: letters and digits) with a new workspace disk and
    /// waits until its agent answers. Anything kept for `name` is dropped.
    pub async fn start(&self, name: &str, limits: &Limits) -> Result<Started, StartError> {
        self.resume(name, limits, None).await
    }

    /// Starts a VM named `name` from what [`Sandbox::park`] kept under `tag`: its memory (the
    /// guest carries on, every process running) or its disk (a boot from it), whichever was
    /// kept and still fits this VMM, image and `limits`; else, and whenever resuming from it
    /// fails, with a new disk, as [`Microvm::start`]. [`Sandbox::resumed`] says which.
    pub async fn resume(
        &self,
        name: &str,
        limits: &Limits,
        tag: Option<&str>,
    ) -> Result<Started, StartError> {
        if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(StartError::Invalid(
                "sandbox names are 1 to 64 letters or digits",
            ));
        }
        let fits = self.fingerprint(limits);
        let kept = {
            let (state_dir, name, tag) = (
                self.state_dir.clone(),
                name.to_owned(),
                tag.map(str::to_owned),
            );
            tokio::task::spawn_blocking(move || take_kept(&state_dir, &name, tag.as_deref(), &fits))
                .await
                .unwrap_or(None)
        };
        if let Some(kept) = kept {
            let from = kept.keep();
            match self.launch(name, limits, Some(&kept)).await {
                Ok(started) => {
                    started.0.set_resumed(crate::Resumed {
                        from,
                        tag: kept.record.tag.clone(),
                    });
                    return Ok(started);
                }
                Err(e) => {
                    tracing::warn!(vm = %name, kept = from.name(), error = %crate::Chain(&e), "cannot resume from what was kept; starting afresh");
                }
            }
        }
        self.launch(name, limits, None).await
    }

    /// Whether something is kept for `name` (a start from it needs no warm-pool VM).
    pub fn has_kept(&self, name: &str) -> bool {
        kept_dir(&self.state_dir, name).join(KEPT_RECORD).is_file()
    }

    /// What a saved machine must match to be loaded into a new VMM.
    fn fingerprint(&self, limits: &Limits) -> Fingerprint {
        Fingerprint {
            image: self.image.manifest.hash.clone(),
            vmm: self.driver.kind().name().to_owned(),
            vmm_version: self.driver.version().to_owned(),
            accel: self.driver.accel().name().to_owned(),
            memory_bytes: limits.memory_bytes,
            vcpus: vcpus_for(limits),
            disk_bytes: limits.workspace_bytes.max(MIN_DISK),
            pids: limits.pids,
        }
    }

    async fn launch(
        &self,
        name: &str,
        limits: &Limits,
        kept: Option<&Kept>,
    ) -> Result<Started, StartError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self
            .state_dir
            .join(format!("{name}-{}-{n}", std::process::id()));
        let slot = if self.root {
            Some(
                RoomUid::take(&self.uids, ROOM_UIDS.end - ROOM_UIDS.start)
                    .ok_or_else(|| StartError::Unavailable("every VMM uid is in use".into()))?,
            )
        } else {
            None
        };
        let uid = slot.as_ref().map(|s| ROOM_UIDS.start + s.slot);
        let made = {
            let vm_dir = dir.clone();
            let bytes = limits.workspace_bytes.max(MIN_DISK);
            let kept = kept.cloned();
            tokio::task::spawn_blocking(move || match kept {
                Some(k) => adopt_kept(&vm_dir, &k, uid),
                None => make_disk(&vm_dir, bytes, uid),
            })
            .await
        };
        let lock = match made {
            Ok(Ok(lock)) => lock,
            Ok(Err(e)) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
            Err(_) => return Err(StartError::Host(std::io::Error::other("disk task failed"))),
        };
        let memory = kept
            .filter(|k| k.record.memory)
            .map(|_| dir.join(MEMORY_FILE));
        let vm = Instance {
            name: name.to_owned(),
            limits: limits.clone(),
            disk: dir.join(DISK_FILE),
            dir,
            uid,
            lock,
            memory,
            fingerprint: self.fingerprint(limits),
        };
        let result = self.boot(&vm, slot).await;
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&vm.dir);
        }
        result
    }

    async fn boot(&self, vm: &Instance, slot: Option<RoomUid>) -> Result<Started, StartError> {
        let vmm_limits = Limits {
            memory_bytes: vm.limits.memory_bytes.saturating_add(VMM_OVERHEAD),
            pids: VMM_PIDS,
            cpu_millis: vm.limits.cpu_millis,
            workspace_bytes: vm.limits.workspace_bytes,
        };
        let (cgroup, procs) = crate::cgroup::prepare(
            self.cgroups.as_ref().ok(),
            &format!("vm{}", vm.name),
            &vmm_limits,
            None,
        )
        .map_err(StartError::Host)?;
        let hooks = |inherit: Vec<i32>| ChildHooks {
            procs: procs.iter().map(|f| f.as_raw_fd()).collect(),
            inherit,
            run_as: vm.uid,
            // The disk is written in place: no write beyond its size is the VMM's business.
            fsize: vm
                .limits
                .workspace_bytes
                .max(MIN_DISK)
                .saturating_add(1 << 20),
            nproc: None,
            // KVM is opened by group (Debian: `kvm`), which the VMM's own uid is not in.
            groups: kvm_group().into_iter().collect(),
        };
        let booted = match &self.driver {
            Driver::Qemu { bin, accel, .. } => self.spawn_qemu(bin, *accel, vm, hooks).await,
            Driver::CloudHypervisor { bin, .. } => ch::spawn(bin, &self.image, vm, hooks).await,
        };
        drop(procs);
        let booted = match booted {
            Ok(b) => b,
            Err(e) => {
                // The drivers have waited for their VMM to end; its group goes now.
                crate::cgroup::finish(cgroup).await;
                return Err(e);
            }
        };
        let Booted {
            mut child,
            agent,
            console,
            mut qmp,
            ch_api,
            run_dir,
        } = booted;
        let (sandbox, events, control) = Sandbox::wire(agent);
        if let Some(cg) = &cgroup {
            let cg = cg.clone();
            sandbox.set_pressure(Box::new(move || cg.pressure()));
        }
        let mut parks = crate::handle::Control::parking(&sandbox);
        let console = Console::watch(console);
        let mut killed = control.killed;
        let mut stream_closed = control.stream_closed;
        let ended = control.ended;
        let dir = vm.dir.clone();
        let keep_to = kept_dir(&self.state_dir, &vm.name);
        let fingerprint = vm.fingerprint.clone();
        let reaper_cgroup = cgroup.clone();
        let console_w = console.clone();
        let lock = vm.lock.try_clone().ok();
        let uid = vm.uid;
        tokio::spawn(async move {
            // The disk's lock is held until the directory is gone (see `remove_orphans`).
            let _lock = lock;
            let _slot = slot;
            let mut stopped = false;
            let mut parking: Option<crate::handle::ParkRequest> = None;
            let status = tokio::select! {
                s = child.wait() => s.ok(),
                _ = async { let _ = killed.wait_for(|k| *k).await; } => {
                    stopped = true;
                    None
                }
                Some(p) = parks.recv() => {
                    parking = Some(p);
                    stopped = true;
                    None
                }
                // The guest ended without its VMM (cloud-hypervisor reboots a guest that
                // panics): the VMM gets a moment to exit on its own, then is killed.
                _ = async { let _ = stream_closed.wait_for(|c| *c).await; } => {
                    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
                        Ok(s) => s.ok(),
                        Err(_) => {
                            let _ = child.start_kill();
                            child.wait().await.ok()
                        }
                    }
                }
            };
            // A park saves the guest's memory first, where asked and the VMM can.
            let mut saved: Option<Result<u64, SaveError>> = None;
            if let Some(p) = parking.as_ref().filter(|p| p.keep == crate::Keep::Memory) {
                let to = dir.join(MEMORY_FILE);
                let r = match (qmp.as_mut(), &ch_api) {
                    (Some(q), _) => qemu::save_memory(q, &to).await,
                    (None, Some(api)) => ch::save_memory(api, &to, uid, SAVE_WITHIN).await,
                    (None, None) => Err(SaveError::NoControl),
                };
                if let Err(e) = &r {
                    tracing::warn!(tag = %p.tag, error = %crate::Chain(e), "cannot save the VM's memory; keeping its disk");
                }
                saved = Some(r);
            }
            let status = if stopped {
                // Asked to stop: QMP `quit` (QEMU exits at once), else the process is killed.
                let quit = match qmp.as_mut() {
                    Some(q) => q.quit(Duration::from_secs(2)).await.is_ok(),
                    None => false,
                };
                if let Some(api) = &ch_api {
                    let _ = api.shutdown_vmm(Duration::from_secs(2)).await;
                }
                let waited = if quit || ch_api.is_some() {
                    tokio::time::timeout(Duration::from_secs(3), child.wait())
                        .await
                        .ok()
                        .and_then(Result::ok)
                } else {
                    None
                };
                match waited {
                    Some(s) => Some(s),
                    None => {
                        let _ = child.start_kill();
                        child.wait().await.ok()
                    }
                }
            } else {
                status
            };
            let pressure = crate::cgroup::finish(reaper_cgroup).await;
            let parked = tokio::task::spawn_blocking(move || {
                let parked = parking.map(|p| {
                    let memory = saved.as_ref().and_then(|r| r.as_ref().ok()).copied();
                    let r = keep_files(&dir, &keep_to, &p.tag, memory, &fingerprint);
                    // Only a memory park saves: an error here is why memory was not kept.
                    let note = match &saved {
                        Some(Err(e)) => Some(crate::Chain(e).to_string()),
                        _ => None,
                    };
                    (
                        p.reply,
                        r.map(|(kept, bytes)| crate::Parked { kept, bytes, note })
                            .map_err(|e| crate::ParkError::Failed(crate::Chain(&e).to_string())),
                    )
                });
                let _ = std::fs::remove_dir_all(dir);
                if let Some(run) = run_dir {
                    let _ = std::fs::remove_dir_all(run);
                }
                parked
            })
            .await
            .ok()
            .flatten();
            if let Some((reply, r)) = parked {
                let _ = reply.send(r);
            }
            let outcome = if stopped {
                Ended::Stopped
            } else {
                // Let the console reader take the last lines first.
                console_w.settled().await;
                let mut reason = console_w.reason(status);
                if pressure.oom_kills > 0 {
                    reason.push_str("; the VMM process reached its memory limit");
                }
                Ended::Died { reason }
            };
            let _ = ended.send(Some(outcome));
        });

        let within = match self.driver.accel() {
            Accel::Kvm => READY_KVM,
            Accel::Tcg => READY_TCG,
        };
        if vm.memory.is_some() {
            // The restored agent holds its replies until told a new host is there.
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0);
            // (A terminal open before the save is open still; the control plane finds it so
            // when it opens one.)
            match sandbox
                .call(crate::proto::Op::Resumed { now_ms }, within)
                .await
            {
                Ok(crate::proto::Reply::Resumed { .. }) => {}
                other => {
                    sandbox.kill();
                    let _ = sandbox.ended().await;
                    return Err(StartError::NotReady(format!(
                        "the restored guest's agent did not answer: {other:?}"
                    )));
                }
            }
        }
        if let Err(e) = sandbox.ready(within).await {
            sandbox.kill();
            let how = sandbox.ended().await;
            let why = match how {
                Ended::Died { reason } => reason,
                _ => console.tail_line().unwrap_or_default(),
            };
            return Err(StartError::NotReady(if why.is_empty() {
                format!("{e} (within {} s)", within.as_secs())
            } else {
                format!("{e} (within {} s): {why}", within.as_secs())
            }));
        }
        let receipt = self.receipt(vm);
        Ok((sandbox, events, receipt))
    }

    async fn spawn_qemu(
        &self,
        bin: &Path,
        accel: Accel,
        vm: &Instance,
        hooks: impl Fn(Vec<i32>) -> ChildHooks,
    ) -> Result<Booted, StartError> {
        let open = |p: &Path| -> Result<OwnedFd, StartError> {
            Ok(std::fs::File::open(p).map_err(StartError::Host)?.into())
        };
        let (ours_agent, theirs_agent) =
            std::os::unix::net::UnixStream::pair().map_err(StartError::Host)?;
        let (ours_qmp, theirs_qmp) =
            std::os::unix::net::UnixStream::pair().map_err(StartError::Host)?;
        let fds = qemu::Fds {
            kernel: open(&self.image.kernel())?,
            initramfs: open(&self.image.initramfs())?,
            disk: std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&vm.disk)
                .map_err(StartError::Host)?
                .into(),
            disk_ro: open(&vm.disk)?,
            userland: self.image.userland().as_deref().map(open).transpose()?,
            agent: theirs_agent.into(),
            qmp: theirs_qmp.into(),
            incoming: vm.memory.as_deref().map(open).transpose()?,
        };
        let args = qemu::args(vm, accel, &fds);
        let mut child = spawn_vmm(bin, &args, hooks(fds.raw()))?;
        drop(fds);
        let console = merge(child.stdout.take(), child.stderr.take());
        ours_qmp.set_nonblocking(true).map_err(StartError::Host)?;
        let qmp_stream = tokio::net::UnixStream::from_std(ours_qmp).map_err(StartError::Host)?;
        let qmp = match tokio::time::timeout(
            Duration::from_secs(30),
            qemu::Qmp::connect(qmp_stream),
        )
        .await
        {
            Ok(Ok(mut q)) if vm.memory.is_some() => {
                // A saved machine: it loads, then runs on from where it was saved.
                if let Err(e) = q.resume_incoming(LOAD_WITHIN).await {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    return Err(StartError::NotReady(format!(
                        "the saved machine did not load: {}",
                        crate::Chain(&e)
                    )));
                }
                Some(q)
            }
            Ok(Ok(mut q)) => {
                match q.status(Duration::from_secs(5)).await {
                    Ok(state) if state == "running" => {}
                    Ok(state) => tracing::warn!(%state, "QEMU's machine is not running"),
                    Err(e) => {
                        tracing::warn!(error = %crate::Chain(&e), "QEMU's status did not answer")
                    }
                }
                Some(q)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::Chain(&e), "QEMU's QMP did not answer; the VM is stopped by signal");
                None
            }
            Err(_) => None,
        };
        ours_agent.set_nonblocking(true).map_err(StartError::Host)?;
        let agent = tokio::net::UnixStream::from_std(ours_agent).map_err(StartError::Host)?;
        Ok(Booted {
            child,
            agent: Box::new(agent),
            console,
            qmp,
            ch_api: None,
            run_dir: None,
        })
    }

    fn receipt(&self, vm: &Instance) -> Receipt {
        let m = &self.image.manifest;
        let disk = vm.limits.workspace_bytes.max(MIN_DISK);
        Receipt {
            tier: "microvm".into(),
            implementation: format!(
                "{} {} ({}); guest kernel {} from {}; image {}; agent {}",
                self.driver.kind().name(),
                self.driver.version(),
                self.driver.accel().name(),
                m.kernel_release,
                m.kernel_package,
                m.hash,
                m.agent_version,
            ),
            mounts: vec![
                format!("/ (rw, initramfs of image {}: {})", &m.hash[..12], m.userland),
                format!(
                    "/workspace (rw, ext4 on virtio-blk: the room's {} MiB sparse disk, kept between stops with --sandbox-keep)",
                    disk >> 20
                ),
                "/tmp (rw, tmpfs in guest memory)".into(),
            ],
            limits: vm.limits.clone(),
            network: "no network device: the guest has loopback only; egress and previews pass through the agent's channel".into(),
            seccomp: match self.driver.kind() {
                VmmKind::Qemu => "the VMM runs with QEMU's -sandbox on (no obsolete calls, no privilege raising, no spawning, no resource control); room code runs under the guest's own kernel".into(),
                VmmKind::CloudHypervisor => "the VMM runs with cloud-hypervisor's own seccomp filters (the default); room code runs under the guest's own kernel".into(),
            },
            cgroups: match &self.cgroups {
                Ok(l) => format!(
                    "the VMM process: memory {} MiB (guest {} MiB + {} MiB VMM), {} threads, {} ms CPU per s, through {}",
                    (vm.limits.memory_bytes + VMM_OVERHEAD) >> 20,
                    vm.limits.memory_bytes >> 20,
                    VMM_OVERHEAD >> 20,
                    VMM_PIDS,
                    vm.limits.cpu_millis,
                    l.name()
                ),
                Err(why) => format!("none on the VMM process ({}); the guest's RAM bounds room code", crate::Chain(why)),
            },
            host_uid: vm.uid.unwrap_or_else(|| rustix::process::getuid().as_raw()),
            vm: Some(VmReceipt {
                vmm: self.driver.kind().name().into(),
                vmm_version: self.driver.version().into(),
                accel: self.driver.accel().name().into(),
                guest_kernel: m.kernel_release.clone(),
                image: m.hash.clone(),
                disk_bytes: disk,
            }),
            host: None,
            start: None,
        }
    }
}

impl TierBackend for Microvm {
    fn tier(&self) -> Tier {
        Tier::Microvm
    }

    fn resume<'a>(
        &'a self,
        name: &'a str,
        limits: &'a Limits,
        tag: Option<&'a str>,
    ) -> Starting<'a> {
        Box::pin(Microvm::resume(self, name, limits, tag))
    }

    fn has_kept(&self, name: &str) -> bool {
        Microvm::has_kept(self, name)
    }
}

/// Starts a VMM process: no environment, no standard input, its output piped to the server,
/// and `hooks` between fork and exec (cgroup, rlimits, uid, inherited descriptors).
pub(crate) fn spawn_vmm(
    bin: &Path,
    args: &[String],
    hooks: ChildHooks,
) -> Result<tokio::process::Child, StartError> {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_clear();
    // SAFETY: `ChildHooks::run` only makes async-signal-safe system calls on values prepared
    // before the fork.
    unsafe {
        cmd.pre_exec(move || hooks.run());
    }
    tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .map_err(StartError::Host)
}

/// What a driver hands back once its VMM process runs.
pub(crate) struct Booted {
    pub(crate) child: tokio::process::Child,
    pub(crate) agent: Box<dyn AgentStream>,
    pub(crate) console: tokio::sync::mpsc::Receiver<Vec<u8>>,
    qmp: Option<qemu::Qmp>,
    pub(crate) ch_api: Option<ch::Api>,
    /// cloud-hypervisor's socket directory, removed once the VMM has ended.
    pub(crate) run_dir: Option<PathBuf>,
}

/// The agent's stream, whichever channel carries it.
pub(crate) trait AgentStream:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> AgentStream for T {}

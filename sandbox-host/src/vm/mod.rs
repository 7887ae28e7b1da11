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
pub mod image;
mod qemu;

use crate::cgroup::Layout;
use crate::handle::{Ended, Sandbox};
use crate::namespace::{describe, ChildHooks, RoomUid, ROOM_UIDS};
use crate::{Limits, Receipt, StartError, Started};
pub use image::{GuestImage, ImageError, Inputs, Manifest};
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Memory a VMM process may use beyond its guest's RAM (device emulation, the translation
/// cache under TCG, page tables).
const VMM_OVERHEAD: u64 = 320 << 20;
/// Threads of one VMM process.
const VMM_PIDS: u64 = 128;
/// Longest line of a VM's output quoted in a reason.
const REASON_LINE: usize = 240;
/// Console output kept for failure reasons.
const CONSOLE_KEEP: usize = 16 << 10;
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
    cgroups: Result<Layout, String>,
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

/// Finds a program: the configured path, else `name` on `PATH`.
pub fn find_program(configured: Option<&Path>, name: &str) -> Option<PathBuf> {
    if let Some(p) = configured {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
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
pub fn kvm_usable() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(|_| ())
        .map_err(|e| format!("/dev/kvm: {e}"))
}

impl Microvm {
    /// The backend for `driver` with `image`.
    pub(crate) fn new(
        driver: Driver,
        image: GuestImage,
        state_dir: &Path,
    ) -> Result<Microvm, String> {
        std::fs::create_dir_all(state_dir)
            .map_err(|e| format!("cannot create {}: {e}", state_dir.display()))?;
        remove_orphans(state_dir);
        let root = rustix::process::geteuid().is_root();
        Ok(Microvm {
            driver,
            image,
            state_dir: state_dir.to_path_buf(),
            cgroups: if root {
                Layout::detect()
            } else {
                Err("not root: cgroup limits need the server to run as root".into())
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
                    tracing::warn!(vm = %name, kept = from.name(), error = %e, "cannot resume from what was kept; starting afresh");
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
        let (cgroup, procs) =
            crate::cgroup::prepare(&self.cgroups, &format!("vm{}", vm.name), &vmm_limits)
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
            let mut saved: Result<u64, String> = Err(String::new());
            if let Some(p) = parking.as_ref().filter(|p| p.keep == crate::Keep::Memory) {
                let to = dir.join(MEMORY_FILE);
                saved = match (qmp.as_mut(), &ch_api) {
                    (Some(q), _) => save_memory(q, &to).await,
                    (None, Some(api)) => ch::save_memory(api, &to, uid, SAVE_WITHIN).await,
                    (None, None) => Err("the VMM's control socket did not answer".into()),
                };
                if let Err(e) = &saved {
                    tracing::warn!(tag = %p.tag, error = %e, "cannot save the VM's memory; keeping its disk");
                }
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
                    let memory = saved.as_ref().ok().copied();
                    let r = keep_files(&dir, &keep_to, &p.tag, memory, &fingerprint);
                    let note = match (&saved, p.keep) {
                        (Err(e), crate::Keep::Memory) => Some(e.clone()),
                        _ => None,
                    };
                    (
                        p.reply,
                        r.map(|(kept, bytes)| crate::Parked { kept, bytes, note }),
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
                        "the saved machine did not load: {e}"
                    )));
                }
                Some(q)
            }
            Ok(Ok(mut q)) => {
                match q.status(Duration::from_secs(5)).await {
                    Ok(state) if state == "running" => {}
                    Ok(state) => tracing::warn!(%state, "QEMU's machine is not running"),
                    Err(e) => tracing::warn!(error = %e, "QEMU's status did not answer"),
                }
                Some(q)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "QEMU's QMP did not answer; the VM is stopped by signal");
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
                Err(why) => format!("none on the VMM process ({why}); the guest's RAM bounds room code"),
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
        }
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

/// Reads a VMM's standard output and error (the guest console under QEMU, the VMM's log under
/// cloud-hypervisor) into one channel of chunks.
pub(crate) fn merge(
    out: Option<tokio::process::ChildStdout>,
    err: Option<tokio::process::ChildStderr>,
) -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    fn pump<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
        mut r: R,
        tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) {
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 || tx.send(buf[..n].to_vec()).await.is_err() {
                    break;
                }
            }
        });
    }
    if let Some(o) = out {
        pump(o, tx.clone());
    }
    if let Some(e) = err {
        pump(e, tx);
    }
    rx
}

/// The last of a VM's console, for saying why it ended.
#[derive(Clone)]
struct Console {
    kept: Arc<Mutex<Vec<u8>>>,
    done: Arc<tokio::sync::Notify>,
    finished: Arc<std::sync::atomic::AtomicBool>,
}

impl Console {
    fn watch(mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>) -> Console {
        let c = Console {
            kept: Arc::default(),
            done: Arc::default(),
            finished: Arc::default(),
        };
        let w = c.clone();
        tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                let mut k = w.kept.lock().unwrap_or_else(|e| e.into_inner());
                k.extend_from_slice(&chunk);
                if k.len() > CONSOLE_KEEP {
                    let cut = k.len() - CONSOLE_KEEP;
                    k.drain(..cut);
                }
            }
            w.finished.store(true, Ordering::SeqCst);
            w.done.notify_waiters();
        });
        c
    }

    /// Waits (briefly) until the VMM's output has been read to its end.
    async fn settled(&self) {
        let wait = self.done.notified();
        if self.finished.load(Ordering::SeqCst) {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), wait).await;
    }

    /// What was kept, one line per line, each without control characters and at most
    /// [`REASON_LINE`] characters (the text reaches the audit chain and the participants).
    fn text(&self) -> String {
        let k = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&k)
            .lines()
            .map(|l| {
                l.chars()
                    .filter(|c| !c.is_control())
                    .take(REASON_LINE)
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn tail_line(&self) -> Option<String> {
        self.text()
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_owned())
    }

    /// Why the VM ended, in words: the guest's own account first (a kernel panic, the agent
    /// ending, the guest's out-of-memory killer), then how the VMM process ended.
    fn reason(&self, status: Option<std::process::ExitStatus>) -> String {
        use std::os::unix::process::ExitStatusExt as _;
        let text = self.text();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let find = |needle: &str| lines.iter().rev().find(|l| l.contains(needle)).copied();
        let how = status.map_or_else(|| "unknown status".to_owned(), describe);
        if let Some(panic) = find("Kernel panic") {
            return format!("the guest kernel panicked ({panic}); the VMM exited: {how}");
        }
        if status.and_then(|s| s.signal()).is_some() {
            let mut r = format!("the VMM process was {how}");
            if let Some(l) = find("Out of memory") {
                r.push_str(&format!("; the guest had reported: {l}"));
            }
            return r;
        }
        let last = lines
            .iter()
            .rev()
            .find(|l| !l.is_empty())
            .copied()
            .unwrap_or("");
        // The VMM itself refused (a bad option, a device it could not open): its own words.
        if let Some(err) = lines.iter().rev().find(|l| {
            l.starts_with("qemu-system") || (l.contains("cloud-hypervisor") && l.contains("rror"))
        }) {
            return format!("the VMM failed ({how}): {err}");
        }
        let mut r = format!("the guest powered off ({how})");
        if let Some(l) = find("Out of memory") {
            r.push_str(&format!("; the guest reported: {l}"));
        }
        if !last.is_empty() {
            r.push_str(&format!("; its console's last line: {last}"));
        }
        r
    }
}

/// Makes `dir` (0700) and in it a lock file, locked and returned, and a sparse ext4 image
/// `workspace.img` (0600) of `bytes`; the directory and the disk belong to `uid` (the VMM's),
/// which gets the disk as a descriptor or through `/proc/self/fd`, never by a path it walks.
fn make_disk(dir: &Path, bytes: u64, uid: Option<u32>) -> Result<std::fs::File, StartError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let lock = vm_dir(dir)?;
    let disk = dir.join(DISK_FILE);
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&disk)
        .map_err(StartError::Host)?;
    f.set_len(bytes).map_err(StartError::Host)?;
    drop(f);
    let out = std::process::Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "root_owner=1000:1000",
            "-L",
            "workspace",
        ])
        .arg(&disk)
        .env_clear()
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .map_err(|e| StartError::Unavailable(format!("mkfs.ext4 (e2fsprogs) is needed: {e}")))?;
    if !out.status.success() {
        return Err(StartError::Host(std::io::Error::other(format!(
            "mkfs.ext4: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    if let Some(uid) = uid {
        for p in [dir, &disk] {
            std::os::unix::fs::chown(p, Some(uid), Some(uid)).map_err(StartError::Host)?;
        }
    }
    Ok(lock)
}

/// Gives `path` and, for a directory, everything in it (one level: a snapshot's files) to
/// `uid`. A VMM wrote them as its own uid: no symlink is followed (a planted one would hand
/// root's chown any file of the host).
fn chown_tree(path: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for e in std::fs::read_dir(path)? {
            std::os::unix::fs::lchown(e?.path(), Some(uid), Some(uid))?;
        }
    }
    Ok(())
}

/// Removes a file or a directory with what is in it (a symlink itself, never its target).
fn remove_path(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Opens `path` for reading only when it is a regular file (`dir`: a directory) itself: no
/// symlink followed, no wait on a FIFO. What a VMM's uid could have made is opened this way.
pub(crate) fn open_plain(path: &Path, dir: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let kind = if dir { libc::O_DIRECTORY } else { 0 };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | kind)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if (dir && t.is_dir()) || (!dir && t.is_file()) {
        Ok(f)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a plain file", path.display()),
        ))
    }
}

/// Syncs `path` to the host's disk (and, for a directory, every file in it and the directory
/// itself). Returns the bytes it holds. Anything but regular files and a directory of them is
/// refused.
fn sync_tree(path: &Path) -> std::io::Result<u64> {
    let mut bytes = 0;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for e in std::fs::read_dir(path)? {
            let f = open_plain(&e?.path(), false)?;
            f.sync_all()?;
            bytes += f.metadata()?.len();
        }
        open_plain(path, true)?.sync_all()?;
    } else {
        let f = open_plain(path, false)?;
        f.sync_all()?;
        bytes += f.metadata()?.len();
    }
    Ok(bytes)
}

/// What a saved machine was made with: a new VMM loads it only when all of it is the same
/// (the disk's size too, for the disk alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Fingerprint {
    image: String,
    vmm: String,
    vmm_version: String,
    accel: String,
    memory_bytes: u64,
    vcpus: u32,
    disk_bytes: u64,
}

/// `kept.json`: what a park left in `STATE_DIR/kept/NAME/`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct KeptRecord {
    /// The control plane's name for the workspace this disk holds (its snapshot).
    tag: String,
    /// `memory.bin` is there too.
    memory: bool,
    fingerprint: Fingerprint,
}

/// What a start takes over from a park.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    dir: PathBuf,
    record: KeptRecord,
}

impl Kept {
    fn keep(&self) -> crate::Keep {
        keep_of(self.record.memory)
    }
}

/// What was kept, by whether the memory was.
fn keep_of(memory: bool) -> crate::Keep {
    if memory {
        crate::Keep::Memory
    } else {
        crate::Keep::Disk
    }
}

/// Where a park keeps `name`'s disk and memory.
fn kept_dir(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("kept").join(name)
}

/// Takes what is kept for `name` when it was kept under `tag` and its disk fits `fits` (its
/// memory only when everything fits); anything else kept for `name` is removed. The record is
/// removed first: what a start takes is never taken twice, and a crash of the VM leaves
/// nothing that could be mistaken for a clean park.
fn take_kept(state_dir: &Path, name: &str, tag: Option<&str>, fits: &Fingerprint) -> Option<Kept> {
    let dir = kept_dir(state_dir, name);
    let record = std::fs::read(dir.join(KEPT_RECORD))
        .ok()
        .and_then(|b| serde_json::from_slice::<KeptRecord>(&b).ok());
    let _ = std::fs::remove_file(dir.join(KEPT_RECORD));
    let usable = record.filter(|r| {
        Some(r.tag.as_str()) == tag
            && r.fingerprint.disk_bytes == fits.disk_bytes
            && dir.join(DISK_FILE).is_file()
    });
    let Some(mut record) = usable else {
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    };
    if record.memory && (record.fingerprint != *fits || !dir.join(MEMORY_FILE).exists()) {
        record.memory = false;
    }
    if !record.memory {
        remove_path(&dir.join(MEMORY_FILE));
    }
    Some(Kept { dir, record })
}

/// A VM's directory made from what was kept: the kept disk (and memory) moved in and given
/// to the VMM's uid. Returns the directory's lock, as [`make_disk`].
fn adopt_kept(dir: &Path, kept: &Kept, uid: Option<u32>) -> Result<std::fs::File, StartError> {
    let lock = vm_dir(dir)?;
    let disk = dir.join(DISK_FILE);
    std::fs::rename(kept.dir.join(DISK_FILE), &disk).map_err(StartError::Host)?;
    if kept.record.memory {
        std::fs::rename(kept.dir.join(MEMORY_FILE), dir.join(MEMORY_FILE))
            .map_err(StartError::Host)?;
    }
    let _ = std::fs::remove_dir_all(&kept.dir);
    if let Some(uid) = uid {
        // What was kept came out of a directory the old VMM's uid controlled: never followed.
        for p in [dir, &disk] {
            std::os::unix::fs::lchown(p, Some(uid), Some(uid)).map_err(StartError::Host)?;
        }
        if kept.record.memory {
            // A cloud-hypervisor snapshot is a directory the VMM reads (and the next one
            // writes) as its own uid, which may be another slot's this time.
            chown_tree(&dir.join(MEMORY_FILE), uid).map_err(StartError::Host)?;
        }
    }
    Ok(lock)
}

/// Moves a parked VM's disk (and `memory`, the saved machine's size, when it was saved) from
/// its directory `dir` to `to`, and writes the record last. Returns what was kept and the
/// bytes it takes on the host.
fn keep_files(
    dir: &Path,
    to: &Path,
    tag: &str,
    memory: Option<u64>,
    fingerprint: &Fingerprint,
) -> Result<(crate::Keep, u64), String> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let fail = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let _ = std::fs::remove_dir_all(to);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(to)
        .map_err(|e| fail("cannot make the kept directory", e))?;
    let disk = to.join(DISK_FILE);
    std::fs::rename(dir.join(DISK_FILE), &disk).map_err(|e| fail("cannot keep the disk", e))?;
    open_plain(&disk, false)
        .and_then(|f| f.sync_all())
        .map_err(|e| fail("cannot sync the disk", e))?;
    let mut bytes = std::fs::metadata(&disk)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0);
    let memory =
        memory.is_some() && std::fs::rename(dir.join(MEMORY_FILE), to.join(MEMORY_FILE)).is_ok();
    if memory {
        bytes += sync_tree(&to.join(MEMORY_FILE)).unwrap_or(0);
    }
    let record = KeptRecord {
        tag: tag.to_owned(),
        memory,
        fingerprint: fingerprint.clone(),
    };
    let json = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
    write_durably(to, KEPT_RECORD, &json).map_err(|e| fail("cannot record what was kept", e))?;
    Ok((keep_of(memory), bytes))
}

/// Writes `dir/name` whole or not at all, and durably: a temporary file (0600), synced,
/// renamed, then the directory synced. The kept disk and memory were synced before.
pub(crate) fn write_durably(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Saves a paused guest's memory to `path` (made here, 0600, synced to the host's disk).
async fn save_memory(q: &mut qemu::Qmp, path: &Path) -> Result<u64, String> {
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("cannot make {}: {e}", path.display()))?
    };
    let bytes = q
        .save(&file, SAVE_WITHIN)
        .await
        .map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || file.sync_all())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot sync the memory image: {e}"))?;
    Ok(bytes)
}

/// Makes a VM's directory (0700) and returns its lock, taken.
fn vm_dir(dir: &Path) -> Result<std::fs::File, StartError> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(StartError::Host)?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join("lock"))
        .map_err(StartError::Host)?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(|e| StartError::Host(e.into()))?;
    Ok(lock)
}

/// Limits of a probe boot.
fn probe_limits() -> Limits {
    Limits {
        memory_bytes: 256 << 20,
        pids: 64,
        cpu_millis: 1000,
        workspace_bytes: MIN_DISK,
    }
}

impl Microvm {
    /// Boots a throwaway guest and waits for its agent; the error says why it did not answer.
    pub async fn probe(&self) -> Result<std::time::Duration, String> {
        let t0 = std::time::Instant::now();
        match self.start("probe", &probe_limits()).await {
            Ok((sandbox, _events, _receipt)) => {
                let took = t0.elapsed();
                sandbox.kill();
                let _ = sandbox.ended().await;
                Ok(took)
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The guest image: the current one, else (when `build` and the configuration allow it)
/// built now.
pub async fn image_for(cfg: &VmConfig, build: bool) -> Result<GuestImage, String> {
    if let Some(image) = GuestImage::current(&cfg.image_dir) {
        return Ok(image);
    }
    if !(build && cfg.build_on_need) {
        return Err(format!(
            "no guest image in {} (run `coderoom image build`)",
            cfg.image_dir.display()
        ));
    }
    let dir = cfg.image_dir.clone();
    let inputs = cfg.inputs.clone();
    tracing::info!(dir = %dir.display(), "building the VM guest image (first use)");
    tokio::task::spawn_blocking(move || {
        image::build(&dir, &inputs, &mut |line| tracing::info!("image: {line}"))
    })
    .await
    .map_err(|e| format!("the image build failed: {e}"))?
    .map_err(|e| format!("cannot build the guest image: {e}"))
}

/// Picks the VMM for the microVM tier. `auto` (the tier was not asked for by name) never
/// builds an image and never picks software emulation; each candidate must boot a real guest
/// to its agent within the deadline. `Err` carries every candidate's reason.
pub async fn choose(cfg: &VmConfig, auto: bool) -> Result<(Microvm, String), String> {
    let image = image_for(cfg, !auto).await?;
    if auto && !rustix::process::geteuid().is_root() {
        // Without root the VMM would run as the server's own uid, with no cgroup: a guest
        // that escaped into it would hold the server's keys. Only by name, then.
        return Err("not root: a VMM of its own uid and cgroup needs the server to run as root (--sandbox-tier microvm runs it anyway)".into());
    }
    let mut reasons = Vec::new();
    let want_ch = matches!(cfg.vmm, None | Some(VmmKind::CloudHypervisor));
    let want_qemu = matches!(cfg.vmm, None | Some(VmmKind::Qemu));
    if want_ch {
        match find_program(cfg.cloud_hypervisor_bin.as_deref(), "cloud-hypervisor") {
            None => reasons.push(
                "cloud-hypervisor: no binary (install it or pass --cloud-hypervisor-bin)"
                    .to_owned(),
            ),
            Some(bin) => match (kvm_usable(), ch::version(&bin)) {
                (Err(e), _) => reasons.push(format!("cloud-hypervisor: needs KVM: {e}")),
                (_, Err(e)) => reasons.push(format!("cloud-hypervisor: {e}")),
                (Ok(()), Ok(version)) => {
                    let driver = Driver::CloudHypervisor { bin, version };
                    match probed(driver, &image, cfg).await? {
                        Ok(chosen) => return Ok(chosen),
                        Err(e) => reasons.push(format!("cloud-hypervisor: {e}")),
                    }
                }
            },
        }
    }
    if want_qemu {
        match find_program(cfg.qemu_bin.as_deref(), "qemu-system-x86_64") {
            None => reasons.push(
                "qemu: no qemu-system-x86_64 (install Debian's qemu-system-x86 or pass --qemu-bin)"
                    .to_owned(),
            ),
            Some(bin) => match qemu::version(&bin) {
                Err(e) => reasons.push(format!("qemu: {e}")),
                Ok(version) => {
                    let kvm_asked = cfg.accel != Some(Accel::Tcg);
                    if kvm_asked {
                        match kvm_usable() {
                            Err(e) => reasons.push(format!("qemu with KVM: {e}")),
                            Ok(()) => {
                                let driver = Driver::Qemu {
                                    bin: bin.clone(),
                                    version: version.clone(),
                                    accel: Accel::Kvm,
                                };
                                match probed(driver, &image, cfg).await? {
                                    Ok(chosen) => return Ok(chosen),
                                    Err(e) => reasons.push(format!("qemu with KVM: {e}")),
                                }
                            }
                        }
                    }
                    // Software emulation only when asked for by name.
                    if !auto && cfg.vmm == Some(VmmKind::Qemu) && cfg.accel != Some(Accel::Kvm) {
                        let vm = Microvm::new(
                            Driver::Qemu {
                                bin,
                                version,
                                accel: Accel::Tcg,
                            },
                            image,
                            &cfg.state_dir,
                        )?;
                        let mut why = format!("{}; chosen by configuration", vm.describe());
                        if !reasons.is_empty() {
                            why.push_str(&format!(" ({})", reasons.join("; ")));
                        }
                        return Ok((vm, why));
                    }
                }
            },
        }
    }
    Err(reasons.join("; "))
}

/// A backend for `driver` once a probe guest has reached its agent under it: `Ok(Ok(..))` with
/// the sentence that says so, `Ok(Err(why))` when the probe failed, `Err` when the backend
/// cannot even be set up.
async fn probed(
    driver: Driver,
    image: &GuestImage,
    cfg: &VmConfig,
) -> Result<Result<(Microvm, String), String>, String> {
    let vm = Microvm::new(driver, image.clone(), &cfg.state_dir)?;
    Ok(match vm.probe().await {
        Ok(took) => {
            let why = format!(
                "{}; a probe guest reached its agent in {} ms",
                vm.describe(),
                took.as_millis()
            );
            Ok((vm, why))
        }
        Err(e) => Err(format!("a probe guest did not reach its agent: {e}")),
    })
}

/// What `bin --version` prints on its first line after `prefix`, up to the first space.
pub(crate) fn version_after(bin: &Path, prefix: &str) -> Result<String, String> {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .filter(|_| out.status.success())
        .and_then(|l| l.trim().strip_prefix(prefix))
        .and_then(|v| v.split_whitespace().next())
        .map(str::to_owned)
        .ok_or_else(|| format!("{} does not answer --version as expected", bin.display()))
}

/// Removes the directories of VMs nobody runs any more (a server killed before its VMs
/// ended): a VM's directory is `NAME-PID-N` with a `lock` file its server holds locked for the
/// VM's life, so a lock taken here means no server has it. A VM's disk holds nothing the
/// snapshots do not.
fn remove_orphans(state_dir: &Path) {
    remove_unheld(state_dir, |_| true);
}

/// Room deletion: removes the directories (and so the workspace disks) of sandbox `name`'s VMs
/// that no server runs (the running one is destroyed first). Returns how many went.
pub fn remove_disks(state_dir: &Path, name: &str) -> u64 {
    let kept = kept_dir(state_dir, name);
    let kept = u64::from(kept.exists() && std::fs::remove_dir_all(&kept).is_ok());
    remove_unheld(state_dir, |vm| vm == name) + kept
}

/// Removes the `NAME-PID-N` directories in `state_dir` whose NAME `pick` takes and whose lock
/// nobody holds; returns how many it removed.
fn remove_unheld(state_dir: &Path, pick: impl Fn(&str) -> bool) -> u64 {
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let dir_name = e.file_name().to_string_lossy().into_owned();
        let parts: Vec<&str> = dir_name.split('-').collect();
        let vm = match parts.as_slice() {
            [n, p, c]
                if !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_alphanumeric())
                    && p.parse::<u32>().is_ok()
                    && c.parse::<u64>().is_ok() =>
            {
                *n
            }
            _ => continue,
        };
        if !pick(vm) {
            continue;
        }
        let held = std::fs::OpenOptions::new()
            .write(true)
            .open(e.path().join("lock"))
            .ok()
            .is_some_and(|f| {
                rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err()
            });
        if !held && std::fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    /// The tests that make VM directories run one at a time: `make_disk` forks `mkfs.ext4`,
    /// and a fork in one test holds, until its exec, a copy of whatever lock file another test
    /// has open at that moment, so an orphan's lock would look held for a moment.
    fn disk_tests() -> std::sync::MutexGuard<'static, ()> {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        ONE.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn console(text: &str) -> Console {
        let c = Console {
            kept: Arc::default(),
            done: Arc::default(),
            finished: Arc::default(),
        };
        c.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(text.as_bytes());
        c
    }

    #[test]
    fn the_reason_a_vm_ended_comes_from_what_it_said() {
        let exit = |code: i32| Some(std::process::ExitStatus::from_raw(code << 8));
        let signal = |sig: i32| Some(std::process::ExitStatus::from_raw(sig));
        let r = console("[ 1.0] Kernel panic - not syncing: Attempted to kill init!\r\n")
            .reason(exit(0));
        assert!(
            r.starts_with("the guest kernel panicked ([ 1.0] Kernel panic - not syncing"),
            "{r}"
        );
        let r = console("booting\n").reason(signal(9));
        assert_eq!(r, "the VMM process was killed by signal 9");
        let r = console("[ 9.1] Out of memory: Killed process 212 (awk)\n").reason(signal(9));
        assert!(
            r.ends_with("the guest had reported: [ 9.1] Out of memory: Killed process 212 (awk)"),
            "{r}"
        );
        let r = console("qemu-system-x86_64: -drive file=x: Could not open 'x'\n").reason(exit(1));
        assert_eq!(
            r,
            "the VMM failed (exit status 1): qemu-system-x86_64: -drive file=x: Could not open 'x'"
        );
        let r = console("coderoom-init: cannot mount the workspace disk\nreboot: Power down\n")
            .reason(exit(0));
        assert_eq!(
            r,
            "the guest powered off (exit status 0); its console's last line: reboot: Power down"
        );
        assert_eq!(
            console("").reason(None),
            "the guest powered off (unknown status)"
        );
    }

    #[test]
    fn disks_of_vms_whose_server_is_gone_are_removed() {
        let _one_at_a_time = disk_tests();
        let dir = tempfile::tempdir().expect("tempdir");
        let live = dir.path().join("room1-4242-1");
        let _held = make_disk(&live, MIN_DISK, None).expect("a VM's directory");
        let orphan = dir.path().join("room2-4242-3");
        drop(make_disk(&orphan, MIN_DISK, None).expect("a VM's directory"));
        let unlocked = dir.path().join("room3-1-1");
        let odd = dir.path().join("not-a-vm");
        for d in [&unlocked, &odd] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        remove_orphans(dir.path());
        assert!(
            live.join(DISK_FILE).exists(),
            "a VM that runs keeps its disk"
        );
        assert!(!orphan.exists(), "a VM nobody holds loses its disk");
        assert!(!unlocked.exists());
        assert!(odd.exists(), "what is not a VM's directory is left alone");
    }

    #[test]
    fn a_deleted_rooms_disks_go_and_no_others() {
        let _one_at_a_time = disk_tests();
        let dir = tempfile::tempdir().expect("tempdir");
        let left = [
            dir.path().join("room1-4242-1"),
            dir.path().join("room1-77-2"),
        ];
        for d in &left {
            drop(make_disk(d, MIN_DISK, None).expect("a VM's directory"));
        }
        let other = dir.path().join("room12-4242-1");
        let live = dir.path().join("room1-4242-3");
        drop(make_disk(&other, MIN_DISK, None).expect("a VM's directory"));
        let _held = make_disk(&live, MIN_DISK, None).expect("a VM's directory");
        assert_eq!(remove_disks(dir.path(), "room1"), 2);
        assert!(left.iter().all(|d| !d.exists()));
        assert!(other.exists(), "another room's disk stays");
        assert!(live.exists(), "a VM a server still runs keeps its disk");
        assert_eq!(remove_disks(&dir.path().join("missing"), "room1"), 0);
    }

    fn fingerprint() -> Fingerprint {
        Fingerprint {
            image: "abc".into(),
            vmm: "qemu".into(),
            vmm_version: "7.2.22".into(),
            accel: "tcg".into(),
            memory_bytes: 256 << 20,
            vcpus: 1,
            disk_bytes: MIN_DISK,
        }
    }

    /// A parked VM's directory, with a memory image when `memory`.
    fn park(state: &Path, name: &str, tag: &str, memory: bool) -> PathBuf {
        let vm = state.join(format!("{name}-1-1"));
        drop(make_disk(&vm, MIN_DISK, None).expect("a VM's directory"));
        let saved = memory.then(|| {
            std::fs::write(vm.join(MEMORY_FILE), b"saved machine").expect("memory");
            13
        });
        let to = kept_dir(state, name);
        let (kept, bytes) = keep_files(&vm, &to, tag, saved, &fingerprint()).expect("kept");
        // As the VM's watcher does once the VMM has ended.
        std::fs::remove_dir_all(&vm).expect("the VM's directory goes");
        assert_eq!(kept == crate::Keep::Memory, memory);
        assert!(bytes > 0);
        to
    }

    #[test]
    fn what_a_park_kept_is_resumed_only_under_its_own_tag_and_only_once() {
        let _one_at_a_time = disk_tests();
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path();
        let to = park(state, "room1", "snapshot-1.tar", true);
        let kept = take_kept(state, "room1", Some("snapshot-1.tar"), &fingerprint())
            .expect("kept under its tag");
        assert!(kept.record.memory);
        assert_eq!(kept.keep(), crate::Keep::Memory);
        assert!(!to.join(KEPT_RECORD).exists(), "taken once");
        assert!(
            take_kept(state, "room1", Some("snapshot-1.tar"), &fingerprint()).is_none(),
            "never taken twice"
        );

        // A newer snapshot (a rollback, a restored checkpoint) makes the kept disk stale.
        let to = park(state, "room2", "snapshot-1.tar", false);
        assert!(take_kept(state, "room2", Some("snapshot-2.tar"), &fingerprint()).is_none());
        assert!(!to.exists(), "a stale disk is removed");
        let to = park(state, "room3", "snapshot-1.tar", false);
        assert!(take_kept(state, "room3", None, &fingerprint()).is_none());
        assert!(!to.exists());

        // Another image or memory size: the disk still fits, the saved machine does not.
        park(state, "room4", "t", true);
        let other = Fingerprint {
            image: "def".into(),
            ..fingerprint()
        };
        let kept = take_kept(state, "room4", Some("t"), &other).expect("the disk fits");
        assert!(!kept.record.memory);
        assert!(!kept.dir.join(MEMORY_FILE).exists());
        // Another disk size: nothing fits.
        park(state, "room5", "t", false);
        let bigger = Fingerprint {
            disk_bytes: MIN_DISK * 2,
            ..fingerprint()
        };
        assert!(take_kept(state, "room5", Some("t"), &bigger).is_none());

        // Adopted into a new VM's directory; deletion removes a kept disk too.
        let kept = take_kept(state, "room4", Some("t"), &fingerprint());
        assert!(kept.is_none(), "room4's record was taken above");
        park(state, "room6", "t", true);
        let kept = take_kept(state, "room6", Some("t"), &fingerprint()).expect("kept");
        let vm = state.join("room6-2-1");
        drop(adopt_kept(&vm, &kept, None).expect("adopted"));
        assert!(vm.join(DISK_FILE).is_file() && vm.join(MEMORY_FILE).is_file());
        assert!(!kept_dir(state, "room6").exists());
        park(state, "room7", "t", false);
        assert_eq!(remove_disks(state, "room7"), 1);
        assert!(!kept_dir(state, "room7").exists());
        remove_orphans(state);
        assert!(
            state.join("kept").is_dir(),
            "the orphan sweep leaves what is kept"
        );
    }

    /// What a VMM's uid could have planted in a saved machine (a symlink, a FIFO) is neither
    /// followed nor waited on by root: a sync refuses it, a chown changes the link itself.
    #[test]
    fn planted_links_and_fifos_in_a_saved_machine_are_not_followed() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("host-file");
        std::fs::write(&target, b"root's").expect("target");
        let owner = std::fs::metadata(&target).expect("meta").uid();
        let saved = dir.path().join(MEMORY_FILE);
        std::fs::create_dir(&saved).expect("dir");
        std::os::unix::fs::symlink(&target, saved.join("state.json")).expect("link");
        assert!(sync_tree(&saved).is_err(), "a link inside is refused");
        if rustix::process::geteuid().is_root() {
            chown_tree(&saved, 54321).expect("chowned");
            assert_eq!(
                std::fs::metadata(&target).expect("meta").uid(),
                owner,
                "target untouched"
            );
        }
        std::fs::remove_file(saved.join("state.json")).expect("rm");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            saved.join("memory-ranges"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        assert!(
            sync_tree(&saved).is_err(),
            "a FIFO is refused, not waited on"
        );
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(dir.path(), &linked).expect("dir link");
        assert!(sync_tree(&linked).is_err(), "a linked directory is refused");
    }

    /// A cloud-hypervisor snapshot is a directory (configuration, device state, memory): it is
    /// kept, counted, adopted and dropped whole, as QEMU's one file is.
    #[test]
    fn a_saved_machine_kept_as_a_directory_goes_whole_wherever_it_goes() {
        let _one_at_a_time = disk_tests();
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path();
        let vm = state.join("room1-1-1");
        drop(make_disk(&vm, MIN_DISK, None).expect("a VM's directory"));
        let saved = vm.join(MEMORY_FILE);
        std::fs::create_dir(&saved).expect("snapshot dir");
        for (f, n) in [
            ("config.json", 10),
            ("state.json", 20),
            ("memory-ranges", 4096),
        ] {
            std::fs::write(saved.join(f), vec![b'x'; n]).expect("file");
        }
        assert_eq!(sync_tree(&saved).expect("synced"), 4126);
        let to = kept_dir(state, "room1");
        let (kept, bytes) = keep_files(&vm, &to, "t", Some(4126), &fingerprint()).expect("kept");
        std::fs::remove_dir_all(&vm).expect("the VM's directory goes");
        assert_eq!(kept, crate::Keep::Memory);
        assert!(bytes >= 4126, "{bytes}");
        let kept = take_kept(state, "room1", Some("t"), &fingerprint()).expect("taken");
        assert!(kept.record.memory);
        let next = state.join("room1-2-1");
        drop(adopt_kept(&next, &kept, None).expect("adopted"));
        assert_eq!(
            std::fs::read(next.join(MEMORY_FILE).join("memory-ranges"))
                .expect("moved")
                .len(),
            4096
        );

        // One that no longer fits is removed whole, the disk kept.
        std::fs::remove_dir_all(&next).expect("gone");
        let vm = state.join("room2-1-1");
        drop(make_disk(&vm, MIN_DISK, None).expect("a VM's directory"));
        std::fs::create_dir(vm.join(MEMORY_FILE)).expect("snapshot dir");
        std::fs::write(vm.join(MEMORY_FILE).join("state.json"), b"{}").expect("file");
        keep_files(&vm, &kept_dir(state, "room2"), "t", Some(2), &fingerprint()).expect("kept");
        let other = Fingerprint {
            memory_bytes: 512 << 20,
            ..fingerprint()
        };
        let kept = take_kept(state, "room2", Some("t"), &other).expect("the disk fits");
        assert!(!kept.record.memory);
        assert!(!kept.dir.join(MEMORY_FILE).exists());
        assert!(kept.dir.join(DISK_FILE).is_file());
    }
}

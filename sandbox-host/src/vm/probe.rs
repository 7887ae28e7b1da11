//! Choosing the VMM: the guest image, each candidate's version, and a probe guest booted to
//! its agent under it.

use super::{
    ch, find_program, image, kvm_usable, qemu, Accel, Driver, GuestImage, Microvm, VmConfig,
    VmmKind, MIN_DISK,
};
use crate::{Chain, Limits, StartError};
use std::path::{Path, PathBuf};

/// Why the microVM tier cannot be set up on this host.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// There is no guest image, and none is built now.
    #[error("no guest image in {} (run `coderoom image build`)", .dir.display())]
    NoImage {
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// Building the guest image failed.
    #[error("cannot build the guest image")]
    Build(#[source] super::ImageError),
    /// The image build's blocking task did not finish.
    #[error("the image build failed")]
    BuildTask(#[source] tokio::task::JoinError),
    /// `auto` picks a VMM only when the server is root.
    #[error("not root: a VMM of its own uid and cgroup needs the server to run as root (--sandbox-tier microvm runs it anyway)")]
    NotRoot,
    /// `/dev/kvm` does not open.
    #[error("cannot open /dev/kvm")]
    Kvm(#[source] std::io::Error),
    /// The VMM's binary could not be run.
    #[error("cannot run {}", .0.display())]
    Run(PathBuf, #[source] std::io::Error),
    /// The VMM's binary answered `--version` with something else than its version.
    #[error("{} does not answer --version as expected", .bin.display())]
    Version {
        /// The binary.
        bin: PathBuf,
    },
    /// The directory for the VMs' disks could not be made.
    #[error("cannot create {}", .0.display())]
    StateDir(PathBuf, #[source] std::io::Error),
    /// A probe guest did not reach its agent under the candidate VMM.
    #[error("a probe guest did not reach its agent")]
    Probe(#[source] StartError),
    /// No candidate VMM is usable: each one's reason, in words.
    #[error("{}", .0.join("; "))]
    NoVmm(Vec<String>),
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
    pub async fn probe(&self) -> Result<std::time::Duration, StartError> {
        let t0 = std::time::Instant::now();
        match self.start("probe", &probe_limits()).await {
            Ok((sandbox, _events, _receipt)) => {
                let took = t0.elapsed();
                sandbox.kill();
                let _ = sandbox.ended().await;
                Ok(took)
            }
            Err(e) => Err(e),
        }
    }
}

/// The guest image: the current one, else (when `build` and the configuration allow it)
/// built now.
pub async fn image_for(cfg: &VmConfig, build: bool) -> Result<GuestImage, SetupError> {
    if let Some(image) = GuestImage::current(&cfg.image_dir) {
        return Ok(image);
    }
    if !(build && cfg.build_on_need) {
        return Err(SetupError::NoImage {
            dir: cfg.image_dir.clone(),
        });
    }
    let dir = cfg.image_dir.clone();
    let inputs = cfg.inputs.clone();
    tracing::info!(dir = %dir.display(), "building the VM guest image (first use)");
    tokio::task::spawn_blocking(move || {
        image::build(&dir, &inputs, &mut |line| tracing::info!("image: {line}"))
    })
    .await
    .map_err(SetupError::BuildTask)?
    .map_err(SetupError::Build)
}

/// Picks the VMM for the microVM tier. `auto` (the tier was not asked for by name) never
/// builds an image and never picks software emulation; each candidate must boot a real guest
/// to its agent within the deadline. `Err` carries every candidate's reason.
pub async fn choose(cfg: &VmConfig, auto: bool) -> Result<(Microvm, String), SetupError> {
    let image = image_for(cfg, !auto).await?;
    if auto && !rustix::process::geteuid().is_root() {
        // Without root the VMM would run as the server's own uid, with no cgroup: a guest
        // that escaped into it would hold the server's keys. Only by name, then.
        return Err(SetupError::NotRoot);
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
                (Err(e), _) => reasons.push(format!("cloud-hypervisor: needs KVM: {}", Chain(&e))),
                (_, Err(e)) => reasons.push(format!("cloud-hypervisor: {}", Chain(&e))),
                (Ok(()), Ok(version)) => {
                    let driver = Driver::CloudHypervisor { bin, version };
                    match probed(driver, &image, cfg).await? {
                        Ok(chosen) => return Ok(chosen),
                        Err(e) => reasons.push(format!("cloud-hypervisor: {}", Chain(&e))),
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
                Err(e) => reasons.push(format!("qemu: {}", Chain(&e))),
                Ok(version) => {
                    let kvm_asked = cfg.accel != Some(Accel::Tcg);
                    if kvm_asked {
                        match kvm_usable() {
                            Err(e) => reasons.push(format!("qemu with KVM: {}", Chain(&e))),
                            Ok(()) => {
                                let driver = Driver::Qemu {
                                    bin: bin.clone(),
                                    version: version.clone(),
                                    accel: Accel::Kvm,
                                };
                                match probed(driver, &image, cfg).await? {
                                    Ok(chosen) => return Ok(chosen),
                                    Err(e) => reasons.push(format!("qemu with KVM: {}", Chain(&e))),
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
    Err(SetupError::NoVmm(reasons))
}

/// A backend for `driver` once a probe guest has reached its agent under it: `Ok(Ok(..))` with
/// the sentence that says so, `Ok(Err(why))` when the probe failed, `Err` when the backend
/// cannot even be set up.
async fn probed(
    driver: Driver,
    image: &GuestImage,
    cfg: &VmConfig,
) -> Result<Result<(Microvm, String), SetupError>, SetupError> {
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
        Err(e) => Err(SetupError::Probe(e)),
    })
}

/// What `bin --version` prints on its first line after `prefix`, up to the first space.
pub(crate) fn version_after(bin: &Path, prefix: &str) -> Result<String, SetupError> {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|source| SetupError::Run(bin.to_path_buf(), source))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .filter(|_| out.status.success())
        .and_then(|l| l.trim().strip_prefix(prefix))
        .and_then(|v| v.split_whitespace().next())
        .map(str::to_owned)
        .ok_or_else(|| SetupError::Version {
            bin: bin.to_path_buf(),
        })
}

//! The VM guest image: a Debian cloud kernel and an initramfs holding busybox, the kernel's
//! virtio modules, the static `coderoom-agent` and an init that mounts the workspace disk and
//! starts the agent on its channel.
//!
//! Built by `coderoom image build` (or on first need), into `IMAGE_DIR/<hash>/`, where `<hash>`
//! is the SHA-256 of the kernel, the initramfs and the userland disk's file list: the same
//! inputs give the same hash (the archive is written in a fixed order with fixed times), so a
//! rebuild reuses the directory.
//! `IMAGE_DIR/current` names the image in use; every receipt carries its hash.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Modules the init loads, by what the guest needs; their dependencies are found from each
/// module's own `depends=` and loaded first.
const WANTED_MODULES: [&str; 4] = [
    // PCI transport, the workspace disk, the QEMU agent channel (virtio-serial port).
    "virtio_pci",
    "virtio_blk",
    "virtio_console",
    // cloud-hypervisor's agent channel (hybrid vsock).
    "vmw_vsock_virtio_transport",
];

/// The name of the virtio-serial port the agent serves on (QEMU).
pub const AGENT_PORT_NAME: &str = "coderoom.agent";
/// The vsock port the agent listens on (cloud-hypervisor).
pub const AGENT_VSOCK_PORT: u32 = 1024;
/// Version of the init and layout below; part of every image's manifest.
const LAYOUT_VERSION: u32 = 4;

/// The guest's `/init`: mounts, modules, loopback, the workspace disk, then the agent as PID 1
/// on the channel the kernel command line names (`coderoom.channel=port:NAME|vsock:PORT`),
/// with room code's process limit from `coderoom.pids=N`.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/local/bin:/usr/bin:/bin
# The initramfs's root is the kernel's, open to everyone: room code may not write beside /init.
chmod 0755 /
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
mount -t devtmpfs -o nosuid devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run/coderoom
mount -t devpts -o nosuid,noexec,gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /tmp
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
while read -r m; do insmod "/lib/modules/$m.ko" || echo "coderoom-init: cannot load $m"; done < /etc/coderoom/modules
ip link set lo up
hostname coderoom
i=0
while ! ws=$(findfs LABEL=workspace 2>/dev/null) && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
if ul=$(findfs LABEL=userland 2>/dev/null); then
  mount -t ext4 -o ro,nodev "$ul" /usr || echo "coderoom-init: cannot mount the userland disk"
fi
if ! mount -t ext4 -o nosuid,nodev "$ws" /workspace; then
  echo "coderoom-init: cannot mount the workspace disk"
  poweroff -f
fi
# mkfs's lost+found is root's: it would be in every snapshot and refused at every restore.
rmdir /workspace/lost+found 2>/dev/null
channel=
pids=
for word in $(cat /proc/cmdline); do
  case "$word" in
    coderoom.channel=port:*) channel="--port ${word#coderoom.channel=port:}" ;;
    coderoom.channel=vsock:*) channel="--vsock ${word#coderoom.channel=vsock:}" ;;
    coderoom.pids=*) pids=${word#coderoom.pids=} ;;
  esac
done
# The sandbox's pids limit: room code (uid 1000) runs at most this many processes and threads
# at once; the agent, as root, is not held by it.
if [ -n "$pids" ]; then ulimit -u "$pids" || echo "coderoom-init: cannot limit processes"; fi
echo "coderoom-init: starting the agent ($channel)"
exec /sbin/coderoom-agent $channel
"#;

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\ncoder:x:1000:1000:coder:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n";
const GROUP: &str = "root:x:0:\ntty:x:5:\ncoder:x:1000:\nnogroup:x:65534:\n";
const HOSTS: &str = "127.0.0.1 localhost coderoom\n::1 localhost\n";

/// Debian packages whose files under `/usr` (with the libraries their programs load) make the
/// guest's userland disk, mounted read-only at `/usr`: Python 3, git, and a C compiler (GCC 12
/// with binutils and the C library's headers and startup files; no C++, no LTO). Those not
/// installed on the building host are left out, and the manifest says what the guest has.
const USERLAND_PACKAGES: [&str; 16] = [
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
    "python3.11",
    "python3-minimal",
    "python3",
    "git",
    "cpp-12",
    "gcc-12",
    "cpp",
    "gcc",
    "binutils",
    "binutils-x86-64-linux-gnu",
    "libc6-dev",
    "libgcc-12-dev",
    "linux-libc-dev",
];
/// Parts of those packages the guest does without (documentation, test suites, link-time
/// optimisation: 64 MiB of GCC's 70, sanitizer runtimes).
const USERLAND_SKIP: [&str; 19] = [
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/share/locale",
    "/usr/share/lintian",
    "/usr/share/bug",
    "/usr/share/info",
    "/usr/share/bash-completion",
    "/usr/share/gitweb",
    "/usr/share/gitk",
    "/usr/share/perl5",
    "/usr/lib/python3.11/test",
    "/usr/lib/python3.11/idlelib",
    "/usr/lib/gcc/x86_64-linux-gnu/12/lto1",
    "/usr/bin/x86_64-linux-gnu-lto-dump-12",
    "/usr/lib/gcc/x86_64-linux-gnu/12/libasan",
    "/usr/lib/gcc/x86_64-linux-gnu/12/libtsan",
    "/usr/lib/gcc/x86_64-linux-gnu/12/liblsan",
    "/usr/lib/gcc/x86_64-linux-gnu/12/libubsan",
    "/usr/lib/gcc/x86_64-linux-gnu/12/libhwasan",
];

/// What an image was built from, written beside it as `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// SHA-256 of the kernel then the initramfs, hex.
    pub hash: String,
    /// The kernel's release (`6.1.0-57-cloud-amd64`).
    pub kernel_release: String,
    /// The Debian package the kernel came from.
    pub kernel_package: String,
    /// Modules in the order the init loads them.
    pub modules: Vec<String>,
    /// The agent's crate version.
    pub agent_version: String,
    /// What the guest offers beside the agent.
    pub userland: String,
    /// [`LAYOUT_VERSION`].
    pub layout: u32,
}

/// A built image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestImage {
    /// Its directory.
    pub dir: PathBuf,
    /// What it holds.
    pub manifest: Manifest,
}

impl GuestImage {
    /// The kernel (bzImage).
    pub fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }

    /// The initramfs (uncompressed newc cpio).
    pub fn initramfs(&self) -> PathBuf {
        self.dir.join("initramfs.cpio")
    }

    /// The read-only userland disk (`/usr` in the guest), when the image has one.
    pub fn userland(&self) -> Option<PathBuf> {
        Some(self.dir.join("userland.img")).filter(|p| p.is_file())
    }

    /// The image named by `IMAGE_DIR/current`, if one was built.
    pub fn current(image_dir: &Path) -> Option<GuestImage> {
        let hash = std::fs::read_to_string(image_dir.join("current")).ok()?;
        let hash = hash.trim();
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let dir = image_dir.join(hash);
        let manifest: Manifest =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).ok()?).ok()?;
        if manifest.hash != hash {
            return None;
        }
        let image = GuestImage { dir, manifest };
        (image.kernel().is_file() && image.initramfs().is_file()).then_some(image)
    }
}

/// Where the inputs come from; unset ones are found (see [`build`]).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// A `linux-image-*-cloud-amd64` package file.
    pub kernel_deb: Option<PathBuf>,
    /// A statically linked busybox.
    pub busybox: Option<PathBuf>,
    /// The statically linked `coderoom-agent`.
    pub agent: Option<PathBuf>,
}

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// An input is missing or unusable; the text says what to do.
    #[error("{0}")]
    Input(String),
    /// A tool the build runs failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The program.
        tool: &'static str,
        /// What it said.
        detail: String,
    },
    /// Reading or writing files failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Io { what, source }
}

/// Builds the guest image into `image_dir` (or finds the identical one already there), makes
/// it current and returns it. `progress` gets a line per step.
///
/// Inputs not given are found: the kernel package in `IMAGE_DIR/cache/` or else downloaded
/// there with `apt-get download` (the package `linux-image-cloud-amd64` depends on);
/// busybox at `/bin/busybox` when that is static (Debian's `busybox-static`); the agent as
/// `coderoom-agent` beside the running executable.
pub fn build(
    image_dir: &Path,
    inputs: &Inputs,
    progress: &mut dyn FnMut(&str),
) -> Result<GuestImage, ImageError> {
    std::fs::create_dir_all(image_dir).map_err(io(format!("create {}", image_dir.display())))?;
    let deb = match &inputs.kernel_deb {
        Some(p) => p.clone(),
        None => find_or_fetch_kernel(&image_dir.join("cache"), progress)?,
    };
    let busybox = match &inputs.busybox {
        Some(p) => p.clone(),
        None => PathBuf::from("/bin/busybox"),
    };
    require_static(
        &busybox,
        "busybox",
        "install Debian's busybox-static or pass --busybox",
    )?;
    let agent = match &inputs.agent {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(io("find the running executable"))?
            .with_file_name("coderoom-agent"),
    };
    require_static(
        &agent,
        "coderoom-agent",
        "build it with deploy/guest/build-agent.sh and pass --agent",
    )?;

    let work = tempdir_in(image_dir)?;
    let result = assemble(image_dir, &work, &deb, &busybox, &agent, progress);
    let _ = std::fs::remove_dir_all(&work);
    let image = result?;
    let tmp = image_dir.join("current.tmp");
    std::fs::write(&tmp, &image.manifest.hash).map_err(io("write current"))?;
    std::fs::rename(&tmp, image_dir.join("current")).map_err(io("write current"))?;
    Ok(image)
}

fn tempdir_in(dir: &Path) -> Result<PathBuf, ImageError> {
    let path = dir.join(format!(".build-{}-{}", std::process::id(), nanos()));
    std::fs::create_dir(&path).map_err(io(format!("create {}", path.display())))?;
    Ok(path)
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn assemble(
    image_dir: &Path,
    work: &Path,
    deb: &Path,
    busybox: &Path,
    agent: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<GuestImage, ImageError> {
    progress(&format!("unpacking {}", deb.display()));
    let tree = work.join("kernel");
    run(
        "dpkg-deb",
        std::process::Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb)
            .arg(&tree),
    )?;
    let (kernel, release) = find_kernel(&tree)?;
    let package = deb
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let modules_dir = tree.join("lib/modules").join(&release);
    let found = index_modules(&modules_dir)?;
    let order = load_order(&found, &WANTED_MODULES)?;
    progress(&format!("kernel {release}; modules {}", order.join(", ")));

    let mut cpio = Cpio::default();
    for dir in [
        "bin",
        "sbin",
        "dev",
        "etc",
        "etc/coderoom",
        "etc/ssl",
        "etc/ssl/certs",
        "lib",
        "lib/modules",
        "proc",
        "root",
        "run",
        "sys",
        "tmp",
        "usr",
        "usr/bin",
        "usr/local",
        "usr/local/bin",
        "workspace",
    ] {
        cpio.dir(dir, 0o755);
    }
    // The dynamic loader's path (`/lib64/ld-linux-x86-64.so.2`) leads to the userland disk.
    cpio.symlink("lib64", "usr/lib64");
    // Debian's links into merged /usr name /lib/x86_64-linux-gnu (the loader's among them);
    // /lib itself stays the initramfs's, for the modules.
    cpio.symlink("lib/x86_64-linux-gnu", "../usr/lib/x86_64-linux-gnu");
    cpio.file("init", 0o755, INIT.as_bytes().to_vec());
    cpio.file("bin/busybox", 0o755, read(busybox)?);
    cpio.file("sbin/coderoom-agent", 0o755, read(agent)?);
    for name in &order {
        cpio.file(
            &format!("lib/modules/{name}.ko"),
            0o644,
            read(&found[name])?,
        );
    }
    cpio.file(
        "etc/coderoom/modules",
        0o644,
        format!("{}\n", order.join("\n")).into_bytes(),
    );
    cpio.file("etc/passwd", 0o644, PASSWD.as_bytes().to_vec());
    cpio.file("etc/group", 0o644, GROUP.as_bytes().to_vec());
    cpio.file("etc/hosts", 0o644, HOSTS.as_bytes().to_vec());
    if let Ok(bundle) = std::fs::read("/etc/ssl/certs/ca-certificates.crt") {
        cpio.file("etc/ssl/certs/ca-certificates.crt", 0o644, bundle);
    }
    let initramfs = cpio.finish();
    let kernel_bytes = read(&kernel)?;
    let userland = userland(work, progress)?;
    let mut h = Sha256::new();
    h.update(&kernel_bytes);
    h.update(&initramfs);
    if let Some(u) = &userland {
        h.update(&u.listing);
    }
    let hash = hex::encode(h.finalize());
    let manifest = Manifest {
        hash: hash.clone(),
        kernel_release: release,
        kernel_package: package,
        modules: order,
        agent_version: crate::VERSION.to_owned(),
        userland: match &userland {
            Some(u) => format!(
                "busybox (sh and the core utilities); from the host's Debian packages, read-only at /usr: {}",
                u.packages.join(", ")
            ),
            None => "busybox (sh and the core utilities) only: the host has none of the userland packages".into(),
        },
        layout: LAYOUT_VERSION,
    };
    let dir = image_dir.join(&hash);
    if dir.join("manifest.json").is_file() {
        progress(&format!("image {hash} is already built"));
        return Ok(GuestImage { dir, manifest });
    }
    let staged = work.join("image");
    std::fs::create_dir(&staged).map_err(io("create the image directory"))?;
    std::fs::write(staged.join("vmlinuz"), &kernel_bytes).map_err(io("write the kernel"))?;
    std::fs::write(staged.join("initramfs.cpio"), &initramfs).map_err(io("write the initramfs"))?;
    if let Some(u) = &userland {
        std::fs::rename(&u.image, staged.join("userland.img"))
            .map_err(io("move the userland disk"))?;
    }
    let json = serde_json::to_vec_pretty(&manifest).unwrap_or_default();
    std::fs::write(staged.join("manifest.json"), json).map_err(io("write the manifest"))?;
    std::fs::rename(&staged, &dir).map_err(io(format!("move the image to {}", dir.display())))?;
    progress(&format!(
        "built image {hash} ({} KiB kernel, {} KiB initramfs)",
        kernel_bytes.len() / 1024,
        initramfs.len() / 1024
    ));
    Ok(GuestImage { dir, manifest })
}

/// The userland disk made: its file, what went in (paths, sizes, modification times, link
/// targets: part of the image's hash, as the disk's own bytes carry random ext4 ids), and from
/// which packages.
struct Userland {
    image: PathBuf,
    listing: Vec<u8>,
    packages: Vec<String>,
}

/// Copies the userland packages' files under `/usr` and the libraries their programs load into
/// a tree, and makes it a read-only ext4 disk (`mkfs.ext4 -d`). `None` when no package is there.
fn userland(work: &Path, progress: &mut dyn FnMut(&str)) -> Result<Option<Userland>, ImageError> {
    let mut wanted = std::collections::BTreeSet::new();
    let mut packages = Vec::new();
    for pkg in USERLAND_PACKAGES {
        let Ok(list) = run("dpkg", std::process::Command::new("dpkg").args(["-L", pkg])) else {
            continue;
        };
        packages.push(pkg.to_owned());
        for line in list.lines() {
            let path = line.trim();
            if path.starts_with("/usr/") && !USERLAND_SKIP.iter().any(|s| path.starts_with(s)) {
                wanted.insert(PathBuf::from(path));
            }
        }
    }
    if packages.is_empty() {
        return Ok(None);
    }
    // The libraries every program and module loads, found the way the host's loader finds them.
    let programs: Vec<PathBuf> = wanted
        .iter()
        .filter(|p| {
            std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
                && std::fs::File::open(p)
                    .and_then(|mut f| {
                        let mut magic = [0u8; 4];
                        std::io::Read::read_exact(&mut f, &mut magic).map(|()| magic)
                    })
                    .is_ok_and(|m| &m == b"\x7fELF")
        })
        .cloned()
        .collect();
    for prog in &programs {
        let Ok(out) = run("ldd", std::process::Command::new("ldd").arg(prog)) else {
            continue;
        };
        for line in out.lines() {
            let lib = line
                .split("=> ")
                .nth(1)
                .unwrap_or(line)
                .trim()
                .split(' ')
                .next()
                .unwrap_or("");
            if lib.starts_with('/') {
                // Merged /usr: /lib and /lib64 are links into it.
                let lib = if lib.starts_with("/usr/") {
                    PathBuf::from(lib)
                } else {
                    Path::new("/usr").join(lib.trim_start_matches('/'))
                };
                wanted.insert(lib);
            }
        }
    }
    // Each link's target too (libfoo.so.1 -> libfoo.so.1.2.3).
    let links: Vec<PathBuf> = wanted.iter().cloned().collect();
    for p in links {
        if let Ok(real) = std::fs::canonicalize(&p) {
            if real.starts_with("/usr") {
                wanted.insert(real);
            }
        }
    }
    let tree = work.join("userland");
    let mut listing = Vec::new();
    let mut bytes = 0u64;
    for p in &wanted {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            continue;
        };
        let Ok(rel) = p.strip_prefix("/usr") else {
            continue;
        };
        let dest = tree.join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(p).map_err(io(format!("read {}", p.display())))?;
            let _ = std::os::unix::fs::symlink(&target, &dest);
            listing
                .extend_from_slice(format!("{} -> {}\n", p.display(), target.display()).as_bytes());
        } else if meta.is_file() {
            std::fs::copy(p, &dest).map_err(io(format!("copy {}", p.display())))?;
            bytes += meta.len();
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            listing
                .extend_from_slice(format!("{} {} {mtime}\n", p.display(), meta.len()).as_bytes());
        }
    }
    let image = work.join("userland.img");
    let size = (bytes + bytes / 4 + (32 << 20)).div_ceil(1 << 20) << 20;
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(size))
        .map_err(io("create the userland disk"))?;
    run(
        "mkfs.ext4",
        std::process::Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-O",
                "^has_journal",
                "-L",
                "userland",
                "-d",
            ])
            .arg(&tree)
            .arg(&image),
    )?;
    progress(&format!(
        "userland disk: {} files, {} MiB, from {}",
        wanted.len(),
        size >> 20,
        packages.join(", ")
    ));
    Ok(Some(Userland {
        image,
        listing,
        packages,
    }))
}

fn read(path: &Path) -> Result<Vec<u8>, ImageError> {
    std::fs::read(path).map_err(io(format!("read {}", path.display())))
}

fn run(tool: &'static str, cmd: &mut std::process::Command) -> Result<String, ImageError> {
    let out = cmd.output().map_err(|e| ImageError::Tool {
        tool,
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(ImageError::Tool {
            tool,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The newest `linux-image-*-cloud-amd64_*.deb` in `cache`, downloaded there first if none is.
fn find_or_fetch_kernel(
    cache: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, ImageError> {
    std::fs::create_dir_all(cache).map_err(io(format!("create {}", cache.display())))?;
    if let Some(deb) = newest_kernel_deb(cache) {
        return Ok(deb);
    }
    progress("downloading the kernel package (apt-get download)");
    let depends = run(
        "apt-cache",
        std::process::Command::new("apt-cache").args(["depends", "linux-image-cloud-amd64"]),
    )?;
    let package = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-") && p.ends_with("-cloud-amd64"))
        .ok_or_else(|| {
            ImageError::Input(
                "no linux-image-*-cloud-amd64 package is known to apt; pass --kernel-deb".into(),
            )
        })?
        .to_owned();
    run(
        "apt-get",
        std::process::Command::new("apt-get")
            .args(["download", &package])
            .current_dir(cache),
    )?;
    newest_kernel_deb(cache).ok_or_else(|| {
        ImageError::Input(format!("apt-get download {package} left no package file"))
    })
}

fn newest_kernel_deb(cache: &Path) -> Option<PathBuf> {
    let mut debs: Vec<PathBuf> = std::fs::read_dir(cache)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("linux-image-") && n.contains("-cloud-amd64_") && n.ends_with(".deb")
            })
        })
        .collect();
    // The one fetched last (file names do not sort by version: 6.1.0-9 after 6.1.0-10).
    debs.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    debs.pop()
}

/// `boot/vmlinuz-RELEASE` in the unpacked package.
fn find_kernel(tree: &Path) -> Result<(PathBuf, String), ImageError> {
    let boot = tree.join("boot");
    let entries = std::fs::read_dir(&boot).map_err(io(format!("read {}", boot.display())))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(release) = name.strip_prefix("vmlinuz-") {
            return Ok((e.path(), release.to_owned()));
        }
    }
    Err(ImageError::Input(
        "the kernel package holds no boot/vmlinuz-*".into(),
    ))
}

/// Every `*.ko` under `dir`, by module name (dashes read as underscores, as the kernel does).
fn index_modules(dir: &Path) -> Result<BTreeMap<String, PathBuf>, ImageError> {
    let mut found = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(io(format!("read {}", d.display())))?;
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(stem) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".ko"))
            {
                found.insert(stem.replace('-', "_"), path);
            }
        }
    }
    Ok(found)
}

/// The modules' `depends=` field, from their `.modinfo` strings.
fn depends_of(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"depends=";
    ko.windows(KEY.len())
        .position(|w| w == KEY)
        .map(|at| {
            let rest = &ko[at + KEY.len()..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end])
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| d.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

/// `wanted` and everything they depend on, dependencies first. A wanted module that is not a
/// module is taken to be built in (the kernel's config decides); a dependency that is missing
/// is an error.
fn load_order(
    found: &BTreeMap<String, PathBuf>,
    wanted: &[&str],
) -> Result<Vec<String>, ImageError> {
    fn visit(
        name: &str,
        found: &BTreeMap<String, PathBuf>,
        order: &mut Vec<String>,
        seen: &mut std::collections::BTreeSet<String>,
    ) -> Result<(), ImageError> {
        if !seen.insert(name.to_owned()) {
            return Ok(());
        }
        let path = found
            .get(name)
            .ok_or_else(|| ImageError::Input(format!("the kernel package has no module {name}")))?;
        let bytes = read(path)?;
        for dep in depends_of(&bytes) {
            visit(&dep, found, order, seen)?;
        }
        order.push(name.to_owned());
        Ok(())
    }
    let mut order = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for w in wanted {
        if found.contains_key(*w) {
            visit(w, found, &mut order, &mut seen)?;
        }
    }
    Ok(order)
}

/// Refuses a program that needs a dynamic loader: the guest has no libraries.
fn require_static(path: &Path, what: &str, fix: &str) -> Result<(), ImageError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ImageError::Input(format!("{what} at {}: {e}; {fix}", path.display())))?;
    match elf_interpreter(&bytes) {
        Some(false) => Ok(()),
        Some(true) => Err(ImageError::Input(format!(
            "{what} at {} is dynamically linked; {fix}",
            path.display()
        ))),
        None => Err(ImageError::Input(format!(
            "{what} at {} is not an x86-64 ELF program; {fix}",
            path.display()
        ))),
    }
}

/// Whether an ELF64 little-endian program asks for an interpreter (`PT_INTERP`); `None` when
/// the bytes are not one.
fn elf_interpreter(bytes: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if bytes.get(..4)? != b"\x7fELF" || *bytes.get(4)? != 2 || *bytes.get(5)? != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    if u16_at(18)? != 62 {
        return None; // not x86-64
    }
    let phoff = usize::try_from(u64_at(32)?).ok()?;
    let phentsize = usize::from(u16_at(54)?);
    let phnum = usize::from(u16_at(56)?);
    let mut interp = false;
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let p_type = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?);
        interp |= p_type == PT_INTERP;
    }
    Some(interp)
}

/// A newc ("070701") cpio archive, as the kernel unpacks an initramfs: entries in the order
/// added, every time and owner zero, so the same content gives the same bytes.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str, perm: u32) {
        self.entry(name, 0o040_000 | perm, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: Vec<u8>) {
        self.entry(name, 0o100_000 | perm, &data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, target.as_bytes());
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let nlink = if mode & 0o040_000 != 0 { 2 } else { 1 };
        let fields = [
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            u32::try_from(data.len()).unwrap_or(u32::MAX),
            0,
            0,
            0,
            0,
            u32::try_from(name.len() + 1).unwrap_or(u32::MAX),
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_are_read_from_modinfo() {
        let ko =
            b"\x00license=GPL\x00depends=virtio,virtio_ring,virtio-pci-modern-dev\x00name=x\x00";
        assert_eq!(
            depends_of(ko),
            ["virtio", "virtio_ring", "virtio_pci_modern_dev"]
        );
        assert!(depends_of(b"\x00depends=\x00").is_empty());
        assert!(depends_of(b"nothing here").is_empty());
    }

    #[test]
    fn load_order_puts_dependencies_first_and_refuses_missing_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let put = |name: &str, deps: &str| {
            let p = dir.path().join(format!("{name}.ko"));
            std::fs::write(&p, format!("\0depends={deps}\0")).expect("write");
            (name.to_owned(), p)
        };
        let found: BTreeMap<_, _> = [
            put("virtio", ""),
            put("virtio_ring", ""),
            put("virtio_pci", "virtio,virtio_ring"),
            put("virtio_blk", "virtio,virtio_ring"),
            put("broken", "absent"),
        ]
        .into_iter()
        .collect();
        let order =
            load_order(&found, &["virtio_pci", "virtio_blk", "builtin_one"]).expect("order");
        assert_eq!(order, ["virtio", "virtio_ring", "virtio_pci", "virtio_blk"]);
        assert!(matches!(
            load_order(&found, &["broken"]),
            Err(ImageError::Input(m)) if m.contains("absent")
        ));
    }

    #[test]
    fn static_programs_are_told_from_dynamic_ones() {
        let exe = std::fs::read("/proc/self/exe").expect("self");
        // The test binary is linked dynamically.
        assert_eq!(elf_interpreter(&exe), Some(true));
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        let mut fake = vec![0u8; 64];
        fake[..4].copy_from_slice(b"\x7fELF");
        fake[4] = 2;
        fake[5] = 1;
        fake[18] = 62;
        assert_eq!(elf_interpreter(&fake), Some(false));
    }

    #[test]
    fn the_archive_is_newc_and_the_same_for_the_same_content() {
        let make = || {
            let mut c = Cpio::default();
            c.dir("etc", 0o755);
            c.file("etc/hosts", 0o644, b"127.0.0.1 localhost\n".to_vec());
            c.finish()
        };
        let a = make();
        assert_eq!(a, make());
        assert!(a.starts_with(b"070701"));
        assert!(a.len().is_multiple_of(4));
        let trailer = a
            .windows(10)
            .position(|w| w == b"TRAILER!!!")
            .expect("trailer");
        assert!(trailer > 0);
        assert!(a.windows(20).any(|w| w == b"127.0.0.1 localhost\n"));
    }
}

//! A VM's directory on the host: its workspace disk and lock, what a park keeps of it for the
//! next start, and the removal of directories no server holds any more.

use super::{DISK_FILE, KEPT_RECORD, MEMORY_FILE};
use crate::StartError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why a parked VM's disk (and memory) could not be kept.
#[derive(Debug, thiserror::Error)]
pub(super) enum KeepError {
    #[error("cannot make the kept directory")]
    Dir(#[source] std::io::Error),
    #[error("cannot keep the disk")]
    Disk(#[source] std::io::Error),
    #[error("cannot sync the disk")]
    Sync(#[source] std::io::Error),
    #[error("cannot encode the kept record")]
    Encode(#[source] serde_json::Error),
    #[error("cannot record what was kept")]
    Record(#[source] std::io::Error),
}

/// Makes `dir` (0700) and in it a lock file, locked and returned, and a sparse ext4 image
/// `workspace.img` (0600) of `bytes`; the directory and the disk belong to `uid` (the VMM's),
/// which gets the disk as a descriptor or through `/proc/self/fd`, never by a path it walks.
pub(super) fn make_disk(
    dir: &Path,
    bytes: u64,
    uid: Option<u32>,
) -> Result<std::fs::File, StartError> {
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
pub(super) fn chown_tree(path: &Path, uid: u32) -> std::io::Result<()> {
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
pub(super) fn sync_tree(path: &Path) -> std::io::Result<u64> {
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
pub(super) struct Fingerprint {
    pub(super) image: String,
    pub(super) vmm: String,
    pub(super) vmm_version: String,
    pub(super) accel: String,
    pub(super) memory_bytes: u64,
    pub(super) vcpus: u32,
    pub(super) disk_bytes: u64,
    /// The process limit the guest booted with (a machine saved before it was recorded fits
    /// no limit, and boots afresh).
    #[serde(default)]
    pub(super) pids: u64,
}

/// `kept.json`: what a park left in `STATE_DIR/kept/NAME/`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct KeptRecord {
    /// The control plane's name for the workspace this disk holds (its snapshot).
    pub(super) tag: String,
    /// `memory.bin` is there too.
    pub(super) memory: bool,
    fingerprint: Fingerprint,
}

/// What a start takes over from a park.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    dir: PathBuf,
    pub(super) record: KeptRecord,
}

impl Kept {
    pub(super) fn keep(&self) -> crate::Keep {
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
pub(super) fn kept_dir(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("kept").join(name)
}

/// Takes what is kept for `name` when it was kept under `tag` and its disk fits `fits` (its
/// memory only when everything fits); anything else kept for `name` is removed. The record is
/// removed first: what a start takes is never taken twice, and a crash of the VM leaves
/// nothing that could be mistaken for a clean park.
pub(super) fn take_kept(
    state_dir: &Path,
    name: &str,
    tag: Option<&str>,
    fits: &Fingerprint,
) -> Option<Kept> {
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
pub(super) fn adopt_kept(
    dir: &Path,
    kept: &Kept,
    uid: Option<u32>,
) -> Result<std::fs::File, StartError> {
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
pub(super) fn keep_files(
    dir: &Path,
    to: &Path,
    tag: &str,
    memory: Option<u64>,
    fingerprint: &Fingerprint,
) -> Result<(crate::Keep, u64), KeepError> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let _ = std::fs::remove_dir_all(to);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(to)
        .map_err(KeepError::Dir)?;
    let disk = to.join(DISK_FILE);
    std::fs::rename(dir.join(DISK_FILE), &disk).map_err(KeepError::Disk)?;
    open_plain(&disk, false)
        .and_then(|f| f.sync_all())
        .map_err(KeepError::Sync)?;
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
    let json = serde_json::to_vec(&record).map_err(KeepError::Encode)?;
    write_durably(to, KEPT_RECORD, &json).map_err(KeepError::Record)?;
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

/// Makes a VM's directory (0700) and returns its lock, taken.
pub(super) fn vm_dir(dir: &Path) -> Result<std::fs::File, StartError> {
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

/// Removes the directories of VMs nobody runs any more (a server killed before its VMs
/// ended): a VM's directory is `NAME-PID-N` with a `lock` file its server holds locked for the
/// VM's life, so a lock taken here means no server has it. A VM's disk holds nothing the
/// snapshots do not.
pub(super) fn remove_orphans(state_dir: &Path) {
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
    use crate::vm::MIN_DISK;

    /// The tests that make VM directories run one at a time: `make_disk` forks `mkfs.ext4`,
    /// and a fork in one test holds, until its exec, a copy of whatever lock file another test
    /// has open at that moment, so an orphan's lock would look held for a moment.
    fn disk_tests() -> std::sync::MutexGuard<'static, ()> {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        ONE.lock().unwrap_or_else(|e| e.into_inner())
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
            pids: 64,
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

//! The workspace's files, read, written, removed and listed beneath the workspace only, with
//! room code's file identity.

use super::{failed, MAX_DEPTH, SKIP_DIRS, WORKSPACE};
use crate::path::WorkspacePath;
use crate::proto::{AgentError, Entry, EntryKind, FileEntry, Reply, MAX_ENTRIES};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::PathBuf;

fn workspace_dir() -> Result<OwnedFd, AgentError> {
    rustix::fs::open(
        WORKSPACE,
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(failed)
}

fn io_error(e: rustix::io::Errno) -> AgentError {
    match e {
        rustix::io::Errno::NOENT => AgentError::NotFound,
        // RESOLVE_BENEATH refuses a path that leaves the workspace with EXDEV.
        rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => {
            AgentError::InvalidPath("the path leaves the workspace".into())
        }
        e => failed(e),
    }
}

/// Opens `path` beneath the workspace: symlinks may point within it, never out of it.
fn open_beneath(path: &str, flags: rustix::fs::OFlags) -> Result<OwnedFd, AgentError> {
    let p = WorkspacePath::parse(path).map_err(|e| AgentError::InvalidPath(e.to_string()))?;
    let dir = workspace_dir()?;
    rustix::fs::openat2(
        dir.as_fd(),
        p.as_str(),
        flags | rustix::fs::OFlags::CLOEXEC,
        // openat2 refuses a mode without O_CREAT.
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(io_error)
}

pub(super) fn read_file(path: &str, max: u64) -> Result<Vec<u8>, AgentError> {
    // NONBLOCK: opening a FIFO must not wait for a writer; the type is checked right after.
    let fd = open_beneath(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK,
    )?;
    let st = rustix::fs::fstat(&fd).map_err(failed)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(AgentError::Invalid("not a regular file".into()));
    }
    if st.st_size as u64 > max {
        return Err(AgentError::TooLarge);
    }
    let mut data = Vec::new();
    std::fs::File::from(fd)
        .take(max + 1)
        .read_to_end(&mut data)
        .map_err(failed)?;
    if data.len() as u64 > max {
        return Err(AgentError::TooLarge);
    }
    Ok(data)
}

/// Splits a checked path into its parent directory (opened, created as needed, beneath the
/// workspace) and its final name.
fn parent_of(path: &str) -> Result<(OwnedFd, String), AgentError> {
    let p = WorkspacePath::parse(path).map_err(|e| AgentError::InvalidPath(e.to_string()))?;
    let (parent, name) = match p.as_str().rsplit_once('/') {
        Some((parent, name)) => (Some(parent), name),
        None => (None, p.as_str()),
    };
    let mut dir = workspace_dir()?;
    if let Some(parent) = parent {
        for part in parent.split('/') {
            match rustix::fs::mkdirat(&dir, part, rustix::fs::Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io_error(e)),
            }
            dir = rustix::fs::openat2(
                dir.as_fd(),
                part,
                rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
                rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_MAGICLINKS,
            )
            .map_err(io_error)?;
        }
    }
    Ok((dir, name.to_owned()))
}

pub(super) fn write_file(path: &str, data: &[u8]) -> Result<(), AgentError> {
    let (dir, name) = parent_of(path)?;
    // Written beside and renamed over, so readers (and the change watcher) never see half.
    let tmp = temp_name(&name);
    let fd = rustix::fs::openat2(
        dir.as_fd(),
        tmp.as_str(),
        rustix::fs::OFlags::WRONLY
            | rustix::fs::OFlags::CREATE
            | rustix::fs::OFlags::TRUNC
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o644),
        rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
    )
    .map_err(io_error)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(data).map_err(failed)?;
    drop(file);
    rustix::fs::renameat(&dir, tmp.as_str(), &dir, name.as_str()).map_err(io_error)
}

/// The name a file is written under before it is renamed over `name`: hidden, marked, and
/// short enough for any file system (the name cut to at most 200 bytes, at a character
/// boundary: a name is UTF-8, and cutting inside a character panicked the agent).
pub(super) fn temp_name(name: &str) -> String {
    let mut cut = name.len().min(200);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}.coderoom-tmp", &name[..cut])
}

pub(super) fn remove_file(path: &str) -> Result<(), AgentError> {
    let (dir, name) = parent_of(path)?;
    match rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty()) {
        Err(rustix::io::Errno::ISDIR) => {
            rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::REMOVEDIR)
                .map_err(io_error)
        }
        r => r.map_err(io_error),
    }
}

/// Opens `path` (the workspace when empty) beneath the workspace with `flags`.
fn open_entry(path: &str, flags: rustix::fs::OFlags) -> Result<OwnedFd, AgentError> {
    if path.is_empty() {
        workspace_dir()
    } else {
        open_beneath(path, flags)
    }
}

fn entry_of(path: String, st: &rustix::fs::Stat, target: Option<String>) -> Entry {
    let kind = match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::RegularFile => EntryKind::File,
        rustix::fs::FileType::Directory => EntryKind::Dir,
        rustix::fs::FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    Entry {
        path,
        kind,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
        target,
    }
}

/// A symlink's target, read through `dir` and `name` (a descriptor of the link itself with
/// an empty name).
fn link_target(dir: &OwnedFd, name: &str) -> Option<String> {
    rustix::fs::readlinkat(dir, name, Vec::new())
        .ok()
        .and_then(|t| t.into_string().ok())
}

pub(super) fn stat(path: &str) -> Result<Reply, AgentError> {
    let fd = open_entry(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::NOFOLLOW,
    )?;
    let st = rustix::fs::fstat(&fd).map_err(failed)?;
    let target = (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink)
        .then(|| link_target(&fd, ""))
        .flatten();
    Ok(Reply::Entry(entry_of(path.to_owned(), &st, target)))
}

pub(super) fn list_dir(path: &str, depth: u32) -> Result<Reply, AgentError> {
    let dir = open_entry(
        path,
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
    )?;
    let mut entries = Vec::new();
    let mut truncated = false;
    let depth = usize::try_from(depth)
        .unwrap_or(MAX_DEPTH)
        .clamp(1, MAX_DEPTH);
    walk(&dir, path, depth, &mut entries, &mut truncated);
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Reply::Entries { entries, truncated })
}

/// Lists `dir` (workspace path `rel`) into `out`, `depth` levels down, never through a
/// symlink, at most [`MAX_ENTRIES`] in all.
fn walk(dir: &OwnedFd, rel: &str, depth: usize, out: &mut Vec<Entry>, truncated: &mut bool) {
    let Ok(mut listing) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    while let Some(Ok(e)) = listing.next() {
        let Ok(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        if out.len() >= MAX_ENTRIES {
            *truncated = true;
            return;
        }
        let Ok(st) = rustix::fs::statat(dir, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        else {
            continue;
        };
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        let target = (kind == rustix::fs::FileType::Symlink)
            .then(|| link_target(dir, &name))
            .flatten();
        out.push(entry_of(path.clone(), &st, target));
        if kind == rustix::fs::FileType::Directory && depth > 1 {
            let child = rustix::fs::openat(
                dir,
                name.as_str(),
                rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            );
            if let Ok(child) = child {
                walk(&child, &path, depth - 1, out, truncated);
            }
        }
    }
}

pub(super) fn make_dir(path: &str) -> Result<(), AgentError> {
    let (dir, name) = parent_of(path)?;
    match rustix::fs::mkdirat(&dir, name.as_str(), rustix::fs::Mode::from_raw_mode(0o755)) {
        Err(rustix::io::Errno::EXIST) => Err(AgentError::Exists),
        r => r.map_err(io_error),
    }
}

pub(super) fn move_entry(from: &str, to: &str) -> Result<(), AgentError> {
    let (from_dir, from_name) = parent_of(from)?;
    let (to_dir, to_name) = parent_of(to)?;
    rustix::fs::renameat(&from_dir, from_name.as_str(), &to_dir, to_name.as_str()).map_err(io_error)
}

pub(super) fn list_files(max: usize) -> Reply {
    let mut entries = Vec::new();
    let mut truncated = false;
    // Breadth first: when the cap is reached, what is missing is the deepest, not a sibling
    // of a huge directory.
    let mut queue =
        std::collections::VecDeque::from([(PathBuf::from(WORKSPACE), String::new(), 0usize)]);
    while let Some((dir, rel, depth)) = queue.pop_front() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in rd.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if meta.is_dir() {
                if depth >= MAX_DEPTH {
                    truncated = true;
                } else if !SKIP_DIRS.contains(&name.as_str()) {
                    queue.push_back((entry.path(), path, depth + 1));
                }
            } else if meta.is_file() && WorkspacePath::parse(&path).is_ok() {
                if entries.len() >= max {
                    truncated = true;
                    break;
                }
                use std::os::unix::fs::MetadataExt;
                entries.push(FileEntry {
                    path,
                    size: meta.len(),
                    mtime_ns: i128::from(meta.mtime()) * 1_000_000_000
                        + i128::from(meta.mtime_nsec()),
                });
            }
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Reply::Files { entries, truncated }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any UTF-8 name, however its characters fall around byte 200, gets a temporary name
    /// (no panic), valid UTF-8, short enough for a file system, and never the name itself.
    #[test]
    fn temporary_names_never_cut_a_character() {
        let mut names: Vec<String> = Vec::new();
        // Every alignment of 2-, 3- and 4-byte characters against the cut.
        for filler in 190..=205 {
            for ch in ['é', '€', '😀'] {
                names.push(format!(
                    "{}{}",
                    "a".repeat(filler),
                    ch.to_string().repeat(20)
                ));
            }
        }
        for name in names {
            let tmp = temp_name(&name);
            assert!(tmp.len() <= 255, "{} bytes", tmp.len());
            assert!(tmp.starts_with('.') && tmp.ends_with(".coderoom-tmp"));
            assert_ne!(tmp, name);
        }
    }

    proptest::proptest! {
        /// Arbitrary UTF-8 names, of any length up to a file system's limit.
        #[test]
        fn temporary_names_of_any_utf8_name(name in "\\PC{1,255}") {
            let tmp = temp_name(&name);
            proptest::prop_assert!(tmp.len() <= 255);
            proptest::prop_assert!(tmp.ends_with(".coderoom-tmp"));
        }
    }
}

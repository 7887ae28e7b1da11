//! The workspace as one download: the sandbox's archive of `/workspace` with the document's
//! texts laid over it, gzipped (`POST /api/rooms/{id}/exports {"workspace": true}`).
//!
//! The document is the truth for text files (what everyone sees in the editor, including edits
//! a stopped sandbox has not taken in yet); the archive is the truth for everything else (build
//! output, binaries, files the sync leaves alone). A file the document and the workspace last
//! agreed on, and that the document no longer holds, was deleted in the room: it is left out.
//!
//! The archive was written inside the sandbox, so it is hostile input: only directories, regular
//! files and symlinks with relative paths and no `..` go into the download (anything else is
//! counted as skipped), and a malformed archive is an error, never a partial download that looks
//! whole.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use super::filesync::{digest, MAX_SYNC_FILE};

/// What went into a download.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Bundled {
    /// Regular files in it.
    pub(crate) files: u64,
    /// Of those, the ones whose text came from the document.
    pub(crate) from_document: u64,
    /// Entries of the workspace archive left out (unsafe paths, devices, hard links, FIFOs).
    pub(crate) skipped: u64,
    /// The gzipped archive's size.
    pub(crate) bytes: u64,
}

/// Writes to `out` (through `out.partial`, renamed once whole) a gzipped tar of the workspace
/// archive at `workspace`, with `texts` (the document's files: path -> text) written in place of
/// the archive's copies and added where missing, and the files in `agreed` that the document no
/// longer holds left out. `mtime` (Unix seconds) dates the document's files.
pub(crate) fn bundle(
    workspace: &Path,
    agreed: &HashMap<String, String>,
    texts: &BTreeMap<String, String>,
    mtime: u64,
    out: &Path,
) -> std::io::Result<Bundled> {
    let partial = super::snapshots::partial_of(out);
    let result = write(workspace, agreed, texts, mtime, &partial);
    match result {
        Ok(mut done) => {
            std::fs::rename(&partial, out)?;
            done.bytes = std::fs::metadata(out)?.len();
            Ok(done)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

fn write(
    workspace: &Path,
    agreed: &HashMap<String, String>,
    texts: &BTreeMap<String, String>,
    mtime: u64,
    dest: &Path,
) -> std::io::Result<Bundled> {
    let file = std::fs::File::create(dest)?;
    let gz = flate2::write::GzEncoder::new(BufWriter::new(file), flate2::Compression::default());
    let mut builder = tar::Builder::new(gz);
    let mut done = Bundled::default();
    let mut written: HashSet<String> = HashSet::new();

    let mut archive = tar::Archive::new(BufReader::new(std::fs::File::open(workspace)?));
    for entry in archive.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&entry.path_bytes()));
        if !safe(&path) {
            done.skipped += 1;
            continue;
        }
        let name = path.to_str().map(|s| s.trim_end_matches('/').to_owned());
        let kind = entry.header().entry_type();
        let mut header = tar::Header::new_gnu();
        header.set_mode(entry.header().mode().map_err(malformed)? & 0o7777);
        header.set_mtime(entry.header().mtime().map_err(malformed)?);
        header.set_entry_type(kind);
        match kind {
            tar::EntryType::Directory => {
                header.set_size(0);
                builder.append_data(&mut header, &path, std::io::empty())?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if let Some(name) = &name {
                    match texts.get(name) {
                        Some(text) if agreed.get(name) != Some(&digest(text)) => {
                            // The editors' text: the document is the truth for text files.
                            header.set_entry_type(tar::EntryType::Regular);
                            header.set_size(text.len() as u64);
                            builder.append_data(&mut header, &path, text.as_bytes())?;
                            written.insert(name.clone());
                            done.files += 1;
                            done.from_document += 1;
                            continue;
                        }
                        Some(_) => {
                            // The editors left it as both sides last agreed: the disk is as
                            // new or newer (room code may have changed it since the sync last
                            // looked, even into something the document cannot hold), and goes
                            // in as it is, below.
                            written.insert(name.clone());
                        }
                        None => {
                            // Deleted in the room since the sandbox last saw the document,
                            // when the file still reads as agreed. One changed inside since
                            // (turned binary, grown past the mirror's cap: out of the document
                            // for that) is the sandbox's, and goes in (a large one below, as
                            // any other file).
                            if let Some(digest) = agreed.get(name) {
                                if entry.size() <= MAX_SYNC_FILE {
                                    let bytes = read_whole(&mut entry)?;
                                    if !is_digest_of(&bytes, digest) {
                                        header.set_entry_type(tar::EntryType::Regular);
                                        header.set_size(bytes.len() as u64);
                                        builder.append_data(
                                            &mut header,
                                            &path,
                                            bytes.as_slice(),
                                        )?;
                                        done.files += 1;
                                    }
                                    continue;
                                }
                            }
                        }
                    }
                }
                header.set_entry_type(tar::EntryType::Regular);
                let size = entry.size();
                header.set_size(size);
                let data = Exact {
                    inner: &mut entry,
                    left: size,
                };
                builder.append_data(&mut header, &path, data)?;
                done.files += 1;
            }
            tar::EntryType::Symlink => {
                let Some(target) = entry.link_name().map_err(malformed)? else {
                    done.skipped += 1;
                    continue;
                };
                let target = target.into_owned();
                if name.as_ref().is_some_and(|n| texts.contains_key(n)) {
                    // The document holds a file where the workspace has a link: the file wins.
                    continue;
                }
                header.set_size(0);
                builder.append_link(&mut header, &path, &target)?;
            }
            _ => done.skipped += 1,
        }
    }
    // What the document holds that the workspace does not have yet.
    for (name, text) in texts {
        if written.contains(name) || !safe(Path::new(name)) {
            continue;
        }
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_size(text.len() as u64);
        builder.append_data(&mut header, name, text.as_bytes())?;
        done.files += 1;
        done.from_document += 1;
    }
    let gz = builder.into_inner()?;
    // Not synced: a scratch file, read back at once and removed once sent.
    let mut file = gz.finish()?.into_inner().map_err(|e| e.into_error())?;
    file.flush()?;
    Ok(done)
}

/// An entry's bytes, read whole (the caller bounds its size).
fn read_whole<R: Read>(entry: &mut tar::Entry<'_, R>) -> std::io::Result<Vec<u8>> {
    let size = entry.size();
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    Exact {
        inner: entry,
        left: size,
    }
    .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether `bytes` are the text whose digest the agreement keeps (hex SHA-256).
fn is_digest_of(bytes: &[u8], digest: &str) -> bool {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes)) == digest
}

/// Exactly `left` bytes of `inner`: an archive that ends sooner is malformed (the tar writer
/// would otherwise pad the short file silently).
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want]).map_err(malformed)?;
        if n == 0 {
            return Err(malformed(std::io::ErrorKind::UnexpectedEof.into()));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// A path that stays inside the directory it is unpacked in: relative, no `..`, not empty.
fn safe(path: &Path) -> bool {
    let mut any = false;
    for c in path.components() {
        match c {
            Component::Normal(_) => any = true,
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    any
}

fn malformed(e: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("the workspace archive is malformed: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace archive as the agent writes one, from `(path, kind, data)` entries
    /// ('d' directory, 'f' file, 'l' symlink to `data`, 'p' FIFO), written raw so unsafe names
    /// get through as a hostile agent would send them.
    fn archive(dir: &Path, entries: &[(&str, char, &str)]) -> PathBuf {
        let path = dir.join("workspace.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&path).expect("create"));
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            h.set_mtime(1_700_000_000);
            let (t, body): (tar::EntryType, &[u8]) = match kind {
                'd' => (tar::EntryType::Directory, b""),
                'f' => (tar::EntryType::Regular, data.as_bytes()),
                'l' => (tar::EntryType::Symlink, b""),
                _ => (tar::EntryType::Fifo, b""),
            };
            h.set_entry_type(t);
            h.set_size(body.len() as u64);
            // Written into the header's own name field: `append_data` would refuse `..`.
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            if *kind == 'l' {
                h.set_link_name(data).expect("link");
            }
            h.set_cksum();
            b.append(&h, body).expect("append");
        }
        b.finish().expect("finish");
        path
    }

    /// The download's entries: path -> (kind, contents or link target).
    fn unpack(path: &Path) -> BTreeMap<String, (char, String)> {
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(path).expect("open"));
        let mut a = tar::Archive::new(gz);
        let mut out = BTreeMap::new();
        for e in a.entries().expect("entries") {
            let mut e = e.expect("entry");
            let name = e.path().expect("path").to_string_lossy().into_owned();
            let kind = e.header().entry_type();
            let (k, v) = if kind.is_dir() {
                ('d', String::new())
            } else if kind.is_symlink() {
                let target = e.link_name().expect("link").expect("target");
                ('l', target.to_string_lossy().into_owned())
            } else {
                let mut s = String::new();
                e.read_to_string(&mut s).expect("read");
                ('f', s)
            };
            out.insert(name.trim_end_matches('/').to_owned(), (k, v));
        }
        out
    }

    #[test]
    fn the_document_lies_over_the_workspace() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_owned();
        let ws = archive(
            &dir,
            &[
                ("src", 'd', ""),
                ("src/main.py", 'f', "print('old')\n"),
                ("src/gone.py", 'f', "deleted in the room\n"),
                // Changed inside since the sync last looked; the editors left it alone.
                ("src/lib.py", 'f', "changed inside\n"),
                ("build.bin", 'f', "\u{1}\u{2}binary"),
                ("latest", 'l', "src/main.py"),
                // Agreed on as text, then turned binary inside: out of the document, not
                // deleted in the room.
                ("data.bin", 'f', "\u{0}\u{1}bytes"),
            ],
        );
        let agreed = HashMap::from([
            ("src/main.py".to_owned(), digest("print('old')\n")),
            ("src/gone.py".to_owned(), digest("deleted in the room\n")),
            ("data.bin".to_owned(), digest("plain\n")),
            ("src/lib.py".to_owned(), digest("before\n")),
        ]);
        let texts = BTreeMap::from([
            ("src/main.py".to_owned(), "print('new')\n".to_owned()),
            ("src/lib.py".to_owned(), "before\n".to_owned()),
            (
                "notes/todo.md".to_owned(),
                "# typed, not synced yet\n".to_owned(),
            ),
        ]);
        let out = dir.join("out.tar.gz");
        let done = bundle(&ws, &agreed, &texts, 1_800_000_000, &out).expect("bundle");
        assert_eq!(
            (done.files, done.from_document, done.skipped),
            (5, 2, 0),
            "{done:?}"
        );
        assert_eq!(done.bytes, std::fs::metadata(&out).expect("meta").len());
        let got = unpack(&out);
        let want: BTreeMap<String, (char, String)> = [
            ("src", ('d', "")),
            ("src/main.py", ('f', "print('new')\n")),
            ("src/lib.py", ('f', "changed inside\n")),
            ("build.bin", ('f', "\u{1}\u{2}binary")),
            ("data.bin", ('f', "\u{0}\u{1}bytes")),
            ("latest", ('l', "src/main.py")),
            ("notes/todo.md", ('f', "# typed, not synced yet\n")),
        ]
        .into_iter()
        .map(|(k, (c, v))| (k.to_owned(), (c, v.to_owned())))
        .collect();
        assert_eq!(got, want);
        assert!(!crate::sandbox::snapshots::partial_of(&out).exists());
    }

    #[test]
    fn hostile_entries_stay_out() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_owned();
        let ws = archive(
            &dir,
            &[
                ("../escape", 'f', "outside"),
                ("/etc/cron.d/x", 'f', "absolute"),
                ("a/../../b", 'f', "climbs"),
                ("fifo", 'p', ""),
                ("ok.txt", 'f', "fine"),
            ],
        );
        let out = dir.join("out.tar.gz");
        let done = bundle(&ws, &HashMap::new(), &BTreeMap::new(), 0, &out).expect("bundle");
        assert_eq!((done.files, done.skipped), (1, 4), "{done:?}");
        assert_eq!(
            unpack(&out).into_keys().collect::<Vec<_>>(),
            vec!["ok.txt".to_owned()]
        );
    }

    #[test]
    fn a_malformed_archive_is_an_error_and_leaves_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_owned();
        let ws = archive(&dir, &[("big.txt", 'f', &"x".repeat(4096))]);
        // Cut in the middle of the file's data.
        let bytes = std::fs::read(&ws).expect("read");
        std::fs::write(&ws, &bytes[..2048]).expect("write");
        let out = dir.join("out.tar.gz");
        let e = bundle(&ws, &HashMap::new(), &BTreeMap::new(), 0, &out).expect_err("cut");
        assert!(e.to_string().contains("malformed"), "{e}");
        assert!(!out.exists());
        assert!(!crate::sandbox::snapshots::partial_of(&out).exists());
    }
}

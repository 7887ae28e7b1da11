//! The workspace as a tar archive: streamed out in bounded chunks for a snapshot, and unpacked
//! from chunks for a restore.

use super::{failed, Out, Restore, State, MAX_DEPTH, WORKSPACE};
use crate::proto::{self, AgentError, Message, Reply, CHUNK};
use serde_bytes::ByteBuf;
use std::io::{Read, Write};
use std::path::Path;

/// Sends written bytes as [`Message::Chunk`] frames and enforces the size cap.
pub(super) struct ChunkWriter<'a> {
    id: u64,
    out: &'a Out,
    buf: Vec<u8>,
    total: u64,
    max: u64,
    /// Set when writing failed (cap reached, control plane gone): the snapshot is over.
    broken: &'a std::cell::Cell<bool>,
}

impl ChunkWriter<'_> {
    fn flush_chunk(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let msg = Message::Chunk {
            id: self.id,
            data: ByteBuf::from(std::mem::take(&mut self.buf)),
        };
        let frame = proto::encode(&msg).map_err(std::io::Error::other)?;
        self.out.blocking_send(frame).map_err(|_| {
            self.broken.set(true);
            std::io::Error::other("control plane gone")
        })
    }
}

impl Write for ChunkWriter<'_> {
    /// Takes at most what fills the current chunk (a short write; `write_all` comes back for
    /// the rest): the control plane treats a chunk over [`CHUNK`] as a hostile agent.
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let data = &data[..data.len().min(CHUNK - self.buf.len())];
        self.total += data.len() as u64;
        if self.total > self.max {
            self.broken.set(true);
            return Err(std::io::Error::other("snapshot too large"));
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush_chunk()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.flush_chunk()
    }
}

pub(super) fn snapshot(id: u64, max: u64, out: &Out) -> Result<Reply, AgentError> {
    let broken = std::cell::Cell::new(false);
    let mut w = ChunkWriter {
        id,
        out,
        buf: Vec::with_capacity(CHUNK),
        total: 0,
        max,
        broken: &broken,
    };
    let mut b = tar::Builder::new(&mut w);
    b.follow_symlinks(false);
    let r = append_tree(&mut b, Path::new(WORKSPACE), Path::new(""), 0, &broken)
        .and_then(|()| b.finish());
    drop(b);
    if let Err(e) = r {
        return Err(if w.total > w.max {
            AgentError::TooLarge
        } else {
            failed(e)
        });
    }
    w.flush().map_err(failed)?;
    Ok(Reply::Snapshot { bytes: w.total })
}

/// Reads that fail end the data early instead of failing the archive.
struct Lenient<R>(R);

impl<R: Read> Read for Lenient<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Ok(self.0.read(buf).unwrap_or(0))
    }
}

/// Archives `dir` as `rel`: directories, regular files and symlinks. What cannot be archived
/// (sockets, FIFOs, devices, unreadable or vanished entries) is skipped, and a file that changes
/// size while it is read is archived at the size it had, padded or cut, so the archive is
/// always well formed. Only the writer failing (the cap, the control plane gone) is an error.
fn append_tree<W: Write>(
    b: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
    depth: usize,
    broken: &std::cell::Cell<bool>,
) -> std::io::Result<()> {
    let check = |r: std::io::Result<()>| if broken.get() { r } else { Ok(()) };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let name = rel.join(entry.file_name());
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let ft = meta.file_type();
        let mut header = tar::Header::new_gnu();
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Deterministic);
        if ft.is_dir() {
            header.set_size(0);
            check(b.append_data(&mut header, &name, std::io::empty()))?;
            if depth < MAX_DEPTH {
                append_tree(b, &path, &name, depth + 1, broken)?;
            }
        } else if ft.is_file() {
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let len = meta.len();
            header.set_size(len);
            let data = Lenient(file).take(len).chain(std::io::repeat(0)).take(len);
            check(b.append_data(&mut header, &name, data))?;
        } else if ft.is_symlink() {
            let Ok(target) = std::fs::read_link(&path) else {
                continue;
            };
            header.set_size(0);
            check(b.append_link(&mut header, &name, &target))?;
        }
    }
    Ok(())
}

/// Feeds restore chunks to an unpacking thread; answers when the last chunk is unpacked.
pub(super) async fn restore_chunk(
    state: &mut State,
    id: u64,
    data: Vec<u8>,
    last: bool,
) -> Option<Result<Reply, AgentError>> {
    if state.restore.as_ref().is_some_and(|r| r.id != id) {
        return Some(Err(AgentError::Invalid(
            "another restore is running".into(),
        )));
    }
    if state.restore.is_none() {
        let (feed, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(8);
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new().spawn(move || {
            let reader = ChannelReader {
                rx,
                cur: Vec::new(),
                pos: 0,
            };
            let mut archive = tar::Archive::new(reader);
            archive.set_preserve_permissions(true);
            archive.set_overwrite(true);
            let r = archive.unpack(WORKSPACE).map_err(failed);
            let _ = done_tx.send(r);
        });
        if let Err(e) = spawned {
            return Some(Err(failed(e)));
        }
        state.restore = Some(Restore { id, feed, done });
    }
    let job = state.restore.as_ref()?;
    let feed = job.feed.clone();
    let sent = tokio::task::spawn_blocking(move || feed.send(data).is_ok())
        .await
        .unwrap_or(false);
    if !last && sent {
        return None;
    }
    let job = state.restore.take()?;
    drop(job.feed);
    let r = job
        .done
        .await
        .unwrap_or_else(|_| Err(failed("unpacking stopped")));
    Some(r.map(|()| Reply::Done))
}

struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.cur.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.cur = next;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// Big writes (a large file's contents) are cut at the chunk size: an oversized chunk makes
    /// the control plane kill the sandbox as hostile, so a big workspace could never be
    /// snapshotted.
    #[test]
    fn snapshot_chunks_never_exceed_the_limit() {
        let (out, mut frames) = mpsc::channel::<Vec<u8>>(64);
        let broken = std::cell::Cell::new(false);
        let mut w = ChunkWriter {
            id: 9,
            out: &out,
            buf: Vec::new(),
            total: 0,
            max: u64::MAX,
            broken: &broken,
        };
        let piece = vec![7u8; CHUNK / 2 + 1000];
        for _ in 0..5 {
            w.write_all(&piece).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        drop(out);
        let mut total = 0;
        while let Some(frame) = frames.blocking_recv() {
            let msg: Message = postcard::from_bytes(&frame[4..]).unwrap();
            let Message::Chunk { id: 9, data } = msg else {
                panic!("not a chunk of the snapshot")
            };
            assert!(data.len() <= CHUNK, "a chunk of {} bytes", data.len());
            total += data.len();
        }
        assert_eq!(total, piece.len() * 5);
        assert!(!broken.get());
    }
}

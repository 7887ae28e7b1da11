//! Editor and workspace in one: the text files of a running sandbox's workspace mirror the
//! room document's `files` map (path -> `Y.Text`).
//!
//! The sync is a participant of the room like any editor: it joins the room task with its own
//! replica of the document, so what it adds goes through the same checks, log and broadcast as
//! a keystroke. Document edits reach the disk through the agent, debounced. Changes made inside
//! the sandbox are found by a periodic listing (size and mtime), read, and turned into minimal
//! text edits, so collaborators' cursors outside the changed text stay where they were.
//!
//! Conflict rule (both sides changed a file since they last agreed): the change on disk is
//! applied as a three-way merge against the text both sides last agreed on. Hunks of the disk
//! change that touch only text the editors left alone are applied; where editors and the disk
//! changed the same characters, the editors' text wins. The merged text is then written back
//! to the disk, so both sides agree again.
//!
//! What the two sides last agreed on is kept beside every workspace snapshot (as digests): a
//! sync that starts on a restored workspace tells a file the document deleted meanwhile (it
//! reads as agreed: the workspace follows the deletion) from one made inside the sandbox (it is
//! imported). Without it, a file deleted while the sandbox slept came back.
//!
//! Only text goes into the document: files larger than [`MAX_SYNC_FILE`], with NUL bytes or not
//! UTF-8 stay on disk only. A mirrored file that room code turns into such a file leaves the
//! document, its bytes untouched on disk (unless editors changed its text meanwhile: their text
//! wins, as in any conflict). Deleting a file on disk removes it from the document, except when a
//! single scan sees most of the synced files vanish at once (`rm -rf` of the workspace): then
//! the document keeps them and they are written back.

use crate::config::Limits;
use crate::ids::RoomId;
use crate::room::merge::merge;
use crate::room::outbox::{Outbound, Outbox};
use crate::room::protocol::Inbound;
use crate::room::RoomCmd;
use crate::room::Rooms;
use coderoom_sandbox::path::WorkspacePath;
use coderoom_sandbox::proto::{FileEntry, Op, Reply};
use coderoom_sandbox::Sandbox;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use yrs::sync::protocol::{Message, SyncMessage};
use yrs::types::{Event, PathSegment};
use yrs::updates::decoder::Decode;
use yrs::{
    DeepObservable, Doc, GetString, Map, MapRef, Out, ReadTxn, Text, TextRef, Transact, Update,
};

/// Largest file mirrored into the document.
pub(crate) const MAX_SYNC_FILE: u64 = 1 << 20;
/// Most files one room mirrors (a listing beyond it is truncated).
const MAX_SYNC_FILES: u32 = 5000;
/// How often the workspace is listed for changes made inside.
const SCAN_EVERY: Duration = Duration::from_millis(300);
/// Quiet time after a document edit before the file is written.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// A scan that sees more than this many synced files vanish, and more than half of them, is
/// treated as a wipe and not mirrored into the document.
const MASS_DELETE: usize = 10;
/// Longest a sync with nothing to agree on waits for the sandbox's first answer.
const FIRST_ANSWER_WAIT: Duration = Duration::from_millis(250);
/// Time an agent file operation may take.
const AGENT_WITHIN: Duration = Duration::from_secs(30);

/// A file as read from the workspace.
enum OnDisk {
    Text(String),
    /// Read whole and not text: a NUL byte, or bytes that are not UTF-8 before its end.
    NotText,
    /// Not read (gone, grown, refused since the listing), or ending inside a character (being
    /// written): nothing to conclude from until it is read again.
    Unreadable,
}

impl OnDisk {
    fn of(data: Vec<u8>) -> OnDisk {
        if data.contains(&0) {
            return OnDisk::NotText;
        }
        match String::from_utf8(data) {
            Ok(t) => OnDisk::Text(t),
            Err(e) if e.utf8_error().error_len().is_none() => OnDisk::Unreadable,
            Err(_) => OnDisk::NotText,
        }
    }
}

/// Digest of a text as the agreement record keeps it (hex SHA-256).
pub(crate) fn digest(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// Path -> digest of the text the document and the workspace last agreed on: the sync keeps
/// it current, the supervisor stores it beside each snapshot.
pub(crate) type Digests = Arc<Mutex<HashMap<String, String>>>;

/// The text both sides last agreed on, per path, with its digest kept in [`Digests`].
struct Agreed {
    texts: HashMap<String, String>,
    digests: Digests,
}

impl Agreed {
    /// Starts from `restored` (what the restored workspace agreed on): a snapshot taken before
    /// the first agreement completes keeps it, rather than an empty record.
    fn new(digests: Digests, restored: &HashMap<String, String>) -> Self {
        *digests.lock().unwrap_or_else(|e| e.into_inner()) = restored.clone();
        Agreed {
            texts: HashMap::new(),
            digests,
        }
    }

    fn get(&self, path: &str) -> Option<&String> {
        self.texts.get(path)
    }

    fn contains_key(&self, path: &str) -> bool {
        self.texts.contains_key(path)
    }

    fn len(&self) -> usize {
        self.texts.len()
    }

    fn keys(&self) -> impl Iterator<Item = &String> {
        self.texts.keys()
    }

    fn insert(&mut self, path: String, text: String) {
        let d = digest(&text);
        self.digests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.clone(), d);
        self.texts.insert(path, text);
    }

    fn remove(&mut self, path: &str) -> Option<String> {
        self.digests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(path);
        self.texts.remove(path)
    }
}

/// What the sync needs to run.
pub(crate) struct SyncCtx {
    pub rooms: Rooms,
    pub limits: Arc<Limits>,
    pub room_id: RoomId,
    pub sandbox: Sandbox,
    pub cancel: CancellationToken,
    /// What the sync mirrors, for the room's sandbox panel.
    pub stats: Arc<SyncStats>,
    /// Kept current by the sync: what both sides agree on.
    pub agreed: Digests,
    /// What both sides agreed on when the workspace was snapshotted, for the first agreement
    /// on a restored workspace (empty for a fresh one).
    pub restored: HashMap<String, String>,
    /// Set once the first reconciliation wrote the document's files into the workspace (or
    /// at once, when `fresh` and the document holds none: there is nothing to write).
    pub synced: tokio::sync::watch::Sender<bool>,
    /// The sandbox's workspace started empty (nothing restored, nothing kept).
    pub fresh: bool,
    /// Fires when the sandbox's first operation is answered (or is dropped): a sync with
    /// nothing to agree on yet waits for it, at most [`FIRST_ANSWER_WAIT`], before joining.
    pub first_answer: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Called once when the room cannot be joined because another server holds it now (the
    /// room moved while this server's sandbox ran): the sandbox is then stopped here.
    pub moved: Arc<dyn Fn() + Send + Sync>,
}

/// Where a sync is asked to settle (see `Sandboxes::settle`): each ask is answered once the
/// room has committed what a scan made after it imported.
pub(crate) type Settle = tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>;
/// The sync's end of [`Settle`].
pub(crate) type Asks = tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<()>>;

/// How many workspace files the document holds, and how many text files on disk it does not
/// (past `--max-synced-files`).
#[derive(Debug, Default)]
pub(crate) struct SyncStats {
    files: std::sync::atomic::AtomicUsize,
    not_mirrored: std::sync::atomic::AtomicUsize,
}

impl SyncStats {
    /// `(files in the document, text files on disk left out of it)`.
    pub(crate) fn read(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.files.load(Relaxed), self.not_mirrored.load(Relaxed))
    }
}

struct Replica {
    doc: Doc,
    files: MapRef,
    /// Paths the document changed since the last write to disk.
    dirty: Arc<Mutex<HashSet<String>>>,
}

impl Replica {
    fn new() -> Self {
        let doc = Doc::new();
        let files = doc.get_or_insert_map("files");
        let dirty: Arc<Mutex<HashSet<String>>> = Arc::default();
        let sink = dirty.clone();
        files.observe_deep("sync", move |txn, events| {
            let mut dirty = sink.lock().unwrap_or_else(|e| e.into_inner());
            for event in events.iter() {
                match event {
                    Event::Map(m) if m.path().is_empty() => {
                        dirty.extend(m.keys(txn).keys().map(|k| k.to_string()));
                    }
                    other => {
                        if let Some(PathSegment::Key(k)) = other.path().front() {
                            dirty.insert(k.to_string());
                        }
                    }
                }
            }
        });
        Replica { doc, files, dirty }
    }

    fn text(&self, path: &str) -> Option<String> {
        let txn = self.doc.transact();
        match self.files.get(&txn, path) {
            Some(Out::YText(t)) => Some(t.get_string(&txn)),
            _ => None,
        }
    }

    fn paths(&self) -> Vec<String> {
        let txn = self.doc.transact();
        self.files.keys(&txn).map(str::to_owned).collect()
    }

    /// The set of paths edited since the last write to disk.
    fn dirty(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.dirty.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_dirty(&self) -> HashSet<String> {
        std::mem::take(&mut *self.dirty())
    }
}

/// Why a sync session ended (it is then started again).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    /// The room could not be joined (`None`: it did not answer).
    #[error("cannot join the room{}", .0.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Join(Option<crate::room::task::JoinError>),
    #[error("the room closed the sync")]
    RoomClosed,
    #[error("the room went away")]
    RoomGone,
    #[error("undecodable document message")]
    Decode(#[from] yrs::encoding::read::Error),
    #[error("a document update did not apply")]
    Apply(#[from] yrs::error::UpdateError),
    #[error(transparent)]
    Sandbox(coderoom_sandbox::CallError),
    #[error("the agent answered out of turn")]
    UnexpectedReply,
}

/// Runs the sync until `cancel` fires. Rejoins the room if it goes away.
/// Mirrors until cancelled; `asks` are asks to settle (scan now, and answer once what the
/// scan imported is committed).
pub(crate) async fn run(mut ctx: SyncCtx, mut asks: Asks) {
    // An empty workspace and a document that never held anything agree already: the first
    // command waits neither for the room's load nor for the listing. Not for a room loaded
    // here: someone may be typing into it, with edits not stored yet.
    if ctx.fresh && !ctx.rooms.is_loaded(&ctx.room_id) && !ctx.rooms.doc_stored(&ctx.room_id).await
    {
        ctx.synced.send_replace(true);
        // Nothing to agree on yet: the room's first command goes first (the room's load and
        // the listing would compete with it for the host); edits made meanwhile reach the
        // disk when the sync joins, at most FIRST_ANSWER_WAIT later.
        if let Some(first) = ctx.first_answer.take() {
            tokio::select! {
                () = ctx.cancel.cancelled() => return,
                _ = tokio::time::timeout(FIRST_ANSWER_WAIT, first) => {}
            }
        }
    }
    let mut restored = std::mem::take(&mut ctx.restored);
    let mut base = Agreed::new(ctx.agreed.clone(), &restored);
    let mut told = false;
    while !ctx.cancel.is_cancelled() {
        if let Err(e) = session(&ctx, &mut base, &mut restored, &mut asks).await {
            if !told && ctx.rooms.held_elsewhere(&ctx.room_id).await {
                told = true;
                tracing::warn!(room = %ctx.room_id, "the room moved to another server while its sandbox ran here; stopping the sandbox");
                (ctx.moved)();
            }
            tracing::warn!(room = %ctx.room_id, error = %e, "file sync interrupted; retrying");
            tokio::select! {
                () = ctx.cancel.cancelled() => break,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

struct Session<'a> {
    ctx: &'a SyncCtx,
    conn: crate::room::ConnId,
    room: tokio::sync::mpsc::Sender<RoomCmd>,
    replica: Replica,
    /// Text both sides last agreed on, per path.
    base: &'a mut Agreed,
    /// Digests both sides agreed on when the restored workspace was snapshotted; consulted
    /// once, by the first agreement.
    restored: &'a mut HashMap<String, String>,
    listing: HashMap<String, (u64, i128)>,
    /// Text files on disk left out of the document because it holds as many as allowed.
    left_out: HashSet<String>,
}

/// One membership in the room: join, sync, reconcile, then mirror until cancelled.
async fn session(
    ctx: &SyncCtx,
    base: &mut Agreed,
    restored: &mut HashMap<String, String>,
    asks: &mut Asks,
) -> Result<(), SyncError> {
    let conn = crate::room::task::next_conn_id();
    let (outbox, mut out_rx) =
        // In-process, not a socket: not counted with the connections' queued bytes.
        Outbox::new(
            ctx.limits.outbound_queue_bytes,
            ctx.limits.max_doc_bytes,
            Default::default(),
        );
    let room = ctx
        .rooms
        .join(
            &ctx.room_id,
            conn,
            ("sandbox", "workspace"),
            (crate::room::task::Rights::FULL, false),
            &outbox,
        )
        .await
        .map_err(SyncError::Join)?;
    let replica = Replica::new();
    let mut s = Session {
        ctx,
        conn,
        room,
        replica,
        base,
        restored,
        listing: HashMap::new(),
        left_out: HashSet::new(),
    };
    let sv = s.replica.doc.transact().state_vector();
    s.send(vec![Inbound::SyncStep1(sv)]).await?;
    // Wait for the room's answer: the replica then holds the whole document.
    loop {
        match out_rx.recv().await {
            Some(Outbound::Frame(_, bytes)) => {
                if s.receive(&bytes).await? {
                    break;
                }
            }
            Some(Outbound::Close(..)) | None => return Err(SyncError::RoomClosed),
        }
    }
    // An empty workspace and a document without files agree already: the first command need
    // not wait for the listing. (What it writes meanwhile, the reconciliation takes in as
    // any change inside.)
    if ctx.fresh && s.replica.paths().is_empty() {
        ctx.synced.send_replace(true);
    }
    s.reconcile().await?;
    ctx.synced.send_replace(true);
    let mut scan = tokio::time::interval(SCAN_EVERY);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut flush_at: Option<tokio::time::Instant> = None;
    // Settles asked for: answered by the room's reply to a sync request sent after their
    // scan, which the room sends only once everything before it is committed. One request
    // is in flight at a time (the room answers one per connection and batch): asks that come
    // while it is wait for the next, sent when it is answered.
    let mut settling: Vec<tokio::sync::oneshot::Sender<()>> = Vec::new();
    let mut next: Vec<tokio::sync::oneshot::Sender<()>> = Vec::new();
    let result = loop {
        let flush = async {
            match flush_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = ctx.cancel.cancelled() => {
                // Edits still waiting reach the disk before the sandbox is snapshotted.
                let _ = s.flush().await;
                break Ok(());
            }
            Some(done) = asks.recv() => {
                // An asker that gave up costs no scan.
                if !done.is_closed() {
                    s.scan().await?;
                    if settling.is_empty() {
                        s.ask_room().await?;
                        settling.push(done);
                    } else {
                        next.push(done);
                    }
                }
            }
            frame = out_rx.recv() => match frame {
                Some(Outbound::Frame(_, bytes)) => {
                    if s.receive(&bytes).await? && !settling.is_empty() {
                        for done in settling.drain(..) {
                            let _ = done.send(());
                        }
                        if !next.is_empty() {
                            s.ask_room().await?;
                            settling = std::mem::take(&mut next);
                        }
                    }
                    if !s.replica.dirty().is_empty() {
                        flush_at = Some(tokio::time::Instant::now() + DEBOUNCE);
                    }
                }
                Some(Outbound::Close(..)) | None => break Err(SyncError::RoomClosed),
            },
            () = flush => {
                flush_at = None;
                s.flush().await?;
            }
            _ = scan.tick() => s.scan().await?,
        }
    };
    let _ = s.room.send(RoomCmd::Leave { conn }).await;
    result
}

impl Session<'_> {
    async fn send(&self, messages: Vec<Inbound>) -> Result<(), SyncError> {
        self.room
            .send(RoomCmd::inbound(self.conn, messages))
            .await
            .map_err(|_| SyncError::RoomGone)
    }

    /// Sends the room a sync request: its answer comes once what was sent before is committed.
    async fn ask_room(&self) -> Result<(), SyncError> {
        let sv = self.replica.doc.transact().state_vector();
        self.send(vec![Inbound::SyncStep1(sv)]).await
    }

    /// Applies a frame from the room to the replica. Returns whether it was the answer to our
    /// sync request.
    async fn receive(&mut self, bytes: &[u8]) -> Result<bool, SyncError> {
        let msg = Message::decode_v1(bytes)?;
        match msg {
            // We hold nothing the room lacks: our changes are sent as we make them.
            Message::Sync(SyncMessage::SyncStep1(_)) => Ok(false),
            Message::Sync(SyncMessage::SyncStep2(data)) => {
                self.apply_remote(&data)?;
                Ok(true)
            }
            Message::Sync(SyncMessage::Update(data)) => {
                self.apply_remote(&data)?;
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    fn apply_remote(&mut self, data: &[u8]) -> Result<(), SyncError> {
        let update = Update::decode_v1(data)?;
        self.replica.doc.transact_mut().apply_update(update)?;
        Ok(())
    }

    /// Sends what a local transaction changed in the replica to the room.
    async fn publish(&self, update: Vec<u8>) -> Result<(), SyncError> {
        if update.len() <= 2 {
            return Ok(());
        }
        let decoded = Update::decode_v1(&update)?;
        self.send(vec![Inbound::Update {
            update: decoded,
            bytes: update,
        }])
        .await
    }

    async fn call(&self, op: Op) -> Result<Reply, SyncError> {
        self.ctx
            .sandbox
            .call(op, AGENT_WITHIN)
            .await
            .map_err(SyncError::Sandbox)
    }

    /// The workspace's files, and whether the listing was cut short (so a file missing from it
    /// may still exist). Files too large to mirror are listed too: one that grows past
    /// [`MAX_SYNC_FILE`] stopped being text the document can hold, it was not deleted.
    async fn list(&self) -> Result<(Vec<FileEntry>, bool), SyncError> {
        // Listings reach past the document's cap, so files it leaves out are counted.
        let cap = u32::try_from(self.ctx.limits.max_synced_files).unwrap_or(u32::MAX);
        let op = Op::ListFiles {
            max_entries: MAX_SYNC_FILES.max(cap.saturating_add(1)),
        };
        match self.call(op).await? {
            Reply::Files { entries, truncated } => Ok((
                entries
                    .into_iter()
                    .filter(|e| !e.path.ends_with(".coderoom-tmp"))
                    .collect(),
                truncated,
            )),
            _ => Err(SyncError::UnexpectedReply),
        }
    }

    async fn read_text(&self, path: &str) -> Result<Option<String>, SyncError> {
        Ok(match self.read(path).await? {
            OnDisk::Text(t) => Some(t),
            OnDisk::NotText | OnDisk::Unreadable => None,
        })
    }

    async fn read(&self, path: &str) -> Result<OnDisk, SyncError> {
        let op = Op::ReadFile {
            path: path.to_owned(),
            max_bytes: MAX_SYNC_FILE,
        };
        match self.ctx.sandbox.call(op, AGENT_WITHIN).await {
            Ok(Reply::File(data)) => Ok(OnDisk::of(data.into_vec())),
            // Gone, grown or turned into something else since the listing.
            Ok(_) | Err(coderoom_sandbox::CallError::Agent(_)) => Ok(OnDisk::Unreadable),
            Err(e) => Err(SyncError::Sandbox(e)),
        }
    }

    /// Writes `text` to `path`; `false` when the workspace refused it (the disk then does not
    /// hold it, and nothing may record that it does).
    async fn write(&self, path: &str, text: &str) -> Result<bool, SyncError> {
        let op = Op::WriteFile {
            path: path.to_owned(),
            data: serde_bytes::ByteBuf::from(text.as_bytes().to_vec()),
        };
        match self.ctx.sandbox.call(op, AGENT_WITHIN).await {
            Ok(_) => Ok(true),
            // A path the workspace refuses (e.g. a directory is in the way): the document
            // keeps it; the disk cannot.
            Err(coderoom_sandbox::CallError::Agent(e)) => {
                tracing::info!(room = %self.ctx.room_id, path, error = %e, "cannot write a document file to the workspace");
                Ok(false)
            }
            Err(e) => Err(SyncError::Sandbox(e)),
        }
    }

    /// Agreement after joining. On the first join of a sandbox the document wins for files both
    /// have (it is durable to the keystroke; the workspace may come from an older snapshot).
    /// On a rejoin (the sync was interrupted), files changed on disk since the last agreement
    /// are merged like any disk change; so, on a restored workspace, are files whose document
    /// text is still what was agreed when it was saved. Files only on disk are imported, unless they read as
    /// both sides last agreed (this run's agreement, or the one kept with the restored
    /// snapshot): the document deleted those, and the workspace follows. Files only in the
    /// document are written.
    async fn reconcile(&mut self) -> Result<(), SyncError> {
        let (listing, _) = self.list().await?;
        // Path -> whether its size lets it be text the document holds.
        let on_disk: HashMap<String, bool> = listing
            .iter()
            .map(|e| (e.path.clone(), e.size <= MAX_SYNC_FILE))
            .collect();
        self.listing = listing
            .iter()
            .map(|e| (e.path.clone(), (e.size, e.mtime_ns)))
            .collect();
        self.replica.take_dirty();
        // Kept until this agreement completes: an interrupted one is tried again with it.
        let restored = self.restored.clone();
        let mut not_text = Vec::new();
        for path in self.replica.paths() {
            if WorkspacePath::parse(&path).is_err() {
                continue;
            }
            let Some(text) = self.replica.text(&path) else {
                continue;
            };
            if text.len() as u64 > MAX_SYNC_FILE {
                continue;
            }
            let (disk, not_text_now) = match on_disk.get(&path) {
                Some(true) => match self.read(&path).await? {
                    OnDisk::Text(t) => (Some(t), false),
                    OnDisk::NotText => (None, true),
                    OnDisk::Unreadable => (None, false),
                },
                Some(false) => (None, true),
                None => (None, false),
            };
            if disk.as_deref() == Some(text.as_str()) {
                self.base.insert(path, text);
                continue;
            }
            let agreed = self.base.get(&path) == Some(&text)
                || (self.base.get(&path).is_none() && restored.get(&path) == Some(&digest(&text)));
            if not_text_now && agreed {
                // The document reads as both sides last agreed and the file on disk is no
                // longer text: room code changed it since; it leaves the document (the disk
                // wins, as for any change inside the editors did not also make).
                not_text.push(path);
                continue;
            }
            match (self.base.get(&path).cloned(), disk) {
                (Some(base), Some(disk)) if base != disk => {
                    self.merge_in(&path, &base, &disk).await?;
                }
                // The document reads as when the restored workspace was saved, the disk does
                // not: code that ran since the start (a readiness step) changed it. That change
                // is taken in, as any change inside would be.
                (None, Some(disk)) if restored.get(&path) == Some(&digest(&text)) => {
                    self.merge_in(&path, &text, &disk).await?;
                }
                _ => {
                    if self.write(&path, &text).await? {
                        self.base.insert(path, text);
                    }
                }
            }
        }
        self.leave_document(&not_text).await?;
        for entry in listing {
            // Files the document has were agreed on above (or are not the disk's to replace);
            // files too large are not text it can hold.
            if self.replica.text(&entry.path).is_some()
                || entry.size > MAX_SYNC_FILE
                || not_text.contains(&entry.path)
            {
                continue;
            }
            let agreed = match self.base.get(&entry.path) {
                Some(t) => Some(digest(t)),
                None => restored.get(&entry.path).cloned(),
            };
            if agreed.is_none() && self.would_leave_out(&entry.path) {
                // Not read at all: the document has no room for it.
                self.left_out.insert(entry.path);
                continue;
            }
            let Some(text) = self.read_text(&entry.path).await? else {
                continue;
            };
            if agreed.as_deref() == Some(digest(&text).as_str()) {
                // Unchanged since both sides had it: the document deleted it meanwhile (while
                // the sandbox slept, or this sync was away). The workspace follows.
                self.base.remove(&entry.path);
                self.listing.remove(&entry.path);
                let _ = self
                    .call(Op::RemoveFile {
                        path: entry.path.clone(),
                    })
                    .await;
                continue;
            }
            if self.would_leave_out(&entry.path) {
                self.left_out.insert(entry.path);
                continue;
            }
            self.import(&entry.path, &text).await?;
        }
        self.replica.take_dirty();
        self.restored.clear();
        Ok(())
    }

    async fn import(&mut self, path: &str, text: &str) -> Result<(), SyncError> {
        if self.would_leave_out(path) {
            // The document is bounded, the workspace is not: the file stays on disk, untouched,
            // and the room is told how many are left out.
            self.left_out.insert(path.to_owned());
            self.report();
            return Ok(());
        }
        self.left_out.remove(path);
        let update = {
            let mut txn = self.replica.doc.transact_mut();
            let t: TextRef = self
                .replica
                .files
                .insert(&mut txn, path, yrs::TextPrelim::new(text));
            let _ = t;
            txn.encode_update_v1()
        };
        self.publish(update).await?;
        self.base.insert(path.to_owned(), text.to_owned());
        self.report();
        Ok(())
    }

    /// Whether `path` is new to the document and the document has no room for another file.
    fn would_leave_out(&self, path: &str) -> bool {
        !self.base.contains_key(path)
            && self.replica.text(path).is_none()
            && self.replica.files.len(&self.replica.doc.transact()) as usize
                >= self.ctx.limits.max_synced_files
    }

    /// Publishes the counts the sandbox panel shows.
    fn report(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let held = self.replica.files.len(&self.replica.doc.transact()) as usize;
        self.ctx.stats.files.store(held, Relaxed);
        self.ctx
            .stats
            .not_mirrored
            .store(self.left_out.len(), Relaxed);
    }

    /// Document -> disk, for the paths edited since the last flush.
    async fn flush(&mut self) -> Result<(), SyncError> {
        for path in self.replica.take_dirty() {
            if WorkspacePath::parse(&path).is_err() {
                continue;
            }
            match self.replica.text(&path) {
                Some(text) => {
                    if text.len() as u64 > MAX_SYNC_FILE || self.base.get(&path) == Some(&text) {
                        continue;
                    }
                    if self.write(&path, &text).await? {
                        self.base.insert(path, text);
                    }
                }
                None => {
                    if self.base.remove(&path).is_some() {
                        let _ = self.call(Op::RemoveFile { path: path.clone() }).await;
                        self.listing.remove(&path);
                    }
                }
            }
        }
        Ok(())
    }

    /// Disk -> document, for files changed inside the sandbox since the last scan.
    async fn scan(&mut self) -> Result<(), SyncError> {
        let (listing, truncated) = self.list().await?;
        let now: HashMap<String, (u64, i128)> = listing
            .iter()
            .map(|e| (e.path.clone(), (e.size, e.mtime_ns)))
            .collect();
        let changed: Vec<String> = now
            .iter()
            .filter(|(p, v)| self.listing.get(*p) != Some(v))
            .map(|(p, _)| p.clone())
            .collect();
        // A file missing from a listing that was cut short may well exist: no deletion is
        // inferred from one.
        let vanished: Vec<String> = if truncated {
            Vec::new()
        } else {
            self.base
                .keys()
                .filter(|p| !now.contains_key(*p))
                .cloned()
                .collect()
        };
        self.listing = now;
        if !truncated {
            let listing = &self.listing;
            self.left_out.retain(|p| listing.contains_key(p));
        }
        let mut not_text = Vec::new();
        let mut editors_win = false;
        for path in changed {
            let fits = self
                .listing
                .get(&path)
                .is_some_and(|(size, _)| *size <= MAX_SYNC_FILE);
            if fits && self.would_leave_out(&path) {
                // Not read at all: the document has no room for it.
                self.left_out.insert(path);
                continue;
            }
            let disk = if fits {
                self.read(&path).await?
            } else {
                OnDisk::NotText
            };
            let disk = match disk {
                OnDisk::Text(t) => Some(t),
                OnDisk::NotText => None,
                OnDisk::Unreadable => {
                    // Read again on the next scan, as changed.
                    self.listing.remove(&path);
                    continue;
                }
            };
            let Some(disk) = disk else {
                // Not text now (binary, or too large). A file the two sides agreed on leaves
                // the document, unless editors changed it too: then
                // their text wins, as in any conflict, and is written back.
                self.left_out.remove(&path);
                if let Some(base) = self.base.get(&path) {
                    if self.replica.text(&path).as_ref() == Some(base) {
                        not_text.push(path);
                    } else {
                        self.replica.dirty().insert(path);
                        editors_win = true;
                    }
                }
                continue;
            };
            match self.base.get(&path) {
                Some(b) if *b == disk => {}
                Some(b) => {
                    let b = b.clone();
                    self.merge_in(&path, &b, &disk).await?;
                }
                None => {
                    if self.replica.text(&path).is_none() {
                        self.import(&path, &disk).await?;
                    } else {
                        // The document has it but never agreed with the disk: merge against
                        // an empty base (both kept where they differ, editors first).
                        self.merge_in(&path, "", &disk).await?;
                    }
                }
            }
        }
        if !not_text.is_empty() {
            tracing::debug!(room = %self.ctx.room_id, files = not_text.len(), "files no longer text leave the document");
            self.leave_document(&not_text).await?;
        }
        if editors_win {
            self.flush().await?;
        }
        self.report();
        if !vanished.is_empty() && !self.left_out.is_empty() {
            // Room may have freed up: files left out are looked at again on the next scan.
            for p in &self.left_out {
                self.listing.remove(p);
            }
        }
        if !vanished.is_empty() {
            let wipe = vanished.len() > MASS_DELETE && vanished.len() * 2 > self.base.len();
            if wipe {
                tracing::warn!(room = %self.ctx.room_id, files = vanished.len(), "most of the workspace vanished at once; restoring it from the document");
                self.replica.dirty().extend(vanished.iter().cloned());
                for p in &vanished {
                    self.base.remove(p);
                }
                self.flush().await?;
            } else {
                self.leave_document(&vanished).await?;
            }
        }
        Ok(())
    }

    /// Takes `paths` out of the document, leaving the disk alone (they vanished from it, or
    /// are no longer text there): every editor sees them go, and the agreement forgets them,
    /// so nothing reads them as deleted in the room.
    async fn leave_document(&mut self, paths: &[String]) -> Result<(), SyncError> {
        if paths.is_empty() {
            return Ok(());
        }
        let update = {
            let mut txn = self.replica.doc.transact_mut();
            for p in paths {
                self.replica.files.remove(&mut txn, p);
            }
            txn.encode_update_v1()
        };
        {
            // Only these: editors' edits waiting for the debounce still reach the disk.
            let mut dirty = self.replica.dirty();
            for p in paths {
                dirty.remove(p);
            }
        }
        for p in paths {
            self.base.remove(p);
        }
        self.publish(update).await
    }

    async fn merge_in(&mut self, path: &str, base: &str, disk: &str) -> Result<(), SyncError> {
        let update = {
            let mut txn = self.replica.doc.transact_mut();
            let text = match self.replica.files.get(&txn, path) {
                Some(Out::YText(t)) => t,
                _ => {
                    let t: TextRef =
                        self.replica
                            .files
                            .insert(&mut txn, path, yrs::TextPrelim::new(""));
                    t
                }
            };
            let current = text.get_string(&txn);
            for e in merge(base, &current, disk) {
                if e.delete > 0 {
                    text.remove_range(&mut txn, e.at as u32, e.delete as u32);
                }
                if !e.insert.is_empty() {
                    text.insert(&mut txn, e.at as u32, &e.insert);
                }
            }
            txn.encode_update_v1()
        };
        self.publish(update).await?;
        self.base.insert(path.to_owned(), disk.to_owned());
        // If editors' text won somewhere, the merged text differs from the disk: write it.
        if self.replica.text(path).as_deref() != Some(disk) {
            self.replica.dirty().insert(path.to_owned());
            self.flush().await?;
        } else {
            self.replica.dirty().remove(path);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_content_stays_out() {
        let text = |d: &[u8]| match OnDisk::of(d.to_vec()) {
            OnDisk::Text(t) => Some(Some(t)),
            OnDisk::NotText => Some(None),
            OnDisk::Unreadable => None,
        };
        assert_eq!(text(b"ok\n"), Some(Some("ok\n".into())));
        assert_eq!(text(&[0x7f, b'E', b'L', b'F', 0, 1]), Some(None));
        assert_eq!(text(&[0xff, 0xfe]), Some(None));
        // Cut inside a character (a file being written): nothing concluded yet.
        assert_eq!(text("caf\u{e9}".as_bytes().split_last().unwrap().1), None);
        assert_eq!(text(&[b'a', 0xff, b'b', 0xc3]), Some(None));
    }

    #[test]
    fn yrs_text_offsets_are_bytes() {
        let doc = Doc::new();
        let t = doc.get_or_insert_text("t");
        let mut txn = doc.transact_mut();
        t.insert(&mut txn, 0, "é");
        t.insert(&mut txn, 2, "x");
        assert_eq!(t.get_string(&txn), "éx");
    }
}

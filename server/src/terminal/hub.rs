//! The terminal hub: one task per room that owns the shared terminal's viewers, scrollback,
//! typing announcements, recording and the way in to the PTY. The sandbox supervisor feeds it
//! (which sandbox and PTY to use, state events) but never stands in its way: a snapshot, a
//! start or a stop in the supervisor neither holds up a keystroke nor drops a byte of output.
//!
//! Output comes from the [`pump`] straight into the hub, is kept in the scrollback, handed to
//! the recorder's writer (off the async threads) and offered to every viewer's bounded queue;
//! a viewer that far behind is dropped and catches up from the scrollback when it reconnects.
//! Input goes from the socket to the hub to a forwarder task that owns the PTY's side of the
//! sandbox handle. While the PTY is not there yet (the sandbox is starting or resuming, or the
//! shell is being reopened) keys are queued, bounded, and delivered once it is.

use crate::clock::Clock;
use crate::close::CloseCode;
use crate::terminal::events::{Joined, Said, TermEvent, TermOut};
use crate::terminal::floor::{Floor, Person};
use crate::terminal::recorder::Recorder;
use bytes::Bytes;
use coderoom_sandbox::proto::{Op, MAX_PTY_CHUNK};
use coderoom_sandbox::{Event, Sandbox};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Commands queued for the hub before senders wait (it never waits for long itself).
const HUB_QUEUE: usize = 1024;
/// Terminal chunks queued for one viewer (PTY reads, mostly 4 KiB: about 1 MiB); a viewer this
/// far behind is dropped and catches up from the scrollback when it reconnects, so it never
/// slows the others.
const VIEWER_QUEUE: usize = 256;
/// Longest keys typed at a freshly started shell wait for its first output (its prompt): a
/// shell discards what is typed at it while it starts.
const FIRST_OUTPUT_WAIT: Duration = Duration::from_secs(2);
/// Input chunks queued for the PTY; past it the program in the terminal is not reading, and
/// further keys are refused with an error event instead of piling up.
const INPUT_QUEUE: usize = 256;
/// Keys held while the PTY is not there yet (starting, resuming, reopening the shell).
const MAX_QUEUED_INPUT: usize = 64 << 10;
/// Records queued for the recording's writer; past it the hub (and so the PTY) waits for the
/// disk rather than losing any of the recording.
const RECORD_QUEUE: usize = 1024;
/// Records the writer takes to the blocking pool at once.
const RECORD_BATCH: usize = 256;
/// How often viewers hear that someone is still typing.
const TYPING_EVERY: Duration = Duration::from_secs(1);

/// Where the hub's keys go.
#[derive(Debug)]
pub(crate) enum Link {
    /// Nothing is coming until a key asks for it: the shell exited, or the sandbox was started
    /// by an operation with nobody watching. A key is queued and asks for a PTY.
    Idle,
    /// The sandbox is starting or resuming, or the PTY is being opened: keys are queued.
    Pending,
    /// The PTY of the sandbox started as `generation` is open; `input` reaches it (see
    /// [`pty_port`]).
    Attached {
        generation: u64,
        input: mpsc::Sender<Op>,
    },
    /// The sandbox is not running: keys are refused with this reason.
    Down(String),
}

enum Cmd {
    Join {
        cols: u16,
        rows: u16,
        reply: oneshot::Sender<Joined>,
    },
    Leave {
        viewer: u64,
        done: oneshot::Sender<()>,
    },
    Input {
        viewer: u64,
        user_id: String,
        email: String,
        data: Bytes,
    },
    Resize {
        cols: u16,
        rows: u16,
    },
    Output {
        generation: u64,
        data: Vec<u8>,
    },
    PtyExit {
        generation: u64,
        code: Option<i32>,
    },
    Link(Link),
    Event(Arc<Said>),
    CloseAll(CloseCode),
    Size {
        reply: oneshot::Sender<(u16, u16)>,
    },
    Floor {
        viewer: u64,
        who: Person,
        action: FloorAction,
    },
}

/// What a participant does with the terminal's floor (see [`crate::terminal::floor`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FloorAction {
    Take,
    Request,
    Release,
    /// Hand it to this user, who asked.
    Give(String),
    /// The participant lost `type`.
    Revoked,
}

/// A room's terminal hub. Cheap to clone; the task ends when every handle is gone.
#[derive(Clone)]
pub(crate) struct Hub {
    tx: mpsc::Sender<Cmd>,
    viewers: Arc<AtomicUsize>,
}

/// What the hub needs from its room.
pub(crate) struct HubConfig {
    pub(crate) scrollback_bytes: usize,
    pub(crate) recorder: Recorder,
    pub(crate) clock: Clock,
    /// Told (without waiting) when a key needs a PTY that is not open.
    pub(crate) pty_wanted: mpsc::Sender<()>,
}

impl Hub {
    /// Starts a room's hub task.
    pub(crate) fn start(config: HubConfig) -> Hub {
        let (tx, rx) = mpsc::channel(HUB_QUEUE);
        let viewers = Arc::new(AtomicUsize::new(0));
        let (records, records_rx) = mpsc::channel(RECORD_QUEUE);
        tokio::spawn(write_recording(config.recorder, records_rx));
        let task = Task {
            scrollback: VecDeque::new(),
            scrollback_bytes: config.scrollback_bytes,
            viewers: HashMap::new(),
            viewer_count: viewers.clone(),
            next_viewer: 1,
            size: (80, 24),
            typists: HashMap::new(),
            link: Link::Idle,
            linked_generation: 0,
            exited_early: None,
            input: None,
            queued: VecDeque::new(),
            spoke: None,
            hold_until: None,
            queued_bytes: 0,
            records,
            clock: config.clock,
            pty_wanted: config.pty_wanted,
            floor: Floor::default(),
        };
        tokio::spawn(task.run(rx));
        Hub { tx, viewers }
    }

    /// Viewers connected now.
    pub(crate) fn viewers(&self) -> usize {
        self.viewers.load(Ordering::Acquire)
    }

    /// Adds a viewer: its scrollback, the state of the terminal, and its queue. The first viewer
    /// sets the terminal's size. `None` when the hub is gone.
    pub(crate) async fn join(&self, cols: u16, rows: u16) -> Option<Joined> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Cmd::Join { cols, rows, reply }).await.ok()?;
        rx.await.ok()
    }

    /// Removes a viewer; returns once the hub has (so its count of viewers is up to date).
    pub(crate) async fn leave(&self, viewer: u64) {
        let (done, left) = oneshot::channel();
        if self.tx.send(Cmd::Leave { viewer, done }).await.is_ok() {
            let _ = left.await;
        }
    }

    /// Keys from `user_id` (shown to viewers as `email`), already authorised for `type`.
    pub(crate) async fn input(&self, viewer: u64, (user_id, email): (&str, &str), data: Bytes) {
        let cmd = Cmd::Input {
            viewer,
            user_id: user_id.to_owned(),
            email: email.to_owned(),
            data,
        };
        let _ = self.tx.send(cmd).await;
    }

    pub(crate) async fn resize(&self, cols: u16, rows: u16) {
        let _ = self.tx.send(Cmd::Resize { cols, rows }).await;
    }

    /// The size the PTY should have (the last one a typist asked for).
    pub(crate) async fn size(&self) -> (u16, u16) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Cmd::Size { reply }).await.is_err() {
            return (80, 24);
        }
        rx.await.unwrap_or((80, 24))
    }

    /// Where keys go from now on (the supervisor's view of the sandbox and its PTY).
    pub(crate) async fn link(&self, link: Link) {
        let _ = self.tx.send(Cmd::Link(link)).await;
    }

    /// An event for every viewer.
    pub(crate) async fn event(&self, event: TermEvent) {
        let _ = self.tx.send(Cmd::Event(event.said())).await;
    }

    /// Takes, asks for, releases or hands on the terminal's floor; a refusal is told to
    /// `viewer` (a `floor_refused` event).
    pub(crate) async fn floor(
        &self,
        viewer: u64,
        (user_id, email): (&str, &str),
        action: FloorAction,
    ) {
        let who = Person {
            user_id: user_id.to_owned(),
            email: email.to_owned(),
        };
        let _ = self
            .tx
            .send(Cmd::Floor {
                viewer,
                who,
                action,
            })
            .await;
    }

    /// Closes every viewer's socket with `code`.
    pub(crate) async fn close_all(&self, code: CloseCode) {
        let _ = self.tx.send(Cmd::CloseAll(code)).await;
    }
}

/// One line of the recording, stamped when the hub saw it.
enum Record {
    Output {
        /// Shared with the viewers' queues, not copied.
        data: Bytes,
        size: (u16, u16),
        at_ms: i64,
    },
    Input {
        user_id: String,
        data: Bytes,
        at_ms: i64,
    },
}

struct Task {
    scrollback: VecDeque<u8>,
    scrollback_bytes: usize,
    viewers: HashMap<u64, mpsc::Sender<TermOut>>,
    viewer_count: Arc<AtomicUsize>,
    next_viewer: u64,
    size: (u16, u16),
    /// When each typist was last announced to viewers (`typing` events, at most one per user
    /// per [`TYPING_EVERY`]).
    typists: HashMap<String, tokio::time::Instant>,
    link: Link,
    /// The sandbox generation of the last PTY linked: output of older ones is dropped.
    linked_generation: u64,
    /// A shell that exited before its link arrived.
    exited_early: Option<u64>,
    /// The forwarder of the attached PTY.
    input: Option<mpsc::Sender<Op>>,
    /// Keys waiting for a PTY, with the viewer that typed them.
    queued: VecDeque<(u64, String, Bytes)>,
    /// The generation whose shell has printed something (its prompt): it reads its terminal.
    spoke: Option<u64>,
    /// A freshly attached shell that has printed nothing yet: keys wait for its first output
    /// (a shell still starting discards what is typed at it) until this deadline at most.
    hold_until: Option<tokio::time::Instant>,
    queued_bytes: usize,
    records: mpsc::Sender<Record>,
    clock: Clock,
    pty_wanted: mpsc::Sender<()>,
    /// Who may type now.
    floor: Floor,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        loop {
            let deadline = self.floor.deadline();
            let hold = self.hold_until;
            let cmd = tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => cmd,
                    None => break,
                },
                () = tokio::time::sleep_until(hold.unwrap_or_else(tokio::time::Instant::now)), if hold.is_some() => {
                    // A shell that prints nothing gets its keys all the same.
                    self.hold_until = None;
                    self.flush_queued();
                    continue;
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                    if self.floor.tick(tokio::time::Instant::now()) {
                        self.broadcast_floor();
                    }
                    continue;
                }
            };
            self.handle(cmd).await;
            self.viewer_count
                .store(self.viewers.len(), Ordering::Release);
        }
    }

    async fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Join { cols, rows, reply } => {
                if self.viewers.is_empty() {
                    self.size = (cols, rows);
                }
                let viewer = self.next_viewer;
                self.next_viewer += 1;
                let (tx, rx) = mpsc::channel(VIEWER_QUEUE);
                self.viewers.insert(viewer, tx);
                let state = match &self.link {
                    Link::Attached { .. } | Link::Idle => Some("running"),
                    Link::Pending => Some("starting"),
                    Link::Down(_) => None,
                };
                let mut events: Vec<Arc<Said>> = state
                    .map(|state| {
                        TermEvent::Sandbox {
                            state,
                            reason: None,
                        }
                        .said()
                    })
                    .into_iter()
                    .collect();
                let floor = self.floor.view();
                if floor.holder.is_some() || !floor.requests.is_empty() {
                    events.push(TermEvent::Floor(floor).said());
                }
                let joined = Joined {
                    viewer,
                    scrollback: self.scrollback.iter().copied().collect(),
                    events,
                    rx,
                };
                // Counted before the answer, so the supervisor never sees a joined room as
                // unwatched.
                self.viewer_count
                    .store(self.viewers.len(), Ordering::Release);
                if reply.send(joined).is_err() {
                    self.viewers.remove(&viewer);
                }
            }
            Cmd::Leave { viewer, done } => {
                self.viewers.remove(&viewer);
                if self.floor.left(viewer, tokio::time::Instant::now()) {
                    self.broadcast_floor();
                }
                self.forget_keys_of_gone_viewers();
                self.viewer_count
                    .store(self.viewers.len(), Ordering::Release);
                let _ = done.send(());
            }
            Cmd::Input {
                viewer,
                user_id,
                email,
                data,
            } => {
                if data.is_empty() {
                    return;
                }
                let who = Person { user_id, email };
                match self
                    .floor
                    .keys(viewer, &who, &data, tokio::time::Instant::now())
                {
                    Ok(changed) => {
                        if changed {
                            self.broadcast_floor();
                        }
                    }
                    Err(refused) => {
                        self.refuse(viewer, &refused);
                        return;
                    }
                }
                self.announce_typing(&who.user_id, &who.email);
                self.input(viewer, who.user_id, data).await;
            }
            Cmd::Floor {
                viewer,
                who,
                action,
            } => {
                let now = tokio::time::Instant::now();
                let before = self.floor.view();
                let done = match action {
                    FloorAction::Take => self.floor.take(viewer, &who, now),
                    FloorAction::Request => self.floor.request(viewer, &who, now),
                    FloorAction::Release => Ok(self.floor.release(&who.user_id, now)),
                    FloorAction::Give(to) => self.floor.give(&who.user_id, &to, now),
                    FloorAction::Revoked => Ok(self.floor.revoked(&who.user_id, now)),
                };
                if let Err(refused) = &done {
                    self.refuse(viewer, refused);
                }
                // Whatever the outcome, a change (a lapse found on the way) is told.
                if done.unwrap_or(false) || self.floor.view() != before {
                    self.broadcast_floor();
                }
            }
            Cmd::Resize { cols, rows } => {
                self.size = (cols, rows);
                if let Some(input) = &self.input {
                    let _ = input.try_send(Op::PtyResize { cols, rows });
                }
            }
            // The pump and the supervisor's link reach the hub by different paths: a shell's
            // first prompt (or its exit) may come before the link that names it. Only what
            // comes from an older sandbox than the last one linked is dropped.
            Cmd::Output { generation, data } => {
                if generation >= self.linked_generation {
                    self.spoke = Some(generation);
                    self.output(data).await;
                    if self.hold_until.is_some() && generation == self.linked_generation {
                        self.hold_until = None;
                        self.flush_queued();
                    }
                }
            }
            Cmd::PtyExit { generation, code } => {
                if generation < self.linked_generation {
                    return;
                }
                self.broadcast(TermEvent::ShellExit { code }.said());
                match &self.link {
                    Link::Attached { generation: g, .. } if *g == generation => {
                        self.set_link(Link::Idle);
                    }
                    // Not linked yet: the link that comes for it finds the shell gone.
                    _ => self.exited_early = Some(generation),
                }
            }
            Cmd::Link(link) => self.set_link(link),
            Cmd::Event(said) => self.broadcast(said),
            Cmd::CloseAll(code) => {
                for (_, tx) in self.viewers.drain() {
                    let _ = tx.try_send(TermOut::Close(code));
                }
                self.queued.clear();
                self.queued_bytes = 0;
            }
            Cmd::Size { reply } => {
                let _ = reply.send(self.size);
            }
        }
    }

    fn set_link(&mut self, link: Link) {
        self.input = None;
        self.hold_until = None;
        if let Link::Attached { generation, input } = &link {
            self.linked_generation = *generation;
            if self.exited_early.take() == Some(*generation) {
                // Its shell already exited: a key asks for a new one.
                self.link = Link::Idle;
                if !self.queued.is_empty() {
                    self.link = Link::Pending;
                    let _ = self.pty_wanted.try_send(());
                }
                return;
            }
            self.input = Some(input.clone());
        }
        let refused = match &link {
            Link::Down(reason) => Some(reason.clone()),
            _ => None,
        };
        let attached = matches!(link, Link::Attached { .. });
        self.link = link;
        if attached {
            // Viewers show "starting" until this: now keys reach a shell.
            let running = TermEvent::Sandbox {
                state: "running",
                reason: None,
            };
            self.broadcast(running.said());
        }
        match refused {
            // Keys typed for a sandbox that is not coming are refused, each typist told once.
            Some(reason) => {
                let typists: std::collections::BTreeSet<u64> =
                    self.queued.drain(..).map(|(v, _, _)| v).collect();
                self.queued_bytes = 0;
                for viewer in typists {
                    self.tell(viewer, &reason);
                }
            }
            // Queued keys go once the shell has spoken (its prompt may have come first).
            None if attached && self.spoke != Some(self.linked_generation) => {
                self.hold_until = Some(tokio::time::Instant::now() + FIRST_OUTPUT_WAIT);
            }
            None => self.flush_queued(),
        }
    }

    /// Hands queued keys to an attached PTY, in the order they were typed.
    fn flush_queued(&mut self) {
        if self.input.is_none() || self.hold_until.is_some() {
            return;
        }
        while let Some((viewer, user_id, data)) = self.queued.pop_front() {
            self.queued_bytes -= data.len();
            self.to_pty(viewer, user_id, data);
        }
    }

    /// Hands keys to the attached PTY's forwarder, as typed by `user_id` (a line they end runs
    /// for them: its processes count to them); tells the typist when it takes no more (the
    /// program in the terminal is not reading).
    fn to_pty(&self, viewer: u64, user_id: String, data: Bytes) {
        let Some(input) = &self.input else { return };
        let op = Op::PtyTyped {
            data: serde_bytes::ByteBuf::from(Vec::from(data)),
            actor: user_id,
        };
        if input.try_send(op).is_err() {
            self.tell(
                viewer,
                "the terminal is not reading input; keys were dropped",
            );
        }
    }

    async fn input(&mut self, viewer: u64, user_id: String, data: Bytes) {
        if data.is_empty() {
            return;
        }
        if let Link::Down(reason) = &self.link {
            let reason = reason.clone();
            self.tell(viewer, &reason);
            return;
        }
        let at_ms = self.clock.now_ms();
        let record = Record::Input {
            user_id: user_id.clone(),
            data: data.clone(),
            at_ms,
        };
        let _ = self.records.send(record).await;
        if self.input.is_some() && self.hold_until.is_none() {
            self.to_pty(viewer, user_id, data);
            return;
        }
        if self.queued_bytes + data.len() > MAX_QUEUED_INPUT {
            self.tell(
                viewer,
                "too many keys while the terminal starts; keys were dropped",
            );
            return;
        }
        self.queued_bytes += data.len();
        self.queued.push_back((viewer, user_id, data));
        if matches!(self.link, Link::Idle) {
            // The shell is gone: ask the supervisor for a new one; keys wait for it.
            self.link = Link::Pending;
            let _ = self.pty_wanted.try_send(());
        }
    }

    async fn output(&mut self, data: Vec<u8>) {
        self.scrollback.extend(data.iter().copied());
        let excess = self.scrollback.len().saturating_sub(self.scrollback_bytes);
        self.scrollback.drain(..excess);
        let bytes = Bytes::from(data);
        let before = self.viewers.len();
        self.viewers.retain(|_, tx| {
            // Too far behind: dropped; it reconnects and catches up from the scrollback.
            tx.try_send(TermOut::Output(bytes.clone())).is_ok()
        });
        if self.viewers.len() != before {
            self.forget_keys_of_gone_viewers();
        }
        let record = Record::Output {
            data: bytes,
            size: self.size,
            at_ms: self.clock.now_ms(),
        };
        let _ = self.records.send(record).await;
    }

    /// Tells every viewer who is typing (the people panel shows it), at most once a second per
    /// typist.
    fn announce_typing(&mut self, user_id: &str, email: &str) {
        let now = tokio::time::Instant::now();
        if let Some(last) = self.typists.get(user_id) {
            if now.duration_since(*last) < TYPING_EVERY {
                return;
            }
        }
        self.typists
            .retain(|_, t| now.duration_since(*t) < TYPING_EVERY);
        self.typists.insert(user_id.to_owned(), now);
        let typing = TermEvent::Typing {
            user_id: user_id.to_owned(),
            email: email.to_owned(),
        };
        self.broadcast(typing.said());
    }

    /// Keys queued by viewers that are gone are not sent to a shell later.
    fn forget_keys_of_gone_viewers(&mut self) {
        let viewers = &self.viewers;
        self.queued.retain(|(v, _, _)| viewers.contains_key(v));
        self.queued_bytes = self.queued.iter().map(|(_, _, d)| d.len()).sum();
    }

    fn tell(&self, viewer: u64, reason: &str) {
        if let Some(tx) = self.viewers.get(&viewer) {
            let _ = tx.try_send(TermOut::Event(TermEvent::error(reason).said()));
        }
    }

    /// Tells `viewer` why its keys (or its floor action) were refused.
    fn refuse(&self, viewer: u64, refused: &crate::terminal::floor::Refused) {
        if let Some(tx) = self.viewers.get(&viewer) {
            let holder = match refused {
                crate::terminal::floor::Refused::Busy(p) => Some(p.clone()),
                _ => None,
            };
            let event = TermEvent::FloorRefused {
                reason: refused.reason(),
                holder,
            };
            let _ = tx.try_send(TermOut::Event(event.said()));
        }
    }

    fn broadcast_floor(&mut self) {
        let view = TermEvent::Floor(self.floor.view()).said();
        self.broadcast(view);
    }

    fn broadcast(&mut self, said: Arc<Said>) {
        self.viewers
            .retain(|_, tx| tx.try_send(TermOut::Event(said.clone())).is_ok());
    }
}

/// The way in to a sandbox's PTY for [`Link::Attached`]: a task sends keys and resizes to the
/// sandbox one after the other, so the hub never waits on the sandbox. It ends when the hub
/// lets go of the link or the sandbox ends.
pub(crate) fn pty_port(sandbox: Sandbox) -> mpsc::Sender<Op> {
    let (tx, mut rx) = mpsc::channel::<Op>(INPUT_QUEUE);
    tokio::spawn(async move {
        while let Some(op) = rx.recv().await {
            if sandbox.send(op).await.is_err() {
                break;
            }
        }
    });
    tx
}

/// Writes the recording on the blocking pool, a batch at a time, so no disk write runs on the
/// async threads. The queue is bounded: a disk that cannot keep up slows the terminal instead
/// of losing the recording.
async fn write_recording(recorder: Recorder, mut rx: mpsc::Receiver<Record>) {
    let mut recorder = Some(recorder);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < RECORD_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let Some(mut r) = recorder.take() else { break };
        let written = tokio::task::spawn_blocking(move || {
            for record in batch {
                match record {
                    Record::Output { data, size, at_ms } => r.output(&data, size, at_ms),
                    Record::Input {
                        user_id,
                        data,
                        at_ms,
                    } => r.input(&user_id, &data, at_ms),
                }
            }
            r
        })
        .await;
        match written {
            Ok(r) => recorder = Some(r),
            Err(e) => {
                tracing::error!(error = %e, "the terminal recording's writer failed; recording stopped");
                break;
            }
        }
    }
    // Whatever else arrives is not recorded, but the hub is never held up by a dead writer.
    while rx.recv().await.is_some() {}
}

/// Forwards the sandbox's terminal events to the hub at no more than `rate` bytes of output per
/// second. Slowing down here fills the agent's queue and then the PTY, so a program that writes
/// without end is slowed, never buffered and never dropped. The hub does nothing slow, so the
/// agent's stream (which also carries snapshots) keeps moving.
pub(crate) async fn pump(mut events: mpsc::Receiver<Event>, generation: u64, rate: u64, hub: Hub) {
    let rate = rate as f64;
    // A burst of a tenth of a second: a screenful passes at once, a flood is paced from the
    // start (so viewers' queues never see a second's worth at once).
    let burst = (rate / 10.0).max(64.0 * 1024.0);
    let mut tokens = burst;
    let mut last = tokio::time::Instant::now();
    let mut exit = None;
    loop {
        if let Some(code) = exit.take() {
            if hub
                .tx
                .send(Cmd::PtyExit { generation, code })
                .await
                .is_err()
            {
                break;
            }
        }
        let Some(event) = events.recv().await else {
            break;
        };
        let mut data = match event {
            Event::PtyOutput(data) => data,
            Event::PtyExit { code } => {
                exit = Some(code);
                continue;
            }
        };
        // Reads that waited (while the rate held us back) go on as one chunk: viewers' queues
        // count chunks, and a flood of small reads would fill them with little output.
        while data.len() < MAX_PTY_CHUNK {
            match events.try_recv() {
                Ok(Event::PtyOutput(more)) => data.extend_from_slice(&more),
                Ok(Event::PtyExit { code }) => {
                    exit = Some(code);
                    break;
                }
                Err(_) => break,
            }
        }
        let now = tokio::time::Instant::now();
        tokens = (tokens + now.duration_since(last).as_secs_f64() * rate).min(burst);
        last = now;
        tokens -= data.len() as f64;
        if tokens < 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(-tokens / rate)).await;
        }
        if hub.tx.send(Cmd::Output { generation, data }).await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(dir: &std::path::Path) -> (Hub, mpsc::Receiver<()>) {
        let (pty_wanted, wanted) = mpsc::channel(1);
        let hub = Hub::start(HubConfig {
            scrollback_bytes: 1 << 20,
            recorder: Recorder::new(dir.to_owned(), 1 << 20),
            clock: Clock::system(),
            pty_wanted,
        });
        (hub, wanted)
    }

    async fn next_event(rx: &mut mpsc::Receiver<TermOut>) -> serde_json::Value {
        loop {
            match rx.recv().await {
                Some(TermOut::Event(e)) => return serde_json::from_str(&e.text).unwrap(),
                Some(_) => continue,
                None => panic!("the viewer was dropped"),
            }
        }
    }

    /// Output beyond the rate waits at the source: 10 MiB at 1 MiB/s take ~9.9 s (a tenth of a
    /// second of burst), measured on the paused test clock; nothing is dropped on the way.
    #[tokio::test(start_paused = true)]
    async fn terminal_output_is_held_to_its_rate() {
        let dir = tempfile::tempdir().unwrap();
        let (hub, _wanted) = hub(dir.path());
        let (input, _pty) = mpsc::channel(16);
        hub.link(Link::Attached {
            generation: 7,
            input,
        })
        .await;
        let mut joined = hub.join(80, 24).await.unwrap();
        let (ev_tx, ev_rx) = mpsc::channel(4);
        tokio::spawn(pump(ev_rx, 7, 1 << 20, hub.clone()));
        let started = tokio::time::Instant::now();
        tokio::spawn(async move {
            for i in 0..10u8 {
                ev_tx
                    .send(Event::PtyOutput(vec![i; 1 << 20]))
                    .await
                    .unwrap();
            }
        });
        let mut bytes = 0;
        while bytes < 10 << 20 {
            match joined.rx.recv().await {
                Some(TermOut::Output(data)) => {
                    // In order: byte n of the stream belongs to chunk n / 1 MiB.
                    assert!(data.iter().all(|b| usize::from(*b) == bytes >> 20));
                    bytes += data.len();
                }
                Some(_) => {}
                None => panic!("the viewer was dropped after {bytes} bytes"),
            }
        }
        let took = started.elapsed().as_secs_f64();
        assert!((9.8..10.1).contains(&took), "{took}");
    }

    /// Keys typed before the PTY is there wait for it and arrive in order; keys for a sandbox
    /// that is not coming are refused with an error, and an exited shell is reopened on demand.
    #[tokio::test]
    async fn keys_wait_for_the_pty_and_are_never_silently_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (hub, mut wanted) = hub(dir.path());
        hub.link(Link::Pending).await;
        let mut joined = hub.join(80, 24).await.unwrap();
        assert!(
            matches!(
                joined.events[0].event,
                TermEvent::Sandbox {
                    state: "starting",
                    ..
                }
            ),
            "{:?}",
            joined.events
        );
        hub.input(joined.viewer, ("u1", "a@x"), Bytes::from_static(b"ec"))
            .await;
        hub.input(joined.viewer, ("u1", "a@x"), Bytes::from_static(b"ho\r"))
            .await;
        let (input, mut pty) = mpsc::channel(16);
        hub.link(Link::Attached {
            generation: 1,
            input,
        })
        .await;
        // A shell still starting discards what is typed at it: the keys wait for its prompt.
        let early = tokio::time::timeout(Duration::from_millis(300), pty.recv()).await;
        assert!(
            !matches!(early, Ok(Some(Op::PtyTyped { .. }))),
            "keys reached a shell that had printed nothing: {early:?}"
        );
        let (ev_tx, ev_rx) = mpsc::channel(4);
        tokio::spawn(pump(ev_rx, 1, 1 << 30, hub.clone()));
        ev_tx.send(Event::PtyOutput(b"$ ".to_vec())).await.unwrap();
        let mut typed = Vec::new();
        while typed != b"echo\r" {
            match pty.recv().await {
                Some(Op::PtyTyped { data, .. }) => typed.extend_from_slice(&data),
                Some(Op::PtyResize { .. }) => {}
                other => panic!("unexpected {other:?} after {typed:?}"),
            }
        }
        // The shell exits: the next key asks for a new one and waits for it.
        ev_tx.send(Event::PtyExit { code: Some(0) }).await.unwrap();
        assert_eq!(next_event(&mut joined.rx).await["type"], "typing");
        // Attached: viewers stop showing "starting".
        let running = next_event(&mut joined.rx).await;
        assert_eq!(
            (&running["type"], &running["state"]),
            (&"sandbox".into(), &"running".into())
        );
        assert_eq!(next_event(&mut joined.rx).await["type"], "exit");
        hub.input(joined.viewer, ("u1", "a@x"), Bytes::from_static(b"x"))
            .await;
        tokio::time::timeout(Duration::from_secs(10), wanted.recv())
            .await
            .expect("a PTY was asked for")
            .unwrap();
        // The sandbox stops instead: the queued key is refused, out loud.
        hub.link(Link::Down("the sandbox is not running".into()))
            .await;
        let e = next_event(&mut joined.rx).await;
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["reason"], "the sandbox is not running");
    }
}

//! The server in a room for one piece of work, as a participant: it joins, receives the whole
//! document, makes at most one change, sees that the room took it, and leaves. Checkpoints read
//! the document this way and rollbacks rewrite it, so a rollback reaches every client as an
//! ordinary update (checked, logged and broadcast like a keystroke) made by whoever asked.

use crate::config::Limits;
use crate::ids::RoomId;
use crate::room::outbox::{Outbound, Outbox, OutboxRx};
use crate::room::protocol::Inbound;
use crate::room::{ConnId, RoomCmd, Rooms};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;
use yrs::sync::protocol::{Message, SyncMessage};
use yrs::updates::decoder::Decode;
use yrs::{Doc, GetString, Map, Out, ReadTxn, StateVector, Text, Transact, Update};

/// Longest the room may take to answer.
const WITHIN: Duration = Duration::from_secs(30);

/// Why a visit failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VisitError {
    #[error("cannot join the room")]
    Join,
    #[error("the room did not answer in time")]
    Timeout,
    #[error("the room closed the visit")]
    Closed,
    #[error("the room sent an undecodable message")]
    Decode(#[from] yrs::encoding::read::Error),
    #[error("the room's document does not apply")]
    Apply(#[from] yrs::error::UpdateError),
    /// The room refused the change (the document is at its size cap, for one).
    #[error("the room refused the change (is the document at its size cap?)")]
    Refused,
}

/// A participant the server itself plays, holding a replica of the room's document.
pub(crate) struct Visit {
    conn: ConnId,
    room: mpsc::Sender<RoomCmd>,
    out: OutboxRx,
    /// The room's document as of joining (and this visit's change).
    pub(crate) doc: Doc,
    left: bool,
}

impl Visit {
    /// Joins `room_id` as `who` (user id, shown name) and receives the whole document. The
    /// files it creates, moves and deletes are journaled as `who`'s.
    pub(crate) async fn start(
        rooms: &Rooms,
        limits: &Limits,
        room_id: &RoomId,
        who: (&str, &str),
    ) -> Result<Self, VisitError> {
        Self::join(rooms, limits, room_id, who, true).await
    }

    /// [`Visit::start`] for a change recorded as what it is elsewhere (a checkpoint's restore,
    /// a read): its file operations are not journaled one by one.
    pub(crate) async fn start_unjournaled(
        rooms: &Rooms,
        limits: &Limits,
        room_id: &RoomId,
        who: (&str, &str),
    ) -> Result<Self, VisitError> {
        Self::join(rooms, limits, room_id, who, false).await
    }

    async fn join(
        rooms: &Rooms,
        limits: &Limits,
        room_id: &RoomId,
        who: (&str, &str),
        journaled: bool,
    ) -> Result<Self, VisitError> {
        let conn = crate::room::task::next_conn_id();
        // In-process, not a socket: not counted with the connections' queued bytes.
        let (outbox, out) = Outbox::new(
            limits.outbound_queue_bytes,
            limits.max_doc_bytes,
            Default::default(),
        );
        let room = rooms
            .join(
                room_id,
                conn,
                who,
                (crate::room::task::Rights::FULL, journaled),
                &outbox,
            )
            .await
            .map_err(|_| VisitError::Join)?;
        let mut visit = Visit {
            conn,
            room,
            out,
            doc: Doc::new(),
            left: false,
        };
        let all = visit.ask(StateVector::default()).await?;
        visit
            .doc
            .transact_mut()
            .apply_update(Update::decode_v1(&all)?)?;
        Ok(visit)
    }

    /// Sends sync step 1 with `sv` and returns the room's answer (what it has beyond `sv`).
    /// The room answers after it applied and committed everything this visit sent before.
    async fn ask(&mut self, sv: StateVector) -> Result<Vec<u8>, VisitError> {
        self.room
            .send(RoomCmd::inbound(self.conn, vec![Inbound::SyncStep1(sv)]))
            .await
            .map_err(|_| VisitError::Closed)?;
        let answer = async {
            loop {
                match self.out.recv().await {
                    Some(Outbound::Frame(_, bytes)) => {
                        if let Message::Sync(SyncMessage::SyncStep2(data)) =
                            Message::decode_v1(&bytes)?
                        {
                            return Ok(data);
                        }
                        // Others' updates and presence: this visit reads the answer only.
                    }
                    Some(Outbound::Close(..)) | None => return Err(VisitError::Closed),
                }
            }
        };
        tokio::time::timeout(WITHIN, answer)
            .await
            .map_err(|_| VisitError::Timeout)?
    }

    /// Makes the room's files read `target`: files it lacks are made, files it does not name
    /// are deleted, and changed files get minimal character edits (so cursors elsewhere in them
    /// stay where they are). Returns once the room has applied and stored the change; `false`
    /// when nothing needed changing.
    pub(crate) async fn rewrite(
        &mut self,
        target: &BTreeMap<String, String>,
    ) -> Result<bool, VisitError> {
        let before = self.doc.transact().state_vector();
        let files = self.doc.get_or_insert_map("files");
        let update = {
            let mut txn = self.doc.transact_mut();
            let present: Vec<String> = files.keys(&txn).map(str::to_owned).collect();
            for path in present.iter().filter(|p| !target.contains_key(*p)) {
                files.remove(&mut txn, path);
            }
            for (path, want) in target {
                match files.get(&txn, path) {
                    Some(Out::YText(text)) => {
                        let now = text.get_string(&txn);
                        for e in crate::room::merge::merge(&now, &now, want) {
                            if e.delete > 0 {
                                text.remove_range(&mut txn, e.at as u32, e.delete as u32);
                            }
                            if !e.insert.is_empty() {
                                text.insert(&mut txn, e.at as u32, &e.insert);
                            }
                        }
                    }
                    _ => {
                        files.insert(&mut txn, path.as_str(), yrs::TextPrelim::new(want.as_str()));
                    }
                }
            }
            txn.encode_update_v1()
        };
        if update.len() <= 2 {
            return Ok(false);
        }
        let mine = self.doc.client_id();
        let wanted = self.doc.transact().state_vector().get(&mine);
        self.room
            .send(RoomCmd::inbound(
                self.conn,
                vec![Inbound::Update {
                    update: Update::decode_v1(&update)?,
                    bytes: update,
                }],
            ))
            .await
            .map_err(|_| VisitError::Closed)?;
        // What the room holds beyond the state before the change includes the change, unless
        // the room refused it.
        let answer = self.ask(before).await?;
        let held = Update::decode_v1(&answer)?.state_vector().get(&mine);
        if held < wanted {
            return Err(VisitError::Refused);
        }
        Ok(true)
    }
}

impl Visit {
    /// Makes file `path` read `content` (made if missing; minimal edits otherwise), leaving
    /// every other file as it is. `false` when nothing needed changing.
    pub(crate) async fn write_file(
        &mut self,
        path: &str,
        content: &str,
    ) -> Result<bool, VisitError> {
        let mut target = texts_of(&self.doc);
        target.insert(path.to_owned(), content.to_owned());
        self.rewrite(&target).await
    }

    /// Shows this visit in the room's presence at the end of file `path` (a cursor there, as
    /// editors show one), until it leaves. The room stamps who it is.
    pub(crate) async fn announce_at(&mut self, path: &str) {
        let files = self.doc.get_or_insert_map("files");
        let cursor = {
            let txn = self.doc.transact();
            match files.get(&txn, path) {
                Some(Out::YText(text)) => {
                    let end = text.len(&txn);
                    yrs::IndexedSequence::sticky_index(&text, &txn, end, yrs::Assoc::Before)
                        .and_then(|i| serde_json::to_value(i).ok())
                }
                _ => None,
            }
        };
        let state = serde_json::json!({
            "user": {},
            "agent": true,
            "file": path,
            "cursor": cursor.map(|c| serde_json::json!({ "anchor": c, "head": c })),
        });
        let mut clients = std::collections::HashMap::new();
        clients.insert(
            self.doc.client_id(),
            yrs::sync::awareness::AwarenessUpdateEntry {
                clock: 1,
                json: state.to_string().into(),
            },
        );
        let _ = self
            .room
            .send(RoomCmd::inbound(
                self.conn,
                vec![Inbound::Awareness(yrs::sync::awareness::AwarenessUpdate {
                    clients,
                })],
            ))
            .await;
    }

    /// Leaves the room.
    pub(crate) async fn leave(mut self) {
        self.left = true;
        let _ = self.room.send(RoomCmd::Leave { conn: self.conn }).await;
    }
}

impl Drop for Visit {
    /// A visit cut short (an error, a dropped request) leaves too, as far as the room's queue
    /// has room; its outbox going away ends the membership otherwise.
    fn drop(&mut self) {
        if !self.left {
            let _ = self.room.try_send(RoomCmd::Leave { conn: self.conn });
        }
    }
}

/// The text files (path -> text) of a document's `files` map.
pub(crate) fn texts_of(doc: &Doc) -> BTreeMap<String, String> {
    let files = doc.get_or_insert_map("files");
    let txn = doc.transact();
    files
        .iter(&txn)
        .filter_map(|(path, v)| match v {
            Out::YText(t) => Some((path.to_owned(), t.get_string(&txn))),
            _ => None,
        })
        .collect()
}

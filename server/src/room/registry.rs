//! The registry of loaded rooms: finds a room's task or starts it, and forgets it when it
//! unloads, fails or panics. A panic in one room ends that room's task only; the next join
//! reloads it from storage.

use crate::ids::RoomId;
use crate::registry::Registry;
use crate::room::task::{Room, RoomCmd, RoomDeps, ROOM_QUEUE};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

/// Attempts to join a room that is unloading at the moment of the join.
const JOIN_ATTEMPTS: usize = 3;

#[derive(Clone)]
pub(crate) struct Rooms {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry<RoomCmd>,
    deps: RoomDeps,
    tracker: TaskTracker,
}

/// Counts a loaded room for as long as its task lives, panics included.
struct LoadedGuard(crate::metrics::Metrics);

impl Drop for LoadedGuard {
    fn drop(&mut self) {
        self.0.rooms_loaded.dec();
    }
}

impl Rooms {
    /// Whether another live server holds `room_id` (scale-out: it moved there, or was loaded
    /// there first). `false` when the database does not answer.
    pub(crate) async fn held_elsewhere(&self, room_id: &RoomId) -> bool {
        matches!(
            self.inner.deps.store.room_owner(room_id).await,
            Ok(Some(owner)) if owner.server != self.inner.deps.server.id
        )
    }

    /// Whether the room is loaded on this server (someone may be editing it).
    pub(crate) fn is_loaded(&self, room_id: &RoomId) -> bool {
        self.inner.registry.get(room_id).is_some()
    }

    /// Whether anything of the room's document was ever stored (`true` when the database does
    /// not answer: the caller then waits for the document itself).
    pub(crate) async fn doc_stored(&self, room_id: &RoomId) -> bool {
        self.inner
            .deps
            .store
            .doc_stored(room_id)
            .await
            .unwrap_or(true)
    }

    /// How long a room's lease lasts (`--room-lease-ms`): the unit other claims are timed in.
    pub(crate) fn lease_ms(&self) -> i64 {
        self.inner.deps.lease_ms
    }

    pub(crate) fn new(deps: RoomDeps, tracker: TaskTracker) -> Self {
        Rooms {
            inner: Arc::new(Inner {
                registry: Registry::default(),
                deps,
                tracker,
            }),
        }
    }

    /// The command channel of the room's task, starting the task when the room is not loaded.
    pub(crate) fn handle(&self, room_id: &RoomId) -> mpsc::Sender<RoomCmd> {
        self.inner
            .registry
            .get_or_start(room_id, ROOM_QUEUE, |_, rx, generation| {
                let rooms = self.clone();
                let id = room_id.to_owned();
                let task = tokio::spawn(rooms.clone().room_main(id.clone(), generation, rx));
                self.inner.tracker.spawn(async move {
                    if let Err(e) = task.await {
                        if e.is_panic() {
                            tracing::error!(room = %id, "room task panicked; it reloads from storage on the next join");
                            rooms.inner.deps.metrics.room_panics.inc();
                        }
                        rooms.inner.registry.forget(&id, generation);
                    }
                });
            })
    }

    async fn room_main(self, id: RoomId, generation: u64, mut rx: mpsc::Receiver<RoomCmd>) {
        let deps = self.inner.deps.clone();
        deps.metrics.rooms_loaded.inc();
        let _loaded = LoadedGuard(deps.metrics.clone());
        let room = match Room::load(id.clone(), deps).await {
            Ok(room) => room,
            Err(crate::room::task::LoadError::Elsewhere(owner)) => {
                // Lost a race for the room: its clients reconnect and are forwarded there.
                tracing::info!(room = %id, owner = %owner.server, "the room is loaded on another server");
                self.inner.registry.forget(&id, generation);
                return;
            }
            Err(e) => {
                tracing::error!(room = %id, error = %e, "cannot load room");
                self.inner.registry.forget(&id, generation);
                return;
            }
        };
        tracing::debug!(room = %id, "room loaded");
        let release =
            |rx: &mpsc::Receiver<RoomCmd>| self.inner.registry.release(&id, generation, rx);
        let exit = room.run(&mut rx, &release).await;
        tracing::debug!(room = %id, ?exit, "room unloaded");
        self.inner.registry.forget(&id, generation);
    }

    /// Sends `cmd` to the room's task if the room is loaded (a room that is not loaded has no
    /// connections to tell).
    /// Returns whether the room took the command.
    pub(crate) async fn notify(&self, room_id: &RoomId, cmd: RoomCmd) -> bool {
        match self.inner.registry.get(room_id) {
            Some(tx) => tx.send(cmd).await.is_ok(),
            None => false,
        }
    }

    /// Joins connection `conn` of `user_id` (with its rights to edit and observe) to the room,
    /// loading it if needed. `Err(None)`: the room could not be loaded.
    pub(crate) async fn join(
        &self,
        room_id: &RoomId,
        conn: crate::room::ConnId,
        (user_id, name): (&str, &str),
        (rights, journaled): (crate::room::task::Rights, bool),
        outbox: &crate::room::outbox::Outbox,
    ) -> Result<mpsc::Sender<RoomCmd>, Option<crate::room::task::JoinError>> {
        for _ in 0..JOIN_ATTEMPTS {
            let room = self.handle(room_id);
            let (reply, answer) = tokio::sync::oneshot::channel();
            let cmd = RoomCmd::Join {
                conn,
                user_id: user_id.to_owned(),
                name: name.to_owned(),
                rights,
                journaled,
                out: outbox.clone(),
                reply,
            };
            if room.send(cmd).await.is_err() {
                continue;
            }
            match answer.await {
                Ok(Ok(())) => return Ok(room),
                Ok(Err(e)) => return Err(Some(e)),
                // The room unloaded or failed while we joined: try a fresh load.
                Err(_) => continue,
            }
        }
        Err(None)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::Limits;
    use crate::metrics::Metrics;
    use crate::room::outbox::{Outbound, Outbox};
    use crate::room::protocol::Inbound;
    use crate::room::task::{next_conn_id, ConnId};
    use crate::room::RoomCmd;
    use crate::store::Store;
    use tokio::sync::oneshot;
    use tokio_util::sync::CancellationToken;
    use yrs::updates::decoder::Decode;
    use yrs::{Doc, Text, Transact, Update};

    async fn rooms() -> (Rooms, Store, tempfile::TempDir) {
        rooms_at(crate::clock::Clock::system()).await
    }

    /// Rooms whose rights, timers and audit records read `clock`.
    async fn rooms_at(clock: crate::clock::Clock) -> (Rooms, Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        store.upsert_user("u", "u@example.com").await.unwrap();
        for id in ["a", "b"] {
            let change = crate::store::Change::CreateRoom {
                id: crate::ids::RoomId::known(id),
                name: id.into(),
                owner: crate::ids::UserId::known("u"),
            };
            let fields = coderoom_authz::audit::Fields {
                at: 0,
                actor: "u".into(),
                action: "create_room".into(),
                decision: "allow".into(),
                reason: String::new(),
                details: "{}".into(),
            };
            store.record(id, fields, &change).await.unwrap();
        }
        let deps = RoomDeps {
            store: store.clone(),
            audit: crate::audit::Audit::new(store.clone(), dir.path(), clock.clone()),
            tracker: TaskTracker::new(),
            metrics: Metrics::new(),
            limits: Arc::new(Limits::default()),
            shutdown: CancellationToken::new(),
            clock,
            server: crate::store::ServerId {
                id: "test".into(),
                address: "http://127.0.0.1:1".into(),
            },
            lease_ms: 10_000,
            journal: None,
        };
        (Rooms::new(deps, TaskTracker::new()), store, dir)
    }

    async fn join(
        rooms: &Rooms,
        room: &crate::ids::RoomId,
    ) -> (ConnId, mpsc::Sender<RoomCmd>, crate::room::outbox::OutboxRx) {
        join_with(rooms, room, crate::room::task::Rights::FULL).await
    }

    async fn join_with(
        rooms: &Rooms,
        room: &crate::ids::RoomId,
        rights: crate::room::task::Rights,
    ) -> (ConnId, mpsc::Sender<RoomCmd>, crate::room::outbox::OutboxRx) {
        let conn = next_conn_id();
        let (out, rx) = Outbox::new(1 << 20, 1 << 20, Default::default());
        let tx = rooms.handle(room);
        let (reply, answer) = oneshot::channel();
        tx.send(RoomCmd::Join {
            conn,
            user_id: "u".into(),
            name: "u@example.com".into(),
            rights,
            journaled: true,
            out,
            reply,
        })
        .await
        .unwrap();
        answer.await.unwrap().unwrap();
        (conn, tx, rx)
    }

    fn edit(text: &str) -> Vec<Inbound> {
        let doc = Doc::new();
        let t = doc.get_or_insert_text("f");
        let mut txn = doc.transact_mut();
        t.push(&mut txn, text);
        let bytes = txn.encode_update_v1();
        vec![Inbound::Update {
            update: Update::decode_v1(&bytes).unwrap(),
            bytes,
        }]
    }

    async fn wait_logged(store: &Store, room: &crate::ids::RoomId) {
        for _ in 0..200 {
            if !store.load_doc(room).await.unwrap().updates.is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("room {room} logged nothing");
    }

    /// The room decides by its clock, not the system's: an edit right that lapses an hour
    /// from now is refused as soon as the room's clock says the hour has passed, and the refusal
    /// is recorded at that time.
    #[tokio::test]
    async fn rights_lapse_by_the_rooms_clock() {
        use coderoom_authz::Until;
        let start = 1_000_000;
        let clock = crate::clock::Clock::manual(start);
        let (rooms, store, _dir) = rooms_at(clock.clone()).await;
        let rights = crate::room::task::Rights {
            act: Until::At(start + 3_600_000),
            observe: Until::Forever,
        };
        let (conn, room, _rx) = join_with(&rooms, &crate::ids::RoomId::known("a"), rights).await;
        room.send(RoomCmd::inbound(conn, edit("before")))
            .await
            .unwrap();
        wait_logged(&store, &crate::ids::RoomId::known("a")).await;
        clock.advance(3_600_000);
        room.send(RoomCmd::inbound(conn, edit("after")))
            .await
            .unwrap();
        let mut denied = None;
        for _ in 0..500 {
            let records = store.audit_records("a").await.unwrap();
            denied = records.into_iter().find(|r| r.fields.decision == "deny");
            if denied.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let denied = denied.expect("the lapsed edit was not refused");
        assert_eq!(denied.fields.action, "edit");
        assert_eq!(denied.fields.at, start + 3_600_000);
        assert_eq!(
            store
                .load_doc(&crate::ids::RoomId::known("a"))
                .await
                .unwrap()
                .updates
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn a_panicking_room_takes_down_nothing_else() {
        let (rooms, store, _dir) = rooms().await;
        let (a_conn, a, mut a_rx) = join(&rooms, &crate::ids::RoomId::known("a")).await;
        let (b_conn, b, _b_rx) = join(&rooms, &crate::ids::RoomId::known("b")).await;
        a.send(RoomCmd::inbound(a_conn, edit("kept")))
            .await
            .unwrap();
        wait_logged(&store, &crate::ids::RoomId::known("a")).await;
        a.send(RoomCmd::Panic).await.unwrap();
        // The panicking room's connections see their room go away...
        loop {
            if a_rx.recv().await.is_none() {
                break;
            }
        }
        a.closed().await;
        // ...while the other room keeps taking edits and logging them.
        b.send(RoomCmd::inbound(b_conn, edit("b"))).await.unwrap();
        wait_logged(&store, &crate::ids::RoomId::known("b")).await;
        assert_eq!(
            store
                .load_doc(&crate::ids::RoomId::known("b"))
                .await
                .unwrap()
                .updates
                .len(),
            1
        );
        // The panicked room reloads from storage on the next join, with what was logged.
        let (_, _a2, mut rx2) = join(&rooms, &crate::ids::RoomId::known("a")).await;
        let stored = store
            .load_doc(&crate::ids::RoomId::known("a"))
            .await
            .unwrap();
        assert_eq!(
            stored.updates.len(),
            1,
            "the edit before the panic was logged"
        );
        // The reloaded room's greeting is its state vector, which holds the logged edit.
        match rx2.recv().await {
            Some(Outbound::Frame(_, bytes)) => {
                use yrs::sync::protocol::{Message, SyncMessage};
                match Message::decode_v1(&bytes).unwrap() {
                    Message::Sync(SyncMessage::SyncStep1(sv)) => {
                        assert!(!sv.is_empty(), "reloaded room lost the logged edit")
                    }
                    other => panic!("unexpected greeting {other:?}"),
                }
            }
            other => panic!("reloaded room did not greet the joiner: {other:?}"),
        }
        assert_eq!(rooms.inner.deps.metrics.room_panics.get(), 1);
    }
}

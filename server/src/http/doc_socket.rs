//! `GET /api/rooms/{id}/doc`: the y-websocket endpoint. One reader (this task) decodes and
//! validates frames and forwards them to the room; one writer drains the connection's outbox.

use crate::close::CloseCode;
use crate::http::extract::Ids;
use crate::http::guard::room_access;
use crate::http::upgrade::{feed_binary, Socket, Upgrade, DOC_FRAGMENT_BYTES};
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::RoomId;
use crate::room::outbox::{Outbound, Outbox, OutboxRx};
use crate::room::protocol::parse_frame;
use crate::room::task::{next_conn_id, Rights};
use crate::room::task::{ConnId, JoinError, RoomCmd};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;

/// Time the writer gets to flush a close frame once the reader is done.
const WRITER_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/api/rooms/{id}/doc", get(doc_socket))
}

/// tungstenite's read buffer of a WebSocket (its default is 128 KiB per connection). A peer's
/// updates and presence are tens to hundreds of bytes; a larger frame reaches tungstenite as
/// fragments that fit this buffer, and the socket itself is read up to 4 KiB at a time
/// (`http::reframe`), so the buffer never grows. It is never given back, so it is what every
/// idle connection keeps (docs/benchmarks.md).
pub(crate) const SOCKET_READ_BUFFER: usize = 512;
/// Bytes tungstenite gathers before writing: none. Its write buffer keeps the capacity of the
/// most it ever gathered (8 KiB here, and with a 4 KiB read buffer, cost every idle connection
/// 6-7 KiB more, after the burst of a room's joins); written frame by frame, it keeps the largest
/// frame's (a fragment at most). The writer still takes what is queued together and flushes
/// once per batch, and the socket under tungstenite gathers that batch into one write
/// (`upgrade::Lingering`), keeping nothing after it.
pub(crate) const SOCKET_WRITE_BUFFER: usize = 0;

pub(crate) async fn doc_socket(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    ws: Result<Upgrade, Response>,
) -> Result<Response, Response> {
    // Authorization first, so a plain GET learns nothing more than an upgrade would.
    let access = room_access(&app, &room_id, &user)
        .await
        .map_err(IntoResponse::into_response)?;
    let ws = ws?;
    let max = app.limits.max_message_bytes;
    // Sized for what an idle or typing peer carries (see the constants). Large outgoing
    // messages go out as fragments (`upgrade::DOC_FRAGMENT_BYTES`), so no buffer grows past one.
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max))
        .read_buffer_size(SOCKET_READ_BUFFER)
        .write_buffer_size(SOCKET_WRITE_BUFFER);
    // Boxed: the task that serves the connection keeps what it captures for as long as the
    // connection lives (see `serve`).
    let setup = Box::new(Setup {
        app,
        room_id,
        user,
        access,
    });
    Ok(ws.on_upgrade(config, move |socket| {
        let tracker = setup.app.tracker.clone();
        tracker.track_future(serve(setup, Box::new(socket)))
    }))
}

/// What a connection starts from.
struct Setup {
    app: AppState,
    room_id: RoomId,
    user: AuthUser,
    access: Rights,
}

/// What a joined connection's reader keeps while the connection lasts.
struct Joined {
    conn: ConnId,
    room_id: RoomId,
    session_hash: String,
    stream: futures_util::stream::SplitStream<Socket>,
    outbox: Outbox,
    done: tokio_util::sync::CancellationToken,
    writer: tokio::task::JoinHandle<()>,
    room: mpsc::Sender<RoomCmd>,
    ended: tokio::sync::broadcast::Receiver<crate::ops::events::SessionEnded>,
    metrics: crate::metrics::Metrics,
    max_awareness: usize,
    // In the room while this connection lasts (moderated rooms ask who is), and the session
    // open (the catch-up after a lost notification looks for ended sessions among these).
    here: crate::ops::counted::Held<(RoomId, String)>,
    open: crate::ops::counted::Held<String>,
}

/// Serves one connection. An idle connection is mostly this task and its writer's, so it is
/// kept small (it was 4 KB, a fifth of an idle connection): what starts the connection is
/// boxed and freed once it joined, and the loop keeps only [`Joined`]. (Not an `async fn`: one
/// stores its arguments twice.)
#[allow(clippy::manual_async_fn)] // Not an `async fn` on purpose, see above.
fn serve(setup: Box<Setup>, socket: Box<Socket>) -> impl std::future::Future<Output = ()> {
    async move {
        if let Some(joined) = Box::pin(join_room(setup, socket)).await {
            joined.run().await;
        }
    }
}

/// Starts the writer and joins the room; `None` when the room refused (the writer then says why).
async fn join_room(setup: Box<Setup>, socket: Box<Socket>) -> Option<Joined> {
    let Setup {
        app,
        room_id,
        user,
        access,
    } = *setup;
    let conn = next_conn_id();
    let (outbox, out_rx) = Outbox::new(
        app.limits.outbound_queue_bytes,
        app.limits.max_doc_bytes,
        app.metrics.outbound_queued_bytes.clone(),
    );
    let (sink, stream) = (*socket).split();
    let done = out_rx.kill_token();
    let stall = Duration::from_millis(app.limits.write_stall_ms);
    let coalesce = coalesce_bytes(&app.limits);
    let writer = tokio::spawn(write_loop(
        sink,
        out_rx,
        stall,
        coalesce,
        app.metrics.clone(),
    ));

    let room = match join(&app, &room_id, conn, &user, access, &outbox).await {
        Ok(room) => room,
        Err(code) => {
            outbox.close(code);
            finish_writer(writer).await;
            return None;
        }
    };
    let here = app.ops.present.hold((room_id.clone(), user.id.clone()));
    let open = app.ops.open_sessions.hold(user.session_hash.clone());

    // Rights may have changed between the check before the upgrade and the join; the room only
    // hears about changes made after it knew this connection, so look once more.
    let rights = room_access(&app, &room_id, &user)
        .await
        .unwrap_or(Rights::NONE);
    let _ = room
        .send(RoomCmd::Access {
            user_id: user.id.clone(),
            rights,
            decided: std::time::Instant::now(),
        })
        .await;
    Some(Joined {
        conn,
        room_id,
        session_hash: user.session_hash,
        stream,
        outbox,
        done,
        writer,
        room,
        ended: app.ops.sessions_ended.subscribe(),
        metrics: app.metrics.clone(),
        max_awareness: app.limits.max_awareness_entry_bytes,
        here,
        open,
    })
}

impl Joined {
    /// Reads the client's frames into the room until either side ends. (Not an `async fn`,
    /// and `self`'s fields used in place: either would keep them twice for the connection's
    /// life.)
    #[allow(clippy::manual_async_fn)]
    fn run(mut self) -> impl std::future::Future<Output = ()> {
        async move {
            let conn = self.conn;
            loop {
                let frame = tokio::select! {
                    frame = self.stream.next() => frame,
                    () = self.done.cancelled() => break,
                    Ok(session) = self.ended.recv() => {
                        if session.hash == self.session_hash {
                            self.outbox.close(CloseCode::LoggedOut);
                            self.metrics
                                .access_close_seconds
                                .observe(session.at.elapsed().as_secs_f64());
                            break;
                        }
                        continue;
                    }
                    // The room refused this connection: stop taking input while the close frame
                    // goes out.
                    () = self.outbox.closing() => break,
                    () = self.room.closed() => {
                        // The room unloaded under us or failed; the client reconnects and resyncs.
                        self.outbox.close(CloseCode::Internal);
                        break;
                    }
                };
                match frame {
                    None | Some(Ok(Message::Close(_))) => break,
                    Some(Ok(Message::Binary(data))) => {
                        match decode(&self.metrics, &data, self.max_awareness) {
                            Ok(messages) => {
                                // A permit first: the command is built only once there is room for
                                // it, so this task does not carry one while it waits.
                                let Ok(permit) = self.room.reserve().await else {
                                    break;
                                };
                                permit.send(RoomCmd::inbound(conn, messages));
                            }
                            Err(e) => {
                                tracing::info!(room = %self.room_id, %conn, error = %e, "closing connection: bad frame");
                                self.metrics.protocol_errors.inc();
                                self.outbox.refuse(e.reason());
                                break;
                            }
                        }
                    }
                    Some(Ok(Message::Text(_))) => {
                        self.metrics.protocol_errors.inc();
                        self.outbox.close(CloseCode::Unsupported);
                        break;
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                    Some(Err(e)) => {
                        if let Some(code) = close_code_for(&e) {
                            self.metrics.protocol_errors.inc();
                            self.outbox.close(code);
                        } else {
                            tracing::debug!(room = %self.room_id, %conn, error = %e, "socket read failed");
                        }
                        break;
                    }
                }
            }
            if let Ok(permit) = self.room.reserve().await {
                permit.send(RoomCmd::Leave { conn });
            }
            drop(self.outbox);
            finish_writer(self.writer).await;
            // Named, so the block captures them (it captures only the fields it uses) and they
            // are held until here.
            drop((self.here, self.open));
        }
    }
}

async fn join(
    app: &AppState,
    room_id: &RoomId,
    conn: ConnId,
    user: &AuthUser,
    access: Rights,
    outbox: &Outbox,
) -> Result<mpsc::Sender<RoomCmd>, CloseCode> {
    // Shown to the others by the name they chose, else their email.
    let name = match app.ops.store.display_name(&user.id).await {
        Ok(Some(name)) => name,
        _ => user.email.clone(),
    };
    match app
        .ops
        .rooms
        .join(room_id, conn, (&user.id, &name), (access, true), outbox)
        .await
    {
        Ok(room) => Ok(room),
        Err(Some(JoinError::Full)) => Err(CloseCode::TryAgain),
        Err(None) => Err(CloseCode::Internal),
    }
}

async fn finish_writer(mut writer: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(WRITER_GRACE, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

/// Parses a client's frame, timed (`doc_stage_seconds{stage="decode"}`).
fn decode(
    metrics: &crate::metrics::Metrics,
    data: &[u8],
    max_awareness: usize,
) -> Result<Vec<crate::room::protocol::Inbound>, crate::room::protocol::ProtocolError> {
    let started = std::time::Instant::now();
    let parsed = parse_frame(data, max_awareness);
    metrics
        .stage_decode
        .observe(started.elapsed().as_secs_f64());
    parsed
}

/// Most bytes of queued frames written together before a flush.
const COALESCE_BYTES: usize = 64 << 10;

/// [`COALESCE_BYTES`], or 0 (a flush per frame) under `serve --write-each-frame`, for the
/// comparison in docs/benchmarks.md only.
fn coalesce_bytes(limits: &crate::config::Limits) -> usize {
    if limits.write_each_frame {
        0
    } else {
        COALESCE_BYTES
    }
}

async fn write_loop(
    mut sink: SplitSink<Socket, Message>,
    mut rx: OutboxRx,
    stall: Duration,
    coalesce: usize,
    metrics: crate::metrics::Metrics,
) {
    let kill = rx.kill_token();
    loop {
        let Some((msg, waited)) = rx.recv_timed().await else {
            if !rx.is_killed() {
                // Every sender is gone: the room unloaded or failed under us.
                let _ =
                    send_close(&mut sink, CloseCode::Internal, CloseCode::Internal.reason()).await;
            }
            break;
        };
        let sent = match msg {
            Outbound::Frame(_, bytes) => {
                metrics.stage_queue.observe(waited.as_secs_f64());
                // Frames already queued go out with it, in one flush (fewer system calls per
                // reader: sending is most of a busy room's CPU, see docs/benchmarks.md).
                let mut frames = vec![bytes];
                let mut size = frames[0].len();
                let mut then_close = None;
                while size < coalesce {
                    match rx.try_recv_timed() {
                        Some((Outbound::Frame(_, more), waited)) => {
                            metrics.stage_queue.observe(waited.as_secs_f64());
                            size += more.len();
                            frames.push(more);
                        }
                        Some((Outbound::Close(code, reason), _)) => {
                            then_close = Some((code, reason));
                            break;
                        }
                        None => break,
                    }
                }
                let started = std::time::Instant::now();
                let write = async {
                    for frame in frames {
                        feed_binary(&mut sink, frame, DOC_FRAGMENT_BYTES).await?;
                    }
                    sink.flush().await
                };
                let sent = tokio::select! {
                    r = tokio::time::timeout(stall, write) => match r {
                        Ok(Ok(())) => {
                            metrics.stage_write.observe(started.elapsed().as_secs_f64());
                            true
                        }
                        Ok(Err(_)) => false,
                        Err(_) => {
                            // The client accepts nothing: it is gone or stuck.
                            tracing::info!("dropping connection: client stopped reading");
                            metrics.connections_dropped_slow.inc();
                            false
                        }
                    },
                    () = kill.cancelled() => false,
                };
                if let (true, Some((code, reason))) = (sent, then_close) {
                    let _ = tokio::time::timeout(WRITER_GRACE, send_close(&mut sink, code, reason))
                        .await;
                    false
                } else {
                    sent
                }
            }
            Outbound::Close(code, reason) => {
                let _ =
                    tokio::time::timeout(WRITER_GRACE, send_close(&mut sink, code, reason)).await;
                false
            }
        };
        if !sent {
            break;
        }
    }
    // Tell the reader to stop too.
    kill.cancel();
}

async fn send_close(
    sink: &mut SplitSink<Socket, Message>,
    code: CloseCode,
    reason: &'static str,
) -> Result<(), tungstenite::Error> {
    sink.send(Message::Close(Some(CloseFrame {
        code: WsCloseCode::from(code.code()),
        reason: reason.into(),
    })))
    .await
}

/// The close code owed to the client for a read error that its own input caused.
fn close_code_for(e: &tungstenite::Error) -> Option<CloseCode> {
    match e {
        tungstenite::Error::Capacity(_) => Some(CloseCode::TooBig),
        tungstenite::Error::Utf8(_) => Some(CloseCode::InvalidData),
        _ => None,
    }
}

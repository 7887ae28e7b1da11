//! `GET /api/rooms/{id}/terminal`: the room's shared PTY over a WebSocket, and its recording.
//!
//! Server to client: binary frames are output (the scrollback first), text frames are JSON
//! events (`denied`, `exit`, `sandbox`, `error`). Client to server: binary frames are input,
//! forwarded only while the sender holds `type` and the terminal's floor is free or theirs;
//! text frames are `{"type":"resize",...}` and `{"type":"floor","action":...}`.
//!
//! Resize policy: the PTY takes the size most recently asked for by a participant who may type
//! (the people typing decide the layout); resizes from observers are ignored, and every viewer
//! renders the same grid.

use crate::close::CloseCode;
use crate::http::extract::Ids;
use crate::http::upgrade::{send_binary, Socket, Upgrade};
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::RoomId;
use crate::ops::typing::{Typed, Typist};
use crate::room::task::Rights;
use crate::terminal::hub::FloorAction;
use crate::terminal::recorder::{CAST_FILE, INPUTS_FILE};
use crate::terminal::TermEvent;
use crate::terminal::TermOut;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use coderoom_authz::Capability;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use std::time::Duration;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;

/// Largest input frame (a big paste) and control frame accepted.
const MAX_INPUT_FRAME: usize = 64 << 10;
/// Largest terminal size accepted.
const MAX_COLS: u16 = 1000;
const MAX_ROWS: u16 = 500;
/// Output coalesced into one frame for a viewer that is behind.
const MAX_OUTPUT_FRAME: usize = 256 << 10;
/// Time a close frame gets to go out.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/terminal", get(terminal_socket))
        .route("/api/rooms/{id}/terminal/recording", get(recording))
        .route(
            "/api/rooms/{id}/terminal/recording/inputs",
            get(recording_inputs),
        )
}

#[derive(Deserialize)]
pub(crate) struct SizeQuery {
    cols: Option<u16>,
    rows: Option<u16>,
}

fn clamp_size(cols: u16, rows: u16) -> (u16, u16) {
    (cols.clamp(2, MAX_COLS), rows.clamp(1, MAX_ROWS))
}

pub(crate) async fn terminal_socket(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Query(size): Query<SizeQuery>,
    ws: Result<Upgrade, Response>,
) -> Result<Response, Response> {
    let (rights, _) = crate::http::guard::room_rights(&app, &room_id, &user, Capability::Type)
        .await
        .map_err(IntoResponse::into_response)?;
    let ws = ws?;
    let (cols, rows) = clamp_size(size.cols.unwrap_or(80), size.rows.unwrap_or(24));
    // Small buffers, as for the document socket; output frames of up to 256 KiB go out as
    // fragments (`upgrade::send_binary`), so a viewer that watched a flood keeps no large buffer.
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_INPUT_FRAME))
        .max_frame_size(Some(MAX_INPUT_FRAME))
        .read_buffer_size(crate::http::doc_socket::SOCKET_READ_BUFFER)
        .write_buffer_size(crate::http::doc_socket::SOCKET_WRITE_BUFFER);
    Ok(ws.on_upgrade(config, move |socket| {
        let tracker = app.tracker.clone();
        tracker.track_future(serve(app, room_id, user, rights, (cols, rows), socket))
    }))
}

/// Sends one message; false when the client is gone or accepts nothing for `stall` (a
/// viewer that stopped reading is dropped, its socket closed, instead of hanging here).
async fn put(
    sink: &mut futures_util::stream::SplitSink<Socket, Message>,
    msg: Message,
    stall: Duration,
) -> bool {
    let sent = async {
        match msg {
            Message::Binary(bytes) => send_binary(sink, bytes).await,
            other => sink.send(other).await,
        }
    };
    matches!(tokio::time::timeout(stall, sent).await, Ok(Ok(())))
}

/// Sends what the hub queued for this viewer; false when the connection is over. Output that
/// is already waiting goes out in the same frame: a viewer that is briefly behind catches up
/// with a few large frames, not many small ones.
async fn deliver(
    sink: &mut futures_util::stream::SplitSink<Socket, Message>,
    rx: &mut tokio::sync::mpsc::Receiver<TermOut>,
    out: TermOut,
    stall: Duration,
) -> bool {
    let mut next = Some(out);
    while let Some(out) = next.take() {
        match out {
            TermOut::Output(bytes) => {
                let mut frame = bytes::BytesMut::from(&bytes[..]);
                while frame.len() < MAX_OUTPUT_FRAME {
                    match rx.try_recv() {
                        Ok(TermOut::Output(more)) => frame.extend_from_slice(&more),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if !put(sink, Message::Binary(frame.freeze()), stall).await {
                    return false;
                }
            }
            TermOut::Event(said) => {
                if !put(sink, Message::Text(said.text.as_str().into()), stall).await {
                    return false;
                }
            }
            TermOut::Close(code) => {
                close(sink, code).await;
                return false;
            }
        }
    }
    true
}

async fn close(socket: &mut futures_util::stream::SplitSink<Socket, Message>, code: CloseCode) {
    let frame = Message::Close(Some(CloseFrame {
        code: WsCloseCode::from(code.code()),
        reason: code.reason().into(),
    }));
    put(socket, frame, CLOSE_GRACE).await;
}

async fn serve(
    app: AppState,
    room_id: RoomId,
    user: AuthUser,
    rights: Rights,
    (cols, rows): (u16, u16),
    socket: Socket,
) {
    let (mut sink, mut stream) = socket.split();
    let stall = Duration::from_millis(app.limits.write_stall_ms);
    let mut rights = rights;
    // Listen before anything slow (joining may start or restore the sandbox), so no change of
    // rights or end of session can fall between the check at upgrade and the loop.
    let mut access = app.ops.access_changed.subscribe();
    let mut ended = app.ops.sessions_ended.subscribe();
    let actor = match user.actor(&app).await {
        Ok(a) => a,
        // Unknown: an agent would slip past moderation and its budget; closed, it reconnects.
        Err(_) => {
            close(&mut sink, CloseCode::Internal).await;
            return;
        }
    };
    let (hub, joined) = match app.ops.join_terminal(&room_id, &actor, (cols, rows)).await {
        Ok(j) => j,
        Err(_) if app.shutdown.is_cancelled() => {
            close(&mut sink, CloseCode::Away).await;
            return;
        }
        Err(e) => {
            // Said only to someone still in the room (the join may have taken a while).
            if let Some((now, _)) = rights_now(&app, &room_id, &user).await {
                if !now.may_observe(app.ops.clock.now_ms()) {
                    close(&mut sink, CloseCode::Removed).await;
                    return;
                }
            }
            let msg = TermEvent::error(e.to_string()).text();
            put(&mut sink, Message::Text(msg.into()), stall).await;
            close(&mut sink, CloseCode::Internal).await;
            return;
        }
    };
    let viewer = joined.viewer;
    let mut rx = joined.rx;
    // In the room while this connection lasts (moderated rooms ask who is).
    let _here = app.ops.present.hold((room_id.clone(), user.id.clone()));
    let _open = app.ops.open_sessions.hold(user.session_hash.clone());
    let mut typist = Typist::new(actor, hub.clone(), viewer);
    // Rights as they are now, after the join (a removal meanwhile closes with 4003 below);
    // when storage cannot say, those checked at upgrade stand.
    let caps = match rights_now(&app, &room_id, &user).await {
        Some((now, caps)) => {
            rights = now;
            Some(caps)
        }
        None => None,
    };
    if !rights.may_observe(app.ops.clock.now_ms()) {
        close(&mut sink, CloseCode::Removed).await;
        app.ops.sandboxes.leave(&room_id, &hub, viewer).await;
        return;
    }
    if !joined.scrollback.is_empty()
        && !put(&mut sink, Message::Binary(joined.scrollback.into()), stall).await
    {
        app.ops.sandboxes.leave(&room_id, &hub, viewer).await;
        return;
    }
    for ev in joined.events {
        put(&mut sink, Message::Text(ev.text.as_str().into()), stall).await;
    }
    if !rights.may_act(app.ops.clock.now_ms()) {
        let msg = TermEvent::ReadOnly {
            reason: "you may watch but not type".into(),
        };
        put(&mut sink, Message::Text(msg.text().into()), stall).await;
    }
    if let Some(caps) = caps {
        put(&mut sink, capabilities(&caps, None), stall).await;
    }
    loop {
        // Removed from the room when `observe` lapses, unless it is held for good.
        let observe_ends = rights.observe.ends_at();
        let observe_left = Duration::from_millis(
            u64::try_from(
                observe_ends
                    .unwrap_or(0)
                    .saturating_sub(app.ops.clock.now_ms()),
            )
            .unwrap_or(0),
        );
        tokio::select! {
            frame = stream.next() => match frame {
                None | Some(Ok(Message::Close(_))) | Some(Err(_)) => break,
                Some(Ok(Message::Binary(data))) => {
                    let may_type = rights.may_act(app.ops.clock.now_ms());
                    // Recorded (where it is) before the client hears of it.
                    let msg = match app.ops.type_keys(&room_id, &mut typist, may_type, data).await {
                        Ok(Typed::Sent { .. }) => None,
                        Ok(Typed::NoType) => Some(TermEvent::Denied { reason: "you do not hold type in this room".into() }),
                        Ok(Typed::Refused(reason)) => Some(TermEvent::FloorRefused { reason, holder: None }),
                        Ok(Typed::Pending(approval_id)) => Some(TermEvent::FloorRefused {
                            reason: format!("the line waits for approval {approval_id}: it was not run; type it again once it is approved"),
                            holder: None,
                        }),
                        Err(e) => {
                            tracing::warn!(room = %room_id, error = %e, "cannot decide typed keys");
                            Some(TermEvent::error("the keys could not be checked now: nothing was typed"))
                        }
                    };
                    if let Some(msg) = msg {
                        if !put(&mut sink, Message::Text(msg.text().into()), stall).await {
                            break;
                        }
                    }
                }
                Some(Ok(Message::Text(text))) => {
                    match serde_json::from_str::<Control>(&text) {
                        Ok(Control::Resize { cols, rows }) => {
                            if rights.may_act(app.ops.clock.now_ms()) {
                                let (c, r) = clamp_size(cols, rows);
                                hub.resize(c, r).await;
                            }
                        }
                        Ok(Control::Floor { action, to }) => {
                            let action = match (action, to) {
                                _ if !rights.may_act(app.ops.clock.now_ms()) => Err("you do not hold type in this room"),
                                (FloorControl::Take, None) => Ok(FloorAction::Take),
                                (FloorControl::Request, None) => Ok(FloorAction::Request),
                                (FloorControl::Release, None) => Ok(FloorAction::Release),
                                (FloorControl::Give, Some(to)) if !to.is_empty() && to.len() <= 64 => Ok(FloorAction::Give(to)),
                                (FloorControl::Give, _) => Err("give needs \"to\": the user id of someone who asked"),
                                (_, Some(_)) => Err("only give takes \"to\""),
                            };
                            match action {
                                Ok(action) => hub.floor(viewer, (&user.id, &user.email), action).await,
                                Err(reason) => {
                                    let msg = TermEvent::FloorRefused { reason: reason.into(), holder: None };
                                    if !put(&mut sink, Message::Text(msg.text().into()), stall).await {
                                        break;
                                    }
                                }
                            }
                        }
                        Err(_) => {
                            let msg = TermEvent::error("unknown control message; expected {\"type\":\"resize\",\"cols\":N,\"rows\":N} or {\"type\":\"floor\",\"action\":\"take\"|\"request\"|\"release\"|\"give\",\"to\"?:USER_ID}");
                            if !put(&mut sink, Message::Text(msg.text().into()), stall).await {
                                break;
                            }
                        }
                    }
                }
                Some(Ok(_)) => {}
            },
            out = rx.recv() => match out {
                Some(out) => {
                    if !deliver(&mut sink, &mut rx, out, stall).await {
                        break;
                    }
                }
                None => {
                    close(&mut sink, CloseCode::Behind).await;
                    break;
                }
            },
            changed = access.recv() => {
                let (relevant, in_room) = match &changed {
                    Ok(c) => (c.room == room_id.as_str() && c.user == user.id, c.room == room_id.as_str()),
                    // Missed notices: look again to be safe.
                    Err(_) => (true, true),
                };
                if in_room && !relevant {
                    // Someone else's rights changed: the people panel looks again.
                    let msg = TermEvent::PeopleChanged.text();
                    put(&mut sink, Message::Text(msg.into()), stall).await;
                }
                if relevant {
                    // When storage cannot say, the rights are withdrawn (and no event is sent).
                    let now = rights_now(&app, &room_id, &user).await;
                    let was_typing = rights.may_act(app.ops.clock.now_ms());
                    rights = now.as_ref().map_or(Rights::NONE, |(r, _)| *r);
                    if was_typing && !rights.may_act(app.ops.clock.now_ms()) {
                        hub.floor(viewer, (&user.id, &user.email), FloorAction::Revoked).await;
                        let msg = TermEvent::ReadOnly { reason: "your right to type was withdrawn".into() };
                        put(&mut sink, Message::Text(msg.text().into()), stall).await;
                    }
                    if now.is_some() && !rights.may_observe(app.ops.clock.now_ms()) {
                        // Removed (or lost `observe`, as storage says): closed now, measured
                        // from the decision. When storage cannot say, the terminal only turns
                        // read-only (above).
                        if let Ok(c) = &changed {
                            app.metrics.access_close_seconds.observe(c.at.elapsed().as_secs_f64());
                        }
                        close(&mut sink, CloseCode::Removed).await;
                        break;
                    }
                    if let Some((_, caps)) = now {
                        let by = changed.as_ref().ok().and_then(|c| c.by.clone());
                        put(&mut sink, capabilities(&caps, by), stall).await;
                    }
                }
            }
            Ok(session) = ended.recv() => {
                if session.hash == user.session_hash {
                    // Measured when the close is handed to the socket, as everywhere.
                    app.metrics
                        .access_close_seconds
                        .observe(session.at.elapsed().as_secs_f64());
                    close(&mut sink, CloseCode::LoggedOut).await;
                    break;
                }
            }
            () = tokio::time::sleep(observe_left), if observe_ends.is_some() => {
                // A lapse: measured from the moment it lapsed.
                let late = app.ops.clock.now_ms().saturating_sub(observe_ends.unwrap_or(0)).max(0);
                app.metrics.access_close_seconds.observe(late as f64 / 1000.0);
                close(&mut sink, CloseCode::Removed).await;
                break;
            }
            () = app.shutdown.cancelled() => {
                close(&mut sink, CloseCode::Away).await;
                break;
            }
        }
    }
    app.ops.leave_terminal(&room_id, typist).await;
}

/// The viewer's rights now, from one look at the room: until when it may type and observe,
/// and its capabilities; none once it is out of the room. `None` when storage cannot say
/// (each caller decides what that means).
async fn rights_now(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
) -> Option<(Rights, Vec<&'static str>)> {
    match crate::http::guard::room_rights(app, room_id, user, Capability::Type).await {
        Ok((rights, caps)) => Some((rights, caps.names())),
        Err(crate::http::ApiError::NotFound) => Some((Rights::NONE, Vec::new())),
        Err(e) => {
            tracing::warn!(room = %room_id, error = %e, "cannot read a terminal viewer's rights");
            None
        }
    }
}

/// `{"type":"capabilities","capabilities":[...],"by"?:EMAIL}`: what the viewer may do now, sent
/// on join and after every change to its rights (with who made it, when someone did), so a
/// client can follow (an editor turning read-only) and say so without asking. Empty when it
/// lost the room.
fn capabilities(caps: &[&'static str], by: Option<String>) -> Message {
    let event = TermEvent::Capabilities {
        capabilities: caps.to_vec(),
        by,
    };
    Message::Text(event.text().into())
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    Resize {
        cols: u16,
        rows: u16,
    },
    /// The terminal's floor (see `terminal::floor`): `give` names who gets it.
    Floor {
        action: FloorControl,
        #[serde(default)]
        to: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum FloorControl {
    Take,
    Request,
    Release,
    Give,
}

/// `GET /api/rooms/{id}/terminal/recording`: the asciicast v2 file (needs `observe`).
pub(crate) async fn recording(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Response, ApiError> {
    download(&app, &room_id, &user, CAST_FILE, "application/x-asciicast").await
}

/// `GET /api/rooms/{id}/terminal/recording/inputs`: who typed each input chunk (JSON lines).
pub(crate) async fn recording_inputs(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Response, ApiError> {
    download(&app, &room_id, &user, INPUTS_FILE, "application/x-ndjson").await
}

async fn download(
    app: &AppState,
    room_id: &RoomId,
    user: &AuthUser,
    file: &str,
    content_type: &'static str,
) -> Result<Response, ApiError> {
    crate::http::guard::room_capabilities(app, room_id, user).await?;
    let path = app
        .ops
        .data_dir
        .join("rooms")
        .join(room_id.as_str())
        .join("recordings")
        .join(file);
    let body = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(ApiError::Store(crate::store::StoreError::Io(e))),
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

//! What the terminal hub sends its viewers: output, JSON events (text frames) and closes. The
//! events are the terminal socket's contract (see `docs/design.md`), one type for all of them.

use crate::close::CloseCode;
use bytes::Bytes;
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A JSON event on the terminal socket, `{"type": ..., ...}`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum TermEvent {
    /// Input refused: the sender does not hold `type`.
    Denied { reason: String },
    /// The viewer may watch but not type (on join, or when `type` is withdrawn).
    ReadOnly { reason: String },
    /// What the viewer may do now (on join and after every change to its rights); `by` names
    /// who changed them (their email), when someone did.
    Capabilities {
        capabilities: Vec<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Someone is typing (at most once a second per typist).
    Typing { user_id: String, email: String },
    /// Someone else's rights changed: the people panel looks again.
    PeopleChanged,
    /// The shell exited (`code` is `null` when a signal ended it); a key starts a new one.
    #[serde(rename = "exit")]
    ShellExit { code: Option<i32> },
    /// The sandbox failed; `restart` says how to start it again.
    #[serde(rename = "exit")]
    SandboxFailed { reason: String, restart: String },
    /// The sandbox's state: `starting` (keys wait), `running` (keys reach the shell),
    /// `stopped`, `suspended`.
    Sandbox {
        state: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Something went wrong for this viewer (a refused key, an unknown control message).
    Error { reason: String },
    /// Who has the terminal (taken with `take`) and who asked for it; sent on join when
    /// either is set, and to everyone on every change.
    Floor(crate::terminal::floor::FloorView),
    /// A budget was reached (the room's, or `agent`'s): that metered work stops.
    Spent {
        agent: Option<String>,
        #[serde(flatten)]
        exhausted: crate::spend::Exhausted,
        reason: String,
    },
    /// A budget was set (the room's, or `agent`'s): the spend panel looks again.
    Budget {
        agent: Option<String>,
        budget: serde_json::Value,
    },
    /// A checkpoint was restored: the room's files are as they were then, for everyone. `by`
    /// names who restored it; `undo` is the checkpoint of the room as it was just before,
    /// whose restore undoes this one.
    Restored {
        by: String,
        checkpoint: String,
        undo: String,
    },
    /// This viewer's keys (or floor action) were refused: someone else has the terminal.
    FloorRefused {
        reason: String,
        holder: Option<crate::terminal::floor::Person>,
    },
}

/// An event as every viewer is sent it: the typed value, for consumers in this process (MCP),
/// and its text frame for the socket, made once however many viewers are sent it.
#[derive(Debug)]
pub(crate) struct Said {
    pub(crate) event: TermEvent,
    pub(crate) text: String,
}

impl TermEvent {
    /// The event as a text frame.
    pub(crate) fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The event, with its text frame, to send.
    pub(crate) fn said(self) -> Arc<Said> {
        let text = self.text();
        Arc::new(Said { event: self, text })
    }

    pub(crate) fn error(reason: impl Into<String>) -> Self {
        TermEvent::Error {
            reason: reason.into(),
        }
    }
}

/// A message for a viewer of the terminal.
#[derive(Debug, Clone)]
pub(crate) enum TermOut {
    /// Terminal output bytes.
    Output(Bytes),
    /// An event (a text frame on the socket).
    Event(Arc<Said>),
    /// Close the socket with this code (and its reason).
    Close(CloseCode),
}

/// A viewer's membership in the terminal hub.
pub(crate) struct Joined {
    pub viewer: u64,
    /// Output so far, replayed first.
    pub scrollback: Vec<u8>,
    /// Events to send after the scrollback (state of the sandbox).
    pub events: Vec<Arc<Said>>,
    pub rx: mpsc::Receiver<TermOut>,
}

//! What the terminal hub sends its viewers.

use bytes::Bytes;
use tokio::sync::mpsc;

/// A message for a viewer of the terminal.
#[derive(Debug, Clone)]
pub(crate) enum TermOut {
    /// Terminal output bytes.
    Output(Bytes),
    /// A JSON event (text frame).
    Event(String),
    /// Close the socket with this code and reason.
    Close(u16, &'static str),
}

/// A viewer's membership in the terminal hub.
pub(crate) struct Joined {
    pub viewer: u64,
    /// Output so far, replayed first.
    pub scrollback: Vec<u8>,
    /// Events to send after the scrollback (state of the sandbox).
    pub events: Vec<String>,
    pub rx: mpsc::Receiver<TermOut>,
}

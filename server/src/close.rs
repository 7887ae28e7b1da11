//! The WebSocket close codes of every socket the server serves (documents and the terminal),
//! each with its one reason text. Only 1008 says more: what was refused.

/// A close code and its meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseCode {
    /// 1001: the server is going away.
    Away,
    /// 1003: a text frame on a binary protocol.
    Unsupported,
    /// 1007: a text frame that is not UTF-8.
    InvalidData,
    /// 1008: malformed or refused input (the reason says what).
    Policy,
    /// 1009: a message over the size cap.
    TooBig,
    /// 1011: the room or its sandbox is unavailable; reconnecting may find it again.
    Internal,
    /// 1012: another server took the room over (scale-out); reconnecting reaches it.
    Moved,
    /// 1013: the room is full; try later.
    TryAgain,
    /// 4001: the session that opened the socket ended.
    LoggedOut,
    /// 4003: the participant was removed from the room (or lost `observe`).
    Removed,
    /// 4004: the room was deleted.
    Deleted,
    /// 4008: a terminal viewer fell too far behind; it reconnects and catches up from the
    /// scrollback.
    Behind,
}

impl CloseCode {
    pub(crate) fn code(self) -> u16 {
        match self {
            CloseCode::Away => 1001,
            CloseCode::Unsupported => 1003,
            CloseCode::InvalidData => 1007,
            CloseCode::Policy => 1008,
            CloseCode::TooBig => 1009,
            CloseCode::Internal => 1011,
            CloseCode::Moved => 1012,
            CloseCode::TryAgain => 1013,
            CloseCode::LoggedOut => 4001,
            CloseCode::Removed => 4003,
            CloseCode::Deleted => 4004,
            CloseCode::Behind => 4008,
        }
    }

    /// The reason sent with the code.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            CloseCode::Away => "server shutting down",
            CloseCode::Unsupported => "text frames are not part of this protocol",
            CloseCode::InvalidData => "text frame is not UTF-8",
            CloseCode::Policy => "refused",
            CloseCode::TooBig => "message too big",
            CloseCode::Internal => "unavailable, reconnect",
            CloseCode::Moved => "the room moved to another server; reconnect",
            CloseCode::TryAgain => "room is full",
            CloseCode::LoggedOut => "logged out",
            CloseCode::Removed => "removed from the room",
            CloseCode::Deleted => "room deleted",
            CloseCode::Behind => "too far behind; reconnect to catch up",
        }
    }
}

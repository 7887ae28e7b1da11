//! The inbound half of the y-websocket protocol: one WebSocket binary frame in, validated
//! messages out. Pure (no I/O, no document), so it runs on the connection's task, not the room's,
//! and it is the target of the `inbound_frame` fuzzer.
//!
//! Decoding uses `yrs::sync` message types; this module adds what a server facing untrusted
//! clients needs on top: trailing garbage and truncated frames are errors (yrs's `MessageReader`
//! silently stops at a truncated message), Yjs updates are fully decoded before they reach the
//! room, awareness entries are size-checked and must be JSON, and message kinds a client has no
//! business sending are refused.

use std::panic::{catch_unwind, AssertUnwindSafe};
use yrs::encoding::read::{Cursor, Read};
use yrs::sync::protocol::{Message, SyncMessage, MSG_AWARENESS, MSG_SYNC};
use yrs::sync::AwarenessUpdate;
use yrs::updates::decoder::{Decode, Decoder, DecoderV1};
use yrs::{ClientID, StateVector, Update, ID};

/// Largest number of y-protocol messages accepted in one frame (y-websocket sends one).
const MAX_MESSAGES_PER_FRAME: usize = 16;
/// Yjs client ids are 53-bit (JavaScript safe integers); yrs asserts this and panics beyond.
const MAX_CLIENT_ID: u64 = (1 << 53) - 1;
/// Deepest nesting of arrays and maps in an update's values. yrs decodes, integrates, encodes
/// and drops them recursively with no limit of its own, so a frame of nested empty arrays would
/// overflow the stack. Measured on yrs 0.28 (decode, apply, encode, JSON, drop): a 2 MiB stack
/// holds about 4,000 levels in a release build and 500 in a debug build; the server's threads
/// get [`THREAD_STACK_BYTES`], so this limit leaves a wide margin in both, and stays far above
/// what documents nest (a JSON syntax tree kept in a map, say).
pub const MAX_VALUE_DEPTH: usize = 1000;
/// Stack of every thread of the server's runtime (tokio's default is 2 MiB): room for
/// [`MAX_VALUE_DEPTH`] levels with a margin, even in a debug build.
pub const THREAD_STACK_BYTES: usize = 8 << 20;

/// One validated client message.
#[derive(Debug)]
pub enum Inbound {
    /// The client's state vector: it wants what it is missing.
    SyncStep1(StateVector),
    /// Document content, from sync step 2 or an incremental update (the server treats both
    /// alike). `bytes` is the update as encoded: its size counts against the document size
    /// cap, and the room reads the text of an edit to a file that is gone from it ([`pieces`]).
    Update { update: Update, bytes: Vec<u8> },
    /// Presence states, already checked for size and JSON syntax.
    Awareness(AwarenessUpdate),
    /// The client asks for every presence state.
    AwarenessQuery,
}

/// Why a frame was refused. Every variant closes the connection with 1008.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("malformed y-protocol message")]
    Malformed,
    #[error("malformed Yjs update")]
    MalformedUpdate,
    #[error("empty frame")]
    Empty,
    #[error("too many messages in one frame")]
    TooManyMessages,
    #[error("unsupported message type")]
    Unsupported,
    #[error("awareness state too large")]
    AwarenessTooLarge,
    #[error("awareness state is not JSON")]
    AwarenessNotJson,
    #[error("values nested deeper than {MAX_VALUE_DEPTH} levels")]
    TooDeep,
}

impl ProtocolError {
    /// A short reason safe to put in a close frame.
    pub fn reason(&self) -> &'static str {
        match self {
            ProtocolError::Malformed => "malformed message",
            ProtocolError::MalformedUpdate => "malformed update",
            ProtocolError::TooDeep => "values nested too deep",
            ProtocolError::Empty => "empty frame",
            ProtocolError::TooManyMessages => "too many messages in frame",
            ProtocolError::Unsupported => "unsupported message type",
            ProtocolError::AwarenessTooLarge => "awareness state too large",
            ProtocolError::AwarenessNotJson => "awareness state is not JSON",
        }
    }
}

/// Decodes and validates one binary frame.
pub fn parse_frame(data: &[u8], max_awareness_entry: usize) -> Result<Vec<Inbound>, ProtocolError> {
    if data.is_empty() {
        return Err(ProtocolError::Empty);
    }
    let mut out = Vec::with_capacity(1);
    let mut rest = data;
    while !rest.is_empty() {
        if out.len() == MAX_MESSAGES_PER_FRAME {
            return Err(ProtocolError::TooManyMessages);
        }
        guard_counts(rest)?;
        let mut decoder = DecoderV1::new(Cursor::new(rest));
        // yrs asserts on some hostile values (client ids past 53 bits) instead of returning an
        // error; such a frame is malformed like any other.
        let message = catch_unwind(AssertUnwindSafe(|| Message::decode(&mut decoder)))
            .map_err(|_| ProtocolError::Malformed)?
            .map_err(|_| ProtocolError::Malformed)?;
        out.push(validate(message, max_awareness_entry)?);
        let left = decoder
            .read_to_end()
            .map_err(|_| ProtocolError::Malformed)?
            .len();
        rest = &rest[rest.len() - left..];
    }
    Ok(out)
}

/// Whether `update` skips clocks: a client's blocks in it must be one contiguous run starting
/// at or below what the document `have` already holds of that client. A stock client never
/// sends anything else (its updates follow its own state), and yrs 0.28's integration of
/// out-of-order blocks is where fuzzing found a use-after-free, so such updates are refused
/// before they reach the document (and never parked as "pending").
pub fn skips_clocks(update: &Update, have: &StateVector) -> bool {
    let inserted = update.insertions(true);
    for (client, ranges) in inserted.iter() {
        let mut expected = have.get(client);
        let mut first = true;
        for r in ranges.iter() {
            if r.start > expected || (!first && r.start != expected) {
                return true;
            }
            expected = expected.max(r.end);
            first = false;
        }
    }
    false
}

/// yrs decodes a state vector, a presence update or an update by reserving room for as many
/// entries as the sender claims, so a dozen bytes can ask for gigabytes. Check the claimed
/// entry count against the bytes that carry it, and a state vector's client ids, before yrs
/// sees the message. (yrs's own `try_reserve` then only ever sees plausible sizes.)
fn guard_counts(message: &[u8]) -> Result<(), ProtocolError> {
    let malformed = |_| ProtocolError::Malformed;
    let mut c = Cursor::new(message);
    let tag: u8 = c.read_var().map_err(malformed)?;
    // Sync step 1 and presence carry a count of fixed-minimum entries; updates (sync step 2 and
    // update) start with a client count, each client taking at least 3 bytes.
    let mut is_state_vector = false;
    let min_entry_bytes = match tag {
        MSG_SYNC => {
            let sync: u8 = c.read_var().map_err(malformed)?;
            is_state_vector = sync == 0;
            if is_state_vector {
                2
            } else {
                3
            }
        }
        MSG_AWARENESS => 3,
        _ => return Ok(()),
    };
    let buf = c.read_buf().map_err(malformed)?;
    let mut body = Cursor::new(buf);
    let entries: u64 = body.read_var().map_err(malformed)?;
    if entries > (buf.len() / min_entry_bytes) as u64 {
        return Err(if tag == MSG_SYNC && !is_state_vector {
            ProtocolError::MalformedUpdate
        } else {
            ProtocolError::Malformed
        });
    }
    if is_state_vector {
        for _ in 0..entries {
            let client: u64 = body.read_var().map_err(malformed)?;
            let _clock: u32 = body.read_var().map_err(malformed)?;
            if client > MAX_CLIENT_ID {
                return Err(ProtocolError::Malformed);
            }
        }
    }
    Ok(())
}

/// Walks a v1 update the way yrs 0.28's `Update::decode` reads it, before yrs does, and refuses
/// what would make yrs ask for memory the bytes do not carry: every count (clients, blocks per
/// client, values, strings, delete-set ranges) must fit in the bytes left, since each entry takes
/// at least one; and values nest at most [`MAX_VALUE_DEPTH`] deep. yrs `try_reserve`s whatever
/// count it reads (a block count of four billion is a 12 GB request), and recurses into nested
/// values without a limit. Anything this walk cannot read, yrs could not either.
fn guard_update(update: &[u8]) -> Result<(), ProtocolError> {
    walk_update(update, None)
}

/// A run of text an update inserts: `text` at `id`, placed after `origin` and before `right`
/// (the neighbours its author saw), in `parent` when the update names it (it does when the run
/// has neither neighbour: the first text of an empty file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub id: ID,
    pub origin: Option<ID>,
    pub right: Option<ID>,
    pub parent: Option<ID>,
    pub text: String,
}

impl Piece {
    /// Clock units the run takes (UTF-16 code units, as Yjs counts text).
    pub fn clocks(&self) -> u32 {
        utf16_len(&self.text)
    }
}

fn utf16_len(s: &str) -> u32 {
    u32::try_from(s.encode_utf16().count()).unwrap_or(u32::MAX)
}

/// The runs of text in a v1 update (already accepted by [`parse_frame`]), in the update's order.
pub fn pieces(update: &[u8]) -> Result<Vec<Piece>, ProtocolError> {
    let mut out = Vec::new();
    walk_update(update, Some(&mut out))?;
    Ok(out)
}

/// Highest clock an update may reach: yrs 0.28 adds clocks and lengths in `u32` and takes
/// offsets `as i32`, so past this they wrap (silently, in a release build).
const MAX_CLOCK: u64 = i32::MAX as u64;

/// The walk behind [`guard_update`] and [`pieces`]: with `pieces`, it also collects the text
/// runs.
///
/// Beyond the counts, it refuses two shapes no Yjs or yrs client writes, through which yrs 0.28
/// frees memory still in use (`docs/threat-model.md`, issue 13 item 6): a client listed in more
/// than one section (yrs appends the sections, integrates the repeated blocks a second time, and
/// its block store overwrites, and frees, an item the document still links to), and clocks or
/// delete ranges past [`MAX_CLOCK`]. Bytes after the delete set are refused too.
fn walk_update(update: &[u8], mut pieces: Option<&mut Vec<Piece>>) -> Result<(), ProtocolError> {
    let bad = |_| ProtocolError::MalformedUpdate;
    let c = &mut Cursor::new(update);
    let clients: u32 = c.read_var().map_err(bad)?;
    fits(c, clients, 3)?;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..clients {
        let blocks: u32 = c.read_var().map_err(bad)?;
        let client: u64 = c.read_var().map_err(bad)?;
        let start: u32 = c.read_var().map_err(bad)?;
        if !seen.insert(client) {
            return Err(ProtocolError::MalformedUpdate);
        }
        fits(c, blocks, 1)?;
        let mut clock = u64::from(start);
        for _ in 0..blocks {
            if clock > MAX_CLOCK {
                return Err(ProtocolError::MalformedUpdate);
            }
            let len = guard_block(c, client, clock as u32, pieces.as_deref_mut())?;
            clock += u64::from(len);
        }
        if clock > MAX_CLOCK {
            return Err(ProtocolError::MalformedUpdate);
        }
    }
    // The delete set: clients, each with ranges of (clock, length).
    let clients: u32 = c.read_var().map_err(bad)?;
    fits(c, clients, 2)?;
    for _ in 0..clients {
        let _client: u64 = c.read_var().map_err(bad)?;
        let ranges: u32 = c.read_var().map_err(bad)?;
        fits(c, ranges, 2)?;
        for _ in 0..ranges {
            let clock: u32 = c.read_var().map_err(bad)?;
            let len: u32 = c.read_var().map_err(bad)?;
            if u64::from(clock) + u64::from(len) > MAX_CLOCK {
                return Err(ProtocolError::MalformedUpdate);
            }
        }
    }
    if c.next != c.buf.len() {
        return Err(ProtocolError::MalformedUpdate);
    }
    Ok(())
}

/// Whether `count` entries of at least `min_bytes` each fit in what is left of `c`.
fn fits(c: &Cursor<'_>, count: u32, min_bytes: usize) -> Result<(), ProtocolError> {
    let left = c.buf.len().saturating_sub(c.next);
    if u64::from(count).saturating_mul(min_bytes as u64) > left as u64 {
        return Err(ProtocolError::MalformedUpdate);
    }
    Ok(())
}

/// One block of a v1 update (see `guard_update`), the block of `client` at `clock`. Returns the
/// clock units it takes, as yrs counts them.
fn guard_block(
    c: &mut Cursor<'_>,
    client: u64,
    clock: u32,
    pieces: Option<&mut Vec<Piece>>,
) -> Result<u32, ProtocolError> {
    const GC: u8 = 0;
    const SKIP: u8 = 10;
    const HAS_ORIGIN: u8 = 0b1000_0000;
    const HAS_RIGHT_ORIGIN: u8 = 0b0100_0000;
    const HAS_PARENT_SUB: u8 = 0b0010_0000;
    const XML_ELEMENT: u8 = 3;
    let bad = |_| ProtocolError::MalformedUpdate;
    let info = c.read_u8().map_err(bad)?;
    if info == GC || info == SKIP {
        let len: u32 = c.read_var().map_err(bad)?;
        return Ok(len);
    }
    let id = |c: &mut Cursor<'_>| -> Result<ID, ProtocolError> {
        let client: u64 = c.read_var().map_err(bad)?;
        let clock: u32 = c.read_var().map_err(bad)?;
        if client > MAX_CLIENT_ID {
            return Err(ProtocolError::MalformedUpdate);
        }
        Ok(ID::new(ClientID::new(client), clock))
    };
    let origin = if info & HAS_ORIGIN != 0 {
        Some(id(c)?)
    } else {
        None
    };
    let right = if info & HAS_RIGHT_ORIGIN != 0 {
        Some(id(c)?)
    } else {
        None
    };
    let mut parent = None;
    if info & (HAS_ORIGIN | HAS_RIGHT_ORIGIN) == 0 {
        let named: u32 = c.read_var().map_err(bad)?;
        if named == 1 {
            c.read_string().map_err(bad)?;
        } else {
            parent = Some(id(c)?);
        }
        if info & HAS_PARENT_SUB != 0 {
            c.read_string().map_err(bad)?;
        }
    }
    let len = match info & 0b1111 {
        // Deleted: a length.
        1 => c.read_var().map_err(bad)?,
        // JSON: yrs reads one string more than the count says, and keeps them all.
        2 => {
            let count: u32 = c.read_var().map_err(bad)?;
            let strings = count.checked_add(1).ok_or(ProtocolError::MalformedUpdate)?;
            fits(c, strings, 1)?;
            for _ in 0..strings {
                c.read_string().map_err(bad)?;
            }
            strings
        }
        // Binary, embed (JSON text).
        3 => {
            c.read_buf().map_err(bad)?;
            1
        }
        4 => {
            let text = c.read_string().map_err(bad)?;
            match pieces {
                None => utf16_len(text),
                Some(out) => {
                    if client > MAX_CLIENT_ID {
                        return Err(ProtocolError::MalformedUpdate);
                    }
                    let piece = Piece {
                        id: ID::new(ClientID::new(client), clock),
                        origin,
                        right,
                        parent,
                        text: text.to_owned(),
                    };
                    let len = piece.clocks();
                    out.push(piece);
                    len
                }
            }
        }
        5 => {
            c.read_string().map_err(bad)?;
            1
        }
        // Format: key and JSON value.
        6 => {
            c.read_string().map_err(bad)?;
            c.read_string().map_err(bad)?;
            1
        }
        // A shared type; an XML element carries its tag name. yrs knows no other type refs
        // (weak links are not built in).
        7 => {
            match c.read_u8().map_err(bad)? {
                XML_ELEMENT => {
                    c.read_string().map_err(bad)?;
                }
                0 | 1 | 2 | 4 | 5 | 6 | 9 | 15 => {}
                _ => return Err(ProtocolError::MalformedUpdate),
            }
            1
        }
        // Values.
        8 => {
            let count: u32 = c.read_var().map_err(bad)?;
            fits(c, count, 1)?;
            for _ in 0..count {
                guard_value(c, 0)?;
            }
            count
        }
        // A subdocument: its guid and options.
        9 => {
            c.read_string().map_err(bad)?;
            guard_value(c, 0)?;
            1
        }
        _ => return Err(ProtocolError::MalformedUpdate),
    };
    Ok(len)
}

/// One lib0-encoded value (`yrs::Any`), nested at `depth`.
fn guard_value(c: &mut Cursor<'_>, depth: usize) -> Result<(), ProtocolError> {
    let bad = |_| ProtocolError::MalformedUpdate;
    if depth >= MAX_VALUE_DEPTH {
        return Err(ProtocolError::TooDeep);
    }
    match c.read_u8().map_err(bad)? {
        // undefined, null, false, true
        127 | 126 | 121 | 120 => {}
        // A signed variable-length integer: bytes while the high bit is set.
        125 => {
            for _ in 0..10 {
                if c.read_u8().map_err(bad)? & 0x80 == 0 {
                    return Ok(());
                }
            }
            return Err(ProtocolError::MalformedUpdate);
        }
        124 => {
            c.read_exact(4).map_err(bad)?;
        }
        123 | 122 => {
            c.read_exact(8).map_err(bad)?;
        }
        119 => {
            c.read_string().map_err(bad)?;
        }
        // A map: entries of a key (at least one byte) and a value (at least one).
        118 => {
            let len: u32 = c.read_var().map_err(bad)?;
            fits(c, len, 2)?;
            for _ in 0..len {
                c.read_string().map_err(bad)?;
                guard_value(c, depth + 1)?;
            }
        }
        117 => {
            let len: u32 = c.read_var().map_err(bad)?;
            fits(c, len, 1)?;
            for _ in 0..len {
                guard_value(c, depth + 1)?;
            }
        }
        116 => {
            c.read_buf().map_err(bad)?;
        }
        _ => return Err(ProtocolError::MalformedUpdate),
    }
    Ok(())
}

fn validate(message: Message, max_awareness_entry: usize) -> Result<Inbound, ProtocolError> {
    match message {
        Message::Sync(SyncMessage::SyncStep1(sv)) => Ok(Inbound::SyncStep1(sv)),
        Message::Sync(SyncMessage::SyncStep2(bytes))
        | Message::Sync(SyncMessage::Update(bytes)) => {
            guard_update(&bytes)?;
            let update = catch_unwind(|| Update::decode_v1(&bytes))
                .map_err(|_| ProtocolError::MalformedUpdate)?
                .map_err(|_| ProtocolError::MalformedUpdate)?;
            Ok(Inbound::Update { update, bytes })
        }
        Message::Awareness(update) => {
            for entry in update.clients.values() {
                if entry.json.len() > max_awareness_entry {
                    return Err(ProtocolError::AwarenessTooLarge);
                }
                if serde_json::from_str::<serde::de::IgnoredAny>(&entry.json).is_err() {
                    return Err(ProtocolError::AwarenessNotJson);
                }
            }
            Ok(Inbound::Awareness(update))
        }
        Message::AwarenessQuery => Ok(Inbound::AwarenessQuery),
        // Auth messages flow server to client only; custom tags are not part of this server.
        Message::Auth(_) | Message::Custom(..) => Err(ProtocolError::Unsupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use yrs::sync::awareness::AwarenessUpdateEntry;
    use yrs::updates::encoder::Encode;
    use yrs::{ClientID, Doc, Text, Transact};

    fn update_bytes() -> Vec<u8> {
        let doc = Doc::new();
        let text = doc.get_or_insert_text("t");
        let mut txn = doc.transact_mut();
        text.push(&mut txn, "hello");
        txn.encode_update_v1()
    }

    fn awareness(json: &str) -> Vec<u8> {
        let mut clients = HashMap::new();
        clients.insert(
            ClientID::new(7),
            AwarenessUpdateEntry {
                clock: 1,
                json: json.into(),
            },
        );
        Message::Awareness(AwarenessUpdate { clients }).encode_v1()
    }

    #[test]
    fn accepts_every_client_message_kind() {
        let sv = Message::Sync(SyncMessage::SyncStep1(StateVector::default())).encode_v1();
        assert!(matches!(
            parse_frame(&sv, 4096).unwrap()[..],
            [Inbound::SyncStep1(_)]
        ));
        let up = Message::Sync(SyncMessage::Update(update_bytes())).encode_v1();
        assert!(matches!(
            parse_frame(&up, 4096).unwrap()[..],
            [Inbound::Update { .. }]
        ));
        let step2 = Message::Sync(SyncMessage::SyncStep2(update_bytes())).encode_v1();
        assert!(matches!(
            parse_frame(&step2, 4096).unwrap()[..],
            [Inbound::Update { .. }]
        ));
        let aw = awareness(r#"{"user":{"name":"ana"}}"#);
        assert!(matches!(
            parse_frame(&aw, 4096).unwrap()[..],
            [Inbound::Awareness(_)]
        ));
        let q = Message::AwarenessQuery.encode_v1();
        assert!(matches!(
            parse_frame(&q, 4096).unwrap()[..],
            [Inbound::AwarenessQuery]
        ));
        let both = [sv.clone(), up.clone()].concat();
        assert_eq!(parse_frame(&both, 4096).unwrap().len(), 2);
    }

    #[test]
    fn refuses_bad_frames() {
        assert_eq!(parse_frame(&[], 4096).unwrap_err(), ProtocolError::Empty);
        let up = Message::Sync(SyncMessage::Update(update_bytes())).encode_v1();
        // Truncated: yrs's MessageReader would silently accept the prefix.
        assert_eq!(
            parse_frame(&up[..up.len() - 3], 4096).unwrap_err(),
            ProtocolError::Malformed
        );
        let garbage = Message::Sync(SyncMessage::Update(vec![0xff, 0xff, 0xff, 0x01])).encode_v1();
        assert_eq!(
            parse_frame(&garbage, 4096).unwrap_err(),
            ProtocolError::MalformedUpdate
        );
        assert_eq!(
            parse_frame(&[0, 9], 4096).unwrap_err(),
            ProtocolError::Malformed
        );
        let auth = Message::Auth(None).encode_v1();
        assert_eq!(
            parse_frame(&auth, 4096).unwrap_err(),
            ProtocolError::Unsupported
        );
        assert_eq!(
            parse_frame(&awareness(&"x".repeat(5000)), 4096).unwrap_err(),
            ProtocolError::AwarenessTooLarge
        );
        assert_eq!(
            parse_frame(&awareness("{not json"), 4096).unwrap_err(),
            ProtocolError::AwarenessNotJson
        );
        // Found by the fuzzer: a 12-byte state vector claiming billions of entries (OOM), an
        // awareness client id past 53 bits (assertion in yrs), a presence update claiming
        // billions of entries.
        let sv_bomb = [
            0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0x30, 0xff, 0xff, 0xff, 0xff,
        ];
        assert_eq!(
            parse_frame(&sv_bomb, 4096).unwrap_err(),
            ProtocolError::Malformed
        );
        let big_id = [1, 10, 63, 154, 154, 154, 154, 199, 146, 129, 49, 0];
        assert_eq!(
            parse_frame(&big_id, 4096).unwrap_err(),
            ProtocolError::Malformed
        );
        let update_bomb = [0, 2, 10, 135, 249, 189, 189, 189, 189, 189, 0, 0, 135];
        assert_eq!(
            parse_frame(&update_bomb, 4096).unwrap_err(),
            ProtocolError::MalformedUpdate
        );
        let aw_bomb = [
            1, 11, 253, 207, 226, 226, 226, 1, 11, 253, 207, 226, 226, 242, 2,
        ];
        assert_eq!(
            parse_frame(&aw_bomb, 4096).unwrap_err(),
            ProtocolError::Malformed
        );
        // Found by the fuzzer: two updates of client 16, the first starting at clock 2, made
        // yrs 0.28 read freed memory when the second (clock 0) was integrated. The first one
        // skips clocks and is refused before it reaches a document.
        let uaf = [
            0u8, 1, 9, 1, 1, 16, 2, 1, 1, 0, 16, 0, 0, 1, 9, 1, 1, 16, 0, 1, 1, 0, 16, 0,
        ];
        let parsed = parse_frame(&uaf, 4096).unwrap();
        let Inbound::Update { update, .. } = &parsed[0] else {
            panic!("expected an update");
        };
        assert!(skips_clocks(update, &StateVector::default()));
        let Inbound::Update { update, .. } = &parsed[1] else {
            panic!("expected an update");
        };
        assert!(!skips_clocks(update, &StateVector::default()));
        let many = Message::AwarenessQuery
            .encode_v1()
            .repeat(MAX_MESSAGES_PER_FRAME + 1);
        assert_eq!(
            parse_frame(&many, 4096).unwrap_err(),
            ProtocolError::TooManyMessages
        );
    }

    /// An update, as a sync message in a frame.
    fn frame_of(update: Vec<u8>) -> Vec<u8> {
        Message::Sync(SyncMessage::Update(update)).encode_v1()
    }

    /// Found by the fuzzer with libFuzzer's allocation check on: a block count of billions made
    /// yrs `try_reserve` 12 GB for a 43-byte frame.
    #[test]
    fn block_counts_beyond_the_bytes_are_refused() {
        let bomb = [
            0u8, 2, 38, 1, 249, 252, 255, 251, 1, 1, 116, 4, 0, 1, 98, 98, 98, 27, 40, 41, 32, 123,
            10, 32, 32, 32, 32, 112, 114, 105, 110, 116, 108, 3, 2, 6, 109, 105, 100, 100, 108,
            101, 0,
        ];
        assert_eq!(
            parse_frame(&bomb, 4096).unwrap_err(),
            ProtocolError::MalformedUpdate
        );
    }

    /// An update holding `depth` nested arrays, by hand (building it with yrs would recurse).
    fn nested_update(depth: usize) -> Vec<u8> {
        // One client, one block at clock 0: Any content (info 8) in the root type "m".
        let mut b = vec![1u8, 1, 1, 0, 8, 1, 1, b'm', 1];
        b.extend(std::iter::repeat_n([117u8, 1], depth).flatten());
        b.push(126); // null, innermost
        b.push(0); // empty delete set
        b
    }

    /// yrs handles nested values recursively: a frame of nested arrays would overflow the
    /// stack. Nesting past `MAX_VALUE_DEPTH` is refused with its own reason; nesting up to it
    /// goes through decoding, integration, encoding, JSON and drop on a thread with the stack
    /// the server's threads get.
    #[test]
    fn deeply_nested_values_are_refused() {
        assert_eq!(
            parse_frame(&frame_of(nested_update(MAX_VALUE_DEPTH)), 4096).unwrap_err(),
            ProtocolError::TooDeep
        );
        assert_eq!(
            parse_frame(&frame_of(nested_update(100_000)), 4096).unwrap_err(),
            ProtocolError::TooDeep
        );
        let at_the_limit = std::thread::Builder::new()
            .stack_size(THREAD_STACK_BYTES)
            .spawn(|| {
                let frame = frame_of(nested_update(MAX_VALUE_DEPTH - 1));
                let Ok(mut parsed) = parse_frame(&frame, 4096) else {
                    return false;
                };
                let Some(Inbound::Update { update, .. }) = parsed.pop() else {
                    return false;
                };
                let doc = Doc::new();
                let applied = doc.transact_mut().apply_update(update).is_ok();
                use yrs::ReadTxn;
                let encoded = doc
                    .transact()
                    .encode_state_as_update_v1(&StateVector::default());
                let map = doc.get_or_insert_map("m");
                let json = yrs::types::ToJson::to_json(&map, &doc.transact());
                drop(json);
                drop(doc);
                applied && guard_update(&encoded).is_ok()
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(at_the_limit);
    }

    /// Every update yrs itself writes passes the guard: random documents of texts (with
    /// formatting and embeds), maps and arrays of nested values, XML, deletions; each
    /// incremental update and the whole state.
    #[test]
    fn every_update_yrs_writes_passes_the_guard() {
        use rand::{Rng, SeedableRng};
        use yrs::{Any, Array, Map, ReadTxn, Xml, XmlFragment};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        fn value(rng: &mut rand::rngs::StdRng, depth: usize) -> Any {
            match rng.gen_range(0..if depth > 6 { 6 } else { 9 }) {
                0 => Any::Null,
                1 => Any::Bool(rng.gen()),
                2 => Any::from(rng.gen::<f64>()),
                3 => Any::from(rng.gen::<i64>()),
                4 => Any::String("värde ✓".repeat(rng.gen_range(0..4)).into()),
                5 => Any::Buffer(vec![7u8; rng.gen_range(0..9)].into()),
                6 | 7 => Any::Array(
                    (0..rng.gen_range(0..4))
                        .map(|_| value(rng, depth + 1))
                        .collect::<Vec<_>>()
                        .into(),
                ),
                _ => Any::Map(
                    (0..rng.gen_range(0..4))
                        .map(|i| (format!("k{i}"), value(rng, depth + 1)))
                        .collect::<HashMap<_, _>>()
                        .into(),
                ),
            }
        }
        for round in 0..60 {
            let doc = Doc::with_client_id(round + 1);
            let text = doc.get_or_insert_text("text");
            let map = doc.get_or_insert_map("map");
            let array = doc.get_or_insert_array("array");
            let xml = doc.get_or_insert_xml_fragment("xml");
            for _ in 0..12 {
                let before = doc.transact().state_vector();
                {
                    let mut txn = doc.transact_mut();
                    let len = text.len(&txn);
                    match rng.gen_range(0..7) {
                        0 => text.insert(&mut txn, rng.gen_range(0..=len), "hello, text\n"),
                        1 if len > 2 => text.remove_range(&mut txn, 0, rng.gen_range(1..len)),
                        2 if len > 2 => {
                            let attrs =
                                HashMap::from([(std::sync::Arc::from("bold"), Any::Bool(true))]);
                            text.format(&mut txn, 0, len / 2, attrs);
                        }
                        3 => {
                            let v = value(&mut rng, 0);
                            text.insert_embed(&mut txn, len, v);
                        }
                        4 => {
                            let v = value(&mut rng, 0);
                            map.insert(&mut txn, format!("key{}", rng.gen_range(0..5)), v);
                        }
                        5 => {
                            let v = value(&mut rng, 0);
                            array.push_back(&mut txn, v);
                        }
                        _ => {
                            let el = xml.push_back(&mut txn, yrs::XmlElementPrelim::empty("div"));
                            el.insert_attribute(&mut txn, "class", "x");
                            el.push_back(&mut txn, yrs::XmlTextPrelim::new("inner"));
                        }
                    }
                }
                let step = doc.transact().encode_state_as_update_v1(&before);
                assert!(guard_update(&step).is_ok(), "round {round}: {step:?}");
            }
            let whole = doc
                .transact()
                .encode_state_as_update_v1(&StateVector::default());
            assert!(guard_update(&whole).is_ok(), "round {round}");
            assert!(parse_frame(&frame_of(whole), 4096).is_ok());
        }
    }

    /// The fuzzing seeds are frames the npm yjs and y-protocols wrote: every one is accepted.
    #[test]
    fn frames_written_by_npm_yjs_are_accepted() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let frame = std::fs::read(&path).unwrap();
            let parsed = parse_frame(&frame, 4096);
            if name == "auth" {
                assert_eq!(parsed.unwrap_err(), ProtocolError::Unsupported);
            } else {
                assert!(parsed.is_ok(), "{name}: {parsed:?}");
            }
            seen += 1;
        }
        assert!(seen >= 10, "only {seen} seeds");
    }

    /// `pieces` reads each run of text with the id yrs gives it, counting clocks in UTF-16
    /// units past other blocks, and the neighbours it was typed between.
    #[test]
    fn pieces_are_the_runs_of_text_with_their_ids_and_neighbours() {
        use yrs::{Map, TextPrelim};
        let doc = Doc::with_client_id(7);
        let files = doc.get_or_insert_map("files");
        let first = {
            let mut txn = doc.transact_mut();
            files.insert(&mut txn, "a.txt", TextPrelim::new("h😀"));
            txn.encode_update_v1()
        };
        let p = pieces(&first).unwrap();
        let id = |clock| ID::new(ClientID::new(7), clock);
        // The map entry takes clock 0; the text starts empty, so its first run names it.
        assert_eq!(p.len(), 1);
        assert_eq!(
            (p[0].id, p[0].parent, p[0].origin),
            (id(1), Some(id(0)), None)
        );
        assert_eq!((p[0].text.as_str(), p[0].clocks()), ("h😀", 3));
        let Some(yrs::Out::YText(text)) = files.get(&doc.transact(), "a.txt") else {
            panic!("no text");
        };
        let second = {
            let mut txn = doc.transact_mut();
            text.insert(&mut txn, 1, "i");
            text.push(&mut txn, "!");
            txn.encode_update_v1()
        };
        let p = pieces(&second).unwrap();
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(
            (p[0].id, p[0].origin, p[0].right),
            (id(4), Some(id(1)), Some(id(2)))
        );
        assert_eq!(
            (p[1].id, p[1].origin, p[1].right),
            (id(5), Some(id(3)), None)
        );
        assert_eq!(p[1].text, "!");
    }

    /// Shapes through which yrs 0.28 frees memory still in use (issue 13 item 6), refused before
    /// yrs sees them; no Yjs or yrs client writes them.
    #[test]
    fn updates_yrs_would_corrupt_itself_on_are_refused() {
        // One client in two sections, repeating "a" at (5,0): the minimal use-after-free.
        let repeated = [
            0x00, 0x02, 0x19, 0x02, 0x01, 0x05, 0x00, 0x04, 0x01, 0x01, 0x74, 0x01, 0x61, 0x02,
            0x05, 0x00, 0x04, 0x01, 0x01, 0x74, 0x01, 0x61, 0x84, 0x05, 0x00, 0x01, 0x62, 0x00,
        ];
        assert_eq!(
            parse_frame(&repeated, 4096).unwrap_err(),
            ProtocolError::MalformedUpdate
        );
        // A GC block of 2^32 - 1 clocks, then text: clocks wrap in a release build.
        let wrapping = [
            0x00, 0x02, 0x18, 0x01, 0x03, 0x09, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x04,
            0x01, 0x01, 0x74, 0x02, 0x61, 0x62, 0x04, 0x01, 0x01, 0x74, 0x01, 0x63, 0x00,
        ];
        assert_eq!(
            parse_frame(&wrapping, 4096).unwrap_err(),
            ProtocolError::MalformedUpdate
        );
        // The same frames without the repeat, the wrap, are fine: the rule is exact.
        let doc = Doc::with_client_id(5);
        let text = doc.get_or_insert_text("t");
        let update = {
            let mut txn = doc.transact_mut();
            text.insert(&mut txn, 0, "ab");
            txn.encode_update_v1()
        };
        assert!(parse_frame(&frame_of(update.clone()), 4096).is_ok());
        // Bytes after the delete set.
        let mut trailing = update;
        trailing.push(0);
        assert_eq!(
            parse_frame(&frame_of(trailing), 4096).unwrap_err(),
            ProtocolError::MalformedUpdate
        );
        // A delete range past the highest clock: no blocks; client 5 deletes 2 from 2^31 - 1.
        let range = vec![0x00, 0x01, 0x05, 0x01, 0xff, 0xff, 0xff, 0xff, 0x07, 0x02];
        assert_eq!(
            parse_frame(&frame_of(range), 4096).unwrap_err(),
            ProtocolError::MalformedUpdate
        );
        let fine = vec![0x00, 0x01, 0x05, 0x01, 0xfd, 0xff, 0xff, 0xff, 0x07, 0x02];
        assert!(parse_frame(&frame_of(fine), 4096).is_ok());
    }
}

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
use yrs::{StateVector, Update};

/// Largest number of y-protocol messages accepted in one frame (y-websocket sends one).
const MAX_MESSAGES_PER_FRAME: usize = 16;
/// Yjs client ids are 53-bit (JavaScript safe integers); yrs asserts this and panics beyond.
const MAX_CLIENT_ID: u64 = (1 << 53) - 1;

/// One validated client message.
#[derive(Debug)]
pub enum Inbound {
    /// The client's state vector: it wants what it is missing.
    SyncStep1(StateVector),
    /// Document content, from sync step 2 or an incremental update (the server treats both
    /// alike). `len` is the encoded size, used for the document size cap.
    Update { update: Update, len: usize },
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
}

impl ProtocolError {
    /// A short reason safe to put in a close frame.
    pub fn reason(&self) -> &'static str {
        match self {
            ProtocolError::Malformed => "malformed message",
            ProtocolError::MalformedUpdate => "malformed update",
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

fn validate(message: Message, max_awareness_entry: usize) -> Result<Inbound, ProtocolError> {
    match message {
        Message::Sync(SyncMessage::SyncStep1(sv)) => Ok(Inbound::SyncStep1(sv)),
        Message::Sync(SyncMessage::SyncStep2(bytes))
        | Message::Sync(SyncMessage::Update(bytes)) => {
            let update = catch_unwind(|| Update::decode_v1(&bytes))
                .map_err(|_| ProtocolError::MalformedUpdate)?
                .map_err(|_| ProtocolError::MalformedUpdate)?;
            Ok(Inbound::Update {
                update,
                len: bytes.len(),
            })
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
}

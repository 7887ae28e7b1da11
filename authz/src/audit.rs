//! The hash-chained audit log: sealing records and verifying chains.
//!
//! Each record's hash covers its chain id, its sequence number, every field and the previous
//! record's hash, each field length-prefixed so no two different records encode alike. A
//! flipped byte breaks the record's hash; a deleted, inserted or swapped record breaks the
//! sequence or the link; a truncated tail is caught against a checkpoint of the chain head kept
//! outside the audit table.

use sha2::{Digest, Sha256};
use std::fmt;

/// The `prev_hash` of a chain's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a record says, before it is sealed into a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    /// Unix milliseconds.
    pub at: i64,
    /// Who acted (a user id, `system`, or `anonymous`).
    pub actor: String,
    /// What was attempted.
    pub action: String,
    /// `allow` or `deny` (or another outcome word).
    pub decision: String,
    /// Why, for a denial; empty otherwise.
    pub reason: String,
    /// JSON with the parameters. Never a secret.
    pub details: String,
}

/// A sealed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// 1-based position in the chain.
    pub seq: i64,
    /// The record's content.
    pub fields: Fields,
    /// Hash of the previous record ([`GENESIS`] for the first).
    pub prev_hash: String,
    /// Hash of this record.
    pub hash: String,
}

fn hash(chain: &str, seq: i64, f: &Fields, prev_hash: &str) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(b"coderoom-audit-v1");
    field(chain.as_bytes());
    field(&seq.to_be_bytes());
    field(&f.at.to_be_bytes());
    field(f.actor.as_bytes());
    field(f.action.as_bytes());
    field(f.decision.as_bytes());
    field(f.reason.as_bytes());
    field(f.details.as_bytes());
    field(prev_hash.as_bytes());
    hex::encode(h.finalize())
}

/// Seals `fields` as the record after `head` (`None` for a new chain) in `chain`.
pub fn seal(chain: &str, head: Option<(i64, &str)>, fields: Fields) -> Record {
    let (seq, prev_hash) = match head {
        Some((seq, h)) => (seq + 1, h.to_owned()),
        None => (1, GENESIS.to_owned()),
    };
    let hash = hash(chain, seq, &fields, &prev_hash);
    Record {
        seq,
        fields,
        prev_hash,
        hash,
    }
}

/// What is wrong with a chain, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The record's content does not match its hash (edited).
    Altered,
    /// The record does not follow the previous one (deleted, inserted or swapped records).
    BrokenLink,
    /// Sequence numbers skip or repeat.
    OutOfSequence,
    /// The chain ends before the checkpointed head (truncated).
    Truncated,
    /// The record at the checkpoint is not the checkpointed one (rewritten history).
    CheckpointMismatch,
}

/// The first bad record of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainError {
    /// The chain id.
    pub chain: String,
    /// The sequence number of the first bad record (for truncation: the missing one).
    pub seq: i64,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.problem {
            Problem::Altered => "content does not match its hash",
            Problem::BrokenLink => "does not link to the previous record",
            Problem::OutOfSequence => "sequence number out of order",
            Problem::Truncated => "missing: the chain ends before its checkpoint",
            Problem::CheckpointMismatch => "differs from the checkpointed head",
        };
        write!(f, "audit chain {} record {}: {what}", self.chain, self.seq)
    }
}

impl std::error::Error for ChainError {}

/// Verifies `records` (in seq order) as the whole of `chain`, against an optional checkpoint
/// `(seq, hash)` of a head recorded earlier.
pub fn verify(
    chain: &str,
    records: &[Record],
    checkpoint: Option<(i64, &str)>,
) -> Result<(), ChainError> {
    let err = |seq, problem| ChainError {
        chain: chain.to_owned(),
        seq,
        problem,
    };
    let mut prev = GENESIS.to_owned();
    for (i, r) in records.iter().enumerate() {
        let expected_seq = i as i64 + 1;
        if r.prev_hash != prev {
            return Err(err(expected_seq, Problem::BrokenLink));
        }
        if r.seq != expected_seq {
            return Err(err(expected_seq, Problem::OutOfSequence));
        }
        if hash(chain, r.seq, &r.fields, &r.prev_hash) != r.hash {
            return Err(err(r.seq, Problem::Altered));
        }
        prev = r.hash.clone();
    }
    if let Some((seq, head)) = checkpoint {
        match records.get(usize::try_from(seq - 1).unwrap_or(usize::MAX)) {
            None if seq > 0 => return Err(err(records.len() as i64 + 1, Problem::Truncated)),
            Some(r) if r.hash != head => return Err(err(seq, Problem::CheckpointMismatch)),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same record is pinned in the browser client's tests (`web/src/audit.test.ts`), which
    /// verifies chains itself: a change to the encoding must change both.
    #[test]
    fn a_known_record_seals_to_a_pinned_hash() {
        let fields = Fields {
            at: 1,
            actor: "a".into(),
            action: "b".into(),
            decision: "allow".into(),
            reason: String::new(),
            details: "{}".into(),
        };
        assert_eq!(
            seal("room1", None, fields).hash,
            "de65f5210251ebb472cd405ec87de4956fecdd64e5f40b2acf84af573199be85"
        );
    }

    fn chain(n: usize) -> Vec<Record> {
        let mut v: Vec<Record> = Vec::new();
        for i in 0..n {
            let head = v.last().map(|r| (r.seq, r.hash.as_str()));
            let rec = seal(
                "room1",
                head,
                Fields {
                    at: i as i64,
                    actor: "ana".into(),
                    action: "edit".into(),
                    decision: "deny".into(),
                    reason: "missing capability edit".into(),
                    details: format!("{{\"n\":{i}}}"),
                },
            );
            v.push(rec);
        }
        v
    }

    #[test]
    fn a_sound_chain_verifies() {
        let c = chain(5);
        assert_eq!(verify("room1", &c, Some((5, &c[4].hash))), Ok(()));
        assert_eq!(verify("room1", &[], None), Ok(()));
        // A chain's records do not verify as another chain's.
        assert_eq!(
            verify("room2", &c, None).unwrap_err().problem,
            Problem::Altered
        );
    }

    #[test]
    fn tampering_is_named() {
        let c = chain(5);
        let mut flipped = c.clone();
        flipped[2].fields.details = "{\"n\":3}".into();
        assert_eq!(verify("room1", &flipped, None).unwrap_err().seq, 3);

        let mut deleted = c.clone();
        deleted.remove(1);
        let e = verify("room1", &deleted, None).unwrap_err();
        assert_eq!((e.seq, e.problem), (2, Problem::BrokenLink));

        let mut swapped = c.clone();
        swapped.swap(2, 3);
        assert_eq!(verify("room1", &swapped, None).unwrap_err().seq, 3);

        let truncated = &c[..3];
        assert_eq!(
            verify("room1", truncated, None),
            Ok(()),
            "undetectable without a checkpoint"
        );
        let e = verify("room1", truncated, Some((5, &c[4].hash))).unwrap_err();
        assert_eq!((e.seq, e.problem), (4, Problem::Truncated));
    }
}

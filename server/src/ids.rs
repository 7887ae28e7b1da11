//! Identifiers: the ids the server issues, and the newtypes ids travel in once the edge has
//! checked them.

use rand::RngCore;

/// A fresh id naming one error's log line (16 hex digits), given to the client in place of
/// details it must not see.
pub(crate) fn error_id() -> String {
    let mut raw = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    hex::encode(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_ids_are_distinct_hex() {
        let (a, b) = (error_id(), error_id());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}

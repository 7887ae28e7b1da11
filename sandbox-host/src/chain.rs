//! An error and its sources on one line. The crate's error messages leave the cause to their
//! source (`#[source]`); where an error becomes text (a reason in a receipt or a refusal, a log
//! field, a note shown to a room), the whole chain is what says what happened.

use std::fmt;

/// Shows an error followed by each of its sources, `: `-separated
/// (`cannot open /dev/kvm: Permission denied (os error 13)`).
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open the thing")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_source_follows_the_message() {
        let e = Outer(std::io::Error::other("it is gone"));
        assert_eq!(Chain(&e).to_string(), "cannot open the thing: it is gone");
        let plain = std::io::Error::other("alone");
        assert_eq!(Chain(&plain).to_string(), "alone");
    }
}

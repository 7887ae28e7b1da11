//! Email addresses as Coderoom accepts them: one canonical, boring form.
//!
//! Login mail goes to exactly the address stored on the account, so anything that could be
//! read two ways by two parsers is refused rather than interpreted: quoted local parts
//! (`"a@evil.com"@victim.com`), lists (`a@x.com,b@y.com`), CR/LF and other control characters,
//! comments, IP-literal domains, and anything non-ASCII (which is how homoglyph `@` signs such
//! as U+FF20 slip in). What is left is lowercased.

/// RFC 5321 limits.
const MAX_ADDRESS: usize = 254;
const MAX_LOCAL: usize = 64;
const MAX_LABEL: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid email address")]
pub(crate) struct InvalidEmail;

/// The canonical form of `input`, or an error when it is not a plain address.
pub(crate) fn canonicalize(input: &str) -> Result<String, InvalidEmail> {
    let addr = input.trim_matches(|c| c == ' ' || c == '\t');
    if addr.is_empty() || addr.len() > MAX_ADDRESS || !addr.is_ascii() {
        return Err(InvalidEmail);
    }
    let (local, domain) = addr.split_once('@').ok_or(InvalidEmail)?;
    if domain.contains('@') || local.is_empty() || local.len() > MAX_LOCAL {
        return Err(InvalidEmail);
    }
    // Dot-atom only: atext characters, dots between atoms.
    let atext = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c);
    if local
        .split('.')
        .any(|atom| atom.is_empty() || !atom.chars().all(atext))
    {
        return Err(InvalidEmail);
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if labels.len() < 2 {
        return Err(InvalidEmail);
    }
    for label in &labels {
        let ok = !label.is_empty()
            && label.len() <= MAX_LABEL
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !ok {
            return Err(InvalidEmail);
        }
    }
    // `.invalid` never receives mail (RFC 2606); agents' own user rows live there, and no one
    // may log in as one.
    if labels
        .last()
        .is_some_and(|tld| tld.eq_ignore_ascii_case("invalid"))
    {
        return Err(InvalidEmail);
    }
    Ok(addr.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_addresses_are_lowercased() {
        assert_eq!(
            canonicalize(" Ana.B+tag@Example.COM ").unwrap(),
            "ana.b+tag@example.com"
        );
        assert_eq!(
            canonicalize("x@sub.example.co").unwrap(),
            "x@sub.example.co"
        );
    }

    #[test]
    fn agents_addresses_are_no_ones() {
        assert!(canonicalize("agent-0123@agents.invalid").is_err());
        assert!(canonicalize("x@AGENTS.INVALID").is_err());
    }

    #[test]
    fn hostile_addresses_are_refused() {
        for bad in [
            "\"a@evil.com\"@victim.com",
            "a@x.com,b@y.com",
            "a@x.com, b@y.com",
            "a@x.com\r\nBcc: c@evil.com",
            "a@x.com\nBcc: c@evil.com",
            "a\u{FF20}example.com",
            "a\u{FE6B}example.com",
            "аna@example.com", // Cyrillic a
            "a@example.com>",
            "<a@example.com>",
            "Ana <a@example.com>",
            "a(comment)@example.com",
            "a@[127.0.0.1]",
            "a@localhost",
            "a..b@example.com",
            ".a@example.com",
            "a@-x.com",
            "a@x..com",
            "a@@x.com",
            "a@x.com;b@y.com",
            "",
            "@example.com",
            "a@",
        ] {
            assert_eq!(canonicalize(bad), Err(InvalidEmail), "{bad:?}");
        }
        let long = format!("{}@example.com", "a".repeat(65));
        assert_eq!(canonicalize(&long), Err(InvalidEmail));
    }
}

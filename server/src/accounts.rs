//! Accounts: sessions and tokens, login codes, email addresses and mail, trusted proxies.

pub(crate) mod codes;
pub(crate) mod email;
pub(crate) mod mail;
pub(crate) mod proxies;
pub(crate) mod sessions;

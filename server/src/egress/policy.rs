//! A room's egress policy: the hosts its sandbox may reach, as the room's manifest holds them.
//! Empty by default (nothing is reachable); changed only by an authorised, audited change.
//!
//! A rule is `host`, `host:port`, `*.suffix` (any name under `suffix`, not `suffix` itself),
//! `*` (any name: the address checks still apply), or an address literal. A rule without a
//! port allows ports 80 and 443.

use super::addr::{parse_host, split_port, Host};
use serde::{Deserialize, Serialize};

/// Most rules a room's allowlist holds.
pub(crate) const MAX_RULES: usize = 100;

/// Ports a rule without one allows.
const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Package registries an owner can switch on as a whole: name, what it is, its hosts.
pub(crate) const PRESETS: [(&str, &str, &[&str]); 4] = [
    (
        "npm",
        "npm registry",
        &["registry.npmjs.org", "registry.yarnpkg.com"],
    ),
    (
        "crates",
        "Rust crates",
        &[
            "crates.io",
            "index.crates.io",
            "static.crates.io",
            "static.rust-lang.org",
        ],
    ),
    (
        "pypi",
        "Python packages",
        &["pypi.org", "files.pythonhosted.org"],
    ),
    (
        "debian",
        "Debian packages",
        &["deb.debian.org", "security.debian.org"],
    ),
];

/// The policy as stored (JSON in `rooms.egress`) and shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Policy {
    /// Rules as written (checked by [`Rule::parse`]).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Names from [`PRESETS`].
    #[serde(default)]
    pub presets: Vec<String>,
}

/// What is wrong with a policy, said for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PolicyError {
    #[error("allowlist entry {entry:?}: {why}")]
    Rule { entry: String, why: &'static str },
    #[error("an allowlist holds at most {MAX_RULES} entries")]
    TooMany,
    #[error("unknown preset {0:?}; presets are npm, crates, pypi and debian")]
    UnknownPreset(String),
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    host: Pattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Any,
    Exact(Host),
    /// `*.example.com` as `.example.com`.
    Under(String),
}

impl Rule {
    /// Reads a rule; the error says what is wrong with it.
    pub(crate) fn parse(raw: &str) -> Result<Rule, PolicyError> {
        let bad = |why: &'static str| PolicyError::Rule {
            entry: raw.to_owned(),
            why,
        };
        let (host, port) = split_port(raw.trim());
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?,
            ),
            None => None,
        };
        let host = if host == "*" {
            Pattern::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            match parse_host(suffix).map_err(bad)? {
                Host::Name(n) => Pattern::Under(format!(".{n}")),
                Host::Ip(_) => return Err(bad("a wildcard covers names, not addresses")),
            }
        } else {
            Pattern::Exact(parse_host(host).map_err(bad)?)
        };
        Ok(Rule { host, port })
    }

    fn allows(&self, host: &Host, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        port_ok
            && match (&self.host, host) {
                (Pattern::Any, Host::Name(_)) => true,
                (Pattern::Exact(h), _) => h == host,
                (Pattern::Under(suffix), Host::Name(n)) => n.ends_with(suffix.as_str()),
                _ => false,
            }
    }
}

impl Policy {
    /// Checks every rule and preset and drops duplicates; the error is for the person who
    /// wrote it.
    pub(crate) fn checked(mut self) -> Result<Policy, PolicyError> {
        let mut seen = std::collections::HashSet::new();
        self.allow = self
            .allow
            .into_iter()
            .map(|r| r.trim().to_ascii_lowercase())
            .filter(|r| seen.insert(r.clone()))
            .collect();
        if self.allow.len() > MAX_RULES {
            return Err(PolicyError::TooMany);
        }
        for rule in &self.allow {
            Rule::parse(rule)?;
        }
        self.presets.sort();
        self.presets.dedup();
        if let Some(unknown) = self
            .presets
            .iter()
            .find(|p| !PRESETS.iter().any(|(name, ..)| name == p))
        {
            return Err(PolicyError::UnknownPreset(unknown.clone()));
        }
        Ok(self)
    }

    /// Every rule in force as written: the room's own, then its presets' hosts.
    pub(crate) fn in_force(&self) -> Vec<String> {
        let presets = PRESETS
            .iter()
            .filter(|(name, ..)| self.presets.iter().any(|p| p == name))
            .flat_map(|(_, _, hosts)| hosts.iter().map(|h| (*h).to_owned()));
        self.allow.iter().cloned().chain(presets).collect()
    }

    /// Every rule in force.
    pub(crate) fn rules(&self) -> Vec<Rule> {
        self.in_force()
            .iter()
            .filter_map(|r| Rule::parse(r).ok())
            .collect()
    }

    /// Whether the policy lets the sandbox reach `host:port` (the address checks come after).
    pub(crate) fn allows(&self, host: &Host, port: u16) -> bool {
        self.rules().iter().any(|r| r.allows(host, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], presets: &[&str]) -> Policy {
        Policy {
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            presets: presets.iter().map(|s| (*s).to_owned()).collect(),
        }
        .checked()
        .unwrap()
    }

    fn allows(p: &Policy, host: &str, port: u16) -> bool {
        p.allows(&parse_host(host).unwrap(), port)
    }

    #[test]
    fn nothing_is_allowed_by_default() {
        let p = Policy::default();
        assert!(!allows(&p, "example.com", 443));
        assert!(!allows(&p, "1.1.1.1", 443));
    }

    #[test]
    fn rules_match_names_suffixes_and_ports() {
        let p = policy(
            &["API.example.com", "*.crates.io", "git.example.org:8443"],
            &[],
        );
        assert!(allows(&p, "api.example.com", 443));
        assert!(allows(&p, "api.example.com.", 80));
        assert!(!allows(&p, "api.example.com", 22));
        assert!(!allows(&p, "example.com", 443));
        assert!(!allows(&p, "xapi.example.com", 443));
        assert!(allows(&p, "index.crates.io", 443));
        assert!(!allows(&p, "crates.io", 443), "*.x does not cover x itself");
        assert!(!allows(&p, "evilcrates.io", 443));
        assert!(allows(&p, "git.example.org", 8443));
        assert!(!allows(&p, "git.example.org", 443));
    }

    #[test]
    fn any_covers_names_but_not_address_literals() {
        let p = policy(&["*"], &[]);
        assert!(allows(&p, "anything.example", 443));
        assert!(!allows(&p, "93.184.216.34", 443));
        let p = policy(&["93.184.216.34:8080", "[2606:4700::1111]"], &[]);
        assert!(allows(&p, "93.184.216.34", 8080));
        assert!(allows(&p, "[2606:4700::1111]", 443));
    }

    #[test]
    fn presets_add_their_hosts() {
        let p = policy(&[], &["npm", "pypi"]);
        assert!(allows(&p, "registry.npmjs.org", 443));
        assert!(allows(&p, "files.pythonhosted.org", 443));
        assert!(!allows(&p, "crates.io", 443));
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason() {
        for (bad, says) in [
            ("exa mple.com", "malformed host name"),
            ("example.com:0", "port"),
            ("example.com:99999", "port"),
            ("*.10.0.0.1", "wildcard"),
            ("*.", "empty"),
            ("", "empty"),
        ] {
            let err = Policy {
                allow: vec![bad.into()],
                presets: vec![],
            }
            .checked()
            .unwrap_err()
            .to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        let err = Policy {
            allow: vec![],
            presets: vec!["everything".into()],
        }
        .checked()
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown preset"), "{err}");
        for (name, ..) in PRESETS {
            assert!(err.contains(name), "{err} does not name {name}");
        }
        let many = Policy {
            allow: (0..=MAX_RULES).map(|i| format!("h{i}.example")).collect(),
            presets: vec![],
        };
        assert!(many.checked().is_err());
    }
}

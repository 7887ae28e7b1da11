//! Coderoom authorization core: capabilities, role presets, per-participant grants, the one
//! decision function and the hash-chained audit log.
//!
//! Pure logic, no I/O, no clock: time is a parameter (`now`, Unix milliseconds). The server
//! loads the room's state, asks [`decide`], and performs an action only with the
//! [`Authorized`] proof it returns.
#![forbid(unsafe_code)]

pub mod audit;
mod decide;
mod grants;

pub use decide::{
    decide, granted_by_another, needs_another_person, Action, Approval, ApprovalRequest,
    Authorized, Decision, DenyReason, Principal,
};
pub use grants::{Agent, Grant, Participant, RoomState, Until};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A verb of the authorization layer, exactly as named in the public API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// See the document, terminal output and room metadata.
    Observe,
    /// Change the shared document.
    Edit,
    /// Type into the shared terminal and run commands.
    Type,
    /// Decide approval requests raised by others.
    Approve,
    /// Create invite links.
    Invite,
    /// Connect source repositories.
    ConnectRepo,
    /// Add secrets to the room.
    AddSecret,
    /// Spend budget.
    Spend,
    /// Export the room's content.
    Export,
    /// Publish previews.
    Publish,
    /// Lower or remove other participants' rights.
    Revoke,
    /// Request deletion of the room.
    Delete,
}

impl Capability {
    /// Every capability, in the order of the public API.
    pub const ALL: [Capability; 12] = [
        Capability::Observe,
        Capability::Edit,
        Capability::Type,
        Capability::Approve,
        Capability::Invite,
        Capability::ConnectRepo,
        Capability::AddSecret,
        Capability::Spend,
        Capability::Export,
        Capability::Publish,
        Capability::Revoke,
        Capability::Delete,
    ];

    /// The wire name of the capability.
    pub const fn as_str(self) -> &'static str {
        match self {
            Capability::Observe => "observe",
            Capability::Edit => "edit",
            Capability::Type => "type",
            Capability::Approve => "approve",
            Capability::Invite => "invite",
            Capability::ConnectRepo => "connect_repo",
            Capability::AddSecret => "add_secret",
            Capability::Spend => "spend",
            Capability::Export => "export",
            Capability::Publish => "publish",
            Capability::Revoke => "revoke",
            Capability::Delete => "delete",
        }
    }

    const fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for a name that is not a capability or a role.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{name}`")]
pub struct UnknownName {
    kind: &'static str,
    name: String,
}

impl FromStr for Capability {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Capability::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownName {
                kind: "capability",
                name: s.to_owned(),
            })
    }
}

/// A set of capabilities, stored as a bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapabilitySet(u16);

impl CapabilitySet {
    /// The empty set.
    pub const EMPTY: CapabilitySet = CapabilitySet(0);

    /// Builds a set from a list of capabilities.
    pub fn of(caps: &[Capability]) -> Self {
        caps.iter().fold(Self::EMPTY, |set, c| set.with(*c))
    }

    /// Whether the set holds `cap`.
    pub const fn contains(self, cap: Capability) -> bool {
        self.0 & cap.bit() != 0
    }

    /// The set with `cap` added.
    #[must_use]
    pub const fn with(self, cap: Capability) -> Self {
        CapabilitySet(self.0 | cap.bit())
    }

    /// The set with `cap` removed.
    #[must_use]
    pub const fn without(self, cap: Capability) -> Self {
        CapabilitySet(self.0 & !cap.bit())
    }

    /// Whether every capability of `self` is also in `other`.
    pub const fn is_subset_of(self, other: CapabilitySet) -> bool {
        self.0 & !other.0 == 0
    }

    /// The capabilities in the set, in API order.
    pub fn iter(self) -> impl Iterator<Item = Capability> {
        Capability::ALL
            .into_iter()
            .filter(move |c| self.contains(*c))
    }

    /// The capabilities in both sets.
    #[must_use]
    pub const fn intersection(self, other: CapabilitySet) -> Self {
        CapabilitySet(self.0 & other.0)
    }

    /// Every capability in either set.
    #[must_use]
    pub const fn union(self, other: CapabilitySet) -> Self {
        CapabilitySet(self.0 | other.0)
    }

    /// The capabilities of `self` that are not in `other`.
    #[must_use]
    pub const fn minus(self, other: CapabilitySet) -> Self {
        CapabilitySet(self.0 & !other.0)
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The wire names, in API order.
    pub fn names(self) -> Vec<&'static str> {
        self.iter().map(Capability::as_str).collect()
    }

    /// Parses a list of wire names.
    pub fn parse_names<S: AsRef<str>>(names: &[S]) -> Result<Self, UnknownName> {
        names
            .iter()
            .map(|n| n.as_ref().parse::<Capability>())
            .collect::<Result<Vec<_>, _>>()
            .map(|caps| CapabilitySet::of(&caps))
    }
}

/// A role preset: a named set of capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Every capability.
    Owner,
    /// observe, edit, type.
    Editor,
    /// observe only.
    Viewer,
}

impl Role {
    /// The wire name of the role.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Editor => "editor",
            Role::Viewer => "viewer",
        }
    }

    /// The capabilities the preset grants.
    pub fn capabilities(self) -> CapabilitySet {
        match self {
            Role::Owner => CapabilitySet::of(&Capability::ALL),
            Role::Editor => {
                CapabilitySet::of(&[Capability::Observe, Capability::Edit, Capability::Type])
            }
            Role::Viewer => CapabilitySet::of(&[Capability::Observe]),
        }
    }
}

impl FromStr for Role {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "owner" => Ok(Role::Owner),
            "editor" => Ok(Role::Editor),
            "viewer" => Ok(Role::Viewer),
            other => Err(UnknownName {
                kind: "role",
                name: other.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_names_round_trip() {
        for cap in Capability::ALL {
            assert_eq!(cap.as_str().parse::<Capability>(), Ok(cap));
        }
        assert!("root".parse::<Capability>().is_err());
    }

    #[test]
    fn presets_nest() {
        let owner = Role::Owner.capabilities();
        let editor = Role::Editor.capabilities();
        let viewer = Role::Viewer.capabilities();
        assert!(viewer.is_subset_of(editor));
        assert!(editor.is_subset_of(owner));
        assert!(!editor.is_subset_of(viewer));
        assert_eq!(owner.iter().count(), 12);
        assert!(editor.contains(Capability::Edit));
        assert!(!viewer.contains(Capability::Edit));
        assert!(!editor.without(Capability::Edit).contains(Capability::Edit));
    }
}

//! What each participant holds: a role preset, explicit extra capabilities (each with an
//! optional expiry) and explicit removals.

use crate::{Capability, CapabilitySet, Role};
use std::collections::BTreeMap;

/// An extra capability granted on top of the role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The capability.
    pub capability: Capability,
    /// Unix milliseconds after which the grant no longer counts; `None` for no expiry.
    pub expires_at: Option<i64>,
}

/// One participant of a room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// The role preset.
    pub role: Role,
    /// Extra capabilities beyond the role.
    pub extra: Vec<Grant>,
    /// Capabilities taken away from the role (and from any extra grant).
    pub removed: CapabilitySet,
}

impl Participant {
    /// A participant holding exactly a role preset.
    pub fn with_role(role: Role) -> Self {
        Participant {
            role,
            extra: Vec::new(),
            removed: CapabilitySet::EMPTY,
        }
    }

    /// The participant that holds exactly `to`: the largest role preset inside it, the rest as
    /// extra grants (expiring at `expires_at`), the role's surplus as removals. This is how the
    /// server stores every change.
    pub fn exactly(to: CapabilitySet, expires_at: Option<i64>) -> Self {
        let role = [Role::Owner, Role::Editor, Role::Viewer]
            .into_iter()
            .find(|r| r.capabilities().is_subset_of(to))
            .unwrap_or(Role::Viewer);
        Participant {
            role,
            extra: to
                .minus(role.capabilities())
                .iter()
                .map(|capability| Grant {
                    capability,
                    expires_at,
                })
                .collect(),
            removed: role.capabilities().minus(to),
        }
    }

    /// Whether `cap` is held with no expiry (through the role or a permanent grant).
    pub fn holds_permanently(&self, cap: Capability) -> bool {
        !self.removed.contains(cap)
            && (self.role.capabilities().contains(cap)
                || self
                    .extra
                    .iter()
                    .any(|g| g.capability == cap && g.expires_at.is_none()))
    }

    /// The capabilities in force at `now`: role plus unexpired grants, minus removals.
    pub fn capabilities(&self, now: i64) -> CapabilitySet {
        let extra = self
            .extra
            .iter()
            .filter(|g| g.expires_at.is_none_or(|t| t > now))
            .fold(CapabilitySet::EMPTY, |set, g| set.with(g.capability));
        self.role.capabilities().union(extra).minus(self.removed)
    }
}

/// The authorization-relevant state of one room: its participants by user id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomState {
    /// Participants keyed by user id.
    pub participants: BTreeMap<String, Participant>,
}

impl RoomState {
    /// The capabilities `user` holds at `now` (empty for non-participants).
    pub fn capabilities_of(&self, user: &str, now: i64) -> CapabilitySet {
        self.participants
            .get(user)
            .map_or(CapabilitySet::EMPTY, |p| p.capabilities(now))
    }

    /// How many participants hold `cap` at `now`.
    pub fn holders(&self, cap: Capability, now: i64) -> usize {
        self.participants
            .values()
            .filter(|p| p.capabilities(now).contains(cap))
            .count()
    }

    /// How many participants other than `except` hold `cap` with no expiry.
    pub fn permanent_holders_besides(&self, cap: Capability, except: &str) -> usize {
        self.participants
            .iter()
            .filter(|(u, p)| u.as_str() != except && p.holds_permanently(cap))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_expire_and_removals_win() {
        let mut p = Participant::with_role(Role::Viewer);
        p.extra.push(Grant {
            capability: Capability::Edit,
            expires_at: Some(100),
        });
        assert!(p.capabilities(99).contains(Capability::Edit));
        assert!(!p.capabilities(100).contains(Capability::Edit));
        p.removed = CapabilitySet::of(&[Capability::Observe]);
        assert!(!p.capabilities(0).contains(Capability::Observe));
    }
}

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

/// How long a capability is held: not at all, until a time, or for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Until {
    /// Not held.
    Never,
    /// Held until this Unix millisecond.
    At(i64),
    /// Held with no expiry.
    Forever,
}

impl Until {
    /// Whether the capability is held at `now` (Unix ms): an expiry is exclusive.
    pub fn holds_at(self, now: i64) -> bool {
        match self {
            Until::Never => false,
            Until::At(t) => now < t,
            Until::Forever => true,
        }
    }

    /// The Unix millisecond it stops being held: `None` when it is held for good, `i64::MIN`
    /// when it is not held at all.
    pub fn ends_at(self) -> Option<i64> {
        match self {
            Until::Never => Some(i64::MIN),
            Until::At(t) => Some(t),
            Until::Forever => None,
        }
    }
}

/// One participant of a room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// The role preset.
    pub role: Role,
    /// Extra capabilities beyond the role.
    pub extra: Vec<Grant>,
    /// Capabilities taken away from the role preset.
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

    /// How long `cap` is held, as of `now`.
    ///
    /// `type` is effective only together with `edit` (and only as long as both): whoever types
    /// in the terminal or runs commands can change every file of the workspace, and the
    /// workspace's text files are the room's document. A grant of `type` alone is kept, and
    /// takes effect if `edit` is granted later.
    pub fn until(&self, cap: Capability, now: i64) -> Until {
        match cap {
            Capability::Type => self
                .granted_until(Capability::Type, now)
                .min(self.granted_until(Capability::Edit, now)),
            _ => self.granted_until(cap, now),
        }
    }

    /// How long `cap` itself is granted, as of `now`, regardless of what it depends on.
    fn granted_until(&self, cap: Capability, now: i64) -> Until {
        if self.role.capabilities().contains(cap) && !self.removed.contains(cap) {
            return Until::Forever;
        }
        self.extra
            .iter()
            .filter(|g| g.capability == cap)
            .map(|g| match g.expires_at {
                None => Until::Forever,
                Some(t) if t > now => Until::At(t),
                Some(_) => Until::Never,
            })
            .max()
            .unwrap_or(Until::Never)
    }

    /// Whether `cap` is held with no expiry (through the role or a permanent grant).
    pub fn holds_permanently(&self, cap: Capability) -> bool {
        self.until(cap, i64::MIN) == Until::Forever
    }

    /// This participant with `caps` granted until `expires_at` (`None`: for good). A grant
    /// never shortens what is already held for longer.
    #[must_use]
    pub fn granting(&self, caps: CapabilitySet, expires_at: Option<i64>) -> Participant {
        let mut p = self.clone();
        for cap in caps.iter() {
            match expires_at {
                None => {
                    p.removed = p.removed.without(cap);
                    p.extra.retain(|g| g.capability != cap);
                    if !p.role.capabilities().contains(cap) {
                        p.extra.push(Grant {
                            capability: cap,
                            expires_at: None,
                        });
                    }
                }
                Some(t) => {
                    if p.until(cap, i64::MIN) < Until::At(t) {
                        p.extra.retain(|g| g.capability != cap);
                        p.extra.push(Grant {
                            capability: cap,
                            expires_at: Some(t),
                        });
                    }
                }
            }
        }
        p
    }

    /// This participant without `caps`.
    #[must_use]
    pub fn revoking(&self, caps: CapabilitySet) -> Participant {
        let mut p = self.clone();
        for cap in caps.iter() {
            p.extra.retain(|g| g.capability != cap);
            if p.role.capabilities().contains(cap) {
                p.removed = p.removed.with(cap);
            }
        }
        p
    }

    /// The capabilities in force at `now`: the role minus its removals, plus unexpired grants.
    pub fn capabilities(&self, now: i64) -> CapabilitySet {
        Capability::ALL
            .into_iter()
            .filter(|c| self.until(*c, now) > Until::Never)
            .fold(CapabilitySet::EMPTY, |set, c| set.with(c))
    }
}

/// An agent in a room: a participant sponsored by a person, holding at most what it was given
/// and, at every moment, no more than its sponsor holds then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    /// The person who brought it in (a participant's user id).
    pub sponsor: String,
    /// What it was given.
    pub capabilities: CapabilitySet,
    /// Unix milliseconds from which it holds nothing.
    pub expires_at: i64,
    /// Each command it runs waits for someone's approval of exactly that command.
    pub approval_mode: bool,
}

/// The authorization-relevant state of one room: its participants and agents by user id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomState {
    /// Participants keyed by user id.
    pub participants: BTreeMap<String, Participant>,
    /// Agents keyed by their user id (never also participants).
    pub agents: BTreeMap<String, Agent>,
}

impl RoomState {
    /// Whether `other` is `requester`'s own party for a rule that asks for someone else's
    /// approval: the requester itself or, for an agent, its sponsor (an agent acts for the
    /// person who brought it in, so its sponsor's approval is its own).
    pub fn same_party(&self, requester: &str, other: &str) -> bool {
        requester == other
            || self
                .agents
                .get(requester)
                .is_some_and(|a| a.sponsor == other)
    }

    /// The capabilities `user` holds at `now` (empty for non-participants). An agent's are
    /// what it was given that its sponsor holds now: none once the sponsor is gone or the
    /// agent has expired. `type` counts only with `edit`, for agents as for people.
    pub fn capabilities_of(&self, user: &str, now: i64) -> CapabilitySet {
        if let Some(p) = self.participants.get(user) {
            return p.capabilities(now);
        }
        let Some(a) = self.agents.get(user) else {
            return CapabilitySet::EMPTY;
        };
        if now >= a.expires_at {
            return CapabilitySet::EMPTY;
        }
        let sponsor = self
            .participants
            .get(&a.sponsor)
            .map_or(CapabilitySet::EMPTY, |p| p.capabilities(now));
        let held = a.capabilities.intersection(sponsor);
        if held.contains(Capability::Edit) {
            held
        } else {
            held.without(Capability::Type)
        }
    }

    /// How long `user` holds `cap`, as of `now`: a participant's own; an agent's the shorter of
    /// its own life and its sponsor's hold (so it changes whenever the sponsor's does).
    pub fn until(&self, user: &str, cap: Capability, now: i64) -> Until {
        if let Some(p) = self.participants.get(user) {
            return p.until(cap, now);
        }
        let Some(a) = self.agents.get(user) else {
            return Until::Never;
        };
        let sponsor = self.participants.get(&a.sponsor);
        let one = |c: Capability| {
            let given = if a.capabilities.contains(c) {
                Until::At(a.expires_at)
            } else {
                Until::Never
            };
            given.min(sponsor.map_or(Until::Never, |p| p.until(c, now)))
        };
        let u = match cap {
            Capability::Type => one(Capability::Type).min(one(Capability::Edit)),
            c => one(c),
        };
        if u.holds_at(now) {
            u
        } else {
            Until::Never
        }
    }

    /// Whether `user` is a participant or an agent of the room.
    pub fn is_member(&self, user: &str) -> bool {
        self.participants.contains_key(user) || self.agents.contains_key(user)
    }

    /// Whether `user` is one of the room's agents.
    pub fn is_agent(&self, user: &str) -> bool {
        self.agents.contains_key(user)
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

    /// An agent holds what it was given and its sponsor holds now: never more, less as soon
    /// as the sponsor has less, nothing once the sponsor is gone or it has expired.
    #[test]
    fn an_agent_holds_no_more_than_its_sponsor_now() {
        let mut state = RoomState::default();
        state
            .participants
            .insert("ana".into(), Participant::with_role(Role::Editor));
        let given = CapabilitySet::of(&[
            Capability::Observe,
            Capability::Edit,
            Capability::Type,
            Capability::Publish,
        ]);
        state.agents.insert(
            "bot".into(),
            Agent {
                sponsor: "ana".into(),
                capabilities: given,
                expires_at: 1_000,
                approval_mode: false,
            },
        );
        let editor = CapabilitySet::of(&[Capability::Observe, Capability::Edit, Capability::Type]);
        assert_eq!(state.capabilities_of("bot", 0), editor);
        // Raising the sponsor gives the agent only what it was given.
        state
            .participants
            .insert("ana".into(), Participant::with_role(Role::Owner));
        assert_eq!(state.capabilities_of("bot", 0), given);
        // Lowering the sponsor lowers the agent; type goes with edit.
        state
            .participants
            .insert("ana".into(), Participant::with_role(Role::Viewer));
        assert_eq!(
            state.capabilities_of("bot", 0),
            CapabilitySet::of(&[Capability::Observe])
        );
        state
            .participants
            .insert("ana".into(), Participant::with_role(Role::Owner));
        assert_eq!(state.capabilities_of("bot", 999), given);
        assert_eq!(state.capabilities_of("bot", 1_000), CapabilitySet::EMPTY);
        state.participants.remove("ana");
        assert_eq!(state.capabilities_of("bot", 0), CapabilitySet::EMPTY);
        assert!(state.is_agent("bot") && !state.is_agent("ana"));
        state
            .participants
            .insert("ana".into(), Participant::with_role(Role::Editor));
        assert_eq!(state.until("bot", Capability::Type, 0), Until::At(1_000));
        assert_eq!(state.until("bot", Capability::Publish, 0), Until::Never);
        assert_eq!(state.until("bot", Capability::Edit, 1_000), Until::Never);
    }

    #[test]
    fn until_holds_before_its_expiry_only() {
        assert!(!Until::Never.holds_at(0));
        assert!(Until::At(10).holds_at(9));
        assert!(!Until::At(10).holds_at(10));
        assert!(Until::Forever.holds_at(i64::MAX));
        assert_eq!(Until::Never.ends_at(), Some(i64::MIN));
        assert_eq!(Until::At(10).ends_at(), Some(10));
        assert_eq!(Until::Forever.ends_at(), None);
    }

    #[test]
    fn type_needs_edit() {
        let viewer_typing = Participant::with_role(Role::Viewer)
            .granting(CapabilitySet::of(&[Capability::Type]), None);
        assert_eq!(viewer_typing.until(Capability::Type, 0), Until::Never);
        assert!(!viewer_typing.capabilities(0).contains(Capability::Type));
        let both = viewer_typing.granting(CapabilitySet::of(&[Capability::Edit]), Some(100));
        assert_eq!(both.until(Capability::Type, 0), Until::At(100));
        assert!(both.capabilities(0).contains(Capability::Type));
        assert!(!both.capabilities(100).contains(Capability::Type));
    }

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

    #[test]
    fn grants_with_expiry_stay_temporary_even_for_role_capabilities() {
        let editor = Participant::with_role(Role::Editor);
        let no_edit = editor.revoking(CapabilitySet::of(&[Capability::Edit]));
        assert_eq!(no_edit.until(Capability::Edit, 0), Until::Never);
        let temp = no_edit.granting(CapabilitySet::of(&[Capability::Edit]), Some(50));
        assert_eq!(temp.until(Capability::Edit, 0), Until::At(50));
        assert!(!temp.capabilities(50).contains(Capability::Edit));
        // A temporary grant never shortens a permanent one.
        let still = editor.granting(CapabilitySet::of(&[Capability::Edit]), Some(50));
        assert_eq!(still.until(Capability::Edit, 0), Until::Forever);
        let back = temp.granting(CapabilitySet::of(&[Capability::Edit]), None);
        assert_eq!(back.until(Capability::Edit, 99), Until::Forever);
    }
}

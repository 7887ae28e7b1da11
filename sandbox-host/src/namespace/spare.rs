//! What a namespace sandbox's start needs that does not depend on its room, made ahead of need
//! (a cgroup under a name of its own, renamed to the sandbox's; a room uid with its user
//! namespace): about two thirds of the preparation before bubblewrap.

use super::{Namespace, SubIds, INSIDE_ID};
use crate::cgroup::{Cgroup, Layout};
use crate::process::{RoomUid, ROOM_UIDS};
use crate::{Limits, StartError};
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A room uid's slot and host uid, and its user namespace.
pub(super) type Users = ((RoomUid, u32), OwnedFd);

/// What the next start needs that does not depend on its room, made ahead of need: when the
/// backend is made and again right after each start, on a blocking thread.
#[derive(Default)]
pub(super) struct Spare {
    /// A cgroup under a name of its own, and the limits it was given (v1 renames it to the
    /// sandbox's; v2 cannot, so there it is made at each start).
    pub(super) group: Option<(Cgroup, Limits)>,
    pub(super) users: Option<Users>,
    /// A refill is under way.
    refilling: bool,
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare")
            .field("group", &self.group.is_some())
            .field("users", &self.users.is_some())
            .finish()
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some((g, _)) = self.group.take() {
            g.remove();
        }
    }
}

/// How to make a [`Spare`], apart from the backend (it is made on a blocking thread).
pub(super) struct SpareMaker {
    layout: Option<Layout>,
    limits: Limits,
    run_as: Option<u32>,
    subids: Option<SubIds>,
    room_uids: Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>,
}

/// Spare groups made by this process, for their names.
static SPARES_MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl SpareMaker {
    pub(super) fn make(&self) -> Spare {
        self.make_missing((true, true))
    }

    /// A spare with what is `missing` (the group, the users) that this host can have.
    fn make_missing(&self, (group, users): (bool, bool)) -> Spare {
        let group = self
            .layout
            .as_ref()
            .filter(|l| group && matches!(l, Layout::V1 { .. }))
            .and_then(|l| {
                let n = SPARES_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let name = crate::cgroup::spare_name(n);
                Cgroup::create(l, &name, &self.limits)
                    .ok()
                    .map(|g| (g, self.limits.clone()))
            });
        Spare {
            group,
            users: if users {
                self.users().ok().flatten()
            } else {
                None
            },
            refilling: false,
        }
    }

    /// A room uid and its user namespace (crate::userns), when the sandbox gets two users: root
    /// outside, or subordinate ids.
    pub(super) fn users(&self) -> Result<Option<Users>, StartError> {
        let plan = match (self.run_as, self.subids) {
            (Some(owner), _) => Some((ROOM_UIDS.end - ROOM_UIDS.start, Some(owner), None)),
            (None, Some(sub)) => Some((sub.count, None, Some(sub))),
            (None, None) => None,
        };
        let Some((slots, owner, sub)) = plan else {
            return Ok(None);
        };
        let slot = RoomUid::take(&self.room_uids, slots)
            .ok_or_else(|| StartError::Unavailable("every room uid is in use".into()))?;
        let (maps, host) = match (owner, sub) {
            (Some(owner), _) => {
                let room = ROOM_UIDS.start + slot.slot;
                (crate::userns::Maps::Root { owner, room }, room)
            }
            (None, Some(sub)) => (
                crate::userns::Maps::Helpers {
                    uid: sub.uid + slot.slot,
                    gid: sub.gid + slot.slot,
                },
                sub.uid + slot.slot,
            ),
            (None, None) => unreachable!("planned above"),
        };
        let ns = crate::userns::create(maps, INSIDE_ID).map_err(|e| {
            StartError::Unavailable(format!("cannot make the sandbox's users: {e}"))
        })?;
        Ok(Some(((slot, host), ns)))
    }
}

impl Namespace {
    /// Makes the next start's spare on a blocking thread (one refill at a time), now that this
    /// start is done with the host.
    pub(super) fn refill_spare(&self, limits: &Limits) {
        {
            let mut s = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            if s.refilling {
                return;
            }
            s.refilling = true;
        }
        let maker = self.spare_maker(limits);
        let spare = self.spare.clone();
        tokio::task::spawn_blocking(move || {
            let missing = {
                let s = spare.lock().unwrap_or_else(|e| e.into_inner());
                (s.group.is_none(), s.users.is_none())
            };
            let mut made = maker.make_missing(missing);
            let mut s = spare.lock().unwrap_or_else(|e| e.into_inner());
            if s.group.is_none() {
                s.group = made.group.take();
            }
            if s.users.is_none() {
                s.users = made.users.take();
            }
            s.refilling = false;
            // What is left over (a start took nothing meanwhile) goes: a group is removed.
            drop(s);
            drop(made);
        });
    }

    pub(super) fn spare_maker(&self, limits: &Limits) -> SpareMaker {
        SpareMaker {
            layout: self.cgroups.as_ref().ok().cloned(),
            limits: limits.clone(),
            run_as: self.run_as,
            subids: self.subids,
            room_uids: self.room_uids.clone(),
        }
    }
}

//! Floor control of the shared terminal: one driver at a time, so two typists (or an agent and
//! a person) never interleave keystrokes.
//!
//! - A key from a typist takes a free floor for the line it starts: the floor is free again
//!   once that typist ends the line (Enter, Ctrl-C, Ctrl-D) or has typed nothing for
//!   [`LINE_IDLE`]. Meanwhile others' keys are refused, each told who has the terminal.
//! - `take` holds the floor until the holder releases it, hands it to someone who asked for
//!   it, leaves, or loses `type` (editing in a full-screen program needs this).
//! - `request` asks the holder for it; the holder may `give` it. A holder that has typed
//!   nothing for [`HANDOVER_IDLE`] while someone asks hands it over without being asked, and a
//!   floor that comes free goes to the oldest request, so an absent holder blocks nobody for
//!   long.
//!
//! Pure state: the hub owns one, tells it what happens and when, and broadcasts [`FloorView`]
//! whenever an operation says the visible state changed.

use serde::Serialize;
use std::time::Duration;
use tokio::time::Instant;

/// A line's floor is free again after this long without a key from its typist.
pub(crate) const LINE_IDLE: Duration = Duration::from_secs(3);
/// A held floor goes to the oldest request after its holder typed nothing for this long.
pub(crate) const HANDOVER_IDLE: Duration = Duration::from_secs(30);
/// Requests waiting at once (older ones are kept; more are refused).
const MAX_REQUESTS: usize = 16;

/// A participant as viewers see them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Person {
    pub user_id: String,
    pub email: String,
}

#[derive(Debug)]
struct Holder {
    person: Person,
    /// The connection it holds the floor through: the floor is free when it leaves.
    viewer: u64,
    /// Taken with `take` (held until released), not by starting a line.
    held: bool,
    last_key: Instant,
}

impl Holder {
    /// Taken with `take` (or handed over): held until let go.
    fn held(person: Person, viewer: u64, now: Instant) -> Holder {
        Holder {
            person,
            viewer,
            held: true,
            last_key: now,
        }
    }
}

#[derive(Debug)]
struct Request {
    person: Person,
    viewer: u64,
}

/// What viewers are shown: who holds the terminal (taken with `take`; a line's typist is
/// shown by `typing` events instead) and who asked for it, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FloorView {
    pub holder: Option<Person>,
    pub requests: Vec<Person>,
}

/// Why an operation on the floor was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Someone else has the terminal.
    Busy(Person),
    /// Only the holder may hand the floor on, and only to someone who asked.
    NotHolder,
    NoSuchRequest,
    TooManyRequests,
}

impl Refused {
    pub(crate) fn reason(&self) -> String {
        match self {
            Refused::Busy(p) => format!("{} has the terminal; ask for control to type", p.email),
            Refused::NotHolder => "only the one who has the terminal can hand it on".into(),
            Refused::NoSuchRequest => "that participant has not asked for the terminal".into(),
            Refused::TooManyRequests => "too many people are waiting for the terminal".into(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Floor {
    holder: Option<Holder>,
    requests: Vec<Request>,
}

/// Whether the visible state changed (the hub then broadcasts the view).
pub(crate) type Changed = bool;

fn ends_line(data: &[u8]) -> bool {
    data.iter()
        .any(|b| matches!(b, b'\r' | b'\n' | 0x03 | 0x04))
}

impl Floor {
    pub(crate) fn view(&self) -> FloorView {
        FloorView {
            holder: self
                .holder
                .as_ref()
                .filter(|h| h.held)
                .map(|h| h.person.clone()),
            requests: self.requests.iter().map(|r| r.person.clone()).collect(),
        }
    }

    /// Keys from `who` on `viewer`: allowed (taking a free floor for the line), or refused
    /// because someone else has the terminal.
    pub(crate) fn keys(
        &mut self,
        viewer: u64,
        who: &Person,
        data: &[u8],
        now: Instant,
    ) -> Result<Changed, Refused> {
        let mut changed = self.tick(now);
        match &mut self.holder {
            None => {
                self.holder = Some(Holder {
                    person: who.clone(),
                    viewer,
                    held: false,
                    last_key: now,
                });
            }
            Some(h) if h.person.user_id == who.user_id => h.last_key = now,
            Some(h) => return Err(Refused::Busy(h.person.clone())),
        }
        if self.holder.as_ref().is_some_and(|h| !h.held) && ends_line(data) {
            self.holder = None;
            changed |= self.grant_next(now);
        }
        Ok(changed)
    }

    /// `who` takes the terminal until it lets go; where someone else has it, this asks for it.
    pub(crate) fn take(
        &mut self,
        viewer: u64,
        who: &Person,
        now: Instant,
    ) -> Result<Changed, Refused> {
        let changed = self.tick(now);
        match &mut self.holder {
            Some(h) if h.person.user_id == who.user_id => {
                let was = h.held;
                h.held = true;
                h.viewer = viewer;
                h.last_key = now;
                Ok(changed | !was)
            }
            Some(_) => self.request(viewer, who, now).map(|c| c | changed),
            None => {
                self.holder = Some(Holder::held(who.clone(), viewer, now));
                Ok(true)
            }
        }
    }

    /// `who` asks for the terminal (once; a free floor is simply taken).
    pub(crate) fn request(
        &mut self,
        viewer: u64,
        who: &Person,
        now: Instant,
    ) -> Result<Changed, Refused> {
        let changed = self.tick(now);
        match &self.holder {
            None => return self.take(viewer, who, now).map(|c| c | changed),
            Some(h) if h.person.user_id == who.user_id => return Ok(changed),
            Some(_) => {}
        }
        if self
            .requests
            .iter()
            .any(|r| r.person.user_id == who.user_id)
        {
            return Ok(changed);
        }
        if self.requests.len() >= MAX_REQUESTS {
            return Err(Refused::TooManyRequests);
        }
        self.requests.push(Request {
            person: who.clone(),
            viewer,
        });
        Ok(true)
    }

    /// `who` lets go of the terminal (or withdraws its request).
    pub(crate) fn release(&mut self, who: &str, now: Instant) -> Changed {
        let mut changed = self.tick(now);
        let before = self.requests.len();
        self.requests.retain(|r| r.person.user_id != who);
        changed |= self.requests.len() != before;
        if self
            .holder
            .as_ref()
            .is_some_and(|h| h.person.user_id == who)
        {
            let held = self.holder.take().is_some_and(|h| h.held);
            changed |= held | self.grant_next(now);
        }
        changed
    }

    /// The holder hands the terminal to `to`, who asked for it.
    pub(crate) fn give(&mut self, who: &str, to: &str, now: Instant) -> Result<Changed, Refused> {
        self.tick(now);
        if self.holder.as_ref().is_none_or(|h| h.person.user_id != who) {
            return Err(Refused::NotHolder);
        }
        let Some(i) = self.requests.iter().position(|r| r.person.user_id == to) else {
            return Err(Refused::NoSuchRequest);
        };
        let r = self.requests.remove(i);
        self.holder = Some(Holder::held(r.person, r.viewer, now));
        Ok(true)
    }

    /// A connection left: what it held or asked for goes.
    pub(crate) fn left(&mut self, viewer: u64, now: Instant) -> Changed {
        let before = self.requests.len();
        self.requests.retain(|r| r.viewer != viewer);
        let mut changed = self.requests.len() != before;
        if self.holder.as_ref().is_some_and(|h| h.viewer == viewer) {
            let held = self.holder.take().is_some_and(|h| h.held);
            changed |= held | self.grant_next(now);
        }
        changed
    }

    /// `user_id` may no longer type: what it held or asked for goes.
    pub(crate) fn revoked(&mut self, user_id: &str, now: Instant) -> Changed {
        self.release(user_id, now)
    }

    /// Lets time pass: a line's floor lapses after [`LINE_IDLE`]; a held one goes to the
    /// oldest request after [`HANDOVER_IDLE`] without a key.
    pub(crate) fn tick(&mut self, now: Instant) -> Changed {
        let Some(h) = &self.holder else {
            return self.grant_next(now);
        };
        let idle = now.saturating_duration_since(h.last_key);
        let lapsed = if h.held {
            !self.requests.is_empty() && idle >= HANDOVER_IDLE
        } else {
            idle >= LINE_IDLE
        };
        if !lapsed {
            return false;
        }
        let held = self.holder.take().is_some_and(|h| h.held);
        held | self.grant_next(now)
    }

    /// When [`Floor::tick`] may next change what viewers see (`None`: not by itself).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let h = self.holder.as_ref()?;
        if self.requests.is_empty() {
            return None;
        }
        Some(h.last_key + if h.held { HANDOVER_IDLE } else { LINE_IDLE })
    }

    /// A free floor goes to the oldest request.
    fn grant_next(&mut self, now: Instant) -> Changed {
        if self.holder.is_some() || self.requests.is_empty() {
            return false;
        }
        let r = self.requests.remove(0);
        self.holder = Some(Holder::held(r.person, r.viewer, now));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: &str) -> Person {
        Person {
            user_id: id.into(),
            email: format!("{id}@x"),
        }
    }

    #[test]
    fn a_line_holds_the_floor_until_it_ends_or_idles() {
        let t0 = Instant::now();
        let mut f = Floor::default();
        assert_eq!(f.keys(1, &p("ana"), b"ec", t0), Ok(false));
        // Ben's keys interleave with nothing: refused while Ana's line is open.
        assert_eq!(f.keys(2, &p("ben"), b"x", t0), Err(Refused::Busy(p("ana"))));
        assert_eq!(f.keys(1, &p("ana"), b"ho\r", t0), Ok(false));
        assert_eq!(f.keys(2, &p("ben"), b"ls", t0), Ok(false));
        // Ben stops mid-line: after LINE_IDLE Ana may type again.
        let later = t0 + LINE_IDLE;
        assert!(f
            .keys(1, &p("ana"), b"x", later - Duration::from_millis(1))
            .is_err());
        assert_eq!(f.keys(1, &p("ana"), b"x", later), Ok(false));
        // Nothing was shown: lines are told by `typing` events.
        assert_eq!(f.view().holder, None);
    }

    #[test]
    fn a_taken_floor_is_held_until_handed_over() {
        let t0 = Instant::now();
        let mut f = Floor::default();
        assert_eq!(f.take(1, &p("ana"), t0), Ok(true));
        assert_eq!(f.view().holder, Some(p("ana")));
        // Ends of lines and idleness do not free it.
        assert_eq!(f.keys(1, &p("ana"), b"vi x\r", t0), Ok(false));
        let much_later = t0 + HANDOVER_IDLE * 4;
        assert_eq!(
            f.keys(2, &p("ben"), b"y", much_later),
            Err(Refused::Busy(p("ana")))
        );
        // Ana is at the keyboard; Ben asks; only Ana can give it, and only to someone who
        // asked.
        assert_eq!(f.keys(1, &p("ana"), b"k", much_later), Ok(false));
        assert_eq!(
            f.give("ana", "ben", much_later),
            Err(Refused::NoSuchRequest)
        );
        assert_eq!(f.request(2, &p("ben"), much_later), Ok(true));
        assert_eq!(f.view().requests, vec![p("ben")]);
        assert_eq!(f.give("ben", "ben", much_later), Err(Refused::NotHolder));
        assert_eq!(f.give("ana", "ben", much_later), Ok(true));
        assert_eq!(
            f.view(),
            FloorView {
                holder: Some(p("ben")),
                requests: vec![]
            }
        );
        assert_eq!(
            f.keys(1, &p("ana"), b"z", much_later),
            Err(Refused::Busy(p("ben")))
        );
        assert!(f.keys(2, &p("ben"), b"z", much_later).is_ok());
        // Ben lets go: free for anyone's next line.
        assert!(f.release("ben", much_later));
        assert_eq!(f.keys(1, &p("ana"), b"z", much_later), Ok(false));
    }

    #[test]
    fn an_absent_holder_hands_over_to_the_oldest_request() {
        let t0 = Instant::now();
        let mut f = Floor::default();
        f.take(1, &p("ana"), t0).unwrap();
        assert_eq!(f.deadline(), None);
        f.request(2, &p("ben"), t0).unwrap();
        f.request(3, &p("cy"), t0).unwrap();
        assert_eq!(f.deadline(), Some(t0 + HANDOVER_IDLE));
        assert!(!f.tick(t0 + HANDOVER_IDLE - Duration::from_millis(1)));
        assert!(f.tick(t0 + HANDOVER_IDLE));
        assert_eq!(f.view().holder, Some(p("ben")));
        // Ben's connection goes: Cy is next.
        assert!(f.left(2, t0 + HANDOVER_IDLE));
        assert_eq!(f.view().holder, Some(p("cy")));
        // Cy loses `type`: free.
        assert!(f.revoked("cy", t0 + HANDOVER_IDLE));
        assert_eq!(
            f.view(),
            FloorView {
                holder: None,
                requests: vec![]
            }
        );
    }

    #[test]
    fn a_request_waits_for_the_line_and_requests_are_bounded() {
        let t0 = Instant::now();
        let mut f = Floor::default();
        f.keys(1, &p("ana"), b"make", t0).unwrap();
        // Asking while Ana's line is open: granted when it ends.
        assert_eq!(f.take(2, &p("ben"), t0), Ok(true));
        assert_eq!(f.view().holder, None);
        assert_eq!(f.keys(1, &p("ana"), b"\r", t0), Ok(true));
        assert_eq!(f.view().holder, Some(p("ben")));
        for i in 0..MAX_REQUESTS {
            f.request(10 + i as u64, &p(&format!("u{i}")), t0).unwrap();
        }
        assert_eq!(f.request(99, &p("late"), t0), Err(Refused::TooManyRequests));
    }
}

//! Time as a parameter: the system clock in production, a clock the test moves by hand in
//! tests. Logic that decides by the time of day (expiry, timers, recording timestamps) asks a
//! `Clock` instead of reading the system time itself. Waiting is `tokio::time`, which tests
//! pause and advance.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Unix time in milliseconds, from the system or from a test.
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock {
    /// `None`: the system clock.
    manual: Option<Arc<AtomicI64>>,
}

impl Clock {
    /// The system clock.
    pub(crate) fn system() -> Self {
        Clock { manual: None }
    }

    /// A clock that reads `start_ms` until it is moved with [`Clock::advance`].
    #[cfg(test)]
    pub(crate) fn manual(start_ms: i64) -> Self {
        Clock {
            manual: Some(Arc::new(AtomicI64::new(start_ms))),
        }
    }

    /// Now, in Unix milliseconds.
    pub(crate) fn now_ms(&self) -> i64 {
        match &self.manual {
            Some(t) => t.load(Ordering::Acquire),
            None => system_now_ms(),
        }
    }

    /// Moves a manual clock forward (no effect on the system clock).
    #[cfg(test)]
    pub(crate) fn advance(&self, ms: i64) {
        if let Some(t) = &self.manual {
            t.fetch_add(ms, Ordering::AcqRel);
        }
    }
}

/// The system's time in Unix milliseconds (0 before 1970, which no real clock reads).
pub(crate) fn system_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = Clock::manual(1_000);
        let seen_by_a_task = c.clone();
        assert_eq!(c.now_ms(), 1_000);
        c.advance(250);
        assert_eq!(seen_by_a_task.now_ms(), 1_250);
        let sys = Clock::system().now_ms();
        assert!(sys > 1_700_000_000_000, "{sys}");
    }
}

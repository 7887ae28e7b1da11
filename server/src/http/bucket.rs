//! A token bucket, for the bounds on requests and bytes a second (previews, agents' tool calls).

use std::sync::Mutex;
use std::time::Duration;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A token bucket: `rate` tokens a second, holding at most `burst`.
pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    /// Tokens (negative: owed by those already let through) and when they were counted.
    level: Mutex<(f64, tokio::time::Instant)>,
}

impl Bucket {
    pub(crate) fn new(rate: f64, burst: f64) -> Bucket {
        Bucket {
            rate: rate.max(1.0),
            burst: burst.max(1.0),
            level: Mutex::new((burst.max(1.0), tokio::time::Instant::now())),
        }
    }

    fn refilled(&self) -> std::sync::MutexGuard<'_, (f64, tokio::time::Instant)> {
        let mut l = lock(&self.level);
        let now = tokio::time::Instant::now();
        l.0 = (l.0 + now.duration_since(l.1).as_secs_f64() * self.rate).min(self.burst);
        l.1 = now;
        l
    }

    /// Takes one token if there is one, else says how long until there is.
    pub(crate) fn try_take(&self) -> Result<(), Duration> {
        let mut l = self.refilled();
        if l.0 >= 1.0 {
            l.0 -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - l.0) / self.rate))
        }
    }

    /// Takes `n` tokens, going into debt: how long the taker waits before using them (so
    /// concurrent takers share the rate in the order they came).
    pub(crate) fn reserve(&self, n: usize) -> Duration {
        let mut l = self.refilled();
        l.0 -= n as f64;
        if l.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-l.0 / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Bucket;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_bucket_lets_a_burst_through_then_its_rate() {
        let b = Bucket::new(2.0, 4.0);
        for _ in 0..4 {
            assert!(b.try_take().is_ok());
        }
        assert_eq!(b.try_take(), Err(Duration::from_millis(500)));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(b.try_take().is_ok());
        // Reserving goes into debt: each taker waits its share, in the order they came.
        assert_eq!(b.reserve(4), Duration::from_secs(2));
        assert_eq!(b.reserve(2), Duration::from_secs(3));
    }
}

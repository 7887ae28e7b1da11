//! Login codes: 6 digits from the OS CSPRNG, 10 minute lifetime, single use, one live code per
//! email (a new one voids the old), void after 5 wrong tries, stored only as an argon2id hash.
//! All argon2 work runs on the blocking pool behind a semaphore, so a burst of logins queues
//! there and never stalls WebSocket traffic on the async workers.

use crate::store::LoginCode;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Code lifetime.
pub(crate) const CODE_TTL_MS: i64 = 10 * 60 * 1000;
/// Wrong tries before a code is void.
pub(crate) const MAX_ATTEMPTS: i64 = 5;
/// Per-email issuance caps: (window, codes allowed in it).
pub(crate) const ISSUE_CAPS: [(i64, i64); 2] = [(60_000, 1), (3_600_000, 5)];
/// How long a login waits for a hashing slot before it is refused with 503.
const HASH_QUEUE_WAIT: Duration = Duration::from_secs(10);

/// The argon2id hasher with OWASP's recommended parameters (19 MiB, 2 passes, 1 lane), run on
/// the blocking pool, at most `permits` at a time.
#[derive(Clone)]
pub(crate) struct Hasher {
    slots: Arc<Semaphore>,
    metrics: crate::metrics::Metrics,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum HashError {
    #[error("too many logins at once")]
    Busy,
    #[error("hashing failed")]
    Failed,
}

fn argon2() -> Argon2<'static> {
    // 19456 KiB, t=2, p=1: OWASP Password Storage Cheat Sheet, argon2id.
    let params = Params::new(19_456, 2, 1, None).unwrap_or_default();
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

impl Hasher {
    pub(crate) fn new(permits: usize, metrics: crate::metrics::Metrics) -> Self {
        Hasher {
            slots: Arc::new(Semaphore::new(permits.max(1))),
            metrics,
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HashError> {
        let permit = tokio::time::timeout(HASH_QUEUE_WAIT, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| HashError::Busy)?
            .map_err(|_| HashError::Busy)?;
        self.metrics.argon2_operations.inc();
        let out = tokio::task::spawn_blocking(move || {
            let out = work();
            drop(permit);
            out
        })
        .await
        .map_err(|_| HashError::Failed)?;
        Ok(out)
    }

    pub(crate) async fn hash(&self, code: String) -> Result<String, HashError> {
        self.run(move || {
            let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
            argon2()
                .hash_password(code.as_bytes(), &salt)
                .map(|h| h.to_string())
                .map_err(|_| HashError::Failed)
        })
        .await?
    }

    /// Constant-time verification (the comparison inside `password-hash` is constant time).
    pub(crate) async fn verify(&self, code: String, hash: String) -> Result<bool, HashError> {
        self.run(move || match PasswordHash::new(&hash) {
            Ok(parsed) => argon2().verify_password(code.as_bytes(), &parsed).is_ok(),
            Err(_) => false,
        })
        .await
    }
}

/// A fresh 6-digit code from the OS CSPRNG.
pub(crate) fn new_code() -> String {
    let n: u32 = rand::rngs::OsRng.gen_range(0..1_000_000);
    format!("{n:06}")
}

/// What a verification attempt may do with the stored code, decided before any hashing.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// No usable code: answer 401 (after the same hashing work as a real check).
    Refuse,
    /// Check the submitted code against the hash.
    Check,
}

/// Sans-IO: may this stored code still be tried at `now`?
pub(crate) fn gate(code: Option<&LoginCode>, now: i64) -> Gate {
    match code {
        Some(c) if c.expires_at > now && c.attempts < MAX_ATTEMPTS => Gate::Check,
        _ => Gate::Refuse,
    }
}

/// Sans-IO: how many milliseconds until another code may be issued for this email, given the
/// issuance times on record (0: now).
pub(crate) fn issue_wait_ms(recent: &[i64], now: i64) -> i64 {
    ISSUE_CAPS
        .iter()
        .map(|(window, allowed)| {
            let mut inside: Vec<i64> = recent
                .iter()
                .copied()
                .filter(|&at| at > now - window)
                .collect();
            let over = inside.len() as i64 - allowed;
            if over < 0 {
                return 0;
            }
            // The oldest must leave the window until fewer than `allowed` remain in it.
            inside.sort_unstable();
            inside[over as usize] + window - now
        })
        .max()
        .unwrap_or(0)
        .max(0)
}

/// A well-formed argon2id hash of nothing, verified when there is no code to check, so a
/// refusal costs the same as a real check.
static DUMMY_HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub(crate) fn dummy_hash() -> String {
    DUMMY_HASH
        .get_or_init(|| {
            let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
            argon2()
                .hash_password(b"no code", &salt)
                .map(|h| h.to_string())
                .unwrap_or_default()
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(expires_at: i64, attempts: i64) -> LoginCode {
        LoginCode {
            code_hash: String::new(),
            expires_at,
            attempts,
        }
    }

    #[test]
    fn codes_expire_and_lock_under_a_controlled_clock() {
        let now = 1_000_000;
        assert_eq!(gate(Some(&code(now + 1, 0)), now), Gate::Check);
        assert_eq!(
            gate(Some(&code(now, 0)), now),
            Gate::Refuse,
            "expired at its deadline"
        );
        assert_eq!(gate(Some(&code(now + CODE_TTL_MS, 4)), now), Gate::Check);
        assert_eq!(
            gate(Some(&code(now + CODE_TTL_MS, 5)), now),
            Gate::Refuse,
            "void after 5"
        );
        assert_eq!(gate(None, now), Gate::Refuse);
    }

    fn may_issue(recent: &[i64], now: i64) -> bool {
        issue_wait_ms(recent, now) == 0
    }

    #[test]
    fn issuance_caps() {
        let now = 10 * 3_600_000;
        assert!(may_issue(&[], now));
        assert!(!may_issue(&[now - 30_000], now), "one per minute");
        assert!(may_issue(&[now - 61_000], now));
        let five: Vec<i64> = (1..=5).map(|i| now - i * 600_000 + 1).collect();
        assert!(!may_issue(&five, now), "five per hour");
        let old: Vec<i64> = (1..=5).map(|i| now - 3_600_000 - i).collect();
        assert!(may_issue(&old, now));
        // How long to wait: the minute since the last code, or the hour since the oldest of five.
        assert_eq!(issue_wait_ms(&[now - 30_000], now), 30_000);
        assert_eq!(issue_wait_ms(&[now - 60_000], now), 0);
        // The oldest of the five (50 minutes ago, less 1 ms) leaves the hour in 10 minutes and 1 ms.
        assert_eq!(issue_wait_ms(&five, now), 600_001);
        assert_eq!(issue_wait_ms(&old, now), 0);
        for (recent, at) in [(vec![now - 30_000], now), (five.clone(), now)] {
            let wait = issue_wait_ms(&recent, at);
            assert!(!may_issue(&recent, at + wait - 1) && may_issue(&recent, at + wait));
        }
    }

    #[test]
    fn codes_are_six_digits() {
        for _ in 0..1000 {
            let c = new_code();
            assert_eq!(c.len(), 6);
            assert!(c.bytes().all(|b| b.is_ascii_digit()));
        }
    }

    #[tokio::test]
    async fn hash_round_trip() {
        let h = Hasher::new(1, crate::metrics::Metrics::new());
        let hash = h.hash("123456".into()).await.unwrap();
        assert!(hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"));
        assert!(!hash.contains("123456"));
        assert!(h.verify("123456".into(), hash.clone()).await.unwrap());
        assert!(!h.verify("123457".into(), hash).await.unwrap());
    }
}

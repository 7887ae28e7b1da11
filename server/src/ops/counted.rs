//! What this server holds open now, counted per key: a key is listed while at least one of its
//! guards lives. Who has a room open (moderation), and the sessions of open sockets (the
//! events' catch-up), are each one of these.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Open guards per key.
pub(crate) struct Counted<K> {
    inner: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K> Clone for Counted<K> {
    fn clone(&self) -> Self {
        Counted {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Default for Counted<K> {
    fn default() -> Self {
        Counted {
            inner: Arc::default(),
        }
    }
}

/// One holder of a key; the key goes once its last holder is dropped.
pub(crate) struct Held<K: Clone + Eq + Hash> {
    counts: Counted<K>,
    key: K,
}

impl<K: Clone + Eq + Hash> Counted<K> {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, usize>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `key` until the guard is dropped.
    pub(crate) fn hold(&self, key: K) -> Held<K> {
        *self.map().entry(key.clone()).or_default() += 1;
        Held {
            counts: self.clone(),
            key,
        }
    }

    /// Every key held now.
    pub(crate) fn keys(&self) -> Vec<K> {
        self.map().keys().cloned().collect()
    }
}

impl<K: Clone + Eq + Hash> Drop for Held<K> {
    fn drop(&mut self) {
        let mut map = self.counts.map();
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_stays_while_any_holder_does() {
        let s = Counted::default();
        let a = s.hold("h".to_owned());
        let b = s.hold("h".to_owned());
        assert_eq!(s.keys(), vec!["h".to_owned()]);
        drop(a);
        assert_eq!(s.keys(), vec!["h".to_owned()]);
        drop(b);
        assert!(s.keys().is_empty());
    }
}

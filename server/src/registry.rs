//! Tasks keyed by id, each reached through its bounded command channel: the room tasks and the
//! sandbox supervisors. A task is started on first use and unregisters itself when it ends; a
//! generation number keeps a task that is ending from unregistering its successor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::mpsc;

pub(crate) struct Registry<C> {
    map: Mutex<HashMap<String, Entry<C>>>,
    generation: AtomicU64,
}

struct Entry<C> {
    tx: mpsc::Sender<C>,
    generation: u64,
}

impl<C> Default for Registry<C> {
    fn default() -> Self {
        Registry {
            map: Mutex::default(),
            generation: AtomicU64::new(1),
        }
    }
}

impl<C> Registry<C> {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Entry<C>>> {
        // Only touched in short critical sections that cannot panic half-way.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The channel of `id`'s task. When none runs, a channel of `queue` commands is registered
    /// and `start` gets both its ends and the generation (after the registry's lock is let go).
    pub(crate) fn get_or_start(
        &self,
        id: &str,
        queue: usize,
        start: impl FnOnce(&mpsc::Sender<C>, mpsc::Receiver<C>, u64),
    ) -> mpsc::Sender<C> {
        let mut map = self.map();
        if let Some(entry) = map.get(id) {
            if !entry.tx.is_closed() {
                return entry.tx.clone();
            }
        }
        let (tx, rx) = mpsc::channel(queue);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        map.insert(
            id.to_owned(),
            Entry {
                tx: tx.clone(),
                generation,
            },
        );
        drop(map);
        start(&tx, rx, generation);
        tx
    }

    /// The channel of `id`'s task if one is registered.
    pub(crate) fn get(&self, id: &str) -> Option<mpsc::Sender<C>> {
        self.map().get(id).map(|e| e.tx.clone())
    }

    /// Every registered task's channel.
    pub(crate) fn all(&self) -> Vec<mpsc::Sender<C>> {
        self.map().values().map(|e| e.tx.clone()).collect()
    }

    /// Unregisters the task of `generation` if no command waits in `rx`, checked under the
    /// registry's lock so nobody can pick up its channel between the check and the removal.
    /// Returns whether the task may end.
    pub(crate) fn release(&self, id: &str, generation: u64, rx: &mpsc::Receiver<C>) -> bool {
        let mut map = self.map();
        if !rx.is_empty() {
            return false;
        }
        if map.get(id).is_some_and(|e| e.generation == generation) {
            map.remove(id);
        }
        true
    }

    /// Unregisters the task of `generation` (it ended or failed).
    pub(crate) fn forget(&self, id: &str, generation: u64) {
        let mut map = self.map();
        if map.get(id).is_some_and(|e| e.generation == generation) {
            map.remove(id);
        }
    }
}

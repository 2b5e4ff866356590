//! Maps that can be rolled back to the end of an earlier step.
//!
//! The reference model changes its durable state step by step, like the directory. A crash
//! keeps only the steps whose records reached the disk, so the model must be able to undo the
//! others: every change records the old value under the step that made it; syncing forgets the
//! undo entries of durable steps. A driver whose every step is durable at once (the testkit's
//! in-memory directory) forgets each step as soon as it ends.

use std::collections::{BTreeMap, VecDeque};

/// A `BTreeMap` with per-step undo.
#[derive(Clone, Debug)]
pub struct JMap<K: Ord + Clone, V: Clone> {
    map: BTreeMap<K, V>,
    undo: VecDeque<(u64, K, Option<V>)>,
    writes: u64,
}

impl<K: Ord + Clone, V: Clone> Default for JMap<K, V> {
    fn default() -> Self {
        JMap {
            map: BTreeMap::new(),
            undo: VecDeque::new(),
            writes: 0,
        }
    }
}

impl<K: Ord + Clone, V: Clone> JMap<K, V> {
    /// Inserts under `step`.
    pub fn insert(&mut self, step: u64, key: K, value: V) {
        let old = self.map.insert(key.clone(), value);
        self.undo.push_back((step, key, old));
        self.writes += 1;
    }

    /// How many changes were ever made (a cheap "did anything change" probe).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Removes under `step`.
    pub fn remove(&mut self, step: u64, key: &K) -> Option<V> {
        let old = self.map.remove(key);
        if old.is_some() {
            self.undo.push_back((step, key.clone(), old.clone()));
            self.writes += 1;
        }
        old
    }

    /// The value at `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.get(key)
    }

    /// How many keys are present.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    /// The underlying map.
    pub fn map(&self) -> &BTreeMap<K, V> {
        &self.map
    }

    /// Undoes every change made after `step`.
    pub fn rollback_after(&mut self, step: u64) {
        while self.undo.back().is_some_and(|(s, _, _)| *s > step) {
            let (_, key, old) = self.undo.pop_back().expect("checked");
            match old {
                Some(value) => {
                    self.map.insert(key, value);
                }
                None => {
                    self.map.remove(&key);
                }
            }
        }
    }

    /// Forgets the undo entries of steps up to `step` (they are durable).
    pub fn forget_through(&mut self, step: u64) {
        while self.undo.front().is_some_and(|(s, _, _)| *s <= step) {
            self.undo.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollback_restores_the_state_at_the_end_of_a_step() {
        let mut m = JMap::default();
        m.insert(1, "a", 1);
        m.insert(2, "a", 2);
        m.insert(2, "b", 3);
        m.remove(3, &"a");
        m.rollback_after(1);
        assert_eq!(m.map().iter().collect::<Vec<_>>(), vec![(&"a", &1)]);
        m.forget_through(1);
        m.rollback_after(0);
        assert_eq!(m.get(&"a"), Some(&1), "durable steps are not undone");
    }
}

//! The engine's view of a replica's log ([`raft::Storage`]): the entries since the last
//! compaction, the snapshot that replaced the ones before, and the hard state. The replica
//! writes the same changes to this store as its driver writes to the disk (see the crate's
//! documentation), so the engine reads back what the disk will hold.
//!
//! Written for this crate rather than the engine's `MemStorage`: that one loses the term of
//! the entry before the first it keeps when it compacts (the engine needs it to match a
//! follower's log), and its snapshot carries no data.
//!
//! ```text
//! start.0          start.0 + 1 ..= last
//!  | the entry before the first one kept: its term is known, its data is not
//!  |                 entries
//! snapshot.index >= start.0 (the snapshot covers every entry compacted away)
//! ```

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

/// What the engine reads.
#[derive(Default)]
pub(crate) struct Store {
    hard_state: HardState,
    conf_state: ConfState,
    /// The latest snapshot (its metadata index 0: none yet).
    snapshot: Snapshot,
    /// The index and term of the entry before `entries[0]`.
    start: (u64, u64),
    entries: Vec<Entry>,
}

impl Store {
    /// A store holding `snapshot` (if any), then `entries` from `start.0 + 1`.
    pub(crate) fn new(
        conf_state: ConfState,
        hard_state: HardState,
        snapshot: Option<Snapshot>,
        start: (u64, u64),
        entries: Vec<Entry>,
    ) -> Store {
        Store {
            hard_state,
            conf_state,
            snapshot: snapshot.unwrap_or_default(),
            start,
            entries,
        }
    }

    pub(crate) fn last(&self) -> u64 {
        self.start.0 + self.entries.len() as u64
    }

    /// The latest snapshot's index (0: none).
    pub(crate) fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    /// The round's entries: each replaces every entry from its index on.
    ///
    /// # Panics
    ///
    /// If the first one does not follow the kept log: the engine never hands out such a round.
    pub(crate) fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        assert!(
            first.index > self.start.0 && first.index <= self.last() + 1,
            "entry {} does not follow the log ({}..={})",
            first.index,
            self.start.0 + 1,
            self.last()
        );
        self.entries
            .truncate(usize::try_from(first.index - self.start.0 - 1).unwrap_or(usize::MAX));
        self.entries.extend_from_slice(entries);
    }

    pub(crate) fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// A snapshot installed from the leader: it replaces the log.
    pub(crate) fn install(&mut self, snapshot: Snapshot) {
        let meta = snapshot.get_metadata();
        self.start = (meta.index, meta.term);
        self.conf_state = meta.get_conf_state().clone();
        if self.hard_state.commit < meta.index {
            self.hard_state.commit = meta.index;
        }
        self.entries.clear();
        self.snapshot = snapshot;
    }

    /// A snapshot of this replica's own applied state: it replaces the one before, and the
    /// entries up to `keep_from - 1` go (`keep_from - 1` at most the snapshot's index).
    pub(crate) fn compact(&mut self, snapshot: Snapshot, keep_from: u64) {
        let index = snapshot.get_metadata().index;
        debug_assert!(keep_from <= index + 1 && index <= self.last());
        if keep_from > self.start.0 + 1 {
            let drop = usize::try_from(keep_from - 1 - self.start.0).unwrap_or(usize::MAX);
            let before = &self.entries[drop - 1];
            self.start = (before.index, before.term);
            self.entries.drain(..drop);
        }
        self.snapshot = snapshot;
    }

    /// The term of the entry at `index`, if this store knows it.
    pub(crate) fn term_at(&self, index: u64) -> Option<u64> {
        if index == self.start.0 {
            return Some(self.start.1);
        }
        if index < self.start.0 || index > self.last() {
            return None;
        }
        Some(self.entries[usize::try_from(index - self.start.0 - 1).ok()?].term)
    }
}

impl raft::Storage for Store {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState {
            hard_state: self.hard_state.clone(),
            conf_state: self.conf_state.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.start.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = usize::try_from(low - self.start.0 - 1).unwrap_or(usize::MAX);
        let to = usize::try_from(high - self.start.0 - 1).unwrap_or(usize::MAX);
        let mut entries = self.entries[from..to].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.start.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_at(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.start.0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let index = self.snapshot_index();
        if index == 0 || index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

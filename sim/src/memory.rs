//! The simulated arena memory: the bytes a host machine and its workers share, and the one
//! rule the real adapter enforces with read-only arenas and per-write staging buffers — a
//! child changes only the bytes of its own write, and only until the host froze it at the
//! seal (`ArenaMemory::freeze`). Workers ask [`SimArena::child_may_write`] before a write a real
//! kernel might refuse; a hostile worker that may still write its published blob has caught a
//! host that published without freezing.

use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};

use dataplane_core::arena::{ArenaMemory, Lease, MemoryFault};

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct SimArena {
    bytes: Vec<u8>,
    /// Offsets of the write leases the host froze (until it frees them).
    frozen: BTreeSet<u64>,
}

impl SimArena {
    /// A zeroed arena of `size` bytes.
    pub fn new(size: usize) -> SimArena {
        SimArena {
            bytes: vec![0; size],
            frozen: BTreeSet::new(),
        }
    }

    /// Whether the child that was granted the write lease at `offset` can still change it:
    /// not once the host froze it.
    pub fn child_may_write(&self, offset: u64) -> bool {
        !self.frozen.contains(&offset)
    }
}

impl Deref for SimArena {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl DerefMut for SimArena {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl ArenaMemory for SimArena {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// Returns no digest: the host machine hashes the frozen payload itself (the real
    /// adapter hashes while it copies; the bytes hashed are the same).
    fn freeze(&mut self, lease: &Lease, _hash: bool) -> Result<Option<[u8; 32]>, MemoryFault> {
        self.frozen.insert(lease.offset);
        Ok(None)
    }

    fn reclaim(&mut self, lease: &Lease) {
        self.frozen.remove(&lease.offset);
    }
}

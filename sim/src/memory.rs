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
#[derive(Debug, Default)]
pub struct SimArena {
    /// Anonymous memory from the kernel, as the real adapter maps it: zero pages on first
    /// touch, so a restart's new arena costs only the pages its run writes. (A zeroed `Vec`
    /// cleared the whole arena at every boot: 4 % of the swarm's time, issue 18.) `None` for
    /// an empty arena, which cannot be mapped.
    bytes: Option<memmap2::MmapMut>,
    /// Offsets of the write leases the host froze (until it frees them).
    frozen: BTreeSet<u64>,
}

impl SimArena {
    /// A zeroed arena of `size` bytes.
    ///
    /// # Panics
    ///
    /// If the kernel refuses the mapping (out of address space): the simulator cannot go on.
    pub fn new(size: usize) -> SimArena {
        let bytes = (size > 0).then(|| {
            memmap2::MmapMut::map_anon(size)
                .unwrap_or_else(|e| panic!("mapping a {size}-byte simulated arena: {e}"))
        });
        SimArena {
            bytes,
            frozen: BTreeSet::new(),
        }
    }

    /// Whether the child that was granted the write lease at `offset` can still change it:
    /// not once the host froze it.
    pub fn child_may_write(&self, offset: u64) -> bool {
        !self.frozen.contains(&offset)
    }
}

impl Clone for SimArena {
    fn clone(&self) -> SimArena {
        let mut copy = SimArena::new(self.len());
        copy.copy_from_slice(self);
        copy.frozen.clone_from(&self.frozen);
        copy
    }
}

impl Deref for SimArena {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes.as_deref().unwrap_or_default()
    }
}

impl DerefMut for SimArena {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes.as_deref_mut().unwrap_or_default()
    }
}

impl ArenaMemory for SimArena {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
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

//! The ring-lease allocator over an arena `[0, size)` (SPEC §8.1, with DESIGN.md §5 Q25).
//!
//! Pure bookkeeping: the arena's memory is the caller's; this module only decides which byte
//! ranges are leased. Every lease holds a [`BLOB_HEADER_BYTES`]-byte blob header at its start
//! and its payload right after it (SPEC §8.2), and occupies [`Lease::footprint`] bytes: header
//! plus payload rounded up to [`BLOB_ALIGNMENT`]. Every lease start, lease footprint and free
//! range boundary is a multiple of [`BLOB_ALIGNMENT`], so first-fit never has to pad.
//!
//! * **First fit**: a request is placed at the start of the lowest free range that holds it.
//! * **FIFO, head of line**: a request that does not fit, or that arrives while others wait, is
//!   queued; queued requests are granted strictly in arrival order, and only while the head of
//!   the queue fits (a small request never overtakes a large one ahead of it).
//! * **Q25**: [`Arena::cancel`] removes a queued request *at once*; a cancelled request never
//!   stays in the queue to hold back the requests behind it or to make a later release report
//!   extra events.
//! * **Bounds**: at most [`ARENA_LEASES_MAX`] live leases and [`ARENA_QUEUE_MAX`] waiting
//!   requests; a request larger than the whole arena is refused at once ([`ArenaError::CannotFit`]).
//! * Ring ids and ticket ids come from counters starting at 1 and are never reused.

use core::fmt;
use std::collections::{BTreeMap, VecDeque};

use crate::host::{FileFacts, FileFault, FileTable};
use crate::wire::FileRef;
use serde::{Deserialize, Serialize};

/// Bytes of the blob header at the start of every lease (SPEC §8.2).
pub const BLOB_HEADER_BYTES: u64 = 128;
/// Alignment of every lease start and footprint, in bytes (SPEC §8.2's blob alignment request).
pub const BLOB_ALIGNMENT: u64 = 64;
/// Most live leases in one arena; further allocations get [`ArenaError::TooManyLeases`].
pub const ARENA_LEASES_MAX: usize = 1 << 18;
/// Most requests waiting in one arena's queue; further ones get [`ArenaError::QueueFull`].
pub const ARENA_QUEUE_MAX: usize = 1024;

/// A lease's ring id: assigned from a counter starting at 1, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RingId(pub u64);

/// A queued allocation request: assigned from a counter starting at 1, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TicketId(pub u64);

/// A live lease: header at `offset`, payload of `length` bytes at `offset + BLOB_HEADER_BYTES`;
/// it occupies `footprint()` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The lease's ring id.
    pub ring: RingId,
    /// Offset of the blob header in the arena (a multiple of [`BLOB_ALIGNMENT`]).
    pub offset: u64,
    /// Payload length in bytes.
    pub length: u64,
}

impl Lease {
    /// Offset of the payload: right after the header.
    ///
    /// Cannot overflow for a lease the arena granted (the whole footprint lies in the arena).
    pub fn payload_offset(&self) -> u64 {
        self.offset.saturating_add(BLOB_HEADER_BYTES)
    }

    /// Bytes the lease occupies: `align_up(BLOB_HEADER_BYTES + length, BLOB_ALIGNMENT)`.
    ///
    /// Cannot overflow for a lease the arena granted (its footprint was checked when it was
    /// granted); saturates otherwise.
    pub fn footprint(&self) -> u64 {
        footprint(self.length).unwrap_or(u64::MAX)
    }
}

/// The outcome of a successful [`Arena::allocate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Granted at once.
    Leased(Lease),
    /// Waiting in the FIFO queue; it is granted by a later [`Arena::release`] or
    /// [`Arena::grant_waiting`], or withdrawn with [`Arena::cancel`].
    Queued(TicketId),
}

/// Why the arena refused a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArenaError {
    /// The request's footprint is larger than the whole arena: it could never be granted.
    CannotFit {
        /// The requested payload length.
        length: u64,
        /// The arena size.
        size: u64,
    },
    /// [`ARENA_LEASES_MAX`] leases are live.
    TooManyLeases,
    /// [`ARENA_QUEUE_MAX`] requests are waiting.
    QueueFull,
    /// No live lease has this ring id.
    UnknownRing(RingId),
    /// Length arithmetic overflowed (or a ring/ticket counter is exhausted).
    Overflow,
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::CannotFit { length, size } => write!(
                f,
                "a blob of {length} bytes cannot fit in an arena of {size} bytes"
            ),
            ArenaError::TooManyLeases => write!(f, "more than {ARENA_LEASES_MAX} live leases"),
            ArenaError::QueueFull => write!(f, "more than {ARENA_QUEUE_MAX} queued requests"),
            ArenaError::UnknownRing(ring) => write!(f, "unknown ring id {}", ring.0),
            ArenaError::Overflow => f.write_str("arena length arithmetic overflow"),
        }
    }
}

impl std::error::Error for ArenaError {}

/// The arena's memory, as the host machine reads and writes it. The machine passes it to every
/// input and tells it two things about write leases, so that the memory can keep its promise
/// that **a child changes only the bytes of its own write, and only until it seals it**:
///
/// * [`freeze`](Self::freeze) when the child seals a write, before anything looks at its
///   bytes: from then on nobody but the host changes them (the host never does);
/// * [`reclaim`](Self::reclaim) when a lease is free again.
///
/// A plain `Vec<u8>` (the simulator's and the tests' arenas) keeps nothing: its freeze and
/// reclaim do nothing. The real adapter hands each child a writable buffer of its own for each
/// write and the arena only read-only; its freeze copies the child's buffer into the lease.
///
/// The same object is the host's window on the node's **files** (file blobs, issue 17): what a
/// file is, its bytes, and the durable table of the file blobs. These calls are synchronous
/// and bounded (one stat, one read of at most a chunk, one small table write). A memory
/// that serves no files keeps the defaults, which refuse.
pub trait ArenaMemory {
    /// The whole arena, to read.
    fn bytes(&self) -> &[u8];
    /// The whole arena, to write (the host writes headers, chunks and copies into its leases).
    fn bytes_mut(&mut self) -> &mut [u8];
    /// The child's write in `lease` is sealed: make its bytes final and unchangeable by the
    /// child. Called once per sealed write, before the host validates it. An error fails the
    /// write.
    ///
    /// With `hash` (the write asked for a BLAKE3 digest) the memory may return the BLAKE3
    /// digest of the payload it made final — of the bytes now in the lease, computed as it
    /// copied them, so that they pass through the cache once. `None` leaves the hashing to
    /// the host machine, which then reads the payload once more.
    fn freeze(&mut self, lease: &Lease, hash: bool) -> Result<Option<[u8; 32]>, MemoryFault>;
    /// `lease` was freed (whatever it held).
    fn reclaim(&mut self, lease: &Lease);
    /// Whether a child's write goes to a buffer of its own that [`freeze`](Self::freeze)
    /// copies over the whole lease (header and payload): then the host does not zero a
    /// writable lease's payload in the arena at the grant (nobody writes it in place). The
    /// default, `false`: children write the arena in place, and a fresh write lease is zeroed.
    fn stages_writes(&self) -> bool {
        false
    }
    /// What `file` is now: its length and identity stamp, or why it may not be published.
    fn file_facts(&mut self, file: &FileRef) -> Result<FileFacts, FileFault> {
        let _ = file;
        Err(FileFault::Unsupported)
    }
    /// `len` bytes of `file` from `offset`, read only if the file still has the stamp of
    /// `facts` (before and after the read); [`FileFault::Changed`] otherwise.
    fn read_file(
        &mut self,
        file: &FileRef,
        facts: &FileFacts,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, FileFault> {
        let _ = (file, facts, offset, len);
        Err(FileFault::Unsupported)
    }
    /// Makes `table` the node's durable table of file blobs (replacing the last one) before
    /// returning; an error leaves the last table that was saved.
    fn save_files(&mut self, table: &FileTable) -> Result<(), FileFault> {
        let _ = table;
        Err(FileFault::Unsupported)
    }
}

/// Why the arena's memory could not do what the host asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryFault {
    /// The memory could not make the write final (the reason is for logs).
    Freeze(String),
}

impl fmt::Display for MemoryFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryFault::Freeze(reason) => write!(f, "the write could not be made final: {reason}"),
        }
    }
}

impl ArenaMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }

    fn freeze(&mut self, _lease: &Lease, _hash: bool) -> Result<Option<[u8; 32]>, MemoryFault> {
        Ok(None)
    }

    fn reclaim(&mut self, _lease: &Lease) {}
}

/// The ring-lease allocator. See the module documentation.
#[derive(Clone, Debug)]
pub struct Arena {
    /// Arena size, a multiple of [`BLOB_ALIGNMENT`].
    size: u64,
    /// Free ranges, start -> end (exclusive), coalesced: no two touch.
    free: BTreeMap<u64, u64>,
    /// Sum of the free ranges' lengths.
    free_bytes: u64,
    /// Live leases by ring id.
    leases: BTreeMap<RingId, Lease>,
    /// Waiting requests in arrival order: (ticket, payload length).
    queue: VecDeque<(TicketId, u64)>,
    /// The next ring id to hand out.
    next_ring: u64,
    /// The next ticket id to hand out.
    next_ticket: u64,
    /// Allocations refused so far (too large, too many leases, a full queue).
    refused: u64,
}

/// A consistent sample of an arena (issue 17): what an operator graphs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaStats {
    /// The arena's size in bytes.
    pub size: u64,
    /// Bytes in live leases (headers and alignment included).
    pub used_bytes: u64,
    /// Free bytes in total (not necessarily contiguous).
    pub free_bytes: u64,
    /// The largest free range: the largest footprint that could be granted now.
    pub largest_free: u64,
    /// Live leases.
    pub leases: u64,
    /// Requests waiting in the queue.
    pub queued: u64,
    /// Allocations refused since the arena was made.
    pub refused: u64,
}

/// `align_up(BLOB_HEADER_BYTES + length, BLOB_ALIGNMENT)`, or `None` on overflow.
fn footprint(length: u64) -> Option<u64> {
    let raw = length.checked_add(BLOB_HEADER_BYTES)?;
    let rounded = raw.checked_add(BLOB_ALIGNMENT - 1)?;
    Some(rounded - rounded % BLOB_ALIGNMENT)
}

impl Arena {
    /// An empty arena of `size` bytes, rounded down to a multiple of [`BLOB_ALIGNMENT`].
    pub fn new(size: u64) -> Arena {
        let size = size - size % BLOB_ALIGNMENT;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Arena {
            size,
            free,
            free_bytes: size,
            leases: BTreeMap::new(),
            queue: VecDeque::new(),
            next_ring: 1,
            next_ticket: 1,
            refused: 0,
        }
    }

    /// A consistent sample of the arena's state.
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            size: self.size,
            used_bytes: self.size - self.free_bytes,
            free_bytes: self.free_bytes,
            largest_free: self.largest_free(),
            leases: self.leases.len() as u64,
            queued: self.queue.len() as u64,
            refused: self.refused,
        }
    }

    /// The arena size in bytes (a multiple of [`BLOB_ALIGNMENT`]).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// First-fit. If nothing is queued and it fits: `Leased`. Otherwise (it does not fit now,
    /// or others wait: FIFO, head-of-line) `Queued`.
    ///
    /// Errors, checked in this order (a refused request changes nothing):
    /// * [`ArenaError::Overflow`]: the footprint of `length` overflows a `u64`;
    /// * [`ArenaError::CannotFit`]: the footprint is larger than the whole arena;
    /// * [`ArenaError::TooManyLeases`]: [`ARENA_LEASES_MAX`] leases are live. A full lease
    ///   table is refused, never waited for (whether or not others are queued);
    /// * [`ArenaError::QueueFull`]: the request would have to wait and [`ARENA_QUEUE_MAX`]
    ///   requests already do.
    pub fn allocate(&mut self, length: u64) -> Result<Allocation, ArenaError> {
        let outcome = self.allocate_inner(length);
        if outcome.is_err() {
            self.refused += 1;
        }
        outcome
    }

    fn allocate_inner(&mut self, length: u64) -> Result<Allocation, ArenaError> {
        let needed = footprint(length).ok_or(ArenaError::Overflow)?;
        if needed > self.size {
            return Err(ArenaError::CannotFit {
                length,
                size: self.size,
            });
        }
        if self.leases.len() >= ARENA_LEASES_MAX {
            return Err(ArenaError::TooManyLeases);
        }
        if self.queue.is_empty()
            && let Some(start) = self.first_fit(needed)
        {
            let ring = self.next_ring_id().ok_or(ArenaError::Overflow)?;
            return Ok(Allocation::Leased(self.take(ring, start, length, needed)));
        }
        if self.queue.len() >= ARENA_QUEUE_MAX {
            return Err(ArenaError::QueueFull);
        }
        let ticket = self.next_ticket;
        self.next_ticket = ticket.checked_add(1).ok_or(ArenaError::Overflow)?;
        self.queue.push_back((TicketId(ticket), length));
        Ok(Allocation::Queued(TicketId(ticket)))
    }

    /// Removes a queued request at once (Q25: a cancelled request never poisons the queue).
    /// Returns whether it was queued.
    ///
    /// Cancel grants nothing: if the cancelled request was at the head of the queue, requests
    /// behind it that now fit keep waiting until the next [`Arena::release`]. A caller that
    /// cancels should therefore call [`Arena::grant_waiting`] right after and deliver its
    /// grants.
    pub fn cancel(&mut self, ticket: TicketId) -> bool {
        match self.queue.iter().position(|(t, _)| *t == ticket) {
            Some(index) => {
                self.queue.remove(index);
                true
            }
            None => false,
        }
    }

    /// Frees a live lease (coalescing free ranges) and grants waiting requests in FIFO order
    /// while the head fits; returns the grants in order. An unknown ring changes nothing.
    pub fn release(&mut self, ring: RingId) -> Result<Vec<(TicketId, Lease)>, ArenaError> {
        let lease = self
            .leases
            .remove(&ring)
            .ok_or(ArenaError::UnknownRing(ring))?;
        self.give_back(lease.offset, lease.offset + lease.footprint());
        Ok(self.grant_waiting())
    }

    /// Grants waiting requests in FIFO order while the head fits (and the lease table has
    /// room); returns the grants in order. Used after [`Arena::cancel`].
    pub fn grant_waiting(&mut self) -> Vec<(TicketId, Lease)> {
        let mut grants = Vec::new();
        while let Some(&(ticket, length)) = self.queue.front() {
            if self.leases.len() >= ARENA_LEASES_MAX {
                break;
            }
            // Footprints were checked when the request was queued.
            let Some(needed) = footprint(length) else {
                break;
            };
            let Some(start) = self.first_fit(needed) else {
                break;
            };
            let Some(ring) = self.next_ring_id() else {
                break;
            };
            self.queue.pop_front();
            grants.push((ticket, self.take(ring, start, length, needed)));
        }
        grants
    }

    /// The live lease with this ring id.
    pub fn lease(&self, ring: RingId) -> Option<&Lease> {
        self.leases.get(&ring)
    }

    /// Every live lease, by ring id.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    /// Number of live leases.
    pub fn live_count(&self) -> usize {
        self.leases.len()
    }

    /// Number of waiting requests.
    pub fn queued_count(&self) -> usize {
        self.queue.len()
    }

    /// Free bytes in total (not necessarily contiguous).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// The longest free range in bytes (0 if nothing is free): the largest footprint that
    /// fits now. Linear in the number of free ranges.
    pub fn largest_free(&self) -> u64 {
        self.free
            .iter()
            .map(|(start, end)| end - start)
            .max()
            .unwrap_or(0)
    }

    /// No two live leases overlap, all lie in `[0, size)`, free ranges and leases tile
    /// `[0, size)` exactly, free ranges are coalesced, counts are within bounds.
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.size.is_multiple_of(BLOB_ALIGNMENT) {
            return Err(format!("size {} is not aligned", self.size));
        }
        if self.leases.len() > ARENA_LEASES_MAX {
            return Err(format!("{} live leases", self.leases.len()));
        }
        if self.queue.len() > ARENA_QUEUE_MAX {
            return Err(format!("{} queued requests", self.queue.len()));
        }
        // The free ranges come sorted by start; the leases (by ring) are sorted by offset, and
        // the two walked together must tile the arena: each piece starts where the previous
        // one ended. One vector of (offset, end, ring), no strings unless something is wrong.
        let mut free_total: u64 = 0;
        let mut previous_end: Option<u64> = None;
        for (&start, &end) in &self.free {
            if start >= end {
                return Err(format!("empty free range [{start}, {end})"));
            }
            if start % BLOB_ALIGNMENT != 0 || end % BLOB_ALIGNMENT != 0 {
                return Err(format!("unaligned free range [{start}, {end})"));
            }
            if previous_end.is_some_and(|p| p >= start) {
                return Err(format!(
                    "free range [{start}, {end}) touches the previous one"
                ));
            }
            previous_end = Some(end);
            free_total += end - start;
        }
        if free_total != self.free_bytes {
            return Err(format!(
                "free byte counter {} but free ranges hold {free_total}",
                self.free_bytes
            ));
        }
        let mut leased: Vec<(u64, u64, u64)> = Vec::with_capacity(self.leases.len());
        for (ring, lease) in &self.leases {
            if *ring != lease.ring {
                return Err(format!("lease {lease:?} filed under ring {}", ring.0));
            }
            if ring.0 == 0 || ring.0 >= self.next_ring {
                return Err(format!("ring id {} was never handed out", ring.0));
            }
            if lease.offset % BLOB_ALIGNMENT != 0 {
                return Err(format!("unaligned lease {lease:?}"));
            }
            let end = footprint(lease.length)
                .and_then(|f| lease.offset.checked_add(f))
                .ok_or_else(|| format!("lease {lease:?} overflows"))?;
            leased.push((lease.offset, end, ring.0));
        }
        leased.sort_unstable();
        let mut free = self.free.iter().map(|(&s, &e)| (s, e)).peekable();
        let mut leases = leased.iter().copied().peekable();
        let mut cursor = 0;
        loop {
            // The next piece in offset order (a free range first on a tie: either way a tie
            // is an overlap, reported below).
            let (start, end, what) = match (free.peek(), leases.peek()) {
                (Some(&(fs, fe)), Some(&(ls, _, _))) if fs <= ls => {
                    free.next();
                    (fs, fe, None)
                }
                (_, Some(&(ls, le, ring))) => {
                    leases.next();
                    (ls, le, Some(ring))
                }
                (Some(&(fs, fe)), None) => {
                    free.next();
                    (fs, fe, None)
                }
                (None, None) => break,
            };
            if start != cursor {
                let what = match what {
                    Some(ring) => format!("lease {ring}"),
                    None => "free range".to_owned(),
                };
                return Err(format!(
                    "{what} [{start}, {end}) starts at {start}, expected {cursor} (gap or overlap)"
                ));
            }
            cursor = end;
        }
        if cursor != self.size {
            return Err(format!("pieces end at {cursor}, arena size {}", self.size));
        }
        let mut previous_ticket = 0;
        for &(ticket, length) in &self.queue {
            if ticket.0 <= previous_ticket || ticket.0 >= self.next_ticket {
                return Err(format!("queue out of order at ticket {}", ticket.0));
            }
            previous_ticket = ticket.0;
            if footprint(length).is_none_or(|f| f > self.size) {
                return Err(format!("queued ticket {} can never fit", ticket.0));
            }
        }
        Ok(())
    }

    /// The start of the lowest free range holding `needed` bytes.
    fn first_fit(&self, needed: u64) -> Option<u64> {
        self.free
            .iter()
            .find(|&(&start, &end)| end - start >= needed)
            .map(|(&start, _)| start)
    }

    /// The next ring id, or `None` once the counter is exhausted.
    fn next_ring_id(&mut self) -> Option<RingId> {
        let ring = self.next_ring;
        self.next_ring = ring.checked_add(1)?;
        Some(RingId(ring))
    }

    /// Leases `[start, start + needed)`, which must be the start of a free range holding it.
    fn take(&mut self, ring: RingId, start: u64, length: u64, needed: u64) -> Lease {
        if let Some(end) = self.free.remove(&start)
            && end - start > needed
        {
            self.free.insert(start + needed, end);
        }
        self.free_bytes -= needed;
        let lease = Lease {
            ring,
            offset: start,
            length,
        };
        self.leases.insert(ring, lease);
        lease
    }

    /// Returns `[start, end)` to the free ranges, merging it with its neighbours.
    fn give_back(&mut self, start: u64, end: u64) {
        self.free_bytes += end - start;
        let mut start = start;
        let mut end = end;
        if let Some((&before_start, &before_end)) = self.free.range(..start).next_back()
            && before_end == start
        {
            self.free.remove(&before_start);
            start = before_start;
        }
        if let Some(after_end) = self.free.remove(&end) {
            end = after_end;
        }
        self.free.insert(start, end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leased(a: Result<Allocation, ArenaError>) -> Lease {
        match a {
            Ok(Allocation::Leased(lease)) => lease,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    fn queued(a: Result<Allocation, ArenaError>) -> TicketId {
        match a {
            Ok(Allocation::Queued(ticket)) => ticket,
            other => panic!("expected a ticket, got {other:?}"),
        }
    }

    fn ok(arena: &Arena) {
        arena.check_invariants().unwrap();
    }

    #[test]
    fn size_is_rounded_down() {
        let arena = Arena::new(1000);
        assert_eq!(arena.size(), 960);
        assert_eq!(arena.free_bytes(), 960);
        ok(&arena);
        let empty = Arena::new(63);
        assert_eq!(empty.size(), 0);
        ok(&empty);
    }

    #[test]
    fn footprint_and_payload_offset() {
        let lease = |length| Lease {
            ring: RingId(1),
            offset: 640,
            length,
        };
        assert_eq!(lease(0).footprint(), 128);
        assert_eq!(lease(1).footprint(), 192);
        assert_eq!(lease(64).footprint(), 192);
        assert_eq!(lease(65).footprint(), 256);
        assert_eq!(lease(0).payload_offset(), 768);
        assert_eq!(lease(u64::MAX).footprint(), u64::MAX);
    }

    #[test]
    fn first_fit_places_at_the_lowest_hole() {
        let mut arena = Arena::new(4096);
        let a = leased(arena.allocate(100)); // 256 bytes
        let b = leased(arena.allocate(0)); // 128 bytes
        let c = leased(arena.allocate(200)); // 384 bytes
        ok(&arena);
        assert_eq!((a.offset, b.offset, c.offset), (0, 256, 384));
        assert_eq!(a.payload_offset(), 128);
        assert_eq!(arena.free_bytes(), 4096 - 768);
        // Free a: a hole of 256 at 0. A 64-byte request fits there first.
        assert!(arena.release(a.ring).unwrap().is_empty());
        ok(&arena);
        let d = leased(arena.allocate(64));
        assert_eq!(d.offset, 0);
        // Too big for the remaining 64-byte hole: goes after c.
        let e = leased(arena.allocate(128));
        assert_eq!(e.offset, 768);
        ok(&arena);
    }

    #[test]
    fn exact_fit_fills_the_arena() {
        let mut arena = Arena::new(1024);
        let a = leased(arena.allocate(1024 - 128));
        assert_eq!((a.offset, a.footprint()), (0, 1024));
        assert_eq!(arena.free_bytes(), 0);
        ok(&arena);
        let t = queued(arena.allocate(0));
        ok(&arena);
        let grants = arena.release(a.ring).unwrap();
        assert_eq!(grants.len(), 1);
        assert_eq!(grants[0].0, t);
        assert_eq!(grants[0].1.offset, 0);
        ok(&arena);
    }

    #[test]
    fn fifo_head_of_line_blocks_smaller_requests() {
        let mut arena = Arena::new(1024);
        let a = leased(arena.allocate(300)); // 448
        let b = leased(arena.allocate(300)); // 448, 128 left
        ok(&arena);
        let big = queued(arena.allocate(500)); // 640: does not fit now
        // A tiny request would fit in the 128 free bytes, but must wait behind `big`.
        let small = queued(arena.allocate(0));
        assert_eq!(arena.queued_count(), 2);
        assert_eq!(arena.free_bytes(), 128);
        assert!(big < small);
        ok(&arena);
        // Freeing b leaves 576 contiguous: big (640) still does not fit, so small waits too.
        assert!(arena.release(b.ring).unwrap().is_empty());
        assert_eq!(arena.queued_count(), 2);
        ok(&arena);
        // Freeing a coalesces everything: big then small are granted, in order.
        let grants = arena.release(a.ring).unwrap();
        assert_eq!(grants.len(), 2);
        assert_eq!(grants[0].0, big);
        assert_eq!(grants[0].1.offset, 0);
        assert_eq!(grants[0].1.length, 500);
        assert_eq!(grants[1].0, small);
        assert_eq!(grants[1].1.offset, 640);
        assert_eq!(arena.queued_count(), 0);
        ok(&arena);
        // With the queue empty, a fitting request is leased at once again.
        leased(arena.allocate(0));
        ok(&arena);
    }

    #[test]
    fn grants_stop_at_the_first_head_that_does_not_fit() {
        let mut arena = Arena::new(1024);
        let a = leased(arena.allocate(1024 - 128));
        let t1 = queued(arena.allocate(0)); // 128
        let t2 = queued(arena.allocate(1024 - 128)); // whole arena
        let t3 = queued(arena.allocate(0)); // would fit, but behind t2
        let grants = arena.release(a.ring).unwrap();
        assert_eq!(grants.iter().map(|g| g.0).collect::<Vec<_>>(), vec![t1]);
        assert_eq!(arena.queued_count(), 2);
        ok(&arena);
        // Releasing t1's lease lets t2 in, and t3 still waits (no room left).
        let grants = arena.release(grants[0].1.ring).unwrap();
        assert_eq!(grants.iter().map(|g| g.0).collect::<Vec<_>>(), vec![t2]);
        let grants = arena.release(grants[0].1.ring).unwrap();
        assert_eq!(grants.iter().map(|g| g.0).collect::<Vec<_>>(), vec![t3]);
        assert_eq!(arena.queued_count(), 0);
        ok(&arena);
    }

    #[test]
    fn cancel_leaves_at_once_then_grant_waiting() {
        let mut arena = Arena::new(1024);
        let a = leased(arena.allocate(300)); // 448
        leased(arena.allocate(300)); // 448, 128 left
        let big = queued(arena.allocate(500));
        let small = queued(arena.allocate(0));
        ok(&arena);
        // Cancelling the blocking head removes it at once...
        assert!(arena.cancel(big));
        assert_eq!(arena.queued_count(), 1);
        ok(&arena);
        // ...but grants nothing by itself: small fits now and is granted by grant_waiting.
        let grants = arena.grant_waiting();
        assert_eq!(grants.len(), 1);
        assert_eq!(grants[0].0, small);
        assert_eq!(grants[0].1.offset, 896);
        assert_eq!(arena.queued_count(), 0);
        ok(&arena);
        // A cancelled ticket is gone for good: cancelling again, or a release, never sees it.
        assert!(!arena.cancel(big));
        assert!(!arena.cancel(TicketId(999)));
        assert!(arena.release(a.ring).unwrap().is_empty());
        // Queue empty again: a fitting request is leased, not queued (no poisoning, Q25).
        leased(arena.allocate(0));
        assert!(arena.grant_waiting().is_empty());
        ok(&arena);
    }

    #[test]
    fn cancel_in_the_middle_keeps_the_order() {
        let mut arena = Arena::new(256);
        let a = leased(arena.allocate(128)); // 256: full
        let t1 = queued(arena.allocate(0));
        let t2 = queued(arena.allocate(0));
        let t3 = queued(arena.allocate(0));
        assert!(arena.cancel(t2));
        ok(&arena);
        let grants = arena.release(a.ring).unwrap();
        assert_eq!(grants.iter().map(|g| g.0).collect::<Vec<_>>(), vec![t1, t3]);
        assert_eq!((grants[0].1.offset, grants[1].1.offset), (0, 128));
        ok(&arena);
    }

    #[test]
    fn release_coalesces_both_sides() {
        let mut arena = Arena::new(64 * 12);
        let a = leased(arena.allocate(0)); // [0,128)
        let b = leased(arena.allocate(0)); // [128,256)
        let c = leased(arena.allocate(0)); // [256,384)
        let d = leased(arena.allocate(0)); // [384,512)
        ok(&arena);
        arena.release(a.ring).unwrap();
        arena.release(c.ring).unwrap();
        ok(&arena);
        assert_eq!(arena.free.len(), 3); // [0,128) [256,384) [512,768)
        arena.release(b.ring).unwrap(); // merges with both neighbours
        ok(&arena);
        assert_eq!(arena.free.len(), 2);
        assert_eq!(arena.free.get(&0), Some(&384));
        arena.release(d.ring).unwrap(); // merges with [0,384) and [512,768)
        ok(&arena);
        assert_eq!(arena.free.len(), 1);
        assert_eq!(arena.free.get(&0), Some(&768));
        assert_eq!(arena.free_bytes(), 768);
        assert_eq!(arena.live_count(), 0);
        // The whole arena is one range again.
        let whole = leased(arena.allocate(768 - 128));
        assert_eq!(whole.offset, 0);
        ok(&arena);
    }

    #[test]
    fn ring_ids_are_never_reused() {
        let mut arena = Arena::new(4096);
        let mut seen = Vec::new();
        for _ in 0..10 {
            let lease = leased(arena.allocate(10));
            assert!(seen.iter().all(|r| *r < lease.ring));
            seen.push(lease.ring);
            arena.release(lease.ring).unwrap();
            ok(&arena);
        }
        assert_eq!(seen.first(), Some(&RingId(1)));
        assert_eq!(seen.last(), Some(&RingId(10)));
        // Tickets too, and queued grants take fresh ring ids.
        let a = leased(arena.allocate(4096 - 128));
        let t = queued(arena.allocate(0));
        assert_eq!(t, TicketId(1));
        assert!(arena.cancel(t));
        let t2 = queued(arena.allocate(0));
        assert_eq!(t2, TicketId(2));
        let grants = arena.release(a.ring).unwrap();
        assert_eq!(grants[0].1.ring, RingId(12));
    }

    #[test]
    fn unknown_ring_is_refused_and_changes_nothing() {
        let mut arena = Arena::new(1024);
        let a = leased(arena.allocate(0));
        assert_eq!(
            arena.release(RingId(7)),
            Err(ArenaError::UnknownRing(RingId(7)))
        );
        arena.release(a.ring).unwrap();
        // A second release of the same ring is unknown: a ring is released at most once.
        assert_eq!(arena.release(a.ring), Err(ArenaError::UnknownRing(a.ring)));
        assert_eq!(arena.free_bytes(), 1024);
        ok(&arena);
        assert_eq!(arena.lease(a.ring), None);
    }

    #[test]
    fn zero_length_payloads() {
        let mut arena = Arena::new(256);
        let a = leased(arena.allocate(0));
        let b = leased(arena.allocate(0));
        assert_eq!((a.offset, b.offset), (0, 128));
        assert_eq!(a.footprint(), 128);
        assert_eq!(arena.free_bytes(), 0);
        assert_eq!(a.payload_offset(), 128);
        ok(&arena);
        // In an arena smaller than one header even an empty blob cannot fit.
        let mut tiny = Arena::new(64);
        assert_eq!(
            tiny.allocate(0),
            Err(ArenaError::CannotFit {
                length: 0,
                size: 64
            })
        );
        ok(&tiny);
    }

    #[test]
    fn cannot_fit_and_overflow() {
        let mut arena = Arena::new(1024);
        assert_eq!(
            arena.allocate(1024 - 127),
            Err(ArenaError::CannotFit {
                length: 897,
                size: 1024
            })
        );
        assert_eq!(arena.allocate(u64::MAX), Err(ArenaError::Overflow));
        assert_eq!(arena.allocate(u64::MAX - 127), Err(ArenaError::Overflow));
        assert_eq!(
            arena.allocate(u64::MAX - 191),
            Err(ArenaError::CannotFit {
                length: u64::MAX - 191,
                size: 1024
            })
        );
        assert_eq!(arena.queued_count(), 0);
        assert_eq!(arena.live_count(), 0);
        ok(&arena);
        // A huge arena: footprint near the top of u64 still works.
        let mut huge = Arena::new(u64::MAX);
        assert_eq!(huge.size(), u64::MAX - 63);
        let lease = leased(huge.allocate(u64::MAX - 63 - 128));
        assert_eq!(lease.footprint(), u64::MAX - 63);
        ok(&huge);
        huge.release(lease.ring).unwrap();
        ok(&huge);
    }

    #[test]
    fn too_many_leases() {
        let mut arena = Arena::new(128 * (ARENA_LEASES_MAX as u64 + 4));
        let mut rings = Vec::new();
        for _ in 0..ARENA_LEASES_MAX {
            rings.push(leased(arena.allocate(0)).ring);
        }
        assert_eq!(arena.live_count(), ARENA_LEASES_MAX);
        assert_eq!(arena.allocate(0), Err(ArenaError::TooManyLeases));
        assert_eq!(arena.queued_count(), 0);
        ok(&arena);
        arena.release(rings[0]).unwrap();
        leased(arena.allocate(0));
        ok(&arena);
    }

    #[test]
    fn grants_respect_the_lease_bound() {
        // MAX - 2 small leases and one 1024-byte lease, with 256 bytes free at the end.
        let mut arena = Arena::new(128 * (ARENA_LEASES_MAX as u64 - 2) + 1024 + 256);
        let mut rings = Vec::new();
        for _ in 0..ARENA_LEASES_MAX - 2 {
            rings.push(leased(arena.allocate(0)).ring);
        }
        let last = leased(arena.allocate(1024 - 128));
        assert_eq!(arena.live_count(), ARENA_LEASES_MAX - 1);
        let big = queued(arena.allocate(1024 - 128)); // does not fit in 256 bytes
        let s1 = queued(arena.allocate(0));
        let s2 = queued(arena.allocate(0));
        ok(&arena);
        // Releasing `last` frees 1280 contiguous bytes: big and s1 are granted, which fills
        // the lease table; s2 keeps waiting although 128 bytes are free.
        let grants = arena.release(last.ring).unwrap();
        assert_eq!(
            grants.iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![big, s1]
        );
        assert_eq!(arena.live_count(), ARENA_LEASES_MAX);
        assert_eq!(arena.free_bytes(), 128);
        assert!(arena.grant_waiting().is_empty());
        assert_eq!(arena.queued_count(), 1);
        ok(&arena);
        let grants = arena.release(rings[0]).unwrap();
        assert_eq!(grants.iter().map(|g| g.0).collect::<Vec<_>>(), vec![s2]);
        assert_eq!(arena.live_count(), ARENA_LEASES_MAX);
        ok(&arena);
    }

    #[test]
    fn queue_full() {
        let mut arena = Arena::new(128);
        let a = leased(arena.allocate(0));
        for _ in 0..ARENA_QUEUE_MAX {
            queued(arena.allocate(0));
        }
        assert_eq!(arena.allocate(0), Err(ArenaError::QueueFull));
        assert_eq!(arena.queued_count(), ARENA_QUEUE_MAX);
        ok(&arena);
        // Cancelling one makes room at once.
        assert!(arena.cancel(TicketId(1)));
        let t = queued(arena.allocate(0));
        assert_eq!(t, TicketId(ARENA_QUEUE_MAX as u64 + 1));
        ok(&arena);
        let grants = arena.release(a.ring).unwrap();
        assert_eq!(grants.len(), 1);
        assert_eq!(grants[0].0, TicketId(2));
        ok(&arena);
    }

    #[test]
    fn leases_iterate_by_ring_id() {
        let mut arena = Arena::new(4096);
        let a = leased(arena.allocate(0));
        let b = leased(arena.allocate(0));
        let c = leased(arena.allocate(0));
        arena.release(a.ring).unwrap();
        let d = leased(arena.allocate(0)); // placed at 0, but ring 4
        assert_eq!(d.offset, 0);
        let rings: Vec<_> = arena.leases().map(|l| l.ring).collect();
        assert_eq!(rings, vec![b.ring, c.ring, d.ring]);
        assert_eq!(arena.lease(c.ring), Some(&c));
    }

    #[test]
    fn invariant_checker_catches_corruption() {
        let mut arena = Arena::new(1024);
        let a = leased(arena.allocate(0));
        ok(&arena);
        let mut overlap = arena.clone();
        overlap.leases.insert(
            RingId(2),
            Lease {
                ring: RingId(2),
                offset: 64,
                length: 0,
            },
        );
        overlap.next_ring = 3;
        assert!(overlap.check_invariants().is_err());
        let mut gap = arena.clone();
        gap.leases.remove(&a.ring);
        assert!(gap.check_invariants().is_err());
        let mut uncoalesced = Arena::new(1024);
        uncoalesced.free = BTreeMap::from([(0, 512), (512, 1024)]);
        assert!(uncoalesced.check_invariants().is_err());
        let mut counter = arena.clone();
        counter.free_bytes += 64;
        assert!(counter.check_invariants().is_err());
    }

    /// The tiling walk (free ranges and leases merged in offset order) sees each way two
    /// pieces can collide or leave a hole: two leases at one offset, a lease inside a free
    /// range, a lease that begins where a free range does, and pieces past the end.
    #[test]
    fn the_tiling_walk_sees_every_collision() {
        let mut arena = Arena::new(1024);
        let a = leased(arena.allocate(0));
        let b = leased(arena.allocate(0));
        ok(&arena);
        let fail = |arena: &Arena, what: &str| {
            let broken = arena.check_invariants().unwrap_err();
            assert!(broken.contains(what), "{broken}");
        };
        let mut twin = arena.clone();
        twin.leases.get_mut(&b.ring).unwrap().offset = a.offset;
        fail(&twin, "(gap or overlap)");
        let mut inside = arena.clone();
        let free_start = *inside.free.keys().next().unwrap();
        inside.leases.get_mut(&b.ring).unwrap().offset = free_start + BLOB_ALIGNMENT;
        fail(&inside, "(gap or overlap)");
        let mut tie = arena.clone();
        tie.leases.get_mut(&b.ring).unwrap().offset = free_start;
        fail(&tie, "(gap or overlap)");
        let mut short = Arena::new(1024);
        short.size = 512;
        fail(&short, "pieces end at 1024, arena size 512");
    }

    #[test]
    fn errors_display() {
        assert_eq!(
            ArenaError::UnknownRing(RingId(3)).to_string(),
            "unknown ring id 3"
        );
        assert!(
            ArenaError::CannotFit { length: 1, size: 2 }
                .to_string()
                .contains("cannot fit")
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Allocate(u64),
        Cancel(usize),
        Release(usize),
        GrantWaiting,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop_oneof![0u64..200, 0u64..3000, Just(u64::MAX - 100)].prop_map(Op::Allocate),
            2 => any::<usize>().prop_map(Op::Cancel),
            4 => any::<usize>().prop_map(Op::Release),
            1 => Just(Op::GrantWaiting),
        ]
    }

    /// Checks grants against the model queue: they come from its head, in order, with fresh
    /// ring ids.
    fn grant(
        grants: Vec<(TicketId, Lease)>,
        waiting: &mut Vec<(TicketId, u64)>,
        ever: &mut Vec<RingId>,
    ) -> Result<(), TestCaseError> {
        for (ticket, lease) in grants {
            prop_assert_eq!(waiting.first().map(|w| w.0), Some(ticket));
            prop_assert_eq!(waiting[0].1, lease.length);
            waiting.remove(0);
            prop_assert!(!ever.contains(&lease.ring));
            ever.push(lease.ring);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn random_sequences_keep_the_invariants(
            size in 0u64..8192,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut arena = Arena::new(size);
            // A model: the tickets waiting, in order.
            let mut waiting: Vec<(TicketId, u64)> = Vec::new();
            let mut ever_rings: Vec<RingId> = Vec::new();
            for op in ops {
                match op {
                    Op::Allocate(length) => match arena.allocate(length) {
                        Ok(Allocation::Leased(lease)) => {
                            prop_assert!(waiting.is_empty());
                            prop_assert_eq!(lease.length, length);
                            prop_assert!(!ever_rings.contains(&lease.ring));
                            ever_rings.push(lease.ring);
                        }
                        Ok(Allocation::Queued(ticket)) => waiting.push((ticket, length)),
                        Err(ArenaError::CannotFit { .. }) => {
                            prop_assert!(footprint(length).unwrap() > arena.size());
                        }
                        Err(ArenaError::Overflow) => prop_assert!(footprint(length).is_none()),
                        Err(e) => prop_assert!(false, "unexpected {e:?}"),
                    },
                    Op::Cancel(i) => {
                        if waiting.is_empty() {
                            prop_assert!(!arena.cancel(TicketId(i as u64)));
                        } else {
                            let (ticket, _) = waiting.remove(i % waiting.len());
                            prop_assert!(arena.cancel(ticket));
                            prop_assert!(!arena.cancel(ticket));
                        }
                    }
                    Op::Release(i) => {
                        let rings: Vec<RingId> = arena.leases().map(|l| l.ring).collect();
                        if rings.is_empty() {
                            prop_assert!(arena.release(RingId(i as u64)).is_err());
                        } else {
                            let ring = rings[i % rings.len()];
                            let grants = arena.release(ring).unwrap();
                            grant(grants, &mut waiting, &mut ever_rings)?;
                            prop_assert!(arena.lease(ring).is_none());
                        }
                    }
                    Op::GrantWaiting => {
                        let grants = arena.grant_waiting();
                        grant(grants, &mut waiting, &mut ever_rings)?;
                    }
                }
                if let Err(e) = arena.check_invariants() {
                    prop_assert!(false, "{}", e);
                }
                prop_assert_eq!(arena.queued_count(), waiting.len());
                // Pairwise disjoint and inside the arena (also implied by the tiling check).
                let leases: Vec<Lease> = arena.leases().copied().collect();
                for (i, a) in leases.iter().enumerate() {
                    prop_assert!(a.offset + a.footprint() <= arena.size());
                    for b in &leases[i + 1..] {
                        prop_assert!(
                            a.offset + a.footprint() <= b.offset
                                || b.offset + b.footprint() <= a.offset
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    #[test]
    fn stats_are_consistent_with_the_leases() {
        let mut arena = Arena::new(64 * 1024);
        let fresh = arena.stats();
        assert_eq!(
            (fresh.used_bytes, fresh.free_bytes, fresh.largest_free),
            (0, 65_536, 65_536)
        );
        let Ok(Allocation::Leased(a)) = arena.allocate(1_000) else {
            panic!("a fits")
        };
        let Ok(Allocation::Leased(b)) = arena.allocate(1_000) else {
            panic!("b fits")
        };
        arena.release(a.ring).unwrap();
        let s = arena.stats();
        assert_eq!(s.leases, 1);
        assert_eq!(s.used_bytes, b.footprint());
        assert_eq!(s.free_bytes + s.used_bytes, s.size);
        // The hole a left is smaller than the range after b.
        assert_eq!(s.largest_free, s.size - b.offset - b.footprint());
        assert!(arena.allocate(1 << 20).is_err());
        assert_eq!(arena.stats().refused, 1);
    }
}

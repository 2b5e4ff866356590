//! The read path (SPEC §9.2, §10 with DESIGN Q26): resolve → allocate a filling lease → pull the
//! payload from the bound source in chunks → seal the lease read-only (checking length and, if
//! the source has one, the digest) → grant it to the child.
//!
//! The transfer is pulled by the destination: it keeps up to `window` chunk requests in flight,
//! asks for a chunk again after `chunk_timeout`, gives up after `chunk_attempts_max` requests for
//! one chunk or when `transfer_deadline` has passed since it started (Q26: every open ends in a
//! grant or an error). Because each chunk is requested by offset, lost, duplicated and reordered
//! frames are harmless: a chunk that is not in flight is ignored, and nothing is written twice.
//! A source that no longer exists answers `ChunkRefused`, as does the host of a node that
//! restarted, on behalf of its dead sources: that refusal (`IncarnationEnded`) fails the read
//! `BlobLost`, because the bytes are gone for good; every other refusal, a deadline or a silent
//! source fails it `SourceFailure` (it may serve again, or the path may be bound anew). A
//! resolve the directory answers `BlobLost` (the node's gone report arrived first) fails the
//! same way before anything is allocated.

use std::collections::BTreeMap;

use super::{Host, Kind, Phase, child_error};
use crate::arena::ArenaMemory;
use crate::blob::{self, BlobState};
use crate::effect::Outbox;
use crate::error::{BlobFailure, DataPlaneError, NamespaceError, Reason};
use crate::ids::{Address, Revision};
use crate::time::Instant;
use crate::wire::{BlobBinding, CHUNK_BYTES_MAX, ChildEvent, ChunkRefusal, Message};

/// A transfer filling a read's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The source the resolve named.
    pub source: Address,
    /// Payload length the resolve named.
    pub length: u64,
    /// The binding's revision (told to the child with the grant).
    pub revision: Revision,
    /// The source's digest, learned from its first chunk (every later chunk must agree).
    pub digest: Option<Option<[u8; 32]>>,
    /// The next payload offset not yet asked for.
    pub next_offset: u64,
    /// Bytes written into the lease.
    pub written: u64,
    /// Payload bytes `[0, hashed_to)` went into the running digest.
    pub hashed_to: u64,
    /// Chunks asked for and not yet received, by offset: (last asked at, times asked).
    pub in_flight: BTreeMap<u64, (Instant, u32)>,
    /// When the transfer started (the deadline runs from here).
    pub started: Instant,
}

impl Host {
    /// The proxy answered a read's Resolve.
    pub(super) fn resolved(
        &mut self,
        now: Instant,
        actor: u64,
        result: Result<BlobBinding, NamespaceError>,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let (Phase::Resolving, Kind::Read { expected_revision }) = (&b.phase, b.kind) else {
            return;
        };
        let binding = match result {
            Ok(binding) => binding,
            Err(error) => return self.fail(actor, child_error(error), mem, out),
        };
        if expected_revision.is_some_and(|r| r != binding.revision) {
            let path = b.path.clone();
            return self.fail(actor, DataPlaneError::PathReplaced(path), mem, out);
        }
        if self.share_local(actor, &binding, mem, out) {
            return;
        }
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        b.phase = Phase::Filling(Transfer {
            source: binding.source,
            length: binding.length,
            revision: binding.revision,
            digest: None,
            next_offset: 0,
            hashed_to: 0,
            written: 0,
            in_flight: BTreeMap::new(),
            started: now,
        });
        self.timed.insert(actor);
        // The filling lease is allocated now; the transfer starts once it is granted.
        self.allocate_filling(now, actor, binding.length, mem, out);
    }

    /// Allocates a read's lease while its phase keeps the transfer (a queued request is
    /// remembered by ticket; the transfer is resumed at the grant).
    fn allocate_filling(
        &mut self,
        now: Instant,
        actor: u64,
        length: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        match self.arena.allocate(length) {
            Ok(crate::arena::Allocation::Leased(lease)) => {
                self.granted(now, actor, lease, mem, out);
            }
            Ok(crate::arena::Allocation::Queued(ticket)) => {
                self.tickets.insert(ticket, actor);
                if let Some(b) = self.bindings.get_mut(&actor) {
                    if let Phase::Filling(t) = &mut b.phase {
                        // The deadline does not run while the arena makes us wait.
                        t.started = now;
                    }
                    b.queued = Some(ticket);
                    b.queued_since = now;
                    self.timed.insert(actor);
                }
            }
            Err(error) => self.fail(actor, super::refused_allocation(error), mem, out),
        }
    }

    /// A read's filling lease is installed: start pulling.
    pub(super) fn start_transfer(
        &mut self,
        now: Instant,
        actor: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        if let Phase::Filling(t) = &mut b.phase {
            t.started = now;
        }
        if self.local_copy(actor, mem, out) {
            return;
        }
        self.pull(now, actor, mem, out);
    }

    /// A read of a blob this host publishes itself: the child views the writer's sealed lease,
    /// with no lease of its own and no copy (issue 18). The lease was frozen at the seal, so
    /// its bytes are the ones validated then and cannot change; the write is not freed while
    /// a reader views it (`Binding::readers`). Returns false unless the source is one of ours,
    /// still sealed and of the resolved length.
    fn share_local(
        &mut self,
        actor: u64,
        binding: &BlobBinding,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) -> bool {
        let source = binding.source;
        let here = source.node == self.config.node && source.incarnation == self.config.incarnation;
        let Some(write) = self
            .sources
            .get(&source.actor)
            .filter(|s| here && s.length == binding.length)
            .map(|s| s.binding)
        else {
            return false;
        };
        let Some(slot) = self.bindings.get(&write).and_then(|w| w.lease) else {
            return false;
        };
        if blob::validate(mem.bytes(), &slot.expected, BlobState::Sealed, false).is_err() {
            return false;
        }
        if let Some(w) = self.bindings.get_mut(&write) {
            w.readers += 1;
        }
        let Some(b) = self.bindings.get_mut(&actor) else {
            return false;
        };
        b.phase = Phase::Reading;
        b.child_holds = true;
        b.shared = Some(write);
        let (child, op) = (b.child, b.op);
        self.send_child(
            child,
            ChildEvent::ReadGranted {
                op,
                lease: slot.view(),
                revision: binding.revision,
            },
            out,
        );
        true
    }

    /// A read of a blob this host serves itself that could not be shared (see
    /// [`share_local`](Self::share_local)): one copy inside the arena instead of a chunked
    /// transfer. Returns false (and the transfer pulls as usual) unless the source is
    /// one of ours, still sealed and of the resolved length.
    fn local_copy(&mut self, actor: u64, mem: &mut dyn ArenaMemory, out: &mut Outbox) -> bool {
        let Some(b) = self.bindings.get(&actor) else {
            return false;
        };
        let (Phase::Filling(t), Some(slot)) = (&b.phase, b.lease) else {
            return false;
        };
        let here =
            t.source.node == self.config.node && t.source.incarnation == self.config.incarnation;
        let Some(source) = self
            .sources
            .get(&t.source.actor)
            .filter(|s| here && s.length == t.length)
        else {
            return false;
        };
        let Some(source_slot) = self.bindings.get(&source.binding).and_then(|b| b.lease) else {
            return false;
        };
        if blob::validate(mem.bytes(), &source_slot.expected, BlobState::Sealed, false).is_err() {
            // Let the transfer ask the source, which refuses: one way to fail.
            return false;
        }
        let (from, to, len) = (source.payload_offset, slot.lease.payload_offset(), t.length);
        let (Ok(from), Ok(to), Ok(len)) = (
            usize::try_from(from),
            usize::try_from(to),
            usize::try_from(len),
        ) else {
            return false;
        };
        if from
            .checked_add(len)
            .is_none_or(|end| end > mem.bytes().len())
            || to
                .checked_add(len)
                .is_none_or(|end| end > mem.bytes().len())
        {
            return false;
        }
        let digest = source.digest;
        mem.bytes_mut().copy_within(from..from + len, to);
        if let Some(Phase::Filling(t)) = self.bindings.get_mut(&actor).map(|b| &mut b.phase) {
            t.digest = Some(digest);
            t.written = t.length;
            t.next_offset = t.length;
        }
        self.complete_transfer(actor, mem, out);
        true
    }

    /// Keeps the window full; completes the transfer when every byte arrived.
    fn pull(&mut self, now: Instant, actor: u64, mem: &mut dyn ArenaMemory, out: &mut Outbox) {
        let chunk_bytes = u64::from(self.config.chunk_bytes.clamp(1, CHUNK_BYTES_MAX as u32));
        let window = self.config.window.max(1) as usize;
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let reply_to = b.address;
        let Phase::Filling(t) = &mut b.phase else {
            return;
        };
        if b.lease.is_none() {
            return;
        }
        while t.in_flight.len() < window && t.next_offset < t.length {
            let offset = t.next_offset;
            let len = chunk_bytes.min(t.length - offset);
            t.next_offset += len;
            t.in_flight.insert(offset, (now, 1));
            let len = len as u32;
            out.send(
                t.source,
                Message::ChunkRequest {
                    offset,
                    len,
                    reply_to,
                },
            );
        }
        if t.in_flight.is_empty() && t.next_offset >= t.length {
            self.complete_transfer(actor, mem, out);
        }
    }

    /// A chunk for binding `actor`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn chunk(
        &mut self,
        now: Instant,
        actor: u64,
        offset: u64,
        total: u64,
        digest: Option<[u8; 32]>,
        bytes: &[u8],
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let chunk_bytes = u64::from(self.config.chunk_bytes.clamp(1, CHUNK_BYTES_MAX as u32));
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let Some(slot) = b.lease else { return };
        let Phase::Filling(t) = &mut b.phase else {
            return;
        };
        if !t.in_flight.contains_key(&offset) {
            // A duplicate, or a chunk we stopped waiting for: nothing to do. (Transfers are
            // told apart by their reply address: a binding actor is never reused.)
            return;
        }
        if total != t.length {
            let error = BlobFailure::Length {
                expected: t.length,
                found: total,
            };
            return self.fail(actor, DataPlaneError::Blob(error), mem, out);
        }
        let wanted = chunk_bytes.min(t.length - offset);
        if bytes.len() as u64 != wanted {
            // S33: an over-long (or short) chunk fails before anything is written.
            let error = BlobFailure::Length {
                expected: wanted,
                found: bytes.len() as u64,
            };
            return self.fail(actor, DataPlaneError::Blob(error), mem, out);
        }
        match t.digest {
            None => t.digest = Some(digest),
            Some(known) if known != digest => {
                let error =
                    DataPlaneError::SourceFailure(Reason::new("the source changed its digest"));
                return self.fail(actor, error, mem, out);
            }
            Some(_) => {}
        }
        if let Err(error) = blob::write_chunk(mem.bytes_mut(), &slot.expected, offset, bytes) {
            return self.fail(actor, DataPlaneError::Blob(error), mem, out);
        }
        t.in_flight.remove(&offset);
        t.written += wanted;
        // Hash the payload as it arrives (the received prefix), so the digest check at the
        // end costs nothing: on a remote read it overlaps the transfer.
        if let Some(Some(_)) = t.digest {
            let prefix_end = t.in_flight.keys().next().copied().unwrap_or(t.next_offset);
            let (from, to) = (t.hashed_to, prefix_end);
            if to > from {
                let hasher = self.hashers.entry(actor).or_default();
                let range = usize::try_from(from).ok().zip(usize::try_from(to).ok());
                if let (Ok(payload), Some((a, z))) =
                    (blob::payload(mem.bytes(), &slot.expected), range)
                    && let Some(part) = payload.get(a..z)
                {
                    hasher.update(part);
                    t.hashed_to = to;
                }
            }
        }
        self.pull(now, actor, mem, out);
    }

    /// The source (or the host answering for it) refused.
    pub(super) fn chunk_refused(
        &mut self,
        actor: u64,
        reason: ChunkRefusal,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get(&actor) else {
            return;
        };
        if !matches!(b.phase, Phase::Filling(_)) {
            return;
        }
        let error = match reason {
            ChunkRefusal::IncarnationEnded => DataPlaneError::BlobLost(b.path.clone()),
            ChunkRefusal::SourceChanged => DataPlaneError::SourceChanged(b.path.clone()),
            other => DataPlaneError::SourceFailure(Reason::new(other.to_string())),
        };
        self.fail(actor, error, mem, out);
    }

    /// The tick for binding `actor`: re-ask for late chunks, enforce the attempt bound and the
    /// deadline (Q26).
    pub(super) fn transfer_tick(
        &mut self,
        now: Instant,
        actor: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let (timeout, attempts_max, deadline) = (
            self.config.chunk_timeout,
            self.config.chunk_attempts_max.max(1),
            self.config.transfer_deadline,
        );
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let reply_to = b.address;
        let queued = b.queued.is_some();
        let Phase::Filling(t) = &mut b.phase else {
            return;
        };
        if queued {
            // Waiting for the arena: the deadline starts at the grant.
            return;
        }
        if now.saturating_since(t.started) >= deadline {
            let error = DataPlaneError::SourceFailure(Reason::new("transfer deadline passed"));
            return self.fail(actor, error, mem, out);
        }
        let chunk_bytes = u64::from(self.config.chunk_bytes.clamp(1, CHUNK_BYTES_MAX as u32));
        let mut exhausted = false;
        for (offset, (sent_at, asked)) in t.in_flight.iter_mut() {
            if now.saturating_since(*sent_at) < timeout {
                continue;
            }
            if *asked >= attempts_max {
                exhausted = true;
                break;
            }
            *asked += 1;
            *sent_at = now;
            let len = chunk_bytes.min(t.length - offset) as u32;
            out.send(
                t.source,
                Message::ChunkRequest {
                    offset: *offset,
                    len,
                    reply_to,
                },
            );
        }
        if exhausted {
            let error = DataPlaneError::SourceFailure(Reason::new("the source does not answer"));
            self.fail(actor, error, mem, out);
        }
    }

    /// The host of `node` refused a connection: nothing listens there (its process is not
    /// running, or not yet). Every transfer from a source on that node fails now, with
    /// `SourceFailure`, instead of asking for its chunks until the attempts run out
    /// (`chunk_attempts_max` × `chunk_timeout`, 10 s by default). A
    /// host that comes back is a new incarnation whose arena does not hold the old sources'
    /// bytes, so waiting could not have helped; a retry that resolves the path again finds
    /// what the directory binds then.
    pub fn handle_peer_refused(
        &mut self,
        now: Instant,
        node: crate::ids::NodeId,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        self.now = now;
        let failing: Vec<u64> = self
            .bindings
            .iter()
            .filter(|(_, b)| matches!(&b.phase, Phase::Filling(t) if t.source.node == node))
            .map(|(&actor, _)| actor)
            .collect();
        for actor in failing {
            let error = DataPlaneError::SourceFailure(Reason::new(format!(
                "the source's host ({node}) refused the connection: it is not running"
            )));
            self.fail(actor, error, mem, out);
        }
        self.debug_check();
    }

    /// Every byte arrived: seal read-only (length and digest checked) and grant.
    fn complete_transfer(&mut self, actor: u64, mem: &mut dyn ArenaMemory, out: &mut Outbox) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let Some(slot) = b.lease else { return };
        let Phase::Filling(t) = &b.phase else { return };
        let (written, revision, digest) = (t.written, t.revision, t.digest.flatten());
        let hashed_all = t.hashed_to == t.length;
        let hasher = self.hashers.remove(&actor);
        // The digest was computed as the chunks arrived: compare it here, and seal without
        // hashing again. Otherwise the seal hashes (and compares) itself.
        let check = match (digest, hasher) {
            (Some(expected), Some(hasher)) if hashed_all => {
                if *hasher.finalize().as_bytes() != expected {
                    let _ = blob::set_state(
                        mem.bytes_mut(),
                        &slot.expected,
                        &[BlobState::Filling],
                        BlobState::Aborted,
                    );
                    return self.fail(actor, DataPlaneError::Blob(BlobFailure::Digest), mem, out);
                }
                None
            }
            (digest, _) => digest,
        };
        if let Err(error) = blob::host_seal(mem.bytes_mut(), &slot.expected, written, check) {
            return self.fail(actor, DataPlaneError::Blob(error), mem, out);
        }
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        b.phase = Phase::Reading;
        b.child_holds = true;
        let lease = slot.view();
        let (child, op) = (b.child, b.op);
        self.send_child(
            child,
            ChildEvent::ReadGranted {
                op,
                lease,
                revision,
            },
            out,
        );
    }
}

//! Host-side checks (SPEC §13.8): the host machine's own invariants after every step (S28, S30
//! and its lease bookkeeping), S34 against the directory after every host and directory step,
//! the content check and S36 from what workers report, and L10–L12 at the end.
//!
//! **Content check.** Every published write is remembered as (path, revision) → (tag, length);
//! every granted read must return exactly `content(tag, length)` for the revision its grant
//! names — the bytes of the write the namespace bound when the read resolved. A read whose
//! revision was published by a write whose `Published` never reached its worker (the worker died,
//! or its node crashed) is checked for self-consistency instead: its first eight bytes name a tag
//! and the rest must be that tag's content.

use std::collections::{BTreeMap, BTreeSet};

use dataplane_core::directory::{Directory, SourceState};
use dataplane_core::effect::Effect;
use dataplane_core::host::{Host, Kind, NamespaceHold, Phase};
use dataplane_core::ids::{Address, NodeId, Revision};
use dataplane_core::log::{Entry, LogRecord, Mutation};
use dataplane_core::path::DataPath;
use dataplane_core::time::Instant;
use dataplane_core::wire::{DirectoryRequest, Message, SourceRecovery};

use crate::host::HostNode;
use crate::worker::{Note, content};

/// The sources a directory binds on one host, collected from its entries after its
/// `directory`th change. One per node: a walk of the entries picks only that host's sources
/// and sorts them once per directory change, so a host step checks them in one walk of the
/// host's sources and one of its bindings, with no lookup per source (issue 18: collecting
/// every host's sources into maps, then sorting vectors, was a tenth of the swarm's time; a
/// source and a binding lookup per bound source, 7 % of the instructions of seed 171).
#[derive(Debug)]
struct BoundSources {
    node: NodeId,
    /// The directory change and host incarnation the lists were collected for (none yet).
    collected: Option<(u64, u64)>,
    /// The host machine's actor sources (actor numbers from `HOST_FIRST_ACTOR`), sorted.
    actors: Vec<u64>,
    /// Scratch: the bindings of the bound sources, as one host step finds them.
    bindings: Vec<(u64, u64)>,
    /// The node's file sources, sorted by actor number.
    files: Vec<u64>,
}

impl BoundSources {
    /// What `dir` binds on this node at `incarnation`, after the directory's `directory`th
    /// change: collected again (refilling in place) unless it was for both.
    fn refresh(&mut self, dir: &Directory, directory: u64, incarnation: u64) {
        if self.collected == Some((directory, incarnation)) {
            return;
        }
        self.collected = Some((directory, incarnation));
        let node = self.node;
        self.actors.clear();
        self.files.clear();
        for (_, entry) in dir.durable().entries() {
            match entry {
                Entry::Blob {
                    recovery: SourceRecovery::Actor { actor, .. },
                    ..
                } if actor.node == node
                    && actor.incarnation == incarnation
                    && actor.actor >= crate::worker::HOST_FIRST_ACTOR =>
                {
                    self.actors.push(actor.actor);
                }
                Entry::Blob {
                    recovery: SourceRecovery::File { source, .. },
                    ..
                } if source.node == node => self.files.push(source.actor),
                _ => {}
            }
        }
        self.actors.sort_unstable();
        self.files.sort_unstable();
    }
}

/// The address of the file source `actor` on `node` that the directory binds (to name it).
fn bound_file(dir: &Directory, node: NodeId, actor: u64) -> Address {
    dir.durable()
        .entries()
        .find_map(|(_, e)| match e {
            Entry::Blob {
                recovery: SourceRecovery::File { source, .. },
                ..
            } if source.node == node && source.actor == actor => Some(*source),
            _ => None,
        })
        .unwrap_or(Address::new(node, 0, actor))
}

/// What the host checks remember.
#[derive(Debug, Default)]
pub struct HostChecker {
    published: BTreeMap<(DataPath, Revision), (u64, u64)>,
    /// Per node: the incarnation last seen, and the revision each of its live bindings
    /// published, sorted by actor (Q19).
    published_by: BTreeMap<NodeId, (u64, Vec<(u64, Revision)>)>,
    /// Scratch for rebuilding `published_by` without allocating on every step.
    published_scratch: Vec<(u64, Revision)>,
    /// Per node: the incarnation last seen, and the sources whose header and digest were
    /// checked (sorted by actor).
    digests_checked: BTreeMap<NodeId, (u64, Vec<u64>)>,
    /// Scratch for rebuilding `digests_checked`.
    digests_scratch: Vec<u64>,
    /// Per node: the sources the directory bound there when the checker last walked its
    /// entries for that node.
    bound: Vec<BoundSources>,
    /// The last namespace call each binding sent: (the proxy, the request).
    last_call: BTreeMap<Address, (Address, DirectoryRequest)>,
    /// When each host's declarer (its horizon actor) last declared operations done.
    declared_at: BTreeMap<Address, Instant>,
    /// The allocations each host machine (by its first actor's address) had refused when last
    /// sampled: the count never goes down.
    refused: BTreeMap<Address, u64>,
    /// Per node: the retractions its running incarnation sent (see `retractions_sent`).
    retractions: BTreeMap<NodeId, RetractionBook>,
}

/// The retractions one host incarnation sent, as seen on the wire.
#[derive(Debug, Default)]
struct RetractionBook {
    incarnation: u64,
    /// Calls not answered yet: (the caller, its request id) and the request.
    in_flight: BTreeMap<(Address, u64), DirectoryRequest>,
    /// Retractions no directory has answered to the host yet, and when each was first sent.
    owed: Vec<(DirectoryRequest, Instant)>,
    /// Retractions a directory answered: sending one again is not owed (what it undoes is
    /// undone; the host offers an equal one once, for both endpoints of a stream).
    answered: std::collections::HashSet<DirectoryRequest>,
}

impl RetractionBook {
    fn of<'a>(
        books: &'a mut BTreeMap<NodeId, RetractionBook>,
        machine: &Host,
    ) -> &'a mut RetractionBook {
        let me = machine.address(0);
        let book = books.entry(me.node).or_default();
        if book.incarnation != me.incarnation {
            *book = RetractionBook {
                incarnation: me.incarnation,
                ..RetractionBook::default()
            };
        }
        book
    }
}

impl HostChecker {
    /// S34: every source the directory binds on a running host's current incarnation is live
    /// there and backed by a lease (a lease is never freed under a binding); and (issue 17) a
    /// file blob the directory binds is in its host's table, in every life of the host (the
    /// table is durable before the Register leaves, and a record goes only once the directory
    /// retired its source).
    ///
    /// This runs after every host step and every committing directory step. `directory` is the
    /// checker's count of the directory steps it has seen: while it stays the same (host steps
    /// in between), the sources the directory binds are the ones collected from its entries the
    /// last time, so the entries are walked once per directory change, not once per host step.
    pub fn sources_backed(
        &mut self,
        dir: &Directory,
        directory: u64,
        hosts: &[HostNode],
    ) -> Result<(), String> {
        let running = || {
            hosts
                .iter()
                .filter(|h| h.up)
                .filter_map(|h| Some((h, h.machine.as_ref()?)))
        };
        if running().next().is_none() {
            return Ok(());
        }
        // The path is looked up only to name a violation.
        let path_of = |source: &Address| -> String {
            dir.durable()
                .entries()
                .find(|(_, e)| match e {
                    Entry::Blob {
                        recovery:
                            SourceRecovery::Actor { actor: a, .. }
                            | SourceRecovery::File { source: a, .. },
                        ..
                    } => a == source,
                    _ => false,
                })
                .map_or_else(|| "?".to_owned(), |(p, _)| p.to_string())
        };
        for (h, machine) in running() {
            let at = self
                .bound
                .iter()
                .position(|b| b.node == h.node)
                .unwrap_or_else(|| {
                    self.bound.push(BoundSources {
                        node: h.node,
                        collected: None,
                        actors: Vec::new(),
                        bindings: Vec::new(),
                        files: Vec::new(),
                    });
                    self.bound.len() - 1
                });
            let bound = &mut self.bound[at];
            bound.refresh(dir, directory, h.incarnation);
            // The bound sources (sorted) against the host's (by actor), then their bindings
            // (sorted) against the host's: two merge walks.
            let unbacked = |actor: u64| {
                let source = Address::new(h.node, h.incarnation, actor);
                format!(
                    "S34: {} is bound to {source}, which has no live source and lease",
                    path_of(&source)
                )
            };
            bound.bindings.clear();
            let mut sources = machine.sources().peekable();
            for &actor in &bound.actors {
                while sources.next_if(|(a, _)| **a < actor).is_some() {}
                match sources.peek() {
                    Some((a, s)) if **a == actor => bound.bindings.push((s.binding, actor)),
                    _ => return Err(unbacked(actor)),
                }
            }
            bound.bindings.sort_unstable();
            let mut bindings = machine.bindings().peekable();
            for &(binding, actor) in &bound.bindings {
                while bindings.next_if(|(b, _)| **b < binding).is_some() {}
                match bindings.peek() {
                    Some((b, found)) if **b == binding && found.lease.is_some() => {}
                    _ => return Err(unbacked(actor)),
                }
            }
            // The host's file blobs (sorted by actor) against the file sources bound on its
            // node (their incarnation is the persistent one).
            let mut served = machine.file_blobs().map(|f| f.actor).peekable();
            for &actor in &bound.files {
                while served.next_if(|a| *a < actor).is_some() {}
                if served.peek() != Some(&actor) {
                    let source = bound_file(dir, h.node, actor);
                    return Err(format!(
                        "files: {} is bound to file source {source}, which its host does not serve",
                        path_of(&source)
                    ));
                }
            }
        }
        Ok(())
    }

    /// S34 after a committing directory step. The hosts did not change, and every source bound
    /// before this step was checked against its host's current state (after the host's last
    /// step, or when it was bound), so only the sources this step bound can break S34: a
    /// commit binds a source only through a `Register` record. Each one still bound at its
    /// path when the step ends is checked as `sources_backed` would. (A crash or recovery
    /// changes the entries without a record: the world checks every host after a recovery.)
    pub fn sources_newly_bound(
        &self,
        dir: &Directory,
        effects: &[Effect],
        hosts: &[HostNode],
    ) -> Result<(), String> {
        for effect in effects {
            let Effect::Persist(LogRecord::Committed {
                mutation: Mutation::Register { path, recovery, .. },
                ..
            }) = effect
            else {
                continue;
            };
            let still_bound = matches!(
                dir.durable().entry(path),
                Some(Entry::Blob { recovery: r, .. }) if r == recovery
            );
            if !still_bound {
                continue;
            }
            let running = hosts
                .iter()
                .filter(|h| h.up)
                .filter_map(|h| Some((h, h.machine.as_ref()?)));
            match recovery {
                SourceRecovery::Actor { actor: source, .. } => {
                    if source.actor < crate::worker::HOST_FIRST_ACTOR {
                        continue;
                    }
                    for (h, machine) in running {
                        if (h.node, h.incarnation) != (source.node, source.incarnation) {
                            continue;
                        }
                        let backed = machine
                            .source(source.actor)
                            .and_then(|s| machine.binding(s.binding))
                            .is_some_and(|b| b.lease.is_some());
                        if !backed {
                            return Err(format!(
                                "S34: {path} is bound to {source}, which has no live source and lease"
                            ));
                        }
                    }
                }
                SourceRecovery::File { source, .. } => {
                    for (h, machine) in running {
                        if h.node == source.node
                            && !machine.file_blobs().any(|f| f.actor == source.actor)
                        {
                            return Err(format!(
                                "files: {path} is bound to file source {source}, which its host does not serve"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Issue 18 (the host computes a write's digest as it freezes it): every new source's
    /// frozen header carries the source's length and digest, and that digest is BLAKE3 of the
    /// payload bytes (restated with the `blake3` crate, not core's helper). A source without a
    /// digest has a header with digest kind 0 and zero digest bytes. Readers check the
    /// source's digest only; the header's is what a local reader maps, so it must agree.
    /// Each source is checked once, in the step that made it (the bytes are final by then).
    /// The header layout restated (SPEC §8.1, `core/src/blob.rs`): length at byte 16 (u64 LE),
    /// digest kind at 7 (0 none, 2 BLAKE3), digest bytes at 32..64.
    pub fn digests_settled(&mut self, machine: &Host, mem: &[u8]) -> Result<(), String> {
        use dataplane_core::arena::BLOB_HEADER_BYTES;
        let checked = this_incarnation(&mut self.digests_checked, machine);
        let mut next = std::mem::take(&mut self.digests_scratch);
        next.clear();
        let mut old = checked.iter().copied().peekable();
        let mut result = Ok(());
        for (&actor, s) in machine.sources() {
            next.push(actor);
            while old.next_if(|&a| a < actor).is_some() {}
            if old.next_if(|&a| a == actor).is_some() || result.is_err() {
                continue;
            }
            let at = |from: u64, len: u64| -> Option<&[u8]> {
                let from = usize::try_from(from).ok()?;
                mem.get(from..from.checked_add(usize::try_from(len).ok()?)?)
            };
            let header = s
                .payload_offset
                .checked_sub(BLOB_HEADER_BYTES)
                .and_then(|h| at(h, BLOB_HEADER_BYTES));
            let (Some(header), Some(payload)) = (header, at(s.payload_offset, s.length)) else {
                result = Err(format!(
                    "digest: source {} lies outside the arena",
                    s.address
                ));
                continue;
            };
            let length = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
            let (kind, digest) = (header[7], &header[32..64]);
            let agrees = match s.digest {
                None => kind == 0 && digest.iter().all(|b| *b == 0),
                Some(d) => kind == 2 && digest == d.as_slice(),
            };
            if length != s.length || !agrees {
                result = Err(format!(
                    "digest: source {} serves {} bytes with digest {:?}, but its header says {length} bytes, kind {kind}, digest {digest:02x?}",
                    s.address, s.length, s.digest
                ));
            } else if let Some(d) = s.digest
                && *blake3::hash(payload).as_bytes() != d
            {
                result = Err(format!(
                    "digest: source {} carries a digest that is not BLAKE3 of its {} payload bytes",
                    s.address, s.length
                ));
            }
        }
        drop(old);
        std::mem::swap(checked, &mut next);
        self.digests_scratch = next;
        result
    }

    /// Pacing: a host sends a namespace call again (the same request from the same binding to
    /// the same proxy) only on its tick. Any other input that re-sends one is a spin: a full
    /// proxy answers at once, and a host that re-sends at once never leaves the loop (issue
    /// 11). A proxy restart re-sends to the new proxy's address, which is not "the same".
    /// ARCHITECTURE "Callers": a host declares its operations done at most once a horizon
    /// period (measured on its own clock).
    pub fn declarations_paced(&mut self, now: Instant, effects: &[Effect]) -> Result<(), String> {
        let period = dataplane_core::host::HORIZON_PERIOD;
        for effect in effects {
            let Effect::Send {
                message: Message::ProxyCall(call),
                ..
            } = effect
            else {
                continue;
            };
            if !matches!(call.request, DirectoryRequest::OperationsDone { .. }) {
                continue;
            }
            if let Some(last) = self.declared_at.insert(call.reply_to, now)
                && now.saturating_since(last) < period
            {
                return Err(format!(
                    "horizon: {} declared again {} after its last declaration (at most once per {period})",
                    call.reply_to,
                    now.saturating_since(last)
                ));
            }
        }
        Ok(())
    }

    pub fn calls_paced(&mut self, effects: &[Effect], on_tick: bool) -> Result<(), String> {
        for effect in effects {
            let Effect::Send {
                to,
                message: Message::ProxyCall(call),
            } = effect
            else {
                continue;
            };
            let again = self
                .last_call
                .get(&call.reply_to)
                .is_some_and(|(proxy, request)| proxy == to && *request == call.request);
            if again && !on_tick {
                return Err(format!(
                    "pacing: {} sent its {:?} again at once, not on the tick",
                    call.reply_to,
                    call.request.kind()
                ));
            }
            self.last_call
                .insert(call.reply_to, (*to, call.request.clone()));
        }
        Ok(())
    }

    /// The retraction promise (ARCHITECTURE "Streams for programs"), as the wire shows it:
    /// every retraction a host sends (a stream's cancel or close, a reservation's release),
    /// from a binding or handed over when the binding ended, is kept by the host until a
    /// directory's answer to it reaches the host. A full proxy's refusal (answered at no
    /// epoch) is not an answer; a proxy that consumes the answer itself leaves the host
    /// without one. The only excuse is a displacement the host heard, which ends the stream a
    /// close was for. Here: the retractions the host sends; `retraction_input` sees the
    /// answers and displacements, and `at_end` fails one still owed (seed 1567: a refused
    /// `CancelStream` nobody heard; seed 3535: a close left to a proxy that restarted).
    pub fn retractions_sent(&mut self, now: Instant, machine: &Host, effects: &[Effect]) {
        let book = RetractionBook::of(&mut self.retractions, machine);
        for effect in effects {
            if let Effect::Send {
                message: Message::ProxyCall(call),
                ..
            } = effect
                && call.request.kind().is_retraction()
            {
                if !book.answered.contains(&call.request)
                    && !book.owed.iter().any(|(r, _)| *r == call.request)
                {
                    book.owed.push((call.request.clone(), now));
                }
                book.in_flight
                    .insert((call.reply_to, call.request_id.0), call.request.clone());
            }
        }
    }

    /// A frame reached host `machine` (before it steps): an answer to a retraction, or a
    /// displacement (see `retractions_sent`).
    pub fn retraction_input(&mut self, machine: &Host, to: Address, message: &Message) {
        let book = RetractionBook::of(&mut self.retractions, machine);
        match message {
            Message::Reply(reply) => {
                let Some(request) = book.in_flight.remove(&(to, reply.request_id.0)) else {
                    return;
                };
                if reply.epoch != dataplane_core::ids::AuthorityEpoch::NONE {
                    book.owed.retain(|(r, _)| *r != request);
                    book.answered.insert(request);
                }
            }
            Message::Displaced { incarnation, .. } => book.owed.retain(|(r, _)| {
                !matches!(r, DirectoryRequest::CloseStream { incarnation: i, .. } if i == incarnation)
            }),
            _ => {}
        }
    }

    /// Q19: every Unregister a host sends for a write it published names the revision that
    /// write was published at (compare-and-delete), so it can never unlink a newer blob.
    pub fn unpublish_names_its_revision(
        &mut self,
        machine: &Host,
        effects: &[Effect],
    ) -> Result<(), String> {
        // What each binding published (remembered: the hold is gone once the source retired,
        // and a re-driven Unregister still names the same revision). Rebuilt by one merge of
        // the machine's bindings (sorted by actor) with what was remembered, so a binding that
        // is gone is forgotten (it sends nothing more) and the table stays as small as the
        // host's.
        let remembered = this_incarnation(&mut self.published_by, machine);
        let mut next = std::mem::take(&mut self.published_scratch);
        next.clear();
        let mut old = remembered.iter().copied().peekable();
        for (&actor, b) in machine.bindings() {
            while old.next_if(|&(a, _)| a < actor).is_some() {}
            let before = old.next_if(|&(a, _)| a == actor).map(|(_, r)| r);
            let revision = match b.namespace {
                NamespaceHold::Bound { revision, .. } => Some(revision),
                _ => before,
            };
            if let Some(revision) = revision {
                next.push((actor, revision));
            }
        }
        std::mem::swap(remembered, &mut next);
        self.published_scratch = next;
        let remembered = &self.published_by[&machine.address(0).node].1;
        for effect in effects {
            let Effect::Send {
                message: Message::ProxyCall(call),
                ..
            } = effect
            else {
                continue;
            };
            let DirectoryRequest::Unregister {
                path,
                expected_revision,
                ..
            } = &call.request
            else {
                continue;
            };
            let Some(b) = machine.binding(call.reply_to.actor) else {
                continue;
            };
            if b.kind == Kind::Control {
                continue; // A child's own Remove says what it wants.
            }
            let published = remembered
                .binary_search_by_key(&b.address.actor, |&(a, _)| a)
                .ok()
                .map(|i| remembered[i].1);
            if *expected_revision != published || published.is_none() {
                return Err(format!(
                    "Q19: binding {} unregisters {path} expecting {expected_revision:?}, but it published {published:?}",
                    call.reply_to
                ));
            }
        }
        Ok(())
    }

    /// Issue 17 (streams for programs): a displaced stream is over. After a step in which the
    /// host acknowledged the displacement of rendezvous `i` for endpoint `e`, no stream binding
    /// at `e` still waits for its match, is matched as `i`, or is closing: the child was told
    /// (`StreamDisplaced`) and the binding ended. (A binding matched as another rendezvous
    /// heard a stale displacement.)
    pub fn displacements_end_streams(
        &self,
        machine: &Host,
        effects: &[Effect],
    ) -> Result<(), String> {
        for effect in effects {
            let Effect::Send {
                message:
                    Message::StreamDisplaced {
                        endpoint,
                        incarnation,
                    },
                ..
            } = effect
            else {
                continue;
            };
            let Some(b) = machine
                .bindings()
                .map(|(_, b)| b)
                .find(|b| b.address == *endpoint && matches!(b.kind, Kind::Stream { .. }))
            else {
                continue;
            };
            let live = match &b.phase {
                Phase::StreamOpening | Phase::StreamClosing => true,
                Phase::Streaming(matched) => matched == incarnation,
                _ => false,
            };
            if live {
                return Err(format!(
                    "streams: {endpoint} acknowledged the displacement of {incarnation} but its stream ({}) goes on in {:?}",
                    b.path, b.phase
                ));
            }
        }
        Ok(())
    }

    /// A probe's write of `length` bytes was refused `ArenaExhausted` after the load stopped
    /// (seed 10130), in an arena of `arena_size` bytes. Right only if the arena is really full of what must stay in it: every
    /// lease a binding holds is either a blob the directory binds at a path on this host
    /// (its source's lease) or an operation still in progress (a tracked binding), and no
    /// gap between the leases, sorted by offset, fits the write's footprint (header plus
    /// payload, rounded up to the alignment; restated as `arena_accounted` does). Anything
    /// else holding a lease is a leak the refusal hides. `Ok(true)` when only bound blobs
    /// hold the arena (nothing will free it), `Ok(false)` when operations in progress may.
    pub fn probe_arena_full(
        &self,
        machine: &Host,
        dir: &Directory,
        arena_size: u64,
        length: u64,
    ) -> Result<bool, String> {
        use dataplane_core::arena::{BLOB_ALIGNMENT, BLOB_HEADER_BYTES};
        let footprint =
            |length: u64| (BLOB_HEADER_BYTES + length).div_ceil(BLOB_ALIGNMENT) * BLOB_ALIGNMENT;
        let host = machine.address(0);
        // The bindings whose sources the directory binds at a path.
        let mut bound: Vec<u64> = dir
            .durable()
            .entries()
            .filter_map(|(_, e)| match e {
                Entry::Blob {
                    recovery: SourceRecovery::Actor { actor, .. },
                    ..
                } if (actor.node, actor.incarnation) == (host.node, host.incarnation) => {
                    machine.source(actor.actor).map(|s| s.binding)
                }
                _ => None,
            })
            .collect();
        bound.sort_unstable();
        let mut leases: Vec<(u64, u64)> = Vec::new();
        let mut in_progress = false;
        for (actor, b) in machine.bindings() {
            let Some(slot) = &b.lease else {
                continue;
            };
            if b.tracked {
                in_progress = true;
            } else if bound.binary_search(actor).is_err() {
                return Err(format!(
                    "probe: {host} refused a {length}-byte write ArenaExhausted, but binding {actor} ({}, {:?}) holds the lease at {} and is neither bound by the directory nor in progress",
                    b.path, b.phase, slot.lease.offset
                ));
            }
            leases.push((slot.lease.offset, footprint(slot.lease.length)));
        }
        leases.sort_unstable();
        let need = footprint(length);
        let mut at = 0u64;
        let mut largest = 0u64;
        for &(offset, bytes) in &leases {
            largest = largest.max(offset.saturating_sub(at));
            at = offset + bytes;
        }
        largest = largest.max(arena_size.saturating_sub(at));
        if largest >= need {
            return Err(format!(
                "probe: {host} refused a {length}-byte write ArenaExhausted, but its leases leave a free range of {largest} bytes, and the write needs {need}"
            ));
        }
        Ok(!in_progress)
    }

    /// Issue 17: the arena's statistics are what the host's leases make them. Restated from
    /// the bindings (every lease belongs to one binding, and nothing else holds one): the
    /// leases and queued requests are counted, the bytes used are the leases' footprints
    /// (header plus payload, rounded up to the alignment), the free bytes are the rest, and the
    /// largest free range is the largest gap between the leases sorted by offset. Refusals only
    /// grow.
    pub fn arena_accounted(&mut self, machine: &Host) -> Result<(), String> {
        use dataplane_core::arena::{BLOB_ALIGNMENT, BLOB_HEADER_BYTES};
        let stats = machine.arena_stats();
        let footprint =
            |length: u64| (BLOB_HEADER_BYTES + length).div_ceil(BLOB_ALIGNMENT) * BLOB_ALIGNMENT;
        let mut leases: Vec<(u64, u64)> = machine
            .bindings()
            .filter_map(|(_, b)| b.lease.as_ref())
            .map(|slot| (slot.lease.offset, footprint(slot.lease.length)))
            .collect();
        leases.sort_unstable();
        let queued = machine
            .bindings()
            .filter(|(_, b)| b.queued.is_some())
            .count() as u64;
        let (mut at, mut largest, mut used) = (0u64, 0u64, 0u64);
        for &(offset, bytes) in &leases {
            if offset < at {
                return Err(format!(
                    "arena: the lease at {offset} overlaps the one ending at {at}"
                ));
            }
            largest = largest.max(offset - at);
            at = offset + bytes;
            used += bytes;
        }
        largest = largest.max(stats.size.saturating_sub(at));
        let expected = (
            leases.len() as u64,
            used,
            stats.size.saturating_sub(used),
            largest,
            queued,
        );
        let reported = (
            stats.leases,
            stats.used_bytes,
            stats.free_bytes,
            stats.largest_free,
            stats.queued,
        );
        if reported != expected {
            return Err(format!(
                "arena statistics (leases, used, free, largest free, queued) are {reported:?}, but the host's leases make {expected:?}"
            ));
        }
        let last = self.refused.entry(machine.address(0)).or_insert(0);
        if stats.refused < *last {
            return Err(format!(
                "arena statistics: refused allocations went down from {last} to {}",
                stats.refused
            ));
        }
        *last = stats.refused;
        Ok(())
    }

    /// The host machine's own invariants after a step.
    pub fn machine_step(&self, machine: &Host) -> Result<(), String> {
        machine
            .check_invariants()
            .map_err(|v| format!("host invariant: {v}"))
    }

    /// Q26/L12 (H-D9): a transfer that holds its lease never runs past its deadline (plus a
    /// tick, which enforces it): a lost chunk is asked for again, and a silent source fails
    /// the read.
    pub fn transfers_bounded(&self, now: Instant, machine: &Host) -> Result<(), String> {
        let c = machine.config();
        let bound = c
            .transfer_deadline
            .saturating_add(c.tick)
            .saturating_add(c.tick);
        for (actor, b) in machine.bindings() {
            if let (Phase::Filling(t), Some(_), None) = (&b.phase, b.lease, b.queued)
                && now.saturating_since(t.started) > bound
            {
                return Err(format!(
                    "Q26: the transfer of binding {actor} ({}) started at {} is still running at {now} (deadline {:?})",
                    b.path, t.started, c.transfer_deadline
                ));
            }
        }
        Ok(())
    }

    /// A worker's note. Returns the coverage name to count, or the violation.
    pub fn note(&mut self, note: Note, dir: Option<&Directory>) -> Result<&'static str, String> {
        match note {
            Note::Violation(v) => Err(v),
            Note::Seen(name) => Ok(name),
            // The world judges these with the host machine at hand (`probe_arena_full`).
            Note::ArenaFull { length } => Err(format!(
                "probe: a {length}-byte write refused ArenaExhausted reached the checker unjudged"
            )),
            Note::Stat {
                path,
                revision,
                length,
            } => match self.published.get(&(path.clone(), revision)) {
                Some((_, published)) if *published != length => Err(format!(
                    "stat: {path} at {revision} has length {length}, but {published} bytes were published there"
                )),
                _ => Ok("host.stat_blob"),
            },
            Note::Published {
                path,
                revision,
                tag,
                length,
            } => {
                match self
                    .published
                    .insert((path.clone(), revision), (tag, length))
                {
                    Some(earlier) if earlier != (tag, length) => Err(format!(
                        "two writes were published at {path} revision {revision}: tags {:#x} and {tag:#x}",
                        earlier.0
                    )),
                    _ => Ok("host.published"),
                }
            }
            Note::Read {
                path,
                revision,
                payload,
            } => {
                let expected = self.published.get(&(path.clone(), revision)).copied();
                match expected {
                    Some((tag, length)) => {
                        if payload.len() as u64 != length || payload != content(tag, length) {
                            return Err(format!(
                                "content: a read of {path} at {revision} returned {} bytes that are not write {tag:#x} ({length} bytes)",
                                payload.len()
                            ));
                        }
                        if tag >= crate::world::FILE_TAG_BASE {
                            // A file blob, read as the version its publication saw.
                            return Ok("host.file_read_checked");
                        }
                        Ok("host.read_checked")
                    }
                    None if payload.len() >= 8 => {
                        let mut head = [0; 8];
                        head.copy_from_slice(&payload[..8]);
                        let tag = u64::from_le_bytes(head);
                        if payload != content(tag, payload.len() as u64) {
                            return Err(format!(
                                "content: a read of {path} at {revision} returned bytes of no write"
                            ));
                        }
                        Ok("host.read_self_consistent")
                    }
                    None => Ok("host.read_short_unchecked"),
                }
            }
            Note::Aborted { path, revision } => {
                if let Some(dir) = dir
                    && let Some(Entry::Blob {
                        revision: bound, ..
                    }) = dir.durable().entry(&path)
                    && *bound == revision
                {
                    return Err(format!(
                        "S36: {path} is still bound at {revision} after its write was aborted"
                    ));
                }
                Ok("host.aborted")
            }
        }
    }

    /// L10–L12 after the heal: every session closed, every open resolved, and every live lease
    /// backs a published source the directory still binds.
    pub fn at_end(&self, dir: &Directory, hosts: &[HostNode], problems: &mut Vec<String>) {
        let bound: BTreeSet<Address> = dir
            .durable()
            .entries()
            .filter_map(|(path, _)| match dir.source(path) {
                Some(SourceState::Available(b)) => Some(b.source),
                _ => None,
            })
            .collect();
        for host in hosts.iter().filter(|h| h.up) {
            let Some(machine) = host.machine.as_ref() else {
                continue;
            };
            for worker in &host.workers {
                if !worker.is_idle() {
                    problems.push(format!(
                        "L11/L12: worker {} not done: {}",
                        worker.address,
                        worker.describe()
                    ));
                }
            }
            // A closed session is freed at once (issue 11, item 2): none may be left.
            for (actor, session) in machine.sessions() {
                problems.push(format!(
                    "L11: session {actor} on {} is still held ({:?})",
                    host.node, session.state
                ));
            }
            let mut kept = 0;
            for (actor, b) in machine.bindings() {
                let ok = match (&b.phase, b.namespace) {
                    (Phase::Published, NamespaceHold::Bound { source, .. }) => {
                        bound.contains(&machine.address(source))
                    }
                    _ => false,
                };
                if ok {
                    kept += 1;
                } else {
                    problems.push(format!(
                        "L10: binding {actor} on {} ({}) holds on in {:?}, namespace {:?}, child holds {}",
                        host.node, b.path, b.phase, b.namespace, b.child_holds
                    ));
                }
            }
            // Issue 17: a file blob the host records as published is still bound (its record
            // goes when the directory retires its source, and every retirement is done by now).
            for f in machine.file_blobs() {
                let address = machine.file_source(f.actor);
                if f.revision.is_some() && !bound.contains(&address) {
                    problems.push(format!(
                        "files: {} still serves file blob {address} ({} from {}), which nothing binds",
                        host.node,
                        f.path,
                        f.file.as_str()
                    ));
                }
            }
            let me = machine.address(0);
            if let Some(book) = self.retractions.get(&me.node)
                && book.incarnation == me.incarnation
                && let Some((request, at)) = book.owed.first()
            {
                problems.push(format!(
                    "retraction: {} sent a {:?} at {at} on its clock ({request:?}) and no directory's answer to it ever reached the host ({} owed)",
                    host.node,
                    request.kind(),
                    book.owed.len()
                ));
            }
            let live = machine.arena().live_count();
            if live != kept {
                problems.push(format!(
                    "L10: {} has {live} live leases for {kept} published blobs",
                    host.node
                ));
            }
            if machine.arena().queued_count() != 0 {
                problems.push(format!("L12: {} still has queued allocations", host.node));
            }
        }
    }
}

/// `machine`'s row of a per-node table kept for its running incarnation: emptied when the
/// node runs a new incarnation (what an earlier one did names nothing the new one holds).
fn this_incarnation<'a, T>(
    table: &'a mut BTreeMap<NodeId, (u64, Vec<T>)>,
    machine: &Host,
) -> &'a mut Vec<T> {
    let me = machine.address(0);
    let (incarnation, rows) = table
        .entry(me.node)
        .or_insert_with(|| (me.incarnation, Vec::new()));
    if *incarnation != me.incarnation {
        *incarnation = me.incarnation;
        rows.clear();
    }
    rows
}

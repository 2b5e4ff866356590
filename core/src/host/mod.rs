//! The host side of the data plane (SPEC §6–§11): one machine per node that serves child
//! sessions from a shared-memory arena, publishes their writes as blob sources, reads blobs into
//! fresh leases, and serves its published sources to other hosts.
//!
//! # Driving it
//!
//! Build it with [`Host::new`] (it arms [`Timer::HostTick`]), create sessions with
//! [`Host::open_session`] (the driver hands each session's address to its child), then feed it:
//!
//! * [`Host::handle_message`] with every frame addressed to this node's host actors: a child's
//!   `FromChild`, the proxy's `Reply` to a binding, a `ChunkRequest`/`Retire` for a source, a
//!   `Chunk`/`ChunkRefused` for a transfer — also frames for addresses of an earlier incarnation
//!   of this node, which the host answers on behalf of the dead (DESIGN Q5/Q8);
//! * [`Host::handle_timer`] when the tick fires;
//! * [`Host::proxy_restarted`] when the node's proxy lost its pending table.
//!
//! Every input also takes the arena memory, `mem`, the bytes the children map. The host reads
//! and writes blob headers and chunk payloads there and nothing else; it never maps, opens or
//! syncs anything.
//!
//! # Leases are freed only when nobody can use them
//!
//! A lease has two holds (STYLE rule 5): the **child** may map it (from the grant until the
//! child's `Release`, or until its session is gone: Q24), and the **namespace** may bind its
//! source (from the moment a Register is sent until the Register is definitively refused, or the
//! directory retired the source: Q20, Q21). The lease is freed when both holds are gone, never
//! earlier. An unknown publication or unpublication outcome is re-driven with the same op id.
//!
//! # Determinism
//!
//! Sessions, bindings and sources live in `BTreeMap`s keyed by actor number; every id comes
//! from a counter.

mod control;
mod files;
mod handover;
mod horizon;
mod read;
mod session;
mod source;
mod streams;
mod write;

use std::collections::{BTreeMap, BTreeSet};

pub use files::{FileBlob, FileFacts, FileFault, FileTable, MemoryFiles, WithFiles};
pub use handover::HANDOVER_RETRY;
pub use horizon::HORIZON_PERIOD;
pub use read::Transfer;

use crate::arena::{Allocation, Arena, ArenaMemory, Lease, TicketId};
use crate::blob::{self, BlobState, DigestKind, Expected};
use crate::effect::{Effect, Outbox, Timer};
use crate::error::{DataPlaneError, InputError, NamespaceError, Reason};
use crate::ids::{Address, NodeId, OperationId, RequestId, Revision};
use crate::limits::{HOST_OPERATIONS_MAX, HOST_SESSION_OPERATIONS_MAX};
use crate::path::{DataPath, JobContext};
use crate::time::{Duration, Instant};
use crate::wire::{Capability, ChildEvent, ChildOp, DirectoryCall, DirectoryRequest, Message};

/// Op-id purposes of a binding (the low byte of its derived op ids).
pub(crate) const PURPOSE_PUBLISH: u8 = 1;
pub(crate) const PURPOSE_UNPUBLISH: u8 = 2;
pub(crate) const PURPOSE_RESERVE: u8 = 3;
pub(crate) const PURPOSE_CONTROL: u8 = 4;

/// [`HostConfig::write_deadline`]'s default: far longer than any write takes that is moving
/// (a 10 GB file from a slow disk), short enough that a stopped child gives its arena space
/// back within minutes.
pub const DEFAULT_WRITE_DEADLINE: Duration = Duration::from_secs(600);

/// How a host is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// This node.
    pub node: NodeId,
    /// This node's boot count (every host address carries it).
    pub incarnation: u64,
    /// The node's proxy (namespace calls go there).
    pub proxy: Address,
    /// Size of the arena the children map.
    pub arena_size: u64,
    /// The arena's generation: children present it at attach; never 0.
    pub arena_generation: u64,
    /// Period of the host tick.
    pub tick: Duration,
    /// Bytes per transfer chunk (at most `CHUNK_BYTES_MAX`).
    pub chunk_bytes: u32,
    /// Chunk requests a transfer keeps in flight.
    pub window: u32,
    /// A chunk not answered within this is asked for again.
    pub chunk_timeout: Duration,
    /// How often one chunk may be asked for before the transfer fails.
    pub chunk_attempts_max: u32,
    /// A transfer that is not complete within this fails (Q26).
    pub transfer_deadline: Duration,
    /// An open that waited this long in the arena queue fails `ArenaExhausted` (every open
    /// ends in a grant or an error, even when published blobs fill the arena for good).
    pub allocation_deadline: Duration,
    /// A write the child has not sealed within this of its grant is aborted: the child hears
    /// [`DataPlaneError::WriteExpired`], nothing is published, and its arena space is freed at
    /// once when the memory stages writes (the child's bytes are in a buffer of its own, so
    /// the lease may go to another write), or once the child lets go of it otherwise.
    pub write_deadline: Duration,
    /// A namespace call unanswered for this long is sent again (the proxy answers everything
    /// within its deadline unless it restarted).
    pub call_guard: Duration,
    /// Host actors (sessions, bindings, sources) are numbered from here.
    pub first_actor: u64,
    /// Most operations in progress on this host, over all sessions (reads, writes not yet
    /// published, stats, moves, removes); an open beyond it fails
    /// `LimitReached(HostOperations)`. Published writes do not count: the arena bounds them.
    pub operations_max: usize,
    /// Most operations in progress in one session; an open beyond it fails
    /// `LimitReached(SessionOperations)`, so one child cannot take the whole host's room.
    pub session_operations_max: usize,
    /// Most child sessions the host serves at once (at most
    /// [`HOST_SESSIONS_CAP`](crate::limits::HOST_SESSIONS_CAP)); a further one is refused.
    pub sessions_max: usize,
}

impl HostConfig {
    /// A configuration with sensible defaults for `node`/`incarnation`.
    pub fn new(node: NodeId, incarnation: u64, proxy: Address, arena_size: u64) -> Self {
        HostConfig {
            node,
            incarnation,
            proxy,
            arena_size,
            arena_generation: 1,
            tick: Duration::from_millis(100),
            chunk_bytes: 64 * 1024,
            window: 8,
            chunk_timeout: Duration::from_millis(500),
            chunk_attempts_max: 20,
            transfer_deadline: Duration::from_secs(60),
            allocation_deadline: Duration::from_secs(60),
            write_deadline: DEFAULT_WRITE_DEADLINE,
            call_guard: Duration::from_secs(90),
            first_actor: 10_000,
            operations_max: HOST_OPERATIONS_MAX,
            session_operations_max: HOST_SESSION_OPERATIONS_MAX,
            sessions_max: crate::limits::HOST_SESSIONS_MAX,
        }
    }
}

/// How one child session is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Fixed for the session; never 0.
    pub session_generation: u64,
    /// What the child must present at attach.
    pub capability: Capability,
    /// The run and the prefixes it may read and write.
    pub job: JobContext,
}

/// A session's life (SPEC §7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionState {
    /// Created, no child yet.
    AwaitingAttachment,
    /// A child is attached.
    Running,
    /// The child asked to close; bindings are finishing.
    Closing,
    /// Every binding finished. Never held: the session is freed in the step that closes it
    /// (its child is told `Closed`).
    Closed,
}

/// One child session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The session's address (the child sends here).
    pub address: Address,
    /// Its configuration.
    pub config: SessionConfig,
    /// Its state.
    pub state: SessionState,
    /// The attached child.
    pub child: Option<Address>,
    /// Bindings the session still tracks (operations in progress), by the child's op.
    pub ops: BTreeMap<ChildOp, u64>,
    /// Published writes of this session, by the child's op: the session no longer tracks
    /// them (they outlive it), but its child may still release or abort them (Q22). An entry
    /// goes when its binding is freed.
    pub published: BTreeMap<ChildOp, u64>,
}

/// What a binding does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A read.
    Read {
        /// Refuse if the binding no longer has this revision (H-D8).
        expected_revision: Option<Revision>,
    },
    /// A namespace query or mutation on the child's behalf (stat, move, remove).
    Control,
    /// A write.
    Write {
        /// Payload length.
        length: u64,
        /// The digest the child stores.
        digest: DigestKind,
        /// Reserve the path first.
        exclusive: bool,
    },
    /// A file blob's publication (see `files.rs`): its Register, re-driven until definitive.
    File {
        /// The persistent source's actor number.
        source: u64,
    },
    /// One side of a stream (see `streams.rs`): the binding is the endpoint.
    Stream {
        /// Writer or reader.
        role: crate::wire::StreamRole,
    },
}

/// Whether the namespace may bind a write's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NamespaceHold {
    /// It cannot (never published, refused, or retired).
    None,
    /// A Register was sent; its outcome is unknown.
    MayBind {
        /// The source.
        source: u64,
    },
    /// It binds the source at `revision` (until the directory retires it).
    Bound {
        /// The source.
        source: u64,
        /// The binding's revision.
        revision: Revision,
    },
}

/// Whether an op may create or replace the entry at its path, so that the path must be fit
/// for a new name ([`DataPath::check_new_name`]), or only names an entry that exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Naming {
    /// A read, a stat, a removal or a move's source: old names stay reachable.
    Existing,
    /// A write, a publication, a stream open or a move's destination.
    New,
}

/// Where a binding is (SPEC §9, amended by DESIGN Q19–Q24).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Write, exclusive: waiting for the reservation. Left on its answer.
    Reserving,
    /// Read: waiting for the resolve. Left on its answer.
    Resolving,
    /// Write: waiting for its lease (queued in the arena if `Binding::queued`). Left when
    /// granted, cancelled or the session goes.
    Allocating,
    /// Read: pulling chunks into a filling lease. Left when sealed or failed.
    Filling(Transfer),
    /// Write: granted, the child writes. Left at seal, abort or release.
    Writing,
    /// Write: Register sent (re-driven on an unknown outcome). Left on a definitive answer.
    Publishing,
    /// Write: bound. Left on abort (unpublish) or when the directory retires the source.
    Published,
    /// Write: Unregister with the published revision sent (re-driven on an unknown outcome).
    Unpublishing,
    /// Read: granted, the child reads. Left at release.
    Reading,
    /// Control: the namespace call is in flight (mutations are re-driven until definitive).
    Controlling,
    /// Stream: the open is at the directory, waiting for its peer. Left on its answer, a
    /// cancel, a displacement or when the child goes (the open is retracted).
    StreamOpening,
    /// Stream: matched. Left on the child's close, a displacement, or when the child goes
    /// (the stream is closed on its behalf).
    Streaming(crate::ids::StreamIncarnation),
    /// Stream: the close is at the directory. Left on its answer.
    StreamClosing,
    /// Over: waiting for the holds to go, then freed and forgotten.
    Draining,
}

/// A namespace call in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The id the proxy echoes.
    pub id: RequestId,
    /// The request (re-sent unchanged).
    pub request: DirectoryRequest,
    /// When it was (last) sent.
    pub sent_at: Instant,
    /// When the tick sends it again: the guard after a send, the next tick after an answer
    /// that left the outcome unknown (never at once: a full proxy answers at once, and an
    /// immediate re-send would spin with it).
    pub resend_at: Instant,
    /// Whether an attempt of this call may have reached the directory: one went unanswered
    /// past the guard or through a proxy restart, or was answered with an outcome the
    /// directory may have left behind (`Timeout`, a refusal without a trace). While it is
    /// false, every attempt was refused by the proxy before it dispatched anything
    /// (`never_dispatched`), so `DirectoryUnavailable` is a definitive answer: the call did
    /// not happen and never will.
    pub reached: bool,
    /// Whether the last attempt was answered (the tick re-sends it): a re-send that was not
    /// answered may have reached the directory.
    pub answered: bool,
}

/// A granted arena lease and what its header must say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseSlot {
    /// The arena lease.
    pub lease: Lease,
    /// The host's record of the header.
    pub expected: Expected,
}

impl LeaseSlot {
    /// Marks a write that will not be published Aborted in its header (from Writable or
    /// Sealed; any other state is left as it is), so that no reader takes it for a blob.
    pub(crate) fn abort_write(&self, mem: &mut dyn ArenaMemory) {
        let _ = blob::set_state(
            mem.bytes_mut(),
            &self.expected,
            &[BlobState::Writable, BlobState::Sealed],
            BlobState::Aborted,
        );
    }

    /// The lease as a child is told of it.
    pub fn view(&self) -> crate::wire::LeaseView {
        crate::wire::LeaseView {
            offset: self.lease.offset,
            length: self.lease.length,
            generation: self.expected.generation,
            digest: self.expected.digest_kind,
            access: self.expected.access,
        }
    }
}

/// One read or write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The binding's address (the proxy answers it; transfers are answered to it).
    pub address: Address,
    /// Its session (actor number).
    pub session: u64,
    /// The child.
    pub child: Address,
    /// The child's op.
    pub op: ChildOp,
    /// The resolved path.
    pub path: DataPath,
    /// Read or write.
    pub kind: Kind,
    /// Where it is.
    pub phase: Phase,
    /// Its lease, once granted.
    pub lease: Option<LeaseSlot>,
    /// Its request waiting in the arena queue.
    pub queued: Option<TicketId>,
    /// When that request was queued.
    pub queued_since: Instant,
    /// When its write lease was handed to the child (the write deadline counts from here).
    pub granted_at: Instant,
    /// The child may map the lease.
    pub child_holds: bool,
    /// The namespace may bind the source.
    pub namespace: NamespaceHold,
    /// The session still tracks it (false once published: it outlives the session).
    pub tracked: bool,
    /// The namespace call in flight.
    pub call: Option<Call>,
    /// The reservation a Register will consume (exclusive writes).
    pub reservation: Option<OperationId>,
    /// The child asked to abort a write that was publishing.
    pub abort_requested: bool,
    /// Tell the child `Aborted` once the source is retired (an unpublished write).
    pub aborted_when_retired: bool,
    /// A read of a blob this host publishes itself: the write binding whose sealed lease the
    /// child views (no lease of its own, no copy).
    pub shared: Option<u64>,
    /// A write: how many reads view its lease; it is not freed while any does.
    pub readers: u32,
    /// A write whose publication the directory refused `NoSpace` (without a trace): why, and
    /// the `Register`, while the host settles whether a copy of it may still take effect
    /// (see `write.rs`, "settling a publication refused for space").
    pub space_refused: Option<(Reason, DirectoryRequest)>,
    next_call: u64,
}

/// A published write as other hosts reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// The source's address.
    pub address: Address,
    /// The binding whose lease it serves.
    pub binding: u64,
    /// Payload offset in the arena.
    pub payload_offset: u64,
    /// Payload length.
    pub length: u64,
    /// The content digest, if the write has one.
    pub digest: Option<[u8; 32]>,
}

/// The host machine. See the module documentation.
#[derive(Clone, Debug)]
pub struct Host {
    config: HostConfig,
    arena: Arena,
    next_actor: u64,
    next_generation: u64,
    sessions: BTreeMap<u64, Session>,
    bindings: BTreeMap<u64, Binding>,
    /// The bindings that may have timed work (a queued open, a namespace call, a transfer;
    /// see [`timed_work`]): the tick and its next deadline walk these, not every binding (a
    /// host may hold hundreds of thousands of published writes at rest, and walking them all
    /// twice a tick slowed a loaded host down as they piled up). A binding is listed when it
    /// gets timed work and leaves at the first tick that finds it without (or gone);
    /// `check_invariants` checks that every binding with timed work is listed.
    timed: BTreeSet<u64>,
    sources: BTreeMap<u64, Source>,
    /// File blobs, by persistent actor number (see `files.rs`); mirrored durably by the
    /// driver.
    files: BTreeMap<u64, FileBlob>,
    /// The next persistent actor number (never reused).
    next_file: u64,
    tickets: BTreeMap<TicketId, u64>,
    /// Running digests of transfers, by binding (see `read.rs`).
    hashers: BTreeMap<u64, blake3::Hasher>,
    /// Retractions handed to the proxy when their binding finished, until answered (see
    /// `handover.rs`).
    handovers: handover::Handovers,
    /// Declaring operations done to the directory (see `horizon.rs`).
    horizon: horizon::Reporter,
    /// The time of the input being handled.
    now: Instant,
    /// The tick runs only while there is timed work (a transfer, a queued open, a namespace
    /// call, a horizon report in flight) or for one horizon period after the last input, so
    /// an idle host arms no timer (issues 14 and 18); the next input arms it again.
    /// When the tick is armed for, if it is (it sleeps until the next deadline and stops
    /// when nothing is timed).
    tick_at: Option<Instant>,
    /// When the last input other than the tick arrived.
    last_input: Instant,
    /// The directory's last `NoSpace` refusal, and when it came: for [`NO_SPACE_HOLD`] after
    /// it, new mutations are refused at once (see [`Host::directory_has_no_space`]).
    no_space: Option<(Reason, Instant)>,
}

/// How long after a directory's `NoSpace` refusal the host refuses new mutations itself,
/// without asking (unless a mutation succeeds first): a new put, rename, remove, file
/// publication or stream open hears `NoSpace` at once. After the hold the next one asks the
/// directory again. (A refused call of its own is settled first: the refusal left no trace,
/// so a copy of it may still take effect, and the outcome a child hears must be the one that
/// happens; see `write.rs`.)
pub const NO_SPACE_HOLD: Duration = Duration::from_secs(1);

/// Maps a namespace error to what a child sees (SPEC §2.4, H4 column).
pub(crate) fn child_error(error: NamespaceError) -> DataPlaneError {
    DataPlaneError::from(error)
}

/// What a child hears when the arena refuses a lease: a blob larger than the whole arena can
/// never be granted here; anything else is a full arena (a full lease table or queue).
pub(crate) fn refused_allocation(error: crate::arena::ArenaError) -> DataPlaneError {
    match error {
        crate::arena::ArenaError::CannotFit { length, size } => DataPlaneError::BlobTooLarge {
            length,
            arena: size,
        },
        _ => DataPlaneError::ArenaExhausted,
    }
}

/// Whether the proxy refused the call without dispatching it to any directory: it saw none
/// discoverable from the call's admission to its deadline (`DirectoryUnavailable`), or it had
/// no room or no request id for it.
pub(crate) fn never_dispatched(error: Option<&NamespaceError>) -> bool {
    use crate::error::Limit;
    matches!(
        error,
        Some(
            NamespaceError::DirectoryUnavailable(_)
                | NamespaceError::LimitReached(Limit::PendingRequests | Limit::RequestIds)
        )
    )
}

/// Whether the proxy answered "no answer" (the outcome at the directory is unknown), or the
/// directory refused without a trace (its operation table was full).
pub(crate) fn is_unknown_outcome(error: Option<&NamespaceError>) -> bool {
    use crate::error::Limit;
    matches!(
        error,
        Some(
            NamespaceError::Timeout
                | NamespaceError::DirectoryUnavailable(_)
                | NamespaceError::LimitReached(Limit::PendingRequests | Limit::RequestIds)
        )
    ) || error.is_some_and(NamespaceError::left_no_trace)
}

impl Host {
    /// A host with an empty arena and no session; arms the tick.
    pub fn new(config: HostConfig, now: Instant, out: &mut Outbox) -> Host {
        let host = Host {
            arena: Arena::new(config.arena_size),
            next_actor: config.first_actor,
            // Q27: the first lease never reuses the arena generation (the children check it
            // at attach, and a zeroed header must not look current).
            next_generation: config.arena_generation.saturating_add(1).max(1),
            config,
            sessions: BTreeMap::new(),
            bindings: BTreeMap::new(),
            timed: BTreeSet::new(),
            sources: BTreeMap::new(),
            files: BTreeMap::new(),
            next_file: 1,
            tickets: BTreeMap::new(),
            hashers: BTreeMap::new(),
            handovers: handover::Handovers::default(),
            horizon: horizon::Reporter::default(),
            now,
            tick_at: None,
            last_input: now,
            no_space: None,
        };
        let mut host = host;
        host.arm_tick(now, out);
        host
    }

    fn arm_tick(&mut self, now: Instant, out: &mut Outbox) {
        self.arm_tick_at(now.saturating_add(self.config.tick), out);
    }

    fn arm_tick_at(&mut self, at: Instant, out: &mut Outbox) {
        self.tick_at = Some(at);
        out.push(Effect::SetTimer {
            timer: Timer::HostTick,
            at,
        });
    }

    /// An input other than the tick arrived: it may have started timed work (or made a
    /// resend due now), so the tick runs within one tick period, whether it had stopped or
    /// was sleeping until a later deadline. The tick then works out the next deadline itself.
    fn input_arrived(&mut self, now: Instant, out: &mut Outbox) {
        self.last_input = now;
        let soon = now.saturating_add(self.config.tick);
        if self.tick_at.is_none_or(|at| at > soon) {
            self.arm_tick_at(soon, out);
        }
    }

    /// Whether the host has armed its tick (it stops when idle).
    pub fn tick_armed(&self) -> bool {
        self.tick_at.is_some()
    }

    /// When the tick is armed for.
    pub fn tick_at(&self) -> Option<Instant> {
        self.tick_at
    }

    /// The earliest instant something timed falls due: an allocation's deadline, a
    /// transfer's deadline or a chunk's timeout, a call's resend, the next offer of refused
    /// retractions, the horizon call's guard,
    /// the next horizon report while a horizon period has not passed since the last input.
    /// `None`: nothing is timed (the host is idle).
    fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let c = &self.config;
        let mut next: Option<Instant> = None;
        let mut due = |at: Instant| next = Some(next.map_or(at, |n| n.min(at)));
        for b in self
            .timed
            .iter()
            .filter_map(|actor| self.bindings.get(actor))
        {
            if b.queued.is_some() {
                due(b.queued_since.saturating_add(c.allocation_deadline));
            } else if b.phase == Phase::Writing {
                due(b.granted_at.saturating_add(c.write_deadline));
            } else if let Phase::Filling(t) = &b.phase {
                due(t.started.saturating_add(c.transfer_deadline));
                for (sent_at, _) in t.in_flight.values() {
                    due(sent_at.saturating_add(c.chunk_timeout));
                }
            }
            if let Some(call) = &b.call {
                due(call.resend_at);
            }
        }
        if let Some(at) = self.handover_retry_at() {
            due(at);
        }
        if let Some(at) = self.horizon_guard_at() {
            due(at);
        } else if now.saturating_since(self.last_input) < HORIZON_PERIOD.saturating_add(c.tick) {
            due(self.horizon_next_at());
        }
        next
    }

    /// The address of host actor `actor`.
    pub fn address(&self, actor: u64) -> Address {
        Address::new(self.config.node, self.config.incarnation, actor)
    }

    fn allocate_actor(&mut self) -> u64 {
        let actor = self.next_actor;
        self.next_actor += 1;
        actor
    }

    fn allocate_generation(&mut self) -> Option<u64> {
        let generation = self.next_generation;
        self.next_generation = generation.checked_add(1)?;
        (generation != 0).then_some(generation)
    }

    /// Creates a session awaiting its child; returns the address the child must send to, or
    /// `None` if the host serves `HostConfig::sessions_max` sessions already or a generation
    /// is 0.
    pub fn open_session(&mut self, config: SessionConfig) -> Option<Address> {
        let live = self
            .sessions
            .values()
            .filter(|s| s.state != SessionState::Closed)
            .count();
        if live
            >= self
                .config
                .sessions_max
                .min(crate::limits::HOST_SESSIONS_CAP)
            || config.session_generation == 0
            || self.config.arena_generation == 0
        {
            return None;
        }
        let actor = self.allocate_actor();
        let address = self.address(actor);
        let session = Session {
            address,
            config,
            state: SessionState::AwaitingAttachment,
            child: None,
            ops: BTreeMap::new(),
            published: BTreeMap::new(),
        };
        self.sessions.insert(actor, session);
        Some(address)
    }

    /// Creates a session for a child that presents its capability right away, attached at
    /// once: the real nodes' path, so that a connection that never proves it may attach
    /// holds no session. Validated completely before anything changes (Q28): a full host, a
    /// zero generation, another arena generation or a wrong capability is refused and creates
    /// nothing. On success the child is told `Attached` (in `out`) and the session's address
    /// is returned.
    pub fn attach_new(
        &mut self,
        config: SessionConfig,
        child: Address,
        arena_generation: u64,
        capability: Capability,
        out: &mut Outbox,
    ) -> Result<Address, crate::error::AttachmentFailure> {
        use crate::error::AttachmentFailure;
        if arena_generation != self.config.arena_generation {
            return Err(AttachmentFailure::ArenaGenerationMismatch {
                expected: self.config.arena_generation,
                found: arena_generation,
            });
        }
        if !capability.matches(&config.capability) {
            return Err(AttachmentFailure::CapabilityRejected);
        }
        let Some(session) = self.open_session(config) else {
            return Err(AttachmentFailure::SessionClosed);
        };
        let s = self
            .sessions
            .get_mut(&session.actor)
            .expect("the session was just opened");
        s.child = Some(child);
        s.state = SessionState::Running;
        let session_generation = s.config.session_generation;
        self.send_child(child, ChildEvent::Attached { session_generation }, out);
        Ok(session)
    }

    /// One frame addressed to a host actor of this node (or of an earlier incarnation of it).
    pub fn handle_message(
        &mut self,
        now: Instant,
        from: Address,
        to: Address,
        message: Message,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        let result = self.message(now, from, to, message, mem, out);
        self.input_arrived(now, out);
        self.debug_check();
        result
    }

    fn message(
        &mut self,
        now: Instant,
        from: Address,
        to: Address,
        message: Message,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        self.now = now;
        if to.node != self.config.node {
            return Err(InputError::UnexpectedMessage("a frame for another node"));
        }
        if to.incarnation == crate::ids::PERSISTENT_INCARNATION {
            // A file blob's source: it outlives the node's restarts.
            self.file_message(to, message, mem, out);
            return Ok(());
        }
        if to.incarnation != self.config.incarnation {
            // An actor of an earlier life of this node: answer for the dead.
            self.answer_for_the_dead(to, &message, out);
            return Ok(());
        }
        let actor = to.actor;
        if self.is_horizon_actor(actor) {
            if let Message::Reply(reply) = &message {
                self.horizon_reply(reply);
            }
            return Ok(());
        }
        if self.is_handover_actor(actor) {
            if let Message::Reply(reply) = &message {
                self.handover_reply(now, reply);
            }
            return Ok(());
        }
        if self.sessions.contains_key(&actor) {
            return match message {
                Message::FromChild(request) => {
                    self.session_request(now, actor, from, request, mem, out);
                    Ok(())
                }
                _ => Err(InputError::UnexpectedMessage(
                    "a non-child frame for a session",
                )),
            };
        }
        if self.bindings.contains_key(&actor) {
            match message {
                Message::Reply(reply) => self.namespace_reply(now, actor, reply, mem, out),
                Message::Chunk {
                    offset,
                    total,
                    digest,
                    bytes,
                } => {
                    self.chunk(
                        now,
                        actor,
                        offset,
                        total,
                        digest,
                        bytes.as_slice(),
                        mem,
                        out,
                    );
                }
                Message::ChunkRefused { reason } => {
                    self.chunk_refused(actor, reason, mem, out);
                }
                Message::Displaced {
                    incarnation,
                    reply_to,
                } => self.displaced(actor, incarnation, reply_to, mem, out),
                _ => {
                    return Err(InputError::UnexpectedMessage(
                        "an unexpected frame for a binding",
                    ));
                }
            }
            return Ok(());
        }
        // A source, or an actor that no longer exists: sources answer Retire and chunk
        // requests for themselves, and the host answers for those that are gone.
        self.source_message(to, message, mem, out);
        Ok(())
    }

    /// The tick: transfer retries and deadlines, guards of namespace calls.
    pub fn handle_timer(
        &mut self,
        now: Instant,
        timer: Timer,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        let result = self.tick(now, timer, mem, out);
        self.debug_check();
        result
    }

    fn tick(
        &mut self,
        now: Instant,
        timer: Timer,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        if timer != Timer::HostTick {
            return Err(InputError::UnexpectedTimer(timer));
        }
        self.now = now;
        self.tick_at = None;
        // Only bindings with something timed: a published write at rest costs the tick
        // nothing (a host may hold hundreds of thousands of them).
        let actors: Vec<u64> = self
            .timed
            .iter()
            .copied()
            .filter(|actor| self.bindings.get(actor).is_some_and(timed_work))
            .collect();
        for actor in actors {
            self.allocation_tick(now, actor, mem, out);
            self.write_tick(now, actor, mem, out);
            self.transfer_tick(now, actor, mem, out);
            let due = self
                .bindings
                .get(&actor)
                .and_then(|b| b.call.as_ref())
                .is_some_and(|call| now >= call.resend_at);
            if due {
                if let Some(call) = self.bindings.get_mut(&actor).and_then(|b| b.call.as_mut())
                    && !call.answered
                {
                    // Unanswered past the guard: it may be at the directory.
                    call.reached = true;
                }
                self.resend_call(now, actor, out);
            }
        }
        self.timed
            .retain(|actor| self.bindings.get(actor).is_some_and(timed_work));
        self.retry_handovers(now, out);
        self.report_horizon(now, out);
        // Sleep until the next deadline, at most once per tick period (a deadline is met
        // within one period, as with a fixed tick); idle once nothing is timed and a horizon
        // period passed since the last input (the horizon report after the last completed
        // operation has then been made). An input re-arms it (`input_arrived`).
        if let Some(at) = self.next_deadline(now) {
            self.arm_tick_at(at.max(now.saturating_add(self.config.tick)), out);
        }
        Ok(())
    }

    /// An open waiting too long for the arena fails; its request leaves the queue.
    fn allocation_tick(
        &mut self,
        now: Instant,
        actor: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let deadline = self.config.allocation_deadline;
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let Some(ticket) = b.queued else {
            return;
        };
        if now.saturating_since(b.queued_since) < deadline {
            return;
        }
        b.queued = None;
        self.arena.cancel(ticket);
        self.tickets.remove(&ticket);
        // Requests behind it may fit now.
        let grants = self.arena.grant_waiting();
        self.fail(actor, DataPlaneError::ArenaExhausted, mem, out);
        self.pending_grants(grants, mem, out);
    }

    /// A write the child has not sealed within the write deadline is aborted (see
    /// [`HostConfig::write_deadline`]).
    fn write_tick(
        &mut self,
        now: Instant,
        actor: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let deadline = self.config.write_deadline;
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        if b.phase != Phase::Writing || now.saturating_since(b.granted_at) < deadline {
            return;
        }
        if let Some(slot) = b.lease {
            slot.abort_write(mem);
        }
        if mem.stages_writes() {
            // The child writes a buffer of its own: the lease is no longer its to touch.
            b.child_holds = false;
        }
        let error = DataPlaneError::WriteExpired {
            after_secs: deadline.as_millis() / 1_000,
        };
        self.fail(actor, error, mem, out);
    }

    /// The node's proxy restarted (now at `proxy`) and lost its pending table: every namespace
    /// call in flight and every retraction handed over to it is sent again.
    pub fn proxy_restarted(&mut self, now: Instant, proxy: Address, out: &mut Outbox) {
        self.now = now;
        self.input_arrived(now, out);
        self.config.proxy = proxy;
        self.horizon_proxy_restarted();
        let actors: Vec<u64> = self
            .bindings
            .iter()
            .filter(|(_, b)| b.call.is_some())
            .map(|(a, _)| *a)
            .collect();
        for actor in actors {
            if let Some(call) = self.bindings.get_mut(&actor).and_then(|b| b.call.as_mut())
                && !call.answered
            {
                // The old proxy may have dispatched it.
                call.reached = true;
            }
            self.resend_call(now, actor, out);
        }
        self.handovers_proxy_restarted(out);
    }

    // ------------------------------------------------------------------ shared helpers

    fn send_child(&self, child: Address, event: ChildEvent, out: &mut Outbox) {
        out.send(child, Message::ToChild(event));
    }

    /// Sends a namespace request for binding `actor` through the proxy.
    fn call(&mut self, now: Instant, actor: u64, request: DirectoryRequest, out: &mut Outbox) {
        self.call_again(now, actor, request, false, out);
    }

    /// [`Host::call`], carrying whether an earlier attempt may have reached the directory.
    fn call_again(
        &mut self,
        now: Instant,
        actor: u64,
        request: DirectoryRequest,
        reached: bool,
        out: &mut Outbox,
    ) {
        let proxy = self.config.proxy;
        let Some(binding) = self.bindings.get_mut(&actor) else {
            return;
        };
        binding.next_call += 1;
        let id = RequestId(binding.next_call);
        let call = DirectoryCall {
            request_id: id,
            reply_to: binding.address,
            request: request.clone(),
        };
        binding.call = Some(Call {
            id,
            request,
            sent_at: now,
            resend_at: now.saturating_add(self.config.call_guard),
            reached,
            answered: false,
        });
        self.timed.insert(actor);
        out.send(proxy, Message::ProxyCall(call));
    }

    /// The call of binding `actor` was answered with an unknown outcome: the next tick sends
    /// it again (with the same op id).
    fn resend_on_tick(&mut self, actor: u64) {
        if let Some(call) = self.bindings.get_mut(&actor).and_then(|b| b.call.as_mut()) {
            call.resend_at = self.now;
            call.answered = true;
        }
    }

    fn resend_call(&mut self, now: Instant, actor: u64, out: &mut Outbox) {
        let request = self
            .bindings
            .get(&actor)
            .and_then(|b| b.call.as_ref())
            .map(|c| (c.request.clone(), c.reached));
        if let Some((request, reached)) = request {
            self.call_again(now, actor, request, reached, out);
        }
    }

    /// The op ids a binding uses at the directory: derived from its address, so a retry by the
    /// same binding is idempotent and a new binding is a new operation.
    fn op_id(&self, actor: u64, purpose: u8) -> OperationId {
        let c = &self.config;
        OperationId(
            (u128::from(c.node.0) << 96)
                | (u128::from(c.incarnation & 0xffff_ffff) << 64)
                | (u128::from(actor) << 8)
                | u128::from(purpose),
        )
    }

    /// Asks the arena for a lease for binding `actor`; grants at once or queues.
    fn allocate(
        &mut self,
        now: Instant,
        actor: u64,
        length: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        match self.arena.allocate(length) {
            Ok(Allocation::Leased(lease)) => self.granted(now, actor, lease, mem, out),
            Ok(Allocation::Queued(ticket)) => {
                self.tickets.insert(ticket, actor);
                if let Some(b) = self.bindings.get_mut(&actor) {
                    b.phase = Phase::Allocating;
                    b.queued = Some(ticket);
                    b.queued_since = self.now;
                    self.timed.insert(actor);
                }
            }
            Err(error) => self.fail(actor, refused_allocation(error), mem, out),
        }
    }

    /// A lease for binding `actor`: install its header and move on.
    fn granted(
        &mut self,
        now: Instant,
        actor: u64,
        lease: Lease,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let waiting = |b: &Binding| {
            b.lease.is_none() && matches!(b.phase, Phase::Allocating | Phase::Filling(_))
        };
        let Some(kind) = self
            .bindings
            .get(&actor)
            .filter(|b| waiting(b))
            .map(|b| b.kind)
        else {
            // Q23: the binding finished while the request waited; the lease goes back.
            self.free_lease(lease, None, mem, out);
            return;
        };
        if let Some(b) = self.bindings.get_mut(&actor) {
            b.queued = None;
        }
        let Some(generation) = self.allocate_generation() else {
            self.free_lease(lease, None, mem, out);
            self.fail(actor, DataPlaneError::ArenaExhausted, mem, out);
            return;
        };
        let (access, digest) = match kind {
            Kind::Read { .. } | Kind::Control | Kind::File { .. } | Kind::Stream { .. } => {
                (blob::BlobAccess::ReadOnly, DigestKind::None)
            }
            Kind::Write { digest, .. } => (blob::BlobAccess::Writable, digest),
        };
        let expected = Expected {
            offset: lease.offset,
            length: lease.length,
            generation,
            access,
            digest_kind: digest,
        };
        let installed = if mem.stages_writes() {
            blob::install_staged(mem.bytes_mut(), &expected)
        } else {
            blob::install(mem.bytes_mut(), &expected)
        };
        if let Err(error) = installed {
            self.free_lease(lease, None, mem, out);
            self.fail(actor, DataPlaneError::Blob(error), mem, out);
            return;
        }
        if let Some(b) = self.bindings.get_mut(&actor) {
            b.lease = Some(LeaseSlot { lease, expected });
        }
        match kind {
            Kind::Read { .. } => self.start_transfer(now, actor, mem, out),
            Kind::Write { .. } => self.write_granted(actor, out),
            Kind::Control | Kind::File { .. } | Kind::Stream { .. } => {}
        }
    }

    /// Returns a lease to the arena and serves waiting requests. With the host's record of the
    /// header (`installed`), the header is first marked [`BlobState::Released`], so a child that
    /// still maps the region sees that its view is gone; a header the child corrupted is left as
    /// it is (the lease is ours either way).
    fn free_lease(
        &mut self,
        lease: Lease,
        installed: Option<&Expected>,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        mem.reclaim(&lease);
        if let Some(expected) = installed {
            let _ = blob::set_state(
                mem.bytes_mut(),
                expected,
                &[
                    BlobState::Vacant,
                    BlobState::Filling,
                    BlobState::Writable,
                    BlobState::Sealed,
                    BlobState::Aborted,
                    BlobState::Released,
                ],
                BlobState::Released,
            );
        }
        let grants = self.arena.release(lease.ring).unwrap_or_default();
        self.pending_grants(grants, mem, out);
    }

    fn pending_grants(
        &mut self,
        grants: Vec<(TicketId, Lease)>,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        for (ticket, lease) in grants {
            let actor = self.tickets.remove(&ticket);
            match actor {
                Some(actor) => self.granted(self.now, actor, lease, mem, out),
                None => self.free_lease(lease, None, mem, out),
            }
        }
    }

    /// The binding failed: the child hears why; what it holds drains.
    fn fail(
        &mut self,
        actor: u64,
        error: DataPlaneError,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let (child, op) = (b.child, b.op);
        b.phase = Phase::Draining;
        self.send_child(child, ChildEvent::Failed { op, error }, out);
        self.try_finish(actor, mem, out);
    }

    /// Frees and forgets binding `actor` once it is draining and nobody holds its lease.
    fn try_finish(&mut self, actor: u64, mem: &mut dyn ArenaMemory, out: &mut Outbox) {
        let Some(b) = self.bindings.get(&actor) else {
            return;
        };
        if b.phase != Phase::Draining
            || b.child_holds
            || b.namespace != NamespaceHold::None
            || b.readers > 0
        {
            return;
        }
        let Some(b) = self.bindings.remove(&actor) else {
            return;
        };
        if let Some(write) = b.shared {
            // The lease this read viewed may be free now.
            if let Some(w) = self.bindings.get_mut(&write) {
                w.readers = w.readers.saturating_sub(1);
            }
            self.try_finish(write, mem, out);
        }
        self.hashers.remove(&actor);
        if let Some(slot) = b.lease {
            self.free_lease(slot.lease, Some(&slot.expected), mem, out);
        }
        if let Some(ticket) = b.queued {
            // Q23/Q25: the request leaves the arena queue at once, and the requests behind it
            // that fit now are granted.
            self.arena.cancel(ticket);
            self.tickets.remove(&ticket);
            let grants = self.arena.grant_waiting();
            self.pending_grants(grants, mem, out);
        }
        // A reserve still in flight may have been applied: release it too (a release of an
        // unknown reservation is remembered, so a late reserve is refused: DESIGN Q4).
        let reserving = b
            .call
            .as_ref()
            .is_some_and(|c| c.request.kind() == crate::wire::RequestKind::ReserveBlob);
        let reservation = b
            .reservation
            .or_else(|| reserving.then(|| self.op_id(actor, PURPOSE_RESERVE)));
        if let Some(reservation) = reservation {
            // A reservation the write never consumed: release it.
            let release = DirectoryRequest::ReleaseBlobReservation {
                path: b.path.clone(),
                operation: reservation,
            };
            self.hand_over(release, out);
        }
        if b.call.is_some() {
            // Whatever the proxy still holds for this binding: drop it, keeping retractions.
            out.send(
                self.config.proxy,
                Message::ProxyCancel {
                    reply_to: b.address,
                },
            );
        }
        if let Some(session) = self.sessions.get_mut(&b.session) {
            if session.ops.get(&b.op) == Some(&actor) {
                session.ops.remove(&b.op);
            }
            if session.published.get(&b.op) == Some(&actor) {
                session.published.remove(&b.op);
            }
        }
        self.maybe_closed(b.session, out);
    }

    /// Hands `retraction` for binding `actor` (a stream's cancel or close on the child's
    /// behalf) to the proxy, and drops whatever the proxy still holds for the binding (the
    /// binding is going).
    fn retract(&mut self, actor: u64, retraction: DirectoryRequest, out: &mut Outbox) {
        let Some(b) = self.bindings.get(&actor) else {
            return;
        };
        let reply_to = b.address;
        out.send(self.config.proxy, Message::ProxyCancel { reply_to });
        self.hand_over(retraction, out);
    }

    // ------------------------------------------------------------------ accessors

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The arena allocator.
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Every session, by actor.
    pub fn sessions(&self) -> impl Iterator<Item = (&u64, &Session)> {
        self.sessions.iter()
    }

    /// A consistent sample of the arena (bytes used and free, the largest free range, live
    /// leases, queued requests, allocations refused so far).
    pub fn arena_stats(&self) -> crate::arena::ArenaStats {
        self.arena.stats()
    }

    /// Operations in progress over all sessions (what `operations_max` bounds).
    pub fn operations_in_progress(&self) -> usize {
        self.sessions.values().map(|s| s.ops.len()).sum()
    }

    /// Every binding, by actor.
    pub fn bindings(&self) -> impl Iterator<Item = (&u64, &Binding)> {
        self.bindings.iter()
    }

    /// Every live source, by actor.
    pub fn sources(&self) -> impl Iterator<Item = (&u64, &Source)> {
        self.sources.iter()
    }

    /// The live source with actor number `actor`.
    pub fn source(&self, actor: u64) -> Option<&Source> {
        self.sources.get(&actor)
    }

    /// The binding with actor number `actor`.
    pub fn binding(&self, actor: u64) -> Option<&Binding> {
        self.bindings.get(&actor)
    }

    /// In debug builds, every invariant after each input while the host is small enough for
    /// that to be cheap ([`crate::limits::DEBUG_CHECK_STATE_MAX`]).
    fn debug_check(&self) {
        if cfg!(debug_assertions)
            && self.bindings.len() + self.sessions.len() + self.sources.len()
                <= crate::limits::DEBUG_CHECK_STATE_MAX
            && let Err(broken) = self.check_invariants()
        {
            panic!("host invariant broken after an input: {broken}");
        }
    }

    /// Checks the host's invariants (S28, S30 and lease bookkeeping). For tests and the
    /// simulator.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.arena.check_invariants()?;
        self.check_files()?;
        self.check_handovers()?;
        // Sorted vectors, not maps: this walk runs after every step of the simulator's hosts,
        // which hold thousands of bindings in long runs.
        // (ring, the lease as the binding holds it, the binding): compared with the arena's
        // leases (by ring) in one walk once sorted.
        let mut leased: Vec<(crate::arena::RingId, &Lease, u64)> =
            Vec::with_capacity(self.arena.live_count());
        let mut shared: Vec<u64> = self.bindings.values().filter_map(|b| b.shared).collect();
        shared.sort_unstable();
        let readers_of = |write: &u64| {
            let first = shared.partition_point(|w| w < write);
            let end = shared.partition_point(|w| w <= write);
            u32::try_from(end - first).unwrap_or(u32::MAX)
        };
        for (actor, b) in &self.bindings {
            if let Some(slot) = &b.lease {
                leased.push((slot.lease.ring, &slot.lease, *actor));
            }
            if timed_work(b) && !self.timed.contains(actor) {
                return Err(format!(
                    "binding {actor} has timed work the tick does not list"
                ));
            }
            if b.child_holds && b.lease.is_none() && b.shared.is_none() {
                return Err(format!("binding {actor}: the child holds no lease"));
            }
            if let Some(write) = b.shared {
                let viewed = self.bindings.get(&write).is_some_and(|w| w.lease.is_some());
                if b.lease.is_some() || !viewed {
                    return Err(format!(
                        "read {actor} shares {write}'s lease, which it cannot (own lease, or none to share)"
                    ));
                }
            }
            let sharing = readers_of(actor);
            if sharing != b.readers {
                return Err(format!(
                    "binding {actor} counts {} readers, {sharing} read bindings view it",
                    b.readers
                ));
            }
            if let NamespaceHold::MayBind { source } | NamespaceHold::Bound { source, .. } =
                b.namespace
                && b.lease.is_none()
            {
                return Err(format!("binding {actor}: source {source} without a lease"));
            }
        }
        leased.sort_unstable_by_key(|(ring, _, _)| *ring);
        if let Some(twice) = leased.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!("two bindings hold {:?}", twice[0].0));
        }
        // Both sorted by ring: every held lease is live in the arena as held.
        let mut live = self.arena.leases().peekable();
        for (ring, lease, actor) in &leased {
            while live.next_if(|l| l.ring < *ring).is_some() {}
            if live.peek() != Some(lease) {
                return Err(format!(
                    "binding {actor} holds {lease:?}, not live in the arena"
                ));
            }
        }
        if leased.len() != self.arena.live_count() {
            return Err(format!(
                "{} leases live, {} held by bindings",
                self.arena.live_count(),
                leased.len()
            ));
        }
        for (actor, s) in &self.sources {
            let ok = self.bindings.get(&s.binding).is_some_and(|b| {
                matches!(b.namespace, NamespaceHold::MayBind { source } | NamespaceHold::Bound { source, .. } if source == *actor)
            });
            if !ok {
                return Err(format!(
                    "source {actor} without a binding that may be bound"
                ));
            }
        }
        for (actor, session) in &self.sessions {
            let running = session.state == SessionState::Running;
            if running && session.child.is_none() {
                return Err(format!("session {actor} runs without a child"));
            }
            for (op, binding) in &session.ops {
                let tracked = self
                    .bindings
                    .get(binding)
                    .is_some_and(|b| b.tracked && b.op == *op && b.session == *actor);
                if !tracked {
                    return Err(format!(
                        "session {actor} tracks {op:?} -> {binding}, which does not track it"
                    ));
                }
            }
            for (op, binding) in &session.published {
                let published = self
                    .bindings
                    .get(binding)
                    .is_some_and(|b| !b.tracked && b.op == *op && b.session == *actor);
                if !published {
                    return Err(format!(
                        "session {actor} lists {op:?} -> {binding} as published, which it is not"
                    ));
                }
            }
            if session.ops.len() > self.config.session_operations_max {
                return Err(format!(
                    "session {actor} has {} operations in progress, the bound is {}",
                    session.ops.len(),
                    self.config.session_operations_max
                ));
            }
        }
        let in_progress = self.operations_in_progress();
        if in_progress > self.config.operations_max {
            return Err(format!(
                "{in_progress} operations in progress, the bound is {}",
                self.config.operations_max
            ));
        }
        for (actor, b) in &self.bindings {
            // Every binding is reachable from its session while the session lives, and one the
            // session does not track holds a lease: so the bindings are bounded by the
            // operations in progress plus the arena's leases.
            if let Some(session) = self.sessions.get(&b.session) {
                let index = if b.tracked {
                    &session.ops
                } else {
                    &session.published
                };
                if index.get(&b.op) != Some(actor) {
                    return Err(format!(
                        "binding {actor} ({:?}) is not listed by its session",
                        b.op
                    ));
                }
            }
            if !b.tracked && b.lease.is_none() {
                return Err(format!("binding {actor} is untracked and holds no lease"));
            }
        }
        Ok(())
    }
}

impl Host {
    /// Starts a binding for the child's `op` in `session` (a fresh actor, tracked by the
    /// session) and returns its actor number.
    fn start_binding(
        &mut self,
        session: u64,
        child: Address,
        op: ChildOp,
        path: DataPath,
        kind: Kind,
        phase: Phase,
    ) -> u64 {
        let actor = self.allocate_actor();
        let binding = new_binding(self.address(actor), session, child, op, path, kind, phase);
        self.bindings.insert(actor, binding);
        if let Some(s) = self.sessions.get_mut(&session) {
            s.ops.insert(op, actor);
        }
        actor
    }
}

/// Whether binding `b` has work the tick times: a queued open (its allocation deadline), a
/// namespace call (its resend), a granted write (its deadline), a transfer (its deadline and
/// chunk timeouts).
pub(crate) fn timed_work(b: &Binding) -> bool {
    b.queued.is_some() || b.call.is_some() || matches!(b.phase, Phase::Filling(_) | Phase::Writing)
}

/// A binding with nothing decided yet.
pub(crate) fn new_binding(
    address: Address,
    session: u64,
    child: Address,
    op: ChildOp,
    path: DataPath,
    kind: Kind,
    phase: Phase,
) -> Binding {
    Binding {
        address,
        session,
        child,
        op,
        path,
        kind,
        phase,
        lease: None,
        queued: None,
        queued_since: Instant::ZERO,
        granted_at: Instant::ZERO,
        child_holds: false,
        namespace: NamespaceHold::None,
        tracked: true,
        call: None,
        reservation: None,
        abort_requested: false,
        aborted_when_retired: false,
        shared: None,
        readers: 0,
        space_refused: None,
        next_call: 0,
    }
}

/// A short reason.
pub(crate) fn reason(text: &str) -> Reason {
    Reason::new(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Capability;

    /// A host of node 1 with a 64 KiB arena, and the outbox its start wrote to.
    fn small_host() -> (Host, Outbox) {
        let proxy = Address::new(NodeId(1), 1, 5);
        let mut out = Outbox::new();
        let host = Host::new(
            HostConfig::new(NodeId(1), 1, proxy, 1 << 16),
            Instant::ZERO,
            &mut out,
        );
        (host, out)
    }

    /// The invariant walk itself must see a session that lists, as published, a binding of
    /// another operation (a self-check that passes everything would hide every bug it is for).
    #[test]
    fn the_invariant_walk_sees_a_published_listing_of_another_operation() {
        let (mut host, mut out) = small_host();
        let capability = Capability([7; 32]);
        let data = DataPath::new("/data").unwrap();
        let job = JobContext::new("r1", vec![data.clone()], vec![data.clone()]).unwrap();
        let config = SessionConfig {
            session_generation: 1,
            capability,
            job,
        };
        let child = Address::new(NodeId(1), 1, 100);
        let session = host
            .attach_new(config, child, 1, capability, &mut out)
            .unwrap();
        assert_eq!(host.check_invariants(), Ok(()));
        let actor = host.allocate_actor();
        let mut binding = new_binding(
            host.address(actor),
            session.actor,
            child,
            ChildOp(1),
            data,
            Kind::Control,
            Phase::Reading,
        );
        binding.tracked = false;
        host.bindings.insert(actor, binding);
        host.sessions
            .get_mut(&session.actor)
            .unwrap()
            .published
            .insert(ChildOp(2), actor);
        let broken = host.check_invariants().unwrap_err();
        assert!(broken.contains("as published, which it is not"), "{broken}");
    }

    /// The walk sees a binding with timed work that the tick's list leaves out (the tick would
    /// never time it: its deadline or resend would never come).
    #[test]
    fn the_invariant_walk_sees_timed_work_the_tick_does_not_list() {
        let (mut host, _) = small_host();
        let actor = host.allocate_actor();
        let mut binding = new_binding(
            host.address(actor),
            0,
            Address::new(NodeId(1), 1, 100),
            ChildOp(1),
            DataPath::new("/data").unwrap(),
            Kind::Control,
            Phase::Controlling,
        );
        binding.queued = Some(TicketId(1));
        host.bindings.insert(actor, binding);
        let broken = host.check_invariants().unwrap_err();
        assert!(
            broken.contains("timed work the tick does not list"),
            "{broken}"
        );
        host.timed.insert(actor);
        assert_eq!(host.check_invariants(), Ok(()));
    }

    /// The walk that compares the bindings' leases with the arena's (both by ring) sees a
    /// binding whose lease differs from the arena's, one whose lease is not live, and two
    /// bindings holding one lease.
    #[test]
    fn the_invariant_walk_sees_leases_the_arena_does_not_hold() {
        let (mut host, _) = small_host();
        let data = DataPath::new("/data").unwrap();
        let add = |host: &mut Host, lease: Lease| {
            let actor = host.allocate_actor();
            let mut binding = new_binding(
                host.address(actor),
                0,
                Address::new(NodeId(1), 1, 100),
                ChildOp(actor),
                data.clone(),
                Kind::Control,
                Phase::Reading,
            );
            binding.tracked = false;
            binding.lease = Some(LeaseSlot {
                lease,
                expected: Expected {
                    offset: lease.offset,
                    length: lease.length,
                    generation: 1,
                    access: crate::kinds::BlobAccess::ReadOnly,
                    digest_kind: DigestKind::None,
                },
            });
            host.bindings.insert(actor, binding);
        };
        let lease = match host.arena.allocate(10) {
            Ok(Allocation::Leased(l)) => l,
            other => panic!("{other:?}"),
        };
        let mut whole = host.clone();
        add(&mut whole, lease);
        assert_eq!(whole.check_invariants(), Ok(()));
        let mut longer = host.clone();
        add(
            &mut longer,
            Lease {
                length: 11,
                ..lease
            },
        );
        let broken = longer.check_invariants().unwrap_err();
        assert!(broken.contains("not live in the arena"), "{broken}");
        let mut unknown = whole.clone();
        add(
            &mut unknown,
            Lease {
                ring: crate::arena::RingId(99),
                ..lease
            },
        );
        let broken = unknown.check_invariants().unwrap_err();
        assert!(broken.contains("not live in the arena"), "{broken}");
        let mut twice = whole;
        add(&mut twice, lease);
        let broken = twice.check_invariants().unwrap_err();
        assert!(broken.contains("two bindings hold"), "{broken}");
    }
}

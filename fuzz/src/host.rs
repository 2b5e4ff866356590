//! The world of `host_session`: two nodes, each with a real proxy, a real host and the arena
//! memory its children map, and a real directory — wired by a network the fuzzer schedules —
//! plus hostile children and a hostile network.
//!
//! The machines are `dataplane_testkit::hosts::Cluster`, the same cluster core's host scenarios
//! (`core/tests/host_scenarios.rs`) drive; this file keeps the network (frames in flight,
//! delivered, dropped or duplicated as the input picks), who listens at which address, the
//! children, the hostile actions and the checks. What the fuzzer's [`Input`] drives:
//!
//! * child requests of every `ChildRequest` variant, from a session's child or from a stranger
//!   on the same node: attach with the right or a wrong arena generation and capability; opens,
//!   stat, move and remove with logical paths from a small pool (authorized, unauthorized,
//!   `/runs/self`, invalid) or arbitrary strings; lengths from a pool around the arena size or
//!   arbitrary; seal, abort, release, cancel and close on a small pool of op ids;
//! * a child behaving properly: filling and sealing a granted write (then `Seal`), aborting it
//!   in the header (then `Abort`) — so that publication and remote reads are reached;
//! * a child scribbling: arbitrary bytes at an offset inside the 128-byte header of a granted
//!   lease, inside its payload, or anywhere in the arena; or a chosen header field (magic,
//!   version, access, digest kind, generation, length, state word, digest, reserved) set to an
//!   arbitrary value;
//! * the network: delivering, dropping and duplicating any frame in flight (host ↔ proxy ↔
//!   directory, chunk requests and chunks between the hosts, retirements), proxy restarts, and
//!   time advancing (host ticks with transfer, allocation and call-guard deadlines, proxy
//!   deadlines, directory retries);
//! * forged frames to host actors: proxy replies with arbitrary bodies (any variant, `Ok`
//!   values pointing at real or dead sources with right or wrong lengths, every namespace
//!   error) and request ids (the call's, the previous one, any); `ChunkRequest` with arbitrary
//!   offset and length; `Chunk` with arbitrary offset, total, digest and bytes to a reading
//!   binding; `ChunkRefused`; `Retire`; `Displaced`; frames of the wrong kind, for another node
//!   or for an earlier incarnation.
//!
//! An [`Input`] starts with a canned prelude (none; a published write; a published write read
//! by the other node; a busy mix) so that short inputs start from deep states.
//!
//! Checked after every step: `Host::check_invariants()` on both hosts (the arena's own check —
//! no two live leases overlap, leases and free ranges tile the arena — and the bookkeeping:
//! every live lease is held by exactly one binding, holds imply a lease, sources have a binding
//! that may be bound, sessions track only bindings that track them); no request waits in the
//! queue of an arena without a live lease; the proxies' `check_invariants()` and the directory's
//! `check_invariants_fast()`; every lease granted to a child lies inside the arena and carries a
//! generation never granted before on that node (and not the arena's); the host asks for
//! nothing but sends and timers. `handle_message` returns `Ok` or a typed `InputError`; a panic anywhere is a crash.
//!
//! **The leak check** ([`World::finish`]) — after the actions: every running session is closed
//! by its child; then, repeatedly (until nothing is left, at most [`FINISH_ROUNDS`] rounds), the
//! network drops everything in flight, every namespace call a binding has in flight is answered
//! definitively (a reply with the call's id and kind: `Register`/`Unregister` succeed or are
//! refused as the input chose, everything else is refused), and every live source is sent
//! `Retire` (the directory retiring it). Afterwards each host must hold no binding, no source,
//! no live lease and no queued allocation. What this assumes: a lease is legitimately kept only
//! while a child may map it (gone once its session closed), while a namespace call about it is
//! undecided (answered here), or while the namespace may bind its source (until it is retired;
//! published writes keep their leases until then). Anything else left is a leak.

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use dataplane_core::arena::BLOB_HEADER_BYTES;
use dataplane_core::blob::{self, DigestKind, Expected};
use dataplane_core::error::{Limit, NamespaceError, Reason};
use dataplane_core::host::{HostConfig, Phase, SessionConfig, SessionState};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::path::{DataPath, JobContext};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    BlobBinding, Capability, ChildEvent, ChildOp, ChildRequest, ChunkBytes, ChunkRefusal,
    Descriptor, DirectoryReply, EntryKind, LeaseView, Message, MutationReceipt, NamespaceNode,
    ReplyBody, RequestKind, StreamMatch, StreamRole,
};
use dataplane_testkit::dir::DIRECTORY;
use dataplane_testkit::hosts::{Cluster, Due, Frame, Setup};

// =============================================================================================
// Constants

/// Nodes 1 and 2 (node 0 runs the directory).
pub const NODES: usize = 2;
/// A small arena: allocations queue, and some lengths cannot fit at all.
pub const ARENA: u64 = 16 * 1024;
/// Host actors are numbered from here; children are actors 100.., strangers actor 50.
pub const FIRST_ACTOR: u64 = 10_000;
/// The arena generation the children must present.
pub const ARENA_GENERATION: u64 = 5;
/// The capability of every session.
pub const CAPABILITY: Capability = Capability([7; 32]);
/// Actions beyond this are ignored.
pub const ACTIONS_MAX: usize = 256;
/// Rounds of the leak check.
pub const FINISH_ROUNDS: usize = 12;
/// Frames one `Settle` delivers at most.
const SETTLE_MAX: usize = 4096;
const SESSIONS_MAX: usize = 6;
const GRANTS_KEPT: usize = 16;
const STRANGER_ACTOR: u64 = 50;
const CHILD_ACTOR: u64 = 100;
/// Nobody listens here (reply addresses of forged frames).
const NOBODY: Address = Address::new(NodeId(77), 1, 1);

/// Logical paths: authorized for read and write, `/runs/self`, read-only, unauthorized,
/// invalid.
pub const PATHS: [&str; 12] = [
    "/data/x",
    "/data/y",
    "/runs/self/out",
    "/runs/r1/a",
    "/shared/z",
    "/runs/r2/z",
    "/etc/passwd",
    "relative",
    "/data",
    "/data/x/../y",
    "/runs/self",
    "",
];
/// Lengths: empty, within a chunk, several chunks, most of the arena, the whole arena,
/// too large, overflowing.
pub const LENGTHS: [u64; 10] = [0, 1, 200, 700, 3000, 6000, 16_000, 16_256, 20_000, u64::MAX];
/// Offsets of the header fields (blob.rs layout).
const FIELDS: [(usize, usize); 10] = [
    (0, 4),
    (4, 2),
    (6, 1),
    (7, 1),
    (8, 8),
    (16, 8),
    (24, 8),
    (32, 8),
    (56, 8),
    (64, 8),
];

fn job() -> JobContext {
    let p = |s: &str| DataPath::new(s).unwrap();
    JobContext::new(
        "r1",
        vec![p("/data"), p("/runs/r1"), p("/shared")],
        vec![p("/data"), p("/runs/r1")],
    )
    .unwrap()
}

fn node_id(n: usize) -> NodeId {
    NodeId(n as u64 + 1)
}

// =============================================================================================
// The input

/// A logical path.
#[derive(Clone, Debug, Arbitrary)]
pub enum PathPick {
    Pool(u8),
    Raw(String),
}

/// A payload length.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum LenPick {
    Pool(u8),
    Raw(u64),
}

/// The arena generation presented at attach.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum GenPick {
    Right,
    Raw(u64),
}

/// A child request (ops fold into a pool of 8).
#[derive(Clone, Debug, Arbitrary)]
pub enum Req {
    Attach {
        generation: GenPick,
        capability: bool,
    },
    OpenRead {
        op: u8,
        path: PathPick,
        expected: Option<u8>,
    },
    OpenWrite {
        op: u8,
        path: PathPick,
        length: LenPick,
        blake3: bool,
        exclusive: bool,
    },
    Seal {
        op: u8,
    },
    Abort {
        op: u8,
    },
    Release {
        op: u8,
    },
    Cancel {
        op: u8,
    },
    Stat {
        op: u8,
        path: PathPick,
    },
    Move {
        op: u8,
        from: PathPick,
        to: PathPick,
        replace: bool,
    },
    Remove {
        op: u8,
        path: PathPick,
        expected: Option<u8>,
    },
    Close,
    /// A file blob (issue 17): `f0`/`f1` exist on every node, `f2` does not, and a raw name
    /// tries everything else.
    PublishFile {
        op: u8,
        path: PathPick,
        file: FilePick,
    },
    /// One side of a stream (issue 17).
    OpenStream {
        op: u8,
        path: PathPick,
        source: bool,
        replace: bool,
        ensure: bool,
    },
    CloseStream {
        op: u8,
    },
}

/// Which file a child names.
#[derive(Clone, Debug, Arbitrary)]
pub enum FilePick {
    Known(u8),
    Raw(String),
}

/// Where a child scribbles.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Target {
    /// Inside the header of the i-th lease a binding holds.
    Header { pick: u8, offset: u8 },
    /// Inside the i-th lease's payload (or just past it).
    Payload { pick: u8, offset: u16 },
    /// Anywhere in the arena.
    Anywhere { offset: u16 },
}

/// A host actor on a node.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum ActorPick {
    Source(u8),
    Binding(u8),
    Session(u8),
    /// An actor number near the host's (dead, unborn, the hand-over address).
    Raw(u8),
    /// An actor of an earlier incarnation of the node.
    Old(u8),
    /// An actor of a node the host is not.
    Elsewhere(u8),
}

/// The source a forged `Resolved(Ok)` names.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum SrcPick {
    /// A live source of the same node (a local copy).
    Own(u8),
    /// A live source of the other node.
    Other(u8),
    /// A dead or unborn actor on a node.
    Dead { node: bool, actor: u8 },
    /// Nobody.
    Nobody,
}

/// The length a forged `Resolved(Ok)` names.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum ResolvedLen {
    /// The named source's length.
    Actual,
    Pick(LenPick),
}

/// A namespace error.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum NsErr {
    NotFound,
    Exists,
    WrongType { stream: bool },
    Replaced,
    Conflict,
    StreamActive,
    Storage,
    SourceRecovery,
    Unavailable,
    Timeout,
    Protocol,
    Limit(u8),
    Lost,
}

/// A forged reply body.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Outcome {
    Ok {
        revision: u8,
        source: SrcPick,
        length: ResolvedLen,
        stream: bool,
    },
    Err(NsErr),
}

/// The request id of a forged reply.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum IdPick {
    Current,
    Previous,
    Raw(u64),
}

/// Offset of a forged chunk.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum OffPick {
    InFlight(u8),
    Raw(u64),
}

/// Payload of a forged chunk.
#[derive(Clone, Debug, Arbitrary)]
pub enum BytesPick {
    /// As many bytes as the transfer wants at that offset.
    Exact(u8),
    Raw(Vec<u8>),
}

/// One step of the schedule.
#[derive(Clone, Debug, Arbitrary)]
pub enum Action {
    /// A request from session `session`'s child, or from a stranger on its node.
    Child {
        session: u8,
        stranger: bool,
        request: Req,
    },
    /// The child fills a granted write, seals its header (or not) and sends `Seal` (or not).
    FillSeal {
        grant: u8,
        byte: u8,
        seal_header: bool,
        send: bool,
    },
    /// The child aborts a granted write in its header and sends `Abort`.
    ChildAbort {
        grant: u8,
        header: bool,
    },
    /// The child releases a granted lease.
    ChildRelease {
        grant: u8,
    },
    /// A hostile child writes bytes into the arena.
    Scribble {
        node: bool,
        target: Target,
        bytes: Vec<u8>,
    },
    /// A hostile child sets one header field of a live lease.
    Field {
        node: bool,
        pick: u8,
        field: u8,
        value: u64,
    },
    Deliver {
        pick: u8,
    },
    /// Everything in flight now (frames sent meanwhile wait).
    DeliverAll,
    /// Until nothing is in flight (bounded).
    Settle,
    Drop {
        pick: u8,
    },
    Duplicate {
        pick: u8,
    },
    /// Time moves by `tenths` × 100 ms; due timers fire.
    Advance {
        tenths: u8,
    },
    RestartProxy {
        node: bool,
    },
    /// A file on a node's disk changes under its file blobs (issue 17): they must never be
    /// served again.
    ChangeFile {
        node: bool,
        file: u8,
    },
    OpenSession {
        node: bool,
    },
    /// A proxy reply nobody sent, to a binding.
    Forge {
        node: bool,
        pick: u8,
        id: IdPick,
        /// `None`: the kind of the binding's call.
        kind: Option<u8>,
        outcome: Outcome,
        epoch: u8,
    },
    ChunkRequestTo {
        node: bool,
        target: ActorPick,
        offset: u64,
        len: u32,
        /// A binding of the other node, or nobody.
        reply: Option<u8>,
    },
    ChunkTo {
        node: bool,
        pick: u8,
        offset: OffPick,
        total: Option<u64>,
        digest: Option<u8>,
        bytes: BytesPick,
    },
    ChunkRefusedTo {
        node: bool,
        target: ActorPick,
        lost: bool,
    },
    RetireTo {
        node: bool,
        target: ActorPick,
    },
    DisplacedTo {
        node: bool,
        target: ActorPick,
    },
    /// A frame of a kind no host actor takes (or any kind, to the wrong actor).
    Junk {
        node: bool,
        target: ActorPick,
        kind: u8,
    },
}

/// A canned start.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Prelude {
    None,
    /// Node 1's child published `/data/x` (700 bytes, BLAKE3).
    Published,
    /// ... and node 2's child read it.
    RemoteRead,
    /// A published write, a remote read in flight, an exclusive write granted, a local read
    /// and a stat in flight.
    Busy,
}

/// The fuzzer's input.
#[derive(Clone, Debug, Arbitrary)]
pub struct Input {
    pub prelude: Prelude,
    /// The leak check's definitive answer to `Register`/`Unregister`: success or refusal.
    pub mutations_succeed: bool,
    pub actions: Vec<Action>,
}

// =============================================================================================
// The world

struct SessionRec {
    node: usize,
    address: Address,
    child: Address,
}

/// A binding actor and, if it is filling, its transfer's length and the offsets in flight.
type Filling = (u64, Option<(u64, Vec<u64>)>);

/// A lease a child was granted.
#[derive(Clone, Copy, Debug)]
struct Grant {
    session: usize,
    op: ChildOp,
    view: LeaseView,
    writable: bool,
}

/// Counters (for a quick look at what a run reached).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub input_errors: u64,
    pub published: u64,
    pub read_granted: u64,
    pub write_granted: u64,
    pub failed: u64,
    pub settle_cut: u64,
    /// Child events by kind (and failures by error), when asked for ([`run_counting`]).
    pub events: Option<std::collections::BTreeMap<String, u64>>,
}

pub struct World {
    /// The directory and the nodes: their proxies, hosts and arenas.
    cluster: Cluster,
    /// Per node, every lease generation granted to a child.
    /// Every generation granted on each node, with the write grant's place if it was one.
    generations: Vec<BTreeMap<u64, Option<(u64, u64)>>>,
    sessions: Vec<SessionRec>,
    grants: Vec<Grant>,
    in_flight: Vec<Frame>,
    pub stats: Stats,
}

impl Default for World {
    fn default() -> Self {
        World::new()
    }
}

/// The hosts' configuration: small chunks, a short tick and short deadlines, so that a short
/// schedule reaches retries, timeouts and queued allocations.
fn host_config(mut c: HostConfig) -> HostConfig {
    c.arena_generation = ARENA_GENERATION;
    c.tick = Duration::from_millis(100);
    c.chunk_bytes = 256;
    c.window = 4;
    c.chunk_timeout = Duration::from_millis(500);
    c.chunk_attempts_max = 3;
    c.transfer_deadline = Duration::from_secs(5);
    c.allocation_deadline = Duration::from_secs(4);
    c.call_guard = Duration::from_secs(20);
    c.first_actor = FIRST_ACTOR;
    c
}

impl World {
    pub fn new() -> World {
        let setup = Setup {
            arena: ARENA,
            proxy_deadline: Duration::from_secs(10),
            host_config,
        };
        let mut sent = Vec::new();
        let cluster = Cluster::new(NODES, setup, &mut sent);
        let mut w = World {
            cluster,
            generations: vec![BTreeMap::new(); NODES],
            sessions: Vec::new(),
            grants: Vec::new(),
            in_flight: Vec::new(),
            stats: Stats::default(),
        };
        w.sent(sent);
        // Files children may publish (issue 17).
        for node in &mut w.cluster.nodes {
            node.mem.files.write("f0", vec![7; 1000]);
            node.mem
                .files
                .write("f1", (0..70_000u32).map(|i| i as u8).collect());
        }
        // Two sessions on node 1, one on node 2.
        for n in [0, 0, 1] {
            w.open_session(n);
        }
        w
    }

    fn open_session(&mut self, n: usize) {
        if self.sessions.len() >= SESSIONS_MAX {
            return;
        }
        let config = SessionConfig {
            session_generation: 1 + self.sessions.len() as u64,
            capability: CAPABILITY,
            job: job(),
        };
        let Some(address) = self.cluster.nodes[n].host.open_session(config) else {
            return;
        };
        let child = Address::new(node_id(n), 1, CHILD_ACTOR + self.sessions.len() as u64);
        self.sessions.push(SessionRec {
            node: n,
            address,
            child,
        });
    }

    // ----- effects ----------------------------------------------------------------------------

    /// What the machines sent: events for children are heard at once (the child socket is
    /// reliable and ordered), everything else waits in flight.
    fn sent(&mut self, sent: Vec<Frame>) {
        for frame in sent {
            match frame.message {
                Message::ToChild(event) => {
                    let n = self.cluster.node_of(frame.from).expect("a host's node");
                    self.child_event(n, frame.to, event);
                }
                message => self.in_flight.push(Frame { message, ..frame }),
            }
        }
    }

    /// What a child hears.
    fn child_event(&mut self, n: usize, to: Address, event: ChildEvent) {
        if let Some(events) = &mut self.stats.events {
            let name = match &event {
                ChildEvent::Failed { error, .. } => format!("Failed {error:?}"),
                other => format!("{other:?}"),
            };
            let name: String = name.chars().take_while(|c| !"{(".contains(*c)).collect();
            *events.entry(name).or_default() += 1;
        }
        let (op, view, writable) = match event {
            ChildEvent::WriteGranted { op, lease } => {
                self.stats.write_granted += 1;
                (op, lease, true)
            }
            ChildEvent::ReadGranted { op, lease, .. } => {
                self.stats.read_granted += 1;
                (op, lease, false)
            }
            ChildEvent::Published { .. } => {
                self.stats.published += 1;
                return;
            }
            ChildEvent::Failed { .. } => {
                self.stats.failed += 1;
                return;
            }
            _ => return,
        };
        // A grant lies inside the arena and carries a generation never granted before.
        let end = view
            .offset
            .checked_add(BLOB_HEADER_BYTES)
            .and_then(|e| e.checked_add(view.length));
        assert!(
            end.is_some_and(|end| end <= ARENA),
            "node {n}: a grant outside the arena: {view:?}"
        );
        assert!(
            view.generation != 0 && view.generation != ARENA_GENERATION,
            "node {n}: a grant with generation {}",
            view.generation
        );
        // A write grant's generation is fresh. A read may repeat one only to view a blob
        // this host wrote itself: the writer's lease, at the writer's place.
        let place = (view.offset, view.length);
        match self.generations[n].get(&view.generation) {
            None => {
                self.generations[n].insert(view.generation, writable.then_some(place));
            }
            Some(first) => assert!(
                !writable && *first == Some(place),
                "node {n}: generation {} granted twice ({} grant at {place:?}, first {first:?})",
                view.generation,
                if writable { "write" } else { "read" },
            ),
        }
        let Some(session) = self.sessions.iter().position(|s| s.child == to) else {
            return;
        };
        if self.grants.len() == GRANTS_KEPT {
            self.grants.remove(0);
        }
        self.grants.push(Grant {
            session,
            op,
            view,
            writable,
        });
    }

    // ----- inputs -----------------------------------------------------------------------------

    /// One frame to a host; checks everything after it.
    fn host_input(&mut self, n: usize, from: Address, to: Address, message: Message) {
        let mut sent = Vec::new();
        // Typed errors only: a panic inside is the crash.
        if self
            .cluster
            .to_host(n, from, to, message, &mut sent)
            .is_err()
        {
            self.stats.input_errors += 1;
        }
        self.sent(sent);
        self.check();
    }

    fn deliver(&mut self, frame: Frame) {
        let Frame { from, to, message } = frame;
        let mut sent = Vec::new();
        if to == DIRECTORY {
            let _ = self.cluster.to_directory(message, &mut sent);
        } else if let Some(n) = self.cluster.node_of(to) {
            if to.actor == 0 && to.incarnation == 1 {
                let _ = self.cluster.to_proxy(n, message, &mut sent);
            } else if to.actor >= FIRST_ACTOR - 1 || to.incarnation != 1 {
                self.host_input(n, from, to, message);
                return;
            }
            // Children, strangers and dead proxies: nobody listens (children hear directly).
        }
        self.sent(sent);
        self.check();
    }

    fn deliver_at(&mut self, i: usize) {
        let frame = self.in_flight.remove(i);
        self.deliver(frame);
    }

    fn settle(&mut self) {
        let mut steps = 0;
        while !self.in_flight.is_empty() {
            if steps == SETTLE_MAX {
                self.stats.settle_cut += 1;
                return;
            }
            steps += 1;
            self.deliver_at(0);
        }
    }

    /// Time moves by `tenths` × 100 ms; the timers due by then fire at the new time, earliest
    /// first (among equals, the nodes' in order, then the directory's).
    fn advance(&mut self, tenths: u8) {
        let now = self
            .cluster
            .now
            .saturating_add(Duration::from_millis(100 * u64::from(tenths)));
        self.cluster.now = now;
        let mut due: Vec<(Instant, Due)> = self.cluster.timers();
        due.retain(|(at, _)| *at <= now);
        due.sort_by_key(|(at, which)| (*at, *which == Due::Directory));
        for (_, which) in due {
            let mut sent = Vec::new();
            self.cluster.fire(which, &mut sent);
            self.sent(sent);
            self.check();
        }
    }

    fn restart_proxy(&mut self, n: usize) {
        let mut sent = Vec::new();
        self.cluster.restart_proxy(n, &mut sent);
        self.sent(sent);
        self.check();
    }

    /// Every machine's invariants.
    fn check(&self) {
        if let Err(e) = self.cluster.check_nodes() {
            panic!("{e}");
        }
        for (n, node) in self.cluster.nodes.iter().enumerate() {
            if node.host.arena().queued_count() > 0 && node.host.arena().live_count() == 0 {
                panic!("host {n}: requests wait in an empty arena");
            }
        }
        if let Err(e) = self.cluster.dir.check_invariants_fast() {
            panic!("directory: {e}");
        }
    }

    // ----- picks ------------------------------------------------------------------------------

    fn node(flag: bool) -> usize {
        usize::from(flag)
    }

    fn path(pick: &PathPick) -> String {
        match pick {
            PathPick::Pool(i) => PATHS[usize::from(*i) % PATHS.len()].to_string(),
            PathPick::Raw(s) => s.chars().take(64).collect(),
        }
    }

    fn length(pick: LenPick) -> u64 {
        match pick {
            LenPick::Pool(i) => LENGTHS[usize::from(i) % LENGTHS.len()],
            LenPick::Raw(l) => l,
        }
    }

    fn op(op: u8) -> ChildOp {
        ChildOp(u64::from(op % 8))
    }

    fn revision(r: Option<u8>) -> Option<Revision> {
        r.map(|r| Revision(u64::from(r % 16)))
    }

    fn binding_actors(&self, n: usize) -> Vec<u64> {
        self.cluster.nodes[n]
            .host
            .bindings()
            .map(|(a, _)| *a)
            .collect()
    }

    fn source_actors(&self, n: usize) -> Vec<u64> {
        self.cluster.nodes[n]
            .host
            .sources()
            .map(|(a, _)| *a)
            .collect()
    }

    fn nth<T: Copy>(items: &[T], i: u8) -> Option<T> {
        (!items.is_empty()).then(|| items[usize::from(i) % items.len()])
    }

    fn actor(&self, n: usize, pick: ActorPick) -> Address {
        let host = &self.cluster.nodes[n].host;
        let fallback = |i: u8| host.address(FIRST_ACTOR - 1 + u64::from(i % 64));
        match pick {
            ActorPick::Source(i) => {
                Self::nth(&self.source_actors(n), i).map_or(fallback(i), |a| host.address(a))
            }
            ActorPick::Binding(i) => {
                Self::nth(&self.binding_actors(n), i).map_or(fallback(i), |a| host.address(a))
            }
            ActorPick::Session(i) => {
                let own: Vec<Address> = self
                    .sessions
                    .iter()
                    .filter(|s| s.node == n)
                    .map(|s| s.address)
                    .collect();
                Self::nth(&own, i).unwrap_or(fallback(i))
            }
            ActorPick::Raw(i) => fallback(i),
            ActorPick::Old(i) => Address::new(node_id(n), 0, FIRST_ACTOR + u64::from(i % 64)),
            ActorPick::Elsewhere(i) => Address::new(NodeId(9), 1, FIRST_ACTOR + u64::from(i)),
        }
    }

    /// The live leases of node `n`'s bindings, by binding actor order.
    fn leases(&self, n: usize) -> Vec<Expected> {
        self.cluster.nodes[n]
            .host
            .bindings()
            .filter_map(|(_, b)| b.lease.map(|slot| slot.expected))
            .collect()
    }

    fn error(e: NsErr) -> NamespaceError {
        let p = DataPath::new("/data/x").unwrap();
        match e {
            NsErr::NotFound => NamespaceError::PathNotFound(p),
            NsErr::Exists => NamespaceError::PathExists(p),
            NsErr::WrongType { stream } => NamespaceError::WrongEntryType {
                path: p,
                expected: EntryKind::Blob,
                found: if stream {
                    EntryKind::Stream
                } else {
                    EntryKind::Blob
                },
            },
            NsErr::Replaced => NamespaceError::PathReplaced(p),
            NsErr::Conflict => {
                NamespaceError::OperationConflict(dataplane_core::ids::OperationId(1))
            }
            NsErr::StreamActive => NamespaceError::StreamActive(p),
            NsErr::Storage => NamespaceError::Storage(Reason::new("disk")),
            NsErr::SourceRecovery => NamespaceError::SourceRecovery(Reason::new("gone")),
            NsErr::Unavailable => NamespaceError::DirectoryUnavailable(Reason::new("none")),
            NsErr::Timeout => NamespaceError::Timeout,
            NsErr::Protocol => NamespaceError::Protocol(Reason::new("forged")),
            NsErr::Lost => NamespaceError::BlobLost(p),
            NsErr::Limit(i) => NamespaceError::LimitReached(
                [
                    Limit::FenceHeldOpens,
                    Limit::Reservations,
                    Limit::PendingRequests,
                    Limit::RequestIds,
                    // A full operation table: no trace, the host must ask again.
                    Limit::Operations,
                    Limit::Entries,
                ][usize::from(i % 6)],
            ),
        }
    }

    fn body(&self, n: usize, kind: RequestKind, outcome: Outcome) -> ReplyBody {
        let (revision, source, length, stream) = match outcome {
            Outcome::Err(e) => return ReplyBody::error(kind, Self::error(e)),
            Outcome::Ok {
                revision,
                source,
                length,
                stream,
            } => (Revision(u64::from(revision % 16)), source, length, stream),
        };
        let receipt = MutationReceipt { revision };
        match kind {
            RequestKind::Register => ReplyBody::Registered(Ok(receipt)),
            RequestKind::Unregister => ReplyBody::Unregistered(Ok(receipt)),
            RequestKind::Rename => ReplyBody::Renamed(Ok(receipt)),
            RequestKind::ReserveBlob => ReplyBody::BlobReserved(Ok(())),
            RequestKind::ReleaseBlobReservation => ReplyBody::BlobReservationReleased(Ok(())),
            RequestKind::CancelStream => ReplyBody::StreamCancelled(Ok(())),
            RequestKind::CloseStream => ReplyBody::StreamClosed(Ok(())),
            RequestKind::OperationsDone => ReplyBody::OperationsDone(Ok(revision.0)),
            RequestKind::Lookup => ReplyBody::LookedUp(Ok(NamespaceNode {
                kind: if stream {
                    EntryKind::Stream
                } else {
                    EntryKind::Blob
                },
                revision,
                active: stream,
                lost: false,
            })),
            RequestKind::OpenStream => ReplyBody::StreamOpened(Ok(StreamMatch {
                incarnation: StreamIncarnation {
                    epoch: AuthorityEpoch(1),
                    revision,
                },
                source: NOBODY,
                source_descriptor: Descriptor::new(vec![]).unwrap(),
                sink: NOBODY,
                sink_descriptor: Descriptor::new(vec![]).unwrap(),
                revision,
            })),
            RequestKind::Resolve => {
                let live = |m: usize, i: u8| {
                    let host = &self.cluster.nodes[m].host;
                    Self::nth(&self.source_actors(m), i).map(|a| {
                        let s = host.source(a).expect("a live source");
                        (s.address, Some(s.length))
                    })
                };
                let (address, actual) = match source {
                    SrcPick::Own(i) => live(n, i).unwrap_or((NOBODY, None)),
                    SrcPick::Other(i) => live(1 - n, i).unwrap_or((NOBODY, None)),
                    SrcPick::Dead { node, actor } => (
                        self.cluster.nodes[Self::node(node)]
                            .host
                            .address(FIRST_ACTOR + u64::from(actor)),
                        None,
                    ),
                    SrcPick::Nobody => (NOBODY, None),
                };
                let length = match length {
                    ResolvedLen::Actual => actual.unwrap_or(700),
                    ResolvedLen::Pick(l) => Self::length(l),
                };
                ReplyBody::Resolved(Ok(BlobBinding {
                    source: address,
                    source_node: address.node,
                    owner: None,
                    length,
                    revision,
                }))
            }
        }
    }

    // ----- actions ----------------------------------------------------------------------------

    fn child_request(&mut self, session: usize, stranger: bool, request: ChildRequest) {
        let (n, to, child) = {
            let s = &self.sessions[session];
            (s.node, s.address, s.child)
        };
        let from = if stranger {
            Address::new(node_id(n), 1, STRANGER_ACTOR)
        } else {
            child
        };
        self.host_input(n, from, to, Message::FromChild(request));
    }

    fn request(req: &Req) -> ChildRequest {
        match req {
            Req::Attach {
                generation,
                capability,
            } => ChildRequest::Attach {
                arena_generation: match generation {
                    GenPick::Right => ARENA_GENERATION,
                    GenPick::Raw(g) => *g,
                },
                capability: if *capability {
                    CAPABILITY
                } else {
                    Capability([0; 32])
                },
            },
            Req::OpenRead { op, path, expected } => ChildRequest::OpenRead {
                op: Self::op(*op),
                path: Self::path(path),
                expected_revision: Self::revision(*expected),
            },
            Req::OpenWrite {
                op,
                path,
                length,
                blake3,
                exclusive,
            } => ChildRequest::OpenWrite {
                op: Self::op(*op),
                path: Self::path(path),
                length: Self::length(*length),
                digest: if *blake3 {
                    DigestKind::Blake3
                } else {
                    DigestKind::None
                },
                exclusive: *exclusive,
            },
            Req::Seal { op } => ChildRequest::Seal { op: Self::op(*op) },
            Req::Abort { op } => ChildRequest::Abort { op: Self::op(*op) },
            Req::Release { op } => ChildRequest::Release { op: Self::op(*op) },
            Req::Cancel { op } => ChildRequest::Cancel { op: Self::op(*op) },
            Req::Stat { op, path } => ChildRequest::Stat {
                op: Self::op(*op),
                path: Self::path(path),
            },
            Req::Move {
                op,
                from,
                to,
                replace,
            } => ChildRequest::Move {
                op: Self::op(*op),
                from: Self::path(from),
                to: Self::path(to),
                replace: *replace,
            },
            Req::Remove { op, path, expected } => ChildRequest::Remove {
                op: Self::op(*op),
                path: Self::path(path),
                expected_revision: Self::revision(*expected),
            },
            Req::Close => ChildRequest::Close,
            Req::PublishFile { op, path, file } => ChildRequest::PublishFile {
                op: Self::op(*op),
                path: Self::path(path),
                file: match file {
                    FilePick::Known(k) => format!("f{}", k % 3),
                    FilePick::Raw(s) => s.chars().take(64).collect(),
                },
            },
            Req::OpenStream {
                op,
                path,
                source,
                replace,
                ensure,
            } => ChildRequest::OpenStream {
                op: Self::op(*op),
                path: Self::path(path),
                role: if *source {
                    StreamRole::Source
                } else {
                    StreamRole::Sink
                },
                descriptor: Descriptor::new(vec![*op]).expect("one byte"),
                replace: *replace,
                ensure: *ensure,
                expected_revision: None,
            },
            Req::CloseStream { op } => ChildRequest::CloseStream { op: Self::op(*op) },
        }
    }

    fn grant(&self, pick: u8, writable: bool) -> Option<Grant> {
        let grants: Vec<Grant> = self
            .grants
            .iter()
            .copied()
            .filter(|g| !writable || g.writable)
            .collect();
        Self::nth(&grants, pick)
    }

    fn expected(g: &Grant) -> Expected {
        Expected {
            offset: g.view.offset,
            length: g.view.length,
            generation: g.view.generation,
            access: g.view.access,
            digest_kind: g.view.digest,
        }
    }

    fn scribble(&mut self, n: usize, target: Target, bytes: &[u8]) {
        let leases = self.leases(n);
        let at = match target {
            Target::Header { pick, offset } => Self::nth(&leases, pick)
                .map(|e| e.offset + u64::from(offset) % BLOB_HEADER_BYTES)
                .unwrap_or(u64::from(offset)),
            Target::Payload { pick, offset } => Self::nth(&leases, pick)
                .map(|e| e.offset + BLOB_HEADER_BYTES + u64::from(offset) % (e.length + 8))
                .unwrap_or(u64::from(offset)),
            Target::Anywhere { offset } => u64::from(offset),
        };
        let mem = &mut self.cluster.nodes[n].mem;
        let at = (at % ARENA) as usize;
        let end = (at + bytes.len().min(64)).min(mem.len());
        mem[at..end].copy_from_slice(&bytes[..end - at]);
        self.check();
    }

    fn field(&mut self, n: usize, pick: u8, field: u8, value: u64) {
        let Some(e) = Self::nth(&self.leases(n), pick) else {
            return;
        };
        let (at, width) = FIELDS[usize::from(field) % FIELDS.len()];
        let start = e.offset as usize + at;
        let bytes = value.to_le_bytes();
        self.cluster.nodes[n].mem[start..start + width].copy_from_slice(&bytes[..width]);
        self.check();
    }

    pub fn act(&mut self, action: &Action) {
        match action {
            Action::Child {
                session,
                stranger,
                request,
            } => {
                let s = usize::from(*session) % self.sessions.len();
                self.child_request(s, *stranger, Self::request(request));
            }
            Action::FillSeal {
                grant,
                byte,
                seal_header,
                send,
            } => {
                let Some(g) = self.grant(*grant, true) else {
                    return;
                };
                let n = self.sessions[g.session].node;
                let e = Self::expected(&g);
                let mem = &mut self.cluster.nodes[n].mem;
                if let Ok(payload) = blob::payload_mut(mem, &e) {
                    for (i, b) in payload.iter_mut().enumerate() {
                        *b = (i as u8).wrapping_mul(31).wrapping_add(*byte);
                    }
                }
                if *seal_header {
                    // Half the seals leave the digest to the host (issue 18), half hash it.
                    let _ = if *byte & 1 == 0 {
                        blob::child_seal_unhashed(mem, &e)
                    } else {
                        blob::child_seal(mem, &e)
                    };
                }
                self.check();
                if *send {
                    self.child_request(g.session, false, ChildRequest::Seal { op: g.op });
                }
            }
            Action::ChildAbort { grant, header } => {
                let Some(g) = self.grant(*grant, true) else {
                    return;
                };
                let n = self.sessions[g.session].node;
                if *header {
                    let _ = blob::child_abort(&mut self.cluster.nodes[n].mem, &Self::expected(&g));
                }
                self.child_request(g.session, false, ChildRequest::Abort { op: g.op });
            }
            Action::ChildRelease { grant } => {
                let Some(g) = self.grant(*grant, false) else {
                    return;
                };
                self.child_request(g.session, false, ChildRequest::Release { op: g.op });
            }
            Action::Scribble {
                node,
                target,
                bytes,
            } => self.scribble(Self::node(*node), *target, bytes),
            Action::Field {
                node,
                pick,
                field,
                value,
            } => self.field(Self::node(*node), *pick, *field, *value),
            Action::Deliver { pick } => {
                if !self.in_flight.is_empty() {
                    let i = usize::from(*pick) % self.in_flight.len();
                    self.deliver_at(i);
                }
            }
            Action::DeliverAll => {
                let batch: Vec<Frame> = std::mem::take(&mut self.in_flight);
                for frame in batch {
                    self.deliver(frame);
                }
            }
            Action::Settle => self.settle(),
            Action::Drop { pick } => {
                if !self.in_flight.is_empty() {
                    let i = usize::from(*pick) % self.in_flight.len();
                    self.in_flight.remove(i);
                }
            }
            Action::Duplicate { pick } => {
                if !self.in_flight.is_empty() {
                    let i = usize::from(*pick) % self.in_flight.len();
                    let copy = self.in_flight[i].clone();
                    self.in_flight.push(copy);
                }
            }
            Action::Advance { tenths } => self.advance(*tenths),
            Action::RestartProxy { node } => self.restart_proxy(Self::node(*node)),
            Action::ChangeFile { node, file } => {
                let name = format!("f{}", file % 2);
                let n = Self::node(*node);
                self.cluster.nodes[n]
                    .mem
                    .files
                    .write(&name, vec![*file; 1000]);
            }
            Action::OpenSession { node } => self.open_session(Self::node(*node)),
            Action::Forge {
                node,
                pick,
                id,
                kind,
                outcome,
                epoch,
            } => {
                let n = Self::node(*node);
                let calls: Vec<(u64, Option<(RequestId, RequestKind)>)> = self.cluster.nodes[n]
                    .host
                    .bindings()
                    .map(|(a, b)| (*a, b.call.as_ref().map(|c| (c.id, c.request.kind()))))
                    .collect();
                let with_call: Vec<_> = calls.iter().filter(|(_, c)| c.is_some()).collect();
                let chosen = if with_call.is_empty() {
                    calls.get(usize::from(*pick) % calls.len().max(1)).copied()
                } else {
                    Some(*with_call[usize::from(*pick) % with_call.len()])
                };
                let Some((actor, call)) = chosen else {
                    return;
                };
                let (current, current_kind) = call.unwrap_or((RequestId(1), RequestKind::Resolve));
                let request_id = match id {
                    IdPick::Current => current,
                    IdPick::Previous => RequestId(current.0.saturating_sub(1)),
                    IdPick::Raw(r) => RequestId(*r),
                };
                let kind = match kind {
                    None => current_kind,
                    Some(k) => RequestKind::ALL[usize::from(*k) % RequestKind::ALL.len()],
                };
                let reply = DirectoryReply {
                    request_id,
                    epoch: AuthorityEpoch(u64::from(*epoch)),
                    body: self.body(n, kind, *outcome),
                };
                let proxy = Address::new(node_id(n), 1, 0);
                let to = self.cluster.nodes[n].host.address(actor);
                self.host_input(n, proxy, to, Message::Reply(reply));
            }
            Action::ChunkRequestTo {
                node,
                target,
                offset,
                len,
                reply,
            } => {
                let n = Self::node(*node);
                let to = self.actor(n, *target);
                let reply_to = reply
                    .and_then(|i| Self::nth(&self.binding_actors(1 - n), i))
                    .map_or(NOBODY, |a| self.cluster.nodes[1 - n].host.address(a));
                let message = Message::ChunkRequest {
                    offset: *offset,
                    len: *len,
                    reply_to,
                };
                self.host_input(n, reply_to, to, message);
            }
            Action::ChunkTo {
                node,
                pick,
                offset,
                total,
                digest,
                bytes,
            } => {
                let n = Self::node(*node);
                let filling: Vec<Filling> = self.cluster.nodes[n]
                    .host
                    .bindings()
                    .map(|(a, b)| match &b.phase {
                        Phase::Filling(t) => {
                            (*a, Some((t.length, t.in_flight.keys().copied().collect())))
                        }
                        _ => (*a, None),
                    })
                    .collect();
                let reading: Vec<_> = filling.iter().filter(|(_, t)| t.is_some()).collect();
                let chosen = if reading.is_empty() {
                    filling
                        .get(usize::from(*pick) % filling.len().max(1))
                        .cloned()
                } else {
                    Some(reading[usize::from(*pick) % reading.len()].clone())
                };
                let Some((actor, transfer)) = chosen else {
                    return;
                };
                let (length, in_flight) = transfer.unwrap_or((0, Vec::new()));
                let offset = match offset {
                    OffPick::InFlight(i) => Self::nth(&in_flight, *i).unwrap_or(0),
                    OffPick::Raw(o) => *o,
                };
                let bytes = match bytes {
                    BytesPick::Exact(b) => {
                        let want = 256u64.min(length.saturating_sub(offset)) as usize;
                        vec![*b; want]
                    }
                    BytesPick::Raw(v) => v.clone(),
                };
                let Ok(bytes) = ChunkBytes::new(bytes) else {
                    return;
                };
                let message = Message::Chunk {
                    offset,
                    total: total.unwrap_or(length),
                    digest: digest.map(|d| [d; 32]),
                    bytes,
                };
                let to = self.cluster.nodes[n].host.address(actor);
                self.host_input(n, NOBODY, to, message);
            }
            Action::ChunkRefusedTo { node, target, lost } => {
                let n = Self::node(*node);
                let to = self.actor(n, *target);
                let message = Message::ChunkRefused {
                    reason: if *lost {
                        ChunkRefusal::IncarnationEnded
                    } else {
                        ChunkRefusal::Retired
                    },
                };
                self.host_input(n, NOBODY, to, message);
            }
            Action::RetireTo { node, target } => {
                let n = Self::node(*node);
                let to = self.actor(n, *target);
                let message = Message::Retire { reply_to: NOBODY };
                self.host_input(n, DIRECTORY, to, message);
            }
            Action::DisplacedTo { node, target } => {
                let n = Self::node(*node);
                let to = self.actor(n, *target);
                let message = Message::Displaced {
                    incarnation: StreamIncarnation {
                        epoch: AuthorityEpoch(1),
                        revision: Revision(1),
                    },
                    reply_to: NOBODY,
                };
                self.host_input(n, DIRECTORY, to, message);
            }
            Action::Junk { node, target, kind } => {
                let n = Self::node(*node);
                let to = self.actor(n, *target);
                let message = match kind % 6 {
                    0 => Message::FromChild(ChildRequest::Close),
                    1 => Message::ToChild(ChildEvent::Closed),
                    2 => Message::SourceRetired { source: to },
                    3 => Message::ProxyCancel { reply_to: to },
                    4 => Message::GoneAcknowledged {
                        scope: dataplane_core::wire::GoneScope::Address(to),
                    },
                    _ => Message::Reply(DirectoryReply {
                        request_id: RequestId(1),
                        epoch: AuthorityEpoch(1),
                        body: ReplyBody::Resolved(Err(NamespaceError::Timeout)),
                    }),
                };
                self.host_input(n, NOBODY, to, message);
            }
        }
    }

    // ----- the canned preludes ----------------------------------------------------------------

    fn prelude(&mut self, prelude: Prelude) {
        let attach = |session: u8| Action::Child {
            session,
            stranger: false,
            request: Req::Attach {
                generation: GenPick::Right,
                capability: true,
            },
        };
        let write = |session: u8, op: u8, path: u8, length: u8, exclusive: bool| Action::Child {
            session,
            stranger: false,
            request: Req::OpenWrite {
                op,
                path: PathPick::Pool(path),
                length: LenPick::Pool(length),
                blake3: true,
                exclusive,
            },
        };
        let read = |session: u8, op: u8, path: u8| Action::Child {
            session,
            stranger: false,
            request: Req::OpenRead {
                op,
                path: PathPick::Pool(path),
                expected: None,
            },
        };
        let publish = vec![
            attach(0),
            attach(1),
            attach(2),
            write(0, 1, 0, 3, false),
            Action::FillSeal {
                grant: 0,
                byte: 7,
                seal_header: true,
                send: true,
            },
            Action::Settle,
        ];
        let script: Vec<Action> = match prelude {
            Prelude::None => Vec::new(),
            Prelude::Published => publish,
            Prelude::RemoteRead => {
                let mut s = publish;
                s.extend([read(2, 1, 0), Action::Settle]);
                s
            }
            Prelude::Busy => {
                let mut s = publish;
                s.extend([
                    read(2, 1, 0),
                    Action::DeliverAll,
                    Action::DeliverAll,
                    Action::DeliverAll,
                    Action::DeliverAll,
                    write(1, 2, 1, 2, true),
                    Action::Settle,
                    read(0, 3, 0),
                    Action::Child {
                        session: 1,
                        stranger: false,
                        request: Req::Stat {
                            op: 4,
                            path: PathPick::Pool(0),
                        },
                    },
                    Action::DeliverAll,
                ]);
                s
            }
        };
        for action in &script {
            self.act(action);
        }
    }

    // ----- the end ----------------------------------------------------------------------------

    /// The leak check (see the module documentation).
    pub fn finish(&mut self, mutations_succeed: bool) {
        self.in_flight.clear();
        for s in 0..self.sessions.len() {
            let (n, address) = (self.sessions[s].node, self.sessions[s].address);
            let running = self.cluster.nodes[n]
                .host
                .sessions()
                .find(|(actor, _)| **actor == address.actor)
                .and_then(|(_, session)| {
                    (session.state == SessionState::Running)
                        .then_some(session.child)
                        .flatten()
                });
            if let Some(child) = running {
                self.host_input(n, child, address, Message::FromChild(ChildRequest::Close));
            }
        }
        for _ in 0..FINISH_ROUNDS {
            self.in_flight.clear();
            for n in 0..NODES {
                let calls: Vec<(u64, RequestId, RequestKind)> = self.cluster.nodes[n]
                    .host
                    .bindings()
                    .filter_map(|(a, b)| b.call.as_ref().map(|c| (*a, c.id, c.request.kind())))
                    .collect();
                for (actor, request_id, kind) in calls {
                    let p = DataPath::new("/data/x").unwrap();
                    let body = match kind {
                        RequestKind::Register if mutations_succeed => {
                            ReplyBody::Registered(Ok(MutationReceipt {
                                revision: Revision(1),
                            }))
                        }
                        RequestKind::Unregister if mutations_succeed => {
                            ReplyBody::Unregistered(Ok(MutationReceipt {
                                revision: Revision(2),
                            }))
                        }
                        RequestKind::Register | RequestKind::ReserveBlob => {
                            ReplyBody::error(kind, NamespaceError::PathExists(p))
                        }
                        RequestKind::Unregister => {
                            ReplyBody::error(kind, NamespaceError::PathReplaced(p))
                        }
                        _ => ReplyBody::error(kind, NamespaceError::PathNotFound(p)),
                    };
                    let reply = DirectoryReply {
                        request_id,
                        epoch: self.cluster.dir.epoch(),
                        body,
                    };
                    let proxy = Address::new(node_id(n), 1, 0);
                    let to = self.cluster.nodes[n].host.address(actor);
                    self.host_input(n, proxy, to, Message::Reply(reply));
                }
                for actor in self.source_actors(n) {
                    let to = self.cluster.nodes[n].host.address(actor);
                    let message = Message::Retire { reply_to: NOBODY };
                    self.host_input(n, DIRECTORY, to, message);
                }
            }
            if self
                .cluster
                .nodes
                .iter()
                .all(|node| node.host.bindings().next().is_none())
            {
                break;
            }
        }
        for (n, node) in self.cluster.nodes.iter().enumerate() {
            let host = &node.host;
            if let Some((actor, b)) = host.bindings().next() {
                panic!(
                    "leak: host {n} still holds binding {actor} ({:?}, {:?}, lease {:?}, child \
                     holds {}, namespace {:?}, call {:?})",
                    b.kind,
                    b.phase,
                    b.lease.map(|s| s.lease),
                    b.child_holds,
                    b.namespace,
                    b.call.as_ref().map(|c| c.request.kind())
                );
            }
            assert!(
                host.sources().next().is_none(),
                "leak: host {n} keeps a source"
            );
            assert_eq!(
                host.arena().live_count(),
                0,
                "leak: host {n} keeps a lease nobody holds"
            );
            assert_eq!(
                host.arena().queued_count(),
                0,
                "leak: host {n} keeps a queued allocation"
            );
            assert_eq!(host.arena().free_bytes(), host.arena().size());
            for (actor, s) in host.sessions() {
                assert!(
                    matches!(
                        s.state,
                        SessionState::Closed | SessionState::AwaitingAttachment
                    ),
                    "host {n}: session {actor} is {:?} after every close",
                    s.state
                );
            }
        }
    }
}

/// One run: the prelude, the actions, the leak check.
pub fn run(input: &Input) -> Stats {
    run_with(input, false)
}

/// [`run`], counting the child events by kind.
pub fn run_counting(input: &Input) -> Stats {
    run_with(input, true)
}

fn run_with(input: &Input, count: bool) -> Stats {
    let mut world = World::new();
    if count {
        world.stats.events = Some(Default::default());
    }
    world.prelude(input.prelude);
    for action in input.actions.iter().take(ACTIONS_MAX) {
        world.act(action);
    }
    world.finish(input.mutations_succeed);
    world.stats
}

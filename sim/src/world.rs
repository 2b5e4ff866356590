//! The discrete-event world: a priority queue of (time, sequence) events, the network, the
//! directory node with its disk, the host nodes, the fault schedule and the phases of a run.
//!
//! Nothing sleeps: time jumps to the next event. Every random draw comes from the seed's
//! streams, so a seed replays the same run event for event (the trace hash proves it).
//!
//! The directory's effects are executed with the `Persist` barrier: records are appended to its
//! log at once, an fsync is started (group commit: when it completes after its latency, one
//! sync covers everything written by then), and every later effect waits in order until the
//! sync that covers the record before it completes. The log is core's storage protocol
//! (`dataplane_core::storage`, the one the real node runs) on a simulated file system
//! ([`crate::disk`]) that fails, fills up, crashes mid-compaction and rots.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use dataplane_core::admission;
use dataplane_core::barrier::Barrier;
use dataplane_core::conns::{ConnId, DirectoryConns, PeerLinks};
use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::Reason;
use dataplane_core::host::{Host, HostConfig, SessionConfig};
use dataplane_core::ids::{Address, NodeId, PERSISTENT_INCARNATION};
use dataplane_core::limits::LOG_SPACE_RETRY;
use dataplane_core::link::ClusterKey;
use dataplane_core::log::{LogRecord, RecordRef};
use dataplane_core::membership::{Admitted, Membership};
use dataplane_core::path::DataPath;
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::routes::Routes;
use dataplane_core::storage::{
    self, Compacted, FsErrorKind, LogStore, Space, SpaceGate, StorageError, StorageOptions,
};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{DirectoryRequest, Envelope, GoneScope, Message, SourceRecovery};

use crate::check::{Checker, DirInput, ProxyInput};
use crate::client::Io;
use crate::disk::{Rot, SimFs};
use crate::host::{HostNode, HostOutput};
use crate::options::{Options, Recurring};
use crate::rng::{SimRng, Stream, ratio};
use crate::trace::Trace;
use crate::worker::{HOST_FIRST_ACTOR, Worker, WorkerIo, WorkerOut, WorkerState};

mod conns;
mod peers;
mod promises;
mod stalls;

/// The directory's node.
pub const DIRECTORY_NODE: NodeId = NodeId(0);
/// The address clients send directory calls to (the node routes it to the current instance).
pub const DIRECTORY: Address = Address::new(DIRECTORY_NODE, 0, 0);
/// Most events one run may process before it is declared runaway.
pub const EVENT_BUDGET: u64 = 20_000_000;
/// The steps of one compaction (the storage protocol's, restated): write, sync and rename the
/// snapshot; create, write and sync the new log; sync the directory; remove the old snapshot
/// and log; sync the directory.
const COMPACTION_STEPS: u64 = 11;
/// How long a supervisor waits before it restarts a directory that could not start for lack
/// of disk space or a failed fsync.
const RESTART_BACKOFF: Duration = Duration::from_millis(250);
/// Latency of a frame between two actors of one node (reliable and in order).
const LOCAL_LATENCY: Duration = Duration::from_micros(20);
/// The room the directory's log keeps for each new operation (`SpaceGate`): far above what
/// one operation's records take here, far below the real node's reserve, so that a full disk
/// closes the gate while the log still has room.
const SPACE_RESERVE: u64 = 16 * 1024;
/// What a `NoSpace` refusal says (the model predicts the same words).
pub const NO_SPACE_REASON: &str = "no room on the simulated disk for the log";

/// An input of a host machine (built once per step and consumed at once, like `DirInput`).
#[allow(clippy::large_enum_variant)]
enum MachineInput {
    Message(Address, Address, Message),
    Tick,
    ProxyRestarted,
    /// The supervisor revokes this session.
    Revoke(Address),
    /// A connection to this node's host was refused (its process is not running).
    PeerRefused(NodeId),
}

/// Phases of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Faults are injected and clients run their workload.
    Faulty,
    /// Faults stopped, the network healed, clients wind down; liveness must follow.
    Healed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum EventKind {
    Deliver(Box<Envelope>),
    DirTimer {
        boot: u64,
        generation: u64,
    },
    DirSync {
        boot: u64,
        generation: u64,
    },
    DirRoute {
        boot: u64,
        target: Address,
        routable: bool,
        version: u64,
    },
    DirCrash,
    DirRestart,
    DiskFull,
    DiskFreed {
        episode: u64,
    },
    HostCrash,
    /// A host process dies soon after it started (`nonce`: the boot it was drawn for).
    BootCrash {
        host: usize,
        nonce: u64,
    },
    HostRestart(usize),
    /// A host crash aimed at work in flight (`aim_crash`), for boot `nonce` of `host`.
    AimedCrash {
        host: usize,
        nonce: u64,
        work: &'static str,
    },
    HostSend {
        host: usize,
        incarnation: u64,
        envelope: Box<Envelope>,
    },
    Local {
        host: usize,
        incarnation: u64,
        envelope: Box<Envelope>,
    },
    ProxyTimer {
        host: usize,
        incarnation: u64,
        generation: u64,
        arming: u64,
    },
    Discovery {
        host: usize,
        incarnation: u64,
        generation: u64,
        version: u64,
        found: Option<Discovered>,
    },
    ProxyCrash,
    ProxyStart {
        host: usize,
        incarnation: u64,
    },
    OutageStart,
    OutageEnd,
    AuthorityLost {
        boot: u64,
    },
    ClientWake {
        host: usize,
        incarnation: u64,
        client: usize,
        generation: u64,
    },
    HostTick {
        host: usize,
        incarnation: u64,
        arming: u64,
    },
    WorkerWake {
        host: usize,
        incarnation: u64,
        slot: usize,
        generation: u64,
    },
    AgentTick {
        host: usize,
        incarnation: u64,
        arming: u64,
    },
    PartitionStart,
    PartitionEnd {
        from: NodeId,
        to: NodeId,
    },
    FlapStart,
    FlapEnd(Address),
    /// The out-of-order registrar re-announces every watched target (its resync).
    RouteResync,
    ActorDeath,
    Revocation,
    Spoof,
    /// A file on a host's disk changes (issue 17).
    FileChange,
    Heal,
    End,
    /// A connection attempt reaches the directory's listener (or fails).
    ConnOpen {
        conn: ConnId,
    },
    /// A frame on a connection arrives.
    ConnFrame {
        conn: ConnId,
        to_acceptor: bool,
        bytes: Vec<u8>,
    },
    /// One side of a connection learns that the other closed it.
    ConnClosed {
        conn: ConnId,
        to_acceptor: bool,
    },
    /// A host's link to the directory may try again (its process by boot nonce).
    LinkRetry {
        host: usize,
        nonce: u64,
    },
    /// The directory's admission deadline passes.
    DirConnsExpire {
        boot: u64,
    },
    /// A host's book of peer addresses asks again or drops what waited too long (its process
    /// by boot nonce).
    BookTick {
        host: usize,
        nonce: u64,
    },
    /// A host's peer links' next deadline (its process by boot nonce).
    PeerTick {
        host: usize,
        nonce: u64,
    },
    /// A silent stall starts (`stalls`): the directory pauses or a connection stalls.
    StallStart,
    /// It ends.
    StallEnd {
        episode: u64,
    },
    /// Whether `host` left connection `conn`, silent since stall `episode` began.
    SilenceCheck {
        host: usize,
        conn: ConnId,
        episode: u64,
    },
    /// A host's process pauses (`host_pauses`).
    HostPauseStart,
    /// It resumes.
    HostPauseEnd {
        host: usize,
        episode: u64,
    },
    /// Whether the directory let go of `conn`, whose host says nothing to it.
    DirSilenceCheck {
        conn: ConnId,
    },
}

/// A scheduled event of a simulated world: its kind `K` happens at `at`; events at one instant
/// happen in the order they were scheduled (`seq`). The replicated mode's world uses it too.
#[derive(Debug)]
pub(crate) struct Event<K> {
    pub(crate) at: Instant,
    pub(crate) seq: u64,
    pub(crate) kind: K,
}

/// The pending events of a world, earliest (time, sequence) first.
///
/// The heap orders small keys (time, sequence, slot) and the kinds wait in a slab beside it:
/// a kind is up to a hundred bytes, and a heap of whole events moved them at every sift (its
/// `pop` was 3 % of a perf profile of seeds 0..32). Keys save 1.5 % of the instructions of
/// seeds 0..16 (cachegrind); wall time did not change measurably. The order is the heap's
/// on (time, sequence), which are unique, so a run's schedule does not depend on the slots.
#[derive(Debug)]
pub(crate) struct EventQueue<K> {
    keys: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    kinds: Vec<Option<K>>,
    free: Vec<u32>,
}

impl<K> Default for EventQueue<K> {
    fn default() -> Self {
        Self {
            keys: BinaryHeap::new(),
            kinds: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<K> EventQueue<K> {
    /// Schedules `kind` at `at`; `seq` orders it among the events at the same instant and must
    /// be new.
    pub(crate) fn push(&mut self, at: Instant, seq: u64, kind: K) {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.kinds[slot as usize] = Some(kind);
                slot
            }
            None => {
                let slot = u32::try_from(self.kinds.len()).expect("fewer than 2^32 pending events");
                self.kinds.push(Some(kind));
                slot
            }
        };
        self.keys.push(Reverse((at, seq, slot)));
    }

    /// Takes the earliest event.
    pub(crate) fn pop(&mut self) -> Option<Event<K>> {
        let Reverse((at, seq, slot)) = self.keys.pop()?;
        let kind = self.kinds[slot as usize]
            .take()
            .expect("a queued key's slot holds its kind");
        self.free.push(slot);
        Some(Event { at, seq, kind })
    }
}

/// Counters of what a run did (reported and fed to the coverage checker).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events processed.
    pub events: u64,
    /// Frames handed to the network.
    pub frames: u64,
    /// Frames lost to loss or partitions.
    pub lost: u64,
    /// Frames dropped because the sender had no connection to carry them (a host between
    /// its directory's crash and its welcome again): not a fault, what the real nodes do.
    pub unconnected: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Frames held back to be overtaken.
    pub reordered: u64,
    /// Directory crashes (including fsync failures).
    pub directory_crashes: u64,
    /// Crashes caused by a failed fsync.
    pub fsync_failures: u64,
    /// Crashes that tore the log tail.
    pub torn_tails: u64,
    /// Compactions of the directory's log.
    pub compactions: u64,
    /// Compactions that died before one of their steps.
    pub compaction_crashes: u64,
    /// Compactions the disk had no room for (the log went on without them).
    pub compactions_postponed: u64,
    /// Writes that found the disk full (the node stopped).
    pub disk_full_stops: u64,
    /// Starts the storage protocol refused (damage at rest; the operator restored it).
    pub storage_refusals: u64,
    /// Host crashes.
    pub host_crashes: u64,
    /// Partitions started.
    pub partitions: u64,
    /// Route flaps started.
    pub route_flaps: u64,
    /// Actors that died on their own.
    pub actor_deaths: u64,
    /// Frames sent that speak for another node (the spoof fault).
    pub spoofs: u64,
    /// Proxy restarts on running hosts.
    pub proxy_restarts: u64,
    /// Authority outages (discovery answering "none").
    pub authority_outages: u64,
    /// Directory steps.
    pub directory_steps: u64,
    /// Host machine steps.
    pub host_steps: u64,
    /// Mutations (calls carrying an operation id) the directory handled, per host node.
    pub operations_per_node: Vec<u64>,
    /// The most operation records the directory held after any step.
    pub records_max: u64,
    /// The most obligations the directory held after any step.
    pub obligations_max: u64,
    /// The most bytes the simulated log held (compaction rewrites it as a snapshot).
    pub log_bytes_max: u64,
    /// Actors of the run: the directory, each host's proxy, host machine and agent, and the
    /// clients and workers.
    pub actors: u64,
}

impl Stats {
    /// The faults the run injected: frames lost, duplicated and held back, crashes, failed
    /// syncs, torn tails, full-disk stops, partitions, route flaps, deaths, spoofs, restarts
    /// and outages.
    pub fn faults(&self) -> u64 {
        self.lost
            + self.duplicated
            + self.reordered
            + self.directory_crashes
            + self.fsync_failures
            + self.torn_tails
            + self.compaction_crashes
            + self.disk_full_stops
            + self.host_crashes
            + self.partitions
            + self.route_flaps
            + self.actor_deaths
            + self.spoofs
            + self.proxy_restarts
            + self.authority_outages
    }
}

/// The directory node: the machine, its log on its file system and the effects held behind
/// the barrier.
#[derive(Debug)]
struct DirectoryNode {
    machine: Option<Directory>,
    boot: u64,
    fs: SimFs,
    /// The open log (none while the node is down).
    log: Option<LogStore<SimFs>>,
    /// Damage at rest not restored yet: recovery must refuse to start on it.
    rot: Option<Rot>,
    /// The full-disk episode in progress.
    full_episode: u64,
    /// When (global time) the last full-disk episode ended.
    freed_at: Option<Instant>,
    /// Whether the log has its reserve for new operations (core's, as `dataplane-node` keeps
    /// it; a new one at every start).
    space: SpaceGate,
    /// The step being handled takes a new operation (a call with an op id, not a
    /// retraction): the space gate must have let it in with its reserve.
    taking_op: bool,
    /// Whether the log was ever opened (then a data directory without one is loss).
    booted: bool,
    sync: Option<u64>,
    sync_generation: u64,
    barrier: Barrier,
    /// The checker's own account of the barrier (issue 15, class 3): for every effect other
    /// than a `Persist` handed to the barrier and not released yet, in the order the machine
    /// emitted them, where the last record before it ends in the log.
    release_after: VecDeque<u64>,
    /// Where the last record appended to the log in use ends (0 when none was appended since
    /// it was opened or written by a compaction: everything in it is durable).
    last_record_end: u64,
    /// Steps not known durable: (step, where its records end, where its first record ends).
    unsynced_steps: VecDeque<(u64, usize, usize)>,
    /// A step whose appends failed, and where its first record ends.
    failed_step: Option<(u64, Option<usize>)>,
    step: u64,
    timer_generation: u64,
    /// Watched targets: the routability last reported and the version of that report (only
    /// the newest report of a target is delivered, so reports never arrive out of order).
    /// Routability of the watched targets (core's, as `dataplane-node` decides it), fed
    /// from the simulated connections: a host is connected while it is up and the
    /// directory's link to it is.
    routes: Routes,
    /// The version of each watched target's newest report in flight (only the newest is
    /// delivered, so reports never arrive out of order).
    route_versions: BTreeMap<Address, u64>,
    route_version: u64,
    /// Who the hosts are (core's, as `dataplane-node` keeps it in its log): boots, node ids
    /// and incarnations, recovered from the log at every start.
    membership: Membership,
    /// The checker's own account, never read from `membership`: the highest boot any
    /// instance has served with, and, per host, the incarnation its last durable admission
    /// gave it (none before the first).
    boots_used: u64,
    /// Per host: the incarnation and boot nonce of its last durable admission.
    admitted: Vec<Option<(u64, u64)>>,
    /// Per host: an admission whose record went to the log when the storage failed (a failed
    /// fsync may have made it durable all the same, or not).
    maybe_admitted: Vec<Option<(u64, u64)>>,
    /// Per host: the newest boot (the world's boot nonces rise with each start) any directory
    /// instance admitted. An older boot admitted after it is a dead process's late hello
    /// restarting the node under the live one.
    newest_admitted: Vec<u64>,
    /// The connections of the serving instance (core's machine; none while down).
    conns: Option<DirectoryConns>,
    /// When its admission deadline is armed.
    expiry_armed: Option<Instant>,
    /// The world's account of what its durable records promise (`promises.rs`).
    promises: promises::Promises,
    /// The stall that pauses its process, if one does (`stalls`).
    paused: Option<u64>,
    /// What it was sent while paused, in the order it arrived.
    deferred: Vec<EventKind>,
}

impl DirectoryNode {
    fn address(&self) -> Address {
        Address::new(DIRECTORY_NODE, self.boot, 0)
    }
}

/// Tags of file versions start here (far above every worker's `(global << 32) | op`).
pub const FILE_TAG_BASE: u64 = 1 << 62;
/// Files on each host's disk (`f0`, `f1`, `f2`); workers also ask for `f3`, which never exists.
pub const FILES_PER_HOST: u64 = 3;
/// The shortest file (its first eight bytes name its version's tag).
const FILE_LENGTH_MIN: u64 = 8;

/// The name of file `k` on a host's disk.
pub fn file_name(k: usize) -> String {
    format!("f{k}")
}

/// One simulated run.
#[derive(Debug)]
pub struct World {
    options: Options,
    now: Instant,
    queue: EventQueue<EventKind>,
    seq: u64,
    net_rng: SimRng,
    fault_rng: SimRng,
    spoof_rng: SimRng,
    /// File versions written so far (each version's content has tag `FILE_TAG_BASE + n`).
    file_tags: u64,
    env_rng: SimRng,
    work_rng: SimRng,
    disk_rng: SimRng,
    /// Connection latencies, nonces and strangers.
    conn_rng: SimRng,
    /// Boot crashes (a stream of their own: seeds without host crashes draw nothing, and
    /// the other streams' schedules stay as they were).
    boot_rng: SimRng,
    /// Draws of the host crashes aimed at work in flight (`aim_crash`).
    aim_rng: SimRng,
    /// The gone reports each host agent (host, incarnation) sent and has not heard
    /// acknowledged, and when each agent last re-sent one, on the host's clock
    /// (`check_gone_paced`).
    gone_sent: BTreeSet<(usize, u64, GoneScope)>,
    gone_resent: BTreeMap<(usize, u64), Instant>,
    /// Every file blob source a host ever asked the directory to bind, with what it asked
    /// (`check_file_source`).
    file_sources: BTreeMap<Address, (DataPath, u64, SourceRecovery)>,
    /// The questions each host has open about where a node listens (`peers::ask_where`).
    questions: BTreeMap<(usize, NodeId), peers::Question>,
    /// How many aimed crashes were scheduled, per kind of work.
    aimed: BTreeMap<&'static str, u64>,
    /// Silent stalls (a stream of their own, for the same reason).
    stall_rng: SimRng,
    /// Stalls started so far (each is numbered).
    stall_episodes: u64,
    /// Each host's pause, while its process is paused (`host_pauses`).
    host_pauses: Vec<Option<stalls::HostPause>>,
    /// When each host last resumed from a pause, on its clock (what its workers may explain).
    host_resumed: Vec<Option<Instant>>,
    /// The cluster key every node of the run has.
    cluster_key: ClusterKey,
    /// Whether strangers connect during the fault phase (drawn from the conns stream).
    strangers: bool,
    /// Whether the directory's `Welcome` to a host may stall during the fault phase (a
    /// quarter of them are never delivered, on a connection that stays open: the host's
    /// handshake deadline must give up on it). Drawn from the conns stream, after `strangers`.
    stalled_welcomes: bool,
    /// Live simulated connections between hosts (or strangers) and the directory.
    conns: BTreeMap<ConnId, conns::SimConn>,
    next_conn: ConnId,
    /// Each host process's link to the directory (none while the host is down).
    links: Vec<Option<conns::HostLink>>,
    /// Each host process's connections with the other hosts (none while the host is down).
    peers: Vec<Option<PeerLinks>>,
    /// When each host's next `PeerTick` is scheduled (on its clock), if one is.
    peer_ticks: Vec<Option<Instant>>,
    directory: DirectoryNode,
    hosts: Vec<HostNode>,
    blocked: BTreeSet<(NodeId, NodeId)>,
    flapped: BTreeSet<Address>,
    phase: Phase,
    /// What discovery announces when no outage hides it (the serving directory, if any).
    announced: Option<Discovered>,
    /// How many authority outages are in progress.
    outages: u32,
    /// Discovery's current answer, and its version.
    published: Option<Discovered>,
    /// Workers started so far (each gets a world-unique number).
    workers_started: u32,
    /// Frames on their way per link (from node, to node), for the overload regime's bound.
    in_flight: BTreeMap<(NodeId, NodeId), usize>,
    discovery_version: u64,
    heal_at: Instant,
    end_at: Instant,
    outbox: Outbox,
    /// Scratch for the sources a host's bindings bind before its step (H-D6).
    bound_scratch: Vec<u64>,
    /// What the run did.
    pub stats: Stats,
    /// The checkers.
    pub checker: Checker,
    /// The trace (hash, and text when asked for).
    pub trace: Trace,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The first violation, if any.
    pub failure: Option<String>,
    /// Events processed.
    pub events: u64,
    /// Simulated time at the end.
    pub sim_time: Duration,
    /// Hash of the whole event trace.
    pub trace_hash: u64,
}

fn uniform(rng: &mut SimRng, max: Duration) -> Duration {
    Duration::from_nanos(rng.range(0, max.as_nanos()))
}

/// Most host crashes aimed at one kind of work in flight per run (`aim_crash`).
const AIMED_CRASHES_MAX: u64 = 2;
/// How soon a host whose crash was aimed starts again (at most): soon, so that its restart
/// meets the work it left.
const AIMED_CRASH_RESTART_MAX: Duration = Duration::from_millis(2_000);

/// How soon a supervisor starts a process that died at boot again (at most).
const BOOT_CRASH_RESTART_MAX: Duration = Duration::from_millis(250);

/// True with probability `permille`/1000 (no draw when it is 0, so seeds without the
/// behaviour draw nothing).
fn permille(rng: &mut SimRng, permille: u64) -> bool {
    permille > 0 && rng.below(1_000) < permille
}

impl World {
    /// The directory node's clock now (each node reads its own clock: `crate::clock`).
    fn dir_now(&self) -> Instant {
        self.options.clocks[0].local(self.now)
    }

    /// `host`'s clock now.
    fn host_now(&self, host: usize) -> Instant {
        self.options.clocks[host + 1].local(self.now)
    }

    /// When (global time) the directory node's clock reads `at`.
    fn dir_at(&self, at: Instant) -> Instant {
        self.options.clocks[0].global(at, self.now)
    }

    /// When (global time) `host`'s clock reads `at`.
    fn host_at(&self, host: usize, at: Instant) -> Instant {
        self.options.clocks[host + 1].global(at, self.now)
    }

    /// Builds the world of `options`; `trace_text` keeps a readable event log.
    pub fn new(options: Options, trace_text: bool) -> World {
        World::with_trace(options, Trace::new(trace_text))
    }

    /// Builds the world of `options` with its trace (which may stream to files).
    pub fn with_trace(options: Options, trace: Trace) -> World {
        let mut first_global = 0;
        let mut file_tags = 0;
        let mut hosts = options
            .clients_per_host
            .iter()
            .enumerate()
            .map(|(i, &clients)| {
                let mut host = HostNode::new(NodeId(1 + i as u64), clients, first_global);
                first_global += clients;
                // Every host's disk holds files workers may publish as file blobs: a small
                // one, one of half the largest blob and one of the largest.
                let blob_max = options.host.blob_max.max(FILE_LENGTH_MIN);
                let small = FILE_LENGTH_MIN + (options.seed.wrapping_add(i as u64) % 2_048);
                for (k, length) in [small, blob_max / 2, blob_max].into_iter().enumerate() {
                    file_tags += 1;
                    let length = length.max(FILE_LENGTH_MIN);
                    host.mem.files.write(
                        &file_name(k),
                        crate::worker::content(FILE_TAG_BASE + file_tags, length),
                    );
                }
                host
            })
            .collect::<Vec<HostNode>>();
        for (host, node) in hosts.iter_mut().enumerate() {
            if late_join(&options, host).is_some() {
                node.not_yet_joined();
            }
        }
        let heal_at = Instant::ZERO.saturating_add(options.fault_phase);
        let end_at = heal_at.saturating_add(options.liveness_bound);
        let checker = Checker::new(&options);
        let mut conn_rng = options.entropy.rng(Stream::Conns);
        let key = std::array::from_fn(|i| (conn_rng.next_u64() >> (i % 8)) as u8);
        let strangers = conn_rng.chance(ratio(1, 3));
        let stalled_welcomes = conn_rng.chance(ratio(1, 3));
        World {
            conn_rng,
            boot_rng: options.entropy.rng(Stream::Boots),
            aim_rng: options.entropy.rng(Stream::Aims),
            aimed: BTreeMap::new(),
            gone_sent: BTreeSet::new(),
            gone_resent: BTreeMap::new(),
            file_sources: BTreeMap::new(),
            questions: BTreeMap::new(),
            stall_rng: options.entropy.rng(Stream::Stalls),
            stall_episodes: 0,
            host_pauses: (0..options.clients_per_host.len()).map(|_| None).collect(),
            host_resumed: vec![None; options.clients_per_host.len()],
            cluster_key: ClusterKey::from_bytes(key),
            strangers,
            stalled_welcomes,
            conns: BTreeMap::new(),
            next_conn: 1,
            links: (0..options.clients_per_host.len()).map(|_| None).collect(),
            peers: (0..options.clients_per_host.len()).map(|_| None).collect(),
            peer_ticks: vec![None; options.clients_per_host.len()],
            now: Instant::ZERO,
            queue: EventQueue::default(),
            seq: 0,
            net_rng: options.entropy.rng(Stream::Network),
            fault_rng: options.entropy.rng(Stream::Faults),
            spoof_rng: options.entropy.rng(Stream::Spoof),
            file_tags,
            env_rng: options.entropy.rng(Stream::Environment),
            work_rng: options.entropy.rng(Stream::Workload),
            disk_rng: options.entropy.rng(Stream::Disk),
            directory: DirectoryNode {
                machine: None,
                boot: 0,
                fs: {
                    let mut fs = SimFs::new(options.entropy.rng(Stream::Storage));
                    fs.fsync_failure = options.disk.fsync_failure;
                    fs
                },
                log: None,
                rot: None,
                full_episode: 0,
                freed_at: None,
                space: SpaceGate::new(SPACE_RESERVE, LOG_SPACE_RETRY),
                taking_op: false,
                booted: false,
                sync: None,
                sync_generation: 0,
                barrier: Barrier::new(0),
                release_after: VecDeque::new(),
                last_record_end: 0,
                unsynced_steps: VecDeque::new(),
                failed_step: None,
                step: 0,
                timer_generation: 0,
                routes: Routes::new(),
                route_versions: BTreeMap::new(),
                route_version: 0,
                membership: Membership::default(),
                boots_used: 0,
                admitted: vec![None; options.clients_per_host.len()],
                maybe_admitted: vec![None; options.clients_per_host.len()],
                newest_admitted: vec![0; options.clients_per_host.len()],
                conns: None,
                expiry_armed: None,
                promises: promises::Promises::default(),
                paused: None,
                deferred: Vec::new(),
            },
            hosts,
            blocked: BTreeSet::new(),
            flapped: BTreeSet::new(),
            phase: Phase::Faulty,
            announced: None,
            outages: 0,
            published: None,
            in_flight: BTreeMap::new(),
            workers_started: 0,
            discovery_version: 0,
            heal_at,
            end_at,
            outbox: Outbox::new(),
            bound_scratch: Vec::new(),
            stats: Stats::default(),
            checker,
            trace,
            options,
        }
    }

    fn schedule(&mut self, at: Instant, kind: EventKind) {
        self.seq += 1;
        self.queue.push(at, self.seq, kind);
    }

    fn schedule_in(&mut self, delay: Duration, kind: EventKind) {
        self.schedule(self.now.saturating_add(delay), kind);
    }

    /// The raw draws of the run so far, per stream (empty unless its entropy records).
    pub fn take_tape(&mut self) -> crate::rng::Tape {
        let mut tape = crate::rng::Tape::default();
        tape.set_stream(Stream::Options, self.options.options_draws.clone());
        tape.set_stream(Stream::Network, self.net_rng.take_record());
        tape.set_stream(Stream::Faults, self.fault_rng.take_record());
        tape.set_stream(Stream::Spoof, self.spoof_rng.take_record());
        tape.set_stream(Stream::Environment, self.env_rng.take_record());
        tape.set_stream(Stream::Workload, self.work_rng.take_record());
        tape.set_stream(Stream::Disk, self.disk_rng.take_record());
        tape.set_stream(Stream::Storage, self.directory.fs.take_record());
        tape.set_stream(Stream::Conns, self.conn_rng.take_record());
        tape.set_stream(Stream::Boots, self.boot_rng.take_record());
        tape.set_stream(Stream::Stalls, self.stall_rng.take_record());
        tape.set_stream(Stream::Aims, self.aim_rng.take_record());
        tape
    }

    /// Runs to the end and returns how it went.
    pub fn run(mut self) -> (Outcome, World) {
        self.stats.actors = self.options.actors();
        self.start();
        if self.options.long_life.is_some() {
            self.checker.coverage.hit("regime.long_life");
        }
        while let Some(event) = self.queue.pop() {
            self.now = event.at;
            self.checker.set_time(event.at);
            self.stats.events += 1;
            self.trace
                .event(event.at, event.seq, &event.kind, |kind| match kind {
                    EventKind::Deliver(e) => {
                        format!(
                            "deliver {} -> {}: {}",
                            e.from,
                            e.to,
                            crate::trace::describe(&e.message, e.to)
                        )
                    }
                    EventKind::Local { envelope: e, .. } => {
                        format!(
                            "local {} -> {}: {}",
                            e.from,
                            e.to,
                            crate::trace::describe(&e.message, e.to)
                        )
                    }
                    EventKind::HostSend { envelope: e, .. } => {
                        format!(
                            "send {} -> {}: {}",
                            e.from,
                            e.to,
                            crate::trace::describe(&e.message, e.to)
                        )
                    }
                    other => format!("{other:?}"),
                });
            if self.stats.events > EVENT_BUDGET {
                self.checker
                    .fail(self.now, "event budget exhausted (runaway run)".into());
            }
            // The run ends at an End that checks the liveness properties (an earlier one may
            // defer to the rotation's drain, see `drained_by`).
            let end = event.kind == EventKind::End && self.now >= self.drained_by();
            self.handle(event.kind);
            if end || self.checker.failed() || self.stats.events >= self.options.event_limit {
                break;
            }
        }
        if let Some(failure) = self.checker.failure() {
            let failure = failure.to_owned();
            self.trace
                .note(self.now, "check", || format!("violated: {failure}"));
        }
        let outcome = Outcome {
            failure: self.checker.failure().map(str::to_owned),
            events: self.stats.events,
            sim_time: self.now.saturating_since(Instant::ZERO),
            trace_hash: self.trace.hash(),
        };
        (outcome, self)
    }

    fn start(&mut self) {
        self.restart_directory();
        for host in 0..self.hosts.len() {
            if let Some(at) = late_join(&self.options, host) {
                self.schedule(
                    Instant::ZERO.saturating_add(at),
                    EventKind::HostRestart(host),
                );
                continue;
            }
            self.start_proxy(host);
            self.boot_machine(host);
            self.start_link(host);
        }
        for host in 0..self.hosts.len() {
            // (A late joiner has no clients until it joins.)
            for client in 0..self.hosts[host].clients.len() {
                let delay = uniform(&mut self.work_rng, self.options.workload.think_mean);
                let incarnation = self.hosts[host].incarnation;
                self.schedule_in(
                    delay,
                    EventKind::ClientWake {
                        host,
                        incarnation,
                        client,
                        generation: 0,
                    },
                );
            }
        }
        let recurring = [
            (self.options.partitions, EventKind::PartitionStart),
            (self.options.directory_crashes, EventKind::DirCrash),
            (self.options.host_crashes, EventKind::HostCrash),
            (self.options.route_flaps, EventKind::FlapStart),
            (self.options.actor_deaths, EventKind::ActorDeath),
            (self.options.revocations, EventKind::Revocation),
            (self.options.spoofs, EventKind::Spoof),
            (self.options.file_changes, EventKind::FileChange),
            (self.options.proxy_restarts, EventKind::ProxyCrash),
            (self.options.authority_outages, EventKind::OutageStart),
            (self.options.disk.full_disk, EventKind::DiskFull),
        ];
        for (fault, kind) in recurring {
            if let Some(fault) = fault {
                self.schedule_next(fault, kind);
            }
        }
        if let Some(every) = self.options.registrar.resync {
            self.schedule_in(every, EventKind::RouteResync);
        }
        self.schedule_next_stall();
        self.schedule_next_host_pause();
        self.schedule(self.heal_at, EventKind::Heal);
        self.schedule(self.end_at, EventKind::End);
    }

    fn schedule_next(&mut self, fault: Recurring, kind: EventKind) {
        let delay =
            Duration::from_nanos(self.fault_rng.exponential(fault.mean_interval.as_nanos()));
        if self.now.saturating_add(delay) < self.heal_at {
            self.schedule_in(delay, kind);
        }
    }

    fn handle(&mut self, kind: EventKind) {
        if self.directory.paused.is_some() && self.for_directory_process(&kind) {
            // In its sockets, its timer or its fsync's completion: taken when it resumes.
            self.directory.deferred.push(kind);
            return;
        }
        if let Some(host) = self.host_process_of(&kind)
            && let Some(pause) = self.host_pauses[host].as_mut()
        {
            pause.deferred.push(kind);
            return;
        }
        match kind {
            EventKind::Deliver(envelope) => self.deliver(*envelope),
            EventKind::DirTimer { boot, generation } => {
                let d = &self.directory;
                if d.machine.is_some() && d.boot == boot && d.timer_generation == generation {
                    self.directory_input(DirInput::Timer);
                }
            }
            EventKind::DirSync { boot, generation } => self.sync_done(boot, generation),
            EventKind::DirRoute {
                boot,
                target,
                routable,
                version,
            } => {
                let d = &self.directory;
                let watched = d.routes.is_watched(&target);
                let newest = watched && d.route_versions.get(&target) == Some(&version);
                // An out-of-order registrar delivers every report: stale ones, and ones for
                // targets whose watch has ended (the directory must ignore those).
                let deliver = newest || self.options.registrar.resync.is_some();
                if d.machine.is_some() && d.boot == boot && deliver {
                    if !watched {
                        self.checker.coverage.hit("registrar.unwatched_report");
                    } else if !newest {
                        self.checker.coverage.hit("registrar.stale_report");
                    }
                    self.directory_input(DirInput::Route { target, routable });
                }
            }
            EventKind::RouteResync => {
                if self.directory.machine.is_some() {
                    let watched: Vec<(Address, bool)> = self
                        .directory
                        .routes
                        .watched()
                        .filter_map(|t| self.directory.routes.reported(t).map(|r| (*t, r)))
                        .collect();
                    for (target, routable) in watched {
                        self.send_route_report(target, routable);
                    }
                }
                // Until the run ends (which may wait past `end_at` for the rotation's drain).
                if let Some(every) = self.options.registrar.resync
                    && self.now < self.drained_by()
                {
                    self.schedule_in(every, EventKind::RouteResync);
                }
            }
            EventKind::DirCrash => {
                if self.directory.machine.is_some() {
                    self.crash_directory();
                }
                if let Some(f) = self.options.directory_crashes {
                    self.schedule_next(f, EventKind::DirCrash);
                }
            }
            EventKind::DirRestart => {
                if self.directory.machine.is_none() {
                    self.restart_directory();
                }
            }
            EventKind::DiskFull => self.disk_full(),
            EventKind::DiskFreed { episode } => {
                if self.directory.full_episode == episode {
                    self.directory.fs.capacity = None;
                    self.directory.freed_at = Some(self.now);
                }
            }
            EventKind::HostCrash => {
                let up: Vec<usize> = (0..self.hosts.len())
                    .filter(|&h| self.hosts[h].up)
                    .collect();
                if !up.is_empty() {
                    let host = *self.fault_rng.pick(&up);
                    let max = self
                        .options
                        .host_crashes
                        .map_or(Duration::ZERO, |f| f.max_duration);
                    let down = uniform(&mut self.fault_rng, max);
                    self.crash_host(host, down);
                }
                if let Some(f) = self.options.host_crashes {
                    self.schedule_next(f, EventKind::HostCrash);
                }
            }
            EventKind::BootCrash { host, nonce } => {
                let h = &self.hosts[host];
                // Still the boot the crash was drawn for, up or saying hello.
                if h.boot_nonce == nonce && (h.up || self.links[host].is_some()) {
                    self.checker.coverage.hit(if h.up {
                        "fault.boot_crash_after_welcome"
                    } else {
                        "fault.boot_crash_in_handshake"
                    });
                    let down = uniform(&mut self.boot_rng, BOOT_CRASH_RESTART_MAX);
                    self.crash_host(host, down);
                }
            }
            EventKind::HostRestart(host) => self.restart_host(host),
            EventKind::AimedCrash { host, nonce, work } => {
                if self.hosts[host].up && self.hosts[host].boot_nonce == nonce {
                    self.checker.coverage.hit(work);
                    let down = uniform(&mut self.aim_rng, AIMED_CRASH_RESTART_MAX);
                    self.crash_host(host, down);
                }
            }
            EventKind::ConnOpen { conn } => self.conn_open(conn),
            EventKind::ConnFrame {
                conn,
                to_acceptor,
                bytes,
            } => self.conn_frame(conn, to_acceptor, bytes),
            EventKind::ConnClosed { conn, to_acceptor } => self.conn_closed(conn, to_acceptor),
            EventKind::LinkRetry { host, nonce } => self.link_retry(host, nonce),
            EventKind::DirConnsExpire { boot } => self.dir_conns_expire(boot),
            EventKind::BookTick { host, nonce } => self.book_tick(host, nonce),
            EventKind::HostSend {
                host,
                incarnation,
                envelope,
            } => {
                let h = &self.hosts[host];
                if h.up && h.incarnation == incarnation {
                    let Envelope { from, to, message } = *envelope;
                    self.send(from, to, message);
                }
            }
            EventKind::ClientWake {
                host,
                incarnation,
                client,
                generation,
            } => {
                let h = &self.hosts[host];
                let current = h.up
                    && h.incarnation == incarnation
                    && h.clients
                        .get(client)
                        .is_some_and(|c| c.wake_generation == generation);
                if current {
                    self.client_step(host, client, |c, io| c.wake(io));
                }
            }
            EventKind::AgentTick {
                host,
                incarnation,
                arming,
            } => {
                let local = self.host_now(host);
                let h = &mut self.hosts[host];
                if h.up && h.incarnation == incarnation && h.agent_timer_generation == arming {
                    let mut out = HostOutput::default();
                    if let Err(error) =
                        h.agent
                            .handle_timer(local, Timer::AgentTick, &mut self.outbox)
                    {
                        self.checker
                            .fail(self.now, format!("the agent refused its tick: {error}"));
                    }
                    let effects = self.outbox.take();
                    if effects.iter().any(|e| matches!(e, Effect::Send { .. })) {
                        self.checker.coverage.hit("agent.report_resent");
                    }
                    self.hosts[host].agent_effects(effects, &mut out);
                    self.host_output(host, out);
                }
            }
            EventKind::PartitionStart => {
                let host = self.fault_rng.below(self.hosts.len() as u64) as usize;
                let node = self.hosts[host].node;
                let pairs = match self.fault_rng.below(3) {
                    0 => vec![(DIRECTORY_NODE, node)],
                    1 => vec![(node, DIRECTORY_NODE)],
                    _ => vec![(DIRECTORY_NODE, node), (node, DIRECTORY_NODE)],
                };
                let max = self
                    .options
                    .partitions
                    .map_or(Duration::ZERO, |f| f.max_duration);
                for (from, to) in pairs {
                    self.blocked.insert((from, to));
                    let length = uniform(&mut self.fault_rng, max);
                    self.trace.note(self.now, "fault", || {
                        format!("partition: {from} -> {to} cut for {length}")
                    });
                    self.schedule_in(length, EventKind::PartitionEnd { from, to });
                }
                self.stats.partitions += 1;
                self.checker.coverage.hit("fault.partition");
                self.report_routes();
                if let Some(f) = self.options.partitions {
                    self.schedule_next(f, EventKind::PartitionStart);
                }
            }
            EventKind::PartitionEnd { from, to } => {
                self.blocked.remove(&(from, to));
                self.report_routes();
            }
            EventKind::FlapStart => {
                let watched: Vec<Address> = self.directory.routes.watched().copied().collect();
                if !watched.is_empty() {
                    let target = *self.fault_rng.pick(&watched);
                    self.flapped.insert(target);
                    self.stats.route_flaps += 1;
                    self.checker.coverage.hit("fault.route_flap");
                    let max = self
                        .options
                        .route_flaps
                        .map_or(Duration::ZERO, |f| f.max_duration);
                    let length = uniform(&mut self.fault_rng, max);
                    self.trace.note(self.now, "fault", || {
                        format!("route flap: {target} unroutable for {length}")
                    });
                    self.schedule_in(length, EventKind::FlapEnd(target));
                    self.report_routes();
                }
                if let Some(f) = self.options.route_flaps {
                    self.schedule_next(f, EventKind::FlapStart);
                }
            }
            EventKind::FlapEnd(target) => {
                self.flapped.remove(&target);
                self.directory.routes.set_lost(target, false);
                self.report_routes();
            }
            EventKind::ActorDeath => {
                self.kill_random_actor();
                if let Some(f) = self.options.actor_deaths {
                    self.schedule_next(f, EventKind::ActorDeath);
                }
            }
            EventKind::Revocation => {
                self.revoke_random_session();
                if let Some(f) = self.options.revocations {
                    self.schedule_next(f, EventKind::Revocation);
                }
            }
            EventKind::FileChange => {
                if self.phase == Phase::Faulty {
                    self.change_random_file();
                }
                if let Some(f) = self.options.file_changes {
                    self.schedule_next(f, EventKind::FileChange);
                }
            }
            EventKind::Spoof => {
                if self.phase == Phase::Faulty {
                    self.spoof();
                }
                if let Some(f) = self.options.spoofs {
                    self.schedule_next(f, EventKind::Spoof);
                }
            }
            EventKind::Local {
                host,
                incarnation,
                envelope,
            } => {
                let h = &self.hosts[host];
                if h.up && h.incarnation == incarnation {
                    let Envelope { from, to, message } = *envelope;
                    self.deliver_to_host(host, from, to, message);
                }
            }
            EventKind::HostTick {
                host,
                incarnation,
                arming,
            } => {
                let h = &self.hosts[host];
                if h.up && h.incarnation == incarnation && h.host_timer_generation == arming {
                    self.machine_input(host, MachineInput::Tick);
                }
            }
            EventKind::WorkerWake {
                host,
                incarnation,
                slot,
                generation,
            } => {
                let h = &self.hosts[host];
                let current = h.up
                    && h.incarnation == incarnation
                    && h.workers
                        .get(slot)
                        .is_some_and(|w| w.wake_generation == generation);
                if current {
                    self.worker_step(host, slot, |w, io| w.wake(io));
                }
            }
            EventKind::ProxyTimer {
                host,
                incarnation,
                generation,
                arming,
            } => {
                let h = &self.hosts[host];
                let current = h.up
                    && h.incarnation == incarnation
                    && h.proxy_generation == generation
                    && h.proxy_timer_generation == arming;
                if current {
                    self.proxy_input(host, ProxyInput::Timer);
                }
            }
            EventKind::Discovery {
                host,
                incarnation,
                generation,
                version,
                found,
            } => {
                let h = &mut self.hosts[host];
                let current = h.up
                    && h.incarnation == incarnation
                    && h.proxy_generation == generation
                    && h.proxy.is_some()
                    && version >= h.discovery_version;
                if current {
                    h.discovery_version = version;
                    self.proxy_input(host, ProxyInput::Discovery(found));
                    // Discovery may tell a proxy the same answer again (a legal, unhelpful
                    // repeat): nothing may change twice.
                    if permille(&mut self.env_rng, self.options.discovery_repeat_permille) {
                        self.checker.coverage.hit("discovery.repeated");
                        let again = uniform(&mut self.env_rng, Duration::from_millis(500));
                        self.schedule_in(
                            again,
                            EventKind::Discovery {
                                host,
                                incarnation,
                                generation,
                                version,
                                found,
                            },
                        );
                    }
                }
            }
            EventKind::ProxyCrash => {
                let running: Vec<usize> = (0..self.hosts.len())
                    .filter(|&h| self.hosts[h].up && self.hosts[h].proxy.is_some())
                    .collect();
                if !running.is_empty() {
                    let host = *self.fault_rng.pick(&running);
                    self.stop_proxy(host);
                    self.stats.proxy_restarts += 1;
                    self.checker.coverage.hit("fault.proxy_restart");
                    let max = self
                        .options
                        .proxy_restarts
                        .map_or(Duration::ZERO, |f| f.max_duration);
                    let down = uniform(&mut self.fault_rng, max);
                    let incarnation = self.hosts[host].incarnation;
                    let node = self.hosts[host].node;
                    self.trace.note(self.now, "fault", || {
                        format!("proxy restart: node {node}'s proxy down for {down}")
                    });
                    self.schedule_in(down, EventKind::ProxyStart { host, incarnation });
                }
                if let Some(f) = self.options.proxy_restarts {
                    self.schedule_next(f, EventKind::ProxyCrash);
                }
            }
            EventKind::ProxyStart { host, incarnation } => {
                let h = &self.hosts[host];
                if h.up && h.incarnation == incarnation && h.proxy.is_none() {
                    self.start_proxy(host);
                    self.machine_input(host, MachineInput::ProxyRestarted);
                    for client in 0..self.hosts[host].clients.len() {
                        self.client_step(host, client, |c, io| c.proxy_restarted(io));
                    }
                }
            }
            EventKind::OutageStart => {
                self.outages += 1;
                self.stats.authority_outages += 1;
                self.checker.coverage.hit("fault.authority_outage");
                self.publish_discovery();
                let max = self
                    .options
                    .authority_outages
                    .map_or(Duration::ZERO, |f| f.max_duration);
                let length = uniform(&mut self.fault_rng, max);
                self.trace.note(self.now, "fault", || {
                    format!("authority outage: discovery answers none for {length}")
                });
                self.schedule_in(length, EventKind::OutageEnd);
                if let Some(f) = self.options.authority_outages {
                    self.schedule_next(f, EventKind::OutageStart);
                }
            }
            EventKind::OutageEnd => {
                self.outages = self.outages.saturating_sub(1);
                self.publish_discovery();
            }
            EventKind::AuthorityLost { boot } => {
                if self.directory.machine.is_none() && self.directory.boot == boot {
                    self.announced = None;
                    self.publish_discovery();
                }
            }
            EventKind::PeerTick { host, nonce } => self.peer_tick(host, nonce),
            EventKind::StallStart => self.start_stall(),
            EventKind::StallEnd { episode } => self.end_stall(episode),
            EventKind::SilenceCheck {
                host,
                conn,
                episode,
            } => self.check_silence(host, conn, episode),
            EventKind::HostPauseStart => self.start_host_pause(),
            EventKind::HostPauseEnd { host, episode } => {
                if self.host_pauses[host]
                    .as_ref()
                    .is_some_and(|p| p.episode == episode)
                {
                    self.resume_host(host);
                }
            }
            EventKind::DirSilenceCheck { conn } => self.check_directory_let_go(conn),
            EventKind::Heal => self.heal(),
            EventKind::End if self.now < self.drained_by() => {
                // S25: a rotation reaches every obligation within ⌈N/batch⌉ retry ticks, N the
                // most pending. A storm beyond one pass (a small batch, a long tick, and
                // registrars that never report a target routable, so nothing wakes it) needs
                // that long to drain after the heal; the liveness bound waits for it.
                self.checker
                    .coverage
                    .hit("liveness.waited_for_the_rotation");
                let at = self.drained_by();
                self.schedule(at, EventKind::End);
            }
            EventKind::End => {
                let view = crate::check::EndView {
                    directory: self.directory.machine.as_ref(),
                    hosts: &self.hosts,
                };
                self.checker.at_end(self.now, &view);
            }
        }
    }

    // ---------------------------------------------------------------- network

    fn link_up(&self, from: NodeId, to: NodeId) -> bool {
        !self.blocked.contains(&(from, to))
    }

    fn latency(&mut self) -> Duration {
        let n = &self.options.net;
        let jitter = self.net_rng.exponential(n.latency_jitter_mean.as_nanos());
        n.latency_min.saturating_add(Duration::from_nanos(jitter))
    }

    /// Sends a frame: between hosts through the sender's peer links (`peers`), which may hold
    /// it for a handshake; then on the network.
    fn send(&mut self, from: Address, to: Address, message: Message) {
        self.aim_crash(from, to, &message);
        if let Message::Call(call) = &message
            && let DirectoryRequest::Register {
                path,
                source,
                length,
                recovery,
                ..
            } = &call.request
            && source.incarnation == PERSISTENT_INCARNATION
        {
            self.check_file_source(path, *source, *length, recovery);
        }
        if let (Some(a), Some(b)) = (self.host_index(from.node), self.host_index(to.node))
            && a != b
        {
            let envelope = Envelope { from, to, message };
            if let Some(Envelope { from, to, message }) = self.peer_gate(a, b, envelope) {
                self.send_net(from, to, message);
            }
            return;
        }
        self.send_net(from, to, message);
    }

    /// Hands a frame to the network: it may be lost, duplicated or delayed past later frames.
    fn send_net(&mut self, from: Address, to: Address, message: Message) {
        self.stats.frames += 1;
        let faulty = self.phase == Phase::Faulty;
        let link_down = !self.link_up(from.node, to.node);
        // As the real nodes do: the directory sends only on a host's admitted connection, and
        // a host only on its welcomed link to the directory (`conns`).
        let unconnected = !self.connected(from.node, to.node);
        if unconnected {
            self.checker.coverage.hit("conns.frame_unconnected");
        }
        if link_down || unconnected || (faulty && self.net_rng.chance(self.options.net.loss)) {
            if unconnected && !link_down {
                self.stats.unconnected += 1;
            } else {
                self.stats.lost += 1;
            }
            self.checker.coverage.hit("fault.frame_lost");
            self.trace.note(self.now, "net", || {
                format!(
                    "lost ({}) {from} -> {to}: {}",
                    if link_down {
                        "no link"
                    } else if unconnected {
                        "no connection"
                    } else {
                        "loss"
                    },
                    crate::trace::describe(&message, to)
                )
            });
            return;
        }
        let mut delay = self.latency();
        // A stalled connection holds the frames it carries until the stall ends.
        if let Some(until) = self
            .envelope_conn(from.node, to.node)
            .and_then(|(conn, to_directory)| self.stall_holds(conn, to_directory))
        {
            delay = until.saturating_since(self.now).saturating_add(delay);
        }
        if faulty && self.net_rng.chance(self.options.net.reorder) {
            self.stats.reordered += 1;
            self.checker.coverage.hit("fault.frame_reordered");
            let held = uniform(&mut self.net_rng, self.options.net.reorder_delay_max);
            delay = delay.saturating_add(held);
            self.trace.note(self.now, "net", || {
                format!(
                    "held back {held} {from} -> {to}: {}",
                    crate::trace::describe(&message, to)
                )
            });
        }
        let envelope = Box::new(Envelope { from, to, message });
        if faulty && self.net_rng.chance(self.options.net.duplicate) && self.enqueue(from, to) {
            self.stats.duplicated += 1;
            self.checker.coverage.hit("fault.frame_duplicated");
            let again = self.latency().saturating_add(delay);
            self.trace.note(self.now, "net", || {
                format!(
                    "duplicated {from} -> {to} (second copy in {again}): {}",
                    crate::trace::describe(&envelope.message, envelope.to)
                )
            });
            self.schedule_in(again, EventKind::Deliver(envelope.clone()));
        }
        if self.enqueue(from, to) {
            self.schedule_in(delay, EventKind::Deliver(envelope));
        } else {
            self.trace.note(self.now, "net", || {
                format!(
                    "dropped (link queue full) {from} -> {to}: {}",
                    crate::trace::describe(&envelope.message, envelope.to)
                )
            });
        }
    }

    /// Whether the link from `from` to `to` takes one more frame. Under overload a link holds
    /// at most `link_frames_max` frames on their way and drops the rest, as a real node's
    /// bounded writer queue does (in every phase: real queues stay bounded after a heal).
    fn enqueue(&mut self, from: Address, to: Address) -> bool {
        let Some(max) = self.options.overload.as_ref().map(|o| o.link_frames_max) else {
            return true;
        };
        let queued = self.in_flight.entry((from.node, to.node)).or_insert(0);
        if *queued >= max {
            self.stats.lost += 1;
            self.checker.coverage.hit("fault.link_queue_full");
            return false;
        }
        *queued += 1;
        true
    }

    fn deliver(&mut self, envelope: Envelope) {
        if self.options.overload.is_some()
            && let Some(queued) = self
                .in_flight
                .get_mut(&(envelope.from.node, envelope.to.node))
        {
            *queued = queued.saturating_sub(1);
        }
        if envelope.to.node == DIRECTORY_NODE {
            if self.directory.machine.is_some() {
                // The frame came over the link of the node it was sent from; what it may say
                // is the directory node's decision, as `dataplane-node` takes it.
                let link = envelope.from.node;
                if !admission::speaks_for(link, &envelope) {
                    self.checker.coverage.hit("admission.refused_foreign_frame");
                    self.trace.note(self.now, "admission", || {
                        format!(
                            "refused a frame on the link of {link} that speaks for another node: {}",
                            crate::trace::describe(&envelope.message, envelope.to)
                        )
                    });
                    return;
                }
                if let Some(foreign) = speaks_for_another(link, &envelope) {
                    self.checker.fail(
                        self.now,
                        format!(
                            "admission: the directory took a frame on the link of {link} that \
                             speaks for {foreign}: {:?}",
                            envelope.message
                        ),
                    );
                    return;
                }
                self.directory_input(DirInput::Message(envelope.message));
            }
            return;
        }
        let Some(host) = self.host_index(envelope.to.node) else {
            return;
        };
        self.deliver_to_host(host, envelope.from, envelope.to, envelope.message);
    }

    /// How long a client waits for its proxy's answer before assuming the proxy lost it.
    fn guard(&self) -> Duration {
        let p = &self.options.proxy;
        p.deadline
            .saturating_add(p.retry_period.saturating_mul(3))
            .saturating_add(Duration::from_secs(1))
    }

    fn deliver_to_host(&mut self, host: usize, from: Address, to: Address, message: Message) {
        let guard = self.guard();
        let mut out = HostOutput::default();
        // ARCHITECTURE "Lost blobs": a live node answers at once for an actor of one of its
        // earlier incarnations. Restated here from the frame, not asked of the agent.
        let owed = (self.hosts[host].up && to.incarnation < self.hosts[host].incarnation)
            .then(|| answer_owed_for_ended(to, &message))
            .flatten();
        if let Message::GoneAcknowledged { scope } = message
            && to.actor == crate::host::AGENT
        {
            // The agent hears it acknowledged: a report of the same scope after this is a
            // new one.
            self.gone_sent.remove(&(host, to.incarnation, scope));
        }
        {
            let now = self.host_now(host);
            let mut next_actor = self.hosts[host].next_actor;
            let mut io = Io {
                now,
                rng: &mut self.work_rng,
                options: &self.options.workload,
                paths: &self.options.paths,
                next_actor: &mut next_actor,
                guard,
                actions: Vec::new(),
            };
            self.hosts[host].deliver(from, to, message, &mut io, &mut out);
            self.hosts[host].next_actor = self.hosts[host].next_actor.max(next_actor);
        }
        if let Some((reply_to, answer)) = owed
            && !out
                .sends
                .iter()
                .any(|(_, t, m)| *t == reply_to && *m == answer)
        {
            self.checker.fail(
                self.now,
                format!(
                    "ended actors: n{}.{} did not answer {answer:?} to {reply_to} for {to}, an actor of an earlier incarnation",
                    self.hosts[host].node.0, self.hosts[host].incarnation
                ),
            );
        }
        self.host_output(host, out);
    }

    /// A frame between two actors of one node: reliable, in order, `LOCAL_LATENCY` later.
    fn local(
        &mut self,
        host: usize,
        incarnation: u64,
        from: Address,
        to: Address,
        message: Message,
    ) {
        let envelope = Box::new(Envelope { from, to, message });
        self.schedule_in(
            LOCAL_LATENCY,
            EventKind::Local {
                host,
                incarnation,
                envelope,
            },
        );
    }

    fn host_index(&self, node: NodeId) -> Option<usize> {
        let index = (node.0 as usize).checked_sub(1)?;
        (index < self.hosts.len()).then_some(index)
    }

    fn host_output(&mut self, host: usize, out: HostOutput) {
        let incarnation = self.hosts[host].incarnation;
        if let Some((arming, at)) = out.agent_tick {
            self.schedule(
                self.host_at(host, at),
                EventKind::AgentTick {
                    host,
                    incarnation,
                    arming,
                },
            );
        }
        for effect in &out.unexpected {
            self.checker.fail(
                self.now,
                format!("host {host}'s agent emitted an effect it cannot perform: {effect:?}"),
            );
        }
        // Retention, seen by the callers: a client that heard OperationExpired for an
        // operation it still asks about says so.
        for client in &mut self.hosts[host].clients {
            for violation in client.violations.drain(..) {
                self.checker
                    .fail(self.now, format!("retention: {violation}"));
            }
        }
        for (from, to, message) in out.sends {
            if matches!(
                message,
                Message::ChunkRefused {
                    reason: dataplane_core::wire::ChunkRefusal::IncarnationEnded
                }
            ) {
                // A restarted node refused a transfer for its dead source: the reader learns
                // the blob is lost before the directory has the node's gone report.
                self.checker.coverage.hit("host.refused_ended_incarnation");
            }
            if let Message::AddressGone { scope, .. } = message
                && from.actor == crate::host::AGENT
            {
                self.check_gone_paced(host, from.incarnation, scope);
            }
            self.send(from, to, message);
        }
        for (from, to, message) in out.local {
            self.local(host, incarnation, from, to, message);
        }
        for message in out.to_proxy {
            self.proxy_input(host, ProxyInput::Message(message));
        }
        for (from, to, message) in out.to_machine {
            self.machine_input(host, MachineInput::Message(from, to, message));
        }
        for (slot, message) in out.to_worker {
            if let Message::ToChild(event) = message {
                self.worker_step(host, slot, |w, io| w.event(event, io));
            }
        }
        for (delay, from, to, message) in out.delayed {
            let envelope = Box::new(Envelope { from, to, message });
            self.schedule_in(
                delay,
                EventKind::HostSend {
                    host,
                    incarnation,
                    envelope,
                },
            );
        }
        for (client, generation, at) in out.wakes {
            self.schedule(
                self.host_at(host, at),
                EventKind::ClientWake {
                    host,
                    incarnation,
                    client,
                    generation,
                },
            );
        }
    }

    fn client_step(
        &mut self,
        host: usize,
        client: usize,
        f: impl FnOnce(&mut crate::client::Client, &mut Io<'_>),
    ) {
        let guard = self.guard();
        let now = self.host_now(host);
        let mut next_actor = self.hosts[host].next_actor;
        let actions = {
            let mut io = Io {
                now,
                rng: &mut self.work_rng,
                options: &self.options.workload,
                paths: &self.options.paths,
                next_actor: &mut next_actor,
                guard,
                actions: Vec::new(),
            };
            f(&mut self.hosts[host].clients[client], &mut io);
            io.actions
        };
        self.hosts[host].next_actor = next_actor;
        let mut out = HostOutput::default();
        self.hosts[host].apply_actions(client, actions, &mut out);
        self.host_output(host, out);
    }

    // ---------------------------------------------------------------- proxies

    /// Starts a new proxy instance on `host` (a new address) and tells it discovery's answer.
    fn start_proxy(&mut self, host: usize) {
        let h = &mut self.hosts[host];
        h.proxy_generation += 1;
        h.discovery_version = 0;
        let config = ProxyConfig {
            address: h.proxy_address(),
            retry_period: self.options.proxy.retry_period,
            deadline: self.options.proxy.deadline,
            absent_read_wait: self.options.proxy.absent_read_wait(),
            // Each reuse of an address (see `proxy_address`) starts above every id its
            // earlier users can have handed out (one instance never hands out 2^40).
            first_request_id: 1 + ((h.proxy_generation / crate::host::PROXY_ADDRESSES) << 40),
            pending_max: self
                .options
                .overload
                .as_ref()
                .map_or(dataplane_core::limits::PROXY_PENDING_MAX, |o| {
                    o.proxy_pending_max
                }),
        };
        let proxy = Proxy::new(
            config,
            self.options.clocks[host + 1].local(self.now),
            &mut self.outbox,
        );
        let effects = self.outbox.take();
        let (incarnation, generation) = (h.incarnation, h.proxy_generation);
        h.proxy = Some(proxy);
        self.checker.proxy_started(host, incarnation, generation);
        self.execute_proxy_effects(host, effects);
        let lag = uniform(&mut self.net_rng, self.options.proxy.discovery_lag_max);
        let (version, found) = (self.discovery_version, self.published);
        self.schedule_in(
            lag,
            EventKind::Discovery {
                host,
                incarnation,
                generation,
                version,
                found,
            },
        );
    }

    /// The proxy of `host` stops: its pending table is lost.
    fn stop_proxy(&mut self, host: usize) {
        let h = &mut self.hosts[host];
        if h.proxy.take().is_some() {
            self.checker
                .proxy_stopped(host, h.incarnation, h.proxy_generation);
        }
    }

    /// Publishes discovery's answer (after a per-proxy lag) if it changed.
    fn publish_discovery(&mut self) {
        let value = if self.outages > 0 {
            None
        } else {
            self.announced
        };
        if value == self.published {
            return;
        }
        self.published = value;
        self.discovery_version += 1;
        for host in 0..self.hosts.len() {
            let h = &self.hosts[host];
            if !h.up || h.proxy.is_none() {
                continue;
            }
            let (incarnation, generation) = (h.incarnation, h.proxy_generation);
            let lag = uniform(&mut self.net_rng, self.options.proxy.discovery_lag_max);
            let version = self.discovery_version;
            self.schedule_in(
                lag,
                EventKind::Discovery {
                    host,
                    incarnation,
                    generation,
                    version,
                    found: value,
                },
            );
        }
    }

    fn proxy_input(&mut self, host: usize, input: ProxyInput) {
        let now = self.host_now(host);
        let h = &mut self.hosts[host];
        let Some(proxy) = h.proxy.as_mut() else {
            return;
        };
        let result = match &input {
            ProxyInput::Message(message) => {
                proxy.handle_message(now, message.clone(), &mut self.outbox)
            }
            ProxyInput::Discovery(found) => {
                proxy.handle_discovery(now, *found, &mut self.outbox);
                Ok(())
            }
            ProxyInput::Timer => proxy.handle_timer(now, Timer::ProxyRetry, &mut self.outbox),
        };
        if let Err(error) = result {
            self.checker.fail(
                now,
                format!("a proxy refused an input it should accept: {error}"),
            );
            return;
        }
        let effects = self.outbox.take();
        let (incarnation, generation) = (h.incarnation, h.proxy_generation);
        self.checker.proxy_step(
            now,
            (host, incarnation, generation),
            &input,
            &effects,
            proxy,
        );
        self.execute_proxy_effects(host, effects);
    }

    fn execute_proxy_effects(&mut self, host: usize, mut effects: Vec<Effect>) {
        let h = &self.hosts[host];
        let (node, incarnation, generation, from) =
            (h.node, h.incarnation, h.proxy_generation, h.proxy_address());
        for effect in effects.drain(..) {
            match effect {
                Effect::Send { to, message } if to.node == node => {
                    self.local(host, incarnation, from, to, message);
                }
                Effect::Send { to, message } => self.send(from, to, message),
                Effect::SetTimer { at, .. } => {
                    let h = &mut self.hosts[host];
                    h.proxy_timer_generation += 1;
                    let arming = h.proxy_timer_generation;
                    self.schedule(
                        self.host_at(host, at),
                        EventKind::ProxyTimer {
                            host,
                            incarnation,
                            generation,
                            arming,
                        },
                    );
                }
                Effect::CancelTimer { .. } => self.hosts[host].proxy_timer_generation += 1,
                other => self.checker.fail(
                    self.now,
                    format!("a proxy emitted an unexpected effect {other:?}"),
                ),
            }
        }
        self.outbox.recycle(effects);
    }

    // ---------------------------------------------------------------- directory

    fn directory_input(&mut self, input: DirInput) {
        if self.directory.machine.is_none() || !self.check_space() {
            return;
        }
        let now = self.dir_now();
        let Some(machine) = self.directory.machine.as_mut() else {
            return;
        };
        self.directory.taking_op = matches!(&input, DirInput::Message(Message::Call(call))
        if call.request.operation().is_some()
            && !matches!(
                call.request,
                DirectoryRequest::CancelStream { .. }
                    | DirectoryRequest::ReleaseBlobReservation { .. }
            ));
        let result = match &input {
            DirInput::Message(m) => machine.handle_message(now, m.clone(), &mut self.outbox),
            DirInput::Timer => machine.handle_timer(now, Timer::DirectoryRetry, &mut self.outbox),
            DirInput::Route { target, routable } => {
                machine.handle_route(now, *target, *routable, &mut self.outbox);
                Ok(())
            }
        };
        if let Err(error) = result {
            self.checker.fail(
                now,
                format!("directory refused an input it should accept: {error}"),
            );
            return;
        }
        let effects = self.outbox.take();
        self.directory.step += 1;
        self.stats.directory_steps += 1;
        if let DirInput::Message(Message::Call(call)) = &input
            && call.request.operation().is_some()
            && let Some(node) = self.hosts.iter().position(|h| h.node == call.reply_to.node)
        {
            let per_node = &mut self.stats.operations_per_node;
            per_node.resize(per_node.len().max(self.hosts.len()), 0);
            per_node[node] += 1;
        }
        let records = machine.durable().operation_count() as u64;
        self.stats.records_max = self.stats.records_max.max(records);
        let obligations = machine.durable().obligation_count() as u64;
        self.stats.obligations_max = self.stats.obligations_max.max(obligations);
        self.checker
            .directory_step(now, self.directory.step, &input, &effects, machine);
        if effects.iter().any(|e| matches!(e, Effect::Persist(_))) {
            // Bindings change only with a commit (or a recovery, checked there).
            self.checker
                .sources_newly_bound(now, machine, &effects, &self.hosts);
            let step = self.directory.step;
            self.trace.note(self.now, "persist", || {
                let records: Vec<String> = effects
                    .iter()
                    .filter_map(|e| match e {
                        Effect::Persist(record) => Some(format!("{record:?}")),
                        _ => None,
                    })
                    .collect();
                format!("step {step}: {}", records.join("; "))
            });
        }
        self.execute_directory_effects(effects);
        self.directory.taking_op = false;
    }

    /// Before each input, as `dataplane-node` does: whether the log has its reserve for new
    /// operations; the machine and the model hear when that changes. Checked against the
    /// disk's ground truth: the gate is closed only while a full-disk episode lasts, or for
    /// two retry periods after it ended (it tries again at most every period). False when
    /// the check failed the log (the node stopped).
    fn check_space(&mut self) -> bool {
        let now = self.dir_now();
        let d = &mut self.directory;
        let Some(log) = d.log.as_mut() else {
            return true;
        };
        let space = match d.space.check(now, log, &mut d.fs) {
            Ok(space) => space,
            Err(error) => {
                self.storage_failed(error);
                return false;
            }
        };
        let change = match space {
            Space::Full => Some(Some(Reason::new(NO_SPACE_REASON))),
            Space::Returned => Some(None),
            Space::Room | Space::StillFull => None,
        };
        if let Some(why) = change {
            self.checker.coverage.hit(if why.is_some() {
                "disk.no_space"
            } else {
                "disk.space_returned"
            });
            self.trace.note(self.now, "disk", || {
                format!(
                    "space gate {}",
                    if why.is_some() { "closed" } else { "opened" }
                )
            });
            if let Some(machine) = self.directory.machine.as_mut() {
                machine.set_no_space(why.clone());
            }
            self.checker.directory_space(why);
        }
        let d = &self.directory;
        if d.space.is_closed() && d.fs.capacity.is_none() {
            let slack = LOG_SPACE_RETRY.saturating_add(LOG_SPACE_RETRY);
            if d.freed_at
                .is_none_or(|at| self.now > at.saturating_add(slack))
            {
                self.checker.fail(
                    self.now,
                    format!(
                        "disk: the directory refuses new operations NoSpace while its disk has \
                         had room since {:?} (longer than twice the retry period {})",
                        d.freed_at, LOG_SPACE_RETRY
                    ),
                );
            }
        }
        true
    }

    fn execute_directory_effects(&mut self, mut effects: Vec<Effect>) {
        let mut ready = Vec::new();
        let d = &mut self.directory;
        let Some(log) = d.log.as_mut() else {
            self.outbox.recycle(effects);
            return;
        };
        let fs = &mut d.fs;
        let mut first_end = None;
        // The checker's account: every other effect may leave once the log is durable past
        // the last record appended before it (in this step or an earlier one). The barrier
        // pulls the effects one by one, appending each record before it pulls the next.
        let last_record = std::cell::Cell::new(d.last_record_end);
        let release_after = &mut d.release_after;
        let facts = &mut d.promises.current;
        let admitted = d.barrier.admit(
            effects.drain(..).inspect(|effect| {
                if !matches!(effect, Effect::Persist(_)) {
                    release_after.push_back(last_record.get());
                }
            }),
            log.synced(),
            |record| {
                facts.record(record);
                let end = log.append(fs, record)?;
                first_end.get_or_insert(end as usize);
                last_record.set(end);
                Ok::<u64, storage::Error<SimFs>>(end)
            },
            &mut ready,
        );
        d.last_record_end = last_record.get();
        let (end, synced) = (log.written() as usize, log.synced() as usize);
        self.stats.log_bytes_max = self.stats.log_bytes_max.max(end as u64);
        self.outbox.recycle(effects);
        if let Err(error) = admitted {
            self.directory.failed_step = Some((self.directory.step, first_end));
            self.storage_failed(error);
            return;
        }
        self.check_disk();
        let step = self.directory.step;
        self.directory.promises.end_step(step, end, false);
        self.promise_durable();
        for effect in ready {
            self.release_checked(effect);
        }
        if end > synced || !self.directory.unsynced_steps.is_empty() {
            let first = first_end.unwrap_or(end);
            self.directory.unsynced_steps.push_back((step, end, first));
        } else {
            self.checker.directory_synced(step);
        }
        // Syncs start only between steps, so every sync target is a step boundary (the
        // model's rollback on a crash is step-granular).
        if self.directory.sync.is_none() && end > synced {
            self.start_sync();
        }
    }

    fn start_sync(&mut self) {
        let d = &self.options.disk;
        let mut latency = Duration::from_nanos(
            self.disk_rng
                .range(d.sync_min.as_nanos(), d.sync_max.as_nanos()),
        );
        if let Some(slow) = self.slow_sync() {
            // The node's loop waits in the fsync (it syncs on its one thread): it takes nothing
            // until the sync returns.
            latency = latency.saturating_add(slow);
            self.block_directory(self.now.saturating_add(latency));
        }
        self.directory.sync_generation += 1;
        let generation = self.directory.sync_generation;
        self.directory.sync = Some(generation);
        let boot = self.directory.boot;
        self.schedule_in(latency, EventKind::DirSync { boot, generation });
    }

    /// The fsync started by `start_sync` completes now: the protocol syncs (everything
    /// written by now), and the effects it covers go.
    fn sync_done(&mut self, boot: u64, generation: u64) {
        let d = &mut self.directory;
        if d.machine.is_none() || d.boot != boot || d.sync != Some(generation) {
            return;
        }
        d.sync = None;
        let Some(log) = d.log.as_mut() else {
            return;
        };
        let synced = match log.sync(&mut d.fs) {
            Ok(synced) => synced as usize,
            Err(error) => {
                self.storage_failed(error);
                return;
            }
        };
        let written = log.written() as usize;
        self.check_disk();
        self.check_synced("a sync");
        self.promise_durable();
        let mut durable_step = None;
        while let Some(&(step, end, _)) = self.directory.unsynced_steps.front() {
            if end > synced {
                break;
            }
            durable_step = Some(step);
            self.directory.unsynced_steps.pop_front();
        }
        if let Some(step) = durable_step {
            self.checker.directory_synced(step);
        }
        let mut ready = Vec::new();
        self.directory.barrier.release(synced as u64, &mut ready);
        let released = ready.len();
        self.trace.note(self.now, "disk", || {
            format!(
                "sync: log durable to byte {synced} of {written}; steps through {} durable; {released} held effects released",
                durable_step.map_or("none new".to_owned(), |s| s.to_string())
            )
        });
        for effect in ready {
            self.release_checked(effect);
        }
        if written > synced {
            self.start_sync();
        } else {
            self.maybe_compact();
        }
    }

    /// Compaction, as the node does it: when the protocol says it is due (everything written
    /// is durable, so the durable state is the machine's) and no effect waits, the protocol
    /// writes the snapshot as a new generation, crash-atomically. In some seeds the process
    /// dies before one of its steps.
    fn maybe_compact(&mut self) {
        let d = &self.directory;
        let (Some(log), true) = (d.log.as_ref(), d.machine.is_some()) else {
            return;
        };
        if !d.unsynced_steps.is_empty()
            || d.barrier.waiting()
            || !log.compaction_due(self.options.disk.compact_min_bytes)
        {
            return;
        }
        if self.phase == Phase::Faulty && self.disk_rng.chance(self.options.disk.compaction_crash) {
            self.directory.fs.crash_before_step = Some(self.disk_rng.below(COMPACTION_STEPS));
        }
        // In seeds whose disk fills up, one compaction in four finds it full at one of its
        // steps (before the rename: postponed; at or after it: the node stops).
        if self.phase == Phase::Faulty
            && self.options.disk.full_disk.is_some()
            && self.disk_rng.chance(ratio(1, 4))
        {
            self.directory.fs.no_room_before_step = Some(self.disk_rng.below(COMPACTION_STEPS));
        }
        let d = &mut self.directory;
        let (Some(log), Some(machine)) = (d.log.as_mut(), d.machine.as_ref()) else {
            return;
        };
        // As the node does it: encoded straight from the machine's state.
        let members = d.membership.snapshot_records();
        let snapshot = (machine.snapshot().map(RecordRef::Snapshot))
            .chain(members.iter().map(RecordRef::Record));
        let result = log.compact_from(&mut d.fs, snapshot);
        d.fs.crash_before_step = None;
        d.fs.no_room_before_step = None;
        match result {
            Ok(Compacted::Postponed(error)) => {
                // No room for the snapshot: the log goes on as it was, without the snapshot.
                self.stats.compactions_postponed += 1;
                self.checker.coverage.hit("disk.compaction_postponed");
                self.trace.note(self.now, "disk", || {
                    format!("compaction postponed: {error}")
                });
                self.check_disk();
                let left: Vec<String> = (self.directory.fs.names())
                    .filter(|name| name.starts_with("snapshot-") && name.ends_with(".tmp"))
                    .map(str::to_owned)
                    .collect();
                if !left.is_empty() {
                    self.checker.fail(
                        self.now,
                        format!("storage: a postponed compaction left {left:?} behind"),
                    );
                }
                self.check_synced("a postponed compaction");
            }
            Ok(Compacted::Done) => {
                d.barrier.clear(log.synced());
                d.last_record_end = 0;
                d.promises.new_generation();
                if !d.release_after.is_empty() {
                    let left = d.release_after.len();
                    self.checker.fail(
                        self.now,
                        format!("barrier: compacted while {left} effects were never released"),
                    );
                }
                self.stats.compactions += 1;
                self.checker.coverage.hit("disk.compacted");
                self.check_disk();
                self.check_synced("a compaction");
            }
            Err(error) => self.storage_failed(error),
        }
    }

    /// A call of the storage protocol failed: a storage failure stops the node (fail-stop);
    /// anything else is a bug.
    fn storage_failed(&mut self, error: storage::Error<SimFs>) {
        self.check_disk();
        let StorageError::Io { op, source, .. } = &error else {
            self.checker.fail(
                self.now,
                format!("storage: the log refused a call it should take: {error}"),
            );
            return;
        };
        if source.kind == FsErrorKind::NoSpace {
            self.stats.disk_full_stops += 1;
            self.checker.coverage.hit("fault.disk_full");
            // The space gate's promise: a new operation is taken only with its reserve of
            // room in the log, so its own records never meet a full disk (what stops the node
            // is what came after the gate closed, once the reserve ran out).
            let append = matches!(*op, "write log" | "preallocate log" | "write sync mark");
            if append && self.directory.taking_op && self.options.disk.preallocate_bytes > 0 {
                self.checker.fail(
                    self.now,
                    format!(
                        "disk: a full disk stopped the directory at the records of a new \
                         operation it took ({op}): the space gate let it in without its reserve"
                    ),
                );
            }
        } else if source.what.starts_with("the process died") {
            self.stats.compaction_crashes += 1;
            self.checker.coverage.hit("fault.compaction_crash");
        } else if op.contains("sync") {
            // Fail-stop: after a failed fsync the file's state is unknown.
            self.stats.fsync_failures += 1;
            self.checker.coverage.hit("fault.fsync_failure");
        }
        self.crash_directory();
    }

    /// What the log says is durable is, on the simulated disk.
    fn check_synced(&mut self, after: &str) {
        if let Some(log) = &self.directory.log {
            let name = log.log_name().to_owned();
            let (generation, synced) = (log.generation(), log.synced());
            self.check_durable(&name, generation, synced, after);
        }
    }

    /// The storage protocol's promises, checked against the file system's ground truth (the
    /// rules restated, not the protocol asked): the generation in use is the only one whose
    /// names survive a crash, its snapshot is wholly durable, and of its log everything before
    /// `synced` is, but for a trailing sync mark, with no durable bytes after it (a cut that
    /// is not durable).
    fn check_durable(&mut self, log_name: &str, generation: u64, synced: u64, after: &str) {
        const MARK: usize = 24;
        let fs = &self.directory.fs;
        let snapshot = format!("snapshot-{generation}");
        let problem = if let Some(other) = fs.durable_names().find(|n| {
            (n.starts_with("snapshot-") || n.starts_with("log-"))
                && !n.ends_with(".tmp")
                && *n != snapshot
                && *n != log_name
        }) {
            Some(format!("{other} of another generation is still durable"))
        } else {
            match (fs.durable(&snapshot), fs.durable(log_name)) {
                (None, _) => Some(format!("{snapshot} is not durable")),
                (_, None) => Some(format!("{log_name} is not durable")),
                (Some((len, durable, uncut)), _) if !uncut || durable != len => {
                    Some(format!("{snapshot} is not wholly durable"))
                }
                (_, Some((len, durable, uncut))) if !uncut || durable + MARK < synced as usize => {
                    Some(format!(
                        "{log_name} holds {len} bytes of which the first {durable} are durable \
                         ({}), but the log says it is synced up to byte {synced}",
                        if uncut {
                            "unchanged since the last sync"
                        } else {
                            "and was cut since: a cut not made durable"
                        }
                    ))
                }
                _ => None,
            }
        };
        if let Some(problem) = problem {
            self.checker
                .fail(self.now, format!("storage: after {after}, {problem}"));
        }
    }

    /// The file system's own check: nothing changed the files after a failure.
    fn check_disk(&mut self) {
        if let Some(violation) = self.directory.fs.violation() {
            self.checker.fail(self.now, violation.to_owned());
        }
    }

    /// A full-disk episode starts: the disk has a little room left, then none, until it ends.
    fn disk_full(&mut self) {
        if let Some(fault) = self.options.disk.full_disk {
            if self.phase == Phase::Faulty {
                let d = &mut self.directory;
                d.full_episode += 1;
                let room = self.disk_rng.below(4_096) as usize;
                d.fs.capacity = Some(d.fs.used() + room);
                let episode = d.full_episode;
                let lasts = uniform(&mut self.fault_rng, fault.max_duration);
                self.trace.note(self.now, "fault", || {
                    format!("full disk: {room} bytes of room for {lasts}")
                });
                self.schedule_in(lasts, EventKind::DiskFreed { episode });
            }
            self.schedule_next(fault, EventKind::DiskFull);
        }
    }

    /// Executes an effect the barrier let go, after checking on the simulated disk's ground
    /// truth (not the log's word) that the records before it are durable (issue 15, class 3).
    /// The steps whose records the simulated disk holds durably (its own record of it) count
    /// for the promises.
    fn promise_durable(&mut self) {
        let d = &mut self.directory;
        let name = d.log.as_ref().map(|log| log.log_name().to_owned());
        if let Some((_, durable, _)) = name.as_deref().and_then(|name| d.fs.durable(name)) {
            d.promises.durable_to(durable);
        }
    }

    fn release_checked(&mut self, effect: Effect) {
        if let Effect::Send { message, to } = &effect
            && let Some(why) = self.directory.promises.broken(message)
        {
            self.checker.fail(
                self.now,
                format!(
                    "promise: the directory let {} go to {to} before the records it promises \
                     were durable: {why}",
                    crate::trace::describe(message, *to)
                ),
            );
        }
        let d = &mut self.directory;
        let needed = d.release_after.pop_front();
        let name = d.log.as_ref().map(|log| log.log_name().to_owned());
        let durable = name.as_deref().and_then(|name| d.fs.durable(name));
        let fine = match (needed, durable) {
            (Some(needed), Some((_, durable, true))) => durable as u64 >= needed,
            _ => false,
        };
        if !fine {
            self.checker.fail(
                self.now,
                format!(
                    "barrier: {effect:?} left the directory before the records it follows \
                     were durable (needs {needed:?} bytes of {name:?} durable; durable, as \
                     (length, durable, prefix): {durable:?})"
                ),
            );
        }
        self.execute_released(effect);
    }

    fn execute_released(&mut self, effect: Effect) {
        match effect {
            Effect::Send { to, message } => {
                let from = self.directory.address();
                self.checker.released(self.now, to, &message);
                self.send(from, to, message);
            }
            Effect::SetTimer {
                timer: Timer::DirectoryRetry,
                at,
            } => {
                self.directory.timer_generation += 1;
                let (boot, generation) = (self.directory.boot, self.directory.timer_generation);
                self.schedule(self.dir_at(at), EventKind::DirTimer { boot, generation });
            }
            Effect::CancelTimer {
                timer: Timer::DirectoryRetry,
            } => self.directory.timer_generation += 1,
            Effect::WatchRoute { target } => {
                self.directory.routes.watch(target);
                self.report_routes();
            }
            Effect::UnwatchRoute { target } => {
                self.directory.routes.unwatch(target);
                self.directory.route_versions.remove(&target);
            }
            other => self.checker.fail(
                self.now,
                format!("the directory emitted an effect its node cannot perform: {other:?}"),
            ),
        }
    }

    /// Whether the directory can reach `target` in the simulated world: its host is up in that
    /// incarnation, the directory's link to it is up, and its route is not flapping.
    fn route_truth(&self, target: &Address) -> bool {
        self.host_index(target.node).is_some_and(|host| {
            let h = &self.hosts[host];
            // A file blob's source (issue 17) serves in every life of its node.
            let life =
                h.incarnation == target.incarnation || target.incarnation == PERSISTENT_INCARNATION;
            h.up && life
                && !self.blocked.contains(&(DIRECTORY_NODE, target.node))
                && !self.flapped.contains(target)
        })
    }

    /// Tells the directory about every watched target whose routability changed (after a
    /// registrar delay), including the initial observation of new watches.
    fn report_routes(&mut self) {
        for h in 0..self.hosts.len() {
            let (node, up, incarnation) = (
                self.hosts[h].node,
                self.hosts[h].up,
                self.hosts[h].incarnation,
            );
            if up && self.link_up(DIRECTORY_NODE, node) {
                self.directory.routes.connected(node, incarnation);
            } else {
                self.directory.routes.disconnected(node);
            }
        }
        for target in &self.flapped {
            self.directory.routes.set_lost(*target, true);
        }
        let mut changes = Vec::new();
        self.directory.routes.changes(&mut changes);
        // Routability, restated from the simulated truth: what was reported must be it.
        let wrong: Vec<(Address, bool)> = self
            .directory
            .routes
            .watched()
            .filter_map(|t| {
                let truth = self.route_truth(t);
                (self.directory.routes.reported(t) != Some(truth)).then_some((*t, truth))
            })
            .collect();
        for (target, truth) in wrong {
            self.checker.fail(
                self.now,
                format!(
                    "routes: {target} is {} but the directory was told otherwise",
                    if truth { "routable" } else { "unroutable" }
                ),
            );
        }
        for (target, routable) in changes {
            // SPEC §5.6: the initial observation of a new watch may be left out.
            let initial = !self.directory.route_versions.contains_key(&target);
            if initial
                && permille(
                    &mut self.env_rng,
                    self.options.registrar.skip_initial_permille,
                )
            {
                self.checker.coverage.hit("registrar.skipped_initial");
                self.directory.route_version += 1;
                let version = self.directory.route_version;
                self.directory.route_versions.insert(target, version);
                continue;
            }
            self.send_route_report(target, routable);
        }
    }

    /// The registrar reports `target`'s routability to the directory after its delay (twice
    /// when it repeats itself).
    fn send_route_report(&mut self, target: Address, routable: bool) {
        self.directory.route_version += 1;
        let version = self.directory.route_version;
        self.directory.route_versions.insert(target, version);
        let registrar = &self.options.registrar;
        let delay = Duration::from_micros(
            self.net_rng
                .range(100, registrar.delay_max.as_nanos() / 1_000),
        );
        let repeat = permille(&mut self.env_rng, registrar.repeat_permille);
        let again = repeat.then(|| uniform(&mut self.env_rng, registrar.delay_max));
        let boot = self.directory.boot;
        let report = EventKind::DirRoute {
            boot,
            target,
            routable,
            version,
        };
        if let Some(again) = again {
            self.checker.coverage.hit("registrar.repeated");
            self.schedule_in(again.max(Duration::from_micros(100)), report.clone());
        }
        self.schedule_in(delay, report);
    }

    fn crash_directory(&mut self) {
        // Killed while paused: what waited for it is handed to the dead instance (and dropped
        // or refused there, as a crashed process's sockets are).
        self.resume_directory();
        self.stats.directory_crashes += 1;
        self.checker.coverage.hit("fault.directory_crash");
        self.break_dir_conns();
        let d = &mut self.directory;
        d.machine = None;
        d.conns = None;
        d.expiry_armed = None;
        d.sync = None;
        d.routes = Routes::new();
        d.route_versions.clear();
        // What reaches the platter: everything synced, then each unsynced step with some
        // probability (in order), then possibly a torn fragment of the next record. The file
        // system decides the rest (other files, names not yet synced).
        // A step whose appends failed never survives whole.
        let last = d.failed_step.map_or(d.step, |(step, _)| step - 1);
        let mut surviving_step = d.unsynced_steps.front().map_or(last, |(s, _, _)| s - 1);
        let pinned = d.log.take().map(|log| {
            // What an fsync covered is durable, even if the call failed afterwards (writing
            // its sync mark): the file system's own record of it, never what the storage
            // protocol says it synced (a protocol that claimed a sync it did not make would be
            // believed).
            let synced =
                d.fs.durable(log.log_name())
                    .map_or(0, |(_, durable, _)| durable);
            let mut surviving = synced;
            for &(step, end, _) in &d.unsynced_steps {
                if end > synced && !self.disk_rng.chance(self.options.disk.unsynced_survives) {
                    break;
                }
                surviving = surviving.max(end);
                surviving_step = step;
            }
            // Tear inside the first lost record, so no record of a lost step survives whole:
            // before its last byte that is not zero, as the file may read zeros after the
            // bytes kept (preallocated space), which would complete a record whose lost end
            // was zeros.
            let first = d
                .unsynced_steps
                .iter()
                .map(|&(_, _, first)| first)
                .chain(d.failed_step.and_then(|(_, first)| first))
                .find(|&first| first > surviving);
            let last_nonzero = |first: usize| {
                d.fs.contents(log.log_name())
                    .and_then(|data| data.get(..first))
                    .and_then(|record| record.iter().rposition(|&b| b != 0))
            };
            let mut keep = surviving;
            if let Some(first) = first
                && let Some(last) = last_nonzero(first).map(|at| at.min(first - 1))
                && last > surviving + 1
                && self.disk_rng.chance(self.options.disk.torn_tail)
            {
                keep = self.disk_rng.range(surviving as u64 + 1, last as u64) as usize;
                self.stats.torn_tails += 1;
                self.checker.coverage.hit("fault.torn_tail");
            }
            (log.log_name().to_owned(), keep)
        });
        d.fs.crash(pinned.as_ref().map(|(name, keep)| (name.as_str(), *keep)));
        d.unsynced_steps.clear();
        d.failed_step = None;
        d.barrier.clear(0);
        d.release_after.clear();
        d.last_record_end = 0;
        if self.phase == Phase::Faulty && self.disk_rng.chance(self.options.disk.rot) {
            d.rot = d.fs.rot();
            if d.rot.is_some() {
                self.checker.coverage.hit("fault.rot");
            }
        }
        let (torn, rot) = (
            pinned.as_ref().map(|(_, keep)| *keep),
            d.rot.as_ref().map(|r| format!("{r:?}")),
        );
        self.trace.note(self.now, "fault", || {
            format!(
                "directory crash: steps through {surviving_step} survive (log kept to byte {}); damage at rest: {}",
                torn.map_or("-".to_owned(), |k| k.to_string()),
                rot.unwrap_or_else(|| "none".to_owned())
            )
        });
        self.checker.directory_crashed(surviving_step);
        self.directory.promises.crashed(surviving_step);
        // Discovery notices the crash only after a while: until then proxies keep sending to
        // (and accepting the epoch of) the dead instance.
        let lag = uniform(&mut self.fault_rng, self.options.proxy.discovery_lag_max);
        let boot = self.directory.boot;
        self.schedule_in(lag, EventKind::AuthorityLost { boot });
        let max = self
            .options
            .directory_crashes
            .map_or(Duration::from_millis(1), |f| f.max_duration);
        let mut down = uniform(&mut self.fault_rng, max);
        if self.directory.fs.capacity.is_some() {
            down = down.max(RESTART_BACKOFF);
        }
        self.schedule_in(down, EventKind::DirRestart);
    }

    fn restart_directory(&mut self) {
        let d = &mut self.directory;
        d.timer_generation += 1;
        // A data directory that has booted before must have a log (the real node knows it
        // from its membership file, written once the log is open).
        let options = StorageOptions {
            create: !d.booted,
            repair: false,
            preallocate: self.options.disk.preallocate_bytes,
        };
        let opened = LogStore::open(&mut d.fs, options);
        self.check_disk();
        let (log, recovered) = match opened {
            Ok(opened) => opened,
            Err(error) => return self.restart_failed(error),
        };
        if let Some(rot) = self.directory.rot.take() {
            self.checker.fail(
                self.now,
                format!(
                    "storage: the directory started on {rot}, damage at rest in synced data, \
                     instead of refusing to start (recovered {} records, cut {:?})",
                    recovered.records.len(),
                    recovered.cut
                ),
            );
        }
        if recovered.cut.is_some() {
            self.checker.coverage.hit("recovery.cut_torn_tail");
        }
        let name = log.log_name().to_owned();
        let (generation, synced) = (log.generation(), log.synced());
        self.check_durable(&name, generation, synced, "recovery");
        if recovered.discarded_generation.is_some() {
            self.checker.coverage.hit("recovery.discarded_generation");
        }
        let d = &mut self.directory;
        d.booted = true;
        d.barrier.clear(log.synced());
        d.release_after.clear();
        d.last_record_end = 0;
        d.log = Some(log);
        d.space = SpaceGate::new(SPACE_RESERVE, LOG_SPACE_RETRY);
        if !self.boot_membership(&recovered.records) {
            return;
        }
        let d = &mut self.directory;
        let config = DirectoryConfig {
            address: d.address(),
            retry_period: self.options.directory_retry,
            limits: self.options.limits.directory(self.options.retry_batch),
        };
        let recovered = Directory::recover(
            config,
            &recovered.records,
            &mut ActorSources,
            self.dir_now(),
            &mut self.outbox,
        );
        match recovered {
            Ok(machine) => {
                let effects = self.outbox.take();
                self.directory.step += 1;
                self.checker
                    .directory_recovered(self.now, self.directory.step, &effects, &machine);
                // A recovery may bind again what the lost tail of the log had unbound.
                self.checker.sources_backed(self.now, &machine, &self.hosts);
                self.announced = Some(Discovered {
                    address: self.directory.address(),
                    epoch: machine.epoch(),
                });
                self.directory.machine = Some(machine);
                self.directory.conns = Some(self.new_dir_conns());
                self.directory.expiry_armed = None;
                self.execute_directory_effects(effects);
                self.publish_discovery();
            }
            Err(error) => self
                .checker
                .fail(self.now, format!("directory recovery failed: {error}")),
        }
    }

    /// The storage protocol did not let the directory start. A refusal must be explained by
    /// damage at rest, which the operator then restores from a backup before starting it
    /// again; a storage failure while recovering (a full disk, a failed fsync) stops it again
    /// and its supervisor tries later. Meanwhile nobody serves.
    fn restart_failed(&mut self, error: storage::Error<SimFs>) {
        let boot = self.directory.boot;
        self.schedule_in(Duration::ZERO, EventKind::AuthorityLost { boot });
        if error.is_refusal() {
            let Some(rot) = self.directory.rot.take() else {
                self.checker.fail(
                    self.now,
                    format!(
                        "storage: recovery refused to start, though nothing damaged the disk \
                         at rest: {error}"
                    ),
                );
                return;
            };
            self.stats.storage_refusals += 1;
            self.checker.coverage.hit("storage.refused_damage");
            self.directory.fs.restore(&rot);
            let operator = Duration::from_millis(self.fault_rng.range(100, 3_000));
            self.schedule_in(operator, EventKind::DirRestart);
            return;
        }
        if !matches!(error, StorageError::Io { .. }) {
            self.checker
                .fail(self.now, format!("storage: recovery failed: {error}"));
            return;
        }
        self.checker.coverage.hit("storage.recovery_failed");
        self.directory.fs.crash(None);
        self.schedule_in(RESTART_BACKOFF, EventKind::DirRestart);
    }

    /// The node's membership at a start, as `dataplane-node` runs it: recovered from the
    /// log, the boot count raised, and every host that is up (or was never admitted) said
    /// hello again; all of it durable before the instance serves. Checked against the
    /// world's own account: a boot is never used twice, and a host that is up is admitted as
    /// the node and incarnation it runs as. `false` if the node stopped.
    fn boot_membership(&mut self, records: &[LogRecord]) -> bool {
        let mut membership = match Membership::recover(records) {
            Ok(membership) => membership,
            Err(error) => {
                self.checker.fail(
                    self.now,
                    format!("membership: recovery refused the log: {error}"),
                );
                return false;
            }
        };
        let mut appended = vec![membership.boot()];
        let boot = membership.boots();
        if boot <= self.directory.boots_used {
            self.checker.fail(
                self.now,
                format!(
                    "membership: the directory booted as boot {boot}, but boot {} was used \
                     already (its address would be reused)",
                    self.directory.boots_used
                ),
            );
            return false;
        }
        // The first boot provisions the hosts (in order, so node ids are the world's); later
        // boots admit nobody: each host's link says hello again (`conns`).
        let mut admitted = Vec::new();
        for host in 0..self.hosts.len() {
            // A late joiner says hello as a new node when it joins.
            if self.directory.admitted[host].is_some() || late_join(&self.options, host).is_some() {
                continue;
            }
            let h = &self.hosts[host];
            let listen = host_listen(h.node);
            let result = membership.admit(&listen, h.boot_nonce);
            let fine = matches!(&result, Ok((Admitted::New(m), _))
                if m.node == h.node && m.incarnation == h.incarnation);
            if !fine {
                self.checker.fail(
                    self.now,
                    format!(
                        "membership: {listen} (node {}, never admitted) was provisioned at boot \
                         {boot} as {result:?}, not as a new node",
                        h.node
                    ),
                );
                return false;
            }
            if let Ok((a, record)) = result {
                appended.extend(record);
                admitted.push((host, (a.member().incarnation, h.boot_nonce)));
            }
        }
        self.directory.membership = membership;
        if !self.persist_members(&appended) {
            return false;
        }
        self.directory.boot = boot;
        self.directory.boots_used = boot;
        for (host, account) in admitted {
            self.directory.admitted[host] = Some(account);
        }
        self.checker.coverage.hit("membership.booted");
        true
    }

    /// Appends membership records and syncs them at once, as the real node does before the
    /// host hears its answer. `false` if the storage failed (the node stopped).
    fn persist_members(&mut self, records: &[LogRecord]) -> bool {
        let d = &mut self.directory;
        let Some(log) = d.log.as_mut() else {
            return false;
        };
        let fs = &mut d.fs;
        let last = &mut d.last_record_end;
        let result = records
            .iter()
            .try_for_each(|record| log.append(fs, record).map(|end| *last = end))
            .and_then(|()| log.sync(fs).map(drop));
        if let Err(error) = result {
            self.storage_failed(error);
            return false;
        }
        self.check_disk();
        self.check_synced("a membership change");
        true
    }

    // ---------------------------------------------------------------- host machines

    /// Starts the host machine of `host` (a fresh arena) and its workers.
    fn boot_machine(&mut self, host: usize) {
        let guard = self.guard();
        let o = &self.options.host;
        let h = &mut self.hosts[host];
        let mut config = HostConfig::new(h.node, h.incarnation, h.proxy_address(), o.arena_size);
        config.arena_generation = h.incarnation;
        config.chunk_bytes = o.chunk_bytes;
        config.window = o.window;
        config.chunk_timeout = o.chunk_timeout;
        config.chunk_attempts_max = o.chunk_attempts_max;
        config.transfer_deadline = o.transfer_deadline;
        config.allocation_deadline = o.transfer_deadline;
        config.write_deadline = o.write_deadline;
        config.call_guard = guard;
        config.first_actor = HOST_FIRST_ACTOR;
        config.tick = Duration::from_millis(100);
        if let Some(o) = &self.options.overload {
            config.operations_max = o.host_operations_max;
            config.session_operations_max = o.session_operations_max;
        }
        let mut machine = Host::new(
            config,
            self.options.clocks[host + 1].local(self.now),
            &mut self.outbox,
        );
        // The node's disk kept its table of file blobs: they are served again at once.
        machine.restore_files(h.mem.files.saved().clone());
        h.machine = Some(machine);
        h.mem.memory = crate::memory::SimArena::new(o.arena_size as usize);
        self.start_peers(host);
        let h = &mut self.hosts[host];
        h.workers.clear();
        let effects = self.outbox.take();
        self.execute_machine_effects(host, effects);
        for _ in 0..self.options.host.workers.get(host).copied().unwrap_or(0) {
            self.spawn_worker(host, None);
        }
    }

    /// A new worker with its own session, in `slot` (replacing a closed one) or a new slot.
    fn spawn_worker(&mut self, host: usize, slot: Option<usize>) {
        self.spawn_child(host, slot, Worker::new);
    }

    /// A new child in `slot` (or a new slot), made by `make` (a worker or a probe).
    fn spawn_child(
        &mut self,
        host: usize,
        slot: Option<usize>,
        make: fn(Address, u32, Address, &mut WorkerIo<'_>) -> Worker,
    ) {
        let global = self.workers_started;
        let h = &mut self.hosts[host];
        if h.machine.is_none() {
            return;
        }
        let Some(address) = h.next_child_address() else {
            return;
        };
        let Some(machine) = h.machine.as_mut() else {
            return;
        };
        let config = SessionConfig {
            session_generation: u64::from(global) + 1,
            capability: crate::host::capability(global),
            job: crate::worker::job(global),
        };
        let Some(session) = machine.open_session(config) else {
            return;
        };
        self.workers_started += 1;
        let arena_generation = machine.config().arena_generation;
        let mut io = WorkerIo {
            now: self.options.clocks[host + 1].local(self.now),
            rng: &mut self.work_rng,
            options: &self.options.host,
            paths: &self.options.paths,
            mem: &mut h.mem,
            arena_generation,
            overload: self.options.overload.as_ref(),
            explains: crate::worker::Explanations {
                resumed_at: self.host_resumed[host],
                ..crate::worker::Explanations::of(&self.options)
            },
            out: WorkerOut::default(),
        };
        let worker = make(address, global, session, &mut io);
        let out = io.out;
        let slot = match slot {
            Some(slot) => {
                h.workers[slot] = worker;
                slot
            }
            None => {
                h.workers.push(worker);
                h.workers.len() - 1
            }
        };
        self.checker.coverage.hit("host.worker_started");
        self.worker_output(host, slot, out);
    }

    fn worker_step(
        &mut self,
        host: usize,
        slot: usize,
        f: impl FnOnce(&mut Worker, &mut WorkerIo<'_>),
    ) {
        let h = &mut self.hosts[host];
        let Some(arena_generation) = h.machine.as_ref().map(|m| m.config().arena_generation) else {
            return;
        };
        let Some(worker) = h.workers.get_mut(slot) else {
            return;
        };
        let mut io = WorkerIo {
            now: self.options.clocks[host + 1].local(self.now),
            rng: &mut self.work_rng,
            options: &self.options.host,
            paths: &self.options.paths,
            mem: &mut h.mem,
            arena_generation,
            overload: self.options.overload.as_ref(),
            explains: crate::worker::Explanations {
                resumed_at: self.host_resumed[host],
                ..crate::worker::Explanations::of(&self.options)
            },
            out: WorkerOut::default(),
        };
        f(worker, &mut io);
        let out = io.out;
        self.worker_output(host, slot, out);
        let closed = self.hosts[host].workers[slot].state == WorkerState::Closed;
        if closed && self.phase == Phase::Faulty {
            self.checker.coverage.hit("host.session_closed");
            self.spawn_worker(host, Some(slot));
        }
        if closed {
            self.maybe_probe(host);
        }
    }

    /// Once the load stopped, every child on `host` closed and the host is connected to the
    /// directory, a new child must be served (issue 11: tables drain, and new requests
    /// succeed within a bound). Connected: a connection attempt made before the heal may
    /// hang until the host's handshake deadline (a stalled welcome, a directory that was
    /// down), longer than a proxy's deadline; the liveness check requires every running host
    /// to have been probed.
    fn maybe_probe(&mut self, host: usize) {
        let h = &self.hosts[host];
        let quiet = h.workers.iter().all(|w| w.state == WorkerState::Closed);
        let connected = self.connected(h.node, DIRECTORY_NODE);
        if self.phase == Phase::Healed
            && h.up
            && h.machine.is_some()
            && quiet
            && connected
            && !h.probed
        {
            self.hosts[host].probed = true;
            self.spawn_child(host, None, Worker::probe);
        }
    }

    fn worker_output(&mut self, host: usize, slot: usize, out: WorkerOut) {
        let h = &mut self.hosts[host];
        let incarnation = h.incarnation;
        let worker = &mut h.workers[slot];
        let (from, to) = (worker.address, worker.session);
        if let Some(at) = out.wake {
            worker.wake_generation += 1;
            let generation = worker.wake_generation;
            self.schedule(
                self.host_at(host, at),
                EventKind::WorkerWake {
                    host,
                    incarnation,
                    slot,
                    generation,
                },
            );
        }
        for request in out.requests {
            self.local(host, incarnation, from, to, Message::FromChild(request));
        }
        for note in out.notes {
            let now = self.host_now(host);
            if let crate::worker::Note::ArenaFull { length } = note {
                self.probe_arena_full(host, incarnation, slot, length);
                continue;
            }
            self.checker
                .host_note(now, note, self.directory.machine.as_ref());
        }
    }

    /// A probe's write was refused `ArenaExhausted`: judged against the host's leases and the
    /// directory's bindings. Once the arena holds only bound blobs (nothing will free it), the
    /// probe closes without its write.
    fn probe_arena_full(&mut self, host: usize, incarnation: u64, slot: usize, length: u64) {
        let now = self.host_now(host);
        let h = &self.hosts[host];
        let (Some(machine), Some(dir)) = (h.machine.as_ref(), self.directory.machine.as_ref())
        else {
            // No directory to judge by: the probe asks again.
            return;
        };
        // `Some(false)`: operations in progress may free room, and the probe asks again;
        // `None`: the checker recorded a violation.
        let size = self.options.host.arena_size;
        if self
            .checker
            .probe_arena_full(now, machine, dir, size, length)
            == Some(true)
        {
            let worker = &mut self.hosts[host].workers[slot];
            if worker.probe_skip_write() {
                let (from, to) = (worker.address, worker.session);
                self.local(
                    host,
                    incarnation,
                    from,
                    to,
                    Message::FromChild(dataplane_core::wire::ChildRequest::Close),
                );
            }
        }
    }

    fn machine_input(&mut self, host: usize, input: MachineInput) {
        let now = self.host_now(host);
        let proxy = self.hosts[host].proxy_address();
        let h = &mut self.hosts[host];
        let Some(machine) = h.machine.as_mut() else {
            return;
        };
        // H-D6/S34: a source the namespace binds ends only with the directory's Retire to it.
        // Sorted, so the check after the step is one walk beside the host's sources (sorted
        // by actor) instead of a lookup per source.
        let mut bound_before = std::mem::take(&mut self.bound_scratch);
        bound_before.clear();
        bound_before.extend(machine.bindings().filter_map(|(_, b)| match b.namespace {
            dataplane_core::host::NamespaceHold::Bound { source, .. } => Some(source),
            _ => None,
        }));
        bound_before.sort_unstable();
        let retired = match &input {
            MachineInput::Message(_, to, Message::Retire { .. }) => Some(to.actor),
            _ => None,
        };
        let on_tick = matches!(input, MachineInput::Tick);
        if let MachineInput::Message(_, to, message) = &input {
            self.checker.host_input(machine, *to, message);
        }
        if let MachineInput::Message(_, to, Message::Reply(reply)) = &input
            && machine.handover_actor() == Some(to.actor)
            && matches!(
                reply.body.err(),
                Some(dataplane_core::error::NamespaceError::LimitReached(_))
            )
        {
            // A full proxy refused a retraction the host handed over (seed 1567's class).
            self.checker.coverage.hit("host.handover_refused");
        }
        if let MachineInput::Message(_, to, Message::Reply(reply)) = &input
            && let Some(dataplane_core::error::NamespaceError::OperationExpired(op)) =
                reply.body.err()
            && !reply.body.kind().is_retraction()
        {
            // A host re-sends a call until its answer is definitive and replays nothing it
            // finished: its operations are pruned only once it declared them done. Not a
            // retraction it handed over: those do not hold its horizon back (the directory
            // keeps a live rendezvous's and a held reservation's records whatever the
            // horizon, and otherwise there is nothing left to undo; L1 and the reservation
            // checks see anything left behind).
            self.checker.fail(
                now,
                format!(
                    "retention: host binding {to} heard OperationExpired for {op}: its record \
                     was pruned while the host could still retry it"
                ),
            );
            return;
        }
        let result = match input {
            MachineInput::Message(from, to, message) => {
                machine.handle_message(now, from, to, message, &mut h.mem, &mut self.outbox)
            }
            MachineInput::Tick => {
                machine.handle_timer(now, Timer::HostTick, &mut h.mem, &mut self.outbox)
            }
            MachineInput::ProxyRestarted => {
                machine.proxy_restarted(now, proxy, &mut self.outbox);
                Ok(())
            }
            MachineInput::Revoke(session) => {
                machine.revoke_session(now, session, &mut h.mem, &mut self.outbox);
                Ok(())
            }
            MachineInput::PeerRefused(node) => {
                machine.handle_peer_refused(now, node, &mut h.mem, &mut self.outbox);
                Ok(())
            }
        };
        if let Err(error) = result {
            self.checker.fail(
                now,
                format!("a host refused an input it should accept: {error}"),
            );
            return;
        }
        let gone = {
            let mut live = machine.sources().map(|(actor, _)| *actor).peekable();
            bound_before.iter().copied().find(|&s| {
                while live.next_if(|&a| a < s).is_some() {}
                live.peek() != Some(&s) && retired != Some(s)
            })
        };
        self.bound_scratch = bound_before;
        if let Some(gone) = gone {
            self.checker.fail(
                now,
                format!(
                    "H-D6: host {} dropped bound source {gone} without the directory's Retire",
                    h.node
                ),
            );
        }
        let effects = self.outbox.take();
        self.stats.host_steps += 1;
        self.checker
            .machine_step(now, h, &effects, on_tick, self.directory.machine.as_ref());
        self.execute_machine_effects(host, effects);
    }

    fn execute_machine_effects(&mut self, host: usize, mut effects: Vec<Effect>) {
        let h = &self.hosts[host];
        let (node, incarnation) = (h.node, h.incarnation);
        let from = Address::new(node, incarnation, HOST_FIRST_ACTOR);
        for effect in effects.drain(..) {
            match effect {
                Effect::Send { to, message } if to.node == node => {
                    self.local(host, incarnation, from, to, message);
                }
                Effect::Send { to, message } => self.send(from, to, message),
                Effect::SetTimer { at, .. } => {
                    let h = &mut self.hosts[host];
                    h.host_timer_generation += 1;
                    let arming = h.host_timer_generation;
                    self.schedule(
                        self.host_at(host, at),
                        EventKind::HostTick {
                            host,
                            incarnation,
                            arming,
                        },
                    );
                }
                Effect::CancelTimer { .. } => self.hosts[host].host_timer_generation += 1,
                other => self.checker.fail(
                    self.now,
                    format!("a host emitted an unexpected effect {other:?}"),
                ),
            }
        }
        self.outbox.recycle(effects);
    }

    // ---------------------------------------------------------------- hosts

    /// A host process starts again (a new boot nonce): it learns its incarnation from the
    /// directory's welcome (`conns`), and only then runs.
    fn restart_host(&mut self, host: usize) {
        // Up, or restarting already (its link is saying hello; a second restart would put a
        // new boot nonce beside the hello of the first, still in flight: seed 562).
        if self.hosts[host].up || self.links[host].is_some() {
            return;
        }
        // A host that never joined says its first hello only once the host before it was
        // admitted: membership numbers new nodes in the order it hears them, and the world
        // named each host's node by its place (a late joiner's id is still checked to be one
        // never handed out: `conns`).
        if self.hosts[host].incarnation == 0
            && host > 0
            && self.directory.admitted[host - 1].is_none()
        {
            self.schedule_in(JOIN_RETRY, EventKind::HostRestart(host));
            return;
        }
        self.hosts[host].boot_nonce += 1;
        self.start_link(host);
        self.maybe_boot_crash(host);
    }

    /// With host crashes on, one boot in four dies within a few connection latencies of its
    /// start: before, during or just after its handshake with the directory (a process that
    /// crash-loops at start-up, restarted at once by its supervisor). A random crash almost
    /// never lands in a handshake, which lasts milliseconds; a dead boot whose proof is still
    /// on its way, overtaken by the next boot's, is where seed 429 found a product bug.
    fn maybe_boot_crash(&mut self, host: usize) {
        if self.options.host_crashes.is_none() || !self.boot_rng.chance(ratio(1, 4)) {
            return;
        }
        let within = self.latencies(5);
        let delay = uniform(&mut self.boot_rng, within);
        // Faults end with the fault phase.
        if self.now.saturating_add(delay) < self.heal_at {
            let nonce = self.hosts[host].boot_nonce;
            self.schedule_in(delay, EventKind::BootCrash { host, nonce });
        }
    }

    /// A file blob's actor number is never reused (issue 52), from the world's own record of
    /// every file blob a host asked the directory to bind: a source address names one
    /// publication (one path, length and file) for good, across the host's restarts, so a late
    /// `Retire` for a removed file blob can never retire a newer one. (A publication asked
    /// again after a restart names the same of each.)
    fn check_file_source(
        &mut self,
        path: &DataPath,
        source: Address,
        length: u64,
        recovery: &SourceRecovery,
    ) {
        match self.file_sources.get(&source) {
            None => {
                let asked = (path.clone(), length, recovery.clone());
                self.file_sources.insert(source, asked);
            }
            Some((p, l, r)) if p == path && *l == length && r == recovery => {}
            Some((first_path, first_length, _)) => {
                let message = format!(
                    "files: file blob source {source} was bound to {} ({first_length} bytes) and \
                     is now asked for {} ({length} bytes): a file blob's actor number reused",
                    first_path.as_str(),
                    path.as_str()
                );
                self.checker.fail(self.now, message);
            }
        }
    }

    /// Paced gone reports (issue 52), from the world's own record of what each host's agent
    /// sent: a report sent again before it was acknowledged is a re-send, and an agent
    /// re-sends in rounds (every report still waiting at once) at least its period
    /// (`AGENT_PERIOD`, on the host's clock) apart. An agent that re-sends faster hammers a
    /// directory that is down or cut off. (A new report goes out at once, whenever it comes.)
    fn check_gone_paced(&mut self, host: usize, incarnation: u64, scope: GoneScope) {
        let now = self.host_now(host);
        let agent = (host, incarnation);
        if self.gone_sent.insert((host, incarnation, scope)) {
            return;
        }
        match self.gone_resent.insert(agent, now) {
            Some(last) if last != now && now.saturating_since(last) < crate::host::AGENT_PERIOD => {
                let since = now.saturating_since(last);
                self.checker.fail(
                    self.now,
                    format!(
                        "pacing: host {}'s agent (incarnation {incarnation}) sent the gone \
                         report {scope:?} again {since} after its last round of re-sends, \
                         before its period ({})",
                        self.hosts[host].node,
                        crate::host::AGENT_PERIOD
                    ),
                );
            }
            Some(last) if last != now => self.checker.coverage.hit("agent.report_paced"),
            _ => {}
        }
    }

    /// `count` typical connection latencies (the least plus the mean jitter): how soon a
    /// crash aimed at a moment of a host's life lands.
    fn latencies(&self, count: u64) -> Duration {
        let n = &self.options.net;
        n.latency_min
            .saturating_add(n.latency_jitter_mean)
            .saturating_mul(count)
    }

    /// Restarts meet every kind of work in flight (issue 52): a random crash seldom lands
    /// in the few milliseconds a piece of work is under way, so with host crashes on, a frame
    /// that shows work under way sometimes has its host crash within a few latencies: the
    /// host of a source the directory asks to retire (a file blob's or a written blob's), a
    /// host whose stream open or publication (`Register`) is undecided, a host reading
    /// chunks or serving them. At most `AIMED_CRASHES_MAX` a run of each kind, in the fault
    /// phase. What the restart leaves behind is judged by the usual checks: the model, the
    /// invariants, and the end's account of rendezvous, reservations, obligations and sources.
    fn aim_crash(&mut self, from: Address, to: Address, message: &Message) {
        if self.phase != Phase::Faulty
            || self.options.host_crashes.is_none()
            || !self.options.aimed_crashes
        {
            return;
        }
        let (node, work, odds) = match message {
            Message::Retire { .. } => (to.node, "aimed.crash_while_retiring", 8),
            Message::Call(call) => match call.request {
                DirectoryRequest::OpenStream { .. } => {
                    (from.node, "aimed.crash_with_open_undecided", 8)
                }
                DirectoryRequest::Register { .. } => {
                    (from.node, "aimed.crash_while_publishing", 16)
                }
                _ => return,
            },
            Message::ChunkRequest { .. } => (from.node, "aimed.crash_while_reading", 16),
            Message::Chunk { .. } => (from.node, "aimed.crash_while_serving", 32),
            _ => return,
        };
        let Some(host) = self.host_index(node).filter(|&h| self.hosts[h].up) else {
            return;
        };
        if self.aimed.get(work).copied().unwrap_or(0) >= AIMED_CRASHES_MAX
            || !self.aim_rng.chance(ratio(1, odds))
        {
            return;
        }
        let within = self.latencies(3);
        let delay = uniform(&mut self.aim_rng, within);
        if self.now.saturating_add(delay) < self.heal_at {
            *self.aimed.entry(work).or_default() += 1;
            let nonce = self.hosts[host].boot_nonce;
            self.schedule_in(delay, EventKind::AimedCrash { host, nonce, work });
        }
    }

    /// Host `host`'s process dies (up, or saying hello to the directory) and starts again
    /// after `down`.
    fn crash_host(&mut self, host: usize, down: Duration) {
        // Killed while paused: what waited for it is handed to the dead process (and dropped
        // there, as a killed process's sockets and timers are).
        self.resume_host(host);
        let (node, incarnation) = (self.hosts[host].node, self.hosts[host].incarnation);
        self.trace.note(self.now, "fault", || {
            format!("host crash: node {node} incarnation {incarnation}")
        });
        self.stop_proxy(host);
        self.stop_link(host);
        self.gone_sent.retain(|&(h, _, _)| h != host);
        self.gone_resent.retain(|&(h, _), _| h != host);
        self.questions.retain(|&(h, _), _| h != host);
        self.hosts[host].crash();
        self.stats.host_crashes += 1;
        self.checker.host_crashed();
        self.schedule_in(down, EventKind::HostRestart(host));
        self.report_routes();
    }

    /// The restarted host was welcomed as `incarnation`: its machines start.
    fn finish_restart(&mut self, host: usize, incarnation: u64) {
        let clients = self.options.clients_per_host[host] as usize;
        let mut out = HostOutput::default();
        let now = self.host_now(host);
        self.hosts[host].restart(now, incarnation, clients, &mut out);
        self.host_output(host, out);
        let incarnation = self.hosts[host].incarnation;
        for client in 0..clients {
            let delay = uniform(&mut self.work_rng, self.options.workload.think_mean);
            self.schedule_in(
                delay,
                EventKind::ClientWake {
                    host,
                    incarnation,
                    client,
                    generation: 0,
                },
            );
        }
        self.start_proxy(host);
        self.boot_machine(host);
        if self.phase == Phase::Healed {
            for client in 0..clients {
                self.client_step(host, client, |c, io| c.quiesce(io));
            }
            for slot in 0..self.hosts[host].workers.len() {
                self.worker_step(host, slot, |w, io| w.quiesce(io));
            }
        }
        self.report_routes();
    }

    /// A random running host sends the directory a frame that speaks for another node (its
    /// addresses, incarnations, sources or endpoints, or a reply sent its way).
    fn spoof(&mut self) {
        let up: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].up && !self.host_paused(h))
            .collect();
        if up.is_empty() || self.hosts.len() < 2 {
            return;
        }
        let liar = *self.spoof_rng.pick(&up);
        let others: Vec<usize> = (0..self.hosts.len()).filter(|&h| h != liar).collect();
        let victim = *self.spoof_rng.pick(&others);
        let (liar_node, liar_incarnation) = (self.hosts[liar].node, self.hosts[liar].incarnation);
        let v = &self.hosts[victim];
        let actor = v
            .sources
            .iter()
            .chain(v.endpoints.keys())
            .next()
            .copied()
            .unwrap_or(crate::host::FIRST_SPAWNED);
        let victim_actor = Address::new(v.node, v.incarnation, actor);
        let victim_agent = Address::new(v.node, v.incarnation, crate::host::AGENT);
        let liar_agent = Address::new(liar_node, liar_incarnation, crate::host::AGENT);
        use dataplane_core::wire::GoneScope;
        let message = match self.spoof_rng.below(5) {
            0 => Message::AddressGone {
                scope: GoneScope::NodeBefore {
                    node: v.node,
                    incarnation: v.incarnation.saturating_add(1),
                },
                reply_to: liar_agent,
            },
            1 => Message::AddressGone {
                scope: GoneScope::Address(victim_actor),
                reply_to: liar_agent,
            },
            2 => Message::SourceRetired {
                source: victim_actor,
            },
            3 => Message::StreamDisplaced {
                endpoint: victim_actor,
                incarnation: Default::default(),
            },
            _ => Message::AddressGone {
                scope: GoneScope::NodeBefore {
                    node: liar_node,
                    incarnation: liar_incarnation,
                },
                reply_to: victim_agent,
            },
        };
        self.stats.spoofs += 1;
        self.checker.coverage.hit("fault.spoof");
        let to = self.directory.address();
        self.send(liar_agent, to, message);
    }

    fn kill_random_actor(&mut self) {
        // (A paused host's agent could not report the death before it resumes.)
        let up: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].up && !self.host_paused(h))
            .collect();
        if up.is_empty() {
            return;
        }
        let host = *self.fault_rng.pick(&up);
        let h = &self.hosts[host];
        let mut actors: Vec<u64> = h.sources.iter().copied().collect();
        actors.extend(h.endpoints.keys().copied());
        if actors.is_empty() {
            return;
        }
        let actor = *self.fault_rng.pick(&actors);
        let address = Address::new(h.node, h.incarnation, actor);
        let report = self.fault_rng.chance(ratio(1, 2));
        let local = self.host_now(host);
        let h = &mut self.hosts[host];
        h.sources.remove(&actor);
        h.endpoints.remove(&actor);
        self.stats.actor_deaths += 1;
        self.checker.coverage.hit("fault.actor_death");
        if report {
            let scope = GoneScope::Address(address);
            if h.agent.report(local, scope, &mut self.outbox) {
                self.checker.coverage.hit("agent.reported_actor");
            }
            let effects = self.outbox.take();
            let mut out = HostOutput::default();
            self.hosts[host].agent_effects(effects, &mut out);
            self.host_output(host, out);
        }
    }

    /// The supervisor of a random running host revokes a random attached worker's session.
    /// A file on a host's disk changes (issue 17): rewritten with the bytes of a new version
    /// (mostly of the same length, so only its stamp tells), or removed. A file blob published
    /// from it must never be served again: the content check holds every read of a file blob
    /// to the version its publication saw.
    fn change_random_file(&mut self) {
        let host = self.fault_rng.below(self.hosts.len() as u64) as usize;
        let name = file_name(self.fault_rng.below(FILES_PER_HOST) as usize);
        let files = &mut self.hosts[host].mem.files;
        let old = files.contents(&name).map(|b| b.len() as u64);
        if self.fault_rng.chance(ratio(1, 5)) {
            files.remove(&name);
            self.checker.coverage.hit("fault.file_removed");
            return;
        }
        let length = match old {
            Some(length) if self.fault_rng.chance(ratio(3, 4)) => length,
            _ => self.fault_rng.range(
                FILE_LENGTH_MIN,
                self.options.host.blob_max.max(FILE_LENGTH_MIN) + 1,
            ),
        };
        self.file_tags += 1;
        let bytes = crate::worker::content(FILE_TAG_BASE + self.file_tags, length);
        self.hosts[host].mem.files.write(&name, bytes);
        self.checker.coverage.hit("fault.file_changed");
    }

    fn revoke_random_session(&mut self) {
        let candidates: Vec<(usize, Address)> = self
            .hosts
            .iter()
            .enumerate()
            .filter(|&(i, h)| h.up && h.machine.is_some() && self.host_pauses[i].is_none())
            .flat_map(|(i, h)| {
                h.workers
                    .iter()
                    .filter(|w| w.state == WorkerState::Ready && w.probe_done().is_none())
                    .map(move |w| (i, w.session))
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let (host, session) = *self.fault_rng.pick(&candidates);
        self.checker.coverage.hit("fault.session_revoked");
        if let Some(w) = self.hosts[host]
            .workers
            .iter_mut()
            .find(|w| w.session == session)
        {
            w.revoked = true;
        }
        self.machine_input(host, MachineInput::Revoke(session));
    }

    /// When every liveness property must hold: the liveness bound after the heal, and as many
    /// retry ticks more as the rotation needs to reach the most obligations the run held.
    fn drained_by(&self) -> Instant {
        let passes = self
            .stats
            .obligations_max
            .div_ceil(self.options.retry_batch.max(1) as u64);
        self.end_at
            .saturating_add(self.options.directory_retry.saturating_mul(passes))
    }

    fn heal(&mut self) {
        self.phase = Phase::Healed;
        self.checker.healed(self.now);
        self.blocked.clear();
        self.heal_stalls();
        for target in std::mem::take(&mut self.flapped) {
            self.directory.routes.set_lost(target, false);
        }
        self.outages = 0;
        // The disk heals too: room again, no more failed fsyncs.
        if self.directory.fs.capacity.take().is_some() {
            self.directory.freed_at = Some(self.now);
        }
        self.directory.fs.fsync_failure = crate::rng::Ratio::ZERO;
        if self.directory.machine.is_none() {
            self.restart_directory();
        }
        self.publish_discovery();
        for host in 0..self.hosts.len() {
            if self.hosts[host].up && self.hosts[host].proxy.is_none() {
                self.start_proxy(host);
                self.machine_input(host, MachineInput::ProxyRestarted);
                for client in 0..self.hosts[host].clients.len() {
                    self.client_step(host, client, |c, io| c.proxy_restarted(io));
                }
            }
        }
        for host in 0..self.hosts.len() {
            if !self.hosts[host].up {
                self.restart_host(host);
            } else {
                for client in 0..self.hosts[host].clients.len() {
                    self.client_step(host, client, |c, io| c.quiesce(io));
                }
                for slot in 0..self.hosts[host].workers.len() {
                    self.worker_step(host, slot, |w, io| w.quiesce(io));
                }
            }
            self.maybe_probe(host);
        }
        self.report_routes();
    }
}

/// The answer a live node owes, at once, for `message` sent to `to`, an actor of one of its
/// earlier incarnations (ARCHITECTURE "Lost blobs" and "Gone reports"): a retirement and a
/// displacement are acknowledged so the directory stops re-sending them, a transfer is refused
/// because the bytes died with that incarnation. Every other frame is owed nothing.
fn answer_owed_for_ended(to: Address, message: &Message) -> Option<(Address, Message)> {
    match message {
        Message::Retire { reply_to } => Some((*reply_to, Message::SourceRetired { source: to })),
        Message::Displaced {
            incarnation,
            reply_to,
        } => Some((
            *reply_to,
            Message::StreamDisplaced {
                endpoint: to,
                incarnation: *incarnation,
            },
        )),
        Message::ChunkRequest { reply_to, .. } => Some((
            *reply_to,
            Message::ChunkRefused {
                reason: dataplane_core::wire::ChunkRefusal::IncarnationEnded,
            },
        )),
        _ => None,
    }
}

/// When host `host` joins the cluster, if it is one of the seed's late joiners (the last
/// hosts; the first is always there from the start).
pub(crate) fn late_join(options: &Options, host: usize) -> Option<Duration> {
    let hosts = options.clients_per_host.len();
    let late = options.late_joins.len().min(hosts.saturating_sub(1));
    let first = hosts - late;
    (host >= first).then(|| options.join_point(options.late_joins[host - first]))
}

/// How soon a late joiner looks again whether the host before it was admitted.
const JOIN_RETRY: Duration = Duration::from_millis(100);

/// The listen address a simulated host says hello with (its identity to the membership).
fn host_listen(node: NodeId) -> String {
    format!("sim-host-{}", node.0)
}

/// The node a frame that came over `link`'s link speaks for, if it is not `link` (the rule of
/// ARCHITECTURE "Admission" restated for the checker, not asked of `core::admission`): its
/// sender, where a call or a gone report's answer goes, the addresses and incarnations a gone
/// report ends, the source a retirement acknowledges, the endpoint a displacement does.
fn speaks_for_another(link: NodeId, envelope: &Envelope) -> Option<NodeId> {
    use dataplane_core::wire::GoneScope;
    let mut nodes = vec![envelope.from.node];
    match &envelope.message {
        Message::Call(call) => nodes.push(call.reply_to.node),
        Message::AddressGone { scope, reply_to } => {
            nodes.push(reply_to.node);
            nodes.push(match scope {
                GoneScope::Address(address) => address.node,
                GoneScope::NodeBefore { node, .. } => *node,
            });
        }
        Message::SourceRetired { source } => nodes.push(source.node),
        Message::StreamDisplaced { endpoint, .. } => nodes.push(endpoint.node),
        _ => {}
    }
    nodes.into_iter().find(|node| *node != link)
}

#[cfg(test)]
mod queue_tests {
    use super::EventQueue;
    use dataplane_core::time::Instant;

    /// Pops in (time, sequence) order whatever the push order, and a slot freed by a pop is
    /// reused without mixing up kinds.
    #[test]
    fn pops_earliest_time_then_sequence_and_reuses_slots() {
        let mut q = EventQueue::default();
        let at = Instant::from_nanos;
        q.push(at(30), 1, "c");
        q.push(at(10), 3, "b");
        q.push(at(10), 2, "a");
        let first = q.pop().unwrap();
        assert_eq!((first.at, first.seq, first.kind), (at(10), 2, "a"));
        // Into the freed slot, earlier than everything left.
        q.push(at(5), 4, "z");
        q.push(at(30), 5, "d");
        let rest: Vec<_> = std::iter::from_fn(|| q.pop())
            .map(|e| (e.at, e.seq, e.kind))
            .collect();
        assert_eq!(
            rest,
            [
                (at(5), 4, "z"),
                (at(10), 3, "b"),
                (at(30), 1, "c"),
                (at(30), 5, "d")
            ]
        );
        assert!(q.pop().is_none());
    }
}

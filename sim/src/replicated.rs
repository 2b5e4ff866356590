//! The replicated directory's mode of the swarm (issue 19, `swarm --replicas 3`): the directory
//! is a group of `ReplicatedDirectory` replicas (`dataplane-replica`, tikv's engine), three at
//! first, each on its own simulated disk through core's storage protocol, talking
//! `WireMessage` frames over a network that loses, duplicates and reorders them and partitions
//! replicas away. During the faults the group changes: two spare replicas are added (started
//! empty) and two voters removed, 3 → 5 → 3 and again. Hosts run the real namespace proxy and a
//! few callers; a host's link rotates over the five replicas' addresses until one that serves
//! welcomes it, as `dataplane-node`'s hosts do with `--directory A,B,C,D,E`
//! (`io-adapter/src/replnode.rs` is the reference driver).
//!
//! Determinism: every draw comes from the seed's streams (network, faults, workload, disk,
//! storage), the engine's election timeouts are pinned per replica from the seed, and events at
//! one instant run in the order they were scheduled.
//!
//! Checks (restated from what the world observes, never asked of the code checked): the
//! reference model and every per-step check of `check/` on each step of the replica that
//! serves the highest term, against a model rolled back to the committed steps at each new term
//! and recovered at the term as its epoch; every released effect's entry is durable on a
//! quorum's disks, in the configuration restated from the committed log (a majority of each
//! side of a joint change); at most one leader per term; a term made durable never goes back; the
//! replicas never disagree about a committed index; the epoch a host's proxy is welcomed at
//! never goes back; after the heal, every acknowledged mutation is in the committed log, in the
//! order it was acknowledged, and every caller is answered; the voters the committed log ends
//! with agree. See SIMULATION.md, "The replicated directory in the main swarm".

use std::collections::{BTreeMap, VecDeque};

use dataplane_core::conns::{ConnId, DirectoryLink, FORGET_AWAY_AFTER, HOST_SILENCE_DEFAULT};
use dataplane_core::directory::{ActorSources, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::ids::{Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId};
use dataplane_core::link::ClusterKey;
use dataplane_core::log::LogRecord;
use dataplane_core::path::DataPath;
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::storage::{LogStore, StorageOptions};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{DirectoryCall, DirectoryRequest, Message, ReplyBody, SourceRecovery};
use dataplane_replica::{
    Durable, EntryKind, HostSide, HostSideConfig, Kind, MemberChange, NotServing, Ready, Replica,
    ReplicaConfig, ReplicatedDirectory, Role, WireMessage, round_records,
};

use crate::check::proxy::ProxyInput;
use crate::check::{Checker, Coverage, DirInput};
use crate::disk::SimFs;
use crate::options::Options;
use crate::rng::{SimRng, Stream};
use crate::world::{EventQueue, Outcome, Stats, late_join};

mod links;

/// What a swarm of this mode must reach (its `--require-coverage`; the default mode's list is
/// `check::EXPECTED_COVERAGE`). Every run hits `mode.replicated`, which selects this list.
pub const REPLICATED_COVERAGE: &[&str] = &[
    "mode.replicated",
    "replicas.election",
    "replicas.serving",
    "replicas.leader_crash",
    "replicas.crash_after_fsync",
    "replicas.lost_unsynced_round",
    "replicas.snapshot_taken",
    "replicas.snapshot_installed",
    "replicas.log_compacted",
    "replicas.restart_from_snapshot",
    "replicas.cut_from_peers",
    "replicas.cut_from_everyone",
    "replicas.host_refused",
    "replicas.welcomed",
    "replicas.uncommitted_steps_dropped",
    "replicas.stale_leader_step",
    "replicas.mutation_acknowledged",
    "replicas.client_retry",
    "replicas.change_proposed",
    "replicas.transfer_started",
    "replicas.read_confirmed",
    "replicas.member_added",
    "replicas.joined",
    "replicas.member_removed",
    "replicas.leader_removed",
    "replicas.joint_left",
    "replicas.removed_stopped",
    "replicas.quorum_of_next_conf",
    "replicas.paused",
    "replicas.leader_paused",
    "replicas.cut_silently",
    "replicas.left_silent_leader",
    "replicas.attempt_expired",
    "replicas.route_reported",
    "replicas.redirected",
    "replicas.slow_sync",
    "churn.joined",
    "fault.directory_crash",
    "fault.torn_tail",
    "fault.frame_lost",
    "fault.frame_duplicated",
    "fault.frame_reordered",
    "op.Register",
    "op.Unregister",
    "op.Rename",
    "op.Resolve",
    "op.Lookup",
    "input.SourceRetired",
    "reply.ok",
    "reply.PathNotFound",
    "reply.PathExists",
];

/// Replica slots: replicas 1 to [`FIRST_VOTERS`] are the group's first voters; the others are
/// spares, which membership changes add (started empty) and remove again.
pub const SLOTS: usize = 5;
/// The voters of the group's first configuration (replicas 1, 2 and 3).
pub const FIRST_VOTERS: usize = 3;
/// Between two membership changes: 2 to 6 s (during the fault phase only).
const CHANGE_EVERY_MIN_MS: u64 = 2_000;
const CHANGE_EVERY_SPREAD_MS: u64 = 4_000;
/// One tick of a replica's engine.
const TICK: Duration = Duration::from_millis(10);
/// Ticks between a leader's heartbeats.
const HEARTBEAT_TICKS: usize = 3;
/// The directory's node: every replica serves as it, at its term as the incarnation.
const DIRECTORY_NODE: NodeId = NodeId(0);
/// Between two pauses of a replica (during the fault phase only): 3 to 10 s.
const PAUSE_EVERY_MIN_MS: u64 = 3_000;
const PAUSE_EVERY_SPREAD_MS: u64 = 7_000;
/// A pause lasts 0.5 to 20 s: often longer than an election, and than a host's silence bound.
const PAUSE_MIN_MS: u64 = 500;
const PAUSE_SPREAD_MS: u64 = 19_500;
/// The longest fault phase of this mode (the checker's account of every replica's log keeps
/// every entry).
pub const FAULT_PHASE_MAX: Duration = Duration::from_secs(90);
/// A replica takes a snapshot after 16 to 79 applied entries (a real node: 10,000), so that
/// compactions, snapshots sent to lagging followers and restarts from a snapshot are common.
const SNAPSHOT_EVERY_MIN: u64 = 16;
const SNAPSHOT_EVERY_SPREAD: u64 = 64;
/// It keeps 0 to 15 entries before its snapshot's index.
const SNAPSHOT_KEEP_SPREAD: u64 = 16;
/// After the heal, every caller must be answered within this.
const SETTLE: Duration = Duration::from_secs(60);

type Node = ReplicatedDirectory<ActorSources>;

/// The world's account of one admitted step's held effects: its entry's (term, index), what
/// the replica had applied at admission, how many effects are still held, and for a read (no
/// entry) when it was admitted and the entry of the last step its leader admitted before it
/// in the term (the read may have seen that step's change), with what the replica had
/// applied when it admitted that step.
type HeldStep = (
    u64,
    Option<u64>,
    u64,
    usize,
    Option<(Instant, Option<(u64, u64)>)>,
);

#[derive(Debug)]
enum Ev {
    Tick(usize, u64),
    /// A replica's message to replica `.0`, sent at `.2`.
    Peer(usize, Vec<u8>, Instant),
    Synced(usize, u64),
    Persisted(usize, u64),
    Crash,
    Restart(usize),
    Isolate,
    EndIsolation(usize, u64),
    DirTimer(usize, u64, u64),
    /// Host `h`'s link may act (connect, ping, give up).
    LinkTick(usize),
    /// Host `h`, a late joiner (churn), joins once the host before it was welcomed.
    Join(usize),
    /// A host's connection reaches its replica's kernel.
    ConnArrive(ConnId),
    /// The replica's process accepts it.
    Accept(ConnId),
    ConnFrame {
        conn: ConnId,
        to_replica: bool,
        bytes: Vec<u8>,
    },
    ConnClosed {
        conn: ConnId,
        to_replica: bool,
    },
    /// Replica `r`'s hosts' side's deadline (in its life).
    SideTick(usize, u64),
    /// A replica pauses (SIGSTOP).
    Pause,
    /// Replica `r` resumes from pause `episode`.
    Resume(usize, u64),
    /// Whether `host` left `conn`, to `replica`, silent since `episode`.
    SilenceCheck {
        host: usize,
        conn: ConnId,
        replica: usize,
        episode: u64,
    },
    ProxyTimer(usize, u64),
    Client(usize, usize),
    Membership,
    Heal,
}

/// How a replica is cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// From the other replicas only: the hosts still reach it (an old leader partitioned away
    /// with the hosts on its side).
    Peers,
    /// From everyone: its host connections break.
    Everyone,
    /// From everyone, by a partition that drops without closing: its host connections stay
    /// open and carry nothing until the cut ends (TCP then delivers what it held).
    Silent,
}

/// An entry as the checker keeps it: its kind and its bytes.
type EntryData = (EntryKind, Vec<u8>);

/// A configuration of the group as the checker restates it from the committed log (never
/// asked of the engine): its voters and, during a joint change, the voters it leaves. A
/// quorum is a majority of each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Conf {
    incoming: Vec<u64>,
    outgoing: Vec<u64>,
}

impl Conf {
    /// Every voter, on either side of a joint change.
    fn voters(&self) -> Vec<u64> {
        let mut voters: Vec<u64> = self
            .incoming
            .iter()
            .chain(&self.outgoing)
            .copied()
            .collect();
        voters.sort_unstable();
        voters.dedup();
        voters
    }

    /// Whether the replicas `holding` are a quorum: a majority of the voters, and of the
    /// voters it leaves during a joint change.
    fn quorum(&self, holding: &[u64]) -> bool {
        let majority = |side: &[u64]| {
            side.is_empty()
                || side.iter().filter(|id| holding.contains(id)).count() * 2 > side.len()
        };
        majority(&self.incoming) && majority(&self.outgoing)
    }
}

impl std::fmt::Display for Conf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.outgoing.is_empty() {
            write!(f, "voters {:?}", self.incoming)
        } else {
            write!(
                f,
                "voters {:?} joint with {:?}",
                self.incoming, self.outgoing
            )
        }
    }
}

struct Rep {
    config: ReplicaConfig,
    fs: SimFs,
    booted: bool,
    log: Option<LogStore<SimFs>>,
    node: Option<Node>,
    life: u64,
    /// The round being written, and whether its fsync completed.
    inflight: Option<(Ready, bool)>,
    /// The log as the engine holds it (index → term), and as this disk made it durable.
    log_terms: BTreeMap<u64, u64>,
    durable_terms: BTreeMap<u64, u64>,
    /// Entries (index, term) and the highest term appended since the last fsync.
    writing: Vec<(u64, u64)>,
    writing_term: u64,
    /// The index of a snapshot the round being written installs.
    writing_snapshot: Option<u64>,
    /// What its disk holds, as the replica's driver keeps it to restate at a compaction of
    /// its log (`Durable::write`: the rounds, the snapshots taken and installed).
    durable: Durable,
    /// Entries' kind and data by index (for the committed-sequence check).
    data: BTreeMap<u64, EntryData>,
    cut: Option<(Cut, u64)>,
    /// Crash at the next completed fsync, before the engine hears of it.
    crash_after_sync: bool,
    timer_arming: u64,
    /// The term it serves hosts in, if any.
    serving: Option<u64>,
    /// What hosts meet here (the replica crate's, as `replnode.rs` runs it; a fresh one for
    /// each life of the process).
    side: HostSide,
    /// When its next `SideTick` is scheduled, if one is.
    side_tick: Option<Instant>,
    /// The pause it is in (its number, and when it ends), and what its process was sent
    /// meanwhile, in order.
    paused: Option<(u64, Instant)>,
    deferred: Vec<Ev>,
    /// Frames on host connections that a silent cut holds: (the cut, connection, towards the
    /// replica, bytes), in order.
    held_frames: Vec<(u64, ConnId, bool, Vec<u8>)>,
    /// The world's account of the barrier: per admitted step not fully released, its entry
    /// (term, index), the index the replica had applied when it admitted the step, its
    /// effects still held, and for a read (no entry) when it was admitted.
    held: VecDeque<HeldStep>,
    /// The answers it took from each other replica, by (replica, term): when the latest was
    /// sent. A read is confirmed by such answers of its term sent after it (the ReadIndex rule,
    /// restated from the messages, never asked of the engine).
    acks: BTreeMap<(u64, u64), Instant>,
    /// The entry (term, index) of the last step with one it admitted, and what it had
    /// applied then.
    last_admitted: Option<(u64, u64, u64)>,
    committed_checked: u64,
    /// The world runs it (started, restarted after crashes and at the heal): one of the first
    /// voters, or a spare added by a change; not a spare never added, nor a replica stopped
    /// once its removal was applied.
    member: bool,
    /// It was added empty and rejoins ([`Replica::start_joining`]) until it caught up.
    joining: bool,
}

impl Rep {
    /// Slot `config.id`, never started, on an empty disk.
    fn new(config: ReplicaConfig, fs: SimFs, member: bool, key: ClusterKey) -> Rep {
        Rep {
            config,
            fs,
            booted: false,
            log: None,
            node: None,
            life: 0,
            inflight: None,
            log_terms: BTreeMap::new(),
            durable_terms: BTreeMap::new(),
            writing: Vec::new(),
            writing_term: 0,
            writing_snapshot: None,
            durable: Durable::default(),
            data: BTreeMap::new(),
            cut: None,
            crash_after_sync: false,
            timer_arming: 0,
            serving: None,
            side: HostSide::new(side_config(key)),
            side_tick: None,
            paused: None,
            deferred: Vec::new(),
            held_frames: Vec::new(),
            held: VecDeque::new(),
            acks: BTreeMap::new(),
            last_admitted: None,
            committed_checked: 0,
            member,
            joining: false,
        }
    }
}

/// How the simulated replicas take hosts: the real node's settings, with a smaller waiting
/// room and deadline.
fn side_config(key: ClusterKey) -> HostSideConfig {
    HostSideConfig {
        key: Some(key),
        admission_deadline: Duration::from_millis(1_500),
        pending_max: 4,
        admitted_max: 64,
        first_transient: 1 << 40,
        members_max: dataplane_core::limits::MEMBERS_MAX,
        forget_after: FORGET_AWAY_AFTER,
        host_silence: HOST_SILENCE_DEFAULT,
    }
}

struct Host {
    /// The proxy's effects at its start (executed when the run starts).
    effects_at_start: Vec<Effect>,
    node: NodeId,
    proxy: Proxy,
    proxy_arming: u64,
    /// Core's link to the directory, over the five replicas' addresses.
    link: DirectoryLink,
    /// When its next `LinkTick` is scheduled, if one is.
    link_tick: Option<Instant>,
    /// Its link started (the hosts join one after another, each once the one before was
    /// welcomed, so that each is the node its order says).
    started: bool,
    /// The highest epoch this host was welcomed at.
    epoch_seen: AuthorityEpoch,
    clients: Vec<Client>,
}

struct Client {
    next_request: u64,
    next_op: u64,
    /// The call in flight: request, operation (for a mutation), first sent at (sequence).
    calling: Option<(RequestId, DirectoryRequest, u64)>,
    quiet: bool,
}

/// An acknowledged mutation: its operation, and the mutations acknowledged before it was
/// first sent (it must commit after them).
struct Acked {
    op: OperationId,
    after: Vec<OperationId>,
}

/// One run of the replicated mode.
#[allow(missing_debug_implementations)] // the engine's state has no useful Debug
pub struct ReplWorld {
    options: Options,
    now: Instant,
    queue: EventQueue<Ev>,
    seq: u64,
    net: SimRng,
    faults: SimRng,
    work: SimRng,
    disk: SimRng,
    /// Draws the simulated disks of the spares (a fresh one at each addition).
    storage: SimRng,
    reps: Vec<Rep>,
    hosts: Vec<Host>,
    faulty: bool,
    outbox: Outbox,
    /// The model's term (the highest term whose steps it follows) and the steps it holds
    /// since the last rollback: (step, term, index).
    model_term: u64,
    journal: Vec<(u64, u64, Option<u64>)>,
    step: u64,
    /// Terms and who led them; the highest term each replica made durable.
    leaders: BTreeMap<u64, usize>,
    durable_term: Vec<u64>,
    /// The committed sequence: (term, kind, data) per index from 1.
    committed: Vec<(u64, EntryKind, Vec<u8>)>,
    /// The membership changes the world proposed: per entry (term, index), the changes and
    /// the replica that proposed them.
    proposals: BTreeMap<(u64, u64), (Vec<MemberChange>, usize)>,
    /// How many membership events the fault phase had: every third hands the leadership
    /// over instead of changing the group (no draw: the seeds' streams stay as they were).
    membership_events: u64,
    /// The group's configurations, restated from the committed sequence: the first one, then
    /// each committed change's (its index, the configuration it puts in force).
    first_conf: Conf,
    confs: Vec<(u64, Conf)>,
    /// The serving replica, term and applied index `follow_membership` last looked at.
    membership_seen: (usize, u64, u64),
    acked: Vec<Acked>,
    /// Per host connection a serving replica admitted: the entry (term, index) its welcome
    /// must wait for (the membership change's, or the next one) and the index the replica had
    /// applied then.
    admissions: BTreeMap<ConnId, (u64, u64, u64)>,
    /// The connections between hosts and replicas, and the last one's number.
    rconns: BTreeMap<ConnId, links::RConn>,
    next_conn: ConnId,
    /// Connection latencies and handshake nonces.
    conn_rng: SimRng,
    /// Pauses and silent cuts (a stream of their own).
    stall_rng: SimRng,
    /// Pauses and silent cuts started so far (each is numbered).
    episodes: u64,
    /// The cluster key every node of the run has.
    cluster_key: ClusterKey,
    /// The replica whose disk is slow, in seeds with slow disks (drawn from the stalls stream).
    slow_replica: usize,
    acked_ops: Vec<OperationId>,
    /// Per client (host, client): the mutations acknowledged before its call was first sent.
    sent_after: BTreeMap<(usize, usize), Vec<OperationId>>,
    pub stats: Stats,
    pub checker: Checker,
    hash: u64,
    events: u64,
}

fn mix(hash: u64, value: u64) -> u64 {
    (hash ^ value).wrapping_mul(0x0100_0000_01b3).rotate_left(5)
}

impl ReplWorld {
    /// A run of `options` (drawn as for the single directory; `options.replicas` is 3).
    pub fn new(options: Options) -> ReplWorld {
        let entropy = &options.entropy;
        let mut faults = entropy.rng(Stream::Faults);
        let net = entropy.rng(Stream::Network);
        let work = entropy.rng(Stream::Workload);
        let disk = entropy.rng(Stream::Disk);
        let mut storage = entropy.rng(Stream::Storage);
        let mut conn_rng = entropy.rng(Stream::Conns);
        let mut stall_rng = entropy.rng(Stream::Stalls);
        let slow_replica = if options.disk.slow_sync.is_some() {
            stall_rng.below(FIRST_VOTERS as u64) as usize
        } else {
            0
        };
        let key = ClusterKey::from_bytes(std::array::from_fn(|i| {
            (conn_rng.next_u64() >> (i % 8)) as u8
        }));
        let voters: Vec<u64> = (1..=FIRST_VOTERS as u64).collect();
        let mut timeouts: Vec<usize> = (0..SLOTS).map(|i| 10 + 6 * i).collect();
        for i in (1..SLOTS).rev() {
            let j = faults.below(i as u64 + 1) as usize;
            timeouts.swap(i, j);
        }
        let reps = (0..SLOTS)
            .map(|i| {
                let config = ReplicaConfig {
                    id: i as u64 + 1,
                    voters: voters.clone(),
                    election_ticks: timeouts[i] + faults.below(5) as usize,
                    heartbeat_ticks: HEARTBEAT_TICKS,
                    snapshot_every: SNAPSHOT_EVERY_MIN + faults.below(SNAPSHOT_EVERY_SPREAD),
                    snapshot_keep: faults.below(SNAPSHOT_KEEP_SPREAD),
                };
                let fs = SimFs::new(SimRng::new(storage.next_u64(), Stream::Storage));
                Rep::new(config, fs, i < FIRST_VOTERS, key)
            })
            .collect();
        let checker = Checker::new(&options);
        let mut outbox = Outbox::new();
        let hosts = options
            .clients_per_host
            .iter()
            .enumerate()
            .map(|(h, &clients)| {
                let node = NodeId(h as u64 + 1);
                let config = ProxyConfig {
                    address: Address::new(node, 1, 500),
                    retry_period: options.proxy.retry_period,
                    deadline: options.proxy.deadline,
                    absent_read_wait: options.proxy.absent_read_wait(),
                    first_request_id: 1,
                    pending_max: dataplane_core::limits::PROXY_PENDING_MAX,
                };
                let proxy = Proxy::new(config, Instant::ZERO, &mut outbox);
                let effects_at_start = outbox.take();
                Host {
                    effects_at_start,
                    node,
                    proxy,
                    proxy_arming: 0,
                    link: ReplWorld::new_link(h, key),
                    link_tick: None,
                    started: false,
                    epoch_seen: AuthorityEpoch::NONE,
                    clients: (0..clients)
                        .map(|_| Client {
                            next_request: 1,
                            next_op: 1,
                            calling: None,
                            quiet: false,
                        })
                        .collect(),
                }
            })
            .collect();
        ReplWorld {
            options,
            now: Instant::ZERO,
            queue: EventQueue::default(),
            seq: 0,
            net,
            faults,
            work,
            disk,
            storage,
            reps,
            hosts,
            faulty: true,
            outbox,
            model_term: 0,
            journal: Vec::new(),
            step: 0,
            leaders: BTreeMap::new(),
            durable_term: vec![0; SLOTS],
            committed: Vec::new(),
            proposals: BTreeMap::new(),
            membership_events: 0,
            first_conf: Conf {
                incoming: voters,
                outgoing: Vec::new(),
            },
            confs: Vec::new(),
            membership_seen: (0, 0, 0),
            acked: Vec::new(),
            admissions: BTreeMap::new(),
            rconns: BTreeMap::new(),
            next_conn: 0,
            conn_rng,
            stall_rng,
            episodes: 0,
            cluster_key: key,
            slow_replica,
            acked_ops: Vec::new(),
            sent_after: BTreeMap::new(),
            stats: Stats::default(),
            checker,
            hash: 0xcbf2_9ce4_8422_2325,
            events: 0,
        }
    }

    fn at(&mut self, delay: Duration, ev: Ev) {
        self.seq += 1;
        self.queue
            .push(self.now.saturating_add(delay), self.seq, ev);
    }

    /// Counts the effects each admitted step of replica `r` holds (all but its `Persist`s),
    /// for the commit rule's account of what the replica may release.
    fn hold(&mut self, r: usize, admitted: &[dataplane_replica::Admitted]) {
        let applied = self.reps[r].node.as_ref().map_or(0, Node::applied);
        for a in admitted {
            let held = a
                .effects
                .iter()
                .filter(|e| !matches!(e, Effect::Persist(_)))
                .count();
            let before = self.reps[r]
                .last_admitted
                .filter(|(t, _, _)| *t == a.term)
                .map(|(_, i, applied)| (i, applied));
            if let Some(index) = a.index {
                self.reps[r].last_admitted = Some((a.term, index, applied));
            }
            if held > 0 {
                let read = a.read.map(|_| (self.now, before));
                self.reps[r]
                    .held
                    .push_back((a.term, a.index, applied, held, read));
            }
        }
    }

    fn fail(&mut self, why: String) {
        self.checker.fail(self.now, why);
    }

    fn latency(&mut self) -> Duration {
        let n = &self.options.net;
        let jitter = self
            .net
            .exponential(n.latency_jitter_mean.as_nanos().max(1));
        Duration::from_nanos(n.latency_min.as_nanos() + jitter)
    }

    /// Runs the seed: faults for the fault phase, then the heal, then until every caller is
    /// answered (or the bound), then the final checks.
    pub fn run(mut self) -> (Outcome, ReplWorld) {
        self.checker.coverage.hit("mode.replicated");
        for r in 0..FIRST_VOTERS {
            self.restart(r);
        }
        for h in 0..self.hosts.len() {
            self.checker.proxy_started(h, 1, 1);
            let effects = std::mem::take(&mut self.hosts[h].effects_at_start);
            self.proxy_effects(h, effects);
            for c in 0..self.hosts[h].clients.len() {
                let d = Duration::from_millis(1 + self.work.below(50));
                self.at(d, Ev::Client(h, c));
            }
        }
        let d = Duration::from_millis(500 + self.faults.below(3_000));
        self.at(d, Ev::Crash);
        let d = Duration::from_millis(1_000 + self.faults.below(4_000));
        self.at(d, Ev::Isolate);
        let d =
            Duration::from_millis(CHANGE_EVERY_MIN_MS + self.faults.below(CHANGE_EVERY_SPREAD_MS));
        self.at(d, Ev::Membership);
        // Silent stalls (pauses, cuts that drop) in the seeds that draw them, as in the default
        // mode (`--no-fault stalls` turns them off).
        if self.options.stalls.is_some() {
            let d = Duration::from_millis(
                PAUSE_EVERY_MIN_MS + self.stall_rng.below(PAUSE_EVERY_SPREAD_MS),
            );
            self.at(d, Ev::Pause);
        }
        // The first host's link starts; each next one once the one before was welcomed.
        if !self.hosts.is_empty() {
            self.hosts[0].started = true;
            self.at(Duration::ZERO, Ev::LinkTick(0));
        }
        let fault_phase = self.options.fault_phase;
        self.at(fault_phase, Ev::Heal);
        let end = Instant::ZERO
            .saturating_add(fault_phase)
            .saturating_add(SETTLE);
        while let Some(event) = self.queue.pop() {
            if self.checker.failed() || event.at > end {
                break;
            }
            if self.events >= self.options.event_limit {
                break;
            }
            self.now = event.at;
            self.checker.set_time(self.now);
            self.events += 1;
            self.hash = mix(mix(self.hash, event.at.as_nanos()), event.seq);
            self.handle(event.kind);
            self.follow_membership();
            if !self.faulty && self.settled() {
                break;
            }
        }
        if !self.checker.failed() {
            self.at_end();
        }
        self.stats.events = self.events;
        let outcome = Outcome {
            failure: self.checker.failure().map(str::to_owned),
            events: self.events,
            sim_time: self.now.saturating_since(Instant::ZERO),
            trace_hash: self.hash,
        };
        (outcome, self)
    }

    /// Every client is quiet and answered, and the voters of the configuration the committed
    /// log ends with applied what was committed.
    fn settled(&self) -> bool {
        let answered = self
            .hosts
            .iter()
            .all(|h| h.clients.iter().all(|c| c.quiet && c.calling.is_none()));
        let commit = self
            .reps
            .iter()
            .filter_map(|r| r.node.as_ref().map(|n| n.replica().commit()))
            .max()
            .unwrap_or(0);
        answered
            && self.final_conf().voters().iter().all(|&id| {
                let r = &self.reps[id as usize - 1];
                r.node
                    .as_ref()
                    .is_some_and(|n| n.applied() >= commit && r.inflight.is_none())
            })
            && !self.committed.is_empty()
    }

    /// The replica an event is an input of, if its process takes it (a paused process takes
    /// nothing until it resumes).
    fn replica_of(&self, ev: &Ev) -> Option<usize> {
        let conn_replica = |conn: &ConnId| self.rconns.get(conn).map(|c| c.replica);
        match ev {
            Ev::Tick(r, _)
            | Ev::Peer(r, _, _)
            | Ev::Synced(r, _)
            | Ev::Persisted(r, _)
            | Ev::DirTimer(r, _, _)
            | Ev::SideTick(r, _) => Some(*r),
            Ev::Accept(conn) => conn_replica(conn),
            Ev::ConnFrame {
                conn, to_replica, ..
            }
            | Ev::ConnClosed { conn, to_replica } => conn_replica(conn).filter(|_| *to_replica),
            _ => None,
        }
    }

    fn handle(&mut self, ev: Ev) {
        if let Some(r) = self.replica_of(&ev)
            && self.reps[r].paused.is_some()
        {
            self.reps[r].deferred.push(ev);
            return;
        }
        match ev {
            Ev::Tick(r, life) => {
                if self.reps[r].life != life {
                    return;
                }
                if let Some(node) = self.reps[r].node.as_mut() {
                    node.tick();
                    self.drive(r);
                    self.at(TICK, Ev::Tick(r, life));
                }
            }
            Ev::Peer(to, bytes, sent_at) => {
                if self.reps[to].cut.is_some() {
                    self.stats.lost += 1;
                    return;
                }
                let message = match WireMessage::decode(&bytes) {
                    Ok(m) => m,
                    Err(e) => return self.fail(format!("a replica frame does not decode: {e}")),
                };
                let Some(node) = self.reps[to].node.as_mut() else {
                    return;
                };
                let answer = matches!(message.kind, Kind::AppendResponse | Kind::HeartbeatResponse);
                let (from, term) = (message.from, message.term);
                let _ = node.step(message);
                if answer {
                    let current = node.replica().term();
                    let acks = &mut self.reps[to].acks;
                    acks.retain(|(_, t), _| *t >= current);
                    if term >= current {
                        let at = acks.entry((from, term)).or_insert(sent_at);
                        *at = (*at).max(sent_at);
                    }
                }
                self.drive(to);
            }
            Ev::Synced(r, life) => self.synced(r, life),
            Ev::Persisted(r, life) => {
                let rep = &mut self.reps[r];
                if rep.life != life {
                    return;
                }
                let Some((ready, true)) = rep.inflight.take() else {
                    return;
                };
                let node = rep.node.as_mut().expect("running");
                let after = node.persisted(ready);
                self.send_peers(r, after);
                self.drive(r);
            }
            Ev::Crash => {
                if !self.faulty {
                    return;
                }
                let leader = (0..SLOTS).find(|&r| {
                    self.reps[r]
                        .node
                        .as_ref()
                        .is_some_and(|n| n.replica().role() == Role::Leader)
                });
                let members = self.members();
                let r = match leader {
                    Some(l) if self.faults.below(2) == 0 => l,
                    _ => members[self.faults.below(members.len() as u64) as usize],
                };
                if self.reps[r].node.is_some() {
                    if self.faults.below(3) == 0 && self.reps[r].inflight.is_some() {
                        // After its next fsync, before the engine (and so anyone) hears of it.
                        self.reps[r].crash_after_sync = true;
                    } else {
                        self.crash(r);
                    }
                }
                let d = Duration::from_millis(500 + self.faults.below(4_000));
                self.at(d, Ev::Crash);
            }
            Ev::Restart(r) => self.restart(r),
            Ev::Isolate => {
                if !self.faulty {
                    return;
                }
                let members = self.members();
                let r = members[self.faults.below(members.len() as u64) as usize];
                let cut = if self.faults.below(2) == 0 {
                    Cut::Peers
                } else if self.options.stalls.is_none() || self.stall_rng.below(2) == 0 {
                    Cut::Everyone
                } else {
                    Cut::Silent
                };
                self.episodes += 1;
                let generation = self.episodes;
                if let Some((Cut::Silent, g)) = self.reps[r].cut {
                    // The cut it replaces ends here.
                    self.end_silent_cut(r, g);
                }
                self.reps[r].cut = Some((cut, generation));
                self.stats.partitions += 1;
                self.checker.coverage.hit(match cut {
                    Cut::Peers => "replicas.cut_from_peers",
                    Cut::Everyone => "replicas.cut_from_everyone",
                    Cut::Silent => "replicas.cut_silently",
                });
                match cut {
                    Cut::Everyone => self.break_conns(r),
                    Cut::Silent => self.silence_checks(r, generation),
                    Cut::Peers => {}
                }
                let length = Duration::from_millis(300 + self.faults.below(3_000));
                self.at(length, Ev::EndIsolation(r, generation));
                let d = Duration::from_millis(2_000 + self.faults.below(5_000));
                self.at(d, Ev::Isolate);
            }
            Ev::EndIsolation(r, generation) => {
                if self.reps[r].cut.is_some_and(|(_, g)| g == generation) {
                    self.reps[r].cut = None;
                    self.end_silent_cut(r, generation);
                }
            }
            Ev::DirTimer(r, life, arming) => {
                if self.reps[r].life != life || self.reps[r].timer_arming != arming {
                    return;
                }
                self.directory_input(r, DirInput::Timer);
            }
            Ev::LinkTick(h) => self.link_step(h),
            Ev::Join(h) => {
                if !self.hosts[h].started {
                    self.hosts[h].started = true;
                    self.link_step(h);
                }
            }
            Ev::ConnArrive(conn) => self.conn_arrive(conn),
            Ev::Accept(conn) => self.accept(conn),
            Ev::ConnFrame {
                conn,
                to_replica,
                bytes,
            } => self.conn_frame(conn, to_replica, bytes),
            Ev::ConnClosed { conn, to_replica } => self.conn_closed(conn, to_replica),
            Ev::SideTick(r, life) => self.side_tick(r, life),
            Ev::Pause => {
                if !self.faulty {
                    return;
                }
                self.pause();
                let d = Duration::from_millis(
                    PAUSE_EVERY_MIN_MS + self.stall_rng.below(PAUSE_EVERY_SPREAD_MS),
                );
                self.at(d, Ev::Pause);
            }
            Ev::Resume(r, episode) => {
                if self.reps[r].paused.is_some_and(|(e, _)| e == episode) {
                    self.resume(r);
                }
            }
            Ev::SilenceCheck {
                host,
                conn,
                replica,
                episode,
            } => self.check_silence(host, conn, replica, episode),
            Ev::ProxyTimer(h, arming) => {
                if self.hosts[h].proxy_arming == arming {
                    self.proxy_input(h, ProxyInput::Timer);
                }
            }
            Ev::Client(h, c) => self.client_step(h, c),
            Ev::Membership => {
                if !self.faulty {
                    return;
                }
                self.membership_events += 1;
                if self.membership_events.is_multiple_of(3) {
                    self.transfer_leadership();
                } else {
                    self.change_membership();
                }
                let d = Duration::from_millis(
                    CHANGE_EVERY_MIN_MS + self.faults.below(CHANGE_EVERY_SPREAD_MS),
                );
                self.at(d, Ev::Membership);
            }
            Ev::Heal => {
                self.faulty = false;
                self.checker.healed(self.now);
                for r in 0..SLOTS {
                    if self.reps[r].paused.is_some() {
                        self.resume(r);
                    }
                    if let Some((_, generation)) = self.reps[r].cut.take() {
                        self.end_silent_cut(r, generation);
                    }
                    self.reps[r].crash_after_sync = false;
                    if self.reps[r].node.is_none() {
                        self.restart(r);
                    }
                }
                for host in &mut self.hosts {
                    for client in &mut host.clients {
                        client.quiet = true;
                    }
                }
            }
        }
    }

    // ------------------------------------------------------------------ replicas

    fn send_peers(&mut self, from: usize, messages: Vec<WireMessage>) {
        for m in messages {
            let to = (m.to as usize).wrapping_sub(1);
            if to >= SLOTS {
                continue;
            }
            self.stats.frames += 1;
            let bytes = m.encode();
            if self.faulty
                && (self.reps[from].cut.is_some() || self.net.chance(self.options.net.loss))
            {
                self.stats.lost += 1;
                self.checker.coverage.hit("fault.frame_lost");
                continue;
            }
            let mut d = self.latency();
            if self.faulty && self.net.chance(self.options.net.reorder) {
                self.stats.reordered += 1;
                self.checker.coverage.hit("fault.frame_reordered");
                d = d.saturating_add(Duration::from_nanos(
                    self.net
                        .below(self.options.net.reorder_delay_max.as_nanos().max(1) / 10 + 1),
                ));
            }
            if self.faulty && self.net.chance(self.options.net.duplicate) {
                self.stats.duplicated += 1;
                self.checker.coverage.hit("fault.frame_duplicated");
                let d2 = d.saturating_add(self.latency());
                self.at(d2, Ev::Peer(to, bytes.clone(), self.now));
            }
            self.at(d, Ev::Peer(to, bytes, self.now));
        }
    }

    /// Takes the replica's next round unless one is being written: its messages that may
    /// leave now leave, its entries and hard state go to the log and an fsync starts; then
    /// whatever the directory admitted and released is checked and executed.
    fn drive(&mut self, r: usize) {
        let now = self.now;
        let rep = &mut self.reps[r];
        if rep.inflight.is_none()
            && let Some(node) = rep.node.as_mut()
            && let Some(mut ready) = node.ready(now)
        {
            let send = std::mem::take(&mut ready.send);
            let mut failed = None;
            if let Some(s) = &ready.snapshot {
                // An installed snapshot stands for the committed entries up to its index: the
                // account of this replica's log is those (as this checker saw them committed),
                // and no more.
                self.checker.coverage.hit("replicas.snapshot_installed");
                if (self.committed.len() as u64) < s.index {
                    failed = Some(format!(
                        "replica {} installs a snapshot at {} past the {} entries committed",
                        r + 1,
                        s.index,
                        self.committed.len()
                    ));
                }
                rep.log_terms.clear();
                rep.data.clear();
                for (i, (t, k, d)) in self.committed.iter().take(s.index as usize).enumerate() {
                    rep.log_terms.insert(i as u64 + 1, *t);
                    rep.data.insert(i as u64 + 1, (*k, d.clone()));
                }
                rep.writing_snapshot = Some(s.index);
                rep.committed_checked = rep.committed_checked.max(s.index);
            }
            if ready.compacted.is_some() {
                self.checker.coverage.hit("replicas.snapshot_taken");
            }
            for e in &ready.entries {
                rep.log_terms.split_off(&e.index);
                rep.data.split_off(&e.index);
            }
            for e in &ready.entries {
                rep.log_terms.insert(e.index, e.term);
                rep.data.insert(e.index, (e.kind, e.data.clone()));
            }
            rep.writing
                .extend(ready.entries.iter().map(|e| (e.index, e.term)));
            if let Some(hs) = ready.hard_state {
                rep.writing_term = rep.writing_term.max(hs.term);
            }
            let records = round_records(ready.snapshot.as_ref(), &ready.entries, ready.hard_state);
            let log = rep.log.as_mut().expect("a running replica has its log");
            for record in &records {
                if let Err(e) = log.append(&mut rep.fs, record) {
                    failed = Some(e.to_string());
                    break;
                }
            }
            rep.inflight = Some((ready, false));
            let life = rep.life;
            self.send_peers(r, send);
            if let Some(e) = failed {
                return self.fail(format!("replica {} could not append its round: {e}", r + 1));
            }
            let (lo, hi) = (
                self.options.disk.sync_min.as_nanos(),
                self.options.disk.sync_max.as_nanos(),
            );
            let mut d = Duration::from_nanos(self.disk.range(lo, hi.max(lo + 1)));
            if let Some(slow) = self.slow_sync(r) {
                // Its loop waits in the fsync (`replnode.rs` syncs on its one thread).
                d = d.saturating_add(slow);
                self.block(r, d);
            }
            self.at(d, Ev::Synced(r, life));
        }
        self.observe(r);
    }

    /// The extra latency of this fsync of replica `r`, if the seed's disks are slow and `r` is
    /// the slow one (fault phase only; from the stalls stream).
    fn slow_sync(&mut self, r: usize) -> Option<Duration> {
        let slow = self.options.disk.slow_sync?;
        if !self.faulty || r != self.slow_replica || self.stall_rng.below(1_000) >= slow.per_mille {
            return None;
        }
        self.checker.coverage.hit("replicas.slow_sync");
        Some(Duration::from_nanos(
            self.stall_rng.below(slow.max.as_nanos().max(1)),
        ))
    }

    /// Replica `r`'s loop is busy for `length` (a slow fsync): what it is sent waits.
    fn block(&mut self, r: usize, length: Duration) {
        if self.reps[r].paused.is_some() {
            return;
        }
        self.episodes += 1;
        let episode = self.episodes;
        self.reps[r].paused = Some((episode, self.now.saturating_add(length)));
        self.at(length, Ev::Resume(r, episode));
    }

    fn synced(&mut self, r: usize, life: u64) {
        let rep = &mut self.reps[r];
        if rep.life != life || rep.node.is_none() {
            return;
        }
        let Some(log) = rep.log.as_mut() else {
            return;
        };
        let claimed = match log.sync(&mut rep.fs) {
            Ok(synced) => synced as usize,
            Err(e) => return self.fail(format!("replica {} could not sync: {e}", r + 1)),
        };
        // The protocol's claim against the disk's own record: everything it calls synced is
        // durable, but for a trailing sync mark (24 bytes).
        let durable = rep
            .fs
            .durable(log.log_name())
            .map_or(0, |(_, durable, _)| durable);
        if durable + 24 < claimed {
            return self.fail(format!(
                "storage: replica {}'s log says it is synced up to byte {claimed}, but only {durable} are durable",
                r + 1
            ));
        }
        // What the disk now holds, from what was written (never from the engine).
        if let Some(s) = rep.writing_snapshot.take() {
            rep.durable_terms = rep.log_terms.range(..=s).map(|(&i, &t)| (i, t)).collect();
        }
        for (index, term) in std::mem::take(&mut rep.writing) {
            rep.durable_terms.split_off(&index);
            rep.durable_terms.insert(index, term);
        }
        self.durable_term[r] = self.durable_term[r].max(rep.writing_term);
        let Some((ready, synced)) = rep.inflight.as_mut() else {
            return;
        };
        *synced = true;
        // The driver's copy of the disk, and a compaction of the log when it is due (it
        // restates the snapshot and the entries after it: the restarts that follow start
        // from the snapshot).
        rep.durable.write(ready);
        if log.compaction_due(self.options.disk.compact_min_bytes) {
            let records = rep.durable.snapshot_records();
            if let Err(e) = log.compact(&mut rep.fs, &records) {
                return self.fail(format!("replica {} could not compact its log: {e}", r + 1));
            }
            self.checker.coverage.hit("replicas.log_compacted");
        }
        if self.reps[r].crash_after_sync && self.faulty {
            self.checker.coverage.hit("replicas.crash_after_fsync");
            return self.crash(r);
        }
        let gap = Duration::from_nanos(self.disk.below(2_000_000));
        self.at(gap, Ev::Persisted(r, life));
    }

    fn crash(&mut self, r: usize) {
        self.stats.directory_crashes += 1;
        self.checker.coverage.hit("fault.directory_crash");
        let was_leader = self.reps[r]
            .node
            .as_ref()
            .is_some_and(|n| n.replica().role() == Role::Leader);
        if was_leader {
            self.checker.coverage.hit("replicas.leader_crash");
        }
        // Killed while paused: what waited for it goes to the dead process (and is dropped).
        if self.reps[r].paused.is_some() {
            self.resume(r);
        }
        self.break_conns(r);
        // The unsynced tail survives whole, or is lost; lost, it may leave a fragment: any
        // prefix of the unsynced bytes (whole records of the round, then part of one).
        let keep_tail = self.disk.below(2) == 0;
        let tear = !keep_tail && self.disk.below(2) == 0;
        let key = self.key();
        let rep = &mut self.reps[r];
        rep.node = None;
        rep.crash_after_sync = false;
        rep.serving = None;
        rep.side = HostSide::new(side_config(key));
        rep.held.clear();
        let unsynced = rep.inflight.as_ref().is_some_and(|(_, s)| !s);
        rep.inflight = None;
        rep.writing.clear();
        rep.writing_term = 0;
        rep.writing_snapshot = None;
        rep.life += 1;
        let disk = &mut self.disk;
        let mut torn = false;
        let pinned = rep.log.take().map(|log| {
            // What the disk made durable, by its own record (never what the storage protocol
            // says it synced).
            let synced = rep
                .fs
                .durable(log.log_name())
                .map_or(0, |(_, durable, _)| durable as u64);
            let written = log.written();
            let keep = if keep_tail {
                written
            } else if tear && written > synced + 1 {
                torn = true;
                disk.range(synced + 1, written - 1)
            } else {
                synced
            };
            (log.log_name().to_owned(), keep as usize)
        });
        if torn {
            self.stats.torn_tails += 1;
            self.checker.coverage.hit("fault.torn_tail");
        }
        if unsynced && !keep_tail {
            self.checker.coverage.hit("replicas.lost_unsynced_round");
        }
        rep.fs.crash(pinned.as_ref().map(|(n, k)| (n.as_str(), *k)));
        let down = Duration::from_millis(100 + self.faults.below(2_000));
        self.at(down, Ev::Restart(r));
    }

    fn restart(&mut self, r: usize) {
        let rep = &mut self.reps[r];
        if rep.node.is_some() || !rep.member {
            return;
        }
        let options = StorageOptions {
            create: !rep.booted,
            repair: false,
            preallocate: 0,
        };
        let (log, recovered) = match LogStore::open(&mut rep.fs, options) {
            Ok(opened) => opened,
            Err(e) => return self.fail(format!("replica {} could not open its log: {e}", r + 1)),
        };
        rep.booted = true;
        let durable = match Durable::from_records(&recovered.records) {
            Ok(d) => d,
            Err(e) => return self.fail(format!("replica {} log does not recover: {e}", r + 1)),
        };
        if durable.hard_state.term < self.durable_term[r] {
            let (got, made) = (durable.hard_state.term, self.durable_term[r]);
            return self.fail(format!(
                "replica {} recovered term {got} after making term {made} durable",
                r + 1
            ));
        }
        rep.log_terms = durable.entries.iter().map(|e| (e.index, e.term)).collect();
        rep.data = durable
            .entries
            .iter()
            .map(|e| (e.index, (e.kind, e.data.clone())))
            .collect();
        if let Some(s) = &durable.snapshot {
            // The snapshot stands for the committed entries up to its index.
            self.checker.coverage.hit("replicas.restart_from_snapshot");
            if (self.committed.len() as u64) < s.index {
                let (index, committed) = (s.index, self.committed.len());
                return self.fail(format!(
                    "replica {} recovered a snapshot at {index} past the {committed} entries committed",
                    r + 1
                ));
            }
            for (i, (t, k, d)) in self.committed.iter().take(s.index as usize).enumerate() {
                rep.log_terms.insert(i as u64 + 1, *t);
                rep.data.insert(i as u64 + 1, (*k, d.clone()));
            }
        }
        rep.durable_terms = rep.log_terms.clone();
        rep.durable = durable.clone();
        // A spare added empty rejoins until it caught up: it learns the group from the
        // leader's snapshot.
        let started = if rep.joining {
            Replica::start_joining(&rep.config, &durable)
        } else {
            Replica::start(&rep.config, &durable)
        };
        let replica = match started {
            Ok(replica) => replica,
            Err(e) => return self.fail(format!("replica {} could not start: {e}", r + 1)),
        };
        let config = DirectoryConfig {
            address: Address::new(DIRECTORY_NODE, 0, 0),
            retry_period: self.options.directory_retry,
            limits: self.options.limits.directory(self.options.retry_batch),
        };
        let mut node = ReplicatedDirectory::new(replica, config, ActorSources);
        node.observe_steps();
        rep.node = Some(node);
        rep.log = Some(log);
        rep.committed_checked = 0;
        let life = rep.life;
        self.at(TICK, Ev::Tick(r, life));
        self.drive(r);
    }

    /// After every input of replica `r`: the checks on terms and the committed sequence, a
    /// start or end of serving, the steps it admitted and the effects it released.
    fn observe(&mut self, r: usize) {
        let Some(node) = self.reps[r].node.as_mut() else {
            return;
        };
        if let Some(why) = node.stopped() {
            let why = format!("replica {} stopped: {why}", r + 1);
            return self.fail(why);
        }
        let (term, role) = (node.replica().term(), node.replica().role());
        let commit = node.replica().commit().min(node.applied());
        let serving = node.serving_term();
        let admitted = node.take_admitted();
        let released = node.take_effects();
        if term < self.durable_term[r] {
            let made = self.durable_term[r];
            return self.fail(format!(
                "replica {} is at term {term} after making term {made} durable",
                r + 1
            ));
        }
        if role == Role::Leader {
            match self.leaders.get(&term) {
                Some(&other) if other != r => {
                    return self.fail(format!(
                        "replicas {} and {} both lead term {term}",
                        other + 1,
                        r + 1
                    ));
                }
                Some(_) => {}
                None => {
                    self.leaders.insert(term, r);
                    self.checker.coverage.hit("replicas.election");
                }
            }
        }
        self.check_committed(r, commit);
        if self.reps[r].serving != serving {
            self.reps[r].serving = serving;
            self.reps[r].held.clear();
            if let Some(term) = serving {
                let effects = admitted
                    .iter()
                    .find(|a| a.recovery)
                    .map(|a| a.effects.clone())
                    .unwrap_or_default();
                self.serving_started(r, term, &effects);
            }
        }
        self.hold(r, &admitted);
        for effect in released {
            self.release(r, effect);
        }
        self.side_release(r);
    }

    /// The replicas never disagree about a committed index (nothing committed is lost or
    /// changed).
    fn check_committed(&mut self, r: usize, commit: u64) {
        let from = self.reps[r].committed_checked + 1;
        for index in from..=commit {
            let (Some(&term), Some((kind, data))) = (
                self.reps[r].log_terms.get(&index),
                self.reps[r].data.get(&index),
            ) else {
                return self.fail(format!(
                    "replica {} applied index {index} but its log lacks it",
                    r + 1
                ));
            };
            let i = index as usize - 1;
            if let Some((t, k, d)) = self.committed.get(i) {
                if *t != term || k != kind || d != data {
                    return self.fail(format!(
                        "committed: replica {} holds index {index} of term {term}, but term {t}'s entry was committed there",
                        r + 1
                    ));
                }
            } else {
                let (kind, data) = (*kind, data.clone());
                if kind != EntryKind::Normal {
                    self.committed_change(index, term, kind, &data);
                }
                self.committed.push((term, kind, data));
            }
        }
        self.reps[r].committed_checked = self.reps[r].committed_checked.max(commit);
    }

    /// Replica `r` starts serving `term`: if it is the highest term yet, the model rolls back
    /// to the steps its log holds below its term's first entry (all committed) and recovers
    /// at the term; a lower term's leader is stale, and the model never follows it.
    fn serving_started(&mut self, r: usize, term: u64, effects: &[Effect]) {
        self.checker.coverage.hit("replicas.serving");
        if term <= self.model_term {
            self.checker.coverage.hit("replicas.stale_leader_served");
            return;
        }
        let rep = &self.reps[r];
        let node = rep.node.as_ref().expect("running");
        let first = node.applied();
        let survived = self
            .journal
            .iter()
            .rev()
            .find(|&&(_, t, index)| {
                index.is_some_and(|i| i < first && rep.log_terms.get(&i) == Some(&t))
            })
            .map_or(0, |&(s, _, _)| s);
        let dropped = self
            .journal
            .iter()
            .filter(|&&(s, _, i)| s > survived && i.is_some())
            .count();
        if dropped > 0 {
            self.checker
                .coverage
                .hit("replicas.uncommitted_steps_dropped");
        }
        self.journal.retain(|&(s, _, _)| s <= survived);
        self.checker.directory_crashed(survived);
        self.model_term = term;
        self.step += 1;
        let step = self.step;
        let dir = node.directory().expect("serving");
        self.checker.directory_recovered_in_epoch(
            self.now,
            step,
            effects,
            dir,
            AuthorityEpoch(term),
        );
        let index = node.replica().last_index();
        self.journal.push((step, term, Some(index)));
    }

    /// An input for the directory of replica `r` (a host's frame or its retry timer).
    fn directory_input(&mut self, r: usize, input: DirInput) {
        let now = self.now;
        let Some(node) = self.reps[r].node.as_mut() else {
            return;
        };
        let result = match &input {
            DirInput::Message(m) => node.handle_message(now, m.clone()),
            DirInput::Timer => node.handle_timer(now, Timer::DirectoryRetry),
            DirInput::Route { target, routable } => node.handle_route(now, *target, *routable),
        };
        match result {
            Ok(()) => {}
            Err(NotServing::Refused(e)) => {
                return self.fail(format!("directory refused an input it should accept: {e}"));
            }
            Err(NotServing::Busy) => {
                self.checker.coverage.hit("replicas.busy");
                return;
            }
            Err(_) => return self.drive(r),
        }
        self.stats.directory_steps += 1;
        let admitted = node.take_admitted();
        let effects = admitted
            .last()
            .map(|a| a.effects.clone())
            .unwrap_or_default();
        let term = node.serving_term().expect("a step is taken while serving");
        if term == self.model_term {
            self.step += 1;
            let step = self.step;
            let index = admitted.last().and_then(|a| a.index);
            self.journal.push((step, term, index));
            let dir = node.directory().expect("serving");
            self.checker
                .directory_step(now, step, &input, &effects, dir);
        } else {
            self.checker.coverage.hit("replicas.stale_leader_step");
        }
        self.hold(r, &admitted);
        self.drive(r);
    }

    /// An effect the directory of replica `r` let go: its step's entry must be durable on a
    /// quorum of disks (restated from the disks' account, never asked of the engine).
    fn release(&mut self, r: usize, effect: Effect) {
        let Some(front) = self.reps[r].held.front_mut() else {
            return self.fail(format!(
                "replica {} released {effect:?}, which no step admitted",
                r + 1
            ));
        };
        let (term, index, applied, read) = (front.0, front.1, front.2, front.4);
        front.3 -= 1;
        if front.3 == 0 {
            self.reps[r].held.pop_front();
        }
        let answers = matches!(effect, Effect::Send { .. });
        if answers && index.is_none() {
            let Some((since, before)) = read else {
                return self.fail(format!(
                    "replica {} released {effect:?} from a step that proposed nothing",
                    r + 1
                ));
            };
            if let Err(why) = self.confirmed_after(r, term, since, applied) {
                return self.fail(format!(
                    "read: replica {} released {effect:?} of term {term}, {why}",
                    r + 1
                ));
            }
            // What it read must not be taken back: the steps before it are committed.
            if let Some((before, then)) = before
                && let Err(why) = self.durable_on_quorum(before, term, then)
            {
                return self.fail(format!(
                    "read: replica {} released {effect:?} before entry {before} of term \
                     {term}, admitted before it, committed: {why}",
                    r + 1
                ));
            }
            self.checker.coverage.hit("replicas.read_confirmed");
        }
        if let (true, Some(index)) = (answers, index)
            && let Err(why) = self.durable_on_quorum(index, term, applied)
        {
            return self.fail(format!(
                "commit: replica {} released {effect:?} for entry {index} of term {term}, {why}",
                r + 1
            ));
        }
        match effect {
            Effect::Send { to, message } => {
                if let Message::Reply(reply) = &message
                    && reply.epoch != AuthorityEpoch(term)
                {
                    return self.fail(format!(
                        "epoch: replica {} released a reply of epoch {} in term {term}",
                        r + 1,
                        reply.epoch
                    ));
                }
                self.checker.released(self.now, to, &message);
                // To the host's connection, behind what waits for the log (the hosts' side).
                let _ = self.reps[r]
                    .side
                    .effects(vec![Effect::Send { to, message }]);
            }
            Effect::SetTimer { at, .. } => {
                let rep = &mut self.reps[r];
                rep.timer_arming += 1;
                let (life, arming) = (rep.life, rep.timer_arming);
                let d = at.saturating_since(self.now);
                self.at(d, Ev::DirTimer(r, life, arming));
            }
            Effect::CancelTimer { .. } => self.reps[r].timer_arming += 1,
            watch @ (Effect::WatchRoute { .. } | Effect::UnwatchRoute { .. }) => {
                let _ = self.reps[r].side.effects(vec![watch]);
            }
            Effect::Persist(_) => self.fail("a Persist was released".into()),
        }
    }

    // ------------------------------------------------------------------ membership

    /// The slots the world runs (see [`Rep::member`]).
    fn members(&self) -> Vec<usize> {
        (0..SLOTS).filter(|&r| self.reps[r].member).collect()
    }

    /// The replica that serves, if exactly one does, it is not cut off, and it leads the
    /// highest term yet (a cut-off or outdated leader is never asked to change the group).
    fn serving_replica(&self) -> Option<usize> {
        let top = self.leaders.keys().next_back().copied()?;
        let mut serving = (0..SLOTS).filter(|&r| {
            self.reps[r]
                .node
                .as_ref()
                .is_some_and(|n| n.serving_term().is_some())
        });
        let r = serving.next()?;
        if serving.next().is_some() || self.reps[r].cut.is_some() {
            return None;
        }
        let term = self.reps[r].node.as_ref().and_then(Node::serving_term);
        (term == Some(top)).then_some(r)
    }

    /// Asks the serving replica to add the two slots that are not voters (started empty), or
    /// to remove two voters (any: the leader may be one of them), unless a change is pending.
    fn change_membership(&mut self) {
        let Some(leader) = self.serving_replica() else {
            return;
        };
        let node = self.reps[leader].node.as_ref().expect("serving");
        if !node.replica().conf().voters_outgoing.is_empty() {
            return;
        }
        let term = node.serving_term().expect("serving");
        let mut voters = node.voters();
        let outside: Vec<usize> = (0..SLOTS)
            .filter(|&r| !voters.contains(&(r as u64 + 1)))
            .collect();
        let changes: Vec<MemberChange> = if voters.len() == FIRST_VOTERS {
            outside
                .iter()
                .map(|&r| MemberChange::AddVoter(r as u64 + 1))
                .collect()
        } else if voters.len() == SLOTS {
            let first = voters.remove(self.faults.below(voters.len() as u64) as usize);
            let second = voters.remove(self.faults.below(voters.len() as u64) as usize);
            vec![
                MemberChange::RemoveVoter(first),
                MemberChange::RemoveVoter(second),
            ]
        } else {
            return;
        };
        let node = self.reps[leader].node.as_mut().expect("serving");
        match node.change_replicas(&changes, &[]) {
            Ok(index) => {
                self.checker.coverage.hit("replicas.change_proposed");
                let adds = matches!(changes[0], MemberChange::AddVoter(_));
                self.proposals.insert((term, index), (changes, leader));
                if adds {
                    // The replicas added start empty, as replicas that never existed (a
                    // removed replica's old disk went with it).
                    for r in outside {
                        self.wipe(r);
                        self.restart(r);
                    }
                }
            }
            Err(_) => self.checker.coverage.hit("replicas.change_refused"),
        }
        self.drive(leader);
    }

    /// The operator's leadership transfer: the serving replica hands over to the first other
    /// voter (by id) that it takes, as `dataplane-node replicas transfer-leader` asks. A voter
    /// behind the leader's log is refused; a transferee cut off or paused meanwhile makes the
    /// engine abandon the transfer, and the leader resigns.
    fn transfer_leadership(&mut self) {
        let Some(leader) = self.serving_replica() else {
            return;
        };
        let node = self.reps[leader].node.as_mut().expect("serving");
        let me = leader as u64 + 1;
        for to in node.voters().into_iter().filter(|&v| v != me) {
            match node.transfer_leader(to) {
                Ok(()) => {
                    self.checker.coverage.hit("replicas.transfer_started");
                    break;
                }
                Err(_) => self.checker.coverage.hit("replicas.transfer_refused"),
            }
        }
        self.drive(leader);
    }

    /// Slot `r` becomes a replica that never existed, on an empty disk, added (it rejoins).
    fn wipe(&mut self, r: usize) {
        self.break_conns(r);
        let fs = SimFs::new(SimRng::new(self.storage.next_u64(), Stream::Storage));
        let key = self.key();
        let old = &self.reps[r];
        let mut rep = Rep::new(old.config.clone(), fs, true, key);
        rep.life = old.life + 1;
        rep.timer_arming = old.timer_arming;
        rep.cut = old.cut;
        rep.joining = true;
        self.reps[r] = rep;
        self.durable_term[r] = 0;
    }

    /// Stops slot `r`, whose removal the serving replica applied: it runs no more until it
    /// is added again (empty).
    fn stop(&mut self, r: usize) {
        if self.reps[r].paused.is_some() {
            self.resume(r);
        }
        self.break_conns(r);
        let key = self.key();
        let rep = &mut self.reps[r];
        rep.member = false;
        rep.side = HostSide::new(side_config(key));
        rep.node = None;
        rep.log = None;
        rep.inflight = None;
        rep.crash_after_sync = false;
        rep.serving = None;
        rep.held.clear();
        rep.writing.clear();
        rep.writing_term = 0;
        rep.writing_snapshot = None;
        rep.life += 1;
        self.checker.coverage.hit("replicas.removed_stopped");
    }

    /// After every event: a replica added empty that caught up is a voter like the others;
    /// the replicas whose removal the serving replica applied (no joint change pending) stop.
    fn follow_membership(&mut self) {
        let mut changed = false;
        for rep in &mut self.reps {
            if rep.joining && rep.node.as_ref().is_some_and(|n| !n.replica().is_joining()) {
                rep.joining = false;
                changed = true;
            }
        }
        if changed {
            self.checker.coverage.hit("replicas.joined");
        }
        let Some(leader) = self.serving_replica() else {
            return;
        };
        let node = self.reps[leader].node.as_ref().expect("serving");
        let seen = (leader, node.replica().term(), node.applied());
        if seen == self.membership_seen && !changed {
            return;
        }
        self.membership_seen = seen;
        if !node.replica().conf().voters_outgoing.is_empty() {
            return;
        }
        let voters = node.voters();
        for r in 0..SLOTS {
            let rep = &self.reps[r];
            if rep.member && !rep.joining && !voters.contains(&(r as u64 + 1)) {
                self.stop(r);
            }
        }
    }

    /// A committed entry that changes the group, restated from what the world proposed: an
    /// entry it proposed through `change_replicas` enters a joint configuration (the voters
    /// it leaves: the voters before; its voters: those, changed); an empty one it did not
    /// propose is the engine's own, which leaves the joint configuration.
    fn committed_change(&mut self, index: u64, term: u64, kind: EntryKind, data: &[u8]) {
        let current = self.final_conf().clone();
        let proposal = self.proposals.get(&(term, index)).cloned();
        let next = match proposal {
            Some((changes, proposer)) if kind == EntryKind::ConfChangeV2 => {
                if !current.outgoing.is_empty() {
                    return self.fail(format!(
                        "membership: the change at entry {index} of term {term} committed during a joint configuration ({current})"
                    ));
                }
                let mut incoming = current.incoming.clone();
                let mut hits = Vec::new();
                for change in changes {
                    match change {
                        MemberChange::AddVoter(id) => {
                            incoming.push(id);
                            hits.push("replicas.member_added");
                        }
                        MemberChange::RemoveVoter(id) => {
                            incoming.retain(|&v| v != id);
                            hits.push("replicas.member_removed");
                            if id == proposer as u64 + 1 {
                                hits.push("replicas.leader_removed");
                            }
                        }
                    }
                }
                incoming.sort_unstable();
                incoming.dedup();
                for hit in hits {
                    self.checker.coverage.hit(hit);
                }
                Conf {
                    incoming,
                    outgoing: current.incoming,
                }
            }
            None if kind == EntryKind::ConfChangeV2 && data.is_empty() => {
                if current.outgoing.is_empty() {
                    return self.fail(format!(
                        "membership: entry {index} of term {term} leaves a joint configuration outside one ({current})"
                    ));
                }
                self.checker.coverage.hit("replicas.joint_left");
                Conf {
                    incoming: current.incoming,
                    outgoing: Vec::new(),
                }
            }
            _ => {
                return self.fail(format!(
                    "membership: entry {index} of term {term} ({kind:?}) changes the group, but nobody proposed that change"
                ));
            }
        };
        self.confs.push((index, next));
    }

    /// The configuration the committed log is in at its end.
    fn final_conf(&self) -> &Conf {
        self.confs.last().map_or(&self.first_conf, |(_, c)| c)
    }

    /// The configuration in force once the committed entries up to `index` are applied.
    fn conf_at(&self, index: u64) -> &Conf {
        self.confs
            .iter()
            .rev()
            .find(|(i, _)| *i <= index)
            .map_or(&self.first_conf, |(_, c)| c)
    }

    /// Whether entry `index` of `term` is durable (from what the disks synced, never from
    /// the engine) on a quorum of a configuration its leader may have counted it in. A leader
    /// counts a quorum in the configuration it has applied: when it commits the entry, that
    /// is the one in force at `applied` (what it had applied when it admitted the step), or
    /// one that a committed change between there and the entry puts in force (at most one:
    /// one change at a time).
    fn durable_on_quorum(&mut self, index: u64, term: u64, applied: u64) -> Result<(), String> {
        let holding: Vec<u64> = (0..SLOTS)
            .filter(|&r| self.reps[r].durable_terms.get(&index) == Some(&term))
            .map(|r| r as u64 + 1)
            .collect();
        let mut confs = vec![self.conf_at(applied)];
        confs.extend(
            self.confs
                .iter()
                .filter(|(i, _)| *i > applied && *i < index)
                .map(|(_, c)| c),
        );
        if confs[0].quorum(&holding) {
            return Ok(());
        }
        if confs.iter().any(|c| c.quorum(&holding)) {
            // Committed in the configuration a change put in force after the step.
            self.checker.coverage.hit("replicas.quorum_of_next_conf");
            return Ok(());
        }
        let confs: Vec<String> = confs.iter().map(ToString::to_string).collect();
        Err(format!(
            "durable on {} disks (replicas {holding:?}), no quorum of {}",
            holding.len(),
            confs.join(" nor of ")
        ))
    }

    /// Whether a quorum confirmed that replica `r` still led `term` after `since`: it and the
    /// replicas whose answers of that term it took, sent at or after `since`, in the
    /// configuration in force at `applied` or one a committed change put in force since.
    /// (Once a quorum answered at the term after the read came, no later term had a leader
    /// before the first of those answers: it would have needed one of their votes.)
    fn confirmed_after(
        &mut self,
        r: usize,
        term: u64,
        since: Instant,
        applied: u64,
    ) -> Result<(), String> {
        let mut answered = vec![r as u64 + 1];
        answered.extend(
            self.reps[r]
                .acks
                .iter()
                .filter(|((_, t), at)| *t == term && **at >= since)
                .map(|((from, _), _)| *from),
        );
        let mut confs = vec![self.conf_at(applied)];
        confs.extend(
            self.confs
                .iter()
                .filter(|(i, _)| *i > applied)
                .map(|(_, c)| c),
        );
        if confs.iter().any(|c| c.quorum(&answered)) {
            return Ok(());
        }
        let confs: Vec<String> = confs.iter().map(ToString::to_string).collect();
        Err(format!(
            "confirmed by replicas {answered:?} after the read came, no quorum of {}",
            confs.join(" nor of ")
        ))
    }

    // ------------------------------------------------------------------ pauses

    /// The cluster key every node of the run has.
    fn key(&self) -> ClusterKey {
        self.cluster_key
    }

    /// A replica that runs pauses (the leader half the time), for 0.5 to 20 s.
    fn pause(&mut self) {
        let running: Vec<usize> = (0..SLOTS)
            .filter(|&r| self.reps[r].node.is_some() && self.reps[r].paused.is_none())
            .collect();
        if running.is_empty() {
            return;
        }
        let leader = running.iter().copied().find(|&r| {
            self.reps[r]
                .node
                .as_ref()
                .is_some_and(|n| n.serving_term().is_some())
        });
        let r = match leader {
            Some(l) if self.stall_rng.below(2) == 0 => l,
            _ => running[self.stall_rng.below(running.len() as u64) as usize],
        };
        let length = Duration::from_millis(PAUSE_MIN_MS + self.stall_rng.below(PAUSE_SPREAD_MS));
        self.episodes += 1;
        let episode = self.episodes;
        self.reps[r].paused = Some((episode, self.now.saturating_add(length)));
        self.checker.coverage.hit(if leader == Some(r) {
            "replicas.leader_paused"
        } else {
            "replicas.paused"
        });
        self.silence_checks(r, episode);
        self.at(length, Ev::Resume(r, episode));
    }

    /// Replica `r` runs again: it takes what it was sent meanwhile, in order.
    fn resume(&mut self, r: usize) {
        self.reps[r].paused = None;
        for ev in std::mem::take(&mut self.reps[r].deferred) {
            self.at(Duration::ZERO, ev);
        }
    }

    /// Silent cut `generation` of replica `r` ends: what it held arrives now, in order.
    fn end_silent_cut(&mut self, r: usize, generation: u64) {
        let held = std::mem::take(&mut self.reps[r].held_frames);
        for (g, conn, to_replica, bytes) in held {
            if g == generation {
                self.at(
                    Duration::ZERO,
                    Ev::ConnFrame {
                        conn,
                        to_replica,
                        bytes,
                    },
                );
            } else {
                self.reps[r].held_frames.push((g, conn, to_replica, bytes));
            }
        }
    }

    fn proxy_input(&mut self, h: usize, input: ProxyInput) {
        let now = self.now;
        let proxy = &mut self.hosts[h].proxy;
        let result = match &input {
            ProxyInput::Message(m) => proxy.handle_message(now, m.clone(), &mut self.outbox),
            ProxyInput::Discovery(found) => {
                proxy.handle_discovery(now, *found, &mut self.outbox);
                Ok(())
            }
            ProxyInput::Timer => proxy.handle_timer(now, Timer::ProxyRetry, &mut self.outbox),
        };
        if let Err(e) = result {
            return self.fail(format!("a proxy refused an input it should accept: {e}"));
        }
        let effects = self.outbox.take();
        self.checker
            .proxy_step(now, (h, 1, 1), &input, &effects, &self.hosts[h].proxy);
        self.proxy_effects(h, effects);
    }

    fn proxy_effects(&mut self, h: usize, effects: Vec<Effect>) {
        let now = self.now;
        let (node, from) = (self.hosts[h].node, Address::new(self.hosts[h].node, 1, 500));
        for effect in effects {
            match effect {
                Effect::Send { to, message } if to.node == node => {
                    if let Message::Reply(reply) = message {
                        self.client_reply(h, to, reply);
                    }
                }
                Effect::Send { message, .. } => self.host_send(h, from, message),
                Effect::SetTimer { at, .. } => {
                    self.hosts[h].proxy_arming += 1;
                    let arming = self.hosts[h].proxy_arming;
                    self.at(at.saturating_since(now), Ev::ProxyTimer(h, arming));
                }
                Effect::CancelTimer { .. } => self.hosts[h].proxy_arming += 1,
                other => self.fail(format!("a proxy emitted an unexpected effect {other:?}")),
            }
        }
    }

    // ------------------------------------------------------------------ callers

    fn client_address(&self, h: usize, c: usize) -> Address {
        Address::new(self.hosts[h].node, 1, 1 + c as u64)
    }

    fn pick_path(&mut self) -> DataPath {
        let paths = &self.options.paths;
        paths[self.work.below(paths.len() as u64) as usize].clone()
    }

    fn client_step(&mut self, h: usize, c: usize) {
        let client = &self.hosts[h].clients[c];
        if client.calling.is_some() || client.quiet {
            return;
        }
        let address = self.client_address(h, c);
        let issuer = Issuer::of(address, c as u8 + 1);
        let op = issuer.op(self.hosts[h].clients[c].next_op);
        let kind = self.work.below(10);
        let path = self.pick_path();
        let request = match kind {
            0..=3 => {
                let n = self.hosts[h].clients[c].next_op;
                let source = Address::new(self.hosts[h].node, 1, 1_000 + 100_000 * c as u64 + n);
                DirectoryRequest::Register {
                    path,
                    source,
                    source_node: source.node,
                    length: 10,
                    recovery: SourceRecovery::Actor {
                        actor: source,
                        node: source.node,
                        owner: None,
                    },
                    operation: op,
                    reservation: None,
                }
            }
            4 => DirectoryRequest::Unregister {
                path,
                expected_revision: None,
                operation: op,
            },
            5 => {
                let destination = self.pick_path();
                DirectoryRequest::Rename {
                    source: path,
                    destination,
                    replace: self.work.below(2) == 0,
                    operation: op,
                }
            }
            6..=7 => DirectoryRequest::Lookup { path },
            _ => DirectoryRequest::Resolve { path },
        };
        if request.operation().is_some() {
            self.hosts[h].clients[c].next_op += 1;
        }
        self.sent_after.insert((h, c), self.acked_ops.clone());
        self.call(h, c, request);
    }

    fn call(&mut self, h: usize, c: usize, request: DirectoryRequest) {
        let reply_to = self.client_address(h, c);
        let client = &mut self.hosts[h].clients[c];
        let request_id = RequestId(client.next_request);
        client.next_request += 1;
        client.calling = Some((request_id, request.clone(), 0));
        let call = DirectoryCall {
            request_id,
            reply_to,
            request,
        };
        self.proxy_input(h, ProxyInput::Message(Message::ProxyCall(call)));
    }

    fn client_reply(&mut self, h: usize, to: Address, reply: dataplane_core::wire::DirectoryReply) {
        let Some(c) = (0..self.hosts[h].clients.len()).find(|&c| self.client_address(h, c) == to)
        else {
            return;
        };
        let Some((id, request, _)) = self.hosts[h].clients[c].calling.clone() else {
            return;
        };
        if id != reply.request_id {
            return;
        }
        self.hosts[h].clients[c].calling = None;
        use dataplane_core::error::NamespaceError as E;
        let retry = matches!(
            reply.body.err(),
            Some(E::DirectoryUnavailable(_) | E::Timeout)
        );
        if retry && request.operation().is_some() {
            // The same operation again, until a definitive answer.
            self.checker.coverage.hit("replicas.client_retry");
            return self.call(h, c, request);
        }
        if let Some(op) = request.operation()
            && matches!(
                reply.body,
                ReplyBody::Registered(Ok(_))
                    | ReplyBody::Unregistered(Ok(_))
                    | ReplyBody::Renamed(Ok(_))
            )
        {
            let after = self.sent_after.remove(&(h, c)).unwrap_or_default();
            self.acked.push(Acked { op, after });
            self.acked_ops.push(op);
            self.checker.coverage.hit("replicas.mutation_acknowledged");
        }
        if !self.hosts[h].clients[c].quiet {
            let think = Duration::from_millis(5 + self.work.below(100));
            self.at(think, Ev::Client(h, c));
        }
    }

    // ------------------------------------------------------------------ the end

    fn at_end(&mut self) {
        let unanswered: Vec<String> = self
            .hosts
            .iter()
            .enumerate()
            .flat_map(|(h, host)| {
                host.clients
                    .iter()
                    .enumerate()
                    .filter_map(move |(c, client)| {
                        client
                            .calling
                            .as_ref()
                            .map(|(_, r, _)| format!("host {} client {c}: {r:?}", h + 1))
                    })
            })
            .collect();
        if !unanswered.is_empty() {
            let states: Vec<String> = self.reps.iter().map(|r| format!("{:?}", r.node)).collect();
            return self.fail(format!(
                "liveness: {} calls unanswered {SETTLE} after the heal: {unanswered:?}; replicas {states:?}",
                unanswered.len()
            ));
        }
        // Every acknowledged mutation is in the committed sequence, after every mutation
        // acknowledged before it was sent.
        let mut position: BTreeMap<OperationId, usize> = BTreeMap::new();
        for (i, (_, kind, data)) in self.committed.iter().enumerate() {
            if *kind != EntryKind::Normal {
                continue;
            }
            let Ok(records) = postcard::from_bytes::<Vec<LogRecord>>(data) else {
                continue;
            };
            for record in records {
                if let LogRecord::Committed { operation, .. } = record {
                    position.entry(operation).or_insert(i + 1);
                }
            }
        }
        for acked in &self.acked {
            let Some(&at) = position.get(&acked.op) else {
                let op = acked.op;
                return self.fail(format!(
                    "lost: acknowledged mutation {op} is not in the committed log"
                ));
            };
            for before in &acked.after {
                if position.get(before).is_none_or(|&b| b >= at) {
                    let op = acked.op;
                    return self.fail(format!(
                        "reordered: mutation {op} (index {at}) was sent after {before} was acknowledged, but {before} is at {:?}",
                        position.get(before)
                    ));
                }
            }
        }
        // The voters of the configuration the committed log ends with that applied everything
        // (a majority of them at least) agree on the state.
        let applied = self.committed.len() as u64;
        let conf = self.final_conf().clone();
        let states: Vec<Vec<LogRecord>> = conf
            .voters()
            .iter()
            .filter_map(|&id| self.reps[id as usize - 1].node.as_ref())
            .filter(|n| n.applied() == applied)
            .map(|n| n.committed().snapshot_records())
            .collect();
        if states.len() * 2 <= conf.incoming.len() {
            return self.fail(format!(
                "liveness: {} voters applied the whole committed log after the heal ({conf})",
                states.len()
            ));
        }
        if states.windows(2).any(|w| w[0] != w[1]) {
            self.fail("the replicas' committed states differ after the heal".into());
        }
    }

    /// What the run did, as the swarm prints it.
    pub fn coverage(&self) -> &Coverage {
        &self.checker.coverage
    }
}

//! A directory node that is one replica of a replicated directory (issue 19): the directory
//! survives the loss of a machine.
//!
//! `dataplane-node directory --replica-id N --replicas 1=ADDR,2=ADDR,3=ADDR` runs replica `N`
//! of a group whose replicas talk to one another at those addresses (each listens at its own),
//! while hosts connect at `--listen` as to a single directory. The machine is the replica
//! crate's [`ReplicatedDirectory`]: every replica applies the committed log; the leader serves.
//!
//! One driver thread owns everything ([`Reactor`]), as in the single directory node
//! (`dirnode.rs`). Each turn of its loop handles the frames that arrived, ticks the engine
//! every [`TICK`], then takes the engine's rounds: a round's messages that may leave before the
//! disk go at once, its entries and hard state are appended to the replica's own log and
//! synced **once** ([`ReplicaLog::write`], core's storage protocol on real files), and only
//! then leave the messages that waited for the disk (votes, append acknowledgements). A reply
//! to a host leaves once its entry is committed by a quorum and applied here.
//!
//! **Hosts.** What hosts and clients meet here is the replica crate's [`HostSide`], which the
//! simulator's replicated mode runs too: only the replica that serves admits hosts (any other
//! closes a host's connection as soon as it is accepted, and a host given every replica's
//! address, `--directory A,B,C`, moves on to the next); a replica that starts serving begins
//! with no host connection, the committed membership, and the term as its epoch and as its
//! address's incarnation (to a host, a failover is a directory restart, which it already
//! survives); one that stops serving closes every host connection. A host's identity is
//! decided as in the single node; the change is proposed to the log and everything after it
//! (the `Welcome` first, directory frames to hosts too) waits, in order, until that entry is
//! applied, so no host hears of an identity a failover could forget. This driver does the IO
//! it asks for ([`HostIo`]) and logs.
//!
//! **Peers.** Each replica connects to every other one and sends its messages on that
//! connection only; it receives on the connections the others made. The acceptor sends a fresh
//! nonce, the connector answers with who it is and, with a cluster key, a proof over that nonce
//! (core's [`connector_proof`]): nothing from a connection reaches the engine before that, and
//! then only messages from the replica it proved to be. Frames are bounded by the nodes' frame
//! limit, queues by [`PEER_QUEUE_BYTES`] (a message that does not fit is dropped: the engine
//! sends again), pending peer connections by [`PEER_PENDING_MAX`] and the admission deadline.
//!
//! **Failures.** A failed append or sync, or a committed entry that does not apply, stops the
//! node (fail-stop, exit 70): restarted, it reads its log and catches up from the leader.
//!
//! Not yet: metrics, log compaction below the whole log (the replica's log is rewritten, never
//! cut: [`ReplicaLog`]), membership changes of the group, read-index reads.

use std::collections::{BTreeMap, BTreeSet};

use dataplane_core::admission::{
    ADMISSION_DEADLINE, Nonce, PENDING_CONNECTIONS_MAX, Proof, connector_proof, proofs_match,
};
use dataplane_core::conns::DirHeard;
use dataplane_core::directory::{ActorSources, DirectoryConfig};
use dataplane_core::effect::Timer;
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::membership::Admitted;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::decode_value;
use dataplane_replica::{
    HostIo, HostSide, HostSideConfig, MemberChange, NotServing, Replica, ReplicaConfig,
    ReplicaError, ReplicaId, ReplicatedDirectory, Serving, WireMessage,
};
use serde::{Deserialize, Serialize};
use tracing::{debug, error, info, warn};

use crate::dirnode::{DirectoryOptions, NodeError, TRANSIENT_NODE_BASE};
use crate::driver::{Clock, write_state};
use crate::log::{LogError, LogOptions};
use crate::metrics::{GaugeClock, Refusal, ReplicaMetrics, gauge_value};
use crate::net::{
    ClusterKey, ConnId, Limits, ListenerId, NetEvent, Outgoing, Overflow, Performed, Reactor,
    fresh_nonce, perform_conn_action,
};
use crate::replcontrol::{
    CHANGE_REPLICAS_MAX, REPLICA_CONTROL_FRAME_MAX, REPLICA_CONTROL_VERSION, REPLICA_CONTROLS_MAX,
    ReplicaCommand, ReplicaReply, ReplicaRequest, ReplicaStatus, replica_control_path,
};
use crate::replica_log::{ReplicaLog, ReplicaLogError};
use crate::resolve::{Addresses, Resolver, Started, literal, system_lookup};

/// One tick of the engine's clock.
pub const TICK: std::time::Duration = std::time::Duration::from_millis(100);
/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 2;
/// Ticks without a leader before the first replica of the list campaigns; each next one waits
/// [`ELECTION_STEP_TICKS`] more (pinned apart, so that two never split the vote for ever). A
/// follower refuses to vote while it heard from a leader within its own timeout (the engine's
/// `check_quorum` lease), so a failover takes about the longest timeout among the survivors:
/// 1.0–1.2 s for three replicas, plus a round trip.
pub const ELECTION_TICKS: usize = 10;
/// See [`ELECTION_TICKS`].
pub const ELECTION_STEP_TICKS: usize = 1;
/// Most bytes queued toward one peer replica (a message that does not fit is dropped).
pub const PEER_QUEUE_BYTES: usize = 16 << 20;
/// Most peer connections waiting for their hello.
pub const PEER_PENDING_MAX: usize = 16;
/// How long after a failed connection to a peer replica the next attempt starts.
/// Threads looking up the other replicas' names (the operator's).
const PEER_LOOKUP_THREADS: usize = 2;
const PEER_RETRY: Duration = Duration::from_millis(200);
/// Most admitted host and client connections.
const ADMITTED_CONNECTIONS_MAX: usize = 4096;
/// The longest the driver waits for an event.
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// The replica's log, inside the data directory.
const LOG_DIR: &str = "replica";
/// Written once the log was created (see `dirnode.rs`): a data directory with the mark and
/// no log is refused, not started empty.
const CREATED_MARK: &str = "created";
/// Present while the replica rejoins as a non-voter ([`Replica::start_joining`]): written
/// before it starts joining, removed once it caught up. It outlives restarts, so a replica
/// that crashes while catching up, or stopped because it lost acknowledged entries, joins
/// again on its next start without an operator's flag (and a stale `--join` does not).
const REJOIN_MARK: &str = "rejoining";
/// What a peer's hello proves, besides the nonce: the protocol and both ends (v2: the hello
/// carries where the sender takes hosts; a v1 replica cannot join a v2 group).
const PEER_HELLO_LABEL: &[u8] = b"dataplane replica hello v2";

/// How a replica of the directory runs.
#[derive(Clone, Debug)]
pub struct ReplicaOptions {
    /// What it shares with a single directory node: where hosts connect, the data directory,
    /// the retry tick, the cluster key, `--repair-log`, `--metrics-listen` ([`ReplicaMetrics`]).
    pub directory: DirectoryOptions,
    /// This replica (one of `replicas`).
    pub id: ReplicaId,
    /// Every replica of the group, with the address where it listens for the others.
    pub replicas: Vec<(ReplicaId, String)>,
    /// It rejoins a group that went on while it lost its disk ([`Replica::start_joining`]):
    /// it neither votes nor campaigns until it caught up. Never for a new group.
    pub join: bool,
    /// Entries applied between two snapshots ([`ReplicaConfig::snapshot_every`]); a
    /// compaction keeps half as many entries before its snapshot, at most 5,000.
    pub snapshot_every: u64,
}

impl ReplicaOptions {
    /// The engine's configuration for this replica: the voters, and an election timeout
    /// pinned by the replica's place in the list.
    pub fn replica_config(&self) -> Result<ReplicaConfig, String> {
        let mut ids = BTreeSet::new();
        for (id, _) in &self.replicas {
            if *id == 0 {
                return Err("replica ids start at 1".to_owned());
            }
            if !ids.insert(*id) {
                return Err(format!("replica {id} is listed twice"));
            }
        }
        let place = self
            .replicas
            .iter()
            .position(|(id, _)| *id == self.id)
            .ok_or_else(|| format!("replica {} is not in --replicas", self.id))?;
        let mut config = ReplicaConfig::new(
            self.id,
            ids.into_iter().collect(),
            ELECTION_TICKS + ELECTION_STEP_TICKS * place,
            HEARTBEAT_TICKS,
        );
        config.snapshot_every = self.snapshot_every;
        config.snapshot_keep = config.snapshot_keep.min(self.snapshot_every / 2);
        Ok(config)
    }

    /// Where this replica listens for the others.
    fn peer_listen(&self) -> &str {
        self.replicas
            .iter()
            .find(|(id, _)| *id == self.id)
            .map_or("", |(_, a)| a.as_str())
    }
}

/// What travels between replicas.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum PeerFrame {
    /// The acceptor's nonce, the first frame on a peer connection.
    Challenge { nonce: Nonce },
    /// The connector: who it is, to whom, where it takes hosts (its `--listen`: what the
    /// others name when they tell a host who leads), and its proof over the nonce and all that.
    Hello {
        from: ReplicaId,
        to: ReplicaId,
        hosts: String,
        proof: Option<Proof>,
    },
    /// One engine message ([`WireMessage::encode`]).
    Raft(Vec<u8>),
}

impl Outgoing for PeerFrame {}

/// The bytes a peer's proof covers.
fn peer_hello(from: ReplicaId, to: ReplicaId, hosts: &str) -> Vec<u8> {
    let mut bytes = PEER_HELLO_LABEL.to_vec();
    bytes.extend_from_slice(&from.to_le_bytes());
    bytes.extend_from_slice(&to.to_le_bytes());
    bytes.extend_from_slice(hosts.as_bytes());
    bytes
}

/// Limits of a peer connection once its hello is through.
const fn peer_limits() -> Limits {
    Limits {
        frame_bytes: dataplane_core::limits::FRAME_BYTES_MAX,
        queue_bytes: PEER_QUEUE_BYTES,
        overflow: Overflow::Drop,
        pace: false,
    }
}

/// A control connection's bounds.
const CONTROL_LIMITS: Limits = Limits {
    frame_bytes: REPLICA_CONTROL_FRAME_MAX,
    queue_bytes: 1 << 20,
    overflow: Overflow::Close,
    pace: false,
};

/// The connection this replica sends on to one peer.
struct PeerOut {
    address: String,
    /// What `address` resolved to last, if it is a name (looked up off the driver thread at
    /// every attempt; the attempt goes to these, in turn, meanwhile).
    resolved: Addresses,
    conn: Option<ConnId>,
    /// The hello went out: messages may follow.
    up: bool,
    retry_at: Instant,
}

/// A connection another replica made.
struct PeerIn {
    nonce: Nonce,
    /// Who proved to be at the other end.
    from: Option<ReplicaId>,
    since: Instant,
}

struct ReplicaNode {
    clock: Clock,
    id: ReplicaId,
    key: Option<ClusterKey>,
    machine: ReplicatedDirectory<ActorSources>,
    log: ReplicaLog,
    net: Reactor,
    host_listener: ListenerId,
    peer_listener: ListenerId,
    next_tick: Instant,
    /// Still catching up after `--join` (logged once it is not, and its mark removed).
    joining: bool,
    /// The data directory's [`REJOIN_MARK`].
    rejoin_path: std::path::PathBuf,
    /// What hosts and clients meet here (the replica crate's, as the simulator runs it).
    hosts: HostSide,
    peers: BTreeMap<ReplicaId, PeerOut>,
    incoming: BTreeMap<ConnId, PeerIn>,
    /// The control socket (`DATA_DIR/control.sock`) and its open connections.
    control_listener: ListenerId,
    controls: crate::control::ControlConns,
    /// `--replicas`: where each replica listens, unless a committed change says otherwise.
    static_peers: BTreeMap<ReplicaId, String>,
    /// Peers whose refusal was logged at `info` since they last proved themselves (a peer
    /// with the wrong key retries every [`PEER_RETRY`]: later refusals go to `debug`); at most
    /// one per replica of the group, plus 0 for every stranger.
    refusals_logged: BTreeSet<ReplicaId>,
    /// The leader this replica last logged that it follows (`None`: none known), so that
    /// each change of leadership is one line.
    leader_logged: Option<ReplicaId>,
    /// What the hosts' side asked for, not yet done (a reused buffer).
    host_io: Vec<HostIo>,
    /// Where this replica takes hosts (`--listen`), and where each peer does, as its proven
    /// hello said: a replica that does not serve names the leader's to a host.
    host_listen: String,
    peer_hosts: BTreeMap<ReplicaId, String>,
    /// Peers' names looked up on threads of their own: a slow DNS must not stall the loop
    /// that keeps the leader's heartbeats going.
    resolver: Resolver<ReplicaId>,
    /// When a failed lookup was last logged.
    unresolved: crate::throttle::Throttle,
    /// With `--metrics-listen`: the metrics, and when the gauges are next read.
    metrics: Option<ReplicaMetrics>,
    gauges: GaugeClock,
}

/// Runs replica `options.id` of a replicated directory until it fails (it never returns `Ok`).
pub fn run_replica(options: &ReplicaOptions) -> Result<(), NodeError> {
    let io = |what: &str, e: std::io::Error| NodeError::Io(format!("{what}: {e}"));
    let config = options.replica_config().map_err(NodeError::Usage)?;
    let data_dir = &options.directory.data_dir;
    let created_path = data_dir.join(CREATED_MARK);
    let booted = match std::fs::metadata(&created_path) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io(&created_path.display().to_string(), e)),
    };
    // Ports it cannot have are usage errors found before the disk is touched: trial binds,
    // let go at once (the replica binds for good only after recovery, below).
    drop(crate::dirnode::bind(&options.directory.listen, "--listen")?);
    drop(crate::dirnode::bind(
        options.peer_listen(),
        "--replicas (this replica's entry)",
    )?);
    if !booted {
        std::fs::create_dir_all(data_dir).map_err(|e| io("data directory", e))?;
    }
    let log_options = LogOptions {
        create: !booted,
        repair: options.directory.repair_log,
        preallocate: crate::dirnode::LOG_PREALLOCATE_BYTES,
    };
    let (log, recovered) =
        ReplicaLog::open_with(&data_dir.join(LOG_DIR), log_options).map_err(|e| match e {
            ReplicaLogError::Log(e) if e.is_refusal() || matches!(e, LogError::Locked { .. }) => {
                NodeError::Refused(e)
            }
            ReplicaLogError::Log(e) => NodeError::Log(e),
            ReplicaLogError::Durable(e) => NodeError::Recovery(format!(
                "{} does not hold a replica's log: {e}",
                data_dir.join(LOG_DIR).display()
            )),
        })?;
    if let Some(cut) = &recovered.cut {
        warn!("{cut}");
    }
    if !booted {
        write_state(&created_path, &log.log().id().0).map_err(|e| io(CREATED_MARK, e))?;
    }
    // Whether it rejoins as a non-voter: `--join` on a data directory this start created; a
    // mark left by a start that had not caught up, or by a replica that found it had lost
    // acknowledged entries; or a repair that cut bytes of the log (entries it acknowledged may
    // be gone with them).
    let rejoin_path = data_dir.join(REJOIN_MARK);
    let marked = rejoin_path.exists();
    let repaired = recovered.cut_bytes > 0;
    if options.join && booted && !marked {
        warn!(
            data_dir = %data_dir.display(),
            "ignoring --join: the data directory holds this replica's log (a replica rejoins \
             only when it starts without one, or after it lost entries)"
        );
    }
    let rejoin = marked || (options.join && !booted) || repaired;
    if rejoin && !marked {
        write_state(&rejoin_path, &()).map_err(|e| io(REJOIN_MARK, e))?;
    }
    if rejoin {
        info!(
            repaired,
            resumed = marked,
            "rejoining: no vote and no campaign until this replica holds what the leader \
             committed"
        );
    }
    let replica = if rejoin {
        Replica::start_joining(&config, log.durable())
    } else {
        Replica::start(&config, log.durable())
    }
    .map_err(|e| NodeError::Recovery(e.to_string()))?;
    info!(
        entries = log.durable().entries.len(),
        term = log.durable().hard_state.term,
        commit = log.durable().hard_state.commit,
        cut_bytes = recovered.cut_bytes,
        "replica log read"
    );
    let directory_config = DirectoryConfig {
        // The incarnation becomes the term of the leader that serves.
        address: Address::new(NodeId(0), 0, 0),
        retry_period: options.directory.retry_period,
        limits: Default::default(),
    };
    let machine = ReplicatedDirectory::new(replica, directory_config, ActorSources);
    let mut net = Reactor::new().map_err(|e| io("poll", e))?;
    // After recovery, as a single directory does.
    let listen = &options.directory.listen;
    let hosts = crate::dirnode::bind(listen, "--listen")?;
    let peer_listen = options.peer_listen();
    let peers_socket = crate::dirnode::bind(peer_listen, "--replicas (this replica's entry)")?;
    let host_listener = net
        .listen_tcp(hosts, Limits::pending())
        .map_err(|e| io(listen, e))?;
    let peer_listener = net
        .listen_tcp(peers_socket, Limits::pending())
        .map_err(|e| io(peer_listen, e))?;
    // The control socket is the replica's user's alone.
    let control_path = replica_control_path(data_dir);
    if crate::sys::is_socket(&control_path) {
        std::fs::remove_file(&control_path).map_err(|e| io("control.sock", e))?;
    }
    let control = crate::sys::bind_unix(&control_path, 0o600).map_err(|e| io("control.sock", e))?;
    let control_listener = net
        .listen_unix(control, CONTROL_LIMITS)
        .map_err(|e| io("control.sock", e))?;
    let metrics = match &options.directory.metrics_listen {
        Some(listen) => {
            let metrics = ReplicaMetrics::new();
            let bound = crate::metrics::serve(listen, metrics.directory.registry.clone())
                .map_err(|e| io(&format!("--metrics-listen {listen}"), e))?;
            info!(url = %format_args!("http://{bound}/metrics"), "metrics served");
            Some(metrics)
        }
        None => None,
    };
    let clock = Clock::new();
    let now = clock.now();
    let peers = options
        .replicas
        .iter()
        .filter(|(id, _)| *id != options.id)
        .map(|(id, address)| {
            (
                *id,
                PeerOut {
                    address: address.clone(),
                    resolved: Addresses::default(),
                    conn: None,
                    up: false,
                    retry_at: now,
                },
            )
        })
        .collect();
    info!(
        version = dataplane_cli::VERSION,
        replica = options.id,
        replicas = ?options.replicas,
        listen = %listen,
        data_dir = %data_dir.display(),
        id = %log.log().id(),
        election_ms = config.election_ticks as u128 * TICK.as_millis(),
        cluster_key = options.directory.cluster_key.is_some(),
        join = options.join,
        "directory replica started"
    );
    let resolver = Resolver::new(
        PEER_LOOKUP_THREADS,
        net.waker().map_err(|e| io("poll", e))?,
        system_lookup,
    )
    .map_err(|e| io("the name-lookup threads", e))?;
    let mut node = ReplicaNode {
        clock,
        id: options.id,
        key: options.directory.cluster_key,
        machine,
        log,
        net,
        host_listener,
        peer_listener,
        control_listener,
        controls: crate::control::ControlConns::new(REPLICA_CONTROLS_MAX),
        static_peers: options.replicas.iter().cloned().collect(),
        next_tick: now,
        joining: rejoin,
        rejoin_path,
        hosts: HostSide::new(HostSideConfig {
            key: options.directory.cluster_key,
            admission_deadline: ADMISSION_DEADLINE,
            pending_max: PENDING_CONNECTIONS_MAX,
            admitted_max: ADMITTED_CONNECTIONS_MAX,
            first_transient: TRANSIENT_NODE_BASE,
            members_max: options.directory.members_max,
            forget_after: options.directory.forget_hosts_away_for,
            host_silence: options.directory.host_silence,
        }),
        peers,
        incoming: BTreeMap::new(),
        refusals_logged: BTreeSet::new(),
        leader_logged: None,
        host_io: Vec::new(),
        host_listen: options.directory.listen.clone(),
        peer_hosts: BTreeMap::new(),
        resolver,
        unresolved: crate::throttle::Throttle::default(),
        metrics,
        gauges: GaugeClock::default(),
    };
    let result = node.run();
    if let Err(e) = &result {
        error!(error = %e, "directory replica stops");
    }
    result
}

impl ReplicaNode {
    fn run(&mut self) -> Result<(), NodeError> {
        let mut events = Vec::new();
        loop {
            let next = self.next_deadline();
            let wait = self.clock.until(next).min(IDLE_WAIT);
            self.net
                .poll(Some(wait), &mut events)
                .map_err(|e| NodeError::Io(format!("poll: {e}")))?;
            for event in events.drain(..) {
                self.handle(event)?;
            }
            let now = self.clock.now();
            self.lookups(now);
            if now >= self.next_tick {
                self.machine.tick();
                self.next_tick = now.saturating_add(Duration::from_millis(TICK.as_millis() as u64));
            }
            self.connect_peers(now);
            self.expire(now);
            if self.hosts.timer_due(now) {
                let _ = self.machine.handle_timer(now, Timer::DirectoryRetry);
            }
            self.routes_changed();
            self.rounds()?;
            self.sample_gauges();
        }
    }

    /// Reads the gauges (at most every [`crate::metrics::GAUGE_PERIOD`]).
    fn sample_gauges(&mut self) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        if !self.gauges.due(self.clock.now()) {
            return;
        }
        let d = &metrics.directory;
        let generation = gauge_value(self.log.log().generation());
        if generation > d.log_generation.get() && d.log_generation.get() > 0 {
            d.compactions.inc();
        }
        d.sample_state(self.machine.committed(), self.log.log());
        d.hosts_connected.set(gauge_value(
            self.hosts
                .conns()
                .map_or(0, dataplane_core::conns::DirectoryConns::hosts_connected),
        ));
        d.members.set(gauge_value(self.machine.members().len()));
        d.conns
            .send_queued
            .set(gauge_value(self.net.queued_total()));
        let replica = self.machine.replica();
        metrics.term.set(gauge_value(replica.term()));
        metrics
            .serving
            .set(i64::from(self.machine.serving_term().is_some()));
        metrics.commit.set(gauge_value(replica.commit()));
        metrics.applied.set(gauge_value(self.machine.applied()));
        metrics
            .log_entries
            .set(gauge_value(self.log.durable().entries.len()));
        metrics
            .snapshot_index
            .set(gauge_value(replica.snapshot_index()));
        metrics
            .peers_connected
            .set(gauge_value(self.peers.values().filter(|p| p.up).count()));
        metrics.joining.set(i64::from(replica.is_joining()));
        metrics.host_connections.set(gauge_value(self.hosts.open()));
        metrics
            .reads_waiting
            .set(gauge_value(self.machine.reads_waiting()));
    }

    /// The next time something is due: a tick, a peer to connect, a deadline, the timer.
    fn next_deadline(&self) -> Instant {
        let mut next = self.next_tick;
        for peer in self.peers.values() {
            if peer.conn.is_none() {
                next = next.min(peer.retry_at);
            }
        }
        if let Some(at) = self.resolver.next_deadline() {
            next = next.min(at);
        }
        for pending in self.incoming.values() {
            if pending.from.is_none() {
                next = next.min(pending.since.saturating_add(ADMISSION_DEADLINE));
            }
        }
        if let Some(at) = self.hosts.next_deadline() {
            next = next.min(at);
        }
        next
    }

    /// Takes the engine's rounds: messages out, the disk, the messages that waited for it; then
    /// follows the leadership and lets go what the log applied.
    fn rounds(&mut self) -> Result<(), NodeError> {
        loop {
            let now = self.clock.now();
            let Some(mut round) = self.machine.ready(now) else {
                break;
            };
            for message in std::mem::take(&mut round.send) {
                self.send_peer(message);
            }
            let writes =
                round.snapshot.is_some() || !round.entries.is_empty() || round.hard_state.is_some();
            let started = std::time::Instant::now();
            self.log
                .write_round(round.snapshot.as_ref(), &round.entries, round.hard_state)
                .map_err(NodeError::Log)?;
            if let Some(snapshot) = &round.snapshot {
                info!(
                    index = snapshot.index,
                    term = snapshot.term,
                    bytes = snapshot.data.len(),
                    "installed the leader's snapshot"
                );
            }
            if let (Some(metrics), true) = (&self.metrics, writes) {
                let d = &metrics.directory;
                d.fsync_seconds.observe(started.elapsed().as_secs_f64());
                let records = round.entries.len()
                    + usize::from(round.hard_state.is_some())
                    + usize::from(round.snapshot.is_some());
                d.log_records.inc_by(records as u64);
            }
            if let Some(compaction) = &round.compacted {
                debug!(
                    index = compaction.snapshot.index,
                    bytes = compaction.snapshot.data.len(),
                    "took a snapshot; the log before it is compacted"
                );
                self.log.compacted(compaction).map_err(NodeError::Log)?;
            }
            for message in self.machine.persisted(round) {
                self.send_peer(message);
            }
            self.follow_serving();
            self.effects();
        }
        self.follow_serving();
        self.effects();
        self.release_held();
        self.follow_voters();
        if self.joining && !self.machine.replica().is_joining() {
            self.joining = false;
            remove_mark(&self.rejoin_path)
                .map_err(|e| NodeError::Io(format!("{}: {e}", self.rejoin_path.display())))?;
            info!(
                term = self.machine.replica().term(),
                commit = self.machine.replica().commit(),
                "joined: caught up with the leader; a voter again"
            );
        }
        if let Some(why) = self.machine.stopped() {
            return Err(NodeError::Recovery(format!("the replica stopped: {why}")));
        }
        Ok(())
    }

    /// Starts or ends the hosts' side to match whether the machine serves, and at which term.
    fn follow_serving(&mut self) {
        let now = self.clock.now();
        let leader = self.machine.replica().leader();
        if leader != self.leader_logged {
            self.leader_logged = leader;
            let term = self.machine.replica().term();
            match leader {
                Some(l) if l == self.id => {}
                Some(l) => {
                    let hosts = self.peer_hosts.get(&l).cloned().unwrap_or_default();
                    info!(leader = l, term, hosts = %hosts, "following: replica {l} leads");
                }
                None => info!(term, "no leader known: an election is on"),
            }
        }
        match self.hosts.follow(now, &self.machine, &mut self.host_io) {
            Serving::Unchanged => {}
            Serving::Stopped { term } => {
                info!(term, "stopped serving: closing every host connection");
            }
            Serving::Started {
                term,
                epoch,
                members,
            } => info!(
                term,
                epoch = epoch.0,
                applied = self.machine.applied(),
                hosts = members,
                "serving: this replica leads"
            ),
        }
        self.host_io();
    }

    /// Hands the hosts' side the directory's released effects (none are kept when not
    /// serving: they belonged to a term that is over, and nobody may see them).
    fn effects(&mut self) {
        let effects = self.machine.take_effects();
        let bypassed = self.hosts.effects(effects);
        if bypassed > 0 {
            error!(
                bypassed,
                "log records bypassed the replicated log and were dropped"
            );
        }
        self.release_held();
    }

    /// Hands the machine the route changes of its watched targets, until nothing changes.
    fn routes_changed(&mut self) {
        let mut changes = Vec::new();
        loop {
            self.hosts.route_changes(&mut changes);
            if changes.is_empty() {
                return;
            }
            for (target, routable) in changes.drain(..) {
                let now = self.clock.now();
                let _ = self.machine.handle_route(now, target, routable);
            }
            self.effects();
        }
    }

    /// Does what waits for the hosts, in order, up to a membership change not applied yet.
    fn release_held(&mut self) {
        self.hosts
            .release(self.machine.applied(), &mut self.host_io);
        self.host_io();
    }

    /// Carries out what the hosts' side asked for.
    fn host_io(&mut self) {
        let mut io = std::mem::take(&mut self.host_io);
        for action in io.drain(..) {
            match action {
                HostIo::Send(conn, link) => {
                    self.net.send(conn, link);
                }
                HostIo::Close(conn) => self.net.close(conn),
                HostIo::SendAndClose(conn, link) => {
                    self.net.send(conn, link);
                    self.net.close_after_flush(conn);
                }
                HostIo::Conn(action) => {
                    match perform_conn_action!(&mut self.net, action, "connection") {
                        Performed::Done => {}
                        Performed::Closed(why) => {
                            if let (Some(metrics), Some(kind)) =
                                (&self.metrics, Refusal::closing(why))
                            {
                                metrics.directory.conns.refused(kind);
                            }
                        }
                        Performed::Persist(_) => {
                            error!("a membership change was held instead of proposed");
                        }
                    }
                }
            }
        }
        self.host_io = io;
    }

    fn handle(&mut self, event: NetEvent) -> Result<(), NodeError> {
        match event {
            NetEvent::Accepted { listener, conn } if listener == self.peer_listener => {
                self.peer_accepted(conn);
            }
            NetEvent::Accepted { listener, conn } if listener == self.host_listener => {
                self.host_accepted(conn)?;
            }
            NetEvent::Accepted { listener, conn } if listener == self.control_listener => {
                if let Some(oldest) = self.controls.accepted(conn, self.clock.now()) {
                    debug!(
                        conn = oldest,
                        "control connection closed: {REPLICA_CONTROLS_MAX} were open, this \
                         one idle longest"
                    );
                    self.net.close(oldest);
                }
            }
            NetEvent::Accepted { conn, .. } => self.net.close(conn),
            NetEvent::Connected(_) => {}
            NetEvent::Closed(conn, reason) | NetEvent::Refused(conn, reason) => {
                self.closed(conn, &reason);
            }
            NetEvent::Frame(conn, payload) => {
                if self.controls.asked(conn, self.clock.now()) {
                    self.control_frame(conn, &payload);
                } else if self.incoming.contains_key(&conn) {
                    self.peer_frame(conn, &payload);
                } else if let Some(to) = self.peer_out(conn) {
                    self.peer_challenge(to, conn, &payload);
                } else {
                    self.host_frame(conn, &payload)?;
                }
            }
        }
        Ok(())
    }

    fn host_accepted(&mut self, conn: ConnId) -> Result<(), NodeError> {
        let nonce = match fresh_nonce() {
            Ok(nonce) => nonce,
            Err(e) => {
                warn!(conn, error = %e, "connection closed: no nonce for its handshake");
                self.net.close(conn);
                return Ok(());
            }
        };
        let now = self.clock.now();
        // Never itself: a leader that does not serve yet (or hands its leadership over)
        // would send the host straight back.
        let leader = self
            .machine
            .replica()
            .leader()
            .filter(|&id| id != self.id)
            .and_then(|id| self.peer_hosts.get(&id).cloned());
        if !self
            .hosts
            .accepted(now, conn, nonce, leader.clone(), &mut self.host_io)
        {
            // Not the leader (or not yet serving): the host goes where this names, or tries
            // the next replica.
            debug!(
                conn,
                remote = %self.net.remote(conn),
                leader = leader.as_deref().unwrap_or("unknown"),
                "host connection told who leads and closed: not serving"
            );
        }
        self.release_held();
        Ok(())
    }

    fn host_frame(&mut self, conn: ConnId, payload: &[u8]) -> Result<(), NodeError> {
        let now = self.clock.now();
        let heard = self
            .hosts
            .frame(now, conn, payload, &mut self.machine, &mut self.host_io);
        match heard {
            DirHeard::Nothing
            | DirHeard::HostRefused { .. }
            | DirHeard::Client { .. }
            | DirHeard::Protocol { .. } => {}
            DirHeard::Host {
                listen,
                admitted,
                forgot,
                ..
            } => {
                if let Some(f) = forgot {
                    crate::dirnode::log_forgotten(
                        &f,
                        self.hosts.membership().map_or(0, |m| m.len()),
                        self.metrics.as_ref().map(|m| &m.directory),
                    );
                }
                let m = admitted.member();
                info!(
                    conn,
                    node = %m.node,
                    incarnation = m.incarnation,
                    %listen,
                    "host admitted{}",
                    match admitted {
                        Admitted::Reconnected(_) => " (reconnected)",
                        Admitted::New(_) => " (new)",
                        Admitted::Restarted(_) => " (restarted: a new incarnation)",
                    }
                );
            }
            DirHeard::Envelope(envelope) => {
                if let Err(e) = self.machine.handle_message(now, envelope.message) {
                    debug!(error = %e, "a call was not taken");
                }
                self.effects();
            }
        }
        self.release_held();
        match self.machine.stopped() {
            Some(why) => Err(NodeError::Recovery(format!("a membership change: {why}"))),
            None => Ok(()),
        }
    }

    fn closed(&mut self, conn: ConnId, reason: &str) {
        if self.controls.remove(conn) {
            return;
        }
        if let Some(pending) = self.incoming.remove(&conn) {
            debug!(conn, from = ?pending.from, reason, "peer replica connection closed");
            return;
        }
        if let Some(to) = self.peer_out(conn) {
            let now = self.clock.now();
            let was_up = self.peers.get(&to).is_some_and(|p| p.up);
            if was_up {
                // Once per loss: a peer that stays unreachable logs its retries at debug.
                info!(
                    peer = to,
                    conn,
                    reason,
                    "lost the connection to peer replica {to} (stopped, partitioned or \
                     restarting); reconnecting every {PEER_RETRY}"
                );
            } else {
                debug!(conn, to, reason, "connection to a peer replica closed");
            }
            if let Some(peer) = self.peers.get_mut(&to) {
                peer.conn = None;
                peer.up = false;
                peer.retry_at = now.saturating_add(PEER_RETRY);
            }
            // It may come back without its disk: a leader probes it again.
            self.machine.report_unreachable(to);
            return;
        }
        self.hosts.closed(self.clock.now(), conn);
    }

    /// Closes peer connections that did not say hello in time, host connections that did
    /// not finish their handshake or went silent, and control connections left idle.
    fn expire(&mut self, now: Instant) {
        for conn in self.controls.expire(now) {
            debug!(conn, "control connection closed: idle");
            self.net.close(conn);
        }
        let late: Vec<ConnId> = self
            .incoming
            .iter()
            .filter(|(_, p)| p.from.is_none() && p.since.saturating_add(ADMISSION_DEADLINE) <= now)
            .map(|(conn, _)| *conn)
            .collect();
        for conn in late {
            debug!(
                conn,
                "peer connection closed: no hello within {ADMISSION_DEADLINE}"
            );
            self.incoming.remove(&conn);
            self.net.close(conn);
        }
        for node in self.hosts.expire(now, &mut self.machine) {
            info!(
                %node,
                "host connection closed: it sent nothing (stopped, or cut off without a close)"
            );
        }
        self.release_held();
    }

    /// The peer an outgoing connection goes to.
    fn peer_out(&self, conn: ConnId) -> Option<ReplicaId> {
        self.peers
            .iter()
            .find(|(_, p)| p.conn == Some(conn))
            .map(|(id, _)| *id)
    }

    /// Starts the connections to peers that have none and are due.
    fn connect_peers(&mut self, now: Instant) {
        for (id, peer) in &mut self.peers {
            if peer.conn.is_some() || peer.retry_at > now {
                continue;
            }
            let address = literal(&peer.address).or_else(|| {
                if self.resolver.start(now, *id, &peer.address) == Started::Full {
                    debug!(peer = id, "too many names looked up: not looked up again");
                }
                peer.resolved.next_address()
            });
            match address.map(|a| self.net.connect(a, Limits::pending())) {
                Some(Ok(conn)) => {
                    debug!(peer = id, conn, address = %peer.address, "connecting to a peer replica");
                    peer.conn = Some(conn);
                }
                _ => peer.retry_at = now.saturating_add(PEER_RETRY),
            }
        }
    }

    /// Takes the answers of the peers' name lookups, and gives up those that take too long.
    fn lookups(&mut self, now: Instant) {
        let mut failed = Vec::new();
        for answer in self.resolver.answers() {
            // Only for the peer's address as it is now (a peer removed, or given another
            // address, no longer wants it).
            let Some(peer) = self
                .peers
                .get_mut(&answer.key)
                .filter(|p| p.address == answer.name)
            else {
                continue;
            };
            match answer.addresses {
                Ok(addresses) => {
                    // The first attempt, made before any answer, found no address: now.
                    if peer.conn.is_none() && peer.resolved == Addresses::default() {
                        peer.retry_at = peer.retry_at.min(now);
                    }
                    peer.resolved.answered(addresses);
                }
                Err(why) => failed.push((answer.key, answer.name, why)),
            }
        }
        for (id, name) in self.resolver.expire(now) {
            let why = format!("no answer within {}", crate::resolve::LOOKUP_WAIT);
            failed.push((id, name, why));
        }
        for (id, name, why) in failed {
            if let Some(since) = self.unresolved.occur(
                std::time::Instant::now(),
                std::time::Duration::from_secs(10),
            ) {
                warn!(
                    peer = id,
                    address = %name,
                    reason = %why,
                    unlogged_since_last_warning = since,
                    "a peer replica's address does not resolve"
                );
            }
        }
    }

    /// The first frame on an outgoing connection: the acceptor's nonce, answered by the hello.
    fn peer_challenge(&mut self, to: ReplicaId, conn: ConnId, payload: &[u8]) {
        let Some(peer) = self.peers.get_mut(&to) else {
            return;
        };
        let challenge: Option<Nonce> = match postcard::from_bytes(payload) {
            Ok(PeerFrame::Challenge { nonce }) if !peer.up => Some(nonce),
            _ => None,
        };
        let Some(nonce) = challenge else {
            warn!(
                peer = to,
                conn, "a peer replica sent a frame out of protocol; reconnecting"
            );
            self.net.close(conn);
            peer.conn = None;
            peer.up = false;
            peer.retry_at = self.clock.now().saturating_add(PEER_RETRY);
            return;
        };
        let proof = connector_proof(
            self.key.as_ref().map(ClusterKey::bytes),
            &peer_hello(self.id, to, &self.host_listen),
            &nonce,
        );
        self.net.send(
            conn,
            PeerFrame::Hello {
                from: self.id,
                to,
                hosts: self.host_listen.clone(),
                proof,
            },
        );
        self.net.set_limits(conn, peer_limits());
        peer.up = true;
        info!(peer = to, conn, "connected to peer replica {to}");
        // It may have restarted without its disk: a leader probes it at once.
        self.machine.peer_connected(to);
    }

    fn peer_accepted(&mut self, conn: ConnId) {
        let pending = self.incoming.values().filter(|p| p.from.is_none()).count();
        if pending >= PEER_PENDING_MAX {
            debug!(
                conn,
                "peer connection closed: {PEER_PENDING_MAX} wait for their hello"
            );
            self.net.close(conn);
            return;
        }
        let Ok(nonce) = fresh_nonce() else {
            self.net.close(conn);
            return;
        };
        self.net.send(conn, PeerFrame::Challenge { nonce });
        self.net.resume(conn);
        let since = self.clock.now();
        self.incoming.insert(
            conn,
            PeerIn {
                nonce,
                from: None,
                since,
            },
        );
    }

    /// A frame on a connection another replica made: its hello, then its messages.
    fn peer_frame(&mut self, conn: ConnId, payload: &[u8]) {
        let Some(pending) = self.incoming.get_mut(&conn) else {
            return;
        };
        let frame = postcard::from_bytes::<PeerFrame>(payload);
        let accepted = match (pending.from, frame) {
            (
                None,
                Ok(PeerFrame::Hello {
                    from,
                    to,
                    hosts,
                    proof,
                }),
            ) => {
                let expected = connector_proof(
                    self.key.as_ref().map(ClusterKey::bytes),
                    &peer_hello(from, to, &hosts),
                    &pending.nonce,
                );
                let known = self.peers.contains_key(&from);
                let fits = hosts.len() <= dataplane_core::limits::LISTEN_BYTES_MAX;
                if to == self.id && known && fits && proofs_match(expected.as_ref(), proof.as_ref())
                {
                    pending.from = Some(from);
                    // Bounded: one per replica of the group.
                    self.peer_hosts.insert(from, hosts);
                    self.net.set_limits(conn, peer_limits());
                    self.refusals_logged.remove(&from);
                    debug!(conn, from, "peer replica admitted");
                    // One connection per peer: an older one from the same replica is gone
                    // (it restarted, or its connection broke without our noticing).
                    let older: Vec<ConnId> = self
                        .incoming
                        .iter()
                        .filter(|(c, p)| **c != conn && p.from == Some(from))
                        .map(|(c, _)| *c)
                        .collect();
                    for old in older {
                        debug!(
                            conn = old,
                            from, "older connection of a peer replica closed"
                        );
                        self.incoming.remove(&old);
                        self.net.close(old);
                    }
                    true
                } else {
                    let remote = self.net.remote(conn);
                    let why = "peer replica refused: not a replica of this group, or no proof \
                               of the cluster key (its next attempts are logged at debug)";
                    // Bounded: only the group's ids are remembered (a stranger may claim any
                    // id, so strangers share one slot, id 0, which no replica has).
                    let slot = if known { from } else { 0 };
                    if self.refusals_logged.insert(slot) {
                        info!(conn, %remote, from, to, known, "{why}");
                    } else {
                        debug!(conn, %remote, from, to, known, "{why}");
                    }
                    false
                }
            }
            (Some(from), Ok(PeerFrame::Raft(bytes))) => match WireMessage::decode(&bytes) {
                Ok(message) if message.from == from => {
                    match self.machine.step(message) {
                        Err(e @ ReplicaError::LostEntries { .. }) => {
                            // It stops (the next round reports it); its next start rejoins.
                            if let Err(io) = write_state(&self.rejoin_path, &()) {
                                error!(error = %io, "could not mark the replica as rejoining");
                            }
                            error!(error = %e, "this replica lost entries it had acknowledged: \
                                   it stops, and rejoins as a non-voter when started again");
                        }
                        Err(e) => debug!(from, error = %e, "a peer's message was not taken"),
                        Ok(()) => {}
                    }
                    true
                }
                Ok(message) => {
                    warn!(
                        conn,
                        from,
                        claimed = message.from,
                        "a peer replica spoke for another"
                    );
                    false
                }
                Err(e) => {
                    warn!(conn, from, error = %e, "a peer replica sent a malformed message");
                    false
                }
            },
            _ => false,
        };
        if !accepted {
            self.incoming.remove(&conn);
            self.net.close(conn);
        }
    }

    /// Sends an engine message to its replica, if its connection is up (else it is lost, as
    /// on a network that drops it: the engine sends again).
    /// One request on the control socket.
    fn control_frame(&mut self, conn: ConnId, payload: &[u8]) {
        let request = match decode_value::<ReplicaRequest>(payload, REPLICA_CONTROL_FRAME_MAX) {
            Ok(r) if r.version == REPLICA_CONTROL_VERSION => r,
            Ok(r) => {
                let why = format!(
                    "control protocol version {} (this replica speaks {REPLICA_CONTROL_VERSION})",
                    r.version
                );
                self.net.send(conn, ReplicaReply::Refused(why));
                self.net.close_after_flush(conn);
                self.controls.remove(conn);
                return;
            }
            Err(e) => {
                warn!(conn, error = %e, "control request refused: not a request");
                self.net.send(
                    conn,
                    ReplicaReply::Refused(format!("not a control request: {e}")),
                );
                self.net.close_after_flush(conn);
                self.controls.remove(conn);
                return;
            }
        };
        let reply = match request.command {
            ReplicaCommand::Status => ReplicaReply::Status(self.status()),
            ReplicaCommand::Change { add, remove } => self.change(add, remove),
            ReplicaCommand::TransferLeader { to } => self.transfer_leader(to),
        };
        self.net.send(conn, reply);
    }

    fn status(&self) -> ReplicaStatus {
        let replica = self.machine.replica();
        let conf = replica.conf();
        ReplicaStatus {
            id: self.id,
            term: replica.term(),
            serving: self.machine.serving_term().is_some(),
            leader: replica.leader(),
            voters: self.machine.voters(),
            joint: !conf.voters_outgoing.is_empty(),
            addresses: self
                .peers
                .iter()
                .map(|(id, p)| (*id, p.address.clone()))
                .collect(),
            applied: self.machine.applied(),
            joining: replica.is_joining(),
        }
    }

    /// An operator's change of the voters, checked before the engine sees it.
    fn change(&mut self, add: Vec<(ReplicaId, String)>, remove: Vec<ReplicaId>) -> ReplicaReply {
        let voters = self.machine.voters();
        let refuse = |why: String| ReplicaReply::Refused(why);
        if add.is_empty() && remove.is_empty() {
            return refuse("a change adds or removes at least one replica".into());
        }
        if add.len() + remove.len() > CHANGE_REPLICAS_MAX {
            return refuse(format!(
                "a change adds and removes at most {CHANGE_REPLICAS_MAX} replicas"
            ));
        }
        for (id, address) in &add {
            if *id == 0 || voters.contains(id) {
                return refuse(format!(
                    "replica {id} cannot be added: it is a voter (or 0)"
                ));
            }
            // Checked for its form only: a lookup here would stall the loop (and the name
            // may not be in the DNS yet); a name that does not resolve is logged as the new
            // voter's connection is tried.
            if address.is_empty() || address.len() > 256 || !host_port(address) {
                return refuse(format!(
                    "replica {id}'s address {address:?} is not HOST:PORT"
                ));
            }
        }
        for id in &remove {
            if !voters.contains(id) {
                return refuse(format!("replica {id} is not a voter"));
            }
        }
        if voters.len() + add.len() <= remove.len() {
            return refuse("a change may not remove every voter".into());
        }
        let changes: Vec<MemberChange> = add
            .iter()
            .map(|(id, _)| MemberChange::AddVoter(*id))
            .chain(remove.iter().map(|id| MemberChange::RemoveVoter(*id)))
            .collect();
        match self.machine.change_replicas(&changes, &add) {
            Ok(index) => {
                info!(?add, ?remove, index, "membership change proposed");
                ReplicaReply::Proposed(index)
            }
            Err(NotServing::NotLeader(l)) => ReplicaReply::NotLeader(l),
            Err(e) => refuse(e.to_string()),
        }
    }

    /// An operator's leadership transfer: the replica stops serving now (its hosts are closed
    /// and reconnect to the next leader).
    fn transfer_leader(&mut self, to: ReplicaId) -> ReplicaReply {
        match self.machine.transfer_leader(to) {
            Ok(()) => {
                info!(to, "handing the leadership over");
                self.follow_serving();
                ReplicaReply::Transferring
            }
            Err(NotServing::NotLeader(l)) => ReplicaReply::NotLeader(l),
            Err(NotServing::Transfer(why)) => ReplicaReply::Refused(why),
            Err(e) => ReplicaReply::Refused(e.to_string()),
        }
    }

    /// Makes the peer connections follow the voters the log applied: a new voter is
    /// connected to (at its committed address, or `--replicas`'), a removed one let go.
    /// A replica that knows no configuration yet (it joined empty) keeps `--replicas`.
    fn follow_voters(&mut self) {
        let voters = self.machine.voters();
        if voters.is_empty() {
            return;
        }
        let now = self.clock.now();
        let addresses = self.machine.addresses();
        for id in &voters {
            if *id == self.id || self.peers.contains_key(id) {
                continue;
            }
            let Some(address) = addresses
                .get(id)
                .or_else(|| self.static_peers.get(id))
                .cloned()
            else {
                warn!(replica = id, "a voter with no known address");
                continue;
            };
            info!(replica = id, %address, "a new voter: connecting to it");
            self.peers.insert(
                *id,
                PeerOut {
                    address,
                    resolved: Addresses::default(),
                    conn: None,
                    up: false,
                    retry_at: now,
                },
            );
        }
        let gone: Vec<ReplicaId> = self
            .peers
            .keys()
            .filter(|id| !voters.contains(id))
            .copied()
            .collect();
        for id in gone {
            info!(replica = id, "no longer a voter: its connection closes");
            if let Some(peer) = self.peers.remove(&id)
                && let Some(conn) = peer.conn
            {
                self.net.close(conn);
            }
        }
    }

    fn send_peer(&mut self, message: WireMessage) {
        let Some(peer) = self.peers.get(&message.to) else {
            return;
        };
        match (peer.conn, peer.up) {
            (Some(conn), true) => {
                self.net.send(conn, PeerFrame::Raft(message.encode()));
            }
            _ => self.machine.report_unreachable(message.to),
        }
    }
}

/// Removes a mark file and makes its removal durable (no-op if it is gone).
fn remove_mark(path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Whether `address` has the form `HOST:PORT` (a literal socket address, or a name and a
/// port), without looking it up.
fn host_port(address: &str) -> bool {
    if literal(address).is_some() {
        return true;
    }
    address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && port.parse::<u16>().is_ok()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    })
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn a_new_voters_address_is_checked_for_its_form_without_a_lookup() {
        for good in [
            "10.0.0.1:7100",
            "[::1]:7100",
            "replica-4.svc.cluster.local:7100",
        ] {
            assert!(host_port(good), "{good}");
        }
        for bad in [
            "",
            "10.0.0.1",
            "name:",
            ":7100",
            "name:70000",
            "a b:1",
            "name:port",
        ] {
            assert!(!host_port(bad), "{bad}");
        }
    }
}

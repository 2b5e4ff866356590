//! The nodes' metrics, and the small HTTP listener that serves them in the Prometheus text
//! format (`--metrics-listen ADDR`: `GET /metrics`).
//!
//! **Who writes, who reads.** Only the node's driver thread updates the metrics: counters and
//! histograms when something happens (a mutation committed, an fsync, a refusal, a chunk),
//! gauges from the machines' read-only accessors at most every [`GAUGE_PERIOD`] (the driver
//! polls at least once a second while metrics are on). The listener runs on a thread of its
//! own and only reads them (the `prometheus` crate's metrics are atomics behind an `Arc`), so
//! a scrape never waits for the driver and the driver never waits for a scrape.
//!
//! **The listener** ([`listener`]) reads and answers every connection without blocking, from
//! one poll: each has 2 s from its accept to send its request and take the answer, at most 64
//! are open at once (a new one closes the oldest), so a silent or trickling client delays no
//! other scrape. It answers `GET /metrics` (and `GET /`, a pointer to it), 404 elsewhere, 405
//! to other methods, and closes the connection after every answer.
//!
//! Every metric listed here is updated by a driver; the names are in README.md.

use std::time::Duration as StdDuration;

pub mod listener;
pub use listener::serve;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Gauges are read from the machines at most this often.
pub const GAUGE_PERIOD: StdDuration = StdDuration::from_millis(100);

/// When a node's gauges are next due (both nodes sample at most every [`GAUGE_PERIOD`]).
#[derive(Debug, Default)]
pub struct GaugeClock {
    due: dataplane_core::time::Instant,
}

impl GaugeClock {
    /// Whether the gauges are due at `now`; if so, the next sample is a period later.
    pub fn due(&mut self, now: dataplane_core::time::Instant) -> bool {
        if now < self.due {
            return false;
        }
        let period = u64::try_from(GAUGE_PERIOD.as_nanos()).unwrap_or(u64::MAX);
        self.due = now.saturating_add(dataplane_core::time::Duration::from_nanos(period));
        true
    }
}

/// Buckets (seconds) of the latency histograms: 50 µs to 5 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let metric = IntCounter::new(name, help).expect("a valid counter");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let metric = IntGauge::new(name, help).expect("a valid gauge");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

fn histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let metric = Histogram::with_opts(opts).expect("a valid histogram");
    registry
        .register(Box::new(metric.clone()))
        .expect("registered once");
    metric
}

/// What every node counts about its connections.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    /// `dataplane_connections{listener, state}`: connections waiting to be admitted
    /// (`pending`) and admitted ones (`admitted`), per listener (`nodes`, `children`).
    pub connections: IntGaugeVec,
    /// `dataplane_refusals_total{kind}`: connections refused or closed before or after
    /// admission, by why (see [`Refusal`]).
    pub refusals: IntCounterVec,
    /// `dataplane_send_queued_bytes`: bytes queued for all connections together (past
    /// [`crate::net::SEND_BUDGET_BYTES`] the longest queue's connection is closed).
    pub send_queued: IntGauge,
}

impl ConnectionMetrics {
    fn new(registry: &Registry) -> ConnectionMetrics {
        let metrics = ConnectionMetrics {
            connections: gauge_vec(
                registry,
                "dataplane_connections",
                "Connections by listener (nodes, children) and state (pending: not admitted yet; admitted).",
                &["listener", "state"],
            ),
            refusals: counter_vec(
                registry,
                "dataplane_refusals_total",
                "Connections refused or closed by the node, by kind.",
                &["kind"],
            ),
            send_queued: gauge(
                registry,
                "dataplane_send_queued_bytes",
                "Bytes queued for all connections together (past the node's send budget, 256 MiB, the connection with the longest queue is closed).",
            ),
        };
        // Every kind is there from the start, at 0: a rate needs a first sample.
        for kind in Refusal::ALL {
            metrics
                .refusals
                .with_label_values(&[kind.label()])
                .inc_by(0);
        }
        metrics
    }

    /// Counts one refusal.
    pub fn refused(&self, kind: Refusal) {
        self.refusals.with_label_values(&[kind.label()]).inc();
    }

    /// Sets the connection gauges of `listener`.
    pub fn set(&self, listener: &str, pending: usize, admitted: usize) {
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.connections
            .with_label_values(&[listener, "pending"])
            .set(as_i64(pending));
        self.connections
            .with_label_values(&[listener, "admitted"])
            .set(as_i64(admitted));
    }
}

/// Why a node refused or closed a connection: the `kind` label of
/// `dataplane_refusals_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its first frame was not a hello of this protocol.
    NotAHello,
    /// It speaks another protocol version.
    Version,
    /// It could not prove the cluster key.
    WrongKey,
    /// The node admits no more connections of its kind.
    Full,
    /// It was not admitted within the admission deadline.
    Expired,
    /// The waiting room was full: the oldest pending connection made room for a new one.
    Evicted,
    /// A child presented a wrong capability (or another arena generation).
    Capability,
    /// An admitted connection sent a frame out of protocol, or about another node's addresses.
    Protocol,
    /// The other end answered nothing (or a host sent nothing) for the silence bound.
    Silent,
}

impl Refusal {
    /// Every kind.
    pub const ALL: [Refusal; 9] = [
        Refusal::NotAHello,
        Refusal::Version,
        Refusal::WrongKey,
        Refusal::Full,
        Refusal::Expired,
        Refusal::Evicted,
        Refusal::Capability,
        Refusal::Protocol,
        Refusal::Silent,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NotAHello => "not_a_hello",
            Refusal::Version => "version",
            Refusal::WrongKey => "wrong_key",
            Refusal::Full => "full",
            Refusal::Expired => "expired",
            Refusal::Evicted => "evicted",
            Refusal::Capability => "capability",
            Refusal::Protocol => "protocol",
            Refusal::Silent => "silent",
        }
    }

    /// The kind of a connection a machine closed or refused (none for one its node replaced).
    pub fn closing(why: dataplane_core::conns::Closing) -> Option<Refusal> {
        use dataplane_core::conns::Closing;
        Some(match why {
            Closing::NotAHello => Refusal::NotAHello,
            Closing::Version => Refusal::Version,
            Closing::WrongKey => Refusal::WrongKey,
            Closing::Full => Refusal::Full,
            Closing::Expired => Refusal::Expired,
            Closing::Evicted => Refusal::Evicted,
            Closing::Protocol => Refusal::Protocol,
            Closing::Silent => Refusal::Silent,
            Closing::Replaced | Closing::NotLeader => return None,
        })
    }

    /// The kind of a refused hello.
    pub fn of(refusal: &dataplane_core::admission::HelloRefusal) -> Refusal {
        use dataplane_core::admission::HelloRefusal;
        match refusal {
            HelloRefusal::NotAHello => Refusal::NotAHello,
            HelloRefusal::Version { .. } => Refusal::Version,
            HelloRefusal::WrongKey => Refusal::WrongKey,
            HelloRefusal::Full => Refusal::Full,
        }
    }
}

/// The directory node's metrics.
#[derive(Clone, Debug)]
pub struct DirectoryMetrics {
    /// Where they are registered (what the listener serves).
    pub registry: Registry,
    /// `dataplane_directory_mutations_total`: requests from hosts and clients whose step
    /// persisted at least one log record.
    pub mutations: IntCounter,
    /// `dataplane_directory_mutation_seconds`: from the moment the driver hands such a request
    /// to the machine to the end of the fsync that makes its records durable (when its reply
    /// may leave).
    pub mutation_seconds: Histogram,
    /// `dataplane_directory_fsync_seconds`: every `fdatasync` of the log (group commit: one
    /// per batch).
    pub fsync_seconds: Histogram,
    /// `dataplane_directory_log_records_total`: records appended to the log.
    pub log_records: IntCounter,
    /// `dataplane_directory_log_bytes`: the current log file's length.
    pub log_bytes: IntGauge,
    /// `dataplane_directory_log_generation`: the log generation in use.
    pub log_generation: IntGauge,
    /// `dataplane_directory_compactions_total`: compactions of the log into a snapshot.
    pub compactions: IntCounter,
    /// `dataplane_directory_compactions_postponed_total`: compactions that found no room on
    /// the disk for their snapshot (the log goes on; they are tried again later).
    pub compactions_postponed: IntCounter,
    /// `dataplane_directory_compaction_seconds`: how long each compaction held the directory
    /// (it serves nothing meanwhile).
    pub compaction_seconds: Histogram,
    /// `dataplane_directory_disk_full`: 1 while the log cannot keep its reserve of room and
    /// new operations are refused `NoSpace` (the alarm: free space on the data directory's
    /// file system), else 0.
    pub disk_full: IntGauge,
    /// `dataplane_directory_no_space_refusals_total`: operations refused `NoSpace`.
    pub no_space_refusals: IntCounter,
    /// `dataplane_directory_entries`: namespace entries.
    pub entries: IntGauge,
    /// `dataplane_directory_reservations`: live blob reservations.
    pub reservations: IntGauge,
    /// `dataplane_directory_obligations`: retirement and displacement obligations not yet
    /// acknowledged.
    pub obligations: IntGauge,
    /// `dataplane_directory_hosts_connected`: hosts with an admitted connection.
    pub hosts_connected: IntGauge,
    /// `dataplane_directory_members`: hosts the membership knows (at most `--members-max`;
    /// past it a new listen address makes room by forgetting a host long away, or is refused).
    pub members: IntGauge,
    /// `dataplane_directory_members_forgotten_total`: hosts forgotten to make room for new
    /// ones (each away for longer than `--forget-hosts-away-for`, with nothing in the
    /// namespace on it).
    pub members_forgotten: IntCounter,
    /// Connections and refusals.
    pub conns: ConnectionMetrics,
}

impl DirectoryMetrics {
    /// The directory's metrics, registered in a fresh registry.
    pub fn new() -> DirectoryMetrics {
        let registry = Registry::new();
        let r = &registry;
        DirectoryMetrics {
            mutations: counter(
                r,
                "dataplane_directory_mutations_total",
                "Requests whose step persisted at least one log record.",
            ),
            mutation_seconds: histogram(
                r,
                "dataplane_directory_mutation_seconds",
                "From handing a mutating request to the directory machine to the end of the fsync that makes it durable.",
            ),
            fsync_seconds: histogram(
                r,
                "dataplane_directory_fsync_seconds",
                "Duration of each fdatasync of the log (one per batch: group commit).",
            ),
            log_records: counter(
                r,
                "dataplane_directory_log_records_total",
                "Records appended to the durable log.",
            ),
            log_bytes: gauge(
                r,
                "dataplane_directory_log_bytes",
                "Length of the current log file.",
            ),
            log_generation: gauge(
                r,
                "dataplane_directory_log_generation",
                "The log generation in use (raised by each compaction).",
            ),
            compactions: counter(
                r,
                "dataplane_directory_compactions_total",
                "Compactions of the log into a snapshot.",
            ),
            compactions_postponed: counter(
                r,
                "dataplane_directory_compactions_postponed_total",
                "Compactions that found no room on the disk for their snapshot (the log goes \
                 on; they are tried again once it grew by a snapshot's size).",
            ),
            compaction_seconds: histogram(
                r,
                "dataplane_directory_compaction_seconds",
                "How long each compaction of the log held the directory (it serves nothing \
                 meanwhile).",
            ),
            disk_full: gauge(
                r,
                "dataplane_directory_disk_full",
                "1 while the log's disk has no room for its reserve and new operations are \
                 refused NoSpace (free space on the data directory's file system), else 0.",
            ),
            no_space_refusals: counter(
                r,
                "dataplane_directory_no_space_refusals_total",
                "Operations refused NoSpace because the log's disk was full.",
            ),
            entries: gauge(r, "dataplane_directory_entries", "Namespace entries."),
            reservations: gauge(
                r,
                "dataplane_directory_reservations",
                "Live blob reservations.",
            ),
            obligations: gauge(
                r,
                "dataplane_directory_obligations",
                "Retirement and displacement obligations not yet acknowledged.",
            ),
            hosts_connected: gauge(
                r,
                "dataplane_directory_hosts_connected",
                "Hosts with an admitted connection.",
            ),
            members: gauge(
                r,
                "dataplane_directory_members",
                "Hosts the membership knows, by listen address (at most --members-max: past it a new listen address makes room by forgetting a host long away, or is refused).",
            ),
            members_forgotten: counter(
                r,
                "dataplane_directory_members_forgotten_total",
                "Hosts forgotten to make room for new ones (away for longer than --forget-hosts-away-for, nothing in the namespace on them).",
            ),
            conns: ConnectionMetrics::new(r),
            registry,
        }
    }
}

impl DirectoryMetrics {
    /// Sets the gauges of a directory's durable state and of its log file.
    pub fn sample_state(
        &self,
        durable: &dataplane_core::directory::DurableState,
        log: &crate::log::DurableLog,
    ) {
        self.entries.set(gauge_value(durable.entry_count()));
        self.reservations
            .set(gauge_value(durable.reservation_count()));
        self.obligations
            .set(gauge_value(durable.obligation_count()));
        self.log_bytes.set(gauge_value(log.len_bytes()));
        self.log_generation.set(gauge_value(log.generation()));
    }
}

impl Default for DirectoryMetrics {
    fn default() -> Self {
        DirectoryMetrics::new()
    }
}

/// A directory replica's metrics (issue 19): the directory's gauges of its committed state
/// and its log, and the replica's own. Of the directory's, a replica fills `entries`,
/// `reservations`, `obligations` (of the state it applied), `hosts_connected` (while it
/// serves), `log_bytes`, `log_generation`, `compactions`, `log_records` (replica records
/// appended), `fsync_seconds` (one per engine round) and the connection counters; not
/// `mutations_total` or `mutation_seconds` (a reply leaves at commit, not at this replica's
/// fsync: not measured yet).
#[derive(Clone, Debug)]
pub struct ReplicaMetrics {
    /// The directory's metrics, in the registry the listener serves.
    pub directory: DirectoryMetrics,
    /// `dataplane_replica_term`: the replica's current term.
    pub term: IntGauge,
    /// `dataplane_replica_leader`: 1 while it serves (it leads and applied its term's first
    /// entry), else 0.
    pub serving: IntGauge,
    /// `dataplane_replica_commit_index`: the highest log index it knows committed.
    pub commit: IntGauge,
    /// `dataplane_replica_applied_index`: the last log index it applied.
    pub applied: IntGauge,
    /// `dataplane_replica_log_entries`: entries in its log (since the last compaction).
    pub log_entries: IntGauge,
    /// `dataplane_replica_snapshot_index`: the last log index its latest snapshot covers.
    pub snapshot_index: IntGauge,
    /// `dataplane_replica_peers_connected`: peers its own connections reach.
    pub peers_connected: IntGauge,
    /// `dataplane_replica_joining`: 1 while it catches up after `--join`.
    pub joining: IntGauge,
    /// `dataplane_replica_host_connections`: connections on its host port it holds open
    /// (admitted or in their handshake; a follower names the leader and closes them).
    pub host_connections: IntGauge,
    /// `dataplane_replica_reads_waiting`: reads the leader asked a quorum to confirm and has
    /// not heard back about (at `READS_WAITING_MAX` it refuses inputs `Busy`).
    pub reads_waiting: IntGauge,
}

impl ReplicaMetrics {
    /// A replica's metrics, registered in a fresh registry.
    pub fn new() -> ReplicaMetrics {
        let directory = DirectoryMetrics::new();
        let r = &directory.registry.clone();
        ReplicaMetrics {
            term: gauge(r, "dataplane_replica_term", "The replica's current term."),
            serving: gauge(
                r,
                "dataplane_replica_leader",
                "1 while this replica serves (it leads and applied its term's first entry).",
            ),
            commit: gauge(
                r,
                "dataplane_replica_commit_index",
                "The highest log index this replica knows committed.",
            ),
            applied: gauge(
                r,
                "dataplane_replica_applied_index",
                "The last log index this replica applied.",
            ),
            log_entries: gauge(
                r,
                "dataplane_replica_log_entries",
                "Entries in the replica's log since its last compaction.",
            ),
            snapshot_index: gauge(
                r,
                "dataplane_replica_snapshot_index",
                "The last log index the replica's latest snapshot covers (0: none yet).",
            ),
            peers_connected: gauge(
                r,
                "dataplane_replica_peers_connected",
                "Peer replicas this replica's own connections reach.",
            ),
            host_connections: gauge(
                r,
                "dataplane_replica_host_connections",
                "Connections on the host port this replica holds open (a follower names the leader and closes them).",
            ),
            reads_waiting: gauge(
                r,
                "dataplane_replica_reads_waiting",
                "Reads the leader asked a quorum to confirm and has not heard back about (4096: it refuses inputs Busy).",
            ),
            joining: gauge(
                r,
                "dataplane_replica_joining",
                "1 while the replica catches up after --join (it does not vote).",
            ),
            directory,
        }
    }
}

impl Default for ReplicaMetrics {
    fn default() -> Self {
        ReplicaMetrics::new()
    }
}

/// A host node's metrics.
#[derive(Clone, Debug)]
pub struct HostMetrics {
    /// Where they are registered (what the listener serves).
    pub registry: Registry,
    /// `dataplane_host_proxy_pending_requests`: requests the namespace proxy has pending at
    /// the directory (retractions it owns included).
    pub proxy_pending: IntGauge,
    /// `dataplane_host_sessions`: child sessions.
    pub sessions: IntGauge,
    /// `dataplane_host_sessions_max`: the most it serves at once (`--sessions-max`).
    pub sessions_max: IntGauge,
    /// `dataplane_host_bindings`: reads and writes the host tracks (published blobs
    /// included).
    pub bindings: IntGauge,
    /// `dataplane_host_operations_in_progress`: operations in progress over all sessions.
    pub operations: IntGauge,
    /// `dataplane_host_retractions_pending`: retractions the host handed to its proxy when a
    /// binding ended (a stream's cancel or close, a reservation's release) and no directory
    /// answered yet; it keeps offering them (see `core/src/host/handover.rs`).
    pub retractions_pending: IntGauge,
    /// `dataplane_host_peer_addresses`: other hosts' addresses the host learned from the
    /// directory (`Link::WhereIs`) and keeps.
    pub peer_addresses: IntGauge,
    /// `dataplane_host_frames_waiting_for_address`: frames for other hosts waiting for the
    /// directory to say where they listen (or for their names' lookups).
    pub frames_waiting_for_address: IntGauge,
    /// `dataplane_host_name_lookups`: name lookups under way (peers' listen names and the
    /// directory's addresses, on the lookup threads).
    pub name_lookups: IntGauge,
    /// `dataplane_host_arena_bytes{state}`: the arena's bytes, `used` (leased) and `free`.
    pub arena_bytes: IntGaugeVec,
    /// `dataplane_host_arena_largest_free_bytes`: the largest free range (the largest lease
    /// that fits now, its header included).
    pub arena_largest_free: IntGauge,
    /// `dataplane_host_arena_leases`: live leases.
    pub arena_leases: IntGauge,
    /// `dataplane_host_arena_queued_requests`: requests waiting for arena space.
    pub arena_queued: IntGauge,
    /// `dataplane_host_arena_refused_allocations`: allocations the arena refused since the
    /// host started (too large, too many leases, a full queue).
    pub arena_refused: IntGauge,
    /// `dataplane_host_transfers_started_total`: reads that started pulling a blob from
    /// another host.
    pub transfers_started: IntCounter,
    /// `dataplane_host_transfers_in_progress`: reads pulling a blob from another host now.
    pub transfers_in_progress: IntGauge,
    /// `dataplane_host_transfer_chunks_total{direction}`: chunks `sent` to and `received`
    /// from other hosts.
    pub transfer_chunks: IntCounterVec,
    /// `dataplane_host_transfer_bytes_total{direction}`: their payload bytes.
    pub transfer_bytes: IntCounterVec,
    /// `dataplane_host_children_attached_total`: child sessions attached.
    pub children_attached: IntCounter,
    /// `dataplane_host_directory_connected`: 1 while the directory is connected and welcomed
    /// this host, else 0.
    pub directory_connected: IntGauge,
    /// `dataplane_host_directory_silences_total`: welcomed links to the directory given up
    /// because it answered no ping within `--directory-silence-ms` (a stopped directory or
    /// replica leader, a partition that drops without closing).
    pub directory_silences: IntCounter,
    /// Connections and refusals.
    pub conns: ConnectionMetrics,
}

impl HostMetrics {
    /// A host's metrics, registered in a fresh registry.
    pub fn new() -> HostMetrics {
        let registry = Registry::new();
        let r = &registry;
        let metrics = HostMetrics {
            proxy_pending: gauge(
                r,
                "dataplane_host_proxy_pending_requests",
                "Requests the namespace proxy has pending at the directory.",
            ),
            sessions: gauge(r, "dataplane_host_sessions", "Child sessions."),
            sessions_max: gauge(
                r,
                "dataplane_host_sessions_max",
                "The most child sessions the host serves at once (--sessions-max).",
            ),
            bindings: gauge(
                r,
                "dataplane_host_bindings",
                "Reads and writes the host tracks, published blobs included.",
            ),
            operations: gauge(
                r,
                "dataplane_host_operations_in_progress",
                "Operations in progress over all sessions.",
            ),
            retractions_pending: gauge(
                r,
                "dataplane_host_retractions_pending",
                "Retractions handed to the proxy that no directory answered yet.",
            ),
            peer_addresses: gauge(
                r,
                "dataplane_host_peer_addresses",
                "Other hosts' addresses learned from the directory and kept.",
            ),
            frames_waiting_for_address: gauge(
                r,
                "dataplane_host_frames_waiting_for_address",
                "Frames for other hosts waiting for their address or its lookup.",
            ),
            name_lookups: gauge(
                r,
                "dataplane_host_name_lookups",
                "Name lookups under way on the lookup threads.",
            ),
            arena_bytes: gauge_vec(
                r,
                "dataplane_host_arena_bytes",
                "Arena bytes by state: used (leased) and free.",
                &["state"],
            ),
            arena_largest_free: gauge(
                r,
                "dataplane_host_arena_largest_free_bytes",
                "The largest free range of the arena.",
            ),
            arena_leases: gauge(r, "dataplane_host_arena_leases", "Live arena leases."),
            arena_queued: gauge(
                r,
                "dataplane_host_arena_queued_requests",
                "Requests waiting for arena space.",
            ),
            arena_refused: gauge(
                r,
                "dataplane_host_arena_refused_allocations",
                "Allocations the arena refused since the host started.",
            ),
            transfers_started: counter(
                r,
                "dataplane_host_transfers_started_total",
                "Reads that started pulling a blob from another host.",
            ),
            transfers_in_progress: gauge(
                r,
                "dataplane_host_transfers_in_progress",
                "Reads pulling a blob from another host now.",
            ),
            transfer_chunks: counter_vec(
                r,
                "dataplane_host_transfer_chunks_total",
                "Transfer chunks sent to and received from other hosts.",
                &["direction"],
            ),
            transfer_bytes: counter_vec(
                r,
                "dataplane_host_transfer_bytes_total",
                "Payload bytes of the transfer chunks sent to and received from other hosts.",
                &["direction"],
            ),
            children_attached: counter(
                r,
                "dataplane_host_children_attached_total",
                "Child sessions attached.",
            ),
            directory_connected: gauge(
                r,
                "dataplane_host_directory_connected",
                "1 while the directory is connected and welcomed this host.",
            ),
            directory_silences: counter(
                r,
                "dataplane_host_directory_silences_total",
                "Links to the directory given up because it answered no ping within the \
                 silence bound.",
            ),
            conns: ConnectionMetrics::new(r),
            registry,
        };
        for direction in ["sent", "received"] {
            metrics
                .transfer_chunks
                .with_label_values(&[direction])
                .inc_by(0);
            metrics
                .transfer_bytes
                .with_label_values(&[direction])
                .inc_by(0);
        }
        metrics
    }
}

impl Default for HostMetrics {
    fn default() -> Self {
        HostMetrics::new()
    }
}

/// `n` as a gauge value.
pub(crate) fn gauge_value<N: TryInto<i64>>(n: N) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};

    fn get(address: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn the_listener_serves_the_text_format() {
        let metrics = HostMetrics::new();
        metrics.transfers_started.inc();
        metrics
            .transfer_bytes
            .with_label_values(&["received"])
            .inc_by(7);
        metrics.conns.refused(Refusal::WrongKey);
        let address = serve("127.0.0.1:0", metrics.registry).unwrap();
        let page = get(address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(
            page.contains("Content-Type: text/plain; version=0.0.4"),
            "{page}"
        );
        assert!(
            page.contains("\ndataplane_host_transfers_started_total 1\n"),
            "{page}"
        );
        assert!(
            page.contains("\ndataplane_host_transfer_bytes_total{direction=\"received\"} 7\n"),
            "{page}"
        );
        assert!(
            page.contains("dataplane_refusals_total{kind=\"wrong_key\"} 1"),
            "{page}"
        );
        assert!(
            page.contains("dataplane_refusals_total{kind=\"expired\"} 0"),
            "every kind is there from the start: {page}"
        );
        assert!(get(address, "GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(address, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let directory = DirectoryMetrics::new();
        directory.fsync_seconds.observe(0.001);
        let address = serve("127.0.0.1:0", directory.registry).unwrap();
        let page = get(address, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(
            page.contains("dataplane_directory_fsync_seconds_bucket{le=\"0.001\"} 1"),
            "{page}"
        );
    }

    /// A scrape over `stream`, which may have waited: the answer's status line.
    fn status_line(mut stream: TcpStream) -> String {
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        match stream.read_to_string(&mut out) {
            Ok(_) => out.lines().next().unwrap_or("").to_owned(),
            Err(e) => format!("no answer within 5 s: {e}"),
        }
    }

    /// Whether the listener closes `stream` within `within` while a byte of an endless request
    /// head is sent every 100 ms.
    fn closed_while_trickling(mut stream: TcpStream, within: std::time::Duration) -> bool {
        use std::io::ErrorKind;
        let started = std::time::Instant::now();
        stream
            .set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let mut head = b"GET /metrics HTTP/1.1\r\nX-Slow: "
            .iter()
            .copied()
            .chain(std::iter::repeat(b'a'));
        let mut byte = [0u8; 1];
        while started.elapsed() < within {
            if stream.write_all(&[head.next().unwrap_or(b'a')]).is_err() {
                return true;
            }
            match stream.read(&mut byte) {
                Ok(0) => return true,
                Ok(_) => return false, // an answer to an incomplete head
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return true,
            }
        }
        false
    }

    #[test]
    fn silent_and_trickling_clients_delay_no_scrape() {
        let metrics = HostMetrics::new();
        let address = serve("127.0.0.1:0", metrics.registry).unwrap();
        // Three times the open connections the listener keeps, none of which sends a byte,
        // and one that trickles an endless request head.
        let silent: Vec<TcpStream> = (0..3 * listener::PENDING_MAX)
            .map(|i| {
                TcpStream::connect_timeout(&address, std::time::Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("silent connection {i} not taken: {e}"))
            })
            .collect();
        let trickler = TcpStream::connect(address).unwrap();
        let trickling = std::thread::spawn(move || {
            closed_while_trickling(trickler, 5 * listener::SCRAPE_DEADLINE)
        });
        for _ in 0..3 {
            let status = status_line(TcpStream::connect(address).unwrap());
            assert_eq!(
                status, "HTTP/1.1 200 OK",
                "a scrape among silent connections"
            );
        }
        assert!(
            trickling.join().unwrap(),
            "a client trickling its request is closed at its deadline"
        );
        // Every silent connection was closed (the oldest made room, the rest at their
        // deadline), and the listener still answers.
        for mut stream in silent {
            stream
                .set_read_timeout(Some(5 * listener::SCRAPE_DEADLINE))
                .unwrap();
            let mut byte = [0u8; 1];
            match stream.read(&mut byte) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("a silent connection is not closed: {other:?}"),
            }
        }
        let status = status_line(TcpStream::connect(address).unwrap());
        assert_eq!(status, "HTTP/1.1 200 OK");
    }
}

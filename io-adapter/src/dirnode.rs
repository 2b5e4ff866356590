//! The directory node: the authoritative `Directory` machine, its durable log, and the TCP
//! endpoint hosts connect to.
//!
//! One driver thread owns everything, sockets included ([`Reactor`]). It waits for socket
//! readiness or the machine's timer, handles every frame that arrived (a batch), appends the
//! records of every step to the log, syncs **once** for the batch (group commit), and only then
//! executes the effects that came after the first record — replies, `Retire`s, timers, route
//! watches (DESIGN §3). A failed sync stops the node (fail-stop); on restart it recovers from
//! the log with a higher epoch.
//!
//! **Admission.** An accepted connection may send only hello-sized frames and must complete
//! the handshake (hello, challenge, proof) within the admission deadline; at most
//! `PENDING_CONNECTIONS_MAX` wait at once, the oldest making room for a new one. Nothing from a
//! connection reaches the machine before it is admitted, and an admitted one speaks only for
//! its own node (`speaks_for`). Every one of these decisions is core's
//! ([`dataplane_core::conns::DirectoryConns`], which the simulator runs too): this driver
//! hands it the reactor's events and carries out the actions it returns.
//!
//! The node also keeps the *membership* (`dataplane_core::membership`, which decides it):
//! hosts are identified by the address they listen on; the first host hello from an address
//! assigns it a node id, and a hello with a new boot nonce (the host process restarted) raises
//! its incarnation. Each change is a record in the directory's own log, appended and synced
//! before the `Welcome` that announces it, and restated by every compaction; so is the boot
//! count, before the directory's address (which carries it) is used. A membership file of an
//! earlier version is imported into the log once and removed. Benchmark and test clients that
//! only send calls say they are a client and get a transient node id.
//!
//! Nothing in the data directory is touched before the log holds its lock: a second directory
//! process on the same directory is refused ([`NodeError::Refused`]) without writing a byte.
//! The `created` mark is written only after the log is open, so its presence proves that the
//! log was created: a data directory with the mark and no log is refused
//! ([`LogOptions::create`]), not started empty.
//!
//! **Logs and metrics.** Once the log is open (a refused start logs nothing: its one error is
//! the caller's to print), the node logs its start-up (version, options, the data directory's
//! id), what recovery did (records replayed; a torn tail cut, and why), hosts admitted and
//! gone, refused connections and why (`info`), clients and pending connections (`debug`), and
//! a failure that stops it (`error`). With [`DirectoryOptions::metrics_listen`] it serves
//! [`DirectoryMetrics`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Instant as WallInstant;

use dataplane_cli::Exit;
use dataplane_core::admission::{ADMISSION_DEADLINE, PENDING_CONNECTIONS_MAX};
use dataplane_core::conns::{Accepts, Closing, ConnAction, DirHeard, DirectoryConns, Listener};
use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::log::{LogRecord, RecordRef};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{Envelope, Message};
use serde::{Deserialize, Serialize};
use tracing::{debug, error, info, warn};

use crate::driver::{Clock, read_state, write_state};
use crate::log::{DurableLog, LogError, LogOptions, Recovered};
use crate::metrics::{DirectoryMetrics, GaugeClock, Refusal, gauge_value};
use crate::net::{
    ClusterKey, ConnId, Limits, Link, NetEvent, Performed, Reactor, fresh_nonce,
    perform_conn_action,
};
use dataplane_core::barrier::Barrier;
use dataplane_core::error::{NamespaceError, Reason};
use dataplane_core::limits::{LOG_SPACE_RESERVE_BYTES, LOG_SPACE_RETRY};
use dataplane_core::membership::{Admitted, Forgotten, MemberRecord, Membership};
use dataplane_core::routes::Routes;
use dataplane_core::storage::{Compacted, Space, SpaceGate};

/// Transient node ids (clients that are not hosts) start here.
pub const TRANSIENT_NODE_BASE: u64 = 1 << 40;
/// Most admitted connections (hosts and clients).
const ADMITTED_CONNECTIONS_MAX: usize = 4096;
/// The log is compacted once it is this large (and twice its snapshot: `compaction_due`).
const COMPACT_MIN_BYTES: u64 = 4 << 20;
/// The log file grows in steps of this many bytes of zeros written ahead of its records, so
/// that the `fdatasync` of a commit overwrites allocated blocks and need not commit a change
/// of the file's size (ARCHITECTURE.md "Durability": 130 µs instead of 200 µs here).
pub(crate) const LOG_PREALLOCATE_BYTES: u64 = 1 << 20;
/// The longest the driver waits for an event (the metrics' gauges are read this often at
/// least).
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How a directory node is set up.
#[derive(Clone, Debug)]
pub struct DirectoryOptions {
    /// Where hosts connect (`host:port`).
    pub listen: String,
    /// The log and the membership table.
    pub data_dir: PathBuf,
    /// The directory's retry tick.
    pub retry_period: Duration,
    /// When set, every hello must present this key (hosts and clients alike).
    pub cluster_key: Option<ClusterKey>,
    /// Cut a damaged log at its first bad byte (or start a lost log empty), keeping a copy of
    /// the cut bytes, instead of refusing to start ([`LogOptions::repair`]).
    pub repair_log: bool,
    /// Serve [`DirectoryMetrics`] at `http://ADDR/metrics` (`host:port`).
    pub metrics_listen: Option<String>,
    /// Most hosts the membership keeps (1 to [`MEMBERS_MAX`](dataplane_core::limits::MEMBERS_MAX)); past it a new host makes room
    /// by the forgetting of one that has been away for `forget_hosts_away_for` and that the
    /// namespace does not name, or is refused (`dataplane_core::membership`).
    pub members_max: usize,
    /// How long a host must have been away before a full membership may forget it.
    pub forget_hosts_away_for: Duration,
    /// How long a host's connection may carry nothing (hosts ping) before it is closed.
    pub host_silence: Duration,
}

/// Why a directory node stopped.
#[derive(Debug)]
pub enum NodeError {
    /// The log failed (fail-stop: restart the node to recover).
    Log(LogError),
    /// The node did not start: the data directory is locked by another process, or recovery
    /// refused what it found there. No file was changed.
    Refused(LogError),
    /// Recovery refused the log.
    Recovery(String),
    /// Listening or the state file failed.
    Io(String),
    /// The command line asks for what cannot be: an address it cannot listen at (in use,
    /// not this machine's, a port it may not bind), settings that do not fit together.
    /// Nothing was changed on disk.
    Usage(String),
}

/// Binds `address` (the value of command-line option `option`); a failure is a usage error
/// that names the option and what to do.
pub(crate) fn bind(address: &str, option: &str) -> Result<TcpListener, NodeError> {
    TcpListener::bind(address).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                " (another process listens there: stop it, or give another port)"
            }
            std::io::ErrorKind::AddrNotAvailable => " (not an address of this machine)",
            std::io::ErrorKind::PermissionDenied => {
                " (a port below 1024 needs privileges: give a higher one)"
            }
            _ => "",
        };
        NodeError::Usage(format!("{option} {address}: {e}{hint}"))
    })
}

/// What a person must mend before a restart can help, after a stopped log's "the node stops":
/// a restart alone does not help when the disk refuses every write.
fn mend_first(e: &LogError) -> &'static str {
    let LogError::Io { source, .. } = e else {
        return "; restart it to recover";
    };
    match source.kind() {
        std::io::ErrorKind::StorageFull => {
            ": its log cannot grow; free space on the data directory's file system, then \
             restart it"
        }
        std::io::ErrorKind::ReadOnlyFilesystem => {
            ": the data directory's file system is read-only, which a file system that hit an \
             error often becomes (see the kernel log); check it and make it writable, then \
             restart the node"
        }
        std::io::ErrorKind::PermissionDenied => {
            ": its user may not change the data directory; give it back the rights, then \
             restart it"
        }
        _ => "; restart it to recover",
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Log(e) => write!(f, "durable log: {e} (the node stops{})", mend_first(e)),
            NodeError::Refused(e) => {
                write!(f, "directory refuses to start: {e}; no file was changed")?;
                match e {
                    LogError::Damaged { offset, .. } => write!(
                        f,
                        " (--repair-log cuts the log at byte {offset}, losing what follows, and \
                         keeps a copy of the cut bytes)"
                    ),
                    LogError::MissingLog { .. } => f.write_str(
                        " (--repair-log starts the log empty after its snapshot, losing its \
                         records, and keeps a copy of any bytes it had)",
                    ),
                    _ => Ok(()),
                }
            }
            NodeError::Recovery(e) => write!(f, "recovery: {e}"),
            NodeError::Io(e) | NodeError::Usage(e) => f.write_str(e),
        }
    }
}

impl NodeError {
    /// The exit status `dataplane-node` reports: 75 (EX_TEMPFAIL) for a data directory another
    /// process holds, 65 (EX_DATAERR) for one recovery refuses, 70 (EX_SOFTWARE) otherwise
    /// (a storage failure: restart the node to recover).
    pub fn exit_code(&self) -> Exit {
        match self {
            NodeError::Refused(LogError::Locked { .. }) => Exit::Temporary,
            NodeError::Refused(_) => Exit::DataLost,
            NodeError::Usage(_) => Exit::Usage,
            _ => Exit::Software,
        }
    }
}

impl std::error::Error for NodeError {}

impl From<LogError> for NodeError {
    fn from(e: LogError) -> Self {
        NodeError::Log(e)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
/// The membership file of a data directory written by an earlier version (the table now lives
/// in the log): read once, imported into the log, then removed.
struct LegacyMembership {
    /// Directory boots so far (the directory's address carries it).
    boots: u64,
    next_node: u64,
    hosts: BTreeMap<String, HostRecord>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct HostRecord {
    node: NodeId,
    incarnation: u64,
    boot_nonce: u64,
}

struct DirectoryNode {
    clock: Clock,
    address: Address,
    machine: Directory,
    log: DurableLog,
    membership: Membership,
    net: Reactor,
    /// Every connection's handshake, and the node each admitted one speaks for (core's).
    conns: DirectoryConns,
    /// What `conns` asked for, not yet done (a reused buffer).
    actions: Vec<ConnAction>,
    timer: Option<Instant>,
    barrier: Barrier,
    /// Routability of the machine's watched targets, from the admitted connections.
    routes: Routes,
    /// Route changes to hand the machine (a reused buffer).
    route_changes: Vec<(Address, bool)>,
    outbox: Outbox,
    /// With `--metrics-listen`: the metrics, when the gauges are next read, and when each
    /// mutating request of the batch not yet synced was handed to the machine.
    metrics: Option<DirectoryMetrics>,
    gauges: GaugeClock,
    awaiting_sync: Vec<WallInstant>,
    /// Whether the log has room for new operations (a full disk closes it).
    space: SpaceGate,
    /// What a `NoSpace` refusal says: the data directory and what to do.
    no_space_reason: Reason,
}

/// A file in the data directory whose presence says its log was created (so a data directory
/// whose log is gone is refused, not started empty). It holds the data directory's id.
const CREATED_MARK: &str = "created";

/// A host forgotten to make room for a new one (a `WARN` line and the counter); the
/// replicated directory's leader says it the same way.
pub(crate) fn log_forgotten(f: &Forgotten, members: usize, metrics: Option<&DirectoryMetrics>) {
    warn!(
        node = %f.member.node,
        listen = %f.listen,
        members,
        "host forgotten to make room for a new one: the membership is full, and this one has \
         been away for longer than --forget-hosts-away-for with nothing in the namespace on \
         it; if it comes back, it is a new member"
    );
    if let Some(metrics) = metrics {
        metrics.members_forgotten.inc();
    }
}

/// The records that restate an earlier version's membership file.
fn import_legacy(legacy: &LegacyMembership) -> Vec<LogRecord> {
    let mut records = vec![LogRecord::Member(MemberRecord::Booted {
        boots: legacy.boots,
    })];
    records.extend(legacy.hosts.iter().map(|(listen, r)| {
        LogRecord::Member(MemberRecord::Host {
            listen: listen.clone(),
            node: r.node,
            incarnation: r.incarnation,
            boot_nonce: r.boot_nonce,
        })
    }));
    records
}

/// Runs a directory node until its log fails (it never returns `Ok` otherwise).
pub fn run_directory(options: &DirectoryOptions) -> Result<(), NodeError> {
    let io = |what: &str, e: std::io::Error| NodeError::Io(format!("{what}: {e}"));
    let legacy_path = options.data_dir.join("membership");
    let created_path = options.data_dir.join(CREATED_MARK);
    // Only looked at until the log's lock is held: a data directory that has booted before
    // must have a log (the mark is first written after the log was created; earlier versions
    // wrote their membership file then).
    let exists = |path: &std::path::Path| match std::fs::metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(&path.display().to_string(), e)),
    };
    // A port it cannot have is a usage error found before the disk is touched: a trial bind,
    // let go at once (the node binds for good only after recovery, below).
    drop(bind(&options.listen, "--listen")?);
    let booted = exists(&created_path)? || exists(&legacy_path)?;
    if !booted {
        std::fs::create_dir_all(&options.data_dir).map_err(|e| io("data directory", e))?;
    }
    let log_options = LogOptions {
        create: !booted,
        repair: options.repair_log,
        preallocate: LOG_PREALLOCATE_BYTES,
    };
    let (mut log, recovered) = DurableLog::open_with(&options.data_dir.join("log"), log_options)
        .map_err(|e| {
            if e.is_refusal() || matches!(e, LogError::Locked { .. }) {
                NodeError::Refused(e)
            } else {
                NodeError::Log(e)
            }
        })?;
    log_recovery(&recovered, &log);
    let mut membership = Membership::recover(&recovered.records)
        .map_err(|e| NodeError::Recovery(format!("membership: {e}")))?;
    // An earlier version's membership file: imported into the log unless the log has a
    // membership already (an import that crashed before removing the file).
    let legacy: Option<LegacyMembership> =
        read_state(&legacy_path).map_err(|e| io("membership", e))?;
    if let Some(legacy) = &legacy
        && membership.is_empty()
    {
        for record in import_legacy(legacy) {
            log.append(&record)?;
        }
        membership = Membership::recover(&import_legacy(legacy))
            .map_err(|e| NodeError::Recovery(format!("membership file: {e}")))?;
    }
    // The boot count rises durably before the directory's address (which carries it) is used.
    // After a repair that cut synced records, the boot count and the epoch skip past anything
    // those records could have counted (`lost_bound`), so that no boot or epoch, and no
    // stream incarnation of one, is handed out twice.
    let lost = recovered.lost_bound();
    log.append(&membership.boot_after_loss(lost))?;
    log.sync()?;
    if legacy.is_some() {
        std::fs::remove_file(&legacy_path).map_err(|e| io("membership", e))?;
        info!(path = %legacy_path.display(), "membership file imported into the log and removed");
    }
    if !exists(&created_path)? {
        write_state(&created_path, &log.id().0).map_err(|e| io(CREATED_MARK, e))?;
    }
    let clock = Clock::new();
    let address = Address::new(NodeId(0), membership.boots(), 0);
    let config = DirectoryConfig {
        address,
        retry_period: options.retry_period,
        limits: Default::default(),
    };
    let mut outbox = Outbox::new();
    let machine = Directory::recover_after_loss(
        config,
        &recovered.records,
        lost,
        &mut ActorSources,
        clock.now(),
        &mut outbox,
    )
    .map_err(|e| NodeError::Recovery(e.to_string()))?;
    info!(
        records = recovered.records.len(),
        from_snapshot = recovered.snapshot_records,
        from_log = recovered.records.len() - recovered.snapshot_records,
        generation = recovered.generation,
        cut_bytes = recovered.cut_bytes,
        epoch = machine.epoch().0,
        "log replayed"
    );
    if lost > 0 {
        warn!(
            boot = membership.boots(),
            epoch = machine.epoch().0,
            lost_records_at_most = lost,
            "log: the repair may have cut synced records: the boot count and the epoch skip \
             past anything they counted; a host that restarted after the cut is told it is \
             unknown and must be restarted"
        );
    }
    // After recovery: a node that accepts connections has read its log (tests and operators
    // take a listening port for a node that is up).
    let listener = bind(&options.listen, "--listen")?;
    let mut net = Reactor::new().map_err(|e| io("poll", e))?;
    net.listen_tcp(listener, Limits::pending())
        .map_err(|e| io(&options.listen, e))?;
    let metrics = match &options.metrics_listen {
        Some(listen) => {
            let metrics = DirectoryMetrics::new();
            let bound = crate::metrics::serve(listen, metrics.registry.clone())
                .map_err(|e| io(&format!("--metrics-listen {listen}"), e))?;
            info!(url = %format_args!("http://{bound}/metrics"), "metrics served");
            Some(metrics)
        }
        None => None,
    };
    info!(
        version = dataplane_cli::VERSION,
        listen = %options.listen,
        data_dir = %options.data_dir.display(),
        id = %log.id(),
        boot = membership.boots(),
        retry_ms = options.retry_period.as_millis(),
        cluster_key = options.cluster_key.is_some(),
        repair_log = options.repair_log,
        members = membership.len(),
        members_max = options.members_max,
        forget_hosts_away_for_s = options.forget_hosts_away_for.as_secs_f64(),
        "directory started"
    );
    membership.set_capacity(options.members_max);
    let log_synced = log.synced();
    let mut node = DirectoryNode {
        clock,
        address,
        machine,
        log,
        membership,
        net,
        conns: DirectoryConns::new(
            Listener::new(
                options.cluster_key,
                Accepts::HostsAndClients,
                ADMISSION_DEADLINE,
                PENDING_CONNECTIONS_MAX,
                ADMITTED_CONNECTIONS_MAX,
            ),
            TRANSIENT_NODE_BASE,
            clock.now(),
        ),
        actions: Vec::new(),
        timer: None,
        barrier: Barrier::new(log_synced),
        routes: Routes::new(),
        route_changes: Vec::new(),
        outbox: Outbox::new(),
        metrics,
        gauges: GaugeClock::default(),
        awaiting_sync: Vec::new(),
        space: SpaceGate::new(LOG_SPACE_RESERVE_BYTES, LOG_SPACE_RETRY),
        no_space_reason: Reason::new(format!(
            "no room on the file system of its data directory {} for its log; free space there",
            options.data_dir.display()
        )),
    };
    node.conns
        .set_forget_away_after(options.forget_hosts_away_for);
    node.conns.set_host_silence(options.host_silence);
    let effects = outbox.take();
    let started = node.execute(effects).and_then(|()| {
        // The recovery's records (the new epoch first) are durable before anyone is welcomed
        // with that epoch, and its held effects (retries, the retry timer) go out now, not
        // after the first event.
        node.commit()
    });
    let result = started.and_then(|()| node.run());
    if let Err(e) = &result {
        error!(error = %e, "directory stops");
    }
    result
}

/// Logs what recovery did: a new data directory (`info`), a discarded generation and a cut
/// (`warn`: bytes were dropped, though none that were acknowledged, or a repair dropped them).
fn log_recovery(recovered: &Recovered, log: &DurableLog) {
    let dir = log.dir().display();
    if recovered.created {
        info!(id = %recovered.id, "log: created a new log in {dir}");
    }
    if let Some(discarded) = recovered.discarded_generation {
        warn!(
            "log: discarded generation {discarded} of {dir} (incomplete snapshot, no records); \
             recovered generation {}",
            recovered.generation
        );
    }
    // The cut's own sentence says what was cut, where and why.
    if let Some(cut) = &recovered.cut {
        warn!("{cut}");
    }
}

impl DirectoryNode {
    fn run(&mut self) -> Result<(), NodeError> {
        let mut events = Vec::new();
        loop {
            let next = [self.timer, self.conns.next_deadline()]
                .into_iter()
                .flatten()
                .min();
            // At least once a second, so that the metrics' gauges are never older than that.
            let wait = next.map_or(IDLE_WAIT, |at| self.clock.until(at).min(IDLE_WAIT));
            self.net
                .poll(Some(wait), &mut events)
                .map_err(|e| NodeError::Io(format!("poll: {e}")))?;
            for event in events.drain(..) {
                self.handle(event)?;
            }
            let now = self.clock.now();
            for node in self.conns.expire(now, &mut self.actions) {
                info!(
                    %node,
                    silence = %self.conns.host_silence(),
                    "host connection closed: it sent nothing (stopped, or cut off without a close)"
                );
                self.routes.disconnected(node);
            }
            self.conn_actions()?;
            // Also without traffic, so the alarm clears once space is freed.
            self.check_space()?;
            if self.timer.is_some_and(|at| at <= now) {
                self.timer = None;
                let _ = self
                    .machine
                    .handle_timer(now, Timer::DirectoryRetry, &mut self.outbox);
                self.step_effects()?;
            }
            // A route report may make the machine watch more (WatchRoute): repeat until
            // nothing changed.
            loop {
                let mut changes = std::mem::take(&mut self.route_changes);
                self.routes.changes(&mut changes);
                if changes.is_empty() {
                    self.route_changes = changes;
                    break;
                }
                for (target, routable) in changes.drain(..) {
                    if self.routes.is_watched(&target) {
                        let now = self.clock.now();
                        self.machine
                            .handle_route(now, target, routable, &mut self.outbox);
                        self.step_effects()?;
                    }
                }
                self.route_changes = changes;
            }
            self.commit()?;
            self.sample_gauges();
        }
    }

    /// Reads the gauges from the machine, the log and the admission (at most every
    /// [`crate::metrics::GAUGE_PERIOD`]).
    fn sample_gauges(&mut self) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        if !self.gauges.due(self.clock.now()) {
            return;
        }
        metrics.sample_state(self.machine.durable(), &self.log);
        metrics
            .hosts_connected
            .set(gauge_value(self.conns.hosts_connected()));
        metrics.members.set(gauge_value(self.membership.len()));
        let listener = self.conns.listener();
        metrics
            .conns
            .set("nodes", listener.pending_count(), listener.admitted_count());
        metrics
            .conns
            .send_queued
            .set(gauge_value(self.net.queued_total()));
    }

    fn count_refusal(&self, kind: Refusal) {
        if let Some(metrics) = &self.metrics {
            metrics.conns.refused(kind);
        }
    }

    /// Syncs the batch's records once, then lets the held effects go.
    fn commit(&mut self) -> Result<(), NodeError> {
        if self.log.written() > self.log.synced() {
            let started = WallInstant::now();
            self.log.sync()?;
            if let Some(metrics) = &self.metrics {
                let synced = WallInstant::now();
                metrics
                    .fsync_seconds
                    .observe((synced - started).as_secs_f64());
                for handed in self.awaiting_sync.drain(..) {
                    metrics
                        .mutation_seconds
                        .observe((synced - handed).as_secs_f64());
                }
            }
        }
        let mut ready = Vec::new();
        self.barrier.release(self.log.synced(), &mut ready);
        for effect in ready {
            self.perform(effect);
        }
        let len = self.log.len_bytes();
        if self.log.compaction_due(COMPACT_MIN_BYTES) {
            let started = std::time::Instant::now();
            // Encoded straight from the state (cloning it first was half the time).
            let members = self.membership.snapshot_records();
            let mut records = 0u64;
            let snapshot = (self.machine.snapshot().map(RecordRef::Snapshot))
                .chain(members.iter().map(RecordRef::Record))
                .inspect(|_| records += 1);
            if let Compacted::Postponed(error) = self.log.compact_from(snapshot)? {
                // The disk has no room for the snapshot: the log goes on as it was (it stops
                // the node only when it cannot grow itself).
                warn!(
                    %error,
                    log_bytes = len,
                    "log compaction postponed: no room on the disk for the snapshot (the \
                     directory goes on; free space on the data directory's file system)"
                );
                if let Some(metrics) = &self.metrics {
                    metrics.compactions_postponed.inc();
                }
                return Ok(());
            }
            // Nothing waits (the batch was released above); positions restart in the new file.
            self.barrier.clear(self.log.synced());
            let took = started.elapsed();
            info!(
                generation = self.log.generation(),
                records,
                log_bytes_before = len,
                took_ms = took.as_millis() as u64,
                "log compacted"
            );
            if let Some(metrics) = &self.metrics {
                metrics.compactions.inc();
                metrics.compaction_seconds.observe(took.as_secs_f64());
            }
        }
        Ok(())
    }

    /// Asks the space gate whether the log has its reserve for new operations, and tells the
    /// machine, the log and the alarm gauge when that changes. Before every request, so that
    /// a new operation is refused before it changes anything.
    fn check_space(&mut self) -> Result<(), NodeError> {
        let now = self.clock.now();
        let space = self.log.check_space(&mut self.space, now)?;
        match space {
            Space::Room | Space::StillFull => return Ok(()),
            Space::Full => {
                warn!(
                    data_dir = %self.log.dir().display(),
                    reserve_bytes = self.space.reserve(),
                    "disk full: the log cannot keep room for new operations; they are refused \
                     (NoSpace) until space is freed on the data directory's file system; \
                     reads and retractions are still served"
                );
                self.machine
                    .set_no_space(Some(self.no_space_reason.clone()));
            }
            Space::Returned => {
                info!(
                    data_dir = %self.log.dir().display(),
                    "disk has room again: new operations are taken"
                );
                self.machine.set_no_space(None);
            }
        }
        if let Some(metrics) = &self.metrics {
            metrics.disk_full.set(i64::from(!space.has_room()));
        }
        Ok(())
    }

    fn step_effects(&mut self) -> Result<(), NodeError> {
        let effects = self.outbox.take();
        self.execute(effects)
    }

    fn execute(&mut self, effects: Vec<Effect>) -> Result<(), NodeError> {
        let mut ready = Vec::new();
        let (log, metrics) = (&mut self.log, &self.metrics);
        let synced = log.synced();
        self.barrier.admit(
            effects,
            synced,
            |record| {
                let end = log.append(record)?;
                if let Some(metrics) = metrics {
                    metrics.log_records.inc();
                }
                Ok::<u64, LogError>(end)
            },
            &mut ready,
        )?;
        for effect in ready {
            self.perform(effect);
        }
        Ok(())
    }

    fn perform(&mut self, effect: Effect) {
        match effect {
            Effect::Send { to, message } => self.send(to, message),
            Effect::SetTimer { at, .. } => self.timer = Some(at),
            Effect::CancelTimer { .. } => self.timer = None,
            Effect::WatchRoute { target } => {
                self.routes.watch(target);
            }
            Effect::UnwatchRoute { target } => {
                self.routes.unwatch(target);
            }
            Effect::Persist(record) => {
                // The barrier appends every record; one reaching here is a driver bug.
                error!(?record, "a log record bypassed the barrier and was dropped");
            }
        }
    }

    fn send(&mut self, to: Address, message: Message) {
        if let Message::Reply(reply) = &message
            && let Some(NamespaceError::NoSpace(_)) = reply.body.err()
            && let Some(metrics) = &self.metrics
        {
            metrics.no_space_refusals.inc();
        }
        let Some(conn) = self.conns.conn_of(to.node) else {
            return; // Unreachable now: obligations are re-sent, replies are re-asked.
        };
        let envelope = Envelope {
            from: self.address,
            to,
            message,
        };
        self.net.send(conn, Link::Frame(envelope));
    }

    /// Does what the connections machine asked for, in order.
    fn conn_actions(&mut self) -> Result<(), NodeError> {
        let mut actions = std::mem::take(&mut self.actions);
        let mut result = Ok(());
        for action in actions.drain(..) {
            if result.is_err() {
                break;
            }
            match perform_conn_action!(&mut self.net, action, "connection") {
                Performed::Done => {}
                Performed::Closed(why) => self.count_closing(why),
                // Membership changes are durable before the host hears them (a crash cannot
                // take back an id or an incarnation anybody was told).
                Performed::Persist(records) => {
                    result = records
                        .iter()
                        .try_for_each(|record| self.log.append(record).map(drop))
                        .and_then(|()| self.log.sync().map(drop))
                        .map_err(NodeError::from);
                }
            }
        }
        self.actions = actions;
        result
    }

    fn count_closing(&self, why: Closing) {
        if let Some(kind) = Refusal::closing(why) {
            self.count_refusal(kind);
        }
    }

    /// Logs a connection the peer closed (or that broke): hosts at `info`, the rest at `debug`.
    fn log_closed(&self, conn: ConnId, reason: &str) {
        match self.conns.attached(conn) {
            Some(a) if a.host => {
                info!(conn, node = %a.node, incarnation = a.incarnation, reason, "host disconnected");
            }
            Some(a) => debug!(conn, node = %a.node, reason, "client disconnected"),
            None => debug!(conn, reason, "connection closed before admission"),
        }
    }

    fn handle(&mut self, event: NetEvent) -> Result<(), NodeError> {
        match event {
            NetEvent::Accepted { conn, .. } => {
                debug!(conn, remote = %self.net.remote(conn), "connection accepted");
                match fresh_nonce() {
                    Ok(nonce) => {
                        let now = self.clock.now();
                        self.conns.accepted(now, conn, nonce, &mut self.actions);
                        self.conn_actions()?;
                    }
                    Err(e) => {
                        warn!(conn, error = %e, "connection closed: no nonce for its handshake");
                        self.net.close(conn);
                    }
                }
            }
            NetEvent::Closed(conn, reason) | NetEvent::Refused(conn, reason) => {
                self.log_closed(conn, &reason);
                if let Some(node) = self.conns.closed(self.clock.now(), conn) {
                    self.routes.disconnected(node);
                }
            }
            NetEvent::Frame(conn, payload) => self.frame(conn, &payload)?,
            NetEvent::Connected(_) => {}
        }
        Ok(())
    }

    fn frame(&mut self, conn: ConnId, payload: &[u8]) -> Result<(), NodeError> {
        let epoch = self.machine.epoch();
        let machine = &self.machine;
        let heard = self.conns.frame(
            self.clock.now(),
            conn,
            payload,
            &mut self.membership,
            &mut || machine.durable().named_nodes(),
            self.address,
            epoch,
            &mut self.actions,
        );
        self.conn_actions()?;
        match heard {
            DirHeard::Nothing => {}
            DirHeard::Host {
                conn,
                listen,
                admitted,
                forgot,
            } => {
                if let Some(f) = forgot {
                    log_forgotten(&f, self.membership.len(), self.metrics.as_ref());
                }
                let m = admitted.member();
                info!(
                    conn,
                    remote = %self.net.remote(conn),
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
                self.routes.connected(m.node, m.incarnation);
            }
            DirHeard::HostRefused {
                conn,
                listen,
                reason,
            } => {
                info!(conn, remote = %self.net.remote(conn), %listen, %reason, "host refused");
            }
            DirHeard::Client { conn, node } => {
                debug!(conn, remote = %self.net.remote(conn), %node, "client admitted");
                self.routes.connected(node, 1);
            }
            DirHeard::Envelope(envelope) => {
                self.check_space()?;
                let now = self.clock.now();
                let handed = WallInstant::now();
                let written = self.log.written();
                if self
                    .machine
                    .handle_message(now, envelope.message, &mut self.outbox)
                    .is_ok()
                {
                    self.step_effects()?;
                }
                if self.log.written() > written
                    && let Some(metrics) = &self.metrics
                {
                    metrics.mutations.inc();
                    self.awaiting_sync.push(handed);
                }
            }
            DirHeard::Protocol { node, .. } => self.routes.disconnected(node),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legacy_membership_file_imports_as_the_same_table() {
        let mut legacy = LegacyMembership {
            boots: 4,
            next_node: 3,
            hosts: BTreeMap::new(),
        };
        for (listen, node, incarnation) in [("a:1", 1, 3), ("b:1", 2, 1)] {
            legacy.hosts.insert(
                listen.to_owned(),
                HostRecord {
                    node: NodeId(node),
                    incarnation,
                    boot_nonce: 9,
                },
            );
        }
        // What an earlier version wrote reads back, and restates as records.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("membership");
        write_state(&path, &legacy).unwrap();
        let read: LegacyMembership = read_state(&path).unwrap().unwrap();
        let mut m = Membership::recover(&import_legacy(&read)).unwrap();
        assert_eq!(m.boots(), 4);
        let hosts: Vec<(String, u64, u64)> = m
            .hosts()
            .map(|(l, h)| (l.to_owned(), h.node.0, h.incarnation))
            .collect();
        assert_eq!(
            hosts,
            vec![("a:1".to_owned(), 1, 3), ("b:1".to_owned(), 2, 1)]
        );
        // The next boot and the next new host go on from the file's numbers.
        m.boot();
        assert_eq!(m.boots(), 5);
        let (new, _) = m.admit("c:1", 1).unwrap();
        assert_eq!(new.member().node, NodeId(3));
    }

    /// A disk that refuses every write is not mended by a restart: the stop message says what
    /// to mend (found by remounting a directory's ext4 file system read-only under put load:
    /// it stopped, and every restart stopped again, saying "restart it to recover").
    #[test]
    fn a_stop_for_a_disk_that_refuses_writes_says_what_to_mend() {
        let stop = |kind: std::io::ErrorKind| {
            NodeError::Log(LogError::Io {
                op: "write log",
                path: PathBuf::from("/data/log/log-0"),
                source: std::io::Error::from(kind),
            })
            .to_string()
        };
        let read_only = stop(std::io::ErrorKind::ReadOnlyFilesystem);
        assert!(
            read_only.contains("write log failed on /data/log/log-0"),
            "{read_only}"
        );
        assert!(
            read_only.contains("file system is read-only"),
            "{read_only}"
        );
        assert!(!read_only.contains("restart it to recover"), "{read_only}");
        let full = stop(std::io::ErrorKind::StorageFull);
        assert!(full.contains("free space"), "{full}");
        assert!(!full.contains("restart it to recover"), "{full}");
        let denied = stop(std::io::ErrorKind::PermissionDenied);
        assert!(
            denied.contains("may not change the data directory"),
            "{denied}"
        );
        // Any other failure (an EIO from a sync, say) is what a restart recovers from.
        let other = stop(std::io::ErrorKind::Other);
        assert!(
            other.ends_with("(the node stops; restart it to recover)"),
            "{other}"
        );
    }
}

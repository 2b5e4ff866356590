//! The discrete-event world: a priority queue of (time, sequence) events, the network, the
//! directory node with its disk, the host nodes, the fault schedule and the phases of a run.
//!
//! Nothing sleeps: time jumps to the next event. Every random draw comes from the seed's
//! streams, so a seed replays the same run event for event (the trace hash proves it).
//!
//! The directory's effects are executed with the `Persist` barrier: records are appended to the
//! simulated disk at once, an fsync is started (group commit: one sync covers everything
//! written when it started), and every later effect waits in order until the sync that covers
//! the record before it completes.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use dataplane_core::barrier::Barrier;
use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::host::{Host, HostConfig, SessionConfig};
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::log::{FRAME_HEADER_BYTES, append_record, decode_log, encode_log};
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::routes::Routes;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{Envelope, Message};

use crate::check::{Checker, DirInput, ProxyInput};
use crate::client::Io;
use crate::host::{HostNode, HostOutput};
use crate::options::{Options, Recurring};
use crate::rng::{SimRng, Stream};
use crate::trace::Trace;
use crate::worker::{HOST_FIRST_ACTOR, Worker, WorkerIo, WorkerOut, WorkerState};

/// The directory's node.
pub const DIRECTORY_NODE: NodeId = NodeId(0);
/// The address clients send directory calls to (the node routes it to the current instance).
pub const DIRECTORY: Address = Address::new(DIRECTORY_NODE, 0, 0);
/// Most events one run may process before it is declared runaway.
pub const EVENT_BUDGET: u64 = 20_000_000;
/// The log is compacted once it reaches twice its size after the last compaction, and at
/// least this size.
const COMPACT_MIN_BYTES: usize = 64 * 1024;
/// Latency of a frame between two actors of one node (reliable and in order).
const LOCAL_LATENCY: Duration = Duration::from_micros(20);

/// An input of a host machine (built once per step and consumed at once, like `DirInput`).
#[allow(clippy::large_enum_variant)]
enum MachineInput {
    Message(Address, Address, Message),
    Tick,
    ProxyRestarted,
    /// The supervisor revokes this session.
    Revoke(Address),
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
    HostCrash,
    HostRestart(usize),
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
    ActorDeath,
    Revocation,
    Heal,
    End,
}

#[derive(Debug)]
struct Event {
    at: Instant,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so the `BinaryHeap` pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
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
    /// Host crashes.
    pub host_crashes: u64,
    /// Partitions started.
    pub partitions: u64,
    /// Route flaps started.
    pub route_flaps: u64,
    /// Actors that died on their own.
    pub actor_deaths: u64,
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
    /// The most bytes the simulated log held (compaction rewrites it as a snapshot).
    pub log_bytes_max: u64,
}

/// The directory node: the machine, its disk and the effects held behind the barrier.
#[derive(Debug)]
struct DirectoryNode {
    machine: Option<Directory>,
    boot: u64,
    disk: Vec<u8>,
    synced: usize,
    sync: Option<(u64, usize)>,
    sync_generation: u64,
    barrier: Barrier,
    unsynced_steps: VecDeque<(u64, usize)>,
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
    compacted_len: usize,
}

impl DirectoryNode {
    fn address(&self) -> Address {
        Address::new(DIRECTORY_NODE, self.boot, 0)
    }
}

/// One simulated run.
#[derive(Debug)]
pub struct World {
    options: Options,
    now: Instant,
    queue: BinaryHeap<Event>,
    seq: u64,
    net_rng: SimRng,
    fault_rng: SimRng,
    work_rng: SimRng,
    disk_rng: SimRng,
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

impl World {
    /// Builds the world of `options`; `trace_text` keeps a readable event log.
    pub fn new(options: Options, trace_text: bool) -> World {
        let seed = options.seed;
        let mut first_global = 0;
        let hosts = options
            .clients_per_host
            .iter()
            .enumerate()
            .map(|(i, &clients)| {
                let host = HostNode::new(NodeId(1 + i as u64), clients, first_global);
                first_global += clients;
                host
            })
            .collect();
        let heal_at = Instant::ZERO.saturating_add(options.fault_phase);
        let end_at = heal_at.saturating_add(options.liveness_bound);
        let checker = Checker::new(&options);
        World {
            now: Instant::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            net_rng: SimRng::new(seed, Stream::Network),
            fault_rng: SimRng::new(seed, Stream::Faults),
            work_rng: SimRng::new(seed, Stream::Workload),
            disk_rng: SimRng::new(seed, Stream::Disk),
            directory: DirectoryNode {
                machine: None,
                boot: 0,
                disk: Vec::new(),
                synced: 0,
                sync: None,
                sync_generation: 0,
                barrier: Barrier::new(0),
                unsynced_steps: VecDeque::new(),
                step: 0,
                timer_generation: 0,
                routes: Routes::new(),
                route_versions: BTreeMap::new(),
                route_version: 0,
                compacted_len: 0,
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
            stats: Stats::default(),
            checker,
            trace: Trace::new(trace_text),
            options,
        }
    }

    fn schedule(&mut self, at: Instant, kind: EventKind) {
        self.seq += 1;
        self.queue.push(Event {
            at,
            seq: self.seq,
            kind,
        });
    }

    fn schedule_in(&mut self, delay: Duration, kind: EventKind) {
        self.schedule(self.now.saturating_add(delay), kind);
    }

    /// Runs to the end and returns how it went.
    pub fn run(mut self) -> (Outcome, World) {
        self.start();
        if self.options.long_life.is_some() {
            self.checker.coverage.hit("regime.long_life");
        }
        while let Some(event) = self.queue.pop() {
            self.now = event.at;
            self.stats.events += 1;
            self.trace
                .event(event.at, event.seq, &event.kind, |kind| match kind {
                    EventKind::Deliver(e) => {
                        format!(
                            "deliver {} -> {}: {}",
                            e.from,
                            e.to,
                            crate::trace::describe(&e.message)
                        )
                    }
                    EventKind::Local { envelope: e, .. } => {
                        format!(
                            "local {} -> {}: {}",
                            e.from,
                            e.to,
                            crate::trace::describe(&e.message)
                        )
                    }
                    EventKind::HostSend { envelope: e, .. } => {
                        format!(
                            "send {} -> {}: {}",
                            e.from,
                            e.to,
                            crate::trace::describe(&e.message)
                        )
                    }
                    other => format!("{other:?}"),
                });
            if self.stats.events > EVENT_BUDGET {
                self.checker
                    .fail(self.now, "event budget exhausted (runaway run)".into());
            }
            let end = event.kind == EventKind::End;
            self.handle(event.kind);
            if end || self.checker.failed() {
                break;
            }
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
            self.start_proxy(host);
            self.boot_machine(host);
        }
        for host in 0..self.hosts.len() {
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
            (self.options.proxy_restarts, EventKind::ProxyCrash),
            (self.options.authority_outages, EventKind::OutageStart),
        ];
        for (fault, kind) in recurring {
            if let Some(fault) = fault {
                self.schedule_next(fault, kind);
            }
        }
        self.schedule(self.heal_at, EventKind::Heal);
        self.schedule(self.end_at, EventKind::End);
    }

    fn schedule_next(&mut self, fault: Recurring, kind: EventKind) {
        let mean = fault.mean_interval.as_nanos() as f64;
        let delay = Duration::from_nanos(self.fault_rng.exponential(mean) as u64);
        if self.now.saturating_add(delay) < self.heal_at {
            self.schedule_in(delay, kind);
        }
    }

    fn handle(&mut self, kind: EventKind) {
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
                let newest =
                    d.routes.is_watched(&target) && d.route_versions.get(&target) == Some(&version);
                if d.machine.is_some() && d.boot == boot && newest {
                    self.directory_input(DirInput::Route { target, routable });
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
            EventKind::HostCrash => {
                let up: Vec<usize> = (0..self.hosts.len())
                    .filter(|&h| self.hosts[h].up)
                    .collect();
                if !up.is_empty() {
                    let host = *self.fault_rng.pick(&up);
                    self.stop_proxy(host);
                    self.hosts[host].crash();
                    self.stats.host_crashes += 1;
                    self.checker.host_crashed();
                    let max = self
                        .options
                        .host_crashes
                        .map_or(Duration::ZERO, |f| f.max_duration);
                    let down = uniform(&mut self.fault_rng, max);
                    self.schedule_in(down, EventKind::HostRestart(host));
                    self.report_routes();
                }
                if let Some(f) = self.options.host_crashes {
                    self.schedule_next(f, EventKind::HostCrash);
                }
            }
            EventKind::HostRestart(host) => self.restart_host(host),
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
                let h = &mut self.hosts[host];
                if h.up && h.incarnation == incarnation && h.agent_timer_generation == arming {
                    let mut out = HostOutput::default();
                    if let Err(error) =
                        h.agent
                            .handle_timer(self.now, Timer::AgentTick, &mut self.outbox)
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
            EventKind::Heal => self.heal(),
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
        let jitter = self
            .net_rng
            .exponential(n.latency_jitter_mean.as_nanos() as f64);
        n.latency_min
            .saturating_add(Duration::from_nanos(jitter as u64))
    }

    /// Hands a frame to the network: it may be lost, duplicated or delayed past later frames.
    fn send(&mut self, from: Address, to: Address, message: Message) {
        self.stats.frames += 1;
        let faulty = self.phase == Phase::Faulty;
        if !self.link_up(from.node, to.node)
            || (faulty && self.net_rng.chance(self.options.net.loss))
        {
            self.stats.lost += 1;
            self.checker.coverage.hit("fault.frame_lost");
            return;
        }
        let mut delay = self.latency();
        if faulty && self.net_rng.chance(self.options.net.reorder) {
            self.stats.reordered += 1;
            self.checker.coverage.hit("fault.frame_reordered");
            delay = delay.saturating_add(uniform(
                &mut self.net_rng,
                self.options.net.reorder_delay_max,
            ));
        }
        let envelope = Box::new(Envelope { from, to, message });
        if faulty && self.net_rng.chance(self.options.net.duplicate) && self.enqueue(from, to) {
            self.stats.duplicated += 1;
            self.checker.coverage.hit("fault.frame_duplicated");
            let again = self.latency().saturating_add(delay);
            self.schedule_in(again, EventKind::Deliver(envelope.clone()));
        }
        if self.enqueue(from, to) {
            self.schedule_in(delay, EventKind::Deliver(envelope));
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
        {
            let mut next_actor = self.hosts[host].next_actor;
            let mut io = Io {
                now: self.now,
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
                at,
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
                at,
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
        let mut next_actor = self.hosts[host].next_actor;
        let actions = {
            let mut io = Io {
                now: self.now,
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
            first_request_id: 1,
            pending_max: self
                .options
                .overload
                .as_ref()
                .map_or(dataplane_core::limits::PROXY_PENDING_MAX, |o| {
                    o.proxy_pending_max
                }),
        };
        let proxy = Proxy::new(config, self.now, &mut self.outbox);
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
        let now = self.now;
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
                        at,
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
        let Some(machine) = self.directory.machine.as_mut() else {
            return;
        };
        let now = self.now;
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
        self.checker
            .directory_step(now, self.directory.step, &input, &effects, machine);
        if effects.iter().any(|e| matches!(e, Effect::Persist(_))) {
            // Bindings change only with a commit.
            self.checker.sources_backed(now, machine, &self.hosts);
        }
        self.execute_directory_effects(effects);
    }

    fn execute_directory_effects(&mut self, mut effects: Vec<Effect>) {
        let mut ready = Vec::new();
        let d = &mut self.directory;
        let (disk, checker, now) = (&mut d.disk, &mut self.checker, self.now);
        let admitted = d.barrier.admit(
            effects.drain(..),
            d.synced as u64,
            |record| {
                if let Err(error) = append_record(disk, record) {
                    checker.fail(now, format!("log record does not encode: {error}"));
                }
                Ok::<u64, std::convert::Infallible>(disk.len() as u64)
            },
            &mut ready,
        );
        let Ok(()) = admitted;
        self.stats.log_bytes_max = self
            .stats
            .log_bytes_max
            .max(self.directory.disk.len() as u64);
        for effect in ready {
            self.execute_released(effect);
        }
        self.outbox.recycle(effects);
        let (step, end) = (self.directory.step, self.directory.disk.len());
        if end > self.directory.synced || !self.directory.unsynced_steps.is_empty() {
            self.directory.unsynced_steps.push_back((step, end));
        } else {
            self.checker.directory_synced(step);
        }
        // Syncs start only between steps, so every sync target is a step boundary (the
        // model's rollback on a crash is step-granular).
        if self.directory.sync.is_none() && end > self.directory.synced {
            self.start_sync();
        }
    }

    fn start_sync(&mut self) {
        let d = &self.options.disk;
        let latency = Duration::from_nanos(
            self.disk_rng
                .range(d.sync_min.as_nanos(), d.sync_max.as_nanos()),
        );
        self.directory.sync_generation += 1;
        let generation = self.directory.sync_generation;
        self.directory.sync = Some((generation, self.directory.disk.len()));
        let boot = self.directory.boot;
        self.schedule_in(latency, EventKind::DirSync { boot, generation });
    }

    fn sync_done(&mut self, boot: u64, generation: u64) {
        let d = &self.directory;
        let Some((current, target)) = d.sync else {
            return;
        };
        if d.machine.is_none() || d.boot != boot || current != generation {
            return;
        }
        if self.phase == Phase::Faulty && self.disk_rng.chance(self.options.disk.fsync_failure) {
            // Fail-stop: after a failed fsync the file's state is unknown.
            self.stats.fsync_failures += 1;
            self.checker.coverage.hit("fault.fsync_failure");
            self.crash_directory();
            return;
        }
        self.directory.sync = None;
        self.directory.synced = target;
        let mut durable_step = None;
        while let Some(&(step, end)) = self.directory.unsynced_steps.front() {
            if end > target {
                break;
            }
            durable_step = Some(step);
            self.directory.unsynced_steps.pop_front();
        }
        if let Some(step) = durable_step {
            self.checker.directory_synced(step);
        }
        let mut ready = Vec::new();
        self.directory.barrier.release(target as u64, &mut ready);
        for effect in ready {
            self.execute_released(effect);
        }
        if self.directory.disk.len() > self.directory.synced {
            self.start_sync();
        } else {
            self.maybe_compact();
        }
    }

    /// Compaction, as a node does it: when the log has doubled since the last snapshot and
    /// everything written is durable (so the durable state is the machine's), write the
    /// snapshot records as the whole new log. The replacement is atomic (write + rename), so a
    /// crash sees either the old log or the new one.
    fn maybe_compact(&mut self) {
        let d = &self.directory;
        let threshold = (2 * d.compacted_len).max(COMPACT_MIN_BYTES);
        if d.disk.len() < threshold || !d.unsynced_steps.is_empty() || d.barrier.waiting() {
            return;
        }
        let Some(machine) = d.machine.as_ref() else {
            return;
        };
        match encode_log(&machine.snapshot_records()) {
            Ok(image) => {
                let d = &mut self.directory;
                d.disk = image;
                d.synced = d.disk.len();
                d.barrier.clear(d.disk.len() as u64);
                d.compacted_len = d.disk.len();
                self.checker.coverage.hit("disk.compacted");
            }
            Err(error) => self
                .checker
                .fail(self.now, format!("snapshot does not encode: {error}")),
        }
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
                self.schedule(at, EventKind::DirTimer { boot, generation });
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
            h.up && h.incarnation == target.incarnation
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
            self.directory.route_version += 1;
            let version = self.directory.route_version;
            self.directory.route_versions.insert(target, version);
            let delay = Duration::from_micros(self.net_rng.range(100, 20_000));
            let boot = self.directory.boot;
            self.schedule_in(
                delay,
                EventKind::DirRoute {
                    boot,
                    target,
                    routable,
                    version,
                },
            );
        }
    }

    fn crash_directory(&mut self) {
        self.stats.directory_crashes += 1;
        self.checker.coverage.hit("fault.directory_crash");
        let d = &mut self.directory;
        d.machine = None;
        d.sync = None;
        d.routes = Routes::new();
        d.route_versions.clear();
        // What reaches the platter: everything synced, then each unsynced step with some
        // probability (in order), then possibly a torn fragment of the next record.
        let mut surviving = d.synced;
        let mut surviving_step = d.unsynced_steps.front().map_or(d.step, |(s, _)| s - 1);
        for &(step, end) in &d.unsynced_steps {
            if !self.disk_rng.chance(self.options.disk.unsynced_survives) {
                break;
            }
            surviving = end;
            surviving_step = step;
        }
        let lost_tail = d.disk.split_off(surviving);
        d.unsynced_steps.clear();
        if !lost_tail.is_empty() && self.disk_rng.chance(self.options.disk.torn_tail) {
            // Tear inside the first lost record, so no record of a lost step survives whole.
            let first_len = FRAME_HEADER_BYTES
                + u32::from_le_bytes([lost_tail[0], lost_tail[1], lost_tail[2], lost_tail[3]])
                    as usize;
            let cut = self.disk_rng.range(1, first_len as u64 - 1) as usize;
            d.disk.extend_from_slice(&lost_tail[..cut]);
            self.stats.torn_tails += 1;
            self.checker.coverage.hit("fault.torn_tail");
        }
        d.synced = d.disk.len();
        d.barrier.clear(d.disk.len() as u64);
        self.checker.directory_crashed(surviving_step);
        // Discovery notices the crash only after a while: until then proxies keep sending to
        // (and accepting the epoch of) the dead instance.
        let lag = uniform(&mut self.fault_rng, self.options.proxy.discovery_lag_max);
        let boot = self.directory.boot;
        self.schedule_in(lag, EventKind::AuthorityLost { boot });
        let max = self
            .options
            .directory_crashes
            .map_or(Duration::from_millis(1), |f| f.max_duration);
        let down = uniform(&mut self.fault_rng, max);
        self.schedule_in(down, EventKind::DirRestart);
    }

    fn restart_directory(&mut self) {
        let d = &mut self.directory;
        d.boot += 1;
        let decoded = decode_log(&d.disk);
        if decoded.defect.is_some() {
            self.checker.coverage.hit("recovery.cut_torn_tail");
        }
        d.disk.truncate(decoded.valid_len);
        d.synced = d.disk.len();
        d.barrier.clear(d.disk.len() as u64);
        d.timer_generation += 1;
        let config = DirectoryConfig {
            address: d.address(),
            retry_period: self.options.directory_retry,
            limits: Default::default(),
        };
        let recovered = Directory::recover(
            config,
            &decoded.records,
            &mut ActorSources,
            self.now,
            &mut self.outbox,
        );
        match recovered {
            Ok(machine) => {
                let effects = self.outbox.take();
                self.directory.step += 1;
                self.checker
                    .directory_recovered(self.now, self.directory.step, &effects, &machine);
                self.announced = Some(Discovered {
                    address: self.directory.address(),
                    epoch: machine.epoch(),
                });
                self.directory.machine = Some(machine);
                self.execute_directory_effects(effects);
                self.publish_discovery();
            }
            Err(error) => self
                .checker
                .fail(self.now, format!("directory recovery failed: {error}")),
        }
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
        config.call_guard = guard;
        config.first_actor = HOST_FIRST_ACTOR;
        config.tick = Duration::from_millis(100);
        if let Some(o) = &self.options.overload {
            config.operations_max = o.host_operations_max;
            config.session_operations_max = o.session_operations_max;
        }
        let machine = Host::new(config, self.now, &mut self.outbox);
        h.machine = Some(machine);
        h.mem = crate::memory::SimArena::new(o.arena_size as usize);
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
            now: self.now,
            rng: &mut self.work_rng,
            options: &self.options.host,
            paths: &self.options.paths,
            mem: &mut h.mem,
            arena_generation,
            overload: self.options.overload.as_ref(),
            explains: crate::worker::Explanations::of(&self.options),
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
            now: self.now,
            rng: &mut self.work_rng,
            options: &self.options.host,
            paths: &self.options.paths,
            mem: &mut h.mem,
            arena_generation,
            overload: self.options.overload.as_ref(),
            explains: crate::worker::Explanations::of(&self.options),
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

    /// Once the load stopped and every child on `host` closed, a new child must be served
    /// (issue 11: tables drain, and new requests succeed within a bound).
    fn maybe_probe(&mut self, host: usize) {
        let h = &self.hosts[host];
        let quiet = h.workers.iter().all(|w| w.state == WorkerState::Closed);
        if self.phase == Phase::Healed && h.up && h.machine.is_some() && quiet && !h.probed {
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
                at,
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
            self.checker
                .host_note(self.now, note, self.directory.machine.as_ref());
        }
    }

    fn machine_input(&mut self, host: usize, input: MachineInput) {
        let now = self.now;
        let proxy = self.hosts[host].proxy_address();
        let h = &mut self.hosts[host];
        let Some(machine) = h.machine.as_mut() else {
            return;
        };
        // H-D6/S34: a source the namespace binds ends only with the directory's Retire to it.
        let bound_before: Vec<u64> = machine
            .bindings()
            .filter_map(|(_, b)| match b.namespace {
                dataplane_core::host::NamespaceHold::Bound { source, .. } => Some(source),
                _ => None,
            })
            .collect();
        let retired = match &input {
            MachineInput::Message(_, to, Message::Retire { .. }) => Some(to.actor),
            _ => None,
        };
        let on_tick = matches!(input, MachineInput::Tick);
        if let MachineInput::Message(_, to, Message::Reply(reply)) = &input
            && let Some(dataplane_core::error::NamespaceError::OperationExpired(op)) =
                reply.body.err()
        {
            // A host re-sends a call until its answer is definitive and replays nothing it
            // finished: its operations are pruned only once it declared them done.
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
        };
        if let Err(error) = result {
            self.checker.fail(
                now,
                format!("a host refused an input it should accept: {error}"),
            );
            return;
        }
        if let Some(gone) = bound_before
            .iter()
            .find(|s| machine.source(**s).is_none() && retired != Some(**s))
        {
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
                        at,
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

    fn restart_host(&mut self, host: usize) {
        if self.hosts[host].up {
            return;
        }
        let clients = self.options.clients_per_host[host] as usize;
        let mut out = HostOutput::default();
        self.hosts[host].restart(self.now, clients, &mut out);
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

    fn kill_random_actor(&mut self) {
        let up: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].up)
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
        let report = self.fault_rng.chance(0.5);
        let h = &mut self.hosts[host];
        h.sources.remove(&actor);
        h.endpoints.remove(&actor);
        self.stats.actor_deaths += 1;
        self.checker.coverage.hit("fault.actor_death");
        if report {
            let scope = dataplane_core::wire::GoneScope::Address(address);
            if h.agent.report(self.now, scope, &mut self.outbox) {
                self.checker.coverage.hit("agent.reported_actor");
            }
            let effects = self.outbox.take();
            let mut out = HostOutput::default();
            self.hosts[host].agent_effects(effects, &mut out);
            self.host_output(host, out);
        }
    }

    /// The supervisor of a random running host revokes a random attached worker's session.
    fn revoke_random_session(&mut self) {
        let candidates: Vec<(usize, Address)> = self
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.up && h.machine.is_some())
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
        self.machine_input(host, MachineInput::Revoke(session));
    }

    fn heal(&mut self) {
        self.phase = Phase::Healed;
        self.checker.healed(self.now);
        self.blocked.clear();
        for target in std::mem::take(&mut self.flapped) {
            self.directory.routes.set_lost(target, false);
        }
        self.outages = 0;
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

//! A host node: simulated clients, the node's namespace proxy, the actors the clients create
//! (blob sources and stream endpoints), the host machine (`dataplane_core::host::Host`) with the
//! arena memory its workers map, the workers (simulated child processes), and a node agent.
//!
//! The agent is the long-lived responder of DESIGN.md Q5/Q8: it answers `Retire` and
//! `Displaced` for actors that no longer exist (retired, died, or from an earlier incarnation of
//! the node) with the acknowledgement, and after a restart it reports the previous incarnation
//! gone (`AddressGone{NodeBefore}`), re-sending until the directory acknowledges.

use std::collections::{BTreeMap, BTreeSet};

use dataplane_core::agent::{Agent, AgentConfig, acknowledgement};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::host::WithFiles;
use dataplane_core::ids::{Address, NodeId, PERSISTENT_INCARNATION};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{Capability, Message};

use crate::client::{Action, Client, Io};
use crate::worker::{HOST_FIRST_ACTOR, WORKER_BASE, WORKER_LIMIT, Worker};
use crate::world::DIRECTORY;

/// The capability worker `global` presents (its session is created expecting it).
pub fn capability(global: u32) -> Capability {
    let mut bytes = [0x5c; 32];
    bytes[..4].copy_from_slice(&global.to_le_bytes());
    Capability(bytes)
}

/// Actor number of the node agent.
pub const AGENT: u64 = 0;
/// How often the agent re-sends a gone report the directory has not acknowledged.
pub const AGENT_PERIOD: Duration = Duration::from_secs(1);

fn agent_config(node: NodeId, incarnation: u64) -> AgentConfig {
    AgentConfig {
        address: Address::new(node, incarnation, AGENT),
        directory: DIRECTORY,
        period: AGENT_PERIOD,
    }
}
/// Actor numbers of successive proxy instances start here (a restarted proxy gets a new
/// address, so late replies to its predecessor are recognisably stale).
pub const PROXY_BASE: u64 = 500;
/// First actor number handed to sources and endpoints.
pub const FIRST_SPAWNED: u64 = 1_000;
/// How many proxy addresses there are before they are reused.
pub const PROXY_ADDRESSES: u64 = FIRST_SPAWNED - PROXY_BASE;

/// One host node.
#[derive(Clone, Debug)]
pub struct HostNode {
    /// The node id.
    pub node: NodeId,
    /// Boot count; addresses carry it.
    pub incarnation: u64,
    /// Whether the node is running.
    pub up: bool,
    /// The clients (actor numbers 1..=n).
    pub clients: Vec<Client>,
    /// Live blob sources (actor numbers).
    pub sources: BTreeSet<u64>,
    /// Live stream endpoints → the client that owns them.
    pub endpoints: BTreeMap<u64, usize>,
    /// The next actor number to hand out.
    pub next_actor: u64,
    /// The node agent of the current incarnation (core's, as `dataplane-node` runs it).
    pub agent: Agent,
    /// Arming of the agent's tick (a fired tick of an older arming is stale).
    pub agent_timer_generation: u64,
    /// The node's proxy, while it runs.
    pub proxy: Option<dataplane_core::proxy::Proxy>,
    /// How many proxies this incarnation started (the current one's number).
    pub proxy_generation: u64,
    /// The newest discovery answer applied to the current proxy.
    pub discovery_version: u64,
    /// Arming of the proxy's timer (a fired timer of an older arming is stale).
    pub proxy_timer_generation: u64,
    /// The host machine, while the node runs.
    pub machine: Option<dataplane_core::host::Host>,
    /// The arena its workers map (lost with the node), and the node's files (file blobs:
    /// they and the saved table of file blobs outlive the node's restarts).
    pub mem: WithFiles<crate::memory::SimArena>,
    /// Arming of the host machine's tick.
    pub host_timer_generation: u64,
    /// The workers, by slot (a closed worker is replaced by a new one in its slot).
    pub workers: Vec<Worker>,
    /// The next child actor number.
    pub next_worker_actor: u64,
    /// Whether this incarnation started its probe child (after the heal).
    pub probed: bool,
    /// The boot nonce of the current (or next) start: the directory's membership tells a
    /// restart from a reconnection by it, as `dataplane-node`'s hello carries it.
    pub boot_nonce: u64,
    first_client_global: u32,
}

/// What a host asks the world to do after handling an input.
#[derive(Debug, Default)]
pub struct HostOutput {
    /// Frames to send: (from, to, message).
    pub sends: Vec<(Address, Address, Message)>,
    /// Client wake-ups to schedule: (client index, generation, at).
    pub wakes: Vec<(usize, u64, Instant)>,
    /// Frames for actors of this node (delivered locally, in order): (from, to, message).
    pub local: Vec<(Address, Address, Message)>,
    /// Frames for the node's proxy, to be handled by the world.
    pub to_proxy: Vec<Message>,
    /// Frames for the host machine: (from, to, message).
    pub to_machine: Vec<(Address, Address, Message)>,
    /// Frames for workers: (worker slot, message).
    pub to_worker: Vec<(usize, Message)>,
    /// Frames to send later (slow acknowledgements): (delay, from, to, message).
    pub delayed: Vec<(Duration, Address, Address, Message)>,
    /// The agent's tick to schedule: (arming, at).
    pub agent_tick: Option<(u64, Instant)>,
    /// Effects a machine emitted that this node cannot perform (a checker failure).
    pub unexpected: Vec<Effect>,
}

impl HostNode {
    /// A host with `clients` clients whose global numbers start at `first_client_global`.
    pub fn new(node: NodeId, clients: u32, first_client_global: u32) -> Self {
        let mut host = HostNode {
            node,
            incarnation: 1,
            up: true,
            clients: Vec::new(),
            sources: BTreeSet::new(),
            endpoints: BTreeMap::new(),
            next_actor: FIRST_SPAWNED,
            agent: Agent::boot(agent_config(node, 1), Instant::ZERO, &mut Outbox::new()),
            agent_timer_generation: 0,
            proxy: None,
            proxy_generation: 0,
            discovery_version: 0,
            proxy_timer_generation: 0,
            machine: None,
            mem: WithFiles::default(),
            host_timer_generation: 0,
            workers: Vec::new(),
            next_worker_actor: WORKER_BASE,
            probed: false,
            boot_nonce: 1,
            first_client_global,
        };
        host.spawn_clients(clients as usize);
        host
    }

    fn spawn_clients(&mut self, count: usize) {
        self.clients = (0..count)
            .map(|i| {
                let address = Address::new(self.node, self.incarnation, 1 + i as u64);
                Client::new(address, self.first_client_global + i as u32)
            })
            .collect();
    }

    /// The agent's address.
    pub fn agent(&self) -> Address {
        Address::new(self.node, self.incarnation, AGENT)
    }

    /// The node stops: every actor and all volatile state is lost.
    pub fn crash(&mut self) {
        self.up = false;
        self.clients.clear();
        self.sources.clear();
        self.endpoints.clear();
        self.agent_timer_generation += 1;
        self.proxy = None;
        self.machine = None;
        // The arena goes; the disk stays.
        self.mem.memory = crate::memory::SimArena::default();
        self.workers.clear();
    }

    /// A host that joins the cluster later (churn): not running, and never welcomed, so its
    /// first welcome is incarnation 1 or more (a boot that died in its handshake may have been
    /// admitted first).
    pub fn not_yet_joined(&mut self) {
        self.crash();
        self.incarnation = 0;
        self.boot_nonce = 0;
    }

    /// A fresh child address, if the node has numbers left.
    pub fn next_child_address(&mut self) -> Option<Address> {
        (self.next_worker_actor < WORKER_LIMIT).then(|| {
            let actor = self.next_worker_actor;
            self.next_worker_actor += 1;
            Address::new(self.node, self.incarnation, actor)
        })
    }

    /// The address of the current proxy instance.
    pub fn proxy_address(&self) -> Address {
        Address::new(
            self.node,
            self.incarnation,
            // Wrapping: a long-life seed with frequent proxy restarts takes the generation
            // past 500, and the 500th proxy's address was a spawned source's, so its frames
            // were routed to nothing and the node went silent for good (seed 4297). A reused
            // address is safe: each proxy starts its request ids above those of every earlier
            // proxy at that address (`World::start_proxy`), as a real driver's boot counter
            // does.
            PROXY_BASE + self.proxy_generation % PROXY_ADDRESSES,
        )
    }

    /// The node boots into `incarnation`, the one the directory's membership admitted it
    /// with, and reports the previous ones gone.
    pub fn restart(
        &mut self,
        now: Instant,
        incarnation: u64,
        client_count: usize,
        out: &mut HostOutput,
    ) {
        self.incarnation = incarnation;
        self.up = true;
        self.next_actor = FIRST_SPAWNED;
        self.next_worker_actor = WORKER_BASE;
        self.probed = false;
        self.proxy_generation = 0;
        self.discovery_version = 0;
        self.spawn_clients(client_count);
        let mut boot = Outbox::new();
        self.agent = Agent::boot(agent_config(self.node, self.incarnation), now, &mut boot);
        self.agent_effects(boot.take(), out);
    }

    /// Performs the agent's effects: frames go out from its address, its tick is armed or
    /// disarmed.
    pub fn agent_effects(&mut self, effects: Vec<Effect>, out: &mut HostOutput) {
        let from = self.agent.address();
        for effect in effects {
            match effect {
                Effect::Send { to, message } => out.sends.push((from, to, message)),
                Effect::SetTimer {
                    timer: Timer::AgentTick,
                    at,
                } => {
                    self.agent_timer_generation += 1;
                    out.agent_tick = Some((self.agent_timer_generation, at));
                }
                Effect::CancelTimer {
                    timer: Timer::AgentTick,
                } => {
                    self.agent_timer_generation += 1;
                    out.agent_tick = None;
                }
                other => out.unexpected.push(other),
            }
        }
    }

    /// Whether `address` names a live actor of this node.
    pub fn is_live(&self, address: &Address) -> bool {
        if address.incarnation == PERSISTENT_INCARNATION {
            return self.up
                && address.node == self.node
                && self
                    .machine
                    .as_ref()
                    .is_some_and(|m| m.file_blobs().any(|f| f.actor == address.actor));
        }
        self.up
            && address.node == self.node
            && address.incarnation == self.incarnation
            && (address.actor == AGENT
                || (address.actor as usize) <= self.clients.len()
                || self.sources.contains(&address.actor)
                || self.endpoints.contains_key(&address.actor)
                || (address.actor >= HOST_FIRST_ACTOR
                    && self
                        .machine
                        .as_ref()
                        .is_some_and(|m| m.source(address.actor).is_some())))
    }

    /// Executes a client's actions.
    pub fn apply_actions(&mut self, client: usize, actions: Vec<Action>, out: &mut HostOutput) {
        let from = self.clients[client].address;
        for action in actions {
            match action {
                Action::Call(call) => {
                    let proxy = self.proxy_address();
                    out.local.push((from, proxy, Message::ProxyCall(call)));
                }
                Action::CancelPending => {
                    let proxy = self.proxy_address();
                    out.local
                        .push((from, proxy, Message::ProxyCancel { reply_to: from }));
                }
                Action::SpawnSource(a) => {
                    self.sources.insert(a.actor);
                }
                Action::StopSource(a) => {
                    self.sources.remove(&a.actor);
                }
                Action::SpawnEndpoint(a) => {
                    self.endpoints.insert(a.actor, client);
                }
                Action::StopEndpoint(a) => {
                    self.endpoints.remove(&a.actor);
                }
                Action::WakeAt(at) => {
                    let c = &mut self.clients[client];
                    c.wake_generation += 1;
                    out.wakes.push((client, c.wake_generation, at));
                }
            }
        }
    }

    /// Delivers a frame addressed to this node. `io` is the client context (its action list
    /// must be empty).
    pub fn deliver(
        &mut self,
        from: Address,
        to: Address,
        message: Message,
        io: &mut Io<'_>,
        out: &mut HostOutput,
    ) {
        if !self.up {
            return;
        }
        let incarnation = self.incarnation;
        let ack = |message: &Message| acknowledgement(incarnation, to, message);
        if to.incarnation == PERSISTENT_INCARNATION {
            // A file blob's source: the host machine answers in every life of the node.
            if self.machine.is_some() {
                out.to_machine.push((from, to, message));
            }
            return;
        }
        if to.incarnation != self.incarnation {
            // An actor of an earlier life: the agent acknowledges on its behalf.
            if let Some((reply_to, reply)) = ack(&message) {
                out.sends.push((self.agent(), reply_to, reply));
            }
            return;
        }
        if to.actor >= PROXY_BASE && to.actor < FIRST_SPAWNED {
            // The current proxy, or a stale address of an earlier one.
            if to == self.proxy_address() && self.proxy.is_some() {
                out.to_proxy.push(message);
            }
            return;
        }
        if to.actor >= HOST_FIRST_ACTOR {
            if self.machine.is_some() {
                out.to_machine.push((from, to, message));
            }
            return;
        }
        if (WORKER_BASE..WORKER_LIMIT).contains(&to.actor) {
            if let Some(slot) = self.workers.iter().position(|w| w.address == to) {
                out.to_worker.push((slot, message));
            }
            return;
        }
        match to.actor {
            AGENT => {
                let mut agent_out = Outbox::new();
                if self.agent.handle_message(&message, &mut agent_out).is_ok() {
                    self.agent_effects(agent_out.take(), out);
                }
            }
            n if (n as usize) <= self.clients.len() && n >= 1 => {
                let index = n as usize - 1;
                if let Message::Reply(reply) = &message {
                    self.clients[index].reply(reply, io);
                    let actions = std::mem::take(&mut io.actions);
                    self.apply_actions(index, actions, out);
                }
            }
            actor => {
                let live = self.sources.contains(&actor) || self.endpoints.contains_key(&actor);
                if matches!(message, Message::Retire { .. }) {
                    // A live source stops serving; an unknown one is answered all the same.
                    self.sources.remove(&actor);
                }
                if matches!(message, Message::Displaced { .. })
                    && let Some(client) = self.endpoints.remove(&actor)
                {
                    self.clients[client].displaced(to, io);
                    let actions = std::mem::take(&mut io.actions);
                    self.apply_actions(client, actions, out);
                }
                if let Some((reply_to, reply)) = ack(&message) {
                    let max = io.options.ack_delay_max.as_nanos();
                    if live && max > 0 {
                        let delay = Duration::from_nanos(io.rng.range(0, max));
                        out.delayed.push((delay, to, reply_to, reply));
                    } else {
                        out.sends.push((to, reply_to, reply));
                    }
                }
            }
        }
    }
}

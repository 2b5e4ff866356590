//! A cluster of real machines for the host tests: a directory with its durable log, and nodes
//! that each run a proxy, a host and the arena memory its children map.
//!
//! The cluster owns the machines and their timers, not the network between them: every input
//! goes to one machine, and what that machine sends is appended, in order, to a caller-owned
//! `Vec<Frame>` for the caller to queue, lose, duplicate, tamper with or deliver. Who listens at
//! an address that is not a machine (children, a node agent, a dead actor) is the caller's
//! choice too. Core's host scenarios (`core/tests/host_scenarios.rs`) keep a FIFO network the
//! script controls; the `host_session` fuzz target (`fuzz/src/host.rs`) one the fuzzer
//! schedules, with hostile frames sent straight to the hosts.
//!
//! What the cluster does itself: it boots the directory from an empty log and node `n` (index
//! from 0) as `NodeId(n + 1)` with its proxy at actor 0 of the node's incarnation; persists the
//! directory's records into [`Cluster::log`]; answers the directory's route watches (an address
//! is routable while its node runs that incarnation); and panics when a proxy or a host asks for
//! an effect that is not a send or its own timer, or boots with anything but its timers. It
//! checks nothing after an input: each caller checks what it needs ([`Cluster::check_nodes`]
//! for the proxies' and hosts' own invariants) at its own step boundary.
//!
//! Deterministic: no clock (time moves only when the caller sets [`Cluster::now`]), no
//! randomness, ordered collections only.

use std::collections::BTreeSet;

use dataplane_core::directory::{ActorSources, Directory};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::InputError;
use dataplane_core::host::{Host, HostConfig, MemoryFiles, WithFiles};
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::log::LogRecord;
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::Message;

use crate::dir::{DIRECTORY, config};

/// A frame on the network: who sent it, to whom, what.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The sender: the directory, a proxy (actor 0), a host (its first actor) or whoever the
    /// caller says (a child). Hosts read it only on `FromChild` requests.
    pub from: Address,
    /// The recipient.
    pub to: Address,
    /// The message.
    pub message: Message,
}

/// One node: its proxy, its host and the arena memory the host and its children share.
#[derive(Debug)]
pub struct Node {
    /// `NodeId(index + 1)`.
    pub id: NodeId,
    /// The node's boot count, in every address of its proxy and host; [`Cluster::restart_node`]
    /// raises it.
    pub incarnation: u64,
    /// The proxy, at actor 0.
    pub proxy: Proxy,
    /// The host.
    pub host: Host,
    /// The arena memory (`Setup::arena` bytes, zeroed at boot) and the node's files, which
    /// outlive its restarts (file blobs, issue 17).
    pub mem: WithFiles<Vec<u8>>,
    /// When the proxy's retry timer fires, if armed.
    pub proxy_timer: Option<Instant>,
    /// When the host's tick fires, if armed.
    pub host_timer: Option<Instant>,
    /// How often the proxy booted (its request ids start at `proxy_boots × 1,000,000`, so a
    /// restarted proxy never reuses one).
    pub proxy_boots: u64,
}

/// How the nodes of a [`Cluster`] are set up.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// Bytes of arena memory per node, and the arena size `HostConfig::new` is given.
    pub arena: u64,
    /// The proxies' deadline (their retry period is 1 s).
    pub proxy_deadline: Duration,
    /// Changes each host's configuration from `HostConfig::new(node, incarnation, proxy,
    /// arena)` (tick, chunk size, deadlines, a smaller arena...).
    pub host_config: fn(HostConfig) -> HostConfig,
}

/// A machine whose timer is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The directory's retry timer.
    Directory,
    /// Node `n`'s proxy retry timer.
    Proxy(usize),
    /// Node `n`'s host tick.
    Host(usize),
}

/// The directory and the nodes.
#[derive(Debug)]
pub struct Cluster {
    /// The time of every input; only the caller moves it.
    pub now: Instant,
    /// The directory, at [`DIRECTORY`].
    pub dir: Directory,
    /// When the directory's retry timer fires, if armed.
    pub dir_timer: Option<Instant>,
    /// Every record the directory persisted (taken as durable at once).
    pub log: Vec<LogRecord>,
    /// The nodes, by index.
    pub nodes: Vec<Node>,
    /// The targets whose routes the directory watches.
    pub watched: BTreeSet<Address>,
    setup: Setup,
}

impl Cluster {
    /// A directory recovered from an empty log and `nodes` nodes at incarnation 1, each proxy
    /// told where the directory is; what they sent is appended to `sent`.
    pub fn new(nodes: usize, setup: Setup, sent: &mut Vec<Frame>) -> Cluster {
        let mut out = Outbox::new();
        let dir = Directory::recover(config(), &[], &mut ActorSources, Instant::ZERO, &mut out)
            .expect("a new directory");
        let mut cluster = Cluster {
            now: Instant::ZERO,
            dir,
            dir_timer: None,
            log: Vec::new(),
            nodes: Vec::new(),
            watched: BTreeSet::new(),
            setup,
        };
        cluster.dir_effects(out.take(), sent);
        for n in 0..nodes {
            let node = cluster.boot_node(NodeId(n as u64 + 1), 1, 1);
            cluster.nodes.push(node);
            cluster.discover(n, sent);
        }
        cluster
    }

    fn proxy_config(&self, id: NodeId, incarnation: u64, boots: u64) -> ProxyConfig {
        ProxyConfig {
            address: Address::new(id, incarnation, 0),
            retry_period: Duration::from_secs(1),
            deadline: self.setup.proxy_deadline,
            absent_read_wait: dataplane_core::proxy::DEFAULT_ABSENT_READ_WAIT,
            first_request_id: boots * 1_000_000,
            pending_max: dataplane_core::limits::PROXY_PENDING_MAX,
        }
    }

    fn boot_node(&self, id: NodeId, incarnation: u64, proxy_boots: u64) -> Node {
        let proxy_config = self.proxy_config(id, incarnation, proxy_boots);
        let proxy_address = proxy_config.address;
        let mut out = Outbox::new();
        let proxy = Proxy::new(proxy_config, self.now, &mut out);
        let arena = self.setup.arena;
        let config =
            (self.setup.host_config)(HostConfig::new(id, incarnation, proxy_address, arena));
        let host = Host::new(config, self.now, &mut out);
        let mut node = Node {
            id,
            incarnation,
            proxy,
            host,
            mem: WithFiles {
                memory: vec![0; arena as usize],
                files: MemoryFiles::default(),
            },
            proxy_timer: None,
            host_timer: None,
            proxy_boots,
        };
        for effect in out.take() {
            match effect {
                Effect::SetTimer {
                    timer: Timer::ProxyRetry,
                    at,
                } => node.proxy_timer = Some(at),
                Effect::SetTimer {
                    timer: Timer::HostTick,
                    at,
                } => node.host_timer = Some(at),
                other => panic!("unexpected boot effect {other:?}"),
            }
        }
        node
    }

    /// Node `n`'s proxy learns where the directory is.
    fn discover(&mut self, n: usize, sent: &mut Vec<Frame>) {
        let found = Some(Discovered {
            address: DIRECTORY,
            epoch: self.dir.epoch(),
        });
        let mut out = Outbox::new();
        self.nodes[n]
            .proxy
            .handle_discovery(self.now, found, &mut out);
        self.proxy_effects(n, out.take(), sent);
    }

    /// The node at `address`'s node id, whatever its incarnation.
    pub fn node_of(&self, address: Address) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == address.node)
    }

    /// Whether `target` runs: its node is up at `target`'s incarnation.
    pub fn routable(&self, target: Address) -> bool {
        self.node_of(target).is_some_and(|n| {
            self.nodes[n].incarnation == target.incarnation
                || target.incarnation == dataplane_core::ids::PERSISTENT_INCARNATION
        })
    }

    // ----- inputs -------------------------------------------------------------------------

    /// A message to the directory; its refusal is returned (the directory changed nothing).
    pub fn to_directory(
        &mut self,
        message: Message,
        sent: &mut Vec<Frame>,
    ) -> Result<(), InputError> {
        let mut out = Outbox::new();
        let result = self.dir.handle_message(self.now, message, &mut out);
        self.dir_effects(out.take(), sent);
        result
    }

    /// A message to node `n`'s proxy; its refusal is returned.
    pub fn to_proxy(
        &mut self,
        n: usize,
        message: Message,
        sent: &mut Vec<Frame>,
    ) -> Result<(), InputError> {
        let mut out = Outbox::new();
        let result = self.nodes[n]
            .proxy
            .handle_message(self.now, message, &mut out);
        self.proxy_effects(n, out.take(), sent);
        result
    }

    /// A frame from `from` to the host actor `to` of node `n`, on the node's arena memory; the
    /// host's typed refusal is returned.
    pub fn to_host(
        &mut self,
        n: usize,
        from: Address,
        to: Address,
        message: Message,
        sent: &mut Vec<Frame>,
    ) -> Result<(), InputError> {
        let mut out = Outbox::new();
        let node = &mut self.nodes[n];
        let result = node
            .host
            .handle_message(self.now, from, to, message, &mut node.mem, &mut out);
        self.host_effects(n, out.take(), sent);
        result
    }

    /// Node `n`'s host hears that the host of `node` refused a connection (nothing listens
    /// there).
    pub fn peer_refused(&mut self, n: usize, node: NodeId, sent: &mut Vec<Frame>) {
        let mut out = Outbox::new();
        let now = self.now;
        let host = &mut self.nodes[n];
        host.host
            .handle_peer_refused(now, node, &mut host.mem, &mut out);
        self.host_effects(n, out.take(), sent);
    }

    // ----- timers -------------------------------------------------------------------------

    /// Every armed timer, in a fixed order: the directory's, then each node's proxy and host.
    pub fn timers(&self) -> Vec<(Instant, Due)> {
        let mut timers: Vec<(Instant, Due)> = self
            .dir_timer
            .map(|at| (at, Due::Directory))
            .into_iter()
            .collect();
        for (n, node) in self.nodes.iter().enumerate() {
            timers.extend(node.proxy_timer.map(|at| (at, Due::Proxy(n))));
            timers.extend(node.host_timer.map(|at| (at, Due::Host(n))));
        }
        timers
    }

    /// The earliest armed timer (the first in [`Cluster::timers`]' order among equals).
    pub fn next_timer(&self) -> Option<(Instant, Due)> {
        self.timers()
            .into_iter()
            .reduce(|best, t| if t.0 < best.0 { t } else { best })
    }

    /// Fires `due`'s timer at [`Cluster::now`] (armed or not; it is disarmed first).
    pub fn fire(&mut self, due: Due, sent: &mut Vec<Frame>) {
        let mut out = Outbox::new();
        // A machine refuses only a timer of another kind, and each gets its own.
        match due {
            Due::Directory => {
                self.dir_timer = None;
                self.dir
                    .handle_timer(self.now, Timer::DirectoryRetry, &mut out)
                    .expect("the directory's retry");
                self.dir_effects(out.take(), sent);
            }
            Due::Proxy(n) => {
                self.nodes[n].proxy_timer = None;
                self.nodes[n]
                    .proxy
                    .handle_timer(self.now, Timer::ProxyRetry, &mut out)
                    .expect("the proxy's retry");
                self.proxy_effects(n, out.take(), sent);
            }
            Due::Host(n) => {
                self.nodes[n].host_timer = None;
                let node = &mut self.nodes[n];
                node.host
                    .handle_timer(self.now, Timer::HostTick, &mut node.mem, &mut out)
                    .expect("the host tick");
                self.host_effects(n, out.take(), sent);
            }
        }
    }

    // ----- restarts -----------------------------------------------------------------------

    /// Only the proxy of node `n` restarts (its pending table is lost) and finds the directory
    /// again; the host is told, and sends its calls again.
    pub fn restart_proxy(&mut self, n: usize, sent: &mut Vec<Frame>) {
        let node = &self.nodes[n];
        let boots = node.proxy_boots + 1;
        let config = self.proxy_config(node.id, node.incarnation, boots);
        let mut out = Outbox::new();
        self.nodes[n].proxy_boots = boots;
        self.nodes[n].proxy = Proxy::new(config, self.now, &mut out);
        self.proxy_effects(n, out.take(), sent);
        self.discover(n, sent);
        let mut out = Outbox::new();
        let proxy = self.nodes[n].proxy.config().address;
        self.nodes[n]
            .host
            .proxy_restarted(self.now, proxy, &mut out);
        self.host_effects(n, out.take(), sent);
    }

    /// Node `n` restarts: a new incarnation of its proxy and host with a fresh arena; the
    /// directory hears that the routes it watches to the node's earlier incarnations are down.
    /// (The node agent's `AddressGone` is the caller's to send: it crosses the network.)
    pub fn restart_node(&mut self, n: usize, sent: &mut Vec<Frame>) {
        let (id, incarnation) = (self.nodes[n].id, self.nodes[n].incarnation + 1);
        let boots = self.nodes[n].proxy_boots + 1;
        let files = std::mem::take(&mut self.nodes[n].mem.files);
        self.nodes[n] = self.boot_node(id, incarnation, boots);
        // The node's disk survives: its host serves its file blobs again.
        self.nodes[n].host.restore_files(files.saved().clone());
        self.nodes[n].mem.files = files;
        self.discover(n, sent);
        let gone: Vec<Address> = self
            .watched
            .iter()
            .copied()
            .filter(|a| a.node == id && a.incarnation < incarnation)
            .collect();
        for target in gone {
            let mut out = Outbox::new();
            self.dir.handle_route(self.now, target, false, &mut out);
            self.dir_effects(out.take(), sent);
        }
    }

    // ----- checks -------------------------------------------------------------------------

    /// Every proxy's and host's own `check_invariants()`; the error names the machine.
    pub fn check_nodes(&self) -> Result<(), String> {
        for (n, node) in self.nodes.iter().enumerate() {
            node.host
                .check_invariants()
                .map_err(|e| format!("host {n}: {e}"))?;
            node.proxy
                .check_invariants()
                .map_err(|e| format!("proxy {n}: {e}"))?;
        }
        Ok(())
    }

    // ----- effects ------------------------------------------------------------------------

    fn dir_effects(&mut self, effects: Vec<Effect>, sent: &mut Vec<Frame>) {
        for effect in effects {
            match effect {
                Effect::Persist(record) => self.log.push(record),
                Effect::Send { to, message } => sent.push(Frame {
                    from: DIRECTORY,
                    to,
                    message,
                }),
                Effect::SetTimer { at, .. } => self.dir_timer = Some(at),
                Effect::CancelTimer { .. } => self.dir_timer = None,
                Effect::WatchRoute { target } => {
                    self.watched.insert(target);
                    let routable = self.routable(target);
                    let mut out = Outbox::new();
                    self.dir.handle_route(self.now, target, routable, &mut out);
                    self.dir_effects(out.take(), sent);
                }
                Effect::UnwatchRoute { target } => {
                    self.watched.remove(&target);
                }
            }
        }
    }

    fn proxy_effects(&mut self, n: usize, effects: Vec<Effect>, sent: &mut Vec<Frame>) {
        let from = self.nodes[n].proxy.config().address;
        for effect in effects {
            match effect {
                Effect::Send { to, message } => sent.push(Frame { from, to, message }),
                Effect::SetTimer { at, .. } => self.nodes[n].proxy_timer = Some(at),
                Effect::CancelTimer { .. } => self.nodes[n].proxy_timer = None,
                other => panic!("unexpected proxy effect {other:?}"),
            }
        }
    }

    /// A host asks for nothing but sends and its tick.
    fn host_effects(&mut self, n: usize, effects: Vec<Effect>, sent: &mut Vec<Frame>) {
        let host = &self.nodes[n].host;
        let from = host.address(host.config().first_actor);
        for effect in effects {
            match effect {
                Effect::Send { to, message } => sent.push(Frame { from, to, message }),
                Effect::SetTimer {
                    timer: Timer::HostTick,
                    at,
                } => self.nodes[n].host_timer = Some(at),
                Effect::CancelTimer {
                    timer: Timer::HostTick,
                } => self.nodes[n].host_timer = None,
                other => panic!("the host asked for {other:?}"),
            }
        }
    }
}

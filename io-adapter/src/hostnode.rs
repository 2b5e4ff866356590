//! The host node: the node's namespace proxy and host machine, the shared arena its children
//! map, the Unix socket children connect to, and TCP links to the directory node and to the
//! other hosts.
//!
//! One driver thread owns the machines, the arena, the timers and the routing table; reader
//! and writer threads move frames (see [`crate::net`]). Frames between actors of this node
//! never leave the process: they go through a local queue, in order.
//!
//! **Children.** A child connects to the socket; the host opens a session for it and sends a
//! [`ChildWelcome`] with the arena's descriptor attached (`SCM_RIGHTS`); from then on the child
//! sends `ChildRequest`s and receives `ChildEvent`s as postcard frames. The session's capability
//! is a random value the host writes to `<socket>.cap` (mode 0600): a program that can read that
//! file may attach. When a child's connection ends, its session is closed on its behalf (its
//! views are gone: DESIGN Q24); published blobs stay.
//!
//! **Restarts.** The directory node assigns the node id and raises the incarnation when this
//! process is new (boot nonce). A host whose incarnation is above 1 reports its previous
//! incarnations gone (`AddressGone{NodeBefore}`), every second until the directory
//! acknowledges. If the directory connection drops, the proxy is told "no directory" and the
//! host reconnects with backoff; the new `Welcome` carries the new authority epoch.
//!
//! **Cluster key.** With [`HostOptions::cluster_key`] the host presents the key in its hellos to
//! the directory and to other hosts, and admits another host's connection only after a
//! `PeerHello` with the same key (one without is answered `Refused` and closed). Core frames
//! are taken only from the directory's connection and from admitted peers'. If the directory
//! refuses this host's key, [`run_host`] returns the error.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration as StdDuration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::host::{Host, HostConfig, SessionConfig};
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::path::{DataPath, JobContext};
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{Capability, ChildEvent, ChildRequest, Envelope, GoneScope, Message};
use serde::{Deserialize, Serialize};

use crate::arena::{SharedArena, send_with_fd};
use crate::driver::{Clock, random_u64};
use crate::frame::encode_frame;
use crate::net::{ClusterKey, Conn, ConnId, Event, Link, Peer, WRONG_KEY, spawn_tcp, spawn_unix};

/// The node agent's actor number (gone reports).
pub const AGENT_ACTOR: u64 = 0;
/// The proxy's actor number.
pub const PROXY_ACTOR: u64 = 1;
/// Child processes are numbered from here.
pub const FIRST_CHILD_ACTOR: u64 = 100;
/// Host machine actors are numbered from here.
pub const FIRST_HOST_ACTOR: u64 = 1 << 40;
/// Transfer chunk size between hosts (the most a chunk frame may carry).
pub const TRANSFER_CHUNK_BYTES: u32 = 256 * 1024;
/// Chunks a transfer keeps in flight: 4 MiB. Over loopback a round trip crosses four threads
/// (two drivers, a writer and a reader on each side), so the window must cover it; the `io`
/// bench measured 64 KiB x 8 at 1.25 GiB/s and 256 KiB x 16 at 1.4-1.5 GiB/s.
pub const TRANSFER_WINDOW: u32 = 16;
/// Events handled per batch.
const BATCH_MAX: usize = 1024;

/// How a host node is set up.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// The directory node (`host:port`).
    pub directory: String,
    /// Where other hosts connect (`host:port`); also this host's identity at the directory.
    pub listen: String,
    /// The Unix socket children connect to.
    pub socket: PathBuf,
    /// Arena size in bytes.
    pub arena_size: u64,
    /// Back the arena with this file instead of an anonymous memfd.
    pub arena_file: Option<PathBuf>,
    /// Prefixes children may read and write.
    pub allow: Vec<DataPath>,
    /// The proxy's request deadline.
    pub deadline: Duration,
    /// When set, presented in every hello and required of every other host.
    pub cluster_key: Option<ClusterKey>,
}

/// The first frame a child receives, with the arena's descriptor attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildWelcome {
    /// The child's own address.
    pub child: Address,
    /// Its session.
    pub session: Address,
    /// The arena generation to present at attach.
    pub arena_generation: u64,
    /// The arena's size (map this many bytes).
    pub arena_size: u64,
}

/// The capability file next to a socket.
pub fn capability_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".cap");
    PathBuf::from(name)
}

/// Why a host node stopped.
#[derive(Debug)]
pub enum HostError {
    /// Setting up failed (the arena, a socket, the capability file...).
    Setup(String),
    /// The directory refused this host's hello (its cluster key): a configuration error.
    Refused(String),
}

impl HostError {
    /// Whether the directory refused this host (rather than setup failing).
    pub fn refused(&self) -> bool {
        matches!(self, HostError::Refused(_))
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Setup(message) => f.write_str(message),
            HostError::Refused(reason) => write!(f, "the directory refused this host: {reason}"),
        }
    }
}

impl std::error::Error for HostError {}

#[allow(clippy::large_enum_variant)] // Frames dominate; see `Link`.
enum HostEvent {
    PeerAccepted(TcpStream),
    DirectoryConnected(TcpStream),
    Net(Event<Link>),
    ChildAccepted(UnixStream),
    Child(Event<ChildRequest>),
}

fn wrap_net(e: Event<Link>) -> HostEvent {
    HostEvent::Net(e)
}

fn wrap_child(e: Event<ChildRequest>) -> HostEvent {
    HostEvent::Child(e)
}

struct ChildConn {
    conn: Conn<ChildEvent>,
    address: Address,
    session: Address,
    closed: bool,
}

struct HostNode {
    options: HostOptions,
    clock: Clock,
    node: NodeId,
    incarnation: u64,
    proxy: Proxy,
    machine: Host,
    arena: SharedArena,
    capability: Capability,
    events: Sender<HostEvent>,
    outbox: Outbox,
    local: VecDeque<(Address, Address, Message)>,
    directory_conn: Option<ConnId>,
    conns: BTreeMap<ConnId, Conn<Link>>,
    peer_conns: BTreeMap<NodeId, ConnId>,
    conn_peer: BTreeMap<ConnId, NodeId>,
    peers: BTreeMap<NodeId, Peer>,
    children: BTreeMap<ConnId, ChildConn>,
    child_by_address: BTreeMap<Address, ConnId>,
    next_conn: ConnId,
    next_child: u64,
    next_session_generation: u64,
    proxy_timer: Option<Instant>,
    host_timer: Option<Instant>,
    gone_report: Option<(GoneScope, Instant)>,
    boot_nonce: u64,
    /// The directory refused this host (its reason); the node stops.
    refused: Option<String>,
}

fn connect(address: &str, timeout: StdDuration) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::other(format!("{address}: no address"));
    for a in address.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Connects to the directory in the background, with backoff, until it succeeds.
fn reconnect(directory: String, events: Sender<HostEvent>) {
    thread::spawn(move || {
        let mut backoff = StdDuration::from_millis(50);
        loop {
            if let Ok(stream) = connect(&directory, StdDuration::from_secs(1)) {
                let _ = events.send(HostEvent::DirectoryConnected(stream));
                return;
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(StdDuration::from_secs(2));
        }
    });
}

/// Runs a host node. Returns only on a setup failure or when the directory refuses this host.
pub fn run_host(options: HostOptions) -> Result<(), HostError> {
    let err = |what: &str, e: &dyn fmt::Display| HostError::Setup(format!("{what}: {e}"));
    let arena = match &options.arena_file {
        Some(path) => SharedArena::create_file(path, options.arena_size),
        None => SharedArena::create("dataplane-arena", options.arena_size),
    }
    .map_err(|e| err("arena", &e))?;
    let mut arena = arena;
    arena.prefault();
    let listener = TcpListener::bind(&options.listen).map_err(|e| err(&options.listen, &e))?;
    let _ = fs::remove_file(&options.socket);
    let children = UnixListener::bind(&options.socket)
        .map_err(|e| err(&options.socket.display().to_string(), &e))?;
    let mut capability = [0u8; 32];
    for chunk in capability.chunks_mut(8) {
        chunk.copy_from_slice(&random_u64().to_le_bytes());
    }
    let cap_path = capability_path(&options.socket);
    let _ = fs::remove_file(&cap_path);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&cap_path)
        .and_then(|mut f| f.write_all(&capability))
        .map_err(|e| err(&cap_path.display().to_string(), &e))?;
    let (events, inbox) = unbounded();
    let peer_events = events.clone();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            if peer_events.send(HostEvent::PeerAccepted(stream)).is_err() {
                return;
            }
        }
    });
    let child_events = events.clone();
    thread::spawn(move || {
        for stream in children.incoming().flatten() {
            if child_events.send(HostEvent::ChildAccepted(stream)).is_err() {
                return;
            }
        }
    });
    // The first Welcome tells us who we are.
    let boot_nonce = random_u64();
    let clock = Clock::new();
    let (stream, welcome) = loop {
        let Ok(stream) = connect(&options.directory, StdDuration::from_secs(1)) else {
            thread::sleep(StdDuration::from_millis(100));
            continue;
        };
        match first_welcome(&stream, &options.listen, boot_nonce, options.cluster_key) {
            Ok(Link::Refused { reason }) => {
                return Err(HostError::Refused(reason));
            }
            Ok(w) => break (stream, w),
            Err(_) => thread::sleep(StdDuration::from_millis(100)),
        }
    };
    let Link::Welcome {
        node,
        incarnation,
        directory,
        epoch,
        peers,
    } = welcome
    else {
        return Err(HostError::Setup("the directory did not welcome us".into()));
    };
    let proxy_address = Address::new(node, incarnation, PROXY_ACTOR);
    let mut outbox = Outbox::new();
    let proxy = Proxy::new(
        ProxyConfig {
            address: proxy_address,
            retry_period: Duration::from_secs(1),
            deadline: options.deadline,
            first_request_id: 1,
            pending_max: dataplane_core::limits::PROXY_PENDING_MAX,
        },
        clock.now(),
        &mut outbox,
    );
    let mut config = HostConfig::new(node, incarnation, proxy_address, options.arena_size);
    config.arena_generation = incarnation;
    config.first_actor = FIRST_HOST_ACTOR;
    config.chunk_bytes = TRANSFER_CHUNK_BYTES;
    config.window = TRANSFER_WINDOW;
    config.call_guard = options.deadline.saturating_add(Duration::from_secs(5));
    let machine = Host::new(config, clock.now(), &mut outbox);
    let mut host = HostNode {
        options,
        clock,
        node,
        incarnation,
        proxy,
        machine,
        arena,
        capability: Capability(capability),
        events,
        outbox,
        local: VecDeque::new(),
        directory_conn: None,
        conns: BTreeMap::new(),
        peer_conns: BTreeMap::new(),
        conn_peer: BTreeMap::new(),
        peers: BTreeMap::new(),
        children: BTreeMap::new(),
        child_by_address: BTreeMap::new(),
        next_conn: 1,
        next_child: FIRST_CHILD_ACTOR,
        next_session_generation: 1,
        proxy_timer: None,
        host_timer: None,
        gone_report: (incarnation > 1)
            .then_some((GoneScope::NodeBefore { node, incarnation }, Instant::ZERO)),
        boot_nonce,
        refused: None,
    };
    host.execute_boot_effects();
    host.set_peers(peers);
    host.directory_up(stream, directory, epoch);
    host.run(&inbox)
}

/// Sends the hello and reads the welcome synchronously (before the machines exist).
fn first_welcome(
    stream: &TcpStream,
    listen: &str,
    boot_nonce: u64,
    key: Option<ClusterKey>,
) -> std::io::Result<Link> {
    let mut w = stream;
    crate::frame::write_frame(
        &mut w,
        &Link::HostHello {
            listen: listen.to_owned(),
            boot_nonce,
            key,
        },
    )
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    stream.set_read_timeout(Some(StdDuration::from_secs(5)))?;
    // One frame only: read the prefix and the payload exactly, so nothing is over-read.
    let mut prefix = [0u8; 4];
    std::io::Read::read_exact(&mut w, &mut prefix)?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len > dataplane_core::limits::FRAME_BYTES_MAX {
        return Err(std::io::Error::other("oversized welcome"));
    }
    let mut payload = vec![0; len];
    std::io::Read::read_exact(&mut w, &mut payload)?;
    stream.set_read_timeout(None)?;
    dataplane_core::wire::decode_value(&payload, dataplane_core::limits::FRAME_BYTES_MAX)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

impl HostNode {
    fn execute_boot_effects(&mut self) {
        let effects = self.outbox.take();
        for effect in effects {
            self.perform(effect);
        }
    }

    /// Runs until the process's event sources are gone (never, in practice) or the directory
    /// refuses this host.
    fn run(&mut self, inbox: &Receiver<HostEvent>) -> Result<(), HostError> {
        loop {
            if let Some(reason) = self.refused.take() {
                return Err(HostError::Refused(reason));
            }
            let next = [
                self.proxy_timer,
                self.host_timer,
                self.gone_report.map(|(_, at)| at),
            ]
            .into_iter()
            .flatten()
            .min();
            let wait = next.map_or(StdDuration::from_secs(1), |at| self.clock.until(at));
            match inbox.recv_timeout(wait) {
                Ok(event) => self.handle(event),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            for _ in 0..BATCH_MAX {
                match inbox.try_recv() {
                    Ok(event) => self.handle(event),
                    Err(_) => break,
                }
                self.drain_local();
            }
            self.timers();
            self.drain_local();
        }
    }

    fn timers(&mut self) {
        let now = self.clock.now();
        if self.proxy_timer.is_some_and(|at| at <= now) {
            self.proxy_timer = None;
            let _ = self
                .proxy
                .handle_timer(now, Timer::ProxyRetry, &mut self.outbox);
            self.proxy_effects();
        }
        if self.host_timer.is_some_and(|at| at <= now) {
            self.host_timer = None;
            let mem = self.arena.as_mut_slice();
            let _ = self
                .machine
                .handle_timer(now, Timer::HostTick, mem, &mut self.outbox);
            self.host_effects();
        }
        if let Some((scope, at)) = self.gone_report
            && at <= now
        {
            let agent = Address::new(self.node, self.incarnation, AGENT_ACTOR);
            let message = Message::AddressGone {
                scope,
                reply_to: agent,
            };
            self.route(agent, Address::new(NodeId(0), 0, 0), message);
            self.gone_report = Some((scope, now.saturating_add(Duration::from_secs(1))));
        }
    }

    fn proxy_effects(&mut self) {
        let effects = self.outbox.take();
        let from = Address::new(self.node, self.incarnation, PROXY_ACTOR);
        for effect in effects {
            match effect {
                Effect::Send { to, message } => self.route(from, to, message),
                Effect::SetTimer { at, .. } => self.proxy_timer = Some(at),
                Effect::CancelTimer { .. } => self.proxy_timer = None,
                _ => {}
            }
        }
    }

    fn host_effects(&mut self) {
        let effects = self.outbox.take();
        for effect in effects {
            self.perform(effect);
        }
    }

    fn perform(&mut self, effect: Effect) {
        let from = Address::new(self.node, self.incarnation, FIRST_HOST_ACTOR);
        match effect {
            Effect::Send { to, message } => self.route(from, to, message),
            Effect::SetTimer {
                timer: Timer::ProxyRetry,
                at,
            } => self.proxy_timer = Some(at),
            Effect::SetTimer {
                timer: Timer::HostTick,
                at,
            } => self.host_timer = Some(at),
            Effect::CancelTimer {
                timer: Timer::ProxyRetry,
            } => self.proxy_timer = None,
            Effect::CancelTimer {
                timer: Timer::HostTick,
            } => self.host_timer = None,
            // Neither the proxy nor the host persists, watches routes or has other timers.
            _ => {}
        }
    }

    /// Sends `message` where `to` lives: this node (local queue), the directory, or a peer.
    fn route(&mut self, from: Address, to: Address, message: Message) {
        if to.node == self.node {
            self.local.push_back((from, to, message));
            return;
        }
        let envelope = Envelope { from, to, message };
        if to.node == NodeId(0) {
            if let Some(conn) = self.directory_conn.and_then(|id| self.conns.get(&id)) {
                conn.send(Link::Frame(envelope));
            }
            return;
        }
        let conn = match self.peer_conns.get(&to.node) {
            Some(id) => self.conns.get(id).cloned(),
            None => self.connect_peer(to.node),
        };
        if let Some(conn) = conn {
            conn.send(Link::Frame(envelope));
        }
    }

    fn connect_peer(&mut self, node: NodeId) -> Option<Conn<Link>> {
        let peer = self.peers.get(&node)?.clone();
        let stream = connect(&peer.listen, StdDuration::from_millis(500)).ok()?;
        let id = self.next_conn;
        self.next_conn += 1;
        let conn = spawn_tcp(id, stream, self.events.clone(), wrap_net).ok()?;
        conn.send(Link::PeerHello {
            node: self.node,
            incarnation: self.incarnation,
            key: self.options.cluster_key,
        });
        self.conns.insert(id, conn.clone());
        self.peer_conns.insert(node, id);
        self.conn_peer.insert(id, node);
        Some(conn)
    }

    fn drain_local(&mut self) {
        while let Some((from, to, message)) = self.local.pop_front() {
            self.deliver(from, to, message);
        }
    }

    /// A frame for an actor of this node.
    fn deliver(&mut self, from: Address, to: Address, message: Message) {
        let now = self.clock.now();
        if to.incarnation == self.incarnation && to.actor == PROXY_ACTOR {
            if self
                .proxy
                .handle_message(now, message, &mut self.outbox)
                .is_ok()
            {
                self.proxy_effects();
            }
            return;
        }
        if to.incarnation == self.incarnation && to.actor == AGENT_ACTOR {
            if let Message::GoneAcknowledged { scope } = message
                && self.gone_report.is_some_and(|(s, _)| s == scope)
            {
                self.gone_report = None;
            }
            return;
        }
        if let Some(id) = self.child_by_address.get(&to) {
            if let (Some(child), Message::ToChild(event)) = (self.children.get(id), message) {
                child.conn.send(event);
            }
            return;
        }
        if to.actor < FIRST_HOST_ACTOR && to.incarnation == self.incarnation {
            return; // A child that is gone.
        }
        let mem = self.arena.as_mut_slice();
        if self
            .machine
            .handle_message(now, from, to, message, mem, &mut self.outbox)
            .is_ok()
        {
            self.host_effects();
        }
    }

    fn handle(&mut self, event: HostEvent) {
        match event {
            HostEvent::PeerAccepted(stream) => {
                let id = self.next_conn;
                self.next_conn += 1;
                if let Ok(conn) = spawn_tcp(id, stream, self.events.clone(), wrap_net) {
                    self.conns.insert(id, conn);
                }
            }
            HostEvent::DirectoryConnected(stream) => {
                let id = self.next_conn;
                self.next_conn += 1;
                if let Ok(conn) = spawn_tcp(id, stream, self.events.clone(), wrap_net) {
                    conn.send(Link::HostHello {
                        listen: self.options.listen.clone(),
                        boot_nonce: self.boot_nonce,
                        key: self.options.cluster_key,
                    });
                    self.conns.insert(id, conn);
                    self.directory_conn = Some(id);
                } else {
                    reconnect(self.options.directory.clone(), self.events.clone());
                }
            }
            HostEvent::Net(Event::Received(id, link)) => self.link(id, link),
            HostEvent::Net(Event::Closed(id, _)) => {
                self.conns.remove(&id);
                if let Some(node) = self.conn_peer.remove(&id)
                    && self.peer_conns.get(&node) == Some(&id)
                {
                    self.peer_conns.remove(&node);
                }
                if self.directory_conn == Some(id) {
                    self.directory_conn = None;
                    let now = self.clock.now();
                    self.proxy.handle_discovery(now, None, &mut self.outbox);
                    self.proxy_effects();
                    reconnect(self.options.directory.clone(), self.events.clone());
                }
            }
            HostEvent::ChildAccepted(stream) => self.child_accepted(stream),
            HostEvent::Child(Event::Received(id, request)) => {
                let Some(child) = self.children.get(&id) else {
                    return;
                };
                if child.closed {
                    return;
                }
                let (from, to) = (child.address, child.session);
                self.deliver(from, to, Message::FromChild(request));
                self.drain_local();
            }
            HostEvent::Child(Event::Closed(id, _)) => {
                if let Some(child) = self.children.remove(&id) {
                    self.child_by_address.remove(&child.address);
                    if !child.closed {
                        // The child is gone: its session closes on its behalf (Q24).
                        self.deliver(
                            child.address,
                            child.session,
                            Message::FromChild(ChildRequest::Close),
                        );
                    }
                }
            }
        }
    }

    fn link(&mut self, id: ConnId, link: Link) {
        match link {
            Link::Welcome {
                directory,
                epoch,
                peers,
                node,
                incarnation,
            } if Some(id) == self.directory_conn => {
                if node != self.node || incarnation != self.incarnation {
                    // The directory node lost its membership: we cannot be who it says.
                    if let Some(conn) = self.conns.get(&id) {
                        conn.close();
                    }
                    return;
                }
                self.set_peers(peers);
                let now = self.clock.now();
                self.proxy.handle_discovery(
                    now,
                    Some(Discovered {
                        address: directory,
                        epoch,
                    }),
                    &mut self.outbox,
                );
                self.proxy_effects();
            }
            Link::Peers(peers) if Some(id) == self.directory_conn => self.set_peers(peers),
            Link::PeerHello { node, key, .. }
                if self.directory_conn != Some(id) && !self.conn_peer.contains_key(&id) =>
            {
                if ClusterKey::admits(self.options.cluster_key.as_ref(), key.as_ref()) {
                    self.conn_peer.insert(id, node);
                } else if let Some(conn) = self.conns.remove(&id) {
                    // Dropping the handle lets the writer send the refusal, then close.
                    conn.send(Link::Refused {
                        reason: WRONG_KEY.to_owned(),
                    });
                }
            }
            Link::Refused { reason } if Some(id) == self.directory_conn => {
                self.refused = Some(reason);
            }
            // Core frames only from the directory and from admitted peers.
            Link::Frame(envelope)
                if Some(id) == self.directory_conn || self.conn_peer.contains_key(&id) =>
            {
                if envelope.to.node == self.node {
                    self.deliver(envelope.from, envelope.to, envelope.message);
                }
            }
            _ => {
                if let Some(conn) = self.conns.get(&id) {
                    conn.close();
                }
            }
        }
    }

    fn directory_up(
        &mut self,
        stream: TcpStream,
        directory: Address,
        epoch: dataplane_core::ids::AuthorityEpoch,
    ) {
        let id = self.next_conn;
        self.next_conn += 1;
        match spawn_tcp(id, stream, self.events.clone(), wrap_net) {
            Ok(conn) => {
                self.conns.insert(id, conn);
                self.directory_conn = Some(id);
                let now = self.clock.now();
                self.proxy.handle_discovery(
                    now,
                    Some(Discovered {
                        address: directory,
                        epoch,
                    }),
                    &mut self.outbox,
                );
                self.proxy_effects();
            }
            Err(_) => reconnect(self.options.directory.clone(), self.events.clone()),
        }
    }

    fn set_peers(&mut self, peers: Vec<Peer>) {
        self.peers = peers.into_iter().map(|p| (p.node, p)).collect();
    }

    fn child_accepted(&mut self, stream: UnixStream) {
        let job = JobContext::new(
            format!("c{}", self.next_session_generation),
            self.options.allow.clone(),
            self.options.allow.clone(),
        );
        let Ok(job) = job else {
            return;
        };
        let config = SessionConfig {
            session_generation: self.next_session_generation,
            capability: self.capability,
            job,
        };
        self.next_session_generation += 1;
        let Some(session) = self.machine.open_session(config) else {
            return; // Too many sessions: the connection closes.
        };
        let child = Address::new(self.node, self.incarnation, self.next_child);
        self.next_child += 1;
        let welcome = ChildWelcome {
            child,
            session,
            arena_generation: self.machine.config().arena_generation,
            arena_size: self.arena.size(),
        };
        let mut bytes = Vec::new();
        if encode_frame(&welcome, &mut bytes).is_err()
            || send_with_fd(&stream, &bytes, self.arena.as_fd()).is_err()
        {
            return;
        }
        let id = self.next_conn;
        self.next_conn += 1;
        if let Ok(conn) = spawn_unix(id, stream, self.events.clone(), wrap_child) {
            self.child_by_address.insert(child, id);
            self.children.insert(
                id,
                ChildConn {
                    conn,
                    address: child,
                    session,
                    closed: false,
                },
            );
        }
    }
}

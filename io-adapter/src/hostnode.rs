//! The host node: the node's namespace proxy and host machine, the shared arena its children
//! map, the Unix socket children connect to, and TCP connections to the directory node and to
//! the other hosts.
//!
//! One driver thread owns the machines, the arena, the timers, the routing table and every
//! socket ([`Reactor`]). Frames between actors of this node never leave the process: they go
//! through a local queue, in order.
//!
//! **Children.** A child connects to the socket and says [`ChildHello`] with the capability
//! it read from `<socket>.cap`. Until then it holds nothing: no session, no descriptor, only a
//! place in a bounded waiting room with a deadline ([`Admission`]). The host machine validates
//! the capability and creates the session in one step ([`Host::attach_new`]); only then does
//! the child get a [`ChildGreeting::Welcome`] with the arena's descriptor attached
//! (`SCM_RIGHTS`), followed by `Attached`. From then on the child sends `ChildRequest`s and
//! receives `ChildEvent`s as postcard frames. A wrong capability is answered
//! [`ChildGreeting::Refused`] and closed. When a child's connection ends, its session is closed
//! on its behalf (its views are gone: DESIGN Q24); published blobs stay.
//!
//! **The socket.** It is created with mode 0600 (0660 and the `--socket-group` group with
//! [`HostOptions::socket_group`]) whatever the umask, and so is the capability file. A host
//! holds `<socket>.lock` (an exclusive `flock`) for its whole life and touches the socket and
//! the capability file only once it holds it: a second host on the same socket is refused
//! ([`HostError::InUse`]) and changes nothing.
//!
//! **Restarts.** The directory node assigns the node id and raises the incarnation when this
//! process is new (boot nonce). A host whose incarnation is above 1 reports its previous
//! incarnations gone (`AddressGone{NodeBefore}`), every second until the directory
//! acknowledges. If the directory connection drops, the proxy is told "no directory" and the
//! host reconnects with backoff; the new `Welcome` carries the new authority epoch.
//!
//! **A replicated directory.** [`HostOptions::directories`] may name several addresses, one per
//! replica of the directory's group. Only the leader serves: a follower closes the connection
//! at once, a dead replica refuses it. The host tries the addresses in turn, moving on to the
//! next after every failed attempt and after losing a welcomed link, in the blocking first
//! handshake and in every reconnect alike (the order and the back-off are
//! [`dataplane_core::conns::DirectoryLink`]'s). A new leader welcomes the host as a restarted
//! directory does: a new directory address and a higher epoch.
//!
//! **Other hosts.** Frames for another host go over this host's own connection to it, made on
//! demand; they wait (a bounded backlog) until the handshake proved both sides know the
//! cluster key. Connections other hosts make to this one go through the same kind of waiting
//! room as children, and their core frames are taken only once they proved the key, and only
//! for their own node. If the directory refuses this host's key, [`run_host`] returns the
//! error. The link to the directory and the links to other hosts are core's machines
//! ([`dataplane_core::conns::DirectoryLink`], [`dataplane_core::conns::PeerLinks`], which the
//! simulator runs too): this driver hands them the reactor's events and carries out their
//! actions.
//!
//! **Logs and metrics.** The node logs its start-up (version, options), the directory link
//! (welcomed, lost, refused), hosts and children refused and why (`info`), connections
//! accepted, admitted and closed (`debug`), and a failure that stops it (`error`). With
//! [`HostOptions::metrics_listen`] it serves [`HostMetrics`]: the proxy, the sessions and
//! bindings, the arena and the transfers, read from the machines' accessors.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use dataplane_cli::Exit;
use dataplane_core::admission::{
    ADMISSION_DEADLINE, Accepted, Admission, HANDSHAKE_MAGIC, HelloRefusal,
    PENDING_CONNECTIONS_MAX, PROTOCOL_VERSION, check_version,
};
use dataplane_core::agent::{Agent, AgentConfig};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::AttachmentFailure;
use dataplane_core::host::{Host, HostConfig, Phase, SessionConfig, SessionState};
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::limits::{FRAME_BYTES_MAX, LISTEN_BYTES_MAX, PROXY_PENDING_MAX};
use dataplane_core::path::{DataPath, JobContext};
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{Capability, ChildEvent, ChildRequest, Envelope, Message, decode_value};
use serde::{Deserialize, Serialize};
use tracing::{debug, error, info, warn};

use crate::arena::SharedArena;
use crate::control::{
    CONTROL_CONNECTIONS_MAX, CONTROL_FRAME_BYTES_MAX, CONTROL_VERSION, ControlCommand,
    ControlReply, ControlRequest, SessionInfo, control_path,
};
use crate::driver::Clock;
use crate::files::{HostMemory, NodeFiles};
use crate::metrics::{GaugeClock, HostMetrics, Refusal, gauge_value};
use crate::net::{
    ClusterKey, ConnId, HandshakeError, Limits, Link, ListenerId, NetEvent, Outgoing, Overflow,
    Performed, Reactor, Who, fresh_nonce, handshake_blocking, perform_conn_action,
};
use crate::resolve::{Addresses, Resolver, Started, literal, system_lookup};
use dataplane_core::conns::{
    Accepts, Closing, ConnAction, DIRECTORY_CANDIDATES_MAX, DirectoryLink, HANDSHAKE_DEADLINE,
    LinkExpired, LinkHeard, Listener, Parked, PeerBook, PeerHeard, PeerLinks, RECONNECT_FIRST,
    RECONNECT_MAX, Routed, SILENCE_MAX, SILENCE_MIN,
};
use dataplane_core::membership::is_full_refusal;

/// The node agent's actor number (gone reports).
pub const AGENT_ACTOR: u64 = 0;
/// The proxy's actor number.
pub const PROXY_ACTOR: u64 = 1;
/// Child processes are numbered from here.
pub const FIRST_CHILD_ACTOR: u64 = 100;
/// Host machine actors are numbered from here.
pub const FIRST_HOST_ACTOR: u64 = 1 << 40;
/// Frames from other nodes that only this host may send are logged at most this often.
const FORGED_WARN_EVERY: StdDuration = StdDuration::from_secs(10);
/// Transfer chunk size between hosts (the most a chunk frame may carry).
pub const TRANSFER_CHUNK_BYTES: u32 = 256 * 1024;
/// Chunks a transfer keeps in flight: 4 MiB. Over loopback a round trip crosses both hosts'
/// drivers, so the window must cover it; the `io` bench measured 64 KiB x 8 at 1.25 GiB/s and
/// 256 KiB x 16 at 1.4-1.5 GiB/s.
pub const TRANSFER_WINDOW: u32 = 16;
/// Most connections other hosts keep to this one.
const PEERS_MAX: usize = 1024;
/// Most children waiting to attach at once.
const CHILDREN_PENDING_MAX: usize = 64;
/// How long the blocking first handshake waits after a round of the directory's addresses
/// failed (between two addresses of a round it waits [`RECONNECT_FIRST`]).
const FIRST_ROUND_PAUSE: StdDuration = StdDuration::from_millis(100);
/// How long the blocking first handshake waits for a connection to the directory to be made.
const FIRST_CONNECT_TIMEOUT: StdDuration = StdDuration::from_secs(1);
/// How long the blocking first handshake waits for the directory's next frame.
const FIRST_READ_TIMEOUT: StdDuration = StdDuration::from_secs(5);
/// How often the node agent re-sends a gone report the directory has not acknowledged.
const AGENT_PERIOD: Duration = Duration::from_secs(1);
/// The longest the driver waits for an event (the metrics' gauges are read this often at
/// least).
const IDLE_WAIT: StdDuration = StdDuration::from_secs(1);
/// A control connection's bounds: small requests, room for the longest session list.
const CONTROL_LIMITS: Limits = Limits {
    frame_bytes: CONTROL_FRAME_BYTES_MAX,
    queue_bytes: 4 << 20,
    overflow: Overflow::Close,
    pace: false,
};
/// A child connection's bounds once it attached: requests are small (paths of at most 4 KiB),
/// and a child that does not read its events is closed rather than left without answers.
const CHILD_LIMITS: Limits = Limits {
    frame_bytes: 64 * 1024,
    queue_bytes: 4 << 20,
    overflow: Overflow::Close,
    pace: false,
};

/// How a host node is set up.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// The directory's addresses (`host:port`), at least one and at most
    /// [`DIRECTORY_CANDIDATES_MAX`]: one per replica of a replicated directory, whose leader
    /// alone serves. They are tried in this order.
    pub directories: Vec<String>,
    /// Where other hosts connect (`host:port`); also this host's identity at the directory.
    pub listen: String,
    /// The Unix socket children connect to.
    pub socket: PathBuf,
    /// With a group id, the socket and the capability file are also open to that group
    /// (modes 0660 and 0640); otherwise only to this process's user (0600).
    pub socket_group: Option<u32>,
    /// Arena size in bytes.
    pub arena_size: u64,
    /// Back the arena with this file instead of an anonymous memfd.
    pub arena_file: Option<PathBuf>,
    /// Prefixes children may read and write.
    pub allow: Vec<DataPath>,
    /// The proxy's request deadline.
    pub deadline: Duration,
    /// How long a read (a child's get or stat) waits while no directory is reachable before
    /// it fails (core's `ProxyConfig::absent_read_wait`; at or above `deadline`: never early).
    pub absent_read_wait: Duration,
    /// How long the directory or another host may answer nothing before this host gives
    /// the connection up ([`SILENCE_MIN`]..=[`SILENCE_MAX`]; core's `Pinger`).
    pub silence: Duration,
    /// When set, this host and the other nodes prove to each other that they know it.
    pub cluster_key: Option<ClusterKey>,
    /// Serve [`HostMetrics`] at `http://ADDR/metrics` (`host:port`).
    pub metrics_listen: Option<String>,
    /// Children may publish the files under this directory as file blobs (issue 17); the
    /// table of file blobs is kept there too. `None`: no file blobs.
    pub files: Option<PathBuf>,
    /// Most child sessions it serves at once (1 to
    /// [`HOST_SESSIONS_CAP`](dataplane_core::limits::HOST_SESSIONS_CAP); default
    /// [`HOST_SESSIONS_MAX`](dataplane_core::limits::HOST_SESSIONS_MAX)).
    pub sessions_max: usize,
    /// How long a child has to seal a granted write (core's `HostConfig::write_deadline`).
    pub write_deadline: Duration,
    /// How long an open may wait for arena space (core's `HostConfig::allocation_deadline`).
    pub allocation_wait: Duration,
}

/// A child's first frame: it proves it may attach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildHello {
    /// [`HANDSHAKE_MAGIC`].
    pub magic: u32,
    /// The child's [`PROTOCOL_VERSION`].
    pub version: u16,
    /// The capability from `<socket>.cap`.
    pub capability: Capability,
}

impl ChildHello {
    /// The hello of this version for `capability`.
    pub fn new(capability: Capability) -> ChildHello {
        ChildHello {
            magic: HANDSHAKE_MAGIC,
            version: PROTOCOL_VERSION,
            capability,
        }
    }
}

/// The host's answer to a [`ChildHello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChildGreeting {
    /// Attached: the arena's descriptor comes with this frame; `Attached` follows.
    Welcome(ChildWelcome),
    /// Not attached (a wrong capability or version, a full host); the host closes.
    Refused {
        /// Why, for the user.
        reason: String,
        /// Whether trying again later may succeed (a full host), or not (a wrong capability).
        busy: bool,
    },
}

impl Outgoing for ChildGreeting {}

/// What an attached child learns first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildWelcome {
    /// The child's own address.
    pub child: Address,
    /// Its session.
    pub session: Address,
    /// The arena generation (every lease generation is above it).
    pub arena_generation: u64,
    /// The arena's size (map this many bytes).
    pub arena_size: u64,
}

/// The capability file next to a socket.
pub fn capability_path(socket: &Path) -> PathBuf {
    sibling(socket, ".cap")
}

/// The lock file next to a socket: held by the host that serves it.
pub fn lock_path(socket: &Path) -> PathBuf {
    sibling(socket, ".lock")
}

fn sibling(socket: &Path, suffix: &str) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Why a host node stopped.
#[derive(Debug)]
pub enum HostError {
    /// Setting up failed (the arena, a socket, the capability file...).
    Setup(String),
    /// Another live host serves this socket (its lock is held); nothing was changed.
    InUse(String),
    /// The directory refused this host's hello (its cluster key): a configuration error.
    Refused(String),
    /// The directory could not prove the cluster key (why, in words): this host does not
    /// trust it. A configuration error.
    Unproven(String),
    /// The directory welcomed this host under another node id or incarnation than before: it
    /// no longer knows this process (a repair cut the records that told it, or another host
    /// claims this listen address). Serving on would mix two hosts' blobs; a restart gets
    /// this host an identity the directory knows.
    Unknown(String),
    /// The command line asks for what cannot be (an address it cannot listen at); nothing was
    /// changed.
    Usage(String),
}

impl HostError {
    /// Whether the directory refused this host (rather than setup failing).
    pub fn refused(&self) -> bool {
        matches!(self, HostError::Refused(_) | HostError::Unproven(_))
    }

    /// The process exit status for this error (sysexits): 78 a refused key (configuration),
    /// 75 a socket in use (try later), 64 a usage error, 70 anything else.
    pub fn exit_code(&self) -> Exit {
        match self {
            HostError::Usage(_) => Exit::Usage,
            HostError::Refused(_) | HostError::Unproven(_) => Exit::Config,
            HostError::InUse(_) => Exit::Temporary,
            HostError::Setup(_) | HostError::Unknown(_) => Exit::Software,
        }
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Setup(message) | HostError::InUse(message) | HostError::Usage(message) => {
                f.write_str(message)
            }
            HostError::Refused(reason) => write!(f, "the directory refused this host: {reason}"),
            HostError::Unproven(why) => write!(
                f,
                "this host does not trust the directory: it could not prove the cluster key: {why}"
            ),
            HostError::Unknown(reason) => write!(
                f,
                "the directory no longer knows this host: {reason}; restart it (the blobs it \
                 holds are lost)"
            ),
        }
    }
}

impl std::error::Error for HostError {}

/// A child connection.
enum ChildConn {
    /// Its hello is awaited.
    Pending,
    /// Attached as `address` to `session`.
    Attached { address: Address, session: Address },
}

struct HostNode {
    options: HostOptions,
    clock: Clock,
    node: NodeId,
    incarnation: u64,
    proxy: Proxy,
    machine: Host,
    arena: SharedArena,
    /// The files children may publish as file blobs (issue 17).
    files: NodeFiles,
    /// The arena, opened read-only: what children map.
    arena_for_children: std::os::fd::OwnedFd,
    capability: Capability,
    net: Reactor,
    peer_listener: ListenerId,
    child_listener: ListenerId,
    /// The control socket (`<socket>.ctl`) and its open connections.
    control_listener: ListenerId,
    controls: crate::control::ControlConns,
    child_admission: Admission,
    outbox: Outbox,
    local: VecDeque<(Address, Address, Message)>,
    /// The link to the directory node (core's: handshake, welcome, back-off).
    directory: DirectoryLink,
    /// Connections with other hosts (core's: handshakes, backlogs, who each speaks for).
    peer_links: PeerLinks,
    /// What the connection machines asked for, not yet done (a reused buffer).
    actions: Vec<ConnAction>,
    /// Where other hosts listen, as far as this host asked the directory.
    book: PeerBook,
    children: BTreeMap<ConnId, ChildConn>,
    child_by_address: BTreeMap<Address, ConnId>,
    next_child: u64,
    next_session_generation: u64,
    proxy_timer: Option<Instant>,
    host_timer: Option<Instant>,
    /// The node agent: gone reports after a restart, re-sent until acknowledged.
    agent: Agent,
    agent_timer: Option<Instant>,
    /// The directory refused this host, or could not prove the key; the node stops.
    refused: Option<HostError>,
    /// The directory welcomed this host under another identity (why); the node stops.
    unknown: Option<String>,
    /// The warning about frames from other nodes that only this host may send (see
    /// `deliver_remote`).
    forged: crate::throttle::Throttle,
    /// When frames for a node the directory does not know were last logged.
    unlocated: crate::throttle::Throttle,
    /// Name lookups (a peer's listen name, a directory's address) on threads of their own: a
    /// slow DNS, or a host that names a slow name as its listen address, must not stall the
    /// loop that serves every child.
    peer_names: Resolver<NodeId>,
    /// The directory's addresses: `--directory`, then at most one learned from a replica
    /// that named the leader there ([`follow_named`]). The link's candidates, by index.
    directories: Vec<String>,
    /// The directory's addresses (by index) on a resolver of their own, so strangers' slow
    /// names never delay them.
    directory_names: Resolver<usize>,
    /// What each directory address resolved to last: an attempt connects there (to each in
    /// turn) while a fresh lookup runs.
    directory_resolved: Vec<Addresses>,
    /// The current address's attempt found no address yet: its lookup's answer makes the
    /// link try at once.
    directory_waits_for_name: bool,
    /// When a failed lookup of a peer's name, and of a directory address, was last logged.
    unresolved_peers: crate::throttle::Throttle,
    unresolved_directory: crate::throttle::Throttle,
    /// Held for the life of the process: this host serves the socket.
    _lock: fs::File,
    /// With `--metrics-listen`: the metrics, when the gauges are next read, and the transfers
    /// (their destination bindings) seen asking another host for chunks and not yet over.
    metrics: Option<HostMetrics>,
    gauges: GaugeClock,
    transfers: BTreeSet<Address>,
}

fn random_bytes<const N: usize>() -> Result<[u8; N], HostError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| HostError::Setup(format!("getrandom: {e}")))?;
    Ok(bytes)
}

/// Threads looking up the listen names of other hosts (any host may name any listen name).
const PEER_LOOKUP_THREADS: usize = 4;
/// Threads looking up the directory's addresses (the operator's names).
const DIRECTORY_LOOKUP_THREADS: usize = 1;

/// What [`claim_socket`] makes: the held lock, the bound child socket, the bound control
/// socket and the capability.
type Claimed = (
    fs::File,
    std::os::unix::net::UnixListener,
    std::os::unix::net::UnixListener,
    Capability,
);

/// Takes `<socket>.lock`, then makes the socket and the capability file. Nothing is touched
/// unless the lock is ours.
fn claim_socket(options: &HostOptions) -> Result<Claimed, HostError> {
    let socket = &options.socket;
    let err =
        |what: &Path, e: &dyn fmt::Display| HostError::Setup(format!("{}: {e}", what.display()));
    let lock_file = lock_path(socket);
    let lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_file)
        .map_err(|e| err(&lock_file, &e))?;
    if lock.try_lock().is_err() {
        return Err(HostError::InUse(format!(
            "another host serves {} (it holds {}); nothing was changed",
            socket.display(),
            lock_file.display()
        )));
    }
    // The lock is ours: a socket file left here belongs to a host that is gone.
    if crate::sys::is_socket(socket) {
        fs::remove_file(socket).map_err(|e| err(socket, &e))?;
    }
    let (socket_mode, cap_mode) = if options.socket_group.is_some() {
        (0o660, 0o640)
    } else {
        (0o600, 0o600)
    };
    let listener = crate::sys::bind_unix(socket, socket_mode).map_err(|e| err(socket, &e))?;
    // The control socket is the host's user's alone, whatever the child socket's group.
    let control = control_path(socket);
    if crate::sys::is_socket(&control) {
        fs::remove_file(&control).map_err(|e| err(&control, &e))?;
    }
    let control_listener = crate::sys::bind_unix(&control, 0o600).map_err(|e| err(&control, &e))?;
    let capability = Capability(random_bytes::<32>()?);
    let cap_path = capability_path(socket);
    let _ = fs::remove_file(&cap_path);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(cap_mode)
        .open(&cap_path)
        .and_then(|mut f| f.write_all(&capability.0))
        .map_err(|e| err(&cap_path, &e))?;
    if let Some(gid) = options.socket_group {
        for path in [socket.as_path(), cap_path.as_path()] {
            crate::sys::chown_group(path, gid).map_err(|e| err(path, &e))?;
        }
    }
    Ok((lock, listener, control_listener, capability))
}

/// Runs a host node. Returns only on a setup failure or when the directory refuses this host.
pub fn run_host(options: HostOptions) -> Result<(), HostError> {
    let err = |what: &str, e: &dyn fmt::Display| HostError::Setup(format!("{what}: {e}"));
    check_directories(&options.directories)?;
    if !(SILENCE_MIN..=SILENCE_MAX).contains(&options.silence) {
        return Err(HostError::Setup(format!(
            "a silence bound of {}: give {SILENCE_MIN} to {SILENCE_MAX}",
            options.silence
        )));
    }
    if !(1..=dataplane_core::limits::HOST_SESSIONS_CAP).contains(&options.sessions_max) {
        return Err(HostError::Usage(format!(
            "at most {} sessions: give 1 to {}",
            options.sessions_max,
            dataplane_core::limits::HOST_SESSIONS_CAP
        )));
    }
    let sessions_max = options.sessions_max;
    // The port first (a usage error changes nothing), then the socket: a second host on it
    // must change nothing, not even make an arena.
    let listener = crate::dirnode::bind(&options.listen, "--listen").map_err(|e| match e {
        crate::dirnode::NodeError::Usage(why) => HostError::Usage(why),
        other => HostError::Setup(other.to_string()),
    })?;
    // An arena the machine cannot hold would be prefaulted until the machine runs out of
    // memory: refused before anything is made.
    if let Some(memory) = crate::sys::memory_available()
        && options.arena_size > memory
    {
        return Err(HostError::Usage(format!(
            "--arena-size {} is more than the {} bytes of memory this process may have (the \
             machine's, or its control group's memory.max): give a smaller arena",
            options.arena_size, memory
        )));
    }
    let (lock, children, control, capability) = claim_socket(&options)?;
    info!(
        bytes = options.arena_size,
        "making the arena and touching each of its pages (about 0.5 s per 64 MiB)"
    );
    let arena = match &options.arena_file {
        Some(path) => SharedArena::create_file(path, options.arena_size),
        None => SharedArena::create("dataplane-arena", options.arena_size),
    }
    .map_err(|e| err("arena", &e))?;
    let mut arena = arena;
    arena.prefault();
    // The files and their table before anything else waits on the network: a table that
    // cannot be read is a setup failure (its blobs would be bound and unserved).
    let (files, file_table) = NodeFiles::open(options.files.as_deref()).map_err(|e| {
        HostError::Setup(format!(
            "the file blobs' table (--files): {e} (restore it from a backup; removing it makes \
             this host forget its file blobs, which readers then cannot read)"
        ))
    })?;
    let arena_for_children = arena.read_only_fd().map_err(|e| err("arena", &e))?;
    let mut net = Reactor::new().map_err(|e| err("poll", &e))?;
    let peer_listener = net
        .listen_tcp(listener, Limits::pending())
        .map_err(|e| err(&options.listen, &e))?;
    let child_listener = net
        .listen_unix(children, Limits::pending())
        .map_err(|e| err(&options.socket.display().to_string(), &e))?;
    let control_listener = net
        .listen_unix(control, CONTROL_LIMITS)
        .map_err(|e| err(&control_path(&options.socket).display().to_string(), &e))?;
    let metrics = match &options.metrics_listen {
        Some(listen) => {
            let metrics = HostMetrics::new();
            metrics.sessions_max.set(gauge_value(sessions_max));
            let bound = crate::metrics::serve(listen, metrics.registry.clone())
                .map_err(|e| err(&format!("--metrics-listen {listen}"), &e))?;
            info!(url = %format_args!("http://{bound}/metrics"), "metrics served");
            Some(metrics)
        }
        None => None,
    };
    info!(
        version = dataplane_cli::VERSION,
        directory = %options.directories.join(","),
        listen = %options.listen,
        socket = %options.socket.display(),
        arena_bytes = arena.size(),
        arena_file = %options.arena_file.as_deref().map_or("(memfd)".into(), |p| p.display().to_string()),
        allow = %options.allow.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        deadline = %options.deadline,
        absent_read_wait = %options.absent_read_wait,
        write_deadline = %options.write_deadline,
        allocation_wait = %options.allocation_wait,
        silence = %options.silence,
        cluster_key = options.cluster_key.is_some(),
        socket_group = options.socket_group,
        "host started"
    );
    // The first Welcome tells us who we are.
    let boot_nonce = u64::from_le_bytes(random_bytes::<8>()?);
    let clock = Clock::new();
    let who = Who::Host {
        listen: options.listen.clone(),
        boot_nonce,
    };
    let mut directories = options.directories.clone();
    let (candidate, stream, welcome, received) = first_welcome(&options, &mut directories, &who)?;
    let Link::Welcome {
        node,
        incarnation,
        directory,
        epoch,
    } = welcome
    else {
        return Err(HostError::Setup(format!(
            "the directory answered the handshake with {}, not a Welcome",
            welcome.name()
        )));
    };
    info!(
        %node,
        incarnation,
        directory = %directories[candidate],
        directory_address = %directory,
        epoch = epoch.0,
        "welcomed by the directory{}",
        if incarnation > 1 {
            " (a restart: reporting the earlier incarnations gone)"
        } else {
            ""
        }
    );
    let _ = stream.set_read_timeout(None);
    // Where the welcoming address resolved to: the link's next attempts start there.
    let welcomed_at = stream.peer_addr().ok();
    let directory_conn = net
        .adopt_tcp(stream, Limits::peer(), received)
        .map_err(|e| err("directory connection", &e))?;
    let proxy_address = Address::new(node, incarnation, PROXY_ACTOR);
    let mut outbox = Outbox::new();
    let proxy = Proxy::new(
        ProxyConfig {
            address: proxy_address,
            retry_period: Duration::from_secs(1),
            deadline: options.deadline,
            absent_read_wait: options.absent_read_wait,
            first_request_id: 1,
            pending_max: PROXY_PENDING_MAX,
        },
        clock.now(),
        &mut outbox,
    );
    let mut config = HostConfig::new(node, incarnation, proxy_address, options.arena_size);
    config.sessions_max = options.sessions_max;
    config.write_deadline = options.write_deadline;
    config.allocation_deadline = options.allocation_wait;
    config.arena_generation = incarnation;
    config.first_actor = FIRST_HOST_ACTOR;
    config.chunk_bytes = TRANSFER_CHUNK_BYTES;
    config.window = TRANSFER_WINDOW;
    config.call_guard = options.deadline.saturating_add(Duration::from_secs(5));
    let mut machine = Host::new(config, clock.now(), &mut outbox);
    // The file blobs of this node's earlier lives are served again at once.
    let file_blobs = file_table.files.len();
    machine.restore_files(file_table);
    if let Some(root) = files.root() {
        info!(root = %root.display(), file_blobs, "serving file blobs");
    }
    let mut agent_boot = Outbox::new();
    let agent = Agent::boot(
        AgentConfig {
            address: Address::new(node, incarnation, AGENT_ACTOR),
            directory: Address::new(NodeId(0), 0, 0),
            period: AGENT_PERIOD,
        },
        clock.now(),
        &mut agent_boot,
    );
    let key = options.cluster_key;
    let silence = options.silence;
    let candidates = directories.len();
    let waker = net.waker().map_err(|e| err("poll", &e))?;
    let threads = |e: std::io::Error| err("the name-lookup threads", &e);
    let peer_names =
        Resolver::new(PEER_LOOKUP_THREADS, waker.clone(), system_lookup).map_err(threads)?;
    let mut directory_names =
        Resolver::new(DIRECTORY_LOOKUP_THREADS, waker, system_lookup).map_err(threads)?;
    let mut directory_resolved = vec![Addresses::default(); candidates];
    if let Some(address) = welcomed_at {
        directory_resolved[candidate] = Addresses::of(address);
    }
    // Every other address is looked up now, so a failover finds it resolved.
    for (i, address) in directories.iter().enumerate() {
        if i != candidate && literal(address).is_none() {
            directory_names.start(clock.now(), i, address);
        }
    }
    let mut host = HostNode {
        options,
        clock,
        node,
        incarnation,
        proxy,
        machine,
        arena,
        files,
        arena_for_children,
        capability,
        net,
        peer_listener,
        child_listener,
        control_listener,
        controls: crate::control::ControlConns::new(CONTROL_CONNECTIONS_MAX),
        child_admission: Admission::new(ADMISSION_DEADLINE, CHILDREN_PENDING_MAX, sessions_max),
        outbox,
        local: VecDeque::new(),
        directory: DirectoryLink::welcomed(
            who,
            key,
            directory_conn,
            node,
            incarnation,
            clock.now(),
        )
        .with_candidates(candidates, candidate)
        .with_silence(silence),
        peer_links: PeerLinks::new(
            node,
            incarnation,
            key,
            Listener::new(
                key,
                Accepts::Peers,
                ADMISSION_DEADLINE,
                PENDING_CONNECTIONS_MAX,
                PEERS_MAX,
            ),
        )
        .with_silence(silence),
        actions: Vec::new(),
        book: PeerBook::new(),
        children: BTreeMap::new(),
        child_by_address: BTreeMap::new(),
        next_child: FIRST_CHILD_ACTOR,
        forged: crate::throttle::Throttle::default(),
        unlocated: crate::throttle::Throttle::default(),
        peer_names,
        directories,
        directory_names,
        directory_resolved,
        directory_waits_for_name: false,
        unresolved_peers: crate::throttle::Throttle::default(),
        unresolved_directory: crate::throttle::Throttle::default(),
        next_session_generation: 1,
        proxy_timer: None,
        host_timer: None,
        agent,
        agent_timer: None,
        refused: None,
        unknown: None,
        _lock: lock,
        metrics,
        gauges: GaugeClock::default(),
        transfers: BTreeSet::new(),
    };
    if let Some(metrics) = &host.metrics {
        metrics.directory_connected.set(1);
    }
    host.execute_boot_effects(agent_boot);
    host.discovered(Some(Discovered {
        address: directory,
        epoch,
    }));
    host.run()
}

/// Refuses a list of directory addresses the link cannot follow: none, or too many.
fn check_directories(directories: &[String]) -> Result<(), HostError> {
    if directories.is_empty() || directories.len() > DIRECTORY_CANDIDATES_MAX {
        return Err(HostError::Setup(format!(
            "{} directory addresses: give 1 to {DIRECTORY_CANDIDATES_MAX}",
            directories.len()
        )));
    }
    Ok(())
}

/// What the blocking first handshake gets: the address (its index among the directory's
/// addresses) that welcomed this host, the connection, the `Welcome`, and the bytes read
/// after it.
type FirstWelcome = (usize, TcpStream, Link, Vec<u8>);

/// Connects to the directory's addresses in turn until one welcomes this host (the first
/// `Welcome` tells it who it is). After a failed attempt the next address is tried
/// [`RECONNECT_FIRST`] later, and a round of them that all failed pauses
/// [`FIRST_ROUND_PAUSE`]: a leader behind dead or following replicas is found at once, and a
/// directory that is not up yet is polled. Returns only when welcomed, or refused (the
/// cluster key).
fn first_welcome(
    options: &HostOptions,
    directories: &mut Vec<String>,
    who: &Who,
) -> Result<FirstWelcome, HostError> {
    let given = options.directories.len();
    let mut attempts = 0usize;
    let mut next = 0;
    loop {
        let candidate = next;
        let count = directories.len();
        next = (candidate + 1) % count;
        let address = directories[candidate].clone();
        attempts += 1;
        // The first round's failures are worth a line each; later ones only at debug (it
        // keeps trying).
        let waiting = |reason: &dyn fmt::Display| {
            if attempts <= count {
                warn!(directory = %address, %reason, "waiting for the directory");
            } else {
                debug!(directory = %address, %reason, attempts, "waiting for the directory");
            }
        };
        let pause = || {
            std::thread::sleep(if candidate + 1 == count {
                FIRST_ROUND_PAUSE
            } else {
                StdDuration::from_nanos(RECONNECT_FIRST.as_nanos())
            });
        };
        debug!(directory = %address, attempts, "connecting to the directory");
        let stream = match crate::net::connect_tcp(&address, FIRST_CONNECT_TIMEOUT) {
            Ok(stream) => stream,
            Err(e) => {
                waiting(&e);
                pause();
                continue;
            }
        };
        let _ = stream.set_read_timeout(Some(FIRST_READ_TIMEOUT));
        match handshake_blocking(&stream, who.clone(), options.cluster_key.as_ref()) {
            Ok((welcome, reader)) => {
                let (_, received) = reader.into_parts();
                return Ok((candidate, stream, welcome, received));
            }
            Err(HandshakeError::Refused(reason)) if is_full_refusal(&reason) => {
                // Passing: a member long away may be forgotten to make room. Asked again at
                // the slowest reconnect pace, not the first round's.
                waiting(&reason);
                std::thread::sleep(StdDuration::from_nanos(RECONNECT_MAX.as_nanos()));
            }
            Err(HandshakeError::Refused(reason)) => {
                error!(directory = %address, %reason, "the directory refused this host");
                return Err(HostError::Refused(reason));
            }
            Err(HandshakeError::Unproven(why)) => {
                error!(directory = %address, %why, "the directory could not prove the cluster key");
                return Err(HostError::Unproven(why));
            }
            Err(HandshakeError::NotLeader(leader)) => {
                // A replica that does not serve: next, the one it names.
                if let Some((index, learned)) = leader
                    .as_deref()
                    .and_then(|l| follow_named(directories, given, l))
                {
                    if learned {
                        info!(
                            directory = %directories[index],
                            "learned a directory address: a replica named the leader there"
                        );
                    }
                    next = index;
                }
                debug!(
                    directory = %address,
                    leader = leader.as_deref().unwrap_or("unknown"),
                    "not the leader"
                );
                pause();
            }
            Err(e) => {
                waiting(&e);
                pause();
            }
        }
    }
}

/// Where a host goes after a replica named `leader` as where the leader takes hosts: its
/// number among the directory's `addresses`, and whether it was added there. An address the
/// host was not given (the first `given`) is learned into the one slot after them, replacing
/// what was learned before (a replaced replica's address is not tried again once another is
/// named). `None`: not a `host:port` a host would try, or no slot is left
/// ([`DIRECTORY_CANDIDATES_MAX`] addresses were given).
///
/// The name is believed as far as the address that said it is: a host was told to connect
/// there, prove the cluster key there and take its welcome; the redirect adds nothing it
/// would not already have believed of it.
fn follow_named(addresses: &mut Vec<String>, given: usize, leader: &str) -> Option<(usize, bool)> {
    if let Some(index) = addresses.iter().position(|a| a == leader) {
        return Some((index, false));
    }
    let port = leader
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    let well_formed =
        matches!(port, Some((host, Ok(_))) if !host.is_empty()) && leader.len() <= LISTEN_BYTES_MAX;
    if !well_formed || given >= DIRECTORY_CANDIDATES_MAX {
        return None;
    }
    addresses.truncate(given);
    addresses.push(leader.to_owned());
    Some((given, true))
}

/// What a refused child is told.
fn attach_refusal(failure: &AttachmentFailure) -> String {
    match failure {
        AttachmentFailure::CapabilityRejected => {
            "wrong capability (it is in the socket's .cap file)".to_owned()
        }
        AttachmentFailure::SessionClosed => {
            "the host serves as many sessions as it may already (--sessions-max)".to_owned()
        }
        AttachmentFailure::ArenaGenerationMismatch { expected, found } => {
            format!("arena generation {found}, the host's is {expected}")
        }
        AttachmentFailure::DuplicateAttachment => "already attached".to_owned(),
        AttachmentFailure::RouteRejected(reason) => format!("refused: {reason}"),
    }
}

impl HostNode {
    fn execute_boot_effects(&mut self, mut agent_boot: Outbox) {
        self.host_effects();
        let from = self.agent.address();
        for effect in agent_boot.take() {
            self.perform(from, effect);
        }
    }

    /// Runs until the directory refuses this host (or polling fails).
    fn run(&mut self) -> Result<(), HostError> {
        let result = self.run_loop();
        if let Err(e) = &result {
            error!(error = %e, "host stops");
        }
        result
    }

    fn run_loop(&mut self) -> Result<(), HostError> {
        let mut events = Vec::new();
        loop {
            if let Some(error) = self.refused.take() {
                return Err(error);
            }
            if let Some(reason) = self.unknown.take() {
                return Err(HostError::Unknown(reason));
            }
            let retry = self.directory.next_deadline();
            let next = [
                self.proxy_timer,
                self.host_timer,
                self.agent_timer,
                retry,
                self.peer_links.next_deadline(),
                self.book.next_deadline(),
                self.peer_names.next_deadline(),
                self.directory_names.next_deadline(),
                self.child_admission.next_deadline(),
            ]
            .into_iter()
            .flatten()
            .min();
            // At least once a second, so that the metrics' gauges are never older than that.
            let wait = next.map_or(IDLE_WAIT, |at| self.clock.until(at).min(IDLE_WAIT));
            self.net
                .poll(Some(wait), &mut events)
                .map_err(|e| HostError::Setup(format!("poll: {e}")))?;
            for event in events.drain(..) {
                self.handle(event);
                self.drain_local();
            }
            self.lookups_answered();
            self.drain_local();
            self.timers();
            self.drain_local();
            self.sample_gauges();
        }
    }

    /// Reads the gauges from the machines (at most every [`crate::metrics::GAUGE_PERIOD`]).
    fn sample_gauges(&mut self) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        if !self.gauges.due(self.clock.now()) {
            return;
        }
        let machine = &self.machine;
        metrics
            .proxy_pending
            .set(gauge_value(self.proxy.pending_count()));
        metrics
            .sessions
            .set(gauge_value(machine.sessions().count()));
        let mut bindings = 0usize;
        let mut filling = 0usize;
        for (_, binding) in machine.bindings() {
            bindings += 1;
            if matches!(binding.phase, Phase::Filling(_)) {
                filling += 1;
            }
        }
        metrics.bindings.set(gauge_value(bindings));
        metrics.transfers_in_progress.set(gauge_value(filling));
        metrics
            .operations
            .set(gauge_value(machine.operations_in_progress()));
        metrics
            .retractions_pending
            .set(gauge_value(machine.handovers_pending()));
        metrics.peer_addresses.set(gauge_value(self.book.known()));
        metrics
            .frames_waiting_for_address
            .set(gauge_value(self.book.parked()));
        metrics.name_lookups.set(gauge_value(
            self.peer_names.waiting() + self.directory_names.waiting(),
        ));
        // One consistent sample of the arena.
        let arena = machine.arena_stats();
        metrics
            .arena_bytes
            .with_label_values(&["free"])
            .set(gauge_value(arena.free_bytes));
        metrics
            .arena_bytes
            .with_label_values(&["used"])
            .set(gauge_value(arena.used_bytes));
        metrics
            .arena_largest_free
            .set(gauge_value(arena.largest_free));
        metrics.arena_leases.set(gauge_value(arena.leases));
        metrics.arena_queued.set(gauge_value(arena.queued));
        metrics.arena_refused.set(gauge_value(arena.refused));
        metrics.conns.set(
            "nodes",
            self.peer_links.listener().pending_count(),
            self.peer_links.listener().admitted_count(),
        );
        metrics.conns.set(
            "children",
            self.child_admission.pending_count(),
            self.child_admission.admitted_count(),
        );
        metrics
            .conns
            .send_queued
            .set(gauge_value(self.net.queued_total()));
        // Transfers that are over are forgotten (a binding's address is never reused).
        self.transfers.retain(|t| {
            machine
                .binding(t.actor)
                .is_some_and(|b| matches!(b.phase, Phase::Filling(_)))
        });
    }

    fn count_refusal(&self, kind: Refusal) {
        if let Some(metrics) = &self.metrics {
            metrics.conns.refused(kind);
        }
    }

    /// Counts a chunk to or from another host.
    fn count_chunk(&self, direction: &str, bytes: usize) {
        if let Some(metrics) = &self.metrics {
            metrics
                .transfer_chunks
                .with_label_values(&[direction])
                .inc();
            metrics
                .transfer_bytes
                .with_label_values(&[direction])
                .inc_by(u64::try_from(bytes).unwrap_or(u64::MAX));
        }
    }

    fn timers(&mut self) {
        for conn in self.controls.expire(self.clock.now()) {
            debug!(conn, "control connection closed: idle");
            self.net.close(conn);
        }
        let now = self.clock.now();
        let why = format!("no answer within {}", crate::resolve::LOOKUP_WAIT);
        for (node, name) in self.peer_names.expire(now) {
            self.unresolved_peer(node, &name, &why);
        }
        for (_, name) in self.directory_names.expire(now) {
            self.unresolved_directory(&name, &why);
        }
        for node in self.peer_links.expire(now, &mut self.actions) {
            // Its address may be stale: asked again before the next connection.
            debug!(%node, silence = %self.options.silence, "connection to a host closed: it answered nothing");
            self.book.forget(node);
        }
        let dropped = self.book.expire(now);
        if dropped > 0 {
            debug!(
                dropped,
                "frames waited too long for their peer's address: dropped"
            );
        }
        self.ask_peers(now);
        let tried = self.directory_address().to_owned();
        match self.directory.expire(now, &mut self.actions) {
            LinkExpired::Nothing => {}
            LinkExpired::Attempt => warn!(
                directory = %tried,
                next = %self.directory_address(),
                silence = %self.options.silence,
                "the directory did not answer within the silence bound or finish the handshake \
                 within {HANDSHAKE_DEADLINE}: trying again"
            ),
            LinkExpired::Silent => {
                warn!(
                    directory = %tried,
                    next = %self.directory_address(),
                    silence = %self.options.silence,
                    "the directory answered nothing within the silence bound (stopped, or cut \
                     off without a close): leaving it"
                );
                if let Some(metrics) = &self.metrics {
                    metrics.directory_silences.inc();
                }
                self.lost_directory();
            }
        }
        self.conn_actions();
        for conn in self.child_admission.expired(now) {
            debug!(conn, remote = %self.net.remote(conn), "child connection closed: no hello within {ADMISSION_DEADLINE}");
            self.count_refusal(Refusal::Expired);
            self.net.close(conn);
            self.children.remove(&conn);
        }
        if self.directory.due(now) {
            self.connect_directory(now);
        }
        if self.proxy_timer.is_some_and(|at| at <= now) {
            self.proxy_timer = None;
            let _ = self
                .proxy
                .handle_timer(now, Timer::ProxyRetry, &mut self.outbox);
            self.proxy_effects();
        }
        if self.host_timer.is_some_and(|at| at <= now) {
            self.host_timer = None;
            let _ = self.machine.handle_timer(
                now,
                Timer::HostTick,
                &mut HostMemory {
                    arena: &mut self.arena,
                    files: &self.files,
                },
                &mut self.outbox,
            );
            self.host_effects();
        }
        if self.agent_timer.is_some_and(|at| at <= now) {
            self.agent_timer = None;
            let _ = self
                .agent
                .handle_timer(now, Timer::AgentTick, &mut self.outbox);
            self.agent_effects();
        }
    }

    fn proxy_effects(&mut self) {
        let effects = self.outbox.take();
        let from = Address::new(self.node, self.incarnation, PROXY_ACTOR);
        for effect in effects {
            self.perform(from, effect);
        }
    }

    fn agent_effects(&mut self) {
        let effects = self.outbox.take();
        let from = self.agent.address();
        for effect in effects {
            self.perform(from, effect);
        }
    }

    fn host_effects(&mut self) {
        let effects = self.outbox.take();
        let from = Address::new(self.node, self.incarnation, FIRST_HOST_ACTOR);
        for effect in effects {
            self.perform(from, effect);
        }
    }

    /// One effect of the proxy or the host machine (`from` is the actor that emitted it).
    fn perform(&mut self, from: Address, effect: Effect) {
        fn timer(node: &mut HostNode, which: Timer) -> Option<&mut Option<Instant>> {
            match which {
                Timer::ProxyRetry => Some(&mut node.proxy_timer),
                Timer::HostTick => Some(&mut node.host_timer),
                Timer::AgentTick => Some(&mut node.agent_timer),
                Timer::DirectoryRetry => None,
            }
        }
        match effect {
            Effect::Send { to, message } => self.route(from, to, message),
            Effect::SetTimer { timer: which, at } => match timer(self, which) {
                Some(slot) => *slot = Some(at),
                None => error!(
                    ?which,
                    "a host node has no such timer: the effect was dropped"
                ),
            },
            Effect::CancelTimer { timer: which } => match timer(self, which) {
                Some(slot) => *slot = None,
                None => error!(
                    ?which,
                    "a host node has no such timer: the effect was dropped"
                ),
            },
            // Neither the proxy nor the host persists or watches routes: one that did would be
            // a machine bug, said loudly rather than ignored.
            Effect::Persist(record) => {
                error!(?record, "a host node has no log: the record was dropped");
            }
            Effect::WatchRoute { target } | Effect::UnwatchRoute { target } => {
                error!(%target, "a host node watches no routes: the effect was dropped");
            }
        }
    }

    /// Sends `message` where `to` lives: this node (local queue), the directory, or a peer.
    fn route(&mut self, from: Address, to: Address, message: Message) {
        if to.node == self.node {
            self.local.push_back((from, to, message));
            return;
        }
        if self.metrics.is_some() {
            match &message {
                Message::Chunk { bytes, .. } => self.count_chunk("sent", bytes.as_slice().len()),
                Message::ChunkRequest { reply_to, .. } => {
                    if self.transfers.insert(*reply_to)
                        && let Some(metrics) = &self.metrics
                    {
                        metrics.transfers_started.inc();
                    }
                }
                _ => {}
            }
        }
        let frame = Link::Frame(Envelope { from, to, message });
        if to.node == NodeId(0) {
            if let Some(conn) = self.directory.up() {
                let _ = self.net.send(conn, frame);
            }
            return;
        }
        self.send_to_peer(to.node, frame);
    }

    /// Sends `frame` to host `node`: on its connection, queued for its handshake, or waiting
    /// for the directory to say where it listens.
    fn send_to_peer(&mut self, node: NodeId, frame: Link) {
        let now = self.clock.now();
        match self.peer_links.route(now, node, frame, &mut self.actions) {
            Ok(Routed::Sent | Routed::Queued) => self.conn_actions(),
            // Lost as the network may lose it: transfers ask again on their timeout.
            Ok(Routed::Dropped) => debug!(%node, "peer backlog full: frame dropped"),
            Err(frame) => self.connect_peer(node, frame),
        }
    }

    /// Starts this host's connection to `node`; `first` waits for its handshake. If the host
    /// does not know where `node` listens, `first` waits in the book for the directory's
    /// answer to a `WhereIs`.
    fn connect_peer(&mut self, node: NodeId, first: Link) {
        let Some(listen) = self.book.listen(node) else {
            let link = self.directory.up();
            match self
                .book
                .park(self.clock.now(), node, first, link.is_some())
            {
                Parked::Ask => {
                    if let Some(conn) = link {
                        let _ = self.net.send(conn, Link::WhereIs(node));
                    }
                }
                Parked::Waiting => {}
                Parked::Dropped => {
                    debug!(%node, "too many frames wait for peers' addresses: frame dropped");
                }
            }
            return;
        };
        // The book holds literal addresses: names were looked up before they went in.
        let conn =
            literal(listen).and_then(|address| self.net.connect(address, Limits::peer()).ok());
        match conn {
            Some(conn) => self
                .peer_links
                .connecting(self.clock.now(), node, conn, first),
            None => {
                self.book.forget(node);
                debug!(%node, "no connection to the peer: frame dropped");
            }
        }
    }

    /// Takes the answers of the name lookups: a peer's address goes into the book (its frames
    /// go out), a directory's is where the link's next attempt goes.
    fn lookups_answered(&mut self) {
        for answer in self.peer_names.answers() {
            let node = answer.key;
            match answer.addresses {
                Ok(addresses) => {
                    // The first: the book keeps one address per host (a connection that fails
                    // makes it ask, and look up, again).
                    let address = addresses[0];
                    debug!(%node, listen = %answer.name, %address, "peer's name looked up");
                    if let Ok(frames) = self.book.located(node, Some(address.to_string())) {
                        for frame in frames {
                            self.send_to_peer(node, frame);
                        }
                    }
                }
                Err(why) => self.unresolved_peer(node, &answer.name, &why),
            }
        }
        for answer in self.directory_names.answers() {
            match answer.addresses {
                Ok(addresses) => {
                    // Only for the address as it is now (a learned one may have been
                    // replaced meanwhile).
                    let current = self.directories.get(answer.key) == Some(&answer.name);
                    if let Some(slot) = self
                        .directory_resolved
                        .get_mut(answer.key)
                        .filter(|_| current)
                    {
                        slot.answered(addresses);
                    }
                    if self.directory_waits_for_name {
                        // The attempt that found no address is made again now (at the address
                        // the link moved on to: they are looked up from the start).
                        self.directory_waits_for_name = false;
                        self.directory.retry_now(self.clock.now());
                    }
                }
                Err(why) => self.unresolved_directory(&answer.name, &why),
            }
        }
    }

    /// `node`'s listen name did not resolve (`why`): the frames that waited for it are
    /// dropped (every protocol between hosts asks again). Logged at most every 10 s: any host
    /// may name any listen address.
    fn unresolved_peer(&mut self, node: NodeId, name: &str, why: &str) {
        let dropped = self.book.located(node, None).err().unwrap_or(0);
        if let Some(since) = self
            .unresolved_peers
            .occur(std::time::Instant::now(), FORGED_WARN_EVERY)
        {
            warn!(
                %node,
                listen = %name,
                reason = %why,
                dropped,
                unlogged_since_last_warning = since,
                "a peer's listen address does not resolve: the frames for it were dropped"
            );
        }
    }

    /// A directory address did not resolve (`why`): its attempts go where it resolved last,
    /// if anywhere, and it is looked up again at the next attempt.
    fn unresolved_directory(&mut self, name: &str, why: &str) {
        if let Some(since) = self
            .unresolved_directory
            .occur(std::time::Instant::now(), FORGED_WARN_EVERY)
        {
            warn!(
                directory = %name,
                reason = %why,
                unlogged_since_last_warning = since,
                "a directory address does not resolve"
            );
        }
    }

    /// The directory address the link's attempt goes to (or went to, or goes to next).
    fn directory_address(&self) -> &str {
        &self.directories[self.directory.candidate()]
    }

    /// Starts an attempt at the directory's current address (the link moves on to the next
    /// one if it fails).
    /// Address `index` of the directory was learned (added, or put in place of the one
    /// learned before): the link counts it, and it is looked up afresh.
    fn learned_directory(&mut self, index: usize) {
        if self.directory.candidates() <= index && self.directory.add_candidate().is_none() {
            return;
        }
        self.directory_resolved
            .resize(self.directories.len(), Addresses::default());
        self.directory_resolved[index] = Addresses::default();
        let address = &self.directories[index];
        info!(directory = %address, "learned a directory address: a replica named the leader there");
        if literal(address).is_none() {
            self.directory_names.start(self.clock.now(), index, address);
        }
    }

    fn connect_directory(&mut self, now: Instant) {
        let address = self.directory_address().to_owned();
        let candidate = self.directory.candidate();
        // A name is looked up again at every attempt, off this thread; the attempt goes to
        // what it resolved to last (the first attempt waits for the first answer).
        let resolved = literal(&address).or_else(|| {
            if self.directory_names.start(now, candidate, &address) == Started::Full {
                // (At most 16 addresses: unreachable with the 64 the resolver takes.)
                self.unresolved_directory(&address, "too many names are being looked up");
            }
            let next = self.directory_resolved.get_mut(candidate)?.next_address();
            self.directory_waits_for_name = next.is_none();
            next
        });
        let conn = match resolved {
            Some(resolved) => self
                .net
                .connect(resolved, Limits::peer())
                .map_err(|e| e.to_string()),
            None => Err("its name is being looked up".to_owned()),
        };
        match conn {
            Ok(conn) => {
                debug!(conn, directory = %address, "connecting to the directory");
                self.directory.connecting(now, conn);
            }
            Err(reason) => {
                debug!(directory = %address, %reason, "cannot connect to the directory");
                self.directory.connect_failed(now);
            }
        }
    }

    fn drain_local(&mut self) {
        while let Some((from, to, message)) = self.local.pop_front() {
            self.deliver(from, to, message);
        }
    }

    /// A frame another node sent (a peer host or the directory), for an actor of this one:
    /// delivered unless no other node may send it. A child hears only its own host
    /// (`ToChild`, from the local queue) and speaks only on its socket (`FromChild`), and no
    /// connection speaks for this node: a peer that addressed a child could otherwise hand it
    /// events its host never sent (a write grant of any offset and length, whose staging
    /// buffer the host would make), and one that claimed this node's address could speak for
    /// its children.
    fn deliver_remote(&mut self, from: Address, to: Address, message: Message) {
        let for_child = (FIRST_CHILD_ACTOR..FIRST_HOST_ACTOR).contains(&to.actor);
        let child_frame = matches!(message, Message::ToChild(_) | Message::FromChild(_));
        if from.node == self.node || for_child || child_frame {
            if let Some(since) = self
                .forged
                .occur(std::time::Instant::now(), FORGED_WARN_EVERY)
            {
                warn!(
                    %from,
                    %to,
                    dropped_since_last_warning = since,
                    "another node sent a frame only this host may send (to or for one of its \
                     children): dropped"
                );
            }
            return;
        }
        self.deliver(from, to, message);
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
            let waiting = !self.agent.pending().is_empty();
            if self
                .agent
                .handle_message(&message, &mut self.outbox)
                .is_ok()
            {
                self.agent_effects();
                if waiting && self.agent.pending().is_empty() {
                    info!(
                        incarnation = self.incarnation,
                        "the directory knows this host restarted: the blobs of its earlier \
                         incarnations are lost"
                    );
                }
            }
            return;
        }
        if let Some(&conn) = self.child_by_address.get(&to) {
            match message {
                Message::ToChild(event @ ChildEvent::WriteGranted { lease, .. }) => {
                    // The child writes into a staging buffer of its own (the arena is
                    // read-only to it); the host copies it into the lease at the seal.
                    let sent = match self.arena.stage_write(conn, lease.offset, lease.length) {
                        Ok(fd) => self.net.send_with_fd(conn, event, fd),
                        Err(_) => false,
                    };
                    if !sent {
                        // No buffer, no grant: the child is gone (its session closes, and the
                        // write with it).
                        self.drop_conn(conn);
                    }
                }
                Message::ToChild(event) => {
                    self.net.send(conn, event);
                }
                other => warn!(
                    child = %to,
                    frame = ?other,
                    "a frame for a child that is not a child event: dropped"
                ),
            }
            return;
        }
        if to.actor < FIRST_HOST_ACTOR && to.incarnation == self.incarnation {
            return; // A child that is gone.
        }
        if self
            .machine
            .handle_message(
                now,
                from,
                to,
                message,
                &mut HostMemory {
                    arena: &mut self.arena,
                    files: &self.files,
                },
                &mut self.outbox,
            )
            .is_ok()
        {
            self.host_effects();
        }
    }

    fn discovered(&mut self, found: Option<Discovered>) {
        let now = self.clock.now();
        self.proxy.handle_discovery(now, found, &mut self.outbox);
        self.proxy_effects();
    }

    fn handle(&mut self, event: NetEvent) {
        match event {
            NetEvent::Accepted { listener, conn } => self.accepted(listener, conn),
            NetEvent::Connected(conn) => self.connected(conn),
            NetEvent::Frame(conn, payload) => {
                if self.directory.conn() == Some(conn) {
                    self.directory_frame(conn, &payload);
                } else if self.children.contains_key(&conn) {
                    self.child_frame(conn, &payload);
                } else if self.controls.asked(conn, self.clock.now()) {
                    self.control_frame(conn, &payload);
                } else if self.peer_links.knows(conn) {
                    self.peer_frame(conn, &payload);
                }
            }
            NetEvent::Closed(conn, reason) => self.peer_closed(conn, &reason),
            NetEvent::Refused(conn, reason) => {
                self.peer_refused(conn);
                self.peer_closed(conn, &reason);
            }
        }
    }

    fn accepted(&mut self, listener: ListenerId, conn: ConnId) {
        let now = self.clock.now();
        let evicted = |oldest: ConnId, net: &Reactor, what: &str, max: usize| {
            if let Some(unlogged) = crate::throttle::EVICTED_LINES.occur() {
                info!(
                    conn = oldest,
                    remote = %net.remote(oldest),
                    unlogged,
                    "{what} connection closed: {max} connections wait for admission, and the \
                     oldest makes room for a new one (at most one such line every 10 s)"
                );
            }
        };
        if listener == self.child_listener {
            debug!(conn, remote = %self.net.remote(conn), "child connection accepted");
            if let Accepted::PendingEvicting(oldest) = self.child_admission.accepted(now, conn) {
                evicted(oldest, &self.net, "child", CHILDREN_PENDING_MAX);
                self.count_refusal(Refusal::Evicted);
                // Told why, as a busy host: a child whose hello was on its way may try again.
                let reason = format!(
                    "{CHILDREN_PENDING_MAX} connections wait for their hello at this host, and \
                     yours was the oldest"
                );
                self.net
                    .send(oldest, ChildGreeting::Refused { reason, busy: true });
                self.net.close_after_flush(oldest);
                self.children.remove(&oldest);
            }
            self.children.insert(conn, ChildConn::Pending);
        } else if listener == self.control_listener {
            debug!(conn, "control connection accepted");
            if let Some(oldest) = self.controls.accepted(conn, now) {
                debug!(
                    conn = oldest,
                    "control connection closed: {CONTROL_CONNECTIONS_MAX} were open, this one \
                     idle longest"
                );
                self.net.close(oldest);
            }
        } else if listener == self.peer_listener {
            debug!(conn, remote = %self.net.remote(conn), "host connection accepted");
            match fresh_nonce() {
                Ok(nonce) => {
                    self.peer_links
                        .accepted(now, conn, nonce, &mut self.actions);
                    self.conn_actions();
                }
                Err(e) => {
                    warn!(conn, error = %e, "connection closed: no nonce for its handshake");
                    self.net.close(conn);
                }
            }
        } else {
            self.net.close(conn);
        }
    }

    /// An outgoing connection is up: say hello.
    fn connected(&mut self, conn: ConnId) {
        let nonce = match fresh_nonce() {
            Ok(nonce) => nonce,
            Err(e) => {
                warn!(conn, error = %e, "connection closed: no nonce for its handshake");
                self.drop_conn(conn);
                return;
            }
        };
        if self.directory.conn() == Some(conn) {
            self.directory.connected(conn, nonce, &mut self.actions);
        } else {
            self.peer_links.connected(conn, nonce, &mut self.actions);
        }
        self.conn_actions();
    }

    /// A connection the peer closed, or that broke: logged, then forgotten.
    fn peer_closed(&mut self, conn: ConnId, reason: &str) {
        if self.directory.conn() == Some(conn) {
            let directory = self.directory_address();
            if self.directory.up().is_some() {
                warn!(%directory, reason, "lost the directory; reconnecting");
            } else {
                debug!(%directory, reason, "a connection attempt to the directory failed");
            }
        } else if let Some(child) = self.children.get(&conn) {
            match child {
                ChildConn::Attached { session, .. } => {
                    debug!(conn, %session, reason, "child detached");
                }
                ChildConn::Pending => {
                    debug!(conn, reason, "child connection closed before its hello");
                }
            }
        } else if let Some(node) = self.peer_links.outgoing_node(conn) {
            debug!(conn, %node, reason, "connection to a host closed");
        } else if let Some(node) = self.peer_links.incoming_node(conn) {
            debug!(conn, %node, reason, "connection from a host closed");
        } else if self.peer_links.knows(conn) {
            debug!(conn, reason, "host connection closed before admission");
        }
        self.closed(conn);
    }

    /// A connection to another host was refused (nothing listens there): the reads whose
    /// sources live on that host fail now instead of asking for their chunks until the
    /// attempts run out.
    fn peer_refused(&mut self, conn: ConnId) {
        let Some(node) = self.peer_links.outgoing_node(conn) else {
            return;
        };
        let now = self.clock.now();
        self.machine.handle_peer_refused(
            now,
            node,
            &mut HostMemory {
                arena: &mut self.arena,
                files: &self.files,
            },
            &mut self.outbox,
        );
        self.host_effects();
    }

    fn closed(&mut self, conn: ConnId) {
        if self.directory.conn() == Some(conn) {
            let now = self.clock.now();
            if self.directory.closed(now, conn) == LinkHeard::Lost {
                self.lost_directory();
            }
            return;
        }
        if self.controls.remove(conn) {
            return;
        }
        if let Some(child) = self.children.remove(&conn) {
            self.child_admission.closed(conn);
            self.arena.forget_owner(conn);
            if let ChildConn::Attached { address, session } = child {
                self.child_by_address.remove(&address);
                // The child is gone: its session closes on its behalf (Q24).
                self.deliver(address, session, Message::FromChild(ChildRequest::Close));
            }
            return;
        }
        // A connection to another host that closed: ask where it listens before the next one
        // (the answer may have gone stale with records a directory lost).
        if let Some(node) = self.peer_links.outgoing_node(conn) {
            self.book.forget(node);
        }
        self.peer_links.closed(conn);
    }

    /// Closes a connection this host gives up on (and forgets it).
    fn drop_conn(&mut self, conn: ConnId) {
        self.net.close(conn);
        self.closed(conn);
    }

    fn directory_frame(&mut self, conn: ConnId, payload: &[u8]) {
        let now = self.clock.now();
        // The address this frame came from: a failure moves the link on to the next one.
        let directory = self.directory_address().to_owned();
        let was_up = self.directory.up().is_some();
        let heard = self.directory.frame(now, conn, payload, &mut self.actions);
        self.conn_actions();
        match heard {
            LinkHeard::Nothing => {}
            LinkHeard::Welcomed {
                directory: address,
                epoch,
                ..
            } => {
                info!(
                    %directory,
                    directory_address = %address,
                    epoch = epoch.0,
                    "welcomed by the directory again"
                );
                if let Some(metrics) = &self.metrics {
                    metrics.directory_connected.set(1);
                }
                self.ask_peers(now);
                self.discovered(Some(Discovered { address, epoch }));
            }
            LinkHeard::Misnamed { node, incarnation } => {
                // Not a passing state: the directory answers every hello from this process
                // the same way. Stop, rather than wait for ever with every child call held.
                self.unknown = Some(format!(
                    "it welcomed this host as node {node} incarnation {incarnation}, not as node \
                     {} incarnation {} (the directory's log lost the records that named it, \
                     e.g. to a --repair-log cut, or another host uses this listen address)",
                    self.node, self.incarnation
                ));
            }
            LinkHeard::Located {
                node,
                listen: Some(name),
            } if literal(&name).is_none() && !name.is_empty() && name.len() <= LISTEN_BYTES_MAX => {
                // A name: looked up off this thread while the frames wait in the book (the
                // book's wait bounds both). An answer nothing waits for any more (asked again,
                // answered twice) starts no lookup.
                if self.book.is_asking(node) {
                    let now = self.clock.now();
                    if self.peer_names.start(now, node, &name) == Started::Full {
                        self.unresolved_peer(node, &name, "too many names are being looked up");
                    }
                }
            }
            LinkHeard::Located { node, listen } => match self.book.located(node, listen) {
                Ok(frames) => {
                    for frame in frames {
                        self.send_to_peer(node, frame);
                    }
                }
                // (Nothing waited: a question asked again, answered twice.)
                Err(0) => {}
                Err(dropped) => {
                    // A peer may name any node in a reply address: said at most every 10 s.
                    if let Some(since) = self
                        .unlocated
                        .occur(std::time::Instant::now(), FORGED_WARN_EVERY)
                    {
                        warn!(
                            %node,
                            dropped,
                            unlogged_since_last_warning = since,
                            "the directory knows no host with this node id: the frames for it \
                             were dropped"
                        );
                    }
                }
            },
            LinkHeard::Envelope(envelope) => {
                self.deliver_remote(envelope.from, envelope.to, envelope.message);
            }
            LinkHeard::Refused(reason) if is_full_refusal(&reason) => {
                // Passing (a member long away may be forgotten to make room): the link tries
                // again after its back-off.
                warn!(%directory, %reason, "the directory has no room for this host yet");
                if was_up {
                    self.lost_directory();
                }
            }
            LinkHeard::Refused(reason) => {
                // The directory does not take our key or version: a configuration error.
                error!(%directory, %reason, "the directory refused this host");
                self.refused = Some(HostError::Refused(reason));
            }
            LinkHeard::Unproven(why) => {
                // The directory cannot prove the key: not our cluster's directory.
                error!(%directory, %why, "the directory could not prove the cluster key");
                self.refused = Some(HostError::Unproven(why));
            }
            LinkHeard::NotLeader { leader } => {
                // A replica that does not serve: next, the one it names.
                let given = self.options.directories.len();
                let to = leader
                    .as_deref()
                    .and_then(|l| follow_named(&mut self.directories, given, l));
                if let Some((index, learned)) = to {
                    if learned {
                        self.learned_directory(index);
                    }
                    self.directory.redirect(self.clock.now(), index);
                }
                debug!(
                    %directory,
                    leader = leader.as_deref().unwrap_or("unknown"),
                    followed = to.is_some(),
                    "not the leader"
                );
            }
            LinkHeard::Protocol => {
                warn!(%directory, "the directory answered out of protocol; reconnecting");
                if was_up {
                    self.lost_directory();
                }
            }
            LinkHeard::Lost => {
                warn!(%directory, "the directory sent a frame out of protocol; reconnecting");
                self.lost_directory();
            }
        }
    }

    /// Asks the directory where the hosts that frames wait for listen (those not asked since
    /// the link was lost, or not answered within a second).
    fn ask_peers(&mut self, now: Instant) {
        let Some(conn) = self.directory.up() else {
            return;
        };
        for node in self.book.to_ask(now) {
            let _ = self.net.send(conn, Link::WhereIs(node));
        }
    }

    /// The link to the directory was up and is lost: nobody serves until it is welcomed again.
    fn lost_directory(&mut self) {
        self.book.link_lost();
        if let Some(metrics) = &self.metrics {
            metrics.directory_connected.set(0);
        }
        self.discovered(None);
    }

    fn peer_frame(&mut self, conn: ConnId, payload: &[u8]) {
        let now = self.clock.now();
        let heard = self.peer_links.frame(now, conn, payload, &mut self.actions);
        self.conn_actions();
        match heard {
            PeerHeard::Nothing => {}
            PeerHeard::Admitted { conn, node } => {
                debug!(conn, remote = %self.net.remote(conn), %node, "host admitted");
            }
            PeerHeard::Envelope(envelope) => {
                if let Message::Chunk { bytes, .. } = &envelope.message {
                    self.count_chunk("received", bytes.as_slice().len());
                }
                self.deliver_remote(envelope.from, envelope.to, envelope.message);
            }
            PeerHeard::Protocol { conn, node } => warn!(
                conn,
                %node,
                "host connection closed: a frame out of protocol, or not from its node"
            ),
            // Its frames are dropped (the protocols re-send; the next frame tries a new
            // connection).
            PeerHeard::Failed { conn, node } => {
                self.book.forget(node);
                info!(
                    conn,
                    %node,
                    "a host refused this host's connection, or failed its handshake"
                );
            }
        }
    }

    /// Does what the connection machines asked for, in order.
    fn conn_actions(&mut self) {
        let mut actions = std::mem::take(&mut self.actions);
        for action in actions.drain(..) {
            match perform_conn_action!(&mut self.net, action, "host connection") {
                Performed::Done => {}
                Performed::Closed(why) => self.count_closing(why),
                Performed::Persist(records) => {
                    error!(?records, "a host node has no log: the records were dropped");
                }
            }
        }
        self.actions = actions;
    }

    fn count_closing(&self, why: Closing) {
        if let Some(kind) = Refusal::closing(why) {
            self.count_refusal(kind);
        }
    }

    /// One request on the control socket: answered at once, in order.
    fn control_frame(&mut self, conn: ConnId, payload: &[u8]) {
        let request = match decode_value::<ControlRequest>(payload, CONTROL_FRAME_BYTES_MAX) {
            Ok(request) if request.version == CONTROL_VERSION => request,
            Ok(request) => {
                let reason = format!(
                    "control protocol version {} (this host speaks {CONTROL_VERSION})",
                    request.version
                );
                warn!(conn, %reason, "control request refused");
                self.net.send(conn, ControlReply::Refused(reason));
                self.net.close_after_flush(conn);
                self.controls.remove(conn);
                return;
            }
            Err(e) => {
                warn!(conn, error = %e, "control request refused: not a request");
                self.net.send(
                    conn,
                    ControlReply::Refused(format!("not a control request: {e}")),
                );
                self.net.close_after_flush(conn);
                self.controls.remove(conn);
                return;
            }
        };
        let reply = match request.command {
            ControlCommand::Sessions => ControlReply::Sessions(
                self.machine
                    .sessions()
                    .map(|(_, s)| SessionInfo {
                        session: s.address,
                        child: s.child,
                        state: match s.state {
                            SessionState::AwaitingAttachment => "awaiting-attachment",
                            SessionState::Running => "running",
                            SessionState::Closing => "closing",
                            SessionState::Closed => "closed",
                        }
                        .to_owned(),
                        bindings: s.ops.len() as u64,
                        published: s.published.len() as u64,
                    })
                    .collect(),
            ),
            ControlCommand::ArenaStats => ControlReply::ArenaStats(self.machine.arena_stats()),
            ControlCommand::Revoke { session } => {
                let now = self.clock.now();
                let child = self
                    .machine
                    .sessions()
                    .find(|(_, s)| s.address == session)
                    .and_then(|(_, s)| s.child);
                if self.machine.revoke_session(
                    now,
                    session,
                    &mut HostMemory {
                        arena: &mut self.arena,
                        files: &self.files,
                    },
                    &mut self.outbox,
                ) {
                    info!(%session, child = ?child.map(|c| c.to_string()), "session revoked by the operator");
                    // The child hears `Revoked` first (routed now), then its connection ends:
                    // a revoked child can do nothing more (its views are gone, Q24).
                    self.host_effects();
                    if let Some(conn) = child.and_then(|c| self.child_by_address.get(&c).copied()) {
                        // Closed once `Revoked` is out; a connection closed so reports nothing,
                        // so it is forgotten here (its admission slot, address and spares).
                        self.net.close_after_flush(conn);
                        self.closed(conn);
                    }
                    ControlReply::Revoked
                } else {
                    ControlReply::NoSuchSession
                }
            }
        };
        self.net.send(conn, reply);
    }

    fn child_frame(&mut self, conn: ConnId, payload: &[u8]) {
        match self.children.get(&conn) {
            Some(ChildConn::Pending) => self.child_hello(conn, payload),
            Some(&ChildConn::Attached { address, session }) => {
                match decode_value::<ChildRequest>(payload, FRAME_BYTES_MAX) {
                    Ok(request) => self.deliver(address, session, Message::FromChild(request)),
                    Err(e) => {
                        info!(conn, %session, error = %e, "child connection closed: an undecodable request");
                        self.count_refusal(Refusal::Protocol);
                        self.drop_conn(conn);
                    }
                }
            }
            None => {}
        }
    }

    /// Refuses a child's hello: the reason goes out, then the connection closes.
    fn refuse_child(&mut self, conn: ConnId, kind: Refusal, reason: String, busy: bool) {
        info!(conn, remote = %self.net.remote(conn), %reason, "child refused");
        self.count_refusal(kind);
        self.net.send(conn, ChildGreeting::Refused { reason, busy });
        self.net.close_after_flush(conn);
        self.child_admission.closed(conn);
        self.children.remove(&conn);
    }

    /// A child's hello: attach it (a session only for a valid capability), or refuse it.
    fn child_hello(&mut self, conn: ConnId, payload: &[u8]) {
        let hello = match decode_value::<ChildHello>(payload, FRAME_BYTES_MAX) {
            Ok(hello) => hello,
            Err(_) => {
                let refusal = HelloRefusal::NotAHello;
                return self.refuse_child(conn, Refusal::of(&refusal), refusal.to_string(), false);
            }
        };
        if let Err(refusal) = check_version(hello.magic, hello.version) {
            return self.refuse_child(conn, Refusal::of(&refusal), refusal.to_string(), false);
        }
        if let Err(refusal) = self.child_admission.admit(conn) {
            return self.refuse_child(conn, Refusal::of(&refusal), refusal.to_string(), true);
        }
        let job = JobContext::new(
            format!("c{}", self.next_session_generation),
            self.options.allow.clone(),
            self.options.allow.clone(),
        );
        let job = match job {
            Ok(job) => job,
            Err(e) => {
                error!(error = %e, "the host's job context is invalid");
                let reason = "the host's job context is invalid".to_owned();
                return self.refuse_child(conn, Refusal::Full, reason, false);
            }
        };
        let config = SessionConfig {
            session_generation: self.next_session_generation,
            capability: self.capability,
            job,
        };
        let child = Address::new(self.node, self.incarnation, self.next_child);
        let generation = self.machine.config().arena_generation;
        let attached = self.machine.attach_new(
            config,
            child,
            generation,
            hello.capability,
            &mut self.outbox,
        );
        let session = match attached {
            Ok(session) => session,
            Err(failure) => {
                let busy = failure == AttachmentFailure::SessionClosed;
                let kind = if busy {
                    Refusal::Full
                } else {
                    Refusal::Capability
                };
                return self.refuse_child(conn, kind, attach_refusal(&failure), busy);
            }
        };
        debug!(conn, remote = %self.net.remote(conn), %child, %session, "child attached");
        if let Some(metrics) = &self.metrics {
            metrics.children_attached.inc();
        }
        self.next_session_generation += 1;
        self.next_child += 1;
        let welcome = ChildGreeting::Welcome(ChildWelcome {
            child,
            session,
            arena_generation: generation,
            arena_size: self.arena.size(),
        });
        self.children.insert(
            conn,
            ChildConn::Attached {
                address: child,
                session,
            },
        );
        self.child_by_address.insert(child, conn);
        // The descriptor goes only to a child that proved its capability, and reads only.
        self.net.set_limits(conn, CHILD_LIMITS);
        if !self
            .net
            .send_with_fd(conn, welcome, self.arena_for_children.as_fd())
        {
            // Its session closes on its behalf.
            self.drop_conn(conn);
        }
        // `Attached`, after the welcome.
        self.host_effects();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_leader_is_one_of_the_given_addresses_or_the_one_learned_slot() {
        let mut addresses = vec!["r1:7801".to_owned(), "r2:7801".to_owned()];
        assert_eq!(follow_named(&mut addresses, 2, "r2:7801"), Some((1, false)));
        assert_eq!(follow_named(&mut addresses, 2, "r3:7801"), Some((2, true)));
        assert_eq!(addresses, ["r1:7801", "r2:7801", "r3:7801"]);
        assert_eq!(follow_named(&mut addresses, 2, "r3:7801"), Some((2, false)));
        // Another learned address takes the slot: the replaced one is not tried again.
        assert_eq!(follow_named(&mut addresses, 2, "r4:7801"), Some((2, true)));
        assert_eq!(addresses, ["r1:7801", "r2:7801", "r4:7801"]);
        let too_long = format!("{}:1", "h".repeat(LISTEN_BYTES_MAX));
        for bad in [
            "r5",
            ":7801",
            "r5:",
            "r5:70000",
            "r5:port",
            too_long.as_str(),
        ] {
            assert_eq!(follow_named(&mut addresses, 2, bad), None, "{bad:?}");
        }
        assert_eq!(addresses, ["r1:7801", "r2:7801", "r4:7801"], "unchanged");
        // No slot after as many addresses as a link follows.
        let mut full: Vec<String> = (0..DIRECTORY_CANDIDATES_MAX)
            .map(|i| format!("r{i}:7801"))
            .collect();
        assert_eq!(
            follow_named(&mut full, DIRECTORY_CANDIDATES_MAX, "x:1"),
            None
        );
        assert_eq!(full.len(), DIRECTORY_CANDIDATES_MAX);
    }
}

//! A node's connections as machines both drivers run: where each connection is in its
//! handshake, who it speaks for once admitted, the directory's table of admitted nodes and its
//! membership answers, a host's link to the directory (with its reconnect back-off) and a
//! host's links to other hosts (with the frames that wait for a handshake).
//!
//! The driver owns the sockets and numbers the connections ([`ConnId`]); it hands these
//! machines what happened (a connection accepted or made, a frame's bytes, a close, the time)
//! and executes the [`ConnAction`]s they append, in order. Nonces come from the driver too.
//! `dataplane-io` runs them over TCP; the simulator runs the same machines over simulated
//! connections, so hellos, proofs, admission, the waiting room and reconnects are simulated.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::admission::{self, Accepted, Admission, HelloRefusal, Nonce};
use crate::ids::{Address, AuthorityEpoch, NodeId};
use crate::limits::FRAME_BYTES_MAX;
use crate::link::{Acceptor, ClusterKey, Connector, HandshakeFailure, Link, Who};
use crate::log::LogRecord;
use crate::membership::{Admitted, Forgotten, Membership};
use crate::time::{Duration, Instant};
use crate::wire::{Envelope, decode_value};

mod book;
mod liveness;
pub use book::{
    ASK_AGAIN, ASK_WAIT, BOOK_ASKING_MAX, BOOK_KNOWN_MAX, BOOK_PARKED_MAX, BOOK_PARKED_TOTAL_MAX,
    Parked, PeerBook,
};
pub use liveness::{
    HOST_SILENCE_DEFAULT, PINGS_PER_SILENCE, Ping, Pinger, SILENCE_DEFAULT, SILENCE_MAX,
    SILENCE_MIN,
};

/// A connection, as the driver numbers it.
pub type ConnId = u64;

/// Why a machine closes or refuses a connection (for logs and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// Its first frame was not a hello of this protocol (or not one this listener takes).
    NotAHello,
    /// It speaks another protocol version.
    Version,
    /// It could not prove the cluster key.
    WrongKey,
    /// The node admits no more connections of its kind.
    Full,
    /// It was not admitted within the admission deadline (or, for a connection this node
    /// made, its handshake did not finish within [`HANDSHAKE_DEADLINE`]).
    Expired,
    /// The waiting room was full: the oldest pending connection made room.
    Evicted,
    /// An admitted connection sent a frame out of protocol, or about another node.
    Protocol,
    /// Its node connected again: the newer connection replaces it. Also a host's connection
    /// still in its handshake when the same host was admitted on another one: a dead boot's
    /// late proof must not restart the node under the live one.
    Replaced,
    /// The other end answered nothing for the silence bound (a stopped process, a partition
    /// that drops without closing): see [`Pinger`].
    Silent,
    /// A replica that does not serve said so ([`Link::NotLeader`]): the host tries where it
    /// pointed, or the next address.
    NotLeader,
}

impl Closing {
    /// The closing of a refused hello.
    pub fn of(refusal: &HelloRefusal) -> Closing {
        match refusal {
            HelloRefusal::NotAHello => Closing::NotAHello,
            HelloRefusal::Version { .. } => Closing::Version,
            HelloRefusal::WrongKey => Closing::WrongKey,
            HelloRefusal::Full => Closing::Full,
        }
    }
}

/// What a connection machine asks its driver to do. Execute them in order.
// Mostly frames: boxing them would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnAction {
    /// Send `link` on the connection.
    Send(ConnId, Link),
    /// Hand over the connection's next frame (one in its handshake is read a frame at a time).
    Resume(ConnId),
    /// The connection proved itself: it may carry frames of a node's size from now on.
    Admitted(ConnId),
    /// Send `Link::Refused { reason }`, then close the connection once that is flushed.
    Refuse {
        /// The connection.
        conn: ConnId,
        /// Why.
        why: Closing,
        /// What the peer is told.
        reason: String,
    },
    /// Close the connection now.
    Close(ConnId, Closing),
    /// Make these records durable (append them, then sync) before any later action. If that
    /// fails the node stops: nobody may hear an identity a crash could take back.
    Persist(Vec<LogRecord>),
}

/// Which hellos a listener takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    /// Hosts and clients (the directory node).
    HostsAndClients,
    /// Other hosts (a host's peer listener).
    Peers,
}

#[derive(Clone, Debug)]
enum Stage {
    /// Accepted; its hello is awaited (the nonce its challenge will carry).
    Hello(Nonce),
    /// Challenged; its proof is awaited.
    Proof(Acceptor, Who),
    /// Admitted.
    Admitted,
}

/// What a listener heard on a connection, beyond the actions it appended.
// Mostly frames: boxing them would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Nothing for the driver (a handshake step, a refusal, a close).
    Nothing,
    /// The connection proved itself as `who`.
    Admitted(Who),
    /// A frame on an admitted connection.
    Link(Link),
}

/// The accepting side of a node's connections: the handshake of each, and the bounded
/// waiting room ([`Admission`]) they pass through.
#[derive(Clone, Debug)]
pub struct Listener {
    key: Option<ClusterKey>,
    accepts: Accepts,
    admission: Admission,
    stages: BTreeMap<ConnId, Stage>,
}

impl Listener {
    /// A listener taking `accepts`, with its cluster key and the waiting room's bounds.
    pub fn new(
        key: Option<ClusterKey>,
        accepts: Accepts,
        deadline: Duration,
        pending_max: usize,
        admitted_max: usize,
    ) -> Listener {
        Listener {
            key,
            accepts,
            admission: Admission::new(deadline, pending_max, admitted_max),
            stages: BTreeMap::new(),
        }
    }

    /// A connection was accepted; `nonce` is fresh, for its challenge. The oldest waiting
    /// connection may have to make room.
    pub fn accepted(
        &mut self,
        now: Instant,
        conn: ConnId,
        nonce: Nonce,
        out: &mut Vec<ConnAction>,
    ) {
        if let Accepted::PendingEvicting(oldest) = self.admission.accepted(now, conn) {
            self.stages.remove(&oldest);
            out.push(ConnAction::Close(oldest, Closing::Evicted));
        }
        self.stages.insert(conn, Stage::Hello(nonce));
    }

    /// A frame arrived on `conn` (its payload exactly as it arrived).
    pub fn frame(&mut self, conn: ConnId, payload: &[u8], out: &mut Vec<ConnAction>) -> Heard {
        let Some(stage) = self.stages.remove(&conn) else {
            return Heard::Nothing;
        };
        match stage {
            Stage::Hello(nonce) => match Acceptor::answer(payload, nonce, self.key.as_ref()) {
                Ok((acceptor, who, challenge)) if self.takes(&who) => {
                    out.push(ConnAction::Send(conn, challenge));
                    out.push(ConnAction::Resume(conn));
                    self.stages.insert(conn, Stage::Proof(acceptor, who));
                    Heard::Nothing
                }
                Ok(_) => self.refuse(conn, &HelloRefusal::NotAHello, out),
                Err(refusal) => self.refuse(conn, &refusal, out),
            },
            Stage::Proof(acceptor, who) => {
                let checked = decode_value::<Link>(payload, admission::HELLO_FRAME_BYTES_MAX)
                    .map_err(|_| HelloRefusal::NotAHello)
                    .and_then(|proof| acceptor.check(&proof))
                    .and_then(|()| self.admission.admit(conn));
                match checked {
                    Ok(()) => {
                        out.push(ConnAction::Admitted(conn));
                        self.stages.insert(conn, Stage::Admitted);
                        Heard::Admitted(who)
                    }
                    Err(refusal) => self.refuse(conn, &refusal, out),
                }
            }
            Stage::Admitted => match decode_value::<Link>(payload, FRAME_BYTES_MAX) {
                Ok(link) => {
                    self.stages.insert(conn, Stage::Admitted);
                    Heard::Link(link)
                }
                Err(_) => {
                    self.close(conn, Closing::Protocol, out);
                    Heard::Nothing
                }
            },
        }
    }

    fn takes(&self, who: &Who) -> bool {
        match self.accepts {
            Accepts::HostsAndClients => matches!(who, Who::Host { .. } | Who::Client),
            Accepts::Peers => matches!(who, Who::Peer { .. }),
        }
    }

    /// Refuses `conn`: the reason goes out, then the connection closes.
    pub fn refuse(
        &mut self,
        conn: ConnId,
        refusal: &HelloRefusal,
        out: &mut Vec<ConnAction>,
    ) -> Heard {
        self.refuse_with(conn, Closing::of(refusal), refusal.to_string(), out);
        Heard::Nothing
    }

    /// Refuses `conn` with a reason of the caller's.
    pub fn refuse_with(
        &mut self,
        conn: ConnId,
        why: Closing,
        reason: String,
        out: &mut Vec<ConnAction>,
    ) {
        self.forget(conn);
        out.push(ConnAction::Refuse { conn, why, reason });
    }

    /// Closes every connection but `admitted` that proved nothing yet and said hello as the
    /// host listening on `listen`: that host was just admitted on `admitted`. The one left
    /// in its handshake is a dead boot's (its proof on the way when the process died) or an
    /// attempt the host gave up; its late proof would restart the node again, under the
    /// live process. A live host whose attempt this was connects again.
    pub fn close_handshakes_of(
        &mut self,
        listen: &str,
        admitted: ConnId,
        out: &mut Vec<ConnAction>,
    ) {
        let stale: Vec<ConnId> = self
            .stages
            .iter()
            .filter(|&(&conn, stage)| {
                conn != admitted
                    && matches!(stage, Stage::Proof(_, Who::Host { listen: l, .. }) if l == listen)
            })
            .map(|(&conn, _)| conn)
            .collect();
        for conn in stale {
            self.close(conn, Closing::Replaced, out);
        }
    }

    /// Closes `conn` (the machine's owner gives up on it).
    pub fn close(&mut self, conn: ConnId, why: Closing, out: &mut Vec<ConnAction>) {
        self.forget(conn);
        out.push(ConnAction::Close(conn, why));
    }

    /// The connection is gone (closed by the peer, or broke). `true` if it was admitted.
    pub fn closed(&mut self, conn: ConnId) -> bool {
        let admitted = matches!(self.stages.get(&conn), Some(Stage::Admitted));
        self.forget(conn);
        admitted
    }

    fn forget(&mut self, conn: ConnId) {
        self.stages.remove(&conn);
        self.admission.closed(conn);
    }

    /// Closes every connection not admitted within the deadline.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<ConnAction>) {
        for conn in self.admission.expired(now) {
            self.stages.remove(&conn);
            out.push(ConnAction::Close(conn, Closing::Expired));
        }
    }

    /// When the oldest waiting connection's deadline passes.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.admission.next_deadline()
    }

    /// Whether `conn` is known (in its handshake or admitted).
    pub fn knows(&self, conn: ConnId) -> bool {
        self.stages.contains_key(&conn)
    }

    /// Whether `conn` was admitted.
    pub fn is_admitted(&self, conn: ConnId) -> bool {
        matches!(self.stages.get(&conn), Some(Stage::Admitted))
    }

    /// Connections waiting to be admitted.
    pub fn pending_count(&self) -> usize {
        self.admission.pending_count()
    }

    /// Admitted connections still open.
    pub fn admitted_count(&self) -> usize {
        self.admission.admitted_count()
    }

    /// The waiting room's bounds hold, and it agrees with the stages.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.admission.check_invariants()?;
        for (conn, stage) in &self.stages {
            let fine = match stage {
                Stage::Admitted => self.admission.is_admitted(*conn),
                _ => self.admission.is_pending(*conn),
            };
            if !fine {
                return Err(format!(
                    "connection {conn}: its stage and the waiting room disagree"
                ));
            }
        }
        if self.stages.len() != self.admission.pending_count() + self.admission.admitted_count() {
            return Err("the waiting room holds connections with no stage".to_owned());
        }
        Ok(())
    }
}

/// An admitted connection of the directory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The node it speaks for.
    pub node: NodeId,
    /// That node's incarnation.
    pub incarnation: u64,
    /// A host (`false`: a client with a transient node id).
    pub host: bool,
}

/// What the directory node's connections heard, beyond the actions.
// Mostly frames: boxing them would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirHeard {
    /// Nothing for the driver.
    Nothing,
    /// A host proved itself and was welcomed: how membership took its hello.
    Host {
        /// Its connection.
        conn: ConnId,
        /// Where it listens.
        listen: String,
        /// New, restarted or reconnected, with its identity.
        admitted: Admitted,
        /// The member forgotten to make room for it, if the table was full.
        forgot: Option<Forgotten>,
    },
    /// A host proved itself but membership refused it (the reason went out to it).
    HostRefused {
        /// Its connection.
        conn: ConnId,
        /// Where it listens.
        listen: String,
        /// Why.
        reason: String,
    },
    /// A client proved itself and was welcomed as a transient node.
    Client {
        /// Its connection.
        conn: ConnId,
        /// Its transient node id.
        node: NodeId,
    },
    /// A frame for the directory machine from an admitted node, speaking only for it.
    Envelope(Envelope),
    /// An admitted node sent a frame out of protocol or about another node: closed.
    Protocol {
        /// Its connection.
        conn: ConnId,
        /// The node it spoke for.
        node: NodeId,
    },
}

/// The directory node's connections: the listener, the node each admitted connection speaks
/// for, membership's answer to every host hello (durable before the `Welcome`), the peer table
/// it announces, and "a connection speaks only for its own node" on every frame.
///
/// It also decides which member a full membership may forget ([`Membership::admit_forgetting`]):
/// only a host that is not connected, has been away for at least the node's
/// [`DirectoryConns::forget_away_after`] (counted from when its connection closed, or from
/// when these connections started for a host not seen since), and that the namespace does not
/// name.
#[derive(Clone, Debug)]
pub struct DirectoryConns {
    listener: Listener,
    attached: BTreeMap<ConnId, Attached>,
    by_node: BTreeMap<NodeId, ConnId>,
    next_transient: u64,
    /// When these connections started: "away since" for a member not seen since.
    started: Instant,
    /// When each host that was connected and is no longer lost its connection (at most one
    /// row per member: a row goes when its host connects again or is forgotten).
    away_since: BTreeMap<NodeId, Instant>,
    /// How long a host must have been away before a full membership may forget it.
    forget_after: Duration,
    /// How long a host's connection may carry nothing before it is closed.
    host_silence: Duration,
    /// When each admitted host connection last carried a frame, and the deadline under which
    /// it waits in `silence_queue`.
    heard: BTreeMap<ConnId, (Instant, Instant)>,
    /// Host connections by a deadline at which they may have gone silent (the real deadline
    /// is their last frame's; a connection found heard since is queued again).
    silence_queue: BTreeSet<(Instant, ConnId)>,
}

/// How long a host must have been away before a full membership may forget it, unless the
/// node sets another ([`DirectoryConns::set_forget_away_after`]).
pub const FORGET_AWAY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

impl DirectoryConns {
    /// Connections of a directory node whose clients get node ids from `first_transient` on,
    /// started at `now`.
    pub fn new(listener: Listener, first_transient: u64, now: Instant) -> DirectoryConns {
        DirectoryConns {
            listener,
            attached: BTreeMap::new(),
            by_node: BTreeMap::new(),
            next_transient: first_transient,
            started: now,
            away_since: BTreeMap::new(),
            forget_after: FORGET_AWAY_AFTER,
            host_silence: HOST_SILENCE_DEFAULT,
            heard: BTreeMap::new(),
            silence_queue: BTreeSet::new(),
        }
    }

    /// Sets how long a host's connection may carry nothing before it is closed (hosts ping
    /// every quarter of their own silence bound, at most [`SILENCE_MAX`]).
    pub fn set_host_silence(&mut self, silence: Duration) {
        self.host_silence = silence;
    }

    /// How long a host's connection may carry nothing before it is closed.
    pub fn host_silence(&self) -> Duration {
        self.host_silence
    }

    /// Sets how long a host must have been away before a full membership may forget it.
    pub fn set_forget_away_after(&mut self, after: Duration) {
        self.forget_after = after;
    }

    /// How long a host must have been away before a full membership may forget it.
    pub fn forget_away_after(&self) -> Duration {
        self.forget_after
    }

    /// Whether a full membership may forget `node` at `now`, given the nodes the namespace
    /// names (asked for at most once per hello, and only when the membership is full).
    fn may_forget(
        &self,
        node: NodeId,
        now: Instant,
        named: &mut Option<BTreeSet<NodeId>>,
        namespace: &mut dyn FnMut() -> BTreeSet<NodeId>,
    ) -> bool {
        if self.by_node.contains_key(&node) {
            return false;
        }
        let since = self.away_since.get(&node).copied().unwrap_or(self.started);
        if now.saturating_since(since) < self.forget_after {
            return false;
        }
        !named.get_or_insert_with(namespace).contains(&node)
    }

    /// A connection was accepted (see [`Listener::accepted`]).
    pub fn accepted(
        &mut self,
        now: Instant,
        conn: ConnId,
        nonce: Nonce,
        out: &mut Vec<ConnAction>,
    ) {
        self.listener.accepted(now, conn, nonce, out);
    }

    /// A frame arrived on `conn` at `now`. `membership` answers host hellos (making room when
    /// it is full: `namespace` gives the nodes the namespace names, see
    /// [`DirectoryConns::forget_away_after`]); `directory` and `epoch` go into the welcome.
    #[allow(clippy::too_many_arguments)]
    pub fn frame(
        &mut self,
        now: Instant,
        conn: ConnId,
        payload: &[u8],
        membership: &mut Membership,
        namespace: &mut dyn FnMut() -> BTreeSet<NodeId>,
        directory: Address,
        epoch: AuthorityEpoch,
        out: &mut Vec<ConnAction>,
    ) -> DirHeard {
        match self.listener.frame(conn, payload, out) {
            Heard::Nothing => DirHeard::Nothing,
            Heard::Admitted(Who::Host { listen, boot_nonce }) => {
                let mut named = None;
                let admitted = membership.admit_forgetting(&listen, boot_nonce, |node| {
                    self.may_forget(node, now, &mut named, namespace)
                });
                match admitted {
                    Ok((admitted, records, forgot)) => {
                        if !records.is_empty() {
                            out.push(ConnAction::Persist(records));
                        }
                        if let Some(f) = &forgot {
                            self.away_since.remove(&f.member.node);
                        }
                        self.listener.close_handshakes_of(&listen, conn, out);
                        let m = admitted.member();
                        self.attach(
                            now,
                            conn,
                            m.node,
                            m.incarnation,
                            true,
                            directory,
                            epoch,
                            out,
                        );
                        DirHeard::Host {
                            conn,
                            listen,
                            admitted,
                            forgot,
                        }
                    }
                    Err(e) => {
                        let reason = e.to_string();
                        self.listener
                            .refuse_with(conn, Closing::Full, reason.clone(), out);
                        DirHeard::HostRefused {
                            conn,
                            listen,
                            reason,
                        }
                    }
                }
            }
            Heard::Admitted(Who::Client) => {
                let node = NodeId(self.next_transient);
                self.next_transient += 1;
                self.attach(now, conn, node, 1, false, directory, epoch, out);
                DirHeard::Client { conn, node }
            }
            Heard::Admitted(Who::Peer { .. }) => {
                // The listener takes no peer hellos; refused all the same if one got here.
                self.listener.refuse(conn, &HelloRefusal::NotAHello, out);
                DirHeard::Nothing
            }
            Heard::Link(link) => {
                let Some(&Attached { node, host, .. }) = self.attached.get(&conn) else {
                    self.listener.close(conn, Closing::Protocol, out);
                    return DirHeard::Nothing;
                };
                if let Some((heard, _)) = self.heard.get_mut(&conn) {
                    *heard = now;
                }
                match link {
                    // Whatever else is going on: the host judges this node by it.
                    Link::Ping { seq } => {
                        out.push(ConnAction::Send(conn, Link::Pong { seq }));
                        DirHeard::Nothing
                    }
                    Link::Frame(envelope) if admission::speaks_for(node, &envelope) => {
                        DirHeard::Envelope(envelope)
                    }
                    // Only hosts connect to other hosts. One small answer per question: a
                    // host that does not read fills only its own queue.
                    Link::WhereIs(asked) if host => {
                        let listen = membership.listen_of(asked).map(str::to_owned);
                        out.push(ConnAction::Send(
                            conn,
                            Link::Located {
                                node: asked,
                                listen,
                            },
                        ));
                        DirHeard::Nothing
                    }
                    _ => {
                        self.close(now, conn, Closing::Protocol, out);
                        DirHeard::Protocol { conn, node }
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attach(
        &mut self,
        now: Instant,
        conn: ConnId,
        node: NodeId,
        incarnation: u64,
        host: bool,
        directory: Address,
        epoch: AuthorityEpoch,
        out: &mut Vec<ConnAction>,
    ) {
        if host {
            self.away_since.remove(&node);
            let at = now.saturating_add(self.host_silence);
            self.heard.insert(conn, (now, at));
            self.silence_queue.insert((at, conn));
        }
        if let Some(old) = self.by_node.insert(node, conn)
            && old != conn
        {
            // The node's earlier connection: the new one replaces it.
            self.attached.remove(&old);
            self.unqueue(old);
            self.listener.close(old, Closing::Replaced, out);
        }
        self.attached.insert(
            conn,
            Attached {
                node,
                incarnation,
                host,
            },
        );
        out.push(ConnAction::Send(
            conn,
            Link::Welcome {
                node,
                incarnation,
                directory,
                epoch,
            },
        ));
    }

    /// Closes `conn` at `now`; returns the node that became unreachable with it, if any.
    pub fn close(
        &mut self,
        now: Instant,
        conn: ConnId,
        why: Closing,
        out: &mut Vec<ConnAction>,
    ) -> Option<NodeId> {
        self.listener.close(conn, why, out);
        self.detach(now, conn)
    }

    /// The connection is gone (noticed at `now`); returns the node that became unreachable
    /// with it, if any.
    pub fn closed(&mut self, now: Instant, conn: ConnId) -> Option<NodeId> {
        self.listener.closed(conn);
        self.detach(now, conn)
    }

    /// `conn` no longer waits for its silence.
    fn unqueue(&mut self, conn: ConnId) {
        if let Some((_, at)) = self.heard.remove(&conn) {
            self.silence_queue.remove(&(at, conn));
        }
    }

    fn detach(&mut self, now: Instant, conn: ConnId) -> Option<NodeId> {
        self.unqueue(conn);
        let a = self.attached.remove(&conn)?;
        (self.by_node.get(&a.node) == Some(&conn)).then(|| {
            self.by_node.remove(&a.node);
            if a.host {
                self.away_since.insert(a.node, now);
            }
            a.node
        })
    }

    /// When `node`'s host lost its connection, if it was connected since these connections
    /// started and is not now.
    pub fn away_since(&self, node: NodeId) -> Option<Instant> {
        self.away_since.get(&node).copied()
    }

    /// Closes every connection not admitted within the deadline, and every host connection
    /// that carried nothing for the host silence bound (a stopped host, or one cut off by a
    /// partition that drops without closing: hosts ping). Returns the nodes that became
    /// unreachable with those (the driver reports them to its routes).
    pub fn expire(&mut self, now: Instant, out: &mut Vec<ConnAction>) -> Vec<NodeId> {
        self.listener.expire(now, out);
        let mut silent = Vec::new();
        while let Some(&(at, conn)) = self.silence_queue.first()
            && at <= now
        {
            self.silence_queue.pop_first();
            let Some(&(heard, _)) = self.heard.get(&conn) else {
                continue;
            };
            let due = heard.saturating_add(self.host_silence);
            if due > now {
                self.heard.insert(conn, (heard, due));
                self.silence_queue.insert((due, conn));
            } else if let Some(node) = self.close(now, conn, Closing::Silent, out) {
                silent.push(node);
            }
        }
        silent
    }

    /// When something next expires: the oldest waiting connection's deadline, or a host
    /// connection's silence (perhaps early: see [`Self::expire`]).
    pub fn next_deadline(&self) -> Option<Instant> {
        let silence = self.silence_queue.first().map(|&(at, _)| at);
        match (self.listener.next_deadline(), silence) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The connection to `node`, if it is connected.
    pub fn conn_of(&self, node: NodeId) -> Option<ConnId> {
        self.by_node.get(&node).copied()
    }

    /// Who an admitted connection speaks for.
    pub fn attached(&self, conn: ConnId) -> Option<&Attached> {
        self.attached.get(&conn)
    }

    /// Hosts connected now.
    pub fn hosts_connected(&self) -> usize {
        self.attached.values().filter(|a| a.host).count()
    }

    /// The listener (its counts).
    pub fn listener(&self) -> &Listener {
        &self.listener
    }

    /// The tables agree: every node's connection is admitted and speaks for it.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.listener.check_invariants()?;
        for (node, conn) in &self.by_node {
            match self.attached.get(conn) {
                Some(a) if a.node == *node && self.listener.is_admitted(*conn) => {}
                _ => {
                    return Err(format!(
                        "node {node}'s connection {conn} is not admitted for it"
                    ));
                }
            }
        }
        if self.attached.len() != self.by_node.len() {
            return Err("an admitted connection is nobody's".to_owned());
        }
        let hosts = self.attached.iter().filter(|(_, a)| a.host).map(|(c, _)| c);
        if !hosts.eq(self.heard.keys()) {
            return Err("the admitted host connections and those judged for silence differ".into());
        }
        if self.heard.len() != self.silence_queue.len()
            || self
                .heard
                .iter()
                .any(|(conn, &(_, at))| !self.silence_queue.contains(&(at, *conn)))
        {
            return Err("a host connection is not queued for its silence".to_owned());
        }
        if let Some(node) = self
            .away_since
            .keys()
            .find(|n| self.by_node.contains_key(n))
        {
            return Err(format!("node {node} is connected and counted as away"));
        }
        Ok(())
    }
}

/// The first back-off after a failed connection attempt to the directory, and the wait
/// before moving on to the next of its addresses within a round.
pub const RECONNECT_FIRST: Duration = Duration::from_millis(50);
/// The longest back-off between two connection attempts to the directory.
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// The longest round back-off with several directory addresses: a replicated directory is
/// without a leader for about an election timeout (1–1.2 s), and a host must find the next one
/// soon after (a round of three attempts every half second costs a follower nothing).
pub const RECONNECT_MAX_ROTATING: Duration = Duration::from_millis(500);
/// Most addresses a host may be given for the directory (one per replica of its group): a
/// round of attempts costs at least [`RECONNECT_FIRST`] per address.
pub const DIRECTORY_CANDIDATES_MAX: usize = 16;

/// `backoff` in the states below is the round back-off: the wait after a round of failed
/// attempts, which doubles per round (see [`DirectoryLink`]).
#[derive(Clone, Debug)]
enum LinkState {
    /// No connection; the next attempt is at `retry_at`. Entered when an attempt fails or the
    /// link is lost; left when the driver starts the next attempt.
    Down {
        retry_at: Instant,
        backoff: Duration,
    },
    /// The driver is connecting. Entered from `Down`; left when the connection is made or fails.
    Connecting { conn: ConnId, backoff: Duration },
    /// The hello went out; the challenge is awaited.
    Proving {
        conn: ConnId,
        connector: Connector,
        backoff: Duration,
    },
    /// The proof went out; the `Welcome` is awaited.
    Welcoming { conn: ConnId, backoff: Duration },
    /// Welcomed. Left when the connection is lost, breaks the protocol or goes silent.
    Up { conn: ConnId, pinger: Pinger },
}

/// What [`DirectoryLink::expire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkExpired {
    /// Nothing was due, or a ping went out.
    Nothing,
    /// The attempt under way did not finish its handshake in time: closed, and the next
    /// attempt backs off.
    Attempt,
    /// The welcomed directory answered none of the pings sent within the silence bound:
    /// closed, and the link is lost (as [`LinkHeard::Lost`]).
    Silent,
}

/// What a host's link to the directory heard, beyond the actions.
// Mostly frames: boxing them would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkHeard {
    /// Nothing for the driver.
    Nothing,
    /// Welcomed (the first time, or again after a reconnect as the same node and incarnation).
    Welcomed {
        /// This host's node id.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
        /// Who serves.
        directory: Address,
        /// Its authority epoch.
        epoch: AuthorityEpoch,
    },
    /// The directory welcomed this host as another node or incarnation than it runs as (the
    /// directory lost the records that named it, or another host uses its listen address):
    /// closed, and tried again later. The host node stops on it (`HostError::Unknown` in
    /// `dataplane-io`): the directory answers every hello from that process the same way.
    Misnamed {
        /// What the welcome said.
        node: NodeId,
        /// What the welcome said.
        incarnation: u64,
    },
    /// The directory's answer to [`Link::WhereIs`]: where `node` listens (`None`: no host
    /// has that node id). Hand it to the host's [`PeerBook::located`].
    Located {
        /// The node asked about.
        node: NodeId,
        /// Its listen address.
        listen: Option<String>,
    },
    /// A frame for this host.
    Envelope(Envelope),
    /// The directory refused this host: a configuration error, and the node stops.
    Refused(String),
    /// The directory could not prove the cluster key (why, in words): it is not of this
    /// host's cluster, or one side has no key. A configuration error, and the node stops.
    Unproven(String),
    /// The directory sent something out of protocol: closed, tried again later.
    Protocol,
    /// The address is a replica that does not serve (the attempt is closed, and counts as a
    /// failed one): it names the leader's address for hosts if it knows one. The driver may
    /// make that address the next attempt's ([`DirectoryLink::redirect`]).
    NotLeader {
        /// Where the replica says the leader takes hosts.
        leader: Option<String>,
    },
    /// The link was up and is lost: nobody serves until it is welcomed again.
    Lost,
}

/// A host's link to the directory node: connect, hello, proof, welcome, then frames; on a
/// failure, back off (doubling up to [`RECONNECT_MAX`]) and try again.
///
/// **Several addresses.** A replicated directory has one address per replica, and only its
/// leader serves (a follower names the leader and closes a host's connection: `NotLeader`, a
/// dead replica refuses it).
/// The driver numbers the addresses it was given, `0..candidates`
/// ([`Self::with_candidates`]), and connects each attempt to [`Self::candidate`]. Every failed
/// attempt (its connection failed, closed or expired before the `Welcome`, or the directory
/// broke the protocol) and every loss of a welcomed link moves on to the next address. Moving
/// on within a round of the addresses costs [`RECONNECT_FIRST`]; the back-off doubles once per
/// full round, so a leader behind two dead replicas is reached within a few round trips and a
/// group that is down entirely is tried as slowly as one directory is. With one address (the
/// default) every failure ends a round: the back-off is exactly the single directory's.
///
/// **Liveness.** A welcomed link pings the directory ([`Pinger`]) and is given up, as lost,
/// once none of the pings sent within its silence bound ([`SILENCE_DEFAULT`], or
/// [`Self::with_silence`]) was answered: a stopped directory or leader, or a partition that
/// drops without closing, would otherwise hold the host for as long as TCP keeps the
/// connection (minutes). An attempt whose address says nothing (no challenge) within that
/// bound is given up too, so that a stopped replica costs a rotation one bound, not the whole
/// [`HANDSHAKE_DEADLINE`]; and an address given up for silence is skipped by the rotation for
/// [`SILENT_ADDRESS_SKIPPED_FOR`] bounds while another address remains.
#[derive(Clone, Debug)]
pub struct DirectoryLink {
    who: Who,
    key: Option<ClusterKey>,
    identity: Option<(NodeId, u64)>,
    state: LinkState,
    /// When the current connection attempt started (its handshake must end by
    /// [`HANDSHAKE_DEADLINE`] after it).
    attempt_since: Instant,
    /// How many addresses the directory has (at least 1).
    candidates: usize,
    /// The address of the attempt under way, of the welcomed link, or of the next attempt
    /// while down (below `candidates`).
    candidate: usize,
    /// Attempts that failed since the current round of the addresses began (below
    /// `candidates`: the failure that ends a round starts the next one).
    failed_in_round: usize,
    /// How long the directory may answer nothing (see the liveness paragraph above).
    silence: Duration,
    /// The address last given up for silence, and until when the rotation skips it.
    skipped: Option<(usize, Instant)>,
}

/// How many silence bounds the rotation skips an address that went silent (while another
/// address remains): long enough for the rest of the group to elect a leader without the host
/// trying the stopped one again.
pub const SILENT_ADDRESS_SKIPPED_FOR: u64 = 4;

/// How long a connection of this host's (to the directory, or to another host) may take to
/// be made and finish its handshake: past it, the connection is closed and tried again, so a
/// peer that accepts and then says nothing cannot hold the link.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

impl DirectoryLink {
    /// A link that is down and tries at `now`. `who` is this host's hello; `identity` its node
    /// and incarnation once known (a welcome must then name them).
    pub fn new(who: Who, key: Option<ClusterKey>, now: Instant) -> DirectoryLink {
        DirectoryLink {
            who,
            key,
            identity: None,
            state: LinkState::Down {
                retry_at: now,
                backoff: RECONNECT_FIRST,
            },
            attempt_since: now,
            candidates: 1,
            candidate: 0,
            failed_in_round: 0,
            silence: SILENCE_DEFAULT,
            skipped: None,
        }
    }

    /// A link already welcomed on `conn` as `node` at `incarnation` (by a blocking first
    /// handshake that ended at `now`).
    pub fn welcomed(
        who: Who,
        key: Option<ClusterKey>,
        conn: ConnId,
        node: NodeId,
        incarnation: u64,
        now: Instant,
    ) -> DirectoryLink {
        DirectoryLink {
            who,
            key,
            identity: Some((node, incarnation)),
            state: LinkState::Up {
                conn,
                pinger: Pinger::new(now, SILENCE_DEFAULT),
            },
            attempt_since: now,
            candidates: 1,
            candidate: 0,
            failed_in_round: 0,
            silence: SILENCE_DEFAULT,
            skipped: None,
        }
    }

    /// The same link with another silence bound (see the liveness paragraph above).
    ///
    /// # Panics
    ///
    /// If `silence` is outside [`SILENCE_MIN`]..=[`SILENCE_MAX`]: the driver checks its
    /// settings first.
    #[must_use]
    pub fn with_silence(mut self, silence: Duration) -> DirectoryLink {
        assert!(
            (SILENCE_MIN..=SILENCE_MAX).contains(&silence),
            "a silence bound of {silence}: {SILENCE_MIN} to {SILENCE_MAX} are allowed"
        );
        self.silence = silence;
        if let LinkState::Up { pinger, .. } = &mut self.state {
            *pinger = Pinger::new(self.attempt_since, silence);
        }
        self
    }

    /// The silence bound.
    pub fn silence(&self) -> Duration {
        self.silence
    }

    /// The same link following a directory at `candidates` addresses, its current attempt
    /// (or welcomed connection, or next attempt) at address `current`. A fresh round starts.
    ///
    /// # Panics
    ///
    /// If `candidates` is 0 or above [`DIRECTORY_CANDIDATES_MAX`], or `current` is not below
    /// it: the driver checks the addresses it was given first.
    #[must_use]
    pub fn with_candidates(mut self, candidates: usize, current: usize) -> DirectoryLink {
        assert!(
            (1..=DIRECTORY_CANDIDATES_MAX).contains(&candidates),
            "{candidates} directory addresses: 1 to {DIRECTORY_CANDIDATES_MAX} are allowed"
        );
        assert!(
            current < candidates,
            "address {current} of {candidates} directory addresses"
        );
        self.candidates = candidates;
        self.candidate = current;
        self.failed_in_round = 0;
        self
    }

    /// One more address (the driver learned it: a replica named it as the leader's, and it
    /// is none of the addresses the host was given). Returns its number, or `None` when the
    /// link follows [`DIRECTORY_CANDIDATES_MAX`] addresses already. The round under way
    /// counts it from now on.
    pub fn add_candidate(&mut self) -> Option<usize> {
        if self.candidates >= DIRECTORY_CANDIDATES_MAX {
            return None;
        }
        self.candidates += 1;
        Some(self.candidates - 1)
    }

    /// The round back-off after `backoff`: twice it, at most [`RECONNECT_MAX`] for one
    /// address, [`RECONNECT_MAX_ROTATING`] for several.
    fn doubled(&self, backoff: Duration) -> Duration {
        let max = if self.candidates > 1 {
            RECONNECT_MAX_ROTATING
        } else {
            RECONNECT_MAX
        };
        backoff.saturating_mul(2).min(max)
    }

    /// The address (of `0..candidates`) the attempt under way goes to, the welcomed link
    /// went to, or the next attempt goes to while down.
    pub fn candidate(&self) -> usize {
        self.candidate
    }

    /// How many addresses the directory has.
    pub fn candidates(&self) -> usize {
        self.candidates
    }

    /// An attempt at the current address failed: moves on to the next one. Returns the wait
    /// before the next attempt and the round back-off from then on, given the round back-off
    /// `base` the attempt started with. Within a round the wait is [`RECONNECT_FIRST`] and
    /// `base` stays; the failure that ends a round waits `ended` and the round back-off
    /// becomes `doubled` (the callers keep the single directory's order of the two).
    fn next_candidate(
        &mut self,
        now: Instant,
        base: Duration,
        ended: Duration,
        doubled: Duration,
    ) -> (Duration, Duration) {
        self.failed_in_round += 1;
        self.failed_in_round += self.step_candidate(now);
        if self.failed_in_round < self.candidates {
            (RECONNECT_FIRST, base)
        } else {
            self.failed_in_round = 0;
            (ended, doubled)
        }
    }

    /// Moves on to the next address, past one given up for silence a short while ago (if
    /// another remains). Returns how many addresses it skipped (they count as tried in the
    /// round).
    fn step_candidate(&mut self, now: Instant) -> usize {
        self.candidate = (self.candidate + 1) % self.candidates;
        match self.skipped {
            Some((silent, until))
                if self.candidates > 1 && silent == self.candidate && now < until =>
            {
                self.candidate = (self.candidate + 1) % self.candidates;
                1
            }
            _ => 0,
        }
    }

    /// The current address answered nothing: the rotation skips it for a while.
    fn skip_current(&mut self, now: Instant) {
        let bounds = self.silence.saturating_mul(SILENT_ADDRESS_SKIPPED_FOR);
        self.skipped = Some((self.candidate, now.saturating_add(bounds)));
    }

    /// How long an attempt may wait for the address's first answer (its challenge).
    fn first_answer_by(&self) -> Instant {
        self.attempt_since
            .saturating_add(HANDSHAKE_DEADLINE.min(self.silence))
    }

    /// Whether a connection attempt is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        matches!(self.state, LinkState::Down { retry_at, .. } if retry_at <= now)
    }

    /// When [`Self::expire`] next has something to do: the next attempt while down, the
    /// attempt's deadline, or the welcomed link's next ping or silence.
    pub fn next_deadline(&self) -> Option<Instant> {
        match &self.state {
            LinkState::Down { retry_at, .. } => Some(*retry_at),
            LinkState::Connecting { .. } | LinkState::Proving { .. } => {
                Some(self.first_answer_by())
            }
            LinkState::Welcoming { .. } => {
                Some(self.attempt_since.saturating_add(HANDSHAKE_DEADLINE))
            }
            LinkState::Up { pinger, .. } => pinger.deadline(),
        }
    }

    /// What is due at `now`: gives up an attempt whose address said nothing within the
    /// silence bound, or whose handshake did not finish within [`HANDSHAKE_DEADLINE`]
    /// (closes it and backs off); on a welcomed link, sends the ping that is due or gives the
    /// link up as silent.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<ConnAction>) -> LinkExpired {
        let (first_answer_by, welcome_by) = (
            self.first_answer_by(),
            self.attempt_since.saturating_add(HANDSHAKE_DEADLINE),
        );
        let (conn, expired, silent) = match &mut self.state {
            LinkState::Down { .. } => return LinkExpired::Nothing,
            LinkState::Up { conn, pinger } => match pinger.poll(now) {
                Ping::Nothing => return LinkExpired::Nothing,
                Ping::Send(seq) => {
                    out.push(ConnAction::Send(*conn, Link::Ping { seq }));
                    return LinkExpired::Nothing;
                }
                Ping::Silent => (*conn, LinkExpired::Silent, true),
            },
            // The address said nothing at all: skipped by the rotation for a while.
            LinkState::Connecting { conn, .. } | LinkState::Proving { conn, .. } => {
                if now < first_answer_by {
                    return LinkExpired::Nothing;
                }
                (*conn, LinkExpired::Attempt, true)
            }
            // It answered, but did not welcome in time (a stalled welcome).
            LinkState::Welcoming { conn, .. } => {
                if now < welcome_by {
                    return LinkExpired::Nothing;
                }
                (*conn, LinkExpired::Attempt, false)
            }
        };
        let why = if expired == LinkExpired::Silent {
            Closing::Silent
        } else {
            Closing::Expired
        };
        out.push(ConnAction::Close(conn, why));
        if silent {
            self.skip_current(now);
        }
        self.closed(now, conn);
        expired
    }

    /// The driver started connection `conn` to address [`Self::candidate`] at `now` (it
    /// answers [`Self::connected`] or [`Self::closed`]).
    pub fn connecting(&mut self, now: Instant, conn: ConnId) {
        self.attempt_since = now;
        let backoff = match self.state {
            LinkState::Down { backoff, .. } => backoff,
            _ => RECONNECT_FIRST,
        };
        self.state = LinkState::Connecting { conn, backoff };
    }

    /// While down, the next attempt goes to address `candidate` (a replica named it as where
    /// the leader takes hosts), at the time the back-off set: a redirect changes where, never
    /// how soon, so that replicas naming one another cannot make a host spin. Nothing if
    /// `candidate` is not one of the addresses, the link is not down, or `candidate` is the
    /// address given up for silence and still skipped at `now`: followers name a stopped
    /// leader until they elect another, and going back to it would cost a silence bound per
    /// redirect. Returns whether it redirected.
    pub fn redirect(&mut self, now: Instant, candidate: usize) -> bool {
        let skipped = self
            .skipped
            .is_some_and(|(silent, until)| silent == candidate && now < until);
        let redirect =
            candidate < self.candidates && matches!(self.state, LinkState::Down { .. }) && !skipped;
        if redirect {
            self.candidate = candidate;
        }
        redirect
    }

    /// While down, the next attempt is due at `now` (the driver learned something that makes
    /// it worth trying before the back-off ends: an address it was waiting for).
    pub fn retry_now(&mut self, now: Instant) {
        if let LinkState::Down { retry_at, .. } = &mut self.state {
            *retry_at = (*retry_at).min(now);
        }
    }

    /// The driver could not even start a connection to address [`Self::candidate`]: try the
    /// next address after the back-off.
    pub fn connect_failed(&mut self, now: Instant) {
        let base = match self.state {
            LinkState::Down { backoff, .. } => backoff,
            _ => RECONNECT_FIRST,
        };
        // A round that ends here waits its back-off, then doubles it.
        let twice = self.doubled(base);
        let (wait, backoff) = self.next_candidate(now, base, base, twice);
        self.state = LinkState::Down {
            retry_at: now.saturating_add(wait),
            backoff,
        };
    }

    /// The connection is made: say hello (`nonce` is fresh).
    pub fn connected(&mut self, conn: ConnId, nonce: Nonce, out: &mut Vec<ConnAction>) {
        if let LinkState::Connecting { conn: c, backoff } = self.state
            && c == conn
        {
            let (connector, hello) = Connector::new(self.who.clone(), nonce, self.key.as_ref());
            out.push(ConnAction::Send(conn, hello));
            self.state = LinkState::Proving {
                conn,
                connector,
                backoff,
            };
        }
    }

    /// A frame arrived on the link's connection.
    pub fn frame(
        &mut self,
        now: Instant,
        conn: ConnId,
        payload: &[u8],
        out: &mut Vec<ConnAction>,
    ) -> LinkHeard {
        if self.conn() != Some(conn) {
            return LinkHeard::Nothing;
        }
        let Ok(link) = decode_value::<Link>(payload, FRAME_BYTES_MAX) else {
            self.give_up(now, conn, out);
            return LinkHeard::Protocol;
        };
        if let Link::Refused { reason } = link {
            // The directory does not take our key or version: a configuration error.
            return LinkHeard::Refused(reason);
        }
        if let LinkState::Up { pinger, .. } = &mut self.state {
            return match link {
                Link::Pong { seq } => {
                    pinger.pong(seq);
                    LinkHeard::Nothing
                }
                Link::Located { node, listen } => LinkHeard::Located { node, listen },
                Link::Frame(envelope)
                    if self
                        .identity
                        .is_some_and(|(node, _)| envelope.to.node == node) =>
                {
                    LinkHeard::Envelope(envelope)
                }
                _ => {
                    self.give_up(now, conn, out);
                    LinkHeard::Lost
                }
            };
        }
        if let (LinkState::Proving { .. }, Link::NotLeader { leader }) = (&self.state, &link) {
            let leader = leader.clone();
            out.push(ConnAction::Close(conn, Closing::NotLeader));
            self.closed(now, conn);
            return LinkHeard::NotLeader { leader };
        }
        let placeholder = LinkState::Down {
            retry_at: now,
            backoff: RECONNECT_FIRST,
        };
        let state = std::mem::replace(&mut self.state, placeholder);
        match state {
            LinkState::Proving {
                connector, backoff, ..
            } => match connector.answer(&link) {
                Ok(proof) => {
                    out.push(ConnAction::Send(conn, proof));
                    self.state = LinkState::Welcoming { conn, backoff };
                    LinkHeard::Nothing
                }
                Err(HandshakeFailure::Unproven(why)) => {
                    // The directory could not prove the key: not our cluster's directory. It
                    // hears so (and counts a wrong key) before the node stops.
                    out.push(ConnAction::Send(conn, connector.rejection()));
                    self.state = LinkState::Welcoming { conn, backoff };
                    LinkHeard::Unproven(why)
                }
                Err(e) => {
                    self.state = LinkState::Welcoming { conn, backoff };
                    LinkHeard::Refused(e.to_string())
                }
            },
            LinkState::Welcoming { backoff, .. } => match link {
                Link::Welcome {
                    node,
                    incarnation,
                    directory,
                    epoch,
                } if self.identity.is_none_or(|id| id == (node, incarnation)) => {
                    self.identity = Some((node, incarnation));
                    self.state = LinkState::Up {
                        conn,
                        pinger: Pinger::new(now, self.silence),
                    };
                    LinkHeard::Welcomed {
                        node,
                        incarnation,
                        directory,
                        epoch,
                    }
                }
                Link::Welcome {
                    node, incarnation, ..
                } => {
                    self.state = LinkState::Welcoming { conn, backoff };
                    self.give_up(now, conn, out);
                    LinkHeard::Misnamed { node, incarnation }
                }
                _ => {
                    self.state = LinkState::Welcoming { conn, backoff };
                    self.give_up(now, conn, out);
                    LinkHeard::Protocol
                }
            },
            other => {
                self.state = other;
                self.give_up(now, conn, out);
                LinkHeard::Protocol
            }
        }
    }

    /// Closes the connection and backs off.
    fn give_up(&mut self, now: Instant, conn: ConnId, out: &mut Vec<ConnAction>) {
        out.push(ConnAction::Close(conn, Closing::Protocol));
        self.closed(now, conn);
    }

    /// The link's connection is gone: back off (from the start, if it was up), and try the
    /// next address. `Lost` if it was up.
    pub fn closed(&mut self, now: Instant, conn: ConnId) -> LinkHeard {
        if self.conn() != Some(conn) {
            return LinkHeard::Nothing;
        }
        let ((wait, backoff), lost) = match self.state {
            LinkState::Connecting { backoff, .. }
            | LinkState::Proving { backoff, .. }
            | LinkState::Welcoming { backoff, .. } => {
                // A round that ends here doubles its back-off, then waits it.
                let twice = self.doubled(backoff);
                (self.next_candidate(now, backoff, twice, twice), false)
            }
            LinkState::Up { .. } | LinkState::Down { .. } => {
                // The directory that served is gone (a replica may have taken over
                // elsewhere): the next address soon, and a fresh round from it.
                self.failed_in_round = self.step_candidate(now);
                ((RECONNECT_FIRST, RECONNECT_FIRST), true)
            }
        };
        self.state = LinkState::Down {
            retry_at: now.saturating_add(wait),
            backoff,
        };
        if lost {
            LinkHeard::Lost
        } else {
            LinkHeard::Nothing
        }
    }

    /// The connection in use, if any.
    pub fn conn(&self) -> Option<ConnId> {
        match &self.state {
            LinkState::Down { .. } => None,
            LinkState::Connecting { conn, .. }
            | LinkState::Proving { conn, .. }
            | LinkState::Welcoming { conn, .. }
            | LinkState::Up { conn, .. } => Some(*conn),
        }
    }

    /// The connection, if the link is welcomed.
    pub fn up(&self) -> Option<ConnId> {
        match &self.state {
            LinkState::Up { conn, .. } => Some(*conn),
            _ => None,
        }
    }

    /// Who this host is, once welcomed.
    pub fn identity(&self) -> Option<(NodeId, u64)> {
        self.identity
    }
}

/// Most frames waiting for another host's connection to finish its handshake; later ones are
/// dropped (every protocol between hosts re-sends).
pub const PEER_BACKLOG_MAX: usize = 4096;

#[derive(Clone, Debug)]
struct OutgoingLink {
    node: NodeId,
    connector: Option<Connector>,
    proved: bool,
    backlog: VecDeque<Link>,
    /// When it was started (its handshake must end by [`HANDSHAKE_DEADLINE`] after it).
    since: Instant,
    /// Once proved: its pings (the other host answers them, or the connection is given up).
    pinger: Option<Pinger>,
}

/// Where a frame for another host went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed {
    /// Sent on the connection.
    Sent,
    /// Waits for the connection's handshake.
    Queued,
    /// Dropped: the backlog is full, or the host is unknown (the protocols re-send).
    Dropped,
}

/// What a host's peer connections heard, beyond the actions.
// Mostly frames: boxing them would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerHeard {
    /// Nothing for the driver.
    Nothing,
    /// Another host proved itself on an incoming connection.
    Admitted {
        /// Its connection.
        conn: ConnId,
        /// The host.
        node: NodeId,
    },
    /// A frame from another host, from it and for this host.
    Envelope(Envelope),
    /// A host sent a frame out of protocol or not from itself: closed.
    Protocol {
        /// Its connection.
        conn: ConnId,
        /// The host.
        node: NodeId,
    },
    /// Another host refused this host's connection or failed its handshake: closed (the next
    /// frame tries a new connection).
    Failed {
        /// The connection.
        conn: ConnId,
        /// The host.
        node: NodeId,
    },
}

/// A host's connections with other hosts: the incoming ones through a [`Listener`] of peers,
/// and its own outgoing one to each host, whose frames wait in a bounded backlog until its
/// proof went out.
#[derive(Clone, Debug)]
pub struct PeerLinks {
    me: NodeId,
    incarnation: u64,
    key: Option<ClusterKey>,
    incoming: Listener,
    /// Who each admitted incoming connection is.
    from: BTreeMap<ConnId, NodeId>,
    outgoing: BTreeMap<ConnId, OutgoingLink>,
    to: BTreeMap<NodeId, ConnId>,
    /// How long an outgoing connection may answer nothing.
    silence: Duration,
}

impl PeerLinks {
    /// The peer links of host `me` at `incarnation`, with its incoming listener.
    pub fn new(
        me: NodeId,
        incarnation: u64,
        key: Option<ClusterKey>,
        incoming: Listener,
    ) -> PeerLinks {
        PeerLinks {
            me,
            incarnation,
            key,
            incoming,
            from: BTreeMap::new(),
            outgoing: BTreeMap::new(),
            to: BTreeMap::new(),
            silence: SILENCE_DEFAULT,
        }
    }

    /// The same links with another silence bound for the connections this host makes (see
    /// [`Pinger`]).
    ///
    /// # Panics
    ///
    /// If `silence` is outside [`SILENCE_MIN`]..=[`SILENCE_MAX`].
    #[must_use]
    pub fn with_silence(mut self, silence: Duration) -> PeerLinks {
        assert!(
            (SILENCE_MIN..=SILENCE_MAX).contains(&silence),
            "a silence bound of {silence}: {SILENCE_MIN} to {SILENCE_MAX} are allowed"
        );
        self.silence = silence;
        self
    }

    /// Sends `link` to host `node` at `now`: on its connection (which then counts as in use,
    /// and is pinged: see [`Pinger::while_used`]), or queued for it. When there is none,
    /// the link comes back: the caller starts one with [`Self::connecting`], giving it the link.
    /// (By value, not boxed: an allocation per frame for the rare first one's sake.)
    #[allow(clippy::result_large_err)]
    pub fn route(
        &mut self,
        now: Instant,
        node: NodeId,
        link: Link,
        out: &mut Vec<ConnAction>,
    ) -> Result<Routed, Link> {
        let Some(&conn) = self.to.get(&node) else {
            return Err(link);
        };
        let Some(o) = self.outgoing.get_mut(&conn) else {
            return Ok(Routed::Dropped);
        };
        Ok(if o.proved {
            if let Some(pinger) = &mut o.pinger {
                pinger.used(now);
            }
            out.push(ConnAction::Send(conn, link));
            Routed::Sent
        } else if o.backlog.len() < PEER_BACKLOG_MAX {
            o.backlog.push_back(link);
            Routed::Queued
        } else {
            Routed::Dropped
        })
    }

    /// The driver started `conn` to `node` at `now`; `first` waits for its handshake.
    pub fn connecting(&mut self, now: Instant, node: NodeId, conn: ConnId, first: Link) {
        let mut backlog = VecDeque::new();
        backlog.push_back(first);
        self.outgoing.insert(
            conn,
            OutgoingLink {
                node,
                connector: None,
                proved: false,
                backlog,
                since: now,
                pinger: None,
            },
        );
        self.to.insert(node, conn);
    }

    /// An outgoing connection is made: say hello (`nonce` is fresh).
    pub fn connected(&mut self, conn: ConnId, nonce: Nonce, out: &mut Vec<ConnAction>) {
        if let Some(o) = self.outgoing.get_mut(&conn) {
            let who = Who::Peer {
                node: self.me,
                incarnation: self.incarnation,
            };
            let (connector, hello) = Connector::new(who, nonce, self.key.as_ref());
            o.connector = Some(connector);
            out.push(ConnAction::Send(conn, hello));
        }
    }

    /// Another host connected to this one (see [`Listener::accepted`]).
    pub fn accepted(
        &mut self,
        now: Instant,
        conn: ConnId,
        nonce: Nonce,
        out: &mut Vec<ConnAction>,
    ) {
        self.incoming.accepted(now, conn, nonce, out);
    }

    /// A frame arrived on a peer connection at `now`.
    pub fn frame(
        &mut self,
        now: Instant,
        conn: ConnId,
        payload: &[u8],
        out: &mut Vec<ConnAction>,
    ) -> PeerHeard {
        if let Some(o) = self.outgoing.get_mut(&conn) {
            let node = o.node;
            if o.proved {
                if let Ok(Link::Pong { seq }) = decode_value::<Link>(payload, FRAME_BYTES_MAX) {
                    if let Some(pinger) = &mut o.pinger {
                        pinger.pong(seq);
                    }
                    return PeerHeard::Nothing;
                }
                return self.core_frame(conn, node, payload, out);
            }
            let answer = decode_value::<Link>(payload, FRAME_BYTES_MAX)
                .ok()
                .zip(o.connector.as_ref())
                .map(|(link, c)| c.answer(&link));
            let Some(Ok(proof)) = answer else {
                // The other host refused us or could not prove the key: its frames are
                // dropped (the protocols re-send; the next frame tries a new connection).
                self.forget_outgoing(conn);
                out.push(ConnAction::Close(conn, Closing::WrongKey));
                return PeerHeard::Failed { conn, node };
            };
            out.push(ConnAction::Send(conn, proof));
            out.extend(o.backlog.drain(..).map(|link| ConnAction::Send(conn, link)));
            o.connector = None;
            o.proved = true;
            o.pinger = Some(Pinger::while_used(now, self.silence));
            return PeerHeard::Nothing;
        }
        match self.incoming.frame(conn, payload, out) {
            Heard::Nothing => PeerHeard::Nothing,
            // No connection speaks for this host: one that says it is this host (possible
            // without a cluster key, where any node id is taken at its word) is closed.
            Heard::Admitted(Who::Peer { node, .. }) if node == self.me => {
                self.incoming.close(conn, Closing::Protocol, out);
                PeerHeard::Protocol { conn, node }
            }
            Heard::Admitted(Who::Peer { node, .. }) => {
                self.from.insert(conn, node);
                PeerHeard::Admitted { conn, node }
            }
            Heard::Admitted(_) => {
                self.incoming.close(conn, Closing::NotAHello, out);
                PeerHeard::Nothing
            }
            Heard::Link(link) => {
                let Some(&node) = self.from.get(&conn) else {
                    self.incoming.close(conn, Closing::Protocol, out);
                    return PeerHeard::Nothing;
                };
                self.core_link(conn, node, link, out)
            }
        }
    }

    fn core_frame(
        &mut self,
        conn: ConnId,
        node: NodeId,
        payload: &[u8],
        out: &mut Vec<ConnAction>,
    ) -> PeerHeard {
        match decode_value::<Link>(payload, FRAME_BYTES_MAX) {
            Ok(link) => self.core_link(conn, node, link, out),
            Err(_) => self.protocol(conn, node, out),
        }
    }

    /// A core frame from another host that proved the key: taken only if it speaks for that
    /// host and is for this one.
    fn core_link(
        &mut self,
        conn: ConnId,
        node: NodeId,
        link: Link,
        out: &mut Vec<ConnAction>,
    ) -> PeerHeard {
        match link {
            Link::Frame(envelope) if envelope.from.node == node && envelope.to.node == self.me => {
                PeerHeard::Envelope(envelope)
            }
            // Another host asks whether this one still answers (on a connection it made).
            Link::Ping { seq } if self.from.contains_key(&conn) => {
                out.push(ConnAction::Send(conn, Link::Pong { seq }));
                PeerHeard::Nothing
            }
            _ => self.protocol(conn, node, out),
        }
    }

    fn protocol(&mut self, conn: ConnId, node: NodeId, out: &mut Vec<ConnAction>) -> PeerHeard {
        self.closed(conn);
        out.push(ConnAction::Close(conn, Closing::Protocol));
        PeerHeard::Protocol { conn, node }
    }

    fn forget_outgoing(&mut self, conn: ConnId) {
        if let Some(o) = self.outgoing.remove(&conn)
            && self.to.get(&o.node) == Some(&conn)
        {
            self.to.remove(&o.node);
        }
    }

    /// A peer connection is gone.
    pub fn closed(&mut self, conn: ConnId) {
        self.forget_outgoing(conn);
        self.from.remove(&conn);
        self.incoming.closed(conn);
    }

    /// Closes every incoming connection not admitted within the deadline, and every outgoing
    /// one whose handshake did not finish within [`HANDSHAKE_DEADLINE`] (its backlog is
    /// dropped: every protocol between hosts re-sends, and the next frame tries again); sends
    /// the pings that are due on outgoing connections and closes those that went silent.
    /// Returns the hosts whose connection it closed for silence (their address may be stale:
    /// the driver asks again).
    pub fn expire(&mut self, now: Instant, out: &mut Vec<ConnAction>) -> Vec<NodeId> {
        self.incoming.expire(now, out);
        let mut late = Vec::new();
        let mut silent = Vec::new();
        for (&conn, o) in &mut self.outgoing {
            match &mut o.pinger {
                None if now >= o.since.saturating_add(HANDSHAKE_DEADLINE) => late.push(conn),
                None => {}
                Some(pinger) => match pinger.poll(now) {
                    Ping::Nothing => {}
                    Ping::Send(seq) => out.push(ConnAction::Send(conn, Link::Ping { seq })),
                    Ping::Silent => silent.push((conn, o.node)),
                },
            }
        }
        for conn in late {
            out.push(ConnAction::Close(conn, Closing::Expired));
            self.forget_outgoing(conn);
        }
        silent
            .into_iter()
            .map(|(conn, node)| {
                out.push(ConnAction::Close(conn, Closing::Silent));
                self.forget_outgoing(conn);
                node
            })
            .collect()
    }

    /// When the next deadline passes: the oldest waiting incoming connection's, an outgoing
    /// handshake's, or an outgoing connection's next ping or silence.
    pub fn next_deadline(&self) -> Option<Instant> {
        let outgoing = self
            .outgoing
            .values()
            .filter_map(|o| match &o.pinger {
                Some(pinger) => pinger.deadline(),
                None => Some(o.since.saturating_add(HANDSHAKE_DEADLINE)),
            })
            .min();
        match (self.incoming.next_deadline(), outgoing) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether `conn` is one of these links.
    pub fn knows(&self, conn: ConnId) -> bool {
        self.outgoing.contains_key(&conn) || self.incoming.knows(conn)
    }

    /// The outgoing connection's host, if `conn` is one.
    pub fn outgoing_node(&self, conn: ConnId) -> Option<NodeId> {
        self.outgoing.get(&conn).map(|o| o.node)
    }

    /// The incoming connection's host, once admitted.
    pub fn incoming_node(&self, conn: ConnId) -> Option<NodeId> {
        self.from.get(&conn).copied()
    }

    /// The incoming listener (its counts).
    pub fn listener(&self) -> &Listener {
        &self.incoming
    }
}

#[cfg(test)]
mod tests;

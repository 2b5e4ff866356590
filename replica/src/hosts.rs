//! The hosts' side of a replica (sans-IO): what a replica of the directory does with the
//! connections hosts and clients make to it. `dataplane-node`'s replica driver
//! (`io-adapter/src/replnode.rs`) and the simulator's replicated mode (`sim/src/replicated.rs`)
//! both run it, so that what hosts meet at a replica (who is welcomed, when, what waits for the
//! log) is composed once.
//!
//! Only the replica that serves (the leader, once it applied its term's first entry) admits
//! hosts: any other answers a connection with `Link::NotLeader`, naming the leader it knows
//! (the driver's address for it), and closes it; the host goes there next, or to its next
//! address. A replica that starts serving begins with no
//! connection, the committed membership and the term as its epoch (and its address's
//! incarnation): to a host, a failover is a directory restart. One that stops serving closes
//! every connection it accepted.
//!
//! A host's identity is decided as in the single directory ([`DirectoryConns`],
//! [`Membership`]); the change is proposed to the log
//! ([`ReplicatedDirectory::propose_records`]) and everything the connections machine asked for
//! after it (the `Welcome` first), and every directory frame for a host, waits in order until
//! that entry is applied: no host hears of an identity a failover could forget. A welcome
//! that changes no membership (a known host back on the same boot) waits for an entry of its
//! own, an empty one: a welcome says "this replica serves you at its term", which only a
//! quorum can confirm. Without it a leader that was paused or cut off, and does not know yet
//! that a later term began, would welcome a host at an epoch older than one it was welcomed
//! at before. The machine's route watches are kept here, fed by which hosts are connected.
//!
//! The driver owns the sockets and the clock: it hands this side what happened and carries out
//! the [`HostIo`] it appends, in order.
//!
//! Determinism: ordered maps only; no clock, no randomness (nonces come from the driver).

use std::collections::{BTreeSet, VecDeque};

use dataplane_core::admission::Nonce;
use dataplane_core::conns::{Accepts, ConnAction, ConnId, DirHeard, DirectoryConns, Listener};
use dataplane_core::directory::SourceRecoveryHook;
use dataplane_core::effect::Effect;
use dataplane_core::ids::{Address, AuthorityEpoch, NodeId};
use dataplane_core::link::{ClusterKey, Link};
use dataplane_core::membership::Membership;
use dataplane_core::routes::Routes;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{Envelope, Message};

use crate::ReplicatedDirectory;

/// How a replica's hosts' side is set up (the node's settings).
#[derive(Clone, Debug)]
pub struct HostSideConfig {
    /// The cluster key hosts and clients must prove, if any.
    pub key: Option<ClusterKey>,
    /// How long an accepted connection may take to be admitted.
    pub admission_deadline: Duration,
    /// Most connections waiting for admission at once.
    pub pending_max: usize,
    /// Most admitted connections.
    pub admitted_max: usize,
    /// The first transient node id handed to a client.
    pub first_transient: u64,
    /// Most hosts the membership keeps (`--members-max`).
    pub members_max: usize,
    /// How long a host must have been away before a full membership may forget it.
    pub forget_after: Duration,
    /// How long a host's connection may carry nothing before it is closed.
    pub host_silence: Duration,
}

/// What the driver does for the hosts' side, in order.
// Mostly frames: boxing them would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostIo {
    /// Send this frame on the connection.
    Send(ConnId, Link),
    /// Carry out what the connections machine asked for (never a `Persist`: proposed here).
    Conn(ConnAction),
    /// Close the connection now (this replica stopped serving).
    Close(ConnId),
    /// Send this frame, then close the connection once it is out (a replica that does not
    /// serve says so: [`Link::NotLeader`]).
    SendAndClose(ConnId, Link),
}

/// How [`HostSide::follow`] found the replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// As before.
    Unchanged,
    /// It serves `term` now (at `epoch`), with `members` hosts in its membership.
    Started {
        /// The term.
        term: u64,
        /// The epoch hosts are welcomed at.
        epoch: AuthorityEpoch,
        /// The hosts the committed membership knows.
        members: usize,
    },
    /// It stopped serving `term` (and every connection was closed).
    Stopped {
        /// The term it served.
        term: u64,
    },
}

/// One thing for the hosts, in the order it must happen.
#[derive(Clone, Debug)]
enum Held {
    /// Nothing after this until the log applied this index (a membership change).
    Until(u64),
    /// A connection action.
    Conn(ConnAction),
    /// A directory frame.
    Frame(Address, Message),
}

/// What a serving replica has for one term.
#[derive(Clone, Debug)]
struct Term {
    term: u64,
    address: Address,
    epoch: AuthorityEpoch,
    membership: Membership,
    conns: DirectoryConns,
    routes: Routes,
    timer: Option<Instant>,
    held: VecDeque<Held>,
}

/// The hosts' side of one replica (see the module documentation).
#[derive(Clone, Debug)]
pub struct HostSide {
    config: HostSideConfig,
    serving: Option<Term>,
    /// Connections accepted while serving and not closed (closed when it stops).
    open: BTreeSet<ConnId>,
    /// What the connections machine asked for, not yet sorted (a reused buffer).
    actions: Vec<ConnAction>,
}

impl HostSide {
    /// The hosts' side of a replica that does not serve yet.
    pub fn new(config: HostSideConfig) -> HostSide {
        HostSide {
            config,
            serving: None,
            open: BTreeSet::new(),
            actions: Vec::new(),
        }
    }

    /// Starts or ends serving hosts to match whether `machine` serves, and at which term. A
    /// change closes every connection accepted before it.
    pub fn follow<H: SourceRecoveryHook>(
        &mut self,
        now: Instant,
        machine: &ReplicatedDirectory<H>,
        out: &mut Vec<HostIo>,
    ) -> Serving {
        let term = machine.serving_term();
        if self.serving.as_ref().map(|s| s.term) == term {
            return Serving::Unchanged;
        }
        let stopped = self.serving.take().map(|s| s.term);
        out.extend(
            std::mem::take(&mut self.open)
                .into_iter()
                .map(HostIo::Close),
        );
        let (Some(term), Some(directory)) = (term, machine.directory()) else {
            return stopped.map_or(Serving::Unchanged, |term| Serving::Stopped { term });
        };
        let mut membership = machine.members().clone();
        membership.set_capacity(self.config.members_max);
        let c = &self.config;
        // Who has been away since when is not replicated: a new leader counts every host not
        // connected as away since it started serving.
        let mut conns = DirectoryConns::new(
            Listener::new(
                c.key,
                Accepts::HostsAndClients,
                c.admission_deadline,
                c.pending_max,
                c.admitted_max,
            ),
            c.first_transient,
            now,
        );
        conns.set_forget_away_after(c.forget_after);
        conns.set_host_silence(c.host_silence);
        let epoch = directory.epoch();
        let members = membership.len();
        self.serving = Some(Term {
            term,
            address: directory.config().address,
            epoch,
            membership,
            conns,
            routes: Routes::new(),
            timer: None,
            held: VecDeque::new(),
        });
        Serving::Started {
            term,
            epoch,
            members,
        }
    }

    /// A host or client connected (`nonce` is fresh): taken into the handshake if this replica
    /// serves; otherwise told so, with `leader`, where the replica this one knows to lead
    /// takes hosts (the host goes there next, or to its next address), and closed. Returns
    /// whether it was taken.
    pub fn accepted(
        &mut self,
        now: Instant,
        conn: ConnId,
        nonce: Nonce,
        leader: Option<String>,
        out: &mut Vec<HostIo>,
    ) -> bool {
        let Some(serving) = &mut self.serving else {
            out.push(HostIo::SendAndClose(conn, Link::NotLeader { leader }));
            return false;
        };
        self.open.insert(conn);
        let mut actions = std::mem::take(&mut self.actions);
        serving.conns.accepted(now, conn, nonce, &mut actions);
        // (An acceptance asks for no membership change: nothing to propose.)
        for action in actions.drain(..) {
            serving.held.push_back(Held::Conn(action));
        }
        self.actions = actions;
        true
    }

    /// A frame arrived on `conn`: the handshake's, a host's ping, or a frame for the directory
    /// (returned as [`DirHeard::Envelope`]: the driver hands it to the machine). A membership
    /// change is proposed to `machine`'s log here; if that fails the replica stopped (see
    /// [`ReplicatedDirectory::stopped`]).
    pub fn frame<H: SourceRecoveryHook>(
        &mut self,
        now: Instant,
        conn: ConnId,
        payload: &[u8],
        machine: &mut ReplicatedDirectory<H>,
        out: &mut Vec<HostIo>,
    ) -> DirHeard {
        let Some(serving) = &mut self.serving else {
            out.push(HostIo::Close(conn));
            return DirHeard::Nothing;
        };
        let mut actions = std::mem::take(&mut self.actions);
        let committed = machine.committed();
        let heard = serving.conns.frame(
            now,
            conn,
            payload,
            &mut serving.membership,
            &mut || committed.named_nodes(),
            serving.address,
            serving.epoch,
            &mut actions,
        );
        match &heard {
            DirHeard::Host { admitted, .. } => {
                let m = admitted.member();
                serving.routes.connected(m.node, m.incarnation);
            }
            DirHeard::Client { node, .. } => serving.routes.connected(*node, 1),
            DirHeard::Protocol { node, .. } => serving.routes.disconnected(*node),
            DirHeard::Nothing | DirHeard::HostRefused { .. } | DirHeard::Envelope(_) => {}
        }
        self.take_actions(&mut actions, machine);
        self.actions = actions;
        heard
    }

    /// Sorts what the connections machine asked for: a membership change is proposed and what
    /// follows waits for it; a welcome no change came before waits for an empty entry; the
    /// rest waits behind what waits already.
    fn take_actions<H: SourceRecoveryHook>(
        &mut self,
        actions: &mut Vec<ConnAction>,
        machine: &mut ReplicatedDirectory<H>,
    ) {
        // Whether an entry was proposed since the last welcome (a membership change covers
        // the welcome behind it).
        let mut proposed = false;
        for action in actions.drain(..) {
            let Some(serving) = &mut self.serving else {
                return;
            };
            let (records, then) = match action {
                ConnAction::Persist(records) => (records, None),
                welcome @ ConnAction::Send(_, Link::Welcome { .. }) => {
                    if proposed {
                        serving.held.push_back(Held::Conn(welcome));
                        proposed = false;
                        continue;
                    }
                    (Vec::new(), Some(welcome))
                }
                other => {
                    serving.held.push_back(Held::Conn(other));
                    continue;
                }
            };
            match machine.propose_records(&records) {
                Ok(index) => serving.held.push_back(Held::Until(index)),
                // The replica stopped (the engine refused its own proposal): nothing after it
                // may happen; the driver stops the node.
                Err(_) => return,
            }
            proposed = then.is_none();
            if let Some(welcome) = then {
                serving.held.push_back(Held::Conn(welcome));
            }
        }
    }

    /// The machine released `effects` (only a serving replica's are kept: the others belonged
    /// to a term that is over). Returns how many `Persist` effects bypassed the log (a bug of
    /// the machine's: they are dropped).
    pub fn effects(&mut self, effects: Vec<Effect>) -> usize {
        let Some(serving) = &mut self.serving else {
            return 0;
        };
        let mut bypassed = 0;
        for effect in effects {
            match effect {
                Effect::Send { to, message } => serving.held.push_back(Held::Frame(to, message)),
                Effect::SetTimer { at, .. } => serving.timer = Some(at),
                Effect::CancelTimer { .. } => serving.timer = None,
                Effect::WatchRoute { target } => serving.routes.watch(target),
                Effect::UnwatchRoute { target } => serving.routes.unwatch(target),
                Effect::Persist(_) => bypassed += 1,
            }
        }
        bypassed
    }

    /// What may happen now that the log applied up to `applied`: everything held, in order, up
    /// to a membership change not applied yet.
    pub fn release(&mut self, applied: u64, out: &mut Vec<HostIo>) {
        let Some(serving) = &mut self.serving else {
            return;
        };
        while let Some(front) = serving.held.pop_front() {
            match front {
                Held::Until(index) if index > applied => {
                    serving.held.push_front(Held::Until(index));
                    return;
                }
                Held::Until(_) => {}
                Held::Frame(to, message) => {
                    if let Some(conn) = serving.conns.conn_of(to.node) {
                        let envelope = Envelope {
                            from: serving.address,
                            to,
                            message,
                        };
                        out.push(HostIo::Send(conn, Link::Frame(envelope)));
                    }
                }
                Held::Conn(action) => {
                    // A connection the machine closes reports no close: forgotten here.
                    if let ConnAction::Close(conn, _) | ConnAction::Refuse { conn, .. } = &action {
                        self.open.remove(conn);
                    }
                    out.push(HostIo::Conn(action));
                }
            }
        }
    }

    /// `conn` closed (the other side closed it, or it broke).
    pub fn closed(&mut self, now: Instant, conn: ConnId) {
        self.open.remove(&conn);
        if let Some(serving) = &mut self.serving
            && let Some(node) = serving.conns.closed(now, conn)
        {
            serving.routes.disconnected(node);
        }
    }

    /// Closes the connections not admitted in time and the host connections that carried
    /// nothing for the host silence bound; returns the nodes those spoke for.
    pub fn expire<H: SourceRecoveryHook>(
        &mut self,
        now: Instant,
        machine: &mut ReplicatedDirectory<H>,
    ) -> Vec<NodeId> {
        let Some(serving) = &mut self.serving else {
            return Vec::new();
        };
        let mut actions = std::mem::take(&mut self.actions);
        let silent = serving.conns.expire(now, &mut actions);
        for node in &silent {
            serving.routes.disconnected(*node);
        }
        self.take_actions(&mut actions, machine);
        self.actions = actions;
        silent
    }

    /// Whether the directory's retry timer is due at `now` (then it is disarmed: the driver
    /// hands the machine its timer).
    pub fn timer_due(&mut self, now: Instant) -> bool {
        match &mut self.serving {
            Some(serving) if serving.timer.is_some_and(|at| at <= now) => {
                serving.timer = None;
                true
            }
            _ => false,
        }
    }

    /// The next deadline: the directory's timer, a handshake's or a host's silence.
    pub fn next_deadline(&self) -> Option<Instant> {
        let serving = self.serving.as_ref()?;
        [serving.timer, serving.conns.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The routability changes of the watched targets since the last call (for the machine's
    /// `handle_route`).
    pub fn route_changes(&mut self, out: &mut Vec<(Address, bool)>) {
        let Some(serving) = &mut self.serving else {
            return;
        };
        serving.routes.changes(out);
        out.retain(|(target, _)| serving.routes.is_watched(target));
    }

    /// The term served, if any.
    pub fn serving_term(&self) -> Option<u64> {
        self.serving.as_ref().map(|s| s.term)
    }

    /// The connections machine of the term served (its counts), if any.
    pub fn conns(&self) -> Option<&DirectoryConns> {
        self.serving.as_ref().map(|s| &s.conns)
    }

    /// The working membership of the term served, if any.
    pub fn membership(&self) -> Option<&Membership> {
        self.serving.as_ref().map(|s| &s.membership)
    }

    /// Connections accepted while serving and not closed.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Whether `conn` is one of them.
    pub fn knows(&self, conn: ConnId) -> bool {
        self.open.contains(&conn)
    }
}

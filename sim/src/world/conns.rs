//! Connections between the hosts and the directory, run by core's connection machines
//! ([`DirectoryConns`] on the directory, a [`DirectoryLink`] per host), as `dataplane-node`
//! runs them over TCP: a host connects, says hello, proves the cluster key, is admitted by
//! membership (its identity durable before the welcome) and welcomed; a connection that breaks
//! is retried with core's back-off. A simulated connection is ordered and lossless while it
//! lives (TCP); it breaks when either node crashes or a frame meets a partition.
//!
//! Strangers connect during the fault phase: silent ones (the admission deadline closes
//! them), ones with another cluster key, garbage, and replays of a host's recorded handshake
//! (a proof is worthless on another connection). None may ever be admitted, and a waiting
//! room they fill makes room by closing the oldest.
//!
//! Checked against the world's own account (never read from `membership`): a host's hello is
//! admitted as the node it runs as, a restart (a new boot nonce) into a higher incarnation, a
//! reconnect (the nonce of its last durable admission) as that same incarnation; the welcome a
//! host takes names the same.

use dataplane_core::admission::Nonce;
use dataplane_core::conns::{
    Accepts, ConnAction, ConnId, DirHeard, DirectoryConns, DirectoryLink, LinkExpired, LinkHeard,
    Listener, PeerBook,
};
use dataplane_core::link::{ClusterKey, Connector, Link, Who};
use dataplane_core::log::MemberRecord;
use dataplane_core::membership::Admitted;

use super::*;

/// How long a connection may wait for admission in the simulation (shorter than the real
/// nodes' 5 s, so runs see it).
pub(super) const SIM_ADMISSION_DEADLINE: Duration = Duration::from_millis(1_500);
/// The directory's waiting room in the simulation (small, so strangers fill it).
const SIM_PENDING_MAX: usize = 4;
/// How long the directory lets a host's connection carry nothing before it closes it (the
/// real nodes' default; the stalls check restates the rule with it).
pub(super) const SIM_HOST_SILENCE: Duration = Duration::from_secs(10);
/// Transient node ids of the simulation's clients (none connect: strangers never get one).
const SIM_TRANSIENT_BASE: u64 = 1 << 40;
/// How many strangers at most connect per host connection attempt.
const STRANGERS_MAX: u64 = 3;

/// What a stranger does on its connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Stranger {
    /// Says nothing.
    Silent,
    /// Says hello and proves with another cluster key.
    WrongKey,
    /// Sends bytes that are no hello.
    Garbage,
    /// Replays a hello and a proof recorded on another connection of `host`.
    Replay(usize),
}

/// A simulated connection between a host (or a stranger) and the directory.
#[derive(Debug)]
pub(super) struct SimConn {
    /// The host that made it (for a stranger, the host whose attempt it came with).
    pub host: usize,
    /// The boot nonce of the host process that made it. Its frames already on their way still
    /// arrive after that process died (seed 7690: a hello sent just before a crash completed
    /// after the restart), so what the directory admits on it is judged against this boot.
    pub nonce: u64,
    /// The host that accepted it (none: the directory).
    pub acceptor: Option<usize>,
    /// Between hosts: the connector's proof went out (frames may follow it).
    pub proved: bool,
    /// The directory boot that accepted it (0 until accepted).
    pub boot: u64,
    /// Not a host: a stranger.
    pub stranger: Option<Stranger>,
    /// Either side closed it (frames still in flight arrive; nothing new is sent).
    pub closing: bool,
    /// The host side died without a word (a power loss: no FIN, no RST): the directory holds
    /// the connection until it replaces or expires it.
    pub silent: bool,
    /// Nothing the directory sends on it reaches the host any more (its `Welcome` stalled):
    /// only the host's handshake deadline ends it.
    pub stalled: bool,
    /// A silent stall (`stalls`): frames sent the ways it holds arrive only once it ends.
    pub stall: Option<stalls::ConnStall>,
    /// Between hosts: frames waiting in the connector's backlog for the proof (the world's
    /// own count).
    pub queued: usize,
    /// When the directory accepted it (on the directory's clock), and whether it was
    /// admitted since.
    pub accepted_at: Option<Instant>,
    pub admitted: bool,
    /// When the last frame towards the directory, and towards the host, arrives (frames on a
    /// connection arrive in order).
    pub last_to_acceptor: Instant,
    pub last_to_host: Instant,
    /// The host process that made it died with handshake frames still on their way: they
    /// arrive no earlier than this (its kernel retransmits a lost segment after the
    /// process is gone: `LATE_HANDSHAKE_DELAY`).
    pub held_until: Option<Instant>,
    /// When the directory last took a frame on it (on its clock; none before the first).
    pub dir_heard: Option<Instant>,
    /// The directory closed it.
    pub dir_closed: bool,
}

/// How late a dead host process's handshake frames may still reach the directory: a lost
/// segment retransmitted by the kernel after the process died (Linux's minimum
/// retransmission timeout is 200 ms). Long enough for the restarted process to be admitted
/// first, as a real node may be (a dead boot's late proof must not restart the node again).
pub const LATE_HANDSHAKE_DELAY: Duration = Duration::from_millis(300);

impl SimConn {
    /// A connection `host` opens at `now`, to `acceptor` (none: the directory).
    pub fn new(
        host: usize,
        nonce: u64,
        acceptor: Option<usize>,
        stranger: Option<Stranger>,
        now: Instant,
    ) -> SimConn {
        SimConn {
            host,
            nonce,
            acceptor,
            proved: false,
            boot: 0,
            stranger,
            closing: false,
            silent: false,
            stalled: false,
            stall: None,
            queued: 0,
            accepted_at: None,
            admitted: false,
            last_to_acceptor: now,
            last_to_host: now,
            held_until: None,
            dir_heard: None,
            dir_closed: false,
        }
    }
}

/// A host's process-side link state.
#[derive(Debug)]
pub(super) struct HostLink {
    pub link: DirectoryLink,
    /// The boot nonce of the process the link belongs to.
    pub boot_nonce: u64,
    /// The last hello and proof this host sent (what a replaying stranger sends).
    pub recorded: Option<(Link, Link)>,
    /// Where the other hosts listen, as far as this process asked the directory.
    pub book: PeerBook,
    /// When the book's next `BookTick` is scheduled, if one is.
    pub book_tick: Option<Instant>,
    /// When the link's next `LinkRetry` is scheduled (on the host's clock), if one is: a
    /// welcomed link always has a deadline (its next ping), so one chain of them only.
    pub link_tick: Option<Instant>,
    /// The world's own record of this process's connection attempts: when the last one
    /// started (on the host's clock), and how many started since it was last welcomed.
    pub attempts: (Option<Instant>, u32),
}

/// The reconnect back-off ARCHITECTURE.md promises, restated for the pacing check: 50 ms after
/// the first failed attempt, doubling with each failure since the last welcome, up to 2 s.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

impl World {
    /// The directory's connection machine for a new instance.
    pub(super) fn new_dir_conns(&self) -> DirectoryConns {
        let mut conns = DirectoryConns::new(
            Listener::new(
                Some(self.cluster_key),
                Accepts::HostsAndClients,
                SIM_ADMISSION_DEADLINE,
                SIM_PENDING_MAX,
                64,
            ),
            SIM_TRANSIENT_BASE,
            self.dir_now(),
        );
        conns.set_host_silence(SIM_HOST_SILENCE);
        conns
    }

    pub(super) fn nonce(&mut self) -> Nonce {
        let mut nonce = [0u8; 32];
        for chunk in nonce.chunks_mut(8) {
            chunk.copy_from_slice(&self.conn_rng.next_u64().to_le_bytes());
        }
        nonce
    }

    pub(super) fn conn_latency(&mut self) -> Duration {
        let n = &self.options.net;
        let jitter = self.conn_rng.exponential(n.latency_jitter_mean.as_nanos());
        n.latency_min.saturating_add(Duration::from_nanos(jitter))
    }

    /// A host process starts its link to the directory (at its start and at every restart).
    pub(super) fn start_link(&mut self, host: usize) {
        let h = &self.hosts[host];
        let who = Who::Host {
            listen: host_listen(h.node),
            boot_nonce: h.boot_nonce,
        };
        let link = DirectoryLink::new(who, Some(self.cluster_key), self.host_now(host));
        self.links[host] = Some(HostLink {
            link,
            boot_nonce: h.boot_nonce,
            recorded: None,
            book: PeerBook::new(),
            book_tick: None,
            link_tick: None,
            attempts: (None, 0),
        });
        self.link_step(host);
    }

    /// The host process is gone: its link with it, and the directory learns its connection
    /// closed.
    pub(super) fn stop_link(&mut self, host: usize) {
        self.stop_peers(host);
        let Some(hl) = self.links[host].take() else {
            return;
        };
        let Some(conn) = hl.link.conn() else {
            return;
        };
        // Handshake frames still on their way to the directory arrive late.
        if let Some(c) = self.conns.get_mut(&conn)
            && !c.admitted
            && !c.closing
            && c.last_to_acceptor > self.now
        {
            let until = self.now.saturating_add(LATE_HANDSHAKE_DELAY);
            c.held_until = Some(until);
            // The close (if the directory hears one) comes after them.
            c.last_to_acceptor = until.saturating_add(Duration::from_nanos(1));
            self.checker.coverage.hit("conns.dead_boot_frames_late");
        }
        // Half the time the machine loses power: nothing tells the directory, which holds the
        // connection until the host's next one replaces it (or the deadline ends a handshake).
        if self.conn_rng.chance(ratio(1, 2)) {
            // (A connection already closing stays as it is: the directory let go of it, or
            // the host did, and the close is on its way. Seed 13335: the directory evicted
            // the connection, and marking it silent counted it in the waiting room again.)
            if let Some(c) = self.conns.get_mut(&conn).filter(|c| !c.closing) {
                self.checker.coverage.hit("conns.half_open");
                c.closing = true;
                c.silent = true;
                self.schedule_directory_silence_check(conn);
            }
            return;
        }
        self.close_conn(conn, false);
    }

    /// Connects if the link's back-off allows, else arms its retry.
    fn link_step(&mut self, host: usize) {
        let now = self.host_now(host);
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        let mut actions = Vec::new();
        match hl.link.expire(now, &mut actions) {
            LinkExpired::Nothing => {
                if !actions.is_empty() {
                    self.checker.coverage.hit("conns.pinged");
                }
                self.host_conn_actions(host, actions);
            }
            LinkExpired::Attempt => {
                // The attempt's handshake did not finish in time: closed, backed off.
                self.checker.coverage.hit("conns.handshake_expired");
                self.host_conn_actions(host, actions);
                return;
            }
            LinkExpired::Silent => {
                // The directory answered no ping within the bound: the link is lost.
                self.checker.coverage.hit("conns.left_silent_directory");
                hl.book.link_lost();
                self.host_conn_actions(host, actions);
                return;
            }
        }
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        if hl.link.due(now) {
            let conn = self.next_conn;
            self.next_conn += 1;
            hl.link.connecting(now, conn);
            let opener = hl.boot_nonce;
            self.check_paced(host, now);
            // The handshake's deadline.
            self.arm_link(host);
            self.conns
                .insert(conn, SimConn::new(host, opener, None, None, self.now));
            let delay = self.conn_latency();
            self.schedule_in(delay, EventKind::ConnOpen { conn });
            if self.phase == Phase::Faulty && self.strangers {
                self.strangers(host);
            }
        } else {
            self.arm_link(host);
        }
    }

    /// Restated pacing (issue 52), from the world's own record of the attempts: after `n`
    /// attempts since its last welcome, a host process starts the next no sooner than
    /// min(50 ms · 2^(n−1), 2 s) after the last one started, on its own clock. A reconnect loop
    /// that stops backing off hammers a directory that is down or cut off.
    fn check_paced(&mut self, host: usize, now: Instant) {
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        let (last, n) = hl.attempts;
        hl.attempts = (Some(now), n.saturating_add(1));
        let Some(last) = last.filter(|_| n > 0) else {
            return;
        };
        let wait = BACKOFF_FIRST
            .saturating_mul(1 << (n - 1).min(16))
            .min(BACKOFF_MAX);
        let gap = now.saturating_since(last);
        if gap < wait {
            self.checker.fail(
                self.now,
                format!(
                    "pacing: host {} started a connection attempt to the directory {gap} after \
                     the last one, its {n}th since it was last welcomed (the back-off is {wait} \
                     by then)",
                    self.hosts[host].node
                ),
            );
        } else if n >= 4 {
            self.checker.coverage.hit("conns.backed_off");
        }
    }

    /// Schedules the link's next `LinkRetry` at its deadline, unless one is due by then. (A
    /// deadline already past is one the link did not act on: waking again at once would
    /// spin.)
    fn arm_link(&mut self, host: usize) {
        let now = self.host_now(host);
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        let Some(at) = hl.link.next_deadline().filter(|at| *at > now) else {
            return;
        };
        if hl.link_tick.is_some_and(|armed| armed > now && armed <= at) {
            return;
        }
        hl.link_tick = Some(at);
        let nonce = hl.boot_nonce;
        let at = self.host_at(host, at);
        self.schedule(at, EventKind::LinkRetry { host, nonce });
    }

    /// A link's retry is due.
    pub(super) fn link_retry(&mut self, host: usize, nonce: u64) {
        if self.links[host]
            .as_ref()
            .is_some_and(|hl| hl.boot_nonce == nonce)
        {
            self.link_step(host);
        }
    }

    /// Whether a frame from `from` to `to` has a connection to go on: the directory's admitted
    /// connection of the host, or the host's welcomed link. Frames between hosts are not
    /// carried by these connections.
    pub(super) fn connected(&self, from: NodeId, to: NodeId) -> bool {
        if from == DIRECTORY_NODE && to != DIRECTORY_NODE {
            self.directory
                .conns
                .as_ref()
                .is_some_and(|dc| dc.conn_of(to).is_some())
        } else if to == DIRECTORY_NODE && from != DIRECTORY_NODE {
            self.host_index(from)
                .and_then(|h| self.links[h].as_ref())
                .is_some_and(|hl| hl.link.up().is_some())
        } else {
            true
        }
    }

    /// Strangers connect along with a host's attempt.
    fn strangers(&mut self, host: usize) {
        let count = self.conn_rng.below(STRANGERS_MAX + 1);
        for _ in 0..count {
            let kind = match self.conn_rng.below(4) {
                0 => Stranger::Silent,
                1 => Stranger::WrongKey,
                2 => Stranger::Garbage,
                _ => Stranger::Replay(host),
            };
            let conn = self.next_conn;
            self.next_conn += 1;
            self.conns.insert(
                conn,
                SimConn::new(
                    host,
                    self.hosts[host].boot_nonce,
                    None,
                    Some(kind),
                    self.now,
                ),
            );
            let delay = self.conn_latency();
            self.schedule_in(delay, EventKind::ConnOpen { conn });
        }
    }

    /// A connection attempt reaches the directory (or fails: nobody serves, or a partition).
    pub(super) fn conn_open(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if let Some(to) = c.acceptor {
            let from = c.host;
            return self.peer_open(conn, from, to);
        }
        let (host, stranger) = (c.host, c.stranger.clone());
        let node = self.hosts[host].node;
        let reachable = self.directory.conns.is_some()
            && self.link_up(node, DIRECTORY_NODE)
            && self.link_up(DIRECTORY_NODE, node);
        if stranger.is_none()
            && self.links[host]
                .as_ref()
                .is_none_or(|hl| hl.link.conn() != Some(conn))
        {
            self.conns.remove(&conn); // The process that connected is gone.
            return;
        }
        if !reachable {
            self.conns.remove(&conn);
            if stranger.is_none() {
                self.checker.coverage.hit("conns.connect_failed");
                let now = self.host_now(host);
                if let Some(hl) = self.links[host].as_mut() {
                    hl.link.closed(now, conn);
                }
                self.link_step(host);
            }
            return;
        }
        let boot = self.directory.boot;
        let now = self.dir_now();
        if let Some(c) = self.conns.get_mut(&conn) {
            c.boot = boot;
            c.accepted_at = Some(now);
        }
        let nonce = self.nonce();
        let now = self.dir_now();
        let mut actions = Vec::new();
        if let Some(dc) = self.directory.conns.as_mut() {
            dc.accepted(now, conn, nonce, &mut actions);
        }
        self.dir_conn_actions(actions);
        self.arm_dir_expiry();
        self.check_waiting_room();
        match stranger {
            None => {
                let nonce = self.nonce();
                let mut actions = Vec::new();
                if let Some(hl) = self.links[host].as_mut() {
                    hl.link.connected(conn, nonce, &mut actions);
                    if let Some(ConnAction::Send(_, hello)) = actions.first() {
                        hl.recorded = Some((hello.clone(), Link::Proof { proof: None }));
                    }
                }
                self.host_conn_actions(host, actions);
            }
            Some(kind) => self.stranger_speaks(conn, &kind),
        }
    }

    fn stranger_speaks(&mut self, conn: ConnId, kind: &Stranger) {
        match kind {
            Stranger::Silent => {}
            Stranger::WrongKey => {
                let who = Who::Client;
                let key = ClusterKey::from_bytes([0x5a; 32]);
                let (_, hello) = Connector::new(who, self.nonce(), Some(&key));
                self.send_conn(conn, true, &hello);
                self.send_conn(conn, true, &Link::Proof { proof: None });
            }
            Stranger::Garbage => {
                let len = self.conn_rng.range(1, 64) as usize;
                let bytes: Vec<u8> = (0..len).map(|_| self.conn_rng.below(256) as u8).collect();
                self.send_bytes(conn, true, bytes);
            }
            Stranger::Replay(host) => {
                let recorded = self.links[*host]
                    .as_ref()
                    .and_then(|hl| hl.recorded.clone());
                if let Some((hello, proof)) = recorded {
                    self.send_conn(conn, true, &hello);
                    self.send_conn(conn, true, &proof);
                }
            }
        }
    }

    pub(super) fn send_conn(&mut self, conn: ConnId, to_acceptor: bool, link: &Link) {
        let to_host_from_directory = !to_acceptor
            && self
                .conns
                .get(&conn)
                .is_some_and(|c| c.acceptor.is_none() && c.stranger.is_none());
        if to_host_from_directory && self.conns.get(&conn).is_some_and(|c| c.stalled) {
            return;
        }
        if to_host_from_directory
            && matches!(link, Link::Welcome { .. })
            && self.stalled_welcomes
            && self.phase == Phase::Faulty
            && self.conn_rng.chance(ratio(1, 4))
        {
            // Never delivered, nor anything after it (the connection is ordered), and the
            // connection stays open: only the host's handshake deadline ends the attempt.
            self.checker.coverage.hit("fault.welcome_stalled");
            if let Some(c) = self.conns.get_mut(&conn) {
                c.stalled = true;
            }
            return;
        }
        let bytes = dataplane_core::wire::encode_value(link, usize::MAX).unwrap_or_default();
        self.send_bytes(conn, to_acceptor, bytes);
    }

    fn send_bytes(&mut self, conn: ConnId, to_acceptor: bool, bytes: Vec<u8>) {
        let delay = self.conn_latency();
        let held = self.stall_holds(conn, to_acceptor);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.closing {
            return;
        }
        let last = if to_acceptor {
            &mut c.last_to_acceptor
        } else {
            &mut c.last_to_host
        };
        let sent = held.unwrap_or(self.now);
        let at = sent.saturating_add(delay).max(*last);
        *last = at;
        self.schedule(
            at,
            EventKind::ConnFrame {
                conn,
                to_acceptor,
                bytes,
            },
        );
    }

    /// One side closes `conn` (`by_acceptor`: the directory); the other learns it after the frames
    /// already on their way.
    pub(super) fn close_conn(&mut self, conn: ConnId, by_acceptor: bool) {
        let delay = self.conn_latency();
        // A stall holds the close too: it follows the bytes on their way.
        let sent = self.stall_holds(conn, !by_acceptor).unwrap_or(self.now);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.dir_closed |= by_acceptor && c.acceptor.is_none();
        if c.closing {
            if c.silent && by_acceptor {
                // Its other end is long gone: the directory lets go of it, and that is all.
                self.conns.remove(&conn);
            }
            return;
        }
        c.closing = true;
        let last = if by_acceptor {
            c.last_to_host
        } else {
            c.last_to_acceptor
        };
        let at = sent.saturating_add(delay).max(last);
        self.schedule(
            at,
            EventKind::ConnClosed {
                conn,
                to_acceptor: !by_acceptor,
            },
        );
    }

    /// Every connection the crashed directory instance held breaks: the hosts learn it.
    pub(super) fn break_dir_conns(&mut self) {
        let boot = self.directory.boot;
        let held: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.acceptor.is_none() && c.boot == boot && c.boot != 0)
            .map(|(&conn, _)| conn)
            .collect();
        for conn in held {
            self.close_conn(conn, true);
        }
    }

    /// `conn` breaks, and both sides notice at once.
    pub(super) fn break_conn(&mut self, conn: ConnId) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        if let Some(to) = c.acceptor {
            self.peer_learns_closed(to, conn);
            self.peer_learns_closed(c.host, conn);
            return;
        }
        let now = self.dir_now();
        if c.boot == self.directory.boot
            && let Some(dc) = self.directory.conns.as_mut()
        {
            dc.closed(now, conn);
        }
        if c.stranger.is_none() {
            self.host_learns_closed(c.host, conn);
        }
    }

    /// The other side of `conn` learns that it closed.
    pub(super) fn conn_closed(&mut self, conn: ConnId, to_acceptor: bool) {
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        if let Some(to) = c.acceptor {
            self.peer_learns_closed(if to_acceptor { to } else { c.host }, conn);
            return;
        }
        if to_acceptor {
            let now = self.dir_now();
            if c.boot == self.directory.boot
                && let Some(dc) = self.directory.conns.as_mut()
            {
                dc.closed(now, conn);
            }
        } else if c.stranger.is_none() {
            self.host_learns_closed(c.host, conn);
        }
    }

    fn host_learns_closed(&mut self, host: usize, conn: ConnId) {
        let now = self.host_now(host);
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        if hl.link.conn() == Some(conn) {
            if hl.link.closed(now, conn) == LinkHeard::Lost {
                self.checker.coverage.hit("conns.lost_directory");
                hl.book.link_lost();
            }
            self.link_step(host);
        }
    }

    /// A frame on `conn` arrives.
    pub(super) fn conn_frame(&mut self, conn: ConnId, to_acceptor: bool, bytes: Vec<u8>) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if let Some(until) = c.held_until.filter(|&u| to_acceptor && u > self.now) {
            // In the order they were sent: each is put back in turn.
            self.schedule(
                until,
                EventKind::ConnFrame {
                    conn,
                    to_acceptor,
                    bytes,
                },
            );
            return;
        }
        let (host, nonce, boot, stranger) = (c.host, c.nonce, c.boot, c.stranger.clone());
        if let Some(to) = c.acceptor {
            return self.peer_conn_frame(conn, host, to, to_acceptor, &bytes);
        }
        let node = self.hosts[host].node;
        if !self.link_up(node, DIRECTORY_NODE) || !self.link_up(DIRECTORY_NODE, node) {
            // The partition breaks the connection: both sides learn it.
            self.checker.coverage.hit("conns.broken_by_partition");
            self.break_conn(conn);
            return;
        }
        if to_acceptor {
            self.dir_conn_frame(conn, boot, host, nonce, stranger, &bytes);
        } else if stranger.is_none() {
            self.host_conn_frame(conn, host, &bytes);
        }
    }

    fn dir_conn_frame(
        &mut self,
        conn: ConnId,
        boot: u64,
        host: usize,
        nonce: u64,
        stranger: Option<Stranger>,
        bytes: &[u8],
    ) {
        if boot != self.directory.boot {
            return;
        }
        let address = self.directory.address();
        let now = self.dir_now();
        let (Some(machine), Some(dc)) = (&self.directory.machine, self.directory.conns.as_mut())
        else {
            return;
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.dir_heard = Some(now);
        }
        let epoch = machine.epoch();
        let mut actions = Vec::new();
        let heard = dc.frame(
            now,
            conn,
            bytes,
            &mut self.directory.membership,
            &mut || machine.durable().named_nodes(),
            address,
            epoch,
            &mut actions,
        );
        // Core's own consistency check of its tables (the restated checks below come first).
        let tables = dc.check_invariants();
        if !self.dir_conn_actions(actions) {
            // The directory stopped (its storage failed): the admission's record may have
            // reached the disk all the same.
            if let DirHeard::Host { admitted, .. } = heard {
                let m = admitted.member();
                self.directory.maybe_admitted[host] = Some((m.incarnation, m.boot_nonce));
            }
            return;
        }
        if let (DirHeard::Host { .. }, Some(c)) = (&heard, self.conns.get_mut(&conn)) {
            c.admitted = true;
        }
        self.check_one_connection_per_host();
        if let Err(e) = tables {
            self.checker
                .fail(self.now, format!("conns: the directory's tables: {e}"));
        }
        if let Some(kind) = stranger {
            if !matches!(heard, DirHeard::Nothing) {
                self.checker.fail(
                    self.now,
                    format!("conns: a stranger ({kind:?}) was heard by the directory: {heard:?}"),
                );
            }
            return;
        }
        match heard {
            DirHeard::Nothing => {}
            // The simulated membership never fills (a handful of hosts, each with its own
            // listen address for good): a forgotten member is a forgetting out of turn.
            DirHeard::Host {
                forgot: Some(f), ..
            } => self.checker.fail(
                self.now,
                format!(
                    "membership: {} (node {}) was forgotten though the table has room",
                    f.listen, f.member.node
                ),
            ),
            DirHeard::Host { admitted, .. } => self.host_admitted(host, nonce, admitted),
            other => self.checker.fail(
                self.now,
                format!(
                    "conns: host {} was heard as {other:?}, not admitted",
                    self.hosts[host].node
                ),
            ),
        }
    }

    /// Membership took a hello on a connection the host's boot `nonce` opened: checked
    /// against the world's account of that boot (which may have died since: its last frames
    /// still arrive).
    fn host_admitted(&mut self, host: usize, nonce: u64, admitted: Admitted) {
        let h = &self.hosts[host];
        let listen = host_listen(h.node);
        let known = self.directory.admitted[host];
        let maybe = self.directory.maybe_admitted[host].take();
        let m = admitted.member();
        let newest = self.directory.newest_admitted[host];
        if nonce < newest {
            self.checker.fail(
                self.now,
                format!(
                    "membership: {listen} (node {}) boot nonce {nonce} was admitted as \
                     {admitted:?} after boot {newest} was: a dead boot's late hello restarted \
                     the node under the live one",
                    h.node
                ),
            );
            return;
        }
        let fine = m.node == h.node
            && m.boot_nonce == nonce
            && match (admitted, known) {
                (Admitted::Reconnected(_), Some((incarnation, known_nonce))) => {
                    (known_nonce == nonce && m.incarnation == incarnation)
                        || maybe == Some((m.incarnation, m.boot_nonce))
                }
                (Admitted::Restarted(_), Some((incarnation, known_nonce))) => {
                    known_nonce != nonce && m.incarnation > incarnation
                }
                (Admitted::New(_), None) => m.incarnation == 1,
                _ => false,
            };
        // The world's own account of who holds each node id: the host at that place once it
        // was admitted (durably, or maybe).
        let holder = (0..self.hosts.len()).find(|&other| {
            other != host
                && self.hosts[other].node == m.node
                && (self.directory.admitted[other].is_some()
                    || self.directory.maybe_admitted[other].is_some())
        });
        if let Some(other) = holder {
            self.checker.fail(
                self.now,
                format!(
                    "membership: node id {} handed out twice: {listen} (boot nonce {nonce}) was \
                     admitted as {admitted:?}, and {} holds it",
                    m.node,
                    host_listen(self.hosts[other].node)
                ),
            );
            return;
        }
        if !fine {
            self.checker.fail(
                self.now,
                format!(
                    "membership: {listen} (node {}, boot nonce {nonce}, last durably admitted as \
                     {known:?}, maybe as {maybe:?}) said hello and was admitted as {admitted:?}",
                    h.node
                ),
            );
            return;
        }
        self.checker.coverage.hit(match admitted {
            Admitted::Reconnected(_) => "conns.reconnected",
            Admitted::Restarted(_) => "conns.restarted",
            Admitted::New(_) => "conns.new",
        });
        self.directory.admitted[host] = Some((m.incarnation, m.boot_nonce));
        self.directory.newest_admitted[host] = nonce;
    }

    fn host_conn_frame(&mut self, conn: ConnId, host: usize, bytes: &[u8]) {
        let now = self.host_now(host);
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        let mut actions = Vec::new();
        let heard = hl.link.frame(now, conn, bytes, &mut actions);
        if let Some(ConnAction::Send(_, proof @ Link::Proof { .. })) = actions.first()
            && let Some((_, recorded)) = hl.recorded.as_mut()
        {
            *recorded = proof.clone();
        }
        self.host_conn_actions(host, actions);
        match heard {
            LinkHeard::Nothing => {}
            LinkHeard::Located { node, listen } => self.located(host, node, listen),
            LinkHeard::Welcomed {
                node, incarnation, ..
            } => {
                self.host_welcomed(host, node, incarnation);
                self.book_tick(host, self.hosts[host].boot_nonce);
                // Its first ping.
                self.arm_link(host);
            }
            other => self.checker.fail(
                self.now,
                format!(
                    "conns: host {} heard {other:?} from the directory",
                    self.hosts[host].node
                ),
            ),
        }
    }

    /// A host's link was welcomed: a restarting process starts as the incarnation its last
    /// durable admission gave it; a running one must be welcomed as what it runs as.
    fn host_welcomed(&mut self, host: usize, node: NodeId, incarnation: u64) {
        if let Some(hl) = self.links[host].as_mut() {
            hl.attempts.1 = 0;
        }
        let h = &self.hosts[host];
        let known = self.directory.admitted[host];
        let expected = known.filter(|&(_, nonce)| nonce == h.boot_nonce);
        if node != h.node || expected.map(|(i, _)| i) != Some(incarnation) {
            self.checker.fail(
                self.now,
                format!(
                    "conns: host {} (boot nonce {}, durably admitted as {known:?}) was welcomed \
                     as node {node} incarnation {incarnation}",
                    h.node, h.boot_nonce
                ),
            );
            return;
        }
        if h.up {
            if h.incarnation != incarnation {
                self.checker.fail(
                    self.now,
                    format!(
                        "conns: host {} runs as incarnation {} and was welcomed as {incarnation}",
                        h.node, h.incarnation
                    ),
                );
            }
            self.maybe_probe(host);
            return;
        }
        if incarnation <= h.incarnation {
            self.checker.fail(
                self.now,
                format!(
                    "membership: host {} restarted from incarnation {} and was welcomed as \
                     {incarnation}, not a new incarnation",
                    h.node, h.incarnation
                ),
            );
            return;
        }
        if h.incarnation == 0 {
            // A late joiner's first welcome (churn).
            self.checker.coverage.hit("churn.joined");
            if self.directory.boot > 1 {
                self.checker.coverage.hit("churn.joined_after_recovery");
            }
        }
        self.checker.coverage.hit("membership.restarted");
        self.finish_restart(host, incarnation);
        self.maybe_probe(host);
    }

    /// Does what the directory's connection machine asked; `false` if the node stopped.
    fn dir_conn_actions(&mut self, actions: Vec<ConnAction>) -> bool {
        // The host admissions these actions made durable so far, in order.
        let mut durable: Vec<(NodeId, u64)> = Vec::new();
        for action in actions {
            match action {
                ConnAction::Send(conn, link) => {
                    if let Link::Welcome {
                        node, incarnation, ..
                    } = link
                    {
                        self.check_welcome_durable(conn, node, incarnation, &durable);
                    }
                    self.send_conn(conn, false, &link);
                }
                ConnAction::Resume(_) | ConnAction::Admitted(_) => {}
                ConnAction::Refuse { conn, why, reason } => {
                    self.checker.coverage.hit(match why {
                        dataplane_core::conns::Closing::WrongKey => "conns.refused_wrong_key",
                        _ => "conns.refused",
                    });
                    self.send_conn(conn, false, &Link::Refused { reason });
                    self.close_conn(conn, true);
                }
                ConnAction::Close(conn, why) => {
                    if why == dataplane_core::conns::Closing::Silent {
                        self.check_silent_close(conn);
                    }
                    let admitted = self.conns.get(&conn).is_some_and(|c| c.admitted);
                    self.checker.coverage.hit(match why {
                        dataplane_core::conns::Closing::Expired => "conns.expired",
                        dataplane_core::conns::Closing::Evicted => "conns.evicted",
                        // A handshake left open when its host was admitted on another
                        // connection (a dead boot's, or an attempt given up).
                        dataplane_core::conns::Closing::Replaced if !admitted => {
                            "conns.handshake_replaced"
                        }
                        _ => "conns.closed",
                    });
                    self.close_conn(conn, true);
                }
                ConnAction::Persist(records) => {
                    if !self.persist_members(&records) {
                        return false;
                    }
                    durable.extend(records.iter().filter_map(|r| match r {
                        LogRecord::Member(MemberRecord::Host {
                            node, incarnation, ..
                        }) => Some((*node, *incarnation)),
                        _ => None,
                    }));
                }
            }
        }
        true
    }

    /// A welcome leaves only after the admission it announces is durable: made durable by an
    /// earlier action of the same step, or already the host's (a reconnection of the boot that
    /// opened the connection, durably admitted before, or maybe so when a storage failure cut
    /// the step that wrote it). The rule, restated where the frame leaves: the host's own check
    /// on arrival sees only welcomes that outrun a crash.
    fn check_welcome_durable(
        &mut self,
        conn: ConnId,
        node: NodeId,
        incarnation: u64,
        durable: &[(NodeId, u64)],
    ) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if c.acceptor.is_some() || c.stranger.is_some() {
            return;
        }
        let (host, nonce) = (c.host, c.nonce);
        let before = |known: Option<(u64, u64)>| known == Some((incarnation, nonce));
        let known = node == self.hosts[host].node
            && (before(self.directory.admitted[host])
                || before(self.directory.maybe_admitted[host]));
        if !known && !durable.contains(&(node, incarnation)) {
            self.checker.fail(
                self.now,
                format!(
                    "conns: host {} (boot nonce {nonce}) was welcomed as node {node} incarnation \
                     {incarnation} before that admission was durable",
                    self.hosts[host].node
                ),
            );
        }
    }

    fn host_conn_actions(&mut self, host: usize, actions: Vec<ConnAction>) {
        for action in actions {
            match action {
                ConnAction::Send(conn, link) => self.send_conn(conn, true, &link),
                ConnAction::Close(conn, _) => {
                    self.close_conn(conn, false);
                    self.link_step(host);
                }
                other => self.checker.fail(
                    self.now,
                    format!("conns: a host's link asked for {other:?}"),
                ),
            }
        }
    }

    /// Arms the directory's admission deadline (the earliest pending connection's).
    pub(super) fn arm_dir_expiry(&mut self) {
        let Some(at) = self
            .directory
            .conns
            .as_ref()
            .and_then(|dc| dc.next_deadline())
        else {
            return;
        };
        let at = self.dir_at(at);
        if self.directory.expiry_armed.is_some_and(|armed| armed <= at) {
            return;
        }
        self.directory.expiry_armed = Some(at);
        let boot = self.directory.boot;
        self.schedule(at, EventKind::DirConnsExpire { boot });
    }

    /// The admission deadline passed: the connections not admitted in time close.
    pub(super) fn dir_conns_expire(&mut self, boot: u64) {
        if boot != self.directory.boot {
            return;
        }
        self.directory.expiry_armed = None;
        let now = self.dir_now();
        let mut actions = Vec::new();
        if let Some(dc) = self.directory.conns.as_mut()
            && !dc.expire(now, &mut actions).is_empty()
        {
            // (The simulated routes follow the world's truth, not the directory's tables.)
            self.checker
                .coverage
                .hit("conns.directory_let_go_silent_host");
        }
        self.dir_conn_actions(actions);
        self.check_deadline();
        self.arm_dir_expiry();
    }

    /// The connections the serving directory accepted and has not admitted or closed.
    fn waiting(&self) -> impl Iterator<Item = (&ConnId, &SimConn)> {
        let boot = self.directory.boot;
        self.conns.iter().filter(move |(_, c)| {
            c.acceptor.is_none() && c.boot == boot && (!c.closing || c.silent) && !c.admitted
        })
    }

    /// ARCHITECTURE "Connections and admission", restated: at most the waiting room's
    /// bound wait for admission at once.
    fn check_waiting_room(&mut self) {
        let waiting = self.waiting().count();
        if waiting > SIM_PENDING_MAX {
            self.checker.fail(
                self.now,
                format!(
                    "conns: {waiting} connections wait for admission at once (the waiting room \
                     holds {SIM_PENDING_MAX})"
                ),
            );
        }
    }

    /// Restated: the directory keeps at most one admitted connection per host (a newer one
    /// replaces and closes the older: every connection has an owner who frees it).
    fn check_one_connection_per_host(&mut self) {
        let boot = self.directory.boot;
        let mut held = vec![0usize; self.hosts.len()];
        for c in self.conns.values() {
            if c.acceptor.is_none()
                && c.boot == boot
                && c.admitted
                && (!c.closing || c.silent)
                && c.stranger.is_none()
            {
                held[c.host] += 1;
            }
        }
        if let Some(host) = held.iter().position(|&n| n > 1) {
            self.checker.fail(
                self.now,
                format!(
                    "conns: the directory holds {} admitted connections of host {}",
                    held[host], self.hosts[host].node
                ),
            );
        }
    }

    /// Restated, on the directory's clock: once the deadline fired, no connection accepted
    /// that long ago still waits for admission.
    fn check_deadline(&mut self) {
        let now = self.dir_now();
        let late = self.waiting().find_map(|(conn, c)| {
            let waited = now.saturating_since(c.accepted_at?);
            (waited >= SIM_ADMISSION_DEADLINE).then_some((*conn, waited))
        });
        if let Some((conn, waited)) = late {
            self.checker.fail(
                self.now,
                format!(
                    "conns: connection {conn} has waited {waited} for admission (the deadline \
                     is {SIM_ADMISSION_DEADLINE})"
                ),
            );
        }
    }
}

//! The connections between the hosts and the replicas in the replicated mode, run by the
//! machines `dataplane-node` runs: each host's link is core's [`DirectoryLink`] over the five
//! replicas' addresses (hello, proof, welcome, pings, the rotation and its back-off), and each
//! replica's side is the replica crate's [`HostSide`] (`replnode.rs` runs the same one): only
//! the serving replica takes a host, its membership change is proposed to the log and the
//! welcome waits until it is applied, directory frames for hosts wait behind it, pings are
//! answered. A simulated connection is ordered and lossless while it lives (TCP).
//!
//! Silent faults: a replica may be paused (SIGSTOP: what it is sent waits, its kernel still
//! completes a connection nobody answers, its connections stay open) or cut off from everyone
//! without a close (a partition that drops: TCP holds the bytes until it heals). A host still
//! on such a replica [`SILENT_LEADER_LEFT_WITHIN`] after it went silent fails the seed (the
//! world's own account of the silence, never what the link says of itself).
//!
//! Checked here too: a host is welcomed as the node and incarnation it runs as, at an epoch
//! that never goes back, and a welcome that follows a membership change leaves only once that
//! change's entry is durable on a quorum of disks.

use dataplane_core::conns::{
    ConnAction, ConnId, DIRECTORY_CANDIDATES_MAX, DirHeard, DirectoryLink, LinkExpired, LinkHeard,
};
use dataplane_core::link::{ClusterKey, Link, Who};
use dataplane_core::wire::{Envelope, encode_value};
use dataplane_replica::HostIo;

use super::*;

/// How long a host may stay on a replica that delivers nothing to it (paused, or cut off
/// without a close): the link's silence bound (core's default, 1 s) and 300 ms for the last
/// answer's round trip and the latency of the run.
pub const SILENT_LEADER_LEFT_WITHIN: Duration = Duration::from_millis(1_300);

/// A simulated connection from a host to a replica.
#[derive(Debug)]
pub(super) struct RConn {
    pub host: usize,
    pub replica: usize,
    /// The replica's life it reached (0 until it arrived).
    pub life: u64,
    /// Either side closed it: frames on their way still arrive, nothing new is sent.
    pub closing: bool,
    /// When the last frame towards the replica, and towards the host, arrives (in order).
    pub last_to_replica: Instant,
    pub last_to_host: Instant,
}

impl ReplWorld {
    /// Host `h`'s link, as `dataplane-node host --directory A,B,C,D,E` starts it.
    pub(super) fn new_link(h: usize, key: ClusterKey) -> DirectoryLink {
        const _: () = assert!(SLOTS <= DIRECTORY_CANDIDATES_MAX);
        let who = Who::Host {
            listen: host_listen(h),
            boot_nonce: 1,
        };
        DirectoryLink::new(who, Some(key), Instant::ZERO).with_candidates(SLOTS, h % FIRST_VOTERS)
    }

    /// Connects if the link's back-off allows, sends its pings, gives up a silent directory;
    /// arms its next deadline.
    pub(super) fn link_step(&mut self, h: usize) {
        let now = self.now;
        let mut actions = Vec::new();
        let was_up = self.hosts[h].link.up().is_some();
        match self.hosts[h].link.expire(now, &mut actions) {
            LinkExpired::Nothing => {}
            LinkExpired::Attempt => self.checker.coverage.hit("replicas.attempt_expired"),
            LinkExpired::Silent => {
                self.checker.coverage.hit("replicas.left_silent_leader");
            }
        }
        self.host_actions(h, actions);
        if was_up && self.hosts[h].link.up().is_none() {
            self.proxy_input(h, ProxyInput::Discovery(None));
        }
        if self.hosts[h].link.due(now) {
            self.next_conn += 1;
            let conn = self.next_conn;
            let r = self.hosts[h].link.candidate();
            self.hosts[h].link.connecting(now, conn);
            self.rconns.insert(
                conn,
                RConn {
                    host: h,
                    replica: r,
                    life: 0,
                    closing: false,
                    last_to_replica: now,
                    last_to_host: now,
                },
            );
            let d = self.conn_latency();
            self.at(d, Ev::ConnArrive(conn));
        }
        self.arm_link(h);
    }

    /// Schedules the link's next `LinkTick`, unless one is due by then.
    fn arm_link(&mut self, h: usize) {
        let now = self.now;
        let host = &mut self.hosts[h];
        let Some(at) = host.link.next_deadline().filter(|at| *at > now) else {
            return;
        };
        if host
            .link_tick
            .is_some_and(|armed| armed > now && armed <= at)
        {
            return;
        }
        host.link_tick = Some(at);
        self.at(at.saturating_since(now), Ev::LinkTick(h));
    }

    /// Does what host `h`'s link asked.
    fn host_actions(&mut self, h: usize, actions: Vec<ConnAction>) {
        for action in actions {
            match action {
                ConnAction::Send(conn, link) => self.send_conn(conn, true, &link),
                ConnAction::Close(conn, _) => self.close_conn(conn, false),
                other => self.fail(format!("host {}'s link asked for {other:?}", h + 1)),
            }
        }
    }

    fn conn_latency(&mut self) -> Duration {
        let n = &self.options.net;
        let jitter = self
            .conn_rng
            .exponential(n.latency_jitter_mean.as_nanos().max(1));
        n.latency_min.saturating_add(Duration::from_nanos(jitter))
    }

    /// The replica's kernel completes the connection (or refuses it: the replica does not run,
    /// or a partition that closes cuts it off; one that drops loses the handshake, and the
    /// host's attempt runs out).
    pub(super) fn conn_arrive(&mut self, conn: ConnId) {
        let Some(c) = self.rconns.get(&conn) else {
            return;
        };
        let (h, r) = (c.host, c.replica);
        if self.hosts[h].link.conn() != Some(conn) {
            self.rconns.remove(&conn);
            return;
        }
        let rep = &self.reps[r];
        match rep.cut {
            Some((Cut::Silent, _)) => return,
            Some((Cut::Everyone, _)) => {}
            _ if rep.node.is_some() => {
                let life = rep.life;
                if let Some(c) = self.rconns.get_mut(&conn) {
                    c.life = life;
                }
                // The host learns the connection is made; the replica's process takes it
                // when it runs (at once, unless it is paused).
                let nonce = self.nonce();
                let mut actions = Vec::new();
                self.hosts[h].link.connected(conn, nonce, &mut actions);
                self.host_actions(h, actions);
                self.at(Duration::ZERO, Ev::Accept(conn));
                return;
            }
            _ => {}
        }
        self.rconns.remove(&conn);
        self.checker.coverage.hit("replicas.host_refused");
        let _ = self.hosts[h].link.closed(self.now, conn);
        self.link_step(h);
    }

    /// The replica's process accepts the connection.
    pub(super) fn accept(&mut self, conn: ConnId) {
        let Some(c) = self.rconns.get(&conn) else {
            return;
        };
        let r = c.replica;
        if c.life != self.reps[r].life || self.reps[r].node.is_none() {
            return;
        }
        let nonce = self.nonce();
        let mut io = Vec::new();
        // Whom this replica knows to lead, as its driver names it to a host: never itself (a
        // leader that does not serve yet, or hands its leadership over, would send the host
        // straight back).
        let leader = self.reps[r]
            .node
            .as_ref()
            .and_then(|n| n.replica().leader())
            .filter(|&id| id as usize != r + 1)
            .map(|id| replica_hosts(id as usize - 1));
        if !self.reps[r]
            .side
            .accepted(self.now, conn, nonce, leader, &mut io)
        {
            self.checker.coverage.hit("replicas.host_refused");
        }
        self.rep_io(r, io);
        self.side_release(r);
    }

    fn nonce(&mut self) -> [u8; 32] {
        let mut nonce = [0u8; 32];
        for chunk in nonce.chunks_mut(8) {
            chunk.copy_from_slice(&self.conn_rng.next_u64().to_le_bytes());
        }
        nonce
    }

    /// Sends `link` on `conn`, towards the replica or the host; a partition that drops or a
    /// paused replica holds it (it arrives once that ends, in order).
    pub(super) fn send_conn(&mut self, conn: ConnId, to_replica: bool, link: &Link) {
        let Ok(bytes) = encode_value(link, usize::MAX) else {
            return self.fail(format!("a {} does not encode", link.name()));
        };
        let d = self.conn_latency();
        let Some(c) = self.rconns.get_mut(&conn) else {
            return;
        };
        if c.closing {
            return;
        }
        let last = if to_replica {
            &mut c.last_to_replica
        } else {
            &mut c.last_to_host
        };
        let at = self.now.saturating_add(d).max(*last);
        *last = at;
        let d = at.saturating_since(self.now);
        self.at(
            d,
            Ev::ConnFrame {
                conn,
                to_replica,
                bytes,
            },
        );
    }

    /// One side closes `conn` (`by_replica`: the replica); the other learns it after the
    /// frames on their way.
    pub(super) fn close_conn(&mut self, conn: ConnId, by_replica: bool) {
        let d = self.conn_latency();
        let Some(c) = self.rconns.get_mut(&conn) else {
            return;
        };
        if c.closing {
            return;
        }
        c.closing = true;
        let last = if by_replica {
            c.last_to_host
        } else {
            c.last_to_replica
        };
        let at = self.now.saturating_add(d).max(last);
        self.at(
            at.saturating_since(self.now),
            Ev::ConnClosed {
                conn,
                to_replica: !by_replica,
            },
        );
    }

    /// A frame on `conn` arrives (a cut that drops holds it until the cut ends).
    pub(super) fn conn_frame(&mut self, conn: ConnId, to_replica: bool, bytes: Vec<u8>) {
        let Some(c) = self.rconns.get(&conn) else {
            return;
        };
        let (h, r) = (c.host, c.replica);
        if let Some((Cut::Silent, generation)) = self.reps[r].cut {
            // TCP retransmits it once the partition heals.
            self.reps[r]
                .held_frames
                .push((generation, conn, to_replica, bytes));
            return;
        }
        if to_replica {
            if c.life != self.reps[r].life || self.reps[r].node.is_none() {
                return;
            }
            self.replica_frame(r, conn, &bytes);
        } else {
            self.host_frame(h, conn, &bytes);
        }
    }

    fn replica_frame(&mut self, r: usize, conn: ConnId, bytes: &[u8]) {
        let now = self.now;
        let mut io = Vec::new();
        let rep = &mut self.reps[r];
        let Some(node) = rep.node.as_mut() else {
            return;
        };
        let before = (node.replica().last_index(), node.applied());
        let term = node.serving_term();
        let heard = rep.side.frame(now, conn, bytes, node, &mut io);
        let after = node.replica().last_index();
        if let (Some(term), DirHeard::Host { .. }) = (term, &heard) {
            // The checker's own account: the admission is the engine's last entry now. A
            // welcome says "this replica serves you at its term", which only an entry of the
            // term committed after the hello confirms: with no membership change (a known
            // host on the same boot), the next entry at least.
            let index = if after > before.0 {
                after
            } else {
                before.0 + 1
            };
            self.admissions.insert(conn, (term, index, before.1));
        }
        match heard {
            DirHeard::Envelope(envelope) => {
                self.rep_io(r, io);
                self.directory_input(r, DirInput::Message(envelope.message));
            }
            DirHeard::Host {
                forgot: Some(f), ..
            } => {
                self.fail(format!(
                    "membership: {} (node {}) was forgotten though the table has room",
                    f.listen, f.member.node
                ));
            }
            DirHeard::HostRefused { reason, .. } => {
                self.fail(format!(
                    "membership: replica {} refused a host: {reason}",
                    r + 1
                ));
            }
            DirHeard::Client { .. } | DirHeard::Protocol { .. } => {
                self.fail(format!(
                    "conns: replica {} heard {heard:?} from a host",
                    r + 1
                ));
            }
            DirHeard::Nothing | DirHeard::Host { .. } => self.rep_io(r, io),
        }
        self.routes_changed(r);
        self.drive(r);
    }

    fn host_frame(&mut self, h: usize, conn: ConnId, bytes: &[u8]) {
        let now = self.now;
        let mut actions = Vec::new();
        let was_up = self.hosts[h].link.up().is_some();
        let heard = self.hosts[h].link.frame(now, conn, bytes, &mut actions);
        self.host_actions(h, actions);
        match heard {
            LinkHeard::Nothing | LinkHeard::Located { .. } => {}
            LinkHeard::Welcomed {
                node,
                incarnation,
                directory,
                epoch,
            } => {
                let r = self.rconns.get(&conn).map_or(0, |c| c.replica);
                let host = &mut self.hosts[h];
                if (node, incarnation) != (host.node, 1) {
                    let runs = host.node;
                    return self.fail(format!(
                        "conns: host {} (node {runs}) was welcomed as node {node} incarnation \
                         {incarnation}",
                        h + 1
                    ));
                }
                if epoch < host.epoch_seen {
                    let seen = host.epoch_seen;
                    return self.fail(format!(
                        "epoch: host {} was welcomed at epoch {epoch} by replica {} after epoch {seen}",
                        h + 1,
                        r + 1
                    ));
                }
                let first_welcome = host.epoch_seen == AuthorityEpoch::NONE;
                host.epoch_seen = epoch;
                self.checker.coverage.hit("replicas.welcomed");
                if first_welcome && late_join(&self.options, h).is_some() {
                    self.checker.coverage.hit("churn.joined");
                }
                let found = Discovered {
                    address: directory,
                    epoch,
                };
                self.proxy_input(h, ProxyInput::Discovery(Some(found)));
                // The hosts join one after another, so that each is the node its order says;
                // a late joiner (churn) no sooner than its time.
                if h + 1 < self.hosts.len() && !self.hosts[h + 1].started {
                    match late_join(&self.options, h + 1) {
                        Some(at) if Instant::ZERO.saturating_add(at) > self.now => {
                            let wait = Instant::ZERO.saturating_add(at).saturating_since(self.now);
                            self.at(wait, Ev::Join(h + 1));
                        }
                        _ => {
                            self.hosts[h + 1].started = true;
                            self.link_step(h + 1);
                        }
                    }
                }
            }
            LinkHeard::Envelope(envelope) => self.host_envelope(h, envelope),
            LinkHeard::Lost | LinkHeard::Protocol => {
                if was_up {
                    self.proxy_input(h, ProxyInput::Discovery(None));
                }
            }
            LinkHeard::NotLeader { leader } => {
                // As `dataplane-node` does: the next attempt goes to the named replica if it is
                // one of the host's addresses.
                if let Some(slot) = leader
                    .as_deref()
                    .and_then(|l| (0..SLOTS).find(|&r| replica_hosts(r) == l))
                    && self.hosts[h].link.redirect(self.now, slot)
                {
                    self.checker.coverage.hit("replicas.redirected");
                }
            }
            other => self.fail(format!("conns: host {} heard {other:?}", h + 1)),
        }
        self.arm_link(h);
    }

    /// A directory frame reaches host `h`.
    fn host_envelope(&mut self, h: usize, envelope: Envelope) {
        let Envelope { to, message, .. } = envelope;
        match message {
            Message::Retire { .. } => {
                // The source answers (it has no binding to keep).
                let answer = Message::SourceRetired { source: to };
                self.host_send(h, to, answer);
            }
            Message::Reply(_) if to == Address::new(self.hosts[h].node, 1, 500) => {
                self.proxy_input(h, ProxyInput::Message(message));
            }
            _ => {}
        }
    }

    /// A frame from host `h` to the directory: over its link, if welcomed (as the real host:
    /// nothing is sent while it has no directory).
    pub(super) fn host_send(&mut self, h: usize, from: Address, message: Message) {
        let Some(conn) = self.hosts[h].link.up() else {
            return;
        };
        let envelope = Envelope {
            from,
            to: Address::new(DIRECTORY_NODE, 0, 0),
            message,
        };
        self.send_conn(conn, true, &Link::Frame(envelope));
    }

    /// The other side of `conn` learns that it closed.
    pub(super) fn conn_closed(&mut self, conn: ConnId, to_replica: bool) {
        let Some(c) = self.rconns.remove(&conn) else {
            return;
        };
        let (h, r) = (c.host, c.replica);
        if to_replica {
            if c.life == self.reps[r].life && self.reps[r].node.is_some() {
                self.reps[r].side.closed(self.now, conn);
                self.routes_changed(r);
                self.drive(r);
            }
        } else {
            self.host_learns_closed(h, conn);
        }
    }

    fn host_learns_closed(&mut self, h: usize, conn: ConnId) {
        if self.hosts[h].link.conn() != Some(conn) {
            return;
        }
        if self.hosts[h].link.closed(self.now, conn) == LinkHeard::Lost {
            self.proxy_input(h, ProxyInput::Discovery(None));
        }
        self.link_step(h);
    }

    /// Replica `r`'s process is gone (a crash, a removal, a wipe) or a partition that closes
    /// cuts it off: every connection it had breaks, and the hosts learn it.
    pub(super) fn break_conns(&mut self, r: usize) {
        let held: Vec<ConnId> = self
            .rconns
            .iter()
            .filter(|(_, c)| c.replica == r && !c.closing)
            .map(|(&conn, _)| conn)
            .collect();
        for conn in held {
            self.close_conn(conn, true);
        }
    }

    /// Carries out what replica `r`'s hosts' side asked for; a welcome is checked against the
    /// world's account of its admission entry first.
    pub(super) fn rep_io(&mut self, r: usize, io: Vec<HostIo>) {
        for action in io {
            match action {
                HostIo::Send(conn, link) | HostIo::Conn(ConnAction::Send(conn, link)) => {
                    if let Link::Welcome { .. } = link {
                        self.check_welcome(r, conn);
                    }
                    self.send_conn(conn, false, &link);
                }
                HostIo::Close(conn) | HostIo::Conn(ConnAction::Close(conn, _)) => {
                    self.close_conn(conn, true);
                }
                HostIo::SendAndClose(conn, link) => {
                    self.send_conn(conn, false, &link);
                    self.close_conn(conn, true);
                }
                HostIo::Conn(ConnAction::Refuse { conn, reason, .. }) => {
                    self.send_conn(conn, false, &Link::Refused { reason });
                    self.close_conn(conn, true);
                }
                HostIo::Conn(ConnAction::Resume(_) | ConnAction::Admitted(_)) => {}
                HostIo::Conn(ConnAction::Persist(_)) => {
                    self.fail(format!("replica {}'s hosts' side let a Persist out", r + 1));
                }
            }
        }
    }

    /// A welcome leaves only once the entry its admission waits for is durable on a quorum of
    /// disks (no host hears of an identity a failover could forget, nor of a term a later
    /// one replaced).
    fn check_welcome(&mut self, r: usize, conn: ConnId) {
        let Some((term, index, applied)) = self.admissions.remove(&conn) else {
            return;
        };
        let serving = self.reps[r].node.as_ref().and_then(Node::serving_term);
        let durable = self.durable_on_quorum(index, term, applied);
        if serving != Some(term) || durable.is_err() {
            let why = durable.err().unwrap_or_default();
            let h = self.rconns.get(&conn).map_or(0, |c| c.host);
            self.fail(format!(
                "welcome: replica {} welcomed host {} at term {serving:?} before its admission \
                 (entry {index} of term {term}) was durable on a quorum: {why}",
                r + 1,
                h + 1
            ));
        }
    }

    /// Follows whether replica `r` serves, then lets its hosts' side release what the log
    /// applied (and arms its deadline).
    pub(super) fn side_release(&mut self, r: usize) {
        let mut io = Vec::new();
        let rep = &mut self.reps[r];
        let Some(node) = rep.node.as_ref() else {
            return;
        };
        rep.side.follow(self.now, node, &mut io);
        rep.side.release(node.applied(), &mut io);
        self.rep_io(r, io);
        self.arm_side(r);
    }

    /// The route changes of replica `r`'s watched targets go to its directory.
    pub(super) fn routes_changed(&mut self, r: usize) {
        let mut changes = Vec::new();
        loop {
            self.reps[r].side.route_changes(&mut changes);
            if changes.is_empty() {
                return;
            }
            self.checker.coverage.hit("replicas.route_reported");
            for (target, routable) in changes.drain(..) {
                self.directory_input(r, DirInput::Route { target, routable });
            }
        }
    }

    /// Schedules replica `r`'s hosts' side's next deadline (a handshake's, a host's silence),
    /// unless one is due by then.
    fn arm_side(&mut self, r: usize) {
        let now = self.now;
        let rep = &mut self.reps[r];
        let Some(at) = rep.side.next_deadline().filter(|at| *at > now) else {
            return;
        };
        if rep
            .side_tick
            .is_some_and(|armed| armed > now && armed <= at)
        {
            return;
        }
        rep.side_tick = Some(at);
        let life = rep.life;
        self.at(at.saturating_since(now), Ev::SideTick(r, life));
    }

    /// Replica `r`'s hosts' side's deadline passed.
    pub(super) fn side_tick(&mut self, r: usize, life: u64) {
        let rep = &mut self.reps[r];
        if rep.life != life {
            return;
        }
        let Some(node) = rep.node.as_mut() else {
            return;
        };
        if !rep.side.expire(self.now, node).is_empty() {
            self.checker.coverage.hit("replicas.let_go_silent_host");
        }
        self.routes_changed(r);
        self.side_release(r);
        self.drive(r);
    }

    /// Replica `r` went silent (`episode`: its pause or its cut): every host welcomed on it
    /// must have left it [`SILENT_LEADER_LEFT_WITHIN`] later, if it is still silent then.
    pub(super) fn silence_checks(&mut self, r: usize, episode: u64) {
        let on: Vec<(usize, ConnId)> = self
            .rconns
            .iter()
            .filter(|(_, c)| c.replica == r && !c.closing)
            .filter(|&(&conn, c)| self.hosts[c.host].link.up() == Some(conn))
            .map(|(&conn, c)| (c.host, conn))
            .collect();
        for (h, conn) in on {
            self.at(
                SILENT_LEADER_LEFT_WITHIN,
                Ev::SilenceCheck {
                    host: h,
                    conn,
                    replica: r,
                    episode,
                },
            );
        }
    }

    /// The world's rule, restated from its own account of the silence.
    pub(super) fn check_silence(&mut self, h: usize, conn: ConnId, r: usize, episode: u64) {
        let rep = &self.reps[r];
        let silent = rep.paused.is_some_and(|(e, _)| e == episode)
            || rep
                .cut
                .is_some_and(|(c, g)| c == Cut::Silent && g == episode);
        if silent && self.hosts[h].link.up() == Some(conn) {
            let what = if rep.paused.is_some() {
                "paused"
            } else {
                "cut off without a close"
            };
            self.fail(format!(
                "liveness: host {} is still on replica {} ({what}) {SILENT_LEADER_LEFT_WITHIN} \
                 after it went silent; a host must leave a silent directory within \
                 {SILENT_LEADER_LEFT_WITHIN}",
                h + 1,
                r + 1
            ));
        }
    }
}

/// Where replica slot `r` (0-based) takes hosts, as a host's `--directory` list names it.
pub(super) fn replica_hosts(r: usize) -> String {
    format!("replica-{}:7801", r + 1)
}

/// Host `h`'s listen address: its identity at the directory.
fn host_listen(h: usize) -> String {
    format!("repl-host-{}:7000", h + 1)
}

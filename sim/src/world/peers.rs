//! Connections between hosts, run by core's [`PeerLinks`] as `dataplane-node` runs them: the
//! first frame for another host opens a connection to it and waits, with the ones after it,
//! in a bounded backlog until the handshake's proof went out; the other host admits the
//! connection through its peer listener. Handshake frames travel the simulated connection
//! (ordered, lossless, broken by a crash or a partition); the envelopes a link lets go travel
//! the faulty network as before.
//!
//! A host learns where another host listens by asking the directory (`Link::WhereIs`; core's
//! [`PeerBook`](dataplane_core::conns::PeerBook) on the host, `DirectoryConns` answering), as
//! `dataplane-node` does: the frame that needed the address waits in the book until the
//! answer comes, a bounded number for a bounded time.
//!
//! Checked (restated, never asked of `PeerLinks` or the book): no envelope leaves on a
//! connection before its proof did, a host keeps at most one outgoing connection per other
//! host, the directory names the address each host says hello with (and knows every host it
//! durably admitted), and a host connects only to that address.

use dataplane_core::conns::{
    ASK_AGAIN, ASK_WAIT, Accepts, ConnAction, ConnId, Listener, PEER_BACKLOG_MAX, Parked,
    PeerHeard, PeerLinks, Routed,
};
use dataplane_core::link::Link;

use super::conns::{SIM_ADMISSION_DEADLINE, SimConn};
use super::*;

/// A host's waiting room for other hosts' connections in the simulation.
const SIM_PEERS_PENDING_MAX: usize = 16;

impl World {
    /// The peer links of `host`'s running process.
    pub(super) fn start_peers(&mut self, host: usize) {
        let h = &self.hosts[host];
        let key = Some(self.cluster_key);
        let listener = Listener::new(
            key,
            Accepts::Peers,
            SIM_ADMISSION_DEADLINE,
            SIM_PEERS_PENDING_MAX,
            64,
        );
        self.peers[host] = Some(PeerLinks::new(h.node, h.incarnation, key, listener));
        self.peer_ticks[host] = None;
    }

    /// `host`'s process is gone: the other ends of its connections learn it.
    pub(super) fn stop_peers(&mut self, host: usize) {
        if self.peers[host].take().is_none() {
            return;
        }
        let held: Vec<(ConnId, bool)> = self
            .conns
            .iter()
            .filter_map(|(&conn, c)| match c.acceptor {
                Some(to) if to == host => Some((conn, true)),
                Some(_) if c.host == host => Some((conn, false)),
                _ => None,
            })
            .collect();
        for (conn, by_acceptor) in held {
            self.close_conn(conn, by_acceptor);
        }
    }

    /// A frame from host `from` to host `to`: `Some` if it may go on the network now; `None`
    /// if its link holds it (waiting for the handshake), dropped it, or is opening.
    pub(super) fn peer_gate(
        &mut self,
        from: usize,
        to: usize,
        envelope: Envelope,
    ) -> Option<Envelope> {
        let node = self.hosts[to].node;
        let now = self.host_now(from);
        let links = self.peers[from].as_mut()?;
        let mut actions = Vec::new();
        match links.route(now, node, Link::Frame(envelope), &mut actions) {
            Ok(Routed::Sent) => {
                // The connection is in use: pinged until it rests again.
                self.arm_peers(from);
                let Some(ConnAction::Send(conn, Link::Frame(envelope))) = actions.pop() else {
                    self.checker.fail(
                        self.now,
                        "peers: a sent frame came back as something else".into(),
                    );
                    return None;
                };
                self.check_proved(conn);
                self.peer_conn_used(from, conn);
                Some(envelope)
            }
            Ok(Routed::Queued) => {
                self.checker.coverage.hit("peers.frame_waited");
                if let Some(conn) = self.outgoing_conn(from, to)
                    && let Some(c) = self.conns.get_mut(&conn)
                {
                    c.queued += 1;
                }
                None
            }
            Ok(Routed::Dropped) => {
                self.checker.coverage.hit("peers.frame_dropped");
                // Restated: a frame is dropped only when its connection's backlog is full.
                let full = self
                    .outgoing_conn(from, to)
                    .and_then(|conn| self.conns.get(&conn))
                    .is_some_and(|c| c.queued >= PEER_BACKLOG_MAX);
                if !full {
                    self.checker.fail(
                        self.now,
                        format!(
                            "peers: host {} dropped a frame for host {} with no connection \
                             whose backlog is full",
                            self.hosts[from].node, self.hosts[to].node
                        ),
                    );
                }
                None
            }
            Err(Link::Frame(envelope)) => {
                // No connection yet: open one (the frame waits for its handshake), or ask
                // where the other host listens first.
                self.connect_or_ask(from, to, envelope);
                None
            }
            Err(_) => None,
        }
    }

    /// `from` has no connection to `to`: it opens one if its book knows where `to` listens;
    /// else the frame waits in the book, and the directory is asked.
    fn connect_or_ask(&mut self, from: usize, to: usize, envelope: Envelope) {
        let node = self.hosts[to].node;
        let now = self.host_now(from);
        let Some(hl) = self.links[from].as_mut() else {
            return;
        };
        if let Some(listen) = hl.book.listen(node) {
            // Restated: only to the address that host says hello with.
            if listen != host_listen(node) {
                let listen = listen.to_owned();
                self.checker.fail(
                    self.now,
                    format!(
                        "peers: host {} connects to node {node} at {listen:?}, not at {:?}",
                        self.hosts[from].node,
                        host_listen(node)
                    ),
                );
                return;
            }
            self.open_peer_conn(from, to, envelope);
            return;
        }
        let up = hl.link.up();
        // The world's own account of the question: open from the first frame that waits for
        // `node`'s address (`ask_where`).
        self.questions.entry((from, node)).or_insert(Question {
            since: now,
            asked: None,
        });
        match hl.book.park(now, node, Link::Frame(envelope), up.is_some()) {
            Parked::Ask => {
                self.checker.coverage.hit("peers.asked_where");
                if let Some(conn) = up {
                    self.ask_where(from, conn, node);
                }
            }
            Parked::Waiting => self.checker.coverage.hit("peers.waited_for_address"),
            Parked::Dropped => self.checker.coverage.hit("peers.address_wait_full"),
        }
        self.arm_book(from);
    }

    /// Paced where-is questions (issue 52), from the world's own account of each question
    /// (opened by the first frame that waits for `node`'s address, closed by an answer about
    /// `node` or once its frames waited `ASK_WAIT`): on one connection to the directory, a
    /// host asks about an open question again no sooner than `ASK_AGAIN` (on its clock)
    /// after it last asked. A new connection asks afresh: questions may have been lost with
    /// the old one.
    fn ask_where(&mut self, host: usize, conn: ConnId, node: NodeId) {
        let now = self.host_now(host);
        let question = self.questions.entry((host, node)).or_insert(Question {
            since: now,
            asked: None,
        });
        if let Some((last_conn, last)) = question.asked.replace((conn, now))
            && last_conn == conn
        {
            let since = now.saturating_since(last);
            if since < ASK_AGAIN {
                self.checker.fail(
                    self.now,
                    format!(
                        "pacing: host {} asked the directory where node {node} listens again \
                         {since} after the last time on connection {conn}, before {ASK_AGAIN}",
                        self.hosts[host].node
                    ),
                );
            } else {
                self.checker.coverage.hit("peers.asked_where_paced");
            }
        }
        self.send_conn(conn, true, &Link::WhereIs(node));
    }

    /// The directory answered `host`'s question about `node`.
    pub(super) fn located(&mut self, host: usize, node: NodeId, listen: Option<String>) {
        self.questions.remove(&(host, node));
        let to = self.host_index(node);
        // Restated from the world's own account: every host the directory durably admitted is
        // known to it, at the address that host says hello with; no other node id is.
        let admitted = to.is_some_and(|to| self.directory.admitted[to].is_some());
        let right = match (&listen, to) {
            (Some(listen), Some(_)) => *listen == host_listen(node),
            (None, _) => !admitted,
            (Some(_), None) => false,
        };
        if !right {
            self.checker.fail(
                self.now,
                format!(
                    "peers: the directory told host {} that node {node} listens at {listen:?}                      (durably admitted: {admitted})",
                    self.hosts[host].node
                ),
            );
            return;
        }
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        let Ok(frames) = hl.book.located(node, listen) else {
            self.checker.coverage.hit("peers.located_nobody");
            return;
        };
        self.checker.coverage.hit("peers.located");
        let Some(to) = to else {
            return;
        };
        for frame in frames {
            if let Link::Frame(envelope) = frame
                && let Some(Envelope { from, to, message }) = self.peer_gate(host, to, envelope)
            {
                self.send_net(from, to, message);
            }
        }
        self.check_book(host);
    }

    /// Schedules `host`'s next `BookTick` if frames wait in its book.
    fn arm_book(&mut self, host: usize) {
        let now = self.host_now(host);
        let Some(hl) = self.links[host].as_mut() else {
            return;
        };
        let Some(deadline) = hl.book.next_deadline() else {
            return;
        };
        let at = deadline.min(now.saturating_add(ASK_AGAIN));
        if hl.book_tick.is_some_and(|armed| armed <= at) {
            return;
        }
        hl.book_tick = Some(at);
        let nonce = hl.boot_nonce;
        let at = self.host_at(host, at);
        self.schedule(at, EventKind::BookTick { host, nonce });
    }

    /// `host`'s book drops the frames that waited too long and asks again what is due (also
    /// right after a welcome).
    pub(super) fn book_tick(&mut self, host: usize, nonce: u64) {
        let now = self.host_now(host);
        let Some(hl) = self.links[host]
            .as_mut()
            .filter(|hl| hl.boot_nonce == nonce)
        else {
            return;
        };
        if hl.book_tick.is_some_and(|at| at <= now) {
            hl.book_tick = None;
        }
        if hl.book.expire(now) > 0 {
            self.checker.coverage.hit("peers.address_wait_expired");
        }
        // Questions whose frames waited `ASK_WAIT` are over (the book drops their frames at
        // this tick): a question about that node from now on is a new one.
        self.questions
            .retain(|&(h, _), q| h != host || now.saturating_since(q.since) < ASK_WAIT);
        let asks = match hl.link.up() {
            Some(conn) => hl
                .book
                .to_ask(now)
                .into_iter()
                .map(|node| (conn, node))
                .collect(),
            None => Vec::new(),
        };
        for (conn, node) in asks {
            self.checker.coverage.hit("peers.asked_again");
            self.ask_where(host, conn, node);
        }
        self.check_book(host);
        self.arm_book(host);
    }

    /// Core's own account of the book's bounds.
    fn check_book(&mut self, host: usize) {
        if let Some(Err(e)) = self.links[host]
            .as_ref()
            .map(|hl| hl.book.check_invariants())
        {
            self.checker.fail(
                self.now,
                format!("peers: host {}'s book: {e}", self.hosts[host].node),
            );
        }
    }

    /// `from`'s outgoing connection to `to` that its links still know, if any.
    pub(super) fn outgoing_conn(&self, from: usize, to: usize) -> Option<ConnId> {
        let node = self.hosts[to].node;
        let links = self.peers[from].as_ref()?;
        self.conns
            .iter()
            .find(|&(&conn, c)| {
                c.host == from && c.acceptor == Some(to) && links.outgoing_node(conn) == Some(node)
            })
            .map(|(&conn, _)| conn)
    }

    /// Opens `from`'s connection to `to`, with `first` waiting for its handshake.
    pub(super) fn open_peer_conn(&mut self, from: usize, to: usize, first: Envelope) {
        let conn = self.next_conn;
        self.next_conn += 1;
        let node = self.hosts[to].node;
        let now = self.host_now(from);
        let Some(links) = self.peers[from].as_mut() else {
            return;
        };
        links.connecting(now, node, conn, Link::Frame(first));
        self.conns.insert(
            conn,
            SimConn {
                queued: 1,
                ..SimConn::new(from, self.hosts[from].boot_nonce, Some(to), None, self.now)
            },
        );
        self.open_outgoing_checked(from, to);
        self.arm_peers(from);
        self.checker.coverage.hit("peers.connected");
        let delay = self.conn_latency();
        self.schedule_in(delay, EventKind::ConnOpen { conn });
    }

    /// Restated: a host keeps at most one outgoing connection to each other host.
    fn open_outgoing_checked(&mut self, from: usize, to: usize) {
        let open = self
            .conns
            .values()
            .filter(|c| c.host == from && c.acceptor == Some(to) && !c.closing)
            .count();
        if open > 1 {
            self.checker.fail(
                self.now,
                format!(
                    "peers: host {} holds {open} connections to host {}",
                    self.hosts[from].node, self.hosts[to].node
                ),
            );
        }
    }

    /// The connection reaches the other host (or fails: it is down, or a partition).
    pub(super) fn peer_open(&mut self, conn: ConnId, from: usize, to: usize) {
        let (a, b) = (self.hosts[from].node, self.hosts[to].node);
        let reachable = self.peers[to].is_some() && self.link_up(a, b) && self.link_up(b, a);
        if self.peers[from].is_none() {
            self.conns.remove(&conn);
            return;
        }
        if !reachable {
            self.conns.remove(&conn);
            self.peer_learns_closed(from, conn);
            if self.peers[to].is_none() && self.link_up(a, b) && self.link_up(b, a) {
                // Nothing listens there (the process is down, the machine is up): refused.
                self.peer_refused(from, to);
            }
            return;
        }
        let nonce = self.nonce();
        let now = self.host_now(to);
        let mut actions = Vec::new();
        if let Some(links) = self.peers[to].as_mut() {
            links.accepted(now, conn, nonce, &mut actions);
        }
        self.peer_actions(to, actions);
        self.arm_peers(to);
        let nonce = self.nonce();
        let mut actions = Vec::new();
        if let Some(links) = self.peers[from].as_mut() {
            links.connected(conn, nonce, &mut actions);
        }
        self.peer_actions(from, actions);
        self.arm_peers(from);
    }

    /// `from`'s connection to `to` was refused. Checked, restated from the transfers in
    /// flight before and after: every read filling from a source on `to` fails now, and no
    /// other read does.
    fn peer_refused(&mut self, from: usize, to: usize) {
        let node = self.hosts[to].node;
        let filling = |world: &World| -> Vec<(u64, NodeId)> {
            world.hosts[from]
                .machine
                .as_ref()
                .map(|m| {
                    m.bindings()
                        .filter_map(|(&actor, b)| match &b.phase {
                            dataplane_core::host::Phase::Filling(t) => Some((actor, t.source.node)),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = filling(self);
        self.checker.coverage.hit("peers.refused");
        self.machine_input(from, MachineInput::PeerRefused(node));
        let after = filling(self);
        for (actor, source) in before {
            let still = after.iter().any(|&(a, _)| a == actor);
            if source == node && still {
                self.checker.fail(
                    self.now,
                    format!(
                        "peers: host {}'s read {actor} still waits for chunks from host {node}, \
                         which refused the connection",
                        self.hosts[from].node
                    ),
                );
            } else if source != node && !still {
                self.checker.fail(
                    self.now,
                    format!(
                        "peers: host {}'s read {actor} from host {source} ended when host {node} \
                         refused a connection",
                        self.hosts[from].node
                    ),
                );
            } else if source == node {
                self.checker.coverage.hit("peers.refused_read_failed");
            }
        }
    }

    /// A handshake frame between two hosts arrives.
    pub(super) fn peer_conn_frame(
        &mut self,
        conn: ConnId,
        from: usize,
        to: usize,
        to_acceptor: bool,
        bytes: &[u8],
    ) {
        let (a, b) = (self.hosts[from].node, self.hosts[to].node);
        if !self.link_up(a, b) || !self.link_up(b, a) {
            self.checker.coverage.hit("peers.broken_by_partition");
            self.break_conn(conn);
            return;
        }
        let at = if to_acceptor { to } else { from };
        let now = self.host_now(at);
        let mut actions = Vec::new();
        let heard = match self.peers[at].as_mut() {
            Some(links) => links.frame(now, conn, bytes, &mut actions),
            None => return,
        };
        self.peer_actions(at, actions);
        self.arm_peers(at);
        match heard {
            PeerHeard::Nothing => {}
            PeerHeard::Admitted { node, .. } if node == a && to_acceptor => {
                self.checker.coverage.hit("peers.admitted");
            }
            other => self.checker.fail(
                self.now,
                format!(
                    "peers: host {} heard {other:?} on the handshake of {a} -> {b}",
                    self.hosts[at].node
                ),
            ),
        }
    }

    /// `host` learns that `conn` closed. An outgoing one's address is forgotten, as
    /// `dataplane-node` forgets it: the next frame asks the directory again.
    pub(super) fn peer_learns_closed(&mut self, host: usize, conn: ConnId) {
        if let Some(links) = self.peers[host].as_mut() {
            if let Some(node) = links.outgoing_node(conn)
                && let Some(hl) = self.links[host].as_mut()
            {
                hl.book.forget(node);
            }
            links.closed(conn);
            self.arm_peers(host);
        }
    }

    /// Does what `host`'s peer links asked.
    fn peer_actions(&mut self, host: usize, actions: Vec<ConnAction>) {
        for action in actions {
            match action {
                ConnAction::Send(conn, Link::Frame(envelope)) => {
                    // A frame the handshake held: it goes on the network now.
                    self.check_proved(conn);
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.queued = c.queued.saturating_sub(1);
                    }
                    let Envelope { from, to, message } = envelope;
                    self.send_net(from, to, message);
                }
                ConnAction::Send(conn, link) => {
                    let to_acceptor = self.conns.get(&conn).is_some_and(|c| c.host == host);
                    if let (true, Link::Proof { .. }) = (to_acceptor, &link)
                        && let Some(c) = self.conns.get_mut(&conn)
                    {
                        c.proved = true;
                    }
                    self.send_conn(conn, to_acceptor, &link);
                }
                ConnAction::Resume(_) | ConnAction::Admitted(_) => {}
                ConnAction::Refuse { conn, .. } | ConnAction::Close(conn, _) => {
                    let by_acceptor = self.conns.get(&conn).is_some_and(|c| c.host != host);
                    self.close_conn(conn, by_acceptor);
                }
                other => self.checker.fail(
                    self.now,
                    format!(
                        "peers: host {}'s links asked for {other:?}",
                        self.hosts[host].node
                    ),
                ),
            }
        }
    }

    /// Schedules `host`'s next `PeerTick` at its links' next deadline (a ping, a silence, a
    /// handshake's end), unless one is due by then. A deadline already past is due now, as
    /// `dataplane-node`'s loop takes it: it polls with a zero wait.
    pub(super) fn arm_peers(&mut self, host: usize) {
        let now = self.host_now(host);
        let Some(at) = self.peers[host]
            .as_ref()
            .and_then(PeerLinks::next_deadline)
            .map(|at| at.max(now))
        else {
            return;
        };
        if self.peer_ticks[host].is_some_and(|armed| armed >= now && armed <= at) {
            return;
        }
        self.peer_ticks[host] = Some(at);
        let nonce = self.hosts[host].boot_nonce;
        let at = self.host_at(host, at);
        self.schedule(at, EventKind::PeerTick { host, nonce });
    }

    /// `host`'s peer links' deadline: pings go out, silent and late connections close.
    pub(super) fn peer_tick(&mut self, host: usize, nonce: u64) {
        if self.hosts[host].boot_nonce != nonce {
            return;
        }
        let now = self.host_now(host);
        if self.peer_ticks[host].is_some_and(|armed| armed <= now) {
            self.peer_ticks[host] = None;
        }
        let mut actions = Vec::new();
        let Some(links) = self.peers[host].as_mut() else {
            return;
        };
        let silent = links.expire(now, &mut actions);
        // Restated: what fell due is done, or moved on. A deadline still due after its
        // expiry would keep `dataplane-node`'s loop polling without a wait.
        if let Some(due) = links.next_deadline().filter(|&at| at <= now) {
            let node = self.hosts[host].node;
            self.checker.fail(
                self.now,
                format!(
                    "peers: host {node}'s peer links still have a deadline due at {due} after                      they expired at {now}"
                ),
            );
            return;
        }
        for node in silent {
            self.checker.coverage.hit("peers.left_silent_host");
            // Its address may be stale: asked again before the next connection.
            if let Some(hl) = self.links[host].as_mut() {
                hl.book.forget(node);
            }
        }
        if actions
            .iter()
            .any(|a| matches!(a, ConnAction::Send(_, Link::Ping { .. })))
        {
            self.checker.coverage.hit("peers.pinged");
        }
        self.peer_actions(host, actions);
        self.arm_peers(host);
    }

    /// Restated: an envelope leaves on a connection only after the connector's proof.
    fn check_proved(&mut self, conn: ConnId) {
        if self.conns.get(&conn).is_some_and(|c| !c.proved) {
            self.checker.fail(
                self.now,
                format!("peers: a frame left on connection {conn} before its handshake's proof"),
            );
        }
    }
}

/// A host's question to the directory about where a node listens, as the world accounts for
/// it (`World::ask_where`).
#[derive(Debug)]
pub(super) struct Question {
    /// When the first frame that waits for the answer came (on the host's clock).
    since: Instant,
    /// The connection it was last asked on, and when.
    asked: Option<(ConnId, Instant)>,
}

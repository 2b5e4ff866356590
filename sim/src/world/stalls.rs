//! Silent stalls (issue 52): the world as unkind as a real network and a real scheduler. A
//! connection between a host and the directory may stay open and deliver nothing, in one
//! direction or both, for longer than every timeout (a partition that drops without closing:
//! TCP holds the bytes and delivers them, in order, once it heals); the directory's process may
//! be paused (SIGSTOP, a VM frozen by its hypervisor, a long GC-like stall): what it is sent
//! waits in its sockets, its connections stay open, its clock runs on, and it takes everything
//! in order when it resumes. Neither ever closes a connection, so nothing but a host's own
//! liveness rule gets it off a silent directory. A host's process may be paused the same way,
//! with its children (`host_pauses`): then the directory's own liveness rule must let go of
//! it, and the hosts that send to it must give their connections to it up.
//!
//! Checked against the world's own account (when it made a connection silent, never what the
//! link says about itself): a host whose link is still up on a connection that has delivered
//! nothing for [`SILENT_DIRECTORY_LEFT_WITHIN`] fails the seed, and so does a directory that
//! holds a host's connection that carried nothing to it for its host-silence bound, or lets one
//! go sooner (from the world's record of the last frame the directory took on it).
//!
//! Every draw comes from the `stalls` stream, so seeds without stalls or host pauses draw
//! nothing new.

use super::*;
use crate::world::conns::SIM_HOST_SILENCE;
use crate::world::conns::SimConn;

/// How long a host may stay on a directory connection that delivers nothing to it (the
/// directory paused, or the connection stalled either way: its pings go unanswered). The
/// promise ARCHITECTURE.md makes: a host leaves a directory that answered nothing for 1 s
/// (core's default link silence), on its own clock, which may run 5 % slow; 300 ms more for
/// that and the last answer's round trip.
pub const SILENT_DIRECTORY_LEFT_WITHIN: Duration = Duration::from_millis(1_300);

/// A connection made silent: from when, until when, which ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnStall {
    /// The stall (each has its own number).
    pub episode: u64,
    /// Nothing the accepting side (the directory, or the host connected to) sends on it
    /// reaches the host that connected until `until`.
    pub to_connector: bool,
    /// Nothing the host that connected sends on it reaches the accepting side until `until`.
    pub to_acceptor: bool,
    /// When TCP delivers again what it held.
    pub until: Instant,
    /// For a connection between hosts: when the host that made it first sent a frame on it
    /// during the stall (from then on, it must give it up within the bound).
    pub used_at: Option<Instant>,
}

impl ConnStall {
    /// When a frame sent now the given way arrives at the earliest (`None`: not held).
    pub fn holds(&self, now: Instant, to_acceptor: bool) -> Option<Instant> {
        let held = if to_acceptor {
            self.to_acceptor
        } else {
            self.to_connector
        };
        (held && self.until > now).then_some(self.until)
    }
}

impl World {
    /// Schedules the next stall (from the stalls stream).
    pub(super) fn schedule_next_stall(&mut self) {
        self.schedule_from_stalls(self.options.stalls, EventKind::StallStart);
    }

    /// Schedules `kind` after an exponential delay of `fault`'s mean (drawn from the stalls
    /// stream), if that falls before the heal; nothing is drawn when `fault` is off.
    fn schedule_from_stalls(&mut self, fault: Option<Recurring>, kind: EventKind) {
        let Some(fault) = fault else {
            return;
        };
        let delay =
            Duration::from_nanos(self.stall_rng.exponential(fault.mean_interval.as_nanos()));
        if self.now.saturating_add(delay) < self.heal_at {
            self.schedule_in(delay, kind);
        }
    }

    /// A stall starts: the directory pauses (a third of the time), one host's admitted
    /// connection to the directory stalls one way or both (a third), or a connection between
    /// two hosts does (a third).
    pub(super) fn start_stall(&mut self) {
        let max = self
            .options
            .stalls
            .map_or(Duration::ZERO, |f| f.max_duration);
        let length = uniform(&mut self.stall_rng, max).max(Duration::from_millis(1));
        self.stall_episodes += 1;
        let episode = self.stall_episodes;
        let until = self.now.saturating_add(length);
        match self.stall_rng.below(3) {
            0 => {
                if self.directory.machine.is_some() && self.directory.paused.is_none() {
                    self.pause_directory(episode, until);
                }
            }
            kind => {
                let between_hosts = kind == 2;
                let open: Vec<(usize, ConnId)> = self
                    .conns
                    .iter()
                    .filter(|&(&conn, c)| {
                        !c.closing
                            && c.stall.is_none()
                            && c.stranger.is_none()
                            && if between_hosts {
                                c.proved && c.acceptor.is_some()
                            } else {
                                c.acceptor.is_none()
                                    && self.links[c.host]
                                        .as_ref()
                                        .is_some_and(|hl| hl.link.up() == Some(conn))
                            }
                    })
                    .map(|(&conn, c)| (c.host, conn))
                    .collect();
                if !open.is_empty() {
                    let (host, conn) = *self.stall_rng.pick(&open);
                    self.stall_conn(host, conn, episode, until, between_hosts);
                }
            }
        }
        self.schedule_next_stall();
    }

    /// `conn`, made by `host`, stalls until `until`: one way or both.
    fn stall_conn(
        &mut self,
        host: usize,
        conn: ConnId,
        episode: u64,
        until: Instant,
        between_hosts: bool,
    ) {
        let (to_connector, to_acceptor) = match self.stall_rng.below(3) {
            0 => (true, false),
            1 => (false, true),
            _ => (true, true),
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.stall = Some(ConnStall {
                episode,
                to_connector,
                to_acceptor,
                until,
                used_at: None,
            });
        }
        let length = until.saturating_since(self.now);
        let node = self.hosts[host].node;
        self.trace.note(self.now, "fault", || {
            format!(
                "stall: connection {conn} of {node} delivers nothing{}{} for {length}",
                if to_connector { " back to it" } else { "" },
                if to_acceptor { " from it" } else { "" },
            )
        });
        if between_hosts {
            self.checker.coverage.hit("fault.peer_conn_stalled");
        } else {
            self.checker.coverage.hit("fault.conn_stalled");
            self.schedule_silence_check(host, conn, episode);
            if to_acceptor {
                self.schedule_directory_silence_check(conn);
            }
        }
        self.schedule(until, EventKind::StallEnd { episode });
    }

    /// The extra latency of this fsync, if the seed's disk is slow and this one is (fault phase
    /// only; drawn from the stalls stream).
    pub(super) fn slow_sync(&mut self) -> Option<Duration> {
        let slow = self.options.disk.slow_sync?;
        if self.phase != Phase::Faulty || !permille(&mut self.stall_rng, slow.per_mille) {
            return None;
        }
        self.checker.coverage.hit("fault.slow_sync");
        Some(uniform(&mut self.stall_rng, slow.max))
    }

    /// The directory's loop waits in a slow fsync until `until`: what it is sent waits, as in
    /// a pause (but nothing is silent for longer than the slowest fsync).
    pub(super) fn block_directory(&mut self, until: Instant) {
        if self.directory.paused.is_some() {
            return;
        }
        self.stall_episodes += 1;
        let episode = self.stall_episodes;
        self.directory.paused = Some(episode);
        let length = until.saturating_since(self.now);
        self.trace.note(self.now, "fault", || {
            format!("slow fsync: the directory waits {length} in it")
        });
        self.schedule(until, EventKind::StallEnd { episode });
    }

    /// The directory's process stops until `until` (or until it is killed).
    fn pause_directory(&mut self, episode: u64, until: Instant) {
        self.directory.paused = Some(episode);
        self.checker.coverage.hit("fault.directory_paused");
        let length = until.saturating_since(self.now);
        self.trace.note(self.now, "fault", || {
            format!("stall: the directory's process is paused for {length}")
        });
        let boot = self.directory.boot;
        let held: Vec<(usize, ConnId)> = (0..self.hosts.len())
            .filter_map(|h| {
                let conn = self.links[h].as_ref()?.link.up()?;
                self.conns
                    .get(&conn)
                    .is_some_and(|c| c.boot == boot && !c.closing)
                    .then_some((h, conn))
            })
            .collect();
        for (host, conn) in held {
            self.schedule_silence_check(host, conn, episode);
        }
        self.schedule(until, EventKind::StallEnd { episode });
    }

    fn schedule_silence_check(&mut self, host: usize, conn: ConnId, episode: u64) {
        self.schedule_in(
            SILENT_DIRECTORY_LEFT_WITHIN,
            EventKind::SilenceCheck {
                host,
                conn,
                episode,
            },
        );
    }

    /// A stall ends: a paused directory resumes and takes what waited, in order; a stalled
    /// connection delivers again (what it held arrives now: it was scheduled for this instant).
    pub(super) fn end_stall(&mut self, episode: u64) {
        if self.directory.paused == Some(episode) {
            self.resume_directory();
            return;
        }
        for c in self.conns.values_mut() {
            if c.stall.is_some_and(|s| s.episode == episode) {
                c.stall = None;
            }
        }
    }

    /// The paused directory runs again (its time is up, it is killed, or the run heals):
    /// everything it was sent meanwhile is handed to it in the order it arrived.
    pub(super) fn resume_directory(&mut self) {
        if self.directory.paused.take().is_none() {
            return;
        }
        for kind in std::mem::take(&mut self.directory.deferred) {
            self.schedule(self.now, kind);
        }
    }

    /// Whether `kind` is an input of the directory's process (which waits while it is
    /// paused): a frame or a connection event it is sent, its timers, its fsyncs' completion,
    /// a route report.
    pub(super) fn for_directory_process(&self, kind: &EventKind) -> bool {
        let dir_conn = |conn: &ConnId| self.conns.get(conn).is_none_or(|c| c.acceptor.is_none());
        match kind {
            EventKind::Deliver(e) => e.to.node == DIRECTORY_NODE,
            EventKind::DirTimer { .. }
            | EventKind::DirSync { .. }
            | EventKind::DirRoute { .. }
            | EventKind::DirConnsExpire { .. } => true,
            EventKind::ConnOpen { conn } => dir_conn(conn),
            EventKind::ConnFrame {
                conn, to_acceptor, ..
            }
            | EventKind::ConnClosed { conn, to_acceptor } => *to_acceptor && dir_conn(conn),
            _ => false,
        }
    }

    /// The world's rule: a host is off a connection that has delivered nothing to it for
    /// [`SILENT_DIRECTORY_LEFT_WITHIN`], if the silence still lasts (to the directory: from
    /// the silence's start; to another host: from the first frame it sent on it since).
    pub(super) fn check_silence(&mut self, host: usize, conn: ConnId, episode: u64) {
        let stall = self.conns.get(&conn).and_then(|c| c.stall);
        let acceptor_paused = self
            .conns
            .get(&conn)
            .and_then(|c| c.acceptor)
            .and_then(|a| self.host_pauses[a].as_ref())
            .is_some_and(|p| p.episode == episode);
        let still_silent = self.directory.paused == Some(episode)
            || acceptor_paused
            || stall.is_some_and(|s| s.episode == episode && s.until > self.now);
        if !still_silent {
            return;
        }
        if let Some(pause) = &self.host_pauses[host] {
            // Paused itself, it can give nothing up: the bound runs from when it resumes.
            let at = pause.until.saturating_add(SILENT_DIRECTORY_LEFT_WITHIN);
            self.schedule(
                at,
                EventKind::SilenceCheck {
                    host,
                    conn,
                    episode,
                },
            );
            return;
        }
        let node = self.hosts[host].node;
        if let Some(to) = self.conns.get(&conn).and_then(|c| c.acceptor) {
            let open = self.peers[host]
                .as_ref()
                .is_some_and(|links| links.outgoing_node(conn).is_some());
            if !open && acceptor_paused {
                self.checker.coverage.hit("peers.left_paused_host");
            }
            if open {
                let other = self.hosts[to].node;
                self.checker.fail(
                    self.now,
                    format!(
                        "liveness: host {node} still sends to host {other} on connection {conn} \
                         {SILENT_DIRECTORY_LEFT_WITHIN} after it first did so while the \
                         connection delivered nothing; a host must give a silent connection up \
                         within {SILENT_DIRECTORY_LEFT_WITHIN} of using it"
                    ),
                );
            }
            return;
        }
        let on_it = self.links[host]
            .as_ref()
            .is_some_and(|hl| hl.link.up() == Some(conn));
        if on_it {
            let what = if self.directory.paused == Some(episode) {
                "the directory's process is paused"
            } else {
                "its connection delivers nothing"
            };
            self.checker.fail(
                self.now,
                format!(
                    "liveness: host {node} is still on directory connection {conn} \
                     {SILENT_DIRECTORY_LEFT_WITHIN} after it went silent ({what}); a host must \
                     leave a silent directory within {SILENT_DIRECTORY_LEFT_WITHIN}"
                ),
            );
        }
    }

    /// A host sends a frame on its connection to another host: if a stall holds it, the first
    /// such frame starts the host's bound for giving the connection up.
    pub(super) fn peer_conn_used(&mut self, host: usize, conn: ConnId) {
        // A host paused at the other end answers nothing either.
        if let Some(a) = self.conns.get(&conn).and_then(|c| c.acceptor)
            && let Some(pause) = self.host_pauses[a].as_mut()
            && pause.until > self.now
            && pause.used.insert(conn)
        {
            let episode = pause.episode;
            self.schedule_silence_check(host, conn, episode);
        }
        let Some(stall) = self.conns.get_mut(&conn).and_then(|c| c.stall.as_mut()) else {
            return;
        };
        if stall.used_at.is_some() || stall.until <= self.now {
            return;
        }
        stall.used_at = Some(self.now);
        let episode = stall.episode;
        self.schedule_silence_check(host, conn, episode);
    }

    /// When a frame sent now on `conn` the given way arrives at the earliest, if a stall holds
    /// it.
    pub(super) fn stall_holds(&self, conn: ConnId, to_directory: bool) -> Option<Instant> {
        self.conns
            .get(&conn)
            .and_then(|c: &SimConn| c.stall)
            .and_then(|s| s.holds(self.now, to_directory))
    }

    /// The connection an envelope travels on, and whether it goes to the accepting side: a
    /// host sends to the directory on its welcomed link, the directory on the host's admitted
    /// connection, a host to another host on its outgoing connection to it.
    pub(super) fn envelope_conn(&self, from: NodeId, to: NodeId) -> Option<(ConnId, bool)> {
        if to == DIRECTORY_NODE && from != DIRECTORY_NODE {
            let h = self.host_index(from)?;
            Some((self.links[h].as_ref()?.link.up()?, true))
        } else if from == DIRECTORY_NODE && to != DIRECTORY_NODE {
            let conn = self.directory.conns.as_ref()?.conn_of(to)?;
            Some((conn, false))
        } else {
            let (a, b) = (self.host_index(from)?, self.host_index(to)?);
            Some((self.outgoing_conn(a, b)?, true))
        }
    }

    /// Every stall ends at the heal.
    pub(super) fn heal_stalls(&mut self) {
        self.resume_directory();
        for host in 0..self.hosts.len() {
            self.resume_host(host);
        }
        for c in self.conns.values_mut() {
            c.stall = None;
        }
    }
}

/// A paused host process (and its children): what it was sent, its timers and its children's
/// wake-ups wait, in the order they came, until it resumes or is killed.
#[derive(Debug)]
pub(crate) struct HostPause {
    /// The stall episode (numbered with the other stalls).
    pub episode: u64,
    /// When it resumes.
    pub until: Instant,
    /// Its process's inputs, in arrival order.
    pub deferred: Vec<EventKind>,
    /// The connections to it that another host sent a frame on during the pause (from then
    /// on, that host must give the connection up within the bound).
    pub used: BTreeSet<ConnId>,
}

/// How late after the directory's host-silence bound it may still hold a silent host's
/// connection (its expiry runs at the bound; the check runs an instant after, on a clock that
/// may run 5 % slow: that is in `dir_at`).
const DIRECTORY_LETS_GO_SLACK: Duration = Duration::from_millis(10);

impl World {
    /// Schedules the next host pause (from the stalls stream).
    pub(super) fn schedule_next_host_pause(&mut self) {
        self.schedule_from_stalls(self.options.host_pauses, EventKind::HostPauseStart);
    }

    /// A running host's process pauses (SIGSTOP of its process group, a frozen VM).
    pub(super) fn start_host_pause(&mut self) {
        let running: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].up && self.host_pauses[h].is_none())
            .collect();
        let max = self
            .options
            .host_pauses
            .map_or(Duration::ZERO, |f| f.max_duration);
        let length = uniform(&mut self.stall_rng, max).max(Duration::from_millis(1));
        if !running.is_empty() {
            let host = *self.stall_rng.pick(&running);
            self.stall_episodes += 1;
            let episode = self.stall_episodes;
            let until = self.now.saturating_add(length);
            self.host_pauses[host] = Some(HostPause {
                episode,
                until,
                deferred: Vec::new(),
                used: BTreeSet::new(),
            });
            self.checker.coverage.hit("fault.host_paused");
            let node = self.hosts[host].node;
            self.trace.note(self.now, "fault", || {
                format!("stall: host {node}'s process is paused for {length}")
            });
            // The directory must let go of its connection within its silence bound.
            let held: Vec<ConnId> = self
                .conns
                .iter()
                .filter(|(_, c)| c.host == host && c.acceptor.is_none() && c.stranger.is_none())
                .map(|(&conn, _)| conn)
                .collect();
            for conn in held {
                self.schedule_directory_silence_check(conn);
            }
            self.schedule(until, EventKind::HostPauseEnd { host, episode });
        }
        self.schedule_next_host_pause();
    }

    /// `host` runs again (its time is up, or the run heals): what it was sent meanwhile,
    /// its timers and its children's wake-ups are handed to it in the order they came.
    pub(super) fn resume_host(&mut self, host: usize) {
        let Some(pause) = self.host_pauses[host].take() else {
            return;
        };
        self.host_resumed[host] = Some(self.host_now(host));
        for kind in pause.deferred {
            self.schedule(self.now, kind);
        }
    }

    /// The host whose process (or child) takes `kind`, if a host's: a frame or a connection
    /// event it is sent, its timers, its children's wake-ups, its discovery answers.
    pub(super) fn host_process_of(&self, kind: &EventKind) -> Option<usize> {
        let conn_side = |conn: &ConnId, to_acceptor: bool| {
            let c = self.conns.get(conn)?;
            if to_acceptor {
                c.acceptor
            } else {
                Some(c.host)
            }
        };
        match kind {
            EventKind::Deliver(e) => self.host_index(e.to.node),
            EventKind::HostSend { host, .. }
            | EventKind::Local { host, .. }
            | EventKind::ProxyTimer { host, .. }
            | EventKind::Discovery { host, .. }
            | EventKind::ProxyStart { host, .. }
            | EventKind::ClientWake { host, .. }
            | EventKind::HostTick { host, .. }
            | EventKind::WorkerWake { host, .. }
            | EventKind::AgentTick { host, .. }
            | EventKind::LinkRetry { host, .. }
            | EventKind::BookTick { host, .. }
            | EventKind::PeerTick { host, .. } => Some(*host),
            EventKind::ConnOpen { conn } => self.conns.get(conn)?.acceptor,
            EventKind::ConnFrame {
                conn, to_acceptor, ..
            }
            | EventKind::ConnClosed { conn, to_acceptor } => conn_side(conn, *to_acceptor),
            _ => None,
        }
    }

    /// Whether `host`'s process is paused.
    pub(super) fn host_paused(&self, host: usize) -> bool {
        self.host_pauses[host].is_some()
    }

    /// The directory's rule for a connection whose host says nothing (paused, stalled
    /// towards it, or dead without a word): checked once its silence bound has passed.
    pub(super) fn schedule_directory_silence_check(&mut self, conn: ConnId) {
        let Some(heard) = self.conns.get(&conn).and_then(|c| c.dir_heard) else {
            return;
        };
        let due = self.dir_at(heard.saturating_add(SIM_HOST_SILENCE));
        let at = due.max(self.now).saturating_add(DIRECTORY_LETS_GO_SLACK);
        self.schedule(at, EventKind::DirSilenceCheck { conn });
    }

    /// ARCHITECTURE "Connections and admission", restated from the world's own record of
    /// what the directory took on each connection: the directory lets go of a host's
    /// connection that carried nothing for its host-silence bound. While the host still says
    /// nothing (paused, its way stalled, or dead without a word), the check follows the last
    /// frame the directory took.
    pub(super) fn check_directory_let_go(&mut self, conn: ConnId) {
        if self.directory.paused.is_some() {
            // Its expiry waits with its other inputs: ask again once it may have run.
            self.schedule_in(
                Duration::from_millis(100),
                EventKind::DirSilenceCheck { conn },
            );
            return;
        }
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let holds = c.admitted
            && !c.dir_closed
            && c.boot == self.directory.boot
            && self.directory.machine.is_some();
        let Some(heard) = c.dir_heard.filter(|_| holds) else {
            return;
        };
        let quiet = self.dir_now().saturating_since(heard);
        if quiet < SIM_HOST_SILENCE {
            let host_silent = self.host_paused(c.host)
                || c.silent
                || c.stall.is_some_and(|s| s.holds(self.now, true).is_some());
            if host_silent {
                self.schedule_directory_silence_check(conn);
            }
            return;
        }
        let node = self.hosts[c.host].node;
        self.checker.fail(
            self.now,
            format!(
                "liveness: the directory still holds host {node}'s connection {conn}, which has \
                 carried nothing to it for {quiet} (its host-silence bound is \
                 {SIM_HOST_SILENCE})"
            ),
        );
    }

    /// The directory closes `conn` as silent: by the same rule, only once it carried nothing
    /// for the host-silence bound.
    pub(super) fn check_silent_close(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let Some(heard) = c.dir_heard else {
            return;
        };
        let quiet = self.dir_now().saturating_since(heard);
        if self.host_paused(c.host) {
            self.checker
                .coverage
                .hit("conns.directory_let_go_paused_host");
        }
        if quiet < SIM_HOST_SILENCE {
            let node = self.hosts[c.host].node;
            self.checker.fail(
                self.now,
                format!(
                    "conns: the directory let go of host {node}'s connection {conn} as silent \
                     {quiet} after it last took a frame on it (its host-silence bound is \
                     {SIM_HOST_SILENCE})"
                ),
            );
        }
    }
}

//! Silent stalls (issue 52): the world as unkind as a real network and a real scheduler. A
//! connection between a host and the directory may stay open and deliver nothing, in one
//! direction or both, for longer than every timeout (a partition that drops without closing:
//! TCP holds the bytes and delivers them, in order, once it heals); the directory's process may
//! be paused (SIGSTOP, a VM frozen by its hypervisor, a long GC-like stall): what it is sent
//! waits in its sockets, its connections stay open, its clock runs on, and it takes everything
//! in order when it resumes. Neither ever closes a connection, so nothing but a host's own
//! liveness rule gets it off a silent directory.
//!
//! Checked against the world's own account (when it made a connection silent, never what the
//! link says about itself): a host whose link is still up on a connection that has delivered
//! nothing for [`SILENT_DIRECTORY_LEFT_WITHIN`] fails the seed.
//!
//! Every draw comes from the `stalls` stream, so seeds without stalls draw nothing new.

use super::*;
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
    /// Nothing the directory sends on it reaches the host until `until`.
    pub to_host: bool,
    /// Nothing the host sends on it reaches the directory until `until`.
    pub to_directory: bool,
    /// When TCP delivers again what it held.
    pub until: Instant,
}

impl ConnStall {
    /// When a frame sent now the given way arrives at the earliest (`None`: not held).
    pub fn holds(&self, now: Instant, to_directory: bool) -> Option<Instant> {
        let held = if to_directory {
            self.to_directory
        } else {
            self.to_host
        };
        (held && self.until > now).then_some(self.until)
    }
}

impl World {
    /// Schedules the next stall (from the stalls stream).
    pub(super) fn schedule_next_stall(&mut self) {
        let Some(fault) = self.options.stalls else {
            return;
        };
        let delay =
            Duration::from_nanos(self.stall_rng.exponential(fault.mean_interval.as_nanos()));
        if self.now.saturating_add(delay) < self.heal_at {
            self.schedule_in(delay, EventKind::StallStart);
        }
    }

    /// A stall starts: the directory pauses (a third of the time), or one host's admitted
    /// connection stalls one way or both.
    pub(super) fn start_stall(&mut self) {
        let max = self
            .options
            .stalls
            .map_or(Duration::ZERO, |f| f.max_duration);
        let length = uniform(&mut self.stall_rng, max).max(Duration::from_millis(1));
        self.stall_episodes += 1;
        let episode = self.stall_episodes;
        let until = self.now.saturating_add(length);
        if self.stall_rng.below(3) == 0 {
            if self.directory.machine.is_some() && self.directory.paused.is_none() {
                self.pause_directory(episode, until);
            }
        } else {
            let up: Vec<(usize, ConnId)> = (0..self.hosts.len())
                .filter_map(|h| {
                    let conn = self.links[h].as_ref()?.link.up()?;
                    self.conns
                        .get(&conn)
                        .is_some_and(|c| !c.closing && c.stall.is_none())
                        .then_some((h, conn))
                })
                .collect();
            if !up.is_empty() {
                let (host, conn) = *self.stall_rng.pick(&up);
                let (to_host, to_directory) = match self.stall_rng.below(3) {
                    0 => (true, false),
                    1 => (false, true),
                    _ => (true, true),
                };
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.stall = Some(ConnStall {
                        episode,
                        to_host,
                        to_directory,
                        until,
                    });
                }
                self.checker.coverage.hit("fault.conn_stalled");
                let node = self.hosts[host].node;
                self.trace.note(self.now, "fault", || {
                    format!(
                        "stall: connection {conn} of {node} delivers nothing{}{} for {length}",
                        if to_host { " to the host" } else { "" },
                        if to_directory {
                            " to the directory"
                        } else {
                            ""
                        },
                    )
                });
                self.schedule_silence_check(host, conn, episode);
                self.schedule(until, EventKind::StallEnd { episode });
            }
        }
        self.schedule_next_stall();
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
    /// [`SILENT_DIRECTORY_LEFT_WITHIN`], if the silence still lasts.
    pub(super) fn check_silence(&mut self, host: usize, conn: ConnId, episode: u64) {
        let still_silent = self.directory.paused == Some(episode)
            || self
                .conns
                .get(&conn)
                .and_then(|c| c.stall)
                .is_some_and(|s| s.episode == episode && s.until > self.now);
        let on_it = self.links[host]
            .as_ref()
            .is_some_and(|hl| hl.link.up() == Some(conn));
        if still_silent && on_it {
            let node = self.hosts[host].node;
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

    /// When a frame sent now on `conn` the given way arrives at the earliest, if a stall holds
    /// it.
    pub(super) fn stall_holds(&self, conn: ConnId, to_directory: bool) -> Option<Instant> {
        self.conns
            .get(&conn)
            .and_then(|c: &SimConn| c.stall)
            .and_then(|s| s.holds(self.now, to_directory))
    }

    /// The connection an envelope between a host and the directory travels on, and which way:
    /// a host sends on its welcomed link, the directory on the host's admitted connection.
    pub(super) fn envelope_conn(&self, from: NodeId, to: NodeId) -> Option<(ConnId, bool)> {
        if to == DIRECTORY_NODE && from != DIRECTORY_NODE {
            let h = self.host_index(from)?;
            Some((self.links[h].as_ref()?.link.up()?, true))
        } else if from == DIRECTORY_NODE && to != DIRECTORY_NODE {
            let conn = self.directory.conns.as_ref()?.conn_of(to)?;
            Some((conn, false))
        } else {
            None
        }
    }

    /// Every stall ends at the heal.
    pub(super) fn heal_stalls(&mut self) {
        self.resume_directory();
        for c in self.conns.values_mut() {
            c.stall = None;
        }
    }
}

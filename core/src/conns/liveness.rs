//! Liveness of a connection: whether the other end still answers.
//!
//! A TCP connection can stay open and deliver nothing for minutes: the other process is
//! stopped (SIGSTOP, a frozen VM), or a partition drops every segment without resetting the
//! connection. Its kernel keeps acknowledging nothing and the sender's retransmissions take
//! about fifteen minutes to give up. So a node asks: the side that made a connection sends
//! [`Link::Ping`](crate::link::Link::Ping) every `silence / 4`, the other side answers [`Link::Pong`](crate::link::Link::Pong) at once, and a
//! connection none of whose pings sent within the last `silence` was answered is given up
//! ([`Pinger`]). The accepting side of a host's connection to the directory expects those
//! pings in turn and lets go of a host that sent nothing for [`HOST_SILENCE_DEFAULT`].
//!
//! Only a round trip counts: a frame the other side sends on its own (a retirement, a
//! displacement) proves nothing about whether what this side sends still arrives.

use std::collections::VecDeque;

use crate::time::{Duration, Instant};

/// How long a host waits for an answer from the directory (or another host) before it gives
/// the connection up, unless the node sets another: about an election timeout of the
/// replicated directory, so that hosts reach a new leader within two of them.
pub const SILENCE_DEFAULT: Duration = Duration::from_secs(1);
/// The shortest silence bound a node may set (pings every 50 ms).
pub const SILENCE_MIN: Duration = Duration::from_millis(200);
/// The longest silence bound a node may set (pings every 2.5 s).
pub const SILENCE_MAX: Duration = Duration::from_secs(10);
/// Pings sent within one silence bound: one late answer alone never gives a connection up.
pub const PINGS_PER_SILENCE: u64 = 4;
/// How long the directory keeps a host's connection over which the host sent nothing, unless
/// the node sets another: a host pings at least every [`SILENCE_MAX`] / [`PINGS_PER_SILENCE`],
/// so four of those missed mean the host is stopped or cut off.
pub const HOST_SILENCE_DEFAULT: Duration = Duration::from_secs(10);

/// What a [`Pinger`] asks for at a given time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ping {
    /// Nothing is due.
    Nothing,
    /// Send [`Link::Ping`](crate::link::Link::Ping) with this number.
    Send(u64),
    /// No ping sent within the silence bound was answered: give the connection up.
    Silent,
}

/// The pings of one connection this node made (see the module documentation).
///
/// A pinger is either always on ([`Pinger::new`]: a host's link to the directory, which must
/// find a stopped leader even while it has nothing to ask), or on only while the connection
/// carries frames ([`Pinger::while_used`]: a connection to another host, which may sit idle
/// for hours between transfers; pinging every idle one would cost a cluster of N hosts N²
/// pings). Such a connection is *busy* from a frame it carries until a ping sent after its
/// last frame is answered: TCP delivers in order, so that answer proves the frames before it
/// arrived. Busy for the silence bound without such an answer, it is silent.
#[derive(Clone, Debug)]
pub struct Pinger {
    silence: Duration,
    every: Duration,
    next_seq: u64,
    /// When the next ping is due (while busy).
    ping_at: Instant,
    /// The start of what is not known to have arrived: the connection's start, or the send
    /// time of the newest answered ping; for a pinger on while used, the first frame not
    /// followed by an answered ping (`None`: idle, every frame covered).
    since: Option<Instant>,
    /// For a pinger on while used: when the connection last carried a frame.
    used: Option<Instant>,
    /// Pings not answered yet that could still count: (number, when sent), oldest first.
    outstanding: VecDeque<(u64, Instant)>,
}

impl Pinger {
    /// The pings of a connection that was answered at `now` (its handshake just finished),
    /// given up once nothing sent within `silence` is answered.
    pub fn new(now: Instant, silence: Duration) -> Pinger {
        let every = Duration::from_nanos((silence.as_nanos() / PINGS_PER_SILENCE).max(1));
        Pinger {
            silence,
            every,
            next_seq: 1,
            ping_at: now.saturating_add(every),
            since: Some(now),
            used: None,
            outstanding: VecDeque::new(),
        }
    }

    /// Like [`Pinger::new`], but pinging only while the connection is busy (see the type's
    /// documentation); it carried its first frames at `now`.
    pub fn while_used(now: Instant, silence: Duration) -> Pinger {
        Pinger {
            used: Some(now),
            ..Pinger::new(now, silence)
        }
    }

    /// The connection carries a frame at `now` (for a pinger on while used: it is busy from
    /// now if it was idle).
    pub fn used(&mut self, now: Instant) {
        if self.used.is_none() {
            return;
        }
        self.used = Some(now);
        if self.since.is_none() {
            self.since = Some(now);
            self.ping_at = now.saturating_add(self.every);
        }
    }

    /// When [`Pinger::poll`] next has something to do (`None`: idle until used).
    pub fn deadline(&self) -> Option<Instant> {
        let since = self.since?;
        Some(self.ping_at.min(since.saturating_add(self.silence)))
    }

    /// The connection is judged at `now`: silent, or a ping due, or neither (always neither
    /// while idle).
    pub fn poll(&mut self, now: Instant) -> Ping {
        let Some(since) = self.since else {
            return Ping::Nothing;
        };
        if now >= since.saturating_add(self.silence) {
            return Ping::Silent;
        }
        if now < self.ping_at {
            return Ping::Nothing;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        // A ping sent a silence bound ago can no longer make the connection live: forget it.
        while self
            .outstanding
            .front()
            .is_some_and(|&(_, sent)| sent.saturating_add(self.silence) <= now)
        {
            self.outstanding.pop_front();
        }
        if self.outstanding.len() > PINGS_PER_SILENCE as usize {
            self.outstanding.pop_front();
        }
        self.outstanding.push_back((seq, now));
        self.ping_at = now.saturating_add(self.every);
        Ping::Send(seq)
    }

    /// The other side answered ping `seq` (an answer to a ping this side forgot, or never
    /// sent, changes nothing): everything sent before that ping arrived.
    pub fn pong(&mut self, seq: u64) {
        let Some(i) = self.outstanding.iter().position(|&(s, _)| s == seq) else {
            return;
        };
        let sent = self.outstanding[i].1;
        self.outstanding.drain(..=i);
        self.since = self.since.map(|since| since.max(sent));
        if self.used.is_some_and(|used| used <= sent) {
            // Every frame is covered: idle until the next one.
            self.since = None;
            self.outstanding.clear();
        }
    }

    /// The silence bound.
    pub fn silence(&self) -> Duration {
        self.silence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::ZERO.saturating_add(Duration::from_millis(ms))
    }

    fn seq(ping: &Ping) -> u64 {
        match ping {
            Ping::Send(seq) => *seq,
            other => panic!("expected a ping, got {other:?}"),
        }
    }

    #[test]
    fn pings_every_quarter_and_is_silent_a_bound_after_the_last_answered_ping() {
        let mut p = Pinger::new(at(0), Duration::from_millis(1_000));
        assert_eq!(p.deadline(), Some(at(250)));
        assert_eq!(p.poll(at(249)), Ping::Nothing);
        let first = seq(&p.poll(at(250)));
        assert_eq!(p.poll(at(251)), Ping::Nothing, "one ping per period");
        let second = seq(&p.poll(at(500)));
        assert!(second > first);
        p.pong(first);
        // Answered: the ping sent at 250 counts, so the connection is live until 1250.
        assert_eq!(p.deadline(), Some(at(750)));
        seq(&p.poll(at(750)));
        seq(&p.poll(at(1_000)));
        assert_eq!(p.deadline(), Some(at(1_250)));
        assert_eq!(p.poll(at(1_249)), Ping::Nothing);
        assert_eq!(p.poll(at(1_250)), Ping::Silent);
    }

    #[test]
    fn without_any_answer_it_is_silent_a_bound_after_it_started() {
        let mut p = Pinger::new(at(100), Duration::from_millis(1_000));
        let mut sent = 0;
        let mut now = 100;
        loop {
            match p.poll(at(now)) {
                Ping::Send(_) => sent += 1,
                Ping::Silent => break,
                Ping::Nothing => {}
            }
            now = p
                .deadline()
                .unwrap()
                .saturating_since(Instant::ZERO)
                .as_millis();
        }
        assert_eq!(now, 1_100);
        assert_eq!(sent, 3, "pings at 350, 600 and 850; at 1100 it is silent");
    }

    #[test]
    fn an_answer_counts_from_when_its_ping_was_sent_and_only_once() {
        let mut p = Pinger::new(at(0), Duration::from_millis(1_000));
        let a = seq(&p.poll(at(250)));
        let b = seq(&p.poll(at(500)));
        p.pong(b);
        assert_eq!(p.deadline(), Some(at(750)), "the next ping");
        seq(&p.poll(at(750)));
        // A late answer to an older ping moves nothing back.
        p.pong(a);
        seq(&p.poll(at(1_000)));
        seq(&p.poll(at(1_250)));
        assert_eq!(p.poll(at(1_499)), Ping::Nothing);
        assert_eq!(
            p.poll(at(1_500)),
            Ping::Silent,
            "silent 1 s after the ping at 500"
        );
        // Answers to pings never sent change nothing.
        let mut q = Pinger::new(at(0), Duration::from_millis(1_000));
        q.pong(7);
        assert_eq!(q.poll(at(1_000)), Ping::Silent);
    }

    #[test]
    fn a_pinger_on_while_used_rests_once_its_frames_are_answered_for() {
        let mut p = Pinger::while_used(at(0), Duration::from_millis(1_000));
        let s = seq(&p.poll(at(250)));
        p.pong(s);
        // The ping at 250 followed the frames of 0: idle, nothing due, never silent.
        assert_eq!(p.deadline(), None);
        assert_eq!(p.poll(at(1_000)), Ping::Nothing);
        assert_eq!(p.poll(at(60_000)), Ping::Nothing);
        // Used again: busy from then.
        p.used(at(60_000));
        assert_eq!(p.deadline(), Some(at(60_250)));
        let a = seq(&p.poll(at(60_250)));
        // A frame after that ping: its answer covers the frame of 60000, not the one of 60300.
        p.used(at(60_300));
        p.pong(a);
        assert_eq!(p.deadline(), Some(at(60_500)), "still busy: the next ping");
        // Never answered again: silent a bound after the answered ping was sent.
        let mut now = 60_500;
        let ended = loop {
            match p.poll(at(now)) {
                Ping::Silent => break now,
                _ => {
                    now = p
                        .deadline()
                        .unwrap()
                        .saturating_since(Instant::ZERO)
                        .as_millis();
                }
            }
        };
        assert_eq!(ended, 61_250);
        // Used once and never answered: silent a bound after that use, pings or not.
        let mut q = Pinger::while_used(at(0), Duration::from_millis(1_000));
        assert_eq!(q.poll(at(999)), Ping::Send(1));
        assert_eq!(q.poll(at(1_000)), Ping::Silent);
        // A pinger always on never rests, used or not.
        let mut r = Pinger::new(at(0), Duration::from_millis(1_000));
        r.used(at(5));
        let s = seq(&r.poll(at(250)));
        r.pong(s);
        assert_eq!(r.deadline(), Some(at(500)));
        assert_eq!(r.poll(at(1_250)), Ping::Silent);
    }

    #[test]
    fn it_keeps_a_bounded_number_of_pings() {
        let mut p = Pinger::new(at(0), Duration::from_millis(1_000));
        // A driver that polls late and often still keeps at most a bound's worth.
        for now in (250..1_000).step_by(250) {
            seq(&p.poll(at(now)));
            assert!(p.outstanding.len() <= PINGS_PER_SILENCE as usize + 1);
        }
        assert_eq!(p.outstanding.len(), 3);
    }
}

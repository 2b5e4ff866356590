//! A host's book of where the other hosts listen, filled by asking the directory node one host
//! at a time ([`Link::WhereIs`], answered by [`Link::Located`]) when a frame first needs that
//! host. Until the answer comes the host's frames for it wait here, a bounded number for a
//! bounded time.
//!
//! (Protocol version 1 sent every host the whole peer list on every admission: N hosts cost
//! the directory N² entries, and hosts that did not read kept them queued.)
//!
//! A node id keeps its listen address for good (membership never hands one out twice, unless
//! a directory lost the records that named it), so the book asks once per host; it forgets an
//! address when a connection to it fails or closes (the next frame asks again, which also
//! corrects an answer that went stale with lost records), and past [`BOOK_KNOWN_MAX`].

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use crate::ids::NodeId;
use crate::limits::{LISTEN_BYTES_MAX, MEMBERS_MAX};
use crate::link::Link;
use crate::time::{Duration, Instant};

/// Most listen addresses a book keeps: as many as the directory has members. Past it the book
/// forgets the lowest node id's address (and asks again if it needs it).
pub const BOOK_KNOWN_MAX: usize = MEMBERS_MAX;
/// Most hosts whose address is asked at once; a frame for one more is dropped.
pub const BOOK_ASKING_MAX: usize = 64;
/// Most frames waiting for one host's address; later ones are dropped (every protocol between
/// hosts re-sends).
pub const BOOK_PARKED_MAX: usize = 64;
/// Most frames waiting for addresses in all.
pub const BOOK_PARKED_TOTAL_MAX: usize = 256;
/// A question not answered within this is asked again (by [`PeerBook::park`] and
/// [`PeerBook::to_ask`]): the answer may have been lost with the directory link.
pub const ASK_AGAIN: Duration = Duration::from_secs(1);
/// How long frames wait for their host's address before [`PeerBook::expire`] drops them.
pub const ASK_WAIT: Duration = Duration::from_secs(5);

/// What [`PeerBook::park`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parked {
    /// It waits; send `Link::WhereIs(node)` to the directory now.
    Ask,
    /// It waits; the question is out already (or cannot go out now).
    Waiting,
    /// Dropped: too many frames or hosts wait already.
    Dropped,
}

#[derive(Clone, Debug)]
struct Asking {
    /// When the first frame began to wait.
    since: Instant,
    /// When the question last went out (`None`: not since the link was lost).
    asked: Option<Instant>,
    frames: Vec<Link>,
}

/// Where other hosts listen, as far as this host asked (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct PeerBook {
    known: BTreeMap<NodeId, String>,
    asking: BTreeMap<NodeId, Asking>,
    parked: usize,
}

impl PeerBook {
    /// An empty book (a host process starts with one).
    pub fn new() -> PeerBook {
        PeerBook::default()
    }

    /// Where `node` listens, if the book knows.
    pub fn listen(&self, node: NodeId) -> Option<&str> {
        self.known.get(&node).map(String::as_str)
    }

    /// Whether frames wait for `node`'s address.
    pub fn is_asking(&self, node: NodeId) -> bool {
        self.asking.contains_key(&node)
    }

    /// `frame` is for `node`, whose address the book does not know (see [`Self::listen`]): it
    /// waits for the directory's answer. `can_ask`: the directory link is up.
    pub fn park(&mut self, now: Instant, node: NodeId, frame: Link, can_ask: bool) -> Parked {
        if self.parked >= BOOK_PARKED_TOTAL_MAX {
            return Parked::Dropped;
        }
        let full = self.asking.len() >= BOOK_ASKING_MAX;
        let asking = match self.asking.entry(node) {
            Entry::Occupied(e) if e.get().frames.len() >= BOOK_PARKED_MAX => {
                return Parked::Dropped;
            }
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(_) if full => return Parked::Dropped,
            Entry::Vacant(e) => e.insert(Asking {
                since: now,
                asked: None,
                frames: Vec::new(),
            }),
        };
        asking.frames.push(frame);
        self.parked += 1;
        let due = asking
            .asked
            .is_none_or(|asked| now.saturating_since(asked) >= ASK_AGAIN);
        if can_ask && due {
            asking.asked = Some(now);
            Parked::Ask
        } else {
            Parked::Waiting
        }
    }

    /// The hosts whose question is due (never sent since the link was lost, or not answered
    /// within [`ASK_AGAIN`]), marked as asked at `now`: send `Link::WhereIs` for each.
    pub fn to_ask(&mut self, now: Instant) -> Vec<NodeId> {
        self.asking
            .iter_mut()
            .filter(|(_, a)| {
                a.asked
                    .is_none_or(|asked| now.saturating_since(asked) >= ASK_AGAIN)
            })
            .map(|(&node, a)| {
                a.asked = Some(now);
                node
            })
            .collect()
    }

    /// The directory's answer about `node`. `Ok`: the frames that waited for it, to route now
    /// (the address is known from now on). `Err`: no host has that node id (or the answer is
    /// not a listen address any directory hands out): the number of waiting frames dropped.
    pub fn located(&mut self, node: NodeId, listen: Option<String>) -> Result<Vec<Link>, usize> {
        let frames = self
            .asking
            .remove(&node)
            .map(|a| a.frames)
            .unwrap_or_default();
        self.parked -= frames.len();
        match listen {
            Some(listen) if !listen.is_empty() && listen.len() <= LISTEN_BYTES_MAX => {
                if !self.known.contains_key(&node) && self.known.len() >= BOOK_KNOWN_MAX {
                    self.known.pop_first();
                }
                self.known.insert(node, listen);
                Ok(frames)
            }
            _ => Err(frames.len()),
        }
    }

    /// Forgets where `node` listens: its connection failed or closed, so the next frame asks
    /// again. (A node id keeps its address for good, unless a directory lost the records that
    /// named it and handed the id out again: an answer kept past that would send the node's
    /// frames to another host for ever.)
    pub fn forget(&mut self, node: NodeId) {
        self.known.remove(&node);
    }

    /// The directory link is lost: questions in flight may be lost with it (they go out again
    /// through [`Self::to_ask`] once it is back).
    pub fn link_lost(&mut self) {
        for asking in self.asking.values_mut() {
            asking.asked = None;
        }
    }

    /// Drops the frames that waited [`ASK_WAIT`] for their host's address; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut dropped = 0;
        self.asking.retain(|_, a| {
            let keep = now.saturating_since(a.since) < ASK_WAIT;
            if !keep {
                dropped += a.frames.len();
            }
            keep
        });
        self.parked -= dropped;
        dropped
    }

    /// When the oldest waiting frames are due to be dropped.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.asking
            .values()
            .map(|a| a.since.saturating_add(ASK_WAIT))
            .min()
    }

    /// Addresses known.
    pub fn known(&self) -> usize {
        self.known.len()
    }

    /// Frames waiting for an address.
    pub fn parked(&self) -> usize {
        self.parked
    }

    /// The bounds hold and the count of waiting frames is theirs.
    pub fn check_invariants(&self) -> Result<(), String> {
        let parked: usize = self.asking.values().map(|a| a.frames.len()).sum();
        if parked != self.parked {
            return Err(format!(
                "the book counts {} waiting frames; {parked} wait",
                self.parked
            ));
        }
        if self.known.len() > BOOK_KNOWN_MAX
            || self.asking.len() > BOOK_ASKING_MAX
            || parked > BOOK_PARKED_TOTAL_MAX
            || self
                .asking
                .values()
                .any(|a| a.frames.len() > BOOK_PARKED_MAX)
        {
            return Err("the book holds more than its limits".to_owned());
        }
        if let Some(node) = self.asking.keys().find(|n| self.known.contains_key(n)) {
            return Err(format!("the book asks where {node} listens but knows it"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u64) -> Link {
        Link::WhereIs(NodeId(n))
    }

    fn at(ms: u64) -> Instant {
        Instant::ZERO.saturating_add(Duration::from_millis(ms))
    }

    #[test]
    fn frames_wait_for_their_hosts_address_and_go_once_it_is_known() {
        let mut book = PeerBook::new();
        let b = NodeId(7);
        assert_eq!(book.park(at(0), b, frame(1), true), Parked::Ask);
        // The question is out: the next frames wait without asking again.
        assert_eq!(book.park(at(10), b, frame(2), true), Parked::Waiting);
        assert_eq!(book.parked(), 2);
        let frames = book.located(b, Some("10.0.0.7:7000".into())).unwrap();
        assert_eq!(frames, vec![frame(1), frame(2)]);
        assert_eq!(book.listen(b), Some("10.0.0.7:7000"));
        assert_eq!(book.parked(), 0);
        book.check_invariants().unwrap();
    }

    #[test]
    fn an_unknown_node_drops_its_frames() {
        let mut book = PeerBook::new();
        book.park(at(0), NodeId(9), frame(1), true);
        book.park(at(0), NodeId(9), frame(2), true);
        assert_eq!(book.located(NodeId(9), None), Err(2));
        assert_eq!(book.listen(NodeId(9)), None);
        // An answer nobody asked for (or a second one) changes nothing but the address.
        assert_eq!(book.located(NodeId(9), None), Err(0));
        assert_eq!(book.located(NodeId(9), Some(String::new())), Err(0));
        let long = "x".repeat(LISTEN_BYTES_MAX + 1);
        assert_eq!(book.located(NodeId(9), Some(long)), Err(0));
        assert_eq!(book.listen(NodeId(9)), None);
        book.check_invariants().unwrap();
    }

    #[test]
    fn a_question_lost_with_the_link_is_asked_again() {
        let mut book = PeerBook::new();
        let b = NodeId(3);
        // The link is down: the frame waits, nothing is asked.
        assert_eq!(book.park(at(0), b, frame(1), false), Parked::Waiting);
        assert_eq!(book.to_ask(at(5)), vec![b]);
        assert_eq!(book.to_ask(at(6)), Vec::<NodeId>::new());
        // Not answered within ASK_AGAIN: due again, by a frame or by the tick.
        assert_eq!(book.park(at(500), b, frame(2), true), Parked::Waiting);
        assert_eq!(book.park(at(1005), b, frame(3), true), Parked::Ask);
        book.link_lost();
        assert_eq!(book.to_ask(at(1010)), vec![b]);
        book.check_invariants().unwrap();
    }

    #[test]
    fn frames_wait_a_bounded_number_for_a_bounded_time() {
        let mut book = PeerBook::new();
        for i in 0..BOOK_PARKED_MAX as u64 {
            assert_ne!(book.park(at(0), NodeId(1), frame(i), true), Parked::Dropped);
        }
        assert_eq!(book.park(at(0), NodeId(1), frame(0), true), Parked::Dropped);
        for n in 2..=BOOK_ASKING_MAX as u64 {
            assert_ne!(book.park(at(0), NodeId(n), frame(n), true), Parked::Dropped);
        }
        // Hosts asked about: at the bound.
        assert_eq!(
            book.park(at(0), NodeId(1000), frame(0), true),
            Parked::Dropped
        );
        // Frames in all: at the bound.
        while book.parked() < BOOK_PARKED_TOTAL_MAX {
            let node = NodeId(2 + book.parked() as u64 % 10);
            assert_ne!(book.park(at(0), node, frame(0), true), Parked::Dropped);
        }
        assert_eq!(book.park(at(0), NodeId(2), frame(0), true), Parked::Dropped);
        book.check_invariants().unwrap();
        assert_eq!(book.next_deadline(), Some(at(0).saturating_add(ASK_WAIT)));
        assert_eq!(book.expire(at(4999)), 0);
        assert_eq!(book.expire(at(5000)), BOOK_PARKED_TOTAL_MAX);
        assert_eq!((book.parked(), book.next_deadline()), (0, None));
        book.check_invariants().unwrap();
    }

    #[test]
    fn a_forgotten_address_is_asked_again() {
        let mut book = PeerBook::new();
        book.located(NodeId(4), Some("old:1".into())).unwrap();
        book.forget(NodeId(4));
        assert_eq!(book.listen(NodeId(4)), None);
        assert_eq!(book.park(at(0), NodeId(4), frame(1), true), Parked::Ask);
        assert_eq!(
            book.located(NodeId(4), Some("new:1".into())),
            Ok(vec![frame(1)])
        );
        assert_eq!(book.listen(NodeId(4)), Some("new:1"));
        book.check_invariants().unwrap();
    }

    /// Its self-check finds each way the book can be broken (the simulator calls it after
    /// every host step; a weakened check would pass a broken book).
    #[test]
    fn the_self_check_finds_each_broken_bound() {
        let asking = |frames: usize| Asking {
            since: at(0),
            asked: None,
            frames: (0..frames as u64).map(frame).collect(),
        };
        let mut miscounted = PeerBook::new();
        miscounted.asking.insert(NodeId(1), asking(2));
        miscounted.parked = 1;
        assert!(miscounted.check_invariants().is_err());
        let mut known = PeerBook::new();
        for n in 0..=BOOK_KNOWN_MAX as u64 {
            known.known.insert(NodeId(n), "h:1".into());
        }
        assert!(known.check_invariants().is_err(), "known past its bound");
        let mut hosts = PeerBook::new();
        for n in 0..=BOOK_ASKING_MAX as u64 {
            hosts.asking.insert(NodeId(n), asking(1));
        }
        hosts.parked = BOOK_ASKING_MAX + 1;
        assert!(hosts.check_invariants().is_err(), "asking past its bound");
        let mut total = PeerBook::new();
        for n in 0..=(BOOK_PARKED_TOTAL_MAX / BOOK_PARKED_MAX) as u64 {
            total.asking.insert(NodeId(n), asking(BOOK_PARKED_MAX));
        }
        total.parked = total.asking.len() * BOOK_PARKED_MAX;
        assert!(total.check_invariants().is_err(), "frames past the total");
        let mut one = PeerBook::new();
        one.asking.insert(NodeId(1), asking(BOOK_PARKED_MAX + 1));
        one.parked = BOOK_PARKED_MAX + 1;
        assert!(
            one.check_invariants().is_err(),
            "one host's frames past its bound"
        );
        let mut both = PeerBook::new();
        both.asking.insert(NodeId(1), asking(1));
        both.parked = 1;
        both.known.insert(NodeId(1), "h:1".into());
        assert!(both.check_invariants().is_err(), "asked and known");
        both.known.clear();
        both.check_invariants().unwrap();
    }

    /// The host asks the book whether anything still waits before it looks a name up.
    #[test]
    fn the_book_says_whose_frames_wait() {
        let mut book = PeerBook::new();
        assert!(!book.is_asking(NodeId(4)));
        assert_eq!(book.park(at(0), NodeId(4), frame(1), true), Parked::Ask);
        assert!(book.is_asking(NodeId(4)));
        assert!(!book.is_asking(NodeId(5)));
        book.located(NodeId(4), Some("h4:1".into())).unwrap();
        assert!(!book.is_asking(NodeId(4)), "answered");
        assert_eq!(book.park(at(0), NodeId(6), frame(2), true), Parked::Ask);
        assert_eq!(book.expire(at(0).saturating_add(ASK_WAIT)), 1);
        assert!(!book.is_asking(NodeId(6)), "given up");
    }

    #[test]
    fn the_book_forgets_the_lowest_node_past_its_bound() {
        let mut book = PeerBook::new();
        for n in 1..=BOOK_KNOWN_MAX as u64 {
            book.located(NodeId(n), Some(format!("h{n}:1"))).unwrap();
        }
        book.located(NodeId(1), Some("h1:1".into())).unwrap();
        assert_eq!(book.known(), BOOK_KNOWN_MAX);
        book.located(NodeId(99_999), Some("new:1".into())).unwrap();
        assert_eq!(book.known(), BOOK_KNOWN_MAX);
        assert_eq!(book.listen(NodeId(1)), None);
        assert_eq!(book.listen(NodeId(99_999)), Some("new:1"));
        book.check_invariants().unwrap();
    }
}

//! Name lookups off the driver thread.
//!
//! A node's driver thread serves every connection and child of the node, so it must never wait
//! on DNS: `getaddrinfo` can take the resolver's timeout times its attempts times the search
//! domains (tens of seconds with a DNS server that is down, or a name whose authority answers
//! slowly on purpose: a host's listen address is whatever it said in its hello). A node hands
//! such names to a [`Resolver`]: a few threads of its own look them up and wake the driver's
//! poll ([`crate::net::Reactor::waker`]), and the driver takes the answers with
//! [`Resolver::answers`] after each poll.
//!
//! A literal `IP:PORT` needs no lookup and never comes here ([`literal`]).
//!
//! **Bounds.** At most [`LOOKUPS_MAX`] lookups are wanted at once: a key asked for past it is
//! refused ([`Started::Full`]), and the caller drops what waited for it as it drops frames for
//! a peer it cannot reach. An answer not in within [`LOOKUP_WAIT`] of the request is given up
//! ([`Resolver::expire`]), as is a request replaced by another name for its key. Requests wait
//! in the resolver's own queue until one of its threads is free, so one given up before a
//! thread took it is never looked up; one a thread took runs to its end (`getaddrinfo` cannot
//! be cancelled) and its answer is ignored. So names that never answer can hold the threads and
//! delay other names' lookups (until those are given up), but never fill the table for good,
//! and a literal address is never delayed. Each node keeps the names its operator gave
//! (directory and replica addresses) on a resolver of their own, so a stranger's slow names
//! delay only lookups of other strangers' and peers' names.
//!
//! **Owner.** The threads end when their [`Resolver`] is dropped (after the lookup each is in).

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use dataplane_core::time::{Duration, Instant};

/// Most lookups wanted at once (per resolver).
pub const LOOKUPS_MAX: usize = 64;
/// How long a lookup may take, from its request, before it is given up.
pub const LOOKUP_WAIT: Duration = Duration::from_secs(5);
/// Most addresses kept from one answer.
pub const ADDRESSES_MAX: usize = 8;

/// The address `name` (`IP:PORT`) stands for, if it is literal: no lookup needed.
pub fn literal(name: &str) -> Option<SocketAddr> {
    name.parse().ok()
}

/// The lookup a resolver's threads make: the system's (`getaddrinfo`), its first
/// [`ADDRESSES_MAX`] addresses in its order.
pub fn system_lookup(name: &str) -> Result<Vec<SocketAddr>, String> {
    match name.to_socket_addrs() {
        Ok(addresses) => {
            let addresses: Vec<SocketAddr> = addresses.take(ADDRESSES_MAX).collect();
            if addresses.is_empty() {
                Err("the name has no address".to_owned())
            } else {
                Ok(addresses)
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

/// What a name resolved to last, tried in turn: each connection attempt takes the next
/// address, so a name with several (IPv6 and IPv4, say) reaches the one that answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    list: Vec<SocketAddr>,
    turn: usize,
}

impl Addresses {
    /// The address for the next attempt, if the name ever resolved.
    pub fn next_address(&mut self) -> Option<SocketAddr> {
        let address = *self.list.get(self.turn % self.list.len().max(1))?;
        self.turn = self.turn.wrapping_add(1);
        Some(address)
    }

    /// A new answer (a list that changed starts the turn over).
    pub fn answered(&mut self, list: Vec<SocketAddr>) {
        if list != self.list {
            self.list = list;
            self.turn = 0;
        }
    }

    /// Starts out with the one address that worked.
    pub fn of(address: SocketAddr) -> Addresses {
        Addresses {
            list: vec![address],
            turn: 0,
        }
    }
}

/// What a lookup function returns: the addresses (at least one), or why there are none.
pub type Lookup = fn(&str) -> Result<Vec<SocketAddr>, String>;

/// What [`Resolver::start`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// The lookup is under way; its answer comes through [`Resolver::answers`].
    Started,
    /// A lookup of the same name for the key is under way already.
    Waiting,
    /// [`LOOKUPS_MAX`] lookups are wanted already: none started.
    Full,
}

/// A lookup's answer, for the key it was started for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer<K> {
    /// The key given to [`Resolver::start`].
    pub key: K,
    /// The name looked up.
    pub name: String,
    /// Its addresses (at least one), or why there are none.
    pub addresses: Result<Vec<SocketAddr>, String>,
}

#[derive(Debug)]
struct Waiting {
    ticket: u64,
    name: String,
    until: Instant,
}

/// Name lookups for the driver thread, each for a key of the caller's (see the module doc).
pub struct Resolver<K> {
    to_threads: Sender<(u64, String)>,
    answers: Receiver<(u64, Result<Vec<SocketAddr>, String>)>,
    threads: usize,
    /// Requests the threads hold (their answers not yet taken): at most `threads`.
    busy: usize,
    /// Tickets waiting for a free thread, oldest first.
    queued: VecDeque<u64>,
    waiting: BTreeMap<K, Waiting>,
    next_ticket: u64,
}

impl<K> std::fmt::Debug for Resolver<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("waiting", &self.waiting.len())
            .field("busy", &self.busy)
            .finish()
    }
}

impl<K: Ord + Clone> Resolver<K> {
    /// Starts `threads` threads (at least one) that look names up with `lookup` and call
    /// `wake` after each answer (the driver's [`mio::Waker`]).
    pub fn new(threads: usize, wake: Arc<mio::Waker>, lookup: Lookup) -> io::Result<Resolver<K>> {
        let threads = threads.max(1);
        let (to_threads, requests) = crossbeam_channel::unbounded::<(u64, String)>();
        let (answered, answers) = crossbeam_channel::unbounded();
        for i in 0..threads {
            let requests = requests.clone();
            let answered = answered.clone();
            let wake = wake.clone();
            std::thread::Builder::new()
                .name(format!("dataplane-resolve-{i}"))
                .spawn(move || {
                    for (ticket, name) in requests.iter() {
                        if answered.send((ticket, lookup(&name))).is_err() {
                            return;
                        }
                        // A driver that is gone has nothing to wake.
                        let _ = wake.wake();
                    }
                })?;
        }
        Ok(Resolver {
            to_threads,
            answers,
            threads,
            busy: 0,
            queued: VecDeque::new(),
            waiting: BTreeMap::new(),
            next_ticket: 1,
        })
    }

    /// Looks `name` up for `key` (a later lookup for the same key with another name replaces
    /// the earlier one, whose answer is then ignored).
    pub fn start(&mut self, now: Instant, key: K, name: &str) -> Started {
        if let Some(w) = self.waiting.get(&key) {
            if w.name == name {
                return Started::Waiting;
            }
            let replaced = w.ticket;
            self.queued.retain(|&t| t != replaced);
        } else if self.waiting.len() >= LOOKUPS_MAX {
            return Started::Full;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiting.insert(
            key,
            Waiting {
                ticket,
                name: name.to_owned(),
                until: now.saturating_add(LOOKUP_WAIT),
            },
        );
        self.queued.push_back(ticket);
        self.dispatch();
        Started::Started
    }

    /// Hands queued requests to the threads that are free.
    fn dispatch(&mut self) {
        while self.busy < self.threads {
            let Some(ticket) = self.queued.pop_front() else {
                return;
            };
            let Some(name) = self
                .waiting
                .values()
                .find(|w| w.ticket == ticket)
                .map(|w| w.name.clone())
            else {
                continue;
            };
            if self.to_threads.send((ticket, name)).is_err() {
                return; // The threads are gone: the lookups are given up at their wait.
            }
            self.busy += 1;
        }
    }

    /// The answers in since the last call, for lookups still wanted.
    pub fn answers(&mut self) -> Vec<Answer<K>> {
        let mut out = Vec::new();
        while let Ok((ticket, addresses)) = self.answers.try_recv() {
            self.busy = self.busy.saturating_sub(1);
            let Some(key) = self
                .waiting
                .iter()
                .find(|(_, w)| w.ticket == ticket)
                .map(|(k, _)| k.clone())
            else {
                continue; // Given up, or replaced.
            };
            if let Some(w) = self.waiting.remove(&key) {
                out.push(Answer {
                    key,
                    name: w.name,
                    addresses,
                });
            }
        }
        self.dispatch();
        out
    }

    /// Gives up the lookups not answered within [`LOOKUP_WAIT`] of their request: their keys
    /// and names.
    pub fn expire(&mut self, now: Instant) -> Vec<(K, String)> {
        let mut expired = Vec::new();
        let mut tickets = Vec::new();
        self.waiting.retain(|key, w| {
            let keep = now < w.until;
            if !keep {
                tickets.push(w.ticket);
                expired.push((key.clone(), std::mem::take(&mut w.name)));
            }
            keep
        });
        if !tickets.is_empty() {
            self.queued.retain(|t| !tickets.contains(t));
        }
        expired
    }

    /// Whether a lookup is under way for `key`.
    pub fn is_waiting(&self, key: &K) -> bool {
        self.waiting.contains_key(key)
    }

    /// When the oldest lookup is given up.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.values().map(|w| w.until).min()
    }

    /// Lookups wanted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The table and the queue agree: every queued ticket is wanted, at most
    /// [`LOOKUPS_MAX`] are, and the threads hold at most one request each.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.waiting.len() > LOOKUPS_MAX || self.busy > self.threads {
            return Err(format!(
                "{} lookups wanted, {} at {} threads",
                self.waiting.len(),
                self.busy,
                self.threads
            ));
        }
        for t in &self.queued {
            if !self.waiting.values().any(|w| w.ticket == *t) {
                return Err(format!("ticket {t} is queued and not wanted"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::net::{NetEvent, Reactor};

    /// `slow-MS:PORT` answers 127.0.0.1 after MS milliseconds; other names fail at once.
    fn slow(name: &str) -> Result<Vec<SocketAddr>, String> {
        if let Some(ms) = name.strip_prefix("slow-") {
            let ms: u64 = ms.split(':').next().unwrap().parse().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(ms));
            return Ok(vec!["127.0.0.1:9".parse().unwrap()]);
        }
        Err(format!("{name}: no such name"))
    }

    /// Polls `net` until the resolver has answers (or `within` passes).
    fn poll_answers(
        net: &mut Reactor,
        resolver: &mut Resolver<u32>,
        within: std::time::Duration,
    ) -> Vec<Answer<u32>> {
        let until = std::time::Instant::now() + within;
        let mut events: Vec<NetEvent> = Vec::new();
        loop {
            let answers = resolver.answers();
            resolver.check_invariants().unwrap();
            if !answers.is_empty() || std::time::Instant::now() >= until {
                return answers;
            }
            net.poll(Some(std::time::Duration::from_millis(100)), &mut events)
                .unwrap();
        }
    }

    fn resolver(net: &mut Reactor, threads: usize, lookup: Lookup) -> Resolver<u32> {
        Resolver::new(threads, net.waker().unwrap(), lookup).unwrap()
    }

    #[test]
    fn a_slow_lookup_answers_through_the_poll_and_the_caller_never_waits_for_it() {
        let mut net = Reactor::new().unwrap();
        let mut resolver = resolver(&mut net, 2, slow);
        let t = Instant::ZERO;
        let began = std::time::Instant::now();
        assert_eq!(resolver.start(t, 1, "slow-300:1"), Started::Started);
        assert_eq!(resolver.start(t, 1, "slow-300:1"), Started::Waiting);
        assert_eq!(resolver.start(t, 2, "nowhere:1"), Started::Started);
        assert!(
            began.elapsed() < std::time::Duration::from_millis(200),
            "start waited for the lookup"
        );
        let mut got = Vec::new();
        while got.len() < 2 {
            let answers = poll_answers(&mut net, &mut resolver, std::time::Duration::from_secs(5));
            assert!(!answers.is_empty(), "no answer within 5 s");
            got.extend(answers);
        }
        got.sort_by_key(|a| a.key);
        assert_eq!(got[0].addresses, Ok(vec!["127.0.0.1:9".parse().unwrap()]));
        assert_eq!(got[0].name, "slow-300:1");
        assert_eq!(got[1].addresses, Err("nowhere:1: no such name".to_owned()));
        assert_eq!(resolver.waiting(), 0);
    }

    #[test]
    fn lookups_are_bounded_and_given_up_after_their_wait() {
        let mut net = Reactor::new().unwrap();
        let mut resolver = resolver(&mut net, 2, slow);
        let t = Instant::ZERO;
        for key in 0..LOOKUPS_MAX as u32 {
            assert_eq!(resolver.start(t, key, "slow-200:1"), Started::Started);
        }
        assert_eq!(resolver.start(t, 1000, "slow-200:1"), Started::Full);
        resolver.check_invariants().unwrap();
        assert_eq!(
            resolver.next_deadline(),
            Some(t.saturating_add(LOOKUP_WAIT))
        );
        assert!(
            resolver
                .expire(t.saturating_add(Duration::from_secs(1)))
                .is_empty()
        );
        let expired = resolver.expire(t.saturating_add(LOOKUP_WAIT));
        assert_eq!(expired.len(), LOOKUPS_MAX);
        assert_eq!(resolver.waiting(), 0);
        resolver.check_invariants().unwrap();
        // The answers of lookups given up are not handed out.
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert!(resolver.answers().is_empty());
    }

    static LOOKED_UP: AtomicUsize = AtomicUsize::new(0);

    fn counted(name: &str) -> Result<Vec<SocketAddr>, String> {
        LOOKED_UP.fetch_add(1, Ordering::SeqCst);
        slow(name)
    }

    /// Names that hang hold the threads, never the table: once their lookups are given up,
    /// new ones start, and the requests given up before a thread took them are never looked
    /// up at all.
    #[test]
    fn hanging_names_hold_the_threads_not_the_table() {
        let mut net = Reactor::new().unwrap();
        let mut resolver = resolver(&mut net, 1, counted);
        let t = Instant::ZERO;
        // One thread, held for 1.5 s; 63 more wait behind it.
        assert_eq!(resolver.start(t, 0, "slow-1500:1"), Started::Started);
        for key in 1..LOOKUPS_MAX as u32 {
            assert_eq!(resolver.start(t, key, "slow-10:1"), Started::Started);
        }
        let later = t.saturating_add(LOOKUP_WAIT);
        assert_eq!(resolver.expire(later).len(), LOOKUPS_MAX);
        // The table has room again at once, though the thread still hangs.
        assert_eq!(resolver.start(later, 100, "quick:1"), Started::Started);
        resolver.check_invariants().unwrap();
        let got = poll_answers(&mut net, &mut resolver, std::time::Duration::from_secs(5));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].key, 100);
        // The hanging name and the quick one: none of the 63 given up in the queue.
        assert_eq!(LOOKED_UP.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_key_looked_up_under_a_new_name_takes_only_the_new_answer() {
        let mut net = Reactor::new().unwrap();
        let mut resolver = resolver(&mut net, 2, slow);
        let t = Instant::ZERO;
        assert_eq!(resolver.start(t, 7, "slow-200:1"), Started::Started);
        assert_eq!(resolver.start(t, 7, "elsewhere:1"), Started::Started);
        resolver.check_invariants().unwrap();
        let mut got = Vec::new();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < until {
            got.extend(poll_answers(
                &mut net,
                &mut resolver,
                std::time::Duration::from_millis(300),
            ));
        }
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].name, "elsewhere:1");
    }

    #[test]
    fn literal_addresses_need_no_lookup() {
        assert_eq!(
            literal("10.0.0.1:7701"),
            Some("10.0.0.1:7701".parse().unwrap())
        );
        assert_eq!(literal("[::1]:7701"), Some("[::1]:7701".parse().unwrap()));
        assert_eq!(literal("node-a:7701"), None);
        assert_eq!(literal("10.0.0.1"), None);
    }

    #[test]
    fn a_reactor_has_one_waker() {
        let mut net = Reactor::new().unwrap();
        let (a, b) = (net.waker().unwrap(), net.waker().unwrap());
        assert!(Arc::ptr_eq(&a, &b));
    }
}

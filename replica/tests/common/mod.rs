//! What the replica crate's seeded harnesses share: the event queue with its clock and the
//! seed's draws, the group's configurations with pinned election timeouts, and the two checks
//! on terms (one leader per term; a term made durable never goes back).

use std::collections::BTreeMap;

use dataplane_replica::{ReplicaConfig, Role};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// Milliseconds between two ticks of a replica.
pub const TICK_MS: u64 = 10;

/// The seeded event queue (times in simulated milliseconds) and the run's first failure.
pub struct Sched<E> {
    pub rng: ChaCha8Rng,
    pub now: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), E>,
    pub failure: Option<String>,
}

impl<E> Sched<E> {
    pub fn new(seed: u64) -> Self {
        Sched {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            failure: None,
        }
    }

    /// A draw in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n.max(1)
    }

    /// A draw that is true `ppm` times in a million.
    pub fn chance(&mut self, ppm: u32) -> bool {
        self.rng.next_u32() % 1_000_000 < ppm
    }

    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.rng.next_u32().is_multiple_of(2)
    }

    /// `event` happens `delay` ms from now (events at one time happen in the order scheduled).
    pub fn at(&mut self, delay: u64, event: E) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), event);
    }

    /// Records the run's first failure.
    pub fn fail(&mut self, why: String) {
        if self.failure.is_none() {
            self.failure = Some(format!("at {} ms: {why}", self.now));
        }
    }

    /// The next event at or before `end` (the clock moves to it), unless the run failed.
    pub fn next_until(&mut self, end: u64) -> Option<E> {
        if self.failure.is_some() {
            return None;
        }
        let (&(t, _), _) = self.events.first_key_value()?;
        if t > end {
            return None;
        }
        let (_, event) = self.events.pop_first()?;
        self.now = t;
        Some(event)
    }
}

/// A group of 3 replicas (5 in a third of the seeds) with distinct election timeouts of 10 to
/// 38 ticks, pinned per replica from the seed, and heartbeats every 3 ticks.
pub fn group<E>(sched: &mut Sched<E>) -> Vec<ReplicaConfig> {
    let n = if sched.rng.next_u32().is_multiple_of(3) {
        5
    } else {
        3
    };
    let voters: Vec<u64> = (1..=n as u64).collect();
    let mut timeouts: Vec<usize> = (0..n).map(|i| 10 + 6 * i).collect();
    for i in (1..n).rev() {
        let j = sched.below(i as u64 + 1) as usize;
        timeouts.swap(i, j);
    }
    timeouts
        .into_iter()
        .enumerate()
        .map(|(i, t)| ReplicaConfig {
            id: i as u64 + 1,
            voters: voters.clone(),
            election_ticks: t + sched.below(5) as usize,
            heartbeat_ticks: 3,
            // Small, so that the directory's replicas compact often and a lagging one is sent
            // a snapshot.
            snapshot_every: 4 + sched.below(24),
            snapshot_keep: sched.below(6),
        })
        .collect()
}

/// The checks on terms, restated from what the harness observes.
#[derive(Default)]
pub struct Terms {
    leaders: BTreeMap<u64, usize>,
    durable: BTreeMap<usize, u64>,
    /// Terms in which some replica was seen leading.
    pub elections: u64,
}

impl Terms {
    /// Replica `i` made `term` durable (a round's hard state reached its disk).
    pub fn made_durable(&mut self, i: usize, term: u64) {
        let t = self.durable.entry(i).or_default();
        *t = (*t).max(term);
    }

    /// Replica `i` lost its disk on purpose (a replica removed from the group, added again
    /// empty): the terms it made durable are gone with it.
    #[allow(dead_code)] // Only the directory harness changes its group.
    pub fn wiped(&mut self, i: usize) {
        self.durable.remove(&i);
    }

    /// Replica `i` is at `term` in `role`: at most one replica leads a term, and a replica is
    /// never below a term it made durable (one only in its memory may go back: a crash before
    /// the round is written forgets it, and nothing acted on it has left).
    pub fn observe(&mut self, i: usize, term: u64, role: Role) -> Result<(), String> {
        let durable = self.durable.get(&i).copied().unwrap_or(0);
        if term < durable {
            return Err(format!(
                "replica {} is at term {term} after making term {durable} durable",
                i + 1
            ));
        }
        if role == Role::Leader {
            match self.leaders.get(&term) {
                Some(&other) if other != i => {
                    return Err(format!(
                        "replicas {} and {} both lead term {term}",
                        other + 1,
                        i + 1
                    ));
                }
                Some(_) => {}
                None => {
                    self.elections += 1;
                    self.leaders.insert(term, i);
                }
            }
        }
        Ok(())
    }
}

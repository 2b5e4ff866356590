//! A seeded simulation of a replica group (issue 19, first step): three or five replicas over
//! a network that loses, duplicates and reorders messages, with partitions and crashes that
//! lose each replica's unsynced round. The harness plays the driver (the part the directory
//! node will play) and checks, from what it observes and never from the engine's own
//! bookkeeping:
//!
//! * **election safety**: at most one replica leads any term;
//! * **terms never go back** on a replica, across its crashes (its vote and term are durable);
//! * **agreement**: every replica applies, at each index, the entry any replica applied there,
//!   and applies indices in order from 1 in each life (the state machine is rebuilt from the
//!   log);
//! * **nothing acknowledged is lost**: a proposal counts as acknowledged once the replica that
//!   took it, in the same life, applied it (the directory replies at that moment); after the
//!   faults heal, every replica's log holds every acknowledged proposal;
//! * **liveness**: after the heal a leader is elected and a last proposal commits everywhere.
//!
//! The same harness with a defect planted in the driver (acknowledging on propose, releasing a
//! round before its fsync, not making the vote durable) must fail: the checks can fail.

use std::collections::{BTreeMap, BTreeSet};

use dataplane_replica::{
    Durable, HardStateRecord, LogEntry, Ready, Replica, ReplicaConfig, Role, WireMessage,
};

mod common;
use common::{Sched, TICK_MS, Terms};

/// A defect planted in the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Defect {
    None,
    /// Reply before commit: a proposal counts as acknowledged once the leader took it.
    AckOnPropose,
    /// Release a round (votes, append acknowledgements) before its entries are durable.
    ReleaseBeforeSync,
    /// Never make the hard state (term, vote) durable.
    ForgetHardState,
}

const FAULT_MS: u64 = 20_000;
const SETTLE_MS: u64 = 15_000;

#[derive(Debug)]
enum Event {
    Deliver(WireMessage),
    Tick(usize, u64),
    /// The disk finished writing a round of replica `.0` in life `.1`.
    Synced(usize, u64),
    /// The driver resumes after the sync (a crash in between: fsynced, not acknowledged).
    Resume(usize, u64),
    /// The delayed write of a round released early (the planted `ReleaseBeforeSync`).
    LateWrite(usize, u64, Vec<LogEntry>, Option<HardStateRecord>),
    Crash(usize),
    Restart(usize),
    Propose,
    Isolate(usize),
    Heal(usize),
}

struct Slot {
    config: ReplicaConfig,
    node: Option<Replica>,
    life: u64,
    disk: Durable,
    /// The round whose durable part is being written.
    inflight: Option<Ready>,
    synced: bool,
    applied_to: u64,
    applied_ids: BTreeSet<u64>,
    isolated: bool,
    /// When the last round released early reaches the disk (the planted `ReleaseBeforeSync`).
    late_until: u64,
}

struct World {
    sched: Sched<Event>,
    defect: Defect,
    slots: Vec<Slot>,
    loss_ppm: u32,
    dup_ppm: u32,
    faults: bool,
    next_proposal: u64,
    proposed: BTreeMap<u64, (usize, u64)>,
    acked: BTreeSet<u64>,
    terms: Terms,
    chosen: BTreeMap<u64, (u64, Vec<u8>)>,
    stats: Stats,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    elections: u64,
    acked: u64,
    crashes: u64,
    lost_rounds: u64,
    delivered: u64,
}

impl World {
    fn new(seed: u64, defect: Defect) -> World {
        let mut sched = Sched::new(seed);
        let slots: Vec<Slot> = common::group(&mut sched)
            .into_iter()
            .map(|config| {
                let node = Replica::start(&config, &Durable::default()).expect("a new replica");
                Slot {
                    config,
                    node: Some(node),
                    life: 0,
                    disk: Durable::default(),
                    inflight: None,
                    synced: false,
                    applied_to: 0,
                    applied_ids: BTreeSet::new(),
                    isolated: false,
                    late_until: 0,
                }
            })
            .collect();
        let n = slots.len();
        let loss_ppm = sched.below(100_000) as u32;
        let dup_ppm = sched.below(50_000) as u32;
        let mut w = World {
            sched,
            defect,
            slots,
            loss_ppm,
            dup_ppm,
            faults: true,
            next_proposal: 1,
            proposed: BTreeMap::new(),
            acked: BTreeSet::new(),
            terms: Terms::default(),
            chosen: BTreeMap::new(),
            stats: Stats::default(),
        };
        for i in 0..n {
            let first = w.sched.below(TICK_MS);
            w.sched.at(first, Event::Tick(i, 0));
        }
        w.sched.at(50, Event::Propose);
        let first_crash = 1_000 + w.sched.below(3_000);
        w.sched.at(first_crash, Event::Crash(usize::MAX));
        let first_partition = 2_000 + w.sched.below(4_000);
        w.sched.at(first_partition, Event::Isolate(usize::MAX));
        w
    }

    fn send(&mut self, from: usize, messages: Vec<WireMessage>) {
        for m in messages {
            let to = m.to as usize - 1;
            if self.faults && (self.slots[from].isolated || self.slots[to].isolated) {
                continue;
            }
            // Every message crosses the wire as bytes.
            let bytes = m.encode();
            let m = WireMessage::decode(&bytes).expect("our own frame decodes");
            if self.faults && self.sched.chance(self.loss_ppm) {
                continue;
            }
            let copies = if self.faults && self.sched.chance(self.dup_ppm) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let delay = 1 + self.sched.below(if self.faults { 30 } else { 5 });
                self.sched.at(delay, Event::Deliver(m.clone()));
            }
        }
    }

    fn apply(&mut self, i: usize, entries: Vec<LogEntry>) {
        for e in entries {
            let slot = &mut self.slots[i];
            if e.index != slot.applied_to + 1 {
                let why = format!(
                    "replica {} applied index {} after {}",
                    i + 1,
                    e.index,
                    slot.applied_to
                );
                self.sched.fail(why);
                return;
            }
            slot.applied_to = e.index;
            let id = proposal_id(&e.data);
            if let Some(id) = id {
                slot.applied_ids.insert(id);
            }
            let life = slot.life;
            match self.chosen.get(&e.index) {
                Some((term, data)) if (*term, data) != (e.term, &e.data) => {
                    let why = format!(
                        "replica {} applied {:?}@{} at index {}, another applied {:?}@{term}",
                        i + 1,
                        id,
                        e.term,
                        e.index,
                        proposal_id(data)
                    );
                    self.sched.fail(why);
                    return;
                }
                Some(_) => {}
                None => {
                    self.chosen.insert(e.index, (e.term, e.data.clone()));
                }
            }
            if let Some(id) = id
                && self.proposed.get(&id) == Some(&(i, life))
                && self.acked.insert(id)
            {
                self.stats.acked += 1;
            }
        }
    }

    fn observe(&mut self, i: usize) {
        let Some(node) = self.slots[i].node.as_ref() else {
            return;
        };
        if let Err(why) = self.terms.observe(i, node.term(), node.role()) {
            self.sched.fail(why);
        }
    }

    /// Takes the replica's next round, if it has one and none is being written.
    fn drive(&mut self, i: usize) {
        loop {
            let life = self.slots[i].life;
            if self.slots[i].inflight.is_some() {
                return;
            }
            let Some(node) = self.slots[i].node.as_mut() else {
                return;
            };
            let Some(mut ready) = node.ready() else {
                self.observe(i);
                return;
            };
            let send = std::mem::take(&mut ready.send);
            let apply = std::mem::take(&mut ready.apply);
            self.send(i, send);
            self.apply(i, apply);
            if self.defect == Defect::ReleaseBeforeSync {
                let (entries, hs) = (ready.entries.clone(), ready.hard_state);
                // The disk writes rounds in order, each some time after it was released.
                let latency = 1 + self.sched.below(8);
                let when = (self.sched.now + latency).max(self.slots[i].late_until);
                self.slots[i].late_until = when;
                self.sched.at(
                    when - self.sched.now,
                    Event::LateWrite(i, life, entries, hs),
                );
                let node = self.slots[i].node.as_mut().expect("running");
                let after = node.persisted(ready);
                self.send(i, after);
                continue;
            }
            self.slots[i].inflight = Some(ready);
            self.slots[i].synced = false;
            let latency = 1 + self.sched.below(8);
            self.sched.at(latency, Event::Synced(i, life));
            self.observe(i);
            return;
        }
    }

    fn write(&mut self, i: usize, entries: &[LogEntry], hs: Option<HardStateRecord>) {
        if let Some(h) = hs {
            self.terms.made_durable(i, h.term);
        }
        let hs = if self.defect == Defect::ForgetHardState {
            None
        } else {
            hs
        };
        self.slots[i].disk.write_parts(entries, hs);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver(m) => {
                let to = m.to as usize - 1;
                if self.faults && self.slots[to].isolated {
                    return;
                }
                let Some(node) = self.slots[to].node.as_mut() else {
                    return;
                };
                self.stats.delivered += 1;
                if let Err(e) = node.step(m) {
                    // A response from a peer the engine no longer tracks is refused, typed.
                    if !matches!(e, dataplane_replica::ReplicaError::UnknownPeer(_)) {
                        self.sched
                            .fail(format!("replica {} refused a message: {e}", to + 1));
                    }
                }
                self.drive(to);
            }
            Event::Tick(i, life) => {
                if self.slots[i].life != life {
                    return;
                }
                if let Some(node) = self.slots[i].node.as_mut() {
                    node.tick();
                    self.drive(i);
                    self.sched.at(TICK_MS, Event::Tick(i, life));
                }
            }
            Event::Synced(i, life) => {
                if self.slots[i].life != life || self.slots[i].node.is_none() {
                    return;
                }
                let ready = self.slots[i].inflight.take().expect("a round in flight");
                let (entries, hs) = (ready.entries.clone(), ready.hard_state);
                self.write(i, &entries, hs);
                self.slots[i].inflight = Some(ready);
                self.slots[i].synced = true;
                let gap = self.sched.below(2);
                self.sched.at(gap, Event::Resume(i, life));
            }
            Event::Resume(i, life) => {
                if self.slots[i].life != life || !self.slots[i].synced {
                    return;
                }
                let ready = self.slots[i].inflight.take().expect("a round in flight");
                let node = self.slots[i].node.as_mut().expect("running");
                let after = node.persisted(ready);
                self.send(i, after);
                self.drive(i);
            }
            Event::LateWrite(i, life, entries, hs) => {
                if self.slots[i].life == life && self.slots[i].node.is_some() {
                    self.write(i, &entries, hs);
                }
            }
            Event::Crash(which) => {
                if !self.faults {
                    return;
                }
                let i = if which == usize::MAX {
                    // Prefer the leader half the time: its crash is the interesting one.
                    let leader = (0..self.slots.len()).find(|&i| {
                        self.slots[i]
                            .node
                            .as_ref()
                            .is_some_and(|n| n.role() == Role::Leader)
                    });
                    match leader {
                        Some(l) if self.sched.coin() => l,
                        _ => self.sched.below(self.slots.len() as u64) as usize,
                    }
                } else {
                    which
                };
                if self.slots[i].node.is_some() {
                    self.stats.crashes += 1;
                    if self.slots[i].inflight.is_some() && !self.slots[i].synced {
                        self.stats.lost_rounds += 1;
                    }
                    let slot = &mut self.slots[i];
                    slot.node = None;
                    slot.inflight = None;
                    slot.life += 1;
                    let down = 100 + self.sched.below(2_000);
                    self.sched.at(down, Event::Restart(i));
                }
                let next = 500 + self.sched.below(4_000);
                self.sched.at(next, Event::Crash(usize::MAX));
            }
            Event::Restart(i) => self.restart(i),
            Event::Propose => {
                let target = (0..self.slots.len()).find(|&i| {
                    self.slots[i]
                        .node
                        .as_ref()
                        .is_some_and(|n| n.role() == Role::Leader)
                });
                let target =
                    target.unwrap_or_else(|| self.sched.below(self.slots.len() as u64) as usize);
                let life = self.slots[target].life;
                if let Some(node) = self.slots[target].node.as_mut() {
                    let id = self.next_proposal;
                    if node.propose(id.to_le_bytes().to_vec()).is_ok() {
                        self.next_proposal += 1;
                        self.proposed.insert(id, (target, life));
                        if self.defect == Defect::AckOnPropose && self.acked.insert(id) {
                            self.stats.acked += 1;
                        }
                    }
                    self.drive(target);
                }
                if self.faults {
                    let next = 10 + self.sched.below(90);
                    self.sched.at(next, Event::Propose);
                }
            }
            Event::Isolate(which) => {
                if !self.faults {
                    return;
                }
                let i = if which == usize::MAX {
                    self.sched.below(self.slots.len() as u64) as usize
                } else {
                    which
                };
                self.slots[i].isolated = true;
                let length = 300 + self.sched.below(3_000);
                self.sched.at(length, Event::Heal(i));
                let next = 2_000 + self.sched.below(5_000);
                self.sched.at(next, Event::Isolate(usize::MAX));
            }
            Event::Heal(i) => self.slots[i].isolated = false,
        }
    }

    fn restart(&mut self, i: usize) {
        if self.slots[i].node.is_some() {
            return;
        }
        let slot = &mut self.slots[i];
        match Replica::start(&slot.config, &slot.disk) {
            Ok(node) => {
                slot.node = Some(node);
                slot.applied_to = 0;
                slot.applied_ids.clear();
                let life = slot.life;
                self.sched.at(TICK_MS, Event::Tick(i, life));
                self.drive(i);
            }
            Err(e) => self
                .sched
                .fail(format!("replica {} could not start again: {e}", i + 1)),
        }
    }

    fn run_until(&mut self, end: u64) {
        while let Some(event) = self.sched.next_until(end) {
            self.handle(event);
        }
    }

    /// Faults, then a heal and the end checks.
    fn run(mut self) -> Result<Stats, String> {
        self.run_until(FAULT_MS);
        self.faults = false;
        for i in 0..self.slots.len() {
            self.slots[i].isolated = false;
            self.restart(i);
        }
        // A last proposal, offered to whoever leads until one replica acknowledges it.
        let marker = u64::MAX;
        let deadline = self.sched.now + SETTLE_MS;
        let mut offered = false;
        while self.sched.failure.is_none()
            && self.sched.now < deadline
            && !self.acked.contains(&marker)
        {
            let step = self.sched.now + 100;
            self.run_until(step);
            self.sched.now = step;
            let leader = (0..self.slots.len()).find(|&i| {
                self.slots[i]
                    .node
                    .as_ref()
                    .is_some_and(|n| n.role() == Role::Leader)
            });
            if let Some(l) = leader
                && !offered
            {
                let life = self.slots[l].life;
                let node = self.slots[l].node.as_mut().expect("leads");
                if node.propose(marker.to_le_bytes().to_vec()).is_ok() {
                    self.proposed.insert(marker, (l, life));
                    offered = true;
                }
                self.drive(l);
            } else if offered && leader.is_none() {
                offered = false;
            }
        }
        // Let the followers catch up.
        let end = self.sched.now + 3_000;
        self.run_until(end);
        if let Some(f) = self.sched.failure {
            return Err(f);
        }
        if !self.acked.contains(&marker) {
            return Err(format!(
                "liveness: no proposal committed in the {SETTLE_MS} ms after the heal"
            ));
        }
        let top = self.slots.iter().map(|s| s.applied_to).max().unwrap_or(0);
        for (i, s) in self.slots.iter().enumerate() {
            if s.applied_to != top {
                return Err(format!(
                    "replica {} applied {} of {top} entries after the heal",
                    i + 1,
                    s.applied_to
                ));
            }
            if let Some(lost) = self.acked.iter().find(|id| !s.applied_ids.contains(id)) {
                return Err(format!(
                    "acknowledged proposal {lost} is not in replica {}'s log",
                    i + 1
                ));
            }
        }
        self.stats.elections = self.terms.elections;
        Ok(self.stats)
    }
}

fn proposal_id(data: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(data).ok().map(u64::from_le_bytes)
}

fn swarm(seeds: std::ops::Range<u64>, defect: Defect) -> Vec<(u64, Result<Stats, String>)> {
    seeds
        .map(|seed| {
            // The engine asserts on states only a broken driver produces (a follower that lost
            // entries it acknowledged sees a commit past its log): a failure of the seed.
            let run = std::panic::catch_unwind(|| World::new(seed, defect).run());
            let result = run.unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Err(format!("the engine's assertion: {why}"))
            });
            (seed, result)
        })
        .collect()
}

#[test]
fn replicas_agree_and_lose_nothing_acknowledged_under_faults() {
    let results = swarm(0..48, Defect::None);
    let mut total = Stats::default();
    for (seed, result) in &results {
        match result {
            Ok(s) => {
                total.elections += s.elections;
                total.acked += s.acked;
                total.crashes += s.crashes;
                total.lost_rounds += s.lost_rounds;
                total.delivered += s.delivered;
            }
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    eprintln!("48 seeds: {total:?}");
    // The faults happened and the group still made progress.
    assert!(total.crashes > 48, "{total:?}");
    assert!(
        total.lost_rounds > 0,
        "no crash ever lost an unsynced round: {total:?}"
    );
    assert!(total.elections > 2 * 48, "{total:?}");
    assert!(total.acked > 48 * 50, "{total:?}");
}

/// The checks above can fail: each defect planted in the driver is caught by some seed.
#[test]
fn the_checks_catch_defects_planted_in_the_driver() {
    for defect in [
        Defect::AckOnPropose,
        Defect::ReleaseBeforeSync,
        Defect::ForgetHardState,
    ] {
        let results = swarm(0..200, defect);
        let failing: Vec<&(u64, Result<Stats, String>)> =
            results.iter().filter(|(_, r)| r.is_err()).collect();
        let first = failing
            .first()
            .map(|(seed, r)| (*seed, r.clone().unwrap_err()));
        eprintln!(
            "{defect:?}: {} of 200 seeds fail; first {first:?}",
            failing.len()
        );
        assert!(!failing.is_empty(), "{defect:?} slipped past every seed");
    }
}

#[test]
fn bad_frames_are_refused_with_a_typed_error() {
    use dataplane_replica::{FRAME_MAX, WireError};
    assert_eq!(WireMessage::decode(&[0xff; 3]), Err(WireError::Malformed));
    assert_eq!(
        WireMessage::decode(&vec![0; FRAME_MAX + 1]),
        Err(WireError::TooLarge(FRAME_MAX + 1))
    );
    // A message for another replica changes nothing.
    let config = ReplicaConfig {
        id: 1,
        voters: vec![1, 2, 3],
        election_ticks: 10,
        heartbeat_ticks: 3,
        snapshot_every: 0,
        snapshot_keep: 0,
    };
    let mut r = Replica::start(&config, &Durable::default()).unwrap();
    let m = WireMessage {
        kind: dataplane_replica::Kind::Heartbeat,
        to: 2,
        from: 3,
        term: 9,
        log_term: 0,
        index: 0,
        entries: Vec::new(),
        commit: 0,
        commit_term: 0,
        request_snapshot: 0,
        reject: false,
        reject_hint: 0,
        context: Vec::new(),
        priority: 0,
        snapshot: None,
    };
    let bytes = m.encode();
    let back = WireMessage::decode(&bytes).unwrap();
    assert_eq!(back, m);
    assert_eq!(
        r.step(back),
        Err(dataplane_replica::ReplicaError::WrongReplica { to: 2 })
    );
    assert_eq!(r.term(), 0);
    // A log with a gap is not a log.
    let bad = Durable {
        hard_state: HardStateRecord::default(),
        snapshot: None,
        start: (0, 0),
        entries: vec![LogEntry {
            index: 2,
            term: 1,
            kind: dataplane_replica::EntryKind::Normal,
            data: Vec::new(),
            context: Vec::new(),
        }],
    };
    assert!(matches!(
        Replica::start(&config, &bad),
        Err(dataplane_replica::ReplicaError::BadDurable(_))
    ));
}

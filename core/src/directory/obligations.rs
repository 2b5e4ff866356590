//! The obligation engine: retirement of replaced blob sources and displacement of stream
//! endpoints, sharing one bounded, route-gated, round-robin retry (DESIGN.md §5, Q5/Q8).
//!
//! An obligation is created by a durable record (a `Committed` with `retire`, or a
//! `DisplacementQueued`), and its first frame is sent at once, whatever the route says. After
//! that the only periodic re-drive is the retry tick, which sends at most a batch of frames
//! ([`crate::limits::RETRY_BATCH_MAX`], or the configured `retry_batch`), skips targets the
//! registrar reports unroutable, and rotates so that every routable target is reached within
//! ⌈N/batch⌉ ticks. A route becoming available wakes
//! exactly that target. An obligation completes on its acknowledgement or when the owning host
//! reports the address gone; completion is persisted before it is forgotten, and since storage
//! failure is fail-stop there is no "acknowledged but not yet durable" state to retry.
//!
//! Determinism: the rotation is a `BTreeMap` keyed by a counter; recovery seeds it in the
//! persisted order.

use std::collections::{BTreeMap, BTreeSet};

use super::Directory;
use super::durable::ObligationKey;
use crate::effect::{Effect, Outbox};
use crate::ids::{Address, StreamIncarnation};
use crate::log::LogRecord;
use crate::path::DataPath;
use crate::wire::{GoneScope, Message};

/// The volatile half of the engine: rotation order, watched routes and their last report.
#[derive(Clone, Debug, Default)]
pub(crate) struct Engine {
    rotation: BTreeMap<u64, ObligationKey>,
    slots: BTreeMap<ObligationKey, u64>,
    next_slot: u64,
    watched: BTreeMap<Address, usize>,
    unroutable: BTreeSet<Address>,
}

impl Engine {
    /// Adds `key` at the back of the rotation; returns whether it was new.
    fn enqueue(&mut self, key: ObligationKey) -> bool {
        if self.slots.contains_key(&key) {
            return false;
        }
        let slot = self.next_slot;
        self.next_slot += 1;
        self.rotation.insert(slot, key);
        self.slots.insert(key, slot);
        true
    }

    fn remove(&mut self, key: &ObligationKey) -> bool {
        match self.slots.remove(key) {
            Some(slot) => {
                self.rotation.remove(&slot);
                true
            }
            None => false,
        }
    }

    /// Moves the front of the rotation to the back and returns it.
    fn rotate(&mut self) -> Option<ObligationKey> {
        let (_, key) = self.rotation.pop_first()?;
        let slot = self.next_slot;
        self.next_slot += 1;
        self.rotation.insert(slot, key);
        self.slots.insert(key, slot);
        Some(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn is_routable(&self, target: &Address) -> bool {
        !self.unroutable.contains(target)
    }

    /// The watched targets last reported unroutable, in address order.
    pub(crate) fn unroutable(&self) -> impl Iterator<Item = &Address> {
        self.unroutable.iter()
    }

    pub(crate) fn is_watched(&self, target: &Address) -> bool {
        self.watched.contains_key(target)
    }

    /// The tracked obligations, in key order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &ObligationKey> {
        self.slots.keys()
    }

    /// Each watched target with the number of obligations watching it, in address order.
    pub(crate) fn watch_counts(&self) -> impl Iterator<Item = (Address, usize)> + '_ {
        self.watched.iter().map(|(a, n)| (*a, *n))
    }
}

impl Directory {
    fn watch(&mut self, target: Address, out: &mut Outbox) {
        let count = self.engine.watched.entry(target).or_insert(0);
        *count += 1;
        if *count == 1 {
            out.push(Effect::WatchRoute { target });
        }
    }

    fn unwatch(&mut self, target: Address, out: &mut Outbox) {
        if let Some(count) = self.engine.watched.get_mut(&target) {
            *count -= 1;
            if *count == 0 {
                self.engine.watched.remove(&target);
                self.engine.unroutable.remove(&target);
                out.push(Effect::UnwatchRoute { target });
            }
        }
    }

    /// Puts a durable obligation into the rotation and watches its target (recovery and
    /// creation share this).
    pub(super) fn track_obligation(&mut self, key: ObligationKey, out: &mut Outbox) {
        if self.engine.enqueue(key) {
            self.watch(key.target(), out);
        }
    }

    /// Sends the frame that discharges `key`.
    fn send_obligation(&self, key: ObligationKey, out: &mut Outbox) {
        let reply_to = self.config.address;
        match key {
            ObligationKey::Retire(source) => out.send(source, Message::Retire { reply_to }),
            ObligationKey::Displace(endpoint, incarnation) => {
                out.send(
                    endpoint,
                    Message::Displaced {
                        incarnation,
                        reply_to,
                    },
                );
            }
        }
    }

    /// Called after the commit that added `source` to the durable retirements: track it and
    /// send one Retire now, regardless of routability (SPEC §4.8).
    pub(super) fn queue_retirement(&mut self, source: Address, out: &mut Outbox) {
        let key = ObligationKey::Retire(source);
        self.track_obligation(key, out);
        self.send_obligation(key, out);
    }

    /// Creates (durably) a displacement obligation toward `endpoint` for `incarnation`, unless
    /// it is already pending or the endpoint's incarnation was reported gone, and sends the
    /// first notice.
    pub(super) fn queue_displacement(
        &mut self,
        endpoint: Address,
        incarnation: StreamIncarnation,
        fence: Option<DataPath>,
        out: &mut Outbox,
    ) {
        if self.durable.is_displacing(endpoint, incarnation) || self.durable.is_gone(&endpoint) {
            return;
        }
        let queued = LogRecord::DisplacementQueued {
            endpoint,
            incarnation,
            fence,
        };
        self.commit(queued, out);
        let key = ObligationKey::Displace(endpoint, incarnation);
        self.track_obligation(key, out);
        self.send_obligation(key, out);
    }

    /// Durably completes `key` and forgets it.
    fn complete_obligation(&mut self, key: ObligationKey, out: &mut Outbox) {
        let record = match key {
            ObligationKey::Retire(source) => LogRecord::RetirementDone { source },
            ObligationKey::Displace(endpoint, incarnation) => LogRecord::DisplacementDone {
                endpoint,
                incarnation,
            },
        };
        self.commit(record, out);
        if self.engine.remove(&key) {
            self.unwatch(key.target(), out);
        }
    }

    /// `SourceRetired{source}`: complete the retirement if one is pending.
    pub(super) fn source_retired(&mut self, source: Address, out: &mut Outbox) {
        let key = ObligationKey::Retire(source);
        if self.durable.has_obligation(&key) {
            self.complete_obligation(key, out);
        }
    }

    /// `StreamDisplaced{endpoint, incarnation}`: complete that displacement if it is pending,
    /// then let fences whose obligations are all done resume.
    pub(super) fn stream_displaced(
        &mut self,
        endpoint: Address,
        incarnation: StreamIncarnation,
        out: &mut Outbox,
    ) {
        let key = ObligationKey::Displace(endpoint, incarnation);
        if self.durable.has_obligation(&key) {
            self.complete_obligation(key, out);
            self.resume_fences(out);
        }
    }

    /// `AddressGone{scope}`: every obligation toward a covered address completes, and every
    /// reservation it owned is released (the stream side is in `streams.rs`).
    pub(super) fn complete_gone_obligations(&mut self, scope: &GoneScope, out: &mut Outbox) {
        let covered: Vec<ObligationKey> = self
            .durable
            .obligations_in_order()
            .map(|(key, _)| key)
            .filter(|key| scope.covers(&key.target()))
            .collect();
        for key in covered {
            self.complete_obligation(key, out);
        }
        let released: Vec<DataPath> = self
            .durable
            .reservations()
            .filter(|(_, r)| scope.covers(&r.owner))
            .map(|(path, _)| path.clone())
            .collect();
        for path in released {
            self.commit(LogRecord::ReservationReleased { path }, out);
        }
    }

    /// One retry pass (SPEC §4.9 as amended by Q5): at most the configured batch
    /// ([`crate::limits::RETRY_BATCH_MAX`] by default) of frames, each obligation examined at most once,
    /// unroutable targets skipped; then fences resume.
    pub(super) fn retry_pass(&mut self, out: &mut Outbox) {
        let n = self.engine.len();
        let batch = self.config.limits.retry_batch.max(1);
        let mut examined = 0;
        let mut sent = 0;
        while examined < n && sent < batch {
            let Some(key) = self.engine.rotate() else {
                break;
            };
            examined += 1;
            if !self.engine.is_routable(&key.target()) {
                continue;
            }
            self.send_obligation(key, out);
            sent += 1;
        }
        self.resume_fences(out);
    }

    /// A route report for `target`. A report for an address we do not watch is stale and
    /// ignored; a target that became routable gets one frame per obligation toward it.
    pub(super) fn route_changed(&mut self, target: Address, routable: bool, out: &mut Outbox) {
        if !self.engine.is_watched(&target) {
            return;
        }
        if !routable {
            self.engine.unroutable.insert(target);
            return;
        }
        self.engine.unroutable.remove(&target);
        let keys: Vec<ObligationKey> = self.durable.obligations_toward(target).collect();
        for key in keys {
            self.send_obligation(key, out);
        }
    }
}

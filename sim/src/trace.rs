//! The event trace: a 64-bit FNV-1a hash over every processed event (time, sequence number
//! and the event's full contents), and optionally a readable log of the same events.
//!
//! Two runs of one seed must produce the same hash (`swarm --check-determinism` checks it).
//! The hash covers event contents through their derived `Hash` impls, fed to a fixed hasher,
//! so it is stable for a given binary.

use std::fmt::Debug;
use std::hash::{Hash, Hasher};

use dataplane_core::time::Instant;

/// FNV-1a, 64 bit: tiny, fixed, and good enough to detect divergence.
#[derive(Clone, Copy, Debug)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, i: u64) {
        // One multiply per word instead of eight keeps the trace hash off the profile.
        self.0 ^= i;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// The trace of one run.
#[derive(Debug)]
pub struct Trace {
    hasher: Fnv64,
    text: Option<Vec<String>>,
}

impl Trace {
    /// A trace that keeps a readable log when `text` is set.
    pub fn new(text: bool) -> Self {
        Trace {
            hasher: Fnv64::default(),
            text: text.then(Vec::new),
        }
    }

    /// Folds one event into the hash (and the log).
    pub fn event<E: Hash + Debug>(&mut self, at: Instant, seq: u64, event: &E) {
        self.hasher.write_u64(at.as_nanos());
        self.hasher.write_u64(seq);
        event.hash(&mut self.hasher);
        if let Some(text) = &mut self.text {
            text.push(format!("{at} #{seq} {event:?}"));
        }
    }

    /// Adds a free-form line to the log (not to the hash).
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(text) = &mut self.text {
            text.push(line());
        }
    }

    /// The hash so far.
    pub fn hash(&self) -> u64 {
        self.hasher.finish()
    }

    /// The readable log, if kept.
    pub fn lines(&self) -> Option<&[String]> {
        self.text.as_deref()
    }
}

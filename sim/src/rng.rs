//! Seeded randomness for the simulator (STYLE.md rule 3).
//!
//! One `u64` seed derives every draw of a run. Each subsystem draws from its own ChaCha8
//! stream (same key, different stream number), so adding a draw in one subsystem never shifts
//! the draws of another: the workload of seed 7 stays the same whether loss is on or off.
//! Range helpers are written here (not taken from `rand`) so the mapping from seed to run is
//! fixed by this crate alone.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// The independent random streams of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Stream {
    /// Topology and option draws.
    Options = 1,
    /// Link latencies, loss, duplication, reordering.
    Network = 2,
    /// Crash, partition, disk and route fault schedules.
    Faults = 3,
    /// Client behaviour.
    Workload = 4,
    /// Disk latencies and torn tails.
    Disk = 5,
    /// The simulated file system's own draws: failed fsyncs, what a crash keeps, damage at
    /// rest, entropy for ids and salts.
    Storage = 6,
    /// Which hostile frames the spoof fault sends.
    Spoof = 7,
    /// How the environment misbehaves within its contract: the route registrar's repeated,
    /// skipped and late reports, discovery's repeats (issue 15, class 5).
    Environment = 8,
}

/// A deterministic random source for one subsystem.
#[derive(Clone, Debug)]
pub struct SimRng {
    inner: ChaCha8Rng,
}

impl SimRng {
    /// The stream `stream` of the run `seed`.
    pub fn new(seed: u64, stream: Stream) -> Self {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(b"dataplan");
        let mut inner = ChaCha8Rng::from_seed(key);
        inner.set_stream(stream as u64);
        SimRng { inner }
    }

    /// A uniform `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// A uniform value in `0..n` (`n > 0`), without modulo bias (Lemire's method).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        loop {
            let x = self.next_u64();
            let m = u128::from(x) * u128::from(n);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "empty range");
        lo + self.below(hi - lo + 1)
    }

    /// `true` with probability `p` (0.0..=1.0).
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        self.unit() < p
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform float in `[lo, hi)`.
    pub fn float(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// An exponentially distributed value with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// An index drawn with the given weights (not all zero).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        assert!(total > 0, "all weights are zero");
        let mut x = self.below(total);
        for (i, &w) in weights.iter().enumerate() {
            if x < u64::from(w) {
                return i;
            }
            x -= u64::from(w);
        }
        unreachable!("weighted draw out of range")
    }

    /// A uniformly chosen element.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_independent_and_reproducible() {
        let a: Vec<u64> = (0..4)
            .map(|_| SimRng::new(7, Stream::Network).next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut net = SimRng::new(7, Stream::Network);
        let mut work = SimRng::new(7, Stream::Workload);
        assert_ne!(net.next_u64(), work.next_u64());
        assert_ne!(
            SimRng::new(8, Stream::Network).next_u64(),
            SimRng::new(7, Stream::Network).next_u64()
        );
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = SimRng::new(1, Stream::Options);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let x = rng.below(7);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(rng.range(5, 5), 5);
    }

    #[test]
    fn weighted_never_picks_zero_weights() {
        let mut rng = SimRng::new(2, Stream::Options);
        for _ in 0..1000 {
            assert_ne!(rng.weighted(&[3, 0, 1]), 1);
        }
    }
}

//! Each node's own monotonic clock (issue 15, class 5: environments that only help).
//!
//! The world keeps one global simulated time; every node reads its own clock, which starts at
//! its own origin and runs fast or slow by a fixed rate. A monotonic clock promises nothing
//! else, so every machine must measure its deadlines, ticks and timeouts on its own clock and
//! never compare instants of two nodes (none cross the wire). The checkers of a node's
//! timing bounds measure on that node's clock too.
//!
//! Integer arithmetic only: the rate is in parts per million.

use dataplane_core::time::{Duration, Instant};

/// Parts per million: the unit of a clock's rate error.
const MILLION: i128 = 1_000_000;

/// One node's clock: `local(t) = offset + t + t·ppm/10⁶` for global time `t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeClock {
    /// The local reading at global time zero.
    pub offset: Duration,
    /// How fast the clock runs, in parts per million above (positive) or below (negative)
    /// global time; greater than −10⁶, so the clock never stops.
    pub ppm: i32,
}

impl NodeClock {
    /// The global clock itself.
    pub const EXACT: NodeClock = NodeClock {
        offset: Duration::ZERO,
        ppm: 0,
    };

    /// The node's reading at global time `global`: `⌊offset + global·(10⁶ + ppm)/10⁶⌋`.
    pub fn local(&self, global: Instant) -> Instant {
        let t = i128::from(global.as_nanos());
        let local = i128::from(self.offset.as_nanos())
            + (t * (MILLION + i128::from(self.ppm))).div_euclid(MILLION);
        Instant::from_nanos(u64::try_from(local.max(0)).unwrap_or(u64::MAX))
    }

    /// The earliest global time, not before `not_before`, at which the node's clock reads at
    /// least `local` (when a timer armed for `local` fires): the least `t` with
    /// `offset + t·rate/10⁶ ≥ local`, that is `⌈(local − offset)·10⁶/rate⌉`.
    pub fn global(&self, local: Instant, not_before: Instant) -> Instant {
        let since_origin = i128::from(local.as_nanos()) - i128::from(self.offset.as_nanos());
        let rate = MILLION + i128::from(self.ppm);
        let at = (since_origin * MILLION + rate - 1).div_euclid(rate).max(0);
        Instant::from_nanos(u64::try_from(at).unwrap_or(u64::MAX)).max(not_before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_clock_is_the_identity() {
        let t = Instant::from_nanos(123_456_789);
        assert_eq!(NodeClock::EXACT.local(t), t);
        assert_eq!(NodeClock::EXACT.global(t, Instant::ZERO), t);
    }

    #[test]
    fn timers_fire_at_the_first_tick_that_reads_their_time() {
        for clock in [
            NodeClock {
                offset: Duration::from_secs(500),
                ppm: 40_000,
            },
            NodeClock {
                offset: Duration::from_millis(3),
                ppm: -50_000,
            },
            NodeClock {
                offset: Duration::ZERO,
                ppm: 7,
            },
        ] {
            for g in [0u64, 1, 999, 1_000_000_007, 86_400_000_000_000] {
                let now = Instant::from_nanos(g);
                let local = clock.local(now);
                for wait in [0u64, 1, 1_000, 250_000_000, 30_000_000_000] {
                    let at = local.saturating_add(Duration::from_nanos(wait));
                    let fires = clock.global(at, now);
                    assert!(fires >= now);
                    assert!(clock.local(fires) >= at, "{clock:?} {g} {wait}");
                    if fires > now {
                        let before = Instant::from_nanos(fires.as_nanos() - 1);
                        assert!(clock.local(before) < at, "{clock:?} {g} {wait}: late");
                    }
                }
            }
        }
    }

    #[test]
    fn a_fast_clock_reads_more_and_a_slow_one_less() {
        let t = Instant::from_nanos(1_000_000_000);
        let fast = NodeClock {
            offset: Duration::ZERO,
            ppm: 10_000,
        };
        let slow = NodeClock {
            offset: Duration::ZERO,
            ppm: -10_000,
        };
        assert_eq!(fast.local(t).as_nanos(), 1_010_000_000);
        assert_eq!(slow.local(t).as_nanos(), 990_000_000);
    }
}

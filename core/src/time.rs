//! Core-owned time: an [`Instant`] is nanoseconds from an arbitrary origin chosen by the driver
//! (the simulator starts at zero, the IO adapter uses a monotonic clock). The core never reads a
//! clock; every `handle_*` call receives `now` from its driver.

use core::fmt;
use serde::{Deserialize, Serialize};

/// A span of time in nanoseconds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Duration(u64);

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration(0);
    /// The largest representable span.
    pub const MAX: Duration = Duration(u64::MAX);

    /// A span of `nanos` nanoseconds.
    pub const fn from_nanos(nanos: u64) -> Self {
        Duration(nanos)
    }

    /// A span of `micros` microseconds (saturating).
    pub const fn from_micros(micros: u64) -> Self {
        Duration(micros.saturating_mul(1_000))
    }

    /// A span of `millis` milliseconds (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Duration(millis.saturating_mul(1_000_000))
    }

    /// A span of `secs` seconds (saturating).
    pub const fn from_secs(secs: u64) -> Self {
        Duration(secs.saturating_mul(1_000_000_000))
    }

    /// The span in nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The span in whole milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// The span in seconds, as a float (for reports only).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self * factor`, saturating.
    pub const fn saturating_mul(self, factor: u64) -> Self {
        Duration(self.0.saturating_mul(factor))
    }

    /// `self + other`, saturating.
    pub const fn saturating_add(self, other: Duration) -> Self {
        Duration(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1_000_000_000) {
            write!(f, "{}s", self.0 / 1_000_000_000)
        } else if self.0.is_multiple_of(1_000_000) {
            write!(f, "{}ms", self.0 / 1_000_000)
        } else {
            write!(f, "{}ns", self.0)
        }
    }
}

/// A point in time: nanoseconds since the driver's origin.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Instant(u64);

impl Instant {
    /// The driver's origin.
    pub const ZERO: Instant = Instant(0);

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + span`, saturating at the end of time.
    pub const fn saturating_add(self, span: Duration) -> Self {
        Instant(self.0.saturating_add(span.0))
    }

    /// Time elapsed from `earlier` to `self` (zero if `earlier` is later).
    pub const fn saturating_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / 1_000_000_000;
        let micros = (self.0 % 1_000_000_000) / 1_000;
        write!(f, "{secs}.{micros:06}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let end = Instant::from_nanos(u64::MAX - 1);
        assert_eq!(
            end.saturating_add(Duration::from_secs(1)).as_nanos(),
            u64::MAX
        );
        assert_eq!(Instant::ZERO.saturating_since(end), Duration::ZERO);
        assert_eq!(Duration::from_secs(u64::MAX), Duration::MAX);
    }

    #[test]
    fn display_is_human_readable() {
        assert_eq!(Duration::from_secs(80).to_string(), "80s");
        assert_eq!(Duration::from_millis(250).to_string(), "250ms");
        assert_eq!(Instant::from_nanos(1_500_000_000).to_string(), "1.500000s");
    }
}

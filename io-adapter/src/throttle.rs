//! A warning that may repeat many times a second (a failing `accept`, frames a peer may not
//! send), logged at most once per period with the count of the occurrences it stood for.

use std::time::{Duration, Instant};

/// When a repeating warning was last logged, and how many occurrences were not since.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Throttle {
    last: Option<(Instant, u64)>,
}

impl Throttle {
    /// Nothing logged yet.
    pub(crate) const fn new() -> Throttle {
        Throttle { last: None }
    }

    /// One more occurrence at `now`: `Some(n)` if it is to be logged (`n` occurrences went
    /// unlogged since the last line), `None` if it falls within `every` of that line.
    pub(crate) fn occur(&mut self, now: Instant, every: Duration) -> Option<u64> {
        match &mut self.last {
            Some((logged, since)) if now.duration_since(*logged) < every => {
                *since += 1;
                None
            }
            last => {
                let since = last.map_or(0, |(_, since)| since);
                *last = Some((now, 0));
                Some(since)
            }
        }
    }
}

/// A line any stranger can make a node write at will (a connection evicted, refused, out of
/// protocol), for one process: at most one per [`STRANGER_LINES_EVERY`], saying how many it
/// stands for. Refusals are counted whole in the metrics.
pub(crate) struct StrangerLines(std::sync::Mutex<Throttle>);

/// How often a [`StrangerLines`] kind is logged at most.
pub(crate) const STRANGER_LINES_EVERY: Duration = Duration::from_secs(10);

impl StrangerLines {
    pub(crate) const fn new() -> StrangerLines {
        StrangerLines(std::sync::Mutex::new(Throttle::new()))
    }

    /// One more: `Some(n)` if it is to be logged (`n` went unlogged since the last line).
    pub(crate) fn occur(&self) -> Option<u64> {
        match self.0.lock() {
            Ok(mut throttle) => throttle.occur(Instant::now(), STRANGER_LINES_EVERY),
            Err(_) => Some(0),
        }
    }
}

/// Connections evicted from a full admission queue.
pub(crate) static EVICTED_LINES: StrangerLines = StrangerLines::new();
/// Connections refused in their handshake.
pub(crate) static REFUSED_LINES: StrangerLines = StrangerLines::new();
/// Connections closed for a frame out of protocol.
pub(crate) static PROTOCOL_LINES: StrangerLines = StrangerLines::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_it_stood_for() {
        let every = Duration::from_secs(10);
        let start = Instant::now();
        let mut throttle = Throttle::default();
        assert_eq!(throttle.occur(start, every), Some(0));
        assert_eq!(throttle.occur(start + Duration::from_secs(1), every), None);
        assert_eq!(throttle.occur(start + Duration::from_secs(9), every), None);
        assert_eq!(throttle.occur(start + every, every), Some(2));
        assert_eq!(throttle.occur(start + every, every), None);
        assert_eq!(throttle.occur(start + 3 * every, every), Some(1));
    }
}

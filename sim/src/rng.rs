//! Seeded randomness for the simulator (STYLE.md rule 3), and the decision tape.
//!
//! One `u64` seed derives every draw of a run. Each subsystem draws from its own ChaCha8
//! stream (same key, different stream number), so adding a draw in one subsystem never shifts
//! the draws of another: the workload of seed 7 stays the same whether loss is on or off.
//! Range helpers are written here (not taken from `rand`) so the mapping from seed to run is
//! fixed by this crate alone, and no draw uses floating point (probabilities are integer
//! [`Ratio`]s, as TigerBeetle's are; the exponential draw is fixed-point): a seed is the same
//! run on every machine and libm.
//!
//! **The decision tape (issue 14).** Every draw consumes raw `u64`s from its stream. A run can
//! record them ([`Entropy::record`]) and be replayed from the recording instead of the seed
//! ([`Entropy::tape`]), bit-identically. A tape is also something to shrink: the mapping from
//! raw values to results is monotone and a zero is the *least* draw (`below` gives 0, `chance`
//! gives `false`, an exponential delay gives 0), so zeroing a stretch of the fault stream
//! turns those faults off and deleting a stretch of the workload stream removes operations. A
//! stream whose tape has run out goes on with the seed's own stream from that position (not
//! with least draws: endless zero delays would spin a run that outlives its tape in place).

use std::fmt;
use std::sync::Arc;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// The independent random streams of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// Connections between hosts and the directory: their latencies, handshake nonces and
    /// the strangers that connect.
    Conns = 9,
    /// Host processes that die while they boot, and how soon they are started again.
    Boots = 10,
    /// Silent stalls: a node paused, a connection that stays open and delivers nothing.
    Stalls = 11,
    /// Host crashes aimed at work in flight (a retirement, an undecided stream open, a
    /// publication, a transfer).
    Aims = 12,
}

impl Stream {
    /// Every stream, in number order.
    pub const ALL: [Stream; 12] = [
        Stream::Options,
        Stream::Network,
        Stream::Faults,
        Stream::Workload,
        Stream::Disk,
        Stream::Storage,
        Stream::Spoof,
        Stream::Environment,
        Stream::Conns,
        Stream::Boots,
        Stream::Stalls,
        Stream::Aims,
    ];

    fn index(self) -> usize {
        self as usize - 1
    }

    /// The stream's name, as the tape and the shrinker print it.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Options => "options",
            Stream::Network => "network",
            Stream::Faults => "faults",
            Stream::Workload => "workload",
            Stream::Disk => "disk",
            Stream::Storage => "storage",
            Stream::Spoof => "spoof",
            Stream::Environment => "environment",
            Stream::Conns => "conns",
            Stream::Boots => "boots",
            Stream::Stalls => "stalls",
            Stream::Aims => "aims",
        }
    }
}

/// A probability as an integer ratio `numerator / denominator` (no floating point in draws).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ratio {
    /// The numerator (at most the denominator).
    pub numerator: u64,
    /// The denominator (not zero).
    pub denominator: u64,
}

/// `numerator / denominator`.
pub const fn ratio(numerator: u64, denominator: u64) -> Ratio {
    assert!(denominator > 0, "ratio with a zero denominator");
    Ratio {
        numerator,
        denominator,
    }
}

impl Ratio {
    /// Never.
    pub const ZERO: Ratio = ratio(0, 1);

    /// `ppm` parts per million.
    pub const fn ppm(ppm: u64) -> Ratio {
        ratio(ppm, 1_000_000)
    }

    /// The ratio in parts per million, rounded down.
    pub fn as_ppm(self) -> u64 {
        (u128::from(self.numerator) * 1_000_000 / u128::from(self.denominator)) as u64
    }

    /// Whether it never happens.
    pub fn is_zero(self) -> bool {
        self.numerator == 0
    }

    /// Half as likely (`p / 2`).
    pub fn halved(self) -> Ratio {
        ratio(self.numerator, self.denominator.saturating_mul(2))
    }
}

impl fmt::Display for Ratio {
    /// As a percentage with four decimals, in integer arithmetic.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ppm = self.as_ppm();
        write!(f, "{}.{:04}%", ppm / 10_000, ppm % 10_000)
    }
}

/// The raw draws of one run, per stream: what [`Entropy::record`] recorded and
/// [`Entropy::tape`] replays.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tape {
    streams: [Vec<u64>; Stream::ALL.len()],
}

const TAPE_MAGIC: &[u8; 8] = b"DPTAPE4\n";
/// The most raw draws a tape file may claim per stream (a bad file is refused, not allocated).
const TAPE_STREAM_MAX: u64 = 1 << 28;

impl Tape {
    /// The raw draws of `stream`.
    pub fn stream(&self, stream: Stream) -> &[u64] {
        &self.streams[stream.index()]
    }

    /// Replaces the raw draws of `stream`.
    pub fn set_stream(&mut self, stream: Stream, values: Vec<u64>) {
        self.streams[stream.index()] = values;
    }

    /// Raw draws in all streams.
    pub fn len(&self) -> usize {
        self.streams.iter().map(Vec::len).sum()
    }

    /// Whether no stream has a draw.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tape as a file: a magic line, then per stream its count and its draws (little
    /// endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(8 + 8 * (8 + self.len()));
        bytes.extend_from_slice(TAPE_MAGIC);
        for values in &self.streams {
            bytes.extend_from_slice(&(values.len() as u64).to_le_bytes());
            for v in values {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        bytes
    }

    /// Reads a tape file written by [`Tape::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Tape, String> {
        let rest = bytes
            .strip_prefix(TAPE_MAGIC)
            .ok_or("not a dataplane-sim tape (bad magic)")?;
        let mut words = rest.chunks(8);
        let mut word = |what: &str| -> Result<u64, String> {
            let chunk = words
                .next()
                .filter(|c| c.len() == 8)
                .ok_or_else(|| format!("tape ends inside {what}"))?;
            Ok(u64::from_le_bytes(chunk.try_into().expect("eight bytes")))
        };
        let mut tape = Tape::default();
        for stream in Stream::ALL {
            let count = word("a stream's count")?;
            if count > TAPE_STREAM_MAX {
                return Err(format!(
                    "stream {} claims {count} draws (at most {TAPE_STREAM_MAX})",
                    stream.name()
                ));
            }
            let values = (0..count)
                .map(|_| word(stream.name()))
                .collect::<Result<Vec<_>, _>>()?;
            tape.set_stream(stream, values);
        }
        if word("trailing bytes").is_ok() {
            return Err("trailing bytes after the last stream".to_owned());
        }
        Ok(tape)
    }
}

/// Where a run's draws come from: its seed's streams or a tape, and whether to record them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entropy {
    /// The seed (the label of a run replayed from a tape).
    pub seed: u64,
    /// Replay these draws instead of the seed's.
    pub tape: Option<Arc<Tape>>,
    /// Record every draw (see [`SimRng::take_record`]).
    pub record: bool,
}

impl Entropy {
    /// The seed's own draws, not recorded.
    pub fn seed(seed: u64) -> Entropy {
        Entropy {
            seed,
            tape: None,
            record: false,
        }
    }

    /// The random source of `stream`.
    pub fn rng(&self, stream: Stream) -> SimRng {
        let source = match &self.tape {
            None => Source::Seed(Box::new(chacha(self.seed, stream))),
            Some(tape) => Source::Tape {
                tape: Arc::clone(tape),
                seed: self.seed,
                stream,
                next: 0,
                past_the_end: None,
            },
        };
        SimRng {
            source,
            record: self.record.then(Vec::new),
        }
    }
}

fn chacha(seed: u64, stream: Stream) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(b"dataplan");
    let mut inner = ChaCha8Rng::from_seed(key);
    inner.set_stream(stream as u64);
    inner
}

#[derive(Clone, Debug)]
enum Source {
    Seed(Box<ChaCha8Rng>),
    Tape {
        tape: Arc<Tape>,
        seed: u64,
        stream: Stream,
        next: usize,
        /// The seed's own stream, from where the tape ran out.
        past_the_end: Option<Box<ChaCha8Rng>>,
    },
}

/// A deterministic random source for one subsystem.
#[derive(Clone, Debug)]
pub struct SimRng {
    source: Source,
    record: Option<Vec<u64>>,
}

/// ln 2 in Q32 fixed point.
const LN2_Q32: u128 = 2_977_044_472;

impl SimRng {
    /// The stream `stream` of the run `seed`.
    pub fn new(seed: u64, stream: Stream) -> Self {
        Entropy::seed(seed).rng(stream)
    }

    /// The draws recorded so far (empty unless recording), leaving the record empty.
    pub fn take_record(&mut self) -> Vec<u64> {
        self.record.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The next raw draw.
    fn raw(&mut self) -> u64 {
        let value = match &mut self.source {
            Source::Seed(rng) => rng.next_u64(),
            Source::Tape {
                tape,
                seed,
                stream,
                next,
                past_the_end,
            } => match tape.stream(*stream).get(*next) {
                Some(&value) => {
                    *next += 1;
                    value
                }
                None => past_the_end
                    .get_or_insert_with(|| {
                        let mut rng = chacha(*seed, *stream);
                        // Two 32-bit words per draw: the seed's stream at the tape's end.
                        rng.set_word_pos(2 * *next as u128);
                        Box::new(rng)
                    })
                    .next_u64(),
            },
        };
        if let Some(record) = &mut self.record {
            record.push(value);
        }
        value
    }

    /// A uniform `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.raw()
    }

    /// A uniform value in `0..n` (`n > 0`), without bias: the raw draw's bucket, of width
    /// `⌊(2^64 − 1)/n⌋`; a draw past the last whole bucket (fewer than `n` of the 2^64) is
    /// drawn again. Monotone in the raw draw, and a zero draw gives 0 at once (a rejection
    /// method that refused zeros would make a tape of zeros spin through them).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let width = u64::MAX / n;
        loop {
            let value = self.raw() / width;
            if value < n {
                return value;
            }
        }
    }

    /// A uniform value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "empty range");
        lo + self.below(hi - lo + 1)
    }

    /// `true` with probability `p`; a certain or impossible `p` draws nothing. `false` for the
    /// least draw.
    pub fn chance(&mut self, p: Ratio) -> bool {
        if p.numerator == 0 {
            return false;
        }
        if p.numerator >= p.denominator {
            return true;
        }
        self.below(p.denominator) >= p.denominator - p.numerator
    }

    /// A probability between `lo_ppm` and `hi_ppm` parts per million (inclusive).
    pub fn ppm(&mut self, lo_ppm: u64, hi_ppm: u64) -> Ratio {
        Ratio::ppm(self.range(lo_ppm, hi_ppm))
    }

    /// An exponentially distributed value with mean `mean`, in fixed point: `-mean · ln(1 - u)`
    /// for a uniform `u` of 64 bits, with the logarithm computed to 32 fractional bits in
    /// integer arithmetic. 0 for the least draw; at most about 44 × `mean`.
    pub fn exponential(&mut self, mean: u64) -> u64 {
        let x = self.raw();
        if x == 0 {
            return 0;
        }
        // 1 - u = y / 2^64 with y = 2^64 - x in 1..2^64, so -ln(1 - u) = ln 2 · (64 - log2 y).
        let y = x.wrapping_neg();
        let minus_log2 = (64u128 << 32) - log2_q32(y);
        // No overflow for any mean: below 2^102 at every step.
        let value = (((u128::from(mean) * minus_log2) >> 32) * LN2_Q32) >> 32;
        u64::try_from(value).unwrap_or(u64::MAX)
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

/// log2 of `y` (not zero) in Q32 fixed point: the integer part from the leading zeros, then
/// 32 fractional bits by repeated squaring of the mantissa.
fn log2_q32(y: u64) -> u128 {
    let whole = 63 - u128::from(y.leading_zeros());
    // The mantissa y / 2^whole in [1, 2) as Q62.
    let mut m = (u128::from(y) << 62) >> whole;
    let mut fraction = 0u128;
    for bit in (0..32).rev() {
        m = (m * m) >> 62;
        if m >= 2 << 62 {
            m >>= 1;
            fraction |= 1 << bit;
        }
    }
    (whole << 32) | fraction
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

    #[test]
    fn chance_follows_its_ratio() {
        let mut rng = SimRng::new(3, Stream::Faults);
        let hits = (0..100_000).filter(|_| rng.chance(ratio(1, 4))).count();
        assert!((24_000..26_000).contains(&hits), "{hits} of 100000 at 1/4");
        assert!(!rng.chance(Ratio::ZERO));
        assert!(rng.chance(ratio(3, 3)));
        assert_eq!(Ratio::ppm(1_500).to_string(), "0.1500%");
        assert_eq!(ratio(1, 3).as_ppm(), 333_333);
    }

    #[test]
    fn the_fixed_point_logarithm_is_exact_enough() {
        for y in [1u64, 2, 3, 10, 1 << 20, 123_456_789, u64::MAX] {
            let exact = (y as f64).log2();
            let fixed = log2_q32(y) as f64 / (1u64 << 32) as f64;
            assert!(
                (exact - fixed).abs() < 1e-8,
                "log2({y}): {fixed} vs {exact}"
            );
        }
    }

    #[test]
    fn the_exponential_draw_has_its_mean() {
        let mut rng = SimRng::new(4, Stream::Network);
        let n = 200_000u64;
        let sum: u64 = (0..n).map(|_| rng.exponential(1_000_000)).sum();
        let mean = sum / n;
        assert!((980_000..1_020_000).contains(&mean), "mean {mean}");
    }

    #[test]
    fn a_recorded_tape_replays_the_same_draws_and_a_short_one_goes_on_with_the_seed() {
        let mut entropy = Entropy::seed(9);
        entropy.record = true;
        let mut rng = entropy.rng(Stream::Workload);
        let draws: Vec<u64> = (0..100).map(|i| rng.below(1 + i % 7)).collect();
        let mut tape = Tape::default();
        tape.set_stream(Stream::Workload, rng.take_record());
        let decoded = Tape::decode(&tape.encode()).expect("round trip");
        assert_eq!(decoded, tape);
        let replay = Entropy {
            seed: 9,
            tape: Some(Arc::new(decoded)),
            record: false,
        };
        let mut again = replay.rng(Stream::Workload);
        let replayed: Vec<u64> = (0..100).map(|i| again.below(1 + i % 7)).collect();
        assert_eq!(replayed, draws);
        // Past its end the tape goes on with the seed's own stream from there.
        let mut seed_stream = Entropy::seed(9).rng(Stream::Workload);
        let seed_draws: Vec<u64> = (0..150).map(|_| seed_stream.next_u64()).collect();
        let mut short = Tape::default();
        short.set_stream(Stream::Workload, seed_draws[..40].to_vec());
        let mut rng = Entropy {
            seed: 9,
            tape: Some(Arc::new(short)),
            record: false,
        }
        .rng(Stream::Workload);
        let drawn: Vec<u64> = (0..150).map(|_| rng.next_u64()).collect();
        assert_eq!(drawn, seed_draws);
        // A zero is the least draw too.
        let mut zeros = Tape::default();
        zeros.set_stream(Stream::Faults, vec![0; 4]);
        let mut rng = Entropy {
            seed: 0,
            tape: Some(Arc::new(zeros)),
            record: false,
        }
        .rng(Stream::Faults);
        assert!(!rng.chance(ratio(1, 2)));
        assert_eq!(rng.exponential(1_000), 0);
    }

    #[test]
    fn a_damaged_tape_file_is_refused() {
        let mut tape = Tape::default();
        tape.set_stream(Stream::Network, vec![1, 2, 3]);
        let bytes = tape.encode();
        assert!(Tape::decode(&bytes[..bytes.len() - 3]).is_err());
        assert!(Tape::decode(b"DPTAPE0\n").is_err());
        let mut extra = bytes;
        extra.extend_from_slice(&[0; 8]);
        assert!(Tape::decode(&extra).is_err());
        let mut huge = TAPE_MAGIC.to_vec();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Tape::decode(&huge).unwrap_err().contains("claims"));
    }
}

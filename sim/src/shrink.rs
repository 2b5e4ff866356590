//! Shrinking a failing seed (issue 14): the smallest run that still fails the *same* check.
//!
//! A run is its seed plus [`Overrides`]. Shrinking turns faults off one at a time, makes the
//! world smaller (fewer hosts, clients, workers, paths) and the fault phase shorter, keeping
//! every step after which the run still fails with the same check, and repeats until a pass
//! changes nothing. Each subsystem draws from its own stream, so turning one fault off leaves
//! every other draw of the seed as it was: a step changes one thing.
//!
//! The result is a replay file (`seed=`, `no-fault=`, `set=` lines) that `dataplane-sim
//! replay FILE` runs.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::options::Options;
use crate::overrides::{FaultKind, Overrides, SetKey, Setting};
use crate::rng::{Entropy, Stream, Tape};

/// The check a failure message names: its first segment (`S25`, `model`, `barrier`,
/// `horizon`…), with the property of a liveness failure (`liveness … L4`). Paths, addresses,
/// times and counts are left out, so the same defect found elsewhere in the namespace still
/// counts as the same failure.
pub fn check_of(failure: &str) -> String {
    // "at 12.000000s: " is the time, not the check.
    let rest = failure
        .strip_prefix("at ")
        .and_then(|r| r.split_once(": ").map(|(_, r)| r))
        .unwrap_or(failure);
    let mut segments = rest.split(": ");
    let first = segments.next().unwrap_or_default().to_owned();
    if first.starts_with("liveness")
        && let Some(property) = segments.next().and_then(|s| s.split_whitespace().next())
    {
        // The bound in parentheses grows with the rotation's drain: not part of the check.
        return format!("liveness: {property}");
    }
    if first == "panicked" {
        // The panic's own words name the broken assertion.
        let words: Vec<&str> = segments
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .take(4)
            .collect();
        return format!("panicked: {}", words.join(" "));
    }
    // A check named by its subject (`probe n3.1/102 was not served within 30s…`, `n1.1/100
    // op 1`): the same check whichever actor, op or duration it names. Check ids (`S34`,
    // `L11/L12`) stay as they are.
    first
        .split(' ')
        .map(|word| {
            let id = word
                .split('/')
                .all(|part| part.starts_with(|c: char| c.is_ascii_uppercase()));
            if id {
                word.to_owned()
            } else {
                mask_numbers(word)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with every run of digits replaced by `*`.
fn mask_numbers(text: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                masked.push('*');
            }
            in_number = true;
        } else {
            masked.push(c);
            in_number = false;
        }
    }
    masked
}

/// One run the shrinker tries: overrides on the seed's draw, and the draws themselves when
/// shrinking the tape (`None`: the seed's own streams).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidate {
    /// Overrides on the drawn options.
    pub overrides: Overrides,
    /// The decision tape to draw from.
    pub tape: Option<Arc<Tape>>,
}

/// What a tried run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trial {
    /// Its failure, if it failed.
    pub failure: Option<String>,
    /// Events it processed before it ended.
    pub events: u64,
    /// The draws it made (recorded), if it did not panic.
    pub tape: Option<Tape>,
}

/// A shrunk failing run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shrunk {
    /// The seed.
    pub seed: u64,
    /// The smallest failing run: its overrides and, after the tape passes, its draws.
    pub best: Candidate,
    /// Its failure.
    pub failure: String,
    /// Its events.
    pub events: u64,
    /// The check both the original and the shrunk run fail.
    pub check: String,
    /// How many runs shrinking took.
    pub runs: usize,
    /// Whether the runner stopped it (its time was up) before a pass changed nothing.
    pub stopped: bool,
}

impl Shrunk {
    /// The replay file; `tape_file` names the file the tape is written to (relative to the
    /// replay file), if the run has one.
    pub fn replay_file(&self, tape_file: Option<&str>) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "# dataplane-sim replay file: the smallest run found that fails {}",
            self.check
        );
        // A failure may run over several lines: each is a comment.
        for line in self.failure.lines() {
            let _ = writeln!(text, "# failure: {line}");
        }
        let _ = writeln!(text, "seed={}", self.seed);
        for kind in &self.best.overrides.no_faults {
            let _ = writeln!(text, "no-fault={kind}");
        }
        for setting in &self.best.overrides.settings {
            let _ = writeln!(text, "set={setting}");
        }
        if let (Some(file), Some(_)) = (tape_file, &self.best.tape) {
            let _ = writeln!(text, "tape={file}");
        }
        text
    }
}

/// What a replay file names: the seed, its overrides and the tape file (as written, relative
/// to the replay file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// The seed.
    pub seed: u64,
    /// The overrides.
    pub overrides: Overrides,
    /// The tape file, if the run draws from one.
    pub tape: Option<String>,
}

/// Reads a replay file.
pub fn parse_replay(text: &str) -> Result<Replay, String> {
    let mut seed = None;
    let mut overrides = Overrides::default();
    let mut tape = None;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: String| format!("line {}: {why}", number + 1);
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| bad(format!("expected KEY=VALUE, got {line:?}")))?;
        match key {
            "seed" => {
                seed = Some(
                    value
                        .parse()
                        .map_err(|_| bad(format!("bad seed {value:?}")))?,
                );
            }
            "no-fault" => overrides.no_faults.push(value.parse().map_err(bad)?),
            "set" => overrides.settings.push(value.parse().map_err(bad)?),
            "tape" if !value.is_empty() => tape = Some(value.to_owned()),
            other => return Err(bad(format!("unknown key {other:?}"))),
        }
    }
    Ok(Replay {
        seed: seed.ok_or("no seed= line")?,
        overrides,
        tape,
    })
}

/// The streams the tape passes shrink, in order: what clients do first (fewer operations),
/// then the faults, then everything else. The options stream is shrunk through overrides.
const TAPE_STREAMS: [Stream; 7] = [
    Stream::Workload,
    Stream::Faults,
    Stream::Network,
    Stream::Spoof,
    Stream::Environment,
    Stream::Disk,
    Stream::Storage,
];

/// Whether tape `a` comes before tape `b` in shortlex order: fewer draws, or as many and the
/// first stream that differs less, compared draw by draw.
fn shortlex_less(a: &Tape, b: &Tape) -> bool {
    if a.len() != b.len() {
        return a.len() < b.len();
    }
    for stream in Stream::ALL {
        match a.stream(stream).cmp(b.stream(stream)) {
            std::cmp::Ordering::Equal => continue,
            order => return order == std::cmp::Ordering::Less,
        }
    }
    false
}

/// The shrinker's state: the best failing run so far and the runner.
struct Search<'a> {
    seed: u64,
    check: String,
    best: Candidate,
    failure: String,
    events: u64,
    runs: usize,
    stopped: bool,
    run: &'a mut dyn FnMut(&Candidate, u64) -> Option<Trial>,
}

impl Search<'_> {
    /// Runs `candidate`; keeps it if it fails the same check with no more events. A candidate
    /// with a tape is kept as the draws it actually made (the tape's unused end goes).
    fn attempt(&mut self, candidate: Candidate) -> bool {
        if self.stopped {
            return false;
        }
        // A candidate that has not failed within the best run's events is no smaller: stop
        // it there (most candidates pass, and a passing run would otherwise run to its end).
        let Some(trial) = (self.run)(&candidate, self.events) else {
            self.stopped = true;
            return false;
        };
        self.runs += 1;
        // Smaller: fewer events; or as many, and a tape that is shorter or, as long, less
        // (shortlex, so the tape passes end); an options change is a reduction by itself.
        let smaller = match (&candidate.tape, &self.best.tape) {
            (Some(new), Some(old)) if new != old => {
                trial.events < self.events
                    || (trial.events == self.events && shortlex_less(new, old))
            }
            _ => trial.events <= self.events,
        };
        match trial.failure {
            Some(failure) if check_of(&failure) == self.check && smaller => {
                self.best = candidate;
                self.failure = failure;
                self.events = trial.events;
                true
            }
            _ => false,
        }
    }

    /// The best run with `key` set to `value`.
    fn with_setting(&self, key: SetKey, value: u64) -> Candidate {
        Candidate {
            overrides: with_setting(&self.best.overrides, key, value),
            tape: self.best.tape.clone(),
        }
    }

    /// The best run with `stream`'s draws replaced.
    fn with_stream(&self, stream: Stream, values: Vec<u64>) -> Candidate {
        let mut tape = self.best.tape.as_deref().cloned().unwrap_or_default();
        tape.set_stream(stream, values);
        Candidate {
            overrides: self.best.overrides.clone(),
            tape: Some(Arc::new(tape)),
        }
    }

    fn stream(&self, stream: Stream) -> Vec<u64> {
        self.best
            .tape
            .as_ref()
            .map(|t| t.stream(stream).to_vec())
            .unwrap_or_default()
    }

    /// One pass over the options: faults off one at a time, a smaller world, a shorter fault
    /// phase. Whether anything changed.
    fn options_pass(&mut self) -> bool {
        let mut changed = false;
        // Every fault off at once first: many defects need none.
        let on: Vec<FaultKind> = FaultKind::ALL
            .iter()
            .map(|(kind, _)| *kind)
            .filter(|kind| !self.best.overrides.no_faults.contains(kind))
            .collect();
        if on.len() > 1 {
            let mut candidate = self.best.clone();
            candidate.overrides.no_faults.extend(on.iter().copied());
            changed |= self.attempt(candidate);
        }
        for (kind, _) in FaultKind::ALL {
            if self.best.overrides.no_faults.contains(&kind) {
                continue;
            }
            let mut candidate = self.best.clone();
            candidate.overrides.no_faults.push(kind);
            changed |= self.attempt(candidate);
        }
        // A smaller world: the smallest count that still fails, counting up.
        for key in [
            SetKey::Hosts,
            SetKey::ClientsMax,
            SetKey::WorkersMax,
            SetKey::Paths,
        ] {
            let (hosts, clients, workers, paths, _) = self.sizes();
            let (low, current) = match key {
                SetKey::Hosts => (1, hosts),
                SetKey::ClientsMax => (0, clients),
                SetKey::WorkersMax => (0, workers),
                _ => (1, paths),
            };
            for value in low..current {
                if self.attempt(self.with_setting(key, value)) {
                    changed = true;
                    break;
                }
            }
        }
        // A shorter fault phase: halve it while it still fails.
        loop {
            let phase = self.sizes().4;
            if phase < 100 || !self.attempt(self.with_setting(SetKey::FaultPhaseMs, phase / 2)) {
                break;
            }
            changed = true;
        }
        // Sooner: a smaller compaction threshold (a defect of compaction needs fewer
        // mutations to show) and shorter pauses between operations: the smallest of floor,
        // 2 × floor, 4 × floor… below the current value that still fails.
        for (key, floor) in [
            (SetKey::CompactMinBytes, 512),
            (SetKey::ThinkMs, 1),
            (SetKey::WorkerThinkMs, 1),
        ] {
            let current = self.setting(key);
            let mut value = floor;
            while value < current {
                if self.attempt(self.with_setting(key, value)) {
                    changed = true;
                    break;
                }
                value = value.saturating_mul(2);
            }
        }
        changed
    }

    /// The best run's value of `key` (of the settings the shrinker halves).
    fn setting(&self, key: SetKey) -> u64 {
        let options = options_of(self.seed, &self.best);
        match key {
            SetKey::CompactMinBytes => options.disk.compact_min_bytes,
            SetKey::ThinkMs => options.workload.think_mean.as_nanos() / 1_000_000,
            SetKey::WorkerThinkMs => options.host.think_mean.as_nanos() / 1_000_000,
            _ => 0,
        }
    }

    /// One pass over the tape, stream by stream: delete, zero or halve stretches of it, from
    /// halves down to sixty-fourths (deleting workload draws removes operations, zeroing fault
    /// draws removes faults, halving raw draws makes delays shorter and picks earlier
    /// choices). Whether anything changed.
    fn tape_pass(&mut self) -> bool {
        let mut changed = false;
        for stream in TAPE_STREAMS {
            let n = self.stream(stream).len();
            if n == 0 {
                continue;
            }
            // Delete, then zero, stretches.
            for parts in [2, 4, 8, 16, 32, 64] {
                let size = self.stream(stream).len().div_ceil(parts);
                if size == 0 {
                    break;
                }
                let mut start = 0;
                while start < self.stream(stream).len() && !self.stopped {
                    let values = self.stream(stream);
                    let end = (start + size).min(values.len());
                    let mut deleted = values.clone();
                    deleted.drain(start..end);
                    if self.attempt(self.with_stream(stream, deleted)) {
                        changed = true;
                        continue;
                    }
                    if values[start..end].iter().any(|&v| v != 0) {
                        let mut zeroed = values.clone();
                        zeroed[start..end].fill(0);
                        if self.attempt(self.with_stream(stream, zeroed)) {
                            changed = true;
                        } else {
                            let mut halved = values;
                            for v in &mut halved[start..end] {
                                *v >>= 1;
                            }
                            changed |= self.attempt(self.with_stream(stream, halved));
                        }
                    }
                    start = end;
                }
            }
        }
        changed
    }

    /// The best run's hosts, most clients and workers on a host, paths, and fault phase (ms).
    fn sizes(&self) -> (u64, u64, u64, u64, u64) {
        sizes(self.seed, &self.best)
    }
}

/// Shrinks `seed` (starting from `start`): `run` runs a candidate, stopping it unjudged after
/// the given number of events, and says what it did (`None`: stop, the time is up). First the options (faults, world size, fault phase) on the
/// seed's own draws, then the decision tape of the smallest run so far, then the options
/// again on that tape, each repeated until a pass changes nothing. Returns `None` if the
/// starting run passes.
pub fn shrink(
    seed: u64,
    start: &Overrides,
    run: &mut dyn FnMut(&Candidate, u64) -> Option<Trial>,
) -> Option<Shrunk> {
    let first = Candidate {
        overrides: start.clone(),
        tape: None,
    };
    let trial = run(&first, u64::MAX)?;
    let failure = trial.failure?;
    let mut search = Search {
        seed,
        check: check_of(&failure),
        best: first,
        failure,
        events: trial.events,
        runs: 1,
        stopped: false,
        run,
    };
    for _ in 0..4 {
        if !search.options_pass() {
            break;
        }
    }
    // The tape of the smallest run so far: record it by running it once more.
    let from_seed = search.best.clone();
    if let Some(Trial {
        failure: Some(failure),
        events,
        tape: Some(tape),
    }) = (search.run)(&from_seed, search.events)
        && check_of(&failure) == search.check
    {
        search.runs += 1;
        search.best.tape = Some(Arc::new(tape));
        search.events = search.events.min(events);
        for _ in 0..4 {
            let tape_changed = search.tape_pass();
            let options_changed = search.options_pass();
            if !(tape_changed || options_changed) {
                break;
            }
        }
    }
    Some(Shrunk {
        seed,
        best: search.best,
        failure: search.failure,
        events: search.events,
        check: search.check,
        runs: search.runs,
        stopped: search.stopped,
    })
}

/// `overrides` with `key` set to `value` (replacing an earlier setting of it).
fn with_setting(overrides: &Overrides, key: SetKey, value: u64) -> Overrides {
    let mut candidate = overrides.clone();
    candidate.settings.retain(|s| s.key != key);
    candidate.settings.push(Setting { key, value });
    candidate
}

/// The options `candidate` runs with.
fn options_of(seed: u64, candidate: &Candidate) -> Options {
    let mut options = Options::draw_from(&Entropy {
        seed,
        tape: candidate.tape.clone(),
        record: false,
    });
    candidate.overrides.apply(&mut options);
    options
}

/// The run's hosts, most clients and workers on a host, paths, and fault phase (ms).
fn sizes(seed: u64, candidate: &Candidate) -> (u64, u64, u64, u64, u64) {
    let options = options_of(seed, candidate);
    let max = |v: &[u32]| u64::from(v.iter().copied().max().unwrap_or(0));
    (
        options.clients_per_host.len() as u64,
        max(&options.clients_per_host),
        max(&options.host.workers),
        options.paths.len() as u64,
        options.fault_phase.as_nanos() / 1_000_000,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_leaves_out_times_paths_and_addresses() {
        assert_eq!(
            check_of("at 1.5s: liveness (120s after the heal): L4: /a still reserved by 0001"),
            "liveness: L4"
        );
        assert_eq!(
            check_of("at 9s: liveness (124221ms after the heal): retention: issuer n2.1~4"),
            "liveness: retention"
        );
        assert_eq!(
            check_of("at 3s: S25: Retire(n1.1/5) waited 3 ticks"),
            check_of("at 9s: S25: Retire(n2.1/7) waited 4 ticks")
        );
        assert_ne!(check_of("at 3s: S25: x"), check_of("at 3s: S24: x"));
        assert_eq!(
            check_of(
                "at 9s: probe n3.1/102 was not served within 30s after the load stopped: still at Write"
            ),
            "probe n*.*/* was not served within *s after the load stopped"
        );
        assert_eq!(
            check_of("at 1s: n1.1/100 op 1: x"),
            check_of("at 2s: n2.1/101 op 7: y")
        );
        assert_eq!(
            check_of("panicked: host invariant broken after an input: x"),
            "panicked: host invariant broken after"
        );
    }

    #[test]
    fn shrinking_keeps_only_what_the_failure_needs() {
        // A made-up defect: the run fails S25 while host crashes are on, at least two hosts
        // run and the fault phase lasts at least 5 s; without host crashes it fails another
        // check (which must not count).
        let seed = (0..64)
            .find(|s| {
                let o = Options::draw(*s);
                o.host_crashes.is_some() && o.clients_per_host.len() >= 3
            })
            .expect("a seed with host crashes and three hosts");
        let mut run = |c: &Candidate, _limit: u64| {
            let mut options = Options::draw(seed);
            c.overrides.apply(&mut options);
            let failure = if options.host_crashes.is_none() {
                Some("at 1s: model: something else".to_owned())
            } else {
                (options.clients_per_host.len() >= 2
                    && options.fault_phase.as_nanos() >= 5_000_000_000)
                    .then(|| "at 2s: S25: Retire(n1.1/5) waited 3 ticks".to_owned())
            };
            Some(Trial {
                failure,
                events: 10,
                tape: None,
            })
        };
        let shrunk = shrink(seed, &Overrides::default(), &mut run).expect("it fails");
        assert_eq!(shrunk.check, "S25");
        let overrides = &shrunk.best.overrides;
        assert!(!overrides.no_faults.contains(&FaultKind::HostCrashes));
        assert!(overrides.no_faults.contains(&FaultKind::Loss));
        let (hosts, clients, workers, _, phase) = sizes(seed, &shrunk.best);
        assert_eq!((hosts, clients, workers), (2, 0, 0));
        assert!((5_000..10_000).contains(&phase), "fault phase {phase} ms");
        let replay = parse_replay(&shrunk.replay_file(None)).unwrap();
        let mut multi_line = shrunk.clone();
        multi_line.failure = "at 1s: model: differs\nexpected but not sent: [x]".to_owned();
        assert!(parse_replay(&multi_line.replay_file(None)).is_ok());
        assert_eq!((replay.seed, &replay.overrides), (seed, overrides));
        assert_eq!(replay.tape, None);
        // A passing seed has nothing to shrink.
        assert_eq!(
            shrink(seed, &Overrides::default(), &mut |_, _| Some(
                Trial::default()
            )),
            None
        );
    }

    #[test]
    fn shrinking_the_tape_keeps_the_draws_the_failure_needs() {
        // A made-up defect over the draws: the run fails when some workload draw is in the top
        // eighth and some fault draw is odd; its events grow with the workload draws it makes
        // (it stops at the failing one). Draws past a tape's end are least draws (0).
        let seed = 1;
        let recorded: Vec<u64> = {
            let mut rng = crate::rng::SimRng::new(seed, Stream::Workload);
            (0..500).map(|_| rng.next_u64()).collect()
        };
        let faults: Vec<u64> = (0..300).map(|i| i * 7 + 1).collect();
        let mut run = |c: &Candidate, _limit: u64| {
            let (work, fault) = match &c.tape {
                Some(t) => (
                    t.stream(Stream::Workload).to_vec(),
                    t.stream(Stream::Faults).to_vec(),
                ),
                None => (recorded.clone(), faults.clone()),
            };
            let hit = work.iter().position(|&v| v >= u64::MAX / 8 * 7);
            let odd = fault.iter().any(|&v| v % 2 == 1);
            let used = hit.map_or(work.len(), |i| i + 1);
            let mut tape = Tape::default();
            tape.set_stream(Stream::Workload, work[..used].to_vec());
            tape.set_stream(Stream::Faults, fault);
            Some(Trial {
                failure: (hit.is_some() && odd).then(|| "at 1s: model: wrong".to_owned()),
                events: used as u64,
                tape: Some(tape),
            })
        };
        let shrunk = shrink(seed, &Overrides::default(), &mut run).expect("it fails");
        let tape = shrunk.best.tape.expect("the tape was shrunk");
        assert_eq!(shrunk.events, 1, "one workload draw is enough");
        assert_eq!(tape.stream(Stream::Workload).len(), 1);
        assert_eq!(
            tape.stream(Stream::Faults)
                .iter()
                .filter(|&&v| v != 0)
                .count(),
            1,
            "one odd fault draw is enough: {:?}",
            tape.stream(Stream::Faults)
        );
        assert_eq!(shrunk.check, "model");
        // A runner out of time stops the shrink with what it has.
        let mut calls = 0;
        let mut limited = |c: &Candidate, limit: u64| {
            calls += 1;
            (calls <= 3).then(|| run(c, limit)).flatten()
        };
        let stopped = shrink(seed, &Overrides::default(), &mut limited).expect("it fails");
        assert!(stopped.stopped);
        assert!(stopped.runs <= 3);
    }

    #[test]
    fn a_bad_replay_file_is_refused_with_its_line() {
        assert!(
            parse_replay("seed=1\nno-fault=nonsense\n")
                .unwrap_err()
                .starts_with("line 2")
        );
        assert!(parse_replay("no-fault=loss\n").is_err());
        assert!(parse_replay("seed=x\n").is_err());
    }
}

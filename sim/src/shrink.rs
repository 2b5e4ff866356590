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

use crate::options::Options;
use crate::overrides::{FaultKind, Overrides, SetKey, Setting};

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
    first
}

/// A shrunk failing run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shrunk {
    /// The seed.
    pub seed: u64,
    /// What the smallest failing run overrides.
    pub overrides: Overrides,
    /// Its failure.
    pub failure: String,
    /// The check both the original and the shrunk run fail.
    pub check: String,
    /// How many runs shrinking took.
    pub runs: usize,
}

impl Shrunk {
    /// The replay file.
    pub fn replay_file(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "# dataplane-sim replay file: the smallest run found that fails {}",
            self.check
        );
        let _ = writeln!(text, "# failure: {}", self.failure);
        let _ = writeln!(text, "seed={}", self.seed);
        for kind in &self.overrides.no_faults {
            let _ = writeln!(text, "no-fault={kind}");
        }
        for setting in &self.overrides.settings {
            let _ = writeln!(text, "set={setting}");
        }
        text
    }
}

/// Reads a replay file: its seed and overrides.
pub fn parse_replay(text: &str) -> Result<(u64, Overrides), String> {
    let mut seed = None;
    let mut overrides = Overrides::default();
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
            other => return Err(bad(format!("unknown key {other:?}"))),
        }
    }
    Ok((seed.ok_or("no seed= line")?, overrides))
}

/// Shrinks `seed` (starting from `start`): `run` runs the seed under some overrides and
/// returns its failure, if it failed. Returns `None` if the starting run passes.
pub fn shrink(
    seed: u64,
    start: &Overrides,
    run: &mut dyn FnMut(&Overrides) -> Option<String>,
) -> Option<Shrunk> {
    let mut runs = 1;
    let failure = run(start)?;
    let check = check_of(&failure);
    let mut best = start.clone();
    let mut best_failure = failure;
    let mut attempt = |candidate: Overrides,
                       best: &mut Overrides,
                       best_failure: &mut String,
                       runs: &mut usize|
     -> bool {
        *runs += 1;
        match run(&candidate) {
            Some(f) if check_of(&f) == check => {
                *best = candidate;
                *best_failure = f;
                true
            }
            _ => false,
        }
    };
    // At most a few passes: each pass only removes, so it ends.
    for _ in 0..4 {
        let mut changed = false;
        // Faults, one at a time.
        for (kind, _) in FaultKind::ALL {
            if best.no_faults.contains(&kind) {
                continue;
            }
            let mut candidate = best.clone();
            candidate.no_faults.push(kind);
            changed |= attempt(candidate, &mut best, &mut best_failure, &mut runs);
        }
        // A smaller world: the smallest count that still fails, counting up.
        for (key, current) in [
            (SetKey::Hosts, sizes(seed, &best).0),
            (SetKey::ClientsMax, sizes(seed, &best).1),
            (SetKey::WorkersMax, sizes(seed, &best).2),
            (SetKey::Paths, sizes(seed, &best).3),
        ] {
            let low = if matches!(key, SetKey::Hosts | SetKey::Paths) {
                1
            } else {
                0
            };
            for value in low..current {
                let candidate = with_setting(&best, key, value);
                if attempt(candidate, &mut best, &mut best_failure, &mut runs) {
                    changed = true;
                    break;
                }
            }
        }
        // A shorter fault phase: halve it while it still fails.
        loop {
            let phase = sizes(seed, &best).4;
            if phase < 100 {
                break;
            }
            let candidate = with_setting(&best, SetKey::FaultPhaseMs, phase / 2);
            if !attempt(candidate, &mut best, &mut best_failure, &mut runs) {
                break;
            }
            changed = true;
        }
        if !changed {
            break;
        }
    }
    Some(Shrunk {
        seed,
        overrides: best,
        failure: best_failure,
        check,
        runs,
    })
}

/// `overrides` with `key` set to `value` (replacing an earlier setting of it).
fn with_setting(overrides: &Overrides, key: SetKey, value: u64) -> Overrides {
    let mut candidate = overrides.clone();
    candidate.settings.retain(|s| s.key != key);
    candidate.settings.push(Setting { key, value });
    candidate
}

/// The run's hosts, most clients and workers on a host, paths, and fault phase (ms).
fn sizes(seed: u64, overrides: &Overrides) -> (u64, u64, u64, u64, u64) {
    let mut options = Options::draw(seed);
    overrides.apply(&mut options);
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
        let mut run = |o: &Overrides| {
            let mut options = Options::draw(seed);
            o.apply(&mut options);
            if options.host_crashes.is_none() {
                return Some("at 1s: model: something else".to_owned());
            }
            (options.clients_per_host.len() >= 2 && options.fault_phase.as_nanos() >= 5_000_000_000)
                .then(|| "at 2s: S25: Retire(n1.1/5) waited 3 ticks".to_owned())
        };
        let shrunk = shrink(seed, &Overrides::default(), &mut run).expect("it fails");
        assert_eq!(shrunk.check, "S25");
        assert!(!shrunk.overrides.no_faults.contains(&FaultKind::HostCrashes));
        assert!(shrunk.overrides.no_faults.contains(&FaultKind::Loss));
        let (hosts, clients, workers, _, phase) = sizes(seed, &shrunk.overrides);
        assert_eq!((hosts, clients, workers), (2, 0, 0));
        assert!((5_000..10_000).contains(&phase), "fault phase {phase} ms");
        let (replayed_seed, replayed) = parse_replay(&shrunk.replay_file()).unwrap();
        assert_eq!((replayed_seed, &replayed), (seed, &shrunk.overrides));
        // A passing seed has nothing to shrink.
        assert_eq!(shrink(seed, &Overrides::default(), &mut |_| None), None);
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

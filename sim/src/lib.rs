//! # dataplane-sim
//!
//! A seeded, deterministic, discrete-event fault simulator for the dataplane machines. One
//! `u64` seed derives a whole run: topology, fault kinds and rates, workload and every delay.
//! The world injects lost, duplicated and reordered frames, partitions, node crashes with torn
//! log tails, fsync failures and route flaps; checkers outside the production code verify every
//! reply against a reference model and the SPEC §13 properties after every step, then a
//! liveness phase requires convergence once the faults stop. See `SIMULATION.md`.

pub mod check;
pub mod client;
pub mod clock;
pub mod disk;
pub mod host;
pub mod memory;
pub mod options;
pub mod overrides;
pub mod picture;
pub mod replicated;
pub mod results;
pub mod rng;
pub mod shrink;
pub mod swarm;
pub mod trace;
pub mod worker;
pub mod world;

use std::sync::Arc;
use std::time::Instant as WallInstant;

use rng::{Entropy, Tape};

pub use options::Options;
pub use overrides::Overrides;
pub use world::{Outcome, Stats, World};

/// What to run: a seed, overrides on its draw, and optionally a decision tape to draw from
/// instead of the seed's streams (issue 14).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunSpec {
    /// The seed (with a tape, only the run's label and its options' `seed`).
    pub seed: u64,
    /// Overrides applied to the drawn options.
    pub overrides: Overrides,
    /// The draws to replay, if not the seed's.
    pub tape: Option<Arc<Tape>>,
    /// Stop after this many events without judging the rest (liveness is not checked): a
    /// run stopped so passes.
    pub event_limit: Option<u64>,
}

impl RunSpec {
    /// The seed's own run.
    pub fn seed(seed: u64) -> RunSpec {
        RunSpec {
            seed,
            ..RunSpec::default()
        }
    }

    /// The seed's run with `overrides`.
    pub fn with_overrides(seed: u64, overrides: &Overrides) -> RunSpec {
        RunSpec {
            seed,
            overrides: overrides.clone(),
            ..RunSpec::default()
        }
    }

    fn entropy(&self, record: bool) -> Entropy {
        Entropy {
            seed: self.seed,
            tape: self.tape.clone(),
            record,
        }
    }
}

/// The result of one seed.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Wall-clock time of the run.
    pub wall: std::time::Duration,
    /// What the run did.
    pub stats: Stats,
    /// What it exercised.
    pub coverage: check::Coverage,
    /// The option summary printed at the start.
    pub options: String,
    /// The readable trace, if asked for.
    pub trace: Option<Vec<String>>,
    /// Every raw draw the run made, if asked for (not for a run that panicked).
    pub tape: Option<Tape>,
}

/// Runs seed `seed` to the end; a panic anywhere in the run (a core assertion, a simulator
/// bug) becomes the seed's failure instead of taking the process down.
pub fn run_seed_guarded(seed: u64, keep_trace: bool) -> RunReport {
    run_seed_guarded_with(seed, &Overrides::default(), keep_trace)
}

/// [`run_seed_guarded`] with overrides applied to the seed's draw.
pub fn run_seed_guarded_with(seed: u64, overrides: &Overrides, keep_trace: bool) -> RunReport {
    run_spec(&RunSpec::with_overrides(seed, overrides), keep_trace, false)
}

/// Runs `spec` to the end, keeping its readable trace and recording its tape when asked; a
/// panic becomes the run's failure.
pub fn run_spec(spec: &RunSpec, keep_trace: bool, record: bool) -> RunReport {
    let started = WallInstant::now();
    let (options, described) = drawn(spec, record);
    let header = described.clone();
    if options.replicas > 1 {
        let run = std::panic::AssertUnwindSafe(move || replicated::ReplWorld::new(options).run());
        return match std::panic::catch_unwind(run) {
            Ok((outcome, world)) => RunReport {
                seed: spec.seed,
                outcome,
                wall: started.elapsed(),
                stats: world.stats.clone(),
                coverage: world.checker.coverage,
                options: header,
                trace: None,
                tape: None,
            },
            Err(payload) => panicked(spec.seed, described, started, &*payload),
        };
    }
    let run = std::panic::AssertUnwindSafe(move || {
        let world = World::new(options, keep_trace);
        let (outcome, mut world) = world.run();
        let tape = record.then(|| world.take_tape());
        (outcome, world, tape)
    });
    match std::panic::catch_unwind(run) {
        Ok((outcome, world, tape)) => RunReport {
            seed: spec.seed,
            outcome,
            wall: started.elapsed(),
            stats: world.stats.clone(),
            coverage: world.checker.coverage.clone(),
            options: header,
            trace: world.trace.lines().map(<[String]>::to_vec),
            tape,
        },
        // `&*payload`: the panic's own value, not the box around it (whose type is no
        // string, so its message would be lost).
        Err(payload) => panicked(spec.seed, described, started, &*payload),
    }
}

/// The report of a run that panicked: the panic is its failure.
fn panicked(
    seed: u64,
    options: String,
    started: WallInstant,
    payload: &(dyn std::any::Any + Send),
) -> RunReport {
    RunReport {
        seed,
        outcome: Outcome {
            failure: Some(format!("panicked: {}", panic_message(payload))),
            events: 0,
            sim_time: dataplane_core::time::Duration::ZERO,
            trace_hash: 0,
        },
        wall: started.elapsed(),
        stats: Stats::default(),
        coverage: check::Coverage::default(),
        options,
        trace: None,
        tape: None,
    }
}

/// Runs seed `seed` to the end.
pub fn run_seed(seed: u64, keep_trace: bool) -> RunReport {
    run_seed_with(seed, &Overrides::default(), keep_trace)
}

/// The options of `spec` with its overrides applied, and their description.
fn drawn(spec: &RunSpec, record: bool) -> (Options, String) {
    let mut options = Options::draw_from(&spec.entropy(record));
    spec.overrides.apply(&mut options);
    if let Some(limit) = spec.event_limit {
        options.event_limit = limit;
    }
    if options.replicas > 1 {
        // The replicas' logs are never compacted yet (snapshots are not built): no long-life
        // regime, and at most the longest ordinary fault phase.
        options.long_life = None;
        options.fault_phase = options.fault_phase.min(replicated::FAULT_PHASE_MAX);
    }
    let mut described = options.describe();
    if options.replicas > 1 {
        described.push_str(&format!(
            "# replicated: {} replicas, {} spares added and removed by membership changes (sim/src/replicated.rs)\n",
            replicated::FIRST_VOTERS,
            replicated::SLOTS - replicated::FIRST_VOTERS
        ));
    }
    if !spec.overrides.is_empty() {
        described.push_str(&format!("# overrides:{}\n", spec.overrides.arguments()));
    }
    if spec.tape.is_some() {
        described.push_str("# draws: from a tape, not the seed\n");
    }
    (options, described)
}

/// Runs `seed` (with `overrides`) streaming its trace to `files` as it goes: the options
/// first, then every event and note, then the violated check. A panic becomes the seed's
/// failure; the files then hold everything up to the panic (the caller appends the failure).
pub fn run_seed_traced(seed: u64, overrides: &Overrides, files: trace::TraceFiles) -> RunReport {
    run_spec_traced(&RunSpec::with_overrides(seed, overrides), files, false)
}

/// [`run_seed_traced`] for any [`RunSpec`], recording its tape when asked.
pub fn run_spec_traced(spec: &RunSpec, files: trace::TraceFiles, record: bool) -> RunReport {
    let started = WallInstant::now();
    let (options, described) = drawn(spec, record);
    if options.replicas > 1 {
        // The replicated mode writes no trace yet: the run itself, untraced.
        drop(files);
        return run_spec(spec, false, record);
    }
    let header = described.clone();
    let run = std::panic::AssertUnwindSafe(move || {
        let mut trace = trace::Trace::streaming(false, files);
        trace.header(&header);
        let world = World::with_trace(options, trace);
        // The run notes the violated check at its end itself.
        let (outcome, mut world) = world.run();
        world.trace.flush();
        let tape = record.then(|| world.take_tape());
        (
            outcome,
            world.stats.clone(),
            world.checker.coverage.clone(),
            tape,
        )
    });
    match std::panic::catch_unwind(run) {
        Ok((outcome, stats, coverage, tape)) => RunReport {
            seed: spec.seed,
            outcome,
            wall: started.elapsed(),
            stats,
            coverage,
            options: described,
            trace: None,
            tape,
        },
        // `&*payload`: the panic's own value, not the box around it (whose type is no
        // string, so its message would be lost).
        Err(payload) => panicked(spec.seed, described, started, &*payload),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// [`run_seed`] with overrides applied to the seed's draw (a panic is not caught).
pub fn run_seed_with(seed: u64, overrides: &Overrides, keep_trace: bool) -> RunReport {
    let spec = RunSpec::with_overrides(seed, overrides);
    let (options, described) = drawn(&spec, false);
    let started = WallInstant::now();
    let world = World::new(options, keep_trace);
    let (outcome, world) = world.run();
    let wall = started.elapsed();
    RunReport {
        seed,
        outcome,
        wall,
        stats: world.stats.clone(),
        coverage: world.checker.coverage.clone(),
        options: described,
        trace: world.trace.lines().map(<[String]>::to_vec),
        tape: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_reports_its_own_message() {
        let boxed: Box<dyn std::any::Any + Send> = Box::new("boom");
        let report = panicked(3, String::new(), WallInstant::now(), &*boxed);
        assert_eq!(report.outcome.failure.as_deref(), Some("panicked: boom"));
        let formatted: Box<dyn std::any::Any + Send> = Box::new(format!("at {}", 7));
        let report = panicked(3, String::new(), WallInstant::now(), &*formatted);
        assert_eq!(report.outcome.failure.as_deref(), Some("panicked: at 7"));
    }
}

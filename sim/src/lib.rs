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
pub mod rng;
pub mod shrink;
pub mod swarm;
pub mod trace;
pub mod worker;
pub mod world;

use std::time::Instant as WallInstant;

pub use options::Options;
pub use overrides::Overrides;
pub use world::{Outcome, Stats, World};

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
}

/// Runs seed `seed` to the end; a panic anywhere in the run (a core assertion, a simulator
/// bug) becomes the seed's failure instead of taking the process down.
pub fn run_seed_guarded(seed: u64, keep_trace: bool) -> RunReport {
    run_seed_guarded_with(seed, &Overrides::default(), keep_trace)
}

/// [`run_seed_guarded`] with overrides applied to the seed's draw.
pub fn run_seed_guarded_with(seed: u64, overrides: &Overrides, keep_trace: bool) -> RunReport {
    let started = WallInstant::now();
    match std::panic::catch_unwind(|| run_seed_with(seed, overrides, keep_trace)) {
        Ok(report) => report,
        Err(payload) => panicked(seed, drawn(seed, overrides).1, started, &*payload),
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
    }
}

/// Runs seed `seed` to the end.
pub fn run_seed(seed: u64, keep_trace: bool) -> RunReport {
    run_seed_with(seed, &Overrides::default(), keep_trace)
}

/// The options of `seed` with `overrides` applied, and their description.
fn drawn(seed: u64, overrides: &Overrides) -> (Options, String) {
    let mut options = Options::draw(seed);
    overrides.apply(&mut options);
    let mut described = options.describe();
    if !overrides.is_empty() {
        described.push_str(&format!("# overrides:{}\n", overrides.arguments()));
    }
    (options, described)
}

/// Runs `seed` (with `overrides`) streaming its trace to `files` as it goes: the options
/// first, then every event and note, then the violated check. A panic becomes the seed's
/// failure; the files then hold everything up to the panic (the caller appends the failure).
pub fn run_seed_traced(seed: u64, overrides: &Overrides, files: trace::TraceFiles) -> RunReport {
    let started = WallInstant::now();
    let (options, described) = drawn(seed, overrides);
    let header = described.clone();
    let run = std::panic::AssertUnwindSafe(move || {
        let mut trace = trace::Trace::streaming(false, files);
        trace.header(&header);
        let world = World::with_trace(options, trace);
        // The run notes the violated check at its end itself.
        let (outcome, mut world) = world.run();
        world.trace.flush();
        (outcome, world.stats.clone(), world.checker.coverage.clone())
    });
    match std::panic::catch_unwind(run) {
        Ok((outcome, stats, coverage)) => RunReport {
            seed,
            outcome,
            wall: started.elapsed(),
            stats,
            coverage,
            options: described,
            trace: None,
        },
        // `&*payload`: the panic's own value, not the box around it (whose type is no
        // string, so its message would be lost).
        Err(payload) => panicked(seed, described, started, &*payload),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// [`run_seed`] with overrides applied to the seed's draw.
pub fn run_seed_with(seed: u64, overrides: &Overrides, keep_trace: bool) -> RunReport {
    let (options, described) = drawn(seed, overrides);
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

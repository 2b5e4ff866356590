//! Many seeds across threads: progress, sharding across machines, the determinism check, and
//! the aggregated coverage ("sometimes") report.

use std::io::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration as WallDuration, Instant as WallInstant};

use crate::check::{Coverage, EXPECTED_COVERAGE};
use crate::{RunReport, run_seed_guarded};

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwarmConfig {
    /// First seed (inclusive).
    pub first: u64,
    /// Last seed (exclusive).
    pub end: u64,
    /// Worker threads.
    pub jobs: usize,
    /// Run only the seeds `s` with `s % count == index`.
    pub shard: Option<(u64, u64)>,
    /// Run every seed twice and compare trace hashes.
    pub check_determinism: bool,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// One failing seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedFailure {
    /// The seed.
    pub seed: u64,
    /// What went wrong.
    pub message: String,
}

/// The aggregate of a swarm.
#[derive(Clone, Debug, Default)]
pub struct SwarmReport {
    /// Seeds run.
    pub seeds: u64,
    /// Seeds that passed.
    pub passed: u64,
    /// The failures, by seed.
    pub failures: Vec<SeedFailure>,
    /// Events processed (first runs only).
    pub events: u64,
    /// Simulated time (first runs only).
    pub sim_time: dataplane_core::time::Duration,
    /// Wall time of the swarm.
    pub wall: WallDuration,
    /// Sum of per-run wall times (CPU time spent simulating).
    pub busy: WallDuration,
    /// Aggregated coverage.
    pub coverage: Coverage,
    /// One line per long-life seed: its length, its mutations per proxy and the most
    /// operation records and log bytes the directory held.
    pub long_life: Vec<String>,
}

impl SwarmReport {
    /// Events per second of simulating, per core.
    pub fn events_per_core_second(&self) -> f64 {
        self.events as f64 / self.busy.as_secs_f64().max(1e-9)
    }

    /// Simulated seconds per wall second, per core.
    pub fn compression(&self) -> f64 {
        self.sim_time.as_secs_f64() / self.busy.as_secs_f64().max(1e-9)
    }

    /// Expected coverage names that no run hit.
    pub fn never_exercised(&self) -> Vec<&'static str> {
        if std::env::var_os("DATAPLANE_SIM_COVERAGE").is_some() {
            for (name, count) in self.coverage.iter() {
                eprintln!("coverage {name} {count}");
            }
        }
        EXPECTED_COVERAGE
            .iter()
            .copied()
            .filter(|n| self.coverage.count(n) == 0)
            .collect()
    }

    /// The summary line (the swarm's last line of output).
    pub fn summary_line(&self) -> String {
        format!(
            "seeds={} passed={} failed={} events={} sim_time={:.1}s wall={:.2}s events_per_core_sec={:.0} compression={:.0}x",
            self.seeds,
            self.passed,
            self.failures.len(),
            self.events,
            self.sim_time.as_secs_f64(),
            self.wall.as_secs_f64(),
            self.events_per_core_second(),
            self.compression(),
        )
    }
}

fn check_one(seed: u64, determinism: bool) -> (RunReport, Option<String>) {
    let report = run_seed_guarded(seed, false);
    let mut failure = report.outcome.failure.clone();
    if failure.is_none() && determinism {
        let again = run_seed_guarded(seed, false);
        if again.outcome != report.outcome {
            failure = Some(format!(
                "nondeterministic: trace {:016x} then {:016x} (events {} then {})",
                report.outcome.trace_hash,
                again.outcome.trace_hash,
                report.outcome.events,
                again.outcome.events
            ));
        }
    }
    (report, failure)
}

/// Runs the swarm.
pub fn run_swarm(config: &SwarmConfig) -> SwarmReport {
    let seeds: Vec<u64> = (config.first..config.end)
        .filter(|s| config.shard.is_none_or(|(index, count)| s % count == index))
        .collect();
    let started = WallInstant::now();
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let results: Mutex<Vec<(RunReport, Option<String>)>> = Mutex::new(Vec::new());
    let total = seeds.len();
    std::thread::scope(|scope| {
        for _ in 0..config.jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let (report, failure) = check_one(seed, config.check_determinism);
                    if failure.is_some() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    results
                        .lock()
                        .expect("no worker panics while holding the lock")
                        .push((report, failure));
                    let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if config.progress {
                        draw_progress(finished, total as u64, failed.load(Ordering::Relaxed));
                    }
                }
            });
        }
    });
    if config.progress {
        eprintln!();
    }
    let mut results = results.into_inner().expect("workers finished");
    results.sort_by_key(|(r, _)| r.seed);
    let mut report = SwarmReport {
        seeds: total as u64,
        wall: started.elapsed(),
        ..SwarmReport::default()
    };
    for (run, failure) in results {
        report.events += run.outcome.events;
        report.sim_time = report.sim_time.saturating_add(run.outcome.sim_time);
        report.busy += run.wall;
        report.coverage.merge(&run.coverage);
        if run.options.contains("# long-life:") {
            let s = &run.stats;
            report.long_life.push(format!(
                "# long-life seed={} sim_time={:.0}s mutations_per_node={:?} records_max={} log_bytes_max={}",
                run.seed,
                run.outcome.sim_time.as_secs_f64(),
                s.operations_per_node,
                s.records_max,
                s.log_bytes_max
            ));
        }
        match failure {
            Some(message) => report.failures.push(SeedFailure {
                seed: run.seed,
                message,
            }),
            None => report.passed += 1,
        }
    }
    report
}

fn draw_progress(done: u64, total: u64, failed: u64) {
    const WIDTH: u64 = 40;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r[{bar}] {done}/{total} failed={failed}");
    let _ = err.flush();
}

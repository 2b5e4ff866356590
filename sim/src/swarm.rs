//! Many seeds across threads: progress, sharding across machines, the determinism check, and
//! the aggregated coverage ("sometimes") report.

use std::io::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration as WallDuration, Instant as WallInstant};

use crate::check::{Coverage, EXPECTED_COVERAGE};
use crate::overrides::Overrides;
use crate::{RunReport, run_seed_guarded_with};

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
    /// Overrides applied to every seed's draw.
    pub overrides: Overrides,
    /// Stop at the lowest failing seed: seeds above the lowest failure found so far are not
    /// started (the seeds below it still run, so the lowest failing seed is exact).
    pub first_failure: bool,
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
        let expected = if self.coverage.count("mode.replicated") > 0 {
            crate::replicated::REPLICATED_COVERAGE
        } else {
            EXPECTED_COVERAGE
        };
        expected
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

fn check_one(seed: u64, overrides: &Overrides, determinism: bool) -> (RunReport, Option<String>) {
    let report = run_seed_guarded_with(seed, overrides, false);
    let mut failure = report.outcome.failure.clone();
    if failure.is_none() && determinism {
        let again = run_seed_guarded_with(seed, overrides, false);
        if again.outcome != report.outcome {
            failure = Some(format!(
                "nondeterministic: trace {:016x} then {:016x} (events {} then {}){}",
                report.outcome.trace_hash,
                again.outcome.trace_hash,
                report.outcome.events,
                again.outcome.events,
                first_divergence(seed, overrides)
            ));
        }
    }
    (report, failure)
}

/// Runs `seed` twice more with readable traces and names the first event where they part
/// ways (the hash alone says only that they did).
fn first_divergence(seed: u64, overrides: &Overrides) -> String {
    let first = run_seed_guarded_with(seed, overrides, true).trace;
    let second = run_seed_guarded_with(seed, overrides, true).trace;
    let (Some(first), Some(second)) = (first, second) else {
        return "; no trace to compare (the run panicked)".to_owned();
    };
    divergence(&first, &second)
}

/// Where two traces part ways, as a sentence for the failure message.
pub fn divergence(first: &[String], second: &[String]) -> String {
    match first.iter().zip(second).position(|(a, b)| a != b) {
        Some(i) => format!(
            "; first divergence at trace line {}: `{}` then `{}`",
            i + 1,
            first[i],
            second[i]
        ),
        None if first.len() != second.len() => format!(
            "; the traces agree for {} lines, then one ends ({} and {} lines)",
            first.len().min(second.len()),
            first.len(),
            second.len()
        ),
        None => "; the two traced runs agree (the divergence depends on the run, not the seed)"
            .to_owned(),
    }
}

/// Runs the swarm.
pub fn run_swarm(config: &SwarmConfig) -> SwarmReport {
    run_swarm_reporting(config, &|_| {})
}

/// Runs the swarm, calling `on_failure` for each failing seed as soon as it fails (from the
/// worker thread that ran it).
pub fn run_swarm_reporting(
    config: &SwarmConfig,
    on_failure: &(dyn Fn(&SeedFailure) + Sync),
) -> SwarmReport {
    let seeds: Vec<u64> = (config.first..config.end)
        .filter(|s| config.shard.is_none_or(|(index, count)| s % count == index))
        .collect();
    let started = WallInstant::now();
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let lowest_failure = AtomicU64::new(u64::MAX);
    let results: Mutex<Vec<(RunReport, Option<String>)>> = Mutex::new(Vec::new());
    let total = seeds.len();
    std::thread::scope(|scope| {
        for _ in 0..config.jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    if config.first_failure && seed > lowest_failure.load(Ordering::Relaxed) {
                        break;
                    }
                    let (report, failure) =
                        check_one(seed, &config.overrides, config.check_determinism);
                    if let Some(message) = &failure {
                        failed.fetch_add(1, Ordering::Relaxed);
                        lowest_failure.fetch_min(seed, Ordering::Relaxed);
                        if config.progress {
                            // Off the progress bar's line.
                            eprint!("\r\x1b[2K");
                        }
                        on_failure(&SeedFailure {
                            seed,
                            message: message.clone(),
                        });
                    }
                    results
                        .lock()
                        .expect("no worker panics while holding the lock")
                        .push((report, failure));
                    let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if config.progress {
                        draw_progress(
                            finished,
                            total as u64,
                            failed.load(Ordering::Relaxed),
                            started.elapsed(),
                        );
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
        seeds: results.len() as u64,
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

fn draw_progress(done: u64, total: u64, failed: u64, elapsed: WallDuration) {
    const WIDTH: u64 = 40;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r[{bar}] {done}/{total} failed={failed} {}",
        eta(done, total, elapsed)
    );
    let _ = err.flush();
}

/// The time left if the remaining seeds take as long as the finished ones did on average.
pub fn eta(done: u64, total: u64, elapsed: WallDuration) -> String {
    if done == 0 {
        return "eta ?".to_owned();
    }
    let left = elapsed.as_millis() * u128::from(total.saturating_sub(done)) / u128::from(done);
    let secs = u64::try_from(left / 1_000).unwrap_or(u64::MAX);
    format!("eta {}:{:02}", secs / 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|l| (*l).to_owned()).collect()
    }

    #[test]
    fn the_eta_scales_the_time_so_far() {
        assert_eq!(eta(0, 10, WallDuration::from_secs(5)), "eta ?");
        assert_eq!(eta(1, 4, WallDuration::from_secs(20)), "eta 1:00");
        assert_eq!(eta(4, 4, WallDuration::from_secs(20)), "eta 0:00");
    }

    #[test]
    fn divergence_names_the_first_line_that_differs() {
        let a = lines(&["1 deliver x", "2 tick", "3 deliver y"]);
        let b = lines(&["1 deliver x", "2 tick", "3 deliver z"]);
        assert_eq!(
            divergence(&a, &b),
            "; first divergence at trace line 3: `3 deliver y` then `3 deliver z`"
        );
        let short = lines(&["1 deliver x"]);
        assert!(divergence(&a, &short).contains("agree for 1 lines, then one ends (3 and 1"));
        assert!(divergence(&a, &a).contains("the two traced runs agree"));
    }

    #[test]
    fn a_seed_runs_the_same_twice_with_overrides() {
        let overrides = Overrides {
            no_faults: vec![crate::overrides::FaultKind::Loss],
            settings: vec![],
        };
        let (report, failure) = check_one(3, &overrides, true);
        assert_eq!(failure, None);
        assert!(report.options.contains("# overrides: --no-fault loss"));
    }
}

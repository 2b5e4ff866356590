//! `dataplane-sim`: run one seeded simulation, or a swarm of them.
//!
//! ```text
//! dataplane-sim                                  a swarm of seeds 0..256
//! dataplane-sim run --seed N [--trace FILE]      one run
//! dataplane-sim swarm [--seeds A..B] [--jobs J] [--shard I/N] [--check-determinism]
//! ```

use std::io::Write as _;
use std::process::ExitCode;

/// Writes to stdout; if the reader went away (`dataplane-sim run | head`), stop quietly
/// instead of panicking.
fn write_out(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_fmt(args)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

macro_rules! out {
    ($($arg:tt)*) => { write_out(format_args!($($arg)*)) };
}

macro_rules! outln {
    ($($arg:tt)*) => { write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

use dataplane_sim::run_seed_guarded;
use dataplane_sim::swarm::{SwarmConfig, run_swarm};

const USAGE: &str = "\
dataplane-sim: seeded deterministic fault simulation of the dataplane

USAGE:
    dataplane-sim                         run a swarm of seeds 0..256
    dataplane-sim run --seed N [--trace FILE]
    dataplane-sim swarm [--seeds A..B] [--jobs J] [--shard I/N] [--check-determinism] [--quiet]

run:    one seed; prints the options drawn, then
        `seed=N result=pass|fail events=E sim_time=S wall=W trace=HEX`.
        --trace FILE writes a readable event log.
swarm:  many seeds across threads (default: all cores); exits 1 on any failure and prints the
        replay command of each failing seed. --shard I/N runs the seeds s with s % N == I, so
        N machines can split one range. --check-determinism runs every seed twice and fails on
        any trace-hash difference.
";

fn fail(message: &str) -> ExitCode {
    eprintln!("dataplane-sim: {message}");
    eprintln!("try `dataplane-sim --help`");
    ExitCode::from(2)
}

fn parse_u64(flag: &str, value: Option<String>) -> Result<u64, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value
        .parse()
        .map_err(|_| format!("{flag}: not a number: {value}"))
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        None => swarm(Vec::new()),
        Some("-h" | "--help" | "help") => {
            out!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some("run") => run(args.collect()),
        Some("swarm") => swarm(args.collect()),
        Some(other) => fail(&format!("unknown command: {other}")),
    }
}

fn run(args: Vec<String>) -> ExitCode {
    let mut seed = None;
    let mut trace_file = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => match parse_u64("--seed", args.next()) {
                Ok(s) => seed = Some(s),
                Err(e) => return fail(&e),
            },
            "--trace" => match args.next() {
                Some(f) => trace_file = Some(f),
                None => return fail("--trace needs a file"),
            },
            "-h" | "--help" => {
                out!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return fail(&format!("unknown argument: {other}")),
        }
    }
    let Some(seed) = seed else {
        return fail("run needs --seed N");
    };
    let report = run_seed_guarded(seed, trace_file.is_some());
    out!("{}", report.options);
    if let (Some(file), Some(lines)) = (&trace_file, &report.trace) {
        let mut text = report.options.clone();
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
        if let Err(e) = std::fs::write(file, text) {
            return fail(&format!("cannot write {file}: {e}"));
        }
    }
    let s = &report.stats;
    outln!(
        "# stats: frames={} lost={} duplicated={} reordered={} directory_steps={} directory_crashes={} fsync_failures={} torn_tails={} host_crashes={} partitions={} route_flaps={} actor_deaths={}",
        s.frames,
        s.lost,
        s.duplicated,
        s.reordered,
        s.directory_steps,
        s.directory_crashes,
        s.fsync_failures,
        s.torn_tails,
        s.host_crashes,
        s.partitions,
        s.route_flaps,
        s.actor_deaths
    );
    outln!(
        "# retention: mutations_per_node={:?} records_max={} log_bytes_max={}",
        s.operations_per_node,
        s.records_max,
        s.log_bytes_max
    );
    if let Some(failure) = &report.outcome.failure {
        outln!("# failure: {failure}");
    }
    outln!(
        "seed={} result={} events={} sim_time={:.3}s wall={:.3}s trace={:016x}",
        seed,
        if report.outcome.failure.is_none() {
            "pass"
        } else {
            "fail"
        },
        report.outcome.events,
        report.outcome.sim_time.as_secs_f64(),
        report.wall.as_secs_f64(),
        report.outcome.trace_hash
    );
    if report.outcome.failure.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn swarm(args: Vec<String>) -> ExitCode {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut config = SwarmConfig {
        first: 0,
        end: 256,
        jobs,
        shard: None,
        check_determinism: false,
        // A progress bar only makes sense on a terminal.
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seeds" => {
                let Some(range) = args.next() else {
                    return fail("--seeds needs A..B");
                };
                let Some((a, b)) = range.split_once("..") else {
                    return fail(&format!("--seeds: expected A..B, got {range}"));
                };
                match (a.parse(), b.parse()) {
                    (Ok(a), Ok(b)) if a <= b => (config.first, config.end) = (a, b),
                    _ => return fail(&format!("--seeds: bad range {range}")),
                }
            }
            "--jobs" => match parse_u64("--jobs", args.next()) {
                Ok(j) if j > 0 => config.jobs = j as usize,
                Ok(_) => return fail("--jobs must be at least 1"),
                Err(e) => return fail(&e),
            },
            "--shard" => {
                let Some(shard) = args.next() else {
                    return fail("--shard needs I/N");
                };
                let parsed = shard
                    .split_once('/')
                    .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
                match parsed {
                    Some((i, n)) if n > 0 && i < n => config.shard = Some((i, n)),
                    _ => return fail(&format!("--shard: expected I/N with I < N, got {shard}")),
                }
            }
            "--check-determinism" => config.check_determinism = true,
            "--quiet" => config.progress = false,
            "-h" | "--help" => {
                out!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return fail(&format!("unknown argument: {other}")),
        }
    }
    let report = run_swarm(&config);
    for failure in &report.failures {
        outln!("FAIL seed={}: {}", failure.seed, failure.message);
        outln!(
            "  replay: cargo run --release -p dataplane-sim -- run --seed {} --trace seed-{}.trace",
            failure.seed,
            failure.seed
        );
    }
    for line in &report.long_life {
        outln!("{line}");
    }
    let never = report.never_exercised();
    if !never.is_empty() {
        outln!("# never exercised by this swarm: {}", never.join(" "));
    }
    outln!("{}", report.summary_line());
    if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

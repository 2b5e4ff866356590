//! `dataplane-sim`: run one seeded simulation, or a swarm of them.
//!
//! ```text
//! dataplane-sim                                  a swarm of seeds 0..256
//! dataplane-sim run --seed N [--trace FILE] [--trace-json FILE] [--picture FILE]
//!                   [--record-tape FILE] [--tape FILE]
//! dataplane-sim swarm [--seeds A..B] [--jobs J] [--shard I/N | --shard-from k8s|slurm
//!                     [--shard-count N]] [--results FILE] [--check-determinism]
//!                     [--require-coverage] [--quiet]
//! dataplane-sim merge FILE... [--require-coverage]
//! dataplane-sim shrink --seed N [--out FILE] [--time-limit SECONDS]
//! dataplane-sim replay FILE
//! ```
//!
//! `run`, `swarm` and `shrink` take `--no-fault KIND` and `--set KEY=VALUE` (repeatable) to
//! override the draw.
//!
//! Exit statuses are the table the three binaries share (`--help` prints it): 0 every seed
//! passed, 70 a seed failed, 1 the trace file could not be written, 64 usage.

/// The simulator allocates and frees small values on every step (messages, effects, the
/// checkers' scratch), and glibc's allocator was a tenth of a swarm's profile: mimalloc, the
/// allocator of the field for this pattern, does the same work for less (issue 18).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::fs::File;
use std::io::{BufWriter, Write as _};
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

use clap::{Args, Parser, Subcommand};
use dataplane_cli::Exit;
use dataplane_sim::overrides::{FaultKind, Overrides, Setting};
use dataplane_sim::results::{
    ShardSource, merge as merge_results, replay_command, shard_from_env, to_json,
};
use dataplane_sim::rng::Tape;
use dataplane_sim::shrink::{Candidate, Trial, check_of, parse_replay, shrink as shrink_seed};
use dataplane_sim::swarm::{SwarmConfig, run_swarm_reporting};
use dataplane_sim::trace::TraceFiles;
use dataplane_sim::{RunSpec, run_spec, run_spec_traced};
use std::sync::Arc;

const AFTER_HELP: &str = "\
run:    prints the options drawn from the seed, then
        `seed=N result=pass|fail events=E sim_time=S wall=W trace=HEX`.
swarm:  runs the seeds across threads and prints each failing seed with its replay command
        as it fails. A failing seed exits 70; so does --require-coverage when an expected
        coverage point was never reached. --results FILE writes the shard's results as JSON;
        merge combines the shards' files into one summary (exit 70 on a failing seed or a
        missing shard).
shrink: narrows a failing seed to the smallest run that fails the same check (options, then
        the decision tape) and writes FILE, FILE.tape and FILE.html (a sequence diagram).
--no-fault KIND turns one fault or unhelpful behaviour off (loss, duplication, reordering,
        partitions, directory-crashes, host-crashes, route-flaps, actor-deaths,
        proxy-restarts, authority-outages, discovery-lag, revocations, spoofs, file-changes,
        fsync-failures, compaction-crashes, full-disk, rot, hostile-children, dying-children,
        registrar, discovery-repeats, clocks, stalls, slow-syncs, churn, aimed-crashes,
        host-pauses);
        --set KEY=VALUE pins one option
        (fault_phase_ms, directory_retry_ms, retry_batch, deadline_ms, proxy_retry_ms,
        loss_ppm, duplication_ppm, reordering_ppm, hosts, clients_max, workers_max, paths,
        compact_min_bytes, think_ms, worker_think_ms). Every other draw of the seed stays.";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "dataplane-sim",
    version = dataplane_cli::VERSION,
    about = "dataplane-sim: seeded deterministic fault simulation of the dataplane \
             (no command: a swarm of seeds 0..256)",
    after_help = format!("{AFTER_HELP}\n\n{}", dataplane_cli::exit_table()),
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one seed.
    Run {
        /// The seed.
        #[arg(long, value_name = "N")]
        seed: u64,
        /// Draw from this decision tape instead of the seed's streams (see --record-tape).
        #[arg(long, value_name = "FILE")]
        tape: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Run many seeds across threads.
    Swarm(SwarmArgs),
    /// Shrink a failing seed to the smallest run that still fails the same check, and write
    /// a replay file.
    Shrink {
        /// The failing seed.
        #[arg(long, value_name = "N")]
        seed: u64,
        /// Where to write the replay file (its tape goes to FILE.tape, its picture to
        /// FILE.html).
        #[arg(long, value_name = "FILE", default_value = "shrunk.replay")]
        out: String,
        /// Stop shrinking after this many seconds and keep the smallest run found so far.
        #[arg(long, value_name = "SECONDS", default_value_t = 55)]
        time_limit: u64,
        #[command(flatten)]
        overrides: OverrideArgs,
    },
    /// Merge the JSON results of a sharded swarm (`swarm --results`) into one summary.
    Merge {
        /// The shards' results files.
        #[arg(required = true)]
        files: Vec<String>,
        /// Fail (exit 70) when an expected coverage point was never reached.
        #[arg(long)]
        require_coverage: bool,
    },
    /// Run a replay file (from `shrink`).
    Replay {
        /// The replay file.
        file: String,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// What a single run writes besides its summary.
#[derive(Debug, Args)]
struct OutputArgs {
    /// Write a readable event log to FILE, as the run goes.
    #[arg(long, value_name = "FILE")]
    trace: Option<String>,
    /// Write the trace to FILE as JSON lines (one object per event or note).
    #[arg(long, value_name = "FILE")]
    trace_json: Option<String>,
    /// Write a sequence diagram of the run (its last rows) to FILE (HTML).
    #[arg(long, value_name = "FILE")]
    picture: Option<String>,
    /// Record every random draw of the run to FILE (a decision tape: `run --tape FILE`
    /// replays it bit-identically).
    #[arg(long, value_name = "FILE")]
    record_tape: Option<String>,
}

#[derive(Debug, Args)]
struct SwarmArgs {
    /// The seeds, A..B (B excluded).
    #[arg(long, value_name = "A..B", default_value = "0..256", value_parser = seed_range)]
    seeds: (u64, u64),
    /// Worker threads (default: all cores).
    #[arg(long, value_name = "J", value_parser = clap::value_parser!(u64).range(1..))]
    jobs: Option<u64>,
    /// Run only the seeds s with s % N == I, so N machines can split one range.
    #[arg(long, value_name = "I/N", value_parser = shard, conflicts_with = "shard_from")]
    shard: Option<(u64, u64)>,
    /// Take the shard from the batch system that started this process: `k8s` (an Indexed
    /// Job's JOB_COMPLETION_INDEX, with --shard-count) or `slurm` (SLURM_ARRAY_TASK_ID and
    /// SLURM_ARRAY_TASK_COUNT).
    #[arg(long, value_name = "ENGINE")]
    shard_from: Option<ShardSource>,
    /// The number of shards, with --shard-from (required for k8s).
    #[arg(long, value_name = "N", requires = "shard_from")]
    shard_count: Option<u64>,
    /// Write this shard's results as JSON to FILE (`dataplane-sim merge` combines them).
    #[arg(long, value_name = "FILE")]
    results: Option<String>,
    /// Run every seed twice and fail on any trace-hash difference.
    #[arg(long)]
    check_determinism: bool,
    /// Stop at the lowest failing seed (seeds above it are not run; the summary counts the
    /// seeds that ran).
    #[arg(long)]
    first_failure: bool,
    /// Fail (exit 70) when an expected coverage point was never reached.
    #[arg(long)]
    require_coverage: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    overrides: OverrideArgs,
}

/// Overrides of what a seed drew.
#[derive(Debug, Default, Args)]
struct OverrideArgs {
    /// Turn one fault or unhelpful behaviour off (repeatable; see below for the kinds).
    #[arg(long = "no-fault", value_name = "KIND")]
    no_faults: Vec<FaultKind>,
    /// Pin one option (repeatable; see below for the keys).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<Setting>,
    /// Run the directory as a group of this many replicas (3: the replicated mode; the same as
    /// `--set replicas=3`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=3))]
    replicas: Option<u64>,
}

impl OverrideArgs {
    fn into_overrides(self) -> Overrides {
        let mut settings = self.settings;
        if let Some(n) = self.replicas {
            settings.push(
                format!("replicas={}", if n > 1 { 3 } else { 1 })
                    .parse()
                    .expect("a valid setting"),
            );
        }
        Overrides {
            no_faults: self.no_faults,
            settings,
        }
    }
}

impl Default for SwarmArgs {
    fn default() -> Self {
        SwarmArgs {
            seeds: (0, 256),
            jobs: None,
            shard: None,
            shard_from: None,
            shard_count: None,
            results: None,
            check_determinism: false,
            first_failure: false,
            require_coverage: false,
            quiet: false,
            overrides: OverrideArgs::default(),
        }
    }
}

fn seed_range(text: &str) -> Result<(u64, u64), String> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| "expected A..B".to_owned())?;
    match (a.parse(), b.parse()) {
        (Ok(a), Ok(b)) if a <= b => Ok((a, b)),
        _ => Err("expected A..B with A <= B".to_owned()),
    }
}

fn shard(text: &str) -> Result<(u64, u64), String> {
    let parsed = text
        .split_once('/')
        .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
    match parsed {
        Some((i, n)) if n > 0 && i < n => Ok((i, n)),
        _ => Err("expected I/N with I < N".to_owned()),
    }
}

fn fail(code: Exit, message: &str) -> ExitCode {
    eprintln!("dataplane-sim: {message}");
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let cli: Cli = dataplane_cli::parse("dataplane-sim");
    match cli.command {
        None => swarm(SwarmArgs::default()),
        Some(Command::Run {
            seed,
            tape,
            output,
            overrides,
        }) => {
            let tape = match tape.map(|file| read_tape(&file)).transpose() {
                Ok(tape) => tape,
                Err(code) => return code,
            };
            let spec = RunSpec {
                seed,
                overrides: overrides.into_overrides(),
                tape,
                event_limit: None,
            };
            run(&spec, output)
        }
        Some(Command::Shrink {
            seed,
            out,
            time_limit,
            overrides,
        }) => shrink(seed, &out, &overrides.into_overrides(), time_limit),
        Some(Command::Replay { file, output }) => {
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(e) => return fail(Exit::LocalFile, &format!("cannot read {file}: {e}")),
            };
            let replay = match parse_replay(&text) {
                Ok(replay) => replay,
                Err(e) => return fail(Exit::Usage, &format!("{file}: {e}")),
            };
            // A tape file is named relative to the replay file.
            let tape = replay.tape.as_ref().map(|name| {
                let base = std::path::Path::new(&file)
                    .parent()
                    .unwrap_or(std::path::Path::new(""));
                read_tape(&base.join(name).to_string_lossy())
            });
            let tape = match tape.transpose() {
                Ok(tape) => tape,
                Err(code) => return code,
            };
            let spec = RunSpec {
                seed: replay.seed,
                overrides: replay.overrides,
                tape,
                event_limit: None,
            };
            run(&spec, output)
        }
        Some(Command::Swarm(args)) => swarm(args),
        Some(Command::Merge {
            files,
            require_coverage,
        }) => merge(&files, require_coverage),
    }
}

fn create(file: &Option<String>) -> Result<Option<BufWriter<File>>, ExitCode> {
    file.as_ref()
        .map(|path| {
            File::create(path)
                .map(BufWriter::new)
                .map_err(|e| fail(Exit::LocalFile, &format!("cannot write {path}: {e}")))
        })
        .transpose()
}

/// Reads a decision tape file.
fn read_tape(file: &str) -> Result<Arc<Tape>, ExitCode> {
    let bytes = std::fs::read(file)
        .map_err(|e| fail(Exit::LocalFile, &format!("cannot read {file}: {e}")))?;
    Tape::decode(&bytes)
        .map(Arc::new)
        .map_err(|e| fail(Exit::Usage, &format!("{file}: {e}")))
}

/// Writes the picture of `spec`'s run (run again with its trace kept: runs are deterministic).
fn write_picture(spec: &RunSpec, file: &str) -> Result<(), ExitCode> {
    let seed = spec.seed;
    let report = run_spec(spec, true, false);
    let title = match &report.outcome.failure {
        Some(failure) => format!("seed {seed}: {failure}"),
        None => format!("seed {seed}: passed"),
    };
    let lines = report.trace.unwrap_or_default();
    std::fs::write(file, dataplane_sim::picture::html(&title, &lines))
        .map_err(|e| fail(Exit::LocalFile, &format!("cannot write {file}: {e}")))
}

fn run(spec: &RunSpec, output: OutputArgs) -> ExitCode {
    let seed = spec.seed;
    let OutputArgs {
        trace: trace_file,
        trace_json: json_file,
        picture,
        record_tape,
    } = output;
    if let Some(file) = &picture
        && let Err(code) = write_picture(spec, file)
    {
        return code;
    }
    let record = record_tape.is_some();
    let report = if trace_file.is_none() && json_file.is_none() {
        run_spec(spec, false, record)
    } else {
        let files = match (create(&trace_file), create(&json_file)) {
            (Ok(text), Ok(json)) => TraceFiles { text, json },
            (Err(code), _) | (_, Err(code)) => return code,
        };
        let report = run_spec_traced(spec, files, record);
        if report.outcome.events == 0
            && let Some(failure) = &report.outcome.failure
        {
            // A panic: the trace streamed up to it; say so at its end.
            if let Err(code) = append_failure(&trace_file, &json_file, failure) {
                return code;
            }
        }
        report
    };
    if let Some(file) = &record_tape {
        match &report.tape {
            Some(tape) => {
                if let Err(e) = std::fs::write(file, tape.encode()) {
                    return fail(Exit::LocalFile, &format!("cannot write {file}: {e}"));
                }
            }
            None => eprintln!("dataplane-sim: the run panicked: no tape recorded to {file}"),
        }
    }
    out!("{}", report.options);
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
        ExitCode::from(Exit::Software)
    }
}

/// How big a run is: its events, the faults it injected and its actors.
fn size_of(report: &dataplane_sim::RunReport) -> (u64, u64, u64) {
    (
        report.outcome.events,
        report.stats.faults(),
        report.stats.actors,
    )
}

fn shrink(seed: u64, out: &str, start: &Overrides, time_limit: u64) -> ExitCode {
    let started = std::time::Instant::now();
    let first = run_spec(&RunSpec::with_overrides(seed, start), false, false);
    let Some(original) = first.outcome.failure.clone() else {
        outln!("seed={seed} passes: nothing to shrink");
        return ExitCode::SUCCESS;
    };
    outln!("# shrinking seed {seed}: {original}");
    let limit = std::time::Duration::from_secs(time_limit);
    let mut runner = |candidate: &Candidate, event_limit: u64| {
        if started.elapsed() > limit {
            return None;
        }
        let spec = RunSpec {
            seed,
            overrides: candidate.overrides.clone(),
            tape: candidate.tape.clone(),
            event_limit: Some(event_limit),
        };
        // Only a run from the seed's own streams needs its draws recorded (the shrinker takes
        // the tape passes' starting tape from one); a tape candidate is kept as written.
        let report = run_spec(&spec, false, candidate.tape.is_none());
        Some(Trial {
            failure: report.outcome.failure,
            events: report.outcome.events,
            tape: report.tape,
        })
    };
    let Some(shrunk) = shrink_seed(seed, start, &mut runner) else {
        // The first run failed; a second that passes means the seed is not deterministic.
        return fail(
            Exit::Software,
            "the seed failed once and passed the next time: run swarm --check-determinism",
        );
    };
    let tape_file = format!("{out}.tape");
    let tape_name = std::path::Path::new(&tape_file)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(tape) = &shrunk.best.tape
        && let Err(e) = std::fs::write(&tape_file, tape.encode())
    {
        return fail(Exit::LocalFile, &format!("cannot write {tape_file}: {e}"));
    }
    if let Err(e) = std::fs::write(out, shrunk.replay_file(Some(&tape_name))) {
        return fail(Exit::LocalFile, &format!("cannot write {out}: {e}"));
    }
    let spec = RunSpec {
        seed,
        overrides: shrunk.best.overrides.clone(),
        tape: shrunk.best.tape.clone(),
        event_limit: None,
    };
    let last = run_spec(&spec, true, false);
    // The replay file must reproduce what the shrinker saw (or the run is not deterministic).
    let replayed = last.outcome.failure.as_deref().map(check_of);
    if replayed.as_deref() != Some(shrunk.check.as_str()) {
        return fail(
            Exit::Software,
            &format!(
                "the shrunk run, run again, fails {replayed:?} instead of {}: run swarm --check-determinism",
                shrunk.check
            ),
        );
    }
    let picture = format!("{out}.html");
    if let Some(lines) = &last.trace {
        let title = format!("seed {seed}, shrunk: {}", shrunk.failure);
        if let Err(e) = std::fs::write(&picture, dataplane_sim::picture::html(&title, lines)) {
            return fail(Exit::LocalFile, &format!("cannot write {picture}: {e}"));
        }
    }
    outln!("{}", last.options.trim_end());
    let (before, after) = (size_of(&first), size_of(&last));
    outln!(
        "# shrink: events={}->{} faults={}->{} actors={}->{} runs={} wall={:.1}s{}",
        before.0,
        after.0,
        before.1,
        after.1,
        before.2,
        after.2,
        shrunk.runs,
        started.elapsed().as_secs_f64(),
        if shrunk.stopped {
            " (stopped at the time limit)"
        } else {
            ""
        }
    );
    outln!("# the same check fails: {}", shrunk.check);
    if let Some(lines) = &last.trace {
        outln!("# the last events before it:");
        for line in lines
            .iter()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            outln!("  {}", line.chars().take(160).collect::<String>());
        }
    }
    outln!("FAIL {}", shrunk.failure);
    outln!(
        "  replay file: {out}{}",
        if shrunk.best.tape.is_some() {
            format!(" (draws from {tape_file})")
        } else {
            String::new()
        }
    );
    outln!("  picture: {picture} (a sequence diagram of the shrunk run)");
    outln!("  replay: cargo run --release -p dataplane-sim -- replay {out} --trace {out}.trace");
    ExitCode::from(Exit::Software)
}

/// Appends a failure the run could not write itself (a panic) to the trace files.
fn append_failure(
    text: &Option<String>,
    json: &Option<String>,
    failure: &str,
) -> Result<(), ExitCode> {
    let append = |path: &String, line: String| {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .and_then(|mut f| writeln!(f, "{line}"))
            .map_err(|e| fail(Exit::LocalFile, &format!("cannot write {path}: {e}")))
    };
    if let Some(path) = text {
        append(path, format!("check: violated: {failure}"))?;
    }
    if let Some(path) = json {
        let object = serde_json::json!({ "kind": "check", "text": format!("violated: {failure}") });
        append(path, object.to_string())?;
    }
    Ok(())
}

fn swarm(args: SwarmArgs) -> ExitCode {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shard = match args.shard_from {
        None => args.shard,
        Some(source) => {
            match shard_from_env(source, args.shard_count, &|name| std::env::var(name).ok()) {
                Ok(shard) => Some(shard),
                Err(e) => return fail(Exit::Usage, &e),
            }
        }
    };
    let config = SwarmConfig {
        first: args.seeds.0,
        end: args.seeds.1,
        jobs: args
            .jobs
            .map_or(cores, |j| usize::try_from(j).unwrap_or(usize::MAX)),
        shard,
        check_determinism: args.check_determinism,
        // A progress bar only makes sense on a terminal.
        progress: !args.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        overrides: args.overrides.into_overrides(),
        first_failure: args.first_failure,
    };
    if let Some((index, count)) = shard {
        outln!(
            "# shard {index}/{count} of seeds {}..{}",
            config.first,
            config.end
        );
    }
    let overrides = config.overrides.arguments();
    // Failing seeds print as they fail, not at the end.
    let report = run_swarm_reporting(&config, &|failure| {
        outln!("FAIL seed={}: {}", failure.seed, failure.message);
        outln!("  replay: {}", replay_command(failure.seed, &overrides));
    });
    if !report.failures.is_empty() {
        let seeds: Vec<String> = report.failures.iter().map(|f| f.seed.to_string()).collect();
        outln!("# failing seeds: {}", seeds.join(" "));
    }
    for line in &report.long_life {
        outln!("{line}");
    }
    if let Some(file) = &args.results {
        let value = to_json(
            &report,
            (config.first, config.end),
            shard.unwrap_or((0, 1)),
            &overrides,
        );
        if let Err(e) = std::fs::write(file, format!("{value}\n")) {
            return fail(Exit::LocalFile, &format!("cannot write {file}: {e}"));
        }
    }
    let never = report.never_exercised();
    if !never.is_empty() {
        outln!("# never exercised by this swarm: {}", never.join(" "));
    }
    outln!("{}", report.summary_line());
    if args.require_coverage && !never.is_empty() {
        eprintln!(
            "dataplane-sim: --require-coverage: {} expected coverage point(s) never reached: {}",
            never.len(),
            never.join(" ")
        );
        return ExitCode::from(Exit::Software);
    }
    if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(Exit::Software)
    }
}

fn merge(files: &[String], require_coverage: bool) -> ExitCode {
    let mut texts = Vec::new();
    for file in files {
        match std::fs::read_to_string(file) {
            Ok(text) => texts.push((file.clone(), text)),
            Err(e) => return fail(Exit::LocalFile, &format!("cannot read {file}: {e}")),
        }
    }
    let merged = match merge_results(&texts) {
        Ok(merged) => merged,
        Err(e) => return fail(Exit::Usage, &e),
    };
    out!("{}", merged.summary());
    let never = merged.never_exercised();
    if !merged.missing.is_empty() {
        return fail(
            Exit::Software,
            &format!(
                "{} of {} shards have no results: {:?}",
                merged.missing.len(),
                merged.shards,
                merged.missing
            ),
        );
    }
    if require_coverage && !never.is_empty() {
        return fail(
            Exit::Software,
            &format!(
                "--require-coverage: {} expected coverage point(s) never reached: {}",
                never.len(),
                never.join(" ")
            ),
        );
    }
    if merged.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(Exit::Software)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    #[test]
    fn the_command_line_parses_and_answers_version() {
        Cli::command().debug_assert();
        let version = Cli::try_parse_from(["dataplane-sim", "--version"]).unwrap_err();
        assert_eq!(version.kind(), ErrorKind::DisplayVersion);
        assert_eq!(
            version.render().to_string().trim_end(),
            format!("dataplane-sim {}", dataplane_cli::VERSION)
        );
        let cli = Cli::try_parse_from(["dataplane-sim", "swarm", "--seeds=3..9", "--shard", "1/2"])
            .unwrap();
        match cli.command {
            Some(Command::Swarm(args)) => {
                assert_eq!((args.seeds, args.shard), ((3, 9), Some((1, 2))));
            }
            other => panic!("{other:?}"),
        }
        let bad = Cli::try_parse_from(["dataplane-sim", "run"]).unwrap_err();
        let message = dataplane_cli::usage_message(&bad, &[]);
        assert!(message.contains("--seed"), "{message}");
        assert!(Cli::try_parse_from(["dataplane-sim", "swarm", "--seeds", "9..3"]).is_err());
        let cli = Cli::try_parse_from([
            "dataplane-sim",
            "run",
            "--seed",
            "4",
            "--no-fault",
            "clocks",
            "--set",
            "deadline_ms=500",
        ])
        .unwrap();
        match cli.command {
            Some(Command::Run { overrides, .. }) => {
                assert_eq!(
                    overrides.into_overrides().arguments(),
                    " --no-fault clocks --set deadline_ms=500"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["dataplane-sim", "swarm", "--set", "deadline_ms=0"]).is_err());
        assert!(Cli::try_parse_from(["dataplane-sim", "swarm", "--require-coverage"]).is_ok());
    }
}

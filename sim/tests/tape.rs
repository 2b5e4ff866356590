//! The decision tape (issue 14): a run replayed from its recorded tape is the same run, and the
//! tape, not the seed, is what such a run draws from.

use std::sync::Arc;

use dataplane_sim::rng::{Stream, Tape};
use dataplane_sim::{RunSpec, run_spec};

#[test]
fn a_run_replayed_from_its_tape_is_bit_identical() {
    for seed in [3, 11] {
        let recorded = run_spec(&RunSpec::seed(seed), false, true);
        let tape = recorded.tape.clone().expect("recorded");
        assert!(
            tape.stream(Stream::Network).len() > 100,
            "seed {seed} drew little"
        );
        // Through the file format, as `run --tape` reads it.
        let tape = Tape::decode(&tape.encode()).expect("decodes");
        let replayed = run_spec(
            &RunSpec {
                tape: Some(Arc::new(tape.clone())),
                ..RunSpec::seed(seed)
            },
            false,
            true,
        );
        assert_eq!(replayed.outcome, recorded.outcome, "seed {seed}");
        assert_eq!(
            replayed.tape.as_ref(),
            Some(&tape),
            "seed {seed} drew otherwise"
        );
        // The seed alone gives the same run too (recording changes nothing).
        assert_eq!(
            run_spec(&RunSpec::seed(seed), false, false).outcome,
            recorded.outcome
        );
    }
}

#[test]
fn a_run_from_a_tape_draws_from_the_tape() {
    let seed = 5;
    let recorded = run_spec(&RunSpec::seed(seed), false, true);
    let mut tape = recorded.tape.clone().expect("recorded");
    // With every network draw the least, every latency is the minimum and nothing is lost
    // (zeros enough for the whole run: past the tape's end the seed's own draws go on).
    let zeros = vec![0; 10 * tape.stream(Stream::Network).len() + 10_000];
    tape.set_stream(Stream::Network, zeros);
    let quiet = run_spec(
        &RunSpec {
            tape: Some(Arc::new(tape)),
            ..RunSpec::seed(seed)
        },
        false,
        true,
    );
    assert_ne!(quiet.outcome.trace_hash, recorded.outcome.trace_hash);
    assert_eq!((quiet.stats.lost, quiet.stats.duplicated), (0, 0));
    // A tape cut short goes on with the seed's own draws: the same run as the seed's.
    let mut short = recorded.tape.expect("recorded");
    let mut workload = short.stream(Stream::Workload).to_vec();
    workload.truncate(workload.len() / 2);
    short.set_stream(Stream::Workload, workload);
    let cut = run_spec(
        &RunSpec {
            tape: Some(Arc::new(short)),
            ..RunSpec::seed(seed)
        },
        false,
        false,
    );
    assert_eq!(cut.outcome, recorded.outcome);
}

/// The committed shrunk example (SIMULATION.md) stays readable by today's simulator: its
/// replay file parses, its tape decodes, and without its defect the run passes. A change of
/// the tape format or of the options it names must regenerate it
/// (`SHRINK=1 SHRINK_OUT=DIR sim/defects/run proxy-expiry-retracts-nothing`).
#[test]
fn the_committed_shrunk_example_replays() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shrunk-example");
    let text = std::fs::read_to_string(dir.join("proxy-expiry-retracts-nothing.replay"))
        .expect("the example replay file");
    let replay = dataplane_sim::shrink::parse_replay(&text).expect("the replay file parses");
    let tape_name = replay.tape.as_deref().expect("the example names its tape");
    let bytes = std::fs::read(dir.join(tape_name)).expect("the example tape");
    let tape = Tape::decode(&bytes).expect("the example tape decodes");
    let report = run_spec(
        &RunSpec {
            seed: replay.seed,
            overrides: replay.overrides,
            tape: Some(Arc::new(tape)),
            event_limit: None,
        },
        false,
        false,
    );
    assert_eq!(
        report.outcome.failure, None,
        "the example fails without its defect"
    );
}

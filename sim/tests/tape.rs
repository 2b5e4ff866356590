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

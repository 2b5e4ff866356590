//! The replicated directory's mode of the swarm (`--replicas 3`, issue 19): a few seeds pass,
//! exercise elections, crashes, membership changes and acknowledged mutations, and are the same
//! run twice.

use dataplane_sim::{Overrides, RunSpec, run_spec};

fn replicated(seed: u64) -> RunSpec {
    let overrides = Overrides {
        settings: vec!["replicas=3".parse().expect("a setting")],
        ..Overrides::default()
    };
    RunSpec::with_overrides(seed, &overrides)
}

#[test]
fn the_replicas_serve_through_crashes_cuts_and_membership_changes() {
    let mut coverage = dataplane_sim::check::Coverage::default();
    for seed in 0..4 {
        let report = run_spec(&replicated(seed), false, false);
        assert_eq!(report.outcome.failure, None, "seed {seed}");
        assert!(report.options.contains("# replicated: 3 replicas"));
        coverage.merge(&report.coverage);
        let again = run_spec(&replicated(seed), false, false);
        assert_eq!(
            again.outcome, report.outcome,
            "seed {seed} is not deterministic"
        );
    }
    for name in [
        "mode.replicated",
        "replicas.election",
        "replicas.serving",
        "replicas.leader_crash",
        "replicas.welcomed",
        "replicas.mutation_acknowledged",
        "replicas.member_added",
        "replicas.member_removed",
        "op.Register",
    ] {
        assert!(coverage.count(name) > 0, "{name} never reached");
    }
}

#[test]
fn the_default_mode_is_not_replicated() {
    let report = run_spec(&RunSpec::seed(0), false, false);
    assert!(!report.options.contains("# replicated"));
    assert_eq!(report.coverage.count("mode.replicated"), 0);
}

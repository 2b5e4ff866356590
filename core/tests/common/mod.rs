//! What the property tests (`model.rs`, `crash.rs`) share beyond `dataplane-testkit`: their
//! proptest configuration.

use proptest::test_runner::Config as ProptestConfig;

/// `cases` cases by default (what CI runs); `PROPTEST_CASES=20000` searches harder,
/// `PROPTEST_RNG_SEED` replays a run. Failures are not persisted to files: the shrunk sequence
/// is printed.
pub fn proptest_config(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config
}

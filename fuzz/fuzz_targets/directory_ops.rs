//! `directory_ops`: a structure-aware operation sequence (duplicates, replays, op-id reuse,
//! notices, gone reports, route reports, ticks and restarts) against the directory and an
//! independent reference model; every reply, notice and durable change must match
//! (`dataplane_fuzz::model`, which folds the steps for `dataplane_testkit::check::run`).
#![no_main]

use dataplane_fuzz::model::run;
use dataplane_testkit::workload::Step;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|steps: Vec<Step>| {
    run(&steps);
});

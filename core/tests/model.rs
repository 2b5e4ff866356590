//! Model-based property test of the directory.
//!
//! Random operation sequences over a few contended paths and a small pool of operation ids
//! (so that duplicates, replays and op-id reuse are frequent) drive the real `Directory` and an
//! independent reference model written from SPEC.md §3–§4, DESIGN.md §5 and ARCHITECTURE.md
//! "Decisions" (`dataplane_testkit::model`, shared with the fuzz target `directory_ops`).
//! After every step `dataplane_testkit::check::run` compares replies, notices, the durable
//! state, the runtime rendezvous and fences, the watched routes and the write-ahead barrier,
//! and runs `check_invariants` (its module documentation lists the checks). This file draws
//! the sequences: the strategies below keep every number in the workload's windows and weight
//! the steps by swarm profiles.
//!
//! `PROPTEST_CASES=20000 cargo test -p dataplane-core --test model` searches harder.

mod common;

use common::proptest_config;
use dataplane_core::directory::DirectoryLimits;
use dataplane_core::wire::StreamRole;
use dataplane_testkit::check::{BeyondBatch, run, run_with_limits};
use dataplane_testkit::workload::{
    Expect, Gone, IncPick, OPEN_OPS, P, REGISTER_OPS, RENAME_OPS, RESERVE_OPS, Step, UNREGISTER_OPS,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn path_s() -> impl Strategy<Value = P> {
    prop_oneof![Just(P::A), Just(P::B), Just(P::AC)]
}

/// An operation id from one kind's window (`REGISTER_OPS`, `OPEN_OPS`...: each kind has its
/// own small window, and neighbouring windows overlap so that an id is sometimes reused for a
/// different kind of request).
fn op_s(kind: std::ops::RangeInclusive<u8>) -> impl Strategy<Value = u8> {
    kind
}

fn role_s() -> impl Strategy<Value = StreamRole> {
    prop_oneof![Just(StreamRole::Source), Just(StreamRole::Sink)]
}

fn expect_s() -> impl Strategy<Value = Expect> {
    prop_oneof![Just(Expect::None), (0u8..4).prop_map(Expect::Recent)]
}

/// Step weights, in the order of [`step_s`]'s arms: Register, Resolve, Lookup, Reserve,
/// Release, Unregister, Rename, Open, Cancel, Close, Replay, SourceRetired, StreamDisplaced,
/// Gone, Tick, Restart, Route, Done. Each case draws one profile (swarm testing), so that some
/// sequences concentrate on streams and fences, others on blobs and reservations, others on
/// obligations, the last on retention (issuers declaring their operations done, replays of
/// pruned operations, restarts of issuing nodes).
const PROFILES: [[u32; 18]; 5] = [
    [6, 2, 3, 3, 2, 3, 3, 12, 3, 3, 9, 2, 3, 2, 2, 1, 1, 1],
    [2, 1, 4, 1, 1, 2, 1, 24, 4, 4, 10, 1, 9, 1, 3, 1, 1, 1],
    [12, 3, 4, 8, 5, 6, 6, 2, 1, 1, 10, 5, 1, 2, 2, 1, 1, 1],
    [6, 1, 2, 2, 1, 2, 2, 12, 3, 2, 6, 6, 8, 5, 4, 3, 4, 1],
    [6, 1, 1, 4, 3, 4, 3, 10, 4, 2, 12, 2, 3, 3, 2, 2, 1, 8],
];

fn register_s() -> impl Strategy<Value = Step> {
    let file = proptest::bool::weighted(0.2);
    let reservation = proptest::option::weighted(0.3, op_s(RESERVE_OPS));
    (
        path_s(),
        op_s(REGISTER_OPS),
        any::<bool>(),
        file,
        reservation,
    )
        .prop_map(|(path, op, long, file, reservation)| Step::Register {
            path,
            op,
            long,
            file,
            reservation,
        })
}

fn open_s() -> impl Strategy<Value = Step> {
    let flags = (any::<bool>(), any::<bool>());
    (
        path_s(),
        role_s(),
        0u8..4,
        flags,
        expect_s(),
        op_s(OPEN_OPS),
    )
        .prop_map(
            |(path, role, endpoint, (replace, ensure), expected, op)| Step::Open {
                path,
                role,
                endpoint,
                replace,
                ensure,
                expected,
                op,
            },
        )
}

fn gone_s() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..4).prop_map(Gone::Endpoint),
        1 => op_s(REGISTER_OPS).prop_map(Gone::Source),
        1 => (0u8..2).prop_map(Gone::Owner),
        2 => (1u8..8, 2u64..4).prop_map(|(n, i)| Gone::Node(n, i)),
    ]
    .prop_map(Step::Gone)
}

fn step_s(w: [u32; 18]) -> impl Strategy<Value = Step> {
    let inc = prop_oneof![
        (0u8..4).prop_map(IncPick::Seen),
        (1u8..12).prop_map(IncPick::Current)
    ];
    prop_oneof![
        w[0] => register_s(),
        w[1] => path_s().prop_map(Step::Resolve),
        w[2] => path_s().prop_map(Step::Lookup),
        w[3] => (path_s(), op_s(RESERVE_OPS), 0u8..2)
            .prop_map(|(path, op, owner)| Step::Reserve { path, op, owner }),
        w[4] => (path_s(), op_s(RESERVE_OPS)).prop_map(|(path, op)| Step::Release { path, op }),
        w[5] => (path_s(), expect_s(), op_s(UNREGISTER_OPS))
            .prop_map(|(path, expected, op)| Step::Unregister { path, expected, op }),
        w[6] => (path_s(), path_s(), any::<bool>(), op_s(RENAME_OPS))
            .prop_map(|(from, to, replace, op)| Step::Rename { from, to, replace, op }),
        w[7] => open_s(),
        w[8] => (path_s(), op_s(OPEN_OPS)).prop_map(|(path, op)| Step::Cancel { path, op }),
        w[9] => (path_s(), inc).prop_map(|(path, inc)| Step::Close { path, inc }),
        w[10] => (0u8..8, any::<bool>())
            .prop_map(|(back, other_client)| Step::Replay { back, other_client }),
        w[11] => (0u8..16).prop_map(Step::SourceRetired),
        w[12] => (0u8..16).prop_map(Step::StreamDisplaced),
        w[13] => gone_s(),
        w[14] => Just(Step::Tick),
        w[15] => Just(Step::Restart),
        w[16] => (0u8..8, any::<bool>())
            .prop_map(|(target, routable)| Step::Route { target, routable }),
        w[17] => (0u8..26, 0u8..3).prop_map(|(below, who)| Step::Done { below, who }),
    ]
}

fn steps_s() -> impl Strategy<Value = Vec<Step>> {
    let steps = |p: usize| proptest::collection::vec(step_s(PROFILES[p]), 1..60);
    prop_oneof![steps(0), steps(1), steps(2), steps(3), steps(4)]
}

/// Limits small enough for the workload to reach each of them.
fn small_limits() -> impl Strategy<Value = DirectoryLimits> {
    (
        1usize..10,
        1usize..6,
        1usize..4,
        1usize..4,
        0usize..4,
        0usize..3,
        0usize..2,
        0usize..3,
    )
        .prop_map(
            |(
                operations,
                issuer_operations,
                issuers,
                entries,
                obligations,
                rendezvous,
                fences,
                held,
            )| {
                DirectoryLimits {
                    operations,
                    issuer_operations,
                    issuers,
                    entries,
                    obligations,
                    rendezvous,
                    fences,
                    reservations: rendezvous + 1,
                    fence_held_opens: held,
                    retry_batch: dataplane_core::limits::RETRY_BATCH_MAX,
                }
            },
        )
}

proptest! {
    // 5,000 cases take about a second; 200 let a planted Q11 defect (a cancel of an active
    // side that does not displace the peer) through in about one run of five.
    #![proptest_config(proptest_config(5000))]

    #[test]
    fn directory_matches_the_reference_model(steps in steps_s()) {
        run(&steps, BeyondBatch::Assert).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(proptest_config(2000))]

    /// Every table full: each `LimitReached` the directory answers, sticky or without a trace,
    /// is the model's.
    #[test]
    fn full_tables_refuse_as_the_model_says(steps in steps_s(), limits in small_limits()) {
        run_with_limits(&steps, BeyondBatch::Assert, limits).map_err(TestCaseError::fail)?;
    }
}

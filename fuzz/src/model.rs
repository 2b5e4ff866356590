//! The directory workload of `directory_ops` and `log_recover`: raw `Arbitrary` steps
//! (`dataplane_testkit::workload::Step`, feature `arbitrary`) cut to [`STEPS_MAX`] and folded
//! into the windows that core's property test draws from (`core/tests/model.rs`), then run by
//! `dataplane-testkit` against the directory and its reference model ([`run`]) or against the
//! directory alone ([`drive`]).
//!
//! One difference from the property test: the model's retry pass does not follow the
//! directory's rotation beyond one retry batch, so a tick or restart while more than
//! `RETRY_BATCH_MAX` obligations are open is skipped (`BeyondBatch::Skip`). Fuzzed sequences
//! are long enough to get there; the test's are not.

use dataplane_core::directory::DirectoryLimits;
use dataplane_testkit::check::{self, BeyondBatch};
use dataplane_testkit::dir::Dir;
use dataplane_testkit::workload::{
    self, Expect, Gone, IncPick, OPEN_OPS, REGISTER_OPS, RENAME_OPS, RESERVE_OPS, Step,
    UNREGISTER_OPS,
};

/// The longest sequence one input runs (longer ones are cut): keeps executions fast.
pub const STEPS_MAX: usize = 256;

type Window = std::ops::RangeInclusive<u8>;

fn fold(raw: u8, window: Window) -> u8 {
    let (lo, hi) = (*window.start(), *window.end());
    lo + raw % (hi - lo + 1)
}

fn expect(e: Expect) -> Expect {
    match e {
        Expect::None => Expect::None,
        Expect::Recent(i) => Expect::Recent(i % 4),
    }
}

/// `step` with every number folded into its window (as the proptest strategies draw).
pub fn normalised(step: &Step) -> Step {
    match step.clone() {
        Step::Register {
            path,
            op,
            long,
            file,
            reservation,
        } => Step::Register {
            path,
            op: fold(op, REGISTER_OPS),
            long,
            file,
            reservation: reservation.map(|r| fold(r, RESERVE_OPS)),
        },
        Step::Reserve { path, op, owner } => Step::Reserve {
            path,
            op: fold(op, RESERVE_OPS),
            owner: owner % 2,
        },
        Step::Release { path, op } => Step::Release {
            path,
            op: fold(op, RESERVE_OPS),
        },
        Step::Unregister { path, expected, op } => Step::Unregister {
            path,
            expected: expect(expected),
            op: fold(op, UNREGISTER_OPS),
        },
        Step::Rename {
            from,
            to,
            replace,
            op,
        } => Step::Rename {
            from,
            to,
            replace,
            op: fold(op, RENAME_OPS),
        },
        Step::Open {
            path,
            role,
            endpoint,
            replace,
            ensure,
            expected,
            op,
        } => Step::Open {
            path,
            role,
            endpoint: endpoint % 4,
            replace,
            ensure,
            expected: expect(expected),
            op: fold(op, OPEN_OPS),
        },
        Step::Cancel { path, op } => Step::Cancel {
            path,
            op: fold(op, OPEN_OPS),
        },
        Step::Close { path, inc } => Step::Close {
            path,
            inc: match inc {
                IncPick::Seen(i) => IncPick::Seen(i % 4),
                IncPick::Current(r) => IncPick::Current(fold(r, 1..=11)),
            },
        },
        Step::Replay { back, other_client } => Step::Replay {
            back: back % 8,
            other_client,
        },
        Step::SourceRetired(i) => Step::SourceRetired(i % 16),
        Step::StreamDisplaced(i) => Step::StreamDisplaced(i % 16),
        Step::Gone(g) => Step::Gone(match g {
            Gone::Endpoint(e) => Gone::Endpoint(e % 4),
            Gone::Source(op) => Gone::Source(fold(op, REGISTER_OPS)),
            Gone::Owner(k) => Gone::Owner(k % 2),
            Gone::Node(n, i) => Gone::Node(fold(n, 1..=7), 2 + i % 2),
        }),
        Step::Route { target, routable } => Step::Route {
            target: target % 8,
            routable,
        },
        Step::Done { below, who } => Step::Done {
            below: below % 26,
            who: who % 3,
        },
        other @ (Step::Resolve(_) | Step::Lookup(_) | Step::Tick | Step::Restart) => other,
    }
}

/// Tables small enough for a fuzzed sequence to fill each of them.
const SMALL: DirectoryLimits = DirectoryLimits {
    operations: 8,
    issuer_operations: 5,
    issuers: 2,
    entries: 2,
    obligations: 2,
    rendezvous: 1,
    fences: 1,
    reservations: 1,
    fence_held_opens: 1,
    retry_batch: dataplane_core::limits::RETRY_BATCH_MAX,
};

/// The first [`STEPS_MAX`] of `steps`, each [`normalised`].
fn prepared(steps: &[Step]) -> Vec<Step> {
    steps.iter().take(STEPS_MAX).map(normalised).collect()
}

/// Runs `steps` (cut and folded) against a fresh directory and the reference model; panics on
/// the first disagreement.
///
/// One input in three (by length) runs with [`SMALL`] tables, so that every `LimitReached`
/// is reached too.
pub fn run(steps: &[Step]) {
    let limits = if steps.len() % 3 == 2 {
        SMALL
    } else {
        DirectoryLimits::default()
    };
    if let Err(e) = check::run_with_limits(&prepared(steps), BeyondBatch::Skip, limits) {
        panic!("{e}");
    }
}

/// Drives `steps` (cut and folded as in [`run`]) against a directory alone, without the
/// model; returns the directory with its durable log (every `Persist` taken as durable).
pub fn drive(steps: &[Step]) -> Dir {
    workload::drive(&prepared(steps))
}

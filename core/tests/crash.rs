//! Crash-consistency property test of the directory's durable log (DESIGN.md §3–§4, SPEC S4).
//!
//! A random operation sequence (the model test's steps, drawn with wider operation-id windows)
//! drives a directory (`dataplane_testkit::workload::drive`, as the fuzz target `log_recover`
//! does) whose persisted records form the log. Then:
//!
//! * (a) for every prefix `log[..k]`: recovery succeeds, and its durable state is exactly the
//!   state obtained by applying those `k` records one by one to an empty `DurableState`, plus
//!   the one `EpochAdvanced` (strictly higher epoch) that recovery persists; the live state at
//!   the end equals the replay of the whole log;
//! * (b) for every record `k`: a log image whose last frame is torn (cut inside it) or has a
//!   flipped byte decodes to exactly the first `k - 1` records, reports a defect at the end of
//!   record `k - 1`, and recovers to the state after `k - 1` records;
//! * (c) compaction: the snapshot records replay to the live durable state, and a directory
//!   recovered from the snapshot answers a fixed probe exactly like one recovered from the
//!   full log.
mod common;

use common::proptest_config;
use dataplane_core::directory::{ActorSources, Directory, DurableState};
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::ids::{AuthorityEpoch, OperationId, RequestId};
use dataplane_core::limits::LOG_RECORD_BYTES_MAX;
use dataplane_core::log::{
    LogRecord, OperationRecord, RecordRef, RequestKey, append_record, decode_log, encode_log,
};
use dataplane_core::storage::{DataDirId, snapshot_image_of, verify_snapshot};
use dataplane_core::time::Instant;
use dataplane_core::wire::{
    Descriptor, DirectoryCall, DirectoryRequest, Message, SourceRecovery, StreamRole,
};
use dataplane_testkit::dir::{CLIENT, config, persisted};
use dataplane_testkit::workload::{
    self, Expect, Gone, IncPick, P, Step, endpoint, owner, source_of,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------------------------
// Workload: the model test's steps (`dataplane_testkit::workload`), drawn for long logs
// ---------------------------------------------------------------------------------------------

const PATHS: [P; 3] = [P::A, P::B, P::AC];

fn path_s() -> impl Strategy<Value = P> {
    prop_oneof![Just(P::A), Just(P::B), Just(P::AC)]
}

fn register_s() -> impl Strategy<Value = Step> {
    let file = proptest::bool::weighted(0.2);
    let reservation = proptest::option::weighted(0.2, 10u8..=16);
    (path_s(), 1u8..=12, file, reservation).prop_map(|(path, op, file, reservation)| {
        Step::Register {
            path,
            op,
            long: false,
            file,
            reservation,
        }
    })
}

fn open_s() -> impl Strategy<Value = Step> {
    let role = prop_oneof![Just(StreamRole::Source), Just(StreamRole::Sink)];
    let flags = (any::<bool>(), proptest::bool::weighted(0.8));
    (path_s(), role, 0u8..4, flags, 28u8..=56).prop_map(
        |(path, role, endpoint, (replace, ensure), op)| Step::Open {
            path,
            role,
            endpoint,
            replace,
            ensure,
            expected: Expect::None,
            op,
        },
    )
}

/// Operation ids come from per-kind windows wider than the model test's (some overlap, so ids
/// are sometimes reused for another kind of request), so that logs reach a few dozen records;
/// no route reports, lookups or resolves (they persist nothing).
fn step_s() -> impl Strategy<Value = Step> {
    let expected = proptest::option::weighted(0.3, (0u8..4).prop_map(Expect::Recent))
        .prop_map(|e| e.unwrap_or(Expect::None));
    prop_oneof![
        8 => register_s(),
        3 => (path_s(), 10u8..=16, 0u8..2)
            .prop_map(|(path, op, owner)| Step::Reserve { path, op, owner }),
        2 => (path_s(), 10u8..=16).prop_map(|(path, op)| Step::Release { path, op }),
        3 => (path_s(), expected, 16u8..=22)
            .prop_map(|(path, expected, op)| Step::Unregister { path, expected, op }),
        3 => (path_s(), path_s(), any::<bool>(), 22u8..=28)
            .prop_map(|(from, to, replace, op)| Step::Rename { from, to, replace, op }),
        16 => open_s(),
        3 => (path_s(), 28u8..=56).prop_map(|(path, op)| Step::Cancel { path, op }),
        2 => (path_s(), 0u8..4).prop_map(|(path, i)| Step::Close { path, inc: IncPick::Seen(i) }),
        6 => (0u8..8).prop_map(|back| Step::Replay { back, other_client: false }),
        3 => (0u8..16).prop_map(Step::SourceRetired),
        4 => (0u8..16).prop_map(Step::StreamDisplaced),
        1 => (0u8..4).prop_map(|e| Step::Gone(Gone::Endpoint(e))),
        1 => (1u8..7).prop_map(|n| Step::Gone(Gone::Node(n, 2))),
        2 => (0u8..60, 0u8..2).prop_map(|(below, who)| Step::Done { below, who }),
        2 => Just(Step::Tick),
        2 => Just(Step::Restart),
    ]
}

// ---------------------------------------------------------------------------------------------
// Recovery helpers
// ---------------------------------------------------------------------------------------------

/// The durable state `records` replay to from nothing.
fn replay(records: &[LogRecord], what: &str) -> Result<DurableState, TestCaseError> {
    let mut state = DurableState::default();
    for (i, record) in records.iter().enumerate() {
        state.apply(record).map_err(|e| {
            TestCaseError::fail(format!("{what} record {i} {record:?} refused: {e}"))
        })?;
    }
    Ok(state)
}

/// Recovers a directory from `records`; returns it with its recovery effects.
fn recover(records: &[LogRecord]) -> Result<(Directory, Vec<Effect>), TestCaseError> {
    let mut out = Outbox::new();
    let dir = Directory::recover(
        config(),
        records,
        &mut ActorSources,
        Instant::ZERO,
        &mut out,
    )
    .map_err(|e| TestCaseError::fail(format!("recovery failed: {e:?}")))?;
    if let Err(e) = dir.check_invariants() {
        return Err(TestCaseError::fail(format!(
            "invariants after recovery: {e}"
        )));
    }
    Ok((dir, out.take()))
}

/// Checks that `dir`, recovered from records whose replay is `replayed`, holds exactly that
/// state plus the one EpochAdvanced it persisted.
fn check_recovered(
    dir: &Directory,
    effects: &[Effect],
    replayed: &DurableState,
    what: &str,
) -> Result<(), TestCaseError> {
    let records = persisted(effects);
    prop_assert_eq!(
        records.len(),
        1,
        "{}: recovery persists exactly one record, got {:?}",
        what,
        records
    );
    let LogRecord::EpochAdvanced { epoch } = records[0] else {
        return Err(TestCaseError::fail(format!(
            "{what}: recovery persisted {:?}, not an EpochAdvanced",
            records[0]
        )));
    };
    prop_assert!(
        epoch > replayed.epoch(),
        "{}: recovery adopted {:?}, not above {:?}",
        what,
        epoch,
        replayed.epoch()
    );
    prop_assert_eq!(dir.epoch(), epoch, "{}: adopted epoch", what);
    let mut expected = replayed.clone();
    expected
        .apply(&records[0])
        .map_err(|e| TestCaseError::fail(format!("{what}: EpochAdvanced refused: {e}")))?;
    prop_assert!(
        *dir.durable() == expected,
        "{}: recovered durable state differs from the replay\nrecovered: {:?}\nreplayed: {:?}",
        what,
        dir.durable(),
        expected
    );
    Ok(())
}

/// SplitMix64: derives the cut and flip positions from the case's seed.
fn mix(seed: u64, k: usize, salt: u64) -> u64 {
    let mut z = seed
        .wrapping_add((k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(salt.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------------
// The probe for (c)
// ---------------------------------------------------------------------------------------------

/// A request that replays the operation `op` recorded with `record`.
fn replay_request(op: OperationId, record: &OperationRecord) -> DirectoryRequest {
    match &record.key {
        RequestKey::Register {
            path,
            length,
            recovery,
        } => {
            let source = match recovery {
                SourceRecovery::Actor { actor, .. } => *actor,
                SourceRecovery::File { .. } => source_of(op.0 as u8),
            };
            DirectoryRequest::Register {
                path: path.clone(),
                source,
                source_node: source.node,
                length: *length,
                recovery: recovery.clone(),
                operation: op,
                reservation: None,
            }
        }
        RequestKey::BindStream { path } => DirectoryRequest::OpenStream {
            path: path.clone(),
            role: StreamRole::Source,
            descriptor: Descriptor::new(vec![0]).unwrap(),
            endpoint: endpoint(0),
            replace: false,
            ensure: true,
            expected_revision: None,
            operation: op,
        },
        RequestKey::Unregister {
            path,
            expected_revision,
        } => DirectoryRequest::Unregister {
            path: path.clone(),
            expected_revision: *expected_revision,
            operation: op,
        },
        RequestKey::Rename {
            source,
            destination,
            replace,
        } => DirectoryRequest::Rename {
            source: source.clone(),
            destination: destination.clone(),
            replace: *replace,
            operation: op,
        },
        RequestKey::Reserve { path } => DirectoryRequest::ReserveBlob {
            path: path.clone(),
            operation: op,
            owner: owner(0),
        },
    }
}

/// Lookups and resolves of every path, a replay of every recorded operation id, then a few
/// fresh opens and a tick.
fn probe(live: &DurableState) -> Vec<Message> {
    let mut requests = Vec::new();
    for p in PATHS {
        let path = p.path();
        requests.push(DirectoryRequest::Lookup { path: path.clone() });
        requests.push(DirectoryRequest::Resolve { path });
    }
    for (op, record) in live.operations() {
        requests.push(replay_request(*op, record));
    }
    for (i, p) in PATHS.iter().enumerate() {
        for role in [StreamRole::Source, StreamRole::Sink] {
            requests.push(DirectoryRequest::OpenStream {
                path: p.path(),
                role,
                descriptor: Descriptor::new(vec![1]).unwrap(),
                endpoint: endpoint(1),
                replace: false,
                ensure: true,
                expected_revision: None,
                operation: OperationId(1000 + 2 * i as u128 + u128::from(role == StreamRole::Sink)),
            });
        }
        requests.push(DirectoryRequest::Lookup { path: p.path() });
    }
    requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            Message::Call(DirectoryCall {
                request_id: RequestId(i as u64 + 1),
                reply_to: CLIENT,
                request,
            })
        })
        .collect()
}

fn run_probe(dir: &mut Directory, probe: &[Message]) -> Vec<Vec<Effect>> {
    let mut all = Vec::new();
    for message in probe {
        let mut out = Outbox::new();
        dir.handle_message(Instant::ZERO, message.clone(), &mut out)
            .expect("probe input");
        all.push(out.take());
    }
    all
}

// ---------------------------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------------------------

fn check(steps: &[Step], seed: u64) -> Result<(), TestCaseError> {
    let d = workload::drive(steps);
    let log = d.log.clone();

    // Replay every prefix through `DurableState::apply`.
    let mut states = vec![DurableState::default()];
    for (i, record) in log.iter().enumerate() {
        let mut next = states[i].clone();
        next.apply(record)
            .map_err(|e| TestCaseError::fail(format!("record {i} {record:?} refused: {e}")))?;
        states.push(next);
    }
    prop_assert!(
        *d.dir.durable() == states[log.len()],
        "the live durable state differs from the replay of its whole log"
    );

    // (a) Recovery from every prefix.
    for k in 0..=log.len() {
        let (dir, effects) = recover(&log[..k])?;
        check_recovered(
            &dir,
            &effects,
            &states[k],
            &format!("prefix of {k} records"),
        )?;
    }

    // (b) Torn and corrupt tails.
    let image = encode_log(&log).expect("encode the log");
    let mut bounds = vec![0usize];
    let mut buf = Vec::new();
    for record in &log {
        append_record(&mut buf, record).expect("frame a record");
        bounds.push(buf.len());
    }
    prop_assert_eq!(&buf, &image, "encode_log equals successive append_record");
    for k in 1..=log.len() {
        let (start, end) = (bounds[k - 1], bounds[k]);
        let frame = end - start;
        let cut = start + 1 + (mix(seed, k, 1) % (frame as u64 - 1)) as usize;
        let mut flipped = image[..end].to_vec();
        let at = start + (mix(seed, k, 2) % frame as u64) as usize;
        flipped[at] ^= 1 + (mix(seed, k, 3) % 255) as u8;
        for (what, bytes) in [
            (format!("record {k} torn at byte {cut}"), &image[..cut]),
            (format!("record {k} with byte {at} flipped"), &flipped[..]),
        ] {
            let decoded = decode_log(bytes);
            prop_assert_eq!(&decoded.records[..], &log[..k - 1], "{}: records", what);
            prop_assert_eq!(decoded.valid_len, start, "{}: valid length", what);
            prop_assert_eq!(
                decoded.defect.as_ref().map(|d| d.offset()),
                Some(start),
                "{}: defect {:?}",
                what,
                decoded.defect
            );
            let (dir, effects) = recover(&decoded.records)?;
            check_recovered(&dir, &effects, &states[k - 1], &what)?;
        }
    }

    // (c) Compaction.
    let live = d.dir.durable();
    let snapshot = d.dir.snapshot_records();
    let compacted = replay(&snapshot, "snapshot")?;
    prop_assert!(
        compacted == *live,
        "snapshot replays to a different state\nsnapshot: {:?}\nlive: {:?}",
        compacted,
        live
    );
    // What a compaction writes: the records borrowed from the state and encoded as they come,
    // in a snapshot image; read back, they replay to the live state too.
    let image = snapshot_image_of(
        DataDirId(1),
        2,
        d.dir.snapshot().map(RecordRef::Snapshot),
        LOG_RECORD_BYTES_MAX,
    )
    .map_err(|e| TestCaseError::fail(format!("the compaction image: {e:?}")))?;
    let read_back = verify_snapshot(DataDirId(1), 2, &image)
        .map_err(|e| TestCaseError::fail(format!("the compaction image reads back: {e:?}")))?;
    let from_image = replay(&read_back, "image")?;
    prop_assert!(
        from_image == *live,
        "the compaction image replays to a different state"
    );
    let (mut from_snapshot, snapshot_boot) = recover(&snapshot)?;
    check_recovered(&from_snapshot, &snapshot_boot, live, "snapshot")?;
    let (mut from_log, log_boot) = recover(&log)?;
    check_recovered(&from_log, &log_boot, live, "full log")?;
    prop_assert_eq!(
        &snapshot_boot,
        &log_boot,
        "recovery effects from the snapshot and from the log"
    );
    let probe = probe(live);
    let a = run_probe(&mut from_snapshot, &probe);
    let b = run_probe(&mut from_log, &probe);
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        prop_assert_eq!(
            a,
            b,
            "probe {} ({:?}): snapshot-recovered vs log-recovered",
            i,
            probe[i]
        );
    }
    prop_assert!(
        from_snapshot.durable() == from_log.durable(),
        "durable states after the probe"
    );
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config(1000))]

    #[test]
    fn every_log_prefix_recovers_to_its_replay(
        steps in proptest::collection::vec(step_s(), 1..80),
        seed in any::<u64>(),
    ) {
        check(&steps, seed)?;
    }
}

/// The epoch of a fresh store's first recovery, as a sanity anchor for the properties above.
#[test]
fn an_empty_log_recovers_at_epoch_one() {
    let mut out = Outbox::new();
    let dir =
        Directory::recover(config(), &[], &mut ActorSources, Instant::ZERO, &mut out).unwrap();
    assert_eq!(dir.epoch(), AuthorityEpoch(1));
    assert_eq!(
        persisted(&out.take()),
        vec![LogRecord::EpochAdvanced {
            epoch: AuthorityEpoch(1)
        }]
    );
}

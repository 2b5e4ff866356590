//! The CPU a compaction spends building its snapshot image, which the directory node does on
//! its only thread (it serves nothing meanwhile).
//!
//! Run with `cargo bench -p dataplane-core --bench compaction` (add `-- --quick`, or set
//! `DATAPLANE_BENCH_QUICK=1`, for a smoke run at 35 thousand entries). Prints, for 350
//! thousand entries (about where the sustained put/get load of `dataplane-io-bench` stands
//! after 30 s), one line
//!
//! ```text
//! BENCH name=compaction_image entries=<n> ours=<ms> baseline=clone_then_encode clone_then_encode=<ms> ratio=<baseline/ours>
//! ```
//!
//! * **Setup** (not measured): a directory recovered from an empty log Registers `n` paths
//!   `/ns/<i>/blob`, each with its own source; like a host on its tick, the issuer declares
//!   its operations done every 4,096, so the operation table stays small, as in a node.
//! * **ours**: what the node does, `snapshot_image_of` over `Directory::snapshot()`: the
//!   records borrowed from the state and encoded as they come.
//! * **baseline**: what it did before: `Directory::snapshot_records()` (cloning every entry
//!   and row into owned records), `snapshot_image` of them, then dropping them.
//! * Each side runs 5 times, alternating; the medians are compared. The two images must be
//!   the same bytes (checked).
//!
//! Benches live outside the pure core, so they may read the wall clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::{Duration as WallDuration, Instant as WallInstant};

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::Outbox;
use dataplane_core::ids::{Address, Issuer, NodeId, RequestId};
use dataplane_core::limits::LOG_RECORD_BYTES_MAX;
use dataplane_core::log::RecordRef;
use dataplane_core::path::DataPath;
use dataplane_core::storage::{DataDirId, snapshot_image, snapshot_image_of};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{DirectoryCall, DirectoryRequest, Message, SourceRecovery};

const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
const CLIENT: Address = Address::new(NodeId(1), 1, 0);
const ISSUER: Issuer = Issuer::of(CLIENT, 0);
const ROUNDS: usize = 5;

fn call(dir: &mut Directory, out: &mut Outbox, request_id: u64, request: DirectoryRequest) {
    let message = Message::Call(DirectoryCall {
        request_id: RequestId(request_id),
        reply_to: CLIENT,
        request,
    });
    dir.handle_message(Instant::ZERO, message, out)
        .expect("a directory input");
    out.drain().for_each(drop);
}

fn setup(n: u64) -> Directory {
    let mut out = Outbox::new();
    let config = DirectoryConfig {
        address: DIRECTORY,
        retry_period: Duration::from_secs(1),
        limits: Default::default(),
    };
    let mut dir = Directory::recover(config, &[], &mut ActorSources, Instant::ZERO, &mut out)
        .expect("recovery");
    out.drain().for_each(drop);
    for i in 0..n {
        let path = DataPath::new(format!("/ns/{i}/blob")).expect("a valid path");
        let source = Address::new(NodeId(2 + i % 64), 1, i);
        let register = DirectoryRequest::Register {
            path,
            source,
            source_node: source.node,
            length: 4096,
            recovery: SourceRecovery::Actor {
                actor: source,
                node: source.node,
                owner: None,
            },
            operation: ISSUER.op(i + 1),
            reservation: None,
        };
        call(&mut dir, &mut out, 2 * i + 1, register);
        if (i + 1) % 4096 == 0 {
            let done = DirectoryRequest::OperationsDone {
                issuer: ISSUER,
                below: i + 1,
            };
            call(&mut dir, &mut out, 2 * i + 2, done);
        }
    }
    assert_eq!(
        dir.durable().entry_count() as u64,
        n,
        "setup registers failed"
    );
    dir
}

fn median(mut times: Vec<WallDuration>) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("DATAPLANE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let n: u64 = if quick { 35_000 } else { 350_000 };
    let dir = setup(n);
    let id = DataDirId(1);
    let (mut ours, mut baseline) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        let started = WallInstant::now();
        let records = dir.snapshot_records();
        let cloned = snapshot_image(id, 2, &records, LOG_RECORD_BYTES_MAX).expect("an image");
        drop(records);
        baseline.push(started.elapsed());

        let started = WallInstant::now();
        let snapshot = dir.snapshot().map(RecordRef::Snapshot);
        let image = snapshot_image_of(id, 2, snapshot, LOG_RECORD_BYTES_MAX).expect("an image");
        ours.push(started.elapsed());

        assert!(image == cloned, "the two images differ");
        bytes = image.len();
    }
    let (ours, baseline) = (median(ours), median(baseline));
    println!("# compaction image: {n} entries, {bytes} bytes, median of {ROUNDS} each");
    println!(
        "BENCH name=compaction_image entries={n} ours={ours:.1}ms baseline=clone_then_encode clone_then_encode={baseline:.1}ms ratio={:.2}",
        baseline / ours
    );
}

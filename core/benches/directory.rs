//! Directory mutation throughput: a steady Register/Unregister mix at 1k, 100k and 1M blob
//! bindings, against the reference's approach of cloning the whole state on every commit.
//!
//! Run with `cargo bench -p dataplane-core --bench directory` (add `-- --quick`, or set
//! `DATAPLANE_BENCH_QUICK=1`, for a seconds-long smoke run; any other non-flag argument
//! filters the measurements by substring of their id). Each measurement prints one line:
//!
//! ```text
//! BENCH name=<id> ours=<ops/s> baseline=<ops/s> ratio=<ours/baseline>
//! ```
//!
//! plus informational lines starting with `#`.
//!
//! * **Setup** (not measured): recover a directory from an empty log and Register N distinct
//!   paths `/ns/<i>/blob`, each with its own source address and operation id.
//! * **Step**: one counted operation, alternately Register of a fresh path (fresh operation id,
//!   fresh source) and Unregister of the oldest live path (fresh operation id). The Unregister
//!   retires the path's live source: the directory sends `Retire`, and the step answers with
//!   `SourceRetired{source}` (a durable mutation too, not counted as an operation). Every
//!   `Persist` is framed into a reused buffer with [`append_record`] (the work of producing the
//!   log bytes, without IO); other effects are dropped. Requests are built before each timed
//!   chunk, so the time is the directory's plus the log framing.
//! * **ours**: the step on the live directory.
//! * **Retention**: operation ids are a host's (one issuer), and like a host on its tick the
//!   workload declares them done every 4,096 operations (an `OperationsDone` frame inside the
//!   timed chunk, not counted as an operation), so the operation table stays small.
//! * **baseline**: the same step on `dir.clone()`, which then replaces `dir` (one full-state
//!   clone per counted operation; the acknowledgement shares the clone of its Unregister, which
//!   is generous to the baseline).
//!
//! Benches live outside the pure core, so they may read the wall clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration as WallDuration, Instant as WallInstant};

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::ids::{Address, Issuer, NodeId, OperationId, RequestId};
use dataplane_core::log::append_record;
use dataplane_core::path::DataPath;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, Message, SourceRecovery,
};

/// Node 0 hosts the directory, clients live on node 1, sources on nodes 2.. (as in the tests).
const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
const CLIENT: Address = Address::new(NodeId(1), 1, 0);
/// Sources are spread over this many host nodes.
const SOURCE_NODES: u64 = 64;
/// The log buffer is cleared once it holds this many bytes.
const LOG_BUFFER_CLEAR_BYTES: usize = 1 << 20;
/// Counted operations per timed chunk of "ours" (even: every chunk starts with a Register).
const CHUNK_OPS: usize = 4096;
/// The issuer of every operation id: lane 0 of the client's node incarnation.
const ISSUER: Issuer = Issuer::of(CLIENT, 0);
/// Operations between two declarations of the workload's operations done.
const DECLARE_EVERY: u128 = 4096;

/// The target the numbers are judged against (informational).
const TARGET_OPS_PER_SEC: f64 = 300_000.0;
const TARGET_SIZE_SPREAD: f64 = 1.5;
const TARGET_RATIO_AT_100K: f64 = 100.0;

/// How long and how much each measurement runs.
#[derive(Clone, Copy, Debug)]
struct Budget {
    ours_min_time: WallDuration,
    ours_min_ops: u64,
    baseline_min_time: WallDuration,
    baseline_min_ops: u64,
}

impl Budget {
    fn full() -> Self {
        Budget {
            ours_min_time: WallDuration::from_secs(1),
            ours_min_ops: 300_000,
            baseline_min_time: WallDuration::from_millis(500),
            baseline_min_ops: 4,
        }
    }

    fn quick() -> Self {
        Budget {
            ours_min_time: WallDuration::from_millis(50),
            ours_min_ops: 2 * CHUNK_OPS as u64,
            baseline_min_time: WallDuration::from_millis(20),
            baseline_min_ops: 2,
        }
    }
}

/// The mix's generator: fresh paths, sources and ids, and the live paths oldest first.
#[derive(Debug)]
struct Workload {
    next_index: u64,
    next_operation: u128,
    next_request: u64,
    live: VecDeque<DataPath>,
    /// Whether the next step is a Register.
    register_next: bool,
}

impl Workload {
    fn new() -> Self {
        Workload {
            next_index: 0,
            next_operation: 1,
            next_request: 1,
            live: VecDeque::new(),
            register_next: true,
        }
    }

    fn call(&mut self, request: DirectoryRequest) -> Message {
        let request_id = RequestId(self.next_request);
        self.next_request += 1;
        Message::Call(DirectoryCall {
            request_id,
            reply_to: CLIENT,
            request,
        })
    }

    fn operation(&mut self) -> OperationId {
        let operation = ISSUER.op(self.next_operation as u64);
        self.next_operation += 1;
        operation
    }

    /// Every [`DECLARE_EVERY`] operations: everything so far is done.
    fn declaration(&mut self) -> Option<Message> {
        self.next_operation.is_multiple_of(DECLARE_EVERY).then(|| {
            self.call(DirectoryRequest::OperationsDone {
                issuer: ISSUER,
                below: self.next_operation as u64,
            })
        })
    }

    /// A Register of a fresh path with a fresh source and operation id.
    fn register(&mut self) -> Message {
        let i = self.next_index;
        self.next_index += 1;
        let path = DataPath::new(format!("/ns/{i}/blob")).expect("a valid path");
        let source = Address::new(NodeId(2 + i % SOURCE_NODES), 1, i);
        self.live.push_back(path.clone());
        let operation = self.operation();
        self.call(DirectoryRequest::Register {
            path,
            source,
            source_node: source.node,
            length: 4096,
            recovery: SourceRecovery::Actor {
                actor: source,
                node: source.node,
                owner: None,
            },
            operation,
            reservation: None,
        })
    }

    /// An Unregister of the oldest live path with a fresh operation id.
    fn unregister(&mut self) -> Message {
        let path = self.live.pop_front().expect("a live path to unregister");
        let operation = self.operation();
        self.call(DirectoryRequest::Unregister {
            path,
            expected_revision: None,
            operation,
        })
    }

    /// The next `n` steps of the alternating mix.
    fn steps(&mut self, n: usize, into: &mut Vec<Message>) {
        into.clear();
        for _ in 0..n {
            let message = if self.register_next {
                self.register()
            } else {
                self.unregister()
            };
            self.register_next = !self.register_next;
            into.push(message);
            into.extend(self.declaration());
        }
    }
}

/// What executing the effects of one step produces: log bytes and failures to report.
#[derive(Debug)]
struct Sink {
    log: Vec<u8>,
    framed_bytes: u64,
    persisted: u64,
    failed_replies: u64,
    acks: Vec<Address>,
}

impl Sink {
    fn new() -> Self {
        Sink {
            log: Vec::with_capacity(LOG_BUFFER_CLEAR_BYTES + 4096),
            framed_bytes: 0,
            persisted: 0,
            failed_replies: 0,
            acks: Vec::new(),
        }
    }

    /// Executes (in order) the effects in `out`: frames every Persist, notes every Retire so
    /// its acknowledgement can be delivered, checks replies, drops the rest.
    fn drain(&mut self, out: &mut Outbox) {
        for effect in out.drain() {
            match effect {
                Effect::Persist(record) => {
                    let framed = append_record(&mut self.log, &record).expect("a framable record");
                    self.framed_bytes += framed as u64;
                    self.persisted += 1;
                }
                Effect::Send {
                    to,
                    message: Message::Retire { .. },
                } => self.acks.push(to),
                Effect::Send {
                    message: Message::Reply(DirectoryReply { body, .. }),
                    ..
                } => {
                    if body.err().is_some() {
                        self.failed_replies += 1;
                    }
                }
                other => drop(black_box(other)),
            }
        }
        if self.log.len() >= LOG_BUFFER_CLEAR_BYTES {
            black_box(self.log.as_slice());
            self.log.clear();
        }
    }
}

/// One step on `dir`: the counted operation, then the acknowledgement of any Retire it sent.
fn step(dir: &mut Directory, now: Instant, message: Message, out: &mut Outbox, sink: &mut Sink) {
    dir.handle_message(now, message, out)
        .expect("a directory input");
    sink.drain(out);
    while let Some(source) = sink.acks.pop() {
        dir.handle_message(now, Message::SourceRetired { source }, out)
            .expect("a directory input");
        sink.drain(out);
    }
}

/// A directory recovered from an empty log, holding `n` blob bindings.
fn setup(n: usize, now: Instant) -> (Directory, Workload) {
    let mut out = Outbox::new();
    let config = DirectoryConfig {
        address: DIRECTORY,
        retry_period: Duration::from_secs(1),
        limits: Default::default(),
    };
    let mut dir =
        Directory::recover(config, &[], &mut ActorSources, now, &mut out).expect("recovery");
    let mut sink = Sink::new();
    sink.drain(&mut out);
    let mut workload = Workload::new();
    for _ in 0..n {
        let message = workload.register();
        step(&mut dir, now, message, &mut out, &mut sink);
        if let Some(done) = workload.declaration() {
            step(&mut dir, now, done, &mut out, &mut sink);
        }
    }
    assert_eq!(sink.failed_replies, 0, "setup registers failed");
    assert_eq!(dir.durable().entry_count(), n);
    (dir, workload)
}

/// Ops per second of the mix on the live directory.
fn measure_ours(
    dir: &mut Directory,
    workload: &mut Workload,
    now: Instant,
    budget: Budget,
) -> (f64, Sink) {
    let mut out = Outbox::new();
    let mut sink = Sink::new();
    let mut messages = Vec::with_capacity(CHUNK_OPS);
    // One untimed chunk to warm caches and the allocator.
    workload.steps(CHUNK_OPS, &mut messages);
    for message in messages.drain(..) {
        step(dir, now, message, &mut out, &mut sink);
    }
    let mut elapsed = WallDuration::ZERO;
    let mut ops = 0u64;
    let mut chunk_rates = Vec::new();
    while elapsed < budget.ours_min_time || ops < budget.ours_min_ops {
        workload.steps(CHUNK_OPS, &mut messages);
        let start = WallInstant::now();
        for message in messages.drain(..) {
            step(dir, now, message, &mut out, &mut sink);
        }
        let took = start.elapsed();
        elapsed += took;
        ops += CHUNK_OPS as u64;
        chunk_rates.push(CHUNK_OPS as f64 / took.as_secs_f64());
    }
    black_box(&*dir);
    chunk_rates.sort_by(f64::total_cmp);
    let at = |q: f64| chunk_rates[((chunk_rates.len() - 1) as f64 * q).round() as usize];
    println!(
        "# ours: {ops} ops in {:.2} s; per-chunk ({CHUNK_OPS} ops) rates p10={} median={} p90={}",
        elapsed.as_secs_f64(),
        rate(at(0.1)),
        rate(at(0.5)),
        rate(at(0.9)),
    );
    (ops as f64 / elapsed.as_secs_f64(), sink)
}

/// Ops per second of the mix when every operation commits on a full clone of the state.
fn measure_baseline(
    dir: &mut Directory,
    workload: &mut Workload,
    now: Instant,
    budget: Budget,
) -> (f64, Sink) {
    let mut out = Outbox::new();
    let mut sink = Sink::new();
    let mut messages = Vec::with_capacity(2);
    let mut elapsed = WallDuration::ZERO;
    let mut ops = 0u64;
    while elapsed < budget.baseline_min_time || ops < budget.baseline_min_ops {
        // Register + Unregister, so the namespace size is back to N after every pair.
        workload.steps(2, &mut messages);
        for message in messages.drain(..) {
            let counted = !matches!(&message, Message::Call(c)
                if matches!(c.request, DirectoryRequest::OperationsDone { .. }));
            let start = WallInstant::now();
            let mut next = dir.clone();
            step(&mut next, now, message, &mut out, &mut sink);
            *dir = next;
            elapsed += start.elapsed();
            ops += u64::from(counted);
        }
    }
    black_box(&*dir);
    (ops as f64 / elapsed.as_secs_f64(), sink)
}

/// A rate for printing: whole ops/s when large, two decimals when small.
fn rate(ops_per_sec: f64) -> String {
    if ops_per_sec >= 1000.0 {
        format!("{ops_per_sec:.0}")
    } else {
        format!("{ops_per_sec:.2}")
    }
}

/// One measurement's result.
#[derive(Debug)]
struct Measurement {
    id: String,
    ours: f64,
    baseline: f64,
}

fn run(id: &str, n: usize, budget: Budget) -> Measurement {
    let now = Instant::ZERO;
    let started = WallInstant::now();
    let (mut dir, mut workload) = setup(n, now);
    println!(
        "# {id}: setup of {n} bindings took {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // The baseline runs first, on the freshly built state; ours continues from where it left.
    let (baseline, baseline_sink) = measure_baseline(&mut dir, &mut workload, now, budget);
    println!("# {id}: baseline done, measuring ours");
    let (ours, sink) = measure_ours(&mut dir, &mut workload, now, budget);

    assert_eq!(
        baseline_sink.failed_replies, 0,
        "{id}: baseline replies failed"
    );
    assert_eq!(sink.failed_replies, 0, "{id}: replies failed");
    assert_eq!(
        dir.durable().entry_count(),
        n,
        "{id}: namespace size drifted"
    );
    assert_eq!(
        dir.durable().obligation_count(),
        0,
        "{id}: obligations left"
    );
    println!(
        "# {id}: {} records framed, {:.1} bytes/record; {} ids in the operation table",
        sink.persisted,
        sink.framed_bytes as f64 / sink.persisted.max(1) as f64,
        dir.durable().operations().count(),
    );
    println!(
        "BENCH name={id} ours={} baseline={} ratio={:.2}",
        rate(ours),
        rate(baseline),
        ours / baseline
    );
    // Free the big state before the next size is built.
    drop(black_box(dir));
    Measurement {
        id: id.to_string(),
        ours,
        baseline,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("DATAPLANE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let budget = if quick {
        Budget::quick()
    } else {
        Budget::full()
    };
    if quick {
        println!("# quick mode: short measurements, numbers are indicative only");
    }

    let sizes = [
        ("directory_mix_1k", 1_000),
        ("directory_mix_100k", 100_000),
        ("directory_mix_1m", 1_000_000),
    ];
    let mut results = Vec::new();
    for (id, n) in sizes {
        if !filters.is_empty() && !filters.iter().any(|f| id.contains(f.as_str())) {
            continue;
        }
        results.push(run(id, n, budget));
    }

    let find = |id: &str| results.iter().find(|r| r.id == id);
    for r in &results {
        let verdict = if r.ours >= TARGET_OPS_PER_SEC {
            "meets"
        } else {
            "MISSES"
        };
        println!(
            "# {}: {verdict} the {} ops/s target",
            r.id,
            rate(TARGET_OPS_PER_SEC)
        );
    }
    if let (Some(small), Some(large)) = (find("directory_mix_1k"), find("directory_mix_1m")) {
        let spread = large.ours / small.ours;
        let verdict = if spread >= 1.0 / TARGET_SIZE_SPREAD {
            "meets"
        } else {
            "MISSES"
        };
        println!(
            "# rate 1m/1k = {spread:.3} (1k is {:.2}x the 1m rate; {verdict} the within-{TARGET_SIZE_SPREAD}x target)",
            1.0 / spread
        );
    }
    if let Some(r) = find("directory_mix_100k") {
        let ratio = r.ours / r.baseline;
        let verdict = if ratio >= TARGET_RATIO_AT_100K {
            "meets"
        } else {
            "MISSES"
        };
        println!("# ratio at 100k = {ratio:.2} ({verdict} the >= {TARGET_RATIO_AT_100K}x target)");
    }
}

//! A directory that runs for years: snapshot bytes, operation records held and recovery time
//! after 10 thousand, 1 million and 10 million mutations at constant live state (issue 13).
//!
//! Run with `cargo bench -p dataplane-core --bench long_life` (add `-- --quick`, or set
//! `DATAPLANE_BENCH_QUICK=1`, for a seconds-long smoke run that stops at 100 thousand; any
//! other non-flag argument filters the workloads by substring of their name). Each checkpoint
//! prints, per figure, one line
//!
//! ```text
//! BENCH name=long_life/<workload>/<mutations>/<figure> ours=<value> baseline=<value at 10k> ratio=<ours/baseline>
//! ```
//!
//! plus `#` lines: the issue's table (mutations, snapshot records, snapshot MB, recovery ms,
//! process RSS) for each workload. The target is a ratio of at most 1.5 for every figure at 10
//! million.
//!
//! * **Workloads** (in-memory directory, every `Persist` framed into a reused buffer, no IO):
//!   - `one_path`: Register a fresh source at `/p`, Unregister it, acknowledge the Retire:
//!     nothing stays live (the issue's measurement);
//!   - `mix_1000`: 1,000 paths `/mix/<i>`, each step picks one pseudo-randomly and Registers a
//!     fresh source there (replacing and retiring the old one) or, one time in four,
//!     Unregisters it; retirements are acknowledged. About 800 paths stay bound.
//!
//!   Each Register and Unregister is one mutation with a fresh operation id of one issuer (a
//!   host, lane 0 of node 1's first incarnation).
//! * **Retention**: like a host on its tick, the issuer declares its operations done every
//!   1,000 mutations, everything but the last 100 (still "in flight").
//! * **Figures** at each checkpoint: the bytes of the compaction (`snapshot_records`, framed
//!   as the log frames them), the operation records it holds, and the time to decode those
//!   bytes and `Directory::recover` from them (median of 5). RSS is the process's `VmRSS`
//!   (informational: it includes the allocator's free lists; the checkpoints run in order in
//!   one process).
//!
//! Benches live outside the pure core, so they may read the wall clock and /proc.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::Instant as WallInstant;

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::ids::{Address, Issuer, NodeId, OperationId, RequestId};
use dataplane_core::log::{append_record, decode_log, encode_log};
use dataplane_core::path::DataPath;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, Message, SourceRecovery,
};

const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
/// The caller: the proxy of node 1 in its first incarnation.
const CALLER: Address = Address::new(NodeId(1), 1, 500);
/// The issuer of every operation (a host: lane 0).
const ISSUER: Issuer = Issuer::new(NodeId(1), 1, 0);
/// Mutations between two declarations, and how many recent ones stay undeclared.
const DECLARE_EVERY: u64 = 1_000;
const IN_FLIGHT: u64 = 100;
const MIX_PATHS: u64 = 1_000;
/// The target: every figure at 10 million within this factor of its 10-thousand value.
const TARGET_RATIO: f64 = 1.5;
/// The log buffer is cleared once it holds this many bytes.
const LOG_BUFFER_CLEAR_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    OnePath,
    Mix,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::OnePath => "one_path",
            Kind::Mix => "mix_1000",
        }
    }
}

/// Drives one directory with one workload and declares its operations done.
struct Driver {
    kind: Kind,
    dir: Directory,
    out: Outbox,
    log: Vec<u8>,
    next_seq: u64,
    next_source: u64,
    next_request: u64,
    declared: u64,
    rng: u64,
    bound: Vec<bool>,
    mutations: u64,
    refused: u64,
}

impl Driver {
    fn new(kind: Kind) -> Driver {
        let mut out = Outbox::new();
        let dir = Directory::recover(config(), &[], &mut ActorSources, Instant::ZERO, &mut out)
            .expect("recovery of an empty log");
        let mut d = Driver {
            kind,
            dir,
            out,
            log: Vec::with_capacity(LOG_BUFFER_CLEAR_BYTES + 4096),
            next_seq: 1,
            next_source: 1,
            next_request: 1,
            declared: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
            bound: vec![false; MIX_PATHS as usize],
            mutations: 0,
            refused: 0,
        };
        d.drain();
        d
    }

    fn deliver(&mut self, message: Message) {
        self.dir
            .handle_message(Instant::ZERO, message, &mut self.out)
            .expect("a directory input");
        self.drain();
    }

    /// Frames every Persist, acknowledges every Retire at once, counts refusals.
    fn drain(&mut self) {
        let mut retired = Vec::new();
        for effect in self.out.drain() {
            match effect {
                Effect::Persist(record) => {
                    append_record(&mut self.log, &record).expect("a framable record");
                }
                Effect::Send {
                    to,
                    message: Message::Retire { .. },
                } => retired.push(to),
                Effect::Send {
                    message: Message::Reply(DirectoryReply { body, .. }),
                    ..
                } => {
                    if body.err().is_some() {
                        self.refused += 1;
                    }
                }
                other => drop(black_box(other)),
            }
        }
        if self.log.len() >= LOG_BUFFER_CLEAR_BYTES {
            black_box(self.log.as_slice());
            self.log.clear();
        }
        for source in retired {
            self.deliver(Message::SourceRetired { source });
        }
    }

    fn call(&mut self, request: DirectoryRequest) {
        let request_id = RequestId(self.next_request);
        self.next_request += 1;
        self.deliver(Message::Call(DirectoryCall {
            request_id,
            reply_to: CALLER,
            request,
        }));
    }

    fn operation(&mut self) -> OperationId {
        let op = ISSUER.op(self.next_seq);
        self.next_seq += 1;
        op
    }

    fn register(&mut self, path: DataPath) {
        let source = Address::new(NodeId(1), 1, 1_000_000 + self.next_source);
        self.next_source += 1;
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
        });
    }

    fn unregister(&mut self, path: DataPath) {
        let operation = self.operation();
        self.call(DirectoryRequest::Unregister {
            path,
            expected_revision: None,
            operation,
        });
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: deterministic, and enough for picking paths.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// One mutation (two for one_path's pair counts as two), then a declaration when due.
    fn step(&mut self) {
        match self.kind {
            Kind::OnePath => {
                let p = DataPath::new("/p").expect("a valid path");
                if self.mutations.is_multiple_of(2) {
                    self.register(p);
                } else {
                    self.unregister(p);
                }
            }
            Kind::Mix => {
                let r = self.next_random();
                let i = (r % MIX_PATHS) as usize;
                let p = DataPath::new(format!("/mix/{i}")).expect("a valid path");
                if self.bound[i] && (r >> 32).is_multiple_of(4) {
                    self.unregister(p);
                    self.bound[i] = false;
                } else {
                    self.register(p);
                    self.bound[i] = true;
                }
            }
        }
        self.mutations += 1;
        if self.mutations.is_multiple_of(DECLARE_EVERY) {
            let below = self.next_seq.saturating_sub(IN_FLIGHT);
            if below > self.declared {
                self.declared = below;
                self.call(DirectoryRequest::OperationsDone {
                    issuer: ISSUER,
                    below,
                });
            }
        }
    }
}

fn config() -> DirectoryConfig {
    DirectoryConfig {
        address: DIRECTORY,
        retry_period: Duration::from_secs(1),
        limits: Default::default(),
    }
}

/// The figures of one checkpoint.
#[derive(Clone, Copy, Debug)]
struct Figures {
    snapshot_records: usize,
    snapshot_bytes: usize,
    records_held: usize,
    recovery_ms: f64,
    rss_mb: f64,
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn measure(d: &Driver) -> Figures {
    let records = d.dir.snapshot_records();
    let bytes = encode_log(&records).expect("an encodable snapshot");
    let mut times = Vec::new();
    for _ in 0..5 {
        let start = WallInstant::now();
        let decoded = decode_log(&bytes);
        assert!(decoded.defect.is_none(), "the snapshot decodes whole");
        let mut out = Outbox::new();
        let recovered = Directory::recover(
            config(),
            &decoded.records,
            &mut ActorSources,
            Instant::ZERO,
            &mut out,
        )
        .expect("recovery from the snapshot");
        black_box(&recovered);
        times.push(start.elapsed().as_secs_f64() * 1e3);
        assert_eq!(
            recovered.durable().operation_count(),
            d.dir.durable().operation_count()
        );
    }
    times.sort_by(f64::total_cmp);
    Figures {
        snapshot_records: records.len(),
        snapshot_bytes: bytes.len(),
        records_held: d.dir.durable().operation_count(),
        recovery_ms: times[times.len() / 2],
        rss_mb: rss_mb(),
    }
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n.is_multiple_of(1_000) => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn run(kind: Kind, checkpoints: &[u64]) {
    let mut d = Driver::new(kind);
    let started = WallInstant::now();
    let mut base: Option<Figures> = None;
    println!(
        "# {}: mutations | snapshot records | snapshot MB | records held | recovery ms | RSS MB",
        kind.name()
    );
    for &at in checkpoints {
        while d.mutations < at {
            d.step();
        }
        let f = measure(&d);
        println!(
            "# {}: {:>10} | {:>8} | {:>8.3} | {:>6} | {:>8.3} | {:>7.1}   ({:.1} s in)",
            kind.name(),
            at,
            f.snapshot_records,
            f.snapshot_bytes as f64 / 1e6,
            f.records_held,
            f.recovery_ms,
            f.rss_mb,
            started.elapsed().as_secs_f64()
        );
        let b = *base.get_or_insert(f);
        let name = format!("long_life/{}/{}", kind.name(), human(at));
        let lines = [
            (
                "snapshot_bytes",
                f.snapshot_bytes as f64,
                b.snapshot_bytes as f64,
            ),
            ("records_held", f.records_held as f64, b.records_held as f64),
            ("recovery_ms", f.recovery_ms, b.recovery_ms),
        ];
        for (figure, ours, baseline) in lines {
            println!(
                "BENCH name={name}/{figure} ours={ours:.3} baseline={baseline:.3} ratio={:.2}",
                ours / baseline.max(1e-9)
            );
        }
    }
    assert_eq!(d.refused, 0, "no mutation was refused");
    let last = measure(&d);
    let first = base.expect("at least one checkpoint");
    let worst = [
        last.snapshot_bytes as f64 / first.snapshot_bytes.max(1) as f64,
        last.records_held as f64 / first.records_held.max(1) as f64,
        last.recovery_ms / first.recovery_ms.max(1e-9),
    ]
    .into_iter()
    .fold(0.0, f64::max);
    println!(
        "# {}: worst ratio at {} against {}: {worst:.2} (target <= {TARGET_RATIO}; {})",
        kind.name(),
        human(d.mutations),
        human(checkpoints[0]),
        if worst <= TARGET_RATIO {
            "met"
        } else {
            "missed"
        }
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick =
        args.iter().any(|a| a == "--quick") || std::env::var_os("DATAPLANE_BENCH_QUICK").is_some();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let checkpoints: &[u64] = if quick {
        &[10_000, 100_000]
    } else {
        &[10_000, 1_000_000, 10_000_000]
    };
    for kind in [Kind::OnePath, Kind::Mix] {
        if filters.is_empty() || filters.iter().any(|f| kind.name().contains(f.as_str())) {
            run(kind, checkpoints);
        }
    }
}

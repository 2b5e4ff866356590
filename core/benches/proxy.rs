//! Proxy round-trip throughput: N callers' requests going caller → proxy → directory → proxy →
//! caller, against the same callers talking to the directory directly.
//!
//! Run with `cargo bench -p dataplane-core --bench proxy` (add `-- --quick`, or set
//! `DATAPLANE_BENCH_QUICK=1`, for a short smoke run). It prints one line
//!
//! ```text
//! BENCH name=proxy_roundtrip ours=<req/s> baseline=<req/s> ratio=<ours/baseline>
//! ```
//!
//! plus informational lines starting with `#`.
//!
//! * **Callers**: [`CALLERS`] callers on one node, each with its own path `/bench/<i>/blob`,
//!   cycling through Register (fresh operation id, fresh source) → Lookup → Resolve →
//!   Unregister (fresh operation id), so every request succeeds and the mix is a quarter of
//!   each. In every round each caller issues its next request, so [`CALLERS`] requests are
//!   outstanding together.
//! * **Harness**: in memory, no IO. A tight loop moves effects between the machines in order:
//!   every `Persist` is framed with [`append_record`] into a reused buffer (cleared at 1 MiB);
//!   every `Retire` is acknowledged with `SourceRetired` (not counted as a request); every
//!   reply reaching a caller is checked. Requests are built before each timed chunk.
//! * **ours**: the callers call [`Proxy::request`]; the proxy's `Call`s go to the directory;
//!   the directory's `Reply`s go back through [`Proxy::handle_message`]; the proxy's replies
//!   reach the callers.
//! * **baseline**: the callers send the same requests as `Call`s straight to the directory and
//!   read its replies.
//!
//! The two run on separate directories fed the identical request sequence, in alternating
//! chunks, so both see the same state sizes and the same machine conditions.
//!
//! Benches live outside the pure core, so they may read the wall clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::{Duration as WallDuration, Instant as WallInstant};

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::ids::{Address, NodeId, OperationId, RequestId};
use dataplane_core::log::append_record;
use dataplane_core::path::DataPath;
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, Message, SourceRecovery,
};

/// Node 0 hosts the directory; the proxy and its callers live on node 1; sources on 2...
const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
const PROXY: Address = Address::new(NodeId(1), 1, 0);
/// How many callers have a request outstanding at once.
const CALLERS: usize = 64;
/// Rounds (one request per caller each) per timed chunk.
const CHUNK_ROUNDS: usize = 64;
/// Sources are spread over this many host nodes.
const SOURCE_NODES: u64 = 64;
/// The log buffer is cleared once it holds this many bytes.
const LOG_BUFFER_CLEAR_BYTES: usize = 1 << 20;
/// The ratio the numbers are judged against (informational).
const TARGET_RATIO: f64 = 0.7;

/// How long each side is measured.
#[derive(Clone, Copy, Debug)]
struct Budget {
    min_time: WallDuration,
    min_chunks: u64,
}

impl Budget {
    fn full() -> Self {
        Budget {
            min_time: WallDuration::from_secs(1),
            min_chunks: 20,
        }
    }

    fn quick() -> Self {
        Budget {
            min_time: WallDuration::from_millis(50),
            min_chunks: 4,
        }
    }
}

fn caller_address(i: usize) -> Address {
    Address::new(NodeId(1), 1, 1 + i as u64)
}

/// The request generator: each caller cycles Register → Lookup → Resolve → Unregister.
#[derive(Debug)]
struct Workload {
    paths: Vec<DataPath>,
    step: Vec<u8>,
    next_operation: u128,
    next_source: u64,
    /// Each caller's next correlation id.
    next_request: Vec<u64>,
}

impl Workload {
    fn new() -> Self {
        Workload {
            paths: (0..CALLERS)
                .map(|i| DataPath::new(format!("/bench/{i}/blob")).expect("a valid path"))
                .collect(),
            step: vec![0; CALLERS],
            next_operation: 1,
            next_source: 0,
            next_request: vec![1; CALLERS],
        }
    }

    fn operation(&mut self) -> OperationId {
        let operation = OperationId(self.next_operation);
        self.next_operation += 1;
        operation
    }

    /// Caller `i`'s next request, with its correlation id.
    fn next(&mut self, i: usize) -> (RequestId, DirectoryRequest) {
        let path = self.paths[i].clone();
        let request = match self.step[i] {
            0 => {
                let n = self.next_source;
                self.next_source += 1;
                let source = Address::new(NodeId(2 + n % SOURCE_NODES), 1, n);
                DirectoryRequest::Register {
                    path,
                    source,
                    source_node: source.node,
                    length: 4096,
                    recovery: SourceRecovery::Actor {
                        actor: source,
                        node: source.node,
                        owner: None,
                    },
                    operation: self.operation(),
                    reservation: None,
                }
            }
            1 => DirectoryRequest::Lookup { path },
            2 => DirectoryRequest::Resolve { path },
            _ => DirectoryRequest::Unregister {
                path,
                expected_revision: None,
                operation: self.operation(),
            },
        };
        self.step[i] = (self.step[i] + 1) % 4;
        let id = RequestId(self.next_request[i]);
        self.next_request[i] += 1;
        (id, request)
    }

    /// One chunk of requests: `CHUNK_ROUNDS` rounds of one request per caller.
    fn chunk(&mut self, into: &mut Vec<(usize, RequestId, DirectoryRequest)>) {
        into.clear();
        for _ in 0..CHUNK_ROUNDS {
            for i in 0..CALLERS {
                let (id, request) = self.next(i);
                into.push((i, id, request));
            }
        }
    }
}

/// What executing effects produced: log bytes, retirements to acknowledge, caller replies.
#[derive(Debug)]
struct Sink {
    log: Vec<u8>,
    persisted: u64,
    framed_bytes: u64,
    acks: Vec<Address>,
    replies: u64,
    failed_replies: u64,
    /// The correlation id each caller expects next.
    expected: Vec<u64>,
}

impl Sink {
    fn new() -> Self {
        Sink {
            log: Vec::with_capacity(LOG_BUFFER_CLEAR_BYTES + 4096),
            persisted: 0,
            framed_bytes: 0,
            acks: Vec::new(),
            replies: 0,
            failed_replies: 0,
            expected: vec![1; CALLERS],
        }
    }

    fn persist(&mut self, record: &dataplane_core::log::LogRecord) {
        let framed = append_record(&mut self.log, record).expect("a framable record");
        self.framed_bytes += framed as u64;
        self.persisted += 1;
        if self.log.len() >= LOG_BUFFER_CLEAR_BYTES {
            black_box(self.log.as_slice());
            self.log.clear();
        }
    }

    /// A reply reaching caller `to`.
    fn caller_reply(&mut self, to: Address, reply: &DirectoryReply) {
        let i = (to.actor - 1) as usize;
        assert_eq!(reply.request_id.0, self.expected[i], "reply out of order");
        self.expected[i] += 1;
        self.replies += 1;
        if reply.body.err().is_some() {
            self.failed_replies += 1;
        }
        black_box(&reply.body);
    }
}

/// One side of the comparison: a directory, and for "ours" a proxy in front of it.
#[derive(Debug)]
struct World {
    dir: Directory,
    proxy: Option<Proxy>,
    now: Instant,
    /// The proxy's effects.
    proxy_out: Outbox,
    /// The directory's effects.
    dir_out: Outbox,
    /// The proxy's effects while it handles a directory reply.
    reply_out: Outbox,
    sink: Sink,
}

impl World {
    fn new(with_proxy: bool) -> Self {
        let now = Instant::ZERO;
        let mut sink = Sink::new();
        let mut dir_out = Outbox::new();
        let config = DirectoryConfig {
            address: DIRECTORY,
            retry_period: Duration::from_secs(1),
            // The workload never declares its operations done (this bench measures the
            // proxy and the host, not retention): the operation tables are left unbounded.
            limits: dataplane_core::directory::DirectoryLimits {
                operations: usize::MAX,
                issuer_operations: usize::MAX,
                ..Default::default()
            },
        };
        let dir = Directory::recover(config, &[], &mut ActorSources, now, &mut dir_out)
            .expect("recovery");
        for effect in dir_out.drain() {
            if let Effect::Persist(record) = effect {
                sink.persist(&record);
            }
        }
        let proxy = with_proxy.then(|| {
            let mut out = Outbox::new();
            let mut proxy = Proxy::new(ProxyConfig::new(PROXY), now, &mut out);
            let found = Discovered {
                address: DIRECTORY,
                epoch: dir.epoch(),
            };
            proxy.handle_discovery(now, Some(found), &mut out);
            proxy
        });
        World {
            dir,
            proxy,
            now,
            proxy_out: Outbox::new(),
            dir_out: Outbox::new(),
            reply_out: Outbox::new(),
            sink,
        }
    }

    /// Executes the directory's effects in order; replies go to the proxy (ours) or straight
    /// to the callers (baseline); retirements are acknowledged afterwards.
    fn drain_directory(&mut self) {
        loop {
            for effect in self.dir_out.drain() {
                match effect {
                    Effect::Persist(record) => self.sink.persist(&record),
                    Effect::Send { to, message } => match (message, &mut self.proxy) {
                        (Message::Retire { .. }, _) => self.sink.acks.push(to),
                        (Message::Reply(reply), None) => self.sink.caller_reply(to, &reply),
                        (message @ Message::Reply(_), Some(proxy)) => {
                            debug_assert_eq!(to, PROXY);
                            proxy
                                .handle_message(self.now, message, &mut self.reply_out)
                                .expect("a proxy input");
                            for effect in self.reply_out.drain() {
                                match effect {
                                    Effect::Send {
                                        to,
                                        message: Message::Reply(reply),
                                    } => self.sink.caller_reply(to, &reply),
                                    other => panic!("unexpected proxy effect {other:?}"),
                                }
                            }
                        }
                        (other, _) => drop(black_box(other)),
                    },
                    other => drop(black_box(other)),
                }
            }
            let Some(source) = self.sink.acks.pop() else {
                break;
            };
            self.dir
                .handle_message(
                    self.now,
                    Message::SourceRetired { source },
                    &mut self.dir_out,
                )
                .expect("a directory input");
        }
    }

    /// One chunk: every round's requests enter together, then their effects are moved.
    fn run_chunk(&mut self, requests: &mut Vec<(usize, RequestId, DirectoryRequest)>) {
        let mut batch = requests.drain(..);
        for _ in 0..CHUNK_ROUNDS {
            let round = batch.by_ref().take(CALLERS);
            match &mut self.proxy {
                Some(proxy) => {
                    for (i, id, request) in round {
                        proxy.request(
                            self.now,
                            caller_address(i),
                            id,
                            request,
                            &mut self.proxy_out,
                        );
                    }
                    // Swap the proxy's calls out so the directory's replies can re-enter it.
                    let mut calls = std::mem::take(&mut self.proxy_out);
                    for effect in calls.drain() {
                        match effect {
                            Effect::Send { to, message } => {
                                debug_assert_eq!(to, DIRECTORY);
                                self.dir
                                    .handle_message(self.now, message, &mut self.dir_out)
                                    .expect("a directory input");
                                self.drain_directory();
                            }
                            other => panic!("unexpected proxy effect {other:?}"),
                        }
                    }
                    self.proxy_out = calls;
                }
                None => {
                    for (i, id, request) in round {
                        let call = DirectoryCall {
                            request_id: id,
                            reply_to: caller_address(i),
                            request,
                        };
                        self.dir
                            .handle_message(self.now, Message::Call(call), &mut self.dir_out)
                            .expect("a directory input");
                        self.drain_directory();
                    }
                }
            }
        }
    }
}

/// A rate for printing.
fn rate(per_sec: f64) -> String {
    if per_sec >= 1000.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec:.2}")
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("DATAPLANE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let budget = if quick {
        Budget::quick()
    } else {
        Budget::full()
    };
    if quick {
        println!("# quick mode: short measurements, numbers are indicative only");
    }

    let mut ours = World::new(true);
    let mut baseline = World::new(false);
    // Both sides get the identical request sequence from twin generators.
    let mut ours_load = Workload::new();
    let mut baseline_load = Workload::new();
    let per_chunk = (CALLERS * CHUNK_ROUNDS) as u64;
    let mut requests = Vec::with_capacity(CALLERS * CHUNK_ROUNDS);

    // One untimed chunk each to warm caches and the allocator.
    ours_load.chunk(&mut requests);
    ours.run_chunk(&mut requests);
    baseline_load.chunk(&mut requests);
    baseline.run_chunk(&mut requests);

    let mut ours_time = WallDuration::ZERO;
    let mut baseline_time = WallDuration::ZERO;
    let mut chunks = 0u64;
    // ours/baseline of each pair of back-to-back chunks (robust to load from other processes).
    let mut pair_ratios = Vec::new();
    while ours_time < budget.min_time
        || baseline_time < budget.min_time
        || chunks < budget.min_chunks
    {
        // Alternate which side goes first, so neither always runs on a warmer cache.
        let sides: [bool; 2] = if chunks.is_multiple_of(2) {
            [true, false]
        } else {
            [false, true]
        };
        let mut took = [WallDuration::ZERO; 2];
        for with_proxy in sides {
            let (world, load, time) = if with_proxy {
                (&mut ours, &mut ours_load, &mut ours_time)
            } else {
                (&mut baseline, &mut baseline_load, &mut baseline_time)
            };
            load.chunk(&mut requests);
            let start = WallInstant::now();
            world.run_chunk(&mut requests);
            let elapsed = start.elapsed();
            *time += elapsed;
            took[usize::from(with_proxy)] = elapsed;
        }
        // Rates are per chunk of equal size, so the rate ratio is baseline time / ours time.
        pair_ratios.push(took[0].as_secs_f64() / took[1].as_secs_f64());
        chunks += 1;
    }

    for (name, world) in [("ours", &ours), ("baseline", &baseline)] {
        let sink = &world.sink;
        assert_eq!(sink.failed_replies, 0, "{name}: replies failed");
        assert_eq!(
            sink.replies,
            (chunks + 1) * per_chunk,
            "{name}: replies lost"
        );
        assert_eq!(
            world.dir.durable().obligation_count(),
            0,
            "{name}: obligations left"
        );
        println!(
            "# {name}: {} requests in {:.2} s; {} records framed, {:.1} bytes/record",
            chunks * per_chunk,
            if name == "ours" {
                ours_time.as_secs_f64()
            } else {
                baseline_time.as_secs_f64()
            },
            sink.persisted,
            sink.framed_bytes as f64 / sink.persisted.max(1) as f64,
        );
    }
    if let Some(proxy) = &ours.proxy {
        assert_eq!(proxy.pending_count(), 0, "requests left pending");
    }
    assert_eq!(
        ours.dir.durable().entry_count(),
        baseline.dir.durable().entry_count()
    );

    let requests_done = (chunks * per_chunk) as f64;
    let ours_rate = requests_done / ours_time.as_secs_f64();
    let baseline_rate = requests_done / baseline_time.as_secs_f64();
    let ratio = ours_rate / baseline_rate;
    println!(
        "BENCH name=proxy_roundtrip ours={} baseline={} ratio={ratio:.2}",
        rate(ours_rate),
        rate(baseline_rate),
    );
    pair_ratios.sort_by(f64::total_cmp);
    let at = |q: f64| pair_ratios[((pair_ratios.len() - 1) as f64 * q).round() as usize];
    println!(
        "# per-chunk-pair ratio ({} pairs of {per_chunk} requests): p10={:.2} median={:.2} p90={:.2}",
        pair_ratios.len(),
        at(0.1),
        at(0.5),
        at(0.9),
    );
    let verdict = if ratio >= TARGET_RATIO {
        "meets"
    } else {
        "MISSES"
    };
    println!("# ratio {ratio:.2} {verdict} the >= {TARGET_RATIO} target");
    black_box((&ours, &baseline));
}

//! Host data-path throughput: a local publish-then-read on one host, and a chunked transfer
//! between two hosts, each against a plain `memcpy` of the same bytes measured in the same run.
//!
//! Run with `cargo bench -p dataplane-core --bench host` (add `-- --quick`, or set
//! `DATAPLANE_BENCH_QUICK=1`, for a sub-second smoke run of the 1 MiB sizes only; any other
//! non-flag argument filters the measurements by substring of their id,
//! `local_publish_read/<size>/<digest>` or `transfer/<size>/<chunk>/<encoding>`, e.g.
//! `-- transfer/64MiB`). Each measurement prints one line:
//!
//! ```text
//! BENCH name=<id> size=<blob> ... ours=<bytes/s> baseline=memcpy memcpy=<bytes/s> ratio=<ours/memcpy>
//! ```
//!
//! plus informational lines starting with `#`. Rates are bytes per second; `baseline=` names
//! what the baseline does and `memcpy=` is its rate. Both rates are the **best** of several
//! repetitions, interleaved (the machine is shared and noisy); a repetition is as many
//! back-to-back cycles as make about 16 MiB, timed as a whole (only the timed parts of each
//! cycle count).
//!
//! Every machine is real and in memory, wired by a FIFO queue of frames: one
//! [`Directory`] (recovered from an empty log; every `Persist` is framed with
//! [`append_record`] into a reused buffer), and per node a [`Proxy`] (discovered the directory)
//! and a [`Host`] with its arena, a `Vec<u8>` the children "map". Children are addresses whose
//! frames the harness queues for the host session; they act on the arena directly. Time does
//! not advance (no timer fires: nothing is lost, so nothing is retried).
//!
//! * **`local_publish_read`** (1 MiB and 64 MiB; `digest=none` is the measurement, a second
//!   line with `digest=blake3` is for information). On one host, a writer child's
//!   `OpenWrite` (non-exclusive) → the host allocates and installs a zeroed writable lease →
//!   `WriteGranted` → the child fills the payload (`fill(byte)`) and seals the header
//!   ([`blob::child_seal`]) → `Seal` → the host validates it and Registers through the proxy
//!   and the directory → `Published` → a reader child (another session on the same host)
//!   `OpenRead`s the path → Resolve through the proxy and the directory → the host allocates a
//!   filling lease and copies the payload inside the arena (`read.rs` `local_copy`) →
//!   `ReadGranted`. Timed: from sending `OpenWrite` to receiving `ReadGranted`, the child's fill
//!   included. Untimed after each cycle: the reader checks every payload byte, releases its
//!   read; the writer aborts (Unregister, Retire) and releases its write, so the arena is empty
//!   again and the next cycle reuses the same bytes.
//!   **Baseline (`memcpy`)**: fill a buffer of the same size with a byte (`fill`), then copy it
//!   once into a second buffer (`copy_from_slice`): the byte traffic of producing the payload
//!   and copying it once, which is what a local read must do at least. Both buffers are
//!   allocated and touched before timing.
//! * **`transfer`** (1 MiB and 64 MiB; `chunk=` 64 KiB, the default, and 256 KiB). Two hosts on
//!   different nodes. Setup (untimed): host A publishes a blob (`digest=none`). Each cycle: a
//!   reader child on host B `OpenRead`s it → Resolve through B's proxy and the directory → B
//!   allocates a filling lease and pulls chunks (`ChunkRequest` → A's source → `Chunk`, `window`
//!   requests in flight) → B seals the lease → `ReadGranted`. Timed: from sending `OpenRead` to
//!   receiving `ReadGranted`. Untimed: the reader checks the payload and releases it.
//!   `encoding=none`: frames between the hosts are moved in memory as `Message`s, never
//!   encoded. A second line per size, `encoding=postcard`, encodes every frame between the two
//!   hosts (`ChunkRequest` and `Chunk`) as a [`wire::Envelope`] with [`wire::encode`] and
//!   delivers what [`wire::decode`] returns.
//!   **Baseline (`memcpy`)**: one `copy_from_slice` of the same number of bytes between two
//!   buffers allocated and touched before timing.
//!
//! Targets (not asserted; printed as `meets`/`MISSES`): `ratio >= 0.5` for
//! `local_publish_read` with `digest=none`, `ratio >= 0.3` for `transfer` with
//! `encoding=none`; the other lines (`digest=blake3`, `encoding=postcard`) are informational.
//!
//! What the byte traffic is, per payload byte: `local_publish_read` zeroes the write lease at
//! install (SPEC: a write lease is granted zeroed), the child fills it, the host copies it once
//! (the baseline does the last two only); with `digest=blake3` the payload is also hashed three
//! times: by the child at seal, by the host validating the seal (`write.rs`), and by the host
//! sealing the read lease against the source's digest (`read.rs` `complete_transfer`). A
//! `transfer` copies each chunk twice: arena → a fresh `Vec` at the source (`source.rs`), then
//! `Vec` → arena at the destination (`blob::write_chunk`).
//!
//! Allocator state: glibc raises its mmap and trim thresholds the first time a large block is
//! freed. Under the initial thresholds the transfer's per-chunk `Vec`s (a window of 64 KiB
//! allocations) make `free` trim the heap top and the next chunk fault its pages in again,
//! which costs the transfer several times its throughput. `main` frees one large block before
//! measuring, so every measurement (not only those after the first) runs with raised
//! thresholds, as a long-running host would.
//!
//! Benches live outside the pure core, so they may read the wall clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::{BTreeMap, VecDeque};
use std::hint::black_box;
use std::time::{Duration as WallDuration, Instant as WallInstant};

use dataplane_core::arena::{BLOB_ALIGNMENT, BLOB_HEADER_BYTES};
use dataplane_core::blob::{self, BlobAccess, BlobState, DigestKind, Expected};
use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::host::{Host, HostConfig, SessionConfig};
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::log::append_record;
use dataplane_core::path::{DataPath, JobContext};
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    self, Capability, ChildEvent, ChildOp, ChildRequest, Envelope, LeaseView, Message,
};

/// Node 0 hosts the directory; hosts live on nodes 1 and 2.
const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
/// Children are actors `CHILD_FIRST..HOST_FIRST` of their node; the proxy is actor 0.
const CHILD_FIRST: u64 = 100;
/// The host's first actor (sessions, bindings, sources).
const HOST_FIRST: u64 = 10_000;
const CAPABILITY: Capability = Capability([7; 32]);
/// The log buffer is cleared once it holds this many bytes.
const LOG_BUFFER_CLEAR_BYTES: usize = 1 << 20;
/// A repetition runs this many payload bytes (at least one cycle).
const REP_BYTES: u64 = 16 << 20;
/// The path every cycle writes and reads.
const BLOB_PATH: &str = "/data/bench/blob";

const MIB: u64 = 1 << 20;
/// The targets the numbers are judged against (printed, not asserted).
const TARGET_LOCAL_RATIO: f64 = 0.5;
const TARGET_TRANSFER_RATIO: f64 = 0.3;

/// How many repetitions each measurement runs: at least `min_reps`, and more while the
/// measurement (untimed checks and cleanup included) has run less than `min_wall`, up to
/// `max_reps`.
#[derive(Clone, Copy, Debug)]
struct Budget {
    min_reps: u32,
    max_reps: u32,
    min_wall: WallDuration,
}

impl Budget {
    fn full() -> Self {
        Budget {
            min_reps: 15,
            max_reps: 200,
            min_wall: WallDuration::from_secs(2),
        }
    }

    fn quick() -> Self {
        Budget {
            min_reps: 5,
            max_reps: 5,
            min_wall: WallDuration::ZERO,
        }
    }
}

/// How frames between hosts of different nodes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    /// Moved as `Message`s.
    None,
    /// Encoded with `wire::encode` and decoded with `wire::decode`.
    Postcard,
}

impl Encoding {
    fn label(self) -> &'static str {
        match self {
            Encoding::None => "none",
            Encoding::Postcard => "postcard",
        }
    }
}

#[derive(Debug)]
struct Frame {
    /// The sender as the transport reports it (children only: machines do not say).
    from: Address,
    to: Address,
    message: Message,
}

#[derive(Debug)]
struct Node {
    id: NodeId,
    proxy: Proxy,
    host: Host,
    mem: Vec<u8>,
}

#[derive(Debug)]
struct Child {
    node: usize,
    session: Address,
    inbox: VecDeque<ChildEvent>,
}

/// The directory, the nodes, the children and the frames in flight.
#[derive(Debug)]
struct World {
    now: Instant,
    dir: Directory,
    nodes: Vec<Node>,
    children: BTreeMap<Address, Child>,
    next_child: u64,
    queue: VecDeque<Frame>,
    out: Outbox,
    log: Vec<u8>,
    encoding: Encoding,
    /// Frames that crossed between hosts, and their encoded bytes (postcard only).
    crossed: u64,
    encoded_bytes: u64,
}

fn job() -> JobContext {
    let data = DataPath::new("/data").expect("a valid path");
    JobContext::new("bench", vec![data.clone()], vec![data]).expect("a valid job")
}

/// Bytes one lease of `length` occupies in the arena.
fn footprint(length: u64) -> u64 {
    (BLOB_HEADER_BYTES + length).div_ceil(BLOB_ALIGNMENT) * BLOB_ALIGNMENT
}

impl World {
    /// `nodes` nodes, each with an arena that holds two leases of `blob` bytes.
    fn new(nodes: usize, blob: u64, chunk_bytes: u32, encoding: Encoding) -> World {
        let now = Instant::ZERO;
        let mut out = Outbox::new();
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
        let dir =
            Directory::recover(config, &[], &mut ActorSources, now, &mut out).expect("recovery");
        let arena = 2 * footprint(blob) + 4096;
        let mut w = World {
            now,
            dir,
            nodes: Vec::new(),
            children: BTreeMap::new(),
            next_child: CHILD_FIRST,
            queue: VecDeque::new(),
            out,
            log: Vec::with_capacity(LOG_BUFFER_CLEAR_BYTES + 4096),
            encoding,
            crossed: 0,
            encoded_bytes: 0,
        };
        w.dir_effects();
        for n in 0..nodes {
            let id = NodeId(n as u64 + 1);
            let proxy_address = Address::new(id, 1, 0);
            let mut proxy = Proxy::new(ProxyConfig::new(proxy_address), now, &mut w.out);
            let found = Discovered {
                address: DIRECTORY,
                epoch: w.dir.epoch(),
            };
            proxy.handle_discovery(now, Some(found), &mut w.out);
            let mut config = HostConfig::new(id, 1, proxy_address, arena);
            config.chunk_bytes = chunk_bytes;
            config.first_actor = HOST_FIRST;
            let host = Host::new(config, now, &mut w.out);
            // Boot effects are timers only (nothing is pending yet): no timer ever fires here.
            for effect in w.out.drain() {
                assert!(
                    matches!(effect, Effect::SetTimer { .. }),
                    "unexpected boot effect {effect:?}"
                );
            }
            let mut mem = vec![0u8; arena as usize];
            // Touch every page now, so no timed cycle takes the first-touch faults.
            mem.fill(0xAA);
            w.nodes.push(Node {
                id,
                proxy,
                host,
                mem,
            });
        }
        w
    }

    /// A child on node `n` with its own attached session.
    fn child(&mut self, n: usize) -> Address {
        let config = SessionConfig {
            session_generation: 1,
            capability: CAPABILITY,
            job: job(),
        };
        let session = self.nodes[n].host.open_session(config).expect("a session");
        let child = Address::new(self.nodes[n].id, 1, self.next_child);
        self.next_child += 1;
        assert!(self.next_child < HOST_FIRST);
        self.children.insert(
            child,
            Child {
                node: n,
                session,
                inbox: VecDeque::new(),
            },
        );
        let arena_generation = self.nodes[n].host.config().arena_generation;
        self.send(
            child,
            ChildRequest::Attach {
                arena_generation,
                capability: CAPABILITY,
            },
        );
        match self.next_event(child) {
            ChildEvent::Attached { .. } => child,
            other => panic!("attach: {other:?}"),
        }
    }

    /// The child sends `request` to its session; every frame it causes is delivered.
    fn send(&mut self, child: Address, request: ChildRequest) {
        let session = self.children[&child].session;
        self.queue.push_back(Frame {
            from: child,
            to: session,
            message: Message::FromChild(request),
        });
        while let Some(frame) = self.queue.pop_front() {
            self.deliver(frame);
        }
    }

    /// The child's next event (there must be one).
    fn next_event(&mut self, child: Address) -> ChildEvent {
        let child = self.children.get_mut(&child).expect("a child");
        child.inbox.pop_front().expect("an event for the child")
    }

    /// The child's next event; it must be the only one waiting.
    fn only_event(&mut self, child: Address) -> ChildEvent {
        let event = self.next_event(child);
        let rest = &self.children[&child].inbox;
        assert!(rest.is_empty(), "{event:?}, then {rest:?}");
        event
    }

    fn node_of(&self, node: NodeId) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == node)
            .expect("a known node")
    }

    fn deliver(&mut self, frame: Frame) {
        let Frame { from, to, message } = frame;
        if to == DIRECTORY {
            self.dir
                .handle_message(self.now, message, &mut self.out)
                .expect("a directory input");
            self.dir_effects();
        } else if let Some(child) = self.children.get_mut(&to) {
            let Message::ToChild(event) = message else {
                panic!("{message:?} sent to child {to}");
            };
            child.inbox.push_back(event);
        } else {
            let n = self.node_of(to.node);
            let node = &mut self.nodes[n];
            if to.actor == 0 {
                node.proxy
                    .handle_message(self.now, message, &mut self.out)
                    .expect("a proxy input");
            } else {
                node.host
                    .handle_message(self.now, from, to, message, &mut node.mem, &mut self.out)
                    .expect("a host input");
            }
            self.node_effects(n);
        }
    }

    /// Queues (or executes) the directory's effects.
    fn dir_effects(&mut self) {
        loop {
            let effects = self.out.take();
            if effects.is_empty() {
                return;
            }
            for effect in effects {
                match effect {
                    Effect::Persist(record) => {
                        append_record(&mut self.log, &record).expect("a framable record");
                        if self.log.len() >= LOG_BUFFER_CLEAR_BYTES {
                            black_box(self.log.as_slice());
                            self.log.clear();
                        }
                    }
                    Effect::Send { to, message } => self.queue.push_back(Frame {
                        from: DIRECTORY,
                        to,
                        message,
                    }),
                    // Every node is up: every target is routable.
                    Effect::WatchRoute { target } => {
                        self.dir.handle_route(self.now, target, true, &mut self.out);
                    }
                    Effect::UnwatchRoute { .. }
                    | Effect::SetTimer { .. }
                    | Effect::CancelTimer { .. } => {}
                }
            }
        }
    }

    /// Queues the effects of node `n`'s proxy or host; frames between hosts of different nodes
    /// are encoded and decoded on the way if the world says so.
    fn node_effects(&mut self, n: usize) {
        let node = self.nodes[n].id;
        let mut effects = self.out.take();
        for effect in effects.drain(..) {
            match effect {
                Effect::Send { to, message } => {
                    let between_hosts = to.node != node
                        && to != DIRECTORY
                        && to.actor >= HOST_FIRST
                        && !self.children.contains_key(&to);
                    let from = Address::new(node, 1, 0);
                    let message = if between_hosts {
                        self.crossed += 1;
                        self.cross(from, to, message)
                    } else {
                        message
                    };
                    self.queue.push_back(Frame { from, to, message });
                }
                Effect::SetTimer { .. } | Effect::CancelTimer { .. } => {}
                other => panic!("unexpected node effect {other:?}"),
            }
        }
        self.out.recycle(effects);
    }

    /// A frame crossing the network between hosts.
    fn cross(&mut self, from: Address, to: Address, message: Message) -> Message {
        match self.encoding {
            Encoding::None => message,
            Encoding::Postcard => {
                let envelope = Envelope { from, to, message };
                let bytes = wire::encode(&envelope).expect("an encodable frame");
                self.encoded_bytes += bytes.len() as u64;
                wire::decode(&bytes).expect("a decodable frame").message
            }
        }
    }

    fn expected(view: &LeaseView, access: BlobAccess) -> Expected {
        Expected {
            offset: view.offset,
            length: view.length,
            generation: view.generation,
            access,
            digest_kind: view.digest,
        }
    }

    /// The child fills its writable lease with `byte` and seals the header.
    fn fill_and_seal(&mut self, child: Address, view: &LeaseView, byte: u8) {
        let n = self.children[&child].node;
        let e = Self::expected(view, BlobAccess::Writable);
        let mem = &mut self.nodes[n].mem;
        blob::payload_mut(mem, &e).expect("a payload").fill(byte);
        blob::child_seal(mem, &e).expect("a seal");
    }

    /// The reader checks its sealed read lease holds `length` bytes of `byte`.
    fn check_read(&self, child: Address, view: &LeaseView, length: u64, byte: u8) {
        let n = self.children[&child].node;
        let e = Self::expected(view, view.access);
        let mem = &self.nodes[n].mem;
        blob::validate(mem, &e, BlobState::Sealed, false).expect("a sealed read lease");
        let payload = blob::payload(mem, &e).expect("a payload");
        assert_eq!(payload.len() as u64, length);
        // A fold without early exit vectorizes (`all` would check byte by byte).
        let differs = payload.iter().fold(0u8, |acc, &b| acc | (b ^ byte));
        assert_eq!(differs, 0, "the read payload differs");
    }

    /// Opens a write of `length` bytes at [`BLOB_PATH`]; returns the lease.
    fn open_write(
        &mut self,
        child: Address,
        op: ChildOp,
        length: u64,
        digest: DigestKind,
    ) -> LeaseView {
        let request = ChildRequest::OpenWrite {
            op,
            path: BLOB_PATH.into(),
            length,
            digest,
            exclusive: false,
        };
        self.send(child, request);
        match self.only_event(child) {
            ChildEvent::WriteGranted { lease, .. } => lease,
            other => panic!("open write: {other:?}"),
        }
    }

    /// Seals a filled write; it must be published.
    fn seal(&mut self, child: Address, op: ChildOp) {
        self.send(child, ChildRequest::Seal { op });
        match self.only_event(child) {
            ChildEvent::Published { .. } => {}
            other => panic!("seal: {other:?}"),
        }
    }

    /// Opens a read of [`BLOB_PATH`]; it must be granted.
    fn read(&mut self, child: Address, op: ChildOp) -> LeaseView {
        let request = ChildRequest::OpenRead {
            op,
            path: BLOB_PATH.into(),
            expected_revision: None,
        };
        self.send(child, request);
        match self.only_event(child) {
            ChildEvent::ReadGranted { lease, .. } => lease,
            other => panic!("open read: {other:?}"),
        }
    }

    fn release(&mut self, child: Address, op: ChildOp) {
        self.send(child, ChildRequest::Release { op });
        match self.only_event(child) {
            ChildEvent::Released { .. } => {}
            other => panic!("release: {other:?}"),
        }
    }

    /// Aborts a published write (Unregister, then the directory retires its source).
    fn abort_published(&mut self, child: Address, op: ChildOp) {
        self.send(child, ChildRequest::Abort { op });
        match self.only_event(child) {
            ChildEvent::Aborted { .. } => {}
            other => panic!("abort: {other:?}"),
        }
    }

    fn live_leases(&self, n: usize) -> usize {
        self.nodes[n].host.arena().live_count()
    }

    fn check_invariants(&self) {
        self.dir.check_invariants().expect("directory invariants");
        for node in &self.nodes {
            node.proxy.check_invariants().expect("proxy invariants");
            node.host.check_invariants().expect("host invariants");
            assert_eq!(node.proxy.pending_count(), 0, "requests left pending");
        }
        assert!(self.queue.is_empty());
    }
}

/// A rate for printing: whole units/s when large, two decimals when small.
fn rate(per_sec: f64) -> String {
    if per_sec >= 1000.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec:.2}")
    }
}

fn size_label(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{}MiB", bytes / MIB)
    } else {
        format!("{bytes}B")
    }
}

fn digest_label(digest: DigestKind) -> &'static str {
    match digest {
        DigestKind::None => "none",
        DigestKind::Blake3 => "blake3",
    }
}

/// Cycles per repetition: about [`REP_BYTES`], at least one.
fn cycles_per_rep(length: u64) -> u64 {
    (REP_BYTES / length).max(1)
}

/// The best (and median) rates of the path and the baseline over interleaved repetitions.
#[derive(Debug)]
struct Rates {
    ours: f64,
    memcpy: f64,
    reps: u32,
    ours_median: f64,
    memcpy_median: f64,
}

/// Runs `ours` and `baseline` repetitions alternately (which goes first alternates too) until
/// the budget is spent. Each returns the timed part of one repetition of `bytes` bytes.
fn interleave(
    bytes: u64,
    budget: Budget,
    mut ours: impl FnMut() -> WallDuration,
    mut baseline: impl FnMut() -> WallDuration,
) -> Rates {
    // One untimed repetition each: caches, the allocator, the directory's tables.
    ours();
    baseline();
    let mut ours_rates = Vec::new();
    let mut memcpy_rates = Vec::new();
    let started = WallInstant::now();
    let mut reps = 0u32;
    while reps < budget.min_reps || (reps < budget.max_reps && started.elapsed() < budget.min_wall)
    {
        // Which side goes first alternates, so neither always runs on a warmer cache.
        for is_ours in [reps.is_multiple_of(2), !reps.is_multiple_of(2)] {
            if is_ours {
                ours_rates.push(bytes as f64 / ours().as_secs_f64());
            } else {
                memcpy_rates.push(bytes as f64 / baseline().as_secs_f64());
            }
        }
        reps += 1;
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Rates {
        ours: best(&ours_rates),
        memcpy: best(&memcpy_rates),
        reps,
        ours_median: median(&mut ours_rates),
        memcpy_median: median(&mut memcpy_rates),
    }
}

/// Two buffers of `length` bytes, touched.
fn buffers(length: u64) -> (Vec<u8>, Vec<u8>) {
    let mut a = vec![0u8; length as usize];
    let mut b = vec![0u8; length as usize];
    a.fill(1);
    b.fill(2);
    (a, b)
}

/// `memcpy` baseline of the local cycle: fill a buffer, copy it once.
fn memcpy_fill_copy(src: &mut [u8], dst: &mut [u8], cycles: u64, byte: &mut u8) -> WallDuration {
    let mut took = WallDuration::ZERO;
    for _ in 0..cycles {
        *byte = byte.wrapping_add(1);
        let start = WallInstant::now();
        src.fill(*byte);
        // Without this the optimizer turns the copy of memset bytes into a second memset.
        black_box(&mut *src);
        dst.copy_from_slice(src);
        black_box(&mut *dst);
        took += start.elapsed();
    }
    took
}

/// `memcpy` baseline of the transfer: copy the same bytes once.
fn memcpy_copy(src: &mut [u8], dst: &mut [u8], cycles: u64) -> WallDuration {
    let mut took = WallDuration::ZERO;
    for _ in 0..cycles {
        black_box(&mut *src);
        let start = WallInstant::now();
        dst.copy_from_slice(src);
        black_box(&mut *dst);
        took += start.elapsed();
    }
    took
}

/// Prints the BENCH line and a `#` line; `target` is `None` for informational lines.
fn report(line: &str, r: &Rates, target: Option<f64>) {
    let ratio = r.ours / r.memcpy;
    println!(
        "BENCH {line} ours={} baseline=memcpy memcpy={} ratio={ratio:.2}",
        rate(r.ours),
        rate(r.memcpy),
    );
    let verdict = match target {
        Some(target) if ratio >= target => format!("meets the >= {target} target"),
        Some(target) => format!("MISSES the >= {target} target"),
        None => "informational, no target".to_string(),
    };
    println!(
        "# best of {} reps: ours {:.0} MiB/s, memcpy {:.0} MiB/s; medians {:.0} / {:.0} MiB/s \
         (ratio {:.2}); {verdict}",
        r.reps,
        r.ours / MIB as f64,
        r.memcpy / MIB as f64,
        r.ours_median / MIB as f64,
        r.memcpy_median / MIB as f64,
        r.ours_median / r.memcpy_median,
    );
}

/// `local_publish_read` for one size and digest kind.
fn local_publish_read(length: u64, digest: DigestKind, budget: Budget) {
    let mut w = World::new(1, length, 64 * 1024, Encoding::None);
    let writer = w.child(0);
    let reader = w.child(0);
    let cycles = cycles_per_rep(length);
    let mut next_op = 1u64;
    let mut byte = 0u8;
    let mut check_every = 0u64;
    let mut ours = || {
        let mut took = WallDuration::ZERO;
        for _ in 0..cycles {
            let (write_op, read_op) = (ChildOp(next_op), ChildOp(next_op + 1));
            next_op += 2;
            byte = byte.wrapping_add(1);
            let start = WallInstant::now();
            let view = w.open_write(writer, write_op, length, digest);
            w.fill_and_seal(writer, &view, byte);
            w.seal(writer, write_op);
            let read = w.read(reader, read_op);
            took += start.elapsed();
            w.check_read(reader, &read, length, byte);
            w.release(reader, read_op);
            w.abort_published(writer, write_op);
            w.release(writer, write_op);
            assert_eq!(w.live_leases(0), 0, "the arena is not empty after a cycle");
            check_every += 1;
            if check_every % 64 == 1 {
                w.check_invariants();
            }
        }
        took
    };
    let (mut src, mut dst) = buffers(length);
    let mut base_byte = 0u8;
    let r = interleave(length * cycles, budget, &mut ours, || {
        memcpy_fill_copy(&mut src, &mut dst, cycles, &mut base_byte)
    });
    w.check_invariants();
    let line = format!(
        "name=local_publish_read size={} digest={} cycles_per_rep={cycles}",
        size_label(length),
        digest_label(digest),
    );
    let target = (digest == DigestKind::None).then_some(TARGET_LOCAL_RATIO);
    report(&line, &r, target);
}

/// `transfer` for one size, chunk size and encoding.
fn transfer(length: u64, chunk: u32, encoding: Encoding, budget: Budget) {
    let mut w = World::new(2, length, chunk, encoding);
    let writer = w.child(0);
    let reader = w.child(1);
    // Setup: host A publishes the blob once.
    let byte = 0x5Au8;
    let write_op = ChildOp(1);
    let view = w.open_write(writer, write_op, length, DigestKind::None);
    w.fill_and_seal(writer, &view, byte);
    w.seal(writer, write_op);
    let cycles = cycles_per_rep(length);
    let mut next_op = 1u64;
    let mut ours = || {
        let mut took = WallDuration::ZERO;
        for _ in 0..cycles {
            let op = ChildOp(next_op);
            next_op += 1;
            let start = WallInstant::now();
            let read = w.read(reader, op);
            took += start.elapsed();
            w.check_read(reader, &read, length, byte);
            w.release(reader, op);
            assert_eq!(
                w.live_leases(1),
                0,
                "host B's arena is not empty after a cycle"
            );
        }
        took
    };
    let (mut src, mut dst) = buffers(length);
    let r = interleave(length * cycles, budget, &mut ours, || {
        memcpy_copy(&mut src, &mut dst, cycles)
    });
    w.check_invariants();
    let window = w.nodes[1].host.config().window;
    if encoding == Encoding::Postcard {
        println!(
            "# postcard: {} frames between the hosts, {:.1} MiB encoded",
            w.crossed,
            w.encoded_bytes as f64 / MIB as f64
        );
    }
    let line = format!(
        "name=transfer size={} chunk={chunk} window={window} digest=none encoding={} \
         cycles_per_rep={cycles}",
        size_label(length),
        encoding.label(),
    );
    let target = (encoding == Encoding::None).then_some(TARGET_TRANSFER_RATIO);
    report(&line, &r, target);
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
        println!("# quick mode: 1 MiB only, short measurements, numbers are indicative only");
    }
    // Every measurement runs with the allocator thresholds a long-running process has (see
    // "Allocator state" in the module docs), not only those after the first measurement.
    drop(black_box(vec![1u8; 8 << 20]));
    let sizes: &[u64] = if quick { &[MIB] } else { &[MIB, 64 * MIB] };
    let wanted = |id: &str| filters.is_empty() || filters.iter().any(|f| id.contains(f.as_str()));

    for &length in sizes {
        for digest in [DigestKind::None, DigestKind::Blake3] {
            let id = format!(
                "local_publish_read/{}/{}",
                size_label(length),
                digest_label(digest)
            );
            if wanted(&id) {
                local_publish_read(length, digest, budget);
            }
        }
    }
    for &length in sizes {
        for (chunk, encoding) in [
            (64 * 1024, Encoding::None),
            (256 * 1024, Encoding::None),
            (64 * 1024, Encoding::Postcard),
        ] {
            let id = format!(
                "transfer/{}/{chunk}/{}",
                size_label(length),
                encoding.label()
            );
            if wanted(&id) {
                transfer(length, chunk, encoding, budget);
            }
        }
    }
}

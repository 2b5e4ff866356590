//! Everything a run draws from its seed before it starts (swarm testing): the topology, which
//! fault kinds are on and at what rate, the workload mix and the timings. `describe` prints the
//! draw so a failing seed can be read without re-running it.

use std::fmt::Write as _;

use dataplane_core::path::DataPath;
use dataplane_core::time::Duration;

use crate::clock::NodeClock;
use crate::rng::{Entropy, Ratio, SimRng, Stream, ratio};

/// Rates of link faults (probabilities per frame).
#[derive(Clone, Debug, PartialEq)]
pub struct NetOptions {
    /// Lowest one-way latency.
    pub latency_min: Duration,
    /// Mean extra latency on top of the minimum (exponentially distributed).
    pub latency_jitter_mean: Duration,
    /// Probability a frame is lost.
    pub loss: Ratio,
    /// Probability a frame is delivered twice.
    pub duplicate: Ratio,
    /// Probability a frame is held back long enough to be overtaken.
    pub reorder: Ratio,
    /// Longest extra delay of a reordered frame.
    pub reorder_delay_max: Duration,
}

/// How the simulated route registrar reports routability (SPEC §5.6: a callback on route
/// changes, "possibly including an initial observation"). Prompt and in order in half the
/// seeds; otherwise any mix of the legal but unhelpful manners below (issue 15, class 5).
#[derive(Clone, Debug, PartialEq)]
pub struct RegistrarOptions {
    /// Longest delay of a report: 20 ms when prompt, up to 3 s when late.
    pub delay_max: Duration,
    /// Per mille of reports delivered twice.
    pub repeat_permille: u64,
    /// Per mille of new watches whose initial observation is never reported (the directory
    /// must count unknown routability as routable).
    pub skip_initial_permille: u64,
    /// Out of order: every report is delivered in the order its delay gives, stale ones and
    /// ones for targets no longer watched included; the registrar re-announces every watched
    /// target this often (a resync), so its last word is eventually the truth.
    pub resync: Option<Duration>,
}

impl RegistrarOptions {
    /// Prompt, in order, every report once, initial observations included.
    pub const PROMPT: RegistrarOptions = RegistrarOptions {
        delay_max: Duration::from_millis(20),
        repeat_permille: 0,
        skip_initial_permille: 0,
        resync: None,
    };

    fn draw(rng: &mut SimRng) -> RegistrarOptions {
        if rng.below(2) == 0 {
            return RegistrarOptions::PROMPT;
        }
        let on = |rng: &mut SimRng| rng.below(2) == 0;
        RegistrarOptions {
            delay_max: if on(rng) {
                ms(rng, 100, 3_000)
            } else {
                RegistrarOptions::PROMPT.delay_max
            },
            repeat_permille: if on(rng) { rng.range(100, 600) } else { 0 },
            skip_initial_permille: if on(rng) { rng.range(200, 1_001) } else { 0 },
            resync: on(rng).then(|| ms(rng, 500, 4_000)),
        }
    }

    /// Whether every report is prompt, in order and delivered once.
    pub fn is_prompt(&self) -> bool {
        *self == RegistrarOptions::PROMPT
    }
}

/// A recurring fault: mean time between occurrences and the longest duration of one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recurring {
    /// Mean time between starts.
    pub mean_interval: Duration,
    /// Longest duration (drawn uniformly up to this).
    pub max_duration: Duration,
}

/// The proxies' settings and discovery's lag.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyOptions {
    /// The request deadline.
    pub deadline: Duration,
    /// The re-dispatch tick.
    pub retry_period: Duration,
    /// Longest delay before a proxy learns discovery's new answer.
    pub discovery_lag_max: Duration,
}

impl ProxyOptions {
    /// How long a read waits with no directory before it fails: a third of the deadline, at
    /// least two ticks (derived, not drawn, so the seeds' other draws stay as they were).
    pub fn absent_read_wait(&self) -> Duration {
        Duration::from_nanos(self.deadline.as_nanos() / 3).max(self.retry_period.saturating_mul(2))
    }
}

/// Disk behaviour of the directory node.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskOptions {
    /// Lowest fsync latency.
    pub sync_min: Duration,
    /// Highest fsync latency.
    pub sync_max: Duration,
    /// Probability an fsync fails (the node then stops: fail-stop).
    pub fsync_failure: Ratio,
    /// Probability that a crash tears the unsynced tail (garbage after the last whole step).
    pub torn_tail: Ratio,
    /// Probability that each unsynced step survives a crash anyway (it reached the platter).
    pub unsynced_survives: Ratio,
    /// The log is compacted once it holds this many bytes and twice its snapshot.
    pub compact_min_bytes: u64,
    /// Probability that a compaction dies before one of its steps (drawn uniformly).
    pub compaction_crash: Ratio,
    /// Probability that a directory crash leaves damage at rest (a flipped bit or a lost file)
    /// where recovery must refuse; the operator then restores it from a backup.
    pub rot: Ratio,
    /// Full-disk episodes: writes fail `NoSpace` until the episode ends.
    pub full_disk: Option<Recurring>,
    /// The log file grows in steps of this many bytes of zeros (`StorageOptions::preallocate`;
    /// 0: it grows with each write).
    pub preallocate_bytes: u64,
    /// Slow disks: some fsyncs of the directory (in the replicated mode, of one replica) take
    /// far longer than the others, and the node's loop waits for them (as `dataplane-node`'s
    /// does: it syncs on its one thread), during the fault phase.
    pub slow_sync: Option<SlowSync>,
}

/// Fsync latency spikes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowSync {
    /// Per mille of fsyncs that are slow.
    pub per_mille: u64,
    /// The longest extra latency of a slow one (drawn uniformly up to it).
    pub max: Duration,
}

/// Which operations clients pick, and how they wait.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadOptions {
    /// Weights of [`crate::client::OpKind::ALL`], in order.
    pub weights: Vec<u32>,
    /// Mean pause between two operations of one client.
    pub think_mean: Duration,
    /// How long a stream opener waits for its peer before cancelling.
    pub open_wait: Duration,
    /// How long a matched stream is held before it is closed.
    pub hold_time: Duration,
    /// Longest delay before a live source or endpoint acknowledges Retire or Displaced
    /// (slow acknowledgements keep obligations and fences open longer).
    pub ack_delay_max: Duration,
    /// Per mille of reserves a client walks away from before their answer (0 in half the
    /// seeds): only the proxy's retraction releases them.
    pub reserve_walk_away_permille: u64,
}

/// The host side: workers (simulated child processes), the arena, transfers.
#[derive(Clone, Debug, PartialEq)]
pub struct HostOptions {
    /// Workers on each host node (0–3 each; all 0 in some runs).
    pub workers: Vec<u32>,
    /// Arena size of every host.
    pub arena_size: u64,
    /// Longest blob a worker writes.
    pub blob_max: u64,
    /// Transfer chunk size.
    pub chunk_bytes: u32,
    /// Chunk requests a transfer keeps in flight.
    pub window: u32,
    /// A chunk unanswered this long is asked for again.
    pub chunk_timeout: Duration,
    /// How often one chunk may be asked for.
    pub chunk_attempts_max: u32,
    /// A transfer fails after this long.
    pub transfer_deadline: Duration,
    /// Mean pause between two steps of a worker.
    pub think_mean: Duration,
    /// How long a worker holds a granted view.
    pub hold_time: Duration,
    /// How long a worker waits for a grant before cancelling.
    pub open_wait: Duration,
    /// Probability a worker aborts a published write instead of releasing it.
    pub abort: Ratio,
    /// Probability a worker corrupts its seal (a hostile child).
    pub corrupt: Ratio,
    /// Probability per step that a worker dies (closes with everything in flight).
    pub abrupt_close: Ratio,
    /// Probability that a worker stops for `stall_time` between a write's grant and its
    /// bytes (a child stopped mid-write), so that the host's write deadline may expire it.
    pub stall: Ratio,
    /// How long a stalled worker stops.
    pub stall_time: Duration,
    /// The hosts' write deadline (core's `HostConfig::write_deadline`).
    pub write_deadline: Duration,
}

/// The overload regime (issue 11): the bounds of the real nodes, shrunk so that ordinary
/// bursts reach them, and workloads that pile up published blobs. After the heal every table
/// must drain and a probe child on every host must be served (see `check::probe`).
#[derive(Clone, Debug, PartialEq)]
pub struct OverloadOptions {
    /// The proxies' pending bound (`ProxyConfig::pending_max`).
    pub proxy_pending_max: usize,
    /// Operations in progress per host (`HostConfig::operations_max`).
    pub host_operations_max: usize,
    /// Operations in progress per session (`HostConfig::session_operations_max`).
    pub session_operations_max: usize,
    /// Operations a worker keeps in flight: far more than the bounds above.
    pub burst: usize,
    /// Workers write at `/h/f/0`..`/h/f/<fresh_paths>` too, so each host keeps up to this
    /// many published blobs at once (more than its operations bound).
    pub fresh_paths: u64,
    /// Frames a link (one direction between two nodes) carries at once; more are dropped, as
    /// the real nodes' bounded writer queues drop them. Also after the heal.
    pub link_frames_max: usize,
}

/// The directory's limits drawn small (issue 52: every limit reached), so that each refusal
/// and each "make room" path runs in some seeds. `None` fields keep core's default. The
/// namespace's entries keep theirs: a full namespace refuses the probes' writes, rightly, and
/// the probes are the liveness check of every host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LimitOptions {
    /// Operation records (`DirectoryLimits::operations`).
    pub operations: Option<usize>,
    /// Operation records of one issuer.
    pub issuer_operations: Option<usize>,
    /// Issuer rows.
    pub issuers: Option<usize>,
    /// Obligations new work may add to.
    pub obligations: Option<usize>,
    /// Runtime rendezvous.
    pub rendezvous: Option<usize>,
    /// Replacement fences.
    pub fences: Option<usize>,
    /// Live reservations.
    pub reservations: Option<usize>,
    /// Opens one fence holds.
    pub fence_held_opens: Option<usize>,
}

impl LimitOptions {
    fn draw(rng: &mut SimRng) -> LimitOptions {
        let mut small =
            |lo: u64, hi: u64| rng.chance(ratio(1, 2)).then(|| rng.range(lo, hi) as usize);
        // The operation and issuer tables stay at their defaults: a full issuer table makes
        // no room while its issuers live (rows go with their node incarnation), and a small
        // operation table can be held by one host whose calls it refuses, so that the host
        // can declare nothing done (seeds 134 and 251 of a first draw): callers starve, a
        // hazard of the table's design at this scale that the note of issue 52 describes.
        LimitOptions {
            operations: None,
            issuer_operations: None,
            issuers: None,
            obligations: small(2, 24),
            rendezvous: small(1, 8),
            fences: small(1, 4),
            reservations: small(1, 6),
            fence_held_opens: small(1, 4),
        }
    }

    /// The directory's limits: these, and core's defaults for the rest.
    pub fn directory(&self, retry_batch: usize) -> dataplane_core::directory::DirectoryLimits {
        let d = dataplane_core::directory::DirectoryLimits::default();
        dataplane_core::directory::DirectoryLimits {
            operations: self.operations.unwrap_or(d.operations),
            issuer_operations: self.issuer_operations.unwrap_or(d.issuer_operations),
            issuers: self.issuers.unwrap_or(d.issuers),
            entries: d.entries,
            obligations: self.obligations.unwrap_or(d.obligations),
            rendezvous: self.rendezvous.unwrap_or(d.rendezvous),
            fences: self.fences.unwrap_or(d.fences),
            reservations: self.reservations.unwrap_or(d.reservations),
            fence_held_opens: self.fence_held_opens.unwrap_or(d.fence_held_opens),
            retry_batch,
        }
    }
}

/// The long-life regime (issue 13): hours of simulated time and many thousands of operations
/// per proxy, with pruning active, so that a defect that lets the directory's state grow with
/// what happened (rather than with what is live), or that prunes a record its caller may still
/// retry, shows within one seed.
#[derive(Clone, Debug, PartialEq)]
pub struct LongLifeOptions {
    /// How long faults run (1–2 hours).
    pub fault_phase: Duration,
    /// Mean pause between two operations of a client (100–400 ms).
    pub think_mean: Duration,
}

/// The options of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// The seed everything derives from.
    pub seed: u64,
    /// Where the run's draws come from (the seed's streams or a tape).
    pub entropy: Entropy,
    /// The options stream's raw draws, when recording.
    pub options_draws: Vec<u64>,
    /// Stop the run, unjudged, after this many events (the shrinker: a candidate that has not
    /// failed within the best run's events is no smaller). `u64::MAX` normally.
    pub event_limit: u64,
    /// Replicas of the directory: 1 (the default: one directory node, `world.rs`) or 3 (the
    /// replicated mode, `replicated.rs`; `--replicas 3`). Never drawn, so a seed's draws do
    /// not depend on it.
    pub replicas: usize,
    /// Clients on each host node (2–5 nodes, 1–4 clients each).
    pub clients_per_host: Vec<u32>,
    /// The contended paths.
    pub paths: Vec<DataPath>,
    /// The directory's retry tick period.
    pub directory_retry: Duration,
    /// Obligation frames one retry pass of the directory sends: core's default in most seeds,
    /// 1–8 in a third of them and in three of four register storms, so that storms beyond a
    /// pass are common (issue 15, class 9).
    pub retry_batch: usize,
    /// How long faults are injected.
    pub fault_phase: Duration,
    /// How long after the heal every liveness property must hold.
    pub liveness_bound: Duration,
    /// Link behaviour.
    pub net: NetOptions,
    /// Partitions between the directory and a host (one-way or two-way).
    pub partitions: Option<Recurring>,
    /// Directory crashes (the value bounds the downtime).
    pub directory_crashes: Option<Recurring>,
    /// Host crashes (the value bounds the downtime).
    pub host_crashes: Option<Recurring>,
    /// Route flaps: a watched target reported unroutable for a while.
    pub route_flaps: Option<Recurring>,
    /// Blob sources or stream endpoints that die on their own.
    pub actor_deaths: Option<Recurring>,
    /// Proxy restarts on a running host (the pending table is lost; callers re-issue).
    pub proxy_restarts: Option<Recurring>,
    /// Authority outages: discovery answers "no directory" (the bound is up to 2.5 deadlines,
    /// so requests expire while retractions wait).
    pub authority_outages: Option<Recurring>,
    /// Proxy behaviour and discovery.
    pub proxy: ProxyOptions,
    /// Disk behaviour.
    pub disk: DiskOptions,
    /// Client behaviour.
    pub workload: WorkloadOptions,
    /// The host side.
    pub host: HostOptions,
    /// The overload regime, in some seeds.
    pub overload: Option<OverloadOptions>,
    /// The supervisor revokes a running worker's session (issue 17).
    pub revocations: Option<Recurring>,
    /// A host sends the directory a frame that speaks for another node (a report of that
    /// node's addresses or incarnations gone, an acknowledgement owed to its actors, a reply
    /// sent its way), as a buggy or hostile node could: the directory must refuse it
    /// (`core::admission::speaks_for`).
    pub spoofs: Option<Recurring>,
    /// The long-life regime, in some seeds.
    pub long_life: Option<LongLifeOptions>,
    /// A file on a host's disk changes (rewritten with other bytes, mostly of the same
    /// length, or removed): a file blob published from it must never be served again
    /// (issue 17).
    pub file_changes: Option<Recurring>,
    /// The directory's limits, drawn small in a quarter of the seeds (default: core's).
    pub limits: LimitOptions,
    /// Silent stalls: the directory's process paused (stopped, as by SIGSTOP: what it is sent
    /// waits, its connections stay open, its clock runs on), or a host's connection to the
    /// directory that stays open and delivers nothing, in one direction or both. A host must
    /// leave a silent directory within a bound (`check` restates it).
    pub stalls: Option<Recurring>,
    /// Churn: the last hosts join the cluster mid-run, at these points of the fault phase (per
    /// mille of it, so a fault phase set shorter keeps them in it; in host order,
    /// nondecreasing; empty: every host is there from the start). A late host says hello as a
    /// node the directory never knew, after the directory may have crashed and recovered: the
    /// node id membership hands it must be one it never handed out.
    pub late_joins: Vec<u64>,
    /// Host crashes aimed at work in flight, with host crashes on (not drawn: on unless
    /// `--no-fault aimed-crashes`).
    pub aimed_crashes: bool,
    /// Host pauses: a host's process and its children stop (SIGSTOP of the node's process
    /// group, a frozen VM): what they are sent waits in their sockets, their connections stay
    /// open, their clocks run on, and they take everything in order when they resume. The
    /// directory must let go of a paused host's connection within its host-silence bound, and
    /// a host must give up a connection to a paused host within the silence bound of its use.
    pub host_pauses: Option<Recurring>,
    /// The route registrar's manner.
    pub registrar: RegistrarOptions,
    /// Per mille of discovery answers a proxy is told twice (0 in half the seeds).
    pub discovery_repeat_permille: u64,
    /// Each node's clock: the directory node's first, then the hosts' in order. All exact in
    /// half the seeds; otherwise each node starts at its own origin and runs up to 5 % fast
    /// or slow.
    pub clocks: Vec<NodeClock>,
}

const PATH_POOL: [&str; 8] = [
    "/a",
    "/b",
    "/c/d",
    "/runs/1/x",
    "/runs/1/y",
    "/s",
    "/t/u",
    "/v",
];

fn ms(rng: &mut SimRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.range(lo, hi))
}

fn recurring(
    rng: &mut SimRng,
    p_on: Ratio,
    interval_ms: (u64, u64),
    duration_ms: (u64, u64),
) -> Option<Recurring> {
    let on = rng.chance(p_on);
    let mean_interval = ms(rng, interval_ms.0, interval_ms.1);
    let max_duration = ms(rng, duration_ms.0, duration_ms.1);
    on.then_some(Recurring {
        mean_interval,
        max_duration,
    })
}

impl HostOptions {
    fn draw(rng: &mut SimRng, hosts: usize) -> HostOptions {
        let none = rng.chance(ratio(1, 10));
        let workers = (0..hosts)
            .map(|_| if none { 0 } else { rng.range(0, 4) as u32 })
            .collect();
        let blob_max = if rng.chance(ratio(3, 10)) {
            rng.range(16, 4_096)
        } else {
            rng.range(4_096, 96 * 1024)
        };
        HostOptions {
            workers,
            // Sometimes small enough that requests queue (Q23, Q25).
            arena_size: if rng.chance(ratio(3, 10)) {
                rng.range(64, 256) * 1024
            } else {
                rng.range(256, 2_048) * 1024
            },
            blob_max,
            chunk_bytes: rng.range(512, 32 * 1024) as u32,
            window: rng.range(1, 9) as u32,
            chunk_timeout: ms(rng, 50, 2_000),
            chunk_attempts_max: rng.range(3, 30) as u32,
            transfer_deadline: Duration::from_secs(rng.range(5, 60)),
            think_mean: ms(rng, 5, 1_500),
            hold_time: ms(rng, 0, 4_000),
            open_wait: ms(rng, 500, 30_000),
            abort: rng.ppm(0, 400_000),
            corrupt: if rng.chance(ratio(3, 10)) {
                rng.ppm(10_000, 100_000)
            } else {
                Ratio::ZERO
            },
            abrupt_close: if rng.chance(ratio(3, 10)) {
                rng.ppm(5_000, 50_000)
            } else {
                Ratio::ZERO
            },
            stall: if rng.chance(ratio(1, 2)) {
                rng.ppm(10_000, 60_000)
            } else {
                Ratio::ZERO
            },
            stall_time: ms(rng, 500, 20_000),
            write_deadline: ms(rng, 1_000, 15_000),
        }
    }
}

impl Options {
    /// Actors of the run: the directory, each host's proxy, host machine and agent, and the
    /// clients and workers.
    pub fn actors(&self) -> u64 {
        let clients: u64 = self.clients_per_host.iter().map(|&c| u64::from(c)).sum();
        let workers: u64 = self.host.workers.iter().map(|&w| u64::from(w)).sum();
        1 + 3 * self.clients_per_host.len() as u64 + clients + workers
    }

    /// Draws the options of run `seed`.
    pub fn draw(seed: u64) -> Options {
        Options::draw_from(&Entropy::seed(seed))
    }

    /// Draws the options from `entropy` (a seed or a tape); the run draws from it too.
    pub fn draw_from(entropy: &Entropy) -> Options {
        let seed = entropy.seed;
        let mut rng = entropy.rng(Stream::Options);
        let hosts = rng.range(2, 5) as usize;
        let clients_per_host = (0..hosts).map(|_| rng.range(1, 4) as u32).collect();
        let path_count = rng.range(2, PATH_POOL.len() as u64) as usize;
        let paths: Vec<DataPath> = PATH_POOL[..path_count]
            .iter()
            .map(|p| DataPath::new(*p).expect("pool paths are valid"))
            .collect();
        let net = NetOptions {
            latency_min: Duration::from_micros(rng.range(100, 5_000)),
            latency_jitter_mean: Duration::from_micros(rng.range(0, 20_000)),
            loss: if rng.chance(ratio(3, 5)) {
                rng.ppm(2_000, 150_000)
            } else {
                Ratio::ZERO
            },
            duplicate: if rng.chance(ratio(2, 5)) {
                rng.ppm(2_000, 80_000)
            } else {
                Ratio::ZERO
            },
            reorder: if rng.chance(ratio(1, 2)) {
                rng.ppm(10_000, 200_000)
            } else {
                Ratio::ZERO
            },
            reorder_delay_max: ms(&mut rng, 10, 3_000),
        };
        let partitions = recurring(&mut rng, ratio(2, 5), (2_000, 30_000), (100, 15_000));
        let mut directory_crashes = recurring(&mut rng, ratio(1, 2), (3_000, 40_000), (1, 5_000));
        let host_crashes = recurring(&mut rng, ratio(7, 20), (5_000, 60_000), (1, 5_000));
        let route_flaps = recurring(&mut rng, ratio(7, 20), (500, 10_000), (50, 8_000));
        let actor_deaths = recurring(&mut rng, ratio(3, 10), (1_000, 20_000), (0, 0));
        let proxy = ProxyOptions {
            deadline: if rng.chance(ratio(1, 10)) {
                dataplane_core::proxy::DEFAULT_DEADLINE
            } else {
                Duration::from_secs(rng.range(3, 30))
            },
            retry_period: ms(&mut rng, 100, 2_000),
            discovery_lag_max: ms(&mut rng, 0, 3_000),
        };
        let proxy_restarts = recurring(&mut rng, ratio(3, 10), (3_000, 40_000), (0, 2_000));
        let outage_ms = proxy.deadline.as_millis() * 5 / 2;
        let authority_outages =
            recurring(&mut rng, ratio(7, 20), (5_000, 60_000), (100, outage_ms));
        let sync_min = Duration::from_micros(rng.range(50, 2_000));
        let mut disk = DiskOptions {
            sync_min,
            sync_max: sync_min.saturating_add(Duration::from_micros(rng.range(0, 10_000))),
            fsync_failure: if rng.chance(ratio(1, 4)) {
                rng.ppm(500, 20_000)
            } else {
                Ratio::ZERO
            },
            torn_tail: rng.ppm(0, 1_000_000),
            unsynced_survives: rng.ppm(0, 700_000),
            compact_min_bytes: 64 * 1024,
            compaction_crash: Ratio::ZERO,
            rot: Ratio::ZERO,
            full_disk: None,
            preallocate_bytes: 0,
            slow_sync: None,
        };
        let kinds = crate::client::OpKind::ALL.len();
        let weights = (0..kinds)
            .map(|_| {
                if rng.chance(ratio(17, 20)) {
                    rng.range(1, 10) as u32
                } else {
                    0
                }
            })
            .collect::<Vec<_>>();
        let weights = if weights.iter().all(|&w| w == 0) {
            vec![1; kinds]
        } else {
            weights
        };
        let mut workload = WorkloadOptions {
            weights,
            think_mean: ms(&mut rng, 5, 2_000),
            open_wait: ms(&mut rng, 500, 20_000),
            hold_time: ms(&mut rng, 0, 5_000),
            ack_delay_max: Duration::ZERO,
            reserve_walk_away_permille: 0,
        };
        // Swarm knobs that keep obligations and fences open longer.
        if rng.chance(ratio(2, 5)) {
            workload.ack_delay_max = ms(&mut rng, 1, 8_000);
        }
        let paths = if rng.chance(ratio(3, 20)) {
            // A wide namespace under a register storm: obligations pile up past one retry
            // batch (S23, S25 with N > 32).
            workload.think_mean = ms(&mut rng, 2, 30);
            workload.weights[0] += 60;
            workload.ack_delay_max = workload.ack_delay_max.max(ms(&mut rng, 2_000, 8_000));
            // Recovery replays the whole (unpruned) operation table, which a storm makes large;
            // storms exercise obligations, other seeds exercise crashes.
            if let Some(crashes) = &mut directory_crashes {
                crashes.mean_interval = crashes.mean_interval.max(Duration::from_secs(20));
            }
            (0..rng.range(40, 96))
                .map(|i| DataPath::new(format!("/w/{i}")).expect("valid"))
                .collect()
        } else {
            paths
        };
        let mut host = HostOptions::draw(&mut rng, hosts);
        let directory_retry = ms(&mut rng, 100, 2_000);
        let mut fault_phase = Duration::from_secs(rng.range(20, 90));
        // The regimes and the later fault kinds are drawn after everything else, so adding
        // one changes no earlier draw of any seed.
        let overload = rng.chance(ratio(1, 5)).then(|| OverloadOptions {
            proxy_pending_max: rng.range(2, 17) as usize,
            host_operations_max: rng.range(2, 13) as usize,
            session_operations_max: rng.range(1, 7) as usize,
            burst: rng.range(4, 25) as usize,
            fresh_paths: rng.range(16, 97),
            link_frames_max: rng.range(4, 65) as usize,
        });
        let revocations = recurring(&mut rng, ratio(3, 10), (2_000, 30_000), (0, 0));
        if let Some(o) = &overload {
            // Every host needs a worker to pile up blobs, and an arena that holds them all
            // with room to spare: a probe's write must never find it full.
            for workers in &mut host.workers {
                *workers = (*workers).max(1);
            }
            host.blob_max = host.blob_max.min(1_024);
            // Bursts, not a storm: most of a burst is refused at once, so a worker that woke
            // every few milliseconds would only spend events.
            host.think_mean = host.think_mean.max(Duration::from_millis(100));
            host.arena_size = host.arena_size.max((o.fresh_paths + 64) * 4 * 1_280);
        }
        // Drawn after everything else, like the overload regime, and never with it (one
        // regime's cost at a time).
        let long_life = (overload.is_none() && rng.chance(ratio(1, 16))).then(|| LongLifeOptions {
            fault_phase: Duration::from_secs(rng.range(3_600, 2 * 3_600)),
            think_mean: ms(&mut rng, 100, 400),
        });
        if let Some(l) = &long_life {
            fault_phase = l.fault_phase;
            workload.think_mean = l.think_mean;
            // Workers keep writing and reading, but small blobs at a calmer pace: the
            // directory's tables are what this regime is about.
            host.think_mean = host.think_mean.max(Duration::from_millis(500));
            host.blob_max = host.blob_max.min(2_048);
            // Every run's outputs outlive it (published blobs outlive their session), and
            // hours of revocations and deaths make hundreds of runs: an arena of the other
            // regimes fills with them, and the probe after the load is refused
            // `ArenaExhausted`, rightly (seed 2961: 118 blobs of ended runs filled 117 KiB
            // after 6,800 s). 2 MiB holds some 1,800 of the largest.
            host.arena_size = host.arena_size.max(2 * 1024 * 1024);
        }
        // The storage faults (issue 12), drawn last so that every other draw of a seed stays.
        disk.compact_min_bytes = rng.range(4 * 1024, 64 * 1024);
        if rng.chance(ratio(1, 2)) {
            disk.compaction_crash = rng.ppm(50_000, 500_000);
        }
        if rng.chance(ratio(7, 20)) {
            disk.rot = rng.ppm(50_000, 300_000);
        }
        disk.full_disk = recurring(&mut rng, ratio(1, 4), (3_000, 30_000), (100, 5_000));
        // Drawn last, so that every other draw of a seed stays.
        let spoofs = recurring(&mut rng, ratio(3, 10), (1_000, 20_000), (0, 0));
        // Register storms (a wide namespace) get a small batch most of the time: a storm
        // beyond one pass is what the rotation's fairness is about.
        let storm = paths.len() >= 40;
        let retry_batch = if rng.chance(if storm { ratio(3, 4) } else { ratio(1, 3) }) {
            rng.range(1, 9) as usize
        } else {
            dataplane_core::limits::RETRY_BATCH_MAX
        };
        // Drawn after everything else, so the draws above stay those of earlier commits.
        let registrar = RegistrarOptions::draw(&mut rng);
        let discovery_repeat_permille = if rng.below(2) == 0 {
            0
        } else {
            rng.range(100, 600)
        };
        if rng.below(2) == 0 {
            workload.reserve_walk_away_permille = rng.range(100, 700);
        }
        // Patient openers (a third of the seeds): a stream opener waits for its peer twice
        // the proxy's deadline, so the proxy's expiry, and its retraction of the expired
        // open, must work alone (issue 15, class 8: openers that give up first cover for it).
        if rng.below(3) == 0 {
            workload.open_wait = proxy.deadline.saturating_mul(2);
        }
        let skewed = rng.below(2) == 0;
        let clocks = (0..=hosts)
            .map(|_| {
                if !skewed {
                    return NodeClock::EXACT;
                }
                let offset = Duration::from_millis(rng.range(0, 1_000_000));
                let magnitude = match rng.below(3) {
                    0 => 0,
                    1 => rng.range(1, 500),
                    _ => rng.range(1_000, 50_001),
                } as i32;
                let ppm = if rng.below(2) == 0 {
                    magnitude
                } else {
                    -magnitude
                };
                NodeClock { offset, ppm }
            })
            .collect();
        // Drawn last, so that every other draw of a seed stays: the real node preallocates
        // its log, and most seeds do too, in steps around the size of a few records up to
        // beyond a whole compaction.
        if rng.below(4) != 0 {
            disk.preallocate_bytes = match rng.below(3) {
                0 => rng.range(64, 512),
                1 => rng.range(512, 8 * 1024),
                _ => rng.range(8 * 1024, 128 * 1024),
            };
        }
        // Drawn last (issue 17), so that every other draw of a seed stays.
        let file_changes = recurring(&mut rng, ratio(2, 5), (2_000, 30_000), (0, 0));
        // Drawn last (issue 52), so that every other draw of a seed stays. Up to 20 s: longer
        // than every timeout of a host's link, so a host that never gives up is seen.
        let stalls = recurring(&mut rng, ratio(1, 3), (2_000, 30_000), (200, 20_000));
        // Drawn last (issue 52): small limits.
        let limits = if rng.chance(ratio(1, 4)) {
            LimitOptions::draw(&mut rng)
        } else {
            LimitOptions::default()
        };
        // Drawn last (issue 52): slow disks, tens to hundreds of milliseconds.
        if rng.chance(ratio(1, 4)) {
            disk.slow_sync = Some(SlowSync {
                per_mille: rng.range(10, 80),
                max: ms(&mut rng, 50, 800),
            });
        }
        // Drawn last (issue 52): churn, in a quarter of the seeds with two hosts or more.
        let mut late_joins = Vec::new();
        if hosts >= 2 && rng.chance(ratio(1, 4)) {
            let late = rng.range(1, hosts as u64 - 1);
            for _ in 0..late {
                // Between a tenth and nine tenths of the fault phase.
                late_joins.push(rng.range(100, 900));
            }
            late_joins.sort();
        }
        // Drawn last (issue 52): host pauses, up to 20 s (past the directory's 10 s silence
        // bound for hosts).
        let host_pauses = recurring(&mut rng, ratio(1, 4), (2_000, 30_000), (200, 20_000));
        Options {
            seed,
            options_draws: rng.take_record(),
            event_limit: u64::MAX,
            replicas: 1,
            entropy: entropy.clone(),
            clients_per_host,
            paths,
            directory_retry,
            retry_batch,
            fault_phase,
            // Long enough for a request admitted at the heal to expire and its retraction to
            // be acknowledged.
            liveness_bound: Duration::from_secs(120).max(
                proxy
                    .deadline
                    .saturating_mul(2)
                    .saturating_add(Duration::from_secs(30)),
            ),
            net,
            partitions,
            directory_crashes,
            host_crashes,
            route_flaps,
            actor_deaths,
            proxy_restarts,
            authority_outages,
            proxy,
            disk,
            workload,
            host,
            overload,
            revocations,
            spoofs,
            long_life,
            file_changes,
            limits,
            stalls,
            late_joins,
            aimed_crashes: true,
            host_pauses,
            registrar,
            discovery_repeat_permille,
            clocks,
        }
    }

    /// The time of a late join drawn at `permille` of the fault phase (`late_joins`).
    pub fn join_point(&self, permille: u64) -> Duration {
        Duration::from_millis(self.fault_phase.as_millis() * permille / 1000)
    }

    /// A multi-line description of the draw, each line starting with `#`.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let on = |r: &Option<Recurring>| match r {
            Some(r) => format!("every~{} up-to {}", r.mean_interval, r.max_duration),
            None => "off".to_string(),
        };
        let paths: Vec<&str> = self.paths.iter().map(DataPath::as_str).collect();
        let _ = writeln!(
            s,
            "# seed={} hosts={} clients={:?} paths={:?} retry_tick={} retry_batch={} faults_for={} liveness_bound={}",
            self.seed,
            self.clients_per_host.len(),
            self.clients_per_host,
            paths,
            self.directory_retry,
            self.retry_batch,
            self.fault_phase,
            self.liveness_bound,
        );
        let n = &self.net;
        let _ = writeln!(
            s,
            "# net: latency={}+exp({}) loss={} dup={} reorder={} (up to {})",
            n.latency_min,
            n.latency_jitter_mean,
            n.loss,
            n.duplicate,
            n.reorder,
            n.reorder_delay_max
        );
        let _ = writeln!(
            s,
            "# faults: partitions={} directory_crashes={} host_crashes={} route_flaps={} actor_deaths={} proxy_restarts={} authority_outages={} revocations={} spoofs={} file_changes={} stalls={} host_pauses={}",
            on(&self.partitions),
            on(&self.directory_crashes),
            on(&self.host_crashes),
            on(&self.route_flaps),
            on(&self.actor_deaths),
            on(&self.proxy_restarts),
            on(&self.authority_outages),
            on(&self.revocations),
            on(&self.spoofs),
            on(&self.file_changes),
            on(&self.stalls),
            on(&self.host_pauses),
        );
        if !self.late_joins.is_empty() {
            let at: Vec<String> = self
                .late_joins
                .iter()
                .map(|&p| self.join_point(p).to_string())
                .collect();
            let _ = writeln!(
                s,
                "# churn: the last {} host(s) join at {}",
                at.len(),
                at.join(" ")
            );
        }
        let p = &self.proxy;
        let _ = writeln!(
            s,
            "# proxy: deadline={} retry={} discovery_lag<={} discovery_repeat={}/1000",
            p.deadline, p.retry_period, p.discovery_lag_max, self.discovery_repeat_permille
        );
        let clocks: Vec<String> = self
            .clocks
            .iter()
            .map(|c| format!("+{}@{}ppm", c.offset, c.ppm))
            .collect();
        let _ = writeln!(s, "# clocks (directory, hosts): {}", clocks.join(" "));
        let r = &self.registrar;
        let _ = writeln!(
            s,
            "# registrar: delay<={} repeat={}/1000 skip_initial={}/1000 out_of_order={}",
            r.delay_max,
            r.repeat_permille,
            r.skip_initial_permille,
            r.resync
                .map_or("no".to_owned(), |d| format!("yes (resync every {d})")),
        );
        let d = &self.disk;
        let _ = writeln!(
            s,
            "# disk: fsync={}..{} fsync_failure={} torn_tail={} unsynced_survives={} compact_min={} compaction_crash={} rot={} full_disk={} preallocate={} slow_sync={}",
            d.sync_min,
            d.sync_max,
            d.fsync_failure,
            d.torn_tail,
            d.unsynced_survives,
            d.compact_min_bytes,
            d.compaction_crash,
            d.rot,
            on(&d.full_disk),
            d.preallocate_bytes,
            d.slow_sync.map_or("off".to_owned(), |s| format!(
                "{}/1000 up-to {}",
                s.per_mille, s.max
            )),
        );
        let w = &self.workload;
        let mix: Vec<String> = crate::client::OpKind::ALL
            .iter()
            .zip(&w.weights)
            .filter(|(_, w)| **w > 0)
            .map(|(k, w)| format!("{k:?}:{w}"))
            .collect();
        let _ = writeln!(
            s,
            "# workload: think={} open_wait={} hold={} ack_delay<={} reserve_walk_away={}/1000 mix=[{}]",
            w.think_mean,
            w.open_wait,
            w.hold_time,
            w.ack_delay_max,
            w.reserve_walk_away_permille,
            mix.join(" ")
        );
        let h = &self.host;
        let _ = writeln!(
            s,
            "# host: workers={:?} arena={} blob<={} chunk={} window={} chunk_timeout={} attempts={} transfer_deadline={} think={} hold={} open_wait={} abort={} corrupt={} abrupt_close={} stall={} stall_time={} write_deadline={}",
            h.workers,
            h.arena_size,
            h.blob_max,
            h.chunk_bytes,
            h.window,
            h.chunk_timeout,
            h.chunk_attempts_max,
            h.transfer_deadline,
            h.think_mean,
            h.hold_time,
            h.open_wait,
            h.abort,
            h.corrupt,
            h.abrupt_close,
            h.stall,
            h.stall_time,
            h.write_deadline,
        );
        if self.limits != LimitOptions::default() {
            let _ = writeln!(s, "# limits: {:?}", self.limits);
        }
        if let Some(l) = &self.long_life {
            let _ = writeln!(
                s,
                "# long-life: faults_for={} think={}",
                l.fault_phase, l.think_mean
            );
        }
        if let Some(o) = &self.overload {
            let _ = writeln!(
                s,
                "# overload: proxy_pending_max={} host_operations_max={} session_operations_max={} burst={} fresh_paths={} link_frames_max={}",
                o.proxy_pending_max,
                o.host_operations_max,
                o.session_operations_max,
                o.burst,
                o.fresh_paths,
                o.link_frames_max,
            );
        }
        s
    }
}

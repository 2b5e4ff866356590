//! Simulated child processes ("workers") of the host machine: each attaches to a session,
//! writes blobs of deterministic content into the arena it maps, seals and publishes them, reads
//! blobs (published by anyone, on any host), aborts, cancels, releases, and closes.
//!
//! A worker acts on the arena memory directly, as a child process maps it: it fills and seals a
//! write's payload and header, and reads a read's payload after checking its header. What it
//! learns is reported to the checkers as [`Note`]s: which revision of which path holds which
//! content (a published write), what a read returned, which write was aborted — and any
//! protocol violation it sees itself (a grant for a path it may not access, a header that is not
//! what the grant said, a published write whose seal the worker corrupted on purpose).
//!
//! Content is derived from a tag (worker, op) so a read can be checked byte for byte.

use std::collections::BTreeMap;

use dataplane_core::blob::{self, BlobAccess, BlobState, DigestKind, Expected};
use dataplane_core::error::{DataPlaneError, NamespaceError};
use dataplane_core::ids::{Address, Revision};
use dataplane_core::path::{Access, DataPath, JobContext};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    ChildEvent, ChildOp, ChildRequest, Descriptor, LeaseView, StreamMatch, StreamRole,
};

use crate::options::{HostOptions, OverloadOptions};
use crate::rng::{SimRng, ratio};

/// Child actors of a node are numbered from here (below the proxies).
pub const WORKER_BASE: u64 = 100;
/// One past the last child actor number.
pub const WORKER_LIMIT: u64 = crate::host::PROXY_BASE;
/// Host machine actors (sessions, bindings, sources) are numbered from here.
pub const HOST_FIRST_ACTOR: u64 = 1 << 40;

/// Top-level segments workers may read (and, except `/v`, write).
const PREFIXES: [&str; 9] = ["/a", "/b", "/c", "/h", "/runs", "/s", "/t", "/v", "/w"];

/// The job context of worker `global`: its own run, every pool prefix readable, all but `/v`
/// writable (so writes to `/v/...` are refused: S29).
pub fn job(global: u32) -> JobContext {
    let all: Vec<DataPath> = PREFIXES
        .iter()
        .map(|p| DataPath::new(*p).expect("valid"))
        .collect();
    let writable = all.iter().filter(|p| p.as_str() != "/v").cloned().collect();
    JobContext::new(format!("w{global}"), all, writable).expect("a valid job")
}

/// What a worker tells the checkers.
#[derive(Clone, Debug)]
pub enum Note {
    /// A write was published: `path` at `revision` holds content `tag` of `length` bytes.
    Published {
        /// The resolved path.
        path: DataPath,
        /// Its revision.
        revision: Revision,
        /// The content tag.
        tag: u64,
        /// Payload length.
        length: u64,
    },
    /// A read was granted: these are the bytes it saw.
    Read {
        /// The resolved path.
        path: DataPath,
        /// The revision the grant named.
        revision: Revision,
        /// The payload.
        payload: Vec<u8>,
    },
    /// A published write was aborted: `path` must no longer be bound at `revision` (S36).
    Aborted {
        /// The resolved path.
        path: DataPath,
        /// The revision it was published at.
        revision: Revision,
    },
    /// A Stat said `path` at `revision` is a blob of `length` bytes.
    Stat {
        /// The resolved path.
        path: DataPath,
        /// Its revision.
        revision: Revision,
        /// The length the directory holds.
        length: u64,
    },
    /// Something worth counting happened (a coverage name).
    Seen(&'static str),
    /// The worker saw something the host must never do.
    Violation(String),
    /// The probe's write of `length` bytes was refused `ArenaExhausted` (seed 10130: two
    /// published outputs of the load filled a 64 KiB arena). The world judges it
    /// (`HostChecker::probe_arena_full`): right only if every lease in the arena is a blob
    /// the namespace binds or an operation still in progress, and no free range fits the
    /// write. The probe asks again shortly; once the arena is full of bound blobs alone
    /// (nothing will free it), the world has the probe skip its write and read.
    ArenaFull {
        /// The probe's payload length.
        length: u64,
    },
}

/// The coverage name of a failure a worker was told.
fn failure_name(error: &DataPlaneError) -> &'static str {
    use dataplane_core::error::BlobFailure as B;
    match error {
        DataPlaneError::InvalidPath(_) => "host.fail.InvalidPath",
        DataPlaneError::Unauthorized { .. } => "host.fail.Unauthorized",
        DataPlaneError::PathNotFound(_) => "host.fail.PathNotFound",
        DataPlaneError::SourceFailure(_) => "host.fail.SourceFailure",
        DataPlaneError::BlobLost(_) => "host.fail.BlobLost",
        DataPlaneError::BlobTooLarge { .. } => "host.fail.BlobTooLarge",
        DataPlaneError::ArenaExhausted => "host.fail.ArenaExhausted",
        DataPlaneError::WriteExpired { .. } => "host.fail.WriteExpired",
        DataPlaneError::Blob(B::Digest) => "host.fail.Blob.Digest",
        DataPlaneError::Blob(B::Length { .. }) => "host.fail.Blob.Length",
        DataPlaneError::Blob(_) => "host.fail.Blob.other",
        DataPlaneError::OperationCancelled => "host.fail.OperationCancelled",
        DataPlaneError::WrongEntryType { .. } => "host.fail.WrongEntryType",
        DataPlaneError::PathReplaced(_) => "host.fail.PathReplaced",
        DataPlaneError::PathExists(_) => "host.fail.PathExists",
        DataPlaneError::Busy(_) => "host.fail.Busy",
        DataPlaneError::SessionFailed(_) => "host.fail.SessionFailed",
        DataPlaneError::Namespace(e) => match e {
            NamespaceError::DirectoryUnavailable(_) => "host.fail.Namespace.DirectoryUnavailable",
            NamespaceError::Timeout => "host.fail.Namespace.Timeout",
            NamespaceError::OperationExpired(_) => "host.fail.Namespace.OperationExpired",
            NamespaceError::OperationConflict(_) => "host.fail.Namespace.OperationConflict",
            NamespaceError::DuplicateStreamRole { .. } => "host.fail.Namespace.DuplicateStreamRole",
            NamespaceError::StaleIncarnation { .. } => "host.fail.Namespace.StaleIncarnation",
            NamespaceError::Storage(_) => "host.fail.Namespace.Storage",
            NamespaceError::Protocol(_) => "host.fail.Namespace.Protocol",
            NamespaceError::NoSpace(_) => "host.fail.Namespace.NoSpace",
            _ => "host.fail.Namespace.other",
        },
        DataPlaneError::LimitReached(_) => "host.fail.LimitReached",
        DataPlaneError::SourceChanged(_) => "host.fail.SourceChanged",
        _ => "host.fail.other",
    }
}

/// What a run's options can explain: the typed failures a worker may see without any host
/// bug (issue 15: every failure a worker sees must be explained by the run). Failures outside
/// these are violations.
#[derive(Clone, Copy, Debug, Default)]
pub struct Explanations {
    /// The arena is small enough for a write or a read to wait out its allocation deadline.
    pub arena_exhaustion: bool,
    /// The bounds are small enough to be reached (the overload regime).
    pub limits: bool,
    /// Hosts restart, so a blob can be lost with its host.
    pub lost_blobs: bool,
    /// Files of file blobs change on their host's disk.
    pub changed_files: bool,
    /// The directory's disk fills, and its log is preallocated (so it refuses new operations
    /// `NoSpace` rather than stop).
    pub full_disk: bool,
    /// When the worker's host last resumed from a pause, on its clock (`None`: it never
    /// paused). A paused host and its children resume together, and what each takes first
    /// is the order things came in: a write's deadline may have passed meanwhile.
    pub resumed_at: Option<Instant>,
}

impl Explanations {
    /// Whether the worker's host resumed from a pause at or after `at`.
    fn paused_since(&self, at: Instant) -> bool {
        self.resumed_at.is_some_and(|r| r >= at)
    }
}

impl Explanations {
    /// What `options` can explain.
    pub fn of(options: &crate::options::Options) -> Explanations {
        let h = &options.host;
        // Reads copy whatever was registered: clients register blobs of up to 1 MiB.
        let client_blobs = crate::client::OpKind::ALL
            .iter()
            .zip(&options.workload.weights)
            .any(|(kind, weight)| {
                *weight > 0
                    && matches!(
                        kind,
                        crate::client::OpKind::Register | crate::client::OpKind::ReserveRegister
                    )
            });
        let largest = if client_blobs {
            h.blob_max.max(crate::client::CLIENT_BLOB_MAX)
        } else {
            h.blob_max
        };
        Explanations {
            arena_exhaustion: options.overload.is_some()
                || h.arena_size < 64 * (largest + dataplane_core::arena::BLOB_HEADER_BYTES),
            limits: options.overload.is_some()
                || options.limits != crate::options::LimitOptions::default(),
            lost_blobs: options.host_crashes.is_some(),
            changed_files: options.file_changes.is_some(),
            full_disk: options.disk.full_disk.is_some() && options.disk.preallocate_bytes > 0,
            resumed_at: None,
        }
    }
}

/// Why `error`, for `op`, is not explained by the run (`None`: it is).
fn unexplained(op: &Op, error: &DataPlaneError, explains: &Explanations) -> Option<&'static str> {
    use dataplane_core::error::BlobFailure as B;
    let read = op.write.is_none() && !op.control;
    let corrupt = matches!(op.write, Some((_, _, true)));
    match error {
        // An honest read never sees a damaged blob: corrupted seals are never published, and
        // a published blob never changes.
        DataPlaneError::Blob(_) if read => Some("a read failed a blob check"),
        // A seal fails its checks only if the child corrupted it.
        DataPlaneError::Blob(B::Digest | B::Length { .. } | B::StaleGeneration { .. })
            if !corrupt =>
        {
            Some("an honest seal failed a blob check")
        }
        DataPlaneError::Blob(B::NotFinal(_)) => Some("the memory could not freeze a write"),
        DataPlaneError::OperationCancelled
            if !matches!(op.stage, Stage::Opening { cancelled: true }) =>
        {
            Some("an op the child never cancelled was cancelled")
        }
        DataPlaneError::LimitReached(_) if !explains.limits => {
            Some("a bound was reached that this run's load cannot reach")
        }
        DataPlaneError::ArenaExhausted if !explains.arena_exhaustion => {
            Some("the arena was exhausted although it holds every blob this run writes")
        }
        DataPlaneError::BlobLost(_) if !explains.lost_blobs => {
            Some("a blob was lost although no host restarted")
        }
        DataPlaneError::SourceChanged(_) if !explains.changed_files => {
            Some("a file blob's file changed although no file changed in this run")
        }
        DataPlaneError::SessionNotRunning => Some("the running session said it was not running"),
        // Only a write whose child stopped before sealing may run past the write deadline.
        // (Or one whose host paused meanwhile: see `Explanations::resumed_at`.)
        DataPlaneError::WriteExpired { .. }
            if !matches!(op.stage, Stage::Stalled(_)) && !explains.paused_since(op.since) =>
        {
            Some("a write the child sealed at once was expired")
        }
        // A host derives every op id from its node, incarnation and binding, and declares done
        // only what was answered: the directory never has a reason to refuse one of its
        // operations as a conflict or as forgotten, nor to run out of revisions or break the
        // protocol. (Typed since these were folded into `SessionFailed`, which explained all.)
        DataPlaneError::Namespace(NamespaceError::OperationConflict(_)) => {
            Some("an honest host's op id was refused as used for another request")
        }
        DataPlaneError::Namespace(NamespaceError::OperationExpired(_)) => {
            Some("an honest host's operation was refused as forgotten")
        }
        DataPlaneError::Namespace(NamespaceError::NoSpace(_)) if !explains.full_disk => {
            Some("the directory said its disk was full although it never fills in this run")
        }
        DataPlaneError::Namespace(NamespaceError::Storage(_) | NamespaceError::Protocol(_)) => {
            Some("the namespace failed with storage or protocol")
        }
        DataPlaneError::BlobTooLarge { length, arena }
            if length.saturating_add(dataplane_core::arena::BLOB_HEADER_BYTES) <= *arena =>
        {
            Some("a blob that fits the arena was called too large")
        }
        _ => None,
    }
}

/// What a worker wants done.
#[derive(Debug, Default)]
pub struct WorkerOut {
    /// Requests to its session, in order.
    pub requests: Vec<ChildRequest>,
    /// Wake at this instant (replaces earlier wakes).
    pub wake: Option<Instant>,
    /// Notes for the checkers.
    pub notes: Vec<Note>,
}

/// The content of tag `tag`: 8 bytes of tag, then a stream derived from it.
pub fn content(tag: u64, length: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(length as usize);
    out.extend(tag.to_le_bytes().iter().take(length as usize));
    let mut x = tag ^ 0x9e37_79b9_7f4a_7c15;
    while (out.len() as u64) < length {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let room = (length - out.len() as u64).min(8) as usize;
        out.extend_from_slice(&x.to_le_bytes()[..room]);
    }
    out
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Stage {
    /// The open was sent; `cancelled` once a Cancel followed it.
    Opening { cancelled: bool },
    /// A write is granted and the worker stopped before writing it (a child stopped
    /// mid-write): it writes and seals after its stall time, unless the host's write deadline
    /// expired it first.
    Stalled(LeaseView),
    /// A write is granted (the worker fills and seals at once, so this is brief).
    Sealing(LeaseView),
    /// Published; the worker holds its view.
    Published(LeaseView, Revision),
    /// Abort sent after publication.
    Aborting(LeaseView, Revision),
    /// Abort sent right after the seal, before the publication's outcome (H-D2).
    SealAborting(LeaseView),
    /// A read is granted; the worker holds its view.
    Reading(LeaseView),
    /// Release sent.
    Releasing,
    /// A stream is matched (issue 17); the worker closes it after its hold time.
    Streaming,
    /// The stream's close was sent.
    StreamClosing,
}

/// How long past the write deadline a stalled write's expiry may take to reach its child: the
/// host's tick, and the delivery.
const WRITE_EXPIRY_SLACK: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
struct Op {
    write: Option<(u64, u64, bool)>,
    /// A file blob's publication: the file, and the version (tag, length) it had when the
    /// worker asked (`None`: it did not exist).
    file: Option<(String, Option<(u64, u64)>)>,
    /// A stream open (issue 17): its role and the descriptor it sent.
    stream: Option<(StreamRole, Vec<u8>)>,
    /// A Stat, Move or Remove (answered `Stat`, `Done` or `Failed`; never cancelled).
    control: bool,
    logical: String,
    path: Option<DataPath>,
    stage: Stage,
    since: Instant,
    /// A read that insists on this revision.
    expected: Option<Revision>,
    /// A checksum of what a granted read saw (the view must not change under the child).
    checksum: u64,
    /// A read the child never cancels: the host alone must end it (Q26/H-D9, L12).
    patient: bool,
    /// The host expired the write before it took the seal sent for it: the seal's own answer
    /// (a `Failed`: the write is no longer being written) is still to come.
    seal_answer_owed: bool,
}

/// The version (tag, length) of a file whose bytes are `content(tag, length)`.
fn file_version(bytes: &[u8]) -> Option<(u64, u64)> {
    let head: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some((u64::from_le_bytes(head), bytes.len() as u64))
}

impl Op {
    /// An open just sent for `logical` (resolved as `path`), with nothing else to it yet.
    fn opening(logical: String, path: Option<DataPath>, now: Instant) -> Op {
        Op {
            write: None,
            file: None,
            stream: None,
            control: false,
            logical,
            path,
            stage: Stage::Opening { cancelled: false },
            since: now,
            expected: None,
            checksum: 0,
            patient: false,
            seal_answer_owed: false,
        }
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Q24/S34 from the child's side: a view the child still maps is still its lease — the same
/// generation and length, sealed, and (for a read) the same bytes. A host that freed the lease
/// early marks it Released or hands it to someone else.
fn check_view(
    child: Address,
    op: u64,
    view: &LeaseView,
    access: BlobAccess,
    sum: Option<u64>,
    io: &mut WorkerIo<'_>,
) {
    let e = expected_of(view, access);
    let problem = match blob::validate(io.mem, &e, BlobState::Sealed, false) {
        Err(error) => Some(format!("its header reads {error:?}")),
        Ok(_) => match (sum, blob::payload(io.mem, &e)) {
            (Some(sum), Ok(payload)) if checksum(payload) != sum => {
                Some("its bytes changed".to_owned())
            }
            _ => None,
        },
    };
    if let Some(problem) = problem {
        io.violation(format!(
            "Q24: {child} op {op} still maps its lease, but {problem}"
        ));
    }
}

/// A worker's life with its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Attach sent.
    Attaching,
    /// Attached.
    Ready,
    /// Close sent.
    Closing,
    /// Closed (for good: the node starts a new worker for a new session).
    Closed,
}

/// One simulated child process.
#[derive(Clone, Debug)]
pub struct Worker {
    /// The child's address.
    pub address: Address,
    /// A world-unique number (content tags and the run id derive from it).
    pub global: u32,
    /// Its session's address.
    pub session: Address,
    /// Its state.
    pub state: WorkerState,
    /// Wake-ups are valid only for the current generation.
    pub wake_generation: u64,
    /// The host revoked the session: the grants still on their way to the worker name leases
    /// the host freed at the revocation (a real child finds their headers released and
    /// refuses them), so they are not checked or used (seed 5742).
    pub revoked: bool,
    job: JobContext,
    ops: BTreeMap<u64, Op>,
    next_op: u64,
    quiescing: bool,
    /// Attach refusals the worker provoked and has not seen yet.
    refusals_expected: u32,
    /// The revision the worker last saw at each path (its reads may insist on it: H-D8).
    seen: BTreeMap<DataPath, Revision>,
    /// A probe child's script (see [`Worker::probe`]); `None` for ordinary workers.
    probe: Option<Probe>,
}

/// How long a probe child may take, from its start to its close. Refusals of a busy host
/// (`LimitReached`) are retried within it, and so is a full arena the world found rightly full
/// (`Note::ArenaFull`); nothing else may fail.
pub const PROBE_BOUND: Duration = Duration::from_secs(30);
/// The payload length of the probe's write.
const PROBE_LENGTH: u64 = 64;
/// How long a probe waits before it asks again after a refusal, and how often it checks its
/// bound while it waits.
const PROBE_PERIOD: Duration = Duration::from_millis(500);

/// Where a probe is in its script.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ProbeStep {
    Attaching,
    Stat,
    Write,
    Sealing(LeaseView),
    Releasing,
    Read,
    ReadReleasing,
    Closing,
    Done,
}

#[derive(Clone, Debug)]
struct Probe {
    step: ProbeStep,
    started: Instant,
    /// The op of the current step.
    op: u64,
    /// The step was refused: ask again at this time.
    retry_at: Option<Instant>,
    /// Where the probe writes and reads.
    path: String,
    /// What it writes (a content tag).
    tag: u64,
}

/// What a worker needs from the world for one step.
#[derive(Debug)]
pub struct WorkerIo<'a> {
    /// Current time.
    pub now: Instant,
    /// The workload stream.
    pub rng: &'a mut SimRng,
    /// Host-side options.
    pub options: &'a HostOptions,
    /// The contended paths (shared with the clients).
    pub paths: &'a [DataPath],
    /// The arena the worker maps, and its node's files (a worker publishes file blobs).
    pub mem: &'a mut dataplane_core::host::WithFiles<crate::memory::SimArena>,
    /// The arena generation to present at attach.
    pub arena_generation: u64,
    /// The overload regime, if the run has it.
    pub overload: Option<&'a OverloadOptions>,
    /// The failures the run can explain.
    pub explains: Explanations,
    /// What the worker wants done.
    pub out: WorkerOut,
}

impl WorkerIo<'_> {
    fn wake_in(&mut self, mean: Duration) {
        let delay = Duration::from_nanos(self.rng.exponential(mean.as_nanos()));
        let at = self.now.saturating_add(delay);
        self.out.wake = Some(self.out.wake.map_or(at, |w| w.min(at)));
    }

    fn wake_at(&mut self, at: Instant) {
        self.out.wake = Some(self.out.wake.map_or(at, |w| w.min(at)));
    }

    fn violation(&mut self, text: String) {
        self.out.notes.push(Note::Violation(text));
    }
}

fn expected_of(view: &LeaseView, access: BlobAccess) -> Expected {
    Expected {
        offset: view.offset,
        length: view.length,
        generation: view.generation,
        access,
        digest_kind: view.digest,
    }
}

impl Worker {
    /// A worker that attaches to `session` at once.
    pub fn new(address: Address, global: u32, session: Address, io: &mut WorkerIo<'_>) -> Worker {
        let worker = Worker {
            address,
            global,
            session,
            revoked: false,
            state: WorkerState::Attaching,
            wake_generation: 0,
            job: job(global),
            ops: BTreeMap::new(),
            next_op: 1,
            quiescing: false,
            refusals_expected: 0,
            seen: BTreeMap::new(),
            probe: None,
        };
        let capability = crate::host::capability(global);
        let mut worker = worker;
        if io.rng.chance(ratio(1, 5)) {
            // A confused child first presents the wrong arena or capability: refused, and the
            // session must be exactly as before (Q28), so the real attach below succeeds.
            let bad = if io.rng.chance(ratio(1, 2)) {
                ChildRequest::Attach {
                    arena_generation: io.arena_generation.wrapping_add(1),
                    capability,
                }
            } else {
                ChildRequest::Attach {
                    arena_generation: io.arena_generation,
                    capability: crate::host::capability(global.wrapping_add(1)),
                }
            };
            io.out.requests.push(bad);
            worker.refusals_expected += 1;
        }
        io.out.requests.push(ChildRequest::Attach {
            arena_generation: io.arena_generation,
            capability,
        });
        if io.rng.chance(ratio(1, 10)) {
            // ... or attaches twice: the second is refused and changes nothing.
            io.out.requests.push(ChildRequest::Attach {
                arena_generation: io.arena_generation,
                capability,
            });
            worker.refusals_expected += 1;
        }
        worker
    }

    /// A probe child, started on a host once the load stopped and every other child there
    /// closed: it attaches, stats a path, writes a small blob, reads it back, and closes. Every
    /// step must be served within [`PROBE_BOUND`]: a host whose tables do not drain after the
    /// load (issue 11's wedge) is caught here. A `LimitReached` refusal is asked again.
    pub fn probe(address: Address, global: u32, session: Address, io: &mut WorkerIo<'_>) -> Worker {
        let capability = crate::host::capability(global);
        io.out.requests.push(ChildRequest::Attach {
            arena_generation: io.arena_generation,
            capability,
        });
        io.wake_at(io.now.saturating_add(PROBE_PERIOD));
        Worker {
            address,
            global,
            session,
            revoked: false,
            state: WorkerState::Attaching,
            wake_generation: 0,
            job: job(global),
            ops: BTreeMap::new(),
            next_op: 1,
            quiescing: true,
            refusals_expected: 0,
            seen: BTreeMap::new(),
            probe: Some(Probe {
                step: ProbeStep::Attaching,
                started: io.now,
                op: 0,
                retry_at: None,
                path: "/runs/self/probe".to_owned(),
                tag: (u64::from(global) << 32) | 0xffff_ffff,
            }),
        }
    }

    /// Whether this is a probe child that finished its script.
    pub fn probe_done(&self) -> Option<bool> {
        self.probe.as_ref().map(|p| p.step == ProbeStep::Done)
    }

    /// The probe's next request for its current step (a fresh op id each time).
    fn probe_ask(&mut self, io: &mut WorkerIo<'_>) {
        let op = self.next_op;
        self.next_op += 1;
        let Some(p) = self.probe.as_mut() else {
            return;
        };
        p.op = op;
        p.retry_at = None;
        let op = ChildOp(op);
        let request = match &p.step {
            ProbeStep::Stat => ChildRequest::Stat {
                op,
                path: "/h/f/0".to_owned(),
            },
            ProbeStep::Write => ChildRequest::OpenWrite {
                op,
                path: p.path.clone(),
                length: PROBE_LENGTH,
                digest: DigestKind::Blake3,
                exclusive: false,
            },
            ProbeStep::Read => ChildRequest::OpenRead {
                op,
                path: p.path.clone(),
                expected_revision: None,
            },
            ProbeStep::Closing => ChildRequest::Close,
            _ => return,
        };
        io.out.requests.push(request);
    }

    /// The world found the arena full of blobs the namespace binds: nothing will free room
    /// for the probe's write, so the probe skips its write and read and closes. Returns
    /// whether it did (the probe was at its write).
    pub fn probe_skip_write(&mut self) -> bool {
        let Some(p) = self.probe.as_mut() else {
            return false;
        };
        if p.step != ProbeStep::Write {
            return false;
        }
        p.step = ProbeStep::Closing;
        p.retry_at = None;
        self.state = WorkerState::Closing;
        true
    }

    fn probe_next(&mut self, step: ProbeStep, io: &mut WorkerIo<'_>) {
        if let Some(p) = self.probe.as_mut() {
            p.step = step;
        }
        if self
            .probe
            .as_ref()
            .is_some_and(|p| p.step == ProbeStep::Closing)
        {
            self.state = WorkerState::Closing;
        }
        self.probe_ask(io);
    }

    fn probe_wake(&mut self, io: &mut WorkerIo<'_>) {
        let Some(p) = self.probe.as_ref() else {
            return;
        };
        if p.step == ProbeStep::Done {
            return;
        }
        if io.now.saturating_since(p.started) > PROBE_BOUND {
            io.violation(format!(
                "probe {} was not served within {PROBE_BOUND} after the load stopped: still at {:?}",
                self.address, p.step
            ));
            return;
        }
        if p.retry_at.is_some_and(|at| at <= io.now) {
            self.probe_ask(io);
        }
        io.wake_at(io.now.saturating_add(PROBE_PERIOD));
    }

    fn probe_event(&mut self, event: ChildEvent, io: &mut WorkerIo<'_>) {
        let Some(p) = self.probe.clone() else {
            return;
        };
        let current = |op: &ChildOp| op.0 == p.op;
        match (&p.step, event) {
            (ProbeStep::Attaching, ChildEvent::Attached { .. }) => {
                self.state = WorkerState::Ready;
                self.probe_next(ProbeStep::Stat, io);
            }
            (ProbeStep::Stat, ChildEvent::Stat { op, .. }) if current(&op) => {
                self.probe_next(ProbeStep::Write, io);
            }
            (
                ProbeStep::Stat,
                ChildEvent::Failed {
                    op,
                    error: DataPlaneError::PathNotFound(_),
                },
            ) if current(&op) => self.probe_next(ProbeStep::Write, io),
            (ProbeStep::Write, ChildEvent::WriteGranted { op, lease }) if current(&op) => {
                let e = expected_of(&lease, BlobAccess::Writable);
                let sealed = blob::payload_mut(io.mem, &e)
                    .map(|payload| payload.copy_from_slice(&content(p.tag, lease.length)))
                    .and_then(|()| blob::child_seal(io.mem, &e));
                if let Err(error) = sealed {
                    io.violation(format!(
                        "probe {}: its write lease: {error:?}",
                        self.address
                    ));
                }
                if let Some(p) = self.probe.as_mut() {
                    p.step = ProbeStep::Sealing(lease);
                }
                io.out.requests.push(ChildRequest::Seal { op });
            }
            (ProbeStep::Sealing(view), ChildEvent::Published { op, revision }) if current(&op) => {
                if let Ok(path) = self.job.resolve(&p.path) {
                    io.out.notes.push(Note::Published {
                        path,
                        revision,
                        tag: p.tag,
                        length: view.length,
                    });
                }
                if let Some(p) = self.probe.as_mut() {
                    p.step = ProbeStep::Releasing;
                }
                io.out.requests.push(ChildRequest::Release { op });
            }
            (ProbeStep::Releasing, ChildEvent::Released { op }) if current(&op) => {
                self.probe_next(ProbeStep::Read, io);
            }
            (ProbeStep::Read, ChildEvent::ReadGranted { op, lease, .. }) if current(&op) => {
                let e = expected_of(&lease, lease.access);
                let ok = blob::validate(io.mem, &e, BlobState::Sealed, false).is_ok()
                    && blob::payload(io.mem, &e)
                        .is_ok_and(|bytes| bytes == content(p.tag, lease.length).as_slice());
                if !ok {
                    io.violation(format!(
                        "probe {}: read back other bytes than it wrote",
                        self.address
                    ));
                }
                if let Some(p) = self.probe.as_mut() {
                    p.step = ProbeStep::ReadReleasing;
                }
                io.out.requests.push(ChildRequest::Release { op });
            }
            (ProbeStep::ReadReleasing, ChildEvent::Released { op }) if current(&op) => {
                self.probe_next(ProbeStep::Closing, io);
            }
            (ProbeStep::Closing, ChildEvent::Closed) => {
                self.state = WorkerState::Closed;
                if let Some(p) = self.probe.as_mut() {
                    p.step = ProbeStep::Done;
                }
                io.out.notes.push(Note::Seen("probe.served"));
            }
            (
                ProbeStep::Write,
                ChildEvent::Failed {
                    op,
                    error: DataPlaneError::ArenaExhausted,
                },
            ) if current(&op) => {
                io.out.notes.push(Note::ArenaFull {
                    length: PROBE_LENGTH,
                });
                if let Some(p) = self.probe.as_mut() {
                    p.retry_at = Some(io.now.saturating_add(PROBE_PERIOD));
                }
            }
            (
                ProbeStep::Stat | ProbeStep::Write | ProbeStep::Read,
                ChildEvent::Failed {
                    op,
                    error: DataPlaneError::LimitReached(_),
                },
            ) if current(&op) => {
                // A busy host may refuse for a while; ask again shortly.
                io.out.notes.push(Note::Seen("probe.refused_busy"));
                if let Some(p) = self.probe.as_mut() {
                    p.retry_at = Some(io.now.saturating_add(PROBE_PERIOD));
                }
            }
            (
                ProbeStep::Stat | ProbeStep::Read,
                ChildEvent::Failed {
                    op,
                    error: DataPlaneError::Namespace(NamespaceError::DirectoryUnavailable(_)),
                },
            ) if current(&op) => {
                // A host (re)started at the heal whose proxy has not heard of the directory
                // yet (discovery lags up to its draw): a read fails after the absent-read
                // wait, as designed. Asked again; the probe's bound says how long that may
                // take.
                io.out.notes.push(Note::Seen("probe.waited_for_directory"));
                if let Some(p) = self.probe.as_mut() {
                    p.retry_at = Some(io.now.saturating_add(PROBE_PERIOD));
                }
            }
            (
                ProbeStep::Write,
                ChildEvent::Failed {
                    op,
                    error: DataPlaneError::Namespace(NamespaceError::NoSpace(_)),
                },
            ) if current(&op) => {
                // The disk healed with the load: the directory takes new operations again
                // within its retry period, a host within its hold after the last refusal it
                // heard. Asked again; the probe's bound says how long that may take.
                io.out.notes.push(Note::Seen("probe.refused_no_space"));
                if let Some(p) = self.probe.as_mut() {
                    p.retry_at = Some(io.now.saturating_add(PROBE_PERIOD));
                }
            }
            (
                ProbeStep::Sealing(_),
                ChildEvent::Failed {
                    op,
                    error: DataPlaneError::Namespace(NamespaceError::NoSpace(_)),
                },
            ) if current(&op) => {
                // The same, for a publication the directory refused: the write is let go and
                // made again.
                io.out.notes.push(Note::Seen("probe.refused_no_space"));
                io.out.requests.push(ChildRequest::Release { op });
                if let Some(p) = self.probe.as_mut() {
                    p.step = ProbeStep::Write;
                    p.retry_at = Some(io.now.saturating_add(PROBE_PERIOD));
                }
            }
            // The release of a write refused for space (above).
            (ProbeStep::Write, ChildEvent::Released { op }) if current(&op) => {}
            (step, event) => io.violation(format!(
                "probe {} at {step:?}: unexpected {event:?} after the load stopped",
                self.address
            )),
        }
    }

    /// The worker's job context (the session is created with it).
    pub fn job(&self) -> &JobContext {
        &self.job
    }

    /// Whether the worker is done: closed, nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.state == WorkerState::Closed
    }

    /// What it still waits for (for liveness messages).
    pub fn describe(&self) -> String {
        let ops: Vec<String> = self
            .ops
            .iter()
            .map(|(op, o)| format!("{op}:{:?}", o.stage))
            .collect();
        format!("{:?} ops=[{}]", self.state, ops.join(" "))
    }

    /// The run heals: start nothing new; release what is held, cancel what waits, then close.
    pub fn quiesce(&mut self, io: &mut WorkerIo<'_>) {
        if self.probe.is_some() {
            return;
        }
        self.quiescing = true;
        self.wake(io);
    }

    /// A timed wake-up.
    pub fn wake(&mut self, io: &mut WorkerIo<'_>) {
        if self.probe.is_some() {
            self.probe_wake(io);
            return;
        }
        if self.state != WorkerState::Ready {
            return;
        }
        let now = io.now;
        // Release views held long enough, cancel opens waiting too long, maybe abort.
        let hold = io.options.hold_time;
        let wait = io.options.open_wait;
        let ops: Vec<u64> = self.ops.keys().copied().collect();
        for op in ops {
            let Some(o) = self.ops.get_mut(&op) else {
                continue;
            };
            let age = now.saturating_since(o.since);
            match o.stage.clone() {
                Stage::Opening { cancelled: false }
                    if self.quiescing || (!o.patient && age >= wait) =>
                {
                    io.out.notes.push(Note::Seen("host.cancel_sent"));
                    o.stage = Stage::Opening { cancelled: true };
                    io.out
                        .requests
                        .push(ChildRequest::Cancel { op: ChildOp(op) });
                }
                Stage::Published(view, revision) if self.quiescing || age >= hold => {
                    check_view(self.address, op, &view, BlobAccess::Writable, None, io);
                    let Some(o) = self.ops.get_mut(&op) else {
                        continue;
                    };
                    if !self.quiescing && io.rng.chance(io.options.abort) {
                        o.stage = Stage::Aborting(view, revision);
                        o.since = now;
                        io.out
                            .requests
                            .push(ChildRequest::Abort { op: ChildOp(op) });
                    } else {
                        o.stage = Stage::Releasing;
                        io.out
                            .requests
                            .push(ChildRequest::Release { op: ChildOp(op) });
                    }
                }
                Stage::Stalled(view) if self.quiescing || age >= io.options.stall_time => {
                    // Back from the stall: write and seal, if the host has not aborted the
                    // write meanwhile (its `Failed` is on its way: it releases the view).
                    let e = expected_of(&view, BlobAccess::Writable);
                    if blob::validate(io.mem, &e, BlobState::Writable, false).is_ok() {
                        // Restated: a write unsealed for its deadline (and a second for the
                        // host's tick and the delivery) has been aborted by then.
                        // A host paused meanwhile has that long after its resume.
                        let bound = io.options.write_deadline.saturating_add(WRITE_EXPIRY_SLACK);
                        let resumed_late = io.explains.paused_since(o.since)
                            && io
                                .explains
                                .resumed_at
                                .is_some_and(|r| now.saturating_since(r) < WRITE_EXPIRY_SLACK);
                        if age >= bound && !resumed_late {
                            io.violation(format!(
                                "write deadline: {} op {op} was granted {age} ago and never \
                                 sealed, and its host has not expired it (deadline {})",
                                self.address, io.options.write_deadline
                            ));
                        }
                        self.fill_and_seal(op, &view, io);
                    }
                }
                Stage::Streaming if self.quiescing || age >= hold => {
                    o.stage = Stage::StreamClosing;
                    io.out
                        .requests
                        .push(ChildRequest::CloseStream { op: ChildOp(op) });
                }
                Stage::Reading(view) if self.quiescing || age >= hold => {
                    let sum = o.checksum;
                    check_view(self.address, op, &view, view.access, Some(sum), io);
                    let Some(o) = self.ops.get_mut(&op) else {
                        continue;
                    };
                    o.stage = Stage::Releasing;
                    io.out
                        .requests
                        .push(ChildRequest::Release { op: ChildOp(op) });
                }
                _ => {}
            }
        }
        if self.quiescing {
            if self.ops.is_empty() {
                self.close(io);
            } else {
                io.wake_in(Duration::from_millis(500));
            }
            return;
        }
        if io.rng.chance(io.options.abrupt_close) {
            // The child dies: the host must end everything it held (Q24), its streams too.
            io.out.notes.push(Note::Seen("host.child_died"));
            if self.ops.values().any(|o| {
                o.stream.is_some() && matches!(o.stage, Stage::Opening { .. } | Stage::Streaming)
            }) {
                io.out.notes.push(Note::Seen("host.stream_left_to_host"));
            }
            self.close(io);
            self.ops.clear();
            return;
        }
        // An ordinary worker keeps up to 3 ops in flight; under overload it bursts far past
        // its session's and its host's bounds.
        let in_flight = io.overload.map_or(3, |o| o.burst);
        if self.ops.len() < in_flight {
            let burst = io.overload.map_or(1, |o| o.burst - self.ops.len());
            for _ in 0..burst {
                self.start_op(io);
            }
        }
        io.wake_in(io.options.think_mean);
    }

    fn close(&mut self, io: &mut WorkerIo<'_>) {
        self.state = WorkerState::Closing;
        io.out.requests.push(ChildRequest::Close);
    }

    fn pick_path(&self, io: &mut WorkerIo<'_>) -> String {
        if let Some(o) = io.overload
            && io.rng.chance(ratio(1, 2))
        {
            // Fresh paths pile up published blobs on the writer's host.
            return format!("/h/f/{}", io.rng.below(o.fresh_paths));
        }
        match io.rng.below(10) {
            0..=3 => io.rng.pick(io.paths).as_str().to_owned(),
            4..=5 => format!("/runs/self/o{}", io.rng.below(2)),
            6 => format!("/v/{}", io.rng.below(2)),
            _ => format!("/h/{}", io.rng.below(4)),
        }
    }

    fn start_op(&mut self, io: &mut WorkerIo<'_>) {
        let op = self.next_op;
        self.next_op += 1;
        let logical = self.pick_path(io);
        let path = self.job.resolve(&logical).ok();
        if io.rng.chance(ratio(3, 20)) {
            // A namespace query or mutation on the child's behalf, or a file blob's
            // publication (issue 17).
            let mut file = None;
            let request = match io.rng.below(5) {
                4 => {
                    let name = crate::world::file_name(
                        io.rng.below(crate::world::FILES_PER_HOST + 1) as usize,
                    );
                    let version = io.mem.files.contents(&name).and_then(file_version);
                    file = Some((name.clone(), version));
                    ChildRequest::PublishFile {
                        op: ChildOp(op),
                        path: logical.clone(),
                        file: name,
                    }
                }
                0 | 1 => ChildRequest::Stat {
                    op: ChildOp(op),
                    path: logical.clone(),
                },
                2 => ChildRequest::Move {
                    op: ChildOp(op),
                    from: logical.clone(),
                    to: self.pick_path(io),
                    replace: io.rng.chance(ratio(1, 2)),
                },
                _ => ChildRequest::Remove {
                    op: ChildOp(op),
                    path: logical.clone(),
                    expected_revision: path.as_ref().and_then(|p| self.seen.get(p).copied()),
                },
            };
            self.ops.insert(
                op,
                Op {
                    file,
                    control: true,
                    stage: Stage::Opening { cancelled: true },
                    ..Op::opening(logical, path, io.now)
                },
            );
            io.out.requests.push(request);
            return;
        }
        if io.rng.chance(ratio(1, 10)) {
            self.start_stream(op, io);
            return;
        }
        let write = io.rng.chance(ratio(1, 2));
        let request = if write {
            let tag = (u64::from(self.global) << 32) | op;
            let length = if io.rng.chance(ratio(3, 5)) {
                io.rng.range(0, 2_048)
            } else {
                io.rng.range(0, io.options.blob_max + 1)
            };
            let corrupt = io.rng.chance(io.options.corrupt);
            let exclusive = io.rng.chance(ratio(1, 5));
            let digest = if io.rng.chance(ratio(7, 10)) {
                DigestKind::Blake3
            } else {
                DigestKind::None
            };
            self.ops.insert(
                op,
                Op {
                    write: Some((tag, length, corrupt)),
                    ..Op::opening(logical.clone(), path, io.now)
                },
            );
            ChildRequest::OpenWrite {
                op: ChildOp(op),
                path: logical,
                length,
                digest,
                exclusive,
            }
        } else {
            let expected_revision = match &path {
                Some(p) if io.rng.chance(ratio(3, 10)) => self.seen.get(p).copied(),
                _ => None,
            };
            // Some reads are not cancelled before the heal: their transfer must end on its own,
            // within its deadline (Q26/H-D9; the host check bounds every running transfer).
            let patient = io.rng.chance(ratio(1, 5));
            self.ops.insert(
                op,
                Op {
                    expected: expected_revision,
                    patient,
                    ..Op::opening(logical.clone(), path, io.now)
                },
            );
            ChildRequest::OpenRead {
                op: ChildOp(op),
                path: logical,
                expected_revision,
            }
        };
        io.out.requests.push(request);
    }

    /// A file blob was published: its content is the version the file had when the worker
    /// asked, if it still has that version now (a version never comes back, so the file had
    /// it throughout). A file that changed meanwhile leaves the content unknown.
    fn file_published(
        &mut self,
        op: u64,
        name: &str,
        asked: Option<(u64, u64)>,
        revision: Revision,
        io: &mut WorkerIo<'_>,
    ) {
        let Some(o) = self.ops.remove(&op) else {
            return;
        };
        let now = io.mem.files.contents(name).and_then(file_version);
        if !o
            .path
            .as_ref()
            .is_some_and(|p| self.job.allows(p, Access::Write))
        {
            io.violation(format!(
                "S29: {} published file {name} at {:?}, where it may not write",
                self.address, o.logical
            ));
        }
        match (asked, o.path) {
            (None, _) if !io.explains.changed_files => io.violation(format!(
                "{}: op {op} published file {name}, which does not exist",
                self.address
            )),
            (Some((tag, length)), Some(path)) if now == asked => {
                self.seen.insert(path.clone(), revision);
                io.out.notes.push(Note::Published {
                    path,
                    revision,
                    tag,
                    length,
                });
                io.out.notes.push(Note::Seen("host.file_published"));
            }
            _ => io.out.notes.push(Note::Seen("host.file_publish_raced")),
        }
        self.maybe_close(io);
    }

    /// Opens one side of a stream (issue 17) at one of a few paths the workers share (and
    /// `/v`, where a source may not open): it waits for a peer, is held a while once matched
    /// and then closed, or is cancelled after the open wait; a dying worker leaves both to its
    /// host.
    fn start_stream(&mut self, op: u64, io: &mut WorkerIo<'_>) {
        let logical = match io.rng.below(8) {
            0 => "/v/stream".to_owned(),
            n => format!("/s/w{}", n % 3),
        };
        let role = if io.rng.chance(ratio(1, 2)) {
            StreamRole::Source
        } else {
            StreamRole::Sink
        };
        let descriptor = format!("{}#{op}", self.address).into_bytes();
        let path = self.job.resolve(&logical).ok();
        let request = ChildRequest::OpenStream {
            op: ChildOp(op),
            path: logical.clone(),
            role,
            descriptor: Descriptor::new(descriptor.clone()).expect("a short descriptor"),
            replace: io.rng.chance(ratio(1, 5)),
            ensure: !io.rng.chance(ratio(1, 10)),
            expected_revision: None,
        };
        self.ops.insert(
            op,
            Op {
                stream: Some((role, descriptor)),
                ..Op::opening(logical, path, io.now)
            },
        );
        io.out.requests.push(request);
    }

    /// A stream open met its peer: the match names this worker's own descriptor for its role.
    fn stream_matched(&mut self, op: u64, matched: &StreamMatch, io: &mut WorkerIo<'_>) {
        let Some(o) = self.ops.get_mut(&op) else {
            return;
        };
        let Some((role, descriptor)) = o.stream.clone() else {
            io.violation(format!("{}: a stream match for op {op}", self.address));
            return;
        };
        let ours = match role {
            StreamRole::Source => &matched.source_descriptor,
            StreamRole::Sink => &matched.sink_descriptor,
        };
        if ours.as_bytes() != descriptor.as_slice() {
            io.violation(format!(
                "{}: stream op {op} matched as {role:?} with another descriptor",
                self.address
            ));
        }
        if !matches!(o.stage, Stage::Opening { .. }) {
            io.violation(format!(
                "{}: a stream match for op {op} in {:?}",
                self.address, o.stage
            ));
            return;
        }
        if let Some(path) = &o.path
            && role == StreamRole::Source
            && !self.job.allows(path, Access::Write)
        {
            io.violation(format!(
                "S29: {} opened a stream source at {path}, where it may not write",
                self.address
            ));
        }
        // A match that crossed a cancel is ours all the same: held, then closed.
        o.stage = Stage::Streaming;
        o.since = io.now;
        io.out.notes.push(Note::Seen("host.stream_matched"));
    }

    /// Checks that an op granted on `path` is one the job allows (S29).
    fn check_authorized(&self, op: &Op, io: &mut WorkerIo<'_>) {
        let access = if op.write.is_some() {
            Access::Write
        } else {
            Access::Read
        };
        match &op.path {
            Some(path) if self.job.allows(path, access) => {}
            _ => io.violation(format!(
                "S29: {} was granted {access:?} to {:?}",
                self.address, op.logical
            )),
        }
    }

    /// An event from the session.
    pub fn event(&mut self, event: ChildEvent, io: &mut WorkerIo<'_>) {
        if self.probe.is_some() {
            self.probe_event(event, io);
            return;
        }
        match event {
            ChildEvent::Attached { .. } => {
                if self.state != WorkerState::Attaching {
                    io.violation(format!("S28: {} attached twice", self.address));
                }
                self.state = WorkerState::Ready;
                if self.quiescing {
                    self.close(io);
                } else {
                    io.wake_in(io.options.think_mean);
                }
            }
            ChildEvent::AttachFailed { error } => {
                if self.refusals_expected == 0 {
                    io.violation(format!("S28: {} could not attach: {error:?}", self.address));
                } else {
                    self.refusals_expected -= 1;
                    io.out.notes.push(Note::Seen("host.attach_refused"));
                }
            }
            ChildEvent::Revoked => {
                // The supervisor ended our session: everything we held is gone; `Closed`
                // follows.
                io.out.notes.push(Note::Seen("host.session_revoked"));
                if self.state != WorkerState::Ready {
                    io.violation(format!(
                        "{} was revoked while {:?}",
                        self.address, self.state
                    ));
                }
                self.state = WorkerState::Closing;
                self.ops.clear();
            }
            ChildEvent::Closed => {
                if self.state != WorkerState::Closing {
                    io.violation(format!("{} closed without asking", self.address));
                }
                self.state = WorkerState::Closed;
                self.ops.clear();
            }
            ChildEvent::Stat {
                op,
                kind,
                revision,
                length,
                lost,
            } => {
                let Some(o) = self.ops.remove(&op.0) else {
                    return;
                };
                if !o.control {
                    io.violation(format!("{}: a Stat answer for op {}", self.address, op.0));
                }
                if lost {
                    if kind != dataplane_core::wire::EntryKind::Blob || length.is_some() {
                        io.violation(format!(
                            "{}: stat of op {} says a {kind} with length {length:?} is lost",
                            self.address, op.0
                        ));
                    }
                    io.out.notes.push(Note::Seen("host.stat_lost"));
                } else if let (Some(path), Some(length)) = (o.path, length) {
                    let _ = kind;
                    io.out.notes.push(Note::Stat {
                        path,
                        revision,
                        length,
                    });
                }
                self.maybe_close(io);
            }
            ChildEvent::Done { op, .. } => {
                let Some(o) = self.ops.remove(&op.0) else {
                    return;
                };
                if !o.control {
                    io.violation(format!("{}: a Done answer for op {}", self.address, op.0));
                }
                io.out.notes.push(Note::Seen("host.control_done"));
                self.maybe_close(io);
            }
            ChildEvent::StreamMatched { op, matched } => self.stream_matched(op.0, &matched, io),
            ChildEvent::StreamDisplaced { op } => {
                if let Some(o) = self.ops.get(&op.0)
                    && !matches!(
                        o.stage,
                        Stage::Opening { .. } | Stage::Streaming | Stage::StreamClosing
                    )
                {
                    io.violation(format!(
                        "{}: StreamDisplaced for op {} in {:?}",
                        self.address, op.0, o.stage
                    ));
                }
                if self.ops.remove(&op.0).is_some() {
                    io.out.notes.push(Note::Seen("host.stream_displaced"));
                }
                self.maybe_close(io);
            }
            ChildEvent::StreamClosed { op } => {
                match self.ops.remove(&op.0) {
                    Some(o) if o.stage == Stage::StreamClosing => {
                        io.out.notes.push(Note::Seen("host.stream_closed"));
                    }
                    Some(o) => io.violation(format!(
                        "{}: StreamClosed for op {} in {:?}",
                        self.address, op.0, o.stage
                    )),
                    None => {}
                }
                self.maybe_close(io);
            }
            ChildEvent::WriteGranted { op, lease } => self.write_granted(op.0, lease, io),
            ChildEvent::ReadGranted {
                op,
                lease,
                revision,
            } => self.read_granted(op.0, lease, revision, io),
            ChildEvent::Published { op, revision } => {
                if let Some(o) = self.ops.get(&op.0)
                    && let Some((name, asked)) = o.file.clone()
                {
                    self.file_published(op.0, &name, asked, revision, io);
                    return;
                }
                let Some(o) = self.ops.get_mut(&op.0) else {
                    return;
                };
                let (
                    Some((tag, length, corrupt)),
                    Stage::Sealing(view) | Stage::SealAborting(view),
                ) = (o.write, o.stage.clone())
                else {
                    io.violation(format!(
                        "{}: Published for op {} in {:?}",
                        self.address, op.0, o.stage
                    ));
                    return;
                };
                if corrupt {
                    io.violation(format!(
                        "S33: {} op {}: a corrupted seal was published",
                        self.address, op.0
                    ));
                }
                if let Some(path) = o.path.clone() {
                    self.seen.insert(path.clone(), revision);
                    io.out.notes.push(Note::Published {
                        path,
                        revision,
                        tag,
                        length,
                    });
                }
                if !io.options.corrupt.is_zero() && io.rng.chance(ratio(1, 2)) {
                    // A hostile child tries to change its blob now that it is published: the
                    // host froze it at the seal, so no write of ours may reach it.
                    io.out
                        .notes
                        .push(Note::Seen("host.write_after_publish_tried"));
                    if io.mem.child_may_write(view.offset) {
                        io.violation(format!(
                            "{} op {}: the child can still change its blob after it was published (the host did not freeze it)",
                            self.address, op.0
                        ));
                    }
                }
                o.stage = if matches!(o.stage, Stage::SealAborting(_)) {
                    // The abort was sent already: Aborted (or a refusal) follows.
                    Stage::Aborting(view, revision)
                } else {
                    Stage::Published(view, revision)
                };
                o.since = io.now;
            }
            ChildEvent::Aborted { op } => {
                let Some(o) = self.ops.get_mut(&op.0) else {
                    return;
                };
                if let (Stage::Aborting(_, revision), Some(path)) = (&o.stage, &o.path) {
                    io.out.notes.push(Note::Aborted {
                        path: path.clone(),
                        revision: *revision,
                    });
                }
                // The view is still ours to release.
                o.stage = Stage::Releasing;
                io.out.requests.push(ChildRequest::Release { op });
            }
            ChildEvent::Released { op } => {
                let Some(o) = self.ops.get(&op.0) else { return };
                if o.stage != Stage::Releasing {
                    io.violation(format!(
                        "{}: Released for op {} in {:?}",
                        self.address, op.0, o.stage
                    ));
                }
                self.ops.remove(&op.0);
                self.maybe_close(io);
            }
            ChildEvent::Failed { op, error } => {
                let Some(stage) = self.ops.get(&op.0).map(|o| o.stage.clone()) else {
                    return;
                };
                io.out.notes.push(Note::Seen(failure_name(&error)));
                if let Some(o) = self.ops.get(&op.0)
                    && let Some(why) = unexplained(o, &error, &io.explains)
                {
                    io.violation(format!(
                        "unexplained failure: {} op {} ({}) failed {error:?}: {why}",
                        self.address, op.0, o.logical
                    ));
                }
                if let Some(o) = self.ops.get(&op.0) {
                    let refused_corrupt = matches!(o.write, Some((_, _, true)))
                        && matches!(o.stage, Stage::Sealing(_));
                    if refused_corrupt {
                        io.out.notes.push(Note::Seen("host.corrupt_seal_refused"));
                    }
                    // A publication no directory ever saw, failed at the proxy's deadline.
                    if o.write.is_some()
                        && matches!(o.stage, Stage::Sealing(_))
                        && matches!(
                            &error,
                            DataPlaneError::Namespace(NamespaceError::DirectoryUnavailable(_))
                        )
                    {
                        io.out
                            .notes
                            .push(Note::Seen("host.unsent_publication_failed"));
                    }
                }
                match stage {
                    Stage::Opening { .. } => {
                        self.ops.remove(&op.0);
                    }
                    Stage::Stalled(_)
                    | Stage::Sealing(_)
                    | Stage::SealAborting(_)
                    | Stage::Published(..)
                    | Stage::Aborting(..)
                    | Stage::Reading(_) => {
                        // The op failed after a grant (or an abort was refused): release the view.
                        if let Some(o) = self.ops.get_mut(&op.0) {
                            o.stage = Stage::Releasing;
                            o.seal_answer_owed =
                                matches!(stage, Stage::Sealing(_) | Stage::SealAborting(_))
                                    && matches!(error, DataPlaneError::WriteExpired { .. });
                        }
                        io.out.requests.push(ChildRequest::Release { op });
                    }
                    Stage::Releasing
                        if self.ops.get(&op.0).is_some_and(|o| o.seal_answer_owed)
                            && matches!(
                                error,
                                DataPlaneError::Blob(
                                    dataplane_core::error::BlobFailure::State { .. }
                                )
                            ) =>
                    {
                        // The answer to a seal the host took after it expired the write.
                        io.out.notes.push(Note::Seen("host.late_seal_refused"));
                        if let Some(o) = self.ops.get_mut(&op.0) {
                            o.seal_answer_owed = false;
                        }
                    }
                    Stage::Releasing => {
                        io.violation(format!(
                            "{}: release of op {} failed: {error:?}",
                            self.address, op.0
                        ));
                        self.ops.remove(&op.0);
                    }
                    // A matched stream's close is always taken (a displacement ends it
                    // with `StreamDisplaced`).
                    Stage::Streaming | Stage::StreamClosing => {
                        io.violation(format!(
                            "{}: matched stream op {} failed: {error:?}",
                            self.address, op.0
                        ));
                        self.ops.remove(&op.0);
                    }
                }
                self.maybe_close(io);
            }
        }
    }

    /// A grant for an op the worker does not know: fine after it walked away (an abrupt close
    /// forgets every op), a host bug otherwise.
    fn unknown_op(&self, op: u64, io: &mut WorkerIo<'_>) {
        if self.state == WorkerState::Ready || self.state == WorkerState::Attaching {
            io.violation(format!("{}: a grant for unknown op {op}", self.address));
        }
    }

    fn maybe_close(&mut self, io: &mut WorkerIo<'_>) {
        if self.quiescing && self.ops.is_empty() && self.state == WorkerState::Ready {
            self.close(io);
        }
    }

    fn write_granted(&mut self, op: u64, view: LeaseView, io: &mut WorkerIo<'_>) {
        if self.revoked {
            return;
        }
        let Some(o) = self.ops.get(&op).cloned() else {
            self.unknown_op(op, io);
            return;
        };
        let Some((_, length, corrupt)) = o.write else {
            io.violation(format!("{}: a write grant for read op {op}", self.address));
            return;
        };
        if !matches!(o.stage, Stage::Opening { .. }) {
            io.violation(format!("{}: a second grant for op {op}", self.address));
            return;
        }
        self.check_authorized(&o, io);
        let e = expected_of(&view, BlobAccess::Writable);
        // S31: a writable grant is a Writable header of the lease's length, payload zeroed.
        match blob::validate(io.mem, &e, BlobState::Writable, false) {
            Ok(header) if header.length == length => {}
            other => io.violation(format!(
                "S31: {} op {op}: write grant header {other:?}",
                self.address
            )),
        }
        // Sometimes the child stops before it writes a byte (SIGSTOP mid-write).
        if !corrupt && io.rng.chance(io.options.stall) {
            io.out.notes.push(Note::Seen("host.write_stalled"));
            if let Some(o) = self.ops.get_mut(&op) {
                o.stage = Stage::Stalled(view);
                o.since = io.now;
            }
            return;
        }
        self.fill_and_seal(op, &view, io);
    }

    /// Writes a granted write's bytes into its lease and seals it (a hostile child corrupts
    /// the seal; sometimes the abort follows at once).
    fn fill_and_seal(&mut self, op: u64, view: &LeaseView, io: &mut WorkerIo<'_>) {
        let Some((tag, length, corrupt)) = self.ops.get(&op).and_then(|o| o.write) else {
            return;
        };
        let view = *view;
        let e = expected_of(&view, BlobAccess::Writable);
        let filled = match blob::payload_mut(io.mem, &e) {
            Ok(payload) => {
                let zeroed = payload.iter().all(|b| *b == 0);
                payload.copy_from_slice(&content(tag, length));
                Ok(zeroed)
            }
            Err(error) => Err(error),
        };
        match filled {
            Ok(true) => {}
            Ok(false) => io.violation(format!(
                "S31: {} op {op}: write lease not zeroed",
                self.address
            )),
            Err(error) => io.violation(format!("S31: {} op {op}: payload {error:?}", self.address)),
        }
        // Half the honest writes leave the digest to the host, which computes it as it
        // freezes the write (the real child library's default); the rest hash it here and the
        // host checks it. A corrupting child hashes: its change after the seal must be caught.
        let host_hashes = !corrupt && view.digest == DigestKind::Blake3 && (tag ^ op) & 1 == 0;
        let sealed = if host_hashes {
            io.out.notes.push(Note::Seen("host.digest_left_to_host"));
            blob::child_seal_unhashed(io.mem, &e)
        } else {
            blob::child_seal(io.mem, &e)
        };
        if let Err(error) = sealed {
            io.violation(format!(
                "{} op {op}: child seal failed: {error:?}",
                self.address
            ));
        }
        if corrupt {
            // A hostile child: the header's length no longer matches the lease, or the payload
            // changes after the digest was stored.
            let offset = view.offset as usize;
            let at = match io.rng.below(3) {
                0 if view.digest == DigestKind::Blake3 && length > 0 => {
                    offset + dataplane_core::arena::BLOB_HEADER_BYTES as usize
                }
                // The generation, or the length field of the header.
                1 => offset + 8,
                _ => offset + 16,
            };
            if let Some(byte) = io.mem.get_mut(at) {
                *byte ^= 0x01;
            }
        }
        // Sometimes the child changes its mind at once: the abort follows the seal, and reaches
        // the host while the write publishes (H-D2). It must end Aborted (S36) or Failed.
        let abort_now = !corrupt && io.rng.chance(io.options.abort.halved());
        if let Some(o) = self.ops.get_mut(&op) {
            o.stage = if abort_now {
                Stage::SealAborting(view)
            } else {
                Stage::Sealing(view)
            };
            o.since = io.now;
        }
        io.out.requests.push(ChildRequest::Seal { op: ChildOp(op) });
        if abort_now {
            io.out.notes.push(Note::Seen("host.abort_while_publishing"));
            io.out
                .requests
                .push(ChildRequest::Abort { op: ChildOp(op) });
        }
    }

    fn read_granted(
        &mut self,
        op: u64,
        view: LeaseView,
        revision: Revision,
        io: &mut WorkerIo<'_>,
    ) {
        if self.revoked {
            return;
        }
        let Some(o) = self.ops.get(&op).cloned() else {
            self.unknown_op(op, io);
            return;
        };
        if o.write.is_some() || !matches!(o.stage, Stage::Opening { .. }) {
            io.violation(format!(
                "{}: an unexpected read grant for op {op} in {:?}",
                self.address, o.stage
            ));
            return;
        }
        self.check_authorized(&o, io);
        if o.expected.is_some_and(|r| r != revision) {
            io.violation(format!(
                "H-D8: {} op {op} insisted on {:?} and was granted {revision}",
                self.address, o.expected
            ));
        }
        if let Some(path) = &o.path {
            self.seen.insert(path.clone(), revision);
        }
        if view.access == BlobAccess::Writable {
            io.out.notes.push(Note::Seen("host.read_shared"));
        }
        let e = expected_of(&view, view.access);
        // S31: a read grant is a Sealed header whose generation and length match (read-only
        // if the host filled it; the writer's, if it shares a blob it publishes itself).
        match blob::validate(io.mem, &e, BlobState::Sealed, false) {
            Ok(_) => match blob::payload(io.mem, &e) {
                Ok(payload) => {
                    let sum = checksum(payload);
                    if let Some(o) = self.ops.get_mut(&op) {
                        o.checksum = sum;
                    }
                    if let Some(path) = o.path.clone() {
                        io.out.notes.push(Note::Read {
                            path,
                            revision,
                            payload: payload.to_vec(),
                        });
                    }
                }
                Err(error) => {
                    io.violation(format!("S31: {} op {op}: payload {error:?}", self.address));
                }
            },
            Err(error) => io.violation(format!(
                "S31: {} op {op}: read grant header {error:?}",
                self.address
            )),
        }
        if let Some(o) = self.ops.get_mut(&op) {
            o.stage = Stage::Reading(view);
            o.since = io.now;
        }
    }
}

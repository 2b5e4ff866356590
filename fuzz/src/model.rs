//! The directory's reference model, and the workload that drives both (`directory_ops`,
//! `log_recover`).
//!
//! Copied from `core/tests/model.rs` (fuzz/ is its own crate and cannot import test files),
//! with proptest's strategies replaced by `#[derive(Arbitrary)]` and its assertions by panics.
//! The model is written from SPEC.md §3–§4, DESIGN.md §5 and ARCHITECTURE.md "Decisions" and
//! shares no logic with `core/src/directory`; keep it in step with the test's copy.
//!
//! Random operation sequences over a few contended paths and a small pool of operation ids
//! (so that duplicates, replays and op-id reuse are frequent) drive the real `Directory` and
//! the model. After every step:
//!
//! * every reply the directory sent (to the caller, and to parked or held openers answered
//!   later) equals the model's prediction, epoch included;
//! * the Retire / Displaced / GoneAcknowledged frames equal the predicted ones;
//! * the durable state (entries, operation table, reservations, obligations, node floors,
//!   counters) equals the model's;
//! * the runtime rendezvous and fences sit on the predicted paths, and the watched routes are
//!   exactly the targets that have obligations;
//! * the write-ahead barrier holds: walking the step's effects in order, every reply and notice
//!   is justified by the records persisted before it, and those records rebuild the live
//!   durable state exactly;
//! * `check_invariants` holds.
//!
//! One difference from the test: the model's retry pass assumes fewer obligations than the
//! retry batch (the directory's rotation beyond it is not modelled), so a tick or restart while
//! more than [`RETRY_BATCH_MAX`] obligations are open is skipped. Fuzzed sequences are long
//! enough to get there; the test's are not.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use arbitrary::{Arbitrary, Unstructured};
use dataplane_core::directory::{DurableState, ObligationKey, Rendezvous};
use dataplane_core::effect::Effect;
use dataplane_core::error::{Limit, NamespaceError, Reason};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::limits::{FENCE_HELD_OPENS_MAX, RETRY_BATCH_MAX};
use dataplane_core::log::{
    Entry, OperationRecord, Outcome, Rejection, RejectionKind, RequestKey, Reservation,
};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    BlobBinding, Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, EntryKind, FileRef,
    GoneScope, Message, MutationReceipt, NamespaceNode, ReplyBody, SourceRecovery, StreamMatch,
    StreamRole,
};

use crate::dir::{DIRECTORY, Dir};

// ---------------------------------------------------------------------------------------------
// Vocabulary of the generated workload
// ---------------------------------------------------------------------------------------------

const CLIENT: Address = crate::dir::CLIENT;
const CLIENT2: Address = Address::new(NodeId(1), 1, 1);
const HOST: Address = Address::new(NodeId(9), 1, 0);

/// The longest sequence one input runs (longer ones are cut): keeps executions fast.
pub const STEPS_MAX: usize = 256;

/// One of the contended paths.
#[derive(Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum P {
    A,
    B,
    AC,
}

impl P {
    fn path(self) -> DataPath {
        DataPath::new(self.as_str()).unwrap()
    }
    fn as_str(self) -> &'static str {
        match self {
            P::A => "/a",
            P::B => "/b",
            P::AC => "/a/c",
        }
    }
}

impl fmt::Debug for P {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which expected revision an open (or a compare-and-delete unregister) names.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Expect {
    None,
    /// The i-th most recently observed revision (of the last four).
    Recent(u8),
}

/// Which incarnation a close names.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum IncPick {
    /// The i-th most recently matched incarnation (any epoch).
    Seen(u8),
    /// (current epoch, revision r): usually stale, sometimes a duplicate close.
    Current(u8),
}

/// Which addresses a host reports gone.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Gone {
    Endpoint(u8),
    Source(u8),
    Owner(u8),
    /// `NodeBefore{node, incarnation}`.
    Node(u8, u64),
}

fn role(u: &mut Unstructured<'_>) -> arbitrary::Result<StreamRole> {
    Ok(if u.arbitrary::<bool>()? {
        StreamRole::Source
    } else {
        StreamRole::Sink
    })
}

/// One step of the workload. Raw numbers from the fuzzer are folded into the windows the
/// proptest strategies draw from by [`Step::normalised`].
#[derive(Clone, Debug, Arbitrary)]
pub enum Step {
    Register {
        path: P,
        op: u8,
        long: bool,
        /// A `File` recovery record (the source is unavailable after a restart).
        file: bool,
        reservation: Option<u8>,
    },
    Resolve(P),
    Lookup(P),
    Reserve {
        path: P,
        op: u8,
        owner: u8,
    },
    Release {
        path: P,
        op: u8,
    },
    Unregister {
        path: P,
        expected: Expect,
        op: u8,
    },
    Rename {
        from: P,
        to: P,
        replace: bool,
        op: u8,
    },
    Open {
        path: P,
        #[arbitrary(with = role)]
        role: StreamRole,
        endpoint: u8,
        replace: bool,
        ensure: bool,
        expected: Expect,
        op: u8,
    },
    Cancel {
        path: P,
        op: u8,
    },
    Close {
        path: P,
        inc: IncPick,
    },
    /// Re-send the i-th most recent request verbatim (fresh request id), from CLIENT or CLIENT2.
    Replay {
        back: u8,
        other_client: bool,
    },
    /// Acknowledge the i-th Retire notice seen so far (possibly already acknowledged).
    SourceRetired(u8),
    /// Acknowledge the i-th Displaced notice seen so far (possibly stale or duplicate).
    StreamDisplaced(u8),
    Gone(Gone),
    Tick,
    Restart,
    /// A route report for the i-th watched target (skipped when nothing is watched).
    Route {
        target: u8,
        routable: bool,
    },
}

/// Operation ids: each kind draws from its own small window, and neighbouring windows overlap
/// so that an id is sometimes reused for a different kind of request.
type Window = std::ops::RangeInclusive<u8>;
const REGISTER_OPS: Window = 1..=6;
const RESERVE_OPS: Window = 5..=9;
const UNREGISTER_OPS: Window = 9..=12;
const RENAME_OPS: Window = 11..=14;
const OPEN_OPS: Window = 13..=24;

fn fold(raw: u8, window: Window) -> u8 {
    let (lo, hi) = (*window.start(), *window.end());
    lo + raw % (hi - lo + 1)
}

impl Expect {
    fn normalised(self) -> Expect {
        match self {
            Expect::None => Expect::None,
            Expect::Recent(i) => Expect::Recent(i % 4),
        }
    }
}

impl Step {
    /// The step with every number folded into its window (as the proptest strategies draw).
    pub fn normalised(&self) -> Step {
        match self.clone() {
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
                expected: expected.normalised(),
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
                expected: expected.normalised(),
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
                Gone::Node(n, i) => Gone::Node(fold(n, 2..=7), 2 + i % 2),
            }),
            Step::Route { target, routable } => Step::Route {
                target: target % 8,
                routable,
            },
            other @ (Step::Resolve(_) | Step::Lookup(_) | Step::Tick | Step::Restart) => other,
        }
    }
}

/// Endpoints: two per node, incarnations 1 and 2.
fn endpoint(e: u8) -> Address {
    let e = u64::from(e % 4);
    Address::new(NodeId(2 + e / 2), 1 + e % 2, 10 + e)
}

/// A fresh source per register operation id ("hosts mint a fresh source per publish").
fn source_of(op: u8) -> Address {
    let o = u64::from(op);
    Address::new(NodeId(4 + o % 2), 1 + (o / 2) % 2, 100 + o)
}

fn owner(k: u8) -> Address {
    let k = u64::from(k % 2);
    Address::new(NodeId(6), 1 + k, 200 + k)
}

fn recovery_owner(op: u8) -> Option<Address> {
    (op % 2 == 1).then(|| Address::new(NodeId(7), 1, 300 + u64::from(op)))
}

fn oid(op: u8) -> OperationId {
    OperationId(u128::from(op))
}

fn descriptor_of(endpoint: Address) -> Descriptor {
    Descriptor::new(vec![endpoint.node.0 as u8, endpoint.actor as u8]).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------------

/// Who is waiting for a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Caller {
    request_id: RequestId,
    reply_to: Address,
}

/// The arguments of an OpenStream.
#[derive(Clone, Debug)]
struct OpenArgs {
    path: DataPath,
    role: StreamRole,
    descriptor: Descriptor,
    endpoint: Address,
    replace: bool,
    ensure: bool,
    expected: Option<Revision>,
    op: OperationId,
}

#[derive(Clone, Debug)]
struct MPending {
    role: StreamRole,
    endpoint: Address,
    descriptor: Descriptor,
    op: OperationId,
    caller: Caller,
    revision: Revision,
    opened_from: Option<Revision>,
}

#[derive(Clone, Debug)]
struct MActive {
    matched: StreamMatch,
    source_op: OperationId,
    sink_op: OperationId,
}

impl MActive {
    fn endpoints(&self) -> Vec<Address> {
        let mut v = vec![self.matched.source];
        if self.matched.sink != self.matched.source {
            v.push(self.matched.sink);
        }
        v
    }
    fn role_of(&self, op: OperationId) -> Option<StreamRole> {
        if op == self.source_op {
            Some(StreamRole::Source)
        } else if op == self.sink_op {
            Some(StreamRole::Sink)
        } else {
            None
        }
    }
}

#[derive(Clone, Debug)]
enum MRv {
    Pending(MPending),
    Active(MActive),
}

#[derive(Clone, Debug)]
enum MSource {
    Available {
        source: Address,
        node: NodeId,
        owner: Option<Address>,
    },
    Unavailable(Reason),
}

#[derive(Clone, Debug)]
struct MFence {
    incarnation: StreamIncarnation,
    endpoints: BTreeSet<Address>,
    old: Option<MActive>,
    held: Vec<(Caller, OpenArgs)>,
}

/// What a step should send.
#[derive(Default, Debug)]
struct Out {
    replies: Vec<(Address, RequestId, ReplyBody)>,
    retires: Vec<Address>,
    displaced: Vec<(Address, StreamIncarnation)>,
    gone_acks: Vec<(Address, GoneScope)>,
}

impl Out {
    fn reply(&mut self, caller: Caller, body: ReplyBody) {
        self.replies
            .push((caller.reply_to, caller.request_id, body));
    }
}

#[derive(Clone, Debug)]
struct Model {
    epoch: AuthorityEpoch,
    next_revision: u64,
    entries: BTreeMap<DataPath, Entry>,
    operations: BTreeMap<OperationId, OperationRecord>,
    reservations: BTreeMap<DataPath, Reservation>,
    /// Retirement obligations, in creation order.
    retirements: Vec<Address>,
    /// Displacement obligations (endpoint, incarnation, fenced path), one per endpoint.
    displacements: Vec<(Address, StreamIncarnation, Option<DataPath>)>,
    floors: BTreeMap<NodeId, u64>,
    /// Runtime sources of blob bindings (volatile; rebuilt from recovery records).
    sources: BTreeMap<DataPath, MSource>,
    /// Watched targets last reported unroutable (volatile; forgotten when unwatched).
    unroutable: BTreeSet<Address>,
    streams: BTreeMap<DataPath, MRv>,
    fences: BTreeMap<DataPath, MFence>,
}

/// What `ActorSources` rebuilds from a recovery record.
fn recovered_source(recovery: &SourceRecovery) -> MSource {
    match recovery {
        SourceRecovery::Actor { actor, node, owner } => MSource::Available {
            source: *actor,
            node: *node,
            owner: *owner,
        },
        SourceRecovery::File { path } => MSource::Unavailable(Reason::new(format!(
            "no file source recovery for {}",
            path.as_str()
        ))),
    }
}

fn receipt(r: Revision) -> MutationReceipt {
    MutationReceipt { revision: r }
}

impl Model {
    /// A fresh store after its first recovery (epoch 1).
    fn new() -> Self {
        Model {
            epoch: AuthorityEpoch(1),
            next_revision: 1,
            entries: BTreeMap::new(),
            operations: BTreeMap::new(),
            reservations: BTreeMap::new(),
            retirements: Vec::new(),
            displacements: Vec::new(),
            floors: BTreeMap::new(),
            sources: BTreeMap::new(),
            unroutable: BTreeSet::new(),
            streams: BTreeMap::new(),
            fences: BTreeMap::new(),
        }
    }

    fn alloc(&mut self) -> Revision {
        let r = Revision(self.next_revision);
        self.next_revision += 1;
        r
    }

    fn is_gone(&self, a: &Address) -> bool {
        self.floors.get(&a.node).is_some_and(|f| a.incarnation < *f)
    }

    /// SPEC §4.3 replay check: `Some(answer)` if the id is known.
    fn replay(
        &self,
        op: OperationId,
        key: &RequestKey,
    ) -> Option<Result<Revision, NamespaceError>> {
        let record = self.operations.get(&op)?;
        if record.key != *key {
            return Some(Err(NamespaceError::OperationConflict(op)));
        }
        Some(match &record.outcome {
            Outcome::Committed(r) => Ok(*r),
            Outcome::Rejected(x) => Err(x.error()),
            Outcome::Reserved => Err(NamespaceError::OperationConflict(op)),
        })
    }

    /// A sticky rejection.
    fn reject(
        &mut self,
        op: OperationId,
        key: RequestKey,
        kind: RejectionKind,
        path: &DataPath,
    ) -> NamespaceError {
        let rejection = Rejection {
            kind,
            path: path.clone(),
        };
        let error = rejection.error();
        self.operations.insert(
            op,
            OperationRecord {
                key,
                outcome: Outcome::Rejected(rejection),
            },
        );
        error
    }

    fn commit_op(&mut self, op: OperationId, key: RequestKey, r: Revision) {
        self.operations.insert(
            op,
            OperationRecord {
                key,
                outcome: Outcome::Committed(r),
            },
        );
    }

    /// The live runtime source of the blob at `path`, if it is available.
    fn blob_source(&self, path: &DataPath) -> Option<Address> {
        match self.sources.get(path) {
            Some(MSource::Available { source, .. }) => Some(*source),
            _ => None,
        }
    }

    /// A retirement obligation toward a source whose node already reported it gone (a node
    /// floor) would be complete at birth: none is created.
    fn queue_retire(&mut self, source: Address, out: &mut Out) {
        if self.is_gone(&source) {
            return;
        }
        if !self.retirements.contains(&source) {
            self.retirements.push(source);
        }
        out.retires.push(source);
    }

    /// Whether `endpoint` still owes an acknowledgement for `inc`.
    fn is_displacing(&self, endpoint: Address, inc: StreamIncarnation) -> bool {
        self.displacements
            .iter()
            .any(|(e, i, _)| *e == endpoint && *i == inc)
    }

    fn queue_displace(
        &mut self,
        endpoint: Address,
        inc: StreamIncarnation,
        fence: Option<DataPath>,
        out: &mut Out,
    ) {
        if self.is_displacing(endpoint, inc) || self.is_gone(&endpoint) {
            return;
        }
        self.displacements.push((endpoint, inc, fence));
        out.displaced.push((endpoint, inc));
    }

    /// SPEC §4.6.1: a fresh Register displaces the runtime stream at `path`.
    fn displace_runtime(&mut self, path: &DataPath, out: &mut Out) {
        match self.streams.remove(path) {
            None => {}
            Some(MRv::Pending(p)) => out.reply(
                p.caller,
                ReplyBody::StreamOpened(Err(NamespaceError::PathReplaced(path.clone()))),
            ),
            Some(MRv::Active(a)) => {
                for e in a.endpoints() {
                    self.queue_displace(e, a.matched.incarnation, None, out);
                }
            }
        }
    }

    fn call(&mut self, caller: Caller, request: DirectoryRequest, out: &mut Out) {
        match request {
            DirectoryRequest::Register {
                path,
                source,
                source_node,
                length,
                recovery,
                operation,
                reservation,
            } => {
                let r = self.register(
                    path,
                    (source, source_node),
                    length,
                    recovery,
                    operation,
                    reservation,
                    out,
                );
                out.reply(caller, ReplyBody::Registered(r.map(receipt)));
            }
            DirectoryRequest::Resolve { path } => {
                let r = self.resolve(&path);
                out.reply(caller, ReplyBody::Resolved(r));
            }
            DirectoryRequest::Lookup { path } => {
                let r = self.lookup(&path);
                out.reply(caller, ReplyBody::LookedUp(r));
            }
            DirectoryRequest::ReserveBlob {
                path,
                operation,
                owner,
            } => {
                let r = self.reserve(path, operation, owner);
                out.reply(caller, ReplyBody::BlobReserved(r));
            }
            DirectoryRequest::ReleaseBlobReservation { path, operation } => {
                let r = self.release(path, operation);
                out.reply(caller, ReplyBody::BlobReservationReleased(r));
            }
            DirectoryRequest::Unregister {
                path,
                expected_revision,
                operation,
            } => {
                let r = self.unregister(path, expected_revision, operation, out);
                out.reply(caller, ReplyBody::Unregistered(r.map(receipt)));
            }
            DirectoryRequest::Rename {
                source,
                destination,
                replace,
                operation,
            } => {
                let r = self.rename(source, destination, replace, operation, out);
                out.reply(caller, ReplyBody::Renamed(r.map(receipt)));
            }
            DirectoryRequest::OpenStream {
                path,
                role,
                descriptor,
                endpoint,
                replace,
                ensure,
                expected_revision,
                operation,
            } => {
                let args = OpenArgs {
                    path,
                    role,
                    descriptor,
                    endpoint,
                    replace,
                    ensure,
                    expected: expected_revision,
                    op: operation,
                };
                self.open(caller, args, out);
            }
            DirectoryRequest::CancelStream { path, operation } => {
                let r = self.cancel(path, operation, out);
                out.reply(caller, ReplyBody::StreamCancelled(r));
            }
            DirectoryRequest::CloseStream { path, incarnation } => {
                let r = self.close(path, incarnation);
                out.reply(caller, ReplyBody::StreamClosed(r));
            }
        }
    }

    /// SPEC §4.4 Register with Q1 (no displacement on replay), Q4 (durable reservations) and
    /// node floors.
    #[allow(clippy::too_many_arguments)]
    fn register(
        &mut self,
        path: DataPath,
        (source, source_node): (Address, NodeId),
        length: u64,
        recovery: SourceRecovery,
        op: OperationId,
        reservation: Option<OperationId>,
        out: &mut Out,
    ) -> Result<Revision, NamespaceError> {
        let key = RequestKey::Register {
            path: path.clone(),
            length,
            recovery: recovery.clone(),
        };
        if let Some(answer) = self.replay(op, &key) {
            return answer;
        }
        if self.is_gone(&source) {
            return Err(NamespaceError::PathReplaced(path));
        }
        match self.reservations.get(&path) {
            Some(res) if reservation != Some(res.operation) => {
                return Err(self.reject(op, key, RejectionKind::PathExists, &path));
            }
            None if reservation.is_some() => {
                return Err(self.reject(op, key, RejectionKind::PathReplaced, &path));
            }
            _ => {}
        }
        let r = self.alloc();
        let retired = self.blob_source(&path).filter(|a| *a != source);
        self.reservations.remove(&path);
        let owner = match &recovery {
            SourceRecovery::Actor { owner, .. } => *owner,
            SourceRecovery::File { .. } => None,
        };
        self.sources.insert(
            path.clone(),
            MSource::Available {
                source,
                node: source_node,
                owner,
            },
        );
        self.entries.insert(
            path.clone(),
            Entry::Blob {
                length,
                revision: r,
                recovery,
            },
        );
        self.commit_op(op, key, r);
        if let Some(a) = retired {
            self.queue_retire(a, out);
        }
        self.displace_runtime(&path, out);
        Ok(r)
    }

    fn resolve(&self, path: &DataPath) -> Result<BlobBinding, NamespaceError> {
        match self.entries.get(path) {
            Some(Entry::Stream { .. }) => Err(NamespaceError::WrongEntryType {
                path: path.clone(),
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            }),
            None => Err(NamespaceError::PathNotFound(path.clone())),
            Some(Entry::Blob {
                length, revision, ..
            }) => match self.sources.get(path) {
                Some(MSource::Available {
                    source,
                    node,
                    owner,
                }) => Ok(BlobBinding {
                    source: *source,
                    source_node: *node,
                    owner: *owner,
                    length: *length,
                    revision: *revision,
                }),
                Some(MSource::Unavailable(reason)) => {
                    Err(NamespaceError::SourceRecovery(reason.clone()))
                }
                None => unreachable!("every blob has a runtime source"),
            },
        }
    }

    fn lookup(&self, path: &DataPath) -> Result<NamespaceNode, NamespaceError> {
        if self.reservations.contains_key(path) {
            return Err(NamespaceError::PathExists(path.clone()));
        }
        match self.entries.get(path) {
            None => Err(NamespaceError::PathNotFound(path.clone())),
            Some(Entry::Blob { revision, .. }) => Ok(NamespaceNode {
                kind: EntryKind::Blob,
                revision: *revision,
                active: false,
            }),
            Some(Entry::Stream { revision }) => Ok(NamespaceNode {
                kind: EntryKind::Stream,
                revision: *revision,
                active: self.streams.contains_key(path),
            }),
        }
    }

    /// ARCHITECTURE "Reservations": durable, op-logged, sticky rejections.
    fn reserve(
        &mut self,
        path: DataPath,
        op: OperationId,
        owner: Address,
    ) -> Result<(), NamespaceError> {
        let key = RequestKey::Reserve { path: path.clone() };
        if let Some(record) = self.operations.get(&op) {
            if record.key != key {
                return Err(NamespaceError::OperationConflict(op));
            }
            return match &record.outcome {
                Outcome::Reserved => Ok(()),
                Outcome::Rejected(x) => Err(x.error()),
                Outcome::Committed(_) => Err(NamespaceError::OperationConflict(op)),
            };
        }
        if self.is_gone(&owner) {
            return Err(NamespaceError::PathReplaced(path));
        }
        if self.entries.contains_key(&path) || self.reservations.contains_key(&path) {
            return Err(self.reject(op, key, RejectionKind::PathExists, &path));
        }
        self.reservations.insert(
            path,
            Reservation {
                operation: op,
                owner,
            },
        );
        self.operations.insert(
            op,
            OperationRecord {
                key,
                outcome: Outcome::Reserved,
            },
        );
        Ok(())
    }

    fn release(&mut self, path: DataPath, op: OperationId) -> Result<(), NamespaceError> {
        let key = RequestKey::Reserve { path: path.clone() };
        match self.operations.get(&op) {
            None => {
                self.reject(op, key, RejectionKind::PathReplaced, &path);
                Ok(())
            }
            Some(record) if record.key != key => Err(NamespaceError::OperationConflict(op)),
            Some(_) => {
                if self
                    .reservations
                    .get(&path)
                    .is_some_and(|r| r.operation == op)
                {
                    self.reservations.remove(&path);
                }
                Ok(())
            }
        }
    }

    /// SPEC §4.4 Unregister with Q2 (replay first) and Q19 (compare-and-delete: a sticky
    /// PathReplaced when the entry has another revision).
    fn unregister(
        &mut self,
        path: DataPath,
        expected: Option<Revision>,
        op: OperationId,
        out: &mut Out,
    ) -> Result<Revision, NamespaceError> {
        let key = RequestKey::Unregister {
            path: path.clone(),
            expected_revision: expected,
        };
        if let Some(answer) = self.replay(op, &key) {
            return answer;
        }
        if self.streams.contains_key(&path) {
            // Every refusal is sticky (ARCHITECTURE.md), this one included.
            let live = RejectionKind::WrongEntryType {
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            };
            return Err(self.reject(op, key, live, &path));
        }
        if self.reservations.contains_key(&path) {
            return Err(self.reject(op, key, RejectionKind::PathExists, &path));
        }
        let Some(entry) = self.entries.get(&path) else {
            return Err(self.reject(op, key, RejectionKind::PathNotFound, &path));
        };
        if expected.is_some_and(|e| e != entry.revision()) {
            return Err(self.reject(op, key, RejectionKind::PathReplaced, &path));
        }
        let r = self.alloc();
        let retired = self.blob_source(&path);
        self.entries.remove(&path);
        self.sources.remove(&path);
        self.commit_op(op, key, r);
        if let Some(a) = retired {
            self.queue_retire(a, out);
        }
        Ok(r)
    }

    fn rename(
        &mut self,
        src: DataPath,
        dst: DataPath,
        replace: bool,
        op: OperationId,
        out: &mut Out,
    ) -> Result<Revision, NamespaceError> {
        let key = RequestKey::Rename {
            source: src.clone(),
            destination: dst.clone(),
            replace,
        };
        if let Some(answer) = self.replay(op, &key) {
            return answer;
        }
        if !self.entries.contains_key(&src) {
            return Err(self.reject(op, key, RejectionKind::PathNotFound, &src));
        }
        for p in [&src, &dst] {
            if self.reservations.contains_key(p) {
                return Err(self.reject(op, key, RejectionKind::PathExists, p));
            }
        }
        for p in [&src, &dst] {
            if self.streams.contains_key(p) {
                return Err(self.reject(op, key, RejectionKind::StreamActive, p));
            }
        }
        if src != dst && self.entries.contains_key(&dst) && !replace {
            return Err(self.reject(op, key, RejectionKind::PathExists, &dst));
        }
        let r = self.alloc();
        let retired = if src != dst {
            self.blob_source(&dst)
        } else {
            None
        };
        let moved = self.entries.remove(&src).unwrap();
        self.entries.remove(&dst);
        if src != dst {
            self.sources.remove(&dst);
            if let Some(source) = self.sources.remove(&src) {
                self.sources.insert(dst.clone(), source);
            }
        }
        let moved = match moved {
            Entry::Blob {
                length, recovery, ..
            } => Entry::Blob {
                length,
                revision: r,
                recovery,
            },
            Entry::Stream { .. } => Entry::Stream { revision: r },
        };
        self.entries.insert(dst, moved);
        self.commit_op(op, key, r);
        if let Some(a) = retired {
            self.queue_retire(a, out);
        }
        Ok(r)
    }

    fn is_current(&self, path: &DataPath, op: OperationId) -> bool {
        match self.streams.get(path) {
            Some(MRv::Pending(p)) => p.op == op,
            Some(MRv::Active(a)) => a.role_of(op).is_some(),
            None => false,
        }
    }

    /// SPEC §4.6 with Q3/Q18 (own retries recognised before the expected-revision check),
    /// fences (§4.6.2) and node floors.
    fn open(&mut self, caller: Caller, args: OpenArgs, out: &mut Out) {
        let path = args.path.clone();
        let opened = |r: Result<StreamMatch, NamespaceError>| ReplyBody::StreamOpened(r);
        let key = RequestKey::BindStream { path: path.clone() };
        // 0. An id used for another request conflicts at once, even on a fenced path.
        if self
            .operations
            .get(&args.op)
            .is_some_and(|record| record.key != key)
        {
            out.reply(
                caller,
                opened(Err(NamespaceError::OperationConflict(args.op))),
            );
            return;
        }
        // 1. Fence hold.
        if let Some(fence) = self.fences.get_mut(&path) {
            if let Some(old) = &fence.old
                && let Some(role) = old.role_of(args.op)
            {
                let ok = role == args.role && old.matched.endpoint(role) == args.endpoint;
                let body = if ok {
                    opened(Ok(old.matched.clone()))
                } else {
                    opened(Err(NamespaceError::OperationConflict(args.op)))
                };
                out.reply(caller, body);
                return;
            }
            if let Some(slot) = fence.held.iter_mut().find(|(_, h)| {
                h.op == args.op && h.role == args.role && h.endpoint == args.endpoint
            }) {
                *slot = (caller, args);
            } else if fence.held.len() >= FENCE_HELD_OPENS_MAX {
                let full = RejectionKind::LimitReached(Limit::FenceHeldOpens);
                let error = if self.operations.contains_key(&args.op) {
                    NamespaceError::LimitReached(Limit::FenceHeldOpens)
                } else {
                    self.reject(args.op, key, full, &path)
                };
                out.reply(caller, opened(Err(error)));
            } else {
                fence.held.push((caller, args));
            }
            return;
        }
        // 2. Replay.
        if let Some(record) = self.operations.get(&args.op) {
            if record.key != key {
                out.reply(
                    caller,
                    opened(Err(NamespaceError::OperationConflict(args.op))),
                );
                return;
            }
            match &record.outcome {
                Outcome::Rejected(x) => {
                    out.reply(caller, opened(Err(x.error())));
                    return;
                }
                Outcome::Committed(r) => {
                    if !self.is_current(&path, args.op) {
                        let incarnation = StreamIncarnation {
                            epoch: self.epoch,
                            revision: *r,
                        };
                        out.reply(
                            caller,
                            opened(Err(NamespaceError::StaleIncarnation {
                                path: path.clone(),
                                incarnation,
                            })),
                        );
                        return;
                    }
                }
                Outcome::Reserved => unreachable!("a reserve never has a BindStream key"),
            }
        }
        // Node floors: a late open from an ended incarnation.
        if self.is_gone(&args.endpoint) {
            out.reply(caller, opened(Err(NamespaceError::PathReplaced(path))));
            return;
        }
        // 3. Own pending / active retry (Q3, Q18).
        match self.streams.get_mut(&path) {
            Some(MRv::Pending(p)) if p.op == args.op => {
                if p.role != args.role || p.endpoint != args.endpoint {
                    out.reply(
                        caller,
                        opened(Err(NamespaceError::OperationConflict(args.op))),
                    );
                } else {
                    p.caller = caller;
                }
                return;
            }
            Some(MRv::Active(a)) => {
                if let Some(role) = a.role_of(args.op) {
                    let ok = role == args.role && a.matched.endpoint(role) == args.endpoint;
                    let body = if ok {
                        opened(Ok(a.matched.clone()))
                    } else {
                        opened(Err(NamespaceError::OperationConflict(args.op)))
                    };
                    out.reply(caller, body);
                    return;
                }
            }
            _ => {}
        }
        // 4. Expected revision.
        if !args.ensure {
            match self.entries.get(&path) {
                None => {
                    let e = self.reject(args.op, key, RejectionKind::PathNotFound, &path);
                    out.reply(caller, opened(Err(e)));
                    return;
                }
                Some(Entry::Blob { .. }) => {
                    let wrong = RejectionKind::WrongEntryType {
                        expected: EntryKind::Stream,
                        found: EntryKind::Blob,
                    };
                    let e = self.reject(args.op, key, wrong, &path);
                    out.reply(caller, opened(Err(e)));
                    return;
                }
                Some(Entry::Stream { revision }) => {
                    let from_pending = args.expected.is_some()
                        && matches!(self.streams.get(&path),
                            Some(MRv::Pending(p)) if p.opened_from == args.expected);
                    if args.expected != Some(*revision) && !from_pending {
                        let e = self.reject(args.op, key, RejectionKind::PathReplaced, &path);
                        out.reply(caller, opened(Err(e)));
                        return;
                    }
                }
            }
        }
        // 5. Replace an active rendezvous: fence it.
        if args.replace {
            if let Some(MRv::Active(_)) = self.streams.get(&path) {
                let Some(MRv::Active(a)) = self.streams.remove(&path) else {
                    unreachable!()
                };
                let inc = a.matched.incarnation;
                let endpoints = a.endpoints();
                for e in &endpoints {
                    self.queue_displace(*e, inc, Some(path.clone()), out);
                }
                self.fences.insert(
                    path,
                    MFence {
                        incarnation: inc,
                        endpoints: endpoints.into_iter().collect(),
                        old: Some(a),
                        held: vec![(caller, args)],
                    },
                );
                return;
            }
            // 6. Replace a pending of the same role.
            if matches!(self.streams.get(&path), Some(MRv::Pending(p)) if p.role == args.role) {
                let Some(MRv::Pending(p)) = self.streams.remove(&path) else {
                    unreachable!()
                };
                out.reply(
                    p.caller,
                    opened(Err(NamespaceError::PathReplaced(path.clone()))),
                );
            }
        }
        // 7. Match, or refuse a duplicate role.
        match self.streams.get(&path) {
            Some(MRv::Pending(p)) if p.role == args.role => {
                let duplicate = RejectionKind::DuplicateStreamRole(args.role);
                let e = self.reject(args.op, key, duplicate, &path);
                out.reply(caller, opened(Err(e)));
                return;
            }
            Some(MRv::Pending(_)) => {
                let Some(MRv::Pending(p)) = self.streams.remove(&path) else {
                    unreachable!()
                };
                self.commit_op(args.op, key, p.revision);
                let (source, source_descriptor, source_op, sink, sink_descriptor, sink_op) =
                    if p.role == StreamRole::Source {
                        (
                            p.endpoint,
                            p.descriptor.clone(),
                            p.op,
                            args.endpoint,
                            args.descriptor.clone(),
                            args.op,
                        )
                    } else {
                        (
                            args.endpoint,
                            args.descriptor.clone(),
                            args.op,
                            p.endpoint,
                            p.descriptor.clone(),
                            p.op,
                        )
                    };
                let matched = StreamMatch {
                    incarnation: StreamIncarnation {
                        epoch: self.epoch,
                        revision: p.revision,
                    },
                    source,
                    source_descriptor,
                    sink,
                    sink_descriptor,
                    revision: p.revision,
                };
                out.reply(p.caller, opened(Ok(matched.clone())));
                out.reply(caller, opened(Ok(matched.clone())));
                self.streams.insert(
                    path,
                    MRv::Active(MActive {
                        matched,
                        source_op,
                        sink_op,
                    }),
                );
                return;
            }
            Some(MRv::Active(_)) => {
                let duplicate = RejectionKind::DuplicateStreamRole(args.role);
                let e = self.reject(args.op, key, duplicate, &path);
                out.reply(caller, opened(Err(e)));
                return;
            }
            None => {}
        }
        // 8. A blob is only replaced when asked.
        if matches!(self.entries.get(&path), Some(Entry::Blob { .. })) && !args.replace {
            let wrong = RejectionKind::WrongEntryType {
                expected: EntryKind::Stream,
                found: EntryKind::Blob,
            };
            let e = self.reject(args.op, key, wrong, &path);
            out.reply(caller, opened(Err(e)));
            return;
        }
        // 9. Bind.
        if self.reservations.contains_key(&path) {
            let e = self.reject(args.op, key, RejectionKind::PathExists, &path);
            out.reply(caller, opened(Err(e)));
            return;
        }
        let r = self.alloc();
        let retired = self.blob_source(&path);
        self.sources.remove(&path);
        self.entries
            .insert(path.clone(), Entry::Stream { revision: r });
        self.commit_op(args.op, key, r);
        if let Some(a) = retired {
            self.queue_retire(a, out);
        }
        self.streams.insert(
            path,
            MRv::Pending(MPending {
                role: args.role,
                endpoint: args.endpoint,
                descriptor: args.descriptor,
                op: args.op,
                caller,
                revision: r,
                opened_from: if args.ensure { None } else { args.expected },
            }),
        );
    }

    /// SPEC §4.7 CancelStream with Q11 and the OperationConflict decision.
    fn cancel(
        &mut self,
        path: DataPath,
        op: OperationId,
        out: &mut Out,
    ) -> Result<(), NamespaceError> {
        let key = RequestKey::BindStream { path: path.clone() };
        match self.operations.get(&op) {
            None => {
                self.reject(op, key, RejectionKind::PathReplaced, &path);
            }
            Some(record) if record.key != key => {
                return Err(NamespaceError::OperationConflict(op));
            }
            Some(_) => {}
        }
        match self.streams.get(&path) {
            Some(MRv::Pending(p)) if p.op == op => {
                self.streams.remove(&path);
            }
            Some(MRv::Active(a)) if a.role_of(op).is_some() => {
                let role = a.role_of(op).unwrap();
                let peer = a.matched.endpoint(role.peer());
                let inc = a.matched.incarnation;
                self.streams.remove(&path);
                self.queue_displace(peer, inc, None, out);
            }
            _ => {}
        }
        if let Some(fence) = self.fences.get_mut(&path) {
            fence.held.retain(|(_, h)| h.op != op);
        }
        Ok(())
    }

    /// SPEC §4.7 CloseStream: ends the active incarnation; a duplicate close of the node's
    /// last incarnation in this epoch (no runtime entry) is Ok; anything else is stale.
    fn close(&mut self, path: DataPath, inc: StreamIncarnation) -> Result<(), NamespaceError> {
        let closed_here = inc.epoch == self.epoch
            && self.entries.get(&path)
                == Some(&Entry::Stream {
                    revision: inc.revision,
                });
        match self.streams.get(&path) {
            Some(MRv::Active(a)) if a.matched.incarnation == inc => {
                self.streams.remove(&path);
                Ok(())
            }
            None if closed_here => Ok(()),
            _ => Err(NamespaceError::StaleIncarnation {
                path,
                incarnation: inc,
            }),
        }
    }

    /// Resume every fence whose endpoints no longer owe a displacement for its incarnation.
    fn resume_fences(&mut self, out: &mut Out) {
        let done: Vec<DataPath> = self
            .fences
            .iter()
            .filter(|(_, f)| {
                f.endpoints
                    .iter()
                    .all(|e| !self.is_displacing(*e, f.incarnation))
            })
            .map(|(p, _)| p.clone())
            .collect();
        for p in done {
            let fence = self.fences.remove(&p).unwrap();
            for (caller, args) in fence.held {
                self.open(caller, args, out);
            }
        }
    }

    fn source_retired(&mut self, source: Address) {
        self.retirements.retain(|a| *a != source);
        self.forget_unwatched();
    }

    fn stream_displaced(&mut self, endpoint: Address, inc: StreamIncarnation, out: &mut Out) {
        if self.is_displacing(endpoint, inc) {
            self.displacements
                .retain(|(e, i, _)| (*e, *i) != (endpoint, inc));
            self.forget_unwatched();
            self.resume_fences(out);
        }
    }

    fn gone(&mut self, scope: GoneScope, reply_to: Address, out: &mut Out) {
        if let GoneScope::NodeBefore { node, incarnation } = scope {
            let floor = self.floors.entry(node).or_insert(0);
            *floor = (*floor).max(incarnation);
        }
        self.retirements.retain(|a| !scope.covers(a));
        self.displacements.retain(|(e, _, _)| !scope.covers(e));
        self.forget_unwatched();
        self.reservations.retain(|_, r| !scope.covers(&r.owner));
        let paths: Vec<DataPath> = self.streams.keys().cloned().collect();
        for path in paths {
            match self.streams.get(&path) {
                Some(MRv::Pending(p)) if scope.covers(&p.endpoint) => {
                    let caller = p.caller;
                    self.streams.remove(&path);
                    out.reply(
                        caller,
                        ReplyBody::StreamOpened(Err(NamespaceError::PathReplaced(path.clone()))),
                    );
                }
                Some(MRv::Active(a))
                    if scope.covers(&a.matched.source) || scope.covers(&a.matched.sink) =>
                {
                    let a = a.clone();
                    self.streams.remove(&path);
                    for e in a.endpoints() {
                        if !scope.covers(&e) {
                            self.queue_displace(e, a.matched.incarnation, None, out);
                        }
                    }
                }
                _ => {}
            }
        }
        // Held opens from covered endpoints are dropped; their callers hear PathReplaced, like
        // the callers of ended pending rendezvous (ARCHITECTURE "Addresses and gone reports"
        // says "drops"; answering is what a waiting caller needs).
        for (path, fence) in self.fences.iter_mut() {
            fence.held.retain(|(caller, h)| {
                if scope.covers(&h.endpoint) {
                    out.replies.push((
                        caller.reply_to,
                        caller.request_id,
                        ReplyBody::StreamOpened(Err(NamespaceError::PathReplaced(path.clone()))),
                    ));
                    false
                } else {
                    true
                }
            });
        }
        out.gone_acks.push((reply_to, scope));
        self.resume_fences(out);
    }

    /// One retry pass: a frame per obligation toward a target not reported unroutable (there
    /// are fewer obligations than the batch bound here), then fences.
    fn retry_pass(&mut self, out: &mut Out) {
        assert!(self.retirements.len() + self.displacements.len() <= RETRY_BATCH_MAX);
        let unroutable = &self.unroutable;
        out.retires.extend(
            self.retirements
                .iter()
                .filter(|a| !unroutable.contains(a))
                .copied(),
        );
        out.displaced.extend(
            self.displacements
                .iter()
                .filter(|(e, _, _)| !unroutable.contains(e))
                .map(|(e, i, _)| (*e, *i)),
        );
        self.resume_fences(out);
    }

    /// A route report for a watched target: "routable" wakes exactly that target's obligations
    /// (SPEC §4.8 route wake, ARCHITECTURE "Obligations").
    fn route(&mut self, target: Address, routable: bool, out: &mut Out) {
        if !self.obligation_targets().contains(&target) {
            return;
        }
        if !routable {
            self.unroutable.insert(target);
            return;
        }
        self.unroutable.remove(&target);
        if self.retirements.contains(&target) {
            out.retires.push(target);
        }
        out.displaced.extend(
            self.displacements
                .iter()
                .filter(|(e, _, _)| *e == target)
                .map(|(e, i, _)| (*e, *i)),
        );
        self.resume_fences(out);
    }

    /// Routability of a target is forgotten the moment its last obligation completes (it is
    /// unwatched; a later obligation starts with unknown routability, which counts as
    /// routable).
    fn forget_unwatched(&mut self) {
        let targets = self.obligation_targets();
        self.unroutable.retain(|a| targets.contains(a));
    }

    /// Crash and recovery: volatile state lost, fences rebuilt from fenced displacements
    /// whose node still has the displaced revision, new epoch, one retry pass.
    fn restart(&mut self, out: &mut Out) {
        self.epoch = AuthorityEpoch(self.epoch.0 + 1);
        self.unroutable.clear();
        self.streams.clear();
        self.sources = self
            .entries
            .iter()
            .filter_map(|(p, e)| match e {
                Entry::Blob { recovery, .. } => Some((p.clone(), recovered_source(recovery))),
                Entry::Stream { .. } => None,
            })
            .collect();
        self.fences.clear();
        for (e, inc, fence) in &self.displacements {
            let Some(p) = fence else { continue };
            if self.entries.get(p)
                != Some(&Entry::Stream {
                    revision: inc.revision,
                })
            {
                continue;
            }
            match self.fences.get_mut(p) {
                None => {
                    self.fences.insert(
                        p.clone(),
                        MFence {
                            incarnation: *inc,
                            endpoints: [*e].into_iter().collect(),
                            old: None,
                            held: Vec::new(),
                        },
                    );
                }
                Some(f) if f.incarnation == *inc => {
                    f.endpoints.insert(*e);
                }
                Some(_) => {}
            }
        }
        self.retry_pass(out);
    }

    fn obligation_targets(&self) -> BTreeSet<Address> {
        self.retirements
            .iter()
            .copied()
            .chain(self.displacements.iter().map(|(e, _, _)| *e))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------------

/// Observations the workload draws on: revisions, incarnations and notices seen so far.
#[derive(Default)]
struct Seen {
    history: Vec<DirectoryRequest>,
    requests: BTreeMap<RequestId, DirectoryRequest>,
    revisions: Vec<Revision>,
    incarnations: Vec<StreamIncarnation>,
    retires: Vec<Address>,
    displaced: Vec<(Address, StreamIncarnation)>,
    watched: BTreeSet<Address>,
    next_request: u64,
}

impl Seen {
    fn recent_revision(&self, i: u8) -> Option<Revision> {
        if self.revisions.is_empty() {
            return None;
        }
        let n = self.revisions.len();
        let back = usize::from(i) % n.min(4);
        Some(self.revisions[n - 1 - back])
    }

    fn observe_reply(&mut self, body: &ReplyBody) {
        match body {
            ReplyBody::Registered(Ok(r))
            | ReplyBody::Unregistered(Ok(r))
            | ReplyBody::Renamed(Ok(r)) => self.revisions.push(r.revision),
            ReplyBody::LookedUp(Ok(n)) => self.revisions.push(n.revision),
            ReplyBody::Resolved(Ok(b)) => self.revisions.push(b.revision),
            ReplyBody::StreamOpened(Ok(m)) => {
                self.revisions.push(m.revision);
                if !self.incarnations.contains(&m.incarnation) {
                    self.incarnations.push(m.incarnation);
                }
            }
            _ => {}
        }
    }
}

/// What a step actually sent, in comparable form.
#[derive(Debug, PartialEq, Eq)]
struct Sent {
    replies: Vec<(Address, RequestId, ReplyBody)>,
    retires: Vec<Address>,
    displaced: Vec<(Address, StreamIncarnation)>,
    gone_acks: Vec<(Address, GoneScope)>,
}

fn normalise(out: Out) -> Sent {
    let mut s = Sent {
        replies: out.replies,
        retires: out.retires,
        displaced: out.displaced,
        gone_acks: out.gone_acks,
    };
    s.replies.sort_by_key(|(to, id, _)| (*id, *to));
    s.retires.sort();
    s.displaced.sort();
    s.gone_acks.sort();
    s
}

fn collect(effects: &[Effect], epoch: AuthorityEpoch) -> Out {
    let mut out = Out::default();
    for effect in effects {
        let Effect::Send { to, message } = effect else {
            continue;
        };
        match message {
            Message::Reply(DirectoryReply {
                request_id,
                epoch: e,
                body,
            }) => {
                assert_eq!(*e, epoch, "reply epoch");
                out.replies.push((*to, *request_id, body.clone()));
            }
            Message::Retire { reply_to } => {
                assert_eq!(*reply_to, DIRECTORY);
                out.retires.push(*to);
            }
            Message::Displaced {
                incarnation,
                reply_to,
            } => {
                assert_eq!(*reply_to, DIRECTORY);
                out.displaced.push((*to, *incarnation));
            }
            Message::GoneAcknowledged { scope } => out.gone_acks.push((*to, *scope)),
            other => panic!("unexpected send {other:?} to {to}"),
        }
    }
    out
}

/// Obligations as (key, fenced path), sorted by key.
type ObligationView = Vec<(ObligationKey, Option<DataPath>)>;

fn durable_obligations(d: &DurableState) -> ObligationView {
    let mut v: ObligationView = d
        .obligations_in_order()
        .map(|(key, fence)| (key, fence.cloned()))
        .collect();
    v.sort_by_key(|(key, _)| *key);
    v
}

fn model_obligations(m: &Model) -> ObligationView {
    let mut v: ObligationView = m
        .retirements
        .iter()
        .map(|a| (ObligationKey::Retire(*a), None))
        .chain(
            m.displacements
                .iter()
                .map(|(e, i, f)| (ObligationKey::Displace(*e, *i), f.clone())),
        )
        .collect();
    v.sort_by_key(|(key, _)| *key);
    v
}

fn check_state(d: &Dir, m: &Model, seen: &Seen, at: &dyn fmt::Display) {
    let durable = d.dir.durable();
    assert_eq!(durable.epoch(), m.epoch, "{at}: epoch");
    assert_eq!(
        durable.next_revision(),
        Revision(m.next_revision),
        "{at}: next revision"
    );
    let entries: BTreeMap<DataPath, Entry> = durable
        .entries()
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect();
    assert_eq!(&entries, &m.entries, "{at}: entries");
    let operations: BTreeMap<OperationId, OperationRecord> =
        durable.operations().map(|(o, r)| (*o, r.clone())).collect();
    assert_eq!(&operations, &m.operations, "{at}: operation table");
    let reservations: BTreeMap<DataPath, Reservation> = durable
        .reservations()
        .map(|(p, r)| (p.clone(), r.clone()))
        .collect();
    assert_eq!(&reservations, &m.reservations, "{at}: reservations");
    assert_eq!(
        durable_obligations(durable),
        model_obligations(m),
        "{at}: obligations"
    );
    let floors: BTreeMap<NodeId, u64> = durable.node_floors().map(|(n, f)| (*n, *f)).collect();
    assert_eq!(&floors, &m.floors, "{at}: node floors");
    let streams: Vec<(DataPath, bool)> = d
        .dir
        .rendezvous_all()
        .map(|(p, r)| (p.clone(), matches!(r, Rendezvous::Active(_))))
        .collect();
    let model_streams: Vec<(DataPath, bool)> = m
        .streams
        .iter()
        .map(|(p, r)| (p.clone(), matches!(r, MRv::Active(_))))
        .collect();
    assert_eq!(
        streams, model_streams,
        "{at}: runtime rendezvous (path, active)"
    );
    let fences: Vec<DataPath> = d.dir.fences().map(|(p, _)| p.clone()).collect();
    let model_fences: Vec<DataPath> = m.fences.keys().cloned().collect();
    assert_eq!(fences, model_fences, "{at}: fenced paths");
    assert_eq!(
        &seen.watched,
        &m.obligation_targets(),
        "{at}: watched routes = obligation targets"
    );
    if let Err(e) = d.dir.check_invariants() {
        panic!("{at}: invariants: {e}");
    }
}

/// The write-ahead barrier (SPEC S6–S8, DESIGN §3): walking a step's effects in order, every
/// send is justified by the durable state built from the records persisted before it, and the
/// step's records rebuild exactly the live durable state.
fn check_barrier(
    mut state: DurableState,
    effects: &[Effect],
    requests: &BTreeMap<RequestId, DirectoryRequest>,
    live: &DurableState,
) -> Result<(), String> {
    for (i, effect) in effects.iter().enumerate() {
        let Effect::Send { to, message } = effect else {
            if let Effect::Persist(record) = effect {
                state
                    .apply(record)
                    .map_err(|e| format!("effect {i}: persisted record refused: {e}"))?;
            }
            continue;
        };
        let ok = match message {
            Message::Retire { .. } => state.has_obligation(&ObligationKey::Retire(*to)),
            Message::Displaced { incarnation, .. } => state.is_displacing(*to, *incarnation),
            Message::GoneAcknowledged {
                scope: GoneScope::NodeBefore { node, incarnation },
            } => state.node_floor(*node) >= *incarnation,
            Message::Reply(reply) => reply_is_durable(&state, requests, reply),
            _ => true,
        };
        if !ok {
            return Err(format!(
                "effect {i}: {message:?} to {to} is sent before the state it acknowledges \
                 is persisted"
            ));
        }
    }
    if state != *live {
        return Err("the live durable state differs from the records it persisted".into());
    }
    Ok(())
}

fn reply_is_durable(
    state: &DurableState,
    requests: &BTreeMap<RequestId, DirectoryRequest>,
    reply: &DirectoryReply,
) -> bool {
    let Some(request) = requests.get(&reply.request_id) else {
        return false;
    };
    let Some(op) = request.operation() else {
        return true;
    };
    let outcome = state.operation(op).map(|r| &r.outcome);
    match &reply.body {
        ReplyBody::Registered(Ok(r))
        | ReplyBody::Unregistered(Ok(r))
        | ReplyBody::Renamed(Ok(r)) => outcome == Some(&Outcome::Committed(r.revision)),
        ReplyBody::StreamOpened(Ok(m)) => outcome == Some(&Outcome::Committed(m.revision)),
        ReplyBody::BlobReserved(Ok(())) => outcome == Some(&Outcome::Reserved),
        ReplyBody::StreamCancelled(Ok(())) | ReplyBody::BlobReservationReleased(Ok(())) => {
            outcome.is_some()
        }
        ReplyBody::Registered(Err(e))
        | ReplyBody::Unregistered(Err(e))
        | ReplyBody::Renamed(Err(e))
        | ReplyBody::BlobReserved(Err(e)) => match e {
            NamespaceError::PathExists(_)
            | NamespaceError::PathNotFound(_)
            | NamespaceError::StreamActive(_) => {
                matches!(outcome, Some(Outcome::Rejected(x)) if x.error() == *e)
            }
            _ => true,
        },
        _ => true,
    }
}

/// The concrete request of a request-shaped step.
fn request_of(step: &Step, seen: &Seen, epoch: AuthorityEpoch) -> Option<DirectoryRequest> {
    Some(match *step {
        Step::Register {
            path,
            op,
            long,
            file,
            reservation,
        } => {
            let source = source_of(op);
            let recovery = if file {
                SourceRecovery::File {
                    path: FileRef::new(format!("/data/{op}")).unwrap(),
                }
            } else {
                SourceRecovery::Actor {
                    actor: source,
                    node: source.node,
                    owner: recovery_owner(op),
                }
            };
            DirectoryRequest::Register {
                path: path.path(),
                source,
                source_node: source.node,
                length: if long { 20 } else { 10 },
                recovery,
                operation: oid(op),
                reservation: reservation.map(oid),
            }
        }
        Step::Resolve(path) => DirectoryRequest::Resolve { path: path.path() },
        Step::Lookup(path) => DirectoryRequest::Lookup { path: path.path() },
        Step::Reserve { path, op, owner: k } => DirectoryRequest::ReserveBlob {
            path: path.path(),
            operation: oid(op),
            owner: owner(k),
        },
        Step::Release { path, op } => DirectoryRequest::ReleaseBlobReservation {
            path: path.path(),
            operation: oid(op),
        },
        Step::Unregister { path, expected, op } => DirectoryRequest::Unregister {
            path: path.path(),
            expected_revision: match expected {
                Expect::None => None,
                Expect::Recent(i) => seen.recent_revision(i),
            },
            operation: oid(op),
        },
        Step::Rename {
            from,
            to,
            replace,
            op,
        } => DirectoryRequest::Rename {
            source: from.path(),
            destination: to.path(),
            replace,
            operation: oid(op),
        },
        Step::Open {
            path,
            role,
            endpoint: e,
            replace,
            ensure,
            expected,
            op,
        } => {
            let endpoint = endpoint(e);
            DirectoryRequest::OpenStream {
                path: path.path(),
                role,
                descriptor: descriptor_of(endpoint),
                endpoint,
                replace,
                ensure,
                expected_revision: match expected {
                    Expect::None => None,
                    Expect::Recent(i) => seen.recent_revision(i),
                },
                operation: oid(op),
            }
        }
        Step::Cancel { path, op } => DirectoryRequest::CancelStream {
            path: path.path(),
            operation: oid(op),
        },
        Step::Close { path, inc } => {
            let incarnation = match inc {
                IncPick::Seen(i) if !seen.incarnations.is_empty() => {
                    let n = seen.incarnations.len();
                    seen.incarnations[n - 1 - usize::from(i) % n]
                }
                IncPick::Seen(_) => StreamIncarnation {
                    epoch,
                    revision: Revision(1),
                },
                IncPick::Current(r) => StreamIncarnation {
                    epoch,
                    revision: Revision(u64::from(r)),
                },
            };
            DirectoryRequest::CloseStream {
                path: path.path(),
                incarnation,
            }
        }
        Step::Replay { back, .. } => {
            let n = seen.history.len();
            if n == 0 {
                return None;
            }
            seen.history[n - 1 - usize::from(back) % n].clone()
        }
        _ => return None,
    })
}

/// The model's retry pass covers every obligation in one batch; beyond the batch the
/// directory's rotation is not modelled.
fn within_batch(m: &Model) -> bool {
    m.retirements.len() + m.displacements.len() <= RETRY_BATCH_MAX
}

/// Runs `steps` (cut at [`STEPS_MAX`], numbers folded by [`Step::normalised`]) against a fresh
/// directory and the model; panics on the first disagreement.
pub fn run(steps: &[Step]) {
    let mut d = Dir::new();
    let mut m = Model::new();
    let mut seen = Seen {
        next_request: 1,
        ..Seen::default()
    };
    check_state(&d, &m, &seen, &"at boot");
    for (index, step) in steps.iter().take(STEPS_MAX).enumerate() {
        let step = &step.normalised();
        let mut expected = Out::default();
        let before = d.dir.durable().clone();
        let effects = match step {
            Step::Tick => {
                if !within_batch(&m) {
                    continue;
                }
                m.retry_pass(&mut expected);
                d.tick()
            }
            Step::Restart => {
                if !within_batch(&m) {
                    continue;
                }
                m.restart(&mut expected);
                seen.watched.clear();
                d.restart()
            }
            Step::SourceRetired(i) => {
                let source = if seen.retires.is_empty() {
                    source_of(*i % 6 + 1)
                } else {
                    seen.retires[usize::from(*i) % seen.retires.len()]
                };
                m.source_retired(source);
                d.deliver(Message::SourceRetired { source })
            }
            Step::StreamDisplaced(i) => {
                let (endpoint, incarnation) = if seen.displaced.is_empty() {
                    (
                        endpoint(*i),
                        StreamIncarnation {
                            epoch: m.epoch,
                            revision: Revision(1),
                        },
                    )
                } else {
                    seen.displaced[usize::from(*i) % seen.displaced.len()]
                };
                m.stream_displaced(endpoint, incarnation, &mut expected);
                d.deliver(Message::StreamDisplaced {
                    endpoint,
                    incarnation,
                })
            }
            Step::Route { target, routable } => {
                if seen.watched.is_empty() {
                    continue;
                }
                let watched: Vec<Address> = seen.watched.iter().copied().collect();
                let target = watched[usize::from(*target) % watched.len()];
                m.route(target, *routable, &mut expected);
                d.route(target, *routable)
            }
            Step::Gone(g) => {
                let scope = match *g {
                    Gone::Endpoint(e) => GoneScope::Address(endpoint(e)),
                    Gone::Source(op) => GoneScope::Address(source_of(op)),
                    Gone::Owner(k) => GoneScope::Address(owner(k)),
                    Gone::Node(n, incarnation) => GoneScope::NodeBefore {
                        node: NodeId(u64::from(n)),
                        incarnation,
                    },
                };
                m.gone(scope, HOST, &mut expected);
                d.deliver(Message::AddressGone {
                    scope,
                    reply_to: HOST,
                })
            }
            _ => {
                let Some(request) = request_of(step, &seen, m.epoch) else {
                    continue;
                };
                let reply_to = match step {
                    Step::Replay {
                        other_client: true, ..
                    } => CLIENT2,
                    _ => CLIENT,
                };
                let caller = Caller {
                    request_id: RequestId(seen.next_request),
                    reply_to,
                };
                seen.next_request += 1;
                seen.history.push(request.clone());
                seen.requests.insert(caller.request_id, request.clone());
                m.call(caller, request.clone(), &mut expected);
                d.deliver(Message::Call(DirectoryCall {
                    request_id: caller.request_id,
                    reply_to,
                    request,
                }))
            }
        };
        if let Err(e) = check_barrier(before, &effects, &seen.requests, d.dir.durable()) {
            panic!("step {index} ({step:?}): {e}");
        }
        let got = collect(&effects, m.epoch);
        for (_, _, body) in &got.replies {
            seen.observe_reply(body);
        }
        seen.retires.extend(got.retires.iter().copied());
        seen.displaced.extend(got.displaced.iter().copied());
        for effect in &effects {
            match effect {
                Effect::WatchRoute { target } => {
                    seen.watched.insert(*target);
                }
                Effect::UnwatchRoute { target } => {
                    seen.watched.remove(target);
                }
                _ => {}
            }
        }
        let (got, want) = (normalise(got), normalise(expected));
        assert_eq!(got, want, "sends of step {index} ({step:?})");
        check_state(&d, &m, &seen, &format!("after step {index} ({step:?})"));
    }
}

/// Drives `steps` (cut and folded as in [`run`]) against a directory alone, without the
/// model; returns the directory with its durable log (every `Persist` taken as durable).
pub fn drive(steps: &[Step]) -> Dir {
    let mut d = Dir::new();
    let mut seen = Seen {
        next_request: 1,
        ..Seen::default()
    };
    for step in steps.iter().take(STEPS_MAX) {
        let step = &step.normalised();
        let effects = match step {
            Step::Tick => d.tick(),
            Step::Restart => d.restart(),
            Step::SourceRetired(i) => {
                let source = if seen.retires.is_empty() {
                    source_of(*i % 6 + 1)
                } else {
                    seen.retires[usize::from(*i) % seen.retires.len()]
                };
                d.deliver(Message::SourceRetired { source })
            }
            Step::StreamDisplaced(i) => {
                let Some(&(endpoint, incarnation)) = seen
                    .displaced
                    .get(usize::from(*i) % seen.displaced.len().max(1))
                else {
                    continue;
                };
                d.deliver(Message::StreamDisplaced {
                    endpoint,
                    incarnation,
                })
            }
            Step::Route { target, routable } => {
                if seen.watched.is_empty() {
                    continue;
                }
                let watched: Vec<Address> = seen.watched.iter().copied().collect();
                let target = watched[usize::from(*target) % watched.len()];
                d.route(target, *routable)
            }
            Step::Gone(g) => {
                let scope = match *g {
                    Gone::Endpoint(e) => GoneScope::Address(endpoint(e)),
                    Gone::Source(op) => GoneScope::Address(source_of(op)),
                    Gone::Owner(k) => GoneScope::Address(owner(k)),
                    Gone::Node(n, incarnation) => GoneScope::NodeBefore {
                        node: NodeId(u64::from(n)),
                        incarnation,
                    },
                };
                d.deliver(Message::AddressGone {
                    scope,
                    reply_to: HOST,
                })
            }
            _ => {
                let Some(request) = request_of(step, &seen, d.dir.epoch()) else {
                    continue;
                };
                seen.history.push(request.clone());
                d.call_raw(request).1
            }
        };
        for effect in &effects {
            match effect {
                Effect::Send {
                    message: Message::Reply(reply),
                    ..
                } => seen.observe_reply(&reply.body),
                Effect::Send {
                    to,
                    message: Message::Retire { .. },
                } => seen.retires.push(*to),
                Effect::Send {
                    to,
                    message: Message::Displaced { incarnation, .. },
                } => seen.displaced.push((*to, *incarnation)),
                Effect::WatchRoute { target } => {
                    seen.watched.insert(*target);
                }
                Effect::UnwatchRoute { target } => {
                    seen.watched.remove(target);
                }
                _ => {}
            }
        }
    }
    d
}

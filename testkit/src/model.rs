//! The directory's reference model: an independent re-implementation written from SPEC.md
//! §3–§4, DESIGN.md §5 and ARCHITECTURE.md "Decisions". It shares no logic with
//! `core/src/directory`, only the vocabulary (ids, paths, wire messages, log records) in which
//! its state and predictions are compared with the directory's ([`crate::check`]).
//!
//! Decisions the model follows beyond SPEC §4 (each from ARCHITECTURE.md "Decisions" or the
//! commit that introduced it): Q1/Q2/Q3/Q11/Q18/Q19 as settled in DESIGN §5; durable, op-logged
//! reservations with sticky rejections and release tombstones; node incarnation floors (late
//! opens, registers and reserves from an ended incarnation get a non-sticky `PathReplaced`
//! after the replay check); no obligation toward an address already gone; displacement
//! obligations keyed by (endpoint, incarnation); an id reused for another request conflicts
//! even on a fenced path; `AddressGone` answers `PathReplaced` to the held opens it drops.
//! A blob whose runtime source belongs to an ended node incarnation is lost: Resolve answers
//! `BlobLost`, Lookup marks it `lost`.
//!
//! Retention (ARCHITECTURE "Retention of operation records"), restated here: an operation id
//! names its issuer (node, incarnation, lane) and a sequence number. It is *expired* once its
//! issuer's node incarnation is below the node's floor, or its sequence number is below the
//! horizon the issuer declared with `OperationsDone`; the horizon never passes an operation of
//! the issuer that is a live rendezvous, and only a caller on the issuer's node incarnation
//! may declare it. No record of an expired operation is kept unless it holds a reservation;
//! an expired operation without a record is refused `OperationExpired` before anything else.
//! A new operation id needs room in the operation and issuer tables (twice the room for a
//! cancel or a release), else `LimitReached` without a trace. Every other table has a limit
//! whose refusal is sticky (entries, obligations, rendezvous, fences, reservations, held
//! opens). After a restart, nothing changes in this respect.
//!
//! Not modelled: the retry pass's rotation beyond one batch. A retry pass (a tick, or the one
//! after a restart) asserts that no more than [`RETRY_BATCH_MAX`] obligations are open; see
//! [`crate::check::BeyondBatch`].

use std::collections::{BTreeMap, BTreeSet};

use dataplane_core::directory::DirectoryLimits;
use dataplane_core::error::{Limit, NamespaceError, Reason};
use dataplane_core::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::limits::RETRY_BATCH_MAX;
use dataplane_core::log::{
    Entry, OperationRecord, Outcome, Rejection, RejectionKind, RequestKey, Reservation,
};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    BlobBinding, Descriptor, DirectoryRequest, EntryKind, GoneScope, MutationReceipt,
    NamespaceNode, ReplyBody, SourceRecovery, StreamMatch, StreamRole,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub(crate) request_id: RequestId,
    pub(crate) reply_to: Address,
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
pub(crate) struct Out {
    pub(crate) replies: Vec<(Address, RequestId, ReplyBody)>,
    pub(crate) retires: Vec<Address>,
    pub(crate) displaced: Vec<(Address, StreamIncarnation)>,
    pub(crate) gone_acks: Vec<(Address, GoneScope)>,
}

impl Out {
    fn reply(&mut self, caller: Caller, body: ReplyBody) {
        self.replies
            .push((caller.reply_to, caller.request_id, body));
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Model {
    pub(crate) epoch: AuthorityEpoch,
    pub(crate) next_revision: u64,
    pub(crate) entries: BTreeMap<DataPath, Entry>,
    pub(crate) operations: BTreeMap<OperationId, OperationRecord>,
    pub(crate) reservations: BTreeMap<DataPath, Reservation>,
    /// Retirement obligations, in creation order.
    pub(crate) retirements: Vec<Address>,
    /// Displacement obligations (endpoint, incarnation, fenced path), one per endpoint.
    pub(crate) displacements: Vec<(Address, StreamIncarnation, Option<DataPath>)>,
    pub(crate) floors: BTreeMap<NodeId, u64>,
    /// The horizon each issuer declared (durable).
    pub(crate) horizons: BTreeMap<Issuer, u64>,
    /// The tables' bounds.
    pub(crate) limits: DirectoryLimits,
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
    /// A fresh store whose tables have the bounds `limits`.
    pub(crate) fn with_limits(limits: DirectoryLimits) -> Self {
        Model {
            epoch: AuthorityEpoch(1),
            next_revision: 1,
            entries: BTreeMap::new(),
            operations: BTreeMap::new(),
            reservations: BTreeMap::new(),
            retirements: Vec::new(),
            displacements: Vec::new(),
            floors: BTreeMap::new(),
            horizons: BTreeMap::new(),
            limits,
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

    fn issuer_gone(&self, i: Issuer) -> bool {
        self.floors.get(&i.node).is_some_and(|f| i.incarnation < *f)
    }

    /// Retention: the issuer's incarnation ended, or it declared the operation done.
    fn expired(&self, op: OperationId) -> bool {
        let i = op.issuer();
        self.issuer_gone(i) || op.sequence() < self.horizons.get(&i).copied().unwrap_or(0)
    }

    fn pinned(&self, op: OperationId) -> bool {
        self.reservations.values().any(|r| r.operation == op)
    }

    /// Retention: no record of an expired operation stays, unless a reservation pins it.
    fn prune(&mut self) {
        let doomed: Vec<OperationId> = self
            .operations
            .keys()
            .copied()
            .filter(|op| self.expired(*op) && !self.pinned(*op))
            .collect();
        for op in doomed {
            self.operations.remove(&op);
        }
    }

    /// The directory's issuer rows: (horizon, records) for every issuer that has records, or a
    /// horizon while its node incarnation lives.
    pub(crate) fn issuer_rows(&self) -> BTreeMap<Issuer, (u64, usize)> {
        let mut rows: BTreeMap<Issuer, (u64, usize)> = BTreeMap::new();
        for op in self.operations.keys() {
            rows.entry(op.issuer()).or_default().1 += 1;
        }
        for (i, h) in &self.horizons {
            if rows.contains_key(i) || !self.issuer_gone(*i) {
                rows.entry(*i).or_default().0 = *h;
            }
        }
        rows
    }

    fn obligation_count(&self) -> usize {
        self.retirements.len() + self.displacements.len()
    }

    /// Whether an unknown operation id may be recorded (see the module documentation).
    fn admit(&self, op: OperationId, retraction: bool) -> Result<(), NamespaceError> {
        if self.expired(op) {
            return Err(NamespaceError::OperationExpired(op));
        }
        let k = if retraction { 2 } else { 1 };
        let full = |l| Err(NamespaceError::LimitReached(l));
        if self.operations.len() >= self.limits.operations * k {
            return full(Limit::Operations);
        }
        let rows = self.issuer_rows();
        match rows.get(&op.issuer()) {
            Some((_, n)) if *n >= self.limits.issuer_operations * k => {
                full(Limit::IssuerOperations)
            }
            None if rows.len() >= self.limits.issuers * k => full(Limit::Issuers),
            _ => Ok(()),
        }
    }

    /// `OperationsDone`: see the module documentation.
    fn operations_done(
        &mut self,
        reply_to: Address,
        issuer: Issuer,
        below: u64,
    ) -> Result<u64, NamespaceError> {
        let on_node = reply_to.node.0 & 0xffff_ffff == issuer.node.0
            && reply_to.incarnation & 0xffff_ffff == issuer.incarnation;
        if !on_node {
            return Err(NamespaceError::Protocol(Reason::new(
                "an issuer speaks only for its own node incarnation",
            )));
        }
        let all = 1u64 << 56;
        if self.issuer_gone(issuer) {
            return Ok(all);
        }
        let mut h = below.min(all);
        for rv in self.streams.values() {
            let ops = match rv {
                MRv::Pending(p) => vec![p.op],
                MRv::Active(a) => vec![a.source_op, a.sink_op],
            };
            for op in ops {
                if op.issuer() == issuer {
                    h = h.min(op.sequence());
                }
            }
        }
        let current = self.horizons.get(&issuer).copied().unwrap_or(0);
        if h <= current {
            return Ok(current);
        }
        let rows = self.issuer_rows();
        if !rows.contains_key(&issuer) && rows.len() >= self.limits.issuers {
            return Err(NamespaceError::LimitReached(Limit::Issuers));
        }
        self.horizons.insert(issuer, h);
        self.prune();
        Ok(h)
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

    pub(crate) fn call(&mut self, caller: Caller, request: DirectoryRequest, out: &mut Out) {
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
            DirectoryRequest::OperationsDone { issuer, below } => {
                let r = self.operations_done(caller.reply_to, issuer, below);
                out.reply(caller, ReplyBody::OperationsDone(r));
            }
        }
        self.prune();
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
        self.admit(op, false)?;
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
        if !self.entries.contains_key(&path) && self.entries.len() >= self.limits.entries {
            let full = RejectionKind::LimitReached(Limit::Entries);
            return Err(self.reject(op, key, full, &path));
        }
        let retires = self
            .blob_source(&path)
            .is_some_and(|a| a != source && !self.is_gone(&a));
        let displaces = matches!(self.streams.get(&path), Some(MRv::Active(_)));
        if (retires || displaces) && self.obligation_count() >= self.limits.obligations {
            let full = RejectionKind::LimitReached(Limit::Obligations);
            return Err(self.reject(op, key, full, &path));
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
                // The source's node incarnation ended after the bind: the bytes are gone.
                Some(MSource::Available { source, .. }) if self.is_gone(source) => {
                    Err(NamespaceError::BlobLost(path.clone()))
                }
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
                lost: matches!(
                    self.sources.get(path),
                    Some(MSource::Available { source, .. }) if self.is_gone(source)
                ),
            }),
            Some(Entry::Stream { revision }) => Ok(NamespaceNode {
                kind: EntryKind::Stream,
                revision: *revision,
                active: self.streams.contains_key(path),
                lost: false,
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
        self.admit(op, false)?;
        if self.is_gone(&owner) {
            return Err(NamespaceError::PathReplaced(path));
        }
        if self.entries.contains_key(&path) || self.reservations.contains_key(&path) {
            return Err(self.reject(op, key, RejectionKind::PathExists, &path));
        }
        if self.reservations.len() >= self.limits.reservations {
            let full = RejectionKind::LimitReached(Limit::Reservations);
            return Err(self.reject(op, key, full, &path));
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
                self.admit(op, true)?;
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
        self.admit(op, false)?;
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
        let retires = self.blob_source(&path).is_some_and(|a| !self.is_gone(&a));
        if retires && self.obligation_count() >= self.limits.obligations {
            let full = RejectionKind::LimitReached(Limit::Obligations);
            return Err(self.reject(op, key, full, &path));
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
        self.admit(op, false)?;
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
        let retires = src != dst && self.blob_source(&dst).is_some_and(|a| !self.is_gone(&a));
        if retires && self.obligation_count() >= self.limits.obligations {
            let full = RejectionKind::LimitReached(Limit::Obligations);
            return Err(self.reject(op, key, full, &dst));
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
        // 0. An id used for another request conflicts at once, even on a fenced path; an
        //    unknown one must be admissible (not expired, room in the tables).
        let early = match self.operations.get(&args.op) {
            Some(record) if record.key != key => Err(NamespaceError::OperationConflict(args.op)),
            Some(_) => Ok(()),
            None => self.admit(args.op, false),
        };
        if let Err(e) = early {
            out.reply(caller, opened(Err(e)));
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
            } else if fence.held.len() >= self.limits.fence_held_opens {
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
        // 5. Replace an active rendezvous: fence it (room for a fence and obligations first).
        if args.replace {
            if let Some(MRv::Active(_)) = self.streams.get(&path) {
                let full = if self.fences.len() >= self.limits.fences {
                    Some(Limit::Fences)
                } else if self.obligation_count() >= self.limits.obligations {
                    Some(Limit::Obligations)
                } else {
                    None
                };
                if let Some(l) = full {
                    let e = self.reject(args.op, key, RejectionKind::LimitReached(l), &path);
                    out.reply(caller, opened(Err(e)));
                    return;
                }
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
        // 9. Bind (room for a rendezvous, an entry, an obligation first).
        if self.reservations.contains_key(&path) {
            let e = self.reject(args.op, key, RejectionKind::PathExists, &path);
            out.reply(caller, opened(Err(e)));
            return;
        }
        let full = if self.streams.len() >= self.limits.rendezvous {
            Some(Limit::Rendezvous)
        } else if !self.entries.contains_key(&path) && self.entries.len() >= self.limits.entries {
            Some(Limit::Entries)
        } else if self.blob_source(&path).is_some_and(|a| !self.is_gone(&a))
            && self.obligation_count() >= self.limits.obligations
        {
            Some(Limit::Obligations)
        } else {
            None
        };
        if let Some(l) = full {
            let e = self.reject(args.op, key, RejectionKind::LimitReached(l), &path);
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
                self.admit(op, true)?;
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

    pub(crate) fn source_retired(&mut self, source: Address) {
        self.retirements.retain(|a| *a != source);
        self.forget_unwatched();
    }

    pub(crate) fn stream_displaced(
        &mut self,
        endpoint: Address,
        inc: StreamIncarnation,
        out: &mut Out,
    ) {
        if self.is_displacing(endpoint, inc) {
            self.displacements
                .retain(|(e, i, _)| (*e, *i) != (endpoint, inc));
            self.forget_unwatched();
            self.resume_fences(out);
        }
    }

    pub(crate) fn gone(&mut self, scope: GoneScope, reply_to: Address, out: &mut Out) {
        let node_report = matches!(scope, GoneScope::NodeBefore { .. });
        if let GoneScope::NodeBefore { node, incarnation } = scope {
            let floor = self.floors.entry(node).or_insert(0);
            *floor = (*floor).max(incarnation);
        }
        self.prune();
        self.retirements.retain(|a| !scope.covers(a));
        self.displacements.retain(|(e, _, _)| !scope.covers(e));
        self.forget_unwatched();
        self.reservations.retain(|_, r| !scope.covers(&r.owner));
        self.prune();
        // A restarted node also ends what its earlier incarnations opened.
        let ended = |m: &Model, op: OperationId| node_report && m.issuer_gone(op.issuer());
        let paths: Vec<DataPath> = self.streams.keys().cloned().collect();
        for path in paths {
            match self.streams.get(&path) {
                Some(MRv::Pending(p)) if scope.covers(&p.endpoint) || ended(self, p.op) => {
                    let caller = p.caller;
                    self.streams.remove(&path);
                    out.reply(
                        caller,
                        ReplyBody::StreamOpened(Err(NamespaceError::PathReplaced(path.clone()))),
                    );
                }
                Some(MRv::Active(a))
                    if scope.covers(&a.matched.source)
                        || scope.covers(&a.matched.sink)
                        || ended(self, a.source_op)
                        || ended(self, a.sink_op) =>
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
        let gone_issuers: BTreeSet<Issuer> = self
            .fences
            .values()
            .flat_map(|f| f.held.iter().map(|(_, h)| h.op.issuer()))
            .filter(|i| node_report && self.issuer_gone(*i))
            .collect();
        for (path, fence) in self.fences.iter_mut() {
            fence.held.retain(|(caller, h)| {
                if scope.covers(&h.endpoint) || gone_issuers.contains(&h.op.issuer()) {
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
    pub(crate) fn retry_pass(&mut self, out: &mut Out) {
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
    pub(crate) fn route(&mut self, target: Address, routable: bool, out: &mut Out) {
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
    pub(crate) fn restart(&mut self, out: &mut Out) {
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

    /// The paths with a runtime rendezvous, each with whether it is matched.
    pub(crate) fn rendezvous(&self) -> impl Iterator<Item = (&DataPath, bool)> {
        self.streams
            .iter()
            .map(|(p, r)| (p, matches!(r, MRv::Active(_))))
    }

    /// The fenced paths.
    pub(crate) fn fenced(&self) -> impl Iterator<Item = &DataPath> {
        self.fences.keys()
    }

    pub(crate) fn obligation_targets(&self) -> BTreeSet<Address> {
        self.retirements
            .iter()
            .copied()
            .chain(self.displacements.iter().map(|(e, _, _)| *e))
            .collect()
    }
}

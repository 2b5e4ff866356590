//! The reference model of the directory, written from SPEC.md §4 as amended by DESIGN.md §5
//! and ARCHITECTURE.md, independently of `dataplane_core::directory`.
//!
//! The world feeds it every input the directory processes, in the directory's processing (and
//! therefore commit) order; it predicts every reply, every fresh Retire and Displaced notice and
//! every gone acknowledgement. Its durable half lives in [`JMap`]s so a crash can roll it back
//! to the steps that reached the disk. It favours plainness over speed: linear scans over tiny
//! maps, values cloned freely.
//!
//! Retention, restated from ARCHITECTURE "Retention of operation records": an operation id
//! names its issuer (node, incarnation, lane: the high 72 bits) and a sequence number (the
//! low 56). It is expired once its issuer's incarnation is below the node's floor or its
//! sequence number is below the horizon the issuer declared (`OperationsDone`, only from a
//! caller on the issuer's node incarnation, never past one of the issuer's operations that is
//! a live rendezvous). An expired operation keeps its record only while it holds a
//! reservation; without a record it is refused `OperationExpired` before anything else. The
//! simulator runs with the default table limits and never reaches them (the testkit's model
//! covers the limits); a `LimitReached` from the directory's own tables would disagree here.

use std::collections::BTreeMap;

use dataplane_core::error::NamespaceError;
use dataplane_core::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    BlobBinding, Descriptor, DirectoryReply, DirectoryRequest, EntryKind, GoneScope,
    MutationReceipt, NamespaceNode, ReplyBody, SourceRecovery, StreamMatch, StreamRole,
};

use super::journal::JMap;

/// Something the model says the directory must send in this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A reply to `to`.
    Reply(Address, DirectoryReply),
    /// A fresh Retire to this source.
    Retire(Address),
    /// A fresh Displaced notice.
    Displaced(Address, StreamIncarnation),
    /// An acknowledgement of a gone report.
    GoneAck(Address, GoneScope),
}

/// Idempotency keys, as the model understands them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MKey {
    /// Register{path, length, recovery}.
    Register(DataPath, u64, SourceRecovery),
    /// Stream opens and cancels.
    Bind(DataPath),
    /// Unregister{path, expected_revision}.
    Unregister(DataPath, Option<Revision>),
    /// Rename{source, destination, replace}.
    Rename(DataPath, DataPath, bool),
    /// Reserve and release.
    Reserve(DataPath),
}

/// What an operation id stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MOutcome {
    /// Committed at this revision.
    Committed(u64),
    /// Rejected, for good.
    Rejected(NamespaceError),
    /// Reservation granted.
    Reserved,
}

/// A durable entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MEntry {
    /// A blob.
    Blob {
        /// Length.
        length: u64,
        /// Revision.
        revision: u64,
        /// Recovery record.
        recovery: SourceRecovery,
    },
    /// A stream node.
    Stream {
        /// Revision.
        revision: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MOpen {
    request_id: RequestId,
    reply_to: Address,
    path: DataPath,
    role: StreamRole,
    descriptor: Descriptor,
    endpoint: Address,
    replace: bool,
    ensure: bool,
    expected: Option<Revision>,
    op: OperationId,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MActive {
    matched: StreamMatch,
    source_op: OperationId,
    sink_op: OperationId,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum MStream {
    Pending {
        open: MOpen,
        revision: u64,
        from: Option<u64>,
    },
    Active(MActive),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct MFence {
    incarnation: StreamIncarnation,
    endpoints: Vec<Address>,
    old: Option<MActive>,
    held: Vec<MOpen>,
}

const NEXT_REVISION: u8 = 0;
const EPOCH: u8 = 1;

/// The model.
#[derive(Clone, Debug, Default)]
pub struct Model {
    step: u64,
    counters: JMap<u8, u64>,
    /// Durable entries.
    pub entries: JMap<DataPath, MEntry>,
    /// Durable operation table.
    pub ops: JMap<OperationId, (MKey, MOutcome)>,
    /// Durable reservations: path → (op, owner).
    pub reservations: JMap<DataPath, (OperationId, Address)>,
    /// Durable retirement obligations.
    pub retirements: JMap<Address, ()>,
    /// Durable displacement obligations: endpoint → (incarnation, fenced path).
    pub displacements: JMap<(Address, StreamIncarnation), Option<DataPath>>,
    /// Durable node floors.
    pub floors: JMap<NodeId, u64>,
    /// Durable issuer horizons.
    pub horizons: JMap<Issuer, u64>,
    sources: BTreeMap<DataPath, BlobBinding>,
    streams: BTreeMap<DataPath, MStream>,
    fences: BTreeMap<DataPath, MFence>,
    out: Vec<Expect>,
    /// Interesting paths taken in this step (for coverage).
    pub notes: Vec<&'static str>,
}

impl Model {
    /// The epoch of the serving instance.
    pub fn epoch(&self) -> AuthorityEpoch {
        AuthorityEpoch(self.counters.get(&EPOCH).copied().unwrap_or(0))
    }

    /// The next revision to allocate.
    pub fn next_revision(&self) -> u64 {
        self.counters.get(&NEXT_REVISION).copied().unwrap_or(1)
    }

    /// Paths with a runtime rendezvous.
    pub fn active_paths(&self) -> impl Iterator<Item = &DataPath> {
        self.streams.keys()
    }

    /// Paths with a fence.
    pub fn fenced_paths(&self) -> impl Iterator<Item = &DataPath> {
        self.fences.keys()
    }

    /// The live source bound at each blob path.
    pub fn sources(&self) -> &BTreeMap<DataPath, BlobBinding> {
        &self.sources
    }

    /// How many durable changes the model ever made.
    pub fn durable_writes(&self) -> u64 {
        self.counters.writes()
            + self.entries.writes()
            + self.ops.writes()
            + self.reservations.writes()
            + self.retirements.writes()
            + self.displacements.writes()
            + self.floors.writes()
            + self.horizons.writes()
    }

    /// Takes the expectations of the current step.
    pub fn take_expectations(&mut self) -> Vec<Expect> {
        std::mem::take(&mut self.out)
    }

    /// Undo every durable change after `step` (a crash lost those steps).
    pub fn rollback_after(&mut self, step: u64) {
        self.counters.rollback_after(step);
        self.entries.rollback_after(step);
        self.ops.rollback_after(step);
        self.reservations.rollback_after(step);
        self.retirements.rollback_after(step);
        self.displacements.rollback_after(step);
        self.floors.rollback_after(step);
        self.horizons.rollback_after(step);
    }

    /// Steps up to `step` are durable.
    pub fn forget_through(&mut self, step: u64) {
        self.counters.forget_through(step);
        self.entries.forget_through(step);
        self.ops.forget_through(step);
        self.reservations.forget_through(step);
        self.retirements.forget_through(step);
        self.displacements.forget_through(step);
        self.floors.forget_through(step);
        self.horizons.forget_through(step);
    }

    /// A recovery at `step`: the epoch advances, runtime state restarts from the durable
    /// state (sources from their recovery records, fences from fencing displacements).
    pub fn recover(&mut self, step: u64) {
        self.step = step;
        let epoch = self.epoch().0 + 1;
        self.counters.insert(step, EPOCH, epoch);
        self.streams.clear();
        self.fences.clear();
        self.sources.clear();
        for (path, entry) in self.entries.map() {
            if let MEntry::Blob {
                length,
                revision,
                recovery: SourceRecovery::Actor { actor, node, owner },
            } = entry
            {
                let binding = BlobBinding {
                    source: *actor,
                    source_node: *node,
                    owner: *owner,
                    length: *length,
                    revision: Revision(*revision),
                };
                self.sources.insert(path.clone(), binding);
            }
        }
        let displacements: Vec<(Address, StreamIncarnation, Option<DataPath>)> = self
            .displacements
            .map()
            .iter()
            .map(|((e, inc), fence)| (*e, *inc, fence.clone()))
            .collect();
        for (endpoint, incarnation, fence) in displacements {
            let Some(path) = fence else { continue };
            if self.entries.get(&path)
                != Some(&MEntry::Stream {
                    revision: incarnation.revision.0,
                })
            {
                continue;
            }
            let fence = self.fences.entry(path).or_insert_with(|| MFence {
                incarnation,
                endpoints: Vec::new(),
                old: None,
                held: Vec::new(),
            });
            if fence.incarnation == incarnation && !fence.endpoints.contains(&endpoint) {
                fence.endpoints.push(endpoint);
            }
        }
    }

    // ------------------------------------------------------------ helpers

    fn reply(&mut self, to: Address, request_id: RequestId, body: ReplyBody) {
        let reply = DirectoryReply {
            request_id,
            epoch: self.epoch(),
            body,
        };
        self.out.push(Expect::Reply(to, reply));
    }

    fn reply_open(&mut self, open: &MOpen, result: Result<StreamMatch, NamespaceError>) {
        self.reply(
            open.reply_to,
            open.request_id,
            ReplyBody::StreamOpened(result),
        );
    }

    fn gone(&self, address: &Address) -> bool {
        self.floors
            .get(&address.node)
            .is_some_and(|floor| address.incarnation < *floor)
    }

    fn issuer_gone(&self, issuer: Issuer) -> bool {
        self.floors
            .get(&issuer.node)
            .is_some_and(|floor| issuer.incarnation < *floor)
    }

    /// Whether `op` is expired (see the module documentation).
    pub fn expired(&self, op: OperationId) -> bool {
        let issuer = op.issuer();
        self.issuer_gone(issuer) || op.sequence() < self.horizons.get(&issuer).copied().unwrap_or(0)
    }

    fn pinned(&self, op: OperationId) -> bool {
        self.reservations.map().values().any(|(o, _)| *o == op)
    }

    /// Drops the records of `candidates` that are expired and not pinned.
    fn prune(&mut self, candidates: Vec<OperationId>) {
        for op in candidates {
            if self.expired(op) && !self.pinned(op) {
                self.ops.remove(self.step, &op);
            }
        }
    }

    /// The records of `node`'s issuers.
    fn ops_of_node(&self, node: NodeId) -> Vec<OperationId> {
        self.ops
            .map()
            .keys()
            .filter(|op| op.issuer().node == node)
            .copied()
            .collect()
    }

    /// `OperationsDone` (see the module documentation).
    fn operations_done(
        &mut self,
        reply_to: Address,
        issuer: Issuer,
        below: u64,
    ) -> Result<u64, NamespaceError> {
        if !issuer.is_on(reply_to) {
            return Err(NamespaceError::Protocol(dataplane_core::wire::reason(
                "an issuer speaks only for its own node incarnation",
            )));
        }
        let all = OperationId::SEQUENCE_END;
        if self.issuer_gone(issuer) {
            return Ok(all);
        }
        let mut horizon = below.min(all);
        for stream in self.streams.values() {
            let ops = match stream {
                MStream::Pending { open, .. } => vec![open.op],
                MStream::Active(a) => vec![a.source_op, a.sink_op],
            };
            for op in ops.into_iter().filter(|op| op.issuer() == issuer) {
                horizon = horizon.min(op.sequence());
            }
        }
        let current = self.horizons.get(&issuer).copied().unwrap_or(0);
        if horizon <= current {
            return Ok(current);
        }
        self.horizons.insert(self.step, issuer, horizon);
        let candidates: Vec<OperationId> = self
            .ops
            .map()
            .keys()
            .filter(|op| op.issuer() == issuer)
            .copied()
            .collect();
        self.prune(candidates);
        self.notes.push("retention.horizon_raised");
        Ok(horizon)
    }

    fn sticky(&mut self, op: OperationId, key: MKey, error: NamespaceError) -> NamespaceError {
        self.ops
            .insert(self.step, op, (key, MOutcome::Rejected(error.clone())));
        error
    }

    /// Stored outcome of `op` for `key`: None if unknown, Err(conflict) if used otherwise,
    /// Err(OperationExpired) if it has no record and is expired.
    fn stored(&self, op: OperationId, key: &MKey) -> Option<Result<MOutcome, NamespaceError>> {
        let Some((stored_key, outcome)) = self.ops.get(&op) else {
            return self
                .expired(op)
                .then_some(Err(NamespaceError::OperationExpired(op)));
        };
        if stored_key != key {
            return Some(Err(NamespaceError::OperationConflict(op)));
        }
        Some(Ok(outcome.clone()))
    }

    fn allocate(&mut self) -> u64 {
        let r = self.next_revision();
        self.counters.insert(self.step, NEXT_REVISION, r + 1);
        r
    }

    fn retire(&mut self, source: Address) {
        if !self.retirements.contains(&source) {
            self.retirements.insert(self.step, source, ());
        }
        self.out.push(Expect::Retire(source));
    }

    fn displace(
        &mut self,
        endpoint: Address,
        incarnation: StreamIncarnation,
        fence: Option<DataPath>,
    ) {
        if self.displacements.contains(&(endpoint, incarnation)) || self.gone(&endpoint) {
            return;
        }
        self.displacements
            .insert(self.step, (endpoint, incarnation), fence);
        self.out.push(Expect::Displaced(endpoint, incarnation));
    }

    fn receipt(
        outcome: Result<MOutcome, NamespaceError>,
    ) -> Result<MutationReceipt, NamespaceError> {
        match outcome? {
            MOutcome::Committed(r) => Ok(MutationReceipt {
                revision: Revision(r),
            }),
            MOutcome::Rejected(e) => Err(e),
            MOutcome::Reserved => Err(NamespaceError::Protocol(dataplane_core::wire::reason(
                "not a mutation",
            ))),
        }
    }

    // ------------------------------------------------------------ inputs

    /// A call delivered to the directory at `step`.
    pub fn call(
        &mut self,
        step: u64,
        request_id: RequestId,
        reply_to: Address,
        request: DirectoryRequest,
    ) {
        self.step = step;
        let body = match request {
            DirectoryRequest::Register {
                path,
                source,
                source_node,
                length,
                recovery,
                operation,
                reservation,
            } => ReplyBody::Registered(self.register(
                path,
                source,
                source_node,
                length,
                recovery,
                operation,
                reservation,
            )),
            DirectoryRequest::Resolve { path } => ReplyBody::Resolved(self.resolve(&path)),
            DirectoryRequest::Lookup { path } => ReplyBody::LookedUp(self.lookup(&path)),
            DirectoryRequest::ReserveBlob {
                path,
                operation,
                owner,
            } => ReplyBody::BlobReserved(self.reserve(path, operation, owner)),
            DirectoryRequest::ReleaseBlobReservation { path, operation } => {
                ReplyBody::BlobReservationReleased(self.release(path, operation))
            }
            DirectoryRequest::Unregister {
                path,
                expected_revision,
                operation,
            } => ReplyBody::Unregistered(self.unregister(path, expected_revision, operation)),
            DirectoryRequest::Rename {
                source,
                destination,
                replace,
                operation,
            } => ReplyBody::Renamed(self.rename(source, destination, replace, operation)),
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
                let open = MOpen {
                    request_id,
                    reply_to,
                    path,
                    role,
                    descriptor,
                    endpoint,
                    replace,
                    ensure,
                    expected: expected_revision,
                    op: operation,
                };
                self.open(open);
                return;
            }
            DirectoryRequest::CancelStream { path, operation } => {
                ReplyBody::StreamCancelled(self.cancel(path, operation))
            }
            DirectoryRequest::CloseStream { path, incarnation } => {
                ReplyBody::StreamClosed(self.close(&path, incarnation))
            }
            DirectoryRequest::OperationsDone { issuer, below } => {
                ReplyBody::OperationsDone(self.operations_done(reply_to, issuer, below))
            }
        };
        if matches!(&body.err(), Some(NamespaceError::OperationExpired(_))) {
            self.notes.push("retention.refused_expired");
        }
        self.reply(reply_to, request_id, body);
    }

    #[allow(clippy::too_many_arguments)]
    fn register(
        &mut self,
        path: DataPath,
        source: Address,
        source_node: NodeId,
        length: u64,
        recovery: SourceRecovery,
        op: OperationId,
        reservation: Option<OperationId>,
    ) -> Result<MutationReceipt, NamespaceError> {
        let key = MKey::Register(path.clone(), length, recovery.clone());
        if let Some(stored) = self.stored(op, &key) {
            return Self::receipt(stored);
        }
        if self.gone(&source) {
            return Err(NamespaceError::PathReplaced(path));
        }
        let held = self.reservations.get(&path).map(|(o, _)| *o);
        match (held, reservation) {
            (Some(h), Some(q)) if h == q => {}
            (Some(_), _) => return Err(self.sticky(op, key, NamespaceError::PathExists(path))),
            (None, Some(_)) => {
                return Err(self.sticky(op, key, NamespaceError::PathReplaced(path)));
            }
            (None, None) => {}
        }
        let r = self.allocate();
        let old = self.live_source(&path).filter(|s| *s != source);
        if let Some(held) = reservation {
            self.reservations.remove(self.step, &path);
            self.prune(vec![held]);
        }
        let owner = match &recovery {
            SourceRecovery::Actor { owner, .. } => *owner,
            SourceRecovery::File { .. } => None,
        };
        self.entries.insert(
            self.step,
            path.clone(),
            MEntry::Blob {
                length,
                revision: r,
                recovery,
            },
        );
        self.ops
            .insert(self.step, op, (key, MOutcome::Committed(r)));
        let binding = BlobBinding {
            source,
            source_node,
            owner,
            length,
            revision: Revision(r),
        };
        self.sources.insert(path.clone(), binding);
        if let Some(old) = old {
            self.retire(old);
        }
        match self.streams.remove(&path) {
            Some(MStream::Pending { open, .. }) => {
                self.reply_open(&open, Err(NamespaceError::PathReplaced(path)));
            }
            Some(MStream::Active(a)) => {
                let inc = a.matched.incarnation;
                self.displace(a.matched.source, inc, None);
                self.displace(a.matched.sink, inc, None);
            }
            None => {}
        }
        Ok(MutationReceipt {
            revision: Revision(r),
        })
    }

    fn unregister(
        &mut self,
        path: DataPath,
        expected: Option<Revision>,
        op: OperationId,
    ) -> Result<MutationReceipt, NamespaceError> {
        let key = MKey::Unregister(path.clone(), expected);
        if let Some(stored) = self.stored(op, &key) {
            return Self::receipt(stored);
        }
        if self.streams.contains_key(&path) {
            let live = NamespaceError::WrongEntryType {
                path,
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            };
            return Err(self.sticky(op, key, live));
        }
        if self.reservations.contains(&path) {
            return Err(self.sticky(op, key, NamespaceError::PathExists(path)));
        }
        let current = match self.entries.get(&path) {
            None => return Err(self.sticky(op, key, NamespaceError::PathNotFound(path))),
            Some(MEntry::Blob { revision, .. } | MEntry::Stream { revision }) => *revision,
        };
        if expected.is_some_and(|e| e.0 != current) {
            return Err(self.sticky(op, key, NamespaceError::PathReplaced(path)));
        }
        let r = self.allocate();
        self.entries.remove(self.step, &path);
        self.ops
            .insert(self.step, op, (key, MOutcome::Committed(r)));
        let old = self.live_source(&path);
        self.sources.remove(&path);
        if let Some(old) = old {
            self.retire(old);
        }
        Ok(MutationReceipt {
            revision: Revision(r),
        })
    }

    /// The source a replacement of `path` must retire: none if it is on a gone incarnation.
    fn live_source(&self, path: &DataPath) -> Option<Address> {
        self.sources
            .get(path)
            .map(|b| b.source)
            .filter(|s| !self.gone(s))
    }

    fn rename(
        &mut self,
        source: DataPath,
        destination: DataPath,
        replace: bool,
        op: OperationId,
    ) -> Result<MutationReceipt, NamespaceError> {
        let key = MKey::Rename(source.clone(), destination.clone(), replace);
        if let Some(stored) = self.stored(op, &key) {
            return Self::receipt(stored);
        }
        let refusal = if !self.entries.contains(&source) {
            Some(NamespaceError::PathNotFound(source.clone()))
        } else if self.reservations.contains(&source) {
            Some(NamespaceError::PathExists(source.clone()))
        } else if self.reservations.contains(&destination) {
            Some(NamespaceError::PathExists(destination.clone()))
        } else if self.streams.contains_key(&source) {
            Some(NamespaceError::StreamActive(source.clone()))
        } else if self.streams.contains_key(&destination) {
            Some(NamespaceError::StreamActive(destination.clone()))
        } else if source != destination && self.entries.contains(&destination) && !replace {
            Some(NamespaceError::PathExists(destination.clone()))
        } else {
            None
        };
        if let Some(error) = refusal {
            return Err(self.sticky(op, key, error));
        }
        let r = self.allocate();
        let moved = match self
            .entries
            .remove(self.step, &source)
            .expect("checked above")
        {
            MEntry::Blob {
                length, recovery, ..
            } => MEntry::Blob {
                length,
                revision: r,
                recovery,
            },
            MEntry::Stream { .. } => MEntry::Stream { revision: r },
        };
        self.entries.insert(self.step, destination.clone(), moved);
        self.ops
            .insert(self.step, op, (key, MOutcome::Committed(r)));
        let mut old = None;
        if source != destination {
            old = self.live_source(&destination);
            self.sources.remove(&destination);
        }
        if let Some(binding) = self.sources.remove(&source) {
            self.sources.insert(
                destination,
                BlobBinding {
                    revision: Revision(r),
                    ..binding
                },
            );
        }
        if let Some(old) = old {
            self.retire(old);
        }
        Ok(MutationReceipt {
            revision: Revision(r),
        })
    }

    fn resolve(&self, path: &DataPath) -> Result<BlobBinding, NamespaceError> {
        match self.entries.get(path) {
            None => Err(NamespaceError::PathNotFound(path.clone())),
            Some(MEntry::Stream { .. }) => Err(NamespaceError::WrongEntryType {
                path: path.clone(),
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            }),
            Some(MEntry::Blob { .. }) => match self.sources.get(path) {
                // Its source's node restarted after it was bound: the bytes died with that
                // incarnation, and the directory says so instead of handing out the binding.
                Some(binding) if self.gone(&binding.source) => {
                    Err(NamespaceError::BlobLost(path.clone()))
                }
                Some(binding) => Ok(*binding),
                None => Err(NamespaceError::SourceRecovery(
                    dataplane_core::wire::reason("unavailable"),
                )),
            },
        }
    }

    fn lookup(&self, path: &DataPath) -> Result<NamespaceNode, NamespaceError> {
        if self.reservations.contains(path) {
            return Err(NamespaceError::PathExists(path.clone()));
        }
        match self.entries.get(path) {
            None => Err(NamespaceError::PathNotFound(path.clone())),
            Some(MEntry::Blob { revision, .. }) => Ok(NamespaceNode {
                kind: EntryKind::Blob,
                revision: Revision(*revision),
                active: false,
                lost: self
                    .sources
                    .get(path)
                    .is_some_and(|binding| self.gone(&binding.source)),
            }),
            Some(MEntry::Stream { revision }) => Ok(NamespaceNode {
                kind: EntryKind::Stream,
                revision: Revision(*revision),
                active: self.streams.contains_key(path),
                lost: false,
            }),
        }
    }

    fn reserve(
        &mut self,
        path: DataPath,
        op: OperationId,
        owner: Address,
    ) -> Result<(), NamespaceError> {
        let key = MKey::Reserve(path.clone());
        if let Some(stored) = self.stored(op, &key) {
            return match stored? {
                MOutcome::Rejected(e) => Err(e),
                _ => Ok(()),
            };
        }
        if self.gone(&owner) {
            return Err(NamespaceError::PathReplaced(path));
        }
        if self.entries.contains(&path) || self.reservations.contains(&path) {
            return Err(self.sticky(op, key, NamespaceError::PathExists(path)));
        }
        self.reservations.insert(self.step, path, (op, owner));
        self.ops.insert(self.step, op, (key, MOutcome::Reserved));
        Ok(())
    }

    fn release(&mut self, path: DataPath, op: OperationId) -> Result<(), NamespaceError> {
        let key = MKey::Reserve(path.clone());
        match self.stored(op, &key) {
            None => {
                self.sticky(op, key, NamespaceError::PathReplaced(path));
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(_)) => {
                if self.reservations.get(&path).is_some_and(|(o, _)| *o == op) {
                    self.reservations.remove(self.step, &path);
                    self.prune(vec![op]);
                }
            }
        }
        Ok(())
    }

    fn current(&self, path: &DataPath, op: OperationId) -> bool {
        match self.streams.get(path) {
            Some(MStream::Pending { open, .. }) => open.op == op,
            Some(MStream::Active(a)) => a.source_op == op || a.sink_op == op,
            None => false,
        }
    }

    fn retry_answer(active: &MActive, open: &MOpen) -> Result<StreamMatch, NamespaceError> {
        let (own_op, own_endpoint) = match open.role {
            StreamRole::Source => (active.source_op, active.matched.source),
            StreamRole::Sink => (active.sink_op, active.matched.sink),
        };
        if own_op == open.op && own_endpoint == open.endpoint {
            Ok(active.matched.clone())
        } else {
            Err(NamespaceError::OperationConflict(open.op))
        }
    }

    fn open(&mut self, open: MOpen) {
        let path = open.path.clone();
        if matches!(self.ops.get(&open.op), Some((key, _)) if *key != MKey::Bind(path.clone())) {
            return self.reply_open(&open, Err(NamespaceError::OperationConflict(open.op)));
        }
        if !self.ops.contains(&open.op) && self.expired(open.op) {
            return self.reply_open(&open, Err(NamespaceError::OperationExpired(open.op)));
        }
        if let Some(fence) = self.fences.get_mut(&path) {
            if let Some(old) = fence
                .old
                .clone()
                .filter(|o| o.source_op == open.op || o.sink_op == open.op)
            {
                let answer = Self::retry_answer(&old, &open);
                self.reply_open(&open, answer);
                return;
            }
            let same =
                |h: &MOpen| h.op == open.op && h.role == open.role && h.endpoint == open.endpoint;
            if let Some(h) = fence.held.iter_mut().find(|h| same(h)) {
                *h = open;
            } else if fence.held.len() >= dataplane_core::limits::FENCE_HELD_OPENS_MAX {
                let full =
                    NamespaceError::LimitReached(dataplane_core::error::Limit::FenceHeldOpens);
                if self.ops.contains(&open.op) {
                    self.reply_open(&open, Err(full));
                } else {
                    self.refuse_open(&open, full);
                }
            } else {
                fence.held.push(open);
            }
            return;
        }
        match self.stored(open.op, &MKey::Bind(path.clone())) {
            Some(Err(e)) => return self.reply_open(&open, Err(e)),
            Some(Ok(MOutcome::Rejected(e))) => {
                self.notes.push("stream.open_refused_by_stored_rejection");
                return self.reply_open(&open, Err(e));
            }
            Some(Ok(MOutcome::Committed(r))) if !self.current(&path, open.op) => {
                let incarnation = StreamIncarnation {
                    epoch: self.epoch(),
                    revision: Revision(r),
                };
                return self.reply_open(
                    &open,
                    Err(NamespaceError::StaleIncarnation { path, incarnation }),
                );
            }
            Some(Ok(MOutcome::Reserved)) => {
                return self.reply_open(&open, Err(NamespaceError::OperationConflict(open.op)));
            }
            _ => {}
        }
        if self.gone(&open.endpoint) {
            self.notes.push("stream.open_from_gone_node");
            return self.reply_open(&open, Err(NamespaceError::PathReplaced(path)));
        }
        match self.streams.get_mut(&path) {
            Some(MStream::Pending { open: waiting, .. }) if waiting.op == open.op => {
                if waiting.role != open.role || waiting.endpoint != open.endpoint {
                    let conflict = NamespaceError::OperationConflict(open.op);
                    self.reply_open(&open, Err(conflict));
                } else {
                    waiting.request_id = open.request_id;
                    waiting.reply_to = open.reply_to;
                }
                return;
            }
            Some(MStream::Active(a)) if a.source_op == open.op || a.sink_op == open.op => {
                let answer = Self::retry_answer(a, &open);
                return self.reply_open(&open, answer);
            }
            _ => {}
        }
        if !open.ensure {
            let refusal = match self.entries.get(&path) {
                None => Some(NamespaceError::PathNotFound(path.clone())),
                Some(MEntry::Blob { .. }) => Some(NamespaceError::WrongEntryType {
                    path: path.clone(),
                    expected: EntryKind::Stream,
                    found: EntryKind::Blob,
                }),
                Some(MEntry::Stream { revision }) => {
                    let exact = open.expected == Some(Revision(*revision));
                    let joins = match (open.expected, self.streams.get(&path)) {
                        (Some(e), Some(MStream::Pending { from: Some(f), .. })) => e.0 == *f,
                        _ => false,
                    };
                    (!exact && !joins).then(|| NamespaceError::PathReplaced(path.clone()))
                }
            };
            if let Some(error) = refusal {
                return self.refuse_open(&open, error);
            }
        }
        if open.replace {
            match self.streams.get(&path) {
                Some(MStream::Active(_)) => {
                    let Some(MStream::Active(old)) = self.streams.remove(&path) else {
                        unreachable!()
                    };
                    let incarnation = old.matched.incarnation;
                    let mut endpoints = vec![old.matched.source];
                    if old.matched.sink != old.matched.source {
                        endpoints.push(old.matched.sink);
                    }
                    for e in &endpoints {
                        self.displace(*e, incarnation, Some(path.clone()));
                    }
                    self.notes.push("stream.fence_begun");
                    self.fences.insert(
                        path,
                        MFence {
                            incarnation,
                            endpoints,
                            old: Some(old),
                            held: vec![open],
                        },
                    );
                    return;
                }
                Some(MStream::Pending { open: waiting, .. }) if waiting.role == open.role => {
                    let Some(MStream::Pending { open: waiting, .. }) = self.streams.remove(&path)
                    else {
                        unreachable!()
                    };
                    self.reply_open(&waiting, Err(NamespaceError::PathReplaced(path.clone())));
                }
                _ => {}
            }
        }
        match self.streams.get(&path) {
            Some(MStream::Pending { open: waiting, .. }) if waiting.role != open.role => {
                let Some(MStream::Pending {
                    open: waiting,
                    revision,
                    ..
                }) = self.streams.remove(&path)
                else {
                    unreachable!()
                };
                self.ops.insert(
                    self.step,
                    open.op,
                    (MKey::Bind(path.clone()), MOutcome::Committed(revision)),
                );
                let (src, snk) = if waiting.role == StreamRole::Source {
                    (&waiting, &open)
                } else {
                    (&open, &waiting)
                };
                let matched = StreamMatch {
                    incarnation: StreamIncarnation {
                        epoch: self.epoch(),
                        revision: Revision(revision),
                    },
                    source: src.endpoint,
                    source_descriptor: src.descriptor.clone(),
                    sink: snk.endpoint,
                    sink_descriptor: snk.descriptor.clone(),
                    revision: Revision(revision),
                };
                let active = MActive {
                    matched: matched.clone(),
                    source_op: src.op,
                    sink_op: snk.op,
                };
                self.reply_open(&waiting, Ok(matched.clone()));
                self.reply_open(&open, Ok(matched));
                self.streams.insert(path, MStream::Active(active));
                return;
            }
            Some(_) => {
                let role = open.role;
                return self.refuse_open(&open, NamespaceError::DuplicateStreamRole { path, role });
            }
            None => {}
        }
        let is_blob = matches!(self.entries.get(&path), Some(MEntry::Blob { .. }));
        if is_blob && !open.replace {
            let wrong = NamespaceError::WrongEntryType {
                path,
                expected: EntryKind::Stream,
                found: EntryKind::Blob,
            };
            return self.refuse_open(&open, wrong);
        }
        if self.reservations.contains(&path) {
            let error = self.sticky(
                open.op,
                MKey::Bind(path.clone()),
                NamespaceError::PathExists(path),
            );
            return self.reply_open(&open, Err(error));
        }
        let r = self.allocate();
        let old = self.live_source(&path);
        self.sources.remove(&path);
        self.entries
            .insert(self.step, path.clone(), MEntry::Stream { revision: r });
        self.ops.insert(
            self.step,
            open.op,
            (MKey::Bind(path.clone()), MOutcome::Committed(r)),
        );
        if let Some(old) = old {
            self.retire(old);
        }
        let from = if open.ensure {
            None
        } else {
            open.expected.map(|e| e.0)
        };
        self.streams.insert(
            path,
            MStream::Pending {
                open,
                revision: r,
                from,
            },
        );
    }

    /// Every refusal of an open with an unknown op id is sticky.
    fn refuse_open(&mut self, open: &MOpen, error: NamespaceError) {
        let error = self.sticky(open.op, MKey::Bind(open.path.clone()), error);
        self.reply_open(open, Err(error));
    }

    fn cancel(&mut self, path: DataPath, op: OperationId) -> Result<(), NamespaceError> {
        let key = MKey::Bind(path.clone());
        match self.stored(op, &key) {
            None => {
                self.sticky(op, key, NamespaceError::PathReplaced(path.clone()));
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(_)) => {}
        }
        match self.streams.get(&path) {
            Some(MStream::Pending { open, .. }) if open.op == op => {
                self.streams.remove(&path);
            }
            Some(MStream::Active(a)) if a.source_op == op || a.sink_op == op => {
                let Some(MStream::Active(a)) = self.streams.remove(&path) else {
                    unreachable!()
                };
                self.notes.push("stream.cancel_active");
                let peer = if a.source_op == op {
                    a.matched.sink
                } else {
                    a.matched.source
                };
                self.displace(peer, a.matched.incarnation, None);
            }
            _ => {}
        }
        if let Some(fence) = self.fences.get_mut(&path) {
            fence.held.retain(|h| h.op != op);
        }
        Ok(())
    }

    fn close(
        &mut self,
        path: &DataPath,
        incarnation: StreamIncarnation,
    ) -> Result<(), NamespaceError> {
        let stale = NamespaceError::StaleIncarnation {
            path: path.clone(),
            incarnation,
        };
        match self.streams.get(path) {
            Some(MStream::Active(a)) if a.matched.incarnation == incarnation => {
                self.streams.remove(path);
                Ok(())
            }
            Some(_) => Err(stale),
            None => {
                let node = self.entries.get(path)
                    == Some(&MEntry::Stream {
                        revision: incarnation.revision.0,
                    });
                if node && incarnation.epoch == self.epoch() {
                    Ok(())
                } else {
                    Err(stale)
                }
            }
        }
    }

    fn resume_fences(&mut self) {
        let ready: Vec<DataPath> = self
            .fences
            .iter()
            .filter(|(_, f)| {
                f.endpoints
                    .iter()
                    .all(|e| !self.displacements.contains(&(*e, f.incarnation)))
            })
            .map(|(p, _)| p.clone())
            .collect();
        for path in ready {
            if let Some(fence) = self.fences.remove(&path) {
                self.notes.push("stream.fence_resolved");
                for open in fence.held {
                    self.open(open);
                }
            }
        }
    }

    /// `SourceRetired`.
    pub fn source_retired(&mut self, step: u64, source: Address) {
        self.step = step;
        self.retirements.remove(step, &source);
    }

    /// `StreamDisplaced`.
    pub fn stream_displaced(
        &mut self,
        step: u64,
        endpoint: Address,
        incarnation: StreamIncarnation,
    ) {
        self.step = step;
        if self.displacements.contains(&(endpoint, incarnation)) {
            self.displacements.remove(step, &(endpoint, incarnation));
            self.resume_fences();
        }
    }

    /// `AddressGone`.
    pub fn address_gone(&mut self, step: u64, scope: GoneScope, reply_to: Address) {
        self.step = step;
        if let GoneScope::NodeBefore { node, incarnation } = scope
            && incarnation > self.floors.get(&node).copied().unwrap_or(0)
        {
            self.floors.insert(step, node, incarnation);
            // Everything the ended incarnations issued is expired.
            let candidates = self.ops_of_node(node);
            self.prune(candidates);
            self.notes.push("retention.floor_pruned");
        }
        let node_report = matches!(scope, GoneScope::NodeBefore { .. });
        let retired: Vec<Address> = self
            .retirements
            .map()
            .keys()
            .filter(|a| scope.covers(a))
            .copied()
            .collect();
        for a in retired {
            self.retirements.remove(step, &a);
        }
        let displaced: Vec<(Address, StreamIncarnation)> = self
            .displacements
            .map()
            .keys()
            .filter(|(a, _)| scope.covers(a))
            .copied()
            .collect();
        for a in displaced {
            self.displacements.remove(step, &a);
        }
        let released: Vec<DataPath> = self
            .reservations
            .map()
            .iter()
            .filter(|(_, (_, owner))| scope.covers(owner))
            .map(|(p, _)| p.clone())
            .collect();
        for p in released {
            if let Some((op, _)) = self.reservations.remove(step, &p) {
                self.prune(vec![op]);
            }
        }
        // A restarted node also ends the rendezvous and held opens its earlier incarnations'
        // callers opened.
        let ended_op = |m: &Model, op: OperationId| node_report && m.issuer_gone(op.issuer());
        let ended: Vec<DataPath> = self
            .streams
            .iter()
            .filter(|(_, s)| match s {
                MStream::Pending { open, .. } => {
                    scope.covers(&open.endpoint) || ended_op(self, open.op)
                }
                MStream::Active(a) => {
                    scope.covers(&a.matched.source)
                        || scope.covers(&a.matched.sink)
                        || ended_op(self, a.source_op)
                        || ended_op(self, a.sink_op)
                }
            })
            .map(|(p, _)| p.clone())
            .collect();
        for path in ended {
            match self.streams.remove(&path) {
                Some(MStream::Pending { open, .. }) => {
                    self.reply_open(&open, Err(NamespaceError::PathReplaced(path)));
                }
                Some(MStream::Active(a)) => {
                    for e in [a.matched.source, a.matched.sink] {
                        if !scope.covers(&e) {
                            self.displace(e, a.matched.incarnation, None);
                        }
                    }
                }
                None => {}
            }
        }
        let mut dropped = Vec::new();
        let floors = self.floors.map().clone();
        let issuer_gone = |i: Issuer| floors.get(&i.node).is_some_and(|f| i.incarnation < *f);
        for fence in self.fences.values_mut() {
            let (gone, kept): (Vec<MOpen>, Vec<MOpen>) = fence.held.drain(..).partition(|h| {
                scope.covers(&h.endpoint) || node_report && issuer_gone(h.op.issuer())
            });
            fence.held = kept;
            dropped.extend(gone);
        }
        for open in dropped {
            let replaced = NamespaceError::PathReplaced(open.path.clone());
            self.reply_open(&open, Err(replaced));
        }
        self.resume_fences();
        self.out.push(Expect::GoneAck(reply_to, scope));
    }

    /// The retry tick (only fences can change).
    pub fn tick(&mut self, step: u64) {
        self.step = step;
        self.resume_fences();
    }
}

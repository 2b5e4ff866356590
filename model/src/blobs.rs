//! Blob operations (SPEC §4.4 with Q1, Q2, Q4, Q19 and node floors), Unregister and Rename
//! (which move and remove stream nodes too).

use dataplane_core::error::{Limit, NamespaceError};
use dataplane_core::ids::{Address, NodeId, OperationId, Revision};
use dataplane_core::log::{Entry, Outcome, RejectionKind, RequestKey, Reservation};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    BlobBinding, EntryKind, MutationReceipt, NamespaceNode, ReplyBody, SourceRecovery,
};

use crate::rules::{rejection_error, revision_of};
use crate::{Model, Obligation, Rendezvous, Source};

pub(crate) fn receipt(revision: Revision) -> MutationReceipt {
    MutationReceipt { revision }
}

impl Model {
    /// SPEC §4.6.1: a fresh Register displaces the runtime stream at `path` (a pending opener
    /// hears `PathReplaced`; both endpoints of an active one get a displacement, no fence).
    fn displace_runtime(&mut self, path: &DataPath) {
        match self.streams.remove(path) {
            None => {}
            Some(Rendezvous::Pending(p)) => self.reply(
                p.caller,
                ReplyBody::StreamOpened(Err(NamespaceError::PathReplaced(path.clone()))),
            ),
            Some(Rendezvous::Active(a)) => {
                for e in a.endpoints() {
                    self.queue_displace(e, a.matched.incarnation, None);
                }
            }
        }
    }

    /// SPEC §4.4 Register: replay first; an ended incarnation's source is refused (not
    /// sticky); the reservation gate; room for an entry and an obligation; then commit,
    /// retire the replaced live source, displace the runtime stream.
    pub(crate) fn register(
        &mut self,
        path: DataPath,
        (source, source_node): (Address, NodeId),
        length: u64,
        recovery: SourceRecovery,
        op: OperationId,
        reservation: Option<OperationId>,
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
            Some(held) if reservation != Some(held.operation) => {
                return Err(self.reject(op, key, RejectionKind::PathExists, &path));
            }
            None if reservation.is_some() => {
                return Err(self.reject(op, key, RejectionKind::PathReplaced, &path));
            }
            _ => {}
        }
        if !self.entries.contains(&path) && self.entries.len() >= self.limits.entries {
            let full = RejectionKind::LimitReached(Limit::Entries);
            return Err(self.reject(op, key, full, &path));
        }
        let retires = self
            .blob_source(&path)
            .is_some_and(|a| a != source && !self.is_gone(&a));
        let displaces = matches!(self.streams.get(&path), Some(Rendezvous::Active(_)));
        if (retires || displaces) && self.obligation_count() >= self.limits.obligations {
            let full = RejectionKind::LimitReached(Limit::Obligations);
            return Err(self.reject(op, key, full, &path));
        }
        let r = self.alloc();
        let retired = self.blob_source(&path).filter(|a| *a != source);
        if reservation.is_some() {
            self.reservations.remove(self.step, &path);
        }
        let owner = match &recovery {
            SourceRecovery::Actor { owner, .. } => *owner,
            SourceRecovery::File { .. } => None,
        };
        self.sources.insert(
            path.clone(),
            Source::Available {
                source,
                node: source_node,
                owner,
            },
        );
        let entry = Entry::Blob {
            length,
            revision: r,
            recovery,
        };
        self.entries.insert(self.step, path.clone(), entry);
        self.record(op, key, Outcome::Committed(r));
        if let Some(a) = retired {
            self.queue_retire(a);
        }
        self.displace_runtime(&path);
        Ok(r)
    }

    /// SPEC §4.4 Resolve, with lost blobs: a blob whose source's node incarnation ended after
    /// the bind is `BlobLost`.
    pub(crate) fn resolve(&self, path: &DataPath) -> Result<BlobBinding, NamespaceError> {
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
                Some(Source::Available { source, .. }) if self.is_gone(source) => {
                    Err(NamespaceError::BlobLost(path.clone()))
                }
                Some(Source::Available {
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
                None => unreachable!("every blob has a runtime source"),
            },
        }
    }

    /// SPEC §4.4 Lookup (a reserved path answers `PathExists`, Q17), with `lost` blobs.
    pub(crate) fn lookup(&self, path: &DataPath) -> Result<NamespaceNode, NamespaceError> {
        if self.reservations.contains(path) {
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
                    Some(Source::Available { source, .. }) if self.is_gone(source)
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

    /// ARCHITECTURE "Reservations": durable, op-logged, sticky rejections; a replay answers
    /// its stored outcome and never re-creates a consumed or released reservation.
    pub(crate) fn reserve(
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
                Outcome::Rejected(x) => Err(rejection_error(x)),
                Outcome::Committed(_) => Err(NamespaceError::OperationConflict(op)),
            };
        }
        self.admit(op, false)?;
        if self.is_gone(&owner) {
            return Err(NamespaceError::PathReplaced(path));
        }
        if self.entries.contains(&path) || self.reservations.contains(&path) {
            return Err(self.reject(op, key, RejectionKind::PathExists, &path));
        }
        if self.reservations.len() >= self.limits.reservations {
            let full = RejectionKind::LimitReached(Limit::Reservations);
            return Err(self.reject(op, key, full, &path));
        }
        let reservation = Reservation {
            operation: op,
            owner,
        };
        self.reservations.insert(self.step, path, reservation);
        self.record(op, key, Outcome::Reserved);
        Ok(())
    }

    /// ARCHITECTURE "Reservations": a release of an unknown id leaves a tombstone; of an id
    /// that no longer holds the reservation, Ok and nothing changes.
    pub(crate) fn release(
        &mut self,
        path: DataPath,
        op: OperationId,
    ) -> Result<(), NamespaceError> {
        let key = RequestKey::Reserve { path: path.clone() };
        match self.operations.get(&op) {
            None => {
                self.admit(op, true)?;
                self.reject(op, key, RejectionKind::PathReplaced, &path);
                Ok(())
            }
            Some(record) if record.key != key => Err(NamespaceError::OperationConflict(op)),
            Some(_) => {
                let held = self
                    .reservations
                    .get(&path)
                    .is_some_and(|r| r.operation == op);
                if held {
                    self.reservations.remove(self.step, &path);
                }
                Ok(())
            }
        }
    }

    /// SPEC §4.4 Unregister with Q2 (replay first) and Q19 (compare-and-delete: a sticky
    /// `PathReplaced` when the entry has another revision); a live rendezvous refuses it
    /// stickily too.
    pub(crate) fn unregister(
        &mut self,
        path: DataPath,
        expected: Option<Revision>,
        op: OperationId,
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
            let live = RejectionKind::WrongEntryType {
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            };
            return Err(self.reject(op, key, live, &path));
        }
        if self.reservations.contains(&path) {
            return Err(self.reject(op, key, RejectionKind::PathExists, &path));
        }
        let Some(current) = self.entries.get(&path).map(revision_of) else {
            return Err(self.reject(op, key, RejectionKind::PathNotFound, &path));
        };
        if expected.is_some_and(|e| e != current) {
            return Err(self.reject(op, key, RejectionKind::PathReplaced, &path));
        }
        let retires = self.blob_source(&path).is_some_and(|a| !self.is_gone(&a));
        if retires && self.obligation_count() >= self.limits.obligations {
            let full = RejectionKind::LimitReached(Limit::Obligations);
            return Err(self.reject(op, key, full, &path));
        }
        let r = self.alloc();
        let retired = self.blob_source(&path);
        self.entries.remove(self.step, &path);
        self.sources.remove(&path);
        self.record(op, key, Outcome::Committed(r));
        if let Some(a) = retired {
            self.queue_retire(a);
        }
        Ok(r)
    }

    /// SPEC §4.4 Rename, in its check order (a reserved source answers `PathExists`, a
    /// rendezvous on either side `StreamActive`); renaming onto itself bumps the revision.
    pub(crate) fn rename(
        &mut self,
        src: DataPath,
        dst: DataPath,
        replace: bool,
        op: OperationId,
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
        if !self.entries.contains(&src) {
            return Err(self.reject(op, key, RejectionKind::PathNotFound, &src));
        }
        for p in [&src, &dst] {
            if self.reservations.contains(p) {
                return Err(self.reject(op, key, RejectionKind::PathExists, p));
            }
        }
        for p in [&src, &dst] {
            if self.streams.contains_key(p) {
                return Err(self.reject(op, key, RejectionKind::StreamActive, p));
            }
        }
        if src != dst && self.entries.contains(&dst) && !replace {
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
        let moved = self.entries.remove(self.step, &src).expect("checked above");
        self.entries.remove(self.step, &dst);
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
        self.entries.insert(self.step, dst, moved);
        self.record(op, key, Outcome::Committed(r));
        if let Some(a) = retired {
            self.queue_retire(a);
        }
        Ok(r)
    }

    /// Whether a retirement toward `source` is outstanding.
    pub fn is_retiring(&self, source: Address) -> bool {
        self.has_obligation(&Obligation::Retire(source))
    }
}

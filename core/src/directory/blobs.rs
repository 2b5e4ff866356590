//! Blob operations: Register, Unregister, Rename, Resolve, Lookup and reservations
//! (SPEC §4.4, with DESIGN.md §5 Q1, Q2 and Q4).
//!
//! Every mutation follows the same shape: replay check first (an operation id already in the
//! table answers its stored outcome and changes nothing), then state checks whose failures are
//! sticky rejections, then one `Committed` record, then runtime changes and notices.

use super::{Directory, Rendezvous, SourceState};
use crate::effect::Outbox;
use crate::error::{Limit, NamespaceError};
use crate::ids::{Address, NodeId, OperationId, Revision};
use crate::log::{Entry, LogRecord, Mutation, Outcome, RejectionKind, RequestKey};
use crate::path::DataPath;
use crate::wire::{BlobBinding, EntryKind, MutationReceipt, NamespaceNode, SourceRecovery};

/// The arguments of a Register.
#[derive(Clone, Debug)]
pub(super) struct RegisterArgs {
    pub path: DataPath,
    pub source: Address,
    pub source_node: NodeId,
    pub length: u64,
    pub recovery: SourceRecovery,
    pub operation: OperationId,
    pub reservation: Option<OperationId>,
}

fn receipt(outcome: Result<&Outcome, NamespaceError>) -> Result<MutationReceipt, NamespaceError> {
    match outcome? {
        Outcome::Committed(revision) => Ok(MutationReceipt {
            revision: *revision,
        }),
        Outcome::Rejected(rejection) => Err(rejection.error()),
        // A reservation id reused for a revision-allocating request has a different key and
        // never reaches here; answer conservatively anyway.
        Outcome::Reserved => Err(NamespaceError::Protocol(crate::wire::reason(
            "not a mutation",
        ))),
    }
}

impl Directory {
    /// Register (SPEC §4.4): unconditional replacement, gated by reservations.
    pub(super) fn register(
        &mut self,
        args: RegisterArgs,
        out: &mut Outbox,
    ) -> Result<MutationReceipt, NamespaceError> {
        let RegisterArgs {
            path,
            source,
            source_node,
            length,
            recovery,
            operation,
            reservation,
        } = args;
        let key = RequestKey::Register {
            path: path.clone(),
            length,
            recovery: recovery.clone(),
        };
        if let Some(stored) = self.replay(operation, &key, false) {
            // Q1: a replay displaces nothing and retires nothing.
            return receipt(stored);
        }
        if self.durable.is_gone(&source) {
            // A delayed Register from a node incarnation that has ended: its caller is gone and
            // its source can never serve, so it must not replace a live binding.
            return Err(NamespaceError::PathReplaced(path));
        }
        match (self.durable.reservation(&path), reservation) {
            (Some(held), Some(quoted)) if held.operation == quoted => {}
            (Some(_), _) => {
                return Err(self.reject(operation, key, RejectionKind::PathExists, &path, out));
            }
            (None, Some(_)) => {
                return Err(self.reject(operation, key, RejectionKind::PathReplaced, &path, out));
            }
            (None, None) => {}
        }
        let limits = self.config.limits;
        if self.durable.entry(&path).is_none() && self.durable.entry_count() >= limits.entries {
            let full = RejectionKind::LimitReached(Limit::Entries);
            return Err(self.reject(operation, key, full, &path, out));
        }
        let retires = self.live_source(&path).is_some_and(|old| old != source);
        let displaces = matches!(self.streams.get(&path), Some(Rendezvous::Active(_)));
        if (retires || displaces) && self.durable.obligation_count() >= limits.obligations {
            let full = RejectionKind::LimitReached(Limit::Obligations);
            return Err(self.reject(operation, key, full, &path, out));
        }
        let revision = self.allocate_revision()?;
        let owner = match &recovery {
            SourceRecovery::Actor { owner, .. } => *owner,
            SourceRecovery::File { .. } => None,
        };
        let binding = BlobBinding {
            source,
            source_node,
            owner,
            length,
            revision,
        };
        // One search both installs the new runtime source and yields the one to retire.
        let previous = self
            .sources
            .insert(path.clone(), SourceState::Available(binding));
        let retire = self
            .retirable(previous.as_ref())
            .filter(|old| *old != source);
        let mutation = Mutation::Register {
            path: path.clone(),
            length,
            recovery,
            reservation,
        };
        self.commit(
            LogRecord::Committed {
                operation,
                revision,
                mutation,
                retire,
            },
            out,
        );
        if let Some(old) = retire {
            self.queue_retirement(old, out);
        }
        self.displace_runtime_stream(&path, out);
        Ok(MutationReceipt { revision })
    }

    /// Unregister (SPEC §4.4; Q2: the replay check comes first; Q19: with an expected
    /// revision it deletes only that revision, else a sticky `PathReplaced`).
    pub(super) fn unregister(
        &mut self,
        path: DataPath,
        expected_revision: Option<Revision>,
        operation: OperationId,
        out: &mut Outbox,
    ) -> Result<MutationReceipt, NamespaceError> {
        let key = RequestKey::Unregister {
            path: path.clone(),
            expected_revision,
        };
        if let Some(stored) = self.replay(operation, &key, false) {
            return receipt(stored);
        }
        if self.streams.contains_key(&path) {
            // Sticky, unlike the reference: the caller was told "a stream lives here", so a
            // late copy of this Unregister must never delete the path once the stream ends.
            let live = RejectionKind::WrongEntryType {
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            };
            return Err(self.reject(operation, key, live, &path, out));
        }
        if self.durable.reservation(&path).is_some() {
            return Err(self.reject(operation, key, RejectionKind::PathExists, &path, out));
        }
        let Some(current) = self.durable.entry(&path).map(Entry::revision) else {
            return Err(self.reject(operation, key, RejectionKind::PathNotFound, &path, out));
        };
        if expected_revision.is_some_and(|expected| expected != current) {
            return Err(self.reject(operation, key, RejectionKind::PathReplaced, &path, out));
        }
        if self.live_source(&path).is_some()
            && self.durable.obligation_count() >= self.config.limits.obligations
        {
            let full = RejectionKind::LimitReached(Limit::Obligations);
            return Err(self.reject(operation, key, full, &path, out));
        }
        let revision = self.allocate_revision()?;
        let previous = self.sources.remove(&path);
        let retire = self.retirable(previous.as_ref());
        let mutation = Mutation::Unregister {
            path: path.clone(),
            expected_revision,
        };
        self.commit(
            LogRecord::Committed {
                operation,
                revision,
                mutation,
                retire,
            },
            out,
        );
        if let Some(old) = retire {
            self.queue_retirement(old, out);
        }
        Ok(MutationReceipt { revision })
    }

    /// Rename (SPEC §4.4).
    pub(super) fn rename(
        &mut self,
        source: DataPath,
        destination: DataPath,
        replace: bool,
        operation: OperationId,
        out: &mut Outbox,
    ) -> Result<MutationReceipt, NamespaceError> {
        let key = RequestKey::Rename {
            source: source.clone(),
            destination: destination.clone(),
            replace,
        };
        if let Some(stored) = self.replay(operation, &key, false) {
            return receipt(stored);
        }
        let refusal = if self.durable.entry(&source).is_none() {
            Some((RejectionKind::PathNotFound, &source))
        } else if self.durable.reservation(&source).is_some() {
            Some((RejectionKind::PathExists, &source))
        } else if self.durable.reservation(&destination).is_some() {
            Some((RejectionKind::PathExists, &destination))
        } else if self.streams.contains_key(&source) {
            Some((RejectionKind::StreamActive, &source))
        } else if self.streams.contains_key(&destination) {
            Some((RejectionKind::StreamActive, &destination))
        } else if source != destination && self.durable.entry(&destination).is_some() && !replace {
            Some((RejectionKind::PathExists, &destination))
        } else if source != destination
            && self.live_source(&destination).is_some()
            && self.durable.obligation_count() >= self.config.limits.obligations
        {
            Some((
                RejectionKind::LimitReached(Limit::Obligations),
                &destination,
            ))
        } else {
            None
        };
        if let Some((kind, path)) = refusal {
            let path = path.clone();
            return Err(self.reject(operation, key, kind, &path, out));
        }
        let revision = self.allocate_revision()?;
        let retire = if source == destination {
            None
        } else {
            self.live_source(&destination)
        };
        let mutation = Mutation::Rename {
            source: source.clone(),
            destination: destination.clone(),
            replace,
        };
        self.commit(
            LogRecord::Committed {
                operation,
                revision,
                mutation,
                retire,
            },
            out,
        );
        if source != destination {
            self.sources.remove(&destination);
        }
        if let Some(state) = self.sources.remove(&source) {
            let moved = match state {
                SourceState::Available(binding) => SourceState::Available(BlobBinding {
                    revision,
                    ..binding
                }),
                unavailable @ SourceState::Unavailable(_) => unavailable,
            };
            self.sources.insert(destination, moved);
        }
        if let Some(old) = retire {
            self.queue_retirement(old, out);
        }
        Ok(MutationReceipt { revision })
    }

    /// Resolve (SPEC §4.4): read-only. A binding whose source belongs to an ended node
    /// incarnation answers `BlobLost`: its bytes are gone, and no transfer could fetch them.
    pub(super) fn resolve(&self, path: &DataPath) -> Result<BlobBinding, NamespaceError> {
        match self.durable.entry(path) {
            Some(Entry::Stream { .. }) => Err(NamespaceError::WrongEntryType {
                path: path.clone(),
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            }),
            None => Err(NamespaceError::PathNotFound(path.clone())),
            Some(Entry::Blob { .. }) => match self.sources.get(path) {
                Some(SourceState::Available(binding)) if self.durable.is_gone(&binding.source) => {
                    Err(NamespaceError::BlobLost(path.clone()))
                }
                Some(SourceState::Available(binding)) => Ok(*binding),
                Some(SourceState::Unavailable(reason)) => {
                    Err(NamespaceError::SourceRecovery(reason.clone()))
                }
                None => Err(NamespaceError::SourceRecovery(crate::wire::reason(
                    "no runtime source for this binding",
                ))),
            },
        }
    }

    /// Whether the blob at `path` is lost: its runtime source belongs to a node incarnation
    /// that has ended (below the node's floor).
    fn is_lost(&self, path: &DataPath) -> bool {
        matches!(
            self.sources.get(path),
            Some(SourceState::Available(binding)) if self.durable.is_gone(&binding.source)
        )
    }

    /// Lookup (SPEC §4.4): read-only; a reserved path answers `PathExists`; a blob whose source
    /// belongs to an ended node incarnation is marked `lost`.
    pub(super) fn lookup(&self, path: &DataPath) -> Result<NamespaceNode, NamespaceError> {
        if self.durable.reservation(path).is_some() {
            return Err(NamespaceError::PathExists(path.clone()));
        }
        match self.durable.entry(path) {
            Some(Entry::Blob { revision, .. }) => Ok(NamespaceNode {
                kind: EntryKind::Blob,
                revision: *revision,
                active: false,
                lost: self.is_lost(path),
            }),
            Some(Entry::Stream { revision }) => Ok(NamespaceNode {
                kind: EntryKind::Stream,
                revision: *revision,
                active: self.streams.contains_key(path),
                lost: false,
            }),
            None => Err(NamespaceError::PathNotFound(path.clone())),
        }
    }

    /// ReserveBlob (DESIGN Q4): durable and op-logged; its rejections are sticky, so a late
    /// duplicate of a refused reserve can never strand a reservation nobody waits for.
    pub(super) fn reserve(
        &mut self,
        path: DataPath,
        operation: OperationId,
        owner: Address,
        out: &mut Outbox,
    ) -> Result<(), NamespaceError> {
        let key = RequestKey::Reserve { path: path.clone() };
        if let Some(stored) = self.replay(operation, &key, false) {
            return match stored? {
                Outcome::Rejected(rejection) => Err(rejection.error()),
                Outcome::Reserved | Outcome::Committed(_) => Ok(()),
            };
        }
        if self.durable.is_gone(&owner) {
            // The owner's node restarted: nobody would ever use or release this reservation.
            return Err(NamespaceError::PathReplaced(path));
        }
        if self.durable.entry(&path).is_some() || self.durable.reservation(&path).is_some() {
            return Err(self.reject(operation, key, RejectionKind::PathExists, &path, out));
        }
        if self.durable.reservation_count() >= self.config.limits.reservations {
            let full = RejectionKind::LimitReached(Limit::Reservations);
            return Err(self.reject(operation, key, full, &path, out));
        }
        self.commit(
            LogRecord::Reserved {
                operation,
                path,
                owner,
            },
            out,
        );
        Ok(())
    }

    /// ReleaseBlobReservation (DESIGN Q4): releases the reservation if `operation` still holds
    /// it; an unknown id is tombstoned so a delayed reserve with it is refused later.
    pub(super) fn release_reservation(
        &mut self,
        path: DataPath,
        operation: OperationId,
        out: &mut Outbox,
    ) -> Result<(), NamespaceError> {
        let key = RequestKey::Reserve { path: path.clone() };
        match self.replay(operation, &key, true) {
            None => {
                self.reject(operation, key, RejectionKind::PathReplaced, &path, out);
            }
            Some(Err(refusal)) => return Err(refusal),
            Some(Ok(_)) => {
                if self
                    .durable
                    .reservation(&path)
                    .is_some_and(|r| r.operation == operation)
                {
                    self.commit(LogRecord::ReservationReleased { path }, out);
                }
            }
        }
        Ok(())
    }

    /// The live source actor bound at `path`, if any: the one a replacement must retire. A
    /// source whose node incarnation was reported gone needs no retirement (its obligation
    /// would be complete the moment it was created).
    pub(super) fn live_source(&self, path: &DataPath) -> Option<Address> {
        self.retirable(self.sources.get(path))
    }

    /// The source of a runtime source state that a replacement must retire (see `live_source`).
    pub(super) fn retirable(&self, state: Option<&SourceState>) -> Option<Address> {
        match state {
            Some(SourceState::Available(binding)) if !self.durable.is_gone(&binding.source) => {
                Some(binding.source)
            }
            _ => None,
        }
    }
}

//! Stream rendezvous: open, cancel, close, displacement by Register, and replacement fences
//! (SPEC §4.5–§4.7, with DESIGN.md §5 Q3, Q11 and Q18).
//!
//! A path has at most one runtime rendezvous, never persisted:
//!
//! * `Pending` — entered when the first opener binds a fresh revision (durable node); left when
//!   the other role joins (→ `Active`), when its op is cancelled, when a same-role `replace`
//!   open or a Register displaces it (its caller hears `PathReplaced`), when its endpoint is
//!   reported gone, or on restart.
//! * `Active` — entered on a match (both callers get the same `StreamMatch`); left on
//!   `CloseStream` of its incarnation, on cancel of either op (Q11: the peer is displaced), on
//!   Register or `replace` open (both endpoints are displaced; the open waits behind a fence),
//!   when an endpoint is reported gone, or on restart.
//!
//! A **fence** exists on a path from a `replace` open over an `Active` rendezvous until every
//! old endpoint acknowledged its displacement durably; opens arriving meanwhile are held and
//! re-run in order when it resolves.

use std::collections::BTreeSet;

use super::Directory;
use crate::effect::Outbox;
use crate::error::{Limit, NamespaceError};
use crate::ids::{Address, OperationId, RequestId, Revision, StreamIncarnation};
use crate::log::{Entry, LogRecord, Mutation, Outcome, Rejection, RejectionKind, RequestKey};
use crate::path::DataPath;
use crate::wire::{
    Descriptor, DirectoryReply, EntryKind, GoneScope, Message, ReplyBody, StreamMatch, StreamRole,
};

/// One OpenStream call as the directory holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenRequest {
    /// Where the reply goes (refreshed by retries).
    pub request_id: RequestId,
    /// Where the reply goes (refreshed by retries).
    pub reply_to: Address,
    /// The stream path.
    pub path: DataPath,
    /// Writer or reader.
    pub role: StreamRole,
    /// The opener's descriptor.
    pub descriptor: Descriptor,
    /// The opener's endpoint.
    pub endpoint: Address,
    /// The replace flag.
    pub replace: bool,
    /// The ensure flag.
    pub ensure: bool,
    /// The expected node revision (non-ensure opens).
    pub expected_revision: Option<Revision>,
    /// The idempotency key.
    pub operation: OperationId,
}

/// A first opener waiting for its peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The parked call.
    pub request: OpenRequest,
    /// The revision it bound.
    pub revision: Revision,
    /// The expected revision it was opened from (non-ensure opens only).
    pub opened_from: Option<Revision>,
}

/// A matched rendezvous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Active {
    /// What both participants received.
    pub matched: StreamMatch,
    /// The writer's operation id.
    pub source_op: OperationId,
    /// The reader's operation id.
    pub sink_op: OperationId,
}

impl Active {
    fn holds(&self, operation: OperationId) -> bool {
        self.source_op == operation || self.sink_op == operation
    }

    /// The stored match if `request` is a faithful retry of one side (Q18: the role and the
    /// endpoint must be those of the side whose op it carries).
    fn answer_retry(&self, request: &OpenRequest) -> Result<StreamMatch, NamespaceError> {
        let own_op = match request.role {
            StreamRole::Source => self.source_op,
            StreamRole::Sink => self.sink_op,
        };
        if own_op == request.operation && self.matched.endpoint(request.role) == request.endpoint {
            Ok(self.matched.clone())
        } else {
            Err(NamespaceError::OperationConflict(request.operation))
        }
    }
}

/// The runtime rendezvous on one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// One side waits.
    Pending(Pending),
    /// Both sides matched.
    Active(Active),
}

/// A replacement in progress on one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The displaced incarnation.
    pub incarnation: StreamIncarnation,
    /// Its endpoints, each with a durable displacement obligation.
    pub endpoints: BTreeSet<Address>,
    /// The displaced rendezvous (absent for fences rebuilt by recovery).
    pub old: Option<Active>,
    /// Opens waiting for the fence, in arrival order.
    pub held: Vec<OpenRequest>,
}

impl Directory {
    fn answer_open(
        &self,
        request: &OpenRequest,
        result: Result<StreamMatch, NamespaceError>,
        out: &mut Outbox,
    ) {
        let reply = DirectoryReply {
            request_id: request.request_id,
            epoch: self.durable.epoch(),
            body: ReplyBody::StreamOpened(result),
        };
        out.send(request.reply_to, Message::Reply(reply));
    }

    fn is_current(&self, path: &DataPath, operation: OperationId) -> bool {
        match self.streams.get(path) {
            Some(Rendezvous::Pending(p)) => p.request.operation == operation,
            Some(Rendezvous::Active(a)) => a.holds(operation),
            None => false,
        }
    }

    /// OpenStream (SPEC §4.6). Answers through `out`, possibly much later (a first opener
    /// parks until its peer arrives).
    pub(super) fn open(&mut self, request: OpenRequest, out: &mut Outbox) {
        let path = request.path.clone();
        // An operation id already used for another request conflicts at once, fence or not
        // (S10); the reference held it behind a fence first.
        // So does an expired one, or one the tables have no room for: before a fence would
        // hold it (a held open that could never be remembered would only be refused later).
        let key = RequestKey::BindStream { path: path.clone() };
        let early = match self.durable.operation(request.operation) {
            Some(record) if record.key != key => {
                Some(NamespaceError::OperationConflict(request.operation))
            }
            Some(_) => None,
            None => self.admit(request.operation, false).err(),
        };
        if let Some(refusal) = early {
            self.answer_open(&request, Err(refusal), out);
            return;
        }
        // 1. Fence hold.
        if self.fences.contains_key(&path) {
            self.hold(request, out);
            return;
        }
        // 2. Replay: a stored rejection (e.g. a cancel tombstone) wins; a committed op whose
        //    rendezvous is gone is stale.
        if let Some(stored) = self.replay(request.operation, &key, false) {
            let refusal = match stored {
                Err(conflict) => Some(conflict),
                Ok(Outcome::Rejected(rejection)) => Some(rejection.error()),
                Ok(Outcome::Committed(revision)) => (!self.is_current(&path, request.operation))
                    .then(|| NamespaceError::StaleIncarnation {
                        path: path.clone(),
                        incarnation: StreamIncarnation {
                            epoch: self.durable.epoch(),
                            revision: *revision,
                        },
                    }),
                Ok(Outcome::Reserved) => Some(NamespaceError::OperationConflict(request.operation)),
            };
            if let Some(error) = refusal {
                self.answer_open(&request, Err(error), out);
                return;
            }
        }
        // A delayed open from an endpoint whose node restarted would park a ghost nobody can
        // retract (L1): refuse it.
        if self.durable.is_gone(&request.endpoint) {
            self.answer_open(&request, Err(NamespaceError::PathReplaced(path)), out);
            return;
        }
        // 3–4. Own retries, recognised before the expected-revision check (Q3, Q18).
        match self.streams.get_mut(&path) {
            Some(Rendezvous::Pending(p)) if p.request.operation == request.operation => {
                if p.request.role != request.role || p.request.endpoint != request.endpoint {
                    let conflict = NamespaceError::OperationConflict(request.operation);
                    self.answer_open(&request, Err(conflict), out);
                } else {
                    // The eventual match goes to the newest dispatch.
                    p.request.request_id = request.request_id;
                    p.request.reply_to = request.reply_to;
                }
                return;
            }
            Some(Rendezvous::Active(a)) if a.holds(request.operation) => {
                let result = a.answer_retry(&request);
                self.answer_open(&request, result, out);
                return;
            }
            _ => {}
        }
        // 5. Expected revision (non-ensure opens only).
        // From here on the operation id is unknown, so every refusal is persisted: a caller
        // told "refused" must be able to rely on a late copy of its open never binding.
        if !request.ensure {
            let refusal = match self.durable.entry(&path) {
                None => Some(RejectionKind::PathNotFound),
                Some(Entry::Blob { .. }) => Some(RejectionKind::WrongEntryType {
                    expected: EntryKind::Stream,
                    found: EntryKind::Blob,
                }),
                Some(Entry::Stream { revision }) => {
                    // Two peers that both observed revision e may match although the first
                    // one's bind moved the node on. Only a named revision qualifies (the
                    // reference also let `None` match an ensure-opened pending).
                    let joins_pending = request.expected_revision.is_some()
                        && matches!(
                            self.streams.get(&path),
                            Some(Rendezvous::Pending(p))
                                if p.opened_from == request.expected_revision
                        );
                    (request.expected_revision != Some(*revision) && !joins_pending)
                        .then_some(RejectionKind::PathReplaced)
                }
            };
            if let Some(kind) = refusal {
                self.refuse_open(&request, kind, out);
                return;
            }
        }
        // 6–7. Replace.
        if request.replace {
            match self.streams.get(&path) {
                Some(Rendezvous::Active(_)) => {
                    let limits = self.config.limits;
                    let full = if self.fences.len() >= limits.fences {
                        Some(Limit::Fences)
                    } else if self.durable.obligation_count() >= limits.obligations {
                        Some(Limit::Obligations)
                    } else {
                        None
                    };
                    if let Some(limit) = full {
                        self.refuse_open(&request, RejectionKind::LimitReached(limit), out);
                        return;
                    }
                    if let Some(Rendezvous::Active(old)) = self.streams.remove(&path) {
                        self.begin_fence(request, old, out);
                    }
                    return;
                }
                Some(Rendezvous::Pending(p)) if p.request.role == request.role => {
                    if let Some(Rendezvous::Pending(p)) = self.streams.remove(&path) {
                        let displaced = NamespaceError::PathReplaced(path.clone());
                        self.answer_open(&p.request, Err(displaced), out);
                    }
                }
                _ => {}
            }
        }
        // 8–9. Match, or refuse a second holder of a role.
        match self.streams.get(&path) {
            Some(Rendezvous::Pending(p)) if p.request.role != request.role => {
                self.join(request, out);
                return;
            }
            Some(_) => {
                let duplicate = RejectionKind::DuplicateStreamRole(request.role);
                self.refuse_open(&request, duplicate, out);
                return;
            }
            None => {}
        }
        // 10. A blob is only rebound as a stream when asked to.
        if !request.replace && matches!(self.durable.entry(&path), Some(Entry::Blob { .. })) {
            let wrong = RejectionKind::WrongEntryType {
                expected: EntryKind::Stream,
                found: EntryKind::Blob,
            };
            self.refuse_open(&request, wrong, out);
            return;
        }
        // 11. Bind.
        self.bind(request, out);
    }

    /// Refuses an open whose operation id is unknown, for good: the rejection is persisted
    /// under the id, so a duplicate or late copy answers the same and never binds.
    fn refuse_open(&mut self, request: &OpenRequest, kind: RejectionKind, out: &mut Outbox) {
        let key = RequestKey::BindStream {
            path: request.path.clone(),
        };
        let error = self.reject(request.operation, key, kind, &request.path, out);
        self.answer_open(request, Err(error), out);
    }

    fn bind(&mut self, request: OpenRequest, out: &mut Outbox) {
        let path = request.path.clone();
        let operation = request.operation;
        if self.durable.reservation(&path).is_some() {
            self.refuse_open(&request, RejectionKind::PathExists, out);
            return;
        }
        let limits = self.config.limits;
        let full = if self.streams.len() >= limits.rendezvous {
            Some(Limit::Rendezvous)
        } else if self.durable.entry(&path).is_none()
            && self.durable.entry_count() >= limits.entries
        {
            Some(Limit::Entries)
        } else if self.live_source(&path).is_some()
            && self.durable.obligation_count() >= limits.obligations
        {
            Some(Limit::Obligations)
        } else {
            None
        };
        if let Some(limit) = full {
            self.refuse_open(&request, RejectionKind::LimitReached(limit), out);
            return;
        }
        let revision = match self.allocate_revision() {
            Ok(revision) => revision,
            Err(error) => {
                self.answer_open(&request, Err(error), out);
                return;
            }
        };
        let retire = self.live_source(&path);
        self.sources.remove(&path);
        let mutation = Mutation::BindStream { path: path.clone() };
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
        let opened_from = if request.ensure {
            None
        } else {
            request.expected_revision
        };
        let pending = Pending {
            request,
            revision,
            opened_from,
        };
        self.streams.insert(path, Rendezvous::Pending(pending));
    }

    fn join(&mut self, request: OpenRequest, out: &mut Outbox) {
        let path = request.path.clone();
        let Some(Rendezvous::Pending(waiting)) = self.streams.remove(&path) else {
            unreachable!("join is only called with a pending rendezvous of the other role")
        };
        let revision = waiting.revision;
        let joined = LogRecord::Joined {
            operation: request.operation,
            path: path.clone(),
            revision,
        };
        self.commit(joined, out);
        let (source, sink) = match waiting.request.role {
            StreamRole::Source => (&waiting.request, &request),
            StreamRole::Sink => (&request, &waiting.request),
        };
        let matched = StreamMatch {
            incarnation: StreamIncarnation {
                epoch: self.durable.epoch(),
                revision,
            },
            source: source.endpoint,
            source_descriptor: source.descriptor.clone(),
            sink: sink.endpoint,
            sink_descriptor: sink.descriptor.clone(),
            revision,
        };
        let active = Active {
            matched: matched.clone(),
            source_op: source.operation,
            sink_op: sink.operation,
        };
        self.answer_open(&waiting.request, Ok(matched.clone()), out);
        self.answer_open(&request, Ok(matched), out);
        self.streams.insert(path, Rendezvous::Active(active));
    }

    /// A `replace` open over an active rendezvous: both endpoints get durable displacement
    /// obligations and notices; the open waits behind a fence (SPEC §4.6.2).
    fn begin_fence(&mut self, request: OpenRequest, old: Active, out: &mut Outbox) {
        let path = request.path.clone();
        let incarnation = old.matched.incarnation;
        let endpoints: BTreeSet<Address> = [old.matched.source, old.matched.sink].into();
        for endpoint in &endpoints {
            self.queue_displacement(*endpoint, incarnation, Some(path.clone()), out);
        }
        let fence = Fence {
            incarnation,
            endpoints,
            old: Some(old),
            held: vec![request],
        };
        self.fences.insert(path, fence);
    }

    /// An open that arrives while a fence stands on its path.
    fn hold(&mut self, request: OpenRequest, out: &mut Outbox) {
        let Some(fence) = self.fences.get_mut(&request.path) else {
            return;
        };
        if let Some(old) = fence
            .old
            .as_ref()
            .filter(|old| old.holds(request.operation))
        {
            // A retry from an old participant gets its old match back (or a conflict).
            let result = old.answer_retry(&request);
            self.answer_open(&request, result, out);
            return;
        }
        let same_call = |h: &OpenRequest| {
            h.operation == request.operation
                && h.role == request.role
                && h.endpoint == request.endpoint
        };
        if let Some(held) = fence.held.iter_mut().find(|h| same_call(h)) {
            *held = request;
            return;
        }
        if fence.held.len() >= self.config.limits.fence_held_opens {
            let full = RejectionKind::LimitReached(Limit::FenceHeldOpens);
            if self.durable.operation(request.operation).is_none() {
                self.refuse_open(&request, full, out);
            } else {
                // A known id (a replay, a tombstone) keeps its stored outcome.
                let error = Rejection {
                    kind: full,
                    path: request.path.clone(),
                }
                .error();
                self.answer_open(&request, Err(error), out);
            }
            return;
        }
        fence.held.push(request);
    }

    /// Removes every fence whose endpoints all completed their displacement for the fence's
    /// incarnation, and re-runs its held opens in order.
    pub(super) fn resume_fences(&mut self, out: &mut Outbox) {
        let ready: Vec<DataPath> = self
            .fences
            .iter()
            .filter(|(_, fence)| {
                fence
                    .endpoints
                    .iter()
                    .all(|endpoint| !self.durable.is_displacing(*endpoint, fence.incarnation))
            })
            .map(|(path, _)| path.clone())
            .collect();
        for path in ready {
            if let Some(fence) = self.fences.remove(&path) {
                for request in fence.held {
                    self.open(request, out);
                }
            }
        }
    }

    /// CancelStream (SPEC §4.7, Q11).
    pub(super) fn cancel(
        &mut self,
        path: DataPath,
        operation: OperationId,
        out: &mut Outbox,
    ) -> Result<(), NamespaceError> {
        let key = RequestKey::BindStream { path: path.clone() };
        match self.replay(operation, &key, true) {
            None => {
                // Tombstone: a late or reordered open with this id is refused.
                self.reject(operation, key, RejectionKind::PathReplaced, &path, out);
            }
            // An expired id needs no tombstone: its opens are refused anyway, and none of
            // them is a rendezvous (a horizon never passes a live one).
            Some(Err(refusal)) => return Err(refusal),
            Some(Ok(_)) => {}
        }
        match self.streams.get(&path) {
            Some(Rendezvous::Pending(p)) if p.request.operation == operation => {
                self.streams.remove(&path);
            }
            Some(Rendezvous::Active(a)) if a.holds(operation) => {
                // Q11: the canceller's match may have been in flight; the incarnation ends and
                // the peer is displaced.
                if let Some(Rendezvous::Active(a)) = self.streams.remove(&path) {
                    let peer = if a.source_op == operation {
                        a.matched.sink
                    } else {
                        a.matched.source
                    };
                    self.queue_displacement(peer, a.matched.incarnation, None, out);
                }
            }
            _ => {}
        }
        if let Some(fence) = self.fences.get_mut(&path) {
            fence.held.retain(|h| h.operation != operation);
        }
        Ok(())
    }

    /// CloseStream (SPEC §4.7): idempotent within one authority epoch.
    pub(super) fn close(
        &mut self,
        path: DataPath,
        incarnation: StreamIncarnation,
    ) -> Result<(), NamespaceError> {
        let stale = || NamespaceError::StaleIncarnation {
            path: path.clone(),
            incarnation,
        };
        match self.streams.get(&path) {
            Some(Rendezvous::Active(a)) if a.matched.incarnation == incarnation => {
                self.streams.remove(&path);
                Ok(())
            }
            Some(_) => Err(stale()),
            None => {
                let node_matches = matches!(
                    self.durable.entry(&path),
                    Some(Entry::Stream { revision }) if *revision == incarnation.revision
                );
                if incarnation.epoch == self.durable.epoch() && node_matches {
                    Ok(())
                } else {
                    Err(stale())
                }
            }
        }
    }

    /// A fresh Register over a stream path (SPEC §4.6.1): a pending opener hears
    /// `PathReplaced`; an active rendezvous's endpoints are displaced (no fence: the path is a
    /// blob now).
    pub(super) fn displace_runtime_stream(&mut self, path: &DataPath, out: &mut Outbox) {
        match self.streams.remove(path) {
            Some(Rendezvous::Pending(p)) => {
                self.answer_open(
                    &p.request,
                    Err(NamespaceError::PathReplaced(path.clone())),
                    out,
                );
            }
            Some(Rendezvous::Active(a)) => {
                let incarnation = a.matched.incarnation;
                let endpoints: BTreeSet<Address> = [a.matched.source, a.matched.sink].into();
                for endpoint in endpoints {
                    self.queue_displacement(endpoint, incarnation, None, out);
                }
            }
            None => {}
        }
    }

    /// The stream side of an `AddressGone` report: rendezvous and held opens whose endpoint
    /// is gone end (a surviving peer is displaced; a waiting caller hears `PathReplaced`).
    pub(super) fn end_gone_streams(&mut self, scope: &GoneScope, out: &mut Outbox) {
        // A node that restarted also ends the rendezvous its earlier incarnations opened
        // (their records were pruned with the floor, and nobody there can close them).
        let node_report = matches!(scope, GoneScope::NodeBefore { .. });
        let ended = |op: OperationId| node_report && self.durable.is_issuer_gone(op.issuer());
        let affected: Vec<DataPath> = self
            .streams
            .iter()
            .filter(|(_, r)| match r {
                Rendezvous::Pending(p) => {
                    scope.covers(&p.request.endpoint) || ended(p.request.operation)
                }
                Rendezvous::Active(a) => {
                    scope.covers(&a.matched.source)
                        || scope.covers(&a.matched.sink)
                        || ended(a.source_op)
                        || ended(a.sink_op)
                }
            })
            .map(|(path, _)| path.clone())
            .collect();
        for path in affected {
            match self.streams.remove(&path) {
                Some(Rendezvous::Pending(p)) => {
                    self.answer_open(&p.request, Err(NamespaceError::PathReplaced(path)), out);
                }
                Some(Rendezvous::Active(a)) => {
                    let incarnation = a.matched.incarnation;
                    let survivors: BTreeSet<Address> = [a.matched.source, a.matched.sink]
                        .into_iter()
                        .filter(|e| !scope.covers(e))
                        .collect();
                    for endpoint in survivors {
                        self.queue_displacement(endpoint, incarnation, None, out);
                    }
                }
                None => {}
            }
        }
        let mut dropped = Vec::new();
        let durable = &self.durable;
        for fence in self.fences.values_mut() {
            let (gone, kept): (Vec<_>, Vec<_>) = fence.held.drain(..).partition(|h| {
                scope.covers(&h.endpoint)
                    || node_report && durable.is_issuer_gone(h.operation.issuer())
            });
            fence.held = kept;
            dropped.extend(gone);
        }
        for request in dropped {
            let replaced = NamespaceError::PathReplaced(request.path.clone());
            self.answer_open(&request, Err(replaced), out);
        }
    }
}

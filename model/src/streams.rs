//! Stream rendezvous (SPEC §4.5–§4.7 with Q3, Q11, Q18, fences and node floors) and gone
//! reports (ARCHITECTURE "Addresses and gone reports", "Node incarnation floors").

use std::collections::BTreeSet;

use dataplane_core::error::{Limit, NamespaceError};
use dataplane_core::ids::{Address, Issuer, OperationId, StreamIncarnation};
use dataplane_core::log::{Entry, Outcome, RejectionKind, RequestKey};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{EntryKind, GoneScope, ReplyBody, StreamMatch, StreamRole};

use crate::rules::{covers, endpoint_of, issuer_of, peer_of, rejection_error};
use crate::{Active, Caller, Fence, Model, Obligation, OpenArgs, Pending, Rendezvous};

fn opened(result: Result<StreamMatch, NamespaceError>) -> ReplyBody {
    ReplyBody::StreamOpened(result)
}

impl Model {
    fn is_current(&self, path: &DataPath, op: OperationId) -> bool {
        match self.streams.get(path) {
            Some(Rendezvous::Pending(p)) => p.op == op,
            Some(Rendezvous::Active(a)) => a.role_of(op).is_some(),
            None => false,
        }
    }

    /// The answer to a retry of one side of `active`: its match if role and endpoint are the
    /// side's, else a conflict.
    fn retry_answer(active: &Active, args: &OpenArgs) -> ReplyBody {
        let role = active.role_of(args.op);
        let own = role
            .is_some_and(|r| r == args.role && endpoint_of(&active.matched, r) == args.endpoint);
        if own {
            opened(Ok(active.matched.clone()))
        } else {
            opened(Err(NamespaceError::OperationConflict(args.op)))
        }
    }

    /// A sticky refusal of an open.
    fn refuse_open(&mut self, caller: Caller, args: &OpenArgs, kind: RejectionKind) {
        let key = RequestKey::BindStream {
            path: args.path.clone(),
        };
        let error = self.reject(args.op, key, kind, &args.path);
        self.reply(caller, opened(Err(error)));
    }

    /// SPEC §4.6 in its order, with the decisions of ARCHITECTURE "Streams".
    pub(crate) fn open(&mut self, caller: Caller, args: OpenArgs) {
        let path = args.path.clone();
        let key = RequestKey::BindStream { path: path.clone() };
        // 0. An id used for another request conflicts at once, even on a fenced path; an
        //    unknown one must be admissible (not expired, room in the tables).
        let early = match self.operations.get(&args.op) {
            Some(record) if record.key != key => Err(NamespaceError::OperationConflict(args.op)),
            Some(_) => Ok(()),
            None => self.admit(args.op, false),
        };
        if let Err(e) = early {
            if matches!(e, NamespaceError::OperationExpired(_)) {
                self.note("retention.refused_expired");
            }
            self.reply(caller, opened(Err(e)));
            return;
        }
        // 1. Fence hold.
        if let Some(fence) = self.fences.get_mut(&path) {
            if let Some(old) = &fence.old
                && old.role_of(args.op).is_some()
            {
                let body = Self::retry_answer(old, &args);
                self.reply(caller, body);
                return;
            }
            let same = |h: &OpenArgs| {
                h.op == args.op && h.role == args.role && h.endpoint == args.endpoint
            };
            if let Some(slot) = fence.held.iter_mut().find(|(_, h)| same(h)) {
                *slot = (caller, args);
            } else if fence.held.len() >= self.limits.fence_held_opens {
                let full = Limit::FenceHeldOpens;
                if self.operations.contains(&args.op) {
                    self.reply(caller, opened(Err(NamespaceError::LimitReached(full))));
                } else {
                    self.refuse_open(caller, &args, RejectionKind::LimitReached(full));
                }
            } else {
                fence.held.push((caller, args));
            }
            return;
        }
        // 2. Replay: a stored refusal wins (the cancel tombstone over a late open); a
        //    committed op that is no longer current is stale.
        if let Some(record) = self.operations.get(&args.op) {
            match &record.outcome {
                Outcome::Rejected(x) => {
                    let error = rejection_error(x);
                    self.note("stream.open_refused_by_stored_rejection");
                    self.reply(caller, opened(Err(error)));
                    return;
                }
                Outcome::Committed(r) if !self.is_current(&path, args.op) => {
                    let incarnation = StreamIncarnation {
                        epoch: self.epoch(),
                        revision: *r,
                    };
                    let stale = NamespaceError::StaleIncarnation {
                        path: path.clone(),
                        incarnation,
                    };
                    self.reply(caller, opened(Err(stale)));
                    return;
                }
                Outcome::Committed(_) => {}
                Outcome::Reserved => unreachable!("a reserve never has a BindStream key"),
            }
        }
        // Node floors: a late open from an ended incarnation (not sticky).
        if self.is_gone(&args.endpoint) {
            self.note("stream.open_from_gone_node");
            self.reply(caller, opened(Err(NamespaceError::PathReplaced(path))));
            return;
        }
        // 3. Own pending / active retry (Q3, Q18).
        match self.streams.get_mut(&path) {
            Some(Rendezvous::Pending(p)) if p.op == args.op => {
                if p.role != args.role || p.endpoint != args.endpoint {
                    let conflict = NamespaceError::OperationConflict(args.op);
                    self.reply(caller, opened(Err(conflict)));
                } else {
                    p.caller = caller;
                }
                return;
            }
            Some(Rendezvous::Active(a)) if a.role_of(args.op).is_some() => {
                let body = Self::retry_answer(a, &args);
                self.reply(caller, body);
                return;
            }
            _ => {}
        }
        // 4. Expected revision (non-ensure opens): an existing node at the named revision, or
        //    a pending opened from it.
        if !args.ensure {
            let refusal = match self.entries.get(&path) {
                None => Some(RejectionKind::PathNotFound),
                Some(Entry::Blob { .. }) => Some(RejectionKind::WrongEntryType {
                    expected: EntryKind::Stream,
                    found: EntryKind::Blob,
                }),
                Some(Entry::Stream { revision }) => {
                    let from_pending = args.expected.is_some()
                        && matches!(self.streams.get(&path),
                            Some(Rendezvous::Pending(p)) if p.opened_from == args.expected);
                    (args.expected != Some(*revision) && !from_pending)
                        .then_some(RejectionKind::PathReplaced)
                }
            };
            if let Some(kind) = refusal {
                self.refuse_open(caller, &args, kind);
                return;
            }
        }
        // 5. Replace an active rendezvous: fence it (room for a fence and obligations first).
        if args.replace {
            if let Some(Rendezvous::Active(_)) = self.streams.get(&path) {
                let full = if self.fences.len() >= self.limits.fences {
                    Some(Limit::Fences)
                } else if self.obligation_count() >= self.limits.obligations {
                    Some(Limit::Obligations)
                } else {
                    None
                };
                if let Some(l) = full {
                    self.refuse_open(caller, &args, RejectionKind::LimitReached(l));
                    return;
                }
                let Some(Rendezvous::Active(a)) = self.streams.remove(&path) else {
                    unreachable!("matched above")
                };
                let inc = a.matched.incarnation;
                let endpoints = a.endpoints();
                for e in &endpoints {
                    self.queue_displace(*e, inc, Some(path.clone()));
                }
                self.note("stream.fence_begun");
                self.fences.insert(
                    path,
                    Fence {
                        incarnation: inc,
                        endpoints: endpoints.into_iter().collect(),
                        old: Some(a),
                        held: vec![(caller, args)],
                    },
                );
                return;
            }
            // 6. Replace a pending of the same role: its caller hears PathReplaced.
            if matches!(self.streams.get(&path), Some(Rendezvous::Pending(p)) if p.role == args.role)
            {
                let Some(Rendezvous::Pending(p)) = self.streams.remove(&path) else {
                    unreachable!("matched above")
                };
                let replaced = NamespaceError::PathReplaced(path.clone());
                self.reply(p.caller, opened(Err(replaced)));
            }
        }
        // 7. Match, or refuse a duplicate role.
        match self.streams.get(&path) {
            Some(Rendezvous::Pending(p)) if p.role == args.role => {
                self.refuse_open(caller, &args, RejectionKind::DuplicateStreamRole(args.role));
                return;
            }
            Some(Rendezvous::Pending(_)) => {
                let Some(Rendezvous::Pending(p)) = self.streams.remove(&path) else {
                    unreachable!("matched above")
                };
                self.record(args.op, key, Outcome::Committed(p.revision));
                let (source, sink) = if p.role == StreamRole::Source {
                    (
                        (p.endpoint, &p.descriptor, p.op),
                        (args.endpoint, &args.descriptor, args.op),
                    )
                } else {
                    (
                        (args.endpoint, &args.descriptor, args.op),
                        (p.endpoint, &p.descriptor, p.op),
                    )
                };
                let matched = StreamMatch {
                    incarnation: StreamIncarnation {
                        epoch: self.epoch(),
                        revision: p.revision,
                    },
                    source: source.0,
                    source_descriptor: source.1.clone(),
                    sink: sink.0,
                    sink_descriptor: sink.1.clone(),
                    revision: p.revision,
                };
                let active = Active {
                    matched: matched.clone(),
                    source_op: source.2,
                    sink_op: sink.2,
                };
                self.reply(p.caller, opened(Ok(matched.clone())));
                self.reply(caller, opened(Ok(matched)));
                self.streams.insert(path, Rendezvous::Active(active));
                return;
            }
            Some(Rendezvous::Active(_)) => {
                self.refuse_open(caller, &args, RejectionKind::DuplicateStreamRole(args.role));
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
            self.refuse_open(caller, &args, wrong);
            return;
        }
        // 9. Bind: a reserved path refuses; room for a rendezvous, an entry, an obligation.
        if self.reservations.contains(&path) {
            self.refuse_open(caller, &args, RejectionKind::PathExists);
            return;
        }
        let full = if self.streams.len() >= self.limits.rendezvous {
            Some(Limit::Rendezvous)
        } else if !self.entries.contains(&path) && self.entries.len() >= self.limits.entries {
            Some(Limit::Entries)
        } else if self.blob_source(&path).is_some_and(|a| !self.is_gone(&a))
            && self.obligation_count() >= self.limits.obligations
        {
            Some(Limit::Obligations)
        } else {
            None
        };
        if let Some(l) = full {
            self.refuse_open(caller, &args, RejectionKind::LimitReached(l));
            return;
        }
        let r = self.alloc();
        let retired = self.blob_source(&path);
        self.sources.remove(&path);
        self.entries
            .insert(self.step, path.clone(), Entry::Stream { revision: r });
        self.record(args.op, key, Outcome::Committed(r));
        if let Some(a) = retired {
            self.queue_retire(a);
        }
        let opened_from = if args.ensure { None } else { args.expected };
        self.streams.insert(
            path,
            Rendezvous::Pending(Pending {
                role: args.role,
                endpoint: args.endpoint,
                descriptor: args.descriptor,
                op: args.op,
                caller,
                revision: r,
                opened_from,
            }),
        );
    }

    /// SPEC §4.7 CancelStream with Q11 (a side of an active rendezvous ends it and displaces
    /// the peer) and the conflict decision; an unknown id leaves a tombstone.
    pub(crate) fn cancel(&mut self, path: DataPath, op: OperationId) -> Result<(), NamespaceError> {
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
            Some(Rendezvous::Pending(p)) if p.op == op => {
                self.streams.remove(&path);
            }
            Some(Rendezvous::Active(a)) if a.role_of(op).is_some() => {
                let role = a.role_of(op).expect("checked");
                let peer = endpoint_of(&a.matched, peer_of(role));
                let inc = a.matched.incarnation;
                self.streams.remove(&path);
                self.note("stream.cancel_active");
                self.queue_displace(peer, inc, None);
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
    pub(crate) fn close(
        &mut self,
        path: DataPath,
        inc: StreamIncarnation,
    ) -> Result<(), NamespaceError> {
        let closed_here = inc.epoch == self.epoch()
            && self.entries.get(&path)
                == Some(&Entry::Stream {
                    revision: inc.revision,
                });
        match self.streams.get(&path) {
            Some(Rendezvous::Active(a)) if a.matched.incarnation == inc => {
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

    /// Resumes every fence whose endpoints no longer owe a displacement for its incarnation:
    /// its held opens run again, in order.
    pub(crate) fn resume_fences(&mut self) {
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
            let fence = self.fences.remove(&p).expect("listed above");
            self.note("stream.fence_resolved");
            for (caller, args) in fence.held {
                self.open(caller, args);
            }
        }
    }

    /// `AddressGone{scope}` from `reply_to`: a node report raises the node's floor (expiring
    /// everything its ended incarnations issued); obligations toward covered addresses
    /// complete, their reservations go, rendezvous with a covered endpoint (or, for a node
    /// report, opened by an ended incarnation's caller) end, held opens from them are dropped
    /// with `PathReplaced`; then fences may resume, and the report is acknowledged.
    pub fn address_gone(&mut self, step: u64, scope: GoneScope, reply_to: Address) {
        self.step = step;
        let node_report = matches!(scope, GoneScope::NodeBefore { .. });
        if let GoneScope::NodeBefore { node, incarnation } = scope
            && incarnation > self.floors.get(&node).copied().unwrap_or(0)
        {
            self.floors.insert(step, node, incarnation);
            self.note("retention.floor_pruned");
        }
        self.prune();
        let completed: Vec<Obligation> = self
            .obligations
            .map()
            .keys()
            .filter(|o| covers(&scope, &o.target()))
            .copied()
            .collect();
        for obligation in completed {
            self.remove_obligation(&obligation);
        }
        self.forget_unwatched();
        let released: Vec<DataPath> = self
            .reservations
            .map()
            .iter()
            .filter(|(_, r)| covers(&scope, &r.owner))
            .map(|(p, _)| p.clone())
            .collect();
        for p in released {
            self.reservations.remove(step, &p);
        }
        self.prune();
        // A restarted node also ends what its earlier incarnations' callers opened.
        let ended = |m: &Model, op: OperationId| node_report && m.issuer_gone(issuer_of(op));
        let paths: Vec<DataPath> = self.streams.keys().cloned().collect();
        for path in paths {
            match self.streams.get(&path) {
                Some(Rendezvous::Pending(p))
                    if covers(&scope, &p.endpoint) || ended(self, p.op) =>
                {
                    let caller = p.caller;
                    self.streams.remove(&path);
                    let replaced = NamespaceError::PathReplaced(path.clone());
                    self.reply(caller, opened(Err(replaced)));
                }
                Some(Rendezvous::Active(a))
                    if covers(&scope, &a.matched.source)
                        || covers(&scope, &a.matched.sink)
                        || ended(self, a.source_op)
                        || ended(self, a.sink_op) =>
                {
                    let a = a.clone();
                    self.streams.remove(&path);
                    for e in a.endpoints() {
                        if !covers(&scope, &e) {
                            self.queue_displace(e, a.matched.incarnation, None);
                        }
                    }
                }
                _ => {}
            }
        }
        // Held opens from covered endpoints are dropped; their callers hear PathReplaced, like
        // the callers of ended pending rendezvous.
        let gone_issuers: BTreeSet<Issuer> = self
            .fences
            .values()
            .flat_map(|f| f.held.iter().map(|(_, h)| issuer_of(h.op)))
            .filter(|i| node_report && self.issuer_gone(*i))
            .collect();
        let mut dropped = Vec::new();
        for (path, fence) in self.fences.iter_mut() {
            fence.held.retain(|(caller, h)| {
                let gone = covers(&scope, &h.endpoint) || gone_issuers.contains(&issuer_of(h.op));
                if gone {
                    dropped.push((*caller, path.clone()));
                }
                !gone
            });
        }
        for (caller, path) in dropped {
            self.reply(caller, opened(Err(NamespaceError::PathReplaced(path))));
        }
        self.out.gone_acks.push((reply_to, scope));
        self.resume_fences();
    }
}

//! The namespace directory: the single authority over blobs and streams under paths
//! (SPEC §3–§4, with the decisions of DESIGN.md §5).
//!
//! # Driving it
//!
//! Build one with [`Directory::recover`] from the durable records (an empty slice for a new
//! store); that call already emits the first effects: the `Persist` of the new authority epoch
//! (a barrier: nothing the directory says is released before its epoch is durable), the retry
//! timer, route watches and the first retry pass. Then feed it:
//!
//! * [`Directory::handle_message`] for every frame addressed to it,
//! * [`Directory::handle_timer`] when [`Timer::DirectoryRetry`] fires,
//! * [`Directory::handle_route`] for route reports of watched targets,
//!
//! and execute the effects each call appends, in order, honouring the `Persist` barrier. If a
//! `Persist` cannot be made durable, drop the machine and recover a new one from the log.
//!
//! # Determinism
//!
//! All state lives in `BTreeMap`s and counters; iteration is in key order; the retry rotation
//! is seeded in persisted order. Identical inputs give byte-identical effects.

mod blobs;
mod durable;
mod obligations;
mod recovery;
mod streams;

use std::collections::BTreeMap;

pub use durable::{ApplyError, DurableState, IssuerRow, ObligationKey};
pub use recovery::{ActorSources, RecoveredSource, RecoveryError, SourceRecoveryHook};
pub use streams::{Active, Fence, OpenRequest, Pending, Rendezvous};

use crate::effect::{Effect, Outbox, Timer};
pub use crate::error::InputError;
use crate::error::{Limit, NamespaceError, Reason};
use crate::ids::{Address, AuthorityEpoch, Issuer, OperationId, Revision};
use crate::log::{LogRecord, Outcome, Rejection, RejectionKind, RequestKey, SnapshotRecordRef};
use crate::path::DataPath;
use crate::time::{Duration, Instant};
use crate::wire::{
    BlobBinding, DirectoryCall, DirectoryReply, DirectoryRequest, GoneScope, Message, ReplyBody,
};
use obligations::Engine;

/// How a directory is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryConfig {
    /// The directory's own address (the `reply_to` of Retire and Displaced).
    pub address: Address,
    /// Period of the obligation retry tick.
    pub retry_period: Duration,
    /// The bound of every table (the constants of [`crate::limits`] by default; tests shrink
    /// them to reach the refusals).
    pub limits: DirectoryLimits,
}

impl DirectoryConfig {
    /// A configuration with the reference's one-second retry tick and the default limits.
    pub fn new(address: Address) -> Self {
        DirectoryConfig {
            address,
            retry_period: Duration::from_secs(1),
            limits: DirectoryLimits::default(),
        }
    }
}

/// The bound of every directory table. A request that would grow a table past its bound is
/// refused `LimitReached`: sticky (persisted under its operation id) for the namespace tables,
/// without a trace for the operation and issuer tables (they are where a refusal would be
/// remembered). Limits are checked by the live directory only; recovery accepts any state
/// the log holds, so a limit may be lowered across a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectoryLimits {
    /// Operation records ([`crate::limits::OPERATIONS_MAX`]; retractions: twice).
    pub operations: usize,
    /// Operation records of one issuer ([`crate::limits::ISSUER_OPERATIONS_MAX`];
    /// retractions: twice).
    pub issuer_operations: usize,
    /// Issuer rows ([`crate::limits::ISSUERS_MAX`]; retractions: twice).
    pub issuers: usize,
    /// Namespace entries ([`crate::limits::ENTRIES_MAX`]).
    pub entries: usize,
    /// Obligations new work may add to ([`crate::limits::OBLIGATIONS_MAX`]).
    pub obligations: usize,
    /// Runtime rendezvous ([`crate::limits::RENDEZVOUS_MAX`]).
    pub rendezvous: usize,
    /// Replacement fences ([`crate::limits::FENCES_MAX`]).
    pub fences: usize,
    /// Live reservations ([`crate::limits::RESERVATIONS_MAX`]).
    pub reservations: usize,
    /// Opens one fence holds ([`crate::limits::FENCE_HELD_OPENS_MAX`]).
    pub fence_held_opens: usize,
    /// Obligation frames one retry pass sends ([`crate::limits::RETRY_BATCH_MAX`]; at least
    /// one). The simulator draws it small in some seeds so that storms of more obligations
    /// than a pass sends are common (issue 15, class 9).
    pub retry_batch: usize,
}

impl Default for DirectoryLimits {
    fn default() -> Self {
        use crate::limits::*;
        DirectoryLimits {
            operations: OPERATIONS_MAX,
            issuer_operations: ISSUER_OPERATIONS_MAX,
            issuers: ISSUERS_MAX,
            entries: ENTRIES_MAX,
            obligations: OBLIGATIONS_MAX,
            rendezvous: RENDEZVOUS_MAX,
            fences: FENCES_MAX,
            reservations: RESERVATIONS_MAX,
            fence_held_opens: FENCE_HELD_OPENS_MAX,
            retry_batch: RETRY_BATCH_MAX,
        }
    }
}

/// The runtime source of a blob binding (volatile; rebuilt by recovery).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceState {
    /// A live source; resolves return this binding.
    Available(BlobBinding),
    /// The binding exists but no source could be recovered.
    Unavailable(Reason),
}

/// The directory state machine. See the module documentation for the driving contract.
#[derive(Clone, Debug)]
pub struct Directory {
    config: DirectoryConfig,
    durable: DurableState,
    sources: BTreeMap<DataPath, SourceState>,
    streams: BTreeMap<DataPath, Rendezvous>,
    fences: BTreeMap<DataPath, Fence>,
    engine: Engine,
    /// Set while the directory's disk has no room for new records ([`Directory::set_no_space`]):
    /// why, in words for the caller.
    no_space: Option<Reason>,
}

impl Directory {
    /// Handles one frame addressed to the directory.
    pub fn handle_message(
        &mut self,
        now: Instant,
        message: Message,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        let _ = now;
        match message {
            Message::Call(call) => self.handle_call(call, out),
            Message::SourceRetired { source } => self.source_retired(source, out),
            Message::StreamDisplaced {
                endpoint,
                incarnation,
            } => {
                self.stream_displaced(endpoint, incarnation, out);
            }
            Message::AddressGone { scope, reply_to } => {
                if let GoneScope::NodeBefore { node, incarnation } = scope
                    && incarnation > self.durable.node_floor(node)
                {
                    self.commit(LogRecord::NodeRestarted { node, incarnation }, out);
                }
                self.complete_gone_obligations(&scope, out);
                self.end_gone_streams(&scope, out);
                self.resume_fences(out);
                out.send(reply_to, Message::GoneAcknowledged { scope });
            }
            Message::Reply(_) => return Err(InputError::UnexpectedMessage("Reply")),
            Message::Retire { .. } => return Err(InputError::UnexpectedMessage("Retire")),
            Message::Displaced { .. } => return Err(InputError::UnexpectedMessage("Displaced")),
            Message::GoneAcknowledged { .. } => {
                return Err(InputError::UnexpectedMessage("GoneAcknowledged"));
            }
            Message::ProxyCall(_) => return Err(InputError::UnexpectedMessage("ProxyCall")),
            Message::FromChild(_)
            | Message::ToChild(_)
            | Message::ChunkRequest { .. }
            | Message::Chunk { .. }
            | Message::ChunkRefused { .. } => {
                return Err(InputError::UnexpectedMessage("a host frame"));
            }
            Message::ProxyCancel { .. } => {
                return Err(InputError::UnexpectedMessage("ProxyCancel"));
            }
        }
        self.debug_check_step();
        Ok(())
    }

    /// Handles the retry tick: one bounded retry pass, then re-arm.
    pub fn handle_timer(
        &mut self,
        now: Instant,
        timer: Timer,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        if timer != Timer::DirectoryRetry {
            return Err(InputError::UnexpectedTimer(timer));
        }
        self.retry_pass(out);
        self.arm_timer(now, out);
        self.debug_check_step();
        Ok(())
    }

    /// Handles a route report for a watched target.
    pub fn handle_route(
        &mut self,
        now: Instant,
        target: Address,
        routable: bool,
        out: &mut Outbox,
    ) {
        let _ = now;
        self.route_changed(target, routable, out);
        self.debug_check_step();
    }

    fn arm_timer(&self, now: Instant, out: &mut Outbox) {
        let at = now.saturating_add(self.config.retry_period);
        out.push(Effect::SetTimer {
            timer: Timer::DirectoryRetry,
            at,
        });
    }

    fn handle_call(&mut self, call: DirectoryCall, out: &mut Outbox) {
        let DirectoryCall {
            request_id,
            reply_to,
            request,
        } = call;
        let body = match request {
            DirectoryRequest::Register {
                path,
                source,
                source_node,
                length,
                recovery,
                operation,
                reservation,
            } => {
                let args = blobs::RegisterArgs {
                    path,
                    source,
                    source_node,
                    length,
                    recovery,
                    operation,
                    reservation,
                };
                ReplyBody::Registered(self.register(args, out))
            }
            DirectoryRequest::Resolve { path } => ReplyBody::Resolved(self.resolve(&path)),
            DirectoryRequest::Lookup { path } => ReplyBody::LookedUp(self.lookup(&path)),
            DirectoryRequest::ReserveBlob {
                path,
                operation,
                owner,
            } => ReplyBody::BlobReserved(self.reserve(path, operation, owner, out)),
            DirectoryRequest::ReleaseBlobReservation { path, operation } => {
                ReplyBody::BlobReservationReleased(self.release_reservation(path, operation, out))
            }
            DirectoryRequest::Unregister {
                path,
                expected_revision,
                operation,
            } => ReplyBody::Unregistered(self.unregister(path, expected_revision, operation, out)),
            DirectoryRequest::Rename {
                source,
                destination,
                replace,
                operation,
            } => ReplyBody::Renamed(self.rename(source, destination, replace, operation, out)),
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
                let request = OpenRequest {
                    request_id,
                    reply_to,
                    path,
                    role,
                    descriptor,
                    endpoint,
                    replace,
                    ensure,
                    expected_revision,
                    operation,
                };
                self.open(request, out);
                return;
            }
            DirectoryRequest::CancelStream { path, operation } => {
                ReplyBody::StreamCancelled(self.cancel(path, operation, out))
            }
            DirectoryRequest::CloseStream { path, incarnation } => {
                ReplyBody::StreamClosed(self.close(path, incarnation))
            }
            DirectoryRequest::OperationsDone { issuer, below } => {
                ReplyBody::OperationsDone(self.operations_done(reply_to, issuer, below, out))
            }
        };
        let reply = DirectoryReply {
            request_id,
            epoch: self.durable.epoch(),
            body,
        };
        out.send(reply_to, Message::Reply(reply));
    }

    /// Applies `record` to the durable state and emits it as a `Persist` barrier.
    fn commit(&mut self, record: LogRecord, out: &mut Outbox) {
        if let Err(error) = self.durable.apply_own(&record) {
            // The directory only builds records that fit its state; a refusal is a bug here.
            panic!("directory built an inconsistent record {record:?}: {error}");
        }
        out.push(Effect::Persist(record));
    }

    /// The replay check (SPEC §4.3, with retention): `None` for an id that may take effect
    /// now (no record, not expired, and room to remember it); otherwise the answer: the stored
    /// outcome, a conflict for a different key, or the refusal of [`Directory::admit`].
    /// `retraction` marks a cancel or a release, which get twice the room.
    fn replay(
        &self,
        operation: OperationId,
        key: &RequestKey,
        retraction: bool,
    ) -> Option<Result<&Outcome, NamespaceError>> {
        let Some(record) = self.durable.operation(operation) else {
            return self.admit(operation, retraction).err().map(Err);
        };
        if record.key != *key {
            return Some(Err(NamespaceError::OperationConflict(operation)));
        }
        Some(Ok(&record.outcome))
    }

    /// Whether an operation id without a record may get one: never once it is expired (its
    /// record was pruned, or its node incarnation ended: `OperationExpired`), only while
    /// the operation and issuer tables have room (`LimitReached`, which leaves no trace: the
    /// refusal itself could not be remembered, so the caller must treat it as an unknown
    /// outcome), and, but for a retraction, only while the disk has room (`NoSpace`, without
    /// a trace too). Retractions get twice the room: refusing a cancel strands what it undoes.
    fn admit(&self, operation: OperationId, retraction: bool) -> Result<(), NamespaceError> {
        if self.durable.is_expired(operation) {
            return Err(NamespaceError::OperationExpired(operation));
        }
        let limits = &self.config.limits;
        let room = |limit: usize| {
            if retraction {
                limit.saturating_mul(2)
            } else {
                limit
            }
        };
        let full = |limit| Err(NamespaceError::LimitReached(limit));
        if self.durable.operation_count() >= room(limits.operations) {
            return full(Limit::Operations);
        }
        match self.durable.issuer(operation.issuer()) {
            Some(row) if row.records >= room(limits.issuer_operations) => {
                return full(Limit::IssuerOperations);
            }
            None if self.durable.issuer_count() >= room(limits.issuers) => {
                return full(Limit::Issuers);
            }
            _ => {}
        }
        match &self.no_space {
            // A retraction only shrinks what is held; it writes into the room the driver keeps
            // below its reserve.
            Some(reason) if !retraction => Err(NamespaceError::NoSpace(reason.clone())),
            _ => Ok(()),
        }
    }

    /// `OperationsDone` (ARCHITECTURE "Retention of operation records"): raises the issuer's
    /// horizon to `below`, but not past an operation of its that is a live rendezvous (a
    /// cancel or a retry of it must still find its record), and prunes the records below.
    fn operations_done(
        &mut self,
        reply_to: Address,
        issuer: Issuer,
        below: u64,
        out: &mut Outbox,
    ) -> Result<u64, NamespaceError> {
        if !issuer.is_on(reply_to) {
            return Err(NamespaceError::Protocol(crate::wire::reason(
                "an issuer speaks only for its own node incarnation",
            )));
        }
        if self.durable.is_issuer_gone(issuer) {
            // Everything it ever issued is expired already.
            return Ok(OperationId::SEQUENCE_END);
        }
        let live = self
            .streams
            .values()
            .flat_map(|r| match r {
                Rendezvous::Pending(p) => [Some(p.request.operation), None],
                Rendezvous::Active(a) => [Some(a.source_op), Some(a.sink_op)],
            })
            .flatten()
            .filter(|op| op.issuer() == issuer)
            .map(OperationId::sequence)
            .min();
        let horizon = below
            .min(OperationId::SEQUENCE_END)
            .min(live.unwrap_or(u64::MAX));
        let current = self.durable.horizon(issuer);
        if horizon <= current {
            return Ok(current);
        }
        if self.durable.issuer(issuer).is_none()
            && self.durable.issuer_count() >= self.config.limits.issuers
        {
            return Err(NamespaceError::LimitReached(Limit::Issuers));
        }
        self.commit(
            LogRecord::OperationsDone {
                issuer,
                below: horizon,
            },
            out,
        );
        Ok(horizon)
    }

    /// Persists a sticky rejection and returns the error to reply.
    fn reject(
        &mut self,
        operation: OperationId,
        key: RequestKey,
        kind: RejectionKind,
        path: &DataPath,
        out: &mut Outbox,
    ) -> NamespaceError {
        let rejection = Rejection {
            kind,
            path: path.clone(),
        };
        let error = rejection.error();
        self.commit(
            LogRecord::Rejected {
                operation,
                key,
                rejection,
            },
            out,
        );
        error
    }

    fn allocate_revision(&self) -> Result<Revision, NamespaceError> {
        let next = self.durable.next_revision();
        if next.0 == u64::MAX {
            return Err(NamespaceError::Storage(crate::wire::reason(
                "revision space exhausted",
            )));
        }
        Ok(next)
    }

    fn debug_check_step(&self) {
        debug_assert_eq!(self.engine.len(), self.durable.obligation_count());
        debug_assert!(self.durable.epoch() > AuthorityEpoch::NONE);
        if cfg!(debug_assertions)
            && self.durable.entry_count() + self.durable.operation_count()
                <= crate::limits::DEBUG_CHECK_STATE_MAX
            && let Err(broken) = self.check_invariants()
        {
            panic!("directory invariant broken after a step: {broken}");
        }
    }

    /// Tells the directory whether its disk has room for new records (`None`) or not (why,
    /// in words the caller reads: the data directory and what to do). While it has none, an
    /// operation id without a record is refused `NoSpace` before anything changes, unless it
    /// is a retraction (a cancel or a release); reads, replays of recorded operations and
    /// everything that is not a new operation go on. The driver decides when the disk is
    /// full, before each input (`crate::storage::SpaceGate`), and keeps room below its
    /// reserve for what it still lets through.
    pub fn set_no_space(&mut self, why: Option<Reason>) {
        self.no_space = why;
    }

    /// Why new operations are refused for lack of disk space, if they are.
    pub fn no_space(&self) -> Option<&Reason> {
        self.no_space.as_ref()
    }

    /// The authority epoch stamped on replies and incarnations.
    pub fn epoch(&self) -> AuthorityEpoch {
        self.durable.epoch()
    }

    /// The directory's configuration.
    pub fn config(&self) -> &DirectoryConfig {
        &self.config
    }

    /// The durable state (what recovery would rebuild).
    pub fn durable(&self) -> &DurableState {
        &self.durable
    }

    /// The runtime rendezvous on `path`.
    pub fn rendezvous(&self, path: &DataPath) -> Option<&Rendezvous> {
        self.streams.get(path)
    }

    /// Every runtime rendezvous, by path.
    pub fn rendezvous_all(&self) -> impl Iterator<Item = (&DataPath, &Rendezvous)> {
        self.streams.iter()
    }

    /// The replacement fence on `path`.
    pub fn fence(&self, path: &DataPath) -> Option<&Fence> {
        self.fences.get(path)
    }

    /// Every replacement fence, by path.
    pub fn fences(&self) -> impl Iterator<Item = (&DataPath, &Fence)> {
        self.fences.iter()
    }

    /// The runtime source of the blob at `path`.
    pub fn source(&self, path: &DataPath) -> Option<&SourceState> {
        self.sources.get(path)
    }

    /// The watched targets the registrar last reported unroutable, in address order.
    pub fn unroutable_targets(&self) -> impl Iterator<Item = &Address> {
        self.engine.unroutable()
    }

    /// Whether the registrar last reported `target` unroutable.
    pub fn is_routable(&self, target: &Address) -> bool {
        self.engine.is_routable(target)
    }

    /// The records a compaction writes: replaying them rebuilds this durable state.
    pub fn snapshot_records(&self) -> Vec<LogRecord> {
        self.durable.snapshot_records()
    }

    /// The same records borrowed from the state, in the same order: what a compaction
    /// encodes ([`crate::storage::LogStore::compact_from`]), without cloning the state.
    pub fn snapshot(&self) -> impl Iterator<Item = SnapshotRecordRef<'_>> + '_ {
        self.durable.snapshot()
    }

    /// Checks every invariant of the directory (store validity, S1, S14, runtime/durable
    /// agreement, fences). O(state): for tests and the simulator's checkers.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.durable.check()?;
        self.check_runtime()
    }

    /// [`Directory::check_invariants`] without the scan of the operation table: cheap enough
    /// to run after every step of a long simulation.
    pub fn check_invariants_fast(&self) -> Result<(), String> {
        self.durable.check_structure()?;
        self.check_runtime()
    }

    fn check_runtime(&self) -> Result<(), String> {
        if self.durable.epoch() == AuthorityEpoch::NONE {
            return Err("serving with epoch 0".into());
        }
        // Both maps iterate in path order, so the blob bindings and the runtime sources can be
        // compared in one lockstep walk.
        let blobs = self
            .durable
            .entries()
            .filter(|(_, entry)| matches!(entry, crate::log::Entry::Blob { .. }))
            .map(|(path, _)| path);
        let mut sources = self.sources.keys();
        for path in blobs {
            if sources.next() != Some(path) {
                return Err(format!(
                    "{path}: runtime sources and blob bindings disagree"
                ));
            }
        }
        if let Some(path) = sources.next() {
            return Err(format!("{path}: runtime source without a binding"));
        }
        for (path, rendezvous) in &self.streams {
            let node = match self.durable.entry(path) {
                Some(crate::log::Entry::Stream { revision }) => *revision,
                _ => return Err(format!("{path}: rendezvous without a stream node")),
            };
            let revision = match rendezvous {
                Rendezvous::Pending(p) => p.revision,
                Rendezvous::Active(a) => {
                    if a.source_op == a.sink_op {
                        return Err(format!("{path}: both roles under one operation"));
                    }
                    if a.matched.revision != a.matched.incarnation.revision {
                        return Err(format!("{path}: match revision disagrees"));
                    }
                    a.matched.revision
                }
            };
            if revision != node {
                return Err(format!("{path}: rendezvous at {revision}, node at {node}"));
            }
        }
        for (path, fence) in &self.fences {
            // The replace-open that began the fence is held even if the bound is 0.
            if fence.held.len() > self.config.limits.fence_held_opens.max(1) {
                return Err(format!("{path}: fence holds too many opens"));
            }
        }
        // The rotation tracks exactly the durable obligations (both are ordered by key), and
        // the watched targets are exactly their targets, each counted once per obligation.
        if !self.durable.obligation_keys().eq(self.engine.keys()) {
            return Err("retry rotation and durable obligations disagree".into());
        }
        let mut targets: Vec<Address> =
            self.durable.obligation_keys().map(|k| k.target()).collect();
        targets.sort_unstable();
        let mut expected = targets
            .chunk_by(|a, b| a == b)
            .map(|run| (run[0], run.len()));
        if !self.engine.watch_counts().eq(&mut expected) {
            return Err("route watches do not match the obligation targets".into());
        }
        Ok(())
    }
}

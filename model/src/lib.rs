//! The directory's reference model: one independent restatement of its rules, written from
//! SPEC.md §3–§4, DESIGN.md §5 and ARCHITECTURE.md "Decisions", never from
//! `core/src/directory`. Two harnesses drive it: the simulator's checker (`sim/src/check`),
//! which feeds it every input in the directory's processing order and rolls its durable half
//! back after a crash, and the testkit's step checker (`dataplane_testkit::check`: core's
//! property tests and the fuzz targets), whose every step is durable at once.
//!
//! For every input the model predicts every reply (epoch included), every fresh `Retire` and
//! `Displaced` notice and every gone acknowledgement ([`Out`]); a retry pass (a tick, the one
//! after a recovery) predicts one frame per obligation toward a target not reported unroutable.
//! [`compare`] holds the comparison of its durable state with the directory's, every field.
//!
//! # What the model follows
//!
//! SPEC §4 as amended: Q1/Q2/Q3/Q11/Q18/Q19 as settled in DESIGN §5; every refusal of a
//! mutation or an open is sticky (ARCHITECTURE "Every refusal is sticky"); durable, op-logged
//! reservations with release tombstones; node incarnation floors (late opens, registers and
//! reserves from an ended incarnation get a non-sticky `PathReplaced` after the replay check);
//! no obligation toward an address already gone; displacement obligations keyed by (endpoint,
//! incarnation) and kept in creation order; an id reused for another request conflicts even on
//! a fenced path; `AddressGone` answers `PathReplaced` to the held opens it drops. A blob whose
//! runtime source belongs to an ended node incarnation is lost: Resolve answers `BlobLost`,
//! Lookup marks it `lost` (ARCHITECTURE "Lost blobs").
//!
//! Retention (ARCHITECTURE "Retention of operation records"): an operation id names its issuer
//! (node, incarnation, lane) and a sequence number ([`rules::issuer_of`]). It is *expired* once
//! its issuer's node incarnation is below the node's floor, or its sequence number is below the
//! horizon the issuer declared with `OperationsDone`; the horizon never passes an operation of
//! the issuer that is a live rendezvous, and only a caller on the issuer's node incarnation may
//! declare it. No record of an expired operation stays unless it holds a reservation; an
//! expired operation without a record is refused `OperationExpired` before anything else.
//!
//! Limits (ARCHITECTURE "Every directory table has a limit"): a new operation id needs room in
//! the operation and issuer tables (twice the room for a cancel or a release), else
//! `LimitReached` without a trace; every other table's refusal is sticky (entries,
//! obligations, rendezvous, fences, reservations, held opens).
//!
//! Not modelled: the retry pass's rotation beyond one batch. Its prediction is one frame per
//! obligation; a driver compares it only while the obligations fit in one batch
//! (`RETRY_BATCH_MAX`), and checks the rotation with properties of its own.
//!
//! # What it imports from `dataplane_core`, and why each is vocabulary
//!
//! The model shares with the directory only the words in which its inputs, predictions and
//! state are stated, never a function that decides something:
//!
//! * `ids`: `Address`, `NodeId`, `OperationId`, `Issuer`, `RequestId`, `Revision`,
//!   `AuthorityEpoch`, `StreamIncarnation` — plain values with derived equality and order
//!   (their public fields are read and written directly). The methods that decode an id
//!   (`OperationId::issuer`, `sequence`, `Issuer::is_on`, `ids`) are restated in [`rules`].
//! * `path::DataPath` — a value: the model compares and orders paths (byte order, as a
//!   `str`) and never builds one; the harness does, with `DataPath::new`, whose validation is
//!   the wire's (a path that is not valid never reaches a directory either). `is_under` is
//!   not used.
//! * `wire`: `DirectoryRequest` (input), `DirectoryReply`, `ReplyBody`, `MutationReceipt`,
//!   `BlobBinding`, `NamespaceNode`, `StreamMatch`, `Descriptor`, `GoneScope`,
//!   `SourceRecovery`, `EntryKind`, `StreamRole` — messages as data, built and matched field
//!   by field. `GoneScope::covers`, `StreamMatch::endpoint`, `StreamRole::peer`,
//!   `ReplyBody::err`/`kind` and `DirectoryRequest::kind`/`operation` are restated or unused.
//! * `error`: `NamespaceError`, `Limit` (error values), `Reason` (a text; `Reason::new` only
//!   bounds its length, as the wire does for every reason).
//! * `log`: `Entry`, `OperationRecord`, `Outcome`, `Rejection`, `RejectionKind`, `RequestKey`,
//!   `Reservation` — the data of the durable state, with derived equality, so that the
//!   model's tables and the directory's compare field by field. The model builds every value
//!   itself; `Rejection::error`, `Entry::revision` and `Mutation::key` are restated.
//! * `directory::DirectoryLimits` — configuration: a struct of nine numbers the harness gives
//!   both the directory and the model (the defaults are core's named limits).
//!
//! [`compare`] reads the directory's `DurableState` through its getters (`entries`,
//! `operations`, `reservations`, `obligations_in_order`, `node_floors`, `issuers`, `epoch`,
//! `next_revision`) and converts `ObligationKey` (a data enum) to the model's [`Obligation`];
//! it calls none of its predicates. `clippy.toml` refuses every core method with behaviour
//! (the predicates above, `DurableState`'s, and the machines themselves) in this crate.
//!
//! Deterministic: ordered maps only, no clock, no randomness. It favours plainness over speed:
//! linear scans over small tables, values cloned freely.

mod blobs;
pub mod compare;
mod journal;
mod retention;
pub mod rules;
mod streams;

use std::collections::{BTreeMap, BTreeSet};

use dataplane_core::directory::DirectoryLimits;
use dataplane_core::error::{NamespaceError, Reason};
use dataplane_core::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::log::{Entry, OperationRecord, Reservation};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    Descriptor, DirectoryReply, DirectoryRequest, GoneScope, ReplyBody, SourceRecovery,
    StreamMatch, StreamRole,
};

pub use journal::JMap;

/// Who asked: the request id to echo and the address to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Echoed in the reply.
    pub request_id: RequestId,
    /// Where the reply goes.
    pub reply_to: Address,
}

/// What the directory must send in one step, as the model predicts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Out {
    /// Replies: to whom, and the reply (its epoch included).
    pub replies: Vec<(Address, DirectoryReply)>,
    /// `Retire` frames, by source.
    pub retires: Vec<Address>,
    /// `Displaced` frames, by endpoint and incarnation.
    pub displaced: Vec<(Address, StreamIncarnation)>,
    /// Gone acknowledgements.
    pub gone_acks: Vec<(Address, GoneScope)>,
    /// Interesting paths taken (coverage names for the simulator; others ignore them).
    pub notes: Vec<&'static str>,
}

/// One outstanding obligation toward an address (SPEC §4.8, §4.6.1; ARCHITECTURE
/// "Obligations").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Obligation {
    /// The source must be told to retire.
    Retire(Address),
    /// The endpoint must be told that this incarnation was displaced.
    Displace(Address, StreamIncarnation),
}

impl Obligation {
    /// The address it is toward.
    pub fn target(&self) -> Address {
        match *self {
            Obligation::Retire(a) | Obligation::Displace(a, _) => a,
        }
    }
}

/// Where an obligation stands in creation order, and (displacements of a replace-open) the
/// path whose fence waits for it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Slot {
    order: u64,
    fence: Option<DataPath>,
}

/// The durable counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Counter {
    /// The next revision to allocate (1 when absent).
    NextRevision,
    /// The last adopted epoch (0 when absent).
    Epoch,
    /// The creation number of the next obligation.
    NextOrder,
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

/// A first opener waiting for its peer.
#[derive(Clone, Debug)]
struct Pending {
    role: StreamRole,
    endpoint: Address,
    descriptor: Descriptor,
    op: OperationId,
    caller: Caller,
    revision: Revision,
    opened_from: Option<Revision>,
}

/// A matched rendezvous.
#[derive(Clone, Debug)]
struct Active {
    matched: StreamMatch,
    source_op: OperationId,
    sink_op: OperationId,
}

impl Active {
    /// Its endpoints, each once, in address order: the order in which a displacement of the
    /// rendezvous creates their obligations (ARCHITECTURE "Obligations"; it is the order a
    /// recovery restores them in).
    fn endpoints(&self) -> Vec<Address> {
        let mut v = vec![self.matched.source, self.matched.sink];
        v.sort();
        v.dedup();
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

/// The runtime rendezvous of a path (volatile).
#[derive(Clone, Debug)]
enum Rendezvous {
    Pending(Pending),
    Active(Active),
}

/// The runtime source of a blob binding (volatile; rebuilt from its recovery record).
#[derive(Clone, Debug)]
enum Source {
    Available {
        source: Address,
        node: NodeId,
        owner: Option<Address>,
    },
}

/// A replacement fence (volatile; rebuilt from fenced displacements).
#[derive(Clone, Debug)]
struct Fence {
    incarnation: StreamIncarnation,
    endpoints: BTreeSet<Address>,
    old: Option<Active>,
    held: Vec<(Caller, OpenArgs)>,
}

/// The model. Its durable half lives in [`JMap`]s, changed under the number of the step that
/// changed it, so that [`Model::rollback_after`] can take it back to the steps a crash kept.
#[derive(Clone, Debug)]
pub struct Model {
    limits: DirectoryLimits,
    /// The step being processed (every durable change is journalled under it).
    step: u64,
    counters: JMap<Counter, u64>,
    entries: JMap<DataPath, Entry>,
    operations: JMap<OperationId, OperationRecord>,
    /// How many records each issuer holds in `operations` (derived, kept beside it under the
    /// same steps so a rollback restores it; no issuer with no record): the issuer rows and
    /// the pruning walk read it instead of counting every record.
    records_per_issuer: JMap<Issuer, usize>,
    reservations: JMap<DataPath, Reservation>,
    obligations: JMap<Obligation, Slot>,
    /// Obligations by creation number: the persisted order (recovery order, Q13).
    obligation_order: JMap<u64, Obligation>,
    floors: JMap<NodeId, u64>,
    /// The horizon each issuer declared. Kept after its node incarnation ended (the directory
    /// drops such a row once it holds no record; [`Model::issuer_rows`] says what it keeps).
    horizons: JMap<Issuer, u64>,
    sources: BTreeMap<DataPath, Source>,
    /// Watched targets last reported unroutable (forgotten when unwatched).
    unroutable: BTreeSet<Address>,
    streams: BTreeMap<DataPath, Rendezvous>,
    fences: BTreeMap<DataPath, Fence>,
    /// Set while the directory's disk has no room (the harness says so, from the file
    /// system's ground truth): why, as the refusal carries it.
    no_space: Option<Reason>,
    out: Out,
}

/// The source `ActorSources` (the recovery hook both harnesses give the directory) rebuilds
/// from a recovery record: an `Actor` record names it; a `File` record names the persistent
/// actor of the host that serves the file (issue 17), with no owner.
fn recovered_source(recovery: &SourceRecovery) -> Source {
    match recovery {
        SourceRecovery::Actor { actor, node, owner } => Source::Available {
            source: *actor,
            node: *node,
            owner: *owner,
        },
        SourceRecovery::File { source, .. } => Source::Available {
            source: *source,
            node: source.node,
            owner: None,
        },
    }
}

impl Model {
    /// A store that was never recovered (epoch 0, next revision 1), whose tables have the
    /// bounds `limits`. The first [`Model::recover`] adopts epoch 1.
    pub fn new(limits: DirectoryLimits) -> Self {
        Model {
            limits,
            step: 0,
            counters: JMap::default(),
            entries: JMap::default(),
            operations: JMap::default(),
            records_per_issuer: JMap::default(),
            reservations: JMap::default(),
            obligations: JMap::default(),
            obligation_order: JMap::default(),
            floors: JMap::default(),
            horizons: JMap::default(),
            sources: BTreeMap::new(),
            unroutable: BTreeSet::new(),
            streams: BTreeMap::new(),
            fences: BTreeMap::new(),
            no_space: None,
            out: Out::default(),
        }
    }

    /// Whether the directory's disk has room for new operations (`None`) or not, and why: an
    /// unknown operation id that is not a retraction is then refused `NoSpace`, after the
    /// expiry and table checks and before anything else, without a trace (ARCHITECTURE "A
    /// full disk stops writes, not the directory"). Volatile: a recovery starts with room.
    pub fn set_no_space(&mut self, why: Option<Reason>) {
        self.no_space = why;
    }

    // ------------------------------------------------------------------ the journal

    /// How many durable changes the model ever made (a cheap "did anything change" probe).
    pub fn durable_writes(&self) -> u64 {
        self.counters.writes()
            + self.entries.writes()
            + self.operations.writes()
            + self.reservations.writes()
            + self.obligations.writes()
            + self.obligation_order.writes()
            + self.floors.writes()
            + self.horizons.writes()
    }

    /// Undoes every durable change made after `step` (a crash lost those steps).
    pub fn rollback_after(&mut self, step: u64) {
        self.counters.rollback_after(step);
        self.entries.rollback_after(step);
        self.operations.rollback_after(step);
        self.records_per_issuer.rollback_after(step);
        self.reservations.rollback_after(step);
        self.obligations.rollback_after(step);
        self.obligation_order.rollback_after(step);
        self.floors.rollback_after(step);
        self.horizons.rollback_after(step);
    }

    /// The steps up to `step` are durable: their changes can no longer be undone.
    pub fn forget_through(&mut self, step: u64) {
        self.counters.forget_through(step);
        self.entries.forget_through(step);
        self.operations.forget_through(step);
        self.records_per_issuer.forget_through(step);
        self.reservations.forget_through(step);
        self.obligations.forget_through(step);
        self.obligation_order.forget_through(step);
        self.floors.forget_through(step);
        self.horizons.forget_through(step);
    }

    /// Takes what the steps since the last call must have sent.
    pub fn take_out(&mut self) -> Out {
        std::mem::take(&mut self.out)
    }

    // ------------------------------------------------------------------ reading

    /// The epoch of the serving instance (the last adopted one).
    pub fn epoch(&self) -> AuthorityEpoch {
        AuthorityEpoch(self.counters.get(&Counter::Epoch).copied().unwrap_or(0))
    }

    /// The next revision to allocate.
    pub fn next_revision(&self) -> Revision {
        Revision(
            self.counters
                .get(&Counter::NextRevision)
                .copied()
                .unwrap_or(1),
        )
    }

    /// Every entry, by path.
    pub fn entries(&self) -> impl Iterator<Item = (&DataPath, &Entry)> {
        self.entries.map().iter()
    }

    /// Every operation record, by id.
    pub fn operations(&self) -> impl Iterator<Item = (&OperationId, &OperationRecord)> {
        self.operations.map().iter()
    }

    /// Whether `op` has a record.
    pub fn has_record(&self, op: OperationId) -> bool {
        self.operations.contains(&op)
    }

    /// Every reservation, by path.
    pub fn reservations(&self) -> impl Iterator<Item = (&DataPath, &Reservation)> {
        self.reservations.map().iter()
    }

    /// Every obligation in creation (persisted) order, with its fenced path.
    pub fn obligations(&self) -> impl Iterator<Item = (Obligation, Option<&DataPath>)> {
        self.obligation_order
            .map()
            .values()
            .map(|ob| (*ob, self.obligations.get(ob).and_then(|s| s.fence.as_ref())))
    }

    /// How many obligations are outstanding.
    pub fn obligation_count(&self) -> usize {
        self.obligations.len()
    }

    /// Whether `obligation` is outstanding.
    pub fn has_obligation(&self, obligation: &Obligation) -> bool {
        self.obligations.contains(obligation)
    }

    /// The targets last reported unroutable while watched (forgotten when unwatched).
    pub fn unroutable(&self) -> impl Iterator<Item = &Address> {
        self.unroutable.iter()
    }

    /// The targets of the outstanding obligations (the routes the directory must watch).
    pub fn obligation_targets(&self) -> BTreeSet<Address> {
        self.obligations.map().keys().map(|o| o.target()).collect()
    }

    /// Every node floor, by node.
    pub fn node_floors(&self) -> impl Iterator<Item = (&NodeId, &u64)> {
        self.floors.map().iter()
    }

    /// The live source bound at each blob path (both recovery records recover one, so every
    /// binding has one).
    pub fn live_sources(&self) -> impl Iterator<Item = (&DataPath, Address)> {
        self.sources.iter().map(|(p, s)| match s {
            Source::Available { source, .. } => (p, *source),
        })
    }

    /// The paths with a runtime rendezvous, each with whether it is matched.
    pub fn rendezvous(&self) -> impl Iterator<Item = (&DataPath, bool)> {
        self.streams
            .iter()
            .map(|(p, r)| (p, matches!(r, Rendezvous::Active(_))))
    }

    /// The fenced paths.
    pub fn fenced(&self) -> impl Iterator<Item = &DataPath> {
        self.fences.keys()
    }

    // ------------------------------------------------------------------ small helpers

    fn set_counter(&mut self, counter: Counter, value: u64) {
        self.counters.insert(self.step, counter, value);
    }

    fn alloc(&mut self) -> Revision {
        let r = self.next_revision();
        self.set_counter(Counter::NextRevision, r.0 + 1);
        r
    }

    fn reply(&mut self, caller: Caller, body: ReplyBody) {
        let reply = DirectoryReply {
            request_id: caller.request_id,
            epoch: self.epoch(),
            body,
        };
        self.out.replies.push((caller.reply_to, reply));
    }

    fn note(&mut self, name: &'static str) {
        self.out.notes.push(name);
    }

    /// Whether `address` belongs to an incarnation its node reported ended.
    fn is_gone(&self, address: &Address) -> bool {
        self.floors
            .get(&address.node)
            .is_some_and(|floor| address.incarnation < *floor)
    }

    /// The live runtime source of the blob at `path`, if it is available.
    fn blob_source(&self, path: &DataPath) -> Option<Address> {
        match self.sources.get(path) {
            Some(Source::Available { source, .. }) => Some(*source),
            _ => None,
        }
    }

    fn add_obligation(&mut self, obligation: Obligation, fence: Option<DataPath>) {
        let order = self.counters.get(&Counter::NextOrder).copied().unwrap_or(0);
        self.set_counter(Counter::NextOrder, order + 1);
        self.obligations
            .insert(self.step, obligation, Slot { order, fence });
        self.obligation_order.insert(self.step, order, obligation);
    }

    fn remove_obligation(&mut self, obligation: &Obligation) {
        if let Some(slot) = self.obligations.remove(self.step, obligation) {
            self.obligation_order.remove(self.step, &slot.order);
        }
    }

    /// A retirement obligation toward a source whose node already reported it gone would be
    /// complete at birth: none is created. A fresh one is sent at once.
    fn queue_retire(&mut self, source: Address) {
        if self.is_gone(&source) {
            return;
        }
        let obligation = Obligation::Retire(source);
        if !self.obligations.contains(&obligation) {
            self.add_obligation(obligation, None);
        }
        self.out.retires.push(source);
    }

    /// Whether `endpoint` still owes an acknowledgement for `incarnation`.
    fn is_displacing(&self, endpoint: Address, incarnation: StreamIncarnation) -> bool {
        self.obligations
            .contains(&Obligation::Displace(endpoint, incarnation))
    }

    fn queue_displace(
        &mut self,
        endpoint: Address,
        incarnation: StreamIncarnation,
        fence: Option<DataPath>,
    ) {
        if self.is_displacing(endpoint, incarnation) || self.is_gone(&endpoint) {
            return;
        }
        self.add_obligation(Obligation::Displace(endpoint, incarnation), fence);
        self.out.displaced.push((endpoint, incarnation));
    }

    // ------------------------------------------------------------------ inputs

    /// A call delivered to the directory at `step`.
    pub fn call(
        &mut self,
        step: u64,
        request_id: RequestId,
        reply_to: Address,
        request: DirectoryRequest,
    ) {
        self.step = step;
        let caller = Caller {
            request_id,
            reply_to,
        };
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
                let registered = self.register(
                    path,
                    (source, source_node),
                    length,
                    recovery,
                    operation,
                    reservation,
                );
                ReplyBody::Registered(registered.map(blobs::receipt))
            }
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
            } => ReplyBody::Unregistered(
                self.unregister(path, expected_revision, operation)
                    .map(blobs::receipt),
            ),
            DirectoryRequest::Rename {
                source,
                destination,
                replace,
                operation,
            } => ReplyBody::Renamed(
                self.rename(source, destination, replace, operation)
                    .map(blobs::receipt),
            ),
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
                self.open(caller, args);
                self.prune();
                return;
            }
            DirectoryRequest::CancelStream { path, operation } => {
                ReplyBody::StreamCancelled(self.cancel(path, operation))
            }
            DirectoryRequest::CloseStream { path, incarnation } => {
                ReplyBody::StreamClosed(self.close(path, incarnation))
            }
            DirectoryRequest::OperationsDone { issuer, below } => {
                ReplyBody::OperationsDone(self.operations_done(reply_to, issuer, below))
            }
        };
        if expired_refusal(&body) {
            self.note("retention.refused_expired");
        }
        self.reply(caller, body);
        self.prune();
    }

    /// `SourceRetired`: the retirement completes, if it is pending.
    pub fn source_retired(&mut self, step: u64, source: Address) {
        self.step = step;
        self.remove_obligation(&Obligation::Retire(source));
        self.forget_unwatched();
    }

    /// `StreamDisplaced`: the displacement completes if it is pending for that incarnation;
    /// fences waiting for it may resume.
    pub fn stream_displaced(&mut self, step: u64, endpoint: Address, inc: StreamIncarnation) {
        self.step = step;
        if self.is_displacing(endpoint, inc) {
            self.remove_obligation(&Obligation::Displace(endpoint, inc));
            self.forget_unwatched();
            self.resume_fences();
        }
    }

    /// The retry tick: one retry pass.
    pub fn tick(&mut self, step: u64) {
        self.step = step;
        self.retry_pass();
    }

    /// One retry pass: a frame per obligation toward a target not reported unroutable, then
    /// the fences whose obligations are all complete resume.
    fn retry_pass(&mut self) {
        let obligations: Vec<Obligation> = self.obligations().map(|(o, _)| o).collect();
        for obligation in obligations {
            if self.unroutable.contains(&obligation.target()) {
                continue;
            }
            match obligation {
                Obligation::Retire(a) => self.out.retires.push(a),
                Obligation::Displace(a, inc) => self.out.displaced.push((a, inc)),
            }
        }
        self.resume_fences();
    }

    /// A route report for a watched target: "routable" wakes exactly that target's
    /// obligations (SPEC §4.8 route wake, ARCHITECTURE "Obligations").
    pub fn route(&mut self, step: u64, target: Address, routable: bool) {
        self.step = step;
        if !self.obligation_targets().contains(&target) {
            return;
        }
        if !routable {
            self.unroutable.insert(target);
            return;
        }
        self.unroutable.remove(&target);
        let toward: Vec<Obligation> = self
            .obligations()
            .map(|(o, _)| o)
            .filter(|o| o.target() == target)
            .collect();
        for obligation in toward {
            match obligation {
                Obligation::Retire(a) => self.out.retires.push(a),
                Obligation::Displace(a, inc) => self.out.displaced.push((a, inc)),
            }
        }
        self.resume_fences();
    }

    /// Routability of a target is forgotten the moment its last obligation completes (it is
    /// unwatched; a later obligation starts with unknown routability, which counts as
    /// routable).
    fn forget_unwatched(&mut self) {
        let targets = self.obligation_targets();
        self.unroutable.retain(|a| targets.contains(a));
    }

    /// A recovery at `step` (also the first boot): a new epoch, volatile state lost, sources
    /// rebuilt from their recovery records, fences rebuilt from fenced displacements whose
    /// node still has the displaced revision (in persisted order, Q13/Q15), one retry pass.
    pub fn recover(&mut self, step: u64) {
        let epoch = self.epoch().0 + 1;
        self.recover_in_epoch(step, AuthorityEpoch(epoch));
    }

    /// A recovery at `step` that serves at `epoch` (above the recorded one) rather than the
    /// next: a replicated directory serves at its leader's term (ARCHITECTURE, "The
    /// replicated directory"), which may skip epochs. Otherwise as [`Model::recover`].
    pub fn recover_in_epoch(&mut self, step: u64, epoch: AuthorityEpoch) {
        self.step = step;
        self.no_space = None;
        let epoch = epoch.0;
        self.set_counter(Counter::Epoch, epoch);
        self.unroutable.clear();
        self.streams.clear();
        self.sources = self
            .entries
            .map()
            .iter()
            .filter_map(|(p, e)| match e {
                Entry::Blob { recovery, .. } => Some((p.clone(), recovered_source(recovery))),
                Entry::Stream { .. } => None,
            })
            .collect();
        self.fences.clear();
        let fenced: Vec<(Address, StreamIncarnation, DataPath)> = self
            .obligations()
            .filter_map(|(o, fence)| match (o, fence) {
                (Obligation::Displace(e, inc), Some(p)) => Some((e, inc, p.clone())),
                _ => None,
            })
            .collect();
        for (endpoint, incarnation, path) in fenced {
            let still_there = self.entries.get(&path)
                == Some(&Entry::Stream {
                    revision: incarnation.revision,
                });
            if !still_there {
                continue;
            }
            match self.fences.get_mut(&path) {
                None => {
                    self.fences.insert(
                        path,
                        Fence {
                            incarnation,
                            endpoints: [endpoint].into_iter().collect(),
                            old: None,
                            held: Vec::new(),
                        },
                    );
                }
                Some(fence) if fence.incarnation == incarnation => {
                    fence.endpoints.insert(endpoint);
                }
                Some(_) => {}
            }
        }
        self.retry_pass();
    }
}

/// Whether a reply refuses an expired operation (for coverage).
fn expired_refusal(body: &ReplyBody) -> bool {
    let expired = |e: &NamespaceError| matches!(e, NamespaceError::OperationExpired(_));
    match body {
        ReplyBody::Registered(Err(e))
        | ReplyBody::Unregistered(Err(e))
        | ReplyBody::Renamed(Err(e)) => expired(e),
        ReplyBody::BlobReserved(Err(e))
        | ReplyBody::BlobReservationReleased(Err(e))
        | ReplyBody::StreamCancelled(Err(e)) => expired(e),
        _ => false,
    }
}

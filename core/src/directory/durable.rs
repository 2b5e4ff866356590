//! The directory's durable state and the one function that changes it.
//!
//! [`DurableState::apply`] is used both by the live directory (every mutation builds a
//! [`LogRecord`], applies it, and emits it as `Persist`) and by recovery (which applies the
//! logged records in order). Because both go through the same function, a recovered state is
//! the live state by construction; `apply` validates every record first and changes nothing
//! when it refuses one.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, Revision, StreamIncarnation,
};
use crate::log::{
    Entry, LogRecord, Mutation, OperationRecord, Outcome, RequestKey, Reservation, SnapshotRecord,
    SnapshotRecordRef,
};
use crate::path::DataPath;
use crate::wire::SourceRecovery;

/// One outstanding obligation toward an address (SPEC §4.8, §4.6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObligationKey {
    /// The source must be told to retire.
    Retire(Address),
    /// The stream endpoint must be told that this incarnation was displaced. Keyed by the
    /// incarnation too: one endpoint displaced from two rendezvous owes two acknowledgements.
    Displace(Address, StreamIncarnation),
}

impl ObligationKey {
    /// The address the obligation is toward.
    pub fn target(&self) -> Address {
        match *self {
            ObligationKey::Retire(a) | ObligationKey::Displace(a, _) => a,
        }
    }
}

#[derive(Clone, Debug)]
struct Slot {
    order: u64,
    /// For displacements: the path whose replacement fence waits for the acknowledgement.
    fence: Option<DataPath>,
}

/// What the directory keeps per issuer of operation ids (ARCHITECTURE "Retention of
/// operation records"). A row exists while the issuer has records or a horizon, and goes
/// when it has no records left and either no horizon or an ended node incarnation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IssuerRow {
    /// The issuer declared every operation below this sequence number done (0: none).
    pub horizon: u64,
    /// How many operation records of the issuer are held.
    pub records: usize,
}

/// Why a record cannot be applied to the current state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyError(pub &'static str);

impl core::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "inconsistent log record: {}", self.0)
    }
}

impl std::error::Error for ApplyError {}

fn require(condition: bool, what: &'static str) -> Result<(), ApplyError> {
    if condition {
        Ok(())
    } else {
        Err(ApplyError(what))
    }
}

/// Everything the directory keeps across restarts (SPEC §3.1, with durable reservations).
#[derive(Clone, Debug)]
pub struct DurableState {
    epoch: AuthorityEpoch,
    next_revision: Revision,
    entries: BTreeMap<DataPath, Entry>,
    operations: BTreeMap<OperationId, OperationRecord>,
    reservations: BTreeMap<DataPath, Reservation>,
    obligations: BTreeMap<ObligationKey, Slot>,
    obligation_order: BTreeMap<u64, ObligationKey>,
    next_order: u64,
    node_floors: BTreeMap<NodeId, u64>,
    /// Per issuer: its horizon and how many records it holds (derived counts, kept in step
    /// with `operations`).
    issuers: BTreeMap<Issuer, IssuerRow>,
    /// The operations that hold a reservation (derived from `reservations`): their records
    /// are pinned until the reservation goes, whatever the issuer declared.
    reserved_ops: BTreeSet<OperationId>,
}

impl Default for DurableState {
    fn default() -> Self {
        DurableState {
            epoch: AuthorityEpoch::NONE,
            next_revision: Revision(1),
            entries: BTreeMap::new(),
            operations: BTreeMap::new(),
            reservations: BTreeMap::new(),
            obligations: BTreeMap::new(),
            obligation_order: BTreeMap::new(),
            next_order: 0,
            node_floors: BTreeMap::new(),
            issuers: BTreeMap::new(),
            reserved_ops: BTreeSet::new(),
        }
    }
}

impl PartialEq for DurableState {
    /// Equal contents; obligations compare in persisted order (their internal sequence numbers
    /// are not part of the state).
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch
            && self.next_revision == other.next_revision
            && self.entries == other.entries
            && self.operations == other.operations
            && self.reservations == other.reservations
            && self.obligations_in_order().eq(other.obligations_in_order())
            && self.node_floors == other.node_floors
            && self.issuers == other.issuers
    }
}

impl Eq for DurableState {}

impl DurableState {
    /// The last adopted authority epoch (0 before the first recovery).
    pub fn epoch(&self) -> AuthorityEpoch {
        self.epoch
    }

    /// The next revision to allocate.
    pub fn next_revision(&self) -> Revision {
        self.next_revision
    }

    /// The entry at `path`.
    pub fn entry(&self, path: &DataPath) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// Every entry, by path.
    pub fn entries(&self) -> impl Iterator<Item = (&DataPath, &Entry)> {
        self.entries.iter()
    }

    /// Every node the namespace names: the nodes of blob sources (and their owners), of
    /// reservations' owners and of obligations' targets. A member the namespace names is
    /// never forgotten (`dataplane_core::membership`): its blobs would be lost with its id.
    /// One walk over the tables; called only when the membership is full.
    pub fn named_nodes(&self) -> BTreeSet<NodeId> {
        let mut named = BTreeSet::new();
        for entry in self.entries.values() {
            match entry {
                Entry::Blob {
                    recovery: SourceRecovery::Actor { actor, node, owner },
                    ..
                } => {
                    named.insert(actor.node);
                    named.insert(*node);
                    named.extend(owner.map(|o| o.node));
                }
                Entry::Blob {
                    recovery: SourceRecovery::File { source, .. },
                    ..
                } => {
                    named.insert(source.node);
                }
                Entry::Stream { .. } => {}
            }
        }
        named.extend(self.reservations.values().map(|r| r.owner.node));
        named.extend(self.obligations.keys().map(|k| k.target().node));
        named
    }

    /// How many entries exist.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// The idempotency row of `operation`.
    pub fn operation(&self, operation: OperationId) -> Option<&OperationRecord> {
        self.operations.get(&operation)
    }

    /// Every idempotency row, by id.
    pub fn operations(&self) -> impl Iterator<Item = (&OperationId, &OperationRecord)> {
        self.operations.iter()
    }

    /// How many operation records are held.
    pub fn operation_count(&self) -> usize {
        self.operations.len()
    }

    /// The row of `issuer`, if it has records or a horizon.
    pub fn issuer(&self, issuer: Issuer) -> Option<&IssuerRow> {
        self.issuers.get(&issuer)
    }

    /// Every issuer row, by issuer.
    pub fn issuers(&self) -> impl Iterator<Item = (&Issuer, &IssuerRow)> {
        self.issuers.iter()
    }

    /// How many issuers have a row.
    pub fn issuer_count(&self) -> usize {
        self.issuers.len()
    }

    /// The horizon `issuer` declared (0 if none).
    pub fn horizon(&self, issuer: Issuer) -> u64 {
        self.issuers.get(&issuer).map_or(0, |row| row.horizon)
    }

    /// Whether `issuer`'s node incarnation ended (below its node's floor).
    pub fn is_issuer_gone(&self, issuer: Issuer) -> bool {
        self.node_floors
            .get(&issuer.node)
            .is_some_and(|floor| issuer.incarnation < *floor)
    }

    /// Whether `operation` is expired: its issuer's node incarnation ended, or the issuer
    /// declared it done. An expired operation has no record unless a reservation pins it,
    /// and never gets one again.
    pub fn is_expired(&self, operation: OperationId) -> bool {
        let issuer = operation.issuer();
        self.is_issuer_gone(issuer) || operation.sequence() < self.horizon(issuer)
    }

    /// The reservation on `path`.
    pub fn reservation(&self, path: &DataPath) -> Option<&Reservation> {
        self.reservations.get(path)
    }

    /// How many reservations are live.
    pub fn reservation_count(&self) -> usize {
        self.reservations.len()
    }

    /// Every reservation, by path.
    pub fn reservations(&self) -> impl Iterator<Item = (&DataPath, &Reservation)> {
        self.reservations.iter()
    }

    /// Whether `address` belongs to an incarnation its node reported as ended.
    pub fn is_gone(&self, address: &Address) -> bool {
        self.node_floors
            .get(&address.node)
            .is_some_and(|floor| address.incarnation < *floor)
    }

    /// The incarnation floor of `node` (0 if it never restarted).
    pub fn node_floor(&self, node: NodeId) -> u64 {
        self.node_floors.get(&node).copied().unwrap_or(0)
    }

    /// Every node floor, by node.
    pub fn node_floors(&self) -> impl Iterator<Item = (&NodeId, &u64)> {
        self.node_floors.iter()
    }

    /// Whether an obligation exists.
    pub fn has_obligation(&self, key: &ObligationKey) -> bool {
        self.obligations.contains_key(key)
    }

    /// Whether `endpoint` still owes an acknowledgement for `incarnation`.
    pub fn is_displacing(&self, endpoint: Address, incarnation: StreamIncarnation) -> bool {
        self.obligations
            .contains_key(&ObligationKey::Displace(endpoint, incarnation))
    }

    /// Every obligation toward `target` (a retirement and any number of displacements).
    pub fn obligations_toward(&self, target: Address) -> impl Iterator<Item = ObligationKey> + '_ {
        let first = ObligationKey::Retire(target);
        let last = ObligationKey::Displace(target, StreamIncarnation::MAX);
        self.obligations
            .range(first..=last)
            .map(|(key, _)| *key)
            .filter(move |key| key.target() == target)
    }

    /// Every obligation, in key order.
    pub fn obligation_keys(&self) -> impl Iterator<Item = &ObligationKey> {
        self.obligations.keys()
    }

    /// How many obligations are outstanding.
    pub fn obligation_count(&self) -> usize {
        self.obligations.len()
    }

    /// Every obligation, in persisted order.
    pub fn obligations_in_order(
        &self,
    ) -> impl Iterator<Item = (ObligationKey, Option<&DataPath>)> + '_ {
        self.obligation_order.values().map(|key| {
            let slot = &self.obligations[key];
            (*key, slot.fence.as_ref())
        })
    }

    fn add_obligation(&mut self, key: ObligationKey, fence: Option<DataPath>) {
        if let Some(old) = self.obligations.remove(&key) {
            self.obligation_order.remove(&old.order);
        }
        let order = self.next_order;
        self.next_order += 1;
        self.obligation_order.insert(order, key);
        self.obligations.insert(key, Slot { order, fence });
    }

    fn remove_obligation(&mut self, key: &ObligationKey) {
        if let Some(slot) = self.obligations.remove(key) {
            self.obligation_order.remove(&slot.order);
        }
    }

    fn insert_operation(&mut self, operation: OperationId, record: OperationRecord) {
        if self.operations.insert(operation, record).is_none() {
            self.issuers.entry(operation.issuer()).or_default().records += 1;
        }
    }

    fn remove_operation(&mut self, operation: OperationId) {
        if self.operations.remove(&operation).is_none() {
            return;
        }
        let issuer = operation.issuer();
        let gone = self.is_issuer_gone(issuer);
        if let Some(row) = self.issuers.get_mut(&issuer) {
            row.records -= 1;
            if row.records == 0 && (row.horizon == 0 || gone) {
                self.issuers.remove(&issuer);
            }
        }
    }

    /// Removes the records of `issuer` with sequence numbers below `below`, except those a
    /// reservation pins.
    fn prune_issuer(&mut self, issuer: Issuer, below: u64) {
        let doomed: Vec<OperationId> = self
            .operations
            .range(issuer.ids())
            .map(|(op, _)| *op)
            .take_while(|op| op.sequence() < below)
            .filter(|op| !self.reserved_ops.contains(op))
            .collect();
        for op in doomed {
            self.remove_operation(op);
        }
    }

    /// A reservation held by `operation` went: its record is no longer pinned.
    fn unpin(&mut self, operation: OperationId) {
        self.reserved_ops.remove(&operation);
        if self.is_expired(operation) {
            self.remove_operation(operation);
        }
    }

    fn remove_reservation(&mut self, path: &DataPath) -> bool {
        match self.reservations.remove(path) {
            Some(reservation) => {
                self.unpin(reservation.operation);
                true
            }
            None => false,
        }
    }

    fn is_pristine(&self) -> bool {
        *self == DurableState::default()
    }

    fn check_mutation(&self, mutation: &Mutation) -> Result<(), ApplyError> {
        match mutation {
            Mutation::Register {
                path, reservation, ..
            } => match reservation {
                Some(op) => require(
                    self.reservations
                        .get(path)
                        .is_some_and(|r| r.operation == *op),
                    "register consumes a reservation that is not held",
                ),
                None => require(
                    !self.reservations.contains_key(path),
                    "register over another reservation",
                ),
            },
            Mutation::Unregister { path, .. } => require(
                self.entries.contains_key(path),
                "unregister of an absent path",
            ),
            Mutation::Rename {
                source,
                destination,
                ..
            } => {
                require(
                    self.entries.contains_key(source),
                    "rename of an absent path",
                )?;
                require(
                    !self.reservations.contains_key(destination),
                    "rename onto a reserved path",
                )
            }
            Mutation::BindStream { path } => require(
                !self.reservations.contains_key(path),
                "stream bind over a reservation",
            ),
        }
    }

    fn apply_mutation(&mut self, mutation: &Mutation, revision: Revision) {
        match mutation {
            Mutation::Register {
                path,
                length,
                recovery,
                reservation,
            } => {
                if reservation.is_some() {
                    self.remove_reservation(path);
                }
                let entry = Entry::Blob {
                    length: *length,
                    revision,
                    recovery: recovery.clone(),
                };
                self.entries.insert(path.clone(), entry);
            }
            Mutation::Unregister { path, .. } => {
                self.entries.remove(path);
            }
            Mutation::Rename {
                source,
                destination,
                ..
            } => {
                if let Some(entry) = self.entries.remove(source) {
                    let moved = match entry {
                        Entry::Blob {
                            length, recovery, ..
                        } => Entry::Blob {
                            length,
                            revision,
                            recovery,
                        },
                        Entry::Stream { .. } => Entry::Stream { revision },
                    };
                    self.entries.insert(destination.clone(), moved);
                }
            }
            Mutation::BindStream { path } => {
                self.entries
                    .insert(path.clone(), Entry::Stream { revision });
            }
        }
    }

    /// Applies one record, or refuses it (changing nothing) if it does not fit the state.
    pub fn apply(&mut self, record: &LogRecord) -> Result<(), ApplyError> {
        self.apply_inner(record, true)
    }

    /// Applies a record the live directory just built from this very state. The searches that
    /// re-validate a mutation against the namespace are skipped in release builds (they are
    /// the directory's own checks, repeated); debug builds and recovery always run them.
    pub(crate) fn apply_own(&mut self, record: &LogRecord) -> Result<(), ApplyError> {
        self.apply_inner(record, cfg!(debug_assertions))
    }

    fn apply_inner(&mut self, record: &LogRecord, validate: bool) -> Result<(), ApplyError> {
        match record {
            LogRecord::EpochAdvanced { epoch } => {
                require(*epoch > self.epoch, "epoch does not advance")?;
                self.epoch = *epoch;
            }
            LogRecord::Committed {
                operation,
                revision,
                mutation,
                retire,
            } => {
                require(*revision == self.next_revision, "revision out of sequence")?;
                require(revision.0 < u64::MAX, "revision space exhausted")?;
                if validate {
                    require(
                        !self.operations.contains_key(operation),
                        "operation id reused",
                    )?;
                    self.check_mutation(mutation)?;
                }
                require(!self.is_expired(*operation), "operation expired")?;
                self.apply_mutation(mutation, *revision);
                if let Some(source) = retire {
                    let key = ObligationKey::Retire(*source);
                    if !self.obligations.contains_key(&key) {
                        self.add_obligation(key, None);
                    }
                }
                let record = OperationRecord {
                    key: mutation.key(),
                    outcome: Outcome::Committed(*revision),
                };
                self.insert_operation(*operation, record);
                self.next_revision = Revision(revision.0 + 1);
            }
            LogRecord::Joined {
                operation,
                path,
                revision,
            } => {
                require(
                    !self.operations.contains_key(operation),
                    "operation id reused",
                )?;
                require(!self.is_expired(*operation), "operation expired")?;
                require(
                    self.entries.get(path)
                        == Some(&Entry::Stream {
                            revision: *revision,
                        }),
                    "join of a stream node that is not at that revision",
                )?;
                let record = OperationRecord {
                    key: RequestKey::BindStream { path: path.clone() },
                    outcome: Outcome::Committed(*revision),
                };
                self.insert_operation(*operation, record);
            }
            LogRecord::Rejected {
                operation,
                key,
                rejection,
            } => {
                require(
                    !self.operations.contains_key(operation),
                    "operation id reused",
                )?;
                require(!self.is_expired(*operation), "operation expired")?;
                let record = OperationRecord {
                    key: key.clone(),
                    outcome: Outcome::Rejected(rejection.clone()),
                };
                self.insert_operation(*operation, record);
            }
            LogRecord::Reserved {
                operation,
                path,
                owner,
            } => {
                require(
                    !self.operations.contains_key(operation),
                    "operation id reused",
                )?;
                require(!self.is_expired(*operation), "operation expired")?;
                require(
                    !self.entries.contains_key(path),
                    "reservation of an occupied path",
                )?;
                require(
                    !self.reservations.contains_key(path),
                    "path already reserved",
                )?;
                let record = OperationRecord {
                    key: RequestKey::Reserve { path: path.clone() },
                    outcome: Outcome::Reserved,
                };
                self.insert_operation(*operation, record);
                let reservation = Reservation {
                    operation: *operation,
                    owner: *owner,
                };
                self.reservations.insert(path.clone(), reservation);
                self.reserved_ops.insert(*operation);
            }
            LogRecord::ReservationReleased { path } => {
                require(self.remove_reservation(path), "release of no reservation")?;
            }
            LogRecord::RetirementDone { source } => {
                let key = ObligationKey::Retire(*source);
                require(
                    self.obligations.contains_key(&key),
                    "retirement not pending",
                )?;
                self.remove_obligation(&key);
            }
            LogRecord::DisplacementQueued {
                endpoint,
                incarnation,
                fence,
            } => {
                let key = ObligationKey::Displace(*endpoint, *incarnation);
                require(
                    !self.obligations.contains_key(&key),
                    "displacement already pending",
                )?;
                self.add_obligation(key, fence.clone());
            }
            LogRecord::DisplacementDone {
                endpoint,
                incarnation,
            } => {
                let key = ObligationKey::Displace(*endpoint, *incarnation);
                require(
                    self.obligations.contains_key(&key),
                    "displacement not pending",
                )?;
                self.remove_obligation(&key);
            }
            LogRecord::NodeRestarted { node, incarnation } => {
                require(
                    *incarnation > self.node_floor(*node),
                    "node floor does not rise",
                )?;
                self.node_floors.insert(*node, *incarnation);
                // Nothing from the ended incarnations is accepted any more: their records
                // go (but for reservations still held), and so do their rows.
                let first = Issuer {
                    node: *node,
                    incarnation: 0,
                    lane: 0,
                };
                let end = Issuer {
                    node: *node,
                    incarnation: *incarnation,
                    lane: 0,
                };
                let ended: Vec<Issuer> = self.issuers.range(first..end).map(|(i, _)| *i).collect();
                for issuer in ended {
                    self.prune_issuer(issuer, OperationId::SEQUENCE_END);
                    if self
                        .issuers
                        .get(&issuer)
                        .is_some_and(|row| row.records == 0)
                    {
                        self.issuers.remove(&issuer);
                    }
                }
            }
            LogRecord::Snapshot(snapshot) => self.apply_snapshot(snapshot)?,
            LogRecord::OperationsDone { issuer, below } => {
                require(!self.is_issuer_gone(*issuer), "horizon of an ended issuer")?;
                require(
                    *below > self.horizon(*issuer) && *below <= OperationId::SEQUENCE_END,
                    "horizon does not rise",
                )?;
                self.issuers.entry(*issuer).or_default().horizon = *below;
                self.prune_issuer(*issuer, *below);
            }
            // The node's membership, not the machine's state.
            LogRecord::Member(_) => {}
            // A replica's log (dataplane-replica) is never a directory's: a directory log that
            // holds one was read from the wrong data directory, and replaying past it would
            // start a directory on someone else's state.
            LogRecord::Replica(_) => {
                return Err(ApplyError(
                    "a replica log record (the replicated directory's log) in a directory log: \
                     the wrong data directory",
                ));
            }
        }
        Ok(())
    }

    fn apply_snapshot(&mut self, record: &SnapshotRecord) -> Result<(), ApplyError> {
        match record {
            SnapshotRecord::Header {
                epoch,
                next_revision,
            } => {
                require(self.is_pristine(), "snapshot header after other records")?;
                require(next_revision.0 >= 1, "next revision is zero")?;
                self.epoch = *epoch;
                self.next_revision = *next_revision;
            }
            SnapshotRecord::Entry { path, entry } => {
                let revision = entry.revision();
                require(
                    revision.0 >= 1 && revision < self.next_revision,
                    "entry revision",
                )?;
                require(!self.entries.contains_key(path), "duplicate entry")?;
                require(
                    !self.reservations.contains_key(path),
                    "entry on a reserved path",
                )?;
                self.entries.insert(path.clone(), entry.clone());
            }
            SnapshotRecord::Operation { operation, record } => {
                if let Outcome::Committed(revision) = record.outcome {
                    require(
                        revision.0 >= 1 && revision < self.next_revision,
                        "operation revision",
                    )?;
                }
                require(
                    !self.operations.contains_key(operation),
                    "duplicate operation",
                )?;
                self.insert_operation(*operation, record.clone());
            }
            SnapshotRecord::Reservation { path, reservation } => {
                require(
                    !self.reservations.contains_key(path),
                    "duplicate reservation",
                )?;
                require(
                    !self.entries.contains_key(path),
                    "reservation on an occupied path",
                )?;
                require(
                    !self.reserved_ops.contains(&reservation.operation),
                    "one operation holds two reservations",
                )?;
                self.reservations.insert(path.clone(), reservation.clone());
                self.reserved_ops.insert(reservation.operation);
            }
            SnapshotRecord::Retirement { source } => {
                let key = ObligationKey::Retire(*source);
                require(!self.obligations.contains_key(&key), "duplicate retirement")?;
                self.add_obligation(key, None);
            }
            SnapshotRecord::Displacement {
                endpoint,
                incarnation,
                fence,
            } => {
                let key = ObligationKey::Displace(*endpoint, *incarnation);
                require(
                    !self.obligations.contains_key(&key),
                    "duplicate displacement",
                )?;
                self.add_obligation(key, fence.clone());
            }
            SnapshotRecord::NodeFloor { node, incarnation } => {
                require(!self.node_floors.contains_key(node), "duplicate node floor")?;
                self.node_floors.insert(*node, *incarnation);
            }
            SnapshotRecord::Horizon { issuer, below } => {
                require(
                    *below > 0 && *below <= OperationId::SEQUENCE_END,
                    "horizon out of range",
                )?;
                require(self.horizon(*issuer) == 0, "duplicate horizon")?;
                self.issuers.entry(*issuer).or_default().horizon = *below;
            }
        }
        Ok(())
    }

    /// The compaction of this state: records whose replay from an empty state yields a state
    /// equal to this one.
    pub fn snapshot_records(&self) -> Vec<LogRecord> {
        self.snapshot()
            .map(|record| LogRecord::Snapshot(record.to_record()))
            .collect()
    }

    /// [`DurableState::snapshot_records`] borrowed from the state, in the same order: what a
    /// compaction encodes (without cloning the state).
    pub fn snapshot(&self) -> impl Iterator<Item = SnapshotRecordRef<'_>> + '_ {
        let header = SnapshotRecordRef::Header {
            epoch: self.epoch,
            next_revision: self.next_revision,
        };
        let entries = self
            .entries
            .iter()
            .map(|(path, entry)| SnapshotRecordRef::Entry { path, entry });
        let operations =
            self.operations
                .iter()
                .map(|(operation, record)| SnapshotRecordRef::Operation {
                    operation: *operation,
                    record,
                });
        let reservations = self
            .reservations
            .iter()
            .map(|(path, reservation)| SnapshotRecordRef::Reservation { path, reservation });
        let floors =
            self.node_floors
                .iter()
                .map(|(node, incarnation)| SnapshotRecordRef::NodeFloor {
                    node: *node,
                    incarnation: *incarnation,
                });
        let horizons =
            self.issuers
                .iter()
                .filter(|(_, row)| row.horizon > 0)
                .map(|(issuer, row)| SnapshotRecordRef::Horizon {
                    issuer: *issuer,
                    below: row.horizon,
                });
        let obligations = self.obligations_in_order().map(|(key, fence)| match key {
            ObligationKey::Retire(source) => SnapshotRecordRef::Retirement { source },
            ObligationKey::Displace(endpoint, incarnation) => SnapshotRecordRef::Displacement {
                endpoint,
                incarnation,
                fence,
            },
        });
        core::iter::once(header)
            .chain(entries)
            .chain(operations)
            .chain(reservations)
            .chain(floors)
            .chain(horizons)
            .chain(obligations)
    }

    /// Checks the store invariants (SPEC §3.2, S1, S2, reservation exclusivity). Returns the
    /// first violation found.
    pub fn check(&self) -> Result<(), String> {
        self.check_structure()?;
        let mut counts: BTreeMap<Issuer, usize> = BTreeMap::new();
        for (op, record) in &self.operations {
            if let Outcome::Committed(r) = record.outcome
                && (r.0 == 0 || r >= self.next_revision)
            {
                return Err(format!("operation {op}: revision {r} out of range"));
            }
            if self.is_expired(*op) && !self.reserved_ops.contains(op) {
                return Err(format!("operation {op}: expired but still recorded"));
            }
            *counts.entry(op.issuer()).or_default() += 1;
        }
        for (issuer, row) in &self.issuers {
            if counts.get(issuer).copied().unwrap_or(0) != row.records {
                return Err(format!("issuer {issuer}: record count out of step"));
            }
        }
        if counts
            .keys()
            .any(|issuer| !self.issuers.contains_key(issuer))
        {
            return Err("records of an issuer without a row".into());
        }
        let held: BTreeSet<OperationId> = self.reservations.values().map(|r| r.operation).collect();
        if held != self.reserved_ops {
            return Err("pinned operations and reservations disagree".into());
        }
        Ok(())
    }

    /// [`DurableState::check`] without the scan of the operation table.
    pub fn check_structure(&self) -> Result<(), String> {
        if self.next_revision.0 == 0 {
            return Err("next revision is 0".into());
        }
        let mut recorded = 0;
        for (issuer, row) in &self.issuers {
            if row.records == 0 && (row.horizon == 0 || self.is_issuer_gone(*issuer)) {
                return Err(format!("issuer {issuer}: a row with nothing to keep"));
            }
            recorded += row.records;
        }
        if recorded != self.operations.len() {
            return Err("issuer record counts do not add up".into());
        }
        if self.reserved_ops.len() != self.reservations.len() {
            return Err("pinned operations and reservations disagree".into());
        }
        for (path, entry) in self.entries.iter() {
            let r = entry.revision();
            if r.0 == 0 || r >= self.next_revision {
                return Err(format!(
                    "{path}: revision {r} outside [1, {})",
                    self.next_revision
                ));
            }
        }
        for path in self.reservations.keys() {
            if self.entries.contains_key(path) {
                return Err(format!("{path}: reserved and occupied"));
            }
        }
        if self.obligations.len() != self.obligation_order.len() {
            return Err("obligation order out of step".into());
        }
        for (key, slot) in &self.obligations {
            let shape_ok = matches!(key, ObligationKey::Displace(..)) || slot.fence.is_none();
            if !shape_ok || self.obligation_order.get(&slot.order) != Some(key) {
                return Err(format!("obligation {key:?} malformed"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;

    fn issuer() -> Issuer {
        Issuer {
            node: NodeId(1),
            incarnation: 1,
            lane: 0,
        }
    }

    fn stream_open(state: &mut DurableState, op: OperationId, revision: Revision) {
        // Kept in step with the issuer's count: only the scan of the operation table sees
        // what is wrong with the record itself.
        state.operations.insert(
            op,
            OperationRecord {
                key: RequestKey::BindStream {
                    path: DataPath::new("/s").unwrap(),
                },
                outcome: Outcome::Committed(revision),
            },
        );
        state.issuers.entry(op.issuer()).or_default().records += 1;
    }

    #[test]
    fn the_named_nodes_are_those_of_sources_owners_reservations_and_obligations() {
        let a = |node| Address::new(NodeId(node), 1, 7);
        let path = |p: &str| DataPath::new(p).unwrap();
        let mut state = DurableState::default();
        assert!(state.named_nodes().is_empty());
        let blob = |recovery| Entry::Blob {
            length: 1,
            revision: Revision(1),
            recovery,
        };
        state.entries.insert(
            path("/actor"),
            blob(SourceRecovery::Actor {
                actor: a(1),
                node: NodeId(2),
                owner: Some(a(3)),
            }),
        );
        state.entries.insert(
            path("/file"),
            blob(SourceRecovery::File {
                path: crate::wire::FileRef::new("f").unwrap(),
                source: a(4),
            }),
        );
        state.entries.insert(
            path("/stream"),
            Entry::Stream {
                revision: Revision(2),
            },
        );
        state.reservations.insert(
            path("/reserved"),
            Reservation {
                operation: issuer().op(1),
                owner: a(5),
            },
        );
        state.add_obligation(ObligationKey::Retire(a(6)), None);
        state.add_obligation(
            ObligationKey::Displace(a(8), StreamIncarnation::MAX),
            Some(path("/fenced")),
        );
        let named: Vec<u64> = state.named_nodes().iter().map(|n| n.0).collect();
        assert_eq!(named, vec![1, 2, 3, 4, 5, 6, 8]);
    }

    #[test]
    fn a_snapshot_horizon_out_of_range_is_refused_with_its_reason() {
        use crate::log::{LogRecord, SnapshotRecord};
        for below in [0, OperationId::SEQUENCE_END + 1] {
            let mut state = DurableState::default();
            let record = LogRecord::Snapshot(SnapshotRecord::Horizon {
                issuer: issuer(),
                below,
            });
            let refused = state.apply(&record).unwrap_err();
            assert_eq!(
                refused.to_string(),
                "inconsistent log record: horizon out of range"
            );
            assert_eq!(
                state,
                DurableState::default(),
                "a refused record changes nothing"
            );
        }
        let mut state = DurableState::default();
        let record = LogRecord::Snapshot(SnapshotRecord::Horizon {
            issuer: issuer(),
            below: OperationId::SEQUENCE_END,
        });
        assert_eq!(state.apply(&record), Ok(()));
    }

    #[test]
    fn a_replica_record_is_refused_and_changes_nothing() {
        use crate::log::{LogRecord, ReplicaEntryKind, ReplicaRecord};
        let records = [
            ReplicaRecord::HardState {
                term: 1,
                vote: 1,
                commit: 0,
            },
            ReplicaRecord::Entry {
                index: 1,
                term: 1,
                kind: ReplicaEntryKind::Normal,
                data: Vec::new(),
                context: Vec::new(),
            },
        ];
        for record in records {
            let mut state = DurableState::default();
            let refused = state.apply(&LogRecord::Replica(record)).unwrap_err();
            assert!(
                refused.to_string().contains("wrong data directory"),
                "{refused}"
            );
            assert_eq!(
                state,
                DurableState::default(),
                "a refused record changes nothing"
            );
        }
    }

    #[test]
    fn the_full_check_finds_a_record_of_a_revision_never_allocated() {
        let mut state = DurableState::default();
        assert_eq!(state.check(), Ok(()));
        stream_open(&mut state, issuer().op(3), Revision(5));
        assert_eq!(state.check_structure(), Ok(()));
        let broken = state.check().unwrap_err();
        assert!(broken.contains("out of range"), "{broken}");
    }

    #[test]
    fn the_full_check_finds_a_record_kept_past_its_issuers_horizon() {
        let mut state = DurableState {
            next_revision: Revision(10),
            ..DurableState::default()
        };
        stream_open(&mut state, issuer().op(3), Revision(5));
        assert_eq!(state.check(), Ok(()));
        state.issuers.entry(issuer()).or_default().horizon = 4;
        assert_eq!(state.check_structure(), Ok(()));
        let broken = state.check().unwrap_err();
        assert!(broken.contains("expired but still recorded"), "{broken}");
    }
}

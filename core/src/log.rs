//! The directory's durable delta log (DESIGN.md §4).
//!
//! Every mutation produces one [`LogRecord`]. On disk a record is framed as
//!
//! ```text
//! [ body length: u32 LE ][ CRC-32C of body: u32 LE ][ body: postcard ]
//! ```
//!
//! [`decode_log`] reads frames until the first one that is truncated, oversized, fails its
//! checksum or does not decode, and reports where the valid prefix ends. Whether the bytes after
//! it are a torn tail the driver may cut or damage to acknowledged records it must not is
//! something the frames cannot say; the storage protocol tells them apart with sync marks of
//! its own between the frames ([`crate::storage`]). Compaction writes [`SnapshotRecord`]s, whose
//! replay yields the same durable state as the log they replace.

use core::fmt;
use serde::{Deserialize, Serialize};

use crate::error::NamespaceError;
use crate::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, Revision, StreamIncarnation,
};
use crate::kinds::{EntryKind, Limit, StreamRole};
use crate::limits::LOG_RECORD_BYTES_MAX;
use crate::path::DataPath;
use crate::wire::{EncodeError, SourceRecovery};

/// Bytes of framing before each record body.
pub const FRAME_HEADER_BYTES: usize = 8;

/// The request an operation id was first used for (SPEC §4.3). A retry with the same id must
/// carry the same key, or it gets `OperationConflict`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RequestKey {
    /// `Register{path, length, recovery}`; the source address is not part of the key.
    Register {
        /// Where.
        path: DataPath,
        /// Payload length.
        length: u64,
        /// Recovery record.
        recovery: SourceRecovery,
    },
    /// Stream opens and cancels.
    BindStream {
        /// Where.
        path: DataPath,
    },
    /// `Unregister{path, expected_revision}`.
    Unregister {
        /// Where.
        path: DataPath,
        /// The compare-and-delete revision.
        expected_revision: Option<Revision>,
    },
    /// `Rename{source, destination, replace}`.
    Rename {
        /// From.
        source: DataPath,
        /// To.
        destination: DataPath,
        /// Replace flag.
        replace: bool,
    },
    /// `ReserveBlob` and `ReleaseBlobReservation`.
    Reserve {
        /// Where.
        path: DataPath,
    },
}

/// The kinds of rejection, all sticky (persisted under the operation id): once a caller has
/// been told an operation was refused, that operation id never takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectionKind {
    /// Nothing bound.
    PathNotFound,
    /// Occupied or reserved.
    PathExists,
    /// A stream is pending or active.
    StreamActive,
    /// Replaced, reservation vanished, or cancelled.
    PathReplaced,
    /// The path holds the other kind of entry (or, for Unregister, a live rendezvous).
    WrongEntryType {
        /// The kind the request needed.
        expected: EntryKind,
        /// The kind that was there.
        found: EntryKind,
    },
    /// A rendezvous already held the role.
    DuplicateStreamRole(StreamRole),
    /// A named limit was reached.
    LimitReached(Limit),
}

/// A sticky rejection: the error an operation id answers forever.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rejection {
    /// Which error.
    pub kind: RejectionKind,
    /// The path it names.
    pub path: DataPath,
}

impl Rejection {
    /// The error replied for this rejection.
    pub fn error(&self) -> NamespaceError {
        let path = self.path.clone();
        match self.kind {
            RejectionKind::PathNotFound => NamespaceError::PathNotFound(path),
            RejectionKind::PathExists => NamespaceError::PathExists(path),
            RejectionKind::StreamActive => NamespaceError::StreamActive(path),
            RejectionKind::PathReplaced => NamespaceError::PathReplaced(path),
            RejectionKind::WrongEntryType { expected, found } => NamespaceError::WrongEntryType {
                path,
                expected,
                found,
            },
            RejectionKind::DuplicateStreamRole(role) => {
                NamespaceError::DuplicateStreamRole { path, role }
            }
            RejectionKind::LimitReached(limit) => NamespaceError::LimitReached(limit),
        }
    }
}

/// What happened to an operation id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// The mutation committed at this revision.
    Committed(Revision),
    /// The mutation was rejected, for good.
    Rejected(Rejection),
    /// The reservation was granted (it may since have been consumed or released).
    Reserved,
}

/// One entry of the idempotency table.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OperationRecord {
    /// What the id was used for.
    pub key: RequestKey,
    /// What became of it.
    pub outcome: Outcome,
}

/// A revision-allocating mutation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mutation {
    /// Bind a blob (replacing whatever is there), consuming `reservation` if given.
    Register {
        /// Where.
        path: DataPath,
        /// Payload length.
        length: u64,
        /// Recovery record.
        recovery: SourceRecovery,
        /// The reservation consumed.
        reservation: Option<OperationId>,
    },
    /// Remove a blob or a stream node.
    Unregister {
        /// Where.
        path: DataPath,
        /// The request's compare-and-delete revision (part of the key).
        expected_revision: Option<Revision>,
    },
    /// Move an entry, replacing the destination.
    Rename {
        /// From.
        source: DataPath,
        /// To.
        destination: DataPath,
        /// The request's replace flag (part of the key).
        replace: bool,
    },
    /// Make the path a stream node at the new revision (the first opener's bind).
    BindStream {
        /// Where.
        path: DataPath,
    },
}

impl Mutation {
    /// The idempotency key of the request that produced this mutation.
    pub fn key(&self) -> RequestKey {
        match self {
            Mutation::Register {
                path,
                length,
                recovery,
                ..
            } => RequestKey::Register {
                path: path.clone(),
                length: *length,
                recovery: recovery.clone(),
            },
            Mutation::Unregister {
                path,
                expected_revision,
            } => RequestKey::Unregister {
                path: path.clone(),
                expected_revision: *expected_revision,
            },
            Mutation::Rename {
                source,
                destination,
                replace,
            } => RequestKey::Rename {
                source: source.clone(),
                destination: destination.clone(),
                replace: *replace,
            },
            Mutation::BindStream { path } => RequestKey::BindStream { path: path.clone() },
        }
    }
}

/// What a durable namespace entry is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Entry {
    /// A blob binding.
    Blob {
        /// Payload length.
        length: u64,
        /// Revision of the binding.
        revision: Revision,
        /// How to recreate its source.
        recovery: SourceRecovery,
    },
    /// A stream node.
    Stream {
        /// Revision of the node (the last bind or rename).
        revision: Revision,
    },
}

impl Entry {
    /// The entry's revision.
    pub fn revision(&self) -> Revision {
        match self {
            Entry::Blob { revision, .. } | Entry::Stream { revision } => *revision,
        }
    }
}

/// A durable blob reservation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reservation {
    /// The reserving operation.
    pub operation: OperationId,
    /// On whose behalf; released if reported gone.
    pub owner: Address,
}

/// Records written by compaction; their replay from an empty state rebuilds the durable state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SnapshotRecord {
    /// First record of a snapshot: the counters.
    Header {
        /// Last adopted epoch.
        epoch: AuthorityEpoch,
        /// Next revision to allocate.
        next_revision: Revision,
    },
    /// One namespace entry.
    Entry {
        /// Where.
        path: DataPath,
        /// What.
        entry: Entry,
    },
    /// One idempotency table row.
    Operation {
        /// The id.
        operation: OperationId,
        /// Its row.
        record: OperationRecord,
    },
    /// One live reservation.
    Reservation {
        /// Where.
        path: DataPath,
        /// Held by.
        reservation: Reservation,
    },
    /// One retirement obligation, in persisted order.
    Retirement {
        /// The source to retire.
        source: Address,
    },
    /// One displacement obligation, in persisted order.
    Displacement {
        /// The endpoint to notify.
        endpoint: Address,
        /// The displaced rendezvous.
        incarnation: StreamIncarnation,
        /// The path whose replacement fence waits for it, if any.
        fence: Option<DataPath>,
    },
    /// One node's incarnation floor.
    NodeFloor {
        /// The node.
        node: NodeId,
        /// Addresses of earlier incarnations are gone.
        incarnation: u64,
    },
    /// One issuer's horizon: its operations below `below` are done (their records are gone).
    Horizon {
        /// The issuer.
        issuer: Issuer,
        /// Sequence numbers below this are done.
        below: u64,
    },
}

/// A [`SnapshotRecord`] borrowed from the live state: a compaction encodes these instead of
/// cloning every entry and operation row into owned records first (the clone was half of a
/// compaction's time at 350k entries). It serializes to exactly the bytes of the
/// [`SnapshotRecord`] it stands for (same variants, same order, same fields; serde writes a
/// `&T` as a `T`), which `snapshot_refs_encode_as_the_records_they_stand_for` checks.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename = "SnapshotRecord")]
pub enum SnapshotRecordRef<'a> {
    /// [`SnapshotRecord::Header`].
    Header {
        /// Last adopted epoch.
        epoch: AuthorityEpoch,
        /// Next revision to allocate.
        next_revision: Revision,
    },
    /// [`SnapshotRecord::Entry`].
    Entry {
        /// Where.
        path: &'a DataPath,
        /// What.
        entry: &'a Entry,
    },
    /// [`SnapshotRecord::Operation`].
    Operation {
        /// The id.
        operation: OperationId,
        /// Its row.
        record: &'a OperationRecord,
    },
    /// [`SnapshotRecord::Reservation`].
    Reservation {
        /// Where.
        path: &'a DataPath,
        /// Held by.
        reservation: &'a Reservation,
    },
    /// [`SnapshotRecord::Retirement`].
    Retirement {
        /// The source to retire.
        source: Address,
    },
    /// [`SnapshotRecord::Displacement`].
    Displacement {
        /// The endpoint to notify.
        endpoint: Address,
        /// The displaced rendezvous.
        incarnation: StreamIncarnation,
        /// The path whose replacement fence waits for it, if any.
        fence: Option<&'a DataPath>,
    },
    /// [`SnapshotRecord::NodeFloor`].
    NodeFloor {
        /// The node.
        node: NodeId,
        /// Addresses of earlier incarnations are gone.
        incarnation: u64,
    },
    /// [`SnapshotRecord::Horizon`].
    Horizon {
        /// The issuer.
        issuer: Issuer,
        /// Sequence numbers below this are done.
        below: u64,
    },
}

impl SnapshotRecordRef<'_> {
    /// The owned record this one stands for.
    pub fn to_record(self) -> SnapshotRecord {
        match self {
            SnapshotRecordRef::Header {
                epoch,
                next_revision,
            } => SnapshotRecord::Header {
                epoch,
                next_revision,
            },
            SnapshotRecordRef::Entry { path, entry } => SnapshotRecord::Entry {
                path: path.clone(),
                entry: entry.clone(),
            },
            SnapshotRecordRef::Operation { operation, record } => SnapshotRecord::Operation {
                operation,
                record: record.clone(),
            },
            SnapshotRecordRef::Reservation { path, reservation } => SnapshotRecord::Reservation {
                path: path.clone(),
                reservation: reservation.clone(),
            },
            SnapshotRecordRef::Retirement { source } => SnapshotRecord::Retirement { source },
            SnapshotRecordRef::Displacement {
                endpoint,
                incarnation,
                fence,
            } => SnapshotRecord::Displacement {
                endpoint,
                incarnation,
                fence: fence.cloned(),
            },
            SnapshotRecordRef::NodeFloor { node, incarnation } => {
                SnapshotRecord::NodeFloor { node, incarnation }
            }
            SnapshotRecordRef::Horizon { issuer, below } => {
                SnapshotRecord::Horizon { issuer, below }
            }
        }
    }
}

/// A record a compaction writes, borrowed: a snapshot record of the live state, or a whole
/// record (the membership's). Encodes as the [`LogRecord`] it stands for.
#[derive(Clone, Copy, Debug)]
pub enum RecordRef<'a> {
    /// `LogRecord::Snapshot` of the borrowed snapshot record.
    Snapshot(SnapshotRecordRef<'a>),
    /// A record as it is.
    Record(&'a LogRecord),
}

/// The position of [`LogRecord::Snapshot`] among `LogRecord`'s variants: postcard writes an
/// enum's variant by position, so [`RecordRef`] must name the same one (the test
/// `snapshot_refs_encode_as_the_records_they_stand_for` fails if a variant is added before it).
const SNAPSHOT_VARIANT: u32 = 10;

impl Serialize for RecordRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            RecordRef::Snapshot(record) => serializer.serialize_newtype_variant(
                "LogRecord",
                SNAPSHOT_VARIANT,
                "Snapshot",
                record,
            ),
            RecordRef::Record(record) => record.serialize(serializer),
        }
    }
}

/// One durable change of the directory's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LogRecord {
    /// A recovery adopted `epoch`; everything after it was served under that epoch.
    EpochAdvanced {
        /// The new epoch.
        epoch: AuthorityEpoch,
    },
    /// A mutation committed at `revision` under `operation`; `retire` is the live source it
    /// removed or replaced, which now has a retirement obligation (SPEC S7).
    Committed {
        /// The idempotency key.
        operation: OperationId,
        /// The allocated revision (must equal the state's next revision).
        revision: Revision,
        /// What changed.
        mutation: Mutation,
        /// The source to retire, if any.
        retire: Option<Address>,
    },
    /// The second participant of a rendezvous joined at the first one's revision.
    Joined {
        /// The joiner's operation id.
        operation: OperationId,
        /// The stream path.
        path: DataPath,
        /// The rendezvous revision.
        revision: Revision,
    },
    /// A sticky rejection (also the tombstone of a cancel or release of an unknown id).
    Rejected {
        /// The operation id.
        operation: OperationId,
        /// Its request key.
        key: RequestKey,
        /// The rejection.
        rejection: Rejection,
    },
    /// A reservation was granted.
    Reserved {
        /// The reserving operation.
        operation: OperationId,
        /// Where.
        path: DataPath,
        /// On whose behalf.
        owner: Address,
    },
    /// The reservation on `path` was released (by its owner, or because the owner is gone).
    ReservationReleased {
        /// Where.
        path: DataPath,
    },
    /// The retirement obligation toward `source` completed.
    RetirementDone {
        /// The retired source.
        source: Address,
    },
    /// A displacement obligation toward `endpoint` for `incarnation` was created.
    DisplacementQueued {
        /// The endpoint.
        endpoint: Address,
        /// The displaced rendezvous.
        incarnation: StreamIncarnation,
        /// The path whose replacement fence waits for the acknowledgement, if any.
        fence: Option<DataPath>,
    },
    /// The displacement obligation toward `endpoint` for `incarnation` completed.
    DisplacementDone {
        /// The endpoint.
        endpoint: Address,
        /// The displaced rendezvous.
        incarnation: StreamIncarnation,
    },
    /// A host reported that `node` restarted into `incarnation`: every address of an earlier
    /// incarnation is gone for good, and new opens, registers and reservations naming one are
    /// refused. Every operation an earlier incarnation issued is expired: its record is pruned
    /// (but for a reservation still held, which goes with it) and its issuer row with it.
    NodeRestarted {
        /// The node.
        node: NodeId,
        /// Its new incarnation (the floor below which addresses are gone).
        incarnation: u64,
    },
    /// A compaction record.
    Snapshot(SnapshotRecord),
    /// `issuer` declared every operation below sequence `below` done (and no record of them
    /// is pinned by a live rendezvous): their records are pruned, except those of
    /// reservations still held, which go when the reservation does. From now on they are
    /// refused `OperationExpired`.
    OperationsDone {
        /// The issuer.
        issuer: Issuer,
        /// The new horizon (above the old one).
        below: u64,
    },
    /// The directory node's membership (node ids, incarnations, boots): the machine ignores
    /// it; `membership::Membership` reads it back.
    Member(MemberRecord),
    /// A replica of the replicated directory's log (dataplane-replica): its hard state or one
    /// of its entries, kept on disk through the same storage protocol as a directory's log.
    /// The directory machine refuses it (a directory log holding one is the wrong data
    /// directory); `membership::Membership` skips it. Last of the variants: postcard tags are
    /// positional, so logs written before it existed still decode.
    Replica(ReplicaRecord),
}

/// One durable change of a replica of the replicated directory's log (dataplane-replica's
/// `Durable`): replayed in order, these rebuild what the replica's disk holds. Core only
/// carries them (it knows nothing of the consensus engine); the replica crate gives them
/// their meaning and checks them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplicaRecord {
    /// The replica's hard state, replacing the one before.
    HardState {
        /// The current term.
        term: u64,
        /// Whom the replica voted for in `term` (0: nobody).
        vote: u64,
        /// The highest index known committed.
        commit: u64,
    },
    /// One entry of the replicated log. It replaces every entry from `index` on (a new leader
    /// overwrites a suffix the old one did not commit), so `index` is at most one past the
    /// last entry.
    Entry {
        /// Its position in the log (from 1).
        index: u64,
        /// The term of the leader that appended it.
        term: u64,
        /// What it carries.
        kind: ReplicaEntryKind,
        /// The proposal's bytes.
        data: Vec<u8>,
        /// The proposal's context bytes.
        context: Vec<u8>,
    },
    /// The start of a snapshot of the replicated state up to `index` (the replica installed it
    /// from its leader, or a compaction restates it): `len` bytes follow in
    /// [`ReplicaRecord::SnapshotPart`]s. Once they are all there, the snapshot replaces the
    /// one before and every entry (the log goes on from `index + 1`); a snapshot whose parts
    /// stop short is a torn round's, and is ignored only at the very end of a log.
    SnapshotStart {
        /// The last index the snapshot covers.
        index: u64,
        /// That entry's term.
        term: u64,
        /// The group's configuration at `index`.
        conf: ReplicaConf,
        /// The snapshot's length in bytes (all its parts together).
        len: u64,
    },
    /// The next bytes of the snapshot being restated (each part within the record limit).
    SnapshotPart(Vec<u8>),
}

/// A replicated log's group configuration (the engine's `ConfState`, mirrored).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplicaConf {
    /// The voters (of the incoming configuration, during a joint change).
    pub voters: Vec<u64>,
    /// The learners.
    pub learners: Vec<u64>,
    /// The outgoing configuration's voters during a joint change.
    pub voters_outgoing: Vec<u64>,
    /// Learners that become so when a joint change is left.
    pub learners_next: Vec<u64>,
    /// Whether a joint change is left automatically.
    pub auto_leave: bool,
}

/// What a replicated log entry carries (the engine's entry types, mirrored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplicaEntryKind {
    /// A proposal of the replicated state machine (or the empty entry a new leader appends).
    Normal,
    /// A membership change (joint consensus).
    ConfChange,
    /// A membership change in the engine's second format.
    ConfChangeV2,
}

/// One durable change of the membership.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemberRecord {
    /// The directory booted for the `boots`-th time.
    Booted {
        /// Boots so far, this one included.
        boots: u64,
    },
    /// The host listening on `listen` is `node` at `incarnation`, started with `boot_nonce`.
    Host {
        /// Where the host listens (its identity).
        listen: String,
        /// Its node id.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
        /// The boot nonce of the process that has this incarnation.
        boot_nonce: u64,
    },
    /// The host listening on `listen`, node `node`, is no longer a member: forgotten to make
    /// room for a new host (see `dataplane_core::membership`). Its node id is never handed out
    /// again.
    Forgot {
        /// Where it listened.
        listen: String,
        /// Its node id.
        node: NodeId,
    },
    /// Node ids below `next` have been handed out (a compaction's restatement, so that the
    /// ids of forgotten hosts are not handed out again after it).
    NodesIssued {
        /// The next node id to hand out.
        next: NodeId,
    },
}

/// Appends `record` framed (length, CRC-32C, postcard body) to `buf`; returns the frame size.
pub fn append_record(buf: &mut Vec<u8>, record: &LogRecord) -> Result<usize, EncodeError> {
    append_framed(buf, record)
}

/// [`append_record`] of the record `record` stands for, without building it.
pub fn append_record_ref(buf: &mut Vec<u8>, record: &RecordRef<'_>) -> Result<usize, EncodeError> {
    append_framed(buf, record)
}

fn append_framed<T: Serialize + ?Sized>(
    buf: &mut Vec<u8>,
    record: &T,
) -> Result<usize, EncodeError> {
    let start = buf.len();
    buf.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    let body_start = buf.len();
    let framed = postcard::to_extend(record, core::mem::take(buf));
    *buf = match framed {
        Ok(b) => b,
        Err(e) => return Err(EncodeError::Serialize(e.to_string())),
    };
    let body_len = buf.len() - body_start;
    if body_len > LOG_RECORD_BYTES_MAX {
        buf.truncate(start);
        return Err(EncodeError::TooLarge {
            len: body_len,
            max: LOG_RECORD_BYTES_MAX,
        });
    }
    let crc = crc32c::crc32c(&buf[body_start..]);
    // `body_len` fits in u32: it is at most LOG_RECORD_BYTES_MAX.
    buf[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(buf.len() - start)
}

/// Encodes a sequence of records as one log image.
pub fn encode_log<'a>(
    records: impl IntoIterator<Item = &'a LogRecord>,
) -> Result<Vec<u8>, EncodeError> {
    let mut buf = Vec::new();
    for record in records {
        append_record(&mut buf, record)?;
    }
    Ok(buf)
}

/// Why the log stops where it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TailDefect {
    /// The last frame is incomplete (a torn write).
    Truncated {
        /// Where the frame starts.
        offset: usize,
    },
    /// A frame claims a body larger than [`LOG_RECORD_BYTES_MAX`].
    Oversized {
        /// Where the frame starts.
        offset: usize,
        /// The claimed length.
        len: usize,
    },
    /// A frame's checksum does not match its body.
    Checksum {
        /// Where the frame starts.
        offset: usize,
    },
    /// A frame's body does not decode as a record.
    Malformed {
        /// Where the frame starts.
        offset: usize,
    },
}

impl TailDefect {
    /// Where the valid prefix ends.
    pub fn offset(&self) -> usize {
        match *self {
            TailDefect::Truncated { offset }
            | TailDefect::Oversized { offset, .. }
            | TailDefect::Checksum { offset }
            | TailDefect::Malformed { offset } => offset,
        }
    }
}

impl fmt::Display for TailDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TailDefect::Truncated { offset } => write!(f, "torn record at byte {offset}"),
            TailDefect::Oversized { offset, len } => {
                write!(f, "record at byte {offset} claims {len} bytes")
            }
            TailDefect::Checksum { offset } => write!(f, "checksum mismatch at byte {offset}"),
            TailDefect::Malformed { offset } => write!(f, "undecodable record at byte {offset}"),
        }
    }
}

/// The valid prefix of a log image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedLog {
    /// The records of the valid prefix, in order.
    pub records: Vec<LogRecord>,
    /// Length of the valid prefix in bytes: where the driver cuts a torn tail.
    pub valid_len: usize,
    /// Why decoding stopped before the end, if it did.
    pub defect: Option<TailDefect>,
}

/// Decodes `bytes` up to the first bad frame. Never panics.
pub fn decode_log(bytes: &[u8]) -> DecodedLog {
    let mut records = Vec::new();
    let mut offset = 0;
    let defect = loop {
        let rest = &bytes[offset..];
        if rest.is_empty() {
            break None;
        }
        if rest.len() < FRAME_HEADER_BYTES {
            break Some(TailDefect::Truncated { offset });
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > LOG_RECORD_BYTES_MAX {
            break Some(TailDefect::Oversized { offset, len });
        }
        let Some(body) = rest.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len) else {
            break Some(TailDefect::Truncated { offset });
        };
        if crc32c::crc32c(body) != crc {
            break Some(TailDefect::Checksum { offset });
        }
        match postcard::take_from_bytes::<LogRecord>(body) {
            Ok((record, [])) => records.push(record),
            _ => break Some(TailDefect::Malformed { offset }),
        }
        offset += FRAME_HEADER_BYTES + len;
    };
    DecodedLog {
        records,
        valid_len: offset,
        defect,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> Vec<LogRecord> {
        let path = DataPath::new("/a").unwrap();
        vec![
            LogRecord::EpochAdvanced {
                epoch: AuthorityEpoch(1),
            },
            LogRecord::Committed {
                operation: OperationId(5),
                revision: Revision(1),
                mutation: Mutation::BindStream { path },
                retire: Some(Address::new(NodeId(2), 1, 3)),
            },
            LogRecord::RetirementDone {
                source: Address::new(NodeId(2), 1, 3),
            },
        ]
    }

    #[test]
    fn logs_round_trip() {
        let recs = records();
        let image = encode_log(&recs).unwrap();
        let decoded = decode_log(&image);
        assert_eq!(decoded.records, recs);
        assert_eq!(decoded.valid_len, image.len());
        assert_eq!(decoded.defect, None);
    }

    #[test]
    fn every_torn_tail_is_cut_at_the_last_whole_record() {
        let recs = records();
        let image = encode_log(&recs).unwrap();
        let mut boundaries = vec![0];
        let mut buf = Vec::new();
        for r in &recs {
            append_record(&mut buf, r).unwrap();
            boundaries.push(buf.len());
        }
        for cut in 0..image.len() {
            let decoded = decode_log(&image[..cut]);
            let whole = boundaries.iter().filter(|&&b| b <= cut).count() - 1;
            assert_eq!(decoded.records, recs[..whole], "cut at {cut}");
            assert_eq!(decoded.valid_len, boundaries[whole]);
            assert_eq!(decoded.defect.is_some(), cut != boundaries[whole]);
        }
    }

    #[test]
    fn a_flipped_bit_cuts_the_log_at_that_record() {
        let recs = records();
        let image = encode_log(&recs).unwrap();
        let first =
            FRAME_HEADER_BYTES + u32::from_le_bytes(image[0..4].try_into().unwrap()) as usize;
        let mut corrupt = image;
        corrupt[first + FRAME_HEADER_BYTES] ^= 0x40;
        let decoded = decode_log(&corrupt);
        assert_eq!(decoded.records, recs[..1]);
        assert_eq!(decoded.defect, Some(TailDefect::Checksum { offset: first }));
    }

    #[test]
    fn replica_records_come_last_so_older_logs_keep_their_tags() {
        // Postcard writes an enum's variant index first: a variant inserted before `Member`
        // would make every log written before it decode as something else.
        let member = LogRecord::Member(MemberRecord::Booted { boots: 1 });
        assert_eq!(postcard::to_allocvec(&member).unwrap()[0], 12);
        let replica = LogRecord::Replica(ReplicaRecord::Entry {
            index: 3,
            term: 2,
            kind: ReplicaEntryKind::ConfChangeV2,
            data: vec![1, 2, 3],
            context: vec![4],
        });
        assert_eq!(postcard::to_allocvec(&replica).unwrap()[0], 13);
        let recs = vec![
            replica,
            LogRecord::Replica(ReplicaRecord::HardState {
                term: 2,
                vote: 1,
                commit: 3,
            }),
        ];
        let decoded = decode_log(&encode_log(&recs).unwrap());
        assert_eq!((decoded.records, decoded.defect), (recs, None));
    }

    #[test]
    fn oversized_length_prefixes_are_defects() {
        let mut image = vec![0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0];
        image.extend_from_slice(&[1, 2, 3]);
        assert!(matches!(
            decode_log(&image).defect,
            Some(TailDefect::Oversized { .. })
        ));
    }

    /// The test's own borrowing of an owned snapshot record (not the code's: the directory
    /// borrows from its state, never from records).
    fn borrowed(record: &SnapshotRecord) -> SnapshotRecordRef<'_> {
        match record {
            SnapshotRecord::Header {
                epoch,
                next_revision,
            } => SnapshotRecordRef::Header {
                epoch: *epoch,
                next_revision: *next_revision,
            },
            SnapshotRecord::Entry { path, entry } => SnapshotRecordRef::Entry { path, entry },
            SnapshotRecord::Operation { operation, record } => SnapshotRecordRef::Operation {
                operation: *operation,
                record,
            },
            SnapshotRecord::Reservation { path, reservation } => {
                SnapshotRecordRef::Reservation { path, reservation }
            }
            SnapshotRecord::Retirement { source } => {
                SnapshotRecordRef::Retirement { source: *source }
            }
            SnapshotRecord::Displacement {
                endpoint,
                incarnation,
                fence,
            } => SnapshotRecordRef::Displacement {
                endpoint: *endpoint,
                incarnation: *incarnation,
                fence: fence.as_ref(),
            },
            SnapshotRecord::NodeFloor { node, incarnation } => SnapshotRecordRef::NodeFloor {
                node: *node,
                incarnation: *incarnation,
            },
            SnapshotRecord::Horizon { issuer, below } => SnapshotRecordRef::Horizon {
                issuer: *issuer,
                below: *below,
            },
        }
    }

    #[test]
    fn snapshot_refs_encode_as_the_records_they_stand_for() {
        let path = DataPath::new("/a/b").unwrap();
        let source = Address::new(NodeId(2), 1, 3);
        let recovery = SourceRecovery::Actor {
            actor: source,
            node: source.node,
            owner: Some(Address::new(NodeId(2), 4, 5)),
        };
        let incarnation = StreamIncarnation {
            epoch: AuthorityEpoch(3),
            revision: Revision(9),
        };
        let every_variant = [
            SnapshotRecord::Header {
                epoch: AuthorityEpoch(7),
                next_revision: Revision(1 << 40),
            },
            SnapshotRecord::Entry {
                path: path.clone(),
                entry: Entry::Blob {
                    length: 4096,
                    revision: Revision(8),
                    recovery: recovery.clone(),
                },
            },
            SnapshotRecord::Entry {
                path: path.clone(),
                entry: Entry::Stream {
                    revision: Revision(2),
                },
            },
            SnapshotRecord::Operation {
                operation: OperationId(u128::MAX - 1),
                record: OperationRecord {
                    key: RequestKey::Register {
                        path: path.clone(),
                        length: 1,
                        recovery,
                    },
                    outcome: Outcome::Committed(Revision(8)),
                },
            },
            SnapshotRecord::Reservation {
                path: path.clone(),
                reservation: Reservation {
                    operation: OperationId(77),
                    owner: source,
                },
            },
            SnapshotRecord::Retirement { source },
            SnapshotRecord::Displacement {
                endpoint: source,
                incarnation,
                fence: Some(path),
            },
            SnapshotRecord::Displacement {
                endpoint: source,
                incarnation,
                fence: None,
            },
            SnapshotRecord::NodeFloor {
                node: NodeId(5),
                incarnation: 6,
            },
            SnapshotRecord::Horizon {
                issuer: Issuer::of(source, 2),
                below: 300,
            },
        ];
        for record in &every_variant {
            let owned = LogRecord::Snapshot(record.clone());
            let by_ref = RecordRef::Snapshot(borrowed(record));
            assert_eq!(
                postcard::to_allocvec(&by_ref).unwrap(),
                postcard::to_allocvec(&owned).unwrap(),
                "{record:?}"
            );
            let (mut a, mut b) = (Vec::new(), Vec::new());
            append_record(&mut a, &owned).unwrap();
            append_record_ref(&mut b, &by_ref).unwrap();
            assert_eq!(a, b, "framed {record:?}");
            assert_eq!(
                decode_log(&b).records,
                std::slice::from_ref(&owned),
                "{record:?}"
            );
            assert_eq!(borrowed(record).to_record(), *record);
            let whole = RecordRef::Record(&owned);
            assert_eq!(
                postcard::to_allocvec(&whole).unwrap(),
                a[FRAME_HEADER_BYTES..]
            );
        }
    }
}

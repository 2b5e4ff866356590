//! The wire vocabulary: every message that crosses a network link, as serde types, and the one
//! `encode`/`decode` pair (postcard) with a frame-size limit.
//!
//! Decoding validates as it goes (paths, descriptor and reason lengths), rejects trailing bytes
//! and oversized frames, and never panics: any byte string either decodes to a well-formed
//! [`Envelope`] or yields a [`DecodeError`].

use core::fmt;
use serde::{Deserialize, Serialize};

use crate::error::{DataPlaneError, NamespaceError, Reason};
pub use crate::kinds::{EntryKind, StreamRole};

use crate::kinds::{BlobAccess, DigestKind};
use crate::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use crate::limits::{DESCRIPTOR_BYTES_MAX, FILE_REF_BYTES_MAX, FRAME_BYTES_MAX};
use crate::path::DataPath;

/// What `Lookup` reports about a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NamespaceNode {
    /// Blob or stream.
    pub kind: EntryKind,
    /// The entry's revision.
    pub revision: Revision,
    /// For streams: whether a pending or active rendezvous exists.
    pub active: bool,
    /// For blobs: whether the blob is lost — its source belonged to an incarnation of its node
    /// that has ended, so its bytes are gone for good (`Resolve` answers
    /// [`NamespaceError::BlobLost`] for it). Always false for streams.
    pub lost: bool,
}

/// A resolve result: a value snapshot that later mutations never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlobBinding {
    /// The actor serving the bytes.
    pub source: Address,
    /// The node the source runs on.
    pub source_node: NodeId,
    /// The owner recorded at registration, if any.
    pub owner: Option<Address>,
    /// Payload length in bytes.
    pub length: u64,
    /// The binding's revision.
    pub revision: Revision,
}

/// Opaque transport addressing supplied by each stream opener (at most
/// [`DESCRIPTOR_BYTES_MAX`] bytes).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Descriptor(Vec<u8>);

impl Serialize for Descriptor {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Descriptor {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_byte_buf(BoundedBytes(DESCRIPTOR_BYTES_MAX))
            .map(Descriptor)
    }
}

/// Decodes a byte string of at most `.0` bytes, refusing a longer one before copying it.
/// Byte strings are written as a length and the raw bytes (`serialize_bytes`), which postcard
/// lays out exactly like a `Vec<u8>`, but copies in one go instead of byte by byte.
struct BoundedBytes(usize);

impl<'de> serde::de::Visitor<'de> for BoundedBytes {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at most {} bytes", self.0)
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        if v.len() > self.0 {
            return Err(E::invalid_length(v.len(), &self));
        }
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        if v.len() > self.0 {
            return Err(E::invalid_length(v.len(), &self));
        }
        Ok(v)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.0));
        while let Some(byte) = seq.next_element::<u8>()? {
            if out.len() == self.0 {
                return Err(serde::de::Error::invalid_length(out.len() + 1, &self));
            }
            out.push(byte);
        }
        Ok(out)
    }
}

impl Descriptor {
    /// Wraps `bytes` if they fit the limit.
    pub fn new(bytes: Vec<u8>) -> Result<Self, TooLong> {
        if bytes.len() > DESCRIPTOR_BYTES_MAX {
            Err(TooLong)
        } else {
            Ok(Descriptor(bytes))
        }
    }

    /// The descriptor bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Descriptor({} bytes)", self.0.len())
    }
}

/// A bounded value decoded from a frame exceeded its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLong;

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("value longer than its limit")
    }
}

impl TryFrom<Vec<u8>> for Descriptor {
    type Error = TooLong;
    fn try_from(value: Vec<u8>) -> Result<Self, Self::Error> {
        Descriptor::new(value)
    }
}

/// A reference to a file on the directory's node (at most [`FILE_REF_BYTES_MAX`] bytes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FileRef(String);

impl FileRef {
    /// Wraps `path` if it fits the limit and has no NUL.
    pub fn new(path: impl Into<String>) -> Result<Self, TooLong> {
        let path = path.into();
        if path.len() > FILE_REF_BYTES_MAX || path.contains('\0') {
            Err(TooLong)
        } else {
            Ok(FileRef(path))
        }
    }

    /// The file path.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for FileRef {
    type Error = TooLong;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        FileRef::new(value)
    }
}

impl From<FileRef> for String {
    fn from(value: FileRef) -> Self {
        value.0
    }
}

/// How to recreate a runtime source after a directory restart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SourceRecovery {
    /// A long-lived actor; after restart the same address serves again.
    Actor {
        /// The source actor.
        actor: Address,
        /// The node it runs on (must equal the Register's `source_node` for resolve to be
        /// stable across restarts, SPEC §15.1 item 2).
        node: NodeId,
        /// The owner to report in resolves.
        owner: Option<Address>,
    },
    /// A file on the directory's node; the driver's recovery hook creates a new source.
    File {
        /// The file.
        path: FileRef,
    },
}

/// The receipt of a committed mutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MutationReceipt {
    /// The revision the mutation allocated.
    pub revision: Revision,
}

/// The value both participants of a rendezvous receive.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StreamMatch {
    /// The rendezvous identity.
    pub incarnation: StreamIncarnation,
    /// The writer's endpoint.
    pub source: Address,
    /// The writer's descriptor.
    pub source_descriptor: Descriptor,
    /// The reader's endpoint.
    pub sink: Address,
    /// The reader's descriptor.
    pub sink_descriptor: Descriptor,
    /// Equal to `incarnation.revision`.
    pub revision: Revision,
}

impl StreamMatch {
    /// The endpoint holding `role`.
    pub fn endpoint(&self, role: StreamRole) -> Address {
        match role {
            StreamRole::Source => self.source,
            StreamRole::Sink => self.sink,
        }
    }
}

/// A request to the directory (SPEC §4.2).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DirectoryRequest {
    /// Bind a blob source at a path (unconditional replace).
    Register {
        /// Where.
        path: DataPath,
        /// The source actor.
        source: Address,
        /// The source's node.
        source_node: NodeId,
        /// Payload length.
        length: u64,
        /// How to recreate the source after a restart.
        recovery: SourceRecovery,
        /// Idempotency key.
        operation: OperationId,
        /// The reservation this register consumes, if any.
        reservation: Option<OperationId>,
    },
    /// Return the blob binding at a path.
    Resolve {
        /// Where.
        path: DataPath,
    },
    /// Describe the entry at a path.
    Lookup {
        /// Where.
        path: DataPath,
    },
    /// Reserve an empty path for a later Register (durable, op-logged; DESIGN Q4).
    ReserveBlob {
        /// Where.
        path: DataPath,
        /// Idempotency key; also the reservation's name.
        operation: OperationId,
        /// The actor on whose behalf the reservation is held; if it is reported gone the
        /// reservation is released.
        owner: Address,
    },
    /// Release a reservation (tracked and tombstoned like a stream cancel; DESIGN Q4).
    ReleaseBlobReservation {
        /// Where.
        path: DataPath,
        /// The reservation's operation id.
        operation: OperationId,
    },
    /// Unlink a blob or a quiescent stream node; with `expected_revision`, only if the entry
    /// still has that revision (compare-and-delete, DESIGN Q19).
    Unregister {
        /// Where.
        path: DataPath,
        /// The revision the caller expects to delete (e.g. the one it published).
        expected_revision: Option<Revision>,
        /// Idempotency key.
        operation: OperationId,
    },
    /// Move an entry.
    Rename {
        /// From.
        source: DataPath,
        /// To.
        destination: DataPath,
        /// Whether an occupied destination may be replaced.
        replace: bool,
        /// Idempotency key.
        operation: OperationId,
    },
    /// Open one side of a stream rendezvous (SPEC §4.6).
    OpenStream {
        /// Where.
        path: DataPath,
        /// Writer or reader.
        role: StreamRole,
        /// Transport addressing for the peer.
        descriptor: Descriptor,
        /// The actor that will run this side.
        endpoint: Address,
        /// May displace a same-role pending, fence an active rendezvous, or rebind a blob.
        replace: bool,
        /// Create the node if absent and skip the expected-revision check.
        ensure: bool,
        /// For non-ensure opens: the node revision the caller observed.
        expected_revision: Option<Revision>,
        /// Idempotency key.
        operation: OperationId,
    },
    /// Retract a waiting open (tombstones an unknown operation).
    CancelStream {
        /// Where.
        path: DataPath,
        /// The open's operation id.
        operation: OperationId,
    },
    /// End a rendezvous (idempotent within one authority epoch).
    CloseStream {
        /// Where.
        path: DataPath,
        /// The rendezvous.
        incarnation: StreamIncarnation,
    },
    /// The issuer declares every one of its operations with a sequence number below `below`
    /// done: it has their answers and never sends them again. The directory prunes their
    /// records and refuses them `OperationExpired` from then on (ARCHITECTURE "Retention of
    /// operation records"). Only the issuer's own node incarnation may say so (`reply_to`
    /// must be on it). Answered with the horizon in effect, which may stay below `below`
    /// while one of those operations is a live rendezvous.
    OperationsDone {
        /// Whose operations.
        issuer: Issuer,
        /// Every sequence number below this is done.
        below: u64,
    },
}

/// The kind of a [`DirectoryRequest`], for reply shapes and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum RequestKind {
    Register,
    Resolve,
    Lookup,
    ReserveBlob,
    ReleaseBlobReservation,
    Unregister,
    Rename,
    OpenStream,
    CancelStream,
    CloseStream,
    OperationsDone,
}

impl RequestKind {
    /// Every kind, in declaration order.
    pub const ALL: [RequestKind; 11] = [
        RequestKind::Register,
        RequestKind::Resolve,
        RequestKind::Lookup,
        RequestKind::ReserveBlob,
        RequestKind::ReleaseBlobReservation,
        RequestKind::Unregister,
        RequestKind::Rename,
        RequestKind::OpenStream,
        RequestKind::CancelStream,
        RequestKind::CloseStream,
        RequestKind::OperationsDone,
    ];

    /// Whether requests of this kind are retractions (never expire at a proxy).
    pub fn is_retraction(self) -> bool {
        matches!(
            self,
            RequestKind::CancelStream
                | RequestKind::CloseStream
                | RequestKind::ReleaseBlobReservation
        )
    }
}

impl DirectoryRequest {
    /// The request's kind.
    pub fn kind(&self) -> RequestKind {
        match self {
            DirectoryRequest::Register { .. } => RequestKind::Register,
            DirectoryRequest::Resolve { .. } => RequestKind::Resolve,
            DirectoryRequest::Lookup { .. } => RequestKind::Lookup,
            DirectoryRequest::ReserveBlob { .. } => RequestKind::ReserveBlob,
            DirectoryRequest::ReleaseBlobReservation { .. } => RequestKind::ReleaseBlobReservation,
            DirectoryRequest::Unregister { .. } => RequestKind::Unregister,
            DirectoryRequest::Rename { .. } => RequestKind::Rename,
            DirectoryRequest::OpenStream { .. } => RequestKind::OpenStream,
            DirectoryRequest::CancelStream { .. } => RequestKind::CancelStream,
            DirectoryRequest::CloseStream { .. } => RequestKind::CloseStream,
            DirectoryRequest::OperationsDone { .. } => RequestKind::OperationsDone,
        }
    }

    /// The operation id the request carries, if any.
    pub fn operation(&self) -> Option<OperationId> {
        match self {
            DirectoryRequest::Register { operation, .. }
            | DirectoryRequest::ReserveBlob { operation, .. }
            | DirectoryRequest::ReleaseBlobReservation { operation, .. }
            | DirectoryRequest::Unregister { operation, .. }
            | DirectoryRequest::Rename { operation, .. }
            | DirectoryRequest::OpenStream { operation, .. }
            | DirectoryRequest::CancelStream { operation, .. } => Some(*operation),
            DirectoryRequest::Resolve { .. }
            | DirectoryRequest::Lookup { .. }
            | DirectoryRequest::CloseStream { .. }
            | DirectoryRequest::OperationsDone { .. } => None,
        }
    }
}

/// The result carried by a directory reply, one variant per request kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum ReplyBody {
    Registered(Result<MutationReceipt, NamespaceError>),
    Resolved(Result<BlobBinding, NamespaceError>),
    LookedUp(Result<NamespaceNode, NamespaceError>),
    BlobReserved(Result<(), NamespaceError>),
    BlobReservationReleased(Result<(), NamespaceError>),
    Unregistered(Result<MutationReceipt, NamespaceError>),
    Renamed(Result<MutationReceipt, NamespaceError>),
    StreamOpened(Result<StreamMatch, NamespaceError>),
    StreamCancelled(Result<(), NamespaceError>),
    StreamClosed(Result<(), NamespaceError>),
    /// The issuer's horizon now in effect.
    OperationsDone(Result<u64, NamespaceError>),
}

impl ReplyBody {
    /// The request kind this reply answers.
    pub fn kind(&self) -> RequestKind {
        match self {
            ReplyBody::Registered(_) => RequestKind::Register,
            ReplyBody::Resolved(_) => RequestKind::Resolve,
            ReplyBody::LookedUp(_) => RequestKind::Lookup,
            ReplyBody::BlobReserved(_) => RequestKind::ReserveBlob,
            ReplyBody::BlobReservationReleased(_) => RequestKind::ReleaseBlobReservation,
            ReplyBody::Unregistered(_) => RequestKind::Unregister,
            ReplyBody::Renamed(_) => RequestKind::Rename,
            ReplyBody::StreamOpened(_) => RequestKind::OpenStream,
            ReplyBody::StreamCancelled(_) => RequestKind::CancelStream,
            ReplyBody::StreamClosed(_) => RequestKind::CloseStream,
            ReplyBody::OperationsDone(_) => RequestKind::OperationsDone,
        }
    }

    /// A reply of `kind`'s variant that carries `error`.
    pub fn error(kind: RequestKind, error: NamespaceError) -> ReplyBody {
        match kind {
            RequestKind::Register => ReplyBody::Registered(Err(error)),
            RequestKind::Resolve => ReplyBody::Resolved(Err(error)),
            RequestKind::Lookup => ReplyBody::LookedUp(Err(error)),
            RequestKind::ReserveBlob => ReplyBody::BlobReserved(Err(error)),
            RequestKind::ReleaseBlobReservation => ReplyBody::BlobReservationReleased(Err(error)),
            RequestKind::Unregister => ReplyBody::Unregistered(Err(error)),
            RequestKind::Rename => ReplyBody::Renamed(Err(error)),
            RequestKind::OpenStream => ReplyBody::StreamOpened(Err(error)),
            RequestKind::CancelStream => ReplyBody::StreamCancelled(Err(error)),
            RequestKind::CloseStream => ReplyBody::StreamClosed(Err(error)),
            RequestKind::OperationsDone => ReplyBody::OperationsDone(Err(error)),
        }
    }

    /// The error this reply carries, if it is one.
    pub fn err(&self) -> Option<&NamespaceError> {
        match self {
            ReplyBody::Registered(r) | ReplyBody::Unregistered(r) | ReplyBody::Renamed(r) => {
                r.as_ref().err()
            }
            ReplyBody::Resolved(r) => r.as_ref().err(),
            ReplyBody::LookedUp(r) => r.as_ref().err(),
            ReplyBody::StreamOpened(r) => r.as_ref().err(),
            ReplyBody::BlobReserved(r)
            | ReplyBody::BlobReservationReleased(r)
            | ReplyBody::StreamCancelled(r)
            | ReplyBody::StreamClosed(r) => r.as_ref().err(),
            ReplyBody::OperationsDone(r) => r.as_ref().err(),
        }
    }
}

/// A request as it travels to the directory.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DirectoryCall {
    /// Echoed in the reply.
    pub request_id: RequestId,
    /// Where the reply goes.
    pub reply_to: Address,
    /// The request.
    pub request: DirectoryRequest,
}

/// A reply from the directory.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DirectoryReply {
    /// The request id of the call this answers.
    pub request_id: RequestId,
    /// The epoch of the authority that produced the reply (0 for synthetic replies).
    pub epoch: AuthorityEpoch,
    /// The result.
    pub body: ReplyBody,
}

/// Which addresses a host reports as gone for good (DESIGN.md §5, Q5/Q8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GoneScope {
    /// One actor that stopped.
    Address(Address),
    /// Every address of `node` created in an incarnation before `incarnation` (the node
    /// restarted).
    NodeBefore {
        /// The node.
        node: NodeId,
        /// Its current incarnation.
        incarnation: u64,
    },
}

impl GoneScope {
    /// Whether `address` is covered.
    pub fn covers(&self, address: &Address) -> bool {
        match *self {
            GoneScope::Address(a) => a == *address,
            GoneScope::NodeBefore { node, incarnation } => {
                address.node == node && address.incarnation < incarnation
            }
        }
    }
}

/// Every message that crosses a link.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Message {
    /// A caller or proxy → the directory.
    Call(DirectoryCall),
    /// The directory → a caller or proxy.
    Reply(DirectoryReply),
    /// The directory → a blob source: stop serving and acknowledge.
    Retire {
        /// Where the acknowledgement goes.
        reply_to: Address,
    },
    /// A blob source (or its host, for a source it no longer knows) → the directory.
    SourceRetired {
        /// The retired source.
        source: Address,
    },
    /// The directory → a stream endpoint: your incarnation was displaced.
    Displaced {
        /// The displaced rendezvous.
        incarnation: StreamIncarnation,
        /// Where the acknowledgement goes.
        reply_to: Address,
    },
    /// A stream endpoint (or its host, for an endpoint it no longer knows) → the directory.
    StreamDisplaced {
        /// The endpoint.
        endpoint: Address,
        /// The displaced rendezvous.
        incarnation: StreamIncarnation,
    },
    /// A host → the directory: these addresses are gone for good.
    AddressGone {
        /// Which addresses.
        scope: GoneScope,
        /// Where the acknowledgement goes.
        reply_to: Address,
    },
    /// The directory → a host: the gone report was applied.
    GoneAcknowledged {
        /// The scope reported.
        scope: GoneScope,
    },
    /// A local caller → its node's proxy: one request. `request_id` is the caller's own
    /// correlation id; the proxy's reply (a [`Message::Reply`]) echoes it.
    ProxyCall(DirectoryCall),
    /// A local caller → its node's proxy: the caller gives up on everything it has pending.
    /// Its retractions are kept (and re-owned by the proxy); its waiting opens and reserves are
    /// retracted.
    ProxyCancel {
        /// The caller.
        reply_to: Address,
    },
    /// A child process → its host session.
    FromChild(ChildRequest),
    /// A host session → its child process.
    ToChild(ChildEvent),
    /// A destination transfer → a blob source: send `len` payload bytes from `offset`.
    ChunkRequest {
        /// Payload offset.
        offset: u64,
        /// How many bytes (at most [`CHUNK_BYTES_MAX`]).
        len: u32,
        /// The transfer.
        reply_to: Address,
    },
    /// A blob source → a destination transfer: payload bytes.
    Chunk {
        /// Payload offset of `bytes`.
        offset: u64,
        /// The whole payload length.
        total: u64,
        /// The source's content digest, if it has one.
        digest: Option<[u8; 32]>,
        /// The bytes.
        bytes: ChunkBytes,
    },
    /// A blob source (or its host, for a source it does not know) → a destination transfer:
    /// the source cannot serve.
    ChunkRefused {
        /// Why: typed, so that a destination tells bytes that are gone for good from a source
        /// that cannot serve now.
        reason: ChunkRefusal,
    },
}

/// Why a blob source (or the host answering for it) refused a chunk request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChunkRefusal {
    /// The requested range is not inside the payload, or the source could not read it.
    OutOfRange,
    /// This incarnation of the node serves no such source: it was retired (its binding was
    /// replaced, renamed over or unlinked, so the path may hold something else by now), or it
    /// never served bytes.
    Retired,
    /// The source's header no longer validates: its writer changed the sealed blob.
    HeaderInvalid,
    /// The source belonged to an incarnation of this node that has ended: the node restarted,
    /// and the bytes lived in that incarnation's arena. They are gone for good.
    IncarnationEnded,
}

impl fmt::Display for ChunkRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChunkRefusal::OutOfRange => "chunk out of range",
            ChunkRefusal::Retired => "source retired",
            ChunkRefusal::HeaderInvalid => "source header invalid",
            ChunkRefusal::IncarnationEnded => "the source's node restarted",
        })
    }
}

/// Most payload bytes in one [`Message::Chunk`].
pub const CHUNK_BYTES_MAX: usize = 256 * 1024;

/// The bytes of one chunk (at most [`CHUNK_BYTES_MAX`]).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ChunkBytes(Vec<u8>);

impl Serialize for ChunkBytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for ChunkBytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_byte_buf(BoundedBytes(CHUNK_BYTES_MAX))
            .map(ChunkBytes)
    }
}

impl ChunkBytes {
    /// Wraps `bytes` if they fit the limit.
    pub fn new(bytes: Vec<u8>) -> Result<Self, TooLong> {
        if bytes.len() > CHUNK_BYTES_MAX {
            Err(TooLong)
        } else {
            Ok(ChunkBytes(bytes))
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ChunkBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkBytes({} bytes)", self.0.len())
    }
}

impl TryFrom<Vec<u8>> for ChunkBytes {
    type Error = TooLong;
    fn try_from(value: Vec<u8>) -> Result<Self, Self::Error> {
        ChunkBytes::new(value)
    }
}

impl From<ChunkBytes> for Vec<u8> {
    fn from(value: ChunkBytes) -> Self {
        value.0
    }
}

/// A child's name for one of its operations (unique within its session).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ChildOp(pub u64);

/// The capability a child presents at attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Capability(pub [u8; 32]);

impl Capability {
    /// Whether `self` is `expected`, compared in constant time (a capability is a secret: the
    /// time a comparison takes must not tell how many leading bytes were right).
    pub fn matches(&self, expected: &Capability) -> bool {
        blake3::Hash::from_bytes(self.0) == blake3::Hash::from_bytes(expected.0)
    }
}

/// Where a granted blob lies in the shared arena, as the child sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseView {
    /// Offset of the 128-byte header in the arena (the payload follows it).
    pub offset: u64,
    /// Payload length.
    pub length: u64,
    /// The lease's generation (in the header too).
    pub generation: u64,
    /// The digest the header carries (or must carry at seal).
    pub digest: DigestKind,
    /// The access the header says: `Writable` for a write grant, and for a read of a blob
    /// this host publishes itself (the reader views the writer's sealed lease); `ReadOnly`
    /// for a read the host filled.
    pub access: BlobAccess,
}

/// A child process → its host session (SPEC §7, with H4's reservations and expected revisions).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChildRequest {
    /// Attach to the session.
    Attach {
        /// The arena generation the child mapped.
        arena_generation: u64,
        /// The job capability.
        capability: Capability,
    },
    /// Read a blob: resolve, transfer into a fresh lease, grant it.
    OpenRead {
        /// The child's operation.
        op: ChildOp,
        /// The logical path (`/runs/self/...` allowed).
        path: String,
        /// Fail with `PathReplaced` unless the binding still has this revision.
        expected_revision: Option<Revision>,
    },
    /// Write a blob: grant a writable lease; publish it at `Seal`.
    OpenWrite {
        /// The child's operation.
        op: ChildOp,
        /// The logical path.
        path: String,
        /// Payload length.
        length: u64,
        /// The digest the child will store at seal.
        digest: DigestKind,
        /// Create only: reserve the path first (fails `PathExists` if it is taken).
        exclusive: bool,
    },
    /// The child sealed its write (header state Sealed): publish it.
    Seal {
        /// The write.
        op: ChildOp,
    },
    /// Abort a write (also after publication: the blob is unpublished).
    Abort {
        /// The write.
        op: ChildOp,
    },
    /// The child no longer maps the lease of `op`.
    Release {
        /// The read or write.
        op: ChildOp,
    },
    /// Give up on an open that has not been granted yet: it fails with `OperationCancelled`.
    /// A cancel that comes too late (the op was granted or already failed) is not answered.
    Cancel {
        /// The read or write.
        op: ChildOp,
    },
    /// What is at a path: a blob (with its length) or a stream node.
    Stat {
        /// The query.
        op: ChildOp,
        /// The logical path.
        path: String,
    },
    /// Move an entry (re-driven by the host until its outcome is known).
    Move {
        /// The mutation.
        op: ChildOp,
        /// From (logical).
        from: String,
        /// To (logical).
        to: String,
        /// Whether an occupied destination may be replaced.
        replace: bool,
    },
    /// Unlink an entry, if it still has `expected_revision` (when given).
    Remove {
        /// The mutation.
        op: ChildOp,
        /// The logical path.
        path: String,
        /// Compare-and-delete.
        expected_revision: Option<Revision>,
    },
    /// Close the session: every binding finishes; published blobs stay.
    Close,
}

/// A host session → its child process.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChildEvent {
    /// Attached.
    Attached {
        /// The session's generation.
        session_generation: u64,
    },
    /// Attach refused; nothing changed.
    AttachFailed {
        /// Why.
        error: DataPlaneError,
    },
    /// A sealed, read-only lease holding the blob.
    ReadGranted {
        /// The read.
        op: ChildOp,
        /// Where.
        lease: LeaseView,
        /// The binding's revision.
        revision: Revision,
    },
    /// A writable, zeroed lease.
    WriteGranted {
        /// The write.
        op: ChildOp,
        /// Where.
        lease: LeaseView,
    },
    /// The write is bound at the path.
    Published {
        /// The write.
        op: ChildOp,
        /// Its revision.
        revision: Revision,
    },
    /// The write is gone (never published, or unpublished).
    Aborted {
        /// The write.
        op: ChildOp,
    },
    /// The operation is over and its lease is free.
    Released {
        /// The read or write.
        op: ChildOp,
    },
    /// The operation failed.
    Failed {
        /// The read or write.
        op: ChildOp,
        /// Why.
        error: DataPlaneError,
    },
    /// The answer to `Stat`.
    Stat {
        /// The query.
        op: ChildOp,
        /// Blob or stream.
        kind: EntryKind,
        /// The entry's revision.
        revision: Revision,
        /// A blob's payload length (unknown for a lost blob).
        length: Option<u64>,
        /// The blob is lost: its bytes lived on a host that restarted (reads fail
        /// [`DataPlaneError::BlobLost`]).
        lost: bool,
    },
    /// A `Move` or `Remove` took effect.
    Done {
        /// The mutation.
        op: ChildOp,
        /// The revision of the change.
        revision: Revision,
    },
    /// The session closed.
    Closed,
    /// The host's supervisor revoked the session: every operation ends as if the child had
    /// died (its views are gone, its waiting opens fail, its unsealed writes abort), published
    /// blobs stay, and `Closed` follows once everything finished. Requests after this one are
    /// refused `SessionNotRunning`.
    Revoked,
}

/// A message with its addresses: the unit of transport.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Envelope {
    /// The sender.
    pub from: Address,
    /// The recipient.
    pub to: Address,
    /// The message.
    pub message: Message,
}

/// Why a frame could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The encoded value is larger than the limit.
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The serializer failed (a value that cannot be represented).
    Serialize(String),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge { len, max } => {
                write!(f, "encoded frame is {len} bytes, the limit is {max}")
            }
            EncodeError::Serialize(e) => write!(f, "cannot encode: {e}"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Why a frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame is larger than the limit.
    TooLarge {
        /// Frame size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The frame ended before the value did.
    Truncated,
    /// The frame continues after the value.
    TrailingBytes {
        /// How many bytes are left over.
        extra: usize,
    },
    /// The bytes do not form a valid value (bad tag, invalid path, over-long field, ...).
    Malformed(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooLarge { len, max } => {
                write!(f, "frame is {len} bytes, the limit is {max}")
            }
            DecodeError::Truncated => f.write_str("frame is truncated"),
            DecodeError::TrailingBytes { extra } => {
                write!(f, "frame has {extra} bytes after its value")
            }
            DecodeError::Malformed(e) => write!(f, "malformed frame: {e}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Encodes any wire value with postcard, enforcing `max` bytes.
pub fn encode_value<T: Serialize>(value: &T, max: usize) -> Result<Vec<u8>, EncodeError> {
    let bytes = postcard::to_allocvec(value).map_err(|e| EncodeError::Serialize(e.to_string()))?;
    if bytes.len() > max {
        return Err(EncodeError::TooLarge {
            len: bytes.len(),
            max,
        });
    }
    Ok(bytes)
}

/// Decodes a whole frame with postcard, enforcing `max` bytes and rejecting trailing bytes.
pub fn decode_value<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    max: usize,
) -> Result<T, DecodeError> {
    if bytes.len() > max {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max,
        });
    }
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(DecodeError::TrailingBytes { extra: rest.len() }),
        Err(postcard::Error::DeserializeUnexpectedEnd) => Err(DecodeError::Truncated),
        Err(e) => Err(DecodeError::Malformed(e.to_string())),
    }
}

/// Encodes a network frame (without the transport's length prefix).
pub fn encode(envelope: &Envelope) -> Result<Vec<u8>, EncodeError> {
    encode_value(envelope, FRAME_BYTES_MAX)
}

/// Decodes a network frame (without the transport's length prefix).
pub fn decode(bytes: &[u8]) -> Result<Envelope, DecodeError> {
    decode_value(bytes, FRAME_BYTES_MAX)
}

/// A short reason for synthetic errors.
pub fn reason(text: &str) -> Reason {
    Reason::new(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(n: u64) -> Address {
        Address::new(NodeId(n), 1, n)
    }

    fn sample() -> Envelope {
        Envelope {
            from: addr(1),
            to: addr(2),
            message: Message::Call(DirectoryCall {
                request_id: RequestId(7),
                reply_to: addr(1),
                request: DirectoryRequest::OpenStream {
                    path: DataPath::new("/runs/1/s").unwrap(),
                    role: StreamRole::Sink,
                    descriptor: Descriptor::new(vec![1, 2, 3]).unwrap(),
                    endpoint: addr(3),
                    replace: true,
                    ensure: false,
                    expected_revision: Some(Revision(4)),
                    operation: OperationId(u128::MAX),
                },
            }),
        }
    }

    #[test]
    fn frames_round_trip() {
        let envelope = sample();
        let bytes = encode(&envelope).unwrap();
        assert_eq!(decode(&bytes).unwrap(), envelope);
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let bytes = encode(&sample()).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                decode(&bytes[..cut]).is_err(),
                "prefix of {cut} bytes decoded"
            );
        }
    }

    #[test]
    fn trailing_and_oversized_frames_are_rejected() {
        let mut bytes = encode(&sample()).unwrap();
        bytes.push(0);
        assert_eq!(decode(&bytes), Err(DecodeError::TrailingBytes { extra: 1 }));
        let huge = vec![0u8; FRAME_BYTES_MAX + 1];
        assert_eq!(
            decode(&huge),
            Err(DecodeError::TooLarge {
                len: FRAME_BYTES_MAX + 1,
                max: FRAME_BYTES_MAX
            })
        );
    }

    #[test]
    fn over_long_descriptors_do_not_decode() {
        let mut envelope = sample();
        if let Message::Call(call) = &mut envelope.message
            && let DirectoryRequest::OpenStream { descriptor, .. } = &mut call.request
        {
            // Bypass the constructor to forge an over-long descriptor on the wire.
            *descriptor = Descriptor(vec![0; DESCRIPTOR_BYTES_MAX + 1]);
        }
        let bytes = encode(&envelope).unwrap();
        assert!(matches!(decode(&bytes), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn chunks_round_trip_and_over_long_ones_do_not_decode() {
        let bytes = ChunkBytes::new((0..=255u8).cycle().take(CHUNK_BYTES_MAX).collect()).unwrap();
        let chunk = Envelope {
            from: Address::new(NodeId(1), 1, 2),
            to: Address::new(NodeId(2), 1, 3),
            message: Message::Chunk {
                offset: 7,
                total: 1 << 30,
                digest: Some([9; 32]),
                bytes,
            },
        };
        let encoded = encode(&chunk).unwrap();
        assert_eq!(decode(&encoded), Ok(chunk.clone()));
        // The byte string is laid out as a `Vec<u8>` would be (length, then the bytes).
        let Message::Chunk { bytes, .. } = &chunk.message else {
            unreachable!()
        };
        let as_vec = postcard::to_allocvec(&bytes.as_slice().to_vec()).unwrap();
        assert!(encoded.ends_with(&as_vec));
        // One byte over the limit is refused.
        let mut forged = chunk;
        if let Message::Chunk { bytes, .. } = &mut forged.message {
            *bytes = ChunkBytes(vec![1; CHUNK_BYTES_MAX + 1]);
        }
        let encoded = encode(&forged).unwrap();
        assert!(matches!(decode(&encoded), Err(DecodeError::Malformed(_))));
        assert!(ChunkBytes::new(vec![0; CHUNK_BYTES_MAX + 1]).is_err());
    }

    #[test]
    fn huge_length_prefixes_fail_without_allocating() {
        // A Vec length of 2^60 inside a tiny frame must be rejected, not allocated.
        let mut bytes = encode(&sample()).unwrap();
        let tail = bytes.len() - 20;
        bytes.truncate(tail);
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(decode(&bytes).is_err());
    }

    #[test]
    fn error_replies_use_the_variant_of_their_request() {
        for kind in RequestKind::ALL {
            assert_eq!(ReplyBody::error(kind, NamespaceError::Timeout).kind(), kind);
        }
    }
}

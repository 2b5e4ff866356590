//! Directory calls and replies (SPEC §4.2): the requests a caller or a proxy sends the
//! directory, the results the directory answers, and the values both carry (bindings, stream
//! matches and their descriptors, source recovery, gone reports).

use core::fmt;
use serde::{Deserialize, Serialize};

use super::codec::{BoundedBytes, TooLong};
use crate::error::NamespaceError;
use crate::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use crate::kinds::{EntryKind, StreamRole};
use crate::limits::{DESCRIPTOR_BYTES_MAX, FILE_REF_BYTES_MAX};
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

impl TryFrom<Vec<u8>> for Descriptor {
    type Error = TooLong;
    fn try_from(value: Vec<u8>) -> Result<Self, Self::Error> {
        Descriptor::new(value)
    }
}

/// A reference to a file on a host's disk, as that host names it (at most
/// [`FILE_REF_BYTES_MAX`] bytes, no NUL).
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
    /// A file on a host's disk (a file blob, issue 17; DESIGN overrides SPEC's "on the
    /// directory's node"): the host serves it from `source`, an actor of
    /// [`PERSISTENT_INCARNATION`](crate::ids::PERSISTENT_INCARNATION) that outlives the
    /// restarts of its node, so recovery yields that same source (SPEC S8a asks only for the
    /// same length and revision).
    File {
        /// Where the file lies, as its host names it (relative to the host's file root).
        path: FileRef,
        /// The host's actor that serves the file.
        source: Address,
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

    /// Whether requests of this kind only read (`Resolve`, `Lookup`): they change nothing at
    /// the directory, so a proxy may fail them early when no directory is there.
    pub fn is_read(self) -> bool {
        matches!(self, RequestKind::Resolve | RequestKind::Lookup)
    }

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
    /// What the directory is asked to do.
    pub request: DirectoryRequest,
}

/// A reply from the directory.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DirectoryReply {
    /// The request id of the call this answers.
    pub request_id: RequestId,
    /// The epoch of the authority that produced the reply (0 for synthetic replies).
    pub epoch: AuthorityEpoch,
    /// The outcome, in the variant of the request's kind, an error included (see
    /// [`ReplyBody::error`]).
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
        /// The node that restarted.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::DESCRIPTOR_BYTES_MAX;
    use crate::wire::samples::sample;
    use crate::wire::{DecodeError, Message, decode, encode};

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
    fn error_replies_use_the_variant_of_their_request() {
        for kind in RequestKind::ALL {
            assert_eq!(ReplyBody::error(kind, NamespaceError::Timeout).kind(), kind);
        }
    }
}

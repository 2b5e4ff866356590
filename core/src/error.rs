//! Operating errors (SPEC §2.4, plus `Timeout` from DESIGN.md §5 Q10 and `LimitReached` for the
//! named limits). Every variant is a value a caller can match on; none of them is a panic.

use core::fmt;
use serde::{Deserialize, Serialize};

use crate::effect::Timer;
use crate::ids::{OperationId, StreamIncarnation};
use crate::limits::REASON_BYTES_MAX;
use crate::path::{DataPath, PathError};
use crate::wire::{EntryKind, StreamRole};

/// A short human-readable explanation, truncated to [`REASON_BYTES_MAX`] bytes.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Reason(String);

impl Reason {
    /// Builds a reason, cutting it at a character boundary if it is too long.
    pub fn new(text: impl Into<String>) -> Self {
        let mut text = text.into();
        if text.len() > REASON_BYTES_MAX {
            let mut cut = REASON_BYTES_MAX;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        Reason(text)
    }

    /// The reason as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A reason decoded from a frame that is longer than the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasonTooLong;

impl fmt::Display for ReasonTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reason longer than {REASON_BYTES_MAX} bytes")
    }
}

impl TryFrom<String> for Reason {
    type Error = ReasonTooLong;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        if value.len() > REASON_BYTES_MAX {
            Err(ReasonTooLong)
        } else {
            Ok(Reason(value))
        }
    }
}

impl From<Reason> for String {
    fn from(value: Reason) -> Self {
        value.0
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A named limit that was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Limit {
    /// [`crate::limits::FENCE_HELD_OPENS_MAX`].
    FenceHeldOpens,
    /// [`crate::limits::RESERVATIONS_MAX`].
    Reservations,
    /// The proxy's pending-request bound.
    PendingRequests,
    /// Request ids of a proxy ran out.
    RequestIds,
    /// A host's bound on operations in progress over all its sessions
    /// ([`crate::limits::HOST_OPERATIONS_MAX`] by default).
    HostOperations,
    /// A host's bound on operations in progress in one session
    /// ([`crate::limits::HOST_SESSION_OPERATIONS_MAX`] by default).
    SessionOperations,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::FenceHeldOpens => "too many opens held by a replacement fence",
            Limit::Reservations => "too many blob reservations",
            Limit::PendingRequests => "too many pending requests",
            Limit::RequestIds => "request ids exhausted",
            Limit::HostOperations => "too many operations in progress on this host",
            Limit::SessionOperations => "too many operations in progress in this session",
        })
    }
}

/// Errors of the namespace directory and its proxy.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NamespaceError {
    /// Nothing is bound at the path.
    PathNotFound(DataPath),
    /// The path is occupied, or reserved by another operation.
    PathExists(DataPath),
    /// The path holds the other kind of entry.
    WrongEntryType {
        /// The path asked about.
        path: DataPath,
        /// The kind the request needs.
        expected: EntryKind,
        /// The kind that is there.
        found: EntryKind,
    },
    /// A pending open was displaced, an expected revision is outdated, a reservation vanished,
    /// or the operation was cancelled (tombstone).
    PathReplaced(DataPath),
    /// A pending or active rendezvous already holds that role.
    DuplicateStreamRole {
        /// The stream path.
        path: DataPath,
        /// The role already held.
        role: StreamRole,
    },
    /// The incarnation or the operation's rendezvous is no longer current.
    StaleIncarnation {
        /// The stream path.
        path: DataPath,
        /// The incarnation that is stale.
        incarnation: StreamIncarnation,
    },
    /// The operation id was already used for a different request, role or endpoint.
    OperationConflict(OperationId),
    /// A rename touches a path with a pending or active rendezvous.
    StreamActive(DataPath),
    /// The directory cannot allocate (revision or epoch space exhausted).
    Storage(Reason),
    /// The binding exists but its source is not available.
    SourceRecovery(Reason),
    /// No directory answered: none was discoverable until the deadline.
    DirectoryUnavailable(Reason),
    /// A directory was discoverable but did not answer before the deadline (DESIGN Q10).
    Timeout,
    /// A reply of the wrong kind, or another breach of the protocol.
    Protocol(Reason),
    /// A named limit was reached.
    LimitReached(Limit),
}

impl fmt::Display for NamespaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NamespaceError::PathNotFound(p) => write!(f, "{p}: not found"),
            NamespaceError::PathExists(p) => write!(f, "{p}: already exists"),
            NamespaceError::WrongEntryType {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: is a {found:?}, expected a {expected:?}")
            }
            NamespaceError::PathReplaced(p) => write!(f, "{p}: replaced"),
            NamespaceError::DuplicateStreamRole { path, role } => {
                write!(f, "{path}: the {role:?} role is already held")
            }
            NamespaceError::StaleIncarnation { path, incarnation } => {
                write!(f, "{path}: stream incarnation {incarnation} is stale")
            }
            NamespaceError::OperationConflict(op) => {
                write!(f, "operation {op} was used for a different request")
            }
            NamespaceError::StreamActive(p) => write!(f, "{p}: a stream is active"),
            NamespaceError::Storage(r) => write!(f, "storage: {r}"),
            NamespaceError::SourceRecovery(r) => write!(f, "source unavailable: {r}"),
            NamespaceError::DirectoryUnavailable(r) => write!(f, "directory unavailable: {r}"),
            NamespaceError::Timeout => f.write_str("the directory did not answer in time"),
            NamespaceError::Protocol(r) => write!(f, "protocol: {r}"),
            NamespaceError::LimitReached(l) => write!(f, "limit reached: {l}"),
        }
    }
}

impl std::error::Error for NamespaceError {}

/// Why an attach was refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttachmentFailure {
    /// The job capability does not match.
    CapabilityRejected,
    /// The arena generation does not match.
    ArenaGenerationMismatch {
        /// The session's generation.
        expected: u64,
        /// The generation the child named.
        found: u64,
    },
    /// A child is already attached.
    DuplicateAttachment,
    /// The session is closing or closed.
    SessionClosed,
    /// The route registrar refused the child.
    RouteRejected(Reason),
}

/// Blob-layer failures (header and lease checks, SPEC §8.2).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlobFailure {
    /// A range is out of bounds or a header is unaligned.
    Bounds,
    /// The header's generation is not the lease's.
    StaleGeneration {
        /// The lease's generation.
        expected: u64,
        /// The header's generation.
        found: u64,
    },
    /// A length disagrees with the lease.
    Length {
        /// The lease's length.
        expected: u64,
        /// The length found.
        found: u64,
    },
    /// Digest metadata or content mismatch.
    Digest,
    /// Access denied or an invalid access byte.
    Access,
    /// The header is in an unexpected state.
    State {
        /// The state word found.
        found: u8,
    },
    /// Bad magic, version, reserved bytes, or an invalid host lease.
    InvalidLease,
    /// A writable view is still active.
    ActiveWritableView,
    /// The blob operation already finished.
    AlreadyFinished,
}

/// Errors a child session sees (SPEC §2.4, host level).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataPlaneError {
    /// The logical path is invalid.
    InvalidPath(PathError),
    /// The capability was rejected.
    InvalidCapability,
    /// Attaching failed.
    Attachment(AttachmentFailure),
    /// The session is not running (not attached, or another child).
    SessionNotRunning,
    /// The session or a namespace service failed.
    SessionFailed(Reason),
    /// The job context does not allow this access.
    Unauthorized {
        /// The resolved path.
        path: DataPath,
        /// The access asked for.
        operation: crate::path::Access,
    },
    /// Nothing is bound at the path.
    PathNotFound(DataPath),
    /// The bound source could not serve the blob.
    SourceFailure(Reason),
    /// The arena has no room.
    ArenaExhausted,
    /// A blob-layer check failed.
    Blob(BlobFailure),
    /// The operation was cancelled.
    OperationCancelled,
    /// The path holds the other kind of entry.
    WrongEntryType(DataPath),
    /// The path was replaced.
    PathReplaced(DataPath),
    /// The stream peer went away.
    PeerLost,
    /// The stream failed.
    StreamFault(Reason),
    /// The stream was closed.
    StreamClosed,
    /// The path already exists.
    PathExists(DataPath),
    /// The path is busy (a stream is active).
    Busy(DataPath),
    /// An argument is invalid.
    InvalidArgument(Reason),
    /// The operation is not supported.
    Unsupported,
    /// A named limit was reached.
    LimitReached(Limit),
}

impl From<NamespaceError> for DataPlaneError {
    /// The H4 mapping of SPEC §2.4.
    fn from(error: NamespaceError) -> Self {
        match error {
            NamespaceError::PathNotFound(p) => DataPlaneError::PathNotFound(p),
            NamespaceError::SourceRecovery(r) => DataPlaneError::SourceFailure(r),
            NamespaceError::PathExists(p) => DataPlaneError::PathExists(p),
            NamespaceError::WrongEntryType { path, .. } => DataPlaneError::WrongEntryType(path),
            NamespaceError::PathReplaced(p) => DataPlaneError::PathReplaced(p),
            NamespaceError::StreamActive(p) => DataPlaneError::Busy(p),
            NamespaceError::LimitReached(l) => DataPlaneError::LimitReached(l),
            other @ (NamespaceError::DirectoryUnavailable(_)
            | NamespaceError::Timeout
            | NamespaceError::Storage(_)
            | NamespaceError::Protocol(_)
            | NamespaceError::OperationConflict(_)
            | NamespaceError::DuplicateStreamRole { .. }
            | NamespaceError::StaleIncarnation { .. }) => {
                DataPlaneError::SessionFailed(Reason::new(other.to_string()))
            }
        }
    }
}

/// An input a machine does not accept. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputError {
    /// The message is not one a directory handles (e.g. a reply).
    UnexpectedMessage(&'static str),
    /// The timer is not the directory's.
    UnexpectedTimer(Timer),
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::UnexpectedMessage(kind) => write!(f, "this machine does not accept {kind}"),
            InputError::UnexpectedTimer(t) => write!(f, "this machine has no timer {t:?}"),
        }
    }
}

impl std::error::Error for InputError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_truncated_at_a_char_boundary() {
        let long = "é".repeat(REASON_BYTES_MAX);
        let reason = Reason::new(long);
        assert!(reason.as_str().len() <= REASON_BYTES_MAX);
        assert!(reason.as_str().chars().all(|c| c == 'é'));
    }

    #[test]
    fn oversized_reasons_do_not_decode() {
        let bytes = postcard::to_allocvec(&"x".repeat(REASON_BYTES_MAX + 1)).unwrap();
        assert!(postcard::from_bytes::<Reason>(&bytes).is_err());
    }

    #[test]
    fn namespace_errors_map_to_the_h4_host_errors() {
        let p = DataPath::new("/a").unwrap();
        assert_eq!(
            DataPlaneError::from(NamespaceError::StreamActive(p.clone())),
            DataPlaneError::Busy(p)
        );
        assert!(matches!(
            DataPlaneError::from(NamespaceError::Timeout),
            DataPlaneError::SessionFailed(_)
        ));
    }
}

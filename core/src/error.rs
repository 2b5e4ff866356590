//! Operating errors (SPEC §2.4, plus `Timeout` from DESIGN.md §5 Q10 and `LimitReached` for the
//! named limits). Every variant is a value a caller can match on; none of them is a panic.

use core::fmt;
use serde::{Deserialize, Serialize};

pub use crate::kinds::{Limit, Reason, ReasonTooLong};

use crate::ids::{OperationId, StreamIncarnation};
use crate::kinds::{EntryKind, StreamRole, Timer};
use crate::path::{DataPath, PathError};

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
    /// The path binds a blob whose source belonged to an incarnation of its node that has
    /// ended (the node restarted: ARCHITECTURE "Node incarnation floors"). The bytes lived in
    /// that incarnation's arena and are gone for good; only a new write can bind the path
    /// again. `Resolve` answers this; `Lookup` marks such a blob `lost`.
    BlobLost(DataPath),
    /// The operation's record was pruned: its issuer declared every operation below it done,
    /// or its node incarnation ended (ARCHITECTURE "Retention of operation records"). Its
    /// outcome is no longer known, and it never takes effect now.
    OperationExpired(OperationId),
    /// The directory's disk has no room for the record a new operation would need: the
    /// operation was neither applied nor remembered (a copy sent later may still take
    /// effect). Reads, replays of recorded operations and retractions are still served; new
    /// mutations are refused until an operator frees space, after which the directory takes
    /// them again by itself (ARCHITECTURE "A full disk stops writes, not the directory"). The
    /// reason names the directory's data directory.
    NoSpace(Reason),
}

impl NamespaceError {
    /// Whether the directory neither applied nor remembered the request (see
    /// [`Limit::left_no_trace`], and a full disk): the same request may be sent again.
    pub fn left_no_trace(&self) -> bool {
        matches!(self, NamespaceError::LimitReached(l) if l.left_no_trace())
            || matches!(self, NamespaceError::NoSpace(_))
    }
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
                write!(f, "{path}: is a {found}, not a {expected}")
            }
            NamespaceError::PathReplaced(p) => write!(f, "{p}: replaced"),
            NamespaceError::DuplicateStreamRole { path, role } => {
                write!(f, "{path}: the {role} role is already held")
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
            NamespaceError::BlobLost(p) => write!(f, "{p}: {LOST}"),
            NamespaceError::OperationExpired(op) => write!(
                f,
                "operation {op} is older than what its issuer declared done; its outcome is forgotten"
            ),
            NamespaceError::NoSpace(r) => write!(
                f,
                "the directory's disk is full: {r}; nothing was changed, and it takes \
                 mutations again once space is freed"
            ),
        }
    }
}

impl std::error::Error for NamespaceError {}

/// What a lost blob's message says after its path.
const LOST: &str = "lost: its bytes lived on a host that restarted";

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

impl fmt::Display for AttachmentFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachmentFailure::CapabilityRejected => f.write_str("the capability was rejected"),
            AttachmentFailure::ArenaGenerationMismatch { expected, found } => write!(
                f,
                "the child named arena generation {found}, the session's is {expected}"
            ),
            AttachmentFailure::DuplicateAttachment => {
                f.write_str("a child is already attached to this session")
            }
            AttachmentFailure::SessionClosed => f.write_str("the session is closed"),
            AttachmentFailure::RouteRejected(r) => write!(f, "the host refused the route: {r}"),
        }
    }
}

impl std::error::Error for AttachmentFailure {}

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
    /// A sealed write's bytes could not be made final (the arena's memory failed): nothing
    /// was published.
    NotFinal(Reason),
}

impl fmt::Display for BlobFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobFailure::Bounds => f.write_str("a range is out of bounds or a header is unaligned"),
            BlobFailure::StaleGeneration { expected, found } => write!(
                f,
                "the header has generation {found}, the lease has {expected}"
            ),
            BlobFailure::Length { expected, found } => {
                write!(f, "the length is {found} bytes, {expected} were expected")
            }
            BlobFailure::Digest => f.write_str("the content does not match its digest"),
            BlobFailure::Access => f.write_str("access denied by the header"),
            BlobFailure::State { found } => write!(f, "the header is in unexpected state {found}"),
            BlobFailure::InvalidLease => {
                f.write_str("not a valid lease (magic, version or reserved bytes)")
            }
            BlobFailure::ActiveWritableView => f.write_str("a writable view is still active"),
            BlobFailure::AlreadyFinished => f.write_str("the blob operation already finished"),
            BlobFailure::NotFinal(reason) => {
                write!(f, "the sealed write could not be made final: {reason}")
            }
        }
    }
}

impl std::error::Error for BlobFailure {}

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
    /// The session failed (an answer it could not use, a binding it could not start).
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
    WrongEntryType {
        /// The path asked about.
        path: DataPath,
        /// The kind the operation needs.
        expected: EntryKind,
        /// The kind that is there.
        found: EntryKind,
    },
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
    /// The blob's bytes are gone for good: its source belonged to an incarnation of its node
    /// that has ended (the node restarted, and the bytes lived in its arena). Unlike
    /// [`SourceFailure`](Self::SourceFailure), retrying cannot help; writing the blob again
    /// does. Told by the directory's Resolve, or by the restarted host refusing a chunk
    /// request for its dead source.
    BlobLost(DataPath),
    /// The blob (or the write) is larger than this host's whole arena: it can never be granted
    /// here, however long one waits. Unlike [`ArenaExhausted`](Self::ArenaExhausted), retrying
    /// cannot help; a host with a larger arena can.
    BlobTooLarge {
        /// The payload's length.
        length: u64,
        /// The arena's size.
        arena: u64,
    },
    /// The blob is served from a file on its host's disk (a file blob, issue 17), and the
    /// file is no longer what was published: it changed, was replaced or was removed. No byte
    /// of the changed file is handed out; retrying cannot help, publishing the file again does.
    SourceChanged(DataPath),
    /// The namespace failed the operation in a way with no host error of its own, typed so
    /// that a caller can tell what a retry can mend: no directory answered
    /// ([`NamespaceError::DirectoryUnavailable`]) or none answered in time
    /// ([`NamespaceError::Timeout`]) pass with time, and so does a full disk at the directory
    /// ([`NamespaceError::NoSpace`]) once space is freed; an operation id used for another
    /// request ([`NamespaceError::OperationConflict`]) or forgotten
    /// ([`NamespaceError::OperationExpired`]), a stream role already held or a stale
    /// incarnation, the directory's revision space ([`NamespaceError::Storage`]) and a
    /// breach of the protocol do not. Only those nine kinds are carried here (the others
    /// have host errors: `From<NamespaceError>`). SPEC §2.4's H4 mapping folded them all
    /// into `SessionFailed(text)`; ARCHITECTURE ("Errors are messages") says why they are typed.
    Namespace(NamespaceError),
    /// The write was granted and not sealed within the host's write deadline (a child that
    /// stopped, or one far too slow): the host aborted it, and took its arena space back when
    /// the child's bytes live in a buffer of the child's own. Nothing was published; writing
    /// again can help.
    WriteExpired {
        /// The deadline, in seconds.
        after_secs: u64,
    },
}

impl fmt::Display for DataPlaneError {
    /// One line, path first where there is one; never Rust debug syntax.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataPlaneError::InvalidPath(e) => write!(f, "invalid path: {e}"),
            DataPlaneError::InvalidCapability => f.write_str("the capability was rejected"),
            DataPlaneError::Attachment(e) => write!(f, "attach refused: {e}"),
            DataPlaneError::SessionNotRunning => f.write_str("the session is not running"),
            DataPlaneError::SessionFailed(r) => write!(f, "namespace unavailable: {r}"),
            DataPlaneError::Unauthorized { path, operation } => {
                write!(f, "{path}: not allowed to {operation} there")
            }
            DataPlaneError::PathNotFound(p) => write!(f, "{p}: not found"),
            DataPlaneError::SourceFailure(r) => write!(f, "the blob's source failed: {r}"),
            DataPlaneError::ArenaExhausted => f.write_str("the host's arena is full"),
            DataPlaneError::Blob(e) => write!(f, "blob check failed: {e}"),
            DataPlaneError::OperationCancelled => f.write_str("the operation was cancelled"),
            DataPlaneError::WrongEntryType {
                path,
                expected,
                found,
            } => write!(f, "{path}: is a {found}, not a {expected}"),
            DataPlaneError::PathReplaced(p) => write!(f, "{p}: was replaced"),
            DataPlaneError::PeerLost => f.write_str("the stream's peer went away"),
            DataPlaneError::StreamFault(r) => write!(f, "the stream failed: {r}"),
            DataPlaneError::StreamClosed => f.write_str("the stream was closed"),
            DataPlaneError::PathExists(p) => write!(f, "{p}: already exists"),
            DataPlaneError::Busy(p) => write!(f, "{p}: busy (a stream is active)"),
            DataPlaneError::InvalidArgument(r) => write!(f, "invalid argument: {r}"),
            DataPlaneError::Unsupported => f.write_str("not supported"),
            DataPlaneError::LimitReached(l) => write!(f, "busy, try later: {l}"),
            DataPlaneError::BlobLost(p) => write!(f, "{p}: {LOST}"),
            DataPlaneError::BlobTooLarge { length, arena } => write!(
                f,
                "a blob of {length} bytes can never fit this host's arena of {arena} bytes"
            ),
            DataPlaneError::SourceChanged(p) => write!(
                f,
                "{p}: the file it was published from changed since (publish it again)"
            ),
            DataPlaneError::Namespace(
                e @ (NamespaceError::DirectoryUnavailable(_) | NamespaceError::Timeout),
            ) => write!(f, "namespace unavailable: {e}"),
            DataPlaneError::Namespace(e) => write!(f, "namespace refused: {e}"),
            DataPlaneError::WriteExpired { after_secs } => write!(
                f,
                "the write was not sealed within {after_secs} s of its grant (the host's write \
                 deadline): aborted, nothing published; write again"
            ),
        }
    }
}

impl std::error::Error for DataPlaneError {}

impl From<NamespaceError> for DataPlaneError {
    /// The H4 mapping of SPEC §2.4, except that the namespace's own failures are typed
    /// ([`DataPlaneError::Namespace`]) instead of folded into `SessionFailed`.
    fn from(error: NamespaceError) -> Self {
        match error {
            NamespaceError::PathNotFound(p) => DataPlaneError::PathNotFound(p),
            NamespaceError::SourceRecovery(r) => DataPlaneError::SourceFailure(r),
            NamespaceError::PathExists(p) => DataPlaneError::PathExists(p),
            NamespaceError::WrongEntryType {
                path,
                expected,
                found,
            } => DataPlaneError::WrongEntryType {
                path,
                expected,
                found,
            },
            NamespaceError::BlobLost(p) => DataPlaneError::BlobLost(p),
            NamespaceError::PathReplaced(p) => DataPlaneError::PathReplaced(p),
            NamespaceError::StreamActive(p) => DataPlaneError::Busy(p),
            NamespaceError::LimitReached(l) => DataPlaneError::LimitReached(l),
            other @ (NamespaceError::DirectoryUnavailable(_)
            | NamespaceError::Timeout
            | NamespaceError::Storage(_)
            | NamespaceError::Protocol(_)
            | NamespaceError::OperationConflict(_)
            | NamespaceError::OperationExpired(_)
            | NamespaceError::DuplicateStreamRole { .. }
            | NamespaceError::StaleIncarnation { .. }
            | NamespaceError::NoSpace(_)) => DataPlaneError::Namespace(other),
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

    /// Whether `text` looks like Rust debug output: a capitalised identifier followed by `(`
    /// or ` {` (`Blob(Digest)`, `LimitReached(PendingRequests)`, `Length { expected: 1 }`),
    /// or `Some(`/`None`.
    pub(crate) fn looks_like_debug(text: &str) -> bool {
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let starts_word = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
            if starts_word && bytes[i].is_ascii_uppercase() {
                let mut j = i + 1;
                while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_') {
                    j += 1;
                }
                let rest = &text[j..];
                if rest.starts_with('(') || rest.starts_with(" {") || &text[i..j] == "None" {
                    return true;
                }
                i = j;
            } else {
                i += 1;
            }
        }
        false
    }

    fn assert_plain(text: &str) {
        assert!(!text.is_empty());
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(!looks_like_debug(text), "debug syntax in {text:?}");
    }

    #[test]
    fn the_debug_detector_detects_debug() {
        for debug in [
            "Blob(Digest)",
            "LimitReached(PendingRequests)",
            "invalid path: NotAbsolute(",
            "Length { expected: 1, found: 2 }",
            "x: None",
            "Some(3)",
        ] {
            assert!(looks_like_debug(debug), "{debug}");
        }
        for plain in [
            "/data/x: not found",
            "busy, try later: too many pending requests",
            "the capability was rejected",
            "path contains the control character U+000A",
            "BLAKE3 (the digest)",
        ] {
            assert!(!looks_like_debug(plain), "{plain}");
        }
    }

    /// One value of every `DataPlaneError` variant; `variant` has no wildcard arm, so a new
    /// variant does not compile until it is listed here and has a message.
    fn every_data_plane_error() -> Vec<DataPlaneError> {
        let p = DataPath::new("/data/x").unwrap();
        let r = Reason::new("because");
        vec![
            DataPlaneError::InvalidPath(PathError::ControlCharacter { code: 0x1b }),
            DataPlaneError::InvalidCapability,
            DataPlaneError::Attachment(AttachmentFailure::ArenaGenerationMismatch {
                expected: 2,
                found: 3,
            }),
            DataPlaneError::SessionNotRunning,
            DataPlaneError::SessionFailed(r.clone()),
            DataPlaneError::Unauthorized {
                path: p.clone(),
                operation: crate::path::Access::Write,
            },
            DataPlaneError::PathNotFound(p.clone()),
            DataPlaneError::SourceFailure(r.clone()),
            DataPlaneError::ArenaExhausted,
            DataPlaneError::Blob(BlobFailure::Length {
                expected: 4,
                found: 5,
            }),
            DataPlaneError::OperationCancelled,
            DataPlaneError::WrongEntryType {
                path: p.clone(),
                expected: EntryKind::Stream,
                found: EntryKind::Blob,
            },
            DataPlaneError::PathReplaced(p.clone()),
            DataPlaneError::PeerLost,
            DataPlaneError::StreamFault(r.clone()),
            DataPlaneError::StreamClosed,
            DataPlaneError::PathExists(p.clone()),
            DataPlaneError::Busy(p.clone()),
            DataPlaneError::InvalidArgument(r),
            DataPlaneError::Unsupported,
            DataPlaneError::LimitReached(Limit::PendingRequests),
            DataPlaneError::BlobLost(p.clone()),
            DataPlaneError::BlobTooLarge {
                length: 9,
                arena: 8,
            },
            DataPlaneError::SourceChanged(p),
            DataPlaneError::Namespace(NamespaceError::Timeout),
            DataPlaneError::WriteExpired { after_secs: 600 },
        ]
    }

    fn variant(e: &DataPlaneError) -> usize {
        match e {
            DataPlaneError::InvalidPath(_) => 0,
            DataPlaneError::InvalidCapability => 1,
            DataPlaneError::Attachment(_) => 2,
            DataPlaneError::SessionNotRunning => 3,
            DataPlaneError::SessionFailed(_) => 4,
            DataPlaneError::Unauthorized { .. } => 5,
            DataPlaneError::PathNotFound(_) => 6,
            DataPlaneError::SourceFailure(_) => 7,
            DataPlaneError::ArenaExhausted => 8,
            DataPlaneError::Blob(_) => 9,
            DataPlaneError::OperationCancelled => 10,
            DataPlaneError::WrongEntryType { .. } => 11,
            DataPlaneError::PathReplaced(_) => 12,
            DataPlaneError::PeerLost => 13,
            DataPlaneError::StreamFault(_) => 14,
            DataPlaneError::StreamClosed => 15,
            DataPlaneError::PathExists(_) => 16,
            DataPlaneError::Busy(_) => 17,
            DataPlaneError::InvalidArgument(_) => 18,
            DataPlaneError::Unsupported => 19,
            DataPlaneError::LimitReached(_) => 20,
            DataPlaneError::BlobLost(_) => 21,
            DataPlaneError::BlobTooLarge { .. } => 22,
            DataPlaneError::SourceChanged(_) => 23,
            DataPlaneError::Namespace(_) => 24,
            DataPlaneError::WriteExpired { .. } => 25,
        }
    }

    #[test]
    fn every_data_plane_error_reads_as_one_plain_line() {
        let all = every_data_plane_error();
        let seen: std::collections::BTreeSet<usize> = all.iter().map(variant).collect();
        assert_eq!(seen.len(), 26, "every variant is listed once");
        for error in &all {
            assert_plain(&error.to_string());
        }
    }

    #[test]
    fn every_namespace_error_reads_as_one_plain_line() {
        let p = DataPath::new("/data/x").unwrap();
        let r = Reason::new("because");
        let all = [
            NamespaceError::PathNotFound(p.clone()),
            NamespaceError::PathExists(p.clone()),
            NamespaceError::WrongEntryType {
                path: p.clone(),
                expected: EntryKind::Blob,
                found: EntryKind::Stream,
            },
            NamespaceError::PathReplaced(p.clone()),
            NamespaceError::DuplicateStreamRole {
                path: p.clone(),
                role: StreamRole::Sink,
            },
            NamespaceError::StaleIncarnation {
                path: p.clone(),
                incarnation: StreamIncarnation {
                    epoch: crate::ids::AuthorityEpoch(2),
                    revision: crate::ids::Revision(7),
                },
            },
            NamespaceError::OperationConflict(OperationId(9)),
            NamespaceError::StreamActive(p.clone()),
            NamespaceError::Storage(r.clone()),
            NamespaceError::SourceRecovery(r.clone()),
            NamespaceError::DirectoryUnavailable(r.clone()),
            NamespaceError::Timeout,
            NamespaceError::Protocol(r),
            NamespaceError::LimitReached(Limit::Reservations),
            NamespaceError::LimitReached(Limit::Operations),
            NamespaceError::LimitReached(Limit::IssuerOperations),
            NamespaceError::LimitReached(Limit::Issuers),
            NamespaceError::LimitReached(Limit::Entries),
            NamespaceError::LimitReached(Limit::Obligations),
            NamespaceError::LimitReached(Limit::Rendezvous),
            NamespaceError::LimitReached(Limit::Fences),
            NamespaceError::BlobLost(p),
            NamespaceError::OperationExpired(OperationId(9)),
        ];
        for error in &all {
            assert_plain(&error.to_string());
            // The host's error for it reads plainly too.
            assert_plain(&DataPlaneError::from(error.clone()).to_string());
        }
    }

    #[test]
    fn every_blob_and_attachment_failure_reads_as_one_plain_line() {
        let blobs = [
            BlobFailure::Bounds,
            BlobFailure::StaleGeneration {
                expected: 1,
                found: 2,
            },
            BlobFailure::Length {
                expected: 1,
                found: 2,
            },
            BlobFailure::Digest,
            BlobFailure::Access,
            BlobFailure::State { found: 3 },
            BlobFailure::InvalidLease,
            BlobFailure::ActiveWritableView,
            BlobFailure::AlreadyFinished,
        ];
        for failure in blobs {
            assert_plain(&failure.to_string());
        }
        let attachments = [
            AttachmentFailure::CapabilityRejected,
            AttachmentFailure::ArenaGenerationMismatch {
                expected: 1,
                found: 2,
            },
            AttachmentFailure::DuplicateAttachment,
            AttachmentFailure::SessionClosed,
            AttachmentFailure::RouteRejected(Reason::new("no")),
        ];
        for failure in attachments {
            assert_plain(&failure.to_string());
        }
    }

    #[test]
    fn messages_say_what_happened() {
        let p = DataPath::new("/data/s").unwrap();
        let cases = [
            (
                DataPlaneError::WrongEntryType {
                    path: p.clone(),
                    expected: EntryKind::Blob,
                    found: EntryKind::Stream,
                },
                "/data/s: is a stream, not a blob",
            ),
            (
                DataPlaneError::WrongEntryType {
                    path: p.clone(),
                    expected: EntryKind::Stream,
                    found: EntryKind::Blob,
                },
                "/data/s: is a blob, not a stream",
            ),
            (
                DataPlaneError::BlobLost(p.clone()),
                "/data/s: lost: its bytes lived on a host that restarted",
            ),
            (
                DataPlaneError::LimitReached(Limit::SessionOperations),
                "busy, try later: too many operations in progress in this session",
            ),
            (
                DataPlaneError::Blob(BlobFailure::Digest),
                "blob check failed: the content does not match its digest",
            ),
            (
                DataPlaneError::InvalidPath(PathError::NotAbsolute),
                "invalid path: path must start with '/'",
            ),
            (
                DataPlaneError::Unauthorized {
                    path: p,
                    operation: crate::path::Access::Read,
                },
                "/data/s: not allowed to read there",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
        }
    }

    #[test]
    fn lost_blobs_keep_their_own_host_error() {
        let p = DataPath::new("/a").unwrap();
        assert_eq!(
            DataPlaneError::from(NamespaceError::BlobLost(p.clone())),
            DataPlaneError::BlobLost(p)
        );
    }

    #[test]
    fn namespace_errors_map_to_the_h4_host_errors() {
        let p = DataPath::new("/a").unwrap();
        assert_eq!(
            DataPlaneError::from(NamespaceError::StreamActive(p.clone())),
            DataPlaneError::Busy(p)
        );
        assert_eq!(
            DataPlaneError::from(NamespaceError::Timeout),
            DataPlaneError::Namespace(NamespaceError::Timeout)
        );
    }

    /// The namespace's own failures keep their kind on the way to the child: a caller can
    /// tell "no directory answered" (wait and retry) from "this operation id was used for
    /// another request" (a retry gets the same answer), which `SessionFailed(text)` hid.
    #[test]
    fn namespace_failures_without_a_host_error_stay_typed() {
        let p = DataPath::new("/a").unwrap();
        let op = OperationId(7);
        let r = Reason::new("r");
        let failures = [
            NamespaceError::DirectoryUnavailable(r.clone()),
            NamespaceError::Timeout,
            NamespaceError::Storage(r.clone()),
            NamespaceError::Protocol(r),
            NamespaceError::OperationConflict(op),
            NamespaceError::OperationExpired(op),
            NamespaceError::DuplicateStreamRole {
                path: p.clone(),
                role: StreamRole::Source,
            },
            NamespaceError::StaleIncarnation {
                path: p,
                incarnation: StreamIncarnation {
                    epoch: crate::ids::AuthorityEpoch(1),
                    revision: crate::ids::Revision(2),
                },
            },
        ];
        for failure in failures {
            let host = DataPlaneError::from(failure.clone());
            assert_eq!(host, DataPlaneError::Namespace(failure.clone()));
            // "unavailable" is said only of what passes with time.
            let unavailable = matches!(
                failure,
                NamespaceError::DirectoryUnavailable(_) | NamespaceError::Timeout
            );
            let text = host.to_string();
            assert_eq!(
                text.starts_with("namespace unavailable: "),
                unavailable,
                "{text}"
            );
            assert!(text.ends_with(&failure.to_string()), "{text}");
        }
    }
}

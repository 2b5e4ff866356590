//! The child protocol (SPEC §7): what a child process and its host session say to each other,
//! and where a granted blob lies in the arena the child maps.

use serde::{Deserialize, Serialize};

use crate::error::DataPlaneError;
use crate::ids::Revision;
use crate::kinds::{BlobAccess, DigestKind, EntryKind, StreamRole};
use crate::wire::{Descriptor, StreamMatch};

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
    /// Publish a file on the host's disk as a blob at `path` (issue 17): the host serves its
    /// bytes from the file, not from the arena, for as long as the binding lasts (also across
    /// restarts of the host and the directory), and refuses to serve them once the file
    /// changed. Answered `Published` or `Failed`; re-driven by the host until the outcome is
    /// known, like a sealed write.
    PublishFile {
        /// The publication.
        op: ChildOp,
        /// The logical path (write access needed).
        path: String,
        /// The file, as the host names it (relative to its file root).
        file: String,
    },
    /// Open one side of a stream at `path` (issue 17): the host runs the endpoint, and the
    /// child hears `StreamMatched` with both sides' descriptors once a peer opened the other
    /// side, or `Failed`. `Cancel` gives up while it waits (the open is retracted on the
    /// child's behalf, also if the child dies).
    OpenStream {
        /// The stream's operation.
        op: ChildOp,
        /// The logical path (a source needs write access, a sink read access).
        path: String,
        /// Writer (source) or reader (sink).
        role: StreamRole,
        /// This side's transport addressing, opaque to the data plane.
        descriptor: Descriptor,
        /// May displace a waiting open of the same role, fence an active rendezvous, or
        /// replace a blob.
        replace: bool,
        /// Create the stream node if absent (and skip the revision check).
        ensure: bool,
        /// Without `ensure`: the node revision the child observed.
        expected_revision: Option<Revision>,
    },
    /// End a matched stream: the child hears `StreamClosed`. A child that dies has its streams
    /// closed (or its waiting opens retracted) on its behalf.
    CloseStream {
        /// The stream.
        op: ChildOp,
    },
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
    /// A stream open met its peer: both endpoints and descriptors, and the rendezvous.
    StreamMatched {
        /// The stream.
        op: ChildOp,
        /// What both sides receive.
        matched: StreamMatch,
    },
    /// The stream was displaced by a replacing open: it is over (no close is needed).
    StreamDisplaced {
        /// The stream.
        op: ChildOp,
    },
    /// The stream the child closed is closed.
    StreamClosed {
        /// The stream.
        op: ChildOp,
    },
}

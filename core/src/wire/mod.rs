//! The wire vocabulary: every message that crosses a network link, as serde types, and the one
//! `encode`/`decode` pair (postcard) with a frame-size limit.
//!
//! Decoding validates as it goes (paths, descriptor and reason lengths), rejects trailing bytes
//! and oversized frames, and never panics: any byte string either decodes to a well-formed
//! [`Envelope`] or yields a [`DecodeError`].
//!
//! This module holds the [`Message`] enum and its [`Envelope`]; the types the messages carry
//! live in one submodule per protocol and are re-exported here, so every type is named
//! `wire::X`:
//!
//! * `directory`: directory calls and replies ([`DirectoryCall`], [`DirectoryReply`] and what
//!   they carry), and gone reports ([`GoneScope`]).
//! * `child`: the child protocol between a child process and its host session
//!   ([`ChildRequest`], [`ChildEvent`], [`LeaseView`]).
//! * `transfer`: payload transfers between hosts ([`ChunkBytes`], [`ChunkRefusal`],
//!   [`CHUNK_BYTES_MAX`]).
//! * `codec`: [`encode`]/[`decode`] and their errors, and the bounded byte strings.

use serde::{Deserialize, Serialize};

use crate::error::Reason;
use crate::ids::{Address, StreamIncarnation};

mod child;
mod codec;
mod directory;
mod transfer;

pub use self::child::{Capability, ChildEvent, ChildOp, ChildRequest, LeaseView};
pub use self::codec::{
    DecodeError, EncodeError, TooLong, decode, decode_value, encode, encode_value,
};
pub use self::directory::{
    BlobBinding, Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, FileRef, GoneScope,
    MutationReceipt, NamespaceNode, ReplyBody, RequestKind, SourceRecovery, StreamMatch,
};
pub use self::transfer::{CHUNK_BYTES_MAX, ChunkBytes, ChunkRefusal};
pub use crate::kinds::{EntryKind, StreamRole};

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
        /// The endpoint whose displacement is acknowledged (not the sender when a host
        /// answers for an endpoint it no longer knows).
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
        /// The caller giving up: the `reply_to` its calls named.
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
        /// The destination transfer, which the chunk or the refusal goes to.
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
        /// The payload from `offset` on (at most [`CHUNK_BYTES_MAX`] bytes).
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

/// A short reason for synthetic errors.
pub fn reason(text: &str) -> Reason {
    Reason::new(text)
}

/// Values the tests of several submodules share.
#[cfg(test)]
mod samples {
    use super::*;
    use crate::ids::{NodeId, OperationId, RequestId, Revision};
    use crate::path::DataPath;

    pub(super) fn addr(n: u64) -> Address {
        Address::new(NodeId(n), 1, n)
    }

    pub(super) fn sample() -> Envelope {
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
}

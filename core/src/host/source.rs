//! Blob sources (SPEC §6): a published write as other hosts reach it.
//!
//! A source serves chunk requests from its lease's payload and answers the directory's
//! `Retire` with `SourceRetired` — idempotently, also after it is gone (DESIGN Q8): the host
//! answers for every actor it no longer knows, and for every actor of an earlier incarnation of
//! its node (Q5). A retired source frees nothing by itself: the binding's namespace hold goes,
//! and the lease is freed once the child released its view too (S34).
//!
//! Chunk refusals are typed ([`ChunkRefusal`]): a request for a source of an *earlier*
//! incarnation of this node is refused `IncarnationEnded` — the node restarted, the arena that
//! held the bytes is gone, and the reader fails `BlobLost` instead of a transient
//! `SourceFailure`. Only this host can know it before the directory has the node's gone report.

use super::Host;
use crate::arena::ArenaMemory;
use crate::blob::{self, BlobState};
use crate::effect::Outbox;
use crate::ids::Address;
use crate::wire::{CHUNK_BYTES_MAX, ChunkBytes, ChunkRefusal, Message};

/// Whether a chunk request for `len` bytes at `offset` fits a chunk and a payload of
/// `length` bytes.
pub(super) fn chunk_in_range(offset: u64, len: u32, length: u64) -> bool {
    (len as usize) <= CHUNK_BYTES_MAX
        && offset
            .checked_add(u64::from(len))
            .is_some_and(|end| end <= length)
}

impl Host {
    /// A frame for `to`, which is not a session or a binding of this incarnation: a source, or
    /// an actor that no longer exists.
    pub(super) fn source_message(
        &mut self,
        to: Address,
        message: Message,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(source) = self.sources.get(&to.actor).copied() else {
            self.answer_for_the_dead(to, &message, out);
            return;
        };
        match message {
            Message::ChunkRequest {
                offset,
                len,
                reply_to,
            } => {
                let refuse = |reason: ChunkRefusal, out: &mut Outbox| {
                    out.send(reply_to, Message::ChunkRefused { reason });
                };
                if !chunk_in_range(offset, len, source.length) {
                    return refuse(ChunkRefusal::OutOfRange, out);
                }
                let Some(slot) = self.bindings.get(&source.binding).and_then(|b| b.lease) else {
                    return refuse(ChunkRefusal::Retired, out);
                };
                // The child still maps its sealed lease: a header it scribbled on is refused
                // rather than served (the reader's digest check guards the payload).
                if blob::validate(mem.bytes(), &slot.expected, BlobState::Sealed, false).is_err() {
                    return refuse(ChunkRefusal::HeaderInvalid, out);
                }
                let start = source.payload_offset + offset;
                let Some(bytes) = usize::try_from(start)
                    .ok()
                    .and_then(|start| mem.bytes().get(start..start + len as usize))
                    .and_then(|bytes| ChunkBytes::new(bytes.to_vec()).ok())
                else {
                    return refuse(ChunkRefusal::OutOfRange, out);
                };
                let chunk = Message::Chunk {
                    offset,
                    total: source.length,
                    digest: source.digest,
                    bytes,
                };
                out.send(reply_to, chunk);
            }
            Message::Retire { reply_to } => {
                out.send(reply_to, Message::SourceRetired { source: to });
                self.sources.remove(&to.actor);
                self.source_retired(source.binding, mem, out);
            }
            other => self.answer_for_the_dead(to, &other, out),
        }
    }

    /// Answers a frame for an actor that no longer exists: acknowledgements the directory
    /// re-sends until it sees them, refusals to transfers (`IncarnationEnded` for an actor of an
    /// earlier incarnation of this node, whose bytes died with it; `Retired` for one of this
    /// incarnation). Everything else is dropped.
    pub(super) fn answer_for_the_dead(&self, to: Address, message: &Message, out: &mut Outbox) {
        if let Some((reply_to, reply)) =
            crate::agent::acknowledgement(self.config.incarnation, to, message)
        {
            out.send(reply_to, reply);
        }
    }
}

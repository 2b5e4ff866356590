//! Transfers between hosts: a destination transfer pulls a blob's payload from its source in
//! chunks ([`Message::ChunkRequest`], answered by [`Message::Chunk`] or
//! [`Message::ChunkRefused`] with a [`ChunkRefusal`]), each at most [`CHUNK_BYTES_MAX`] bytes.
//!
//! [`Message::ChunkRequest`]: super::Message::ChunkRequest
//! [`Message::Chunk`]: super::Message::Chunk
//! [`Message::ChunkRefused`]: super::Message::ChunkRefused

use core::fmt;
use serde::{Deserialize, Serialize};

use super::codec::{BoundedBytes, TooLong};

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
    /// The source is a file on its host's disk, and the file is no longer the one published
    /// (its length, identity or modification time differ, or it is gone): nothing is served.
    SourceChanged,
}

impl fmt::Display for ChunkRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChunkRefusal::OutOfRange => "chunk out of range",
            ChunkRefusal::Retired => "source retired",
            ChunkRefusal::HeaderInvalid => "source header invalid",
            ChunkRefusal::IncarnationEnded => "the source's node restarted",
            ChunkRefusal::SourceChanged => "the source's file changed since it was published",
        })
    }
}

/// Most payload bytes in one [`Message::Chunk`](super::Message::Chunk).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Address, NodeId};
    use crate::wire::{DecodeError, Envelope, Message, decode, encode};

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
}

//! The codec: the one `encode`/`decode` pair (postcard) for network frames, bounded by
//! [`FRAME_BYTES_MAX`], the generic [`encode_value`]/[`decode_value`] under any limit, their
//! errors, and the bounded byte-string decoder that the length-limited wire types use.

use core::fmt;
use serde::Serialize;

use super::Envelope;
use crate::limits::FRAME_BYTES_MAX;

/// Decodes a byte string of at most `.0` bytes, refusing a longer one before copying it.
/// Byte strings are written as a length and the raw bytes (`serialize_bytes`), which postcard
/// lays out exactly like a `Vec<u8>`, but copies in one go instead of byte by byte.
pub(super) struct BoundedBytes(pub(super) usize);

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

/// A bounded value decoded from a frame exceeded its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLong;

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("value longer than its limit")
    }
}

/// Why a frame could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The encoded value is larger than the limit.
    TooLarge {
        /// Encoded size.
        len: usize,
        /// The limit it exceeds, in bytes.
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
        /// The limit it exceeds, in bytes.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::samples::sample;

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
    fn huge_length_prefixes_fail_without_allocating() {
        // A Vec length of 2^60 inside a tiny frame must be rejected, not allocated.
        let mut bytes = encode(&sample()).unwrap();
        let tail = bytes.len() - 20;
        bytes.truncate(tail);
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(decode(&bytes).is_err());
    }
}

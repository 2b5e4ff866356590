//! Length-prefixed postcard frames for byte streams.
//!
//! A frame is a [`LENGTH_PREFIX_BYTES`]-byte little-endian `u32` payload length followed by the
//! postcard encoding of one value. Nodes exchange [`Envelope`]s over TCP; a host and its child
//! processes exchange bare [`Message`]s (`FromChild` / `ToChild`) over a Unix socket, because
//! the host knows which connection is which child.
//!
//! The payload limit is the core's [`FRAME_BYTES_MAX`] (the prefix is not counted). Reading is
//! defensive: a length over the limit is refused before anything is allocated or read for it
//! ([`FrameError::TooLarge`]); an end of stream inside a frame is [`FrameError::Truncated`]; a
//! payload that does not decode, or decodes with bytes left over, is
//! [`FrameError::Malformed`]. Nothing panics on any input.
//!
//! **After any error the caller must close the connection.** The stream is no longer at a
//! known frame boundary (or the peer is broken or hostile), so a [`FrameReader`] that returned
//! an error refuses every further read. The one exception is an I/O error of kind
//! [`io::ErrorKind::WouldBlock`] (a non-blocking socket with nothing to read, or a read
//! timeout): no bytes were lost, and the next `read_frame` carries on where this one stopped.
//! [`io::ErrorKind::Interrupted`] is retried internally.
//!
//! [`Envelope`]: dataplane_core::wire::Envelope
//! [`Message`]: dataplane_core::wire::Message

use std::fmt;
use std::io::{self, Read, Write};

use dataplane_core::limits::FRAME_BYTES_MAX;
use dataplane_core::wire::{DecodeError, EncodeError, decode_value};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Size of the length prefix: a `u32`, little endian, counting the payload bytes only.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// The buffer a fresh [`FrameReader`] starts with; it grows (up to one maximal frame) when a
/// frame needs more and keeps its size afterwards.
const INITIAL_BUFFER_BYTES: usize = 8 * 1024;

/// Why a frame could not be written or read. After any of these (except an I/O error of kind
/// `WouldBlock`), close the connection.
#[derive(Debug)]
pub enum FrameError {
    /// The underlying stream failed.
    Io(io::Error),
    /// A received length prefix announces a payload over the limit (nothing was read for it).
    TooLarge {
        /// The announced payload length.
        len: usize,
        /// The limit ([`FRAME_BYTES_MAX`]).
        max: usize,
    },
    /// A complete payload did not decode (bad value, or trailing bytes after the value).
    Malformed(DecodeError),
    /// The value could not be encoded (too large, or not representable).
    Encode(EncodeError),
    /// The stream ended inside a frame.
    Truncated {
        /// Bytes of the frame needed, prefix included: [`LENGTH_PREFIX_BYTES`] while the prefix
        /// was incomplete, prefix plus payload afterwards.
        wanted: usize,
        /// Bytes of the frame that arrived.
        got: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "frame i/o failed: {e}"),
            FrameError::TooLarge { len, max } => {
                write!(
                    f,
                    "frame payload of {len} bytes announced, the limit is {max}"
                )
            }
            FrameError::Malformed(e) => write!(f, "undecodable frame: {e}"),
            FrameError::Encode(e) => write!(f, "cannot encode frame: {e}"),
            FrameError::Truncated { wanted, got } => {
                write!(
                    f,
                    "stream ended inside a frame: {got} of {wanted} bytes arrived"
                )
            }
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FrameError::Io(e) => Some(e),
            FrameError::Malformed(e) => Some(e),
            FrameError::Encode(e) => Some(e),
            FrameError::TooLarge { .. } | FrameError::Truncated { .. } => None,
        }
    }
}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// Appends one frame (prefix and payload) holding `value` to `out`.
///
/// On error `out` is left as it was. A value whose encoding exceeds [`FRAME_BYTES_MAX`] is
/// [`FrameError::Encode`]`(`[`EncodeError::TooLarge`]`)`.
pub fn encode_frame<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX_BYTES]);
    // Serialize straight after the placeholder prefix: no intermediate allocation.
    if let Err(e) = postcard::to_extend(value, Appender(out)) {
        out.truncate(start);
        return Err(FrameError::Encode(EncodeError::Serialize(e.to_string())));
    }
    let len = out.len() - start - LENGTH_PREFIX_BYTES;
    if len > FRAME_BYTES_MAX {
        out.truncate(start);
        return Err(FrameError::Encode(EncodeError::TooLarge {
            len,
            max: FRAME_BYTES_MAX,
        }));
    }
    // Lossless: `len <= FRAME_BYTES_MAX`, which fits in a u32 (checked at compile time).
    let prefix = (len as u32).to_le_bytes();
    out[start..start + LENGTH_PREFIX_BYTES].copy_from_slice(&prefix);
    Ok(())
}

const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);

/// Lets postcard's `to_extend` (which takes its writer by value) append to a borrowed vector.
struct Appender<'a>(&'a mut Vec<u8>);

impl Extend<u8> for Appender<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

/// Writes one frame holding `value` to `w` with a single `write_all`. Does not flush.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, value: &T) -> Result<(), FrameError> {
    let mut buf = Vec::new();
    encode_frame(value, &mut buf)?;
    w.write_all(&buf)?;
    Ok(())
}

/// Reads frames from a byte stream through a buffer it reuses.
///
/// Bytes are read greedily (as many as the stream offers and the buffer holds), so many small
/// frames cost few reads. The buffer starts small and grows to at most one maximal frame
/// (prefix plus [`FRAME_BYTES_MAX`]).
///
/// After an error (other than `WouldBlock`) every further [`read_frame`](Self::read_frame)
/// fails: close the connection.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    /// The buffer; bytes `start..end` are received and not yet consumed.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Set by the first error; the reader refuses further reads.
    failed: bool,
}

impl<R: Read> FrameReader<R> {
    /// A reader over `inner` (a socket, a pipe, a byte slice...).
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            buf: Vec::new(),
            start: 0,
            end: 0,
            failed: false,
        }
    }

    /// Reads the next frame.
    ///
    /// `Ok(None)` is a clean end of stream exactly at a frame boundary. Blocks until a whole
    /// frame, the end of the stream or an error arrives (on a blocking stream).
    pub fn read_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        if self.failed {
            return Err(FrameError::Io(io::Error::other(
                "the frame reader failed earlier; close the connection",
            )));
        }
        let result = self.read_frame_inner();
        match &result {
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.failed = true,
            Ok(_) => {}
        }
        result
    }

    /// A reader over `inner` that first returns the frames in `buffered` (bytes already
    /// received from `inner` by someone else).
    pub fn with_buffered(inner: R, buffered: Vec<u8>) -> Self {
        let end = buffered.len();
        FrameReader {
            inner,
            buf: buffered,
            start: 0,
            end,
            failed: false,
        }
    }

    /// The stream and the received bytes not yet returned as frames (to hand the stream to
    /// another reader without losing them).
    pub fn into_parts(self) -> (R, Vec<u8>) {
        let rest = self.buf[self.start..self.end].to_vec();
        (self.inner, rest)
    }

    /// The underlying stream (for socket options, peer addresses...). Reading from it
    /// directly would skip buffered bytes.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// How many received bytes wait in the buffer (not yet returned as frames).
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    fn read_frame_inner<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        if !self.fill(LENGTH_PREFIX_BYTES)? {
            let got = self.buffered();
            if got == 0 {
                return Ok(None);
            }
            return Err(FrameError::Truncated {
                wanted: LENGTH_PREFIX_BYTES,
                got,
            });
        }
        let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
        prefix.copy_from_slice(&self.buf[self.start..self.start + LENGTH_PREFIX_BYTES]);
        // A u32 always fits in usize on the 32- and 64-bit targets we build for; saturate
        // otherwise so the limit check below refuses it.
        let len = usize::try_from(u32::from_le_bytes(prefix)).unwrap_or(usize::MAX);
        if len > FRAME_BYTES_MAX {
            return Err(FrameError::TooLarge {
                len,
                max: FRAME_BYTES_MAX,
            });
        }
        let total = LENGTH_PREFIX_BYTES + len;
        if !self.fill(total)? {
            return Err(FrameError::Truncated {
                wanted: total,
                got: self.buffered(),
            });
        }
        let payload = &self.buf[self.start + LENGTH_PREFIX_BYTES..self.start + total];
        let value = decode_value::<T>(payload, FRAME_BYTES_MAX).map_err(FrameError::Malformed)?;
        self.start += total;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(Some(value))
    }

    /// Reads until at least `want` bytes are buffered (`Ok(true)`) or the stream ends
    /// (`Ok(false)`). `want` is at most one maximal frame.
    fn fill(&mut self, want: usize) -> Result<bool, FrameError> {
        debug_assert!(want <= LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX);
        if self.buffered() >= want {
            return Ok(true);
        }
        // Make room for `want` bytes from `start`: move the unconsumed bytes to the front,
        // then grow (never beyond one maximal frame, since `want` is bounded by the caller).
        if self.buf.len() - self.start < want {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() < want {
                let grown = want
                    .max(INITIAL_BUFFER_BYTES)
                    .max(self.buf.len().saturating_mul(2))
                    .min(LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX);
                self.buf.resize(grown, 0);
            }
        }
        while self.buffered() < want {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    // A misbehaving `Read` may claim more than it was given; never trust it
                    // past the buffer.
                    self.end = self.end.saturating_add(n).min(self.buf.len());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FrameError::Io(e)),
            }
        }
        Ok(true)
    }
}

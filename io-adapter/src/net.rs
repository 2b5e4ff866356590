//! Connections: one reader thread and one writer thread per socket, feeding and fed by the
//! node's single driver thread through `crossbeam-channel`.
//!
//! * A reader decodes frames ([`crate::frame`]) and hands each to the driver as
//!   [`Event::Received`]; on the first error (a malformed or oversized frame, a truncated stream,
//!   an IO error) it reports [`Event::Closed`] with the reason and shuts the socket down: a
//!   peer that sends garbage is disconnected, everyone else is unaffected.
//! * A writer encodes and sends the values the driver queued, in order (encoding on the writer
//!   thread keeps the driver free; frames queued together go out in one write). Its queue is
//!   bounded ([`WRITE_QUEUE_FRAMES`]): when a peer does not keep up, frames are dropped, which
//!   every protocol here tolerates (requests are re-sent, transfers re-ask chunks).
//!
//! Between nodes the frames are [`Link`]s: a short handshake, then core envelopes. When the
//! nodes are given a [`ClusterKey`], every hello must carry it: a connection whose hello does
//! not is answered [`Link::Refused`] and closed, and nothing from it reaches a machine.

use std::fmt;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use dataplane_core::ids::{Address, AuthorityEpoch, NodeId};
use dataplane_core::wire::Envelope;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::frame::{FrameReader, encode_frame};

/// Frames a writer queues before it drops new ones.
pub const WRITE_QUEUE_FRAMES: usize = 4096;

/// A connection's number (unique within a process).
pub type ConnId = u64;

/// A peer host as the directory node announces it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// Its node id.
    pub node: NodeId,
    /// Its current incarnation.
    pub incarnation: u64,
    /// Where it accepts connections from other hosts.
    pub listen: String,
}

/// The shared secret of a cluster, as its nodes present it in their hellos: a BLAKE3 hash of
/// the secret (so the secret file may hold any bytes), compared in constant time.
///
/// It keeps out programs that do not know the secret: a stray or hostile client cannot
/// register, remove or read anything, or pose as a host. It is **not** encryption: the hellos
/// and everything after them travel in the clear, so anyone who can watch the network learns
/// the key. Use it on a network you trust to keep traffic private.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterKey([u8; 32]);

impl ClusterKey {
    /// The shortest secret accepted.
    pub const SECRET_BYTES_MIN: usize = 16;

    /// The key for `secret` (trailing ASCII whitespace, such as the newline an editor adds, is
    /// not part of it).
    pub fn from_secret(secret: &[u8]) -> Result<ClusterKey, KeyError> {
        let secret = secret.trim_ascii_end();
        if secret.len() < Self::SECRET_BYTES_MIN {
            return Err(KeyError::TooShort { len: secret.len() });
        }
        let mut bytes = b"dataplane cluster key v1\n".to_vec();
        bytes.extend_from_slice(secret);
        Ok(ClusterKey(dataplane_core::blob::digest(&bytes)))
    }

    /// The key for the secret in the file at `path`.
    pub fn read(path: &Path) -> Result<ClusterKey, KeyError> {
        let secret = std::fs::read(path).map_err(|error| KeyError::Io {
            path: path.to_owned(),
            error,
        })?;
        ClusterKey::from_secret(&secret).map_err(|e| match e {
            KeyError::TooShort { len } => KeyError::FileTooShort {
                path: path.to_owned(),
                len,
            },
            other => other,
        })
    }

    /// Whether a hello presenting `presented` may join a node that expects `expected`: both
    /// absent, or both present and equal.
    pub fn admits(expected: Option<&ClusterKey>, presented: Option<&ClusterKey>) -> bool {
        match (expected, presented) {
            (None, None) => true,
            (Some(a), Some(b)) => a.0.iter().zip(&b.0).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0,
            _ => false,
        }
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// Why a cluster key could not be made.
#[derive(Debug)]
pub enum KeyError {
    /// The secret is shorter than [`ClusterKey::SECRET_BYTES_MIN`].
    TooShort {
        /// Its length (without trailing whitespace).
        len: usize,
    },
    /// The secret in a file is too short.
    FileTooShort {
        /// The file.
        path: PathBuf,
        /// The secret's length (without trailing whitespace).
        len: usize,
    },
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let min = ClusterKey::SECRET_BYTES_MIN;
        match self {
            KeyError::TooShort { len } => {
                write!(
                    f,
                    "the cluster secret has {len} bytes; at least {min} are needed"
                )
            }
            KeyError::FileTooShort { path, len } => write!(
                f,
                "{}: the cluster secret has {len} bytes; at least {min} are needed",
                path.display()
            ),
            KeyError::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for KeyError {}

/// What nodes say to each other over TCP. (Mostly `Frame`s: boxing them would cost an
/// allocation per frame for the rare handshakes' sake.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Link {
    /// A host's first frame to the directory node: where it listens, and a nonce that is new
    /// every time the host process starts (so a restart is told from a reconnect).
    HostHello {
        /// Its listen address (its identity: the same address keeps its node id).
        listen: String,
        /// New per process start.
        boot_nonce: u64,
        /// The cluster key, if the cluster has one.
        key: Option<ClusterKey>,
    },
    /// A program that only sends calls (a benchmark, a test) gets a transient node id.
    ClientHello {
        /// The cluster key, if the cluster has one.
        key: Option<ClusterKey>,
    },
    /// The directory node's answer: the host's node id and incarnation, who serves, the peers.
    Welcome {
        /// The host's node id.
        node: NodeId,
        /// The host's incarnation (raised on every restart).
        incarnation: u64,
        /// The directory's address.
        directory: Address,
        /// Its authority epoch (replies from another epoch are not accepted).
        epoch: AuthorityEpoch,
        /// Every other host.
        peers: Vec<Peer>,
    },
    /// The peer table changed.
    Peers(Vec<Peer>),
    /// A host's first frame to another host.
    PeerHello {
        /// The connecting host.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
        /// The cluster key, if the cluster has one.
        key: Option<ClusterKey>,
    },
    /// The answer to a hello that is not admitted (a missing or wrong cluster key); the
    /// connection is closed right after it.
    Refused {
        /// Why, for the operator.
        reason: String,
    },
    /// A core frame.
    Frame(Envelope),
}

/// The [`Link::Refused`] reason for a hello with the wrong key (or none, or one too many).
pub const WRONG_KEY: &str = "wrong cluster key (see --cluster-key-file)";

/// What a connection thread tells the driver.
#[derive(Debug)]
pub enum Event<T> {
    /// A frame arrived.
    Received(ConnId, T),
    /// The connection ended (`reason` says why; a clean close reads "closed by the peer").
    Closed(ConnId, String),
}

/// The driver's handle on one connection: queue frames of type `W`, or close it.
#[derive(Debug)]
pub struct Conn<W> {
    /// Its number.
    pub id: ConnId,
    queue: Sender<W>,
    closer: Closer,
}

impl<W> Clone for Conn<W> {
    fn clone(&self) -> Self {
        Conn {
            id: self.id,
            queue: self.queue.clone(),
            closer: self.closer.clone(),
        }
    }
}

#[derive(Debug, Clone)]
enum Closer {
    Tcp(std::sync::Arc<TcpStream>),
    Unix(std::sync::Arc<UnixStream>),
}

impl Closer {
    fn shutdown(&self) {
        let _ = match self {
            Closer::Tcp(s) => s.shutdown(Shutdown::Both),
            Closer::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl<W> Conn<W> {
    /// Queues one frame; returns false if it was dropped (queue full or connection gone).
    pub fn send(&self, value: W) -> bool {
        match self.queue.try_send(value) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }

    /// Closes the connection (both threads end; the reader reports `Closed`).
    pub fn close(&self) {
        self.closer.shutdown();
    }
}

/// Starts the reader and writer threads of a TCP connection. Frames of type `T` arrive on
/// `events` wrapped by `wrap`.
pub fn spawn_tcp<T, W, E>(
    id: ConnId,
    stream: TcpStream,
    events: Sender<E>,
    wrap: fn(Event<T>) -> E,
) -> io::Result<Conn<W>>
where
    T: DeserializeOwned + Send + 'static,
    W: Outgoing,
    E: Send + 'static,
{
    stream.set_nodelay(true)?;
    let reader = stream.try_clone()?;
    let writer = stream.try_clone()?;
    let shared = std::sync::Arc::new(stream);
    let (queue, rx) = bounded(WRITE_QUEUE_FRAMES);
    spawn_writer(writer, rx, Closer::Tcp(shared.clone()));
    spawn_reader(id, reader, events, wrap, Closer::Tcp(shared.clone()));
    Ok(Conn {
        id,
        queue,
        closer: Closer::Tcp(shared),
    })
}

/// Starts the reader and writer threads of a Unix-socket connection (a child process). The
/// reader starts with `reader` (which may already hold buffered bytes).
pub fn spawn_unix<T, W, E>(
    id: ConnId,
    stream: UnixStream,
    events: Sender<E>,
    wrap: fn(Event<T>) -> E,
) -> io::Result<Conn<W>>
where
    T: DeserializeOwned + Send + 'static,
    W: Outgoing,
    E: Send + 'static,
{
    let reader = stream.try_clone()?;
    let writer = stream.try_clone()?;
    let shared = std::sync::Arc::new(stream);
    let (queue, rx) = bounded(WRITE_QUEUE_FRAMES);
    spawn_writer(writer, rx, Closer::Unix(shared.clone()));
    spawn_reader(id, reader, events, wrap, Closer::Unix(shared.clone()));
    Ok(Conn {
        id,
        queue,
        closer: Closer::Unix(shared),
    })
}

/// Most bytes a writer gathers from its queue into one write.
const WRITE_BATCH_BYTES: usize = 1 << 20;

/// A value a writer sends. A value may hand over a *tail*: bytes its encoding ends with (a byte
/// string as its last field), which the writer then sends from where they are (`writev`)
/// instead of copying them into the frame. The bytes on the wire are the same either way.
pub trait Outgoing: Serialize + Send + 'static {
    /// Takes the trailing byte string out of the value (leaving it empty), if it has one worth
    /// sending in place.
    fn take_tail(&mut self) -> Option<Vec<u8>> {
        None
    }
}

impl Outgoing for dataplane_core::wire::ChildEvent {}

impl Outgoing for Link {
    fn take_tail(&mut self) -> Option<Vec<u8>> {
        // A chunk's bytes are the last field of the last field of the frame.
        match self {
            Link::Frame(Envelope {
                message: dataplane_core::wire::Message::Chunk { bytes, .. },
                ..
            }) if bytes.as_slice().len() >= TAIL_MIN_BYTES => Some(std::mem::take(bytes).into()),
            _ => None,
        }
    }
}

/// Tails shorter than this are copied into the frame (a second write costs more).
const TAIL_MIN_BYTES: usize = 16 * 1024;

/// Appends one frame for `value` to `buf`; returns its tail, to be written right after `buf`.
fn encode_with_tail<W: Outgoing>(mut value: W, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let start = buf.len();
    let tail = value.take_tail();
    if encode_frame(&value, buf).is_err() {
        // A value that cannot be encoded is dropped (nothing was appended).
        return None;
    }
    let tail = tail?;
    // The encoding ends with the empty byte string's length, a single 0: replace it with the
    // tail's length (a LEB128 varint, as postcard writes it) and count the tail in the prefix.
    if buf.last() != Some(&0) {
        buf.truncate(start);
        return None;
    }
    buf.pop();
    let mut n = tail.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            buf.push(byte);
            break;
        }
        buf.push(byte | 0x80);
    }
    let payload = buf.len() - start - crate::frame::LENGTH_PREFIX_BYTES + tail.len();
    if payload > dataplane_core::limits::FRAME_BYTES_MAX {
        buf.truncate(start);
        return None;
    }
    let prefix = u32::try_from(payload).unwrap_or(u32::MAX).to_le_bytes();
    buf[start..start + crate::frame::LENGTH_PREFIX_BYTES].copy_from_slice(&prefix);
    Some(tail)
}

/// Writes `buf` with each `(at, tail)` spliced in after `buf[..at]`, completely, with as few
/// `writev`s as the kernel allows.
fn write_spliced<S: Write>(w: &mut S, buf: &[u8], tails: &[(usize, Vec<u8>)]) -> io::Result<()> {
    let mut parts = Vec::with_capacity(2 * tails.len() + 1);
    let mut from = 0;
    for (at, tail) in tails {
        parts.push(io::IoSlice::new(&buf[from..*at]));
        parts.push(io::IoSlice::new(tail));
        from = *at;
    }
    parts.push(io::IoSlice::new(&buf[from..]));
    let mut slices: &mut [io::IoSlice<'_>] = &mut parts;
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn spawn_writer<S, W>(mut w: S, rx: Receiver<W>, closer: Closer)
where
    S: Write + Send + 'static,
    W: Outgoing,
{
    thread::spawn(move || {
        let mut buf = Vec::new();
        let mut tails: Vec<(usize, Vec<u8>)> = Vec::new();
        while let Ok(first) = rx.recv() {
            buf.clear();
            tails.clear();
            let mut batched = 0;
            let mut next = Some(first);
            while let Some(value) = next.take() {
                if let Some(tail) = encode_with_tail(value, &mut buf) {
                    batched += tail.len();
                    tails.push((buf.len(), tail));
                }
                if buf.len() + batched < WRITE_BATCH_BYTES {
                    next = rx.try_recv().ok();
                }
            }
            if write_spliced(&mut w, &buf, &tails).is_err() {
                closer.shutdown();
                return;
            }
        }
        // The driver dropped the connection: close it.
        closer.shutdown();
    });
}

fn spawn_reader<R, T, E>(
    id: ConnId,
    r: R,
    events: Sender<E>,
    wrap: fn(Event<T>) -> E,
    closer: Closer,
) where
    R: io::Read + Send + 'static,
    T: DeserializeOwned + Send + 'static,
    E: Send + 'static,
{
    thread::spawn(move || {
        let mut reader = FrameReader::new(r);
        let reason = loop {
            match reader.read_frame::<T>() {
                Ok(Some(frame)) => {
                    if events.send(wrap(Event::Received(id, frame))).is_err() {
                        return;
                    }
                }
                Ok(None) => break "closed by the peer".to_owned(),
                Err(error) => break error.to_string(),
            }
        };
        closer.shutdown();
        let _ = events.send(wrap(Event::Closed(id, reason)));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_core::ids::{Address, NodeId};
    use dataplane_core::wire::{ChunkBytes, Message};

    #[test]
    fn a_cluster_key_admits_exactly_its_own() {
        let key = ClusterKey::from_secret(b"0123456789abcdef").unwrap();
        // Trailing whitespace is not part of the secret; anything else is.
        assert_eq!(
            ClusterKey::from_secret(b"0123456789abcdef \r\n").unwrap(),
            key
        );
        let other = ClusterKey::from_secret(b"0123456789abcdeg").unwrap();
        assert!(ClusterKey::admits(Some(&key), Some(&key)));
        assert!(ClusterKey::admits(None, None));
        assert!(!ClusterKey::admits(Some(&key), Some(&other)));
        assert!(!ClusterKey::admits(Some(&key), None));
        assert!(!ClusterKey::admits(None, Some(&key)));
        assert!(matches!(
            ClusterKey::from_secret(b"0123456789abcde\n"),
            Err(KeyError::TooShort { len: 15 })
        ));
        assert_eq!(
            format!("{key:?}"),
            "ClusterKey(..)",
            "Debug shows nothing of it"
        );
    }

    fn chunk(len: usize) -> Link {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        Link::Frame(Envelope {
            from: Address::new(NodeId(1), 2, 3),
            to: Address::new(NodeId(4), 5, 1 << 40),
            message: Message::Chunk {
                offset: 1 << 20,
                total: 1 << 26,
                digest: Some([9; 32]),
                bytes: ChunkBytes::new(bytes).unwrap(),
            },
        })
    }

    #[test]
    fn a_frame_sent_with_its_tail_in_place_is_the_same_bytes() {
        for len in [
            0,
            100,
            TAIL_MIN_BYTES - 1,
            TAIL_MIN_BYTES,
            65_536,
            200_000,
            262_144,
        ] {
            let value = chunk(len);
            let mut plain = Vec::new();
            encode_frame(&value, &mut plain).unwrap();
            let mut head = vec![0xaa]; // Frames are appended: what came before stays.
            let tail = encode_with_tail(value.clone(), &mut head);
            let mut sent = head[1..].to_vec();
            if let Some(tail) = &tail {
                sent.extend_from_slice(tail);
            }
            assert_eq!(tail.is_some(), len >= TAIL_MIN_BYTES, "len {len}");
            assert_eq!(sent, plain, "len {len}");
            let mut reader = FrameReader::new(sent.as_slice());
            assert_eq!(reader.read_frame::<Link>().unwrap(), Some(value));
        }
    }
}

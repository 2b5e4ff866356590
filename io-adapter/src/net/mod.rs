//! Connections between nodes and to children: the [`reactor`] (one poll loop per node), the
//! cluster key from its file, and blocking handshakes for programs that speak to nodes.
//!
//! The [`Link`] protocol between nodes and the two halves of its handshake are core's
//! ([`dataplane_core::link`], re-exported here), and so are the machines that sequence it per
//! connection ([`dataplane_core::conns`]): the nodes run those over this reactor, and the
//! simulator runs the same ones over simulated connections. Traffic after the handshake is
//! **not** encrypted or authenticated frame by frame: see README.md.

use std::fmt;
use std::io;
use std::net::TcpStream;
use std::path::{Path, PathBuf};

use dataplane_core::admission::Nonce;
use dataplane_core::conns::Closing;
pub use dataplane_core::link::{
    Acceptor, ClusterKey, Connector, HandshakeFailure, Link, SecretTooShort, Who, hello_version,
};
use dataplane_core::log::LogRecord;
use dataplane_core::wire::Envelope;
use serde::Serialize;

use crate::frame::{FrameReader, encode_frame, write_frame};

/// A blocking TCP connection to `address` (`HOST:PORT`), trying each address it resolves to
/// for at most `timeout`.
pub fn connect_tcp(address: &str, timeout: std::time::Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::other(format!("{address}: no address"));
    for a in std::net::ToSocketAddrs::to_socket_addrs(address)? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

pub mod reactor;

pub use reactor::{
    ConnId, Limits, ListenerId, NetEvent, Overflow, Reactor, Remote, SEND_BUDGET_BYTES,
};

/// The key for the secret in the file at `path`.
pub fn read_cluster_key(path: &Path) -> Result<ClusterKey, KeyError> {
    let secret = std::fs::read(path).map_err(|error| KeyError::Io {
        path: path.to_owned(),
        error,
    })?;
    ClusterKey::from_secret(&secret).map_err(|SecretTooShort(len)| KeyError::FileTooShort {
        path: path.to_owned(),
        len,
    })
}

/// Why a cluster key could not be made.
#[derive(Debug)]
pub enum KeyError {
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

/// Why a blocking handshake failed.
#[derive(Debug)]
pub enum HandshakeError {
    /// The connection failed.
    Io(io::Error),
    /// The other side refused us (its reason).
    Refused(String),
    /// The other side could not prove the cluster key (why, in words); it was told so.
    Unproven(String),
    /// The other side said something out of protocol.
    Protocol(String),
    /// A replica of a replicated directory that does not serve: where it says the leader
    /// takes hosts, if it knows.
    NotLeader(Option<String>),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Io(e) => write!(f, "{e}"),
            HandshakeError::Refused(reason) => write!(f, "refused: {reason}"),
            HandshakeError::Unproven(why) => {
                write!(f, "the other side could not prove the cluster key: {why}")
            }
            HandshakeError::Protocol(what) => write!(f, "protocol: {what}"),
            HandshakeError::NotLeader(leader) => write!(
                f,
                "not the leader (the leader takes hosts at {})",
                leader
                    .as_deref()
                    .unwrap_or("an address it does not know yet")
            ),
        }
    }
}

impl std::error::Error for HandshakeError {}

impl From<HandshakeFailure> for HandshakeError {
    fn from(failure: HandshakeFailure) -> Self {
        match failure {
            HandshakeFailure::Refused(reason) => HandshakeError::Refused(reason),
            HandshakeFailure::Unproven(why) => HandshakeError::Unproven(why),
            HandshakeFailure::Protocol(what) => HandshakeError::Protocol(what),
        }
    }
}

/// What is left to the node after `perform_conn_action!` carried out a connection machine's
/// action.
#[derive(Debug)]
pub enum Performed {
    /// Done (and logged).
    Done,
    /// Done: a connection was refused or closed for this reason (count it).
    Closed(Closing),
    /// These records must be durable (appended and synced) before the next action.
    Persist(Vec<LogRecord>),
}

/// Carries out one action of core's connection machines ([`dataplane_core::conns`]) on the
/// reactor `$net`, in the node's words `$what` for its log lines ("connection", "host
/// connection"), and evaluates to what is left to the node ([`Performed`]). A macro, so that
/// the log lines carry the calling node's target (`dataplane_io::dirnode`, `…::hostnode`).
macro_rules! perform_conn_action {
    ($net:expr, $action:expr, $what:literal) => {{
        use dataplane_core::admission::{ADMISSION_DEADLINE, PENDING_CONNECTIONS_MAX};
        use dataplane_core::conns::{Closing, ConnAction};
        use $crate::net::{Limits, Link, Performed};
        let net: &mut $crate::net::Reactor = $net;
        match $action {
            ConnAction::Send(conn, link) => {
                // A frame a full queue drops is as lost as one the network drops.
                let _ = net.send(conn, link);
                Performed::Done
            }
            ConnAction::Resume(conn) => {
                net.resume(conn);
                Performed::Done
            }
            ConnAction::Admitted(conn) => {
                net.set_limits(conn, Limits::peer());
                Performed::Done
            }
            ConnAction::Refuse { conn, why, reason } => {
                if let Some(unlogged) = $crate::throttle::REFUSED_LINES.occur() {
                    tracing::info!(
                        conn,
                        remote = %net.remote(conn),
                        %reason,
                        unlogged,
                        concat!($what, " refused (at most one such line every 10 s)")
                    );
                }
                net.send(conn, Link::Refused { reason });
                net.close_after_flush(conn);
                Performed::Closed(why)
            }
            ConnAction::Close(conn, why) => {
                let remote = net.remote(conn);
                match why {
                    Closing::Evicted => {
                        if let Some(unlogged) = $crate::throttle::EVICTED_LINES.occur() {
                            tracing::info!(
                                conn,
                                %remote,
                                unlogged,
                                "{} closed: {PENDING_CONNECTIONS_MAX} connections wait for \
                                 admission, and the oldest makes room for a new one (at most \
                                 one such line every 10 s)",
                                $what
                            )
                        }
                    }
                    Closing::Expired => tracing::debug!(
                        conn,
                        %remote,
                        "{} closed: not admitted within {ADMISSION_DEADLINE}",
                        $what
                    ),
                    Closing::Replaced => {
                        tracing::debug!(conn, "{} closed: its node connected again", $what)
                    }
                    Closing::Protocol => {
                        if let Some(unlogged) = $crate::throttle::PROTOCOL_LINES.occur() {
                            tracing::warn!(
                                conn,
                                %remote,
                                unlogged,
                                "{} closed: a frame out of protocol, or about another node (at \
                                 most one such line every 10 s)",
                                $what
                            )
                        }
                    }
                    _ => tracing::debug!(conn, %remote, ?why, "{} closed", $what),
                }
                net.close(conn);
                Performed::Closed(why)
            }
            ConnAction::Persist(records) => Performed::Persist(records),
        }
    }};
}
pub(crate) use perform_conn_action;

/// A fresh nonce from the kernel (`getrandom`); there is no fallback.
pub fn fresh_nonce() -> io::Result<Nonce> {
    let mut nonce = [0u8; 32];
    getrandom::fill(&mut nonce).map_err(|e| io::Error::other(format!("getrandom: {e}")))?;
    Ok(nonce)
}

/// The connecting side's handshake on a blocking stream: hello, challenge, proof, then the
/// first frame after it (the directory's `Welcome`, or a `Refused`). `stream` should have a
/// read timeout.
pub fn handshake_blocking(
    stream: &TcpStream,
    who: Who,
    key: Option<&ClusterKey>,
) -> Result<(Link, FrameReader<TcpStream>), HandshakeError> {
    let mut reader = prove_blocking(stream, who, key)?;
    let after = reader
        .read_frame::<Link>()
        .map_err(|e| HandshakeError::Io(io::Error::other(e.to_string())))?
        .ok_or_else(|| {
            HandshakeError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed after the handshake",
            ))
        })?;
    if let Link::Refused { reason } = after {
        return Err(HandshakeError::Refused(reason));
    }
    Ok((after, reader))
}

/// The connecting side's handshake on a blocking stream up to its proof (to another host,
/// which answers nothing more: frames may follow at once). Returns the reader, which may hold
/// bytes already received.
pub fn prove_blocking(
    stream: &TcpStream,
    who: Who,
    key: Option<&ClusterKey>,
) -> Result<FrameReader<TcpStream>, HandshakeError> {
    let nonce = fresh_nonce().map_err(HandshakeError::Io)?;
    let (connector, hello) = Connector::new(who, nonce, key);
    let mut w = stream;
    let io = |e: crate::frame::FrameError| HandshakeError::Io(io::Error::other(e.to_string()));
    write_frame(&mut w, &hello).map_err(io)?;
    let mut reader = FrameReader::new(stream.try_clone().map_err(HandshakeError::Io)?);
    let mut next = || -> Result<Link, HandshakeError> {
        reader.read_frame::<Link>().map_err(io)?.ok_or_else(|| {
            HandshakeError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed during the handshake",
            ))
        })
    };
    let challenge = next()?;
    if let Link::NotLeader { leader } = challenge {
        return Err(HandshakeError::NotLeader(leader));
    }
    let proof = match connector.answer(&challenge) {
        Ok(proof) => proof,
        Err(HandshakeFailure::Unproven(why)) => {
            // The other side hears why we close, and counts a wrong key.
            let _ = write_frame(&mut w, &connector.rejection());
            return Err(HandshakeError::Unproven(why));
        }
        Err(e) => return Err(e.into()),
    };
    write_frame(&mut w, &proof).map_err(io)?;
    Ok(reader)
}

/// The accepting side's handshake on a blocking stream (for programs that pose as a node, such
/// as tests): reads the hello, sends the challenge, checks the proof. Returns who connected and
/// the reader for the frames that follow.
pub fn accept_blocking(
    stream: &TcpStream,
    key: Option<&ClusterKey>,
) -> Result<(Who, FrameReader<TcpStream>), HandshakeError> {
    let io = |e: crate::frame::FrameError| HandshakeError::Io(io::Error::other(e.to_string()));
    let mut reader = FrameReader::new(stream.try_clone().map_err(HandshakeError::Io)?);
    let hello = reader
        .read_frame::<Link>()
        .map_err(io)?
        .ok_or_else(|| HandshakeError::Protocol("closed before the hello".to_owned()))?;
    let payload =
        postcard::to_allocvec(&hello).map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    let nonce = fresh_nonce().map_err(HandshakeError::Io)?;
    let (acceptor, who, challenge) = Acceptor::answer(&payload, nonce, key)
        .map_err(|e| HandshakeError::Refused(e.to_string()))?;
    let mut w = stream;
    write_frame(&mut w, &challenge).map_err(io)?;
    let proof = reader
        .read_frame::<Link>()
        .map_err(io)?
        .ok_or_else(|| HandshakeError::Protocol("closed before the proof".to_owned()))?;
    acceptor
        .check(&proof)
        .map_err(|e| HandshakeError::Refused(e.to_string()))?;
    Ok((who, reader))
}

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
pub(crate) fn encode_with_tail<W: Outgoing>(mut value: W, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_core::ids::{Address, NodeId};
    use dataplane_core::wire::{ChunkBytes, Message};

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

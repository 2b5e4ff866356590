//! The child side: a program that links the adapter attaches to its host through the host's
//! Unix socket, maps the shared arena (read-only), writes each blob into a staging buffer the
//! host gives it (the host copies it into the arena when the write is sealed, so nobody can
//! change it afterwards), and reads blobs as zero-copy views of the arena.
//!
//! ```no_run
//! use dataplane_io::child::ChildSession;
//! let mut session = ChildSession::connect("/tmp/dataplane.sock".as_ref())?;
//! let revision = session.write("/data/hello", 5, |payload| payload.copy_from_slice(b"hello"))?;
//! let view = session.read("/data/hello")?;
//! assert_eq!(view.bytes(), b"hello");
//! drop(view); // releases the lease
//! # Ok::<(), dataplane_io::child::ChildError>(())
//! ```
//!
//! One operation is in flight at a time; every call waits for its answer. A [`BlobView`]
//! borrows the session, so the lease it maps is released (and acknowledged) when it is dropped,
//! before the session can do anything else.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;

use dataplane_core::blob::{self, BlobAccess, BlobState, DigestKind, Expected};
use dataplane_core::error::DataPlaneError;
use dataplane_core::ids::Revision;
use dataplane_core::limits::FRAME_BYTES_MAX;
use dataplane_core::wire::{
    Capability, ChildEvent, ChildOp, ChildRequest, Descriptor, EntryKind, LeaseView, StreamMatch,
    StreamRole, decode_value,
};

use std::collections::{BTreeSet, VecDeque};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use dataplane_core::arena::{Lease, RingId};
use serde::de::DeserializeOwned;

use crate::arena::{ReadOnlyArena, WriteBuffer, recv_with_fd};
use crate::frame::{LENGTH_PREFIX_BYTES, write_frame};
use crate::hostnode::{ChildGreeting, ChildHello, ChildWelcome, capability_path};

/// Why a child operation failed.
#[derive(Debug)]
pub enum ChildError {
    /// The host socket or the capability file could not be used.
    Connect(String),
    /// The host closed the connection before it answered (it exited, or was killed).
    Disconnected,
    /// The host answered something the protocol does not allow.
    Protocol(String),
    /// The host refused the operation.
    Failed(DataPlaneError),
    /// The host refused to attach us: its reason, and whether trying again later may succeed
    /// (a full host) or not (a wrong capability).
    Refused {
        /// The host's reason.
        reason: String,
        /// A full host, rather than a wrong capability.
        busy: bool,
    },
    /// The host's supervisor revoked this session: nothing more can be done on it.
    Revoked,
    /// Nothing came from the host within the time the caller allowed.
    TimedOut,
}

impl fmt::Display for ChildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildError::Connect(e) => write!(f, "cannot reach the host: {e}"),
            ChildError::Disconnected => {
                f.write_str("the host closed the connection before it answered")
            }
            ChildError::Protocol(e) => write!(f, "host protocol: {e}"),
            ChildError::Failed(e) => write!(f, "{}", describe(e)),
            ChildError::Revoked => f.write_str("the host revoked this session"),
            ChildError::TimedOut => f.write_str("no answer from the host in the time allowed"),
            ChildError::Refused { reason, .. } => {
                write!(f, "the host refused to attach: {reason}")
            }
        }
    }
}

impl std::error::Error for ChildError {}

/// A one-line description of a host error, path first where there is one: the error's
/// `Display` (core writes every message; none is Rust debug text).
pub fn describe(error: &DataPlaneError) -> String {
    error.to_string()
}

fn protocol(e: impl fmt::Display) -> ChildError {
    ChildError::Protocol(e.to_string())
}

/// The name of an event, for messages about an unexpected one.
fn event_name(event: &ChildEvent) -> &'static str {
    match event {
        ChildEvent::Attached { .. } => "Attached",
        ChildEvent::AttachFailed { .. } => "AttachFailed",
        ChildEvent::ReadGranted { .. } => "ReadGranted",
        ChildEvent::WriteGranted { .. } => "WriteGranted",
        ChildEvent::Published { .. } => "Published",
        ChildEvent::Aborted { .. } => "Aborted",
        ChildEvent::Released { .. } => "Released",
        ChildEvent::Failed { .. } => "Failed",
        ChildEvent::Stat { .. } => "Stat",
        ChildEvent::Done { .. } => "Done",
        ChildEvent::Closed => "Closed",
        ChildEvent::Revoked => "Revoked",
        ChildEvent::StreamMatched { .. } => "StreamMatched",
        ChildEvent::StreamDisplaced { .. } => "StreamDisplaced",
        ChildEvent::StreamClosed { .. } => "StreamClosed",
    }
}

/// A protocol error for an event that does not belong at `stage`.
fn unexpected(event: &ChildEvent, stage: &str) -> ChildError {
    protocol(format!("unexpected {} event {stage}", event_name(event)))
}

/// What `stat` says about a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Blob or stream.
    pub kind: EntryKind,
    /// Its revision.
    pub revision: Revision,
    /// A blob's length (unknown for a lost blob).
    pub length: Option<u64>,
    /// The blob is lost: its bytes lived on a host that restarted, and a read fails
    /// [`DataPlaneError::BlobLost`].
    pub lost: bool,
}

/// Reads the frames the host sends a child, with the descriptors that travel with some of
/// them (the arena with the welcome, a staging buffer with a write grant). [`ChildSession`]
/// uses it; so can a program that speaks the child protocol itself (a test, a hostile child).
///
/// A descriptor sent with a frame (`SCM_RIGHTS` on its first byte) arrives with the `recvmsg`
/// that reads that byte, and the kernel starts that read there; so every descriptor belongs to
/// the frame that begins where the read that brought it began.
#[derive(Debug)]
pub struct Inbox {
    stream: UnixStream,
    /// Received bytes not yet framed: `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The stream position of `buf[start]`.
    position: u64,
    /// Descriptors by the stream position of the frame they came with.
    fds: VecDeque<(u64, OwnedFd)>,
}

impl Inbox {
    /// Reads from `stream` (a clone of the child's connection).
    pub fn new(stream: UnixStream) -> Inbox {
        Inbox {
            stream,
            buf: vec![0; 8 * 1024],
            start: 0,
            end: 0,
            position: 0,
            fds: VecDeque::new(),
        }
    }

    /// Receives more bytes (and a descriptor with them, if one came). `false` at the end of
    /// the stream.
    fn fill(&mut self, want: usize) -> Result<bool, ChildError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        if self.end == self.buf.len() {
            let len = self.buf.len();
            self.buf.resize(len * 2, 0);
        }
        let at = self.position + self.end as u64;
        let (n, fd) = recv_with_fd(&self.stream, &mut self.buf[self.end..]).map_err(|e| {
            match e.kind() {
                // A read timeout or a non-blocking socket: nothing was consumed, ask again
                // later.
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ChildError::TimedOut,
                // The host closed the connection before it read what this child sent (it
                // died, or dropped the connection): gone, as at the end of the stream; not
                // a protocol error.
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => ChildError::Disconnected,
                _ => protocol(e),
            }
        })?;
        if let Some(fd) = fd {
            self.fds.push_back((at, fd));
        }
        self.end += n;
        Ok(n > 0)
    }

    /// The next frame and the descriptor that came with it; `None` at the end of the stream.
    pub fn next_frame<T: DeserializeOwned>(
        &mut self,
    ) -> Result<Option<(T, Option<OwnedFd>)>, ChildError> {
        while self.end - self.start < LENGTH_PREFIX_BYTES {
            if !self.fill(LENGTH_PREFIX_BYTES)? {
                return if self.end == self.start {
                    Ok(None)
                } else {
                    Err(ChildError::Disconnected)
                };
            }
        }
        let p = &self.buf[self.start..self.start + LENGTH_PREFIX_BYTES];
        let len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
        if len > FRAME_BYTES_MAX {
            return Err(protocol("an oversized frame from the host"));
        }
        let total = LENGTH_PREFIX_BYTES + len;
        while self.end - self.start < total {
            if !self.fill(total)? {
                return Err(ChildError::Disconnected);
            }
        }
        let body = &self.buf[self.start + LENGTH_PREFIX_BYTES..self.start + total];
        let value = decode_value::<T>(body, FRAME_BYTES_MAX).map_err(protocol)?;
        let here = self.position;
        // Descriptors of earlier frames that nobody claimed are closed here.
        while self.fds.front().is_some_and(|(at, _)| *at < here) {
            self.fds.pop_front();
        }
        let fd = match self.fds.front() {
            Some((at, _)) if *at == here => self.fds.pop_front().map(|(_, fd)| fd),
            _ => None,
        };
        self.start += total;
        self.position += total as u64;
        Ok(Some((value, fd)))
    }
}

/// An attached child session.
#[derive(Debug)]
pub struct ChildSession {
    stream: UnixStream,
    inbox: Inbox,
    arena: ReadOnlyArena,
    /// Staging buffers the host sent, by inode: it reuses them for our later writes, so we
    /// keep them mapped.
    buffers: VecDeque<(u64, WriteBuffer)>,
    welcome: ChildWelcome,
    next_op: u64,
    digest: DigestKind,
    /// Whether this process hashes its writes at the seal too (see
    /// [`ChildSession::set_hash_in_child`]).
    hash_in_child: bool,
    /// Streams the host said were displaced while we waited for something else.
    displaced: BTreeSet<ChildOp>,
    /// How long a call waits for the host's answer (`None`: for ever).
    call_wait: Option<Duration>,
    /// Operations whose call gave up waiting (at most [`ABANDONED_MAX`]): a grant that comes
    /// for one later is released as it is heard.
    abandoned: BTreeSet<ChildOp>,
}

/// Most operations a session remembers as given up on (the oldest is forgotten past it).
const ABANDONED_MAX: usize = 1024;

/// How a stream open treats what is at its path (SPEC §4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamOpen {
    /// Displace a waiting open of the same role, fence an active rendezvous, or replace a
    /// blob.
    pub replace: bool,
    /// Create the stream node if absent (and skip the revision check).
    pub ensure: bool,
    /// Without `ensure`: fail unless the node still has this revision.
    pub expected_revision: Option<Revision>,
}

impl Default for StreamOpen {
    /// Ensure the node, replace nothing.
    fn default() -> Self {
        StreamOpen {
            replace: false,
            ensure: true,
            expected_revision: None,
        }
    }
}

/// One side of a matched stream (issue 17). The host runs the endpoint; the bytes go over a
/// transport of the program's choosing, addressed by the descriptors (see
/// [`crate::transport`] for the reference one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    op: ChildOp,
    role: StreamRole,
    matched: StreamMatch,
}

impl Stream {
    /// This side.
    pub fn role(&self) -> StreamRole {
        self.role
    }

    /// The rendezvous: both endpoints, both descriptors, its incarnation.
    pub fn matched(&self) -> &StreamMatch {
        &self.matched
    }

    /// The other side's descriptor.
    pub fn peer_descriptor(&self) -> &[u8] {
        match self.role {
            StreamRole::Source => self.matched.sink_descriptor.as_bytes(),
            StreamRole::Sink => self.matched.source_descriptor.as_bytes(),
        }
    }
}

/// Staging buffers a session keeps mapped.
const BUFFERS_KEPT: usize = 3;
/// How long [`ChildSession::connect`] waits for the host's greeting and the attachment: a
/// host that serves answers at once, but one that has bound its socket and is still waiting
/// for the directory's first welcome (or is stopped) reads nothing.
pub const ATTACH_WAIT: Duration = Duration::from_secs(10);
/// How long a call waits for the host's answer by default (see
/// [`ChildSession::set_call_wait`]): longer than a live host takes to answer anything (it
/// gives up a read's arena allocation after 60 s, its transfer after 60 s, a directory call
/// after its proxy deadline), so only a stopped or wedged host reaches it. A stream open's
/// wait for its peer is its own (`open_stream`'s `wait`).
pub const CALL_WAIT: Duration = Duration::from_secs(300);

/// Why the capability file at `cap` (beside `socket`) could not be read, in the words of
/// what the user can do: no host serves there, one is still starting, or the file is not
/// theirs to read.
fn missing_host(socket: &Path, cap: &Path, e: io::Error) -> ChildError {
    let (socket, cap) = (socket.display(), cap.display());
    ChildError::Connect(match e.kind() {
        io::ErrorKind::NotFound if !Path::new(&socket.to_string()).exists() => format!(
            "no host serves {socket} (there is no such socket): start the host, or give the \
             --socket it was started with"
        ),
        io::ErrorKind::NotFound => format!(
            "{socket} has no capability file {cap} yet: the host writes it once it serves (it \
             may still be starting)"
        ),
        io::ErrorKind::PermissionDenied => format!(
            "may not read the host's capability file {cap}: run as a user the host lets in \
             (the file's owner or group)"
        ),
        _ => format!("{cap}: {e}"),
    })
}

impl ChildSession {
    /// Connects to the host's socket, attaches with the capability in `<socket>.cap`, and
    /// maps the arena (read-only) that the host hands over once the capability checked out.
    /// A host that does not greet and attach within [`ATTACH_WAIT`] gets
    /// [`ChildError::TimedOut`].
    pub fn connect(socket: &Path) -> Result<ChildSession, ChildError> {
        Self::connect_within(socket, ATTACH_WAIT)
    }

    /// [`connect`](Self::connect), giving the host `attach_wait` (at least 1 ms) to greet
    /// and attach.
    pub fn connect_within(
        socket: &Path,
        attach_wait: Duration,
    ) -> Result<ChildSession, ChildError> {
        let attach_wait = attach_wait.max(Duration::from_millis(1));
        let connect = |what: &str, e: io::Error| ChildError::Connect(format!("{what}: {e}"));
        let cap_path = capability_path(socket);
        let cap = fs::read(&cap_path).map_err(|e| missing_host(socket, &cap_path, e))?;
        let capability: [u8; 32] = cap.try_into().map_err(|_| {
            ChildError::Connect(format!("{}: not a capability", cap_path.display()))
        })?;
        let stream =
            UnixStream::connect(socket).map_err(|e| connect(&socket.display().to_string(), e))?;
        // Until attached (the descriptor's options are shared with the inbox's clone).
        stream
            .set_read_timeout(Some(attach_wait))
            .map_err(|e| protocol(e.to_string()))?;
        let mut writer = &stream;
        write_frame(&mut writer, &ChildHello::new(Capability(capability))).map_err(protocol)?;
        let mut inbox = Inbox::new(stream.try_clone().map_err(protocol)?);
        // The greeting comes first, with the arena's descriptor if we are attached.
        let (greeting, fd) = inbox
            .next_frame::<ChildGreeting>()?
            .ok_or(ChildError::Disconnected)?;
        let welcome = match greeting {
            ChildGreeting::Welcome(welcome) => welcome,
            ChildGreeting::Refused { reason, busy } => {
                return Err(ChildError::Refused { reason, busy });
            }
        };
        let fd = fd.ok_or_else(|| protocol("the welcome carried no arena"))?;
        let arena =
            ReadOnlyArena::from_fd(fd, welcome.arena_size).map_err(|e| connect("arena", e))?;
        let mut session = ChildSession {
            stream,
            inbox,
            arena,
            buffers: VecDeque::new(),
            welcome,
            next_op: 1,
            digest: DigestKind::Blake3,
            hash_in_child: false,
            displaced: BTreeSet::new(),
            call_wait: Some(CALL_WAIT),
            abandoned: BTreeSet::new(),
        };
        match session.next_event()?.0 {
            ChildEvent::Attached { .. } => {
                session
                    .stream
                    .set_read_timeout(None)
                    .map_err(|e| protocol(e.to_string()))?;
                Ok(session)
            }
            ChildEvent::AttachFailed { error } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "at attach")),
        }
    }

    /// What the host told us when it attached us (our address, our session, the arena).
    pub fn welcome(&self) -> &ChildWelcome {
        &self.welcome
    }

    /// The digest later writes store at seal: BLAKE3 (the default; readers on every host
    /// check it) or none (the seal and the reads skip hashing: faster, unchecked).
    pub fn set_digest(&mut self, digest: DigestKind) {
        self.digest = digest;
    }

    /// With a BLAKE3 digest, whether this process hashes each write at its seal too (off by
    /// default). Off, the host computes the digest as it copies the write into memory no
    /// child can change, and stores it: one pass over the bytes. On, the seal stores this
    /// process's digest and the host refuses the write (`Blob(Digest)`) unless the bytes it
    /// froze hash the same: an end-to-end check from this process's memory, for a second pass.
    pub fn set_hash_in_child(&mut self, on: bool) {
        self.hash_in_child = on;
    }

    /// How long each call waits for the host's answer ([`CALL_WAIT`] by default; `None`: for
    /// ever). Past it the call returns [`ChildError::TimedOut`]; the host may still carry the
    /// operation out, so a timed-out rename or remove (or a write whose seal was sent) may
    /// have happened. A late answer is skipped by the next call, and a late grant released
    /// as it is heard (an unsealed write so abandoned). A stream open's wait for its peer is
    /// not bounded by it.
    pub fn set_call_wait(&mut self, wait: Option<Duration>) {
        self.call_wait = wait;
    }

    fn send(&mut self, request: &ChildRequest) -> Result<(), ChildError> {
        match write_frame(&mut self.stream, request) {
            Ok(()) => Ok(()),
            Err(crate::frame::FrameError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                // The host closed the connection. If it said why first (the supervisor
                // revoked this session), say that; otherwise the host is gone.
                while let Ok(Some((event, _))) = self.inbox.next_frame::<ChildEvent>() {
                    if matches!(event, ChildEvent::Revoked | ChildEvent::Closed) {
                        return Err(ChildError::Revoked);
                    }
                }
                Err(ChildError::Disconnected)
            }
            Err(e) => Err(protocol(e)),
        }
    }

    /// [`next_event`](Self::next_event), [`ChildError::TimedOut`] past `deadline` (`None`:
    /// none). It leaves the socket's read timeout set: the caller clears it when done.
    fn next_event_by(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(ChildEvent, Option<OwnedFd>), ChildError> {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ChildError::TimedOut);
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| protocol(e.to_string()))?;
        }
        self.next_event()
    }

    fn next_event(&mut self) -> Result<(ChildEvent, Option<OwnedFd>), ChildError> {
        self.inbox
            .next_frame::<ChildEvent>()?
            .ok_or(ChildError::Disconnected)
    }

    fn op(&mut self) -> ChildOp {
        let op = ChildOp(self.next_op);
        self.next_op += 1;
        op
    }

    /// The next event about `op` (events about other ops cannot occur: one op at a time).
    fn wait(&mut self, op: ChildOp) -> Result<ChildEvent, ChildError> {
        self.wait_with_fd(op).map(|(event, _)| event)
    }

    /// [`wait`](Self::wait), with the descriptor that came with the event: at most the
    /// session's call wait.
    fn wait_with_fd(&mut self, op: ChildOp) -> Result<(ChildEvent, Option<OwnedFd>), ChildError> {
        self.wait_with_fd_until(op, self.call_deadline())
    }

    /// When a call made now stops waiting (`None`: never; a wait too long to add is for ever).
    fn call_deadline(&self) -> Option<Instant> {
        self.call_wait
            .and_then(|wait| Instant::now().checked_add(wait))
    }

    /// The next event about `op`, until `deadline` (`None`: for ever): [`ChildError::TimedOut`]
    /// past it.
    fn wait_with_fd_until(
        &mut self,
        op: ChildOp,
        deadline: Option<Instant>,
    ) -> Result<(ChildEvent, Option<OwnedFd>), ChildError> {
        let result = self.wait_for(op, deadline);
        if deadline.is_some() {
            let _ = self.stream.set_read_timeout(None);
        }
        if matches!(result, Err(ChildError::TimedOut)) {
            // The host may still grant it: released when heard (see `wait_for`).
            if self.abandoned.len() >= ABANDONED_MAX {
                self.abandoned.pop_first();
            }
            self.abandoned.insert(op);
        }
        result
    }

    fn wait_for(
        &mut self,
        op: ChildOp,
        deadline: Option<Instant>,
    ) -> Result<(ChildEvent, Option<OwnedFd>), ChildError> {
        loop {
            let (event, fd) = self.next_event_by(deadline)?;
            let about = match &event {
                ChildEvent::ReadGranted { op, .. }
                | ChildEvent::WriteGranted { op, .. }
                | ChildEvent::Published { op, .. }
                | ChildEvent::Aborted { op }
                | ChildEvent::Released { op }
                | ChildEvent::Failed { op, .. }
                | ChildEvent::Stat { op, .. }
                | ChildEvent::Done { op, .. }
                | ChildEvent::StreamMatched { op, .. }
                | ChildEvent::StreamDisplaced { op }
                | ChildEvent::StreamClosed { op } => Some(*op),
                _ => None,
            };
            if about == Some(op) {
                // (Waited for again after giving up once: a stream open's cancel.)
                self.abandoned.remove(&op);
                return Ok((event, fd));
            }
            if let Some(late) = about.filter(|late| self.abandoned.contains(late)) {
                self.abandoned_heard(late, &event)?;
            }
            if let ChildEvent::StreamDisplaced { op } = event {
                // About a stream we are not waiting on: remembered for `displaced`.
                self.displaced.insert(op);
            }
            if matches!(event, ChildEvent::Revoked | ChildEvent::Closed) {
                return Err(ChildError::Revoked);
            }
        }
    }

    /// An answer about `late`, an operation whose call gave up: a grant (or a publication: a
    /// seal that was carried out after all) holds a lease, which is released (an unsealed
    /// write is so abandoned, nothing published); a final answer ends it.
    fn abandoned_heard(&mut self, late: ChildOp, event: &ChildEvent) -> Result<(), ChildError> {
        match event {
            ChildEvent::ReadGranted { .. }
            | ChildEvent::WriteGranted { .. }
            | ChildEvent::Published { .. } => {
                self.abandoned.remove(&late);
                self.send(&ChildRequest::Release { op: late })
            }
            ChildEvent::StreamMatched { .. } => {
                // A stream open that matched after its caller gave up: closed at once.
                self.abandoned.remove(&late);
                self.send(&ChildRequest::CloseStream { op: late })
            }
            ChildEvent::Aborted { .. } | ChildEvent::StreamDisplaced { .. } => Ok(()),
            _ => {
                self.abandoned.remove(&late);
                Ok(())
            }
        }
    }

    fn release(&mut self, op: ChildOp) -> Result<(), ChildError> {
        self.send(&ChildRequest::Release { op })?;
        match self.wait(op)? {
            ChildEvent::Released { .. } => Ok(()),
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "at release")),
        }
    }

    /// Writes a blob of `length` bytes — `fill` gets the payload, zeroed, in this session's
    /// staging buffer — then seals it (with the session's digest, see
    /// [`set_hash_in_child`](Self::set_hash_in_child)) and publishes it at `path` (replacing what was
    /// there).
    pub fn write(
        &mut self,
        path: &str,
        length: u64,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Revision, ChildError> {
        self.write_with(path, length, false, fill)
    }

    /// [`write`](Self::write), failing `PathExists` if something is at `path`.
    pub fn write_with(
        &mut self,
        path: &str,
        length: u64,
        exclusive: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Revision, ChildError> {
        let outcome = self.try_write(path, length, exclusive, |payload| {
            fill(payload);
            Ok::<(), std::convert::Infallible>(())
        })?;
        match outcome {
            Ok(revision) => Ok(revision),
            Err(never) => match never {},
        }
    }

    /// [`write_with`](Self::write_with) with a `fill` that may fail: on `Err(e)` the write is
    /// abandoned (released unsealed, so nothing is published) and the answer is `Ok(Err(e))`.
    pub fn try_write<E>(
        &mut self,
        path: &str,
        length: u64,
        exclusive: bool,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Result<Revision, E>, ChildError> {
        self.write_inner(path, length, exclusive, true, fill)
    }

    fn write_inner<E>(
        &mut self,
        path: &str,
        length: u64,
        exclusive: bool,
        zero: bool,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Result<Revision, E>, ChildError> {
        let op = self.op();
        self.send(&ChildRequest::OpenWrite {
            op,
            path: path.to_owned(),
            length,
            digest: self.digest,
            exclusive,
        })?;
        let (lease, fd) = match self.wait_with_fd(op)? {
            (ChildEvent::WriteGranted { lease, .. }, fd) => (lease, fd),
            (ChildEvent::Failed { error, .. }, _) => return Err(ChildError::Failed(error)),
            (other, _) => return Err(unexpected(&other, "at open")),
        };
        // The write goes into a staging buffer of our own, the lease's header at its start.
        let fd = fd.ok_or_else(|| protocol("the write grant carried no buffer"))?;
        let footprint = Lease {
            ring: RingId(0),
            offset: 0,
            length: lease.length,
        }
        .footprint();
        let (inode, mut buffer) = self.buffer(fd, footprint)?;
        let e = Expected {
            offset: 0,
            ..expected(&lease, BlobAccess::Writable)
        };
        let mem = buffer.as_mut_slice();
        let filled = match blob::payload_mut(mem, &e) {
            Ok(payload) => {
                // A reused buffer holds our earlier bytes: the payload starts zeroed, as a
                // fresh lease does, unless the caller writes every byte anyway.
                if zero {
                    payload.fill(0);
                }
                fill(payload)
            }
            Err(error) => {
                return Err(protocol(format!("the granted lease is unusable: {error}")));
            }
        };
        if let Err(error) = filled {
            // Releasing a write that was never sealed aborts it: `Aborted`, then `Released`.
            self.send(&ChildRequest::Release { op })?;
            loop {
                match self.wait(op)? {
                    ChildEvent::Aborted { .. } => {}
                    ChildEvent::Released { .. } => return Ok(Err(error)),
                    ChildEvent::Failed { error, .. } => return Err(ChildError::Failed(error)),
                    other => return Err(unexpected(&other, "at abandon")),
                }
            }
        }
        let sealed = if self.hash_in_child {
            blob::child_seal(mem, &e)
        } else {
            blob::child_seal_unhashed(mem, &e)
        };
        let sealed = sealed.map_err(|error| protocol(format!("seal: {error}")));
        // The host copies the buffer into the lease at the seal, and reuses it for our next
        // write.
        self.keep_buffer(inode, buffer);
        sealed?;
        self.send(&ChildRequest::Seal { op })?;
        let outcome = match self.wait(op)? {
            ChildEvent::Published { revision, .. } => Ok(revision),
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "at seal")),
        };
        // A write that failed may be over at the host already (its deadline aborted it): its
        // own error is the one to report, not the release's.
        let released = self.release(op);
        let revision = outcome?;
        released?;
        Ok(Ok(revision))
    }

    /// Publishes `bytes` at `path`.
    pub fn put(&mut self, path: &str, bytes: &[u8]) -> Result<Revision, ChildError> {
        let outcome = self.write_inner(path, bytes.len() as u64, false, false, |payload| {
            crate::arena::copy_split(payload, bytes);
            Ok::<(), std::convert::Infallible>(())
        })?;
        match outcome {
            Ok(revision) => Ok(revision),
            Err(never) => match never {},
        }
    }

    /// The mapped staging buffer behind `fd` (a buffer we already map if the host reused
    /// one), and its inode.
    fn buffer(&mut self, fd: OwnedFd, footprint: u64) -> Result<(u64, WriteBuffer), ChildError> {
        use std::os::unix::fs::MetadataExt;
        let file = fs::File::from(fd);
        let inode = file.metadata().map_err(protocol)?.ino();
        if let Some(i) = self
            .buffers
            .iter()
            .position(|(ino, b)| *ino == inode && b.len() as u64 >= footprint)
            && let Some((_, buffer)) = self.buffers.remove(i)
        {
            return Ok((inode, buffer));
        }
        let buffer = WriteBuffer::from_fd(file.into(), footprint)
            .map_err(|e| protocol(format!("the write buffer: {e}")))?;
        Ok((inode, buffer))
    }

    fn keep_buffer(&mut self, inode: u64, buffer: WriteBuffer) {
        self.buffers.retain(|(ino, _)| *ino != inode);
        self.buffers.push_back((inode, buffer));
        while self.buffers.len() > BUFFERS_KEPT {
            self.buffers.pop_front();
        }
    }

    /// Reads the blob at `path` into a fresh lease; the view maps it without copying.
    pub fn read(&mut self, path: &str) -> Result<BlobView<'_>, ChildError> {
        let op = self.op();
        self.send(&ChildRequest::OpenRead {
            op,
            path: path.to_owned(),
            expected_revision: None,
        })?;
        match self.wait(op)? {
            ChildEvent::ReadGranted {
                lease, revision, ..
            } => {
                let e = expected(&lease, lease.access);
                blob::validate(self.arena.as_slice(), &e, BlobState::Sealed, false)
                    .map_err(|error| protocol(format!("the granted lease is unusable: {error}")))?;
                Ok(BlobView {
                    session: self,
                    op,
                    expected: e,
                    revision,
                })
            }
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "at open")),
        }
    }

    /// What is at `path`.
    pub fn stat(&mut self, path: &str) -> Result<Stat, ChildError> {
        let op = self.op();
        self.send(&ChildRequest::Stat {
            op,
            path: path.to_owned(),
        })?;
        match self.wait(op)? {
            ChildEvent::Stat {
                kind,
                revision,
                length,
                lost,
                ..
            } => Ok(Stat {
                kind,
                revision,
                length,
                lost,
            }),
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "at stat")),
        }
    }

    /// Moves `from` to `to` (replacing what is there if `replace`).
    pub fn rename(&mut self, from: &str, to: &str, replace: bool) -> Result<Revision, ChildError> {
        let op = self.op();
        self.send(&ChildRequest::Move {
            op,
            from: from.to_owned(),
            to: to.to_owned(),
            replace,
        })?;
        self.done(op)
    }

    /// Publishes `file`, a file under the host's file root (`dataplane-node host --files`), at
    /// `path` as a file blob (issue 17): the host serves its bytes from the file, in every
    /// life of the host and the directory, and refuses to serve them once the file changed
    /// (readers fail [`DataPlaneError::SourceChanged`]). Nothing is copied into the arena.
    pub fn publish_file(&mut self, path: &str, file: &str) -> Result<Revision, ChildError> {
        let op = self.op();
        self.send(&ChildRequest::PublishFile {
            op,
            path: path.to_owned(),
            file: file.to_owned(),
        })?;
        match self.wait(op)? {
            ChildEvent::Published { revision, .. } => Ok(revision),
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "for a file publication")),
        }
    }

    /// Opens one side of the stream at `path` with this side's `descriptor` (opaque to the
    /// data plane: the peer receives it) and waits for the peer: up to `wait` (`None`: as long
    /// as it takes). Past `wait` the open is cancelled and [`ChildError::TimedOut`] returned
    /// (unless the match crossed the cancel). If this process dies while it waits, its host
    /// retracts the open; if it dies while the stream is matched, its host closes it.
    pub fn open_stream(
        &mut self,
        path: &str,
        role: StreamRole,
        descriptor: &[u8],
        how: StreamOpen,
        wait: Option<Duration>,
    ) -> Result<Stream, ChildError> {
        let descriptor = Descriptor::new(descriptor.to_vec()).map_err(|_| {
            ChildError::Failed(DataPlaneError::InvalidArgument(
                dataplane_core::error::Reason::new("the descriptor is too long"),
            ))
        })?;
        let op = self.op();
        self.send(&ChildRequest::OpenStream {
            op,
            path: path.to_owned(),
            role,
            descriptor,
            replace: how.replace,
            ensure: how.ensure,
            expected_revision: how.expected_revision,
        })?;
        let deadline = wait.and_then(|w| Instant::now().checked_add(w));
        let event = match self.wait_until(op, deadline) {
            Err(ChildError::TimedOut) => {
                self.send(&ChildRequest::Cancel { op })?;
                match self.wait(op)? {
                    // The match crossed the cancel: the stream is ours after all.
                    matched @ ChildEvent::StreamMatched { .. } => matched,
                    _ => return Err(ChildError::TimedOut),
                }
            }
            other => other?,
        };
        match event {
            ChildEvent::StreamMatched { matched, .. } => Ok(Stream { op, role, matched }),
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "for a stream open")),
        }
    }

    /// Whether the host told us `stream` was displaced (a replacing open took its place):
    /// it is over. Reads what the host sent meanwhile without waiting.
    pub fn displaced(&mut self, stream: &Stream) -> Result<bool, ChildError> {
        self.stream
            .set_nonblocking(true)
            .map_err(|e| protocol(e.to_string()))?;
        let mut result = Ok(());
        loop {
            match self.next_event() {
                Ok((ChildEvent::StreamDisplaced { op }, _)) => {
                    self.displaced.insert(op);
                }
                Ok((ChildEvent::Revoked | ChildEvent::Closed, _)) => {
                    result = Err(ChildError::Revoked);
                    break;
                }
                Ok(_) => {}
                Err(ChildError::TimedOut) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let _ = self.stream.set_nonblocking(false);
        result.map(|()| self.displaced.contains(&stream.op))
    }

    /// Ends `stream` at the directory (a displaced stream is over already: `Ok`).
    pub fn close_stream(&mut self, stream: Stream) -> Result<(), ChildError> {
        if self.displaced.remove(&stream.op) {
            return Ok(());
        }
        self.send(&ChildRequest::CloseStream { op: stream.op })?;
        match self.wait(stream.op)? {
            ChildEvent::StreamClosed { .. } | ChildEvent::StreamDisplaced { .. } => Ok(()),
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "at a stream close")),
        }
    }

    /// [`wait`](Self::wait) until `deadline` (`None`: for ever, whatever the call wait):
    /// [`ChildError::TimedOut`] past it.
    fn wait_until(
        &mut self,
        op: ChildOp,
        deadline: Option<Instant>,
    ) -> Result<ChildEvent, ChildError> {
        self.wait_with_fd_until(op, deadline)
            .map(|(event, _)| event)
    }

    /// Unlinks `path` (if it still has `expected_revision`, when given).
    pub fn remove(
        &mut self,
        path: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Revision, ChildError> {
        let op = self.op();
        self.send(&ChildRequest::Remove {
            op,
            path: path.to_owned(),
            expected_revision,
        })?;
        self.done(op)
    }

    fn done(&mut self, op: ChildOp) -> Result<Revision, ChildError> {
        match self.wait(op)? {
            ChildEvent::Done { revision, .. } => Ok(revision),
            ChildEvent::Failed { error, .. } => Err(ChildError::Failed(error)),
            other => Err(unexpected(&other, "for a move or remove")),
        }
    }

    /// Closes the session (published blobs stay); waits at most the call wait for the host's
    /// answer, like every call.
    pub fn close(mut self) -> Result<(), ChildError> {
        self.send(&ChildRequest::Close)?;
        let deadline = self.call_deadline();
        let result = loop {
            match self.next_event_by(deadline) {
                Ok((ChildEvent::Closed, _)) => break Ok(()),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        };
        let _ = self.stream.set_read_timeout(None);
        result
    }
}

fn expected(lease: &LeaseView, access: BlobAccess) -> Expected {
    Expected {
        offset: lease.offset,
        length: lease.length,
        generation: lease.generation,
        access,
        digest_kind: lease.digest,
    }
}

/// A read blob, mapped in the shared arena. Dropping it releases the lease.
#[derive(Debug)]
pub struct BlobView<'a> {
    session: &'a mut ChildSession,
    op: ChildOp,
    expected: Expected,
    revision: Revision,
}

impl BlobView<'_> {
    /// The blob's bytes (in place: nothing was copied to get them here).
    pub fn bytes(&self) -> &[u8] {
        blob::payload(self.session.arena.as_slice(), &self.expected).unwrap_or_default()
    }

    /// The revision that was read.
    pub fn revision(&self) -> Revision {
        self.revision
    }
}

impl Drop for BlobView<'_> {
    fn drop(&mut self) {
        let _ = self.session.release(self.op);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_host_that_closed_with_bytes_unread_is_gone_not_a_protocol_error() {
        // A host killed while a child's request sat unread in its socket: the child's next
        // read fails ECONNRESET.
        let (child, host) = UnixStream::pair().unwrap();
        (&child)
            .write_all(b"a request the host never read")
            .unwrap();
        drop(host);
        let mut inbox = Inbox::new(child.try_clone().unwrap());
        let got = inbox.next_frame::<ChildEvent>();
        assert!(matches!(got, Err(ChildError::Disconnected)), "{got:?}");
    }
}

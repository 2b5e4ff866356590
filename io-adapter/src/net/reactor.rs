//! The reactor: every socket of a node on one `mio` poll loop, run by the node's driver
//! thread. There is no thread per connection and no inbox between threads.
//!
//! **Why one loop.** The nodes used to start a reader and a writer thread per connection,
//! feeding the driver through an unbounded channel: 2,000 connections that said nothing cost
//! 4,000 threads, and a reader reserved the buffer a length prefix announced before anyone was
//! admitted (issue 11, item 4). A poll loop costs a few kilobytes per connection, gives the
//! driver back-pressure for free (a frame is read only when the driver asks for events), and
//! lets every connection have its own frame limit: a small one ([`HELLO_FRAME_BYTES_MAX`])
//! until the driver admits it. Reading, framing, writing and the driver's steps share one
//! thread; a node's work is dominated by its machines and its fsyncs, not by copying bytes.
//!
//! **Reading.** Each readable connection is read until the kernel has nothing more (for TCP, a
//! read that returns less than it asked for says so, unless the peer's close was reported:
//! readiness is edge-triggered, so bytes that arrive later raise a new event, and the read
//! that would only say `EAGAIN` is saved), or until it used its share of one poll ([`READ_BUDGET_BYTES`]; it is read again on the next poll
//! without waiting). Small frames are cut out of a per-connection buffer that never grows past
//! [`SCRATCH_BYTES`]; a large frame is read straight into a buffer of its exact size, which is
//! handed to the driver as the frame's payload. A length prefix above the connection's limit
//! closes the connection before anything is read or reserved for the frame.
//!
//! **Accepting.** A listener accepts at most [`ACCEPTS_PER_POLL`] connections per poll, after
//! the poll's reads; if the kernel holds more, the next poll does not wait and accepts the
//! next ones. So the frames of the connections accepted by one poll (a child's hello is sent
//! right after its connect) are read before the next ones are accepted: a burst of connections
//! larger than a node's waiting room for unadmitted connections is admitted a batch at a time
//! instead of filling the room at once and evicting connections whose hello was already
//! there. An `accept` that fails (out of descriptors) is tried again [`ACCEPT_RETRY`] later:
//! with edge-triggered readiness, the connections the kernel already holds would otherwise
//! wait for a new one to arrive, however many descriptors were freed meanwhile.
//!
//! **Writing.** [`Reactor::send`] encodes a value into the connection's queue at once and
//! writes as much as the socket takes; the rest goes out when the socket is writable again
//! (`writev`, chunk payloads from where they are: see [`super::Outgoing`]). Each queue has a
//! byte bound; what does not fit is dropped (peers: every protocol between nodes re-sends) or
//! closes the connection (children: a child that does not read its events is broken, and its
//! session closes on its behalf). All queues share one budget ([`SEND_BUDGET_BYTES`]): a frame
//! that would take them past it closes the connection whose queue is the longest (reported as
//! broken), until the frame fits. (Per-connection bounds alone let 32 hosts that asked the
//! directory questions and never read the answers hold 2 GiB of it.)
//!
//! **Closing.** A connection the driver closes is gone at once and reports nothing; one the
//! peer closes, or that breaks (an I/O error, a malformed prefix), is reported once as
//! [`NetEvent::Closed`] with the reason.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use dataplane_core::admission::HELLO_FRAME_BYTES_MAX;
use dataplane_core::limits::FRAME_BYTES_MAX;
use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token};

/// The token of the reactor's waker ([`Reactor::waker`]): connection and listener ids start
/// at 1.
const WAKE: Token = Token(0);

use crate::frame::LENGTH_PREFIX_BYTES;

use super::Outgoing;

/// The most bytes a reactor queues for all its connections together (see the module doc).
/// Room for 64 transfer windows of 4 MiB; a directory's replies are small.
pub const SEND_BUDGET_BYTES: usize = 256 << 20;

/// A connection's number (unique within a reactor, never reused).
pub type ConnId = u64;
/// A listener's number.
pub type ListenerId = u64;

/// Most bytes one connection is read per poll before the others get their turn.
pub const READ_BUDGET_BYTES: usize = 4 << 20;
/// Most frames one connection delivers per poll before the others get their turn. What a
/// driver does costs mostly per frame: 4 MiB of 6-byte questions is 700,000 frames, and 16
/// connections flooding so made everyone else wait for 11 million frames per poll (a host's
/// `get` timed out behind them on a loaded machine; `hostile.rs`).
pub const READ_FRAMES_MAX: usize = 1024;
/// The per-connection buffer small frames are cut from (it grows to this size only on demand).
pub const SCRATCH_BYTES: usize = 64 * 1024;
/// Most iovecs per `writev`.
const IOVECS_MAX: usize = 64;
/// Readiness events taken per poll.
const EVENTS_MAX: usize = 1024;
/// Most connections one listener accepts per poll ("Accepting" in the module documentation):
/// a quarter of the nodes' smallest waiting room (a host's 64 children before their hello).
pub const ACCEPTS_PER_POLL: usize = 16;
/// How long a listener whose `accept` failed (out of descriptors: `EMFILE`, `ENFILE`; out of
/// memory) waits before it tries again. Readiness is edge-triggered: without the retry, the
/// connections the kernel already holds would wait for a new connection to raise an event.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// A listener's failing `accept` is logged at most this often.
pub(crate) const ACCEPT_FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Who is at the other end of a connection, for the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remote {
    /// A TCP peer's address.
    Tcp(SocketAddr),
    /// A Unix-socket peer: the process and the user the kernel recorded when it connected.
    Process {
        /// Its process id.
        pid: i32,
        /// Its user id.
        uid: u32,
    },
    /// The kernel did not say.
    Unknown,
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Remote::Tcp(address) => write!(f, "{address}"),
            Remote::Process { pid, uid } => write!(f, "pid {pid} uid {uid}"),
            Remote::Unknown => f.write_str("an unknown peer"),
        }
    }
}

/// What the driver learns from a poll.
#[derive(Debug)]
pub enum NetEvent {
    /// A listener accepted a connection (with the listener's limits; pending admission).
    Accepted {
        /// The listener.
        listener: ListenerId,
        /// The new connection.
        conn: ConnId,
    },
    /// An outgoing connection ([`Reactor::connect`]) is established.
    Connected(ConnId),
    /// A whole frame's payload (without its length prefix).
    Frame(ConnId, Vec<u8>),
    /// The peer closed the connection, or it broke; the reason is for logs.
    Closed(ConnId, String),
    /// An outgoing connection ([`Reactor::connect`]) was refused: nothing listens at the
    /// address (`ECONNREFUSED`). Closed, as for [`NetEvent::Closed`]; a refusal is an answer
    /// (the process there is not running), where a connection that breaks or times out is not.
    Refused(ConnId, String),
}

/// What happens to a frame that does not fit a connection's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// It is dropped (the protocols between nodes re-send).
    Drop,
    /// The connection is closed (and reported closed).
    Close,
}

/// A connection's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest frame payload the peer may send.
    pub frame_bytes: usize,
    /// The most bytes queued for the peer.
    pub queue_bytes: usize,
    /// What a frame that does not fit the queue does.
    pub overflow: Overflow,
    /// Deliver one frame, then wait for the driver's [`Reactor::resume`] or
    /// [`Reactor::set_limits`]: a connection in its handshake, whose limits change with the
    /// frame just delivered, so the next one must not be cut with the old limits.
    pub pace: bool,
}

impl Limits {
    /// A connection nobody admitted yet: hello-sized frames, a small queue.
    pub const fn pending() -> Limits {
        Limits {
            frame_bytes: HELLO_FRAME_BYTES_MAX,
            queue_bytes: 64 * 1024,
            overflow: Overflow::Close,
            pace: true,
        }
    }

    /// An admitted node: whole frames, room for a transfer window of chunks.
    pub const fn peer() -> Limits {
        Limits {
            frame_bytes: FRAME_BYTES_MAX,
            queue_bytes: 64 << 20,
            overflow: Overflow::Drop,
            pace: false,
        }
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
}

enum Listener {
    Tcp(TcpListener, Limits),
    Unix(UnixListener, Limits),
}

/// One piece of a connection's queue.
enum Piece {
    /// Bytes, of which `at` were written.
    Bytes { bytes: Vec<u8>, at: usize },
    /// Bytes that travel with a descriptor (`SCM_RIGHTS`, Unix sockets only): the descriptor
    /// goes with the first `sendmsg`, the rest as plain bytes.
    WithFd { bytes: Vec<u8>, fd: OwnedFd },
}

impl Piece {
    fn remaining(&self) -> usize {
        match self {
            Piece::Bytes { bytes, at } => bytes.len() - at,
            Piece::WithFd { bytes, .. } => bytes.len(),
        }
    }
}

struct Conn {
    stream: Stream,
    /// Who is at the other end.
    remote: Remote,
    limits: Limits,
    /// Bytes read and not yet framed: `scratch[start..end]`.
    scratch: Vec<u8>,
    start: usize,
    end: usize,
    /// A large frame being read in place: its buffer (payload only) and how much is filled.
    big: Option<(Vec<u8>, usize)>,
    queue: VecDeque<Piece>,
    queued: usize,
    connecting: bool,
    /// The socket may have more to read (edge-triggered readiness).
    readable: bool,
    /// A poll reported the peer's close or an error: read until `EOF` or `EAGAIN`, never
    /// stop at a short read.
    hup: bool,
    /// Close once the queue is written (the driver is done with it).
    closing: bool,
    /// Bytes received before the reactor had the connection (see [`Reactor::adopt_tcp`]).
    pending_input: Vec<u8>,
    /// A paced connection delivered a frame; the next waits for the driver.
    paused: bool,
}

/// The poll loop. See the module documentation.
pub struct Reactor {
    poll: Poll,
    events: Events,
    listeners: BTreeMap<ListenerId, Listener>,
    conns: BTreeMap<ConnId, Conn>,
    next: u64,
    /// Connections with bytes left to read after their budget ran out.
    behind: Vec<ConnId>,
    /// Connections that broke while the driver sent to them: reported by the next poll.
    broken: Vec<(ConnId, String)>,
    /// Listeners that used their accepts of one poll with connections left to accept.
    listeners_behind: Vec<ListenerId>,
    /// Listeners whose `accept` failed, and when each tries again ([`ACCEPT_RETRY`]).
    listeners_stalled: Vec<(ListenerId, std::time::Instant)>,
    /// Per listener whose `accept` failed: when that was last logged, and the failures since
    /// (logged at most every [`ACCEPT_FAILURE_LOG_EVERY`]).
    accept_failures: BTreeMap<ListenerId, crate::throttle::Throttle>,
    /// Bytes queued for all connections, and the most there may be.
    queued: usize,
    send_budget: usize,
    /// The waker handed out by [`Reactor::waker`], once asked for.
    waker: Option<std::sync::Arc<mio::Waker>>,
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("listeners", &self.listeners.len())
            .field("conns", &self.conns.len())
            .finish()
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Reactor {
    /// An empty reactor.
    pub fn new() -> io::Result<Reactor> {
        Ok(Reactor {
            poll: Poll::new()?,
            events: Events::with_capacity(EVENTS_MAX),
            listeners: BTreeMap::new(),
            conns: BTreeMap::new(),
            next: 1,
            behind: Vec::new(),
            broken: Vec::new(),
            listeners_behind: Vec::new(),
            listeners_stalled: Vec::new(),
            accept_failures: BTreeMap::new(),
            queued: 0,
            send_budget: SEND_BUDGET_BYTES,
            waker: None,
        })
    }

    /// A waker for this reactor's [`Self::poll`] (threads that hand the driver work call it;
    /// the poll then returns). Every call hands out the same one (`mio` allows one per poll).
    pub fn waker(&mut self) -> io::Result<std::sync::Arc<mio::Waker>> {
        if let Some(waker) = &self.waker {
            return Ok(waker.clone());
        }
        let waker = std::sync::Arc::new(mio::Waker::new(self.poll.registry(), WAKE)?);
        self.waker = Some(waker.clone());
        Ok(waker)
    }

    /// Sets the budget of bytes queued for all connections together (by default
    /// [`SEND_BUDGET_BYTES`]).
    pub fn set_send_budget(&mut self, bytes: usize) {
        self.send_budget = bytes;
    }

    /// Bytes queued for all connections.
    pub fn queued_total(&self) -> usize {
        self.queued
    }

    fn allocate(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// Listens on `listener` (already bound); accepted connections get `limits`.
    pub fn listen_tcp(
        &mut self,
        listener: std::net::TcpListener,
        limits: Limits,
    ) -> io::Result<ListenerId> {
        listener.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(listener);
        let id = self.allocate();
        self.poll
            .registry()
            .register(&mut listener, Token(id as usize), Interest::READABLE)?;
        self.listeners.insert(id, Listener::Tcp(listener, limits));
        Ok(id)
    }

    /// Listens on the Unix socket `listener` (already bound).
    pub fn listen_unix(
        &mut self,
        listener: std::os::unix::net::UnixListener,
        limits: Limits,
    ) -> io::Result<ListenerId> {
        listener.set_nonblocking(true)?;
        let mut listener = UnixListener::from_std(listener);
        let id = self.allocate();
        self.poll
            .registry()
            .register(&mut listener, Token(id as usize), Interest::READABLE)?;
        self.listeners.insert(id, Listener::Unix(listener, limits));
        Ok(id)
    }

    fn add(
        &mut self,
        mut stream: Stream,
        remote: Remote,
        limits: Limits,
        connecting: bool,
    ) -> io::Result<ConnId> {
        let id = self.allocate();
        self.poll.registry().register(
            stream.source(),
            Token(id as usize),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.conns.insert(
            id,
            Conn {
                stream,
                remote,
                limits,
                scratch: Vec::new(),
                start: 0,
                end: 0,
                big: None,
                queue: VecDeque::new(),
                queued: 0,
                connecting,
                readable: false,
                hup: false,
                closing: false,
                pending_input: Vec::new(),
                paused: false,
            },
        );
        Ok(id)
    }

    /// Starts connecting to `address` without waiting; [`NetEvent::Connected`] or
    /// [`NetEvent::Closed`] follows. Frames may be queued meanwhile.
    pub fn connect(&mut self, address: SocketAddr, limits: Limits) -> io::Result<ConnId> {
        let stream = TcpStream::connect(address)?;
        let _ = stream.set_nodelay(true);
        self.add(Stream::Tcp(stream), Remote::Tcp(address), limits, true)
    }

    /// Adopts an established TCP connection (made elsewhere, e.g. by a blocking first
    /// handshake). `received` are bytes already read from it and not yet framed: they are
    /// framed first, on the next poll.
    pub fn adopt_tcp(
        &mut self,
        stream: std::net::TcpStream,
        limits: Limits,
        received: Vec<u8>,
    ) -> io::Result<ConnId> {
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        let remote = stream.peer_addr().map_or(Remote::Unknown, Remote::Tcp);
        let id = self.add(
            Stream::Tcp(TcpStream::from_std(stream)),
            remote,
            limits,
            false,
        )?;
        if !received.is_empty()
            && let Some(c) = self.conns.get_mut(&id)
        {
            c.pending_input = received;
            c.readable = true;
            self.behind.push(id);
        }
        Ok(id)
    }

    /// Changes a connection's bounds (the driver admitted it, say), and lets it deliver its
    /// next frame if it was paced.
    pub fn set_limits(&mut self, conn: ConnId, limits: Limits) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.limits = limits;
        }
        self.resume(conn);
    }

    /// Whether `conn` is open.
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| !c.closing)
    }

    /// Who is at the other end of `conn` (while it is open).
    pub fn remote(&self, conn: ConnId) -> Remote {
        self.conns.get(&conn).map_or(Remote::Unknown, |c| c.remote)
    }

    /// Open connections.
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// Bytes queued for `conn`.
    pub fn queued_bytes(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.queued)
    }

    /// Queues one frame holding `value` and writes what the socket takes. Returns false if it
    /// was dropped (unknown or closing connection, unencodable value, or a full queue: then
    /// the connection is closed too if its limits say so).
    pub fn send<W: Outgoing>(&mut self, conn: ConnId, value: W) -> bool {
        let mut bytes = Vec::new();
        let tail = super::encode_with_tail(value, &mut bytes);
        if bytes.is_empty() {
            return false;
        }
        let mut pieces = vec![Piece::Bytes { bytes, at: 0 }];
        if let Some(tail) = tail {
            pieces.push(Piece::Bytes { bytes: tail, at: 0 });
        }
        self.enqueue(conn, pieces)
    }

    /// Queues one frame holding `value` with `fd` attached (Unix connections only).
    pub fn send_with_fd<W: Outgoing>(
        &mut self,
        conn: ConnId,
        value: W,
        fd: BorrowedFd<'_>,
    ) -> bool {
        let mut bytes = Vec::new();
        if crate::frame::encode_frame(&value, &mut bytes).is_err() {
            return false;
        }
        let Ok(fd) = fd.try_clone_to_owned() else {
            return false;
        };
        if !matches!(
            self.conns.get(&conn).map(|c| &c.stream),
            Some(Stream::Unix(_))
        ) {
            return false;
        }
        self.enqueue(conn, vec![Piece::WithFd { bytes, fd }])
    }

    fn enqueue(&mut self, conn: ConnId, pieces: Vec<Piece>) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        if c.closing {
            return false;
        }
        let len: usize = pieces.iter().map(Piece::remaining).sum();
        if c.queued + len > c.limits.queue_bytes {
            if c.limits.overflow == Overflow::Close {
                self.drop_conn(conn);
                self.broken
                    .push((conn, "the peer does not read what is sent to it".to_owned()));
            }
            return false;
        }
        if !self.make_room(conn, len) {
            return false;
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        c.queued += len;
        self.queued += len;
        c.queue.extend(pieces);
        if !c.connecting
            && let Err(e) = flush(c, &mut self.queued)
        {
            self.drop_conn(conn);
            self.broken.push((conn, format!("write: {e}")));
            return false;
        }
        true
    }

    /// Closes the connections with the longest queues until `len` more bytes fit the send
    /// budget; false if they do not fit even so, or if `conn` itself was closed.
    fn make_room(&mut self, conn: ConnId, len: usize) -> bool {
        while self.queued + len > self.send_budget {
            let Some((&longest, queued, closing)) = self
                .conns
                .iter()
                .map(|(id, c)| (id, c.queued, c.closing))
                .max_by_key(|&(_, queued, _)| queued)
                .filter(|&(_, queued, _)| queued > 0)
            else {
                return false;
            };
            self.drop_conn(longest);
            if closing {
                // The driver let go of it already (`close_after_flush`): nothing to report.
                continue;
            }
            self.broken.push((
                longest,
                format!(
                    "the peer does not read what is sent to it: the node's send budget of {} \
                     MiB is spent and its {queued} queued bytes were the most",
                    self.send_budget >> 20
                ),
            ));
            if longest == conn {
                return false;
            }
        }
        true
    }

    /// Closes `conn` at once (queued bytes are dropped). Nothing is reported.
    pub fn close(&mut self, conn: ConnId) {
        self.drop_conn(conn);
    }

    /// Closes `conn` once its queue is written (e.g. after a refusal). Nothing is reported;
    /// the connection counts as gone for [`Reactor::is_open`] at once.
    pub fn close_after_flush(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.closing = true;
        if c.queue.is_empty() || c.connecting {
            self.drop_conn(conn);
        }
    }

    fn drop_conn(&mut self, conn: ConnId) {
        if let Some(mut c) = self.conns.remove(&conn) {
            self.queued -= c.queued;
            let _ = self.poll.registry().deregister(c.stream.source());
        }
    }

    /// Waits up to `timeout` (not at all if a connection still has bytes to read) and appends
    /// what happened to `out`.
    pub fn poll(&mut self, timeout: Option<Duration>, out: &mut Vec<NetEvent>) -> io::Result<()> {
        let timeout =
            if self.behind.is_empty() && self.broken.is_empty() && self.listeners_behind.is_empty()
            {
                timeout
            } else {
                Some(Duration::ZERO)
            };
        // A stalled listener's retry bounds the wait (no clock read while none is stalled).
        let timeout = match self.listeners_stalled.iter().map(|(_, at)| *at).min() {
            Some(at) => {
                let left = at.saturating_duration_since(std::time::Instant::now());
                Some(timeout.map_or(left, |t| t.min(left)))
            }
            None => timeout,
        };
        for (conn, reason) in self.broken.drain(..) {
            out.push(NetEvent::Closed(conn, reason));
        }
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        let mut ready: Vec<(u64, bool, bool, bool)> = self
            .events
            .iter()
            .filter(|e| e.token() != WAKE)
            .map(|e| {
                (
                    e.token().0 as u64,
                    e.is_readable() || e.is_read_closed() || e.is_error(),
                    e.is_writable() || e.is_error(),
                    e.is_read_closed() || e.is_error(),
                )
            })
            .collect();
        for conn in std::mem::take(&mut self.behind) {
            ready.push((conn, true, false, false));
        }
        // The listeners go last: this poll's frames first, then the next connections.
        let mut accepting = std::mem::take(&mut self.listeners_behind);
        if !self.listeners_stalled.is_empty() {
            let now = std::time::Instant::now();
            self.listeners_stalled.retain(|&(listener, at)| {
                if at <= now && !accepting.contains(&listener) {
                    accepting.push(listener);
                }
                at > now
            });
        }
        for (id, readable, writable, hup) in ready {
            if self.listeners.contains_key(&id) {
                if !accepting.contains(&id) {
                    accepting.push(id);
                }
                continue;
            }
            if writable {
                self.writable(id, out);
            }
            if readable && let Some(c) = self.conns.get_mut(&id) {
                c.readable = true;
                c.hup |= hup;
            }
            self.read(id, out);
        }
        for listener in accepting {
            self.accept(listener, out);
        }
        Ok(())
    }

    /// Accepts up to [`ACCEPTS_PER_POLL`] connections on `listener`; if there may be more, the
    /// listener is behind and the next poll accepts again without waiting (readiness is
    /// edge-triggered: no new event would come for connections the kernel already holds).
    fn accept(&mut self, listener: ListenerId, out: &mut Vec<NetEvent>) {
        for _ in 0..ACCEPTS_PER_POLL {
            let accepted = match self.listeners.get(&listener) {
                Some(Listener::Tcp(l, limits)) => l.accept().map(|(s, address)| {
                    let _ = s.set_nodelay(true);
                    (Stream::Tcp(s), Remote::Tcp(address), *limits)
                }),
                Some(Listener::Unix(l, limits)) => l.accept().map(|(s, _)| {
                    let remote = crate::sys::peer_credentials(s.as_fd())
                        .map_or(Remote::Unknown, |(pid, uid)| Remote::Process { pid, uid });
                    (Stream::Unix(s), remote, *limits)
                }),
                None => return,
            };
            let (stream, remote, limits) = match accepted {
                Ok(accepted) => accepted,
                Err(e) if would_block(&e) => return,
                Err(e) => {
                    // EMFILE and the like: try again a little later (see `ACCEPT_RETRY`).
                    let now = std::time::Instant::now();
                    let throttle = self.accept_failures.entry(listener).or_default();
                    if let Some(since) = throttle.occur(now, ACCEPT_FAILURE_LOG_EVERY) {
                        tracing::warn!(
                            listener,
                            error = %e,
                            failures_since_last_logged = since,
                            "accept failed; trying again every {ACCEPT_RETRY:?}"
                        );
                    }
                    if !self.listeners_stalled.iter().any(|(l, _)| *l == listener) {
                        let at = std::time::Instant::now() + ACCEPT_RETRY;
                        self.listeners_stalled.push((listener, at));
                    }
                    return;
                }
            };
            match self.add(stream, remote, limits, false) {
                Ok(conn) => out.push(NetEvent::Accepted { listener, conn }),
                Err(e) => {
                    tracing::warn!(listener, error = %e, "cannot poll an accepted connection");
                }
            }
        }
        self.listeners_behind.push(listener);
    }

    fn writable(&mut self, id: ConnId, out: &mut Vec<NetEvent>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.connecting {
            let failed = match &c.stream {
                Stream::Tcp(s) => match s.take_error() {
                    Ok(Some(e)) | Err(e) => Some(e),
                    Ok(None) => match s.peer_addr() {
                        Ok(_) => None,
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                        Err(e) => Some(e),
                    },
                },
                Stream::Unix(_) => None,
            };
            if let Some(e) = failed {
                self.drop_conn(id);
                let reason = format!("connect: {e}");
                out.push(if e.kind() == io::ErrorKind::ConnectionRefused {
                    NetEvent::Refused(id, reason)
                } else {
                    NetEvent::Closed(id, reason)
                });
                return;
            }
            c.connecting = false;
            out.push(NetEvent::Connected(id));
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match flush(c, &mut self.queued) {
            Ok(()) => {
                if c.closing && c.queue.is_empty() {
                    self.drop_conn(id);
                }
            }
            Err(e) => {
                let closing = c.closing;
                self.drop_conn(id);
                if !closing {
                    out.push(NetEvent::Closed(id, format!("write: {e}")));
                }
            }
        }
    }

    fn read(&mut self, id: ConnId, out: &mut Vec<NetEvent>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.connecting {
            return;
        }
        let mut budget = READ_BUDGET_BYTES;
        let mut frames = READ_FRAMES_MAX;
        let outcome = loop {
            if let Err(e) = cut_frames(c, id, out, &mut frames) {
                break Err(e);
            }
            if frames == 0 {
                // Frames may wait in the buffer: the next poll cuts them first.
                self.behind.push(id);
                break Ok(());
            }
            if c.paused || !c.readable {
                break Ok(());
            }
            if budget == 0 {
                self.behind.push(id);
                break Ok(());
            }
            match fill(c, budget, id, out) {
                Ok((0, _)) => break Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into())),
                Ok((n, short)) => {
                    budget = budget.saturating_sub(n);
                    // Drained (see the module documentation). Unix sockets are read to
                    // `EAGAIN`: a read stops short at a message that carries descriptors.
                    if short && !c.hup && matches!(c.stream, Stream::Tcp(_)) {
                        c.readable = false;
                    }
                }
                Err(e) if would_block(&e) => c.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(ReadError::Io(e)),
            }
        };
        if let Err(error) = outcome {
            let reason = match error {
                ReadError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    "closed by the peer".to_owned()
                }
                ReadError::Io(e) => e.to_string(),
                ReadError::TooLarge { len, max } => {
                    format!("frame payload of {len} bytes announced, the limit is {max}")
                }
            };
            let closing = c.closing;
            self.drop_conn(id);
            if !closing {
                out.push(NetEvent::Closed(id, reason));
            }
        }
    }

    /// Lets a paced connection deliver its next frame (the driver decided on the last one).
    pub fn resume(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn)
            && c.paused
        {
            c.paused = false;
            self.behind.push(conn);
        }
    }

    /// Checks the reactor's bookkeeping (for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        let queued: usize = self.conns.values().map(|c| c.queued).sum();
        if queued != self.queued {
            return Err(format!(
                "{} bytes counted as queued; the connections hold {queued}",
                self.queued
            ));
        }
        if self.queued > self.send_budget {
            return Err(format!(
                "{} bytes queued, over the budget of {}",
                self.queued, self.send_budget
            ));
        }
        for (id, c) in &self.conns {
            let queued: usize = c.queue.iter().map(Piece::remaining).sum();
            if queued != c.queued {
                return Err(format!(
                    "conn {id}: {} queued, pieces hold {queued}",
                    c.queued
                ));
            }
            if c.queued > c.limits.queue_bytes {
                return Err(format!("conn {id}: queue over its bound"));
            }
            if c.scratch.len() > SCRATCH_BYTES.max(LENGTH_PREFIX_BYTES) {
                return Err(format!("conn {id}: scratch of {} bytes", c.scratch.len()));
            }
        }
        Ok(())
    }
}

enum ReadError {
    Io(io::Error),
    TooLarge { len: usize, max: usize },
}

/// Hands out the whole frames in the scratch buffer (one only, then pauses, if the
/// connection is paced).
fn cut_frames(
    c: &mut Conn,
    id: ConnId,
    out: &mut Vec<NetEvent>,
    frames: &mut usize,
) -> Result<(), ReadError> {
    while !c.paused && *frames > 0 && c.end - c.start >= LENGTH_PREFIX_BYTES {
        let p = &c.scratch[c.start..c.start + LENGTH_PREFIX_BYTES];
        let len = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
        if len > c.limits.frame_bytes {
            return Err(ReadError::TooLarge {
                len,
                max: c.limits.frame_bytes,
            });
        }
        let have = c.end - c.start - LENGTH_PREFIX_BYTES;
        let body = c.start + LENGTH_PREFIX_BYTES;
        if have >= len {
            out.push(NetEvent::Frame(id, c.scratch[body..body + len].to_vec()));
            c.start = body + len;
            *frames -= 1;
            // A paced connection's next frame waits for the driver's verdict on this one
            // (its limits may change with it).
            c.paused = c.limits.pace;
            continue;
        }
        let cap = (c.limits.frame_bytes + LENGTH_PREFIX_BYTES).min(SCRATCH_BYTES);
        if len + LENGTH_PREFIX_BYTES > cap {
            // Too large for the scratch buffer: read the rest straight into its own buffer.
            let mut frame = vec![0u8; len];
            frame[..have].copy_from_slice(&c.scratch[body..c.end]);
            c.big = Some((frame, have));
            c.start = 0;
            c.end = 0;
        }
        break;
    }
    if c.start == c.end {
        c.start = 0;
        c.end = 0;
        if c.scratch.len() > 4 * 1024 {
            // An idle connection gives its buffer back.
            c.scratch = Vec::new();
        }
    }
    Ok(())
}

/// One read into the connection: a large frame's own buffer, or the scratch buffer. Returns
/// the bytes read (0: end of stream).
/// Reads what the connection's buffer (or its large frame) has room for: the bytes read,
/// and whether they came from the socket and were fewer than asked for (the socket had no
/// more at that moment).
fn fill(
    c: &mut Conn,
    budget: usize,
    id: ConnId,
    out: &mut Vec<NetEvent>,
) -> io::Result<(usize, bool)> {
    let from_socket = c.pending_input.is_empty();
    if let Some((frame, filled)) = &mut c.big {
        let want = (frame.len() - *filled).min(budget.max(1));
        let n = take_input(
            &mut c.stream,
            &mut c.pending_input,
            &mut frame[*filled..*filled + want],
        )?;
        let short = from_socket && n < want;
        *filled += n;
        if *filled == frame.len()
            && let Some((frame, _)) = c.big.take()
        {
            out.push(NetEvent::Frame(id, frame));
            c.paused = c.limits.pace;
        }
        return Ok((n, short));
    }
    // Room in the scratch buffer: compact, then grow up to what a frame of the limit needs.
    if c.start > 0 {
        c.scratch.copy_within(c.start..c.end, 0);
        c.end -= c.start;
        c.start = 0;
    }
    let cap = (c.limits.frame_bytes + LENGTH_PREFIX_BYTES).min(SCRATCH_BYTES);
    if c.scratch.len() < cap {
        let grow = (c.scratch.len() * 2).clamp(512, cap);
        c.scratch.resize(grow.max(c.end + 1).min(cap), 0);
    }
    let room = (c.scratch.len() - c.end).min(budget.max(1));
    if room == 0 {
        // Only an unfinished frame longer than the buffer could fill it, and those are read
        // into their own buffer.
        return Err(io::Error::other("frame buffer full"));
    }
    let n = take_input(
        &mut c.stream,
        &mut c.pending_input,
        &mut c.scratch[c.end..c.end + room],
    )?;
    c.end += n;
    Ok((n, from_socket && n < room))
}

/// Fills `buf` from bytes received before the reactor had the connection, else from the
/// socket.
fn take_input(stream: &mut Stream, pending: &mut Vec<u8>, buf: &mut [u8]) -> io::Result<usize> {
    if pending.is_empty() {
        return stream.read(buf);
    }
    let n = buf.len().min(pending.len());
    buf[..n].copy_from_slice(&pending[..n]);
    pending.drain(..n);
    Ok(n)
}

/// Writes the queue until it is empty or the socket would block; what is written comes off
/// `total`, the node's count of queued bytes, too.
fn flush(c: &mut Conn, total: &mut usize) -> io::Result<()> {
    while let Some(front) = c.queue.front() {
        if let Piece::WithFd { .. } = front {
            let Some(Piece::WithFd { bytes, fd }) = c.queue.pop_front() else {
                unreachable!("the front was a WithFd piece");
            };
            let sent = match crate::arena::sendmsg_with_fd(c.stream.raw_fd(), &bytes, fd.as_fd()) {
                Ok(n) => n,
                Err(e) if would_block(&e) => {
                    c.queue.push_front(Piece::WithFd { bytes, fd });
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            c.queued -= sent;
            *total -= sent;
            if sent < bytes.len() {
                c.queue.push_front(Piece::Bytes { bytes, at: sent });
            }
            continue;
        }
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(IOVECS_MAX);
        for piece in c.queue.iter().take(IOVECS_MAX) {
            match piece {
                Piece::Bytes { bytes, at } => slices.push(IoSlice::new(&bytes[*at..])),
                Piece::WithFd { .. } => break,
            }
        }
        let written = match c.stream.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if would_block(&e) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        c.queued -= written;
        *total -= written;
        let mut left = written;
        while left > 0 {
            let Some(Piece::Bytes { bytes, at }) = c.queue.front_mut() else {
                break;
            };
            let here = (bytes.len() - *at).min(left);
            *at += here;
            left -= here;
            if *at == bytes.len() {
                c.queue.pop_front();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Link;
    use dataplane_core::ids::{Address, NodeId};
    use dataplane_core::wire::{ChunkBytes, Envelope, Message};

    fn pair(reactor: &mut Reactor, limits: Limits) -> (ConnId, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let id = reactor.connect(address, limits).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        let mut events = Vec::new();
        while !events
            .iter()
            .any(|e| matches!(e, NetEvent::Connected(c) if *c == id))
        {
            reactor
                .poll(Some(Duration::from_millis(100)), &mut events)
                .unwrap();
        }
        (id, theirs)
    }

    fn frames_until(reactor: &mut Reactor, n: usize) -> Vec<NetEvent> {
        let mut events = Vec::new();
        for _ in 0..200 {
            reactor
                .poll(Some(Duration::from_millis(20)), &mut events)
                .unwrap();
            if events.len() >= n {
                break;
            }
        }
        events
    }

    #[test]
    fn small_and_large_frames_arrive_whole_and_in_order() {
        let mut reactor = Reactor::new().unwrap();
        let (id, mut theirs) = pair(&mut reactor, Limits::peer());
        let mut bytes = Vec::new();
        for len in [0usize, 1, 100, 70_000, 3, 1 << 20] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            bytes.extend_from_slice(&(len as u32).to_le_bytes());
            bytes.extend_from_slice(&payload);
        }
        // Dribbled in odd pieces.
        for piece in bytes.chunks(7_777) {
            theirs.write_all(piece).unwrap();
        }
        let events = frames_until(&mut reactor, 6);
        let lens: Vec<usize> = events
            .iter()
            .map(|e| match e {
                NetEvent::Frame(c, f) if *c == id => f.len(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(lens, vec![0, 1, 100, 70_000, 3, 1 << 20]);
        for e in &events {
            if let NetEvent::Frame(_, f) = e {
                let len = f.len();
                assert!(f.iter().enumerate().all(|(i, b)| *b == (i * 7 + len) as u8));
            }
        }
        reactor.check_invariants().unwrap();
    }

    /// A connection flooding tiny frames delivers at most `READ_FRAMES_MAX` per poll, so a
    /// quiet connection's frame is not kept waiting behind all of them; every frame arrives,
    /// in order.
    #[test]
    fn a_flood_of_small_frames_takes_turns_with_the_others() {
        let mut reactor = Reactor::new().unwrap();
        let (flood, mut flooder) = pair(&mut reactor, Limits::peer());
        let (quiet, mut speaker) = pair(&mut reactor, Limits::peer());
        const FRAMES: usize = 5 * READ_FRAMES_MAX + 7;
        let mut bytes = Vec::new();
        for i in 0..FRAMES {
            bytes.extend_from_slice(&2u32.to_le_bytes());
            bytes.extend_from_slice(&(i as u16).to_le_bytes());
        }
        flooder.write_all(&bytes).unwrap();
        speaker.write_all(&[1, 0, 0, 0, 42]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut flooded = Vec::new();
        let mut polls = 0;
        let mut quiet_after = None;
        while flooded.len() < FRAMES && polls < 1000 {
            let mut events = Vec::new();
            reactor
                .poll(Some(Duration::from_millis(20)), &mut events)
                .unwrap();
            polls += 1;
            let mut this_poll = 0;
            for e in events {
                match e {
                    NetEvent::Frame(c, f) if c == flood => {
                        flooded.push(u16::from_le_bytes([f[0], f[1]]) as usize);
                        this_poll += 1;
                    }
                    NetEvent::Frame(c, f) if c == quiet => {
                        assert_eq!(f, vec![42]);
                        quiet_after.get_or_insert(flooded.len());
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert!(
                this_poll <= READ_FRAMES_MAX,
                "{this_poll} frames in one poll"
            );
        }
        assert_eq!(flooded, (0..FRAMES).collect::<Vec<_>>());
        let waited = quiet_after.expect("the quiet frame arrived");
        assert!(
            waited <= READ_FRAMES_MAX,
            "it waited for {waited} flood frames"
        );
        reactor.check_invariants().unwrap();
    }

    #[test]
    fn a_prefix_over_the_limit_closes_before_anything_is_reserved() {
        let mut reactor = Reactor::new().unwrap();
        let (id, mut theirs) = pair(&mut reactor, Limits::pending());
        theirs.write_all(&(1u32 << 20).to_le_bytes()).unwrap();
        let events = frames_until(&mut reactor, 1);
        assert!(
            matches!(&events[..], [NetEvent::Closed(c, reason)] if *c == id && reason.contains("limit")),
            "{events:?}"
        );
        assert_eq!(reactor.conn_count(), 0);
        let mut buf = [0u8; 1];
        theirs
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(
            theirs.read(&mut buf).unwrap_or(0),
            0,
            "our side sees the end"
        );
    }

    #[test]
    fn sent_frames_with_tails_are_the_encoded_bytes() {
        let mut reactor = Reactor::new().unwrap();
        let (id, theirs) = pair(&mut reactor, Limits::peer());
        let chunk = |len: usize| {
            Link::Frame(Envelope {
                from: Address::new(NodeId(1), 1, 1),
                to: Address::new(NodeId(2), 1, 1),
                message: Message::Chunk {
                    offset: 0,
                    total: len as u64,
                    digest: None,
                    bytes: ChunkBytes::new(vec![5; len]).unwrap(),
                },
            })
        };
        let values: Vec<Link> = [10usize, 100_000, 262_144, 3]
            .iter()
            .map(|l| chunk(*l))
            .collect();
        for v in &values {
            assert!(reactor.send(id, v.clone()));
        }
        let reader = std::thread::spawn(move || {
            let mut r = crate::frame::FrameReader::new(theirs);
            (0..4)
                .map(|_| r.read_frame::<Link>().unwrap().unwrap())
                .collect::<Vec<_>>()
        });
        let mut events = Vec::new();
        while reactor.queued_bytes(id) > 0 {
            reactor
                .poll(Some(Duration::from_millis(20)), &mut events)
                .unwrap();
        }
        assert_eq!(reader.join().unwrap(), values);
        reactor.check_invariants().unwrap();
    }

    #[test]
    fn a_full_queue_drops_or_closes_as_its_limits_say() {
        let mut reactor = Reactor::new().unwrap();
        let small = Limits {
            frame_bytes: 1024,
            queue_bytes: 3_000_000,
            overflow: Overflow::Drop,
            pace: false,
        };
        let (id, _theirs) = pair(&mut reactor, small);
        let big = Link::Refused {
            reason: "x".repeat(100_000),
        };
        // Nobody reads: the socket buffers fill, then the queue, then frames are dropped.
        let mut sent = 0;
        while reactor.send(id, big.clone()) {
            sent += 1;
            assert!(sent < 10_000, "the queue never filled");
        }
        assert!(reactor.is_open(id), "Drop keeps the connection");
        reactor.set_limits(
            id,
            Limits {
                overflow: Overflow::Close,
                ..small
            },
        );
        assert!(!reactor.send(id, big));
        assert!(!reactor.is_open(id), "Close closes it");
        let mut events = Vec::new();
        reactor.poll(Some(Duration::ZERO), &mut events).unwrap();
        assert!(
            matches!(&events[..], [NetEvent::Closed(c, _)] if *c == id),
            "and reports it: {events:?}"
        );
    }

    /// A connection the driver let go of (`close_after_flush`) but that still holds bytes
    /// makes room like any other, and is not reported: the driver forgot it already.
    #[test]
    fn a_connection_let_go_makes_room_without_a_report() {
        const BUDGET: usize = 4 << 20;
        let mut reactor = Reactor::new().unwrap();
        reactor.set_send_budget(BUDGET);
        let (a, _ta) = pair(&mut reactor, Limits::peer());
        let (b, _tb) = pair(&mut reactor, Limits::peer());
        let big = Link::Refused {
            reason: "x".repeat(100_000),
        };
        while reactor.queued_total() + 100_100 <= BUDGET {
            assert!(reactor.send(a, big.clone()));
        }
        assert!(reactor.queued_bytes(a) > 0);
        reactor.close_after_flush(a);
        assert!(!reactor.is_open(a));
        for _ in 0..10 {
            assert!(reactor.send(b, big.clone()));
        }
        let mut events = Vec::new();
        reactor.poll(Some(Duration::ZERO), &mut events).unwrap();
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, NetEvent::Closed(id, _) if *id == a)),
            "{events:?}"
        );
        assert_eq!(reactor.queued_bytes(a), 0);
        reactor.check_invariants().unwrap();
    }

    #[test]
    fn queues_share_one_budget_and_the_longest_makes_room() {
        const BUDGET: usize = 8 << 20;
        let mut reactor = Reactor::new().unwrap();
        reactor.set_send_budget(BUDGET);
        // Three peers that read nothing, each allowed more than the whole budget.
        let (a, _ta) = pair(&mut reactor, Limits::peer());
        let (b, _tb) = pair(&mut reactor, Limits::peer());
        let (c, tc) = pair(&mut reactor, Limits::peer());
        let big = Link::Refused {
            reason: "x".repeat(100_000),
        };
        // A fills its socket buffers, then its queue, up to the budget.
        let mut sent = 0;
        while reactor.queued_total() + 100_100 <= BUDGET {
            assert!(reactor.send(a, big.clone()));
            sent += 1;
            assert!(sent < 10_000, "the queue never filled");
        }
        reactor.check_invariants().unwrap();
        let longest = reactor.queued_bytes(a);
        assert!(longest > BUDGET / 2, "{longest}");
        // B's frames need room: A, the longest queue, is closed for it and reported.
        for _ in 0..10 {
            assert!(reactor.send(b, big.clone()));
        }
        assert!(!reactor.is_open(a));
        assert!(reactor.is_open(b));
        reactor.check_invariants().unwrap();
        let mut events = Vec::new();
        reactor.poll(Some(Duration::ZERO), &mut events).unwrap();
        assert!(
            events.iter().any(
                |e| matches!(e, NetEvent::Closed(id, why) if *id == a && why.contains("budget"))
            ),
            "{events:?}"
        );
        // A frame larger than the budget goes nowhere: every queue that holds bytes is closed
        // trying to make room, but C, which holds none, is not.
        reactor.set_send_budget(1_000);
        assert!(!reactor.send(c, big.clone()));
        assert!(reactor.is_open(c));
        assert_eq!(reactor.queued_total(), 0);
        reactor.set_send_budget(BUDGET);
        reactor.check_invariants().unwrap();
        // What C's peer reads is written and counted off the total.
        let reader = std::thread::spawn(move || {
            let mut r = crate::frame::FrameReader::new(tc);
            r.read_frame::<Link>().unwrap().unwrap()
        });
        assert!(reactor.send(c, big.clone()));
        while reactor.queued_bytes(c) > 0 {
            reactor
                .poll(Some(Duration::from_millis(20)), &mut events)
                .unwrap();
        }
        assert_eq!(reader.join().unwrap(), big);
        assert_eq!(reactor.queued_total(), 0);
        reactor.check_invariants().unwrap();
    }
}

#[cfg(test)]
mod accept_tests {
    use super::*;

    /// A burst larger than the accepts of one poll: each poll accepts at most
    /// `ACCEPTS_PER_POLL`, the hello each accepted connection had already sent is reported
    /// before the next batch is accepted, and the polls that follow do not wait for a new
    /// connection to accept the rest.
    #[test]
    fn a_burst_is_accepted_a_batch_per_poll_after_the_batchs_frames() {
        const BURST: usize = 3 * ACCEPTS_PER_POLL + 5;
        let mut reactor = Reactor::new().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        reactor.listen_tcp(listener, Limits::pending()).unwrap();
        let mut clients: Vec<std::net::TcpStream> = (0..BURST)
            .map(|_| std::net::TcpStream::connect(address).unwrap())
            .collect();
        for (i, client) in clients.iter_mut().enumerate() {
            client.write_all(&4u32.to_le_bytes()).unwrap();
            client.write_all(&(i as u32).to_le_bytes()).unwrap();
        }
        let (mut accepted, mut frames, mut polls) = (0usize, 0usize, 0usize);
        let mut batches = Vec::new();
        while frames < BURST {
            polls += 1;
            assert!(polls < 1000, "{accepted} accepted, {frames} frames");
            let mut events = Vec::new();
            // Long enough to fail the test if the rest waited for a new connection.
            let started = std::time::Instant::now();
            reactor
                .poll(Some(Duration::from_secs(5)), &mut events)
                .unwrap();
            assert!(started.elapsed() < Duration::from_secs(4), "a poll waited");
            let mut here = 0;
            for event in &events {
                match event {
                    NetEvent::Accepted { .. } => {
                        // Every connection accepted by an earlier poll had sent its frame:
                        // all of them are read before this poll accepts more.
                        assert_eq!(frames, accepted, "frames read before a batch is accepted");
                        here += 1;
                    }
                    NetEvent::Frame(..) => {
                        assert!(here == 0, "a frame after this poll's accepts");
                        frames += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert!(here <= ACCEPTS_PER_POLL, "{here} accepted in one poll");
            accepted += here;
            if here > 0 {
                batches.push(here);
            }
        }
        assert_eq!(accepted, BURST);
        assert!(batches.len() >= 4, "{batches:?}");
    }
}

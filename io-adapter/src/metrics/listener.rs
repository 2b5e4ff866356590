//! The metrics listener: a thread of its own with one `mio` poll, so that no scrape waits for
//! another connection.
//!
//! Each accepted connection has [`SCRAPE_DEADLINE`] from its accept to send its request head
//! (at most [`REQUEST_BYTES_MAX`] bytes are read) and take the whole answer; past it, the
//! connection is closed. At most [`PENDING_MAX`] connections are open at once: a new one
//! closes the oldest. A connection is read as soon as it is accepted, and a burst is accepted
//! [`PENDING_MAX`] at a time, so a scraper that sends its request with its connection is
//! answered in the pass that accepts it, whatever other clients do: one that connects and
//! sends nothing, or trickles its request a byte at a time, costs one slot for at most the
//! deadline. (The listener this replaced read one connection at a time with a 2 s timeout per
//! `read`: 300 silent connections delayed a scrape by ten minutes, and one trickling client by
//! up to 8 KiB of reads.)
//!
//! An `accept` that fails (out of descriptors) is tried again [`ACCEPT_RETRY`] later, and
//! logged at most every 10 s, as the nodes' reactor does.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use prometheus::{Registry, TextEncoder};

use crate::net::reactor::{ACCEPT_FAILURE_LOG_EVERY, ACCEPT_RETRY};
use crate::throttle::Throttle;

/// How long a connection has, from its accept, to send its request and take the answer.
pub const SCRAPE_DEADLINE: Duration = Duration::from_secs(2);
/// The longest request head the listener reads.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// The most connections open at once (a new one closes the oldest).
pub const PENDING_MAX: usize = 64;

const LISTENER: Token = Token(usize::MAX);

/// Binds `listen` and serves `registry` there from a thread of its own. Returns the bound
/// address; binding and setting up the poll fail here, before the thread starts.
pub fn serve(listen: &str, registry: Registry) -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(listen)?;
    let address = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let mut listener = TcpListener::from_std(listener);
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut server = Server {
        poll,
        listener,
        registry,
        scrapes: BTreeMap::new(),
        next: 0,
        behind: false,
        stalled: None,
        failing: Throttle::default(),
    };
    std::thread::Builder::new()
        .name("metrics".to_owned())
        .spawn(move || {
            if let Err(e) = server.run() {
                tracing::error!(error = %e, "metrics: the listener stopped");
            }
        })?;
    Ok(address)
}

/// One open connection.
struct Scrape {
    stream: TcpStream,
    /// Accept time plus [`SCRAPE_DEADLINE`].
    deadline: Instant,
    /// The request head read so far.
    head: Vec<u8>,
    /// Once the head is read: the answer and how much of it is written.
    answer: Option<(Vec<u8>, usize)>,
}

struct Server {
    poll: Poll,
    listener: TcpListener,
    registry: Registry,
    /// Open connections by token; tokens grow with accepts, so the first is the oldest and
    /// its deadline the earliest.
    scrapes: BTreeMap<usize, Scrape>,
    next: usize,
    /// The last pass accepted its most and more may wait: the next poll does not wait
    /// (readiness is edge-triggered).
    behind: bool,
    /// After a failed `accept`: when to try again.
    stalled: Option<Instant>,
    /// While `accept` fails: its warning.
    failing: Throttle,
}

impl Server {
    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(256);
        let mut ready = Vec::new();
        loop {
            let timeout = self.timeout();
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let mut accept = self.behind;
            for event in events.iter() {
                match event.token() {
                    LISTENER => accept = true,
                    Token(id) => ready.push(id),
                }
            }
            for id in ready.drain(..) {
                self.progress(id);
            }
            let now = Instant::now();
            if self.stalled.is_some_and(|at| at <= now) {
                self.stalled = None;
                accept = true;
            }
            if accept && self.stalled.is_none() {
                self.accept(now);
            }
            while let Some(entry) = self.scrapes.first_entry() {
                if entry.get().deadline > now {
                    break;
                }
                tracing::debug!("metrics: a connection passed its deadline; closed");
                entry.remove();
            }
        }
    }

    /// How long the next poll may wait: until the oldest connection's deadline or the next
    /// accept attempt; not at all while behind.
    fn timeout(&self) -> Option<Duration> {
        if self.behind {
            return Some(Duration::ZERO);
        }
        let deadline = self.scrapes.first_key_value().map(|(_, s)| s.deadline);
        let wake = match (deadline, self.stalled) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(wake.saturating_duration_since(Instant::now()))
    }

    /// Accepts up to [`PENDING_MAX`] connections, reading each as it comes.
    fn accept(&mut self, now: Instant) {
        self.behind = false;
        for _ in 0..PENDING_MAX {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    self.failing = Throttle::default();
                    let id = self.next;
                    self.next += 1;
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if let Err(e) = self
                        .poll
                        .registry()
                        .register(&mut stream, Token(id), interest)
                    {
                        tracing::debug!(error = %e, "metrics: a connection could not be polled");
                        continue;
                    }
                    if self.scrapes.len() >= PENDING_MAX {
                        tracing::debug!(
                            "metrics: {PENDING_MAX} connections are open; the oldest is closed"
                        );
                        self.scrapes.pop_first();
                    }
                    let scrape = Scrape {
                        stream,
                        deadline: now + SCRAPE_DEADLINE,
                        head: Vec::new(),
                        answer: None,
                    };
                    self.scrapes.insert(id, scrape);
                    self.progress(id);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and the like: try again a little later.
                    self.stalled = Some(now + ACCEPT_RETRY);
                    if let Some(since) = self.failing.occur(now, ACCEPT_FAILURE_LOG_EVERY) {
                        tracing::warn!(
                            error = %e,
                            failures_since_last_warning = since,
                            "metrics: accept failed; trying again every {ACCEPT_RETRY:?}"
                        );
                    }
                    return;
                }
            }
        }
        self.behind = true;
    }

    /// Reads and answers connection `id` as far as it can without waiting; closes it once
    /// answered or broken.
    fn progress(&mut self, id: usize) {
        let Some(scrape) = self.scrapes.get_mut(&id) else {
            return;
        };
        match step(scrape, &self.registry) {
            Ok(false) => {}
            Ok(true) => {
                self.scrapes.remove(&id);
            }
            Err(e) => {
                tracing::debug!(error = %e, "metrics: a scrape failed");
                self.scrapes.remove(&id);
            }
        }
    }
}

/// Whether `head` holds a whole request head.
fn complete(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n")
}

/// Reads what has arrived and writes what fits; true once the whole answer is written.
fn step(scrape: &mut Scrape, registry: &Registry) -> io::Result<bool> {
    if scrape.answer.is_none() {
        let mut buffer = [0u8; 1024];
        while !complete(&scrape.head) && scrape.head.len() < REQUEST_BYTES_MAX {
            let room = buffer.len().min(REQUEST_BYTES_MAX - scrape.head.len());
            match scrape.stream.read(&mut buffer[..room]) {
                // The client sent all it will: answer what it sent.
                Ok(0) => break,
                Ok(n) => scrape.head.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        scrape.answer = Some((answer(&scrape.head, registry)?, 0));
    }
    let Some((bytes, written)) = &mut scrape.answer else {
        return Ok(false);
    };
    while *written < bytes.len() {
        match scrape.stream.write(&bytes[*written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The answer to the request whose head (or what arrived of it) is `head`.
fn answer(head: &[u8], registry: &Registry) -> io::Result<Vec<u8>> {
    let line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let method = words.next().unwrap_or("");
    let target = words.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = TextEncoder::new()
                .encode_to_string(&registry.gather())
                .map_err(|e| io::Error::other(e.to_string()))?;
            ("200 OK", prometheus::TEXT_FORMAT, body)
        }
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "dataplane node metrics: GET /metrics\n".to_owned(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET is served\n".to_owned(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(body.as_bytes());
    }
    Ok(response)
}

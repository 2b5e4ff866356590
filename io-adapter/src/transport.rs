//! The reference transport for streams (issue 17): a byte stream from the source (writer) to
//! the sink (reader) of a matched stream. The data plane only carries the descriptors; this
//! is one way to use them, shipped as an example and exercised by the tests and
//! `dataplane stream-send` / `stream-recv`.
//!
//! * **Who listens.** The sink: it binds a listener before it opens its side, and its
//!   descriptor says where (`dp-stream/2 tcp HOST:PORT TOKEN ANSWER` or `dp-stream/2 unix
//!   PATH TOKEN ANSWER`; a Unix socket for two programs on one host, TCP across hosts). The
//!   source's descriptor is `dp-stream/2 source`. Once matched, the source connects to the
//!   sink's descriptor and sends the token first.
//! * **Who may connect.** Only a peer that knows the token (16 random bytes, in hex), which
//!   only the directory's match tells: a connection that sends anything else is dropped, and
//!   the sink keeps waiting, until its deadline. The sink reads every connection's token
//!   without blocking (each has [`TOKEN_DEADLINE`], at most [`TOKEN_WAITERS_MAX`] at once), so
//!   strangers that connect and send nothing delay no source.
//! * **Whom the source sends to.** Only to a sink that answers its token with the
//!   descriptor's ANSWER (16 more random bytes): the descriptor comes from the peer program,
//!   which could name any socket the source can reach (a database's port, a daemon's Unix
//!   socket); such a socket gets the 16 bytes of the token and nothing else. Version 1
//!   (`dp-stream/1`, no answer) is refused.
//! * **Backpressure** is the socket's: a writer blocks while the reader does not read.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The descriptor's first word.
const MAGIC: &str = "dp-stream/2";
/// Bytes of the token.
const TOKEN_BYTES: usize = 16;
/// How long a source waits to connect to the sink.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a source waits for the sink's answer to its token.
pub const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// How long a connection to a sink has, from its accept, to present the token.
pub const TOKEN_DEADLINE: Duration = Duration::from_secs(5);
/// The most connections a sink reads tokens from at once (a new one closes the oldest).
pub const TOKEN_WAITERS_MAX: usize = 16;

/// The source's descriptor (the sink needs nothing from it).
pub fn source_descriptor() -> Vec<u8> {
    format!("{MAGIC} source").into_bytes()
}

#[derive(Debug)]
enum Listening {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// A sink's listener: where the source will connect.
pub struct SinkListener {
    listening: Listening,
    token: [u8; TOKEN_BYTES],
    answer: [u8; TOKEN_BYTES],
    descriptor: Vec<u8>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn token() -> io::Result<[u8; TOKEN_BYTES]> {
    let mut token = [0; TOKEN_BYTES];
    getrandom::fill(&mut token).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(token)
}

impl std::fmt::Debug for SinkListener {
    /// Everything but the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkListener")
            .field("listening", &self.listening)
            .finish_non_exhaustive()
    }
}

impl SinkListener {
    /// Listens on TCP at `bind` (`HOST:PORT`, port 0 for any); the descriptor names the bound
    /// address, so `HOST` must be one the source can reach.
    pub fn tcp(bind: &str) -> io::Result<SinkListener> {
        let listener = TcpListener::bind(bind)?;
        let at = listener.local_addr()?;
        let (token, answer) = (token()?, token()?);
        let descriptor = format!("{MAGIC} tcp {at} {} {}", hex(&token), hex(&answer)).into_bytes();
        Ok(SinkListener {
            listening: Listening::Tcp(listener),
            token,
            answer,
            descriptor,
        })
    }

    /// Listens on a Unix socket at `path` (for a source on the same host); the socket file is
    /// removed when the listener drops.
    pub fn unix(path: &Path) -> io::Result<SinkListener> {
        let listener = UnixListener::bind(path)?;
        let (token, answer) = (token()?, token()?);
        let shown = path.to_str().filter(|p| !p.contains(' ')).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the socket path must be UTF-8 without spaces",
            )
        })?;
        let descriptor =
            format!("{MAGIC} unix {shown} {} {}", hex(&token), hex(&answer)).into_bytes();
        Ok(SinkListener {
            listening: Listening::Unix(listener, path.to_owned()),
            token,
            answer,
            descriptor,
        })
    }

    /// This sink's descriptor, for its stream open.
    pub fn descriptor(&self) -> &[u8] {
        &self.descriptor
    }

    /// The source's connection, once one presented the token (others are dropped), within
    /// `wait`.
    ///
    /// Every connection is read without blocking, so a stranger that connects and sends
    /// nothing, or trickles bytes, delays no other: each has [`TOKEN_DEADLINE`] from its accept
    /// to present the token, and at most [`TOKEN_WAITERS_MAX`] are read at once (a new one
    /// closes the oldest).
    pub fn accept(&self, wait: Duration) -> io::Result<ByteStream> {
        self.accept_within(wait, TOKEN_DEADLINE)
    }

    fn accept_within(&self, wait: Duration, token_deadline: Duration) -> io::Result<ByteStream> {
        let deadline = Instant::now() + wait;
        // Accepted connections presenting their token: what arrived of it, and until when.
        let mut waiting: VecDeque<(ByteStream, Vec<u8>, Instant)> = VecDeque::new();
        self.set_nonblocking(true)?;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no source connected with the stream's token",
                ));
            }
            let mut progressed = false;
            // At most a table's worth per pass, so that a flood of connections does not keep
            // the pass from reading the ones already taken.
            for _ in 0..TOKEN_WAITERS_MAX {
                let Some(stream) = self.accept_waiting()? else {
                    break;
                };
                stream.set_nonblocking(true)?;
                if waiting.len() >= TOKEN_WAITERS_MAX {
                    waiting.pop_front();
                }
                waiting.push_back((
                    stream,
                    Vec::with_capacity(TOKEN_BYTES),
                    now + token_deadline,
                ));
                progressed = true;
            }
            let mut i = 0;
            while let Some((stream, presented, until)) = waiting.get_mut(i) {
                let mut buffer = [0; TOKEN_BYTES];
                let wanted = TOKEN_BYTES - presented.len();
                match stream.read(&mut buffer[..wanted]) {
                    Ok(0) => {}
                    Ok(n) => {
                        presented.extend_from_slice(&buffer[..n]);
                        progressed = true;
                        if presented.len() < TOKEN_BYTES && *until > now {
                            i += 1;
                            continue;
                        }
                        if same_token(presented, &self.token) {
                            let (mut stream, _, _) = waiting.swap_remove_back(i).expect("present");
                            stream.set_nonblocking(false)?;
                            // The source sends nothing until it has this proof that we are
                            // the sink its descriptor names.
                            if stream.write_all(&self.answer).is_ok() {
                                return Ok(stream);
                            }
                            continue;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) && *until > now =>
                    {
                        i += 1;
                        continue;
                    }
                    Err(_) => {}
                }
                // A stranger, a peer of another match, one that closed or broke, or one past
                // its deadline: dropped.
                waiting.remove(i);
            }
            if !progressed {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match &self.listening {
            Listening::Tcp(l) => l.set_nonblocking(nonblocking),
            Listening::Unix(l, _) => l.set_nonblocking(nonblocking),
        }
    }

    /// A connection the kernel holds, if any (the listener does not block).
    fn accept_waiting(&self) -> io::Result<Option<ByteStream>> {
        let accepted = match &self.listening {
            Listening::Tcp(l) => l.accept().map(|(s, _)| ByteStream::Tcp(s)),
            Listening::Unix(l, _) => l.accept().map(|(s, _)| ByteStream::Unix(s)),
        };
        match accepted {
            Ok(stream) => Ok(Some(stream)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Whether `presented` is `token`, in a time that does not depend on where they differ.
fn same_token(presented: &[u8], token: &[u8; TOKEN_BYTES]) -> bool {
    presented.len() == TOKEN_BYTES
        && presented
            .iter()
            .zip(token)
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

impl Drop for SinkListener {
    fn drop(&mut self) {
        if let Listening::Unix(_, path) = &self.listening {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where a sink listens, as its descriptor says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkAddress {
    /// TCP `HOST:PORT`.
    Tcp(String),
    /// A Unix socket's path.
    Unix(PathBuf),
}

/// A sink's descriptor, parsed: where it listens, the token a source presents and the answer
/// the sink gives it.
#[derive(Clone, PartialEq, Eq)]
pub struct SinkDescriptor {
    /// Where the sink listens.
    pub address: SinkAddress,
    /// The token to present.
    pub token: [u8; TOKEN_BYTES],
    /// What the sink answers the token with.
    pub answer: [u8; TOKEN_BYTES],
}

impl std::fmt::Debug for SinkDescriptor {
    /// Everything but the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkDescriptor")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// Parses a sink's descriptor (the bytes the directory's match carries from the peer program:
/// untrusted). Any byte string gets a descriptor or an `InvalidData` error, never a panic.
pub fn parse_sink_descriptor(sink_descriptor: &[u8]) -> io::Result<SinkDescriptor> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("sink descriptor: {why}"),
        )
    };
    let text = std::str::from_utf8(sink_descriptor).map_err(|_| bad("not UTF-8"))?;
    let words: Vec<&str> = text.split(' ').collect();
    let [magic, kind, at, token, answer] = words.as_slice() else {
        return Err(bad("not five words"));
    };
    if *magic != MAGIC {
        return Err(bad("not a reference transport descriptor of this version"));
    }
    let address = match *kind {
        "tcp" => SinkAddress::Tcp((*at).to_owned()),
        "unix" => SinkAddress::Unix(PathBuf::from(at)),
        _ => return Err(bad("an unknown transport")),
    };
    Ok(SinkDescriptor {
        address,
        token: hex_token(token).ok_or_else(|| bad("a token that is not 32 hex digits"))?,
        answer: hex_token(answer).ok_or_else(|| bad("an answer that is not 32 hex digits"))?,
    })
}

/// The bytes of `TOKEN_BYTES * 2` hex digits.
fn hex_token(text: &str) -> Option<[u8; TOKEN_BYTES]> {
    let text = text.as_bytes();
    if text.len() != TOKEN_BYTES * 2 {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut raw = [0u8; TOKEN_BYTES];
    for (byte, pair) in raw.iter_mut().zip(text.chunks_exact(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(raw)
}

/// The source's side: connects to the sink that `sink_descriptor` describes, presents its
/// token and waits (at most [`ANSWER_WAIT`]) for the sink's answer before anything else is
/// sent: an address that does not answer as the sink (a descriptor from a program that names
/// someone else's socket) gets the token and nothing more.
pub fn connect(sink_descriptor: &[u8]) -> io::Result<ByteStream> {
    connect_within(sink_descriptor, ANSWER_WAIT)
}

fn connect_within(sink_descriptor: &[u8], answer_wait: Duration) -> io::Result<ByteStream> {
    let sink = parse_sink_descriptor(sink_descriptor)?;
    let mut stream = match &sink.address {
        SinkAddress::Tcp(at) => {
            let s = crate::net::connect_tcp(at, CONNECT_TIMEOUT)?;
            s.set_nodelay(true)?;
            ByteStream::Tcp(s)
        }
        SinkAddress::Unix(path) => ByteStream::Unix(UnixStream::connect(path)?),
    };
    stream.write_all(&sink.token)?;
    stream.set_read_timeout(Some(answer_wait))?;
    let mut answer = [0u8; TOKEN_BYTES];
    let answered = stream.read_exact(&mut answer);
    if answered.is_err() || !same_token(&answer, &sink.answer) {
        let why = match answered {
            Err(e) => e.to_string(),
            Ok(()) => "a wrong answer".to_owned(),
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the sink's address did not answer the token as the sink ({why}); nothing was sent"
            ),
        ));
    }
    stream.set_read_timeout(None)?;
    Ok(stream)
}

/// A connected byte stream of the reference transport.
#[derive(Debug)]
pub enum ByteStream {
    /// Across hosts.
    Tcp(TcpStream),
    /// On one host.
    Unix(UnixStream),
}

impl ByteStream {
    /// No more bytes from this side: the reader sees the end of the stream.
    pub fn finish(&mut self) -> io::Result<()> {
        match self {
            ByteStream::Tcp(s) => s.shutdown(Shutdown::Write),
            ByteStream::Unix(s) => s.shutdown(Shutdown::Write),
        }
    }

    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            ByteStream::Tcp(s) => s.set_nonblocking(nonblocking),
            ByteStream::Unix(s) => s.set_nonblocking(nonblocking),
        }
    }

    /// Reads time out after `timeout` (`None`: never).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            ByteStream::Tcp(s) => s.set_read_timeout(timeout),
            ByteStream::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    /// Writes time out after `timeout` (`None`: never): a peer that stops reading blocks a
    /// writer once the sockets' buffers are full.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            ByteStream::Tcp(s) => s.set_write_timeout(timeout),
            ByteStream::Unix(s) => s.set_write_timeout(timeout),
        }
    }
}

impl Read for ByteStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ByteStream::Tcp(s) => s.read(buf),
            ByteStream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for ByteStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ByteStream::Tcp(s) => s.write(buf),
            ByteStream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            ByteStream::Tcp(s) => s.flush(),
            ByteStream::Unix(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(sink: SinkListener) {
        let descriptor = sink.descriptor().to_vec();
        let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = payload.clone();
        let writer = std::thread::spawn(move || {
            // A stranger first, with a wrong token (the descriptor's fourth word changed):
            // dropped by the sink, which keeps waiting; it gets no answer.
            let text = String::from_utf8(descriptor.clone()).unwrap();
            let mut words: Vec<String> = text.split(' ').map(str::to_owned).collect();
            let flipped = if words[3].ends_with('0') { '1' } else { '0' };
            words[3].pop();
            words[3].push(flipped);
            let stranger = words.join(" ");
            assert!(
                connect(stranger.as_bytes()).is_err(),
                "a wrong token is answered"
            );
            let mut s = connect(&descriptor).unwrap();
            s.write_all(&sent).unwrap();
            s.finish().unwrap();
        });
        let mut stream = sink.accept(Duration::from_secs(10)).unwrap();
        let mut got = Vec::new();
        stream.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert!(got == payload);
    }

    #[test]
    fn bytes_flow_over_tcp_and_unix_sockets_to_the_token_holder_only() {
        round_trip(SinkListener::tcp("127.0.0.1:0").unwrap());
        let dir = tempfile::tempdir().unwrap();
        round_trip(SinkListener::unix(&dir.path().join("s.sock")).unwrap());
    }

    #[test]
    fn bad_descriptors_are_refused() {
        let zeros = "0".repeat(32);
        for bad in [
            "\u{ff}".to_owned(),
            "dp-stream/2 source".to_owned(),
            format!("other tcp 1:2 {zeros} {zeros}"),
            format!("dp-stream/2 tcp 127.0.0.1:1 zz {zeros}"),
            format!("dp-stream/2 tcp 127.0.0.1:1 {zeros} zz"),
            format!("dp-stream/2 udp 127.0.0.1:1 {zeros} {zeros}"),
            // Version 1 had no answer.
            format!("dp-stream/1 tcp 127.0.0.1:1 {zeros}"),
            format!("dp-stream/1 tcp 127.0.0.1:1 {zeros} {zeros}"),
            // Not hex, though 32 bytes long: multi-byte characters across a digit pair's
            // boundary used to panic (a byte index inside a character).
            format!(
                "dp-stream/2 tcp 127.0.0.1:1 a\u{20ac}{} {zeros}",
                "b".repeat(28)
            ),
            format!(
                "dp-stream/2 tcp 127.0.0.1:1 {zeros} {}",
                "\u{e9}".repeat(16)
            ),
            format!("dp-stream/2 tcp 127.0.0.1:1 +f{} {zeros}", "0".repeat(30)),
        ] {
            assert_eq!(
                parse_sink_descriptor(bad.as_bytes()).unwrap_err().kind(),
                io::ErrorKind::InvalidData,
                "{bad}"
            );
        }
        let sink = SinkListener::tcp("127.0.0.1:0").unwrap();
        let parsed = parse_sink_descriptor(sink.descriptor()).unwrap();
        assert_eq!((parsed.token, parsed.answer), (sink.token, sink.answer));
        assert!(matches!(parsed.address, SinkAddress::Tcp(_)));
        assert_eq!(
            sink.accept(Duration::from_millis(50)).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }

    #[test]
    fn strangers_that_send_nothing_or_trickle_delay_no_source() {
        let sink = SinkListener::tcp("127.0.0.1:0").unwrap();
        let descriptor = sink.descriptor().to_vec();
        let text = std::str::from_utf8(&descriptor).unwrap().to_owned();
        let at = text.split(' ').nth(2).unwrap().to_owned();
        // More silent strangers than the sink reads at once, and one sending a byte every
        // 100 ms, all before the source.
        let silent: Vec<TcpStream> = (0..TOKEN_WAITERS_MAX + 4)
            .map(|_| TcpStream::connect(&at).unwrap())
            .collect();
        let mut trickler = TcpStream::connect(&at).unwrap();
        let trickling = std::thread::spawn(move || {
            for _ in 0..100 {
                if trickler.write_all(b"x").is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            false
        });
        let source = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut s = connect(&descriptor).unwrap();
            s.write_all(b"payload").unwrap();
            s.finish().unwrap();
        });
        // Less than one stranger's deadline: a sink that read them one at a time would
        // still be waiting for the first.
        let mut stream = sink
            .accept(TOKEN_DEADLINE / 2)
            .expect("the source's connection");
        let mut got = Vec::new();
        stream.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"payload");
        source.join().unwrap();
        drop(silent);
        drop(sink);
        assert!(
            trickling.join().unwrap(),
            "the trickler is closed with the sink"
        );
    }

    proptest::proptest! {
        /// Any descriptor a peer program sends parses or is refused, without a panic; a token
        /// parses to the bytes its hex says.
        #[test]
        fn descriptors_parse_or_are_refused(
            token in "[0-9a-fA-F\u{e9}\u{20ac}+ -]{0,40}",
            odd in proptest::sample::select(vec!['\u{e9}', '\u{20ac}', '+', 'g', '0']),
            at in 0usize..29,
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
        ) {
            let _ = parse_sink_descriptor(&bytes);
            // 32 bytes of hex but for one character at a drawn place (multi-byte ones too).
            let long = format!("{}{odd}{}", "a".repeat(at), "b".repeat(32 - at - odd.len_utf8()));
            let text = format!("{MAGIC} tcp 127.0.0.1:1 {long} {}", "c".repeat(32));
            proptest::prop_assert_eq!(parse_sink_descriptor(text.as_bytes()).is_ok(), odd == '0');
            let text = format!("{MAGIC} unix /tmp/s {} {token}", "d".repeat(32));
            match parse_sink_descriptor(text.as_bytes()) {
                Ok(parsed) => {
                    proptest::prop_assert_eq!(hex(&parsed.answer), token.to_ascii_lowercase());
                }
                Err(e) => {
                    proptest::prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                    let hex_token = token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit());
                    proptest::prop_assert!(!hex_token, "refused a hex token: {}", e);
                }
            }
        }
    }

    /// Listens on TCP and, for one connection, writes `reply`, then keeps what it receives
    /// until the connection ends (or 10 s pass).
    fn impostor(reply: &'static [u8]) -> (String, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let received = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(reply).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            got
        });
        (at, received)
    }

    #[test]
    fn a_source_sends_nothing_past_its_token_to_an_address_that_does_not_answer_as_the_sink() {
        let token = [0x5a; TOKEN_BYTES];
        let answer = [0xa5; TOKEN_BYTES];
        // A server that answers anything with its own greeting (as a database or an HTTP
        // daemon named by a hostile descriptor would), and one that answers nothing.
        for (reply, wait) in [
            (&b"HTTP/1.1 400 Bad Request\r\n\r\n"[..], ANSWER_WAIT),
            (&b""[..], Duration::from_millis(300)),
        ] {
            let (at, received) = impostor(reply);
            let descriptor = format!("{MAGIC} tcp {at} {} {}", hex(&token), hex(&answer));
            let refused = connect_within(descriptor.as_bytes(), wait)
                .expect_err("an impostor is not taken for the sink");
            assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{refused}");
            assert_eq!(
                received.join().unwrap(),
                token,
                "the impostor got the token only"
            );
        }
    }

    /// A stranger trickling bytes that never make a token is closed at its token deadline,
    /// while the sink still waits.
    #[test]
    fn a_trickling_stranger_is_closed_at_its_token_deadline() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let sink = SinkListener::tcp("127.0.0.1:0").unwrap();
        let text = String::from_utf8(sink.descriptor().to_vec()).unwrap();
        let at = text.split(' ').nth(2).unwrap().to_owned();
        let returned = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&returned);
        let trickler = std::thread::spawn(move || {
            let mut s = TcpStream::connect(&at).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut byte = [0u8; 1];
            // Fewer bytes than a token, one every 50 ms, until the sink closes the connection.
            for _ in 0..(TOKEN_BYTES - 1) {
                if s.write_all(b"x").is_err() {
                    return Some(seen.load(Ordering::SeqCst));
                }
                match s.read(&mut byte) {
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) => {}
                    _ => return Some(seen.load(Ordering::SeqCst)),
                }
            }
            None
        });
        let waited = sink.accept_within(Duration::from_secs(3), Duration::from_millis(200));
        returned.store(true, Ordering::SeqCst);
        assert_eq!(waited.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            trickler.join().unwrap(),
            Some(false),
            "closed while the sink still waited (None: never closed; Some(true): only when it \
             gave up)"
        );
    }
}

//! The reference transport for streams (issue 17): a byte stream from the source (writer) to
//! the sink (reader) of a matched stream. The data plane only carries the descriptors; this
//! is one way to use them, shipped as an example and exercised by the tests and
//! `dataplane stream-send` / `stream-recv`.
//!
//! * **Who listens.** The sink: it binds a listener before it opens its side, and its
//!   descriptor says where (`dp-stream/1 tcp HOST:PORT TOKEN` or `dp-stream/1 unix PATH
//!   TOKEN`; a Unix socket for two programs on one host, TCP across hosts). The source's
//!   descriptor is `dp-stream/1 source`. Once matched, the source connects to the sink's
//!   descriptor and sends the token first.
//! * **Who may connect.** Only a peer that knows the token (16 random bytes, in hex), which
//!   only the directory's match tells: a connection that sends anything else is dropped, and
//!   the sink keeps waiting, until its deadline.
//! * **Backpressure** is the socket's: a writer blocks while the reader does not read.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The descriptor's first word.
const MAGIC: &str = "dp-stream/1";
/// Bytes of the token.
const TOKEN_BYTES: usize = 16;

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
        let token = token()?;
        let descriptor = format!("{MAGIC} tcp {at} {}", hex(&token)).into_bytes();
        Ok(SinkListener {
            listening: Listening::Tcp(listener),
            token,
            descriptor,
        })
    }

    /// Listens on a Unix socket at `path` (for a source on the same host); the socket file is
    /// removed when the listener drops.
    pub fn unix(path: &Path) -> io::Result<SinkListener> {
        let listener = UnixListener::bind(path)?;
        let token = token()?;
        let shown = path.to_str().filter(|p| !p.contains(' ')).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the socket path must be UTF-8 without spaces",
            )
        })?;
        let descriptor = format!("{MAGIC} unix {shown} {}", hex(&token)).into_bytes();
        Ok(SinkListener {
            listening: Listening::Unix(listener, path.to_owned()),
            token,
            descriptor,
        })
    }

    /// This sink's descriptor, for its stream open.
    pub fn descriptor(&self) -> &[u8] {
        &self.descriptor
    }

    /// The source's connection, once one presented the token (others are dropped), within
    /// `wait`.
    pub fn accept(&self, wait: Duration) -> io::Result<ByteStream> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no source connected with the stream's token",
                ));
            }
            let mut stream = match &self.listening {
                Listening::Tcp(l) => {
                    l.set_nonblocking(true)?;
                    match l.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(false)?;
                            ByteStream::Tcp(s)
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Listening::Unix(l, _) => {
                    l.set_nonblocking(true)?;
                    match l.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(false)?;
                            ByteStream::Unix(s)
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            stream.set_read_timeout(Some(left.min(Duration::from_secs(5))))?;
            let mut presented = [0; TOKEN_BYTES];
            if stream.read_exact(&mut presented).is_ok() && presented == self.token {
                stream.set_read_timeout(None)?;
                return Ok(stream);
            }
            // A stranger, or a peer of another match: dropped.
        }
    }
}

impl Drop for SinkListener {
    fn drop(&mut self) {
        if let Listening::Unix(_, path) = &self.listening {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The source's side: connects to the sink that `sink_descriptor` describes and presents its
/// token.
pub fn connect(sink_descriptor: &[u8]) -> io::Result<ByteStream> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("sink descriptor: {why}"),
        )
    };
    let text = std::str::from_utf8(sink_descriptor).map_err(|_| bad("not UTF-8"))?;
    let words: Vec<&str> = text.split(' ').collect();
    let [magic, kind, at, token] = words.as_slice() else {
        return Err(bad("not four words"));
    };
    if *magic != MAGIC {
        return Err(bad("not a reference transport descriptor"));
    }
    if token.len() != TOKEN_BYTES * 2 {
        return Err(bad("a token of the wrong length"));
    }
    let mut raw = [0u8; TOKEN_BYTES];
    for (i, byte) in raw.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&token[2 * i..2 * i + 2], 16)
            .map_err(|_| bad("a token that is not hex"))?;
    }
    let mut stream = match *kind {
        "tcp" => {
            let s = TcpStream::connect(at)?;
            s.set_nodelay(true)?;
            ByteStream::Tcp(s)
        }
        "unix" => ByteStream::Unix(UnixStream::connect(at)?),
        _ => return Err(bad("an unknown transport")),
    };
    stream.write_all(&raw)?;
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

    /// Reads time out after `timeout` (`None`: never).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            ByteStream::Tcp(s) => s.set_read_timeout(timeout),
            ByteStream::Unix(s) => s.set_read_timeout(timeout),
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
            // A stranger first: dropped by the sink, which keeps waiting.
            let mut stranger = descriptor.clone();
            let last = stranger.len() - 1;
            stranger[last] = if stranger[last] == b'0' { b'1' } else { b'0' };
            let _ = connect(&stranger).map(|mut s| s.write_all(b"garbage"));
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
        for bad in [
            &b"\xff"[..],
            b"dp-stream/1 source",
            b"other tcp 1:2 00",
            b"dp-stream/1 tcp 127.0.0.1:1 zz",
        ] {
            assert!(connect(bad).is_err());
        }
        let sink = SinkListener::tcp("127.0.0.1:0").unwrap();
        assert_eq!(
            sink.accept(Duration::from_millis(50)).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }
}

//! A client that speaks the nodes' TCP protocol (`dataplane_io::net::Link`) directly: it says
//! hello as a client to the directory node (the handshake of `dataplane_io::net`), gets a
//! transient node id in the `Welcome`, and sends
//! `Link::Frame(Envelope{ Message::Call(..) })`s; replies come back as `Message::Reply`.

use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use dataplane_core::ids::{Address, AuthorityEpoch, NodeId, RequestId};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, Envelope, Message, ReplyBody,
};
use dataplane_io::frame::{FrameReader, write_frame};
use dataplane_io::net::{ClusterKey, HandshakeError, Link, Who, handshake_blocking};

/// How long a raw read may block before it is an error.
pub const RAW_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// A client connection to a directory node.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
    reader: FrameReader<TcpStream>,
    /// The transient node id the directory gave us.
    pub node: NodeId,
    /// Our incarnation (always 1 for clients).
    pub incarnation: u64,
    /// The directory's address.
    pub directory: Address,
    /// The directory's authority epoch, from the `Welcome`.
    pub epoch: AuthorityEpoch,
    next_request: u64,
}

impl RawClient {
    /// Connects, does the client handshake and reads the `Welcome`.
    pub fn connect(address: &str) -> io::Result<RawClient> {
        RawClient::connect_with_key(address, None)
    }

    /// [`connect`](Self::connect), proving `key`. A refusal is an error that says
    /// `refused: <the directory's reason>`.
    pub fn connect_with_key(address: &str, key: Option<ClusterKey>) -> io::Result<RawClient> {
        let addr = address
            .parse()
            .map_err(|e| io::Error::other(format!("{address}: {e}")))?;
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(RAW_READ_TIMEOUT))?;
        let (welcome, reader) =
            handshake_blocking(&stream, Who::Client, key.as_ref()).map_err(|e| match e {
                HandshakeError::Io(e) => e,
                other => io::Error::other(other.to_string()),
            })?;
        let Link::Welcome {
            node,
            incarnation,
            directory,
            epoch,
            ..
        } = welcome
        else {
            return Err(io::Error::other(format!(
                "expected a Welcome, got {welcome:?}"
            )));
        };
        Ok(RawClient {
            stream,
            reader,
            node,
            incarnation,
            directory,
            epoch,
            next_request: 1,
        })
    }

    /// An address of ours (`actor` chosen by the caller).
    pub fn address(&self, actor: u64) -> Address {
        Address::new(self.node, self.incarnation, actor)
    }

    /// Sends a call with a fresh request id; returns the id.
    pub fn send(&mut self, request: DirectoryRequest) -> io::Result<RequestId> {
        let request_id = RequestId(self.next_request);
        self.next_request += 1;
        let envelope = Envelope {
            from: self.address(0),
            to: self.directory,
            message: Message::Call(DirectoryCall {
                request_id,
                reply_to: self.address(0),
                request,
            }),
        };
        self.send_link(&Link::Frame(envelope))?;
        Ok(request_id)
    }

    /// Sends any link frame.
    pub fn send_link(&mut self, link: &Link) -> io::Result<()> {
        let mut w = &self.stream;
        write_frame(&mut w, link).map_err(io::Error::other)?;
        w.flush()
    }

    /// The next reply (other frames, e.g. `Retire`s for addresses we named, are skipped).
    pub fn recv(&mut self) -> io::Result<DirectoryReply> {
        loop {
            match self.reader.read_frame::<Link>() {
                Ok(Some(Link::Frame(Envelope {
                    message: Message::Reply(reply),
                    ..
                }))) => return Ok(reply),
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the directory closed the connection",
                    ));
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }

    /// Sends `request` and waits for its reply; checks the reply's epoch.
    pub fn call(&mut self, request: DirectoryRequest) -> io::Result<ReplyBody> {
        let id = self.send(request)?;
        loop {
            let reply = self.recv()?;
            if reply.request_id == id {
                if reply.epoch != self.epoch {
                    return Err(io::Error::other(format!(
                        "reply from epoch {} on a connection welcomed at {}",
                        reply.epoch, self.epoch
                    )));
                }
                return Ok(reply.body);
            }
        }
    }

    /// Sends every request, at most `window` in flight (a node drops frames for a peer that
    /// does not read), and returns the replies in request order; checks their epoch.
    pub fn pipeline(
        &mut self,
        requests: Vec<DirectoryRequest>,
        window: usize,
    ) -> io::Result<Vec<ReplyBody>> {
        let mut replies: Vec<Option<ReplyBody>> = vec![None; requests.len()];
        let mut waiting = std::collections::BTreeMap::new();
        let mut requests = requests.into_iter().enumerate();
        loop {
            while waiting.len() < window.max(1) {
                let Some((i, request)) = requests.next() else {
                    break;
                };
                waiting.insert(self.send(request)?, i);
            }
            if waiting.is_empty() {
                break;
            }
            let reply = self.recv()?;
            if reply.epoch != self.epoch {
                return Err(io::Error::other(format!(
                    "reply from epoch {} on a connection welcomed at {}",
                    reply.epoch, self.epoch
                )));
            }
            if let Some(i) = waiting.remove(&reply.request_id) {
                replies[i] = Some(reply.body);
            }
        }
        Ok(replies.into_iter().map(|r| r.expect("answered")).collect())
    }

    /// `Register` of `path` as the blob of a made-up actor `n` (`length` n), with operation
    /// `n + 1` of `issuer`: what a test that only needs acknowledged mutations sends.
    pub fn register_actor(&mut self, path: &str, n: u64, issuer: u64) -> io::Result<ReplyBody> {
        self.call(register_actor(path, n, issuer))
    }

    /// `Lookup` of `path`.
    pub fn lookup(&mut self, path: &str) -> io::Result<ReplyBody> {
        self.call(DirectoryRequest::Lookup {
            path: DataPath::new(path).expect("a valid path"),
        })
    }

    /// Closes the connection.
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The `Register` [`RawClient::register_actor`] sends, as a request (to pipeline).
pub fn register_actor(path: &str, n: u64, issuer: u64) -> DirectoryRequest {
    let source = Address::new(NodeId(1 << 50), 1, n);
    DirectoryRequest::Register {
        path: DataPath::new(path).expect("a valid path"),
        source,
        source_node: source.node,
        length: n,
        recovery: dataplane_core::wire::SourceRecovery::Actor {
            actor: source,
            node: source.node,
            owner: None,
        },
        operation: dataplane_core::ids::OperationId((u128::from(issuer) << 64) | u128::from(n + 1)),
        reservation: None,
    }
}

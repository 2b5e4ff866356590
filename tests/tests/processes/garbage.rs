//! Raw sockets send garbage, truncated, oversized and out-of-protocol frames to the directory's
//! TCP port, a host's TCP port and a host's child socket: each such connection is closed by
//! the node (our read sees the end of the stream), and the nodes keep serving everyone else.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use dataplane_core::ids::{Address, AuthorityEpoch, NodeId, RequestId};
use dataplane_core::limits::FRAME_BYTES_MAX;
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, Envelope, GoneScope, Message, ReplyBody,
};
use dataplane_io::frame::encode_frame;
use dataplane_io::net::{Connector, Link, Who};
use dataplane_tests::raw::RawClient;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

/// How long a node may take to close a connection it refuses.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the hostile peer sends.
#[derive(Debug, Clone, Copy)]
enum Attack {
    /// A whole frame whose payload is not a value of the protocol.
    Garbage,
    /// Random bytes, prefix included.
    Noise,
    /// A frame cut short, then the end of our sending side.
    Truncated,
    /// Less than a length prefix, then the end of our sending side.
    TruncatedPrefix,
    /// A length prefix of 4 GiB - 1.
    Oversized,
    /// A length prefix one byte over the limit.
    JustOversized,
    /// A frame of exactly the maximal size, full of zeros (decodes with bytes left over).
    MaximalZeros,
    /// A well-formed frame the peer may not send at this point.
    OutOfProtocol,
}

const ATTACKS: [Attack; 8] = [
    Attack::Garbage,
    Attack::Noise,
    Attack::Truncated,
    Attack::TruncatedPrefix,
    Attack::Oversized,
    Attack::JustOversized,
    Attack::MaximalZeros,
    Attack::OutOfProtocol,
];

/// The bytes of `attack`, and whether we end our sending side after them.
fn bytes(attack: Attack, out_of_protocol: &[u8]) -> (Vec<u8>, bool) {
    match attack {
        Attack::Garbage => (vec![5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff], false),
        Attack::Noise => {
            let mut noise = pattern(99, 4096);
            noise[..4].copy_from_slice(&100u32.to_le_bytes());
            (noise, false)
        }
        Attack::Truncated => {
            let mut frame = 100u32.to_le_bytes().to_vec();
            frame.extend_from_slice(&[1; 10]);
            (frame, true)
        }
        Attack::TruncatedPrefix => (vec![7, 0], true),
        Attack::Oversized => (u32::MAX.to_le_bytes().to_vec(), false),
        Attack::JustOversized => {
            let len = u32::try_from(FRAME_BYTES_MAX + 1).unwrap();
            (len.to_le_bytes().to_vec(), false)
        }
        Attack::MaximalZeros => {
            let mut frame = u32::try_from(FRAME_BYTES_MAX)
                .unwrap()
                .to_le_bytes()
                .to_vec();
            frame.resize(4 + FRAME_BYTES_MAX, 0);
            (frame, false)
        }
        Attack::OutOfProtocol => (out_of_protocol.to_vec(), false),
    }
}

/// Reads (and discards) until the peer closes; panics if it does not within the deadline.
fn expect_closed(mut read: impl Read, what: &str) {
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match read.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            // A reset is a close too.
            Err(_) => return,
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the node did not close the connection within {CLOSE_TIMEOUT:?}"
        );
    }
}

fn attack_tcp(address: &str, attack: Attack, out_of_protocol: &[u8], what: &str) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let (bytes, end) = bytes(attack, out_of_protocol);
    // The node may close before it read everything: a failed write is fine.
    let _ = stream.write_all(&bytes);
    if end {
        let _ = stream.shutdown(Shutdown::Write);
    }
    expect_closed(&stream, &format!("{what}, {attack:?}"));
}

fn attack_child(socket: &Path, attack: Attack, out_of_protocol: &[u8]) {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let (bytes, end) = bytes(attack, out_of_protocol);
    let _ = stream.write_all(&bytes);
    if end {
        let _ = stream.shutdown(Shutdown::Write);
    }
    // The host's welcome (with the arena's descriptor, which a plain read drops) comes first.
    expect_closed(&stream, &format!("child socket, {attack:?}"));
}

fn frame<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(value, &mut out).unwrap();
    out
}

#[test]
fn garbage_frames_close_the_connection_and_nothing_else() {
    let dir = TestDir::new("garbage");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let mut a = HostProc::start(&dir, "host-a", &directory.listen, "8M");
    let mut b = HostProc::start(&dir, "host-b", &directory.listen, "8M");
    let blob = pattern(3, 700_000);
    a.cli_stdin(&["put", "/data/g/before", "-"], &blob)
        .expect_code(0, "put before the attacks");
    // A well-behaved client stays connected through everything.
    let mut bystander = RawClient::connect(&directory.listen).unwrap();
    let before = bystander.lookup("/data/g/before").unwrap();
    assert!(matches!(before, ReplyBody::LookedUp(Ok(_))), "{before:?}");

    // Out of protocol: to the directory, a core frame before any hello; to a host's peer
    // port, a Welcome (only the directory may send one); to a child socket, a frame of the
    // wrong type (a `Link`, which does not decode as a `ChildRequest`).
    let stray = Envelope {
        from: Address::new(NodeId(77), 1, 1),
        to: Address::new(NodeId(0), 1, 0),
        message: Message::Reply(DirectoryReply {
            request_id: RequestId(1),
            epoch: AuthorityEpoch(1),
            body: ReplyBody::StreamClosed(Ok(())),
        }),
    };
    let to_directory = frame(&Link::Frame(stray));
    let to_host = frame(&Link::Welcome {
        node: NodeId(1),
        incarnation: 1,
        directory: Address::new(NodeId(0), 1, 0),
        epoch: AuthorityEpoch(1),
    });
    let to_child = frame(&Connector::new(Who::Client, [0; 32], None).1);

    for attack in ATTACKS {
        attack_tcp(&directory.listen, attack, &to_directory, "directory");
        attack_tcp(&a.listen, attack, &to_host, "host A's peer port");
        attack_child(&b.socket, attack, &to_child);
    }
    // A core frame to a host's peer port before any handshake: hosts take core frames only
    // from the directory and from admitted peers.
    let unhelloed = Envelope {
        from: Address::new(NodeId(77), 1, 1),
        to: Address::new(NodeId(1), 1, 0),
        message: Message::SourceRetired {
            source: Address::new(NodeId(77), 1, 2),
        },
    };
    attack_tcp(
        &a.listen,
        Attack::OutOfProtocol,
        &frame(&Link::Frame(unhelloed)),
        "host A's peer port, a core frame before a handshake",
    );
    // After a hello, garbage still closes the connection (the directory's reader is the same).
    let mut hello = frame(&Connector::new(Who::Client, [0; 32], None).1);
    hello.extend_from_slice(&[3, 0, 0, 0, 0xff, 0xff, 0xff]);
    attack_tcp(
        &directory.listen,
        Attack::OutOfProtocol,
        &hello,
        "directory after hello",
    );

    // Everyone else was served all along, and still is.
    directory.proc.assert_running();
    a.proc.assert_running();
    b.proc.assert_running();
    let after = bystander.lookup("/data/g/before").unwrap();
    assert_eq!(after, before, "the bystander is still served");
    let get = b.cli(&["get", "/data/g/before"]);
    get.expect_code(0, "get on B after the attacks");
    assert!(get.stdout == blob);
    let blob2 = pattern(4, 300_000);
    b.cli_stdin(&["put", "/data/g/after", "-"], &blob2)
        .expect_code(0, "put on B after the attacks");
    let get = a.cli(&["get", "/data/g/after"]);
    get.expect_code(0, "get on A after the attacks");
    assert!(get.stdout == blob2);
}

#[test]
fn a_connection_may_not_speak_for_another_node() {
    let dir = TestDir::new("speaks-for");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "8M");
    let blob = pattern(5, 300_000);
    a.cli_stdin(&["put", "/data/s/before", "-"], &blob)
        .expect_code(0, "put before the attacks");
    // The first host of a fresh directory is node 1.
    let host = Address::new(NodeId(1), 1, 5);

    let attacks: [fn(&RawClient, Address) -> Message; 4] = [
        // Report host A gone (it would end its incarnation: its registers would be refused).
        |c, host| Message::AddressGone {
            scope: GoneScope::NodeBefore {
                node: host.node,
                incarnation: 1000,
            },
            reply_to: c.address(1),
        },
        // Acknowledge a retirement for one of A's sources.
        |_, host| Message::SourceRetired { source: host },
        // Have the directory send a reply to A.
        |_, host| {
            Message::Call(DirectoryCall {
                request_id: RequestId(1),
                reply_to: host,
                request: DirectoryRequest::Lookup {
                    path: DataPath::new("/data/s/before").unwrap(),
                },
            })
        },
        // Pose as A in the envelope.
        |c, _| Message::SourceRetired {
            source: c.address(9),
        },
    ];
    for (i, attack) in attacks.iter().enumerate() {
        let mut client = RawClient::connect(&directory.listen).unwrap();
        let from = if i == 3 { host } else { client.address(1) };
        let envelope = Envelope {
            from,
            to: client.directory,
            message: attack(&client, host),
        };
        client.send_link(&Link::Frame(envelope)).unwrap();
        let answer = client.recv();
        // Closed at once (a timeout would mean the directory took the frame).
        assert!(
            matches!(&answer, Err(e) if e.kind() == ErrorKind::UnexpectedEof),
            "attack {i}: the directory did not close the connection: {answer:?}"
        );
    }

    // A's incarnation is still alive: it publishes and serves as before.
    let blob2 = pattern(6, 200_000);
    a.cli_stdin(&["put", "/data/s/after", "-"], &blob2)
        .expect_code(0, "put on A after the attacks");
    let get = a.cli(&["get", "/data/s/before"]);
    get.expect_code(0, "get on A after the attacks");
    assert!(get.stdout == blob);
}

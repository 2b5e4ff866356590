//! A stream rendezvous through the real directory (there is no CLI for streams): Source and Sink
//! opened on one path by two raw `Link` clients, then through two hosts' proxies; both sides
//! get the same match.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use dataplane_core::error::NamespaceError;
use dataplane_core::ids::{Address, OperationId, RequestId};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    Descriptor, DirectoryCall, DirectoryRequest, EntryKind, Envelope, Message, ReplyBody,
    StreamRole,
};
use dataplane_io::frame::write_frame;
use dataplane_io::hostnode::PROXY_ACTOR;
use dataplane_io::net::{Link, Who, accept_blocking, handshake_blocking, prove_blocking};
use dataplane_tests::raw::RawClient;
use dataplane_tests::{DirectoryProc, HostProc, TestDir};

fn open(
    client: &RawClient,
    path: &str,
    role: StreamRole,
    descriptor: &[u8],
    operation: u128,
) -> DirectoryRequest {
    DirectoryRequest::OpenStream {
        path: DataPath::new(path).unwrap(),
        role,
        descriptor: Descriptor::new(descriptor.to_vec()).unwrap(),
        endpoint: client.address(7),
        replace: false,
        ensure: true,
        expected_revision: None,
        operation: OperationId(operation),
    }
}

#[test]
fn source_and_sink_from_two_clients_get_the_same_match() {
    let dir = TestDir::new("streams");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    let mut writer = RawClient::connect(&directory.listen).unwrap();
    let mut reader = RawClient::connect(&directory.listen).unwrap();
    assert_ne!(writer.node, reader.node, "each client gets its own node id");
    assert_eq!(writer.epoch, reader.epoch);

    // The Source waits (pending rendezvous) until the Sink arrives; then both are answered.
    let source_id = writer
        .send(open(
            &writer,
            "/data/s/pipe",
            StreamRole::Source,
            b"tcp:writer",
            1 << 64,
        ))
        .unwrap();
    let sink = reader
        .call(open(
            &reader,
            "/data/s/pipe",
            StreamRole::Sink,
            b"tcp:reader",
            2 << 64,
        ))
        .unwrap();
    let source = writer.recv().unwrap();
    assert_eq!(source.request_id, source_id);
    assert_eq!(
        source.epoch, writer.epoch,
        "the reply carries the welcome's epoch"
    );
    let (ReplyBody::StreamOpened(Ok(at_writer)), ReplyBody::StreamOpened(Ok(at_reader))) =
        (&source.body, &sink)
    else {
        panic!("both opens succeed: {source:?} / {sink:?}");
    };
    assert_eq!(at_writer, at_reader, "both sides get the same match");
    assert_eq!(at_writer.incarnation.epoch, writer.epoch);
    assert_eq!(at_writer.revision, at_writer.incarnation.revision);
    assert_eq!(at_writer.source, writer.address(7));
    assert_eq!(at_writer.sink, reader.address(7));
    assert_eq!(at_writer.source_descriptor.as_bytes(), b"tcp:writer");
    assert_eq!(at_writer.sink_descriptor.as_bytes(), b"tcp:reader");

    // The node is an active stream; a second Source is refused; a retry of the first open
    // (same operation id) gets the same match.
    match reader.lookup("/data/s/pipe").unwrap() {
        ReplyBody::LookedUp(Ok(node)) => {
            assert_eq!(node.kind, EntryKind::Stream);
            assert!(node.active, "the rendezvous is active");
        }
        other => panic!("lookup: {other:?}"),
    }
    let mut third = RawClient::connect(&directory.listen).unwrap();
    match third
        .call(open(
            &third,
            "/data/s/pipe",
            StreamRole::Source,
            b"x",
            3 << 64,
        ))
        .unwrap()
    {
        ReplyBody::StreamOpened(Err(NamespaceError::DuplicateStreamRole { role, .. })) => {
            assert_eq!(role, StreamRole::Source);
        }
        other => panic!("a second source: {other:?}"),
    }
    let retry = writer
        .call(open(
            &writer,
            "/data/s/pipe",
            StreamRole::Source,
            b"tcp:writer",
            1 << 64,
        ))
        .unwrap();
    assert_eq!(retry, ReplyBody::StreamOpened(Ok(at_writer.clone())));

    // A host sees a stream there: stat says so, get refuses with "wrong kind" (6).
    let stat = host.cli(&["stat", "/data/s/pipe"]);
    stat.expect_code(0, "stat of a stream");
    assert_eq!(
        String::from_utf8_lossy(&stat.stdout),
        format!("/data/s/pipe: stream, {}\n", at_writer.revision)
    );
    host.cli(&["get", "/data/s/pipe"])
        .expect_code(6, "get of a stream")
        .expect_stderr_line("dataplane: /data/s/pipe: is a stream, not a blob");

    // Close; the node stays, inactive.
    let closed = writer
        .call(DirectoryRequest::CloseStream {
            path: DataPath::new("/data/s/pipe").unwrap(),
            incarnation: at_writer.incarnation,
        })
        .unwrap();
    assert_eq!(closed, ReplyBody::StreamClosed(Ok(())));
    match reader.lookup("/data/s/pipe").unwrap() {
        ReplyBody::LookedUp(Ok(node)) => assert!(!node.active, "closed: {node:?}"),
        other => panic!("lookup after close: {other:?}"),
    }
}

/// Frames the hosts send to a test program posing as a host (its listener), forwarded.
fn serve_peers(listener: TcpListener, frames: mpsc::Sender<Envelope>) {
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let frames = frames.clone();
            thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                let Ok((_, mut reader)) = accept_blocking(&stream, None) else {
                    return;
                };
                while let Ok(Some(link)) = reader.read_frame::<Link>() {
                    if let Link::Frame(envelope) = link
                        && frames.send(envelope).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
}

/// The stream opens travel through two hosts' proxies: a test program says hello as a host to the
/// directory (so the hosts learn where to answer it), sends a `ProxyCall` for the Source to host
/// A's proxy and one for the Sink to host B's proxy, and gets the same match back from both.
#[test]
fn source_through_one_host_sink_through_another_get_the_same_match() {
    let dir = TestDir::new("streams-proxies");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "4M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "4M");

    // Pose as a host: a listener for the hosts' answers, a hello to the directory.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = listener.local_addr().unwrap().to_string();
    let (tx, frames) = mpsc::channel();
    serve_peers(listener, tx);
    let directory_link = TcpStream::connect(&directory.listen).unwrap();
    directory_link
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (welcome, _reader) = handshake_blocking(
        &directory_link,
        Who::Host {
            listen,
            boot_nonce: std::process::id().into(),
        },
        None,
    )
    .unwrap();
    let Link::Welcome {
        node,
        incarnation,
        epoch,
        ..
    } = welcome
    else {
        panic!("no Welcome: {welcome:?}");
    };
    // Who the hosts are: the membership records in the directory's log.
    let membership = dataplane_core::membership::Membership::recover(&directory.log_records())
        .expect("the log's membership records agree");
    let proxy_of = |host: &HostProc| {
        let (listen, member) = membership
            .hosts()
            .find(|(l, _)| *l == host.listen)
            .unwrap_or_else(|| panic!("{} is not a member", host.listen));
        (
            listen.to_owned(),
            Address::new(member.node, member.incarnation, PROXY_ACTOR),
        )
    };
    let me = |actor| Address::new(node, incarnation, actor);

    let mut links = Vec::new();
    for (host, role, actor, request_id) in [
        (&a, StreamRole::Source, 10, 1),
        (&b, StreamRole::Sink, 20, 2),
    ] {
        let (listen, proxy) = proxy_of(host);
        let link = TcpStream::connect(&listen).unwrap();
        link.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        prove_blocking(&link, Who::Peer { node, incarnation }, None).unwrap();
        let call = DirectoryCall {
            request_id: RequestId(request_id),
            reply_to: me(actor),
            request: DirectoryRequest::OpenStream {
                path: DataPath::new("/data/s/across").unwrap(),
                role,
                descriptor: Descriptor::new(vec![request_id as u8]).unwrap(),
                endpoint: me(actor),
                replace: false,
                ensure: true,
                expected_revision: None,
                operation: OperationId(u128::from(request_id) << 70),
            },
        };
        let envelope = Envelope {
            from: me(actor),
            to: proxy,
            message: Message::ProxyCall(call),
        };
        write_frame(&mut &link, &Link::Frame(envelope)).unwrap();
        links.push(link);
    }

    let mut matches = BTreeMap::new();
    while matches.len() < 2 {
        let envelope = frames
            .recv_timeout(Duration::from_secs(15))
            .expect("the hosts' proxies answer both opens");
        if let Message::Reply(reply) = envelope.message {
            assert_eq!(
                reply.epoch, epoch,
                "the proxy passes the directory's epoch on"
            );
            let ReplyBody::StreamOpened(Ok(m)) = reply.body else {
                panic!("open {:?} answered {:?}", reply.request_id, reply.body);
            };
            assert_eq!(
                envelope.to.actor,
                if reply.request_id.0 == 1 { 10 } else { 20 }
            );
            matches.insert(reply.request_id.0, m);
        }
    }
    assert_eq!(matches[&1], matches[&2], "both sides get the same match");
    assert_eq!(matches[&1].source, me(10));
    assert_eq!(matches[&1].sink, me(20));
    assert_eq!(matches[&1].incarnation.epoch, epoch);
    drop(links);
    drop(directory_link);
}

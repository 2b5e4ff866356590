//! A cluster with a key (`--cluster-key-file` on every node): hosts that present it work as
//! usual; a client, a host or a peer that presents no key or another key is refused with a
//! `Refused` frame and a closed connection, and a host the directory refuses exits with 78.

use std::ffi::OsString;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use dataplane_core::ids::NodeId;
use dataplane_io::frame::{FrameReader, write_frame};
use dataplane_io::net::{ClusterKey, Link, WRONG_KEY};
use dataplane_tests::raw::RawClient;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

fn key_option(file: &Path) -> Vec<OsString> {
    vec!["--cluster-key-file".into(), file.into()]
}

/// Says `hello` on a new connection to `address` and returns what comes back before the node
/// closes the connection.
fn hello_answers(address: &str, hello: &Link) -> Vec<Link> {
    let stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write_frame(&mut &stream, hello).unwrap();
    let mut reader = FrameReader::new(stream);
    let mut answers = Vec::new();
    while let Ok(Some(link)) = reader.read_frame::<Link>() {
        answers.push(link);
    }
    answers
}

fn refused() -> Vec<Link> {
    vec![Link::Refused {
        reason: WRONG_KEY.to_owned(),
    }]
}

#[test]
fn only_nodes_with_the_cluster_key_are_admitted() {
    let dir = TestDir::new("cluster-key");
    let secret = dir.join("cluster.key");
    std::fs::write(&secret, b"correct horse battery staple\n").unwrap();
    let key = ClusterKey::read(&secret).unwrap();
    let other = ClusterKey::from_secret(b"another secret of some length").unwrap();

    let directory = DirectoryProc::start_with(&dir, "directory", &key_option(&secret));
    let a = HostProc::start_with(
        &dir,
        "host-a",
        &directory.listen,
        "16M",
        &key_option(&secret),
    );
    let b = HostProc::start_with(
        &dir,
        "host-b",
        &directory.listen,
        "16M",
        &key_option(&secret),
    );

    // Hosts with the key work as usual: a blob crosses from A to B.
    let bytes = pattern(7, 700_001);
    a.cli_stdin(&["put", "/data/k/blob", "-"], &bytes)
        .expect_code(0, "put on A");
    let get = b.cli(&["get", "/data/k/blob"]);
    get.expect_code(0, "get on B");
    assert!(get.stdout == bytes, "B read other bytes");

    // Clients: the key is admitted; none, or another, is refused.
    RawClient::connect_with_key(&directory.listen, Some(key)).expect("the right key");
    for wrong in [None, Some(other)] {
        let error = RawClient::connect_with_key(&directory.listen, wrong).unwrap_err();
        assert!(
            error.to_string().contains("Refused"),
            "a client with {wrong:?} was not refused: {error}"
        );
    }
    for wrong in [None, Some(other)] {
        let hello = Link::HostHello {
            listen: "127.0.0.1:1".to_owned(),
            boot_nonce: 1,
            key: wrong,
        };
        assert_eq!(hello_answers(&directory.listen, &hello), refused());
    }

    // A peer saying hello to a host without the key is refused too.
    for wrong in [None, Some(other)] {
        let hello = Link::PeerHello {
            node: NodeId(999),
            incarnation: 1,
            key: wrong,
        };
        assert_eq!(hello_answers(&a.listen, &hello), refused());
    }

    // A host with another key: the directory refuses it and it exits with 78.
    let wrong_secret = dir.join("wrong.key");
    std::fs::write(&wrong_secret, b"another secret of some length").unwrap();
    let mut c = HostProc::spawn_with(
        &dir,
        "host-c",
        &directory.listen,
        "16M",
        &key_option(&wrong_secret),
    );
    let status = c.proc.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(78), "host-c: {}", c.proc.log_text());
    assert!(
        c.proc
            .log_text()
            .contains("dataplane-node: the directory refused this host: wrong cluster key"),
        "host-c says why: {}",
        c.proc.log_text()
    );

    // A secret that is too short is a configuration error before anything starts.
    let short = dir.join("short.key");
    std::fs::write(&short, b"short\n").unwrap();
    let mut d = HostProc::spawn_with(
        &dir,
        "host-d",
        &directory.listen,
        "16M",
        &key_option(&short),
    );
    let status = d.proc.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(78), "host-d: {}", d.proc.log_text());
    assert!(
        d.proc
            .log_text()
            .contains("short.key: the cluster secret has 5 bytes; at least 16 are needed"),
        "host-d says why: {}",
        d.proc.log_text()
    );

    // Everyone admitted keeps working.
    let get = a.cli(&["get", "/data/k/blob"]);
    get.expect_code(0, "get on A after the refusals");
    assert!(get.stdout == bytes, "A read other bytes");
}

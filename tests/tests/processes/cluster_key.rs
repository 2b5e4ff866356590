//! A cluster with a key (`--cluster-key-file` on every node): hosts that prove it work as
//! usual; a client, a host or a peer that proves no key or another key is refused with a
//! `Refused` frame and a closed connection, a recorded proof does not work twice, and a host
//! the directory refuses exits with 78.

use std::ffi::OsString;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use dataplane_core::ids::NodeId;
use dataplane_io::frame::{FrameReader, write_frame};
use dataplane_io::net::{ClusterKey, Connector, Link, Who};
use dataplane_tests::raw::RawClient;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

fn key_option(file: &Path) -> Vec<OsString> {
    vec!["--cluster-key-file".into(), file.into()]
}

/// A connector that does not check the acceptor's proof: says `who`'s hello, answers the
/// challenge with a proof made with `key` (or with `replayed`, a proof recorded elsewhere),
/// and returns what comes back before the node closes the connection, with the proof it sent.
fn proof_answers(
    address: &str,
    who: Who,
    key: Option<&ClusterKey>,
    replayed: Option<Link>,
) -> (Vec<Link>, Link) {
    let stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The same nonce every time: a replay sends the very same hello.
    let (connector, hello) = Connector::new(who, [7; 32], key);
    write_frame(&mut &stream, &hello).unwrap();
    let mut reader = FrameReader::new(stream.try_clone().unwrap());
    let challenge = reader.read_frame::<Link>().unwrap().expect("a challenge");
    assert!(matches!(challenge, Link::Challenge { .. }), "{challenge:?}");
    let proof = match replayed {
        Some(proof) => proof,
        None => match connector.answer(&challenge) {
            Ok(proof) => proof,
            // Our key is wrong: prove it anyway, as a hostile client would.
            Err(_) => {
                let Link::Challenge { nonce, .. } = challenge else {
                    unreachable!()
                };
                let bytes = dataplane_core::wire::encode_value(&hello, usize::MAX).unwrap();
                Link::Proof {
                    proof: key.and_then(|k| {
                        dataplane_core::admission::connector_proof(Some(k.bytes()), &bytes, &nonce)
                    }),
                }
            }
        },
    };
    write_frame(&mut &stream, &proof).unwrap();
    let mut answers = Vec::new();
    while let Ok(Some(link)) = reader.read_frame::<Link>() {
        answers.push(link);
    }
    (answers, proof)
}

fn refused() -> Vec<Link> {
    vec![Link::Refused {
        reason: WRONG_KEY.to_owned(),
    }]
}

const WRONG_KEY: &str = "wrong cluster key (see --cluster-key-file)";

#[test]
fn only_nodes_with_the_cluster_key_are_admitted() {
    let dir = TestDir::new("cluster-key");
    let secret = dir.join("cluster.key");
    std::fs::write(&secret, b"correct horse battery staple\n").unwrap();
    let key = dataplane_io::net::read_cluster_key(&secret).unwrap();
    let other = ClusterKey::from_secret(b"another secret of some length").unwrap();

    let metrics = dataplane_tests::free_address();
    let mut directory_args = key_option(&secret);
    directory_args.extend(["--metrics-listen".into(), metrics.clone().into()]);
    let directory = DirectoryProc::start_with(&dir, "directory", &directory_args);
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

    // Clients: the key is admitted; with none, or another, the client sees the directory
    // fail to prove the key (it never learns ours), and a client that answers anyway is
    // refused.
    RawClient::connect_with_key(&directory.listen, Some(key)).expect("the right key");
    for wrong in [None, Some(other)] {
        let error = RawClient::connect_with_key(&directory.listen, wrong).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("the other side could not prove the cluster key"),
            "a client with the wrong key did not notice: {error}"
        );
    }
    let host = || Who::Host {
        listen: "127.0.0.1:1".to_owned(),
        boot_nonce: 1,
    };
    for wrong in [None, Some(&other)] {
        let (answers, _) = proof_answers(&directory.listen, host(), wrong, None);
        assert_eq!(answers, refused());
    }
    // A recorded proof is worthless on another connection: the directory's nonce is new.
    let (answers, recorded) = proof_answers(&directory.listen, Who::Client, Some(&key), None);
    assert!(
        matches!(answers.first(), Some(Link::Welcome { .. })),
        "the right key is welcomed: {answers:?}"
    );
    let (answers, _) = proof_answers(&directory.listen, Who::Client, None, Some(recorded));
    assert_eq!(answers, refused(), "a replayed proof");

    // A peer saying hello to a host without the key is refused too.
    for wrong in [None, Some(&other)] {
        let peer = Who::Peer {
            node: NodeId(999),
            incarnation: 1,
        };
        let (answers, _) = proof_answers(&a.listen, peer, wrong, None);
        assert_eq!(answers, refused());
    }

    // A host with another key, and one with none: each finds that the directory cannot
    // prove the key, says so (the host rejected the directory, not the other way round) and
    // exits with 78; the directory counts and logs a wrong key for each.
    let wrong_key_refusals = || {
        crate::ops::scrape(&metrics)
            .lines()
            .find_map(|l| l.strip_prefix("dataplane_refusals_total{kind=\"wrong_key\"} "))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    let refusals_before = wrong_key_refusals();
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
        c.proc.log_text().contains(
            "dataplane-node: this host does not trust the directory: it could not prove the \
             cluster key: its cluster key is not this node's"
        ),
        "host-c says why: {}",
        c.proc.log_text()
    );
    let mut e = HostProc::spawn_with(&dir, "host-e", &directory.listen, "16M", &[]);
    let status = e.proc.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(78), "host-e: {}", e.proc.log_text());
    assert!(
        e.proc.log_text().contains(
            "it has a cluster key and this node has none (give this node --cluster-key-file)"
        ),
        "host-e says why: {}",
        e.proc.log_text()
    );
    dataplane_tests::wait_until(
        "the directory to count both hosts as wrong keys",
        Duration::from_secs(10),
        || wrong_key_refusals() >= refusals_before + 2,
    );
    assert!(
        directory.proc.log_text().contains("wrong cluster key"),
        "the directory logs a wrong key: {}",
        directory.proc.log_text()
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

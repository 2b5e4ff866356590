//! The replicas' own links (issue 19): with a cluster key, a replica that cannot prove it is
//! never admitted by the others (the two that can still elect a leader, and it alone never
//! serves); without one, what arrives on a peer port that is not a hello of the group, or not
//! an engine message from the replica that said hello, closes the connection and changes
//! nothing.

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use dataplane_tests::raw::RawClient;
use dataplane_tests::{ReplicaGroup, TestDir};

/// Whether a client is welcomed at `listen` within `within`.
fn serves_within(listen: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if RawClient::connect(listen).is_ok() {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn replicas_admit_only_peers_that_prove_the_cluster_key() {
    let dir = TestDir::new("replica-key");
    let (good, bad) = (dir.join("key"), dir.join("other-key"));
    fs::write(&good, "the replicas' shared secret, 32+ bytes").unwrap();
    fs::write(&bad, "another secret altogether, 32+ bytes").unwrap();
    let mut group = ReplicaGroup::start_with(&dir, "replica", 3, |i| {
        let key = if i == 2 { &bad } else { &good };
        vec![OsString::from("--cluster-key-file"), key.into()]
    });
    // Clients prove no key here: a leader refuses them, so find it by its log.
    let started = Instant::now();
    let leader = loop {
        if let Some(i) = (0..3).find(|&i| {
            group.replicas[i]
                .proc
                .log_text()
                .contains("serving: this replica leads")
        }) {
            break i;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "replicas 1 and 2 elect no leader"
        );
        thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(leader, 2, "the replica with another key leads");
    let log = group.replicas[leader].proc.log_text();
    assert!(
        log.contains("peer replica refused") && log.contains("from=3"),
        "the leader did not log replica 3's refusal"
    );
    // Alone with the two others gone, replica 3 never serves: it never had a vote.
    for i in 0..2 {
        group.replicas[i].proc.kill9();
    }
    thread::sleep(Duration::from_secs(3));
    assert!(
        !group.replicas[2]
            .proc
            .log_text()
            .contains("serving: this replica leads"),
        "the replica with another key served"
    );
}

/// One frame: the nodes' length prefix and `payload`.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// Connects to a peer port, reads the challenge, sends `bytes`; whether the replica then
/// closed the connection (within 3 s: the admission deadline is 5 s, so a connection still
/// open then was kept).
fn closed_after(peer: &str, bytes: &[u8]) -> bool {
    let mut stream = TcpStream::connect(peer).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut challenge = [0u8; 4 + 1 + 32];
    stream
        .read_exact(&mut challenge)
        .expect("a challenge first");
    let _ = stream.write_all(bytes);
    closed(&mut stream)
}

/// Whether the other end closed `stream` (before its read timeout).
fn closed(stream: &mut TcpStream) -> bool {
    let mut rest = [0u8; 64];
    match stream.read(&mut rest) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn anything_but_a_peer_of_the_group_on_a_peer_port_changes_nothing() {
    let dir = TestDir::new("replica-peers");
    let mut group = ReplicaGroup::start(&dir, "replica", 3);
    let leader = group.serving(Duration::from_secs(20));
    let epoch = RawClient::connect(&group.replicas[leader].listen)
        .unwrap()
        .epoch;
    // Postcard: variant 1 is `Hello { from, to, proof }`, variant 2 `Raft(bytes)`.
    let hello = |from: u8, to: u8| frame(&[1, from, to, 0]);
    for (i, peer) in group.peers.clone().iter().enumerate() {
        let me = i as u8 + 1;
        let other = if me == 1 { 2 } else { 1 };
        let mut garbage = vec![0xff; 300];
        garbage[..4].copy_from_slice(&40u32.to_le_bytes());
        let mut raft_garbage = hello(other, me);
        raft_garbage.extend(frame(&[2, 5, 1, 2, 3, 4, 5]));
        let attacks: Vec<(&str, Vec<u8>)> = vec![
            ("bytes that are no frame of ours", garbage),
            (
                "a frame over the hello bound",
                (1u32 << 30).to_le_bytes().to_vec(),
            ),
            ("a hello from a replica outside the group", hello(9, me)),
            ("a hello for another replica", hello(other, other)),
            ("a message before any hello", frame(&[2, 1, 0])),
            ("an undecodable engine message after a hello", raft_garbage),
        ];
        for (what, bytes) in attacks {
            assert!(
                closed_after(peer, &bytes),
                "replica {me} kept the connection after {what}"
            );
        }
    }
    // One connection per peer: a second hello of the same replica replaces the first (the
    // real replica's connection too, which it makes again).
    let peer = &group.peers[0];
    let mut first = TcpStream::connect(peer).unwrap();
    let mut second = TcpStream::connect(peer).unwrap();
    for stream in [&mut first, &mut second] {
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut challenge = [0u8; 4 + 1 + 32];
        stream.read_exact(&mut challenge).unwrap();
    }
    first.write_all(&hello(2, 1)).unwrap();
    thread::sleep(Duration::from_millis(200));
    second.write_all(&hello(2, 1)).unwrap();
    assert!(closed(&mut first), "the replaced connection is still open");
    drop(second);
    for replica in &mut group.replicas {
        replica.proc.assert_running();
    }
    // The same leader serves, at the same epoch.
    let client = RawClient::connect(&group.replicas[leader].listen).expect("the leader serves");
    assert_eq!(client.epoch, epoch, "the attacks changed the leadership");
    assert!(serves_within(
        &group.replicas[leader].listen,
        Duration::from_secs(1)
    ));
}

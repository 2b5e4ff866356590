//! A replica that may have lost entries it acknowledged rejoins by itself (issue 19): it
//! neither votes nor campaigns until it holds what the leader committed. A repair that cut
//! bytes of its log makes it rejoin without an operator's `--join`; a `--join` left on the
//! command line of a replica whose log is intact is ignored (a replica kept joining is no
//! voter, and a group that then loses another replica elects nobody).

use std::fs;
use std::time::Duration;

use dataplane_core::wire::ReplyBody;
use dataplane_io::log::{LogHeader, scan};
use dataplane_tests::raw::RawClient;
use dataplane_tests::{ReplicaGroup, TestDir, wait_until};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Registers `/rejoin/N` for each `n` in `range`.
fn register(client: &mut RawClient, range: std::ops::Range<u64>) {
    for n in range {
        let reply = client
            .register_actor(&format!("/rejoin/{n}"), n, 7)
            .expect("a reply");
        assert!(matches!(reply, ReplyBody::Registered(Ok(_))), "{reply:?}");
    }
}

#[test]
fn a_repaired_replica_rejoins_by_itself_and_a_stale_join_is_ignored() {
    let dir = TestDir::new("replica-rejoin");
    let mut group = ReplicaGroup::start(&dir, "replica", 3);
    let mut client = group.client(TIMEOUT);
    register(&mut client, 0..40);
    let leader = group.serving(TIMEOUT);
    let follower = (leader + 1) % 3;
    // Give the follower time to hold and sync every entry, then stop it and damage its log
    // in the middle of its synced records.
    std::thread::sleep(Duration::from_millis(500));
    let replica = &mut group.replicas[follower];
    replica.proc.kill9();
    let log = replica.data_dir.join("replica").join("log-0");
    let mut bytes = fs::read(&log).unwrap();
    let header = LogHeader::parse(&bytes).expect("a log header");
    let end = scan(&bytes, header.salt).valid_len;
    let middle = end / 2;
    for b in &mut bytes[middle..middle + 4] {
        *b ^= 0x5a;
    }
    fs::write(&log, &bytes).unwrap();

    // Refused as a single directory's damaged log is (exit 65, naming --repair-log).
    replica.proc.start();
    let status = replica.proc.wait_exit(TIMEOUT);
    assert_eq!(status.code(), Some(65), "{}", replica.proc.log_text());
    assert!(replica.proc.log_text().contains("--repair-log"));

    // Repaired, it rejoins by itself, catches up, and votes again (its mark is gone).
    replica.proc.start_once_with(&["--repair-log"]);
    replica.wait_ready();
    let mark = replica.data_dir.join("rejoining");
    let proc = &replica.proc;
    wait_until("the repaired replica to catch up", TIMEOUT, || {
        proc.log_text()
            .contains("joined: caught up with the leader")
    });
    let text = replica.proc.log_text();
    assert!(text.contains("rejoining: no vote"), "{text}");
    assert!(text.contains("repaired=true"), "{text}");
    assert!(!mark.exists(), "the rejoin mark outlived the catch-up");

    // A stale --join on an intact log is ignored: it starts as a voter.
    replica.proc.kill9();
    replica.proc.start_once_with(&["--join"]);
    replica.wait_ready();
    let proc = &replica.proc;
    wait_until("the stale --join to be ignored", TIMEOUT, || {
        proc.log_text().contains("ignoring --join")
    });
    assert!(!mark.exists());

    // The group lost nothing and still takes mutations; the repaired replica can lead: stop
    // the two others' leader and see a client served.
    register(&mut client, 40..50);
    let leader = group.serving(TIMEOUT);
    group.replicas[leader].proc.kill9();
    let mut client = group.client(TIMEOUT);
    for n in 0..50 {
        let reply = client.lookup(&format!("/rejoin/{n}")).expect("a reply");
        assert!(
            matches!(reply, ReplyBody::LookedUp(Ok(_))),
            "/rejoin/{n} after two failovers: {reply:?}"
        );
    }
}

//! An operator hands a replica group's leadership to another voter
//! (`dataplane-node replicas transfer-leader ID`): the named voter serves at the next term
//! within about a round trip, the old leader stops serving at once, a host follows, and
//! nothing acknowledged is lost. Refused with the reason (exit 5) for the leader itself and a
//! replica that is not a voter; a replica that does not serve answers that it does not (exit
//! 75).

use std::time::{Duration, Instant};

use dataplane_tests::{HostProc, ReplicaGroup, TestDir, pattern, wait_until};

const TIMEOUT: Duration = Duration::from_secs(30);

/// `dataplane-node replicas --data-dir DIR ARGS...` for replica `i`.
fn replicas(group: &ReplicaGroup, i: usize, args: &[&str]) -> (i32, String) {
    group.control(i, args)
}

#[test]
fn the_leader_hands_over_to_the_voter_the_operator_names() {
    let dir = TestDir::new("transfer-leader");
    let mut group = ReplicaGroup::start(&dir, "replica", 3);
    let host = HostProc::start(&dir, "host", &group.listens(), "16M");
    let mut written = Vec::new();
    for round in 0..3 {
        let leader = group.serving(TIMEOUT);
        let to = (leader + 1 + round % 2) % 3;
        let (id, leader_id) = ((to + 1).to_string(), (leader + 1).to_string());
        // Refusals first: they change nothing.
        let (code, text) = replicas(&group, leader, &["transfer-leader", &leader_id]);
        assert_eq!(code, 5, "{text}");
        assert!(text.contains("leads already"), "{text}");
        let (code, text) = replicas(&group, leader, &["transfer-leader", "9"]);
        assert_eq!(code, 5, "{text}");
        assert!(text.contains("not a voter"), "{text}");
        let (code, text) = replicas(&group, to, &["transfer-leader", &id]);
        assert_eq!(code, 75, "{text}");
        assert_eq!(group.serving(TIMEOUT), leader, "a refusal moved nothing");

        let path = format!("/data/before-{round}");
        let bytes = pattern(round as u64, 4_000);
        host.cli_stdin(&["put", &path, "-"], &bytes)
            .expect_code(0, "a put before the transfer");
        written.push((path, bytes));
        let started = Instant::now();
        let (code, text) = replicas(&group, leader, &["transfer-leader", &id]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains(&format!("to replica {id}")), "{text}");
        wait_until(&format!("replica {id} to serve"), TIMEOUT, || {
            replicas(&group, to, &["status"]).1.contains("serving=true")
        });
        let took = started.elapsed();
        assert_eq!(group.serving(TIMEOUT), to);
        let path = format!("/data/after-{round}");
        let bytes = pattern(100 + round as u64, 4_000);
        host.cli_stdin(&["--timeout", "20", "put", &path, "-"], &bytes)
            .expect_code(0, "a put after the transfer");
        written.push((path, bytes));
        eprintln!(
            "round {round}: replica {} handed over to replica {id}; serving after {} ms",
            leader + 1,
            took.as_millis()
        );
    }
    for (path, bytes) in &written {
        let got = host.cli(&["get", path]);
        got.expect_code(0, "a get of an acknowledged blob");
        assert!(got.stdout == *bytes, "{path}: other bytes");
    }
}

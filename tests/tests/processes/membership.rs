//! The membership (node ids, incarnations, the directory's boots) lives in the directory's own
//! log, each change synced before the host hears it: across kill -9 of hosts and of the
//! directory, an id is never handed out twice and an incarnation never goes back.

use std::time::Duration;

use dataplane_core::ids::NodeId;
use dataplane_core::membership::Membership;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern, wait_until};

fn membership(directory: &DirectoryProc) -> Membership {
    Membership::recover(&directory.log_records()).expect("the log's membership records agree")
}

fn member(m: &Membership, listen: &str) -> (NodeId, u64) {
    let (_, member) = m
        .hosts()
        .find(|(l, _)| *l == listen)
        .unwrap_or_else(|| panic!("{listen} is not a member"));
    (member.node, member.incarnation)
}

#[test]
fn the_membership_is_in_the_log_and_survives_kill9() {
    let dir = TestDir::new("membership");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let mut a = HostProc::start(&dir, "host-a", &directory.listen, "4M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "4M");
    a.cli_stdin(&["put", "/data/m/1", "-"], &pattern(1, 100))
        .expect_code(0, "put on A");
    let first = membership(&directory);
    let (a_node, a_incarnation) = member(&first, &a.listen);
    let (b_node, _) = member(&first, &b.listen);
    assert_ne!(a_node, b_node);
    assert_eq!(a_incarnation, 1);
    assert_eq!(first.boots(), 1);

    // A restarts: its incarnation rises, in the log, before it is welcomed.
    a.restart();
    a.cli_stdin(&["put", "/data/m/2", "-"], &pattern(2, 100))
        .expect_code(0, "put on the restarted A");
    assert_eq!(member(&membership(&directory), &a.listen), (a_node, 2));

    // The directory is killed and restarted: the table and the boot count come back from the
    // log, and the hosts reconnect as who they were.
    directory.restart();
    wait_until(
        "A to serve through the restarted directory",
        Duration::from_secs(20),
        || {
            a.cli_stdin(&["put", "/data/m/3", "-"], &pattern(3, 100))
                .code
                == 0
        },
    );
    let after = membership(&directory);
    assert_eq!(after.boots(), 2);
    assert_eq!(member(&after, &a.listen), (a_node, 2));
    assert_eq!(member(&after, &b.listen).0, b_node);
    assert_eq!(after.hosts().count(), 2);
    assert!(
        !directory.data_dir.join("membership").exists(),
        "no membership file beside the log"
    );
    assert!(directory.data_dir.join("created").exists());
}

/// `--members-max 2 --forget-hosts-away-for 5`: a third host waits while both members are
/// connected, then takes the place of the one that went away and had nothing in the
/// namespace, never of the one whose blob the directory still names; the forgotten id is
/// never handed out again, across a kill -9 of the directory.
#[test]
fn a_full_membership_makes_room_by_forgetting_a_host_long_away_with_nothing_in_the_namespace() {
    let dir = TestDir::new("membership-full");
    let metrics = dataplane_tests::free_address();
    let extra: Vec<std::ffi::OsString> = [
        "--members-max",
        "2",
        "--forget-hosts-away-for",
        "5",
        "--metrics-listen",
        &metrics,
    ]
    .iter()
    .map(Into::into)
    .collect();
    let mut directory = DirectoryProc::start_with(&dir, "directory", &extra);
    // C first (the longest known, the first a full table would forget), with a blob on it;
    // then A, with nothing.
    let mut c = HostProc::start(&dir, "host-c", &directory.listen, "4M");
    c.cli_stdin(&["put", "/data/kept", "-"], &pattern(1, 100))
        .expect_code(0, "put on C");
    let mut a = HostProc::start(&dir, "host-a", &directory.listen, "4M");
    let before = membership(&directory);
    let (c_node, a_node) = (member(&before, &c.listen).0, member(&before, &a.listen).0);
    assert!(c_node < a_node);

    // Both connected: B waits (it neither stops nor gets in).
    let mut b = HostProc::spawn_with(&dir, "host-b", &directory.listen, "4M", &[]);
    wait_until(
        "B to be told there is no room",
        Duration::from_secs(20),
        || b.proc.log_text().contains("membership is full"),
    );
    b.proc.assert_running();
    assert_eq!(membership(&directory).hosts().count(), 2);

    // Both go away. B gets in once A has been away for 5 s (B asks every 2 s): A is forgotten,
    // C (whose blob the namespace names) is not.
    c.proc.kill9();
    a.proc.kill9();
    let gone = std::time::Instant::now();
    b.wait_ready();
    assert!(
        gone.elapsed() >= Duration::from_secs(5),
        "B got in {:?} after A went away",
        gone.elapsed()
    );
    let after = membership(&directory);
    let b_node = member(&after, &b.listen).0;
    assert!(b_node > a_node, "a new id: {b_node} after {a_node}");
    assert_eq!(member(&after, &c.listen).0, c_node);
    assert!(after.hosts().all(|(l, _)| l != a.listen), "A is forgotten");
    assert!(
        directory
            .proc
            .log_text()
            .contains("host forgotten to make room"),
        "{}",
        directory.proc.log_text()
    );
    let body = crate::ops::scrape(&metrics);
    assert_eq!(
        crate::ops::sample(&body, "dataplane_directory_members_forgotten_total"),
        Some(1.0)
    );
    assert_eq!(
        crate::ops::sample(&body, "dataplane_directory_members"),
        Some(2.0)
    );
    // B serves, and C's blob is still bound. (B publishes nothing: a blob on it would keep it
    // from being forgotten below.)
    b.cli(&["stat", "/data/kept"])
        .expect_code(0, "stat of C's blob through B");

    // The directory is killed: the table comes back as it was, and the next new host (A
    // again, its process restarted: a new member now) is not given A's old id, nor B's.
    directory.restart();
    b.wait_ready();
    let recovered = membership(&directory);
    assert_eq!(member(&recovered, &b.listen).0, b_node);
    assert_eq!(member(&recovered, &c.listen).0, c_node);
    b.proc.kill9();
    a.proc.start();
    a.wait_ready();
    let last = membership(&directory);
    let a_again = member(&last, &a.listen).0;
    assert!(
        a_again > b_node,
        "A came back as {a_again}: ids {a_node} and {b_node} were handed out already"
    );
    assert_eq!(member(&last, &c.listen).0, c_node);
}

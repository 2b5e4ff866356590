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

//! A host is killed with SIGKILL: reads of its blobs from the other host fail with a typed
//! error (exit 75, "the blob's source failed: ..."), at once since its port refuses the
//! connection, the other host keeps working, a
//! replacement put of a dead host's path works, and after the killed host restarts with the
//! same `--listen` its gone report is applied (the directory logs `NodeRestarted`), every
//! retirement obligation toward its dead sources completes, and its old blobs are told lost
//! (exit 65): their bytes died with the host's previous incarnation.

use std::time::{Duration, Instant};

use dataplane_core::ids::Address;
use dataplane_core::log::LogRecord;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern, wait_until};

/// Exit status of the CLI for "temporarily unavailable" (EX_TEMPFAIL).
const TEMPFAIL: i32 = 75;
/// Exit status of the CLI for "the blob is lost or damaged".
const LOST: i32 = 65;

#[test]
fn kill9_a_host_then_restart_it() {
    let dir = TestDir::new("kill-host");
    let directory = DirectoryProc::start(&dir, "directory");
    let mut a = HostProc::start(&dir, "host-a", &directory.listen, "16M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "16M");

    let k1 = pattern(11, 1_000_000);
    let k2 = pattern(12, 5_000);
    a.cli_stdin(&["put", "/data/h/k1", "-"], &k1)
        .expect_code(0, "put k1 on A");
    a.cli_stdin(&["put", "/data/h/k2", "-"], &k2)
        .expect_code(0, "put k2 on A");
    let get = b.cli(&["get", "/data/h/k1"]);
    get.expect_code(0, "get k1 on B while A lives");
    assert!(get.stdout == k1);

    a.proc.kill9();

    // B cannot read A's blob: a typed failure, in one line, with the temporary-failure code
    // (the directory cannot tell a dead host from a slow one), as soon as A's port refuses
    // B's connection, not after every chunk attempt (10 s).
    let started = Instant::now();
    let get = b.cli(&["get", "/data/h/k1"]);
    get.expect_code(TEMPFAIL, "get of a dead host's blob")
        .expect_plain_error();
    assert!(
        get.stderr
            .starts_with("dataplane: the blob's source failed: the source's host (n")
            && get
                .stderr
                .contains("refused the connection: it is not running"),
        "{}",
        get.stderr
    );
    let took = started.elapsed();
    eprintln!("the read of a dead host's blob failed after {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "a refused connection is an answer: the read took {took:?}"
    );

    // B keeps working, and may replace the dead host's blob.
    let own = pattern(13, 300_000);
    b.cli_stdin(&["put", "/data/h/own", "-"], &own)
        .expect_code(0, "put on B while A is dead");
    let get = b.cli(&["get", "/data/h/own"]);
    get.expect_code(0, "get on B while A is dead");
    assert!(get.stdout == own);
    let k2_new = pattern(14, 7_000);
    b.cli_stdin(&["put", "/data/h/k2", "-"], &k2_new)
        .expect_code(0, "replace the dead host's k2 from B");
    let get = b.cli(&["get", "/data/h/k2"]);
    get.expect_code(0, "get the replaced k2 on B");
    assert!(get.stdout == k2_new);

    // A comes back with the same --listen: a new incarnation of the same node.
    a.restart();
    let records = || directory.log_records();
    let mut restarted = None;
    wait_until(
        "the directory to log the restarted host's gone report",
        Duration::from_secs(20),
        || {
            restarted = records().into_iter().find_map(|r| match r {
                LogRecord::NodeRestarted { node, incarnation } => Some((node, incarnation)),
                _ => None,
            });
            restarted.is_some()
        },
    );
    let (node, incarnation) = restarted.unwrap();
    assert_eq!(incarnation, 2, "the restarted host is incarnation 2");
    // Every retirement obligation completes, among them the one toward A's dead k2 source.
    let mut retired_dead: Vec<Address> = Vec::new();
    wait_until(
        "every retirement obligation to complete",
        Duration::from_secs(20),
        || {
            let records = records();
            let owed: Vec<Address> = records
                .iter()
                .filter_map(|r| match r {
                    LogRecord::Committed {
                        retire: Some(source),
                        ..
                    } => Some(*source),
                    _ => None,
                })
                .collect();
            retired_dead = owed.iter().copied().filter(|s| s.node == node).collect();
            owed.iter().all(|source| {
                records.iter().any(
                    |r| matches!(r, LogRecord::RetirementDone { source: done } if done == source),
                )
            })
        },
    );
    assert_eq!(
        retired_dead.len(),
        1,
        "k2's replacement owed one retirement to the dead host: {retired_dead:?}"
    );
    assert!(retired_dead[0].incarnation < incarnation);

    // A's old blob is unreadable for good now (its bytes died with A's previous incarnation):
    // the directory, which has A's gone report, says so, and the read fails fast.
    let started = Instant::now();
    b.cli(&["get", "/data/h/k1"])
        .expect_code(LOST, "get of a blob of the host's previous incarnation")
        .expect_stderr_line(
            "dataplane: /data/h/k1: lost: its bytes lived on a host that restarted",
        );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a lost blob fails fast ({:?})",
        started.elapsed()
    );

    // The surviving host replaces it; both hosts read the new blob.
    let k1_new = pattern(15, 2_000_000);
    b.cli_stdin(&["put", "/data/h/k1", "-"], &k1_new)
        .expect_code(0, "replace k1 from B");
    for (name, host) in [("A", &a), ("B", &b)] {
        let get = host.cli(&["get", "/data/h/k1"]);
        get.expect_code(0, &format!("get the new k1 on {name}"));
        assert!(
            get.stdout == k1_new,
            "{name} read other bytes for the new k1"
        );
    }
    // The restarted A publishes again, and B reads it.
    let fresh = pattern(16, 600_000);
    a.cli_stdin(&["put", "/data/h/fresh", "-"], &fresh)
        .expect_code(0, "put on the restarted A");
    let get = b.cli(&["get", "/data/h/fresh"]);
    get.expect_code(0, "get A's new blob on B");
    assert!(get.stdout == fresh);
}

//! A host whose process stops without closing anything (SIGSTOP: its kernel keeps every
//! connection open, and still accepts new ones into its listen backlog) must not hold up the
//! rest of the cluster: a read of its blob through another host fails with a typed temporary
//! error instead of hanging, the directory lets go of its connection once it has carried
//! nothing for `--host-silence`, and once the host continues it is welcomed back as the same
//! incarnation and its blobs are served again. The simulator's host pauses check the same
//! rules (SIMULATION.md, "Host pauses").

use std::time::{Duration, Instant};

use dataplane_core::log::LogRecord;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, cli_with, pattern, wait_until};

/// Exit status of the CLI for "temporarily unavailable" (EX_TEMPFAIL).
const TEMPFAIL: i32 = 75;
/// The directory's host-silence bound in this test (its smallest setting).
const HOST_SILENCE_SECS: u64 = 3;
/// How long a read of a stopped host's blob may take before the test fails: the reading host
/// gives up a silent connection within its 1 s silence bound and the read within its chunk
/// attempts (10 s: a stopped host may continue); generous for a loaded machine.
const READ_BOUND: Duration = Duration::from_secs(20);

#[test]
fn a_stopped_host_is_let_go_and_welcomed_back() {
    let dir = TestDir::new("paused-host");
    let directory = DirectoryProc::start_with(
        &dir,
        "directory",
        &[
            "--host-silence".into(),
            HOST_SILENCE_SECS.to_string().into(),
        ],
    );
    let mut a = HostProc::start(&dir, "host-a", &directory.listen, "16M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "16M");
    let k = pattern(31, 300_000);
    a.cli_stdin(&["put", "/data/p/k", "-"], &k)
        .expect_code(0, "put on A");
    // B reads it once, so it holds a connection to A when A stops.
    let get = b.cli(&["get", "/data/p/k"]);
    get.expect_code(0, "get on B while A runs");
    assert!(get.stdout == k);
    let let_go = "host connection closed: it sent nothing";
    assert_eq!(directory.proc.log_text().matches(let_go).count(), 0);

    a.proc.signal("STOP");
    let stopped = Instant::now();

    // A read of A's blob through B, meanwhile.
    let socket = b.socket.clone();
    let read = std::thread::spawn(move || {
        let get = cli_with(
            &socket,
            &["--timeout", "60", "get", "/data/p/k"],
            None,
            Duration::from_secs(90),
        );
        (get, stopped.elapsed())
    });

    // The directory lets go of A's connection once it carried nothing for the bound, and no
    // sooner (A pinged it four times a second until it stopped; a second of slack for a loaded
    // machine, whose pings may come late).
    wait_until(
        "the directory to let go of the stopped host",
        Duration::from_secs(HOST_SILENCE_SECS + 10),
        || directory.proc.log_text().contains(let_go),
    );
    let after = stopped.elapsed();
    eprintln!("the directory let go of the stopped host {after:?} after the stop");
    assert!(
        after >= Duration::from_secs(HOST_SILENCE_SECS - 1),
        "the directory let go of a host {after:?} after it stopped, before its bound"
    );

    // The read fails, typed, instead of waiting for A.
    let (get, took) = read.join().expect("the read's thread");
    eprintln!(
        "the read of a stopped host's blob ended after {took:?}: {}",
        get.stderr.trim()
    );
    get.expect_code(TEMPFAIL, "get of a stopped host's blob")
        .expect_plain_error();
    assert!(
        took < READ_BOUND,
        "the read of a stopped host's blob took {took:?}"
    );

    // B keeps working meanwhile.
    let own = pattern(32, 50_000);
    b.cli_stdin(&["put", "/data/p/own", "-"], &own)
        .expect_code(0, "put on B while A is stopped");

    // A continues: it finds its connection closed, connects again and is welcomed as the
    // incarnation it runs as; its blob is served again.
    a.proc.signal("CONT");
    let continued = Instant::now();
    wait_until("B to read A's blob again", Duration::from_secs(30), || {
        let get = b.cli(&["get", "/data/p/k"]);
        get.code == 0 && get.stdout == k
    });
    eprintln!(
        "B read A's blob again {:?} after A continued",
        continued.elapsed()
    );
    let get = a.cli(&["get", "/data/p/own"]);
    get.expect_code(0, "A reads B's blob after it continued");
    assert!(get.stdout == own);
    // Welcomed as what it runs as: a host welcomed as another incarnation stops, and nothing
    // told the directory it restarted.
    a.proc.assert_running();
    assert!(
        !directory
            .log_records()
            .iter()
            .any(|r| matches!(r, LogRecord::NodeRestarted { .. })),
        "the directory recorded a restart of a host that only stopped"
    );
}

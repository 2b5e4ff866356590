//! Streams for programs (issue 17) on real processes: `dataplane stream-recv` on one host and
//! `dataplane stream-send` on another meet at a path and move bytes over the reference
//! transport; a reader killed with SIGKILL while it waits has its open retracted by its host
//! (a new reader may open the same path without `--replace`); a writer that nobody reads
//! gives up after `--wait` (exit 75) and leaves nothing behind.

use std::fs;
use std::time::Duration;

use dataplane_tests::{DirectoryProc, HostProc, Proc, TestDir, binaries, pattern, wait_until};

/// The CLI's exit status for "temporary".
const TEMPFAIL: i32 = 75;

fn recv(dir: &TestDir, host: &HostProc, name: &str, path: &str, out: &str) -> Proc {
    Proc::spawn(
        name,
        &binaries().cli,
        vec![
            "--socket".into(),
            host.socket.clone().into(),
            "stream-recv".into(),
            path.into(),
            dir.join(out).into(),
            "--wait".into(),
            "30".into(),
        ],
        dir.join(&format!("{name}.log")),
    )
}

#[test]
fn programs_on_two_hosts_stream_bytes_and_a_dead_waiter_is_retracted() {
    let dir = TestDir::new("program-streams");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "8M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "8M");
    let data = pattern(77, 5_000_000);
    fs::write(dir.join("in.bin"), &data).unwrap();
    let input = dir.join("in.bin").to_string_lossy().into_owned();

    // A reader on A, a writer on B: the bytes arrive whole.
    let mut reader = recv(&dir, &a, "recv-1", "/data/pipe", "out-1.bin");
    b.cli(&["stream-send", "/data/pipe", &input, "--wait", "30"])
        .expect_code(0, "stream-send to a waiting reader");
    let status = reader.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{}", reader.log_text());
    assert!(fs::read(dir.join("out-1.bin")).unwrap() == data);

    // A reader killed while it waits: its host retracts the open, so another reader may open
    // the same path without --replace, and gets the next writer's bytes.
    let mut doomed = recv(&dir, &a, "recv-doomed", "/data/pipe2", "out-doomed.bin");
    wait_until("the doomed reader to wait", Duration::from_secs(10), || {
        a.cli(&["stat", "/data/pipe2"]).code == 0
    });
    doomed.kill9();
    let mut second = recv(&dir, &a, "recv-2", "/data/pipe2", "out-2.bin");
    std::thread::sleep(Duration::from_millis(300));
    b.cli_stdin(
        &["stream-send", "/data/pipe2", "-", "--wait", "30"],
        b"after the kill",
    )
    .expect_code(0, "stream-send to the second reader");
    let status = second.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{}", second.log_text());
    assert_eq!(fs::read(dir.join("out-2.bin")).unwrap(), b"after the kill");

    // A writer nobody reads gives up, in one line, and holds nothing afterwards.
    b.cli(&["stream-send", "/data/pipe3", &input, "--wait", "1"])
        .expect_code(TEMPFAIL, "a writer without a reader")
        .expect_stderr_line(
            "dataplane: /data/pipe3: no reader opened the other side in the time allowed (--wait)",
        );
    let sessions = b.cli(&["sessions"]);
    sessions.expect_code(0, "sessions on B");
    assert!(
        sessions.stderr.contains("0 live session(s)"),
        "{}",
        sessions.stderr
    );
}

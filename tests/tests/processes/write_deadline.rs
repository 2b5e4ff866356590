//! A child that stops in the middle of a write gives its arena space back: the host aborts a
//! write not sealed within `--write-deadline-secs` of its grant, frees its lease (the child
//! writes a staging buffer of its own, so nobody writes the lease after), and the child hears
//! `WriteExpired` when it comes back. A put waiting for that space gets it.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use dataplane_core::error::DataPlaneError;
use dataplane_io::child::{ChildError, ChildSession};
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

/// `key=value`'s value in a line of `dataplane arena`.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[test]
fn a_stopped_writer_gives_its_arena_space_back_at_the_write_deadline() {
    let dir = TestDir::new("write-deadline");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start_with(
        &dir,
        "host",
        &directory.listen,
        "8M",
        &["--write-deadline-secs".into(), "2".into()],
    );
    let arena_used = || {
        let out = host.cli(&["arena"]);
        out.expect_code(0, "dataplane arena");
        field(&String::from_utf8(out.stdout).unwrap(), "used")
    };

    // A writer granted 6 MB of the 8 MB arena stops (its fill does not return) for 8 s.
    let socket = host.socket.clone();
    let (granted_tx, granted_rx) = mpsc::channel();
    let stopped = std::thread::spawn(move || {
        let mut session = ChildSession::connect(&socket).expect("attach");
        let result = session.try_write("/data/w/stopped", 6 << 20, false, |payload| {
            granted_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(8));
            payload.fill(1);
            Ok::<(), std::io::Error>(())
        });
        let _ = session.close();
        result
    });
    granted_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the first write was granted");
    assert!(arena_used() >= 6 << 20, "the stopped write holds its lease");

    // Another 6 MB put waits for space, and gets it once the deadline freed the lease: long
    // before the stopped writer comes back, and long before the put's own allocation wait.
    let bytes = pattern(5, 6 << 20);
    let started = Instant::now();
    let put = host.cli_stdin(&["put", "/data/w/next", "-"], &bytes);
    let took = started.elapsed();
    put.expect_code(0, "a put that needs the stopped writer's space");
    assert!(took < Duration::from_secs(7), "the put waited {took:?}");
    assert_eq!(host.cli(&["get", "/data/w/next"]).stdout, bytes);

    // The stopped writer comes back to a typed error; nothing of it was published.
    match stopped.join().unwrap() {
        Err(ChildError::Failed(DataPlaneError::WriteExpired { after_secs: 2 })) => {}
        other => panic!("the stopped writer's seal: {other:?}"),
    }
    host.cli(&["stat", "/data/w/stopped"])
        .expect_code(2, "the expired write published nothing");
    // Only the published blob holds the arena now.
    let used = arena_used();
    assert!(
        (6 << 20..7 << 20).contains(&used),
        "used={used}: the expired write's lease is free"
    );
}

#[test]
fn a_put_that_finds_no_room_says_how_much_of_how_much() {
    let dir = TestDir::new("arena-full");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start_with(
        &dir,
        "host",
        &directory.listen,
        "4M",
        &["--allocation-wait-secs".into(), "2".into()],
    );
    // A writer holds 3 MB of the 4 MB arena while the put waits.
    let socket = host.socket.clone();
    let (granted_tx, granted_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut session = ChildSession::connect(&socket).expect("attach");
        let result = session.try_write("/data/f/held", 3 << 20, false, |payload| {
            granted_tx.send(()).unwrap();
            let _ = done_rx.recv_timeout(Duration::from_secs(30));
            payload.fill(2);
            Ok::<(), std::io::Error>(())
        });
        let _ = session.close();
        result
    });
    granted_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the first write was granted");
    let input = dir.join("two.bin");
    std::fs::write(&input, pattern(9, 2 << 20)).unwrap();
    let started = Instant::now();
    let put = host.cli(&["put", "/data/f/more", input.to_str().unwrap()]);
    let took = started.elapsed();
    put.expect_code(75, "a put with no room")
        .expect_plain_error();
    assert!(
        put.stderr
            .contains("the host's arena is full: no room for 2097152 bytes of its 4194304"),
        "{}",
        put.stderr
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    done_tx.send(()).unwrap();
    assert!(
        matches!(holder.join().unwrap(), Ok(Ok(_))),
        "the holder publishes"
    );
}

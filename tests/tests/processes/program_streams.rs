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
    recv_with(dir, host, name, path, out, &[])
}

/// [`recv`] with `extra` options after `--wait 30`.
fn recv_with(
    dir: &TestDir,
    host: &HostProc,
    name: &str,
    path: &str,
    out: &str,
    extra: &[&str],
) -> Proc {
    let mut args: Vec<std::ffi::OsString> = vec![
        "--socket".into(),
        host.socket.clone().into(),
        "stream-recv".into(),
        path.into(),
        dir.join(out).into(),
        "--wait".into(),
        "30".into(),
    ];
    args.extend(extra.iter().map(Into::into));
    Proc::spawn(
        name,
        &binaries().cli,
        args,
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
    // `sessions` lists one line per live session, on stdout, and nothing else.
    assert!(
        sessions.stdout.is_empty() && sessions.stderr.is_empty(),
        "{sessions:?}"
    );
}

#[test]
fn the_library_hears_a_displacement_and_a_wait_that_runs_out() {
    use dataplane_core::wire::StreamRole;
    use dataplane_io::child::{ChildError, ChildSession, StreamOpen};

    let dir = TestDir::new("library-streams");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "4M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "4M");
    let socket_a = a.socket.clone();
    // A sink on A waits (in its own thread: the call blocks until the match).
    let sink = std::thread::spawn(move || {
        let mut session = ChildSession::connect(&socket_a).expect("attach on A");
        let stream = session
            .open_stream(
                "/data/s",
                StreamRole::Sink,
                b"sink",
                StreamOpen::default(),
                Some(Duration::from_secs(30)),
            )
            .expect("the sink is matched");
        (session, stream)
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut source = ChildSession::connect(&b.socket).expect("attach on B");
    let first = source
        .open_stream(
            "/data/s",
            StreamRole::Source,
            b"source-1",
            StreamOpen::default(),
            Some(Duration::from_secs(30)),
        )
        .expect("the source is matched");
    assert_eq!(first.peer_descriptor(), b"sink");
    let (mut sink_session, sink_stream) = sink.join().unwrap();
    assert_eq!(sink_stream.peer_descriptor(), b"source-1");
    assert!(!sink_session.displaced(&sink_stream).unwrap());

    // A replacing source displaces the rendezvous: both old sides hear it, and the new
    // source, with no sink left, gives up after its wait.
    let mut replacer = ChildSession::connect(&b.socket).expect("another child on B");
    let how = StreamOpen {
        replace: true,
        ..StreamOpen::default()
    };
    let waited = replacer.open_stream(
        "/data/s",
        StreamRole::Source,
        b"source-2",
        how,
        Some(Duration::from_secs(2)),
    );
    assert!(matches!(waited, Err(ChildError::TimedOut)), "{waited:?}");
    wait_until(
        "the sink to hear its displacement",
        Duration::from_secs(10),
        || sink_session.displaced(&sink_stream).unwrap(),
    );
    wait_until(
        "the source to hear its displacement",
        Duration::from_secs(10),
        || source.displaced(&first).unwrap(),
    );
    // Closing a displaced stream is fine, and nothing is left behind.
    sink_session.close_stream(sink_stream).unwrap();
    source.close_stream(first).unwrap();
    for session in [sink_session, source, replacer] {
        session.close().unwrap();
    }
    let sessions = a.cli(&["sessions"]);
    // `sessions` lists one line per live session, on stdout, and nothing else.
    assert!(
        sessions.stdout.is_empty() && sessions.stderr.is_empty(),
        "{sessions:?}"
    );
}

/// Strangers connecting to a reader's transport port first, sending nothing, delay no writer:
/// the reader reads every connection's token without blocking (it used to read one connection
/// at a time, 5 s each, so 40 silent strangers outlasted its 30 s wait for the writer).
#[test]
fn strangers_at_a_readers_port_delay_no_writer() {
    let dir = TestDir::new("program-streams-strangers");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "8M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "8M");
    let listen = dataplane_tests::free_address();
    let mut reader = recv_with(
        &dir,
        &a,
        "recv-strangers",
        "/data/strangers",
        "out-strangers.bin",
        &["--listen", &listen],
    );
    wait_until("the reader to wait", Duration::from_secs(10), || {
        a.cli(&["stat", "/data/strangers"]).code == 0
    });
    let strangers: Vec<std::net::TcpStream> = (0..40)
        .map(|i| {
            std::net::TcpStream::connect(&listen)
                .unwrap_or_else(|e| panic!("stranger {i} at the reader's port: {e}"))
        })
        .collect();
    b.cli_stdin(
        &["stream-send", "/data/strangers", "-", "--wait", "30"],
        b"past the strangers",
    )
    .expect_code(0, "stream-send past 40 silent strangers");
    let status = reader.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{}", reader.log_text());
    assert_eq!(
        fs::read(dir.join("out-strangers.bin")).unwrap(),
        b"past the strangers"
    );
    drop(strangers);
}

/// A program that opens the reading side with a descriptor naming someone else's socket (here
/// a TCP server that answers anything with an HTTP error, as a database or daemon would) gets
/// the writer to connect there, but the writer sends it the 16 bytes of the token and nothing
/// else: it waits for the sink's answer first (`dp-stream/2`), and fails with exit 75. It used
/// to send its whole input to whatever the descriptor named.
#[test]
fn a_writer_sends_nothing_to_a_socket_a_hostile_reader_names() {
    use dataplane_core::wire::StreamRole;
    use dataplane_io::child::{ChildSession, StreamOpen};
    use std::io::{Read, Write};

    let dir = TestDir::new("program-streams-impostor");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "4M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "4M");
    let victim = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = victim.local_addr().unwrap();
    victim.set_nonblocking(true).unwrap();
    let received = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut s = loop {
            match victim.accept() {
                Ok((s, _)) => break s,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("nobody connected to the named socket: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    });
    let forged = format!(
        "dp-stream/2 tcp {at} {} {}",
        "ab".repeat(16),
        "cd".repeat(16)
    );
    let socket_a = a.socket.clone();
    let hostile = std::thread::spawn(move || {
        let mut session = ChildSession::connect(&socket_a).expect("attach on A");
        let stream = session
            .open_stream(
                "/data/impostor",
                StreamRole::Sink,
                forged.as_bytes(),
                StreamOpen::default(),
                Some(Duration::from_secs(30)),
            )
            .expect("the hostile reader is matched");
        (session, stream)
    });
    wait_until(
        "the hostile reader to wait",
        Duration::from_secs(10),
        || a.cli(&["stat", "/data/impostor"]).code == 0,
    );
    let secret = pattern(5, 100_000);
    b.cli_stdin(
        &["stream-send", "/data/impostor", "-", "--wait", "30"],
        &secret,
    )
    .expect_code(TEMPFAIL, "a writer matched with a forged descriptor");
    let got = received.join().unwrap();
    assert_eq!(got, [0xab; 16], "the named socket got the token only");
    drop(hostile.join().unwrap());
}

/// `--idle`: once matched, a reader gives up on a writer that sends nothing, and a writer on a
/// reader that takes nothing, each after the seconds given (exit 75, one line); without it
/// they wait as long as the peer holds the stream (a stream may pause).
#[test]
fn a_stream_peer_that_goes_silent_is_given_up_after_idle() {
    use std::io::Write;
    use std::time::Instant;

    use dataplane_core::wire::StreamRole;
    use dataplane_io::child::{ChildSession, StreamOpen};
    use dataplane_io::transport;

    let dir = TestDir::new("stream-idle");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "4M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "4M");

    // A writer (the library, on B) that sends a little and then holds the stream silent.
    let mut reader = recv_with(
        &dir,
        &a,
        "recv-idle",
        "/data/quiet",
        "quiet.out",
        &["--idle", "1"],
    );
    let mut source = ChildSession::connect(&b.socket).expect("attach on B");
    let stream = source
        .open_stream(
            "/data/quiet",
            StreamRole::Source,
            &transport::source_descriptor(),
            StreamOpen::default(),
            Some(Duration::from_secs(30)),
        )
        .expect("the source is matched");
    let mut peer = transport::connect(stream.peer_descriptor()).expect("connect to the reader");
    peer.write_all(b"a little").unwrap();
    let silent = Instant::now();
    let status = reader.wait_exit(Duration::from_secs(20));
    let waited = silent.elapsed();
    assert_eq!(status.code(), Some(TEMPFAIL), "{}", reader.log_text());
    assert!(
        reader
            .log_text()
            .contains("dataplane: /data/quiet: the writer sent nothing for 1 s (--idle)"),
        "{}",
        reader.log_text()
    );
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert_eq!(fs::read(dir.join("quiet.out")).unwrap(), b"a little");
    drop(peer);

    // A reader (the library, on A) that accepts the writer and never reads.
    let socket_a = a.socket.clone();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let sink = std::thread::spawn(move || {
        let listener = transport::SinkListener::tcp("127.0.0.1:0").expect("listen");
        let mut session = ChildSession::connect(&socket_a).expect("attach on A");
        let _stream = session
            .open_stream(
                "/data/stuck",
                StreamRole::Sink,
                listener.descriptor(),
                StreamOpen::default(),
                Some(Duration::from_secs(30)),
            )
            .expect("the sink is matched");
        let held = listener
            .accept(Duration::from_secs(30))
            .expect("the writer connects");
        // Hold it, unread, until the test is done.
        let _ = held_rx.recv_timeout(Duration::from_secs(60));
        drop(held);
    });
    fs::write(dir.join("big.bin"), pattern(5, 64 << 20)).unwrap();
    let big = dir.join("big.bin").to_string_lossy().into_owned();
    let started = Instant::now();
    b.cli(&[
        "stream-send",
        "/data/stuck",
        &big,
        "--wait",
        "30",
        "--idle",
        "1",
    ])
    .expect_code(TEMPFAIL, "a writer whose reader reads nothing")
    .expect_stderr_line("dataplane: /data/stuck: the reader took nothing for 1 s (--idle)");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    held_tx.send(()).unwrap();
    sink.join().unwrap();
    // The reader that gave up and the library's sink hold nothing on A afterwards.
    wait_until("A's sessions to end", Duration::from_secs(10), || {
        let sessions = a.cli(&["sessions"]);
        sessions.code == 0 && sessions.stdout.is_empty()
    });
}

/// A stream's entry is its name, as a FIFO's is: readers killed while they wait leave their
/// entries (`stat` says stream), but no waiting open: a writer is never matched with a dead
/// reader, a new reader takes the path, and `rm` removes the entries. Their sessions end.
#[test]
fn killed_readers_leave_their_entries_but_no_waiting_open() {
    let dir = TestDir::new("killed-readers");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "8M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "8M");
    let paths: Vec<String> = (0..8).map(|i| format!("/data/killed/{i}")).collect();
    let mut readers: Vec<Proc> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| recv(&dir, &a, &format!("reader-{i}"), p, &format!("out-{i}.bin")))
        .collect();
    for p in &paths {
        wait_until("the reader's stream entry", Duration::from_secs(20), || {
            a.cli(&["stat", p]).code == 0
        });
    }
    for r in &mut readers {
        r.kill9();
    }
    wait_until("A's sessions to end", Duration::from_secs(20), || {
        let sessions = a.cli(&["sessions"]);
        sessions.code == 0 && sessions.stdout.is_empty()
    });
    for p in &paths {
        let stat = b.cli(&["stat", p]);
        stat.expect_code(0, "the entry stays");
        let line = String::from_utf8(stat.stdout).unwrap();
        assert!(line.starts_with(&format!("{p}: stream")), "{line}");
        // No dead reader waits there: a writer finds nobody.
        b.cli_stdin(&["stream-send", p, "-", "--wait", "1"], b"x")
            .expect_code(75, "a writer with every reader dead")
            .expect_stderr_line(&format!(
                "dataplane: {p}: no reader opened the other side in the time allowed (--wait)"
            ));
    }
    // A new reader takes the first path, and gets what a writer sends.
    let mut fresh = recv(&dir, &a, "reader-fresh", &paths[0], "out-fresh.bin");
    b.cli_stdin(
        &["stream-send", &paths[0], "-", "--wait", "30"],
        b"after the kills",
    )
    .expect_code(0, "a writer meets the new reader");
    assert!(fresh.wait_exit(Duration::from_secs(30)).success());
    assert_eq!(
        fs::read(dir.join("out-fresh.bin")).unwrap(),
        b"after the kills"
    );
    // `rm` removes the entries.
    for p in &paths {
        b.cli(&["rm", p]).expect_code(0, "rm of a stream entry");
        b.cli(&["stat", p]).expect_code(2, "gone after rm");
    }
}

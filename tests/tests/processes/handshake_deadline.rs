//! A host's link to the directory has a deadline for the directory's first answer: after the
//! directory is killed with SIGKILL and something else takes its port, accepting connections
//! and never answering, the host closes each attempt once its silence bound passed without a
//! challenge (`SILENCE_DEFAULT`, `--directory-silence-ms`) and tries again (a silent acceptor
//! cannot hold the link); once the real directory is back on the port, the host is welcomed
//! again and serves.

use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dataplane_core::conns::SILENCE_DEFAULT;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern, wait_until};

#[test]
fn a_silent_directory_cannot_hold_a_hosts_link() {
    let dir = TestDir::new("handshake-deadline");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "4M");
    let blob = pattern(5, 10_000);
    a.cli_stdin(&["put", "/data/x", "-"], &blob)
        .expect_code(0, "put before the directory goes");

    directory.proc.kill9();
    // Something else takes the directory's port: it accepts, reads, and never answers.
    let silent = TcpListener::bind(&directory.listen).expect("the directory's port");
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            let Ok(mut stream) = stream else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = stream.set_read_timeout(Some(Duration::from_millis(10)));
            let _ = stream.read(&mut buf);
            held.push(stream);
            if counter.load(Ordering::SeqCst) >= 3 {
                break;
            }
        }
        // Dropping the listener frees the port for the real directory.
        drop(held);
    });
    let started = Instant::now();
    let deadline = SILENCE_DEFAULT.as_secs_f64();
    wait_until(
        "the host to give up on the silent acceptor and try again twice",
        Duration::from_secs_f64(deadline * 3.0 + 10.0),
        || accepted.load(Ordering::SeqCst) >= 3,
    );
    let took = started.elapsed().as_secs_f64();
    assert!(
        took >= deadline * 2.0 - 0.5,
        "three attempts in {took:.1} s: the host did not wait for the silence bound"
    );
    eprintln!("three attempts on a silent directory port in {took:.1} s");

    // The real directory comes back on its port: the host is welcomed and serves again.
    std::thread::sleep(Duration::from_millis(300));
    directory.restart();
    wait_until("the host to serve again", Duration::from_secs(30), || {
        a.cli(&["get", "/data/x"]).code == 0
    });
    let get = a.cli(&["get", "/data/x"]);
    assert!(get.stdout == blob);
    assert!(
        a.proc
            .log_text()
            .contains("did not answer within the silence bound"),
        "{}",
        a.proc.log_text()
    );
}

//! A host given several directory addresses (the replicas of a replicated directory, whose
//! leader alone serves) finds the one that serves and follows it: a dead address (nobody
//! listens), one that accepts and closes at once (a replica going down), and a real directory
//! node. The host must be welcomed behind the first two, at its start and again after the
//! directory is killed and restarted; given only the first two, it keeps trying.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use dataplane_tests::{DirectoryProc, HostProc, TestDir, free_address, pattern, wait_until};

/// How long a host given no serving address is watched.
const KEEPS_TRYING_FOR: Duration = Duration::from_secs(3);

/// A listener that accepts every connection and closes it at once, saying nothing, as a
/// replica that is going down does to a host; it counts them.
struct ClosingListener {
    address: String,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ClosingListener {
    fn start() -> ClosingListener {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let address = listener.local_addr().expect("local address").to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (accepted, stop) = (accepted.clone(), stop.clone());
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Ok(stream) = stream {
                        accepted.fetch_add(1, Ordering::Relaxed);
                        drop(stream);
                    }
                }
            })
        };
        ClosingListener {
            address,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    /// Connections accepted (and closed) so far.
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for ClosingListener {
    fn drop(&mut self) {
        // Wake the accepting thread so that it sees the flag.
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(&self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The lines of `log` that contain `what`.
fn lines_with<'a>(log: &'a str, what: &str) -> Vec<&'a str> {
    log.lines().filter(|line| line.contains(what)).collect()
}

#[test]
fn a_host_finds_the_serving_directory_behind_dead_and_closing_addresses_and_follows_it() {
    let dir = TestDir::new("directory-addresses");
    let dead = free_address();
    let closing = ClosingListener::start();
    let mut directory = DirectoryProc::start(&dir, "directory");
    let addresses = format!("{dead},{},{}", closing.address, directory.listen);
    let mut host = HostProc::start(&dir, "host", &addresses, "4M");

    // It tried the two that do not serve (in order: it says why at its first round) and was
    // welcomed by the third.
    assert!(
        closing.accepted() >= 1,
        "the closing address was never tried"
    );
    let log = host.proc.log_text();
    let waiting = lines_with(&log, "waiting for the directory");
    assert!(
        waiting.len() >= 2
            && waiting[0].contains(&format!("directory={dead}"))
            && waiting[1].contains(&format!("directory={}", closing.address)),
        "the first round's failures, in order: {waiting:#?}"
    );
    let welcomed = lines_with(&log, "welcomed by the directory");
    assert!(
        welcomed.len() == 1 && welcomed[0].contains(&format!("directory={}", directory.listen)),
        "one welcome, naming the directory that serves: {welcomed:#?}"
    );
    let bytes = pattern(1, 300_000);
    host.cli_stdin(&["put", "/data/addresses/before", "-"], &bytes)
        .expect_code(0, "put through the directory found behind two others");
    let get = host.cli(&["get", "/data/addresses/before"]);
    get.expect_code(0, "get");
    assert!(get.stdout == bytes, "the host read other bytes");

    // The directory is killed and restarted (same port, same data): the host tries the next
    // addresses, comes round to it, and is welcomed again.
    let closed_before = closing.accepted();
    directory.proc.assert_running();
    directory.restart();
    let again = pattern(2, 300_000);
    wait_until(
        "the host to publish through the restarted directory",
        Duration::from_secs(30),
        || {
            host.cli_stdin(&["put", "/data/addresses/after", "-"], &again)
                .code
                == 0
        },
    );
    let get = host.cli(&["get", "/data/addresses/after"]);
    get.expect_code(0, "get after the restart");
    assert!(
        get.stdout == again,
        "the host read other bytes after the restart"
    );
    let get = host.cli(&["get", "/data/addresses/before"]);
    get.expect_code(0, "get of the blob published before the restart");
    assert!(
        get.stdout == bytes,
        "the host read other bytes of the first blob"
    );
    assert!(
        closing.accepted() > closed_before,
        "the host did not move on to the next addresses after losing the directory"
    );
    let log = host.proc.log_text();
    let lost = lines_with(&log, "lost the directory");
    assert!(
        !lost.is_empty() && lost[0].contains(&format!("directory={}", directory.listen)),
        "the loss names the directory that served: {lost:#?}"
    );
    let again = lines_with(&log, "welcomed by the directory again");
    assert!(
        !again.is_empty() && again[0].contains(&format!("directory={}", directory.listen)),
        "the new welcome names the directory that serves: {again:#?}"
    );
    host.proc.assert_running();
}

#[test]
fn a_host_given_no_serving_directory_keeps_trying_every_address() {
    let dir = TestDir::new("directory-addresses-none");
    let dead = free_address();
    let closing = ClosingListener::start();
    let addresses = format!("{dead},{}", closing.address);
    let mut host = HostProc::spawn_with(&dir, "host", &addresses, "4M", &[]);
    thread::sleep(KEEPS_TRYING_FOR);
    host.proc.assert_running();
    // Round after round: the closing address was tried many times (at 50 ms between the two
    // addresses and 100 ms after each round, dozens in the time watched).
    let tried = closing.accepted();
    assert!(tried >= 5, "the closing address was tried {tried} times");
    let log = host.proc.log_text();
    for address in [&dead, &closing.address] {
        assert!(
            lines_with(&log, "waiting for the directory")
                .iter()
                .any(|line| line.contains(&format!("directory={address}"))),
            "no line names {address}:\n{log}"
        );
    }
    assert!(
        lines_with(&log, "welcomed").is_empty(),
        "welcomed by nobody: {log}"
    );
}

//! Sustained load on two real hosts: 16 child sessions (8 on each host), each looping "put
//! 1 KiB at a fresh path, then read it back", until every host holds well over 4,096 published
//! blobs. Every call must succeed while the load runs, and right after it a put, a get and a
//! stat through the CLI must succeed on both hosts.
//!
//! This is issue 11's item 1: hosts used to count published blobs against their table of
//! operations in progress (4,096), so after about 4,096 puts per host every put, get and stat
//! failed `LimitReached` for as long as the blobs stayed published.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dataplane_io::child::ChildSession;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

/// Sessions on each host.
const SESSIONS_PER_HOST: usize = 8;
/// Puts each host must have published before the load stops (the old wedge came at 4,096).
const PUTS_PER_HOST: u64 = 6_000;
/// The load may take this long at most (debug builds are slow; it takes seconds in release).
const LOAD_DEADLINE: Duration = Duration::from_secs(240);

#[test]
fn hosts_keep_serving_past_four_thousand_published_blobs() {
    let dir = TestDir::new("overload");
    let directory = DirectoryProc::start(&dir, "directory");
    let hosts = [
        HostProc::start(&dir, "host-a", &directory.listen, "64M"),
        HostProc::start(&dir, "host-b", &directory.listen, "64M"),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut loaders = Vec::new();
    for (h, host) in hosts.iter().enumerate() {
        let published = Arc::new(AtomicU64::new(0));
        for s in 0..SESSIONS_PER_HOST {
            let socket = host.socket.clone();
            let stop = stop.clone();
            let published = published.clone();
            loaders.push(thread::spawn(move || {
                let mut session = ChildSession::connect(&socket)
                    .unwrap_or_else(|e| panic!("host {h} session {s}: connect: {e}"));
                let bytes = pattern((h * 100 + s) as u64, 1024);
                let mut i = 0u64;
                while published.load(Ordering::Relaxed) < PUTS_PER_HOST
                    && !stop.load(Ordering::Relaxed)
                {
                    assert!(
                        started.elapsed() < LOAD_DEADLINE,
                        "host {h}: only {} puts within {LOAD_DEADLINE:?}",
                        published.load(Ordering::Relaxed)
                    );
                    i += 1;
                    let path = format!("/data/load/{h}/{s}/{i}");
                    let put = session.put(&path, &bytes);
                    let done = published.fetch_add(1, Ordering::Relaxed) + 1;
                    if let Err(e) = put {
                        stop.store(true, Ordering::Relaxed);
                        panic!("host {h} session {s}: put #{i} (host total {done}) failed: {e}");
                    }
                    match session.read(&path) {
                        Ok(view) => assert!(view.bytes() == bytes.as_slice(), "{path} read back"),
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            panic!("host {h} session {s}: get of {path} (host total {done}): {e}");
                        }
                    }
                }
                session.close().expect("close");
            }));
        }
    }
    for loader in loaders {
        if let Err(panic) = loader.join() {
            std::panic::resume_unwind(panic);
        }
    }
    eprintln!(
        "{} puts and gets on two hosts in {:?}",
        2 * PUTS_PER_HOST,
        started.elapsed()
    );
    // Right after the load: both hosts still serve everything.
    let input = dir.join("after.bin");
    std::fs::write(&input, b"after the load").unwrap();
    let input = input.to_str().expect("a UTF-8 path");
    for (h, host) in hosts.iter().enumerate() {
        let path = format!("/data/after/{h}");
        host.cli(&["put", &path, input])
            .expect_code(0, "a put right after the load");
        let get = host.cli(&["get", &path]);
        get.expect_code(0, "a get right after the load");
        assert_eq!(get.stdout, b"after the load");
        host.cli(&["stat", "/data/load/0/0/1"])
            .expect_code(0, "a stat of the first blob of the load");
    }
}

/// Children started at once by a job launcher: more of them connect in one instant than the
/// host's waiting room holds (64 connections before their hello). Each sends its hello right
/// after connecting, so every one of them must attach, put and read; none may be closed
/// unanswered to make room for the next (the host used to accept every connection the kernel
/// held before reading any hello, and evicted the oldest of them, which the child saw as "the
/// host closed the connection before it answered").
#[test]
fn a_burst_of_children_connecting_at_once_all_attach() {
    /// Below the host's 256 sessions, nearly four times its waiting room (64).
    const CHILDREN: usize = 240;
    let dir = TestDir::new("burst");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "64M");
    let barrier = Arc::new(std::sync::Barrier::new(CHILDREN));
    let children: Vec<_> = (0..CHILDREN)
        .map(|c| {
            let socket = host.socket.clone();
            let barrier = barrier.clone();
            thread::spawn(move || -> Result<(), String> {
                barrier.wait();
                let mut session = ChildSession::connect(&socket)
                    .map_err(|e| format!("child {c}: connect: {e}"))?;
                let path = format!("/data/burst/{c}");
                let bytes = pattern(c as u64, 64);
                session
                    .put(&path, &bytes)
                    .map_err(|e| format!("child {c}: put: {e}"))?;
                let view = session
                    .read(&path)
                    .map_err(|e| format!("child {c}: read: {e}"))?;
                if view.bytes() != bytes.as_slice() {
                    return Err(format!("child {c}: {path} read back other bytes"));
                }
                drop(view);
                session
                    .close()
                    .map_err(|e| format!("child {c}: close: {e}"))
            })
        })
        .collect();
    let failures: Vec<String> = children
        .into_iter()
        .filter_map(|child| child.join().expect("a child thread").err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {CHILDREN} children failed, first: {:?}\nhost log:\n{}",
        failures.len(),
        failures.first(),
        host.proc
            .log_text()
            .lines()
            .filter(|l| l.contains("closed"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

//! A stranger cannot fill a node's log: connections that churn through the directory's
//! admission queue (each one past its 256 waiting evicts the oldest) leave at most one line
//! per 10 s, saying how many it stands for.

use std::net::TcpStream;
use std::time::Duration;

use dataplane_core::admission::PENDING_CONNECTIONS_MAX;
use dataplane_tests::{DirectoryProc, TestDir, wait_until};

#[test]
fn evicted_connections_leave_a_line_per_ten_seconds() {
    let dir = TestDir::new("stranger-lines");
    let directory = DirectoryProc::start(&dir, "directory");
    let extra = 300;
    let held: Vec<TcpStream> = (0..PENDING_CONNECTIONS_MAX + extra)
        .map(|_| TcpStream::connect(&directory.listen).expect("connect"))
        .collect();
    // The evictions happened once the directory took every connection: the oldest ones are
    // closed (a read ends).
    wait_until("the directory to evict", Duration::from_secs(10), || {
        let mut first = &held[0];
        first
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("a timeout");
        let mut buf = [0u8; 256];
        loop {
            match std::io::Read::read(&mut first, &mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let log = directory.proc.log_text();
    let lines = log.lines().filter(|l| l.contains("makes room")).count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} eviction lines for {extra} evictions:\n{log}"
    );
    drop(held);
}

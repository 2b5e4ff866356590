//! `--sessions-max N` bounds the child sessions a host serves (256 by default): with N idle
//! children attached, the next is refused with the reason, and one more gets in once a child
//! leaves; with N above 256, more than 256 idle children attach.

use std::ffi::OsString;

use dataplane_io::child::ChildSession;
use dataplane_tests::{DirectoryProc, HostProc, TestDir};

#[test]
fn the_sessions_limit_is_the_operators() {
    let dir = TestDir::new("sessions-max");
    let directory = DirectoryProc::start(&dir, "directory");
    let small = HostProc::start_with(
        &dir,
        "small",
        &directory.listen,
        "8M",
        &[OsString::from("--sessions-max"), OsString::from("3")],
    );
    // The readiness probe's session is gone once it answered; three idle children attach.
    let mut children: Vec<ChildSession> = (0..3)
        .map(|_| ChildSession::connect(&small.socket).expect("within the limit"))
        .collect();
    let Err(refused) = ChildSession::connect(&small.socket) else {
        panic!("a fourth child was let in");
    };
    assert!(
        refused.to_string().contains("no more"),
        "the refusal says why: {refused}"
    );
    children.pop();
    let mut again = None;
    for _ in 0..50 {
        if let Ok(child) = ChildSession::connect(&small.socket) {
            again = Some(child);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(again.is_some(), "a child gets in once one left");

    let large = HostProc::start_with(
        &dir,
        "large",
        &directory.listen,
        "8M",
        &[OsString::from("--sessions-max"), OsString::from("300")],
    );
    let many: Vec<ChildSession> = (0..260)
        .map(|i| {
            ChildSession::connect(&large.socket)
                .unwrap_or_else(|e| panic!("child {i} of 260 under --sessions-max 300: {e}"))
        })
        .collect();
    assert_eq!(many.len(), 260);
}

//! The host's control socket (issue 17), as an operator uses it: `dataplane sessions` lists a
//! live child's session, `dataplane arena` samples the arena, `dataplane revoke` ends the
//! session (the child is told and disconnected, its read lease is reclaimed, the blob it
//! published stays), and the socket is the host's user's alone and survives garbage and a
//! crowd of connections.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use dataplane_io::child::{ChildError, ChildSession};
use dataplane_io::control::{HostControl, control_path};
use dataplane_tests::{DirectoryProc, HostProc, TestDir, wait_until};

/// The `key=value` field of `dataplane arena`'s line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[test]
fn an_operator_lists_samples_and_revokes_sessions() {
    let dir = TestDir::new("control");
    let directory = DirectoryProc::start(&dir, "directory");
    let mut host = HostProc::start(&dir, "host", &directory.listen, "16M");
    let control = control_path(&host.socket);
    let mode = std::fs::metadata(&control).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the control socket is the host's user's alone");

    let mut child = ChildSession::connect(&host.socket).expect("attaches");
    let session = child.welcome().session;
    child
        .put("/data/c/kept", b"published before the revocation")
        .unwrap();
    let arena = |host: &HostProc| {
        let out = host.cli(&["arena"]);
        out.expect_code(0, "dataplane arena");
        String::from_utf8(out.stdout).unwrap()
    };
    let published = field(&arena(&host), "leases");
    assert!(published >= 1, "the published blob holds a lease");

    // Listed while it runs.
    let out = host.cli(&["sessions"]);
    out.expect_code(0, "dataplane sessions");
    let listing = String::from_utf8(out.stdout).unwrap();
    let line = listing
        .lines()
        .find(|l| l.starts_with(&session.to_string()))
        .unwrap_or_else(|| panic!("{session} not in {listing:?}"));
    assert!(line.contains("state=running"), "{line}");

    // A read the child holds while the operator revokes its session.
    let view = child.read("/data/c/kept").expect("reads");
    assert_eq!(view.bytes(), b"published before the revocation");
    let held = field(&arena(&host), "leases");
    host.cli(&["revoke", &session.to_string()])
        .expect_code(0, "dataplane revoke");
    drop(view);
    // The child is told and disconnected.
    match child.stat("/data/c/kept") {
        Err(ChildError::Revoked | ChildError::Disconnected) => {}
        other => panic!("a revoked child's next request: {other:?}"),
    }
    // Its session is gone, its read lease reclaimed, and what it published stays.
    wait_until(
        "the revoked session's lease to be reclaimed",
        Duration::from_secs(10),
        || field(&arena(&host), "leases") <= published,
    );
    assert!(held >= published);
    let listing = String::from_utf8(host.cli(&["sessions"]).stdout).unwrap();
    assert!(!listing.contains(&session.to_string()), "{listing}");
    let out = host.cli(&["get", "/data/c/kept"]);
    out.expect_code(0, "get after the revocation");
    assert_eq!(out.stdout, b"published before the revocation");

    // A session that is gone, or no address at all: typed failures, nothing changes.
    host.cli(&["revoke", &session.to_string()])
        .expect_code(2, "revoking twice")
        .expect_plain_error();
    host.cli(&["revoke", "not-a-session"])
        .expect_code(5, "a bad address")
        .expect_plain_error();

    // Garbage on the control socket is refused and the connection closed; the host serves on.
    let mut garbage = UnixStream::connect(&control).unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    garbage.write_all(&[3, 0, 0, 0, 0xff, 0xfe, 0xfd]).unwrap();
    let mut answer = Vec::new();
    let _ = garbage.read_to_end(&mut answer);
    assert!(!answer.is_empty(), "a refusal before the close");
    // More connections than the host keeps: the extra ones are closed, the first ones serve.
    let crowd: Vec<UnixStream> = (0..20)
        .map(|_| UnixStream::connect(&control).unwrap())
        .collect();
    let mut again = HostControl::connect(&host.socket).unwrap();
    let _ = again.sessions(); // may be one of those closed
    drop(crowd);
    wait_until(
        "the control socket to answer again",
        Duration::from_secs(10),
        || {
            HostControl::connect(&host.socket)
                .and_then(|mut c| c.arena_stats())
                .is_ok()
        },
    );
    host.proc.assert_running();
    let mut fresh = ChildSession::connect(&host.socket).expect("a new child attaches");
    let kept = b"published before the revocation".len() as u64;
    assert_eq!(fresh.stat("/data/c/kept").unwrap().length, Some(kept));
}

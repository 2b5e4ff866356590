//! Misconfiguration is a usage error (exit 64) that names what is wrong and changes nothing:
//! a `--listen` without a port, a port another process holds (for a directory, a replica and
//! a host), `--arena-size 0` or more than the machine's memory, a `--directory` entry without
//! a port. A host that cannot listen has not made its socket or arena; a directory or replica
//! tries its ports before it touches the disk (and binds them for good only after it read its
//! log, so that a listening port means a node that is up).

use std::net::TcpListener;
use std::process::Command;

use dataplane_tests::{TestDir, binaries};

/// Runs `dataplane-node ARGS`: its exit code and stderr.
fn node(args: &[&str]) -> (i32, String) {
    let out = Command::new(&binaries().node)
        .args(args)
        .output()
        .expect("run dataplane-node");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A host's command line.
fn host<'a>(directory: &'a str, listen: &'a str, socket: &'a str, arena: &'a str) -> Vec<&'a str> {
    vec![
        "host",
        "--directory",
        directory,
        "--listen",
        listen,
        "--socket",
        socket,
        "--arena-size",
        arena,
    ]
}

#[test]
fn misconfiguration_exits_64_and_changes_nothing() {
    let dir = TestDir::new("usage-errors");
    let held = TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let taken = held.local_addr().expect("its address").to_string();
    let data = dir.join("data");
    let data = data.to_str().expect("a UTF-8 path");
    // A directory or replica whose port is taken has not made its data directory.
    let data_taken = dir.join("data-taken");
    let data_taken = data_taken.to_str().expect("a UTF-8 path");
    let replica_taken = dir.join("replica-taken");
    let replica_taken = replica_taken.to_str().expect("a UTF-8 path");
    let socket = dir.join("host.sock");
    let socket = socket.to_str().expect("a UTF-8 path");
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "a directory's --listen without a port",
            vec!["directory", "--listen", "127.0.0.1", "--data-dir", data],
            "is not HOST:PORT",
        ),
        (
            "a directory's port in use",
            vec!["directory", "--listen", &taken, "--data-dir", data_taken],
            "another process listens there",
        ),
        (
            "a replica's port in use",
            vec![
                "directory",
                "--listen",
                &taken,
                "--data-dir",
                replica_taken,
                "--replica-id",
                "1",
                "--replicas",
                "1=127.0.0.1:1",
            ],
            "another process listens there",
        ),
        (
            "a host's port in use",
            host("127.0.0.1:1", &taken, socket, "1M"),
            "another process listens there",
        ),
        (
            "an arena of 0 bytes",
            host("127.0.0.1:1", "127.0.0.1:1", socket, "0"),
            "give a size above 0",
        ),
        (
            "an arena larger than the machine's memory",
            host("127.0.0.1:1", "127.0.0.1:1", socket, "1000000G"),
            "is more than the",
        ),
        (
            "a directory address without a port",
            host("127.0.0.1", "127.0.0.1:1", socket, "1M"),
            "is not HOST:PORT",
        ),
    ];
    for (what, args, says) in cases {
        let (code, stderr) = node(&args);
        assert_eq!(code, 64, "{what}: {stderr}");
        assert!(stderr.contains(says), "{what}: {stderr}");
        for data_dir in ["data", "data-taken", "replica-taken"] {
            assert!(
                !dir.join(data_dir).exists(),
                "{what}: the data directory {data_dir} was created"
            );
        }
        assert!(
            !dir.join("host.sock").exists(),
            "{what}: the socket was made"
        );
    }
    drop(held);
}

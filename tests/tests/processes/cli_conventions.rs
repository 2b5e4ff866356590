//! What the CLI prints and where, and names that print alike:
//!
//! * a new name (put, publish, the stream commands, mv's destination) may not hold a character
//!   that prints as nothing or reorders text (U+202E, U+200B...): refused as an invalid path
//!   (5) by the CLI and by the host, while such a name can still be looked up (an entry from
//!   before the rule stays reachable);
//! * a message shows a long argument cut in the middle, on one line;
//! * what a command reports goes to stdout, failures to stderr;
//! * `put --no-replace` refuses an existing path (3), as `mv` does without `--replace`;
//! * `put -` from a pipe larger than the arena is refused after reading one byte more than
//!   the arena, not all of stdin; from a regular file it is read straight into the write.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dataplane_core::error::DataPlaneError;
use dataplane_core::path::PathError;
use dataplane_io::child::{ChildError, ChildSession};
use dataplane_tests::{DirectoryProc, HostProc, TestDir, binaries, pattern};

/// "Invalid path or argument".
const INVALID: i32 = 5;
/// "Something is at the path already".
const EXISTS: i32 = 3;
/// "Not found".
const NOT_FOUND: i32 = 2;

#[test]
fn new_names_may_not_hold_invisible_characters() {
    let dir = TestDir::new("cli-invisible");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    host.cli_stdin(&["put", "/data/t/ok", "-"], b"ok")
        .expect_code(0, "put of a plain name");
    let input = dir.join("input.bin");
    std::fs::write(&input, b"x").unwrap();
    let input = input.to_str().unwrap();

    for (path, shown, code) in [
        (
            "/data/t/gpj.\u{202e}exe",
            "/data/t/gpj.\\u{202e}exe",
            "U+202E",
        ),
        ("/data/t/a\u{200b}b", "/data/t/a\\u{200b}b", "U+200B"),
        ("/data/t/\u{feff}x", "/data/t/\\u{feff}x", "U+FEFF"),
    ] {
        let line = format!(
            "dataplane: {shown}: invalid path: path contains {code}, a character that prints \
             as nothing or reorders the text around it (a new name may not hold one)"
        );
        let creating: [&[&str]; 5] = [
            &["put", path, input],
            &["put", path, "-"],
            &["mv", "/data/t/ok", path],
            &["stream-send", path, input, "--wait", "1"],
            &["stream-recv", path, "--wait", "1"],
        ];
        for args in creating {
            host.cli_stdin(args, b"x")
                .expect_code(INVALID, &format!("{args:?}"))
                .expect_stderr_line(&line)
                .expect_plain_error();
        }
        // Looking such a name up is not refused: an old entry stays reachable (here there is
        // none, so: not found, and the message shows the name escaped).
        for args in [&["get", path][..], &["stat", path], &["rm", path]] {
            host.cli(args)
                .expect_code(NOT_FOUND, &format!("{args:?}"))
                .expect_stderr_line(&format!("dataplane: {shown}: not found"));
        }
    }
    let get = host.cli(&["get", "/data/t/ok"]);
    get.expect_code(0, "the plain name is where it was");
    assert_eq!(get.stdout, b"ok");

    // The host refuses them itself, whatever the client checked.
    let mut session = ChildSession::connect(&host.socket).expect("attach");
    let path = "/data/t/a\u{202e}b";
    let refused = |result: Result<(), ChildError>| match result {
        Err(ChildError::Failed(DataPlaneError::InvalidPath(PathError::InvisibleCharacter {
            code: 0x202e,
        }))) => {}
        other => panic!("{path:?}: {other:?}"),
    };
    refused(session.put(path, b"x").map(drop));
    refused(session.rename("/data/t/ok", path, false).map(drop));
    refused(session.publish_file(path, "f").map(drop));
    // Looked up, it is only not there.
    match session.stat(path) {
        Err(ChildError::Failed(DataPlaneError::PathNotFound(p))) => assert_eq!(p.as_str(), path),
        other => panic!("stat {path:?}: {other:?}"),
    }
    session.close().expect("close");
}

#[test]
fn a_long_argument_is_shown_cut_on_one_line() {
    let dir = TestDir::new("cli-long");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    let long = format!("/data/{}", "y".repeat(130_000));
    let out = host.cli(&["get", &long]);
    out.expect_code(INVALID, "a 130 KB path")
        .expect_plain_error();
    assert!(
        out.stderr.len() < 400,
        "{} bytes: {}",
        out.stderr.len(),
        out.stderr
    );
    assert!(
        out.stderr.contains("(130006 bytes in all)") && out.stderr.contains("the limit is 4096"),
        "{}",
        out.stderr
    );
}

#[test]
fn put_reports_on_stdout_and_no_replace_keeps_what_is_there() {
    let dir = TestDir::new("cli-put");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");

    let put = host.cli_stdin(&["put", "/data/p/a", "-"], b"first");
    put.expect_code(0, "put");
    let line = String::from_utf8(put.stdout.clone()).unwrap();
    assert!(line.starts_with("/data/p/a: published at @"), "{line:?}");
    assert_eq!(line.lines().count(), 1, "{line:?}");
    assert!(put.stderr.is_empty(), "{:?}", put.stderr);

    // --no-replace: refused where something is, and what is there stays.
    let out = host.cli_stdin(&["put", "--no-replace", "/data/p/a", "-"], b"second");
    out.expect_code(EXISTS, "put --no-replace over a blob")
        .expect_stderr_line("dataplane: /data/p/a: already exists");
    assert!(out.stdout.is_empty());
    assert_eq!(host.cli(&["get", "/data/p/a"]).stdout, b"first");
    // ...and published where nothing is. Without it, put replaces.
    host.cli_stdin(&["put", "--no-replace", "/data/p/b", "-"], b"new")
        .expect_code(0, "put --no-replace of a new path");
    host.cli_stdin(&["put", "/data/p/a", "-"], b"second")
        .expect_code(0, "put over a blob");
    assert_eq!(host.cli(&["get", "/data/p/a"]).stdout, b"second");
    // The other commands that report something report it on stdout too.
    let stat = host.cli(&["stat", "/data/p/b"]);
    stat.expect_code(0, "stat");
    assert!(
        String::from_utf8(stat.stdout)
            .unwrap()
            .starts_with("/data/p/b: blob, 3 bytes")
    );
    assert!(stat.stderr.is_empty());
    // rm and mv succeed silently.
    for args in [&["mv", "/data/p/b", "/data/p/c"][..], &["rm", "/data/p/c"]] {
        let out = host.cli(args);
        out.expect_code(0, &format!("{args:?}"));
        assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    }
}

#[test]
fn put_from_stdin_checks_the_length_before_reading_it_all() {
    let dir = TestDir::new("cli-stdin");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");

    // A pipe holding 16 times the arena: refused once one byte more than the arena was read.
    let total = 64usize << 20;
    let mut cli = Command::new(&binaries().cli)
        .arg("--socket")
        .arg(&host.socket)
        .args(["put", "/data/s/huge", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the CLI");
    let mut pipe = cli.stdin.take().unwrap();
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0usize;
    while written < total {
        match pipe.write(&chunk) {
            Ok(n) => written += n,
            Err(_) => break, // the CLI stopped reading and closed its end
        }
    }
    drop(pipe);
    let mut stderr = String::new();
    cli.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = cli.wait().unwrap();
    assert_eq!(status.code(), Some(INVALID), "{stderr}");
    assert!(stderr.contains("can never fit"), "{stderr}");
    assert!(
        written < 8 << 20,
        "the CLI read {written} of {total} bytes before refusing"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // A regular file on stdin: its length is known, its bytes go straight into the write.
    let bytes = pattern(3, 1_000_003);
    let file = dir.join("stdin.bin");
    std::fs::write(&file, &bytes).unwrap();
    let out = Command::new(&binaries().cli)
        .arg("--socket")
        .arg(&host.socket)
        .args(["put", "/data/s/file", "-"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .expect("run the CLI");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(host.cli(&["get", "/data/s/file"]).stdout, bytes);
    // A file larger than the arena is refused by its length, without a byte read.
    let big = dir.join("big.bin");
    std::fs::write(&big, vec![1u8; 5 << 20]).unwrap();
    let out = Command::new(&binaries().cli)
        .arg("--socket")
        .arg(&host.socket)
        .args(["put", "/data/s/big", "-"])
        .stdin(std::fs::File::open(&big).unwrap())
        .output()
        .expect("run the CLI");
    assert_eq!(out.status.code(), Some(INVALID), "{out:?}");
    assert_eq!(host.cli(&["stat", "/data/s/big"]).code, NOT_FOUND);
}

#[test]
fn a_failure_with_no_directory_names_the_directory() {
    let dir = TestDir::new("cli-no-directory");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let mut host = HostProc::start(&dir, "host", &directory.listen, "4M");
    host.cli_stdin(&["put", "/data/d/a", "-"], b"a")
        .expect_code(0, "put with a directory");
    directory.proc.kill9();

    // A read fails once the host has seen no directory for --read-wait-secs (10 s by
    // default), not after the whole deadline (80 s), and says what is missing.
    let started = Instant::now();
    let stat = host.cli(&["stat", "/data/d/a"]);
    let took = started.elapsed();
    stat.expect_code(75, "a stat with no directory")
        .expect_plain_error();
    assert!(
        stat.stderr.contains("no directory was reachable for 10 s")
            && stat.stderr.contains("is the directory running"),
        "{}",
        stat.stderr
    );
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(40),
        "{took:?}"
    );

    // A write waits for its deadline; a client that gives up first is told the host is up
    // and waits for its directory, not that the host may be stopped.
    let put = host.cli_stdin(&["--timeout", "3", "put", "/data/d/b", "-"], b"b");
    put.expect_code(75, "a put with no directory and --timeout 3")
        .expect_plain_error();
    assert!(
        put.stderr.contains("the host is up") && put.stderr.contains("waiting for its directory"),
        "{}",
        put.stderr
    );
    host.proc.assert_running();
}

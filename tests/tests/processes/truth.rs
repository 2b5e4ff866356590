//! The CLI tells users the truth (issue 11, item 7):
//!
//! * a blob whose host restarted is gone for good (its bytes lived in that host's arena): `get`
//!   says so with its own status (65), not "try later" (75), and `stat` marks it lost;
//! * no argument makes the CLI panic: arguments that are not UTF-8 get a clean error, and file
//!   names may be any bytes;
//! * newline, tab and escape in a data path are refused as an invalid path (5), by the CLI and
//!   by the host itself;
//! * every error is one plain line (no Rust debug text) with a status from `--help`'s table.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use dataplane_core::error::DataPlaneError;
use dataplane_core::path::PathError;
use dataplane_io::child::{ChildError, ChildSession};
use dataplane_tests::{
    CLI_TIMEOUT, CliOutput, DirectoryProc, HostProc, TestDir, binaries, cli_os, pattern, wait_until,
};

/// "The blob is lost or damaged".
const LOST: i32 = 65;
/// "Invalid path or argument".
const INVALID: i32 = 5;
/// "Usage".
const USAGE: i32 = 64;
/// "Host unreachable".
const UNREACHABLE: i32 = 69;
/// What a panic exits with: never acceptable.
const PANIC: i32 = 101;

fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

#[test]
fn a_blob_whose_host_restarted_is_lost_not_temporarily_unavailable() {
    let dir = TestDir::new("truth-lost");
    let directory = DirectoryProc::start(&dir, "directory");
    let mut a = HostProc::start(&dir, "host-a", &directory.listen, "16M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "16M");

    let bytes = pattern(21, 700_000);
    let put = a.cli_stdin(&["put", "/data/t/k1", "-"], &bytes);
    put.expect_code(0, "put k1 on A");
    let revision = put.revision();
    let kept = pattern(22, 5_000);
    b.cli_stdin(&["put", "/data/t/kept", "-"], &kept)
        .expect_code(0, "put on B");
    let get = b.cli(&["get", "/data/t/k1"]);
    get.expect_code(0, "get k1 on B while A lives");
    assert!(get.stdout == bytes);

    // A dies and comes back as a new incarnation: its arena, and k1's bytes with it, are gone.
    a.proc.kill9();
    a.restart();

    // Whether the directory already has A's gone report (it answers the resolve) or not (the
    // restarted A refuses the chunk requests for its dead source), the read says "lost".
    let lost_line = "dataplane: /data/t/k1: lost: its bytes lived on a host that restarted";
    b.cli(&["get", "/data/t/k1"])
        .expect_code(LOST, "get of a blob whose host restarted")
        .expect_stderr_line(lost_line)
        .expect_plain_error();

    // `stat` describes it as lost once the directory has the report (A re-sends it every
    // second until it is acknowledged).
    let lost_stat =
        format!("/data/t/k1: blob, lost (its bytes lived on a host that restarted), {revision}\n");
    wait_until(
        "stat to say that k1 is lost",
        Duration::from_secs(20),
        || {
            let stat = b.cli(&["stat", "/data/t/k1"]);
            stat.code == 0 && String::from_utf8_lossy(&stat.stdout) == lost_stat
        },
    );
    let stat = a.cli(&["stat", "/data/t/k1"]);
    stat.expect_code(0, "stat of a lost blob on the restarted A");
    assert_eq!(String::from_utf8_lossy(&stat.stdout), lost_stat);
    // Now the directory answers for it: on both hosts, at once.
    for (name, host) in [("A", &a), ("B", &b)] {
        host.cli(&["get", "/data/t/k1"])
            .expect_code(LOST, &format!("get of the lost k1 on {name}"))
            .expect_stderr_line(lost_line);
    }
    // B's own blob is untouched.
    let stat = b.cli(&["stat", "/data/t/kept"]);
    stat.expect_code(0, "stat of B's blob");
    assert!(
        String::from_utf8_lossy(&stat.stdout).starts_with("/data/t/kept: blob, 5000 bytes, @"),
        "{:?}",
        String::from_utf8_lossy(&stat.stdout)
    );
    let get = a.cli(&["get", "/data/t/kept"]);
    get.expect_code(0, "get of B's blob on the restarted A");
    assert!(get.stdout == kept);

    // A lost blob keeps its loss when moved, and can be removed or written again.
    b.cli(&["mv", "/data/t/k1", "/data/t/k1-moved"])
        .expect_code(0, "mv of a lost blob");
    b.cli(&["get", "/data/t/k1-moved"])
        .expect_code(LOST, "get of the moved lost blob")
        .expect_stderr_line(
            "dataplane: /data/t/k1-moved: lost: its bytes lived on a host that restarted",
        );
    b.cli(&["rm", "/data/t/k1-moved"])
        .expect_code(0, "rm of a lost blob");
    let fresh = pattern(23, 300_000);
    a.cli_stdin(&["put", "/data/t/k1", "-"], &fresh)
        .expect_code(0, "put k1 again on the restarted A");
    let get = b.cli(&["get", "/data/t/k1"]);
    get.expect_code(0, "get of the new k1 on B");
    assert!(get.stdout == fresh);
    let stat = b.cli(&["stat", "/data/t/k1"]);
    stat.expect_code(0, "stat of the new k1");
    assert!(
        String::from_utf8_lossy(&stat.stdout).starts_with("/data/t/k1: blob, 300000 bytes, @"),
        "{:?}",
        String::from_utf8_lossy(&stat.stdout)
    );
}

#[test]
fn arguments_that_are_not_utf8_get_a_clean_error() {
    let dir = TestDir::new("truth-utf8");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    let run = |args: &[&OsStr]| cli_os(&host.socket, args, None, CLI_TIMEOUT);

    // A data path that is not UTF-8 is an invalid path, for every command.
    let bad_path = os(b"/data/t/\xff\xfe");
    for command in ["get", "stat", "rm"] {
        let out = run(&[OsStr::new(command), bad_path]);
        assert_ne!(out.code, PANIC, "{command}: {:?}", out.stderr);
        out.expect_code(INVALID, command)
            .expect_stderr_line(
                "dataplane: /data/t/\u{fffd}\u{fffd}: invalid path: path is not valid UTF-8",
            )
            .expect_plain_error();
    }
    run(&[OsStr::new("put"), bad_path, OsStr::new("-")])
        .expect_code(INVALID, "put")
        .expect_plain_error();
    run(&[OsStr::new("mv"), OsStr::new("/data/t/a"), bad_path])
        .expect_code(INVALID, "mv")
        .expect_plain_error();
    // A command that is not UTF-8 is a usage error.
    run(&[os(b"g\xffet"), OsStr::new("/data/t/a")])
        .expect_code(USAGE, "a command that is not UTF-8")
        .expect_stderr_line("dataplane: unknown command \"g\u{fffd}et\" (see --help)")
        .expect_plain_error();
    // File names are the operating system's: any bytes will do.
    let input = dir.path().join(os(b"in-\xff.bin"));
    let bytes = pattern(31, 10_000);
    std::fs::write(&input, &bytes).unwrap();
    run(&[
        OsStr::new("put"),
        OsStr::new("/data/t/bytes"),
        input.as_os_str(),
    ])
    .expect_code(0, "put from a file whose name is not UTF-8");
    let output = dir.path().join(os(b"out-\xfe.bin"));
    run(&[
        OsStr::new("get"),
        OsStr::new("/data/t/bytes"),
        output.as_os_str(),
    ])
    .expect_code(0, "get into a file whose name is not UTF-8");
    assert!(std::fs::read(&output).unwrap() == bytes);
    let missing = dir.path().join(os(b"missing-\xff"));
    run(&[
        OsStr::new("put"),
        OsStr::new("/data/t/x"),
        missing.as_os_str(),
    ])
    .expect_code(1, "put from a missing file")
    .expect_plain_error();
    // A socket path that is not UTF-8: the host is unreachable, said in one line.
    let mut socket = dir.path().as_os_str().to_owned().into_vec();
    socket.extend_from_slice(b"/no-\xff.sock");
    let out = Command::new(&binaries().cli)
        .arg("--socket")
        .arg(OsString::from_vec(socket))
        .args(["stat", "/data/t/x"])
        .stdin(Stdio::null())
        .output()
        .expect("run the CLI");
    let out = CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    out.expect_code(UNREACHABLE, "a socket path that is not UTF-8")
        .expect_plain_error();
}

#[test]
fn control_characters_in_paths_are_refused_by_the_cli_and_by_the_host() {
    let dir = TestDir::new("truth-control");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    host.cli_stdin(&["put", "/data/t/ok", "-"], b"ok")
        .expect_code(0, "put of a valid path");

    let cases = [
        ("/data/t/a\nb", "/data/t/a\\nb", "U+000A"),
        ("/data/t/a\tb", "/data/t/a\\tb", "U+0009"),
        ("/data/t/\x1b[31mred", "/data/t/\\u{1b}[31mred", "U+001B"),
    ];
    for (path, shown, code) in cases {
        let line =
            format!("dataplane: {shown}: invalid path: path contains the control character {code}");
        let commands: [&[&str]; 5] = [
            &["put", path, "-"],
            &["get", path],
            &["stat", path],
            &["rm", path],
            &["mv", "/data/t/ok", path],
        ];
        for args in commands {
            host.cli_stdin(args, b"x")
                .expect_code(INVALID, &format!("{:?}", args))
                .expect_stderr_line(&line)
                .expect_plain_error();
        }
    }
    // Nothing was bound, and the valid blob is where it was.
    let get = host.cli(&["get", "/data/t/ok"]);
    get.expect_code(0, "get of the valid path");
    assert_eq!(get.stdout, b"ok");

    // The host refuses them itself, whatever the client checked: the same typed error.
    let mut session = ChildSession::connect(&host.socket).expect("attach");
    for (path, _, _) in cases {
        let refused = |result: Result<(), ChildError>| match result {
            Err(ChildError::Failed(DataPlaneError::InvalidPath(PathError::ControlCharacter {
                code,
            }))) => code,
            other => panic!("{path:?}: {other:?}"),
        };
        let code = refused(session.put(path, b"x").map(drop));
        assert!(char::from_u32(code).is_some_and(char::is_control));
        refused(session.read(path).map(drop));
        refused(session.stat(path).map(drop));
        refused(session.remove(path, None).map(drop));
        refused(session.rename("/data/t/ok", path, false).map(drop));
    }
    session.close().expect("close");
}

#[test]
fn every_error_is_one_plain_line_with_a_documented_status() {
    let dir = TestDir::new("truth-messages");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    host.cli_stdin(&["put", "/data/t/a", "-"], b"a")
        .expect_code(0, "put a");
    host.cli_stdin(&["put", "/data/t/b", "-"], b"b")
        .expect_code(0, "put b");

    let cases: &[(&[&str], i32)] = &[
        (&["get", "/data/t/none"], 2),
        (&["stat", "/data/t/none"], 2),
        (&["rm", "/data/t/none"], 2),
        (&["mv", "/data/t/a", "/data/t/b"], 3),
        (&["get", "/etc/passwd"], 4),
        (&["put", "/etc/x", "-"], 4),
        (&["get", "relative"], INVALID),
        (&["get", "/data/../x"], INVALID),
        (&["get", "/data//x"], INVALID),
        (&["get", "/"], INVALID),
        (&[], USAGE),
        (&["get"], USAGE),
        (&["mv", "/data/t/a"], USAGE),
        (&["mv", "/data/t/a", "/data/t/b", "--force"], USAGE),
        (&["frobnicate"], USAGE),
        (&["put", "/data/t/c", "/nonexistent/file"], 1),
    ];
    let mut statuses = vec![LOST, UNREACHABLE];
    for (args, code) in cases {
        let out = host.cli_stdin(args, b"x");
        assert_ne!(out.code, PANIC, "{args:?}: {:?}", out.stderr);
        out.expect_code(*code, &format!("{args:?}"))
            .expect_plain_error();
        statuses.push(*code);
    }
    // No host at all.
    let out = dataplane_tests::cli_with(
        &dir.join("nobody.sock"),
        &["stat", "/data/t/a"],
        None,
        CLI_TIMEOUT,
    );
    out.expect_code(UNREACHABLE, "no host").expect_plain_error();
    // `--socket` without a value.
    let out = Command::new(&binaries().cli)
        .arg("--socket")
        .stdin(Stdio::null())
        .output()
        .expect("run the CLI");
    assert_eq!(out.status.code(), Some(USAGE));

    // Every status seen here (and the lost blob's, above) is in --help's table.
    let help = Command::new(&binaries().cli)
        .arg("--help")
        .output()
        .expect("run the CLI");
    assert_eq!(help.status.code(), Some(0));
    let help = String::from_utf8(help.stdout).unwrap();
    let table = help
        .split("EXIT STATUS:")
        .nth(1)
        .expect("an EXIT STATUS table");
    for status in statuses {
        assert!(
            table
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{status} "))),
            "status {status} is not in the table:\n{table}"
        );
    }
}

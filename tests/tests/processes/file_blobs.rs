//! File blobs (issue 17) on real processes: a host started with `--files DIR` publishes a file
//! under DIR with `dataplane publish PATH FILE`; another host reads it byte for byte; the
//! blob survives `kill -9` of its host and of the directory (same revision, no re-publish);
//! a changed file is never served (exit 65, one plain line); names outside the root are
//! refused (exit 5) and change nothing; a replaced file blob leaves its host's table; a host
//! whose table is damaged refuses to start.

use std::ffi::OsString;
use std::fs;

use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

/// The CLI's exit status for "the data is lost or damaged" (EX_DATAERR).
const LOST: i32 = 65;
/// The CLI's exit status for an invalid argument.
const INVALID: i32 = 5;
/// The CLI's exit status for "not found".
const NOT_FOUND: i32 = 2;

#[test]
fn a_file_blob_is_served_from_its_file_across_restarts_and_never_once_changed() {
    let dir = TestDir::new("file-blobs");
    let root = dir.join("files-a");
    fs::create_dir_all(root.join("models")).unwrap();
    let weights = pattern(41, 3_000_000);
    fs::write(root.join("models/weights.bin"), &weights).unwrap();
    fs::write(root.join("notes.txt"), b"version one").unwrap();
    fs::write(dir.join("outside.txt"), b"secret").unwrap();
    let mut directory = DirectoryProc::start(&dir, "directory");
    let files: Vec<OsString> = vec!["--files".into(), root.clone().into()];
    let mut a = HostProc::start_with(&dir, "host-a", &directory.listen, "4M", &files);
    let b = HostProc::start(&dir, "host-b", &directory.listen, "16M");

    // Published without a copy: the file is larger than A's whole arena.
    a.cli(&["publish", "/data/w", "models/weights.bin"])
        .expect_code(0, "publish the weights");
    a.cli(&["publish", "/data/n", "notes.txt"])
        .expect_code(0, "publish the notes");
    let get = b.cli(&["get", "/data/w"]);
    get.expect_code(0, "get the weights on B");
    assert!(get.stdout == weights, "B read other bytes than the file's");
    let stat = b.cli(&["stat", "/data/w"]);
    stat.expect_code(0, "stat the weights");
    let before = String::from_utf8_lossy(&stat.stdout).into_owned();
    assert!(before.contains("3000000 bytes"), "{before}");

    // Names outside the root, hidden ones and missing ones: refused, nothing bound.
    for bad in [
        "../outside.txt",
        "/etc/hostname",
        ".dataplane-file-blobs",
        "missing",
    ] {
        a.cli(&["publish", "/data/bad", bad])
            .expect_code(INVALID, bad)
            .expect_plain_error();
    }
    b.cli(&["stat", "/data/bad"])
        .expect_code(NOT_FOUND, "nothing was bound by a refused publish");
    // A host without --files serves none.
    b.cli(&["publish", "/data/bad", "notes.txt"])
        .expect_code(INVALID, "a host without a file root");

    // The host dies and comes back: the blob is served again, unpublished by nobody.
    a.restart();
    let get = b.cli(&["get", "/data/w"]);
    get.expect_code(0, "get the weights after A's restart");
    assert!(get.stdout == weights);
    // The directory dies and comes back: the same length and revision.
    directory.restart();
    let stat = b.cli(&["stat", "/data/w"]);
    stat.expect_code(0, "stat after the directory's restart");
    assert_eq!(String::from_utf8_lossy(&stat.stdout), before);
    let get = b.cli(&["get", "/data/w"]);
    get.expect_code(0, "get the weights after the directory's restart");
    assert!(get.stdout == weights);

    // The file changes (same length): never served again, from either host.
    fs::write(root.join("notes.txt"), b"version two").unwrap();
    for host in [&a, &b] {
        host.cli(&["get", "/data/n"])
            .expect_code(LOST, "get a changed file blob")
            .expect_stderr_line(
                "dataplane: /data/n: the file it was published from changed since (publish it again)",
            );
    }
    // Published again, it is served as it is now.
    a.cli(&["publish", "/data/n", "notes.txt"])
        .expect_code(0, "publish the notes again");
    let get = b.cli(&["get", "/data/n"]);
    get.expect_code(0, "get the notes published again");
    assert_eq!(get.stdout, b"version two");

    // Replaced by an arena blob: the file blob leaves A's table (the directory retired it).
    let table = root.join(".dataplane-file-blobs");
    let with_weights = fs::read(&table).unwrap();
    b.cli_stdin(&["put", "/data/w", "-"], b"small")
        .expect_code(0, "replace the weights");
    dataplane_tests::wait_until(
        "A to forget the replaced file blob",
        std::time::Duration::from_secs(10),
        || fs::read(&table).is_ok_and(|now| now.len() < with_weights.len()),
    );

    // A damaged table: the host refuses to start rather than leave its blobs unserved.
    a.proc.kill9();
    fs::write(&table, b"\xff\xff\xff\xff").unwrap();
    let mut broken = HostProc::spawn_with(&dir, "host-a-broken", &directory.listen, "4M", &files);
    let status = broken.proc.wait_exit(std::time::Duration::from_secs(20));
    assert_eq!(
        status.code(),
        Some(70),
        "a damaged table is a setup failure"
    );
    assert!(
        broken.proc.log_text().contains("the file blobs' table"),
        "{}",
        broken.proc.log_text()
    );
}

//! A directory and two hosts as separate processes: put on one host, get on the other; `mv`
//! and `rm` with their exit codes and one-line messages.

use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

#[test]
fn put_on_one_host_get_on_another_then_mv_and_rm() {
    let dir = TestDir::new("cluster");
    let directory = DirectoryProc::start(&dir, "directory");
    let a = HostProc::start(&dir, "host-a", &directory.listen, "32M");
    let b = HostProc::start(&dir, "host-b", &directory.listen, "32M");

    // A blob of several chunks (a chunk is at most 256 KiB), published from a file on A.
    let bytes = pattern(1, 3_000_017);
    let input = dir.join("input.bin");
    std::fs::write(&input, &bytes).unwrap();
    let put = a.cli(&["put", "/data/c/blob", input.to_str().unwrap()]);
    put.expect_code(0, "put on A");
    // What a command reports goes to stdout; stderr is for failures.
    let published = String::from_utf8(put.stdout.clone()).unwrap();
    let published = published.trim_end().to_owned();
    assert!(
        published.starts_with("/data/c/blob: published at @") && !published.contains('\n'),
        "put reports one line on stdout: {published:?}"
    );
    assert!(
        put.stderr.is_empty(),
        "put succeeds silently on stderr: {:?}",
        put.stderr
    );
    let revision = put.revision();

    // A put whose file cannot be read fails and publishes nothing.
    let not_a_file = dir.join("a-directory");
    std::fs::create_dir(&not_a_file).unwrap();
    let not_a_file = not_a_file.to_str().unwrap();
    a.cli(&["put", "/data/c/unreadable", not_a_file])
        .expect_code(1, "put of a directory")
        .expect_stderr_line(&format!(
            "dataplane: {not_a_file}: Is a directory (os error 21)"
        ));
    b.cli(&["stat", "/data/c/unreadable"])
        .expect_code(2, "stat after a failed put")
        .expect_stderr_line("dataplane: /data/c/unreadable: not found");

    // Read on B: into a file, and to stdout.
    let output = dir.join("output.bin");
    let get = b.cli(&["get", "/data/c/blob", output.to_str().unwrap()]);
    get.expect_code(0, "get on B");
    assert!(get.stderr.is_empty(), "get is silent: {:?}", get.stderr);
    assert!(
        std::fs::read(&output).unwrap() == bytes,
        "B read other bytes"
    );
    let get = b.cli(&["get", "/data/c/blob"]);
    get.expect_code(0, "get on B to stdout");
    assert!(get.stdout == bytes, "B printed other bytes");
    let stat = b.cli(&["stat", "/data/c/blob"]);
    stat.expect_code(0, "stat on B");
    assert_eq!(
        String::from_utf8_lossy(&stat.stdout),
        format!("/data/c/blob: blob, 3000017 bytes, {revision}\n")
    );

    // mv on B; the source path is then gone; the blob still reads (from A, which serves it,
    // and on A itself).
    b.cli(&["mv", "/data/c/blob", "/data/c/moved"])
        .expect_code(0, "mv on B");
    b.cli(&["mv", "/data/c/blob", "/data/c/moved"])
        .expect_code(2, "mv of a path that is gone")
        .expect_stderr_line("dataplane: /data/c/blob: not found");
    b.cli(&["get", "/data/c/blob"])
        .expect_code(2, "get of the moved-away path")
        .expect_stderr_line("dataplane: /data/c/blob: not found");
    let get = a.cli(&["get", "/data/c/moved"]);
    get.expect_code(0, "get of the moved blob on A");
    assert!(get.stdout == bytes, "A read other bytes after mv");

    // A blob from stdin on B; mv onto it without and with --replace.
    b.cli_stdin(&["put", "/data/c/other", "-"], b"small blob\n")
        .expect_code(0, "put from stdin on B");
    a.cli(&["mv", "/data/c/moved", "/data/c/other"])
        .expect_code(3, "mv onto an occupied path")
        .expect_stderr_line("dataplane: /data/c/other: already exists");
    a.cli(&["mv", "/data/c/moved", "/data/c/other", "--replace"])
        .expect_code(0, "mv --replace");
    let get = b.cli(&["get", "/data/c/other"]);
    get.expect_code(0, "get of the replaced path on B");
    assert!(get.stdout == bytes, "the replaced path holds other bytes");

    // rm, twice.
    a.cli(&["rm", "/data/c/other"]).expect_code(0, "rm on A");
    b.cli(&["rm", "/data/c/other"])
        .expect_code(2, "rm of a path that is gone")
        .expect_stderr_line("dataplane: /data/c/other: not found");
    b.cli(&["get", "/data/c/other"])
        .expect_code(2, "get after rm")
        .expect_stderr_line("dataplane: /data/c/other: not found");

    // The CLI's other refusals.
    a.cli(&["get", "/etc/passwd"])
        .expect_code(4, "get outside the allowed prefixes")
        .expect_stderr_line("dataplane: /etc/passwd: not allowed to read there");
    a.cli(&["get", "relative"])
        .expect_code(5, "get of a relative path")
        .expect_stderr_line("dataplane: relative: invalid path: path must start with '/'");
    a.cli(&["frobnicate"])
        .expect_code(64, "unknown command")
        .expect_stderr_line("dataplane: unknown command \"frobnicate\" (see --help)");
}

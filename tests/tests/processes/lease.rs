//! A child that dies (SIGKILL) while it holds a writable lease over most of the arena: the host
//! reclaims the lease when the child's connection ends, and a put that needs the space, queued
//! behind the dead child's lease, then completes.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use dataplane_tests::{DirectoryProc, HostProc, Proc, TestDir, binaries, pattern, wait_until};

const ARENA: &str = "8M";
/// Each of the two blobs needs most of the arena: they cannot both be leased.
const BLOB_BYTES: usize = 6_000_000;

#[test]
fn a_dead_childs_writable_lease_is_reclaimed() {
    let dir = TestDir::new("lease");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, ARENA);
    // Reads copy a blob into the reader's arena: read the big blob on another host.
    let reader = HostProc::start(&dir, "reader", &directory.listen, "16M");

    let mut holder = Proc::spawn(
        "lease-holder",
        Path::new(env!("CARGO_BIN_EXE_lease-holder")),
        vec![
            host.socket.clone().into(),
            "/data/l/held".into(),
            BLOB_BYTES.to_string().into(),
        ],
        dir.join("lease-holder.log"),
    );
    wait_until(
        "the lease holder to be granted its writable lease",
        Duration::from_secs(20),
        || {
            holder.assert_running();
            holder.log_text().starts_with("granted ")
        },
    );

    // A put that needs the space waits behind the held lease (FIFO arena queue)...
    let bytes = pattern(5, BLOB_BYTES);
    let input = dir.join("big.bin");
    std::fs::write(&input, &bytes).unwrap();
    let args: Vec<OsString> = vec![
        "--socket".into(),
        host.socket.clone().into(),
        "put".into(),
        "/data/l/big".into(),
        input.clone().into(),
    ];
    let mut put = Proc::spawn("put", &binaries().cli, args, dir.join("put.log"));
    let watch = Instant::now() + Duration::from_millis(500);
    while Instant::now() < watch {
        assert!(
            put.try_wait().is_none(),
            "the put finished while the lease was held: {}",
            put.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    holder.assert_running();

    // ... and completes once the holder dies without sealing.
    holder.kill9();
    let status = put.wait_exit(Duration::from_secs(20));
    assert!(
        status.success(),
        "the put after the holder died: {status}: {}",
        put.log_text()
    );
    let get = reader.cli(&["get", "/data/l/big"]);
    get.expect_code(0, "get of the put blob on another host");
    assert!(get.stdout == bytes, "the put blob reads back other bytes");
    // The holder never published.
    host.cli(&["stat", "/data/l/held"])
        .expect_code(2, "stat of the dead holder's path")
        .expect_stderr_line("dataplane: /data/l/held: not found");
    // Removing the blob retires its source and frees its lease: another big put fits.
    host.cli(&["rm", "/data/l/big"])
        .expect_code(0, "rm of the big blob");
    host.cli(&["put", "/data/l/big2", input.to_str().unwrap()])
        .expect_code(0, "a second big put after rm");
}

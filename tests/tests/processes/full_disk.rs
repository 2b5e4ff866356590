//! A directory whose disk fills up, with real processes: its data directory on a small tmpfs
//! the test mounts, a host beside it, and the tmpfs filled by a file the test writes until the
//! kernel says `ENOSPC`. The directory must not stop: it refuses new operations with a typed
//! `NoSpace` that names its data directory (the CLI exits 75 and says so), keeps serving reads
//! and replays of acknowledged operations, raises `dataplane_directory_disk_full`, and takes
//! new operations again by itself once the file is removed; nothing acknowledged is lost,
//! across a SIGKILL too.
//!
//! Mounting needs root: without it the test says so and passes without running (the
//! simulator's full-disk episodes check the same rules on every seed that has them).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dataplane_core::error::NamespaceError;
use dataplane_core::wire::ReplyBody;
use dataplane_tests::raw::{RawClient, register_actor as raw_register};
use dataplane_tests::{
    DirectoryProc, HostProc, Proc, TestDir, binaries, directory_args, free_address, pattern,
};

use crate::ops::{sample, scrape};

/// The tmpfs: room for the log's first preallocation step and a little more.
const DISK: &str = "4m";
/// `dataplane`'s exit status for a full disk at the directory (EX_TEMPFAIL).
const TEMPORARY: i32 = 75;

/// A tmpfs mounted at a path; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK}"), "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        status.success().then(|| Tmpfs(at.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes zeros to `path` until the file system refuses (`ENOSPC`); returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).expect("the filler file");
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "{e}");
                break;
            }
        }
    }
    let _ = file.sync_all();
    written
}

fn gauge(metrics: &str, name: &str) -> f64 {
    sample(&scrape(metrics), name).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn a_full_disk_stops_new_operations_not_the_directory() {
    let dir = TestDir::new("full-disk");
    let Some(disk) = Tmpfs::mount(&dir.join("disk")) else {
        eprintln!("skipped: a tmpfs cannot be mounted here (mount needs root)");
        return;
    };
    let data_dir = disk.0.join("directory");
    let listen = free_address();
    let metrics = free_address();
    let mut args = directory_args(&listen, &data_dir);
    args.extend([OsString::from("--metrics-listen"), metrics.clone().into()]);
    let proc = Proc::spawn(
        "directory",
        &binaries().node,
        args,
        dir.join("directory.log"),
    );
    let mut directory = DirectoryProc {
        proc,
        listen: listen.clone(),
        data_dir: data_dir.clone(),
    };
    directory.wait_ready();
    let host = HostProc::start(&dir, "host", &listen, "16M");
    for i in 0..4u64 {
        host.cli_stdin(
            &["put", &format!("/data/before/{i}"), "-"],
            &pattern(i, 1000),
        )
        .expect_code(0, "a put before the disk fills");
    }
    assert_eq!(gauge(&metrics, "dataplane_directory_disk_full"), 0.0);

    // The disk fills. The log still has room it preallocated: acknowledged registers go on
    // until it has less than its reserve and cannot grow; then they are refused NoSpace.
    let filler = disk.0.join("filler");
    fill(&filler);
    let mut client = RawClient::connect(&listen).expect("a raw client");
    let issuer = 7;
    let mut acknowledged = Vec::new();
    let mut refusal = None;
    'fill: for batch in 0..40u64 {
        let requests = (0..500u64)
            .map(|i| {
                let n = batch * 500 + i;
                raw_register(&format!("/fill/{n}"), n, issuer)
            })
            .collect();
        let replies = client
            .pipeline(requests, 64)
            .expect("the directory answers");
        for (i, reply) in replies.into_iter().enumerate() {
            let n = batch * 500 + i as u64;
            match reply {
                ReplyBody::Registered(Ok(_)) => acknowledged.push(n),
                ReplyBody::Registered(Err(NamespaceError::NoSpace(why))) => {
                    refusal = Some((n, why));
                    break 'fill;
                }
                other => panic!("register {n}: {other:?}"),
            }
        }
    }
    let (refused, why) = refusal.expect("a full disk refuses registers before 20,000");
    assert!(
        why.as_str().contains(&data_dir.display().to_string()),
        "the refusal names the data directory: {why}"
    );
    directory.proc.assert_running();
    assert_eq!(gauge(&metrics, "dataplane_directory_disk_full"), 1.0);
    assert!(gauge(&metrics, "dataplane_directory_no_space_refusals_total") >= 1.0);
    eprintln!(
        "{} registers acknowledged after the disk filled, then NoSpace: {why}",
        acknowledged.len()
    );

    // Reads and replays are still served.
    let last = *acknowledged
        .last()
        .expect("some registers went through first");
    assert!(matches!(
        client.lookup(&format!("/fill/{last}")).unwrap(),
        ReplyBody::LookedUp(Ok(_))
    ));
    let replay = raw_register(&format!("/fill/{last}"), last, issuer);
    assert!(matches!(
        client.call(replay).unwrap(),
        ReplyBody::Registered(Ok(_))
    ));
    let get = host.cli(&["get", "/data/before/2", "-"]);
    get.expect_code(0, "a get while the disk is full");
    assert_eq!(get.stdout, pattern(2, 1000));

    // A put through the host: its publication is refused. The refusal left no trace, so the
    // host settles it with a retraction the full disk still takes (a copy of the publication
    // can no longer take effect), then the put fails: exit 75, and the message names the data
    // directory. A second put meanwhile is refused by the host at once.
    for path in ["/data/refused", "/data/refused-again"] {
        let started = Instant::now();
        let put = host.cli_stdin(&["put", path, "-"], &pattern(91, 2000));
        put.expect_code(TEMPORARY, "a put while the directory's disk is full");
        assert!(
            put.stderr.contains("disk is full")
                && put.stderr.contains(&data_dir.display().to_string()),
            "{}",
            put.stderr
        );
        eprintln!(
            "{path}: refused in {:?}: {}",
            started.elapsed(),
            put.stderr.trim()
        );
        host.cli(&["stat", path])
            .expect_code(2, "nothing was published");
    }

    // Room again: the directory takes new operations by itself within its retry period, and
    // the host within its hold after the last refusal it heard (1 s).
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    loop {
        let put = host.cli_stdin(&["put", "/data/after", "-"], &pattern(92, 2000));
        if put.code == 0 {
            break;
        }
        put.expect_code(TEMPORARY, "a put just after space was freed");
        assert!(
            freed.elapsed() < Duration::from_secs(5),
            "puts still refused 5 s after space was freed: {}",
            put.stderr
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "a put was published {:?} after space was freed",
        freed.elapsed()
    );
    let again = raw_register(&format!("/fill/{refused}"), refused, issuer);
    assert!(matches!(
        client.call(again).unwrap(),
        ReplyBody::Registered(Ok(_))
    ));
    assert_eq!(gauge(&metrics, "dataplane_directory_disk_full"), 0.0);

    // Nothing acknowledged is lost, across a SIGKILL.
    client.shutdown();
    directory.restart();
    let mut client = RawClient::connect(&listen).expect("a raw client after the restart");
    for n in acknowledged.iter().copied().chain([refused]) {
        assert!(
            matches!(
                client.lookup(&format!("/fill/{n}")).unwrap(),
                ReplyBody::LookedUp(Ok(_))
            ),
            "/fill/{n} lost"
        );
    }
    for path in ["/data/after", "/data/before/3"] {
        host.cli(&["stat", path]).expect_code(0, path);
    }
}

//! Names that take long to resolve. A host's listen address is whatever it said in its hello,
//! and a directory address may be a DNS name: a node looked such names up on its driver
//! thread, so a slow DNS server (or a host that names a slow name on purpose) stalled every
//! child of every host that had to reach it. Now names are looked up on threads of their own
//! (`dataplane_io::resolve`).
//!
//! The slow DNS is a small `LD_PRELOAD` library built by the test: `getaddrinfo` of a name
//! ending in `.slow.invalid` sleeps `SLOW_DNS_MS` milliseconds, then answers 127.0.0.1 (other
//! names go to the system's).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dataplane_tests::{
    DirectoryProc, HostProc, Proc, TestDir, binaries, directory_args, free_port, wait_until,
};

const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*getaddrinfo_fn)(const char *, const char *, const struct addrinfo *,
                              struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
    getaddrinfo_fn real = (getaddrinfo_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    const char *suffix = ".slow.invalid";
    size_t n = node ? strlen(node) : 0, m = strlen(suffix);
    if (n > m && strcmp(node + n - m, suffix) == 0) {
        const char *ms = getenv("SLOW_DNS_MS");
        if (ms) {
            long n = atol(ms);
            struct timespec t = { n / 1000, (n % 1000) * 1000000L };
            nanosleep(&t, NULL);
        }
        return real("127.0.0.1", service, hints, res);
    }
    return real(node, service, hints, res);
}
"#;

/// How long the slow names take to resolve in the hosts that find them slow: below the 5 s a
/// host waits for a lookup (and for a peer's address), far above what a local call takes.
const SLOW_MS: u64 = 3_500;
/// What a call that needs no lookup may take on a loaded machine (the old loop stalled for
/// the whole lookup: [`SLOW_MS`]).
const QUICK: Duration = Duration::from_millis(1_800);

/// Builds the shim in `dir` (with the C compiler the Rust toolchain links with).
fn build_shim(dir: &TestDir) -> PathBuf {
    let source = dir.join("slow_dns.c");
    let library = dir.join("slow_dns.so");
    std::fs::write(&source, SHIM).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e} (the test builds an LD_PRELOAD library)"));
    assert!(
        out.status.success(),
        "{cc}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    library
}

fn slow_env(shim: &Path, ms: u64) -> Vec<(OsString, OsString)> {
    vec![
        ("LD_PRELOAD".into(), shim.into()),
        ("SLOW_DNS_MS".into(), ms.to_string().into()),
    ]
}

/// A host listening at `listen` whose names resolve through the shim as `env` says.
fn host(
    dir: &TestDir,
    name: &str,
    directory: &str,
    listen: String,
    env: Vec<(OsString, OsString)>,
    extra: &[OsString],
) -> HostProc {
    let mut host = HostProc::spawn_env(dir, name, directory, listen, "8M", extra, env);
    host.wait_ready();
    host
}

/// How long `arena` and a local put take on `host`; both must succeed.
fn local_calls(host: &HostProc, dir: &TestDir, path: &str) -> Duration {
    let input = dir.join("local.bin");
    std::fs::write(&input, b"local bytes").unwrap();
    let started = Instant::now();
    host.cli(&["arena"]).expect_code(0, "arena");
    host.cli(&["put", path, input.to_str().unwrap()])
        .expect_code(0, "a local put");
    started.elapsed()
}

/// Host A reads a blob from host C, whose listen address is a name that takes A 3.5 s to
/// resolve. Meanwhile A's own children are served at once; then the read completes.
#[test]
fn a_peer_whose_name_resolves_slowly_stalls_no_child() {
    let dir = TestDir::new("slow-peer-name");
    let shim = build_shim(&dir);
    let directory = DirectoryProc::start(&dir, "directory");
    // C resolves its own name at once (it binds it); A finds it slow.
    let c_listen = format!("host-c.slow.invalid:{}", free_port());
    let c = host(
        &dir,
        "host-c",
        &directory.listen,
        c_listen,
        slow_env(&shim, 0),
        &[],
    );
    let metrics = dataplane_tests::free_address();
    let a_listen = format!("127.0.0.1:{}", free_port());
    let a = host(
        &dir,
        "host-a",
        &directory.listen,
        a_listen,
        slow_env(&shim, SLOW_MS),
        &["--metrics-listen".into(), metrics.clone().into()],
    );
    let input = dir.join("remote.bin");
    std::fs::write(&input, b"served by a host with a slow name").unwrap();
    c.cli(&["put", "/data/remote", input.to_str().unwrap()])
        .expect_code(0, "put on C");
    let started = Instant::now();
    let reader = {
        let socket = a.socket.clone();
        std::thread::spawn(move || {
            dataplane_tests::cli_with(
                &socket,
                &["get", "/data/remote"],
                None,
                Duration::from_secs(60),
            )
        })
    };
    // The get waits for A's lookup of C's name (the gauges are read at least every second).
    wait_until("A's lookup of C's name", Duration::from_secs(3), || {
        crate::ops::sample(&crate::ops::scrape(&metrics), "dataplane_host_name_lookups")
            == Some(1.0)
    });
    let gauges = crate::ops::scrape(&metrics);
    assert!(
        crate::ops::sample(&gauges, "dataplane_host_frames_waiting_for_address")
            .is_some_and(|v| v >= 1.0),
        "{gauges}"
    );
    let mut slowest = Duration::ZERO;
    for i in 0..3 {
        slowest = slowest.max(local_calls(&a, &dir, &format!("/data/local-{i}")));
    }
    eprintln!("local calls during the lookup: slowest {slowest:?}");
    assert!(
        slowest < QUICK,
        "A's children waited {slowest:?} for a lookup of another host's name"
    );
    assert!(
        !reader.is_finished(),
        "the remote get was over before the local calls were: nothing was measured during \
         its lookup"
    );
    let got = reader.join().unwrap();
    got.expect_code(0, "the remote get once the name resolved");
    assert_eq!(got.stdout, b"served by a host with a slow name");
    eprintln!("remote get took {:?}", started.elapsed());
}

/// Host A's directory address is a name that takes 3.5 s to resolve. While the directory is
/// down, A tries it again and again (a lookup each time): A's children that need no directory
/// are served at once meanwhile, and A is back once the directory is.
#[test]
fn a_directory_name_that_resolves_slowly_stalls_no_child() {
    let dir = TestDir::new("slow-directory-name");
    let shim = build_shim(&dir);
    let port = free_port();
    let data_dir = dir.join("directory");
    let mut directory = Proc::spawn(
        "directory",
        &binaries().node,
        directory_args(&format!("127.0.0.1:{port}"), &data_dir),
        dir.join("directory.log"),
    );
    let name = format!("directory.slow.invalid:{port}");
    wait_until("the directory to listen", Duration::from_secs(30), || {
        dataplane_tests::can_connect(&format!("127.0.0.1:{port}"))
    });
    let a = host(
        &dir,
        "host-a",
        &name,
        format!("127.0.0.1:{}", free_port()),
        slow_env(&shim, SLOW_MS),
        &[],
    );
    directory.kill9();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(8) {
        let t = Instant::now();
        a.cli(&["arena"])
            .expect_code(0, "arena while the directory is down");
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("`arena` while the directory was down: slowest {slowest:?}");
    assert!(
        slowest < QUICK,
        "A's children waited {slowest:?} for a lookup of the directory's name"
    );
    directory.start();
    let input = dir.join("after.bin");
    std::fs::write(&input, b"after").unwrap();
    wait_until(
        "A to put through the directory again",
        Duration::from_secs(60),
        || a.cli(&["put", "/data/after", input.to_str().unwrap()]).code == 0,
    );
    let got = a.cli(&["get", "/data/after"]);
    got.expect_code(0, "get after the directory came back");
    assert_eq!(got.stdout, b"after");
}

/// Three replicas that name one another by names that take 3.5 s to resolve. A follower is
/// killed: the leader tries to reconnect to it every 200 ms, a lookup each time. Meanwhile the
/// leader keeps its heartbeats and serves a host's puts at once (the old loop stalled 3.5 s per
/// attempt: the other follower stood for election, and every put waited).
#[test]
fn a_replica_name_that_resolves_slowly_stalls_no_leader() {
    let dir = TestDir::new("slow-replica-names");
    let shim = build_shim(&dir);
    let peers: Vec<String> = (1..=3)
        .map(|i| format!("replica-{i}.slow.invalid:{}", free_port()))
        .collect();
    let list = dataplane_tests::replicas_option(&peers);
    let replicas: Vec<DirectoryProc> = (1..=3)
        .map(|i| {
            let args: Vec<OsString> = vec![
                "--replica-id".into(),
                i.to_string().into(),
                "--replicas".into(),
                list.clone().into(),
            ];
            DirectoryProc::start_env(
                &dir,
                &format!("replica-{i}"),
                &args,
                slow_env(&shim, SLOW_MS),
            )
        })
        .collect();
    let mut group = dataplane_tests::ReplicaGroup { replicas, peers };
    let leader = group.serving(Duration::from_secs(60));
    let a = HostProc::start(&dir, "host-a", &group.listens(), "8M");
    local_calls(&a, &dir, "/data/before");
    let follower = (leader + 1) % 3;
    group.replicas[follower].proc.kill9();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(8) {
        slowest = slowest.max(local_calls(&a, &dir, &format!("/data/during-{i}")));
        i += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("{i} puts while a follower was down: slowest {slowest:?}");
    assert!(
        slowest < QUICK,
        "a put waited {slowest:?} while the leader looked a dead follower's name up"
    );
    assert_eq!(
        group.serving(Duration::from_secs(10)),
        leader,
        "the leadership moved while a follower was down"
    );
}

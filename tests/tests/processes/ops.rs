//! What an operator sees: every binary's `--version`; the nodes' logs (start-up, admissions,
//! refusals); the metrics endpoint of each node, scraped over HTTP while a blob moves between
//! two hosts, and of each replica of a replicated directory; and the `ChildSession` example
//! run against real nodes.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use dataplane_tests::raw::RawClient;
use dataplane_tests::{
    CLI_TIMEOUT, DirectoryProc, HostProc, ReplicaGroup, TestDir, binaries, free_address, pattern,
    wait_until,
};

#[allow(dead_code)] // its `main` is the example's, not ours
#[path = "../../../io-adapter/examples/child_session.rs"]
mod child_session_example;

/// `GET /metrics` at `address`: the body of a 200 answer (panics otherwise).
pub(crate) fn scrape(address: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap_or_else(|e| panic!("{address}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_owned()
}

/// The value of the sample `name` (with its labels, as printed) in a scrape, if present.
pub(crate) fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn value(body: &str, name: &str) -> f64 {
    sample(body, name).unwrap_or_else(|| panic!("no {name} in\n{body}"))
}

fn with_metrics(listen: &str) -> Vec<OsString> {
    vec!["--metrics-listen".into(), listen.into()]
}

#[test]
fn every_binary_answers_version_and_help_prints_the_exit_table() {
    let b = binaries();
    for (program, name) in [(&b.node, "dataplane-node"), (&b.cli, "dataplane")] {
        let out = Command::new(program)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{name} --version");
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text.trim_end(),
            format!("{name} {}", dataplane_cli::VERSION),
            "{name} --version"
        );
        let help = Command::new(program).arg("--help").output().unwrap();
        assert_eq!(help.status.code(), Some(0));
        let help = String::from_utf8(help.stdout).unwrap();
        assert!(
            help.contains(&dataplane_cli::exit_table()),
            "{name}:\n{help}"
        );
    }
    // Subcommands answer too, and `--flag=value` parses.
    let out = Command::new(&b.node)
        .args(["host", "--version"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let out = Command::new(&b.node)
        .args(["directory", "--listen=127.0.0.1:1", "--retry-ms=0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("dataplane-node: ") && stderr.contains("--retry-ms"),
        "{stderr}"
    );
}

#[test]
fn nodes_log_and_serve_metrics_while_a_blob_moves() {
    let dir = TestDir::new("ops");
    let directory_metrics = free_address();
    let directory = DirectoryProc::start_with(&dir, "directory", &with_metrics(&directory_metrics));
    let (a_metrics, b_metrics) = (free_address(), free_address());
    let a = HostProc::start_with(
        &dir,
        "host-a",
        &directory.listen,
        "16M",
        &with_metrics(&a_metrics),
    );
    let b = HostProc::start_with(
        &dir,
        "host-b",
        &directory.listen,
        "16M",
        &with_metrics(&b_metrics),
    );

    // The ChildSession example, against real nodes: write, read, stat.
    let lines = child_session_example::write_read_stat(&a.socket, "/data/ops/example")
        .expect("the ChildSession example");
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[1].ends_with("hello from a child session"),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("/data/ops/example: blob, 26 bytes, @"),
        "{lines:?}"
    );

    // A blob of several chunks, put on A and read on B: a transfer between the hosts.
    let bytes = pattern(7, 1_000_003);
    a.cli_stdin(&["put", "/data/ops/blob", "-"], &bytes)
        .expect_code(0, "put on A");
    let get = b.cli(&["get", "/data/ops/blob"]);
    get.expect_code(0, "get on B");
    assert!(get.stdout == bytes);

    // Something that is not a hello, at the directory: refused, counted, logged.
    let mut junk = TcpStream::connect(&directory.listen).unwrap();
    junk.write_all(&8u32.to_le_bytes()).unwrap();
    junk.write_all(b"not-a-hi").unwrap();
    let mut rest = Vec::new();
    let _ = junk.read_to_end(&mut rest);

    // Gauges are read at most every 100 ms and at least every second.
    let scraped = |address: &str, name: &str, want: f64| {
        wait_until(
            &format!("{name} >= {want} at {address}"),
            Duration::from_secs(10),
            || sample(&scrape(address), name).is_some_and(|v| v >= want),
        );
        scrape(address)
    };
    scraped(
        &directory_metrics,
        "dataplane_directory_hosts_connected",
        2.0,
    );
    // The gauges are sampled together, up to a second after the last change: waiting for the
    // hosts alone could read an entries gauge sampled before the puts (a CI run did: 0).
    let d = scraped(&directory_metrics, "dataplane_directory_entries", 2.0);
    assert!(
        value(&d, "dataplane_directory_mutations_total") >= 2.0,
        "{d}"
    );
    let mutations = value(&d, "dataplane_directory_mutation_seconds_count");
    assert!(mutations >= 2.0, "{d}");
    assert!(
        value(&d, "dataplane_directory_fsync_seconds_count") >= 1.0,
        "{d}"
    );
    assert!(
        value(&d, "dataplane_directory_log_records_total") >= 2.0,
        "{d}"
    );
    assert!(value(&d, "dataplane_directory_entries") >= 2.0, "{d}");
    // No compaction yet (the log is far below its first threshold): served, and empty.
    assert_eq!(
        value(&d, "dataplane_directory_compaction_seconds_count"),
        value(&d, "dataplane_directory_compactions_total"),
        "{d}"
    );
    // Served from the start (an operator alerts on it before the disk is full).
    assert_eq!(
        value(&d, "dataplane_directory_compactions_postponed_total"),
        0.0,
        "{d}"
    );
    assert_eq!(
        value(&d, "dataplane_refusals_total{kind=\"not_a_hello\"}"),
        1.0,
        "{d}"
    );
    // Both hosts are members.
    assert_eq!(value(&d, "dataplane_directory_members"), 2.0, "{d}");
    // Served, and far below the send budget on a quiet node.
    let queued = value(&d, "dataplane_send_queued_bytes");
    assert!((0.0..(1 << 20) as f64).contains(&queued), "{d}");

    // B pulled the blob from A: one transfer, every byte received (its read lease is gone
    // once the CLI released it).
    let bm = scraped(&b_metrics, "dataplane_host_transfers_started_total", 1.0);
    assert_eq!(
        value(&bm, "dataplane_host_transfers_started_total"),
        1.0,
        "{bm}"
    );
    assert_eq!(
        value(
            &bm,
            "dataplane_host_transfer_bytes_total{direction=\"received\"}"
        ),
        bytes.len() as f64,
        "{bm}"
    );
    assert!(
        value(
            &bm,
            "dataplane_host_transfer_chunks_total{direction=\"received\"}"
        ) >= 4.0
    );
    // B asked the directory where A listens, once; nothing waits for an address, and the
    // literal addresses needed no lookup (read a second after the transfer: fresh gauges).
    std::thread::sleep(Duration::from_millis(1_100));
    let bm = scraped(&b_metrics, "dataplane_host_peer_addresses", 1.0);
    assert_eq!(value(&bm, "dataplane_host_peer_addresses"), 1.0, "{bm}");
    assert_eq!(
        value(&bm, "dataplane_host_frames_waiting_for_address"),
        0.0,
        "{bm}"
    );
    assert_eq!(value(&bm, "dataplane_host_name_lookups"), 0.0, "{bm}");
    assert_eq!(
        value(&bm, "dataplane_host_directory_connected"),
        1.0,
        "{bm}"
    );
    for name in [
        "dataplane_host_proxy_pending_requests",
        "dataplane_host_sessions",
        "dataplane_host_bindings",
        "dataplane_host_operations_in_progress",
        "dataplane_host_retractions_pending",
        "dataplane_host_frames_waiting_for_address",
        "dataplane_host_name_lookups",
        "dataplane_host_transfers_in_progress",
        "dataplane_host_arena_queued_requests",
        "dataplane_connections{listener=\"children\",state=\"admitted\"}",
    ] {
        assert!(sample(&bm, name).is_some(), "no {name} in\n{bm}");
    }
    assert_eq!(
        value(&bm, "dataplane_host_retractions_pending"),
        0.0,
        "nothing handed over: {bm}"
    );
    // A holds both published blobs in its arena and sent B the bytes.
    let am = scraped(&a_metrics, "dataplane_host_bindings", 2.0);
    assert_eq!(
        value(
            &am,
            "dataplane_host_transfer_bytes_total{direction=\"sent\"}"
        ),
        bytes.len() as f64,
        "{am}"
    );
    assert!(
        value(&am, "dataplane_host_children_attached_total") >= 2.0,
        "{am}"
    );
    let used = value(&am, "dataplane_host_arena_bytes{state=\"used\"}");
    let free = value(&am, "dataplane_host_arena_bytes{state=\"free\"}");
    assert_eq!(used + free, (16 << 20) as f64, "{am}");
    assert!(used >= bytes.len() as f64, "{am}");
    assert!(
        value(&am, "dataplane_host_arena_largest_free_bytes") <= free,
        "{am}"
    );
    assert!(value(&am, "dataplane_host_arena_leases") >= 2.0, "{am}");

    // The logs say who started, with what, and who was admitted and refused.
    let log = directory.proc.log_text();
    for needle in [
        "INFO dataplane_io::dirnode: directory started",
        &format!("version=\"{}\"", dataplane_cli::VERSION),
        "INFO dataplane_io::dirnode: log: created a new log in ",
        "INFO dataplane_io::dirnode: log replayed",
        "INFO dataplane_io::dirnode: metrics served",
        "INFO dataplane_io::dirnode: host admitted (new)",
        "INFO dataplane_io::dirnode: connection refused",
        "reason=not a dataplane hello",
    ] {
        assert!(
            log.contains(needle),
            "no {needle:?} in the directory's log:\n{log}"
        );
    }
    let log = b.proc.log_text();
    for needle in [
        "INFO dataplane_io::hostnode: host started",
        "INFO dataplane_io::hostnode: welcomed by the directory",
    ] {
        assert!(
            log.contains(needle),
            "no {needle:?} in host B's log:\n{log}"
        );
    }
}

#[test]
fn replicas_serve_their_metrics_and_say_which_one_leads() {
    let dir = TestDir::new("ops-replica-metrics");
    let metrics: Vec<String> = (0..3).map(|_| free_address()).collect();
    let mut group = ReplicaGroup::start_with(&dir, "replica", 3, |i| with_metrics(&metrics[i]));
    let leader = group.serving(Duration::from_secs(20));
    let mut client = RawClient::connect(&group.replicas[leader].listen).unwrap();
    client.lookup("/data/nothing-here").unwrap();
    let mut term = None;
    wait_until(
        "every replica's metrics to show the same term, one leader and the entries applied",
        Duration::from_secs(10),
        || {
            let bodies: Vec<String> = metrics.iter().map(|m| scrape(m)).collect();
            let terms: Vec<f64> = bodies
                .iter()
                .map(|b| value(b, "dataplane_replica_term"))
                .collect();
            let leaders: Vec<f64> = bodies
                .iter()
                .map(|b| value(b, "dataplane_replica_leader"))
                .collect();
            let applied: Vec<f64> = bodies
                .iter()
                .map(|b| value(b, "dataplane_replica_applied_index"))
                .collect();
            term = Some(terms[0]);
            terms.iter().all(|t| *t == terms[0] && *t >= 1.0)
                && leaders.iter().sum::<f64>() == 1.0
                && leaders[leader] == 1.0
                && applied.iter().all(|a| *a >= 2.0 && *a == applied[0])
                && bodies
                    .iter()
                    .all(|b| value(b, "dataplane_replica_peers_connected") == 2.0)
        },
    );
    assert_eq!(
        term,
        Some(client.epoch.0 as f64),
        "the term is the epoch clients see"
    );
}

/// A connection the leader's connection machine refused (not a hello) or expired (silent past
/// the admission deadline) reports no close, and the replica kept it in its table of host
/// connections until the leadership changed: a slow leak any stranger could drive.
#[test]
fn a_leader_forgets_the_host_connections_it_refused_or_expired() {
    let dir = TestDir::new("ops-replica-refused");
    let metrics: Vec<String> = (0..3).map(|_| free_address()).collect();
    let mut group = ReplicaGroup::start_with(&dir, "replica", 3, |i| with_metrics(&metrics[i]));
    let leader = group.serving(Duration::from_secs(20));
    let listen = group.replicas[leader].listen.clone();
    // Frames of a sensible size that are no hello: refused at once.
    let mut garbage = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(&listen).unwrap();
        s.write_all(&3u32.to_le_bytes()).unwrap();
        s.write_all(&[0xff, 0xff, 3]).unwrap();
        garbage.push(s);
    }
    // Silent ones: closed at the admission deadline (5 s).
    let silent: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(&listen).unwrap())
        .collect();
    wait_until(
        "the leader to hold no host connection once the strangers are refused and expired",
        Duration::from_secs(20),
        || {
            let body = scrape(&metrics[leader]);
            value(&body, "dataplane_replica_leader") == 1.0
                && value(&body, "dataplane_replica_host_connections") == 0.0
        },
    );
    drop((garbage, silent));
}

#[test]
fn a_child_without_a_host_hears_what_to_do() {
    // No host at the socket: the CLI says so and what to do (exit 69), not an OS error about
    // a file the user never named.
    let dir = TestDir::new("no-host");
    let socket = dir.join("none.sock");
    let out = dataplane_tests::cli_with(&socket, &["stat", "/data/x"], None, CLI_TIMEOUT);
    out.expect_code(69, "a CLI call without a host")
        .expect_plain_error();
    assert!(
        out.stderr.contains(&format!(
            "no host serves {} (there is no such socket)",
            socket.display()
        )) && out.stderr.contains("--socket"),
        "{}",
        out.stderr
    );
    // A socket without its capability file: a host that is still starting, or the wrong path.
    std::fs::write(&socket, b"").unwrap();
    let out = dataplane_tests::cli_with(&socket, &["stat", "/data/x"], None, CLI_TIMEOUT);
    out.expect_code(69, "a CLI call before the host serves")
        .expect_plain_error();
    assert!(
        out.stderr.contains("has no capability file"),
        "{}",
        out.stderr
    );
}

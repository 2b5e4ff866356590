//! Real-IO throughput: durable mutations against a real directory node process, a local
//! put-then-get through a real host node's arena, a remote get between two real host node
//! processes over loopback TCP, and a sustained put-and-read load on two hosts — each against a baseline measured in the same run (the machine
//! is shared and noisy, so numbers from another run are not comparable).
//!
//! Run with `cargo bench -p dataplane-io-bench --bench io` (add `-- --quick`, or set
//! `DATAPLANE_BENCH_QUICK=1`, for a seconds-long smoke run; any other non-flag argument filters
//! the measurements by substring of their name). Each measurement prints
//!
//! ```text
//! BENCH name=<id> ... ours=<rate> baseline=<what> <what>=<rate> ratio=<ours/baseline>
//! ```
//!
//! plus informational lines starting with `#`. Both rates are the **best** of several
//! repetitions, ours and the baseline interleaved.
//!
//! The nodes are the `dataplane-node` binary of `dataplane-io`, which this bench builds first
//! (`cargo build --release -p dataplane-io --bins` into its own target directory;
//! `DATAPLANE_NODE_BIN` names another one instead),
//! started on a fresh temporary directory and free loopback ports, logging errors only (set
//! `RUST_LOG` to see more). Every process this bench starts is killed when its handle drops
//! (also when the bench panics), and dies with the bench if the bench is killed
//! (`PR_SET_PDEATHSIG`).
//!
//! * **`durable_mutations`** (1, 16 and 64 clients): acknowledged mutations per second.
//!   *Ours*: one directory node process. Each client is its own TCP connection and thread
//!   (N clients = N connections): the client handshake, `Link::Welcome`, then closed-loop
//!   `Register`s of fresh paths (`/bench/<client>/<seq>`, fresh operation id, fresh source
//!   actor on the client's transient node, `SourceRecovery::Actor`, 4096 bytes, no
//!   reservation), one outstanding at a time; a mutation counts when its `Registered(Ok)`
//!   reply arrives — the node sends it only after the `fdatasync` that covers its log record
//!   (group commit). *Baseline (`sqlite`)*: SQLite (bundled, through `rusqlite`) in WAL mode
//!   with `synchronous=FULL`, one connection per client thread, the same closed loop: per
//!   mutation one `BEGIN IMMEDIATE` transaction that bumps a revision counter
//!   (`UPDATE meta ... RETURNING`) and `INSERT OR REPLACE`s the row (path, revision, source
//!   node/incarnation/actor, length, operation id), then `COMMIT` (one WAL fsync per commit:
//!   SQLite has one writer and no group commit). `busy_timeout` is 60 s, so writers queue on
//!   SQLite's lock (its busy handler sleeps). Both databases live in the same temporary
//!   directory (the same filesystem) and grow over the whole measurement.
//!   *Second baseline (`group_commit`)*, on its own `BENCH name=durable_mutations_group` line:
//!   the best a plain file can do with group commit, without a network, a machine or a
//!   process boundary. N threads (N = clients) in the same closed loop, each appending a
//!   4 KiB record to one plain file (`O_APPEND`, growing, a fresh file per client count in the
//!   same directory) under a mutex, then waiting until an `fdatasync` covers it: the first
//!   thread to find none running becomes the leader and syncs everything appended so far,
//!   the others wait on a condition variable and are woken when it is done (leader/follower
//!   group commit). Measured for the same time, interleaved with ours.
//!   *Floor (`durable_echo`)*, with one client, on its own `BENCH name=durable_mutations_floor`
//!   line: a thread of this process answers each 256-byte request over loopback TCP after a
//!   `pwrite` of it into a preallocated file and an `fdatasync`; no framing, decoding or
//!   state. What a one-client mutation cannot go below here.
//! * **`replicated_mutations`** (1 and 64 clients): the same closed loop against the leader of
//!   a replicated directory (issue 19: three `dataplane-node directory --replica-id` processes
//!   on this machine, each with its own data directory on the same disk; a reply leaves once
//!   two of them synced the entry). *Baseline (`single_node`)*: one directory node, the same
//!   loop, interleaved.
//! * **`replicated_reads`** (1 and 64 clients): the same, with `Resolve`s of a path each
//!   client registered first (untimed). The leader answers a read once a heartbeat round
//!   confirmed it still leads (ReadIndex), with no log entry; the single node at once.
//! * **`local_put_get`** (64 MiB; 4 MiB in quick mode): a directory node and one host node;
//!   this bench is the child (`ChildSession` on the host's socket). Timed: `put` of the path
//!   (OpenWrite; the child copies the caller's buffer into its staging buffer, seals; the host
//!   copies the staging buffer into the lease, which no child can write, and with BLAKE3
//!   hashes it; Register at the directory with its fsync; Release) then `read` of it (Resolve;
//!   the blob is this host's own, so the grant views the writer's sealed lease: no copy and
//!   no hash). Untimed: every byte of the view is compared with the caller buffer. Each
//!   repetition overwrites the same path. *Baseline (`memcpy`)*: copy the caller buffer into
//!   a pre-faulted buffer (the put) and that buffer into a second pre-faulted one (the get):
//!   two payload copies, as ours does, and nothing else. Rate = blob bytes / time of the
//!   put-then-get, for both.
//! * **`remote_get`** (64 MiB; 4 MiB in quick mode): a directory node and host nodes A and B.
//!   The blob is put once on A (a `ChildSession` on A's socket, untimed); timed: a `read` of it
//!   through a `ChildSession` on B's socket (Resolve, then B pulls the payload from A in
//!   `chunk_bytes` chunks, `window` in flight, over the hosts' TCP link, checks the digest,
//!   `ReadGranted`). One untimed read first opens the A–B link. *Baseline (`tcp`)*: a helper
//!   process (this bench binary started again with `--tcp-sender`) holding the same bytes in a
//!   pre-faulted buffer, connected over loopback TCP to this process; timed: this process
//!   sends an 8-byte request, the helper `write_all`s the whole buffer, this process
//!   `read_exact`s it into a pre-faulted buffer. Two processes, one copy out of user memory and
//!   one into user memory, the kernel's segmentation: the best a TCP copy of the bytes between
//!   two processes can do here (the hosts themselves cannot be made to run it).
//!   *`remote_get_file`* (issue 17), on its own `BENCH` line of the digest-less run: A also
//!   serves the same bytes as a file blob (`--files`, `publish_file`: A reads each chunk from
//!   the file with `pread`, checking its stamp); timed like ours, interleaved with it, and
//!   compared with ours (`baseline=remote_get`): a file blob should move as fast as an arena
//!   blob.
//!
//! * **`sustained_put_get`** (16 and 64 child sessions, half on each of two host nodes, 30 s;
//!   2 s in quick mode): every session loops "put 1 KiB at a fresh path, read it back"
//!   (`ChildSession`, no digest). Prints puts/s, gets/s, p50/p99 of each call, errors, the
//!   throughput of every second, and the seconds from the end of the load until a fresh put
//!   succeeds on each host. *Baseline*: the run's own first quarter; the ratio is the last
//!   quarter's throughput over the first's (flat is 1.0: the hosts used to refuse everything
//!   after 4,096 puts each, issue 11).
//!
//! Benches live outside the pure core, so they may read the wall clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::ffi::OsStr;
use std::fs;
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dataplane_core::blob::DigestKind;
use dataplane_core::ids::{Address, OperationId, RequestId};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, Envelope, Message, ReplyBody, SourceRecovery,
};
use dataplane_io::child::ChildSession;
use dataplane_io::frame::{FrameReader, write_frame};
use dataplane_io::net::{Link, Who, handshake_blocking};

/// The targets the numbers are judged against (informational: printed as `meets` or `MISSES`,
/// never asserted). Issue 18's, except the first (issue 11's, against SQLite at 64 clients).
const TARGET_MUTATIONS_RATIO_AT_64: f64 = 3.0;
const TARGET_MUTATIONS_1_VS_SQLITE: f64 = 1.2;
const TARGET_MUTATIONS_64_VS_GROUP: f64 = 0.6;
const TARGET_LOCAL_RATIO: f64 = 0.95;
const TARGET_LOCAL_BLAKE3_RATIO: f64 = 0.45;
const TARGET_REMOTE_RATIO: f64 = 0.9;
/// What the host nodes use (`HostConfig::new` defaults; `dataplane-node host` does not change
/// them). Informational: printed with `remote_get`.
const HOST_CHUNK_BYTES: u64 = dataplane_io::hostnode::TRANSFER_CHUNK_BYTES as u64;
const HOST_WINDOW: u64 = dataplane_io::hostnode::TRANSFER_WINDOW as u64;
/// The length every registered blob claims.
const REGISTER_LENGTH: u64 = 4096;
/// How long a started node may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
struct Budget {
    /// How long each closed-loop run of `durable_mutations` lasts, and how many of each.
    mutation_time: Duration,
    mutation_reps: usize,
    blob_bytes: usize,
    blob_reps: usize,
    /// How long each `sustained_put_get` run loads the hosts.
    sustained: Duration,
}

impl Budget {
    fn full() -> Self {
        Budget {
            mutation_time: Duration::from_secs(2),
            mutation_reps: 3,
            sustained: Duration::from_secs(30),
            blob_bytes: 64 << 20,
            blob_reps: 5,
        }
    }

    fn quick() -> Self {
        Budget {
            mutation_time: Duration::from_millis(250),
            mutation_reps: 1,
            blob_bytes: 4 << 20,
            blob_reps: 2,
            sustained: Duration::from_secs(2),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Processes and scratch space

/// A started process, killed and reaped when dropped.
#[derive(Debug)]
struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    /// Starts `command`; the process also dies if this bench dies.
    fn start(name: &str, mut command: Command) -> Proc {
        command.stdin(Stdio::null());
        // The nodes' logs would bury the BENCH lines: errors only, unless RUST_LOG says.
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "error");
        }
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            name: name.to_owned(),
            child,
        }
    }

    /// Panics if the process already exited.
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited early: {status}", self.name);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asks the kernel to kill the started process when the thread that started it (this bench's
/// main thread) dies, so an interrupted bench leaves nothing behind.
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls `prctl`, which
    // is async-signal-safe; it touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A fresh directory under the system's temporary directory, removed when dropped.
fn scratch(what: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("dataplane-io-bench-{what}-"))
        .tempdir()
        .expect("a scratch directory")
}

/// `dataplane-node`: `$DATAPLANE_NODE_BIN`, or built once (release) next to this bench.
fn node_binary() -> PathBuf {
    static NODE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    NODE.get_or_init(|| {
        if let Some(path) = std::env::var_os("DATAPLANE_NODE_BIN") {
            return PathBuf::from(path);
        }
        // target/release/deps/io-<hash> -> target/release
        let exe = std::env::current_exe().expect("the bench's path");
        let mut profile_dir = exe.parent().expect("a directory").to_path_buf();
        if profile_dir.file_name().is_some_and(|n| n == "deps") {
            profile_dir.pop();
        }
        let target_dir = profile_dir.parent().expect("a target directory");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "--release",
                "-p",
                "dataplane-io",
                "--bins",
            ])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .status()
            .expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p dataplane-io --bins failed"
        );
        let node = profile_dir.join("dataplane-node");
        assert!(node.is_file(), "{} was not built", node.display());
        node
    })
    .clone()
}

/// A loopback address with a port that was free a moment ago.
fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    format!("127.0.0.1:{port}")
}

/// Waits until `proc` accepts TCP connections at `address`.
fn wait_tcp(proc: &mut Proc, address: &str) {
    let started = Instant::now();
    loop {
        if TcpStream::connect(address).is_ok() {
            return;
        }
        proc.check_alive();
        assert!(
            started.elapsed() < STARTUP_TIMEOUT,
            "{} does not listen at {address}",
            proc.name
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Connects a child session to the host `proc` (waiting for it to come up).
fn wait_session(proc: &mut Proc, socket: &Path) -> ChildSession {
    let started = Instant::now();
    loop {
        match ChildSession::connect(socket) {
            Ok(session) => return session,
            Err(error) => {
                proc.check_alive();
                assert!(
                    started.elapsed() < STARTUP_TIMEOUT,
                    "{}: no child session: {error}",
                    proc.name
                );
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Node processes on one scratch directory. Fields drop in order: processes first.
#[derive(Debug)]
struct Cluster {
    procs: Vec<Proc>,
    directory: String,
    /// Every host's child socket, in start order.
    sockets: Vec<PathBuf>,
    scratch: tempfile::TempDir,
}

impl Cluster {
    /// A directory node on a fresh data directory.
    fn start(what: &str) -> Cluster {
        let scratch = scratch(what);
        let directory = free_address();
        let mut command = Command::new(node_binary());
        command
            .arg("directory")
            .arg("--listen")
            .arg(&directory)
            .arg("--data-dir")
            .arg(scratch.path().join("directory"));
        let mut proc = Proc::start("directory node", command);
        wait_tcp(&mut proc, &directory);
        Cluster {
            procs: vec![proc],
            directory,
            sockets: Vec::new(),
            scratch,
        }
    }

    /// Starts a host node with an arena of `arena_bytes` and returns a child session on it.
    fn host(&mut self, name: &str, arena_bytes: usize) -> ChildSession {
        self.host_with(name, arena_bytes, &[])
    }

    /// [`host`](Self::host) with `extra` options on the host's command line.
    fn host_with(&mut self, name: &str, arena_bytes: usize, extra: &[&OsStr]) -> ChildSession {
        let socket = self.scratch.path().join(format!("{name}.sock"));
        let mut command = Command::new(node_binary());
        command
            .arg("host")
            .arg("--directory")
            .arg(&self.directory)
            .arg("--listen")
            .arg(free_address())
            .arg("--socket")
            .arg(&socket)
            .arg("--arena-size")
            .arg(arena_bytes.to_string())
            .args(extra);
        let mut proc = Proc::start(&format!("host node {name}"), command);
        let session = wait_session(&mut proc, &socket);
        self.procs.push(proc);
        self.sockets.push(socket);
        session
    }

    fn check_alive(&mut self) {
        for p in &mut self.procs {
            p.check_alive();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Printing

fn rate(per_sec: f64) -> String {
    if per_sec >= 1000.0 {
        format!("{per_sec:.0}")
    } else {
        format!("{per_sec:.2}")
    }
}

fn gib(bytes_per_sec: f64) -> String {
    format!("{:.2}GiB/s", bytes_per_sec / f64::from(1u32 << 30))
}

fn size_name(bytes: usize) -> String {
    format!("{}MiB", bytes >> 20)
}

fn verdict(id: &str, ratio: f64, target: f64) {
    let v = if ratio >= target { "meets" } else { "MISSES" };
    println!("# {id}: ratio {ratio:.2}: {v} the >= {target}x target");
}

// ---------------------------------------------------------------------------------------------
// sustained_put_get

/// Bytes of every blob the sustained load writes.
const SUSTAINED_BLOB_BYTES: usize = 1024;

/// `sessions` child sessions, half on each of two hosts, each looping "put 1 KiB at a fresh
/// path, then read it back" for the budget's sustained time. Prints puts/s and gets/s, the
/// p50/p99 of each call, the errors, the throughput of every second, the ratio of the last
/// quarter's throughput to the first quarter's (flat = 1.0; the host used to wedge after 4,096
/// puts), and how long after the load a fresh put on each host took to succeed.
fn sustained_put_get(budget: Budget, sessions: usize) {
    let mut cluster = Cluster::start("sustained");
    // Room for every blob the run publishes (1,216 bytes each in the arena).
    let arena = if budget.sustained >= Duration::from_secs(10) {
        512 << 20
    } else {
        64 << 20
    };
    for name in ["a", "b"] {
        drop(cluster.host(name, arena));
    }
    let secs = budget.sustained.as_secs().max(1) as usize;
    let per_second: Arc<Vec<AtomicU64>> =
        Arc::new((0..secs + 1).map(|_| AtomicU64::new(0)).collect());
    let started = Instant::now();
    let barrier = Arc::new(Barrier::new(sessions));
    let workers: Vec<_> = (0..sessions)
        .map(|i| {
            let socket = cluster.sockets[i % 2].clone();
            let per_second = per_second.clone();
            let barrier = barrier.clone();
            let duration = budget.sustained;
            thread::spawn(move || {
                let mut session = ChildSession::connect(&socket).expect("a session");
                session.set_digest(DigestKind::None);
                let bytes = payload(SUSTAINED_BLOB_BYTES);
                let (mut puts, mut gets, mut errors) = (Vec::new(), Vec::new(), 0u64);
                barrier.wait();
                let begin = Instant::now();
                let mut n = 0u64;
                while begin.elapsed() < duration {
                    n += 1;
                    let path = format!("/data/sustained/{i}/{n}");
                    let t = Instant::now();
                    if session.put(&path, &bytes).is_err() {
                        errors += 1;
                        continue;
                    }
                    puts.push(t.elapsed());
                    let t = Instant::now();
                    match session.read(&path) {
                        Ok(view) if view.bytes() == bytes.as_slice() => gets.push(t.elapsed()),
                        _ => errors += 1,
                    }
                    let second = begin.elapsed().as_secs() as usize;
                    if let Some(slot) = per_second.get(second) {
                        slot.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let _ = session.close();
                (puts, gets, errors)
            })
        })
        .collect();
    let (mut puts, mut gets, mut errors) = (Vec::new(), Vec::new(), 0);
    for w in workers {
        let (p, g, e) = w.join().expect("a load thread");
        puts.extend(p);
        gets.extend(g);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    // After the load: how long until a fresh put succeeds on each host.
    let mut recovery = Vec::new();
    for socket in &cluster.sockets {
        let t = Instant::now();
        loop {
            let ok = ChildSession::connect(socket)
                .and_then(|mut s| s.put("/data/sustained/after", b"after"))
                .is_ok();
            if ok || t.elapsed() > Duration::from_secs(60) {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        recovery.push(t.elapsed().as_secs_f64());
    }
    cluster.check_alive();
    let pct = |v: &mut Vec<Duration>, p: usize| -> f64 {
        v.sort_unstable();
        v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    let counts: Vec<u64> = per_second[..secs]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let quarter = (secs / 4).max(1);
    let first: u64 = counts[..quarter].iter().sum();
    let last: u64 = counts[secs - quarter..].iter().sum();
    let flat = if first == 0 {
        0.0
    } else {
        last as f64 / first as f64
    };
    println!("# sustained_put_get sessions={sessions}: put+get pairs per second: {counts:?}");
    println!(
        "BENCH name=sustained_put_get sessions={sessions} secs={secs} puts_per_s={} gets_per_s={} put_p50_us={:.0} put_p99_us={:.0} get_p50_us={:.0} get_p99_us={:.0} errors={errors} recovery_s={} ours=last_quarter baseline=first_quarter ratio={flat:.2}",
        rate(puts.len() as f64 / elapsed),
        rate(gets.len() as f64 / elapsed),
        pct(&mut puts, 50),
        pct(&mut puts, 99),
        pct(&mut gets, 50),
        pct(&mut gets, 99),
        recovery
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join("/"),
    );
}

// ---------------------------------------------------------------------------------------------
// durable_mutations

/// Every client (ours and SQLite's) gets a number of its own for paths and operation ids.
static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

/// How long a closed-loop run of `clients` took and how many mutations it completed.
struct Run {
    mutations: u64,
    elapsed: Duration,
}

impl Run {
    fn rate(&self) -> f64 {
        self.mutations as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `clients` threads in a closed loop for `time`: each sets itself up with `setup(i)`,
/// all start together, and each calls `mutate` (one acknowledged mutation) until its deadline
/// passed. The run ends when the last thread's last mutation is acknowledged.
fn closed_loop<C, S, M>(clients: usize, time: Duration, setup: S, mutate: M) -> Run
where
    S: Fn(usize) -> C + Send + Sync + 'static,
    M: Fn(&mut C) + Send + Sync + 'static,
    C: 'static,
{
    let barrier = Arc::new(Barrier::new(clients + 1));
    let work = Arc::new((setup, mutate));
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let (barrier, work) = (barrier.clone(), work.clone());
            thread::spawn(move || {
                let (setup, mutate) = &*work;
                let mut client = setup(i);
                barrier.wait();
                let deadline = Instant::now() + time;
                let mut n = 0u64;
                loop {
                    mutate(&mut client);
                    n += 1;
                    let now = Instant::now();
                    if now >= deadline {
                        return (n, now);
                    }
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let mut mutations = 0;
    let mut end = start;
    for h in handles {
        let (n, at) = h.join().expect("a client thread panicked");
        mutations += n;
        end = end.max(at);
    }
    Run {
        mutations,
        elapsed: end - start,
    }
}

/// One of our clients: a TCP connection to the directory node speaking `Link`.
struct DirClient {
    stream: TcpStream,
    reader: FrameReader<TcpStream>,
    me: Address,
    directory: Address,
    id: u64,
    seq: u64,
    /// Calls made (their request ids).
    calls: u64,
}

impl DirClient {
    fn connect(address: &str) -> DirClient {
        DirClient::try_connect(address).expect("a Welcome from the directory node")
    }

    /// A client welcomed at `address`, if the node there serves (a replica that does not
    /// lead closes the connection).
    fn try_connect(address: &str) -> Option<DirClient> {
        let stream = TcpStream::connect(address).ok()?;
        stream.set_nodelay(true).expect("nodelay");
        let (welcome, reader) = handshake_blocking(&stream, Who::Client, None).ok()?;
        let (node, directory) = match welcome {
            Link::Welcome {
                node, directory, ..
            } => (node, directory),
            _ => return None,
        };
        Some(DirClient {
            stream,
            reader,
            me: Address::new(node, 1, 1),
            directory,
            id: NEXT_CLIENT.fetch_add(1, Ordering::Relaxed),
            seq: 0,
            calls: 0,
        })
    }

    /// One Register of a fresh path, waiting for its (durable) reply.
    fn register(&mut self) {
        self.seq += 1;
        let seq = self.seq;
        let source = Address::new(self.me.node, 1, 1 + seq);
        let request = DirectoryRequest::Register {
            path: DataPath::new(format!("/bench/{}/{seq}", self.id)).expect("a valid path"),
            source,
            source_node: source.node,
            length: REGISTER_LENGTH,
            recovery: SourceRecovery::Actor {
                actor: source,
                node: source.node,
                owner: None,
            },
            operation: OperationId((u128::from(self.id) << 64) | u128::from(seq)),
            reservation: None,
        };
        match self.call(request) {
            ReplyBody::Registered(Ok(_)) => {}
            other => panic!("Register refused: {other:?}"),
        }
    }

    /// One Resolve of the path this client registered last, waiting for its reply.
    fn resolve_own(&mut self) {
        let path = DataPath::new(format!("/bench/{}/{}", self.id, self.seq)).expect("a valid path");
        match self.call(DirectoryRequest::Resolve { path }) {
            ReplyBody::Resolved(Ok(_)) => {}
            other => panic!("Resolve refused: {other:?}"),
        }
    }

    /// Sends `request` under a fresh request id and waits for its reply.
    fn call(&mut self, request: DirectoryRequest) -> ReplyBody {
        self.calls += 1;
        let request_id = RequestId(self.calls);
        let frame = Link::Frame(Envelope {
            from: self.me,
            to: self.directory,
            message: Message::Call(DirectoryCall {
                request_id,
                reply_to: self.me,
                request,
            }),
        });
        let mut w = &self.stream;
        write_frame(&mut w, &frame).expect("send a call");
        loop {
            match self.reader.read_frame::<Link>() {
                Ok(Some(Link::Frame(Envelope {
                    message:
                        Message::Reply(DirectoryReply {
                            request_id: id,
                            body,
                            ..
                        }),
                    ..
                }))) if id == request_id => return body,
                Ok(Some(_)) => {}
                other => panic!("the directory node went away: {other:?}"),
            }
        }
    }
}

/// One SQLite client: its own connection to the shared database.
struct SqliteClient {
    conn: rusqlite::Connection,
    id: u64,
    seq: u64,
}

const SQLITE_SCHEMA: &str = "
    PRAGMA journal_mode = WAL;
    CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY, revision INTEGER NOT NULL);
    INSERT OR IGNORE INTO meta (id, revision) VALUES (0, 0);
    CREATE TABLE IF NOT EXISTS bindings (
        path TEXT PRIMARY KEY,
        revision INTEGER NOT NULL,
        source_node INTEGER NOT NULL,
        source_incarnation INTEGER NOT NULL,
        source_actor INTEGER NOT NULL,
        length INTEGER NOT NULL,
        operation BLOB NOT NULL
    );
";

impl SqliteClient {
    fn open(path: &Path) -> SqliteClient {
        let conn = rusqlite::Connection::open(path).expect("open the SQLite database");
        conn.busy_timeout(Duration::from_secs(60))
            .expect("busy_timeout");
        conn.execute_batch("PRAGMA synchronous = FULL;")
            .expect("synchronous=FULL");
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("journal_mode");
        assert_eq!(mode, "wal", "the SQLite database is not in WAL mode");
        SqliteClient {
            conn,
            id: NEXT_CLIENT.fetch_add(1, Ordering::Relaxed),
            seq: 0,
        }
    }

    /// One transaction: the next revision, then the row, then a durable commit.
    fn register(&mut self) {
        self.seq += 1;
        let seq = self.seq;
        let path = format!("/bench/{}/{seq}", self.id);
        let operation = ((u128::from(self.id) << 64) | u128::from(seq)).to_le_bytes();
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .expect("BEGIN IMMEDIATE");
        let revision: i64 = tx
            .prepare_cached(
                "UPDATE meta SET revision = revision + 1 WHERE id = 0 RETURNING revision",
            )
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .expect("the next revision");
        tx.prepare_cached(
            "INSERT OR REPLACE INTO bindings \
             (path, revision, source_node, source_incarnation, source_actor, length, operation) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .and_then(|mut s| {
            s.execute(rusqlite::params![
                path,
                revision,
                self.id as i64,
                1i64,
                (1 + seq) as i64,
                REGISTER_LENGTH as i64,
                &operation[..],
            ])
        })
        .expect("INSERT OR REPLACE");
        tx.commit().expect("COMMIT");
    }
}

/// The group-commit baseline's file (see the module documentation).
struct GroupLog {
    file: fs::File,
    state: Mutex<GroupState>,
    synced: std::sync::Condvar,
}

#[derive(Default)]
struct GroupState {
    /// Records appended.
    appended: u64,
    /// Records an `fdatasync` covered.
    synced: u64,
    /// Whether a leader is syncing.
    syncing: bool,
}

/// Bytes of a record of the group-commit baseline.
const GROUP_RECORD_BYTES: usize = 4096;

impl GroupLog {
    fn create(path: &Path) -> GroupLog {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("create the group-commit baseline's file");
        GroupLog {
            file,
            state: Mutex::new(GroupState::default()),
            synced: std::sync::Condvar::new(),
        }
    }

    /// Appends `record` and returns once an `fdatasync` covered it.
    fn append(&self, record: &[u8]) {
        let mut state = self.state.lock().expect("the group log's lock");
        (&self.file).write_all(record).expect("append a record");
        state.appended += 1;
        let me = state.appended;
        while state.synced < me {
            if state.syncing {
                state = self.synced.wait(state).expect("the group log's lock");
                continue;
            }
            // The leader: one sync for everything appended so far.
            state.syncing = true;
            let target = state.appended;
            drop(state);
            self.file.sync_data().expect("fdatasync");
            state = self.state.lock().expect("the group log's lock");
            state.synced = target;
            state.syncing = false;
            self.synced.notify_all();
        }
    }
}

fn durable_mutations(budget: Budget) -> Vec<(usize, f64, f64)> {
    let mut cluster = Cluster::start("mutations");
    let sqlite_path = cluster.scratch.path().join("baseline.sqlite");
    rusqlite::Connection::open(&sqlite_path)
        .and_then(|c| c.execute_batch(SQLITE_SCHEMA))
        .expect("create the SQLite database");
    let directory = cluster.directory.clone();
    // One untimed warm-up of each (connections, the log file, SQLite's WAL).
    {
        let d = directory.clone();
        closed_loop(
            4,
            Duration::from_millis(100),
            move |_| DirClient::connect(&d),
            DirClient::register,
        );
        let p = sqlite_path.clone();
        closed_loop(
            4,
            Duration::from_millis(100),
            move |_| SqliteClient::open(&p),
            SqliteClient::register,
        );
    }
    let mut ratios = Vec::new();
    for clients in [1usize, 16, 64] {
        let (mut ours, mut sqlite, mut queued, mut group) = (0f64, 0f64, 0f64, 0f64);
        let (mut ours_runs, mut sqlite_runs, mut group_runs) = (Vec::new(), Vec::new(), Vec::new());
        let group_log = Arc::new(GroupLog::create(
            &cluster
                .scratch
                .path()
                .join(format!("group-commit-{clients}")),
        ));
        let mut floor_runs = Vec::new();
        for _ in 0..budget.mutation_reps {
            if clients == 1 {
                floor_runs.push(durable_echo(cluster.scratch.path(), budget.mutation_time));
            }
            let d = directory.clone();
            let run = closed_loop(
                clients,
                budget.mutation_time,
                move |_| DirClient::connect(&d),
                DirClient::register,
            );
            cluster.check_alive();
            ours = ours.max(run.rate());
            ours_runs.push(run.rate());
            let p = sqlite_path.clone();
            let run = closed_loop(
                clients,
                budget.mutation_time,
                move |_| SqliteClient::open(&p),
                SqliteClient::register,
            );
            sqlite = sqlite.max(run.rate());
            sqlite_runs.push(run.rate());
            if clients > 1 {
                let p = sqlite_path.clone();
                let lock = Arc::new(Mutex::new(()));
                let run = closed_loop(
                    clients,
                    budget.mutation_time,
                    move |_| (SqliteClient::open(&p), lock.clone()),
                    |(client, lock): &mut (SqliteClient, Arc<Mutex<()>>)| {
                        let _turn = lock.lock().expect("the writers' lock");
                        client.register();
                    },
                );
                queued = queued.max(run.rate());
            }
            let log = group_log.clone();
            let run = closed_loop(
                clients,
                budget.mutation_time,
                move |i| (log.clone(), vec![i as u8 | 1; GROUP_RECORD_BYTES]),
                |(log, record): &mut (Arc<GroupLog>, Vec<u8>)| log.append(record),
            );
            group = group.max(run.rate());
            group_runs.push(run.rate());
        }
        let list = |v: &[f64]| v.iter().map(|r| rate(*r)).collect::<Vec<_>>().join(",");
        println!(
            "# durable_mutations clients={clients}: repetitions ours=[{}] sqlite=[{}] mutations/s",
            list(&ours_runs),
            list(&sqlite_runs)
        );
        println!(
            "BENCH name=durable_mutations clients={clients} ours={} baseline=sqlite sqlite={} ratio={:.2}",
            rate(ours),
            rate(sqlite),
            ours / sqlite
        );
        if clients > 1 {
            println!(
                "# durable_mutations clients={clients}: informational: SQLite with the writers queued on an in-process mutex instead of its sleeping busy handler: {} mutations/s (ours/that = {:.2})",
                rate(queued),
                ours / queued
            );
        }
        println!(
            "# durable_mutations clients={clients}: repetitions group_commit=[{}] records/s",
            list(&group_runs)
        );
        println!(
            "BENCH name=durable_mutations_group clients={clients} ours={} baseline=group_commit group_commit={} ratio={:.2}",
            rate(ours),
            rate(group),
            ours / group
        );
        if clients == 1 {
            let floor = floor_runs.iter().copied().fold(0f64, f64::max);
            println!(
                "# durable_mutations clients=1: repetitions durable_echo=[{}] round trips/s (informational: one loopback TCP round trip between two threads and one {DURABLE_ECHO_BYTES}-byte pwrite + fdatasync into a preallocated file per request: the floor of any server that makes each request durable before it answers)",
                list(&floor_runs)
            );
            println!(
                "BENCH name=durable_mutations_floor clients=1 ours={} baseline=durable_echo durable_echo={} ratio={:.2}",
                rate(ours),
                rate(floor),
                ours / floor
            );
        }
        ratios.push((clients, ours / sqlite, ours / group));
    }
    let log_bytes = dir_bytes(&cluster.scratch.path().join("directory").join("log"));
    let sqlite_bytes = ["", "-wal"]
        .iter()
        .map(|suffix| {
            let mut name = sqlite_path.clone().into_os_string();
            name.push(suffix);
            fs::metadata(name).map(|m| m.len()).unwrap_or(0)
        })
        .sum::<u64>();
    println!(
        "# durable_mutations: directory log {log_bytes} bytes, SQLite database {sqlite_bytes} bytes at the end"
    );
    ratios
}

/// The bytes each `durable_echo` request writes (a `Register` record is about this size).
const DURABLE_ECHO_BYTES: usize = 256;

/// Requests per second of the simplest durable server, one client, for `time`: a thread
/// answers each `DURABLE_ECHO_BYTES` request over loopback TCP after writing it into a file
/// of written zeros (preallocated, as the directory's log is) and `fdatasync`ing it. No
/// framing, no decoding, no state: what one mutation cannot go below here.
fn durable_echo(dir: &Path, time: Duration) -> f64 {
    use std::os::unix::fs::FileExt;
    const FILE_BYTES: u64 = 16 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the echo server");
    let address = listener.local_addr().expect("its address");
    let path = dir.join("durable-echo");
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept the echo client");
        stream.set_nodelay(true).expect("nodelay");
        let file = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .expect("the echo file");
        let zeros = vec![0u8; 1 << 20];
        for at in (0..FILE_BYTES).step_by(zeros.len()) {
            file.write_all_at(&zeros, at).expect("preallocate");
        }
        file.sync_all().expect("sync the preallocation");
        let mut request = [0u8; DURABLE_ECHO_BYTES];
        let mut at = 0u64;
        while stream.read_exact(&mut request).is_ok() {
            file.write_all_at(&request, at).expect("write a request");
            file.sync_data().expect("fdatasync");
            at = (at + DURABLE_ECHO_BYTES as u64) % (FILE_BYTES - DURABLE_ECHO_BYTES as u64);
            if stream.write_all(&request).is_err() {
                break;
            }
        }
    });
    let mut client = TcpStream::connect(address).expect("connect to the echo server");
    client.set_nodelay(true).expect("nodelay");
    let mut buf = [7u8; DURABLE_ECHO_BYTES];
    // One untimed round trip: the server answers only once its file is preallocated.
    client.write_all(&buf).expect("send a request");
    client.read_exact(&mut buf).expect("read its answer");
    let started = Instant::now();
    let mut done = 0u64;
    while started.elapsed() < time {
        client.write_all(&buf).expect("send a request");
        client.read_exact(&mut buf).expect("read its answer");
        done += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(client);
    server.join().expect("the echo server");
    done as f64 / elapsed
}

/// `replicated_mutations`: the same closed loop of `Register`s against the leader of three
/// directory replicas on this machine, and against one directory node, in the same run.
fn replicated_mutations(budget: Budget) {
    replicated(
        "replicated_mutations",
        "mutations",
        budget,
        |_| {},
        DirClient::register,
    );
}

/// `replicated_reads`: a closed loop of `Resolve`s (each client of the path it registered
/// first, untimed) against the leader of three replicas, and against one directory node.
fn replicated_reads(budget: Budget) {
    replicated(
        "replicated_reads",
        "reads",
        budget,
        DirClient::register,
        DirClient::resolve_own,
    );
}

/// Three directory replicas on this machine and one directory node; per client count, `op`
/// in a closed loop against the replicas' leader and the single node, interleaved, after
/// `prepare` on each client (untimed).
fn replicated(
    name: &str,
    unit: &str,
    budget: Budget,
    prepare: fn(&mut DirClient),
    op: fn(&mut DirClient),
) {
    let mut single = Cluster::start(&format!("{name}-single"));
    let scratch = scratch(name);
    let peers: Vec<String> = (0..3).map(|_| free_address()).collect();
    let list = peers
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let listens: Vec<String> = (0..3).map(|_| free_address()).collect();
    let mut replicas: Vec<Proc> = (0..3)
        .map(|i| {
            let mut command = Command::new(node_binary());
            command
                .arg("directory")
                .arg("--listen")
                .arg(&listens[i])
                .arg("--data-dir")
                .arg(scratch.path().join(format!("replica-{}", i + 1)))
                .arg("--replica-id")
                .arg((i + 1).to_string())
                .arg("--replicas")
                .arg(&list);
            Proc::start(&format!("directory replica {}", i + 1), command)
        })
        .collect();
    for (proc, listen) in replicas.iter_mut().zip(&listens) {
        wait_tcp(proc, listen);
    }
    // The leader: the replica that welcomes a client.
    let started = Instant::now();
    let leader = loop {
        if let Some(i) = listens
            .iter()
            .position(|l| DirClient::try_connect(l).is_some())
        {
            break listens[i].clone();
        }
        assert!(
            started.elapsed() < STARTUP_TIMEOUT,
            "no directory replica leads"
        );
        thread::sleep(Duration::from_millis(20));
    };
    println!(
        "# {name}: a leader serves {:?} after the replicas started",
        started.elapsed()
    );
    let connect = move |address: String| {
        move |_| {
            let mut client = DirClient::connect(&address);
            prepare(&mut client);
            client
        }
    };
    for clients in [1usize, 64] {
        let (mut ours, mut base) = (0f64, 0f64);
        let (mut ours_runs, mut base_runs) = (Vec::new(), Vec::new());
        for _ in 0..budget.mutation_reps {
            let run = closed_loop(clients, budget.mutation_time, connect(leader.clone()), op);
            for p in &mut replicas {
                p.check_alive();
            }
            ours = ours.max(run.rate());
            ours_runs.push(run.rate());
            let run = closed_loop(
                clients,
                budget.mutation_time,
                connect(single.directory.clone()),
                op,
            );
            single.check_alive();
            base = base.max(run.rate());
            base_runs.push(run.rate());
        }
        let list = |v: &[f64]| v.iter().map(|r| rate(*r)).collect::<Vec<_>>().join(",");
        println!(
            "# {name} clients={clients}: repetitions ours=[{}] single_node=[{}] {unit}/s",
            list(&ours_runs),
            list(&base_runs)
        );
        println!(
            "BENCH name={name} clients={clients} ours={} baseline=single_node single_node={} ratio={:.2}",
            rate(ours),
            rate(base),
            ours / base
        );
    }
}

/// The bytes of the files in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// local_put_get and remote_get

/// Bytes that are not all alike (xorshift), so a wrong copy shows.
fn payload(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The arena a host needs for a few blobs of `len` in flight (put, read, a retiring one).
fn arena_for(len: usize) -> usize {
    6 * len + (16 << 20)
}

fn local_put_get(budget: Budget, digest: DigestKind) -> f64 {
    let len = budget.blob_bytes;
    let digest_name = if digest == DigestKind::Blake3 {
        "blake3"
    } else {
        "none"
    };
    let id = format!("local_put_get size={} digest={digest_name}", size_name(len));
    let mut cluster = Cluster::start("local");
    let mut session = cluster.host("a", arena_for(len));
    session.set_digest(digest);
    let src = payload(len);
    let mut dst1 = vec![1u8; len];
    let mut dst2 = vec![2u8; len];
    let path = "/data/bench/local";
    let (mut ours, mut memcpy) = (Duration::MAX, Duration::MAX);
    let (mut best_put, mut best_get) = (Duration::MAX, Duration::MAX);
    let mut reps = Vec::new();
    // Repetition 0 is an untimed warm-up (it faults the arena's pages in).
    for rep in 0..=budget.blob_reps {
        let started = Instant::now();
        session.put(path, &src).expect("put");
        let put = started.elapsed();
        let view = session.read(path).expect("get");
        let took = started.elapsed();
        assert!(
            view.bytes() == src.as_slice(),
            "the read differs from the put"
        );
        drop(view);
        cluster.check_alive();

        let started = Instant::now();
        dst1.copy_from_slice(black_box(&src));
        dst2.copy_from_slice(black_box(&dst1));
        black_box((&dst1, &dst2));
        let baseline = started.elapsed();
        if rep > 0 {
            ours = ours.min(took);
            best_put = best_put.min(put);
            best_get = best_get.min(took - put);
            memcpy = memcpy.min(baseline);
            reps.push(format!(
                "{:.1}+{:.1}/{:.1}",
                put.as_secs_f64() * 1e3,
                (took - put).as_secs_f64() * 1e3,
                baseline.as_secs_f64() * 1e3
            ));
        }
    }
    cost_model(len, &src, &mut dst1);
    let (ours, memcpy) = (
        len as f64 / ours.as_secs_f64(),
        len as f64 / memcpy.as_secs_f64(),
    );
    println!(
        "# {id}: best put {:.2} ms, best get {:.2} ms; repetitions put+get/memcpy ms [{}] (rates are blob bytes / put+get time)",
        best_put.as_secs_f64() * 1e3,
        best_get.as_secs_f64() * 1e3,
        reps.join(", ")
    );
    println!(
        "BENCH name=local_put_get size={} digest={digest_name} ours={} baseline=memcpy memcpy={} ratio={:.2}",
        size_name(len),
        gib(ours),
        gib(memcpy),
        ours / memcpy
    );
    ours / memcpy
}

/// Informational: what one pass over `len` bytes costs here, best of three — the unit costs
/// the put-then-get is made of (a BLAKE3 pass, a copy, a zero-fill, first touch of fresh
/// shared memory), so a miss can be explained from the same run.
fn cost_model(len: usize, src: &[u8], dst: &mut [u8]) {
    let best = |f: &mut dyn FnMut()| {
        (0..3)
            .map(|_| {
                let started = Instant::now();
                f();
                started.elapsed()
            })
            .min()
            .expect("three runs")
            .as_secs_f64()
            * 1e3
    };
    let blake3 = best(&mut || {
        black_box(dataplane_core::blob::digest(black_box(src)));
    });
    let copy = best(&mut || dst.copy_from_slice(black_box(src)));
    let zero = best(&mut || black_box(&mut *dst).fill(0));
    let fault = best(&mut || {
        let mut arena =
            dataplane_io::arena::SharedArena::create("bench-fault", len as u64).expect("a memfd");
        arena.as_mut_slice().fill(1);
        black_box(arena.as_slice());
    });
    println!(
        "# cost model ({}): blake3 {blake3:.2} ms, memcpy {copy:.2} ms, zero-fill {zero:.2} ms, first touch of a fresh memfd arena {fault:.2} ms",
        size_name(len)
    );
}

/// The baseline's helper process: connects to `port`, then for every 8-byte request of a
/// length writes that many bytes of its buffer; exits at the end of the stream.
fn tcp_sender(port: u16, len: usize) {
    let buf = payload(len);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the bench");
    stream.set_nodelay(true).expect("nodelay");
    let mut request = [0u8; 8];
    while stream.read_exact(&mut request).is_ok() {
        let n = u64::from_le_bytes(request) as usize;
        if stream.write_all(&buf[..n.min(len)]).is_err() {
            return;
        }
    }
}

fn remote_get(budget: Budget, digest: DigestKind) -> f64 {
    let len = budget.blob_bytes;
    let digest_name = if digest == DigestKind::Blake3 {
        "blake3"
    } else {
        "none"
    };
    let id = format!("remote_get size={} digest={digest_name}", size_name(len));
    let mut cluster = Cluster::start("remote");
    // A serves file blobs too (issue 17): the same bytes, published from a file on its disk.
    let files = cluster.scratch.path().join("files-a");
    fs::create_dir_all(&files).expect("A's file root");
    let mut on_a = cluster.host_with(
        "a",
        arena_for(len),
        &["--files".as_ref(), files.as_os_str()],
    );
    on_a.set_digest(digest);
    let mut on_b = cluster.host("b", arena_for(len));
    let src = payload(len);
    let path = "/data/bench/remote";
    on_a.put(path, &src).expect("put on A");
    let file_path = "/data/bench/remote-file";
    fs::write(files.join("blob"), &src).expect("the file on A's disk");
    on_a.publish_file(file_path, "blob")
        .expect("publish the file on A");
    let (mut from_file, mut file_reps) = (Duration::MAX, Vec::new());

    // The baseline's sender process, connected to us.
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let mut command = Command::new(std::env::current_exe().expect("this bench's path"));
    command
        .arg("--tcp-sender")
        .arg(port.to_string())
        .arg(len.to_string());
    let _sender = Proc::start("tcp sender", command);
    let (mut tcp, _) = listener.accept().expect("the sender connects");
    tcp.set_nodelay(true).expect("nodelay");
    let mut dst = vec![3u8; len];

    let (mut ours, mut baseline) = (Duration::MAX, Duration::MAX);
    let mut reps = Vec::new();
    // Repetition 0 is an untimed warm-up (it opens the A–B link and faults pages in).
    for rep in 0..=budget.blob_reps {
        let started = Instant::now();
        let view = on_b.read(path).expect("get on B");
        let took = started.elapsed();
        assert!(
            view.bytes() == src.as_slice(),
            "the read differs from the put"
        );
        drop(view);
        cluster.check_alive();

        let started = Instant::now();
        let view = on_b.read(file_path).expect("get the file blob on B");
        let took_file = started.elapsed();
        assert!(
            view.bytes() == src.as_slice(),
            "the file blob's read differs from the file"
        );
        drop(view);
        if rep > 0 {
            from_file = from_file.min(took_file);
            file_reps.push(format!("{:.1}", took_file.as_secs_f64() * 1e3));
        }

        let started = Instant::now();
        tcp.write_all(&(len as u64).to_le_bytes())
            .expect("ask the sender");
        tcp.read_exact(&mut dst).expect("the sender's bytes");
        let copy = started.elapsed();
        assert!(dst == src, "the TCP copy differs");
        if rep > 0 {
            ours = ours.min(took);
            baseline = baseline.min(copy);
            reps.push(format!(
                "{:.1}/{:.1}",
                took.as_secs_f64() * 1e3,
                copy.as_secs_f64() * 1e3
            ));
        }
    }
    let (ours, tcp_rate) = (
        len as f64 / ours.as_secs_f64(),
        len as f64 / baseline.as_secs_f64(),
    );
    println!(
        "# {id}: the hosts pull chunk_bytes={} KiB with window={} chunks in flight ({} KiB); repetitions get/tcp ms [{}]",
        HOST_CHUNK_BYTES >> 10,
        HOST_WINDOW,
        (HOST_CHUNK_BYTES * HOST_WINDOW) >> 10,
        reps.join(", ")
    );
    println!(
        "BENCH name=remote_get size={} digest={digest_name} chunk={}KiB window={} ours={} baseline=tcp tcp={} ratio={:.2}",
        size_name(len),
        HOST_CHUNK_BYTES >> 10,
        HOST_WINDOW,
        gib(ours),
        gib(tcp_rate),
        ours / tcp_rate
    );
    if digest == DigestKind::None {
        // A file blob has no digest: compared with the arena blob read without one.
        let file_rate = len as f64 / from_file.as_secs_f64();
        println!(
            "# remote_get_file size={}: repetitions ms [{}]",
            size_name(len),
            file_reps.join(", ")
        );
        println!(
            "BENCH name=remote_get_file size={} ours={} baseline=remote_get arena={} ratio={:.2} tcp_ratio={:.2}",
            size_name(len),
            gib(file_rate),
            gib(ours),
            file_rate / ours,
            file_rate / tcp_rate
        );
    }
    ours / tcp_rate
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--tcp-sender") {
        let port = args
            .get(1)
            .and_then(|p| p.parse().ok())
            .expect("--tcp-sender PORT LEN");
        let len = args
            .get(2)
            .and_then(|p| p.parse().ok())
            .expect("--tcp-sender PORT LEN");
        tcp_sender(port, len);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("DATAPLANE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let wanted = |id: &str| filters.is_empty() || filters.iter().any(|f| id.contains(f.as_str()));
    let budget = if quick {
        Budget::quick()
    } else {
        Budget::full()
    };
    if quick {
        println!("# quick mode: short measurements, 4 MiB blobs; numbers are indicative only");
    }
    println!("# node binary: {}", node_binary().display());
    let started = Instant::now();
    if wanted("durable_mutations") {
        let ratios = durable_mutations(budget);
        for (clients, vs_sqlite, vs_group) in ratios {
            if clients == 1 {
                let id = "durable_mutations clients=1 (vs sqlite)";
                verdict(id, vs_sqlite, TARGET_MUTATIONS_1_VS_SQLITE);
            }
            if clients == 64 {
                let id = "durable_mutations clients=64";
                verdict(id, vs_sqlite, TARGET_MUTATIONS_RATIO_AT_64);
                let id = "durable_mutations clients=64 (vs group_commit)";
                verdict(id, vs_group, TARGET_MUTATIONS_64_VS_GROUP);
            }
        }
    }
    if wanted("replicated_mutations") {
        replicated_mutations(budget);
    }
    if wanted("replicated_reads") {
        replicated_reads(budget);
    }
    if wanted("local_put_get") {
        let r = local_put_get(budget, DigestKind::None);
        verdict("local_put_get digest=none", r, TARGET_LOCAL_RATIO);
        let r = local_put_get(budget, DigestKind::Blake3);
        verdict("local_put_get digest=blake3", r, TARGET_LOCAL_BLAKE3_RATIO);
    }
    if wanted("sustained_put_get") {
        for sessions in [16, 64] {
            sustained_put_get(budget, sessions);
        }
    }
    if wanted("remote_get") {
        // As for the local path, the target is for moving the bytes (no digest); with BLAKE3
        // the reading host also hashes every byte (informational).
        let r = remote_get(budget, DigestKind::None);
        verdict("remote_get digest=none", r, TARGET_REMOTE_RATIO);
        let _ = remote_get(budget, DigestKind::Blake3);
    }
    println!("# total {:.1} s", started.elapsed().as_secs_f64());
}

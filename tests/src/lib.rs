//! # dataplane-tests
//!
//! Multi-process tests of the dataplane: real `dataplane-node` directory and host processes and
//! the `dataplane` CLI, on loopback, started and killed by the tests (`tests/processes/`).
//!
//! This library is the harness they share:
//!
//! * [`binaries`] builds `dataplane-node` and `dataplane` once per test process (`cargo build
//!   -p dataplane-io --bins`, same profile and target directory as the test executable) and
//!   finds them next to it.
//! * [`free_port`] and [`TestDir`] make ports and directories unique per test, so tests run in
//!   parallel.
//! * [`Proc`] owns a child process and kills it (SIGKILL) when dropped, also when a test panics;
//!   [`DirectoryProc`] and [`HostProc`] start nodes and wait until they serve.
//! * [`cli_with`] runs the CLI with a deadline; [`wait_until`] polls with a deadline.
//! * [`raw`] is a client that speaks the nodes' `Link` protocol over TCP.
//!
//! Every wait has a deadline and panics with what it waited for.
//!
//! `DATAPLANE_KILL_ROUNDS` (default 20) sets how many times the directory is killed under load.

pub mod raw;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long a node may take to start serving.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one CLI command may take, unless a test says otherwise.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// The two binaries of `dataplane-io`.
#[derive(Debug)]
pub struct Binaries {
    /// `dataplane-node`.
    pub node: PathBuf,
    /// `dataplane`.
    pub cli: PathBuf,
}

/// The binaries, built once per test process.
pub fn binaries() -> &'static Binaries {
    static BINARIES: OnceLock<Binaries> = OnceLock::new();
    BINARIES.get_or_init(build_binaries)
}

fn build_binaries() -> Binaries {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test executable>
    let mut profile_dir = exe
        .parent()
        .expect("the test executable has a directory")
        .to_path_buf();
    if profile_dir.file_name().is_some_and(|n| n == "deps") {
        profile_dir.pop();
    }
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_owned();
    let target_dir = profile_dir
        .parent()
        .expect("the profile directory has a parent")
        .to_path_buf();
    let cargo = std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(OsString::from))
        .unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--quiet",
            "-p",
            "dataplane-io",
            "--bins",
            "--target-dir",
        ])
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null());
    match profile.as_str() {
        "debug" => {}
        "release" => {
            command.arg("--release");
        }
        other => {
            command.args(["--profile", other]);
        }
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(status.success(), "{command:?} failed: {status}");
    let binaries = Binaries {
        node: profile_dir.join("dataplane-node"),
        cli: profile_dir.join("dataplane"),
    };
    for path in [&binaries.node, &binaries.cli] {
        assert!(path.is_file(), "{} was not built", path.display());
    }
    binaries
}

/// A loopback port nobody listened on a moment ago, never handed out twice in this process.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// `127.0.0.1:<free port>`.
pub fn free_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Polls `done` every few milliseconds until it holds; panics after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// A directory of its own under `std::env::temp_dir()`; removed on drop unless the test
/// failed (then it is kept, and its path printed, for inspection).
#[derive(Debug)]
pub struct TestDir {
    dir: tempfile::TempDir,
}

impl TestDir {
    /// `<tmp>/dataplane-tests/<name>-<random>`, fresh and empty.
    pub fn new(name: &str) -> TestDir {
        let parent = std::env::temp_dir().join("dataplane-tests");
        fs::create_dir_all(&parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir_in(&parent)
            .unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
        TestDir { dir }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("test files kept in {}", self.path().display());
        }
    }
}

/// A child process that is killed (SIGKILL) and reaped when this is dropped. Its stdout and
/// stderr go to a log file (appended to, so a restarted process keeps its predecessor's lines).
#[derive(Debug)]
pub struct Proc {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    /// Environment variables set for it (besides the test's own).
    env: Vec<(OsString, OsString)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Starts `program args`, logging to `log`.
    pub fn spawn(name: &str, program: &Path, args: Vec<OsString>, log: PathBuf) -> Proc {
        Proc::spawn_env(name, program, args, Vec::new(), log)
    }

    /// [`spawn`](Self::spawn) with environment variables `env` set (on every restart too).
    pub fn spawn_env(
        name: &str,
        program: &Path,
        args: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
        log: PathBuf,
    ) -> Proc {
        let mut proc = Proc {
            name: name.to_owned(),
            program: program.to_path_buf(),
            args,
            env,
            log,
            child: None,
        };
        proc.start();
        proc
    }

    /// Starts it once with `args` added to its command line (a later restart goes without
    /// them), if it is not running.
    pub fn start_once_with(&mut self, args: &[&str]) {
        let keep = self.args.len();
        self.args.extend(args.iter().map(OsString::from));
        self.start();
        self.args.truncate(keep);
    }

    /// Starts it (again) with its command line, if it is not running.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{}: {e}", self.log.display()));
        let err = out.try_clone().expect("clone the log file");
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program.display()));
        self.child = Some(child);
    }

    /// Its name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id (it must be running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends it `signal` (a name `kill` understands, e.g. `STOP` or `CONT`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap_or_else(|e| panic!("kill -{signal} {}: {e}", self.name));
        assert!(status.success(), "kill -{signal} {} failed", self.name);
    }

    /// Kills it with SIGKILL and reaps it (nothing if it is not running).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with the same command line (after [`kill9`](Self::kill9)).
    pub fn restart(&mut self) {
        self.kill9();
        self.start();
    }

    /// Its exit status if it exited (it is then no longer running).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten();
        if status.is_some() {
            self.child = None;
        }
        status
    }

    /// Waits for it to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}; its output:\n{}",
                self.name,
                self.log_text()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Panics (with its output) unless it is running.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.try_wait() {
            panic!(
                "{} exited ({status}); its output:\n{}",
                self.name,
                self.log_text()
            );
        }
        assert!(self.child.is_some(), "{} is not running", self.name);
    }

    /// Everything it wrote so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let was_running = self.child.is_some();
        self.kill9();
        if thread::panicking() && was_running {
            let text = self.log_text();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            if !tail.is_empty() {
                eprintln!("--- last output of {} ---", self.name);
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// Whether a TCP connection to `address` succeeds.
pub fn can_connect(address: &str) -> bool {
    let Ok(addr) = address.parse() else {
        return false;
    };
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The command line of a directory node on `listen` with its data in `data_dir`.
pub fn directory_args(listen: &str, data_dir: &Path) -> Vec<OsString> {
    vec![
        "directory".into(),
        "--listen".into(),
        listen.into(),
        "--data-dir".into(),
        data_dir.into(),
        "--retry-ms".into(),
        "200".into(),
    ]
}

/// Every file under `dir` (recursively, by path relative to it) and its bytes.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let relative = path
                    .strip_prefix(root)
                    .expect("under the root")
                    .to_path_buf();
                out.insert(relative, bytes);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Writes `files` (as [`tree`] returns them) under `dir`, creating directories.
pub fn write_tree(dir: &Path, files: &BTreeMap<PathBuf, Vec<u8>>) {
    for (relative, bytes) in files {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
        }
        fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// A directory node process.
#[derive(Debug)]
pub struct DirectoryProc {
    /// The process.
    pub proc: Proc,
    /// Its `host:port`.
    pub listen: String,
    /// Its data directory (log and membership).
    pub data_dir: PathBuf,
}

impl DirectoryProc {
    /// Starts a directory in `dir/<name>` and waits until it accepts connections.
    pub fn start(dir: &TestDir, name: &str) -> DirectoryProc {
        DirectoryProc::start_with(dir, name, &[])
    }

    /// [`start`](Self::start), with `extra` options on its command line.
    pub fn start_with(dir: &TestDir, name: &str, extra: &[OsString]) -> DirectoryProc {
        DirectoryProc::start_env(dir, name, extra, Vec::new())
    }

    /// [`start_with`](Self::start_with), with environment variables `env`.
    pub fn start_env(
        dir: &TestDir,
        name: &str,
        extra: &[OsString],
        env: Vec<(OsString, OsString)>,
    ) -> DirectoryProc {
        let listen = free_address();
        let data_dir = dir.join(name);
        let mut args = directory_args(&listen, &data_dir);
        args.extend_from_slice(extra);
        let proc = Proc::spawn_env(
            name,
            &binaries().node,
            args,
            env,
            dir.join(&format!("{name}.log")),
        );
        let mut node = DirectoryProc {
            proc,
            listen,
            data_dir,
        };
        node.wait_ready();
        node
    }

    /// Waits until it accepts connections (panics if it exits).
    pub fn wait_ready(&mut self) {
        let what = format!("{} to listen on {}", self.proc.name(), self.listen);
        let (proc, listen) = (&mut self.proc, &self.listen);
        wait_until(&what, READY_TIMEOUT, || {
            proc.assert_running();
            can_connect(listen)
        });
    }

    /// SIGKILL, then the same command line again; waits until it accepts connections.
    pub fn restart(&mut self) {
        self.proc.restart();
        self.wait_ready();
    }

    /// Every record in its log files (read-only; the node may be running): each file's valid
    /// chain of records after its header.
    pub fn log_records(&self) -> Vec<dataplane_core::log::LogRecord> {
        let mut files: Vec<(u64, PathBuf)> = fs::read_dir(self.data_dir.join("log"))
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| {
                        let name = e.file_name().into_string().ok()?;
                        let n = name.strip_prefix("log-")?.parse().ok()?;
                        Some((n, e.path()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        let mut records = Vec::new();
        for (_, path) in files {
            let mut bytes = Vec::new();
            if File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .is_ok()
            {
                records.extend(dataplane_io::log::log_file_records(&bytes).unwrap_or_default());
            }
        }
        records
    }
}

/// A `--replicas` value: replica `i + 1` at `peers[i]`.
pub fn replicas_option(peers: &[String]) -> String {
    peers
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// A replicated directory (issue 19): `dataplane-node directory --replica-id N --replicas ...`
/// processes on loopback, each with its own data directory, host port and peer port.
#[derive(Debug)]
pub struct ReplicaGroup {
    /// The replicas, in id order (replica `i + 1` at index `i`).
    pub replicas: Vec<DirectoryProc>,
    /// Where each listens for the others (`--replicas`), in the same order.
    pub peers: Vec<String>,
}

impl ReplicaGroup {
    /// Starts `count` replicas in `dir/<name>-<id>` and waits until each accepts connections.
    pub fn start(dir: &TestDir, name: &str, count: usize) -> ReplicaGroup {
        ReplicaGroup::start_with(dir, name, count, |_| Vec::new())
    }

    /// [`start`](Self::start), with `extra(i)` on the command line of replica `i + 1`.
    pub fn start_with(
        dir: &TestDir,
        name: &str,
        count: usize,
        extra: impl Fn(usize) -> Vec<OsString>,
    ) -> ReplicaGroup {
        let peers: Vec<String> = (0..count).map(|_| free_address()).collect();
        let list = replicas_option(&peers);
        let replicas = (0..count)
            .map(|i| {
                let mut args: Vec<OsString> = vec![
                    "--replica-id".into(),
                    (i + 1).to_string().into(),
                    "--replicas".into(),
                    list.clone().into(),
                ];
                args.extend(extra(i));
                DirectoryProc::start_with(dir, &format!("{name}-{}", i + 1), &args)
            })
            .collect();
        ReplicaGroup { replicas, peers }
    }

    /// Every replica's host address, comma-separated (a host's `--directory`).
    pub fn listens(&self) -> String {
        self.replicas
            .iter()
            .map(|r| r.listen.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The replica that serves now: the one a client is welcomed by (followers answer
    /// `NotLeader` and close the connection). Waits up to `timeout`.
    pub fn serving(&mut self, timeout: Duration) -> usize {
        self.serving_except(timeout, None)
    }

    /// A client welcomed by the replica that serves now (waits up to `timeout` in all, also
    /// when leadership moves between finding the leader and connecting to it).
    pub fn client(&mut self, timeout: Duration) -> raw::RawClient {
        let deadline = Instant::now() + timeout;
        loop {
            let serving = self.serving(timeout);
            if let Ok(client) = raw::RawClient::connect(&self.replicas[serving].listen) {
                return client;
            }
            assert!(
                Instant::now() < deadline,
                "no replica keeps serving for {timeout:?}"
            );
        }
    }

    /// `dataplane-node replicas --data-dir DIR ARGS...` for replica `i` (its control
    /// socket): the exit code, and stdout then stderr.
    pub fn control(&self, i: usize, args: &[&str]) -> (i32, String) {
        let out = Command::new(&binaries().node)
            .arg("replicas")
            .arg("--data-dir")
            .arg(&self.replicas[i].data_dir)
            .args(args)
            .output()
            .expect("run dataplane-node replicas");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    /// [`serving`](Self::serving), not asking replica `skip` (stopped with SIGSTOP: its kernel
    /// accepts a connection that nobody answers).
    pub fn serving_except(&mut self, timeout: Duration, skip: Option<usize>) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            for (i, replica) in self.replicas.iter_mut().enumerate() {
                if Some(i) == skip || replica.proc.try_wait().is_some() {
                    continue;
                }
                if raw::RawClient::connect(&replica.listen).is_ok() {
                    return i;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no replica serves within {timeout:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A host node process.
#[derive(Debug)]
pub struct HostProc {
    /// The process.
    pub proc: Proc,
    /// Its `--listen` (its identity at the directory).
    pub listen: String,
    /// The Unix socket children attach to.
    pub socket: PathBuf,
}

impl HostProc {
    /// Starts a host with an arena of `arena` (e.g. `"32M"`) and waits until the CLI can use
    /// it through the directory. `directory` is its `--directory`: one address, or several,
    /// comma-separated (`host:port,host:port`: the replicas of a replicated directory, tried in
    /// turn).
    pub fn start(dir: &TestDir, name: &str, directory: &str, arena: &str) -> HostProc {
        HostProc::start_with(dir, name, directory, arena, &[])
    }

    /// Starts a host like [`start`](Self::start), with `extra` options on its command line,
    /// without waiting for it.
    pub fn spawn_with(
        dir: &TestDir,
        name: &str,
        directory: &str,
        arena: &str,
        extra: &[OsString],
    ) -> HostProc {
        HostProc::spawn_env(
            dir,
            name,
            directory,
            free_address(),
            arena,
            extra,
            Vec::new(),
        )
    }

    /// [`spawn_with`](Self::spawn_with) at `listen`, with environment variables `env`.
    pub fn spawn_env(
        dir: &TestDir,
        name: &str,
        directory: &str,
        listen: String,
        arena: &str,
        extra: &[OsString],
        env: Vec<(OsString, OsString)>,
    ) -> HostProc {
        let socket = dir.join(&format!("{name}.sock"));
        let mut args: Vec<OsString> = vec![
            "host".into(),
            "--directory".into(),
            directory.into(),
            "--listen".into(),
            listen.clone().into(),
            "--socket".into(),
            socket.clone().into(),
            "--arena-size".into(),
            arena.into(),
        ];
        args.extend_from_slice(extra);
        let proc = Proc::spawn_env(
            name,
            &binaries().node,
            args,
            env,
            dir.join(&format!("{name}.log")),
        );
        HostProc {
            proc,
            listen,
            socket,
        }
    }

    /// [`spawn_with`](Self::spawn_with), then waits until it serves.
    pub fn start_with(
        dir: &TestDir,
        name: &str,
        directory: &str,
        arena: &str,
        extra: &[OsString],
    ) -> HostProc {
        let mut host = HostProc::spawn_with(dir, name, directory, arena, extra);
        host.wait_ready();
        host
    }

    /// Waits until its socket and capability exist and a `stat` of a path that does not exist
    /// answers "not found" (so the directory welcomed it).
    pub fn wait_ready(&mut self) {
        let cap = dataplane_io::hostnode::capability_path(&self.socket);
        let what = format!(
            "{} to serve children on {}",
            self.proc.name(),
            self.socket.display()
        );
        let (proc, socket) = (&mut self.proc, &self.socket);
        wait_until(&what, READY_TIMEOUT, || {
            proc.assert_running();
            socket.exists()
                && cap.exists()
                && cli_with(socket, &["stat", "/data/.ready"], None, CLI_TIMEOUT).code == 2
        });
    }

    /// SIGKILL, then the same command line (same `--listen`); waits until it serves.
    pub fn restart(&mut self) {
        self.proc.restart();
        self.wait_ready();
    }

    /// Runs the CLI against this host.
    pub fn cli(&self, args: &[&str]) -> CliOutput {
        cli_with(&self.socket, args, None, CLI_TIMEOUT)
    }

    /// Runs the CLI against this host with `stdin`.
    pub fn cli_stdin(&self, args: &[&str], stdin: &[u8]) -> CliOutput {
        cli_with(&self.socket, args, Some(stdin), CLI_TIMEOUT)
    }
}

/// What a CLI run produced.
#[derive(Debug, Clone)]
pub struct CliOutput {
    /// The exit code (-1 if killed by a signal).
    pub code: i32,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: String,
}

impl CliOutput {
    /// The revision a successful `put` or `publish` reported on stdout (its one line,
    /// `PATH: published at @N`, ends with it). Panics on any other output.
    pub fn revision(&self) -> String {
        let line = String::from_utf8_lossy(&self.stdout);
        let line = line.trim_end();
        assert!(
            line.contains(": published ") && !line.contains('\n'),
            "not a put's one line: {line:?}"
        );
        line.rsplit(' ').next().expect("a revision").to_owned()
    }

    /// Panics unless the exit code is `code`.
    pub fn expect_code(&self, code: i32, what: &str) -> &CliOutput {
        assert_eq!(
            self.code, code,
            "{what}: exit code {} (expected {code}); stderr: {:?}",
            self.code, self.stderr
        );
        self
    }

    /// Panics unless stderr is one line `dataplane: MESSAGE` in plain words: no control
    /// character, and nothing that looks like Rust debug output (`Blob(Digest)`,
    /// `LimitReached(PendingRequests)`, `Length { .. }`, `Some(`, `None`).
    pub fn expect_plain_error(&self) -> &CliOutput {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line of stderr: {:?}", self.stderr);
        assert!(self.stderr.ends_with('\n'), "stderr ends with a newline");
        let line = lines[0];
        assert!(line.starts_with("dataplane: "), "{line:?}");
        assert!(
            !line.chars().any(char::is_control),
            "control characters in {line:?}"
        );
        assert!(!looks_like_debug(line), "Rust debug syntax in {line:?}");
        self
    }

    /// Panics unless stderr is exactly one line equal to `line`.
    pub fn expect_stderr_line(&self, line: &str) -> &CliOutput {
        assert_eq!(
            self.stderr.lines().collect::<Vec<_>>(),
            vec![line],
            "stderr should be the one line {line:?}"
        );
        assert!(self.stderr.ends_with('\n'), "stderr ends with a newline");
        self
    }
}

/// Runs `dataplane --socket SOCKET ARGS...`, feeding `stdin`; kills it and panics after
/// `timeout`.
pub fn cli_with(
    socket: &Path,
    args: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> CliOutput {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    cli_os(socket, &args, stdin, timeout)
}

/// [`cli_with`] with arguments that need not be UTF-8.
pub fn cli_os(
    socket: &Path,
    args: &[&std::ffi::OsStr],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> CliOutput {
    let mut command = Command::new(&binaries().cli);
    command
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let feeder = stdin.map(|bytes| {
        let mut pipe = child.stdin.take().expect("piped stdin");
        let bytes = bytes.to_vec();
        thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        })
    });
    let mut out_pipe = child.stdout.take().expect("piped stdout");
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let out_reader = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = out_pipe.read_to_end(&mut bytes);
        bytes
    });
    let err_reader = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = err_pipe.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the CLI") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let shown: Vec<String> = args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            panic!(
                "`dataplane {}` did not finish within {timeout:?}",
                shown.join(" ")
            );
        }
        thread::sleep(Duration::from_millis(2));
    };
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    CliOutput {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr,
    }
}

/// Whether `text` looks like Rust debug output: a capitalised identifier followed by `(` or
/// ` {`, or `None`.
pub fn looks_like_debug(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        if starts_word && bytes[i].is_ascii_uppercase() {
            let mut j = i + 1;
            while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_') {
                j += 1;
            }
            let rest = &text[j..];
            if rest.starts_with('(') || rest.starts_with(" {") || &text[i..j] == "None" {
                return true;
            }
            i = j;
        } else {
            i += 1;
        }
    }
    false
}

/// `len` pseudo-random bytes from `seed` (xorshift; no dependency).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

//! The directory is killed with SIGKILL under a load of concurrent mutations, and restarted,
//! `DATAPLANE_KILL_ROUNDS` times (default 20). After every restart:
//!
//! * the Welcome's epoch is above the previous one, and every reply carries it;
//! * every mutation that was in flight at the kill is re-sent with its operation id and now has
//!   a definite outcome (it succeeds: nothing could refuse it);
//! * every mutation acknowledged so far, re-sent with its operation id, gets its original
//!   receipt (same revision);
//! * the namespace is exactly what the acknowledged mutations made it: every live path
//!   resolves to its source, length and revision, every removed or renamed-away path is not
//!   found.
//!
//! Two hosts stay connected through all of it, each publishing blobs through its proxy with
//! the CLI, and each publishes again after every kill: every put that succeeded is there
//! afterwards, at the revision it reported, with its bytes, read through the other host.
//!
//! With the directory gone, a put ends at the host's proxy deadline (exit 75, "directory
//! unavailable"), its arena space goes back, and once the directory is back the path is not
//! there and the same put succeeds.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dataplane_core::error::NamespaceError;
use dataplane_core::ids::{Address, AuthorityEpoch, NodeId, OperationId, RequestId, Revision};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{DirectoryRequest, ReplyBody, SourceRecovery};
use dataplane_tests::raw::RawClient;
use dataplane_tests::{
    CLI_TIMEOUT, DirectoryProc, HostProc, TestDir, cli_with, pattern, wait_until,
};

/// Concurrent clients, each on its own connection.
const CLIENTS: usize = 4;
/// Calls each client keeps in flight.
const WINDOW: usize = 8;
/// Calls in flight while verifying.
const VERIFY_WINDOW: usize = 256;
/// Acknowledgements (all clients together) to see in a round before the kill.
const ACKS_BEFORE_KILL: usize = 40;

/// `DATAPLANE_KILL_ROUNDS` (default 20).
pub(crate) fn rounds() -> usize {
    match std::env::var("DATAPLANE_KILL_ROUNDS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("DATAPLANE_KILL_ROUNDS={v:?} is not a number")),
        Err(_) => 20,
    }
}

fn path(s: &str) -> DataPath {
    DataPath::new(s).unwrap()
}

/// One client's mutations and what they made of its own part of the namespace.
#[derive(Debug)]
struct Model {
    index: usize,
    next_path: u64,
    next_op: u128,
    /// Path → (revision, source, length) for every live blob.
    live: BTreeMap<String, (Revision, Address, u64)>,
    /// Paths that were removed or renamed away.
    gone: BTreeSet<String>,
    /// Paths with a mutation in flight.
    busy: BTreeSet<String>,
    /// Every acknowledged mutation and its receipt.
    acked: Vec<(OperationId, DirectoryRequest, Revision)>,
    /// Mutations sent and not answered (in sending order), with their request ids.
    in_flight: VecDeque<(RequestId, OperationId, DirectoryRequest)>,
}

impl Model {
    fn new(index: usize) -> Model {
        Model {
            index,
            next_path: 0,
            next_op: 1,
            live: BTreeMap::new(),
            gone: BTreeSet::new(),
            busy: BTreeSet::new(),
            acked: Vec::new(),
            in_flight: VecDeque::new(),
        }
    }

    fn fresh_path(&mut self) -> String {
        self.next_path += 1;
        format!("/data/k/c{}/p{}", self.index, self.next_path)
    }

    /// The next mutation: mostly registers of new paths, some renames and compare-and-delete
    /// unregisters of live paths that have nothing in flight.
    fn next_request(&mut self) -> (OperationId, DirectoryRequest) {
        let operation = OperationId(((self.index as u128 + 1) << 64) | self.next_op);
        self.next_op += 1;
        let idle = self
            .live
            .iter()
            .find(|(p, _)| !self.busy.contains(*p))
            .map(|(p, (rev, _, _))| (p.clone(), *rev));
        let request = match (self.next_op % 6, idle) {
            (4, Some((source, _))) => {
                let destination = self.fresh_path();
                self.busy.insert(source.clone());
                self.busy.insert(destination.clone());
                DirectoryRequest::Rename {
                    source: path(&source),
                    destination: path(&destination),
                    replace: false,
                    operation,
                }
            }
            (5, Some((target, revision))) => {
                self.busy.insert(target.clone());
                DirectoryRequest::Unregister {
                    path: path(&target),
                    expected_revision: Some(revision),
                    operation,
                }
            }
            _ => {
                let p = self.fresh_path();
                self.busy.insert(p.clone());
                let source = Address::new(NodeId((1 << 50) | self.index as u64), 1, self.next_path);
                DirectoryRequest::Register {
                    path: path(&p),
                    source,
                    source_node: source.node,
                    length: self.next_path * 10,
                    recovery: SourceRecovery::Actor {
                        actor: source,
                        node: source.node,
                        owner: None,
                    },
                    operation,
                    reservation: None,
                }
            }
        };
        (operation, request)
    }

    /// A mutation succeeded at `revision`.
    fn apply(&mut self, operation: OperationId, request: DirectoryRequest, revision: Revision) {
        match &request {
            DirectoryRequest::Register {
                path,
                source,
                length,
                ..
            } => {
                let p = path.as_str().to_owned();
                self.busy.remove(&p);
                self.live.insert(p, (revision, *source, *length));
            }
            DirectoryRequest::Rename {
                source,
                destination,
                ..
            } => {
                let (from, to) = (source.as_str().to_owned(), destination.as_str().to_owned());
                self.busy.remove(&from);
                self.busy.remove(&to);
                let (_, actor, length) = self.live.remove(&from).expect("renamed a live path");
                self.live.insert(to, (revision, actor, length));
                self.gone.insert(from);
            }
            DirectoryRequest::Unregister { path, .. } => {
                let p = path.as_str().to_owned();
                self.busy.remove(&p);
                self.live.remove(&p);
                self.gone.insert(p);
            }
            other => unreachable!("not a mutation of this test: {other:?}"),
        }
        self.acked.push((operation, request, revision));
    }

    /// The revision of a successful mutation reply; panics on anything else.
    fn receipt(&self, body: &ReplyBody, request: &DirectoryRequest) -> Revision {
        match body {
            ReplyBody::Registered(Ok(r))
            | ReplyBody::Renamed(Ok(r))
            | ReplyBody::Unregistered(Ok(r)) => r.revision,
            other => panic!(
                "client {}: {request:?} answered {other:?} (nothing may refuse it)",
                self.index
            ),
        }
    }

    /// After a restart: settle what was in flight, retry every acknowledged operation, check
    /// the namespace.
    fn verify(&mut self, client: &mut RawClient) {
        // In-flight mutations of the killed incarnation: re-send with the same operation id.
        let pending: Vec<_> = self.in_flight.drain(..).collect();
        for (_, operation, request) in pending {
            let body = client
                .call(request.clone())
                .expect("re-send an in-flight mutation");
            let revision = self.receipt(&body, &request);
            self.apply(operation, request, revision);
        }
        // Every acknowledged mutation, re-sent with its operation id: its original receipt.
        let retries = self.acked.iter().map(|(_, r, _)| r.clone()).collect();
        let replies = client
            .pipeline(retries, VERIFY_WINDOW)
            .expect("retries of acknowledged mutations");
        for ((operation, request, revision), body) in self.acked.iter().zip(&replies) {
            assert_eq!(
                self.receipt(body, request),
                *revision,
                "client {}: the retry of {operation} got another receipt",
                self.index
            );
        }
        // The namespace: live paths resolve as registered (or renamed), gone paths are gone.
        let paths: Vec<&String> = self.live.keys().chain(&self.gone).collect();
        let queries = paths
            .iter()
            .map(|p| {
                if self.live.contains_key(*p) {
                    DirectoryRequest::Resolve { path: path(p) }
                } else {
                    DirectoryRequest::Lookup { path: path(p) }
                }
            })
            .collect();
        let replies = client
            .pipeline(queries, VERIFY_WINDOW)
            .expect("resolves and lookups");
        for (p, body) in paths.into_iter().zip(&replies) {
            match (self.live.get(p), body) {
                (Some((revision, source, length)), ReplyBody::Resolved(Ok(binding))) => {
                    assert_eq!(
                        (binding.revision, binding.source, binding.length),
                        (*revision, *source, *length),
                        "client {}: {p} resolves to another binding",
                        self.index
                    );
                }
                (None, ReplyBody::LookedUp(Err(NamespaceError::PathNotFound(_)))) => {}
                (expected, body) => panic!(
                    "client {}: {p}: expected {expected:?}, the directory says {body:?}",
                    self.index
                ),
            }
        }
    }

    /// Sends mutations, `WINDOW` at a time, until the connection breaks (the kill).
    fn load(&mut self, client: &mut RawClient, acks: &AtomicUsize) {
        loop {
            while self.in_flight.len() < WINDOW {
                let (operation, request) = self.next_request();
                match client.send(request.clone()) {
                    Ok(id) => self.in_flight.push_back((id, operation, request)),
                    Err(_) => {
                        // Unknown whether it left: it is in flight like the others.
                        self.in_flight
                            .push_back((RequestId(u64::MAX), operation, request));
                        return;
                    }
                }
            }
            let Ok(reply) = client.recv() else {
                return; // Killed.
            };
            assert_eq!(reply.epoch, client.epoch, "a reply from another epoch");
            let at = self
                .in_flight
                .iter()
                .position(|(id, _, _)| *id == reply.request_id)
                .expect("a reply to a call in flight");
            let (_, operation, request) = self.in_flight.remove(at).expect("in flight");
            let revision = self.receipt(&reply.body, &request);
            self.apply(operation, request, revision);
            acks.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn connect(listen: &str) -> RawClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match RawClient::connect(listen) {
            Ok(client) => return client,
            Err(e) => assert!(
                Instant::now() < deadline,
                "cannot connect to the restarted directory: {e}"
            ),
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// What the kill loop kills: one directory node, or the leader of a replicated directory
/// (`kill_replicas.rs`).
pub(crate) trait Authority {
    /// A host's `--directory`.
    fn directory_option(&self) -> String;
    /// A client welcomed by whoever serves now (waits for one).
    fn connect(&mut self) -> RawClient;
    /// SIGKILL whoever serves (under load).
    fn kill(&mut self, round: usize);
    /// After the kill (at `killed`), once the killed incarnation's clients are gone: restart
    /// what was killed (for a replicated directory, after its successor serves). Returns how
    /// long after the kill a client was welcomed again.
    fn recover(&mut self, round: usize, killed: Instant) -> Duration;
}

/// The single directory node: killed and restarted on the same port and data directory.
struct Single(DirectoryProc);

impl Authority for Single {
    fn directory_option(&self) -> String {
        self.0.listen.clone()
    }

    fn connect(&mut self) -> RawClient {
        connect(&self.0.listen)
    }

    fn kill(&mut self, _round: usize) {
        self.0.proc.assert_running();
        self.0.proc.kill9();
    }

    fn recover(&mut self, _round: usize, killed: Instant) -> Duration {
        self.0.restart();
        drop(self.connect());
        killed.elapsed()
    }
}

#[test]
fn kill9_the_directory_under_load_and_restart_it() {
    let dir = TestDir::new("kill-directory");
    let mut directory = Single(DirectoryProc::start(&dir, "directory"));
    kill_loop(&dir, &mut directory, rounds());
}

/// Kills the authority under load `rounds` times (see the module documentation); returns the
/// time from each kill until a client was welcomed again.
pub(crate) fn kill_loop(
    dir: &TestDir,
    authority: &mut dyn Authority,
    rounds: usize,
) -> Vec<Duration> {
    // Two hosts. Room for every put of the run (5,000 bytes each, a few per second): a full
    // arena would make a put wait for space, which is not what this test is about.
    let hosts: Vec<HostProc> = (0..2)
        .map(|k| {
            HostProc::start(
                dir,
                &format!("host-{k}"),
                &authority.directory_option(),
                "64M",
            )
        })
        .collect();
    // Meanwhile, each host publishes through its proxy, one CLI put after another.
    let stop = Arc::new(AtomicBool::new(false));
    let puts: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let putters: Vec<_> = (0..2)
        .map(|k| {
            let (stop, puts, socket) = (stop.clone(), puts[k].clone(), hosts[k].socket.clone());
            thread::spawn(move || {
                let mut published = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let p = format!("/data/kh{k}/p{n}");
                    let put = cli_with(
                        &socket,
                        &["put", &p, "-"],
                        Some(&pattern(n, 5_000)),
                        CLI_TIMEOUT,
                    );
                    if put.code == 0 {
                        let revision = put.revision();
                        published.push((p, n, revision));
                        puts.fetch_add(1, Ordering::Relaxed);
                    } else {
                        assert_eq!(put.code, 75, "a put during the kills: {:?}", put.stderr);
                    }
                }
                published
            })
        })
        .collect();
    let mut models: Vec<Model> = (0..CLIENTS).map(Model::new).collect();
    let mut last_epoch = AuthorityEpoch(0);
    let mut outages = Vec::new();
    let started = Instant::now();
    for round in 0..=rounds {
        // A new incarnation of the directory: a higher epoch, and every acknowledged mutation.
        let mut clients: Vec<RawClient> = (0..CLIENTS).map(|_| authority.connect()).collect();
        let epoch = clients[0].epoch;
        assert!(
            epoch > last_epoch,
            "round {round}: epoch {epoch} does not advance past {last_epoch}"
        );
        assert!(
            clients.iter().all(|c| c.epoch == epoch),
            "one epoch per incarnation"
        );
        last_epoch = epoch;
        for (model, client) in models.iter_mut().zip(&mut clients) {
            model.verify(client);
        }
        if round == rounds {
            break;
        }
        // Load from every client at once; kill the directory in the middle of it.
        let acks = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = models
            .drain(..)
            .zip(clients)
            .map(|(mut model, mut client)| {
                let acks = acks.clone();
                thread::spawn(move || {
                    model.load(&mut client, &acks);
                    model
                })
            })
            .collect();
        wait_until(
            &format!("{ACKS_BEFORE_KILL} acknowledgements in round {round}"),
            Duration::from_secs(30),
            || acks.load(Ordering::Relaxed) >= ACKS_BEFORE_KILL,
        );
        let killed = Instant::now();
        authority.kill(round);
        for worker in workers {
            match worker.join() {
                Ok(model) => models.push(model),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        assert!(
            models.iter().any(|m| !m.in_flight.is_empty()),
            "round {round}: the kill came when nothing was in flight"
        );
        let outage = authority.recover(round, killed);
        outages.push(outage);
        // The hosts keep working: a put through each succeeds before the next kill.
        let before: Vec<usize> = puts.iter().map(|p| p.load(Ordering::Relaxed)).collect();
        wait_until(
            &format!("a put through each host after the kill of round {round}"),
            Duration::from_secs(60),
            || {
                puts.iter()
                    .zip(&before)
                    .all(|(p, b)| p.load(Ordering::Relaxed) > *b)
            },
        );
        eprintln!(
            "round {round}: a client was welcomed again {outage:?} after the kill, both hosts \
             published again after {:?}",
            killed.elapsed()
        );
    }
    let acked: usize = models.iter().map(|m| m.acked.len()).sum();
    let mut sorted = outages.clone();
    sorted.sort();
    eprintln!(
        "{rounds} kills, {acked} mutations acknowledged and verified, {:?}; time from a kill \
         to a client welcomed again: p50 {:?}, max {:?}",
        started.elapsed(),
        sorted.get(sorted.len() / 2),
        sorted.last()
    );

    // Every put the CLI saw succeed is there, at its revision, with its bytes, read through
    // the other host.
    stop.store(true, Ordering::Relaxed);
    let published: Vec<Vec<(String, u64, String)>> = putters
        .into_iter()
        .map(|p| p.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect();
    let mut client = authority.connect();
    for (k, published) in published.iter().enumerate() {
        assert!(
            !published.is_empty(),
            "host {k} published nothing during the kills"
        );
        let reader = &hosts[1 - k];
        for (p, n, revision) in published {
            match client.lookup(p).unwrap() {
                ReplyBody::LookedUp(Ok(node)) => {
                    assert_eq!(&node.revision.to_string(), revision);
                }
                other => panic!("{p} (published at {revision}): {other:?}"),
            }
            let get = reader.cli(&["get", p]);
            get.expect_code(0, "get of a blob published during the kills");
            assert!(
                get.stdout == pattern(*n, 5_000),
                "{p} reads back other bytes"
            );
        }
        eprintln!(
            "{} puts through host {k} during the kills, each read back through the other host",
            published.len()
        );
    }

    // The hosts reconnected to the last incarnation: they publish and read.
    let bytes = pattern(7, 100_000);
    wait_until(
        "a host to publish through the restarted directory",
        Duration::from_secs(30),
        || {
            hosts[0]
                .cli_stdin(&["put", "/data/after-kills", "-"], &bytes)
                .code
                == 0
        },
    );
    let get = hosts[1].cli(&["get", "/data/after-kills"]);
    get.expect_code(0, "get after the kills");
    assert!(get.stdout == bytes, "the host read other bytes");
    outages
}

#[test]
fn a_put_while_the_directory_is_down_fails_at_the_deadline_and_changes_nothing() {
    let dir = TestDir::new("directory-down");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start_with(
        &dir,
        "host",
        &directory.listen,
        "4M",
        &["--deadline-secs".into(), "2".into()],
    );
    let bytes = pattern(3, 10_000);
    host.cli_stdin(&["put", "/data/before", "-"], &bytes)
        .expect_code(0, "a put with the directory up");
    directory.proc.kill9();
    let started = Instant::now();
    let put = host.cli_stdin(&["put", "/data/down", "-"], &bytes);
    let took = started.elapsed();
    put.expect_code(75, "a put with the directory down");
    put.expect_stderr_line(
        "dataplane: namespace unavailable: directory unavailable: no directory was \
         discoverable before the deadline",
    );
    // The proxy's deadline (2 s), plus a tick or two; it used to wait for a directory for ever.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "the put ended after {took:?}"
    );
    let arena = host.cli(&["arena"]);
    arena.expect_code(0, "arena");
    let text = String::from_utf8_lossy(&arena.stdout).into_owned();
    assert!(
        text.contains(" leases=1 "),
        "only the first put's lease is held: {text}"
    );
    directory.proc.start();
    directory.wait_ready();
    wait_until(
        "the host to publish through the restarted directory",
        Duration::from_secs(30),
        || host.cli_stdin(&["put", "/data/after", "-"], &bytes).code == 0,
    );
    host.cli(&["stat", "/data/down"])
        .expect_code(2, "the failed put published nothing");
    host.cli_stdin(&["put", "/data/down", "-"], &bytes)
        .expect_code(0, "the same put with the directory back");
    let get = host.cli(&["get", "/data/down"]);
    get.expect_code(0, "get");
    assert!(get.stdout == bytes, "other bytes");
}

//! The durable log under a real directory machine: every `Persist` goes through the log with
//! the group-commit barrier, the node restarts from the files, and `Directory::recover`
//! rebuilds the same durable state. Also the group-commit measurement (ignored).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant as WallClock;

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::ids::{Address, NodeId, OperationId, RequestId};
use dataplane_core::log::LogRecord;
use dataplane_core::path::DataPath;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, Message, ReplyBody, SourceRecovery,
};
use dataplane_io::log::{DurableLog, LOG_HEADER_BYTES};

const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
const CLIENT: Address = Address::new(NodeId(1), 1, 0);

/// A fresh directory under the system temp dir, removed on drop.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("dataplane-io-log-it-{name}-"))
        .tempdir()
        .unwrap()
}

/// A directory node as a driver runs it: the machine, its log, and the effects held behind
/// the last unsynced `Persist`.
struct Node {
    dir: Directory,
    log: DurableLog,
    /// (barrier position, effect): released once the log is synced past the position.
    held: VecDeque<(u64, Effect)>,
    /// Position of the last appended record.
    barrier: u64,
    /// Effects released to the outside world.
    released: Vec<Effect>,
    next_request: u64,
}

impl Node {
    /// Opens the log at `path` and recovers the directory from it.
    fn boot(path: &std::path::Path) -> Node {
        let (log, recovered) = DurableLog::open(path).unwrap();
        let mut out = Outbox::new();
        let config = DirectoryConfig {
            address: DIRECTORY,
            retry_period: Duration::from_secs(1),
            limits: Default::default(),
        };
        let dir = Directory::recover(
            config,
            &recovered.records,
            &mut ActorSources,
            Instant::ZERO,
            &mut out,
        )
        .unwrap();
        let barrier = log.written();
        let mut node = Node {
            dir,
            log,
            held: VecDeque::new(),
            barrier,
            released: Vec::new(),
            next_request: 1,
        };
        node.execute(out.take());
        node.commit();
        node
    }

    /// Executes one step's effects: Persists are appended, everything after one is held.
    fn execute(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Persist(record) => self.barrier = self.log.append(&record).unwrap(),
                other if self.held.is_empty() && self.log.synced() >= self.barrier => {
                    self.released.push(other);
                }
                other => self.held.push_back((self.barrier, other)),
            }
        }
    }

    /// Group commit: one sync, then release what it covers.
    fn commit(&mut self) {
        let synced = self.log.sync().unwrap();
        while self.held.front().is_some_and(|(b, _)| *b <= synced) {
            let (_, effect) = self.held.pop_front().unwrap();
            self.released.push(effect);
        }
        assert!(self.held.is_empty());
    }

    fn call(&mut self, request: DirectoryRequest) -> RequestId {
        let request_id = RequestId(self.next_request);
        self.next_request += 1;
        let mut out = Outbox::new();
        let call = DirectoryCall {
            request_id,
            reply_to: CLIENT,
            request,
        };
        self.dir
            .handle_message(Instant::ZERO, Message::Call(call), &mut out)
            .unwrap();
        self.execute(out.take());
        request_id
    }

    fn register(&mut self, path: &str, source: u64, operation: u128) -> RequestId {
        let source = Address::new(NodeId(2), 1, source);
        self.call(DirectoryRequest::Register {
            path: DataPath::new(path).unwrap(),
            source,
            source_node: source.node,
            length: 10,
            recovery: SourceRecovery::Actor {
                actor: source,
                node: source.node,
                owner: None,
            },
            operation: OperationId(operation),
            reservation: None,
        })
    }

    fn unregister(&mut self, path: &str, operation: u128) -> RequestId {
        self.call(DirectoryRequest::Unregister {
            path: DataPath::new(path).unwrap(),
            expected_revision: None,
            operation: OperationId(operation),
        })
    }

    fn reply(&self, id: RequestId) -> Option<&ReplyBody> {
        self.released.iter().find_map(|e| match e {
            Effect::Send {
                to,
                message:
                    Message::Reply(DirectoryReply {
                        request_id, body, ..
                    }),
            } if *to == CLIENT && *request_id == id => Some(body),
            _ => None,
        })
    }

    /// The durable state minus the epoch (a recovery always adopts a new one).
    fn durable_view(&self) -> Vec<LogRecord> {
        let mut snapshot = self.dir.snapshot_records();
        snapshot.remove(0);
        snapshot
    }
}

#[test]
fn a_directory_recovers_from_its_durable_log() {
    let scratch = scratch("directory");
    let path = scratch.path().join("dir-node");
    let mut node = Node::boot(&path);

    // A batch of steps: replies wait for the one sync.
    let ids: Vec<RequestId> = (0..5)
        .map(|i| node.register(&format!("/a/{i}"), 10 + i, u128::from(i) + 1))
        .collect();
    assert!(node.log.written() > node.log.synced());
    assert!(ids.iter().all(|id| node.reply(*id).is_none()), "held");
    node.commit();
    for id in &ids {
        let reply = node.reply(*id).expect("released after the sync");
        assert!(matches!(reply, ReplyBody::Registered(Ok(_))), "{reply:?}");
    }
    node.unregister("/a/1", 20);
    node.register("/a/2", 99, 21); // replaces: a retirement obligation
    node.commit();
    node.dir.check_invariants().unwrap();
    let entries_before: Vec<_> = node
        .dir
        .durable()
        .entries()
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect();
    assert_eq!(entries_before.len(), 4);
    let view_before = node.durable_view();
    let epoch_before = node.dir.epoch();
    drop(node);

    let mut node = Node::boot(&path);
    node.dir.check_invariants().unwrap();
    let entries_after: Vec<_> = node
        .dir
        .durable()
        .entries()
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect();
    assert_eq!(entries_after, entries_before);
    assert_eq!(node.durable_view(), view_before);
    assert!(node.dir.epoch() > epoch_before);

    // Compact, keep going, restart again.
    let snapshot = node.dir.snapshot_records();
    node.log.compact(&snapshot).unwrap();
    assert_eq!(
        node.log.len_bytes(),
        LOG_HEADER_BYTES as u64,
        "the new log's header"
    );
    node.barrier = node.log.written();
    node.register("/b", 30, 30);
    node.unregister("/a/0", 31);
    node.commit();
    let entries_before: Vec<_> = node
        .dir
        .durable()
        .entries()
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect();
    let view_before = node.durable_view();
    drop(node);

    let node = Node::boot(&path);
    node.dir.check_invariants().unwrap();
    assert_eq!(node.log.generation(), 1);
    let entries_after: Vec<_> = node
        .dir
        .durable()
        .entries()
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect();
    assert_eq!(entries_after, entries_before);
    assert_eq!(node.durable_view(), view_before);
}

/// Appends + sync of 1000 small records, one sync each versus one sync for all. Run with
/// `cargo test --release -p dataplane-io --test log -- --ignored --nocapture`
/// (`DATAPLANE_LOG_BENCH_DIR=/some/dir` measures another file system).
#[test]
#[ignore = "a measurement, not a check"]
fn measure_group_commit() {
    const N: u64 = 1000;
    let scratch = scratch("bench");
    let base = std::env::var_os("DATAPLANE_LOG_BENCH_DIR").map_or_else(
        || scratch.path().to_path_buf(),
        |d| PathBuf::from(d).join(scratch.path().file_name().unwrap()),
    );
    let record = |i: u64| LogRecord::RetirementDone {
        source: Address::new(NodeId(2), 1, i),
    };
    for round in 0..3 {
        let (mut log, _) = DurableLog::open(&base.join(format!("each-{round}"))).unwrap();
        let start = WallClock::now();
        for i in 0..N {
            log.append(&record(i)).unwrap();
            log.sync().unwrap();
        }
        let each = start.elapsed();

        let (mut log, _) = DurableLog::open(&base.join(format!("group-{round}"))).unwrap();
        let start = WallClock::now();
        for i in 0..N {
            log.append(&record(i)).unwrap();
        }
        log.sync().unwrap();
        let group = start.elapsed();

        #[allow(clippy::cast_precision_loss)]
        let rate = |d: std::time::Duration| N as f64 / d.as_secs_f64();
        println!(
            "round {round}: {N} records of {} bytes: one sync each {:?} ({:.0} records/s); \
             one sync for all {:?} ({:.0} records/s); {:.0}x",
            log.written() / N,
            each,
            rate(each),
            group,
            rate(group),
            each.as_secs_f64() / group.as_secs_f64()
        );
    }
    if base != scratch.path() {
        let _ = std::fs::remove_dir_all(&base);
    }
}

#[test]
fn a_second_open_of_the_same_directory_is_refused_while_the_first_is_open() {
    let scratch = scratch("lock");
    let dir = scratch.path().join("data");
    let (first, _) = DurableLog::open(&dir).unwrap();
    let second = DurableLog::open(&dir);
    assert!(second.is_err(), "two logs on one directory");
    drop(first);
    assert!(DurableLog::open(&dir).is_ok(), "the lock goes with the log");
}

//! Host scenarios (SPEC §6–§11 and §13.8, as amended by DESIGN Q19–Q28 and the `host` module
//! docs): a directory with its durable log, and nodes that each run a proxy, a host and an arena
//! its children map — all real machines (`dataplane_testkit::hosts::Cluster`, shared with the
//! `host_session` fuzz target), wired by a network the script controls.
//!
//! * children are addresses on a node: `w.child(N1)`; they attach with `w.attach(c)`, send
//!   requests with `w.send(c, request)`, act on the arena directly (`w.fill_and_seal(c, view,
//!   bytes)`), and read what they were told with `w.take(c)` / `w.expect(c, pred)`;
//! * frames wait in one in-flight queue; `w.run(secs)` delivers them (FIFO) and fires the timers
//!   due, in time order; `w.blackhole(pred)` loses matching frames, `w.duplicate(pred)` delivers
//!   matching frames twice, `w.heal()` stops both;
//! * `w.restart_node(n)` starts a node's host and proxy again at a new incarnation (its
//!   children are gone); `w.restart_proxy(n)` restarts only the proxy.
//!
//! Every step checks every machine's invariants, and the arena's leases against the headers.

use std::collections::{BTreeMap, VecDeque};

use dataplane_core::arena::BLOB_HEADER_BYTES;
use dataplane_core::blob::{self, BlobAccess, BlobState, DigestKind, Expected};
use dataplane_core::directory::Directory;
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::error::{
    AttachmentFailure, BlobFailure, DataPlaneError, Limit, NamespaceError,
};
use dataplane_core::host::{Host, HostConfig, SessionConfig, SessionState};
use dataplane_core::ids::{Address, NodeId, PERSISTENT_INCARNATION, Revision};
use dataplane_core::path::{DataPath, JobContext};
use dataplane_core::time::Duration;
use dataplane_core::wire::{
    Capability, ChildEvent, ChildOp, ChildRequest, Descriptor, DirectoryCall, DirectoryRequest,
    GoneScope, LeaseView, Message, ReplyBody, StreamMatch, StreamRole,
};
use dataplane_testkit::dir::{DIRECTORY, path};
use dataplane_testkit::hosts::{Cluster, Frame, Setup};

// =============================================================================================
// The world.

const N1: usize = 0;
const N2: usize = 1;
const ARENA: u64 = 1 << 20;
const CAPABILITY: Capability = Capability([7; 32]);
const INSPECTOR: Address = Address::new(NodeId(99), 1, 0);
const AGENT_ACTOR: u64 = 1;

type Rule = Box<dyn Fn(&Frame) -> bool>;
type Tamper = Box<dyn Fn(&mut Frame)>;

struct Child {
    node: usize,
    session: Address,
    inbox: VecDeque<ChildEvent>,
}

struct World {
    /// The directory and the nodes: their proxies, hosts and arenas.
    cluster: Cluster,
    children: BTreeMap<Address, Child>,
    next_child: u64,
    in_flight: VecDeque<Frame>,
    blackholes: Vec<Rule>,
    duplicates: Vec<Rule>,
    /// Rewrites frames on the wire (a corrupting network or a lying source).
    tamper: Option<Tamper>,
    inspector: VecDeque<ReplyBody>,
}

fn job() -> JobContext {
    JobContext::new(
        "r1",
        vec![path("/data"), path("/runs/r1")],
        vec![path("/data"), path("/runs/r1")],
    )
    .unwrap()
}

impl World {
    fn new(nodes: usize) -> World {
        World::with(nodes, Duration::from_secs(10), |c| c)
    }

    fn with(
        nodes: usize,
        proxy_deadline: Duration,
        host_config: fn(HostConfig) -> HostConfig,
    ) -> World {
        let setup = Setup {
            arena: ARENA,
            proxy_deadline,
            host_config,
        };
        let mut sent = Vec::new();
        let cluster = Cluster::new(nodes, setup, &mut sent);
        let mut w = World {
            cluster,
            children: BTreeMap::new(),
            next_child: 100,
            in_flight: VecDeque::new(),
            blackholes: Vec::new(),
            duplicates: Vec::new(),
            tamper: None,
            inspector: VecDeque::new(),
        };
        w.wire_all(sent);
        w
    }

    fn host(&self, n: usize) -> &Host {
        &self.cluster.nodes[n].host
    }

    fn dir(&self) -> &Directory {
        &self.cluster.dir
    }

    // ----- children -------------------------------------------------------------------------

    fn child(&mut self, n: usize) -> Address {
        self.child_with(
            n,
            SessionConfig {
                session_generation: 1,
                capability: CAPABILITY,
                job: job(),
            },
        )
    }

    fn child_with(&mut self, n: usize, config: SessionConfig) -> Address {
        let session = self.cluster.nodes[n]
            .host
            .open_session(config)
            .expect("a session");
        let node = &self.cluster.nodes[n];
        let child = Address::new(node.id, node.incarnation, self.next_child);
        self.next_child += 1;
        self.children.insert(
            child,
            Child {
                node: n,
                session,
                inbox: VecDeque::new(),
            },
        );
        child
    }

    fn send(&mut self, child: Address, request: ChildRequest) {
        let session = self.children[&child].session;
        self.deliver(Frame {
            from: child,
            to: session,
            message: Message::FromChild(request),
        });
        self.settle();
    }

    fn attach(&mut self, child: Address) {
        let generation = self
            .host(self.children[&child].node)
            .config()
            .arena_generation;
        self.send(
            child,
            ChildRequest::Attach {
                arena_generation: generation,
                capability: CAPABILITY,
            },
        );
        match self.take(child).as_slice() {
            [ChildEvent::Attached { .. }] => {}
            other => panic!("attach: {other:?}"),
        }
    }

    fn take(&mut self, child: Address) -> Vec<ChildEvent> {
        self.children
            .get_mut(&child)
            .map(|c| c.inbox.drain(..).collect())
            .unwrap_or_default()
    }

    /// Takes the child's events; exactly one must match `pred`, and it is returned.
    fn expect(&mut self, child: Address, pred: impl Fn(&ChildEvent) -> bool) -> ChildEvent {
        let events = self.take(child);
        let found: Vec<&ChildEvent> = events.iter().filter(|e| pred(e)).collect();
        assert_eq!(
            found.len(),
            1,
            "expected one matching event, child got {events:?}"
        );
        found[0].clone()
    }

    fn expected_of(view: &LeaseView, access: BlobAccess) -> Expected {
        Expected {
            offset: view.offset,
            length: view.length,
            generation: view.generation,
            access,
            digest_kind: view.digest,
        }
    }

    /// The child writes `bytes` into its writable lease and seals the header.
    fn fill_and_seal(&mut self, child: Address, view: &LeaseView, bytes: &[u8]) {
        let n = self.children[&child].node;
        let e = Self::expected_of(view, BlobAccess::Writable);
        let mem = &mut self.cluster.nodes[n].mem;
        blob::payload_mut(mem, &e).unwrap().copy_from_slice(bytes);
        blob::child_seal(mem, &e).unwrap();
    }

    /// The payload of a read lease as the child sees it (checked against the header first).
    fn read_payload(&self, child: Address, view: &LeaseView) -> Vec<u8> {
        let n = self.children[&child].node;
        let e = Self::expected_of(view, view.access);
        let mem = &self.cluster.nodes[n].mem;
        blob::validate(mem, &e, BlobState::Sealed, false).expect("a sealed read lease");
        blob::payload(mem, &e).unwrap().to_vec()
    }

    /// A full write: open, fill, seal; returns the published revision.
    fn write(&mut self, child: Address, op: u64, logical: &str, bytes: &[u8]) -> Revision {
        let view = self.open_write(child, op, logical, bytes.len() as u64, false);
        self.fill_and_seal(child, &view, bytes);
        self.send(child, ChildRequest::Seal { op: ChildOp(op) });
        match self.expect(child, |e| {
            matches!(e, ChildEvent::Published { .. } | ChildEvent::Failed { .. })
        }) {
            ChildEvent::Published { revision, .. } => revision,
            other => panic!("write {logical}: {other:?}"),
        }
    }

    fn open_write(
        &mut self,
        child: Address,
        op: u64,
        logical: &str,
        length: u64,
        exclusive: bool,
    ) -> LeaseView {
        let request = ChildRequest::OpenWrite {
            op: ChildOp(op),
            path: logical.into(),
            length,
            digest: DigestKind::Blake3,
            exclusive,
        };
        self.send(child, request);
        match self.expect(child, |_| true) {
            ChildEvent::WriteGranted { lease, .. } => lease,
            other => panic!("open write {logical}: {other:?}"),
        }
    }

    fn open_read(&mut self, child: Address, op: u64, logical: &str) {
        let request = ChildRequest::OpenRead {
            op: ChildOp(op),
            path: logical.into(),
            expected_revision: None,
        };
        self.send(child, request);
    }

    /// A full read; returns the payload and the revision.
    fn read(
        &mut self,
        child: Address,
        op: u64,
        logical: &str,
    ) -> Result<(Vec<u8>, Revision), DataPlaneError> {
        self.open_read(child, op, logical);
        self.run(5);
        self.read_outcome(child)
    }

    fn read_outcome(&mut self, child: Address) -> Result<(Vec<u8>, Revision), DataPlaneError> {
        match self.expect(child, |e| {
            matches!(
                e,
                ChildEvent::ReadGranted { .. } | ChildEvent::Failed { .. }
            )
        }) {
            ChildEvent::ReadGranted {
                lease, revision, ..
            } => Ok((self.read_payload(child, &lease), revision)),
            ChildEvent::Failed { error, .. } => Err(error),
            _ => unreachable!(),
        }
    }

    // ----- the network ----------------------------------------------------------------------

    fn blackhole(&mut self, rule: impl Fn(&Frame) -> bool + 'static) {
        self.blackholes.push(Box::new(rule));
    }

    fn duplicate(&mut self, rule: impl Fn(&Frame) -> bool + 'static) {
        self.duplicates.push(Box::new(rule));
    }

    fn heal(&mut self) {
        self.blackholes.clear();
        self.duplicates.clear();
    }

    fn wire(&mut self, mut frame: Frame) {
        if let Some(tamper) = &self.tamper {
            tamper(&mut frame);
        }
        if self.blackholes.iter().any(|rule| rule(&frame)) {
            return;
        }
        if self.duplicates.iter().any(|rule| rule(&frame)) {
            self.in_flight.push_back(frame.clone());
        }
        self.in_flight.push_back(frame);
    }

    /// Puts what the machines sent on the wire, in order.
    fn wire_all(&mut self, sent: Vec<Frame>) {
        for frame in sent {
            self.wire(frame);
        }
    }

    /// Delivers every frame in flight (and those they cause).
    fn settle(&mut self) {
        let mut steps = 0;
        while let Some(frame) = self.in_flight.pop_front() {
            steps += 1;
            assert!(steps < 1_000_000, "the network does not settle");
            self.deliver(frame);
        }
    }

    fn deliver(&mut self, frame: Frame) {
        let Frame { from, to, message } = frame;
        let mut sent = Vec::new();
        if to == DIRECTORY {
            let _ = self.cluster.to_directory(message, &mut sent);
        } else if to == INSPECTOR {
            if let Message::Reply(reply) = message {
                self.inspector.push_back(reply.body);
            }
        } else if let Some(child) = self.children.get_mut(&to) {
            let Message::ToChild(event) = message else {
                panic!("{message:?} sent to child {to}")
            };
            child.inbox.push_back(event);
        } else if let Some(n) = self.cluster.node_of(to) {
            if to.incarnation == PERSISTENT_INCARNATION {
                // A file blob's source: the host answers in every life of the node.
                self.cluster
                    .to_host(n, from, to, message, &mut sent)
                    .unwrap();
            } else if to.actor == 0 && to.incarnation == self.cluster.nodes[n].incarnation {
                let _ = self.cluster.to_proxy(n, message, &mut sent);
            } else if to.actor == AGENT_ACTOR
                || to.actor == 0
                || (to.actor >= 100 && to.actor < 10_000)
            {
                // The node agent, a dead proxy, or a dead child: nobody listens.
            } else {
                self.cluster
                    .to_host(n, from, to, message, &mut sent)
                    .unwrap();
            }
        }
        self.wire_all(sent);
        self.check();
    }

    /// Runs for `secs` seconds: settles the network, then fires timers in time order.
    fn run(&mut self, secs: u64) {
        let end = self.cluster.now.saturating_add(Duration::from_secs(secs));
        loop {
            self.settle();
            let Some((at, due)) = self.cluster.next_timer().filter(|(at, _)| *at <= end) else {
                break;
            };
            self.cluster.now = self.cluster.now.max(at);
            let mut sent = Vec::new();
            self.cluster.fire(due, &mut sent);
            self.wire_all(sent);
            self.check();
        }
        self.cluster.now = end;
        self.settle();
    }

    /// Node `n` restarts: a new incarnation of its proxy and host with a fresh arena; its
    /// children are gone; the directory hears that its earlier addresses are gone.
    fn restart_node(&mut self, n: usize) {
        self.children.retain(|_, c| c.node != n);
        let mut sent = Vec::new();
        self.cluster.restart_node(n, &mut sent);
        self.wire_all(sent);
        let (id, incarnation) = (self.cluster.nodes[n].id, self.cluster.nodes[n].incarnation);
        let agent = Address::new(id, incarnation, AGENT_ACTOR);
        let scope = GoneScope::NodeBefore {
            node: id,
            incarnation,
        };
        self.wire(Frame {
            from: agent,
            to: DIRECTORY,
            message: Message::AddressGone {
                scope,
                reply_to: agent,
            },
        });
        self.settle();
    }

    /// Only the proxy of node `n` restarts (its pending table is lost); the host is told.
    fn restart_proxy(&mut self, n: usize) {
        let mut sent = Vec::new();
        self.cluster.restart_proxy(n, &mut sent);
        self.wire_all(sent);
        self.settle();
    }

    // ----- inspection -----------------------------------------------------------------------

    /// Resolves `p` at the directory directly.
    fn resolve(&mut self, p: &str) -> ReplyBody {
        let call = DirectoryCall {
            request_id: dataplane_core::ids::RequestId(1),
            reply_to: INSPECTOR,
            request: DirectoryRequest::Resolve {
                path: DataPath::new(p).unwrap(),
            },
        };
        let mut sent = Vec::new();
        self.cluster
            .to_directory(Message::Call(call), &mut sent)
            .unwrap();
        self.wire_all(sent);
        self.settle();
        self.inspector.pop_back().expect("a resolve reply")
    }

    fn live_leases(&self, n: usize) -> usize {
        self.host(n).arena().live_count()
    }

    fn check(&self) {
        self.cluster.dir.check_invariants().unwrap();
        self.cluster.check_nodes().unwrap();
        // Every lease a binding holds has a header that is still its own.
        for node in &self.cluster.nodes {
            for (_, b) in node.host.bindings() {
                if let Some(slot) = b.lease {
                    let header = blob::read_header(&node.mem, slot.expected.offset).unwrap();
                    assert_eq!(header.generation, slot.expected.generation);
                    assert_eq!(header.length, slot.expected.length);
                }
            }
        }
    }
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn is_failed(e: &ChildEvent) -> bool {
    matches!(e, ChildEvent::Failed { .. })
}

// =============================================================================================
// Scenarios.

#[test]
fn a_published_write_is_read_on_another_node() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    let content = bytes(300_000, 1);
    let revision = w.write(a, 1, "/data/x", &content);
    let (read, seen) = w.read(b, 1, "/data/x").unwrap();
    assert_eq!(seen, revision);
    assert_eq!(read, content);
    assert_eq!(w.live_leases(N2), 1);
    let offset = w
        .host(N2)
        .bindings()
        .find_map(|(_, binding)| binding.lease.map(|slot| slot.lease.offset))
        .expect("the read holds its lease");
    w.send(b, ChildRequest::Release { op: ChildOp(1) });
    w.expect(b, |e| matches!(e, ChildEvent::Released { .. }));
    assert_eq!(w.live_leases(N2), 0, "a released read frees its lease");
    let header = blob::read_header(&w.cluster.nodes[N2].mem, offset).unwrap();
    assert_eq!(
        header.state,
        BlobState::Released,
        "a freed lease's header says so to anyone still mapping it"
    );
    // The writer's lease stays: the blob is published.
    assert_eq!(w.live_leases(N1), 1);
}

#[test]
fn self_paths_resolve_to_the_run_and_unauthorized_paths_are_refused() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/runs/self/out", &bytes(10, 2));
    assert!(matches!(
        w.resolve("/runs/r1/out"),
        ReplyBody::Resolved(Ok(_))
    ));
    w.send(
        a,
        ChildRequest::OpenWrite {
            op: ChildOp(2),
            path: "/etc/x".into(),
            length: 1,
            digest: DigestKind::None,
            exclusive: false,
        },
    );
    let event = w.expect(a, is_failed);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                error: DataPlaneError::Unauthorized { .. },
                ..
            }
        ),
        "{event:?}"
    );
    w.send(
        a,
        ChildRequest::OpenRead {
            op: ChildOp(3),
            path: "data/rel".into(),
            expected_revision: None,
        },
    );
    let event = w.expect(a, is_failed);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                error: DataPlaneError::InvalidPath(_),
                ..
            }
        ),
        "{event:?}"
    );
    assert_eq!(
        w.host(N1).bindings().count(),
        1,
        "refused opens leave nothing behind"
    );
}

#[test]
fn attach_failures_change_nothing() {
    let mut w = World::new(1);
    let a = w.child(N1);
    let session = w.children[&a].session;
    w.send(
        a,
        ChildRequest::Attach {
            arena_generation: 9,
            capability: CAPABILITY,
        },
    );
    let event = w.expect(a, |_| true);
    assert!(matches!(
        event,
        ChildEvent::AttachFailed {
            error: DataPlaneError::Attachment(AttachmentFailure::ArenaGenerationMismatch { .. })
        }
    ));
    w.send(
        a,
        ChildRequest::Attach {
            arena_generation: 1,
            capability: Capability([0; 32]),
        },
    );
    let event = w.expect(a, |_| true);
    assert!(matches!(
        event,
        ChildEvent::AttachFailed {
            error: DataPlaneError::Attachment(AttachmentFailure::CapabilityRejected)
        }
    ));
    let state = w
        .host(N1)
        .sessions()
        .find(|(_, s)| s.address == session)
        .unwrap()
        .1
        .state;
    assert_eq!(state, SessionState::AwaitingAttachment);
    // Requests before attach are refused.
    w.open_read(a, 1, "/data/x");
    let event = w.expect(a, is_failed);
    assert!(matches!(
        event,
        ChildEvent::Failed {
            error: DataPlaneError::SessionNotRunning,
            ..
        }
    ));
    w.attach(a);
    // A second child is refused and cannot act for the first.
    let intruder = Address::new(NodeId(1), 1, 999);
    w.children.insert(
        intruder,
        Child {
            node: N1,
            session,
            inbox: VecDeque::new(),
        },
    );
    w.send(
        intruder,
        ChildRequest::Attach {
            arena_generation: 1,
            capability: CAPABILITY,
        },
    );
    let event = w.expect(intruder, |_| true);
    assert!(matches!(
        event,
        ChildEvent::AttachFailed {
            error: DataPlaneError::Attachment(AttachmentFailure::DuplicateAttachment)
        }
    ));
    w.open_read(intruder, 1, "/data/x");
    w.expect(intruder, |e| {
        matches!(
            e,
            ChildEvent::Failed {
                error: DataPlaneError::SessionNotRunning,
                ..
            }
        )
    });
}

#[test]
fn a_missing_path_fails_the_read_and_frees_nothing_it_never_had() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let error = w.read(a, 1, "/data/none").unwrap_err();
    assert!(
        matches!(error, DataPlaneError::PathNotFound(_)),
        "{error:?}"
    );
    assert_eq!(w.host(N1).bindings().count(), 0);
    assert_eq!(w.live_leases(N1), 0);
}

#[test]
fn exclusive_write_over_an_existing_path_fails_path_exists() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/data/x", &bytes(10, 1));
    w.send(
        a,
        ChildRequest::OpenWrite {
            op: ChildOp(2),
            path: "/data/x".into(),
            length: 4,
            digest: DigestKind::None,
            exclusive: true,
        },
    );
    let event = w.expect(a, |_| true);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                error: DataPlaneError::PathExists(_),
                ..
            }
        ),
        "{event:?}"
    );
    // An exclusive write on a fresh path reserves, publishes and consumes the reservation.
    let view = w.open_write(a, 3, "/data/fresh", 4, true);
    w.fill_and_seal(a, &view, b"abcd");
    w.send(a, ChildRequest::Seal { op: ChildOp(3) });
    w.expect(a, |e| matches!(e, ChildEvent::Published { .. }));
    assert!(
        w.dir().durable().reservations().next().is_none(),
        "the reservation was consumed"
    );
}

#[test]
fn a_replaced_write_frees_its_lease_only_after_the_child_lets_go() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let first = w.write(a, 1, "/data/x", &bytes(100, 1));
    let second = w.write(a, 2, "/data/x", &bytes(100, 2));
    assert!(second > first);
    w.run(2);
    // The first source was retired, but the child still maps the first lease.
    assert_eq!(w.live_leases(N1), 2);
    assert_eq!(w.host(N1).sources().count(), 1);
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    w.expect(a, |e| matches!(e, ChildEvent::Released { .. }));
    assert_eq!(
        w.live_leases(N1),
        1,
        "the replaced lease is freed once released"
    );
    let (read, _) = w.read(a, 3, "/data/x").unwrap();
    assert_eq!(read, bytes(100, 2));
}

#[test]
fn the_host_declares_its_finished_operations_done_and_the_directory_forgets_them() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    for op in 1..=5 {
        w.write(a, op, &format!("/data/x{op}"), &bytes(64, op as u8));
    }
    // An exclusive write reserves first: the reservation's record is pinned while it is held,
    // and goes once the Register consumed it.
    let view = w.open_write(a, 6, "/data/y", 64, true);
    w.fill_and_seal(a, &view, &bytes(64, 6));
    w.send(a, ChildRequest::Seal { op: ChildOp(6) });
    w.expect(a, |e| matches!(e, ChildEvent::Published { .. }));
    w.run(3);
    let issuer = w.host(N1).issuer();
    let horizon = w.host(N1).operation_horizon();
    let durable = w.dir().durable();
    assert_eq!(
        durable.horizon(issuer),
        horizon,
        "the host declared everything it finished"
    );
    assert_eq!(
        durable.issuer(issuer).map_or(0, |row| row.records),
        0,
        "the directory remembers none of the host's finished operations"
    );
    // A publication in flight holds the horizon at its operation until it is answered.
    w.blackhole(|f| {
        matches!(&f.message, Message::Call(c)
            if matches!(&c.request, DirectoryRequest::Register { path, .. } if path.as_str() == "/data/z"))
    });
    let view = w.open_write(a, 7, "/data/z", 64, false);
    w.fill_and_seal(a, &view, &bytes(64, 7));
    w.send(a, ChildRequest::Seal { op: ChildOp(7) });
    w.run(3);
    assert!(w.host(N1).operation_horizon() > horizon);
    let held = w.host(N1).operation_horizon();
    assert!(
        w.take(a)
            .iter()
            .all(|e| !matches!(e, ChildEvent::Published { .. }))
    );
    for op in 8..=9 {
        w.write(a, op, &format!("/data/w{op}"), &bytes(64, op as u8));
    }
    w.run(3);
    assert_eq!(
        w.host(N1).operation_horizon(),
        held,
        "stuck behind the Register"
    );
    assert_eq!(w.dir().durable().horizon(issuer), held);
    w.heal();
    w.run(100);
    w.expect(a, |e| matches!(e, ChildEvent::Published { .. }));
    w.run(3);
    assert!(w.dir().durable().horizon(issuer) > held);
    assert_eq!(
        w.dir()
            .durable()
            .issuer(issuer)
            .map_or(0, |row| row.records),
        0
    );
}

#[test]
fn abort_after_publication_unbinds_the_path() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/data/x", &bytes(64, 3));
    w.send(a, ChildRequest::Abort { op: ChildOp(1) });
    w.run(2);
    w.expect(a, |e| matches!(e, ChildEvent::Aborted { .. }));
    assert!(
        matches!(w.resolve("/data/x"), ReplyBody::Resolved(Err(_))),
        "S36: aborted means absent"
    );
    assert_eq!(w.live_leases(N1), 1, "the child still maps it");
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    w.expect(a, |e| matches!(e, ChildEvent::Released { .. }));
    assert_eq!(w.live_leases(N1), 0);
    assert_eq!(w.host(N1).bindings().count(), 0);
}

#[test]
fn abort_after_a_replacement_does_not_unbind_the_newer_write() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/data/x", &bytes(8, 1));
    // Hold the first write's Retire, so its binding still thinks it is published.
    w.blackhole(|f| matches!(f.message, Message::Retire { .. }));
    let second = w.write(a, 2, "/data/x", &bytes(8, 2));
    w.send(a, ChildRequest::Abort { op: ChildOp(1) });
    w.run(2);
    w.heal();
    w.run(5);
    // Q19: the unregister named the first revision; the second stays bound, and the child
    // hears that its write was no longer at the path.
    match w.resolve("/data/x") {
        ReplyBody::Resolved(Ok(binding)) => assert_eq!(binding.revision, second),
        other => panic!("{other:?}"),
    }
    let event = w.expect(a, |e| {
        matches!(e, ChildEvent::Aborted { .. } | ChildEvent::Failed { .. })
    });
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                error: DataPlaneError::PathReplaced(_),
                ..
            }
        ),
        "{event:?}"
    );
    // The replaced write's lease goes once the child lets go (its source was retired).
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    assert_eq!(w.live_leases(N1), 1);
}

#[test]
fn a_corrupted_seal_is_never_published() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/x", 100, false);
    w.fill_and_seal(a, &view, &bytes(100, 1));
    // The child changes the payload after sealing: the digest no longer matches.
    let payload = (view.offset + BLOB_HEADER_BYTES) as usize;
    w.cluster.nodes[N1].mem[payload] ^= 0xff;
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    let event = w.expect(a, |_| true);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                error: DataPlaneError::Blob(BlobFailure::Digest),
                ..
            }
        ),
        "{event:?}"
    );
    assert!(matches!(w.resolve("/data/x"), ReplyBody::Resolved(Err(_))));
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    assert_eq!(w.live_leases(N1), 0);
}

#[test]
fn lost_and_duplicated_chunks_still_deliver_the_exact_bytes() {
    let mut w = World::with(2, Duration::from_secs(10), |mut c| {
        c.chunk_bytes = 4096;
        c
    });
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    let content = bytes(100_000, 9);
    w.write(a, 1, "/data/x", &content);
    let counter = std::cell::Cell::new(0u32);
    let counter = std::rc::Rc::new(counter);
    let c2 = counter.clone();
    w.blackhole(move |f| {
        matches!(
            f.message,
            Message::Chunk { .. } | Message::ChunkRequest { .. }
        ) && {
            c2.set(c2.get() + 1);
            c2.get().is_multiple_of(3)
        }
    });
    w.duplicate(|f| matches!(f.message, Message::Chunk { .. }));
    let (read, _) = w.read(b, 1, "/data/x").unwrap();
    assert_eq!(read, content);
    assert!(counter.get() > 20);
}

#[test]
fn a_source_that_restarted_fails_the_read_blob_lost_instead_of_hanging() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.write(a, 1, "/data/x", &bytes(1000, 1));
    // Hold the directory's view of the restart back, so the resolve still names the old source:
    // the restarted host refuses the chunk requests for its dead source, and says why.
    w.blackhole(|f| matches!(f.message, Message::AddressGone { .. }));
    w.restart_node(N1);
    assert!(matches!(w.resolve("/data/x"), ReplyBody::Resolved(Ok(_))));
    let error = w.read(b, 1, "/data/x").unwrap_err();
    assert_eq!(
        error,
        DataPlaneError::BlobLost(DataPath::new("/data/x").unwrap())
    );
    assert_eq!(w.live_leases(N2), 0);
}

#[test]
fn once_the_directory_knows_the_node_restarted_its_blobs_are_lost_everywhere() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    let revision = w.write(a, 1, "/data/x", &bytes(1000, 1));
    let kept = w.write(b, 1, "/data/y", &bytes(10, 2));
    w.restart_node(N1);
    let x = DataPath::new("/data/x").unwrap();
    // The directory answers for the dead node's blob itself; B's own blob is untouched.
    assert_eq!(
        w.resolve("/data/x"),
        ReplyBody::Resolved(Err(NamespaceError::BlobLost(x.clone())))
    );
    assert!(matches!(w.resolve("/data/y"), ReplyBody::Resolved(Ok(_))));
    // A read fails at once, without a lease or a transfer.
    w.open_read(b, 2, "/data/x");
    w.run(1);
    let error = w.read_outcome(b).unwrap_err();
    assert_eq!(error, DataPlaneError::BlobLost(x));
    assert_eq!(w.live_leases(N2), 1, "only B's own published blob");
    // A stat describes the lost blob instead of failing.
    w.send(
        b,
        ChildRequest::Stat {
            op: ChildOp(3),
            path: "/data/x".into(),
        },
    );
    w.run(1);
    assert_eq!(
        w.expect(b, |_| true),
        ChildEvent::Stat {
            op: ChildOp(3),
            kind: dataplane_core::wire::EntryKind::Blob,
            revision,
            length: None,
            lost: true,
        }
    );
    w.send(
        b,
        ChildRequest::Stat {
            op: ChildOp(4),
            path: "/data/y".into(),
        },
    );
    w.run(1);
    assert_eq!(
        w.expect(b, |_| true),
        ChildEvent::Stat {
            op: ChildOp(4),
            kind: dataplane_core::wire::EntryKind::Blob,
            revision: kept,
            length: Some(10),
            lost: false,
        }
    );
    // Writing the path again binds it anew, and it reads everywhere.
    let c = w.child(N1);
    w.attach(c);
    let fresh = bytes(300, 3);
    w.write(c, 1, "/data/x", &fresh);
    let (read, _) = w.read(b, 5, "/data/x").unwrap();
    assert_eq!(read, fresh);
    w.check();
}

#[test]
fn a_retired_source_of_a_live_node_is_a_source_failure_not_a_loss() {
    // A read whose source was retired under it (the path was written again): the bytes of the
    // new blob exist, so the read fails with a transient SourceFailure (a retry finds them).
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.write(a, 1, "/data/x", &bytes(1000, 1));
    let source = w.host(N1).sources().next().map(|(_, s)| s.address).unwrap();
    let mut out = Outbox::new();
    let node = &mut w.cluster.nodes[N1];
    let request = Message::ChunkRequest {
        offset: 0,
        len: 1,
        reply_to: INSPECTOR,
    };
    let unknown = Address::new(source.node, source.incarnation, source.actor + 1_000);
    node.host
        .handle_message(
            w.cluster.now,
            b,
            unknown,
            request.clone(),
            &mut node.mem,
            &mut out,
        )
        .unwrap();
    assert!(
        matches!(
            out.effects(),
            [Effect::Send {
                message: Message::ChunkRefused {
                    reason: dataplane_core::wire::ChunkRefusal::Retired
                },
                ..
            }]
        ),
        "{:?}",
        out.effects()
    );
    let earlier = Address::new(source.node, source.incarnation - 1, source.actor);
    let mut out = Outbox::new();
    node.host
        .handle_message(w.cluster.now, b, earlier, request, &mut node.mem, &mut out)
        .unwrap();
    assert!(
        matches!(
            out.effects(),
            [Effect::Send {
                message: Message::ChunkRefused {
                    reason: dataplane_core::wire::ChunkRefusal::IncarnationEnded
                },
                ..
            }]
        ),
        "{:?}",
        out.effects()
    );
}

#[test]
fn a_silent_source_fails_the_read_within_its_deadline() {
    let mut w = World::with(2, Duration::from_secs(10), |mut c| {
        c.chunk_timeout = Duration::from_millis(200);
        c.chunk_attempts_max = 10;
        c
    });
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.write(a, 1, "/data/x", &bytes(1000, 1));
    w.blackhole(|f| matches!(f.message, Message::ChunkRequest { .. }));
    w.open_read(b, 1, "/data/x");
    w.run(1);
    assert!(w.take(b).is_empty(), "still trying");
    w.run(3);
    let event = w.expect(b, |_| true);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                error: DataPlaneError::SourceFailure(_),
                ..
            }
        ),
        "{event:?}"
    );
    assert_eq!(w.live_leases(N2), 0, "the filling lease went back");
}

/// A world (proxy deadline 3 s) whose child sealed a write to `/data/x`, with the directory's
/// answers to its Register lost on the way to the proxy: the Register reaches the directory.
fn sealed_with_register_answers_lost() -> (World, Address) {
    let mut w = World::with(1, Duration::from_secs(3), |c| c);
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/x", 10, false);
    w.fill_and_seal(a, &view, &bytes(10, 1));
    w.blackhole(|f| {
        matches!(&f.message, Message::Reply(r) if matches!(r.body, ReplyBody::Registered(_)))
            && f.to.actor == 0
    });
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    (w, a)
}

/// The child hears its write published, at the revision `/data/x` resolves to.
fn expect_published_once(w: &mut World, a: Address) {
    let event = w.expect(a, |_| true);
    let ChildEvent::Published { revision, .. } = event else {
        panic!("{event:?}")
    };
    match w.resolve("/data/x") {
        ReplyBody::Resolved(Ok(binding)) => assert_eq!(binding.revision, revision),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_unknown_publication_outcome_is_driven_to_a_definite_one() {
    // Q20: the proxy times the Register out after it reached the directory; the host asks
    // again with the same op id, and the write ends published exactly once.
    let (mut w, a) = sealed_with_register_answers_lost();
    w.run(8);
    assert!(w.take(a).is_empty(), "no definite answer yet");
    assert_eq!(
        w.live_leases(N1),
        1,
        "the namespace may bind the source: the lease stays"
    );
    w.heal();
    w.run(8);
    expect_published_once(&mut w, a);
}

/// The node's proxy, with no directory discoverable, answers every Register handed to it
/// `DirectoryUnavailable` without dispatching it (as its deadline does).
fn no_directory_for_registers(w: &mut World) {
    w.tamper = Some(Box::new(|f: &mut Frame| {
        if let Message::ProxyCall(call) = &f.message
            && matches!(call.request, DirectoryRequest::Register { .. })
        {
            let reply = dataplane_core::wire::DirectoryReply {
                request_id: call.request_id,
                epoch: dataplane_core::ids::AuthorityEpoch::NONE,
                body: ReplyBody::Registered(Err(NamespaceError::DirectoryUnavailable(
                    dataplane_core::error::Reason::new(
                        "no directory was discoverable before the deadline",
                    ),
                ))),
            };
            *f = Frame {
                from: f.to,
                to: call.reply_to,
                message: Message::Reply(reply),
            };
        }
    }));
}

#[test]
fn a_publication_no_directory_ever_saw_fails_at_the_proxy_deadline() {
    // No attempt of the Register left the proxy: the call did not happen and never will, so
    // the child hears so, the lease goes back, and nothing is published.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/x", 10, false);
    w.fill_and_seal(a, &view, &bytes(10, 1));
    no_directory_for_registers(&mut w);
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    w.run(1);
    let event = w.expect(a, |_| true);
    assert!(
        matches!(
            &event,
            ChildEvent::Failed {
                error: DataPlaneError::Namespace(NamespaceError::DirectoryUnavailable(_)),
                ..
            }
        ),
        "{event:?}"
    );
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    w.run(1);
    assert_eq!(w.live_leases(N1), 0, "the lease went back");
    w.tamper = None;
    assert!(
        matches!(
            w.resolve("/data/x"),
            ReplyBody::Resolved(Err(NamespaceError::PathNotFound(_)))
        ),
        "nothing was published"
    );
}

#[test]
fn a_publication_that_may_have_reached_the_directory_is_not_given_up_for_unavailable() {
    // The first Register reaches the directory and its answer is lost (the proxy answers
    // Timeout); later attempts find no directory. The outcome is unknown: the host keeps the
    // lease and asks again until a directory answers.
    let (mut w, a) = sealed_with_register_answers_lost();
    // Past the proxy's deadline: it answers Timeout (a directory was discoverable).
    w.run(5);
    assert!(w.take(a).is_empty(), "no definite answer yet");
    w.heal();
    // From now on no directory answers: what the proxy still holds times out, and every new
    // attempt is answered DirectoryUnavailable, for as long as it takes.
    w.blackhole(|f| matches!(&f.message, Message::Call(_)));
    no_directory_for_registers(&mut w);
    w.run(200);
    let events = w.take(a);
    assert!(events.is_empty(), "no definite answer yet: {events:?}");
    assert_eq!(
        w.live_leases(N1),
        1,
        "the namespace binds the source: the lease stays"
    );
    w.tamper = None;
    w.heal();
    w.run(200);
    expect_published_once(&mut w, a);
}

#[test]
fn a_proxy_restart_loses_nothing() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/x", 10, false);
    w.fill_and_seal(a, &view, &bytes(10, 1));
    // The Register never reaches the directory; the proxy then restarts.
    w.blackhole(|f| matches!(&f.message, Message::Call(_)));
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    w.heal();
    w.restart_proxy(N1);
    w.run(3);
    w.expect(a, |e| matches!(e, ChildEvent::Published { .. }));
}

#[test]
fn a_full_arena_queues_and_a_cancelled_request_leaves_the_queue() {
    let mut w = World::with(1, Duration::from_secs(10), |mut c| {
        c.arena_size = 64 * 1024;
        c
    });
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/big", 40 * 1024, false);
    w.send(
        a,
        ChildRequest::OpenWrite {
            op: ChildOp(2),
            path: "/data/y".into(),
            length: 40 * 1024,
            digest: DigestKind::None,
            exclusive: false,
        },
    );
    assert!(w.take(a).is_empty(), "queued");
    w.send(a, ChildRequest::Cancel { op: ChildOp(2) });
    w.expect(a, |e| {
        matches!(
            e,
            ChildEvent::Failed {
                error: DataPlaneError::OperationCancelled,
                ..
            }
        )
    });
    assert_eq!(w.host(N1).arena().queued_count(), 0, "Q25");
    w.send(
        a,
        ChildRequest::OpenWrite {
            op: ChildOp(3),
            path: "/data/z".into(),
            length: 40 * 1024,
            digest: DigestKind::None,
            exclusive: false,
        },
    );
    assert!(w.take(a).is_empty(), "queued");
    w.send(a, ChildRequest::Abort { op: ChildOp(1) });
    let _ = view;
    w.expect(a, |e| matches!(e, ChildEvent::Aborted { op: ChildOp(1) }));
    // The child may still map the aborted lease: the waiting write is granted only after the
    // child lets go of it.
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    let events = w.take(a);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ChildEvent::Released { op: ChildOp(1) })),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ChildEvent::WriteGranted { op: ChildOp(3), .. })),
        "{events:?}"
    );
}

#[test]
fn an_expected_revision_that_moved_on_fails_path_replaced() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let first = w.write(a, 1, "/data/x", &bytes(10, 1));
    w.write(a, 2, "/data/x", &bytes(10, 2));
    w.send(
        a,
        ChildRequest::OpenRead {
            op: ChildOp(3),
            path: "/data/x".into(),
            expected_revision: Some(first),
        },
    );
    w.run(2);
    let event = w.expect(a, |_| true);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                error: DataPlaneError::PathReplaced(_),
                ..
            }
        ),
        "{event:?}"
    );
}

#[test]
fn a_published_write_outlives_its_session() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.write(a, 1, "/data/x", &bytes(500, 4));
    let view = w.open_write(a, 2, "/data/unsealed", 10, false);
    let _ = view;
    w.send(a, ChildRequest::Close);
    w.expect(a, |e| matches!(e, ChildEvent::Closed));
    assert_eq!(
        w.live_leases(N1),
        1,
        "the unsealed write went, the published one stays"
    );
    let (read, _) = w.read(b, 1, "/data/x").unwrap();
    assert_eq!(read, bytes(500, 4));
    // Replacing it retires the source, and nobody holds the lease any more.
    w.write(b, 2, "/data/x", &bytes(5, 5));
    w.run(2);
    assert_eq!(w.live_leases(N1), 0, "L10");
    assert_eq!(w.host(N1).bindings().count(), 0);
}

#[test]
fn retire_is_answered_after_the_source_is_gone() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/data/x", &bytes(5, 1));
    w.write(a, 2, "/data/x", &bytes(5, 2));
    w.run(2);
    let retired_source = w
        .host(N1)
        .bindings()
        .find(|(_, b)| b.op == ChildOp(1))
        .map(|(_, b)| b.address);
    assert!(retired_source.is_some());
    // The directory's tombstone cleared: SourceRetired reached it.
    assert!(
        w.dir().durable().obligation_count() == 0,
        "retirement obligations left"
    );
    // A late Retire for a source that is gone is still acknowledged.
    let ghost = Address::new(NodeId(1), 1, 55_555);
    w.wire(Frame {
        from: DIRECTORY,
        to: ghost,
        message: Message::Retire {
            reply_to: INSPECTOR,
        },
    });
    w.settle();
}

#[test]
fn a_write_replaced_before_its_publication_reply_is_published_then_freed() {
    let mut w = World::with(2, Duration::from_secs(3), |c| c);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    let view = w.open_write(a, 1, "/data/x", 10, false);
    w.fill_and_seal(a, &view, &bytes(10, 1));
    // A's Register commits, but its reply is lost on the way to N1's proxy.
    let n1_proxy = Address::new(NodeId(1), 1, 0);
    w.blackhole(move |f| {
        f.to == n1_proxy
            && matches!(&f.message, Message::Reply(r) if matches!(r.body, ReplyBody::Registered(_)))
    });
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    // B replaces it; the directory retires A's source, which A's host acknowledges.
    let newer = w.write(b, 1, "/data/x", &bytes(10, 2));
    w.run(1);
    assert_eq!(w.dir().durable().obligation_count(), 0);
    w.heal();
    w.run(8);
    // The re-driven Register replays its first outcome: A was published (and replaced).
    let event = w.expect(a, |_| true);
    assert!(matches!(event, ChildEvent::Published { .. }), "{event:?}");
    match w.resolve("/data/x") {
        ReplyBody::Resolved(Ok(binding)) => assert_eq!(binding.revision, newer),
        other => panic!("{other:?}"),
    }
    assert_eq!(w.live_leases(N1), 1, "the child still maps it");
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    assert_eq!(w.live_leases(N1), 0);
    assert_eq!(w.host(N1).bindings().count(), 0);
}

#[test]
fn closing_a_session_ends_reads_in_flight_and_frees_their_leases() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.write(a, 1, "/data/x", &bytes(200_000, 1));
    // B's read is stuck mid-transfer (chunks are lost), then B closes.
    w.blackhole(|f| matches!(f.message, Message::Chunk { .. }));
    w.open_read(b, 1, "/data/x");
    w.run(1);
    assert_eq!(w.live_leases(N2), 1, "the filling lease");
    w.send(b, ChildRequest::Close);
    w.expect(b, |e| matches!(e, ChildEvent::Closed));
    assert_eq!(w.live_leases(N2), 0);
    assert_eq!(w.host(N2).bindings().count(), 0);
    // Late chunks for the finished transfer are ignored.
    w.heal();
    w.run(2);
    assert_eq!(w.live_leases(N2), 0);
}

#[test]
fn closing_a_session_ends_a_granted_read_it_never_released() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    let content = bytes(200_000, 3);
    w.write(a, 1, "/data/x", &content);
    let (read, _) = w.read(b, 1, "/data/x").unwrap();
    assert_eq!(read, content);
    assert_eq!(w.live_leases(N2), 1, "the granted read's lease");
    // The child goes away holding the view: the session closes, and the lease is freed.
    w.send(b, ChildRequest::Close);
    w.expect(b, |e| matches!(e, ChildEvent::Closed));
    assert_eq!(w.live_leases(N2), 0);
    assert_eq!(w.host(N2).bindings().count(), 0);
    // The writer's blob is untouched: a new session on B reads it again.
    let c = w.child(N2);
    w.attach(c);
    let (again, _) = w.read(c, 1, "/data/x").unwrap();
    assert_eq!(again, content);
}

#[test]
fn frames_from_a_stranger_or_for_the_wrong_actor_change_nothing() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/data/x", &bytes(10, 1));
    let session = w.children[&a].session;
    let before = format!("{:?}", w.host(N1).bindings().collect::<Vec<_>>());
    let mut out = Outbox::new();
    let node = &mut w.cluster.nodes[N1];
    // A chunk for a session, a child frame for a binding, a frame for another node.
    let chunk = Message::ChunkRefused {
        reason: dataplane_core::wire::ChunkRefusal::Retired,
    };
    assert!(
        node.host
            .handle_message(w.cluster.now, a, session, chunk, &mut node.mem, &mut out)
            .is_err()
    );
    let binding = node.host.bindings().next().map(|(_, b)| b.address).unwrap();
    let request = Message::FromChild(ChildRequest::Close);
    assert!(
        node.host
            .handle_message(w.cluster.now, a, binding, request, &mut node.mem, &mut out)
            .is_err()
    );
    let elsewhere = Address::new(NodeId(7), 1, 10_000);
    let request = Message::FromChild(ChildRequest::Close);
    assert!(
        node.host
            .handle_message(
                w.cluster.now,
                a,
                elsewhere,
                request,
                &mut node.mem,
                &mut out
            )
            .is_err()
    );
    // A chunk request out of range is refused by the source.
    let source = node.host.sources().next().map(|(_, s)| s.address).unwrap();
    let request = Message::ChunkRequest {
        offset: 5,
        len: 6,
        reply_to: INSPECTOR,
    };
    node.host
        .handle_message(w.cluster.now, a, source, request, &mut node.mem, &mut out)
        .unwrap();
    assert!(
        matches!(
            out.effects(),
            [Effect::Send {
                message: Message::ChunkRefused {
                    reason: dataplane_core::wire::ChunkRefusal::OutOfRange
                },
                ..
            }]
        ),
        "{:?}",
        out.effects()
    );
    assert_eq!(
        before,
        format!("{:?}", w.host(N1).bindings().collect::<Vec<_>>())
    );
}

#[test]
fn a_cancelled_reserve_is_released_even_if_the_proxy_restarts() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    // The reserve is applied, but its answer is lost; the child gives up; every retraction
    // is lost too, and then the proxy restarts, forgetting what it was asked to retract.
    w.blackhole(
        |f| matches!(&f.message, Message::Reply(r) if matches!(r.body, ReplyBody::BlobReserved(_))),
    );
    w.send(
        a,
        ChildRequest::OpenWrite {
            op: ChildOp(1),
            path: "/data/x".into(),
            length: 4,
            digest: DigestKind::None,
            exclusive: true,
        },
    );
    assert_eq!(w.dir().durable().reservation_count(), 1);
    w.heal();
    w.blackhole(|f| matches!(&f.message, Message::Call(c) if matches!(c.request, DirectoryRequest::ReleaseBlobReservation { .. })));
    w.send(a, ChildRequest::Cancel { op: ChildOp(1) });
    w.expect(a, |e| {
        matches!(
            e,
            ChildEvent::Failed {
                error: DataPlaneError::OperationCancelled,
                ..
            }
        )
    });
    w.run(2);
    assert_eq!(w.dir().durable().reservation_count(), 1);
    w.heal();
    w.restart_proxy(N1);
    w.run(3);
    assert_eq!(
        w.dir().durable().reservation_count(),
        0,
        "the host handed the release over and re-sent it"
    );
}

#[test]
fn stat_move_and_remove_on_the_childs_behalf() {
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let revision = w.write(a, 1, "/data/x", &bytes(42, 1));
    w.send(
        a,
        ChildRequest::Stat {
            op: ChildOp(2),
            path: "/data/x".into(),
        },
    );
    w.run(1);
    let event = w.expect(a, |_| true);
    assert_eq!(
        event,
        ChildEvent::Stat {
            op: ChildOp(2),
            kind: dataplane_core::wire::EntryKind::Blob,
            revision,
            length: Some(42),
            lost: false,
        }
    );
    w.send(
        a,
        ChildRequest::Move {
            op: ChildOp(3),
            from: "/data/x".into(),
            to: "/runs/self/y".into(),
            replace: false,
        },
    );
    w.run(1);
    assert!(matches!(
        w.expect(a, |_| true),
        ChildEvent::Done { op: ChildOp(3), .. }
    ));
    assert!(matches!(
        w.resolve("/runs/r1/y"),
        ReplyBody::Resolved(Ok(_))
    ));
    // Unauthorized and missing paths fail with typed errors and leave nothing behind.
    w.send(
        a,
        ChildRequest::Remove {
            op: ChildOp(4),
            path: "/etc/z".into(),
            expected_revision: None,
        },
    );
    assert!(matches!(
        w.expect(a, |_| true),
        ChildEvent::Failed {
            error: DataPlaneError::Unauthorized { .. },
            ..
        }
    ));
    w.send(
        a,
        ChildRequest::Stat {
            op: ChildOp(5),
            path: "/data/x".into(),
        },
    );
    w.run(1);
    assert!(matches!(
        w.expect(a, |_| true),
        ChildEvent::Failed {
            error: DataPlaneError::PathNotFound(_),
            ..
        }
    ));
    w.send(
        a,
        ChildRequest::Remove {
            op: ChildOp(6),
            path: "/runs/self/y".into(),
            expected_revision: None,
        },
    );
    w.run(2);
    assert!(matches!(
        w.expect(a, |_| true),
        ChildEvent::Done { op: ChildOp(6), .. }
    ));
    assert!(matches!(
        w.resolve("/runs/r1/y"),
        ReplyBody::Resolved(Err(_))
    ));
    // The write's source was retired by the remove: once the child lets go, the lease is free.
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    assert_eq!(w.live_leases(N1), 0);
    assert_eq!(w.host(N1).bindings().count(), 0);
}

#[test]
fn a_chunk_changed_on_the_way_fails_the_read_with_a_digest_error() {
    let mut w = World::with(2, Duration::from_secs(10), |mut c| {
        c.chunk_bytes = 4096;
        c
    });
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.write(a, 1, "/data/x", &bytes(50_000, 3));
    w.tamper = Some(Box::new(|f: &mut Frame| {
        if let Message::Chunk {
            offset: 8192,
            bytes,
            ..
        } = &mut f.message
        {
            let mut changed = bytes.as_slice().to_vec();
            changed[100] ^= 1;
            *bytes = dataplane_core::wire::ChunkBytes::new(changed).unwrap();
        }
    }));
    let error = w.read(b, 1, "/data/x").unwrap_err();
    assert_eq!(error, DataPlaneError::Blob(BlobFailure::Digest));
    assert_eq!(w.live_leases(N2), 0, "the failed read's lease went back");
    // Untouched, the same read succeeds (the digest computed on the way matches).
    w.tamper = None;
    let (read, _) = w.read(b, 2, "/data/x").unwrap();
    assert_eq!(read, bytes(50_000, 3));
}

#[test]
fn a_cancelled_head_of_the_queue_lets_the_requests_behind_it_in_and_waits_are_bounded() {
    let mut w = World::with(1, Duration::from_secs(10), |mut c| {
        c.arena_size = 64 * 1024;
        c.allocation_deadline = Duration::from_secs(5);
        c
    });
    let a = w.child(N1);
    w.attach(a);
    let open = |op: u64, path: &str, length: u64| ChildRequest::OpenWrite {
        op: ChildOp(op),
        path: path.into(),
        length,
        digest: DigestKind::None,
        exclusive: false,
    };
    let _held = w.open_write(a, 1, "/data/big", 40 * 1024, false);
    w.send(a, open(2, "/data/y", 40 * 1024));
    w.send(a, open(3, "/data/small", 8 * 1024));
    assert!(
        w.take(a).is_empty(),
        "both wait: the small one behind the big one (FIFO)"
    );
    w.send(a, ChildRequest::Cancel { op: ChildOp(2) });
    let events = w.take(a);
    assert!(
        events.iter().any(|e| matches!(
            e,
            ChildEvent::Failed {
                op: ChildOp(2),
                error: DataPlaneError::OperationCancelled
            }
        )),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ChildEvent::WriteGranted { op: ChildOp(3), .. })),
        "the small one fits now: {events:?}"
    );
    // A request that can never fit while the child holds what it holds fails after the bound.
    w.send(a, open(4, "/data/z", 40 * 1024));
    w.run(4);
    assert!(w.take(a).is_empty());
    w.run(2);
    let event = w.expect(a, |_| true);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                op: ChildOp(4),
                error: DataPlaneError::ArenaExhausted
            }
        ),
        "{event:?}"
    );
    assert_eq!(w.host(N1).arena().queued_count(), 0);
}

#[test]
fn published_writes_do_not_count_against_operations_in_progress() {
    // Issue 11, item 1: a host once counted its published blobs against its table of
    // operations in progress, so after that many puts every open, stat and read failed for as
    // long as the blobs stayed published.
    let mut w = World::with(1, Duration::from_secs(10), |mut c| {
        c.operations_max = 3;
        c.session_operations_max = 2;
        c
    });
    let a = w.child(N1);
    w.attach(a);
    for op in 1..=12u64 {
        let logical = format!("/data/many/{op}");
        w.write(a, op, &logical, &bytes(16, op as u8));
        w.send(a, ChildRequest::Release { op: ChildOp(op) });
        w.expect(a, |e| matches!(e, ChildEvent::Released { .. }));
    }
    assert_eq!(w.host(N1).operations_in_progress(), 0);
    assert_eq!(
        w.live_leases(N1),
        12,
        "every published write keeps its lease"
    );
    let (payload, _) = w
        .read(a, 100, "/data/many/7")
        .expect("a read after 12 puts");
    assert_eq!(payload, bytes(16, 7));
    w.send(a, ChildRequest::Release { op: ChildOp(100) });
    w.send(
        a,
        ChildRequest::Stat {
            op: ChildOp(101),
            path: "/data/many/12".into(),
        },
    );
    w.expect(a, |e| matches!(e, ChildEvent::Stat { .. }));

    // Operations in progress are bounded per session, then per host, each with its own name.
    let open = |op: u64| ChildRequest::OpenWrite {
        op: ChildOp(op),
        path: format!("/data/wip/{op}"),
        length: 8,
        digest: DigestKind::None,
        exclusive: false,
    };
    w.send(a, open(200));
    w.send(a, open(201));
    w.take(a);
    w.send(a, open(202));
    let event = w.expect(a, |_| true);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                op: ChildOp(202),
                error: DataPlaneError::LimitReached(Limit::SessionOperations)
            }
        ),
        "{event:?}"
    );
    let b = w.child(N1);
    w.attach(b);
    w.send(b, open(1));
    w.take(b);
    w.send(b, open(2));
    let event = w.expect(b, |_| true);
    assert!(
        matches!(
            event,
            ChildEvent::Failed {
                op: ChildOp(2),
                error: DataPlaneError::LimitReached(Limit::HostOperations)
            }
        ),
        "{event:?}"
    );
    // Finishing one makes room again.
    w.send(a, ChildRequest::Release { op: ChildOp(200) });
    w.take(a);
    w.send(b, open(3));
    w.expect(b, |e| matches!(e, ChildEvent::WriteGranted { .. }));
}

#[test]
fn a_full_proxy_is_asked_again_on_the_tick_not_at_once() {
    // A proxy that is full answers `LimitReached(PendingRequests)` at once. The host must not
    // re-send the Register at once (that spun forever with the full proxy, and a real host's
    // driver never left its local queue); it asks again on its tick, until the proxy has room.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/x", 10, false);
    w.fill_and_seal(a, &view, &bytes(10, 1));
    // The directory is unreachable, and someone fills the proxy.
    w.blackhole(|f| f.to == DIRECTORY);
    fill_proxy(
        &mut w,
        N1,
        dataplane_core::limits::PROXY_PENDING_MAX,
        |_| DirectoryRequest::Resolve {
            path: path("/data/fill"),
        },
    );
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    assert!(w.take(a).is_empty(), "the outcome is not known yet");
    // Count the host's Registers over two seconds of ticks: a few, not a spin.
    let registers = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let counter = registers.clone();
    w.tamper = Some(Box::new(move |f: &mut Frame| {
        if let Message::ProxyCall(call) = &f.message
            && matches!(call.request, DirectoryRequest::Register { .. })
        {
            counter.set(counter.get() + 1);
        }
    }));
    w.run(2);
    let sent = registers.get();
    assert!(
        (1..=25).contains(&sent),
        "{sent} Registers in 2 s with a 100 ms tick"
    );
    // The directory comes back: the proxy drains and the write is published.
    w.tamper = None;
    w.heal();
    w.run(3);
    w.expect(a, |e| matches!(e, ChildEvent::Published { .. }));
    w.inspector.clear();
}

#[test]
fn a_closed_session_is_freed_and_a_refused_attach_creates_none() {
    // Issue 11, item 2: closed sessions stayed in the host's table for its whole life, and a
    // connection that never attached held a session of its own.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/data/kept", &bytes(8, 1));
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    w.send(a, ChildRequest::Close);
    w.expect(a, |e| matches!(e, ChildEvent::Closed));
    assert_eq!(
        w.host(N1).sessions().count(),
        0,
        "the closed session is freed"
    );
    assert_eq!(w.live_leases(N1), 1, "its published write stays");

    // The real nodes' path: a session exists only once its child presented the capability.
    let config = SessionConfig {
        session_generation: 7,
        capability: CAPABILITY,
        job: job(),
    };
    let generation = w.host(N1).config().arena_generation;
    let node = &w.cluster.nodes[N1];
    let child = Address::new(node.id, node.incarnation, 4_000);
    let mut out = Outbox::new();
    let refused = w.cluster.nodes[N1].host.attach_new(
        config.clone(),
        child,
        generation,
        Capability([9; 32]),
        &mut out,
    );
    assert_eq!(refused, Err(AttachmentFailure::CapabilityRejected));
    let refused = w.cluster.nodes[N1].host.attach_new(
        config.clone(),
        child,
        generation + 1,
        CAPABILITY,
        &mut out,
    );
    assert!(matches!(
        refused,
        Err(AttachmentFailure::ArenaGenerationMismatch { .. })
    ));
    assert!(out.take().is_empty(), "a refusal says nothing to the child");
    assert_eq!(
        w.host(N1).sessions().count(),
        0,
        "a refusal creates nothing"
    );
    let session = w.cluster.nodes[N1]
        .host
        .attach_new(config, child, generation, CAPABILITY, &mut out)
        .expect("the right capability attaches");
    assert!(matches!(
        out.take().as_slice(),
        [Effect::Send { to, message: Message::ToChild(ChildEvent::Attached { session_generation: 7 }) }] if *to == child
    ));
    let s = w
        .host(N1)
        .sessions()
        .find(|(_, s)| s.address == session)
        .unwrap()
        .1;
    assert_eq!(s.state, SessionState::Running);
    assert_eq!(s.child, Some(child));
}

#[test]
fn a_remote_blob_is_never_served_from_a_local_source_with_the_same_actor_number() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    let remote = bytes(5_000, 1);
    let local = bytes(5_000, 2);
    w.write(a, 1, "/data/x", &remote);
    w.write(b, 1, "/data/y", &local);
    // Both nodes number their actors from the same base and start at incarnation 1: the
    // two sources differ only by node.
    let source = |body: ReplyBody| match body {
        ReplyBody::Resolved(Ok(binding)) => binding.source,
        other => panic!("{other:?}"),
    };
    let (x, y) = (source(w.resolve("/data/x")), source(w.resolve("/data/y")));
    assert_eq!((x.actor, x.incarnation), (y.actor, y.incarnation));
    assert_ne!(x.node, y.node);
    // A read on N2 of N1's blob is a transfer from N1, never a copy of N2's own source.
    let (read, _) = w.read(b, 2, "/data/x").unwrap();
    assert!(
        read == remote,
        "N2 read other bytes than N1 wrote at /data/x"
    );
}

// =============================================================================================
// File blobs (issue 17)

/// Node `n` has `name` on its disk.
fn put_file(w: &mut World, n: usize, name: &str, contents: Vec<u8>) {
    w.cluster.nodes[n].mem.files.write(name, contents);
}

fn publish_file(w: &mut World, child: Address, op: u64, logical: &str, file: &str) -> ChildEvent {
    let request = ChildRequest::PublishFile {
        op: ChildOp(op),
        path: logical.into(),
        file: file.into(),
    };
    w.send(child, request);
    w.run(2);
    w.expect(child, |e| {
        matches!(e, ChildEvent::Published { .. } | ChildEvent::Failed { .. })
    })
}

#[test]
fn a_file_blob_is_served_from_its_file_to_remote_and_local_readers() {
    let mut w = World::new(2);
    let contents = bytes(300_000, 5);
    put_file(&mut w, N1, "models/w.bin", contents.clone());
    let a = w.child(N1);
    w.attach(a);
    let revision = match publish_file(&mut w, a, 1, "/data/w", "models/w.bin") {
        ChildEvent::Published { revision, .. } => revision,
        other => panic!("publish: {other:?}"),
    };
    // No arena byte holds it: the writer's host leased nothing.
    assert_eq!(w.live_leases(N1), 0);
    let saved = w.cluster.nodes[N1].mem.files.saved().clone();
    assert_eq!(saved.files.len(), 1);
    assert_eq!(saved.files[0].revision, Some(revision));
    let b = w.child(N2);
    w.attach(b);
    assert_eq!(w.read(b, 1, "/data/w"), Ok((contents.clone(), revision)));
    assert_eq!(w.read(a, 2, "/data/w"), Ok((contents, revision)));
}

#[test]
fn a_changed_file_is_never_served() {
    let mut w = World::new(2);
    put_file(&mut w, N1, "f", bytes(100_000, 1));
    let a = w.child(N1);
    w.attach(a);
    assert!(matches!(
        publish_file(&mut w, a, 1, "/data/f", "f"),
        ChildEvent::Published { .. }
    ));
    // Same length, other bytes: only the stamp tells.
    put_file(&mut w, N1, "f", bytes(100_000, 2));
    let b = w.child(N2);
    w.attach(b);
    assert_eq!(
        w.read(b, 1, "/data/f"),
        Err(DataPlaneError::SourceChanged(path("/data/f")))
    );
    w.cluster.nodes[N1].mem.files.remove("f");
    assert_eq!(
        w.read(b, 2, "/data/f"),
        Err(DataPlaneError::SourceChanged(path("/data/f")))
    );
}

#[test]
fn a_file_blob_survives_its_host_restarting() {
    let mut w = World::new(2);
    let contents = bytes(70_000, 9);
    put_file(&mut w, N1, "f", contents.clone());
    let a = w.child(N1);
    w.attach(a);
    let revision = match publish_file(&mut w, a, 1, "/data/f", "f") {
        ChildEvent::Published { revision, .. } => revision,
        other => panic!("publish: {other:?}"),
    };
    // An arena blob of the same host, for contrast.
    w.write(a, 2, "/data/arena", &bytes(10, 3));
    w.restart_node(N1);
    w.run(2);
    let b = w.child(N2);
    w.attach(b);
    assert_eq!(w.read(b, 1, "/data/f"), Ok((contents, revision)));
    assert_eq!(
        w.read(b, 2, "/data/arena"),
        Err(DataPlaneError::BlobLost(path("/data/arena")))
    );
}

#[test]
fn a_replaced_file_blob_is_retired_and_forgotten() {
    let mut w = World::new(2);
    put_file(&mut w, N1, "f", bytes(10, 1));
    let a = w.child(N1);
    w.attach(a);
    assert!(matches!(
        publish_file(&mut w, a, 1, "/data/f", "f"),
        ChildEvent::Published { .. }
    ));
    assert_eq!(w.host(N1).file_blobs().count(), 1);
    w.write(a, 2, "/data/f", &bytes(20, 2));
    w.run(3);
    assert_eq!(w.host(N1).file_blobs().count(), 0);
    assert!(w.cluster.nodes[N1].mem.files.saved().files.is_empty());
}

#[test]
fn a_refused_file_publication_changes_nothing() {
    let mut w = World::new(1);
    put_file(&mut w, N1, "f", bytes(10, 1));
    let a = w.child(N1);
    w.attach(a);
    // No such file; a path outside the job; a name with a NUL.
    for (op, logical, file) in [
        (1, "/data/x", "missing"),
        (2, "/elsewhere/x", "f"),
        (3, "/data/y", "f\0"),
    ] {
        match publish_file(&mut w, a, op, logical, file) {
            ChildEvent::Failed { error, .. } => assert!(
                matches!(
                    error,
                    DataPlaneError::InvalidArgument(_) | DataPlaneError::Unauthorized { .. }
                ),
                "{logical} {file:?}: {error:?}"
            ),
            other => panic!("{logical}: {other:?}"),
        }
    }
    // A disk that cannot record the blob: nothing is registered.
    w.cluster.nodes[N1].mem.files.failing = true;
    match publish_file(&mut w, a, 4, "/data/z", "f") {
        ChildEvent::Failed {
            error: DataPlaneError::SourceFailure(_),
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(w.host(N1).file_blobs().count(), 0);
    for p in ["/data/x", "/data/y", "/data/z"] {
        assert!(matches!(
            w.resolve(p),
            ReplyBody::Resolved(Err(NamespaceError::PathNotFound(_)))
        ));
    }
}

// =============================================================================================
// Streams for programs (issue 17)

fn open_stream(
    w: &mut World,
    child: Address,
    op: u64,
    logical: &str,
    role: StreamRole,
    replace: bool,
) {
    let request = ChildRequest::OpenStream {
        op: ChildOp(op),
        path: logical.into(),
        role,
        descriptor: Descriptor::new(format!("{child}").into_bytes()).unwrap(),
        replace,
        ensure: true,
        expected_revision: None,
    };
    w.send(child, request);
}

fn matched(w: &mut World, child: Address) -> StreamMatch {
    match w.expect(child, |e| {
        matches!(
            e,
            ChildEvent::StreamMatched { .. } | ChildEvent::Failed { .. }
        )
    }) {
        ChildEvent::StreamMatched { matched, .. } => matched,
        other => panic!("{child}: {other:?}"),
    }
}

#[test]
fn children_on_two_hosts_meet_at_a_stream_and_close_it() {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    open_stream(&mut w, a, 1, "/data/s", StreamRole::Source, false);
    w.run(1);
    assert!(w.take(a).is_empty(), "a source waits for its sink");
    open_stream(&mut w, b, 1, "/data/s", StreamRole::Sink, false);
    w.run(1);
    let (ma, mb) = (matched(&mut w, a), matched(&mut w, b));
    assert_eq!(ma, mb);
    assert_eq!(ma.source_descriptor.as_bytes(), format!("{a}").as_bytes());
    assert_eq!(ma.sink_descriptor.as_bytes(), format!("{b}").as_bytes());
    assert_eq!(w.dir().rendezvous_all().count(), 1);
    // A close from either side ends it at the directory.
    w.send(a, ChildRequest::CloseStream { op: ChildOp(1) });
    w.run(1);
    w.expect(a, |e| matches!(e, ChildEvent::StreamClosed { .. }));
    assert_eq!(w.dir().rendezvous_all().count(), 0);
    // Both sessions hold nothing.
    w.send(a, ChildRequest::Close);
    w.expect(a, |e| matches!(e, ChildEvent::Closed));
}

#[test]
fn a_dying_childs_streams_are_retracted_and_closed_on_its_behalf() {
    let mut w = World::new(2);
    let (a, b, c) = (w.child(N1), w.child(N2), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.attach(c);
    // a waits at /data/p; b and c are matched at /data/q.
    open_stream(&mut w, a, 1, "/data/p", StreamRole::Source, false);
    open_stream(&mut w, b, 1, "/data/q", StreamRole::Source, false);
    open_stream(&mut w, c, 1, "/data/q", StreamRole::Sink, false);
    w.run(1);
    matched(&mut w, b);
    matched(&mut w, c);
    assert_eq!(w.dir().rendezvous_all().count(), 2);
    // Both children die (their sessions close, as for a dead process).
    w.send(a, ChildRequest::Close);
    w.send(b, ChildRequest::Close);
    w.run(3);
    assert_eq!(
        w.dir().rendezvous_all().count(),
        0,
        "the waiting open is retracted and the matched stream closed"
    );
    assert_eq!(w.host(N1).bindings().count(), 0);
    // c's side stays until c closes it (a close is not told to the peer: the transport is
    // where a peer learns that the other side went).
    assert_eq!(w.host(N2).bindings().count(), 1);
}

#[test]
fn a_retraction_a_full_proxy_refused_is_handed_over_again() {
    // Seed 1567's class: a child's stream open waits at the directory, the proxy is full when
    // the child goes, so it refuses the host's `CancelStream` at once. The host must offer it
    // again once the proxy has room: a refused retraction that was dropped left the open
    // waiting at the directory for ever.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    open_stream(&mut w, a, 1, "/data/p", StreamRole::Source, false);
    w.run(1);
    assert_eq!(w.dir().rendezvous_all().count(), 1);
    // The directory is unreachable, and someone fills the proxy with retractions of its own.
    fill_proxy_with_retractions(&mut w, N1);
    // The child goes: its waiting open is retracted, and the full proxy refuses that.
    let refusals = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let counter = refusals.clone();
    w.tamper = Some(Box::new(move |f: &mut Frame| {
        if let Message::Reply(r) = &f.message
            && f.to != INSPECTOR
            && matches!(
                r.body,
                ReplyBody::StreamCancelled(Err(NamespaceError::LimitReached(
                    Limit::PendingRequests
                )))
            )
        {
            counter.set(counter.get() + 1);
        }
    }));
    w.send(a, ChildRequest::Close);
    w.run(2);
    assert!(
        (2..=4).contains(&refusals.get()),
        "{} refusals in 2 s: offered again about once a second",
        refusals.get()
    );
    assert_eq!(w.host(N1).handovers_pending(), 1);
    // The directory comes back, the proxy drains, and the next offer is taken.
    w.tamper = None;
    w.heal();
    w.run(3);
    assert_eq!(
        w.dir().rendezvous_all().count(),
        0,
        "the refused retraction was offered again and applied"
    );
    assert_eq!(w.host(N1).handovers_pending(), 0, "answered, so forgotten");
    w.inspector.clear();
}

/// Has the inspector put `count` requests (`request(i)`) in node `n`'s proxy.
fn fill_proxy(w: &mut World, n: usize, count: usize, request: impl Fn(u128) -> DirectoryRequest) {
    let node = &w.cluster.nodes[n];
    let proxy = Address::new(node.id, node.incarnation, 0);
    for i in 0..count as u128 {
        w.deliver(Frame {
            from: INSPECTOR,
            to: proxy,
            message: Message::ProxyCall(DirectoryCall {
                request_id: dataplane_core::ids::RequestId(i as u64 + 1),
                reply_to: INSPECTOR,
                request: request(i),
            }),
        });
    }
}

/// Fills node `n`'s proxy with retractions (a retraction is refused only at twice the
/// table's limit) while the directory is unreachable.
fn fill_proxy_with_retractions(w: &mut World, n: usize) {
    w.blackhole(|f| f.to == DIRECTORY);
    let count = 2 * dataplane_core::limits::PROXY_PENDING_MAX;
    fill_proxy(w, n, count, |i| DirectoryRequest::CancelStream {
        path: path("/data/fill"),
        operation: dataplane_testkit::dir::op(1_000_000 + i),
    });
}

/// Two nodes, and a child on each matched at a stream at `/data/s` (a the source, on N1).
fn matched_across_two_nodes() -> (World, Address) {
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    open_stream(&mut w, a, 1, "/data/s", StreamRole::Source, false);
    open_stream(&mut w, b, 1, "/data/s", StreamRole::Sink, false);
    w.run(1);
    matched(&mut w, a);
    matched(&mut w, b);
    (w, a)
}

#[test]
fn a_close_a_full_proxy_refused_is_handed_over_when_the_child_goes() {
    // The child closes its matched stream; the full proxy refuses the close, which the binding
    // would send again on its tick; the child dies first. The close must still reach the
    // directory (it was dropped with the binding, leaving the rendezvous matched).
    let (mut w, a) = matched_across_two_nodes();
    assert_eq!(w.dir().rendezvous_all().count(), 1);
    fill_proxy_with_retractions(&mut w, N1);
    w.send(a, ChildRequest::CloseStream { op: ChildOp(1) });
    assert!(w.take(a).is_empty(), "the close waits for the tick");
    w.send(a, ChildRequest::Close);
    assert_eq!(w.host(N1).handovers_pending(), 1, "handed over, refused");
    w.heal();
    w.run(3);
    assert_eq!(
        w.dir().rendezvous_all().count(),
        0,
        "the refused close reached the directory"
    );
    assert_eq!(w.host(N1).handovers_pending(), 0);
    w.inspector.clear();
}

#[test]
fn a_close_in_flight_survives_a_proxy_restart_after_its_child_went() {
    // Seed 3535: the child closes its matched stream while no directory answers; the child
    // goes; the proxy restarts before the close got through. The host re-offers it.
    let (mut w, a) = matched_across_two_nodes();
    w.blackhole(|f| f.to == DIRECTORY);
    w.send(a, ChildRequest::CloseStream { op: ChildOp(1) });
    w.send(a, ChildRequest::Close);
    w.run(1);
    w.restart_proxy(N1);
    w.heal();
    w.run(3);
    assert_eq!(
        w.dir().rendezvous_all().count(),
        0,
        "the close reached the directory"
    );
    assert_eq!(w.host(N1).handovers_pending(), 0);
}

#[test]
fn an_open_a_full_proxy_refused_on_its_only_attempt_is_not_retracted() {
    // No proxy ever dispatched it, so there is nothing at the directory to cancel: a
    // retraction per refused open only loaded a proxy that was already full.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.blackhole(|f| f.to == DIRECTORY);
    fill_proxy(
        &mut w,
        N1,
        dataplane_core::limits::PROXY_PENDING_MAX,
        |_| DirectoryRequest::Resolve {
            path: path("/data/fill"),
        },
    );
    let cancels = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let counter = cancels.clone();
    w.tamper = Some(Box::new(move |f: &mut Frame| {
        if let Message::ProxyCall(call) = &f.message
            && matches!(call.request, DirectoryRequest::CancelStream { .. })
        {
            counter.set(counter.get() + 1);
        }
    }));
    open_stream(&mut w, a, 1, "/data/p", StreamRole::Source, false);
    match w.expect(a, is_failed) {
        ChildEvent::Failed {
            error: DataPlaneError::LimitReached(Limit::PendingRequests),
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    w.run(2);
    assert_eq!(cancels.get(), 0, "nothing to retract");
    assert_eq!(w.host(N1).handovers_pending(), 0);
    w.tamper = None;
    w.heal();
    w.run(2);
    w.inspector.clear();
}

#[test]
fn a_replacing_open_displaces_the_matched_stream() {
    let mut w = World::new(2);
    let (a, b, c) = (w.child(N1), w.child(N2), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.attach(c);
    open_stream(&mut w, a, 1, "/data/s", StreamRole::Source, false);
    open_stream(&mut w, b, 1, "/data/s", StreamRole::Sink, false);
    w.run(1);
    matched(&mut w, a);
    matched(&mut w, b);
    // c replaces the source: the old rendezvous is displaced for both its endpoints, and c
    // waits for a new sink.
    open_stream(&mut w, c, 1, "/data/s", StreamRole::Source, true);
    w.run(3);
    w.expect(a, |e| matches!(e, ChildEvent::StreamDisplaced { .. }));
    w.expect(b, |e| matches!(e, ChildEvent::StreamDisplaced { .. }));
    // A cancel ends c's waiting open, and the directory forgets it.
    w.send(c, ChildRequest::Cancel { op: ChildOp(1) });
    w.run(2);
    match w.expect(c, is_failed) {
        ChildEvent::Failed {
            error: DataPlaneError::OperationCancelled,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(w.dir().rendezvous_all().count(), 0);
    // A source may not open where the job may not write.
    open_stream(&mut w, c, 2, "/elsewhere/s", StreamRole::Source, false);
    assert!(matches!(
        w.expect(c, is_failed),
        ChildEvent::Failed {
            error: DataPlaneError::InvalidPath(_) | DataPlaneError::Unauthorized { .. },
            ..
        }
    ));
}

/// Keeps a copy of the first `Register` call of `path` that leaves for the directory.
fn capture_register(
    w: &mut World,
    path: &'static str,
) -> std::rc::Rc<std::cell::RefCell<Option<Frame>>> {
    let captured = std::rc::Rc::new(std::cell::RefCell::new(None));
    let keep = captured.clone();
    w.tamper = Some(Box::new(move |f: &mut Frame| {
        if let Message::Call(call) = &f.message
            && let DirectoryRequest::Register { path: p, .. } = &call.request
            && p.as_str() == path
            && keep.borrow().is_none()
        {
            *keep.borrow_mut() = Some(f.clone());
        }
    }));
    captured
}

#[test]
fn a_publication_refused_for_space_fails_at_once_and_a_late_copy_of_it_changes_nothing() {
    // The directory's disk fills while a write is sealed: its Register is refused `NoSpace`,
    // which left no trace. The host settles it with a retraction the full disk still takes
    // (a release under the Register's op id, which tombstones it), then tells the child
    // `NoSpace`. A copy of the Register that reaches the directory after the disk has room
    // again is refused: nothing is published. A new write meanwhile hears `NoSpace` at once,
    // before any lease, and once a write goes through, writes are taken again.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/x", 10, false);
    w.fill_and_seal(a, &view, &bytes(10, 1));
    let why = dataplane_core::error::Reason::new("no room on /data/dir");
    w.cluster.dir.set_no_space(Some(why.clone()));
    let copy = capture_register(&mut w, "/data/x");
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    w.settle();
    let no_space = DataPlaneError::Namespace(NamespaceError::NoSpace(why));
    let event = w.expect(a, |_| true);
    assert_eq!(
        event,
        ChildEvent::Failed {
            op: ChildOp(1),
            error: no_space.clone(),
        }
    );
    let b = w.child(N1);
    w.attach(b);
    w.send(
        b,
        ChildRequest::OpenWrite {
            op: ChildOp(1),
            path: "/data/y".into(),
            length: 10,
            digest: DigestKind::None,
            exclusive: false,
        },
    );
    w.settle();
    let event = w.expect(b, |_| true);
    assert_eq!(
        event,
        ChildEvent::Failed {
            op: ChildOp(1),
            error: no_space,
        }
    );
    assert_eq!(w.live_leases(N1), 1, "the refused write took no lease");
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    w.run(1);
    assert_eq!(w.live_leases(N1), 0, "the first write's lease went back");
    // Room again; the late copy of the first Register is refused.
    w.cluster.dir.set_no_space(None);
    w.tamper = None;
    let late = copy
        .borrow_mut()
        .take()
        .expect("the Register went to the directory");
    w.wire(late);
    w.settle();
    assert!(
        matches!(
            w.resolve("/data/x"),
            ReplyBody::Resolved(Err(NamespaceError::PathNotFound(_)))
        ),
        "nothing was published"
    );
    w.run(2);
    let view = w.open_write(b, 2, "/data/y", 10, false);
    w.fill_and_seal(b, &view, &bytes(10, 2));
    w.send(b, ChildRequest::Seal { op: ChildOp(2) });
    w.run(1);
    let event = w.expect(b, |_| true);
    assert!(matches!(event, ChildEvent::Published { .. }), "{event:?}");
}

#[test]
fn a_publication_refused_for_space_whose_copy_was_applied_first_is_published() {
    // The Register is refused `NoSpace`; before the host's retraction reaches the directory,
    // the disk has room again and a copy of the Register is applied. The retraction is then
    // refused as a conflict, the host asks the Register again, and its replay publishes the
    // write: the child hears the outcome that happened.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    let view = w.open_write(a, 1, "/data/x", 10, false);
    w.fill_and_seal(a, &view, &bytes(10, 1));
    w.cluster
        .dir
        .set_no_space(Some(dataplane_core::error::Reason::new("full")));
    let copy = capture_register(&mut w, "/data/x");
    w.blackhole(|f| {
        matches!(&f.message, Message::Call(call)
            if matches!(call.request, DirectoryRequest::ReleaseBlobReservation { .. }))
    });
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    w.run(1);
    assert!(w.take(a).is_empty(), "not settled yet");
    w.cluster.dir.set_no_space(None);
    w.tamper = None;
    let late = copy
        .borrow_mut()
        .take()
        .expect("the Register went to the directory");
    w.wire(late);
    w.settle();
    w.heal();
    w.run(100);
    expect_published_once(&mut w, a);
}

#[test]
fn a_read_whose_source_host_refuses_connections_fails_at_once() {
    // The host holding the blob is gone (its frames go nowhere); a read from another node
    // asks for chunks. When that node's connection to it is refused (nothing listens there),
    // the read fails with SourceFailure at once, not after every chunk attempt (10 s).
    let mut w = World::new(2);
    let (a, b) = (w.child(N1), w.child(N2));
    w.attach(a);
    w.attach(b);
    w.write(a, 1, "/data/x", &bytes(1000, 1));
    let gone = w.cluster.nodes[N1].id;
    w.blackhole(move |f| f.to.node == gone);
    w.open_read(b, 2, "/data/x");
    w.settle();
    assert!(w.take(b).is_empty(), "the read waits for its chunks");
    let mut sent = Vec::new();
    w.cluster.peer_refused(N2, gone, &mut sent);
    w.wire_all(sent);
    w.settle();
    match w.read_outcome(b) {
        Err(DataPlaneError::SourceFailure(reason)) => {
            assert!(
                reason.as_str().contains("refused the connection"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(w.live_leases(N2), 0, "the read's lease went back");
    // A refusal from a node that holds none of its sources changes nothing.
    let c = w.child(N2);
    w.attach(c);
    w.heal();
    w.open_read(c, 3, "/data/x");
    let mut sent = Vec::new();
    w.cluster.peer_refused(N2, NodeId(77), &mut sent);
    w.wire_all(sent);
    w.run(5);
    assert!(w.read_outcome(c).is_ok());
}

#[test]
fn a_move_refused_for_space_fails_at_once_and_a_late_copy_of_it_changes_nothing() {
    // As for a publication: the Rename refused `NoSpace` is settled with a tombstoning
    // release, the child hears `NoSpace`, and a copy of the Rename that reaches the directory
    // once it has room is refused.
    let mut w = World::new(1);
    let a = w.child(N1);
    w.attach(a);
    w.write(a, 1, "/data/a", &bytes(10, 1));
    let why = dataplane_core::error::Reason::new("full");
    w.cluster.dir.set_no_space(Some(why.clone()));
    let captured = std::rc::Rc::new(std::cell::RefCell::new(None));
    let keep = captured.clone();
    w.tamper = Some(Box::new(move |f: &mut Frame| {
        if let Message::Call(call) = &f.message
            && matches!(call.request, DirectoryRequest::Rename { .. })
            && keep.borrow().is_none()
        {
            *keep.borrow_mut() = Some(f.clone());
        }
    }));
    w.send(
        a,
        ChildRequest::Move {
            op: ChildOp(2),
            from: "/data/a".into(),
            to: "/data/b".into(),
            replace: false,
        },
    );
    w.settle();
    let event = w.expect(a, |_| true);
    assert_eq!(
        event,
        ChildEvent::Failed {
            op: ChildOp(2),
            error: DataPlaneError::Namespace(NamespaceError::NoSpace(why)),
        }
    );
    w.cluster.dir.set_no_space(None);
    w.tamper = None;
    let late = captured
        .borrow_mut()
        .take()
        .expect("the Rename went to the directory");
    w.wire(late);
    w.settle();
    assert!(matches!(w.resolve("/data/a"), ReplyBody::Resolved(Ok(_))));
    assert!(matches!(
        w.resolve("/data/b"),
        ReplyBody::Resolved(Err(NamespaceError::PathNotFound(_)))
    ));
}

/// A write granted and never sealed is aborted at the write deadline: the child hears
/// `WriteExpired` and nothing is published; this memory writes in place (the child may still
/// touch the lease), so the lease is freed, and an exclusive write's reservation released,
/// once the child lets go of it. A seal after the deadline publishes nothing.
#[test]
fn an_unsealed_write_expires_at_its_deadline() {
    let mut w = World::with(1, Duration::from_secs(10), |mut c| {
        c.write_deadline = Duration::from_secs(3);
        c
    });
    let a = w.child(N1);
    w.attach(a);
    w.open_write(a, 1, "/data/slow", 100, true);
    assert!(w.dir().durable().reservations().next().is_some());
    w.run(2);
    assert!(w.take(a).is_empty(), "nothing before the deadline");
    w.run(2);
    match w.expect(a, is_failed) {
        ChildEvent::Failed {
            op: ChildOp(1),
            error: DataPlaneError::WriteExpired { after_secs: 3 },
        } => {}
        other => panic!("{other:?}"),
    }
    w.run(1);
    assert_eq!(w.live_leases(N1), 1, "the child may still touch the lease");
    // A late seal publishes nothing; the release frees the lease, and the binding's end
    // releases the reservation.
    // (The header says Aborted: the child library's own seal would refuse; a hostile child
    // sends the seal anyway.)
    w.send(a, ChildRequest::Seal { op: ChildOp(1) });
    w.expect(a, is_failed);
    w.send(a, ChildRequest::Release { op: ChildOp(1) });
    w.expect(a, |e| matches!(e, ChildEvent::Released { .. }));
    assert_eq!(w.live_leases(N1), 0);
    w.run(2);
    assert!(
        w.dir().durable().reservations().next().is_none(),
        "the reservation was released"
    );
    assert!(matches!(
        w.resolve("/data/slow"),
        ReplyBody::Resolved(Err(NamespaceError::PathNotFound(_)))
    ));
    w.check();
}

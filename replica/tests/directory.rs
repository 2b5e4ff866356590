//! The directory on the replicated log, three replicas on an in-memory network the test
//! drives step by step: a reply leaves only once its step's entry is committed; a new leader
//! serves at its term with everything acknowledged before; a replayed mutation answers the
//! same; a partitioned old leader answers nothing.

use std::collections::{BTreeSet, VecDeque};

use dataplane_core::directory::{ActorSources, DirectoryConfig};
use dataplane_core::effect::Effect;
use dataplane_core::ids::{Address, AuthorityEpoch, NodeId, OperationId, RequestId};
use dataplane_core::path::DataPath;
use dataplane_core::time::Instant;
use dataplane_core::wire::{DirectoryCall, DirectoryRequest, Message, ReplyBody, SourceRecovery};
use dataplane_replica::{
    Durable, Kind, NotServing, Replica, ReplicaConfig, ReplicatedDirectory, WireMessage,
};

type Node = ReplicatedDirectory<ActorSources>;

struct Group {
    nodes: Vec<Option<Node>>,
    disks: Vec<Durable>,
    configs: Vec<ReplicaConfig>,
    net: VecDeque<WireMessage>,
    isolated: BTreeSet<u64>,
    now: Instant,
    /// Every directory effect released, by replica.
    released: Vec<(usize, Effect)>,
}

fn directory_address() -> Address {
    Address::new(NodeId(0), 1, 1)
}

fn client() -> Address {
    Address::new(NodeId(7), 1, 100)
}

impl Group {
    fn new() -> Group {
        let configs: Vec<ReplicaConfig> = (1..=3)
            .map(|id| ReplicaConfig {
                id,
                voters: vec![1, 2, 3],
                election_ticks: 10 + 7 * (id as usize - 1),
                heartbeat_ticks: 3,
                snapshot_every: 10_000,
                snapshot_keep: 5_000,
            })
            .collect();
        let mut g = Group {
            nodes: Vec::new(),
            disks: vec![Durable::default(); 3],
            configs,
            net: VecDeque::new(),
            isolated: BTreeSet::new(),
            now: Instant::ZERO,
            released: Vec::new(),
        };
        for i in 0..3 {
            g.nodes.push(None);
            g.start(i);
        }
        g
    }

    fn start(&mut self, i: usize) {
        let replica = Replica::start(&self.configs[i], &self.disks[i]).unwrap();
        self.nodes[i] = Some(ReplicatedDirectory::new(
            replica,
            DirectoryConfig::new(directory_address()),
            ActorSources,
        ));
        self.connected(i);
    }

    /// Replica `i` (re)started: the others' connections to it come up.
    fn connected(&mut self, i: usize) {
        for node in self.nodes.iter_mut().flatten() {
            node.peer_connected(i as u64 + 1);
        }
    }

    /// Starts replica `i` from an empty disk, rejoining the group ([`Replica::start_joining`]).
    fn start_wiped(&mut self, i: usize, joining: bool) {
        self.disks[i] = Durable::default();
        let replica = if joining {
            Replica::start_joining(&self.configs[i], &self.disks[i])
        } else {
            Replica::start(&self.configs[i], &self.disks[i])
        }
        .unwrap();
        self.nodes[i] = Some(ReplicatedDirectory::new(
            replica,
            DirectoryConfig::new(directory_address()),
            ActorSources,
        ));
        self.connected(i);
    }

    fn has(&self, i: usize, path: &str) -> bool {
        self.nodes[i]
            .as_ref()
            .is_some_and(|n| n.committed().entries().any(|(p, _)| p.as_str() == path))
    }

    fn node(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("running")
    }

    /// Rounds and messages until nothing moves.
    fn pump(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                let now = self.now;
                let Some(node) = self.nodes[i].as_mut() else {
                    continue;
                };
                while let Some(ready) = node.ready(now) {
                    moved = true;
                    self.disks[i].write(&ready);
                    self.net.extend(ready.send.iter().cloned());
                    let after = node.persisted(ready);
                    self.net.extend(after);
                }
                for e in node.take_effects() {
                    assert!(!matches!(e, Effect::Persist(_)), "a Persist left: {e:?}");
                    self.released.push((i, e));
                }
            }
            while let Some(m) = self.net.pop_front() {
                moved = true;
                if self.isolated.contains(&m.to) || self.isolated.contains(&m.from) {
                    continue;
                }
                if let Some(node) = self.nodes[m.to as usize - 1].as_mut() {
                    let _ = node.step(m);
                } else if let Some(sender) = self.nodes[m.from as usize - 1].as_mut() {
                    // The transport tells the sender (a broken connection).
                    sender.report_unreachable(m.to);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the group never settled");
    }

    fn ticks(&mut self, n: usize) {
        for _ in 0..n {
            self.now = self
                .now
                .saturating_add(dataplane_core::time::Duration::from_millis(10));
            for node in self.nodes.iter_mut().flatten() {
                node.tick();
            }
            self.pump();
        }
    }

    fn serving(&self) -> Option<usize> {
        let serving: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| {
                !self.isolated.contains(&(i as u64 + 1))
                    && self.nodes[i]
                        .as_ref()
                        .is_some_and(|n| n.serving_epoch().is_some())
            })
            .collect();
        assert!(serving.len() <= 1, "two replicas serve: {serving:?}");
        serving.first().copied()
    }

    fn elect(&mut self) -> usize {
        for _ in 0..200 {
            if let Some(i) = self.serving() {
                return i;
            }
            self.ticks(1);
        }
        panic!("no replica serves after 200 ticks");
    }

    fn replies(&self, node: usize, request: u64) -> Vec<(AuthorityEpoch, ReplyBody)> {
        self.released
            .iter()
            .filter_map(|(i, e)| match e {
                Effect::Send {
                    message: Message::Reply(r),
                    ..
                } if *i == node && r.request_id == RequestId(request) => {
                    Some((r.epoch, r.body.clone()))
                }
                _ => None,
            })
            .collect()
    }
}

fn register(request: u64, path: &str, operation: u128) -> Message {
    let source = Address::new(NodeId(7), 1, 200);
    Message::Call(DirectoryCall {
        request_id: RequestId(request),
        reply_to: client(),
        request: DirectoryRequest::Register {
            path: DataPath::new(path).unwrap(),
            source,
            source_node: NodeId(7),
            length: 10,
            recovery: SourceRecovery::Actor {
                actor: source,
                node: NodeId(7),
                owner: None,
            },
            operation: OperationId((7u128 << 96) | (1u128 << 64) | operation),
            reservation: None,
        },
    })
}

fn resolve(request: u64, path: &str) -> Message {
    Message::Call(DirectoryCall {
        request_id: RequestId(request),
        reply_to: client(),
        request: DirectoryRequest::Resolve {
            path: DataPath::new(path).unwrap(),
        },
    })
}

#[test]
fn a_reply_leaves_only_once_committed_and_a_new_leader_serves_what_was_acknowledged() {
    let mut g = Group::new();
    let leader = g.elect();
    let term = g.node(leader).replica().term();
    assert_eq!(g.node(leader).serving_epoch(), Some(AuthorityEpoch(term)));

    // Followers refuse, naming the leader.
    let follower = (leader + 1) % 3;
    let now = g.now;
    assert_eq!(
        g.node(follower).handle_message(now, register(1, "/a", 1)),
        Err(NotServing::NotLeader(Some(leader as u64 + 1)))
    );

    // The call is taken, but its reply waits for the commit.
    let now = g.now;
    g.node(leader)
        .handle_message(now, register(1, "/a", 1))
        .unwrap();
    for e in g.node(leader).take_effects() {
        assert!(
            !matches!(
                e,
                Effect::Send {
                    message: Message::Reply(_),
                    ..
                }
            ),
            "a reply left before its entry committed: {e:?}"
        );
        g.released.push((leader, e));
    }
    g.pump();
    let replies = g.replies(leader, 1);
    assert_eq!(replies.len(), 1, "{replies:?}");
    let (epoch, body) = replies[0].clone();
    assert_eq!(epoch, AuthorityEpoch(term));
    let ReplyBody::Registered(Ok(receipt)) = body else {
        panic!("{body:?}");
    };
    // Every replica applied it.
    g.ticks(5);
    for i in 0..3 {
        let committed = g.node(i).committed();
        assert!(
            committed.entries().any(|(p, _)| p.as_str() == "/a"),
            "replica {} has not applied the register",
            i + 1
        );
    }

    // The leader crashes; another serves at a higher term, from what was acknowledged.
    g.nodes[leader] = None;
    let next = g.elect();
    assert_ne!(next, leader);
    let next_term = g.node(next).replica().term();
    assert!(next_term > term);
    assert_eq!(
        g.node(next).serving_epoch(),
        Some(AuthorityEpoch(next_term))
    );
    let dir = g.node(next).directory().unwrap();
    assert!(dir.durable().entries().any(|(p, _)| p.as_str() == "/a"));

    // The client's retry of the same operation answers the same.
    let now = g.now;
    g.node(next)
        .handle_message(now, register(2, "/a", 1))
        .unwrap();
    g.pump();
    let replies = g.replies(next, 2);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].0, AuthorityEpoch(next_term));
    assert_eq!(replies[0].1, ReplyBody::Registered(Ok(receipt)));

    // The crashed replica comes back from its disk and catches up as a follower.
    g.start(leader);
    g.ticks(10);
    assert!(g.node(leader).serving_epoch().is_none());
    assert!(
        g.node(leader)
            .committed()
            .entries()
            .any(|(p, _)| p.as_str() == "/a"),
        "the restarted replica did not apply the log again"
    );
}

#[test]
fn a_partitioned_leader_answers_nothing() {
    let mut g = Group::new();
    let old = g.elect();
    let old_id = old as u64 + 1;
    let now = g.now;
    g.node(old)
        .handle_message(now, register(1, "/b", 1))
        .unwrap();
    g.pump();
    assert_eq!(g.replies(old, 1).len(), 1);

    // Cut it off: a read and a write it takes get no answer.
    g.isolated.insert(old_id);
    let now = g.now;
    g.node(old).handle_message(now, resolve(2, "/b")).unwrap();
    g.node(old)
        .handle_message(now, register(3, "/c", 2))
        .unwrap();
    g.pump();
    assert!(
        g.replies(old, 2).is_empty(),
        "a cut-off leader answered a read"
    );
    assert!(
        g.replies(old, 3).is_empty(),
        "a cut-off leader answered a write"
    );

    // The others elect a leader; the old one steps down (check-quorum) and still answered
    // nothing.
    let mut new = None;
    for _ in 0..300 {
        g.ticks(1);
        new = (0..3).find(|&i| i != old && g.nodes[i].as_ref().unwrap().serving_epoch().is_some());
        if new.is_some() && g.node(old).serving_epoch().is_none() {
            break;
        }
    }
    let new = new.expect("the majority elected a leader");
    assert!(
        g.node(old).serving_epoch().is_none(),
        "the cut-off leader still serves"
    );
    assert!(g.replies(old, 2).is_empty() && g.replies(old, 3).is_empty());
    // The new leader never heard of /c.
    let dir = g.node(new).directory().unwrap();
    assert!(!dir.durable().entries().any(|(p, _)| p.as_str() == "/c"));
    assert!(dir.durable().entries().any(|(p, _)| p.as_str() == "/b"));

    // Healed, the old leader follows and applies the same log.
    g.isolated.clear();
    g.ticks(20);
    assert!(g.node(old).serving_epoch().is_none());
    let a: Vec<String> = g
        .node(old)
        .committed()
        .entries()
        .map(|(p, _)| p.to_string())
        .collect();
    let b: Vec<String> = g
        .node(new)
        .committed()
        .entries()
        .map(|(p, _)| p.to_string())
        .collect();
    assert_eq!(a, b);
}

#[test]
fn a_leader_without_its_quorum_refuses_busy_past_the_bound_and_serves_again_after() {
    use dataplane_replica::IN_FLIGHT_MAX;
    let mut g = Group::new();
    let leader = g.elect();
    let id = leader as u64 + 1;
    // Its followers cannot hear it: every write it takes waits for a quorum.
    g.isolated = (1..=3).filter(|&r| r != id).collect();
    let now = g.now;
    let mut taken = 0u64;
    let refused = loop {
        match g.node(leader).handle_message(
            now,
            register(1_000 + taken, "/full", 100 + u128::from(taken)),
        ) {
            Ok(()) => taken += 1,
            Err(e) => break e,
        }
        assert!(taken <= IN_FLIGHT_MAX, "took more than the bound");
        g.pump();
    };
    assert_eq!(refused, NotServing::Busy);
    assert!(taken > 0 && taken <= IN_FLIGHT_MAX, "took {taken}");
    assert!(g.node(leader).stopped().is_none());
    // Healed, its entries commit (or a new leader takes over), and the directory serves again.
    g.isolated.clear();
    g.ticks(40);
    let serving = g.elect();
    let now = g.now;
    g.node(serving)
        .handle_message(now, resolve(9_999, "/full"))
        .unwrap();
    g.pump();
    assert_eq!(g.replies(serving, 9_999).len(), 1);
}

/// A replica that lost its disk forgot its log and its votes. Started plainly, it votes for a
/// replica that lacks an acknowledged entry (the entry is lost); started joining, it votes
/// for nobody until it caught up with a leader, and a leader's heartbeat committing past its
/// empty log does not stop it.
#[test]
fn a_replica_that_lost_its_disk_rejoins_without_voting_until_caught_up() {
    for joining in [false, true] {
        let mut g = Group::new();
        let leader = g.elect();
        let (lagging, wiped) = ((leader + 1) % 3, (leader + 2) % 3);
        // Acknowledged on the leader and `wiped` only.
        g.isolated.insert(lagging as u64 + 1);
        let now = g.now;
        g.node(leader)
            .handle_message(now, register(1, "/acked", 1))
            .unwrap();
        g.pump();
        assert_eq!(
            g.replies(leader, 1).len(),
            1,
            "the register was acknowledged"
        );
        assert!(g.has(wiped, "/acked") && !g.has(lagging, "/acked"));

        // `wiped` loses its disk and restarts; the leader dies before it caught up.
        g.start_wiped(wiped, joining);
        g.nodes[leader] = None;
        g.isolated.clear();
        let mut served = None;
        for _ in 0..400 {
            g.ticks(1);
            if let Some(i) = g.serving() {
                served = Some(i);
                break;
            }
        }
        if !joining {
            // What `start_joining` prevents: an amnesiac vote elects the lagging replica,
            // and the acknowledged register is gone.
            let i = served.expect("the amnesiac replica's vote elects the lagging one");
            assert_eq!(i, lagging);
            assert!(!g.has(i, "/acked"), "the scenario lost nothing");
            continue;
        }
        assert_eq!(
            served, None,
            "a replica serves with a vote of the joining one (it would lack /acked)"
        );
        assert!(g.node(wiped).replica().is_joining());

        // The old leader comes back from its disk: it leads, the joining one catches up.
        g.start(leader);
        let next = g.elect();
        assert_eq!(next, leader, "only the old leader holds /acked");
        g.ticks(20);
        assert!(g.has(wiped, "/acked") && g.has(lagging, "/acked"));
        assert!(
            !g.node(wiped).replica().is_joining(),
            "caught up, it votes again"
        );

        // Wiped again while the leader believes it holds everything: the leader's heartbeat
        // commits past its empty log (the engine would panic), and the leader's probe on the
        // new connection finds it empty: it is sent the log again and catches up.
        g.start_wiped(wiped, true);
        g.ticks(20);
        assert!(g.has(wiped, "/acked"));
        assert!(!g.node(wiped).replica().is_joining());
        assert_eq!(g.serving(), Some(leader));
    }
}

impl Group {
    /// Adds replica `id` (the next slot) as a new, empty replica: it knows no configuration
    /// and learns the group's from the leader's snapshot once a change adds it.
    fn add_new_replica(&mut self, id: u64) {
        assert_eq!(self.nodes.len() as u64 + 1, id);
        self.configs.push(ReplicaConfig {
            id,
            voters: (1..=id).collect(),
            election_ticks: 10 + 7 * (id as usize - 1),
            heartbeat_ticks: 3,
            snapshot_every: 10_000,
            snapshot_keep: 5_000,
        });
        self.disks.push(Durable::default());
        self.nodes.push(None);
        let i = id as usize - 1;
        let replica = Replica::start_joining(&self.configs[i], &self.disks[i]).unwrap();
        self.nodes[i] = Some(ReplicatedDirectory::new(
            replica,
            DirectoryConfig::new(directory_address()),
            ActorSources,
        ));
        self.connected(i);
    }

    /// Registers `path` through whichever replica serves; its reply must come back `Ok`.
    fn register_ok(&mut self, request: u64, path: &str) {
        let leader = self.elect();
        let now = self.now;
        self.node(leader)
            .handle_message(now, register(request, path, u128::from(request)))
            .unwrap();
        self.pump();
        self.ticks(5);
        let replies = self.replies(leader, request);
        assert!(
            matches!(replies.as_slice(), [(_, ReplyBody::Registered(Ok(_)))]),
            "{path}: {replies:?}"
        );
    }

    fn voters_of(&mut self, i: usize) -> Vec<u64> {
        self.node(i).voters()
    }
}

#[test]
fn the_group_grows_from_three_to_five_and_back_to_three_losing_nothing() {
    use dataplane_replica::MemberChange::{AddVoter, RemoveVoter};
    let mut g = Group::new();
    g.elect();
    for n in 0..10 {
        g.register_ok(100 + n, &format!("/m/{n}"));
    }

    // Two new replicas, empty; the serving one adds both (joint consensus, left at once).
    g.add_new_replica(4);
    g.add_new_replica(5);
    let leader = g.elect();
    assert_eq!(
        g.voters_of(3),
        Vec::<u64>::new(),
        "a new replica knows no group"
    );
    g.node(leader)
        .change_replicas(
            &[AddVoter(4), AddVoter(5)],
            &[(4, "10.0.0.4:7100".into()), (5, "10.0.0.5:7100".into())],
        )
        .unwrap();
    // A second change while the first is not applied is refused, and appends nothing.
    let last = g.node(leader).replica().last_index();
    assert!(matches!(
        g.node(leader).change_replicas(&[RemoveVoter(1)], &[]),
        Err(NotServing::Change(_))
    ));
    assert_eq!(g.node(leader).replica().last_index(), last);
    g.pump();
    g.ticks(30);
    for i in 0..5 {
        assert_eq!(g.voters_of(i), vec![1, 2, 3, 4, 5], "replica {}", i + 1);
        assert_eq!(
            g.node(i).addresses().get(&4).map(String::as_str),
            Some("10.0.0.4:7100")
        );
        for n in 0..10 {
            assert!(
                g.has(i, &format!("/m/{n}")),
                "replica {} lacks /m/{n}",
                i + 1
            );
        }
    }
    assert!(
        g.node(3).replica().snapshot_index() > 0,
        "the new replica was not sent a snapshot"
    );

    // Five voters: losing two of the first three leaves a quorum with the new ones, which
    // elect a leader that holds everything.
    for n in 10..15 {
        g.register_ok(100 + n, &format!("/m/{n}"));
    }
    let leader = g.elect();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let down = if leader < 3 {
        vec![leader, others[0]]
    } else {
        others[..2].to_vec()
    };
    for &i in &down {
        g.nodes[i] = None;
    }
    let successor = g.elect();
    assert!(!down.contains(&successor));
    for n in 15..20 {
        g.register_ok(100 + n, &format!("/m/{n}"));
    }
    for &i in &down {
        g.start(i);
    }
    g.ticks(30);

    // Back to three: the two first replicas leave.
    let leader = g.elect();
    g.node(leader)
        .change_replicas(&[RemoveVoter(1), RemoveVoter(2)], &[])
        .unwrap();
    g.pump();
    g.ticks(30);
    for i in 2..5 {
        assert_eq!(g.voters_of(i), vec![3, 4, 5], "replica {}", i + 1);
        assert!(g.node(i).addresses().get(&1).is_none());
    }
    g.nodes[0] = None;
    g.nodes[1] = None;
    let leader = g.elect();
    assert!(leader >= 2);
    for n in 20..25 {
        g.register_ok(100 + n, &format!("/m/{n}"));
    }
    // Three voters: one more may go.
    g.nodes[leader] = None;
    let leader = g.elect();
    for n in 25..30 {
        g.register_ok(100 + n, &format!("/m/{n}"));
    }
    for n in 0..30 {
        assert!(g.has(leader, &format!("/m/{n}")), "/m/{n} was lost");
    }
}

#[test]
fn the_leader_hands_over_to_a_caught_up_voter_and_resigns_when_the_transfer_is_abandoned() {
    let mut g = Group::new();
    let leader = g.elect();
    g.register_ok(1, "/t/before");
    let term = g.node(leader).replica().term();
    let to = (0..3).find(|&i| i != leader).expect("a follower");
    let to_id = to as u64 + 1;

    // Refused: itself, a stranger, and from a replica that does not serve.
    let refused = |e: NotServing| matches!(e, NotServing::Transfer(_));
    let me = leader as u64 + 1;
    assert!(refused(g.node(leader).transfer_leader(me).unwrap_err()));
    assert!(refused(g.node(leader).transfer_leader(9).unwrap_err()));
    assert!(matches!(
        g.node(to).transfer_leader(me),
        Err(NotServing::NotLeader(Some(l))) if l == me
    ));
    // Refused: a voter that lacks entries (cut off while the leader wrote one).
    g.isolated.insert(to_id);
    let now = g.now;
    g.node(leader)
        .handle_message(now, register(2, "/t/while-cut", 2))
        .unwrap();
    g.pump();
    let behind = g.node(leader).transfer_leader(to_id).unwrap_err();
    assert!(
        matches!(&behind, NotServing::Transfer(why) if why.contains("not caught up")),
        "{behind}"
    );
    g.isolated.remove(&to_id);
    g.ticks(5);

    // Handed over: the caught-up voter leads at the next term, and serves.
    g.node(leader).transfer_leader(to_id).unwrap();
    assert_eq!(g.serving(), None, "the old leader stops serving at once");
    g.pump();
    let next = g.elect();
    assert_eq!(next, to);
    assert_eq!(g.node(next).replica().term(), term + 1);
    g.register_ok(3, "/t/after");
    assert!(g.has(leader, "/t/before") && g.has(leader, "/t/after"));

    // Abandoned: the transferee is cut off after the transfer started; once the engine gives
    // it up, the leader resigns, and the group elects a leader at a higher term that serves.
    let old = next;
    let target = (0..3).find(|&i| i != old).expect("a follower");
    let term = g.node(old).replica().term();
    g.node(old).transfer_leader(target as u64 + 1).unwrap();
    g.isolated.insert(target as u64 + 1);
    g.ticks(60);
    assert!(
        g.node(old).replica().term() > term && !g.node(old).replica().transferring(),
        "the leader resigned"
    );
    // The third replica leads at a higher term (the isolated transferee campaigns in vain).
    let serving = g.elect();
    assert!(serving != target && g.node(serving).replica().term() > term);
    g.isolated.clear();
    let serving = g.elect();
    assert!(g.node(serving).replica().term() > term);
    g.register_ok(4, "/t/after-abandoned");
}

/// A joining replica's first word from the leader may be a heartbeat that commits nothing (the
/// leader's progress for it is 0: a new voter, or a leader that restarted). The join ends only
/// once the replica holds the leader's commit, which an append carries.
#[test]
fn a_heartbeat_that_commits_nothing_does_not_end_a_join() {
    let mut g = Group::new();
    let leader = g.elect();
    g.register_ok(1, "/before");
    let wiped = (leader + 1) % 3;
    g.start_wiped(wiped, true);
    let term = g.node(leader).replica().term();
    let leader_commit = g.node(leader).replica().commit();
    assert!(leader_commit > 0);
    let heartbeat = WireMessage {
        kind: Kind::Heartbeat,
        to: wiped as u64 + 1,
        from: leader as u64 + 1,
        term,
        log_term: 0,
        index: 0,
        entries: Vec::new(),
        commit: 0,
        commit_term: 0,
        request_snapshot: 0,
        reject: false,
        reject_hint: 0,
        context: Vec::new(),
        priority: 0,
        snapshot: None,
    };
    let _ = g.node(wiped).step(heartbeat);
    assert!(
        g.node(wiped).replica().is_joining(),
        "a heartbeat committing 0 ended the join of an empty replica"
    );
    // The group runs on: the replica is sent the log and ends its join holding it.
    g.ticks(20);
    assert!(g.has(wiped, "/before"));
    assert!(!g.node(wiped).replica().is_joining());
    assert!(g.node(wiped).replica().commit() >= leader_commit);
}

use super::*;
use crate::membership::Member;
use crate::wire::Message;

const DIRECTORY: Address = Address {
    node: NodeId(0),
    incarnation: 1,
    actor: 0,
};

fn t(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

/// A namespace that names no node.
fn nobody() -> BTreeSet<NodeId> {
    BTreeSet::new()
}

fn bytes(link: &Link) -> Vec<u8> {
    postcard::to_allocvec(link).unwrap()
}

fn directory(key: Option<ClusterKey>) -> DirectoryConns {
    let listener = Listener::new(key, Accepts::HostsAndClients, Duration::from_secs(5), 2, 16);
    DirectoryConns::new(listener, 1 << 40, t(0))
}

fn host_link(key: Option<ClusterKey>, boot_nonce: u64) -> DirectoryLink {
    let who = Who::Host {
        listen: "h1:1".to_owned(),
        boot_nonce,
    };
    DirectoryLink::new(who, key, t(0))
}

/// The frames one side sent on `conn`.
fn sent(out: &[ConnAction], conn: ConnId) -> Vec<Link> {
    out.iter()
        .filter_map(|a| match a {
            ConnAction::Send(c, link) if *c == conn => Some(link.clone()),
            _ => None,
        })
        .collect()
}

/// Runs a host link's handshake with the directory on `conn` to its end; returns what the
/// link heard last and every directory action.
fn handshake(
    dir: &mut DirectoryConns,
    membership: &mut Membership,
    link: &mut DirectoryLink,
    conn: ConnId,
    now: Instant,
) -> (LinkHeard, Vec<ConnAction>) {
    handshake_naming(dir, membership, link, conn, now, &mut nobody)
}

/// [`handshake`] with a directory whose namespace names the nodes `namespace` gives.
fn handshake_naming(
    dir: &mut DirectoryConns,
    membership: &mut Membership,
    link: &mut DirectoryLink,
    conn: ConnId,
    now: Instant,
    namespace: &mut dyn FnMut() -> BTreeSet<NodeId>,
) -> (LinkHeard, Vec<ConnAction>) {
    let (mut to_dir, mut dir_out) = (Vec::new(), Vec::new());
    assert!(link.due(now));
    link.connecting(now, conn);
    dir.accepted(now, conn, [conn as u8; 32], &mut dir_out);
    link.connected(conn, [9; 32], &mut to_dir);
    let mut heard = LinkHeard::Nothing;
    for _ in 0..4 {
        let frames = sent(&to_dir, conn);
        to_dir.clear();
        if frames.is_empty() {
            break;
        }
        let mark = dir_out.len();
        for f in frames {
            dir.frame(
                now,
                conn,
                &bytes(&f),
                membership,
                namespace,
                DIRECTORY,
                AuthorityEpoch(1),
                &mut dir_out,
            );
        }
        for f in sent(&dir_out[mark..], conn) {
            let h = link.frame(now, conn, &bytes(&f), &mut to_dir);
            if heard == LinkHeard::Nothing {
                heard = h;
            }
        }
    }
    (heard, dir_out)
}

/// Asserts that a link heard its welcome as `node` in `incarnation`.
#[track_caller]
fn assert_welcomed(heard: &LinkHeard, node: NodeId, incarnation: u64) {
    assert!(
        matches!(heard, LinkHeard::Welcomed { node: n, incarnation: i, .. } if *n == node && *i == incarnation),
        "{heard:?}"
    );
}

/// Membership's hosts, in listen order.
fn members(membership: &Membership) -> Vec<Member> {
    membership.hosts().map(|(_, m)| *m).collect()
}

#[test]
fn a_host_is_welcomed_after_its_identity_is_durable_and_keeps_it_across_reconnects() {
    let key = ClusterKey::from_secret(b"a cluster secret here").ok();
    let (mut dir, mut membership) = (directory(key), Membership::default());
    let mut link = host_link(key, 77);
    let (heard, out) = handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    let LinkHeard::Welcomed {
        node, incarnation, ..
    } = heard
    else {
        panic!("{heard:?}");
    };
    assert_eq!((node, incarnation), (NodeId(1), 1));
    // The record comes before the welcome.
    let persist = out.iter().position(|a| matches!(a, ConnAction::Persist(_)));
    let welcome = out
        .iter()
        .position(|a| matches!(a, ConnAction::Send(_, Link::Welcome { .. })));
    assert!(persist.unwrap() < welcome.unwrap(), "{out:?}");
    assert_eq!(link.up(), Some(1));
    assert_eq!(dir.conn_of(NodeId(1)), Some(1));
    dir.check_invariants().unwrap();

    // The connection breaks: the link backs off from the start, then reconnects as the same
    // node and incarnation, and nothing is persisted.
    assert_eq!(dir.closed(t(10), 1), Some(NodeId(1)));
    assert_eq!(link.closed(t(10), 1), LinkHeard::Lost);
    assert!(!link.due(t(10)));
    assert_eq!(
        link.next_deadline(),
        Some(t(10).saturating_add(RECONNECT_FIRST))
    );
    let (heard, out) = handshake(&mut dir, &mut membership, &mut link, 2, t(100));
    assert_welcomed(&heard, NodeId(1), 1);
    assert!(
        !out.iter().any(|a| matches!(a, ConnAction::Persist(_))),
        "{out:?}"
    );

    // A restarted process (a new boot nonce) is the same node in a new incarnation.
    let mut restarted = host_link(key, 78);
    let (heard, out) = handshake(&mut dir, &mut membership, &mut restarted, 3, t(200));
    assert_welcomed(&heard, NodeId(1), 2);
    // It replaces the old connection.
    assert!(
        out.contains(&ConnAction::Close(2, Closing::Replaced)),
        "{out:?}"
    );
    assert_eq!(dir.conn_of(NodeId(1)), Some(3));
    dir.check_invariants().unwrap();
    assert_eq!(
        members(&membership),
        vec![Member {
            node: NodeId(1),
            incarnation: 2,
            boot_nonce: 78
        }]
    );
}

#[test]
fn a_wrong_key_is_never_admitted_and_the_host_hears_why() {
    let (mut dir, mut membership) = (
        directory(ClusterKey::from_secret(b"the directory's secret").ok()),
        Membership::default(),
    );
    let mut link = host_link(ClusterKey::from_secret(b"another secret entirely").ok(), 1);
    let (heard, out) = handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    // The host finds the directory cannot prove its key: a configuration error. It tells the
    // directory, which refuses it as a wrong key (counted and logged there).
    let refused_as_wrong_key = |out: &[ConnAction], conn: ConnId| {
        out.iter().any(|a| {
            matches!(a, ConnAction::Refuse { conn: c, why: Closing::WrongKey, .. } if *c == conn)
        })
    };
    match &heard {
        LinkHeard::Unproven(why) => assert!(why.contains("not this node's"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        !out.iter().any(|a| matches!(a, ConnAction::Admitted(_))),
        "{out:?}"
    );
    assert!(refused_as_wrong_key(&out, 1), "{out:?}");
    assert!(membership.is_empty());
    // A host without a key does not trust a directory with one, and says why.
    let mut keyless = host_link(None, 2);
    let (heard, out) = handshake(&mut dir, &mut membership, &mut keyless, 2, t(0));
    match &heard {
        LinkHeard::Unproven(why) => assert!(why.contains("this node has none"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        !out.iter().any(|a| matches!(a, ConnAction::Admitted(_))),
        "{out:?}"
    );
    assert!(refused_as_wrong_key(&out, 2), "{out:?}");
    // A connector that proves anyway, without the key, is refused by the directory.
    let mut out = Vec::new();
    let who = Who::Host {
        listen: "h2:1".to_owned(),
        boot_nonce: 3,
    };
    let (_, hello) = Connector::new(who, [5; 32], None);
    dir.accepted(t(0), 3, [6; 32], &mut out);
    dir.frame(
        t(0),
        3,
        &bytes(&hello),
        &mut membership,
        &mut nobody,
        DIRECTORY,
        AuthorityEpoch(1),
        &mut out,
    );
    let heard = dir.frame(
        t(0),
        3,
        &bytes(&Link::Proof { proof: None }),
        &mut membership,
        &mut nobody,
        DIRECTORY,
        AuthorityEpoch(1),
        &mut out,
    );
    assert_eq!(heard, DirHeard::Nothing);
    assert!(
        out.iter().any(|a| matches!(
            a,
            ConnAction::Refuse {
                conn: 3,
                why: Closing::WrongKey,
                ..
            }
        )),
        "{out:?}"
    );
    assert!(membership.is_empty());
    assert_eq!(dir.conn_of(NodeId(1)), None);
    dir.check_invariants().unwrap();
}

#[test]
fn silent_connections_expire_and_the_oldest_makes_room() {
    let mut dir = directory(None);
    let mut out = Vec::new();
    dir.accepted(t(0), 1, [1; 32], &mut out);
    dir.accepted(t(1), 2, [2; 32], &mut out);
    assert!(out.is_empty());
    // The waiting room holds two: the third evicts the oldest.
    dir.accepted(t(2), 3, [3; 32], &mut out);
    assert_eq!(out, vec![ConnAction::Close(1, Closing::Evicted)]);
    out.clear();
    assert_eq!(
        dir.next_deadline(),
        Some(t(1).saturating_add(Duration::from_secs(5)))
    );
    dir.expire(t(5_001), &mut out);
    assert_eq!(out, vec![ConnAction::Close(2, Closing::Expired)]);
    dir.check_invariants().unwrap();
    assert_eq!(dir.listener().pending_count(), 1);
}

#[test]
fn a_connection_that_speaks_for_another_node_is_closed_and_its_node_unroutable() {
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 5);
    handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    let mut out = Vec::new();
    let own = Envelope {
        from: Address::new(NodeId(1), 1, 7),
        to: DIRECTORY,
        message: Message::ProxyCancel {
            reply_to: Address::new(NodeId(1), 1, 7),
        },
    };
    let heard = dir.frame(
        t(0),
        1,
        &bytes(&Link::Frame(own.clone())),
        &mut membership,
        &mut nobody,
        DIRECTORY,
        AuthorityEpoch(1),
        &mut out,
    );
    assert_eq!(heard, DirHeard::Envelope(own));
    let foreign = Envelope {
        from: Address::new(NodeId(2), 1, 7),
        to: DIRECTORY,
        message: Message::ProxyCancel {
            reply_to: Address::new(NodeId(1), 1, 7),
        },
    };
    let heard = dir.frame(
        t(0),
        1,
        &bytes(&Link::Frame(foreign)),
        &mut membership,
        &mut nobody,
        DIRECTORY,
        AuthorityEpoch(1),
        &mut out,
    );
    assert_eq!(
        heard,
        DirHeard::Protocol {
            conn: 1,
            node: NodeId(1)
        }
    );
    assert_eq!(out, vec![ConnAction::Close(1, Closing::Protocol)]);
    assert_eq!(dir.conn_of(NodeId(1)), None);
    dir.check_invariants().unwrap();
}

#[test]
fn a_welcome_for_another_identity_is_closed_and_retried_with_a_growing_backoff() {
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 5);
    handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    // The directory lost its membership: the same host is now someone else.
    let (mut dir, mut membership) = (directory(None), Membership::default());
    membership.admit("somebody:1", 1).unwrap();
    link.closed(t(0), 1);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 2, t(50));
    assert_eq!(
        heard,
        LinkHeard::Misnamed {
            node: NodeId(2),
            incarnation: 1
        }
    );
    assert_eq!(link.up(), None);
    // Each failed attempt doubles the wait, up to the most.
    let mut at = link.next_deadline().unwrap();
    let mut waits = Vec::new();
    for conn in 10..20 {
        link.connecting(at, conn);
        link.closed(at, conn);
        let next = link.next_deadline().unwrap();
        waits.push(next.saturating_since(at));
        at = next;
    }
    assert!(waits.windows(2).all(|w| w[1] >= w[0]), "{waits:?}");
    assert_eq!(*waits.last().unwrap(), RECONNECT_MAX);
    let mut failed = host_link(None, 6);
    failed.connect_failed(t(0));
    assert_eq!(
        failed.next_deadline(),
        Some(t(0).saturating_add(RECONNECT_FIRST))
    );
}

/// A driver that was waiting for an address (a name's lookup) makes the next attempt at
/// once, without losing the back-off it reached; an attempt under way is left alone.
#[test]
fn a_down_link_can_be_made_due_at_once() {
    let mut link = host_link(None, 7);
    for _ in 0..4 {
        link.connect_failed(t(0));
    }
    let waited = link.next_deadline().unwrap();
    assert!(waited > t(50), "{waited:?}");
    assert!(!link.due(t(50)));
    link.retry_now(t(50));
    assert!(link.due(t(50)));
    assert_eq!(link.next_deadline(), Some(t(50)));
    link.retry_now(t(60));
    assert_eq!(link.next_deadline(), Some(t(50)), "never later");
    link.connecting(t(50), 9);
    link.retry_now(t(70));
    assert!(!link.due(t(70)), "an attempt is under way");
    // The back-off the failures reached is kept for the next failure.
    link.closed(t(80), 9);
    let next = link.next_deadline().unwrap();
    assert!(next > t(80).saturating_add(RECONNECT_FIRST), "{next:?}");
}

#[test]
fn frames_for_another_host_wait_for_the_handshake_and_strangers_are_closed() {
    let key = ClusterKey::from_secret(b"a cluster secret here").ok();
    let peers = |me| {
        let listener = Listener::new(key, Accepts::Peers, Duration::from_secs(5), 4, 4);
        PeerLinks::new(NodeId(me), 1, key, listener)
    };
    let (mut a, mut b) = (peers(1), peers(2));
    let frame = |n: u64| {
        Link::Frame(Envelope {
            from: Address::new(NodeId(1), 1, n),
            to: Address::new(NodeId(2), 1, 5),
            message: Message::ProxyCancel {
                reply_to: Address::new(NodeId(1), 1, n),
            },
        })
    };
    let mut out = Vec::new();
    assert_eq!(a.route(t(0), NodeId(2), frame(1), &mut out), Err(frame(1)));
    a.connecting(t(0), NodeId(2), 7, frame(1));
    assert_eq!(
        a.route(t(0), NodeId(2), frame(2), &mut out),
        Ok(Routed::Queued)
    );
    assert!(out.is_empty());
    b.accepted(t(0), 7, [4; 32], &mut out);
    a.connected(7, [3; 32], &mut out);
    let mut delivered = Vec::new();
    for _ in 0..3 {
        let frames: Vec<ConnAction> = std::mem::take(&mut out);
        for action in frames {
            let ConnAction::Send(7, link) = action else {
                continue;
            };
            // Frames from a go to b and back; both sides share conn id 7 here.
            if matches!(link, Link::Challenge { .. }) {
                assert_eq!(
                    a.frame(t(0), 7, &bytes(&link), &mut out),
                    PeerHeard::Nothing
                );
            } else {
                match b.frame(t(0), 7, &bytes(&link), &mut out) {
                    PeerHeard::Envelope(e) => delivered.push(e.from.actor),
                    PeerHeard::Admitted { node, .. } => assert_eq!(node, NodeId(1)),
                    PeerHeard::Nothing => {}
                    other => panic!("{other:?}"),
                }
            }
        }
    }
    assert_eq!(delivered, vec![1, 2]);
    assert_eq!(
        a.route(t(0), NodeId(2), frame(3), &mut out),
        Ok(Routed::Sent)
    );
    // A frame on b's connection from 1 that claims to come from 3 closes it.
    let forged = Link::Frame(Envelope {
        from: Address::new(NodeId(3), 1, 1),
        to: Address::new(NodeId(2), 1, 5),
        message: Message::ProxyCancel {
            reply_to: Address::new(NodeId(1), 1, 7),
        },
    });
    out.clear();
    assert_eq!(
        b.frame(t(0), 7, &bytes(&forged), &mut out),
        PeerHeard::Protocol {
            conn: 7,
            node: NodeId(1)
        }
    );
    assert_eq!(out, vec![ConnAction::Close(7, Closing::Protocol)]);
    assert!(!b.knows(7));
}

#[test]
fn a_connection_that_says_it_is_this_host_is_closed() {
    // Without a key any node id is taken at its word, but not this host's own.
    let peers = |me| {
        let listener = Listener::new(None, Accepts::Peers, Duration::from_secs(5), 4, 4);
        PeerLinks::new(NodeId(me), 1, None, listener)
    };
    for (claimed, admitted) in [(2, false), (1, true)] {
        let (mut a, mut b) = (peers(claimed), peers(2));
        let mut out = Vec::new();
        let first = Link::Frame(Envelope {
            from: Address::new(NodeId(claimed), 1, 1),
            to: Address::new(NodeId(2), 1, 5),
            message: Message::ProxyCancel {
                reply_to: Address::new(NodeId(claimed), 1, 1),
            },
        });
        a.connecting(t(0), NodeId(2), 7, first);
        b.accepted(t(0), 7, [4; 32], &mut out);
        a.connected(7, [3; 32], &mut out);
        let mut heard = Vec::new();
        for _ in 0..3 {
            for action in std::mem::take(&mut out) {
                let ConnAction::Send(7, link) = action else {
                    continue;
                };
                if matches!(link, Link::Challenge { .. }) {
                    a.frame(t(0), 7, &bytes(&link), &mut out);
                } else {
                    heard.push(b.frame(t(0), 7, &bytes(&link), &mut out));
                }
            }
        }
        let closed = PeerHeard::Protocol {
            conn: 7,
            node: NodeId(claimed),
        };
        assert_eq!(
            heard.contains(&closed),
            !admitted,
            "claiming n{claimed}: {heard:?}"
        );
        assert_eq!(b.knows(7), admitted, "claiming n{claimed}");
    }
}

#[test]
fn a_silent_directory_or_host_cannot_hold_a_handshake() {
    use crate::conns::HANDSHAKE_DEADLINE;
    // The directory accepts and then says nothing: the attempt is closed once the silence
    // bound passed without a challenge, and tried again after the back-off.
    let mut link = host_link(None, 6);
    let mut out = Vec::new();
    link.connecting(t(0), 3);
    link.connected(3, [1; 32], &mut out);
    let bound = t(0).saturating_add(SILENCE_DEFAULT);
    assert_eq!(link.next_deadline(), Some(bound));
    out.clear();
    let before = |at: Instant| Instant::from_nanos(at.as_nanos() - 1);
    assert_eq!(link.expire(before(bound), &mut out), LinkExpired::Nothing);
    assert!(out.is_empty());
    assert_eq!(link.expire(bound, &mut out), LinkExpired::Attempt);
    assert_eq!(out, vec![ConnAction::Close(3, Closing::Expired)]);
    assert_eq!(link.conn(), None);
    assert!(link.next_deadline().is_some_and(|retry| retry > bound));
    // Nothing to expire while down.
    out.clear();
    let later = bound.saturating_add(Duration::from_millis(10));
    assert_eq!(link.expire(later, &mut out), LinkExpired::Nothing);
    assert!(out.is_empty());

    // A directory that challenged (it answers) has the whole handshake deadline to welcome.
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 7);
    link.connecting(t(0), 4);
    let mut to_dir = Vec::new();
    dir.accepted(t(0), 4, [9; 32], &mut to_dir);
    link.connected(4, [1; 32], &mut out);
    let hello = sent(&out, 4).remove(0);
    out.clear();
    let mut back = Vec::new();
    dir_frame(&mut dir, &mut membership, 4, &hello, &mut back);
    let challenge = sent(&back, 4).remove(0);
    link.frame(t(10), 4, &bytes(&challenge), &mut out);
    let at = t(0).saturating_add(HANDSHAKE_DEADLINE);
    assert_eq!(link.next_deadline(), Some(at));
    assert_eq!(link.expire(bound, &mut out), LinkExpired::Nothing);
    out.clear();
    assert_eq!(link.expire(at, &mut out), LinkExpired::Attempt);
    assert_eq!(out, vec![ConnAction::Close(4, Closing::Expired)]);

    // Another host accepts and then says nothing: the outgoing connection is closed at the
    // deadline with its backlog, and the next frame starts a new one.
    let just_before = before(at);
    out.clear();
    let listener = Listener::new(None, Accepts::Peers, Duration::from_secs(5), 4, 4);
    let mut a = PeerLinks::new(NodeId(1), 1, None, listener);
    let frame = Link::Frame(Envelope {
        from: Address::new(NodeId(1), 1, 1),
        to: Address::new(NodeId(2), 1, 5),
        message: Message::ProxyCancel {
            reply_to: Address::new(NodeId(1), 1, 1),
        },
    });
    a.connecting(t(0), NodeId(2), 8, frame.clone());
    a.connected(8, [2; 32], &mut out);
    out.clear();
    assert_eq!(
        a.next_deadline(),
        Some(t(0).saturating_add(HANDSHAKE_DEADLINE))
    );
    a.expire(just_before, &mut out);
    assert!(out.is_empty());
    a.expire(at, &mut out);
    assert_eq!(out, vec![ConnAction::Close(8, Closing::Expired)]);
    assert!(!a.knows(8));
    assert_eq!(
        a.route(t(0), NodeId(2), frame.clone(), &mut out),
        Err(frame)
    );
}

/// How an attempt at the directory fails, as a driver reports it.
#[derive(Clone, Copy, Debug)]
enum Fails {
    /// The connection was made, then closed before the `Welcome` (a follower replica).
    Closed,
    /// The driver could not even start the connection.
    ToStart,
    /// The connection was made and the directory said nothing until the deadline.
    Silent,
}

/// Starts `count` attempts of `link`, each when it is due, and fails them `how`; returns the
/// address each went to and the wait (in ms) after it before the next attempt. Connection
/// ids start at `first_conn`.
fn fail_attempts(
    link: &mut DirectoryLink,
    how: Fails,
    count: usize,
    first_conn: ConnId,
) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for conn in first_conn..first_conn + count as u64 {
        let at = link.next_deadline().expect("down: an attempt is due later");
        assert!(link.due(at), "{how:?}: not due at its own deadline");
        let address = link.candidate();
        let failed_at = match how {
            Fails::Closed => {
                link.connecting(at, conn);
                link.connected(conn, [1; 32], &mut out);
                assert_eq!(link.closed(at, conn), LinkHeard::Nothing);
                at
            }
            Fails::ToStart => {
                link.connect_failed(at);
                at
            }
            Fails::Silent => {
                link.connecting(at, conn);
                link.connected(conn, [1; 32], &mut out);
                let deadline = link.next_deadline().expect("a handshake deadline");
                assert_eq!(link.expire(deadline, &mut out), LinkExpired::Attempt);
                deadline
            }
        };
        assert_eq!(
            link.conn(),
            None,
            "{how:?}: the failed attempt is forgotten"
        );
        let wait = link.next_deadline().unwrap().saturating_since(failed_at);
        seen.push((address, wait.as_millis()));
    }
    seen
}

/// The waits of `fail_attempts`, without the addresses.
fn waits(seen: &[(usize, u64)]) -> Vec<u64> {
    seen.iter().map(|(_, wait)| *wait).collect()
}

#[test]
fn one_directory_backs_off_as_it_always_did() {
    // Attempts that fail once connected double the wait first: 100 ms, up to 2 s.
    let mut link = host_link(None, 1);
    let seen = fail_attempts(&mut link, Fails::Closed, 8, 1);
    assert_eq!(waits(&seen), [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    assert!(seen.iter().all(|(address, _)| *address == 0), "{seen:?}");
    // Attempts the driver cannot start wait first, then double: from 50 ms.
    let mut link = host_link(None, 2);
    let seen = fail_attempts(&mut link, Fails::ToStart, 8, 1);
    assert_eq!(waits(&seen), [50, 100, 200, 400, 800, 1600, 2000, 2000]);
    // Silent ones count from their deadline, like closed ones.
    let mut link = host_link(None, 3);
    let seen = fail_attempts(&mut link, Fails::Silent, 3, 1);
    assert_eq!(waits(&seen), [100, 200, 400]);
    // The two kinds share one back-off.
    let mut link = host_link(None, 4);
    let mut seen = fail_attempts(&mut link, Fails::ToStart, 2, 1);
    seen.extend(fail_attempts(&mut link, Fails::Closed, 2, 3));
    assert_eq!(waits(&seen), [50, 100, 400, 800]);

    // A lost link starts over from 50 ms, at the same (only) address.
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 5);
    let _ = fail_attempts(&mut link, Fails::Closed, 5, 1);
    let at = link.next_deadline().unwrap();
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 10, at);
    assert!(matches!(heard, LinkHeard::Welcomed { .. }), "{heard:?}");
    assert_eq!(link.closed(t(10_000), 10), LinkHeard::Lost);
    assert_eq!(link.candidate(), 0);
    assert_eq!(
        link.next_deadline(),
        Some(t(10_000).saturating_add(RECONNECT_FIRST))
    );
    let seen = fail_attempts(&mut link, Fails::Closed, 3, 11);
    assert_eq!(waits(&seen), [100, 200, 400]);
}

#[test]
fn several_directories_are_tried_in_turn_and_back_off_per_round() {
    // Three replicas: moving on to the next costs 50 ms, and the back-off doubles once per
    // round of the three, up to half a second (a group is without a leader for about an
    // election timeout only).
    let mut link = host_link(None, 1).with_candidates(3, 0);
    assert_eq!(link.candidates(), 3);
    let seen = fail_attempts(&mut link, Fails::Closed, 21, 1);
    let addresses: Vec<usize> = seen.iter().map(|(address, _)| *address).collect();
    assert_eq!(addresses, [0, 1, 2].repeat(7));
    assert_eq!(
        waits(&seen),
        [
            50, 50, 100, 50, 50, 200, 50, 50, 400, 50, 50, 500, 50, 50, 500, 50, 50, 500, 50, 50,
            500
        ]
    );
    let mut link = host_link(None, 2).with_candidates(3, 0);
    let seen = fail_attempts(&mut link, Fails::ToStart, 9, 1);
    assert_eq!(waits(&seen), [50, 50, 50, 50, 50, 100, 50, 50, 200]);
    let mut link = host_link(None, 3).with_candidates(3, 0);
    let seen = fail_attempts(&mut link, Fails::Silent, 4, 1);
    assert_eq!(seen, [(0, 50), (1, 50), (2, 100), (0, 50)]);

    // The leader is found at the second address; when it is lost, the next attempt goes to
    // the third, 50 ms later, and a fresh round starts there.
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 4).with_candidates(3, 0);
    let _ = fail_attempts(&mut link, Fails::Closed, 4, 1);
    assert_eq!(link.candidate(), 1);
    let at = link.next_deadline().unwrap();
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 10, at);
    assert!(matches!(heard, LinkHeard::Welcomed { .. }), "{heard:?}");
    assert_eq!(
        link.candidate(),
        1,
        "the welcomed link stays at its address"
    );
    assert_eq!(link.closed(t(10_000), 10), LinkHeard::Lost);
    assert_eq!(link.candidate(), 2);
    assert_eq!(
        link.next_deadline(),
        Some(t(10_000).saturating_add(RECONNECT_FIRST))
    );
    let seen = fail_attempts(&mut link, Fails::Closed, 4, 11);
    assert_eq!(seen, [(2, 50), (0, 50), (1, 100), (2, 50)]);

    // A link welcomed by a blocking handshake at the last address moves on to the first.
    let who = Who::Host {
        listen: "h1:1".to_owned(),
        boot_nonce: 5,
    };
    let mut link = DirectoryLink::welcomed(who, None, 7, NodeId(1), 1, t(0)).with_candidates(3, 2);
    assert_eq!(link.closed(t(0), 7), LinkHeard::Lost);
    assert_eq!(link.candidate(), 0);
    assert_eq!(
        link.next_deadline(),
        Some(t(0).saturating_add(RECONNECT_FIRST))
    );
}

#[test]
#[should_panic(expected = "directory addresses")]
fn a_link_needs_at_least_one_address() {
    let _ = host_link(None, 1).with_candidates(0, 0);
}

/// Seed 7690's schedule one step further: a boot's proof is on its way when the process dies,
/// and the restarted process is admitted before the proof arrives. The dead boot's proof must
/// not make the node restart again (a new incarnation under the live process, whose sources
/// would be retired with the old incarnation's): the admission of the new boot closes the
/// node's other connections still in their handshake.
#[test]
fn a_dead_boots_late_proof_does_not_restart_the_node_again() {
    let key = ClusterKey::from_secret(b"a cluster secret here").ok();
    let (mut dir, mut membership) = (directory(key), Membership::default());
    let mut old = host_link(key, 77);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut old, 1, t(0));
    assert!(matches!(heard, LinkHeard::Welcomed { .. }), "{heard:?}");

    // The connection breaks; the process tries again and is challenged, answers, and dies
    // with its proof still on the way.
    assert_eq!(dir.closed(t(10), 1), Some(NodeId(1)));
    old.closed(t(10), 1);
    let at = old.next_deadline().unwrap();
    let (mut to_dir, mut dir_out) = (Vec::new(), Vec::new());
    old.connecting(at, 2);
    dir.accepted(at, 2, [2; 32], &mut dir_out);
    old.connected(2, [9; 32], &mut to_dir);
    for f in sent(&to_dir, 2) {
        let heard = dir.frame(
            t(0),
            2,
            &bytes(&f),
            &mut membership,
            &mut nobody,
            DIRECTORY,
            AuthorityEpoch(1),
            &mut dir_out,
        );
        assert_eq!(heard, DirHeard::Nothing);
    }
    let mut answer = Vec::new();
    for f in sent(&dir_out, 2) {
        old.frame(at, 2, &bytes(&f), &mut answer);
    }
    let proof = sent(&answer, 2);
    assert_eq!(proof.len(), 1, "{answer:?}");

    // The restarted process is admitted first: the same node, a new incarnation. The dead
    // boot's connection still in its handshake is closed.
    let mut restarted = host_link(key, 78);
    let later = at.saturating_add(Duration::from_millis(50));
    let (heard, out) = handshake(&mut dir, &mut membership, &mut restarted, 3, later);
    assert_welcomed(&heard, NodeId(1), 2);
    assert!(
        out.contains(&ConnAction::Close(2, Closing::Replaced)),
        "{out:?}"
    );

    // The dead boot's proof arrives: nothing is admitted, persisted or replaced.
    let mut out = Vec::new();
    let heard = dir.frame(
        t(0),
        2,
        &bytes(&proof[0]),
        &mut membership,
        &mut nobody,
        DIRECTORY,
        AuthorityEpoch(1),
        &mut out,
    );
    assert_eq!(heard, DirHeard::Nothing, "{out:?}");
    assert!(
        !out.iter().any(|a| matches!(a, ConnAction::Persist(_))),
        "{out:?}"
    );
    assert_eq!(dir.conn_of(NodeId(1)), Some(3));
    assert_eq!(
        members(&membership),
        vec![Member {
            node: NodeId(1),
            incarnation: 2,
            boot_nonce: 78
        }]
    );
    dir.check_invariants().unwrap();
}

/// `link` arrives at the directory on `conn`.
/// A client's handshake on `conn`, to its welcome: the transient node id it was given.
fn client_handshake(dir: &mut DirectoryConns, membership: &mut Membership, conn: ConnId) -> NodeId {
    let mut out = Vec::new();
    dir.accepted(t(30), conn, [3; 32], &mut out);
    let (connector, hello) = Connector::new(Who::Client, [4; 32], None);
    dir_frame(dir, membership, conn, &hello, &mut out);
    let challenge = sent(&out, conn).pop().unwrap();
    let proof = connector.answer(&challenge).unwrap();
    dir_frame(dir, membership, conn, &proof, &mut out);
    match sent(&out, conn).last() {
        Some(Link::Welcome { node, .. }) => *node,
        other => panic!("{other:?} in {out:?}"),
    }
}

fn dir_frame(
    dir: &mut DirectoryConns,
    membership: &mut Membership,
    conn: ConnId,
    link: &Link,
    out: &mut Vec<ConnAction>,
) -> DirHeard {
    dir.frame(
        t(0),
        conn,
        &bytes(link),
        membership,
        &mut nobody,
        DIRECTORY,
        AuthorityEpoch(1),
        out,
    )
}

#[test]
fn a_host_asks_where_another_listens_and_admissions_tell_nobody_else() {
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut a = host_link(None, 1);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut a, 1, t(0));
    assert_welcomed(&heard, NodeId(1), 1);
    let mut b = DirectoryLink::new(
        Who::Host {
            listen: "h2:2".to_owned(),
            boot_nonce: 2,
        },
        None,
        t(0),
    );
    let (heard, out) = handshake(&mut dir, &mut membership, &mut b, 2, t(10));
    assert_welcomed(&heard, NodeId(2), 1);
    // Version 1 sent every host the peer list here; now the others hear nothing of it.
    assert_eq!(sent(&out, 1), Vec::<Link>::new(), "{out:?}");

    let ask = |dir: &mut DirectoryConns, membership: &mut Membership, conn, node| {
        let mut out = Vec::new();
        let heard = dir_frame(dir, membership, conn, &Link::WhereIs(node), &mut out);
        (heard, out)
    };
    let (heard, out) = ask(&mut dir, &mut membership, 1, NodeId(2));
    assert_eq!(heard, DirHeard::Nothing);
    let answer = Link::Located {
        node: NodeId(2),
        listen: Some("h2:2".to_owned()),
    };
    assert_eq!(out, vec![ConnAction::Send(1, answer.clone())]);
    let mut to_dir = Vec::new();
    assert_eq!(
        a.frame(t(20), 1, &bytes(&answer), &mut to_dir),
        LinkHeard::Located {
            node: NodeId(2),
            listen: Some("h2:2".to_owned())
        }
    );
    // A node id no host has: no address.
    let (_, out) = ask(&mut dir, &mut membership, 2, NodeId(40));
    assert_eq!(
        out,
        vec![ConnAction::Send(
            2,
            Link::Located {
                node: NodeId(40),
                listen: None
            }
        )]
    );

    // A client has no business with hosts' addresses: out of protocol.
    client_handshake(&mut dir, &mut membership, 3);
    let (heard, out) = ask(&mut dir, &mut membership, 3, NodeId(2));
    assert!(
        matches!(heard, DirHeard::Protocol { conn: 3, .. }),
        "{heard:?}"
    );
    assert_eq!(out, vec![ConnAction::Close(3, Closing::Protocol)]);
    dir.check_invariants().unwrap();
}

/// What the drivers ask the machines about their connections, and the directory's self-check
/// of who each connection speaks for (found by a mutation run over `conns.rs`: each answered
/// wrong, or the check weakened, passed every other test).
#[test]
fn each_connection_is_known_for_whom_it_speaks() {
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 5);
    assert_eq!(link.identity(), None);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    assert_welcomed(&heard, NodeId(1), 1);
    assert_eq!(link.identity(), Some((NodeId(1), 1)));
    assert_eq!(
        dir.attached(1),
        Some(&Attached {
            node: NodeId(1),
            incarnation: 1,
            host: true
        })
    );
    assert_eq!(dir.attached(9), None);
    // Clients get transient node ids of their own.
    let (c3, c4) = (
        client_handshake(&mut dir, &mut membership, 3),
        client_handshake(&mut dir, &mut membership, 4),
    );
    // From the first transient id up, away from the hosts' ids below it.
    assert_eq!((c3.0, c4.0), (1 << 40, (1 << 40) + 1));
    assert_eq!(dir.attached(3).map(|a| (a.node, a.host)), Some((c3, false)));
    assert_eq!(dir.attached(4).map(|a| (a.node, a.host)), Some((c4, false)));
    // Connections not yet admitted.
    assert_eq!(dir.listener().pending_count(), 0);
    let mut out = Vec::new();
    dir.accepted(t(40), 6, [6; 32], &mut out);
    dir.accepted(t(40), 7, [7; 32], &mut out);
    assert_eq!(dir.listener().pending_count(), 2);
    dir.check_invariants().unwrap();

    // The welcomed host takes frames for itself from the directory, and no others.
    let to = |node| {
        Link::Frame(Envelope {
            from: DIRECTORY,
            to: Address::new(NodeId(node), 1, 5),
            message: Message::ProxyCancel {
                reply_to: DIRECTORY,
            },
        })
    };
    let mut back = Vec::new();
    assert!(matches!(
        link.frame(t(50), 1, &bytes(&to(1)), &mut back),
        LinkHeard::Envelope(_)
    ));
    // (Out of protocol while up: the link is lost, and tried again.)
    assert_eq!(
        link.frame(t(50), 1, &bytes(&to(2)), &mut back),
        LinkHeard::Lost
    );

    // The self-check finds a connection indexed under a node it does not speak for.
    dir.attached.get_mut(&1).unwrap().node = NodeId(99);
    assert!(dir.check_invariants().is_err());
}

/// A connection being made holds at most `PEER_BACKLOG_MAX` frames (its first included), and
/// an admitted peer's connection is known by its node.
#[test]
fn a_peer_backlog_holds_its_bound_exactly() {
    let peers = |me| {
        let listener = Listener::new(None, Accepts::Peers, Duration::from_secs(5), 4, 4);
        PeerLinks::new(NodeId(me), 1, None, listener)
    };
    let frame = Link::Frame(Envelope {
        from: Address::new(NodeId(1), 1, 1),
        to: Address::new(NodeId(2), 1, 5),
        message: Message::ProxyCancel {
            reply_to: Address::new(NodeId(1), 1, 1),
        },
    });
    let (mut a, mut b) = (peers(1), peers(2));
    let mut out = Vec::new();
    a.connecting(t(0), NodeId(2), 7, frame.clone());
    let mut held = 1;
    while a.route(t(0), NodeId(2), frame.clone(), &mut out) == Ok(Routed::Queued) {
        held += 1;
        assert!(held <= PEER_BACKLOG_MAX + 1, "no bound");
    }
    assert_eq!(held, PEER_BACKLOG_MAX);
    assert_eq!(
        a.route(t(0), NodeId(2), frame, &mut out),
        Ok(Routed::Dropped)
    );
    // b admits a's connection: it knows it as node 1.
    b.accepted(t(0), 7, [4; 32], &mut out);
    a.connected(7, [3; 32], &mut out);
    assert_eq!(b.incoming_node(7), None, "not yet proved");
    for _ in 0..3 {
        for action in std::mem::take(&mut out) {
            let ConnAction::Send(7, link) = action else {
                continue;
            };
            if matches!(link, Link::Challenge { .. }) {
                a.frame(t(0), 7, &bytes(&link), &mut out);
            } else {
                b.frame(t(0), 7, &bytes(&link), &mut out);
            }
        }
    }
    assert_eq!(b.incoming_node(7), Some(NodeId(1)));
    assert_eq!(b.incoming_node(8), None);
}

/// A listener takes only the hellos of its kind (a peer's hello at the directory, a host's or
/// a client's at a host's peer port, is refused as not a hello), and says which connections
/// it admitted (found by a mutation run over `conns.rs`: `takes` answering yes to all, and
/// both accessors answering wrong, passed every other test).
#[test]
fn a_listener_takes_only_the_hellos_of_its_kind() {
    let peer = Who::Peer {
        node: NodeId(3),
        incarnation: 1,
    };
    let host = Who::Host {
        listen: "h3:1".into(),
        boot_nonce: 1,
    };
    let cases = [
        (Accepts::HostsAndClients, host.clone(), true),
        (Accepts::HostsAndClients, Who::Client, true),
        (Accepts::HostsAndClients, peer.clone(), false),
        (Accepts::Peers, peer, true),
        (Accepts::Peers, host, false),
        (Accepts::Peers, Who::Client, false),
    ];
    for (accepts, who, taken) in cases {
        let mut listener = Listener::new(None, accepts, Duration::from_secs(5), 4, 4);
        let mut out = Vec::new();
        listener.accepted(t(0), 1, [1; 32], &mut out);
        let (connector, hello) = Connector::new(who.clone(), [2; 32], None);
        out.clear();
        listener.frame(1, &bytes(&hello), &mut out);
        let Some(challenge) = sent(&out, 1)
            .into_iter()
            .find(|l| matches!(l, Link::Challenge { .. }))
        else {
            assert!(!taken, "{accepts:?} refused {who:?}: {out:?}");
            let refused = out.iter().any(|a| {
                matches!(
                    a,
                    ConnAction::Refuse {
                        conn: 1,
                        why: Closing::NotAHello,
                        ..
                    }
                )
            });
            assert!(refused, "{accepts:?} {who:?}: {out:?}");
            assert!(!listener.is_admitted(1));
            assert_eq!(listener.admitted_count(), 0);
            continue;
        };
        assert!(taken, "{accepts:?} took {who:?}");
        assert!(!listener.is_admitted(1), "not before its proof");
        let proof = connector.answer(&challenge).unwrap();
        listener.frame(1, &bytes(&proof), &mut out);
        assert!(listener.is_admitted(1), "{accepts:?} {who:?}: {out:?}");
        assert!(!listener.is_admitted(2));
        assert_eq!(listener.admitted_count(), 1);
    }
}

/// A host link for the host listening on `listen`.
fn host_link_at(listen: &str, boot_nonce: u64) -> DirectoryLink {
    let who = Who::Host {
        listen: listen.to_owned(),
        boot_nonce,
    };
    DirectoryLink::new(who, None, t(0))
}

#[test]
fn a_full_membership_forgets_only_a_host_long_away_that_the_namespace_does_not_name() {
    let (mut dir, mut membership) = (directory(None), Membership::default());
    membership.set_capacity(1);
    let away = Duration::from_secs(60);
    dir.set_forget_away_after(away);
    assert_eq!(dir.forget_away_after(), away);
    let mut a = host_link(None, 1);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut a, 1, t(0));
    assert_welcomed(&heard, NodeId(1), 1);
    let refused = |out: &[ConnAction], conn| {
        out.iter().any(
            |a| matches!(a, ConnAction::Refuse { conn: c, why: Closing::Full, .. } if *c == conn),
        ) && !out.iter().any(|a| matches!(a, ConnAction::Persist(_)))
    };
    let named = |nodes: &[u64]| {
        let nodes: BTreeSet<NodeId> = nodes.iter().map(|n| NodeId(*n)).collect();
        move || nodes.clone()
    };

    // The table is full and its one host is connected: a new host is refused, whatever the
    // time and the namespace.
    let late = t(3_600_000);
    let mut b = host_link_at("h2:1", 1);
    let (heard, out) =
        handshake_naming(&mut dir, &mut membership, &mut b, 2, late, &mut named(&[]));
    assert!(!matches!(heard, LinkHeard::Welcomed { .. }), "{heard:?}");
    assert!(refused(&out, 2), "{out:?}");

    // Its connection closes: away from then on, not yet for long enough.
    let gone = t(4_000_000);
    assert_eq!(dir.closed(gone, 1), Some(NodeId(1)));
    a.closed(gone, 1);
    assert_eq!(dir.away_since(NodeId(1)), Some(gone));
    dir.check_invariants().unwrap();
    let soon = gone.saturating_add(Duration::from_millis(59_999));
    let mut b = host_link_at("h2:1", 2);
    let (_, out) = handshake_naming(&mut dir, &mut membership, &mut b, 3, soon, &mut named(&[]));
    assert!(refused(&out, 3), "{out:?}");

    // Long enough, but the namespace names it (a blob on it): refused.
    let then = gone.saturating_add(away);
    let mut b = host_link_at("h2:1", 3);
    let (_, out) = handshake_naming(&mut dir, &mut membership, &mut b, 4, then, &mut named(&[1]));
    assert!(refused(&out, 4), "{out:?}");

    // Nothing names it: forgotten, in the same durable batch as the new host, before the
    // welcome; nobody is told where node 1 listens any more.
    let mut b = host_link_at("h2:1", 4);
    let (heard, out) =
        handshake_naming(&mut dir, &mut membership, &mut b, 5, then, &mut named(&[7]));
    assert_welcomed(&heard, NodeId(2), 1);
    let persisted = out.iter().position(|a| {
        a == &ConnAction::Persist(vec![
            LogRecord::Member(crate::membership::MemberRecord::Forgot {
                listen: "h1:1".to_owned(),
                node: NodeId(1),
            }),
            LogRecord::Member(crate::membership::MemberRecord::Host {
                listen: "h2:1".to_owned(),
                node: NodeId(2),
                incarnation: 1,
                boot_nonce: 4,
            }),
        ])
    });
    let welcomed = out
        .iter()
        .position(|a| matches!(a, ConnAction::Send(5, Link::Welcome { .. })));
    assert!(persisted.is_some() && persisted < welcomed, "{out:?}");
    assert_eq!(dir.away_since(NodeId(1)), None);
    assert_eq!(membership.listen_of(NodeId(1)), None);
    dir.check_invariants().unwrap();

    // The forgotten host comes back (its old process): a new host to a table full with a
    // connected one, so refused (with room it would be welcomed under a new id, and the old
    // process would stop on that welcome).
    let (heard, out) =
        handshake_naming(&mut dir, &mut membership, &mut a, 6, then, &mut named(&[]));
    assert!(!matches!(heard, LinkHeard::Welcomed { .. }), "{heard:?}");
    assert!(refused(&out, 6), "{out:?}");
    // A host not seen since the directory started is away since then.
    let (mut fresh, mut m2) = (directory(None), membership.clone());
    fresh.set_forget_away_after(away);
    let mut c = host_link_at("h3:1", 1);
    let (_, out) = handshake_naming(&mut fresh, &mut m2, &mut c, 1, soon, &mut named(&[]));
    assert!(!refused(&out, 1), "{out:?}");
    assert_eq!(m2.listen_of(NodeId(2)), None);
    assert_eq!(m2.listen_of(NodeId(3)), Some("h3:1"));
}

/// A welcomed link's pings, as the directory answers them: (the link's actions, the
/// directory's) after `expire` at `now`, with every ping answered when `answer`.
fn ping_round(
    link: &mut DirectoryLink,
    dir: &mut DirectoryConns,
    membership: &mut Membership,
    conn: ConnId,
    now: Instant,
    answer: bool,
) -> (LinkExpired, Vec<ConnAction>, Vec<ConnAction>) {
    let mut out = Vec::new();
    let expired = link.expire(now, &mut out);
    let mut back = Vec::new();
    for ping in sent(&out, conn) {
        assert!(matches!(ping, Link::Ping { .. }), "{ping:?}");
        let heard = dir.frame(
            now,
            conn,
            &bytes(&ping),
            membership,
            &mut nobody,
            DIRECTORY,
            AuthorityEpoch(1),
            &mut back,
        );
        assert_eq!(heard, DirHeard::Nothing);
    }
    if answer {
        for pong in sent(&back, conn) {
            assert!(matches!(pong, Link::Pong { .. }), "{pong:?}");
            assert_eq!(
                link.frame(now, conn, &bytes(&pong), &mut Vec::new()),
                LinkHeard::Nothing
            );
        }
    }
    (expired, out, back)
}

#[test]
fn a_welcomed_link_stays_while_the_directory_answers_and_leaves_it_once_silent() {
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 1);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    assert_welcomed(&heard, NodeId(1), 1);
    let every = SILENCE_DEFAULT.as_millis() / PINGS_PER_SILENCE;
    assert_eq!(link.next_deadline(), Some(t(every)));
    // Answered for a minute: up throughout, a ping every quarter of the bound.
    let mut pings = 0;
    while let Some(at) = link.next_deadline().filter(|&at| at < t(60_000)) {
        let (expired, out, back) = ping_round(&mut link, &mut dir, &mut membership, 1, at, true);
        assert_eq!(expired, LinkExpired::Nothing);
        pings += out.len();
        assert_eq!(back.len(), out.len(), "every ping answered at once");
    }
    assert_eq!(link.up(), Some(1));
    assert_eq!(pings as u64, 60_000 / every - 1);
    // Then the directory stops answering: the link is given up one bound after the last
    // answered ping was sent, and pings went out meanwhile.
    let last_answered = t(60_000 - every);
    let mut now = t(60_000);
    loop {
        let (expired, out, _) = ping_round(&mut link, &mut dir, &mut membership, 1, now, false);
        if expired == LinkExpired::Silent {
            assert_eq!(out, vec![ConnAction::Close(1, Closing::Silent)]);
            break;
        }
        assert!(now < last_answered.saturating_add(SILENCE_DEFAULT));
        now = link.next_deadline().unwrap();
    }
    assert_eq!(now, last_answered.saturating_add(SILENCE_DEFAULT));
    assert_eq!(link.conn(), None, "lost, as a closed link is");
    assert_eq!(
        link.next_deadline(),
        Some(now.saturating_add(RECONNECT_FIRST))
    );
    // A pong out of turn, or on a link that is not up, changes nothing.
    assert_eq!(
        link.frame(now, 1, &bytes(&Link::Pong { seq: 3 }), &mut Vec::new()),
        LinkHeard::Nothing
    );
}

#[test]
fn the_silence_bound_is_the_links_own_and_checked() {
    let link = host_link(None, 1).with_silence(Duration::from_millis(400));
    assert_eq!(link.silence(), Duration::from_millis(400));
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = link;
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    assert_welcomed(&heard, NodeId(1), 1);
    assert_eq!(link.next_deadline(), Some(t(100)));
    let mut now = t(100);
    let mut expired = LinkExpired::Nothing;
    while expired == LinkExpired::Nothing {
        expired = link.expire(now, &mut Vec::new());
        now = link.next_deadline().unwrap();
    }
    assert_eq!(expired, LinkExpired::Silent);
    // A handshake at an address that says nothing is given up after the bound too.
    let mut link = host_link(None, 2).with_silence(Duration::from_millis(400));
    link.connecting(t(0), 2);
    assert_eq!(link.next_deadline(), Some(t(400)));
}

#[test]
#[should_panic(expected = "silence bound")]
fn a_silence_bound_below_the_least_is_refused() {
    let _ = host_link(None, 1).with_silence(Duration::from_millis(100));
}

#[test]
fn the_rotation_skips_an_address_that_went_silent_while_another_remains() {
    // Three replicas; the host is welcomed at the second, which then stops answering.
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let mut link = host_link(None, 1).with_candidates(3, 1);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 1, t(0));
    assert_welcomed(&heard, NodeId(1), 1);
    let mut now = t(0);
    while link.expire(now, &mut Vec::new()) != LinkExpired::Silent {
        now = link.next_deadline().unwrap();
    }
    assert_eq!(link.candidate(), 2);
    // The others close at once (no leader there yet): the rotation goes 2, 0, then skips 1
    // and ends the round, for four bounds.
    let seen = fail_attempts(&mut link, Fails::Closed, 6, 10);
    let addresses: Vec<usize> = seen.iter().map(|(a, _)| *a).collect();
    assert_eq!(addresses, [2, 0, 2, 0, 2, 0]);
    assert_eq!(waits(&seen), [50, 100, 50, 200, 50, 400]);
    // A follower that still names the stopped leader does not send the host back to it
    // while it is skipped (followers name it until they elect another).
    let at = link.next_deadline().unwrap();
    assert!(!link.redirect(at, 1), "redirected to the silent address");
    assert_ne!(link.candidate(), 1);
    assert!(link.redirect(at, 0), "another address is followed");
    assert_eq!(link.candidate(), 0);
    // Four bounds after it went silent, the stopped address is tried again.
    let skipped_until = now.saturating_add(SILENCE_DEFAULT.saturating_mul(4));
    let mut later = Vec::new();
    for conn in 20..26 {
        let at = link.next_deadline().unwrap().max(skipped_until);
        link.connect_failed(at);
        later.push(link.candidate());
        let _ = conn;
    }
    assert!(later.contains(&1), "{later:?}");
    // An attempt at an address that accepts and says nothing is skipped the same way.
    let mut link = host_link(None, 2).with_candidates(2, 0);
    let seen = fail_attempts(&mut link, Fails::Silent, 1, 30);
    assert_eq!(seen, [(0, 50)]);
    let seen = fail_attempts(&mut link, Fails::Closed, 3, 31);
    let addresses: Vec<usize> = seen.iter().map(|(a, _)| *a).collect();
    // 1 fails: 0 was silent a moment ago, so the round ends and 1 is tried again.
    assert_eq!(addresses, [1, 1, 1]);
    // With one address there is nothing else to try: it is tried again as always.
    let mut link = host_link(None, 3);
    let seen = fail_attempts(&mut link, Fails::Silent, 2, 40);
    assert_eq!(seen, [(0, 100), (0, 200)]);
}

#[test]
fn a_replica_that_does_not_serve_points_to_the_leader_and_the_link_goes_there_next() {
    // Five replicas; the host tries the first, a follower, which names the fourth.
    let mut link = host_link(None, 1).with_candidates(5, 0);
    let mut out = Vec::new();
    let at = link.next_deadline().unwrap();
    link.connecting(at, 1);
    link.connected(1, [1; 32], &mut out);
    out.clear();
    let not_leader = Link::NotLeader {
        leader: Some("r4:7801".to_owned()),
    };
    let heard = link.frame(at, 1, &bytes(&not_leader), &mut out);
    assert_eq!(
        heard,
        LinkHeard::NotLeader {
            leader: Some("r4:7801".to_owned())
        }
    );
    assert_eq!(out, vec![ConnAction::Close(1, Closing::NotLeader)]);
    assert_eq!(link.conn(), None, "the attempt is over");
    // Without a redirect the next address would be the second; the driver redirects.
    assert_eq!(link.candidate(), 1);
    let wait = link.next_deadline().unwrap().saturating_since(at);
    link.redirect(at, 3);
    assert_eq!(link.candidate(), 3);
    assert_eq!(
        link.next_deadline().unwrap().saturating_since(at),
        wait,
        "a redirect changes where, never how soon"
    );
    // An address the link does not have, or a link that is not down, is not redirected.
    link.redirect(at, 9);
    assert_eq!(link.candidate(), 3);
    let (mut dir, mut membership) = (directory(None), Membership::default());
    let next = link.next_deadline().unwrap();
    let (heard, _) = handshake(&mut dir, &mut membership, &mut link, 2, next);
    assert_welcomed(&heard, NodeId(1), 1);
    link.redirect(at, 0);
    assert_eq!(link.candidate(), 3, "welcomed: stays");
    // Replicas naming no leader, or one another, cost the normal rotation and back-off: the
    // attempts of a round still count.
    let mut link = host_link(None, 2).with_candidates(3, 0);
    let mut waits = Vec::new();
    for conn in 10..16 {
        let at = link.next_deadline().unwrap();
        link.connecting(at, conn);
        link.connected(conn, [1; 32], &mut out);
        let redirect = Link::NotLeader {
            leader: Some("r1:7801".to_owned()),
        };
        link.frame(at, conn, &bytes(&redirect), &mut out);
        link.redirect(at, 0);
        waits.push(
            link.next_deadline()
                .unwrap()
                .saturating_since(at)
                .as_millis(),
        );
    }
    assert_eq!(waits, [50, 50, 100, 50, 50, 200]);
}

#[test]
fn a_leader_named_at_an_address_the_host_was_not_given_becomes_one_more() {
    // One address, a follower, which names a leader elsewhere: the driver adds it and goes
    // there next, within the round (one address's back-off would otherwise be the single
    // directory's).
    let mut link = host_link(None, 1);
    let mut out = Vec::new();
    let at = link.next_deadline().unwrap();
    link.connecting(at, 1);
    link.connected(1, [1; 32], &mut out);
    let not_leader = Link::NotLeader {
        leader: Some("r2:7801".to_owned()),
    };
    link.frame(at, 1, &bytes(&not_leader), &mut out);
    assert_eq!(link.candidate(), 0, "one address: the same next");
    assert_eq!(link.add_candidate(), Some(1));
    assert_eq!(link.candidates(), 2);
    link.redirect(at, 1);
    assert_eq!(link.candidate(), 1);
    // The link holds at most DIRECTORY_CANDIDATES_MAX addresses.
    let mut full = host_link(None, 2).with_candidates(DIRECTORY_CANDIDATES_MAX, 0);
    assert_eq!(full.add_candidate(), None);
    assert_eq!(full.candidates(), DIRECTORY_CANDIDATES_MAX);
}

#[test]
fn the_directory_answers_pings_and_lets_go_of_a_host_that_says_nothing() {
    let (mut dir, mut membership) = (directory(None), Membership::default());
    dir.set_host_silence(Duration::from_secs(10));
    assert_eq!(dir.host_silence(), Duration::from_secs(10));
    let mut a = host_link(None, 1);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut a, 1, t(0));
    assert_welcomed(&heard, NodeId(1), 1);
    let mut b = host_link_at("h2:2", 2);
    let (heard, _) = handshake(&mut dir, &mut membership, &mut b, 2, t(0));
    assert_welcomed(&heard, NodeId(2), 1);
    // A client, which never pings, is never let go of for its silence.
    let mut client = DirectoryLink::new(Who::Client, None, t(0));
    let (heard, _) = handshake(&mut dir, &mut membership, &mut client, 3, t(0));
    assert!(matches!(heard, LinkHeard::Welcomed { .. }), "{heard:?}");
    assert_eq!(dir.next_deadline(), Some(t(10_000)));
    // Host 1 pings all along; host 2 stops (its process is stopped) after its welcome.
    let mut now = t(0);
    while now < t(30_000) {
        now = a.next_deadline().unwrap();
        let (expired, _, _) = ping_round(&mut a, &mut dir, &mut membership, 1, now, true);
        assert_eq!(expired, LinkExpired::Nothing);
        let mut out = Vec::new();
        let silent = dir.expire(now, &mut out);
        if now < t(10_000) {
            assert!(silent.is_empty() && out.is_empty(), "{now}: {out:?}");
        } else if !silent.is_empty() {
            assert_eq!(silent, vec![NodeId(2)]);
            assert_eq!(out, vec![ConnAction::Close(2, Closing::Silent)]);
            assert_eq!(now, t(10_000));
        }
        dir.check_invariants().unwrap();
    }
    assert_eq!(dir.conn_of(NodeId(1)), Some(1));
    assert_eq!(dir.conn_of(NodeId(2)), None);
    assert_eq!(dir.away_since(NodeId(2)), Some(t(10_000)));
    assert!(dir.attached(3).is_some(), "the client stays");
    // Host 2 resumes, learns its connection closed, and comes back on a new one: judged
    // afresh.
    assert_eq!(b.closed(now, 2), LinkHeard::Lost);
    let now = b.next_deadline().unwrap();
    let (heard, _) = handshake(&mut dir, &mut membership, &mut b, 4, now);
    assert!(matches!(heard, LinkHeard::Welcomed { .. }), "{heard:?}");
    dir.check_invariants().unwrap();
    let mut out = Vec::new();
    assert!(
        dir.expire(now.saturating_add(Duration::from_secs(9)), &mut out)
            .is_empty()
    );
}

#[test]
fn a_connection_to_another_host_is_pinged_and_given_up_once_silent() {
    let peers = |me| {
        let listener = Listener::new(None, Accepts::Peers, Duration::from_secs(5), 4, 4);
        PeerLinks::new(NodeId(me), 1, None, listener)
    };
    let (mut a, mut b) = (peers(1), peers(2).with_silence(Duration::from_secs(2)));
    let first = Link::Frame(Envelope {
        from: Address::new(NodeId(1), 1, 1),
        to: Address::new(NodeId(2), 1, 5),
        message: Message::ProxyCancel {
            reply_to: Address::new(NodeId(1), 1, 1),
        },
    });
    let mut out = Vec::new();
    a.connecting(t(0), NodeId(2), 7, first);
    b.accepted(t(0), 7, [4; 32], &mut out);
    a.connected(7, [3; 32], &mut out);
    // The handshake (both sides share conn id 7 here), up to a's proof.
    for _ in 0..3 {
        for action in std::mem::take(&mut out) {
            let ConnAction::Send(7, link) = action else {
                continue;
            };
            if matches!(link, Link::Challenge { .. }) {
                a.frame(t(0), 7, &bytes(&link), &mut out);
            } else {
                b.frame(t(0), 7, &bytes(&link), &mut out);
            }
        }
    }
    let every = SILENCE_DEFAULT.as_millis() / PINGS_PER_SILENCE;
    assert_eq!(a.next_deadline(), Some(t(every)));
    // In use and answered for 3 s: a stays connected. Then b stops answering: a gives the
    // connection up at most a bound later (a bound after the last answered ping was sent).
    let frame = |n: u64| {
        Link::Frame(Envelope {
            from: Address::new(NodeId(1), 1, n),
            to: Address::new(NodeId(2), 1, 5),
            message: Message::ProxyCancel {
                reply_to: Address::new(NodeId(1), 1, n),
            },
        })
    };
    let stop = 3_000;
    let mut silent_at = None;
    for step in 1..200 {
        let now = t(step * 50);
        let mut acts = Vec::new();
        assert_eq!(
            a.route(now, NodeId(2), frame(step), &mut acts),
            Ok(Routed::Sent)
        );
        let silent = a.expire(now, &mut acts);
        if !silent.is_empty() {
            assert_eq!(silent, vec![NodeId(2)]);
            assert!(
                acts.contains(&ConnAction::Close(7, Closing::Silent)),
                "{acts:?}"
            );
            silent_at = Some(step * 50);
            break;
        }
        for ping in sent(&acts, 7)
            .into_iter()
            .filter(|l| matches!(l, Link::Ping { .. }))
        {
            let mut pongs = Vec::new();
            assert_eq!(
                b.frame(now, 7, &bytes(&ping), &mut pongs),
                PeerHeard::Nothing
            );
            if step * 50 < stop {
                for pong in sent(&pongs, 7) {
                    assert_eq!(a.frame(now, 7, &bytes(&pong), &mut out), PeerHeard::Nothing);
                }
            }
        }
    }
    let silent_at = silent_at.expect("given up");
    assert!(
        (stop..=stop + SILENCE_DEFAULT.as_millis()).contains(&silent_at),
        "{silent_at}"
    );
    // Resting: a connection whose frames were all answered for is not pinged.
    let (mut c, mut d) = (peers(3), peers(4));
    let first = Link::Frame(Envelope {
        from: Address::new(NodeId(3), 1, 1),
        to: Address::new(NodeId(4), 1, 5),
        message: Message::ProxyCancel {
            reply_to: Address::new(NodeId(3), 1, 1),
        },
    });
    c.connecting(t(0), NodeId(4), 9, first);
    out.clear();
    d.accepted(t(0), 9, [5; 32], &mut out);
    c.connected(9, [6; 32], &mut out);
    for _ in 0..3 {
        for action in std::mem::take(&mut out) {
            let ConnAction::Send(9, link) = action else {
                continue;
            };
            if matches!(link, Link::Challenge { .. }) {
                c.frame(t(0), 9, &bytes(&link), &mut out);
            } else {
                d.frame(t(0), 9, &bytes(&link), &mut out);
            }
        }
    }
    let mut acts = Vec::new();
    c.expire(t(every), &mut acts);
    let ping = sent(&acts, 9).remove(0);
    let mut pongs = Vec::new();
    d.frame(t(every), 9, &bytes(&ping), &mut pongs);
    c.frame(t(every), 9, &bytes(&sent(&pongs, 9)[0]), &mut out);
    assert_eq!(c.next_deadline(), None);
    assert!(c.expire(t(3_600_000), &mut acts).is_empty());
    assert_eq!(c.outgoing_node(9), Some(NodeId(4)));
    assert!(!a.knows(7));
}

/// The membership's forgetting, driven through the directory's connections by random hellos,
/// closes, restarts of hosts and of the directory, time and namespace changes, against a
/// restatement of the rules that calls neither `Membership` nor `DirectoryConns`: a new host
/// finding the table full takes the place of the member with the lowest node id that is not
/// connected, has been away (since its connection closed, or since the directory started) for
/// at least the threshold, and that the namespace does not name; otherwise it is refused and
/// nothing changes. Node ids are never handed out twice, and the durable records rebuild the
/// table the directory serves from.
mod forgetting_against_a_model {
    use proptest::prelude::*;

    use super::*;
    use crate::membership::MemberRecord;

    const CAPACITY: usize = 3;
    const AWAY: Duration = Duration::from_secs(60);
    const HOSTS: usize = 6;

    #[derive(Clone, Debug)]
    enum Step {
        /// Host `h` says hello, from a new process if `restart`.
        Hello { h: usize, restart: bool },
        /// Host `h`'s connection closes.
        Close { h: usize },
        /// Time passes.
        Wait { ms: u64 },
        /// The namespace starts or stops naming node `node`.
        Name { node: u64, on: bool },
        /// The directory restarts from its records (compacted first: the table restated).
        Reboot { compact: bool },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..HOSTS, any::<bool>()).prop_map(|(h, restart)| Step::Hello { h, restart }),
            3 => (0..HOSTS).prop_map(|h| Step::Close { h }),
            3 => prop_oneof![
                0u64..90_000,
                // Exactly the threshold, and just under it.
                Just(AWAY.as_millis()),
                Just(AWAY.as_millis() - 1),
                Just(1),
            ]
            .prop_map(|ms| Step::Wait { ms }),
            2 => (1u64..12, any::<bool>()).prop_map(|(node, on)| Step::Name { node, on }),
            1 => any::<bool>().prop_map(|compact| Step::Reboot { compact }),
        ]
    }

    /// What the rules say the directory holds.
    #[derive(Default)]
    struct Expected {
        /// listen → (node, incarnation, boot nonce).
        members: BTreeMap<String, (u64, u64, u64)>,
        next_node: u64,
        /// listen → the connection it is attached on.
        attached: BTreeMap<String, ConnId>,
        /// node → when its connection closed (since the directory started).
        away: BTreeMap<u64, Instant>,
        started: Instant,
        named: BTreeSet<u64>,
        issued: BTreeSet<u64>,
    }

    impl Expected {
        fn forgettable(&self, now: Instant) -> Option<(String, u64)> {
            let mut by_node: Vec<(u64, &String)> =
                self.members.iter().map(|(l, m)| (m.0, l)).collect();
            by_node.sort();
            by_node
                .into_iter()
                .find(|(node, listen)| {
                    let since = self.away.get(node).copied().unwrap_or(self.started);
                    !self.attached.contains_key(*listen)
                        && now.saturating_since(since) >= AWAY
                        && !self.named.contains(node)
                })
                .map(|(node, listen)| (listen.clone(), node))
        }
    }

    fn fresh_conns(now: Instant) -> DirectoryConns {
        let listener = Listener::new(
            None,
            Accepts::HostsAndClients,
            Duration::from_secs(5),
            2,
            16,
        );
        let mut dir = DirectoryConns::new(listener, 1 << 40, now);
        dir.set_forget_away_after(AWAY);
        dir
    }

    fn host_record(listen: &str, m: (u64, u64, u64)) -> LogRecord {
        LogRecord::Member(MemberRecord::Host {
            listen: listen.to_owned(),
            node: NodeId(m.0),
            incarnation: m.1,
            boot_nonce: m.2,
        })
    }

    fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
        let mut now = t(0);
        let mut dir = fresh_conns(now);
        let mut membership = Membership::default();
        membership.set_capacity(CAPACITY);
        let mut log: Vec<LogRecord> = Vec::new();
        let mut want = Expected {
            next_node: 1,
            started: now,
            ..Expected::default()
        };
        let mut nonces = [1u64; HOSTS];
        let mut next_conn: ConnId = 1;
        for step in steps {
            match step {
                Step::Hello { h, restart } => {
                    if restart {
                        nonces[h] += 1;
                    }
                    let listen = format!("h{h}:1");
                    let nonce = (h as u64) * 1_000 + nonces[h];
                    let conn = next_conn;
                    next_conn += 1;
                    let mut link = DirectoryLink::new(
                        Who::Host {
                            listen: listen.clone(),
                            boot_nonce: nonce,
                        },
                        None,
                        now,
                    );
                    let named: BTreeSet<NodeId> = want.named.iter().map(|n| NodeId(*n)).collect();
                    let (heard, out) = handshake_naming(
                        &mut dir,
                        &mut membership,
                        &mut link,
                        conn,
                        now,
                        &mut || named.clone(),
                    );
                    let persisted: Vec<LogRecord> = out
                        .iter()
                        .filter_map(|a| match a {
                            ConnAction::Persist(records) => Some(records.clone()),
                            _ => None,
                        })
                        .flatten()
                        .collect();
                    // The rules' answer.
                    let (expect_records, welcome) = match want.members.get(&listen).copied() {
                        Some(m) if m.2 == nonce => (Vec::new(), Some((m.0, m.1))),
                        Some(m) => {
                            let m2 = (m.0, m.1 + 1, nonce);
                            want.members.insert(listen.clone(), m2);
                            (vec![host_record(&listen, m2)], Some((m2.0, m2.1)))
                        }
                        None => {
                            let mut records = Vec::new();
                            let room = if want.members.len() < CAPACITY {
                                true
                            } else if let Some((gone, node)) = want.forgettable(now) {
                                want.members.remove(&gone);
                                want.away.remove(&node);
                                records.push(LogRecord::Member(MemberRecord::Forgot {
                                    listen: gone,
                                    node: NodeId(node),
                                }));
                                true
                            } else {
                                false
                            };
                            if room {
                                let m = (want.next_node, 1, nonce);
                                prop_assert!(want.issued.insert(m.0), "node {} twice", m.0);
                                want.next_node += 1;
                                want.members.insert(listen.clone(), m);
                                records.push(host_record(&listen, m));
                                (records, Some((m.0, 1)))
                            } else {
                                (records, None)
                            }
                        }
                    };
                    prop_assert_eq!(&persisted, &expect_records, "hello from {}", listen);
                    match welcome {
                        Some((node, incarnation)) => {
                            prop_assert!(
                                matches!(heard, LinkHeard::Welcomed { node: n, incarnation: i, .. }
                                    if n == NodeId(node) && i == incarnation),
                                "{listen} expected welcome as {node}/{incarnation}: {heard:?}"
                            );
                            want.attached.insert(listen.clone(), conn);
                            want.away.remove(&node);
                        }
                        None => {
                            prop_assert!(
                                out.iter().any(|a| matches!(a,
                                    ConnAction::Refuse { conn: c, why: Closing::Full, .. } if *c == conn)),
                                "{listen} expected a full refusal: {out:?}"
                            );
                            dir.closed(now, conn);
                        }
                    }
                    log.extend(persisted);
                }
                Step::Close { h } => {
                    let listen = format!("h{h}:1");
                    let Some(conn) = want.attached.remove(&listen) else {
                        continue;
                    };
                    let gone = dir.closed(now, conn);
                    let node = want.members.get(&listen).map(|m| m.0);
                    prop_assert_eq!(gone.map(|n| n.0), node, "close of {}", listen);
                    if let Some(node) = node {
                        want.away.insert(node, now);
                    }
                }
                Step::Wait { ms } => now = now.saturating_add(Duration::from_millis(ms)),
                Step::Name { node, on } => {
                    if on {
                        want.named.insert(node);
                    } else {
                        want.named.remove(&node);
                    }
                }
                Step::Reboot { compact } => {
                    if compact {
                        log = membership.snapshot_records();
                    }
                    membership = Membership::recover(&log)
                        .map_err(|e| TestCaseError::fail(format!("recovery: {e}")))?;
                    membership.set_capacity(CAPACITY);
                    dir = fresh_conns(now);
                    want.attached.clear();
                    want.away.clear();
                    want.started = now;
                }
            }
            // The table served is the one the rules say, and the records rebuild it.
            let served: BTreeMap<String, (u64, u64, u64)> = membership
                .hosts()
                .map(|(l, m)| (l.to_owned(), (m.node.0, m.incarnation, m.boot_nonce)))
                .collect();
            prop_assert_eq!(&served, &want.members);
            let rebuilt = Membership::recover(&log)
                .map_err(|e| TestCaseError::fail(format!("recovery: {e}")))?;
            prop_assert!(rebuilt.hosts().eq(membership.hosts()));
            for (listen, m) in &want.members {
                prop_assert_eq!(membership.listen_of(NodeId(m.0)), Some(listen.as_str()));
                let connected = want.attached.contains_key(listen);
                prop_assert_eq!(dir.conn_of(NodeId(m.0)).is_some(), connected);
                prop_assert_eq!(dir.away_since(NodeId(m.0)), want.away.get(&m.0).copied());
            }
            // A forgotten node leaves nothing behind.
            for node in want
                .issued
                .iter()
                .filter(|n| membership.listen_of(NodeId(**n)).is_none())
            {
                prop_assert_eq!(
                    dir.away_since(NodeId(*node)),
                    None,
                    "forgotten node {}",
                    node
                );
                prop_assert_eq!(dir.conn_of(NodeId(*node)), None, "forgotten node {}", node);
            }
            dir.check_invariants().map_err(TestCaseError::fail)?;
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn a_full_membership_forgets_by_the_rules(steps in proptest::collection::vec(step(), 1..80)) {
            run(steps)?;
        }
    }
}

//! Retention of operation records (ARCHITECTURE "Retention of operation records"), one story
//! per rule: an issuer's declaration prunes what is below it and a pruned operation is refused
//! `OperationExpired` for good; the horizon stops below a live rendezvous; a held reservation
//! pins its record; a node's restart expires everything its earlier incarnations issued; only
//! the issuer's node incarnation speaks for it; recovery and compaction reach the same state;
//! and the operation table refuses new ids without a trace when it is full.

use dataplane_core::directory::DirectoryLimits;
use dataplane_core::error::{Limit, NamespaceError};
use dataplane_core::ids::{Address, Issuer, NodeId, OperationId};
use dataplane_core::log::LogRecord;
use dataplane_core::wire::StreamRole::{Sink, Source};
use dataplane_core::wire::{
    DirectoryCall, DirectoryRequest, GoneScope, Message, MutationReceipt, ReplyBody,
};
use dataplane_testkit::dir::*;

/// The issuer of [`CLIENT`]'s operations (lane 0 of node 1, incarnation 1).
const ISSUER: Issuer = Issuer::new(NodeId(1), 1, 0);
const S1: Address = Address::new(NodeId(2), 1, 1);
const S2: Address = Address::new(NodeId(2), 1, 2);
const E_SRC: Address = Address::new(NodeId(3), 1, 11);
const E_SNK: Address = Address::new(NodeId(4), 1, 12);
const HOST: Address = Address::new(NodeId(9), 1, 0);

/// `ISSUER`'s operation `n`, as the harness's `u128` ids.
fn iop(n: u64) -> u128 {
    ISSUER.op(n).0
}

fn done(d: &mut Dir, below: u64) -> ReplyBody {
    d.call(DirectoryRequest::OperationsDone {
        issuer: ISSUER,
        below,
    })
}

fn expired(n: u64) -> NamespaceError {
    NamespaceError::OperationExpired(ISSUER.op(n))
}

fn receipt(n: u64) -> Result<MutationReceipt, NamespaceError> {
    Ok(MutationReceipt {
        revision: dataplane_core::ids::Revision(n),
    })
}

#[test]
fn a_declared_horizon_prunes_below_it_and_a_pruned_operation_never_takes_effect() {
    let mut d = Dir::new();
    assert_eq!(
        d.register("/a", S1, iop(1)),
        ReplyBody::Registered(receipt(1))
    );
    assert_eq!(
        d.unregister("/a", iop(2)),
        ReplyBody::Unregistered(receipt(2))
    );
    assert_eq!(
        d.register("/a", S2, iop(3)),
        ReplyBody::Registered(receipt(3))
    );
    assert_eq!(d.dir.durable().operation_count(), 3);

    assert_eq!(done(&mut d, 3), ReplyBody::OperationsDone(Ok(3)));
    let durable = d.dir.durable();
    assert_eq!(
        durable.operation_count(),
        1,
        "ops 1 and 2 are pruned, 3 stays"
    );
    assert!(durable.operation(ISSUER.op(3)).is_some());
    assert_eq!(durable.horizon(ISSUER), 3);

    // A late duplicate of the Unregister (op 2) must not delete the new blob: refused, and
    // nothing changes.
    let before = d.dir.durable().clone();
    let (id, effects) = d.call_raw(DirectoryRequest::Unregister {
        path: path("/a"),
        expected_revision: None,
        operation: ISSUER.op(2),
    });
    assert_eq!(
        sends(&effects),
        vec![(
            CLIENT,
            Message::Reply(dataplane_core::wire::DirectoryReply {
                request_id: id,
                epoch: d.epoch(),
                body: ReplyBody::Unregistered(Err(expired(2))),
            })
        )]
    );
    assert!(persisted(&effects).is_empty());
    assert_eq!(*d.dir.durable(), before);
    // The same for a replayed Register, a reused id of another kind, and an open.
    assert_eq!(
        d.register("/b", S1, iop(1)),
        ReplyBody::Registered(Err(expired(1)))
    );
    let (id, effects) = d.open("/s", Source, E_SRC, iop(2));
    assert_eq!(
        reply_to(&effects, CLIENT, id),
        Some(ReplyBody::StreamOpened(Err(expired(2))))
    );
    assert_eq!(*d.dir.durable(), before);
    // The record above the horizon still answers its replay, and a new id works.
    assert_eq!(
        d.register("/a", S2, iop(3)),
        ReplyBody::Registered(receipt(3))
    );
    assert_eq!(
        d.unregister("/a", iop(4)),
        ReplyBody::Unregistered(receipt(4))
    );
    // A lower or equal declaration changes nothing and answers the horizon in effect.
    assert_eq!(done(&mut d, 2), ReplyBody::OperationsDone(Ok(3)));
}

#[test]
fn the_horizon_survives_a_restart_and_compaction_shrinks_with_it() {
    let mut d = Dir::new();
    for i in 0..50u64 {
        let source = Address::new(NodeId(2), 1, 100 + i);
        d.register("/a", source, iop(2 * i + 1));
        d.unregister("/a", iop(2 * i + 2));
    }
    let before = d.dir.snapshot_records().len();
    assert_eq!(done(&mut d, 101), ReplyBody::OperationsDone(Ok(101)));
    let after = d.dir.snapshot_records();
    assert_eq!(d.dir.durable().operation_count(), 0);
    assert_eq!(
        before - after.len(),
        100 - 1,
        "100 operations gone, one horizon kept"
    );
    assert!(after.iter().any(|r| matches!(
        r,
        LogRecord::Snapshot(dataplane_core::log::SnapshotRecord::Horizon { below: 101, .. })
    )));
    // Recovery from the log and from the compaction reach the state the live one has.
    let live = d.dir.durable().clone();
    d.restart();
    assert_eq!(*d.dir.durable(), {
        let mut l = live.clone();
        l.apply(&LogRecord::EpochAdvanced {
            epoch: d.dir.epoch(),
        })
        .unwrap();
        l
    });
    let replayed = dataplane_core::directory::DurableState::default();
    let mut from_snapshot = replayed;
    for record in &after {
        from_snapshot.apply(record).unwrap();
    }
    assert_eq!(from_snapshot, live);
    // After the restart the pruned operations are still refused.
    assert_eq!(
        d.unregister("/a", iop(100)),
        ReplyBody::Unregistered(Err(expired(100)))
    );
}

#[test]
fn the_horizon_stops_below_a_live_rendezvous_and_its_cancel_still_works() {
    let mut d = Dir::new();
    let (_, _) = d.open("/s", Source, E_SRC, iop(1));
    assert_eq!(
        d.register("/b", S1, iop(2)),
        ReplyBody::Registered(receipt(2))
    );
    // The open (op 1) is pending: the horizon stops at 1, nothing is pruned.
    assert_eq!(done(&mut d, 10), ReplyBody::OperationsDone(Ok(1)));
    assert_eq!(d.dir.durable().operation_count(), 2);
    // Its cancel still finds the record and ends the rendezvous.
    assert_eq!(
        d.call(DirectoryRequest::CancelStream {
            path: path("/s"),
            operation: ISSUER.op(1),
        }),
        ReplyBody::StreamCancelled(Ok(()))
    );
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    // Now the horizon moves past it.
    assert_eq!(done(&mut d, 10), ReplyBody::OperationsDone(Ok(10)));
    assert_eq!(d.dir.durable().operation_count(), 0);
    // A late copy of the open is refused: it can never park a ghost.
    let (id, effects) = d.open("/s", Source, E_SRC, iop(1));
    assert_eq!(
        reply_to(&effects, CLIENT, id),
        Some(ReplyBody::StreamOpened(Err(expired(1))))
    );
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    // An active rendezvous holds the horizon too, on either side.
    d.open("/t", Source, E_SRC, iop(11));
    d.open("/t", Sink, E_SNK, iop(12));
    assert_eq!(done(&mut d, 20), ReplyBody::OperationsDone(Ok(11)));
}

#[test]
fn a_held_reservation_pins_its_record_until_it_goes() {
    let mut d = Dir::new();
    let reserve = |n| DirectoryRequest::ReserveBlob {
        path: path("/r"),
        operation: ISSUER.op(n),
        owner: CLIENT,
    };
    let release = |n| DirectoryRequest::ReleaseBlobReservation {
        path: path("/r"),
        operation: ISSUER.op(n),
    };
    assert_eq!(d.call(reserve(1)), ReplyBody::BlobReserved(Ok(())));
    assert_eq!(done(&mut d, 5), ReplyBody::OperationsDone(Ok(5)));
    // Expired, but pinned: its replay still answers, and its release still releases.
    assert!(d.dir.durable().operation(ISSUER.op(1)).is_some());
    assert_eq!(d.call(reserve(1)), ReplyBody::BlobReserved(Ok(())));
    assert_eq!(
        d.call(release(1)),
        ReplyBody::BlobReservationReleased(Ok(()))
    );
    // Released: the record goes with it; a late reserve is refused, not granted again.
    assert!(d.dir.durable().operation(ISSUER.op(1)).is_none());
    assert_eq!(d.call(reserve(1)), ReplyBody::BlobReserved(Err(expired(1))));
    assert_eq!(d.dir.durable().reservation_count(), 0);
    // A release of an expired operation needs no tombstone: refused, nothing recorded.
    assert_eq!(
        d.call(release(3)),
        ReplyBody::BlobReservationReleased(Err(expired(3)))
    );
    assert_eq!(d.dir.durable().operation_count(), 0);
}

#[test]
fn a_restarted_node_expires_what_its_earlier_incarnations_issued() {
    let mut d = Dir::new();
    let other = Issuer::new(NodeId(1), 1, 3);
    d.register("/a", S1, iop(1));
    d.register("/b", S2, other.op(1).0);
    // An open issued on node 1 for an endpoint elsewhere: the node's restart ends it too.
    let (id, _) = d.open("/s", Source, E_SRC, iop(2));
    assert_eq!(done(&mut d, 1), ReplyBody::OperationsDone(Ok(1)));
    let effects = d.deliver(Message::AddressGone {
        scope: GoneScope::NodeBefore {
            node: NodeId(1),
            incarnation: 2,
        },
        reply_to: HOST,
    });
    assert_eq!(
        reply_to(&effects, CLIENT, id),
        Some(ReplyBody::StreamOpened(Err(NamespaceError::PathReplaced(
            path("/s")
        ))))
    );
    let durable = d.dir.durable();
    assert_eq!(durable.operation_count(), 0);
    assert_eq!(durable.issuer_count(), 0, "rows of ended issuers go");
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    // Every late frame of the old incarnation is refused, whatever it was.
    assert_eq!(
        d.register("/a", S1, iop(1)),
        ReplyBody::Registered(Err(expired(1)))
    );
    assert_eq!(
        d.register("/c", S1, other.op(7).0),
        ReplyBody::Registered(Err(NamespaceError::OperationExpired(other.op(7))))
    );
    // A declaration for an ended issuer changes nothing.
    assert_eq!(
        done(&mut d, 9),
        ReplyBody::OperationsDone(Ok(OperationId::SEQUENCE_END))
    );
    assert_eq!(d.dir.durable().issuer_count(), 0);
}

#[test]
fn an_issuer_speaks_only_for_its_own_node_incarnation() {
    let mut d = Dir::new();
    d.register("/a", S1, iop(1));
    let foreign = Issuer::new(NodeId(5), 1, 0);
    assert!(matches!(
        d.call(DirectoryRequest::OperationsDone {
            issuer: foreign,
            below: 10,
        }),
        ReplyBody::OperationsDone(Err(NamespaceError::Protocol(_)))
    ));
    // From node 5's first incarnation it is accepted.
    let effects = d.deliver(Message::Call(DirectoryCall {
        request_id: dataplane_core::ids::RequestId(77),
        reply_to: Address::new(NodeId(5), 1, 500),
        request: DirectoryRequest::OperationsDone {
            issuer: foreign,
            below: 10,
        },
    }));
    assert_eq!(
        persisted(&effects),
        vec![LogRecord::OperationsDone {
            issuer: foreign,
            below: 10
        }]
    );
    assert_eq!(d.dir.durable().horizon(ISSUER), 0);
}

#[test]
fn a_full_operation_table_refuses_new_ids_without_a_trace() {
    let limits = DirectoryLimits {
        operations: 2,
        ..DirectoryLimits::default()
    };
    let mut d = Dir::with_limits(limits);
    d.register("/a", S1, iop(1));
    d.register("/b", S2, iop(2));
    let before = d.dir.durable().clone();
    let full = NamespaceError::LimitReached(Limit::Operations);
    assert_eq!(
        d.unregister("/a", iop(3)),
        ReplyBody::Unregistered(Err(full.clone()))
    );
    assert_eq!(*d.dir.durable(), before, "nothing is remembered");
    assert!(full.left_no_trace());
    // A retraction has twice the room: a cancel of an unknown open is still tombstoned.
    assert_eq!(
        d.call(DirectoryRequest::CancelStream {
            path: path("/s"),
            operation: ISSUER.op(4),
        }),
        ReplyBody::StreamCancelled(Ok(()))
    );
    // Once the issuer declares its operations done there is room again, and the refused id
    // may still take effect (it left no trace).
    assert_eq!(done(&mut d, 3), ReplyBody::OperationsDone(Ok(3)));
    assert_eq!(
        d.unregister("/a", iop(3)),
        ReplyBody::Unregistered(receipt(3))
    );
}

#[test]
fn a_full_disk_refuses_new_operations_without_a_trace_and_serves_the_rest() {
    use dataplane_core::error::Reason;
    let mut d = Dir::new();
    d.register("/a", S1, iop(1));
    let why = Reason::new("no room in /data/dir");
    d.dir.set_no_space(Some(why.clone()));
    let before = d.dir.durable().clone();
    let full = NamespaceError::NoSpace(why);
    // New operations: refused before anything changes, and nothing is remembered.
    assert_eq!(
        d.register("/b", S2, iop(2)),
        ReplyBody::Registered(Err(full.clone()))
    );
    assert_eq!(
        d.unregister("/a", iop(3)),
        ReplyBody::Unregistered(Err(full.clone()))
    );
    let (id, effects) = d.open("/s", Source, E_SRC, iop(4));
    assert!(persisted(&effects).is_empty());
    assert_eq!(
        reply_to(&effects, CLIENT, id),
        Some(ReplyBody::StreamOpened(Err(full.clone())))
    );
    assert!(d.dir.rendezvous_all().next().is_none(), "no open is parked");
    assert_eq!(*d.dir.durable(), before, "nothing is remembered");
    assert!(full.left_no_trace());
    // Reads, replays of recorded operations, and retractions are still served.
    assert!(matches!(d.lookup("/a"), ReplyBody::LookedUp(Ok(_))));
    assert_eq!(
        d.register("/a", S1, iop(1)),
        ReplyBody::Registered(receipt(1))
    );
    assert_eq!(
        d.call(DirectoryRequest::CancelStream {
            path: path("/s"),
            operation: ISSUER.op(5),
        }),
        ReplyBody::StreamCancelled(Ok(()))
    );
    // Once there is room, the refused ids may still take effect.
    d.dir.set_no_space(None);
    assert_eq!(
        d.register("/b", S2, iop(2)),
        ReplyBody::Registered(receipt(2))
    );
}

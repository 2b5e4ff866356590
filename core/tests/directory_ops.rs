//! One test per directory operation and per error variant it can return (SPEC §4 as amended by
//! DESIGN.md §5 and ARCHITECTURE.md "Decisions"). Every test asserts the exact effects of the
//! step under test (records, watches, frames and replies, in order) and the durable state.

use dataplane_core::directory::{ObligationKey, Rendezvous};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::{Limit, NamespaceError, Reason};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, PERSISTENT_INCARNATION, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::limits::{FENCE_HELD_OPENS_MAX, RESERVATIONS_MAX, RETRY_BATCH_MAX};
use dataplane_core::log::{
    Entry, LogRecord, Mutation, Outcome, Rejection, RejectionKind, RequestKey, Reservation,
    SnapshotRecord,
};
use dataplane_core::path::DataPath;
use dataplane_core::time::Duration;
use dataplane_core::wire::StreamRole::{Sink, Source};
use dataplane_core::wire::{
    BlobBinding, Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, EntryKind, FileRef,
    GoneScope, Message, MutationReceipt, NamespaceNode, ReplyBody, SourceRecovery, StreamMatch,
    StreamRole,
};
use dataplane_testkit::dir::*;

// ---------------------------------------------------------------------------------------------
// Addresses used throughout.

/// Blob sources.
const S1: Address = Address::new(NodeId(2), 1, 1);
const S2: Address = Address::new(NodeId(2), 1, 2);
const S3: Address = Address::new(NodeId(2), 1, 3);
/// Stream endpoints (distinct actor numbers give distinct descriptors).
const E_SRC: Address = Address::new(NodeId(3), 1, 11);
const E_SNK: Address = Address::new(NodeId(4), 1, 12);
const E_NEW: Address = Address::new(NodeId(5), 1, 13);
const E_NEW_SNK: Address = Address::new(NodeId(6), 1, 14);
/// A second caller (another proxy).
const PROXY2: Address = Address::new(NodeId(1), 1, 7);
/// A host that reports gone addresses.
const HOST: Address = Address::new(NodeId(9), 1, 0);

// ---------------------------------------------------------------------------------------------
// Builders.

fn rev(n: u64) -> Revision {
    Revision(n)
}

fn receipt(n: u64) -> Result<MutationReceipt, NamespaceError> {
    Ok(MutationReceipt {
        revision: Revision(n),
    })
}

fn inc(epoch: u64, revision: u64) -> StreamIncarnation {
    StreamIncarnation {
        epoch: AuthorityEpoch(epoch),
        revision: Revision(revision),
    }
}

fn desc(endpoint: Address) -> Descriptor {
    Descriptor::new(vec![endpoint.actor as u8]).unwrap()
}

fn stream_match(incarnation: StreamIncarnation, source: Address, sink: Address) -> StreamMatch {
    StreamMatch {
        incarnation,
        source,
        source_descriptor: desc(source),
        sink,
        sink_descriptor: desc(sink),
        revision: incarnation.revision,
    }
}

fn register_req(
    p: &str,
    source: Address,
    operation: u128,
    reservation: Option<u128>,
) -> DirectoryRequest {
    DirectoryRequest::Register {
        path: path(p),
        source,
        source_node: source.node,
        length: 10,
        recovery: actor_recovery(source),
        operation: op(operation),
        reservation: reservation.map(op),
    }
}

fn reserve_req(p: &str, operation: u128, owner: Address) -> DirectoryRequest {
    DirectoryRequest::ReserveBlob {
        path: path(p),
        operation: op(operation),
        owner,
    }
}

fn release_req(p: &str, operation: u128) -> DirectoryRequest {
    DirectoryRequest::ReleaseBlobReservation {
        path: path(p),
        operation: op(operation),
    }
}

fn unregister_req(p: &str, operation: u128) -> DirectoryRequest {
    DirectoryRequest::Unregister {
        path: path(p),
        expected_revision: None,
        operation: op(operation),
    }
}

fn rename_req(from: &str, to: &str, replace: bool, operation: u128) -> DirectoryRequest {
    DirectoryRequest::Rename {
        source: path(from),
        destination: path(to),
        replace,
        operation: op(operation),
    }
}

fn cancel_req(p: &str, operation: u128) -> DirectoryRequest {
    DirectoryRequest::CancelStream {
        path: path(p),
        operation: op(operation),
    }
}

fn close_req(p: &str, incarnation: StreamIncarnation) -> DirectoryRequest {
    DirectoryRequest::CloseStream {
        path: path(p),
        incarnation,
    }
}

/// An ensure open without replace.
fn ensure_open(p: &str, role: StreamRole, endpoint: Address, operation: u128) -> DirectoryRequest {
    open_request(p, role, endpoint, operation, false, true, None)
}

/// An ensure open with replace.
fn replace_open(p: &str, role: StreamRole, endpoint: Address, operation: u128) -> DirectoryRequest {
    open_request(p, role, endpoint, operation, true, true, None)
}

/// A non-ensure open naming the revision the caller observed.
fn expect_open(
    p: &str,
    role: StreamRole,
    endpoint: Address,
    operation: u128,
    expected: Option<u64>,
) -> DirectoryRequest {
    open_request(
        p,
        role,
        endpoint,
        operation,
        false,
        false,
        expected.map(Revision),
    )
}

fn reg_mutation(p: &str, source: Address, reservation: Option<u128>) -> Mutation {
    Mutation::Register {
        path: path(p),
        length: 10,
        recovery: actor_recovery(source),
        reservation: reservation.map(op),
    }
}

fn reg_key(p: &str, source: Address) -> RequestKey {
    RequestKey::Register {
        path: path(p),
        length: 10,
        recovery: actor_recovery(source),
    }
}

fn bind_key(p: &str) -> RequestKey {
    RequestKey::BindStream { path: path(p) }
}

fn committed(
    operation: u128,
    revision: u64,
    mutation: Mutation,
    retire: Option<Address>,
) -> Effect {
    Effect::Persist(LogRecord::Committed {
        operation: op(operation),
        revision: Revision(revision),
        mutation,
        retire,
    })
}

fn bind_commit(operation: u128, revision: u64, p: &str, retire: Option<Address>) -> Effect {
    committed(
        operation,
        revision,
        Mutation::BindStream { path: path(p) },
        retire,
    )
}

fn joined(operation: u128, p: &str, revision: u64) -> Effect {
    Effect::Persist(LogRecord::Joined {
        operation: op(operation),
        path: path(p),
        revision: Revision(revision),
    })
}

fn rejected(operation: u128, key: RequestKey, kind: RejectionKind, p: &str) -> Effect {
    Effect::Persist(LogRecord::Rejected {
        operation: op(operation),
        key,
        rejection: Rejection {
            kind,
            path: path(p),
        },
    })
}

/// The sticky refusal of an open (key `BindStream{p}`).
fn refused(operation: u128, p: &str, kind: RejectionKind) -> Effect {
    rejected(operation, bind_key(p), kind, p)
}

fn displacement_queued(
    endpoint: Address,
    incarnation: StreamIncarnation,
    fence: Option<&str>,
) -> Effect {
    Effect::Persist(LogRecord::DisplacementQueued {
        endpoint,
        incarnation,
        fence: fence.map(path),
    })
}

fn displacement_done(endpoint: Address, incarnation: StreamIncarnation) -> Effect {
    Effect::Persist(LogRecord::DisplacementDone {
        endpoint,
        incarnation,
    })
}

/// The fenced path of the displacement obligation (endpoint, incarnation), if it is pending.
fn fence_of(
    d: &Dir,
    endpoint: Address,
    incarnation: StreamIncarnation,
) -> Option<Option<DataPath>> {
    d.dir
        .durable()
        .obligations_in_order()
        .find(|(key, _)| *key == ObligationKey::Displace(endpoint, incarnation))
        .map(|(_, fence)| fence.cloned())
}

/// Every incarnation `endpoint` still owes an acknowledgement for.
fn displacements_of(d: &Dir, endpoint: Address) -> Vec<StreamIncarnation> {
    d.dir
        .durable()
        .obligations_in_order()
        .filter_map(|(key, _)| match key {
            ObligationKey::Displace(e, incarnation) if e == endpoint => Some(incarnation),
            _ => None,
        })
        .collect()
}

fn retirement_done(source: Address) -> Effect {
    Effect::Persist(LogRecord::RetirementDone { source })
}

fn watch(target: Address) -> Effect {
    Effect::WatchRoute { target }
}

fn unwatch(target: Address) -> Effect {
    Effect::UnwatchRoute { target }
}

fn retire_frame(source: Address) -> Effect {
    Effect::Send {
        to: source,
        message: Message::Retire {
            reply_to: DIRECTORY,
        },
    }
}

fn displaced_frame(endpoint: Address, incarnation: StreamIncarnation) -> Effect {
    Effect::Send {
        to: endpoint,
        message: Message::Displaced {
            incarnation,
            reply_to: DIRECTORY,
        },
    }
}

fn reply(d: &Dir, to: Address, id: RequestId, body: ReplyBody) -> Effect {
    Effect::Send {
        to,
        message: Message::Reply(DirectoryReply {
            request_id: id,
            epoch: d.epoch(),
            body,
        }),
    }
}

fn opened(d: &Dir, id: RequestId, result: Result<StreamMatch, NamespaceError>) -> Effect {
    reply(d, CLIENT, id, ReplyBody::StreamOpened(result))
}

fn timer_at(d: &Dir) -> Effect {
    Effect::SetTimer {
        timer: Timer::DirectoryRetry,
        at: d.now.saturating_add(Duration::from_secs(1)),
    }
}

fn node(kind: EntryKind, revision: u64, active: bool) -> ReplyBody {
    ReplyBody::LookedUp(Ok(NamespaceNode {
        kind,
        revision: Revision(revision),
        active,
        lost: false,
    }))
}

fn binding(source: Address, revision: u64) -> BlobBinding {
    BlobBinding {
        source,
        source_node: source.node,
        owner: None,
        length: 10,
        revision: Revision(revision),
    }
}

fn path_exists(p: &str) -> NamespaceError {
    NamespaceError::PathExists(path(p))
}

fn path_not_found(p: &str) -> NamespaceError {
    NamespaceError::PathNotFound(path(p))
}

fn path_replaced(p: &str) -> NamespaceError {
    NamespaceError::PathReplaced(path(p))
}

fn conflict(operation: u128) -> NamespaceError {
    NamespaceError::OperationConflict(op(operation))
}

fn stale(p: &str, incarnation: StreamIncarnation) -> NamespaceError {
    NamespaceError::StaleIncarnation {
        path: path(p),
        incarnation,
    }
}

fn blob_is_not_stream(p: &str) -> NamespaceError {
    NamespaceError::WrongEntryType {
        path: path(p),
        expected: EntryKind::Stream,
        found: EntryKind::Blob,
    }
}

fn stream_is_not_blob(p: &str) -> NamespaceError {
    NamespaceError::WrongEntryType {
        path: path(p),
        expected: EntryKind::Blob,
        found: EntryKind::Stream,
    }
}

fn exhausted() -> NamespaceError {
    NamespaceError::Storage(Reason::new("revision space exhausted"))
}

/// Delivers `request` as if sent by `reply_to` with `request_id`.
fn call_from(
    d: &mut Dir,
    reply_to: Address,
    request_id: u64,
    request: DirectoryRequest,
) -> Vec<Effect> {
    d.deliver(Message::Call(DirectoryCall {
        request_id: RequestId(request_id),
        reply_to,
        request,
    }))
}

fn ack_displaced(d: &mut Dir, endpoint: Address, incarnation: StreamIncarnation) -> Vec<Effect> {
    d.deliver(Message::StreamDisplaced {
        endpoint,
        incarnation,
    })
}

fn ack_retired(d: &mut Dir, source: Address) -> Vec<Effect> {
    d.deliver(Message::SourceRetired { source })
}

fn gone(d: &mut Dir, scope: GoneScope) -> Vec<Effect> {
    d.deliver(Message::AddressGone {
        scope,
        reply_to: HOST,
    })
}

fn gone_ack(scope: GoneScope) -> Effect {
    Effect::Send {
        to: HOST,
        message: Message::GoneAcknowledged { scope },
    }
}

/// A full picture of the machine, to show that a step changed nothing at all.
fn state(d: &Dir) -> String {
    format!("{:?}", d.dir)
}

/// Runs `/s` to an active rendezvous: source `src_op` from E_SRC (parks, binding the next
/// revision), then sink `sink_op` from E_SNK. Returns the match.
fn make_active(d: &mut Dir, p: &str, src_op: u128, sink_op: u128) -> StreamMatch {
    let revision = d.dir.durable().next_revision();
    let (_, parked) = d.call_raw(ensure_open(p, Source, E_SRC, src_op));
    assert_eq!(parked, vec![bind_commit(src_op, revision.0, p, None)]);
    let (sink_id, matched) = d.call_raw(ensure_open(p, Sink, E_SNK, sink_op));
    let m = stream_match(inc(d.epoch().0, revision.0), E_SRC, E_SNK);
    assert_eq!(
        reply_to(&matched, CLIENT, sink_id),
        Some(ReplyBody::StreamOpened(Ok(m.clone())))
    );
    m
}

/// Leaves a quiescent stream node at `p` (bind by `operation`, then cancel); returns its
/// revision.
fn make_stream_node(d: &mut Dir, p: &str, operation: u128) -> u64 {
    let revision = d.dir.durable().next_revision().0;
    let (_, parked) = d.call_raw(ensure_open(p, Source, E_SRC, operation));
    assert_eq!(parked, vec![bind_commit(operation, revision, p, None)]);
    assert_eq!(
        d.call(cancel_req(p, operation)),
        ReplyBody::StreamCancelled(Ok(()))
    );
    revision
}

// =============================================================================================
// Register

#[test]
fn register_commits_and_replies_with_the_new_revision() {
    let mut d = Dir::new();
    let (id, effects) = d.call_raw(register_req("/a", S1, 1, None));
    assert_eq!(
        effects,
        vec![
            committed(1, 1, reg_mutation("/a", S1, None), None),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(1))),
        ]
    );
    assert_eq!(
        d.dir.durable().entry(&path("/a")),
        Some(&Entry::Blob {
            length: 10,
            revision: rev(1),
            recovery: actor_recovery(S1),
        })
    );
    assert_eq!(d.dir.durable().next_revision(), rev(2));
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(binding(S1, 1))));
}

#[test]
fn register_replay_returns_the_same_receipt_and_changes_nothing() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.register("/b", S2, 2);
    let before = state(&d);
    // The source address is not part of the key (only the recovery record is): a replay
    // naming another source is still a replay and must not rebind the path to it.
    let (id, effects) = d.call_raw(DirectoryRequest::Register {
        path: path("/a"),
        source: S3,
        source_node: S3.node,
        length: 10,
        recovery: actor_recovery(S1),
        operation: op(1),
        reservation: None,
    });
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::Registered(receipt(1)))]
    );
    assert_eq!(state(&d), before);
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(binding(S1, 1))));
}

#[test]
fn register_on_a_path_reserved_by_another_op_is_sticky_path_exists() {
    let mut d = Dir::new();
    assert_eq!(
        d.call(reserve_req("/a", 10, CLIENT)),
        ReplyBody::BlobReserved(Ok(()))
    );
    let (id, effects) = d.call_raw(register_req("/a", S1, 1, None));
    assert_eq!(
        effects,
        vec![
            rejected(1, reg_key("/a", S1), RejectionKind::PathExists, "/a"),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Registered(Err(path_exists("/a")))
            ),
        ]
    );
    // Quoting the wrong reservation is refused the same way.
    let (id, effects) = d.call_raw(register_req("/a", S1, 2, Some(99)));
    assert_eq!(
        effects,
        vec![
            rejected(2, reg_key("/a", S1), RejectionKind::PathExists, "/a"),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Registered(Err(path_exists("/a")))
            ),
        ]
    );
    // Sticky: once the path is free again the refused ids still answer PathExists.
    assert_eq!(
        d.call(release_req("/a", 10)),
        ReplyBody::BlobReservationReleased(Ok(()))
    );
    for operation in [1, 2] {
        let (id, effects) = d.call_raw(register_req("/a", S1, operation, None));
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Registered(Err(path_exists("/a")))
            )]
        );
    }
    assert_eq!(d.dir.durable().entry(&path("/a")), None);
    assert_eq!(d.register("/a", S1, 3), ReplyBody::Registered(receipt(1)));
}

#[test]
fn register_quoting_a_reservation_that_is_not_held_is_sticky_path_replaced() {
    let mut d = Dir::new();
    let (id, effects) = d.call_raw(register_req("/a", S1, 1, Some(10)));
    assert_eq!(
        effects,
        vec![
            rejected(1, reg_key("/a", S1), RejectionKind::PathReplaced, "/a"),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Registered(Err(path_replaced("/a")))
            ),
        ]
    );
    // Even once reservation 10 exists, op 1 stays refused and the reservation is untouched.
    assert_eq!(
        d.call(reserve_req("/a", 10, CLIENT)),
        ReplyBody::BlobReserved(Ok(()))
    );
    let (id, effects) = d.call_raw(register_req("/a", S1, 1, Some(10)));
    assert_eq!(
        effects,
        vec![reply(
            &d,
            CLIENT,
            id,
            ReplyBody::Registered(Err(path_replaced("/a")))
        )]
    );
    assert!(d.dir.durable().reservation(&path("/a")).is_some());
    // A fresh op quoting the held reservation consumes it in the same record (S21).
    let (id, effects) = d.call_raw(register_req("/a", S1, 2, Some(10)));
    assert_eq!(
        effects,
        vec![
            committed(2, 1, reg_mutation("/a", S1, Some(10)), None),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(1))),
        ]
    );
    assert_eq!(d.dir.durable().reservation(&path("/a")), None);
    assert_eq!(d.lookup("/a"), node(EntryKind::Blob, 1, false));
}

#[test]
fn register_reusing_an_op_for_another_key_is_an_operation_conflict() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.unregister("/x", 2);
    let before = state(&d);
    let other_length = DirectoryRequest::Register {
        path: path("/a"),
        source: S1,
        source_node: S1.node,
        length: 11,
        recovery: actor_recovery(S1),
        operation: op(1),
        reservation: None,
    };
    let other_recovery = DirectoryRequest::Register {
        path: path("/a"),
        source: S1,
        source_node: S1.node,
        length: 10,
        recovery: SourceRecovery::Actor {
            actor: S1,
            node: S1.node,
            owner: Some(CLIENT),
        },
        operation: op(1),
        reservation: None,
    };
    for (request, operation) in [
        (register_req("/b", S1, 1, None), 1),
        (other_length, 1),
        (other_recovery, 1),
        (register_req("/x", S1, 2, None), 2),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Registered(Err(conflict(operation)))
            )]
        );
    }
    assert_eq!(state(&d), before);
}

#[test]
fn register_over_a_live_source_retires_it_durably_and_at_once() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    let (id, effects) = d.call_raw(register_req("/a", S2, 2, None));
    assert_eq!(
        effects,
        vec![
            committed(2, 2, reg_mutation("/a", S2, None), Some(S1)),
            watch(S1),
            retire_frame(S1),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(2))),
        ]
    );
    let obligations: Vec<_> = d
        .dir
        .durable()
        .obligations_in_order()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(obligations, vec![ObligationKey::Retire(S1)]);
    // Registering the same source again retires nothing.
    let (id, effects) = d.call_raw(register_req("/a", S2, 3, None));
    assert_eq!(
        effects,
        vec![
            committed(3, 3, reg_mutation("/a", S2, None), None),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(3))),
        ]
    );
    assert_eq!(d.dir.durable().obligation_count(), 1);
}

#[test]
fn register_on_an_exhausted_revision_space_is_storage_and_not_sticky() {
    let mut d = Dir::new();
    d.log = vec![LogRecord::Snapshot(SnapshotRecord::Header {
        epoch: AuthorityEpoch(1),
        next_revision: Revision(u64::MAX),
    })];
    d.restart();
    assert_eq!(d.epoch(), AuthorityEpoch(2));
    let durable = d.dir.durable().clone();
    for _ in 0..2 {
        let (id, effects) = d.call_raw(register_req("/a", S1, 1, None));
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Registered(Err(exhausted()))
            )]
        );
    }
    assert_eq!(d.dir.durable(), &durable);
    assert!(d.dir.durable().operation(op(1)).is_none());
}

#[test]
fn every_revision_allocator_answers_storage_on_exhaustion() {
    let mut d = Dir::new();
    d.log = vec![
        LogRecord::Snapshot(SnapshotRecord::Header {
            epoch: AuthorityEpoch(1),
            next_revision: Revision(u64::MAX - 1),
        }),
        LogRecord::Snapshot(SnapshotRecord::Entry {
            path: path("/a"),
            entry: Entry::Blob {
                length: 10,
                revision: rev(5),
                recovery: actor_recovery(S1),
            },
        }),
    ];
    d.restart();
    // The last allocatable revision is u64::MAX - 1.
    assert_eq!(
        d.register("/b", S2, 1),
        ReplyBody::Registered(receipt(u64::MAX - 1))
    );
    let before = state(&d);
    assert_eq!(
        d.register("/c", S3, 2),
        ReplyBody::Registered(Err(exhausted()))
    );
    assert_eq!(
        d.unregister("/a", 3),
        ReplyBody::Unregistered(Err(exhausted()))
    );
    assert_eq!(
        d.call(rename_req("/a", "/d", false, 4)),
        ReplyBody::Renamed(Err(exhausted()))
    );
    let (id, effects) = d.call_raw(ensure_open("/s", Source, E_SRC, 5));
    assert_eq!(effects, vec![opened(&d, id, Err(exhausted()))]);
    assert_eq!(state(&d), before);
}

// =============================================================================================
// Resolve

#[test]
fn resolve_returns_the_binding_with_the_recorded_owner() {
    let mut d = Dir::new();
    let request = DirectoryRequest::Register {
        path: path("/a"),
        source: S1,
        source_node: S1.node,
        length: 77,
        recovery: SourceRecovery::Actor {
            actor: S1,
            node: S1.node,
            owner: Some(CLIENT),
        },
        operation: op(1),
        reservation: None,
    };
    assert_eq!(d.call(request), ReplyBody::Registered(receipt(1)));
    let expected = BlobBinding {
        source: S1,
        source_node: S1.node,
        owner: Some(CLIENT),
        length: 77,
        revision: rev(1),
    };
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(expected)));
    // S8a: an Actor recovery resolves identically after a restart.
    d.restart();
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(expected)));
}

#[test]
fn resolve_of_a_stream_is_wrong_entry_type() {
    let mut d = Dir::new();
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    assert_eq!(
        d.resolve("/s"),
        ReplyBody::Resolved(Err(stream_is_not_blob("/s")))
    );
    make_stream_node(&mut d, "/t", 2);
    assert_eq!(
        d.resolve("/t"),
        ReplyBody::Resolved(Err(stream_is_not_blob("/t")))
    );
}

#[test]
fn resolve_of_nothing_is_path_not_found_even_when_reserved() {
    let mut d = Dir::new();
    assert_eq!(
        d.resolve("/a"),
        ReplyBody::Resolved(Err(path_not_found("/a")))
    );
    // Q17, kept on purpose: Resolve does not look at reservations (Lookup does).
    d.call(reserve_req("/a", 1, CLIENT));
    assert_eq!(
        d.resolve("/a"),
        ReplyBody::Resolved(Err(path_not_found("/a")))
    );
}

#[test]
fn a_file_binding_keeps_its_persistent_source_across_restarts_and_node_floors() {
    // Issue 17: a file blob's source is an actor of PERSISTENT_INCARNATION on its host.
    let persistent = Address::new(S1.node, PERSISTENT_INCARNATION, 7);
    let mut d = Dir::new();
    let file = SourceRecovery::File {
        path: FileRef::new("/var/blobs/f").unwrap(),
        source: persistent,
    };
    let request = DirectoryRequest::Register {
        path: path("/f"),
        source: persistent,
        source_node: S1.node,
        length: 10,
        recovery: file,
        operation: op(1),
        reservation: None,
    };
    assert_eq!(d.call(request), ReplyBody::Registered(receipt(1)));
    assert_eq!(
        d.resolve("/f"),
        ReplyBody::Resolved(Ok(binding(persistent, 1)))
    );
    // SPEC S8a: the restarted directory answers the same length and revision (and here the
    // same source, which serves in every life of its node).
    d.restart();
    assert_eq!(
        d.resolve("/f"),
        ReplyBody::Resolved(Ok(binding(persistent, 1)))
    );
    // The host restarts: its arena blobs are lost, its file blobs are not.
    let scope = GoneScope::NodeBefore {
        node: S1.node,
        incarnation: 5,
    };
    let _ = gone(&mut d, scope);
    assert_eq!(
        d.resolve("/f"),
        ReplyBody::Resolved(Ok(binding(persistent, 1)))
    );
    assert_eq!(d.lookup("/f"), node(EntryKind::Blob, 1, false));
    // Replacing it (from the node's new life) retires the persistent source.
    let newer = Address::new(S1.node, 5, 2);
    let (id, effects) = d.call_raw(register_req("/f", newer, 2, None));
    assert_eq!(
        effects,
        vec![
            committed(2, 2, reg_mutation("/f", newer, None), Some(persistent)),
            Effect::WatchRoute { target: persistent },
            retire_frame(persistent),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(2))),
        ]
    );
}

// =============================================================================================
// Lookup

#[test]
fn lookup_reports_blobs_and_streams_with_activity() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    assert_eq!(d.lookup("/a"), node(EntryKind::Blob, 1, false));
    let r = make_stream_node(&mut d, "/s", 2);
    assert_eq!(d.lookup("/s"), node(EntryKind::Stream, r, false));
    // Pending: active.
    let _ = d.call_raw(ensure_open("/p", Source, E_SRC, 3));
    assert_eq!(d.lookup("/p"), node(EntryKind::Stream, 3, true));
    // Active: active.
    let _ = d.call_raw(ensure_open("/p", Sink, E_SNK, 4));
    assert_eq!(d.lookup("/p"), node(EntryKind::Stream, 3, true));
    // Closed: inactive again, same revision.
    d.call(close_req("/p", inc(1, 3)));
    assert_eq!(d.lookup("/p"), node(EntryKind::Stream, 3, false));
}

#[test]
fn lookup_of_a_reserved_path_is_path_exists() {
    let mut d = Dir::new();
    d.call(reserve_req("/a", 1, CLIENT));
    assert_eq!(d.lookup("/a"), ReplyBody::LookedUp(Err(path_exists("/a"))));
}

#[test]
fn lookup_of_nothing_is_path_not_found() {
    let mut d = Dir::new();
    let (id, effects) = d.call_raw(DirectoryRequest::Lookup { path: path("/a") });
    assert_eq!(
        effects,
        vec![reply(
            &d,
            CLIENT,
            id,
            ReplyBody::LookedUp(Err(path_not_found("/a")))
        )]
    );
}

// =============================================================================================
// ReserveBlob

#[test]
fn reserve_blob_persists_the_reservation() {
    let mut d = Dir::new();
    let (id, effects) = d.call_raw(reserve_req("/a", 1, CLIENT));
    assert_eq!(
        effects,
        vec![
            Effect::Persist(LogRecord::Reserved {
                operation: op(1),
                path: path("/a"),
                owner: CLIENT,
            }),
            reply(&d, CLIENT, id, ReplyBody::BlobReserved(Ok(()))),
        ]
    );
    assert_eq!(
        d.dir.durable().reservation(&path("/a")),
        Some(&Reservation {
            operation: op(1),
            owner: CLIENT,
        })
    );
    // Durable: it survives a restart.
    d.restart();
    assert_eq!(d.lookup("/a"), ReplyBody::LookedUp(Err(path_exists("/a"))));
}

#[test]
fn reserve_blob_replay_answers_ok_and_never_recreates_a_reservation() {
    let mut d = Dir::new();
    d.call(reserve_req("/a", 1, CLIENT));
    let before = state(&d);
    let (id, effects) = d.call_raw(reserve_req("/a", 1, CLIENT));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::BlobReserved(Ok(())))]
    );
    assert_eq!(state(&d), before);
    // Consumed by a Register: the replay answers Ok and creates nothing.
    d.call(register_req("/a", S1, 2, Some(1)));
    d.unregister("/a", 3);
    let (id, effects) = d.call_raw(reserve_req("/a", 1, CLIENT));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::BlobReserved(Ok(())))]
    );
    assert_eq!(d.dir.durable().reservation_count(), 0);
    // Released: same.
    d.call(reserve_req("/b", 4, CLIENT));
    d.call(release_req("/b", 4));
    let (id, effects) = d.call_raw(reserve_req("/b", 4, CLIENT));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::BlobReserved(Ok(())))]
    );
    assert_eq!(d.dir.durable().reservation_count(), 0);
}

#[test]
fn reserve_blob_on_an_occupied_or_reserved_path_is_sticky_path_exists() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    make_stream_node(&mut d, "/s", 2);
    d.call(reserve_req("/r", 3, CLIENT));
    for (p, operation) in [("/a", 10), ("/s", 11), ("/r", 12)] {
        let (id, effects) = d.call_raw(reserve_req(p, operation, PROXY2));
        assert_eq!(
            effects,
            vec![
                rejected(
                    operation,
                    RequestKey::Reserve { path: path(p) },
                    RejectionKind::PathExists,
                    p
                ),
                reply(&d, CLIENT, id, ReplyBody::BlobReserved(Err(path_exists(p)))),
            ]
        );
    }
    // Free all three paths: the refused ids stay refused (DESIGN Q4: a late duplicate of a
    // refused reserve never strands a reservation).
    d.unregister("/a", 20);
    d.unregister("/s", 21);
    d.call(release_req("/r", 3));
    for (p, operation) in [("/a", 10), ("/s", 11), ("/r", 12)] {
        let (id, effects) = d.call_raw(reserve_req(p, operation, PROXY2));
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::BlobReserved(Err(path_exists(p)))
            )]
        );
    }
    assert_eq!(d.dir.durable().reservation_count(), 0);
}

#[test]
fn reserve_blob_reusing_an_op_is_an_operation_conflict() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.call(reserve_req("/r", 2, CLIENT));
    let before = state(&d);
    for (p, operation) in [("/b", 1), ("/other", 2)] {
        let (id, effects) = d.call_raw(reserve_req(p, operation, CLIENT));
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::BlobReserved(Err(conflict(operation)))
            )]
        );
    }
    assert_eq!(state(&d), before);
}

#[test]
fn reserve_blob_beyond_the_limit_is_sticky_limit_reached() {
    let mut d = Dir::new();
    // Fill the table without the harness's per-step invariant check (O(state) each). The
    // ids come from two issuers (lanes 1 and 2), each below its own bound of records.
    let filler = |i: usize| ((1 + (i % 2) as u128) << 56) | (1_000_000 + i as u128);
    for i in 0..RESERVATIONS_MAX {
        let call = DirectoryCall {
            request_id: RequestId(1_000_000 + i as u64),
            reply_to: CLIENT,
            request: reserve_req(&format!("/r/{i}"), filler(i), CLIENT),
        };
        let mut out = Outbox::new();
        d.dir
            .handle_message(d.now, Message::Call(call), &mut out)
            .unwrap();
        let effects = out.take();
        assert_eq!(effects.len(), 2, "reservation {i}: {effects:?}");
        for effect in effects {
            if let Effect::Persist(record) = effect {
                d.log.push(record);
            }
        }
    }
    d.dir.check_invariants().unwrap();
    assert_eq!(d.dir.durable().reservation_count(), RESERVATIONS_MAX);
    let before = d.dir.durable().clone();
    let (id, effects) = d.call_raw(reserve_req("/full", 1, CLIENT));
    assert_eq!(
        effects,
        vec![
            rejected(
                1,
                RequestKey::Reserve {
                    path: path("/full")
                },
                RejectionKind::LimitReached(Limit::Reservations),
                "/full"
            ),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::BlobReserved(Err(NamespaceError::LimitReached(Limit::Reservations)))
            )
        ]
    );
    assert_eq!(
        d.dir.durable().reservation_count(),
        before.reservation_count()
    );
    // Sticky: even once one is released the same id keeps answering LimitReached, and a fresh
    // id succeeds.
    assert_eq!(
        d.call(release_req("/r/0", filler(0))),
        ReplyBody::BlobReservationReleased(Ok(()))
    );
    assert_eq!(
        d.call(reserve_req("/full", 1, CLIENT)),
        ReplyBody::BlobReserved(Err(NamespaceError::LimitReached(Limit::Reservations)))
    );
    assert_eq!(
        d.call(reserve_req("/full", 2, CLIENT)),
        ReplyBody::BlobReserved(Ok(()))
    );
    assert_eq!(d.dir.durable().reservation_count(), RESERVATIONS_MAX);
}

// =============================================================================================
// ReleaseBlobReservation

#[test]
fn release_by_the_holder_frees_the_path() {
    let mut d = Dir::new();
    d.call(reserve_req("/a", 1, CLIENT));
    let (id, effects) = d.call_raw(release_req("/a", 1));
    assert_eq!(
        effects,
        vec![
            Effect::Persist(LogRecord::ReservationReleased { path: path("/a") }),
            reply(&d, CLIENT, id, ReplyBody::BlobReservationReleased(Ok(()))),
        ]
    );
    assert_eq!(
        d.lookup("/a"),
        ReplyBody::LookedUp(Err(path_not_found("/a")))
    );
    // A duplicate release answers Ok and changes nothing.
    let before = state(&d);
    let (id, effects) = d.call_raw(release_req("/a", 1));
    assert_eq!(
        effects,
        vec![reply(
            &d,
            CLIENT,
            id,
            ReplyBody::BlobReservationReleased(Ok(()))
        )]
    );
    assert_eq!(state(&d), before);
    // Another op can now reserve the path.
    assert_eq!(
        d.call(reserve_req("/a", 2, PROXY2)),
        ReplyBody::BlobReserved(Ok(()))
    );
}

#[test]
fn release_of_a_consumed_reservation_is_ok_and_changes_nothing() {
    let mut d = Dir::new();
    d.call(reserve_req("/a", 1, CLIENT));
    d.call(register_req("/a", S1, 2, Some(1)));
    let before = state(&d);
    let (id, effects) = d.call_raw(release_req("/a", 1));
    assert_eq!(
        effects,
        vec![reply(
            &d,
            CLIENT,
            id,
            ReplyBody::BlobReservationReleased(Ok(()))
        )]
    );
    assert_eq!(state(&d), before);
}

#[test]
fn release_of_an_unknown_id_tombstones_it() {
    let mut d = Dir::new();
    let (id, effects) = d.call_raw(release_req("/a", 7));
    assert_eq!(
        effects,
        vec![
            rejected(
                7,
                RequestKey::Reserve { path: path("/a") },
                RejectionKind::PathReplaced,
                "/a"
            ),
            reply(&d, CLIENT, id, ReplyBody::BlobReservationReleased(Ok(()))),
        ]
    );
    // The delayed reserve with that id is refused and reserves nothing.
    let (id, effects) = d.call_raw(reserve_req("/a", 7, CLIENT));
    assert_eq!(
        effects,
        vec![reply(
            &d,
            CLIENT,
            id,
            ReplyBody::BlobReserved(Err(path_replaced("/a")))
        )]
    );
    assert_eq!(d.dir.durable().reservation_count(), 0);
    assert_eq!(
        d.lookup("/a"),
        ReplyBody::LookedUp(Err(path_not_found("/a")))
    );
}

#[test]
fn release_of_an_unknown_id_leaves_another_ops_reservation_alone() {
    let mut d = Dir::new();
    d.call(reserve_req("/a", 1, CLIENT));
    let (id, effects) = d.call_raw(release_req("/a", 2));
    assert_eq!(
        effects,
        vec![
            rejected(
                2,
                RequestKey::Reserve { path: path("/a") },
                RejectionKind::PathReplaced,
                "/a"
            ),
            reply(&d, CLIENT, id, ReplyBody::BlobReservationReleased(Ok(()))),
        ]
    );
    assert_eq!(
        d.dir.durable().reservation(&path("/a")),
        Some(&Reservation {
            operation: op(1),
            owner: CLIENT,
        })
    );
}

#[test]
fn release_reusing_an_op_is_an_operation_conflict() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.call(reserve_req("/r", 2, CLIENT));
    let before = state(&d);
    for (p, operation) in [("/a", 1), ("/other", 2)] {
        let (id, effects) = d.call_raw(release_req(p, operation));
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::BlobReservationReleased(Err(conflict(operation)))
            )]
        );
    }
    assert_eq!(state(&d), before);
    assert!(d.dir.durable().reservation(&path("/r")).is_some());
}

// =============================================================================================
// Unregister

#[test]
fn unregister_of_a_blob_retires_its_source() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    let (id, effects) = d.call_raw(unregister_req("/a", 2));
    assert_eq!(
        effects,
        vec![
            committed(
                2,
                2,
                Mutation::Unregister {
                    path: path("/a"),
                    expected_revision: None,
                },
                Some(S1)
            ),
            watch(S1),
            retire_frame(S1),
            reply(&d, CLIENT, id, ReplyBody::Unregistered(receipt(2))),
        ]
    );
    assert_eq!(d.dir.durable().entry(&path("/a")), None);
    assert_eq!(d.dir.source(&path("/a")), None);
    assert_eq!(
        d.lookup("/a"),
        ReplyBody::LookedUp(Err(path_not_found("/a")))
    );
}

#[test]
fn unregister_of_a_quiescent_stream_node() {
    let mut d = Dir::new();
    let r = make_stream_node(&mut d, "/s", 1);
    let (id, effects) = d.call_raw(unregister_req("/s", 2));
    assert_eq!(
        effects,
        vec![
            committed(
                2,
                r + 1,
                Mutation::Unregister {
                    path: path("/s"),
                    expected_revision: None,
                },
                None
            ),
            reply(&d, CLIENT, id, ReplyBody::Unregistered(receipt(r + 1))),
        ]
    );
    assert_eq!(
        d.lookup("/s"),
        ReplyBody::LookedUp(Err(path_not_found("/s")))
    );
}

#[test]
fn unregister_replay_returns_the_same_receipt() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    assert_eq!(d.unregister("/a", 2), ReplyBody::Unregistered(receipt(2)));
    d.register("/a", S2, 3);
    let before = state(&d);
    let (id, effects) = d.call_raw(unregister_req("/a", 2));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::Unregistered(receipt(2)))]
    );
    assert_eq!(state(&d), before);
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(binding(S2, 3))));
}

#[test]
fn unregister_of_a_live_stream_is_sticky_wrong_entry_type() {
    let mut d = Dir::new();
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let (id, effects) = d.call_raw(unregister_req("/s", 5));
    let key = RequestKey::Unregister {
        path: path("/s"),
        expected_revision: None,
    };
    let live = RejectionKind::WrongEntryType {
        expected: EntryKind::Blob,
        found: EntryKind::Stream,
    };
    assert_eq!(
        effects,
        vec![
            rejected(5, key, live, "/s"),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Unregistered(Err(stream_is_not_blob("/s")))
            )
        ]
    );
    // Sticky (unlike the reference): once the rendezvous ends, a late copy of the same
    // Unregister still answers WrongEntryType and deletes nothing; a fresh id succeeds.
    let _ = d.call_raw(ensure_open("/s", Sink, E_SNK, 2));
    d.call(close_req("/s", inc(1, 1)));
    let before = state(&d);
    assert_eq!(
        d.unregister("/s", 5),
        ReplyBody::Unregistered(Err(stream_is_not_blob("/s")))
    );
    assert_eq!(state(&d), before);
    assert_eq!(d.unregister("/s", 6), ReplyBody::Unregistered(receipt(2)));
}

#[test]
fn unregister_of_a_reserved_path_is_sticky_path_exists() {
    let mut d = Dir::new();
    d.call(reserve_req("/a", 1, CLIENT));
    let (id, effects) = d.call_raw(unregister_req("/a", 2));
    assert_eq!(
        effects,
        vec![
            rejected(
                2,
                RequestKey::Unregister {
                    path: path("/a"),
                    expected_revision: None,
                },
                RejectionKind::PathExists,
                "/a"
            ),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Unregistered(Err(path_exists("/a")))
            ),
        ]
    );
    d.call(register_req("/a", S1, 3, Some(1)));
    assert_eq!(
        d.unregister("/a", 2),
        ReplyBody::Unregistered(Err(path_exists("/a")))
    );
    assert_eq!(d.lookup("/a"), node(EntryKind::Blob, 1, false));
}

#[test]
fn unregister_of_nothing_is_sticky_path_not_found() {
    let mut d = Dir::new();
    let (id, effects) = d.call_raw(unregister_req("/a", 1));
    assert_eq!(
        effects,
        vec![
            rejected(
                1,
                RequestKey::Unregister {
                    path: path("/a"),
                    expected_revision: None,
                },
                RejectionKind::PathNotFound,
                "/a"
            ),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Unregistered(Err(path_not_found("/a")))
            ),
        ]
    );
    d.register("/a", S1, 2);
    let (id, effects) = d.call_raw(unregister_req("/a", 1));
    assert_eq!(
        effects,
        vec![reply(
            &d,
            CLIENT,
            id,
            ReplyBody::Unregistered(Err(path_not_found("/a")))
        )]
    );
    assert_eq!(d.lookup("/a"), node(EntryKind::Blob, 1, false));
}

#[test]
fn q2_unregister_replay_comes_before_the_live_stream_check() {
    let mut d = Dir::new();
    let r = make_stream_node(&mut d, "/s", 1);
    assert_eq!(
        d.unregister("/s", 2),
        ReplyBody::Unregistered(receipt(r + 1))
    );
    // A new rendezvous lives on the path when the duplicate arrives.
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 3));
    let before = state(&d);
    let (id, effects) = d.call_raw(unregister_req("/s", 2));
    assert_eq!(
        effects,
        vec![reply(
            &d,
            CLIENT,
            id,
            ReplyBody::Unregistered(receipt(r + 1))
        )]
    );
    assert_eq!(state(&d), before);
}

// =============================================================================================
// Rename

#[test]
fn rename_moves_a_blob_and_its_source_to_a_new_revision() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    let (id, effects) = d.call_raw(rename_req("/a", "/b", false, 2));
    assert_eq!(
        effects,
        vec![
            committed(
                2,
                2,
                Mutation::Rename {
                    source: path("/a"),
                    destination: path("/b"),
                    replace: false,
                },
                None
            ),
            reply(&d, CLIENT, id, ReplyBody::Renamed(receipt(2))),
        ]
    );
    assert_eq!(
        d.lookup("/a"),
        ReplyBody::LookedUp(Err(path_not_found("/a")))
    );
    assert_eq!(d.resolve("/b"), ReplyBody::Resolved(Ok(binding(S1, 2))));
    assert_eq!(
        d.dir.durable().entry(&path("/b")),
        Some(&Entry::Blob {
            length: 10,
            revision: rev(2),
            recovery: actor_recovery(S1),
        })
    );
    // Replay.
    let before = state(&d);
    let (id, effects) = d.call_raw(rename_req("/a", "/b", false, 2));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::Renamed(receipt(2)))]
    );
    assert_eq!(state(&d), before);
}

#[test]
fn rename_moves_a_stream_node() {
    let mut d = Dir::new();
    let r = make_stream_node(&mut d, "/s", 1);
    assert_eq!(
        d.call(rename_req("/s", "/t", false, 2)),
        ReplyBody::Renamed(receipt(r + 1))
    );
    assert_eq!(
        d.lookup("/s"),
        ReplyBody::LookedUp(Err(path_not_found("/s")))
    );
    assert_eq!(d.lookup("/t"), node(EntryKind::Stream, r + 1, false));
    assert_eq!(
        d.dir.durable().entry(&path("/t")),
        Some(&Entry::Stream {
            revision: rev(r + 1)
        })
    );
}

#[test]
fn rename_onto_itself_bumps_the_revision() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    let (id, effects) = d.call_raw(rename_req("/a", "/a", false, 2));
    assert_eq!(
        effects,
        vec![
            committed(
                2,
                2,
                Mutation::Rename {
                    source: path("/a"),
                    destination: path("/a"),
                    replace: false,
                },
                None
            ),
            reply(&d, CLIENT, id, ReplyBody::Renamed(receipt(2))),
        ]
    );
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(binding(S1, 2))));
    assert_eq!(d.dir.durable().obligation_count(), 0);
}

#[test]
fn rename_with_replace_retires_the_destinations_source() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.register("/b", S2, 2);
    let (id, effects) = d.call_raw(rename_req("/a", "/b", true, 3));
    assert_eq!(
        effects,
        vec![
            committed(
                3,
                3,
                Mutation::Rename {
                    source: path("/a"),
                    destination: path("/b"),
                    replace: true,
                },
                Some(S2)
            ),
            watch(S2),
            retire_frame(S2),
            reply(&d, CLIENT, id, ReplyBody::Renamed(receipt(3))),
        ]
    );
    assert_eq!(d.resolve("/b"), ReplyBody::Resolved(Ok(binding(S1, 3))));
    assert_eq!(
        d.lookup("/a"),
        ReplyBody::LookedUp(Err(path_not_found("/a")))
    );
}

#[test]
fn rename_of_nothing_is_sticky_path_not_found() {
    let mut d = Dir::new();
    let key = RequestKey::Rename {
        source: path("/x"),
        destination: path("/y"),
        replace: false,
    };
    let (id, effects) = d.call_raw(rename_req("/x", "/y", false, 1));
    assert_eq!(
        effects,
        vec![
            rejected(1, key, RejectionKind::PathNotFound, "/x"),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Renamed(Err(path_not_found("/x")))
            ),
        ]
    );
    d.register("/x", S1, 2);
    assert_eq!(
        d.call(rename_req("/x", "/y", false, 1)),
        ReplyBody::Renamed(Err(path_not_found("/x")))
    );
    assert_eq!(d.lookup("/x"), node(EntryKind::Blob, 1, false));
}

#[test]
fn rename_of_a_reserved_source_is_path_not_found() {
    // A reserved path never holds an entry, so SPEC §4.4 step 3 (source missing) fires before
    // step 4 (source reserved): the reserved-source PathExists branch is unreachable.
    let mut d = Dir::new();
    d.call(reserve_req("/r", 1, CLIENT));
    assert_eq!(
        d.call(rename_req("/r", "/y", false, 2)),
        ReplyBody::Renamed(Err(path_not_found("/r")))
    );
}

#[test]
fn rename_onto_a_reserved_destination_is_sticky_path_exists() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.call(reserve_req("/r", 2, CLIENT));
    let key = RequestKey::Rename {
        source: path("/a"),
        destination: path("/r"),
        replace: true,
    };
    let (id, effects) = d.call_raw(rename_req("/a", "/r", true, 3));
    assert_eq!(
        effects,
        vec![
            rejected(3, key, RejectionKind::PathExists, "/r"),
            reply(&d, CLIENT, id, ReplyBody::Renamed(Err(path_exists("/r")))),
        ]
    );
    d.call(release_req("/r", 2));
    assert_eq!(
        d.call(rename_req("/a", "/r", true, 3)),
        ReplyBody::Renamed(Err(path_exists("/r")))
    );
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(binding(S1, 1))));
}

#[test]
fn rename_onto_an_occupied_destination_without_replace_is_sticky_path_exists() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.register("/b", S2, 2);
    let key = RequestKey::Rename {
        source: path("/a"),
        destination: path("/b"),
        replace: false,
    };
    let (id, effects) = d.call_raw(rename_req("/a", "/b", false, 3));
    assert_eq!(
        effects,
        vec![
            rejected(3, key, RejectionKind::PathExists, "/b"),
            reply(&d, CLIENT, id, ReplyBody::Renamed(Err(path_exists("/b")))),
        ]
    );
    // A stream node at the destination counts as occupied too.
    make_stream_node(&mut d, "/s", 4);
    assert_eq!(
        d.call(rename_req("/a", "/s", false, 5)),
        ReplyBody::Renamed(Err(path_exists("/s")))
    );
    // Sticky.
    d.unregister("/b", 6);
    assert_eq!(
        d.call(rename_req("/a", "/b", false, 3)),
        ReplyBody::Renamed(Err(path_exists("/b")))
    );
    assert_eq!(d.resolve("/a"), ReplyBody::Resolved(Ok(binding(S1, 1))));
}

#[test]
fn rename_touching_a_live_stream_is_sticky_stream_active() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 2));
    // Source side pending.
    let key = RequestKey::Rename {
        source: path("/s"),
        destination: path("/t"),
        replace: false,
    };
    let (id, effects) = d.call_raw(rename_req("/s", "/t", false, 3));
    assert_eq!(
        effects,
        vec![
            rejected(3, key, RejectionKind::StreamActive, "/s"),
            reply(
                &d,
                CLIENT,
                id,
                ReplyBody::Renamed(Err(NamespaceError::StreamActive(path("/s"))))
            ),
        ]
    );
    // Destination side active.
    let _ = d.call_raw(ensure_open("/s", Sink, E_SNK, 4));
    assert_eq!(
        d.call(rename_req("/a", "/s", true, 5)),
        ReplyBody::Renamed(Err(NamespaceError::StreamActive(path("/s"))))
    );
    // Sticky after the stream closed.
    d.call(close_req("/s", inc(1, 2)));
    assert_eq!(
        d.call(rename_req("/s", "/t", false, 3)),
        ReplyBody::Renamed(Err(NamespaceError::StreamActive(path("/s"))))
    );
    assert_eq!(
        d.call(rename_req("/a", "/s", true, 5)),
        ReplyBody::Renamed(Err(NamespaceError::StreamActive(path("/s"))))
    );
    // A new id works.
    assert_eq!(
        d.call(rename_req("/s", "/t", false, 6)),
        ReplyBody::Renamed(receipt(3))
    );
}

// =============================================================================================
// OpenStream

#[test]
fn open_parks_the_first_opener_without_a_reply() {
    let mut d = Dir::new();
    let (_, effects) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    assert_eq!(effects, vec![bind_commit(1, 1, "/s", None)]);
    match d.dir.rendezvous(&path("/s")) {
        Some(Rendezvous::Pending(p)) => {
            assert_eq!(p.revision, rev(1));
            assert_eq!(p.opened_from, None);
            assert_eq!(p.request.operation, op(1));
        }
        other => panic!("expected a pending rendezvous, got {other:?}"),
    }
    assert_eq!(
        d.dir.durable().entry(&path("/s")),
        Some(&Entry::Stream { revision: rev(1) })
    );
}

#[test]
fn open_of_the_other_role_matches_and_both_get_the_same_match() {
    let mut d = Dir::new();
    let (first, _) = d.call_raw(ensure_open("/s", Sink, E_SNK, 1));
    let (second, effects) = d.call_raw(ensure_open("/s", Source, E_SRC, 2));
    let m = stream_match(inc(1, 1), E_SRC, E_SNK);
    assert_eq!(
        effects,
        vec![
            joined(2, "/s", 1),
            opened(&d, first, Ok(m.clone())),
            opened(&d, second, Ok(m.clone())),
        ]
    );
    match d.dir.rendezvous(&path("/s")) {
        Some(Rendezvous::Active(a)) => {
            assert_eq!(a.matched, m);
            assert_eq!(a.source_op, op(2));
            assert_eq!(a.sink_op, op(1));
        }
        other => panic!("expected an active rendezvous, got {other:?}"),
    }
    let row = d.dir.durable().operation(op(2)).unwrap();
    assert_eq!(row.key, bind_key("/s"));
    assert_eq!(row.outcome, Outcome::Committed(rev(1)));
}

#[test]
fn own_pending_retry_refreshes_the_reply_routing() {
    let mut d = Dir::new();
    let (_, _) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let durable = d.dir.durable().clone();
    let effects = call_from(&mut d, PROXY2, 900, ensure_open("/s", Source, E_SRC, 1));
    assert_eq!(effects, vec![]);
    assert_eq!(d.dir.durable(), &durable);
    match d.dir.rendezvous(&path("/s")) {
        Some(Rendezvous::Pending(p)) => {
            assert_eq!(p.request.reply_to, PROXY2);
            assert_eq!(p.request.request_id, RequestId(900));
            assert_eq!(p.revision, rev(1));
        }
        other => panic!("expected a pending rendezvous, got {other:?}"),
    }
    let (sink, effects) = d.call_raw(ensure_open("/s", Sink, E_SNK, 2));
    let m = stream_match(inc(1, 1), E_SRC, E_SNK);
    assert_eq!(
        effects,
        vec![
            joined(2, "/s", 1),
            reply(
                &d,
                PROXY2,
                RequestId(900),
                ReplyBody::StreamOpened(Ok(m.clone()))
            ),
            opened(&d, sink, Ok(m)),
        ]
    );
}

#[test]
fn own_pending_retry_with_another_role_or_endpoint_is_an_operation_conflict() {
    let mut d = Dir::new();
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let before = state(&d);
    for request in [
        ensure_open("/s", Sink, E_SRC, 1),
        ensure_open("/s", Source, E_NEW, 1),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(effects, vec![opened(&d, id, Err(conflict(1)))]);
    }
    assert_eq!(state(&d), before);
}

#[test]
fn q3_own_active_retry_of_a_non_ensure_open_returns_the_match() {
    let mut d = Dir::new();
    let r = make_stream_node(&mut d, "/s", 1);
    // Both peers observed revision r. The first bind moves the node to r + 1; the second
    // joins through the opened-from exception.
    let (a, effects) = d.call_raw(expect_open("/s", Source, E_SRC, 2, Some(r)));
    assert_eq!(effects, vec![bind_commit(2, r + 1, "/s", None)]);
    match d.dir.rendezvous(&path("/s")) {
        Some(Rendezvous::Pending(p)) => assert_eq!(p.opened_from, Some(rev(r))),
        other => panic!("expected a pending rendezvous, got {other:?}"),
    }
    let (b, effects) = d.call_raw(expect_open("/s", Sink, E_SNK, 3, Some(r)));
    let m = stream_match(inc(1, r + 1), E_SRC, E_SNK);
    assert_eq!(
        effects,
        vec![
            joined(3, "/s", r + 1),
            opened(&d, a, Ok(m.clone())),
            opened(&d, b, Ok(m.clone())),
        ]
    );
    // Both match replies are lost; the retries carry the now outdated expected revision r.
    let before = state(&d);
    for request in [
        expect_open("/s", Sink, E_SNK, 3, Some(r)),
        expect_open("/s", Source, E_SRC, 2, Some(r)),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(effects, vec![opened(&d, id, Ok(m.clone()))]);
    }
    assert_eq!(state(&d), before);
}

#[test]
fn q18_own_active_retry_with_another_role_or_endpoint_is_an_operation_conflict() {
    let mut d = Dir::new();
    make_active(&mut d, "/s", 1, 2);
    let before = state(&d);
    for (request, operation) in [
        (ensure_open("/s", Sink, E_SRC, 1), 1),
        (ensure_open("/s", Source, E_NEW, 1), 1),
        (ensure_open("/s", Source, E_SNK, 2), 2),
        (ensure_open("/s", Sink, E_NEW, 2), 2),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(effects, vec![opened(&d, id, Err(conflict(operation)))]);
    }
    assert_eq!(state(&d), before);
}

#[test]
fn open_after_a_cancel_tombstone_is_path_replaced_and_creates_nothing() {
    let mut d = Dir::new();
    assert_eq!(
        d.call(cancel_req("/s", 1)),
        ReplyBody::StreamCancelled(Ok(()))
    );
    let (id, effects) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    assert_eq!(effects, vec![opened(&d, id, Err(path_replaced("/s")))]);
    assert_eq!(
        d.lookup("/s"),
        ReplyBody::LookedUp(Err(path_not_found("/s")))
    );
    assert!(d.dir.rendezvous(&path("/s")).is_none());
}

#[test]
fn open_retry_of_a_finished_op_is_stale_incarnation() {
    let mut d = Dir::new();
    let m = make_active(&mut d, "/s", 1, 2);
    d.call(close_req("/s", m.incarnation));
    let before = state(&d);
    for (request, operation) in [
        (ensure_open("/s", Source, E_SRC, 1), 1),
        (ensure_open("/s", Sink, E_SNK, 2), 2),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(
            effects,
            vec![opened(&d, id, Err(stale("/s", inc(1, 1))))],
            "op {operation}"
        );
    }
    assert_eq!(state(&d), before);
}

#[test]
fn open_retry_after_a_restart_is_stale_incarnation() {
    let mut d = Dir::new();
    make_active(&mut d, "/s", 1, 2);
    let _ = d.call_raw(ensure_open("/p", Source, E_NEW, 3));
    d.restart();
    assert_eq!(d.epoch(), AuthorityEpoch(2));
    for (request, p, r) in [
        (ensure_open("/s", Source, E_SRC, 1), "/s", 1),
        (ensure_open("/s", Sink, E_SNK, 2), "/s", 1),
        (ensure_open("/p", Source, E_NEW, 3), "/p", 2),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(effects, vec![opened(&d, id, Err(stale(p, inc(2, r))))]);
    }
    assert_eq!(d.lookup("/s"), node(EntryKind::Stream, 1, false));
    assert_eq!(d.lookup("/p"), node(EntryKind::Stream, 2, false));
}

#[test]
fn non_ensure_open_of_a_blob_or_nothing_is_sticky_wrong_entry_type_or_path_not_found() {
    let mut d = Dir::new();
    d.register("/b", S1, 1);
    let wrong = RejectionKind::WrongEntryType {
        expected: EntryKind::Stream,
        found: EntryKind::Blob,
    };
    let (id, effects) = d.call_raw(expect_open("/b", Source, E_SRC, 2, Some(1)));
    assert_eq!(
        effects,
        vec![
            refused(2, "/b", wrong),
            opened(&d, id, Err(blob_is_not_stream("/b")))
        ]
    );
    let (id, effects) = d.call_raw(expect_open("/x", Source, E_SRC, 3, Some(1)));
    assert_eq!(
        effects,
        vec![
            refused(3, "/x", RejectionKind::PathNotFound),
            opened(&d, id, Err(path_not_found("/x")))
        ]
    );
    // Sticky: once /x is a stream node at revision 1... it never will be for op 3.
    let _ = d.call_raw(ensure_open("/x", Source, E_NEW, 4));
    let (id, effects) = d.call_raw(expect_open("/x", Source, E_SRC, 3, Some(1)));
    assert_eq!(effects, vec![opened(&d, id, Err(path_not_found("/x")))]);
    assert!(d.dir.rendezvous(&path("/b")).is_none());
}

#[test]
fn ensure_open_without_replace_of_a_blob_is_sticky_wrong_entry_type() {
    let mut d = Dir::new();
    d.register("/b", S1, 1);
    let wrong = RejectionKind::WrongEntryType {
        expected: EntryKind::Stream,
        found: EntryKind::Blob,
    };
    let (id, effects) = d.call_raw(ensure_open("/b", Source, E_SRC, 2));
    assert_eq!(
        effects,
        vec![
            refused(2, "/b", wrong),
            opened(&d, id, Err(blob_is_not_stream("/b")))
        ]
    );
    // Even after the blob is gone, op 2 never binds.
    d.unregister("/b", 3);
    let (id, effects) = d.call_raw(ensure_open("/b", Source, E_SRC, 2));
    assert_eq!(effects, vec![opened(&d, id, Err(blob_is_not_stream("/b")))]);
    assert!(d.dir.rendezvous(&path("/b")).is_none());
}

#[test]
fn non_ensure_open_with_an_outdated_expected_revision_is_sticky_path_replaced() {
    let mut d = Dir::new();
    let r = make_stream_node(&mut d, "/s", 1);
    for (operation, expected) in [(2, Some(r + 5)), (3, Some(r + 100)), (4, None)] {
        let (id, effects) = d.call_raw(expect_open("/s", Source, E_SRC, operation, expected));
        assert_eq!(
            effects,
            vec![
                refused(operation, "/s", RejectionKind::PathReplaced),
                opened(&d, id, Err(path_replaced("/s")))
            ]
        );
    }
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    // A refused id stays refused even with the current revision; a fresh id binds, remembering
    // where it was opened from.
    let (id, effects) = d.call_raw(expect_open("/s", Source, E_SRC, 2, Some(r)));
    assert_eq!(effects, vec![opened(&d, id, Err(path_replaced("/s")))]);
    let (_, effects) = d.call_raw(expect_open("/s", Source, E_SRC, 5, Some(r)));
    assert_eq!(effects, vec![bind_commit(5, r + 1, "/s", None)]);
}

#[test]
fn the_opened_from_exception_needs_a_named_revision() {
    let mut d = Dir::new();
    // An ensure open leaves a pending with no opened-from revision.
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let (id, effects) = d.call_raw(expect_open("/s", Sink, E_SNK, 2, None));
    assert_eq!(
        effects,
        vec![
            refused(2, "/s", RejectionKind::PathReplaced),
            opened(&d, id, Err(path_replaced("/s")))
        ]
    );
    // With a named stale revision that no pending was opened from: refused as well.
    let (id, effects) = d.call_raw(expect_open("/s", Sink, E_SNK, 3, Some(7)));
    assert_eq!(
        effects,
        vec![
            refused(3, "/s", RejectionKind::PathReplaced),
            opened(&d, id, Err(path_replaced("/s")))
        ]
    );
    // The current revision joins.
    let (id, effects) = d.call_raw(expect_open("/s", Sink, E_SNK, 4, Some(1)));
    assert_eq!(
        reply_to(&effects, CLIENT, id),
        Some(ReplyBody::StreamOpened(Ok(stream_match(
            inc(1, 1),
            E_SRC,
            E_SNK
        ))))
    );
}

#[test]
fn a_second_opener_of_the_same_role_is_sticky_duplicate_stream_role() {
    let mut d = Dir::new();
    let (first, _) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let (id, effects) = d.call_raw(ensure_open("/s", Source, E_NEW, 5));
    let duplicate = |role| NamespaceError::DuplicateStreamRole {
        path: path("/s"),
        role,
    };
    assert_eq!(
        effects,
        vec![
            refused(5, "/s", RejectionKind::DuplicateStreamRole(Source)),
            opened(&d, id, Err(duplicate(Source)))
        ]
    );
    // The waiter is unaffected and matches normally.
    let (sink, effects) = d.call_raw(ensure_open("/s", Sink, E_SNK, 2));
    let m = stream_match(inc(1, 1), E_SRC, E_SNK);
    assert_eq!(
        effects,
        vec![
            joined(2, "/s", 1),
            opened(&d, first, Ok(m.clone())),
            opened(&d, sink, Ok(m)),
        ]
    );
    // An active rendezvous refuses a third opener of either role without replace.
    for (role, operation) in [(Sink, 6), (Source, 7)] {
        let (id, effects) = d.call_raw(ensure_open("/s", role, E_NEW, operation));
        assert_eq!(
            effects,
            vec![
                refused(operation, "/s", RejectionKind::DuplicateStreamRole(role)),
                opened(&d, id, Err(duplicate(role)))
            ]
        );
    }
    // Once the stream is closed, a late copy of op 5 still cannot take the Source role.
    d.call(close_req("/s", inc(1, 1)));
    let (id, effects) = d.call_raw(ensure_open("/s", Source, E_NEW, 5));
    assert_eq!(effects, vec![opened(&d, id, Err(duplicate(Source)))]);
    assert!(d.dir.rendezvous(&path("/s")).is_none());
}

#[test]
fn replace_of_a_same_role_pending_answers_path_replaced_to_the_old_caller() {
    let mut d = Dir::new();
    let (old, _) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let (_, effects) = d.call_raw(replace_open("/s", Source, E_NEW, 2));
    assert_eq!(
        effects,
        vec![
            opened(&d, old, Err(path_replaced("/s"))),
            bind_commit(2, 2, "/s", None),
        ]
    );
    // The displaced op is stale now; the new pending matches.
    let (id, effects) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    assert_eq!(effects, vec![opened(&d, id, Err(stale("/s", inc(1, 1))))]);
    let (sink, effects) = d.call_raw(ensure_open("/s", Sink, E_SNK, 3));
    assert_eq!(
        reply_to(&effects, CLIENT, sink),
        Some(ReplyBody::StreamOpened(Ok(stream_match(
            inc(1, 2),
            E_NEW,
            E_SNK
        ))))
    );
}

#[test]
fn replace_open_against_an_other_role_pending_matches_it() {
    let mut d = Dir::new();
    let (first, _) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let (second, effects) = d.call_raw(replace_open("/s", Sink, E_SNK, 2));
    let m = stream_match(inc(1, 1), E_SRC, E_SNK);
    assert_eq!(
        effects,
        vec![
            joined(2, "/s", 1),
            opened(&d, first, Ok(m.clone())),
            opened(&d, second, Ok(m)),
        ]
    );
}

#[test]
fn replace_open_over_a_blob_retires_its_source() {
    let mut d = Dir::new();
    d.register("/b", S1, 1);
    let (_, effects) = d.call_raw(replace_open("/b", Source, E_SRC, 2));
    assert_eq!(
        effects,
        vec![
            bind_commit(2, 2, "/b", Some(S1)),
            watch(S1),
            retire_frame(S1),
        ]
    );
    assert_eq!(d.dir.source(&path("/b")), None);
    assert_eq!(d.lookup("/b"), node(EntryKind::Stream, 2, true));
    assert_eq!(
        d.resolve("/b"),
        ReplyBody::Resolved(Err(stream_is_not_blob("/b")))
    );
}

#[test]
fn open_on_a_reserved_path_is_sticky_path_exists() {
    let mut d = Dir::new();
    d.call(reserve_req("/r", 10, CLIENT));
    let (id, effects) = d.call_raw(ensure_open("/r", Source, E_SRC, 1));
    assert_eq!(
        effects,
        vec![
            rejected(1, bind_key("/r"), RejectionKind::PathExists, "/r"),
            opened(&d, id, Err(path_exists("/r"))),
        ]
    );
    d.call(release_req("/r", 10));
    let (id, effects) = d.call_raw(ensure_open("/r", Source, E_SRC, 1));
    assert_eq!(effects, vec![opened(&d, id, Err(path_exists("/r")))]);
    assert_eq!(
        d.lookup("/r"),
        ReplyBody::LookedUp(Err(path_not_found("/r")))
    );
}

#[test]
fn open_reusing_an_op_of_another_request_is_an_operation_conflict() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 2));
    let before = state(&d);
    for (request, operation) in [
        (ensure_open("/t", Source, E_SRC, 1), 1),
        (ensure_open("/t", Sink, E_SNK, 2), 2),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(effects, vec![opened(&d, id, Err(conflict(operation)))]);
    }
    assert_eq!(state(&d), before);
}

// ---------------------------------------------------------------------------------------------
// Replacement fence (SPEC §4.6.2, §12.4)

/// Active `/s` (ops 1, 2 from E_SRC, E_SNK at revision 1), then a replace open (op 3, source,
/// from E_NEW). Returns (old match, request id of the replace open).
fn fenced() -> (Dir, StreamMatch, RequestId) {
    let mut d = Dir::new();
    let m = make_active(&mut d, "/s", 1, 2);
    let (id, effects) = d.call_raw(replace_open("/s", Source, E_NEW, 3));
    let i = m.incarnation;
    assert_eq!(
        effects,
        vec![
            displacement_queued(E_SRC, i, Some("/s")),
            watch(E_SRC),
            displaced_frame(E_SRC, i),
            displacement_queued(E_SNK, i, Some("/s")),
            watch(E_SNK),
            displaced_frame(E_SNK, i),
        ]
    );
    (d, m, id)
}

#[test]
fn replace_open_over_an_active_rendezvous_fences_the_path() {
    let (d, m, _) = fenced();
    let fence = d.dir.fence(&path("/s")).expect("a fence");
    assert_eq!(fence.incarnation, m.incarnation);
    assert_eq!(fence.endpoints, [E_SRC, E_SNK].into());
    assert_eq!(fence.held.len(), 1);
    assert_eq!(fence.held[0].operation, op(3));
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    for endpoint in [E_SRC, E_SNK] {
        assert_eq!(
            fence_of(&d, endpoint, m.incarnation),
            Some(Some(path("/s")))
        );
    }
}

#[test]
fn opens_arriving_during_a_fence_are_held_silently() {
    let (mut d, _, _) = fenced();
    let (_, effects) = d.call_raw(ensure_open("/s", Sink, E_NEW_SNK, 4));
    assert_eq!(effects, vec![]);
    let fence = d.dir.fence(&path("/s")).unwrap();
    let held: Vec<_> = fence.held.iter().map(|h| h.operation).collect();
    assert_eq!(held, vec![op(3), op(4)]);
    // Q6, kept: the fenced path looks inactive.
    assert_eq!(d.lookup("/s"), node(EntryKind::Stream, 1, false));
}

#[test]
fn old_participants_retrying_during_a_fence_get_the_old_match() {
    let (mut d, m, _) = fenced();
    let before = state(&d);
    for request in [
        ensure_open("/s", Source, E_SRC, 1),
        ensure_open("/s", Sink, E_SNK, 2),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(effects, vec![opened(&d, id, Ok(m.clone()))]);
    }
    for (request, operation) in [
        (ensure_open("/s", Sink, E_SRC, 1), 1),
        (ensure_open("/s", Sink, E_NEW, 2), 2),
    ] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(effects, vec![opened(&d, id, Err(conflict(operation)))]);
    }
    assert_eq!(state(&d), before);
}

#[test]
fn a_full_fence_answers_limit_reached() {
    let (mut d, _, _) = fenced();
    for k in 1..FENCE_HELD_OPENS_MAX {
        let (_, effects) = d.call_raw(ensure_open("/s", Sink, E_NEW_SNK, 100 + k as u128));
        assert_eq!(effects, vec![], "held open {k}");
    }
    assert_eq!(
        d.dir.fence(&path("/s")).unwrap().held.len(),
        FENCE_HELD_OPENS_MAX
    );
    let (id, effects) = d.call_raw(ensure_open("/s", Sink, E_NEW_SNK, 999));
    let full = RejectionKind::LimitReached(Limit::FenceHeldOpens);
    assert_eq!(
        effects,
        vec![
            refused(999, "/s", full),
            opened(
                &d,
                id,
                Err(NamespaceError::LimitReached(Limit::FenceHeldOpens))
            )
        ]
    );
    assert_eq!(
        d.dir.fence(&path("/s")).unwrap().held.len(),
        FENCE_HELD_OPENS_MAX
    );
    // A retry of an open already held replaces it in place: no limit.
    let effects = call_from(
        &mut d,
        PROXY2,
        5000,
        ensure_open("/s", Sink, E_NEW_SNK, 101),
    );
    assert_eq!(effects, vec![]);
    let fence = d.dir.fence(&path("/s")).unwrap();
    assert_eq!(fence.held.len(), FENCE_HELD_OPENS_MAX);
    assert_eq!(fence.held[1].operation, op(101));
    assert_eq!(fence.held[1].reply_to, PROXY2);
    assert_eq!(fence.held[1].request_id, RequestId(5000));
}

#[test]
fn the_fence_resolves_after_both_acks_and_reruns_held_opens_in_order() {
    let (mut d, m, replace_id) = fenced();
    let i = m.incarnation;
    let (held_sink, _) = d.call_raw(ensure_open("/s", Sink, E_NEW_SNK, 4));
    let (late_sink, _) = d.call_raw(ensure_open("/s", Sink, E_SNK, 5));
    // One ack: durable completion, the fence stands.
    let effects = ack_displaced(&mut d, E_SRC, i);
    assert_eq!(
        effects,
        vec![displacement_done(E_SRC, m.incarnation), unwatch(E_SRC)]
    );
    assert!(d.dir.fence(&path("/s")).is_some());
    // A duplicate ack does nothing.
    assert_eq!(ack_displaced(&mut d, E_SRC, i), vec![]);
    // The second ack resolves it: op 3 binds revision 2, op 4 matches it, op 5 is a duplicate.
    let effects = ack_displaced(&mut d, E_SNK, i);
    let m2 = stream_match(inc(1, 2), E_NEW, E_NEW_SNK);
    assert_eq!(
        effects,
        vec![
            displacement_done(E_SNK, m.incarnation),
            unwatch(E_SNK),
            bind_commit(3, 2, "/s", None),
            joined(4, "/s", 2),
            opened(&d, replace_id, Ok(m2.clone())),
            opened(&d, held_sink, Ok(m2)),
            refused(5, "/s", RejectionKind::DuplicateStreamRole(Sink)),
            opened(
                &d,
                late_sink,
                Err(NamespaceError::DuplicateStreamRole {
                    path: path("/s"),
                    role: Sink,
                })
            ),
        ]
    );
    assert!(d.dir.fence(&path("/s")).is_none());
    assert_eq!(d.dir.durable().obligation_count(), 0);
    assert_eq!(d.lookup("/s"), node(EntryKind::Stream, 2, true));
}

#[test]
fn a_held_open_retry_moves_the_eventual_reply_to_the_newest_dispatch() {
    let (mut d, m, replace_id) = fenced();
    let (first_dispatch, _) = d.call_raw(ensure_open("/s", Sink, E_NEW_SNK, 4));
    let effects = call_from(&mut d, PROXY2, 700, ensure_open("/s", Sink, E_NEW_SNK, 4));
    assert_eq!(effects, vec![]);
    ack_displaced(&mut d, E_SRC, m.incarnation);
    let effects = ack_displaced(&mut d, E_SNK, m.incarnation);
    let m2 = stream_match(inc(1, 2), E_NEW, E_NEW_SNK);
    assert_eq!(reply_to(&effects, CLIENT, first_dispatch), None);
    assert_eq!(
        effects[4..],
        [
            opened(&d, replace_id, Ok(m2.clone())),
            reply(&d, PROXY2, RequestId(700), ReplyBody::StreamOpened(Ok(m2))),
        ]
    );
}

#[test]
fn displacements_are_resent_by_the_tick_until_acknowledged() {
    let (mut d, m, _) = fenced();
    let effects = d.tick();
    assert_eq!(
        effects,
        vec![
            displaced_frame(E_SRC, m.incarnation),
            displaced_frame(E_SNK, m.incarnation),
            timer_at(&d),
        ]
    );
    ack_displaced(&mut d, E_SRC, m.incarnation);
    let effects = d.tick();
    assert_eq!(
        effects,
        vec![displaced_frame(E_SNK, m.incarnation), timer_at(&d)]
    );
}

// =============================================================================================
// CancelStream

#[test]
fn cancel_of_an_unknown_op_commits_a_tombstone() {
    let mut d = Dir::new();
    let (id, effects) = d.call_raw(cancel_req("/s", 1));
    assert_eq!(
        effects,
        vec![
            rejected(1, bind_key("/s"), RejectionKind::PathReplaced, "/s"),
            reply(&d, CLIENT, id, ReplyBody::StreamCancelled(Ok(()))),
        ]
    );
    // A duplicate cancel commits nothing more.
    let before = state(&d);
    let (id, effects) = d.call_raw(cancel_req("/s", 1));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::StreamCancelled(Ok(())))]
    );
    assert_eq!(state(&d), before);
}

#[test]
fn cancel_of_a_pending_open_removes_it_without_replying_to_it() {
    let mut d = Dir::new();
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let (id, effects) = d.call_raw(cancel_req("/s", 1));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::StreamCancelled(Ok(())))]
    );
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    assert_eq!(d.lookup("/s"), node(EntryKind::Stream, 1, false));
    let (id, effects) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    assert_eq!(effects, vec![opened(&d, id, Err(stale("/s", inc(1, 1))))]);
    // L1: the path can be unlinked.
    assert_eq!(d.unregister("/s", 2), ReplyBody::Unregistered(receipt(2)));
}

#[test]
fn q11_cancel_of_an_active_side_displaces_the_peer_durably() {
    let mut d = Dir::new();
    let m = make_active(&mut d, "/s", 1, 2);
    let (id, effects) = d.call_raw(cancel_req("/s", 1));
    assert_eq!(
        effects,
        vec![
            displacement_queued(E_SNK, m.incarnation, None),
            watch(E_SNK),
            displaced_frame(E_SNK, m.incarnation),
            reply(&d, CLIENT, id, ReplyBody::StreamCancelled(Ok(()))),
        ]
    );
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    assert!(d.dir.fence(&path("/s")).is_none());
    assert_eq!(d.lookup("/s"), node(EntryKind::Stream, 1, false));
    assert_eq!(fence_of(&d, E_SNK, m.incarnation), Some(None));
    assert_eq!(displacements_of(&d, E_SRC), vec![]);
    // Cancelling the other side now changes nothing.
    let before = state(&d);
    let (id, effects) = d.call_raw(cancel_req("/s", 2));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::StreamCancelled(Ok(())))]
    );
    assert_eq!(state(&d), before);
}

#[test]
fn cancel_removes_a_held_fence_open() {
    let (mut d, m, replace_id) = fenced();
    let (_, _) = d.call_raw(ensure_open("/s", Sink, E_NEW_SNK, 4));
    let (id, effects) = d.call_raw(cancel_req("/s", 4));
    assert_eq!(
        effects,
        vec![
            rejected(4, bind_key("/s"), RejectionKind::PathReplaced, "/s"),
            reply(&d, CLIENT, id, ReplyBody::StreamCancelled(Ok(()))),
        ]
    );
    let held: Vec<_> = d
        .dir
        .fence(&path("/s"))
        .unwrap()
        .held
        .iter()
        .map(|h| h.operation)
        .collect();
    assert_eq!(held, vec![op(3)]);
    ack_displaced(&mut d, E_SRC, m.incarnation);
    let effects = ack_displaced(&mut d, E_SNK, m.incarnation);
    assert_eq!(
        effects,
        vec![
            displacement_done(E_SNK, m.incarnation),
            unwatch(E_SNK),
            bind_commit(3, 2, "/s", None),
        ]
    );
    assert_eq!(reply_to(&effects, CLIENT, replace_id), None);
}

#[test]
fn cancel_reusing_an_op_of_another_request_is_an_operation_conflict() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 2));
    let before = state(&d);
    for (request, operation) in [(cancel_req("/a", 1), 1), (cancel_req("/t", 2), 2)] {
        let (id, effects) = d.call_raw(request);
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::StreamCancelled(Err(conflict(operation)))
            )]
        );
    }
    assert_eq!(state(&d), before);
    assert!(matches!(
        d.dir.rendezvous(&path("/s")),
        Some(Rendezvous::Pending(_))
    ));
}

// =============================================================================================
// CloseStream

#[test]
fn close_ends_the_rendezvous_and_a_duplicate_is_ok() {
    let mut d = Dir::new();
    let m = make_active(&mut d, "/s", 1, 2);
    let durable = d.dir.durable().clone();
    let (id, effects) = d.call_raw(close_req("/s", m.incarnation));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::StreamClosed(Ok(())))]
    );
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    assert_eq!(d.dir.durable(), &durable, "close is volatile");
    let before = state(&d);
    let (id, effects) = d.call_raw(close_req("/s", m.incarnation));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::StreamClosed(Ok(())))]
    );
    assert_eq!(state(&d), before);
}

#[test]
fn close_of_another_incarnation_is_stale_incarnation() {
    let mut d = Dir::new();
    let m = make_active(&mut d, "/s", 1, 2);
    let before = state(&d);
    for other in [inc(2, 1), inc(1, 7), inc(0, 1)] {
        let (id, effects) = d.call_raw(close_req("/s", other));
        assert_eq!(
            effects,
            vec![reply(
                &d,
                CLIENT,
                id,
                ReplyBody::StreamClosed(Err(stale("/s", other)))
            )]
        );
    }
    assert_eq!(state(&d), before);
    // After the close, other incarnations are still stale (no rendezvous, node check).
    d.call(close_req("/s", m.incarnation));
    for other in [inc(2, 1), inc(1, 7)] {
        assert_eq!(
            d.call(close_req("/s", other)),
            ReplyBody::StreamClosed(Err(stale("/s", other)))
        );
    }
    // A pending rendezvous of a later bind makes the old incarnation stale too.
    let _ = d.call_raw(ensure_open("/s", Source, E_SRC, 3));
    assert_eq!(
        d.call(close_req("/s", m.incarnation)),
        ReplyBody::StreamClosed(Err(stale("/s", m.incarnation)))
    );
    assert!(d.dir.rendezvous(&path("/s")).is_some());
}

#[test]
fn close_after_a_restart_is_stale_incarnation() {
    let mut d = Dir::new();
    let m = make_active(&mut d, "/s", 1, 2);
    d.restart();
    assert_eq!(
        d.call(close_req("/s", m.incarnation)),
        ReplyBody::StreamClosed(Err(stale("/s", m.incarnation)))
    );
}

// =============================================================================================
// SourceRetired / StreamDisplaced

#[test]
fn source_retired_completes_the_retirement_durably() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.register("/a", S2, 2);
    let effects = ack_retired(&mut d, S1);
    assert_eq!(effects, vec![retirement_done(S1), unwatch(S1)]);
    assert_eq!(d.dir.durable().obligation_count(), 0);
    assert_eq!(d.tick(), vec![timer_at(&d)]);
    // Completion survives a restart: no Retire is sent on start.
    let boot = d.restart();
    assert_eq!(retires(&boot), Vec::<Address>::new());
}

#[test]
fn acks_for_nothing_pending_are_ignored() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.register("/a", S2, 2);
    let m = make_active(&mut d, "/s", 3, 4);
    d.register("/s", S3, 5);
    let before = state(&d);
    // Unknown source, unknown endpoint, wrong incarnation.
    assert_eq!(ack_retired(&mut d, S3), vec![]);
    assert_eq!(ack_retired(&mut d, E_SRC), vec![]);
    assert_eq!(ack_displaced(&mut d, E_NEW, m.incarnation), vec![]);
    assert_eq!(ack_displaced(&mut d, E_SRC, inc(1, 99)), vec![]);
    assert_eq!(ack_displaced(&mut d, E_SNK, inc(2, m.revision.0)), vec![]);
    assert_eq!(state(&d), before);
    // The right ones complete.
    assert_eq!(
        ack_displaced(&mut d, E_SRC, m.incarnation),
        vec![displacement_done(E_SRC, m.incarnation), unwatch(E_SRC)]
    );
}

// =============================================================================================
// AddressGone (DESIGN Q5/Q8)

/// Sets up, around the address `t`: a retirement obligation toward it, a reservation it owns,
/// a pending open from it on `/p`, an active rendezvous on `/q` whose source is `t` (sink
/// E_SNK), and a displacement obligation toward it from a Register over `/d` (peer E_NEW).
fn gone_setup(t: Address) -> (Dir, RequestId, StreamMatch, StreamMatch) {
    let mut d = Dir::new();
    d.register("/a", t, 1);
    d.register("/a", S2, 2); // Retire(t)
    d.call(reserve_req("/r", 3, t));
    let (pending_id, _) = d.call_raw(ensure_open("/p", Source, t, 4));
    // /q: t is the source, E_SNK the sink.
    let _ = d.call_raw(ensure_open("/q", Source, t, 5));
    let (_, effects) = d.call_raw(ensure_open("/q", Sink, E_SNK, 6));
    let q = match d.dir.rendezvous(&path("/q")) {
        Some(Rendezvous::Active(a)) => a.matched.clone(),
        other => panic!("expected an active /q, got {other:?}: {effects:?}"),
    };
    // /d: E_NEW the source, t the sink; a Register displaces both.
    let _ = d.call_raw(ensure_open("/d", Source, E_NEW, 7));
    let _ = d.call_raw(ensure_open("/d", Sink, t, 8));
    let dm = match d.dir.rendezvous(&path("/d")) {
        Some(Rendezvous::Active(a)) => a.matched.clone(),
        other => panic!("expected an active /d, got {other:?}"),
    };
    d.register("/d", S3, 9);
    (d, pending_id, q, dm)
}

fn gone_expectations(
    d: &Dir,
    t: Address,
    pending_id: RequestId,
    (q, dm): (&StreamMatch, &StreamMatch),
    scope: GoneScope,
) -> Vec<Effect> {
    vec![
        retirement_done(t),
        displacement_done(t, dm.incarnation),
        unwatch(t),
        Effect::Persist(LogRecord::ReservationReleased { path: path("/r") }),
        opened(d, pending_id, Err(path_replaced("/p"))),
        displacement_queued(E_SNK, q.incarnation, None),
        watch(E_SNK),
        displaced_frame(E_SNK, q.incarnation),
        gone_ack(scope),
    ]
}

#[test]
fn address_gone_for_one_address_ends_everything_toward_it() {
    let t = Address::new(NodeId(8), 1, 40);
    let (mut d, pending_id, q, dm) = gone_setup(t);
    let scope = GoneScope::Address(t);
    let effects = gone(&mut d, scope);
    assert_eq!(
        effects,
        gone_expectations(&d, t, pending_id, (&q, &dm), scope)
    );
    assert!(!d.dir.durable().has_obligation(&ObligationKey::Retire(t)));
    assert_eq!(displacements_of(&d, t), vec![]);
    assert_eq!(displacements_of(&d, E_NEW), vec![dm.incarnation]);
    assert_eq!(d.dir.durable().reservation_count(), 0);
    assert!(d.dir.rendezvous(&path("/p")).is_none());
    assert!(d.dir.rendezvous(&path("/q")).is_none());
    assert_eq!(d.dir.durable().node_floors().count(), 0);
    // Nothing more goes to t.
    let tick = d.tick();
    assert!(sends(&tick).iter().all(|(to, _)| *to != t), "{tick:?}");
}

#[test]
fn address_gone_for_a_restarted_node_covers_its_earlier_incarnations() {
    let t = Address::new(NodeId(8), 1, 40);
    let (mut d, pending_id, q, dm) = gone_setup(t);
    let scope = GoneScope::NodeBefore {
        node: NodeId(8),
        incarnation: 2,
    };
    let effects = gone(&mut d, scope);
    let mut expected = vec![Effect::Persist(LogRecord::NodeRestarted {
        node: NodeId(8),
        incarnation: 2,
    })];
    expected.extend(gone_expectations(&d, t, pending_id, (&q, &dm), scope));
    assert_eq!(effects, expected);
    assert_eq!(d.dir.durable().node_floor(NodeId(8)), 2);
    // A repeated report changes nothing but is acknowledged again.
    let before = state(&d);
    assert_eq!(gone(&mut d, scope), vec![gone_ack(scope)]);
    assert_eq!(state(&d), before);
    // Late frames from the dead incarnation are refused without persisting anything.
    let ghost = Address::new(NodeId(8), 1, 77);
    let (id, effects) = d.call_raw(ensure_open("/late", Source, ghost, 50));
    assert_eq!(effects, vec![opened(&d, id, Err(path_replaced("/late")))]);
    assert_eq!(
        d.call(register_req("/late", ghost, 51, None)),
        ReplyBody::Registered(Err(path_replaced("/late")))
    );
    assert_eq!(
        d.call(reserve_req("/late", 52, ghost)),
        ReplyBody::BlobReserved(Err(path_replaced("/late")))
    );
    assert_eq!(state(&d), before);
    // The node's new incarnation is served normally.
    let reborn = Address::new(NodeId(8), 2, 1);
    let next = d.dir.durable().next_revision();
    assert_eq!(
        d.call(register_req("/late", reborn, 151, None)),
        ReplyBody::Registered(Ok(MutationReceipt { revision: next }))
    );
}

#[test]
fn a_blob_whose_node_restarted_is_lost_to_resolve_and_lookup() {
    let mut d = Dir::new();
    let dead = Address::new(NodeId(8), 1, 40);
    let alive = Address::new(NodeId(9), 1, 40);
    d.register("/x", dead, 1);
    d.register("/y", alive, 2);
    assert_eq!(d.resolve("/x"), ReplyBody::Resolved(Ok(binding(dead, 1))));
    assert_eq!(d.lookup("/x"), node(EntryKind::Blob, 1, false));
    gone(
        &mut d,
        GoneScope::NodeBefore {
            node: NodeId(8),
            incarnation: 2,
        },
    );
    let lost = || ReplyBody::Resolved(Err(NamespaceError::BlobLost(path("/x"))));
    let lost_node = || {
        ReplyBody::LookedUp(Ok(NamespaceNode {
            kind: EntryKind::Blob,
            revision: Revision(1),
            active: false,
            lost: true,
        }))
    };
    assert_eq!(d.resolve("/x"), lost());
    assert_eq!(d.lookup("/x"), lost_node());
    // Another node's blob is untouched; so is a single gone address of a live node (that is
    // not a restart: the floor, which is durable, is what makes a blob lost).
    assert_eq!(d.resolve("/y"), ReplyBody::Resolved(Ok(binding(alive, 2))));
    gone(&mut d, GoneScope::Address(alive));
    assert_eq!(d.resolve("/y"), ReplyBody::Resolved(Ok(binding(alive, 2))));
    // The floor is durable: a restarted directory still knows.
    d.restart();
    assert_eq!(d.resolve("/x"), lost());
    assert_eq!(d.lookup("/x"), lost_node());
    // Renaming keeps the loss with the blob; writing the path again ends it.
    let moved = d.call(DirectoryRequest::Rename {
        source: path("/x"),
        destination: path("/z"),
        replace: false,
        operation: op(3),
    });
    assert!(matches!(moved, ReplyBody::Renamed(Ok(_))), "{moved:?}");
    assert_eq!(
        d.resolve("/z"),
        ReplyBody::Resolved(Err(NamespaceError::BlobLost(path("/z"))))
    );
    let reborn = Address::new(NodeId(8), 2, 41);
    d.register("/z", reborn, 4);
    assert!(matches!(d.resolve("/z"), ReplyBody::Resolved(Ok(b)) if b.source == reborn));
    assert!(matches!(
        d.lookup("/z"),
        ReplyBody::LookedUp(Ok(NamespaceNode { lost: false, .. }))
    ));
}

#[test]
fn address_gone_of_old_endpoints_resolves_a_fence_and_drops_held_opens_of_gone_endpoints() {
    let (mut d, m, replace_id) = fenced();
    let fence_incarnation = m.incarnation;
    let gone_opener = Address::new(NodeId(7), 1, 60);
    let (gone_id, _) = d.call_raw(ensure_open("/s", Sink, gone_opener, 4));
    let (sink_id, _) = d.call_raw(ensure_open("/s", Sink, E_NEW_SNK, 5));
    // The gone opener's held open is answered PathReplaced; the fence stands.
    let scope = GoneScope::Address(gone_opener);
    let effects = gone(&mut d, scope);
    assert_eq!(
        effects,
        vec![
            opened(&d, gone_id, Err(path_replaced("/s"))),
            gone_ack(scope)
        ]
    );
    assert!(d.dir.fence(&path("/s")).is_some());
    // The old endpoints' node restarts: their displacements complete and the fence resolves.
    let scope = GoneScope::NodeBefore {
        node: E_SRC.node,
        incarnation: 2,
    };
    gone(&mut d, scope);
    let scope = GoneScope::Address(E_SNK);
    let effects = gone(&mut d, scope);
    let m2 = stream_match(inc(1, 2), E_NEW, E_NEW_SNK);
    assert_eq!(
        effects,
        vec![
            displacement_done(E_SNK, fence_incarnation),
            unwatch(E_SNK),
            bind_commit(3, 2, "/s", None),
            joined(5, "/s", 2),
            opened(&d, replace_id, Ok(m2.clone())),
            opened(&d, sink_id, Ok(m2)),
            gone_ack(scope),
        ]
    );
    assert!(d.dir.fence(&path("/s")).is_none());
}

// =============================================================================================
// The retry tick and route reports (DESIGN Q5)

/// 40 paths, each re-registered so its first source has a pending retirement.
fn forty_retirements() -> (Dir, Vec<Address>) {
    let mut d = Dir::new();
    let old: Vec<Address> = (0..40)
        .map(|i| Address::new(NodeId(2), 1, 100 + i))
        .collect();
    for (i, source) in old.iter().enumerate() {
        let p = format!("/p/{i}");
        d.register(&p, *source, 1000 + i as u128);
        let (_, effects) = d.call_raw(register_req(
            &p,
            Address::new(NodeId(7), 1, 100 + i as u64),
            2000 + i as u128,
            None,
        ));
        // A fresh obligation sends its first frame at once.
        assert_eq!(retires(&effects), vec![*source]);
    }
    (d, old)
}

#[test]
fn a_tick_sends_at_most_32_frames_and_two_ticks_reach_all_40() {
    let (mut d, old) = forty_retirements();
    let t1 = d.tick();
    assert_eq!(retires(&t1), old[..RETRY_BATCH_MAX].to_vec());
    assert_eq!(t1.len(), RETRY_BATCH_MAX + 1);
    assert_eq!(t1.last(), Some(&timer_at(&d)));
    let t2 = d.tick();
    let expected: Vec<Address> = old[32..].iter().chain(&old[..24]).copied().collect();
    assert_eq!(retires(&t2), expected);
    let mut reached: Vec<Address> = retires(&t1).into_iter().chain(retires(&t2)).collect();
    reached.sort();
    reached.dedup();
    assert_eq!(reached.len(), 40);
}

#[test]
fn a_tick_skips_unroutable_targets() {
    let mut d = Dir::new();
    for (i, (old, new)) in [(S1, S2), (E_SRC, E_SNK), (E_NEW, E_NEW_SNK)]
        .into_iter()
        .enumerate()
    {
        let p = format!("/x/{i}");
        d.register(&p, old, 10 + i as u128);
        d.register(&p, new, 20 + i as u128);
    }
    assert_eq!(d.route(E_SRC, false), vec![]);
    assert!(!d.dir.is_routable(&E_SRC));
    assert_eq!(
        d.tick(),
        vec![retire_frame(S1), retire_frame(E_NEW), timer_at(&d)]
    );
    // Becoming routable wakes exactly that target, once.
    assert_eq!(d.route(E_SRC, true), vec![retire_frame(E_SRC)]);
    assert_eq!(
        d.tick(),
        vec![
            retire_frame(S1),
            retire_frame(E_SRC),
            retire_frame(E_NEW),
            timer_at(&d)
        ]
    );
    // With nothing routable a tick sends nothing.
    for target in [S1, E_SRC, E_NEW] {
        d.route(target, false);
    }
    assert_eq!(d.tick(), vec![timer_at(&d)]);
}

#[test]
fn a_route_wake_sends_only_to_that_target() {
    let (mut d, old) = forty_retirements();
    assert_eq!(d.route(old[5], true), vec![retire_frame(old[5])]);
    // Reports about addresses nobody watches are ignored.
    assert_eq!(d.route(S3, true), vec![]);
    assert_eq!(d.route(S3, false), vec![]);
    assert!(d.dir.is_routable(&S3));
}

#[test]
fn lookups_cause_no_retire_frames() {
    let (mut d, _) = forty_retirements();
    for i in 0..64 {
        let (id, effects) = d.call_raw(DirectoryRequest::Lookup {
            path: path(&format!("/p/{}", i % 40)),
        });
        assert_eq!(effects.len(), 1, "lookup {i}: {effects:?}");
        assert!(reply_to(&effects, CLIENT, id).is_some());
        assert_eq!(retires(&effects), Vec::<Address>::new());
    }
}

#[test]
fn a_fresh_obligation_is_sent_even_to_an_unroutable_target() {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.register("/a", S2, 2);
    d.route(S1, false);
    // S1 is bound again elsewhere and replaced: the new retirement is sent at once.
    d.register("/b", S1, 3);
    let (id, effects) = d.call_raw(register_req("/b", S3, 4, None));
    assert_eq!(
        effects,
        vec![
            committed(4, 4, reg_mutation("/b", S3, None), Some(S1)),
            retire_frame(S1),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(4))),
        ]
    );
}

#[test]
fn route_watches_follow_the_obligations_of_a_target() {
    let mut d = Dir::new();
    // S1 is first a blob source (retired), then a stream endpoint (displaced).
    d.register("/a", S1, 1);
    let (_, effects) = d.call_raw(register_req("/a", S2, 2, None));
    assert_eq!(effects[1], watch(S1));
    let _ = d.call_raw(ensure_open("/s", Source, S1, 3));
    let _ = d.call_raw(ensure_open("/s", Sink, E_SNK, 4));
    let i = inc(1, 3);
    let (id, effects) = d.call_raw(register_req("/s", S3, 5, None));
    assert_eq!(
        effects,
        vec![
            committed(5, 4, reg_mutation("/s", S3, None), None),
            displacement_queued(S1, i, None),
            displaced_frame(S1, i),
            displacement_queued(E_SNK, i, None),
            watch(E_SNK),
            displaced_frame(E_SNK, i),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(4))),
        ]
    );
    // A route wake sends one frame per obligation toward that target.
    assert_eq!(
        d.route(S1, true),
        vec![retire_frame(S1), displaced_frame(S1, i)]
    );
    // The watch ends with the last obligation.
    assert_eq!(ack_retired(&mut d, S1), vec![retirement_done(S1)]);
    assert_eq!(
        ack_displaced(&mut d, S1, i),
        vec![displacement_done(S1, i), unwatch(S1)]
    );
    assert_eq!(
        ack_displaced(&mut d, E_SNK, i),
        vec![displacement_done(E_SNK, i), unwatch(E_SNK)]
    );
    assert_eq!(d.tick(), vec![timer_at(&d)]);
}

// =============================================================================================
// Register over streams, and Q1

#[test]
fn register_over_a_pending_stream_answers_path_replaced_to_its_caller() {
    let mut d = Dir::new();
    let (pending, _) = d.call_raw(ensure_open("/s", Source, E_SRC, 1));
    let (id, effects) = d.call_raw(register_req("/s", S1, 2, None));
    assert_eq!(
        effects,
        vec![
            committed(2, 2, reg_mutation("/s", S1, None), None),
            opened(&d, pending, Err(path_replaced("/s"))),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(2))),
        ]
    );
    assert!(d.dir.rendezvous(&path("/s")).is_none());
    assert_eq!(d.lookup("/s"), node(EntryKind::Blob, 2, false));
}

#[test]
fn register_over_an_active_stream_displaces_both_endpoints_without_a_fence() {
    let mut d = Dir::new();
    let m = make_active(&mut d, "/s", 1, 2);
    let (id, effects) = d.call_raw(register_req("/s", S1, 3, None));
    let i = m.incarnation;
    assert_eq!(
        effects,
        vec![
            committed(3, 2, reg_mutation("/s", S1, None), None),
            displacement_queued(E_SRC, i, None),
            watch(E_SRC),
            displaced_frame(E_SRC, i),
            displacement_queued(E_SNK, i, None),
            watch(E_SNK),
            displaced_frame(E_SNK, i),
            reply(&d, CLIENT, id, ReplyBody::Registered(receipt(2))),
        ]
    );
    assert!(d.dir.fence(&path("/s")).is_none());
    assert!(d.dir.rendezvous(&path("/s")).is_none());
}

#[test]
fn q1_a_replayed_register_displaces_nothing() {
    let mut d = Dir::new();
    d.register("/p", S1, 1);
    // The path becomes a stream (retiring S1) with a pending opener, then an active one.
    let _ = d.call_raw(replace_open("/p", Source, E_SRC, 2));
    let before = state(&d);
    let (id, effects) = d.call_raw(register_req("/p", S1, 1, None));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::Registered(receipt(1)))]
    );
    assert_eq!(state(&d), before);
    let _ = d.call_raw(ensure_open("/p", Sink, E_SNK, 3));
    let before = state(&d);
    let (id, effects) = d.call_raw(register_req("/p", S1, 1, None));
    assert_eq!(
        effects,
        vec![reply(&d, CLIENT, id, ReplyBody::Registered(receipt(1)))]
    );
    assert_eq!(state(&d), before);
    assert_eq!(d.lookup("/p"), node(EntryKind::Stream, 2, true));
}

#[test]
fn rename_of_a_stream_node_over_a_blob_retires_the_blobs_source() {
    let mut d = Dir::new();
    let r = make_stream_node(&mut d, "/s", 1);
    d.register("/b", S1, 2);
    let (id, effects) = d.call_raw(rename_req("/s", "/b", true, 3));
    assert_eq!(
        effects,
        vec![
            committed(
                3,
                r + 2,
                Mutation::Rename {
                    source: path("/s"),
                    destination: path("/b"),
                    replace: true,
                },
                Some(S1)
            ),
            watch(S1),
            retire_frame(S1),
            reply(&d, CLIENT, id, ReplyBody::Renamed(receipt(r + 2))),
        ]
    );
    assert_eq!(d.dir.source(&path("/b")), None);
    assert_eq!(d.lookup("/b"), node(EntryKind::Stream, r + 2, false));
    assert_eq!(
        d.resolve("/b"),
        ReplyBody::Resolved(Err(stream_is_not_blob("/b")))
    );
}

/// Regression (S16, S17, L2): displacement obligations were keyed by endpoint alone, so a
/// second displacement of the same endpoint address (here: E_SRC is a side of two active
/// rendezvous, `/s` and `/t`) overwrote the first, and the `/s` fence resolved without E_SRC's
/// acknowledgement. They are keyed by (endpoint, incarnation) now.
#[test]
fn an_endpoint_displaced_twice_keeps_both_obligations_and_the_first_fence_waits_for_it() {
    let mut d = Dir::new();
    // /s: E_SRC writes, E_SNK reads (i1). /t: E_NEW writes, E_SRC reads (i2).
    let s = make_active(&mut d, "/s", 1, 2);
    let _ = d.call_raw(ensure_open("/t", Source, E_NEW, 3));
    let (t_sink, effects) = d.call_raw(ensure_open("/t", Sink, E_SRC, 4));
    let t = match reply_to(&effects, CLIENT, t_sink) {
        Some(ReplyBody::StreamOpened(Ok(m))) => m,
        other => panic!("no /t match: {other:?}"),
    };
    // Replace both.
    let (s_replace, _) = d.call_raw(replace_open("/s", Source, E_NEW_SNK, 5));
    let _ = d.call_raw(replace_open("/t", Source, S3, 6));
    // E_SNK acknowledges /s; E_SRC has acknowledged nothing.
    let effects = ack_displaced(&mut d, E_SNK, s.incarnation);
    assert_eq!(
        effects,
        vec![displacement_done(E_SNK, s.incarnation), unwatch(E_SNK)],
        "the /s fence must wait for E_SRC's acknowledgement of {}",
        s.incarnation
    );
    assert!(d.dir.fence(&path("/s")).is_some());
    assert_eq!(reply_to(&effects, CLIENT, s_replace), None);
    // Both notices toward E_SRC are still re-driven.
    let tick = d.tick();
    let mut toward_src: Vec<StreamIncarnation> = displaced(&tick)
        .into_iter()
        .filter(|(to, _)| *to == E_SRC)
        .map(|(_, i)| i)
        .collect();
    toward_src.sort();
    assert_eq!(toward_src, vec![s.incarnation, t.incarnation]);
}

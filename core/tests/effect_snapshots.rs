//! The exact effect sequences of the reference flows of SPEC §12.4 (stream replacement with a
//! fence) and §12.5 (directory restart), as insta snapshots of a transcript: one `## step` line
//! per input, then one line per effect in emission order.

use std::fmt::Write as _;

use dataplane_core::effect::Effect;
use dataplane_core::error::NamespaceError;
use dataplane_core::ids::{Address, NodeId, RequestId, StreamIncarnation};
use dataplane_core::log::{LogRecord, Mutation, Outcome, RequestKey};
use dataplane_core::wire::{
    DirectoryReply, DirectoryRequest, Message, ReplyBody, StreamMatch, StreamRole,
};
use dataplane_testkit::dir::*;

const S1: Address = Address::new(NodeId(2), 1, 1);
const S2: Address = Address::new(NodeId(2), 1, 2);
const S3: Address = Address::new(NodeId(2), 1, 3);
const E_SRC: Address = Address::new(NodeId(3), 1, 11);
const E_SNK: Address = Address::new(NodeId(4), 1, 12);
const E_NEW: Address = Address::new(NodeId(5), 1, 13);
const E_NEW_SNK: Address = Address::new(NodeId(6), 1, 14);
const E_T_SRC: Address = Address::new(NodeId(7), 1, 21);
const E_T_SNK: Address = Address::new(NodeId(8), 1, 22);

// ---------------------------------------------------------------------------------------------
// Rendering.

fn render_match(m: &StreamMatch) -> String {
    format!(
        "match {} source {} {:?} sink {} {:?}",
        m.incarnation,
        m.source,
        m.source_descriptor.as_bytes(),
        m.sink,
        m.sink_descriptor.as_bytes()
    )
}

fn render_error(e: &NamespaceError) -> String {
    match e {
        NamespaceError::PathNotFound(p) => format!("PathNotFound {p}"),
        NamespaceError::PathExists(p) => format!("PathExists {p}"),
        NamespaceError::PathReplaced(p) => format!("PathReplaced {p}"),
        NamespaceError::StreamActive(p) => format!("StreamActive {p}"),
        NamespaceError::StaleIncarnation { path, incarnation } => {
            format!("StaleIncarnation {path} {incarnation}")
        }
        NamespaceError::OperationConflict(op) => format!("OperationConflict op{}", op.0),
        other => format!("{other:?}"),
    }
}

fn render_result<T>(r: &Result<T, NamespaceError>, ok: impl Fn(&T) -> String) -> String {
    match r {
        Ok(v) => format!("Ok({})", ok(v)),
        Err(e) => format!("Err({})", render_error(e)),
    }
}

fn render_body(body: &ReplyBody) -> String {
    let receipt = |r: &dataplane_core::wire::MutationReceipt| format!("{}", r.revision);
    let unit = |_: &()| String::new();
    match body {
        ReplyBody::Registered(r) => format!("Registered {}", render_result(r, receipt)),
        ReplyBody::Unregistered(r) => format!("Unregistered {}", render_result(r, receipt)),
        ReplyBody::Renamed(r) => format!("Renamed {}", render_result(r, receipt)),
        ReplyBody::Resolved(r) => format!(
            "Resolved {}",
            render_result(r, |b| format!(
                "source {} length {} {}",
                b.source, b.length, b.revision
            ))
        ),
        ReplyBody::LookedUp(r) => format!(
            "LookedUp {}",
            render_result(r, |n| format!(
                "{:?} {} active={}",
                n.kind, n.revision, n.active
            ))
        ),
        ReplyBody::BlobReserved(r) => format!("BlobReserved {}", render_result(r, unit)),
        ReplyBody::BlobReservationReleased(r) => {
            format!("BlobReservationReleased {}", render_result(r, unit))
        }
        ReplyBody::StreamOpened(r) => format!("StreamOpened {}", render_result(r, render_match)),
        ReplyBody::StreamCancelled(r) => format!("StreamCancelled {}", render_result(r, unit)),
        ReplyBody::StreamClosed(r) => format!("StreamClosed {}", render_result(r, unit)),
        ReplyBody::OperationsDone(r) => {
            format!(
                "OperationsDone {}",
                render_result(r, |h| format!("below {h}"))
            )
        }
    }
}

fn render_message(message: &Message) -> String {
    match message {
        Message::Reply(DirectoryReply {
            request_id,
            epoch,
            body,
        }) => format!("reply {request_id} {epoch} {}", render_body(body)),
        Message::Retire { reply_to } => format!("Retire reply_to {reply_to}"),
        Message::Displaced {
            incarnation,
            reply_to,
        } => format!("Displaced {incarnation} reply_to {reply_to}"),
        Message::GoneAcknowledged { scope } => format!("GoneAcknowledged {scope:?}"),
        other => format!("{other:?}"),
    }
}

fn render_mutation(m: &Mutation) -> String {
    match m {
        Mutation::Register {
            path, reservation, ..
        } => match reservation {
            Some(r) => format!("Register {path} reservation op{}", r.0),
            None => format!("Register {path}"),
        },
        Mutation::Unregister { path, .. } => format!("Unregister {path}"),
        Mutation::Rename {
            source,
            destination,
            replace,
        } => format!("Rename {source} -> {destination} replace={replace}"),
        Mutation::BindStream { path } => format!("BindStream {path}"),
    }
}

fn render_key(key: &RequestKey) -> String {
    match key {
        RequestKey::Register { path, .. } => format!("Register {path}"),
        RequestKey::BindStream { path } => format!("BindStream {path}"),
        RequestKey::Unregister { path, .. } => format!("Unregister {path}"),
        RequestKey::Rename { .. } => format!("{key:?}"),
        RequestKey::Reserve { path } => format!("Reserve {path}"),
    }
}

fn render_record(record: &LogRecord) -> String {
    match record {
        LogRecord::EpochAdvanced { epoch } => format!("EpochAdvanced {epoch}"),
        LogRecord::Committed {
            operation,
            revision,
            mutation,
            retire,
        } => {
            let retire = match retire {
                Some(source) => format!(" retire {source}"),
                None => String::new(),
            };
            format!(
                "Committed op{} {revision} {}{retire}",
                operation.0,
                render_mutation(mutation)
            )
        }
        LogRecord::Joined {
            operation,
            path,
            revision,
        } => format!("Joined op{} {path} {revision}", operation.0),
        LogRecord::Rejected {
            operation,
            key,
            rejection,
        } => format!(
            "Rejected op{} {} {}",
            operation.0,
            render_key(key),
            render_error(&rejection.error())
        ),
        LogRecord::Reserved {
            operation,
            path,
            owner,
        } => format!("Reserved op{} {path} owner {owner}", operation.0),
        LogRecord::ReservationReleased { path } => format!("ReservationReleased {path}"),
        LogRecord::RetirementDone { source } => format!("RetirementDone {source}"),
        LogRecord::DisplacementQueued {
            endpoint,
            incarnation,
            fence,
        } => match fence {
            Some(path) => format!("DisplacementQueued {endpoint} {incarnation} fence {path}"),
            None => format!("DisplacementQueued {endpoint} {incarnation}"),
        },
        LogRecord::DisplacementDone {
            endpoint,
            incarnation,
        } => format!("DisplacementDone {endpoint} {incarnation}"),
        other => format!("{other:?}"),
    }
}

fn render_effect(effect: &Effect) -> String {
    match effect {
        Effect::Send { to, message } => format!("send {to} {}", render_message(message)),
        Effect::Persist(record) => format!("persist {}", render_record(record)),
        Effect::SetTimer { timer, at } => format!("set-timer {timer:?} at {at}"),
        Effect::CancelTimer { timer } => format!("cancel-timer {timer:?}"),
        Effect::WatchRoute { target } => format!("watch-route {target}"),
        Effect::UnwatchRoute { target } => format!("unwatch-route {target}"),
    }
}

/// A transcript of steps and their effects.
#[derive(Default)]
struct Transcript(String);

impl Transcript {
    fn step(&mut self, title: &str, effects: &[Effect]) {
        writeln!(self.0, "## {title}").unwrap();
        if effects.is_empty() {
            writeln!(self.0, "(no effects)").unwrap();
        }
        for effect in effects {
            writeln!(self.0, "{}", render_effect(effect)).unwrap();
        }
    }
}

fn open(
    d: &mut Dir,
    p: &str,
    role: StreamRole,
    endpoint: Address,
    operation: u128,
    replace: bool,
) -> (RequestId, Vec<Effect>) {
    d.call_raw(open_request(
        p, role, endpoint, operation, replace, true, None,
    ))
}

fn displaced_ack(d: &mut Dir, endpoint: Address, incarnation: StreamIncarnation) -> Vec<Effect> {
    d.deliver(Message::StreamDisplaced {
        endpoint,
        incarnation,
    })
}

fn is_opened_ok(effects: &[Effect], id: RequestId) -> Option<StreamMatch> {
    match reply_to(effects, CLIENT, id) {
        Some(ReplyBody::StreamOpened(Ok(m))) => Some(m),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------

/// SPEC §12.4: A (active, inc i) on a path; R = OpenStream(replace) arrives; the directory
/// commits both displacement obligations, fences the path and notifies both endpoints; later
/// opens are held (old participants' retries get the old match back); the endpoints
/// acknowledge (re-sent every tick until they do); the fence resolves and the held opens re-run
/// in order (R binds a new revision, the held sink matches it).
#[test]
fn stream_replacement_with_fence() {
    let mut d = Dir::new();
    let mut t = Transcript::default();

    let (a, effects) = open(&mut d, "/s", StreamRole::Source, E_SRC, 1, false);
    t.step("open /s source op1 from E_SRC (parks)", &effects);
    let (b, effects) = open(&mut d, "/s", StreamRole::Sink, E_SNK, 2, false);
    t.step("open /s sink op2 from E_SNK (matches)", &effects);
    let old = is_opened_ok(&effects, b).expect("match");
    assert_eq!(is_opened_ok(&effects, a), Some(old.clone()));
    let i = old.incarnation;

    let (r, effects) = open(&mut d, "/s", StreamRole::Source, E_NEW, 3, true);
    t.step("replace open /s source op3 from E_NEW (fences)", &effects);
    assert_eq!(reply_to(&effects, CLIENT, r), None);
    assert_eq!(
        persisted(&effects).len(),
        2,
        "one durable displacement per old endpoint"
    );
    assert_eq!(displaced(&effects), vec![(E_SRC, i), (E_SNK, i)]);

    let (held, effects) = open(&mut d, "/s", StreamRole::Sink, E_NEW_SNK, 4, false);
    t.step("open /s sink op4 from E_NEW_SNK (held)", &effects);
    assert!(effects.is_empty());

    let (retry, effects) = open(&mut d, "/s", StreamRole::Source, E_SRC, 1, false);
    t.step("retry of old participant op1 (old match)", &effects);
    assert_eq!(is_opened_ok(&effects, retry), Some(old));

    let effects = d.tick();
    t.step("tick (notices re-sent)", &effects);
    assert_eq!(displaced(&effects), vec![(E_SRC, i), (E_SNK, i)]);

    let effects = displaced_ack(&mut d, E_SRC, i);
    t.step("StreamDisplaced from E_SRC", &effects);
    assert!(d.dir.fence(&path("/s")).is_some());

    let effects = displaced_ack(&mut d, E_SNK, i);
    t.step("StreamDisplaced from E_SNK (fence resolves)", &effects);
    assert!(d.dir.fence(&path("/s")).is_none());
    let new = is_opened_ok(&effects, r).expect("R matched");
    assert_eq!(is_opened_ok(&effects, held), Some(new.clone()));
    assert!(new.incarnation > i);
    assert_eq!((new.source, new.sink), (E_NEW, E_NEW_SNK));

    let effects = d.tick();
    t.step("tick (nothing left to send)", &effects);
    assert!(sends(&effects).is_empty());

    insta::assert_snapshot!("stream_replacement_with_fence", t.0);
}

/// SPEC §12.5: the store is reloaded; the new epoch is persisted first; runtime streams and
/// the retry order are gone, reservations and obligations survive and are re-driven on start
/// (one watch per target, the retry pass sends); open retries get StaleIncarnation; committed
/// mutations replay; an old incarnation's close is stale; a fence whose displacements were
/// pending is rebuilt and resolves on the acknowledgements.
#[test]
fn directory_restart() {
    let mut d = Dir::new();
    let mut t = Transcript::default();

    // Before the crash.
    t.step("register /a S1 op1", &d.call_raw(reg("/a", S1, 1)).1);
    t.step(
        "register /a S2 op2 (retires S1)",
        &d.call_raw(reg("/a", S2, 2)).1,
    );
    let (_, effects) = d.call_raw(DirectoryRequest::ReserveBlob {
        path: path("/r"),
        operation: op(3),
        owner: CLIENT,
    });
    t.step("reserve /r op3", &effects);
    t.step(
        "open /s source op4",
        &open(&mut d, "/s", StreamRole::Source, E_SRC, 4, false).1,
    );
    t.step(
        "open /s sink op5",
        &open(&mut d, "/s", StreamRole::Sink, E_SNK, 5, false).1,
    );
    let (_, effects) = open(&mut d, "/s", StreamRole::Source, E_NEW, 6, true);
    t.step("replace open /s source op6 (fences)", &effects);
    let fenced = displaced(&effects)[0].1;
    t.step(
        "open /t source op7",
        &open(&mut d, "/t", StreamRole::Source, E_T_SRC, 7, false).1,
    );
    let (t_sink, effects) = open(&mut d, "/t", StreamRole::Sink, E_T_SNK, 8, false);
    t.step("open /t sink op8 (matches)", &effects);
    let t_match = match reply_to(&effects, CLIENT, t_sink) {
        Some(ReplyBody::StreamOpened(Ok(m))) => m,
        other => panic!("no /t match: {other:?}"),
    };
    t.step(
        "open /u source op9 (parks)",
        &open(&mut d, "/u", StreamRole::Source, E_T_SRC, 9, false).1,
    );
    let epoch = d.epoch();

    // The crash and the restart.
    let effects = d.restart();
    t.step("restart", &effects);
    assert_eq!(
        effects.first(),
        Some(&Effect::Persist(LogRecord::EpochAdvanced {
            epoch: dataplane_core::ids::AuthorityEpoch(epoch.0 + 1)
        }))
    );
    assert!(d.dir.fence(&path("/s")).is_some(), "the fence is rebuilt");
    assert!(d.dir.rendezvous_all().next().is_none());

    // After it.
    for (title, p, role, endpoint, operation) in [
        (
            "retry open /t source op7",
            "/t",
            StreamRole::Source,
            E_T_SRC,
            7,
        ),
        ("retry open /t sink op8", "/t", StreamRole::Sink, E_T_SNK, 8),
        (
            "retry open /u source op9",
            "/u",
            StreamRole::Source,
            E_T_SRC,
            9,
        ),
    ] {
        let (id, effects) = open(&mut d, p, role, endpoint, operation, false);
        t.step(title, &effects);
        assert!(matches!(
            reply_to(&effects, CLIENT, id),
            Some(ReplyBody::StreamOpened(Err(
                NamespaceError::StaleIncarnation { .. }
            )))
        ));
    }
    let (old_retry, effects) = open(&mut d, "/s", StreamRole::Source, E_SRC, 4, false);
    t.step(
        "retry open /s source op4 (held by the rebuilt fence)",
        &effects,
    );
    assert!(effects.is_empty());
    let (replace_retry, effects) = open(&mut d, "/s", StreamRole::Source, E_NEW, 6, true);
    t.step("re-dispatched replace open /s op6 (held too)", &effects);
    assert!(effects.is_empty());
    let (id, effects) = d.call_raw(reg("/a", S2, 2));
    t.step("replayed register /a op2", &effects);
    assert_eq!(
        reply_to(&effects, CLIENT, id),
        Some(ReplyBody::Registered(Ok(
            dataplane_core::wire::MutationReceipt {
                revision: dataplane_core::ids::Revision(2)
            }
        )))
    );
    t.step(
        "close /t with its old incarnation",
        &d.call_raw(DirectoryRequest::CloseStream {
            path: path("/t"),
            incarnation: t_match.incarnation,
        })
        .1,
    );
    t.step(
        "lookup /t",
        &d.call_raw(DirectoryRequest::Lookup { path: path("/t") }).1,
    );
    t.step(
        "lookup /r",
        &d.call_raw(DirectoryRequest::Lookup { path: path("/r") }).1,
    );
    t.step(
        "register /r S3 op10 quoting reservation op3",
        &d.call_raw(DirectoryRequest::Register {
            path: path("/r"),
            source: S3,
            source_node: S3.node,
            length: 10,
            recovery: actor_recovery(S3),
            operation: op(10),
            reservation: Some(op(3)),
        })
        .1,
    );
    t.step(
        "SourceRetired S1",
        &d.deliver(Message::SourceRetired { source: S1 }),
    );
    t.step(
        "StreamDisplaced from E_SRC",
        &displaced_ack(&mut d, E_SRC, fenced),
    );
    let effects = displaced_ack(&mut d, E_SNK, fenced);
    t.step("StreamDisplaced from E_SNK (fence resolves)", &effects);
    assert!(matches!(
        reply_to(&effects, CLIENT, old_retry),
        Some(ReplyBody::StreamOpened(Err(
            NamespaceError::StaleIncarnation { .. }
        )))
    ));
    assert_eq!(reply_to(&effects, CLIENT, replace_retry), None);
    assert!(matches!(
        d.dir.rendezvous(&path("/s")),
        Some(dataplane_core::directory::Rendezvous::Pending(p)) if p.request.operation == op(6)
    ));
    let effects = d.tick();
    t.step("tick", &effects);
    assert!(sends(&effects).is_empty());
    assert_eq!(d.dir.durable().obligation_count(), 0);
    assert!(matches!(
        d.dir.durable().operation(op(3)).map(|r| &r.outcome),
        Some(Outcome::Reserved)
    ));

    insta::assert_snapshot!("directory_restart", t.0);
}

fn reg(p: &str, source: Address, operation: u128) -> DirectoryRequest {
    DirectoryRequest::Register {
        path: path(p),
        source,
        source_node: source.node,
        length: 10,
        recovery: actor_recovery(source),
        operation: op(operation),
        reservation: None,
    }
}

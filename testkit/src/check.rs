//! Runs a workload against the directory and the reference model (`dataplane_model`, shared
//! with the simulator) together and checks every step. After each one:
//!
//! * every reply the directory sent (to the caller, and to parked or held openers answered
//!   later) equals the model's prediction, epoch included;
//! * the Retire / Displaced / GoneAcknowledged frames equal the predicted ones;
//! * every durable field (epoch, next revision, entries, operation records, reservations,
//!   obligations in persisted order with their fenced paths, node floors, issuer rows) equals
//!   the model's (`dataplane_model::compare`);
//! * the runtime rendezvous and fences sit on the predicted paths, and the watched routes are
//!   exactly the targets that have obligations;
//! * the write-ahead barrier holds: walking the step's effects in order, every reply and notice
//!   is justified by the records persisted before it, and those records rebuild the live
//!   durable state exactly;
//! * `check_invariants` holds.
//!
//! The first disagreement is returned as an `Err` that names the step; the caller decides how
//! to fail (a failed proptest case, a fuzz crash). Programmer errors still panic: a refused
//! input or a broken invariant inside [`Dir`], and a retry pass with more obligations than one
//! batch under [`BeyondBatch::Assert`]; proptest and libFuzzer report a panic as a failure too.

use std::collections::BTreeMap;

use dataplane_core::directory::DirectoryLimits;
use dataplane_core::directory::{DurableState, ObligationKey, Rendezvous};
use dataplane_core::effect::Effect;
use dataplane_core::error::NamespaceError;
use dataplane_core::ids::{Address, Issuer, OperationId, RequestId, Revision, StreamIncarnation};
use dataplane_core::limits::RETRY_BATCH_MAX;
use dataplane_core::log::Outcome;
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    DirectoryCall, DirectoryReply, DirectoryRequest, GoneScope, Message, ReplyBody,
};
use dataplane_model::rules::{issuer_of, rejection_error, sequence_of};
use dataplane_model::{Model, Out, compare};

use crate::dir::{CLIENT, DIRECTORY, Dir};
use crate::workload::{CLIENT2, HOST, Seen, Step, endpoint, request_of};

/// Returns an `Err` naming `what` and both sides unless `left == right`.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($what:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            return Err(format!(
                "{}\n  left: {left:?}\n right: {right:?}",
                format_args!($($what)+)
            ));
        }
    }};
}

/// What [`run`] does with a tick or a restart (each runs a retry pass) while more obligations
/// are open than one retry pass sends ([`RETRY_BATCH_MAX`]): the model does not follow the
/// directory's rotation beyond one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeyondBatch {
    /// Run the step; the model's assertion that one pass covers every obligation then panics.
    /// For workloads too short to open that many (core's property test: under 60 steps).
    Assert,
    /// Skip the step (neither the directory nor the model sees it). For the fuzz targets,
    /// whose longer sequences get there.
    Skip,
}

/// What a step sent, in comparable form (the model's coverage notes left out).
#[derive(Debug, PartialEq, Eq)]
struct Sent {
    replies: Vec<(Address, DirectoryReply)>,
    retires: Vec<Address>,
    displaced: Vec<(Address, StreamIncarnation)>,
    gone_acks: Vec<(Address, GoneScope)>,
}

fn normalise(out: Out) -> Sent {
    let mut s = Sent {
        replies: out.replies,
        retires: out.retires,
        displaced: out.displaced,
        gone_acks: out.gone_acks,
    };
    s.replies.sort_by_key(|(to, reply)| (reply.request_id, *to));
    s.retires.sort();
    s.displaced.sort();
    s.gone_acks.sort();
    s
}

fn collect(effects: &[Effect]) -> Result<Out, String> {
    let mut out = Out::default();
    for effect in effects {
        let Effect::Send { to, message } = effect else {
            continue;
        };
        match message {
            Message::Reply(reply) => out.replies.push((*to, reply.clone())),
            Message::Retire { reply_to } => {
                ensure_eq!(*reply_to, DIRECTORY, "reply_to of {message:?} to {to}");
                out.retires.push(*to);
            }
            Message::Displaced {
                incarnation,
                reply_to,
            } => {
                ensure_eq!(*reply_to, DIRECTORY, "reply_to of {message:?} to {to}");
                out.displaced.push((*to, *incarnation));
            }
            Message::GoneAcknowledged { scope } => out.gone_acks.push((*to, *scope)),
            other => return Err(format!("unexpected send {other:?} to {to}")),
        }
    }
    Ok(out)
}

fn check_state(d: &Dir, m: &Model, seen: &Seen) -> Result<(), String> {
    if let Some(difference) = compare::first_difference(d.dir.durable(), m) {
        return Err(difference.to_string());
    }
    let streams: Vec<(DataPath, bool)> = d
        .dir
        .rendezvous_all()
        .map(|(p, r)| (p.clone(), matches!(r, Rendezvous::Active(_))))
        .collect();
    let model_streams: Vec<(DataPath, bool)> = m
        .rendezvous()
        .map(|(p, active)| (p.clone(), active))
        .collect();
    ensure_eq!(streams, model_streams, "runtime rendezvous (path, active)");
    let fences: Vec<DataPath> = d.dir.fences().map(|(p, _)| p.clone()).collect();
    let model_fences: Vec<DataPath> = m.fenced().cloned().collect();
    ensure_eq!(fences, model_fences, "fenced paths");
    ensure_eq!(
        &seen.watched,
        &m.obligation_targets(),
        "watched routes = obligation targets"
    );
    if let Err(e) = d.dir.check_invariants() {
        return Err(format!("invariants: {e}"));
    }
    Ok(())
}

/// The write-ahead barrier (SPEC S6–S8, DESIGN §3): walking a step's effects in order, every
/// send is justified by the durable state built from the records persisted before it, and the
/// step's records rebuild exactly the live durable state.
fn check_barrier(
    mut state: DurableState,
    effects: &[Effect],
    requests: &BTreeMap<RequestId, DirectoryRequest>,
    live: &DurableState,
) -> Result<(), String> {
    for (i, effect) in effects.iter().enumerate() {
        let Effect::Send { to, message } = effect else {
            if let Effect::Persist(record) = effect {
                state
                    .apply(record)
                    .map_err(|e| format!("effect {i}: persisted record refused: {e}"))?;
            }
            continue;
        };
        let ok = match message {
            Message::Retire { .. } => state.has_obligation(&ObligationKey::Retire(*to)),
            Message::Displaced { incarnation, .. } => state.is_displacing(*to, *incarnation),
            Message::GoneAcknowledged {
                scope: GoneScope::NodeBefore { node, incarnation },
            } => state.node_floor(*node) >= *incarnation,
            Message::Reply(reply) => reply_is_durable(&state, requests, reply),
            _ => true,
        };
        if !ok {
            return Err(format!(
                "effect {i}: {message:?} to {to} is sent before the state it acknowledges \
                 is persisted"
            ));
        }
    }
    if state != *live {
        return Err("the live durable state differs from the records it persisted".into());
    }
    Ok(())
}

/// Whether `issuer`'s node incarnation ended in `state` (the rule restated, not
/// `DurableState::is_issuer_gone`: the barrier check must not share the directory's predicate).
fn issuer_gone(state: &DurableState, issuer: Issuer) -> bool {
    issuer.incarnation < state.node_floor(issuer.node)
}

/// Whether `op` is expired in `state` (restated, like [`issuer_gone`]).
fn expired(state: &DurableState, op: OperationId) -> bool {
    let issuer = issuer_of(op);
    issuer_gone(state, issuer) || sequence_of(op) < state.horizon(issuer)
}

fn reply_is_durable(
    state: &DurableState,
    requests: &BTreeMap<RequestId, DirectoryRequest>,
    reply: &DirectoryReply,
) -> bool {
    let Some(request) = requests.get(&reply.request_id) else {
        return false;
    };
    if let (DirectoryRequest::OperationsDone { issuer, .. }, ReplyBody::OperationsDone(Ok(h))) =
        (request, &reply.body)
    {
        return issuer_gone(state, *issuer) || state.horizon(*issuer) >= *h;
    }
    let Some(op) = request.operation() else {
        return true;
    };
    let outcome = state.operation(op).map(|r| &r.outcome);
    match &reply.body {
        ReplyBody::Registered(Ok(r))
        | ReplyBody::Unregistered(Ok(r))
        | ReplyBody::Renamed(Ok(r)) => outcome == Some(&Outcome::Committed(r.revision)),
        ReplyBody::StreamOpened(Ok(m)) => outcome == Some(&Outcome::Committed(m.revision)),
        ReplyBody::BlobReserved(Ok(())) => outcome == Some(&Outcome::Reserved),
        // A release that ends the reservation of an expired operation also prunes its record.
        ReplyBody::StreamCancelled(Ok(())) | ReplyBody::BlobReservationReleased(Ok(())) => {
            outcome.is_some() || expired(state, op)
        }
        ReplyBody::Registered(Err(e))
        | ReplyBody::Unregistered(Err(e))
        | ReplyBody::Renamed(Err(e))
        | ReplyBody::BlobReserved(Err(e)) => match e {
            NamespaceError::PathExists(_)
            | NamespaceError::PathNotFound(_)
            | NamespaceError::StreamActive(_) => {
                matches!(outcome, Some(Outcome::Rejected(x)) if rejection_error(x) == *e)
            }
            _ => true,
        },
        _ => true,
    }
}

/// The model's retry pass covers every obligation in one batch.
fn within_batch(m: &Model) -> bool {
    m.obligation_count() <= RETRY_BATCH_MAX
}

/// Runs `steps` against a fresh directory ([`Dir`]) and a fresh model, checking each step
/// (the module documentation lists the checks); returns the first disagreement.
pub fn run(steps: &[Step], beyond_batch: BeyondBatch) -> Result<(), String> {
    run_with_limits(steps, beyond_batch, DirectoryLimits::default())
}

/// [`run`] with tables bounded by `limits` (small ones reach every `LimitReached`).
pub fn run_with_limits(
    steps: &[Step],
    beyond_batch: BeyondBatch,
    limits: DirectoryLimits,
) -> Result<(), String> {
    let mut d = Dir::with_limits(limits);
    // The harness's directory booted (a recovery from an empty log) and every record it
    // persists is durable at once: the model's journal is forgotten after every step.
    let mut m = Model::new(limits);
    m.recover(0);
    m.forget_through(0);
    let _ = m.take_out();
    let mut seen = Seen {
        next_request: 1,
        ..Seen::default()
    };
    check_state(&d, &m, &seen).map_err(|e| format!("at boot: {e}"))?;
    for (index, step) in steps.iter().enumerate() {
        let at = index as u64 + 1;
        let before = d.dir.durable().clone();
        let retry_pass = matches!(step, Step::Tick | Step::Restart);
        if retry_pass && !within_batch(&m) {
            match beyond_batch {
                BeyondBatch::Skip => continue,
                BeyondBatch::Assert => panic!(
                    "step {index} ({step:?}): a retry pass over {} obligations, more than one batch",
                    m.obligation_count()
                ),
            }
        }
        let effects = match step {
            Step::Tick => {
                m.tick(at);
                d.tick()
            }
            Step::Restart => {
                m.recover(at);
                seen.watched.clear();
                d.restart()
            }
            Step::SourceRetired(i) => {
                let source = seen.retired_source(*i);
                m.source_retired(at, source);
                d.deliver(Message::SourceRetired { source })
            }
            Step::StreamDisplaced(i) => {
                let (endpoint, incarnation) = if seen.displaced.is_empty() {
                    (
                        endpoint(*i),
                        StreamIncarnation {
                            epoch: m.epoch(),
                            revision: Revision(1),
                        },
                    )
                } else {
                    seen.displaced[usize::from(*i) % seen.displaced.len()]
                };
                m.stream_displaced(at, endpoint, incarnation);
                d.deliver(Message::StreamDisplaced {
                    endpoint,
                    incarnation,
                })
            }
            Step::Route { target, routable } => {
                let Some(target) = seen.watched_target(*target) else {
                    continue;
                };
                m.route(at, target, *routable);
                d.route(target, *routable)
            }
            Step::Gone(g) => {
                let scope = g.scope();
                m.address_gone(at, scope, HOST);
                d.deliver(Message::AddressGone {
                    scope,
                    reply_to: HOST,
                })
            }
            _ => {
                let Some(request) = request_of(step, &seen, m.epoch()) else {
                    continue;
                };
                let reply_to = match step {
                    Step::Replay {
                        other_client: true, ..
                    } => CLIENT2,
                    Step::Done { who, .. } => crate::workload::done_caller(*who),
                    _ => CLIENT,
                };
                let request_id = RequestId(seen.next_request);
                seen.next_request += 1;
                seen.history.push(request.clone());
                seen.requests.insert(request_id, request.clone());
                m.call(at, request_id, reply_to, request.clone());
                d.deliver(Message::Call(DirectoryCall {
                    request_id,
                    reply_to,
                    request,
                }))
            }
        };
        m.forget_through(at);
        let expected = m.take_out();
        check_barrier(before, &effects, &seen.requests, d.dir.durable())
            .map_err(|e| format!("step {index} ({step:?}): {e}"))?;
        let got = collect(&effects).map_err(|e| format!("step {index} ({step:?}): {e}"))?;
        for (_, reply) in &got.replies {
            seen.observe_reply(&reply.body);
        }
        seen.retires.extend(got.retires.iter().copied());
        seen.displaced.extend(got.displaced.iter().copied());
        for effect in &effects {
            match effect {
                Effect::WatchRoute { target } => {
                    seen.watched.insert(*target);
                }
                Effect::UnwatchRoute { target } => {
                    seen.watched.remove(target);
                }
                _ => {}
            }
        }
        let (got, want) = (normalise(got), normalise(expected));
        ensure_eq!(got, want, "sends of step {index} ({step:?})");
        check_state(&d, &m, &seen).map_err(|e| format!("after step {index} ({step:?}): {e}"))?;
    }
    Ok(())
}

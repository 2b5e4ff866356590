//! The directory workload: the vocabulary of a step (a few contended paths, small pools of
//! operation ids, endpoints, sources and owners), what the driver remembers of earlier steps,
//! and how a step becomes a request.
//!
//! Callers draw the steps: core's property tests with proptest strategies (`model.rs` within
//! the windows below, `crash.rs` with wider ones), the fuzz targets with `Arbitrary` (feature
//! `arbitrary`) folded into the same windows. Any numbers make valid steps (endpoints, owners
//! and earlier observations are picked modulo their pools); the windows keep operation ids
//! few, so that duplicates, replays and op-id reuse are frequent. [`drive`] runs steps against
//! a directory alone; [`crate::check::run`] runs them against the directory and the reference
//! model.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::RangeInclusive;

use dataplane_core::effect::Effect;
use dataplane_core::ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    Descriptor, DirectoryRequest, FileRef, GoneScope, Message, ReplyBody, SourceRecovery,
    StreamRole,
};

use crate::dir::Dir;

/// The client a `Replay { other_client: true }` re-sends from ([`crate::dir::CLIENT`] sends
/// every other request).
pub const CLIENT2: Address = Address::new(NodeId(1), 1, 1);
/// The host that reports addresses gone.
pub const HOST: Address = Address::new(NodeId(9), 1, 0);
/// The issuer of the odd operation ids: lane 0 of [`crate::dir::CLIENT`]'s node incarnation.
pub const ISSUER_A: Issuer = Issuer::new(NodeId(1), 1, 0);
/// The issuer of the even operation ids: lane 1 of node 2's first incarnation (node 2 hosts
/// endpoints, and its restart reports end these ids too).
pub const ISSUER_B: Issuer = Issuer::new(NodeId(2), 1, 1);
/// A caller on node 2's first incarnation, which may declare [`ISSUER_B`]'s operations done.
pub const NODE2_CALLER: Address = Address::new(NodeId(2), 1, 50);

/// Operation ids: each kind draws from its own small window, and neighbouring windows overlap
/// so that an id is sometimes reused for a different kind of request.
pub const REGISTER_OPS: RangeInclusive<u8> = 1..=6;
/// Operation ids of reservations (and of the reservation a register names).
pub const RESERVE_OPS: RangeInclusive<u8> = 5..=9;
/// Operation ids of unregisters.
pub const UNREGISTER_OPS: RangeInclusive<u8> = 9..=12;
/// Operation ids of renames.
pub const RENAME_OPS: RangeInclusive<u8> = 11..=14;
/// Operation ids of opens (and of the cancels that name them).
pub const OPEN_OPS: RangeInclusive<u8> = 13..=24;

/// One of the contended paths.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum P {
    /// `/a`.
    A,
    /// `/b`.
    B,
    /// `/a/c`, under `/a`.
    AC,
}

impl P {
    /// The path.
    pub fn path(self) -> DataPath {
        DataPath::new(self.as_str()).unwrap()
    }

    /// The path as text.
    pub fn as_str(self) -> &'static str {
        match self {
            P::A => "/a",
            P::B => "/b",
            P::AC => "/a/c",
        }
    }
}

impl fmt::Debug for P {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which expected revision an open (or a compare-and-delete unregister) names.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Expect {
    /// No expected revision.
    None,
    /// The i-th most recently observed revision (of the last four).
    Recent(u8),
}

/// Which incarnation a close names.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum IncPick {
    /// The i-th most recently matched incarnation (any epoch).
    Seen(u8),
    /// (current epoch, revision r): usually stale, sometimes a duplicate close.
    Current(u8),
}

/// Which addresses a host reports gone.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Gone {
    /// The endpoint [`endpoint`]`(e)`.
    Endpoint(u8),
    /// The source of register operation `op` ([`source_of`]).
    Source(u8),
    /// The reservation owner [`owner`]`(k)`.
    Owner(u8),
    /// `NodeBefore{node, incarnation}`.
    Node(u8, u64),
}

impl Gone {
    /// The scope of the AddressGone this names.
    pub fn scope(self) -> GoneScope {
        match self {
            Gone::Endpoint(e) => GoneScope::Address(endpoint(e)),
            Gone::Source(op) => GoneScope::Address(source_of(op)),
            Gone::Owner(k) => GoneScope::Address(owner(k)),
            Gone::Node(n, incarnation) => GoneScope::NodeBefore {
                node: NodeId(u64::from(n)),
                incarnation,
            },
        }
    }
}

#[cfg(feature = "arbitrary")]
fn role(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<StreamRole> {
    Ok(if u.arbitrary::<bool>()? {
        StreamRole::Source
    } else {
        StreamRole::Sink
    })
}

/// One step of the workload.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Step {
    /// A Register from the fresh source of `op` ([`source_of`]).
    Register {
        path: P,
        op: u8,
        /// 20 bytes long rather than 10.
        long: bool,
        /// A `File` recovery record (the source is unavailable after a restart).
        file: bool,
        reservation: Option<u8>,
    },
    Resolve(P),
    Lookup(P),
    /// A ReserveBlob for [`owner`]`(owner)`.
    Reserve {
        path: P,
        op: u8,
        owner: u8,
    },
    Release {
        path: P,
        op: u8,
    },
    Unregister {
        path: P,
        expected: Expect,
        op: u8,
    },
    Rename {
        from: P,
        to: P,
        replace: bool,
        op: u8,
    },
    /// An OpenStream by [`endpoint`]`(endpoint)`.
    Open {
        path: P,
        #[cfg_attr(feature = "arbitrary", arbitrary(with = role))]
        role: StreamRole,
        endpoint: u8,
        replace: bool,
        ensure: bool,
        expected: Expect,
        op: u8,
    },
    Cancel {
        path: P,
        op: u8,
    },
    Close {
        path: P,
        inc: IncPick,
    },
    /// Re-send the i-th most recent request verbatim (fresh request id), from CLIENT or CLIENT2.
    Replay {
        back: u8,
        other_client: bool,
    },
    /// Acknowledge the i-th Retire notice seen so far (possibly already acknowledged).
    SourceRetired(u8),
    /// Acknowledge the i-th Displaced notice seen so far (possibly stale or duplicate).
    StreamDisplaced(u8),
    Gone(Gone),
    Tick,
    Restart,
    /// A route report for the i-th watched target (skipped when nothing is watched).
    Route {
        target: u8,
        routable: bool,
    },
    /// `OperationsDone{below}`: `who % 3` is 0 for [`ISSUER_A`] declared by CLIENT, 1 for
    /// [`ISSUER_B`] declared by [`NODE2_CALLER`], 2 for [`ISSUER_B`] declared by CLIENT (an
    /// issuer speaks only for itself: refused).
    Done {
        below: u8,
        who: u8,
    },
}

/// The caller of a `Done { who }` step.
pub fn done_caller(who: u8) -> Address {
    if who % 3 == 1 {
        NODE2_CALLER
    } else {
        crate::dir::CLIENT
    }
}

fn done_issuer(who: u8) -> Issuer {
    if who.is_multiple_of(3) {
        ISSUER_A
    } else {
        ISSUER_B
    }
}

/// Endpoints: two per node, incarnations 1 and 2.
pub fn endpoint(e: u8) -> Address {
    let e = u64::from(e % 4);
    Address::new(NodeId(2 + e / 2), 1 + e % 2, 10 + e)
}

/// A fresh source per register operation id ("hosts mint a fresh source per publish").
pub fn source_of(op: u8) -> Address {
    let o = u64::from(op);
    Address::new(NodeId(4 + o % 2), 1 + (o / 2) % 2, 100 + o)
}

/// Reservation owners: two, on node 6.
pub fn owner(k: u8) -> Address {
    let k = u64::from(k % 2);
    Address::new(NodeId(6), 1 + k, 200 + k)
}

/// The owner an actor recovery record names: one for odd register ids, none for even ones.
fn recovery_owner(op: u8) -> Option<Address> {
    (op % 2 == 1).then(|| Address::new(NodeId(7), 1, 300 + u64::from(op)))
}

/// Operation id `op`: sequence number `op` of [`ISSUER_A`] (odd) or [`ISSUER_B`] (even).
pub fn oid(op: u8) -> OperationId {
    let issuer = if op % 2 == 1 { ISSUER_A } else { ISSUER_B };
    issuer.op(u64::from(op))
}

fn descriptor_of(endpoint: Address) -> Descriptor {
    Descriptor::new(vec![endpoint.node.0 as u8, endpoint.actor as u8]).unwrap()
}

/// Observations the workload draws on: revisions, incarnations and notices seen so far.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) history: Vec<DirectoryRequest>,
    pub(crate) requests: BTreeMap<RequestId, DirectoryRequest>,
    pub(crate) revisions: Vec<Revision>,
    pub(crate) incarnations: Vec<StreamIncarnation>,
    pub(crate) retires: Vec<Address>,
    pub(crate) displaced: Vec<(Address, StreamIncarnation)>,
    pub(crate) watched: BTreeSet<Address>,
    pub(crate) next_request: u64,
}

impl Seen {
    /// The source a `SourceRetired(i)` acknowledges: the i-th Retire target seen (modulo),
    /// or, before any, the source of one of the first six register ids.
    pub(crate) fn retired_source(&self, i: u8) -> Address {
        if self.retires.is_empty() {
            source_of(i % 6 + 1)
        } else {
            self.retires[usize::from(i) % self.retires.len()]
        }
    }

    /// The i-th watched target (modulo), if any is watched.
    pub(crate) fn watched_target(&self, i: u8) -> Option<Address> {
        let n = self.watched.len();
        (n > 0).then(|| {
            *self
                .watched
                .iter()
                .nth(usize::from(i) % n)
                .expect("an index below the length")
        })
    }

    fn recent_revision(&self, i: u8) -> Option<Revision> {
        if self.revisions.is_empty() {
            return None;
        }
        let n = self.revisions.len();
        let back = usize::from(i) % n.min(4);
        Some(self.revisions[n - 1 - back])
    }

    pub(crate) fn observe_reply(&mut self, body: &ReplyBody) {
        match body {
            ReplyBody::Registered(Ok(r))
            | ReplyBody::Unregistered(Ok(r))
            | ReplyBody::Renamed(Ok(r)) => self.revisions.push(r.revision),
            ReplyBody::LookedUp(Ok(n)) => self.revisions.push(n.revision),
            ReplyBody::Resolved(Ok(b)) => self.revisions.push(b.revision),
            ReplyBody::StreamOpened(Ok(m)) => {
                self.revisions.push(m.revision);
                if !self.incarnations.contains(&m.incarnation) {
                    self.incarnations.push(m.incarnation);
                }
            }
            _ => {}
        }
    }
}

/// The concrete request of a request-shaped step.
pub(crate) fn request_of(
    step: &Step,
    seen: &Seen,
    epoch: AuthorityEpoch,
) -> Option<DirectoryRequest> {
    Some(match *step {
        Step::Register {
            path,
            op,
            long,
            file,
            reservation,
        } => {
            let source = source_of(op);
            let recovery = if file {
                SourceRecovery::File {
                    path: FileRef::new(format!("/data/{op}")).unwrap(),
                    source,
                }
            } else {
                SourceRecovery::Actor {
                    actor: source,
                    node: source.node,
                    owner: recovery_owner(op),
                }
            };
            DirectoryRequest::Register {
                path: path.path(),
                source,
                source_node: source.node,
                length: if long { 20 } else { 10 },
                recovery,
                operation: oid(op),
                reservation: reservation.map(oid),
            }
        }
        Step::Resolve(path) => DirectoryRequest::Resolve { path: path.path() },
        Step::Lookup(path) => DirectoryRequest::Lookup { path: path.path() },
        Step::Reserve { path, op, owner: k } => DirectoryRequest::ReserveBlob {
            path: path.path(),
            operation: oid(op),
            owner: owner(k),
        },
        Step::Release { path, op } => DirectoryRequest::ReleaseBlobReservation {
            path: path.path(),
            operation: oid(op),
        },
        Step::Unregister { path, expected, op } => DirectoryRequest::Unregister {
            path: path.path(),
            expected_revision: match expected {
                Expect::None => None,
                Expect::Recent(i) => seen.recent_revision(i),
            },
            operation: oid(op),
        },
        Step::Rename {
            from,
            to,
            replace,
            op,
        } => DirectoryRequest::Rename {
            source: from.path(),
            destination: to.path(),
            replace,
            operation: oid(op),
        },
        Step::Open {
            path,
            role,
            endpoint: e,
            replace,
            ensure,
            expected,
            op,
        } => {
            let endpoint = endpoint(e);
            DirectoryRequest::OpenStream {
                path: path.path(),
                role,
                descriptor: descriptor_of(endpoint),
                endpoint,
                replace,
                ensure,
                expected_revision: match expected {
                    Expect::None => None,
                    Expect::Recent(i) => seen.recent_revision(i),
                },
                operation: oid(op),
            }
        }
        Step::Cancel { path, op } => DirectoryRequest::CancelStream {
            path: path.path(),
            operation: oid(op),
        },
        Step::Close { path, inc } => {
            let incarnation = match inc {
                IncPick::Seen(i) if !seen.incarnations.is_empty() => {
                    let n = seen.incarnations.len();
                    seen.incarnations[n - 1 - usize::from(i) % n]
                }
                IncPick::Seen(_) => StreamIncarnation {
                    epoch,
                    revision: Revision(1),
                },
                IncPick::Current(r) => StreamIncarnation {
                    epoch,
                    revision: Revision(u64::from(r)),
                },
            };
            DirectoryRequest::CloseStream {
                path: path.path(),
                incarnation,
            }
        }
        Step::Replay { back, .. } => {
            let n = seen.history.len();
            if n == 0 {
                return None;
            }
            seen.history[n - 1 - usize::from(back) % n].clone()
        }
        Step::Done { below, who } => DirectoryRequest::OperationsDone {
            issuer: done_issuer(who),
            below: u64::from(below),
        },
        _ => return None,
    })
}

/// Drives `steps` against a directory alone, without the model; returns the directory with
/// its durable log (every `Persist` taken as durable). A StreamDisplaced before any Displaced
/// notice, a route report while nothing is watched and a replay before any request are
/// skipped.
pub fn drive(steps: &[Step]) -> Dir {
    let mut d = Dir::new();
    let mut seen = Seen {
        next_request: 1,
        ..Seen::default()
    };
    for step in steps {
        let effects = match step {
            Step::Tick => d.tick(),
            Step::Restart => d.restart(),
            Step::SourceRetired(i) => {
                let source = seen.retired_source(*i);
                d.deliver(Message::SourceRetired { source })
            }
            Step::StreamDisplaced(i) => {
                let Some(&(endpoint, incarnation)) = seen
                    .displaced
                    .get(usize::from(*i) % seen.displaced.len().max(1))
                else {
                    continue;
                };
                d.deliver(Message::StreamDisplaced {
                    endpoint,
                    incarnation,
                })
            }
            Step::Route { target, routable } => {
                let Some(target) = seen.watched_target(*target) else {
                    continue;
                };
                d.route(target, *routable)
            }
            Step::Gone(g) => {
                let scope = g.scope();
                d.deliver(Message::AddressGone {
                    scope,
                    reply_to: HOST,
                })
            }
            Step::Done { who, .. } => {
                let Some(request) = request_of(step, &seen, d.dir.epoch()) else {
                    continue;
                };
                seen.next_request += 1;
                d.deliver(Message::Call(dataplane_core::wire::DirectoryCall {
                    request_id: RequestId(1 << 40 | seen.next_request),
                    reply_to: done_caller(*who),
                    request,
                }))
            }
            _ => {
                let Some(request) = request_of(step, &seen, d.dir.epoch()) else {
                    continue;
                };
                seen.history.push(request.clone());
                d.call_raw(request).1
            }
        };
        for effect in &effects {
            match effect {
                Effect::Send {
                    message: Message::Reply(reply),
                    ..
                } => seen.observe_reply(&reply.body),
                Effect::Send {
                    to,
                    message: Message::Retire { .. },
                } => seen.retires.push(*to),
                Effect::Send {
                    to,
                    message: Message::Displaced { incarnation, .. },
                } => seen.displaced.push((*to, *incarnation)),
                Effect::WatchRoute { target } => {
                    seen.watched.insert(*target);
                }
                Effect::UnwatchRoute { target } => {
                    seen.watched.remove(target);
                }
                _ => {}
            }
        }
    }
    d
}

//! `proxy_directory`: two proxies and a directory under an arbitrary schedule taken from the
//! fuzzer's bytes: caller requests and cancels, frame deliveries in any order, drops and
//! duplicates, directory restarts (a new node incarnation and authority epoch), discovery
//! changes (the current authority, none, or a stale one), proxy restarts, clock advances that
//! fire the machines' ticks, acknowledgements of the directory's notices, gone reports, and
//! forged directory replies (any variant, any epoch) to exercise the proxy's filters.
//!
//! Safety invariants checked on every step (the simulator's proxy checkers, SPEC §13.7):
//!
//! * **S27/S8b**: every reply a caller receives answers one of its outstanding requests,
//!   exactly once, from the proxy it asked, in its request's reply variant; a forwarded reply
//!   carries the directory's body (or `Protocol` if the directory answered another variant);
//! * **S26**: a forwarded reply carries the epoch of the authority the proxy discovers, and
//!   comes in the step that delivered that reply; nothing is forwarded while nothing is
//!   discovered; calls go only to the discovered address;
//! * **L8**: a retraction leaves a proxy's pending table only in the step that delivers an
//!   acknowledgement of it from the discovered epoch; every dispatched retraction is kept;
//!   no retraction is ever answered with a synthetic expiry;
//! * **Q10**: a synthetic `DirectoryUnavailable`/`Timeout` comes only at or after the
//!   deadline (or, for a read that saw no directory since admission, `DirectoryUnavailable`
//!   after the absent-read wait), `DirectoryUnavailable` only if no directory was discoverable
//!   since admission, `Timeout` only if one was; after a proxy tick, no caller request has
//!   waited a deadline;
//! * `check_invariants()` of every proxy and of the directory after every step; no panic.
//!
//! After the schedule the network heals (every proxy discovers the running directory, frames
//! are delivered, notices acknowledged, the clock ticks past the deadline), and then every
//! caller request has had its one reply and no proxy holds anything pending (L7, L8).
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::{Limit, NamespaceError};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::log::LogRecord;
use dataplane_core::path::DataPath;
use dataplane_core::proxy::{Discovered, Proxy, ProxyConfig};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, GoneScope, Message, ReplyBody,
    RequestKind, SourceRecovery, StreamRole,
};
use libfuzzer_sys::fuzz_target;

const PROXIES: usize = 2;
const CALLERS: usize = 4;
const ACTIONS_MAX: usize = 512;
const RETRY: Duration = Duration::from_secs(1);
const DEADLINE: Duration = Duration::from_secs(10);
/// How long a read waits with no directory before it fails early (`absent_read_wait`).
const ABSENT_READ_WAIT: Duration = Duration::from_secs(4);
/// Proxy boots number their requests from `boot * ID_SPACING + 1` (above every id of the
/// instance before).
const ID_SPACING: u64 = 1_000_000;
const HOST: Address = Address::new(NodeId(9), 1, 0);
const PATHS: [&str; 3] = ["/a", "/b", "/a/c"];

// ---------------------------------------------------------------------------------------------
// The schedule
// ---------------------------------------------------------------------------------------------

fn role(u: &mut Unstructured<'_>) -> arbitrary::Result<StreamRole> {
    Ok(if u.arbitrary::<bool>()? {
        StreamRole::Source
    } else {
        StreamRole::Sink
    })
}

/// A caller's request, with small numbers folded into a few paths, ids and actors.
#[derive(Clone, Debug, Arbitrary)]
enum Req {
    Register {
        path: u8,
        op: u8,
        source: u8,
        reservation: Option<u8>,
    },
    Resolve {
        path: u8,
    },
    Lookup {
        path: u8,
    },
    Reserve {
        path: u8,
        op: u8,
    },
    Release {
        path: u8,
        op: u8,
    },
    Unregister {
        path: u8,
        op: u8,
        expected: Option<u8>,
    },
    Rename {
        from: u8,
        to: u8,
        replace: bool,
        op: u8,
    },
    Open {
        path: u8,
        #[arbitrary(with = role)]
        role: StreamRole,
        endpoint: u8,
        replace: bool,
        ensure: bool,
        expected: Option<u8>,
        op: u8,
    },
    CancelStream {
        path: u8,
        op: u8,
    },
    Close {
        path: u8,
        /// The i-th matched incarnation seen (or a made-up one).
        pick: u8,
    },
}

/// What discovery reports.
#[derive(Clone, Copy, Debug, Arbitrary)]
enum Which {
    /// The running directory and its epoch.
    Current,
    /// Nothing discoverable.
    Nothing,
    /// An earlier authority (a stale discovery answer).
    Stale(u8),
}

/// Which epoch a forged reply carries.
#[derive(Clone, Copy, Debug, Arbitrary)]
enum ForgedEpoch {
    /// The epoch the proxy discovers.
    Discovered,
    /// The synthetic epoch 0.
    Zero,
    /// Some other epoch.
    Other(u8),
}

#[derive(Clone, Debug, Arbitrary)]
enum Action {
    Call {
        caller: u8,
        request: Req,
    },
    Cancel {
        caller: u8,
    },
    /// Deliver the i-th frame in flight (any order).
    Deliver {
        pick: u8,
    },
    /// Deliver everything in flight, in order (frames sent meanwhile wait).
    DeliverAll,
    Drop {
        pick: u8,
    },
    Duplicate {
        pick: u8,
    },
    /// Move the clock and fire the timers that are due.
    Advance {
        secs: u8,
    },
    RestartDirectory,
    Discover {
        proxy: u8,
        which: Which,
    },
    RestartProxy {
        proxy: u8,
    },
    /// Acknowledge the i-th Retire or Displaced notice the directory sent.
    Ack {
        pick: u8,
    },
    /// A host reports an endpoint gone.
    Gone {
        endpoint: u8,
    },
    /// A reply the directory never sent, for one of the proxy's pending ids.
    Forge {
        proxy: u8,
        pick: u8,
        kind: u8,
        epoch: ForgedEpoch,
    },
}

fn path(i: u8) -> DataPath {
    DataPath::new(PATHS[usize::from(i) % PATHS.len()]).unwrap()
}

fn op(i: u8) -> OperationId {
    OperationId(u128::from(i % 24) + 1)
}

fn endpoint(e: u8) -> Address {
    let e = u64::from(e % 4);
    Address::new(NodeId(3 + e / 2), 1, 10 + e)
}

fn source(s: u8) -> Address {
    Address::new(NodeId(5), 1, 100 + u64::from(s % 4))
}

fn caller_address(c: usize) -> Address {
    Address::new(NodeId(1 + (c % PROXIES) as u64), 1, 10 + c as u64)
}

fn proxy_address(p: usize) -> Address {
    Address::new(NodeId(1 + p as u64), 1, 0)
}

fn proxy_of(address: Address) -> Option<usize> {
    (0..PROXIES).find(|&p| proxy_address(p) == address)
}

// ---------------------------------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Frame {
    to: Address,
    message: Message,
}

/// A caller request the checker waits to see answered.
#[derive(Clone, Debug)]
struct Outstanding {
    proxy: usize,
    kind: RequestKind,
    admitted_at: Instant,
    saw_directory: bool,
}

struct ProxyNode {
    proxy: Proxy,
    timer: Option<Instant>,
    boot: u64,
    /// Retractions pending after the last step (L8).
    retractions: BTreeSet<RequestId>,
}

/// What a proxy is fed in one step.
#[derive(Clone, Debug)]
enum Input {
    Call(DirectoryCall),
    Cancel(Address),
    Reply(DirectoryReply),
    Discovery(Option<Discovered>),
    Timer,
}

struct World {
    now: Instant,
    dir: Directory,
    dir_address: Address,
    dir_timer: Option<Instant>,
    dir_boot: u64,
    log: Vec<LogRecord>,
    /// Every authority that ever served, oldest first.
    authorities: Vec<Discovered>,
    proxies: Vec<ProxyNode>,
    caller_ids: [u64; CALLERS],
    in_flight: Vec<Frame>,
    /// Retire / Displaced notices the directory sent to sources and endpoints.
    notices: Vec<(Address, Message)>,
    outstanding: BTreeMap<(Address, RequestId), Outstanding>,
    incarnations: Vec<StreamIncarnation>,
    revisions: Vec<Revision>,
}

impl World {
    fn new() -> World {
        let dir_address = Address::new(NodeId(0), 1, 0);
        let mut out = Outbox::new();
        let dir = Directory::recover(
            DirectoryConfig {
                address: dir_address,
                retry_period: RETRY,
                limits: Default::default(),
            },
            &[],
            &mut ActorSources,
            Instant::ZERO,
            &mut out,
        )
        .expect("a new directory");
        let authority = Discovered {
            address: dir_address,
            epoch: dir.epoch(),
        };
        let mut w = World {
            now: Instant::ZERO,
            dir,
            dir_address,
            dir_timer: None,
            dir_boot: 1,
            log: Vec::new(),
            authorities: vec![authority],
            proxies: Vec::new(),
            caller_ids: [0; CALLERS],
            in_flight: Vec::new(),
            notices: Vec::new(),
            outstanding: BTreeMap::new(),
            incarnations: Vec::new(),
            revisions: Vec::new(),
        };
        w.directory_effects(out.take());
        for p in 0..PROXIES {
            let mut out = Outbox::new();
            let proxy = Proxy::new(Self::proxy_config(p, 0), w.now, &mut out);
            w.proxies.push(ProxyNode {
                proxy,
                timer: None,
                boot: 0,
                retractions: BTreeSet::new(),
            });
            let effects = out.take();
            w.absorb_proxy_effects(p, effects);
            w.proxy_step(p, Input::Discovery(Some(authority)));
        }
        w
    }

    fn proxy_config(p: usize, boot: u64) -> ProxyConfig {
        ProxyConfig {
            address: proxy_address(p),
            retry_period: RETRY,
            deadline: DEADLINE,
            absent_read_wait: ABSENT_READ_WAIT,
            first_request_id: boot * ID_SPACING + 1,
            pending_max: dataplane_core::limits::PROXY_PENDING_MAX,
        }
    }

    fn authority(&self) -> Discovered {
        Discovered {
            address: self.dir_address,
            epoch: self.dir.epoch(),
        }
    }

    // ----- the directory -------------------------------------------------------------------

    fn directory_effects(&mut self, effects: Vec<Effect>) {
        let epoch = self.dir.epoch();
        for effect in effects {
            match effect {
                Effect::Persist(record) => self.log.push(record),
                Effect::SetTimer { at, .. } => self.dir_timer = Some(at),
                Effect::CancelTimer { .. } => self.dir_timer = None,
                Effect::WatchRoute { .. } | Effect::UnwatchRoute { .. } => {}
                Effect::Send { to, message } => match message {
                    Message::Reply(ref reply) => {
                        assert_eq!(reply.epoch, epoch, "a directory reply of another epoch");
                        assert!(proxy_of(to).is_some(), "a directory reply to {to}");
                        self.in_flight.push(Frame { to, message });
                    }
                    Message::Retire { .. } | Message::Displaced { .. } => {
                        self.notices.push((to, message));
                    }
                    Message::GoneAcknowledged { .. } => {}
                    other => panic!("the directory sent {other:?} to {to}"),
                },
            }
        }
        if let Err(e) = self.dir.check_invariants() {
            panic!("directory invariant: {e}");
        }
    }

    fn directory_message(&mut self, message: Message) {
        let mut out = Outbox::new();
        self.dir
            .handle_message(self.now, message, &mut out)
            .expect("the directory refused a well-formed frame");
        let effects = out.take();
        self.directory_effects(effects);
    }

    fn directory_timer(&mut self) {
        self.dir_timer = None;
        let mut out = Outbox::new();
        self.dir
            .handle_timer(self.now, Timer::DirectoryRetry, &mut out)
            .expect("directory tick");
        let effects = out.take();
        self.directory_effects(effects);
    }

    /// Crash and recover at a new node incarnation (frames to the old address are lost).
    fn restart_directory(&mut self) {
        self.dir_boot += 1;
        self.dir_address = Address::new(NodeId(0), self.dir_boot, 0);
        let mut out = Outbox::new();
        let config = DirectoryConfig {
            address: self.dir_address,
            retry_period: RETRY,
            limits: Default::default(),
        };
        self.dir = Directory::recover(config, &self.log, &mut ActorSources, self.now, &mut out)
            .expect("the directory recovers from its own log");
        self.dir_timer = None;
        self.authorities.push(self.authority());
        let effects = out.take();
        self.directory_effects(effects);
    }

    // ----- the proxies ----------------------------------------------------------------------

    fn absorb_proxy_effects(&mut self, p: usize, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::SetTimer { at, .. } => self.proxies[p].timer = Some(at),
                Effect::CancelTimer { .. } => self.proxies[p].timer = None,
                Effect::Send { to, message } => self.in_flight.push(Frame { to, message }),
                other => panic!("proxy {p} asked for {other:?}"),
            }
        }
    }

    /// Feeds proxy `p` one input and checks the step.
    fn proxy_step(&mut self, p: usize, input: Input) {
        let now = self.now;
        let discovered_before = self.proxies[p].proxy.directory();
        // Admission bookkeeping.
        match &input {
            Input::Call(call) => {
                let key = (call.reply_to, call.request_id);
                let o = Outstanding {
                    proxy: p,
                    kind: call.request.kind(),
                    admitted_at: now,
                    saw_directory: discovered_before.is_some(),
                };
                assert!(
                    self.outstanding.insert(key, o).is_none(),
                    "caller id reused"
                );
            }
            Input::Cancel(caller) => {
                self.outstanding
                    .retain(|(c, _), o| !(o.proxy == p && c == caller));
            }
            Input::Discovery(Some(_)) => {
                for o in self.outstanding.values_mut().filter(|o| o.proxy == p) {
                    o.saw_directory = true;
                }
            }
            Input::Discovery(None) | Input::Reply(_) | Input::Timer => {}
        }
        let mut out = Outbox::new();
        let node = &mut self.proxies[p];
        match input.clone() {
            Input::Call(call) => node
                .proxy
                .handle_message(now, Message::ProxyCall(call), &mut out)
                .expect("ProxyCall"),
            Input::Cancel(reply_to) => node
                .proxy
                .handle_message(now, Message::ProxyCancel { reply_to }, &mut out)
                .expect("ProxyCancel"),
            Input::Reply(reply) => node
                .proxy
                .handle_message(now, Message::Reply(reply), &mut out)
                .expect("Reply"),
            Input::Discovery(found) => node.proxy.handle_discovery(now, found, &mut out),
            Input::Timer => {
                node.timer = None;
                node.proxy
                    .handle_timer(now, Timer::ProxyRetry, &mut out)
                    .expect("proxy tick");
            }
        }
        let effects = out.take();
        let discovered = self.proxies[p].proxy.directory();
        for effect in &effects {
            let Effect::Send { to, message } = effect else {
                continue;
            };
            match message {
                Message::Reply(reply) => self.check_caller_reply(p, &input, *to, reply),
                Message::Call(call) => {
                    assert_eq!(
                        discovered.map(|d| d.address),
                        Some(*to),
                        "a call dispatched to {to} while discovering {discovered:?}"
                    );
                    assert_eq!(call.reply_to, proxy_address(p), "a call's reply_to");
                }
                other => panic!("proxy {p} sent {other:?} to {to}"),
            }
        }
        self.check_retractions(p, &input, &effects);
        if let Input::Timer = input
            && let Some(((caller, id), o)) = self.outstanding.iter().find(|(_, o)| {
                o.proxy == p
                    && !o.kind.is_retraction()
                    && now.saturating_since(o.admitted_at) >= DEADLINE
            })
        {
            panic!(
                "L7: {caller}'s {:?} {id} still waiting after a tick at {} (admitted at {})",
                o.kind, now, o.admitted_at
            );
        }
        if let Err(e) = self.proxies[p].proxy.check_invariants() {
            panic!("proxy {p} invariant: {e}");
        }
        // Callers are local: their replies arrive at once. Everything else goes on the wire.
        let effects = effects
            .into_iter()
            .filter(|e| {
                !matches!(
                    e,
                    Effect::Send {
                        message: Message::Reply(_),
                        ..
                    }
                )
            })
            .collect();
        self.absorb_proxy_effects(p, effects);
    }

    /// S27, S8b, S26 and Q10 for one reply a proxy sent to a caller.
    fn check_caller_reply(&mut self, p: usize, input: &Input, to: Address, reply: &DirectoryReply) {
        let key = (to, reply.request_id);
        let Some(o) = self.outstanding.remove(&key) else {
            panic!(
                "S27: reply {} to {to} for no outstanding request",
                reply.request_id
            );
        };
        assert_eq!(o.proxy, p, "S27: {to}'s request answered by another proxy");
        assert_eq!(
            reply.body.kind(),
            o.kind,
            "S8b: a {:?} request answered with a {:?} reply",
            o.kind,
            reply.body.kind()
        );
        self.observe(&reply.body);
        if reply.epoch == AuthorityEpoch::NONE {
            let waited = self.now.saturating_since(o.admitted_at);
            match reply.body.err() {
                Some(e @ (NamespaceError::DirectoryUnavailable(_) | NamespaceError::Timeout)) => {
                    assert!(
                        !o.kind.is_retraction(),
                        "L8: a {:?} retraction expired",
                        o.kind
                    );
                    // Early only for a read, only unavailable, only with no directory since its
                    // admission, only after the absent-read wait.
                    let early_read = matches!(o.kind, RequestKind::Resolve | RequestKind::Lookup)
                        && matches!(e, NamespaceError::DirectoryUnavailable(_))
                        && !o.saw_directory
                        && waited >= ABSENT_READ_WAIT;
                    assert!(
                        waited >= DEADLINE || early_read,
                        "a {:?} expired after {waited} ({e:?}), before the deadline {DEADLINE}",
                        o.kind
                    );
                    let timeout = matches!(e, NamespaceError::Timeout);
                    assert_eq!(
                        timeout, o.saw_directory,
                        "Q10: answered {e:?}, saw a directory: {}",
                        o.saw_directory
                    );
                }
                Some(NamespaceError::LimitReached(Limit::PendingRequests | Limit::RequestIds)) => {}
                other => panic!("a synthetic reply (epoch 0) carrying {other:?}"),
            }
            return;
        }
        let discovered = self.proxies[p].proxy.directory();
        let Input::Reply(from_directory) = input else {
            panic!(
                "S26: forwarded a reply of {} in a step without one",
                reply.epoch
            );
        };
        assert_eq!(
            from_directory.epoch, reply.epoch,
            "S26: the forwarded epoch changed"
        );
        assert_eq!(
            discovered.map(|d| d.epoch),
            Some(reply.epoch),
            "S26: forwarded a reply of {} while discovering {discovered:?}",
            reply.epoch
        );
        if from_directory.body.kind() == o.kind {
            assert_eq!(
                reply.body, from_directory.body,
                "the forwarded body changed"
            );
        } else {
            assert!(
                matches!(reply.body.err(), Some(NamespaceError::Protocol(_))),
                "a {:?} reply to a {:?} request forwarded as {:?}",
                from_directory.body.kind(),
                o.kind,
                reply.body
            );
        }
    }

    /// L8: a retraction leaves only in the step that delivers its acknowledgement; every
    /// dispatched retraction is kept.
    fn check_retractions(&mut self, p: usize, input: &Input, effects: &[Effect]) {
        let proxy = &self.proxies[p].proxy;
        let now_held: BTreeSet<RequestId> = proxy
            .pending()
            .filter(|(_, pending)| pending.is_retraction())
            .map(|(id, _)| *id)
            .collect();
        let acknowledged = match input {
            Input::Reply(reply) if proxy.directory().is_some_and(|d| d.epoch == reply.epoch) => {
                Some(reply.request_id)
            }
            _ => None,
        };
        let before = &self.proxies[p].retractions;
        if let Some(gone) = before
            .iter()
            .find(|id| !now_held.contains(id) && Some(**id) != acknowledged)
        {
            panic!("L8: retraction {gone} left proxy {p} without an acknowledgement ({input:?})");
        }
        for effect in effects {
            if let Effect::Send {
                message: Message::Call(call),
                ..
            } = effect
                && call.request.kind().is_retraction()
            {
                assert!(
                    now_held.contains(&call.request_id),
                    "L8: retraction {} dispatched but not kept by proxy {p}",
                    call.request_id
                );
            }
        }
        self.proxies[p].retractions = now_held;
    }

    fn restart_proxy(&mut self, p: usize) {
        let boot = self.proxies[p].boot + 1;
        let mut out = Outbox::new();
        let proxy = Proxy::new(Self::proxy_config(p, boot), self.now, &mut out);
        self.proxies[p] = ProxyNode {
            proxy,
            timer: None,
            boot,
            retractions: BTreeSet::new(),
        };
        // The old instance's callers are excused: they re-issue to the new one.
        self.outstanding.retain(|_, o| o.proxy != p);
        let effects = out.take();
        self.absorb_proxy_effects(p, effects);
    }

    // ----- the schedule ---------------------------------------------------------------------

    fn observe(&mut self, body: &ReplyBody) {
        match body {
            ReplyBody::StreamOpened(Ok(m)) => {
                self.revisions.push(m.revision);
                if !self.incarnations.contains(&m.incarnation) {
                    self.incarnations.push(m.incarnation);
                }
            }
            ReplyBody::LookedUp(Ok(n)) => self.revisions.push(n.revision),
            ReplyBody::Registered(Ok(r)) | ReplyBody::Renamed(Ok(r)) => {
                self.revisions.push(r.revision);
            }
            _ => {}
        }
    }

    fn revision(&self, pick: Option<u8>) -> Option<Revision> {
        let pick = usize::from(pick?);
        match self.revisions.len() {
            0 => Some(Revision(1 + pick as u64 % 8)),
            n => Some(self.revisions[n - 1 - pick % n.min(4)]),
        }
    }

    fn request(&self, req: &Req) -> DirectoryRequest {
        match *req {
            Req::Register {
                path: p,
                op: o,
                source: s,
                reservation,
            } => {
                let source = source(s);
                DirectoryRequest::Register {
                    path: path(p),
                    source,
                    source_node: source.node,
                    length: 10,
                    recovery: SourceRecovery::Actor {
                        actor: source,
                        node: source.node,
                        owner: None,
                    },
                    operation: op(o),
                    reservation: reservation.map(op),
                }
            }
            Req::Resolve { path: p } => DirectoryRequest::Resolve { path: path(p) },
            Req::Lookup { path: p } => DirectoryRequest::Lookup { path: path(p) },
            Req::Reserve { path: p, op: o } => DirectoryRequest::ReserveBlob {
                path: path(p),
                operation: op(o),
                owner: Address::new(NodeId(6), 1, 200),
            },
            Req::Release { path: p, op: o } => DirectoryRequest::ReleaseBlobReservation {
                path: path(p),
                operation: op(o),
            },
            Req::Unregister {
                path: p,
                op: o,
                expected,
            } => DirectoryRequest::Unregister {
                path: path(p),
                expected_revision: self.revision(expected),
                operation: op(o),
            },
            Req::Rename {
                from,
                to,
                replace,
                op: o,
            } => DirectoryRequest::Rename {
                source: path(from),
                destination: path(to),
                replace,
                operation: op(o),
            },
            Req::Open {
                path: p,
                role,
                endpoint: e,
                replace,
                ensure,
                expected,
                op: o,
            } => {
                let endpoint = endpoint(e);
                DirectoryRequest::OpenStream {
                    path: path(p),
                    role,
                    descriptor: Descriptor::new(vec![endpoint.actor as u8]).unwrap(),
                    endpoint,
                    replace,
                    ensure,
                    expected_revision: self.revision(expected),
                    operation: op(o),
                }
            }
            Req::CancelStream { path: p, op: o } => DirectoryRequest::CancelStream {
                path: path(p),
                operation: op(o),
            },
            Req::Close { path: p, pick } => {
                let incarnation = match self.incarnations.len() {
                    0 => StreamIncarnation {
                        epoch: self.dir.epoch(),
                        revision: Revision(1 + u64::from(pick % 8)),
                    },
                    n => self.incarnations[n - 1 - usize::from(pick) % n],
                };
                DirectoryRequest::CloseStream {
                    path: path(p),
                    incarnation,
                }
            }
        }
    }

    /// Delivers frame `i` (removed from flight).
    fn deliver(&mut self, i: usize) {
        let frame = self.in_flight.remove(i);
        if frame.to == self.dir_address {
            self.directory_message(frame.message);
        } else if let Some(p) = proxy_of(frame.to) {
            match frame.message {
                Message::Reply(reply) => self.proxy_step(p, Input::Reply(reply)),
                other => panic!("a frame {other:?} to proxy {p}"),
            }
        }
        // Anything else was addressed to a directory instance that no longer runs: lost.
    }

    fn advance(&mut self, secs: u8) {
        self.now = self
            .now
            .saturating_add(Duration::from_secs(u64::from(secs % 16)));
        let mut due: Vec<(Instant, usize)> = self
            .proxies
            .iter()
            .enumerate()
            .filter_map(|(p, n)| n.timer.filter(|at| *at <= self.now).map(|at| (at, p)))
            .collect();
        if let Some(at) = self.dir_timer.filter(|at| *at <= self.now) {
            due.push((at, PROXIES));
        }
        due.sort();
        for (_, which) in due {
            if which == PROXIES {
                self.directory_timer();
            } else {
                self.proxy_step(which, Input::Timer);
            }
        }
    }

    fn act(&mut self, action: &Action) {
        match action {
            Action::Call { caller, request } => {
                let c = usize::from(*caller) % CALLERS;
                self.caller_ids[c] += 1;
                let call = DirectoryCall {
                    request_id: RequestId(self.caller_ids[c]),
                    reply_to: caller_address(c),
                    request: self.request(request),
                };
                self.proxy_step(c % PROXIES, Input::Call(call));
            }
            Action::Cancel { caller } => {
                let c = usize::from(*caller) % CALLERS;
                self.proxy_step(c % PROXIES, Input::Cancel(caller_address(c)));
            }
            Action::Deliver { pick } => {
                if !self.in_flight.is_empty() {
                    let i = usize::from(*pick) % self.in_flight.len();
                    self.deliver(i);
                }
            }
            Action::DeliverAll => {
                for _ in 0..self.in_flight.len() {
                    if self.in_flight.is_empty() {
                        break;
                    }
                    self.deliver(0);
                }
            }
            Action::Drop { pick } => {
                if !self.in_flight.is_empty() {
                    let i = usize::from(*pick) % self.in_flight.len();
                    self.in_flight.remove(i);
                }
            }
            Action::Duplicate { pick } => {
                if !self.in_flight.is_empty() {
                    let i = usize::from(*pick) % self.in_flight.len();
                    let copy = self.in_flight[i].clone();
                    self.in_flight.push(copy);
                }
            }
            Action::Advance { secs } => self.advance(*secs),
            Action::RestartDirectory => self.restart_directory(),
            Action::Discover { proxy, which } => {
                let found = match *which {
                    Which::Current => Some(self.authority()),
                    Which::Nothing => None,
                    Which::Stale(i) => {
                        let n = self.authorities.len();
                        Some(self.authorities[n - 1 - usize::from(i) % n])
                    }
                };
                self.proxy_step(usize::from(*proxy) % PROXIES, Input::Discovery(found));
            }
            Action::RestartProxy { proxy } => self.restart_proxy(usize::from(*proxy) % PROXIES),
            Action::Ack { pick } => {
                if self.notices.is_empty() {
                    return;
                }
                let (to, notice) = self.notices[usize::from(*pick) % self.notices.len()].clone();
                let ack = match notice {
                    Message::Retire { .. } => Message::SourceRetired { source: to },
                    Message::Displaced { incarnation, .. } => Message::StreamDisplaced {
                        endpoint: to,
                        incarnation,
                    },
                    _ => unreachable!("only notices are kept"),
                };
                self.directory_message(ack);
            }
            Action::Gone { endpoint: e } => {
                self.directory_message(Message::AddressGone {
                    scope: GoneScope::Address(endpoint(*e)),
                    reply_to: HOST,
                });
            }
            Action::Forge {
                proxy,
                pick,
                kind,
                epoch,
            } => {
                let p = usize::from(*proxy) % PROXIES;
                let ids: Vec<RequestId> =
                    self.proxies[p].proxy.pending().map(|(id, _)| *id).collect();
                if ids.is_empty() {
                    return;
                }
                let kind = RequestKind::ALL[usize::from(*kind) % RequestKind::ALL.len()];
                let epoch = match *epoch {
                    ForgedEpoch::Discovered => self.proxies[p]
                        .proxy
                        .directory()
                        .map_or(AuthorityEpoch(1), |d| d.epoch),
                    ForgedEpoch::Zero => AuthorityEpoch::NONE,
                    ForgedEpoch::Other(e) => AuthorityEpoch(u64::from(e)),
                };
                let reply = DirectoryReply {
                    request_id: ids[usize::from(*pick) % ids.len()],
                    epoch,
                    body: ReplyBody::error(kind, NamespaceError::Timeout),
                };
                self.proxy_step(p, Input::Reply(reply));
            }
        }
    }
}

impl World {
    /// The liveness phase: a healed network for longer than the deadline.
    fn heal(&mut self) {
        let authority = Some(self.authority());
        for p in 0..PROXIES {
            self.proxy_step(p, Input::Discovery(authority));
        }
        let rounds = (DEADLINE.as_millis() / 1000) as usize + 8;
        for _ in 0..rounds {
            for (to, notice) in std::mem::take(&mut self.notices) {
                let ack = match notice {
                    Message::Retire { .. } => Message::SourceRetired { source: to },
                    Message::Displaced { incarnation, .. } => Message::StreamDisplaced {
                        endpoint: to,
                        incarnation,
                    },
                    _ => unreachable!("only notices are kept"),
                };
                self.directory_message(ack);
            }
            // Frames sent while delivering are delivered too (a call, its reply, ...).
            for _ in 0..4 {
                while !self.in_flight.is_empty() {
                    self.deliver(0);
                }
            }
            self.advance(1);
        }
        if let Some(((caller, id), o)) = self.outstanding.iter().next() {
            panic!(
                "L7: {caller}'s {:?} {id} (admitted at {}) unanswered at {} on a healed network",
                o.kind, o.admitted_at, self.now
            );
        }
        for (p, node) in self.proxies.iter().enumerate() {
            if let Some((id, pending)) = node.proxy.pending().next() {
                panic!(
                    "L8: proxy {p} still holds {:?} {id} ({:?}) on a healed network",
                    pending.request.kind(),
                    pending.owner
                );
            }
        }
    }
}

fuzz_target!(|actions: Vec<Action>| {
    let mut world = World::new();
    for action in actions.iter().take(ACTIONS_MAX) {
        world.act(action);
    }
    world.heal();
});

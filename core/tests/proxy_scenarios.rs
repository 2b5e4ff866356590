//! Proxy scenarios (SPEC §5 and §13.7, as amended by DESIGN.md §5 and the `proxy` module docs):
//! one directory with its durable log, one or more proxies, their callers, and a network the
//! script controls frame by frame.
//!
//! The [`Harness`] reads like a script:
//!
//! * callers are addresses on a proxy's node: `h.caller(P0)`, `h.call(c, lookup("/a"))`,
//!   `h.cancel(c)`;
//! * every frame between a proxy and the directory waits in one in-flight queue:
//!   `h.deliver_next()`, `h.deliver_all()`, `h.drop_next(is_cancel)`, `h.hold(pred)` /
//!   `h.release_held()`, `h.duplicate_next(pred)`, and `h.blackhole(pred)` / `h.heal()` for a
//!   lossy link;
//! * the clock moves only when told: `h.advance(secs)` fires the proxy and directory ticks due
//!   (frames they send wait in flight), `h.run(secs)` also delivers everything after each tick;
//! * discovery is set per proxy: `h.discover(P0, h.authority())`, `h.discover(P0, None)`;
//! * the directory keeps its log from `Persist` effects: `h.restart_directory()` recovers it
//!   at a new node incarnation with a new authority epoch (frames still addressed to the old
//!   instance are lost);
//! * replies reach callers in process: `h.expect_reply(c, id)` takes the one reply to `id`, and
//!   the harness asserts on drop that no caller received anything the script did not expect.
//!
//! Every step checks the invariants of every machine.

use std::collections::{BTreeMap, VecDeque};

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig, Rendezvous};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::{InputError, Limit, NamespaceError};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::limits::PROXY_PENDING_MAX;
use dataplane_core::log::LogRecord;
use dataplane_core::proxy::{DEFAULT_DEADLINE, Discovered, Owner, Proxy, ProxyConfig};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::StreamRole::{Sink, Source};
use dataplane_core::wire::{
    BlobBinding, Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, EntryKind, GoneScope,
    Message, MutationReceipt, NamespaceNode, ReplyBody, RequestKind, StreamMatch, StreamRole,
};
use dataplane_testkit::dir::{actor_recovery, op, open_request, path};

// =============================================================================================
// The harness.

/// The proxies' tick period.
const RETRY_SECS: u64 = 1;
/// The request deadline used by most scenarios (short, so outages stay readable).
const DEADLINE_SECS: u64 = 10;

/// Proxy `p` numbers its requests from `1 + p * PROXY_ID_SPACING`, so a script can tell which
/// proxy a directory reply is for from its request id alone.
const PROXY_ID_SPACING: u64 = 1000;

/// A proxy, by index.
type P = usize;
const P0: P = 0;
const P1: P = 1;

/// Reads the directory's state on behalf of the script (never a proxy's caller).
const INSPECTOR: Address = Address::new(NodeId(99), 1, 0);

/// One frame on the wire between a proxy and the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    from: Address,
    to: Address,
    message: Message,
}

/// A reply as a caller received it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Received {
    at: Instant,
    reply: DirectoryReply,
}

#[derive(Debug)]
struct ProxyNode {
    proxy: Proxy,
    timer: Option<Instant>,
}

#[derive(Debug)]
struct Caller {
    proxy: P,
    next_id: u64,
    inbox: Vec<Received>,
}

type Rule = Box<dyn Fn(&Message) -> bool>;

struct Harness {
    now: Instant,
    retry: Duration,
    deadline: Duration,
    /// The proxies' `absent_read_wait`: the deadline (early read failures off) unless a test
    /// sets it.
    absent_read_wait: Duration,
    // The directory and its durable log.
    dir: Option<Directory>,
    dir_address: Address,
    dir_timer: Option<Instant>,
    log: Vec<LogRecord>,
    // Proxies and their callers.
    proxies: Vec<ProxyNode>,
    callers: BTreeMap<Address, Caller>,
    // The network between them.
    in_flight: VecDeque<Frame>,
    held: Vec<Frame>,
    blackholes: Vec<Rule>,
    /// Every frame put on the wire, with its send time.
    sent: Vec<(Instant, Frame)>,
    /// Every frame the network lost (dropped, blackholed, or addressed to a dead instance).
    lost: Vec<Frame>,
    /// Directory frames to sources and endpoints (not modelled here).
    elsewhere: Vec<Frame>,
    /// The effects of the last step.
    last_effects: Vec<Effect>,
}

#[allow(dead_code)]
impl Harness {
    /// `proxies` proxies, each discovering a fresh directory, with the short deadline.
    fn new(proxies: usize) -> Harness {
        Harness::with_deadline(proxies, Duration::from_secs(DEADLINE_SECS))
    }

    fn with_deadline(proxies: usize, deadline: Duration) -> Harness {
        let mut h = Harness {
            now: Instant::ZERO,
            retry: Duration::from_secs(RETRY_SECS),
            deadline,
            absent_read_wait: deadline,
            dir: None,
            dir_address: Address::new(NodeId(0), 0, 0),
            dir_timer: None,
            log: Vec::new(),
            proxies: Vec::new(),
            callers: BTreeMap::new(),
            in_flight: VecDeque::new(),
            held: Vec::new(),
            blackholes: Vec::new(),
            sent: Vec::new(),
            lost: Vec::new(),
            elsewhere: Vec::new(),
            last_effects: Vec::new(),
        };
        h.start_directory();
        for p in 0..proxies {
            h.add_proxy(1 + PROXY_ID_SPACING * p as u64);
        }
        for p in 0..proxies {
            h.discover(p, h.authority());
        }
        h
    }

    // ----- addresses -----------------------------------------------------------------------

    fn proxy_address(p: P) -> Address {
        Address::new(NodeId(1 + p as u64), 1, 0)
    }

    fn proxy_index(&self, address: Address) -> Option<P> {
        (0..self.proxies.len()).find(|&p| Self::proxy_address(p) == address)
    }

    // ----- machines --------------------------------------------------------------------------

    fn add_proxy(&mut self, first_request_id: u64) -> P {
        let p = self.proxies.len();
        let config = self.proxy_config(p, first_request_id);
        let mut out = Outbox::new();
        let proxy = Proxy::new(config, self.now, &mut out);
        self.proxies.push(ProxyNode { proxy, timer: None });
        let effects = out.take();
        self.proxy_effects(p, effects);
        p
    }

    fn proxy_config(&self, p: P, first_request_id: u64) -> ProxyConfig {
        ProxyConfig {
            address: Self::proxy_address(p),
            retry_period: self.retry,
            deadline: self.deadline,
            absent_read_wait: self.absent_read_wait,
            first_request_id,
            pending_max: PROXY_PENDING_MAX,
        }
    }

    /// Replaces proxy `p` by a fresh instance (its pending table is volatile).
    fn restart_proxy(&mut self, p: P, first_request_id: u64) {
        let config = self.proxy_config(p, first_request_id);
        let mut out = Outbox::new();
        self.proxies[p] = ProxyNode {
            proxy: Proxy::new(config, self.now, &mut out),
            timer: None,
        };
        let effects = out.take();
        self.proxy_effects(p, effects);
    }

    fn proxy(&self, p: P) -> &Proxy {
        &self.proxies[p].proxy
    }

    /// Starts a directory instance from the durable log, at the next node incarnation.
    fn start_directory(&mut self) {
        assert!(self.dir.is_none(), "the directory is already running");
        self.dir_address = Address::new(NodeId(0), self.dir_address.incarnation + 1, 0);
        let config = DirectoryConfig {
            address: self.dir_address,
            retry_period: self.retry,
            limits: Default::default(),
        };
        let mut out = Outbox::new();
        let dir = Directory::recover(config, &self.log, &mut ActorSources, self.now, &mut out)
            .expect("recovery from the harness log");
        self.dir = Some(dir);
        let effects = out.take();
        self.last_effects.clone_from(&effects);
        self.dir_effects(effects);
        self.check();
    }

    /// Stops the directory: its runtime state is gone, its log stays.
    fn crash_directory(&mut self) {
        assert!(self.dir.is_some(), "the directory is not running");
        self.dir = None;
        self.dir_timer = None;
    }

    fn restart_directory(&mut self) {
        self.crash_directory();
        self.start_directory();
    }

    fn dir(&self) -> &Directory {
        self.dir.as_ref().expect("the directory is running")
    }

    fn epoch(&self) -> AuthorityEpoch {
        self.dir().epoch()
    }

    /// What a correct discovery reports now: the running directory and its epoch.
    fn authority(&self) -> Option<Discovered> {
        self.dir.as_ref().map(|d| Discovered {
            address: self.dir_address,
            epoch: d.epoch(),
        })
    }

    fn discover(&mut self, p: P, found: Option<Discovered>) {
        let mut out = Outbox::new();
        self.proxies[p]
            .proxy
            .handle_discovery(self.now, found, &mut out);
        let effects = out.take();
        self.last_effects.clone_from(&effects);
        self.proxy_effects(p, effects);
        self.check();
    }

    // ----- effects ---------------------------------------------------------------------------

    fn proxy_effects(&mut self, p: P, effects: Vec<Effect>) {
        let from = Self::proxy_address(p);
        for effect in effects {
            match effect {
                Effect::Send { to, message } => {
                    if let Some(caller) = self.callers.get_mut(&to) {
                        assert_eq!(caller.proxy, p, "proxy {p} answered another node's caller");
                        let Message::Reply(reply) = message else {
                            panic!("proxy {p} sent {message:?} to its caller {to}");
                        };
                        caller.inbox.push(Received {
                            at: self.now,
                            reply,
                        });
                    } else {
                        assert_eq!(to.node, NodeId(0), "proxy {p} sent {message:?} to {to}");
                        match &message {
                            Message::Call(call) => assert_eq!(call.reply_to, from),
                            other => panic!("proxy {p} sent {other:?} to the directory"),
                        }
                        self.wire(Frame { from, to, message });
                    }
                }
                Effect::SetTimer {
                    timer: Timer::ProxyRetry,
                    at,
                } => self.proxies[p].timer = Some(at),
                other => panic!("unexpected proxy effect {other:?}"),
            }
        }
    }

    fn dir_effects(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Persist(record) => self.log.push(record),
                Effect::Send { to, message } => {
                    let frame = Frame {
                        from: self.dir_address,
                        to,
                        message,
                    };
                    if self.proxy_index(to).is_some() {
                        self.wire(frame);
                    } else {
                        self.elsewhere.push(frame);
                    }
                }
                Effect::SetTimer {
                    timer: Timer::DirectoryRetry,
                    at,
                } => self.dir_timer = Some(at),
                Effect::CancelTimer {
                    timer: Timer::DirectoryRetry,
                } => self.dir_timer = None,
                Effect::WatchRoute { .. } | Effect::UnwatchRoute { .. } => {}
                other => panic!("unexpected directory effect {other:?}"),
            }
        }
    }

    fn wire(&mut self, frame: Frame) {
        self.sent.push((self.now, frame.clone()));
        if self.blackholes.iter().any(|rule| rule(&frame.message)) {
            self.lost.push(frame);
        } else {
            self.in_flight.push_back(frame);
        }
    }

    fn check(&self) {
        for node in &self.proxies {
            node.proxy.check_invariants().expect("proxy invariants");
        }
        if let Some(dir) = &self.dir {
            dir.check_invariants().expect("directory invariants");
        }
    }

    // ----- callers ---------------------------------------------------------------------------

    /// A new caller on proxy `p`'s node.
    fn caller(&mut self, p: P) -> Address {
        let node = Self::proxy_address(p).node;
        let actor = 1 + self.callers.keys().filter(|a| a.node == node).count() as u64;
        let address = Address::new(node, 1, actor);
        self.callers.insert(
            address,
            Caller {
                proxy: p,
                next_id: 1,
                inbox: Vec::new(),
            },
        );
        address
    }

    fn next_caller_id(&mut self, caller: Address) -> (P, RequestId) {
        let c = self.callers.get_mut(&caller).expect("a known caller");
        let id = RequestId(c.next_id);
        c.next_id += 1;
        (c.proxy, id)
    }

    /// The caller's request, in process; returns the caller's own request id.
    fn call(&mut self, caller: Address, request: DirectoryRequest) -> RequestId {
        let (p, id) = self.next_caller_id(caller);
        let mut out = Outbox::new();
        self.proxies[p]
            .proxy
            .request(self.now, caller, id, request, &mut out);
        let effects = out.take();
        self.last_effects.clone_from(&effects);
        self.proxy_effects(p, effects);
        self.check();
        id
    }

    /// The caller's request as a `ProxyCall` frame from a local actor.
    fn call_by_frame(&mut self, caller: Address, request: DirectoryRequest) -> RequestId {
        let (p, id) = self.next_caller_id(caller);
        let call = DirectoryCall {
            request_id: id,
            reply_to: caller,
            request,
        };
        self.proxy_input(p, Message::ProxyCall(call))
            .expect("a ProxyCall is accepted");
        id
    }

    /// The caller gives up on everything it has pending, in process.
    fn cancel(&mut self, caller: Address) {
        let p = self.callers[&caller].proxy;
        let mut out = Outbox::new();
        self.proxies[p].proxy.cancel(self.now, caller, &mut out);
        let effects = out.take();
        self.last_effects.clone_from(&effects);
        self.proxy_effects(p, effects);
        self.check();
    }

    /// The same as a `ProxyCancel` frame.
    fn cancel_by_frame(&mut self, caller: Address) {
        let p = self.callers[&caller].proxy;
        self.proxy_input(p, Message::ProxyCancel { reply_to: caller })
            .expect("a ProxyCancel is accepted");
    }

    /// Feeds `message` to proxy `p` directly (not through the network).
    fn proxy_input(&mut self, p: P, message: Message) -> Result<(), InputError> {
        let mut out = Outbox::new();
        let result = self.proxies[p]
            .proxy
            .handle_message(self.now, message, &mut out);
        let effects = out.take();
        self.last_effects.clone_from(&effects);
        self.proxy_effects(p, effects);
        self.check();
        result
    }

    /// The one reply `caller` received for its request `id` (removed from its inbox).
    fn expect_received(&mut self, caller: Address, id: RequestId) -> Received {
        let inbox = &mut self.callers.get_mut(&caller).expect("a known caller").inbox;
        let at: Vec<usize> = (0..inbox.len())
            .filter(|&i| inbox[i].reply.request_id == id)
            .collect();
        assert_eq!(
            at.len(),
            1,
            "{caller} should hold exactly one reply to {id}; its inbox: {inbox:#?}"
        );
        inbox.remove(at[0])
    }

    fn expect_reply(&mut self, caller: Address, id: RequestId) -> ReplyBody {
        self.expect_received(caller, id).reply.body
    }

    /// The reply to `id`, which must carry `epoch`.
    fn expect_reply_in(
        &mut self,
        caller: Address,
        id: RequestId,
        epoch: AuthorityEpoch,
    ) -> ReplyBody {
        let received = self.expect_received(caller, id);
        assert_eq!(received.reply.epoch, epoch, "epoch of {received:?}");
        received.reply.body
    }

    fn expect_no_reply(&self, caller: Address) {
        let inbox = &self.callers[&caller].inbox;
        assert!(inbox.is_empty(), "{caller} received {inbox:#?}");
    }

    fn expect_no_replies(&self) {
        for caller in self.callers.keys() {
            self.expect_no_reply(*caller);
        }
    }

    // ----- network ---------------------------------------------------------------------------

    fn deliver(&mut self, frame: Frame) {
        let mut out = Outbox::new();
        if let Some(p) = self.proxy_index(frame.to) {
            self.proxies[p]
                .proxy
                .handle_message(self.now, frame.message, &mut out)
                .expect("the proxy accepts directory frames");
            let effects = out.take();
            self.last_effects.clone_from(&effects);
            self.proxy_effects(p, effects);
        } else if frame.to == self.dir_address && self.dir.is_some() {
            self.dir
                .as_mut()
                .expect("running")
                .handle_message(self.now, frame.message, &mut out)
                .expect("the directory accepts proxy frames");
            let effects = out.take();
            self.last_effects.clone_from(&effects);
            self.dir_effects(effects);
        } else {
            // Addressed to a directory instance that no longer runs.
            self.last_effects.clear();
            self.lost.push(frame);
        }
        self.check();
    }

    /// Delivers the oldest frame in flight.
    fn deliver_next(&mut self) -> Frame {
        let frame = self.in_flight.pop_front().expect("a frame in flight");
        self.deliver(frame.clone());
        frame
    }

    /// Delivers the oldest frame in flight that matches.
    fn deliver_next_where(&mut self, pred: impl Fn(&Message) -> bool) -> Frame {
        let i = self.position(&pred);
        let frame = self.in_flight.remove(i).expect("in range");
        self.deliver(frame.clone());
        frame
    }

    /// Delivers until nothing is in flight (answers included).
    fn deliver_all(&mut self) {
        let mut budget = 1_000_000;
        while let Some(frame) = self.in_flight.pop_front() {
            budget -= 1;
            assert!(budget > 0, "the network does not settle");
            self.deliver(frame);
        }
    }

    fn position(&self, pred: &impl Fn(&Message) -> bool) -> usize {
        self.in_flight
            .iter()
            .position(|f| pred(&f.message))
            .unwrap_or_else(|| panic!("no matching frame in flight: {:#?}", self.in_flight))
    }

    /// Loses the oldest matching frame in flight.
    fn drop_next(&mut self, pred: impl Fn(&Message) -> bool) -> Frame {
        let i = self.position(&pred);
        let frame = self.in_flight.remove(i).expect("in range");
        self.lost.push(frame.clone());
        frame
    }

    /// Loses every matching frame in flight; returns how many.
    fn drop_all(&mut self, pred: impl Fn(&Message) -> bool) -> usize {
        let (gone, kept): (Vec<Frame>, Vec<Frame>) =
            self.in_flight.drain(..).partition(|f| pred(&f.message));
        self.in_flight = kept.into();
        let n = gone.len();
        self.lost.extend(gone);
        n
    }

    /// Takes every matching frame off the wire until [`Harness::release_held`].
    fn hold(&mut self, pred: impl Fn(&Message) -> bool) -> usize {
        let (held, kept): (Vec<Frame>, Vec<Frame>) =
            self.in_flight.drain(..).partition(|f| pred(&f.message));
        self.in_flight = kept.into();
        let n = held.len();
        self.held.extend(held);
        n
    }

    /// Puts the held frames back in flight, ahead of everything sent since.
    fn release_held(&mut self) {
        for frame in self.held.drain(..).rev() {
            self.in_flight.push_front(frame);
        }
    }

    /// Duplicates the oldest matching frame in flight (the copy travels right behind it).
    fn duplicate_next(&mut self, pred: impl Fn(&Message) -> bool) {
        let i = self.position(&pred);
        let copy = self.in_flight[i].clone();
        self.in_flight.insert(i + 1, copy);
    }

    /// From now on the network loses every matching frame as it is sent.
    fn blackhole(&mut self, pred: impl Fn(&Message) -> bool + 'static) {
        self.blackholes.push(Box::new(pred));
    }

    /// Ends every blackhole.
    fn heal(&mut self) {
        self.blackholes.clear();
    }

    fn in_flight_count(&self, pred: impl Fn(&Message) -> bool) -> usize {
        self.in_flight.iter().filter(|f| pred(&f.message)).count()
    }

    /// A mark in the record of sent frames, for [`Harness::sent_after`].
    fn mark(&self) -> usize {
        self.sent.len()
    }

    /// How many matching frames were put on the wire after `mark`.
    fn sent_after(&self, mark: usize, pred: impl Fn(&Message) -> bool) -> usize {
        self.sent[mark..]
            .iter()
            .filter(|(_, f)| pred(&f.message))
            .count()
    }

    // ----- time ------------------------------------------------------------------------------

    /// Advances the clock by `secs`, firing every tick due; frames stay in flight.
    fn advance(&mut self, secs: u64) {
        self.advance_inner(secs, false);
    }

    /// Advances the clock by `secs` with a working network: everything in flight is delivered
    /// now and after every tick.
    fn run(&mut self, secs: u64) {
        self.deliver_all();
        self.advance_inner(secs, true);
    }

    fn advance_inner(&mut self, secs: u64, deliver: bool) {
        let until = self.now.saturating_add(Duration::from_secs(secs));
        loop {
            // The earliest due timer; the directory's first on ties, then proxies in order.
            let mut next: Option<(Instant, Option<P>)> = self.dir_timer.map(|at| (at, None));
            for (p, node) in self.proxies.iter().enumerate() {
                if let Some(at) = node.timer
                    && next.is_none_or(|(best, _)| at < best)
                {
                    next = Some((at, Some(p)));
                }
            }
            let Some((at, who)) = next.filter(|(at, _)| *at <= until) else {
                break;
            };
            self.now = at;
            let mut out = Outbox::new();
            match who {
                None => {
                    self.dir_timer = None;
                    self.dir
                        .as_mut()
                        .expect("a directory timer implies a directory")
                        .handle_timer(at, Timer::DirectoryRetry, &mut out)
                        .expect("the directory's timer");
                    let effects = out.take();
                    self.last_effects.clone_from(&effects);
                    self.dir_effects(effects);
                }
                Some(p) => {
                    self.proxies[p].timer = None;
                    self.proxies[p]
                        .proxy
                        .handle_timer(at, Timer::ProxyRetry, &mut out)
                        .expect("the proxy's timer");
                    let effects = out.take();
                    self.last_effects.clone_from(&effects);
                    self.proxy_effects(p, effects);
                }
            }
            self.check();
            if deliver {
                self.deliver_all();
            }
        }
        self.now = until;
    }

    fn secs(&self) -> u64 {
        self.now.as_nanos() / 1_000_000_000
    }

    // ----- inspection ------------------------------------------------------------------------

    /// Lookup asked of the directory itself, out of band (read-only: persists nothing).
    fn peek_lookup(&mut self, p: &str) -> Result<NamespaceNode, NamespaceError> {
        let mut out = Outbox::new();
        let call = DirectoryCall {
            request_id: RequestId(1),
            reply_to: INSPECTOR,
            request: lookup(p),
        };
        let now = self.now;
        self.dir
            .as_mut()
            .expect("running")
            .handle_message(now, Message::Call(call), &mut out)
            .unwrap();
        match out.take().as_slice() {
            [
                Effect::Send {
                    to: INSPECTOR,
                    message:
                        Message::Reply(DirectoryReply {
                            body: ReplyBody::LookedUp(result),
                            ..
                        }),
                },
            ] => result.clone(),
            other => panic!("a lookup answered {other:#?}"),
        }
    }

    /// The pending requests of proxy `p` as (kind, owner).
    fn pending(&self, p: P) -> Vec<(RequestKind, Owner)> {
        self.proxy(p)
            .pending()
            .map(|(_, r)| (r.request.kind(), r.owner))
            .collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // Nothing reached a caller that the script did not take.
            self.expect_no_replies();
        }
    }
}

// ----- requests, frames and values ----------------------------------------------------------

const S1: Address = Address::new(NodeId(50), 1, 1);
const S2: Address = Address::new(NodeId(50), 1, 2);
const E_SRC: Address = Address::new(NodeId(60), 1, 11);
const E_SNK: Address = Address::new(NodeId(61), 1, 12);

fn register(p: &str, source: Address, operation: u128) -> DirectoryRequest {
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

fn lookup(p: &str) -> DirectoryRequest {
    DirectoryRequest::Lookup { path: path(p) }
}

fn resolve(p: &str) -> DirectoryRequest {
    DirectoryRequest::Resolve { path: path(p) }
}

fn unregister(p: &str, operation: u128) -> DirectoryRequest {
    DirectoryRequest::Unregister {
        path: path(p),
        expected_revision: None,
        operation: op(operation),
    }
}

/// An ensure open (no replace) of `role` by `endpoint`.
fn open(p: &str, role: StreamRole, endpoint: Address, operation: u128) -> DirectoryRequest {
    open_request(p, role, endpoint, operation, false, true, None)
}

fn cancel_stream(p: &str, operation: u128) -> DirectoryRequest {
    DirectoryRequest::CancelStream {
        path: path(p),
        operation: op(operation),
    }
}

fn close(p: &str, incarnation: StreamIncarnation) -> DirectoryRequest {
    DirectoryRequest::CloseStream {
        path: path(p),
        incarnation,
    }
}

fn reserve(p: &str, operation: u128, owner: Address) -> DirectoryRequest {
    DirectoryRequest::ReserveBlob {
        path: path(p),
        operation: op(operation),
        owner,
    }
}

fn call_of(kind: RequestKind) -> impl Fn(&Message) -> bool {
    move |m| matches!(m, Message::Call(c) if c.request.kind() == kind)
}

fn reply_of(kind: RequestKind) -> impl Fn(&Message) -> bool {
    move |m| matches!(m, Message::Reply(r) if r.body.kind() == kind)
}

fn is_cancel(m: &Message) -> bool {
    call_of(RequestKind::CancelStream)(m)
}

fn is_close(m: &Message) -> bool {
    call_of(RequestKind::CloseStream)(m)
}

fn is_call(m: &Message) -> bool {
    matches!(m, Message::Call(_))
}

fn is_reply(m: &Message) -> bool {
    matches!(m, Message::Reply(_))
}

fn any(_: &Message) -> bool {
    true
}

fn e(n: u64) -> AuthorityEpoch {
    AuthorityEpoch(n)
}

fn inc(epoch: u64, revision: u64) -> StreamIncarnation {
    StreamIncarnation {
        epoch: AuthorityEpoch(epoch),
        revision: Revision(revision),
    }
}

fn receipt(n: u64) -> Result<MutationReceipt, NamespaceError> {
    Ok(MutationReceipt {
        revision: Revision(n),
    })
}

fn blob(n: u64) -> Result<NamespaceNode, NamespaceError> {
    Ok(NamespaceNode {
        kind: EntryKind::Blob,
        revision: Revision(n),
        active: false,
        lost: false,
    })
}

fn stream(n: u64, active: bool) -> Result<NamespaceNode, NamespaceError> {
    Ok(NamespaceNode {
        kind: EntryKind::Stream,
        revision: Revision(n),
        active,
        lost: false,
    })
}

fn binding(source: Address, n: u64) -> Result<BlobBinding, NamespaceError> {
    Ok(BlobBinding {
        source,
        source_node: source.node,
        owner: None,
        length: 10,
        revision: Revision(n),
    })
}

fn stream_match(incarnation: StreamIncarnation) -> StreamMatch {
    StreamMatch {
        incarnation,
        source: E_SRC,
        source_descriptor: Descriptor::new(vec![E_SRC.actor as u8]).unwrap(),
        sink: E_SNK,
        sink_descriptor: Descriptor::new(vec![E_SNK.actor as u8]).unwrap(),
        revision: incarnation.revision,
    }
}

fn is_unavailable(body: &ReplyBody, kind: RequestKind) -> bool {
    body.kind() == kind && matches!(body.err(), Some(NamespaceError::DirectoryUnavailable(_)))
}

fn timeout(kind: RequestKind) -> ReplyBody {
    ReplyBody::error(kind, NamespaceError::Timeout)
}

// =============================================================================================
// L9: recovery transparency.

/// A request made while no authority exists waits, and is answered by the authority as soon as
/// discovery reports it (before the deadline), with the durable result and the new epoch.
#[test]
fn parked_request_is_answered_once_the_authority_is_discovered() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    let register_a = h.call(a, register("/a", S1, 1));
    h.run(0);
    assert_eq!(
        h.expect_reply_in(a, register_a, e(1)),
        ReplyBody::Registered(receipt(1))
    );

    // The authority disappears: the directory stops and discovery has nothing.
    h.crash_directory();
    h.discover(P0, None);
    let lookup_a = h.call(b, lookup("/a"));
    let register_b = h.call(a, register("/b", S2, 2));
    h.run(DEADLINE_SECS - 2);
    assert_eq!(h.in_flight_count(any), 0);
    h.expect_no_replies();

    // It recovers (epoch 2) and is discovered two seconds before the deadline: the proxy
    // dispatches at once, in request order.
    h.start_directory();
    assert_eq!(h.epoch(), e(2));
    h.discover(P0, h.authority());
    assert_eq!(h.in_flight_count(is_call), 2);
    h.deliver_all();
    assert_eq!(h.secs(), DEADLINE_SECS - 2);
    assert_eq!(
        h.expect_reply_in(b, lookup_a, e(2)),
        ReplyBody::LookedUp(blob(1))
    );
    assert_eq!(
        h.expect_reply_in(a, register_b, e(2)),
        ReplyBody::Registered(receipt(2))
    );

    // Nothing else ever arrives, not even past the deadline.
    h.run(3 * DEADLINE_SECS);
    assert_eq!(h.proxy(P0).pending_count(), 0);
}

// =============================================================================================
// L7, N-D18, Q10: the deadline.

/// No directory is discoverable for longer than the deadline: `DirectoryUnavailable`, epoch 0,
/// in the request's own variant, exactly at the deadline (the default 80 s one).
#[test]
fn outage_longer_than_the_deadline_is_directory_unavailable() {
    let mut h = Harness::with_deadline(1, DEFAULT_DEADLINE);
    h.crash_directory();
    h.discover(P0, None);
    let a = h.caller(P0);
    let b = h.caller(P0);
    let lookup_a = h.call(a, lookup("/a"));
    h.run(1);
    let open_b = h.call(b, open("/s", Source, E_SRC, 7));
    h.run(DEFAULT_DEADLINE.as_millis() / 1_000 - 2);
    h.expect_no_replies();

    h.run(1);
    let reply = h.expect_received(a, lookup_a);
    assert_eq!(reply.at, Instant::ZERO.saturating_add(DEFAULT_DEADLINE));
    assert_eq!(reply.reply.epoch, AuthorityEpoch::NONE);
    assert!(
        is_unavailable(&reply.reply.body, RequestKind::Lookup),
        "{reply:?}"
    );
    h.expect_no_reply(b);
    h.run(1);
    let reply = h.expect_received(b, open_b);
    assert_eq!(reply.reply.epoch, AuthorityEpoch::NONE);
    assert!(
        is_unavailable(&reply.reply.body, RequestKind::OpenStream),
        "{reply:?}"
    );
    // The expired open left a retraction (nobody can know it never reached a directory).
    assert_eq!(
        h.pending(P0),
        vec![(RequestKind::CancelStream, Owner::Proxy)]
    );

    // The directory comes back: nothing more reaches the callers; the retraction completes.
    h.start_directory();
    h.discover(P0, h.authority());
    h.run(5);
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(
        h.peek_lookup("/s"),
        Err(NamespaceError::PathNotFound(path("/s")))
    );
}

/// A directory is discoverable but never answers (every frame to it is lost): `Timeout`
/// (Q10), not `DirectoryUnavailable`, with epoch 0.
#[test]
fn silent_directory_times_out() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    h.blackhole(any);
    let id = h.call(a, lookup("/a"));
    h.run(DEADLINE_SECS - 1);
    h.expect_no_reply(a);
    // One dispatch at once, then one per tick.
    assert_eq!(h.lost.len(), DEADLINE_SECS as usize);
    h.run(1);
    let reply = h.expect_received(a, id);
    assert_eq!(reply.at.as_nanos(), DEADLINE_SECS * 1_000_000_000);
    assert_eq!(reply.reply.epoch, AuthorityEpoch::NONE);
    assert_eq!(reply.reply.body, timeout(RequestKind::Lookup));
    h.run(DEADLINE_SECS);
    assert_eq!(h.proxy(P0).pending_count(), 0);
}

/// Q10 decides per request: one that saw a directory at any time of its life times out, one
/// that never did is told the directory is unavailable.
#[test]
fn timeout_or_unavailable_depends_on_what_the_request_saw() {
    let mut h = Harness::new(1);
    h.discover(P0, None);
    let a = h.caller(P0);
    let b = h.caller(P0);
    h.blackhole(any);
    let early = h.call(a, lookup("/a"));
    h.run(2);
    // A directory is discoverable for one second only (all its frames are lost).
    h.discover(P0, h.authority());
    h.run(1);
    h.discover(P0, None);
    let late = h.call(b, lookup("/a"));
    h.run(DEADLINE_SECS - 3);
    assert_eq!(
        h.expect_reply_in(a, early, e(0)),
        timeout(RequestKind::Lookup)
    );
    h.run(2);
    h.expect_no_reply(b);
    h.run(1);
    let body = h.expect_reply_in(b, late, e(0));
    assert!(is_unavailable(&body, RequestKind::Lookup), "{body:?}");
}

/// With no directory, a read fails `DirectoryUnavailable` once it has waited
/// `absent_read_wait`, saying how long; a mutation waits for its whole deadline; a read that
/// saw a directory is not failed early.
#[test]
fn a_read_with_no_directory_fails_early_and_a_mutation_waits() {
    let mut h = Harness::with_deadline(1, DEFAULT_DEADLINE);
    h.absent_read_wait = Duration::from_secs(10);
    let config = h.proxy_config(P0, 1_000);
    h.restart_proxy(P0, config.first_request_id);
    h.crash_directory();
    h.discover(P0, None);
    let a = h.caller(P0);
    let b = h.caller(P0);
    let c = h.caller(P0);
    let lookup_a = h.call(a, lookup("/a"));
    let open_b = h.call(b, open("/s", Source, E_SRC, 7));
    let resolve_c = h.call(c, resolve("/r"));
    h.run(9);
    h.expect_no_replies();
    h.run(1);
    for (caller, id, kind) in [
        (a, lookup_a, RequestKind::Lookup),
        (c, resolve_c, RequestKind::Resolve),
    ] {
        let reply = h.expect_received(caller, id);
        assert_eq!(
            reply.at,
            Instant::ZERO.saturating_add(Duration::from_secs(10))
        );
        assert_eq!(reply.reply.epoch, AuthorityEpoch::NONE);
        match reply.reply.body.err() {
            Some(NamespaceError::DirectoryUnavailable(reason)) => {
                assert!(reason.as_str().contains("for 10 s"), "{reason}");
            }
            other => panic!("{kind:?}: {other:?}"),
        }
    }
    // The open waits on, for its deadline.
    h.run(DEFAULT_DEADLINE.as_millis() / 1_000 - 12);
    h.expect_no_reply(b);
    h.run(2);
    let reply = h.expect_received(b, open_b);
    assert!(
        is_unavailable(&reply.reply.body, RequestKind::OpenStream),
        "{reply:?}"
    );

    // A read admitted while a directory is discoverable (its frames lost) times out at the
    // deadline, not early, even after the directory goes.
    h.start_directory();
    h.discover(P0, h.authority());
    h.blackhole(any);
    let d = h.caller(P0);
    let seen = h.call(d, lookup("/a"));
    h.run(1);
    h.discover(P0, None);
    h.run(DEFAULT_DEADLINE.as_millis() / 1_000 - 2);
    h.expect_no_reply(d);
    h.run(1);
    assert_eq!(
        h.expect_reply_in(d, seen, e(0)),
        timeout(RequestKind::Lookup)
    );
}

// =============================================================================================
// L8: retractions.

/// N-D6: a parked open's caller cancels and the first `CancelStream` is lost: the proxy
/// re-dispatches it every tick until the directory acknowledges, then stops; the parked
/// endpoint is gone.
#[test]
fn lost_cancel_is_redispatched_until_acknowledged() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    h.call(a, open("/s", Source, E_SRC, 7));
    h.deliver_all();
    assert_eq!(h.peek_lookup("/s"), stream(1, true));

    h.cancel(a);
    assert_eq!(
        h.pending(P0),
        vec![(RequestKind::CancelStream, Owner::Proxy)]
    );
    h.drop_next(is_cancel);
    assert_eq!(h.in_flight_count(any), 0);
    // Lost again on the next tick.
    h.advance(1);
    assert_eq!(h.in_flight_count(is_cancel), 1);
    h.drop_next(is_cancel);
    assert!(matches!(
        h.dir().rendezvous(&path("/s")),
        Some(Rendezvous::Pending(_))
    ));
    // The third copy gets through; its acknowledgement is consumed.
    h.advance(1);
    h.deliver_next_where(is_cancel);
    assert_eq!(h.in_flight_count(reply_of(RequestKind::CancelStream)), 1);
    h.deliver_all();
    assert!(h.last_effects.is_empty(), "{:#?}", h.last_effects);
    assert_eq!(h.proxy(P0).pending_count(), 0);
    let acknowledged = h.mark();

    // Retracted: the path is inactive, through the proxy too, and no copy is sent again.
    let l = h.call(b, lookup("/s"));
    h.run(5);
    assert_eq!(
        h.expect_reply_in(b, l, e(1)),
        ReplyBody::LookedUp(stream(1, false))
    );
    assert_eq!(h.sent_after(acknowledged, is_cancel), 0);
    assert_eq!(h.dir().rendezvous(&path("/s")), None);
}

/// N-D7: the caller cancels while the authority has been absent; the absence lasts three
/// deadlines. The retraction never expires and is acknowledged as soon as the authority is
/// discovered again; a lookup made during the outage is told the directory is unavailable.
#[test]
fn cancel_outlives_several_deadlines() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    h.call(a, open("/s", Source, E_SRC, 7));
    h.deliver_all();
    assert_eq!(h.peek_lookup("/s"), stream(1, true));

    // A partition: the directory runs but no proxy can find it.
    h.discover(P0, None);
    let outage = h.mark();
    h.run(1);
    h.cancel(a);
    let during = h.call(b, lookup("/s"));
    h.run(3 * DEADLINE_SECS);
    let body = h.expect_reply_in(b, during, e(0));
    assert!(is_unavailable(&body, RequestKind::Lookup), "{body:?}");
    assert_eq!(h.sent_after(outage, any), 0);
    assert_eq!(
        h.pending(P0),
        vec![(RequestKind::CancelStream, Owner::Proxy)]
    );
    assert_eq!(h.peek_lookup("/s"), stream(1, true));

    // Heal: dispatched at once, acknowledged within the same instant (no tick needed).
    h.discover(P0, h.authority());
    assert_eq!(h.in_flight_count(is_cancel), 1);
    h.deliver_all();
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.peek_lookup("/s"), stream(1, false));
    h.run(3);
    h.expect_no_replies();
}

/// N-D8 / L1: a first-role open with no peer expires at the deadline as `Timeout` (a directory
/// was there) and is retracted: the `CancelStream` is sent, acknowledged and consumed, and the
/// path is inactive (and can be unlinked).
#[test]
fn expired_first_role_open_is_timed_out_and_retracted() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    let id = h.call(a, open("/s", Source, E_SRC, 7));
    h.run(DEADLINE_SECS - 1);
    h.expect_no_reply(a);
    assert_eq!(h.peek_lookup("/s"), stream(1, true));

    h.advance(1);
    let reply = h.expect_received(a, id);
    assert_eq!(reply.at.as_nanos(), DEADLINE_SECS * 1_000_000_000);
    assert_eq!(reply.reply.epoch, AuthorityEpoch::NONE);
    assert_eq!(reply.reply.body, timeout(RequestKind::OpenStream));
    let cancels: Vec<&Frame> = h
        .in_flight
        .iter()
        .filter(|f| is_cancel(&f.message))
        .collect();
    assert!(!cancels.is_empty());
    for frame in &cancels {
        let Message::Call(call) = &frame.message else {
            unreachable!()
        };
        assert_eq!(call.request, cancel_stream("/s", 7));
        assert_eq!(frame.to, h.dir_address);
    }
    assert_eq!(
        h.pending(P0),
        vec![(RequestKind::CancelStream, Owner::Proxy)]
    );
    h.deliver_all();
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.peek_lookup("/s"), stream(1, false));

    let unlink = h.call(b, unregister("/s", 8));
    h.run(2);
    assert_eq!(
        h.expect_reply_in(b, unlink, e(1)),
        ReplyBody::Unregistered(receipt(2))
    );
}

/// N-D9: a close's frame is lost, then its caller cancels: the proxy keeps the close (now its
/// own), re-dispatches it, and the rendezvous ends. Nobody hears the close's answer.
#[test]
fn lost_close_survives_its_callers_cancel() {
    let mut h = Harness::new(2);
    let a = h.caller(P0);
    let b = h.caller(P1);
    let c = h.caller(P1);
    let open_a = h.call(a, open("/s", Source, E_SRC, 7));
    let open_b = h.call(b, open("/s", Sink, E_SNK, 8));
    h.deliver_all();
    let matched = ReplyBody::StreamOpened(Ok(stream_match(inc(1, 1))));
    assert_eq!(h.expect_reply_in(a, open_a, e(1)), matched);
    assert_eq!(h.expect_reply_in(b, open_b, e(1)), matched);
    assert!(matches!(
        h.dir().rendezvous(&path("/s")),
        Some(Rendezvous::Active(_))
    ));

    h.call(a, close("/s", inc(1, 1)));
    h.drop_next(is_close);
    h.cancel(a);
    assert_eq!(
        h.pending(P0),
        vec![(RequestKind::CloseStream, Owner::Proxy)]
    );
    h.deliver_all();
    assert!(matches!(
        h.dir().rendezvous(&path("/s")),
        Some(Rendezvous::Active(_))
    ));

    h.advance(1);
    assert_eq!(h.in_flight_count(is_close), 1);
    h.deliver_all();
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.dir().rendezvous(&path("/s")), None);
    let l = h.call(c, lookup("/s"));
    h.run(3);
    assert_eq!(
        h.expect_reply_in(c, l, e(1)),
        ReplyBody::LookedUp(stream(1, false))
    );
}

/// N-D5 end to end: a cancel that overtakes its own open tombstones the operation, so the open
/// arriving afterwards parks nothing; its refusal is not forwarded to the caller who left.
#[test]
fn cancel_overtaking_its_open_leaves_no_endpoint() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    h.call(a, open("/s", Source, E_SRC, 7));
    assert_eq!(h.hold(call_of(RequestKind::OpenStream)), 1);
    h.cancel(a);
    h.deliver_all();
    assert_eq!(h.proxy(P0).pending_count(), 0);
    h.release_held();
    h.deliver_next_where(call_of(RequestKind::OpenStream));
    assert_eq!(
        h.in_flight_count(reply_of(RequestKind::OpenStream)),
        1,
        "the late open is refused"
    );
    h.deliver_all();
    assert!(h.last_effects.is_empty());
    assert_eq!(
        h.peek_lookup("/s"),
        Err(NamespaceError::PathNotFound(path("/s")))
    );
    h.run(3);
}

// =============================================================================================
// S26, S27, N-D19: which replies reach whom.

/// N-D19 / S26: the directory restarts (epoch 1 → 2) while its epoch-1 answer to a lookup is
/// still in flight. Once the proxy discovered epoch 2 that answer is dropped, and the lookup is
/// answered by the new authority (which lost the runtime rendezvous the old answer reported).
#[test]
fn stale_epoch_reply_is_dropped_after_rediscovery() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    let open_a = h.call(a, open("/s", Source, E_SRC, 7));
    h.deliver_all();
    let lookup_b = h.call(b, lookup("/s"));
    h.deliver_next_where(call_of(RequestKind::Lookup));
    assert_eq!(h.hold(reply_of(RequestKind::Lookup)), 1);
    let Message::Reply(old) = &h.held[0].message else {
        unreachable!()
    };
    assert_eq!(
        (old.epoch, &old.body),
        (e(1), &ReplyBody::LookedUp(stream(1, true)))
    );

    h.restart_directory();
    assert_eq!(h.epoch(), e(2));
    h.discover(P0, h.authority());
    // Both pending requests went to the new instance at once.
    assert_eq!(h.in_flight_count(is_call), 2);
    h.release_held();
    h.deliver_next_where(reply_of(RequestKind::Lookup));
    assert!(h.last_effects.is_empty(), "{:#?}", h.last_effects);
    h.expect_no_replies();

    h.deliver_all();
    assert_eq!(
        h.expect_reply_in(b, lookup_b, e(2)),
        ReplyBody::LookedUp(stream(1, false))
    );
    // The parked open's incarnation died with epoch 1.
    assert_eq!(
        h.expect_reply_in(a, open_a, e(2)),
        ReplyBody::StreamOpened(Err(NamespaceError::StaleIncarnation {
            path: path("/s"),
            incarnation: inc(2, 1),
        }))
    );
    h.run(DEADLINE_SECS);
}

/// S26: a discovery that names the right address but another epoch is not enough: replies of
/// the running directory are dropped until discovery reports its epoch.
#[test]
fn replies_of_an_undiscovered_epoch_are_dropped() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let wrong = Discovered {
        address: h.dir_address,
        epoch: e(7),
    };
    h.discover(P0, Some(wrong));
    let id = h.call(a, lookup("/a"));
    h.run(3);
    h.expect_no_reply(a);
    assert_eq!(h.proxy(P0).pending_count(), 1);
    h.discover(P0, h.authority());
    h.deliver_all();
    assert_eq!(
        h.expect_reply_in(a, id, e(1)),
        ReplyBody::LookedUp(Err(NamespaceError::PathNotFound(path("/a"))))
    );
}

/// S26: while no directory is discovered, no reply is forwarded at all; the request stays
/// pending and is answered after rediscovery.
#[test]
fn replies_are_dropped_while_no_directory_is_discovered() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let id = h.call(a, lookup("/a"));
    h.deliver_next_where(is_call);
    assert_eq!(h.in_flight_count(is_reply), 1);
    h.discover(P0, None);
    h.deliver_next_where(is_reply);
    assert!(h.last_effects.is_empty(), "{:#?}", h.last_effects);
    h.expect_no_reply(a);
    assert_eq!(h.proxy(P0).pending_count(), 1);
    h.advance(2);
    assert_eq!(h.in_flight_count(any), 0);

    h.discover(P0, h.authority());
    h.deliver_all();
    assert_eq!(
        h.expect_reply_in(a, id, e(1)),
        ReplyBody::LookedUp(Err(NamespaceError::PathNotFound(path("/a"))))
    );
}

/// S27 / L7: two callers using the same request id, on a proxy whose calls are answered twice
/// (a re-dispatch and a duplicated frame): each caller gets exactly its own answer, with its
/// own id, once. A second proxy's identically numbered request is not confused either.
#[test]
fn replies_reach_exactly_the_recorded_caller_once() {
    let mut h = Harness::new(2);
    let a = h.caller(P0);
    let b = h.caller(P0);
    let c = h.caller(P1);
    let register_a = h.call(a, register("/a", S1, 1));
    h.run(0);
    assert_eq!(
        h.expect_reply_in(a, register_a, e(1)),
        ReplyBody::Registered(receipt(1))
    );

    let resolve_a = h.call(a, resolve("/a"));
    let lookup_b = h.call(b, lookup("/b"));
    let lookup_c = h.call(c, lookup("/a"));
    assert_eq!(resolve_a, RequestId(2));
    assert_eq!((lookup_b, lookup_c), (RequestId(1), RequestId(1)));
    // First answers are held back, the tick re-dispatches, the second answers are duplicated.
    h.deliver_all_calls();
    assert_eq!(h.hold(is_reply), 3);
    h.advance(1);
    h.deliver_all_calls();
    h.duplicate_next(reply_of(RequestKind::Resolve));
    h.duplicate_next(reply_of(RequestKind::Lookup));
    h.release_held();
    assert_eq!(h.in_flight_count(is_reply), 8);
    h.deliver_all();

    assert_eq!(
        h.expect_reply_in(a, resolve_a, e(1)),
        ReplyBody::Resolved(binding(S1, 1))
    );
    assert_eq!(
        h.expect_reply_in(b, lookup_b, e(1)),
        ReplyBody::LookedUp(Err(NamespaceError::PathNotFound(path("/b"))))
    );
    assert_eq!(
        h.expect_reply_in(c, lookup_c, e(1)),
        ReplyBody::LookedUp(blob(1))
    );
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.proxy(P1).pending_count(), 0);
    h.run(DEADLINE_SECS + 1);
}

impl Harness {
    /// Delivers every call in flight (replies stay in flight).
    fn deliver_all_calls(&mut self) {
        while self.in_flight_count(is_call) > 0 {
            self.deliver_next_where(is_call);
        }
    }
}

// =============================================================================================
// Limits (Q9) and Q14.

/// The pending-request limit answers `LimitReached(PendingRequests)` at once, with epoch 0, in
/// the variant of the refused request; a slot freed by an answer is usable again.
#[test]
fn pending_limit_answers_in_the_request_variant() {
    let mut h = Harness::new(1);
    h.discover(P0, None);
    let a = h.caller(P0);
    let b = h.caller(P0);
    let ids: Vec<RequestId> = (0..PROXY_PENDING_MAX)
        .map(|i| h.call(a, lookup(&format!("/many/{i}"))))
        .collect();
    let full = NamespaceError::LimitReached(Limit::PendingRequests);
    let refused = [
        (h.call(b, register("/x", S1, 1)), RequestKind::Register),
        (
            h.call(b, open("/s", Sink, E_SNK, 2)),
            RequestKind::OpenStream,
        ),
        (h.call(b, reserve("/r", 3, b)), RequestKind::ReserveBlob),
    ];
    for (id, kind) in refused {
        let reply = h.expect_received(b, id);
        assert_eq!(reply.at, h.now);
        assert_eq!(reply.reply.epoch, AuthorityEpoch::NONE);
        assert_eq!(reply.reply.body, ReplyBody::error(kind, full.clone()));
    }
    // A caller's retraction still gets in (refusing a close would strand what it closes), up
    // to twice the limit; the table never holds more.
    let closes: Vec<RequestId> = (0..PROXY_PENDING_MAX)
        .map(|i| h.call(b, close(&format!("/c/{i}"), inc(1, 1))))
        .collect();
    assert_eq!(h.proxy(P0).pending_count(), 2 * PROXY_PENDING_MAX);
    let one_too_many = h.call(b, close("/c/last", inc(1, 1)));
    let reply = h.expect_received(b, one_too_many);
    assert_eq!(
        reply.reply.body,
        ReplyBody::error(RequestKind::CloseStream, full)
    );
    assert_eq!(h.proxy(P0).pending_count(), 2 * PROXY_PENDING_MAX);

    h.discover(P0, h.authority());
    h.deliver_all();
    for (i, id) in ids.into_iter().enumerate() {
        let p = format!("/many/{i}");
        assert_eq!(
            h.expect_reply_in(a, id, e(1)),
            ReplyBody::LookedUp(Err(NamespaceError::PathNotFound(path(&p))))
        );
    }
    for (i, id) in closes.into_iter().enumerate() {
        let p = path(&format!("/c/{i}"));
        let stale = NamespaceError::StaleIncarnation {
            path: p,
            incarnation: inc(1, 1),
        };
        assert_eq!(
            h.expect_reply_in(b, id, e(1)),
            ReplyBody::StreamClosed(Err(stale))
        );
    }
    let again = h.call(b, register("/x", S1, 1));
    h.deliver_all();
    assert_eq!(
        h.expect_reply_in(b, again, e(1)),
        ReplyBody::Registered(receipt(1))
    );
}

/// Q9: once request ids run out, a request is refused with `LimitReached(RequestIds)` in its
/// own variant, but a retraction is never dropped (it reuses the id of what it retracts).
#[test]
fn exhausted_request_ids_refuse_requests_but_not_retractions() {
    let mut h = Harness::new(1);
    h.restart_proxy(P0, u64::MAX);
    h.discover(P0, h.authority());
    let a = h.caller(P0);
    let b = h.caller(P0);
    h.call(a, open("/s", Source, E_SRC, 7));
    h.deliver_all();
    let refused = h.call(b, lookup("/s"));
    assert_eq!(
        h.expect_reply_in(b, refused, e(0)),
        ReplyBody::LookedUp(Err(NamespaceError::LimitReached(Limit::RequestIds)))
    );
    h.cancel(a);
    assert_eq!(
        h.proxy(P0)
            .pending()
            .map(|(id, r)| (*id, r.request.clone(), r.owner))
            .collect::<Vec<_>>(),
        vec![(RequestId(u64::MAX), cancel_stream("/s", 7), Owner::Proxy)]
    );
    h.run(2);
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.peek_lookup("/s"), stream(1, false));
}

/// Q14: the answer to a proxy-owned retraction is consumed (no effect at all), while the
/// answer to a caller's own retraction is forwarded to it.
#[test]
fn replies_to_proxy_owned_retractions_are_consumed() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    h.call(a, open("/s", Source, E_SRC, 7));
    let open_b = h.call(b, open("/t", Source, E_SNK, 8));
    h.deliver_all();

    // a gives up: the proxy retracts its open and swallows the acknowledgement.
    h.cancel_by_frame(a);
    h.deliver_next_where(is_cancel);
    assert_eq!(h.in_flight_count(reply_of(RequestKind::CancelStream)), 1);
    h.deliver_next_where(is_reply);
    assert!(h.last_effects.is_empty(), "{:#?}", h.last_effects);
    h.expect_no_replies();

    // b retracts its own open itself: it hears the answer.
    let own = h.call_by_frame(b, cancel_stream("/t", 8));
    h.deliver_all();
    assert_eq!(
        h.expect_reply_in(b, own, e(1)),
        ReplyBody::StreamCancelled(Ok(()))
    );
    assert_eq!(h.peek_lookup("/s"), stream(1, false));
    assert_eq!(h.peek_lookup("/t"), stream(2, false));
    // b's open itself is still pending at the proxy: its next dispatch learns that its
    // rendezvous is gone.
    h.run(1);
    assert_eq!(
        h.expect_reply_in(b, open_b, e(1)),
        ReplyBody::StreamOpened(Err(NamespaceError::StaleIncarnation {
            path: path("/t"),
            incarnation: inc(1, 2),
        }))
    );
    assert_eq!(h.proxy(P0).pending_count(), 0);
}

/// An expired `ReserveBlob` (every answer lost) is retracted with a `ReleaseBlobReservation`
/// of its operation id: the reservation the directory did make is released.
#[test]
fn expired_reserve_is_released() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    h.blackhole(reply_of(RequestKind::ReserveBlob));
    let id = h.call(a, reserve("/r", 5, a));
    h.run(1);
    assert_eq!(
        h.peek_lookup("/r"),
        Err(NamespaceError::PathExists(path("/r")))
    );
    h.run(DEADLINE_SECS - 2);
    h.expect_no_replies();
    h.run(1);
    assert_eq!(
        h.expect_reply_in(a, id, e(0)),
        timeout(RequestKind::ReserveBlob)
    );
    let release = DirectoryRequest::ReleaseBlobReservation {
        path: path("/r"),
        operation: op(5),
    };
    assert!(
        h.sent.iter().any(|(at, f)| *at == h.now
            && matches!(&f.message, Message::Call(c) if c.request == release))
    );
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.dir().durable().reservation(&path("/r")), None);
    let l = h.call(b, lookup("/r"));
    h.run(1);
    assert_eq!(
        h.expect_reply_in(b, l, e(1)),
        ReplyBody::LookedUp(Err(NamespaceError::PathNotFound(path("/r"))))
    );
}

/// A caller that cancels a waiting reserve gets it released too (DESIGN Q4), and the late
/// answer to the reserve itself is not forwarded.
#[test]
fn cancelled_reserve_is_released() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    h.call(a, reserve("/r", 5, a));
    h.deliver_next_where(is_call);
    assert_eq!(h.hold(is_reply), 1);
    h.cancel(a);
    h.release_held();
    h.deliver_all();
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.dir().durable().reservation(&path("/r")), None);
    assert_eq!(
        h.peek_lookup("/r"),
        Err(NamespaceError::PathNotFound(path("/r")))
    );
}

/// An open matched at the directory whose answer never reaches its caller expires; its
/// retraction ends the active rendezvous and displaces the peer (Q11), so no half-open stream
/// is left behind.
#[test]
fn expired_open_whose_match_was_lost_is_retracted() {
    let mut h = Harness::new(2);
    let a = h.caller(P0);
    let b = h.caller(P1);
    // Every open answer to P0 is lost.
    h.blackhole(|m| {
        matches!(m, Message::Reply(r)
            if r.body.kind() == RequestKind::OpenStream && r.request_id.0 < PROXY_ID_SPACING)
    });
    let open_a = h.call(a, open("/s", Source, E_SRC, 7));
    h.run(1);
    let open_b = h.call(b, open("/s", Sink, E_SNK, 8));
    h.run(0);
    assert_eq!(
        h.expect_reply_in(b, open_b, e(1)),
        ReplyBody::StreamOpened(Ok(stream_match(inc(1, 1))))
    );
    assert!(matches!(
        h.dir().rendezvous(&path("/s")),
        Some(Rendezvous::Active(_))
    ));
    h.run(DEADLINE_SECS - 1);
    assert_eq!(
        h.expect_reply_in(a, open_a, e(0)),
        timeout(RequestKind::OpenStream)
    );
    assert_eq!(h.dir().rendezvous(&path("/s")), None);
    assert!(
        h.elsewhere.iter().any(|f| f.to == E_SNK
            && matches!(f.message, Message::Displaced { incarnation, .. } if incarnation == inc(1, 1))),
        "the peer is displaced: {:#?}",
        h.elsewhere
    );
    assert_eq!(h.proxy(P0).pending_count(), 0);
}

// =============================================================================================
// Restarts and bad input.

/// A restarted proxy starts above its predecessor's ids: a late answer to the old instance is
/// not taken for a new request, and the old instance's callers hear nothing from the new one.
#[test]
fn restarted_proxy_ignores_its_predecessors_answers() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    let b = h.caller(P0);
    h.call(a, lookup("/a"));
    h.deliver_next_where(is_call);
    assert_eq!(h.hold(is_reply), 1);
    h.restart_proxy(P0, 1 << 20);
    h.discover(P0, h.authority());
    let id = h.call(b, resolve("/a"));
    h.release_held();
    h.deliver_next_where(is_reply);
    assert!(h.last_effects.is_empty());
    h.deliver_all();
    assert_eq!(
        h.expect_reply_in(b, id, e(1)),
        ReplyBody::Resolved(Err(NamespaceError::PathNotFound(path("/a"))))
    );
    h.run(DEADLINE_SECS + 1);
}

/// `handle_message` refuses the directory's and hosts' messages with `UnexpectedMessage`, and
/// changes nothing; `handle_timer` refuses the directory's timer.
#[test]
fn directory_only_messages_are_refused() {
    let mut h = Harness::new(1);
    let a = h.caller(P0);
    h.call(a, open("/s", Source, E_SRC, 7));
    h.call(a, lookup("/a"));
    h.hold(any);
    let before = format!("{:?}", h.proxy(P0));
    let refused = [
        (
            Message::Call(DirectoryCall {
                request_id: RequestId(1),
                reply_to: a,
                request: lookup("/a"),
            }),
            "Call",
        ),
        (Message::Retire { reply_to: a }, "Retire"),
        (Message::SourceRetired { source: S1 }, "SourceRetired"),
        (
            Message::Displaced {
                incarnation: inc(1, 1),
                reply_to: a,
            },
            "Displaced",
        ),
        (
            Message::StreamDisplaced {
                endpoint: E_SRC,
                incarnation: inc(1, 1),
            },
            "StreamDisplaced",
        ),
        (
            Message::AddressGone {
                scope: GoneScope::Address(a),
                reply_to: a,
            },
            "AddressGone",
        ),
        (
            Message::GoneAcknowledged {
                scope: GoneScope::Address(a),
            },
            "GoneAcknowledged",
        ),
    ];
    for (message, name) in refused {
        assert_eq!(
            h.proxy_input(P0, message),
            Err(InputError::UnexpectedMessage(name))
        );
        assert!(h.last_effects.is_empty(), "{name}: {:#?}", h.last_effects);
        assert_eq!(
            format!("{:?}", h.proxy(P0)),
            before,
            "{name} changed the proxy"
        );
    }
    let mut out = Outbox::new();
    let mut proxy = h.proxy(P0).clone();
    assert_eq!(
        proxy.handle_timer(h.now, Timer::DirectoryRetry, &mut out),
        Err(InputError::UnexpectedTimer(Timer::DirectoryRetry))
    );
    assert!(out.is_empty());
    assert_eq!(format!("{proxy:?}"), before);
    h.expect_no_replies();
    h.held.clear();
    h.cancel(a);
}

/// Two proxies share one directory through a restart: each forwards only answers of the epoch
/// it discovered, and every request of both is answered once, by the new authority.
#[test]
fn two_proxies_follow_a_restart_independently() {
    let mut h = Harness::new(2);
    let a = h.caller(P0);
    let b = h.caller(P1);
    let register_a = h.call(a, register("/a", S1, 1));
    let lookup_b = h.call(b, lookup("/a"));
    // The register reaches the directory, the lookup does not; the register's answer is lost.
    h.deliver_next_where(call_of(RequestKind::Register));
    h.drop_all(any);
    h.restart_directory();
    // Only P1 learns of epoch 2 for now; P0 still points at the dead instance.
    h.discover(P1, h.authority());
    h.run(2);
    assert_eq!(
        h.expect_reply_in(b, lookup_b, e(2)),
        ReplyBody::LookedUp(blob(1))
    );
    h.expect_no_reply(a);
    h.discover(P0, h.authority());
    h.deliver_all();
    // The register replays its durable outcome under the new authority.
    assert_eq!(
        h.expect_reply_in(a, register_a, e(2)),
        ReplyBody::Registered(receipt(1))
    );
    h.run(DEADLINE_SECS + 1);
    assert_eq!(h.proxy(P0).pending_count(), 0);
    assert_eq!(h.proxy(P1).pending_count(), 0);
}

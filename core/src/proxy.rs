//! The namespace proxy: one per node, between local callers and the directory (SPEC §5, with
//! DESIGN.md §5 Q4, Q9, Q10 and Q14).
//!
//! # Driving it
//!
//! Build it with [`Proxy::new`] (which arms the retry timer), then feed it:
//!
//! * [`Proxy::request`] / [`Proxy::cancel`] from in-process callers, or the same through
//!   [`Proxy::handle_message`] as `ProxyCall` / `ProxyCancel` frames from local actors;
//! * [`Proxy::handle_message`] with every `Reply` the directory sends to the proxy's address;
//! * [`Proxy::handle_discovery`] whenever discovery's answer changes (a directory with its
//!   authority epoch, or none);
//! * [`Proxy::handle_timer`] when [`Timer::ProxyRetry`] fires.
//!
//! # The promise to callers
//!
//! Every request gets exactly one reply, in the reply variant of its kind, addressed to the
//! caller with the caller's own request id: the directory's answer, or a typed error —
//! `DirectoryUnavailable` if no directory was discoverable at any time before the deadline,
//! `Timeout` if one was (Q10), `LimitReached` if the proxy is full. The only ways out are a
//! caller's cancel and a proxy restart (the pending table is volatile; callers keep a guard).
//!
//! # Retractions
//!
//! `CancelStream`, `CloseStream` and `ReleaseBlobReservation` undo something at the directory.
//! They never expire and are re-dispatched on every tick until the directory acknowledges them
//! (with any answer but a refusal that left no trace: a full operation table). When a caller cancels, its retractions stay pending and the proxy becomes
//! their owner; its waiting opens and reserves are replaced by retractions of their own (a
//! `CancelStream` or a release of the same operation id), and so are opens and reserves that
//! expire. Replies to proxy-owned retractions are consumed here (Q14).
//!
//! # Determinism
//!
//! Pending requests live in a `BTreeMap` keyed by request id; re-dispatch is in id order.

use std::collections::BTreeMap;

use crate::effect::{Effect, Outbox, Timer};
use crate::error::{InputError, Limit, NamespaceError, Reason};
use crate::ids::{Address, AuthorityEpoch, RequestId};
use crate::limits::PROXY_PENDING_MAX;
use crate::time::{Duration, Instant};
use crate::wire::{DirectoryCall, DirectoryReply, DirectoryRequest, Message, ReplyBody};

/// The default request deadline (SPEC §5.1).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(80);

/// The default [`ProxyConfig::absent_read_wait`]: long enough for a directory's restart or a
/// replica group's election (about a second), far shorter than the deadline.
pub const DEFAULT_ABSENT_READ_WAIT: Duration = Duration::from_secs(10);

/// How a proxy is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The proxy's own address: the `reply_to` of every call it sends.
    pub address: Address,
    /// Period of the re-dispatch and deadline tick.
    pub retry_period: Duration,
    /// How long a caller's request may wait for the directory.
    pub deadline: Duration,
    /// How long a read (`Resolve`, `Lookup`) waits while no directory is discoverable before
    /// it fails `DirectoryUnavailable`, short of the deadline. A read changes nothing, so
    /// failing it early loses nothing, and the caller hears at once that the directory is
    /// gone instead of after the whole deadline; a mutation keeps waiting for its deadline (it
    /// may already hold a reservation, and a directory that comes back completes it). A value
    /// at or above the deadline turns the early failure off.
    pub absent_read_wait: Duration,
    /// The first request id this proxy hands out. A proxy that restarts at the same address
    /// must start above every id its predecessor used, so late replies to the old instance are
    /// never taken for new ones (the driver derives it from a boot counter).
    pub first_request_id: u64,
    /// How many requests may be pending before a caller's request is refused
    /// `LimitReached(PendingRequests)` (a caller's retraction only at twice this).
    /// [`PROXY_PENDING_MAX`] by default; the simulator's overload regime makes it small.
    pub pending_max: usize,
}

impl ProxyConfig {
    /// A configuration with the reference's one-second tick and 80-second deadline.
    pub fn new(address: Address) -> Self {
        ProxyConfig {
            address,
            retry_period: Duration::from_secs(1),
            deadline: DEFAULT_DEADLINE,
            absent_read_wait: DEFAULT_ABSENT_READ_WAIT,
            first_request_id: 1,
            pending_max: PROXY_PENDING_MAX,
        }
    }
}

/// The directory discovery last reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Discovered {
    /// Where to send calls.
    pub address: Address,
    /// The authority epoch whose replies are accepted.
    pub epoch: AuthorityEpoch,
}

/// Who a pending request answers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A caller, with its own request id.
    Caller {
        /// The caller's address.
        reply_to: Address,
        /// The caller's correlation id.
        request_id: RequestId,
    },
    /// The proxy itself (a retraction whose caller cancelled, or one the proxy started).
    Proxy,
}

/// One pending request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRequest {
    /// The request, re-sent unchanged.
    pub request: DirectoryRequest,
    /// Who hears the reply.
    pub owner: Owner,
    /// When it entered the proxy.
    pub enqueued_at: Instant,
    /// Whether a directory was discoverable at any time since (decides Timeout vs
    /// DirectoryUnavailable at the deadline).
    pub saw_directory: bool,
}

impl PendingRequest {
    /// Whether the request never expires.
    pub fn is_retraction(&self) -> bool {
        self.request.kind().is_retraction()
    }
}

/// The proxy state machine. See the module documentation for the driving contract.
#[derive(Clone, Debug)]
pub struct Proxy {
    config: ProxyConfig,
    next_id: Option<u64>,
    // Boxed: ids are removed from the middle of the tree, and moving 8-byte values is what
    // keeps that cheap (a pending request is a few hundred bytes).
    pending: BTreeMap<RequestId, Box<PendingRequest>>,
    directory: Option<Discovered>,
}

fn unavailable() -> NamespaceError {
    NamespaceError::DirectoryUnavailable(Reason::new(
        "no directory was discoverable before the deadline",
    ))
}

/// A read's early failure: no directory for `waited`.
fn unavailable_read(waited: Duration) -> NamespaceError {
    NamespaceError::DirectoryUnavailable(Reason::new(format!(
        "no directory was reachable for {} s: the host keeps trying (is the directory \
         running, and reachable from this host?)",
        waited.as_millis() / 1_000
    )))
}

/// The retraction that undoes a waiting request, if it needs one: an open is cancelled, a
/// reservation is released (both under the request's own operation id).
fn retraction_of(request: &DirectoryRequest) -> Option<DirectoryRequest> {
    match request {
        DirectoryRequest::OpenStream {
            path, operation, ..
        } => Some(DirectoryRequest::CancelStream {
            path: path.clone(),
            operation: *operation,
        }),
        DirectoryRequest::ReserveBlob {
            path, operation, ..
        } => Some(DirectoryRequest::ReleaseBlobReservation {
            path: path.clone(),
            operation: *operation,
        }),
        _ => None,
    }
}

impl Proxy {
    /// A proxy with nothing pending and no directory discovered; arms its retry timer.
    pub fn new(config: ProxyConfig, now: Instant, out: &mut Outbox) -> Proxy {
        let first = config.first_request_id.max(1);
        let proxy = Proxy {
            config,
            next_id: Some(first),
            pending: BTreeMap::new(),
            directory: None,
        };
        proxy.arm_timer(now, out);
        proxy
    }

    fn arm_timer(&self, now: Instant, out: &mut Outbox) {
        let at = now.saturating_add(self.config.retry_period);
        out.push(Effect::SetTimer {
            timer: Timer::ProxyRetry,
            at,
        });
    }

    fn allocate_id(&mut self) -> Option<RequestId> {
        let id = self.next_id?;
        self.next_id = id.checked_add(1);
        Some(RequestId(id))
    }

    fn reply(
        &self,
        reply_to: Address,
        request_id: RequestId,
        epoch: AuthorityEpoch,
        body: ReplyBody,
        out: &mut Outbox,
    ) {
        let reply = DirectoryReply {
            request_id,
            epoch,
            body,
        };
        out.send(reply_to, Message::Reply(reply));
    }

    fn dispatch(&self, id: RequestId, request: &DirectoryRequest, out: &mut Outbox) {
        if let Some(directory) = self.directory {
            let call = DirectoryCall {
                request_id: id,
                reply_to: self.config.address,
                request: request.clone(),
            };
            out.send(directory.address, Message::Call(call));
        }
    }

    fn insert(&mut self, id: RequestId, pending: Box<PendingRequest>) {
        self.pending.insert(id, pending);
    }

    fn remove(&mut self, id: RequestId) -> Option<Box<PendingRequest>> {
        self.pending.remove(&id)
    }

    /// A caller's request: it will get exactly one reply (see the module documentation).
    pub fn request(
        &mut self,
        now: Instant,
        reply_to: Address,
        request_id: RequestId,
        request: DirectoryRequest,
        out: &mut Outbox,
    ) {
        let kind = request.kind();
        // Everything pending counts, retractions the proxy owns included. A caller's own
        // retraction gets twice the room: refusing a close or a cancel strands what it undoes.
        // Cancels and expiries only ever swap a request for a retraction, so the table never
        // holds more than 2 × PROXY_PENDING_MAX.
        let limit = if kind.is_retraction() {
            2 * self.config.pending_max
        } else {
            self.config.pending_max
        };
        if self.pending.len() >= limit {
            let full = NamespaceError::LimitReached(Limit::PendingRequests);
            self.reply(
                reply_to,
                request_id,
                AuthorityEpoch::NONE,
                ReplyBody::error(kind, full),
                out,
            );
            return;
        }
        let Some(id) = self.allocate_id() else {
            // Q9: answered in the caller's own reply variant, not a fixed one.
            let exhausted = NamespaceError::LimitReached(Limit::RequestIds);
            self.reply(
                reply_to,
                request_id,
                AuthorityEpoch::NONE,
                ReplyBody::error(kind, exhausted),
                out,
            );
            return;
        };
        self.dispatch(id, &request, out);
        let pending = Box::new(PendingRequest {
            request,
            owner: Owner::Caller {
                reply_to,
                request_id,
            },
            enqueued_at: now,
            saw_directory: self.directory.is_some(),
        });
        self.insert(id, pending);
        self.debug_check();
    }

    /// Starts a proxy-owned retraction. It reuses `fallback` if request ids ran out, so a
    /// retraction is never dropped (Q9).
    fn retract(
        &mut self,
        now: Instant,
        retraction: DirectoryRequest,
        fallback: RequestId,
        out: &mut Outbox,
    ) {
        let id = self.allocate_id().unwrap_or(fallback);
        self.dispatch(id, &retraction, out);
        let pending = Box::new(PendingRequest {
            request: retraction,
            owner: Owner::Proxy,
            enqueued_at: now,
            saw_directory: self.directory.is_some(),
        });
        self.insert(id, pending);
    }

    /// The caller `reply_to` gives up on everything it has pending: its retractions are kept
    /// and re-owned by the proxy, its waiting opens and reserves are retracted, everything
    /// else is forgotten. No reply is sent for the cancelled requests.
    pub fn cancel(&mut self, now: Instant, reply_to: Address, out: &mut Outbox) {
        let ids: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| matches!(p.owner, Owner::Caller { reply_to: r, .. } if r == reply_to))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(mut pending) = self.remove(id) else {
                continue;
            };
            if pending.is_retraction() {
                pending.owner = Owner::Proxy;
                self.insert(id, pending);
            } else if let Some(retraction) = retraction_of(&pending.request) {
                self.retract(now, retraction, id, out);
            }
        }
        self.debug_check();
    }

    /// Discovery's current answer: a directory and its authority epoch, or none.
    pub fn handle_discovery(&mut self, now: Instant, found: Option<Discovered>, out: &mut Outbox) {
        let _ = now;
        let changed = self.directory != found;
        self.directory = found;
        if found.is_some() {
            for pending in self.pending.values_mut() {
                pending.saw_directory = true;
            }
            if changed {
                // A new authority (or the first one): do not wait for the tick.
                for (id, pending) in &self.pending {
                    self.dispatch(*id, &pending.request, out);
                }
            }
        }
        self.debug_check();
    }

    /// A frame addressed to the proxy: a caller's `ProxyCall`/`ProxyCancel`, or a directory
    /// `Reply`.
    pub fn handle_message(
        &mut self,
        now: Instant,
        message: Message,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        match message {
            Message::ProxyCall(call) => {
                self.request(now, call.reply_to, call.request_id, call.request, out);
            }
            Message::ProxyCancel { reply_to } => self.cancel(now, reply_to, out),
            Message::Reply(reply) => self.directory_reply(reply, out),
            Message::Call(_) => return Err(InputError::UnexpectedMessage("Call")),
            Message::FromChild(_)
            | Message::ToChild(_)
            | Message::ChunkRequest { .. }
            | Message::Chunk { .. }
            | Message::ChunkRefused { .. } => {
                return Err(InputError::UnexpectedMessage("a host frame"));
            }
            Message::Retire { .. } => return Err(InputError::UnexpectedMessage("Retire")),
            Message::SourceRetired { .. } => {
                return Err(InputError::UnexpectedMessage("SourceRetired"));
            }
            Message::Displaced { .. } => return Err(InputError::UnexpectedMessage("Displaced")),
            Message::StreamDisplaced { .. } => {
                return Err(InputError::UnexpectedMessage("StreamDisplaced"));
            }
            Message::AddressGone { .. } => {
                return Err(InputError::UnexpectedMessage("AddressGone"));
            }
            Message::GoneAcknowledged { .. } => {
                return Err(InputError::UnexpectedMessage("GoneAcknowledged"));
            }
        }
        Ok(())
    }

    /// A directory reply: accepted only from the discovered authority's epoch (S26), routed to
    /// the recorded owner (S27), consumed if the proxy owns it (Q14).
    fn directory_reply(&mut self, reply: DirectoryReply, out: &mut Outbox) {
        let Some(directory) = self.directory else {
            return;
        };
        if reply.epoch != directory.epoch {
            return;
        }
        // A duplicate, or an answer to a request that expired or was cancelled, finds nothing.
        let Some(pending) = self.remove(reply.request_id) else {
            return;
        };
        let kind = pending.request.kind();
        if pending.is_retraction() && reply.body.err().is_some_and(NamespaceError::left_no_trace) {
            // The directory had no room to apply it (its operation table is full) and
            // remembers nothing of it: not an acknowledgement. Keep re-driving it, whoever
            // owns it; a retraction never gives up.
            self.insert(reply.request_id, pending);
            return;
        }
        let body = if reply.body.kind() == kind {
            reply.body
        } else if pending.owner == Owner::Proxy {
            // Nobody to tell; keep re-driving the retraction.
            self.insert(reply.request_id, pending);
            return;
        } else {
            let error = NamespaceError::Protocol(Reason::new(format!(
                "the directory answered a {kind:?} request with a {:?} reply",
                reply.body.kind()
            )));
            ReplyBody::error(kind, error)
        };
        if let Owner::Caller {
            reply_to,
            request_id,
        } = pending.owner
        {
            self.reply(reply_to, request_id, reply.epoch, body, out);
        }
        self.debug_check();
    }

    /// The retry tick: expire what waited past the deadline (retracting expired opens and
    /// reserves), re-dispatch everything else, re-arm.
    pub fn handle_timer(
        &mut self,
        now: Instant,
        timer: Timer,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        if timer != Timer::ProxyRetry {
            return Err(InputError::UnexpectedTimer(timer));
        }
        let deadline = self.config.deadline;
        let absent_read_wait = self.config.absent_read_wait;
        let absent = self.directory.is_none();
        // A read that has seen no directory for `absent_read_wait` fails now, short of its
        // deadline.
        let read_gives_up = |p: &PendingRequest| {
            absent
                && !p.saw_directory
                && p.request.kind().is_read()
                && now.saturating_since(p.enqueued_at) >= absent_read_wait
        };
        // Retractions started by this tick's expiries are dispatched when they are made; the
        // re-dispatch below covers only what was already pending and stays pending.
        let already: Vec<RequestId> = self.pending.keys().copied().collect();
        let expired: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                !p.is_retraction()
                    && matches!(p.owner, Owner::Caller { .. })
                    && (now.saturating_since(p.enqueued_at) >= deadline || read_gives_up(p))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let Some(pending) = self.remove(id) else {
                continue;
            };
            let waited = now.saturating_since(pending.enqueued_at);
            let error = if pending.saw_directory || !absent {
                NamespaceError::Timeout
            } else if waited < deadline {
                unavailable_read(waited)
            } else {
                unavailable()
            };
            if let Owner::Caller {
                reply_to,
                request_id,
            } = pending.owner
            {
                let body = ReplyBody::error(pending.request.kind(), error);
                self.reply(reply_to, request_id, AuthorityEpoch::NONE, body, out);
            }
            if let Some(retraction) = retraction_of(&pending.request) {
                self.retract(now, retraction, id, out);
            }
        }
        for id in already {
            if let Some(pending) = self.pending.get(&id) {
                self.dispatch(id, &pending.request, out);
            }
        }
        self.arm_timer(now, out);
        self.debug_check();
        Ok(())
    }

    fn debug_check(&self) {
        debug_assert!(self.pending.len() <= 2 * self.config.pending_max);
        if cfg!(debug_assertions)
            && self.pending.len() <= crate::limits::DEBUG_CHECK_STATE_MAX
            && let Err(broken) = self.check_invariants()
        {
            panic!("proxy invariant broken after an input: {broken}");
        }
    }

    /// The proxy's configuration.
    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    /// The directory discovery last reported.
    pub fn directory(&self) -> Option<Discovered> {
        self.directory
    }

    /// Every pending request, by id.
    pub fn pending(&self) -> impl Iterator<Item = (&RequestId, &PendingRequest)> {
        self.pending.iter().map(|(id, p)| (id, &**p))
    }

    /// How many requests are pending (retractions included).
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Checks the proxy's invariants. For tests and the simulator.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.pending.len() > 2 * self.config.pending_max {
            return Err(format!(
                "{} requests pending, the bound is {}",
                self.pending.len(),
                2 * self.config.pending_max
            ));
        }
        if let (Some(next), Some((last, _))) = (self.next_id, self.pending.last_key_value())
            && last.0 >= next
        {
            return Err(format!("pending id {last} not below the next id {next}"));
        }
        if let Some((id, _)) = self
            .pending
            .iter()
            .find(|(_, p)| matches!(p.owner, Owner::Proxy) && !p.is_retraction())
        {
            return Err(format!("{id} is proxy-owned but not a retraction"));
        }
        Ok(())
    }
}

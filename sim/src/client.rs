//! Simulated clients: they talk to the directory through their node's proxy, with operation ids
//! (the same op id on every re-issue), on a small set of contended paths.
//!
//! A client runs one *plan* at a time. The proxy re-dispatches, expires and retracts; the client
//! only re-issues when the proxy answers "no answer" (`DirectoryUnavailable`/`Timeout`) for a
//! mutation or retraction, when its guard expires, or when its proxy restarted (the proxy's
//! pending table, its own retractions included, is volatile). A stream opener waits for its peer
//! until `open_wait`, then cancels through the proxy (which retracts the open); a client
//! sometimes walks away right after sending a close (the proxy keeps and re-owns it). When the run heals, clients *quiesce*:
//! they start nothing new, close what they hold and cancel what they wait for, so every
//! liveness property can be checked against a quiet system.
//!
//! **Retention.** Each client is an issuer of its own (lane = its actor number on the node
//! incarnation, sequence = a counter) and declares its operations done (`OperationsDone`)
//! every few operations: everything below the operation it is still asking about, or below
//! its next one. Operations it only replays from its history (Replay, Conflict) are done, and
//! so are those it handed to the proxy to retract: a replay of a pruned one is refused
//! `OperationExpired`, which the model predicts. A client that hears `OperationExpired` for
//! an operation it still asks about records a violation: its record was pruned while it could
//! still retry.

use std::collections::VecDeque;

use dataplane_core::error::NamespaceError;
use dataplane_core::ids::{
    Address, AuthorityEpoch, Issuer, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::path::DataPath;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, ReplyBody, SourceRecovery,
    StreamRole,
};

use crate::options::WorkloadOptions;
use crate::rng::{SimRng, ratio};

/// The operations a client picks from (weights per seed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// Register a fresh source (replacing whatever is bound).
    Register,
    /// Unlink a path.
    Unregister,
    /// Move a path (replace or not).
    Rename,
    /// Resolve a blob.
    Resolve,
    /// Look a path up.
    Lookup,
    /// Reserve, then register with the reservation.
    ReserveRegister,
    /// Reserve, then release.
    ReserveRelease,
    /// Open one side of a stream; hold the match, then close.
    OpenStream,
    /// Re-send an old request with its old operation id.
    Replay,
    /// Reuse an old operation id for a different request.
    Conflict,
}

impl OpKind {
    /// Every kind, in weight order.
    pub const ALL: [OpKind; 10] = [
        OpKind::Register,
        OpKind::Unregister,
        OpKind::Rename,
        OpKind::Resolve,
        OpKind::Lookup,
        OpKind::ReserveRegister,
        OpKind::ReserveRelease,
        OpKind::OpenStream,
        OpKind::Replay,
        OpKind::Conflict,
    ];
}

/// How many finished requests a client remembers for replays.
const HISTORY_MAX: usize = 16;
/// How many retractions a client remembers handing to its proxy (re-issued if it restarts).
const ABANDONED_MAX: usize = 16;
/// A client declares its operations done once its horizon moved this far.
const DONE_EVERY: u64 = 4;

/// What the client is doing with its current request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// One request; `persistent` requests are retried until answered.
    Once {
        /// Retry forever (mutations).
        persistent: bool,
        /// The source a Register created (stopped if the Register is refused).
        source: Option<Address>,
    },
    /// A reservation, then a register with it (or a release).
    Reserve {
        /// Register after the reservation (else release it).
        then_register: bool,
        /// When the client walks away from a reserve still unanswered (cancels it through the
        /// proxy and forgets it): the proxy's retraction alone must release it (issue 15,
        /// class 8: a host releases its own reserves too, which hid a proxy that did not).
        give_up_at: Option<Instant>,
    },
    /// Waiting for a stream peer.
    Open {
        /// The endpoint actor.
        endpoint: Address,
        /// When to give up and cancel.
        give_up_at: Instant,
    },
    /// A retraction (cancel, close or release): retried until any reply.
    Retract,
}

/// The client's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Waiting to start the next operation.
    Idle,
    /// A request is in flight.
    Calling {
        /// What for.
        plan: Plan,
        /// The request (re-sent unchanged on retry).
        request: DirectoryRequest,
        /// Request ids of every attempt (a reply to any of them counts).
        attempts: Vec<RequestId>,
    },
    /// Holding a matched stream until the hold time passes.
    Holding {
        /// The stream path.
        path: DataPath,
        /// The match.
        incarnation: StreamIncarnation,
        /// Our endpoint.
        endpoint: Address,
        /// Our side.
        role: StreamRole,
    },
}

/// What a client asks its host to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a call to the node's proxy.
    Call(DirectoryCall),
    /// Tell the proxy this client gives up on everything it has pending.
    CancelPending,
    /// Create a blob source actor with this address.
    SpawnSource(Address),
    /// Stop a blob source (its Register was refused).
    StopSource(Address),
    /// Create a stream endpoint actor.
    SpawnEndpoint(Address),
    /// Stop a stream endpoint.
    StopEndpoint(Address),
    /// Call `wake` at this instant.
    WakeAt(Instant),
}

/// One simulated client.
#[derive(Clone, Debug)]
pub struct Client {
    /// The client's address (its reply inbox).
    pub address: Address,
    /// A world-unique number used to derive operation ids.
    pub global: u32,
    /// What it is doing.
    pub state: State,
    next_request: u64,
    next_op: u64,
    history: VecDeque<DirectoryRequest>,
    observed: Vec<(DataPath, Revision)>,
    quiescing: bool,
    reconnect: Option<(DataPath, StreamRole, Revision)>,
    /// Retractions handed over to the proxy (by a cancel or a walk-away): re-issued explicitly
    /// if the proxy restarts and loses them.
    abandoned: VecDeque<DirectoryRequest>,
    /// Retractions to send before any new operation.
    queued: VecDeque<DirectoryRequest>,
    /// Reserves it walked away from (the request ids of their attempts, and their release):
    /// the proxy retracts one it still holds, but an answer already on its way back is the
    /// caller's to release (`ProxyCancel` retracts only what is waiting).
    walked_away: VecDeque<(Vec<RequestId>, DirectoryRequest)>,
    /// Wake-ups are valid only for the current generation.
    pub wake_generation: u64,
    /// The horizon the directory acknowledged.
    declared: u64,
    /// The declaration in flight: its request id and horizon. A refused or unanswered one is
    /// made again (a full proxy refuses it at once; nothing else would ever re-send it once
    /// the client has quiesced, and its records would stay forever).
    declaring: Option<(RequestId, u64)>,
    /// Violations it saw (drained by the world into the checker).
    pub violations: Vec<String>,
}

/// What a client needs from the world for one step.
#[derive(Debug)]
pub struct Io<'a> {
    /// Current time.
    pub now: Instant,
    /// The workload stream.
    pub rng: &'a mut SimRng,
    /// Workload options.
    pub options: &'a WorkloadOptions,
    /// The contended paths.
    pub paths: &'a [DataPath],
    /// Allocates an actor number on the client's node.
    pub next_actor: &'a mut u64,
    /// How long to wait for the proxy's answer before assuming the proxy lost the request.
    pub guard: Duration,
    /// What the client wants done, in order.
    pub actions: Vec<Action>,
}

impl Io<'_> {
    fn spawn(&mut self, base: Address) -> Address {
        let actor = *self.next_actor;
        *self.next_actor += 1;
        Address { actor, ..base }
    }

    fn jitter(&mut self, mean: Duration) -> Duration {
        Duration::from_nanos(self.rng.exponential(mean.as_nanos()))
    }
}

/// The longest blob a client registers (its sources serve no bytes; workers read them anyway).
pub const CLIENT_BLOB_MAX: u64 = 1 << 20;

/// Mean pause before a client asks a full proxy again.
const BUSY_PAUSE: Duration = Duration::from_millis(200);

/// The retraction of a stream open: its cancel, under its op id.
fn cancel_of(request: &DirectoryRequest) -> Option<DirectoryRequest> {
    match request {
        DirectoryRequest::OpenStream {
            path, operation, ..
        } => Some(DirectoryRequest::CancelStream {
            path: path.clone(),
            operation: *operation,
        }),
        _ => None,
    }
}

fn is_definitive(body: &ReplyBody) -> bool {
    use dataplane_core::error::NamespaceError as E;
    !matches!(
        body.err(),
        Some(
            E::Storage(_)
                | E::LimitReached(_)
                | E::NoSpace(_)
                | E::DirectoryUnavailable(_)
                | E::Timeout
        )
    )
}

impl Client {
    /// A fresh client.
    pub fn new(address: Address, global: u32) -> Self {
        Client {
            address,
            global,
            state: State::Idle,
            next_request: 1,
            next_op: 1,
            history: VecDeque::new(),
            observed: Vec::new(),
            quiescing: false,
            reconnect: None,
            abandoned: VecDeque::new(),
            queued: VecDeque::new(),
            walked_away: VecDeque::new(),
            wake_generation: 0,
            declared: 0,
            declaring: None,
            violations: Vec::new(),
        }
    }

    /// The client's issuer: lane = its actor number on its node incarnation.
    pub fn issuer(&self) -> Issuer {
        Issuer::of(self.address, self.address.actor as u8)
    }

    /// The lowest sequence number it may still ask about: that of its request in flight if
    /// it is one of its own not yet answered (not a replay from its history), else the next.
    pub fn horizon(&self) -> u64 {
        match &self.state {
            State::Calling {
                plan, request: r, ..
            } if !matches!(plan, Plan::Retract) => r
                .operation()
                .filter(|op| op.issuer() == self.issuer() && !self.replays(*op))
                .map_or(self.next_op, OperationId::sequence),
            _ => self.next_op,
        }
    }

    fn replays(&self, op: OperationId) -> bool {
        self.history.iter().any(|h| h.operation() == Some(op))
    }

    /// Declares the client's operations done when its horizon moved far enough. The answer
    /// is not waited for (a later declaration covers a lost one).
    fn declare_done(&mut self, io: &mut Io<'_>) {
        let below = self.horizon();
        let every = if self.quiescing { 1 } else { DONE_EVERY };
        if below < self.declared + every || self.declaring.is_some() {
            return;
        }
        let request_id = RequestId(self.next_request);
        self.next_request += 1;
        self.declaring = Some((request_id, below));
        let call = DirectoryCall {
            request_id,
            reply_to: self.address,
            request: DirectoryRequest::OperationsDone {
                issuer: self.issuer(),
                below,
            },
        };
        io.actions.push(Action::Call(call));
    }

    /// Whether the client has nothing in flight, holds nothing and owes no retraction.
    pub fn is_idle(&self) -> bool {
        self.state == State::Idle && self.queued.is_empty()
    }

    fn fresh_op(&mut self) -> OperationId {
        let op = self.issuer().op(self.next_op);
        self.next_op += 1;
        op
    }

    fn send(&mut self, io: &mut Io<'_>, plan: Plan, request: DirectoryRequest) {
        self.state = State::Calling {
            plan,
            request,
            attempts: Vec::new(),
        };
        self.attempt(io);
    }

    /// (Re-)sends the current request under a new request id and arms the retry timer.
    fn attempt(&mut self, io: &mut Io<'_>) {
        let request_id = RequestId(self.next_request);
        self.next_request += 1;
        let State::Calling {
            request, attempts, ..
        } = &mut self.state
        else {
            return;
        };
        attempts.push(request_id);
        let call = DirectoryCall {
            request_id,
            reply_to: self.address,
            request: request.clone(),
        };
        io.actions.push(Action::Call(call));
        let at = io.now.saturating_add(io.guard);
        io.actions.push(Action::WakeAt(at));
    }

    /// Gives up on everything pending at the proxy (`ProxyCancel`): the declaration in flight
    /// goes too, so it will be made again.
    fn cancel_pending(&mut self, io: &mut Io<'_>) {
        io.actions.push(Action::CancelPending);
        self.declaring = None;
    }

    /// Remembers a retraction the proxy now owns.
    fn abandon(&mut self, retraction: DirectoryRequest) {
        if self.abandoned.len() == ABANDONED_MAX {
            self.abandoned.pop_front();
        }
        self.abandoned.push_back(retraction);
    }

    /// The node's proxy restarted: everything it held is lost. Re-issue the current request and
    /// every retraction it had been handed.
    pub fn proxy_restarted(&mut self, io: &mut Io<'_>) {
        self.queued.extend(self.abandoned.drain(..));
        // The declaration in flight is lost with the proxy's table.
        self.declaring = None;
        match self.state {
            State::Calling { .. } => self.attempt(io),
            State::Idle if !self.queued.is_empty() => io.actions.push(Action::WakeAt(io.now)),
            _ => {}
        }
    }

    fn idle(&mut self, io: &mut Io<'_>) {
        self.state = State::Idle;
        if !self.queued.is_empty() {
            io.actions.push(Action::WakeAt(io.now));
        } else if !self.quiescing {
            let pause = io.jitter(io.options.think_mean);
            io.actions
                .push(Action::WakeAt(io.now.saturating_add(pause)));
        }
    }

    fn remember(&mut self, request: DirectoryRequest) {
        if self.history.len() == HISTORY_MAX {
            self.history.pop_front();
        }
        self.history.push_back(request);
    }

    fn observe(&mut self, path: &DataPath, revision: Revision) {
        self.observed.retain(|(p, _)| p != path);
        self.observed.push((path.clone(), revision));
    }

    /// The world calls this when the client's wake-up fires.
    pub fn wake(&mut self, io: &mut Io<'_>) {
        match &self.state {
            State::Idle => {
                if let Some(retraction) = self.queued.pop_front() {
                    self.send(io, Plan::Retract, retraction);
                } else if !self.quiescing {
                    self.start(io);
                } else {
                    // Quiet: only a declaration that was refused is left to make.
                    self.declare_done(io);
                }
            }
            State::Holding {
                path,
                incarnation,
                endpoint,
                role,
            } => {
                if !self.quiescing && io.rng.chance(ratio(1, 2)) {
                    self.reconnect = Some((path.clone(), *role, incarnation.revision));
                }
                let close = DirectoryRequest::CloseStream {
                    path: path.clone(),
                    incarnation: *incarnation,
                };
                io.actions.push(Action::StopEndpoint(*endpoint));
                let walk_away = !self.quiescing && io.rng.chance(ratio(3, 20));
                self.send(io, Plan::Retract, close.clone());
                if walk_away {
                    // The caller stops right after asking for the close: the proxy must keep it
                    // (and re-own it) until the directory acknowledges (N-D9).
                    self.cancel_pending(io);
                    self.abandon(close);
                    self.idle(io);
                }
            }
            State::Calling {
                plan,
                request,
                attempts,
            } => {
                if let Plan::Reserve {
                    give_up_at: Some(at),
                    ..
                } = plan
                    && io.now >= *at
                    && let DirectoryRequest::ReserveBlob {
                        path, operation, ..
                    } = request
                {
                    // Walk away: the proxy retracts the reserve if it still holds it; an answer
                    // already on its way is released when it arrives.
                    let release = DirectoryRequest::ReleaseBlobReservation {
                        path: path.clone(),
                        operation: *operation,
                    };
                    let attempts = attempts.clone();
                    self.cancel_pending(io);
                    if self.walked_away.len() == ABANDONED_MAX {
                        self.walked_away.pop_front();
                    }
                    self.walked_away.push_back((attempts, release.clone()));
                    self.abandon(release);
                    self.idle(io);
                    return;
                }
                if let Plan::Open {
                    give_up_at,
                    endpoint,
                } = plan
                    && (io.now >= *give_up_at || self.quiescing)
                {
                    let DirectoryRequest::OpenStream {
                        path, operation, ..
                    } = request
                    else {
                        return;
                    };
                    // Give up: the proxy retracts the open (it owns the cleanup now).
                    let cancel = DirectoryRequest::CancelStream {
                        path: path.clone(),
                        operation: *operation,
                    };
                    io.actions.push(Action::StopEndpoint(*endpoint));
                    self.cancel_pending(io);
                    self.abandon(cancel);
                    self.idle(io);
                    return;
                }
                // The guard expired: the proxy lost the request (it answers everything else).
                let persistent = match plan {
                    Plan::Once { persistent, .. } => *persistent,
                    Plan::Reserve { .. } | Plan::Open { .. } | Plan::Retract => true,
                };
                let _ = attempts;
                if persistent {
                    self.attempt(io);
                } else {
                    self.idle(io);
                }
            }
        }
    }

    /// The run heals: start nothing new, wind down what is running.
    pub fn quiesce(&mut self, io: &mut Io<'_>) {
        self.quiescing = true;
        match &self.state {
            State::Holding { .. }
            | State::Calling {
                plan: Plan::Open { .. },
                ..
            } => {
                self.wake(io);
            }
            _ => {}
        }
        // Everything it finished is done: the directory may forget it all.
        self.declare_done(io);
    }

    /// The client's endpoint was displaced: its stream is over.
    pub fn displaced(&mut self, endpoint: Address, io: &mut Io<'_>) {
        if matches!(&self.state, State::Holding { endpoint: e, .. } if *e == endpoint) {
            io.actions.push(Action::StopEndpoint(endpoint));
            self.idle(io);
        }
    }

    /// A directory reply addressed to this client.
    pub fn reply(&mut self, reply: &DirectoryReply, io: &mut Io<'_>) {
        if let ReplyBody::OperationsDone(result) = &reply.body
            && let Some((id, below)) = self.declaring
            && id == reply.request_id
        {
            self.declaring = None;
            if result.is_ok() {
                self.declared = self.declared.max(below);
                // Operations that finished while it was in flight are declared now (a
                // quiesced client has nothing else that would declare them).
                self.declare_done(io);
            } else if self.state == State::Idle {
                // Refused (a full proxy) or unanswered: declare again after a pause; a busy
                // client declares again when it starts its next operation.
                let pause = Duration::from_millis(50).saturating_add(io.jitter(BUSY_PAUSE));
                io.actions
                    .push(Action::WakeAt(io.now.saturating_add(pause)));
            }
            return;
        }
        if let ReplyBody::BlobReserved(Ok(())) = &reply.body
            && let Some(i) = self
                .walked_away
                .iter()
                .position(|(ids, _)| ids.contains(&reply.request_id))
            && let Some((_, release)) = self.walked_away.remove(i)
        {
            // The answer overtook the walk-away: the proxy no longer held the reserve, so
            // the caller releases it itself.
            self.queued.push_back(release);
            if self.state == State::Idle {
                io.actions.push(Action::WakeAt(io.now));
            }
            return;
        }
        let State::Calling {
            plan,
            request,
            attempts,
        } = &self.state
        else {
            return;
        };
        if !attempts.contains(&reply.request_id) || reply.body.kind() != request.kind() {
            return;
        }
        let plan = plan.clone();
        let request = request.clone();
        if let Some(NamespaceError::OperationExpired(op)) = reply.body.err()
            && !matches!(plan, Plan::Retract)
            && !self.replays(*op)
        {
            self.violations.push(format!(
                "client {} heard OperationExpired for {op}, which it still asks about: its \
                 record was pruned while it could retry",
                self.address
            ));
        }
        // An earlier attempt went to a proxy that restarted or whose answer never came: it may
        // have reached the directory.
        let placed_before = attempts.len() > 1;
        let body = &reply.body;
        if reply.epoch == AuthorityEpoch::NONE {
            // The proxy's own answer (deadline or a full table): the directory did not answer.
            // An expired open or reserve is retracted by the proxy, and the caller remembers
            // that retraction in case the proxy restarts before the directory acknowledges it.
            // A refused one (LimitReached) was not admitted by this proxy; if an earlier attempt
            // may have been, the caller retracts it itself (nobody else will).
            let expired = matches!(
                reply.body.err(),
                Some(NamespaceError::Timeout | NamespaceError::DirectoryUnavailable(_))
            );
            match plan {
                Plan::Open { endpoint, .. } => {
                    io.actions.push(Action::StopEndpoint(endpoint));
                    if let (
                        true,
                        DirectoryRequest::OpenStream {
                            path, operation, ..
                        },
                    ) = (expired, &request)
                    {
                        let cancel = DirectoryRequest::CancelStream {
                            path: path.clone(),
                            operation: *operation,
                        };
                        self.abandon(cancel);
                    } else if let (true, Some(cancel)) = (placed_before, cancel_of(&request)) {
                        self.send(io, Plan::Retract, cancel);
                        return;
                    }
                    self.idle(io);
                }
                Plan::Reserve { .. } => {
                    if let (
                        true,
                        DirectoryRequest::ReserveBlob {
                            path, operation, ..
                        },
                    ) = (expired, &request)
                    {
                        let release = DirectoryRequest::ReleaseBlobReservation {
                            path: path.clone(),
                            operation: *operation,
                        };
                        self.abandon(release);
                    } else if let (
                        true,
                        DirectoryRequest::ReserveBlob {
                            path, operation, ..
                        },
                    ) = (placed_before, &request)
                    {
                        let release = DirectoryRequest::ReleaseBlobReservation {
                            path: path.clone(),
                            operation: *operation,
                        };
                        self.send(io, Plan::Retract, release);
                        return;
                    }
                    self.idle(io);
                }
                Plan::Once {
                    persistent: true, ..
                }
                | Plan::Retract
                    if !expired =>
                {
                    // A full proxy: ask again after a pause, not at once (an immediate
                    // re-issue spins with the full table; the host machine waits a tick too).
                    let pause = Duration::from_millis(50).saturating_add(io.jitter(BUSY_PAUSE));
                    io.actions
                        .push(Action::WakeAt(io.now.saturating_add(pause)));
                }
                Plan::Once {
                    persistent: true, ..
                }
                | Plan::Retract => self.attempt(io),
                Plan::Once { .. } => self.idle(io),
            }
            return;
        }
        if body.err().is_some_and(NamespaceError::left_no_trace) {
            // The directory neither applied nor remembered it (a full operation table or a
            // full disk): a copy may still take effect. A persistent request is asked again
            // after a pause, under its op id; an open is retracted (nobody else will).
            match plan {
                Plan::Once {
                    persistent: true, ..
                }
                | Plan::Reserve { .. }
                | Plan::Retract => {
                    let pause = Duration::from_millis(50).saturating_add(io.jitter(BUSY_PAUSE));
                    io.actions
                        .push(Action::WakeAt(io.now.saturating_add(pause)));
                    return;
                }
                Plan::Open { endpoint, .. } => {
                    io.actions.push(Action::StopEndpoint(endpoint));
                    match cancel_of(&request) {
                        Some(cancel) => self.send(io, Plan::Retract, cancel),
                        None => self.idle(io),
                    }
                    return;
                }
                Plan::Once { .. } => {}
            }
        }
        match (&plan, body) {
            (
                Plan::Once {
                    source: Some(source),
                    ..
                },
                ReplyBody::Registered(Err(_)),
            ) => {
                io.actions.push(Action::StopSource(*source));
            }
            (Plan::Reserve { then_register, .. }, ReplyBody::BlobReserved(Ok(()))) => {
                let DirectoryRequest::ReserveBlob {
                    path, operation, ..
                } = &request
                else {
                    return;
                };
                self.remember(request.clone());
                let (path, reservation) = (path.clone(), *operation);
                if *then_register && !self.quiescing {
                    let source = io.spawn(self.address);
                    io.actions.push(Action::SpawnSource(source));
                    let register = self.register_request(io, path, source, Some(reservation));
                    self.send(
                        io,
                        Plan::Once {
                            persistent: true,
                            source: Some(source),
                        },
                        register,
                    );
                } else {
                    let release = DirectoryRequest::ReleaseBlobReservation {
                        path,
                        operation: reservation,
                    };
                    self.send(io, Plan::Retract, release);
                }
                return;
            }
            (Plan::Open { endpoint, .. }, ReplyBody::StreamOpened(result)) => {
                let DirectoryRequest::OpenStream { path, role, .. } = &request else {
                    return;
                };
                match result {
                    Ok(matched) => {
                        self.observe(path, matched.revision);
                        self.state = State::Holding {
                            path: path.clone(),
                            incarnation: matched.incarnation,
                            endpoint: *endpoint,
                            role: *role,
                        };
                        let hold = if self.quiescing {
                            Duration::ZERO
                        } else {
                            io.options.hold_time
                        };
                        io.actions.push(Action::WakeAt(io.now.saturating_add(hold)));
                    }
                    Err(_) => {
                        io.actions.push(Action::StopEndpoint(*endpoint));
                        self.idle(io);
                    }
                }
                self.remember(request);
                return;
            }
            _ => {}
        }
        if let ReplyBody::LookedUp(Ok(node)) = body
            && let DirectoryRequest::Lookup { path } = &request
        {
            self.observe(path, node.revision);
        }
        if is_definitive(body) && !matches!(plan, Plan::Retract) {
            self.remember(request);
        }
        self.idle(io);
    }

    fn register_request(
        &mut self,
        io: &mut Io<'_>,
        path: DataPath,
        source: Address,
        reservation: Option<OperationId>,
    ) -> DirectoryRequest {
        DirectoryRequest::Register {
            path,
            source,
            source_node: source.node,
            length: io.rng.range(0, CLIENT_BLOB_MAX),
            recovery: SourceRecovery::Actor {
                actor: source,
                node: source.node,
                owner: None,
            },
            operation: self.fresh_op(),
            reservation,
        }
    }

    fn open(
        &mut self,
        io: &mut Io<'_>,
        path: DataPath,
        role: StreamRole,
        ensure: bool,
        expected_revision: Option<Revision>,
        replace: bool,
    ) {
        let endpoint = io.spawn(self.address);
        io.actions.push(Action::SpawnEndpoint(endpoint));
        let request = DirectoryRequest::OpenStream {
            path,
            role,
            descriptor: Descriptor::new(endpoint.actor.to_le_bytes().to_vec())
                .expect("8 bytes fit"),
            endpoint,
            replace,
            ensure,
            expected_revision,
            operation: self.fresh_op(),
        };
        let give_up_at = io.now.saturating_add(io.options.open_wait);
        self.send(
            io,
            Plan::Open {
                endpoint,
                give_up_at,
            },
            request,
        );
    }

    fn start(&mut self, io: &mut Io<'_>) {
        self.declare_done(io);
        if let Some((path, role, revision)) = self.reconnect.take() {
            // Reconnect: open the same side again on the node revision just used, as a peer
            // that lost its stream would (both sides usually do, and rendezvous again).
            return self.open(io, path, role, false, Some(revision), false);
        }
        let kind = OpKind::ALL[io.rng.weighted(&io.options.weights)];
        let path = io.rng.pick(io.paths).clone();
        match kind {
            OpKind::Register => {
                let source = io.spawn(self.address);
                io.actions.push(Action::SpawnSource(source));
                let request = self.register_request(io, path, source, None);
                self.send(
                    io,
                    Plan::Once {
                        persistent: true,
                        source: Some(source),
                    },
                    request,
                );
            }
            OpKind::Unregister => {
                // Sometimes a compare-and-delete of the revision last seen (Q19).
                let expected_revision = if io.rng.chance(ratio(3, 10)) {
                    self.observed
                        .iter()
                        .find(|(p, _)| *p == path)
                        .map(|(_, r)| *r)
                } else {
                    None
                };
                let request = DirectoryRequest::Unregister {
                    path,
                    expected_revision,
                    operation: self.fresh_op(),
                };
                self.send(
                    io,
                    Plan::Once {
                        persistent: true,
                        source: None,
                    },
                    request,
                );
            }
            OpKind::Rename => {
                let destination = io.rng.pick(io.paths).clone();
                let replace = io.rng.chance(ratio(1, 2));
                let request = DirectoryRequest::Rename {
                    source: path,
                    destination,
                    replace,
                    operation: self.fresh_op(),
                };
                self.send(
                    io,
                    Plan::Once {
                        persistent: true,
                        source: None,
                    },
                    request,
                );
            }
            OpKind::Resolve => {
                let request = DirectoryRequest::Resolve { path };
                self.send(
                    io,
                    Plan::Once {
                        persistent: false,
                        source: None,
                    },
                    request,
                );
            }
            OpKind::Lookup => {
                let request = DirectoryRequest::Lookup { path };
                self.send(
                    io,
                    Plan::Once {
                        persistent: false,
                        source: None,
                    },
                    request,
                );
            }
            OpKind::ReserveRegister | OpKind::ReserveRelease => {
                let request = DirectoryRequest::ReserveBlob {
                    path,
                    operation: self.fresh_op(),
                    owner: self.address,
                };
                let then_register = kind == OpKind::ReserveRegister;
                let walk_away = io.options.reserve_walk_away_permille > 0
                    && io.rng.below(1_000) < io.options.reserve_walk_away_permille;
                let give_up_at = walk_away.then(|| {
                    io.now
                        .saturating_add(Duration::from_micros(io.rng.range(0, 30_000)))
                });
                self.send(
                    io,
                    Plan::Reserve {
                        then_register,
                        give_up_at,
                    },
                    request,
                );
                if let Some(at) = give_up_at {
                    io.actions.push(Action::WakeAt(at));
                }
            }
            OpKind::OpenStream => {
                let role = if io.rng.chance(ratio(1, 2)) {
                    StreamRole::Source
                } else {
                    StreamRole::Sink
                };
                let ensure = io.rng.chance(ratio(3, 5));
                let expected_revision = if ensure {
                    None
                } else {
                    self.observed
                        .iter()
                        .find(|(p, _)| *p == path)
                        .map(|(_, r)| *r)
                        .or_else(|| Some(Revision(io.rng.range(1, 8))))
                };
                let replace = io.rng.chance(ratio(1, 4));
                self.open(io, path, role, ensure, expected_revision, replace);
            }
            OpKind::Replay | OpKind::Conflict if !self.history.is_empty() => {
                let index = io.rng.below(self.history.len() as u64) as usize;
                let old = self.history[index].clone();
                if let (OpKind::Replay, DirectoryRequest::OpenStream { endpoint, .. }) =
                    (kind, &old)
                {
                    // An open whose first answer was not sticky (say DuplicateStreamRole) is a
                    // real open when replayed: it may park, so it needs the whole open plan.
                    let endpoint = *endpoint;
                    io.actions.push(Action::SpawnEndpoint(endpoint));
                    let give_up_at = io.now.saturating_add(io.options.open_wait);
                    return self.send(
                        io,
                        Plan::Open {
                            endpoint,
                            give_up_at,
                        },
                        old,
                    );
                }
                let request = if kind == OpKind::Replay {
                    old
                } else if io.rng.chance(ratio(1, 2))
                    && let Some(varied) = vary_one_field(&old, io)
                {
                    // Same kind, same path, same op id: one other field differs (issue 15,
                    // class 6). The model says which fields make it a conflict.
                    varied
                } else {
                    let Some(operation) = old.operation() else {
                        return self.idle(io);
                    };
                    DirectoryRequest::Unregister {
                        path: DataPath::new("/conflict").expect("valid"),
                        expected_revision: None,
                        operation,
                    }
                };
                // A replay must change nothing, so the client does not insist on an answer.
                self.send(
                    io,
                    Plan::Once {
                        persistent: false,
                        source: None,
                    },
                    request,
                );
            }
            OpKind::Replay | OpKind::Conflict => self.idle(io),
        }
    }
}

/// `old` with exactly one field other than its kind, path and operation id changed, drawn
/// among the fields of its kind (issue 15, class 6), or `None` for a kind with no such field
/// this client may vary without changing what it runs (opens park and need their endpoint, so
/// they are not varied here).
fn vary_one_field(old: &DirectoryRequest, io: &mut Io<'_>) -> Option<DirectoryRequest> {
    let mut request = old.clone();
    match &mut request {
        DirectoryRequest::Register {
            source,
            length,
            recovery,
            reservation,
            ..
        } => match io.rng.below(4) {
            0 => *length = length.wrapping_add(io.rng.range(1, 4096)),
            1 => *source = Address::new(source.node, source.incarnation, source.actor + 1),
            2 => match recovery {
                SourceRecovery::Actor { owner, .. } => {
                    *owner = match owner {
                        Some(_) => None,
                        None => Some(*source),
                    }
                }
                SourceRecovery::File { .. } => return None,
            },
            _ => *reservation = reservation.is_none().then(|| old.operation()).flatten(),
        },
        DirectoryRequest::Unregister {
            expected_revision, ..
        } => {
            *expected_revision = match expected_revision {
                Some(r) if io.rng.chance(ratio(1, 2)) => None,
                Some(r) => Some(Revision(r.0 + 1)),
                None => Some(Revision(io.rng.range(1, 8))),
            }
        }
        DirectoryRequest::Rename {
            source,
            destination,
            replace,
            ..
        } => {
            if io.rng.chance(ratio(1, 2)) {
                *replace = !*replace;
            } else {
                let other = io.rng.pick(io.paths).clone();
                if other == *destination || other == *source {
                    return None;
                }
                *destination = other;
            }
        }
        DirectoryRequest::ReserveBlob { owner, .. } => {
            *owner = Address::new(owner.node, owner.incarnation, owner.actor + 1);
        }
        _ => return None,
    }
    Some(request)
}

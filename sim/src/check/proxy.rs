//! Checkers of the proxies (SPEC §13.7), fed every proxy step.
//!
//! Every caller request a proxy admits is tracked until its one reply reaches the caller:
//!
//! * **L7 bounded reply**: on every tick of a proxy, no request of its callers (retractions
//!   excepted) has waited longer than `deadline + retry_period`; no reply reaches a caller twice
//!   or without a request.
//! * **L8 retractions persist**: a retraction leaves a proxy's pending table only in the step
//!   that processes the directory's acknowledgement of it; every retraction the proxy
//!   dispatches is one it tracks; none is ever answered by the proxy itself (it never expires);
//!   at the end of the liveness phase no proxy holds any pending request.
//! * **S26 epoch filtering**: a forwarded directory reply carries exactly the epoch of the
//!   authority the proxy currently discovers, and nothing is forwarded while none is.
//! * **S27 reply routing**: a forwarded reply goes to the caller recorded for that request, in
//!   its request's reply variant (S8b), once.
//! * **Q10 / deadline honesty**: a synthetic `DirectoryUnavailable` or `Timeout` comes only at
//!   or after the deadline, `DirectoryUnavailable` only if no directory was discoverable at any
//!   time since the request was admitted, `Timeout` only if one was. One exception, for reads
//!   only (`Resolve`, `Lookup`: they change nothing): `DirectoryUnavailable` may come once the
//!   read has waited the absent-read wait with no directory discoverable since its admission.
//!
//! A proxy that stops (restart, host crash) excuses its outstanding requests: its callers
//! re-issue them to the next instance.

use std::collections::BTreeMap;

use dataplane_core::effect::Effect;
use dataplane_core::error::{Limit, NamespaceError};
use dataplane_core::ids::{Address, AuthorityEpoch, RequestId};
use dataplane_core::proxy::{Discovered, Proxy};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{DirectoryRequest, Message, RequestKind};

/// What a proxy was fed in one step.
#[allow(clippy::large_enum_variant)] // built once per step, passed by reference
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyInput {
    /// A frame (a caller's call or cancel, or a directory reply).
    Message(Message),
    /// Discovery's new answer.
    Discovery(Option<Discovered>),
    /// The retry tick.
    Timer,
}

/// One proxy instance: (host index, host incarnation, proxy generation).
pub type ProxyId = (usize, u64, u64);

#[derive(Clone, Debug)]
struct Outstanding {
    proxy: ProxyId,
    kind: RequestKind,
    admitted_at: Instant,
    saw_directory: bool,
    /// What undoes the request if its caller stops waiting for it (SPEC §5.1: an expired or
    /// cancelled open is retracted with `CancelStream`, a reserve with
    /// `ReleaseBlobReservation`), restated here from the request.
    undo: Option<DirectoryRequest>,
}

/// The retraction that undoes `request` once nobody waits for it (restated from SPEC §5.1,
/// not asked of the proxy).
fn undo_of(request: &DirectoryRequest) -> Option<DirectoryRequest> {
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

/// The proxy checkers' state.
#[derive(Clone, Debug)]
pub struct ProxyChecker {
    deadline: Duration,
    /// How long a read waits with no directory before it may fail early.
    absent_read_wait: Duration,
    retry_period: Duration,
    outstanding: BTreeMap<(Address, RequestId), Outstanding>,
    live: BTreeMap<usize, ProxyId>,
    /// The retractions each proxy held after its last step, by the proxy's request id (sorted).
    retractions: BTreeMap<ProxyId, Vec<RequestId>>,
    /// A vector to collect the next step's retractions into (the last step's, reused).
    spare: Vec<RequestId>,
    /// What each proxy was last told by discovery (the checker's own record of its inputs).
    discovery: BTreeMap<ProxyId, Option<Discovered>>,
    /// Pacing: per proxy, each request id it sent a call for, when it last sent it and how
    /// often since discovery last named a new authority (the checker's own record of the
    /// proxy's effects). Entries not sent for `PACING_FORGET_AFTER` periods are dropped.
    sends: BTreeMap<ProxyId, BTreeMap<RequestId, (Instant, u32)>>,
}

/// How many retry periods a request may go unsent before the pacing record forgets it (it is
/// answered, or no directory is known: a later send counts afresh, which only weakens the
/// check).
const PACING_FORGET_AFTER: u64 = 3;
/// The clocks' conversions round: a tick may read up to this much short of its period.
const PACING_ROUNDING: Duration = Duration::from_micros(1);

impl ProxyChecker {
    /// Checks proxies with this deadline, tick and absent-read wait.
    pub fn new(deadline: Duration, retry_period: Duration, absent_read_wait: Duration) -> Self {
        ProxyChecker {
            deadline,
            absent_read_wait,
            retry_period,
            outstanding: BTreeMap::new(),
            live: BTreeMap::new(),
            retractions: BTreeMap::new(),
            spare: Vec::new(),
            discovery: BTreeMap::new(),
            sends: BTreeMap::new(),
        }
    }

    /// A proxy instance started.
    pub fn started(&mut self, id: ProxyId) {
        self.live.insert(id.0, id);
    }

    /// A proxy instance stopped: its callers' requests are excused.
    pub fn stopped(&mut self, id: ProxyId) {
        self.outstanding.retain(|_, o| o.proxy != id);
        self.retractions.remove(&id);
        self.discovery.remove(&id);
        self.sends.remove(&id);
        if self.live.get(&id.0) == Some(&id) {
            self.live.remove(&id.0);
        }
    }

    /// One proxy step. Returns the first violation, and the coverage names it hit.
    pub fn step(
        &mut self,
        now: Instant,
        id: ProxyId,
        input: &ProxyInput,
        effects: &[Effect],
        proxy: &Proxy,
        hits: &mut Vec<&'static str>,
    ) -> Result<(), String> {
        let discovered = proxy.directory();
        self.check_paced(now, id, input, effects, hits)?;
        // Retractions this step must leave the proxy holding: of the opens and reserves whose
        // callers gave up (a cancel) or that expired (the tick).
        let mut owed: Vec<DirectoryRequest> = Vec::new();
        match input {
            ProxyInput::Message(Message::ProxyCall(call)) => {
                let key = (call.reply_to, call.request_id);
                let kind = call.request.kind();
                let outstanding = Outstanding {
                    proxy: id,
                    kind,
                    admitted_at: now,
                    saw_directory: discovered.is_some(),
                    undo: undo_of(&call.request),
                };
                if self.outstanding.insert(key, outstanding).is_some() {
                    return Err(format!("caller {} reused request id {}", key.0, key.1));
                }
            }
            ProxyInput::Message(Message::ProxyCancel { reply_to }) => {
                hits.push("proxy.cancel");
                if self.outstanding.iter().any(|((caller, _), o)| {
                    o.proxy == id && caller == reply_to && o.kind == RequestKind::ReserveBlob
                }) {
                    hits.push("proxy.cancel_reserve");
                }
                self.outstanding.retain(|(caller, _), o| {
                    let cancelled = o.proxy == id && caller == reply_to;
                    if cancelled && let Some(undo) = &o.undo {
                        owed.push(undo.clone());
                    }
                    !cancelled
                });
            }
            ProxyInput::Discovery(Some(_)) => {
                for o in self.outstanding.values_mut().filter(|o| o.proxy == id) {
                    o.saw_directory = true;
                }
            }
            ProxyInput::Message(_) | ProxyInput::Discovery(None) | ProxyInput::Timer => {}
        }
        for effect in effects {
            let Effect::Send { to, message } = effect else {
                continue;
            };
            match message {
                Message::Reply(reply) if to.node.0 != 0 => {
                    let key = (*to, reply.request_id);
                    let Some(o) = self.outstanding.remove(&key) else {
                        return Err(format!(
                            "S27/L7: reply {} to {to} for no outstanding request (a second reply?)",
                            reply.request_id
                        ));
                    };
                    if o.proxy != id {
                        return Err(format!("S27: {to}'s request answered by another proxy"));
                    }
                    if reply.body.kind() != o.kind {
                        return Err(format!(
                            "S8b: a {:?} request answered with a {:?} reply",
                            o.kind,
                            reply.body.kind()
                        ));
                    }
                    if reply.epoch == AuthorityEpoch::NONE {
                        self.check_synthetic(now, &o, reply.body.err(), hits)?;
                        let expired = matches!(
                            reply.body.err(),
                            Some(NamespaceError::Timeout | NamespaceError::DirectoryUnavailable(_))
                        );
                        if expired && let Some(undo) = o.undo {
                            owed.push(undo);
                        }
                    } else {
                        let from_directory = matches!(
                            input,
                            ProxyInput::Message(Message::Reply(r)) if r.epoch == reply.epoch
                        );
                        match discovered {
                            Some(d) if d.epoch == reply.epoch && from_directory => {
                                hits.push("proxy.forwarded");
                            }
                            _ => {
                                return Err(format!(
                                    "S26: forwarded a reply of {} while discovering {discovered:?}",
                                    reply.epoch
                                ));
                            }
                        }
                    }
                }
                Message::Call(_) => match discovered {
                    Some(d) if d.address == *to => {}
                    _ => {
                        return Err(format!(
                            "a call dispatched to {to} while discovering {discovered:?}"
                        ));
                    }
                },
                _ => {}
            }
        }
        if let ProxyInput::Message(Message::Reply(reply)) = input {
            let forwarded = effects.iter().any(|e| {
                matches!(
                    e,
                    Effect::Send {
                        message: Message::Reply(_),
                        ..
                    }
                )
            });
            let accepted = discovered.is_some_and(|d| d.epoch == reply.epoch);
            if !accepted && !forwarded {
                hits.push("proxy.dropped_stale_reply");
            }
        }
        if let ProxyInput::Discovery(found) = input {
            let before = self.discovery.insert(id, *found).flatten();
            if let Some(new) = found
                && before != Some(*new)
            {
                self.check_redispatch(id, new, effects, hits)?;
            }
        }
        // Promptness (issue 15, classes 7 and 8): the retraction is taken on in that very step,
        // whether or not the caller (or a host) also retracts.
        for undo in owed {
            let held = proxy
                .pending()
                .any(|(_, p)| p.is_retraction() && p.request == undo);
            if !held {
                return Err(format!(
                    "L1/L4: an open or reserve nobody waits for any more was not retracted: \
                     {undo:?} is not held"
                ));
            }
            hits.push("proxy.retracted_abandoned");
        }
        self.check_retractions(id, input, effects, proxy)?;
        if *input == ProxyInput::Timer {
            let bound = self.deadline.saturating_add(self.retry_period);
            if let Some(((caller, request_id), o)) = self.outstanding.iter().find(|(_, o)| {
                o.proxy == id
                    && !o.kind.is_retraction()
                    && now.saturating_since(o.admitted_at) > bound
            }) {
                return Err(format!(
                    "L7: {caller}'s {:?} {request_id} unanswered for {} (bound {bound})",
                    o.kind,
                    now.saturating_since(o.admitted_at)
                ));
            }
        }
        proxy
            .check_invariants()
            .map_err(|e| format!("proxy invariant: {e}"))
    }

    /// Paced re-sends (ARCHITECTURE "The proxy"), restated from the proxy's inputs and
    /// effects: a call goes out when its request is admitted, again on the retry tick, and to
    /// every new authority discovery names. So a request id already sent is sent again only
    /// on a tick or a discovery that named a new authority; and from its third send since
    /// such a discovery on (the first tick may follow its admission by any time), no sooner
    /// than the retry period after the last one, on the proxy's clock.
    fn check_paced(
        &mut self,
        now: Instant,
        id: ProxyId,
        input: &ProxyInput,
        effects: &[Effect],
        hits: &mut Vec<&'static str>,
    ) -> Result<(), String> {
        let new_authority = match input {
            ProxyInput::Discovery(found @ Some(_)) => {
                self.discovery.get(&id).copied().flatten() != *found
            }
            _ => false,
        };
        let sends = self.sends.entry(id).or_default();
        if new_authority {
            for entry in sends.values_mut() {
                entry.1 = 0;
            }
        }
        if *input == ProxyInput::Timer {
            let forget = self.retry_period.saturating_mul(PACING_FORGET_AFTER);
            sends.retain(|_, &mut (last, _)| now.saturating_since(last) < forget);
        }
        for effect in effects {
            let Effect::Send {
                to,
                message: Message::Call(call),
            } = effect
            else {
                continue;
            };
            let Some((last, count)) = sends.get_mut(&call.request_id) else {
                sends.insert(call.request_id, (now, 1));
                continue;
            };
            let since = now.saturating_since(*last);
            let on_tick = *input == ProxyInput::Timer;
            if !on_tick && !new_authority {
                return Err(format!(
                    "pacing: the proxy sent call {} to {to} again on {input:?}, {since} after                      the last time (a call is re-sent only on the retry tick or to a new                      authority)",
                    call.request_id
                ));
            }
            if on_tick && *count >= 2 && since.saturating_add(PACING_ROUNDING) < self.retry_period {
                return Err(format!(
                    "pacing: the proxy re-sent call {} to {to} {since} after the last time,                      before its retry period ({})",
                    call.request_id, self.retry_period
                ));
            }
            if on_tick && *count >= 2 {
                hits.push("proxy.resent_paced");
            }
            *last = now;
            *count = count.saturating_add(1);
        }
        Ok(())
    }

    /// Promptness (issue 15, class 7; ARCHITECTURE "Discovery"): when discovery names a new
    /// authority, everything the proxy has pending (its callers' requests still unanswered and
    /// the retractions it holds) is dispatched to it in that very step, not on the next tick.
    fn check_redispatch(
        &self,
        id: ProxyId,
        new: &Discovered,
        effects: &[Effect],
        hits: &mut Vec<&'static str>,
    ) -> Result<(), String> {
        // Callers' retractions are among the retractions the proxy holds: count them once.
        let callers = self
            .outstanding
            .values()
            .filter(|o| o.proxy == id && !o.kind.is_retraction())
            .count();
        let retractions = self.retractions.get(&id).map_or(0, Vec::len);
        let owed = callers + retractions;
        let sent = effects
            .iter()
            .filter(|e| {
                matches!(e, Effect::Send { to, message: Message::Call(_) } if *to == new.address)
            })
            .count();
        if sent < owed {
            return Err(format!(
                "promptness: discovery named {} ({}), but the proxy dispatched {sent} of its \
                 {owed} pending requests ({callers} of callers, {retractions} retractions) \
                 at once",
                new.address, new.epoch
            ));
        }
        if owed > 0 {
            hits.push("proxy.redispatched_on_discovery");
        }
        Ok(())
    }

    /// L8: retractions leave only with the directory's acknowledgement, and every dispatched
    /// retraction is tracked.
    fn check_retractions(
        &mut self,
        id: ProxyId,
        input: &ProxyInput,
        effects: &[Effect],
        proxy: &Proxy,
    ) -> Result<(), String> {
        // Both this step's and the last step's retractions are sorted vectors, compared in one
        // merge walk: this check runs after every proxy step, and long-lived proxies hold
        // thousands of retractions.
        let mut now_held = std::mem::take(&mut self.spare);
        now_held.clear();
        now_held.extend(
            proxy
                .pending()
                .filter(|(_, p)| p.is_retraction())
                .map(|(rid, _)| *rid),
        );
        if !now_held.is_sorted() {
            now_held.sort_unstable();
        }
        let acknowledged = match input {
            ProxyInput::Message(Message::Reply(reply))
                if proxy.directory().is_some_and(|d| d.epoch == reply.epoch) =>
            {
                Some(reply.request_id)
            }
            _ => None,
        };
        if let Some(before) = self.retractions.get(&id) {
            let mut now = now_held.iter().peekable();
            for gone in before {
                while now.next_if(|held| *held < gone).is_some() {}
                if now.peek() != Some(&gone) && Some(*gone) != acknowledged {
                    return Err(format!(
                        "L8: retraction {gone} left proxy {id:?} without an acknowledgement"
                    ));
                }
            }
        }
        for effect in effects {
            if let Effect::Send {
                message: Message::Call(call),
                ..
            } = effect
                && call.request.kind().is_retraction()
                && now_held.binary_search(&call.request_id).is_err()
            {
                return Err(format!(
                    "L8: retraction {} dispatched but not kept by proxy {id:?}",
                    call.request_id
                ));
            }
        }
        if let Some(last) = self.retractions.insert(id, now_held) {
            self.spare = last;
        }
        Ok(())
    }

    fn check_synthetic(
        &self,
        now: Instant,
        o: &Outstanding,
        error: Option<&NamespaceError>,
        hits: &mut Vec<&'static str>,
    ) -> Result<(), String> {
        let waited = now.saturating_since(o.admitted_at);
        match error {
            Some(NamespaceError::DirectoryUnavailable(_) | NamespaceError::Timeout) => {
                if o.kind.is_retraction() {
                    return Err(format!("L8: a {:?} retraction expired", o.kind));
                }
                if waited < self.deadline {
                    // Restated: only a read, only `DirectoryUnavailable`, only with no
                    // directory since its admission, only after the absent-read wait.
                    let read = matches!(o.kind, RequestKind::Resolve | RequestKind::Lookup);
                    let unavailable =
                        matches!(error, Some(NamespaceError::DirectoryUnavailable(_)));
                    if !(read && unavailable && !o.saw_directory && waited >= self.absent_read_wait)
                    {
                        return Err(format!(
                            "a {:?} expired after {waited} ({error:?}), before the deadline {} \
                             (absent-read wait {}, saw a directory: {})",
                            o.kind, self.deadline, self.absent_read_wait, o.saw_directory
                        ));
                    }
                    hits.push("proxy.unavailable_read");
                    return Ok(());
                }
                let timeout = matches!(error, Some(NamespaceError::Timeout));
                if timeout != o.saw_directory {
                    return Err(format!(
                        "Q10: answered {error:?} although a directory was {}discoverable",
                        if o.saw_directory { "" } else { "never " }
                    ));
                }
                hits.push(if timeout {
                    "proxy.timeout"
                } else {
                    "proxy.unavailable"
                });
                Ok(())
            }
            Some(NamespaceError::LimitReached(Limit::PendingRequests | Limit::RequestIds)) => {
                hits.push("proxy.limit");
                Ok(())
            }
            other => Err(format!("a synthetic reply (epoch 0) carrying {other:?}")),
        }
    }

    /// The end of the liveness phase: every request answered, every retraction acknowledged.
    pub fn at_end(&self, proxies: &[(ProxyId, &Proxy)]) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(((caller, id), o)) = self.outstanding.iter().next() {
            problems.push(format!("L7: {caller}'s {:?} {id} never answered", o.kind));
        }
        for (id, proxy) in proxies {
            if let Some((rid, pending)) = proxy.pending().next() {
                let what = if pending.is_retraction() {
                    "L8: retraction"
                } else {
                    "L7: request"
                };
                problems.push(format!(
                    "{what} {:?} {rid} still pending at proxy {id:?}",
                    pending.request.kind()
                ));
            }
        }
        problems
    }
}

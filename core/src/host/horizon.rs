//! Declaring the host's operations done (ARCHITECTURE "Retention of operation records").
//!
//! The host is the issuer of lane 0 of its node incarnation: every op id it mints is
//! `op_id(actor, purpose)`, and `actor` is allocated when the call is first made (a reserve or
//! a control call when its binding is created, a publish at the seal with the new source's
//! number, an unpublish at the abort with a number of its own). So the lowest sequence number
//! the host may still send is that of its oldest namespace call in flight (a call is re-sent
//! with the same op id until its answer is definitive), or the next actor's if none is. On its
//! tick, at most once per [`HORIZON_PERIOD`] and with one such call in flight, the host tells
//! the directory, through its proxy, that everything below is done, and the directory prunes
//! those records.
//!
//! Retractions handed to the proxy (releases of reservations) do not hold the horizon back: a
//! reservation's record stays while the reservation is held, whatever the horizon, and once it
//! is not held, the release has nothing left to undo.

use super::Host;
use crate::effect::Outbox;
use crate::ids::{Issuer, OperationId, RequestId};
use crate::time::{Duration, Instant};
use crate::wire::{DirectoryCall, DirectoryReply, DirectoryRequest, Message, ReplyBody};

/// How often, at most, the host declares its operations done.
pub const HORIZON_PERIOD: Duration = Duration::from_secs(1);

/// The host's side of the retention protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reporter {
    /// The actor whose address the directory's answers come back to (allocated when first
    /// needed, so a host that never completes an operation uses none).
    actor: Option<u64>,
    /// The horizon the directory acknowledged.
    acknowledged: u64,
    /// The `OperationsDone` in flight: its request id, horizon and when it was sent.
    in_flight: Option<(RequestId, u64, Instant)>,
    /// No declaration before this.
    next_at: Instant,
    next_call: u64,
}

impl Host {
    /// This host's issuer of operation ids.
    pub fn issuer(&self) -> Issuer {
        self.op_id(0, 0).issuer()
    }

    /// The lowest sequence number of an op id this host may still send: everything below it
    /// is done.
    pub fn operation_horizon(&self) -> u64 {
        let next = self.op_id(self.next_actor, 0).sequence();
        self.bindings
            .values()
            .filter_map(|b| b.call.as_ref()?.request.operation())
            .map(OperationId::sequence)
            .fold(next, u64::min)
    }

    /// Whether `actor` receives the answers to the host's declarations.
    pub(super) fn is_horizon_actor(&self, actor: u64) -> bool {
        self.horizon.actor == Some(actor)
    }

    /// When the horizon call in flight is given up (its guard), if one is.
    pub(super) fn horizon_guard_at(&self) -> Option<Instant> {
        self.horizon
            .in_flight
            .map(|(_, _, sent_at)| sent_at.saturating_add(self.config.call_guard))
    }

    /// When the next horizon report is due.
    pub(super) fn horizon_next_at(&self) -> Instant {
        self.horizon.next_at
    }

    /// On the tick: declare the horizon if it rose, none is in flight and the period passed.
    pub(super) fn report_horizon(&mut self, now: Instant, out: &mut Outbox) {
        let guard = self.config.call_guard;
        if let Some((_, _, sent_at)) = self.horizon.in_flight
            && now.saturating_since(sent_at) >= guard
        {
            // The proxy answers everything within its deadline unless it restarted.
            self.horizon.in_flight = None;
        }
        if self.horizon.in_flight.is_some() || now < self.horizon.next_at {
            return;
        }
        // O(bindings), like the tick's own filter, but at most once per period.
        self.horizon.next_at = now.saturating_add(HORIZON_PERIOD);
        let below = self.operation_horizon();
        if below <= self.horizon.acknowledged {
            return;
        }
        let actor = match self.horizon.actor {
            Some(actor) => actor,
            None => {
                let actor = self.allocate_actor();
                self.horizon.actor = Some(actor);
                actor
            }
        };
        let issuer = self.issuer();
        let r = &mut self.horizon;
        r.next_call += 1;
        let id = RequestId(r.next_call);
        r.in_flight = Some((id, below, now));
        let call = DirectoryCall {
            request_id: id,
            reply_to: self.address(actor),
            request: DirectoryRequest::OperationsDone { issuer, below },
        };
        out.send(self.config.proxy, Message::ProxyCall(call));
    }

    /// The proxy's answer to a declaration. Whatever it says, the next one may go on a later
    /// tick; the horizon the directory applied is remembered so an unchanged one is not sent
    /// again.
    pub(super) fn horizon_reply(&mut self, reply: &DirectoryReply) {
        let r = &mut self.horizon;
        let Some((id, _, _)) = r.in_flight else {
            return;
        };
        if reply.request_id != id {
            return;
        }
        r.in_flight = None;
        if let ReplyBody::OperationsDone(Ok(applied)) = reply.body {
            // The directory keeps its horizon lower while one of these operations is a live
            // rendezvous (a child's stream) and answers the horizon it applied; it does not
            // remember the rest of the declaration. So only what it applied counts: once the
            // stream ends (an input, which wakes the tick), the next tick declares again.
            // (Taking the declaration as standing left the records above the stream's op
            // held until the host's horizon rose again: seed 862.)
            r.acknowledged = r.acknowledged.max(applied);
        }
    }

    /// The proxy restarted and lost the declaration in flight: the next tick sends another.
    pub(super) fn horizon_proxy_restarted(&mut self) {
        self.horizon.in_flight = None;
    }
}

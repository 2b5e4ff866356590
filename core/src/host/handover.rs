//! Retractions the host hands to its proxy when a binding ends: a reservation the write never
//! consumed is released, a waiting stream open is cancelled, a matched stream closed.
//!
//! The binding is gone by then, so the host offers each one from an address of its own (the
//! hand-over actor, allocated when first needed) with a request id of its own, and keeps it
//! until it is answered:
//!
//! * the proxy re-drives a retraction until the directory acknowledges it (it never expires),
//!   so an offer the proxy took is answered once, by the directory: it is done;
//! * a full proxy refuses the offer at once (`LimitReached(PendingRequests)`, or `RequestIds`)
//!   and nothing of it reaches the directory: the host offers it again a retry period later,
//!   until the proxy takes it (found by the swarm, seed 1567: a proxy that restarted full
//!   refused the cancel of a stream open its predecessor had sent, and the open waited at the
//!   directory for ever);
//! * a proxy restart loses every offer it held: the host offers them all again.
//!
//! At most [`HOST_HANDED_OVER_MAX`] are kept; past it the oldest is forgotten. The host also
//! remembers as many answered ones, so a retraction is offered once: both endpoints of one
//! stream on this host close the same rendezvous.

use std::collections::{BTreeMap, VecDeque};

use super::Host;
use crate::effect::Outbox;
use crate::ids::{Address, RequestId};
use crate::limits::HOST_HANDED_OVER_MAX;
use crate::time::{Duration, Instant};
use crate::wire::{DirectoryCall, DirectoryReply, DirectoryRequest, Message};

/// How long a retraction a full proxy refused waits before it is offered again.
pub const HANDOVER_RETRY: Duration = Duration::from_secs(1);

/// The retractions handed over and not yet answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Handovers {
    /// The actor whose address the offers are made from.
    actor: Option<u64>,
    /// Offered to the proxy, by the request id of the offer (ids rise, so the first is the
    /// oldest offer).
    offered: BTreeMap<u64, DirectoryRequest>,
    /// Refused by a full proxy, oldest first: offered again at `retry_at`.
    refused: VecDeque<DirectoryRequest>,
    retry_at: Option<Instant>,
    /// Answered, oldest first (only so an equal retraction is not offered again).
    answered: VecDeque<DirectoryRequest>,
    next_id: u64,
}

impl Handovers {
    fn len(&self) -> usize {
        self.offered.len() + self.refused.len()
    }

    fn holds(&self, request: &DirectoryRequest) -> bool {
        self.offered.values().any(|r| r == request)
            || self.refused.contains(request)
            || self.answered.contains(request)
    }

    /// Makes room for one more, forgetting the oldest offer (or refusal) past the limit.
    fn make_room(&mut self) {
        while self.len() >= HOST_HANDED_OVER_MAX {
            if self.offered.pop_first().is_none() {
                self.refused.pop_front();
            }
        }
    }
}

impl Host {
    /// The address the host's retraction offers are made from (an actor of its own, so the
    /// drivers route the answers to the host).
    fn handover_address(&mut self) -> Address {
        let actor = match self.handovers.actor {
            Some(actor) => actor,
            None => {
                let actor = self.allocate_actor();
                self.handovers.actor = Some(actor);
                actor
            }
        };
        self.address(actor)
    }

    /// Whether `actor` receives the answers to retraction offers.
    pub(super) fn is_handover_actor(&self, actor: u64) -> bool {
        self.handovers.actor == Some(actor)
    }

    /// Hands `retraction` to the proxy, which re-drives it until the directory answers; kept
    /// until then (see the module documentation). Offered once.
    pub(super) fn hand_over(&mut self, retraction: DirectoryRequest, out: &mut Outbox) {
        if self.handovers.holds(&retraction) {
            return;
        }
        self.handovers.make_room();
        self.offer(retraction, out);
    }

    fn offer(&mut self, retraction: DirectoryRequest, out: &mut Outbox) {
        let reply_to = self.handover_address();
        let h = &mut self.handovers;
        h.next_id += 1;
        let id = h.next_id;
        h.offered.insert(id, retraction.clone());
        let call = DirectoryCall {
            request_id: RequestId(id),
            reply_to,
            request: retraction,
        };
        out.send(self.config.proxy, Message::ProxyCall(call));
    }

    /// An answer to an offer: the directory's (done), or a full proxy's refusal (offered again
    /// a retry period later).
    pub(super) fn handover_reply(&mut self, now: Instant, reply: &DirectoryReply) {
        let h = &mut self.handovers;
        let Some(retraction) = h.offered.remove(&reply.request_id.0) else {
            // A duplicate, or an offer to a proxy that restarted since.
            return;
        };
        if super::is_unknown_outcome(reply.body.err()) {
            h.refused.push_back(retraction);
            h.retry_at.get_or_insert(now.saturating_add(HANDOVER_RETRY));
        } else {
            if h.answered.len() >= HOST_HANDED_OVER_MAX {
                h.answered.pop_front();
            }
            h.answered.push_back(retraction);
        }
    }

    /// When refused retractions are offered again, if any wait.
    pub(super) fn handover_retry_at(&self) -> Option<Instant> {
        self.handovers.retry_at
    }

    /// On the tick: offers the refused retractions again once their wait is over.
    pub(super) fn retry_handovers(&mut self, now: Instant, out: &mut Outbox) {
        if self.handovers.retry_at.is_none_or(|at| now < at) {
            return;
        }
        self.handovers.retry_at = None;
        let refused = std::mem::take(&mut self.handovers.refused);
        for retraction in refused {
            self.offer(retraction, out);
        }
    }

    /// The proxy restarted and lost every offer it held: all are offered again.
    pub(super) fn handovers_proxy_restarted(&mut self, out: &mut Outbox) {
        let h = &mut self.handovers;
        h.retry_at = None;
        let mut all: Vec<DirectoryRequest> = std::mem::take(&mut h.offered).into_values().collect();
        all.extend(std::mem::take(&mut h.refused));
        for retraction in all {
            self.offer(retraction, out);
        }
    }

    /// The hand-over table's own rules: bounded, a wait armed exactly while a refusal waits,
    /// no retraction kept twice, every offer's id below the next.
    pub(super) fn check_handovers(&self) -> Result<(), String> {
        let h = &self.handovers;
        if h.len() > HOST_HANDED_OVER_MAX || h.answered.len() > HOST_HANDED_OVER_MAX {
            return Err(format!(
                "{} retractions handed over, {} answered (limit {HOST_HANDED_OVER_MAX} each)",
                h.len(),
                h.answered.len()
            ));
        }
        if h.retry_at.is_some() == h.refused.is_empty() {
            return Err(format!(
                "{} refused retractions, retry {:?}",
                h.refused.len(),
                h.retry_at
            ));
        }
        if h.offered
            .last_key_value()
            .is_some_and(|(id, _)| *id > h.next_id)
        {
            return Err("an offer's id is above the next id".to_string());
        }
        // Pairwise, so only while the table is small (requests have no order).
        if h.len() <= 64 {
            let all: Vec<&DirectoryRequest> = h.offered.values().chain(&h.refused).collect();
            if all
                .iter()
                .enumerate()
                .any(|(i, a)| all[i + 1..].contains(a))
            {
                return Err("a retraction is handed over twice".to_string());
            }
        }
        Ok(())
    }

    /// The actor the host's retraction offers are made from, once it made one.
    pub fn handover_actor(&self) -> Option<u64> {
        self.handovers.actor
    }

    /// How many retractions are handed over and not yet answered.
    pub fn handovers_pending(&self) -> usize {
        self.handovers.len()
    }
}

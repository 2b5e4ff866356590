//! The node agent (DESIGN Q5/Q8): the long-lived responder of a node, one per incarnation.
//!
//! It does two things, the same way in `dataplane-node` and in the simulator:
//!
//! * **Gone reports.** A node that restarted tells the directory that every address of its
//!   earlier incarnations is gone (`AddressGone{NodeBefore}`); a driver may also report one
//!   actor that stopped (`AddressGone{Address}`). Each report is re-sent every
//!   [`AgentConfig::period`] until the directory acknowledges it (`GoneAcknowledged`), so a
//!   lost frame, a partition or a directory restart only delays it.
//! * **Answers for the dead.** [`acknowledgement`] is the reply a frame for an actor that no
//!   longer exists gets: the directory re-sends `Retire` and `Displaced` until it sees them
//!   acknowledged, and a transfer toward a gone source must be refused, not left to time out.
//!
//! Driving contract: [`Agent::boot`] once per incarnation, [`Agent::handle_message`] for every
//! frame to the agent's address, [`Agent::handle_timer`] when [`Timer::AgentTick`] fires; the
//! agent appends `Send` and timer effects to the caller's [`Outbox`].

use crate::effect::{Effect, Outbox, Timer};
use crate::error::InputError;
use crate::ids::Address;
use crate::limits::AGENT_REPORTS_MAX;
use crate::time::{Duration, Instant};
use crate::wire::{ChunkRefusal, GoneScope, Message};

/// How an agent is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// The agent's own address (its node and incarnation; acknowledgements come back here).
    pub address: Address,
    /// Where gone reports go.
    pub directory: Address,
    /// How often unacknowledged reports are re-sent.
    pub period: Duration,
}

/// The node agent of one incarnation. See the module documentation.
#[derive(Clone, Debug)]
pub struct Agent {
    config: AgentConfig,
    /// Reports not yet acknowledged, oldest first (at most [`AGENT_REPORTS_MAX`]).
    pending: Vec<GoneScope>,
    /// When the re-send tick is due, while reports wait.
    tick_at: Option<Instant>,
}

impl Agent {
    /// The agent of a node's incarnation. After a restart (incarnation above 1) it reports the
    /// earlier incarnations gone at once.
    pub fn boot(config: AgentConfig, now: Instant, out: &mut Outbox) -> Agent {
        let mut agent = Agent {
            config,
            pending: Vec::new(),
            tick_at: None,
        };
        if config.address.incarnation > 1 {
            agent.report(
                now,
                GoneScope::NodeBefore {
                    node: config.address.node,
                    incarnation: config.address.incarnation,
                },
                out,
            );
        }
        agent
    }

    /// Reports `scope` gone (sent now, and re-sent until acknowledged). A scope already waiting
    /// is not added twice. When [`AGENT_REPORTS_MAX`] reports wait, the new one is dropped and
    /// `false` comes back: nothing is lost by it, only delayed, because the directory's own
    /// re-sends toward a gone address are answered by [`acknowledgement`].
    pub fn report(&mut self, now: Instant, scope: GoneScope, out: &mut Outbox) -> bool {
        if self.pending.contains(&scope) {
            return true;
        }
        if self.pending.len() >= AGENT_REPORTS_MAX {
            return false;
        }
        self.pending.push(scope);
        self.send(scope, out);
        if self.tick_at.is_none() {
            let at = now.saturating_add(self.config.period);
            self.tick_at = Some(at);
            out.push(Effect::SetTimer {
                timer: Timer::AgentTick,
                at,
            });
        }
        true
    }

    /// A frame to the agent's address. Only `GoneAcknowledged` is the agent's; an
    /// acknowledgement of a scope no longer waiting (a duplicate) changes nothing.
    pub fn handle_message(
        &mut self,
        message: &Message,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        let Message::GoneAcknowledged { scope } = message else {
            return Err(InputError::UnexpectedMessage("a frame for the node agent"));
        };
        self.pending.retain(|s| s != scope);
        if self.pending.is_empty() && self.tick_at.take().is_some() {
            out.push(Effect::CancelTimer {
                timer: Timer::AgentTick,
            });
        }
        Ok(())
    }

    /// [`Timer::AgentTick`] fired: every report still waiting is sent again. A tick that is
    /// not due yet (a stale timer of the driver) changes nothing.
    pub fn handle_timer(
        &mut self,
        now: Instant,
        timer: Timer,
        out: &mut Outbox,
    ) -> Result<(), InputError> {
        if timer != Timer::AgentTick {
            return Err(InputError::UnexpectedTimer(timer));
        }
        let Some(due) = self.tick_at else {
            return Ok(());
        };
        if now < due {
            return Ok(());
        }
        for i in 0..self.pending.len() {
            let scope = self.pending[i];
            self.send(scope, out);
        }
        let at = now.saturating_add(self.config.period);
        self.tick_at = Some(at);
        out.push(Effect::SetTimer {
            timer: Timer::AgentTick,
            at,
        });
        Ok(())
    }

    /// Reports not yet acknowledged, oldest first.
    pub fn pending(&self) -> &[GoneScope] {
        &self.pending
    }

    /// When the re-send tick is due, while reports wait.
    pub fn next_tick(&self) -> Option<Instant> {
        self.tick_at
    }

    /// The agent's address.
    pub fn address(&self) -> Address {
        self.config.address
    }

    fn send(&self, scope: GoneScope, out: &mut Outbox) {
        out.send(
            self.config.directory,
            Message::AddressGone {
                scope,
                reply_to: self.config.address,
            },
        );
    }
}

/// The reply a frame for `to`, an actor that no longer exists, gets from a node whose current
/// incarnation is `incarnation`: the acknowledgement the directory re-sends `Retire` and
/// `Displaced` until it sees, and a refusal for a transfer (`IncarnationEnded` for an actor of
/// an earlier incarnation, whose bytes died with it; `Retired` for one of this incarnation).
/// Every other frame gets no answer (`None`).
pub fn acknowledgement(
    incarnation: u64,
    to: Address,
    message: &Message,
) -> Option<(Address, Message)> {
    match message {
        Message::Retire { reply_to } => Some((*reply_to, Message::SourceRetired { source: to })),
        Message::Displaced {
            incarnation: stream,
            reply_to,
        } => Some((
            *reply_to,
            Message::StreamDisplaced {
                endpoint: to,
                incarnation: *stream,
            },
        )),
        Message::ChunkRequest { reply_to, .. } => {
            let reason = if to.incarnation < incarnation {
                ChunkRefusal::IncarnationEnded
            } else {
                ChunkRefusal::Retired
            };
            Some((*reply_to, Message::ChunkRefused { reason }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;

    fn config(incarnation: u64) -> AgentConfig {
        AgentConfig {
            address: Address::new(NodeId(3), incarnation, 0),
            directory: Address::new(NodeId(0), 0, 0),
            period: Duration::from_secs(1),
        }
    }

    fn at(secs: u64) -> Instant {
        Instant::ZERO.saturating_add(Duration::from_secs(secs))
    }

    fn gone_sent(out: &mut Outbox) -> Vec<GoneScope> {
        out.take()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send {
                    message: Message::AddressGone { scope, reply_to },
                    to,
                } => {
                    assert_eq!(to, Address::new(NodeId(0), 0, 0));
                    assert_eq!(reply_to.node, NodeId(3));
                    Some(scope)
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_first_boot_reports_nothing() {
        let mut out = Outbox::new();
        let agent = Agent::boot(config(1), at(0), &mut out);
        assert!(out.is_empty());
        assert!(agent.pending().is_empty());
        assert_eq!(agent.next_tick(), None);
    }

    #[test]
    fn a_restart_reports_the_earlier_incarnations_until_acknowledged() {
        let mut out = Outbox::new();
        let mut agent = Agent::boot(config(4), at(0), &mut out);
        let before = GoneScope::NodeBefore {
            node: NodeId(3),
            incarnation: 4,
        };
        assert!(out.effects().contains(&Effect::SetTimer {
            timer: Timer::AgentTick,
            at: at(1)
        }));
        assert_eq!(gone_sent(&mut out), vec![before]);
        // Not due yet: nothing.
        agent
            .handle_timer(at(0), Timer::AgentTick, &mut out)
            .unwrap();
        assert!(out.is_empty());
        // Every period until acknowledged.
        for t in 1..4 {
            agent
                .handle_timer(at(t), Timer::AgentTick, &mut out)
                .unwrap();
            assert!(out.effects().contains(&Effect::SetTimer {
                timer: Timer::AgentTick,
                at: at(t + 1)
            }));
            assert_eq!(gone_sent(&mut out), vec![before]);
        }
        // An acknowledgement of something else changes nothing.
        let other = GoneScope::Address(Address::new(NodeId(3), 4, 9));
        agent
            .handle_message(&Message::GoneAcknowledged { scope: other }, &mut out)
            .unwrap();
        assert_eq!(agent.pending(), &[before]);
        agent
            .handle_message(&Message::GoneAcknowledged { scope: before }, &mut out)
            .unwrap();
        assert!(agent.pending().is_empty());
        assert_eq!(
            out.take(),
            vec![Effect::CancelTimer {
                timer: Timer::AgentTick
            }]
        );
        agent
            .handle_timer(at(9), Timer::AgentTick, &mut out)
            .unwrap();
        assert!(out.is_empty(), "nothing is re-sent once acknowledged");
        assert!(
            agent
                .handle_message(&Message::GoneAcknowledged { scope: before }, &mut out)
                .is_ok()
                && out.is_empty(),
            "a duplicate acknowledgement changes nothing"
        );
    }

    #[test]
    fn reports_are_bounded_and_not_repeated() {
        let mut out = Outbox::new();
        let mut agent = Agent::boot(config(1), at(0), &mut out);
        for actor in 0..AGENT_REPORTS_MAX as u64 {
            let scope = GoneScope::Address(Address::new(NodeId(3), 1, 1_000 + actor));
            assert!(agent.report(at(0), scope, &mut out));
            assert!(agent.report(at(0), scope, &mut out), "a repeat is accepted");
        }
        assert_eq!(agent.pending().len(), AGENT_REPORTS_MAX);
        let one_more = GoneScope::Address(Address::new(NodeId(3), 1, 1));
        assert!(!agent.report(at(0), one_more, &mut out));
        assert_eq!(agent.pending().len(), AGENT_REPORTS_MAX);
        let sent = gone_sent(&mut out);
        assert_eq!(sent.len(), AGENT_REPORTS_MAX, "each report is sent once");
    }

    #[test]
    fn other_frames_and_timers_are_typed_errors() {
        let mut out = Outbox::new();
        let mut agent = Agent::boot(config(2), at(0), &mut out);
        out.take();
        assert!(
            agent
                .handle_message(
                    &Message::Retire {
                        reply_to: agent.address()
                    },
                    &mut out
                )
                .is_err()
        );
        assert!(
            agent
                .handle_timer(at(5), Timer::HostTick, &mut out)
                .is_err()
        );
        assert!(out.is_empty());
        assert_eq!(agent.pending().len(), 1);
    }

    #[test]
    fn the_dead_are_answered() {
        let me = Address::new(NodeId(3), 5, 1_200);
        let reply_to = Address::new(NodeId(0), 0, 0);
        let older = Address::new(NodeId(3), 4, 1_200);
        assert_eq!(
            acknowledgement(5, me, &Message::Retire { reply_to }),
            Some((reply_to, Message::SourceRetired { source: me }))
        );
        let chunk = |to| {
            acknowledgement(
                5,
                to,
                &Message::ChunkRequest {
                    offset: 0,
                    len: 1,
                    reply_to,
                },
            )
        };
        assert_eq!(
            chunk(older),
            Some((
                reply_to,
                Message::ChunkRefused {
                    reason: ChunkRefusal::IncarnationEnded
                }
            ))
        );
        assert_eq!(
            chunk(me),
            Some((
                reply_to,
                Message::ChunkRefused {
                    reason: ChunkRefusal::Retired
                }
            ))
        );
        assert_eq!(
            acknowledgement(
                5,
                me,
                &Message::GoneAcknowledged {
                    scope: GoneScope::Address(me)
                }
            ),
            None
        );
    }
}

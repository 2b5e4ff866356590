//! Acknowledgements judged by what they promise (issue 52): when the directory lets a reply or
//! a notice go, what the message says must already be on the disk. The barrier check
//! (`release_checked`) follows the order of the effects: an effect may leave once the records
//! emitted *before* it are durable, so a reply placed before its own step's record passes it.
//! This check does not depend on that order: it keeps its own account of what the durable
//! records say, and judges each message by its content.
//!
//! The account: every record the directory hands to the log, summarized as it is appended
//! (the highest revision a `Committed` or `Joined` record names, each `NodeRestarted` floor),
//! per step; a step's facts count once the simulated disk's own record says the step's last
//! byte is durable (never the storage protocol's word), or once a crash kept the step (the
//! world decides which steps survive). Facts only grow: compactions restate them, and nothing
//! acknowledged may be lost.
//!
//! Promises checked when a message leaves the directory: a `Registered`, `Unregistered` or
//! `Renamed` receipt and a stream match name a revision the durable records reached; a
//! `GoneAcknowledged` for a node's earlier incarnations names a floor that is durable.

use dataplane_core::ids::Revision;
use dataplane_core::wire::{GoneScope, ReplyBody};

use super::*;

/// What a set of records says, as far as the messages' promises go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Facts {
    /// The highest revision a committed mutation or a join allocated.
    revision: Option<Revision>,
    /// Each node's incarnation floor.
    floors: BTreeMap<NodeId, u64>,
}

impl Facts {
    /// Adds what `record` says.
    pub fn record(&mut self, record: &LogRecord) {
        match record {
            LogRecord::Committed { revision, .. } | LogRecord::Joined { revision, .. } => {
                self.revision = self.revision.max(Some(*revision));
            }
            LogRecord::NodeRestarted { node, incarnation } => {
                let floor = self.floors.entry(*node).or_insert(0);
                *floor = (*floor).max(*incarnation);
            }
            _ => {}
        }
    }

    fn merge(&mut self, other: Facts) {
        self.revision = self.revision.max(other.revision);
        for (node, incarnation) in other.floors {
            let floor = self.floors.entry(node).or_insert(0);
            *floor = (*floor).max(incarnation);
        }
    }

    fn is_empty(&self) -> bool {
        *self == Facts::default()
    }
}

/// The world's account of the durable facts (see the module documentation).
#[derive(Clone, Debug, Default)]
pub(super) struct Promises {
    /// What the step being executed appended so far.
    pub current: Facts,
    /// Steps not known durable: (step, where its records end, what they say), in order.
    pending: VecDeque<(u64, usize, Facts)>,
    /// What the durable records say.
    durable: Facts,
}

impl Promises {
    /// The step ended: its facts are durable now (`durable`), or once the log is durable past
    /// `end`.
    pub fn end_step(&mut self, step: u64, end: usize, durable: bool) {
        let facts = std::mem::take(&mut self.current);
        if durable && self.pending.is_empty() {
            self.durable.merge(facts);
        } else if !facts.is_empty() || !self.pending.is_empty() {
            self.pending.push_back((step, end, facts));
        }
    }

    /// The simulated disk holds the log durably up to `durable` bytes: the steps that end
    /// there are durable.
    pub fn durable_to(&mut self, durable: usize) {
        while let Some((_, end, _)) = self.pending.front() {
            if *end > durable {
                return;
            }
            let (_, _, facts) = self.pending.pop_front().expect("a front");
            self.durable.merge(facts);
        }
    }

    /// A crash kept every step up to `surviving` and lost the others.
    pub fn crashed(&mut self, surviving: u64) {
        for (step, _, facts) in std::mem::take(&mut self.pending) {
            if step <= surviving {
                self.durable.merge(facts);
            }
        }
        self.current = Facts::default();
    }

    /// A new generation of the log starts (a compaction, written only when everything was
    /// durable): the offsets of the old one mean nothing any more.
    pub fn new_generation(&mut self) {
        for (_, _, facts) in std::mem::take(&mut self.pending) {
            self.durable.merge(facts);
        }
    }

    /// What `message` promises that the durable records do not hold, if anything.
    pub fn broken(&self, message: &Message) -> Option<String> {
        let revision = match message {
            Message::Reply(reply) => match &reply.body {
                ReplyBody::Registered(Ok(r))
                | ReplyBody::Unregistered(Ok(r))
                | ReplyBody::Renamed(Ok(r)) => Some(r.revision),
                ReplyBody::StreamOpened(Ok(m)) => Some(m.revision),
                _ => None,
            },
            Message::GoneAcknowledged {
                scope: GoneScope::NodeBefore { node, incarnation },
            } => {
                let floor = self.durable.floors.get(node).copied().unwrap_or(0);
                return (floor < *incarnation).then(|| {
                    format!(
                        "it acknowledges that {node}'s incarnations below {incarnation} are \
                         gone, but the durable floor of {node} is {floor}"
                    )
                });
            }
            _ => None,
        }?;
        (self.durable.revision < Some(revision)).then(|| {
            format!(
                "it names revision {revision}, but the durable records reach {}",
                self.durable
                    .revision
                    .map_or("no revision".to_owned(), |r| r.to_string())
            )
        })
    }
}

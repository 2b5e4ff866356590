//! The `Persist` barrier (DESIGN §3), as one piece both drivers run: an effect may be executed
//! only once every `Persist` before it is durable.
//!
//! A driver hands [`Barrier::admit`] the effects of each step in order, with a function that
//! appends a record to its log and returns the log's position after it. Effects that may go
//! at once come back; the rest wait, each with the position its last preceding record ends
//! at. When the driver's log is durable up to some position, [`Barrier::release`] gives back,
//! in order, the held effects it covers. Once anything waits, everything after it waits too
//! (effects leave in the order the machine emitted them). A crash drops whatever was held
//! ([`Barrier::clear`]): nobody saw it, and the recovered machine decides again.
//!
//! Group commit falls out: a driver may admit many steps' effects and sync once.

use std::collections::VecDeque;

use crate::effect::Effect;
use crate::log::LogRecord;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Barrier {
    /// Effects waiting, each with the log position that must be durable first.
    held: VecDeque<(u64, Effect)>,
    /// Where the last appended record ends.
    appended: u64,
}

impl Barrier {
    /// A barrier over a log that is durable up to `position` already (a recovered log).
    pub fn new(position: u64) -> Barrier {
        Barrier {
            held: VecDeque::new(),
            appended: position,
        }
    }

    /// The effects of one step, in order. Each `Persist` goes to `append`, which writes its
    /// record and returns the log position after it; every other effect comes back in `ready`
    /// if the log is durable up to `synced` past every record before it and nothing waits
    /// ahead of it, and waits otherwise. An `append` error stops the step there (the driver
    /// fails stop): the records and effects after it are dropped.
    pub fn admit<E>(
        &mut self,
        effects: impl IntoIterator<Item = Effect>,
        synced: u64,
        mut append: impl FnMut(&LogRecord) -> Result<u64, E>,
        ready: &mut Vec<Effect>,
    ) -> Result<(), E> {
        for effect in effects {
            match effect {
                Effect::Persist(record) => {
                    self.appended = append(&record)?;
                }
                other if self.held.is_empty() && synced >= self.appended => ready.push(other),
                other => self.held.push_back((self.appended, other)),
            }
        }
        Ok(())
    }

    /// The log is durable up to `synced`: the held effects it covers come back in `ready`, in
    /// order.
    pub fn release(&mut self, synced: u64, ready: &mut Vec<Effect>) {
        while self.held.front().is_some_and(|(at, _)| *at <= synced) {
            if let Some((_, effect)) = self.held.pop_front() {
                ready.push(effect);
            }
        }
    }

    /// Effects admitted from now on wait until the log is durable up to `position`, as if a
    /// record ended there: for a log whose entries need not carry records (a replicated
    /// directory proposes an entry for a step that only answers, and its answers wait for that
    /// entry, issue 19). A position below the last appended one changes nothing.
    pub fn wait_for(&mut self, position: u64) {
        self.appended = self.appended.max(position);
    }

    /// The position the first held effect waits for, if one waits.
    pub fn first_held(&self) -> Option<u64> {
        self.held.front().map(|(at, _)| *at)
    }

    /// Whether effects wait for a sync.
    pub fn waiting(&self) -> bool {
        !self.held.is_empty()
    }

    /// Where the last appended record ends: a sync up to here releases everything.
    pub fn appended(&self) -> u64 {
        self.appended
    }

    /// The node crashed: what was held is dropped. The log is durable up to `position` (the
    /// recovered log's end).
    pub fn clear(&mut self, position: u64) {
        self.held.clear();
        self.appended = position;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effect::Timer;
    use crate::ids::{Address, AuthorityEpoch, NodeId};
    use crate::time::Instant;

    fn timer(n: u64) -> Effect {
        Effect::SetTimer {
            timer: Timer::DirectoryRetry,
            at: Instant::ZERO.saturating_add(crate::time::Duration::from_nanos(n)),
        }
    }

    fn persist() -> Effect {
        Effect::Persist(LogRecord::EpochAdvanced {
            epoch: AuthorityEpoch(1),
        })
    }

    fn watch(n: u64) -> Effect {
        Effect::WatchRoute {
            target: Address::new(NodeId(n), 1, 0),
        }
    }

    #[test]
    fn nothing_passes_a_persist_before_it_is_durable_and_order_is_kept() {
        let mut barrier = Barrier::new(0);
        let mut log_end = 0u64;
        let mut ready = Vec::new();
        let mut append = |_: &LogRecord| -> Result<u64, ()> {
            log_end += 10;
            Ok(log_end)
        };
        barrier
            .admit([timer(1), persist(), timer(2)], 0, &mut append, &mut ready)
            .unwrap();
        assert_eq!(ready, vec![timer(1)], "before the record: at once");
        // A later step with no record still waits behind the held effect (order).
        ready.clear();
        barrier
            .admit([watch(3)], 0, &mut append, &mut ready)
            .unwrap();
        assert!(ready.is_empty());
        barrier
            .admit([persist(), timer(4)], 0, &mut append, &mut ready)
            .unwrap();
        // Durable up to the first record: its followers go, not the second record's.
        barrier.release(10, &mut ready);
        assert_eq!(ready, vec![timer(2), watch(3)]);
        assert!(barrier.waiting());
        ready.clear();
        barrier.release(20, &mut ready);
        assert_eq!(ready, vec![timer(4)]);
        assert!(!barrier.waiting());
        // With everything durable, effects go at once again.
        ready.clear();
        barrier
            .admit([timer(5)], 20, &mut append, &mut ready)
            .unwrap();
        assert_eq!(ready, vec![timer(5)]);
        // A crash drops what waits.
        ready.clear();
        barrier
            .admit([persist(), timer(6)], 20, &mut append, &mut ready)
            .unwrap();
        barrier.clear(20);
        barrier.release(1_000, &mut ready);
        assert!(ready.is_empty());
    }
}

//! Effects: what a machine asks its driver to do, as data (STYLE.md rule 4).
//!
//! A machine appends effects to a caller-owned [`Outbox`] in the order they must happen. The
//! driver executes them in that order, with one rule: **`Persist` is a write-ahead barrier**. An
//! effect may be executed only after every `Persist` before it (in this step or an earlier one)
//! is durable. If a persist cannot be made durable the driver stops the node and recovers it
//! from its durable log (fail-stop); the machine has no storage error path.

use serde::{Deserialize, Serialize};

pub use crate::kinds::Timer;

use crate::ids::Address;
use crate::log::LogRecord;
use crate::time::Instant;
use crate::wire::Message;

/// One thing the driver must do.
#[must_use = "effects must be executed by the driver"]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// Send `message` to `to`, at most once (it may be lost).
    Send {
        /// The recipient.
        to: Address,
        /// What to send.
        message: Message,
    },
    /// Make `record` durable before executing any later effect.
    Persist(LogRecord),
    /// Call the machine's `handle_timer(timer)` at `at` (replacing an earlier deadline).
    SetTimer {
        /// Which timer.
        timer: Timer,
        /// When it fires.
        at: Instant,
    },
    /// Forget the timer's deadline.
    CancelTimer {
        /// Which timer.
        timer: Timer,
    },
    /// Report route changes of `target` through `handle_route` (an initial observation is
    /// welcome) until `UnwatchRoute`.
    WatchRoute {
        /// The address to watch.
        target: Address,
    },
    /// Stop reporting route changes of `target`.
    UnwatchRoute {
        /// The address no longer watched.
        target: Address,
    },
}

/// The caller-owned list of effects a step produced, in execution order.
#[derive(Debug, Default)]
pub struct Outbox {
    effects: Vec<Effect>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Outbox::default()
    }

    /// Appends an effect.
    pub fn push(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// The effects so far.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// Removes and returns every effect, in order.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }

    /// Takes the effects, leaving the outbox empty.
    pub fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Hands an emptied buffer back so the next steps reuse its capacity instead of
    /// allocating (a driver's `take`, execute, `recycle` loop allocates nothing in steady state).
    pub fn recycle(&mut self, mut buffer: Vec<Effect>) {
        buffer.clear();
        if self.effects.is_empty() && buffer.capacity() > self.effects.capacity() {
            self.effects = buffer;
        }
    }

    /// How many effects are waiting.
    pub fn len(&self) -> usize {
        self.effects.len()
    }

    /// Whether no effect is waiting.
    pub fn is_empty(&self) -> bool {
        self.effects.is_empty()
    }

    pub(crate) fn send(&mut self, to: Address, message: Message) {
        self.effects.push(Effect::Send { to, message });
    }
}

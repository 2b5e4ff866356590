//! A directory driven in memory, with its persisted records kept as the durable log (every
//! `Persist` is taken as durable at once). Copied from `core/tests/common/mod.rs`.

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::ids::{Address, NodeId, RequestId};
use dataplane_core::log::LogRecord;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{DirectoryCall, DirectoryRequest, Message};

/// Node 0 hosts the directory; clients live on node 1; sources and endpoints on nodes 2+.
pub const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
/// The caller of [`Dir::call_raw`].
pub const CLIENT: Address = Address::new(NodeId(1), 1, 0);

/// The configuration every harness directory runs with.
pub fn config() -> DirectoryConfig {
    DirectoryConfig {
        address: DIRECTORY,
        retry_period: Duration::from_secs(1),
    }
}

/// A directory under test plus its durable log.
pub struct Dir {
    pub dir: Directory,
    pub log: Vec<LogRecord>,
    pub now: Instant,
    next_request: u64,
}

impl Dir {
    pub fn new() -> Self {
        let mut log = Vec::new();
        let (dir, _) = Self::boot(&mut log, Instant::ZERO);
        Dir {
            dir,
            log,
            now: Instant::ZERO,
            next_request: 1,
        }
    }

    fn boot(log: &mut Vec<LogRecord>, now: Instant) -> (Directory, Vec<Effect>) {
        let mut out = Outbox::new();
        let config = DirectoryConfig {
            address: DIRECTORY,
            retry_period: Duration::from_secs(1),
        };
        let dir = Directory::recover(config, log, &mut ActorSources, now, &mut out)
            .expect("recovery of the test log");
        let effects = out.take();
        Self::keep_records(log, &effects);
        (dir, effects)
    }

    fn keep_records(log: &mut Vec<LogRecord>, effects: &[Effect]) {
        for effect in effects {
            if let Effect::Persist(record) = effect {
                log.push(record.clone());
            }
        }
    }

    /// Simulates a crash and restart from the durable log; returns the recovery effects.
    pub fn restart(&mut self) -> Vec<Effect> {
        let (dir, effects) = Self::boot(&mut self.log, self.now);
        self.dir = dir;
        effects
    }

    /// Delivers a message; returns every effect it produced (records are kept in `log`).
    pub fn deliver(&mut self, message: Message) -> Vec<Effect> {
        let mut out = Outbox::new();
        self.dir
            .handle_message(self.now, message, &mut out)
            .expect("directory input");
        let effects = out.take();
        Self::keep_records(&mut self.log, &effects);
        self.dir.check_invariants().expect("directory invariants");
        effects
    }

    /// Advances time to the next tick and fires it.
    pub fn tick(&mut self) -> Vec<Effect> {
        self.now = self.now.saturating_add(Duration::from_secs(1));
        let mut out = Outbox::new();
        self.dir
            .handle_timer(self.now, Timer::DirectoryRetry, &mut out)
            .unwrap();
        let effects = out.take();
        Self::keep_records(&mut self.log, &effects);
        self.dir.check_invariants().expect("directory invariants");
        effects
    }

    /// A route report for a watched target.
    pub fn route(&mut self, target: Address, routable: bool) -> Vec<Effect> {
        let mut out = Outbox::new();
        self.dir.handle_route(self.now, target, routable, &mut out);
        let effects = out.take();
        Self::keep_records(&mut self.log, &effects);
        self.dir.check_invariants().expect("directory invariants");
        effects
    }

    /// Sends `request` from CLIENT with a fresh request id; returns (request id, effects).
    pub fn call_raw(&mut self, request: DirectoryRequest) -> (RequestId, Vec<Effect>) {
        let request_id = RequestId(self.next_request);
        self.next_request += 1;
        let call = DirectoryCall {
            request_id,
            reply_to: CLIENT,
            request,
        };
        (request_id, self.deliver(Message::Call(call)))
    }
}

impl Default for Dir {
    fn default() -> Self {
        Dir::new()
    }
}

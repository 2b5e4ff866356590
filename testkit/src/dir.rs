//! A directory driven in memory, with its persisted records kept as the durable log (every
//! `Persist` is taken as durable at once), and helpers to build requests and read effects.
//!
//! Every input goes through the real `Directory`; after each message, tick, route report and
//! restart the harness checks the directory's own invariants (a panic if they fail, as for a
//! refused input: both are programmer errors of the directory or of the test).

use dataplane_core::directory::{ActorSources, Directory, DirectoryConfig, DirectoryLimits};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::log::LogRecord;
use dataplane_core::path::DataPath;
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, Message, ReplyBody,
    SourceRecovery, StreamRole,
};

/// Node 0 hosts the directory; clients live on node 1; sources and endpoints on nodes 2+.
pub const DIRECTORY: Address = Address::new(NodeId(0), 1, 0);
/// The caller of [`Dir::call_raw`].
pub const CLIENT: Address = Address::new(NodeId(1), 1, 0);

/// The configuration every harness directory runs with (default limits).
pub fn config() -> DirectoryConfig {
    DirectoryConfig {
        address: DIRECTORY,
        retry_period: Duration::from_secs(1),
        limits: Default::default(),
    }
}

/// Actor `actor` of incarnation 1 on `node`.
pub fn addr(node: u64, actor: u64) -> Address {
    Address::new(NodeId(node), 1, actor)
}

/// `s` as a path (panics if it is not one).
pub fn path(s: &str) -> DataPath {
    DataPath::new(s).unwrap()
}

/// Operation id `n`.
pub fn op(n: u128) -> OperationId {
    OperationId(n)
}

/// The recovery record of a blob whose source is the actor `source` itself.
pub fn actor_recovery(source: Address) -> SourceRecovery {
    SourceRecovery::Actor {
        actor: source,
        node: source.node,
        owner: None,
    }
}

/// A directory under test plus its durable log.
#[derive(Debug)]
pub struct Dir {
    /// The directory.
    pub dir: Directory,
    /// Every record it persisted, in order (recovery reads it back on [`Dir::restart`]).
    pub log: Vec<LogRecord>,
    /// The time of the next input; only [`Dir::tick`] advances it.
    pub now: Instant,
    next_request: u64,
    config: DirectoryConfig,
}

impl Dir {
    /// A directory recovered from an empty log (its first `EpochAdvanced` is in `log`).
    pub fn new() -> Self {
        Self::with_limits(DirectoryLimits::default())
    }

    /// [`Dir::new`] with tables bounded by `limits`.
    pub fn with_limits(limits: DirectoryLimits) -> Self {
        let config = DirectoryConfig { limits, ..config() };
        let mut log = Vec::new();
        let (dir, _) = Self::boot(&config, &mut log, Instant::ZERO);
        Dir {
            dir,
            log,
            now: Instant::ZERO,
            next_request: 1,
            config,
        }
    }

    fn boot(
        config: &DirectoryConfig,
        log: &mut Vec<LogRecord>,
        now: Instant,
    ) -> (Directory, Vec<Effect>) {
        let mut out = Outbox::new();
        let dir = Directory::recover(config.clone(), log, &mut ActorSources, now, &mut out)
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
        let (dir, effects) = Self::boot(&self.config, &mut self.log, self.now);
        self.dir = dir;
        self.dir.check_invariants().expect("directory invariants");
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

    /// Sends `request` and returns the one reply addressed to CLIENT with its request id.
    pub fn call(&mut self, request: DirectoryRequest) -> ReplyBody {
        let (id, effects) = self.call_raw(request);
        reply_to(&effects, CLIENT, id).unwrap_or_else(|| panic!("no reply in {effects:#?}"))
    }

    /// Registers a 10-byte blob at `p` served by the actor `source`.
    pub fn register(&mut self, p: &str, source: Address, operation: u128) -> ReplyBody {
        self.call(DirectoryRequest::Register {
            path: path(p),
            source,
            source_node: source.node,
            length: 10,
            recovery: actor_recovery(source),
            operation: op(operation),
            reservation: None,
        })
    }

    /// Unregisters `p` (no expected revision).
    pub fn unregister(&mut self, p: &str, operation: u128) -> ReplyBody {
        self.call(DirectoryRequest::Unregister {
            path: path(p),
            expected_revision: None,
            operation: op(operation),
        })
    }

    /// Looks `p` up.
    pub fn lookup(&mut self, p: &str) -> ReplyBody {
        self.call(DirectoryRequest::Lookup { path: path(p) })
    }

    /// Resolves `p` to its blob binding.
    pub fn resolve(&mut self, p: &str) -> ReplyBody {
        self.call(DirectoryRequest::Resolve { path: path(p) })
    }

    /// An ensure open (no replace) of `role` by `endpoint`; returns (request id, effects).
    pub fn open(
        &mut self,
        p: &str,
        role: StreamRole,
        endpoint: Address,
        operation: u128,
    ) -> (RequestId, Vec<Effect>) {
        self.call_raw(open_request(
            p, role, endpoint, operation, false, true, None,
        ))
    }

    /// The directory's authority epoch.
    pub fn epoch(&self) -> AuthorityEpoch {
        self.dir.epoch()
    }

    /// The incarnation of `revision` in the current epoch.
    pub fn incarnation(&self, revision: u64) -> StreamIncarnation {
        StreamIncarnation {
            epoch: self.dir.epoch(),
            revision: Revision(revision),
        }
    }
}

impl Default for Dir {
    fn default() -> Self {
        Dir::new()
    }
}

/// An OpenStream of `role` at `p` by `endpoint` (its descriptor is the endpoint's actor id).
pub fn open_request(
    p: &str,
    role: StreamRole,
    endpoint: Address,
    operation: u128,
    replace: bool,
    ensure: bool,
    expected_revision: Option<Revision>,
) -> DirectoryRequest {
    DirectoryRequest::OpenStream {
        path: path(p),
        role,
        descriptor: Descriptor::new(vec![endpoint.actor as u8]).unwrap(),
        endpoint,
        replace,
        ensure,
        expected_revision,
        operation: op(operation),
    }
}

/// The reply in `effects` sent to `to` for `request_id`, if any.
pub fn reply_to(effects: &[Effect], to: Address, request_id: RequestId) -> Option<ReplyBody> {
    effects.iter().find_map(|e| match e {
        Effect::Send {
            to: t,
            message:
                Message::Reply(DirectoryReply {
                    request_id: id,
                    body,
                    ..
                }),
        } if *t == to && *id == request_id => Some(body.clone()),
        _ => None,
    })
}

/// Every Send in `effects` as (recipient, message).
pub fn sends(effects: &[Effect]) -> Vec<(Address, Message)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send { to, message } => Some((*to, message.clone())),
            _ => None,
        })
        .collect()
}

/// Addresses that received a Retire in `effects`.
pub fn retires(effects: &[Effect]) -> Vec<Address> {
    sends(effects)
        .into_iter()
        .filter(|(_, m)| matches!(m, Message::Retire { .. }))
        .map(|(to, _)| to)
        .collect()
}

/// (endpoint, incarnation) of every Displaced notice in `effects`.
pub fn displaced(effects: &[Effect]) -> Vec<(Address, StreamIncarnation)> {
    sends(effects)
        .into_iter()
        .filter_map(|(to, m)| match m {
            Message::Displaced { incarnation, .. } => Some((to, incarnation)),
            _ => None,
        })
        .collect()
}

/// Every persisted record in `effects`.
pub fn persisted(effects: &[Effect]) -> Vec<LogRecord> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Persist(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

//! # dataplane-core
//!
//! The data plane of SPEC.md as pure, deterministic state machines ("messages in, effects
//! out"). This crate does no IO, reads no clock, spawns no thread and draws no random number;
//! a driver (the simulator in `dataplane-sim`, or the real adapter in `dataplane-io`) does all
//! of that on its behalf.
//!
//! ## The driving contract
//!
//! Every machine is a plain struct, driven the same way:
//!
//! 1. **Feed an input** through a `handle_*` method, passing `now` (a core [`Instant`]: the
//!    machine never reads a clock) and a caller-owned [`Outbox`].
//! 2. **Drain the effects** the call appended, and execute them *in order*:
//!    [`Effect::Send`] (at most once; frames may be lost), [`Effect::Persist`],
//!    [`Effect::SetTimer`]/[`Effect::CancelTimer`] and
//!    [`Effect::WatchRoute`]/[`Effect::UnwatchRoute`].
//! 3. **Honour the barrier**: an effect may be executed only once every `Persist` before it
//!    is durable, so no reply or notice ever leaves before the state it acknowledges is on
//!    disk. Records of many steps may share one sync (group commit) as long as the effects
//!    behind them wait.
//! 4. **Arm the timers** the effects asked for and call `handle_timer` when they fire.
//! 5. **Fail-stop on storage errors**: if a `Persist` cannot be made durable, drop the machine
//!    and rebuild it with `recover` from the durable log. Machines have no storage-error path.
//!
//! Bad input (a malformed frame, a bad path, an unknown operation reused) gets a typed error
//! and changes nothing; nothing here panics on input from a peer.
//!
//! ## Map
//!
//! * [`time`], [`ids`], [`path`], [`kinds`], [`error`], [`limits`]: the shared vocabulary.
//! * [`wire`]: every message and the one `encode`/`decode` pair.
//! * [`effect`]: effects, timers and the outbox.
//! * [`log`]: durable log records and their framing.
//! * [`storage`]: the storage protocol of the directory's log over a small file-system trait.
//! * [`directory`]: the namespace directory.
//! * [`proxy`]: the per-node namespace proxy between local callers and the directory.
//! * [`arena`]: the ring-lease allocator over a host's blob arena.
//! * [`blob`]: the 128-byte blob header on arena memory and its checks.
//!
//! ## Module order
//!
//! Modules import each other in one direction only, from the leaves up: `limits`, `time`,
//! `ids` and `arena` import nothing from the crate; [`kinds`] and [`path`] import `limits`;
//! [`error`] imports `ids`, `kinds` and `path` (never `wire` or `effect`); [`blob`] imports
//! `arena`, `error` and `kinds`; [`wire`] imports `error`, `ids`, `kinds`, `limits` and `path`;
//! [`log`] adds `wire`; [`effect`] imports `log` and `wire`; [`membership`] imports `log`; the
//! machines (`storage`, `barrier`, `routes`, `admission`, `agent`, `proxy`, `directory`,
//! `host`) come last. A type that a lower module needs from a higher one moves down to
//! `kinds` instead of closing a circle.

pub mod admission;
pub mod agent;
pub mod arena;
pub mod barrier;
pub mod blob;
pub mod conns;
pub mod directory;
pub mod effect;
pub mod error;
pub mod host;
pub mod ids;
pub mod kinds;
pub mod limits;
pub mod link;
pub mod log;
pub mod membership;
pub mod path;
pub mod proxy;
pub mod routes;
pub mod storage;
pub mod time;
pub mod wire;

pub use directory::{Directory, DirectoryConfig};
pub use effect::{Effect, Outbox, Timer};
pub use error::{DataPlaneError, NamespaceError, Reason};
pub use ids::{
    Address, AuthorityEpoch, Issuer, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
pub use path::{DataPath, JobContext, PathError};
pub use proxy::{Proxy, ProxyConfig};
pub use time::{Duration, Instant};

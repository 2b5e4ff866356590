//! # dataplane-io
//!
//! The thin real-IO adapter around the pure machines of `dataplane-core`: it owns the clocks,
//! the sockets, the files and the shared memory, and does exactly what the machines' effects
//! say, in order, holding back everything behind a `Persist` until the log is synced
//! (DESIGN §3).
//!
//! * [`log`] — the durable log: append + `fdatasync` with group commit, compaction to a snapshot
//!   with an atomic rename, recovery that cuts a torn tail and refuses damage to synced records
//!   (sync marks tell them apart), files that carry a format version and the data directory's
//!   id; a failed sync is fail-stop.
//! * [`frame`] — length-prefixed postcard frames with the core's size limit and typed errors.
//! * [`arena`] — the arena: `memmap2` over a `memfd`, passed to child processes over a Unix
//!   socket (`SCM_RIGHTS`), so payload bytes never travel through messages on one host.
//! * [`alloc`] — `malloc` settings that keep per-chunk buffers from costing page faults
//!   ([`alloc::tune_allocator`], called by `dataplane-node`; process-wide, so opt-in).
//! * [`net`] — one poll loop per node ([`net::Reactor`], on `mio`) with per-connection frame
//!   limits, and the nodes' link protocol with its challenge-response handshake.
//! * [`resolve`] — name lookups on threads of their own, so a slow DNS never stalls a node's
//!   poll loop.
//! * [`dirnode`], [`hostnode`] — the two node drivers; [`child`] — the library a child links.
//! * [`replica_log`] — a replica of the replicated directory's log on disk: its hard state and
//!   entries as records of the same durable log ([`log`]), so the same recovery and compaction.
//! * [`metrics`] — the nodes' counters, gauges and histograms, served in the Prometheus text
//!   format by a small listener of their own.
//!
//! **Logs.** The nodes log through [`tracing`]: start-up (version, options, the data
//! directory's identity), recovery (records replayed, bytes cut and why), connections
//! admitted, refused and closed (who, and why), the directory link, and failures. The library
//! only emits events; a program chooses where they go by installing a subscriber
//! (`dataplane-node` logs to stderr, filtered by `RUST_LOG`). Nothing in `dataplane-core`
//! logs: the drivers log what the machines decided.
//!
//! `unsafe` is allowed only in [`arena`] (mapping shared memory, passing descriptors),
//! [`alloc`] (`mallopt`) and [`sys`] (`umask`, `getgrnam_r`), each use with its safety
//! argument.

pub mod alloc;
pub mod arena;
pub mod child;
pub mod control;
pub mod dirnode;
pub mod driver;
pub mod files;
pub mod frame;
pub mod hostnode;
pub mod log;
pub mod metrics;
pub mod net;
pub mod replcontrol;
pub mod replica_log;
pub mod replnode;
pub mod resolve;
pub mod sys;
mod throttle;
pub mod transport;

//! # dataplane-io-bench
//!
//! Holds `benches/io.rs`, the real-process benchmark of `dataplane-io` (durable mutations
//! against SQLite, local put+get against memcpy, remote get against TCP, a sustained load):
//!
//! ```sh
//! cargo bench -p dataplane-io-bench --bench io             # add `-- --quick` for a smoke run
//! ```
//!
//! It is a crate of its own so that its baselines' dependencies (SQLite, compiled from C) are
//! built only for the bench, never by `cargo test`. The library is empty.

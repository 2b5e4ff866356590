//! Test harness of the dataplane, shared by `dataplane-core`'s integration tests
//! (`core/tests/`) and the fuzz targets (`fuzz/`), so that both drive the same harness against
//! the same reference model:
//!
//! * [`dir`]: a directory driven in memory, its persisted records kept as the durable log;
//! * [`hosts`]: a directory and nodes that each run a proxy, a host and its arena memory, whose
//!   frames the caller carries (`core/tests/host_scenarios.rs`, the `host_session` target);
//! * [`workload`]: the steps of a directory workload and how each becomes a request;
//! * [`check`]: runs steps against the directory and the reference model (`dataplane_model`,
//!   the one the simulator uses too) and checks every step.
//!
//! Deterministic, like the machines: no clock, no randomness, ordered maps only. The callers
//! draw the steps (proptest strategies in `core/tests/model.rs`; `Arbitrary`, behind the
//! feature `arbitrary`, and a fold into the same windows in `fuzz/src/model.rs`). Checks return
//! `Result<(), String>`: the property test turns the error into a failed case, the fuzz
//! targets panic with it.
//!
//! Only integration tests and the fuzz crate may depend on this crate: it links
//! `dataplane-core` as a library, so core's own unit tests (built with `cfg(test)`) cannot use
//! its types.

pub mod check;
pub mod dir;
pub mod hosts;
pub mod workload;

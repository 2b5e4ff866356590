//! `host_session`: a hostile child and a hostile network against two hosts, each with its real
//! proxy, and a real directory (`dataplane_fuzz::host`): child requests of every kind from the
//! child or a stranger, arbitrary bytes written into lease headers and anywhere in the arena,
//! proper fills and seals, forged proxy replies and transfer frames, drops, duplicates, proxy
//! restarts and ticks. Typed errors only, no panic; after every step both hosts'
//! `check_invariants()` (no lease overlap, every lease held by exactly one binding) and fresh
//! generations on every grant; at the end, once sessions are closed, calls answered and sources
//! retired, no lease, binding, source or queued allocation is left (no leak).
#![no_main]

use dataplane_fuzz::host::{Input, run};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: Input| {
    run(&input);
});

//! Shared pieces of the fuzz targets: the directory workload folded for `dataplane-testkit`
//! (whose in-memory directory and reference model the targets share with core's tests), the
//! hosts' world of `host_session`, and the seed corpus writer.

pub mod host;
pub mod model;
pub mod seeds;

//! Shared pieces of the fuzz targets: an in-memory directory harness, the directory's
//! reference model with its `Arbitrary` workload, the hosts' world of `host_session`, and the
//! seed corpus writer.

pub mod dir;
pub mod host;
pub mod model;
pub mod seeds;

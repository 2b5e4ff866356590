//! Multi-process tests: real `dataplane-node` directory and host processes and the `dataplane`
//! CLI on loopback (the harness is `dataplane_tests`).

mod cli_conventions;
mod cluster;
mod cluster_key;
mod control;
mod control_idle;
mod directory_addresses;
mod file_blobs;
mod frozen_leader;
mod full_disk;
mod garbage;
mod handshake_deadline;
mod hostile;
mod kill_directory;
mod kill_host;
mod kill_replicas;
mod leader_redirect;
mod lease;
mod log_damage;
mod membership;
mod names;
mod ops;
mod overload;
mod partitioned_leader;
mod program_streams;
mod replica_membership;
mod replica_peers;
mod replica_rejoin;
mod sessions_max;
mod soak;
mod stranger_lines;
mod streams;
mod transfer_leader;
mod truth;
mod usage_errors;
mod write_deadline;

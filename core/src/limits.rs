//! Every named limit of the data plane (STYLE.md rule 6). A limit that is reached produces a
//! typed error; nothing grows without bound on input from a peer.

/// Largest encoded frame (network or child socket), in bytes, before the length prefix.
pub const FRAME_BYTES_MAX: usize = 1 << 20;
/// Largest encoded log record body, in bytes.
pub const LOG_RECORD_BYTES_MAX: usize = 64 * 1024;

/// Bytes of preallocated room a directory's log keeps for every new operation it takes
/// (`storage::SpaceGate`): four records of the largest size. Below it, with a disk that cannot
/// grow the log, new operations are refused `NoSpace`; what is still let through
/// (retractions, membership, retirements, sync marks) writes into it.
pub const LOG_SPACE_RESERVE_BYTES: u64 = 4 * LOG_RECORD_BYTES_MAX as u64;

/// How often a directory whose disk was full tries to grow its log again (and so how soon
/// after space is freed it takes new operations).
pub const LOG_SPACE_RETRY: crate::time::Duration = crate::time::Duration::from_millis(100);
/// Longest data path, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;
/// Longest path segment, in bytes.
pub const SEGMENT_BYTES_MAX: usize = 255;
/// Longest job run id, in bytes.
pub const RUN_ID_BYTES_MAX: usize = 255;
/// Most read (or write) prefixes in one job context.
pub const JOB_PREFIXES_MAX: usize = 64;
/// Longest opaque stream descriptor, in bytes.
pub const DESCRIPTOR_BYTES_MAX: usize = 1024;
/// Longest human-readable reason carried in an error, in bytes (longer ones are truncated).
pub const REASON_BYTES_MAX: usize = 512;
/// Longest file reference in a `SourceRecovery::File` record, in bytes.
pub const FILE_REF_BYTES_MAX: usize = 4096;
/// Most obligation frames (Retire or Displaced) the directory sends per retry tick.
pub const RETRY_BATCH_MAX: usize = 32;
/// Most opens one replacement fence holds; further opens get `LimitReached`.
pub const FENCE_HELD_OPENS_MAX: usize = 64;
/// Most live blob reservations in one directory; further reserves get `LimitReached`.
pub const RESERVATIONS_MAX: usize = 1 << 16;
/// Most operation records the directory holds before a new operation id is refused
/// `LimitReached(Operations)` (retractions: twice this). Records are pruned once their issuer
/// declares them done or its node incarnation ends, so this bounds what is in flight, not
/// what ever happened.
pub const OPERATIONS_MAX: usize = 1 << 20;
/// Most operation records of one issuer (`LimitReached(IssuerOperations)`; retractions:
/// twice this): one caller that never declares its operations done cannot fill the table.
pub const ISSUER_OPERATIONS_MAX: usize = 1 << 16;
/// Most issuers the directory keeps a row for (a horizon or records;
/// `LimitReached(Issuers)`; retractions: twice this). A row goes when its node incarnation
/// ends.
pub const ISSUERS_MAX: usize = 1 << 12;
/// Most namespace entries (blobs and stream nodes); a mutation that would add one more is
/// refused `LimitReached(Entries)`.
pub const ENTRIES_MAX: usize = 1 << 22;
/// Most retirement and displacement obligations a mutation or an open may add to; beyond
/// it they are refused `LimitReached(Obligations)`. Retractions and gone reports are never
/// refused, so the table holds at most this plus two per rendezvous plus three.
pub const OBLIGATIONS_MAX: usize = 1 << 16;
/// Most runtime rendezvous (pending or active); a first opener beyond it is refused
/// `LimitReached(Rendezvous)`.
pub const RENDEZVOUS_MAX: usize = 1 << 16;
/// Most replacement fences; a replace-open that would begin one more is refused
/// `LimitReached(Fences)`.
pub const FENCES_MAX: usize = 1 << 12;
/// Most requests one proxy keeps pending before it refuses a caller's request with
/// `LimitReached` (a caller's retraction is refused only at twice this).
pub const PROXY_PENDING_MAX: usize = 4096;
/// Most file blobs one host serves (issue 17): published or publishing, in its durable table.
pub const HOST_FILES_MAX: usize = 4096;
/// Most child sessions one host serves, by default (`HostConfig::sessions_max`).
pub const HOST_SESSIONS_MAX: usize = 256;
/// The most `HostConfig::sessions_max` may be (each session is a child connection, an open
/// file of the host process: raise its descriptor limit to match).
pub const HOST_SESSIONS_CAP: usize = 16_384;
/// Most operations in progress (reads, writes until their publication is answered, stats,
/// moves, removes) on one host, over all its sessions. Published writes do not count: each
/// holds an arena lease, and the arena bounds those (`arena::ARENA_LEASES_MAX` and its bytes).
pub const HOST_OPERATIONS_MAX: usize = 4096;
/// Most operations in progress in one child session (one child cannot take a whole host).
pub const HOST_SESSION_OPERATIONS_MAX: usize = 256;
/// Most hosts a directory's membership knows (a new one beyond is refused).
pub const MEMBERS_MAX: usize = 4096;
/// Longest listen address a host may give as its identity.
pub const LISTEN_BYTES_MAX: usize = 512;
/// Most gone reports a node agent keeps re-sending (more are dropped: the directory's re-sends
/// toward a gone address are answered all the same).
pub const AGENT_REPORTS_MAX: usize = 1024;
/// Most retractions a host keeps handed over to its proxy and not yet answered (offered again
/// after a refusal or a proxy restart); as many answered ones are remembered, so an equal
/// retraction is offered once. Past it the oldest is forgotten.
pub const HOST_HANDED_OVER_MAX: usize = 1024;

/// In debug builds every machine re-checks all of its invariants at the end of each input
/// while its state holds at most this many entries (so the check costs a bounded amount per
/// step), and its cheap ones always. Release builds check nothing.
pub const DEBUG_CHECK_STATE_MAX: usize = 256;

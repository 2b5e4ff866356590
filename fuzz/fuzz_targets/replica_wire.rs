//! `replica_wire`: arbitrary bytes into what a directory replica reads from its peers
//! (issue 19): the engine's messages (`dataplane_replica::WireMessage::decode`), and records
//! read back from a replica's log (`Durable::from_records`, then `Replica::start` on what it
//! accepted).
//!
//! Properties: nothing panics; a message that decodes re-encodes to a frame that decodes to an
//! equal message, deterministically; a durable state `from_records` accepts (entries, hard
//! states, snapshots in parts, torn ones among them) starts a replica (what it refuses, it
//! refuses with a typed error, and `start` never sees it). Messages are
//! not stepped into a replica: the engine asserts on some states only a lying peer can cause
//! (a trust boundary documented in ARCHITECTURE "The replicated directory"; peers prove the
//! cluster key before the engine sees a byte of theirs).
#![no_main]

use dataplane_core::log::{LogRecord, ReplicaConf, ReplicaEntryKind, ReplicaRecord};
use dataplane_replica::{Durable, Replica, ReplicaConfig, WireMessage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = WireMessage::decode(data) {
        let bytes = message.encode();
        assert_eq!(bytes, message.encode(), "encoding is deterministic");
        let again = WireMessage::decode(&bytes).expect("what decoded re-encodes to a message");
        assert_eq!(again, message);
    }
    // The same bytes as a replica's log: records of small indexes and terms.
    let records: Vec<LogRecord> = data
        .chunks(4)
        .map(|c| {
            let at = |i: usize| u64::from(c.get(i).copied().unwrap_or(0) % 8);
            LogRecord::Replica(match at(0) % 6 {
                0 => ReplicaRecord::HardState {
                    term: at(1),
                    vote: at(2) % 4,
                    commit: at(3),
                },
                1 => ReplicaRecord::SnapshotStart {
                    index: at(1),
                    term: at(2),
                    conf: ReplicaConf {
                        voters: vec![1, 2, 3],
                        ..ReplicaConf::default()
                    },
                    len: at(3) % 4,
                },
                2 => ReplicaRecord::SnapshotPart(c[..c.len().min(2)].to_vec()),
                _ => ReplicaRecord::Entry {
                    index: at(1),
                    term: at(2),
                    kind: ReplicaEntryKind::Normal,
                    data: c.to_vec(),
                    context: Vec::new(),
                },
            })
        })
        .collect();
    if let Ok(durable) = Durable::from_records(&records) {
        let config = ReplicaConfig {
            id: 1,
            voters: vec![1, 2, 3],
            election_ticks: 10,
            heartbeat_ticks: 2,
            snapshot_every: 4,
            snapshot_keep: 1,
        };
        let _ = Replica::start(&config, &durable);
    }
});

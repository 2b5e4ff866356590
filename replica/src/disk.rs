//! A replica's durable state ([`Durable`]) as records of core's storage protocol
//! ([`LogRecord::Replica`]), so that a replica's disk is the same log on the same files as a
//! single directory's: torn tails, refusal of damage to synced records, the data directory's
//! lock and identity, repair and crash-atomic compaction are all the code the simulator
//! checks (`dataplane_core::storage`); nothing here touches a file.
//!
//! **The mapping.** A round ([`Ready`](crate::Ready)'s `entries` and `hard_state`) becomes its
//! entries, one record each, then its hard state ([`round_records`]); replaying records in
//! order ([`Durable::from_records`]) does what [`Durable::write_parts`] does: an entry replaces
//! every entry from its index on, a hard state replaces the one before. A compaction restates
//! the whole state ([`Durable::snapshot_records`]), which replays to the same `Durable`.
//!
//! **Why entries before the hard state.** A crash may leave any prefix of the round that was
//! being written (the storage protocol cuts the torn tail, and nothing of that round was
//! acknowledged: the driver calls `persisted` only after the sync). A round's hard state may
//! commit entries of the same round; written first, a prefix could hold a commit index past
//! the last entry, which recovery must refuse. Entries first, every prefix of a correct
//! replica's rounds is a state the engine can start from: the entries of a round the replica
//! never acknowledged, under the hard state it had before. (An entry only ever overwrites
//! entries past the commit index, so a partial overwrite never leaves the commit index past
//! the log either.)
//!
//! **Refusals.** Replay is strict: an entry at index 0 or past one after the last entry (a
//! gap), a record that is not a replica's (a directory's data directory, opened as a
//! replica's), or a commit index past the last entry is [`ReplicaError::BadDurable`], naming
//! the record. Deterministic: a pure function of the records.

use dataplane_core::log::{LogRecord, ReplicaConf, ReplicaEntryKind, ReplicaRecord};

use crate::{
    Durable, EntryKind, HardStateRecord, LogEntry, ReplicaError, SNAPSHOT_BYTES_MAX, SnapshotData,
};

impl From<EntryKind> for ReplicaEntryKind {
    fn from(kind: EntryKind) -> Self {
        match kind {
            EntryKind::Normal => ReplicaEntryKind::Normal,
            EntryKind::ConfChange => ReplicaEntryKind::ConfChange,
            EntryKind::ConfChangeV2 => ReplicaEntryKind::ConfChangeV2,
        }
    }
}

impl From<ReplicaEntryKind> for EntryKind {
    fn from(kind: ReplicaEntryKind) -> Self {
        match kind {
            ReplicaEntryKind::Normal => EntryKind::Normal,
            ReplicaEntryKind::ConfChange => EntryKind::ConfChange,
            ReplicaEntryKind::ConfChangeV2 => EntryKind::ConfChangeV2,
        }
    }
}

impl From<&LogEntry> for ReplicaRecord {
    fn from(entry: &LogEntry) -> Self {
        ReplicaRecord::Entry {
            index: entry.index,
            term: entry.term,
            kind: entry.kind.into(),
            data: entry.data.clone(),
            context: entry.context.clone(),
        }
    }
}

impl From<HardStateRecord> for ReplicaRecord {
    fn from(hs: HardStateRecord) -> Self {
        ReplicaRecord::HardState {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
        }
    }
}

/// What one replica record says, in the replica's own types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskRecord {
    /// An entry, replacing every entry from its index on.
    Entry(LogEntry),
    /// A hard state, replacing the one before.
    HardState(HardStateRecord),
    /// A snapshot's start: its index, term, configuration and length; its parts follow.
    SnapshotStart {
        /// The last entry it covers.
        index: u64,
        /// That entry's term.
        term: u64,
        /// The configuration there.
        conf: ReplicaConf,
        /// The bytes its parts hold together.
        len: u64,
    },
    /// The next bytes of a snapshot.
    SnapshotPart(Vec<u8>),
}

impl From<&ReplicaRecord> for DiskRecord {
    fn from(record: &ReplicaRecord) -> Self {
        match record {
            ReplicaRecord::HardState { term, vote, commit } => {
                DiskRecord::HardState(HardStateRecord {
                    term: *term,
                    vote: *vote,
                    commit: *commit,
                })
            }
            ReplicaRecord::Entry {
                index,
                term,
                kind,
                data,
                context,
            } => DiskRecord::Entry(LogEntry {
                index: *index,
                term: *term,
                kind: (*kind).into(),
                data: data.clone(),
                context: context.clone(),
            }),
            ReplicaRecord::SnapshotStart {
                index,
                term,
                conf,
                len,
            } => DiskRecord::SnapshotStart {
                index: *index,
                term: *term,
                conf: conf.clone(),
                len: *len,
            },
            ReplicaRecord::SnapshotPart(bytes) => DiskRecord::SnapshotPart(bytes.clone()),
        }
    }
}

/// The bytes of a snapshot one record holds (within the storage's record limit, 64 KiB).
pub const SNAPSHOT_PART_BYTES: usize = 60 << 10;

/// The records that restate `snapshot`: its start, then its bytes in parts.
fn snapshot_records(snapshot: &SnapshotData) -> impl Iterator<Item = LogRecord> + '_ {
    std::iter::once(LogRecord::Replica(ReplicaRecord::SnapshotStart {
        index: snapshot.index,
        term: snapshot.term,
        conf: snapshot.conf.clone(),
        len: snapshot.data.len() as u64,
    }))
    .chain(
        snapshot
            .data
            .chunks(SNAPSHOT_PART_BYTES)
            .map(|part| LogRecord::Replica(ReplicaRecord::SnapshotPart(part.to_vec()))),
    )
}

/// The records that make one round durable: a snapshot it installed, its entries in order,
/// then its hard state (see the module documentation for why in this order). Empty if the
/// round has none of them.
pub fn round_records(
    snapshot: Option<&SnapshotData>,
    entries: &[LogEntry],
    hard_state: Option<HardStateRecord>,
) -> Vec<LogRecord> {
    snapshot
        .into_iter()
        .flat_map(snapshot_records)
        .chain(entries.iter().map(|e| LogRecord::Replica(e.into())))
        .chain(hard_state.map(|hs| LogRecord::Replica(hs.into())))
        .collect()
}

/// A snapshot whose parts are being read back.
struct Reading {
    snapshot: SnapshotData,
    len: u64,
}

impl Durable {
    /// Rebuilds what a replica's disk holds from its records, replayed in order (a recovered
    /// log: a compaction's restatement, then the rounds written since). Refuses, naming the
    /// record, anything that is not a replica's log: see the module documentation.
    pub fn from_records(records: &[LogRecord]) -> Result<Durable, ReplicaError> {
        let mut durable = Durable::default();
        let mut reading: Option<Reading> = None;
        for (position, record) in records.iter().enumerate() {
            let LogRecord::Replica(record) = record else {
                return Err(ReplicaError::BadDurable(format!(
                    "record {position} is not a replica's ({}): this is not a replica's data \
                     directory",
                    record_name(record)
                )));
            };
            let record = DiskRecord::from(record);
            if let DiskRecord::SnapshotPart(bytes) = &record {
                let Some(r) = reading.as_mut() else {
                    return Err(ReplicaError::BadDurable(format!(
                        "record {position} is a snapshot's part outside a snapshot"
                    )));
                };
                if r.snapshot.data.len() as u64 + bytes.len() as u64 > r.len {
                    return Err(ReplicaError::BadDurable(format!(
                        "record {position} runs past its snapshot's {} bytes",
                        r.len
                    )));
                }
                r.snapshot.data.extend_from_slice(bytes);
                if r.snapshot.data.len() as u64 == r.len {
                    let r = reading.take().expect("read above");
                    durable.install(r.snapshot);
                }
                continue;
            }
            // A snapshot whose parts stop short was a torn round's: the replica restarted
            // from the state before it, and what follows was written over that state.
            reading = None;
            match record {
                DiskRecord::SnapshotPart(_) => unreachable!("handled above"),
                DiskRecord::SnapshotStart {
                    index,
                    term,
                    conf,
                    len,
                } => {
                    if index == 0 || len > SNAPSHOT_BYTES_MAX as u64 {
                        return Err(ReplicaError::BadDurable(format!(
                            "record {position} starts a snapshot at index {index} of {len} \
                             bytes (snapshots cover index 1 on, up to {SNAPSHOT_BYTES_MAX} \
                             bytes)"
                        )));
                    }
                    let snapshot = SnapshotData {
                        index,
                        term,
                        conf,
                        data: Vec::new(),
                    };
                    if len == 0 {
                        durable.install(snapshot);
                    } else {
                        reading = Some(Reading { snapshot, len });
                    }
                }
                DiskRecord::HardState(hs) => durable.hard_state = hs,
                DiskRecord::Entry(entry) => {
                    let last = durable.last_index();
                    if entry.index <= durable.start.0 || entry.index > last.saturating_add(1) {
                        return Err(ReplicaError::BadDurable(format!(
                            "record {position} is entry {} after the last entry {last} \
                             (entries follow one another from {})",
                            entry.index,
                            durable.start.0 + 1
                        )));
                    }
                    durable.write_parts(std::slice::from_ref(&entry), None);
                }
            }
        }
        check(&durable)?;
        Ok(durable)
    }

    /// Records whose replay from nothing rebuilds this state (what a compaction restates):
    /// the snapshot, every entry after it, then the hard state. (Entries kept before the
    /// snapshot's index are not restated: the snapshot covers them.)
    pub fn snapshot_records(&self) -> Vec<LogRecord> {
        let after = self.snapshot.as_ref().map_or(0, |s| s.index);
        let kept = self.entries.partition_point(|e| e.index <= after);
        round_records(
            self.snapshot.as_ref(),
            &self.entries[kept..],
            Some(self.hard_state),
        )
    }
}

/// What `Replica::start` requires of a durable state: entries numbered without a gap from
/// the one after `start`, which the snapshot covers, and a commit index within the log.
pub(crate) fn check(durable: &Durable) -> Result<(), ReplicaError> {
    for (i, e) in durable.entries.iter().enumerate() {
        if e.index != durable.start.0 + i as u64 + 1 {
            return Err(ReplicaError::BadDurable(format!(
                "entry {} at position {} after {}",
                e.index,
                i + 1,
                durable.start.0
            )));
        }
    }
    let covered = durable.snapshot.as_ref().map_or(0, |s| s.index);
    if durable.start.0 > covered {
        return Err(ReplicaError::BadDurable(format!(
            "the log starts after {} but its snapshot covers up to {covered}",
            durable.start.0
        )));
    }
    let last = durable.last_index();
    if covered > last {
        return Err(ReplicaError::BadDurable(format!(
            "a snapshot at {covered} past the last entry {last}"
        )));
    }
    if durable.hard_state.commit > last {
        return Err(ReplicaError::BadDurable(format!(
            "commit {} past the last entry {last}",
            durable.hard_state.commit
        )));
    }
    Ok(())
}

/// A record's variant, for a refusal's message.
fn record_name(record: &LogRecord) -> &'static str {
    match record {
        LogRecord::EpochAdvanced { .. } => "a directory's EpochAdvanced",
        LogRecord::Committed { .. } => "a directory's Committed",
        LogRecord::Joined { .. } => "a directory's Joined",
        LogRecord::Rejected { .. } => "a directory's Rejected",
        LogRecord::Reserved { .. } => "a directory's Reserved",
        LogRecord::ReservationReleased { .. } => "a directory's ReservationReleased",
        LogRecord::RetirementDone { .. } => "a directory's RetirementDone",
        LogRecord::DisplacementQueued { .. } => "a directory's DisplacementQueued",
        LogRecord::DisplacementDone { .. } => "a directory's DisplacementDone",
        LogRecord::NodeRestarted { .. } => "a directory's NodeRestarted",
        LogRecord::Snapshot(_) => "a directory's snapshot record",
        LogRecord::OperationsDone { .. } => "a directory's OperationsDone",
        LogRecord::Member(_) => "a directory node's membership record",
        LogRecord::Replica(_) => "a replica record",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Compaction;
    use dataplane_core::ids::AuthorityEpoch;
    use proptest::prelude::*;

    fn entry(index: u64, term: u64) -> LogEntry {
        LogEntry {
            index,
            term,
            kind: EntryKind::Normal,
            data: vec![index as u8; (index % 3) as usize],
            context: Vec::new(),
        }
    }

    fn hs(term: u64, vote: u64, commit: u64) -> HardStateRecord {
        HardStateRecord { term, vote, commit }
    }

    /// One round drawn as seeds, made concrete against the state it is written over.
    #[derive(Clone, Debug)]
    struct RoundSeed {
        start: u64,
        count: usize,
        term: u64,
        kinds: Vec<u8>,
        data: Vec<u8>,
        hard_state: Option<(u64, u64, u64)>,
    }

    fn round_seed() -> impl Strategy<Value = RoundSeed> {
        (
            any::<u64>(),
            0usize..5,
            1u64..6,
            proptest::collection::vec(0u8..3, 5),
            proptest::collection::vec(any::<u8>(), 0..6),
            proptest::option::of((1u64..6, 0u64..4, any::<u64>())),
        )
            .prop_map(|(start, count, term, kinds, data, hard_state)| RoundSeed {
                start,
                count,
                term,
                kinds,
                data,
                hard_state,
            })
    }

    /// The round `seed` describes over `durable`. `raft_like`: as a correct replica writes
    /// them (entries only past the commit index, the commit index only rising and within the
    /// log); otherwise entries anywhere in `1..=last+1` and any commit up to the new last.
    fn round(
        seed: &RoundSeed,
        durable: &Durable,
        raft_like: bool,
    ) -> (Vec<LogEntry>, Option<HardStateRecord>) {
        let last = durable.last_index();
        let commit = durable.hard_state.commit;
        let low = if raft_like { commit + 1 } else { 1 };
        let start = low + seed.start % (last + 2 - low);
        let entries: Vec<LogEntry> = (0..seed.count as u64)
            .map(|i| LogEntry {
                index: start + i,
                term: seed.term,
                kind: match seed.kinds[i as usize] {
                    0 => EntryKind::Normal,
                    1 => EntryKind::ConfChange,
                    _ => EntryKind::ConfChangeV2,
                },
                data: seed.data.clone(),
                context: seed.data.iter().rev().copied().collect(),
            })
            .collect();
        let new_last = entries.last().map_or(last, |e| e.index);
        let hard_state = seed.hard_state.map(|(term, vote, c)| {
            let c = if raft_like {
                commit + c % (new_last + 1 - commit)
            } else {
                c % (new_last + 1)
            };
            hs(term, vote, c)
        });
        (entries, hard_state)
    }

    proptest! {
        /// Replaying the rounds' records builds what `write_parts` builds, or refuses exactly
        /// when that state is not one a replica can start from (a commit index past the log,
        /// after a later round cut the log below it).
        #[test]
        fn replaying_rounds_equals_writing_them(
            seeds in proptest::collection::vec(round_seed(), 0..24),
        ) {
            let mut expected = Durable::default();
            let mut records = Vec::new();
            for seed in &seeds {
                let (entries, hard_state) = round(seed, &expected, false);
                records.extend(round_records(None, &entries, hard_state));
                expected.write_parts(&entries, hard_state);
            }
            let replayed = Durable::from_records(&records);
            if expected.hard_state.commit <= expected.last_index() {
                prop_assert_eq!(replayed, Ok(expected));
            } else {
                prop_assert!(
                    matches!(&replayed, Err(ReplicaError::BadDurable(why)) if why.contains("past the last entry")),
                    "{:?}", replayed
                );
            }
        }

        /// Every prefix of a correct replica's records (what a torn tail leaves) is a state it
        /// can start from, and the whole replays to what `write_parts` built; the restatement
        /// of a compaction replays to the same state, alone or followed by more rounds.
        #[test]
        fn every_prefix_of_a_replicas_rounds_recovers(
            seeds in proptest::collection::vec(round_seed(), 0..24),
            split in any::<prop::sample::Index>(),
        ) {
            let mut expected = Durable::default();
            let mut records = Vec::new();
            let at = split.index(seeds.len() + 1);
            let mut compacted = Vec::new();
            for (i, seed) in seeds.iter().enumerate() {
                if i == at {
                    compacted = expected.snapshot_records();
                }
                let (entries, hard_state) = round(seed, &expected, true);
                let round = round_records(None, &entries, hard_state);
                records.extend(round.iter().cloned());
                if i >= at {
                    compacted.extend(round);
                }
                expected.write_parts(&entries, hard_state);
            }
            if at == seeds.len() {
                compacted = expected.snapshot_records();
            }
            for cut in 0..=records.len() {
                let prefix = Durable::from_records(&records[..cut]);
                prop_assert!(prefix.is_ok(), "cut at {}: {:?}", cut, prefix);
            }
            prop_assert_eq!(Durable::from_records(&records), Ok(expected.clone()));
            prop_assert_eq!(Durable::from_records(&compacted), Ok(expected.clone()));
            prop_assert_eq!(
                Durable::from_records(&expected.snapshot_records()),
                Ok(expected)
            );
        }
    }

    /// A step of a replica's disk: a round, a snapshot installed from a leader, or a snapshot
    /// of its own (memory only until a compaction of the log restates it).
    #[derive(Clone, Debug)]
    enum DiskStep {
        Round(RoundSeed),
        Install { ahead: u64, len: usize },
        Compact { back: u64, keep: u64 },
    }

    fn disk_step() -> impl Strategy<Value = DiskStep> {
        prop_oneof![
            4 => round_seed().prop_map(DiskStep::Round),
            1 => (0u64..4, 0usize..(3 * SNAPSHOT_PART_BYTES / 2))
                .prop_map(|(ahead, len)| DiskStep::Install { ahead, len }),
            1 => (0u64..6, 0u64..4).prop_map(|(back, keep)| DiskStep::Compact { back, keep }),
        ]
    }

    fn snapshot(index: u64, term: u64, len: usize) -> SnapshotData {
        SnapshotData {
            index,
            term,
            conf: ReplicaConf {
                voters: vec![1, 2, 3],
                ..ReplicaConf::default()
            },
            data: (0..len).map(|i| (i as u64 ^ index) as u8).collect(),
        }
    }

    proptest! {
        /// With snapshots: every prefix of the records recovers; the whole replays to the disk
        /// the rounds and installs made (a snapshot of its own changes no record); and the
        /// restatement of the state with its own snapshots replays to that state, less the
        /// entries its snapshot covers.
        #[test]
        fn snapshots_replay_and_restate(
            steps in proptest::collection::vec(disk_step(), 0..24),
        ) {
            let mut disk = Durable::default();
            let mut memory = Durable::default();
            let mut records = Vec::new();
            for step in &steps {
                match step {
                    DiskStep::Round(seed) => {
                        let (entries, hard_state) = round(seed, &disk, true);
                        records.extend(round_records(None, &entries, hard_state));
                        disk.write_parts(&entries, hard_state);
                        memory.write_parts(&entries, hard_state);
                    }
                    DiskStep::Install { ahead, len } => {
                        let index = disk.last_index().max(disk.hard_state.commit) + ahead + 1;
                        let term = disk.hard_state.term.max(1) + 1;
                        let s = snapshot(index, term, *len);
                        let hs = hs(term, 0, index);
                        records.extend(round_records(Some(&s), &[], Some(hs)));
                        for d in [&mut disk, &mut memory] {
                            d.install(s.clone());
                            d.write_parts(&[], Some(hs));
                        }
                    }
                    DiskStep::Compact { back, keep } => {
                        let covered = memory.snapshot.as_ref().map_or(0, |s| s.index);
                        let index = memory.hard_state.commit.saturating_sub(*back);
                        if index <= covered || index <= memory.start.0 {
                            continue;
                        }
                        let term = memory.entries[(index - memory.start.0 - 1) as usize].term;
                        let keep_from = (index + 1).saturating_sub(*keep).max(memory.start.0 + 1);
                        memory.compact(&Compaction {
                            snapshot: snapshot(index, term, 10),
                            keep_from,
                        });
                    }
                }
            }
            for cut in 0..=records.len() {
                let prefix = Durable::from_records(&records[..cut]);
                prop_assert!(prefix.is_ok(), "cut at {}: {:?}", cut, prefix);
            }
            prop_assert_eq!(Durable::from_records(&records), Ok(disk.clone()));
            let restated = Durable::from_records(&memory.snapshot_records());
            prop_assert!(restated.is_ok(), "{:?}", restated);
            let restated = restated.unwrap();
            let covered = restated.snapshot.as_ref().map_or(0, |s| s.index);
            prop_assert_eq!(restated.start.0, covered);
            prop_assert_eq!(&restated.snapshot, &memory.snapshot);
            prop_assert_eq!(restated.hard_state, disk.hard_state);
            let after: Vec<&LogEntry> = disk.entries.iter().filter(|e| e.index > covered).collect();
            prop_assert_eq!(restated.entries.iter().collect::<Vec<_>>(), after);
        }
    }

    #[test]
    fn a_round_is_its_entries_then_its_hard_state() {
        let records = round_records(None, &[entry(1, 1), entry(2, 1)], Some(hs(1, 2, 2)));
        assert_eq!(
            records,
            vec![
                LogRecord::Replica((&entry(1, 1)).into()),
                LogRecord::Replica((&entry(2, 1)).into()),
                LogRecord::Replica(ReplicaRecord::HardState {
                    term: 1,
                    vote: 2,
                    commit: 2
                }),
            ]
        );
        assert!(round_records(None, &[], None).is_empty());
        // Cut after the entries, the round leaves them under the hard state from before.
        let durable = Durable::from_records(&records[..2]).unwrap();
        assert_eq!(durable.hard_state, HardStateRecord::default());
        assert_eq!(durable.entries, vec![entry(1, 1), entry(2, 1)]);
    }

    #[test]
    fn kinds_and_entries_convert_both_ways() {
        for kind in [
            EntryKind::Normal,
            EntryKind::ConfChange,
            EntryKind::ConfChangeV2,
        ] {
            assert_eq!(EntryKind::from(ReplicaEntryKind::from(kind)), kind);
        }
        let e = LogEntry {
            index: 7,
            term: 3,
            kind: EntryKind::ConfChange,
            data: vec![1, 2],
            context: vec![3],
        };
        assert_eq!(
            DiskRecord::from(&ReplicaRecord::from(&e)),
            DiskRecord::Entry(e)
        );
        let h = hs(4, 1, 2);
        assert_eq!(
            DiskRecord::from(&ReplicaRecord::from(h)),
            DiskRecord::HardState(h)
        );
    }

    #[test]
    fn an_overwritten_suffix_is_replaced() {
        let mut records = round_records(None, &[entry(1, 1), entry(2, 1), entry(3, 1)], None);
        records.extend(round_records(None, &[entry(2, 2)], Some(hs(2, 0, 1))));
        let durable = Durable::from_records(&records).unwrap();
        assert_eq!(durable.entries, vec![entry(1, 1), entry(2, 2)]);
        assert_eq!(durable.hard_state, hs(2, 0, 1));
    }

    fn refusal(records: &[LogRecord]) -> String {
        match Durable::from_records(records) {
            Err(ReplicaError::BadDurable(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_gap_is_refused() {
        let records = round_records(None, &[entry(1, 1), entry(3, 1)], None);
        let why = refusal(&records);
        assert!(
            why.contains("record 1 is entry 3 after the last entry 1"),
            "{why}"
        );
    }

    #[test]
    fn index_zero_is_refused() {
        let why = refusal(&round_records(None, &[entry(0, 1)], None));
        assert!(why.contains("record 0 is entry 0"), "{why}");
    }

    #[test]
    fn a_directory_record_is_refused() {
        let mut records = round_records(None, &[entry(1, 1)], None);
        records.push(LogRecord::EpochAdvanced {
            epoch: AuthorityEpoch(1),
        });
        let why = refusal(&records);
        assert!(
            why.contains("record 1 is not a replica's (a directory's EpochAdvanced)"),
            "{why}"
        );
    }

    #[test]
    fn a_commit_past_the_log_is_refused() {
        let why = refusal(&round_records(None, &[entry(1, 1)], Some(hs(1, 1, 2))));
        assert!(why.contains("commit 2 past the last entry 1"), "{why}");
        assert!(
            Durable::from_records(&round_records(None, &[entry(1, 1)], Some(hs(1, 1, 1)))).is_ok()
        );
    }
}

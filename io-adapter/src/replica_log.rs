//! One replica's disk: the durable state of a replica of the replicated directory's log
//! ([`dataplane_replica::Durable`], its hard state and entries) kept in a [`DurableLog`], the
//! single directory's own log.
//!
//! **Why the directory's log, and not a store of its own.** The disk format is core's storage
//! protocol ([`dataplane_core::storage`]); a replica's state is only another kind of record in
//! it ([`LogRecord::Replica`], mapped by `dataplane_replica`'s `disk` module). So everything a
//! disk can do to a replica is handled by the code the simulator checks against crashes, torn
//! writes, lost and damaged blocks: a torn tail is cut, damage to synced records is refused
//! (and repaired only when asked), the data directory is locked and carries its identity, and
//! compaction is crash-atomic. Nothing here decides any of that.
//!
//! **A round.** [`ReplicaLog::write`] makes one round of the replica's output durable, as the
//! replica's driving contract requires before `persisted`: its entries, then its hard state,
//! appended and synced once (group commit, as the directory does for a batch of steps); then
//! the in-memory copy takes the round ([`Durable::write_parts`]). A crash at any point leaves a
//! prefix of the round at most, and nothing of it was acknowledged, since the driver releases
//! the round's messages only after `write` returned. Recovery replays the records strictly
//! ([`Durable::from_records`]): a data directory that holds anything but a replica's log
//! (a directory's, for one) is refused, not started.
//!
//! **Compaction.** The replica never truncates its log's front yet, so a compaction restates
//! the whole state ([`Durable::snapshot_records`]): it drops only what later rounds overwrote
//! and the hard states they replaced. The storage's policy ([`DurableLog::compaction_due`])
//! compacts when the log file is past [`COMPACT_MIN_BYTES`] and twice its snapshot, so each
//! byte is rewritten a bounded number of times on average.
//!
//! **Fail-stop.** Any error from [`ReplicaLog::write`] but [`LogError::TooLarge`] leaves the
//! log poisoned (a storage failure; the storage protocol's rule): the replica must stop and
//! start again from [`ReplicaLog::open_with`]. A round with a record over the storage's limit
//! is refused before anything of it is written.

use std::fmt;
use std::path::Path;

use dataplane_core::limits::LOG_RECORD_BYTES_MAX;
use dataplane_core::log::LogRecord;
use dataplane_replica::{
    Compaction, Durable, HardStateRecord, LogEntry, ReplicaError, SnapshotData, round_records,
};

use crate::log::{DurableLog, LogError, LogOptions, Recovered};

/// The log is compacted once it is this large (and twice its snapshot: `compaction_due`), as
/// the directory node's.
pub const COMPACT_MIN_BYTES: u64 = 4 << 20;

/// Why a replica's log could not be opened.
#[derive(Debug)]
pub enum ReplicaLogError {
    /// The storage refused or failed to open the data directory.
    Log(LogError),
    /// The data directory's records are not a replica's log (a directory's log, a gap in the
    /// entries, a commit past the last entry).
    Durable(ReplicaError),
}

impl ReplicaLogError {
    /// Whether the start is refused because of what the data directory holds, or because
    /// another process has it open (`Locked`), rather than a storage failure: the split the
    /// directory node makes between `Refused` and a failed log. The files need a person (or
    /// the other process to go); restarting alone does not help.
    pub fn is_refusal(&self) -> bool {
        match self {
            ReplicaLogError::Log(e) => e.is_refusal() || matches!(e, LogError::Locked { .. }),
            ReplicaLogError::Durable(_) => true,
        }
    }
}

impl fmt::Display for ReplicaLogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaLogError::Log(e) => write!(f, "replica log: {e}"),
            ReplicaLogError::Durable(e) => write!(f, "replica log: {e}"),
        }
    }
}

impl std::error::Error for ReplicaLogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplicaLogError::Log(e) => Some(e),
            ReplicaLogError::Durable(e) => Some(e),
        }
    }
}

impl From<LogError> for ReplicaLogError {
    fn from(e: LogError) -> Self {
        ReplicaLogError::Log(e)
    }
}

impl From<ReplicaError> for ReplicaLogError {
    fn from(e: ReplicaError) -> Self {
        ReplicaLogError::Durable(e)
    }
}

/// One replica's durable state in one data directory, with the copy of it its records
/// rebuild (what `Replica::start` takes after a restart).
#[derive(Debug)]
pub struct ReplicaLog {
    log: DurableLog,
    durable: Durable,
    /// The compaction policy's minimum ([`COMPACT_MIN_BYTES`]; tests lower it).
    compact_min_bytes: u64,
}

impl ReplicaLog {
    /// Opens and recovers the log in `dir` ([`DurableLog::open_with`]: the lock, torn tails,
    /// damage, repair), then rebuilds the replica's durable state from its records.
    pub fn open_with(
        dir: &Path,
        options: LogOptions,
    ) -> Result<(ReplicaLog, Recovered), ReplicaLogError> {
        ReplicaLog::open_compacting_at(dir, options, COMPACT_MIN_BYTES)
    }

    /// [`open_with`](Self::open_with), compacting from `compact_min_bytes` on.
    pub(crate) fn open_compacting_at(
        dir: &Path,
        options: LogOptions,
        compact_min_bytes: u64,
    ) -> Result<(ReplicaLog, Recovered), ReplicaLogError> {
        let (log, recovered) = DurableLog::open_with(dir, options)?;
        let durable = Durable::from_records(&recovered.records)?;
        let log = ReplicaLog {
            log,
            durable,
            compact_min_bytes,
        };
        Ok((log, recovered))
    }

    /// What the disk holds (all of it synced).
    pub fn durable(&self) -> &Durable {
        &self.durable
    }

    /// The log underneath, for its paths, positions and generation.
    pub fn log(&self) -> &DurableLog {
        &self.log
    }

    /// Makes one round durable: appends its entries, then its hard state, syncs once, and
    /// applies the round to [`durable`](Self::durable); then compacts if it is due. Does
    /// nothing for a round with neither. An error but `TooLarge` (refused before anything
    /// was written) poisons the log: stop, and open it again.
    ///
    /// # Panics
    ///
    /// If the entries do not follow one another from an index in `1..=last+1`: the engine
    /// never hands out such a round, and recovery would refuse the log it made.
    pub fn write(
        &mut self,
        entries: &[LogEntry],
        hard_state: Option<HardStateRecord>,
    ) -> Result<(), LogError> {
        self.write_round(None, entries, hard_state)
    }

    /// [`write`](Self::write) for a round that may install a snapshot from the leader: its
    /// records go first (the snapshot replaces the log), then the entries and the hard state.
    pub fn write_round(
        &mut self,
        snapshot: Option<&SnapshotData>,
        entries: &[LogEntry],
        hard_state: Option<HardStateRecord>,
    ) -> Result<(), LogError> {
        if snapshot.is_none() && entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        let (start, last) = match snapshot {
            Some(s) => (s.index, s.index),
            None => (self.durable.start.0, self.durable.last_index()),
        };
        if let Some(first) = entries.first() {
            assert!(
                (start + 1..=last + 1).contains(&first.index)
                    && entries.windows(2).all(|w| w[1].index == w[0].index + 1),
                "a round's entries must follow the log (last entry {last}): {:?}",
                entries.iter().map(|e| e.index).collect::<Vec<_>>()
            );
        }
        let records = round_records(snapshot, entries, hard_state);
        // The storage refuses an oversized record without writing it, but the round's records
        // before it would be written already: refuse the whole round first.
        for record in &records {
            check_size(record)?;
        }
        for record in &records {
            self.log.append(record)?;
        }
        self.log.sync()?;
        if let Some(snapshot) = snapshot {
            self.durable.install(snapshot.clone());
        }
        self.durable.write_parts(entries, hard_state);
        self.compact_if_due()
    }

    /// The replica took a snapshot ([`dataplane_replica::Ready::compacted`]): this copy of the
    /// disk drops the entries it covers, and the log's next compaction restates the snapshot
    /// instead of them (until then the disk keeps the entries, which replay to the same
    /// state). Writes nothing unless that compaction is due now.
    pub fn compacted(&mut self, compaction: &Compaction) -> Result<(), LogError> {
        self.durable.compact(compaction);
        self.compact_if_due()
    }

    fn compact_if_due(&mut self) -> Result<(), LogError> {
        if self.log.compaction_due(self.compact_min_bytes) {
            // A compaction the disk had no room for is postponed: the log goes on as it was.
            let _postponed = self.log.compact(&self.durable.snapshot_records())?;
        }
        Ok(())
    }
}

/// Refuses a record whose body would be over the storage's limit, as the storage would.
fn check_size(record: &LogRecord) -> Result<(), LogError> {
    let len = postcard::experimental::serialized_size(record)
        .map_err(|e| LogError::Encode(e.to_string()))?;
    if len > LOG_RECORD_BYTES_MAX {
        return Err(LogError::TooLarge {
            len,
            max: LOG_RECORD_BYTES_MAX,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Cut;
    use dataplane_core::ids::AuthorityEpoch;
    use dataplane_core::log::{FRAME_HEADER_BYTES, append_record};
    use dataplane_replica::EntryKind;
    use std::path::PathBuf;

    fn scratch() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::Builder::new()
            .prefix("dataplane-io-replica-log-")
            .tempdir()
            .unwrap();
        let dir = root.path().join("data");
        (root, dir)
    }

    fn entry(index: u64, term: u64) -> LogEntry {
        LogEntry {
            index,
            term,
            kind: EntryKind::Normal,
            data: format!("entry {index} of term {term}").into_bytes(),
            context: Vec::new(),
        }
    }

    fn hs(term: u64, vote: u64, commit: u64) -> HardStateRecord {
        HardStateRecord { term, vote, commit }
    }

    fn open(dir: &Path) -> (ReplicaLog, Recovered) {
        ReplicaLog::open_with(dir, LogOptions::default()).unwrap()
    }

    #[test]
    fn rounds_survive_a_reopen() {
        let (_root, dir) = scratch();
        let (mut log, recovered) = open(&dir);
        assert!(recovered.created);
        assert_eq!(log.durable(), &Durable::default());
        log.write(&[], Some(hs(1, 1, 0))).unwrap();
        log.write(&[entry(1, 1), entry(2, 1)], None).unwrap();
        log.write(&[entry(3, 1)], Some(hs(1, 1, 2))).unwrap();
        assert_eq!(log.log().synced(), log.log().written(), "a round is synced");
        let before = log.durable().clone();
        assert_eq!(before.entries, vec![entry(1, 1), entry(2, 1), entry(3, 1)]);
        assert_eq!(before.hard_state, hs(1, 1, 2));
        drop(log);
        let (log, recovered) = open(&dir);
        assert!(!recovered.created);
        assert_eq!(recovered.cut, None);
        assert_eq!(log.durable(), &before);
    }

    #[test]
    fn an_empty_round_writes_nothing() {
        let (_root, dir) = scratch();
        let (mut log, _) = open(&dir);
        let written = log.log().written();
        log.write(&[], None).unwrap();
        assert_eq!(log.log().written(), written);
        log.write(&[entry(1, 1)], None).unwrap();
        assert!(log.log().written() > written);
    }

    #[test]
    fn an_overwritten_suffix_stays_overwritten_after_a_reopen() {
        let (_root, dir) = scratch();
        let (mut log, _) = open(&dir);
        log.write(&[entry(1, 1), entry(2, 1), entry(3, 1)], Some(hs(1, 1, 1)))
            .unwrap();
        // A new leader of term 2 replaces what the old one did not commit.
        log.write(&[entry(2, 2)], Some(hs(2, 2, 1))).unwrap();
        let expected = Durable {
            hard_state: hs(2, 2, 1),
            entries: vec![entry(1, 1), entry(2, 2)],
            ..Durable::default()
        };
        assert_eq!(log.durable(), &expected);
        drop(log);
        let (log, _) = open(&dir);
        assert_eq!(log.durable(), &expected);
    }

    #[test]
    fn compaction_keeps_the_state() {
        let (_root, dir) = scratch();
        let (mut log, _) =
            ReplicaLog::open_compacting_at(&dir, LogOptions::default(), 1024).unwrap();
        let (mut last, mut commit) = (0, 0);
        for round in 1..=200u64 {
            // Every fourth round a new term overwrites the last two entries (never committed:
            // the others commit up to where they start).
            let term = round / 4 + 1;
            let start = if round % 4 == 0 {
                last - 1
            } else {
                commit = last;
                last + 1
            };
            let entries: Vec<LogEntry> = (start..start + 3).map(|i| entry(i, term)).collect();
            last = start + 2;
            log.write(&entries, Some(hs(term, 1, commit))).unwrap();
        }
        assert!(
            log.log().generation() >= 2,
            "compacted {} times",
            log.log().generation()
        );
        let expected = log.durable().clone();
        assert_eq!(expected.entries.len() as u64, last);
        drop(log);
        let (log, recovered) = open(&dir);
        assert!(recovered.snapshot_records > 0);
        assert_eq!(log.durable(), &expected);
    }

    fn snapshot(index: u64, term: u64, len: usize) -> SnapshotData {
        SnapshotData {
            index,
            term,
            conf: dataplane_replica::ReplicaConf {
                voters: vec![1, 2, 3],
                ..Default::default()
            },
            data: (0..len).map(|i| (i % 251) as u8).collect(),
        }
    }

    #[test]
    fn snapshots_taken_and_installed_survive_a_reopen_and_bound_the_log() {
        let (_root, dir) = scratch();
        let (mut log, _) =
            ReplicaLog::open_compacting_at(&dir, LogOptions::default(), 4096).unwrap();
        // Entries 1..=300, a snapshot taken every 50 (keeping 10 entries before it).
        for i in 1..=300u64 {
            log.write(&[entry(i, 1)], Some(hs(1, 1, i))).unwrap();
            if i % 50 == 0 {
                log.compacted(&Compaction {
                    snapshot: snapshot(i, 1, 100 << 10),
                    keep_from: i - 9,
                })
                .unwrap();
            }
        }
        assert_eq!(log.durable().start, (290, 1));
        assert_eq!(log.durable().entries.len(), 10);
        drop(log);
        let (mut log, recovered) = open(&dir);
        // The log's last compaction restated a snapshot and the entries after it; the rounds
        // since follow.
        assert!(
            recovered.snapshot_records > 0,
            "the log was never compacted"
        );
        let durable = log.durable();
        let s = durable.snapshot.clone().expect("a snapshot");
        assert_eq!(s, snapshot(s.index, 1, 100 << 10));
        assert_eq!(durable.start, (s.index, 1));
        assert_eq!(
            durable.entries,
            (s.index + 1..=300).map(|i| entry(i, 1)).collect::<Vec<_>>()
        );
        assert_eq!(durable.hard_state, hs(1, 1, 300));
        // A snapshot from a leader replaces the log; entries follow it in the same round.
        let installed = snapshot(400, 2, 70 << 10);
        log.write_round(Some(&installed), &[entry(401, 2)], Some(hs(2, 0, 400)))
            .unwrap();
        let expected = log.durable().clone();
        assert_eq!(expected.start, (400, 2));
        assert_eq!(expected.entries, vec![entry(401, 2)]);
        drop(log);
        let (log, _) = open(&dir);
        assert_eq!(log.durable(), &expected);
    }

    #[test]
    fn a_round_cut_inside_its_snapshot_recovers_the_state_before_it() {
        let (_root, dir) = scratch();
        let (mut log, _) = open(&dir);
        log.write(&[entry(1, 1), entry(2, 1)], Some(hs(1, 1, 2)))
            .unwrap();
        let before = log.durable().clone();
        let end_of_first = log.log().written();
        // Three parts of 60 KiB: cut inside the second.
        log.write_round(Some(&snapshot(9, 2, 150 << 10)), &[], Some(hs(2, 0, 9)))
            .unwrap();
        let file = log.log().log_path();
        drop(log);
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.set_len(end_of_first + (90 << 10)).unwrap();
        drop(f);
        let (mut log, _) = open(&dir);
        assert_eq!(log.durable(), &before);
        // The replica goes on from there: what it writes next follows the old log.
        log.write(&[entry(3, 2)], Some(hs(2, 0, 2))).unwrap();
        let expected = log.durable().clone();
        drop(log);
        let (log, _) = open(&dir);
        assert_eq!(log.durable(), &expected);
        assert_eq!(expected.entries.len(), 3);
    }

    #[test]
    fn a_torn_tail_recovers_the_durable_prefix() {
        let (_root, dir) = scratch();
        let (mut log, _) = open(&dir);
        log.write(&[entry(1, 1), entry(2, 1)], Some(hs(1, 1, 1)))
            .unwrap();
        let before = log.durable().clone();
        let end_of_first = log.log().written();
        log.write(&[entry(3, 1), entry(4, 1)], Some(hs(1, 1, 3)))
            .unwrap();
        let path = log.log().log_path();
        drop(log);
        // A crash tore the second round inside its second record: its sync mark is gone with
        // it, so nothing shows the cut bytes were synced.
        let first = round_records(None, &[entry(3, 1)], None);
        let first_frame = append_record(&mut Vec::new(), &first[0]).unwrap() as u64;
        let torn = end_of_first + first_frame + FRAME_HEADER_BYTES as u64 + 3;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(torn).unwrap();
        drop(file);
        let (log, recovered) = open(&dir);
        assert!(
            matches!(recovered.cut, Some(Cut::TornTail { offset, .. }) if offset == end_of_first + first_frame),
            "{:?}",
            recovered.cut
        );
        // The round's first entry survived, under the hard state from before.
        let mut expected = before;
        expected.entries.push(entry(3, 1));
        assert_eq!(log.durable(), &expected);
    }

    #[test]
    fn a_second_open_is_refused_locked() {
        let (_root, dir) = scratch();
        let (_log, _) = open(&dir);
        let error = ReplicaLog::open_with(&dir, LogOptions::default()).unwrap_err();
        assert!(
            matches!(error, ReplicaLogError::Log(LogError::Locked { .. })),
            "{error}"
        );
        assert!(error.is_refusal());
    }

    #[test]
    fn a_directorys_data_directory_is_refused() {
        let (_root, dir) = scratch();
        let (mut directory, _) = DurableLog::open(&dir).unwrap();
        directory
            .append(&LogRecord::EpochAdvanced {
                epoch: AuthorityEpoch(1),
            })
            .unwrap();
        directory.sync().unwrap();
        drop(directory);
        let error = ReplicaLog::open_with(&dir, LogOptions::default()).unwrap_err();
        assert!(
            matches!(&error, ReplicaLogError::Durable(ReplicaError::BadDurable(why)) if why.contains("not a replica's")),
            "{error}"
        );
        assert!(error.is_refusal());
    }

    #[test]
    fn an_oversized_round_is_refused_before_anything_is_written() {
        let (_root, dir) = scratch();
        let (mut log, _) = open(&dir);
        log.write(&[entry(1, 1)], None).unwrap();
        let (written, before) = (log.log().written(), log.durable().clone());
        let mut big = entry(3, 1);
        big.data = vec![7; LOG_RECORD_BYTES_MAX];
        let refused = log.write(&[entry(2, 1), big], None).unwrap_err();
        assert!(matches!(refused, LogError::TooLarge { .. }), "{refused}");
        assert_eq!(log.log().written(), written);
        assert_eq!(log.durable(), &before);
        assert!(!log.log().is_poisoned());
        log.write(&[entry(2, 1)], None).unwrap();
        drop(log);
        let (log, _) = open(&dir);
        assert_eq!(log.durable().entries, vec![entry(1, 1), entry(2, 1)]);
    }
}

//! Decision tests of the storage protocol on an in-memory file system: what recovery chooses,
//! what a compaction that dies at any step leaves, poisoning, a full disk, and when to compact.
//! The real-file tests (`dataplane_io::log`) cover the same protocol on the operating
//! system's files; the simulator runs it on a file system that loses and tears unsynced data.

use std::collections::BTreeMap;

use super::*;
use crate::ids::{Address, AuthorityEpoch, NodeId, Revision};
use crate::log::SnapshotRecord;

/// Files as byte vectors; an open file is its name and its position. Every change is durable
/// at once (the simulator models what is not).
#[derive(Debug, Default)]
struct MemFs {
    exists: bool,
    files: BTreeMap<String, Vec<u8>>,
    /// Room left on the disk, if limited.
    room: Option<usize>,
    /// Fail the step with this index (counting every `before`).
    fail_at: Option<usize>,
    steps: Vec<&'static str>,
    entropy: u128,
}

#[derive(Debug)]
struct MemError(FsErrorKind);

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

fn missing() -> MemError {
    MemError(FsErrorKind::NotFound)
}

/// An open file of [`MemFs`]: its name and its position.
type MemFile = (String, usize);

impl FileSystem for MemFs {
    type File = MemFile;
    type Error = MemError;
    type Path = String;

    fn path(&self, name: &str) -> String {
        format!("/d/{name}")
    }
    fn kind(error: &MemError) -> FsErrorKind {
        error.0
    }
    fn exists(&mut self) -> Result<bool, MemError> {
        Ok(self.exists)
    }
    fn create_dir(&mut self) -> Result<(), MemError> {
        self.exists = true;
        Ok(())
    }
    fn lock(&mut self) -> Result<bool, MemError> {
        Ok(true)
    }
    fn list(&mut self) -> Result<Vec<String>, MemError> {
        // Backwards, so that nothing depends on the listing's order.
        Ok(self.files.keys().rev().cloned().collect())
    }
    fn read(&mut self, name: &str) -> Result<Vec<u8>, MemError> {
        self.files.get(name).cloned().ok_or_else(missing)
    }
    fn len(&mut self, name: &str) -> Result<u64, MemError> {
        self.files
            .get(name)
            .map(|f| f.len() as u64)
            .ok_or_else(missing)
    }
    fn create(&mut self, name: &str) -> Result<MemFile, MemError> {
        self.files.insert(name.to_owned(), Vec::new());
        Ok((name.to_owned(), 0))
    }
    fn create_new(&mut self, name: &str) -> Result<MemFile, MemError> {
        if self.files.contains_key(name) {
            return Err(MemError(FsErrorKind::AlreadyExists));
        }
        self.create(name)
    }
    fn open(&mut self, name: &str) -> Result<MemFile, MemError> {
        let data = self.files.get(name).ok_or_else(missing)?;
        Ok((name.to_owned(), data.len()))
    }
    fn write(&mut self, file: &mut MemFile, bytes: &[u8]) -> Result<(), MemError> {
        let data = self.files.get_mut(file.0.as_str()).ok_or_else(missing)?;
        let end = file.1 + bytes.len();
        let growth = end.saturating_sub(data.len());
        if let Some(room) = &mut self.room {
            if *room < growth {
                return Err(MemError(FsErrorKind::NoSpace));
            }
            *room -= growth;
        }
        if growth > 0 {
            data.resize(end, 0);
        }
        data[file.1..end].copy_from_slice(bytes);
        file.1 = end;
        Ok(())
    }
    fn truncate(&mut self, file: &mut MemFile, len: u64) -> Result<(), MemError> {
        let data = self.files.get_mut(file.0.as_str()).ok_or_else(missing)?;
        data.truncate(len as usize);
        file.1 = len as usize;
        Ok(())
    }
    fn preallocate(&mut self, file: &mut MemFile, len: u64) -> Result<(), MemError> {
        let data = self.files.get_mut(file.0.as_str()).ok_or_else(missing)?;
        let growth = (len as usize).saturating_sub(data.len());
        if let Some(room) = &mut self.room {
            if *room < growth {
                return Err(MemError(FsErrorKind::NoSpace));
            }
            *room -= growth;
        }
        if growth > 0 {
            data.resize(len as usize, 0);
        }
        Ok(())
    }
    fn sync_data(&mut self, _: &mut MemFile) -> Result<(), MemError> {
        Ok(())
    }
    fn sync_all(&mut self, _: &mut MemFile) -> Result<(), MemError> {
        Ok(())
    }
    fn sync_file(&mut self, name: &str) -> Result<(), MemError> {
        self.open(name).map(drop)
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<(), MemError> {
        let data = self.files.remove(from).ok_or_else(missing)?;
        self.files.insert(to.to_owned(), data);
        Ok(())
    }
    fn remove(&mut self, name: &str) -> Result<(), MemError> {
        self.files.remove(name).map(drop).ok_or_else(missing)
    }
    fn sync_dir(&mut self) -> Result<(), MemError> {
        Ok(())
    }
    fn entropy(&mut self) -> Result<u128, MemError> {
        self.entropy += 0x9E37_79B9_7F4A_7C15;
        Ok(self.entropy)
    }
    fn before(&mut self, op: &'static str) -> Result<(), MemError> {
        if self.fail_at == Some(self.steps.len()) {
            return Err(MemError(FsErrorKind::Other));
        }
        self.steps.push(op);
        Ok(())
    }
}

type Store = LogStore<MemFs>;

fn record(i: u64) -> LogRecord {
    LogRecord::RetirementDone {
        source: Address::new(NodeId(2), 1, i),
    }
}

fn snapshot() -> Vec<LogRecord> {
    vec![
        LogRecord::Snapshot(SnapshotRecord::Header {
            epoch: AuthorityEpoch(3),
            next_revision: Revision(7),
        }),
        LogRecord::Snapshot(SnapshotRecord::NodeFloor {
            node: NodeId(4),
            incarnation: 2,
        }),
    ]
}

fn open(fs: &mut MemFs) -> Result<(Store, Recovered<String>), Error<MemFs>> {
    LogStore::open(fs, StorageOptions::default())
}

/// A directory with `n` records appended and synced in batches of three.
fn written(n: u64) -> (MemFs, Store, Vec<LogRecord>) {
    let mut fs = MemFs::default();
    let (mut log, _) = open(&mut fs).unwrap();
    let records: Vec<LogRecord> = (0..n).map(record).collect();
    for batch in records.chunks(3) {
        for r in batch {
            log.append(&mut fs, r).unwrap();
        }
        log.sync(&mut fs).unwrap();
    }
    (fs, log, records)
}

#[test]
fn recovery_reads_back_what_was_synced_whatever_the_listing_order() {
    let (mut fs, log, records) = written(10);
    assert_eq!(log.generation(), 0);
    let (_, recovered) = open(&mut fs).unwrap();
    assert_eq!(recovered.records, records);
    assert!(!recovered.created);
    assert_eq!(recovered.cut, None);
}

#[test]
fn a_torn_tail_is_cut_and_damage_under_a_mark_is_refused() {
    let (mut fs, _, records) = written(9);
    // A torn tail: half a frame after the last mark.
    let mut frame = Vec::new();
    crate::log::append_record(&mut frame, &record(99)).unwrap();
    let log = fs.files.get_mut("log-0").unwrap();
    let end = log.len();
    log.extend_from_slice(&frame[..frame.len() / 2]);
    let (_, recovered) = open(&mut fs).unwrap();
    assert_eq!(recovered.records, records);
    assert!(matches!(recovered.cut, Some(Cut::TornTail { offset, .. }) if offset == end as u64));
    assert_eq!(fs.files["log-0"].len(), end, "the cut is made");

    // A flipped bit in the first record: a mark after it proves it was synced.
    let before = fs.files.clone();
    fs.files.get_mut("log-0").unwrap()[LOG_HEADER_BYTES + 9] ^= 4;
    let damaged = fs.files.clone();
    let error = open(&mut fs).unwrap_err();
    assert!(
        matches!(error, StorageError::Damaged { offset, .. } if offset == LOG_HEADER_BYTES as u64),
        "{error}"
    );
    assert!(error.is_refusal() && error.is_repairable());
    assert_eq!(fs.files, damaged, "a refusal changes nothing");
    assert_ne!(fs.files, before);
}

#[test]
fn lost_files_are_refused_never_started_afresh() {
    for lost in ["identity", "snapshot-0", "log-0"] {
        let (mut fs, _, _) = written(4);
        fs.files.remove(lost);
        let error = open(&mut fs).unwrap_err();
        assert!(error.is_refusal(), "{lost}: {error}");
    }
    // Without `create`, an empty directory is loss too.
    let mut fs = MemFs::default();
    let options = StorageOptions {
        create: false,
        ..StorageOptions::default()
    };
    let error = LogStore::open(&mut fs, options).unwrap_err();
    assert!(matches!(error, StorageError::Lost { .. }), "{error}");
}

#[test]
fn a_compaction_that_dies_before_any_step_recovers_the_old_state_or_the_new() {
    let mut count = None;
    for fail in 0.. {
        let (mut fs, mut log, records) = written(6);
        let first = fs.steps.len();
        fs.fail_at = Some(first + fail);
        let result = log.compact(&mut fs, &snapshot());
        let steps = fs.steps.len() - first;
        fs.fail_at = None;
        if result.is_ok() {
            count = Some(fail);
            break;
        }
        assert!(log.is_poisoned());
        assert!(matches!(
            log.append(&mut fs, &record(1)),
            Err(StorageError::Poisoned)
        ));
        assert_eq!(fs.steps.len() - first, steps, "nothing after the failure");
        let (_, recovered) = open(&mut fs).unwrap();
        // Before the rename the old generation; after it the new one, whose snapshot holds
        // the same state.
        if recovered.generation == 0 {
            assert_eq!(recovered.records, records, "died before step {fail}");
        } else {
            assert_eq!(recovered.records, snapshot(), "died before step {fail}");
        }
        let names: Vec<&String> = fs.files.keys().collect();
        let generation = recovered.generation;
        assert_eq!(
            names,
            [
                &"identity".to_owned(),
                &format!("log-{generation}"),
                &format!("snapshot-{generation}")
            ]
        );
    }
    assert_eq!(count, Some(11), "a compaction has eleven steps");
}

#[test]
fn a_full_disk_or_a_failed_sync_poisons_the_log() {
    let (mut fs, mut log, _) = written(3);
    fs.room = Some(3);
    let error = log.append(&mut fs, &record(7)).unwrap_err();
    assert!(
        matches!(&error, StorageError::Io { source, .. } if source.0 == FsErrorKind::NoSpace),
        "{error}"
    );
    fs.room = None;
    assert!(matches!(
        log.append(&mut fs, &record(8)),
        Err(StorageError::Poisoned)
    ));
    assert!(matches!(log.sync(&mut fs), Err(StorageError::Poisoned)));

    let (mut fs, mut log, _) = written(3);
    log.append(&mut fs, &record(7)).unwrap();
    fs.fail_at = Some(fs.steps.len());
    assert!(matches!(
        log.sync(&mut fs),
        Err(StorageError::Io { op: "sync log", .. })
    ));
    fs.fail_at = None;
    let steps = fs.steps.len();
    assert!(matches!(log.sync(&mut fs), Err(StorageError::Poisoned)));
    assert_eq!(fs.steps.len(), steps, "a failed sync is never tried again");
}

#[test]
fn compaction_is_due_once_the_log_doubled_its_snapshot_and_is_synced() {
    let (mut fs, mut log, _) = written(30);
    let len = log.len_bytes();
    assert!(log.compaction_due(len));
    assert!(!log.compaction_due(len + 1), "below the minimum");
    log.append(&mut fs, &record(1)).unwrap();
    assert!(!log.compaction_due(0), "unsynced records");
    log.sync(&mut fs).unwrap();
    log.compact(&mut fs, &snapshot()).unwrap();
    let snapshot_bytes = fs.files["snapshot-1"].len() as u64;
    assert!(
        !log.compaction_due(0),
        "a fresh log is smaller than twice its snapshot"
    );
    while log.len_bytes() < 2 * snapshot_bytes {
        log.append(&mut fs, &record(2)).unwrap();
    }
    log.sync(&mut fs).unwrap();
    assert!(log.compaction_due(0));
}

/// The preallocation step of the tests below.
const STEP: u64 = 512;

fn open_preallocated(fs: &mut MemFs) -> Result<(Store, Recovered<String>), Error<MemFs>> {
    let options = StorageOptions {
        preallocate: STEP,
        ..StorageOptions::default()
    };
    LogStore::open(fs, options)
}

/// A preallocated log with `n` records appended and synced in batches of three, and the file
/// offset where each batch's records start.
fn preallocated(n: u64) -> (MemFs, Store, Vec<LogRecord>, Vec<usize>) {
    let mut fs = MemFs::default();
    let (mut log, _) = open_preallocated(&mut fs).unwrap();
    let records: Vec<LogRecord> = (0..n).map(record).collect();
    let mut starts = Vec::new();
    for batch in records.chunks(3) {
        starts.push(log.written() as usize);
        for r in batch {
            log.append(&mut fs, r).unwrap();
        }
        log.sync(&mut fs).unwrap();
    }
    (fs, log, records, starts)
}

#[test]
fn a_preallocated_log_grows_in_steps_of_zeros_and_reads_back_without_a_cut() {
    let (mut fs, log, records, _) = preallocated(40);
    let file = &fs.files["log-0"];
    assert_eq!(file.len() as u64, log.allocated());
    assert_eq!(file.len() as u64 % STEP, 0, "grown in steps");
    assert!(log.allocated() > log.written(), "zeros after the records");
    assert!(log.allocated() >= log.written() + MARK_BYTES as u64);
    assert!(file[log.written() as usize..].iter().all(|&b| b == 0));

    let scanned = scan(file, LogHeader::parse(file).unwrap().salt);
    assert_eq!(scanned.defect, None, "zeros are the end of the log");
    assert_eq!(scanned.valid_len as u64, log.written());
    assert_eq!(scanned.zero_tail as u64, log.allocated() - log.written());

    let written = log.written();
    let (mut log, recovered) = open_preallocated(&mut fs).unwrap();
    assert_eq!(recovered.records, records);
    assert_eq!(recovered.cut, None, "zeros are not a cut");
    assert_eq!(recovered.defect, None);
    assert_eq!(recovered.log_bytes, written);
    // Appends go on right after the last record, not after the zeros.
    log.append(&mut fs, &record(100)).unwrap();
    log.sync(&mut fs).unwrap();
    let (_, recovered) = open_preallocated(&mut fs).unwrap();
    assert_eq!(recovered.records.len(), records.len() + 1);
    assert_eq!(recovered.records.last(), Some(&record(100)));
    assert_eq!(recovered.cut, None);
}

#[test]
fn a_torn_record_inside_preallocated_space_is_cut() {
    let (mut fs, mut log, records, _) = preallocated(9);
    // An unsynced batch, torn: its first half reached the disk, the rest is still zeros.
    let start = log.written() as usize;
    let first = log.append(&mut fs, &record(50)).unwrap() as usize;
    log.append(&mut fs, &record(51)).unwrap();
    let end = log.written() as usize;
    let file = fs.files.get_mut("log-0").unwrap();
    let len = file.len();
    assert!(len > end, "the batch was written inside preallocated space");
    file[start + (first - start) / 2..].fill(0);
    let (_, recovered) = open_preallocated(&mut fs).unwrap();
    assert_eq!(recovered.records, records, "no record of the torn batch");
    assert!(
        matches!(recovered.cut, Some(Cut::TornTail { offset, bytes, .. })
            if offset == start as u64 && bytes == (len - start) as u64),
        "{:?}",
        recovered.cut
    );
    assert_eq!(fs.files["log-0"].len(), start, "the cut is made");

    // A single stray byte far into the zeros is a torn tail too, not the end of the log.
    let (mut fs, log, records, _) = preallocated(9);
    let file = fs.files.get_mut("log-0").unwrap();
    let last = file.len() - 1;
    assert!(last > log.written() as usize);
    file[last] = 1;
    let (_, recovered) = open_preallocated(&mut fs).unwrap();
    assert_eq!(recovered.records, records);
    assert!(
        matches!(recovered.cut, Some(Cut::TornTail { offset, .. }) if offset == log.written()),
        "{:?}",
        recovered.cut
    );
}

#[test]
fn damage_inside_synced_preallocated_data_is_refused() {
    let (mut fs, _, _, starts) = preallocated(9);
    for zeroed in [false, true] {
        let before = fs.files.clone();
        let file = fs.files.get_mut("log-0").unwrap();
        // The second batch's first record: a mark after it proves it was synced.
        let at = starts[1];
        if zeroed {
            // Zeros in the middle are damage, not the end of the log.
            file[at..at + 8].fill(0);
        } else {
            file[at + 9] ^= 4;
        }
        let damaged = fs.files.clone();
        let error = open_preallocated(&mut fs).unwrap_err();
        assert!(
            matches!(error, StorageError::Damaged { offset, .. } if offset == at as u64),
            "{error}"
        );
        assert_eq!(fs.files, damaged, "a refusal changes nothing");
        fs.files = before;
    }
}

#[test]
fn zeros_after_a_header_are_a_log_without_records() {
    // A first open that crashed after its log grew but before anything was written in it,
    // and before its identity: created anew, as with a log of only a header.
    let (mut fs, _, _, _) = preallocated(0);
    fs.files.remove("identity");
    fs.files
        .get_mut("log-0")
        .unwrap()
        .resize(LOG_HEADER_BYTES + STEP as usize, 0);
    let (_, recovered) = open_preallocated(&mut fs).unwrap();
    assert!(recovered.created);

    // With records in it, that log is loss, not a first open.
    let (mut fs, _, _, _) = preallocated(3);
    fs.files.remove("identity");
    let error = open_preallocated(&mut fs).unwrap_err();
    assert!(matches!(error, StorageError::Lost { .. }), "{error}");
}

#[test]
fn a_full_disk_while_growing_the_log_poisons_it() {
    let (mut fs, mut log, _, _) = preallocated(3);
    let room = (log.allocated() - log.written()) as usize;
    fs.room = Some(0);
    // Records that fit in the zeros need no room.
    let mut appended = 0;
    while log.written() + 40 < log.allocated() {
        log.append(&mut fs, &record(7)).unwrap();
        appended += 1;
    }
    assert!(appended > 0 && room > 0);
    let error = loop {
        match log.append(&mut fs, &record(8)) {
            Ok(_) => {}
            Err(error) => break error,
        }
    };
    assert!(
        matches!(&error, StorageError::Io { op: "preallocate log", source, .. }
            if source.0 == FsErrorKind::NoSpace),
        "{error}"
    );
    assert!(matches!(log.sync(&mut fs), Err(StorageError::Poisoned)));
}

#[test]
fn a_compaction_without_room_for_its_snapshot_is_postponed_and_the_log_goes_on() {
    let (mut fs, mut log, mut records) = written(30);
    let big: Vec<LogRecord> = (0..40).map(|i| record(100 + i)).collect();
    let image = snapshot_image(log.id(), 1, &big, LOG_RECORD_BYTES_MAX).unwrap();
    fs.room = Some(image.len() - 1);
    let before: Vec<String> = fs.files.keys().cloned().collect();
    let len = log.len_bytes();
    assert!(log.compaction_due(0));

    let outcome = log.compact(&mut fs, &big).unwrap();
    let Compacted::Postponed(error) = outcome else {
        panic!("compacted without room: {outcome:?}");
    };
    assert!(
        matches!(&error, StorageError::Io { op: "write snapshot temp", source, .. }
            if source.0 == FsErrorKind::NoSpace),
        "{error}"
    );
    let after: Vec<String> = fs.files.keys().cloned().collect();
    assert_eq!(after, before, "the snapshot's temporary file is removed");
    assert!(!log.is_poisoned());
    assert_eq!(log.generation(), 0);
    assert!(
        !log.compaction_due(0),
        "not due again before the log grew by the snapshot's size"
    );

    // The log goes on: what it takes now is durable and recovered.
    fs.room = None;
    while log.len_bytes() < len + image.len() as u64 {
        let r = record(500 + records.len() as u64);
        log.append(&mut fs, &r).unwrap();
        records.push(r);
    }
    log.sync(&mut fs).unwrap();
    assert!(log.compaction_due(0), "due again once the log grew by it");
    let (_, recovered) = open(&mut fs).unwrap();
    assert_eq!(recovered.records, records);
    assert_eq!(recovered.generation, 0);

    // With room, the same compaction happens.
    let (mut log, _) = open(&mut fs).unwrap();
    assert!(matches!(
        log.compact(&mut fs, &big).unwrap(),
        Compacted::Done
    ));
    let (_, recovered) = open(&mut fs).unwrap();
    assert_eq!(recovered.records, big);
}

#[test]
fn no_room_after_the_snapshot_is_in_place_still_poisons_the_log() {
    let (mut fs, mut log, _) = written(30);
    let snap = snapshot();
    let image = snapshot_image(log.id(), 1, &snap, LOG_RECORD_BYTES_MAX).unwrap();
    // Room for the snapshot, not for the new log's header.
    fs.room = Some(image.len());
    let error = log.compact(&mut fs, &snap).unwrap_err();
    assert!(
        matches!(&error, StorageError::Io { op: "write log header", source, .. }
            if source.0 == FsErrorKind::NoSpace),
        "{error}"
    );
    assert!(log.is_poisoned());
}

#[test]
fn the_space_gate_closes_before_the_reserve_is_gone_and_opens_when_room_returns() {
    use crate::time::{Duration, Instant};
    let (mut fs, mut log, records, _) = preallocated(3);
    let reserve = 2 * STEP;
    let retry = Duration::from_millis(100);
    let mut gate = SpaceGate::new(reserve, retry);
    let at = |ms: u64| Instant::ZERO.saturating_add(Duration::from_millis(ms));
    // Room: the gate grows the log to keep the reserve ahead of what is written.
    assert_eq!(gate.check(at(0), &mut log, &mut fs).unwrap(), Space::Room);
    assert!(log.room() >= reserve);
    // The disk fills: appends go on in the room the log has, and the gate closes once the
    // room falls below the reserve, before any append has met the full disk.
    fs.room = Some(0);
    let mut closed_at = None;
    for i in 0..1_000u64 {
        let space = gate.check(at(1), &mut log, &mut fs).unwrap();
        if !space.has_room() {
            assert_eq!(space, Space::Full);
            closed_at = Some(i);
            break;
        }
        log.append(&mut fs, &record(100 + i)).unwrap();
        log.sync(&mut fs).unwrap();
    }
    assert!(closed_at.is_some_and(|i| i > 0), "{closed_at:?}");
    assert!(gate.is_closed() && !log.is_poisoned());
    // What is still let through writes into the reserve.
    let kept = log.room();
    assert!(kept >= reserve - STEP, "{kept}");
    log.append(&mut fs, &record(9)).unwrap();
    log.sync(&mut fs).unwrap();
    // Closed, it waits `retry` between attempts, and opens once the disk has room again.
    assert_eq!(
        gate.check(at(50), &mut log, &mut fs).unwrap(),
        Space::StillFull
    );
    assert_eq!(
        gate.check(at(101), &mut log, &mut fs).unwrap(),
        Space::StillFull
    );
    fs.room = None;
    assert_eq!(
        gate.check(at(150), &mut log, &mut fs).unwrap(),
        Space::StillFull
    );
    assert_eq!(
        gate.check(at(201), &mut log, &mut fs).unwrap(),
        Space::Returned
    );
    assert!(log.room() >= reserve);
    assert_eq!(gate.check(at(202), &mut log, &mut fs).unwrap(), Space::Room);
    // Nothing was lost or cut: every record reads back.
    drop(log);
    let (_, recovered) = open_preallocated(&mut fs).unwrap();
    assert!(recovered.cut.is_none());
    assert!(recovered.records.len() > records.len());
    assert_eq!(recovered.records[..records.len()], records[..]);
}

#[test]
fn without_preallocation_the_gate_never_closes() {
    use crate::time::{Duration, Instant};
    let (mut fs, mut log, _) = written(3);
    fs.room = Some(0);
    let mut gate = SpaceGate::new(4096, Duration::from_millis(100));
    assert_eq!(
        gate.check(Instant::ZERO, &mut log, &mut fs).unwrap(),
        Space::Room
    );
}

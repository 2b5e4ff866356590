//! The log's unit tests: the round trip, compaction and its crash states, fail-stop, and the
//! recovery rules of the module documentation — torn tails cut, damage refused, repair, the
//! identity and format checks, and a power-loss harness that drops every unsynced byte.

use super::*;
use std::collections::BTreeMap;

use dataplane_core::ids::{Address, AuthorityEpoch, NodeId, Revision};
use dataplane_core::limits::LOG_RECORD_BYTES_MAX;
use dataplane_core::log::{
    FRAME_HEADER_BYTES, SnapshotRecord, TailDefect, append_record, encode_log,
};
use dataplane_core::storage::{IDENTITY, crc32c, snapshot_image};
use proptest::prelude::*;

const H: u64 = LOG_HEADER_BYTES as u64;
const M: u64 = MARK_BYTES as u64;

/// A fresh directory under the system temp dir, removed on drop. The log's data directory is
/// `data/` inside it (not created, so `open` creates it).
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let root = tempfile::Builder::new()
            .prefix(&format!("dataplane-io-log-{name}-"))
            .tempdir()
            .unwrap();
        Scratch(root)
    }

    fn data(&self) -> PathBuf {
        self.0.path().join("data")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.data().join(name)
    }

    /// The generation files: the lock and the identity are always there once a log was
    /// opened; the tests look at the rest.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .tree()
            .into_keys()
            .filter(|name| name != "lock" && name != IDENTITY)
            .collect();
        names.sort();
        names
    }

    /// Every file of the data directory and its bytes.
    fn tree(&self) -> BTreeMap<String, Vec<u8>> {
        fs::read_dir(self.data())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().into_string().unwrap();
                (name, fs::read(e.path()).unwrap())
            })
            .collect()
    }

    fn id(&self) -> DataDirId {
        parse_identity(&fs::read(self.file(IDENTITY)).unwrap()).unwrap()
    }

    fn read(&self, name: &str) -> Vec<u8> {
        fs::read(self.file(name)).unwrap()
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        fs::write(self.file(name), bytes).unwrap();
    }
}

fn record(i: u64) -> LogRecord {
    LogRecord::RetirementDone {
        source: Address::new(NodeId(2), 1, i),
    }
}

fn records(range: std::ops::Range<u64>) -> Vec<LogRecord> {
    range.map(record).collect()
}

fn frame_len(r: &LogRecord) -> u64 {
    let mut frame = Vec::new();
    append_record(&mut frame, r).unwrap() as u64
}

fn snapshot(floors: u64) -> Vec<LogRecord> {
    let mut records = vec![LogRecord::Snapshot(SnapshotRecord::Header {
        epoch: AuthorityEpoch(3),
        next_revision: Revision(7),
    })];
    records.extend((0..floors).map(|i| {
        LogRecord::Snapshot(SnapshotRecord::NodeFloor {
            node: NodeId(10 + i),
            incarnation: i,
        })
    }));
    records
}

fn open(scratch: &Scratch) -> (DurableLog, Recovered) {
    DurableLog::open(&scratch.data()).unwrap()
}

fn repair() -> LogOptions {
    LogOptions {
        create: true,
        repair: true,
        ..LogOptions::default()
    }
}

/// The preallocation step of the tests of preallocated logs.
const STEP: u64 = 16 << 10;

fn preallocated() -> LogOptions {
    LogOptions {
        preallocate: STEP,
        ..LogOptions::default()
    }
}

fn open_preallocated(scratch: &Scratch) -> (DurableLog, Recovered) {
    DurableLog::open_with(&scratch.data(), preallocated()).unwrap()
}

fn append_all(log: &mut DurableLog, records: &[LogRecord]) {
    for r in records {
        log.append(r).unwrap();
    }
}

fn concat(a: &[LogRecord], b: &[LogRecord]) -> Vec<LogRecord> {
    a.iter().chain(b).cloned().collect()
}

/// A log file image: a header and the framed records (no marks).
fn log_image(id: DataDirId, generation: u64, records: &[LogRecord]) -> Vec<u8> {
    let mut image = LogHeader {
        id,
        generation,
        salt: 99,
    }
    .encode();
    image.extend(encode_log(records).unwrap());
    image
}

/// Opens with `options`, expects a refusal, and checks that no file changed (but for an
/// empty `lock` file, created if there was none: the lock is taken before anything is read).
fn refused(scratch: &Scratch, options: LogOptions) -> LogError {
    let before = scratch.tree();
    let error = match DurableLog::open_with(&scratch.data(), options) {
        Ok((_, recovered)) => panic!("recovered {recovered:?}, expected a refusal"),
        Err(error) => error,
    };
    assert!(error.is_refusal(), "{error}");
    let mut after = scratch.tree();
    if !before.contains_key("lock") && after.get("lock").is_some_and(Vec::is_empty) {
        after.remove("lock");
    }
    assert_eq!(after, before, "{error}: a refusal changed files");
    error
}

#[test]
fn crc32c_matches_the_core_frames() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    let mut frame = Vec::new();
    append_record(&mut frame, &record(5)).unwrap();
    let stored = u32::from_le_bytes(frame[4..8].try_into().unwrap());
    assert_eq!(crc32c(&frame[FRAME_HEADER_BYTES..]), stored);
}

#[test]
fn a_new_directory_starts_at_generation_zero() {
    let scratch = Scratch::new("new");
    let (log, recovered) = open(&scratch);
    assert_eq!(recovered.records, []);
    assert_eq!(recovered.generation, 0);
    assert!(recovered.created);
    assert_eq!((log.written(), log.synced(), log.len_bytes()), (H, H, H));
    assert_eq!(scratch.names(), ["log-0", "snapshot-0"]);
    let id = scratch.id();
    assert_eq!((log.id(), recovered.id), (id, id));
    let header = LogHeader::parse(&scratch.read("log-0")).unwrap();
    assert_eq!((header.id, header.generation), (id, 0));
    assert_eq!(
        verify_snapshot(id, 0, &scratch.read("snapshot-0")),
        Ok(vec![])
    );
    drop(log);
    let (_, again) = open(&scratch);
    assert_eq!(again.generation, 0);
    assert_eq!(again.records, []);
    assert!(!again.created);
    assert_eq!(again.id, id, "the identity is written once");
    assert_eq!(again.removed, Vec::<PathBuf>::new());
    assert_eq!(again.cut, None);
}

#[test]
fn two_directories_get_different_ids() {
    let (a, b) = (Scratch::new("id-a"), Scratch::new("id-b"));
    drop(open(&a));
    drop(open(&b));
    assert_ne!(a.id(), b.id());
}

#[test]
fn appended_and_synced_records_come_back() {
    let scratch = Scratch::new("roundtrip");
    let (mut log, _) = open(&scratch);
    let recs = records(0..20);
    let image = encode_log(&recs).unwrap();
    let mut end = H;
    for r in &recs {
        let position = log.append(r).unwrap();
        assert!(position > end);
        end = position;
    }
    assert_eq!(end, H + image.len() as u64);
    assert_eq!((log.written(), log.synced()), (end, H));
    assert_eq!(log.sync().unwrap(), end + M, "the sync mark follows");
    assert_eq!(log.synced(), end + M);
    assert_eq!(log.sync().unwrap(), end + M, "a second sync is a no-op");
    drop(log);
    let bytes = scratch.read("log-0");
    assert_eq!(&bytes[LOG_HEADER_BYTES..end as usize], &image[..]);
    let salt = LogHeader::parse(&bytes).unwrap().salt;
    assert_eq!(&bytes[end as usize..], &mark(salt, end));
    let (log, recovered) = open(&scratch);
    assert_eq!(recovered.records, recs);
    assert_eq!(recovered.snapshot_records, 0);
    assert_eq!((recovered.cut_bytes, recovered.defect.clone()), (0, None));
    assert_eq!(recovered.log_bytes, end + M);
    assert_eq!(log.written(), end + M);
    assert_eq!(scratch.read("log-0"), bytes, "a clean log is left as it is");
}

#[test]
fn recovery_marks_what_a_crashed_process_wrote_without_syncing() {
    let scratch = Scratch::new("unsynced");
    let (mut log, _) = open(&scratch);
    append_all(&mut log, &records(0..3));
    let end = log.written();
    drop(log); // The process dies; the page cache keeps the records.
    let (log, recovered) = open(&scratch);
    assert_eq!(recovered.records, records(0..3));
    assert_eq!(
        log.written(),
        end + M,
        "recovery synced them and marked them"
    );
    drop(log);
    // Damage to them is now damage to synced records.
    let mut bytes = scratch.read("log-0");
    bytes[LOG_HEADER_BYTES + 2] ^= 1;
    scratch.write("log-0", &bytes);
    let error = refused(&scratch, LogOptions::default());
    assert!(matches!(error, LogError::Damaged { .. }), "{error}");
}

/// A log of three synced batches and a few records written after the last sync; returns the
/// records, the positions of the marks, and where the unsynced records start.
fn three_batches(scratch: &Scratch) -> (Vec<LogRecord>, Vec<u64>, u64) {
    let (mut log, _) = open(scratch);
    let mut marks = Vec::new();
    for batch in 0..3 {
        append_all(&mut log, &records(batch * 4..batch * 4 + 4));
        marks.push(log.sync().unwrap() - M);
    }
    let unsynced_from = log.written();
    append_all(&mut log, &records(12..15));
    (records(0..15), marks, unsynced_from)
}

#[test]
fn torn_tails_are_cut_and_reported() {
    let mut half = Vec::new();
    append_record(&mut half, &record(99)).unwrap();
    half.truncate(half.len() / 2);
    // (name, what follows the valid log, expected defect kind)
    type Tail = fn(&[u8]) -> Vec<u8>;
    let cases: Vec<(&str, Tail)> = vec![
        ("garbage", |_| vec![0xAB; 37]),
        // Zeros alone are the end of the log (preallocated space, tested below); zeros and
        // then anything else are not.
        ("zeros, then a byte", |_| {
            let mut zeros = vec![0; 4096];
            zeros[4000] = 1;
            zeros
        }),
        ("half a record", |_| {
            let mut half = Vec::new();
            append_record(&mut half, &record(99)).unwrap();
            half.truncate(half.len() / 2);
            half
        }),
        ("half a sync mark", |_| mark(1, 2)[..10].to_vec()),
        ("a mark of another file", |bytes| {
            mark(1, bytes.len() as u64).to_vec()
        }),
        ("a frame header claiming 64 KiB", |_| {
            let mut header = ((LOG_RECORD_BYTES_MAX) as u32).to_le_bytes().to_vec();
            header.extend_from_slice(&[0; 4]);
            header
        }),
    ];
    for (name, tail) in cases {
        let scratch = Scratch::new("torn");
        let (recs, marks, _) = three_batches(&scratch);
        let synced = records(0..12);
        // Only the synced part: the unsynced records are the subject of the next test.
        let mut bytes = scratch.read("log-0");
        let valid = marks[2] + M;
        bytes.truncate(valid as usize);
        let tail = tail(&bytes);
        bytes.extend_from_slice(&tail);
        scratch.write("log-0", &bytes);

        let (mut log, recovered) = open(&scratch);
        assert_eq!(recovered.records, synced, "{name}");
        assert_eq!(recovered.cut_bytes, tail.len() as u64, "{name}");
        match &recovered.cut {
            Some(Cut::TornTail {
                offset,
                bytes,
                synced_to,
                defect,
                ..
            }) => {
                assert_eq!((*offset, *bytes), (valid, tail.len() as u64), "{name}");
                assert_eq!(*synced_to, marks[2], "{name}");
                assert_eq!(defect.offset() as u64, valid, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(
            recovered.lost_bound(),
            0,
            "{name}: a torn tail was never synced, so it lost nothing acknowledged"
        );
        assert_eq!(
            fs::metadata(scratch.file("log-0")).unwrap().len(),
            valid,
            "{name}"
        );
        let note = recovered.notes(&scratch.data()).join("\n");
        assert!(
            note.contains("torn tail") && note.contains(&format!("byte {valid}")),
            "{note}"
        );
        log.append(&record(50)).unwrap();
        log.sync().unwrap();
        drop(log);
        let (_, again) = open(&scratch);
        assert_eq!(again.records, concat(&synced, &[record(50)]), "{name}");
        assert_eq!(again.cut, None, "{name}");
        drop(recs);
    }
}

/// After a power loss the unsynced bytes may come back in part, out of order: a later page
/// without an earlier one. Valid records after the hole were never synced, and are cut.
#[test]
fn a_hole_in_the_unsynced_tail_is_a_torn_tail_even_with_whole_records_after_it() {
    let scratch = Scratch::new("hole");
    let (_, marks, unsynced_from) = three_batches(&scratch);
    let mut bytes = scratch.read("log-0");
    let hole = unsynced_from as usize;
    bytes[hole..hole + 5].fill(0); // The first unsynced record's page did not make it.
    scratch.write("log-0", &bytes);
    let (_, recovered) = open(&scratch);
    assert_eq!(recovered.records, records(0..12));
    assert!(
        matches!(recovered.cut, Some(Cut::TornTail { offset, synced_to, .. })
        if offset == unsynced_from && synced_to == marks[2])
    );
}

/// A flipped bit anywhere before the last sync mark: the records after it were synced, so
/// recovery refuses and changes nothing.
#[test]
fn damage_before_a_sync_mark_is_refused() {
    let scratch = Scratch::new("damage");
    let (_, marks, unsynced_from) = three_batches(&scratch);
    let pristine = scratch.read("log-0");
    let first = H + frame_len(&record(0));
    let places = [
        ("a record of the first batch", first + 9),
        ("a length field", first + 1),
        ("a checksum field", first + 5),
        ("the first sync mark", marks[0] + 3),
        ("the magic of a sync mark", marks[1]),
        ("the last record of the last synced batch", marks[2] - 2),
    ];
    for (name, at) in places {
        let mut bytes = pristine.clone();
        bytes[at as usize] ^= 0x10;
        scratch.write("log-0", &bytes);
        let error = refused(&scratch, LogOptions::default());
        match &error {
            LogError::Damaged {
                path,
                offset,
                synced_past,
                ..
            } => {
                assert_eq!(path, &scratch.file("log-0"), "{name}");
                assert!(*offset <= at && at < offset + 64, "{name}: {error}");
                assert_eq!(*synced_past, marks[2], "{name}: the last mark");
            }
            other => panic!("{name}: {other}"),
        }
        assert!(error.is_repairable());
        let text = error.to_string();
        assert!(text.contains("log-0") && !text.contains('\n'), "{text}");
    }
    // The same flip after the last mark (in the unsynced records) is a torn tail.
    let mut bytes = pristine;
    bytes[unsynced_from as usize + 9] ^= 0x10;
    scratch.write("log-0", &bytes);
    let (_, recovered) = open(&scratch);
    assert_eq!(recovered.records, records(0..12));
    assert!(matches!(recovered.cut, Some(Cut::TornTail { .. })));
}

/// The one window: a flip in the last mark itself leaves nothing to say the bytes before it
/// were synced — but they are whole, so only the mark is cut.
#[test]
fn a_damaged_last_mark_cuts_only_itself() {
    let scratch = Scratch::new("last-mark");
    let (_, marks, _) = three_batches(&scratch);
    let mut bytes = scratch.read("log-0");
    bytes.truncate((marks[2] + M) as usize);
    bytes[marks[2] as usize + 20] ^= 1;
    scratch.write("log-0", &bytes);
    let (log, recovered) = open(&scratch);
    assert_eq!(recovered.records, records(0..12));
    assert_eq!(recovered.cut_bytes, M);
    assert_eq!(log.written(), marks[2] + M, "a fresh mark replaces it");
}

#[test]
fn repair_cuts_damage_and_keeps_a_copy() {
    let scratch = Scratch::new("repair");
    let (_, marks, _) = three_batches(&scratch);
    let mut bytes = scratch.read("log-0");
    // In the body of record 6 (batch 1 is records 4 to 7, after the first mark).
    let at = marks[0] + M + frame_len(&record(4)) + frame_len(&record(5)) + 9;
    bytes[at as usize] ^= 0x01;
    scratch.write("log-0", &bytes);
    let error = refused(&scratch, LogOptions::default());
    let LogError::Damaged { offset, .. } = error else {
        panic!("{error}")
    };
    let (mut log, recovered) = DurableLog::open_with(&scratch.data(), repair()).unwrap();
    assert_eq!(
        recovered.records,
        records(0..6),
        "the records before the damage"
    );
    let copy = scratch.file(&format!("log-0.cut-{offset}"));
    match &recovered.cut {
        Some(Cut::Repaired {
            offset: cut_at,
            bytes: cut,
            copy: Some(kept),
            ..
        }) => {
            assert_eq!(*cut_at, offset);
            assert_eq!(*cut, bytes.len() as u64 - offset);
            assert_eq!(kept, &copy);
        }
        other => panic!("{other:?}"),
    }
    // Every cut record took at least a byte: the cut bytes bound the records lost.
    assert_eq!(recovered.lost_bound(), bytes.len() as u64 - offset);
    assert_eq!(
        fs::read(&copy).unwrap(),
        &bytes[offset as usize..],
        "the copy"
    );
    let note = recovered.notes(&scratch.data()).join("\n");
    assert!(
        note.contains("repair") && note.contains(&copy.display().to_string()),
        "{note}"
    );
    assert_eq!(
        scratch.names(),
        ["log-0", &format!("log-0.cut-{offset}"), "snapshot-0"]
    );
    // The repaired log is a clean log: it appends, and opens without repair.
    log.append(&record(70)).unwrap();
    log.sync().unwrap();
    drop(log);
    let (_, again) = open(&scratch);
    assert_eq!(again.records, concat(&records(0..6), &[record(70)]));
    assert_eq!(again.cut, None);
    assert!(
        scratch.file(&format!("log-0.cut-{offset}")).exists(),
        "copies are kept"
    );
}

#[test]
fn a_missing_or_emptied_log_is_refused_and_repair_starts_it_empty() {
    for (name, damage) in [
        ("deleted", None),
        ("emptied", Some(Vec::new())),
        ("headerless", Some(vec![7; 100])),
        ("half a header", Some(vec![])),
    ] {
        for compacted in [false, true] {
            let scratch = Scratch::new("missing");
            let (mut log, _) = open(&scratch);
            if compacted {
                log.compact(&snapshot(2)).unwrap();
            }
            append_all(&mut log, &records(0..5));
            log.sync().unwrap();
            let generation = log.generation();
            drop(log);
            let file = format!("log-{generation}");
            let original = scratch.read(&file);
            let old = match damage.clone() {
                None => {
                    fs::remove_file(scratch.file(&file)).unwrap();
                    Vec::new()
                }
                Some(_) if name == "half a header" => original[..20].to_vec(),
                Some(bytes) => bytes,
            };
            if damage.is_some() {
                scratch.write(&file, &old);
            }
            let error = refused(&scratch, LogOptions::default());
            assert!(
                matches!(&error, LogError::MissingLog { path, .. } if *path == scratch.file(&file)),
                "{name}: {error}"
            );
            assert!(error.is_repairable());
            let (_, recovered) = DurableLog::open_with(&scratch.data(), repair()).unwrap();
            let base = if compacted { snapshot(2) } else { Vec::new() };
            assert_eq!(recovered.records, base, "{name}: the snapshot alone");
            let Some(Cut::Repaired { bytes, copy, .. }) = &recovered.cut else {
                panic!("{name}: {:?}", recovered.cut)
            };
            assert_eq!(*bytes, old.len() as u64, "{name}");
            // No bytes bound nothing: a missing or empty log counts as the most a log holds.
            let bound = if old.is_empty() {
                storage::LOST_UNKNOWN
            } else {
                old.len() as u64
            };
            assert_eq!(recovered.lost_bound(), bound, "{name}");
            match copy {
                Some(copy) => assert_eq!(fs::read(copy).unwrap(), old, "{name}"),
                None => assert!(old.is_empty(), "{name}"),
            }
            let (_, again) = open(&scratch);
            assert_eq!(again.records, base, "{name}: the repaired log opens");
        }
    }
}

#[test]
fn a_log_or_snapshot_from_another_directory_is_refused() {
    let (here, there) = (Scratch::new("here"), Scratch::new("there"));
    for s in [&here, &there] {
        let (mut log, _) = open(s);
        append_all(&mut log, &records(0..3));
        log.sync().unwrap();
    }
    let (ours, theirs) = (here.id(), there.id());
    for file in ["log-0", "snapshot-0", IDENTITY] {
        let saved = here.read(file);
        here.write(file, &there.read(file));
        let error = refused(&here, repair());
        match &error {
            LogError::Foreign {
                path,
                found,
                expected,
            } => {
                // A foreign identity makes our own files the strangers.
                let (stranger, id) = if file == IDENTITY {
                    ("snapshot-0", ours)
                } else {
                    (file, theirs)
                };
                assert_eq!(path, &here.file(stranger), "{file}");
                assert_eq!(*found, id, "{file}");
                assert_eq!(*expected, if file == IDENTITY { theirs } else { ours });
            }
            other => panic!("{file}: {other}"),
        }
        assert!(!error.is_repairable());
        assert!(error.to_string().contains("another data directory"));
        here.write(file, &saved);
    }
    assert_eq!(open(&here).1.records, records(0..3));
}

#[test]
fn an_unknown_format_version_is_refused() {
    for file in [IDENTITY, "snapshot-0", "log-0"] {
        let scratch = Scratch::new("version");
        drop(open(&scratch));
        let mut bytes = scratch.read(file);
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        scratch.write(file, &bytes);
        let error = refused(&scratch, repair());
        assert!(
            matches!(&error, LogError::UnknownVersion { path, version: 2 }
                if *path == scratch.file(file)),
            "{file}: {error}"
        );
        let text = error.to_string();
        assert!(
            text.contains("format version 2") && text.contains("reads version 1"),
            "{text}"
        );
    }
}

#[test]
fn a_directory_that_lost_its_identity_or_its_log_is_refused() {
    let must_exist = LogOptions {
        create: false,
        repair: true,
        ..LogOptions::default()
    };
    // The caller knows there was a log: an empty directory is not a new one.
    let scratch = Scratch::new("lost");
    fs::create_dir_all(scratch.data()).unwrap();
    let error = refused(&scratch, must_exist);
    assert!(matches!(error, LogError::Lost { .. }), "{error}");
    // Nor is a missing one (and it is not created).
    let missing = scratch.0.path().join("nowhere");
    let error = DurableLog::open_with(&missing, must_exist).unwrap_err();
    assert!(matches!(error, LogError::Lost { .. }), "{error}");
    assert!(!missing.exists());

    // The identity deleted.
    let (mut log, _) = open(&scratch);
    append_all(&mut log, &records(0..2));
    log.sync().unwrap();
    drop(log);
    let identity = scratch.read(IDENTITY);
    fs::remove_file(scratch.file(IDENTITY)).unwrap();
    let error = refused(&scratch, repair());
    assert!(
        matches!(&error, LogError::Lost { path, .. } if *path == scratch.file(IDENTITY)),
        "{error}"
    );
    // Everything but the identity deleted.
    scratch.write(IDENTITY, &identity);
    fs::remove_file(scratch.file("log-0")).unwrap();
    fs::remove_file(scratch.file("snapshot-0")).unwrap();
    let error = refused(&scratch, repair());
    assert!(matches!(error, LogError::Lost { .. }), "{error}");
    // A damaged identity.
    scratch.write(IDENTITY, &identity[..20]);
    let error = refused(&scratch, repair());
    assert!(matches!(error, LogError::Corrupt { .. }), "{error}");
}

#[test]
fn a_second_open_is_refused_before_it_reads_or_writes() {
    let scratch = Scratch::new("locked");
    let (log, _) = open(&scratch);
    let before = scratch.tree();
    let error = DurableLog::open_with(&scratch.data(), repair()).unwrap_err();
    assert!(matches!(error, LogError::Locked { .. }), "{error}");
    assert!(!error.is_refusal());
    assert_eq!(scratch.tree(), before);
    drop(log);
    drop(open(&scratch));
}

#[test]
fn compaction_then_reopen_is_the_snapshot_and_later_appends() {
    let scratch = Scratch::new("compact");
    let (mut log, _) = open(&scratch);
    append_all(&mut log, &records(0..10));
    log.sync().unwrap();
    let snap = snapshot(3);
    log.compact(&snap).unwrap();
    assert_eq!(log.generation(), 1);
    assert_eq!((log.written(), log.synced(), log.len_bytes()), (H, H, H));
    assert_eq!(scratch.names(), ["log-1", "snapshot-1"]);
    let header = LogHeader::parse(&scratch.read("log-1")).unwrap();
    assert_eq!((header.id, header.generation), (scratch.id(), 1));
    let later = records(100..104);
    append_all(&mut log, &later);
    log.sync().unwrap();
    drop(log);

    let (mut log, recovered) = open(&scratch);
    assert_eq!(recovered.records, concat(&snap, &later));
    assert_eq!(recovered.snapshot_records, snap.len());
    assert_eq!(recovered.generation, 1);

    // And once more, from a non-empty log.
    let snap2 = snapshot(5);
    log.compact(&snap2).unwrap();
    log.append(&record(200)).unwrap();
    log.sync().unwrap();
    drop(log);
    let (_, recovered) = open(&scratch);
    assert_eq!(recovered.records, concat(&snap2, &[record(200)]));
    assert_eq!(recovered.generation, 2);
    assert_eq!(scratch.names(), ["log-2", "snapshot-2"]);
}

#[test]
fn compaction_refuses_unsynced_records_without_poisoning() {
    let scratch = Scratch::new("unsynced-compact");
    let (mut log, _) = open(&scratch);
    log.append(&record(1)).unwrap();
    assert!(matches!(
        log.compact(&snapshot(1)),
        Err(LogError::Unsynced { synced: H, .. })
    ));
    assert!(!log.is_poisoned());
    log.sync().unwrap();
    log.compact(&snapshot(1)).unwrap();
    assert_eq!(log.generation(), 1);
}

/// Builds generation 0 with `old` records synced; returns the open log.
fn old_state(scratch: &Scratch, old: &[LogRecord]) -> DurableLog {
    let (mut log, _) = open(scratch);
    append_all(&mut log, old);
    log.sync().unwrap();
    log
}

/// The steps of one compaction, in order.
fn compaction_steps() -> Vec<&'static str> {
    let scratch = Scratch::new("steps");
    let mut log = old_state(&scratch, &records(0..3));
    let before = log.fs.faults.steps.len();
    log.compact(&snapshot(2)).unwrap();
    log.fs.faults.steps[before..].to_vec()
}

#[test]
fn a_full_disk_before_the_snapshot_is_in_place_postpones_the_compaction() {
    let steps = compaction_steps();
    let renamed = steps.iter().position(|s| *s == "rename snapshot").unwrap();
    let old = records(0..3);
    for (fail, step) in steps.iter().enumerate() {
        let scratch = Scratch::new("full-compact");
        let mut log = old_state(&scratch, &old);
        log.fs.faults.fail_at = Some(log.fs.faults.steps.len() + fail);
        log.fs.faults.no_room = true;
        let outcome = log.compact(&snapshot(2));
        log.fs.faults.fail_at = None;
        if fail > renamed || *step == "rename snapshot" {
            // The new generation may be in place: only stopping is safe.
            assert!(
                matches!(outcome, Err(LogError::Io { .. })),
                "{step}: {outcome:?}"
            );
            assert!(log.is_poisoned(), "{step}");
            continue;
        }
        assert!(
            matches!(&outcome, Ok(Compacted::Postponed(LogError::Io { op, .. })) if op == step),
            "{step}: {outcome:?}"
        );
        assert!(!log.is_poisoned(), "{step}");
        assert_eq!(scratch.names(), ["log-0", "snapshot-0"], "{step}");
        // The log goes on, and a reopen finds everything.
        log.append(&record(9)).unwrap();
        log.sync().unwrap();
        drop(log);
        let (_, recovered) = open(&scratch);
        let mut expected = old.clone();
        expected.push(record(9));
        assert_eq!(recovered.records, expected, "{step}");
        assert_eq!(recovered.generation, 0, "{step}");
    }
}

#[test]
fn a_crash_at_every_step_of_compaction_recovers_old_or_new_never_a_mix() {
    let steps = compaction_steps();
    assert_eq!(
        steps,
        [
            "create snapshot temp",
            "write snapshot temp",
            "sync snapshot temp",
            "rename snapshot",
            "create log",
            "write log header",
            "sync log",
            "sync directory",
            "remove old snapshot",
            "remove old log",
            "sync directory",
        ]
    );
    let renamed = steps.iter().position(|s| *s == "rename snapshot").unwrap();
    let old = records(0..3);
    let new = snapshot(2);
    for (fail, step) in steps.iter().enumerate() {
        let scratch = Scratch::new("crash-compact");
        let mut log = old_state(&scratch, &old);
        log.fs.faults.fail_at = Some(log.fs.faults.steps.len() + fail);
        let error = log.compact(&new).unwrap_err();
        assert!(matches!(error, LogError::Io { .. }), "{error}");
        assert!(log.is_poisoned());
        // The process stops here: the directory stays as the failed step left it.
        drop(log);
        let (mut log, recovered) = open(&scratch);
        let expect_new = fail > renamed;
        if expect_new {
            assert_eq!(recovered.records, new, "failed before {step}");
            assert_eq!(recovered.generation, 1);
            assert_eq!(scratch.names(), ["log-1", "snapshot-1"]);
        } else {
            assert_eq!(recovered.records, old, "failed before {step}");
            assert_eq!(recovered.generation, 0);
            assert_eq!(scratch.names(), ["log-0", "snapshot-0"]);
        }
        assert_eq!(recovered.cut, None, "failed before {step}");
        // The recovered log works.
        log.append(&record(9)).unwrap();
        log.sync().unwrap();
        drop(log);
        let (_, again) = open(&scratch);
        let base = if expect_new { &new } else { &old };
        assert_eq!(again.records, concat(base, &[record(9)]));
    }
}

/// The directory left by hand in each state a crash (or a storage that reorders a rename
/// before the data) can leave during compaction from generation 0 to 1.
#[test]
fn hand_made_intermediate_states_recover_old_or_new() {
    let old = records(0..4);
    let new = snapshot(3);
    let after = records(40..42);

    struct Case {
        name: &'static str,
        files: Vec<(&'static str, Vec<u8>)>,
        old_gen_removed: bool,
        expect: Option<(u64, Vec<LogRecord>)>,
    }
    // One scratch directory per case (built again for each: the id differs).
    let count = 15;
    for index in 0..count {
        let scratch = Scratch::new("by-hand");
        drop(old_state(&scratch, &old));
        let id = scratch.id();
        let image = snapshot_image(id, 1, &new, LOG_RECORD_BYTES_MAX).unwrap();
        let after_image = log_image(id, 1, &after);
        let header_only = log_image(id, 1, &[]);
        let half = image[..image.len() / 2].to_vec();
        let no_marker = image[..image.len() - SNAPSHOT_TRAILER_BYTES].to_vec();
        let mut hole = image.clone();
        hole[50..70].fill(0);
        let mut header_hole = image.clone();
        header_hole[10..30].fill(0);
        let wrong_generation = snapshot_image(id, 7, &new, LOG_RECORD_BYTES_MAX).unwrap();
        let old_case = |name, files, expect| Case {
            name,
            files,
            old_gen_removed: false,
            expect,
        };
        let cases = vec![
            old_case(
                "partial temp",
                vec![("snapshot-1.tmp", half.clone())],
                Some((0, old.clone())),
            ),
            old_case(
                "complete temp, not renamed",
                vec![("snapshot-1.tmp", image.clone())],
                Some((0, old.clone())),
            ),
            old_case(
                "renamed, no new log",
                vec![("snapshot-1", image.clone())],
                Some((1, new.clone())),
            ),
            old_case(
                "renamed, empty new log",
                vec![("snapshot-1", image.clone()), ("log-1", Vec::new())],
                Some((1, new.clone())),
            ),
            old_case(
                "renamed, half a header in the new log",
                vec![
                    ("snapshot-1", image.clone()),
                    ("log-1", header_only[..30].to_vec()),
                ],
                Some((1, new.clone())),
            ),
            old_case(
                "renamed, new log synced, directory not",
                vec![
                    ("snapshot-1", image.clone()),
                    ("log-1", header_only.clone()),
                ],
                Some((1, new.clone())),
            ),
            Case {
                name: "new generation with records, old one half removed",
                files: vec![
                    ("snapshot-1", image.clone()),
                    ("log-1", after_image.clone()),
                ],
                old_gen_removed: true,
                expect: Some((1, concat(&new, &after))),
            },
            old_case(
                "renamed before its data: half a snapshot, empty new log",
                vec![("snapshot-1", half.clone()), ("log-1", Vec::new())],
                Some((0, old.clone())),
            ),
            old_case(
                "renamed before its data: half a snapshot, a header-only new log",
                vec![("snapshot-1", half.clone()), ("log-1", header_only)],
                Some((0, old.clone())),
            ),
            old_case(
                "renamed before its data: no end marker",
                vec![("snapshot-1", no_marker)],
                Some((0, old.clone())),
            ),
            old_case(
                "renamed before its data: a hole",
                vec![("snapshot-1", hole.clone())],
                Some((0, old.clone())),
            ),
            old_case(
                "renamed before its data: a hole in the header",
                vec![("snapshot-1", header_hole)],
                Some((0, old.clone())),
            ),
            old_case(
                "a snapshot of another generation",
                vec![("snapshot-1", wrong_generation)],
                Some((0, old.clone())),
            ),
            old_case(
                "incomplete snapshot with records appended after it",
                vec![("snapshot-1", hole), ("log-1", after_image)],
                None,
            ),
            Case {
                name: "incomplete snapshot and the old generation gone",
                files: vec![("snapshot-1", half)],
                old_gen_removed: true,
                expect: None,
            },
        ];
        assert_eq!(cases.len(), count);
        let case = cases.into_iter().nth(index).unwrap();
        if case.old_gen_removed {
            fs::remove_file(scratch.file("snapshot-0")).unwrap();
        }
        for (name, bytes) in &case.files {
            scratch.write(name, bytes);
        }
        let before = scratch.tree();
        match (DurableLog::open(&scratch.data()), case.expect) {
            (Ok((_, recovered)), Some((generation, records))) => {
                assert_eq!(recovered.generation, generation, "{}", case.name);
                assert_eq!(recovered.records, records, "{}", case.name);
                assert_eq!(recovered.cut, None, "{}", case.name);
                let files = [
                    format!("log-{generation}"),
                    format!("snapshot-{generation}"),
                ];
                assert_eq!(scratch.names(), files, "{}", case.name);
                let discarded = case.files.iter().any(|(n, _)| *n == "snapshot-1");
                assert_eq!(
                    recovered.discarded_generation,
                    (discarded && generation == 0).then_some(1),
                    "{}",
                    case.name
                );
            }
            (Err(error), None) => {
                assert!(matches!(error, LogError::Corrupt { .. }), "{}", case.name);
                assert_eq!(scratch.tree(), before, "{}: nothing changed", case.name);
            }
            (result, expect) => panic!(
                "{}: got {:?}, expected {expect:?}",
                case.name,
                result.map(|(_, r)| r)
            ),
        }
    }
}

#[test]
fn a_log_without_any_snapshot_or_identity_is_refused() {
    let scratch = Scratch::new("orphan");
    fs::create_dir_all(scratch.data()).unwrap();
    scratch.write("log-3", &log_image(DataDirId(5), 3, &records(0..2)));
    let error = refused(&scratch, LogOptions::default());
    assert!(matches!(error, LogError::Lost { .. }), "{error}");
    assert_eq!(scratch.names(), ["log-3"]);
}

#[test]
fn a_first_open_that_crashed_starts_again() {
    let id = DataDirId(7);
    let image = snapshot_image(id, 0, &[], LOG_RECORD_BYTES_MAX).unwrap();
    let header = log_image(id, 0, &[]);
    for files in [
        vec![("snapshot-0.tmp", image[..5].to_vec())],
        vec![("snapshot-0", image[..5].to_vec())],
        vec![("snapshot-0", image.clone())],
        vec![
            ("snapshot-0", image.clone()),
            ("log-0", header[..9].to_vec()),
        ],
        vec![("snapshot-0", image.clone()), ("log-0", header.clone())],
        vec![
            ("snapshot-0", image.clone()),
            ("log-0", header.clone()),
            ("identity.tmp", vec![1]),
        ],
    ] {
        let scratch = Scratch::new("first-open");
        fs::create_dir_all(scratch.data()).unwrap();
        for (name, bytes) in &files {
            scratch.write(name, bytes);
        }
        let (_, recovered) = open(&scratch);
        assert!(recovered.created, "{files:?}");
        assert_eq!((recovered.generation, recovered.records), (0, Vec::new()));
        assert_eq!(scratch.names(), ["log-0", "snapshot-0"]);
        let new = scratch.id();
        assert_ne!(new, id, "a new id");
        assert_eq!(
            verify_snapshot(new, 0, &scratch.read("snapshot-0")),
            Ok(vec![])
        );
    }
    // A generation 0 with records is not a crashed first open.
    let scratch = Scratch::new("first-open-records");
    fs::create_dir_all(scratch.data()).unwrap();
    scratch.write("snapshot-0", &image);
    scratch.write("log-0", &log_image(id, 0, &records(0..1)));
    let error = refused(&scratch, LogOptions::default());
    assert!(matches!(error, LogError::Lost { .. }), "{error}");
}

#[test]
fn unknown_files_are_left_alone() {
    let scratch = Scratch::new("unknown");
    fs::create_dir_all(scratch.data()).unwrap();
    for name in [
        "README",
        "log-01",
        "log-x",
        "snapshot-+1",
        "log-0.cut-5",
        "identity.bak",
    ] {
        scratch.write(name, b"x");
    }
    let (_, recovered) = open(&scratch);
    assert_eq!(recovered.generation, 0);
    assert_eq!(
        scratch.names(),
        [
            "README",
            "identity.bak",
            "log-0",
            "log-0.cut-5",
            "log-01",
            "log-x",
            "snapshot-+1",
            "snapshot-0"
        ]
    );
}

#[test]
fn a_failed_write_poisons_the_log() {
    let scratch = Scratch::new("poison-write");
    let (mut log, _) = open(&scratch);
    let synced = records(0..3);
    append_all(&mut log, &synced);
    log.sync().unwrap();
    log.fs.faults.fail_at = Some(log.fs.faults.steps.len());
    let error = log.append(&record(3)).unwrap_err();
    assert!(
        matches!(
            error,
            LogError::Io {
                op: "write log",
                ..
            }
        ),
        "{error}"
    );
    assert!(log.is_poisoned());
    log.fs.faults.fail_at = None;
    assert!(matches!(log.append(&record(4)), Err(LogError::Poisoned)));
    assert!(matches!(log.sync(), Err(LogError::Poisoned)));
    assert!(matches!(log.compact(&snapshot(1)), Err(LogError::Poisoned)));
    drop(log);
    // What a failed write may leave: part of the record.
    let mut frame = Vec::new();
    append_record(&mut frame, &record(3)).unwrap();
    let mut file = OpenOptions::new()
        .append(true)
        .open(scratch.file("log-0"))
        .unwrap();
    file.write_all(&frame[..frame.len() - 1]).unwrap();
    drop(file);
    let (_, recovered) = open(&scratch);
    assert_eq!(recovered.records, synced);
    assert_eq!(recovered.cut_bytes, frame.len() as u64 - 1);
}

#[test]
fn a_failed_sync_poisons_the_log_and_is_never_retried() {
    let scratch = Scratch::new("poison-sync");
    let (mut log, _) = open(&scratch);
    append_all(&mut log, &records(0..3));
    log.fs.faults.fail_at = Some(log.fs.faults.steps.len());
    let error = log.sync().unwrap_err();
    assert!(
        matches!(error, LogError::Io { op: "sync log", .. }),
        "{error}"
    );
    assert_eq!(log.synced(), H);
    log.fs.faults.fail_at = None;
    let steps = log.fs.faults.steps.len();
    assert!(matches!(log.sync(), Err(LogError::Poisoned)));
    assert!(matches!(log.append(&record(9)), Err(LogError::Poisoned)));
    assert!(matches!(log.compact(&[]), Err(LogError::Poisoned)));
    assert_eq!(
        log.fs.faults.steps.len(),
        steps,
        "no file-system step after poisoning"
    );
    assert_eq!(
        log.written(),
        log.len_bytes(),
        "positions do not move after poisoning"
    );
}

#[test]
fn a_failed_sync_mark_poisons_the_log() {
    let scratch = Scratch::new("poison-mark");
    let (mut log, _) = open(&scratch);
    append_all(&mut log, &records(0..3));
    log.fs.faults.fail_at = Some(log.fs.faults.steps.len() + 1);
    let error = log.sync().unwrap_err();
    assert!(
        matches!(
            error,
            LogError::Io {
                op: "write sync mark",
                ..
            }
        ),
        "{error}"
    );
    assert!(log.is_poisoned());
    drop(log);
    assert_eq!(
        open(&scratch).1.records,
        records(0..3),
        "synced all the same"
    );
}

#[test]
fn a_too_large_record_is_refused_without_poisoning() {
    let scratch = Scratch::new("too-large");
    let (mut log, _) = open(&scratch);
    log.append(&record(1)).unwrap();
    let mut frame = Vec::new();
    let size = append_record(&mut frame, &record(2)).unwrap() - FRAME_HEADER_BYTES;
    // No valid record reaches the core's 64 KiB limit; lower it to exercise the refusal.
    log.store.set_record_limit(size - 1);
    let before = log.written();
    let error = log.append(&record(2)).unwrap_err();
    assert!(
        matches!(error, LogError::TooLarge { len, max } if len == size && max == size - 1),
        "{error}"
    );
    assert!(matches!(
        log.compact(&[record(2)]),
        Err(LogError::Unsynced { .. })
    ));
    log.sync().unwrap();
    assert!(matches!(
        log.compact(&[record(2)]),
        Err(LogError::TooLarge { .. })
    ));
    assert!(!log.is_poisoned());
    assert_eq!(log.written(), before + M);
    assert_eq!(
        fs::metadata(scratch.file("log-0")).unwrap().len(),
        before + M
    );
    assert_eq!(
        scratch.names(),
        ["log-0", "snapshot-0"],
        "no snapshot written"
    );
    log.store.set_record_limit(LOG_RECORD_BYTES_MAX);
    log.append(&record(3)).unwrap();
    log.sync().unwrap();
    drop(log);
    let (_, recovered) = open(&scratch);
    assert_eq!(recovered.records, [record(1), record(3)]);
}

#[test]
fn errors_display_on_one_line() {
    let path = || PathBuf::from("/x/log-0");
    let errors = [
        LogError::Io {
            op: "sync log",
            path: path(),
            source: io::Error::other("boom"),
        },
        LogError::Locked { path: path() },
        LogError::Damaged {
            path: path(),
            offset: 100,
            defect: TailDefect::Checksum { offset: 100 },
            synced_past: 300,
        },
        LogError::MissingLog {
            path: path(),
            reason: "is missing".to_owned(),
        },
        LogError::Lost {
            path: path(),
            reason: "r".to_owned(),
        },
        LogError::Foreign {
            path: path(),
            found: DataDirId(1),
            expected: DataDirId(2),
        },
        LogError::UnknownVersion {
            path: path(),
            version: 9,
        },
        LogError::Corrupt {
            path: PathBuf::from("/x"),
            reason: "r".to_owned(),
        },
        LogError::TooLarge { len: 9, max: 8 },
        LogError::Encode("e".to_owned()),
        LogError::Unsynced {
            written: 2,
            synced: 1,
        },
        LogError::Poisoned,
    ];
    for error in errors {
        let text = error.to_string();
        assert!(text.starts_with("log: ") && !text.contains('\n'), "{text}");
    }
    let damaged = LogError::Damaged {
        path: path(),
        offset: 100,
        defect: TailDefect::Checksum { offset: 100 },
        synced_past: 300,
    };
    assert_eq!(
        damaged.to_string(),
        "log: /x/log-0 is damaged at byte 100 (checksum mismatch at byte 100), but it was synced \
         up to byte 300: the records after the damage were acknowledged, and cutting the log \
         there would lose them"
    );
    let io = LogError::Io {
        op: "sync log",
        path: path(),
        source: io::Error::other("boom"),
    };
    assert_eq!(io.to_string(), "log: sync log failed on /x/log-0: boom");
    assert!(std::error::Error::source(&io).is_some());
}

/// How a power loss leaves the bytes written after the last successful sync.
#[derive(Clone, Debug)]
enum Loss {
    /// All of them reached the disk (what a process crash leaves).
    Kept,
    /// None did.
    Dropped,
    /// The first `n` did (the file was cut there).
    Prefix(usize),
    /// The file has its full length, the unsynced part reads as zeros.
    Zeros,
    /// The unsynced part reads as whatever the blocks held before.
    Garbage(u8),
    /// Each 512-byte sector of the unsynced part made it or reads as zeros (in any order).
    Sectors(Vec<bool>),
}

fn loss() -> impl Strategy<Value = Loss> {
    prop_oneof![
        Just(Loss::Kept),
        Just(Loss::Dropped),
        (0..4000usize).prop_map(Loss::Prefix),
        Just(Loss::Zeros),
        any::<u8>().prop_map(Loss::Garbage),
        proptest::collection::vec(any::<bool>(), 1..12).prop_map(Loss::Sectors),
    ]
}

impl Loss {
    /// The file after the power loss: the durable bytes, then what became of the rest.
    fn apply(&self, file: &[u8], durable: usize) -> Vec<u8> {
        let mut out = file.to_vec();
        match self {
            Loss::Kept => {}
            Loss::Dropped => out.truncate(durable),
            Loss::Prefix(n) => out.truncate(durable + n.min(&(file.len() - durable))),
            Loss::Zeros => out[durable..].fill(0),
            Loss::Garbage(seed) => {
                for (i, b) in out[durable..].iter_mut().enumerate() {
                    *b = seed
                        .wrapping_mul(31)
                        .wrapping_add((i as u8).wrapping_mul(17));
                }
            }
            Loss::Sectors(kept) => {
                for (i, b) in out.iter_mut().enumerate().skip(durable) {
                    if !kept[(i / 512) % kept.len()] {
                        *b = 0;
                    }
                }
            }
        }
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The power-loss harness: appends and syncs at random, then drops or mangles every byte
    /// not covered by a successful sync, the way a disk may after a power loss. Recovery must
    /// never refuse it, must keep every synced record, and may keep only a prefix of the rest.
    #[test]
    fn a_power_loss_never_loses_a_synced_record_and_is_never_refused(
        batches in proptest::collection::vec((1..8u64, any::<bool>()), 1..8),
        loss in loss(),
    ) {
        let scratch = Scratch::new("power");
        let (mut log, _) = open(&scratch);
        let mut appended = Vec::new();
        let mut synced_records = 0;
        let mut durable = LOG_HEADER_BYTES;
        for (count, sync) in batches {
            for _ in 0..count {
                let r = record(appended.len() as u64);
                log.append(&r).unwrap();
                appended.push(r);
            }
            if sync {
                // The sync's mark is written after it: not durable.
                durable = (log.sync().unwrap() - M) as usize;
                synced_records = appended.len();
            }
        }
        drop(log);
        let file = scratch.read("log-0");
        scratch.write("log-0", &loss.apply(&file, durable));
        let (_, recovered) = DurableLog::open(&scratch.data())
            .unwrap_or_else(|e| panic!("{loss:?}: {e}"));
        prop_assert!(recovered.records.len() >= synced_records, "a synced record was lost");
        prop_assert_eq!(&recovered.records[..], &appended[..recovered.records.len()]);
        let torn_or_nothing = matches!(recovered.cut, None | Some(Cut::TornTail { .. }));
        prop_assert!(torn_or_nothing, "{:?}", recovered.cut);
    }

    /// The converse: after a process crash (every byte kept), one flipped byte anywhere in the
    /// records or marks before the last sync mark is refused, and changes nothing.
    #[test]
    fn damage_to_anything_a_mark_covers_is_refused(
        batches in proptest::collection::vec(1..6u64, 1..6),
        place in any::<proptest::sample::Index>(),
        mask in 1..=255u8,
    ) {
        let scratch = Scratch::new("flip");
        let (mut log, _) = open(&scratch);
        let mut n = 0;
        let mut last_mark = 0;
        for count in batches {
            for _ in 0..count {
                log.append(&record(n)).unwrap();
                n += 1;
            }
            last_mark = log.sync().unwrap() - M;
        }
        drop(log);
        let mut bytes = scratch.read("log-0");
        let at = LOG_HEADER_BYTES + place.index(last_mark as usize - LOG_HEADER_BYTES);
        bytes[at] ^= mask;
        scratch.write("log-0", &bytes);
        let error = refused(&scratch, LogOptions::default());
        prop_assert!(
            matches!(error, LogError::Damaged { offset, synced_past, .. }
                if offset as usize <= at && synced_past == last_mark),
            "{}", error
        );
    }
}

/// Three synced batches of four records in a preallocated log, then three unsynced records;
/// the positions of the marks and where the unsynced records start.
fn three_preallocated_batches(scratch: &Scratch) -> (Vec<u64>, u64, u64) {
    let (mut log, _) = open_preallocated(scratch);
    let mut marks = Vec::new();
    for batch in 0..3 {
        append_all(&mut log, &records(batch * 4..batch * 4 + 4));
        marks.push(log.sync().unwrap() - M);
    }
    let unsynced_from = log.written();
    append_all(&mut log, &records(12..15));
    (marks, unsynced_from, log.written())
}

#[test]
fn a_preallocated_log_is_zeros_after_its_records_and_recovers_without_a_cut() {
    let scratch = Scratch::new("prealloc");
    let (mut log, _) = open_preallocated(&scratch);
    append_all(&mut log, &records(0..4));
    let synced = log.sync().unwrap();
    let len = fs::metadata(scratch.file("log-0")).unwrap().len();
    assert_eq!(len, STEP, "the file grew by a whole step");
    let bytes = scratch.read("log-0");
    assert!(bytes[synced as usize..].iter().all(|&b| b == 0));
    drop(log);

    let (mut log, recovered) = open_preallocated(&scratch);
    assert_eq!(recovered.records, records(0..4));
    assert_eq!(
        recovered.cut, None,
        "zeros are the end of the log, not a cut"
    );
    assert_eq!(recovered.defect, None);
    assert_eq!(recovered.log_bytes, synced);
    // Appends go on right after the records; the file grows again.
    append_all(&mut log, &records(4..6));
    log.sync().unwrap();
    assert_eq!(fs::metadata(scratch.file("log-0")).unwrap().len(), STEP);
    drop(log);
    // Also read without preallocation (the option only says how the file grows).
    let (_, recovered) = open(&scratch);
    assert_eq!(recovered.records, records(0..6));
    assert_eq!(recovered.cut, None);
}

#[test]
fn a_torn_record_inside_preallocated_space_is_cut() {
    let scratch = Scratch::new("prealloc-torn");
    let (marks, unsynced_from, end) = three_preallocated_batches(&scratch);
    let mut bytes = scratch.read("log-0");
    assert!(
        bytes.len() as u64 > end,
        "written inside preallocated space"
    );
    // Half of the first unsynced record reached the disk; the rest reads as the zeros.
    let half = (unsynced_from + frame_len(&record(12)) / 2) as usize;
    bytes[half..].fill(0);
    let len = bytes.len() as u64;
    scratch.write("log-0", &bytes);
    let (_, recovered) = open_preallocated(&scratch);
    assert_eq!(recovered.records, records(0..12));
    match &recovered.cut {
        Some(Cut::TornTail {
            offset,
            bytes,
            synced_to,
            ..
        }) => {
            assert_eq!((*offset, *bytes), (unsynced_from, len - unsynced_from));
            assert_eq!(*synced_to, marks[2]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fs::metadata(scratch.file("log-0")).unwrap().len(),
        unsynced_from,
        "cut at the torn record"
    );
}

#[test]
fn damage_inside_synced_preallocated_data_is_refused() {
    let scratch = Scratch::new("prealloc-damage");
    let (marks, _, _) = three_preallocated_batches(&scratch);
    let pristine = scratch.read("log-0");
    let first = H + frame_len(&record(0));
    for (name, at, zero) in [
        ("a flipped bit in the first batch", first + 9, false),
        (
            "a zeroed page start in the second batch",
            marks[0] + M,
            true,
        ),
    ] {
        let mut bytes = pristine.clone();
        if zero {
            bytes[at as usize..at as usize + 8].fill(0);
        } else {
            bytes[at as usize] ^= 0x10;
        }
        scratch.write("log-0", &bytes);
        let error = refused(&scratch, preallocated());
        match &error {
            LogError::Damaged {
                offset,
                synced_past,
                ..
            } => {
                assert!(*offset <= at && at < offset + 64, "{name}: {error}");
                assert_eq!(*synced_past, marks[2], "{name}: the last mark");
            }
            other => panic!("{name}: {other}"),
        }
    }
}

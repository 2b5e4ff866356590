//! `log_recover`: log images into `decode_log` and recovery.
//!
//! The first input byte picks the mode:
//!
//! * even: the rest is a raw log image (arbitrary bytes);
//! * odd: the rest is structured: an operation sequence drives a directory (its `Persist`
//!   records are the log, optionally compacted to its snapshot), the log is framed with
//!   `encode_log` and then corrupted (flips, truncations, insertions, removals, overwrites).
//!
//! Properties, for every image:
//!
//! * `decode_log` never panics and cuts at the first bad frame: `valid_len` ends the image
//!   exactly when there is no defect, a defect sits at `valid_len` and is the defect the frame
//!   there really has (re-checked here from the framing rules), and re-decoding the valid
//!   prefix yields the same records with no defect; the records re-encode to an image that
//!   decodes to them again;
//! * for a corrupted valid log: every record whose frame ends before the first changed byte is
//!   decoded unchanged, and an untouched image decodes to the whole log;
//! * recovery never panics; it may refuse an inconsistent record sequence with a typed
//!   `RecoveryError` (whose index is the first record `DurableState::apply` refuses), but a
//!   prefix of a real log always recovers; a recovered directory holds its invariants, its
//!   durable state is the replay of the records plus its new epoch, its own log (records plus
//!   the new epoch) recovers again, and so does its snapshot, to the same durable state.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use dataplane_core::directory::{ActorSources, Directory, DurableState, RecoveryError};
use dataplane_core::effect::{Effect, Outbox};
use dataplane_core::ids::AuthorityEpoch;
use dataplane_core::limits::LOG_RECORD_BYTES_MAX;
use dataplane_core::log::{
    FRAME_HEADER_BYTES, LogRecord, TailDefect, append_record, decode_log, encode_log,
};
use dataplane_core::time::Instant;
use dataplane_fuzz::model::drive;
use dataplane_testkit::dir::{config, persisted};
use dataplane_testkit::workload::Step;
use libfuzzer_sys::fuzz_target;

/// One corruption of a log image; positions are taken modulo the image length.
#[derive(Debug, Arbitrary)]
enum Corruption {
    Flip { at: u32, mask: u8 },
    Truncate { keep: u32 },
    Insert { at: u32, bytes: Vec<u8> },
    Remove { at: u32, len: u8 },
    Overwrite { at: u32, bytes: Vec<u8> },
}

#[derive(Debug, Arbitrary)]
struct Structured {
    steps: Vec<Step>,
    /// Replace the log by the live directory's snapshot (a compaction).
    compact: bool,
    corruptions: Vec<Corruption>,
}

fn position(at: u32, len: usize) -> usize {
    if len == 0 { 0 } else { at as usize % (len + 1) }
}

fn corrupt(image: &mut Vec<u8>, corruption: &Corruption) {
    match corruption {
        Corruption::Flip { at, mask } => {
            if !image.is_empty() {
                let i = *at as usize % image.len();
                image[i] ^= mask;
            }
        }
        Corruption::Truncate { keep } => {
            let keep = position(*keep, image.len());
            image.truncate(keep);
        }
        Corruption::Insert { at, bytes } => {
            let at = position(*at, image.len());
            image.splice(at..at, bytes.iter().copied());
        }
        Corruption::Remove { at, len } => {
            let at = position(*at, image.len());
            let end = (at + usize::from(*len)).min(image.len());
            image.drain(at..end);
        }
        Corruption::Overwrite { at, bytes } => {
            let at = position(*at, image.len());
            for (i, b) in bytes.iter().enumerate() {
                if let Some(slot) = image.get_mut(at + i) {
                    *slot = *b;
                }
            }
        }
    }
}

/// The frame header at the start of `rest`: (body length, checksum).
fn header(rest: &[u8]) -> (usize, u32) {
    let len = u32::from_le_bytes(rest[0..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(rest[4..8].try_into().unwrap());
    (len, crc)
}

/// Decodes `image` and checks the cut; returns the records of the valid prefix.
fn check_decode(image: &[u8]) -> Vec<LogRecord> {
    let decoded = decode_log(image);
    let valid = decoded.valid_len;
    assert!(valid <= image.len(), "valid_len past the end");
    match &decoded.defect {
        None => assert_eq!(valid, image.len(), "no defect, but the image was cut"),
        Some(defect) => {
            assert_eq!(defect.offset(), valid, "defect not at the cut");
            let rest = &image[valid..];
            assert!(!rest.is_empty(), "a defect in an empty tail");
            // The defect is the one the frame at the cut really has.
            match *defect {
                TailDefect::Truncated { .. } => {
                    let torn = rest.len() < FRAME_HEADER_BYTES || {
                        let (len, _) = header(rest);
                        len <= LOG_RECORD_BYTES_MAX && rest.len() < FRAME_HEADER_BYTES + len
                    };
                    assert!(torn, "{defect:?} on a whole frame");
                }
                TailDefect::Oversized { len, .. } => {
                    assert!(rest.len() >= FRAME_HEADER_BYTES);
                    assert_eq!(header(rest).0, len);
                    assert!(len > LOG_RECORD_BYTES_MAX, "{defect:?} within the limit");
                }
                TailDefect::Checksum { .. } | TailDefect::Malformed { .. } => {
                    assert!(rest.len() >= FRAME_HEADER_BYTES);
                    let (len, crc) = header(rest);
                    assert!(len <= LOG_RECORD_BYTES_MAX);
                    let body = &rest[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len];
                    let sum_ok = crc32c::crc32c(body) == crc;
                    let checksum = matches!(defect, TailDefect::Checksum { .. });
                    assert_eq!(sum_ok, !checksum, "{defect:?} disagrees with the checksum");
                }
            }
        }
    }
    // Every frame of the valid prefix is whole, checksummed and decodes.
    let again = decode_log(&image[..valid]);
    assert_eq!(
        again.records, decoded.records,
        "the valid prefix decodes differently"
    );
    assert_eq!(again.valid_len, valid);
    assert_eq!(again.defect, None, "the valid prefix has a defect");
    let reencoded = encode_log(&decoded.records).expect("decoded records re-encode");
    let round = decode_log(&reencoded);
    assert_eq!(
        round.records, decoded.records,
        "re-encoded records decode differently"
    );
    assert_eq!(round.defect, None);
    decoded.records
}

/// Replays `records` one by one; `Err(index)` of the first refused record.
fn replay(records: &[LogRecord]) -> Result<DurableState, usize> {
    let mut state = DurableState::default();
    for (index, record) in records.iter().enumerate() {
        state.apply(record).map_err(|_| index)?;
    }
    Ok(state)
}

/// Recovers from `records`; checks the recovered directory (or the refusal).
fn check_recover(records: &[LogRecord], must_recover: bool) {
    let mut out = Outbox::new();
    let recovered = Directory::recover(
        config(),
        records,
        &mut ActorSources,
        Instant::ZERO,
        &mut out,
    );
    let replayed = replay(records);
    let dir = match recovered {
        Err(RecoveryError::Inconsistent { index, reason }) => {
            assert!(
                !must_recover,
                "a prefix of a real log is refused at {index}: {reason}"
            );
            assert_eq!(replayed.err(), Some(index), "refused at the wrong record");
            return;
        }
        Err(RecoveryError::EpochExhausted) => {
            assert!(!must_recover, "a real log exhausted the epoch space");
            let state = replayed.expect("recovery refused an epoch, not a record");
            assert_eq!(state.epoch(), AuthorityEpoch(u64::MAX));
            return;
        }
        Err(e @ RecoveryError::EpochNotAbove { .. }) => {
            panic!("recovery at the next epoch refused its own epoch: {e}")
        }
        Ok(dir) => dir,
    };
    if let Err(e) = dir.check_invariants() {
        panic!("recovered directory breaks an invariant: {e}");
    }
    // The durable state is the replay plus exactly one new epoch, persisted first.
    let effects = out.take();
    let new = persisted(&effects);
    let mut expected = replayed.expect("recovery accepted a record replay refuses");
    assert!(dir.epoch() > expected.epoch(), "the epoch did not advance");
    assert_eq!(
        effects.first(),
        Some(&Effect::Persist(LogRecord::EpochAdvanced {
            epoch: dir.epoch()
        })),
        "the new epoch is not the first effect"
    );
    for record in &new {
        expected
            .apply(record)
            .expect("a recovery record does not fit");
    }
    assert!(
        *dir.durable() == expected,
        "recovered state differs from the replay"
    );
    // Its own log recovers again (the next restart), and so does its compaction.
    let mut log = records.to_vec();
    log.extend(new);
    if dir.epoch().0 < u64::MAX {
        let mut out = Outbox::new();
        let again = Directory::recover(config(), &log, &mut ActorSources, Instant::ZERO, &mut out)
            .expect("a recovered directory's log does not recover");
        if let Err(e) = again.check_invariants() {
            panic!("second recovery breaks an invariant: {e}");
        }
        let snapshot = dir.snapshot_records();
        let compacted = replay(&snapshot).expect("snapshot records do not replay");
        assert!(
            compacted == *dir.durable(),
            "the snapshot replays to another state"
        );
        let mut out = Outbox::new();
        let from_snapshot = Directory::recover(
            config(),
            &snapshot,
            &mut ActorSources,
            Instant::ZERO,
            &mut out,
        )
        .expect("a snapshot does not recover");
        if let Err(e) = from_snapshot.check_invariants() {
            panic!("recovery from a snapshot breaks an invariant: {e}");
        }
    }
}

fn structured(data: &[u8]) {
    let Ok(input) = Structured::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let d = drive(&input.steps);
    let records = if input.compact {
        d.dir.snapshot_records()
    } else {
        d.log
    };
    // Frame boundaries of the original image.
    let mut original = Vec::new();
    let mut ends = Vec::new();
    for record in &records {
        append_record(&mut original, record).expect("a directory record encodes");
        ends.push(original.len());
    }
    let mut image = original.clone();
    for corruption in input.corruptions.iter().take(16) {
        corrupt(&mut image, corruption);
    }
    let decoded = check_decode(&image);
    let first_change = original
        .iter()
        .zip(&image)
        .position(|(a, b)| a != b)
        .unwrap_or(original.len().min(image.len()));
    let intact = ends.iter().take_while(|&&end| end <= first_change).count();
    assert!(
        decoded.len() >= intact && decoded[..intact] == records[..intact],
        "a record before the first corrupted byte was lost or changed"
    );
    if image == original {
        assert_eq!(decoded, records, "an intact log decodes differently");
    }
    // Every prefix of a real log recovers (a crash may keep any prefix of a step's records);
    // a snapshot is written whole (compaction replaces the file), so only all of it must.
    let is_prefix = decoded.len() <= records.len() && decoded[..] == records[..decoded.len()];
    let must_recover = if input.compact {
        decoded == records
    } else {
        is_prefix
    };
    check_recover(&decoded, must_recover);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let records = check_decode(rest);
        check_recover(&records, false);
    } else {
        structured(rest);
    }
});

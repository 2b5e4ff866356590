//! `log_file`: the directory log's file format (`dataplane_io::log`): the header, the sync marks,
//! and `scan`, which tells a torn tail (cut on recovery) from damage to synced records
//! (refused).
//!
//! The first input byte picks the mode:
//!
//! * even: the rest is a log file (arbitrary bytes);
//! * odd: structured: batches of records written the way `DurableLog` writes them (a header,
//!   record frames, and a sync mark after each batch that was synced), then either a power loss
//!   — the bytes after the last sync cut, zeroed, overwritten, extended — or one byte flipped
//!   somewhere a sync mark covers.
//!
//! Properties:
//!
//! * header parsing and `scan` never panic, and the scan is consistent: the valid chain ends at
//!   `valid_len`, a defect sits exactly there if and only if bytes other than zeros follow
//!   (zeros to the end are preallocated space, its `zero_tail`), the last mark of the
//!   chain is inside it, `synced_past` (if any) is after the defect and holds a valid mark, and
//!   re-scanning the valid chain alone gives the same records with no defect;
//! * after a power loss the log is never taken for damaged, every synced record comes back,
//!   and the records are a prefix of the ones written;
//! * a byte flipped before the last sync mark is always damage, found at or before the flip,
//!   with the last mark as proof.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use dataplane_core::ids::{Address, AuthorityEpoch, NodeId};
use dataplane_core::log::{LogRecord, append_record};
use dataplane_io::log::{DataDirId, LOG_HEADER_BYTES, LogHeader, MARK_BYTES, Scan, mark, scan};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Loss {
    /// The file ends here (an offset into the unsynced bytes).
    Cut { keep: u16 },
    /// These unsynced bytes read as zeros.
    Zeros { at: u16, len: u16 },
    /// These unsynced bytes read as something else (what the blocks held before).
    Overwrite { at: u16, bytes: Vec<u8> },
    /// The file is longer than what was written.
    Extend { bytes: Vec<u8> },
}

#[derive(Debug, Arbitrary)]
enum Damage {
    PowerLoss(Vec<Loss>),
    Flip { at: u32, mask: u8 },
}

#[derive(Debug, Arbitrary)]
struct Structured {
    salt: u64,
    /// Each batch: the records' seeds, and whether a sync followed.
    batches: Vec<(Vec<u16>, bool)>,
    damage: Damage,
}

fn record(seed: u16) -> LogRecord {
    let n = u64::from(seed);
    match seed % 3 {
        0 => LogRecord::RetirementDone {
            source: Address::new(NodeId(n % 7), 1, n),
        },
        1 => LogRecord::NodeRestarted {
            node: NodeId(n),
            incarnation: n * 1_000_003,
        },
        _ => LogRecord::EpochAdvanced {
            epoch: AuthorityEpoch(n << 20),
        },
    }
}

/// Checks what every scan must satisfy; returns it.
fn check_scan(bytes: &[u8], salt: u64) -> Scan {
    let found = scan(bytes, salt);
    let valid = found.valid_len;
    assert!(valid <= bytes.len() && valid >= LOG_HEADER_BYTES.min(bytes.len()));
    // Zeros to the end of the file are preallocated space: the end of the log, not a defect.
    let rest = &bytes[valid..];
    let zeros_only = rest.iter().all(|&b| b == 0);
    assert_eq!(
        found.defect.is_some(),
        !zeros_only,
        "a defect iff bytes other than zeros follow"
    );
    assert_eq!(
        found.zero_tail,
        if zeros_only { rest.len() } else { 0 },
        "the zero tail is the zeros to the end"
    );
    if let Some(defect) = &found.defect {
        assert_eq!(defect.offset(), valid, "the defect is where the chain ends");
    }
    assert!(found.synced_to <= valid);
    if found.synced_to > LOG_HEADER_BYTES {
        let at = found.synced_to;
        assert_eq!(
            bytes[at..at + MARK_BYTES],
            mark(salt, at as u64),
            "synced_to is a mark"
        );
    }
    if let Some(past) = found.synced_past {
        assert!(
            found.defect.is_some() && past > valid,
            "proof after the defect"
        );
        assert_eq!(
            bytes[past..past + MARK_BYTES],
            mark(salt, past as u64),
            "a real mark"
        );
    }
    assert_eq!(
        found.torn_tail(),
        found.defect.is_some() && !found.damaged()
    );
    // The valid chain alone: the same records, nothing wrong.
    let again = scan(&bytes[..valid], salt);
    assert_eq!(
        again.records, found.records,
        "the valid chain reads differently"
    );
    assert_eq!((again.defect, again.synced_past), (None, None));
    assert_eq!(again.synced_to, found.synced_to);
    found
}

fn raw(bytes: &[u8]) {
    if let Ok(header) = LogHeader::parse(bytes) {
        check_scan(bytes, header.salt);
    }
    // Any salt, with or without a header in front.
    if bytes.len() >= 8 {
        let salt = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        check_scan(bytes, salt);
    }
}

fn structured(data: &[u8]) {
    let Ok(input) = Structured::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let header = LogHeader {
        id: DataDirId(7),
        generation: 3,
        salt: input.salt,
    };
    // Written the way DurableLog writes: a mark after a sync that had something to sync.
    let mut image = header.encode();
    let mut written = Vec::new();
    let mut synced_records = 0;
    let mut last_mark = None;
    for (seeds, synced) in input.batches.iter().take(32) {
        for &seed in seeds.iter().take(32) {
            let r = record(seed);
            append_record(&mut image, &r).expect("a record encodes");
            written.push(r);
        }
        let pending = last_mark.map_or(LOG_HEADER_BYTES, |m| m + MARK_BYTES) < image.len();
        if *synced && pending {
            let at = image.len();
            image.extend_from_slice(&mark(header.salt, at as u64));
            last_mark = Some(at);
            synced_records = written.len();
        }
    }
    match input.damage {
        Damage::PowerLoss(losses) => {
            // Bytes from the last mark on were never synced (the mark itself is not).
            let durable = last_mark.unwrap_or(LOG_HEADER_BYTES);
            for loss in losses.iter().take(8) {
                let unsynced = image.len() - durable;
                let at = |offset: u16| durable + usize::from(offset) % (unsynced + 1);
                match loss {
                    Loss::Cut { keep } => image.truncate(at(*keep)),
                    Loss::Zeros { at: from, len } => {
                        let from = at(*from);
                        let end = (from + usize::from(*len)).min(image.len());
                        image[from..end].fill(0);
                    }
                    Loss::Overwrite { at: from, bytes } => {
                        let from = at(*from);
                        for (i, b) in bytes.iter().enumerate() {
                            if let Some(slot) = image.get_mut(from + i) {
                                *slot = *b;
                            }
                        }
                    }
                    Loss::Extend { bytes } => image.extend_from_slice(bytes),
                }
            }
            // A disk does not invent marks: stale blocks never hold a mark of this file (its
            // salt) after its last sync (module documentation). Inputs that forge one are out
            // of scope.
            let forged = (durable + 1..image.len().saturating_sub(MARK_BYTES - 1))
                .any(|at| image[at..at + MARK_BYTES] == mark(header.salt, at as u64));
            if forged {
                return;
            }
            let found = check_scan(&image, header.salt);
            assert!(!found.damaged(), "a power loss taken for damage: {found:?}");
            assert!(
                found.records.len() >= synced_records,
                "a synced record was lost"
            );
            assert_eq!(found.records[..synced_records], written[..synced_records]);
            // Cut and zeroed bytes never make a record. Bytes from elsewhere may hold whole
            // record frames (the frames carry no salt), so only then may records follow that
            // were never written.
            let foreign = losses
                .iter()
                .any(|l| matches!(l, Loss::Overwrite { .. } | Loss::Extend { .. }));
            if !foreign {
                assert!(found.records.len() <= written.len());
                assert_eq!(
                    found.records[..],
                    written[..found.records.len()],
                    "not a prefix"
                );
            }
        }
        Damage::Flip { at, mask } => {
            let Some(last) = last_mark else {
                return;
            };
            if mask == 0 || last <= LOG_HEADER_BYTES {
                return;
            }
            let at = LOG_HEADER_BYTES + (at as usize) % (last - LOG_HEADER_BYTES);
            image[at] ^= mask;
            let found = check_scan(&image, header.salt);
            assert!(
                found.damaged(),
                "a flip at {at} before the mark at {last}: {found:?}"
            );
            assert!(found.valid_len <= at, "damage found after the flip");
            assert_eq!(found.synced_past, Some(last), "the last mark is the proof");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        raw(rest);
    } else {
        structured(rest);
    }
});

//! The bytes of the log's files — the identity, the file headers, the snapshot's end marker and
//! the sync marks — and [`scan`], which reads a log file and tells a torn tail from damage.
//!
//! Pure functions over byte slices: no IO, no clock, no randomness (the caller draws ids and
//! salts), so tests and the fuzz target drive them directly. The layouts and the reasoning are
//! in the documentation of the parent module ([`crate::storage`]).

use core::fmt;

use crate::log::{
    FRAME_HEADER_BYTES, LogRecord, RecordRef, TailDefect, append_record_ref, decode_log,
};
use crate::wire::EncodeError;

use super::StorageError;

/// The on-disk format this build writes and the only one it reads. Every file starts with an
/// 8-byte magic and this number (u32, little-endian); the rest of the layout belongs to the
/// version, so a reader refuses another version before reading further.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes of the `identity` file: magic, version, data-directory id (u128), CRC-32C.
pub const IDENTITY_BYTES: usize = 32;
/// Bytes of a log file's header: magic, version, id, generation (u64), salt (u64), CRC-32C.
pub const LOG_HEADER_BYTES: usize = 48;
/// Bytes of a snapshot's header: magic, version, id, generation (u64), CRC-32C.
pub const SNAPSHOT_HEADER_BYTES: usize = 40;
/// Bytes of the end marker after a snapshot's records.
pub const SNAPSHOT_TRAILER_BYTES: usize = 40;
/// Bytes of a sync mark: magic (4), CRC-32C of the rest, salt (u64), position (u64).
pub const MARK_BYTES: usize = 24;

const IDENTITY_MAGIC: [u8; 8] = *b"DPLANEID";
const LOG_MAGIC: [u8; 8] = *b"DPLANLOG";
const SNAPSHOT_MAGIC: [u8; 8] = *b"DPLANSNP";
const SNAPSHOT_END_MAGIC: [u8; 8] = *b"DPSNPEND";
/// Read as a frame's little-endian length this is 0x4B4D_5044, far above any record's limit,
/// so a mark can never be taken for a record frame or the other way round.
const MARK_MAGIC: [u8; 4] = *b"DPMK";

/// A data directory's identity: 128 random bits drawn once, when the directory is created,
/// and written into its `identity` file and the header of every snapshot and log in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DataDirId(pub u128);

impl fmt::Display for DataDirId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Why a file's header does not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// The file is shorter than its header, and what there is matches the header's start: a
    /// file created whose header never reached the disk, or one cut short.
    Short {
        /// The file's length.
        len: usize,
    },
    /// The file does not start with the expected magic: not this kind of file.
    Magic,
    /// The magic is there, with a format version this build does not read.
    Version(u32),
    /// The header's checksum does not match (damage).
    Checksum,
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Short { len } => write!(f, "only {len} bytes, less than its header"),
            HeaderError::Magic => f.write_str("it does not start with the expected magic"),
            HeaderError::Version(v) => {
                write!(f, "format version {v} (this build reads {FORMAT_VERSION})")
            }
            HeaderError::Checksum => f.write_str("header checksum mismatch"),
        }
    }
}

/// Checks the magic and the version at the start of `bytes` and the checksum of its first
/// `len` bytes (the last 4 of which are the CRC-32C of the ones before them).
fn check_header<'a>(bytes: &'a [u8], magic: &[u8; 8], len: usize) -> Result<&'a [u8], HeaderError> {
    let have = bytes.len().min(magic.len());
    if bytes[..have] != magic[..have] {
        return Err(HeaderError::Magic);
    }
    if bytes.len() < 12 {
        return Err(HeaderError::Short { len: bytes.len() });
    }
    let version = u32_at(bytes, 8);
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    let Some(header) = bytes.get(..len) else {
        return Err(HeaderError::Short { len: bytes.len() });
    };
    if crc32c(&header[..len - 4]) != u32_at(header, len - 4) {
        return Err(HeaderError::Checksum);
    }
    Ok(header)
}

/// Magic, version, then `fields`, then the CRC-32C of all of it.
fn build_header(magic: &[u8; 8], fields: &[&[u8]], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(magic);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    for field in fields {
        out.extend_from_slice(field);
    }
    let crc = crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// The bytes of the `identity` file.
pub fn identity_image(id: DataDirId) -> Vec<u8> {
    let mut out = Vec::with_capacity(IDENTITY_BYTES);
    build_header(&IDENTITY_MAGIC, &[&id.0.to_le_bytes()], &mut out);
    debug_assert_eq!(out.len(), IDENTITY_BYTES);
    out
}

/// The id in an `identity` file.
pub fn parse_identity(bytes: &[u8]) -> Result<DataDirId, HeaderError> {
    let header = check_header(bytes, &IDENTITY_MAGIC, IDENTITY_BYTES)?;
    Ok(DataDirId(u128_at(header, 12)))
}

/// The header at the start of every `log-<N>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHeader {
    /// The data directory the log belongs to.
    pub id: DataDirId,
    /// Its generation (the `N` of its name).
    pub generation: u64,
    /// Random, drawn whenever the file is (re)written from its start; every sync mark in the
    /// file carries it, so a mark left on the disk by another file is never taken for one.
    pub salt: u64,
}

impl LogHeader {
    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LOG_HEADER_BYTES);
        build_header(
            &LOG_MAGIC,
            &[
                &self.id.0.to_le_bytes(),
                &self.generation.to_le_bytes(),
                &self.salt.to_le_bytes(),
            ],
            &mut out,
        );
        debug_assert_eq!(out.len(), LOG_HEADER_BYTES);
        out
    }

    /// The header at the start of `bytes` (a log file).
    pub fn parse(bytes: &[u8]) -> Result<LogHeader, HeaderError> {
        let header = check_header(bytes, &LOG_MAGIC, LOG_HEADER_BYTES)?;
        Ok(LogHeader {
            id: DataDirId(u128_at(header, 12)),
            generation: u64_at(header, 28),
            salt: u64_at(header, 36),
        })
    }
}

/// The sync mark at `position` of a log whose header has `salt`: the claim "every byte before
/// this one was synced". The log writes one right after each successful sync, where it
/// stands: at the position the sync covered.
pub fn mark(salt: u64, position: u64) -> [u8; MARK_BYTES] {
    let mut out = [0; MARK_BYTES];
    out[..4].copy_from_slice(&MARK_MAGIC);
    out[8..16].copy_from_slice(&salt.to_le_bytes());
    out[16..24].copy_from_slice(&position.to_le_bytes());
    let crc = crc32c(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

enum Mark {
    /// No mark starts here (maybe a record frame).
    Absent,
    /// A valid mark of this file at its own position.
    Valid,
    /// Something that starts like a mark and is not a valid one.
    Bad(TailDefect),
}

fn mark_at(bytes: &[u8], at: usize, salt: u64) -> Mark {
    let rest = &bytes[at.min(bytes.len())..];
    if !rest.starts_with(&MARK_MAGIC) {
        return Mark::Absent;
    }
    let Some(mark) = rest.get(..MARK_BYTES) else {
        return Mark::Bad(TailDefect::Truncated { offset: at });
    };
    if crc32c(&mark[8..]) != u32_at(mark, 4) {
        return Mark::Bad(TailDefect::Checksum { offset: at });
    }
    if u64_at(mark, 8) != salt || u64_at(mark, 16) != at as u64 {
        // Intact, but written for another file or another position.
        return Mark::Bad(TailDefect::Malformed { offset: at });
    }
    Mark::Valid
}

/// What [`scan`] found in a log file after its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// The records of the valid chain (whole, checksummed record frames and valid sync marks
    /// from the end of the header on), in order.
    pub records: Vec<LogRecord>,
    /// Where the valid chain ends: the file is cut here if anything follows.
    pub valid_len: usize,
    /// Whether no record follows the chain's last sync mark (or the header, if it has none):
    /// then no new mark is needed to cover the chain once it is synced.
    pub ends_marked: bool,
    /// The position of the chain's last sync mark (the header's end if it has none): the log
    /// was synced at least this far.
    pub synced_to: usize,
    /// Why the chain ends before the end of the file, if it does (offsets are file offsets).
    pub defect: Option<TailDefect>,
    /// The position of the last valid sync mark anywhere after the defect: proof that the
    /// bytes at the defect had been synced — damage to acknowledged data, not a torn tail.
    pub synced_past: Option<usize>,
    /// Bytes of zeros from the end of the chain to the end of the file: preallocated space
    /// never written (or whose writes never reached the disk). A run of zeros to the end of
    /// the file is the end of the log, not a defect (no record frame or mark is all zeros).
    pub zero_tail: usize,
}

impl Scan {
    /// Whether the file holds bytes after the valid chain that nothing shows were ever synced:
    /// a torn tail, which recovery cuts on its own.
    pub fn torn_tail(&self) -> bool {
        self.defect.is_some() && self.synced_past.is_none()
    }

    /// Whether the file is damaged where it had been synced (see
    /// [`synced_past`](Self::synced_past)).
    pub fn damaged(&self) -> bool {
        self.synced_past.is_some()
    }
}

/// Reads the log file `bytes` (its header included; `salt` is the header's) from the end of
/// its header: record frames and sync marks, up to the first thing that is neither. If only
/// zeros follow (preallocated space), the log ends there. Otherwise, if the chain ends early,
/// every later offset is searched for a valid sync mark of this file.
pub fn scan(bytes: &[u8], salt: u64) -> Scan {
    let mut records = Vec::new();
    let mut pos = LOG_HEADER_BYTES.min(bytes.len());
    let mut synced_to = pos;
    let mut ends_marked = true;
    let defect = loop {
        let decoded = decode_log(&bytes[pos..]);
        if !decoded.records.is_empty() {
            ends_marked = false;
        }
        records.extend(decoded.records);
        pos += decoded.valid_len;
        let Some(defect) = decoded.defect else {
            break None;
        };
        match mark_at(bytes, pos, salt) {
            Mark::Valid => {
                synced_to = pos;
                ends_marked = true;
                pos += MARK_BYTES;
            }
            Mark::Bad(defect) => break Some(defect),
            Mark::Absent => break Some(at_offset(&defect, pos)),
        }
    };
    // A frame of zeros has length 0 and checksum 0 (the CRC-32C of nothing), but an empty
    // body is no record (Malformed), and a mark starts with its magic: zeros are never part
    // of the chain, so a chain that ends in nothing but zeros ends there.
    let zero_tail = if bytes[pos..].iter().all(|&b| b == 0) {
        bytes.len() - pos
    } else {
        0
    };
    let defect = defect.filter(|_| zero_tail == 0);
    let synced_past = defect
        .as_ref()
        .and_then(|_| last_mark_after(bytes, pos, salt));
    Scan {
        records,
        valid_len: pos,
        ends_marked,
        synced_to,
        defect,
        synced_past,
        zero_tail,
    }
}

/// The position of the last valid sync mark of this file that starts after `after`.
fn last_mark_after(bytes: &[u8], after: usize, salt: u64) -> Option<usize> {
    let last_start = bytes.len().checked_sub(MARK_BYTES)?;
    (after + 1..=last_start).rev().find(|&at| {
        bytes[at..].starts_with(&MARK_MAGIC) && matches!(mark_at(bytes, at, salt), Mark::Valid)
    })
}

/// `defect` (found by `decode_log` on a slice) at file offset `offset`.
fn at_offset(defect: &TailDefect, offset: usize) -> TailDefect {
    match *defect {
        TailDefect::Truncated { .. } => TailDefect::Truncated { offset },
        TailDefect::Oversized { len, .. } => TailDefect::Oversized { offset, len },
        TailDefect::Checksum { .. } => TailDefect::Checksum { offset },
        TailDefect::Malformed { .. } => TailDefect::Malformed { offset },
    }
}

/// The records of a log file's valid chain, for tools and tests that read a log (also one a
/// node has open): `Err` if the header does not read.
pub fn log_file_records(bytes: &[u8]) -> Result<Vec<LogRecord>, HeaderError> {
    let header = LogHeader::parse(bytes)?;
    Ok(scan(bytes, header.salt).records)
}

/// Why a record cannot be framed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Its encoded body exceeds the limit.
    TooLarge {
        /// The body size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// It does not encode.
    Encode(String),
}

impl<E, P> From<RecordError> for StorageError<E, P> {
    fn from(e: RecordError) -> Self {
        match e {
            RecordError::TooLarge { len, max } => StorageError::TooLarge { len, max },
            RecordError::Encode(reason) => StorageError::Encode(reason),
        }
    }
}

/// Frames `record` into `buf`, refusing a body over `max` bytes (nothing is left in `buf`).
pub fn encode_into(
    buf: &mut Vec<u8>,
    record: &LogRecord,
    max: usize,
) -> Result<usize, RecordError> {
    encode_ref_into(buf, &RecordRef::Record(record), max)
}

/// [`encode_into`] of the record `record` stands for.
pub fn encode_ref_into(
    buf: &mut Vec<u8>,
    record: &RecordRef<'_>,
    max: usize,
) -> Result<usize, RecordError> {
    let start = buf.len();
    let frame = append_record_ref(buf, record).map_err(|e| match e {
        EncodeError::TooLarge { len, max } => RecordError::TooLarge { len, max },
        EncodeError::Serialize(reason) => RecordError::Encode(reason),
    })?;
    let len = frame - FRAME_HEADER_BYTES;
    if len > max {
        buf.truncate(start);
        return Err(RecordError::TooLarge { len, max });
    }
    Ok(frame)
}

/// The bytes of `snapshot-<generation>` of data directory `id`: header, framed records, end
/// marker.
pub fn snapshot_image(
    id: DataDirId,
    generation: u64,
    records: &[LogRecord],
    max_record_bytes: usize,
) -> Result<Vec<u8>, RecordError> {
    snapshot_image_of(
        id,
        generation,
        records.iter().map(RecordRef::Record),
        max_record_bytes,
    )
}

/// [`snapshot_image`] of the records `records` stand for, encoded as they come (a compaction
/// borrows them from the live state rather than building them).
pub fn snapshot_image_of<'a>(
    id: DataDirId,
    generation: u64,
    records: impl IntoIterator<Item = RecordRef<'a>>,
    max_record_bytes: usize,
) -> Result<Vec<u8>, RecordError> {
    let mut image = Vec::new();
    build_header(
        &SNAPSHOT_MAGIC,
        &[&id.0.to_le_bytes(), &generation.to_le_bytes()],
        &mut image,
    );
    debug_assert_eq!(image.len(), SNAPSHOT_HEADER_BYTES);
    let mut count = 0u64;
    for record in records {
        encode_ref_into(&mut image, &record, max_record_bytes)?;
        count += 1;
    }
    let body = &image[SNAPSHOT_HEADER_BYTES..];
    let body_crc = crc32c(body);
    let body_len = body.len() as u64;
    let marker_start = image.len();
    image.extend_from_slice(&SNAPSHOT_END_MAGIC);
    image.extend_from_slice(&generation.to_le_bytes());
    image.extend_from_slice(&count.to_le_bytes());
    image.extend_from_slice(&body_len.to_le_bytes());
    image.extend_from_slice(&body_crc.to_le_bytes());
    let marker_crc = crc32c(&image[marker_start..]);
    image.extend_from_slice(&marker_crc.to_le_bytes());
    debug_assert_eq!(image.len() - marker_start, SNAPSHOT_TRAILER_BYTES);
    Ok(image)
}

/// Why a snapshot cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotProblem {
    /// Not a complete snapshot of this generation (a partial write, a hole, another
    /// generation's file): what the compaction protocol's crash states can leave.
    Incomplete(String),
    /// A header of a format version this build does not read.
    Version(u32),
    /// A valid header of another data directory.
    Foreign(DataDirId),
}

/// The records of a complete `snapshot-<generation>` image of data directory `id`.
pub fn verify_snapshot(
    id: DataDirId,
    generation: u64,
    image: &[u8],
) -> Result<Vec<LogRecord>, SnapshotProblem> {
    let incomplete = |reason: String| Err(SnapshotProblem::Incomplete(reason));
    let header = match check_header(image, &SNAPSHOT_MAGIC, SNAPSHOT_HEADER_BYTES) {
        Ok(header) => header,
        Err(HeaderError::Version(v)) => return Err(SnapshotProblem::Version(v)),
        Err(e) => return incomplete(format!("header: {e}")),
    };
    let found = DataDirId(u128_at(header, 12));
    if found != id {
        return Err(SnapshotProblem::Foreign(found));
    }
    let named = u64_at(header, 28);
    if named != generation {
        return incomplete(format!("its header names generation {named}"));
    }
    let rest = &image[SNAPSHOT_HEADER_BYTES..];
    let Some(body_len) = rest.len().checked_sub(SNAPSHOT_TRAILER_BYTES) else {
        return incomplete(format!(
            "{} bytes is too short for the end marker",
            image.len()
        ));
    };
    let (body, marker) = rest.split_at(body_len);
    if marker[..8] != SNAPSHOT_END_MAGIC {
        return incomplete("no end marker".to_owned());
    }
    if crc32c(&marker[..36]) != u32_at(marker, 36) {
        return incomplete("end marker checksum mismatch".to_owned());
    }
    let (marked_generation, count, marked_len) =
        (u64_at(marker, 8), u64_at(marker, 16), u64_at(marker, 24));
    if marked_generation != generation {
        return incomplete(format!("end marker names generation {marked_generation}"));
    }
    if marked_len != body_len as u64 {
        return incomplete(format!(
            "end marker says {marked_len} bytes of records, the file has {body_len}"
        ));
    }
    if crc32c(body) != u32_at(marker, 32) {
        return incomplete("records checksum mismatch".to_owned());
    }
    let decoded = decode_log(body);
    if let Some(defect) = decoded.defect {
        return incomplete(format!("bad record frame: {defect}"));
    }
    if decoded.records.len() as u64 != count {
        return incomplete(format!(
            "{} records, the end marker says {count}",
            decoded.records.len()
        ));
    }
    Ok(decoded.records)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut out = [0; 4];
    out.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(out)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut out = [0; 8];
    out.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(out)
}

fn u128_at(bytes: &[u8], at: usize) -> u128 {
    let mut out = [0; 16];
    out.copy_from_slice(&bytes[at..at + 16]);
    u128::from_le_bytes(out)
}

/// CRC-32C (Castagnoli), the checksum of the core's record frames: the `crc32c` crate, the
/// same one the core frames its records with (hardware-accelerated where the CPU has it).
pub use crc32c::crc32c;

//! The durable log of a directory node: append + `fdatasync` with group commit, compaction to a
//! snapshot that is crash-atomic at every step, recovery that cuts a torn tail but refuses to
//! cut acknowledged records, and fail-stop on any storage failure (DESIGN §3).
//!
//! # File layout
//!
//! One data directory holds one directory node's log, as numbered *generations*:
//!
//! ```text
//! <dir>/identity           the directory's id, written once when the directory is created
//! <dir>/snapshot-<N>       the whole durable state as of the start of log-<N>
//! <dir>/log-<N>            every record appended since snapshot-<N> was written
//! <dir>/lock               flock'ed by the process that has the log open
//! <dir>/snapshot-<N>.tmp   a snapshot being written (never read; removed by recovery)
//! <dir>/log-<N>.tmp        a log being rewritten by a repair (never read; removed by recovery)
//! <dir>/identity.tmp       the identity being written (never read; removed by recovery)
//! <dir>/log-<N>.cut-<P>    bytes a repair cut off log-<N> at offset P (kept, never read)
//! ```
//!
//! Every file starts with an 8-byte magic and a format version ([`FORMAT_VERSION`], u32); a
//! reader refuses any other version ([`LogError::UnknownVersion`]) before reading further.
//! All integers are little-endian; every header ends with the CRC-32C of the bytes before it.
//!
//! ```text
//! identity:    [ "DPLANEID" ][ version u32 ][ id u128 ][ crc u32 ]
//! log-<N>:     [ "DPLANLOG" ][ version u32 ][ id u128 ][ N u64 ][ salt u64 ][ crc u32 ]
//!              then record frames and sync marks, in the order written
//! snapshot-<N>:[ "DPLANSNP" ][ version u32 ][ id u128 ][ N u64 ][ crc u32 ]
//!              then the framed snapshot records, then the end marker:
//!              [ "DPSNPEND" ][ N u64 ][ record count u64 ][ body bytes u64 ]
//!              [ CRC-32C of the records u32 ][ CRC-32C of the 36 marker bytes before it u32 ]
//! sync mark:   [ "DPMK" ][ CRC-32C of the next 16 bytes u32 ][ salt u64 ][ its own offset u64 ]
//! ```
//!
//! A record frame is the core's ([`dataplane_core::log::append_record`]: length, CRC-32C,
//! postcard body). Positions ([`DurableLog::append`], [`DurableLog::synced`]) are byte offsets
//! in the current log file.
//!
//! The *id* is 128 random bits drawn when the directory is created; a snapshot or log whose
//! header names another id belongs to another data directory and is refused
//! ([`LogError::Foreign`]): a log copied in from elsewhere is never replayed. The *salt* is
//! drawn whenever a log file is written from its start; it ties the sync marks to their file.
//!
//! A snapshot is *complete* only if its header is intact and names this directory and the
//! generation of the file name, and the body has exactly the end marker's length, checksum and
//! record count with every record frame valid. A partially written snapshot fails this check
//! whatever part of it reached the disk.
//!
//! # Group commit and the Persist barrier
//!
//! [`DurableLog::append`] only writes (into the page cache); [`DurableLog::sync`] makes
//! everything written so far durable with one `fdatasync`, then writes a *sync mark* at the
//! position it synced to (see below). The driver executes a batch of directory steps like
//! this: it appends the record of every `Effect::Persist` of every step of the batch, in order,
//! noting after each Persist the position `append` returned; every other effect that follows a
//! Persist is held back. Then it calls `sync` once, and releases, in order, the held effects
//! whose barrier position is at most the synced position (after a successful `sync`, all of
//! them). One `fdatasync` thus commits many steps, and nothing a step says to the outside world
//! leaves the node before that step's records are durable.
//!
//! # A torn tail or damage?
//!
//! After a crash the end of the log may hold a *torn tail*: bytes written after the last
//! successful `fdatasync` that reached the disk in part, out of order (a later page without an
//! earlier one), as zeros, or as whatever the blocks held before. Nothing in a torn tail was
//! ever acknowledged (the Persist barrier), so recovery may cut it. Damage *before* the last
//! sync is another matter: the records there were acknowledged, and so may be every record
//! after the damage. A checksum alone cannot tell the two apart — a flipped bit in the middle
//! of the log and a torn last write both look like "a frame whose checksum fails" — so
//! recovery needs to know how far the log was synced.
//!
//! That is what the sync marks record. Right after each successful `sync` the log writes (and
//! does not sync) a mark at the position the sync reached: "every byte before me is durable".
//! A mark is never wrong: it is written only after its claim came true. A mark need not be
//! durable either: losing it loses no record. After a crash, recovery reads the chain of
//! record frames and marks from the header on. If it ends before the end of the file at
//! offset `P`, recovery searches every later offset for a valid mark of this file (right
//! magic, checksum, salt, and its own offset inside it):
//!
//! * a valid mark at `Q > P` proves that the bytes at `P` were synced: the log is **damaged**,
//!   and the records between `P` and `Q` (and maybe after) were acknowledged. Recovery refuses
//!   ([`LogError::Damaged`], naming the file and both offsets) and changes nothing;
//! * otherwise nothing shows that the bytes from `P` on were ever synced: a **torn tail**.
//!   Recovery cuts it (`set_len`) and reports the cut ([`Recovered::cut`]).
//!
//! This is exact with respect to what survives: a torn tail never contains a valid mark after
//! its first bad byte (a mark there would have been written after a sync that covered that
//! byte), so it is always cut; and damage to any byte a surviving mark covers is always
//! refused. The one window is damage after the last mark that survived: with a process crash
//! (`kill -9`) the page cache keeps the mark of the last sync, so that window holds only
//! unsynced bytes; after a power loss the last mark may be lost with its page, and damage to
//! the records of the last synced batch is then taken for a torn tail — cut, and reported.
//! Likewise a file cut short (truncated) inside its synced records loses its last mark and is
//! taken for a torn tail.
//!
//! Why marks, and not the alternatives:
//! * "damage with no valid frame anywhere after it is a torn tail" (the forward scan of etcd's
//!   WAL) is not exact for this log: a torn tail after a power loss can hold whole, valid
//!   record frames after a zeroed page (pages reach the disk in any order), which that rule
//!   would refuse, and the records after a flipped bit are no proof that it was synced if they
//!   were written in the same unsynced batch;
//! * a "synced up to" watermark kept in another file costs a second write and `fsync` per
//!   commit; the mark costs one small write (no `fsync`) per commit and needs no second file;
//! * sequence numbers in every frame would change the core's frame format (shared with the
//!   simulator and the fuzz targets) and still not say how far the log was synced.
//!
//! A mark is 24 bytes; its magic read as a frame length is far above the record limit, so
//! marks and record frames never pass for one another. Marks carry the file's salt, so a mark
//! left on the disk by an earlier file (a reused block) is never taken for one of this file's;
//! a torn tail cut automatically holds no valid mark (that is what made it a torn tail), so no
//! stale mark of this file survives beyond its cut either.
//!
//! # Recovery
//!
//! [`DurableLog::open_with`] first takes the lock, then reads and decides everything, and
//! only then writes: every refusal leaves every file as it was.
//!
//! **The identity.** A new directory (no identity, no snapshot, no log) is created: generation
//! 0 (an empty snapshot and an empty log, both naming a fresh id), then the `identity` file
//! (written to a temporary file, synced, renamed, the directory synced) — last, so its presence
//! proves that generation 0 was complete and durable. Without an identity:
//! * nothing else, or nothing but a generation 0 without a record (a first open that crashed
//!   before its identity): created anew — unless the caller said the directory was used before
//!   ([`LogOptions::create`] false), which is [`LogError::Lost`];
//! * anything else is [`LogError::Lost`]: the identity is gone but logs are there.
//!
//! An identity with no snapshot and no log left is [`LogError::Lost`] as well.
//!
//! **The generation.** Recovery chooses exactly one generation `G` and reads `snapshot-<G>`
//! followed by `log-<G>` — never a snapshot of one generation with the log of another, so no
//! record is applied twice or skipped:
//! * `G` is the newest generation `T` if `snapshot-<T>` is complete;
//! * if `snapshot-<T>` is missing or incomplete, which the compaction protocol below never
//!   produces unless the storage loses or reorders synced data, and `log-<T>` holds no record
//!   (missing, or no longer than a header), nothing was ever appended to generation `T`: it is
//!   discarded and `G` is the generation before it, which must then have a complete snapshot
//!   ([`Recovered::discarded_generation`]);
//! * anything else (an unreadable newest snapshot with records appended after it, no usable
//!   generation) is [`LogError::Corrupt`]; a snapshot of another format version or another
//!   directory is [`LogError::UnknownVersion`] or [`LogError::Foreign`].
//!
//! **The log of `G`.** Records are appended to `log-<G>` only once its header is durable, and
//! only after every older generation's files are durably removed (compaction step 4, or
//! recovery itself). So:
//! * if an older generation's file is still there, `log-<G>` never had a record, and a missing
//!   `log-<G>`, or one no longer than a header, is what a crash during compaction step 3 leaves:
//!   it is written afresh;
//! * otherwise `log-<G>` had a durable header, and a missing or emptied `log-<G>`, or one whose
//!   header does not read, means the log was lost or damaged: [`LogError::MissingLog`];
//! * a readable header must name this directory and `G` ([`LogError::Foreign`],
//!   [`LogError::Corrupt`]); then the chain is read as described above: cut a torn tail, refuse
//!   damage ([`LogError::Damaged`]).
//!
//! Then the log, the snapshot and the directory are synced (a process that crashed before its
//! `sync` leaves records in the page cache; they are made durable before anything is built on
//! them), and only then are the temporary files and every other generation removed, and the
//! directory synced again. Last, if records follow the log's last mark, a mark is written after
//! them: they are synced now, and damage to them must never pass for a torn tail.
//!
//! **Repair.** With [`LogOptions::repair`], recovery cuts what it would refuse to: a damaged
//! log is cut at its first bad byte and a log that is missing, empty or headless is started
//! empty after the snapshot. The cut bytes are first written to `log-<G>.cut-<P>` (`P` is the
//! offset they started at) and synced, then the log is rewritten with the valid records under
//! a new salt (a temporary file, synced, renamed over the old one), so that no mark of the old
//! file can vouch for anything in the new one. [`Recovered::cut`] reports it. Repair never
//! touches a snapshot, the identity, or a file of another version or another directory.
//!
//! # Compaction, crash-atomic at every step
//!
//! [`DurableLog::compact`] (from generation `N` with everything written already synced, to
//! `N+1`), and what recovery finds after a crash between any two steps:
//!
//! 1. Write `snapshot-<N+1>.tmp` and `sync_all` it. A crash leaves a partial or complete
//!    `.tmp`, which recovery never reads and removes: the state is generation `N`.
//! 2. Rename it to `snapshot-<N+1>`. Its contents are durable before the name appears, so if
//!    the rename is seen the snapshot is complete: recovery uses generation `N+1` (writing its
//!    log, since generation `N` is still there), and removes generation `N`; if the rename is
//!    lost, generation `N`. Both hold the same state: the snapshot is the state generation `N`
//!    recovers to.
//! 3. Create `log-<N+1>`, write its header and `sync_all` it; `sync_all` the directory, which
//!    makes the rename and the new log's name durable. A crash before the directory sync is the
//!    previous case; after it, generation `N+1`.
//! 4. Switch appends to `log-<N+1>`, then remove `snapshot-<N>` and `log-<N>` and sync the
//!    directory. Generation `N+1` is durable: a crash leaves leftovers of generation `N`, which
//!    recovery removes.
//!
//! Nothing is appended to `log-<N+1>` until step 4 returned, so a generation with records has a
//! durable, complete snapshot and log header and no older generation; and generation `N` is
//! removed only after step 3, so until then it is always there to fall back on.
//!
//! # Fail-stop
//!
//! A failed write, sync, create, rename or remove leaves the files in a state the process no
//! longer knows (after a failed `fsync` the kernel may have dropped the dirty pages and marked
//! them clean, so a retried `fsync` "succeeds" without writing them — the fsyncgate lesson).
//! So the first such failure poisons the log: that call returns [`LogError::Io`] and every later
//! call [`LogError::Poisoned`]. The node must stop, drop its machine, and recover from the files
//! on restart. Refusing a record that is too large ([`LogError::TooLarge`]) or a compaction
//! with unsynced records ([`LogError::Unsynced`]) writes nothing and does not poison.
//!
//! The log is the only writer of its directory: `open` takes an exclusive `flock` on the `lock`
//! file before it reads or writes anything else, and fails ([`LogError::Locked`]) if another
//! process holds it.

mod format;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use dataplane_core::limits::LOG_RECORD_BYTES_MAX;
use dataplane_core::log::{LogRecord, TailDefect};

pub use format::{
    DataDirId, FORMAT_VERSION, HeaderError, IDENTITY_BYTES, LOG_HEADER_BYTES, LogHeader,
    MARK_BYTES, SNAPSHOT_HEADER_BYTES, SNAPSHOT_TRAILER_BYTES, Scan, SnapshotProblem,
    identity_image, log_file_records, mark, parse_identity, scan, verify_snapshot,
};
use format::{encode_into, snapshot_image};

/// The name of the identity file.
const IDENTITY: &str = "identity";

/// Why the log refused or failed an operation.
#[derive(Debug)]
pub enum LogError {
    /// A file-system operation failed. Raised by a log method, this poisons the log.
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Another process has the directory open (its `lock` file is locked); nothing was read
    /// or changed.
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The log is damaged where it had been synced: cutting it there would drop acknowledged
    /// records; nothing was changed. [`LogOptions::repair`] cuts it, keeping a copy.
    Damaged {
        /// The log file.
        path: PathBuf,
        /// Where its valid records end (a file offset).
        offset: u64,
        /// What is wrong there.
        defect: TailDefect,
        /// The offset of a valid sync mark after the damage: the log was synced up to there.
        synced_past: u64,
    },
    /// The log of the generation in use is missing, empty or has no readable header, though
    /// the directory shows it was written; nothing was changed. [`LogOptions::repair`] starts
    /// it empty after its snapshot, keeping a copy of the old bytes.
    MissingLog {
        /// The log file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The directory lost what recovery needs to start (its log, or its identity); nothing
    /// was changed, and a repair cannot help.
    Lost {
        /// The missing file (or the directory).
        path: PathBuf,
        /// What is missing, and why it should be there.
        reason: String,
    },
    /// A file names another data directory: it was copied or moved here from elsewhere;
    /// nothing was changed.
    Foreign {
        /// The file.
        path: PathBuf,
        /// The id it names.
        found: DataDirId,
        /// This directory's id.
        expected: DataDirId,
    },
    /// A file is in a format version this build does not read; nothing was changed.
    UnknownVersion {
        /// The file.
        path: PathBuf,
        /// The version it says it is in.
        version: u32,
    },
    /// The directory holds no state recovery can trust (see the module documentation);
    /// nothing was changed.
    Corrupt {
        /// The offending file (or the directory).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A record's encoded body exceeds the limit; nothing was written.
    TooLarge {
        /// The body size.
        len: usize,
        /// The limit ([`LOG_RECORD_BYTES_MAX`]).
        max: usize,
    },
    /// A record cannot be encoded; nothing was written.
    Encode(String),
    /// A compaction was asked for while records were written but not synced; nothing was
    /// written (sync first, and release the effects held behind those records).
    Unsynced {
        /// Bytes written to the current log file.
        written: u64,
        /// Bytes synced.
        synced: u64,
    },
    /// An earlier write or sync failed: the log refuses everything; restart and recover.
    Poisoned,
}

impl LogError {
    /// Whether this is recovery refusing the directory's contents (rather than a storage
    /// failure, a lock, or a bad call): the files need a person.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            LogError::Damaged { .. }
                | LogError::MissingLog { .. }
                | LogError::Lost { .. }
                | LogError::Foreign { .. }
                | LogError::UnknownVersion { .. }
                | LogError::Corrupt { .. }
        )
    }

    /// Whether [`LogOptions::repair`] would get past this refusal.
    pub fn is_repairable(&self) -> bool {
        matches!(self, LogError::Damaged { .. } | LogError::MissingLog { .. })
    }
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Io { op, path, source } => {
                write!(f, "log: {op} failed on {}: {source}", path.display())
            }
            LogError::Locked { path } => write!(
                f,
                "log: {} is locked: another process has this data directory open",
                path.display()
            ),
            LogError::Damaged {
                path,
                offset,
                defect,
                synced_past,
            } => write!(
                f,
                "log: {} is damaged at byte {offset} ({defect}), but it was synced up to \
                 byte {synced_past}: the records after the damage were acknowledged, and \
                 cutting the log there would lose them",
                path.display()
            ),
            LogError::MissingLog { path, reason } | LogError::Lost { path, reason } => {
                write!(f, "log: {} {reason}", path.display())
            }
            LogError::Foreign {
                path,
                found,
                expected,
            } => write!(
                f,
                "log: {} belongs to another data directory (id {found}; this one is {expected})",
                path.display()
            ),
            LogError::UnknownVersion { path, version } => write!(
                f,
                "log: {} is in format version {version}; this build reads version \
                 {FORMAT_VERSION} only",
                path.display()
            ),
            LogError::Corrupt { path, reason } => {
                write!(f, "log: {} is corrupt: {reason}", path.display())
            }
            LogError::TooLarge { len, max } => {
                write!(f, "log: record body is {len} bytes, the limit is {max}")
            }
            LogError::Encode(reason) => write!(f, "log: record does not encode: {reason}"),
            LogError::Unsynced { written, synced } => write!(
                f,
                "log: cannot compact with unsynced records ({written} bytes written, {synced} synced)"
            ),
            LogError::Poisoned => f.write_str(
                "log: poisoned by an earlier storage failure; restart and recover from disk",
            ),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// How [`DurableLog::open_with`] treats a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// Whether a directory without a log may be initialised as a new one. A caller that knows
    /// the directory held a log before (the directory node: its data directory has booted)
    /// sets this to false, so that a log deleted with its identity is [`LogError::Lost`]
    /// instead of silently started afresh.
    pub create: bool,
    /// Cut a damaged log at its first bad byte, and start a missing or headless log empty
    /// after its snapshot, keeping a copy of every byte cut (see "Repair" in the module
    /// documentation).
    pub repair: bool,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            create: true,
            repair: false,
        }
    }
}

/// Bytes recovery cut off the log, and why it was allowed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// A torn tail: nothing shows these bytes were ever synced.
    TornTail {
        /// The log file.
        path: PathBuf,
        /// Where the cut bytes started (a file offset; the log now ends here).
        offset: u64,
        /// How many bytes were cut.
        bytes: u64,
        /// What was wrong at `offset`.
        defect: TailDefect,
        /// The position of the last sync mark before the cut: the log is known synced to here.
        synced_to: u64,
    },
    /// A repair ([`LogOptions::repair`]) cut bytes that recovery would have refused to cut.
    Repaired {
        /// The log file.
        path: PathBuf,
        /// Where the cut bytes started (an offset in the old file).
        offset: u64,
        /// How many bytes were cut.
        bytes: u64,
        /// What was wrong.
        reason: String,
        /// The file that keeps the cut bytes (none if there were none: a missing log).
        copy: Option<PathBuf>,
    },
}

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cut::TornTail {
                path,
                offset,
                bytes,
                defect,
                synced_to,
            } => write!(
                f,
                "log: cut a torn tail of {bytes} bytes off {} at byte {offset} ({defect}); \
                 nothing after byte {synced_to} was recorded as synced",
                path.display()
            ),
            Cut::Repaired {
                path,
                offset,
                bytes,
                reason,
                copy,
            } => {
                write!(
                    f,
                    "log: repair: cut {bytes} bytes off {} at byte {offset} ({reason})",
                    path.display()
                )?;
                match copy {
                    Some(copy) => write!(f, "; the cut bytes are kept in {}", copy.display()),
                    None => f.write_str("; there were no bytes to keep"),
                }
            }
        }
    }
}

/// What [`DurableLog::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// The snapshot's records followed by the log's valid records: the input of
    /// `Directory::recover`.
    pub records: Vec<LogRecord>,
    /// How many of `records` (at the front) came from the snapshot.
    pub snapshot_records: usize,
    /// Bytes cut off the log (a torn tail, or what a repair cut).
    pub cut_bytes: u64,
    /// Why the log's valid prefix ended before the end of the file, if it did.
    pub defect: Option<TailDefect>,
    /// What was cut, and why (`None` if nothing was).
    pub cut: Option<Cut>,
    /// The generation recovered (and now appended to).
    pub generation: u64,
    /// The position of the next append in the log file.
    pub log_bytes: u64,
    /// A newer generation whose snapshot was missing or incomplete and whose log held no
    /// record, discarded in favour of `generation`.
    pub discarded_generation: Option<u64>,
    /// The data directory's id.
    pub id: DataDirId,
    /// Whether the directory was new (and has just been created).
    pub created: bool,
    /// Leftover files removed (temporary files, other generations).
    pub removed: Vec<PathBuf>,
}

impl Recovered {
    /// One line for each thing recovery did that an operator should hear about: a new
    /// directory, a discarded generation, a cut.
    pub fn notes(&self, dir: &Path) -> Vec<String> {
        let mut notes = Vec::new();
        if self.created {
            notes.push(format!(
                "log: created a new log in {} (data directory id {})",
                dir.display(),
                self.id
            ));
        }
        if let Some(discarded) = self.discarded_generation {
            notes.push(format!(
                "log: discarded generation {discarded} of {} (incomplete snapshot, no records); \
                 recovered generation {}",
                dir.display(),
                self.generation
            ));
        }
        if let Some(cut) = &self.cut {
            notes.push(cut.to_string());
        }
        notes
    }
}

/// One directory's durable log in one data directory. See the module documentation.
#[derive(Debug)]
pub struct DurableLog {
    /// Held (`flock`) for as long as the log is open.
    _lock: File,
    dir: PathBuf,
    id: DataDirId,
    generation: u64,
    salt: u64,
    log_path: PathBuf,
    file: File,
    written: u64,
    synced: u64,
    poisoned: bool,
    max_record_bytes: usize,
    buf: Vec<u8>,
    faults: Faults,
}

impl DurableLog {
    /// [`open_with`](Self::open_with) the default options: create a new directory if there is
    /// no log, never repair.
    pub fn open(dir: &Path) -> Result<(DurableLog, Recovered), LogError> {
        DurableLog::open_with(dir, LogOptions::default())
    }

    /// Opens the log in `dir` and recovers it: takes the lock, reads everything and decides
    /// (refusing, with every file left as it was, what it must not cut or guess), then cuts a
    /// torn tail (or repairs), makes what it read durable and removes leftovers. A missing
    /// `dir` is created if `options.create`.
    pub fn open_with(dir: &Path, options: LogOptions) -> Result<(DurableLog, Recovered), LogError> {
        match fs::metadata(dir) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && !options.create => {
                return Err(LogError::Lost {
                    path: dir.to_owned(),
                    reason: "does not exist, but this data directory had a log".to_owned(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => ensure_dir(dir)?,
            Err(e) => return Err(io_error("stat directory", dir)(e)),
        }
        // One process per data directory, and nothing read or changed before the lock: a
        // second directory node on the same files would corrupt them.
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error("open lock", &lock_path))?;
        if lock.try_lock().is_err() {
            return Err(LogError::Locked { path: lock_path });
        }
        let listing = list(dir)?;
        let plan = plan(dir, &listing, options)?;
        // Everything below writes; everything above only read.
        let mut faults = Faults::default();
        let (id, generation, snapshot, discarded_generation, created, opened) = match plan {
            Plan::Fresh => {
                let id = DataDirId(random_u128(dir)?);
                let header = LogHeader {
                    id,
                    generation: 0,
                    salt: random_u64(dir)?,
                };
                let image = snapshot_image(id, 0, &[], LOG_RECORD_BYTES_MAX)?;
                let file = install_generation(dir, &image, &header, &mut faults)?;
                write_identity(dir, id)?;
                let opened = Opened::empty(file, header);
                (id, 0, Vec::new(), None, true, opened)
            }
            Plan::Existing(existing) => {
                let snapshot_file = snapshot_path(dir, existing.generation);
                File::open(&snapshot_file)
                    .and_then(|f| f.sync_all())
                    .map_err(io_error("sync snapshot", &snapshot_file))?;
                let opened = open_log(dir, existing.id, existing.generation, existing.log)?;
                (
                    existing.id,
                    existing.generation,
                    existing.snapshot,
                    existing.discarded,
                    false,
                    opened,
                )
            }
        };
        sync_dir(dir)?;

        let mut removed = Vec::new();
        for temp in &listing.temps {
            remove(temp, &mut removed)?;
        }
        for (&other, files) in &listing.generations {
            if other == generation {
                continue;
            }
            if files.snapshot {
                remove(&snapshot_path(dir, other), &mut removed)?;
            }
            if files.log {
                remove(&log_path(dir, other), &mut removed)?;
            }
        }
        if !removed.is_empty() {
            sync_dir(dir)?;
        }

        let Opened {
            file,
            header,
            end,
            records: log_records,
            defect,
            cut,
            needs_mark,
        } = opened;
        let snapshot_records = snapshot.len();
        let mut records = snapshot;
        records.extend(log_records);
        let mut log = DurableLog {
            _lock: lock,
            dir: dir.to_owned(),
            id,
            generation,
            salt: header.salt,
            log_path: log_path(dir, generation),
            file,
            written: end,
            synced: end,
            poisoned: false,
            max_record_bytes: LOG_RECORD_BYTES_MAX,
            buf: Vec::new(),
            faults,
        };
        if needs_mark {
            // Everything read is synced now; say so, so that damage to it is never taken for
            // a torn tail.
            log.write_mark()?;
        }
        let cut_bytes = match &cut {
            Some(Cut::TornTail { bytes, .. } | Cut::Repaired { bytes, .. }) => *bytes,
            None => 0,
        };
        let recovered = Recovered {
            records,
            snapshot_records,
            cut_bytes,
            defect,
            cut,
            generation,
            log_bytes: log.written,
            discarded_generation,
            id,
            created,
            removed,
        };
        Ok((log, recovered))
    }

    /// Writes `record` at the end of the log, without syncing; returns the position (bytes
    /// into the current log file) where the record ends: it is durable once
    /// [`synced`](Self::synced) reaches that position.
    pub fn append(&mut self, record: &LogRecord) -> Result<u64, LogError> {
        self.check_healthy()?;
        self.buf.clear();
        let frame = encode_into(&mut self.buf, record, self.max_record_bytes)?;
        let result = step(&mut self.faults, "write log", &self.log_path, || {
            self.file.write_all(&self.buf)
        });
        self.poison_on_error(result)?;
        self.written += frame as u64;
        Ok(self.written)
    }

    /// Makes everything written durable (`fdatasync`), then writes a sync mark after it;
    /// returns the synced position. One sync commits every record appended since the last one
    /// (group commit). A failure poisons the log: a failed sync is never retried.
    ///
    /// The mark itself is not synced and needs not be (losing it loses no record), so the
    /// returned position, like [`synced`](Self::synced), counts it.
    pub fn sync(&mut self) -> Result<u64, LogError> {
        self.check_healthy()?;
        if self.synced == self.written {
            return Ok(self.synced);
        }
        let result = step(&mut self.faults, "sync log", &self.log_path, || {
            self.file.sync_data()
        });
        self.poison_on_error(result)?;
        self.synced = self.written;
        self.write_mark()?;
        Ok(self.synced)
    }

    /// Writes the sync mark of the current position, which must be synced.
    fn write_mark(&mut self) -> Result<(), LogError> {
        debug_assert_eq!(self.synced, self.written);
        let mark = mark(self.salt, self.written);
        let result = step(&mut self.faults, "write sync mark", &self.log_path, || {
            self.file.write_all(&mark)
        });
        self.poison_on_error(result)?;
        self.written += MARK_BYTES as u64;
        self.synced = self.written;
        Ok(())
    }

    /// Bytes written to the current log file (synced or not).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes of the current log file known durable (or, for a trailing sync mark, not needing
    /// to be).
    pub fn synced(&self) -> u64 {
        self.synced
    }

    /// Bytes in the current log file, for a "compact when it has doubled" policy.
    pub fn len_bytes(&self) -> u64 {
        self.written
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The data directory's id.
    pub fn id(&self) -> DataDirId {
        self.id
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Whether an earlier failure poisoned the log.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Replaces the whole log by `snapshot` (records whose replay from nothing rebuilds the
    /// current durable state), crash-atomically, as a new generation whose log starts empty:
    /// positions restart after the new log's header. Everything written must be synced first
    /// ([`LogError::Unsynced`] otherwise).
    pub fn compact(&mut self, snapshot: &[LogRecord]) -> Result<(), LogError> {
        self.check_healthy()?;
        if self.written != self.synced {
            return Err(LogError::Unsynced {
                written: self.written,
                synced: self.synced,
            });
        }
        let Some(next) = self.generation.checked_add(1) else {
            return Err(LogError::Corrupt {
                path: self.dir.clone(),
                reason: "generation numbers exhausted".to_owned(),
            });
        };
        let image = snapshot_image(self.id, next, snapshot, self.max_record_bytes)?;
        let salt = random_u64(&self.dir);
        let salt = self.poison_on_error(salt)?;
        let header = LogHeader {
            id: self.id,
            generation: next,
            salt,
        };
        let installed = install_generation(&self.dir, &image, &header, &mut self.faults);
        let file = self.poison_on_error(installed)?;

        let old = self.generation;
        self.file = file;
        self.generation = next;
        self.salt = salt;
        self.log_path = log_path(&self.dir, next);
        self.written = LOG_HEADER_BYTES as u64;
        self.synced = self.written;

        let old_snapshot = snapshot_path(&self.dir, old);
        let old_log = log_path(&self.dir, old);
        let dir = self.dir.clone();
        let faults = &mut self.faults;
        let cleanup = step(faults, "remove old snapshot", &old_snapshot, || {
            fs::remove_file(&old_snapshot)
        })
        .and_then(|()| {
            step(faults, "remove old log", &old_log, || {
                fs::remove_file(&old_log)
            })
        })
        .and_then(|()| step(faults, "sync directory", &dir, || sync_dir_io(&dir)));
        self.poison_on_error(cleanup)
    }

    fn check_healthy(&self) -> Result<(), LogError> {
        if self.poisoned {
            Err(LogError::Poisoned)
        } else {
            Ok(())
        }
    }

    fn poison_on_error<T>(&mut self, result: Result<T, LogError>) -> Result<T, LogError> {
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }
}

/// What recovery decided, before it writes anything.
enum Plan {
    /// A new directory (or a first open that crashed before its identity was written).
    Fresh,
    /// An existing directory's generation.
    Existing(Existing),
}

struct Existing {
    id: DataDirId,
    generation: u64,
    snapshot: Vec<LogRecord>,
    discarded: Option<u64>,
    log: LogPlan,
}

/// What to do with the chosen generation's log.
enum LogPlan {
    /// It is missing or shorter than a header, and an older generation is still there: a
    /// compaction crashed before its log was durable. Write it afresh.
    Create,
    /// Its header reads: keep its valid chain, cutting a torn tail (or, repairing, damage).
    Keep { bytes: Vec<u8>, scan: Scan },
    /// Repairing a log that is missing, empty or headless: start it empty, keeping its bytes.
    Replace { bytes: Vec<u8>, reason: String },
}

/// Reads the directory and decides what recovery does; every refusal is made here.
fn plan(dir: &Path, listing: &Listing, options: LogOptions) -> Result<Plan, LogError> {
    let Some(id) = read_identity(dir, listing)? else {
        return plan_without_identity(dir, listing, options);
    };
    let Some((&top, top_files)) = listing.generations.last_key_value() else {
        return Err(LogError::Lost {
            path: dir.to_owned(),
            reason: format!(
                "holds no snapshot and no log, but its identity file says a log was created \
                 here (id {id})"
            ),
        });
    };
    let (generation, snapshot, discarded) = match read_snapshot(dir, id, top, top_files)? {
        Ok(records) => (top, records, None),
        Err(reason) => {
            let held = log_len(dir, top, top_files)?;
            if held > LOG_HEADER_BYTES as u64 {
                return Err(LogError::Corrupt {
                    path: snapshot_path(dir, top),
                    reason: format!(
                        "{reason}, but log-{top} holds {held} bytes, more than a header"
                    ),
                });
            }
            let Some((&previous, files)) = listing.generations.range(..top).next_back() else {
                return Err(LogError::Corrupt {
                    path: dir.to_owned(),
                    reason: format!("{reason}, and no earlier generation to fall back on"),
                });
            };
            match read_snapshot(dir, id, previous, files)? {
                Ok(records) => (previous, records, Some(top)),
                Err(previous_reason) => {
                    return Err(LogError::Corrupt {
                        path: dir.to_owned(),
                        reason: format!("{reason}, and {previous_reason}"),
                    });
                }
            }
        }
    };
    let log = plan_log(dir, listing, id, generation, options)?;
    Ok(Plan::Existing(Existing {
        id,
        generation,
        snapshot,
        discarded,
        log,
    }))
}

/// A directory without an identity: new, a first open that crashed, or a lost identity.
fn plan_without_identity(
    dir: &Path,
    listing: &Listing,
    options: LogOptions,
) -> Result<Plan, LogError> {
    if listing.generations.is_empty() {
        if options.create {
            return Ok(Plan::Fresh);
        }
        return Err(LogError::Lost {
            path: dir.to_owned(),
            reason: "holds no log, but this data directory had one".to_owned(),
        });
    }
    // The identity is written last when a directory is created: without it, a generation 0
    // that never held a record is a first open that crashed, and is created again.
    if options.create && listing.generations.keys().all(|&g| g == 0) {
        let files = &listing.generations[&0];
        if log_len(dir, 0, files)? <= LOG_HEADER_BYTES as u64 {
            return Ok(Plan::Fresh);
        }
    }
    let first = listing.generations.keys().next().copied().unwrap_or(0);
    let last = listing.generations.keys().next_back().copied().unwrap_or(0);
    Err(LogError::Lost {
        path: dir.join(IDENTITY),
        reason: if options.create {
            format!("is missing, but the directory holds log files (generations {first} to {last})")
        } else {
            "is missing, but this data directory had a log".to_owned()
        },
    })
}

/// Decides what to do with `log-<generation>` (module documentation, "The log of `G`").
fn plan_log(
    dir: &Path,
    listing: &Listing,
    id: DataDirId,
    generation: u64,
    options: LogOptions,
) -> Result<LogPlan, LogError> {
    let path = log_path(dir, generation);
    let exists = listing
        .generations
        .get(&generation)
        .is_some_and(|files| files.log);
    let bytes = if exists {
        fs::read(&path).map_err(io_error("read log", &path))?
    } else {
        Vec::new()
    };
    let header_error = match LogHeader::parse(&bytes) {
        Ok(header) => {
            if header.id != id {
                return Err(LogError::Foreign {
                    path,
                    found: header.id,
                    expected: id,
                });
            }
            if header.generation != generation {
                return Err(LogError::Corrupt {
                    path,
                    reason: format!("its header names generation {}", header.generation),
                });
            }
            let scan = scan(&bytes, header.salt);
            if let (Some(defect), Some(synced_past)) = (&scan.defect, scan.synced_past)
                && !options.repair
            {
                return Err(LogError::Damaged {
                    path,
                    offset: defect.offset() as u64,
                    defect: defect.clone(),
                    synced_past: synced_past as u64,
                });
            }
            return Ok(LogPlan::Keep { bytes, scan });
        }
        Err(HeaderError::Version(version)) => {
            return Err(LogError::UnknownVersion { path, version });
        }
        Err(e) => e,
    };
    let older = listing.generations.range(..generation).next().is_some();
    if older && bytes.len() <= LOG_HEADER_BYTES {
        return Ok(LogPlan::Create);
    }
    let reason = if !exists {
        "is missing".to_owned()
    } else if bytes.is_empty() {
        "is empty".to_owned()
    } else {
        format!("has no valid header ({header_error})")
    };
    let reason = format!(
        "{reason}, though this data directory (id {id}) had written it: the records it held \
         are lost"
    );
    if options.repair {
        return Ok(LogPlan::Replace { bytes, reason });
    }
    Err(LogError::MissingLog { path, reason })
}

/// The log file recovery opened, and what it found in it.
struct Opened {
    file: File,
    header: LogHeader,
    /// The end of the file (the position of the next append).
    end: u64,
    records: Vec<LogRecord>,
    defect: Option<TailDefect>,
    cut: Option<Cut>,
    /// Whether records follow the last sync mark (they are synced now and need one).
    needs_mark: bool,
}

impl Opened {
    fn empty(file: File, header: LogHeader) -> Opened {
        Opened {
            file,
            header,
            end: LOG_HEADER_BYTES as u64,
            records: Vec::new(),
            defect: None,
            cut: None,
            needs_mark: false,
        }
    }
}

/// Carries out `plan` for `log-<generation>`: leaves it synced, positioned at its end.
fn open_log(dir: &Path, id: DataDirId, generation: u64, plan: LogPlan) -> Result<Opened, LogError> {
    let path = log_path(dir, generation);
    match plan {
        LogPlan::Create => {
            let header = LogHeader {
                id,
                generation,
                salt: random_u64(dir)?,
            };
            let file = create_log(&path, &header, &mut Faults::default())?;
            Ok(Opened::empty(file, header))
        }
        LogPlan::Replace { bytes, reason } => {
            let copy = keep_cut_bytes(dir, generation, 0, &bytes)?;
            let header = LogHeader {
                id,
                generation,
                salt: random_u64(dir)?,
            };
            let file = rewrite_log(dir, &header, &[])?;
            let mut opened = Opened::empty(file, header);
            opened.cut = Some(Cut::Repaired {
                path,
                offset: 0,
                bytes: bytes.len() as u64,
                reason,
                copy,
            });
            Ok(opened)
        }
        LogPlan::Keep { bytes, scan } => {
            let header = LogHeader::parse(&bytes).expect("planned on a readable header");
            let cut_at = scan.valid_len;
            let cut_bytes = (bytes.len() - cut_at) as u64;
            match (&scan.defect, scan.synced_past) {
                (Some(defect), Some(synced_past)) => {
                    // Repair (the plan refused this otherwise): keep the cut bytes, then
                    // rewrite the valid records under a new salt.
                    let copy = keep_cut_bytes(dir, generation, cut_at as u64, &bytes[cut_at..])?;
                    let header = LogHeader {
                        salt: random_u64(dir)?,
                        ..header
                    };
                    let file = rewrite_log(dir, &header, &scan.records)?;
                    let end = file.metadata().map_err(io_error("stat log", &path))?.len();
                    Ok(Opened {
                        file,
                        header,
                        end,
                        needs_mark: !scan.records.is_empty(),
                        records: scan.records,
                        defect: Some(defect.clone()),
                        cut: Some(Cut::Repaired {
                            path,
                            offset: cut_at as u64,
                            bytes: cut_bytes,
                            reason: format!(
                                "{defect}, though the log was synced up to byte {synced_past}"
                            ),
                            copy,
                        }),
                    })
                }
                (defect, _) => {
                    let mut file = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&path)
                        .map_err(io_error("open log", &path))?;
                    let cut = match defect {
                        Some(defect) => {
                            file.set_len(cut_at as u64)
                                .map_err(io_error("truncate log", &path))?;
                            Some(Cut::TornTail {
                                path: path.clone(),
                                offset: cut_at as u64,
                                bytes: cut_bytes,
                                defect: defect.clone(),
                                synced_to: scan.synced_to as u64,
                            })
                        }
                        None => None,
                    };
                    // Durable before anything is built on it: the cut, and records a crashed
                    // process wrote but never synced.
                    file.sync_all().map_err(io_error("sync log", &path))?;
                    file.seek(SeekFrom::Start(cut_at as u64))
                        .map_err(io_error("seek log", &path))?;
                    Ok(Opened {
                        file,
                        header,
                        end: cut_at as u64,
                        needs_mark: !scan.ends_marked,
                        records: scan.records,
                        defect: scan.defect,
                        cut,
                    })
                }
            }
        }
    }
}

/// Writes `bytes`, cut off `log-<generation>` at `offset`, to a new `log-<generation>.cut-<offset>`
/// (synced, and its name too); `None` if there are no bytes.
fn keep_cut_bytes(
    dir: &Path,
    generation: u64,
    offset: u64,
    bytes: &[u8],
) -> Result<Option<PathBuf>, LogError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let base = format!("log-{generation}.cut-{offset}");
    let mut n = 0u32;
    let (path, mut file) = loop {
        let name = if n == 0 {
            base.clone()
        } else {
            format!("{base}.{n}")
        };
        let path = dir.join(name);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => break (path, file),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(io_error("create copy of cut bytes", &path)(e)),
        }
    };
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(io_error("write copy of cut bytes", &path))?;
    sync_dir(dir)?;
    Ok(Some(path))
}

/// Replaces `log-<generation>` by `header` and `records` crash-atomically (a temporary file,
/// synced, renamed over it, the directory synced). Returns it, open at its end.
fn rewrite_log(dir: &Path, header: &LogHeader, records: &[LogRecord]) -> Result<File, LogError> {
    let path = log_path(dir, header.generation);
    let temp = dir.join(format!("log-{}.tmp", header.generation));
    let mut image = header.encode();
    for record in records {
        encode_into(&mut image, record, LOG_RECORD_BYTES_MAX)?;
    }
    let mut file = File::create(&temp).map_err(io_error("create log temp", &temp))?;
    file.write_all(&image)
        .and_then(|()| file.sync_all())
        .map_err(io_error("write log temp", &temp))?;
    drop(file);
    fs::rename(&temp, &path).map_err(io_error("rename log temp", &path))?;
    sync_dir(dir)?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_error("open log", &path))?;
    file.seek(SeekFrom::End(0))
        .map_err(io_error("seek log", &path))?;
    Ok(file)
}

/// Test-only fault injection: every file-system step of `append`, `sync` and `compact` goes
/// through [`Faults::check`]; a test can make the n-th next step fail (before it runs).
#[derive(Debug, Default)]
struct Faults {
    /// Fail the step with this index in `steps`.
    #[cfg(test)]
    fail_at: Option<usize>,
    /// The steps attempted so far.
    #[cfg(test)]
    steps: Vec<&'static str>,
}

impl Faults {
    #[cfg(test)]
    fn check(&mut self, op: &'static str) -> io::Result<()> {
        if self.fail_at == Some(self.steps.len()) {
            return Err(io::Error::other(format!("injected failure before {op}")));
        }
        self.steps.push(op);
        Ok(())
    }

    #[cfg(not(test))]
    #[inline]
    fn check(&mut self, _op: &'static str) -> io::Result<()> {
        Ok(())
    }
}

/// Runs one file-system step, through fault injection in tests.
fn step<T>(
    faults: &mut Faults,
    op: &'static str,
    path: &Path,
    f: impl FnOnce() -> io::Result<T>,
) -> Result<T, LogError> {
    faults
        .check(op)
        .and_then(|()| f())
        .map_err(io_error(op, path))
}

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LogError + 'a {
    move |source| LogError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// 128 bits from the kernel's random source (the `getrandom` system call).
fn random_u128(dir: &Path) -> Result<u128, LogError> {
    let mut bytes = [0; 16];
    getrandom::fill(&mut bytes).map_err(|e| LogError::Io {
        op: "draw a random id",
        path: dir.to_owned(),
        source: e.into(),
    })?;
    Ok(u128::from_le_bytes(bytes))
}

fn random_u64(dir: &Path) -> Result<u64, LogError> {
    // Truncation keeps 64 of the 128 random bits.
    random_u128(dir).map(|r| r as u64)
}

/// Writes generation `header.generation`: its snapshot `image` (via a synced temporary file
/// and a rename) and a synced log holding only `header`, then syncs the directory. Returns the
/// log, open for appending.
fn install_generation(
    dir: &Path,
    image: &[u8],
    header: &LogHeader,
    faults: &mut Faults,
) -> Result<File, LogError> {
    let generation = header.generation;
    let temp = temp_path(dir, generation);
    let snapshot = snapshot_path(dir, generation);
    let mut file = step(faults, "create snapshot temp", &temp, || {
        File::create(&temp)
    })?;
    step(faults, "write snapshot temp", &temp, || {
        file.write_all(image)
    })?;
    step(faults, "sync snapshot temp", &temp, || file.sync_all())?;
    drop(file);
    step(faults, "rename snapshot", &snapshot, || {
        fs::rename(&temp, &snapshot)
    })?;
    let log_file = create_log(&log_path(dir, generation), header, faults)?;
    step(faults, "sync directory", dir, || sync_dir_io(dir))?;
    Ok(log_file)
}

/// Creates (or empties) the log file `path` and writes and syncs its header; the caller syncs
/// the directory.
fn create_log(path: &Path, header: &LogHeader, faults: &mut Faults) -> Result<File, LogError> {
    let mut file = step(faults, "create log", path, || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
    })?;
    step(faults, "write log header", path, || {
        file.write_all(&header.encode())
    })?;
    step(faults, "sync log", path, || file.sync_all())?;
    Ok(file)
}

/// Writes the `identity` file crash-atomically: a synced temporary file renamed into place,
/// the directory synced.
fn write_identity(dir: &Path, id: DataDirId) -> Result<(), LogError> {
    let temp = dir.join(format!("{IDENTITY}.tmp"));
    let path = dir.join(IDENTITY);
    let mut file = File::create(&temp).map_err(io_error("create identity temp", &temp))?;
    file.write_all(&identity_image(id))
        .and_then(|()| file.sync_all())
        .map_err(io_error("write identity temp", &temp))?;
    drop(file);
    fs::rename(&temp, &path).map_err(io_error("rename identity", &path))?;
    sync_dir(dir)
}

/// The directory's id; `None` if it has no identity file.
fn read_identity(dir: &Path, listing: &Listing) -> Result<Option<DataDirId>, LogError> {
    if !listing.identity {
        return Ok(None);
    }
    let path = dir.join(IDENTITY);
    let bytes = fs::read(&path).map_err(io_error("read identity", &path))?;
    match parse_identity(&bytes) {
        Ok(id) => Ok(Some(id)),
        Err(HeaderError::Version(version)) => Err(LogError::UnknownVersion { path, version }),
        Err(e) => Err(LogError::Corrupt {
            path,
            reason: e.to_string(),
        }),
    }
}

#[derive(Debug, Default)]
struct GenerationFiles {
    snapshot: bool,
    log: bool,
}

#[derive(Debug, Default)]
struct Listing {
    identity: bool,
    generations: BTreeMap<u64, GenerationFiles>,
    temps: Vec<PathBuf>,
}

enum FileName {
    Identity,
    Snapshot(u64),
    Temp,
    Log(u64),
}

fn parse_name(name: &str) -> Option<FileName> {
    if name == IDENTITY {
        return Some(FileName::Identity);
    }
    if name == format!("{IDENTITY}.tmp") {
        return Some(FileName::Temp);
    }
    if let Some(rest) = name.strip_prefix("snapshot-") {
        return match rest.strip_suffix(".tmp") {
            Some(number) => parse_generation(number).map(|_| FileName::Temp),
            None => parse_generation(rest).map(FileName::Snapshot),
        };
    }
    let rest = name.strip_prefix("log-")?;
    match rest.strip_suffix(".tmp") {
        Some(number) => parse_generation(number).map(|_| FileName::Temp),
        None => parse_generation(rest).map(FileName::Log),
    }
}

/// A generation number exactly as this module writes it (plain decimal).
fn parse_generation(text: &str) -> Option<u64> {
    let number: u64 = text.parse().ok()?;
    (number.to_string() == text).then_some(number)
}

fn snapshot_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("snapshot-{generation}"))
}

fn temp_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("snapshot-{generation}.tmp"))
}

fn log_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("log-{generation}"))
}

fn list(dir: &Path) -> Result<Listing, LogError> {
    let mut listing = Listing::default();
    let entries = fs::read_dir(dir).map_err(io_error("list directory", dir))?;
    for entry in entries {
        let entry = entry.map_err(io_error("list directory", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        match parse_name(name) {
            Some(FileName::Identity) => listing.identity = true,
            Some(FileName::Snapshot(n)) => {
                listing.generations.entry(n).or_default().snapshot = true;
            }
            Some(FileName::Log(n)) => {
                listing.generations.entry(n).or_default().log = true;
            }
            Some(FileName::Temp) => listing.temps.push(entry.path()),
            None => {}
        }
    }
    Ok(listing)
}

/// Reads `snapshot-<generation>`: `Ok(Err(reason))` if it is missing or incomplete, `Err` if
/// it is of another version or directory.
fn read_snapshot(
    dir: &Path,
    id: DataDirId,
    generation: u64,
    files: &GenerationFiles,
) -> Result<Result<Vec<LogRecord>, String>, LogError> {
    let path = snapshot_path(dir, generation);
    if !files.snapshot {
        return Ok(Err(format!("snapshot-{generation} is missing")));
    }
    let image = fs::read(&path).map_err(io_error("read snapshot", &path))?;
    match verify_snapshot(id, generation, &image) {
        Ok(records) => Ok(Ok(records)),
        Err(SnapshotProblem::Incomplete(reason)) => {
            Ok(Err(format!("snapshot-{generation}: {reason}")))
        }
        Err(SnapshotProblem::Version(version)) => Err(LogError::UnknownVersion { path, version }),
        Err(SnapshotProblem::Foreign(found)) => Err(LogError::Foreign {
            path,
            found,
            expected: id,
        }),
    }
}

/// The length of `log-<generation>` (0 if it is missing).
fn log_len(dir: &Path, generation: u64, files: &GenerationFiles) -> Result<u64, LogError> {
    if !files.log {
        return Ok(0);
    }
    let path = log_path(dir, generation);
    Ok(fs::metadata(&path)
        .map_err(io_error("stat log", &path))?
        .len())
}

/// Creates `dir` (and missing ancestors) if missing, making each new name durable in its
/// parent.
fn ensure_dir(dir: &Path) -> Result<(), LogError> {
    let mut missing = Vec::new();
    for ancestor in dir.ancestors() {
        if ancestor.as_os_str().is_empty() {
            break;
        }
        match fs::metadata(ancestor) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(ancestor),
            Err(e) => {
                return Err(LogError::Io {
                    op: "stat directory",
                    path: ancestor.to_owned(),
                    source: e,
                });
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    for created in missing {
        match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
            _ => sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

fn sync_dir_io(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    sync_dir_io(dir).map_err(io_error("sync directory", dir))
}

/// Removes a leftover file; one already gone is not an error.
fn remove(path: &Path, removed: &mut Vec<PathBuf>) -> Result<(), LogError> {
    match fs::remove_file(path) {
        Ok(()) => {
            removed.push(path.to_owned());
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LogError::Io {
            op: "remove leftover",
            path: path.to_owned(),
            source: e,
        }),
    }
}

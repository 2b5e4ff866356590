//! The storage protocol of a directory node's durable log: append + `fdatasync` with group
//! commit, compaction to a snapshot that is crash-atomic at every step, recovery that cuts a
//! torn tail but refuses to cut acknowledged records, and fail-stop on any storage failure
//! (DESIGN §3) but one: a compaction whose snapshot finds no room on the disk before it is
//! renamed into place is postponed ([`Compacted::Postponed`]), since nothing recovery reads
//! changed and the log can go on.
//!
//! Every decision is here; the file operations are not. [`LogStore`] runs the protocol over a
//! [`FileSystem`], a small trait over one data directory (list, create, read, append, sync,
//! rename, remove, sync the directory, draw entropy, grow a file with zeros). The real node implements it with the
//! operating system's files (`dataplane_io::log`), the simulator with a simulated file system
//! that loses, tears and damages what a real disk may (`dataplane_sim`), so the simulator runs
//! the very protocol production runs. Deterministic: the only randomness (ids and salts) and every
//! effect on the world come through the trait.
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
//! reader refuses any other version ([`StorageError::UnknownVersion`]) before reading further.
//! All integers are little-endian; every header ends with the CRC-32C of the bytes before it.
//!
//! ```text
//! identity:    [ "DPLANEID" ][ version u32 ][ id u128 ][ crc u32 ]
//! log-<N>:     [ "DPLANLOG" ][ version u32 ][ id u128 ][ N u64 ][ salt u64 ][ crc u32 ]
//!              then record frames and sync marks, in the order written,
//!              then (preallocated) zeros to the end of the file
//! snapshot-<N>:[ "DPLANSNP" ][ version u32 ][ id u128 ][ N u64 ][ crc u32 ]
//!              then the framed snapshot records, then the end marker:
//!              [ "DPSNPEND" ][ N u64 ][ record count u64 ][ body bytes u64 ]
//!              [ CRC-32C of the records u32 ][ CRC-32C of the 36 marker bytes before it u32 ]
//! sync mark:   [ "DPMK" ][ CRC-32C of the next 16 bytes u32 ][ salt u64 ][ its own offset u64 ]
//! ```
//!
//! A record frame is the core's ([`crate::log::append_record`]: length, CRC-32C,
//! postcard body). Positions ([`LogStore::append`], [`LogStore::synced`]) are byte offsets
//! in the current log file.
//!
//! # Preallocation
//!
//! An `fdatasync` after an append that grew the file must commit the new size (and the new
//! blocks) through the file system's journal; one after a write over blocks that are already
//! the file's, written, need not (on the bench's disk: 200–220 µs against 130 µs). So the log
//! grows ahead of its records ([`StorageOptions::preallocate`]): before a record, or the sync
//! mark after it, would reach past the end of the file, [`FileSystem::preallocate`] writes
//! zeros up to the next multiple of the step (zeros written, not a hole: a hole or
//! `fallocate`'s unwritten extents turn into a block-map change on their first write). The
//! zeros are not synced on their own: the next sync makes them durable with the records
//! written into them. A record or a mark is never all zeros (a zero frame has length 0 and the
//! checksum of nothing, but an empty body is no record; a mark starts with its magic), so:
//!
//! * a chain followed by nothing but zeros to the end of the file **ends** there: not a defect,
//!   nothing to report. A crash can leave zeros there whichever way the preallocation, or
//!   the size change of a plain append, reached the disk;
//! * anything else after the chain is judged as below: zeros and then other bytes are a torn
//!   tail (cut) or damage (refused) exactly as any other bytes there.
//!
//! Recovery cuts the zeros off with the rest of the file after the chain (not reported: they
//! are not a cut), so appends go on right after the last record and the file grows again with
//! the next one. A log that holds only a header and zeros holds no record (the rules below
//! that ask "did this log ever hold a record?" look at its length without trailing zeros).
//!
//! The *id* is 128 random bits drawn when the directory is created; a snapshot or log whose
//! header names another id belongs to another data directory and is refused
//! ([`StorageError::Foreign`]): a log copied in from elsewhere is never replayed. The *salt* is
//! drawn whenever a log file is written from its start; it ties the sync marks to their file.
//!
//! A snapshot is *complete* only if its header is intact and names this directory and the
//! generation of the file name, and the body has exactly the end marker's length, checksum and
//! record count with every record frame valid. A partially written snapshot fails this check
//! whatever part of it reached the disk.
//!
//! # Group commit and the Persist barrier
//!
//! [`LogStore::append`] only writes (into the page cache); [`LogStore::sync`] makes
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
//!   ([`StorageError::Damaged`], naming the file and both offsets) and changes nothing;
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
//! With a preallocated log, the zeros after the last record change nothing here: damage that
//! leaves a valid mark after it is refused as before; bytes after the chain that are all zeros
//! are the log's end (damage that zeroed everything from a synced record to the end of the
//! file, marks and all, is the truncation case above).
//!
//! A mark is 24 bytes; its magic read as a frame length is far above the record limit, so
//! marks and record frames never pass for one another. Marks carry the file's salt, so a mark
//! left on the disk by an earlier file (a reused block) is never taken for one of this file's;
//! a torn tail cut automatically holds no valid mark (that is what made it a torn tail), so no
//! stale mark of this file survives beyond its cut either.
//!
//! # Recovery
//!
//! [`LogStore::open`] first takes the lock, then reads and decides everything, and
//! only then writes: every refusal leaves every file as it was.
//!
//! **The identity.** A new directory (no identity, no snapshot, no log) is created: generation
//! 0 (an empty snapshot and an empty log, both naming a fresh id), then the `identity` file
//! (written to a temporary file, synced, renamed, the directory synced) — last, so its presence
//! proves that generation 0 was complete and durable. Without an identity:
//! * nothing else, or nothing but a generation 0 without a record (a first open that crashed
//!   before its identity): created anew — unless the caller said the directory was used before
//!   ([`StorageOptions::create`] false), which is [`StorageError::Lost`];
//! * anything else is [`StorageError::Lost`]: the identity is gone but logs are there.
//!
//! An identity with no snapshot and no log left is [`StorageError::Lost`] as well.
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
//!   generation) is [`StorageError::Corrupt`]; a snapshot of another format version or another
//!   directory is [`StorageError::UnknownVersion`] or [`StorageError::Foreign`].
//!
//! **The log of `G`.** Records are appended to `log-<G>` only once its header is durable, and
//! only after every older generation's files are durably removed (compaction step 4, or
//! recovery itself). So:
//! * if an older generation's file is still there, `log-<G>` never had a record, and a missing
//!   `log-<G>`, or one no longer than a header, is what a crash during compaction step 3 leaves:
//!   it is written afresh;
//! * otherwise `log-<G>` had a durable header, and a missing or emptied `log-<G>`, or one whose
//!   header does not read, means the log was lost or damaged: [`StorageError::MissingLog`];
//! * a readable header must name this directory and `G` ([`StorageError::Foreign`],
//!   [`StorageError::Corrupt`]); then the chain is read as described above: cut a torn tail, refuse
//!   damage ([`StorageError::Damaged`]).
//!
//! Then the log, the snapshot and the directory are synced (a process that crashed before its
//! `sync` leaves records in the page cache; they are made durable before anything is built on
//! them), and only then are the temporary files and every other generation removed, and the
//! directory synced again. Last, if records follow the log's last mark, a mark is written after
//! them: they are synced now, and damage to them must never pass for a torn tail.
//!
//! **Repair.** With [`StorageOptions::repair`], recovery cuts what it would refuse to: a damaged
//! log is cut at its first bad byte and a log that is missing, empty or headless is started
//! empty after the snapshot. The cut bytes are first written to `log-<G>.cut-<P>` (`P` is the
//! offset they started at) and synced, then the log is rewritten with the valid records under
//! a new salt (a temporary file, synced, renamed over the old one), so that no mark of the old
//! file can vouch for anything in the new one. [`Recovered::cut`] reports it. Repair never
//! touches a snapshot, the identity, or a file of another version or another directory.
//!
//! # Compaction, crash-atomic at every step
//!
//! [`LogStore::compact`] (from generation `N` with everything written already synced, to
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
//! So the first such failure poisons the log: that call returns [`StorageError::Io`] and every
//! later call [`StorageError::Poisoned`]. The node must stop, drop its machine, and recover from the files
//! on restart. Refusing a record that is too large ([`StorageError::TooLarge`]) or a compaction
//! with unsynced records ([`StorageError::Unsynced`]) writes nothing and does not poison.
//!
//! The log is the only writer of its directory: `open` takes an exclusive `flock` on the `lock`
//! file before it reads or writes anything else, and fails ([`StorageError::Locked`]) if another
//! process holds it.
//!
//! A full disk is a failed write like any other: the log is poisoned and the node stops; it
//! starts again once recovery can write what it must (an operator made room).
//!
//! # When to compact
//!
//! [`LogStore::compaction_due`]: when everything written is synced and the log file holds at
//! least a minimum number of bytes and twice the bytes of the snapshot it started from, so a
//! compaction's cost is paid once per doubling.

mod format;
mod recovery;
mod space;
#[cfg(test)]
mod tests;

use core::fmt;

use crate::limits::LOG_RECORD_BYTES_MAX;
use crate::log::{LogRecord, RecordRef, TailDefect};

pub use format::{
    DataDirId, FORMAT_VERSION, HeaderError, IDENTITY_BYTES, LOG_HEADER_BYTES, LogHeader,
    MARK_BYTES, RecordError, SNAPSHOT_HEADER_BYTES, SNAPSHOT_TRAILER_BYTES, Scan, SnapshotProblem,
    crc32c, encode_into, identity_image, log_file_records, mark, parse_identity, scan,
    snapshot_image, snapshot_image_of, verify_snapshot,
};
pub use space::{Space, SpaceGate};

/// The name of the identity file.
pub const IDENTITY: &str = "identity";
/// The name of the lock file.
pub const LOCK: &str = "lock";

/// The name of `snapshot-<generation>`.
pub fn snapshot_name(generation: u64) -> String {
    format!("snapshot-{generation}")
}

/// The name of `log-<generation>`.
pub fn log_name(generation: u64) -> String {
    format!("log-{generation}")
}

fn snapshot_temp_name(generation: u64) -> String {
    format!("snapshot-{generation}.tmp")
}

/// What kind of failure a file-system error is, as far as the protocol cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsErrorKind {
    /// The file does not exist.
    NotFound,
    /// The file exists (an exclusive create).
    AlreadyExists,
    /// The disk is full.
    NoSpace,
    /// Anything else.
    Other,
}

/// Shows a path to an operator (in errors and notes).
pub trait ShowPath {
    /// Writes the path.
    fn fmt_path(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl ShowPath for String {
    fn fmt_path(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl ShowPath for std::path::PathBuf {
    fn fmt_path(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.display())
    }
}

/// [`ShowPath`] as [`fmt::Display`].
struct Shown<'a, P>(&'a P);

impl<P: ShowPath> fmt::Display for Shown<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt_path(f)
    }
}

/// The file operations the storage protocol needs, on one data directory. Files are named
/// by their name inside the directory. Nothing here decides anything: an implementation does
/// what it is asked, or fails.
pub trait FileSystem {
    /// An open file: reads and writes happen at its position, which an open or create puts at
    /// the file's end.
    type File: fmt::Debug;
    /// Why an operation failed.
    type Error: fmt::Debug + fmt::Display;
    /// How a file (or the directory) is named to an operator.
    type Path: Clone + fmt::Debug + PartialEq + Eq + ShowPath;

    /// The path of the file `name`, or of the directory itself if `name` is empty.
    fn path(&self, name: &str) -> Self::Path;
    /// What kind of failure `error` is.
    fn kind(error: &Self::Error) -> FsErrorKind;
    /// Whether the data directory exists.
    fn exists(&mut self) -> Result<bool, Self::Error>;
    /// Creates the data directory (and its missing ancestors, their names made durable).
    fn create_dir(&mut self) -> Result<(), Self::Error>;
    /// Takes the directory's exclusive lock, for as long as this file system lives; `false` if
    /// another process holds it.
    fn lock(&mut self) -> Result<bool, Self::Error>;
    /// The names of the files in the directory (names that are not text are left out).
    fn list(&mut self) -> Result<Vec<String>, Self::Error>;
    /// The whole contents of `name`.
    fn read(&mut self, name: &str) -> Result<Vec<u8>, Self::Error>;
    /// The length of `name`.
    fn len(&mut self, name: &str) -> Result<u64, Self::Error>;
    /// Creates `name`, or empties it if it exists; open to read and write.
    fn create(&mut self, name: &str) -> Result<Self::File, Self::Error>;
    /// Creates `name`, failing ([`FsErrorKind::AlreadyExists`]) if it exists.
    fn create_new(&mut self, name: &str) -> Result<Self::File, Self::Error>;
    /// Opens the existing `name` to read and write, positioned at its end.
    fn open(&mut self, name: &str) -> Result<Self::File, Self::Error>;
    /// Writes all of `bytes` at the file's position (its end, for this protocol).
    fn write(&mut self, file: &mut Self::File, bytes: &[u8]) -> Result<(), Self::Error>;
    /// Cuts the file to `len` bytes and moves its position there.
    fn truncate(&mut self, file: &mut Self::File, len: u64) -> Result<(), Self::Error>;
    /// Extends the file with zeros to `len` bytes if it is shorter, without moving its
    /// position, and without syncing. The zeros are written, not left as a hole or as
    /// allocated-but-unwritten space, so that later writes into them overwrite initialised
    /// blocks and a `sync_data` after such a write need not commit a change of the file's size
    /// or block map. After a crash before the next sync, the file may have any length between
    /// its old and its new one (its new bytes are zeros).
    fn preallocate(&mut self, file: &mut Self::File, len: u64) -> Result<(), Self::Error>;
    /// Makes the file's data durable (`fdatasync`).
    fn sync_data(&mut self, file: &mut Self::File) -> Result<(), Self::Error>;
    /// Makes the file's data and metadata durable (`fsync`).
    fn sync_all(&mut self, file: &mut Self::File) -> Result<(), Self::Error>;
    /// Makes the existing `name` durable (opens it and `fsync`s it).
    fn sync_file(&mut self, name: &str) -> Result<(), Self::Error>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&mut self, from: &str, to: &str) -> Result<(), Self::Error>;
    /// Removes `name`.
    fn remove(&mut self, name: &str) -> Result<(), Self::Error>;
    /// Makes the directory's names durable (`fsync` of the directory).
    fn sync_dir(&mut self) -> Result<(), Self::Error>;
    /// 128 unpredictable bits (ids and salts).
    fn entropy(&mut self) -> Result<u128, Self::Error>;
    /// Called before each step that changes the files, naming it: a test double may fail it
    /// (the step does not happen). The real file system does nothing.
    fn before(&mut self, op: &'static str) -> Result<(), Self::Error> {
        let _ = op;
        Ok(())
    }
}

/// The error of the protocol over the file system `F`.
pub type Error<F> = StorageError<<F as FileSystem>::Error, <F as FileSystem>::Path>;

/// What a compaction did ([`LogStore::compact`]).
#[derive(Debug)]
pub enum Compacted<E, P> {
    /// The log is now the snapshot, as a new generation.
    Done,
    /// The file system had no room for the snapshot (`ENOSPC` while creating, writing or
    /// syncing the temporary file, before anything recovery reads changed): that file is
    /// removed, the generation in use is untouched and the log goes on, unpoisoned. The next
    /// compaction is due once the log grew by the snapshot's size again. The error says what
    /// ran out of room.
    Postponed(StorageError<E, P>),
}

/// [`Compacted`] for the file system `F`.
pub type CompactedOn<F> = Compacted<<F as FileSystem>::Error, <F as FileSystem>::Path>;

/// An open log over the file system `F` and what its recovery found.
pub type Opened<F> = (LogStore<F>, Recovered<<F as FileSystem>::Path>);

/// Why the log refused or failed an operation.
#[derive(Debug)]
pub enum StorageError<E, P> {
    /// A file-system operation failed. Raised by a log method, this poisons the log.
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: P,
        /// The error.
        source: E,
    },
    /// Another process has the directory open (its `lock` file is locked); nothing was read
    /// or changed.
    Locked {
        /// The lock file.
        path: P,
    },
    /// The log is damaged where it had been synced: cutting it there would drop acknowledged
    /// records; nothing was changed. [`StorageOptions::repair`] cuts it, keeping a copy.
    Damaged {
        /// The log file.
        path: P,
        /// Where its valid records end (a file offset).
        offset: u64,
        /// What is wrong there.
        defect: TailDefect,
        /// The offset of a valid sync mark after the damage: the log was synced up to there.
        synced_past: u64,
    },
    /// The log of the generation in use is missing, empty or has no readable header, though
    /// the directory shows it was written; nothing was changed. [`StorageOptions::repair`]
    /// starts it empty after its snapshot, keeping a copy of the old bytes.
    MissingLog {
        /// The log file.
        path: P,
        /// What is wrong with it.
        reason: String,
    },
    /// The directory lost what recovery needs to start (its log, or its identity); nothing
    /// was changed, and a repair cannot help.
    Lost {
        /// The missing file (or the directory).
        path: P,
        /// What is missing, and why it should be there.
        reason: String,
    },
    /// A file names another data directory: it was copied or moved here from elsewhere;
    /// nothing was changed.
    Foreign {
        /// The file.
        path: P,
        /// The id it names.
        found: DataDirId,
        /// This directory's id.
        expected: DataDirId,
    },
    /// A file is in a format version this build does not read; nothing was changed.
    UnknownVersion {
        /// The file.
        path: P,
        /// The version it says it is in.
        version: u32,
    },
    /// The directory holds no state recovery can trust (see the module documentation);
    /// nothing was changed.
    Corrupt {
        /// The offending file (or the directory).
        path: P,
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

impl<E, P> StorageError<E, P> {
    /// Whether this is recovery refusing the directory's contents (rather than a storage
    /// failure, a lock, or a bad call): the files need a person.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StorageError::Damaged { .. }
                | StorageError::MissingLog { .. }
                | StorageError::Lost { .. }
                | StorageError::Foreign { .. }
                | StorageError::UnknownVersion { .. }
                | StorageError::Corrupt { .. }
        )
    }

    /// Whether [`StorageOptions::repair`] would get past this refusal.
    pub fn is_repairable(&self) -> bool {
        matches!(
            self,
            StorageError::Damaged { .. } | StorageError::MissingLog { .. }
        )
    }
}

impl<E: fmt::Display, P: ShowPath> fmt::Display for StorageError<E, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Io { op, path, source } => {
                write!(f, "log: {op} failed on {}: {source}", Shown(path))
            }
            StorageError::Locked { path } => write!(
                f,
                "log: {} is locked: another process has this data directory open",
                Shown(path)
            ),
            StorageError::Damaged {
                path,
                offset,
                defect,
                synced_past,
            } => write!(
                f,
                "log: {} is damaged at byte {offset} ({defect}), but it was synced up to \
                 byte {synced_past}: the records after the damage were acknowledged, and \
                 cutting the log there would lose them",
                Shown(path)
            ),
            StorageError::MissingLog { path, reason } | StorageError::Lost { path, reason } => {
                write!(f, "log: {} {reason}", Shown(path))
            }
            StorageError::Foreign {
                path,
                found,
                expected,
            } => write!(
                f,
                "log: {} belongs to another data directory (id {found}; this one is {expected})",
                Shown(path)
            ),
            StorageError::UnknownVersion { path, version } => write!(
                f,
                "log: {} is in format version {version}; this build reads version \
                 {FORMAT_VERSION} only",
                Shown(path)
            ),
            StorageError::Corrupt { path, reason } => {
                write!(f, "log: {} is corrupt: {reason}", Shown(path))
            }
            StorageError::TooLarge { len, max } => {
                write!(f, "log: record body is {len} bytes, the limit is {max}")
            }
            StorageError::Encode(reason) => write!(f, "log: record does not encode: {reason}"),
            StorageError::Unsynced { written, synced } => write!(
                f,
                "log: cannot compact with unsynced records ({written} bytes written, {synced} synced)"
            ),
            StorageError::Poisoned => f.write_str(
                "log: poisoned by an earlier storage failure; restart and recover from disk",
            ),
        }
    }
}

impl<E, P> std::error::Error for StorageError<E, P>
where
    E: std::error::Error + 'static,
    P: ShowPath + fmt::Debug,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StorageError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// How [`LogStore::open`] treats a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageOptions {
    /// Whether a directory without a log may be initialised as a new one. A caller that knows
    /// the directory held a log before (the directory node: its data directory has booted)
    /// sets this to false, so that a log deleted with its identity is [`StorageError::Lost`]
    /// instead of silently started afresh.
    pub create: bool,
    /// Cut a damaged log at its first bad byte, and start a missing or headless log empty
    /// after its snapshot, keeping a copy of every byte cut (see "Repair" in the module
    /// documentation).
    pub repair: bool,
    /// Grow the log file in steps of this many bytes of zeros, written ahead of the records
    /// ("Preallocation" in the module documentation); 0: the file grows with each write.
    pub preallocate: u64,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            create: true,
            repair: false,
            preallocate: 0,
        }
    }
}

/// Bytes recovery cut off the log, and why it was allowed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut<P> {
    /// A torn tail: nothing shows these bytes were ever synced.
    TornTail {
        /// The log file.
        path: P,
        /// Where the cut bytes started (a file offset; the log now ends here).
        offset: u64,
        /// How many bytes were cut.
        bytes: u64,
        /// What was wrong at `offset`.
        defect: TailDefect,
        /// The position of the last sync mark before the cut: the log is known synced to here.
        synced_to: u64,
    },
    /// A repair ([`StorageOptions::repair`]) cut bytes that recovery would have refused to cut.
    Repaired {
        /// The log file.
        path: P,
        /// Where the cut bytes started (an offset in the old file).
        offset: u64,
        /// How many bytes were cut.
        bytes: u64,
        /// What was wrong.
        reason: String,
        /// The file that keeps the cut bytes (none if there were none: a missing log).
        copy: Option<P>,
    },
}

impl<P: ShowPath> fmt::Display for Cut<P> {
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
                Shown(path)
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
                    Shown(path)
                )?;
                match copy {
                    Some(copy) => write!(f, "; the cut bytes are kept in {}", Shown(copy)),
                    None => f.write_str("; there were no bytes to keep"),
                }
            }
        }
    }
}

/// What [`LogStore::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered<P> {
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
    pub cut: Option<Cut<P>>,
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
    pub removed: Vec<P>,
}

impl<P: ShowPath> Recovered<P> {
    /// One line for each thing recovery did that an operator should hear about: a new
    /// directory, a discarded generation, a cut.
    pub fn notes(&self, dir: &P) -> Vec<String> {
        let mut notes = Vec::new();
        if self.created {
            notes.push(format!(
                "log: created a new log in {} (data directory id {})",
                Shown(dir),
                self.id
            ));
        }
        if let Some(discarded) = self.discarded_generation {
            notes.push(format!(
                "log: discarded generation {discarded} of {} (incomplete snapshot, no records); \
                 recovered generation {}",
                Shown(dir),
                self.generation
            ));
        }
        if let Some(cut) = &self.cut {
            notes.push(cut.to_string());
        }
        notes
    }

    /// At most how many records that had been synced (and so acted on: a boot used, an epoch
    /// served, a host told its incarnation) a repair cut: 0 without a repair. Every record
    /// takes at least one byte, so the cut bytes bound them; a log that was missing or empty
    /// bounds nothing, and counts as [`LOST_UNKNOWN`]. The counters the log hands out (boots,
    /// the authority epoch) skip this many past the last value recorded, so that none is
    /// handed out twice.
    pub fn lost_bound(&self) -> u64 {
        match &self.cut {
            Some(Cut::Repaired { bytes: 0, .. }) => LOST_UNKNOWN,
            Some(Cut::Repaired { bytes, .. }) => *bytes,
            Some(Cut::TornTail { .. }) | None => 0,
        }
    }
}

/// [`Recovered::lost_bound`] of a repair that found no bytes to count (a missing or empty
/// log): 2^32, more records than a log holds before it is compacted.
pub const LOST_UNKNOWN: u64 = 1 << 32;

/// One directory's durable log over the file system `F`: the protocol's state (which
/// generation, how far written and synced, poisoned or not); every call gets the file system
/// it runs on. See the module documentation.
#[derive(Debug)]
pub struct LogStore<F: FileSystem> {
    id: DataDirId,
    generation: u64,
    salt: u64,
    log_name: String,
    file: F::File,
    written: u64,
    synced: u64,
    /// The length of the log file: `written`, plus preallocated zeros after it.
    allocated: u64,
    /// The step the file grows by ([`StorageOptions::preallocate`]; 0: none).
    preallocate: u64,
    poisoned: bool,
    max_record_bytes: usize,
    /// Bytes of the snapshot the current generation started from (the compaction policy).
    snapshot_bytes: u64,
    /// No compaction is due before the log reaches this position: a compaction that found no
    /// room is tried again only once the log grew by its snapshot's size (0: no such wait).
    compaction_after: u64,
    buf: Vec<u8>,
}

/// Whether `error` is the file system running out of room for a compaction's snapshot before
/// it was renamed into place (so nothing recovery reads changed).
fn no_room_for_the_snapshot<F: FileSystem>(error: &Error<F>) -> bool {
    matches!(error, StorageError::Io { op, source, .. }
        if F::kind(source) == FsErrorKind::NoSpace
            && matches!(*op, "create snapshot temp" | "write snapshot temp" | "sync snapshot temp"))
}

/// Runs one file-system step that changes the files: first [`FileSystem::before`], then `f`;
/// a failure is [`StorageError::Io`] naming `op` and the file.
fn step<F: FileSystem, T>(
    fs: &mut F,
    op: &'static str,
    name: &str,
    f: impl FnOnce(&mut F) -> Result<T, F::Error>,
) -> Result<T, Error<F>> {
    let result = match fs.before(op) {
        Ok(()) => f(fs),
        Err(e) => Err(e),
    };
    result.map_err(|source| StorageError::Io {
        op,
        path: fs.path(name),
        source,
    })
}

/// Runs one file-system step that only reads.
fn read_step<F: FileSystem, T>(
    fs: &mut F,
    op: &'static str,
    name: &str,
    f: impl FnOnce(&mut F) -> Result<T, F::Error>,
) -> Result<T, Error<F>> {
    f(fs).map_err(|source| StorageError::Io {
        op,
        path: fs.path(name),
        source,
    })
}

fn random_u128<F: FileSystem>(fs: &mut F) -> Result<u128, Error<F>> {
    read_step(fs, "draw a random id", "", |fs| fs.entropy())
}

fn random_u64<F: FileSystem>(fs: &mut F) -> Result<u64, Error<F>> {
    // Truncation keeps 64 of the 128 random bits.
    random_u128(fs).map(|r| r as u64)
}

impl<F: FileSystem> LogStore<F> {
    /// Opens the log in `fs`'s directory and recovers it: takes the lock, reads everything and
    /// decides (refusing, with every file left as it was, what it must not cut or guess), then
    /// cuts a torn tail (or repairs), makes what it read durable and removes leftovers. A
    /// missing directory is created if `options.create`.
    pub fn open(fs: &mut F, options: StorageOptions) -> Result<Opened<F>, Error<F>> {
        recovery::open(fs, options)
    }

    /// Writes `record` at the end of the log, without syncing; returns the position (bytes
    /// into the current log file) where the record ends: it is durable once
    /// [`synced`](Self::synced) reaches that position.
    pub fn append(&mut self, fs: &mut F, record: &LogRecord) -> Result<u64, Error<F>> {
        self.check_healthy()?;
        self.buf.clear();
        let frame = encode_into(&mut self.buf, record, self.max_record_bytes)?;
        self.reserve(fs, frame as u64)?;
        let (file, buf) = (&mut self.file, &self.buf);
        let result = step(fs, "write log", &self.log_name, |fs| fs.write(file, buf));
        self.poison_on_error(result)?;
        self.written += frame as u64;
        self.allocated = self.allocated.max(self.written);
        Ok(self.written)
    }

    /// Makes everything written durable (`fdatasync`), then writes a sync mark after it;
    /// returns the synced position. One sync commits every record appended since the last one
    /// (group commit). A failure poisons the log: a failed sync is never retried.
    ///
    /// The mark itself is not synced and needs not be (losing it loses no record), so the
    /// returned position, like [`synced`](Self::synced), counts it.
    pub fn sync(&mut self, fs: &mut F) -> Result<u64, Error<F>> {
        self.check_healthy()?;
        if self.synced == self.written {
            return Ok(self.synced);
        }
        let file = &mut self.file;
        let result = step(fs, "sync log", &self.log_name, |fs| fs.sync_data(file));
        self.poison_on_error(result)?;
        self.synced = self.written;
        self.write_mark(fs)?;
        Ok(self.synced)
    }

    /// Makes sure the file is preallocated for `bytes` more, and a sync mark after them
    /// (nothing without preallocation): else grows it with zeros to the next multiple of the
    /// preallocation step. Not synced: the next sync makes the new length durable with the
    /// records written into it, and a crash before it leaves zeros or a shorter file, both of
    /// which recovery reads as the end of the log.
    fn reserve(&mut self, fs: &mut F, bytes: u64) -> Result<(), Error<F>> {
        let need = self.written + bytes + MARK_BYTES as u64;
        if self.preallocate == 0 || need <= self.allocated {
            return Ok(());
        }
        let len = need.next_multiple_of(self.preallocate);
        let file = &mut self.file;
        let result = step(fs, "preallocate log", &self.log_name, |fs| {
            fs.preallocate(file, len)
        });
        self.poison_on_error(result)?;
        self.allocated = len;
        Ok(())
    }

    /// Makes sure the file is preallocated for `bytes` more records' bytes and a sync mark
    /// after them, growing it to the next multiple of the preallocation step if it is not:
    /// `Ok(true)` when the room is there. A file system without room for the growth answers
    /// `Ok(false)` and changes nothing the log relies on (the zeros a partial growth may
    /// have written past [`allocated`](Self::allocated) are the end of the log to recovery,
    /// and a later growth writes over them); the log stays healthy. Any other failure poisons
    /// it. Without preallocation nothing can be made sure of, and the answer is `Ok(true)`:
    /// an append that finds no room poisons the log.
    pub fn make_room(&mut self, fs: &mut F, bytes: u64) -> Result<bool, Error<F>> {
        self.check_healthy()?;
        if self.preallocate == 0 {
            return Ok(true);
        }
        let need = self.written + bytes + MARK_BYTES as u64;
        if need <= self.allocated {
            return Ok(true);
        }
        let len = need.next_multiple_of(self.preallocate);
        let file = &mut self.file;
        match step(fs, "preallocate log", &self.log_name, |fs| {
            fs.preallocate(file, len)
        }) {
            Ok(()) => {
                self.allocated = len;
                Ok(true)
            }
            Err(StorageError::Io { ref source, .. }) if F::kind(source) == FsErrorKind::NoSpace => {
                Ok(false)
            }
            Err(e) => self.poison_on_error(Err(e)),
        }
    }

    /// Bytes preallocated after what is written (room for records that needs no growth).
    pub fn room(&self) -> u64 {
        self.allocated.saturating_sub(self.written)
    }

    /// Whether the log grows ahead of its records ([`StorageOptions::preallocate`] not 0).
    pub fn preallocates(&self) -> bool {
        self.preallocate != 0
    }

    /// Writes the sync mark of the current position, which must be synced.
    fn write_mark(&mut self, fs: &mut F) -> Result<(), Error<F>> {
        debug_assert_eq!(self.synced, self.written);
        self.reserve(fs, 0)?;
        let mark = mark(self.salt, self.written);
        let file = &mut self.file;
        let result = step(fs, "write sync mark", &self.log_name, |fs| {
            fs.write(file, &mark)
        });
        self.poison_on_error(result)?;
        self.written += MARK_BYTES as u64;
        self.synced = self.written;
        self.allocated = self.allocated.max(self.written);
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

    /// Bytes in the current log file (written, not counting preallocated zeros).
    pub fn len_bytes(&self) -> u64 {
        self.written
    }

    /// The length of the current log file: [`written`](Self::written) and the preallocated
    /// zeros after it.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The data directory's id.
    pub fn id(&self) -> DataDirId {
        self.id
    }

    /// The name of the current log file.
    pub fn log_name(&self) -> &str {
        &self.log_name
    }

    /// Whether an earlier failure poisoned the log.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Lowers (or restores) the limit on a record's encoded body; tests use it to reach the
    /// refusal no valid record reaches.
    pub fn set_record_limit(&mut self, max: usize) {
        self.max_record_bytes = max.min(LOG_RECORD_BYTES_MAX);
    }

    /// Whether it is time to compact: everything written is synced, and the log file holds at
    /// least `min_bytes` and at least twice the bytes of the snapshot its generation started
    /// from (and, after a compaction that found no room, a snapshot's size more than then).
    pub fn compaction_due(&self, min_bytes: u64) -> bool {
        !self.poisoned
            && self.written == self.synced
            && self.written >= min_bytes
            && self.written >= self.snapshot_bytes.saturating_mul(2)
            && self.written >= self.compaction_after
    }

    /// Replaces the whole log by `snapshot` (records whose replay from nothing rebuilds the
    /// current durable state), crash-atomically, as a new generation whose log starts empty:
    /// positions restart after the new log's header. Everything written must be synced first
    /// ([`StorageError::Unsynced`] otherwise). A file system without room for the snapshot
    /// postpones it ([`Compacted::Postponed`]); any other failure poisons the log.
    pub fn compact(
        &mut self,
        fs: &mut F,
        snapshot: &[LogRecord],
    ) -> Result<CompactedOn<F>, Error<F>> {
        self.compact_from(fs, snapshot.iter().map(RecordRef::Record))
    }

    /// [`LogStore::compact`] with the records `snapshot` stands for, encoded as they come: a
    /// directory compacts from [`RecordRef`]s borrowed from its state, never cloning it.
    pub fn compact_from<'a>(
        &mut self,
        fs: &mut F,
        snapshot: impl IntoIterator<Item = RecordRef<'a>>,
    ) -> Result<CompactedOn<F>, Error<F>> {
        self.check_healthy()?;
        if self.written != self.synced {
            return Err(StorageError::Unsynced {
                written: self.written,
                synced: self.synced,
            });
        }
        let Some(next) = self.generation.checked_add(1) else {
            return Err(StorageError::Corrupt {
                path: fs.path(""),
                reason: "generation numbers exhausted".to_owned(),
            });
        };
        let image = snapshot_image_of(self.id, next, snapshot, self.max_record_bytes)?;
        let salt = random_u64(fs);
        let salt = self.poison_on_error(salt)?;
        let header = LogHeader {
            id: self.id,
            generation: next,
            salt,
        };
        let installed = match recovery::install_generation(fs, &image, &header) {
            Err(error) if no_room_for_the_snapshot::<F>(&error) => {
                // Nothing recovery reads changed (the snapshot was not renamed into place):
                // remove what was written of it, and go on with the log as it is.
                let temp = snapshot_temp_name(next);
                let removed = match step(fs, "remove snapshot temp", &temp, |fs| fs.remove(&temp)) {
                    Err(StorageError::Io { source, .. })
                        if F::kind(&source) == FsErrorKind::NotFound =>
                    {
                        Ok(())
                    }
                    other => other,
                };
                self.poison_on_error(removed)?;
                self.compaction_after = self.written.saturating_add(image.len() as u64);
                return Ok(Compacted::Postponed(error));
            }
            other => other,
        };
        let file = self.poison_on_error(installed)?;

        let old = self.generation;
        self.file = file;
        self.generation = next;
        self.salt = salt;
        self.log_name = log_name(next);
        self.written = LOG_HEADER_BYTES as u64;
        self.synced = self.written;
        self.allocated = self.written;
        self.snapshot_bytes = image.len() as u64;
        self.compaction_after = 0;

        let (old_snapshot, old_log) = (snapshot_name(old), log_name(old));
        let cleanup = step(fs, "remove old snapshot", &old_snapshot, |fs| {
            fs.remove(&old_snapshot)
        })
        .and_then(|()| step(fs, "remove old log", &old_log, |fs| fs.remove(&old_log)))
        .and_then(|()| step(fs, "sync directory", "", |fs| fs.sync_dir()));
        self.poison_on_error(cleanup)?;
        Ok(Compacted::Done)
    }

    fn check_healthy(&self) -> Result<(), Error<F>> {
        if self.poisoned {
            Err(StorageError::Poisoned)
        } else {
            Ok(())
        }
    }

    fn poison_on_error<T>(&mut self, result: Result<T, Error<F>>) -> Result<T, Error<F>> {
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }
}

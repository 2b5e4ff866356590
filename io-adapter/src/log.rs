//! The directory node's durable log on real files: [`RealFs`] carries out the file operations
//! of core's storage protocol ([`dataplane_core::storage`]) with `std::fs`, `flock` and
//! `getrandom`, and [`DurableLog`] holds the protocol's state with the files it runs on.
//!
//! Every decision — the file layout, which generation recovery reads, a torn tail or damage,
//! the steps of a compaction, poisoning after a failed write or sync, when to compact — is the
//! core's, and its module documentation has the whole argument. The simulator runs the same
//! protocol on a simulated file system that crashes, tears, loses and damages what a disk may.
//!
//! The data directory is the log's only: `open` takes an exclusive `flock` on its `lock` file
//! before it reads or writes anything else, and holds it for as long as the log is open.

#[cfg(test)]
mod tests;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use dataplane_core::log::{LogRecord, RecordRef};
use dataplane_core::storage::{
    self, Compacted, FileSystem, FsErrorKind, LogStore, Space, SpaceGate, StorageError,
};

pub use dataplane_core::storage::{
    DataDirId, FORMAT_VERSION, HeaderError, IDENTITY_BYTES, LOG_HEADER_BYTES, LogHeader,
    MARK_BYTES, SNAPSHOT_HEADER_BYTES, SNAPSHOT_TRAILER_BYTES, Scan, SnapshotProblem,
    identity_image, log_file_records, mark, parse_identity, scan, verify_snapshot,
};

/// Why the log refused or failed an operation (core's error, with real paths).
pub type LogError = StorageError<io::Error, PathBuf>;
/// What a compaction of the real log did.
pub type LogCompacted = Compacted<io::Error, PathBuf>;
/// How [`DurableLog::open_with`] treats a directory.
pub type LogOptions = storage::StorageOptions;
/// Bytes recovery cut off the log, and why it was allowed to.
pub type Cut = storage::Cut<PathBuf>;
/// What [`DurableLog::open`] found.
pub type Recovered = storage::Recovered<PathBuf>;

/// One directory's durable log in one data directory: core's protocol on real files.
#[derive(Debug)]
pub struct DurableLog {
    fs: RealFs,
    store: LogStore<RealFs>,
}

impl DurableLog {
    /// [`open_with`](Self::open_with) the default options: create a new directory if there is
    /// no log, never repair.
    pub fn open(dir: &Path) -> Result<(DurableLog, Recovered), LogError> {
        DurableLog::open_with(dir, LogOptions::default())
    }

    /// Opens the log in `dir` and recovers it ([`LogStore::open`]): takes the lock, reads
    /// everything and decides, then cuts a torn tail (or repairs), makes what it read durable
    /// and removes leftovers. A missing `dir` is created if `options.create`.
    pub fn open_with(dir: &Path, options: LogOptions) -> Result<(DurableLog, Recovered), LogError> {
        let mut fs = RealFs {
            dir: dir.to_owned(),
            lock: None,
            faults: Faults::default(),
        };
        let (store, recovered) = LogStore::open(&mut fs, options)?;
        Ok((DurableLog { fs, store }, recovered))
    }

    /// Writes `record` at the end of the log, without syncing; returns the position where the
    /// record ends ([`LogStore::append`]).
    pub fn append(&mut self, record: &LogRecord) -> Result<u64, LogError> {
        self.store.append(&mut self.fs, record)
    }

    /// Makes everything written durable and returns the synced position ([`LogStore::sync`]).
    pub fn sync(&mut self) -> Result<u64, LogError> {
        self.store.sync(&mut self.fs)
    }

    /// Asks `gate` at `now` whether the log has its reserve of room for new operations,
    /// growing the file if it must (see [`SpaceGate`]). A failure other than a full disk
    /// poisons the log.
    pub fn check_space(
        &mut self,
        gate: &mut SpaceGate,
        now: dataplane_core::time::Instant,
    ) -> Result<Space, LogError> {
        gate.check(now, &mut self.store, &mut self.fs)
    }

    /// Replaces the whole log by `snapshot` as a new generation ([`LogStore::compact`]), or
    /// postpones that when the disk has no room for it ([`Compacted::Postponed`]).
    pub fn compact(&mut self, snapshot: &[LogRecord]) -> Result<LogCompacted, LogError> {
        self.store.compact(&mut self.fs, snapshot)
    }

    /// [`DurableLog::compact`] with borrowed records, encoded as they come
    /// ([`LogStore::compact_from`]).
    pub fn compact_from<'a>(
        &mut self,
        snapshot: impl IntoIterator<Item = RecordRef<'a>>,
    ) -> Result<LogCompacted, LogError> {
        self.store.compact_from(&mut self.fs, snapshot)
    }

    /// Whether it is time to compact ([`LogStore::compaction_due`]).
    pub fn compaction_due(&self, min_bytes: u64) -> bool {
        self.store.compaction_due(min_bytes)
    }

    /// Bytes written to the current log file (synced or not).
    pub fn written(&self) -> u64 {
        self.store.written()
    }

    /// Bytes of the current log file known durable.
    pub fn synced(&self) -> u64 {
        self.store.synced()
    }

    /// Bytes in the current log file.
    pub fn len_bytes(&self) -> u64 {
        self.store.len_bytes()
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.store.generation()
    }

    /// The data directory's id.
    pub fn id(&self) -> DataDirId {
        self.store.id()
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.fs.dir
    }

    /// The current log file.
    pub fn log_path(&self) -> PathBuf {
        self.fs.path(self.store.log_name())
    }

    /// Whether an earlier failure poisoned the log.
    pub fn is_poisoned(&self) -> bool {
        self.store.is_poisoned()
    }
}

/// The real file system under one data directory.
#[derive(Debug)]
pub struct RealFs {
    dir: PathBuf,
    /// The `flock`ed lock file, held for as long as this lives.
    lock: Option<File>,
    faults: Faults,
}

impl FileSystem for RealFs {
    type File = File;
    type Error = io::Error;
    type Path = PathBuf;

    fn path(&self, name: &str) -> PathBuf {
        if name.is_empty() {
            self.dir.clone()
        } else {
            self.dir.join(name)
        }
    }

    fn kind(error: &io::Error) -> FsErrorKind {
        match error.kind() {
            io::ErrorKind::NotFound => FsErrorKind::NotFound,
            io::ErrorKind::AlreadyExists => FsErrorKind::AlreadyExists,
            io::ErrorKind::StorageFull => FsErrorKind::NoSpace,
            _ => FsErrorKind::Other,
        }
    }

    fn exists(&mut self) -> io::Result<bool> {
        match fs::metadata(&self.dir) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn create_dir(&mut self) -> io::Result<()> {
        let mut missing = Vec::new();
        for ancestor in self.dir.ancestors() {
            if ancestor.as_os_str().is_empty() {
                break;
            }
            match fs::metadata(ancestor) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(ancestor),
                Err(e) => return Err(e),
            }
        }
        fs::create_dir_all(&self.dir)?;
        // Each new name durable in its parent.
        for created in missing {
            match created.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
                _ => sync_dir(Path::new("."))?,
            }
        }
        Ok(())
    }

    fn lock(&mut self) -> io::Result<bool> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(storage::LOCK))?;
        if lock.try_lock().is_err() {
            return Ok(false);
        }
        self.lock = Some(lock);
        Ok(true)
    }

    fn list(&mut self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        fs::read(self.dir.join(name))
    }

    fn len(&mut self, name: &str) -> io::Result<u64> {
        Ok(fs::metadata(self.dir.join(name))?.len())
    }

    fn create(&mut self, name: &str) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.dir.join(name))
    }

    fn create_new(&mut self, name: &str) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.dir.join(name))
    }

    fn open(&mut self, name: &str) -> io::Result<File> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join(name))?;
        file.seek(SeekFrom::End(0))?;
        Ok(file)
    }

    fn write(&mut self, file: &mut File, bytes: &[u8]) -> io::Result<()> {
        file.write_all(bytes)
    }

    fn truncate(&mut self, file: &mut File, len: u64) -> io::Result<()> {
        file.set_len(len)?;
        file.seek(SeekFrom::Start(len)).map(|_| ())
    }

    /// Writes zeros from the file's end to `len` with `pwrite` (the position stays): written
    /// blocks, not a hole or `fallocate`'s unwritten extents, whose first write would change
    /// the block map and make that write's `fdatasync` commit it.
    fn preallocate(&mut self, file: &mut File, len: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let mut at = file.metadata()?.len();
        while at < len {
            let n = (len - at).min(ZEROS.len() as u64);
            file.write_all_at(&ZEROS[..n as usize], at)?;
            at += n;
        }
        Ok(())
    }

    fn sync_data(&mut self, file: &mut File) -> io::Result<()> {
        file.sync_data()
    }

    fn sync_all(&mut self, file: &mut File) -> io::Result<()> {
        file.sync_all()
    }

    fn sync_file(&mut self, name: &str) -> io::Result<()> {
        File::open(self.dir.join(name))?.sync_all()
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        fs::remove_file(self.dir.join(name))
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        sync_dir(&self.dir)
    }

    /// 128 bits from the kernel's random source (the `getrandom` system call).
    fn entropy(&mut self) -> io::Result<u128> {
        let mut bytes = [0; 16];
        getrandom::fill(&mut bytes)?;
        Ok(u128::from_le_bytes(bytes))
    }

    fn before(&mut self, op: &'static str) -> io::Result<()> {
        self.faults.check(op)
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Test-only fault injection: every file-system step that changes the files goes through
/// [`Faults::check`]; a test can make the n-th next step fail (before it runs).
#[derive(Debug, Default)]
struct Faults {
    /// Fail the step with this index in `steps`, once.
    #[cfg(test)]
    fail_at: Option<usize>,
    /// The steps attempted so far.
    #[cfg(test)]
    steps: Vec<&'static str>,
    /// The injected failure is a full disk (`ENOSPC`) rather than an I/O error.
    #[cfg(test)]
    no_room: bool,
}

impl Faults {
    #[cfg(test)]
    fn check(&mut self, op: &'static str) -> io::Result<()> {
        if self.fail_at == Some(self.steps.len()) {
            // Once: the failed step is not counted, so the next one would match too.
            self.fail_at = None;
            if self.no_room {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("injected full disk before {op}"),
                ));
            }
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

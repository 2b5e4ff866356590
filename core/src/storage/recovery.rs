//! Recovery (the module documentation of [`crate::storage`], "Recovery"): read the directory,
//! decide everything — which generation, a torn tail or damage, what is lost — and only then
//! write. Also the crash-atomic installation of a generation that compaction shares.

use std::collections::BTreeMap;

use crate::limits::LOG_RECORD_BYTES_MAX;
use crate::log::{LogRecord, TailDefect};

use super::{
    Cut, DataDirId, Error, FileSystem, FsErrorKind, HeaderError, IDENTITY, LOG_HEADER_BYTES,
    LogHeader, LogStore, Recovered, Scan, SnapshotProblem, StorageError, StorageOptions,
    encode_into, identity_image, log_name, parse_identity, random_u64, random_u128, read_step,
    scan, snapshot_image, snapshot_name, snapshot_temp_name, step, verify_snapshot,
};

/// See [`LogStore::open`].
pub(super) fn open<F: FileSystem>(
    fs: &mut F,
    options: StorageOptions,
) -> Result<super::Opened<F>, Error<F>> {
    if !read_step(fs, "stat directory", "", |fs| fs.exists())? {
        if !options.create {
            return Err(StorageError::Lost {
                path: fs.path(""),
                reason: "does not exist, but this data directory had a log".to_owned(),
            });
        }
        read_step(fs, "create directory", "", |fs| fs.create_dir())?;
    }
    // One process per data directory, and nothing read or changed before the lock: a second
    // directory node on the same files would corrupt them.
    if !read_step(fs, "open lock", super::LOCK, |fs| fs.lock())? {
        return Err(StorageError::Locked {
            path: fs.path(super::LOCK),
        });
    }
    let listing = list(fs)?;
    let plan = plan(fs, &listing, options)?;
    // Everything below writes; everything above only read.
    let (id, generation, snapshot, snapshot_bytes, discarded_generation, created, opened) =
        match plan {
            Plan::Fresh => {
                let id = DataDirId(random_u128(fs)?);
                let header = LogHeader {
                    id,
                    generation: 0,
                    salt: random_u64(fs)?,
                };
                let image = snapshot_image(id, 0, &[], LOG_RECORD_BYTES_MAX)?;
                let file = install_generation(fs, &image, &header)?;
                write_identity(fs, id)?;
                let opened = Opened::empty(file, header);
                (id, 0, Vec::new(), image.len(), None, true, opened)
            }
            Plan::Existing(existing) => {
                let name = snapshot_name(existing.generation);
                step(fs, "sync snapshot", &name, |fs| fs.sync_file(&name))?;
                let opened = open_log(fs, existing.id, existing.generation, existing.log)?;
                (
                    existing.id,
                    existing.generation,
                    existing.snapshot,
                    existing.snapshot_bytes,
                    existing.discarded,
                    false,
                    opened,
                )
            }
        };
    step(fs, "sync directory", "", |fs| fs.sync_dir())?;

    let mut removed = Vec::new();
    for temp in &listing.temps {
        remove(fs, temp, &mut removed)?;
    }
    for (&other, files) in &listing.generations {
        if other == generation {
            continue;
        }
        if files.snapshot {
            remove(fs, &snapshot_name(other), &mut removed)?;
        }
        if files.log {
            remove(fs, &log_name(other), &mut removed)?;
        }
    }
    if !removed.is_empty() {
        step(fs, "sync directory", "", |fs| fs.sync_dir())?;
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
    let mut log = LogStore {
        id,
        generation,
        salt: header.salt,
        log_name: log_name(generation),
        file,
        written: end,
        synced: end,
        allocated: end,
        preallocate: options.preallocate,
        poisoned: false,
        max_record_bytes: LOG_RECORD_BYTES_MAX,
        snapshot_bytes: snapshot_bytes as u64,
        compaction_after: 0,
        buf: Vec::new(),
    };
    if needs_mark {
        // Everything read is synced now; say so, so that damage to it is never taken for a
        // torn tail.
        log.write_mark(fs)?;
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

/// What recovery decided, before it writes anything.
enum Plan {
    /// A new directory (or a first open that crashed before its identity was written).
    Fresh,
    /// An existing directory's generation.
    Existing(Box<Existing>),
}

struct Existing {
    id: DataDirId,
    generation: u64,
    snapshot: Vec<LogRecord>,
    snapshot_bytes: usize,
    discarded: Option<u64>,
    log: LogPlan,
}

/// What to do with the chosen generation's log.
enum LogPlan {
    /// It is missing or shorter than a header, and an older generation is still there: a
    /// compaction crashed before its log was durable. Write it afresh.
    Create,
    /// Its header reads: keep its valid chain, cutting a torn tail (or, repairing, damage).
    Keep {
        header: LogHeader,
        bytes: Vec<u8>,
        scan: Scan,
    },
    /// Repairing a log that is missing, empty or headless: start it empty, keeping its bytes.
    Replace { bytes: Vec<u8>, reason: String },
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
    temps: Vec<String>,
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

fn list<F: FileSystem>(fs: &mut F) -> Result<Listing, Error<F>> {
    let mut listing = Listing::default();
    let mut names = read_step(fs, "list directory", "", |fs| fs.list())?;
    // The order of a directory listing is the file system's; the decisions must not be.
    names.sort();
    for name in names {
        match parse_name(&name) {
            Some(FileName::Identity) => listing.identity = true,
            Some(FileName::Snapshot(n)) => {
                listing.generations.entry(n).or_default().snapshot = true;
            }
            Some(FileName::Log(n)) => {
                listing.generations.entry(n).or_default().log = true;
            }
            Some(FileName::Temp) => listing.temps.push(name),
            None => {}
        }
    }
    Ok(listing)
}

/// Reads the directory and decides what recovery does; every refusal is made here.
fn plan<F: FileSystem>(
    fs: &mut F,
    listing: &Listing,
    options: StorageOptions,
) -> Result<Plan, Error<F>> {
    let Some(id) = read_identity(fs, listing)? else {
        return plan_without_identity(fs, listing, options);
    };
    let Some((&top, top_files)) = listing.generations.last_key_value() else {
        return Err(StorageError::Lost {
            path: fs.path(""),
            reason: format!(
                "holds no snapshot and no log, but its identity file says a log was created \
                 here (id {id})"
            ),
        });
    };
    let (generation, (snapshot, snapshot_bytes), discarded) =
        match read_snapshot(fs, id, top, top_files)? {
            Ok(read) => (top, read, None),
            Err(reason) => {
                let held = log_extent(fs, top, top_files)?;
                if held > LOG_HEADER_BYTES as u64 {
                    return Err(StorageError::Corrupt {
                        path: fs.path(&snapshot_name(top)),
                        reason: format!(
                            "{reason}, but log-{top} holds {held} bytes (not counting \
                             trailing zeros), more than a header"
                        ),
                    });
                }
                let Some((&previous, files)) = listing.generations.range(..top).next_back() else {
                    return Err(StorageError::Corrupt {
                        path: fs.path(""),
                        reason: format!("{reason}, and no earlier generation to fall back on"),
                    });
                };
                match read_snapshot(fs, id, previous, files)? {
                    Ok(read) => (previous, read, Some(top)),
                    Err(previous_reason) => {
                        return Err(StorageError::Corrupt {
                            path: fs.path(""),
                            reason: format!("{reason}, and {previous_reason}"),
                        });
                    }
                }
            }
        };
    let log = plan_log(fs, listing, id, generation, options)?;
    Ok(Plan::Existing(Box::new(Existing {
        id,
        generation,
        snapshot,
        snapshot_bytes,
        discarded,
        log,
    })))
}

/// A directory without an identity: new, a first open that crashed, or a lost identity.
fn plan_without_identity<F: FileSystem>(
    fs: &mut F,
    listing: &Listing,
    options: StorageOptions,
) -> Result<Plan, Error<F>> {
    if listing.generations.is_empty() {
        if options.create {
            return Ok(Plan::Fresh);
        }
        return Err(StorageError::Lost {
            path: fs.path(""),
            reason: "holds no log, but this data directory had one".to_owned(),
        });
    }
    // The identity is written last when a directory is created: without it, a generation 0
    // that never held a record is a first open that crashed, and is created again.
    if options.create
        && listing.generations.keys().all(|&g| g == 0)
        && let Some(files) = listing.generations.get(&0)
        && log_extent(fs, 0, files)? <= LOG_HEADER_BYTES as u64
    {
        return Ok(Plan::Fresh);
    }
    let first = listing.generations.keys().next().copied().unwrap_or(0);
    let last = listing.generations.keys().next_back().copied().unwrap_or(0);
    Err(StorageError::Lost {
        path: fs.path(IDENTITY),
        reason: if options.create {
            format!("is missing, but the directory holds log files (generations {first} to {last})")
        } else {
            "is missing, but this data directory had a log".to_owned()
        },
    })
}

/// The directory's id; `None` if it has no identity file.
fn read_identity<F: FileSystem>(
    fs: &mut F,
    listing: &Listing,
) -> Result<Option<DataDirId>, Error<F>> {
    if !listing.identity {
        return Ok(None);
    }
    let bytes = read_step(fs, "read identity", IDENTITY, |fs| fs.read(IDENTITY))?;
    match parse_identity(&bytes) {
        Ok(id) => Ok(Some(id)),
        Err(HeaderError::Version(version)) => Err(StorageError::UnknownVersion {
            path: fs.path(IDENTITY),
            version,
        }),
        Err(e) => Err(StorageError::Corrupt {
            path: fs.path(IDENTITY),
            reason: e.to_string(),
        }),
    }
}

/// Reads `snapshot-<generation>`: `Ok(Err(reason))` if it is missing or incomplete, `Err` if
/// it is of another version or directory. With the records, the image's length.
#[allow(clippy::type_complexity)]
fn read_snapshot<F: FileSystem>(
    fs: &mut F,
    id: DataDirId,
    generation: u64,
    files: &GenerationFiles,
) -> Result<Result<(Vec<LogRecord>, usize), String>, Error<F>> {
    let name = snapshot_name(generation);
    if !files.snapshot {
        return Ok(Err(format!("{name} is missing")));
    }
    let image = read_step(fs, "read snapshot", &name, |fs| fs.read(&name))?;
    match verify_snapshot(id, generation, &image) {
        Ok(records) => Ok(Ok((records, image.len()))),
        Err(SnapshotProblem::Incomplete(reason)) => Ok(Err(format!("{name}: {reason}"))),
        Err(SnapshotProblem::Version(version)) => Err(StorageError::UnknownVersion {
            path: fs.path(&name),
            version,
        }),
        Err(SnapshotProblem::Foreign(found)) => Err(StorageError::Foreign {
            path: fs.path(&name),
            found,
            expected: id,
        }),
    }
}

/// The length of `log-<generation>` without the zeros at its end (0 if it is missing): a log
/// that held a record is longer than a header by that measure, as zeros are no record (they
/// are preallocated space).
fn log_extent<F: FileSystem>(
    fs: &mut F,
    generation: u64,
    files: &GenerationFiles,
) -> Result<u64, Error<F>> {
    if !files.log {
        return Ok(0);
    }
    let name = log_name(generation);
    let bytes = read_step(fs, "read log", &name, |fs| fs.read(&name))?;
    let extent = bytes
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |last| last + 1);
    Ok(extent as u64)
}

/// Decides what to do with `log-<generation>` (module documentation, "The log of `G`").
fn plan_log<F: FileSystem>(
    fs: &mut F,
    listing: &Listing,
    id: DataDirId,
    generation: u64,
    options: StorageOptions,
) -> Result<LogPlan, Error<F>> {
    let name = log_name(generation);
    let exists = listing
        .generations
        .get(&generation)
        .is_some_and(|files| files.log);
    let bytes = if exists {
        read_step(fs, "read log", &name, |fs| fs.read(&name))?
    } else {
        Vec::new()
    };
    let header_error = match LogHeader::parse(&bytes) {
        Ok(header) => {
            if header.id != id {
                return Err(StorageError::Foreign {
                    path: fs.path(&name),
                    found: header.id,
                    expected: id,
                });
            }
            if header.generation != generation {
                return Err(StorageError::Corrupt {
                    path: fs.path(&name),
                    reason: format!("its header names generation {}", header.generation),
                });
            }
            let scan = scan(&bytes, header.salt);
            if let (Some(defect), Some(synced_past)) = (&scan.defect, scan.synced_past)
                && !options.repair
            {
                return Err(StorageError::Damaged {
                    path: fs.path(&name),
                    offset: defect.offset() as u64,
                    defect: defect.clone(),
                    synced_past: synced_past as u64,
                });
            }
            return Ok(LogPlan::Keep {
                header,
                bytes,
                scan,
            });
        }
        Err(HeaderError::Version(version)) => {
            return Err(StorageError::UnknownVersion {
                path: fs.path(&name),
                version,
            });
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
    Err(StorageError::MissingLog {
        path: fs.path(&name),
        reason,
    })
}

/// The log file recovery opened, and what it found in it.
struct Opened<F: FileSystem> {
    file: F::File,
    header: LogHeader,
    /// The end of the file (the position of the next append).
    end: u64,
    records: Vec<LogRecord>,
    defect: Option<TailDefect>,
    cut: Option<Cut<F::Path>>,
    /// Whether records follow the last sync mark (they are synced now and need one).
    needs_mark: bool,
}

impl<F: FileSystem> Opened<F> {
    fn empty(file: F::File, header: LogHeader) -> Opened<F> {
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
fn open_log<F: FileSystem>(
    fs: &mut F,
    id: DataDirId,
    generation: u64,
    plan: LogPlan,
) -> Result<Opened<F>, Error<F>> {
    let name = log_name(generation);
    match plan {
        LogPlan::Create => {
            let header = LogHeader {
                id,
                generation,
                salt: random_u64(fs)?,
            };
            let file = create_log(fs, &name, &header)?;
            Ok(Opened::empty(file, header))
        }
        LogPlan::Replace { bytes, reason } => {
            let copy = keep_cut_bytes(fs, generation, 0, &bytes)?;
            let header = LogHeader {
                id,
                generation,
                salt: random_u64(fs)?,
            };
            let file = rewrite_log(fs, &header, &[])?;
            let mut opened = Opened::empty(file, header);
            opened.cut = Some(Cut::Repaired {
                path: fs.path(&name),
                offset: 0,
                bytes: bytes.len() as u64,
                reason,
                copy,
            });
            Ok(opened)
        }
        LogPlan::Keep {
            header,
            bytes,
            scan,
        } => {
            let cut_at = scan.valid_len;
            let cut_bytes = (bytes.len() - cut_at) as u64;
            match (&scan.defect, scan.synced_past) {
                (Some(defect), Some(synced_past)) => {
                    // Repair (the plan refused this otherwise): keep the cut bytes, then
                    // rewrite the valid records under a new salt.
                    let copy = keep_cut_bytes(fs, generation, cut_at as u64, &bytes[cut_at..])?;
                    let header = LogHeader {
                        salt: random_u64(fs)?,
                        ..header
                    };
                    let file = rewrite_log(fs, &header, &scan.records)?;
                    let end = read_step(fs, "stat log", &name, |fs| fs.len(&name))?;
                    Ok(Opened {
                        file,
                        header,
                        end,
                        needs_mark: !scan.records.is_empty(),
                        records: scan.records,
                        defect: Some(defect.clone()),
                        cut: Some(Cut::Repaired {
                            path: fs.path(&name),
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
                    let mut file = step(fs, "open log", &name, |fs| fs.open(&name))?;
                    // A torn tail is cut; so are preallocated zeros after the last record
                    // (the end of the log, not a cut to report), so that appends go on from
                    // there; the file grows again with the next append.
                    if cut_at < bytes.len() {
                        step(fs, "truncate log", &name, |fs| {
                            fs.truncate(&mut file, cut_at as u64)
                        })?;
                    }
                    let cut = match defect {
                        Some(defect) => Some(Cut::TornTail {
                            path: fs.path(&name),
                            offset: cut_at as u64,
                            bytes: cut_bytes,
                            defect: defect.clone(),
                            synced_to: scan.synced_to as u64,
                        }),
                        None => None,
                    };
                    // Durable before anything is built on it: the cut, and records a crashed
                    // process wrote but never synced.
                    step(fs, "sync log", &name, |fs| fs.sync_all(&mut file))?;
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
fn keep_cut_bytes<F: FileSystem>(
    fs: &mut F,
    generation: u64,
    offset: u64,
    bytes: &[u8],
) -> Result<Option<F::Path>, Error<F>> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let base = format!("log-{generation}.cut-{offset}");
    let mut n = 0u32;
    let (name, mut file) = loop {
        let name = if n == 0 {
            base.clone()
        } else {
            format!("{base}.{n}")
        };
        let created = match fs.before("create copy of cut bytes") {
            Ok(()) => fs.create_new(&name),
            Err(e) => Err(e),
        };
        match created {
            Ok(file) => break (name, file),
            Err(e) if F::kind(&e) == FsErrorKind::AlreadyExists => n += 1,
            Err(source) => {
                return Err(StorageError::Io {
                    op: "create copy of cut bytes",
                    path: fs.path(&name),
                    source,
                });
            }
        }
    };
    step(fs, "write copy of cut bytes", &name, |fs| {
        fs.write(&mut file, bytes)?;
        fs.sync_all(&mut file)
    })?;
    step(fs, "sync directory", "", |fs| fs.sync_dir())?;
    Ok(Some(fs.path(&name)))
}

/// Replaces `log-<generation>` by `header` and `records` crash-atomically (a temporary file,
/// synced, renamed over it, the directory synced). Returns it, open at its end.
fn rewrite_log<F: FileSystem>(
    fs: &mut F,
    header: &LogHeader,
    records: &[LogRecord],
) -> Result<F::File, Error<F>> {
    let name = log_name(header.generation);
    let temp = format!("{name}.tmp");
    let mut image = header.encode();
    for record in records {
        encode_into(&mut image, record, LOG_RECORD_BYTES_MAX)?;
    }
    let mut file = step(fs, "create log temp", &temp, |fs| fs.create(&temp))?;
    step(fs, "write log temp", &temp, |fs| {
        fs.write(&mut file, &image)?;
        fs.sync_all(&mut file)
    })?;
    drop(file);
    step(fs, "rename log temp", &name, |fs| fs.rename(&temp, &name))?;
    step(fs, "sync directory", "", |fs| fs.sync_dir())?;
    step(fs, "open log", &name, |fs| fs.open(&name))
}

/// Writes generation `header.generation`: its snapshot `image` (via a synced temporary file
/// and a rename) and a synced log holding only `header`, then syncs the directory. Returns the
/// log, open for appending.
pub(super) fn install_generation<F: FileSystem>(
    fs: &mut F,
    image: &[u8],
    header: &LogHeader,
) -> Result<F::File, Error<F>> {
    let generation = header.generation;
    let temp = snapshot_temp_name(generation);
    let snapshot = snapshot_name(generation);
    let mut file = step(fs, "create snapshot temp", &temp, |fs| fs.create(&temp))?;
    step(fs, "write snapshot temp", &temp, |fs| {
        fs.write(&mut file, image)
    })?;
    step(fs, "sync snapshot temp", &temp, |fs| fs.sync_all(&mut file))?;
    drop(file);
    step(fs, "rename snapshot", &snapshot, |fs| {
        fs.rename(&temp, &snapshot)
    })?;
    let log_file = create_log(fs, &log_name(generation), header)?;
    step(fs, "sync directory", "", |fs| fs.sync_dir())?;
    Ok(log_file)
}

/// Creates (or empties) the log file `name` and writes and syncs its header; the caller syncs
/// the directory.
fn create_log<F: FileSystem>(
    fs: &mut F,
    name: &str,
    header: &LogHeader,
) -> Result<F::File, Error<F>> {
    let mut file = step(fs, "create log", name, |fs| fs.create(name))?;
    step(fs, "write log header", name, |fs| {
        fs.write(&mut file, &header.encode())
    })?;
    step(fs, "sync log", name, |fs| fs.sync_all(&mut file))?;
    Ok(file)
}

/// Writes the `identity` file crash-atomically: a synced temporary file renamed into place,
/// the directory synced.
fn write_identity<F: FileSystem>(fs: &mut F, id: DataDirId) -> Result<(), Error<F>> {
    let temp = format!("{IDENTITY}.tmp");
    let mut file = step(fs, "create identity temp", &temp, |fs| fs.create(&temp))?;
    step(fs, "write identity temp", &temp, |fs| {
        fs.write(&mut file, &identity_image(id))?;
        fs.sync_all(&mut file)
    })?;
    drop(file);
    step(fs, "rename identity", IDENTITY, |fs| {
        fs.rename(&temp, IDENTITY)
    })?;
    step(fs, "sync directory", "", |fs| fs.sync_dir())
}

/// Removes a leftover file; one already gone is not an error.
fn remove<F: FileSystem>(
    fs: &mut F,
    name: &str,
    removed: &mut Vec<F::Path>,
) -> Result<(), Error<F>> {
    let result = match fs.before("remove leftover") {
        Ok(()) => fs.remove(name),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => {
            removed.push(fs.path(name));
            Ok(())
        }
        Err(e) if F::kind(&e) == FsErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Io {
            op: "remove leftover",
            path: fs.path(name),
            source,
        }),
    }
}

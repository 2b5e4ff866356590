//! The directory node's simulated file system: core's storage protocol
//! ([`dataplane_core::storage`]) runs on it exactly as on real files, and it does to the files
//! what a disk and a kernel may.
//!
//! Files are inodes with their contents and the part of it that is *durable* (what the last
//! `fsync` made so); names live in the directory, which has a durable copy of its own (what
//! the last directory sync made so) and a journal of the name changes since. A crash
//! ([`SimFs::crash`]) keeps the durable names and a prefix of the journal (name changes reach
//! the disk in order), the durable contents of every file and, of what was not synced, all, a
//! prefix or nothing; the driver says exactly how much of the log file survives (it knows the
//! step boundaries the reference model rolls back to), and after those bytes the log keeps
//! what the last sync made durable (the zeros of a preallocation) and, by chance, a newer
//! length too: zeros, what its blocks held before the writes that were lost. Writes go at the
//! file's position, over preallocated zeros or past the end.
//!
//! Faults it injects when told to: a failed `fsync` ([`SimFs::fsync_failure`]), a full disk
//! ([`SimFs::capacity`]: a write past it fails `NoSpace`, having written what fits), a step of
//! the protocol that never happens because the process died just before it
//! ([`SimFs::crash_before_step`]), and damage at rest ([`SimFs::rot`]): a flipped bit or a lost
//! file, chosen only where the design promises a refusal, and undone by [`SimFs::restore`]
//! (the operator's backup).
//!
//! It also checks one rule of the protocol on its own: after an operation failed (the disk
//! full, an `fsync` error, a crash injected), the process must stop — no later write, sync,
//! rename or removal until the crash ([`SimFs::violation`]). One exception, since nothing
//! recovery reads has changed then: a write that ran out of room in a compaction's temporary
//! snapshot (`snapshot-<n>.tmp`). The process may go on, but its next change must be the
//! removal of that file.

use std::collections::BTreeMap;
use std::fmt;

use dataplane_core::storage::{FileSystem, FsErrorKind, crc32c};

use crate::rng::{Ratio, SimRng, ratio};

/// A failed file-system operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    /// What kind of failure.
    pub kind: FsErrorKind,
    /// What happened, for messages.
    pub what: String,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

fn error(kind: FsErrorKind, what: impl Into<String>) -> SimError {
    SimError {
        kind,
        what: what.into(),
    }
}

/// An open file: its inode and its position (where the next write goes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimFile {
    inode: u64,
    pos: usize,
}

#[derive(Clone, Debug, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// The lowest offset changed since the last sync.
    dirty_from: usize,
    /// Past the highest offset written since the last sync (`usize::MAX` after a truncation
    /// or a create that emptied the file): below `durable`'s length, bytes outside
    /// `dirty_from..dirty_to` are as the last sync left them. A log preallocated ahead writes
    /// its records inside its zeros, and a sync that copied everything from `dirty_from` to
    /// the end copied the whole preallocation at every commit (7 % of the instructions of
    /// seeds 0..16, cachegrind).
    dirty_to: usize,
}

impl Inode {
    /// An inode as it is on the disk, nothing changed since.
    fn clean(data: Vec<u8>) -> Self {
        Inode {
            dirty_from: data.len(),
            dirty_to: 0,
            durable: data.clone(),
            data,
        }
    }

    fn sync(&mut self) {
        self.durable.truncate(self.data.len());
        let kept = self.durable.len();
        let from = self.dirty_from.min(kept);
        let to = self.dirty_to.clamp(from, kept);
        self.durable[from..to].copy_from_slice(&self.data[from..to]);
        self.durable.extend_from_slice(&self.data[kept..]);
        debug_assert!(self.durable == self.data, "a sync makes every byte durable");
        self.dirty_from = self.data.len();
        self.dirty_to = 0;
    }
}

#[derive(Clone, Debug)]
enum NameChange {
    Link(String, u64),
    Unlink(String),
    Rename(String, String),
}

fn apply(names: &mut BTreeMap<String, u64>, change: &NameChange) {
    match change {
        NameChange::Link(name, inode) => {
            names.insert(name.clone(), *inode);
        }
        NameChange::Unlink(name) => {
            names.remove(name);
        }
        NameChange::Rename(from, to) => {
            if let Some(inode) = names.remove(from) {
                names.insert(to.clone(), inode);
            }
        }
    }
}

/// Damage at rest that the design says recovery must refuse, and how to undo it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rot {
    /// One bit of `name` at `offset` was flipped (`mask`).
    Flip {
        /// The file.
        name: String,
        /// The byte.
        offset: usize,
        /// The flipped bit.
        mask: u8,
    },
    /// `name` was lost (its bytes are kept for the restore).
    Lost {
        /// The file.
        name: String,
        /// What it held.
        bytes: Vec<u8>,
    },
}

impl fmt::Display for Rot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rot::Flip { name, offset, mask } => {
                write!(
                    f,
                    "a flipped bit (mask {mask:#04x}) at byte {offset} of {name}"
                )
            }
            Rot::Lost { name, bytes } => write!(f, "{name} lost ({} bytes)", bytes.len()),
        }
    }
}

/// Counters of what the file system did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// `fsync`s that failed.
    pub fsync_failures: u64,
    /// Writes refused for lack of space.
    pub full: u64,
    /// Steps that never happened because the process died before them.
    pub crashed_steps: u64,
    /// Crashes that left the log longer than its kept bytes, with zeros after them.
    pub zeroed_tails: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct SimFs {
    inodes: BTreeMap<u64, Inode>,
    names: BTreeMap<String, u64>,
    durable_names: BTreeMap<String, u64>,
    journal: Vec<NameChange>,
    next_inode: u64,
    /// Whether the data directory was created.
    exists: bool,
    rng: SimRng,
    /// Probability that an `fsync` fails.
    pub fsync_failure: Ratio,
    /// Bytes the disk holds at most (all files together); `None`: unlimited.
    pub capacity: Option<usize>,
    /// Fail the step that many `before` calls from now (the process dies before it).
    pub crash_before_step: Option<u64>,
    /// Fail the step that many `before` calls from now for lack of room (`ENOSPC`), if it is
    /// one that takes room (a create, write, sync or preallocation): a disk that fills up at
    /// any step of a compaction, not only where the full-disk episodes' few KiB run out.
    pub no_room_before_step: Option<u64>,
    /// Set by the first failure; any later change is a violation.
    failed: Option<String>,
    /// A compaction's temporary snapshot that ran out of room: the next change must remove it.
    no_room_in: Option<String>,
    /// A preallocation that found no room (of this inode; `None`: an injected failure before
    /// one): zeros the log only wanted ahead, so the log may go on within what the file
    /// has (the space gate's reserve), but no write may grow that file until a preallocation
    /// succeeds. Why, for the violation.
    grow_failed: Option<(Option<u64>, String)>,
    violation: Option<String>,
    /// What it did.
    pub stats: DiskStats,
}

impl SimFs {
    /// An empty disk whose own draws (failures, what survives a crash, entropy) come from
    /// `rng`.
    pub fn new(rng: SimRng) -> SimFs {
        SimFs::with_rng(rng)
    }

    /// The raw draws of the file system's stream so far (empty unless recording).
    pub fn take_record(&mut self) -> Vec<u64> {
        self.rng.take_record()
    }

    fn with_rng(rng: SimRng) -> SimFs {
        SimFs {
            inodes: BTreeMap::new(),
            names: BTreeMap::new(),
            durable_names: BTreeMap::new(),
            journal: Vec::new(),
            next_inode: 1,
            exists: false,
            rng,
            fsync_failure: Ratio::ZERO,
            capacity: None,
            crash_before_step: None,
            no_room_before_step: None,
            failed: None,
            no_room_in: None,
            grow_failed: None,
            violation: None,
            stats: DiskStats::default(),
        }
    }

    /// A change after a failure, if the protocol made one.
    pub fn violation(&self) -> Option<&str> {
        self.violation.as_deref()
    }

    /// Bytes all files hold.
    pub fn used(&self) -> usize {
        self.inodes.values().map(|i| i.data.len()).sum()
    }

    /// The current contents of `name`.
    pub fn contents(&self, name: &str) -> Option<&[u8]> {
        let inode = self.names.get(name)?;
        self.inodes.get(inode).map(|i| i.data.as_slice())
    }

    /// How much of `name` is durable: its length, the length of its longest prefix that is
    /// durable as it is now (not changed since the last sync; preallocated zeros overwritten
    /// since count as changed), and whether it was not cut shorter than its durable image
    /// since (a cut that is not durable). `None` if it has no name, or its name is not
    /// durable.
    pub fn durable(&self, name: &str) -> Option<(usize, usize, bool)> {
        let inode = self.names.get(name)?;
        if self.durable_names.get(name) != Some(inode) {
            return None;
        }
        // Bytes below `dirty_from` are as the last sync left them.
        self.inodes.get(inode).map(|i| {
            let prefix = i.durable.len().min(i.dirty_from).min(i.data.len());
            (i.data.len(), prefix, i.durable.len() <= i.data.len())
        })
    }

    /// The names that would survive a crash now.
    pub fn durable_names(&self) -> impl Iterator<Item = &str> {
        self.durable_names.keys().map(String::as_str)
    }

    /// The names in the directory.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// About to change something: a violation if an earlier operation failed.
    fn changing(&mut self, what: &str) {
        if let Some(failed) = &self.failed
            && self.violation.is_none()
        {
            self.violation = Some(format!(
                "storage: {what} after a failed operation ({failed}): a node must stop at its \
                 first storage failure"
            ));
        }
        if let Some(temp) = &self.no_room_in
            && self.violation.is_none()
        {
            self.violation = Some(format!(
                "storage: {what} before removing {temp}, which ran out of room: a compaction \
                 that found no room must remove its snapshot before anything else"
            ));
        }
    }

    /// The name of `file`, if it still has one.
    fn name_of(&self, file: SimFile) -> Option<&str> {
        self.names
            .iter()
            .find(|(_, inode)| **inode == file.inode)
            .map(|(name, _)| name.as_str())
    }

    fn fail(&mut self, e: SimError) -> SimError {
        if matches!(e.kind, FsErrorKind::NoSpace | FsErrorKind::Other) && self.failed.is_none() {
            self.failed = Some(e.what.clone());
        }
        e
    }

    fn inode(&mut self, file: SimFile) -> Result<&mut Inode, SimError> {
        self.inodes
            .get_mut(&file.inode)
            .ok_or_else(|| error(FsErrorKind::Other, "stale file handle"))
    }

    fn new_inode(&mut self, name: &str) -> SimFile {
        let inode = self.next_inode;
        self.next_inode += 1;
        self.inodes.insert(inode, Inode::default());
        self.names.insert(name.to_owned(), inode);
        self.journal.push(NameChange::Link(name.to_owned(), inode));
        SimFile { inode, pos: 0 }
    }

    fn sync_inode(&mut self, file: SimFile, what: &str) -> Result<(), SimError> {
        self.changing(what);
        if self.rng.chance(self.fsync_failure) {
            self.stats.fsync_failures += 1;
            return Err(self.fail(error(FsErrorKind::Other, format!("{what}: EIO"))));
        }
        self.inode(file)?.sync();
        Ok(())
    }

    /// The process died: what reaches the platter stays, the rest is decided here. The file
    /// `pinned` (if any) keeps exactly its first `len` bytes (the driver decided them).
    pub fn crash(&mut self, pinned: Option<(&str, usize)>) {
        // Name changes reach the disk in order: a prefix of them survives.
        let kept = self.rng.below(self.journal.len() as u64 + 1) as usize;
        let mut names = std::mem::take(&mut self.durable_names);
        for change in &self.journal[..kept] {
            apply(&mut names, change);
        }
        self.journal.clear();
        let pinned = pinned.and_then(|(name, len)| self.names.get(name).map(|&i| (i, len)));
        for (&number, inode) in &mut self.inodes {
            let data = match pinned {
                Some((pinned, len)) if pinned == number => {
                    let len = len.min(inode.data.len());
                    let mut kept = inode.data[..len].to_vec();
                    // After the kept bytes, what the blocks held before the writes that were
                    // lost: the zeros of a preallocation. What the last sync made durable
                    // stays (the file's length with it); a newer length may have reached the
                    // disk too.
                    if let Some(durable) = inode.durable.get(len..) {
                        kept.extend_from_slice(durable);
                    }
                    if inode.data.len() > kept.len() && self.rng.below(2) == 0 {
                        self.stats.zeroed_tails += 1;
                        kept.resize(inode.data.len(), 0);
                    }
                    kept
                }
                _ => {
                    let prefix = inode.durable.len() <= inode.dirty_from
                        && inode.data.starts_with(&inode.durable);
                    match self.rng.below(3) {
                        // Everything written reached the disk.
                        0 => inode.data.clone(),
                        // A prefix of what was appended since the sync did.
                        1 if prefix => {
                            let extra = inode.data.len() - inode.durable.len();
                            let keep = self.rng.below(extra as u64 + 1) as usize;
                            inode.data[..inode.durable.len() + keep].to_vec()
                        }
                        _ => inode.durable.clone(),
                    }
                }
            };
            *inode = Inode::clean(data);
        }
        let live: Vec<u64> = names.values().copied().collect();
        self.inodes.retain(|number, _| live.contains(number));
        self.names = names.clone();
        self.durable_names = names;
        self.failed = None;
        self.grow_failed = None;
        self.no_room_in = None;
        self.crash_before_step = None;
        self.no_room_before_step = None;
    }

    /// Damages the disk at rest (the node is down) where the design promises that recovery
    /// refuses to start: with exactly one generation of the log, a flipped bit in the
    /// identity, the snapshot, the log's header or the log before its last valid sync mark,
    /// or one of those three files lost. `None` if the directory is not in such a state.
    pub fn rot(&mut self) -> Option<Rot> {
        let snapshots: Vec<&String> = self
            .names
            .keys()
            .filter(|n| n.starts_with("snapshot-") && !n.ends_with(".tmp"))
            .collect();
        let logs: Vec<&String> = self
            .names
            .keys()
            .filter(|n| n.starts_with("log-") && !n.ends_with(".tmp") && !n.contains(".cut-"))
            .collect();
        let ([snapshot], [log]) = (snapshots.as_slice(), logs.as_slice()) else {
            return None;
        };
        if !self.names.contains_key("identity") || snapshot[9..] != log[4..] {
            return None;
        }
        let (snapshot, log) = ((*snapshot).clone(), (*log).clone());
        let name = match self.rng.below(4) {
            0 => "identity".to_owned(),
            1 => snapshot,
            _ => log,
        };
        let inode = self.names[&name];
        let data = self.inodes[&inode].data.clone();
        if self.rng.chance(ratio(1, 5)) {
            self.names.remove(&name);
            self.durable_names.remove(&name);
            self.inodes.remove(&inode);
            return Some(Rot::Lost { name, bytes: data });
        }
        // Where a flip must be refused: anywhere in the identity and the snapshot; in the
        // log, its header and whatever a valid sync mark after it says was synced.
        let end = if name.starts_with("log-") {
            last_mark(&data).unwrap_or(LOG_HEADER).max(LOG_HEADER)
        } else {
            data.len()
        };
        if end == 0 || data.len() < end {
            return None;
        }
        let offset = self.rng.below(end as u64) as usize;
        let mask = 1u8 << self.rng.below(8);
        let inode = self.inodes.get_mut(&inode)?;
        inode.data[offset] ^= mask;
        inode.durable = inode.data.clone();
        Some(Rot::Flip { name, offset, mask })
    }

    /// The operator restores what `rot` damaged (from a backup).
    pub fn restore(&mut self, rot: &Rot) {
        match rot {
            Rot::Flip { name, offset, mask } => {
                if let Some(inode) = self.names.get(name).and_then(|i| self.inodes.get_mut(i))
                    && let Some(byte) = inode.data.get_mut(*offset)
                {
                    *byte ^= mask;
                    inode.durable = inode.data.clone();
                }
            }
            Rot::Lost { name, bytes } => {
                let inode = self.next_inode;
                self.next_inode += 1;
                self.inodes.insert(inode, Inode::clean(bytes.clone()));
                self.names.insert(name.clone(), inode);
                self.durable_names.insert(name.clone(), inode);
            }
        }
    }
}

/// Bytes of a log file's header (the storage format, restated: magic, version, id,
/// generation, salt, CRC-32C).
const LOG_HEADER: usize = 48;
/// Bytes of a sync mark.
const MARK: usize = 24;

/// The start of the last valid sync mark of a log file, found independently of the protocol:
/// `DPMK`, the CRC-32C of the 16 bytes after it, the header's salt, and its own offset.
fn last_mark(data: &[u8]) -> Option<usize> {
    let salt = data.get(36..44)?;
    let last = data.len().checked_sub(MARK)?;
    (LOG_HEADER..=last).rev().find(|&at| {
        let m = &data[at..at + MARK];
        m[..4] == *b"DPMK"
            && crc32c(&m[8..24]).to_le_bytes() == m[4..8]
            && m[8..16] == *salt
            && m[16..24] == (at as u64).to_le_bytes()
    })
}

impl FileSystem for SimFs {
    type File = SimFile;
    type Error = SimError;
    type Path = String;

    fn path(&self, name: &str) -> String {
        if name.is_empty() {
            "<data directory>".to_owned()
        } else {
            name.to_owned()
        }
    }

    fn kind(error: &SimError) -> FsErrorKind {
        error.kind
    }

    fn exists(&mut self) -> Result<bool, SimError> {
        Ok(self.exists)
    }

    fn create_dir(&mut self) -> Result<(), SimError> {
        self.exists = true;
        Ok(())
    }

    fn lock(&mut self) -> Result<bool, SimError> {
        Ok(true)
    }

    fn list(&mut self) -> Result<Vec<String>, SimError> {
        Ok(self.names.keys().cloned().collect())
    }

    fn read(&mut self, name: &str) -> Result<Vec<u8>, SimError> {
        self.contents(name)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| error(FsErrorKind::NotFound, format!("{name}: not found")))
    }

    fn len(&mut self, name: &str) -> Result<u64, SimError> {
        self.contents(name)
            .map(|d| d.len() as u64)
            .ok_or_else(|| error(FsErrorKind::NotFound, format!("{name}: not found")))
    }

    fn create(&mut self, name: &str) -> Result<SimFile, SimError> {
        self.changing("create");
        match self.names.get(name) {
            Some(&inode) => {
                let file = SimFile { inode, pos: 0 };
                let i = self.inode(file)?;
                i.data.clear();
                i.dirty_from = 0;
                i.dirty_to = usize::MAX;
                Ok(file)
            }
            None => Ok(self.new_inode(name)),
        }
    }

    fn create_new(&mut self, name: &str) -> Result<SimFile, SimError> {
        self.changing("create");
        if self.names.contains_key(name) {
            return Err(error(FsErrorKind::AlreadyExists, format!("{name}: exists")));
        }
        Ok(self.new_inode(name))
    }

    fn open(&mut self, name: &str) -> Result<SimFile, SimError> {
        let inode = *self
            .names
            .get(name)
            .ok_or_else(|| error(FsErrorKind::NotFound, format!("{name}: not found")))?;
        let pos = self.inodes.get(&inode).map_or(0, |i| i.data.len());
        Ok(SimFile { inode, pos })
    }

    /// Writes at the file's position: over what is there (preallocated zeros), then past the
    /// end. Only growth takes room on the disk.
    fn write(&mut self, file: &mut SimFile, bytes: &[u8]) -> Result<(), SimError> {
        self.changing("a write");
        let room = self
            .capacity
            .map_or(usize::MAX, |c| c.saturating_sub(self.used()));
        let pos = file.pos;
        let len = self.inode(*file)?.data.len();
        let growth = (pos + bytes.len()).saturating_sub(len);
        if growth > 0
            && let Some((inode, why)) = &self.grow_failed
            && inode.is_none_or(|i| i == file.inode)
            && self.violation.is_none()
        {
            self.violation = Some(format!(
                "storage: a write past the end of a file after its preallocation failed \
                 ({why}): the log must grow it (or stop) before it writes there"
            ));
        }
        let fits = bytes.len().saturating_sub(growth.saturating_sub(room));
        let inode = self.inode(*file)?;
        if fits > 0 {
            let end = pos + fits;
            if end > inode.data.len() {
                inode.data.resize(end, 0);
            }
            inode.data[pos..end].copy_from_slice(&bytes[..fits]);
            inode.dirty_from = inode.dirty_from.min(pos);
            inode.dirty_to = inode.dirty_to.max(end);
            file.pos = end;
        }
        if fits < bytes.len() {
            self.stats.full += 1;
            let e = error(FsErrorKind::NoSpace, "write: ENOSPC (disk full)");
            if let Some(name) = self.name_of(*file)
                && name.starts_with("snapshot-")
                && name.ends_with(".tmp")
            {
                self.no_room_in = Some(name.to_owned());
                return Err(e);
            }
            return Err(self.fail(e));
        }
        Ok(())
    }

    fn truncate(&mut self, file: &mut SimFile, len: u64) -> Result<(), SimError> {
        self.changing("a truncation");
        let inode = self.inode(*file)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        inode.data.truncate(len);
        inode.dirty_from = inode.dirty_from.min(len);
        inode.dirty_to = usize::MAX;
        file.pos = len;
        Ok(())
    }

    /// Zeros appended (not synced; a crash may keep any length from the durable one on: see
    /// [`SimFs::crash`]). They take room on the disk: a full disk refuses them, having
    /// written what fits.
    fn preallocate(&mut self, file: &mut SimFile, len: u64) -> Result<(), SimError> {
        self.changing("a preallocation");
        let room = self
            .capacity
            .map_or(usize::MAX, |c| c.saturating_sub(self.used()));
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let inode = self.inode(*file)?;
        let growth = len.saturating_sub(inode.data.len());
        let fits = growth.min(room);
        let new_len = inode.data.len() + fits;
        inode.data.resize(new_len, 0);
        if fits < growth {
            self.stats.full += 1;
            let what = "fallocate: ENOSPC (disk full)";
            self.grow_failed = Some((Some(file.inode), what.to_owned()));
            return Err(error(FsErrorKind::NoSpace, what));
        }
        self.grow_failed = None;
        Ok(())
    }

    fn sync_data(&mut self, file: &mut SimFile) -> Result<(), SimError> {
        self.sync_inode(*file, "fdatasync")
    }

    fn sync_all(&mut self, file: &mut SimFile) -> Result<(), SimError> {
        self.sync_inode(*file, "fsync")
    }

    fn sync_file(&mut self, name: &str) -> Result<(), SimError> {
        let file = self.open(name)?;
        self.sync_inode(file, "fsync")
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), SimError> {
        self.changing("a rename");
        let Some(inode) = self.names.remove(from) else {
            return Err(error(FsErrorKind::NotFound, format!("{from}: not found")));
        };
        self.names.insert(to.to_owned(), inode);
        self.journal
            .push(NameChange::Rename(from.to_owned(), to.to_owned()));
        Ok(())
    }

    fn remove(&mut self, name: &str) -> Result<(), SimError> {
        if self.no_room_in.is_some() && name.starts_with("snapshot-") && name.ends_with(".tmp") {
            self.no_room_in = None;
        }
        self.changing("a removal");
        if self.names.remove(name).is_none() {
            return Err(error(FsErrorKind::NotFound, format!("{name}: not found")));
        }
        self.journal.push(NameChange::Unlink(name.to_owned()));
        Ok(())
    }

    fn sync_dir(&mut self) -> Result<(), SimError> {
        self.changing("a directory sync");
        if self.rng.chance(self.fsync_failure) {
            self.stats.fsync_failures += 1;
            return Err(self.fail(error(FsErrorKind::Other, "directory fsync: EIO")));
        }
        for change in std::mem::take(&mut self.journal) {
            apply(&mut self.durable_names, &change);
        }
        // A file no name refers to, now or after a crash, is gone.
        let (names, durable) = (&self.names, &self.durable_names);
        self.inodes
            .retain(|i, _| names.values().any(|n| n == i) || durable.values().any(|n| n == i));
        Ok(())
    }

    fn entropy(&mut self) -> Result<u128, SimError> {
        Ok(u128::from(self.rng.next_u64()) << 64 | u128::from(self.rng.next_u64()))
    }

    fn before(&mut self, op: &'static str) -> Result<(), SimError> {
        match &mut self.no_room_before_step {
            Some(0) => {
                self.no_room_before_step = None;
                let takes_room = ["create", "write", "sync", "preallocate"]
                    .iter()
                    .any(|verb| op.starts_with(verb));
                if takes_room {
                    self.stats.full += 1;
                    let e = error(FsErrorKind::NoSpace, format!("ENOSPC (disk full) at {op}"));
                    if op.ends_with("snapshot temp") {
                        self.no_room_in = Some("snapshot-<n>.tmp".to_owned());
                        return Err(e);
                    }
                    if op.starts_with("preallocate") {
                        self.grow_failed = Some((None, e.what.clone()));
                        return Err(e);
                    }
                    return Err(self.fail(e));
                }
            }
            Some(n) => *n -= 1,
            None => {}
        }
        match &mut self.crash_before_step {
            Some(0) => {
                self.crash_before_step = None;
                self.stats.crashed_steps += 1;
                Err(self.fail(error(
                    FsErrorKind::Other,
                    format!("the process died before {op}"),
                )))
            }
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{SimRng, Stream};

    /// Writes inside and past a preallocation, truncations, re-creations and preallocations in
    /// a drawn order: between syncs the durable bytes stay what the last sync saw, and after
    /// one they are every byte of the file (a sync copies only the changed range).
    #[test]
    fn a_sync_makes_exactly_the_current_bytes_durable() {
        let mut draws = SimRng::new(7, Stream::Environment);
        for round in 0..200u64 {
            let mut fs = SimFs::new(SimRng::new(round, Stream::Environment));
            let mut file = fs.create_new("log-1").unwrap();
            let mut synced: Vec<u8> = Vec::new();
            for step in 0..60u64 {
                let len = fs.inodes[&file.inode].data.len() as u64;
                match draws.below(6) {
                    0 | 1 => {
                        file.pos = draws.below(len + 64) as usize;
                        let bytes = vec![(step as u8) | 1; 1 + draws.below(40) as usize];
                        fs.write(&mut file, &bytes).unwrap();
                    }
                    2 => fs.truncate(&mut file, draws.below(len + 1)).unwrap(),
                    3 => fs.preallocate(&mut file, len + draws.below(200)).unwrap(),
                    4 if draws.below(8) == 0 => file = fs.create("log-1").unwrap(),
                    _ => {
                        fs.sync_data(&mut file).unwrap();
                        synced = fs.inodes[&file.inode].data.clone();
                    }
                }
                assert_eq!(
                    fs.inodes[&file.inode].durable, synced,
                    "round {round} step {step}"
                );
            }
        }
    }
}

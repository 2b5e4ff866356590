//! File blobs (issue 17): a file on the host's own disk, published under a namespace path and
//! served from the file itself, never copied into the arena.
//!
//! # How a file blob lives
//!
//! * **Publish.** A child asks `PublishFile { op, path, file }`. The host asks its driver what
//!   the file is ([`ArenaMemory::file_facts`]: its length and an identity stamp), records the
//!   blob in its durable [`FileTable`] ([`ArenaMemory::save_files`]) *before* the Register
//!   leaves, and registers a source of [`PERSISTENT_INCARNATION`] with a
//!   [`SourceRecovery::File`] record. The Register is re-driven with the same op id until its
//!   outcome is known, like a sealed write's (a binding of kind [`Kind::File`] in
//!   [`Phase::Publishing`] carries it, and the child hears `Published` or `Failed`). A
//!   definitive refusal removes the record again.
//! * **Serve.** A chunk request for the persistent source is answered from the file
//!   ([`ArenaMemory::read_file`]), which the driver reads only if the file still has the
//!   stamp it had at publication; otherwise the request is refused
//!   [`ChunkRefusal::SourceChanged`] and the reader fails `SourceChanged`. No byte of a changed
//!   file is handed out.
//! * **Retire.** The directory's Retire (the binding was replaced or unlinked) is answered
//!   `SourceRetired` and removes the record. A Retire for a source the host does not know is
//!   answered all the same.
//! * **Restarts.** The source's address has no incarnation of its own, so no node floor ever
//!   makes the blob lost; the restarted host reloads its table ([`Host::restore_files`]) and
//!   serves again, and the restarted directory recovers the same source from the record (SPEC
//!   S8a).
//!
//! # Known gap
//!
//! A host that dies while a Register's outcome is unknown keeps the record after its restart
//! (it cannot tell whether the Register committed: the op id died with its incarnation). The
//! record is served if it is bound and retired if it is replaced; if the Register never
//! committed, it stays in the table (bounded by [`HOST_FILES_MAX`]) until an operator removes it.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

use serde::{Deserialize, Serialize};

use super::{Host, Kind, Naming, PURPOSE_PUBLISH, Phase, child_error};
use crate::arena::{ArenaMemory, Lease, MemoryFault};
use crate::effect::Outbox;
use crate::error::{DataPlaneError, Limit, NamespaceError};
use crate::ids::{Address, PERSISTENT_INCARNATION, Revision};
use crate::limits::HOST_FILES_MAX;
use crate::path::{Access, DataPath};
use crate::time::Instant;
use crate::wire::{
    ChildEvent, ChildOp, ChunkBytes, ChunkRefusal, DirectoryRequest, FileRef, Message,
    SourceRecovery,
};

/// What the driver knows of a file: its length and a stamp that changes whenever the file
/// does (the real adapter: device, inode, modification and change times).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileFacts {
    /// The file's length (the blob's length).
    pub length: u64,
    /// The file's identity; compared, never interpreted.
    pub stamp: [u64; 4],
}

/// Why the driver could not do what the host asked of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileFault {
    /// This driver serves no files.
    Unsupported,
    /// The file may not be published: it is not a regular file under the host's file root,
    /// or it cannot be opened (the reason is for the child).
    Refused(String),
    /// The file is no longer the one published (its stamp differs, or it is gone).
    Changed,
    /// Reading the file or writing the table failed (the reason is for logs).
    Io(String),
}

impl std::fmt::Display for FileFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileFault::Unsupported => f.write_str("this host serves no files"),
            FileFault::Refused(reason) => write!(f, "the file cannot be published: {reason}"),
            FileFault::Changed => f.write_str("the file changed since it was published"),
            FileFault::Io(reason) => write!(f, "file input/output failed: {reason}"),
        }
    }
}

/// One file blob the host serves (or is publishing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileBlob {
    /// The persistent source's actor number (its incarnation is [`PERSISTENT_INCARNATION`]).
    pub actor: u64,
    /// The path it was published at (a rename moves the binding, not this record).
    pub path: DataPath,
    /// The file.
    pub file: FileRef,
    /// The file as published.
    pub facts: FileFacts,
    /// The revision the Register committed; `None` while its outcome is unknown.
    pub revision: Option<Revision>,
}

/// The host's durable table of file blobs: what [`ArenaMemory::save_files`] writes and
/// [`Host::restore_files`] reads back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileTable {
    /// The next persistent actor number: never reused, so a late Retire for a removed file
    /// blob can never retire a newer one.
    pub next_actor: u64,
    /// The file blobs, by actor number.
    pub files: Vec<FileBlob>,
}

impl Host {
    /// The file blobs of an earlier life of this node (read back by the driver before any
    /// input): they are served again at once.
    pub fn restore_files(&mut self, table: FileTable) {
        let highest = table.files.iter().map(|f| f.actor.saturating_add(1)).max();
        self.next_file = table.next_actor.max(highest.unwrap_or(0)).max(1);
        self.files = table.files.into_iter().map(|f| (f.actor, f)).collect();
    }

    /// The durable table as it is now.
    pub fn file_table(&self) -> FileTable {
        FileTable {
            next_actor: self.next_file,
            files: self.files.values().cloned().collect(),
        }
    }

    /// The file blobs this host serves or is publishing, by actor number.
    pub fn file_blobs(&self) -> impl Iterator<Item = &FileBlob> {
        self.files.values()
    }

    /// The address of persistent source `actor`.
    pub fn file_source(&self, actor: u64) -> Address {
        Address::new(self.config.node, PERSISTENT_INCARNATION, actor)
    }

    /// A child's `PublishFile`: validated completely before anything changes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish_file(
        &mut self,
        now: Instant,
        session: u64,
        child: Address,
        op: ChildOp,
        logical: &str,
        file: &str,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let checked = self.check_publish_file(session, op, logical, file, mem);
        let (path, file, facts) = match checked {
            Ok(checked) => checked,
            Err(error) => {
                self.send_child(child, ChildEvent::Failed { op, error }, out);
                return;
            }
        };
        let source = self.next_file;
        self.next_file = self.next_file.saturating_add(1);
        let record = FileBlob {
            actor: source,
            path: path.clone(),
            file: file.clone(),
            facts,
            revision: None,
        };
        self.files.insert(source, record);
        // Durable before the Register leaves: the restarted host must serve what the
        // directory may bind.
        if let Err(fault) = mem.save_files(&self.file_table()) {
            self.files.remove(&source);
            let error = DataPlaneError::SourceFailure(super::reason(&format!(
                "the host could not record the file blob: {fault}"
            )));
            self.send_child(child, ChildEvent::Failed { op, error }, out);
            return;
        }
        let actor = self.start_binding(
            session,
            child,
            op,
            path.clone(),
            Kind::File { source },
            Phase::Publishing,
        );
        let source = self.file_source(source);
        let request = DirectoryRequest::Register {
            path,
            source,
            source_node: self.config.node,
            length: facts.length,
            recovery: SourceRecovery::File { path: file, source },
            operation: self.op_id(actor, PURPOSE_PUBLISH),
            reservation: None,
        };
        self.call(now, actor, request, out);
    }

    fn check_publish_file(
        &self,
        session: u64,
        op: ChildOp,
        logical: &str,
        file: &str,
        mem: &mut dyn ArenaMemory,
    ) -> Result<(DataPath, FileRef, FileFacts), DataPlaneError> {
        let path = self.check_open(session, op, logical, Access::Write, Naming::New)?;
        if self.files.len() >= HOST_FILES_MAX {
            return Err(DataPlaneError::LimitReached(Limit::HostFiles));
        }
        let Ok(file) = FileRef::new(file) else {
            return Err(DataPlaneError::InvalidArgument(super::reason(
                "the file name is too long or holds a NUL",
            )));
        };
        let facts = mem.file_facts(&file).map_err(|fault| {
            let text = match fault {
                FileFault::Unsupported => {
                    "this host serves no files (its operator starts it with --files DIR)".into()
                }
                other => other.to_string(),
            };
            DataPlaneError::InvalidArgument(super::reason(&text))
        })?;
        Ok((path, file, facts))
    }

    /// The definitive answer to a file blob's Register.
    pub(super) fn file_registered(
        &mut self,
        actor: u64,
        result: Result<Revision, NamespaceError>,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let (Phase::Publishing, Kind::File { source }) = (&b.phase, b.kind) else {
            return;
        };
        b.phase = Phase::Draining;
        let (child, op) = (b.child, b.op);
        let event = match result {
            Ok(revision) => {
                // A Retire may have come first (a replacement raced the reply): then the
                // record is gone and stays gone.
                if let Some(f) = self.files.get_mut(&source) {
                    f.revision = Some(revision);
                    // Only informative: a table without it serves the same.
                    let _ = mem.save_files(&self.file_table());
                }
                ChildEvent::Published { op, revision }
            }
            Err(error) => {
                if self.files.remove(&source).is_some() {
                    // Not saving leaves a record nothing binds (see the module's known gap).
                    let _ = mem.save_files(&self.file_table());
                }
                ChildEvent::Failed {
                    op,
                    error: child_error(error),
                }
            }
        };
        self.send_child(child, event, out);
        self.try_finish(actor, mem, out);
    }

    /// A frame for persistent actor `to`: a file blob's source, or one that is gone.
    pub(super) fn file_message(
        &mut self,
        to: Address,
        message: Message,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(file) = self.files.get(&to.actor) else {
            self.answer_for_the_dead(to, &message, out);
            return;
        };
        match message {
            Message::ChunkRequest {
                offset,
                len,
                reply_to,
            } => {
                let length = file.facts.length;
                let answer = if !super::source::chunk_in_range(offset, len, length) {
                    Message::ChunkRefused {
                        reason: ChunkRefusal::OutOfRange,
                    }
                } else {
                    match mem.read_file(&file.file, &file.facts, offset, len) {
                        Ok(bytes) if bytes.len() == len as usize => match ChunkBytes::new(bytes) {
                            Ok(bytes) => Message::Chunk {
                                offset,
                                total: length,
                                digest: None,
                                bytes,
                            },
                            Err(_) => Message::ChunkRefused {
                                reason: ChunkRefusal::OutOfRange,
                            },
                        },
                        // A short read: the file shrank under the stamp's nose.
                        Ok(_) | Err(FileFault::Changed) => Message::ChunkRefused {
                            reason: ChunkRefusal::SourceChanged,
                        },
                        Err(_) => Message::ChunkRefused {
                            reason: ChunkRefusal::OutOfRange,
                        },
                    }
                };
                out.send(reply_to, answer);
            }
            Message::Retire { reply_to } => {
                out.send(reply_to, Message::SourceRetired { source: to });
                self.files.remove(&to.actor);
                // A record left by a failed save is retired again by nobody: served to
                // nobody, it waits for an operator (bounded by HOST_FILES_MAX).
                let _ = mem.save_files(&self.file_table());
            }
            other => self.answer_for_the_dead(to, &other, out),
        }
    }

    /// Checks the file table: bounded, and every record filed under its own actor number,
    /// which is below the next one.
    pub(super) fn check_files(&self) -> Result<(), String> {
        if self.files.len() > HOST_FILES_MAX {
            return Err(format!(
                "{} file blobs (bound {HOST_FILES_MAX})",
                self.files.len()
            ));
        }
        if let Some((actor, _)) = self
            .files
            .iter()
            .find(|(a, f)| f.actor != **a || **a >= self.next_file)
        {
            return Err(format!(
                "file blob {actor} is misfiled or not below the next number"
            ));
        }
        Ok(())
    }
}

/// A node's files and its saved table of file blobs, held in memory: the simulator's and the
/// tests' disk for file blobs (pure and deterministic; the real adapter reads real files).
/// Every change of a file gives it a new stamp, as a real write changes its modification time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryFiles {
    files: BTreeMap<String, (Vec<u8>, u64)>,
    next_version: u64,
    saved: FileTable,
    /// Saving the table fails while this is set (a failing disk); the last saved table stays.
    pub failing: bool,
}

impl MemoryFiles {
    /// Creates or replaces `name` with `bytes` (a new stamp either way).
    pub fn write(&mut self, name: &str, bytes: Vec<u8>) {
        self.next_version += 1;
        self.files
            .insert(name.to_owned(), (bytes, self.next_version));
    }

    /// Removes `name`.
    pub fn remove(&mut self, name: &str) {
        self.files.remove(name);
    }

    /// The bytes of `name` now.
    pub fn contents(&self, name: &str) -> Option<&[u8]> {
        self.files.get(name).map(|(bytes, _)| bytes.as_slice())
    }

    /// The table last saved (what a restarted host reads back).
    pub fn saved(&self) -> &FileTable {
        &self.saved
    }

    fn facts(&self, file: &FileRef) -> Result<FileFacts, FileFault> {
        let Some((bytes, version)) = self.files.get(file.as_str()) else {
            return Err(FileFault::Refused(format!("no file {}", file.as_str())));
        };
        Ok(FileFacts {
            length: bytes.len() as u64,
            stamp: [*version, 0, 0, 0],
        })
    }
}

/// An arena memory `M` together with the node's [`MemoryFiles`]: the memory the simulator's
/// and the tests' hosts are given. It derefs to `M`.
#[derive(Clone, Debug, Default)]
pub struct WithFiles<M> {
    /// The arena memory.
    pub memory: M,
    /// The node's files (they outlive the node's restarts: keep them when the memory is
    /// replaced).
    pub files: MemoryFiles,
}

impl<M> Deref for WithFiles<M> {
    type Target = M;

    fn deref(&self) -> &M {
        &self.memory
    }
}

impl<M> DerefMut for WithFiles<M> {
    fn deref_mut(&mut self) -> &mut M {
        &mut self.memory
    }
}

impl<M: ArenaMemory> ArenaMemory for WithFiles<M> {
    fn bytes(&self) -> &[u8] {
        self.memory.bytes()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.memory.bytes_mut()
    }

    fn freeze(&mut self, lease: &Lease, hash: bool) -> Result<Option<[u8; 32]>, MemoryFault> {
        self.memory.freeze(lease, hash)
    }

    fn reclaim(&mut self, lease: &Lease) {
        self.memory.reclaim(lease);
    }

    fn stages_writes(&self) -> bool {
        self.memory.stages_writes()
    }

    fn file_facts(&mut self, file: &FileRef) -> Result<FileFacts, FileFault> {
        self.files.facts(file)
    }

    fn read_file(
        &mut self,
        file: &FileRef,
        facts: &FileFacts,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, FileFault> {
        let now = self.files.facts(file).map_err(|_| FileFault::Changed)?;
        if now != *facts {
            return Err(FileFault::Changed);
        }
        let bytes = self.files.contents(file.as_str()).unwrap_or_default();
        let start = usize::try_from(offset).map_err(|_| FileFault::Io("offset".into()))?;
        let end = start.saturating_add(len as usize).min(bytes.len());
        Ok(bytes.get(start..end).unwrap_or_default().to_vec())
    }

    fn save_files(&mut self, table: &FileTable) -> Result<(), FileFault> {
        if self.files.failing {
            return Err(FileFault::Io("the disk failed".into()));
        }
        self.files.saved = table.clone();
        Ok(())
    }
}

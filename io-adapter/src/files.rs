//! File blobs on a real host (issue 17): the files under the host's file root (`dataplane-node
//! host --files DIR`), read for the host machine, and the durable table of the file blobs it
//! serves.
//!
//! * **Names.** A child names a file relative to the root: plain components separated by `/`,
//!   none empty, none starting with `.` (so no `..`, and no hidden file such as the table
//!   itself). The name is resolved under the root and the result, with every symbolic link
//!   followed, must still lie under the root and be a regular file.
//! * **Identity.** A file's stamp is its device, inode, modification time and change time
//!   (nanoseconds). Any write, truncation, replacement by rename or `touch` changes one of
//!   them; the change time cannot be set back by a user. A read checks the stamp before and
//!   after `pread`, so bytes written while it read are not served either. Timestamps have the
//!   file system's granularity: two writes within one tick of the kernel's clock (a few
//!   milliseconds on some file systems) may leave the same stamp, and the first reader after
//!   the second write would then not notice. Readers that need certainty publish files they
//!   no longer write.
//! * **The table** lives at `DIR/.dataplane-file-blobs`, replaced crash-atomically (written
//!   aside, synced, renamed, the directory synced) before each Register leaves; a host that
//!   cannot read it back refuses to start (its file blobs would be bound and unserved).
//! * **Cost.** Every call is synchronous on the host's loop: a chunk costs one `open`, two
//!   `fstat`s and one `pread` of at most a chunk into a buffer that is not zeroed first (the
//!   name is not resolved again: the stamp names the inode checked at publication); a
//!   publication one `realpath`, one `stat` and one table write.
//!   Nothing is copied into the arena and nothing is hashed.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use dataplane_core::arena::{ArenaMemory, Lease, MemoryFault};
use dataplane_core::host::{FileFacts, FileFault, FileTable};
use dataplane_core::wire::FileRef;

use crate::arena::SharedArena;
use crate::driver::{read_state, write_state};

/// The table's name under the file root.
pub const TABLE_NAME: &str = ".dataplane-file-blobs";

/// The host's files: its root (if it serves files at all) and the table's place.
#[derive(Clone, Debug, Default)]
pub struct NodeFiles {
    /// The canonical root; `None`: this host serves no files.
    root: Option<PathBuf>,
}

impl NodeFiles {
    /// Files under `root` (`None`: none), and the table saved there last.
    pub fn open(root: Option<&Path>) -> io::Result<(NodeFiles, FileTable)> {
        let Some(root) = root else {
            return Ok((NodeFiles { root: None }, FileTable::default()));
        };
        let root = fs::canonicalize(root)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", root.display())))?;
        if !fs::metadata(&root)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a directory", root.display()),
            ));
        }
        let table = read_state::<FileTable>(&root.join(TABLE_NAME))?.unwrap_or_default();
        Ok((NodeFiles { root: Some(root) }, table))
    }

    /// The root, if the host serves files.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    fn resolve(&self, file: &FileRef) -> Result<PathBuf, FileFault> {
        let Some(root) = &self.root else {
            return Err(FileFault::Unsupported);
        };
        let name = Path::new(file.as_str());
        let plain = !file.as_str().is_empty()
            && name.components().all(|c| match c {
                Component::Normal(part) => !part.to_string_lossy().starts_with('.'),
                _ => false,
            });
        if !plain {
            return Err(FileFault::Refused(format!(
                "{:?}: a file is named by plain components under the host's file root (none \
                 empty or starting with '.')",
                file.as_str()
            )));
        }
        let path = root.join(name);
        let real = fs::canonicalize(&path)
            .map_err(|e| FileFault::Refused(format!("{}: {e}", file.as_str())))?;
        if !real.starts_with(root) {
            return Err(FileFault::Refused(format!(
                "{}: leads outside the host's file root",
                file.as_str()
            )));
        }
        Ok(real)
    }

    /// What `file` is now.
    pub fn facts(&self, file: &FileRef) -> Result<FileFacts, FileFault> {
        let path = self.resolve(file)?;
        let refused = |e: io::Error| FileFault::Refused(format!("{}: {e}", file.as_str()));
        // Opened, so that a file this process cannot read is refused now rather than at every
        // read; its stamp is the open file's.
        let meta = open(&path)
            .and_then(|handle| handle.metadata())
            .map_err(refused)?;
        if !meta.is_file() {
            return Err(FileFault::Refused(format!(
                "{}: not a regular file",
                file.as_str()
            )));
        }
        Ok(facts_of(&meta))
    }

    /// `len` bytes of `file` at `offset`, if it still is what `facts` says before and after
    /// the read.
    pub fn read(
        &self,
        file: &FileRef,
        facts: &FileFacts,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, FileFault> {
        // No resolution again: the stamp holds the device and inode that were checked to lie
        // under the root at publication, so whatever the name reaches now is served only if
        // it is that same file, unchanged. Gone or replaced: changed.
        let Some(root) = &self.root else {
            return Err(FileFault::Unsupported);
        };
        let handle = open(&root.join(file.as_str())).map_err(|_| FileFault::Changed)?;
        let same = |handle: &File| {
            handle
                .metadata()
                .is_ok_and(|m| m.is_file() && facts_of(&m) == *facts)
        };
        if !same(&handle) {
            return Err(FileFault::Changed);
        }
        let bytes = crate::sys::pread_fresh(&handle, len as usize, offset)
            .map_err(|e| FileFault::Io(e.to_string()))?;
        // A short read: the file shrank under its stamp.
        if bytes.len() != len as usize || !same(&handle) {
            return Err(FileFault::Changed);
        }
        Ok(bytes)
    }

    /// Replaces the saved table.
    pub fn save(&self, table: &FileTable) -> Result<(), FileFault> {
        let Some(root) = &self.root else {
            return Err(FileFault::Unsupported);
        };
        write_state(&root.join(TABLE_NAME), table).map_err(|e| FileFault::Io(e.to_string()))
    }
}

/// Opens `path` to read without blocking on it: a FIFO put where a file was (or is named)
/// would otherwise block the host's loop until some writer opened it. (`O_NONBLOCK` changes
/// nothing for a regular file, and anything else is refused by its metadata.)
fn open(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

fn facts_of(meta: &fs::Metadata) -> FileFacts {
    let nanos = |secs: i64, nsec: i64| (secs as u64).wrapping_mul(1_000_000_000) ^ nsec as u64;
    FileFacts {
        length: meta.size(),
        stamp: [
            meta.dev(),
            meta.ino(),
            nanos(meta.mtime(), meta.mtime_nsec()),
            nanos(meta.ctime(), meta.ctime_nsec()),
        ],
    }
}

/// What the host machine is given on a real node: the shared arena and the node's files.
#[derive(Debug)]
pub struct HostMemory<'a> {
    /// The arena.
    pub arena: &'a mut SharedArena,
    /// The files.
    pub files: &'a NodeFiles,
}

impl ArenaMemory for HostMemory<'_> {
    fn bytes(&self) -> &[u8] {
        self.arena.bytes()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.arena.bytes_mut()
    }

    fn freeze(&mut self, lease: &Lease, hash: bool) -> Result<Option<[u8; 32]>, MemoryFault> {
        self.arena.freeze(lease, hash)
    }

    fn reclaim(&mut self, lease: &Lease) {
        self.arena.reclaim(lease);
    }

    fn stages_writes(&self) -> bool {
        self.arena.stages_writes()
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
        self.files.read(file, facts, offset, len)
    }

    fn save_files(&mut self, table: &FileTable) -> Result<(), FileFault> {
        self.files.save(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> FileRef {
        FileRef::new(s).unwrap()
    }

    #[test]
    fn names_stay_under_the_root_and_changes_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.bin"), b"0123456789").unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/b"), b"xy").unwrap();
        // A FIFO nobody writes: opening it must not block the host.
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("out")).unwrap();
        let (files, table) = NodeFiles::open(Some(dir.path())).unwrap();
        assert_eq!(table, FileTable::default());
        let facts = files.facts(&name("a.bin")).unwrap();
        assert_eq!(facts.length, 10);
        assert_eq!(files.facts(&name("sub/b")).unwrap().length, 2);
        for bad in [
            "fifo",
            "../x",
            "/etc/hostname",
            ".dataplane-file-blobs",
            "sub/../a.bin",
            "out",
            "sub",
            "",
            "missing",
        ] {
            assert!(
                matches!(files.facts(&name(bad)), Err(FileFault::Refused(_))),
                "{bad:?} was accepted"
            );
        }
        assert_eq!(files.read(&name("a.bin"), &facts, 2, 3).unwrap(), b"234");
        // Past the end, as a shrunk file would be.
        assert_eq!(
            files.read(&name("a.bin"), &facts, 8, 3),
            Err(FileFault::Changed)
        );
        // Rewritten with the same length: the stamp tells (the change time moves on).
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(dir.path().join("a.bin"), b"abcdefghij").unwrap();
        assert_eq!(
            files.read(&name("a.bin"), &facts, 2, 3),
            Err(FileFault::Changed)
        );
        fs::remove_file(dir.path().join("a.bin")).unwrap();
        assert_eq!(
            files.read(&name("a.bin"), &facts, 2, 3),
            Err(FileFault::Changed)
        );
        // Replaced by a FIFO: changed, and the read does not block.
        fs::rename(dir.path().join("fifo"), dir.path().join("a.bin")).unwrap();
        assert_eq!(
            files.read(&name("a.bin"), &facts, 2, 3),
            Err(FileFault::Changed)
        );
        // No root: no files.
        let (none, _) = NodeFiles::open(None).unwrap();
        assert_eq!(none.facts(&name("a.bin")), Err(FileFault::Unsupported));
    }

    #[test]
    fn the_table_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = NodeFiles::open(Some(dir.path())).unwrap();
        let table = FileTable {
            next_actor: 7,
            files: Vec::new(),
        };
        files.save(&table).unwrap();
        let (_, again) = NodeFiles::open(Some(dir.path())).unwrap();
        assert_eq!(again, table);
        fs::write(dir.path().join(TABLE_NAME), b"\xff\xff\xff").unwrap();
        assert!(NodeFiles::open(Some(dir.path())).is_err());
    }
}

//! The shared arena: one memory region the host creates and its child processes map, so
//! payload bytes never travel through messages on one host.
//!
//! The host makes the arena with [`SharedArena::create`] (an anonymous `memfd`, sealed against
//! resizing) or [`SharedArena::create_file`] (a file, e.g. under `/dev/shm`), and hands the
//! descriptor to a child over a Unix socket with [`send_with_fd`]; the child receives it with
//! [`recv_with_fd`] and maps it with [`SharedArena::from_fd`]. Linux only (`memfd_create`,
//! `MSG_CMSG_CLOEXEC`, file seals).
//!
//! # Who may write what
//!
//! Children get the arena **read-only** ([`SharedArena::read_only_fd`]: the same memory through
//! a descriptor opened for reading, so a child can neither map it writable nor `mprotect` its
//! mapping writable). A child writes a blob into a *staging buffer* of its own: a `memfd` the
//! host keeps for that child ([`SharedArena::stage_write`]), holding the lease's header,
//! sealed against resizing, handed to that child alone with its `WriteGranted`. When the child
//! seals the write, the host copies the buffer into the lease ([`ArenaMemory::freeze`]); from
//! then on the bytes are in memory no child can write, so what the host validated is what it
//! publishes and serves, and nobody can change a published blob or another child's lease.
//!
//! A buffer is reused for the same child's later writes (never another child's: the child may
//! keep it mapped), so its pages are touched once: fresh shared memory costs about three
//! copies' worth of page faults (20 ms per 64 MiB here). The price of the design is one copy of
//! every write (the `io` bench's `local_put_get` measures it).
//!
//! # Trust and aliasing
//!
//! The memory is shared with another process that may write anything at any time. The host
//! treats its contents as untrusted input: `dataplane_core::blob` validates every header it
//! reads and never assumes that a value it read stays put. Rust-wise, [`as_slice`] and
//! [`as_mut_slice`] hand out ordinary references to memory another process writes
//! concurrently, which the language's aliasing rules do not strictly allow; the core only does
//! plain loads and stores on them and validates everything it reads, the same assumption
//! every shared-memory IPC in Rust makes. Volatile or atomic access to the header's state word
//! is a possible hardening.
//!
//! A `memfd` arena is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) so that a child
//! holding the descriptor cannot truncate it under the host's mapping (which would make the
//! host's next access fault with `SIGBUS`). A file-backed arena cannot be sealed: anybody who
//! can open or holds the file can shrink it; use it only where that is acceptable.
//!
//! [`as_slice`]: SharedArena::as_slice
//! [`as_mut_slice`]: SharedArena::as_mut_slice

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;

use dataplane_core::arena::{ArenaMemory, BLOB_HEADER_BYTES, Lease, MemoryFault, RingId};
use memmap2::{Mmap, MmapMut, MmapOptions};

/// Most descriptors [`recv_with_fd`] accepts in one message without truncating the control
/// message (all but the first are closed at once). A peer sending more gets the call failed.
pub const RECV_FDS_MAX: usize = 8;

/// [`SharedArena::from_fd`] refused a descriptor whose file is smaller than the arena size
/// the caller expects (carried inside an [`io::Error`] of kind `InvalidInput`; find it with
/// `err.get_ref().and_then(|e| e.downcast_ref::<ArenaTooSmall>())`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaTooSmall {
    /// The size the caller asked to map.
    pub wanted: u64,
    /// The size of the file behind the descriptor.
    pub actual: u64,
}

impl fmt::Display for ArenaTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "arena descriptor holds {} bytes, {} expected",
            self.actual, self.wanted
        )
    }
}

impl std::error::Error for ArenaTooSmall {}

/// A shared, writable mapping of a `memfd` or file, and the descriptor behind it.
pub struct SharedArena {
    // Field order: the mapping is dropped (unmapped) before the descriptor is closed. Either
    // order is sound (a mapping outlives its descriptor), this one is just tidier.
    map: MmapMut,
    file: File,
    size: u64,
    /// The staging buffers of writes in progress, by the offset of their lease.
    staging: BTreeMap<u64, Staged>,
    /// Buffers of finished writes, kept for their owner's next writes.
    spare: BTreeMap<u64, Vec<Staged>>,
}

/// A staging buffer: whose it is (an owner the caller names, e.g. a connection), its file, its
/// size and the host's read-only mapping of it, made once with the buffer and kept while the
/// buffer is: [`ArenaMemory::freeze`] copies from it with `memcpy`. A `pread` of the `memfd`
/// instead costs three times as much (the kernel copies page by page through the page cache:
/// 14.5 ms against 4.8 ms per 64 MiB here), and a fresh mapping per freeze pays a page fault
/// per page.
struct Staged {
    owner: u64,
    file: File,
    size: u64,
    map: Mmap,
}

impl fmt::Debug for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staged")
            .field("owner", &self.owner)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Spare buffers kept per owner.
const SPARE_BUFFERS_MAX: usize = 2;
/// The smallest staging buffer made (small writes share a size class).
const STAGING_BYTES_MIN: u64 = 64 * 1024;

impl fmt::Debug for SharedArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedArena")
            .field("fd", &self.file.as_raw_fd())
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl SharedArena {
    /// Creates an anonymous arena of `size` zeroed bytes: `memfd_create(name, MFD_CLOEXEC |
    /// MFD_ALLOW_SEALING)`, `ftruncate(size)`, sealed against resizing, mapped shared.
    ///
    /// `name` only labels the descriptor (`/proc/PID/fd`); it must not contain NUL and the
    /// kernel limits it to 249 bytes.
    pub fn create(name: &str, size: u64) -> io::Result<SharedArena> {
        let len = map_len(size)?;
        let name = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "arena name has a NUL"))?;
        let _ = name;
        let file = memfd("dataplane-arena")?;
        file.set_len(size)?;
        seal_size(&file)?;
        Self::map(file, size, len)
    }

    /// Creates (or truncates and re-creates) a file-backed arena of `size` zeroed bytes at
    /// `path`, mode 0600, mapped shared. The file stays after the arena is dropped; removing it
    /// is the caller's business. See the module notes on truncation.
    pub fn create_file(path: &Path, size: u64) -> io::Result<SharedArena> {
        let len = map_len(size)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        file.set_len(size)?;
        Self::map(file, size, len)
    }

    /// Maps `size` bytes of a descriptor received from the host (the child side). Fails with
    /// an [`ArenaTooSmall`] error (kind `InvalidInput`) if the file holds fewer than `size`
    /// bytes, and with `InvalidInput` if it is not a regular file or `size` is 0.
    pub fn from_fd(fd: OwnedFd, size: u64) -> io::Result<SharedArena> {
        let len = map_len(size)?;
        let file = checked_file(fd, size)?;
        Self::map(file, size, len)
    }

    fn map(file: File, size: u64, len: usize) -> io::Result<SharedArena> {
        // SAFETY: memmap2 requires that the mapped file is not resized or modified behind the
        // mapping's back in ways that break Rust's assumptions. Resizing: the file is at least
        // `len` bytes (we sized it, or `from_fd` checked it), a memfd arena is sealed against
        // shrinking, and a file-backed arena's creator accepts the truncation risk (module
        // notes). Concurrent modification by the peer process is the point of the arena; the
        // module notes state the aliasing assumption the whole crate makes about it.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        Ok(SharedArena {
            map,
            file,
            size,
            staging: BTreeMap::new(),
            spare: BTreeMap::new(),
        })
    }

    /// A descriptor of the same memory opened for reading only: what children get. A mapping
    /// of it cannot be made writable.
    pub fn read_only_fd(&self) -> io::Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        let file = OpenOptions::new().read(true).open(path)?;
        Ok(OwnedFd::from(file))
    }

    /// The staging buffer of `owner`'s write lease at `offset` whose payload is `length`
    /// bytes: one of the owner's spare buffers if one is big enough, else a fresh `memfd`
    /// (a power of two of at least 64 KiB, sealed against resizing). It starts with the
    /// lease's header as the host installed it; the payload holds zeros, or the owner's own
    /// earlier bytes. Its descriptor goes to that owner alone; [`ArenaMemory::freeze`] copies
    /// it into the lease.
    pub fn stage_write(
        &mut self,
        owner: u64,
        offset: u64,
        length: u64,
    ) -> io::Result<BorrowedFd<'_>> {
        let footprint = Lease {
            ring: RingId(0),
            offset,
            length,
        }
        .footprint();
        // A lease the arena granted lies inside it, header and all.
        let (start, _) = self
            .span(offset, footprint)
            .ok_or_else(|| io::Error::other("a lease outside the arena"))?;
        let header = &self.map[start..start + BLOB_HEADER_BYTES as usize];
        let spares = self.spare.entry(owner).or_default();
        let reuse = spares
            .iter()
            .enumerate()
            .filter(|(_, b)| b.size >= footprint)
            .min_by_key(|(_, b)| b.size)
            .map(|(i, _)| i);
        let staged = match reuse {
            Some(i) => spares.swap_remove(i),
            None => {
                let size = footprint
                    .checked_next_power_of_two()
                    .ok_or_else(|| io::Error::other("a lease larger than any arena"))?
                    .max(STAGING_BYTES_MIN);
                let file = memfd("dataplane-write")?;
                file.set_len(size)?;
                seal_size(&file)?;
                let len = map_len(size)?;
                // SAFETY: a memfd we just made and sealed against resizing, so the mapping
                // never outlives its pages; the child writes it concurrently, the aliasing
                // assumption of the whole module (see the module notes).
                let map = unsafe { MmapOptions::new().len(len).map(&file)? };
                Staged {
                    owner,
                    file,
                    size,
                    map,
                }
            }
        };
        staged.file.write_all_at(header, 0)?;
        self.staging.insert(offset, staged);
        Ok(self.staging[&offset].file.as_fd())
    }

    /// Where in the mapping the `footprint` bytes at `offset` lie, if all of them do.
    fn span(&self, offset: u64, footprint: u64) -> Option<(usize, usize)> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(footprint).ok()?)?;
        (end <= self.map.len()).then_some((start, end))
    }

    /// `owner` is gone: its spare buffers are dropped.
    pub fn forget_owner(&mut self, owner: u64) {
        self.spare.remove(&owner);
    }

    /// Keeps `staged` as a spare of its owner, unless the owner is gone (its spares were
    /// forgotten: a buffer kept for it then would be kept for ever) or has enough.
    fn give_back(&mut self, staged: Staged) {
        if let Some(spares) = self.spare.get_mut(&staged.owner)
            && spares.len() < SPARE_BUFFERS_MAX
        {
            spares.push(staged);
        }
    }

    /// Staging buffers kept, in progress and spare.
    #[cfg(test)]
    fn staging_buffers(&self) -> usize {
        self.staging.len() + self.spare.values().map(Vec::len).sum::<usize>()
    }

    /// Writes in progress that have a staging buffer.
    pub fn staged_count(&self) -> usize {
        self.staging.len()
    }

    /// The arena size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The whole arena. Another process may change it at any time: validate what you read.
    pub fn as_slice(&self) -> &[u8] {
        &self.map
    }

    /// The whole arena, writable. Another process may change it at any time.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map
    }

    /// Backs every page of the arena with memory now, so the data path never pays for a page
    /// fault on first touch (about 0.5 s per 64 MiB on this project's machine, measured by the
    /// `io` bench). Each page's first byte is written back as it is, so nothing a child could
    /// see changes. The write must happen: a store of the byte just loaded is one the compiler
    /// may drop (it did, when this wrote back a zero only where it read one), and a page only
    /// read is mapped for reading, so the first write of the data path still faults.
    pub fn prefault(&mut self) {
        const PAGE: usize = 4096;
        let bytes: &mut [u8] = &mut self.map;
        let mut at = 0;
        while at < bytes.len() {
            let byte = bytes[at];
            bytes[at] = std::hint::black_box(byte);
            at += PAGE;
        }
        std::hint::black_box(&bytes);
    }

    /// The descriptor, to hand to a child with [`send_with_fd`].
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl ArenaMemory for SharedArena {
    fn bytes(&self) -> &[u8] {
        &self.map
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }

    fn stages_writes(&self) -> bool {
        true
    }

    /// Copies the staging buffer over the lease (header and payload) in 64 KiB pieces; with
    /// `hash`, each payload piece is hashed right after it is copied, from the lease (the
    /// bytes that will be published, not the child's buffer, which it may still change), while
    /// it is in the cache: one pass over the bytes where a copy and then a hash would be two.
    fn freeze(&mut self, lease: &Lease, hash: bool) -> Result<Option<[u8; 32]>, MemoryFault> {
        let Some(staged) = self.staging.remove(&lease.offset) else {
            return Err(MemoryFault::Freeze(
                "the write has no staging buffer".into(),
            ));
        };
        let (start, end) = self
            .span(lease.offset, lease.footprint())
            .ok_or_else(|| MemoryFault::Freeze("a lease outside the arena".into()))?;
        let frozen = match staged.map.get(..end - start) {
            Some(from) => {
                let payload = usize::try_from(lease.length)
                    .map_err(|_| MemoryFault::Freeze("length".into()))?;
                freeze_copy(&mut self.map[start..end], from, payload, hash)
            }
            None => Err(MemoryFault::Freeze(
                "the staging buffer is smaller than its lease".into(),
            )),
        };
        self.give_back(staged);
        frozen
    }

    fn reclaim(&mut self, lease: &Lease) {
        if let Some(staged) = self.staging.remove(&lease.offset) {
            self.give_back(staged);
        }
    }
}

/// Copies at least this large are made by two threads, each copying (and hashing) a part: a
/// 64 MiB freeze took the host's loop 4.6 ms without a digest and 13.3 ms with one on one
/// core of this project's two, and 3.6 ms and 6.9 ms on two.
pub const SPLIT_COPY_MIN: usize = 8 << 20;

/// Copies a staged write (`from`, header first, then `payload` bytes, then the padding to the
/// lease's alignment) over its lease (`to`, the same length) in pieces; with `hash`, returns
/// the BLAKE3 digest of the payload (not the padding) as copied into `to`, each piece hashed
/// just after it landed. A payload of [`SPLIT_COPY_MIN`] or more is split where
/// BLAKE3's tree splits it (the largest power of two of 1 KiB chunks below its length): a
/// second thread copies and hashes the right part as a subtree, and the two chaining values
/// are merged into the root, which is exactly `blake3::hash` of the whole payload.
fn freeze_copy(
    to: &mut [u8],
    from: &[u8],
    payload: usize,
    hash: bool,
) -> Result<Option<[u8; 32]>, MemoryFault> {
    use blake3::hazmat::{HasherExt, Mode, left_subtree_len, merge_subtrees_root};
    let header = BLOB_HEADER_BYTES as usize;
    let end = header
        .checked_add(payload)
        .filter(|end| *end <= to.len() && to.len() == from.len())
        .ok_or_else(|| MemoryFault::Freeze("a payload longer than its lease".into()))?;
    to[..header].copy_from_slice(&from[..header]);
    to[end..].copy_from_slice(&from[end..]);
    let (to, from) = (&mut to[header..end], &from[header..end]);
    let split = (to.len() >= SPLIT_COPY_MIN)
        .then(|| usize::try_from(left_subtree_len(to.len() as u64)).ok())
        .flatten()
        .filter(|left| *left < to.len());
    let Some(left) = split else {
        let hashed = copy_hashed(to, from, hash.then(blake3::Hasher::new));
        return Ok(hashed.map(|h| *h.finalize().as_bytes()));
    };
    let (to_left, to_right) = to.split_at_mut(left);
    let (from_left, from_right) = from.split_at(left);
    let right_hasher = hash.then(|| {
        let mut h = blake3::Hasher::new();
        h.set_input_offset(left as u64);
        h
    });
    let Some((left_done, right_done)) = both(
        || copy_hashed(to_left, from_left, hash.then(blake3::Hasher::new)),
        || copy_hashed(to_right, from_right, right_hasher),
    ) else {
        return Err(MemoryFault::Freeze("the copying thread panicked".into()));
    };
    Ok(match (left_done, right_done) {
        (Some(l), Some(r)) => {
            let root =
                merge_subtrees_root(&l.finalize_non_root(), &r.finalize_non_root(), Mode::Hash);
            Some(*root.as_bytes())
        }
        _ => None,
    })
}

/// Copies `from` into `to` (the same length): in 64 KiB pieces, by two
/// threads (a half each) from [`SPLIT_COPY_MIN`] bytes on.
pub fn copy_split(to: &mut [u8], from: &[u8]) {
    if to.len() < SPLIT_COPY_MIN || to.len() != from.len() {
        copy_hashed(to, from, None);
        return;
    }
    let half = to.len() / 2;
    let (to_left, to_right) = to.split_at_mut(half);
    let (from_left, from_right) = from.split_at(half);
    // Only a panic in a copy of two equal lengths could make `both` fail: there is none.
    let _ = both(
        || copy_hashed(to_left, from_left, None),
        || copy_hashed(to_right, from_right, None),
    );
}

/// Runs `left` here and `right` on a scoped thread of its own at the same time, and returns
/// both results; `right` runs here after `left` if no thread could be started. `None` if
/// `right` panicked.
fn both<L, R: Send>(left: impl FnOnce() -> L, right: impl FnOnce() -> R + Send) -> Option<(L, R)> {
    let right = std::sync::Mutex::new(Some(right));
    let (left, on_thread) = std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("dataplane-copy".into())
            .spawn_scoped(scope, || {
                let job = right.lock().ok().and_then(|mut job| job.take());
                job.map(|job| job())
            });
        let left = left();
        (left, spawned.ok().map(|thread| thread.join()))
    });
    let right = match on_thread {
        Some(Ok(Some(done))) => done,
        Some(Err(_)) => return None,
        // No thread (or it found nothing to do): run it here.
        Some(Ok(None)) | None => right.into_inner().ok()?.take()?(),
    };
    Some((left, right))
}

/// Copies `from` into `to` in 64 KiB pieces, feeding each piece as it landed in `to` to
/// `hasher`: 3.5 ms per 64 MiB against 4.8 ms for one `memcpy` of the whole (which, that
/// large, uses non-temporal stores that bypass the cache; in pieces it uses plain stores).
fn copy_hashed(
    to: &mut [u8],
    from: &[u8],
    mut hasher: Option<blake3::Hasher>,
) -> Option<blake3::Hasher> {
    const PIECE: usize = 64 << 10;
    for (to, from) in to.chunks_mut(PIECE).zip(from.chunks(PIECE)) {
        to.copy_from_slice(from);
        if let Some(hasher) = hasher.as_mut() {
            hasher.update(to);
        }
    }
    hasher
}

/// A fresh `memfd` (`MFD_CLOEXEC | MFD_ALLOW_SEALING`), labelled `name` in `/proc/PID/fd`.
fn memfd(name: &str) -> io::Result<File> {
    let name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a memfd name has a NUL"))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call; the flags are
    // valid `memfd_create` flags. The call has no other memory effects.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor returned by `memfd_create` that nothing else owns;
    // `OwnedFd` takes sole ownership and closes it on drop.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    Ok(File::from(fd))
}

/// Seals a `memfd` against resizing (and further seals), so that whoever else holds it cannot
/// truncate it under our mapping (our next access would fault with `SIGBUS`).
fn seal_size(file: &File) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: `fcntl(F_ADD_SEALS, int)` on a descriptor we own; it takes an integer argument
    // and touches no memory of ours.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The child's view of the arena: a read-only mapping.
pub struct ReadOnlyArena {
    map: Mmap,
    size: u64,
}

impl fmt::Debug for ReadOnlyArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyArena")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl ReadOnlyArena {
    /// Maps `size` bytes of the descriptor the host sent, for reading. Fails like
    /// [`SharedArena::from_fd`] on a descriptor that is not a big enough regular file.
    pub fn from_fd(fd: OwnedFd, size: u64) -> io::Result<ReadOnlyArena> {
        let len = map_len(size)?;
        let file = checked_file(fd, size)?;
        // SAFETY: as for `SharedArena::map`: the file is at least `len` bytes and sealed
        // against shrinking (the host made it); the host writes it concurrently, which the
        // module notes cover.
        let map = unsafe { MmapOptions::new().len(len).map(&file)? };
        Ok(ReadOnlyArena { map, size })
    }

    /// The arena. The host may change it at any time: validate what you read.
    pub fn as_slice(&self) -> &[u8] {
        &self.map
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// A child's staging buffer for one write: the lease's header at offset 0, then its payload.
pub struct WriteBuffer {
    map: MmapMut,
}

impl fmt::Debug for WriteBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteBuffer")
            .field("len", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl WriteBuffer {
    /// Maps the whole staging buffer the host sent with a `WriteGranted` for a lease of
    /// `footprint` bytes (header and payload), writable. The buffer may be larger than the
    /// lease (the host reuses it for this child's later writes).
    pub fn from_fd(fd: OwnedFd, footprint: u64) -> io::Result<WriteBuffer> {
        let file = checked_file(fd, footprint)?;
        let size = file.metadata()?.len();
        let len = map_len(size)?;
        // SAFETY: the buffer is a memfd sealed against resizing that only we and the host
        // hold; the host reads it only after we sealed a write.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        Ok(WriteBuffer { map })
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the buffer is empty (never, for a buffer the host sent).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The buffer, header first.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map
    }
}

/// `fd` as a file, if it is a regular file of at least `size` bytes.
fn checked_file(fd: OwnedFd, size: u64) -> io::Result<File> {
    let file = File::from(fd);
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "arena descriptor is not a regular file",
        ));
    }
    if meta.len() < size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            ArenaTooSmall {
                wanted: size,
                actual: meta.len(),
            },
        ));
    }
    Ok(file)
}

/// An arena size as a mapping length: not 0, and addressable.
fn map_len(size: u64) -> io::Result<usize> {
    if size == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "arena size must not be 0",
        ));
    }
    usize::try_from(size).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "arena size exceeds the address space",
        )
    })
}

/// Sends all of `bytes` over `sock` with `fd` attached (`SCM_RIGHTS`) to the first byte.
///
/// `bytes` must not be empty: a stream socket drops a descriptor sent with no data. The
/// descriptor travels with the first `sendmsg`; if that one is short, the rest follows
/// without it. The receiver gets the descriptor with the `recvmsg` that reads the first of
/// these bytes (which may also return bytes sent before them), so a protocol should send it
/// with a message the receiver expects it on. `sock` may be blocking only (a `WouldBlock`
/// after a partial send would lose the message boundary). `SIGPIPE` is suppressed
/// (`MSG_NOSIGNAL`): a closed peer is an `EPIPE` error.
pub fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    send_with_fds(sock, bytes, &[fd])
}

/// [`send_with_fd`] with any number of descriptors (at least one) in one `SCM_RIGHTS` message.
fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let sent = sendmsg_with_fds(sock.as_raw_fd(), bytes, fds)?;
    send_all(sock, &bytes[sent.min(bytes.len())..])
}

/// One `sendmsg` of `bytes` on the socket `sock` with `fd` attached to the first byte; returns
/// how many bytes it sent (the descriptor went with them). On a non-blocking socket a
/// `WouldBlock` error means nothing was sent, the descriptor neither. `MSG_NOSIGNAL`.
pub fn sendmsg_with_fd(sock: RawFd, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    sendmsg_with_fds(sock, bytes, &[fd])
}

fn sendmsg_with_fds(sock: RawFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if bytes.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a descriptor needs at least one byte to travel with",
        ));
    }
    let fds_bytes = u32::try_from(size_of_val(fds))
        .ok()
        .filter(|_| !fds.is_empty())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad descriptor count"))?;
    // SAFETY: `CMSG_SPACE` and `CMSG_LEN` are pure size computations.
    let (space, cmsg_len) = unsafe { (libc::CMSG_SPACE(fds_bytes), libc::CMSG_LEN(fds_bytes)) };
    let space = space as usize;
    // `u64` words: aligned at least as strictly as `cmsghdr` (whose alignment is `size_t`'s).
    let mut control = vec![0u64; space.div_ceil(size_of::<u64>())];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: `msghdr` is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg.msg_control` points at `control`, aligned for `cmsghdr` and at least
    // `space = CMSG_SPACE(fds_bytes)` bytes long, so `CMSG_FIRSTHDR` is either null (checked)
    // or a header inside it followed by room for `fds_bytes` bytes at `CMSG_DATA`; we write
    // the descriptors with unaligned writes.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for a control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = cmsg_len as _;
        let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
        for (i, fd) in fds.iter().enumerate() {
            ptr::write_unaligned(data.add(i), fd.as_raw_fd());
        }
    }
    loop {
        // SAFETY: `msg` points at `iov` (which points into `bytes`) and at `control`, all of
        // which live across the call; the kernel only reads them. The descriptors are valid
        // for the call because `fds` borrows them.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Sends the rest of a message without ancillary data, with `MSG_NOSIGNAL`.
fn send_all(sock: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice of `bytes.len()` bytes that the kernel only reads.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[(n as usize).min(bytes.len())..];
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from `sock`, and the descriptor that came with them, if
/// any.
///
/// `(0, None)` is the end of the stream. A received descriptor is owned by the caller and has
/// `FD_CLOEXEC` set (`MSG_CMSG_CLOEXEC`), so it never leaks into processes spawned later.
/// If the peer attached several descriptors, the first is returned and the others are closed.
/// A control message the kernel had to truncate (more than [`RECV_FDS_MAX`] descriptors, or
/// unexpected ancillary data) is an error, after closing every descriptor that did arrive;
/// treat the connection as broken. `buf` must not be empty.
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    if buf.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "recv_with_fd needs room for at least one byte",
        ));
    }
    let mut control = ControlBuf::new();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `msghdr` is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes.as_mut_ptr().cast();
    msg.msg_controllen = control.bytes.len() as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (which points into `buf`, writable for `buf.len()`
        // bytes) and at `control` (writable for `msg_controllen` bytes); both live across the
        // call and the kernel writes only within those bounds.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    // Take ownership of every descriptor that arrived before judging anything, so that each
    // one is closed on every path.
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: after a successful `recvmsg`, `msg.msg_control`/`msg_controllen` describe the
    // control bytes the kernel wrote into `control`; `CMSG_FIRSTHDR`/`CMSG_NXTHDR` walk
    // headers within those bounds and return null at the end. For an `SCM_RIGHTS` header,
    // `cmsg_len - CMSG_LEN(0)` bytes of descriptors follow `CMSG_DATA`, all inside the
    // buffer; we read them unaligned. Each is a fresh descriptor the kernel installed for us
    // that nothing else owns, so `OwnedFd::from_raw_fd` takes sole ownership.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let header = libc::CMSG_LEN(0) as usize;
                let bytes = ((*cmsg).cmsg_len as usize).saturating_sub(header);
                for i in 0..bytes / size_of::<RawFd>() {
                    let raw = ptr::read_unaligned(data.add(i));
                    if raw >= 0 {
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        drop(fds);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message truncated (too many descriptors or unexpected ancillary data)",
        ));
    }
    let first = if fds.is_empty() {
        None
    } else {
        Some(fds.swap_remove(0))
    };
    drop(fds);
    Ok((n, first))
}

/// A control-message buffer aligned for `cmsghdr`, with room for [`RECV_FDS_MAX`] descriptors.
#[repr(C)]
struct ControlBuf {
    _align: [libc::cmsghdr; 0],
    bytes: [u8; CONTROL_BYTES],
}

/// `CMSG_SPACE(RECV_FDS_MAX * sizeof(int))`: one header and [`RECV_FDS_MAX`] descriptors.
// SAFETY: `CMSG_SPACE` is a pure size computation (`unsafe` only by libc's signature).
const CONTROL_BYTES: usize =
    unsafe { libc::CMSG_SPACE((RECV_FDS_MAX * size_of::<RawFd>()) as libc::c_uint) } as usize;

impl ControlBuf {
    fn new() -> Self {
        ControlBuf {
            _align: [],
            bytes: [0; CONTROL_BYTES],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Duration;

    /// Whether every descriptor of `read_end`'s peer is closed: `read_end` then reads end of
    /// stream (a leaked copy would keep the peer open and the read would time out).
    fn peer_sees_eof(mut read_end: UnixStream) -> bool {
        read_end
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 1];
        matches!(read_end.read(&mut b), Ok(0))
    }

    /// The freeze's digest is BLAKE3 of the payload as copied, whether one thread made it or
    /// two (the split at BLAKE3's left subtree, merged): restated with `blake3::hash` of the
    /// whole, lengths around the split threshold, the 1 KiB chunk and 64 KiB piece sizes.
    #[test]
    fn the_freeze_copies_exactly_and_hashes_like_blake3() {
        let header = BLOB_HEADER_BYTES as usize;
        let lengths = [
            0,
            1,
            1024,
            1025,
            (64 << 10) + 3,
            SPLIT_COPY_MIN - 1,
            SPLIT_COPY_MIN,
            SPLIT_COPY_MIN + 1,
            SPLIT_COPY_MIN + (3 << 20) + 517,
            2 * SPLIT_COPY_MIN,
        ];
        for len in lengths {
            let from: Vec<u8> = (0..header + len)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
                .collect();
            for hash in [false, true] {
                let mut to = vec![0xa5; header + len];
                let digest = freeze_copy(&mut to, &from, len, hash).unwrap();
                assert!(to == from, "length {len}: the copy differs");
                let want = hash.then(|| *blake3::hash(&from[header..]).as_bytes());
                assert_eq!(digest, want, "length {len}, hash {hash}");
            }
        }
    }

    /// Through the arena: a staged write of a length that is not a multiple of the lease
    /// alignment (its footprint has padding after the payload) is frozen with the digest of
    /// its payload alone, and the bytes land in the lease.
    #[test]
    fn a_staged_write_is_frozen_with_the_digest_of_its_payload_only() {
        use dataplane_core::blob::{self, BlobAccess, DigestKind, Expected};
        for length in [1u64, 100, 4097, (SPLIT_COPY_MIN as u64) + 3] {
            let mut arena =
                SharedArena::create("freeze-test", 2 * (SPLIT_COPY_MIN as u64) + 4096).unwrap();
            let lease = Lease {
                ring: RingId(0),
                offset: 64 * 5,
                length,
            };
            assert!(lease.footprint() > BLOB_HEADER_BYTES + length || length % 64 == 0);
            let e = Expected {
                offset: lease.offset,
                length,
                generation: 3,
                access: BlobAccess::Writable,
                digest_kind: DigestKind::Blake3,
            };
            blob::install_staged(arena.as_mut_slice(), &e).unwrap();
            let fd = arena.stage_write(9, lease.offset, length).unwrap();
            let fd = fd.try_clone_to_owned().unwrap();
            let mut buffer = WriteBuffer::from_fd(fd, lease.footprint()).unwrap();
            let staged = Expected { offset: 0, ..e };
            let payload: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
            blob::payload_mut(buffer.as_mut_slice(), &staged)
                .unwrap()
                .copy_from_slice(&payload);
            // Padding after the payload in the buffer: not part of the blob.
            let padding = BLOB_HEADER_BYTES as usize + length as usize;
            let footprint = lease.footprint() as usize;
            buffer.as_mut_slice()[padding..footprint].fill(0xee);
            blob::child_seal_unhashed(buffer.as_mut_slice(), &staged).unwrap();
            let digest = arena.freeze(&lease, true).unwrap();
            assert_eq!(
                digest,
                Some(*blake3::hash(&payload).as_bytes()),
                "length {length}"
            );
            assert_eq!(blob::payload(arena.as_slice(), &e).unwrap(), &payload[..]);
            assert_eq!(
                arena.freeze(&lease, true),
                Err(MemoryFault::Freeze(
                    "the write has no staging buffer".into()
                ))
            );
        }
    }

    /// A lease that is not inside the arena gets no staging buffer and no panic, whatever
    /// its offset and length (lengths near `u64::MAX` overflowed the buffer's size, offsets
    /// near `usize::MAX` the header's end).
    #[test]
    fn a_lease_outside_the_arena_is_refused_a_staging_buffer() {
        let mut arena = SharedArena::create("stage-refusals", 1 << 20).unwrap();
        for (offset, length) in [
            (0, u64::MAX),
            (0, u64::MAX / 2),
            (0, 1 << 20),
            (u64::MAX - 10, 16),
            (usize::MAX as u64 - 64, 1),
            ((1 << 20) - 64, 64),
            (1 << 20, 0),
        ] {
            assert!(
                arena.stage_write(1, offset, length).is_err(),
                "offset {offset} length {length}"
            );
        }
        assert_eq!(arena.staged_count(), 0);
        assert!(arena.stage_write(1, 0, (1 << 20) - 4096).is_ok());
        assert_eq!(arena.staged_count(), 1);
    }

    /// A write whose child died keeps no staging buffer: the host forgets the owner's spares
    /// when its connection closes, and the lease is reclaimed after that (its session closes
    /// on the child's behalf). The buffer used to go back to a spare list made anew for the
    /// gone owner and stay for ever: one memfd and its pages per write a child died in.
    #[test]
    fn a_gone_owners_reclaimed_buffer_is_not_kept() {
        let mut arena = SharedArena::create("gone-owner", 1 << 20).unwrap();
        let lease = Lease {
            ring: RingId(0),
            offset: 0,
            length: 100,
        };
        arena.stage_write(7, lease.offset, lease.length).unwrap();
        assert_eq!(arena.staging_buffers(), 1);
        arena.forget_owner(7);
        arena.reclaim(&lease);
        assert_eq!(arena.staging_buffers(), 0);
        // A live owner keeps it as a spare.
        arena.stage_write(8, lease.offset, lease.length).unwrap();
        arena.reclaim(&lease);
        assert_eq!(arena.staging_buffers(), 1);
    }

    #[test]
    fn extra_descriptors_are_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        let (watched, read_end) = UnixStream::pair().unwrap();
        let fd = watched.as_fd();
        send_with_fds(&a, b"xyz", &[fd, fd, fd]).unwrap();
        drop(watched);
        let mut buf = [0u8; 8];
        let (n, first) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"xyz");
        let first = first.expect("a descriptor");
        drop(first);
        assert!(peer_sees_eof(read_end), "an extra descriptor leaked");
    }

    #[test]
    fn a_truncated_control_message_is_an_error_and_closes_everything() {
        let (a, b) = UnixStream::pair().unwrap();
        let (watched, read_end) = UnixStream::pair().unwrap();
        let fds = vec![watched.as_fd(); RECV_FDS_MAX + 1];
        send_with_fds(&a, b"x", &fds).unwrap();
        drop(fds);
        drop(watched);
        let mut buf = [0u8; 8];
        let err = recv_with_fd(&b, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(peer_sees_eof(read_end), "a received descriptor leaked");
    }

    #[test]
    fn the_control_buffer_holds_the_max_descriptors() {
        // SAFETY: a pure size computation.
        let space = unsafe { libc::CMSG_SPACE((RECV_FDS_MAX * size_of::<RawFd>()) as u32) };
        assert_eq!(CONTROL_BYTES, space as usize);
        assert_eq!(align_of::<ControlBuf>() % align_of::<libc::cmsghdr>(), 0);
    }
}

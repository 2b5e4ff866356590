//! Allocator settings for a process that moves blobs.
//!
//! A transfer between hosts allocates one buffer per chunk on each side (the source's copy out
//! of the arena, the receiver's decoded frame; 256 KiB each) and frees it a moment later on
//! another thread. With glibc's defaults such a buffer is either `mmap`ed and `munmap`ed on
//! every chunk, or carved from a heap whose top is trimmed back to the kernel as soon as it is
//! freed: either way every chunk costs 64 fresh page faults and zeroed pages, about as much
//! CPU as copying the chunk. [`tune_allocator`] keeps such buffers in the heap and the heap's
//! top mapped; on `remote_get` (the `io` bench) this doubled the throughput.
//!
//! The setting is process-wide, so the library never applies it on its own: the
//! `dataplane-node` binary calls it first thing, and a program that links the adapter calls
//! it if it wants the same (before it starts threads).
#![allow(unsafe_code)]

/// Buffers up to this size come from the heap, never from their own `mmap` (a frame is at
/// most 1 MiB; the reader's buffer is one frame plus what follows it).
pub const MMAP_THRESHOLD_BYTES: usize = 4 << 20;

/// Freed memory at the top of a heap is kept mapped up to this much (one arena's worth of
/// in-flight chunks many times over), instead of being handed back after every chunk.
pub const TRIM_THRESHOLD_BYTES: usize = 64 << 20;

/// Applies the settings above to glibc's `malloc` (a no-op elsewhere). Returns whether both
/// took effect.
pub fn tune_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let as_int = |bytes: usize| libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: `mallopt` only changes malloc's tunables; the values are in range, and
        // changing them at any time is allowed (they apply to later allocations and frees).
        let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, as_int(MMAP_THRESHOLD_BYTES)) };
        // SAFETY: as above.
        let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, as_int(TRIM_THRESHOLD_BYTES)) };
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_settings() {
        assert!(super::tune_allocator());
    }
}

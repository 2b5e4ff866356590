//! The few system calls the nodes make that the standard library does not wrap: a Unix socket
//! bound with a given mode whatever the umask, the group of a socket, who is at the other end
//! of a Unix connection, and a `pread` into a buffer that is not zeroed first.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

/// A Unix listener bound at `path`, its socket file created with `mode` whatever the
/// process's umask. The umask is per process, so it is set for the `bind` only; call this
/// before the node starts other threads.
pub fn bind_unix(path: &Path, mode: u32) -> io::Result<std::os::unix::net::UnixListener> {
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    let old = unsafe { libc::umask(!mode & 0o777) };
    let bound = std::os::unix::net::UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    bound
}

/// Gives `path` to group `gid` (the owner stays).
pub fn chown_group(path: &Path, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// The id of group `name`: a number, or a name from the group database.
pub fn group_id(name: &str) -> io::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let c_name = CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a group name with a NUL"))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: `group` is a plain C struct for which all-zero is a valid value.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the name is NUL-terminated, `group` and
    // `found` are writable, `buf` is writable for `buf.len()` bytes; the strings the call
    // stores point into `buf`, which we do not read.
    let rc = unsafe {
        libc::getgrnam_r(
            c_name.as_ptr(),
            &mut group,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if found.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no group named \"{}\"", dataplane_cli::one_line(name)),
        ));
    }
    Ok(group.gr_gid)
}

/// The process id and user id at the other end of a connected Unix socket (`SO_PEERCRED`:
/// what the kernel recorded when the peer connected).
pub fn peer_credentials(socket: BorrowedFd<'_>) -> io::Result<(i32, u32)> {
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>())
        .map_err(|_| io::Error::other("ucred size"))?;
    // SAFETY: the descriptor is open for the call (borrowed); `credentials` is writable for
    // `len` bytes, the size of the `ucred` that SO_PEERCRED stores, and `len` is writable.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((credentials.pid, credentials.uid))
}

/// Whether `path` names a Unix socket (and not a file someone might want kept).
pub fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// `len` bytes of `file` from `offset` (`pread`, repeated over short reads and `EINTR`), into
/// a fresh buffer that is not zeroed first (a chunk is read once; zeroing it first would
/// touch every byte twice). Fewer bytes than `len` only at the end of the file.
pub fn pread_fresh(file: &std::fs::File, len: usize, offset: u64) -> io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    let mut filled = 0usize;
    while filled < len {
        let at = offset
            .checked_add(filled as u64)
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the destination is the buffer's spare capacity from `filled` on, `len -
        // filled` bytes, all inside its allocation; `pread` writes at most that many.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(filled).cast(),
                len - filled,
                at,
            )
        };
        match n {
            0 => break,
            n if n > 0 => filled += n as usize,
            _ => {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
    // SAFETY: `pread` initialised the first `filled` bytes.
    unsafe { buf.set_len(filled) };
    Ok(buf)
}

/// The memory this process may have, in bytes: the machine's (`sysconf`), or its control
/// group's `memory.max` (cgroup v2) when that is lower. `None` if neither can be read.
pub fn memory_available() -> Option<u64> {
    // SAFETY: sysconf reads two constants and touches no memory of ours.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let machine = u64::try_from(pages)
        .ok()
        .zip(u64::try_from(page).ok())
        .and_then(|(n, size)| n.checked_mul(size));
    let group = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match (machine, group) {
        (Some(m), Some(g)) => Some(m.min(g)),
        (m, g) => m.or(g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_socket_gets_its_mode_whatever_the_umask() {
        let scratch = tempfile::Builder::new()
            .prefix("dataplane-sys-")
            .tempdir()
            .unwrap();
        let dir = scratch.path();
        let path = dir.join("s.sock");
        // SAFETY: a test-local umask change; restored below.
        let old = unsafe { libc::umask(0) };
        let listener = bind_unix(&path, 0o600).unwrap();
        // SAFETY: restoring it.
        unsafe { libc::umask(old) };
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(is_socket(&path));
        assert!(!is_socket(dir));
        drop(listener);
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        assert!(group_id("no-such-group-here").is_err());
    }
}

//! A child program of a dataplane host: it attaches to the host's socket, writes a blob in
//! place, reads it back as a zero-copy view of the shared arena, and stats it.
//!
//! Start a directory and a host first (README.md, "Running real nodes"), then:
//!
//! ```sh
//! cargo run -p dataplane-io --example child_session -- /tmp/dp-a.sock /data/example
//! ```
//!
//! The socket is the first argument, else `$DATAPLANE_SOCKET`, else `/tmp/dataplane.sock`; the
//! path is the second argument, else `/data/examples/child-session`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dataplane_io::child::{ChildError, ChildSession};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let socket = args
        .next()
        .or_else(|| std::env::var_os("DATAPLANE_SOCKET"))
        .map_or_else(|| PathBuf::from("/tmp/dataplane.sock"), PathBuf::from);
    let path = args.next().map_or_else(
        || "/data/examples/child-session".to_owned(),
        |p| p.to_string_lossy().into_owned(),
    );
    match write_read_stat(&socket, &path) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("child_session: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes a greeting at `path` through the host serving `socket`, reads it back and stats it;
/// returns what it saw, one line per step.
pub fn write_read_stat(socket: &Path, path: &str) -> Result<Vec<String>, ChildError> {
    let mut lines = Vec::new();
    // Attaching presents the capability the host wrote next to its socket (`SOCKET.cap`).
    let mut session = ChildSession::connect(socket)?;

    // Write: the closure fills the blob's bytes where they are (a buffer the host maps for
    // this child and copies into the arena when the write is sealed); the host seals the blob
    // with a BLAKE3 digest and publishes it at `path`, replacing what was there.
    let greeting = b"hello from a child session";
    let revision = session.write(path, greeting.len() as u64, |payload| {
        payload.copy_from_slice(greeting);
    })?;
    lines.push(format!("{path}: published at {revision}"));

    // Read: a view of the blob in the arena (mapped read-only: no copy into this process).
    // The view borrows the session: the session is usable again once the view is dropped,
    // which releases the lease it maps.
    {
        let view = session.read(path)?;
        let text = String::from_utf8_lossy(view.bytes());
        lines.push(format!("{path}: read {} bytes: {text}", view.bytes().len()));
        if view.bytes() != greeting {
            return Err(ChildError::Protocol(format!(
                "{path}: read back other bytes"
            )));
        }
    }

    // Stat: what the namespace says is at `path`.
    let stat = session.stat(path)?;
    let length = stat
        .length
        .map_or_else(|| "unknown length".to_owned(), |n| format!("{n} bytes"));
    lines.push(format!(
        "{path}: {}, {length}, {}",
        stat.kind, stat.revision
    ));

    // Closing ends the session; the published blob stays.
    session.close()?;
    Ok(lines)
}

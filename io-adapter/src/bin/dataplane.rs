//! `dataplane`: a client that acts as a child session of a host, through its Unix socket.
//!
//! Every failure is one line on stderr, `dataplane: ` and the message, and one exit status from
//! the table in [`USAGE`] (sysexits-style; README.md has the same table). No argument makes it
//! panic: arguments are taken as OS strings, data paths must be UTF-8 and valid (core's
//! [`DataPath`] rules, checked here before anything is sent), file names may be any bytes.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dataplane_core::error::{BlobFailure, DataPlaneError};
use dataplane_core::path::{DataPath, PathError};
use dataplane_core::wire::EntryKind;
use dataplane_io::child::{ChildError, ChildSession};

const USAGE: &str = "\
dataplane: put and get blobs through a dataplane host

USAGE:
    dataplane [--socket PATH] put PATH FILE|-      publish FILE (or stdin) at PATH
    dataplane [--socket PATH] get PATH [FILE|-]    write the blob at PATH to FILE (or stdout)
    dataplane [--socket PATH] stat PATH            what is at PATH
    dataplane [--socket PATH] mv SRC DST [--replace]
    dataplane [--socket PATH] rm PATH

The socket is --socket, else $DATAPLANE_SOCKET, else /tmp/dataplane.sock; its capability is read
from PATH.cap. Paths may start with /runs/self (the session's own run). A path is UTF-8, starts
with '/', and has no empty, '.' or '..' segment and no control character (newline, tab, escape).
`stat` of a lost blob succeeds and says 'lost'.

EXIT STATUS:
     0  ok
     1  a local file (FILE, stdin, stdout) could not be read or written
     2  not found
     3  already exists
     4  not allowed (outside the session's prefixes, or the attach was refused)
     5  invalid path or argument, or a blob larger than the host's whole arena
     6  replaced, busy (a stream is active), or the wrong kind of entry
    64  usage
    65  the blob is lost or damaged: its bytes lived on a host that restarted, or do not
        match their digest; retrying cannot help, write it again
    69  host unreachable, or it closed the connection or revoked the session
    70  the host broke the protocol or failed in a way this client cannot cause (a bug)
    75  temporary: the namespace or the blob's source is unavailable, the host's arena is
        full, or the host is busy (a limit was reached); try again later
";

/// A failure: its exit status and its one-line message.
type Failure = (u8, String);

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let mut socket = std::env::var_os("DATAPLANE_SOCKET")
        .map_or_else(|| PathBuf::from("/tmp/dataplane.sock"), PathBuf::from);
    if args.first().is_some_and(|a| a == "--socket") {
        if args.len() < 2 {
            return fail(64, "--socket needs a value (see --help)");
        }
        socket = PathBuf::from(args[1].clone());
        args.drain(..2);
    }
    match run(&socket, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => fail(code, &message),
    }
}

fn fail(code: u8, message: &str) -> ExitCode {
    eprintln!("dataplane: {message}");
    ExitCode::from(code)
}

/// The exit status of a host error. No wildcard: a new error needs a decision here, and a row
/// in [`USAGE`].
fn status(error: &DataPlaneError) -> u8 {
    match error {
        DataPlaneError::PathNotFound(_) => 2,
        DataPlaneError::PathExists(_) => 3,
        DataPlaneError::Unauthorized { .. }
        | DataPlaneError::Attachment(_)
        | DataPlaneError::InvalidCapability => 4,
        DataPlaneError::InvalidPath(_)
        | DataPlaneError::InvalidArgument(_)
        | DataPlaneError::BlobTooLarge { .. } => 5,
        DataPlaneError::PathReplaced(_)
        | DataPlaneError::Busy(_)
        | DataPlaneError::WrongEntryType { .. } => 6,
        // The bytes are gone (or not the bytes that were written): a retry reads the same.
        DataPlaneError::BlobLost(_) | DataPlaneError::Blob(BlobFailure::Digest) => 65,
        DataPlaneError::SessionFailed(_)
        | DataPlaneError::SourceFailure(_)
        | DataPlaneError::ArenaExhausted
        | DataPlaneError::LimitReached(_) => 75,
        // Nothing this client asks for can cause these: it never cancels, never streams, and
        // checks its leases itself.
        DataPlaneError::SessionNotRunning
        | DataPlaneError::Blob(_)
        | DataPlaneError::OperationCancelled
        | DataPlaneError::PeerLost
        | DataPlaneError::StreamFault(_)
        | DataPlaneError::StreamClosed
        | DataPlaneError::Unsupported => 70,
    }
}

fn exit_code(error: &ChildError) -> u8 {
    match error {
        ChildError::Connect(_) | ChildError::Disconnected | ChildError::Revoked => 69,
        ChildError::Protocol(_) => 70,
        ChildError::Refused { busy: true, .. } => 75,
        ChildError::Refused { busy: false, .. } => 4,
        ChildError::Failed(e) => status(e),
    }
}

/// Connects, waiting up to 3 s for a host that is still starting (its socket not there yet).
fn connect(socket: &Path) -> Result<ChildSession, Failure> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match ChildSession::connect(socket) {
            Err(ChildError::Connect(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other.map_err(child),
        }
    }
}

fn child(e: ChildError) -> Failure {
    (exit_code(&e), e.to_string())
}

fn io_error(what: &OsStr, e: io::Error) -> Failure {
    (1, format!("{}: {e}", shown(what)))
}

/// An argument as it may be printed on one line: lossily decoded, control characters escaped.
fn shown(arg: &OsStr) -> String {
    let mut out = String::new();
    for c in arg.to_string_lossy().chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A data path argument: UTF-8 and valid by core's rules (`/runs/self` is a valid path too; the
/// host resolves it and checks the result again).
fn data_path(arg: &OsStr) -> Result<&str, Failure> {
    let invalid = |e: PathError| {
        let error = DataPlaneError::InvalidPath(e);
        (status(&error), format!("{}: {error}", shown(arg)))
    };
    let path = arg.to_str().ok_or_else(|| invalid(PathError::NotUtf8))?;
    DataPath::new(path).map_err(invalid)?;
    Ok(path)
}

fn run(socket: &Path, args: &[OsString]) -> Result<(), Failure> {
    let usage = |m: &str| (64, format!("{m} (see --help)"));
    let Some((command, rest)) = args.split_first() else {
        return Err(usage("a command is required"));
    };
    let rest: Vec<&OsStr> = rest.iter().map(OsString::as_os_str).collect();
    match (command.to_str(), rest.as_slice()) {
        (Some("put"), [path, source]) => {
            let path = data_path(path)?;
            let mut session = connect(socket)?;
            let revision = if *source == "-" {
                let mut bytes = Vec::new();
                io::stdin()
                    .read_to_end(&mut bytes)
                    .map_err(|e| io_error("stdin".as_ref(), e))?;
                session.put(path, &bytes).map_err(child)?
            } else {
                let mut file = File::open(source).map_err(|e| io_error(source, e))?;
                let length = file.metadata().map_err(|e| io_error(source, e))?.len();
                // Read straight into the shared arena: no intermediate buffer. A failed read
                // abandons the write: nothing is published.
                session
                    .try_write(path, length, false, |payload| file.read_exact(payload))
                    .map_err(child)?
                    .map_err(|e| io_error(source, e))?
            };
            session.close().map_err(child)?;
            eprintln!("{path}: published at {revision}");
            Ok(())
        }
        (Some("get"), [path]) => get(socket, path, None),
        (Some("get"), [path, target]) if *target == "-" => get(socket, path, None),
        (Some("get"), [path, target]) => get(socket, path, Some(target)),
        (Some("stat"), [path]) => {
            let path = data_path(path)?;
            let mut session = connect(socket)?;
            let stat = session.stat(path).map_err(child)?;
            let revision = stat.revision;
            match (stat.kind, stat.length) {
                (EntryKind::Blob, _) if stat.lost => println!(
                    "{path}: blob, lost (its bytes lived on a host that restarted), {revision}"
                ),
                (EntryKind::Blob, Some(length)) => {
                    println!("{path}: blob, {length} bytes, {revision}");
                }
                (kind, _) => println!("{path}: {kind}, {revision}"),
            }
            session.close().map_err(child)
        }
        (Some("mv"), [from, to]) => mv(socket, from, to, false),
        (Some("mv"), [from, to, flag]) if *flag == "--replace" => mv(socket, from, to, true),
        (Some("rm"), [path]) => {
            let path = data_path(path)?;
            let mut session = connect(socket)?;
            session.remove(path, None).map_err(child)?;
            session.close().map_err(child)
        }
        (Some(known @ ("put" | "get" | "stat" | "mv" | "rm")), _) => {
            Err(usage(&format!("wrong arguments for {known}")))
        }
        _ => Err(usage(&format!("unknown command \"{}\"", shown(command)))),
    }
}

fn get(socket: &Path, path: &OsStr, target: Option<&OsStr>) -> Result<(), Failure> {
    let path = data_path(path)?;
    let mut session = connect(socket)?;
    {
        let view = session.read(path).map_err(child)?;
        match target {
            None => {
                let mut out = io::stdout().lock();
                out.write_all(view.bytes())
                    .and_then(|()| out.flush())
                    .map_err(|e| io_error("stdout".as_ref(), e))?;
            }
            Some(target) => {
                let mut file = File::create(target).map_err(|e| io_error(target, e))?;
                file.write_all(view.bytes())
                    .map_err(|e| io_error(target, e))?;
            }
        }
    }
    session.close().map_err(child)
}

fn mv(socket: &Path, from: &OsStr, to: &OsStr, replace: bool) -> Result<(), Failure> {
    let (from, to) = (data_path(from)?, data_path(to)?);
    let mut session = connect(socket)?;
    session.rename(from, to, replace).map_err(child)?;
    session.close().map_err(child)
}

//! `dataplane`: a client that acts as a child session of a host, through its Unix socket.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use dataplane_core::error::DataPlaneError;
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
from PATH.cap. Paths may start with /runs/self (the session's own run).

EXIT STATUS:
    0 ok   2 not found   3 already exists   4 not allowed   5 invalid path
    6 replaced, busy or wrong kind   64 usage   65 the blob is lost (its bytes lived on a host
    that restarted)   69 host unreachable   75 temporarily unavailable   1 anything else
";

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let mut socket = std::env::var_os("DATAPLANE_SOCKET")
        .map_or_else(|| PathBuf::from("/tmp/dataplane.sock"), PathBuf::from);
    if args.first().map(String::as_str) == Some("--socket") {
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

fn exit_code(error: &ChildError) -> u8 {
    match error {
        ChildError::Connect(_) | ChildError::Disconnected => 69,
        ChildError::Protocol(_) => 1,
        ChildError::Failed(e) => match e {
            DataPlaneError::PathNotFound(_) => 2,
            DataPlaneError::PathExists(_) => 3,
            DataPlaneError::Unauthorized { .. }
            | DataPlaneError::Attachment(_)
            | DataPlaneError::InvalidCapability => 4,
            DataPlaneError::InvalidPath(_) | DataPlaneError::InvalidArgument(_) => 5,
            DataPlaneError::PathReplaced(_)
            | DataPlaneError::Busy(_)
            | DataPlaneError::WrongEntryType { .. } => 6,
            DataPlaneError::BlobLost(_) => 65,
            DataPlaneError::SessionFailed(_)
            | DataPlaneError::SourceFailure(_)
            | DataPlaneError::ArenaExhausted
            | DataPlaneError::LimitReached(_) => 75,
            _ => 1,
        },
    }
}

/// Connects, waiting up to 3 s for a host that is still starting (its socket not there yet).
fn connect(socket: &std::path::Path) -> Result<ChildSession, (u8, String)> {
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

fn child(e: ChildError) -> (u8, String) {
    (exit_code(&e), e.to_string())
}

fn io_error(what: &str, e: io::Error) -> (u8, String) {
    (1, format!("{what}: {e}"))
}

fn run(socket: &std::path::Path, args: &[String]) -> Result<(), (u8, String)> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let usage = |m: &str| (64, format!("{m} (see --help)"));
    match words.as_slice() {
        ["put", path, source] => {
            let mut session = connect(socket)?;
            let revision = if *source == "-" {
                let mut bytes = Vec::new();
                io::stdin()
                    .read_to_end(&mut bytes)
                    .map_err(|e| io_error("stdin", e))?;
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
        ["get", path] | ["get", path, "-"] => {
            let mut session = connect(socket)?;
            {
                let view = session.read(path).map_err(child)?;
                let mut out = io::stdout().lock();
                out.write_all(view.bytes())
                    .and_then(|()| out.flush())
                    .map_err(|e| io_error("stdout", e))?;
            }
            session.close().map_err(child)
        }
        ["get", path, target] => {
            let mut session = connect(socket)?;
            {
                let view = session.read(path).map_err(child)?;
                let mut file = File::create(target).map_err(|e| io_error(target, e))?;
                file.write_all(view.bytes())
                    .map_err(|e| io_error(target, e))?;
            }
            session.close().map_err(child)
        }
        ["stat", path] => {
            let mut session = connect(socket)?;
            let stat = session.stat(path).map_err(child)?;
            match (stat.kind, stat.length) {
                (EntryKind::Blob, _) if stat.lost => println!(
                    "{path}: blob, lost (its bytes lived on a host that restarted), {}",
                    stat.revision
                ),
                (EntryKind::Blob, Some(length)) => {
                    println!("{path}: blob, {length} bytes, {}", stat.revision);
                }
                (EntryKind::Stream, _) => println!("{path}: stream, {}", stat.revision),
                (kind, _) => println!("{path}: {kind:?}, {}", stat.revision),
            }
            session.close().map_err(child)
        }
        ["mv", from, to] | ["mv", from, to, "--replace"] => {
            let replace = words.len() == 4;
            let mut session = connect(socket)?;
            session.rename(from, to, replace).map_err(child)?;
            session.close().map_err(child)
        }
        ["rm", path] => {
            let mut session = connect(socket)?;
            session.remove(path, None).map_err(child)?;
            session.close().map_err(child)
        }
        [] => Err(usage("a command is required")),
        [command, ..] if ["put", "get", "stat", "mv", "rm"].contains(command) => {
            Err(usage(&format!("wrong arguments for {command}")))
        }
        [command, ..] => Err(usage(&format!("unknown command {command:?}"))),
    }
}

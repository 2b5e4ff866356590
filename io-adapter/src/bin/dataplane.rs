//! `dataplane`: a client that acts as a child session of a host, through its Unix socket.
//!
//! Every failure is one line on stderr, `dataplane: ` and the message, and one exit status from
//! the table the three binaries share ([`dataplane_cli::Exit`], printed by `--help`; README.md
//! has the same table). No argument makes it panic: arguments are taken as OS
//! strings, data paths must be UTF-8 and valid (core's [`DataPath`] rules, checked here before
//! anything is sent), file names may be any bytes.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dataplane_cli::Exit;
use dataplane_core::error::{BlobFailure, DataPlaneError, NamespaceError};
use dataplane_core::path::{DataPath, PathError};
use dataplane_core::wire::{EntryKind, StreamRole};
use dataplane_io::child::{ChildError, ChildSession, StreamOpen};
use dataplane_io::control::{ControlError, HostControl, parse_session};
use dataplane_io::transport;

/// `--timeout`'s default: [`dataplane_io::child::CALL_WAIT`].
const DEFAULT_TIMEOUT_SECS: u64 = dataplane_io::child::CALL_WAIT.as_secs();
/// The socket when neither `--socket` nor `$DATAPLANE_SOCKET` names one.
const DEFAULT_SOCKET: &str = "/tmp/dataplane.sock";

const ABOUT: &str = "dataplane: put and get blobs through a dataplane host";

const AFTER_HELP: &str = "\
The socket's capability is read from SOCKET.cap. Paths may start with /runs/self (the
session's own run). A path is UTF-8, starts with '/', and has no empty, '.' or '..' segment
and no control character (newline, tab, escape). A new name (put, publish, the stream
commands, mv's destination) also has no character that prints as nothing or reorders text
(U+200B zero-width space, U+202E right-to-left override...). `stat` of a lost blob succeeds
and says 'lost'. What a command reports goes to stdout; every failure is one line on stderr,
`dataplane: ` and the message (the stream commands' byte counts go to stderr too: their
stdout may be the stream).";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "dataplane",
    version = dataplane_cli::VERSION,
    about = ABOUT,
    after_help = format!("{AFTER_HELP}\n\n{}", dataplane_cli::exit_table()),
    subcommand_required = true,
    propagate_version = true,
    disable_help_subcommand = true
)]
struct Cli {
    /// The host's child socket.
    #[arg(long, global = true, env = "DATAPLANE_SOCKET", default_value = DEFAULT_SOCKET,
          value_name = "PATH")]
    socket: PathBuf,
    /// Give up (exit 75) when the host has not answered a call within this many seconds (a
    /// stopped or wedged host: a live one answers everything sooner). Waiting for a stream's
    /// peer is --wait's.
    #[arg(long, global = true, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Publish FILE (or stdin, `-`) at PATH, replacing what is there (unless --no-replace).
    Put {
        /// The data path.
        path: OsString,
        /// The file to publish, or `-` for stdin.
        file: OsString,
        /// Refuse (exit 73) if something is at PATH already, as `mv` does without --replace.
        #[arg(long)]
        no_replace: bool,
    },
    /// Write the blob at PATH to FILE (or stdout, `-` or none).
    Get {
        /// The data path.
        path: OsString,
        /// Where to write it (stdout if none or `-`).
        file: Option<OsString>,
    },
    /// Say what is at PATH.
    Stat {
        /// The data path.
        path: OsString,
    },
    /// Rename SRC to DST.
    Mv {
        /// The data path to move.
        src: OsString,
        /// Its new path.
        dst: OsString,
        /// Replace what is at DST.
        #[arg(long)]
        replace: bool,
    },
    /// Publish FILE, a file on the host's disk under its file root (`dataplane-node host
    /// --files DIR`, FILE relative to DIR), at PATH without copying it: the host serves it from
    /// the file, across restarts, and refuses to once the file changed.
    Publish {
        /// The data path.
        path: OsString,
        /// The file, relative to the host's file root.
        file: String,
    },
    /// Open the writing side of the stream at PATH, wait for its reader, and send FILE (or
    /// stdin, `-` or none) to it over the reference transport (dataplane_io::transport); the
    /// stream is closed at the end.
    StreamSend {
        /// The data path.
        path: OsString,
        /// What to send (stdin if none or `-`).
        file: Option<OsString>,
        /// Displace a writer waiting there, or fence the active stream.
        #[arg(long)]
        replace: bool,
        /// Give up (exit 75) if no reader came within this many seconds.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        /// Give up (exit 75) once the reader has taken no byte for this many seconds (it
        /// stopped reading); without it, wait for as long as the reader holds the stream.
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
        idle: Option<u64>,
    },
    /// Open the reading side of the stream at PATH, wait for its writer, and write what it
    /// sends to FILE (or stdout, `-` or none); the stream is closed at the end.
    StreamRecv {
        /// The data path.
        path: OsString,
        /// Where to write (stdout if none or `-`).
        file: Option<OsString>,
        /// Where the writer connects: TCP HOST:PORT (the default, 127.0.0.1:0, is for a
        /// writer on this machine; give an address the writer's machine reaches).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
        listen: String,
        /// Displace a reader waiting there, or fence the active stream.
        #[arg(long)]
        replace: bool,
        /// Give up (exit 75) if no writer came within this many seconds.
        #[arg(long, value_name = "SECS")]
        wait: Option<u64>,
        /// Give up (exit 75) once the writer has sent nothing for this many seconds (a stream
        /// may pause: without it, wait for as long as the writer holds the stream).
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
        idle: Option<u64>,
    },
    /// Remove PATH.
    Rm {
        /// The data path.
        path: OsString,
    },
    /// List the host's live sessions (its control socket, SOCKET.ctl: the host's user only).
    Sessions,
    /// Revoke a session (as `sessions` prints it, e.g. n1.1/1099511627777): its child is told
    /// and disconnected, its operations end, the blobs it published stay.
    Revoke {
        /// The session's address.
        session: String,
    },
    /// Print one consistent sample of the host's arena.
    Arena,
}

/// A failure: its exit status and its one-line message.
type Failure = (Exit, String);

fn main() -> ExitCode {
    let cli: Cli = dataplane_cli::parse("dataplane");
    let host = Host {
        socket: &cli.socket,
        call_wait: std::time::Duration::from_secs(cli.timeout),
    };
    match run(&host, cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => fail(code, &message),
    }
}

fn fail(code: Exit, message: &str) -> ExitCode {
    // A path from the host (an old entry's name) may hold characters that print as nothing.
    eprintln!("dataplane: {}", dataplane_cli::one_line(message));
    ExitCode::from(code)
}

/// The exit status of a host error. No wildcard: a new error needs a decision here, and maybe
/// a row in [`dataplane_cli::Exit`].
fn status(error: &DataPlaneError) -> Exit {
    match error {
        DataPlaneError::PathNotFound(_) => Exit::NotFound,
        DataPlaneError::PathExists(_) => Exit::Exists,
        DataPlaneError::Unauthorized { .. }
        | DataPlaneError::Attachment(_)
        | DataPlaneError::InvalidCapability => Exit::NotAllowed,
        DataPlaneError::InvalidPath(_)
        | DataPlaneError::InvalidArgument(_)
        | DataPlaneError::BlobTooLarge { .. } => Exit::Invalid,
        DataPlaneError::PathReplaced(_)
        | DataPlaneError::Busy(_)
        | DataPlaneError::WrongEntryType { .. } => Exit::Conflict,
        // The bytes are gone (or not the bytes that were written): a retry reads the same.
        DataPlaneError::BlobLost(_)
        | DataPlaneError::Blob(BlobFailure::Digest)
        | DataPlaneError::SourceChanged(_) => Exit::DataLost,
        DataPlaneError::SessionFailed(_)
        | DataPlaneError::SourceFailure(_)
        | DataPlaneError::ArenaExhausted
        | DataPlaneError::LimitReached(_)
        | DataPlaneError::WriteExpired { .. } => Exit::Temporary,
        DataPlaneError::Namespace(e) => match e {
            // No directory answered, or none in time: it passes. A full disk at the directory
            // passes once an operator frees space (the message names the data directory).
            NamespaceError::DirectoryUnavailable(_)
            | NamespaceError::Timeout
            | NamespaceError::NoSpace(_) => Exit::Temporary,
            // The same request gets the same answer.
            NamespaceError::OperationConflict(_)
            | NamespaceError::OperationExpired(_)
            | NamespaceError::DuplicateStreamRole { .. }
            | NamespaceError::StaleIncarnation { .. } => Exit::Conflict,
            // The directory's revision space is spent, or a peer broke the protocol; the
            // other kinds have host errors of their own and never come here.
            NamespaceError::Storage(_)
            | NamespaceError::Protocol(_)
            | NamespaceError::PathNotFound(_)
            | NamespaceError::PathExists(_)
            | NamespaceError::WrongEntryType { .. }
            | NamespaceError::PathReplaced(_)
            | NamespaceError::StreamActive(_)
            | NamespaceError::SourceRecovery(_)
            | NamespaceError::LimitReached(_)
            | NamespaceError::BlobLost(_) => Exit::Software,
        },
        // Nothing this client asks for can cause these: it never cancels, never streams, and
        // checks its leases itself.
        DataPlaneError::SessionNotRunning
        | DataPlaneError::Blob(_)
        | DataPlaneError::OperationCancelled
        | DataPlaneError::PeerLost
        | DataPlaneError::StreamFault(_)
        | DataPlaneError::StreamClosed
        | DataPlaneError::Unsupported => Exit::Software,
    }
}

fn exit_code(error: &ChildError) -> Exit {
    match error {
        ChildError::Connect(_) | ChildError::Disconnected | ChildError::Revoked => {
            Exit::Unavailable
        }
        ChildError::TimedOut => Exit::Temporary,
        ChildError::Protocol(_) => Exit::Software,
        ChildError::Refused { busy: true, .. } => Exit::Temporary,
        ChildError::Refused { busy: false, .. } => Exit::NotAllowed,
        ChildError::Failed(e) => status(e),
    }
}

/// Connects, waiting up to 3 s for a host that is still starting (its socket not there yet);
/// each call of the session then waits at most `host.call_wait` for the host's answer.
fn connect(host: &Host<'_>) -> Result<ChildSession, Failure> {
    let socket = host.socket;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match ChildSession::connect(socket) {
            Err(ChildError::Connect(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(ChildError::TimedOut) => {
                return Err((
                    Exit::Temporary,
                    format!(
                        "{}: the host did not attach this client within {:?} (is it still \
                         waiting for its directory, or stopped?)",
                        socket.display(),
                        dataplane_io::child::ATTACH_WAIT
                    ),
                ));
            }
            Ok(mut session) => {
                session.set_call_wait(Some(host.call_wait));
                return Ok(session);
            }
            Err(e) => return Err(host.failed(e)),
        }
    }
}

/// The host this invocation talks to.
struct Host<'a> {
    /// Its child socket.
    socket: &'a Path,
    /// How long a call waits for its answer (`--timeout`).
    call_wait: std::time::Duration,
}

/// How long a host that let a call time out gets to attach a second client, to tell a host
/// that is up (and waits for something else) from one that is stopped.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Host<'_> {
    /// The failure of a call. A call that timed out names the component that did not answer:
    /// a host that attaches a new client at once is up, and was waiting for its directory or
    /// for a blob's source; one that does not is stopped or wedged.
    fn failed(&self, e: ChildError) -> Failure {
        if !matches!(e, ChildError::TimedOut) {
            return (exit_code(&e), e.to_string());
        }
        let secs = self.call_wait.as_secs();
        // A host that answers the probe at all is up: one that attaches it, or refuses it (a
        // full session table is an answer too).
        let probe = ChildSession::connect_within(self.socket, PROBE_WAIT);
        let up = match probe {
            Ok(probe) => {
                let _ = probe.close();
                true
            }
            Err(ChildError::Refused { .. }) => true,
            Err(_) => false,
        };
        let message = if up {
            format!(
                "the host is up but did not finish the call within --timeout ({secs} s): it \
                     is waiting for its directory (stopped, unreachable or slow?) or for the \
                     blob's source; the host's log says which (raise --timeout to wait longer)"
            )
        } else {
            format!(
                "no answer from the host within --timeout ({secs} s), and it did not answer a \
                 new client within {} s either: the host is stopped or wedged (is its process \
                 paused?)",
                PROBE_WAIT.as_secs()
            )
        };
        (exit_code(&e), message)
    }
}

fn io_error(what: &OsStr, e: io::Error) -> Failure {
    (Exit::LocalFile, format!("{}: {e}", shown(what)))
}

/// An argument as it may be printed on one line: lossily decoded, control and invisible
/// characters escaped, a long one cut in the middle.
fn shown(arg: &OsStr) -> String {
    dataplane_cli::one_line_short(&arg.to_string_lossy())
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

/// A data path argument that names a new entry: [`data_path`], and fit for a new name (no
/// character that prints as nothing or reorders text; the host checks it again).
fn new_path(arg: &OsStr) -> Result<&str, Failure> {
    let path = data_path(arg)?;
    if let Err(e) = DataPath::new(path).and_then(|p| p.check_new_name()) {
        let error = DataPlaneError::InvalidPath(e);
        return Err((status(&error), format!("{}: {error}", shown(arg))));
    }
    Ok(path)
}

/// The failure of a control request.
fn control(error: ControlError) -> Failure {
    let code = match &error {
        ControlError::Connect(..) | ControlError::Closed => Exit::Unavailable,
        ControlError::NoSuchSession(_) => Exit::NotFound,
        ControlError::Frame(_) | ControlError::Refused(_) | ControlError::Unexpected(_) => {
            Exit::Software
        }
    };
    (code, error.to_string())
}

fn run(host: &Host<'_>, command: Command) -> Result<(), Failure> {
    match command {
        Command::Sessions => {
            let sessions = HostControl::connect(host.socket)
                .and_then(|mut c| c.sessions())
                .map_err(control)?;
            // One line per session, nothing else: `| wc -l` counts them.
            for s in &sessions {
                dataplane_cli::outln!(
                    "{} child={} state={} operations={} published={}",
                    s.session,
                    s.child.map_or_else(|| "-".to_owned(), |c| c.to_string()),
                    s.state,
                    s.bindings,
                    s.published
                );
            }
            Ok(())
        }
        Command::Revoke { session } => {
            let address = parse_session(&session).map_err(|e| (Exit::Invalid, e))?;
            HostControl::connect(host.socket)
                .and_then(|mut c| c.revoke(address))
                .map_err(control)?;
            dataplane_cli::outln!("{address}: revoked");
            Ok(())
        }
        Command::Arena => {
            let s = HostControl::connect(host.socket)
                .and_then(|mut c| c.arena_stats())
                .map_err(control)?;
            dataplane_cli::outln!(
                "size={} used={} free={} largest_free={} leases={} queued={} refused={}",
                s.size,
                s.used_bytes,
                s.free_bytes,
                s.largest_free,
                s.leases,
                s.queued,
                s.refused
            );
            Ok(())
        }
        Command::Put {
            path,
            file,
            no_replace,
        } => put(host, &path, &file, no_replace),
        Command::Get { path, file } => {
            let target = file.filter(|f| f != "-");
            get(host, &path, target.as_deref())
        }
        Command::Stat { path } => {
            let arg = path;
            let path = data_path(&arg)?;
            let mut session = connect(host)?;
            let stat = session.stat(path).map_err(|e| host.failed(e))?;
            let revision = stat.revision;
            // An old entry's name may hold characters that print as nothing: shown escaped.
            let path = shown(&arg);
            match (stat.kind, stat.length) {
                (EntryKind::Blob, _) if stat.lost => dataplane_cli::outln!(
                    "{path}: blob, lost (its bytes lived on a host that restarted), {revision}"
                ),
                (EntryKind::Blob, Some(length)) => {
                    dataplane_cli::outln!("{path}: blob, {length} bytes, {revision}");
                }
                (kind, _) => dataplane_cli::outln!("{path}: {kind}, {revision}"),
            }
            session.close().map_err(|e| host.failed(e))
        }
        Command::Mv { src, dst, replace } => mv(host, &src, &dst, replace),
        Command::StreamSend {
            path,
            file,
            replace,
            wait,
            idle,
        } => stream_send(host, &path, file.filter(|f| f != "-"), replace, wait, idle),
        Command::StreamRecv {
            path,
            file,
            listen,
            replace,
            wait,
            idle,
        } => stream_recv(
            host,
            &path,
            file.filter(|f| f != "-"),
            &listen,
            replace,
            wait,
            idle,
        ),
        Command::Publish { path, file } => {
            let path = new_path(&path)?;
            let mut session = connect(host)?;
            let revision = session
                .publish_file(path, &file)
                .map_err(|e| host.failed(e))?;
            session.close().map_err(|e| host.failed(e))?;
            dataplane_cli::outln!(
                "{path}: published from the host's file {} at {revision}",
                dataplane_cli::one_line_short(&file)
            );
            Ok(())
        }
        Command::Rm { path } => {
            let path = data_path(&path)?;
            let mut session = connect(host)?;
            session.remove(path, None).map_err(|e| host.failed(e))?;
            session.close().map_err(|e| host.failed(e))
        }
    }
}

/// How long a matched peer may take to connect over the reference transport.
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A stream open that failed: a timeout names what did not come.
fn no_peer(host: &Host<'_>, path: &str, peer: &str, error: ChildError) -> Failure {
    match error {
        ChildError::TimedOut => (
            Exit::Temporary,
            format!("{path}: no {peer} opened the other side in the time allowed (--wait)"),
        ),
        other => host.failed(other),
    }
}

fn stream_send(
    host: &Host<'_>,
    path: &OsStr,
    file: Option<OsString>,
    replace: bool,
    wait: Option<u64>,
    idle: Option<u64>,
) -> Result<(), Failure> {
    let path = new_path(path)?;
    let mut input: Box<dyn Read> = match &file {
        Some(name) => Box::new(File::open(name).map_err(|e| io_error(name, e))?),
        None => Box::new(io::stdin()),
    };
    let mut session = connect(host)?;
    let how = StreamOpen {
        replace,
        ..StreamOpen::default()
    };
    let wait = wait.map(std::time::Duration::from_secs);
    let stream = session
        .open_stream(
            path,
            StreamRole::Source,
            &transport::source_descriptor(),
            how,
            wait,
        )
        .map_err(|e| no_peer(host, path, "reader", e))?;
    let transport_error = |e: io::Error| {
        (
            Exit::Temporary,
            format!("{path}: the stream's transport: {e}"),
        )
    };
    let mut peer = transport::connect(stream.peer_descriptor()).map_err(transport_error)?;
    peer.set_write_timeout(idle.map(std::time::Duration::from_secs))
        .map_err(transport_error)?;
    // Only the peer's socket has a timeout: a timed-out copy is a reader that stopped reading.
    let sent = io::copy(&mut input, &mut peer)
        .map_err(|e| idle_or(e, idle, path, "the reader took nothing", transport_error))?;
    peer.finish().map_err(transport_error)?;
    // The reader closes once it has everything (our close then finds the stream closed, or
    // closes it); a reader that never does is not waited for past CONNECT_WAIT.
    let mut end = [0u8; 1];
    let _ = peer.set_read_timeout(Some(CONNECT_WAIT));
    let _ = peer.read(&mut end);
    session.close_stream(stream).map_err(|e| host.failed(e))?;
    session.close().map_err(|e| host.failed(e))?;
    eprintln!("{path}: sent {sent} bytes");
    Ok(())
}

fn stream_recv(
    host: &Host<'_>,
    path: &OsStr,
    file: Option<OsString>,
    listen: &str,
    replace: bool,
    wait: Option<u64>,
    idle: Option<u64>,
) -> Result<(), Failure> {
    let path = new_path(path)?;
    let mut output: Box<dyn Write> = match &file {
        Some(name) => Box::new(File::create(name).map_err(|e| io_error(name, e))?),
        None => Box::new(io::stdout().lock()),
    };
    let transport_error = |e: io::Error| {
        (
            Exit::Temporary,
            format!("{path}: the stream's transport: {e}"),
        )
    };
    let listener = transport::SinkListener::tcp(listen)
        .map_err(|e| (Exit::Invalid, format!("--listen {listen}: {e}")))?;
    let mut session = connect(host)?;
    let how = StreamOpen {
        replace,
        ..StreamOpen::default()
    };
    let wait = wait.map(std::time::Duration::from_secs);
    let stream = session
        .open_stream(path, StreamRole::Sink, listener.descriptor(), how, wait)
        .map_err(|e| no_peer(host, path, "writer", e))?;
    let mut peer = listener.accept(CONNECT_WAIT).map_err(transport_error)?;
    peer.set_read_timeout(idle.map(std::time::Duration::from_secs))
        .map_err(transport_error)?;
    // Only the peer's socket has a timeout: a timed-out copy is a writer that sent nothing.
    let received = io::copy(&mut peer, &mut output)
        .map_err(|e| idle_or(e, idle, path, "the writer sent nothing", transport_error))?;
    output.flush().map_err(transport_error)?;
    let _ = peer.finish();
    session.close_stream(stream).map_err(|e| host.failed(e))?;
    session.close().map_err(|e| host.failed(e))?;
    eprintln!("{path}: received {received} bytes");
    Ok(())
}

/// A stream copy's error: with `--idle`, a socket timeout is the peer's silence (exit 75, in
/// words), anything else the transport's.
fn idle_or(
    e: io::Error,
    idle: Option<u64>,
    path: &str,
    silence: &str,
    transport_error: impl Fn(io::Error) -> Failure,
) -> Failure {
    match idle {
        Some(secs)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            (
                Exit::Temporary,
                format!("{path}: {silence} for {secs} s (--idle)"),
            )
        }
        _ => transport_error(e),
    }
}

fn get(host: &Host<'_>, path: &OsStr, target: Option<&OsStr>) -> Result<(), Failure> {
    let path = data_path(path)?;
    let mut session = connect(host)?;
    {
        let view = session.read(path).map_err(|e| host.failed(e))?;
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
    session.close().map_err(|e| host.failed(e))
}

fn mv(host: &Host<'_>, from: &OsStr, to: &OsStr, replace: bool) -> Result<(), Failure> {
    let (from, to) = (data_path(from)?, new_path(to)?);
    let mut session = connect(host)?;
    session
        .rename(from, to, replace)
        .map_err(|e| host.failed(e))?;
    session.close().map_err(|e| host.failed(e))
}

/// `put`: the bytes go straight from FILE (or from stdin when it is a regular file) into the
/// write's buffer; a pipe on stdin is read first, up to the arena's size, since a write needs
/// its length up front, and refused as soon as it holds more than the arena can ever take.
fn put(host: &Host<'_>, path: &OsStr, file: &OsStr, no_replace: bool) -> Result<(), Failure> {
    let path = new_path(path)?;
    let name: &OsStr = if file == "-" { "stdin".as_ref() } else { file };
    let (mut input, length): (Box<dyn Read>, Option<u64>) = if file == "-" {
        // A regular file redirected in (`< FILE`) has a length, from where stdin stands in it;
        // a pipe or a terminal has not. The duplicate shares stdin's position.
        let regular = io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map(File::from)
            .ok()
            .and_then(|mut f| {
                let meta = f.metadata().ok().filter(std::fs::Metadata::is_file)?;
                let at = f.stream_position().ok()?;
                Some((f, meta.len().saturating_sub(at)))
            });
        match regular {
            Some((f, length)) => (Box::new(f), Some(length)),
            None => (Box::new(io::stdin()), None),
        }
    } else {
        let opened = File::open(file).map_err(|e| io_error(file, e))?;
        let length = opened.metadata().map_err(|e| io_error(file, e))?.len();
        (Box::new(opened), Some(length))
    };
    let mut session = connect(host)?;
    let arena = session.welcome().arena_size;
    // A full arena: how much was asked of how much.
    let full = |asked: u64| {
        move |e: ChildError| match e {
            ChildError::Failed(DataPlaneError::ArenaExhausted) => (
                Exit::Temporary,
                format!(
                    "{}: the host's arena is full: no room for {asked} bytes of its {arena} \
                     within the host's allocation wait (its blobs and the writes in progress \
                     hold the rest: `dataplane arena` shows them)",
                    shown(path.as_ref())
                ),
            ),
            other => host.failed(other),
        }
    };
    let revision = match length {
        Some(length) => session
            .try_write(path, length, no_replace, |payload| {
                input.read_exact(payload)
            })
            .map_err(full(length))?
            .map_err(|e| io_error(name, e))?,
        None => {
            // At most one byte more than the arena: enough to know it can never fit.
            let mut bytes = Vec::new();
            input
                .by_ref()
                .take(arena.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(|e| io_error(name, e))?;
            if bytes.len() as u64 > arena {
                let error = DataPlaneError::BlobTooLarge {
                    length: bytes.len() as u64,
                    arena,
                };
                return Err((
                    status(&error),
                    format!(
                        "{path}: stdin holds more than the host's arena of {arena} bytes: it \
                         can never fit there (read stopped at {} bytes)",
                        bytes.len()
                    ),
                ));
            }
            session
                .try_write(path, bytes.len() as u64, no_replace, |payload| {
                    payload.copy_from_slice(&bytes);
                    Ok::<(), io::Error>(())
                })
                .map_err(full(bytes.len() as u64))?
                .map_err(|e| io_error(name, e))?
        }
    };
    session.close().map_err(|e| host.failed(e))?;
    dataplane_cli::outln!("{}: published at {revision}", shown(path.as_ref()));
    Ok(())
}

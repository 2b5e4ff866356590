//! `dataplane-node`: runs a directory node or a host node.
//!
//! It logs to stderr through `tracing` (filtered by `RUST_LOG`, `info` by default), and ends
//! every failure with one plain line, `dataplane-node: MESSAGE`, and a status from the table
//! the three binaries share ([`dataplane_cli::Exit`]).

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use dataplane_cli::Exit;
use dataplane_core::conns::DIRECTORY_CANDIDATES_MAX;
use dataplane_core::limits::MEMBERS_MAX;
use dataplane_core::path::DataPath;
use dataplane_core::time::Duration;
use dataplane_io::dirnode::{DirectoryOptions, run_directory};
use dataplane_io::hostnode::{HostOptions, run_host};
use dataplane_io::net::ClusterKey;
use dataplane_io::replnode::{ReplicaOptions, run_replica};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

const AFTER_HELP: &str = "\
Logs go to stderr, one line per event, filtered by RUST_LOG (default `info`; e.g.
RUST_LOG=debug, or RUST_LOG=info,dataplane_io::net=debug). A node that stops ends with one
plain line, `dataplane-node: MESSAGE`, whatever RUST_LOG says.";

const DIRECTORY_ABOUT: &str = "\
The authoritative namespace directory; its durable log and membership live in DIR.

A failed write or fsync stops it (exit 70); restart it to recover from the log (a full or
read-only file system must be mended first: the message says which). On start it cuts a torn
tail (bytes written after the last sync) off the log and logs it. It refuses to start, changing
no file, if the log is damaged where it had been synced, missing or emptied, from another data
directory or of another format version (exit 65), or if another process has DIR open (exit
75).

With --replica-id and --replicas it is one replica of a replicated directory (Raft): the
replicas listen for one another at the --replicas addresses, only the leader serves hosts (give
hosts every replica's --listen address: --directory A,B,C), and a reply leaves once a majority
has its change on disk. Losing a minority of the replicas, disks included, loses nothing
acknowledged; a replica whose data directory is gone starts empty and catches up.";

const HOST_ABOUT: &str = "\
A host node: the namespace proxy, the host machine, the shared arena and the Unix socket
children attach to.

The socket is made with mode 0600 and the capability children must present is written to
SOCKET.cap (0600), whatever the umask; a child gets the arena only once it presented it. The
host holds SOCKET.lock while it runs: a second host on the same socket exits with status 75 and
changes nothing. The host's --listen address is its identity at the directory (keep it across
restarts).

A replicated directory has one address per replica, and only its leader serves hosts: give
the host every replica's address, --directory A,B,C. It tries them in turn until one welcomes
it, and after losing the directory it tries the next ones, so it follows the leader across
failovers. A replica that does not lead names the leader, and the host goes there next (one
address it was not given is remembered that way).";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "dataplane-node",
    version = dataplane_cli::VERSION,
    about = "dataplane-node: runs one node of the dataplane",
    after_help = format!("{AFTER_HELP}\n\n{}", dataplane_cli::exit_table()),
    subcommand_required = true,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Run the namespace directory.
    #[command(long_about = DIRECTORY_ABOUT)]
    Directory(DirectoryArgs),
    /// Run a host node.
    #[command(long_about = HOST_ABOUT)]
    Host(HostArgs),
    /// Ask a directory replica (through its control socket, DIR/control.sock) about its
    /// group, or change the group's voters.
    Replicas(ReplicasArgs),
}

#[derive(Debug, Args)]
struct ReplicasArgs {
    /// The data directory of a replica running on this machine.
    #[arg(long, env = "DATAPLANE_DATA_DIR", value_name = "DIR")]
    data_dir: PathBuf,
    #[command(subcommand)]
    command: ReplicasCommand,
}

#[derive(Debug, Subcommand)]
enum ReplicasCommand {
    /// Print the replica's term, the leader it knows, the voters and their addresses.
    Status,
    /// Change the voters (ask the serving replica): the replicas to add must run already,
    /// started empty with `--join`; the change goes through joint consensus. Prints the index
    /// of the change's entry; `status` shows when it is applied.
    Change {
        /// A replica to add, as ID=HOST:PORT (where it listens for the others; a name must
        /// resolve here); repeatable.
        #[arg(long, value_name = "ID=HOST:PORT", value_parser = parse_replica)]
        add: Vec<(u64, String)>,
        /// A replica to remove; repeatable.
        #[arg(long, value_name = "ID")]
        remove: Vec<u64>,
        /// Make a change that leaves an even number of voters, or fewer than three (a group
        /// that survives no more failures than a smaller one, or none).
        #[arg(long)]
        force: bool,
    },
    /// Hand the leadership to voter ID (ask the serving replica): it must hold the leader's
    /// whole log. The leader stops serving at once and ID campaigns; `status` shows the new
    /// leader. If ID does not win within an election timeout, the old leader steps down and
    /// the group elects one.
    TransferLeader {
        /// The voter to lead next.
        #[arg(value_name = "ID")]
        to: u64,
    },
}

/// Options both roles have.
#[derive(Debug, Args)]
struct Common {
    /// A secret shared by the cluster (at least 16 bytes; e.g. `head -c 32 /dev/urandom`),
    /// given to every node: nodes then admit only hosts and clients that prove they know it (a
    /// challenge-response over fresh nonces; the key never travels). It keeps out whoever does
    /// not know it; traffic is not encrypted. A host whose key the directory refuses exits with
    /// status 78.
    #[arg(long, env = "DATAPLANE_CLUSTER_KEY_FILE", value_name = "FILE")]
    cluster_key_file: Option<PathBuf>,
    /// Serve metrics in the Prometheus text format at http://ADDR/metrics (host:port).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
}

#[derive(Debug, Args)]
struct DirectoryArgs {
    /// Where hosts connect (host:port).
    #[arg(long, value_name = "ADDR", value_parser = host_port)]
    listen: String,
    /// The data directory: the durable log and the membership table.
    #[arg(long, env = "DATAPLANE_DATA_DIR", value_name = "DIR")]
    data_dir: PathBuf,
    /// The directory's retry tick, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    retry_ms: u64,
    /// Cut a damaged log at its first bad byte, or start a missing or emptied log empty after
    /// its snapshot, instead of refusing; the cut bytes are kept in DIR/log/log-N.cut-OFFSET.
    /// Acknowledged records after the damage are lost.
    #[arg(long)]
    repair_log: bool,
    /// The most hosts (listen addresses) the membership keeps, up to 4096. Past it, a new
    /// host makes room by forgetting the longest-known host that has been away for longer
    /// than --forget-hosts-away-for and that nothing in the namespace names (no blob source,
    /// reservation or pending retirement on it); if there is none it is refused, and tries
    /// again. A forgotten host's node id is never handed out again; if it comes back, its old
    /// process stops and a new one joins as a new member.
    #[arg(long, value_name = "N", default_value_t = MEMBERS_MAX,
          value_parser = members_max)]
    members_max: usize,
    /// How long a host must have been away (its connection closed, or not seen since this
    /// directory started) before a full membership may forget it, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(1..))]
    forget_hosts_away_for: u64,
    /// How long a host's connection may carry nothing before the directory lets go of it, in
    /// seconds (hosts ping at least every quarter of their --directory-silence-ms, at most
    /// every 2.5 s, so this stays above 10 s's worth of their pings by default). A stopped
    /// host, or one cut off by a partition that drops without closing, is then unreachable
    /// for the namespace's retirements until it connects again.
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(3..=3600))]
    host_silence: u64,
    /// Run as replica N of a replicated directory (one of --replicas).
    #[arg(long, value_name = "N", requires = "replicas",
          value_parser = clap::value_parser!(u64).range(1..))]
    replica_id: Option<u64>,
    /// Every replica of the group as ID=HOST:PORT, comma-separated (e.g.
    /// 1=10.0.0.1:7100,2=10.0.0.2:7100,3=10.0.0.3:7100): where each listens for the others.
    /// Give every replica the same list.
    #[arg(long, value_name = "LIST", requires = "replica_id", value_delimiter = ',',
          value_parser = parse_replica)]
    replicas: Vec<(u64, String)>,
    /// This replica lost its data directory (or it was replaced) while the group went on: it
    /// rejoins, neither voting nor campaigning until it holds everything the leader had
    /// committed when it first heard it. Never for a new group (nobody would be elected).
    #[arg(long, requires = "replica_id")]
    join: bool,
    /// Take a snapshot of the directory every N applied entries and compact the log behind
    /// it (keeping min(N/2, 5000) entries for followers a little behind); a follower that
    /// lags further is sent the snapshot.
    #[arg(long, value_name = "N", default_value_t = 10_000, requires = "replica_id",
          value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every: u64,
    #[command(flatten)]
    common: Common,
}

/// `--members-max`: 1 to [`MEMBERS_MAX`].
fn members_max(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=MEMBERS_MAX).contains(&n) => Ok(n),
        _ => Err(format!("not a number from 1 to {MEMBERS_MAX}")),
    }
}

/// One `ID=HOST:PORT` of `--replicas` (the list is comma-separated: `value_delimiter`).
fn parse_replica(s: &str) -> Result<(u64, String), String> {
    let (id, address) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not ID=HOST:PORT"))?;
    let id: u64 = id
        .parse()
        .map_err(|_| format!("{id:?} is not a replica id (1, 2, ...)"))?;
    if id == 0 || host_port(address).is_err() {
        return Err(format!("{s:?} is not ID=HOST:PORT with an id from 1"));
    }
    Ok((id, address.to_owned()))
}

#[derive(Debug, Args)]
struct HostArgs {
    /// The directory node (host:port), or every replica of a replicated directory,
    /// comma-separated (host:port,host:port,...): they are tried in turn, and where a replica
    /// names the leader, until the one that serves welcomes this host.
    #[arg(long, env = "DATAPLANE_DIRECTORY", value_name = "ADDR[,ADDR...]",
          value_parser = directories)]
    directory: Directories,
    /// Where other hosts connect (host:port); also this host's identity at the directory.
    #[arg(long, value_name = "ADDR", value_parser = host_port)]
    listen: String,
    /// The Unix socket children attach to (the one `dataplane --socket` names).
    #[arg(long, env = "DATAPLANE_SOCKET", value_name = "PATH")]
    socket: PathBuf,
    /// The shared arena's size in bytes; K, M and G suffixes allowed.
    #[arg(long, value_name = "N", value_parser = arena_size)]
    arena_size: u64,
    /// Back the arena with this file instead of an anonymous memfd.
    #[arg(long, value_name = "PATH")]
    arena_file: Option<PathBuf>,
    /// A prefix children may read and write (repeatable; default /data and /runs).
    #[arg(long, value_name = "PREFIX", value_parser = data_path)]
    allow: Vec<DataPath>,
    /// The proxy's request deadline, in seconds.
    #[arg(long, value_name = "N", default_value_t = 80,
          value_parser = clap::value_parser!(u64).range(1..))]
    deadline_secs: u64,
    /// How long a child's read (get, stat) waits while no directory is reachable before it
    /// fails with "no directory was reachable", in seconds (a write waits for
    /// --deadline-secs: a directory that comes back completes it). At or above
    /// --deadline-secs, reads wait for the deadline too.
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    read_wait_secs: u64,
    /// How long the directory (or another host) may answer nothing before this host gives
    /// the connection up, in milliseconds (200 to 10000; it pings every quarter of it). A
    /// stopped directory or replica leader, or a partition that drops without closing, is
    /// then left within this, and with several --directory addresses the next one is tried
    /// (the silent one is skipped for four times this).
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(200..=10_000))]
    directory_silence_ms: u64,
    /// Most child sessions served at once (1 to 16384): one more child is refused ("the node
    /// admits no more connections"). Each is an open file of this process: raise its limit
    /// (`ulimit -n`) above a few thousand.
    #[arg(long, value_name = "N", env = "DATAPLANE_SESSIONS_MAX", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=16_384))]
    sessions_max: u64,
    /// How long a child has to seal a write once it was granted, in seconds: a write still
    /// unsealed then (a stopped child) is aborted, the child told, and its arena space freed.
    #[arg(long, value_name = "SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..))]
    write_deadline_secs: u64,
    /// How long an open may wait for arena space, in seconds: one still waiting then fails
    /// "the host's arena is full" (exit 75 for the client).
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    allocation_wait_secs: u64,
    /// Also let GROUP (a name or a number) attach: the socket becomes 0660 and the capability
    /// file 0640, both of that group.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Let children publish the files under DIR as file blobs (`dataplane publish PATH FILE`,
    /// FILE relative to DIR); the table of file blobs is kept in DIR too.
    #[arg(long, value_name = "DIR")]
    files: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

/// A size with an optional K, M or G suffix.
/// `--arena-size`: a size above 0.
fn arena_size(text: &str) -> Result<u64, String> {
    match size(text)? {
        0 => Err("the arena must have room for a blob: give a size above 0".to_owned()),
        n => Ok(n),
    }
}

/// A `host:port` this node can listen at or connect to: a host and a port number (the host
/// may be a name, looked up later).
fn host_port(text: &str) -> Result<String, String> {
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(text.to_owned())
        }
        _ => Err(format!("{text:?} is not HOST:PORT (e.g. 127.0.0.1:7800)")),
    }
}

fn size(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let n: u64 = digits.parse().map_err(|_| "not a size".to_owned())?;
    let scale = match unit {
        "" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        _ => return Err("the unit must be K, M or G".to_owned()),
    };
    n.checked_mul(scale).ok_or_else(|| "too large".to_owned())
}

/// The addresses of `--directory`, in the order given.
#[derive(Clone, Debug)]
struct Directories(Vec<String>);

/// A comma-separated list of 1 to [`DIRECTORY_CANDIDATES_MAX`] directory addresses.
fn directories(text: &str) -> Result<Directories, String> {
    let addresses: Vec<String> = text.split(',').map(|a| a.trim().to_owned()).collect();
    if addresses.iter().any(String::is_empty) {
        return Err("an empty address (the list is host:port[,host:port...])".to_owned());
    }
    for address in &addresses {
        host_port(address)?;
    }
    if addresses.len() > DIRECTORY_CANDIDATES_MAX {
        return Err(format!(
            "{} addresses: at most {DIRECTORY_CANDIDATES_MAX}",
            addresses.len()
        ));
    }
    Ok(Directories(addresses))
}

fn data_path(text: &str) -> Result<DataPath, String> {
    DataPath::new(text).map_err(|e| e.to_string())
}

/// A failure: its exit status and its one-line message.
type Failure = (Exit, String);

fn main() -> ExitCode {
    let cli: Cli = dataplane_cli::parse("dataplane-node");
    if let Err(message) = init_logs() {
        return fail((Exit::Config, message));
    }
    // Before any thread starts: chunk buffers stay in the heap (see `alloc`).
    dataplane_io::alloc::tune_allocator();
    match run(cli.role) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(failure),
    }
}

fn fail((code, message): Failure) -> ExitCode {
    eprintln!("dataplane-node: {message}");
    ExitCode::from(code)
}

/// Logs to stderr, filtered by `RUST_LOG` (`info` when unset), colored only on a terminal.
fn init_logs() -> Result<(), String> {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env()
        .map_err(|e| format!("RUST_LOG: {e}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(|e| format!("logs: {e}"))
}

/// The key of `--cluster-key-file`, if given (exit 78 if the file is unusable).
fn cluster_key(path: Option<&Path>) -> Result<Option<ClusterKey>, Failure> {
    path.map(|path| {
        dataplane_io::net::read_cluster_key(path).map_err(|e| (Exit::Config, e.to_string()))
    })
    .transpose()
}

fn run(role: Role) -> Result<(), Failure> {
    match role {
        Role::Replicas(args) => replicas(args),
        Role::Directory(args) => {
            let options = DirectoryOptions {
                listen: args.listen,
                data_dir: args.data_dir,
                retry_period: Duration::from_millis(args.retry_ms),
                cluster_key: cluster_key(args.common.cluster_key_file.as_deref())?,
                repair_log: args.repair_log,
                metrics_listen: args.common.metrics_listen,
                members_max: args.members_max,
                forget_hosts_away_for: Duration::from_secs(args.forget_hosts_away_for),
                host_silence: Duration::from_secs(args.host_silence),
            };
            match args.replica_id {
                None => run_directory(&options).map_err(|e| (e.exit_code(), e.to_string())),
                Some(id) => {
                    let options = ReplicaOptions {
                        directory: options,
                        id,
                        replicas: args.replicas,
                        join: args.join,
                        snapshot_every: args.snapshot_every,
                    };
                    options
                        .replica_config()
                        .map_err(|e| (Exit::Usage, format!("--replicas: {e}")))?;
                    run_replica(&options).map_err(|e| (e.exit_code(), e.to_string()))
                }
            }
        }
        Role::Host(args) => {
            let allow = if args.allow.is_empty() {
                vec![
                    DataPath::new("/data").expect("valid"),
                    DataPath::new("/runs").expect("valid"),
                ]
            } else {
                args.allow
            };
            let socket_group = args
                .socket_group
                .map(|g| {
                    dataplane_io::sys::group_id(&g)
                        .map_err(|e| (Exit::Usage, format!("--socket-group {g}: {e} (see --help)")))
                })
                .transpose()?;
            let options = HostOptions {
                directories: args.directory.0,
                listen: args.listen,
                socket: args.socket,
                socket_group,
                arena_size: args.arena_size,
                arena_file: args.arena_file,
                allow,
                deadline: Duration::from_secs(args.deadline_secs),
                absent_read_wait: Duration::from_secs(args.read_wait_secs),
                silence: Duration::from_millis(args.directory_silence_ms),
                cluster_key: cluster_key(args.common.cluster_key_file.as_deref())?,
                metrics_listen: args.common.metrics_listen,
                files: args.files,
                sessions_max: args.sessions_max as usize,
                write_deadline: Duration::from_secs(args.write_deadline_secs),
                allocation_wait: Duration::from_secs(args.allocation_wait_secs),
            };
            run_host(options).map_err(|e| (e.exit_code(), e.to_string()))
        }
    }
}

/// `dataplane-node replicas`: one request on a replica's control socket.
fn replicas(args: ReplicasArgs) -> Result<(), Failure> {
    use dataplane_io::replcontrol::{ReplicaControl, ReplicaControlError};
    let data_dir = args.data_dir.clone();
    let failed = |e: ReplicaControlError| {
        let code = match &e {
            ReplicaControlError::Connect(..) => Exit::Unavailable,
            ReplicaControlError::NotLeader(_) => Exit::Temporary,
            ReplicaControlError::Refused(_) => Exit::Invalid,
            _ => Exit::Software,
        };
        let mut message = e.to_string();
        // Where the leader is: its address for the other replicas, as this one knows it (its
        // control socket is on its own machine, in its data directory).
        if let ReplicaControlError::NotLeader(Some(leader)) = &e
            && let Some(address) = ReplicaControl::connect(&data_dir)
                .and_then(|mut c| c.status())
                .ok()
                .and_then(|s| s.addresses.into_iter().find(|(id, _)| id == leader))
                .map(|(_, address)| address)
        {
            message.push_str(&format!(
                " (replica {leader} listens for the other replicas at {address}; on its machine: \
                 dataplane-node replicas --data-dir ITS_DATA_DIR ...)"
            ));
        }
        (code, message)
    };
    let mut control = ReplicaControl::connect(&args.data_dir).map_err(failed)?;
    match args.command {
        ReplicasCommand::Status => {
            let s = control.status().map_err(failed)?;
            let voters: Vec<String> = s.voters.iter().map(u64::to_string).collect();
            dataplane_cli::outln!(
                "replica={} term={} serving={} leader={} voters={} joint={} applied={} joining={}",
                s.id,
                s.term,
                s.serving,
                s.leader.map_or("none".to_owned(), |l| l.to_string()),
                voters.join(","),
                s.joint,
                s.applied,
                s.joining
            );
            for (id, address) in s.addresses {
                dataplane_cli::outln!("peer {id}={address}");
            }
        }
        ReplicasCommand::Change { add, remove, force } => {
            // What the group would be: a change that leaves it fragile needs --force.
            let voters = control.status().map_err(failed)?.voters;
            let mut after: std::collections::BTreeSet<u64> = voters.iter().copied().collect();
            after.extend(add.iter().map(|(id, _)| *id));
            for id in &remove {
                after.remove(id);
            }
            let n = after.len();
            let fragile = if n < 3 {
                Some(format!("{n} voter(s) survive no failure"))
            } else if n.is_multiple_of(2) {
                Some(format!(
                    "{n} voters survive no more failures than {} would ({})",
                    n - 1,
                    (n - 1) / 2
                ))
            } else {
                None
            };
            if let Some(why) = fragile {
                if !force {
                    return Err((
                        Exit::Usage,
                        format!(
                            "the change leaves the group fragile: {why}; give --force to make it anyway"
                        ),
                    ));
                }
                eprintln!("dataplane-node: warning: {why} (--force)");
            }
            // The replica checks only an address's form (it never waits on DNS in its loop):
            // a name that does not resolve here (a typo, a record not made yet) would become a
            // voter nobody can reach, and a group of one would then need it for every commit.
            for (id, address) in &add {
                match std::net::ToSocketAddrs::to_socket_addrs(address.as_str()) {
                    Ok(found) if found.len() > 0 => {}
                    Ok(_) => {
                        return Err((
                            Exit::Invalid,
                            format!("replica {id}'s address {address} has no address"),
                        ));
                    }
                    Err(e) => {
                        return Err((
                            Exit::Invalid,
                            format!("replica {id}'s address {address} does not resolve: {e}"),
                        ));
                    }
                }
            }
            let index = control.change(add, remove).map_err(failed)?;
            dataplane_cli::outln!("proposed at index {index}");
        }
        ReplicasCommand::TransferLeader { to } => {
            control.transfer_leader(to).map_err(failed)?;
            dataplane_cli::outln!("handing the leadership to replica {to}");
        }
    }
    Ok(())
}

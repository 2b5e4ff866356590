//! `dataplane-node`: runs a directory node or a host node.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dataplane_core::path::DataPath;
use dataplane_core::time::Duration;
use dataplane_io::dirnode::{DirectoryOptions, run_directory};
use dataplane_io::hostnode::{HostOptions, run_host};
use dataplane_io::net::ClusterKey;

const USAGE: &str = "\
dataplane-node: runs one node of the dataplane

USAGE:
    dataplane-node directory --listen ADDR --data-dir DIR [--retry-ms N]
                             [--cluster-key-file FILE] [--repair-log]
    dataplane-node host --directory ADDR --listen ADDR --socket PATH --arena-size N
                        [--arena-file PATH] [--allow PREFIX]... [--deadline-secs N]
                        [--cluster-key-file FILE] [--socket-group GROUP]

directory:  the authoritative namespace directory; its durable log and membership live in DIR.
            A failed fsync stops it (exit 70); restart it to recover from the log. On start it
            cuts a torn tail (bytes written after the last sync) off the log and says so on
            stderr. It refuses to start, changing no file, if the log is damaged where it had
            been synced, missing or emptied, from another data directory or of another format
            version (exit 65), or if another process has DIR open (exit 75).
--repair-log
            (directory) cut a damaged log at its first bad byte, or start a missing or emptied
            log empty after its snapshot, instead of refusing; the cut bytes are kept in
            DIR/log/log-<N>.cut-<OFFSET>. Acknowledged records after the damage are lost.
host:       a host node: the namespace proxy, the host machine, the shared arena (N bytes; K, M
            and G suffixes allowed) and the Unix socket children attach to. The socket is made
            with mode 0600 and the capability children must present is written to PATH.cap
            (0600), whatever the umask; a child gets the arena only once it presented it. The
            host holds PATH.lock while it runs: a second host on the same socket exits with
            status 75 and changes nothing. --allow gives a prefix children may read and write
            (repeatable; default /data and /runs). ADDR is host:port; the host's --listen
            address is its identity at the directory (keep it across restarts).
--socket-group GROUP
            (host) also let GROUP (a name or a number) attach: the socket becomes 0660 and the
            capability file 0640, both of that group.
--cluster-key-file FILE
            a secret shared by the cluster (at least 16 bytes; e.g. `head -c 32 /dev/urandom`),
            given to every node: nodes then admit only hosts and clients that prove they know
            it (a challenge-response over fresh nonces; the key never travels). It keeps out
            whoever does not know it; traffic is not encrypted. A host whose key the directory
            refuses exits with status 78.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return if args.is_empty() {
            ExitCode::from(64)
        } else {
            ExitCode::SUCCESS
        };
    }
    // Before any thread starts: chunk buffers stay in the heap (see `alloc`).
    dataplane_io::alloc::tune_allocator();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("dataplane-node: {message}");
            ExitCode::from(code)
        }
    }
}

fn usage(message: impl Into<String>) -> (u8, String) {
    (64, format!("{} (see --help)", message.into()))
}

/// `--name value` pairs after the subcommand.
fn flags(args: &[String]) -> Result<Vec<(String, String)>, (u8, String)> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(name) = flag.strip_prefix("--") else {
            return Err(usage(format!("unexpected argument {flag:?}")));
        };
        let Some(value) = it.next() else {
            return Err(usage(format!("--{name} needs a value")));
        };
        out.push((name.to_owned(), value.clone()));
    }
    Ok(out)
}

fn one(flags: &[(String, String)], name: &str) -> Result<String, (u8, String)> {
    let mut found = flags.iter().filter(|(n, _)| n == name);
    match (found.next(), found.next()) {
        (Some((_, v)), None) => Ok(v.clone()),
        (None, _) => Err(usage(format!("--{name} is required"))),
        (Some(_), Some(_)) => Err(usage(format!("--{name} given twice"))),
    }
}

fn optional(flags: &[(String, String)], name: &str) -> Option<String> {
    flags
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
}

fn size(text: &str) -> Result<u64, (u8, String)> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| usage(format!("bad size {text:?}")))?;
    let scale = match unit {
        "" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        _ => return Err(usage(format!("bad size unit in {text:?}"))),
    };
    n.checked_mul(scale)
        .ok_or_else(|| usage(format!("size {text:?} is too large")))
}

fn number(flags: &[(String, String)], name: &str, default: u64) -> Result<u64, (u8, String)> {
    match optional(flags, name) {
        Some(v) => v
            .parse()
            .map_err(|_| usage(format!("--{name}: not a number: {v:?}"))),
        None => Ok(default),
    }
}

/// The key of `--cluster-key-file`, if given (exit 78 if the file is unusable).
fn cluster_key(flags: &[(String, String)]) -> Result<Option<ClusterKey>, (u8, String)> {
    optional(flags, "cluster-key-file")
        .map(|path| ClusterKey::read(Path::new(&path)).map_err(|e| (78, e.to_string())))
        .transpose()
}

fn check_known(flags: &[(String, String)], known: &[&str]) -> Result<(), (u8, String)> {
    match flags.iter().find(|(n, _)| !known.contains(&n.as_str())) {
        Some((n, _)) => Err(usage(format!("unknown option --{n}"))),
        None => Ok(()),
    }
}

fn run(args: &[String]) -> Result<(), (u8, String)> {
    let (command, rest) = args
        .split_first()
        .ok_or_else(|| usage("a command is required"))?;
    // The one option without a value.
    let repair_log = rest.iter().any(|a| a == "--repair-log");
    let rest: Vec<String> = rest
        .iter()
        .filter(|a| *a != "--repair-log")
        .cloned()
        .collect();
    let flags = flags(&rest)?;
    match command.as_str() {
        "directory" => {
            check_known(
                &flags,
                &["listen", "data-dir", "retry-ms", "cluster-key-file"],
            )?;
            let options = DirectoryOptions {
                listen: one(&flags, "listen")?,
                data_dir: PathBuf::from(one(&flags, "data-dir")?),
                retry_period: Duration::from_millis(number(&flags, "retry-ms", 1000)?.max(1)),
                cluster_key: cluster_key(&flags)?,
                repair_log,
            };
            run_directory(&options).map_err(|e| (e.exit_code(), e.to_string()))
        }
        "host" => {
            if repair_log {
                return Err(usage("--repair-log is an option of the directory"));
            }
            check_known(
                &flags,
                &[
                    "directory",
                    "listen",
                    "socket",
                    "arena-size",
                    "arena-file",
                    "allow",
                    "deadline-secs",
                    "cluster-key-file",
                    "socket-group",
                ],
            )?;
            let mut allow = Vec::new();
            for (name, value) in &flags {
                if name == "allow" {
                    allow.push(
                        DataPath::new(value.as_str())
                            .map_err(|e| usage(format!("--allow {value}: {e:?}")))?,
                    );
                }
            }
            if allow.is_empty() {
                allow = vec![
                    DataPath::new("/data").expect("valid"),
                    DataPath::new("/runs").expect("valid"),
                ];
            }
            let socket_group = optional(&flags, "socket-group")
                .map(|g| {
                    dataplane_io::sys::group_id(&g)
                        .map_err(|e| usage(format!("--socket-group {g}: {e}")))
                })
                .transpose()?;
            let options = HostOptions {
                directory: one(&flags, "directory")?,
                listen: one(&flags, "listen")?,
                socket: PathBuf::from(one(&flags, "socket")?),
                socket_group,
                arena_size: size(&one(&flags, "arena-size")?)?,
                arena_file: optional(&flags, "arena-file").map(PathBuf::from),
                allow,
                deadline: Duration::from_secs(number(&flags, "deadline-secs", 80)?.max(1)),
                cluster_key: cluster_key(&flags)?,
            };
            run_host(options).map_err(|e| (e.exit_code(), e.to_string()))
        }
        other => Err(usage(format!("unknown command {other:?}"))),
    }
}

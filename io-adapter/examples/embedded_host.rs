//! A program that runs dataplane nodes itself instead of starting `dataplane-node`: a directory
//! and a host on threads of this process, and a child session on the host's socket.
//!
//! ```sh
//! cargo run -p dataplane-io --example embedded_host
//! ```
//!
//! `run_directory` and `run_host` run until their node fails, so each gets a thread of its
//! own; the process ends when `main` returns. Before any thread starts, the program calls
//! `tune_allocator` (as `dataplane-node` does): the setting is process-wide, and without it
//! every transfer chunk between hosts costs fresh page faults. The nodes log through
//! `tracing`; this program installs no subscriber, so their events go nowhere (install one,
//! e.g. `tracing-subscriber`, to see them).

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration as StdDuration, Instant};

use dataplane_core::path::DataPath;
use dataplane_core::time::Duration;
use dataplane_io::child::{ChildError, ChildSession};
use dataplane_io::dirnode::{DirectoryOptions, run_directory};
use dataplane_io::hostnode::{HostOptions, run_host};

/// A loopback address whose port was free a moment ago.
fn free_address() -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// Connects to the host's socket, waiting for the host to come up (at most `timeout`).
fn attach(socket: &Path, timeout: StdDuration) -> Result<ChildSession, ChildError> {
    let deadline = Instant::now() + timeout;
    loop {
        match ChildSession::connect(socket) {
            Err(_) if Instant::now() < deadline => std::thread::sleep(StdDuration::from_millis(50)),
            other => return other,
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // First, before any thread: process-wide malloc settings for chunk buffers.
    dataplane_io::alloc::tune_allocator();

    let scratch = tempfile::tempdir()?;
    let directory = DirectoryOptions {
        listen: free_address()?,
        data_dir: scratch.path().join("directory"),
        retry_period: Duration::from_millis(1000),
        cluster_key: None,
        repair_log: false,
        metrics_listen: None,
        members_max: dataplane_core::limits::MEMBERS_MAX,
        forget_hosts_away_for: dataplane_core::conns::FORGET_AWAY_AFTER,
        host_silence: dataplane_core::conns::HOST_SILENCE_DEFAULT,
    };
    let host = HostOptions {
        directories: vec![directory.listen.clone()],
        listen: free_address()?,
        socket: scratch.path().join("host.sock"),
        socket_group: None,
        arena_size: 16 << 20,
        arena_file: None,
        allow: vec![DataPath::new("/data")?],
        deadline: Duration::from_secs(80),
        absent_read_wait: dataplane_core::proxy::DEFAULT_ABSENT_READ_WAIT,
        silence: dataplane_core::conns::SILENCE_DEFAULT,
        cluster_key: None,
        metrics_listen: None,
        files: None,
        sessions_max: dataplane_core::limits::HOST_SESSIONS_MAX,
        write_deadline: dataplane_core::host::DEFAULT_WRITE_DEADLINE,
        allocation_wait: Duration::from_secs(60),
    };
    let socket = host.socket.clone();
    std::thread::spawn(move || {
        if let Err(e) = run_directory(&directory) {
            eprintln!("embedded_host: the directory stopped: {e}");
        }
    });
    // The host waits for the directory by itself.
    std::thread::spawn(move || {
        if let Err(e) = run_host(host) {
            eprintln!("embedded_host: the host stopped: {e}");
        }
    });

    let mut session = attach(&socket, StdDuration::from_secs(20))?;
    let revision = session.put("/data/embedded", b"written by an embedded host")?;
    let view = session.read("/data/embedded")?;
    println!(
        "/data/embedded: published at {revision}, read back {} bytes",
        view.bytes().len()
    );
    drop(view);
    session.close()?;
    Ok(())
}

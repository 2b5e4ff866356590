//! `lease-holder SOCKET PATH LENGTH`: a child process that attaches to a host (through
//! `dataplane_io::child::ChildSession`), opens a write of LENGTH bytes at PATH, fills part of the
//! granted lease, prints `granted LENGTH` on stdout, and then waits — never sealing — until it
//! is killed (or 120 s have passed, so it never outlives a test run for long).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use dataplane_io::child::ChildSession;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("lease-holder: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, path, length] = args.as_slice() else {
        return Err("usage: lease-holder SOCKET PATH LENGTH".into());
    };
    let socket = PathBuf::from(socket);
    let length: u64 = length.parse().map_err(|e| format!("LENGTH: {e}"))?;
    let mut session = ChildSession::connect(&socket).map_err(|e| e.to_string())?;
    let outcome = session
        .try_write(path, length, false, |payload| {
            let half = payload.len() / 2;
            payload[..half].fill(0x5a);
            println!("granted {}", payload.len());
            let _ = std::io::stdout().flush();
            std::thread::sleep(Duration::from_secs(120));
            Err::<(), String>("held for 120 s".to_owned())
        })
        .map_err(|e| e.to_string())?;
    outcome.map(|_| ())
}

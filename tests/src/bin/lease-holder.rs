//! `lease-holder SOCKET PATH LENGTH`: a child process that attaches to a host (the raw child
//! protocol of `dataplane_io::child`), opens a write of LENGTH bytes at PATH, fills part of the
//! granted lease, prints `granted OFFSET LENGTH` on stdout, and then waits — never sealing —
//! until it is killed (or 120 s have passed, so it never outlives a test run for long).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use dataplane_core::blob::{self, BlobAccess, DigestKind, Expected};
use dataplane_core::limits::FRAME_BYTES_MAX;
use dataplane_core::wire::{Capability, ChildEvent, ChildOp, ChildRequest, decode_value};
use dataplane_io::arena::{SharedArena, recv_with_fd};
use dataplane_io::frame::{FrameReader, LENGTH_PREFIX_BYTES, write_frame};
use dataplane_io::hostnode::{ChildWelcome, capability_path};

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
    let cap = fs::read(capability_path(&socket)).map_err(|e| format!("capability: {e}"))?;
    let capability: [u8; 32] = cap.try_into().map_err(|_| "not a capability")?;
    let stream = UnixStream::connect(&socket).map_err(|e| format!("connect: {e}"))?;

    // The welcome comes alone, with the arena's descriptor.
    let mut buf = vec![0u8; 4096];
    let (mut n, fd) = recv_with_fd(&stream, &mut buf).map_err(|e| format!("welcome: {e}"))?;
    let fd = fd.ok_or("the welcome carried no arena")?;
    while n < LENGTH_PREFIX_BYTES {
        let got = (&stream).read(&mut buf[n..]).map_err(|e| e.to_string())?;
        if got == 0 {
            return Err("closed at welcome".into());
        }
        n += got;
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let total = LENGTH_PREFIX_BYTES + len;
    if total > buf.len() {
        return Err("oversized welcome".into());
    }
    if n < total {
        (&stream)
            .read_exact(&mut buf[n..total])
            .map_err(|e| e.to_string())?;
    }
    let welcome: ChildWelcome = decode_value(&buf[LENGTH_PREFIX_BYTES..total], FRAME_BYTES_MAX)
        .map_err(|e| format!("welcome: {e}"))?;
    let mut arena =
        SharedArena::from_fd(fd, welcome.arena_size).map_err(|e| format!("arena: {e}"))?;
    let mut reader = FrameReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut writer = &stream;
    let next = |reader: &mut FrameReader<UnixStream>| -> Result<ChildEvent, String> {
        reader
            .read_frame::<ChildEvent>()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the host closed the connection".to_owned())
    };

    write_frame(
        &mut writer,
        &ChildRequest::Attach {
            arena_generation: welcome.arena_generation,
            capability: Capability(capability),
        },
    )
    .map_err(|e| e.to_string())?;
    match next(&mut reader)? {
        ChildEvent::Attached { .. } => {}
        other => return Err(format!("attach: {other:?}")),
    }
    let op = ChildOp(1);
    write_frame(
        &mut writer,
        &ChildRequest::OpenWrite {
            op,
            path: path.clone(),
            length,
            digest: DigestKind::Blake3,
            exclusive: false,
        },
    )
    .map_err(|e| e.to_string())?;
    let lease = match next(&mut reader)? {
        ChildEvent::WriteGranted { lease, .. } => lease,
        other => return Err(format!("open write: {other:?}")),
    };
    let expected = Expected {
        offset: lease.offset,
        length: lease.length,
        generation: lease.generation,
        access: BlobAccess::Writable,
        digest_kind: lease.digest,
    };
    let payload = blob::payload_mut(arena.as_mut_slice(), &expected)
        .map_err(|e| format!("the granted lease is unusable: {e:?}"))?;
    let touched = payload.len().min(1 << 20);
    payload[..touched].fill(0xA5);
    let mut out = std::io::stdout().lock();
    writeln!(out, "granted {} {}", lease.offset, lease.length).map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    drop(out);
    // Hold the lease (never seal) until killed.
    std::thread::sleep(Duration::from_secs(120));
    Err("not killed within 120 s".into())
}

//! The shared arena: mapping, descriptor passing, and a real second process.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dataplane_io::arena::{ArenaTooSmall, SharedArena, recv_with_fd, send_with_fd};

/// A fresh directory under the system temp dir, removed on drop.
fn temp_dir(label: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("dataplane-io-{label}-"))
        .tempdir()
        .unwrap()
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

/// Whether the descriptor has `FD_CLOEXEC` (read from `/proc/self/fdinfo`, no `unsafe`).
fn is_cloexec(fd: &OwnedFd) -> bool {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .expect("a flags line");
    let flags = u32::from_str_radix(flags.trim(), 8).unwrap();
    flags & 0o2000000 != 0 // O_CLOEXEC
}

#[test]
fn an_arena_is_shared_through_a_passed_descriptor() {
    const SIZE: u64 = 1 << 20;
    let mut host = SharedArena::create("dataplane-test", SIZE).unwrap();
    assert_eq!(host.size(), SIZE);
    assert_eq!(host.as_slice().len(), SIZE as usize);
    assert!(
        host.as_slice().iter().all(|&b| b == 0),
        "a new arena is zeroed"
    );
    host.as_mut_slice()[..5].copy_from_slice(b"hello");
    host.as_mut_slice()[SIZE as usize - 1] = 0xee;

    let (a, b) = UnixStream::pair().unwrap();
    send_with_fd(&a, &SIZE.to_le_bytes(), host.as_fd()).unwrap();
    let mut buf = [0u8; 64];
    let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
    assert_eq!(n, 8);
    let size = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let fd = fd.expect("the descriptor arrived");
    assert!(is_cloexec(&fd));
    assert_ne!(fd.as_raw_fd(), host.as_fd().as_raw_fd());

    let mut child = SharedArena::from_fd(fd, size).unwrap();
    assert_eq!(&child.as_slice()[..5], b"hello");
    assert_eq!(child.as_slice()[SIZE as usize - 1], 0xee);
    child.as_mut_slice()[100..105].copy_from_slice(b"world");
    assert_eq!(&host.as_slice()[100..105], b"world");
    host.as_mut_slice()[200] = 42;
    assert_eq!(child.as_slice()[200], 42);
}

#[test]
fn bytes_travel_without_a_descriptor_too() {
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(b"plain").unwrap();
    let mut buf = [0u8; 16];
    let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"plain");
    assert!(fd.is_none());

    // Then a message with a descriptor, then none again.
    let arena = SharedArena::create("x", 4096).unwrap();
    send_with_fd(&a, b"with", arena.as_fd()).unwrap();
    let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"with");
    assert!(fd.is_some());
    a.write_all(b"after").unwrap();
    let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"after");
    assert!(fd.is_none());

    // End of stream.
    drop(a);
    let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
    assert_eq!(n, 0);
    assert!(fd.is_none());
}

#[test]
fn a_long_message_is_sent_whole() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let arena = SharedArena::create("x", 4096).unwrap();
    let message: Vec<u8> = (0..1 << 20).map(pattern).collect();
    let expected = message.clone();
    let writer = std::thread::spawn(move || {
        send_with_fd(&a, &message, arena.as_fd()).unwrap();
    });
    let mut buf = vec![0u8; 4096];
    let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
    assert!(fd.is_some());
    let mut got = buf[..n].to_vec();
    b.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert_eq!(got, expected);
}

#[test]
fn empty_messages_and_buffers_are_refused() {
    let (a, b) = UnixStream::pair().unwrap();
    let arena = SharedArena::create("x", 4096).unwrap();
    let err = send_with_fd(&a, b"", arena.as_fd()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let err = recv_with_fd(&b, &mut []).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn a_descriptor_smaller_than_asked_is_refused() {
    let arena = SharedArena::create("small", 4096).unwrap();
    let fd = arena.as_fd().try_clone_to_owned().unwrap();
    let err = SharedArena::from_fd(fd, 8192).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let small = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<ArenaTooSmall>())
        .expect("an ArenaTooSmall inside");
    assert_eq!(
        *small,
        ArenaTooSmall {
            wanted: 8192,
            actual: 4096
        }
    );
    // A smaller view than the file is fine.
    let fd = arena.as_fd().try_clone_to_owned().unwrap();
    assert_eq!(SharedArena::from_fd(fd, 100).unwrap().as_slice().len(), 100);
}

#[test]
fn bad_sizes_names_and_descriptors_are_refused() {
    assert_eq!(
        SharedArena::create("x", 0).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        SharedArena::create("a\0b", 4096).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    let (a, _b) = UnixStream::pair().unwrap();
    let err = SharedArena::from_fd(OwnedFd::from(a), 4096).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn a_memfd_arena_cannot_be_resized_by_its_receiver() {
    let arena = SharedArena::create("sealed", 8192).unwrap();
    let file = File::from(arena.as_fd().try_clone_to_owned().unwrap());
    assert!(file.set_len(0).is_err(), "shrinking must be sealed off");
    assert!(file.set_len(1 << 20).is_err(), "growing must be sealed off");
    assert_eq!(file.metadata().unwrap().len(), 8192);
}

#[test]
fn a_file_backed_arena() {
    let dir = temp_dir("file-arena");
    let path = dir.path().join("arena");
    let mut arena = SharedArena::create_file(&path, 3 * 4096 + 5).unwrap();
    assert_eq!(arena.size(), 3 * 4096 + 5);
    arena.as_mut_slice()[..4].copy_from_slice(b"file");
    arena.as_mut_slice()[3 * 4096 + 4] = 7;
    // The file holds what the mapping holds.
    let on_disk = fs::read(&path).unwrap();
    assert_eq!(on_disk.len(), 3 * 4096 + 5);
    assert_eq!(&on_disk[..4], b"file");
    assert_eq!(on_disk[3 * 4096 + 4], 7);
    // Another mapping of the same file shares the memory.
    let other = File::options().read(true).write(true).open(&path).unwrap();
    let mut second = SharedArena::from_fd(other.into(), arena.size()).unwrap();
    second.as_mut_slice()[10] = 99;
    assert_eq!(arena.as_slice()[10], 99);
    // Re-creating truncates: a fresh arena is zeroed.
    drop((arena, second));
    let again = SharedArena::create_file(&path, 4096).unwrap();
    assert!(again.as_slice().iter().all(|&b| b == 0));
}

const CHILD_SOCKET_ENV: &str = "DATAPLANE_IO_TEST_ARENA_CHILD_SOCKET";
const CHILD_OFFSET: usize = 4096;
const CHILD_BYTES: usize = 1 << 16;

/// The child side of [`a_child_process_maps_the_arena`], run in a second process.
fn child_main(socket: &Path) {
    let sock = UnixStream::connect(socket).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 8];
    let (n, fd) = recv_with_fd(&sock, &mut buf).unwrap();
    assert_eq!(n, 8);
    let size = u64::from_le_bytes(buf);
    let mut arena = SharedArena::from_fd(fd.expect("an arena descriptor"), size).unwrap();
    assert_eq!(&arena.as_slice()[..9], b"from host");
    for (i, b) in arena.as_mut_slice()[CHILD_OFFSET..CHILD_OFFSET + CHILD_BYTES]
        .iter_mut()
        .enumerate()
    {
        *b = pattern(i);
    }
    (&sock).write_all(b"k").unwrap();
}

#[test]
fn a_child_process_maps_the_arena() {
    if let Some(socket) = std::env::var_os(CHILD_SOCKET_ENV) {
        child_main(Path::new(&socket));
        return;
    }
    let dir = temp_dir("child-arena");
    let socket = dir.path().join("sock");
    let listener = UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();

    let mut arena = SharedArena::create("dataplane-child-test", 1 << 20).unwrap();
    arena.as_mut_slice()[..9].copy_from_slice(b"from host");

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_child_process_maps_the_arena",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SOCKET_ENV, &socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // Accept the child's connection, giving up if it dies or takes too long.
    let deadline = Instant::now() + Duration::from_secs(60);
    let conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().unwrap() {
                    let out = child.wait_with_output().unwrap();
                    panic!(
                        "child exited ({status}) before connecting:\n{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("the child never connected");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    send_with_fd(&conn, &arena.size().to_le_bytes(), arena.as_fd()).unwrap();

    let mut ack = [0u8; 1];
    let acked = (&conn).read_exact(&mut ack);
    let out = child.wait_with_output().unwrap();
    assert!(
        acked.is_ok() && out.status.success(),
        "child failed ({}, ack {acked:?}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&ack, b"k");
    // The child has exited; its writes live on in the memory the host still maps.
    let written = &arena.as_slice()[CHILD_OFFSET..CHILD_OFFSET + CHILD_BYTES];
    assert!(written.iter().enumerate().all(|(i, &b)| b == pattern(i)));
    assert_eq!(&arena.as_slice()[..9], b"from host");
    assert!(
        arena.as_slice()[CHILD_OFFSET + CHILD_BYTES..]
            .iter()
            .all(|&b| b == 0)
    );
}

//! The directory's durable log under damage, with real processes: a directory and a host on
//! loopback, blobs published with the `dataplane` CLI, the directory killed with SIGKILL, and
//! then its data directory damaged by hand.
//!
//! * Bytes flipped in the middle of the log: the directory refuses to start, names the file and
//!   the offset, exits 65 and changes no file; with `--repair-log` it starts, cuts the log
//!   there, says so, keeps the cut bytes in a file, and serves the puts before the damage.
//! * The log deleted or emptied: refused the same way.
//! * A torn tail (garbage, or half a record, written where the records end, inside the log's
//!   preallocated zeros): the directory starts, says what it cut, and every acknowledged put
//!   is still there, bytes and all. Zeros there are the end of the log: nothing is cut.
//! * A second directory process on a data directory in use exits 75 and changes no file.
//! * A repair that cut a boot of the directory and two restarts of a host: the repaired
//!   directory boots and serves above every boot and epoch it had counted, the host (whose
//!   incarnation only the cut records knew) stops with exit 70 and says why instead of waiting
//!   for ever, and restarted it serves.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dataplane_core::error::NamespaceError;
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::log::{LogRecord, append_record};
use dataplane_core::wire::ReplyBody;
use dataplane_io::log::{LogHeader, scan};
use dataplane_tests::raw::RawClient;
use dataplane_tests::{
    DirectoryProc, HostProc, Proc, READY_TIMEOUT, TestDir, binaries, directory_args, free_address,
    pattern, tree, wait_until, write_tree,
};

/// Blobs published before the damage.
const PUTS: u64 = 40;
/// Bytes per blob.
const BLOB: usize = 3_000;
/// `dataplane-node`'s exit status for a data directory recovery refuses.
const REFUSED: i32 = 65;
/// Its exit status for a data directory another process holds.
const LOCKED: i32 = 75;

/// A published blob: its path, its pattern seed, and the revision the CLI reported.
struct Put {
    path: String,
    seed: u64,
    revision: String,
}

fn publish(host: &HostProc) -> Vec<Put> {
    (0..PUTS)
        .map(|seed| {
            let path = format!("/data/ld/p{seed}");
            let put = host.cli_stdin(&["put", &path, "-"], &pattern(seed, BLOB));
            put.expect_code(0, "put");
            let revision = put.revision();
            Put {
                path,
                seed,
                revision,
            }
        })
        .collect()
}

/// Where `put` is at the directory: `Some(revision)`, or `None` if not found.
fn lookup(client: &mut RawClient, put: &Put) -> Option<String> {
    match client.lookup(&put.path).expect("a lookup") {
        ReplyBody::LookedUp(Ok(node)) => Some(node.revision.to_string()),
        ReplyBody::LookedUp(Err(NamespaceError::PathNotFound(_))) => None,
        other => panic!("{}: {other:?}", put.path),
    }
}

/// Runs a directory on `data_dir` that must exit at once; returns its status and output.
fn run_refused(dir: &TestDir, name: &str, data_dir: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = directory_args(&free_address(), data_dir);
    args.extend(extra.iter().map(OsString::from));
    let mut proc = Proc::spawn(
        name,
        &binaries().node,
        args,
        dir.join(&format!("{name}.log")),
    );
    let status = proc.wait_exit(READY_TIMEOUT);
    (status.code().unwrap_or(-1), proc.log_text())
}

/// The number after `label` in `text`.
fn number_after(text: &str, label: &str) -> u64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("{label:?} not in {text:?}"))
        + label.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {label:?} in {text:?}"))
}

/// The one line of `output` (a refused node's) and a check that it is its only line.
fn refusal_line(output: &str) -> &str {
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {output:?}");
    assert!(
        lines[0].starts_with("dataplane-node: directory refuses to start: log: ")
            && lines[0].contains("no file was changed"),
        "{output:?}"
    );
    lines[0]
}

fn log_file(data_dir: &Path) -> PathBuf {
    data_dir.join("log").join("log-0")
}

/// Where the records (and sync marks) of the log file `bytes` end: the preallocated zeros
/// start there.
fn records_end(bytes: &[u8]) -> usize {
    let header = LogHeader::parse(bytes).expect("a log header");
    let scanned = scan(bytes, header.salt);
    assert_eq!(scanned.defect, None, "a log with a defect");
    scanned.valid_len
}

/// Copies the pristine data directory to `dir/name` and returns its path.
fn copy_of(
    dir: &TestDir,
    name: &str,
    pristine: &std::collections::BTreeMap<PathBuf, Vec<u8>>,
) -> PathBuf {
    let data_dir = dir.join(name);
    write_tree(&data_dir, pristine);
    data_dir
}

#[test]
fn a_damaged_log_is_refused_a_torn_tail_is_cut_and_repair_keeps_a_copy() {
    let dir = TestDir::new("log-damage");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    let puts = publish(&host);
    directory.proc.kill9();
    let pristine = tree(&directory.data_dir);
    let log_name = PathBuf::from("log").join("log-0");
    assert!(pristine.contains_key(&log_name), "{:?}", pristine.keys());

    // Four bytes flipped in the middle of the log's records: refused, and nothing changes.
    let flip = copy_of(&dir, "flip", &pristine);
    let mut damaged = pristine[&log_name].clone();
    let end = records_end(&damaged);
    assert!(
        damaged.len() > end && damaged[end..].iter().all(|&b| b == 0),
        "the log is preallocated: zeros after its records"
    );
    let middle = end / 2;
    for b in &mut damaged[middle..middle + 4] {
        *b ^= 0x5A;
    }
    fs::write(log_file(&flip), &damaged).unwrap();
    let before = tree(&flip);
    let (code, output) = run_refused(&dir, "flip-refused", &flip, &[]);
    assert_eq!(code, REFUSED, "{output}");
    let line = refusal_line(&output);
    let path = log_file(&flip).display().to_string();
    assert!(
        line.contains(&format!("{path} is damaged at byte ")),
        "{line}"
    );
    let offset = number_after(line, "is damaged at byte ");
    let synced = number_after(line, "synced up to byte ");
    assert!(
        offset as usize <= middle && middle - (offset as usize) < 1024,
        "{line}"
    );
    assert!(synced as usize > middle + 4, "{line}");
    assert!(line.contains("--repair-log"), "{line}");
    assert_eq!(tree(&flip), before, "the refused directory changed files");
    eprintln!("flipped bytes at {middle}: {line}");

    // With --repair-log it starts, cuts there, keeps a copy and says where.
    let repaired = DirectoryProc::start_with(&dir, "flip", &["--repair-log".into()]);
    let text = repaired.proc.log_text();
    let copy = flip.join("log").join(format!("log-0.cut-{offset}"));
    let expected = format!(
        "log: repair: cut {} bytes off {path} at byte {offset} (",
        damaged.len() - offset as usize
    );
    assert!(text.contains(&expected), "{text}");
    assert!(
        text.contains(&format!("the cut bytes are kept in {}", copy.display())),
        "{text}"
    );
    assert_eq!(
        fs::read(&copy).unwrap(),
        &damaged[offset as usize..],
        "the copy"
    );
    eprintln!("repaired: {}", text.trim_end());
    // The puts before the damage are there at their revisions; none after it.
    let mut client = RawClient::connect(&repaired.listen).unwrap();
    let found: Vec<Option<String>> = puts.iter().map(|p| lookup(&mut client, p)).collect();
    let kept = found.iter().take_while(|r| r.is_some()).count();
    assert!(
        kept > 0 && kept < puts.len(),
        "kept {kept} of {}",
        puts.len()
    );
    for (put, revision) in puts.iter().zip(&found) {
        if let Some(revision) = revision {
            assert_eq!(revision, &put.revision, "{}", put.path);
        }
    }
    assert!(
        found[kept..].iter().all(Option::is_none),
        "a put after the damage survived"
    );
    drop(client);
    drop(repaired);

    // The log deleted, or emptied: refused, and nothing changes.
    for (name, emptied) in [("deleted", false), ("emptied", true)] {
        let data_dir = copy_of(&dir, name, &pristine);
        if emptied {
            fs::write(log_file(&data_dir), b"").unwrap();
        } else {
            fs::remove_file(log_file(&data_dir)).unwrap();
        }
        let before = tree(&data_dir);
        let (code, output) = run_refused(&dir, &format!("{name}-refused"), &data_dir, &[]);
        assert_eq!(code, REFUSED, "{output}");
        let line = refusal_line(&output);
        let what = if emptied { "is empty" } else { "is missing" };
        let path = log_file(&data_dir).display().to_string();
        assert!(line.contains(&format!("{path} {what}")), "{line}");
        assert_eq!(
            tree(&data_dir),
            before,
            "{name}: the refused directory changed files"
        );
        eprintln!("log {name}: {line}");
    }

    // Torn tails on the real directory, the host still up: cut, reported, nothing lost.
    let mut half_record = Vec::new();
    append_record(
        &mut half_record,
        &LogRecord::RetirementDone {
            source: Address::new(NodeId(1), 1, 77),
        },
    )
    .unwrap();
    half_record.truncate(half_record.len() / 2);
    let tails: [(&str, Vec<u8>); 3] = [
        ("garbage", pattern(99, 100)),
        ("zeros", vec![0; 4096]),
        ("half a record", half_record),
    ];
    let path = log_file(&directory.data_dir);
    for (name, tail) in tails {
        // Written where the records end, over the preallocated zeros (and past them).
        let bytes = fs::read(&path).unwrap();
        let end = records_end(&bytes);
        let len = bytes.len().max(end + tail.len());
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&tail, end as u64).unwrap();
        drop(file);
        let before = directory.proc.log_text().len();
        directory.restart();
        let text = directory.proc.log_text();
        // What this start said (the log file keeps what the earlier ones said too).
        let text = text.get(before..).unwrap_or(&text);
        let cut = format!(
            "WARN dataplane_io::dirnode: log: cut a torn tail of {} bytes off {} at byte {end} (",
            len - end,
            path.display()
        );
        if tail.iter().all(|&b| b == 0) {
            assert!(
                !text.contains("cut a torn tail"),
                "{name}: zeros are the end of the log, not a torn tail: {text}"
            );
        } else {
            let line = text
                .lines()
                .find(|l| l.contains(&cut))
                .unwrap_or_else(|| panic!("{name}: no {cut:?} in {text}"));
            eprintln!("{name}: {line}");
        }
        let mut client = RawClient::connect(&directory.listen).unwrap();
        for put in &puts {
            assert_eq!(
                lookup(&mut client, put),
                Some(put.revision.clone()),
                "{name}: {}",
                put.path
            );
        }
        wait_until(
            "the host to read through the restarted directory",
            Duration::from_secs(30),
            || host.cli(&["get", &puts[0].path]).code == 0,
        );
        for put in &puts {
            let get = host.cli(&["get", &put.path]);
            get.expect_code(0, "get after a torn tail");
            assert!(
                get.stdout == pattern(put.seed, BLOB),
                "{name}: {} reads back other bytes",
                put.path
            );
        }
        directory.proc.kill9();
    }
}

/// A second directory on a data directory in use is refused before it touches anything (it
/// used to rewrite the running one's membership file, boot count and all, before the lock
/// refused it).
#[test]
fn a_second_directory_on_a_data_directory_in_use_changes_no_file() {
    let dir = TestDir::new("log-locked");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "4M");
    host.cli_stdin(&["put", "/data/locked", "-"], &pattern(1, 1000))
        .expect_code(0, "put");
    // The running directory is stopped while the second one tries, so that every change to
    // the files is the second one's (the first one writes on its own: horizons, sync marks).
    directory.proc.signal("STOP");
    let before = tree(&directory.data_dir);
    let (code, output) = run_refused(&dir, "second", &directory.data_dir, &[]);
    let after = tree(&directory.data_dir);
    directory.proc.signal("CONT");
    let changed: Vec<&PathBuf> = after
        .iter()
        .filter(|(name, bytes)| before.get(*name) != Some(*bytes))
        .map(|(name, _)| name)
        .chain(before.keys().filter(|name| !after.contains_key(*name)))
        .collect();
    assert!(
        changed.is_empty(),
        "the second directory changed {changed:?}; it said {output:?}"
    );
    assert_eq!(code, LOCKED, "{output}");
    let lock = directory.data_dir.join("log").join("lock");
    assert_eq!(
        output.lines().collect::<Vec<_>>(),
        [format!(
            "dataplane-node: directory refuses to start: log: {} is locked: another process \
             has this data directory open; no file was changed",
            lock.display()
        )]
    );
    directory.proc.assert_running();
    let get = host.cli(&["get", "/data/locked"]);
    get.expect_code(0, "get after the second directory was refused");
}

/// The exit status of a host node that cannot go on (sysexits' software error).
const SOFTWARE: i32 = 70;

#[test]
fn after_a_repair_no_boot_or_epoch_repeats_and_a_host_the_cut_named_stops() {
    let dir = TestDir::new("log-repair-ids");
    let mut directory = DirectoryProc::start(&dir, "directory");
    let mut host = HostProc::start(&dir, "host", &directory.listen, "4M");
    publish(&host);
    // The damage goes in the middle of the records so far; all that follows is cut.
    directory.proc.kill9();
    let damage_at = records_end(&fs::read(log_file(&directory.data_dir)).unwrap()) / 2;
    // After the damage point: a second boot of the directory (epoch 2), and two restarts of
    // the host (incarnations 2 and 3), each made durable before anyone heard of it.
    directory.proc.start();
    directory.wait_ready();
    host.restart();
    host.restart();
    host.cli_stdin(&["put", "/data/ld/after", "-"], &pattern(7, BLOB))
        .expect_code(0, "a put after the restarts");
    let text = directory.proc.log_text();
    let seen = |label: &str| {
        text.lines()
            .filter(|l| l.contains(label))
            .map(|l| number_after(l, label))
            .max()
            .unwrap_or_else(|| panic!("no {label:?} in {text}"))
    };
    let (boot_seen, epoch_seen) = (seen(" boot="), seen(" epoch="));
    assert_eq!((boot_seen, epoch_seen), (2, 2), "{text}");
    assert!(text.contains("incarnation=3"), "{text}");
    directory.proc.kill9();

    let mut damaged = fs::read(log_file(&directory.data_dir)).unwrap();
    for b in &mut damaged[damage_at..damage_at + 4] {
        *b ^= 0x5A;
    }
    fs::write(log_file(&directory.data_dir), &damaged).unwrap();
    let before = directory.proc.log_text().len();
    directory.proc.start_once_with(&["--repair-log"]);
    directory.wait_ready();
    let repaired = directory.proc.log_text()[before..].to_owned();
    assert!(repaired.contains("log: repair: cut "), "{repaired}");
    let replayed = repaired
        .lines()
        .find(|l| l.contains("log replayed"))
        .unwrap_or_else(|| panic!("{repaired}"));
    let started = repaired
        .lines()
        .find(|l| l.contains("directory started"))
        .unwrap_or_else(|| panic!("{repaired}"));
    let (boot, epoch) = (
        number_after(started, " boot="),
        number_after(replayed, " epoch="),
    );
    assert!(
        boot > boot_seen && epoch > epoch_seen,
        "the repaired directory booted as {boot} at epoch {epoch}, not above the boot \
         {boot_seen} and epoch {epoch_seen} the cut records counted:\n{repaired}"
    );
    eprintln!("repaired: boot {boot}, epoch {epoch}");

    // The host, incarnation 3 at a directory that knows it only as incarnation 1, stops.
    let status = host.proc.wait_exit(Duration::from_secs(30));
    let said = host.proc.log_text();
    assert_eq!(status.code(), Some(SOFTWARE), "{said}");
    let last = said.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("dataplane-node: the directory no longer knows this host: ")
            && last.contains("not as node ")
            && last.contains(" incarnation 3 ")
            && last.ends_with("restart it (the blobs it holds are lost)"),
        "{last}"
    );
    // Started again, it is a host the directory knows, and serves.
    host.proc.start();
    host.wait_ready();
    host.cli_stdin(&["put", "/data/ld/repaired", "-"], &pattern(8, BLOB))
        .expect_code(0, "a put on the restarted host");
    let get = host.cli(&["get", "/data/ld/repaired"]);
    get.expect_code(0, "get");
    assert_eq!(get.stdout, pattern(8, BLOB));
}

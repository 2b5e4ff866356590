//! Seeds of the machine targets (written by `examples/seeds.rs`).

use std::fs;
use std::path::Path;

use dataplane_core::log::{append_record, encode_log};
use dataplane_core::wire::StreamRole;

use dataplane_testkit::workload::{Expect, Gone, IncPick, P, Step};

use crate::model::drive;

/// A busy workload: blobs, a reservation, a rendezvous and its replacement fence, retries,
/// declarations of operations done, gone reports, ticks and a restart.
pub fn busy_steps() -> Vec<Step> {
    let open = |path, role, endpoint, replace, op| Step::Open {
        path,
        role,
        endpoint,
        replace,
        ensure: true,
        expected: Expect::None,
        op,
    };
    vec![
        Step::Register {
            path: P::A,
            op: 1,
            long: false,
            file: false,
            reservation: None,
        },
        Step::Reserve {
            path: P::B,
            op: 5,
            owner: 0,
        },
        Step::Register {
            path: P::B,
            op: 2,
            long: true,
            file: true,
            reservation: Some(5),
        },
        Step::Register {
            path: P::A,
            op: 3,
            long: false,
            file: false,
            reservation: None,
        },
        open(P::AC, StreamRole::Source, 0, false, 13),
        open(P::AC, StreamRole::Sink, 1, false, 14),
        Step::Replay {
            back: 0,
            other_client: true,
        },
        open(P::AC, StreamRole::Sink, 2, true, 15),
        Step::StreamDisplaced(0),
        Step::Tick,
        Step::Rename {
            from: P::A,
            to: P::B,
            replace: true,
            op: 11,
        },
        Step::Unregister {
            path: P::B,
            expected: Expect::Recent(0),
            op: 9,
        },
        Step::Cancel {
            path: P::AC,
            op: 16,
        },
        Step::Close {
            path: P::AC,
            inc: IncPick::Seen(0),
        },
        // Retention: both issuers declare their operations done, a pruned one is replayed,
        // and node 1's restart expires what its first incarnation issued.
        Step::Done { below: 12, who: 0 },
        Step::Done { below: 14, who: 1 },
        Step::Replay {
            back: 3,
            other_client: false,
        },
        Step::Gone(Gone::Node(2, 2)),
        Step::SourceRetired(0),
        Step::Restart,
        Step::Lookup(P::AC),
        Step::Resolve(P::B),
        Step::Gone(Gone::Node(1, 2)),
    ]
}

/// Deterministic filler bytes (SplitMix64).
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

fn write(dir: &Path, name: &str, data: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), data).unwrap();
}

/// Writes the seeds of `host_session` under `root`: for each canned prelude, two byte strings
/// (of 256 and 1024 bytes) that decode to that prelude and a schedule of at least 8 actions.
pub fn write_host_seeds(root: &Path) {
    use arbitrary::{Arbitrary, Unstructured};

    use crate::host::Input;

    let dir = root.join("host_session");
    for prelude in 0..4 {
        for len in [256, 1024] {
            let found = (0..10_000u64).find_map(|salt| {
                let data = bytes(1000 + salt, len);
                let input = Input::arbitrary_take_rest(Unstructured::new(&data)).ok()?;
                (input.prelude as usize == prelude && input.actions.len() >= 8).then_some(data)
            });
            let data = found.expect("a seed for every prelude");
            write(&dir, &format!("prelude-{prelude}-{len}"), &data);
        }
    }
}

/// Writes the seeds of `log_recover`, `directory_ops` and `proxy_directory` under `root`.
pub fn write_machine_seeds(root: &Path) {
    let d = drive(&busy_steps());
    let log_dir = root.join("log_recover");
    // Mode byte 0: a raw image (the real log, and its compaction).
    let mut raw = vec![0];
    raw.extend(encode_log(&d.log).unwrap());
    write(&log_dir, "raw-log", &raw);
    let mut snapshot = vec![0];
    snapshot.extend(encode_log(&d.dir.snapshot_records()).unwrap());
    write(&log_dir, "raw-snapshot", &snapshot);
    // Mode byte 1: structured (a workload and its corruptions).
    for (i, len) in [96, 256, 640].into_iter().enumerate() {
        let mut structured = vec![1];
        structured.extend(bytes(i as u64, len));
        write(&log_dir, &format!("structured-{i}"), &structured);
    }
    for (target, salt) in [("directory_ops", 100), ("proxy_directory", 200)] {
        for (i, len) in [128, 384, 1024].into_iter().enumerate() {
            write(
                &root.join(target),
                &format!("schedule-{i}"),
                &bytes(salt + i as u64, len),
            );
        }
    }
}

/// Writes the seeds of `log_file` under `root`: the busy workload's log as the directory node
/// writes it (a header, the record frames, a sync mark after every third record), and a few
/// structured byte strings.
pub fn write_log_file_seeds(root: &Path) {
    use dataplane_io::log::{DataDirId, LogHeader, mark};

    let d = drive(&busy_steps());
    let dir = root.join("log_file");
    let header = LogHeader {
        id: DataDirId(0x5eed),
        generation: 0,
        salt: 0x0123_4567_89ab_cdef,
    };
    // Mode byte 0: a raw log file.
    let mut raw = vec![0];
    raw.extend(header.encode());
    for (i, record) in d.log.iter().enumerate() {
        append_record(&mut raw, record).unwrap();
        if i % 3 == 2 {
            let at = raw.len() - 1;
            raw.extend_from_slice(&mark(header.salt, at as u64));
        }
    }
    write(&dir, "raw-log", &raw);
    // Mode byte 1: structured (batches, then a power loss or a flip).
    for (i, len) in [64, 200, 512].into_iter().enumerate() {
        let mut structured = vec![1];
        structured.extend(bytes(300 + i as u64, len));
        write(&dir, &format!("structured-{i}"), &structured);
    }
}

//! A soak (issue 13): a million puts and a million removes through two real hosts, at constant
//! live state, while the directory's and the hosts' resident memory is sampled. Before
//! operation records were pruned the directory grew with every mutation it ever accepted (the
//! issue measured 1.6 GB at two million); now its memory, like the hosts', must stay flat.
//!
//! Ignored by default (minutes in release). Run it with
//!
//! ```text
//! cargo test --release -p dataplane-tests --test processes soak -- --ignored --nocapture
//! ```
//!
//! `DATAPLANE_SOAK_PUTS` sets the number of puts (1,000,000 by default). Every session loops
//! "put 1 KiB at one of its 16 paths, then remove it" (so at most 16 × sessions blobs are
//! live), and the test prints a sample line every tenth of the run:
//!
//! ```text
//! # soak puts=<n> removes=<n> directory_rss_mb=<m> host_a_rss_mb=<m> host_b_rss_mb=<m> ops_per_s=<r>
//! ```
//!
//! After the warm-up (the first sample) every later sample of each process must stay within
//! 1.5× of its warm-up sample, and no put or remove may fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dataplane_io::child::ChildSession;
use dataplane_tests::{DirectoryProc, HostProc, TestDir, pattern};

/// Sessions on each host.
const SESSIONS_PER_HOST: usize = 8;
/// Paths each session cycles through.
const PATHS_PER_SESSION: u64 = 16;
/// Samples over the run (the first is the warm-up reference).
const SAMPLES: u64 = 10;
/// How far a later sample may rise above the warm-up sample.
const RSS_SPREAD_MAX: f64 = 1.5;

fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[test]
#[ignore = "a soak of minutes; run it explicitly (see the module documentation)"]
fn soak_a_million_puts_and_removes_at_flat_memory() {
    let total: u64 = std::env::var("DATAPLANE_SOAK_PUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = TestDir::new("soak");
    let directory = DirectoryProc::start(&dir, "directory");
    let hosts = [
        HostProc::start(&dir, "host-a", &directory.listen, "64M"),
        HostProc::start(&dir, "host-b", &directory.listen, "64M"),
    ];
    let pids = [
        directory.proc.pid(),
        hosts[0].proc.pid(),
        hosts[1].proc.pid(),
    ];
    let puts = Arc::new(AtomicU64::new(0));
    let removes = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut loaders = Vec::new();
    for (h, host) in hosts.iter().enumerate() {
        for s in 0..SESSIONS_PER_HOST {
            let socket = host.socket.clone();
            let (puts, removes, failed) = (puts.clone(), removes.clone(), failed.clone());
            loaders.push(thread::spawn(move || {
                let mut session = ChildSession::connect(&socket)
                    .unwrap_or_else(|e| panic!("host {h} session {s}: connect: {e}"));
                let bytes = pattern((h * 100 + s) as u64, 1024);
                let mut i = 0u64;
                while !failed.load(Ordering::Relaxed)
                    && puts.fetch_add(1, Ordering::Relaxed) < total
                {
                    let path = format!("/data/soak/{h}/{s}/{}", i % PATHS_PER_SESSION);
                    i += 1;
                    let revision = match session.put(&path, &bytes) {
                        Ok(r) => r,
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            panic!("host {h} session {s}: put #{i} of {path}: {e}");
                        }
                    };
                    if let Err(e) = session.remove(&path, Some(revision)) {
                        failed.store(true, Ordering::Relaxed);
                        panic!("host {h} session {s}: remove #{i} of {path}: {e}");
                    }
                    removes.fetch_add(1, Ordering::Relaxed);
                }
                session.close().expect("close");
            }));
        }
    }
    // Sample every tenth of the run, by puts done.
    let mut samples: Vec<[f64; 3]> = Vec::new();
    let mut last = (Instant::now(), 0u64);
    for k in 1..=SAMPLES {
        let at = total * k / SAMPLES;
        while removes.load(Ordering::Relaxed) < at && !failed.load(Ordering::Relaxed) {
            if loaders.iter().all(|l| l.is_finished()) {
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let done = removes.load(Ordering::Relaxed);
        let rss = pids.map(rss_mb);
        let rate = (done - last.1) as f64 * 2.0 / last.0.elapsed().as_secs_f64().max(1e-9);
        last = (Instant::now(), done);
        println!(
            "# soak puts={} removes={done} directory_rss_mb={:.1} host_a_rss_mb={:.1} host_b_rss_mb={:.1} ops_per_s={rate:.0} elapsed_s={:.0}",
            puts.load(Ordering::Relaxed).min(total),
            rss[0],
            rss[1],
            rss[2],
            started.elapsed().as_secs_f64()
        );
        samples.push(rss);
        if failed.load(Ordering::Relaxed) {
            break;
        }
    }
    for loader in loaders {
        if let Err(panic) = loader.join() {
            std::panic::resume_unwind(panic);
        }
    }
    assert_eq!(
        removes.load(Ordering::Relaxed),
        total,
        "every put was removed"
    );
    let warm = samples[0];
    for (i, name) in ["directory", "host-a", "host-b"].iter().enumerate() {
        let peak = samples.iter().map(|s| s[i]).fold(0.0, f64::max);
        println!(
            "# soak {name}: warm-up {:.1} MB, peak {peak:.1} MB, spread {:.2} (at most {RSS_SPREAD_MAX})",
            warm[i],
            peak / warm[i]
        );
        assert!(
            peak <= warm[i] * RSS_SPREAD_MAX,
            "{name}'s resident memory grew from {:.1} MB to {peak:.1} MB",
            warm[i]
        );
    }
    // Right after the load, the hosts still serve.
    for host in &hosts {
        let out = host.cli(&["stat", "/data/soak/0/0/0"]);
        assert_eq!(out.code, 2, "stat after the soak: {out:?}");
    }
}

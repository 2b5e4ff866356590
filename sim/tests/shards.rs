//! Swarms beyond one machine (issue 14): shards take their index from the batch system's
//! environment, write their results as JSON, and `merge` combines them into one summary.

use std::process::Command;

use dataplane_sim::Options;

const SIM: &str = env!("CARGO_BIN_EXE_dataplane-sim");

/// Four quick seeds in a row (no long-life or overload regime).
fn quick_range() -> (u64, u64) {
    let quick = |s: u64| {
        let o = Options::draw(s);
        o.long_life.is_none() && o.overload.is_none()
    };
    let first = (0..1_000)
        .find(|&s| (s..s + 4).all(quick))
        .expect("four quick seeds in a row");
    (first, first + 4)
}

fn swarm(env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut command = Command::new(SIM);
    command
        .arg("swarm")
        .args(args)
        .env_remove("JOB_COMPLETION_INDEX")
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("SLURM_ARRAY_TASK_COUNT")
        .env_remove("SLURM_ARRAY_TASK_MIN");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("runs")
}

#[test]
fn kubernetes_and_slurm_shards_merge_into_one_summary() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = quick_range();
    let seeds = format!("--seeds={a}..{b}");
    let results = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    // Shard 0 of 2 as a Kubernetes Indexed Job pod, shard 1 as a Slurm array task numbered
    // from 1: both are the same swarm.
    let k8s = swarm(
        &[("JOB_COMPLETION_INDEX", "0")],
        &[
            &seeds,
            "--quiet",
            "--shard-from=k8s",
            "--shard-count=2",
            "--no-fault=rot",
            &format!("--results={}", results("shard-0.json")),
        ],
    );
    assert!(k8s.status.success(), "{k8s:?}");
    assert!(String::from_utf8_lossy(&k8s.stdout).contains("# shard 0/2"));
    let slurm = swarm(
        &[
            ("SLURM_ARRAY_TASK_ID", "2"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "2"),
        ],
        &[
            &seeds,
            "--quiet",
            "--shard-from=slurm",
            "--no-fault=rot",
            &format!("--results={}", results("shard-1.json")),
        ],
    );
    assert!(slurm.status.success(), "{slurm:?}");
    assert!(String::from_utf8_lossy(&slurm.stdout).contains("# shard 1/2"));
    let merged = Command::new(SIM)
        .args(["merge", &results("shard-0.json"), &results("shard-1.json")])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&merged.stdout);
    assert!(merged.status.success(), "{merged:?}");
    assert!(out.contains("seeds=4 passed=4 failed=0"), "{out}");
    assert!(out.contains("shards=2/2"), "{out}");
    // One shard alone is an incomplete swarm: said, and not a pass.
    let half = Command::new(SIM)
        .args(["merge", &results("shard-0.json")])
        .output()
        .unwrap();
    assert_eq!(half.status.code(), Some(70));
    assert!(String::from_utf8_lossy(&half.stdout).contains("missing shards"));
    // Without the environment the shard cannot be found: a usage error, nothing run.
    let lost = swarm(&[], &[&seeds, "--quiet", "--shard-from=slurm"]);
    assert_eq!(lost.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&lost.stderr).contains("SLURM_ARRAY_TASK_ID"));
    let no_count = swarm(
        &[("JOB_COMPLETION_INDEX", "1")],
        &[&seeds, "--quiet", "--shard-from=k8s"],
    );
    assert_eq!(no_count.status.code(), Some(64));
}

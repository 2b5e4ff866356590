//! Swarms beyond one machine (issue 14): which shard this process is, from the flags or from
//! the batch system that started it, each shard's results as a JSON file, and the merge of
//! the shards into one summary.
//!
//! A Kubernetes Indexed Job gives every pod `JOB_COMPLETION_INDEX` (the count is the Job's
//! `completions`, given to the command); a Slurm array gives `SLURM_ARRAY_TASK_ID` and
//! `SLURM_ARRAY_TASK_COUNT` (and `SLURM_ARRAY_TASK_MIN` when the array does not start at 0).
//! `deploy/` has a Job manifest and an sbatch script that use them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::check::EXPECTED_COVERAGE;
use crate::swarm::SwarmReport;

/// The version of the results file; `merge` refuses others.
pub const RESULTS_VERSION: u64 = 1;

/// Where a shard's index and count come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardSource {
    /// A Kubernetes Indexed Job: `JOB_COMPLETION_INDEX`, with the count given.
    Kubernetes,
    /// A Slurm job array: `SLURM_ARRAY_TASK_ID` and `SLURM_ARRAY_TASK_COUNT`.
    Slurm,
}

impl std::str::FromStr for ShardSource {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "k8s" | "kubernetes" => Ok(ShardSource::Kubernetes),
            "slurm" => Ok(ShardSource::Slurm),
            other => Err(format!("unknown shard source {other:?} (k8s or slurm)")),
        }
    }
}

/// This process's shard `(index, count)`, read through `env` (the process environment in
/// the binary, a table in tests). `count` is the given count (required for Kubernetes, which
/// does not tell a pod how many completions its Job has; checked against Slurm's own).
pub fn shard_from_env(
    source: ShardSource,
    count: Option<u64>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(u64, u64), String> {
    let number = |name: &str| -> Result<Option<u64>, String> {
        env(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{name}={v:?} is not a number"))
            })
            .transpose()
    };
    let (index, count) = match source {
        ShardSource::Kubernetes => {
            let index = number("JOB_COMPLETION_INDEX")?
                .ok_or("JOB_COMPLETION_INDEX is not set (not in a Kubernetes Indexed Job?)")?;
            let count = count.ok_or(
                "a Kubernetes shard needs --shard-count N (the Job's completions)".to_owned(),
            )?;
            (index, count)
        }
        ShardSource::Slurm => {
            let id = number("SLURM_ARRAY_TASK_ID")?
                .ok_or("SLURM_ARRAY_TASK_ID is not set (not in a Slurm job array?)")?;
            let min = number("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let slurm_count = number("SLURM_ARRAY_TASK_COUNT")?;
            let count = match (count, slurm_count) {
                (Some(given), Some(slurm)) if given != slurm => {
                    return Err(format!(
                        "--shard-count {given} but SLURM_ARRAY_TASK_COUNT={slurm}"
                    ));
                }
                (Some(c), _) | (None, Some(c)) => c,
                (None, None) => {
                    return Err("SLURM_ARRAY_TASK_COUNT is not set; give --shard-count".into());
                }
            };
            let index = id
                .checked_sub(min)
                .ok_or_else(|| format!("SLURM_ARRAY_TASK_ID={id} is below its minimum {min}"))?;
            (index, count)
        }
    };
    if count == 0 || index >= count {
        return Err(format!(
            "shard index {index} is not below the count {count}"
        ));
    }
    Ok((index, count))
}

/// The replay command of a failing seed.
pub fn replay_command(seed: u64, overrides: &str) -> String {
    format!(
        "cargo run --release -p dataplane-sim -- run --seed {seed} --trace seed-{seed}.trace{overrides}"
    )
}

/// One shard's results as JSON: the range, the shard, the overrides, every failing seed with
/// its replay command, the counters and the coverage.
pub fn to_json(
    report: &SwarmReport,
    seeds: (u64, u64),
    shard: (u64, u64),
    overrides: &str,
) -> Value {
    let failures: Vec<Value> = report
        .failures
        .iter()
        .map(|f| {
            json!({
                "seed": f.seed,
                "message": f.message,
                "replay": replay_command(f.seed, overrides),
            })
        })
        .collect();
    let coverage: serde_json::Map<String, Value> = report
        .coverage
        .iter()
        .map(|(name, count)| (name.to_owned(), json!(count)))
        .collect();
    json!({
        "version": RESULTS_VERSION,
        "seeds": [seeds.0, seeds.1],
        "shard": [shard.0, shard.1],
        "overrides": overrides,
        "seeds_run": report.seeds,
        "passed": report.passed,
        "failures": failures,
        "events": report.events,
        "sim_time_ns": report.sim_time.as_nanos(),
        "busy_ns": u64::try_from(report.busy.as_nanos()).unwrap_or(u64::MAX),
        "wall_ns": u64::try_from(report.wall.as_nanos()).unwrap_or(u64::MAX),
        "coverage": coverage,
        "long_life": report.long_life,
    })
}

/// One failing seed of a merged swarm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedFailure {
    /// The seed.
    pub seed: u64,
    /// Its failure.
    pub message: String,
    /// How to replay it.
    pub replay: String,
}

/// The shards of one swarm, merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// The seed range.
    pub seeds: (u64, u64),
    /// The shard count.
    pub shards: u64,
    /// The overrides every shard ran with.
    pub overrides: String,
    /// Shard indices with no results file.
    pub missing: Vec<u64>,
    /// Seeds run, over all shards.
    pub seeds_run: u64,
    /// Seeds passed.
    pub passed: u64,
    /// Every failing seed, in seed order.
    pub failures: Vec<MergedFailure>,
    /// Events.
    pub events: u64,
    /// Simulated time (ns).
    pub sim_time_ns: u64,
    /// Core time spent simulating (ns).
    pub busy_ns: u64,
    /// The slowest shard's wall time (ns).
    pub wall_ns: u64,
    /// Coverage, summed.
    pub coverage: BTreeMap<String, u64>,
    /// The long-life lines.
    pub long_life: Vec<String>,
}

impl Merged {
    /// Expected coverage points no shard reached.
    pub fn never_exercised(&self) -> Vec<&'static str> {
        let expected = if self.coverage.contains_key("mode.replicated") {
            crate::replicated::REPLICATED_COVERAGE
        } else {
            EXPECTED_COVERAGE
        };
        expected
            .iter()
            .copied()
            .filter(|n| self.coverage.get(*n).copied().unwrap_or(0) == 0)
            .collect()
    }

    /// The one-screen summary: failures with their replay commands, missing shards, coverage
    /// gaps and the totals.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for f in &self.failures {
            let _ = writeln!(s, "FAIL seed={}: {}", f.seed, f.message);
            let _ = writeln!(s, "  replay: {}", f.replay);
        }
        for line in &self.long_life {
            let _ = writeln!(s, "{line}");
        }
        if !self.missing.is_empty() {
            let _ = writeln!(
                s,
                "# missing shards (no results file): {:?} of {}",
                self.missing, self.shards
            );
        }
        let never = self.never_exercised();
        if !never.is_empty() {
            let _ = writeln!(s, "# never exercised by this swarm: {}", never.join(" "));
        }
        let _ = writeln!(
            s,
            "seeds={} passed={} failed={} events={} sim_time={:.1}s shards={}/{} slowest_shard_wall={:.2}s events_per_core_sec={:.0}",
            self.seeds_run,
            self.passed,
            self.failures.len(),
            self.events,
            self.sim_time_ns as f64 / 1e9,
            self.shards - self.missing.len() as u64,
            self.shards,
            self.wall_ns as f64 / 1e9,
            self.events as f64 / (self.busy_ns.max(1) as f64 / 1e9),
        );
        s
    }
}

fn field<'a>(value: &'a Value, name: &str, file: &str) -> Result<&'a Value, String> {
    value
        .get(name)
        .ok_or_else(|| format!("{file}: no \"{name}\""))
}

fn u64_field(value: &Value, name: &str, file: &str) -> Result<u64, String> {
    field(value, name, file)?
        .as_u64()
        .ok_or_else(|| format!("{file}: \"{name}\" is not a count"))
}

fn pair(value: &Value, name: &str, file: &str) -> Result<(u64, u64), String> {
    match field(value, name, file)?.as_array().map(Vec::as_slice) {
        Some([a, b]) => match (a.as_u64(), b.as_u64()) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(format!("{file}: \"{name}\" is not two counts")),
        },
        _ => Err(format!("{file}: \"{name}\" is not two counts")),
    }
}

/// Merges shard results `(file name, contents)`. They must come from one swarm: the same
/// seed range, shard count and overrides, each shard at most once.
pub fn merge(files: &[(String, String)]) -> Result<Merged, String> {
    let mut merged: Option<Merged> = None;
    let mut seen = BTreeMap::new();
    for (file, text) in files {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("{file}: not JSON: {e}"))?;
        let version = u64_field(&value, "version", file)?;
        if version != RESULTS_VERSION {
            return Err(format!(
                "{file}: results version {version}, this merge reads {RESULTS_VERSION}"
            ));
        }
        let seeds = pair(&value, "seeds", file)?;
        let (index, count) = pair(&value, "shard", file)?;
        let overrides = field(&value, "overrides", file)?
            .as_str()
            .ok_or_else(|| format!("{file}: \"overrides\" is not text"))?
            .to_owned();
        if count == 0 || index >= count {
            return Err(format!("{file}: shard {index}/{count} is not a shard"));
        }
        let m = merged.get_or_insert_with(|| Merged {
            seeds,
            shards: count,
            overrides: overrides.clone(),
            ..Merged::default()
        });
        if (m.seeds, m.shards, &m.overrides) != (seeds, count, &overrides) {
            return Err(format!(
                "{file}: from another swarm (seeds {}..{}, {count} shards, overrides {overrides:?}; the first file had seeds {}..{}, {} shards, overrides {:?})",
                seeds.0, seeds.1, m.seeds.0, m.seeds.1, m.shards, m.overrides
            ));
        }
        if let Some(earlier) = seen.insert(index, file.clone()) {
            return Err(format!("{file}: shard {index} again (also in {earlier})"));
        }
        m.seeds_run += u64_field(&value, "seeds_run", file)?;
        m.passed += u64_field(&value, "passed", file)?;
        m.events += u64_field(&value, "events", file)?;
        m.sim_time_ns += u64_field(&value, "sim_time_ns", file)?;
        m.busy_ns += u64_field(&value, "busy_ns", file)?;
        m.wall_ns = m.wall_ns.max(u64_field(&value, "wall_ns", file)?);
        for f in field(&value, "failures", file)?
            .as_array()
            .ok_or_else(|| format!("{file}: \"failures\" is not a list"))?
        {
            let text = |name: &str| -> Result<String, String> {
                Ok(field(f, name, file)?
                    .as_str()
                    .ok_or_else(|| format!("{file}: a failure's \"{name}\" is not text"))?
                    .to_owned())
            };
            m.failures.push(MergedFailure {
                seed: u64_field(f, "seed", file)?,
                message: text("message")?,
                replay: text("replay")?,
            });
        }
        for (name, n) in field(&value, "coverage", file)?
            .as_object()
            .ok_or_else(|| format!("{file}: \"coverage\" is not an object"))?
        {
            let n = n
                .as_u64()
                .ok_or_else(|| format!("{file}: coverage {name} is not a count"))?;
            *m.coverage.entry(name.clone()).or_default() += n;
        }
        for line in field(&value, "long_life", file)?
            .as_array()
            .ok_or_else(|| format!("{file}: \"long_life\" is not a list"))?
        {
            m.long_life
                .push(line.as_str().unwrap_or_default().to_owned());
        }
    }
    let mut m = merged.ok_or("no results files to merge")?;
    m.missing = (0..m.shards).filter(|i| !seen.contains_key(i)).collect();
    m.failures.sort_by_key(|f| f.seed);
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let table: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| table.get(name).cloned()
    }

    #[test]
    fn the_shard_comes_from_the_batch_system() {
        let k8s = env(&[("JOB_COMPLETION_INDEX", "3")]);
        assert_eq!(
            shard_from_env(ShardSource::Kubernetes, Some(8), &k8s),
            Ok((3, 8))
        );
        assert!(
            shard_from_env(ShardSource::Kubernetes, None, &k8s)
                .unwrap_err()
                .contains("--shard-count")
        );
        assert!(shard_from_env(ShardSource::Kubernetes, Some(3), &k8s).is_err());
        assert!(shard_from_env(ShardSource::Kubernetes, Some(8), &env(&[])).is_err());
        let bad = env(&[("JOB_COMPLETION_INDEX", "x")]);
        assert!(
            shard_from_env(ShardSource::Kubernetes, Some(8), &bad)
                .unwrap_err()
                .contains("not a number")
        );
        let slurm = env(&[
            ("SLURM_ARRAY_TASK_ID", "5"),
            ("SLURM_ARRAY_TASK_COUNT", "6"),
        ]);
        assert_eq!(shard_from_env(ShardSource::Slurm, None, &slurm), Ok((5, 6)));
        assert!(shard_from_env(ShardSource::Slurm, Some(4), &slurm).is_err());
        // An array numbered 1..=6.
        let from_one = env(&[
            ("SLURM_ARRAY_TASK_ID", "6"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "6"),
        ]);
        assert_eq!(
            shard_from_env(ShardSource::Slurm, None, &from_one),
            Ok((5, 6))
        );
        assert!("lsf".parse::<ShardSource>().is_err());
    }

    fn shard_json(index: u64, failures: &[u64], coverage: &[(&str, u64)]) -> (String, String) {
        let mut report = SwarmReport {
            seeds: 5,
            passed: 5 - failures.len() as u64,
            events: 100,
            ..SwarmReport::default()
        };
        for &seed in failures {
            report.failures.push(crate::swarm::SeedFailure {
                seed,
                message: format!("at 1s: model: seed {seed}"),
            });
        }
        let mut value = to_json(&report, (0, 10), (index, 2), " --no-fault loss");
        for (name, n) in coverage {
            value["coverage"][*name] = json!(n);
        }
        (format!("shard-{index}.json"), value.to_string())
    }

    #[test]
    fn shards_merge_into_one_summary() {
        let a = shard_json(0, &[4], &[("host.published", 2)]);
        let b = shard_json(1, &[1, 9], &[("host.published", 1)]);
        let merged = merge(&[a.clone(), b.clone()]).expect("merges");
        assert_eq!(merged.seeds_run, 10);
        assert_eq!(merged.passed, 7);
        assert_eq!(
            merged.failures.iter().map(|f| f.seed).collect::<Vec<_>>(),
            [1, 4, 9]
        );
        assert!(merged.failures[0].replay.contains("--seed 1 "));
        assert!(merged.failures[0].replay.ends_with("--no-fault loss"));
        assert_eq!(merged.coverage["host.published"], 3);
        assert!(merged.missing.is_empty());
        let summary = merged.summary();
        assert!(summary.contains("FAIL seed=9: at 1s: model: seed 9"));
        assert!(summary.contains("seeds=10 passed=7 failed=3"));
        // A missing shard is reported, not hidden.
        let half = merge(std::slice::from_ref(&a)).expect("merges");
        assert_eq!(half.missing, [1]);
        assert!(half.summary().contains("missing shards"));
        // The same shard twice, or a shard of another swarm, is refused.
        assert!(
            merge(&[a.clone(), a.clone()])
                .unwrap_err()
                .contains("again")
        );
        let other = (
            "other.json".to_owned(),
            b.1.replace("--no-fault loss", "--no-fault rot"),
        );
        assert!(merge(&[a, other]).unwrap_err().contains("another swarm"));
        assert!(
            merge(&[("x".into(), "{".into())])
                .unwrap_err()
                .contains("not JSON")
        );
        assert!(merge(&[]).is_err());
    }
}

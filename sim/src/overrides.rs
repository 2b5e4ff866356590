//! Overriding what a seed drew (issue 14): `--no-fault KIND` turns one fault or unhelpful
//! behaviour off, `--set KEY=VALUE` pins one option. Applied after the draw, so every other
//! draw of the seed stays what it was; `describe` lists them, and a swarm's replay commands
//! repeat them.

use std::fmt;
use std::str::FromStr;

use dataplane_core::time::Duration;

use crate::clock::NodeClock;
use crate::options::{Options, RegistrarOptions};
use crate::rng::Ratio;

/// A fault or unhelpful behaviour `--no-fault` can turn off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// Frame loss.
    Loss,
    /// Frame duplication.
    Duplication,
    /// Frame reordering.
    Reordering,
    /// Directory↔host partitions.
    Partitions,
    /// Directory crashes (and with them torn tails and damage at rest).
    DirectoryCrashes,
    /// Host crashes.
    HostCrashes,
    /// Route flaps.
    RouteFlaps,
    /// Sources and endpoints that die.
    ActorDeaths,
    /// Proxy restarts.
    ProxyRestarts,
    /// Authority outages (discovery answers none).
    AuthorityOutages,
    /// Discovery lag.
    DiscoveryLag,
    /// Session revocations.
    Revocations,
    /// Spoofed frames.
    Spoofs,
    /// Files of file blobs changing on their host's disk.
    FileChanges,
    /// Failed fsyncs.
    FsyncFailures,
    /// Crashes during compaction.
    CompactionCrashes,
    /// Full-disk episodes.
    FullDisk,
    /// Damage at rest.
    Rot,
    /// Children that corrupt their seals.
    HostileChildren,
    /// Children that die with everything in flight.
    DyingChildren,
    /// The late, repeating, out-of-order route registrar (prompt instead).
    Registrar,
    /// Discovery's repeated answers.
    DiscoveryRepeats,
    /// Node clocks with their own origin and rate (exact instead).
    Clocks,
    /// Silent stalls: a paused directory, connections that deliver nothing.
    Stalls,
    /// Slow fsyncs (the node's loop waits for them).
    SlowSyncs,
    /// Churn: hosts that join mid-run (every host there from the start instead).
    Churn,
    /// Host crashes aimed at work in flight (the random host crashes stay).
    AimedCrashes,
    /// Host processes paused and resumed.
    HostPauses,
}

impl FaultKind {
    /// Every kind, with its command-line name.
    pub const ALL: [(FaultKind, &'static str); 28] = [
        (FaultKind::Loss, "loss"),
        (FaultKind::Duplication, "duplication"),
        (FaultKind::Reordering, "reordering"),
        (FaultKind::Partitions, "partitions"),
        (FaultKind::DirectoryCrashes, "directory-crashes"),
        (FaultKind::HostCrashes, "host-crashes"),
        (FaultKind::RouteFlaps, "route-flaps"),
        (FaultKind::ActorDeaths, "actor-deaths"),
        (FaultKind::ProxyRestarts, "proxy-restarts"),
        (FaultKind::AuthorityOutages, "authority-outages"),
        (FaultKind::DiscoveryLag, "discovery-lag"),
        (FaultKind::Revocations, "revocations"),
        (FaultKind::Spoofs, "spoofs"),
        (FaultKind::FileChanges, "file-changes"),
        (FaultKind::FsyncFailures, "fsync-failures"),
        (FaultKind::CompactionCrashes, "compaction-crashes"),
        (FaultKind::FullDisk, "full-disk"),
        (FaultKind::Rot, "rot"),
        (FaultKind::HostileChildren, "hostile-children"),
        (FaultKind::DyingChildren, "dying-children"),
        (FaultKind::Registrar, "registrar"),
        (FaultKind::DiscoveryRepeats, "discovery-repeats"),
        (FaultKind::Clocks, "clocks"),
        (FaultKind::Stalls, "stalls"),
        (FaultKind::SlowSyncs, "slow-syncs"),
        (FaultKind::Churn, "churn"),
        (FaultKind::AimedCrashes, "aimed-crashes"),
        (FaultKind::HostPauses, "host-pauses"),
    ];

    fn name(self) -> &'static str {
        FaultKind::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("?", |(_, n)| n)
    }

    fn names() -> String {
        FaultKind::ALL
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        FaultKind::ALL
            .iter()
            .find(|(_, n)| *n == text)
            .map(|(k, _)| *k)
            .ok_or_else(|| {
                format!(
                    "unknown fault kind {text:?} (one of: {})",
                    FaultKind::names()
                )
            })
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An option `--set` can pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetKey {
    /// The fault phase, in milliseconds.
    FaultPhaseMs,
    /// The directory's retry tick, in milliseconds.
    DirectoryRetryMs,
    /// Obligation frames per retry pass.
    RetryBatch,
    /// The proxies' request deadline, in milliseconds.
    DeadlineMs,
    /// The proxies' re-dispatch tick, in milliseconds.
    ProxyRetryMs,
    /// Frame loss, in parts per million.
    LossPpm,
    /// Frame duplication, in parts per million.
    DuplicationPpm,
    /// Frame reordering, in parts per million.
    ReorderingPpm,
    /// Host nodes (the first N of the draw).
    Hosts,
    /// Clients on each host, at most.
    ClientsMax,
    /// Workers on each host, at most.
    WorkersMax,
    /// Contended paths (the first N of the draw).
    Paths,
    /// The log size past which the directory compacts, in bytes.
    CompactMinBytes,
    /// Mean pause between two operations of a client, in milliseconds.
    ThinkMs,
    /// Mean pause between two operations of a worker (child), in milliseconds.
    WorkerThinkMs,
    /// Replicas of the directory (1, or 3 for the replicated mode; `--replicas`).
    Replicas,
}

impl SetKey {
    const ALL: [(SetKey, &'static str); 16] = [
        (SetKey::FaultPhaseMs, "fault_phase_ms"),
        (SetKey::DirectoryRetryMs, "directory_retry_ms"),
        (SetKey::RetryBatch, "retry_batch"),
        (SetKey::DeadlineMs, "deadline_ms"),
        (SetKey::ProxyRetryMs, "proxy_retry_ms"),
        (SetKey::LossPpm, "loss_ppm"),
        (SetKey::DuplicationPpm, "duplication_ppm"),
        (SetKey::ReorderingPpm, "reordering_ppm"),
        (SetKey::Hosts, "hosts"),
        (SetKey::ClientsMax, "clients_max"),
        (SetKey::WorkersMax, "workers_max"),
        (SetKey::Paths, "paths"),
        (SetKey::CompactMinBytes, "compact_min_bytes"),
        (SetKey::ThinkMs, "think_ms"),
        (SetKey::WorkerThinkMs, "worker_think_ms"),
        (SetKey::Replicas, "replicas"),
    ];

    fn name(self) -> &'static str {
        SetKey::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("?", |(_, n)| n)
    }

    /// The value's upper bound (inclusive) and lower bound.
    fn bounds(self) -> (u64, u64) {
        match self {
            SetKey::FaultPhaseMs => (0, 3_600_000),
            SetKey::DirectoryRetryMs | SetKey::ProxyRetryMs => (1, 600_000),
            SetKey::RetryBatch => (1, dataplane_core::limits::RETRY_BATCH_MAX as u64),
            SetKey::DeadlineMs => (1, 3_600_000),
            SetKey::LossPpm | SetKey::DuplicationPpm | SetKey::ReorderingPpm => (0, 1_000_000),
            SetKey::Hosts | SetKey::Paths => (1, 64),
            SetKey::ClientsMax | SetKey::WorkersMax => (0, 64),
            SetKey::CompactMinBytes => (512, 1 << 30),
            SetKey::ThinkMs | SetKey::WorkerThinkMs => (0, 600_000),
            SetKey::Replicas => (1, 3),
        }
    }
}

/// One `--set KEY=VALUE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// What it sets.
    pub key: SetKey,
    /// To what.
    pub value: u64,
}

impl FromStr for Setting {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let keys = || {
            SetKey::ALL
                .iter()
                .map(|(_, n)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))?;
        let key = SetKey::ALL
            .iter()
            .find(|(_, n)| *n == key)
            .map(|(k, _)| *k)
            .ok_or_else(|| format!("unknown key {key:?} (one of: {})", keys()))?;
        let value: u64 = value
            .parse()
            .map_err(|_| format!("{}: expected a whole number, got {value:?}", key.name()))?;
        let (lo, hi) = key.bounds();
        if !(lo..=hi).contains(&value) {
            return Err(format!("{}: {value} is outside {lo}..={hi}", key.name()));
        }
        Ok(Setting { key, value })
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key.name(), self.value)
    }
}

/// Everything overridden for a run or a swarm.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Faults turned off.
    pub no_faults: Vec<FaultKind>,
    /// Options pinned, applied in order.
    pub settings: Vec<Setting>,
}

impl Overrides {
    /// Whether nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self.no_faults.is_empty() && self.settings.is_empty()
    }

    /// The command-line arguments that repeat these overrides (for replay commands).
    pub fn arguments(&self) -> String {
        let mut args = String::new();
        for kind in &self.no_faults {
            args.push_str(&format!(" --no-fault {kind}"));
        }
        for setting in &self.settings {
            args.push_str(&format!(" --set {setting}"));
        }
        args
    }

    /// Applies the overrides to a seed's draw.
    pub fn apply(&self, options: &mut Options) {
        for kind in &self.no_faults {
            match kind {
                FaultKind::Loss => options.net.loss = Ratio::ZERO,
                FaultKind::Duplication => options.net.duplicate = Ratio::ZERO,
                FaultKind::Reordering => options.net.reorder = Ratio::ZERO,
                FaultKind::Partitions => options.partitions = None,
                FaultKind::DirectoryCrashes => options.directory_crashes = None,
                FaultKind::HostCrashes => options.host_crashes = None,
                FaultKind::RouteFlaps => options.route_flaps = None,
                FaultKind::ActorDeaths => options.actor_deaths = None,
                FaultKind::ProxyRestarts => options.proxy_restarts = None,
                FaultKind::AuthorityOutages => options.authority_outages = None,
                FaultKind::DiscoveryLag => options.proxy.discovery_lag_max = Duration::ZERO,
                FaultKind::Revocations => options.revocations = None,
                FaultKind::Spoofs => options.spoofs = None,
                FaultKind::FileChanges => options.file_changes = None,
                FaultKind::Stalls => options.stalls = None,
                FaultKind::SlowSyncs => options.disk.slow_sync = None,
                FaultKind::Churn => options.late_joins.clear(),
                FaultKind::AimedCrashes => options.aimed_crashes = false,
                FaultKind::HostPauses => options.host_pauses = None,
                FaultKind::FsyncFailures => options.disk.fsync_failure = Ratio::ZERO,
                FaultKind::CompactionCrashes => options.disk.compaction_crash = Ratio::ZERO,
                FaultKind::FullDisk => options.disk.full_disk = None,
                FaultKind::Rot => options.disk.rot = Ratio::ZERO,
                FaultKind::HostileChildren => options.host.corrupt = Ratio::ZERO,
                FaultKind::DyingChildren => options.host.abrupt_close = Ratio::ZERO,
                FaultKind::Registrar => options.registrar = RegistrarOptions::PROMPT,
                FaultKind::DiscoveryRepeats => options.discovery_repeat_permille = 0,
                FaultKind::Clocks => {
                    for clock in &mut options.clocks {
                        *clock = NodeClock::EXACT;
                    }
                }
            }
        }
        let ppm = Ratio::ppm;
        for Setting { key, value } in &self.settings {
            let value = *value;
            match key {
                SetKey::FaultPhaseMs => options.fault_phase = Duration::from_millis(value),
                SetKey::DirectoryRetryMs => options.directory_retry = Duration::from_millis(value),
                SetKey::RetryBatch => options.retry_batch = value as usize,
                SetKey::DeadlineMs => options.proxy.deadline = Duration::from_millis(value),
                SetKey::ProxyRetryMs => options.proxy.retry_period = Duration::from_millis(value),
                SetKey::LossPpm => options.net.loss = ppm(value),
                SetKey::DuplicationPpm => options.net.duplicate = ppm(value),
                SetKey::ReorderingPpm => options.net.reorder = ppm(value),
                SetKey::Hosts => {
                    // Fewer hosts: every per-host draw keeps its first entries.
                    let hosts = (value as usize).min(options.clients_per_host.len());
                    options.clients_per_host.truncate(hosts);
                    options.host.workers.truncate(hosts);
                    options.clocks.truncate(hosts + 1);
                    // The late joiners stay the last hosts, and one host is there from the
                    // start.
                    let late = options.late_joins.len().min(hosts.saturating_sub(1));
                    options.late_joins.truncate(late);
                }
                SetKey::ClientsMax => {
                    for clients in &mut options.clients_per_host {
                        *clients = (*clients).min(value as u32);
                    }
                }
                SetKey::WorkersMax => {
                    for workers in &mut options.host.workers {
                        *workers = (*workers).min(value as u32);
                    }
                }
                SetKey::Paths => {
                    let paths = (value as usize).min(options.paths.len());
                    options.paths.truncate(paths);
                }
                SetKey::CompactMinBytes => options.disk.compact_min_bytes = value,
                SetKey::ThinkMs => options.workload.think_mean = Duration::from_millis(value),
                SetKey::WorkerThinkMs => options.host.think_mean = Duration::from_millis(value),
                SetKey::Replicas => options.replicas = value as usize,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_settings_parse_and_print_back() {
        for (kind, name) in FaultKind::ALL {
            assert_eq!(name.parse::<FaultKind>().unwrap(), kind);
            assert_eq!(kind.to_string(), name);
        }
        let setting: Setting = "retry_batch=3".parse().unwrap();
        assert_eq!(setting.to_string(), "retry_batch=3");
        assert!("retry_batch=0".parse::<Setting>().is_err());
        assert!("nonsense=1".parse::<Setting>().is_err());
        assert!("loss_ppm=-1".parse::<Setting>().is_err());
        assert!("loss_ppm".parse::<Setting>().is_err());
        assert!("crashes".parse::<FaultKind>().is_err());
    }

    #[test]
    fn overrides_change_only_what_they_name() {
        let drawn = Options::draw(7);
        let mut options = drawn.clone();
        let overrides = Overrides {
            no_faults: vec![FaultKind::Loss, FaultKind::Clocks, FaultKind::HostCrashes],
            settings: vec!["retry_batch=2".parse().unwrap()],
        };
        overrides.apply(&mut options);
        assert_eq!(options.net.loss, Ratio::ZERO);
        assert!(options.clocks.iter().all(|c| *c == NodeClock::EXACT));
        assert_eq!(options.host_crashes, None);
        assert_eq!(options.retry_batch, 2);
        assert_eq!(options.paths, drawn.paths);
        assert_eq!(options.workload, drawn.workload);
        assert_eq!(options.directory_crashes, drawn.directory_crashes);
        assert_eq!(
            overrides.arguments(),
            " --no-fault loss --no-fault clocks --no-fault host-crashes --set retry_batch=2"
        );
    }
}

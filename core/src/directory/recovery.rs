//! Recovery (SPEC §3.4, DESIGN.md §3–§4): a pure function from durable records to a serving
//! directory.
//!
//! Records are applied in order through the same [`DurableState::apply`] the live directory
//! uses. Sources are recreated through a caller-supplied hook; obligations enter the retry
//! rotation in persisted order (Q13); fences are rebuilt for displacement obligations that were
//! fencing a path whose node still has the displaced revision. The new epoch is the first
//! effect, a `Persist` barrier, so nothing is served before it is durable.

use std::collections::BTreeSet;
use std::fmt;

use super::durable::{DurableState, ObligationKey};
use super::obligations::Engine;
use super::{Directory, DirectoryConfig, Fence, SourceState};
use crate::effect::Outbox;
use crate::error::Reason;
use crate::ids::{Address, AuthorityEpoch, NodeId};
use crate::log::{Entry, LogRecord};
use crate::path::DataPath;
use crate::time::Instant;
use crate::wire::{BlobBinding, SourceRecovery};

/// A source recreated at recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveredSource {
    /// The serving actor.
    pub actor: Address,
    /// Its node.
    pub node: NodeId,
    /// The owner to report.
    pub owner: Option<Address>,
}

/// Recreates runtime sources from recovery records. Must be deterministic.
pub trait SourceRecoveryHook {
    /// A source for the binding at `path`, or why there is none.
    fn recover(
        &mut self,
        path: &DataPath,
        recovery: &SourceRecovery,
        length: u64,
    ) -> Result<RecoveredSource, Reason>;
}

/// The default hook: `Actor` records name their source; `File` records name the persistent
/// actor of the host that serves the file (issue 17), so both recover the registered source.
#[derive(Clone, Copy, Debug, Default)]
pub struct ActorSources;

impl SourceRecoveryHook for ActorSources {
    fn recover(
        &mut self,
        _path: &DataPath,
        recovery: &SourceRecovery,
        _length: u64,
    ) -> Result<RecoveredSource, Reason> {
        match recovery {
            SourceRecovery::Actor { actor, node, owner } => Ok(RecoveredSource {
                actor: *actor,
                node: *node,
                owner: *owner,
            }),
            // The file's host serves it from a persistent actor, in every life of its node.
            SourceRecovery::File { source, .. } => Ok(RecoveredSource {
                actor: *source,
                node: source.node,
                owner: None,
            }),
        }
    }
}

/// Why a directory could not be recovered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// Record `index` does not fit the state built from the records before it.
    Inconsistent {
        /// Position of the refused record.
        index: usize,
        /// What did not fit.
        reason: &'static str,
    },
    /// The epoch counter cannot advance.
    EpochExhausted,
    /// A directory asked to serve at an epoch not above the one its records reached.
    EpochNotAbove {
        /// The epoch asked for.
        epoch: AuthorityEpoch,
        /// The records' epoch.
        recorded: AuthorityEpoch,
    },
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryError::Inconsistent { index, reason } => {
                write!(f, "log record {index} is inconsistent: {reason}")
            }
            RecoveryError::EpochExhausted => f.write_str("authority epoch space exhausted"),
            RecoveryError::EpochNotAbove { epoch, recorded } => write!(
                f,
                "cannot serve at epoch {epoch}: the records already reached {recorded}"
            ),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Replays `records` into a durable state.
pub fn replay_records(records: &[LogRecord]) -> Result<DurableState, RecoveryError> {
    let mut durable = DurableState::default();
    for (index, record) in records.iter().enumerate() {
        durable
            .apply(record)
            .map_err(|e| RecoveryError::Inconsistent { index, reason: e.0 })?;
    }
    Ok(durable)
}

impl Directory {
    /// Rebuilds a directory from its durable records and starts it: emits the `Persist` of the
    /// new epoch, the retry timer, the route watches and the first retry pass into `out`.
    pub fn recover(
        config: DirectoryConfig,
        records: &[LogRecord],
        hook: &mut dyn SourceRecoveryHook,
        now: Instant,
        out: &mut Outbox,
    ) -> Result<Directory, RecoveryError> {
        Directory::recover_after_loss(config, records, 0, hook, now, out)
    }

    /// [`Directory::recover`] after a repair that may have cut up to `lost` synced records
    /// (`Recovered::lost_bound`): the epoch skips `lost` past the records' own, so an epoch
    /// the cut records served (and a stream incarnation minted in it) is never served again.
    pub fn recover_after_loss(
        config: DirectoryConfig,
        records: &[LogRecord],
        lost: u64,
        hook: &mut dyn SourceRecoveryHook,
        now: Instant,
        out: &mut Outbox,
    ) -> Result<Directory, RecoveryError> {
        let durable = replay_records(records)?;
        let epoch = match durable
            .epoch()
            .0
            .checked_add(lost)
            .and_then(|e| e.checked_add(1))
        {
            Some(next) => AuthorityEpoch(next),
            None => return Err(RecoveryError::EpochExhausted),
        };
        Ok(Directory::start(config, durable, epoch, hook, now, out))
    }

    /// [`Directory::recover`] at a given epoch: a replicated directory's leader serves at its
    /// term (issue 19), which the proxies already treat as the fencing token. Refused unless
    /// `epoch` is above the records' own, so an epoch never repeats nor goes back.
    pub fn recover_in_epoch(
        config: DirectoryConfig,
        records: &[LogRecord],
        epoch: AuthorityEpoch,
        hook: &mut dyn SourceRecoveryHook,
        now: Instant,
        out: &mut Outbox,
    ) -> Result<Directory, RecoveryError> {
        let durable = replay_records(records)?;
        if epoch <= durable.epoch() {
            return Err(RecoveryError::EpochNotAbove {
                epoch,
                recorded: durable.epoch(),
            });
        }
        Ok(Directory::start(config, durable, epoch, hook, now, out))
    }

    /// Starts serving `durable` at `epoch` (above its own).
    fn start(
        config: DirectoryConfig,
        durable: DurableState,
        epoch: AuthorityEpoch,
        hook: &mut dyn SourceRecoveryHook,
        now: Instant,
        out: &mut Outbox,
    ) -> Directory {
        let mut directory = Directory {
            config,
            durable,
            sources: Default::default(),
            streams: Default::default(),
            fences: Default::default(),
            engine: Engine::default(),
            no_space: None,
        };
        directory.commit(LogRecord::EpochAdvanced { epoch }, out);
        directory.recover_sources(hook);
        directory.rebuild_fences();
        let keys: Vec<ObligationKey> = directory
            .durable
            .obligations_in_order()
            .map(|(key, _)| key)
            .collect();
        for key in keys {
            directory.track_obligation(key, out);
        }
        directory.arm_timer(now, out);
        directory.retry_pass(out);
        directory
    }

    fn recover_sources(&mut self, hook: &mut dyn SourceRecoveryHook) {
        for (path, entry) in self.durable.entries() {
            let Entry::Blob {
                length,
                revision,
                recovery,
            } = entry
            else {
                continue;
            };
            let state = match hook.recover(path, recovery, *length) {
                Ok(source) => SourceState::Available(BlobBinding {
                    source: source.actor,
                    source_node: source.node,
                    owner: source.owner,
                    length: *length,
                    revision: *revision,
                }),
                Err(reason) => SourceState::Unavailable(reason),
            };
            self.sources.insert(path.clone(), state);
        }
    }

    /// A displacement that was fencing a path whose node still has the displaced revision
    /// fences it again (no old rendezvous, no held opens).
    fn rebuild_fences(&mut self) {
        for (key, fence) in self.durable.obligations_in_order() {
            let (ObligationKey::Displace(endpoint, incarnation), Some(path)) = (key, fence) else {
                continue;
            };
            let node_matches = matches!(
                self.durable.entry(path),
                Some(Entry::Stream { revision }) if *revision == incarnation.revision
            );
            if !node_matches {
                continue;
            }
            let fence = self.fences.entry(path.clone()).or_insert_with(|| Fence {
                incarnation,
                endpoints: BTreeSet::new(),
                old: None,
                held: Vec::new(),
            });
            if fence.incarnation == incarnation {
                fence.endpoints.insert(endpoint);
            }
        }
    }
}

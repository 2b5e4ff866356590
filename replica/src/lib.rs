//! The directory's replicated log (issue 19): one replica of a Raft group, as a sans-IO
//! machine over tikv's `raft` engine (`RawNode`), and the directory on top of it
//! ([`ReplicatedDirectory`], `directory.rs`).
//!
//! The driving contract is the one of every machine here, with the engine's two halves kept
//! apart:
//!
//! ```text
//! tick() / step(message) / propose(bytes)      inputs
//! ready() -> Ready                             one round of output:
//!     send     may leave now (a leader's appends leave before its own fsync)
//!     apply    committed entries, to apply now (all of them durable here already)
//!     snapshot, entries, hard_state            must be durable before ...
//!     compacted                                the driver's copy of its disk drops what a
//!                                              snapshot of this replica's own covers
//! persisted(ready) -> Vec<WireMessage>         ... this, which releases what waited for the
//!                                              disk (votes, append acknowledgements); then
//!                                              ready() again (a leader may commit now)
//! ```
//!
//! **Snapshots.** The replicated directory takes a snapshot of its applied state every
//! [`ReplicaConfig::snapshot_every`] entries ([`Replica::compact`]); the engine's log then
//! starts a few entries ([`ReplicaConfig::snapshot_keep`]) before it, and a follower that lags
//! further is sent the snapshot, in chunks ([`SnapshotChunk`]). The engine's log lives in this
//! crate's own store (`storage.rs`), which keeps the term of the entry before the first one
//! kept. A round that installs a leader's snapshot is applied once it is durable.
//!
//! Rounds are persisted in order; this wrapper's drivers keep one in flight. Inputs may be
//! fed while a round is being written (the engine keeps the round's entries in its in-memory
//! storage at once, `advance_append_async`, and learns of the fsync from `persisted`,
//! `on_persist_ready`). A crash before `persisted` loses that round's entries and hard state,
//! and nothing that depended on them has left.
//!
//! **Why a crate of its own.** `core/` is pure; the engine draws its randomised election
//! timeout from `thread_rng` (and logs through slog). This crate pins the timeout: the engine
//! draws from `[min, max)`, and `max = min + 1` leaves it one value, [`ReplicaConfig::election_ticks`],
//! which drivers choose per replica (the simulator from its seed). The engine's maps hash with
//! FxHash, whose order does not depend on the process, so a run is a function of its inputs.
//!
//! **Trust.** Replicas trust one another as a node trusts its own disk: the engine asserts
//! (and so panics) on some inputs no correct replica sends, such as a heartbeat committing
//! past the follower's log. Frames between replicas are authenticated like every other link
//! of the cluster; [`WireMessage::decode`] refuses malformed or oversized frames and the
//! engine's local messages with a typed error before the engine sees them.

mod directory;
mod disk;
mod hosts;
mod storage;
mod wire;

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState, HardState,
    MessageType, Snapshot,
};
use raft::{Config, RawNode, SnapshotStatus, StateRole};

pub use dataplane_core::log::ReplicaConf;
pub use directory::{Admitted, IN_FLIGHT_MAX, NotServing, READS_WAITING_MAX, ReplicatedDirectory};
pub use disk::{DiskRecord, round_records};
pub use hosts::{HostIo, HostSide, HostSideConfig, Serving};
pub use wire::{
    EntryKind, FRAME_MAX, Kind, LogEntry, SNAPSHOT_BYTES_MAX, SNAPSHOT_CHUNK_BYTES, SnapshotChunk,
    WireError, WireMessage,
};

use storage::Store;

/// A leader keeps up to this many times [`ReplicaConfig::snapshot_keep`] entries before a
/// snapshot for a follower that is catching up.
const LAGGING_KEEP_FACTOR: u64 = 8;

/// A replica's id in its group (never 0).
pub type ReplicaId = u64;

/// How one replica runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// This replica.
    pub id: ReplicaId,
    /// The voters of the group's first configuration.
    pub voters: Vec<ReplicaId>,
    /// Ticks without hearing a leader before this replica campaigns. Pinned: choose a different
    /// value per replica (the simulator draws them from its seed; the real nodes will derive
    /// them from the id), or the replicas split their votes for ever.
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats (below `election_ticks`).
    pub heartbeat_ticks: usize,
    /// Entries applied since the last snapshot before the replicated directory takes the next
    /// one and compacts its log (0: never).
    pub snapshot_every: u64,
    /// Entries a compaction keeps before the snapshot's index, so that a follower a little
    /// behind is sent entries rather than the whole state.
    pub snapshot_keep: u64,
}

impl ReplicaConfig {
    /// The defaults of a real node's replica: a snapshot every 10,000 entries, keeping the
    /// last 5,000 (etcd's catch-up margin).
    pub fn new(
        id: ReplicaId,
        voters: Vec<ReplicaId>,
        election_ticks: usize,
        heartbeat_ticks: usize,
    ) -> Self {
        ReplicaConfig {
            id,
            voters,
            election_ticks,
            heartbeat_ticks,
            snapshot_every: 10_000,
            snapshot_keep: 5_000,
        }
    }
}

/// A snapshot of the replicated state up to `index`: the state machine's bytes, and the
/// group's configuration there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotData {
    /// The last entry it covers.
    pub index: u64,
    /// That entry's term.
    pub term: u64,
    /// The group's configuration at `index`.
    pub conf: ReplicaConf,
    /// The state machine's state (its own encoding).
    pub data: Vec<u8>,
}

/// A replica took a snapshot of its applied state ([`Ready::compacted`]): the snapshot
/// replaces the one before and the entries before `keep_from` go. Nothing waits for it to be
/// durable: the entries it replaces are on the disk until a compaction of the disk's log
/// restates the snapshot instead ([`Durable::snapshot_records`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// The snapshot.
    pub snapshot: SnapshotData,
    /// The first entry kept.
    pub keep_from: u64,
}

/// The engine's durable vote and term, and the commit index it last reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardStateRecord {
    /// The current term.
    pub term: u64,
    /// Whom this replica voted for in `term` (0: nobody).
    pub vote: ReplicaId,
    /// The highest index known committed.
    pub commit: u64,
}

/// What a replica's disk held when it starts again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    /// The last hard state made durable.
    pub hard_state: HardStateRecord,
    /// The latest snapshot, if the log was ever compacted.
    pub snapshot: Option<SnapshotData>,
    /// The index and term of the entry before the first one kept ((0, 0): none compacted;
    /// at most the snapshot's index).
    pub start: (u64, u64),
    /// The log, from index `start.0 + 1`.
    pub entries: Vec<LogEntry>,
}

impl Durable {
    /// Makes `ready`'s durable part this disk's (what a driver does before `persisted`): an
    /// installed snapshot replaces the log, then the entries replace every entry from the
    /// first one's index on; then the round's compaction, if any, drops what it covers.
    pub fn write(&mut self, ready: &Ready) {
        if let Some(snapshot) = &ready.snapshot {
            self.install(snapshot.clone());
        }
        self.write_parts(&ready.entries, ready.hard_state);
        if let Some(compaction) = &ready.compacted {
            self.compact(compaction);
        }
    }

    /// [`Durable::write`] from a round's entries and hard state.
    pub fn write_parts(&mut self, entries: &[LogEntry], hard_state: Option<HardStateRecord>) {
        if let Some(first) = entries.first() {
            let keep =
                usize::try_from(first.index.saturating_sub(self.start.0 + 1)).unwrap_or(usize::MAX);
            self.entries.truncate(keep);
            self.entries.extend(entries.iter().cloned());
        }
        if let Some(hs) = hard_state {
            self.hard_state = hs;
        }
    }

    /// A snapshot installed from the leader: it replaces the snapshot and every entry.
    pub fn install(&mut self, snapshot: SnapshotData) {
        self.start = (snapshot.index, snapshot.term);
        self.entries.clear();
        self.snapshot = Some(snapshot);
    }

    /// This replica's own snapshot ([`Ready::compacted`]): it replaces the one before, and
    /// the entries before `keep_from` go.
    pub fn compact(&mut self, compaction: &Compaction) {
        if compaction.keep_from > self.start.0 + 1 {
            let drop = usize::try_from(compaction.keep_from - 1 - self.start.0)
                .unwrap_or(usize::MAX)
                .min(self.entries.len());
            if drop > 0 {
                let before = &self.entries[drop - 1];
                self.start = (before.index, before.term);
                self.entries.drain(..drop);
            }
        }
        self.snapshot = Some(compaction.snapshot.clone());
    }

    /// The index of the last entry (the snapshot's, or 0, if none follows it).
    pub fn last_index(&self) -> u64 {
        self.entries.last().map_or(self.start.0, |e| e.index)
    }
}

/// One change of the group's voters (several at once go through joint consensus).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// A replica becomes a voter (it is sent the leader's snapshot, then the log).
    AddVoter(ReplicaId),
    /// A voter leaves the group.
    RemoveVoter(ReplicaId),
}

/// The engine's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Follows a leader (or waits for one).
    Follower,
    /// Asks for pre-votes before campaigning.
    PreCandidate,
    /// Campaigns.
    Candidate,
    /// Leads its term.
    Leader,
}

/// Why an input was refused (it changed nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaError {
    /// A proposal reached a replica that does not lead; the leader it knows, if any.
    NotLeader(Option<ReplicaId>),
    /// A message addressed to another replica.
    WrongReplica {
        /// Whom it was for.
        to: ReplicaId,
    },
    /// A response from a replica outside the group.
    UnknownPeer(ReplicaId),
    /// The engine refused the input.
    Refused(String),
    /// The durable state a replica was started from is not a log (a gap, or an index 0).
    BadDurable(String),
    /// The leader commits past this replica's log: it lost entries it had acknowledged (its
    /// disk, a repair, or its driver failed it). It must not vote again before it rejoined
    /// ([`Replica::start_joining`]).
    LostEntries {
        /// What the leader committed for it.
        commit: u64,
        /// Its last entry.
        last: u64,
    },
}

impl std::fmt::Display for ReplicaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicaError::NotLeader(Some(l)) => write!(f, "not the leader (replica {l} is)"),
            ReplicaError::NotLeader(None) => write!(f, "not the leader (none known)"),
            ReplicaError::WrongReplica { to } => write!(f, "a message for replica {to}"),
            ReplicaError::UnknownPeer(p) => {
                write!(f, "a response from replica {p}, not in the group")
            }
            ReplicaError::Refused(why) => write!(f, "the engine refused the input: {why}"),
            ReplicaError::BadDurable(why) => {
                write!(f, "the replica's durable log is not a log: {why}")
            }
            ReplicaError::LostEntries { commit, last } => write!(
                f,
                "the leader committed up to {commit} for this replica, whose log ends at \
                 {last}: it lost entries it had acknowledged, and may vote again only once it \
                 rejoined and caught up (dataplane-node: it stops, and rejoins as a non-voter when \
                 started again)"
            ),
        }
    }
}

impl std::error::Error for ReplicaError {}

/// One round of a replica's output (see the crate's documentation).
#[derive(Debug)]
pub struct Ready {
    /// Messages that may leave now.
    pub send: Vec<WireMessage>,
    /// A snapshot installed from the leader: the state to restore before applying anything
    /// more; it replaces the log, and must be durable (before `entries`) before `persisted`.
    pub snapshot: Option<SnapshotData>,
    /// Committed entries to apply now, in order.
    pub apply: Vec<LogEntry>,
    /// A snapshot this replica took of its own applied state (the replicated directory's
    /// compaction policy): the driver's copy of the disk drops what it covers. Nothing waits
    /// for it.
    pub compacted: Option<Compaction>,
    /// Entries to make durable (replacing every entry from the first one's index on).
    pub entries: Vec<LogEntry>,
    /// The hard state to make durable, if it changed.
    pub hard_state: Option<HardStateRecord>,
    /// Reads this leader asked the group to confirm ([`Replica::read_index`]) that a quorum
    /// confirmed: each read's number and the commit index when it was asked.
    pub reads: Vec<(u64, u64)>,
    /// Messages that leave only once `entries` and `hard_state` are durable.
    after_persist: Vec<WireMessage>,
    /// The engine's number for the round.
    number: u64,
    /// The round installs a snapshot: applied once durable.
    apply_on_persist: bool,
}

/// One replica.
pub struct Replica {
    node: RawNode<Store>,
    id: ReplicaId,
    /// Entries kept before a snapshot's index ([`ReplicaConfig::snapshot_keep`]).
    snapshot_keep: u64,
    /// [`ReplicaConfig::snapshot_every`].
    snapshot_every: u64,
    /// A snapshot arriving in chunks from the leader.
    assembly: Option<Assembly>,
    /// Rejoining after losing its disk ([`Replica::start_joining`]).
    joining: Option<Joining>,
    /// A replica that rejoined never votes in a term up to this one (it may have voted in
    /// them before it lost its disk).
    no_votes_up_to: u64,
}

/// A snapshot arriving from the leader, chunk after chunk ([`SnapshotChunk`]).
#[derive(Debug)]
struct Assembly {
    /// The sender, its term, and the snapshot's index and term.
    key: (ReplicaId, u64, u64, u64),
    conf: ReplicaConf,
    len: u64,
    data: Vec<u8>,
}

/// A replica that lost its disk and rejoins its group under its old id: it forgot its log and
/// its votes, so until it holds everything committed when it first heard a leader it neither
/// votes nor campaigns (an amnesiac voter could elect a replica that lacks acknowledged
/// entries), and it never votes in a term up to the one of that leader (it may have voted in
/// it before).
#[derive(Clone, Copy, Debug)]
struct Joining {
    /// The first leader's term and commit, once heard.
    target: Option<(u64, u64)>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.id)
            .field("term", &self.term())
            .field("role", &self.role())
            .field("commit", &self.commit())
            .field("last", &self.last_index())
            .finish_non_exhaustive()
    }
}

impl Replica {
    /// Starts replica `config.id` from what its disk holds (`Durable::default()` for a new
    /// group). Its committed entries are handed back to apply again, from index 1: the state
    /// machine is rebuilt from the log.
    pub fn start(config: &ReplicaConfig, durable: &Durable) -> Result<Replica, ReplicaError> {
        disk::check(durable)?;
        let entries: Vec<_> = durable
            .entries
            .iter()
            .cloned()
            .map(wire::into_raft_entry)
            .collect();
        let mut hs = durable.hard_state;
        let (conf_state, snapshot, applied) = match &durable.snapshot {
            Some(s) => {
                // A snapshot holds committed state only. A round that installed one and was
                // cut before its hard state leaves an older hard state: the commit moves up
                // to the snapshot, and the term too (this replica never voted in the
                // snapshot's term without writing the vote, so it voted for nobody there).
                hs.commit = hs.commit.max(s.index);
                if hs.term < s.term {
                    hs.term = s.term;
                    hs.vote = 0;
                }
                (conf_state(&s.conf), Some(raft_snapshot(s)), s.index)
            }
            None => (
                ConfState::from((config.voters.clone(), Vec::new())),
                None,
                0,
            ),
        };
        let storage = Store::new(
            conf_state,
            HardState {
                term: hs.term,
                vote: hs.vote,
                commit: hs.commit,
                ..HardState::default()
            },
            snapshot,
            durable.start,
            entries,
        );
        let raft_config = Config {
            id: config.id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            min_election_tick: config.election_ticks,
            max_election_tick: config.election_ticks + 1,
            // Below the nodes' frame bound (1 MiB) with room for the message around the entries.
            max_size_per_msg: 256 << 10,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            applied,
            // Proposals not yet committed are bounded: past this the engine refuses new ones
            // (`propose` answers `Refused`) until the log catches up.
            max_uncommitted_size: 64 << 20,
            ..Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&raft_config, storage, &logger)
            .map_err(|e| ReplicaError::Refused(e.to_string()))?;
        Ok(Replica {
            node,
            id: config.id,
            snapshot_keep: config.snapshot_keep,
            snapshot_every: config.snapshot_every,
            assembly: None,
            joining: None,
            no_votes_up_to: 0,
        })
    }

    /// [`Replica::start`] for a replica whose disk was lost (or replaced) while its group went
    /// on: it takes part only once it caught up (see [`Replica::is_joining`]). A new group must
    /// start with [`Replica::start`]: replicas that all wait for a leader never elect one.
    pub fn start_joining(
        config: &ReplicaConfig,
        durable: &Durable,
    ) -> Result<Replica, ReplicaError> {
        // With nothing on its disk it knows no configuration either (it may be a replica the
        // group never had): it learns the group's from the leader's snapshot, which every
        // replica with an empty log is sent (the log's first entries are always compacted).
        let mut replica = if durable == &Durable::default() {
            Replica::start(
                &ReplicaConfig {
                    voters: Vec::new(),
                    ..config.clone()
                },
                durable,
            )?
        } else {
            Replica::start(config, durable)?
        };
        replica.joining = Some(Joining { target: None });
        Ok(replica)
    }

    /// Whether it is still catching up after [`Replica::start_joining`]: it neither votes
    /// nor campaigns until it holds every entry committed when it first heard a leader.
    pub fn is_joining(&self) -> bool {
        self.joining.is_some()
    }

    /// This replica's id.
    pub fn id(&self) -> ReplicaId {
        self.id
    }

    /// Its current term.
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// Its role.
    pub fn role(&self) -> Role {
        match self.node.raft.state {
            StateRole::Follower => Role::Follower,
            StateRole::PreCandidate => Role::PreCandidate,
            StateRole::Candidate => Role::Candidate,
            StateRole::Leader => Role::Leader,
        }
    }

    /// The leader it knows in its term, if any.
    pub fn leader(&self) -> Option<ReplicaId> {
        match self.node.raft.leader_id {
            0 => None,
            id => Some(id),
        }
    }

    /// Its commit index.
    pub fn commit(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The index of its last entry.
    pub fn last_index(&self) -> u64 {
        self.node.raft.raft_log.last_index()
    }

    /// One tick of its clock (a joining replica's election clock stands still).
    pub fn tick(&mut self) {
        if self.joining.is_none() {
            self.node.tick();
        }
    }

    /// Whether it leads and may take proposals (not while it hands its leadership over).
    pub fn may_propose(&self) -> bool {
        self.role() == Role::Leader
            && self.node.raft.prs().conf().voters().contains(self.id)
            && self.node.raft.lead_transferee.is_none()
    }

    /// Hands the leadership to voter `to` (the engine's leader transfer: `to` is told to
    /// campaign at once, and wins, holding the whole log). Refused unless this replica may
    /// take proposals, `to` is another voter of a configuration not in a joint change, and
    /// `to` holds every entry of this leader's log (a transfer to a replica behind would
    /// stall writes while it catches up, or be abandoned). While the transfer is under way
    /// the leader takes no proposals ([`Self::may_propose`]); the engine abandons it after
    /// an election timeout, and the leader then steps down ([`Self::resign`] is the caller's).
    pub fn transfer_leader(&mut self, to: ReplicaId) -> Result<(), ReplicaError> {
        if !self.may_propose() {
            return Err(ReplicaError::NotLeader(self.leader()));
        }
        let refused = |why: String| Err(ReplicaError::Refused(why));
        if to == self.id {
            return refused(format!("replica {to} leads already"));
        }
        let conf = self.conf();
        if !conf.voters_outgoing.is_empty() {
            return refused("a membership change is under way".to_owned());
        }
        if !conf.voters.contains(&to) {
            return refused(format!("replica {to} is not a voter"));
        }
        let last = self.last_index();
        let matched = self.node.raft.prs().get(to).map_or(0, |pr| pr.matched);
        if matched < last {
            return refused(format!(
                "replica {to} holds the log up to entry {matched} of {last}: not caught up"
            ));
        }
        self.node.transfer_leader(to);
        Ok(())
    }

    /// Asks the group to confirm that this replica still leads (raft's ReadIndex in its safe
    /// mode: the next heartbeats carry `number`, and once a quorum answered them, a later
    /// round's [`Ready::reads`] holds `number` with the commit index at the time of asking). No
    /// clock is trusted: a leader cut off or paused past a later election never gets the
    /// confirmation. Only a leader that may propose asks.
    pub fn read_index(&mut self, number: u64) -> Result<(), ReplicaError> {
        if !self.may_propose() {
            return Err(ReplicaError::NotLeader(self.leader()));
        }
        self.node.read_index(number.to_le_bytes().to_vec());
        Ok(())
    }

    /// Whether a leader transfer is under way ([`Self::transfer_leader`]).
    pub fn transferring(&self) -> bool {
        self.role() == Role::Leader && self.node.raft.lead_transferee.is_some()
    }

    /// Stops leading: becomes a follower of the next term (as if it had heard of one), so
    /// that the group elects a leader (possibly this replica again, at a higher term).
    pub fn resign(&mut self) {
        if self.role() == Role::Leader {
            let term = self.term();
            self.node.raft.become_follower(term + 1, 0);
        }
    }

    /// A leader that applied its own removal steps down (the engine would keep it leading,
    /// drop its proposals, and fail on its own missing progress at the next commit): it
    /// tells the voter that holds all of its log to campaign now, and becomes a follower of
    /// the next term (it is no voter, so it never campaigns).
    fn step_down_if_removed(&mut self) {
        if self.role() != Role::Leader || self.node.raft.prs().conf().voters().contains(self.id) {
            return;
        }
        let (id, last) = (self.id, self.last_index());
        let successor = self
            .node
            .raft
            .prs()
            .iter()
            .filter(|(peer, pr)| **peer != id && pr.matched == last)
            .map(|(peer, _)| *peer)
            .min();
        if let Some(to) = successor {
            self.node.raft.send_timeout_now(to);
        }
        let term = self.term();
        self.node.raft.become_follower(term + 1, 0);
    }

    /// A message from another replica.
    pub fn step(&mut self, message: WireMessage) -> Result<(), ReplicaError> {
        if message.to != self.id {
            return Err(ReplicaError::WrongReplica { to: message.to });
        }
        let from = message.from;
        let mut message = message;
        let mut snapshot = None;
        if message.kind == Kind::Snapshot {
            match self.assemble(&mut message)? {
                Some(complete) => snapshot = Some(complete),
                // More chunks to come (or one out of order, dropped: the leader sends the
                // snapshot again once this replica refuses its next append).
                None => return Ok(()),
            }
        }
        if let Some(joining) = &mut self.joining {
            match message.kind {
                // Not a voter yet: no answer (the candidate needs the others).
                Kind::RequestVote | Kind::RequestPreVote | Kind::TimeoutNow => return Ok(()),
                // The target is the leader's commit index, which only an append carries: a
                // heartbeat carries the least of it and what the leader believes this replica
                // holds, which is 0 for a replica it knows nothing of yet (a new voter, or any
                // after the leader's own restart). Taken from a heartbeat, a join ended at
                // once, before the replica held anything, and it voted with an empty log.
                Kind::Append if joining.target.is_none() => {
                    joining.target = Some((message.term, message.commit));
                }
                _ => {}
            }
        }
        if matches!(message.kind, Kind::RequestVote | Kind::RequestPreVote)
            && message.term <= self.no_votes_up_to
        {
            return Ok(());
        }
        // A leader that believes this replica holds more than it does sends a heartbeat
        // committing past its log, on which the engine panics. Only a replica that lost
        // entries it had acknowledged gets one: a joining replica knows it did, and commits
        // what it has (the leader's probe sends it the rest); any other lost them without
        // knowing (a disk that lied about a sync, a repair that cut synced entries, a driver
        // that acknowledged before its sync), and must stop voting: refused.
        if message.kind == Kind::Heartbeat && message.commit > self.last_index() {
            if self.joining.is_none() {
                return Err(ReplicaError::LostEntries {
                    commit: message.commit,
                    last: self.last_index(),
                });
            }
            message.commit = self.last_index();
        }
        let mut raft_message = message.into_raft();
        if let Some(snapshot) = snapshot {
            raft_message.set_snapshot(snapshot);
        }
        let result = self.node.step(raft_message);
        if let Some(Joining {
            target: Some((term, commit)),
        }) = self.joining
            && self.commit() >= commit
        {
            // Caught up: a voter again, but never in a term up to the first leader's.
            self.joining = None;
            self.no_votes_up_to = term.max(self.term());
        }
        match result {
            Ok(()) => Ok(()),
            Err(raft::Error::StepPeerNotFound) => Err(ReplicaError::UnknownPeer(from)),
            Err(e) => Err(ReplicaError::Refused(e.to_string())),
        }
    }

    /// Adds a chunk of a snapshot to the one being assembled; the engine's snapshot once its
    /// last chunk is in.
    fn assemble(&mut self, message: &mut WireMessage) -> Result<Option<Snapshot>, ReplicaError> {
        let Some(chunk) = message.snapshot.take() else {
            return Err(ReplicaError::Refused(
                "a snapshot message without a snapshot".into(),
            ));
        };
        let bytes = chunk.bytes.len() as u64;
        if chunk.len > SNAPSHOT_BYTES_MAX as u64
            || bytes > SNAPSHOT_CHUNK_BYTES as u64
            || chunk
                .offset
                .checked_add(bytes)
                .is_none_or(|end| end > chunk.len)
            || (bytes == 0 && chunk.len > 0)
            || chunk.index == 0
        {
            return Err(ReplicaError::Refused(format!(
                "a snapshot chunk of {bytes} bytes at {} of {} (chunks up to {SNAPSHOT_CHUNK_BYTES} \
                 bytes, snapshots up to {SNAPSHOT_BYTES_MAX})",
                chunk.offset, chunk.len
            )));
        }
        let key = (message.from, message.term, chunk.index, chunk.term);
        if chunk.offset == 0 {
            self.assembly = Some(Assembly {
                key,
                conf: chunk.conf.clone(),
                len: chunk.len,
                data: Vec::with_capacity(
                    usize::try_from(chunk.len.min(SNAPSHOT_CHUNK_BYTES as u64)).unwrap_or(0),
                ),
            });
        }
        match &mut self.assembly {
            Some(a)
                if a.key == key && a.len == chunk.len && a.data.len() as u64 == chunk.offset =>
            {
                a.data.extend_from_slice(&chunk.bytes);
            }
            _ => return Ok(None),
        }
        if self
            .assembly
            .as_ref()
            .is_some_and(|a| (a.data.len() as u64) < a.len)
        {
            return Ok(None);
        }
        let a = self.assembly.take().expect("assembled above");
        Ok(Some(raft_snapshot(&SnapshotData {
            index: chunk.index,
            term: chunk.term,
            conf: a.conf,
            data: a.data,
        })))
    }

    /// Takes a snapshot of the state machine as applied up to `index` (its bytes, `data`):
    /// it becomes the snapshot a lagging follower is sent, and the log before
    /// `index + 1 - snapshot_keep` goes. The driver's copy of the disk does the same
    /// ([`Durable::compact`]) with what this returns.
    pub fn compact(&mut self, index: u64, data: Vec<u8>) -> Result<Compaction, ReplicaError> {
        self.compact_keeping(index, data, self.snapshot_keep)
    }

    /// [`Self::compact`], keeping `keep` entries before the snapshot's index (0: none, so
    /// that a replica with an empty log is sent the snapshot, with the configuration in it).
    pub fn compact_keeping(
        &mut self,
        index: u64,
        data: Vec<u8>,
        keep: u64,
    ) -> Result<Compaction, ReplicaError> {
        let applied = self.node.raft.raft_log.applied;
        let store = self.node.store();
        let current = store.snapshot_index();
        if index > applied || index <= current {
            return Err(ReplicaError::Refused(format!(
                "a snapshot at {index}: not in ({current}, applied {applied}]"
            )));
        }
        if data.len() > SNAPSHOT_BYTES_MAX {
            return Err(ReplicaError::Refused(format!(
                "a snapshot of {} bytes (limit {SNAPSHOT_BYTES_MAX})",
                data.len()
            )));
        }
        let term = store
            .term_at(index)
            .ok_or_else(|| ReplicaError::Refused(format!("no term for entry {index}")))?;
        let snapshot = SnapshotData {
            index,
            term,
            conf: conf_record(&self.node.raft.prs().conf().to_conf_state()),
            data,
        };
        let mut keep_from = (index + 1).saturating_sub(keep);
        if self.role() == Role::Leader && keep > 0 {
            // A leader keeps what a follower that is catching up still needs, up to a bound
            // (one further behind is sent the snapshot): without this, a follower that just
            // installed a snapshot is sent another whenever the leader compacts faster than
            // the follower catches up, and never catches up under load.
            let id = self.id;
            let needed = self
                .node
                .raft
                .prs()
                .iter()
                .filter(|(peer, pr)| **peer != id && pr.recent_active && pr.matched > 0)
                .map(|(_, pr)| pr.matched + 1)
                .min();
            if let Some(needed) = needed {
                let bound = (index + 1).saturating_sub(keep.saturating_mul(LAGGING_KEEP_FACTOR));
                keep_from = keep_from.min(needed.max(bound));
            }
        }
        let keep_from = keep_from.max(self.first_kept()).min(index + 1);
        self.node
            .mut_store()
            .compact(raft_snapshot(&snapshot), keep_from);
        Ok(Compaction {
            snapshot,
            keep_from,
        })
    }

    /// The first entry this replica still holds.
    fn first_kept(&self) -> u64 {
        raft::Storage::first_index(self.node.store()).unwrap_or(1)
    }

    /// The latest snapshot (taken or installed), if any.
    pub fn snapshot(&self) -> Option<SnapshotData> {
        let store = self.node.store();
        if store.snapshot_index() == 0 {
            return None;
        }
        raft::Storage::snapshot(store, 0, self.id)
            .ok()
            .map(|s| snapshot_data(&s))
    }

    /// [`ReplicaConfig::snapshot_keep`].
    pub fn snapshot_keep(&self) -> u64 {
        self.snapshot_keep
    }

    /// [`ReplicaConfig::snapshot_every`].
    pub fn snapshot_every(&self) -> u64 {
        self.snapshot_every
    }

    /// The latest snapshot's index (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.node.store().snapshot_index()
    }

    /// The driver could not deliver a message to `peer` (its connection broke, or it is not
    /// connected). A leader then probes it again from where it last knew it was, instead of
    /// assuming it holds everything it acknowledged: a peer that restarted without its disk
    /// is sent its log again (without this, an idle leader only learns it at the next
    /// proposal).
    pub fn report_unreachable(&mut self, peer: ReplicaId) {
        self.node.report_unreachable(peer);
    }

    /// A (new) connection to `peer` is up: a leader probes it now from where it last knew it
    /// was ([`Self::report_unreachable`], then one append). A peer that restarted with less
    /// than it had acknowledged (its disk lost) refuses the probe and is sent its log again;
    /// without this an idle leader, believing it holds everything, would send it nothing.
    pub fn peer_connected(&mut self, peer: ReplicaId) {
        if self.role() == Role::Leader
            && peer != self.id
            && self.node.raft.prs().get(peer).is_some()
        {
            self.node.report_unreachable(peer);
            // What the leader knew the peer held may be gone with its disk: it keeps probing
            // from there (a peer that kept its log accepts, and is matched again at once),
            // but forgets the match, so that a peer sent a snapshot after refusing the probe
            // is probed next from the snapshot, not from the lost match (which it would never
            // refuse: the engine would wait for the next proposal to find the gap). Lowering
            // a match only delays commits, never moves one.
            if let Some(pr) = self.node.raft.mut_prs().get_mut(peer) {
                pr.matched = 0;
            }
            self.node.raft.send_append(peer);
        }
    }

    /// Proposes `data` as the next entry (only a leader takes proposals); the index it will
    /// have if it commits (it commits there only while this replica leads the same term).
    pub fn propose(&mut self, data: Vec<u8>) -> Result<u64, ReplicaError> {
        if !self.may_propose() {
            return Err(ReplicaError::NotLeader(self.leader()));
        }
        self.node
            .propose(Vec::new(), data)
            .map_err(|e| ReplicaError::Refused(e.to_string()))?;
        Ok(self.node.raft.raft_log.last_index())
    }

    /// Proposes a change of the voters (only a leader takes it; one change at a time: the
    /// engine refuses another until the last one is applied). Several changes go through
    /// joint consensus, left automatically once applied. `context` travels with the entry
    /// (the replicated directory puts the new replicas' addresses there). The index it will
    /// have if it commits.
    pub fn propose_change(
        &mut self,
        changes: &[MemberChange],
        context: Vec<u8>,
    ) -> Result<u64, ReplicaError> {
        if self.role() != Role::Leader {
            return Err(ReplicaError::NotLeader(self.leader()));
        }
        let mut cc = ConfChangeV2::default();
        cc.set_transition(ConfChangeTransition::Auto);
        cc.set_changes(
            changes
                .iter()
                .map(|c| {
                    let (id, kind) = match *c {
                        MemberChange::AddVoter(id) => (id, ConfChangeType::AddNode),
                        MemberChange::RemoveVoter(id) => (id, ConfChangeType::RemoveNode),
                    };
                    let mut single = ConfChangeSingle {
                        node_id: id,
                        ..ConfChangeSingle::default()
                    };
                    single.set_change_type(kind);
                    single
                })
                .collect(),
        );
        // The engine would take a change while another is unapplied or joint, and append an
        // empty entry in its place: refused here, before anything is appended.
        if self.node.raft.has_pending_conf() || !self.conf().voters_outgoing.is_empty() {
            return Err(ReplicaError::Refused(
                "another membership change is still pending".into(),
            ));
        }
        self.node
            .propose_conf_change(context, cc)
            .map_err(|e| ReplicaError::Refused(e.to_string()))?;
        let index = self.last_index();
        if self.node.raft.pending_conf_index != index {
            return Err(ReplicaError::Refused(
                "the engine did not take the membership change".into(),
            ));
        }
        Ok(index)
    }

    /// The group's configuration as this replica applied it.
    pub fn conf(&self) -> ReplicaConf {
        conf_record(&self.node.raft.prs().conf().to_conf_state())
    }

    /// Applies a committed membership change to the engine (every replica does, in log
    /// order). A change the engine finds invalid changes nothing, on every replica alike.
    fn apply_change(&mut self, entry: &LogEntry) {
        // Only the second format is ever proposed (`propose_change`).
        if entry.kind != EntryKind::ConfChangeV2 {
            return;
        }
        if let Ok(cc) = ConfChangeV2::parse_from_bytes(&entry.data) {
            let _ = self.node.apply_conf_change(&cc);
        }
        self.step_down_if_removed();
    }

    /// The next round of output, if there is one.
    pub fn ready(&mut self) -> Option<Ready> {
        if !self.node.has_ready() {
            return None;
        }
        let mut rd = self.node.ready();
        let mut snapshots_sent = Vec::new();
        let send = wire_messages(rd.take_messages(), &mut snapshots_sent);
        let after_persist = wire_messages(rd.take_persisted_messages(), &mut snapshots_sent);
        let snapshot = (!rd.snapshot().is_empty()).then(|| rd.snapshot().clone());
        // Only the reads this replica asked for carry an 8-byte number (a follower forwards
        // none: `read_index` is a leader's).
        let reads = rd
            .take_read_states()
            .into_iter()
            .filter_map(|rs| {
                let number = <[u8; 8]>::try_from(rs.request_ctx.as_slice()).ok()?;
                Some((u64::from_le_bytes(number), rs.index))
            })
            .collect();
        let apply = rd
            .take_committed_entries()
            .iter()
            .map(wire::from_raft_entry)
            .collect();
        let entries = rd.entries().iter().map(wire::from_raft_entry).collect();
        let hard_state = rd.hs().map(|hs| HardStateRecord {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
        });
        // The engine reads its log from its storage: the round's entries go there now (they
        // are durable only once the driver says so, `persisted`).
        {
            let store = self.node.mut_store();
            if let Some(snapshot) = &snapshot {
                store.install(snapshot.clone());
            }
            store.append(rd.entries());
            if let Some(hs) = rd.hs() {
                store.set_hard_state(hs.clone());
            }
        }
        let number = rd.number();
        self.node.advance_append_async(rd);
        // The committed entries are handed to the driver, which applies them now. A snapshot
        // counts as applied once it is durable (`persisted`): the engine applies nothing that
        // is not durable here.
        let apply_on_persist = snapshot.is_some();
        for entry in &apply {
            self.apply_change(entry);
        }
        if !apply_on_persist {
            self.node.advance_apply();
        }
        // A snapshot handed to the driver is as good as sent: the leader probes the follower
        // after it, and sends it again if the follower refuses the probe (it never got it).
        for to in snapshots_sent {
            self.node.report_snapshot(to, SnapshotStatus::Finish);
        }
        Some(Ready {
            send,
            snapshot: snapshot.as_ref().map(snapshot_data),
            apply,
            compacted: None,
            entries,
            hard_state,
            reads,
            after_persist,
            number,
            apply_on_persist,
        })
    }

    /// `ready`'s entries and hard state are durable: the messages that waited for them.
    /// Call `ready` next: the round may let a leader commit.
    pub fn persisted(&mut self, ready: Ready) -> Vec<WireMessage> {
        self.node.on_persist_ready(ready.number);
        if ready.apply_on_persist {
            self.node.advance_apply();
        }
        ready.after_persist
    }
}

/// The engine's outgoing messages on our wire, a snapshot cut into chunks (its receivers
/// noted in `snapshots`). The engine never hands a driver a local message, so nothing is
/// dropped here; a debug build says so if that ever changes.
fn wire_messages(
    messages: Vec<raft::eraftpb::Message>,
    snapshots: &mut Vec<ReplicaId>,
) -> Vec<WireMessage> {
    let mut out = Vec::with_capacity(messages.len());
    for m in &messages {
        if m.get_msg_type() == MessageType::MsgSnapshot {
            snapshots.push(m.to);
            out.extend(WireMessage::snapshot_chunks(
                m,
                &snapshot_data(m.get_snapshot()),
            ));
            continue;
        }
        let wire = WireMessage::from_raft(m);
        debug_assert!(wire.is_ok(), "the engine sent {m:?}");
        out.extend(wire.ok());
    }
    out
}

fn conf_state(conf: &ReplicaConf) -> ConfState {
    let mut cs = ConfState::default();
    cs.voters.clone_from(&conf.voters);
    cs.learners.clone_from(&conf.learners);
    cs.voters_outgoing.clone_from(&conf.voters_outgoing);
    cs.learners_next.clone_from(&conf.learners_next);
    cs.auto_leave = conf.auto_leave;
    cs
}

fn conf_record(cs: &ConfState) -> ReplicaConf {
    ReplicaConf {
        voters: cs.voters.clone(),
        learners: cs.learners.clone(),
        voters_outgoing: cs.voters_outgoing.clone(),
        learners_next: cs.learners_next.clone(),
        auto_leave: cs.auto_leave,
    }
}

fn raft_snapshot(s: &SnapshotData) -> Snapshot {
    let mut snapshot = Snapshot {
        data: s.data.clone().into(),
        ..Snapshot::default()
    };
    let meta = snapshot.mut_metadata();
    meta.index = s.index;
    meta.term = s.term;
    meta.set_conf_state(conf_state(&s.conf));
    snapshot
}

fn snapshot_data(s: &Snapshot) -> SnapshotData {
    let meta = s.get_metadata();
    SnapshotData {
        index: meta.index,
        term: meta.term,
        conf: conf_record(meta.get_conf_state()),
        data: s.data.to_vec(),
    }
}

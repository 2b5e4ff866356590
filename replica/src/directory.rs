//! The directory on the replicated log (issue 19, second step): `Persist` means "committed by
//! a quorum".
//!
//! Every replica applies the committed records, in log order, to its own [`DurableState`]
//! through the one `apply` the directory and its recovery use. The replica that leads term
//! `T` serves a [`Directory`] once it has applied the first entry of its own term (the empty
//! entry the engine appends on election): by then every entry before it is committed and
//! applied, so it recovers from exactly what was acknowledged before, at epoch `T`
//! ([`Directory::recover_in_epoch`]): the term is the authority epoch the proxies already
//! fence on.
//!
//! Each step of the serving directory becomes one proposal holding the step's records (none,
//! for a step that only answers: a read is answered only once an entry of the leader's term
//! after it commits, which proves the leader still leads, so a partitioned old leader answers
//! nothing). The step's effects wait behind it in core's [`Barrier`], with the log index as
//! the position: they leave once the entry is applied. A replica that stops leading (a new
//! term, or an entry of another term where its own proposal was) drops its directory and
//! everything held: nobody saw it, and the next leader decides again from the log.

use dataplane_core::directory::{Directory, DirectoryConfig, DurableState, SourceRecoveryHook};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::InputError;
use dataplane_core::ids::{Address, AuthorityEpoch};
use dataplane_core::log::{LogRecord, RecordRef};
use dataplane_core::membership::Membership;
use dataplane_core::time::Instant;
use dataplane_core::wire::Message;

use std::collections::{BTreeMap, VecDeque};

use crate::{
    EntryKind, LogEntry, MemberChange, Ready, Replica, ReplicaError, ReplicaId, SnapshotData,
    WireMessage,
};

/// Why the replicated directory did not take an input (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotServing {
    /// This replica does not lead; the leader it knows, if any.
    NotLeader(Option<ReplicaId>),
    /// It leads, but has not applied its term's first entry yet.
    Starting,
    /// It leads, but [`IN_FLIGHT_MAX`] entries wait to be applied (a quorum is slow or
    /// unreachable): the input is refused before the directory sees it, as any full table.
    Busy,
    /// The directory refused the input.
    Refused(InputError),
    /// A committed record did not apply: this replica stopped (fail-stop).
    Stopped(String),
    /// The engine refused a membership change (another one is pending, or it is invalid).
    Change(String),
    /// A leadership transfer was refused (see [`Replica::transfer_leader`]).
    Transfer(String),
}

impl std::fmt::Display for NotServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotServing::NotLeader(Some(l)) => write!(f, "not the leader (replica {l} is)"),
            NotServing::NotLeader(None) => write!(f, "not the leader (none known)"),
            NotServing::Starting => write!(f, "the leader is still applying its log"),
            NotServing::Busy => write!(
                f,
                "the leader has {IN_FLIGHT_MAX} entries waiting for a quorum (try again later)"
            ),
            NotServing::Refused(e) => write!(f, "{e}"),
            NotServing::Stopped(why) => write!(f, "stopped: {why}"),
            NotServing::Change(why) => write!(f, "the membership change was refused: {why}"),
            NotServing::Transfer(why) => write!(f, "the leadership transfer was refused: {why}"),
        }
    }
}

impl std::error::Error for NotServing {}

/// The most entries a leader lets wait for a quorum before it refuses inputs `Busy`. The
/// directory applies a step to its memory before the step's entry is proposed, so a proposal
/// the engine refused would stop the replica; this bound keeps the engine's own limit on
/// uncommitted entries (64 MiB) out of reach, and the memory held for effects bounded.
pub const IN_FLIGHT_MAX: u64 = 4096;

/// A step of the serving directory as it was handed to the log and the barrier: what a
/// simulator's checkers compare with a reference model (see
/// [`ReplicatedDirectory::observe_steps`]). Production drivers never turn it on.
#[derive(Clone, Debug)]
pub struct Admitted {
    /// The term the directory served.
    pub term: u64,
    /// The log index of the step's proposal (none for a step that proposed nothing).
    pub index: Option<u64>,
    /// For a step that only answers (a read: no records), the number of the leadership
    /// confirmation its effects wait for ([`Replica::read_index`]) instead of an entry.
    pub read: Option<u64>,
    /// The recovery that started the term's directory (not an input's step).
    pub recovery: bool,
    /// Every effect of the step, its `Persist`s included, in the order emitted.
    pub effects: Vec<Effect>,
}

/// The most reads a leader lets wait for a quorum's confirmation before it refuses inputs
/// `Busy` (as [`IN_FLIGHT_MAX`] bounds the entries).
pub const READS_WAITING_MAX: u64 = 4096;

/// The leader's serving state for one term.
struct Leading {
    term: u64,
    directory: Option<Directory>,
    held: Held,
}

/// What the serving directory's effects wait for before they leave, in the order emitted
/// (one waiting holds back everything after it). A step with records waits until its entry
/// is applied. A step that only answers (a read) proposes nothing: it waits until a quorum
/// confirmed that this replica still led after the step ([`Replica::read_index`]), and until
/// the log applied both the commit index of that moment and every step proposed before it
/// (the directory's memory, which the answer was read from, holds them already).
#[derive(Debug)]
struct Held {
    /// Each effect, the applied index it needs, and the read it waits for (until confirmed).
    effects: VecDeque<(u64, Option<u64>, Effect)>,
    /// The index of the last step's proposal (or what was applied when serving began).
    proposed: u64,
    /// Reads asked and not confirmed yet.
    reads_waiting: u64,
}

impl Held {
    fn new(applied: u64) -> Held {
        Held {
            effects: VecDeque::new(),
            proposed: applied,
            reads_waiting: 0,
        }
    }

    /// A step's effects (its `Persist`s went into its proposal, at `position`); those that may
    /// go at once are added to `ready`.
    fn admit(
        &mut self,
        effects: Vec<Effect>,
        applied: u64,
        position: Option<u64>,
        read: Option<u64>,
        ready: &mut Vec<Effect>,
    ) {
        if let Some(position) = position {
            self.proposed = self.proposed.max(position);
        }
        if read.is_some() {
            self.reads_waiting += 1;
        }
        for effect in effects {
            if matches!(effect, Effect::Persist(_)) {
                continue;
            }
            if self.effects.is_empty() && read.is_none() && applied >= self.proposed {
                ready.push(effect);
            } else {
                self.effects.push_back((self.proposed, read, effect));
            }
        }
    }

    /// A quorum confirmed read `number`, asked when the commit index was `index`.
    fn confirmed(&mut self, number: u64, index: u64) {
        let mut found = false;
        for (at, read, _) in &mut self.effects {
            if *read == Some(number) {
                *read = None;
                *at = (*at).max(index);
                found = true;
            }
        }
        if found {
            self.reads_waiting = self.reads_waiting.saturating_sub(1);
        }
    }

    /// The log applied up to `applied`: what no longer waits goes to `ready`, in order.
    fn release(&mut self, applied: u64, ready: &mut Vec<Effect>) {
        while self
            .effects
            .front()
            .is_some_and(|(at, read, _)| read.is_none() && *at <= applied)
        {
            if let Some((_, _, effect)) = self.effects.pop_front() {
                ready.push(effect);
            }
        }
    }

    /// The applied index the first held effect waits for, if one waits.
    fn first_held(&self) -> Option<u64> {
        self.effects.front().map(|(at, _, _)| *at)
    }
}

/// One replica of the directory (see the module documentation).
pub struct ReplicatedDirectory<H: SourceRecoveryHook> {
    replica: Replica,
    config: DirectoryConfig,
    hook: H,
    committed: DurableState,
    /// The hosts' identities, as committed (`LogRecord::Member`; the directory ignores them).
    members: Membership,
    /// Where replicas added by a membership change listen (committed with the change).
    addresses: BTreeMap<ReplicaId, String>,
    /// A membership change was applied since the last snapshot: the next round takes one
    /// and keeps no entry before it (a new replica learns the group from it).
    changed: bool,
    applied: u64,
    leading: Option<Leading>,
    released: Vec<Effect>,
    stopped: Option<String>,
    /// The steps admitted since the last [`ReplicatedDirectory::take_admitted`], when observed.
    observed: Option<Vec<Admitted>>,
    recovering: bool,
    /// The term in which this replica, leading, started handing its leadership over.
    transferring: Option<u64>,
    /// The number the next read's leadership confirmation is asked under.
    next_read: u64,
}

impl<H: SourceRecoveryHook> std::fmt::Debug for ReplicatedDirectory<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedDirectory")
            .field("replica", &self.replica)
            .field("applied", &self.applied)
            .field("serving", &self.serving_epoch())
            .field(
                "holding",
                &self.leading.as_ref().and_then(|l| l.held.first_held()),
            )
            .finish_non_exhaustive()
    }
}

impl<H: SourceRecoveryHook> ReplicatedDirectory<H> {
    /// A replica of the directory over `replica` (started from its disk: the state restored
    /// from its snapshot, if it has one, then its committed entries after it come back through
    /// `ready` and are applied again).
    pub fn new(replica: Replica, config: DirectoryConfig, hook: H) -> Self {
        let snapshot = replica.snapshot();
        let mut directory = ReplicatedDirectory {
            replica,
            config,
            hook,
            committed: DurableState::default(),
            members: Membership::recover(&[]).expect("an empty membership"),
            addresses: BTreeMap::new(),
            changed: false,
            applied: 0,
            leading: None,
            released: Vec::new(),
            stopped: None,
            observed: None,
            recovering: false,
            transferring: None,
            next_read: 1,
        };
        if let Some(snapshot) = snapshot {
            directory.restore(&snapshot);
        }
        directory
    }

    /// Makes a snapshot's state this replica's: the directory's committed state and the
    /// hosts' membership as they were at its index.
    fn restore(&mut self, snapshot: &SnapshotData) {
        match decode_snapshot(&snapshot.data) {
            Ok((committed, members, addresses)) => {
                self.committed = committed;
                self.members = members;
                self.addresses = addresses;
                self.applied = snapshot.index;
            }
            Err(why) => self.stop(format!(
                "the snapshot at entry {} does not restore: {why}",
                snapshot.index
            )),
        }
    }

    /// Takes a snapshot once [`crate::ReplicaConfig::snapshot_every`] entries were applied
    /// since the last one; the round carries it to the driver ([`Ready::compacted`]).
    ///
    /// The first one is taken at the first entry applied, and one after each membership
    /// change, keeping no entry before it: a replica whose log is empty (a new one, or one
    /// that lost its disk) is then always sent a snapshot, which carries the group's
    /// configuration, rather than the log from its first entry.
    fn maybe_compact(&mut self, ready: &mut Ready) {
        let every = self.replica.snapshot_every();
        let since = self.applied.saturating_sub(self.replica.snapshot_index());
        let first = self.replica.snapshot_index() == 0 && self.applied > 0;
        if self.stopped.is_some() || since == 0 {
            return;
        }
        let keep = if first || self.changed {
            0
        } else if every > 0 && since >= every {
            self.replica.snapshot_keep()
        } else {
            return;
        };
        let data = encode_snapshot(&self.committed, &self.members, &self.addresses);
        // Refused only past the size limit: the log then keeps growing, as before snapshots.
        if let Ok(compaction) = self.replica.compact_keeping(self.applied, data, keep) {
            ready.compacted = Some(compaction);
            self.changed = false;
        }
    }

    /// Whether this replica serves now (a proposal of the node's own may be made), or why not.
    fn check_serving(&mut self) -> Result<(), NotServing> {
        if let Some(why) = &self.stopped {
            return Err(NotServing::Stopped(why.clone()));
        }
        self.follow_leadership();
        if self.serving_term().is_none() {
            return match self.leading {
                Some(_) => Err(NotServing::Starting),
                None => Err(NotServing::NotLeader(self.replica.leader())),
            };
        }
        Ok(())
    }

    /// Proposes a change of the group's voters (the serving replica only; one at a time),
    /// with the addresses where added replicas listen for the others; the index of its
    /// entry. Once applied, [`Self::voters`] and [`Self::addresses`] show it on every replica.
    pub fn change_replicas(
        &mut self,
        changes: &[MemberChange],
        addresses: &[(ReplicaId, String)],
    ) -> Result<u64, NotServing> {
        self.check_serving()?;
        let context = postcard::to_allocvec(addresses).expect("addresses always serialise");
        self.replica
            .propose_change(changes, context)
            .map_err(|e| match e {
                ReplicaError::NotLeader(l) => NotServing::NotLeader(l),
                e => NotServing::Change(e.to_string()),
            })
    }

    /// Reads this leader asked a quorum to confirm and has not heard back about (0 unless it
    /// serves; [`READS_WAITING_MAX`] bounds them).
    pub fn reads_waiting(&self) -> u64 {
        self.leading.as_ref().map_or(0, |l| l.held.reads_waiting)
    }

    /// Hands the leadership to voter `to` (the serving replica only; see
    /// [`Replica::transfer_leader`] for what is refused). It stops serving at once, as a leader
    /// that lost its term does (what it held goes; hosts reconnect to the next leader). If the
    /// engine abandons the transfer (`to` did not win within an election timeout), this replica
    /// resigns rather than leading on without serving: the group elects a leader at a higher
    /// term, which serves from its own first entry as every new leader does.
    pub fn transfer_leader(&mut self, to: ReplicaId) -> Result<(), NotServing> {
        self.check_serving()?;
        self.replica.transfer_leader(to).map_err(|e| match e {
            ReplicaError::NotLeader(l) => NotServing::NotLeader(l),
            ReplicaError::Refused(why) => NotServing::Transfer(why),
            e => NotServing::Transfer(e.to_string()),
        })?;
        self.transferring = Some(self.replica.term());
        self.follow_leadership();
        Ok(())
    }

    /// The group's voters as this replica applied them (both sides, during a joint change).
    pub fn voters(&self) -> Vec<ReplicaId> {
        let conf = self.replica.conf();
        let mut voters: Vec<ReplicaId> = conf
            .voters
            .iter()
            .chain(&conf.voters_outgoing)
            .copied()
            .collect();
        voters.sort_unstable();
        voters.dedup();
        voters
    }

    /// Where the replicas added by membership changes listen, as committed.
    pub fn addresses(&self) -> &BTreeMap<ReplicaId, String> {
        &self.addresses
    }

    /// Keeps every step the directory admits (its effects, its log index) until
    /// [`Self::take_admitted`]: for a simulator's checkers, which compare each step with a
    /// reference model. Off unless called (the kept steps would grow without bound).
    pub fn observe_steps(&mut self) {
        self.observed.get_or_insert_with(Vec::new);
    }

    /// The steps admitted since the last call (empty unless [`Self::observe_steps`]).
    pub fn take_admitted(&mut self) -> Vec<Admitted> {
        self.observed
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The replica underneath.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The state every committed record built, as this replica applied it.
    pub fn committed(&self) -> &DurableState {
        &self.committed
    }

    /// The membership every committed `Member` record built. A node serving hosts starts its
    /// working copy from it when this replica starts serving, and proposes each change
    /// ([`Self::propose_records`]) before it announces it.
    pub fn members(&self) -> &Membership {
        &self.members
    }

    /// The last log index applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The epoch this replica serves at, if it serves.
    pub fn serving_epoch(&self) -> Option<AuthorityEpoch> {
        self.leading
            .as_ref()
            .and_then(|l| l.directory.as_ref())
            .map(Directory::epoch)
    }

    /// The directory it serves, if it does.
    pub fn directory(&self) -> Option<&Directory> {
        self.leading.as_ref().and_then(|l| l.directory.as_ref())
    }

    /// The term it serves, if it serves (its epoch's number; [`Self::serving_epoch`]).
    pub fn serving_term(&self) -> Option<u64> {
        self.leading
            .as_ref()
            .filter(|l| l.directory.is_some())
            .map(|l| l.term)
    }

    /// Proposes records of the node's own (the membership's `Member` records, which the
    /// directory ignores) as one entry; the index at which they are committed once
    /// [`Self::applied`] reaches it while [`Self::serving_term`] is still the same. Only a
    /// serving replica takes them. They are not bounded by [`IN_FLIGHT_MAX`]: the node has
    /// changed its membership in memory already, so a refusal by the engine stops this
    /// replica (as for the directory's own steps).
    pub fn propose_records(&mut self, records: &[LogRecord]) -> Result<u64, NotServing> {
        self.check_serving()?;
        let data = postcard::to_allocvec(records).expect("records always serialise");
        match self.replica.propose(data) {
            Ok(index) => Ok(index),
            Err(e) => {
                let why = format!("the engine refused the node's proposal: {e}");
                self.stop(why.clone());
                Err(NotServing::Stopped(why))
            }
        }
    }

    /// Why it stopped, if it did.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// The directory's effects that may be executed now (sends, timers, route watches; never a
    /// `Persist`: the log took those).
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.released)
    }

    /// A message for the directory (a call, a retirement...).
    pub fn handle_message(&mut self, now: Instant, message: Message) -> Result<(), NotServing> {
        let mut out = Outbox::new();
        let result = self.serving()?.handle_message(now, message, &mut out);
        self.admit_step(result, out)
    }

    /// The directory's timer fired.
    pub fn handle_timer(&mut self, now: Instant, timer: Timer) -> Result<(), NotServing> {
        let mut out = Outbox::new();
        let result = self.serving()?.handle_timer(now, timer, &mut out);
        self.admit_step(result, out)
    }

    /// A routability report for a watched target.
    pub fn handle_route(
        &mut self,
        now: Instant,
        target: Address,
        routable: bool,
    ) -> Result<(), NotServing> {
        let mut out = Outbox::new();
        self.serving()?
            .handle_route(now, target, routable, &mut out);
        self.admit_step(Ok(()), out)
    }

    /// One tick of the replica's clock.
    pub fn tick(&mut self) {
        self.replica.tick();
        self.follow_leadership();
    }

    /// A message to `peer` could not be delivered ([`Replica::report_unreachable`]).
    pub fn report_unreachable(&mut self, peer: ReplicaId) {
        self.replica.report_unreachable(peer);
    }

    /// A (new) connection to `peer` is up ([`Replica::peer_connected`]).
    pub fn peer_connected(&mut self, peer: ReplicaId) {
        self.replica.peer_connected(peer);
    }

    /// A message from another replica. One that shows this replica lost acknowledged
    /// entries ([`crate::ReplicaError::LostEntries`]) also stops it.
    pub fn step(&mut self, message: WireMessage) -> Result<(), ReplicaError> {
        let result = self.replica.step(message);
        if let Err(e @ ReplicaError::LostEntries { .. }) = &result {
            self.stop(e.to_string());
        }
        self.follow_leadership();
        result
    }

    /// The replica's next round (see [`Replica::ready`]); its committed entries are applied
    /// here (the round's `apply` comes back empty), which may start the directory or release
    /// its held effects.
    pub fn ready(&mut self, now: Instant) -> Option<Ready> {
        self.follow_leadership();
        let mut ready = self.replica.ready()?;
        // A leader that applied its own removal in this round stepped down: what it held goes.
        self.follow_leadership();
        for entry in std::mem::take(&mut ready.apply) {
            self.apply_entry(now, &entry);
        }
        // Reads a quorum confirmed: their answers go once the log applied what they need.
        let reads = std::mem::take(&mut ready.reads);
        if let Some(leading) = self.leading.as_mut().filter(|_| !reads.is_empty()) {
            for (number, index) in reads {
                leading.held.confirmed(number, index);
            }
            let mut out = Vec::new();
            leading.held.release(self.applied, &mut out);
            self.released.extend(out);
        }
        self.maybe_compact(&mut ready);
        self.follow_leadership();
        Some(ready)
    }

    /// The round's entries and hard state are durable (see [`Replica::persisted`]); a
    /// snapshot the round installed is restored now (once durable, as any committed entry).
    pub fn persisted(&mut self, ready: Ready) -> Vec<WireMessage> {
        if let Some(snapshot) = &ready.snapshot {
            self.restore(snapshot);
        }
        self.replica.persisted(ready)
    }

    fn serving(&mut self) -> Result<&mut Directory, NotServing> {
        if let Some(why) = &self.stopped {
            return Err(NotServing::Stopped(why.clone()));
        }
        self.follow_leadership();
        if self.leading.as_ref().is_some_and(|l| {
            self.replica.last_index().saturating_sub(self.applied) >= IN_FLIGHT_MAX
                || l.held.reads_waiting >= READS_WAITING_MAX
        }) {
            return Err(NotServing::Busy);
        }
        match self.leading.as_mut() {
            None => Err(NotServing::NotLeader(self.replica.leader())),
            Some(Leading {
                directory: None, ..
            }) => Err(NotServing::Starting),
            Some(Leading {
                directory: Some(d), ..
            }) => Ok(d),
        }
    }

    /// Starts or ends a term's serving state to match the engine's role.
    fn follow_leadership(&mut self) {
        if let Some(since) = self.transferring {
            if self.replica.term() != since || self.replica.role() != crate::Role::Leader {
                self.transferring = None;
            } else if !self.replica.transferring() {
                // Abandoned: the leader would lead on in a term it no longer serves.
                self.transferring = None;
                self.replica.resign();
            }
        }
        let term = self.replica.term();
        // A leader removed from the group, or handing its leadership over, serves no more.
        let leads = self.replica.may_propose() && self.stopped.is_none();
        match &self.leading {
            Some(l) if leads && l.term == term => {}
            _ if leads => {
                self.leading = Some(Leading {
                    term,
                    directory: None,
                    held: Held::new(self.applied),
                });
            }
            Some(_) => self.step_down(),
            None => {}
        }
    }

    /// Drops the directory and everything it held (nobody saw it).
    fn step_down(&mut self) {
        self.leading = None;
    }

    /// Hands a directory step's effects to the log and the barrier.
    fn admit_step(
        &mut self,
        result: Result<(), InputError>,
        mut out: Outbox,
    ) -> Result<(), NotServing> {
        // A refused input changes nothing (and emits nothing).
        result.map_err(NotServing::Refused)?;
        let effects = out.take();
        self.admit(effects);
        Ok(())
    }

    fn admit(&mut self, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        let records: Vec<LogRecord> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Persist(r) => Some(r.clone()),
                _ => None,
            })
            .collect();
        let answers = effects.iter().any(|e| matches!(e, Effect::Send { .. }));
        let mut read = None;
        let asked = if records.is_empty() && answers && !self.recovering {
            // A read: its answers wait for a quorum to confirm this leader, not for an entry.
            let number = self.next_read;
            self.next_read += 1;
            read = Some(number);
            self.replica.read_index(number).map(|()| None)
        } else if !records.is_empty() || answers {
            // One proposal per step: its records (or none: the recovery's answers wait for an
            // entry of this term to commit after it).
            let data = postcard::to_allocvec(&records).expect("records always serialise");
            self.replica.propose(data).map(Some)
        } else {
            Ok(None)
        };
        let position = match asked {
            Ok(index) => index,
            Err(ReplicaError::NotLeader(_)) => {
                // Removed from the group (or handing over) in this very round: it serves
                // no more in this term, and nobody saw what the step changed.
                self.step_down();
                return;
            }
            Err(e) => {
                // The directory already changed its memory for records this leader cannot
                // commit: it stops (fail-stop; its driver starts it again from its disk).
                // Stepping down alone would not do: the engine still leads this term, and
                // a directory can start again only at a term above its records' epoch.
                // `IN_FLIGHT_MAX` keeps the engine's refusal out of reach.
                self.stop(format!("the engine refused a step's proposal: {e}"));
                return;
            }
        };
        if let (Some(observed), Some(leading)) = (self.observed.as_mut(), self.leading.as_ref()) {
            observed.push(Admitted {
                term: leading.term,
                index: position,
                read,
                recovery: self.recovering,
                effects: effects.clone(),
            });
        }
        let Some(leading) = self.leading.as_mut() else {
            return;
        };
        let mut ready = Vec::new();
        leading
            .held
            .admit(effects, self.applied, position, read, &mut ready);
        self.released.extend(ready);
    }

    /// A committed entry: the directory's records, or a membership change (the replica
    /// applied it to the engine already; its context holds the added replicas' addresses).
    fn apply_entry(&mut self, now: Instant, entry: &LogEntry) {
        if entry.kind == EntryKind::Normal {
            return self.apply(now, entry.index, entry.term, &entry.data);
        }
        if let Ok(addresses) = postcard::from_bytes::<Vec<(ReplicaId, String)>>(&entry.context) {
            self.addresses.extend(addresses);
        }
        let voters = self.voters();
        self.addresses.retain(|id, _| voters.contains(id));
        self.changed = true;
        // An entry of the leader's term like any other: the effects waiting for it go.
        self.apply(now, entry.index, entry.term, &[]);
    }

    /// A committed entry of records.
    fn apply(&mut self, now: Instant, index: u64, term: u64, data: &[u8]) {
        if self.stopped.is_some() {
            return;
        }
        if !data.is_empty() {
            let records: Vec<LogRecord> = match postcard::from_bytes(data) {
                Ok(records) => records,
                Err(e) => {
                    self.stop(format!("entry {index} is not a batch of records: {e}"));
                    return;
                }
            };
            for record in &records {
                let applied = match record {
                    LogRecord::Member(member) => self.members.apply(member),
                    _ => self.committed.apply(record).map_err(|e| e.0.to_owned()),
                };
                if let Err(e) = applied {
                    self.stop(format!("committed entry {index} does not apply: {e}"));
                    return;
                }
            }
        }
        self.applied = index;
        let Some(leading) = self.leading.as_mut() else {
            return;
        };
        if term != leading.term {
            if leading.directory.is_some() {
                // Another term's entry where this leader's own were: it no longer leads.
                self.step_down();
            }
            return;
        }
        match leading.directory.as_mut() {
            Some(_) => {
                let mut ready = Vec::new();
                leading.held.release(index, &mut ready);
                self.released.extend(ready);
            }
            None => {
                // The first entry of this leader's term: everything before it is committed and
                // applied. Serve from it, at the term; the directory's address carries the term
                // as its incarnation (a new leader is, to the hosts, a directory that restarted).
                let records = self.committed.snapshot_records();
                let mut out = Outbox::new();
                let mut config = self.config.clone();
                config.address.incarnation = term;
                match Directory::recover_in_epoch(
                    config,
                    &records,
                    AuthorityEpoch(term),
                    &mut self.hook,
                    now,
                    &mut out,
                ) {
                    Ok(directory) => {
                        leading.directory = Some(directory);
                        let effects: Vec<Effect> = out.drain().collect();
                        self.recovering = true;
                        self.admit(effects);
                        self.recovering = false;
                    }
                    Err(e) => self.stop(format!("cannot serve term {term}: {e}")),
                }
            }
        }
    }

    fn stop(&mut self, why: String) {
        self.step_down();
        self.stopped = Some(why);
    }
}

/// A snapshot's bytes: the records that restate the directory's committed state and the hosts'
/// membership (each one's own compaction), in postcard.
fn encode_snapshot(
    committed: &DurableState,
    members: &Membership,
    addresses: &BTreeMap<ReplicaId, String>,
) -> Vec<u8> {
    // Borrowed from the state, not cloned: they encode as the `Vec<LogRecord>` decoded below.
    let members = members.snapshot_records();
    let records: Vec<RecordRef<'_>> = (committed.snapshot().map(RecordRef::Snapshot))
        .chain(members.iter().map(RecordRef::Record))
        .collect();
    postcard::to_allocvec(&(records, addresses)).expect("records always serialise")
}

/// The state a snapshot's bytes restate, or why they do not.
fn decode_snapshot(
    data: &[u8],
) -> Result<(DurableState, Membership, BTreeMap<ReplicaId, String>), String> {
    type State = (Vec<LogRecord>, BTreeMap<ReplicaId, String>);
    let (records, addresses): State = match postcard::take_from_bytes(data) {
        Ok((state, [])) => state,
        _ => return Err("not a snapshot of the directory".into()),
    };
    let members = Membership::recover(&records)?;
    let mut committed = DurableState::default();
    for record in &records {
        if !matches!(record, LogRecord::Member(_)) {
            committed.apply(record).map_err(|e| e.0.to_owned())?;
        }
    }
    Ok((committed, members, addresses))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_core::ids::{Address, AuthorityEpoch, Issuer, NodeId, Revision};
    use dataplane_core::log::{Entry, SnapshotRecord};
    use dataplane_core::path::DataPath;
    use dataplane_core::wire::SourceRecovery;

    #[test]
    fn a_snapshot_is_the_bytes_of_its_records_and_decodes_to_the_state() {
        let source = Address::new(NodeId(2), 1, 3);
        let mut committed = DurableState::default();
        for record in [
            SnapshotRecord::Header {
                epoch: AuthorityEpoch(4),
                next_revision: Revision(9),
            },
            SnapshotRecord::Entry {
                path: DataPath::new("/a/b").unwrap(),
                entry: Entry::Blob {
                    length: 10,
                    revision: Revision(8),
                    recovery: SourceRecovery::Actor {
                        actor: source,
                        node: source.node,
                        owner: None,
                    },
                },
            },
            SnapshotRecord::NodeFloor {
                node: NodeId(2),
                incarnation: 1,
            },
            SnapshotRecord::Horizon {
                issuer: Issuer::of(source, 0),
                below: 5,
            },
            SnapshotRecord::Retirement { source },
        ] {
            committed.apply(&LogRecord::Snapshot(record)).unwrap();
        }
        let mut members = Membership::default();
        members.boot();
        members.admit("127.0.0.1:7701", 11).unwrap();
        let addresses = BTreeMap::from([(1, "127.0.0.1:7811".to_owned())]);

        let data = encode_snapshot(&committed, &members, &addresses);
        // The same bytes as the owned records' (what replicas wrote before, and decode).
        let mut owned = committed.snapshot_records();
        owned.extend(members.snapshot_records());
        assert_eq!(data, postcard::to_allocvec(&(owned, &addresses)).unwrap());
        let (state, read_members, read_addresses) = decode_snapshot(&data).unwrap();
        assert!(state == committed);
        assert_eq!(read_members, members);
        assert_eq!(read_addresses, addresses);
    }
}

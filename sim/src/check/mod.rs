//! Checkers, outside production code (STYLE.md rule 11).
//!
//! * **always** — after every directory step: the reference model's (`dataplane_model`, the
//!   one core's property tests and the fuzz targets use too) predicted replies and fresh
//!   notices must equal what the directory emitted; every durable field must equal the model's
//!   (after each step that changed either side, every [`DURABLE_COMPARE_EVERY`] steps, and
//!   after every recovery: `dataplane_model::compare`); the directory's own invariants hold;
//!   and the SPEC §13 safety properties that apply at this layer (S3, S9, S15, S16, S22–S25)
//!   hold.
//! * **host side** — after every host machine step: its own invariants (S28, S30, lease
//!   bookkeeping) and S34 against the directory (also after every directory step); from what
//!   workers report: S29, S31, S33, S36 and the content check (see the `host` module).
//! * **eventually** — at the end of the liveness phase (faults stopped, network healed, clients
//!   and workers quiesced): L1–L6 and L10–L12 as stated in `at_end`.
//! * **sometimes** — [`Coverage`] counts every operation, fault kind, reply variant and
//!   interesting path; a swarm reports the ones it never saw, and a run that saw no reply fails.

mod host;
pub mod proxy;

use std::collections::{BTreeMap, BTreeSet};

use dataplane_core::directory::{Directory, ObligationKey, Rendezvous};
use dataplane_core::effect::Effect;
use dataplane_core::error::Limit;
use dataplane_core::ids::{Address, AuthorityEpoch, OperationId, StreamIncarnation};
use dataplane_core::log::Entry;
use dataplane_core::time::Instant;
use dataplane_core::wire::{DirectoryReply, DirectoryRequest, Message, ReplyBody, StreamMatch};
use dataplane_model::{Model, Out, compare};

use crate::host::HostNode;
use crate::options::Options;
pub use proxy::{ProxyChecker, ProxyId, ProxyInput};

/// What the directory was fed in one step.
// Built once per step and passed by reference; boxing the message would cost an allocation
// per step for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirInput {
    /// A frame.
    Message(Message),
    /// The retry tick.
    Timer,
    /// A route report.
    Route {
        /// The watched target.
        target: Address,
        /// Its new routability.
        routable: bool,
    },
}

/// "Sometimes" counters: how often each interesting thing happened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    // Hashed (this is the simulator, not the core): only printing iterates, and it sorts.
    counts: std::collections::HashMap<&'static str, u64>,
}

impl Coverage {
    /// Counts one occurrence of `name`.
    pub fn hit(&mut self, name: &'static str) {
        *self.counts.entry(name).or_insert(0) += 1;
    }

    /// Adds another run's counts.
    pub fn merge(&mut self, other: &Coverage) {
        for (name, n) in &other.counts {
            *self.counts.entry(name).or_insert(0) += n;
        }
    }

    /// The count of `name`.
    pub fn count(&self, name: &str) -> u64 {
        self.counts.get(name).copied().unwrap_or(0)
    }

    /// Every counter, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        let mut all: Vec<(&'static str, u64)> = self.counts.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort_unstable();
        all.into_iter()
    }
}

/// Every coverage name a healthy swarm is expected to hit at least once.
pub const EXPECTED_COVERAGE: &[&str] = &[
    "host.worker_started",
    "host.session_closed",
    "host.child_died",
    "host.published",
    "host.read_checked",
    "host.read_self_consistent",
    "host.aborted",
    "host.cancel_sent",
    "host.corrupt_seal_refused",
    "host.unsent_publication_failed",
    "host.digest_left_to_host",
    "host.attach_refused",
    "host.abort_while_publishing",
    "host.stat_blob",
    "host.control_done",
    "host.fail.PathNotFound",
    "host.fail.Unauthorized",
    "host.fail.SourceFailure",
    "host.fail.BlobLost",
    "host.stat_lost",
    // File blobs (issue 17): published, read as the version published, refused once changed.
    // Handshake deadlines: a stalled welcome is given up and the link tried again.
    "fault.welcome_stalled",
    "conns.handshake_expired",
    "host.file_published",
    // Streams for programs (issue 17): matched, closed, displaced, left to the host.
    "host.stream_matched",
    "host.stream_closed",
    "host.stream_displaced",
    "host.stream_left_to_host",
    "host.file_read_checked",
    "host.fail.SourceChanged",
    "fault.file_changed",
    "fault.file_removed",
    "host.refused_ended_incarnation",
    "host.fail.OperationCancelled",
    "host.fail.PathExists",
    "host.fail.PathReplaced",
    "host.fail.WrongEntryType",
    "host.fail.Blob.Digest",
    "host.fail.Blob.Length",
    "op.Register",
    "op.Resolve",
    "op.Lookup",
    "op.ReserveBlob",
    "op.ReleaseBlobReservation",
    "op.Unregister",
    "op.Rename",
    "op.OpenStream",
    "op.CancelStream",
    "op.CloseStream",
    "input.SourceRetired",
    "input.StreamDisplaced",
    "input.AddressGone.node",
    "input.AddressGone.address",
    "input.route_unroutable",
    "input.route_routable",
    "reply.ok",
    "reply.PathNotFound",
    "reply.PathExists",
    "reply.WrongEntryType",
    "reply.PathReplaced",
    "reply.DuplicateStreamRole",
    "reply.StaleIncarnation",
    "reply.OperationConflict",
    "reply.StreamActive",
    "reply.BlobLost",
    "reply.OperationExpired",
    "op.OperationsDone",
    "retention.horizon_raised",
    "retention.floor_pruned",
    "retention.refused_expired",
    "regime.long_life",
    "stream.match",
    "stream.fence_begun",
    "stream.fence_resolved",
    "stream.cancel_active",
    "stream.open_refused_by_stored_rejection",
    "stream.close_ok",
    "replay.definitive",
    "fault.frame_lost",
    "fault.frame_duplicated",
    "fault.frame_reordered",
    "fault.directory_crash",
    "fault.fsync_failure",
    "fault.torn_tail",
    "fault.disk_full",
    "fault.compaction_crash",
    "fault.rot",
    "storage.refused_damage",
    "disk.compacted",
    "disk.compaction_postponed",
    "membership.booted",
    "membership.restarted",
    "conns.reconnected",
    "conns.restarted",
    "churn.joined",
    "churn.joined_after_recovery",
    "aimed.crash_while_retiring",
    "aimed.crash_with_open_undecided",
    "aimed.crash_while_publishing",
    "aimed.crash_while_reading",
    "aimed.crash_while_serving",
    "agent.report_paced",
    "conns.connect_failed",
    "conns.lost_directory",
    "conns.broken_by_partition",
    "conns.refused_wrong_key",
    "conns.refused",
    "conns.expired",
    "conns.evicted",
    "conns.frame_unconnected",
    "conns.half_open",
    "peers.connected",
    "peers.admitted",
    "peers.frame_waited",
    "peers.asked_where",
    "peers.waited_for_address",
    "peers.located",
    "peers.asked_again",
    "peers.address_wait_expired",
    "peers.address_wait_full",
    "fault.directory_paused",
    "fault.conn_stalled",
    "fault.peer_conn_stalled",
    "fault.slow_sync",
    "fault.host_paused",
    "peers.left_paused_host",
    "conns.directory_let_go_paused_host",
    "limit.Obligations",
    "limit.Rendezvous",
    "limit.Reservations",
    "conns.pinged",
    "conns.backed_off",
    "conns.left_silent_directory",
    "conns.directory_let_go_silent_host",
    "peers.pinged",
    "peers.left_silent_host",
    "fault.host_crash",
    "fault.boot_crash_in_handshake",
    "fault.boot_crash_after_welcome",
    "conns.dead_boot_frames_late",
    "conns.handshake_replaced",
    "fault.actor_death",
    "fault.spoof",
    "admission.refused_foreign_frame",
    "fault.partition",
    "fault.route_flap",
    "fault.proxy_restart",
    "fault.authority_outage",
    "proxy.forwarded",
    "proxy.cancel",
    "proxy.cancel_reserve",
    "proxy.retracted_abandoned",
    "proxy.timeout",
    "proxy.unavailable",
    "proxy.unavailable_read",
    "host.write_stalled",
    "host.fail.WriteExpired",
    "proxy.dropped_stale_reply",
    "proxy.redispatched_on_discovery",
    "proxy.resent_paced",
    "recovery.cut_torn_tail",
    "recovery.obligations_restored",
    "recovery.fence_restored",
    "tick.batch_full",
    "fault.link_queue_full",
    "host.fail.LimitReached",
    "probe.served",
    "host.write_after_publish_tried",
    "host.read_shared",
    "fault.session_revoked",
    "host.session_revoked",
    "agent.reported_actor",
    "agent.report_resent",
    "registrar.repeated",
    "registrar.skipped_initial",
    "registrar.stale_report",
    "registrar.unwatched_report",
    "input.route_unwatched",
    "discovery.repeated",
    "disk.no_space",
    "disk.space_returned",
    "peers.refused",
    "peers.refused_read_failed",
    "reply.NoSpace",
    "host.fail.Namespace.NoSpace",
];

/// What `at_end` looks at.
#[derive(Debug)]
pub struct EndView<'a> {
    /// The directory, if it is up.
    pub directory: Option<&'a Directory>,
    /// The hosts.
    pub hosts: &'a [HostNode],
}

/// All checkers of one run.
#[derive(Debug)]
pub struct Checker {
    model: Model,
    /// How many committing directory steps, crashes and recoveries the checker has seen: the
    /// directory's entries change only then.
    directory_seen: u64,
    /// Obligation frames per retry pass (the seed's `retry_batch`).
    retry_batch: usize,
    failure: Option<String>,
    /// "Sometimes" counters.
    pub coverage: Coverage,
    released_epoch: AuthorityEpoch,
    matches: BTreeMap<StreamIncarnation, StreamMatch>,
    definitive: BTreeMap<OperationId, ReplyBody>,
    told_unroutable: BTreeSet<Address>,
    /// Per pending obligation: retry passes since its last frame, and the most obligations
    /// pending at any of those passes.
    ticks_without_frame: BTreeMap<ObligationKey, (u64, u64)>,
    replies_released: u64,
    healed_at: Option<Instant>,
    call_ops: BTreeMap<(Address, dataplane_core::ids::RequestId), OperationId>,
    proxies: ProxyChecker,
    steps_checked: u64,
    hosts: host::HostChecker,
    /// The world's time of the event being handled.
    world_time: Option<Instant>,
}

/// Most operation records one issuer may keep at the end of a run (a client declares every
/// few operations and at the heal; a host on its tick).
const RECORDS_PER_ISSUER_AT_END: usize = 16;

/// Every durable field is compared after each step that changed either side's durable state,
/// after every recovery, and also every this many directory steps whatever happened (a
/// directory that changed its durable state without a record would show there).
pub const DURABLE_COMPARE_EVERY: u64 = 32;

/// Up to this many entries plus obligations the directory's invariants are walked every step.
const INVARIANT_WALK_SMALL: usize = 48;
/// Beyond that, every this many steps.
const INVARIANT_WALK_EVERY: u64 = 8;

fn error_name(body: &ReplyBody) -> &'static str {
    use dataplane_core::error::NamespaceError as E;
    match body.err() {
        None => "reply.ok",
        Some(E::PathNotFound(_)) => "reply.PathNotFound",
        Some(E::PathExists(_)) => "reply.PathExists",
        Some(E::WrongEntryType { .. }) => "reply.WrongEntryType",
        Some(E::PathReplaced(_)) => "reply.PathReplaced",
        Some(E::DuplicateStreamRole { .. }) => "reply.DuplicateStreamRole",
        Some(E::StaleIncarnation { .. }) => "reply.StaleIncarnation",
        Some(E::OperationConflict(_)) => "reply.OperationConflict",
        Some(E::StreamActive(_)) => "reply.StreamActive",
        Some(E::Storage(_)) => "reply.Storage",
        Some(E::SourceRecovery(_)) => "reply.SourceRecovery",
        Some(E::DirectoryUnavailable(_)) => "reply.DirectoryUnavailable",
        Some(E::Timeout) => "reply.Timeout",
        Some(E::Protocol(_)) => "reply.Protocol",
        Some(E::LimitReached(_)) => "reply.LimitReached",
        Some(E::BlobLost(_)) => "reply.BlobLost",
        Some(E::OperationExpired(_)) => "reply.OperationExpired",
        Some(E::NoSpace(_)) => "reply.NoSpace",
    }
}

/// The coverage name of a directory refusal for a full table (issue 52: every limit reached).
fn limit_name(limit: Limit) -> &'static str {
    match limit {
        Limit::FenceHeldOpens => "limit.FenceHeldOpens",
        Limit::Reservations => "limit.Reservations",
        Limit::PendingRequests => "limit.PendingRequests",
        Limit::RequestIds => "limit.RequestIds",
        Limit::HostOperations => "limit.HostOperations",
        Limit::SessionOperations => "limit.SessionOperations",
        Limit::Operations => "limit.Operations",
        Limit::IssuerOperations => "limit.IssuerOperations",
        Limit::Issuers => "limit.Issuers",
        Limit::Entries => "limit.Entries",
        Limit::Obligations => "limit.Obligations",
        Limit::Rendezvous => "limit.Rendezvous",
        Limit::Fences => "limit.Fences",
        Limit::HostFiles => "limit.HostFiles",
    }
}

fn op_name(request: &DirectoryRequest) -> &'static str {
    use dataplane_core::wire::RequestKind as K;
    match request.kind() {
        K::Register => "op.Register",
        K::Resolve => "op.Resolve",
        K::Lookup => "op.Lookup",
        K::ReserveBlob => "op.ReserveBlob",
        K::ReleaseBlobReservation => "op.ReleaseBlobReservation",
        K::Unregister => "op.Unregister",
        K::Rename => "op.Rename",
        K::OpenStream => "op.OpenStream",
        K::CancelStream => "op.CancelStream",
        K::CloseStream => "op.CloseStream",
        K::OperationsDone => "op.OperationsDone",
    }
}

/// Sends of one step, sorted into the kinds the checks care about.
#[derive(Default)]
struct StepSends {
    replies: Vec<(Address, DirectoryReply)>,
    retires: Vec<Address>,
    displaced: Vec<(Address, StreamIncarnation)>,
    gone_acks: Vec<(Address, dataplane_core::wire::GoneScope)>,
}

fn classify(effects: &[Effect]) -> StepSends {
    let mut s = StepSends::default();
    for effect in effects {
        if let Effect::Send { to, message } = effect {
            match message {
                Message::Reply(reply) => s.replies.push((*to, reply.clone())),
                Message::Retire { .. } => s.retires.push(*to),
                Message::Displaced { incarnation, .. } => s.displaced.push((*to, *incarnation)),
                Message::GoneAcknowledged { scope } => s.gone_acks.push((*to, *scope)),
                _ => {}
            }
        }
    }
    s
}

/// Removes equal items pairwise; returns what is left on each side.
fn diff<T: PartialEq + Clone>(expected: &[T], actual: &[T]) -> (Vec<T>, Vec<T>) {
    let mut missing = Vec::new();
    let mut extra: Vec<T> = actual.to_vec();
    for e in expected {
        match extra.iter().position(|a| a == e) {
            Some(i) => {
                extra.remove(i);
            }
            None => missing.push(e.clone()),
        }
    }
    (missing, extra)
}

impl Checker {
    /// A checker for a run with `options`.
    pub fn new(options: &Options) -> Self {
        Checker {
            directory_seen: 0,
            // The simulated directory's limits (`world.rs`): core's defaults, the seed's retry
            // batch, and in some seeds small tables.
            model: Model::new(options.limits.directory(options.retry_batch)),
            retry_batch: options.retry_batch,
            failure: None,
            coverage: Coverage::default(),
            released_epoch: AuthorityEpoch::NONE,
            matches: BTreeMap::new(),
            definitive: BTreeMap::new(),
            told_unroutable: BTreeSet::new(),
            ticks_without_frame: BTreeMap::new(),
            replies_released: 0,
            healed_at: None,
            call_ops: BTreeMap::new(),
            proxies: ProxyChecker::new(
                options.proxy.deadline,
                options.proxy.retry_period,
                options.proxy.absent_read_wait(),
            ),
            steps_checked: 0,
            hosts: host::HostChecker::default(),
            world_time: None,
        }
    }

    /// S34 for every running host: after a recovery.
    pub fn sources_backed(&mut self, now: Instant, dir: &Directory, hosts: &[HostNode]) {
        if let Err(v) = self.hosts.sources_backed(dir, self.directory_seen, hosts) {
            self.fail(now, v);
        }
    }

    /// S34 after a committing directory step: the sources it bound.
    pub fn sources_newly_bound(
        &mut self,
        now: Instant,
        dir: &Directory,
        effects: &[Effect],
        hosts: &[HostNode],
    ) {
        if let Err(v) = self.hosts.sources_newly_bound(dir, effects, hosts) {
            self.fail(now, v);
        }
    }

    /// A host machine stepped.
    pub fn machine_step(
        &mut self,
        now: Instant,
        host: &HostNode,
        effects: &[Effect],
        on_tick: bool,
        dir: Option<&Directory>,
    ) {
        let Some(machine) = host.machine.as_ref() else {
            return;
        };
        let mut result = self.hosts.machine_step(machine);
        if result.is_ok() {
            result = self.hosts.unpublish_names_its_revision(machine, effects);
        }
        if result.is_ok() {
            result = self.hosts.calls_paced(effects, on_tick);
            self.hosts.retractions_sent(now, machine, effects);
        }
        if result.is_ok() {
            result = self.hosts.displacements_end_streams(machine, effects);
        }
        if result.is_ok() {
            result = self.hosts.declarations_paced(now, effects);
        }
        if result.is_ok() {
            result = self.hosts.transfers_bounded(now, machine);
        }
        if result.is_ok() {
            result = self.hosts.arena_accounted(machine);
        }
        if result.is_ok() {
            use dataplane_core::arena::ArenaMemory;
            result = self.hosts.digests_settled(machine, host.mem.bytes());
        }
        if let (Ok(()), Some(dir)) = (&result, dir) {
            result =
                self.hosts
                    .sources_backed(dir, self.directory_seen, std::slice::from_ref(host));
        }
        if let Err(v) = result {
            self.fail(now, v);
        }
    }

    /// A probe's write was refused `ArenaExhausted` (`Note::ArenaFull`), in an arena of
    /// `arena_size` bytes (the world's option): `Some(true)` if the arena holds only blobs the directory binds on this host and no free range fits the
    /// write (the probe may skip it), `Some(false)` if operations still in progress hold the
    /// rest (the probe asks again), `None` after recording a violation.
    pub fn probe_arena_full(
        &mut self,
        now: Instant,
        machine: &dataplane_core::host::Host,
        dir: &Directory,
        arena_size: u64,
        length: u64,
    ) -> Option<bool> {
        match self
            .hosts
            .probe_arena_full(machine, dir, arena_size, length)
        {
            Ok(settled) => {
                self.coverage.hit(if settled {
                    "probe.arena_full_of_bound_blobs"
                } else {
                    "probe.arena_full_for_now"
                });
                Some(settled)
            }
            Err(v) => {
                self.fail(now, v);
                None
            }
        }
    }

    /// A worker reported something.
    pub fn host_note(&mut self, now: Instant, note: crate::worker::Note, dir: Option<&Directory>) {
        match self.hosts.note(note, dir) {
            Ok(name) => self.coverage.hit(name),
            Err(v) => self.fail(now, v),
        }
    }

    /// Records a violation (the first one wins; the run stops). It is labelled with the
    /// world's time (`set_time`), whatever node's clock `now` was read from, so a failure's
    /// time is the one the trace shows; before the first event it is `now`.
    pub fn fail(&mut self, now: Instant, message: String) {
        if self.failure.is_none() {
            let at = self.world_time.unwrap_or(now);
            self.failure = Some(format!("at {at}: {message}"));
        }
    }

    /// The world's time of the event being handled (the nodes' clocks may differ from it).
    pub fn set_time(&mut self, now: Instant) {
        self.world_time = Some(now);
    }

    /// Whether a violation was found.
    pub fn failed(&self) -> bool {
        self.failure.is_some()
    }

    /// The first violation.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The run healed.
    /// A frame reached a host machine (before it steps).
    pub fn host_input(
        &mut self,
        machine: &dataplane_core::host::Host,
        to: Address,
        message: &Message,
    ) {
        self.hosts.retraction_input(machine, to, message);
    }

    pub fn healed(&mut self, now: Instant) {
        self.healed_at = Some(now);
    }

    /// A proxy instance started on `host`.
    pub fn proxy_started(&mut self, host: usize, incarnation: u64, generation: u64) {
        self.proxies.started((host, incarnation, generation));
    }

    /// A proxy instance stopped (restart or host crash): its pending table is gone.
    pub fn proxy_stopped(&mut self, host: usize, incarnation: u64, generation: u64) {
        self.proxies.stopped((host, incarnation, generation));
    }

    /// One proxy step: the §13.7 checks.
    pub fn proxy_step(
        &mut self,
        now: Instant,
        id: ProxyId,
        input: &ProxyInput,
        effects: &[Effect],
        proxy: &dataplane_core::proxy::Proxy,
    ) {
        if self.failed() {
            return;
        }
        let mut hits = Vec::new();
        let result = self.proxies.step(now, id, input, effects, proxy, &mut hits);
        for hit in hits {
            self.coverage.hit(hit);
        }
        if let Err(violation) = result {
            self.fail(now, violation);
        }
    }

    /// A host crashed.
    pub fn host_crashed(&mut self) {
        self.coverage.hit("fault.host_crash");
    }

    /// The directory's steps up to `step` are durable.
    pub fn directory_synced(&mut self, step: u64) {
        self.model.forget_through(step);
    }

    /// The directory crashed; steps after `surviving_step` did not reach the disk.
    pub fn directory_crashed(&mut self, surviving_step: u64) {
        self.directory_seen += 1;
        self.model.rollback_after(surviving_step);
        self.told_unroutable.clear();
        self.ticks_without_frame.clear();
    }

    /// A recovered directory served its first step.
    pub fn directory_recovered(
        &mut self,
        now: Instant,
        step: u64,
        effects: &[Effect],
        dir: &Directory,
    ) {
        self.directory_seen += 1;
        self.model.recover(step);
        self.check_recovered(now, effects, dir);
    }

    /// A replicated directory's new leader served its first step at `epoch`, its term
    /// (`sim/src/replicated.rs`): the model, rolled back to the committed steps, recovers at
    /// that epoch instead of the next one. Everything else is checked as for a recovery.
    pub fn directory_recovered_in_epoch(
        &mut self,
        now: Instant,
        step: u64,
        effects: &[Effect],
        dir: &Directory,
        epoch: AuthorityEpoch,
    ) {
        self.directory_seen += 1;
        self.model.recover_in_epoch(step, epoch);
        self.check_recovered(now, effects, dir);
    }

    fn check_recovered(&mut self, now: Instant, effects: &[Effect], dir: &Directory) {
        if dir.epoch() != self.model.epoch() {
            let (got, want) = (dir.epoch(), self.model.epoch());
            self.fail(now, format!("S3: recovered epoch {got}, expected {want}"));
        }
        if dir.epoch() <= self.released_epoch {
            let (got, seen) = (dir.epoch(), self.released_epoch);
            self.fail(
                now,
                format!("S3: recovered epoch {got} not above served epoch {seen}"),
            );
        }
        if dir.durable().obligation_count() > 0 {
            self.coverage.hit("recovery.obligations_restored");
        }
        if dir.fences().next().is_some() {
            self.coverage.hit("recovery.fence_restored");
        }
        self.compare_full(now, dir);
        let sends = classify(effects);
        self.check_obligation_frames(now, &sends, dir, true);
        for note in self.model.take_out().notes {
            self.coverage.hit(note);
        }
    }

    /// One directory step: compare with the model, then check the safety properties.
    /// The directory's disk has room for new operations again (`None`), or not: the model
    /// hears it at the same step as the directory (the world decides it from the disk).
    pub fn directory_space(&mut self, why: Option<dataplane_core::error::Reason>) {
        self.model.set_no_space(why);
    }

    pub fn directory_step(
        &mut self,
        now: Instant,
        step: u64,
        input: &DirInput,
        effects: &[Effect],
        dir: &Directory,
    ) {
        // The entries change only with a commit (a persisted record), a crash or a recovery.
        if effects.iter().any(|e| matches!(e, Effect::Persist(_))) {
            self.directory_seen += 1;
        }
        if self.failed() {
            return;
        }
        let model_writes = self.model.durable_writes();
        match input {
            DirInput::Message(Message::Call(call)) => {
                self.coverage.hit(op_name(&call.request));
                self.model
                    .call(step, call.request_id, call.reply_to, call.request.clone());
            }
            DirInput::Message(Message::SourceRetired { source }) => {
                self.coverage.hit("input.SourceRetired");
                self.model.source_retired(step, *source);
            }
            DirInput::Message(Message::StreamDisplaced {
                endpoint,
                incarnation,
            }) => {
                self.coverage.hit("input.StreamDisplaced");
                self.model.stream_displaced(step, *endpoint, *incarnation);
            }
            DirInput::Message(Message::AddressGone { scope, reply_to }) => {
                self.coverage.hit(match scope {
                    dataplane_core::wire::GoneScope::Address(_) => "input.AddressGone.address",
                    dataplane_core::wire::GoneScope::NodeBefore { .. } => "input.AddressGone.node",
                });
                self.model.address_gone(step, *scope, *reply_to);
            }
            DirInput::Message(_) => {}
            DirInput::Timer => self.model.tick(step),
            DirInput::Route { target, routable } => {
                // SPEC §5.6: a report counts only while its target is watched, that is while
                // an obligation toward it is outstanding (restated from the model, not read
                // from the directory); a late report for an ended watch changes nothing.
                let counted = self.model.obligation_targets().contains(target);
                self.model.route(step, *target, *routable);
                if !counted {
                    self.coverage.hit("input.route_unwatched");
                } else if *routable {
                    self.coverage.hit("input.route_routable");
                    self.told_unroutable.remove(target);
                } else {
                    self.coverage.hit("input.route_unroutable");
                    self.told_unroutable.insert(*target);
                }
            }
        }
        // Routability is forgotten with the target's last obligation: a later obligation
        // toward it starts unknown, which counts as routable (ARCHITECTURE, routes).
        if !self.told_unroutable.is_empty() {
            let targets = self.model.obligation_targets();
            self.told_unroutable.retain(|t| targets.contains(t));
        }
        let expected = self.model.take_out();
        for note in &expected.notes {
            self.coverage.hit(note);
        }
        let sends = classify(effects);
        self.compare_replies(now, input, &expected, &sends);
        if !self.failed() {
            self.compare_notices(now, input, &expected, &sends, dir);
        }
        // The durable states can only part ways in a step where one of them changed: the
        // directory changes its durable state only through a Persist.
        let persisted = effects.iter().any(|e| matches!(e, Effect::Persist(_)));
        let changed = persisted || self.model.durable_writes() != model_writes;
        if !self.failed() && (changed || step.is_multiple_of(DURABLE_COMPARE_EVERY)) {
            self.compare_durable(now, dir);
        } else if !self.failed() {
            self.compare_runtime(now, dir);
        }
        if !self.failed() {
            self.check_step_safety(now, input, &sends, dir);
        }
        if !self.failed() {
            self.check_no_effect_after_pruning(now, effects);
        }
    }

    /// Retention: no operation takes effect (gets a record: a commit, a join, a sticky
    /// refusal, a reservation) once it is expired, that is once its record may have been
    /// pruned. Expiry only grows (horizons and floors rise), so the model's state after the
    /// step judges every record the step created.
    fn check_no_effect_after_pruning(&mut self, now: Instant, effects: &[Effect]) {
        use dataplane_core::log::LogRecord as R;
        for effect in effects {
            let Effect::Persist(record) = effect else {
                continue;
            };
            let op = match record {
                R::Committed { operation, .. }
                | R::Joined { operation, .. }
                | R::Rejected { operation, .. }
                | R::Reserved { operation, .. } => *operation,
                _ => continue,
            };
            if self.model.expired(op) {
                self.fail(
                    now,
                    format!("retention: operation {op} took effect after its record was pruned ({record:?})"),
                );
                return;
            }
        }
    }

    fn compare_replies(
        &mut self,
        now: Instant,
        input: &DirInput,
        expected: &Out,
        sends: &StepSends,
    ) {
        let (missing, extra) = diff(&expected.replies, &sends.replies);
        if !missing.is_empty() || !extra.is_empty() {
            self.fail(
                now,
                format!("model: replies differ for {input:?}\n  expected but not sent: {missing:?}\n  sent but not expected: {extra:?}"),
            );
        }
        let want_acks = &expected.gone_acks;
        if *want_acks != sends.gone_acks {
            self.fail(
                now,
                format!(
                    "model: gone acknowledgements differ: expected {want_acks:?}, sent {:?}",
                    sends.gone_acks
                ),
            );
        }
    }

    /// Fresh Retire/Displaced notices must be exactly the model's for ordinary inputs; ticks,
    /// route wakes and recoveries are checked by the engine properties instead.
    fn compare_notices(
        &mut self,
        now: Instant,
        input: &DirInput,
        expected: &Out,
        sends: &StepSends,
        dir: &Directory,
    ) {
        match input {
            DirInput::Timer => {
                self.check_obligation_frames(now, sends, dir, false);
                return;
            }
            DirInput::Route { target, .. } => {
                let stray = sends
                    .retires
                    .iter()
                    .chain(sends.displaced.iter().map(|(a, _)| a))
                    .any(|a| a != target);
                if stray || sends.retires.len() > 1 || sends.displaced.len() > 1 {
                    self.fail(
                        now,
                        format!(
                            "S23: route wake for {target} sent {:?} / {:?}",
                            sends.retires, sends.displaced
                        ),
                    );
                }
                return;
            }
            DirInput::Message(_) => {}
        }
        let (m1, x1) = diff(&expected.retires, &sends.retires);
        let (m2, x2) = diff(&expected.displaced, &sends.displaced);
        if !(m1.is_empty() && x1.is_empty() && m2.is_empty() && x2.is_empty()) {
            self.fail(now, format!("model/S23: notices differ for {input:?}: retire missing {m1:?} extra {x1:?}; displaced missing {m2:?} extra {x2:?}"));
        }
        for key in sends
            .retires
            .iter()
            .map(|a| ObligationKey::Retire(*a))
            .chain(
                sends
                    .displaced
                    .iter()
                    .map(|(a, inc)| ObligationKey::Displace(*a, *inc)),
            )
        {
            self.ticks_without_frame.insert(key, (0, 0));
        }
    }

    /// Tick and recovery frames: at most a batch (32 unless the seed drew fewer), only to pending obligations, never to a target
    /// reported unroutable (tick), never to the source of a live binding; fair rotation.
    fn check_obligation_frames(
        &mut self,
        now: Instant,
        sends: &StepSends,
        dir: &Directory,
        recovery: bool,
    ) {
        let frames = sends.retires.len() + sends.displaced.len();
        let batch = self.retry_batch;
        if frames > batch {
            self.fail(now, format!("S23: {frames} obligation frames in one pass"));
            return;
        }
        if frames == batch {
            self.coverage.hit("tick.batch_full");
        }
        if dir.durable().obligation_count() > batch {
            self.coverage.hit("tick.obligations_beyond_batch");
        }
        match dir.durable().obligation_count() {
            0 => {}
            1..=3 => self.coverage.hit("tick.obligations_1_3"),
            4..=15 => self.coverage.hit("tick.obligations_4_15"),
            _ => self.coverage.hit("tick.obligations_16_plus"),
        }
        let durable = dir.durable();
        let mut sent = BTreeSet::new();
        for a in &sends.retires {
            sent.insert(ObligationKey::Retire(*a));
        }
        for (a, inc) in &sends.displaced {
            sent.insert(ObligationKey::Displace(*a, *inc));
            if !durable.is_displacing(*a, *inc) {
                self.fail(
                    now,
                    format!("S8: Displaced({inc}) to {a} without that durable obligation"),
                );
            }
        }
        for key in &sent {
            if !durable.has_obligation(key) {
                self.fail(
                    now,
                    format!("S22: frame for {key:?} without a pending obligation"),
                );
            }
            if !recovery && self.told_unroutable.contains(&key.target()) {
                self.fail(
                    now,
                    format!("S24: tick frame for {key:?} to a target reported unroutable"),
                );
            }
        }
        if recovery {
            return;
        }
        // S25: every routable obligation gets a frame within ⌈N/batch⌉ ticks, N the most
        // obligations pending at any pass of its wait (the rotation reaches every one of them
        // before it comes back).
        let n = durable.obligation_count() as u64;
        let keys: Vec<ObligationKey> = durable.obligations_in_order().map(|(k, _)| k).collect();
        let mut next = BTreeMap::new();
        for key in keys {
            if self.told_unroutable.contains(&key.target()) || sent.contains(&key) {
                next.insert(key, (0, 0));
                continue;
            }
            let (waited, most) = self
                .ticks_without_frame
                .get(&key)
                .copied()
                .unwrap_or((0, 0));
            let (waited, most) = (waited + 1, most.max(n));
            let bound = most.div_ceil(batch as u64);
            if waited > bound {
                self.fail(
                    now,
                    format!(
                        "S25: {key:?} waited {waited} ticks with at most {most} obligations \
                         (batch {batch})"
                    ),
                );
            }
            next.insert(key, (waited, most));
        }
        self.ticks_without_frame = next;
    }

    fn check_step_safety(
        &mut self,
        now: Instant,
        input: &DirInput,
        sends: &StepSends,
        dir: &Directory,
    ) {
        // The directory's own invariant walk is O(state): after every step while the state is
        // small, every 8th step once it is large (the model and §13 checks above and below run
        // after every step regardless; recovery and the end always walk everything).
        let durable = dir.durable();
        let large = durable.entry_count() + durable.obligation_count() > INVARIANT_WALK_SMALL;
        self.steps_checked += 1;
        if (!large || self.steps_checked.is_multiple_of(INVARIANT_WALK_EVERY))
            && let Err(violation) = dir.check_invariants_fast()
        {
            self.fail(now, format!("directory invariant: {violation}"));
            return;
        }
        // S3: every reply carries the instance's epoch.
        if let Some((_, r)) = sends.replies.iter().find(|(_, r)| r.epoch != dir.epoch()) {
            self.fail(
                now,
                format!(
                    "S3: reply {r:?} carries epoch {} under {}",
                    r.epoch,
                    dir.epoch()
                ),
            );
        }
        // S22a: never retire the source of a live binding.
        for a in &sends.retires {
            let live = self.model.live_sources().find(|(_, s)| s == a);
            if let Some(path) = live.map(|(p, _)| p.clone()) {
                self.fail(
                    now,
                    format!("S22a: Retire to {a}, the live source of {path}"),
                );
            }
        }
        // S16: while a fence stands on P, no match newer than the fenced incarnation on P.
        for (_, reply) in &sends.replies {
            if let ReplyBody::StreamOpened(Ok(m)) = &reply.body {
                for (path, fence) in dir.fences() {
                    let on_path = matches!(dir.durable().entry(path), Some(Entry::Stream { revision }) if *revision == m.revision);
                    if on_path && m.incarnation > fence.incarnation {
                        self.fail(
                            now,
                            format!(
                                "S16: match {} on fenced {path} (fence {})",
                                m.incarnation, fence.incarnation
                            ),
                        );
                    }
                }
            }
        }
        // S9 is checked on release: remember which op each call carried.
        if let DirInput::Message(Message::Call(call)) = input {
            let sticky_kind = matches!(
                call.request,
                DirectoryRequest::Register { .. }
                    | DirectoryRequest::Unregister { .. }
                    | DirectoryRequest::Rename { .. }
                    | DirectoryRequest::ReserveBlob { .. }
            );
            if let (true, Some(op)) = (sticky_kind, call.request.operation()) {
                self.call_ops.insert((call.reply_to, call.request_id), op);
            }
        }
    }

    fn check_same_result(&mut self, now: Instant, op: OperationId, body: &ReplyBody) {
        use dataplane_core::error::NamespaceError as E;
        // Every refusal is sticky except a conflict (derived from another request's row), an
        // exhausted revision space, a refusal of a frame from a restarted node (the op id
        // stays unknown, and the answer is the same forever anyway), the refusal of an
        // expired operation (its record, and so its first answer, is forgotten), and the
        // refusals that leave no trace (a full operation table, a full disk).
        let transient = matches!(
            body.err(),
            Some(E::OperationConflict(_) | E::Storage(_) | E::OperationExpired(_) | E::NoSpace(_))
        ) || matches!(
            body.err(),
            Some(E::LimitReached(
                Limit::Operations | Limit::IssuerOperations | Limit::Issuers
            ))
        ) || matches!(body.err(), Some(E::PathReplaced(_)))
            && !self.model.has_record(op);
        if transient {
            return;
        }
        match self.definitive.get(&op) {
            Some(first) if first != body => {
                self.fail(
                    now,
                    format!("S9: op {op} answered {first:?} and later {body:?}"),
                );
            }
            Some(_) => self.coverage.hit("replay.definitive"),
            None => {
                self.definitive.insert(op, body.clone());
            }
        }
    }

    /// Every durable field against the model's (`dataplane_model::compare` names the first
    /// that differs), then which paths have a rendezvous or a fence.
    fn compare_durable(&mut self, now: Instant, dir: &Directory) {
        if let Some(difference) = compare::first_difference(dir.durable(), &self.model) {
            self.fail(
                now,
                format!("model: durable state differs after step: {difference}"),
            );
            return;
        }
        self.compare_runtime(now, dir);
    }

    /// The runtime half of `compare_durable`: which paths have a rendezvous or a fence.
    fn compare_runtime(&mut self, now: Instant, dir: &Directory) {
        let m = &self.model;
        let runtime_equal = dir
            .rendezvous_all()
            .map(|(p, _)| p)
            .eq(m.rendezvous().map(|(p, _)| p))
            && dir.fences().map(|(p, _)| p).eq(m.fenced());
        if !runtime_equal {
            self.fail(now, "model: rendezvous or fences differ after step".into());
            return;
        }
        // Routability marks live exactly as long as the watch: a mark kept past it is a table
        // without a bound and a stale answer for a later watch (issue 15, class 5).
        if !dir.unroutable_targets().eq(m.unroutable()) {
            let dir_marks: Vec<&Address> = dir.unroutable_targets().collect();
            let model_marks: Vec<&Address> = m.unroutable().collect();
            self.fail(
                now,
                format!(
                    "model: unroutable marks differ after step: directory {dir_marks:?}, model {model_marks:?}"
                ),
            );
        }
    }

    /// After a recovery: every durable field, the runtime tables, and the directory's full
    /// invariants.
    fn compare_full(&mut self, now: Instant, dir: &Directory) {
        self.compare_durable(now, dir);
        if let Err(v) = dir.check_invariants() {
            self.fail(now, format!("directory invariant after recovery: {v}"));
        }
    }

    /// A directory send was released past the barrier (it leaves the node now).
    pub fn released(&mut self, now: Instant, to: Address, message: &Message) {
        if let Message::Reply(reply) = message {
            // S9: the same op id always answers the same definitive result, as observed.
            if let Some(op) = self.call_ops.get(&(to, reply.request_id)).copied() {
                self.check_same_result(now, op, &reply.body);
            }
            self.replies_released += 1;
            self.coverage.hit(error_name(&reply.body));
            if let Some(dataplane_core::error::NamespaceError::LimitReached(limit)) =
                reply.body.err()
            {
                self.coverage.hit(limit_name(*limit));
            }
            if reply.epoch > self.released_epoch {
                self.released_epoch = reply.epoch;
            }
            if let ReplyBody::StreamOpened(Ok(m)) = &reply.body {
                self.coverage.hit("stream.match");
                match self.matches.get(&m.incarnation) {
                    Some(first) if first != m => {
                        self.fail(
                            now,
                            format!(
                                "S15: two matches carry incarnation {}: {first:?} and {m:?}",
                                m.incarnation
                            ),
                        );
                    }
                    Some(_) => {}
                    None => {
                        self.matches.insert(m.incarnation, m.clone());
                    }
                }
            }
            if let ReplyBody::StreamClosed(Ok(())) = &reply.body {
                self.coverage.hit("stream.close_ok");
            }
            if let ReplyBody::StreamCancelled(Ok(())) = &reply.body {
                self.coverage.hit("stream.cancel_ok");
            }
        }
    }

    /// The liveness phase is over: every eventual property must hold now.
    pub fn at_end(&mut self, now: Instant, view: &EndView<'_>) {
        if self.failed() {
            return;
        }
        let Some(dir) = view.directory else {
            self.fail(
                now,
                "liveness: the directory is not running after the heal".into(),
            );
            return;
        };
        if let Err(violation) = dir.check_invariants() {
            self.fail(now, format!("directory invariant at the end: {violation}"));
            return;
        }
        let durable = dir.durable();
        let bound = self
            .healed_at
            .map(|h| now.saturating_since(h))
            .unwrap_or_default();
        let mut problems = Vec::new();
        if let Some((path, r)) = dir.rendezvous_all().next() {
            let what = match r {
                Rendezvous::Pending(p) => format!(
                    "a pending rendezvous (op {} endpoint {} caller {})",
                    p.request.operation, p.request.endpoint, p.request.reply_to
                ),
                Rendezvous::Active(a) => format!(
                    "an active rendezvous {} (source {} sink {})",
                    a.matched.incarnation, a.matched.source, a.matched.sink
                ),
            };
            problems.push(format!("L1: {path} still has {what}"));
        }
        if let Some((path, _)) = dir.fences().next() {
            problems.push(format!("L3: {path} still fenced"));
        }
        for (key, _) in durable.obligations_in_order() {
            match key {
                ObligationKey::Retire(a) => {
                    problems.push(format!("L5: retirement of {a} still pending"));
                }
                ObligationKey::Displace(a, _) => {
                    problems.push(format!("L2: displacement of {a} still pending"));
                }
            }
        }
        if let Some((path, r)) = durable.reservations().next() {
            problems.push(format!("L4: {path} still reserved by {}", r.operation));
        }
        // Bounded by live state: once the callers declared what they finished and the
        // restarted nodes' reports were applied, no issuer keeps more than a handful of
        // records, however long the run was.
        for (issuer, row) in durable.issuers() {
            if row.records > RECORDS_PER_ISSUER_AT_END {
                problems.push(format!(
                    "retention: issuer {issuer} still has {} operation records",
                    row.records
                ));
            }
        }
        let bound_sources: BTreeSet<Address> = durable
            .entries()
            .filter_map(|(path, _)| match dir.source(path) {
                Some(dataplane_core::directory::SourceState::Available(b)) => Some(b.source),
                _ => None,
            })
            .collect();
        for host in view.hosts.iter().filter(|h| h.up) {
            for actor in &host.sources {
                let a = Address::new(host.node, host.incarnation, *actor);
                if !bound_sources.contains(&a) {
                    problems.push(format!(
                        "L6: live source {a} is bound nowhere (never retired)"
                    ));
                }
            }
            for (i, client) in host.clients.iter().enumerate() {
                if !client.is_idle() {
                    problems.push(format!(
                        "L7: client {}#{i} still busy: {:?}",
                        host.node, client.state
                    ));
                }
            }
            if !host.agent.pending().is_empty() {
                problems.push(format!("gone report of {} never acknowledged", host.node));
            }
            if host.machine.is_some() && !host.probed {
                problems.push(format!(
                    "no probe ever ran on {}: it never had every child closed and its \
                     connection to the directory up after the heal",
                    host.node
                ));
            }
        }
        let proxies: Vec<(ProxyId, &dataplane_core::proxy::Proxy)> = view
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.up)
            .filter_map(|(i, h)| {
                h.proxy
                    .as_ref()
                    .map(|p| ((i, h.incarnation, h.proxy_generation), p))
            })
            .collect();
        problems.extend(self.proxies.at_end(&proxies));
        self.hosts.at_end(dir, view.hosts, &mut problems);
        if self.replies_released == 0 {
            problems.push("the run exercised nothing: no reply was ever sent".into());
        }
        if !problems.is_empty() {
            problems.truncate(8);
            self.fail(
                now,
                format!("liveness ({bound} after the heal): {}", problems.join("; ")),
            );
        }
    }
}

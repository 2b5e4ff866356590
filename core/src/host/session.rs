//! Child sessions (SPEC §7): attach, opens with job-context resolution and authorization, and
//! close.
//!
//! Attach is validated completely before anything changes (Q28): a closing or closed session,
//! a second child, a wrong arena generation or capability is refused and leaves the session as
//! it was. Every later request must come from the attached child of a running session. Close
//! ends every binding the session tracks (the child is gone, so its views are released: Q24);
//! a write that is publishing keeps going until its outcome is known, and a published write
//! outlives the session (H-D1).

use super::{Host, Kind, Naming, Phase, SessionState};
use crate::arena::ArenaMemory;
use crate::effect::Outbox;
use crate::error::{AttachmentFailure, DataPlaneError, Limit, NamespaceError, Reason};
use crate::ids::Address;
use crate::path::Access;
use crate::time::Instant;
use crate::wire::{ChildEvent, ChildOp, ChildRequest, DirectoryRequest};

/// The op of a request that starts a new operation at the directory (a write, a move, a
/// remove, a file publication, a stream open), which a full disk refuses.
fn new_mutation(request: &ChildRequest) -> Option<ChildOp> {
    match request {
        ChildRequest::OpenWrite { op, .. }
        | ChildRequest::Move { op, .. }
        | ChildRequest::Remove { op, .. }
        | ChildRequest::PublishFile { op, .. }
        | ChildRequest::OpenStream { op, .. } => Some(*op),
        _ => None,
    }
}

impl Host {
    /// Why new mutations are refused at once, if they are: the directory refused one
    /// `NoSpace` less than [`super::NO_SPACE_HOLD`] ago and none went through since.
    pub fn directory_has_no_space(&self, now: Instant) -> Option<Reason> {
        let (why, at) = self.no_space.as_ref()?;
        (now < at.saturating_add(super::NO_SPACE_HOLD)).then(|| why.clone())
    }

    pub(super) fn session_request(
        &mut self,
        now: Instant,
        session: u64,
        from: Address,
        request: ChildRequest,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        if let ChildRequest::Attach {
            arena_generation,
            capability,
        } = request
        {
            self.attach(session, from, arena_generation, capability, out);
            return;
        }
        let Some(s) = self.sessions.get(&session) else {
            return;
        };
        if s.state != SessionState::Running || s.child != Some(from) {
            // Only the attached child of a running session is heard. An op-less request gets
            // no answer; an op-carrying one hears that the session is not running.
            let op = match &request {
                ChildRequest::OpenRead { op, .. }
                | ChildRequest::OpenWrite { op, .. }
                | ChildRequest::Seal { op }
                | ChildRequest::Abort { op }
                | ChildRequest::Release { op }
                | ChildRequest::Cancel { op }
                | ChildRequest::Stat { op, .. }
                | ChildRequest::Move { op, .. }
                | ChildRequest::Remove { op, .. }
                | ChildRequest::PublishFile { op, .. }
                | ChildRequest::OpenStream { op, .. }
                | ChildRequest::CloseStream { op } => Some(*op),
                ChildRequest::Attach { .. } | ChildRequest::Close => None,
            };
            if let Some(op) = op {
                let error = DataPlaneError::SessionNotRunning;
                self.send_child(from, ChildEvent::Failed { op, error }, out);
            }
            return;
        }
        if let Some(op) = new_mutation(&request)
            && let Some(why) = self.directory_has_no_space(now)
        {
            let error = DataPlaneError::Namespace(NamespaceError::NoSpace(why));
            self.send_child(from, ChildEvent::Failed { op, error }, out);
            return;
        }
        match request {
            ChildRequest::Attach { .. } => {}
            ChildRequest::OpenRead {
                op,
                path,
                expected_revision,
            } => {
                self.open(
                    now,
                    session,
                    from,
                    op,
                    &path,
                    Kind::Read { expected_revision },
                    mem,
                    out,
                );
            }
            ChildRequest::OpenWrite {
                op,
                path,
                length,
                digest,
                exclusive,
            } => {
                let kind = Kind::Write {
                    length,
                    digest,
                    exclusive,
                };
                self.open(now, session, from, op, &path, kind, mem, out);
            }
            ChildRequest::Seal { op } => {
                self.with_op(session, op, from, out, |host, actor, out| {
                    host.seal(now, actor, mem, out);
                });
            }
            ChildRequest::Abort { op } => {
                self.with_op(session, op, from, out, |host, actor, out| {
                    host.abort(now, actor, mem, out);
                });
            }
            ChildRequest::Release { op } => self.release(session, op, from, mem, out),
            ChildRequest::Cancel { op } => {
                // Unknown: the op already finished, and its outcome was its answer.
                if let Some(actor) = self.binding_of(session, op) {
                    self.cancel(actor, mem, out);
                }
            }
            ChildRequest::Stat { op, path } => {
                self.control(
                    now,
                    session,
                    from,
                    op,
                    super::control::Query::Stat { path },
                    out,
                );
            }
            ChildRequest::Move {
                op,
                from: source,
                to,
                replace,
            } => {
                let query = super::control::Query::Move {
                    from: source,
                    to,
                    replace,
                };
                self.control(now, session, from, op, query, out);
            }
            ChildRequest::Remove {
                op,
                path,
                expected_revision,
            } => {
                let query = super::control::Query::Remove {
                    path,
                    expected_revision,
                };
                self.control(now, session, from, op, query, out);
            }
            ChildRequest::Close => self.close(session, mem, out),
            ChildRequest::PublishFile { op, path, file } => {
                self.publish_file(now, session, from, op, &path, &file, mem, out);
            }
            ChildRequest::OpenStream {
                op,
                path,
                role,
                descriptor,
                replace,
                ensure,
                expected_revision,
            } => {
                let open = super::streams::StreamOpen {
                    role,
                    descriptor,
                    replace,
                    ensure,
                    expected_revision,
                };
                self.open_stream(now, session, from, op, &path, open, out);
            }
            ChildRequest::CloseStream { op } => match self.binding_of(session, op) {
                Some(actor) => self.close_stream(now, actor, out),
                None => {
                    let error = DataPlaneError::InvalidArgument(super::reason(
                        "no such stream in this session",
                    ));
                    self.send_child(from, ChildEvent::Failed { op, error }, out);
                }
            },
        }
    }

    /// Runs `f` on the binding of `op`, or tells the child the op is unknown.
    fn with_op(
        &mut self,
        session: u64,
        op: ChildOp,
        child: Address,
        out: &mut Outbox,
        f: impl FnOnce(&mut Host, u64, &mut Outbox),
    ) {
        match self.binding_of(session, op) {
            Some(actor) => f(self, actor, out),
            None => {
                let error = DataPlaneError::Blob(crate::error::BlobFailure::AlreadyFinished);
                self.send_child(child, ChildEvent::Failed { op, error }, out);
            }
        }
    }

    /// The binding of `op` in `session`: tracked ones first, then published writes (which the
    /// session no longer tracks but the child may still abort: Q22).
    pub(super) fn binding_of(&self, session: u64, op: ChildOp) -> Option<u64> {
        let s = self.sessions.get(&session)?;
        s.ops.get(&op).or_else(|| s.published.get(&op)).copied()
    }

    /// Whether `session` may start one more operation: the session's own bound first, then
    /// the host's. Published writes count against neither (the arena bounds them).
    pub(super) fn room_for_operation(&self, session: u64) -> Result<(), DataPlaneError> {
        let own = self.sessions.get(&session).map_or(0, |s| s.ops.len());
        if own >= self.config.session_operations_max {
            return Err(DataPlaneError::LimitReached(Limit::SessionOperations));
        }
        if self.operations_in_progress() >= self.config.operations_max {
            return Err(DataPlaneError::LimitReached(Limit::HostOperations));
        }
        Ok(())
    }

    fn attach(
        &mut self,
        session: u64,
        child: Address,
        arena_generation: u64,
        capability: crate::wire::Capability,
        out: &mut Outbox,
    ) {
        let Some(s) = self.sessions.get(&session) else {
            return;
        };
        let refusal = if matches!(s.state, SessionState::Closing | SessionState::Closed) {
            Some(AttachmentFailure::SessionClosed)
        } else if s.child.is_some() {
            Some(AttachmentFailure::DuplicateAttachment)
        } else if arena_generation != self.config.arena_generation {
            Some(AttachmentFailure::ArenaGenerationMismatch {
                expected: self.config.arena_generation,
                found: arena_generation,
            })
        } else if !capability.matches(&s.config.capability) {
            Some(AttachmentFailure::CapabilityRejected)
        } else {
            None
        };
        if let Some(failure) = refusal {
            let error = DataPlaneError::Attachment(failure);
            self.send_child(child, ChildEvent::AttachFailed { error }, out);
            return;
        }
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        s.child = Some(child);
        s.state = SessionState::Running;
        let session_generation = s.config.session_generation;
        self.send_child(child, ChildEvent::Attached { session_generation }, out);
    }

    /// The checks of every op that opens a binding (SPEC §7.2): the path resolves in the
    /// session's job and the job allows `access` there, a path the op may create or replace
    /// is fit for a new name ([`DataPath::check_new_name`](crate::path::DataPath::check_new_name)),
    /// the op is fresh in the session, and the session and the host have room for one more
    /// operation in progress. Changes nothing.
    pub(super) fn check_open(
        &self,
        session: u64,
        op: ChildOp,
        logical: &str,
        access: Access,
        names: Naming,
    ) -> Result<crate::path::DataPath, DataPlaneError> {
        let Some(s) = self.sessions.get(&session) else {
            return Err(DataPlaneError::SessionNotRunning);
        };
        let job = &s.config.job;
        let path = job.resolve(logical).map_err(DataPlaneError::InvalidPath)?;
        if names == Naming::New {
            path.check_new_name().map_err(DataPlaneError::InvalidPath)?;
        }
        if !job.allows(&path, access) {
            return Err(DataPlaneError::Unauthorized {
                path,
                operation: access,
            });
        }
        if self.binding_of(session, op).is_some() {
            return Err(DataPlaneError::InvalidArgument(super::reason(
                "operation id already in use in this session",
            )));
        }
        self.room_for_operation(session)?;
        Ok(path)
    }

    /// Validates an open (SPEC §7.2: path resolution, authorization, a fresh op) and starts its
    /// binding.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        now: Instant,
        session: u64,
        child: Address,
        op: ChildOp,
        logical: &str,
        kind: Kind,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        if !self.sessions.contains_key(&session) {
            return;
        }
        let (access, names) = match kind {
            Kind::Read { .. } | Kind::Control => (Access::Read, Naming::Existing),
            Kind::Stream { .. } => (Access::Read, Naming::New),
            Kind::Write { .. } | Kind::File { .. } => (Access::Write, Naming::New),
        };
        let path = match self.check_open(session, op, logical, access, names) {
            Ok(path) => path,
            Err(error) => {
                self.send_child(child, ChildEvent::Failed { op, error }, out);
                return;
            }
        };
        let phase = match kind {
            Kind::Control => Phase::Controlling,
            Kind::File { .. } => Phase::Publishing,
            Kind::Stream { .. } => Phase::StreamOpening,
            Kind::Read { .. } => Phase::Resolving,
            Kind::Write {
                exclusive: true, ..
            } => Phase::Reserving,
            Kind::Write { .. } => Phase::Allocating,
        };
        let actor = self.start_binding(session, child, op, path.clone(), kind, phase);
        let address = self.address(actor);
        match kind {
            Kind::Control | Kind::File { .. } | Kind::Stream { .. } => {}
            Kind::Read { .. } => {
                self.call(now, actor, DirectoryRequest::Resolve { path }, out);
            }
            Kind::Write {
                exclusive: true, ..
            } => {
                let operation = self.op_id(actor, super::PURPOSE_RESERVE);
                let request = DirectoryRequest::ReserveBlob {
                    path,
                    operation,
                    owner: address,
                };
                self.call(now, actor, request, out);
            }
            Kind::Write { length, .. } => self.allocate(now, actor, length, mem, out),
        }
    }

    /// The child no longer maps the lease of `op` (Q24): the view hold goes, and the lease is
    /// freed if nothing else holds it. Always acknowledged with `Released`.
    fn release(
        &mut self,
        session: u64,
        op: ChildOp,
        child: Address,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(actor) = self.binding_of(session, op) else {
            let error = DataPlaneError::Blob(crate::error::BlobFailure::AlreadyFinished);
            self.send_child(child, ChildEvent::Failed { op, error }, out);
            return;
        };
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        if !b.child_holds {
            let error = DataPlaneError::Blob(crate::error::BlobFailure::InvalidLease);
            self.send_child(child, ChildEvent::Failed { op, error }, out);
            return;
        }
        b.child_holds = false;
        match b.phase {
            // Releasing a read ends it; releasing a write that was never sealed aborts it.
            Phase::Reading => b.phase = Phase::Draining,
            Phase::Writing => {
                if let Some(slot) = b.lease {
                    slot.abort_write(mem);
                }
                b.phase = Phase::Draining;
                self.send_child(child, ChildEvent::Aborted { op }, out);
            }
            _ => {}
        }
        self.send_child(child, ChildEvent::Released { op }, out);
        self.try_finish(actor, mem, out);
    }

    /// The supervisor revokes session `session` (issue 17): the child is told `Revoked`, then
    /// the session closes as if the child had died (Q24: its views are gone; published writes
    /// stay). Nothing happens to a session that is closing already or unknown. Returns whether
    /// the session was revoked.
    pub fn revoke_session(
        &mut self,
        now: Instant,
        session: Address,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) -> bool {
        self.now = now;
        let Some(s) = self
            .sessions
            .get(&session.actor)
            .filter(|s| s.address == session)
        else {
            return false;
        };
        if matches!(s.state, SessionState::Closing | SessionState::Closed) {
            return false;
        }
        let child = s.child;
        self.input_arrived(now, out);
        if let Some(child) = child {
            self.send_child(child, ChildEvent::Revoked, out);
        }
        self.close(session.actor, mem, out);
        true
    }

    /// Close (SPEC §7.2, H4): the child is gone; every tracked binding ends. Writes that are
    /// publishing keep going until their outcome is known; published writes stay.
    fn close(&mut self, session: u64, mem: &mut dyn ArenaMemory, out: &mut Outbox) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        s.state = SessionState::Closing;
        let actors: Vec<u64> = s
            .ops
            .values()
            .chain(s.published.values())
            .copied()
            .collect();
        for actor in actors {
            self.session_gone(actor, mem, out);
        }
        self.maybe_closed(session, out);
    }

    /// The session of binding `actor` is gone: the child no longer maps anything, and what it
    /// was waiting for is dropped.
    fn session_gone(&mut self, actor: u64, mem: &mut dyn ArenaMemory, out: &mut Outbox) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        b.child_holds = false;
        match &b.phase {
            Phase::Publishing | Phase::Published | Phase::Unpublishing | Phase::Draining => {}
            Phase::Writing => {
                if let Some(slot) = b.lease {
                    slot.abort_write(mem);
                }
                b.phase = Phase::Draining;
            }
            // The child's stream ends with it: a waiting open is retracted, a matched stream
            // closed; a close in flight is handed over (below).
            Phase::StreamOpening | Phase::Streaming(_) => {
                self.retract_stream(actor, out);
                if let Some(b) = self.bindings.get_mut(&actor) {
                    b.phase = Phase::Draining;
                }
            }
            Phase::StreamClosing => {
                // The close in flight is handed over like any retraction: one a full proxy
                // refused waits for a tick the binding will not see, and one the proxy holds
                // is lost if the proxy restarts (both left the rendezvous matched at the
                // directory: seed 3535). The proxy keeps the binding's own copy too (the
                // cancel in `try_finish`); a second close finds nothing to close.
                let close = b.call.as_ref().map(|call| call.request.clone());
                b.phase = Phase::Draining;
                if let Some(close) = close {
                    self.hand_over(close, out);
                }
            }
            // A control call's answer has nobody to go to: the child is gone.
            Phase::Reserving
            | Phase::Resolving
            | Phase::Allocating
            | Phase::Filling(_)
            | Phase::Reading
            | Phase::Controlling => {
                b.phase = Phase::Draining;
            }
        }
        self.try_finish(actor, mem, out);
    }

    /// A closing session whose tracked bindings all finished is closed.
    pub(super) fn maybe_closed(&mut self, session: u64, out: &mut Outbox) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if s.state == SessionState::Closing && s.ops.is_empty() {
            s.state = SessionState::Closed;
            if let Some(child) = s.child {
                self.send_child(child, ChildEvent::Closed, out);
            }
            // Freed at once: nothing can reach a closed session (its published writes outlive
            // it on their own, and its child may no longer address them).
            self.sessions.remove(&session);
        }
    }
}

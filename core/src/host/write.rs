//! The write path (SPEC §9.3 with DESIGN Q19–Q23): reserve (exclusive writes) → allocate →
//! the child writes and seals → the host validates the header → a source is created →
//! Register (with the reservation) → published → … → the directory retires the source → the
//! lease is freed once the child released its view.
//!
//! * Q20: a Register whose outcome is unknown (the proxy answered Timeout or
//!   DirectoryUnavailable) is sent again with the same op id until a definitive answer; until
//!   then the namespace may bind the source, so its lease is kept.
//! * Q19/Q21: an abort after publication unregisters *the revision it published*
//!   (compare-and-delete), re-driven the same way; the lease waits for the directory's Retire.
//! * Q22: abort reaches a published write although the session no longer tracks it.
//! * Q23: a binding that finishes while its allocation waits cancels it (Q25: it leaves the
//!   queue at once); a grant for a finished binding goes straight back.

use super::{
    Host, Kind, NamespaceHold, PURPOSE_PUBLISH, PURPOSE_UNPUBLISH, Phase, Source, child_error,
    is_unknown_outcome, never_dispatched,
};
use crate::arena::ArenaMemory;
use crate::blob::{self, BlobState, DigestKind};
use crate::effect::Outbox;
use crate::error::{DataPlaneError, NamespaceError};
use crate::time::Instant;
use crate::wire::{
    ChildEvent, DirectoryReply, DirectoryRequest, ReplyBody, RequestKind, SourceRecovery,
};

impl Host {
    /// A write's lease is installed (Writable, zeroed): hand it to the child.
    pub(super) fn write_granted(&mut self, actor: u64, out: &mut Outbox) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let Some(slot) = b.lease else { return };
        b.phase = Phase::Writing;
        b.child_holds = true;
        b.granted_at = self.now;
        // The write deadline is timed from here.
        self.timed.insert(actor);
        let lease = slot.view();
        let (child, op) = (b.child, b.op);
        self.send_child(child, ChildEvent::WriteGranted { op, lease }, out);
    }

    /// The child sealed: validate the header it wrote, then publish.
    pub(super) fn seal(
        &mut self,
        now: Instant,
        actor: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get(&actor) else {
            return;
        };
        let (Phase::Writing, Some(slot), Kind::Write { .. }) = (&b.phase, b.lease, b.kind) else {
            let (child, op) = (b.child, b.op);
            let error = DataPlaneError::Blob(crate::error::BlobFailure::State { found: 0 });
            self.send_child(child, ChildEvent::Failed { op, error }, out);
            return;
        };
        // The child's bytes become final before anything looks at them: what is validated
        // below is what will be published.
        let hashed = slot.expected.digest_kind == DigestKind::Blake3;
        let frozen = match mem.freeze(&slot.lease, hashed) {
            Ok(frozen) => frozen,
            Err(fault) => {
                let error = DataPlaneError::Blob(crate::error::BlobFailure::NotFinal(
                    super::reason(&fault.to_string()),
                ));
                self.fail(actor, error, mem, out);
                return;
            }
        };
        let checked = blob::validate(mem.bytes(), &slot.expected, BlobState::Sealed, false)
            .and_then(|header| {
                if header.digest_kind != DigestKind::Blake3 {
                    return Ok(header);
                }
                // The digest of the bytes made final: the memory's, computed as it froze
                // them, or ours. A child's digest must equal it; a zero one is filled in.
                let computed = match frozen {
                    Some(digest) => digest,
                    None => blob::digest(blob::payload(mem.bytes(), &slot.expected)?),
                };
                let digest = blob::settle_digest(mem.bytes_mut(), &slot.expected, &computed)?;
                Ok(blob::BlobHeader { digest, ..header })
            });
        let header = match checked {
            Ok(header) => header,
            Err(error) => {
                // S33: a seal whose header disagrees with the lease is never published.
                slot.abort_write(mem);
                self.fail(actor, DataPlaneError::Blob(error), mem, out);
                return;
            }
        };
        let source_actor = self.allocate_actor();
        let source = Source {
            address: self.address(source_actor),
            binding: actor,
            payload_offset: slot.lease.payload_offset(),
            length: slot.lease.length,
            digest: (header.digest_kind == DigestKind::Blake3).then_some(header.digest),
        };
        self.sources.insert(source_actor, source);
        // A fresh op id (the new source's number), not the binding's: a write may be open for
        // a long time, and only calls in flight may hold back the horizon (see horizon.rs).
        let operation = self.op_id(source_actor, PURPOSE_PUBLISH);
        let node = self.config.node;
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        b.namespace = NamespaceHold::MayBind {
            source: source_actor,
        };
        b.phase = Phase::Publishing;
        let request = DirectoryRequest::Register {
            path: b.path.clone(),
            source: source.address,
            source_node: node,
            length: slot.lease.length,
            recovery: SourceRecovery::Actor {
                actor: source.address,
                node,
                owner: Some(b.address),
            },
            operation,
            reservation: b.reservation,
        };
        self.call(now, actor, request, out);
    }

    /// The child aborts its write, in whatever phase it is (Q22 included).
    pub(super) fn abort(
        &mut self,
        now: Instant,
        actor: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let (child, op) = (b.child, b.op);
        if !matches!(b.kind, Kind::Write { .. }) {
            let error =
                DataPlaneError::InvalidArgument(super::reason("only a write can be aborted"));
            self.send_child(child, ChildEvent::Failed { op, error }, out);
            return;
        }
        match b.phase {
            Phase::Reserving | Phase::Allocating => {
                b.phase = Phase::Draining;
                self.send_child(child, ChildEvent::Aborted { op }, out);
                self.try_finish(actor, mem, out);
            }
            Phase::Writing => {
                if let Some(slot) = b.lease {
                    slot.abort_write(mem);
                }
                b.phase = Phase::Draining;
                self.send_child(child, ChildEvent::Aborted { op }, out);
                self.try_finish(actor, mem, out);
            }
            // Acted upon when the outcome is known: unpublish if it was published.
            Phase::Publishing => b.abort_requested = true,
            Phase::Published => self.unpublish(now, actor, out),
            // The directory already retired the published write (a replacement or an unlink
            // came first): it is absent, which is what an abort asks for.
            Phase::Draining if !b.tracked => {
                self.send_child(child, ChildEvent::Aborted { op }, out);
            }
            // Its answer is on its way (Unpublishing), or the op already failed.
            Phase::Unpublishing | Phase::Draining => {}
            Phase::Resolving | Phase::Filling(_) | Phase::Reading | Phase::Controlling => {}
            Phase::StreamOpening | Phase::Streaming(_) | Phase::StreamClosing => {}
        }
    }

    /// Cancel an open that has not been granted (reads and writes): it fails with
    /// `OperationCancelled`. A cancel that comes too late is not answered: the op's own outcome
    /// (its grant, or its failure) is already on its way, and is the only answer the op gets.
    pub(super) fn cancel(&mut self, actor: u64, mem: &mut dyn ArenaMemory, out: &mut Outbox) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let (child, op) = (b.child, b.op);
        if let Phase::Reserving
        | Phase::Resolving
        | Phase::Allocating
        | Phase::Filling(_)
        | Phase::StreamOpening = b.phase
        {
            // A stream's open is retracted and handed over too: the proxy's own retraction of
            // it dies with the proxy.
            self.retract_stream(actor, out);
            let Some(b) = self.bindings.get_mut(&actor) else {
                return;
            };
            b.phase = Phase::Draining;
            let error = DataPlaneError::OperationCancelled;
            self.send_child(child, ChildEvent::Failed { op, error }, out);
            self.try_finish(actor, mem, out);
        }
    }

    fn unpublish(&mut self, now: Instant, actor: u64, out: &mut Outbox) {
        // A number of its own: a published write may be aborted long after it was written.
        let fresh = self.allocate_actor();
        let operation = self.op_id(fresh, PURPOSE_UNPUBLISH);
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let NamespaceHold::Bound { revision, .. } = b.namespace else {
            return;
        };
        b.phase = Phase::Unpublishing;
        b.aborted_when_retired = true;
        let request = DirectoryRequest::Unregister {
            path: b.path.clone(),
            expected_revision: Some(revision),
            operation,
        };
        self.call(now, actor, request, out);
    }

    /// A reply from the proxy to binding `actor`.
    pub(super) fn namespace_reply(
        &mut self,
        now: Instant,
        actor: u64,
        reply: DirectoryReply,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let current = b
            .call
            .as_ref()
            .is_some_and(|c| c.id == reply.request_id && c.request.kind() == reply.body.kind());
        if !current {
            return;
        }
        match reply.body.err() {
            Some(NamespaceError::NoSpace(why)) => self.no_space = Some((why.clone(), now)),
            // A new operation went through (retractions and closes go through a full disk
            // too): the directory has room again.
            None if matches!(
                reply.body.kind(),
                RequestKind::Register
                    | RequestKind::ReserveBlob
                    | RequestKind::Unregister
                    | RequestKind::Rename
                    | RequestKind::OpenStream
            ) =>
            {
                self.no_space = None;
            }
            _ => {}
        }
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        if let Kind::Stream { .. } = b.kind {
            let closing = b.phase == Phase::StreamClosing;
            if closing && is_unknown_outcome(reply.body.err()) {
                // A close (a retraction) refused without a trace: ask again on the tick.
                self.resend_on_tick(actor);
                return;
            }
            // An open's answer is definitive, an unknown outcome included.
            let reached = b.call.take().is_some_and(|c| c.reached);
            self.stream_reply(actor, reply.body, reached, mem, out);
            return;
        }
        if self.settle_space_refusal(now, actor, &reply.body, mem, out) {
            return;
        }
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let query = matches!(reply.body, ReplyBody::Resolved(_) | ReplyBody::LookedUp(_));
        let error = reply.body.err();
        let reached = b.call.as_ref().is_some_and(|c| c.reached);
        let never_happened =
            !reached && matches!(error, Some(NamespaceError::DirectoryUnavailable(_)));
        if is_unknown_outcome(error) && !query && !never_happened {
            // Q20/Q21: the outcome is unknown; ask again under the same op id, on the next
            // tick.
            if !never_dispatched(error)
                && let Some(call) = b.call.as_mut()
            {
                call.reached = true;
            }
            self.resend_on_tick(actor);
            return;
        }
        // Otherwise definitive; `DirectoryUnavailable` is too when no attempt could have
        // reached a directory: the call did not happen, and the child hears so at the
        // proxy's deadline rather than wait for a directory for ever.
        b.call = None;
        if b.kind == Kind::Control {
            self.control_reply(now, actor, reply.body, mem, out);
            return;
        }
        if let Kind::File { .. } = b.kind {
            if let ReplyBody::Registered(result) = reply.body {
                self.file_registered(actor, result.map(|r| r.revision), mem, out);
            }
            return;
        }
        match reply.body {
            ReplyBody::BlobReserved(result) => self.reserved(now, actor, result, mem, out),
            ReplyBody::Registered(result) => {
                self.registered(now, actor, result.map(|r| r.revision), mem, out);
            }
            ReplyBody::Unregistered(result) => {
                self.unregistered(actor, result.map(|_| ()), mem, out);
            }
            ReplyBody::Resolved(result) => self.resolved(now, actor, result, mem, out),
            _ => {}
        }
    }

    /// Settling a call refused for space: a publication (a write's or a file's `Register`), a
    /// move (`Rename`) or a remove (`Unregister`). A refusal `NoSpace` left no trace: a copy of
    /// the call (a re-dispatch in flight) may still take effect once the directory has room,
    /// so the refusal alone is not an outcome the child may hear. The host makes it one with a
    /// retraction, which a full disk still takes: a release of a reservation under the call's
    /// op id. If the op id is unknown, the release records it (a tombstone: a later copy of
    /// the call is refused as a conflict), and the call fails with `NoSpace`, at once, instead
    /// of waiting for room. If a copy was applied first, the release is refused as a conflict,
    /// and the host asks the call again, whose replay answers it. Returns whether the reply
    /// was this settling's.
    fn settle_space_refusal(
        &mut self,
        now: Instant,
        actor: u64,
        body: &ReplyBody,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) -> bool {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return false;
        };
        let settles = match b.kind {
            Kind::Write { .. } | Kind::File { .. } => b.phase == Phase::Publishing,
            Kind::Control => b.phase == Phase::Controlling,
            Kind::Read { .. } | Kind::Stream { .. } => false,
        };
        if !settles {
            return false;
        }
        match (body, &b.space_refused) {
            (body, None) if matches!(body.err(), Some(NamespaceError::NoSpace(_))) => {
                let Some(NamespaceError::NoSpace(why)) = body.err() else {
                    return false;
                };
                let Some(call) = b.call.take() else {
                    return false;
                };
                let (path, operation) = match &call.request {
                    DirectoryRequest::Register {
                        path, operation, ..
                    }
                    | DirectoryRequest::Unregister {
                        path, operation, ..
                    }
                    | DirectoryRequest::Rename {
                        source: path,
                        operation,
                        ..
                    } => (path.clone(), *operation),
                    _ => {
                        b.call = Some(call);
                        return false;
                    }
                };
                let release = DirectoryRequest::ReleaseBlobReservation { path, operation };
                b.space_refused = Some((why.clone(), call.request));
                self.call(now, actor, release, out);
                true
            }
            (ReplyBody::BlobReservationReleased(Ok(())), Some(_)) => {
                // The op id is tombstoned: no copy of the call can take effect now.
                b.call = None;
                let kind = b.kind;
                let (why, request) = b.space_refused.take().expect("matched");
                let refused = NamespaceError::NoSpace(why);
                match (kind, request) {
                    (Kind::File { .. }, _) => self.file_registered(actor, Err(refused), mem, out),
                    (Kind::Control, DirectoryRequest::Rename { .. }) => {
                        let body = ReplyBody::Renamed(Err(refused));
                        self.control_reply(now, actor, body, mem, out);
                    }
                    (Kind::Control, _) => {
                        let body = ReplyBody::Unregistered(Err(refused));
                        self.control_reply(now, actor, body, mem, out);
                    }
                    _ => self.registered(now, actor, Err(refused), mem, out),
                }
                true
            }
            (
                ReplyBody::BlobReservationReleased(Err(NamespaceError::OperationConflict(_))),
                Some(_),
            ) => {
                // A copy of the call was applied: its replay answers it.
                let (_, request) = b.space_refused.take().expect("matched");
                self.call_again(now, actor, request, true, out);
                true
            }
            (ReplyBody::BlobReservationReleased(Err(_)), Some(_)) => {
                // Not settled yet (no directory answered, or a full table): ask again.
                self.resend_on_tick(actor);
                true
            }
            _ => false,
        }
    }

    fn reserved(
        &mut self,
        now: Instant,
        actor: u64,
        result: Result<(), NamespaceError>,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let operation = self.op_id(actor, super::PURPOSE_RESERVE);
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        if b.phase != Phase::Reserving {
            return;
        }
        match result {
            Ok(()) => {
                b.reservation = Some(operation);
                b.phase = Phase::Allocating;
                let Kind::Write { length, .. } = b.kind else {
                    return;
                };
                self.allocate(now, actor, length, mem, out);
            }
            Err(error) => self.fail(actor, child_error(error), mem, out),
        }
    }

    fn registered(
        &mut self,
        now: Instant,
        actor: u64,
        result: Result<crate::ids::Revision, NamespaceError>,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        if b.phase != Phase::Publishing {
            return;
        }
        // `None` here: a replacement retired the source before this reply arrived.
        let source = match b.namespace {
            NamespaceHold::MayBind { source } => Some(source),
            _ => None,
        };
        let (child, op, session) = (b.child, b.op, b.session);
        match result {
            Ok(revision) => {
                b.reservation = None;
                // Published data outlives the session (H-D1): it no longer tracks the write.
                b.tracked = false;
                let abort = b.abort_requested;
                match source {
                    Some(source) => {
                        b.namespace = NamespaceHold::Bound { source, revision };
                        b.phase = Phase::Published;
                    }
                    None => b.phase = Phase::Draining,
                }
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.ops.remove(&op);
                    s.published.insert(op, actor);
                }
                self.send_child(child, ChildEvent::Published { op, revision }, out);
                match (source, abort) {
                    (Some(_), true) => self.unpublish(now, actor, out),
                    // Already unbound: an abort is already true (S36).
                    (None, true) => self.send_child(child, ChildEvent::Aborted { op }, out),
                    _ => {}
                }
                self.try_finish(actor, mem, out);
                self.maybe_closed(session, out);
            }
            Err(error) => {
                // Refused for good: the namespace will never bind the source.
                b.namespace = NamespaceHold::None;
                if let Some(source) = source {
                    self.sources.remove(&source);
                }
                self.fail(actor, child_error(error), mem, out);
            }
        }
    }

    fn unregistered(
        &mut self,
        actor: u64,
        result: Result<(), NamespaceError>,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        if b.phase != Phase::Unpublishing {
            return;
        }
        let (child, op) = (b.child, b.op);
        if b.namespace == NamespaceHold::None {
            // The Retire came first: whatever the answer, the write is no longer bound.
            b.phase = Phase::Draining;
            b.aborted_when_retired = false;
            self.send_child(child, ChildEvent::Aborted { op }, out);
            self.try_finish(actor, mem, out);
            return;
        }
        b.phase = Phase::Published;
        match result {
            // The directory unbound our revision and will retire the source: Aborted follows
            // its Retire.
            Ok(()) => {}
            Err(error) => {
                // Our revision is no longer at the path: replaced, unlinked, or renamed away
                // (then the write is still bound elsewhere). Or the directory refuses to unlink
                // it (a reservation, a live stream). Either way the abort did not happen; the
                // child hears why, and the write stays until the directory retires it.
                b.aborted_when_retired = false;
                let error = child_error(error);
                self.send_child(child, ChildEvent::Failed { op, error }, out);
            }
        }
    }

    /// The directory retired the source of binding `actor`: the namespace no longer binds it.
    pub(super) fn source_retired(
        &mut self,
        actor: u64,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        b.namespace = NamespaceHold::None;
        let (child, op) = (b.child, b.op);
        match b.phase {
            Phase::Published | Phase::Publishing => {
                // Publishing: a concurrent replacement retired us before our reply arrived;
                // the Register's reply still comes and finds nothing to bind.
                if b.phase == Phase::Published {
                    b.phase = Phase::Draining;
                }
                if b.aborted_when_retired {
                    b.aborted_when_retired = false;
                    self.send_child(child, ChildEvent::Aborted { op }, out);
                }
            }
            Phase::Unpublishing => {}
            _ => {}
        }
        self.try_finish(actor, mem, out);
    }
}

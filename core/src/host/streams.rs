//! Streams for programs (issue 17): a child opens one side of a stream at a path; the host
//! runs the endpoint (a binding whose address is the endpoint the directory matches and
//! displaces) and owns it as it owns reads and writes.
//!
//! * **Open.** `OpenStream` is checked like an open (a source needs write access, a sink read
//!   access) and sent as the directory's `OpenStream` under an op id of the binding. Its answer
//!   is definitive, an unknown outcome included (a `Timeout` fails the op: the proxy retracts
//!   an open it gave up on, and a re-sent open would wait forever): the child hears
//!   `StreamMatched` with the rendezvous, or `Failed`.
//! * **Displaced.** The directory's `Displaced` for the endpoint is acknowledged at once
//!   (`StreamDisplaced`, also for an endpoint the host no longer knows: `answer_for_the_dead`),
//!   and the child hears `StreamDisplaced`: the stream is over.
//! * **Close.** `CloseStream` sends the directory's `CloseStream` for the rendezvous; its
//!   answer, whatever it is, ends the stream (`StreamClosed`): a close is idempotent, and one
//!   of an earlier authority's rendezvous finds nothing to close.
//! * **Cancel.** `Cancel` ends an open that is still waiting (`OperationCancelled`).
//! * **The child goes** (it died, closed its session, or was revoked): a waiting open is
//!   retracted (`CancelStream`) and a matched stream closed (`CloseStream`) on its behalf.
//!   Both are retractions: handed to the proxy, which re-sends them until the directory
//!   answers, and kept by the host until then, which hands them over again if the proxy
//!   restarts or was too full to take them (see `handover.rs`).

use super::{Host, Kind, Naming, Phase, child_error};
use crate::arena::ArenaMemory;
use crate::effect::Outbox;
use crate::error::DataPlaneError;
use crate::ids::{Address, Revision, StreamIncarnation};
use crate::path::Access;
use crate::time::Instant;
use crate::wire::{
    ChildEvent, ChildOp, Descriptor, DirectoryRequest, Message, ReplyBody, StreamRole,
};

/// Op-id purpose of a stream open (the low byte of its op id).
pub(crate) const PURPOSE_STREAM: u8 = 5;

/// What a child asks for when it opens a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamOpen {
    pub(crate) role: StreamRole,
    pub(crate) descriptor: Descriptor,
    pub(crate) replace: bool,
    pub(crate) ensure: bool,
    pub(crate) expected_revision: Option<Revision>,
}

impl Host {
    /// A child's `OpenStream`: validated completely before anything changes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_stream(
        &mut self,
        now: Instant,
        session: u64,
        child: Address,
        op: ChildOp,
        logical: &str,
        open: StreamOpen,
        out: &mut Outbox,
    ) {
        if !self.sessions.contains_key(&session) {
            return;
        }
        let access = match open.role {
            StreamRole::Source => Access::Write,
            StreamRole::Sink => Access::Read,
        };
        // Either side's open may create the stream's entry.
        let path = match self.check_open(session, op, logical, access, Naming::New) {
            Ok(path) => path,
            Err(error) => {
                self.send_child(child, ChildEvent::Failed { op, error }, out);
                return;
            }
        };
        let actor = self.start_binding(
            session,
            child,
            op,
            path.clone(),
            Kind::Stream { role: open.role },
            Phase::StreamOpening,
        );
        let address = self.address(actor);
        let request = DirectoryRequest::OpenStream {
            path,
            role: open.role,
            descriptor: open.descriptor,
            endpoint: address,
            replace: open.replace,
            ensure: open.ensure,
            expected_revision: open.expected_revision,
            operation: self.op_id(actor, PURPOSE_STREAM),
        };
        self.call(now, actor, request, out);
    }

    /// The answer to a stream binding's call (definitive, whatever it says); `reached`: an
    /// earlier attempt may have reached the directory (an earlier proxy dispatched it).
    pub(super) fn stream_reply(
        &mut self,
        actor: u64,
        body: ReplyBody,
        reached: bool,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let (child, op) = (b.child, b.op);
        let event = match (&b.phase, body) {
            (Phase::StreamOpening, ReplyBody::StreamOpened(Ok(matched))) => {
                b.phase = Phase::Streaming(matched.incarnation);
                self.send_child(child, ChildEvent::StreamMatched { op, matched }, out);
                return;
            }
            (Phase::StreamOpening, ReplyBody::StreamOpened(Err(error))) => {
                if super::is_unknown_outcome(Some(&error))
                    && (reached || !super::never_dispatched(Some(&error)))
                {
                    // The open may be waiting at the directory all the same (a copy an earlier
                    // proxy sent, or one the directory took before the proxy gave up): it is
                    // retracted, as for a child that goes (found by the swarm, seed 208: a
                    // proxy restart, the new proxy full, the old one's open parked for ever).
                    // Not an open no proxy ever dispatched (a full proxy refused its only
                    // attempt): under overload that was a retraction per refused open, for
                    // nothing.
                    self.retract_stream(actor, out);
                }
                ChildEvent::Failed {
                    op,
                    error: child_error(error),
                }
            }
            (Phase::StreamClosing, ReplyBody::StreamClosed(_)) => ChildEvent::StreamClosed { op },
            _ => return,
        };
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        b.phase = Phase::Draining;
        self.send_child(child, event, out);
        self.try_finish(actor, mem, out);
    }

    /// The directory displaced the rendezvous of endpoint `actor`.
    pub(super) fn displaced(
        &mut self,
        actor: u64,
        incarnation: StreamIncarnation,
        reply_to: Address,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        out.send(
            reply_to,
            Message::StreamDisplaced {
                endpoint: b.address,
                incarnation,
            },
        );
        let over = match b.phase {
            Phase::Streaming(matched) => matched == incarnation,
            // The match is on its way (or was lost): the stream is over all the same.
            Phase::StreamOpening | Phase::StreamClosing => true,
            _ => false,
        };
        if !over {
            return;
        }
        let (child, op) = (b.child, b.op);
        // An open in flight: its answer has nobody to go to (the proxy drops it at finish).
        b.phase = Phase::Draining;
        self.send_child(child, ChildEvent::StreamDisplaced { op }, out);
        self.try_finish(actor, mem, out);
    }

    /// A child's `CloseStream`.
    pub(super) fn close_stream(&mut self, now: Instant, actor: u64, out: &mut Outbox) {
        let Some(b) = self.bindings.get_mut(&actor) else {
            return;
        };
        let (child, op) = (b.child, b.op);
        let Phase::Streaming(incarnation) = b.phase else {
            let error = DataPlaneError::InvalidArgument(super::reason(
                "only a matched stream can be closed (cancel a waiting open)",
            ));
            self.send_child(child, ChildEvent::Failed { op, error }, out);
            return;
        };
        b.phase = Phase::StreamClosing;
        let request = DirectoryRequest::CloseStream {
            path: b.path.clone(),
            incarnation,
        };
        self.call(now, actor, request, out);
    }

    /// Retracts what stream binding `actor` leaves behind as it ends: a waiting open is
    /// cancelled, a matched stream closed (see `Host::retract`). Nothing for any other phase
    /// (a close in flight is handed over where the child goes: `session_gone`; a displaced
    /// stream has nothing left to close).
    pub(super) fn retract_stream(&mut self, actor: u64, out: &mut Outbox) {
        let Some(b) = self.bindings.get(&actor) else {
            return;
        };
        let retraction = match b.phase {
            Phase::StreamOpening => DirectoryRequest::CancelStream {
                path: b.path.clone(),
                operation: self.op_id(actor, PURPOSE_STREAM),
            },
            Phase::Streaming(incarnation) => DirectoryRequest::CloseStream {
                path: b.path.clone(),
                incarnation,
            },
            _ => return,
        };
        self.retract(actor, retraction, out);
    }
}

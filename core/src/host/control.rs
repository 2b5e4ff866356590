//! Namespace queries and mutations on a child's behalf (the H4 "control" helper): `Stat`,
//! `Move` and `Remove`. Paths are resolved and authorized like opens (Stat needs read access,
//! Move and Remove write access to every path they touch). Each runs as a short-lived binding
//! without a lease: its call goes through the proxy; a mutation whose outcome is unknown is
//! re-driven with the same op id until the directory answers definitively; the child hears
//! `Stat`, `Done` or `Failed`. A Stat resolves first (a blob's length comes with its binding)
//! and looks up what is there when the resolve says "a stream" or "a lost blob", so a lost
//! blob is described (`lost: true`) rather than reported as an error.

use super::{Host, Kind, PURPOSE_CONTROL, Phase, child_error};
use crate::arena::ArenaMemory;
use crate::effect::Outbox;
use crate::error::{DataPlaneError, NamespaceError};
use crate::ids::{Address, Revision};
use crate::path::{Access, DataPath};
use crate::time::Instant;
use crate::wire::{ChildEvent, ChildOp, DirectoryRequest, EntryKind, ReplyBody};

/// What a child asked the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Query {
    Stat {
        path: String,
    },
    Move {
        from: String,
        to: String,
        replace: bool,
    },
    Remove {
        path: String,
        expected_revision: Option<Revision>,
    },
}

impl Host {
    /// Validates a control request and sends its call.
    pub(super) fn control(
        &mut self,
        now: Instant,
        session: u64,
        child: Address,
        op: ChildOp,
        query: Query,
        out: &mut Outbox,
    ) {
        let Some(s) = self.sessions.get(&session) else {
            return;
        };
        let job = &s.config.job;
        let check = |logical: &str, access: Access| -> Result<DataPath, DataPlaneError> {
            let path = job.resolve(logical).map_err(DataPlaneError::InvalidPath)?;
            if job.allows(&path, access) {
                Ok(path)
            } else {
                Err(DataPlaneError::Unauthorized {
                    path,
                    operation: access,
                })
            }
        };
        let checked = match &query {
            Query::Stat { path } => check(path, Access::Read).map(|p| (p, None)),
            // The source may hold any old name; the destination is a new one.
            Query::Move { from, to, .. } => check(from, Access::Write).and_then(|f| {
                let t = check(to, Access::Write)?;
                t.check_new_name().map_err(DataPlaneError::InvalidPath)?;
                Ok((f, Some(t)))
            }),
            Query::Remove { path, .. } => check(path, Access::Write).map(|p| (p, None)),
        };
        let checked = checked.and_then(|paths| {
            if self.binding_of(session, op).is_some() {
                Err(DataPlaneError::InvalidArgument(super::reason(
                    "operation id already in use in this session",
                )))
            } else {
                self.room_for_operation(session).map(|()| paths)
            }
        });
        let (path, destination) = match checked {
            Ok(paths) => paths,
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
            Kind::Control,
            Phase::Controlling,
        );
        let operation = self.op_id(actor, PURPOSE_CONTROL);
        let request = match (query, destination) {
            (Query::Move { replace, .. }, Some(destination)) => DirectoryRequest::Rename {
                source: path,
                destination,
                replace,
                operation,
            },
            (
                Query::Remove {
                    expected_revision, ..
                },
                _,
            ) => DirectoryRequest::Unregister {
                path,
                expected_revision,
                operation,
            },
            _ => DirectoryRequest::Resolve { path },
        };
        self.call(now, actor, request, out);
    }

    /// The definitive answer to a control call.
    pub(super) fn control_reply(
        &mut self,
        now: Instant,
        actor: u64,
        body: ReplyBody,
        mem: &mut dyn ArenaMemory,
        out: &mut Outbox,
    ) {
        let Some(b) = self.bindings.get(&actor) else {
            return;
        };
        if b.phase != Phase::Controlling {
            return;
        }
        let (child, op, path) = (b.child, b.op, b.path.clone());
        let event = match body {
            ReplyBody::Resolved(Ok(binding)) => ChildEvent::Stat {
                op,
                kind: EntryKind::Blob,
                revision: binding.revision,
                length: Some(binding.length),
                lost: false,
            },
            ReplyBody::Resolved(Err(
                NamespaceError::WrongEntryType { .. } | NamespaceError::BlobLost(_),
            )) => {
                // Not a blob, or a lost one: ask what is there (a stat describes a lost blob
                // rather than failing).
                self.call(now, actor, DirectoryRequest::Lookup { path }, out);
                return;
            }
            ReplyBody::LookedUp(Ok(node)) => ChildEvent::Stat {
                op,
                kind: node.kind,
                revision: node.revision,
                length: None,
                lost: node.lost,
            },
            ReplyBody::Renamed(Ok(receipt)) | ReplyBody::Unregistered(Ok(receipt)) => {
                ChildEvent::Done {
                    op,
                    revision: receipt.revision,
                }
            }
            other => {
                let error = match other.err() {
                    Some(error) => child_error(error.clone()),
                    None => DataPlaneError::SessionFailed(super::reason("an unexpected answer")),
                };
                ChildEvent::Failed { op, error }
            }
        };
        self.send_child(child, event, out);
        if let Some(b) = self.bindings.get_mut(&actor) {
            b.phase = Phase::Draining;
        }
        self.try_finish(actor, mem, out);
    }
}

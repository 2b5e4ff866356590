//! The event trace: a 64-bit FNV-1a hash over every processed event (time, sequence number
//! and the event's full contents), and optionally a readable log of the same events.
//!
//! Two runs of one seed must produce the same hash (`swarm --check-determinism` checks it).
//! The hash covers event contents through their derived `Hash` impls, fed to a fixed hasher,
//! so it is stable for a given binary.
//!
//! Besides the events, a traced run writes *notes* (issue 14): what happened without an event
//! of its own — a frame lost, dropped by a full link, duplicated or held back, each fault with
//! its target, each directory step's `Persist` records, each sync and what it covered, the
//! violated check. Notes are not hashed (they follow from the events). Traces stream to their
//! files as the run goes, readable (`--trace`) and one JSON object per line
//! (`--trace-json`), so a run that panics leaves its trace up to the panic.

use std::fmt::Debug;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{BufWriter, Write as _};

use dataplane_core::time::Instant;

/// FNV-1a, 64 bit: tiny, fixed, and good enough to detect divergence.
#[derive(Clone, Copy, Debug)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, i: u64) {
        // One multiply per word instead of eight keeps the trace hash off the profile.
        self.0 ^= i;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// Files a traced run streams to.
#[derive(Debug, Default)]
pub struct TraceFiles {
    /// The readable trace.
    pub text: Option<BufWriter<File>>,
    /// One JSON object per line: `{"t_ns", "at", "seq" (events only), "kind", "text"}`.
    pub json: Option<BufWriter<File>>,
}

/// The trace of one run.
#[derive(Debug)]
pub struct Trace {
    hasher: Fnv64,
    text: Option<Vec<String>>,
    files: TraceFiles,
}

/// The event's variant name (the first word of its `Debug` rendering).
/// The parts of a frame line (`deliver A -> B: call r3@A Lookup /x …`) a JSON reader filters
/// on: sender, receiver, the message's kind and its request id.
#[derive(Debug, PartialEq, Eq)]
struct FrameFields<'a> {
    from: &'a str,
    to: &'a str,
    message: &'a str,
    request: Option<&'a str>,
}

fn frame_fields(line: &str) -> Option<FrameFields<'_>> {
    let (verb, rest) = line.split_once(' ')?;
    if !matches!(verb, "deliver" | "local" | "send") {
        return None;
    }
    let (from, rest) = rest.split_once(" -> ")?;
    let (to, body) = rest.split_once(": ")?;
    let mut words = body.split_whitespace();
    let first = words.next()?;
    // `call r3@n1.1/500 Lookup …` and `reply r3@… Lookup …` carry a request id.
    let (message, request) = match first {
        "call" | "reply" => {
            let request = words.next();
            (words.next().unwrap_or(first), request)
        }
        "child" | "to-child" => (words.next().unwrap_or(first), None),
        _ => (first, None),
    };
    Some(FrameFields {
        from,
        to,
        message,
        request,
    })
}

fn kind_of<E: Debug>(event: &E) -> String {
    let debug = format!("{event:?}");
    let end = debug
        .find(|c: char| !c.is_alphanumeric() && c != '_')
        .unwrap_or(debug.len());
    debug[..end].to_owned()
}

impl Trace {
    /// A trace that keeps a readable log when `text` is set.
    pub fn new(text: bool) -> Self {
        Trace::streaming(text, TraceFiles::default())
    }

    /// A trace that also streams to `files`.
    pub fn streaming(text: bool, files: TraceFiles) -> Self {
        Trace {
            hasher: Fnv64::default(),
            text: text.then(Vec::new),
            files,
        }
    }

    /// Whether anything renders notes (so callers skip building them otherwise).
    pub fn is_rendering(&self) -> bool {
        self.text.is_some() || self.files.text.is_some() || self.files.json.is_some()
    }

    /// Writes a header line (the options) to the streamed files.
    pub fn header(&mut self, text: &str) {
        if let Some(file) = &mut self.files.text {
            let _ = file.write_all(text.as_bytes());
        }
        if let Some(file) = &mut self.files.json {
            for line in text.lines() {
                let _ = writeln!(
                    file,
                    "{}",
                    serde_json::json!({ "kind": "options", "text": line })
                );
            }
        }
    }

    fn emit(&mut self, at: Instant, seq: Option<u64>, kind: &str, line: String) {
        let readable = match seq {
            Some(seq) => format!("{at} #{seq} {line}"),
            None => format!("{at} {kind}: {line}"),
        };
        if let Some(file) = &mut self.files.text {
            let _ = writeln!(file, "{readable}");
        }
        if let Some(file) = &mut self.files.json {
            let mut object = serde_json::json!({
                "t_ns": at.as_nanos(),
                "at": at.to_string(),
                "seq": seq,
                "kind": kind,
                "text": line,
            });
            if let Some(frame) = frame_fields(&line) {
                object["from"] = frame.from.into();
                object["to"] = frame.to.into();
                object["message"] = frame.message.into();
                if let Some(request) = frame.request {
                    object["request"] = request.into();
                }
            }
            let _ = writeln!(file, "{object}");
        }
        if let Some(text) = &mut self.text {
            text.push(readable);
        }
    }

    /// Folds one event into the hash (and the log, rendered by `render`).
    pub fn event<E: Hash + Debug>(
        &mut self,
        at: Instant,
        seq: u64,
        event: &E,
        render: impl FnOnce(&E) -> String,
    ) {
        self.hasher.write_u64(at.as_nanos());
        self.hasher.write_u64(seq);
        event.hash(&mut self.hasher);
        if self.is_rendering() {
            let kind = kind_of(event);
            let line = render(event);
            self.emit(at, Some(seq), &kind, line);
        }
    }

    /// A note of what happened without an event of its own (`kind`: `net`, `fault`, `disk`,
    /// `persist`, `check`...), rendered only when the run is traced.
    pub fn note(&mut self, at: Instant, kind: &str, render: impl FnOnce() -> String) {
        if self.is_rendering() {
            let line = render();
            self.emit(at, None, kind, line);
        }
    }

    /// Flushes the streamed files.
    pub fn flush(&mut self) {
        if let Some(file) = &mut self.files.text {
            let _ = file.flush();
        }
        if let Some(file) = &mut self.files.json {
            let _ = file.flush();
        }
    }

    /// The hash so far.
    pub fn hash(&self) -> u64 {
        self.hasher.finish()
    }

    /// The readable log, if kept.
    pub fn lines(&self) -> Option<&[String]> {
        self.text.as_deref()
    }
}

/// A one-line rendering of a directory request.
fn describe_request(request: &dataplane_core::wire::DirectoryRequest) -> String {
    use dataplane_core::wire::DirectoryRequest as R;
    match request {
        R::Register {
            path,
            source,
            operation,
            reservation,
            ..
        } => {
            let res = reservation
                .map(|r| format!(" reservation={r}"))
                .unwrap_or_default();
            format!("Register {path} source={source} op={operation}{res}")
        }
        R::Resolve { path } => format!("Resolve {path}"),
        R::Lookup { path } => format!("Lookup {path}"),
        R::ReserveBlob {
            path,
            operation,
            owner,
        } => {
            format!("ReserveBlob {path} op={operation} owner={owner}")
        }
        R::ReleaseBlobReservation { path, operation } => {
            format!("ReleaseBlobReservation {path} op={operation}")
        }
        R::Unregister {
            path,
            expected_revision,
            operation,
        } => {
            let exp = expected_revision
                .map(|r| format!(" expected={r}"))
                .unwrap_or_default();
            format!("Unregister {path}{exp} op={operation}")
        }
        R::Rename {
            source,
            destination,
            replace,
            operation,
        } => {
            format!("Rename {source} -> {destination} replace={replace} op={operation}")
        }
        R::OpenStream {
            path,
            role,
            endpoint,
            replace,
            ensure,
            expected_revision,
            operation,
            ..
        } => {
            let exp = expected_revision
                .map(|r| format!(" expected={r}"))
                .unwrap_or_default();
            format!(
                "OpenStream {path} {role:?} endpoint={endpoint} replace={replace} ensure={ensure}{exp} op={operation}"
            )
        }
        R::CancelStream { path, operation } => {
            format!("CancelStream {path} op={operation}")
        }
        R::CloseStream { path, incarnation } => format!("CloseStream {path} {incarnation}"),
        R::OperationsDone { issuer, below } => format!("OperationsDone {issuer} below={below}"),
    }
}

/// A one-line rendering of a message for the readable trace, sent to `to`. Request ids are
/// numbered by each caller, so they are written with the caller that numbered them
/// (`r16@n1.1/501`): one request's call, re-sends and reply share one unique name.
pub fn describe(
    message: &dataplane_core::wire::Message,
    to: dataplane_core::ids::Address,
) -> String {
    use dataplane_core::wire::{Message as M, ReplyBody as B};
    match message {
        M::Call(call) => {
            let what = describe_request(&call.request);
            format!(
                "call {}@{} {what} reply_to={}",
                call.request_id, call.reply_to, call.reply_to
            )
        }
        M::ProxyCall(call) => {
            let what = describe_request(&call.request);
            format!(
                "proxy-call {}@{} {what} caller={}",
                call.request_id, call.reply_to, call.reply_to
            )
        }
        M::ProxyCancel { reply_to } => format!("proxy-cancel caller={reply_to}"),
        M::Reply(reply) => {
            let body = match &reply.body {
                B::Registered(r) | B::Unregistered(r) | B::Renamed(r) => match r {
                    Ok(receipt) => format!("Ok({})", receipt.revision),
                    Err(e) => format!("Err({e})"),
                },
                B::StreamOpened(Ok(m)) => {
                    format!(
                        "Ok(match {} source={} sink={})",
                        m.incarnation, m.source, m.sink
                    )
                }
                other => match other.err() {
                    Some(e) => format!("Err({e})"),
                    None => format!("{other:?}"),
                },
            };
            format!(
                "reply {}@{to} {:?} {} {body}",
                reply.request_id,
                reply.body.kind(),
                reply.epoch
            )
        }
        M::Retire { .. } => "Retire".to_string(),
        M::SourceRetired { source } => format!("SourceRetired {source}"),
        M::Displaced { incarnation, .. } => format!("Displaced {incarnation}"),
        M::StreamDisplaced {
            endpoint,
            incarnation,
        } => {
            format!("StreamDisplaced {endpoint} {incarnation}")
        }
        M::AddressGone { scope, .. } => format!("AddressGone {scope:?}"),
        M::GoneAcknowledged { scope } => format!("GoneAcknowledged {scope:?}"),
        M::FromChild(request) => format!("child {request:?}"),
        M::ToChild(event) => format!("to-child {event:?}"),
        M::ChunkRequest {
            offset,
            len,
            reply_to,
        } => format!("ChunkRequest {offset}+{len} reply_to={reply_to}"),
        M::Chunk {
            offset,
            total,
            bytes,
            ..
        } => format!("Chunk {offset}+{} of {total}", bytes.as_slice().len()),
        M::ChunkRefused { reason } => format!("ChunkRefused {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_lines_give_their_fields() {
        assert_eq!(
            frame_fields("deliver n2.1/501 -> n0.1/0: call r1@n2.1/501 OpenStream /b Sink"),
            Some(FrameFields {
                from: "n2.1/501",
                to: "n0.1/0",
                message: "OpenStream",
                request: Some("r1@n2.1/501"),
            })
        );
        assert_eq!(
            frame_fields("local n1.1/100 -> n1.1/1099511627776: child Stat { op: 1 }")
                .map(|f| f.message),
            Some("Stat")
        );
        assert_eq!(
            frame_fields("deliver n1.1/0 -> n0.1/0: AddressGone NodeBefore").map(|f| f.message),
            Some("AddressGone")
        );
        assert_eq!(frame_fields("DirSync { boot: 1 }"), None);
    }
}

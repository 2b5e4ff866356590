//! The small shared vocabulary: enums and bounded strings that errors, effects, wire messages,
//! log records and blob headers all name. This module is a leaf: it depends on nothing else in
//! the crate but [`crate::limits`], so every other module may import it without forming a cycle.
//! Each type is re-exported from the module that used to define it (`effect::Timer`,
//! `error::{Reason, Limit}`, `wire::{EntryKind, StreamRole}`, `blob::{DigestKind, BlobAccess}`).
//!
//! Moving a type here does not change its encoding: postcard writes enum variants by index and
//! never a type's path, so the variant order is the wire format. Do not reorder variants.

use core::fmt;
use serde::{Deserialize, Serialize};

use crate::limits::REASON_BYTES_MAX;

/// The timers a machine can arm. One deadline per timer: arming it again moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Timer {
    /// The directory's obligation retry tick (SPEC §4.9).
    DirectoryRetry,
    /// The proxy's re-dispatch and deadline tick (SPEC §5.2).
    ProxyRetry,
    /// The host's tick: transfer retries and deadlines, namespace call guards.
    HostTick,
    /// The node agent's gone-report re-send tick.
    AgentTick,
}

/// The two kinds of namespace entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntryKind {
    /// A fixed-length byte region served by a blob source.
    Blob,
    /// A rendezvous point for one writer and one reader.
    Stream,
}

/// The two roles of a stream rendezvous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum StreamRole {
    /// The writer.
    Source,
    /// The reader.
    Sink,
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntryKind::Blob => "blob",
            EntryKind::Stream => "stream",
        })
    }
}

impl fmt::Display for StreamRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StreamRole::Source => "source (writer)",
            StreamRole::Sink => "sink (reader)",
        })
    }
}

impl StreamRole {
    /// The other role.
    pub fn peer(self) -> StreamRole {
        match self {
            StreamRole::Source => StreamRole::Sink,
            StreamRole::Sink => StreamRole::Source,
        }
    }
}

/// Who may write the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlobAccess {
    /// A read lease: the child only reads.
    ReadOnly,
    /// A write lease: the child writes the payload.
    Writable,
}

/// The content digest a header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DigestKind {
    /// No digest (the digest bytes are zero).
    None,
    /// BLAKE3-256 of the payload.
    Blake3,
}

/// A short human-readable explanation, truncated to [`REASON_BYTES_MAX`] bytes.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Reason(String);

impl Reason {
    /// Builds a reason, cutting it at a character boundary if it is too long.
    pub fn new(text: impl Into<String>) -> Self {
        let mut text = text.into();
        if text.len() > REASON_BYTES_MAX {
            let mut cut = REASON_BYTES_MAX;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        Reason(text)
    }

    /// The reason as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A reason decoded from a frame that is longer than the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasonTooLong;

impl fmt::Display for ReasonTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reason longer than {REASON_BYTES_MAX} bytes")
    }
}

impl TryFrom<String> for Reason {
    type Error = ReasonTooLong;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        if value.len() > REASON_BYTES_MAX {
            Err(ReasonTooLong)
        } else {
            Ok(Reason(value))
        }
    }
}

impl From<Reason> for String {
    fn from(value: Reason) -> Self {
        value.0
    }
}

impl fmt::Display for Reason {
    /// The text, with control characters escaped (`\n`, `\u{1b}`): a reason may come from a
    /// peer, and a message that prints it must stay one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A named limit that was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Limit {
    /// [`crate::limits::FENCE_HELD_OPENS_MAX`].
    FenceHeldOpens,
    /// [`crate::limits::RESERVATIONS_MAX`].
    Reservations,
    /// The proxy's pending-request bound.
    PendingRequests,
    /// Request ids of a proxy ran out.
    RequestIds,
    /// A host's bound on operations in progress over all its sessions
    /// ([`crate::limits::HOST_OPERATIONS_MAX`] by default).
    HostOperations,
    /// A host's bound on operations in progress in one session
    /// ([`crate::limits::HOST_SESSION_OPERATIONS_MAX`] by default).
    SessionOperations,
    /// The directory's operation table is full ([`crate::limits::OPERATIONS_MAX`]). Not
    /// sticky: nothing was applied or remembered, and the same id may be sent again.
    Operations,
    /// One issuer holds too many operation records
    /// ([`crate::limits::ISSUER_OPERATIONS_MAX`]). Not sticky, like `Operations`.
    IssuerOperations,
    /// The directory's issuer table is full ([`crate::limits::ISSUERS_MAX`]). Not sticky,
    /// like `Operations`.
    Issuers,
    /// [`crate::limits::ENTRIES_MAX`] namespace entries.
    Entries,
    /// [`crate::limits::OBLIGATIONS_MAX`] retirement and displacement obligations.
    Obligations,
    /// [`crate::limits::RENDEZVOUS_MAX`] runtime rendezvous.
    Rendezvous,
    /// [`crate::limits::FENCES_MAX`] replacement fences.
    Fences,
    /// A host's bound on the file blobs it serves ([`crate::limits::HOST_FILES_MAX`]).
    HostFiles,
}

impl Limit {
    /// Whether a refusal for this limit left no trace at the directory: the request was
    /// neither applied nor remembered, so a copy sent later may still take effect. Callers
    /// treat it like an unknown outcome (send the same request again later); every other
    /// directory refusal is definitive.
    pub fn left_no_trace(self) -> bool {
        matches!(
            self,
            Limit::Operations | Limit::IssuerOperations | Limit::Issuers
        )
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::FenceHeldOpens => "too many opens held by a replacement fence",
            Limit::Reservations => "too many blob reservations",
            Limit::PendingRequests => "too many pending requests",
            Limit::RequestIds => "request ids exhausted",
            Limit::HostOperations => "too many operations in progress on this host",
            Limit::SessionOperations => "too many operations in progress in this session",
            Limit::Operations => "too many operations remembered by the directory",
            Limit::IssuerOperations => "too many operations of one issuer remembered",
            Limit::Issuers => "too many issuers remembered by the directory",
            Limit::Entries => "too many namespace entries",
            Limit::Obligations => "too many retirements and displacements outstanding",
            Limit::Rendezvous => "too many stream rendezvous",
            Limit::Fences => "too many replacement fences",
            Limit::HostFiles => "too many file blobs on this host",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_truncated_at_a_char_boundary() {
        let long = "é".repeat(REASON_BYTES_MAX);
        let reason = Reason::new(long);
        assert!(reason.as_str().len() <= REASON_BYTES_MAX);
        assert!(reason.as_str().chars().all(|c| c == 'é'));
    }

    #[test]
    fn oversized_reasons_do_not_decode() {
        let bytes = postcard::to_allocvec(&"x".repeat(REASON_BYTES_MAX + 1)).unwrap();
        assert!(postcard::from_bytes::<Reason>(&bytes).is_err());
    }

    #[test]
    fn reasons_from_peers_print_on_one_line() {
        let reason = Reason::new("line one\nline two\u{1b}[2J");
        assert_eq!(reason.to_string(), "line one\\nline two\\u{1b}[2J");
        assert_eq!(reason.as_str(), "line one\nline two\u{1b}[2J");
    }
}

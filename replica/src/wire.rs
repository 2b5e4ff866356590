//! The replicas' messages on our wire: a serde mirror of the engine's protobuf `Message`,
//! encoded with postcard like every other frame of the project.
//!
//! The engine's own codec is protobuf 2, whose parser of untrusted input has a known stack
//! overflow (RUSTSEC-2024-0437); our frames never reach it. Decoding refuses, with a typed
//! error and no change anywhere, what no replica sends over a network: the engine's local
//! messages (`MsgHup`, `MsgBeat`, `MsgUnreachable`, `MsgSnapStatus`, `MsgCheckQuorum`) and
//! frames over [`FRAME_MAX`].
//!
//! **Snapshots** travel in chunks of at most [`SNAPSHOT_CHUNK_BYTES`], one message each
//! (`WireMessage::snapshot_chunks`), so that every frame stays small whatever the size of
//! the directory's state; the receiving replica puts them together in order (a chunk out of
//! order drops the snapshot: the leader sends it again) up to [`SNAPSHOT_BYTES_MAX`].

use dataplane_core::log::ReplicaConf;
use raft::eraftpb::{Entry, EntryType, Message, MessageType};
use serde::{Deserialize, Serialize};

/// The bytes of a snapshot one message carries.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// The largest snapshot a replica takes or assembles (the directory's own tables are bounded
/// well below it).
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 30;

/// The largest frame a replica accepts (a batch of appends is cut at 1 MiB by the engine's
/// `max_size_per_msg`, so this leaves room for framing).
pub const FRAME_MAX: usize = 4 << 20;

/// What an entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A proposal of the replicated state machine (or the empty entry a new leader appends).
    Normal,
    /// A membership change (joint consensus), kept for the change of membership to come.
    ConfChange,
    /// A membership change in the engine's second format.
    ConfChangeV2,
}

/// One entry of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Its position in the log (from 1).
    pub index: u64,
    /// The leader's term that appended it.
    pub term: u64,
    /// What it carries.
    pub kind: EntryKind,
    /// The proposal's bytes.
    pub data: Vec<u8>,
    /// The proposal's context bytes (empty for ours).
    pub context: Vec<u8>,
}

/// The kinds of message that travel between replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// A proposal forwarded to the leader (never sent: forwarding is off).
    Propose,
    /// Entries to append, with the leader's commit.
    Append,
    /// A follower's answer to an append.
    AppendResponse,
    /// A vote request.
    RequestVote,
    /// A vote.
    RequestVoteResponse,
    /// A heartbeat.
    Heartbeat,
    /// The answer to a heartbeat.
    HeartbeatResponse,
    /// A leadership transfer request.
    TransferLeader,
    /// The leader tells a transferee to campaign now.
    TimeoutNow,
    /// A read-index request.
    ReadIndex,
    /// The answer to a read-index request.
    ReadIndexResponse,
    /// A pre-vote request.
    RequestPreVote,
    /// A pre-vote.
    RequestPreVoteResponse,
    /// A chunk of the leader's snapshot ([`WireMessage::snapshot`]).
    Snapshot,
}

/// One chunk of a snapshot on its way to a lagging follower.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotChunk {
    /// The last entry the snapshot covers.
    pub index: u64,
    /// That entry's term.
    pub term: u64,
    /// The group's configuration there.
    pub conf: ReplicaConf,
    /// The snapshot's whole length.
    pub len: u64,
    /// Where this chunk's bytes start.
    pub offset: u64,
    /// The bytes (at most [`SNAPSHOT_CHUNK_BYTES`]).
    pub bytes: Vec<u8>,
}

/// One message between replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireMessage {
    /// What it is.
    pub kind: Kind,
    /// The replica it is for.
    pub to: u64,
    /// The replica it is from.
    pub from: u64,
    /// The sender's term.
    pub term: u64,
    /// The engine's `log_term`.
    pub log_term: u64,
    /// The engine's `index`.
    pub index: u64,
    /// Entries (appends).
    pub entries: Vec<LogEntry>,
    /// The sender's commit index.
    pub commit: u64,
    /// The term of the commit index.
    pub commit_term: u64,
    /// A follower asks for a snapshot at this index.
    pub request_snapshot: u64,
    /// A refusal.
    pub reject: bool,
    /// Where a refused append should resume.
    pub reject_hint: u64,
    /// The engine's context bytes (read-index requests, campaign kinds).
    pub context: Vec<u8>,
    /// The sender's election priority.
    pub priority: i64,
    /// A snapshot's chunk ([`Kind::Snapshot`] only).
    pub snapshot: Option<Box<SnapshotChunk>>,
}

/// A message that cannot be taken from the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Not a frame of ours (postcard refused it), or bytes after it.
    Malformed,
    /// Larger than [`FRAME_MAX`].
    TooLarge(usize),
    /// A kind of message no replica sends over a network.
    NotSent(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Malformed => write!(f, "not a replica message"),
            WireError::TooLarge(n) => {
                write!(f, "a replica message of {n} bytes (limit {FRAME_MAX})")
            }
            WireError::NotSent(what) => write!(f, "a {what}, which no replica sends"),
        }
    }
}

impl std::error::Error for WireError {}

impl WireMessage {
    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a replica message always serialises")
    }

    /// The message in `bytes`, all of them.
    pub fn decode(bytes: &[u8]) -> Result<WireMessage, WireError> {
        if bytes.len() > FRAME_MAX {
            return Err(WireError::TooLarge(bytes.len()));
        }
        match postcard::take_from_bytes::<WireMessage>(bytes) {
            Ok((message, [])) => Ok(message),
            _ => Err(WireError::Malformed),
        }
    }

    /// The engine's message for this one.
    pub(crate) fn into_raft(self) -> Message {
        let mut m = Message::default();
        m.set_msg_type(match self.kind {
            Kind::Propose => MessageType::MsgPropose,
            Kind::Append => MessageType::MsgAppend,
            Kind::AppendResponse => MessageType::MsgAppendResponse,
            Kind::RequestVote => MessageType::MsgRequestVote,
            Kind::RequestVoteResponse => MessageType::MsgRequestVoteResponse,
            Kind::Heartbeat => MessageType::MsgHeartbeat,
            Kind::HeartbeatResponse => MessageType::MsgHeartbeatResponse,
            Kind::TransferLeader => MessageType::MsgTransferLeader,
            Kind::TimeoutNow => MessageType::MsgTimeoutNow,
            Kind::ReadIndex => MessageType::MsgReadIndex,
            Kind::ReadIndexResponse => MessageType::MsgReadIndexResp,
            Kind::RequestPreVote => MessageType::MsgRequestPreVote,
            Kind::RequestPreVoteResponse => MessageType::MsgRequestPreVoteResponse,
            Kind::Snapshot => MessageType::MsgSnapshot,
        });
        m.to = self.to;
        m.from = self.from;
        m.term = self.term;
        m.log_term = self.log_term;
        m.index = self.index;
        m.set_entries(self.entries.into_iter().map(into_raft_entry).collect());
        m.commit = self.commit;
        m.commit_term = self.commit_term;
        m.request_snapshot = self.request_snapshot;
        m.reject = self.reject;
        m.reject_hint = self.reject_hint;
        m.context = self.context.into();
        m.priority = self.priority;
        m
    }

    /// Our message for the engine's, or what keeps it off the wire.
    pub(crate) fn from_raft(m: &Message) -> Result<WireMessage, WireError> {
        let kind = match m.get_msg_type() {
            MessageType::MsgPropose => Kind::Propose,
            MessageType::MsgAppend => Kind::Append,
            MessageType::MsgAppendResponse => Kind::AppendResponse,
            MessageType::MsgRequestVote => Kind::RequestVote,
            MessageType::MsgRequestVoteResponse => Kind::RequestVoteResponse,
            MessageType::MsgHeartbeat => Kind::Heartbeat,
            MessageType::MsgHeartbeatResponse => Kind::HeartbeatResponse,
            MessageType::MsgTransferLeader => Kind::TransferLeader,
            MessageType::MsgTimeoutNow => Kind::TimeoutNow,
            MessageType::MsgReadIndex => Kind::ReadIndex,
            MessageType::MsgReadIndexResp => Kind::ReadIndexResponse,
            MessageType::MsgRequestPreVote => Kind::RequestPreVote,
            MessageType::MsgRequestPreVoteResponse => Kind::RequestPreVoteResponse,
            MessageType::MsgSnapshot => return Err(WireError::NotSent("snapshot")),
            other => return Err(WireError::NotSent(local_name(other))),
        };
        Ok(WireMessage {
            kind,
            to: m.to,
            from: m.from,
            term: m.term,
            log_term: m.log_term,
            index: m.index,
            entries: m.get_entries().iter().map(from_raft_entry).collect(),
            commit: m.commit,
            commit_term: m.commit_term,
            request_snapshot: m.request_snapshot,
            reject: m.reject,
            reject_hint: m.reject_hint,
            context: m.context.to_vec(),
            priority: m.priority,
            snapshot: None,
        })
    }

    /// The engine's snapshot message `m` (its snapshot `data`) as chunks.
    pub(crate) fn snapshot_chunks(m: &Message, data: &crate::SnapshotData) -> Vec<WireMessage> {
        let len = data.data.len() as u64;
        let mut chunks: Vec<&[u8]> = data.data.chunks(SNAPSHOT_CHUNK_BYTES).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let mut offset = 0;
        chunks
            .into_iter()
            .map(|bytes| {
                let chunk = SnapshotChunk {
                    index: data.index,
                    term: data.term,
                    conf: data.conf.clone(),
                    len,
                    offset,
                    bytes: bytes.to_vec(),
                };
                offset += bytes.len() as u64;
                WireMessage {
                    kind: Kind::Snapshot,
                    to: m.to,
                    from: m.from,
                    term: m.term,
                    log_term: m.log_term,
                    index: m.index,
                    entries: Vec::new(),
                    commit: m.commit,
                    commit_term: m.commit_term,
                    request_snapshot: m.request_snapshot,
                    reject: m.reject,
                    reject_hint: m.reject_hint,
                    context: m.context.to_vec(),
                    priority: m.priority,
                    snapshot: Some(Box::new(chunk)),
                }
            })
            .collect()
    }
}

fn local_name(kind: MessageType) -> &'static str {
    match kind {
        MessageType::MsgHup => "local MsgHup",
        MessageType::MsgBeat => "local MsgBeat",
        MessageType::MsgUnreachable => "local MsgUnreachable",
        MessageType::MsgSnapStatus => "local MsgSnapStatus",
        MessageType::MsgCheckQuorum => "local MsgCheckQuorum",
        _ => "local message",
    }
}

pub(crate) fn into_raft_entry(e: LogEntry) -> Entry {
    let mut entry = Entry::default();
    entry.set_entry_type(match e.kind {
        EntryKind::Normal => EntryType::EntryNormal,
        EntryKind::ConfChange => EntryType::EntryConfChange,
        EntryKind::ConfChangeV2 => EntryType::EntryConfChangeV2,
    });
    entry.index = e.index;
    entry.term = e.term;
    entry.data = e.data.into();
    entry.context = e.context.into();
    entry
}

pub(crate) fn from_raft_entry(e: &Entry) -> LogEntry {
    LogEntry {
        index: e.index,
        term: e.term,
        kind: match e.get_entry_type() {
            EntryType::EntryNormal => EntryKind::Normal,
            EntryType::EntryConfChange => EntryKind::ConfChange,
            EntryType::EntryConfChangeV2 => EntryKind::ConfChangeV2,
        },
        data: e.data.to_vec(),
        context: e.context.to_vec(),
    }
}

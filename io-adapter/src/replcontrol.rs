//! A directory replica's control socket (issue 19): what its operator asks it, and the
//! client that asks.
//!
//! A replica serves `DATA_DIR/control.sock`, mode 0600: only the replica's own user (the
//! operator, or its supervisor) may connect. Each connection sends [`ReplicaRequest`] frames
//! (postcard, the framing of every other socket) and gets one [`ReplicaReply`] per request:
//!
//! - [`ReplicaCommand::Status`]: the replica's term, role, the leader it knows, the voters it
//!   applied and the addresses it knows them at.
//! - [`ReplicaCommand::Change`]: the serving replica proposes a change of the voters (joint
//!   consensus, left automatically): replicas to add, with where they listen for the others,
//!   and replicas to remove. The answer comes once it is proposed; [`ReplicaCommand::Status`]
//!   shows when it is applied. Another replica answers [`ReplicaReply::NotLeader`].
//! - [`ReplicaCommand::TransferLeader`]: the serving replica hands its leadership to a voter
//!   that holds its whole log, and stops serving at once; the answer comes once the transfer
//!   started ([`ReplicaReply::Transferring`]), and [`ReplicaCommand::Status`] shows the new
//!   leader. Refused with the reason when the replica is not a caught-up voter.
//!
//! `dataplane-node replicas --data-dir DIR status|change|transfer-leader` is the client
//! ([`ReplicaControl`]).

use std::fmt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use dataplane_replica::ReplicaId;
use serde::{Deserialize, Serialize};

use crate::frame::{FrameError, FrameReader, write_frame};
use crate::net::Outgoing;

/// The protocol's version; a request of another one is answered [`ReplicaReply::Refused`].
pub const REPLICA_CONTROL_VERSION: u16 = 1;
/// The most control connections a replica keeps open at once.
pub const REPLICA_CONTROLS_MAX: usize = 4;
/// The largest request frame, in bytes.
pub const REPLICA_CONTROL_FRAME_MAX: usize = 16 * 1024;
/// The most replicas one change adds or removes.
pub const CHANGE_REPLICAS_MAX: usize = 8;
/// How long the client waits for an answer.
const TIMEOUT: StdDuration = StdDuration::from_secs(10);

/// The control socket in a replica's data directory.
pub fn replica_control_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

/// One request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRequest {
    /// [`REPLICA_CONTROL_VERSION`].
    pub version: u16,
    /// What to do.
    pub command: ReplicaCommand,
}

/// What a request asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaCommand {
    /// The replica's view of its group.
    Status,
    /// Change the voters (the serving replica only).
    Change {
        /// Replicas to add, with the address where each listens for the others.
        add: Vec<(ReplicaId, String)>,
        /// Replicas to remove.
        remove: Vec<ReplicaId>,
    },
    /// Hand the leadership to this voter (the serving replica only).
    TransferLeader {
        /// The voter to lead next.
        to: ReplicaId,
    },
}

/// A replica's view of its group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// This replica.
    pub id: ReplicaId,
    /// Its term.
    pub term: u64,
    /// Whether it serves (leads, and applied its term's first entry).
    pub serving: bool,
    /// The leader it knows, if any.
    pub leader: Option<ReplicaId>,
    /// The voters it applied (both sides during a joint change).
    pub voters: Vec<ReplicaId>,
    /// Whether a joint change is in progress.
    pub joint: bool,
    /// Where it reaches each other replica.
    pub addresses: Vec<(ReplicaId, String)>,
    /// Its last applied index.
    pub applied: u64,
    /// Still catching up as a non-voter after it lost its log.
    pub joining: bool,
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaReply {
    /// The replica's view.
    Status(ReplicaStatus),
    /// The change is proposed at this log index.
    Proposed(u64),
    /// The leadership transfer started: this replica serves no more.
    Transferring,
    /// This replica does not serve; the leader it knows, if any.
    NotLeader(Option<ReplicaId>),
    /// The request was refused (malformed, another version, an invalid change, another
    /// change pending).
    Refused(String),
}

impl Outgoing for ReplicaReply {}

/// Why a control request failed.
#[derive(Debug)]
pub enum ReplicaControlError {
    /// The control socket could not be reached.
    Connect(PathBuf, std::io::Error),
    /// The connection failed or the replica answered nonsense.
    Frame(FrameError),
    /// The replica closed the connection without an answer.
    Closed,
    /// The replica refused the request.
    Refused(String),
    /// It does not serve; the leader it knows.
    NotLeader(Option<ReplicaId>),
    /// It answered something that does not answer the request.
    Unexpected,
}

impl fmt::Display for ReplicaControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaControlError::Connect(path, e) => write!(
                f,
                "cannot reach the replica's control socket {}: {e}",
                path.display()
            ),
            ReplicaControlError::Frame(e) => write!(f, "the control connection failed: {e}"),
            ReplicaControlError::Closed => f.write_str("the replica closed the connection"),
            ReplicaControlError::Refused(why) => write!(f, "the replica refused: {why}"),
            ReplicaControlError::NotLeader(Some(l)) => write!(
                f,
                "this replica does not serve: ask replica {l}'s control socket"
            ),
            ReplicaControlError::NotLeader(None) => {
                f.write_str("this replica does not serve, and knows no leader now")
            }
            ReplicaControlError::Unexpected => f.write_str("the replica answered something else"),
        }
    }
}

impl std::error::Error for ReplicaControlError {}

impl From<FrameError> for ReplicaControlError {
    fn from(e: FrameError) -> Self {
        ReplicaControlError::Frame(e)
    }
}

/// A blocking client of a replica's control socket.
#[derive(Debug)]
pub struct ReplicaControl {
    reader: FrameReader<UnixStream>,
}

impl ReplicaControl {
    /// Connects to the control socket of the replica whose data directory is `data_dir`.
    pub fn connect(data_dir: &Path) -> Result<ReplicaControl, ReplicaControlError> {
        let path = replica_control_path(data_dir);
        let stream =
            UnixStream::connect(&path).map_err(|e| ReplicaControlError::Connect(path, e))?;
        let _ = stream.set_read_timeout(Some(TIMEOUT));
        let _ = stream.set_write_timeout(Some(TIMEOUT));
        Ok(ReplicaControl {
            reader: FrameReader::new(stream),
        })
    }

    fn ask(&mut self, command: ReplicaCommand) -> Result<ReplicaReply, ReplicaControlError> {
        let request = ReplicaRequest {
            version: REPLICA_CONTROL_VERSION,
            command,
        };
        let mut stream = self.reader.get_ref();
        write_frame(&mut stream, &request)?;
        match self.reader.read_frame::<ReplicaReply>()? {
            None => Err(ReplicaControlError::Closed),
            Some(ReplicaReply::Refused(why)) => Err(ReplicaControlError::Refused(why)),
            Some(ReplicaReply::NotLeader(l)) => Err(ReplicaControlError::NotLeader(l)),
            Some(reply) => Ok(reply),
        }
    }

    /// The replica's view of its group.
    pub fn status(&mut self) -> Result<ReplicaStatus, ReplicaControlError> {
        match self.ask(ReplicaCommand::Status)? {
            ReplicaReply::Status(status) => Ok(status),
            _ => Err(ReplicaControlError::Unexpected),
        }
    }

    /// Asks the serving replica to hand its leadership to voter `to`.
    pub fn transfer_leader(&mut self, to: ReplicaId) -> Result<(), ReplicaControlError> {
        match self.ask(ReplicaCommand::TransferLeader { to })? {
            ReplicaReply::Transferring => Ok(()),
            _ => Err(ReplicaControlError::Unexpected),
        }
    }

    /// Proposes a change of the voters; the index of its entry.
    pub fn change(
        &mut self,
        add: Vec<(ReplicaId, String)>,
        remove: Vec<ReplicaId>,
    ) -> Result<u64, ReplicaControlError> {
        match self.ask(ReplicaCommand::Change { add, remove })? {
            ReplicaReply::Proposed(index) => Ok(index),
            _ => Err(ReplicaControlError::Unexpected),
        }
    }
}

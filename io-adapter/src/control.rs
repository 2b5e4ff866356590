//! The host's control socket (issue 17): what the program or the operator that runs a host
//! can ask it, and the client that asks.
//!
//! A host serves `<socket>.ctl` next to its child socket, mode 0600 whatever the umask and
//! `--socket-group`: only the host's own user (the operator, or the supervisor that started
//! it) may connect; children, who may share a group with the child socket, may not. Each
//! connection sends [`ControlRequest`] frames (postcard, the same framing as the child socket)
//! and gets one [`ControlReply`] per request, in order:
//!
//! - [`ControlCommand::Sessions`]: the live sessions, their children and how many bindings
//!   each still tracks.
//! - [`ControlCommand::Revoke`]: end a session. Its child is told `Revoked`; every binding ends
//!   as for a dying child (reads and unpublished writes let go, the child's connection is
//!   closed once the event is out); its leases are reclaimed when no view of them is left;
//!   the blobs it published stay.
//! - [`ControlCommand::ArenaStats`]: one consistent sample of the arena.
//!
//! [`HostControl`] is the blocking client; `dataplane sessions`, `dataplane revoke SESSION` and
//! `dataplane arena` use it.

use std::fmt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use dataplane_core::arena::ArenaStats;
use dataplane_core::ids::Address;
use serde::{Deserialize, Serialize};

use crate::frame::{FrameError, FrameReader, write_frame};
use crate::net::Outgoing;

/// The control protocol's version; a request of another version is answered
/// [`ControlReply::Refused`].
pub const CONTROL_VERSION: u16 = 1;
/// The most control connections a host keeps open at once (a further one closes the one idle
/// longest: [`ControlConns`]).
pub const CONTROL_CONNECTIONS_MAX: usize = 8;
/// The largest control request frame, in bytes.
pub const CONTROL_FRAME_BYTES_MAX: usize = 4 * 1024;
/// How long the client waits for an answer.
const CONTROL_TIMEOUT: StdDuration = StdDuration::from_secs(10);

/// The control socket next to a host's child socket.
pub fn control_path(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".ctl");
    PathBuf::from(name)
}

/// One request on the control socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlRequest {
    /// [`CONTROL_VERSION`].
    pub version: u16,
    /// What to do.
    pub command: ControlCommand,
}

/// What a control request asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlCommand {
    /// List the live sessions.
    Sessions,
    /// Revoke the session at this address.
    Revoke {
        /// The session (as [`SessionInfo::session`] names it).
        session: Address,
    },
    /// Sample the arena.
    ArenaStats,
}

/// One live session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The session's address.
    pub session: Address,
    /// The attached child, if one is.
    pub child: Option<Address>,
    /// `awaiting-attachment`, `running` or `closing`.
    pub state: String,
    /// Operations the session still tracks.
    pub bindings: u64,
    /// Writes it published that it may still release.
    pub published: u64,
}

/// The answer to one control request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlReply {
    /// The live sessions.
    Sessions(Vec<SessionInfo>),
    /// The session was revoked.
    Revoked,
    /// No live session has that address (never was, or already ended).
    NoSuchSession,
    /// The arena's sample.
    ArenaStats(ArenaStats),
    /// The request was not understood (a bad frame or another version); the host closes.
    Refused(String),
}

impl Outgoing for ControlReply {}

/// Why a control request failed.
#[derive(Debug)]
pub enum ControlError {
    /// The control socket could not be reached (no host, or not this user's).
    Connect(PathBuf, std::io::Error),
    /// The connection failed or the host answered nonsense.
    Frame(FrameError),
    /// The host closed the connection without an answer.
    Closed,
    /// The host refused the request.
    Refused(String),
    /// No live session has that address.
    NoSuchSession(Address),
    /// The host answered something that does not answer the request.
    Unexpected(&'static str),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Connect(path, e) => {
                write!(
                    f,
                    "cannot reach the host's control socket {}: {e}",
                    path.display()
                )
            }
            ControlError::Frame(e) => write!(f, "the control connection failed: {e}"),
            ControlError::Closed => f.write_str("the host closed the control connection"),
            ControlError::Refused(reason) => write!(f, "the host refused: {reason}"),
            ControlError::NoSuchSession(session) => write!(f, "no live session {session}"),
            ControlError::Unexpected(what) => write!(f, "the host answered {what}"),
        }
    }
}

impl std::error::Error for ControlError {}

impl From<FrameError> for ControlError {
    fn from(e: FrameError) -> Self {
        ControlError::Frame(e)
    }
}

/// A blocking client of a host's control socket.
#[derive(Debug)]
pub struct HostControl {
    reader: FrameReader<UnixStream>,
}

impl HostControl {
    /// Connects to the control socket of the host serving `socket` (its child socket).
    pub fn connect(socket: &Path) -> Result<HostControl, ControlError> {
        let path = control_path(socket);
        let stream = UnixStream::connect(&path).map_err(|e| ControlError::Connect(path, e))?;
        let _ = stream.set_read_timeout(Some(CONTROL_TIMEOUT));
        let _ = stream.set_write_timeout(Some(CONTROL_TIMEOUT));
        Ok(HostControl {
            reader: FrameReader::new(stream),
        })
    }

    fn ask(&mut self, command: ControlCommand) -> Result<ControlReply, ControlError> {
        let request = ControlRequest {
            version: CONTROL_VERSION,
            command,
        };
        let mut stream = self.reader.get_ref();
        write_frame(&mut stream, &request)?;
        match self.reader.read_frame::<ControlReply>()? {
            None => Err(ControlError::Closed),
            Some(ControlReply::Refused(reason)) => Err(ControlError::Refused(reason)),
            Some(reply) => Ok(reply),
        }
    }

    /// The live sessions.
    pub fn sessions(&mut self) -> Result<Vec<SessionInfo>, ControlError> {
        match self.ask(ControlCommand::Sessions)? {
            ControlReply::Sessions(sessions) => Ok(sessions),
            _ => Err(ControlError::Unexpected("something else than the sessions")),
        }
    }

    /// Revokes `session`: its child is told, its bindings end, its published blobs stay.
    pub fn revoke(&mut self, session: Address) -> Result<(), ControlError> {
        match self.ask(ControlCommand::Revoke { session })? {
            ControlReply::Revoked => Ok(()),
            ControlReply::NoSuchSession => Err(ControlError::NoSuchSession(session)),
            _ => Err(ControlError::Unexpected("something else than a revocation")),
        }
    }

    /// One consistent sample of the arena.
    pub fn arena_stats(&mut self) -> Result<ArenaStats, ControlError> {
        match self.ask(ControlCommand::ArenaStats)? {
            ControlReply::ArenaStats(stats) => Ok(stats),
            _ => Err(ControlError::Unexpected(
                "something else than arena statistics",
            )),
        }
    }
}

/// Parses a session address as `dataplane sessions` prints it: `n<node>.<incarnation>/<actor>`
/// (the `n` may be left out).
pub fn parse_session(text: &str) -> Result<Address, String> {
    let bad = || format!("{text:?} is not a session address (n<node>.<incarnation>/<actor>)");
    let rest = text.strip_prefix('n').unwrap_or(text);
    let (node, rest) = rest.split_once('.').ok_or_else(bad)?;
    let (incarnation, actor) = rest.split_once('/').ok_or_else(bad)?;
    let number = |s: &str| s.parse::<u64>().map_err(|_| bad());
    Ok(Address::new(
        dataplane_core::ids::NodeId(number(node)?),
        number(incarnation)?,
        number(actor)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_addresses_parse_as_printed() {
        let session = Address::new(dataplane_core::ids::NodeId(3), 2, 1 << 40);
        assert_eq!(parse_session(&session.to_string()), Ok(session));
        assert_eq!(parse_session("3.2/1099511627776"), Ok(session));
        for bad in ["", "n3", "n3.2", "n3.x/1", "n3.2/-1", "n3.2/1/2"] {
            assert!(parse_session(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            control_path(Path::new("/tmp/dp-a.sock")),
            PathBuf::from("/tmp/dp-a.sock.ctl")
        );
    }
}

/// How long a control connection may stay without a request before it is closed (a
/// `dataplane` command asks at once; an idle one only holds a slot).
pub const CONTROL_IDLE: dataplane_core::time::Duration =
    dataplane_core::time::Duration::from_secs(10);

/// The open control connections of a node (its host control socket, or a replica's): at
/// most `max`, each closed after [`CONTROL_IDLE`] without a request, and a new one makes
/// room by closing the one that has been idle longest, so that silent connections can never
/// lock an operator out.
#[derive(Debug)]
pub struct ControlConns {
    /// Each connection and when it last asked (or was accepted).
    conns: std::collections::BTreeMap<crate::net::ConnId, dataplane_core::time::Instant>,
    max: usize,
}

impl ControlConns {
    /// No connection yet; at most `max` (at least 1).
    pub fn new(max: usize) -> ControlConns {
        ControlConns {
            conns: std::collections::BTreeMap::new(),
            max: max.max(1),
        }
    }

    /// `conn` was accepted at `now`; returns the connection closed to make room for it, if the
    /// table was full (the caller closes it).
    pub fn accepted(
        &mut self,
        conn: crate::net::ConnId,
        now: dataplane_core::time::Instant,
    ) -> Option<crate::net::ConnId> {
        let evicted = if self.conns.len() >= self.max {
            let oldest = self
                .conns
                .iter()
                .min_by_key(|(c, at)| (**at, **c))
                .map(|(c, _)| *c);
            if let Some(oldest) = oldest {
                self.conns.remove(&oldest);
            }
            oldest
        } else {
            None
        };
        self.conns.insert(conn, now);
        evicted
    }

    /// A request arrived on `conn` at `now`. Whether it is a control connection.
    pub fn asked(&mut self, conn: crate::net::ConnId, now: dataplane_core::time::Instant) -> bool {
        match self.conns.get_mut(&conn) {
            Some(at) => {
                *at = now;
                true
            }
            None => false,
        }
    }

    /// Forgets `conn` (closed); whether it was one.
    pub fn remove(&mut self, conn: crate::net::ConnId) -> bool {
        self.conns.remove(&conn).is_some()
    }

    /// The connections idle for [`CONTROL_IDLE`] at `now`, forgotten (the caller closes them).
    pub fn expire(&mut self, now: dataplane_core::time::Instant) -> Vec<crate::net::ConnId> {
        let idle: Vec<crate::net::ConnId> = self
            .conns
            .iter()
            .filter(|(_, at)| now.saturating_since(**at) >= CONTROL_IDLE)
            .map(|(c, _)| *c)
            .collect();
        for conn in &idle {
            self.conns.remove(conn);
        }
        idle
    }

    /// How many are open.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }
}

#[cfg(test)]
mod conns_tests {
    use super::*;
    use dataplane_core::time::{Duration, Instant};

    #[test]
    fn a_full_table_closes_the_longest_idle_and_idle_ones_expire() {
        let t = |ms: u64| Instant::ZERO.saturating_add(Duration::from_millis(ms));
        let mut c = ControlConns::new(2);
        assert_eq!(c.accepted(1, t(0)), None);
        assert_eq!(c.accepted(2, t(10)), None);
        assert!(c.asked(1, t(20)), "1 asked: 2 is now the longest idle");
        assert_eq!(c.accepted(3, t(30)), Some(2));
        assert!(!c.asked(2, t(31)), "2 was closed");
        assert_eq!(c.len(), 2);
        let idle = CONTROL_IDLE.as_millis();
        assert_eq!(c.expire(t(20 + idle - 1)), Vec::<u64>::new());
        assert_eq!(c.expire(t(20 + idle)), vec![1]);
        assert_eq!(c.expire(t(30 + idle)), vec![3]);
        assert!(c.is_empty());
    }

    /// One thing that happens to a control table.
    #[derive(Clone, Debug)]
    enum Step {
        /// Time passes (ms).
        Wait(u64),
        /// A connection is accepted.
        Accept,
        /// The `n`th connection ever accepted asks (closed or not).
        Ask(usize),
        /// The node's tick expires idle connections.
        Expire,
        /// An operator connects and asks at once.
        Operator,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0u64..15_000).prop_map(Step::Wait),
            Just(Step::Accept),
            (0usize..64).prop_map(Step::Ask),
            Just(Step::Expire),
            Just(Step::Operator),
        ]
    }

    proptest::proptest! {
        /// The table against the rule, restated from what it was told and what it answered
        /// (a record kept here, not the table's): never more than `max` open; a full table
        /// closes a connection idle at least as long as every other open one; an expiry closes
        /// exactly the open connections idle for `CONTROL_IDLE`; a request counts only on an
        /// open connection; and an operator who connects and asks at once is always served,
        /// whatever silent connections hold the table.
        #[test]
        fn silent_connections_never_lock_an_operator_out(
            max in 1usize..6,
            steps in proptest::collection::vec(step(), 1..80),
        ) {
            use std::collections::BTreeMap;
            let mut table = ControlConns::new(max);
            let mut now = Instant::ZERO;
            // Our record: every open connection and when it last asked or was accepted.
            let mut open: BTreeMap<u64, Instant> = BTreeMap::new();
            let mut next = 0u64;
            let mut accept = |table: &mut ControlConns,
                              open: &mut BTreeMap<u64, Instant>,
                              now: Instant|
             -> Result<u64, proptest::test_runner::TestCaseError> {
                let conn = next;
                next += 1;
                let evicted = table.accepted(conn, now);
                if open.len() >= max {
                    let victim = evicted.ok_or_else(|| {
                        proptest::test_runner::TestCaseError::fail("a full table evicted nobody")
                    })?;
                    let at = open.remove(&victim).ok_or_else(|| {
                        proptest::test_runner::TestCaseError::fail("evicted a closed connection")
                    })?;
                    proptest::prop_assert!(
                        open.values().all(|other| at <= *other),
                        "evicted {victim} (idle since {at}) while another was idle longer"
                    );
                } else {
                    proptest::prop_assert_eq!(evicted, None, "evicted with room left");
                }
                open.insert(conn, now);
                Ok(conn)
            };
            for s in steps {
                match s {
                    Step::Wait(ms) => now = now.saturating_add(Duration::from_millis(ms)),
                    Step::Accept => {
                        accept(&mut table, &mut open, now)?;
                    }
                    Step::Ask(n) => {
                        let conn = n as u64;
                        let served = table.asked(conn, now);
                        proptest::prop_assert_eq!(served, open.contains_key(&conn));
                        if served {
                            open.insert(conn, now);
                        }
                    }
                    Step::Expire => {
                        let mut closed = table.expire(now);
                        closed.sort_unstable();
                        let idle: Vec<u64> = open
                            .iter()
                            .filter(|(_, at)| now.saturating_since(**at) >= CONTROL_IDLE)
                            .map(|(c, _)| *c)
                            .collect();
                        proptest::prop_assert_eq!(&closed, &idle);
                        for c in closed {
                            open.remove(&c);
                        }
                    }
                    Step::Operator => {
                        let conn = accept(&mut table, &mut open, now)?;
                        proptest::prop_assert!(table.asked(conn, now), "the operator was not served");
                    }
                }
                proptest::prop_assert!(open.len() <= max);
                proptest::prop_assert_eq!(table.len(), open.len());
            }
        }
    }
}

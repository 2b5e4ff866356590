//! Admission of connections: who may speak to a node, and for how long a connection may stay
//! before it has proved it may (issue 11, items 2, 4 and 8).
//!
//! Two pure pieces, both driven by a node's IO driver:
//!
//! * **The handshake proofs.** A connecting node and the node it connects to prove to each
//!   other that they know the cluster key, without sending it: the connector's hello carries
//!   a fresh nonce; the acceptor answers with its own nonce and
//!   [`acceptor_proof`] (a keyed BLAKE3 hash of the hello it received and its nonce); the
//!   connector checks it and answers [`connector_proof`] (the same inputs under another
//!   label). Each proof covers the other side's fresh nonce, so a recorded proof is worthless
//!   on another connection, and the key never travels. Without a cluster key both proofs are
//!   absent, and a side that has a key refuses a side that has none (and the other way round).
//!   Proofs are compared in constant time ([`proofs_match`]).
//! * **The waiting room** ([`Admission`]): every accepted connection is *pending* until the
//!   driver admits it (a valid hello and proof, or a child's valid attach). A pending
//!   connection that is not admitted within the deadline is closed, and the pending table has
//!   a bound: when it is full, the oldest pending connection makes room for the new one (an
//!   attacker who opens connections faster than the deadline can only delay a legitimate
//!   client's handshake, never lock it out for good, and never holds more than the bound).
//!   Admitted connections have a bound of their own.
//!
//! Nonces are inputs: the driver draws them from the operating system's generator. Nothing
//! here reads a clock or draws a random number; every table is a `BTreeMap`/`BTreeSet`.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{Address, NodeId};
use crate::time::{Duration, Instant};
use crate::wire::{Envelope, GoneScope, Message};

/// Marks a hello of this protocol (the first value of every hello).
pub const HANDSHAKE_MAGIC: u32 = 0x4450_4c4b;
/// The protocol version this build speaks; a hello of another version is refused with a
/// message that names both. (2: hosts ask the directory where a peer listens instead of
/// being sent the whole peer list on every admission. 3: a node pings the connections it made
/// and gives up one that answers nothing, `Link::Ping` and `Link::Pong`.)
pub const PROTOCOL_VERSION: u16 = 3;
/// The largest frame a connection may send before it is admitted: a hello, a proof or a
/// child's attach, with room to spare. A longer announced frame closes the connection before
/// anything is read or reserved for it.
pub const HELLO_FRAME_BYTES_MAX: usize = 4 * 1024;
/// How long an accepted connection may take to be admitted.
pub const ADMISSION_DEADLINE: Duration = Duration::from_secs(5);
/// Most connections waiting to be admitted at one listener.
pub const PENDING_CONNECTIONS_MAX: usize = 256;

/// A handshake nonce: fresh random bytes from the driver, one per connection and side.
pub type Nonce = [u8; 32];
/// A proof of the cluster key over one handshake.
pub type Proof = [u8; 32];

const ACCEPTOR_LABEL: &[u8] = b"dataplane handshake v1: acceptor";
const CONNECTOR_LABEL: &[u8] = b"dataplane handshake v1: connector";

fn proof(label: &[u8], key: &[u8; 32], hello: &[u8], acceptor_nonce: &Nonce) -> Proof {
    let mut mac = blake3::Hasher::new_keyed(key);
    mac.update(label);
    // The hello is length-prefixed so that (hello, nonce) pairs cannot be re-split.
    mac.update(&(hello.len() as u64).to_le_bytes());
    mac.update(hello);
    mac.update(acceptor_nonce);
    *mac.finalize().as_bytes()
}

/// The acceptor's proof: over the connector's hello exactly as it arrived (it carries the
/// connector's nonce) and the acceptor's own nonce. `None` without a key.
pub fn acceptor_proof(
    key: Option<&[u8; 32]>,
    hello: &[u8],
    acceptor_nonce: &Nonce,
) -> Option<Proof> {
    key.map(|k| proof(ACCEPTOR_LABEL, k, hello, acceptor_nonce))
}

/// The connector's proof: over its own hello and the acceptor's nonce. `None` without a key.
pub fn connector_proof(
    key: Option<&[u8; 32]>,
    hello: &[u8],
    acceptor_nonce: &Nonce,
) -> Option<Proof> {
    key.map(|k| proof(CONNECTOR_LABEL, k, hello, acceptor_nonce))
}

/// Whether a presented proof is the expected one: both absent (no cluster key on either
/// side), or both present and equal, compared in constant time.
pub fn proofs_match(expected: Option<&Proof>, presented: Option<&Proof>) -> bool {
    match (expected, presented) {
        (None, None) => true,
        (Some(a), Some(b)) => blake3::Hash::from_bytes(*a) == blake3::Hash::from_bytes(*b),
        _ => false,
    }
}

/// Why a hello is refused, as the refusal tells the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelloRefusal {
    /// Not a hello of this protocol at all.
    NotAHello,
    /// Another protocol version.
    Version {
        /// The version the peer speaks.
        theirs: u16,
    },
    /// The proof does not match (a wrong key, or a key on one side only).
    WrongKey,
    /// The node admits no more connections of this kind.
    Full,
}

impl core::fmt::Display for HelloRefusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HelloRefusal::NotAHello => f.write_str("not a dataplane hello"),
            HelloRefusal::Version { theirs } => write!(
                f,
                "protocol version {theirs} is not supported (this node speaks version {PROTOCOL_VERSION})"
            ),
            HelloRefusal::WrongKey => f.write_str("wrong cluster key (see --cluster-key-file)"),
            HelloRefusal::Full => f.write_str("the node admits no more connections"),
        }
    }
}

/// Checks a hello's magic and version.
pub fn check_version(magic: u32, version: u16) -> Result<(), HelloRefusal> {
    if magic != HANDSHAKE_MAGIC {
        return Err(HelloRefusal::NotAHello);
    }
    if version != PROTOCOL_VERSION {
        return Err(HelloRefusal::Version { theirs: version });
    }
    Ok(())
}

/// What [`Admission::accepted`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// The connection waits to be admitted.
    Pending,
    /// The connection waits; the oldest pending connection made room and must be closed.
    PendingEvicting(u64),
}

/// The waiting room of one listener. See the module documentation.
#[derive(Clone, Debug)]
pub struct Admission {
    deadline: Duration,
    pending_max: usize,
    admitted_max: usize,
    /// Pending connections: when each was accepted, and its arrival number.
    pending: BTreeMap<u64, (Instant, u64)>,
    /// The same, oldest first (by arrival number: times never go back, so this is also the
    /// order of their deadlines).
    by_age: BTreeMap<u64, u64>,
    next_arrival: u64,
    admitted: BTreeSet<u64>,
}

impl Admission {
    /// A waiting room with the given deadline and bounds (each at least 1).
    pub fn new(deadline: Duration, pending_max: usize, admitted_max: usize) -> Admission {
        Admission {
            deadline,
            pending_max: pending_max.max(1),
            admitted_max: admitted_max.max(1),
            pending: BTreeMap::new(),
            by_age: BTreeMap::new(),
            next_arrival: 0,
            admitted: BTreeSet::new(),
        }
    }

    /// Connection `conn` was accepted at `now`. An id already known changes nothing.
    pub fn accepted(&mut self, now: Instant, conn: u64) -> Accepted {
        if self.pending.contains_key(&conn) || self.admitted.contains(&conn) {
            return Accepted::Pending;
        }
        let mut outcome = Accepted::Pending;
        if self.pending.len() >= self.pending_max
            && let Some((_, oldest)) = self.by_age.pop_first()
        {
            self.pending.remove(&oldest);
            outcome = Accepted::PendingEvicting(oldest);
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.pending.insert(conn, (now, arrival));
        self.by_age.insert(arrival, conn);
        self.debug_check();
        outcome
    }

    /// Admits a pending connection. Refused (and still pending) if the admitted bound is
    /// reached; an unknown or already admitted connection is refused too.
    pub fn admit(&mut self, conn: u64) -> Result<(), HelloRefusal> {
        let Some(&(_, arrival)) = self.pending.get(&conn) else {
            return Err(HelloRefusal::NotAHello);
        };
        if self.admitted.len() >= self.admitted_max {
            return Err(HelloRefusal::Full);
        }
        self.pending.remove(&conn);
        self.by_age.remove(&arrival);
        self.admitted.insert(conn);
        self.debug_check();
        Ok(())
    }

    /// The connection is gone (closed by either side).
    pub fn closed(&mut self, conn: u64) {
        if let Some((_, arrival)) = self.pending.remove(&conn) {
            self.by_age.remove(&arrival);
        }
        self.admitted.remove(&conn);
        self.debug_check();
    }

    /// Removes and returns every pending connection whose deadline passed at `now`: close
    /// them.
    pub fn expired(&mut self, now: Instant) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some((&arrival, &conn)) = self.by_age.first_key_value() {
            let at = self.pending.get(&conn).map_or(now, |(at, _)| *at);
            if now.saturating_since(at) < self.deadline {
                break;
            }
            self.by_age.remove(&arrival);
            self.pending.remove(&conn);
            out.push(conn);
        }
        self.debug_check();
        out
    }

    /// When the oldest pending connection's deadline passes.
    pub fn next_deadline(&self) -> Option<Instant> {
        let (_, conn) = self.by_age.first_key_value()?;
        let (at, _) = self.pending.get(conn)?;
        Some(at.saturating_add(self.deadline))
    }

    /// Whether `conn` waits to be admitted.
    pub fn is_pending(&self, conn: u64) -> bool {
        self.pending.contains_key(&conn)
    }

    /// Whether `conn` was admitted.
    pub fn is_admitted(&self, conn: u64) -> bool {
        self.admitted.contains(&conn)
    }

    /// How many connections wait.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// How many connections were admitted and are still open.
    pub fn admitted_count(&self) -> usize {
        self.admitted.len()
    }

    /// The bounds hold and the two indexes of the pending table agree.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.pending.len() > self.pending_max {
            return Err(format!("{} pending connections", self.pending.len()));
        }
        if self.admitted.len() > self.admitted_max {
            return Err(format!("{} admitted connections", self.admitted.len()));
        }
        if self.by_age.len() != self.pending.len()
            || self
                .by_age
                .iter()
                .any(|(arrival, c)| self.pending.get(c).map(|p| p.1) != Some(*arrival))
        {
            return Err("the pending table's indexes disagree".to_owned());
        }
        if let Some(c) = self.pending.keys().find(|c| self.admitted.contains(c)) {
            return Err(format!("connection {c} is pending and admitted"));
        }
        Ok(())
    }

    fn debug_check(&self) {
        debug_assert_eq!(self.check_invariants(), Ok(()));
    }
}

/// Whether a frame that arrived on the connection of `node` speaks only for `node`: it comes
/// from one of its addresses, a call's reply goes back to it, and what it reports retired,
/// displaced or gone is its own. A connection may not act for another node: report another
/// host's addresses gone (ending its incarnation), acknowledge retirements or displacements
/// owed to another node's actors, or have the directory send replies elsewhere.
///
/// What a call names (a Register's source, a reservation's owner, an open's endpoint) is not
/// checked: a node's proxy forwards calls for its callers, who may live elsewhere (the
/// real-process stream test opens streams on two hosts' proxies from a third program).
pub fn speaks_for(node: NodeId, envelope: &Envelope) -> bool {
    let own = |a: &Address| a.node == node;
    own(&envelope.from)
        && match &envelope.message {
            Message::Call(call) => own(&call.reply_to),
            Message::AddressGone { scope, reply_to } => {
                own(reply_to)
                    && match scope {
                        GoneScope::Address(address) => own(address),
                        GoneScope::NodeBefore { node: gone, .. } => *gone == node,
                    }
            }
            Message::SourceRetired { source } => own(source),
            Message::StreamDisplaced { endpoint, .. } => own(endpoint),
            _ => true,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: [u8; 32] = [7; 32];
    const OTHER: [u8; 32] = [8; 32];

    fn at(ms: u64) -> Instant {
        Instant::ZERO.saturating_add(Duration::from_millis(ms))
    }

    #[test]
    fn proofs_bind_the_key_the_hello_and_the_nonce() {
        let hello = b"hello with the connector's nonce";
        let nonce = [1; 32];
        let a = acceptor_proof(Some(&KEY), hello, &nonce);
        let c = connector_proof(Some(&KEY), hello, &nonce);
        assert!(proofs_match(a.as_ref(), a.as_ref()));
        // The two directions never prove each other.
        assert!(!proofs_match(a.as_ref(), c.as_ref()));
        // Another key, hello or nonce: another proof.
        assert!(!proofs_match(
            a.as_ref(),
            acceptor_proof(Some(&OTHER), hello, &nonce).as_ref()
        ));
        assert!(!proofs_match(
            a.as_ref(),
            acceptor_proof(Some(&KEY), b"another hello", &nonce).as_ref()
        ));
        assert!(!proofs_match(
            a.as_ref(),
            acceptor_proof(Some(&KEY), hello, &[2; 32]).as_ref()
        ));
        // A key on one side only is refused either way; no key on both sides is admitted.
        assert!(!proofs_match(a.as_ref(), None));
        assert!(!proofs_match(None, a.as_ref()));
        assert!(proofs_match(None, None));
        assert_eq!(acceptor_proof(None, hello, &nonce), None);
    }

    #[test]
    fn a_connection_speaks_only_for_its_own_node() {
        let (own, other) = (NodeId(1), NodeId(2));
        let at = |node, actor| Address::new(node, 1, actor);
        let frame = |from, message| Envelope {
            from,
            to: Address::new(NodeId(0), 1, 0),
            message,
        };
        let gone = |scope| Message::AddressGone {
            scope,
            reply_to: at(own, 1),
        };
        // Its own reports and acknowledgements pass.
        assert!(speaks_for(
            own,
            &frame(at(own, 1), gone(GoneScope::Address(at(own, 9))))
        ));
        let before = |node| GoneScope::NodeBefore {
            node,
            incarnation: 5,
        };
        assert!(speaks_for(own, &frame(at(own, 1), gone(before(own)))));
        let retired = |source| Message::SourceRetired { source };
        assert!(speaks_for(own, &frame(at(own, 9), retired(at(own, 9)))));
        // Another node's addresses, incarnations, sources and endpoints do not.
        assert!(!speaks_for(
            own,
            &frame(at(other, 1), gone(GoneScope::Address(at(own, 9))))
        ));
        assert!(!speaks_for(
            own,
            &frame(at(own, 1), gone(GoneScope::Address(at(other, 9))))
        ));
        assert!(!speaks_for(own, &frame(at(own, 1), gone(before(other)))));
        let elsewhere = Message::AddressGone {
            scope: before(own),
            reply_to: at(other, 1),
        };
        assert!(!speaks_for(own, &frame(at(own, 1), elsewhere)));
        assert!(!speaks_for(own, &frame(at(own, 9), retired(at(other, 9)))));
        let displaced = Message::StreamDisplaced {
            endpoint: at(other, 9),
            incarnation: Default::default(),
        };
        assert!(!speaks_for(own, &frame(at(own, 9), displaced)));
    }

    #[test]
    fn versions_are_checked_and_named() {
        assert_eq!(check_version(HANDSHAKE_MAGIC, PROTOCOL_VERSION), Ok(()));
        assert_eq!(
            check_version(1, PROTOCOL_VERSION),
            Err(HelloRefusal::NotAHello)
        );
        let refusal = check_version(HANDSHAKE_MAGIC, 9).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "protocol version 9 is not supported (this node speaks version 3)"
        );
    }

    #[test]
    fn the_oldest_pending_connection_makes_room_and_deadlines_close() {
        let mut room = Admission::new(Duration::from_secs(5), 2, 1);
        assert_eq!(room.accepted(at(0), 1), Accepted::Pending);
        assert_eq!(room.accepted(at(10), 2), Accepted::Pending);
        assert_eq!(room.accepted(at(20), 3), Accepted::PendingEvicting(1));
        assert!(!room.is_pending(1));
        room.admit(2).unwrap();
        assert!(room.is_admitted(2));
        assert_eq!(room.accepted(at(30), 4), Accepted::Pending);
        // The admitted bound is reached: 3 stays pending.
        assert_eq!(room.admit(3), Err(HelloRefusal::Full));
        assert!(room.is_pending(3));
        assert_eq!(room.next_deadline(), Some(at(5_020)));
        assert_eq!(room.expired(at(5_019)), Vec::<u64>::new());
        assert_eq!(room.expired(at(5_030)), vec![3, 4]);
        room.closed(2);
        assert_eq!(room.admitted_count(), 0);
        assert_eq!(room.next_deadline(), None);
    }

    proptest! {
        #[test]
        fn the_waiting_room_stays_bounded(
            steps in proptest::collection::vec((0u8..4, 0u64..16, 0u64..2_000), 0..200)
        ) {
            let mut room = Admission::new(Duration::from_secs(1), 4, 3);
            let mut now = 0;
            // A model: the pending connections in arrival order, and the admitted ones.
            let mut pending: Vec<(u64, u64)> = Vec::new();
            let mut admitted: BTreeSet<u64> = BTreeSet::new();
            for (kind, conn, advance) in steps {
                now += advance;
                match kind {
                    0 => {
                        let known = pending.iter().any(|(_, c)| *c == conn)
                            || admitted.contains(&conn);
                        let outcome = room.accepted(at(now), conn);
                        if !known {
                            if pending.len() == 4 {
                                let (_, oldest) = pending.remove(0);
                                prop_assert_eq!(outcome, Accepted::PendingEvicting(oldest));
                            } else {
                                prop_assert_eq!(outcome, Accepted::Pending);
                            }
                            pending.push((now, conn));
                        }
                    }
                    1 => {
                        let result = room.admit(conn);
                        match pending.iter().position(|(_, c)| *c == conn) {
                            Some(i) if admitted.len() < 3 => {
                                prop_assert!(result.is_ok());
                                pending.remove(i);
                                admitted.insert(conn);
                            }
                            _ => prop_assert!(result.is_err()),
                        }
                    }
                    2 => {
                        room.closed(conn);
                        pending.retain(|(_, c)| *c != conn);
                        admitted.remove(&conn);
                    }
                    _ => {
                        let expired = room.expired(at(now));
                        let due: Vec<u64> = pending
                            .iter()
                            .filter(|(t, _)| now - t >= 1_000)
                            .map(|(_, c)| *c)
                            .collect();
                        pending.retain(|(t, _)| now - t < 1_000);
                        let mut expired_sorted = expired.clone();
                        expired_sorted.sort_unstable();
                        let mut due_sorted = due;
                        due_sorted.sort_unstable();
                        prop_assert_eq!(expired_sorted, due_sorted);
                    }
                }
                prop_assert_eq!(room.check_invariants(), Ok(()));
                prop_assert_eq!(room.pending_count(), pending.len());
                prop_assert_eq!(room.admitted_count(), admitted.len());
            }
        }
    }
}

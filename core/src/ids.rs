//! Identifiers and counters shared by every machine (SPEC §2.2).
//!
//! All of them are plain values derived from counters or addresses, never from randomness, so
//! identical inputs produce identical ids.

use core::fmt;
use serde::{Deserialize, Serialize};

/// A node of the data plane (a directory node or a host). Assigned by the deployment.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// The address of one actor (a directory, a proxy, a blob source, a stream endpoint, a client).
///
/// `incarnation` is the boot count of the node that created the address: a node that restarts
/// comes back with a higher incarnation, so every address of its previous life is recognisably
/// gone (DESIGN.md §5, Q5/Q8). `actor` is a per-incarnation counter chosen by the node.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Address {
    /// The node that hosts the actor.
    pub node: NodeId,
    /// The node's boot count when the actor was created.
    pub incarnation: u64,
    /// The actor's number within that incarnation.
    pub actor: u64,
}

impl Address {
    /// The address of actor `actor` on `node` in boot `incarnation`.
    pub const fn new(node: NodeId, incarnation: u64, actor: u64) -> Self {
        Address {
            node,
            incarnation,
            actor,
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}/{}", self.node, self.incarnation, self.actor)
    }
}

/// The incarnation of a node's *persistent* actors: the sources of its file blobs, which
/// outlive the node's restarts (issue 17). No node boots this many times, so no incarnation
/// floor ever passes it: an address of this incarnation is never "gone", and the host of its
/// node answers for it in every life (from its durable table of file blobs).
pub const PERSISTENT_INCARNATION: u64 = u64::MAX;

/// A client-chosen idempotency key for every mutation and stream open or cancel.
///
/// The id names who issued it (ARCHITECTURE "Retention of operation records"): the high 72
/// bits are its [`Issuer`] — the node (32 bits), the node's incarnation (32 bits) and a lane
/// (8 bits) that tells apart independent callers of one node incarnation — and the low 56
/// bits are a sequence number the issuer chooses. The directory keeps an operation's record
/// until the issuer declares every sequence below some horizon done, or the issuer's node
/// incarnation ends; a request whose record was pruned is refused `OperationExpired`.
/// Ordered as a number, the ids of one issuer are contiguous and in sequence order.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct OperationId(pub u128);

impl OperationId {
    /// Bits of the sequence number (the low bits of the id).
    pub const SEQUENCE_BITS: u32 = 56;
    /// One past the largest sequence number.
    pub const SEQUENCE_END: u64 = 1 << Self::SEQUENCE_BITS;

    /// The id of `issuer`'s operation `sequence` (only its low 56 bits are kept).
    pub const fn new(issuer: Issuer, sequence: u64) -> Self {
        OperationId(issuer.prefix() | (sequence & (Self::SEQUENCE_END - 1)) as u128)
    }

    /// Who issued it.
    pub const fn issuer(self) -> Issuer {
        Issuer {
            node: NodeId((self.0 >> 96) as u64 & 0xffff_ffff),
            incarnation: (self.0 >> 64) as u64 & 0xffff_ffff,
            lane: (self.0 >> Self::SEQUENCE_BITS) as u8,
        }
    }

    /// Its sequence number within its issuer.
    pub const fn sequence(self) -> u64 {
        self.0 as u64 & (Self::SEQUENCE_END - 1)
    }
}

/// Who issued an operation id: a caller on one node incarnation (see [`OperationId`]).
///
/// The node and the incarnation are kept to their low 32 bits, as the id carries them.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Issuer {
    /// The issuing node (below 2^32).
    pub node: NodeId,
    /// The node's incarnation when the ids were issued (below 2^32).
    pub incarnation: u64,
    /// Which caller of that node incarnation (a host machine uses lane 0).
    pub lane: u8,
}

impl Issuer {
    /// The issuer of lane `lane` on `node` in `incarnation` (both kept to 32 bits).
    pub const fn new(node: NodeId, incarnation: u64, lane: u8) -> Self {
        Issuer {
            node: NodeId(node.0 & 0xffff_ffff),
            incarnation: incarnation & 0xffff_ffff,
            lane,
        }
    }

    /// The issuer of lane `lane` on the node incarnation of `address`.
    pub const fn of(address: Address, lane: u8) -> Self {
        Issuer::new(address.node, address.incarnation, lane)
    }

    /// The high 72 bits of every id this issuer mints.
    const fn prefix(self) -> u128 {
        ((self.node.0 & 0xffff_ffff) as u128) << 96
            | ((self.incarnation & 0xffff_ffff) as u128) << 64
            | (self.lane as u128) << OperationId::SEQUENCE_BITS
    }

    /// Its operation `sequence`.
    pub const fn op(self, sequence: u64) -> OperationId {
        OperationId::new(self, sequence)
    }

    /// Its first and last possible ids (for range queries).
    pub const fn ids(self) -> core::ops::RangeInclusive<OperationId> {
        OperationId(self.prefix())
            ..=OperationId(self.prefix() | (OperationId::SEQUENCE_END - 1) as u128)
    }

    /// Whether `address` lives on this issuer's node incarnation (as far as 32 bits tell).
    pub const fn is_on(self, address: Address) -> bool {
        address.node.0 & 0xffff_ffff == self.node.0
            && address.incarnation & 0xffff_ffff == self.incarnation
    }
}

impl fmt::Display for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}~{}", self.node, self.incarnation, self.lane)
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A proxy-local correlation id, echoed by the directory. It has no deduplication meaning at
/// the directory; 0 marks an untracked frame.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct RequestId(pub u64);

impl RequestId {
    /// The id of frames nobody waits for.
    pub const UNTRACKED: RequestId = RequestId(0);
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// A global, monotonic namespace revision (≥ 1).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Revision(pub u64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "@{}", self.0)
    }
}

/// The directory's authority epoch: a durable counter bumped on every recovery (≥ 1 once
/// serving).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct AuthorityEpoch(pub u64);

impl AuthorityEpoch {
    /// The epoch carried by synthetic replies that no directory produced.
    pub const NONE: AuthorityEpoch = AuthorityEpoch(0);
}

impl fmt::Display for AuthorityEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// The identity of one stream rendezvous: the authority that minted it and the revision it
/// bound. Totally ordered, epoch first.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct StreamIncarnation {
    /// The epoch of the directory that matched the rendezvous.
    pub epoch: AuthorityEpoch,
    /// The revision the first opener bound.
    pub revision: Revision,
}

impl StreamIncarnation {
    /// The largest incarnation (a bound for range queries).
    pub const MAX: StreamIncarnation = StreamIncarnation {
        epoch: AuthorityEpoch(u64::MAX),
        revision: Revision(u64::MAX),
    };
}

impl fmt::Display for StreamIncarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.epoch, self.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_print_as_32_hex_digits() {
        assert_eq!(
            OperationId(0xab).to_string(),
            "000000000000000000000000000000ab"
        );
        assert_eq!(OperationId(u128::MAX).to_string().len(), 32);
    }

    #[test]
    fn operation_ids_carry_their_issuer_and_sequence() {
        let issuer = Issuer::new(NodeId(7), 3, 2);
        let op = issuer.op(41);
        assert_eq!(op.issuer(), issuer);
        assert_eq!(op.sequence(), 41);
        assert!(issuer.ids().contains(&op));
        assert!(issuer.op(40) < op && op < issuer.op(42));
        assert!(!Issuer::new(NodeId(7), 3, 3).ids().contains(&op));
        // A host's derived ids (node, incarnation, actor << 8 | purpose) are lane 0.
        let host = OperationId((7u128 << 96) | (3u128 << 64) | ((1u128 << 40) << 8) | 1);
        assert_eq!(host.issuer(), Issuer::new(NodeId(7), 3, 0));
        assert!(Issuer::new(NodeId(7), 3, 0).is_on(Address::new(NodeId(7), 3, 500)));
        assert!(!Issuer::new(NodeId(7), 3, 0).is_on(Address::new(NodeId(7), 4, 500)));
    }

    #[test]
    fn incarnations_order_by_epoch_then_revision() {
        let a = StreamIncarnation {
            epoch: AuthorityEpoch(1),
            revision: Revision(9),
        };
        let b = StreamIncarnation {
            epoch: AuthorityEpoch(2),
            revision: Revision(1),
        };
        assert!(a < b);
    }
}

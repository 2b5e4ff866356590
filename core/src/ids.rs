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

/// A client-chosen idempotency key for every mutation and stream open or cancel.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct OperationId(pub u128);

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

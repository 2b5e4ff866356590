//! The small rules the directory's semantics rest on, restated here from ARCHITECTURE.md and
//! SPEC.md instead of called from `dataplane_core`: how an operation id names its issuer, which
//! addresses a gone report covers, which error a sticky rejection answers, which endpoint of a
//! match plays a role. A core helper with the same job (`OperationId::issuer`,
//! `GoneScope::covers`, `Rejection::error`...) is the directory's own code; if it were wrong,
//! a model that called it would be wrong the same way and see nothing (issue 15, class 1).
//! `clippy.toml` of this crate refuses those helpers.

use dataplane_core::error::NamespaceError;
use dataplane_core::ids::Revision;
use dataplane_core::ids::{Address, Issuer, NodeId, OperationId};
use dataplane_core::log::{Entry, Rejection, RejectionKind};
use dataplane_core::wire::{GoneScope, StreamMatch, StreamRole};

/// Bits of an operation id's sequence number: its low 56 bits (ARCHITECTURE "Retention of
/// operation records": the high 72 bits are the issuer — node 32, incarnation 32, lane 8).
pub const SEQUENCE_BITS: u32 = 56;

/// One past the largest sequence number: the horizon "everything" (the answer to a
/// declaration of an ended issuer).
pub const SEQUENCE_END: u64 = 1 << SEQUENCE_BITS;

/// Who issued `op`: bits 96..128 are the node, 64..96 its incarnation, 56..64 the lane.
pub fn issuer_of(op: OperationId) -> Issuer {
    let id = op.0;
    Issuer {
        node: NodeId(((id >> 96) & 0xffff_ffff) as u64),
        incarnation: ((id >> 64) & 0xffff_ffff) as u64,
        lane: ((id >> SEQUENCE_BITS) & 0xff) as u8,
    }
}

/// The operation id of `issuer`'s sequence number `sequence` (the inverse of [`issuer_of`]
/// and [`sequence_of`]); `sequence` must be below [`SEQUENCE_END`].
pub fn operation_of(issuer: Issuer, sequence: u64) -> OperationId {
    debug_assert!(sequence < SEQUENCE_END);
    OperationId(
        (u128::from(issuer.node.0 & 0xffff_ffff) << 96)
            | (u128::from(issuer.incarnation & 0xffff_ffff) << 64)
            | (u128::from(issuer.lane) << SEQUENCE_BITS)
            | u128::from(sequence & (SEQUENCE_END - 1)),
    )
}

/// The sequence number of `op` within its issuer: its low 56 bits.
pub fn sequence_of(op: OperationId) -> u64 {
    (op.0 & ((1u128 << SEQUENCE_BITS) - 1)) as u64
}

/// Whether a caller at `address` may speak for `issuer`: it lives on the issuer's node
/// incarnation (as far as the id's 32 bits of each tell).
pub fn speaks_for(address: Address, issuer: Issuer) -> bool {
    address.node.0 & 0xffff_ffff == issuer.node.0
        && address.incarnation & 0xffff_ffff == issuer.incarnation
}

/// Whether a gone report of `scope` covers `address` (ARCHITECTURE "Addresses and gone
/// reports"): one actor, or every address of a node created before its current incarnation.
pub fn covers(scope: &GoneScope, address: &Address) -> bool {
    match *scope {
        GoneScope::Address(gone) => gone == *address,
        GoneScope::NodeBefore { node, incarnation } => {
            address.node == node && address.incarnation < incarnation
        }
    }
}

/// The error a sticky rejection answers, every time (SPEC §4.3; the kinds of ARCHITECTURE
/// "Every refusal is sticky").
pub fn rejection_error(rejection: &Rejection) -> NamespaceError {
    let path = rejection.path.clone();
    match rejection.kind {
        RejectionKind::PathNotFound => NamespaceError::PathNotFound(path),
        RejectionKind::PathExists => NamespaceError::PathExists(path),
        RejectionKind::StreamActive => NamespaceError::StreamActive(path),
        RejectionKind::PathReplaced => NamespaceError::PathReplaced(path),
        RejectionKind::WrongEntryType { expected, found } => NamespaceError::WrongEntryType {
            path,
            expected,
            found,
        },
        RejectionKind::DuplicateStreamRole(role) => {
            NamespaceError::DuplicateStreamRole { path, role }
        }
        RejectionKind::LimitReached(limit) => NamespaceError::LimitReached(limit),
    }
}

/// The revision of an entry (a blob's binding or a stream node).
pub fn revision_of(entry: &Entry) -> Revision {
    match entry {
        Entry::Blob { revision, .. } | Entry::Stream { revision } => *revision,
    }
}

/// The endpoint of `matched` that plays `role`.
pub fn endpoint_of(matched: &StreamMatch, role: StreamRole) -> Address {
    match role {
        StreamRole::Source => matched.source,
        StreamRole::Sink => matched.sink,
    }
}

/// The other role of a rendezvous.
pub fn peer_of(role: StreamRole) -> StreamRole {
    match role {
        StreamRole::Source => StreamRole::Sink,
        StreamRole::Sink => StreamRole::Source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `operation_of` inverts `issuer_of` and `sequence_of`, up to the largest issuer and
    /// sequence (the pruning walk's ranges end there).
    #[test]
    fn an_issuer_and_sequence_name_one_id() {
        let largest = Issuer {
            node: NodeId(0xffff_ffff),
            incarnation: 0xffff_ffff,
            lane: 0xff,
        };
        for issuer in [
            Issuer::default(),
            largest,
            issuer_of(OperationId(7u128 << 96)),
        ] {
            for sequence in [0, 1, SEQUENCE_END - 1] {
                let id = operation_of(issuer, sequence);
                assert_eq!((issuer_of(id), sequence_of(id)), (issuer, sequence));
            }
        }
        assert_eq!(
            operation_of(largest, SEQUENCE_END - 1),
            OperationId(u128::MAX)
        );
    }

    #[test]
    fn an_id_names_its_issuer_and_sequence_as_the_architecture_lays_it_out() {
        let id = OperationId((7u128 << 96) | (3u128 << 64) | (2u128 << 56) | 41);
        assert_eq!(
            issuer_of(id),
            Issuer {
                node: NodeId(7),
                incarnation: 3,
                lane: 2
            }
        );
        assert_eq!(sequence_of(id), 41);
        let last = OperationId(u128::MAX);
        assert_eq!(sequence_of(last), SEQUENCE_END - 1);
        assert_eq!(issuer_of(last).lane, 0xff);
        assert_eq!(issuer_of(last).node, NodeId(0xffff_ffff));
        let issuer = issuer_of(id);
        assert!(speaks_for(Address::new(NodeId(7), 3, 500), issuer));
        assert!(!speaks_for(Address::new(NodeId(7), 4, 500), issuer));
        assert!(!speaks_for(Address::new(NodeId(8), 3, 500), issuer));
    }

    #[test]
    fn a_node_report_covers_earlier_incarnations_only() {
        let scope = GoneScope::NodeBefore {
            node: NodeId(2),
            incarnation: 3,
        };
        assert!(covers(&scope, &Address::new(NodeId(2), 2, 9)));
        assert!(!covers(&scope, &Address::new(NodeId(2), 3, 9)));
        assert!(!covers(&scope, &Address::new(NodeId(1), 2, 9)));
        let one = GoneScope::Address(Address::new(NodeId(2), 3, 9));
        assert!(covers(&one, &Address::new(NodeId(2), 3, 9)));
        assert!(!covers(&one, &Address::new(NodeId(2), 3, 10)));
    }
}

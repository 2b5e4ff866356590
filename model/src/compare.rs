//! The comparison of the directory's durable state with the model's, every field (issue 15,
//! class 2: a comparison that skips a field sees nothing of a defect that lives there).
//!
//! The directory's durable state (`DurableState`) is, field by field: the last adopted epoch;
//! the next revision; the entries (path → blob or stream node, every field of each); the
//! operation records (id → request key and outcome); the reservations (path → operation and
//! owner); the obligations, in persisted order, each with its fenced path; the node floors;
//! and the issuer rows (horizon and record count). Its other two fields are derived or
//! internal: the set of operations a reservation pins (the reservations' operations) and the
//! next obligation sequence number (only the order it gives is state). Compaction writes each
//! of these as a `SnapshotRecord` variant; the unit test below changes every field of every
//! variant, one at a time, and requires the comparison to name it.
//!
//! [`first_difference`] walks both sides in lockstep, field by field in [`FIELDS`] order, and
//! names the first field that differs with the first differing element of each side. It reads
//! the directory through `DurableState`'s getters only.

use core::fmt;

use dataplane_core::directory::{DurableState, ObligationKey};
use dataplane_core::ids::{AuthorityEpoch, Issuer, NodeId, OperationId, Revision};
use dataplane_core::log::{Entry, OperationRecord, Reservation};
use dataplane_core::path::DataPath;

use crate::{Model, Obligation};

/// The durable fields, in the order [`first_difference`] compares them.
pub const FIELDS: [&str; 8] = [
    "epoch",
    "next_revision",
    "entries",
    "operations",
    "reservations",
    "obligations",
    "node_floors",
    "issuer_rows",
];

/// One side of the comparison: every durable field, in a canonical order (by key; obligations
/// in persisted order).
pub trait Durable {
    /// The last adopted epoch.
    fn epoch(&self) -> AuthorityEpoch;
    /// The next revision to allocate.
    fn next_revision(&self) -> Revision;
    /// Every entry, by path.
    fn entries(&self) -> impl Iterator<Item = (&DataPath, &Entry)>;
    /// Every operation record, by id.
    fn operations(&self) -> impl Iterator<Item = (&OperationId, &OperationRecord)>;
    /// Every reservation, by path.
    fn reservations(&self) -> impl Iterator<Item = (&DataPath, &Reservation)>;
    /// Every obligation in persisted order, with its fenced path.
    fn obligations(&self) -> impl Iterator<Item = (Obligation, Option<&DataPath>)>;
    /// Every node floor, by node.
    fn node_floors(&self) -> impl Iterator<Item = (NodeId, u64)>;
    /// Every issuer row (issuer, horizon, records), by issuer.
    fn issuer_rows(&self) -> impl Iterator<Item = (Issuer, u64, usize)>;
}

impl Durable for DurableState {
    fn epoch(&self) -> AuthorityEpoch {
        DurableState::epoch(self)
    }
    fn next_revision(&self) -> Revision {
        DurableState::next_revision(self)
    }
    fn entries(&self) -> impl Iterator<Item = (&DataPath, &Entry)> {
        DurableState::entries(self)
    }
    fn operations(&self) -> impl Iterator<Item = (&OperationId, &OperationRecord)> {
        DurableState::operations(self)
    }
    fn reservations(&self) -> impl Iterator<Item = (&DataPath, &Reservation)> {
        DurableState::reservations(self)
    }
    fn obligations(&self) -> impl Iterator<Item = (Obligation, Option<&DataPath>)> {
        self.obligations_in_order().map(|(key, fence)| {
            let obligation = match key {
                ObligationKey::Retire(a) => Obligation::Retire(a),
                ObligationKey::Displace(a, inc) => Obligation::Displace(a, inc),
            };
            (obligation, fence)
        })
    }
    fn node_floors(&self) -> impl Iterator<Item = (NodeId, u64)> {
        DurableState::node_floors(self).map(|(n, f)| (*n, *f))
    }
    fn issuer_rows(&self) -> impl Iterator<Item = (Issuer, u64, usize)> {
        self.issuers()
            .map(|(i, row)| (*i, row.horizon, row.records))
    }
}

impl Durable for Model {
    fn epoch(&self) -> AuthorityEpoch {
        Model::epoch(self)
    }
    fn next_revision(&self) -> Revision {
        Model::next_revision(self)
    }
    fn entries(&self) -> impl Iterator<Item = (&DataPath, &Entry)> {
        Model::entries(self)
    }
    fn operations(&self) -> impl Iterator<Item = (&OperationId, &OperationRecord)> {
        Model::operations(self)
    }
    fn reservations(&self) -> impl Iterator<Item = (&DataPath, &Reservation)> {
        Model::reservations(self)
    }
    fn obligations(&self) -> impl Iterator<Item = (Obligation, Option<&DataPath>)> {
        Model::obligations(self)
    }
    fn node_floors(&self) -> impl Iterator<Item = (NodeId, u64)> {
        Model::node_floors(self).map(|(n, f)| (*n, *f))
    }
    fn issuer_rows(&self) -> impl Iterator<Item = (Issuer, u64, usize)> {
        Model::issuer_rows(self).into_iter()
    }
}

/// The first durable field on which two sides differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// Which field (one of [`FIELDS`]).
    pub field: &'static str,
    /// The first differing element on the directory's side (or the value, for a counter).
    pub directory: String,
    /// The same on the model's side.
    pub model: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "durable field `{}` differs: directory {}, model {}",
            self.field, self.directory, self.model
        )
    }
}

/// Compares two sequences in lockstep; the first position where they differ (an element, or
/// one side ending early) is the difference.
fn walk<T: PartialEq + fmt::Debug>(
    field: &'static str,
    mut directory: impl Iterator<Item = T>,
    mut model: impl Iterator<Item = T>,
) -> Result<(), Difference> {
    let mut index = 0usize;
    loop {
        match (directory.next(), model.next()) {
            (None, None) => return Ok(()),
            (d, m) if d == m => index += 1,
            (d, m) => {
                let show = |x: Option<T>| match x {
                    Some(x) => format!("#{index} {x:?}"),
                    None => format!("ends before #{index}"),
                };
                return Err(Difference {
                    field,
                    directory: show(d),
                    model: show(m),
                });
            }
        }
    }
}

fn value<T: PartialEq + fmt::Debug>(field: &'static str, d: T, m: T) -> Result<(), Difference> {
    if d == m {
        Ok(())
    } else {
        Err(Difference {
            field,
            directory: format!("{d:?}"),
            model: format!("{m:?}"),
        })
    }
}

/// Every durable field of `directory` against `model`, in [`FIELDS`] order; `None` if all
/// are equal.
pub fn first_difference(directory: &impl Durable, model: &impl Durable) -> Option<Difference> {
    let all = || -> Result<(), Difference> {
        value(FIELDS[0], directory.epoch(), model.epoch())?;
        value(FIELDS[1], directory.next_revision(), model.next_revision())?;
        walk(FIELDS[2], directory.entries(), model.entries())?;
        walk(FIELDS[3], directory.operations(), model.operations())?;
        walk(FIELDS[4], directory.reservations(), model.reservations())?;
        walk(FIELDS[5], directory.obligations(), model.obligations())?;
        walk(FIELDS[6], directory.node_floors(), model.node_floors())?;
        walk(FIELDS[7], directory.issuer_rows(), model.issuer_rows())
    };
    all().err()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use dataplane_core::ids::{Address, StreamIncarnation};
    use dataplane_core::log::{
        LogRecord, Outcome, Rejection, RejectionKind, RequestKey, SnapshotRecord,
    };
    use dataplane_core::wire::{FileRef, SourceRecovery};

    use super::*;

    fn path(s: &str) -> DataPath {
        DataPath::new(s).unwrap()
    }

    fn addr(node: u64, incarnation: u64, actor: u64) -> Address {
        Address::new(NodeId(node), incarnation, actor)
    }

    fn op(node: u128, incarnation: u128, sequence: u128) -> OperationId {
        OperationId((node << 96) | (incarnation << 64) | sequence)
    }

    fn issuer(node: u64, incarnation: u64) -> Issuer {
        Issuer {
            node: NodeId(node),
            incarnation,
            lane: 0,
        }
    }

    fn inc(epoch: u64, revision: u64) -> StreamIncarnation {
        StreamIncarnation {
            epoch: AuthorityEpoch(epoch),
            revision: Revision(revision),
        }
    }

    /// A compaction with at least one record of every kind, two obligations out of key order
    /// and a fenced displacement.
    fn base() -> Vec<SnapshotRecord> {
        vec![
            SnapshotRecord::Header {
                epoch: AuthorityEpoch(3),
                next_revision: Revision(10),
            },
            SnapshotRecord::Entry {
                path: path("/a"),
                entry: Entry::Blob {
                    length: 5,
                    revision: Revision(2),
                    recovery: SourceRecovery::Actor {
                        actor: addr(2, 1, 7),
                        node: NodeId(2),
                        owner: None,
                    },
                },
            },
            SnapshotRecord::Entry {
                path: path("/s"),
                entry: Entry::Stream {
                    revision: Revision(4),
                },
            },
            SnapshotRecord::Operation {
                operation: op(1, 1, 5),
                record: OperationRecord {
                    key: RequestKey::Unregister {
                        path: path("/b"),
                        expected_revision: Some(Revision(3)),
                    },
                    outcome: Outcome::Committed(Revision(6)),
                },
            },
            SnapshotRecord::Operation {
                operation: op(1, 1, 6),
                record: OperationRecord {
                    key: RequestKey::Rename {
                        source: path("/a"),
                        destination: path("/c"),
                        replace: true,
                    },
                    outcome: Outcome::Rejected(Rejection {
                        kind: RejectionKind::StreamActive,
                        path: path("/c"),
                    }),
                },
            },
            SnapshotRecord::Operation {
                operation: op(1, 1, 7),
                record: OperationRecord {
                    key: RequestKey::Reserve { path: path("/r") },
                    outcome: Outcome::Reserved,
                },
            },
            SnapshotRecord::Reservation {
                path: path("/r"),
                reservation: Reservation {
                    operation: op(1, 1, 7),
                    owner: addr(1, 1, 3),
                },
            },
            SnapshotRecord::NodeFloor {
                node: NodeId(4),
                incarnation: 2,
            },
            SnapshotRecord::Horizon {
                issuer: issuer(1, 1),
                below: 4,
            },
            SnapshotRecord::Retirement {
                source: addr(3, 1, 9),
            },
            SnapshotRecord::Displacement {
                endpoint: addr(2, 1, 1),
                incarnation: inc(2, 4),
                fence: Some(path("/s")),
            },
        ]
    }

    // Test scaffolding: core's `apply` builds the directory's side.
    #[allow(clippy::disallowed_methods)]
    fn state(records: &[SnapshotRecord]) -> DurableState {
        let mut state = DurableState::default();
        for record in records {
            state
                .apply(&LogRecord::Snapshot(record.clone()))
                .unwrap_or_else(|e| panic!("{record:?}: {e}"));
        }
        state
    }

    /// Every way of changing one field of `record` (or dropping it), and the field of the
    /// durable state that changes. The match has no wildcard: a new kind of snapshot record
    /// (a new durable field) does not compile until this test, and so the comparison, covers
    /// it.
    fn mutations(record: &SnapshotRecord) -> Vec<(Option<SnapshotRecord>, &'static str)> {
        use SnapshotRecord as S;
        let one = |r: SnapshotRecord, field| (Some(r), field);
        match record.clone() {
            S::Header {
                epoch,
                next_revision,
            } => vec![
                one(
                    S::Header {
                        epoch: AuthorityEpoch(epoch.0 + 1),
                        next_revision,
                    },
                    "epoch",
                ),
                one(
                    S::Header {
                        epoch,
                        next_revision: Revision(next_revision.0 + 1),
                    },
                    "next_revision",
                ),
            ],
            S::Entry { path: p, entry } => {
                let mut v = vec![
                    (None, "entries"),
                    one(
                        S::Entry {
                            path: path("/z"),
                            entry: entry.clone(),
                        },
                        "entries",
                    ),
                ];
                let changed: Vec<Entry> = match entry {
                    Entry::Blob {
                        length,
                        revision,
                        recovery,
                    } => vec![
                        Entry::Blob {
                            length: length + 1,
                            revision,
                            recovery: recovery.clone(),
                        },
                        Entry::Blob {
                            length,
                            revision: Revision(revision.0 + 1),
                            recovery,
                        },
                        Entry::Blob {
                            length,
                            revision,
                            recovery: SourceRecovery::File {
                                path: FileRef::new("/data/x").unwrap(),
                                source: Address::new(NodeId(9), u64::MAX, 1),
                            },
                        },
                        Entry::Stream { revision },
                    ],
                    Entry::Stream { revision } => vec![Entry::Stream {
                        revision: Revision(revision.0 + 1),
                    }],
                };
                for entry in changed {
                    v.push(one(
                        S::Entry {
                            path: p.clone(),
                            entry,
                        },
                        "entries",
                    ));
                }
                v
            }
            S::Operation { operation, record } => {
                let mut key = record.clone();
                key.key = RequestKey::BindStream { path: path("/a") };
                let mut outcome = record.clone();
                outcome.outcome = match &record.outcome {
                    Outcome::Committed(r) => Outcome::Committed(Revision(r.0 + 1)),
                    Outcome::Rejected(x) => Outcome::Rejected(Rejection {
                        kind: x.kind,
                        path: path("/other"),
                    }),
                    Outcome::Reserved => Outcome::Committed(Revision(1)),
                };
                vec![
                    (None, "operations"),
                    one(
                        S::Operation {
                            operation: OperationId(operation.0 + 100),
                            record,
                        },
                        "operations",
                    ),
                    one(
                        S::Operation {
                            operation,
                            record: key,
                        },
                        "operations",
                    ),
                    one(
                        S::Operation {
                            operation,
                            record: outcome,
                        },
                        "operations",
                    ),
                ]
            }
            S::Reservation {
                path: p,
                reservation,
            } => vec![
                (None, "reservations"),
                one(
                    S::Reservation {
                        path: path("/q"),
                        reservation: reservation.clone(),
                    },
                    "reservations",
                ),
                one(
                    S::Reservation {
                        path: p.clone(),
                        reservation: Reservation {
                            operation: OperationId(reservation.operation.0 + 1),
                            owner: reservation.owner,
                        },
                    },
                    "reservations",
                ),
                one(
                    S::Reservation {
                        path: p,
                        reservation: Reservation {
                            operation: reservation.operation,
                            owner: addr(9, 9, 9),
                        },
                    },
                    "reservations",
                ),
            ],
            S::Retirement { .. } => vec![
                (None, "obligations"),
                one(
                    S::Retirement {
                        source: addr(8, 1, 1),
                    },
                    "obligations",
                ),
            ],
            S::Displacement {
                endpoint,
                incarnation,
                fence,
            } => vec![
                (None, "obligations"),
                one(
                    S::Displacement {
                        endpoint: addr(8, 1, 2),
                        incarnation,
                        fence: fence.clone(),
                    },
                    "obligations",
                ),
                one(
                    S::Displacement {
                        endpoint,
                        incarnation: inc(incarnation.epoch.0, incarnation.revision.0 + 1),
                        fence: fence.clone(),
                    },
                    "obligations",
                ),
                one(
                    S::Displacement {
                        endpoint,
                        incarnation,
                        fence: match fence {
                            Some(_) => None,
                            None => Some(path("/s")),
                        },
                    },
                    "obligations",
                ),
            ],
            S::NodeFloor { node, incarnation } => vec![
                (None, "node_floors"),
                one(
                    S::NodeFloor {
                        node: NodeId(node.0 + 1),
                        incarnation,
                    },
                    "node_floors",
                ),
                one(
                    S::NodeFloor {
                        node,
                        incarnation: incarnation + 1,
                    },
                    "node_floors",
                ),
            ],
            S::Horizon { issuer: i, below } => vec![
                (None, "issuer_rows"),
                one(
                    S::Horizon {
                        issuer: Issuer {
                            lane: i.lane + 1,
                            ..i
                        },
                        below,
                    },
                    "issuer_rows",
                ),
                one(
                    S::Horizon {
                        issuer: i,
                        below: below + 1,
                    },
                    "issuer_rows",
                ),
            ],
        }
    }

    #[test]
    fn equal_states_show_no_difference() {
        let records = base();
        assert_eq!(first_difference(&state(&records), &state(&records)), None);
    }

    #[test]
    fn a_change_to_any_field_of_any_record_is_named() {
        let records = base();
        let original = state(&records);
        let mut named = BTreeSet::new();
        for (i, record) in records.iter().enumerate() {
            for (replacement, field) in mutations(record) {
                let mut changed = records.clone();
                match &replacement {
                    Some(r) => changed[i] = r.clone(),
                    None => {
                        changed.remove(i);
                    }
                }
                let other = state(&changed);
                assert!(other != original, "{replacement:?} changes nothing");
                let found = first_difference(&original, &other)
                    .unwrap_or_else(|| panic!("{record:?} -> {replacement:?} not detected"));
                assert_eq!(found.field, field, "{record:?} -> {replacement:?}: {found}");
                let back = first_difference(&other, &original).expect("symmetric");
                assert_eq!(back.field, field);
                named.insert(field);
            }
        }
        // An issuer's record count only moves with its records, so it is named after them
        // ("operations" comes first); every other field is named on its own.
        let expected: BTreeSet<&str> = FIELDS.into_iter().collect();
        assert_eq!(named, expected);
    }

    #[test]
    fn the_persisted_order_of_obligations_is_compared() {
        let records = base();
        let mut swapped = records.clone();
        let n = swapped.len();
        swapped.swap(n - 1, n - 2);
        let (a, b) = (state(&records), state(&swapped));
        let found = first_difference(&a, &b).expect("order differs");
        assert_eq!(found.field, "obligations");
        assert!(found.directory.contains("#0"), "{found}");
    }
}

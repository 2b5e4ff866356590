//! The directory node's membership: which node id and incarnation each host has, and how many
//! times the directory has booted — decided here and kept in the directory's own log
//! ([`LogRecord::Member`]), under the log's crash protocol.
//!
//! A host is known by the address it listens on. Its first hello assigns it the next node id
//! (incarnation 1); a hello with another boot nonce (the host process restarted) raises its
//! incarnation; a hello with the same nonce (a reconnect) changes nothing. Every change comes
//! back as a record the node must make durable *before* it announces the change (the
//! `Welcome`): a host never hears an identity a crash could make the directory forget, so node
//! ids are never handed out twice and an incarnation never goes back. The directory's boot
//! count rises the same way before the directory's address (which carries it) is used.
//!
//! The directory machine ignores these records; [`Membership::recover`] reads them back, and
//! [`Membership::snapshot_records`] restates the table for a compaction.

use std::collections::BTreeMap;
use std::fmt;

use crate::ids::NodeId;
use crate::limits::{LISTEN_BYTES_MAX, MEMBERS_MAX};
use crate::log::LogRecord;
pub use crate::log::MemberRecord;

/// A host's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub node: NodeId,
    /// Its incarnation.
    pub incarnation: u64,
    /// The boot nonce of the process that has this incarnation.
    pub boot_nonce: u64,
}

/// What a host hello changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// A host never seen before: a new node id, incarnation 1.
    New(Member),
    /// A known host whose process restarted: its incarnation rose.
    Restarted(Member),
    /// A known host reconnecting (same process): nothing changed.
    Reconnected(Member),
}

impl Admitted {
    /// The host's identity.
    pub fn member(&self) -> Member {
        match *self {
            Admitted::New(m) | Admitted::Restarted(m) | Admitted::Reconnected(m) => m,
        }
    }
}

/// Why a host hello was refused (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipError {
    /// [`MEMBERS_MAX`] hosts are known already.
    Full,
    /// The listen address is longer than [`LISTEN_BYTES_MAX`].
    ListenTooLong,
    /// Node ids or incarnations are exhausted.
    Exhausted,
}

impl fmt::Display for MembershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MembershipError::Full => write!(f, "the directory knows {MEMBERS_MAX} hosts already"),
            MembershipError::ListenTooLong => {
                write!(f, "a listen address longer than {LISTEN_BYTES_MAX} bytes")
            }
            MembershipError::Exhausted => f.write_str("node ids or incarnations are exhausted"),
        }
    }
}

impl std::error::Error for MembershipError {}

/// The membership table. See the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    boots: u64,
    /// The next node id to hand out (ids start at 1; 0 is the directory's node).
    next_node: u64,
    hosts: BTreeMap<String, Member>,
    /// Which listen address each node id belongs to.
    by_node: BTreeMap<NodeId, String>,
}

impl Membership {
    /// The membership the `Member` records among `records` describe (the others, directory
    /// and replica records alike, are skipped).
    /// Records that contradict the table (an incarnation going back, one node id for two
    /// listen addresses) are a damaged log: the first one is reported, and nothing is built.
    pub fn recover(records: &[LogRecord]) -> Result<Membership, String> {
        let mut membership = Membership {
            next_node: 1,
            ..Membership::default()
        };
        for record in records {
            if let LogRecord::Member(record) = record {
                membership.apply(record)?;
            }
        }
        Ok(membership)
    }

    /// Applies one committed record (what [`Membership::recover`] does for each): a record
    /// that contradicts the table is refused, and nothing changes.
    pub fn apply(&mut self, record: &MemberRecord) -> Result<(), String> {
        match record {
            MemberRecord::Booted { boots } => {
                if *boots < self.boots {
                    return Err(format!("boot {boots} recorded after boot {}", self.boots));
                }
                self.boots = *boots;
            }
            MemberRecord::Host {
                listen,
                node,
                incarnation,
                boot_nonce,
            } => {
                if node.0 == 0 || node.0 == u64::MAX {
                    return Err(format!("host {listen} recorded with node id {}", node.0));
                }
                if let Some(other) = self.by_node.get(node).filter(|l| *l != listen) {
                    return Err(format!(
                        "node {node} recorded for both {other} and {listen}"
                    ));
                }
                if let Some(known) = self.hosts.get(listen) {
                    if known.node != *node || known.incarnation > *incarnation {
                        return Err(format!(
                            "host {listen} recorded as {node} incarnation {incarnation} after \
                             {} incarnation {}",
                            known.node, known.incarnation
                        ));
                    }
                } else if self.hosts.len() >= MEMBERS_MAX {
                    return Err(format!("more than {MEMBERS_MAX} hosts recorded"));
                }
                self.hosts.insert(
                    listen.clone(),
                    Member {
                        node: *node,
                        incarnation: *incarnation,
                        boot_nonce: *boot_nonce,
                    },
                );
                self.by_node.insert(*node, listen.clone());
                self.next_node = self.next_node.max(node.0 + 1);
            }
        }
        Ok(())
    }

    /// The directory boots: the boot count rises. The record must be durable before the
    /// directory's address (which carries [`Membership::boots`]) is used.
    pub fn boot(&mut self) -> LogRecord {
        self.boot_after_loss(0)
    }

    /// [`Membership::boot`] after a repair that may have cut up to `lost` synced records (see
    /// `Recovered::lost_bound`): the count skips `lost` boots, so no boot the cut records
    /// told is counted again.
    pub fn boot_after_loss(&mut self, lost: u64) -> LogRecord {
        self.boots = self.boots.saturating_add(lost).saturating_add(1);
        LogRecord::Member(MemberRecord::Booted { boots: self.boots })
    }

    /// Whether nothing was ever recorded (no boot, no host).
    pub fn is_empty(&self) -> bool {
        self.boots == 0 && self.hosts.is_empty()
    }

    /// Boots so far.
    pub fn boots(&self) -> u64 {
        self.boots
    }

    /// A host listening on `listen`, started with `boot_nonce`, said hello. A change comes back
    /// with the record that must be durable before the host hears it; a refusal changes
    /// nothing.
    pub fn admit(
        &mut self,
        listen: &str,
        boot_nonce: u64,
    ) -> Result<(Admitted, Option<LogRecord>), MembershipError> {
        if listen.len() > LISTEN_BYTES_MAX {
            return Err(MembershipError::ListenTooLong);
        }
        let admitted = match self.hosts.get(listen) {
            Some(m) if m.boot_nonce == boot_nonce => return Ok((Admitted::Reconnected(*m), None)),
            Some(m) => Admitted::Restarted(Member {
                node: m.node,
                incarnation: m
                    .incarnation
                    .checked_add(1)
                    .ok_or(MembershipError::Exhausted)?,
                boot_nonce,
            }),
            None if self.hosts.len() >= MEMBERS_MAX => return Err(MembershipError::Full),
            None => {
                let node = self.next_node.max(1);
                if node == u64::MAX {
                    return Err(MembershipError::Exhausted);
                }
                self.next_node = node + 1;
                Admitted::New(Member {
                    node: NodeId(node),
                    incarnation: 1,
                    boot_nonce,
                })
            }
        };
        let m = admitted.member();
        self.hosts.insert(listen.to_owned(), m);
        self.by_node.insert(m.node, listen.to_owned());
        Ok((admitted, Some(Self::host_record(listen, &m))))
    }

    fn host_record(listen: &str, m: &Member) -> LogRecord {
        LogRecord::Member(MemberRecord::Host {
            listen: listen.to_owned(),
            node: m.node,
            incarnation: m.incarnation,
            boot_nonce: m.boot_nonce,
        })
    }

    /// How many hosts it knows (at most [`MEMBERS_MAX`]: past it every new host is refused).
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// The known hosts, by listen address.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, &Member)> {
        self.hosts.iter().map(|(l, m)| (l.as_str(), m))
    }

    /// Where host `node` listens, if it is a member (a node id keeps its listen address for
    /// good, unless lost records let it be handed out again: see [`Membership::recover`]).
    pub fn listen_of(&self, node: NodeId) -> Option<&str> {
        self.by_node.get(&node).map(String::as_str)
    }

    /// The records that restate the table (for a compaction).
    pub fn snapshot_records(&self) -> Vec<LogRecord> {
        let mut records = Vec::with_capacity(1 + self.hosts.len());
        records.push(LogRecord::Member(MemberRecord::Booted {
            boots: self.boots,
        }));
        records.extend(self.hosts.iter().map(|(l, m)| Self::host_record(l, m)));
        records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_reused_and_incarnations_only_rise_across_recoveries() {
        let mut log = Vec::new();
        let mut m = Membership::recover(&log).unwrap();
        log.push(m.boot());
        let (a, rec) = m.admit("a:1", 7).unwrap();
        assert_eq!(
            a,
            Admitted::New(Member {
                node: NodeId(1),
                incarnation: 1,
                boot_nonce: 7
            })
        );
        log.extend(rec);
        let (again, rec) = m.admit("a:1", 7).unwrap();
        assert!(matches!(again, Admitted::Reconnected(_)) && rec.is_none());
        let (b, rec) = m.admit("b:1", 1).unwrap();
        assert_eq!(b.member().node, NodeId(2));
        log.extend(rec);
        let (a2, rec) = m.admit("a:1", 8).unwrap();
        assert_eq!(
            a2,
            Admitted::Restarted(Member {
                node: NodeId(1),
                incarnation: 2,
                boot_nonce: 8
            })
        );
        log.extend(rec);
        // Recovery sees the same table, and goes on from it.
        let mut r = Membership::recover(&log).unwrap();
        assert_eq!(r, m);
        log.push(r.boot());
        assert_eq!(r.boots(), 2);
        let (c, _) = r.admit("c:1", 1).unwrap();
        assert_eq!(c.member().node, NodeId(3));
        // A compaction's restatement recovers to the same table.
        let snapshot = r.snapshot_records();
        assert_eq!(Membership::recover(&snapshot).unwrap(), r);
    }

    #[test]
    fn a_boot_after_a_loss_skips_every_boot_the_lost_records_could_count() {
        let mut log = Vec::new();
        let mut m = Membership::recover(&log).unwrap();
        log.push(m.boot());
        log.push(m.boot());
        assert_eq!(m.boots(), 2);
        // Up to 5 records after these were cut: at most boots 3 to 7 were counted there.
        let mut r = Membership::recover(&log).unwrap();
        log.push(r.boot_after_loss(5));
        assert_eq!(r.boots(), 8);
        // The skip is durable: recovery and the next boot go on from it.
        let mut again = Membership::recover(&log).unwrap();
        assert_eq!(again, r);
        again.boot();
        assert_eq!(again.boots(), 9);
        // Without a loss it is the plain boot.
        let mut plain = Membership::recover(&log[..2]).unwrap();
        let mut other = plain.clone();
        assert_eq!(plain.boot_after_loss(0), other.boot());
        assert_eq!(plain.boots(), 3);
    }

    #[test]
    fn a_record_not_made_durable_is_forgotten_and_its_id_not_reused_by_the_next_one() {
        // The contract: the caller makes the record durable before announcing. If it crashed
        // before, nobody heard the id, and handing it out again is harmless.
        let mut m = Membership::recover(&[]).unwrap();
        let boot = m.boot();
        let (a, _lost) = m.admit("a:1", 1).unwrap();
        let mut r = Membership::recover(&[boot]).unwrap();
        let (b, _) = r.admit("b:1", 1).unwrap();
        assert_eq!(a.member().node, b.member().node);
    }

    #[test]
    fn refusals_change_nothing() {
        let mut m = Membership::recover(&[]).unwrap();
        let long = "x".repeat(LISTEN_BYTES_MAX + 1);
        assert_eq!(m.admit(&long, 1), Err(MembershipError::ListenTooLong));
        // The bound itself is allowed.
        let longest = "y".repeat(LISTEN_BYTES_MAX);
        assert!(matches!(
            m.admit(&longest, 1),
            Ok((Admitted::New(_), Some(_)))
        ));
        for i in 0..MEMBERS_MAX - 1 {
            m.admit(&format!("h{i}"), 1).unwrap();
        }
        let before = m.clone();
        assert_eq!(m.admit("one-more", 1), Err(MembershipError::Full));
        assert_eq!(m, before);
        // A known host still gets in.
        assert!(matches!(
            m.admit("h0", 2),
            Ok((Admitted::Restarted(_), Some(_)))
        ));
    }

    #[test]
    fn empty_only_before_the_first_boot_or_host() {
        let fresh = Membership::recover(&[]).unwrap();
        assert!(fresh.is_empty());
        let mut booted = fresh.clone();
        booted.boot();
        assert!(!booted.is_empty());
        let mut hosted = fresh;
        hosted.admit("a:1", 1).unwrap();
        assert!(!hosted.is_empty());
        assert_eq!(hosted.hosts().count(), 1);
    }

    #[test]
    fn contradictions_in_the_log_are_reported() {
        let host = |listen: &str, node, incarnation| {
            LogRecord::Member(MemberRecord::Host {
                listen: listen.to_owned(),
                node: NodeId(node),
                incarnation,
                boot_nonce: 0,
            })
        };
        assert!(Membership::recover(&[host("a", 1, 2), host("a", 1, 1)]).is_err());
        assert!(Membership::recover(&[host("a", 1, 1), host("b", 1, 1)]).is_err());
        assert!(Membership::recover(&[host("a", 0, 1)]).is_err());
        let booted = |boots| LogRecord::Member(MemberRecord::Booted { boots });
        assert!(Membership::recover(&[booted(3), booted(2)]).is_err());
        assert!(Membership::recover(&[booted(2), host("a", 5, 1), booted(3)]).is_ok());
    }

    #[test]
    fn replica_records_are_skipped_like_directory_records() {
        use crate::log::ReplicaRecord;
        let booted = LogRecord::Member(MemberRecord::Booted { boots: 2 });
        let replica = LogRecord::Replica(ReplicaRecord::HardState {
            term: 9,
            vote: 1,
            commit: 0,
        });
        let recovered = Membership::recover(&[booted.clone(), replica]).unwrap();
        assert_eq!(recovered, Membership::recover(&[booted]).unwrap());
        assert_eq!(recovered.boots, 2);
    }
}

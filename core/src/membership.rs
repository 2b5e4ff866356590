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
//! The table has a limit ([`MEMBERS_MAX`], or a smaller capacity a node sets) and an owner who
//! frees it: when it is full, a new host's hello makes room by *forgetting* one member the
//! caller says may go ([`Membership::admit_forgetting`]: the directory node forgets only a host
//! that has been away for long and that nothing in the namespace names). The `Forgot` record
//! goes with the new host's record, durable before the welcome; the forgotten id is never handed
//! out again (a compaction restates the next id with `NodesIssued`), and the forgotten host, if
//! it ever comes back, is welcomed under a new id (its old process stops on that welcome; a new
//! one is a new member).
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

/// A member forgotten to make room for a new host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forgotten {
    /// Where it listened.
    pub listen: String,
    /// Its identity when it was forgotten.
    pub member: Member,
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
    /// The table is at its capacity (at most [`MEMBERS_MAX`]) and no member may be forgotten.
    Full,
    /// The listen address is longer than [`LISTEN_BYTES_MAX`].
    ListenTooLong,
    /// Node ids or incarnations are exhausted.
    Exhausted,
}

impl fmt::Display for MembershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MembershipError::Full => write!(
                f,
                "{FULL_REFUSAL}, and no member may be forgotten to make room (each is connected, \
                 not away for long enough, or has something in the namespace on it)"
            ),
            MembershipError::ListenTooLong => {
                write!(f, "a listen address longer than {LISTEN_BYTES_MAX} bytes")
            }
            MembershipError::Exhausted => f.write_str("node ids or incarnations are exhausted"),
        }
    }
}

impl std::error::Error for MembershipError {}

/// How the reason of a [`MembershipError::Full`] refusal begins, as a host reads it: a full
/// membership is a passing state (a member may be forgotten later), so the host tries again
/// rather than stop.
pub const FULL_REFUSAL: &str = "the directory's membership is full";

/// Whether a hello's refusal `reason` is a full membership's ([`FULL_REFUSAL`]).
pub fn is_full_refusal(reason: &str) -> bool {
    reason.starts_with(FULL_REFUSAL)
}

/// The membership table. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    boots: u64,
    /// The next node id to hand out (ids start at 1; 0 is the directory's node).
    next_node: u64,
    hosts: BTreeMap<String, Member>,
    /// Which listen address each node id belongs to.
    by_node: BTreeMap<NodeId, String>,
    /// Most members before a new host needs room (at most [`MEMBERS_MAX`]; a node's setting,
    /// not recorded).
    capacity: usize,
}

impl Default for Membership {
    fn default() -> Membership {
        Membership {
            boots: 0,
            next_node: 0,
            hosts: BTreeMap::new(),
            by_node: BTreeMap::new(),
            capacity: MEMBERS_MAX,
        }
    }
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
            MemberRecord::Forgot { listen, node } => {
                match self.hosts.get(listen) {
                    Some(known) if known.node == *node => {}
                    _ => {
                        return Err(format!(
                            "host {listen} recorded as forgotten as {node}, which it was not"
                        ));
                    }
                }
                // Its Host record raised the next id past it already.
                self.hosts.remove(listen);
                self.by_node.remove(node);
            }
            MemberRecord::NodesIssued { next } => {
                if next.0 == 0 || next.0 < self.next_node {
                    return Err(format!(
                        "node ids below {next} recorded as issued after ids below {}",
                        self.next_node
                    ));
                }
                self.next_node = next.0;
            }
        }
        Ok(())
    }

    /// Sets the most members before a new host needs room (clamped to 1..=[`MEMBERS_MAX`]).
    /// A table recovered with more members keeps them (each new host then makes room for
    /// itself: the table does not grow).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.clamp(1, MEMBERS_MAX);
    }

    /// The most members before a new host needs room.
    pub fn capacity(&self) -> usize {
        self.capacity
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
    /// nothing. A full table refuses a new host ([`Membership::admit_forgetting`] makes room).
    pub fn admit(
        &mut self,
        listen: &str,
        boot_nonce: u64,
    ) -> Result<(Admitted, Option<LogRecord>), MembershipError> {
        let (admitted, mut records, _) = self.admit_forgetting(listen, boot_nonce, |_| false)?;
        Ok((admitted, records.pop()))
    }

    /// [`Membership::admit`], but a new host that finds the table full makes room: the member
    /// with the lowest node id (the longest known) for which `may_forget` says yes is forgotten.
    /// `may_forget` is asked only then, once per member at most, in node id order. The records
    /// (the `Forgot`, if any, then the new host's) must be durable together before the host
    /// hears its welcome.
    pub fn admit_forgetting(
        &mut self,
        listen: &str,
        boot_nonce: u64,
        mut may_forget: impl FnMut(NodeId) -> bool,
    ) -> Result<(Admitted, Vec<LogRecord>, Option<Forgotten>), MembershipError> {
        if listen.len() > LISTEN_BYTES_MAX {
            return Err(MembershipError::ListenTooLong);
        }
        let mut forgotten = None;
        let admitted = match self.hosts.get(listen) {
            Some(m) if m.boot_nonce == boot_nonce => {
                return Ok((Admitted::Reconnected(*m), Vec::new(), None));
            }
            Some(m) => Admitted::Restarted(Member {
                node: m.node,
                incarnation: m
                    .incarnation
                    .checked_add(1)
                    .ok_or(MembershipError::Exhausted)?,
                boot_nonce,
            }),
            None => {
                let node = self.next_node.max(1);
                if node == u64::MAX {
                    return Err(MembershipError::Exhausted);
                }
                if self.hosts.len() >= self.capacity {
                    let victim = self
                        .by_node
                        .keys()
                        .copied()
                        .find(|n| may_forget(*n))
                        .ok_or(MembershipError::Full)?;
                    let listen = self.by_node.remove(&victim).unwrap_or_default();
                    let member = self.hosts.remove(&listen).ok_or(MembershipError::Full)?;
                    forgotten = Some(Forgotten { listen, member });
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
        let mut records = Vec::with_capacity(2);
        if let Some(f) = &forgotten {
            records.push(LogRecord::Member(MemberRecord::Forgot {
                listen: f.listen.clone(),
                node: f.member.node,
            }));
        }
        records.push(Self::host_record(listen, &m));
        Ok((admitted, records, forgotten))
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

    /// The records that restate the table (for a compaction): with the next node id when the
    /// members do not imply it (the highest ids were forgotten).
    pub fn snapshot_records(&self) -> Vec<LogRecord> {
        let mut records = Vec::with_capacity(2 + self.hosts.len());
        records.push(LogRecord::Member(MemberRecord::Booted {
            boots: self.boots,
        }));
        records.extend(self.hosts.iter().map(|(l, m)| Self::host_record(l, m)));
        let implied = self.by_node.keys().next_back().map_or(1, |n| n.0 + 1);
        if self.next_node > implied {
            records.push(LogRecord::Member(MemberRecord::NodesIssued {
                next: NodeId(self.next_node),
            }));
        }
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
    fn a_full_table_forgets_the_longest_known_member_it_may_and_never_hands_its_id_out_again() {
        let mut log = Vec::new();
        let mut m = Membership::recover(&log).unwrap();
        m.set_capacity(2);
        log.push(m.boot());
        for listen in ["a:1", "b:1"] {
            let (_, records, forgot) = m.admit_forgetting(listen, 1, |_| panic!("room")).unwrap();
            assert_eq!(forgot, None);
            log.extend(records);
        }
        // Full: a known host still gets in without anyone asked about.
        let (again, records, _) = m.admit_forgetting("a:1", 2, |_| panic!("known")).unwrap();
        assert!(matches!(again, Admitted::Restarted(_)));
        log.extend(records);
        // A new one: nobody may go, so it is refused and nothing changes.
        let before = m.clone();
        let mut asked = Vec::new();
        let refused = m.admit_forgetting("c:1", 1, |n| {
            asked.push(n);
            false
        });
        assert_eq!(refused, Err(MembershipError::Full));
        assert_eq!(
            asked,
            vec![NodeId(1), NodeId(2)],
            "each member once, in id order"
        );
        assert_eq!(m, before);
        // Node 2 may go: it is forgotten, and the new host is node 3.
        let (c, records, forgot) = m.admit_forgetting("c:1", 1, |n| n == NodeId(2)).unwrap();
        assert_eq!(c.member().node, NodeId(3));
        assert_eq!(
            forgot,
            Some(Forgotten {
                listen: "b:1".to_owned(),
                member: Member {
                    node: NodeId(2),
                    incarnation: 1,
                    boot_nonce: 1
                }
            })
        );
        assert_eq!(
            records,
            vec![
                LogRecord::Member(MemberRecord::Forgot {
                    listen: "b:1".to_owned(),
                    node: NodeId(2)
                }),
                Membership::host_record("c:1", &c.member()),
            ]
        );
        log.extend(records);
        assert_eq!(m.listen_of(NodeId(2)), None);
        assert_eq!(m.len(), 2);
        // The forgotten host comes back: a new member, under a new id (making room again).
        let (b, records, forgot) = m.admit_forgetting("b:1", 1, |n| n == NodeId(1)).unwrap();
        assert_eq!(
            b,
            Admitted::New(Member {
                node: NodeId(4),
                incarnation: 1,
                boot_nonce: 1
            })
        );
        assert_eq!(forgot.map(|f| f.member.node), Some(NodeId(1)));
        log.extend(records);
        // Recovery reads the same table, capacity aside (a node's setting).
        let mut r = Membership::recover(&log).unwrap();
        assert_eq!(r.capacity(), MEMBERS_MAX);
        r.set_capacity(2);
        assert_eq!(r, m);
        // A crash between the two records of a room-making hello (a torn batch): the forgotten
        // id stays handed out, through recovery and a compaction's restatement.
        let mut torn = log.clone();
        torn.push(LogRecord::Member(MemberRecord::Forgot {
            listen: "b:1".to_owned(),
            node: NodeId(4),
        }));
        let r = Membership::recover(&torn).unwrap();
        let snapshot = r.snapshot_records();
        assert_eq!(
            snapshot.last(),
            Some(&LogRecord::Member(MemberRecord::NodesIssued {
                next: NodeId(5)
            }))
        );
        let mut compacted = Membership::recover(&snapshot).unwrap();
        assert_eq!(compacted, r);
        let (d, _) = compacted.admit("d:1", 1).unwrap();
        assert_eq!(d.member().node, NodeId(5));
        // Without forgotten ids past the members, the restatement is what it always was.
        assert!(
            !m.snapshot_records()
                .iter()
                .any(|r| matches!(r, LogRecord::Member(MemberRecord::NodesIssued { .. })))
        );
    }

    #[test]
    fn a_table_recovered_above_its_capacity_does_not_grow() {
        let mut m = Membership::recover(&[]).unwrap();
        for listen in ["a:1", "b:1", "c:1"] {
            m.admit(listen, 1).unwrap();
        }
        m.set_capacity(1);
        assert_eq!(m.admit("d:1", 1), Err(MembershipError::Full));
        let (_, _, forgot) = m.admit_forgetting("d:1", 1, |_| true).unwrap();
        assert_eq!(forgot.map(|f| f.member.node), Some(NodeId(1)));
        assert_eq!(m.len(), 3);
        m.set_capacity(0);
        assert_eq!(m.capacity(), 1);
        m.set_capacity(usize::MAX);
        assert_eq!(m.capacity(), MEMBERS_MAX);
    }

    #[test]
    fn only_a_full_membership_reads_as_a_full_refusal() {
        assert!(is_full_refusal(&MembershipError::Full.to_string()));
        for other in [MembershipError::ListenTooLong, MembershipError::Exhausted] {
            assert!(!is_full_refusal(&other.to_string()));
        }
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
        // The same incarnation again (a restatement) is no contradiction.
        assert!(Membership::recover(&[host("a", 1, 1), host("a", 1, 1)]).is_ok());
        let booted = |boots| LogRecord::Member(MemberRecord::Booted { boots });
        assert!(Membership::recover(&[booted(3), booted(2)]).is_err());
        // The same count again (a restatement) is no contradiction.
        assert!(Membership::recover(&[booted(3), booted(3)]).is_ok());
        assert!(Membership::recover(&[booted(2), host("a", 5, 1), booted(3)]).is_ok());
        let forgot = |listen: &str, node| {
            LogRecord::Member(MemberRecord::Forgot {
                listen: listen.to_owned(),
                node: NodeId(node),
            })
        };
        assert!(Membership::recover(&[forgot("a", 1)]).is_err());
        assert!(Membership::recover(&[host("a", 1, 1), forgot("a", 2)]).is_err());
        assert!(Membership::recover(&[host("a", 1, 1), forgot("b", 1)]).is_err());
        assert!(Membership::recover(&[host("a", 1, 1), forgot("a", 1)]).is_ok());
        let issued = |next| LogRecord::Member(MemberRecord::NodesIssued { next: NodeId(next) });
        assert!(Membership::recover(&[host("a", 5, 1), issued(5)]).is_err());
        assert!(Membership::recover(&[issued(0)]).is_err());
        assert!(Membership::recover(&[host("a", 5, 1), issued(6), issued(9)]).is_ok());
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

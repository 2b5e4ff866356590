//! Routability (SPEC §4.8): whether the directory can reach a watched address, decided from
//! the state of the directory's connections, the same way in `dataplane-node` and in the
//! simulator.
//!
//! An address is routable while a connection speaks for its node *and that connection's
//! incarnation is the address's* (an address of an earlier incarnation is never routable again;
//! a persistent actor's, a file blob's source, is routable in every incarnation)
//! and its route has not been lost on its own (a registrar's flap). The directory machine asks
//! to watch targets (`Effect::WatchRoute`); the driver tells [`Routes`] what happens to its
//! connections, and hands the machine every change [`Routes::changes`] yields
//! (`Directory::handle_route`): the first observation of each new watch, then each flip.
//!
//! Only the nodes and addresses touched since the last call are looked at, so a connection
//! event costs the watches on its node, not all of them.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{Address, NodeId, PERSISTENT_INCARNATION};

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Routes {
    /// The incarnation each connected node's connection speaks for.
    connected: BTreeMap<NodeId, u64>,
    /// Addresses whose route is lost although their node is connected.
    lost: BTreeSet<Address>,
    /// Watched targets, with the routability last reported (`None`: not reported yet).
    watched: BTreeMap<Address, Option<bool>>,
    /// Nodes whose connection changed since the last [`Routes::changes`].
    dirty_nodes: BTreeSet<NodeId>,
    /// Addresses watched, lost or restored since the last [`Routes::changes`].
    dirty: BTreeSet<Address>,
}

impl Routes {
    /// No connections, no watches.
    pub fn new() -> Routes {
        Routes::default()
    }

    /// The machine watches `target` (`Effect::WatchRoute`): its routability is reported at the
    /// next [`Routes::changes`], whatever it is.
    pub fn watch(&mut self, target: Address) {
        self.watched.insert(target, None);
        self.dirty.insert(target);
    }

    /// The machine no longer watches `target` (`Effect::UnwatchRoute`).
    pub fn unwatch(&mut self, target: Address) {
        self.watched.remove(&target);
    }

    /// A connection now speaks for `incarnation` of `node` (it replaces any earlier one).
    pub fn connected(&mut self, node: NodeId, incarnation: u64) {
        if self.connected.insert(node, incarnation) != Some(incarnation) {
            self.dirty_nodes.insert(node);
        }
    }

    /// No connection speaks for `node` any more.
    pub fn disconnected(&mut self, node: NodeId) {
        if self.connected.remove(&node).is_some() {
            self.dirty_nodes.insert(node);
        }
    }

    /// `target`'s route is lost (`true`) or back (`false`) while its node stays connected.
    pub fn set_lost(&mut self, target: Address, lost: bool) {
        let changed = if lost {
            self.lost.insert(target)
        } else {
            self.lost.remove(&target)
        };
        if changed {
            self.dirty.insert(target);
        }
    }

    /// Whether `target` is routable now. A persistent actor (a file blob's source) is
    /// routable while any incarnation of its node is connected: every life serves it.
    pub fn routable(&self, target: &Address) -> bool {
        self.connected.get(&target.node).is_some_and(|incarnation| {
            *incarnation == target.incarnation || target.incarnation == PERSISTENT_INCARNATION
        }) && !self.lost.contains(target)
    }

    /// The routability last reported for `target` (`None` if it is not watched or was not
    /// reported yet).
    pub fn reported(&self, target: &Address) -> Option<bool> {
        self.watched.get(target).copied().flatten()
    }

    /// Whether `target` is watched.
    pub fn is_watched(&self, target: &Address) -> bool {
        self.watched.contains_key(target)
    }

    /// The watched targets, in address order.
    pub fn watched(&self) -> impl Iterator<Item = &Address> {
        self.watched.keys()
    }

    /// How many targets are watched.
    pub fn watched_count(&self) -> usize {
        self.watched.len()
    }

    /// Appends to `out`, in address order, every watched target whose routability differs from
    /// what was last reported (every new watch included), and records it as reported.
    pub fn changes(&mut self, out: &mut Vec<(Address, bool)>) {
        let mut touched = std::mem::take(&mut self.dirty);
        for node in std::mem::take(&mut self.dirty_nodes) {
            let first = Address::new(node, 0, 0);
            let last = Address::new(node, u64::MAX, u64::MAX);
            touched.extend(self.watched.range(first..=last).map(|(a, _)| *a));
        }
        for target in touched {
            let now = self.routable(&target);
            if let Some(last) = self.watched.get_mut(&target)
                && *last != Some(now)
            {
                *last = Some(now);
                out.push((target, now));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(node: u64, incarnation: u64, actor: u64) -> Address {
        Address::new(NodeId(node), incarnation, actor)
    }

    fn changes(routes: &mut Routes) -> Vec<(Address, bool)> {
        let mut out = Vec::new();
        routes.changes(&mut out);
        out
    }

    #[test]
    fn a_new_watch_is_reported_once_then_only_flips() {
        let mut routes = Routes::new();
        routes.connected(NodeId(1), 2);
        routes.watch(a(1, 2, 7));
        routes.watch(a(2, 1, 7));
        assert_eq!(
            changes(&mut routes),
            vec![(a(1, 2, 7), true), (a(2, 1, 7), false)]
        );
        assert!(changes(&mut routes).is_empty());
        // Re-connecting the same incarnation changes nothing.
        routes.connected(NodeId(1), 2);
        assert!(changes(&mut routes).is_empty());
        routes.disconnected(NodeId(1));
        routes.connected(NodeId(2), 1);
        assert_eq!(
            changes(&mut routes),
            vec![(a(1, 2, 7), false), (a(2, 1, 7), true)]
        );
    }

    #[test]
    fn an_earlier_incarnation_is_never_routable_again() {
        let mut routes = Routes::new();
        routes.connected(NodeId(1), 1);
        routes.watch(a(1, 1, 7));
        assert_eq!(changes(&mut routes), vec![(a(1, 1, 7), true)]);
        routes.connected(NodeId(1), 2);
        assert_eq!(changes(&mut routes), vec![(a(1, 1, 7), false)]);
        assert!(!routes.routable(&a(1, 1, 7)));
        assert!(routes.routable(&a(1, 2, 7)));
    }

    #[test]
    fn a_lost_route_flips_one_address_only() {
        let mut routes = Routes::new();
        routes.connected(NodeId(1), 1);
        routes.watch(a(1, 1, 7));
        routes.watch(a(1, 1, 8));
        changes(&mut routes);
        routes.set_lost(a(1, 1, 7), true);
        assert_eq!(changes(&mut routes), vec![(a(1, 1, 7), false)]);
        routes.set_lost(a(1, 1, 7), false);
        assert_eq!(changes(&mut routes), vec![(a(1, 1, 7), true)]);
    }

    #[test]
    fn unwatched_targets_are_not_reported() {
        let mut routes = Routes::new();
        routes.watch(a(1, 1, 7));
        routes.unwatch(a(1, 1, 7));
        routes.connected(NodeId(1), 1);
        assert!(changes(&mut routes).is_empty());
        assert_eq!(routes.watched_count(), 0);
    }
}

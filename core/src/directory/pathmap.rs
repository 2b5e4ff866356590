//! A map from data paths, ordered by a fixed 64-bit hash of the path (then by the path).
//!
//! The namespace maps hold up to millions of paths. In a `BTreeMap<DataPath, _>` every step of
//! a descent compares heap-allocated strings, which at that size is a cache miss per compare.
//! Here the tree is keyed by an inline `u64` (FNV-1a of the path bytes), and the rare paths that
//! share a hash live in one small bucket kept sorted by path. Iteration order is therefore
//! (hash, path): deterministic and independent of insertion order, but not lexicographic.

use std::collections::BTreeMap;

use crate::path::DataPath;

/// Unit tests squeeze the hash into 16 values so that buckets with many paths are exercised.
#[cfg(not(test))]
const HASH_MASK: u64 = u64::MAX;
#[cfg(test)]
const HASH_MASK: u64 = 0xf;

/// FNV-1a over the path's bytes: fixed across runs, builds and machines.
fn path_hash(path: &DataPath) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in path.as_str().as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash & HASH_MASK
}

/// The paths that share one hash: almost always exactly one, stored inline.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Bucket<V> {
    One(DataPath, V),
    /// Two or more, sorted by path.
    Many(Vec<(DataPath, V)>),
}

/// A deterministic map keyed by [`DataPath`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathMap<V> {
    buckets: BTreeMap<u64, Bucket<V>>,
    len: usize,
}

impl<V> Default for PathMap<V> {
    fn default() -> Self {
        PathMap {
            buckets: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<V> PathMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        PathMap::default()
    }

    /// The value at `path`.
    pub fn get(&self, path: &DataPath) -> Option<&V> {
        match self.buckets.get(&path_hash(path))? {
            Bucket::One(p, v) => (p == path).then_some(v),
            Bucket::Many(all) => all.iter().find(|(p, _)| p == path).map(|(_, v)| v),
        }
    }

    /// The value at `path`, mutably.
    pub fn get_mut(&mut self, path: &DataPath) -> Option<&mut V> {
        match self.buckets.get_mut(&path_hash(path))? {
            Bucket::One(p, v) => (p == path).then_some(v),
            Bucket::Many(all) => all.iter_mut().find(|(p, _)| p == path).map(|(_, v)| v),
        }
    }

    /// Whether `path` is present.
    pub fn contains_key(&self, path: &DataPath) -> bool {
        self.get(path).is_some()
    }

    /// Inserts, returning the previous value.
    pub fn insert(&mut self, path: DataPath, value: V) -> Option<V> {
        use std::collections::btree_map::Entry as Slot;
        match self.buckets.entry(path_hash(&path)) {
            Slot::Vacant(slot) => {
                slot.insert(Bucket::One(path, value));
                self.len += 1;
                None
            }
            Slot::Occupied(mut slot) => {
                let bucket = slot.get_mut();
                if let Bucket::One(p, v) = bucket {
                    if *p == path {
                        return Some(std::mem::replace(v, value));
                    }
                }
                let mut all = match std::mem::replace(bucket, Bucket::Many(Vec::new())) {
                    Bucket::One(p, v) => vec![(p, v)],
                    Bucket::Many(all) => all,
                };
                let previous = match all.binary_search_by(|(p, _)| p.cmp(&path)) {
                    Ok(i) => Some(std::mem::replace(&mut all[i].1, value)),
                    Err(i) => {
                        all.insert(i, (path, value));
                        self.len += 1;
                        None
                    }
                };
                *bucket = Bucket::Many(all);
                previous
            }
        }
    }

    /// Removes, returning the value.
    pub fn remove(&mut self, path: &DataPath) -> Option<V> {
        use std::collections::btree_map::Entry as Slot;
        let Slot::Occupied(mut slot) = self.buckets.entry(path_hash(path)) else {
            return None;
        };
        let value = match slot.get_mut() {
            Bucket::One(p, _) if p == path => match slot.remove() {
                Bucket::One(_, v) => v,
                Bucket::Many(_) => unreachable!("matched One above"),
            },
            Bucket::One(..) => return None,
            Bucket::Many(all) => {
                let i = all.iter().position(|(p, _)| p == path)?;
                let (_, v) = all.remove(i);
                if all.len() == 1 {
                    let (p, last) = all.pop().expect("one left");
                    *slot.get_mut() = Bucket::One(p, last);
                }
                v
            }
        };
        self.len -= 1;
        Some(value)
    }

    /// How many paths are present.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every (path, value), in (hash, path) order.
    pub fn iter(&self) -> impl Iterator<Item = (&DataPath, &V)> {
        self.buckets.values().flat_map(|bucket| {
            let (one, many) = match bucket {
                Bucket::One(p, v) => (Some((p, v)), &[][..]),
                Bucket::Many(all) => (None, all.as_slice()),
            };
            one.into_iter().chain(many.iter().map(|(p, v)| (p, v)))
        })
    }

    /// Every path, in (hash, path) order.
    pub fn keys(&self) -> impl Iterator<Item = &DataPath> {
        self.iter().map(|(p, _)| p)
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.buckets.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> DataPath {
        DataPath::new(s).unwrap()
    }

    #[test]
    fn behaves_like_a_map() {
        let mut m = PathMap::new();
        assert_eq!(m.insert(p("/a"), 1), None);
        assert_eq!(m.insert(p("/b"), 2), None);
        assert_eq!(m.insert(p("/a"), 3), Some(1));
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(&p("/a")), Some(&3));
        *m.get_mut(&p("/b")).unwrap() += 1;
        assert_eq!(m.remove(&p("/b")), Some(3));
        assert_eq!(m.remove(&p("/b")), None);
        assert!(!m.contains_key(&p("/b")));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn iteration_order_does_not_depend_on_insertion_order() {
        let paths: Vec<DataPath> = (0..500).map(|i| p(&format!("/x/{i}"))).collect();
        let mut forward = PathMap::new();
        let mut backward = PathMap::new();
        for (i, path) in paths.iter().enumerate() {
            forward.insert(path.clone(), i);
        }
        for (i, path) in paths.iter().enumerate().rev() {
            backward.insert(path.clone(), i);
        }
        assert_eq!(forward, backward);
        assert!(forward.iter().eq(backward.iter()));
        assert_eq!(forward.len(), 500);
    }

    #[test]
    fn colliding_paths_share_a_sorted_bucket() {
        // With the test mask, 200 paths share 16 hash values.
        let paths: Vec<DataPath> = (0..200).map(|i| p(&format!("/c/{i}"))).collect();
        let mut m = PathMap::new();
        for (i, path) in paths.iter().enumerate() {
            assert_eq!(m.insert(path.clone(), i), None);
        }
        assert!(
            m.buckets
                .values()
                .any(|b| matches!(b, Bucket::Many(all) if all.len() > 2))
        );
        for (i, path) in paths.iter().enumerate() {
            assert_eq!(m.get(path), Some(&i));
        }
        let order: Vec<(u64, &DataPath)> = m.keys().map(|k| (path_hash(k), k)).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "iteration is in (hash, path) order"
        );
        for (i, path) in paths.iter().enumerate().step_by(2) {
            assert_eq!(m.remove(path), Some(i));
        }
        assert_eq!(m.len(), 100);
        for (i, path) in paths.iter().enumerate() {
            assert_eq!(m.get(path), (i % 2 == 1).then_some(&i));
        }
        for path in paths.iter().skip(1).step_by(2) {
            m.remove(path);
        }
        assert!(m.is_empty() && m.buckets.is_empty());
    }
}

//! An ordered set that also answers "how many keys are ahead of this one".
//!
//! Every host run queue is one of these, keyed by (vruntime, task id). CFS only ever needs the
//! leftmost key, but SBCO (Self-boosted co-scheduling, §III-A of the SBCO paper) needs a vCPU's
//! *scheduling ordinate*, its position in its run queue, which the paper gets by augmenting the
//! red-black tree with the size of each node's left subtree ("RB index").
//!
//! Here the set is a sorted vector: a run queue holds a handful of vCPUs (a few per pCPU even on
//! an oversubscribed host), where shifting a few 16-byte keys costs less than the pointer
//! chasing of a balanced tree (an augmented treap was here before, and its inserts and removes
//! were a twentieth of perf-1024's run time), and the rank of a key is its index. Only the
//! order of the keys is observable, so the structure cannot change a run.

#[derive(Clone)]
pub struct RankSet<K> {
    /// The keys, in increasing order.
    keys: Vec<K>,
}

impl<K> Default for RankSet<K> {
    fn default() -> Self {
        Self { keys: Vec::new() }
    }
}

impl<K: Ord + Copy> RankSet<K> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Insert `key`; returns false (and changes nothing) if it is already present.
    pub fn insert(&mut self, key: K) -> bool {
        match self.keys.binary_search(&key) {
            Ok(_) => false,
            Err(i) => {
                self.keys.insert(i, key);
                true
            }
        }
    }

    /// Remove `key`; returns whether it was present.
    pub fn remove(&mut self, key: &K) -> bool {
        match self.keys.binary_search(key) {
            Ok(i) => {
                self.keys.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    pub fn contains(&self, key: &K) -> bool {
        self.keys.binary_search(key).is_ok()
    }

    /// Number of keys strictly smaller than `key`: the scheduling ordinate when `key` is in the
    /// set (0 for the leftmost task).
    pub fn rank(&self, key: &K) -> usize {
        self.keys.partition_point(|k| k < key)
    }

    /// The key with `i` keys ahead of it.
    pub fn select(&self, i: usize) -> Option<K> {
        self.keys.get(i).copied()
    }

    pub fn first(&self) -> Option<K> {
        self.keys.first().copied()
    }

    pub fn last(&self) -> Option<K> {
        self.keys.last().copied()
    }

    /// All keys in order.
    pub fn iter(&self) -> impl Iterator<Item = K> + '_ {
        self.keys.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn ranks_follow_order() {
        let mut t = RankSet::new();
        for k in [50u64, 10, 30, 20, 40] {
            assert!(t.insert(k));
        }
        assert!(!t.insert(30));
        assert_eq!(t.len(), 5);
        assert_eq!(t.first(), Some(10));
        assert_eq!(t.last(), Some(50));
        assert_eq!(t.rank(&10), 0);
        assert_eq!(t.rank(&40), 3);
        assert_eq!(t.select(1), Some(20));
        assert!(t.remove(&20));
        assert!(!t.remove(&20));
        assert_eq!(t.rank(&40), 2);
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![10, 30, 40, 50]);
    }

    proptest! {
        #[test]
        fn matches_btreeset(ops in proptest::collection::vec((any::<bool>(), 0u16..200), 0..400)) {
            let mut t = RankSet::new();
            let mut s = BTreeSet::new();
            for (insert, k) in ops {
                if insert {
                    prop_assert_eq!(t.insert(k), s.insert(k));
                } else {
                    prop_assert_eq!(t.remove(&k), s.remove(&k));
                }
                prop_assert_eq!(t.len(), s.len());
                prop_assert_eq!(t.first(), s.iter().next().copied());
                prop_assert_eq!(t.rank(&k), s.range(..k).count());
                if let Some(i) = (k as usize).checked_rem(s.len().max(1)) {
                    prop_assert_eq!(t.select(i), s.iter().nth(i).copied());
                }
            }
        }
    }
}

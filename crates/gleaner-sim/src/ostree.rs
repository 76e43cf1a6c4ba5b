//! An order-statistics tree: an ordered set that also answers "how many keys are ahead of this
//! one" in O(log n).
//!
//! Every host run queue is one of these, keyed by (vruntime, task id). CFS only ever needs the
//! leftmost key, but SBCO (Self-boosted co-scheduling, §III-A of the SBCO paper) needs a vCPU's
//! *scheduling ordinate*, its position in its run queue, which the paper gets by augmenting the
//! red-black tree with the size of each node's left subtree ("RB index"). We augment a treap the
//! same way (each node stores its subtree size): same asymptotics, a fraction of the code.
//! Nodes live in an arena indexed by `u32`, so a run queue allocates only when it grows.

const NIL: u32 = u32::MAX;

#[derive(Clone)]
struct Node<K> {
    key: K,
    priority: u32,
    left: u32,
    right: u32,
    size: u32,
}

#[derive(Clone)]
pub struct OsTree<K> {
    nodes: Vec<Node<K>>,
    free: Vec<u32>,
    root: u32,
    /// xorshift state for node priorities: deterministic, so the tree shape (and thus the cost
    /// of a run) is the same on every run.
    prio_state: u32,
}

impl<K: Ord + Copy> Default for OsTree<K> {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
            prio_state: 0x9E37_79B9,
        }
    }
}

impl<K: Ord + Copy> OsTree<K> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.size(self.root) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.root == NIL
    }

    fn size(&self, n: u32) -> u32 {
        if n == NIL {
            0
        } else {
            self.nodes[n as usize].size
        }
    }

    fn fix(&mut self, n: u32) {
        let (l, r) = (self.nodes[n as usize].left, self.nodes[n as usize].right);
        self.nodes[n as usize].size = 1 + self.size(l) + self.size(r);
    }

    fn next_priority(&mut self) -> u32 {
        let mut x = self.prio_state;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.prio_state = x;
        x
    }

    /// Split `n` into (keys < key, keys >= key).
    fn split(&mut self, n: u32, key: &K) -> (u32, u32) {
        if n == NIL {
            return (NIL, NIL);
        }
        if self.nodes[n as usize].key < *key {
            let (l, r) = self.split(self.nodes[n as usize].right, key);
            self.nodes[n as usize].right = l;
            self.fix(n);
            (n, r)
        } else {
            let (l, r) = self.split(self.nodes[n as usize].left, key);
            self.nodes[n as usize].left = r;
            self.fix(n);
            (l, n)
        }
    }

    /// Merge two trees where every key of `a` is smaller than every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].priority > self.nodes[b as usize].priority {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.fix(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.fix(b);
            b
        }
    }

    /// Insert `key`; returns false (and changes nothing) if it is already present.
    pub fn insert(&mut self, key: K) -> bool {
        if self.contains(&key) {
            return false;
        }
        let priority = self.next_priority();
        let node = Node {
            key,
            priority,
            left: NIL,
            right: NIL,
            size: 1,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let (l, r) = self.split(self.root, &key);
        let left = self.merge(l, idx);
        self.root = self.merge(left, r);
        true
    }

    /// Remove `key`; returns whether it was present.
    pub fn remove(&mut self, key: &K) -> bool {
        let mut parent = NIL;
        let mut n = self.root;
        while n != NIL {
            let node = &self.nodes[n as usize];
            if node.key == *key {
                break;
            }
            parent = n;
            n = if *key < node.key {
                node.left
            } else {
                node.right
            };
        }
        if n == NIL {
            return false;
        }
        let (l, r) = (self.nodes[n as usize].left, self.nodes[n as usize].right);
        let merged = self.merge(l, r);
        if parent == NIL {
            self.root = merged;
        } else if self.nodes[parent as usize].left == n {
            self.nodes[parent as usize].left = merged;
        } else {
            self.nodes[parent as usize].right = merged;
        }
        self.free.push(n);
        // Sizes on the path from the root to the removed node each shrink by one.
        let mut m = self.root;
        while m != NIL && m != merged {
            self.nodes[m as usize].size -= 1;
            let node = &self.nodes[m as usize];
            m = if *key < node.key {
                node.left
            } else {
                node.right
            };
        }
        true
    }

    pub fn contains(&self, key: &K) -> bool {
        let mut n = self.root;
        while n != NIL {
            let node = &self.nodes[n as usize];
            if node.key == *key {
                return true;
            }
            n = if *key < node.key {
                node.left
            } else {
                node.right
            };
        }
        false
    }

    /// Number of keys strictly smaller than `key`: the scheduling ordinate when `key` is in the
    /// tree (0 for the leftmost task).
    pub fn rank(&self, key: &K) -> usize {
        let mut n = self.root;
        let mut ahead = 0;
        while n != NIL {
            let node = &self.nodes[n as usize];
            if node.key < *key {
                ahead += self.size(node.left) + 1;
                n = node.right;
            } else {
                n = node.left;
            }
        }
        ahead as usize
    }

    /// The key with `i` keys ahead of it.
    pub fn select(&self, mut i: usize) -> Option<K> {
        let mut n = self.root;
        while n != NIL {
            let node = &self.nodes[n as usize];
            let left = self.size(node.left) as usize;
            if i < left {
                n = node.left;
            } else if i == left {
                return Some(node.key);
            } else {
                i -= left + 1;
                n = node.right;
            }
        }
        None
    }

    pub fn first(&self) -> Option<K> {
        let mut n = self.root;
        let mut out = None;
        while n != NIL {
            out = Some(self.nodes[n as usize].key);
            n = self.nodes[n as usize].left;
        }
        out
    }

    pub fn last(&self) -> Option<K> {
        let mut n = self.root;
        let mut out = None;
        while n != NIL {
            out = Some(self.nodes[n as usize].key);
            n = self.nodes[n as usize].right;
        }
        out
    }

    /// All keys in order (used by load balancing to scan for a movable task).
    pub fn iter(&self) -> impl Iterator<Item = K> + '_ {
        (0..self.len()).filter_map(move |i| self.select(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn ranks_follow_order() {
        let mut t = OsTree::new();
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
            let mut t = OsTree::new();
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

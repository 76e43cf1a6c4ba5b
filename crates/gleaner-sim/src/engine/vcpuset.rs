//! A set of one VM's vCPUs, by their index in the VM, as bits.
//!
//! Why: the guest's placement runs at every wake-up and every time a vCPU goes idle, and
//! walking every vCPU of a 32-vCPU VM there (for the first idle one after the previous, or for
//! one to steal from) was a fifth of perf-1024's run time. With the sets a VM keeps of its idle,
//! once-loaded and stealable vCPUs ([`super::guest::RunState`]), those searches are a few word
//! operations. The order they find is the walk's: the first set vCPU in the cyclic order from a
//! start, so a run does not change.

/// The set; indices below the VM's vCPU count, fixed at creation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct VcpuSet {
    words: Vec<u64>,
}

impl VcpuSet {
    /// The empty set of a VM of `n` vCPUs.
    pub(super) fn new(n: usize) -> VcpuSet {
        VcpuSet {
            words: vec![0; n.div_ceil(64)],
        }
    }

    /// The set of the indices whose flag is true.
    pub(super) fn from_flags(flags: impl ExactSizeIterator<Item = bool>) -> VcpuSet {
        let mut s = VcpuSet::new(flags.len());
        for (i, on) in flags.enumerate() {
            s.set(i, on);
        }
        s
    }

    pub(super) fn set(&mut self, i: usize, on: bool) {
        let bit = 1u64 << (i % 64);
        if on {
            self.words[i / 64] |= bit;
        } else {
            self.words[i / 64] &= !bit;
        }
    }

    pub(super) fn contains(&self, i: usize) -> bool {
        self.words[i / 64] >> (i % 64) & 1 == 1
    }

    pub(super) fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub(super) fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The members in increasing order.
    pub(super) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(k, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros() as usize;
                    w &= w - 1;
                    k * 64 + b
                })
            })
        })
    }

    /// The first index in both `self` and `other` in the cyclic order `start`, `start + 1`, …,
    /// wrapping to 0 and ending at `start - 1` (both sets of the same VM; `start` below its
    /// vCPU count).
    pub(super) fn first_common_from(&self, other: &VcpuSet, start: usize) -> Option<usize> {
        let nw = self.words.len();
        let both = |k: usize| self.words[k] & other.words[k];
        let (sw, sb) = (start / 64, start % 64);
        let at = |k: usize, w: u64| k * 64 + w.trailing_zeros() as usize;
        let from_start = both(sw) & (u64::MAX << sb);
        if from_start != 0 {
            return Some(at(sw, from_start));
        }
        for d in 1..nw {
            let k = (sw + d) % nw;
            if both(k) != 0 {
                return Some(at(k, both(k)));
            }
        }
        let before_start = both(sw) & ((1u64 << sb) - 1);
        (before_start != 0).then(|| at(sw, before_start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The search finds what a walk over every index in the cyclic order finds.
        #[test]
        fn first_common_from_is_the_cyclic_walks_first(
            (n, a, b, start) in (1usize..200).prop_flat_map(|n| (
                Just(n),
                proptest::collection::vec(any::<bool>(), n),
                proptest::collection::vec(any::<bool>(), n),
                0..n,
            ))
        ) {
            let (sa, sb) = (VcpuSet::from_flags(a.iter().copied()), VcpuSet::from_flags(b.iter().copied()));
            let walk = (0..n).map(|i| (start + i) % n).find(|&i| a[i] && b[i]);
            prop_assert_eq!(sa.first_common_from(&sb, start), walk);
            prop_assert_eq!(sa.iter().collect::<Vec<_>>(), (0..n).filter(|&i| a[i]).collect::<Vec<_>>());
            prop_assert_eq!(sa.len(), a.iter().filter(|&&x| x).count());
            prop_assert_eq!(sa.is_empty(), !a.contains(&true));
        }
    }

    #[test]
    fn set_and_clear_across_words() {
        let mut s = VcpuSet::new(130);
        for i in [0, 63, 64, 129] {
            s.set(i, true);
            assert!(s.contains(i));
        }
        s.set(64, false);
        assert!(!s.contains(64));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 129]);
        let all = VcpuSet::from_flags((0..130).map(|_| true));
        assert_eq!(s.first_common_from(&all, 64), Some(129));
        assert_eq!(s.first_common_from(&all, 130 - 1), Some(129));
        assert_eq!(s.first_common_from(&all, 1), Some(63));
    }
}

//! A set of the host's pCPUs, as bits, for the searches that run at every wake-up and every
//! time a pCPU goes idle.
//!
//! Why: wake-up placement looked at each pCPU of the LLC domain in turn for an idle one, and
//! new-idle balancing at each for a queue with a vCPU waiting: at perf-1024's 6 M host wake-ups
//! and halts per simulated second those walks were about a tenth of the run time. The host keeps
//! the set of its idle pCPUs and of those with a vCPU waiting ([`super::Host::sync_rq_load`]);
//! the searches visit the members of a range in the walk's order, so what they find does not
//! change.

/// The set; indices below the pCPU count, fixed at creation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PcpuSet {
    words: Vec<u64>,
}

impl PcpuSet {
    /// The set of `n` pCPUs, all members or none.
    pub(super) fn new(n: usize, full: bool) -> PcpuSet {
        let mut s = PcpuSet {
            words: vec![0; n.div_ceil(64)],
        };
        if full {
            for i in 0..n {
                s.set(i, true);
            }
        }
        s
    }

    pub(super) fn set(&mut self, i: usize, on: bool) {
        let (word, bit) = (&mut self.words[i / 64], i % 64);
        *word = (*word & !(1 << bit)) | (u64::from(on) << bit);
    }

    /// The first member in `from..to`.
    fn first_in(&self, from: usize, to: usize) -> Option<usize> {
        if from >= to {
            return None;
        }
        let mut k = from / 64;
        let mut w = self.words[k] & (u64::MAX << (from % 64));
        while w == 0 {
            k += 1;
            if k * 64 >= to {
                return None;
            }
            w = self.words[k];
        }
        let i = k * 64 + w.trailing_zeros() as usize;
        (i < to).then_some(i)
    }

    /// The members of `range` in the cyclic order `start`, `start + 1`, …, wrapping to
    /// `range.start` and ending at `start - 1` (`start` inside `range`).
    pub(super) fn iter_cyclic(
        &self,
        range: std::ops::Range<usize>,
        start: usize,
    ) -> impl Iterator<Item = usize> + '_ {
        let (mut from, mut to, mut wrapped) = (start, range.end, false);
        std::iter::from_fn(move || loop {
            if let Some(i) = self.first_in(from, to) {
                from = i + 1;
                return Some(i);
            }
            if wrapped {
                return None;
            }
            (from, to, wrapped) = (range.start, start, true);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The members a cyclic walk over every index of the range finds, in its order.
        #[test]
        fn iter_cyclic_is_the_walk_over_the_members(
            (flags, lo, hi, start) in (1usize..300).prop_flat_map(|n| (
                proptest::collection::vec(any::<bool>(), n),
                0..n,
                0..=n,
            )).prop_flat_map(|(flags, a, b)| {
                let (lo, hi) = (a.min(b), a.max(b).max(a.min(b) + 1));
                (Just(flags), Just(lo), Just(hi), lo..hi)
            })
        ) {
            let mut s = PcpuSet::new(flags.len(), false);
            for (i, &on) in flags.iter().enumerate() {
                s.set(i, on);
            }
            let len = hi - lo;
            let walk: Vec<usize> = (0..len)
                .map(|i| lo + (start - lo + i) % len)
                .filter(|&q| flags[q])
                .collect();
            prop_assert_eq!(s.iter_cyclic(lo..hi, start).collect::<Vec<_>>(), walk);
        }
    }

    #[test]
    fn full_set_has_every_index() {
        let s = PcpuSet::new(130, true);
        assert_eq!(s.iter_cyclic(0..130, 0).count(), 130);
        assert_eq!(
            s.iter_cyclic(60..70, 65).collect::<Vec<_>>(),
            (65..70).chain(60..65).collect::<Vec<_>>()
        );
        assert_eq!(s.first_in(128, 128), None);
        assert_eq!(s.first_in(129, 130), Some(129));
    }
}

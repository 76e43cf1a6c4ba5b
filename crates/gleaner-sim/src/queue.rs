//! The event queue: a min-heap on (time, sequence number).
//!
//! The sequence number makes the order of events at the same nanosecond first-in first-out,
//! which is what makes a run deterministic (the habit of nexosim and most DES kernels).
//! Cancelling an event is never done here: events carry a generation number and the handler
//! ignores stale ones, which keeps push and pop O(log n) with no bookkeeping.

use crate::time::Ns;

/// A 4-ary min-heap keyed by `time << 64 | seq`: half the depth of a binary heap and one
/// integer comparison per step, which matters because push and pop are most of the cost of a
/// simulated event.
pub struct EventQueue<E> {
    heap: Vec<(u128, E)>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self {
            heap: Vec::new(),
            next_seq: 0,
        }
    }
}

const ARITY: usize = 4;

impl<E> EventQueue<E> {
    pub fn push(&mut self, at: Ns, event: E) {
        let key = (at as u128) << 64 | self.next_seq as u128;
        self.next_seq += 1;
        self.heap.push((key, event));
        let mut i = self.heap.len() - 1;
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.heap[parent].0 <= key {
                break;
            }
            self.heap.swap(i, parent);
            i = parent;
        }
    }

    pub fn pop(&mut self) -> Option<(Ns, E)> {
        let last = self.heap.pop()?;
        if self.heap.is_empty() {
            return Some(((last.0 >> 64) as Ns, last.1));
        }
        let top = std::mem::replace(&mut self.heap[0], last);
        let key = self.heap[0].0;
        let len = self.heap.len();
        let mut i = 0;
        loop {
            let first = i * ARITY + 1;
            if first >= len {
                break;
            }
            let end = (first + ARITY).min(len);
            let mut best = first;
            for c in first + 1..end {
                if self.heap[c].0 < self.heap[best].0 {
                    best = c;
                }
            }
            if self.heap[best].0 >= key {
                break;
            }
            self.heap.swap(i, best);
            i = best;
        }
        Some(((top.0 >> 64) as Ns, top.1))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_sorted_order_on_random_input() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut q = EventQueue::default();
        let mut expect = Vec::new();
        for i in 0..2000u32 {
            let at = rng.gen_range(0..100u64);
            q.push(at, i);
            expect.push((at, i));
            if i % 3 == 0 {
                expect.sort();
                assert_eq!(q.pop(), Some(expect.remove(0)));
            }
        }
        expect.sort();
        let rest: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(rest, expect);
    }

    #[test]
    fn earliest_first_and_fifo_on_ties() {
        let mut q = EventQueue::default();
        q.push(5, "c");
        q.push(1, "a");
        q.push(5, "d");
        q.push(3, "b");
        q.push(5, "e");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![(1, "a"), (3, "b"), (5, "c"), (5, "d"), (5, "e")]
        );
        assert!(q.is_empty());
    }
}

//! The event queue: a min-heap on (time, sequence number).
//!
//! The sequence number makes the order of events at the same nanosecond first-in first-out,
//! which is what makes a run deterministic (the habit of nexosim and most DES kernels).
//! Cancelling an event is never done here: events carry a generation number and the handler
//! ignores stale ones, which keeps push and pop O(log n) with no bookkeeping.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::time::Ns;

struct Entry<E> {
    at: Ns,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    // Reversed: BinaryHeap is a max-heap and we want the earliest (then lowest seq) on top.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self { heap: BinaryHeap::new(), next_seq: 0 }
    }
}

impl<E> EventQueue<E> {
    pub fn push(&mut self, at: Ns, event: E) {
        self.heap.push(Entry { at, seq: self.next_seq, event });
        self.next_seq += 1;
    }

    pub fn pop(&mut self) -> Option<(Ns, E)> {
        self.heap.pop().map(|e| (e.at, e.event))
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
    fn earliest_first_and_fifo_on_ties() {
        let mut q = EventQueue::default();
        q.push(5, "c");
        q.push(1, "a");
        q.push(5, "d");
        q.push(3, "b");
        q.push(5, "e");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(1, "a"), (3, "b"), (5, "c"), (5, "d"), (5, "e")]);
        assert!(q.is_empty());
    }
}

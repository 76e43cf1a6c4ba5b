//! The event queue: a priority queue on (time, sequence number), made of two min-heaps.
//!
//! The sequence number makes the order of events at the same nanosecond first-in first-out,
//! which is what makes a run deterministic (the habit of nexosim and most DES kernels).
//! Cancelling an event is never done here: the owner of a timer keeps the key of its live
//! event and the handler ignores any other, which keeps push and pop O(log n) with no
//! bookkeeping.

use std::collections::VecDeque;

use crate::time::Ns;

/// The event queue: two heaps ([`Heap`]), one for the events due within [`HORIZON`] of the
/// last event popped and one for later ones. Pop takes the smaller of their two minimums, so
/// where an event went never changes the order; the split only keeps the heap that nearly
/// every push and pop touches small. In perf-1024 the vCPU timers (microseconds ahead) are
/// most events, while the 1,024 pCPUs' balance timers and slice ticks (milliseconds ahead)
/// are most entries: with one heap every pop walked past them.
///
/// Events that come a fixed delay after the event that schedules them (an IPI's flight, the
/// host's kick of a halted vCPU, a vCPU's switch-in overhead: a third of perf-1024's events)
/// are due in the order they are pushed, so they wait in first-in first-out lanes, one per
/// delay ([`EventQueue::push_delayed`]), pushed and popped in O(1); pop takes the smallest of
/// the heaps' and lanes' first keys. The lanes' smallest first key is kept
/// ([`EventQueue::lanes_first`]), so a pop compares three keys, not one per lane as well.
/// The near heap keeps its keys in 64 bits ([`NearHeap`]).
pub struct EventQueue<E> {
    near: NearHeap<E>,
    far: Heap<Key, E>,
    /// (delay, its events).
    lanes: Vec<(Ns, VecDeque<(Key, E)>)>,
    /// Each lane's first key, [`NO_EVENT`] for an empty or unused lane: what a pop from a lane
    /// compares to find the next first, without looking into each lane's ring buffer.
    lane_fronts: [Key; MAX_LANES],
    /// The smallest first key of the lanes and its lane; [`NO_EVENT`] when they are empty.
    lanes_first: (Key, usize),
    /// The time of the last event popped.
    now: Ns,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self {
            near: NearHeap::default(),
            far: Heap::default(),
            lanes: Vec::new(),
            lane_fronts: [NO_EVENT; MAX_LANES],
            lanes_first: (NO_EVENT, 0),
            now: 0,
            next_seq: 0,
        }
    }
}

/// At most this many lanes: each costs every pop from a lane a comparison.
const MAX_LANES: usize = 4;

/// Events due this far after the last one popped, or later, go to the far heap.
const HORIZON: Ns = 200_000;

/// An event's place in the order: `time << 64 | seq`.
pub type Key = u128;

/// Larger than every key [`EventQueue::key_at`] makes (it would take the 2^64th sequence
/// number): where no event is.
const NO_EVENT: Key = Key::MAX;

/// The time of a key.
pub fn time_of(key: Key) -> Ns {
    (key >> 64) as Ns
}

/// The sequence number of a key.
fn seq_of(key: Key) -> u64 {
    key as u64
}

/// The largest key at time `at`: every event at `at` or before orders at or before it.
pub fn last_key_at(at: Ns) -> Key {
    (at as u128) << 64 | u64::MAX as u128
}

impl<E: Copy> EventQueue<E> {
    pub fn push(&mut self, at: Ns, event: E) {
        let key = self.key_at(at);
        self.push_key(key, event);
    }

    /// Take the next sequence number for an event at `at`, to push it (now or later) with
    /// [`EventQueue::push_key`]: pushed later, it keeps its place among events at the same
    /// time as if it had been pushed now.
    pub fn key_at(&mut self, at: Ns) -> Key {
        let key = (at as u128) << 64 | self.next_seq as u128;
        self.next_seq += 1;
        key
    }

    /// Push an event with a key from [`EventQueue::key_at`] (each key at most once in the
    /// queue at a time).
    pub fn push_key(&mut self, key: Key, event: E) {
        if time_of(key) >= self.now.saturating_add(HORIZON) || !self.near.push(key, event) {
            self.far.push(key, event);
        }
    }

    /// Push an event due `delay` after `now` (the caller's current time), into the lane of
    /// that delay: with `now` never decreasing, each lane's times never decrease. One that
    /// would (or one past the lanes' number) goes to the heaps, so the order is right either
    /// way. Returns its key.
    pub fn push_delayed(&mut self, now: Ns, delay: Ns, event: E) -> Key {
        let key = self.key_at(now.saturating_add(delay));
        let lane = match self.lanes.iter().position(|&(d, _)| d == delay) {
            Some(l) => Some(l),
            None if self.lanes.len() < MAX_LANES => {
                self.lanes.push((delay, VecDeque::new()));
                Some(self.lanes.len() - 1)
            }
            None => None,
        };
        match lane {
            Some(l) if self.lanes[l].1.back().is_none_or(|&(last, _)| last < key) => {
                self.lanes[l].1.push_back((key, event));
                if self.lane_fronts[l] == NO_EVENT {
                    self.lane_fronts[l] = key;
                }
                if key < self.lanes_first.0 {
                    // The lane was empty (a lane's keys only grow) and this is the lanes' first.
                    self.lanes_first = (key, l);
                }
            }
            _ => self.push_key(key, event),
        }
        key
    }

    pub fn pop(&mut self) -> Option<(Ns, E)> {
        self.pop_key().map(|(key, e)| (time_of(key), e))
    }

    pub fn pop_key(&mut self) -> Option<(Key, E)> {
        let near = self.near.first().unwrap_or(NO_EVENT);
        let far = self.far.first().unwrap_or(NO_EVENT);
        let (lane_key, lane) = self.lanes_first;
        let popped = if near < far && near < lane_key {
            self.near.pop()
        } else if far < lane_key {
            self.far.pop()
        } else if lane_key != NO_EVENT {
            let events = &mut self.lanes[lane].1;
            let popped = events.pop_front();
            self.lane_fronts[lane] = events.front().map_or(NO_EVENT, |&(key, _)| key);
            self.lanes_first = self.lanes_first_key();
            popped
        } else {
            None
        };
        if let Some((key, _)) = popped {
            self.now = time_of(key);
        }
        popped
    }

    /// The smallest first key of the lanes and its lane (the first lane if they are empty).
    fn lanes_first_key(&self) -> (Key, usize) {
        let mut first = (self.lane_fronts[0], 0);
        for (l, &key) in self.lane_fronts.iter().enumerate().skip(1) {
            if key < first.0 {
                first = (key, l);
            }
        }
        first
    }

    pub fn len(&self) -> usize {
        self.near.heap.len()
            + self.far.len()
            + self.lanes.iter().map(|(_, l)| l.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The near heap, its keys packed into 64 bits relative to a base time and sequence number:
/// `(time - base_time) << SEQ_BITS | (seq - base_seq)`. Subtracting a constant from each part
/// keeps the order of the keys, so the packed keys order as the full ones do; a comparison and
/// a move of a key are then one instruction instead of two, in the sift-down that is most of a
/// pop. The near heap's keys lie within [`HORIZON`] of the last event popped, so they fit
/// with a base that moves forward now and then ([`NearHeap::rebase`]); a key that does not fit
/// goes to the far heap, which takes any key, so the order is right either way.
struct NearHeap<E> {
    heap: Heap<u64, E>,
    base_time: Ns,
    base_seq: u64,
}

impl<E> Default for NearHeap<E> {
    fn default() -> Self {
        Self {
            heap: Heap::default(),
            base_time: 0,
            base_seq: 0,
        }
    }
}

/// The low bits of a packed near key: the sequence number past `base_seq`. The high 28 bits
/// leave 268 ms of time past `base_time`.
const SEQ_BITS: u32 = 36;

impl<E: Copy> NearHeap<E> {
    /// `key` relative to the base, if it fits.
    fn pack(&self, key: Key) -> Option<u64> {
        let dt = time_of(key).checked_sub(self.base_time)?;
        let ds = seq_of(key).checked_sub(self.base_seq)?;
        (dt < 1 << (64 - SEQ_BITS) && ds < 1 << SEQ_BITS).then_some(dt << SEQ_BITS | ds)
    }

    fn unpack(&self, packed: u64) -> Key {
        let time = self.base_time + (packed >> SEQ_BITS);
        let seq = self.base_seq + (packed & ((1 << SEQ_BITS) - 1));
        (time as u128) << 64 | seq as u128
    }

    /// Push `key` if it fits (rebasing if it lies too far past the base); false if it does not.
    fn push(&mut self, key: Key, event: E) -> bool {
        let packed = match self.pack(key) {
            Some(packed) => packed,
            None if time_of(key) >= self.base_time && seq_of(key) >= self.base_seq => {
                self.rebase(key);
                match self.pack(key) {
                    Some(packed) => packed,
                    None => return false,
                }
            }
            None => return false,
        };
        self.heap.push(packed, event);
        true
    }

    /// Move the base up to the smallest time and sequence number of the queued keys (those of
    /// `key` when there are none), which every queued key still fits above. Runs when a key
    /// lies past the packed range: about once per 268 ms of simulated time.
    fn rebase(&mut self, key: Key) {
        let Some(&smallest) = self.heap.keys.iter().min() else {
            (self.base_time, self.base_seq) = (time_of(key), seq_of(key));
            return;
        };
        // The smallest key has the smallest time; the smallest sequence number may be another's.
        let time_shift = smallest >> SEQ_BITS;
        let seq_mask = (1 << SEQ_BITS) - 1;
        let seq_shift = self
            .heap
            .keys
            .iter()
            .map(|&p| p & seq_mask)
            .min()
            .unwrap_or(0);
        for packed in &mut self.heap.keys {
            // Each part of every key is at least its shift: no borrow from one to the other.
            *packed -= time_shift << SEQ_BITS | seq_shift;
        }
        self.base_time += time_shift;
        self.base_seq += seq_shift;
    }

    fn first(&self) -> Option<Key> {
        self.heap.first().map(|packed| self.unpack(packed))
    }

    fn pop(&mut self) -> Option<(Key, E)> {
        let (packed, event) = self.heap.pop()?;
        Some((self.unpack(packed), event))
    }
}

/// A 4-ary min-heap keyed by `time << 64 | seq` (packed, in the near heap): half the depth of a
/// binary heap and one integer comparison per step, which matters because push and pop are most
/// of the cost of a simulated event.
///
/// Keys and events are kept in two parallel arrays rather than one array of pairs: the
/// comparisons, which are most of the memory traffic, then read keys only (a node's four
/// children's keys are 64 bytes, one or two cache lines, instead of 128 bytes of pairs; 32 in the
/// near heap), and the event is moved only along the one path that changes. Every key is
/// distinct (the sequence number), so any correct heap pops the same order: the layout cannot
/// change a run.
struct Heap<K, E> {
    keys: Vec<K>,
    events: Vec<E>,
}

impl<K, E> Default for Heap<K, E> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            events: Vec::new(),
        }
    }
}

const ARITY: usize = 4;

impl<K: Ord + Copy, E: Copy> Heap<K, E> {
    fn first(&self) -> Option<K> {
        self.keys.first().copied()
    }

    fn push(&mut self, key: K, event: E) {
        // Sift up with a hole: parents move down one step each, the new entry is written once.
        let mut i = self.keys.len();
        self.keys.push(key);
        self.events.push(event);
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.keys[parent] <= key {
                break;
            }
            self.keys[i] = self.keys[parent];
            self.events[i] = self.events[parent];
            i = parent;
        }
        self.keys[i] = key;
        self.events[i] = event;
    }

    fn pop(&mut self) -> Option<(K, E)> {
        let top = (*self.keys.first()?, self.events[0]);
        let (Some(last_key), Some(last_event)) = (self.keys.pop(), self.events.pop()) else {
            return None;
        };
        let len = self.keys.len();
        if len == 0 {
            return Some(top);
        }
        // Floyd's variant: walk the hole at the root down to a leaf along the smallest
        // children without comparing them with the last entry (which, taken from the bottom,
        // nearly always belongs near the bottom), then sift that entry up from the leaf. About
        // one comparison per level fewer than the textbook sift-down.
        // Both arrays as slices of the one length `len`: an index checked against one needs
        // no check against the other.
        let keys = &mut self.keys[..len];
        let events = &mut self.events[..len];
        let mut i = 0;
        loop {
            let first = i * ARITY + 1;
            if first >= len {
                break;
            }
            let best = if let Some(c) = keys.get(first..first + ARITY) {
                // Full node: a tournament of two pairs, which compiles to conditional moves
                // (the children as one slice of known length: one bounds check, not four).
                let a = if c[1] < c[0] { 1 } else { 0 };
                let b = if c[3] < c[2] { 3 } else { 2 };
                first + if c[b] < c[a] { b } else { a }
            } else {
                let mut best = first;
                for c in first + 1..len {
                    if keys[c] < keys[best] {
                        best = c;
                    }
                }
                best
            };
            keys[i] = keys[best];
            events[i] = events[best];
            i = best;
        }
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if keys[parent] <= last_key {
                break;
            }
            keys[i] = keys[parent];
            events[i] = events[parent];
            i = parent;
        }
        keys[i] = last_key;
        events[i] = last_event;
        Some(top)
    }

    fn len(&self) -> usize {
        self.keys.len()
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
    fn matches_a_sorted_order_across_both_heaps_and_late_pushes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut q = EventQueue::default();
        let mut expect = Vec::new();
        let mut held = Vec::new();
        let mut now = 0;
        for i in 0..5000u32 {
            // Near and far (past HORIZON) times, many of them equal.
            let at = now + rng.gen_range(0..4u64) * rng.gen_range(0..3 * HORIZON / 4);
            let key = q.key_at(at);
            expect.push((key, i));
            if i % 5 == 0 {
                // Pushed later under the key taken now, as the lazy host tick does.
                held.push((key, i));
            } else {
                q.push_key(key, i);
            }
            if i % 3 == 0 {
                for (k, e) in held.drain(..) {
                    q.push_key(k, e);
                }
                expect.sort();
                let (key, e) = expect.remove(0);
                assert_eq!(q.pop_key(), Some((key, e)));
                now = time_of(key);
            }
        }
        for (k, e) in held.drain(..) {
            q.push_key(k, e);
        }
        expect.sort();
        let rest: Vec<_> = std::iter::from_fn(|| q.pop_key()).collect();
        assert_eq!(rest, expect);
        assert!(q.is_empty());
    }

    #[test]
    fn near_heap_rebases_and_pops_what_it_took_in_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut near = NearHeap::default();
        // What the near heap took; a key it gives back goes to the far heap.
        let mut taken = std::collections::BTreeSet::new();
        let mut misfits = 0;
        let mut now: Ns = 0;
        for i in 0..20_000u64 {
            // Times up to a second past `now`, past the 268 ms the packing holds, and now and
            // then a sequence number taken long ago or a time in the past.
            let at = (now + rng.gen_range(0..1_000_000_000)).saturating_sub(rng.gen_range(0..2));
            let seq = if i % 7 == 0 { i / 2 } else { i };
            let key = (at as u128) << 64 | seq as u128;
            if near.push(key, i) {
                taken.insert((key, i));
            } else {
                misfits += 1;
            }
            if i % 2 == 0 {
                let popped = near.pop();
                assert_eq!(popped, taken.pop_first());
                if let Some((key, _)) = popped {
                    now = now.max(time_of(key));
                }
            }
        }
        assert!(near.base_time > 0 && near.base_seq > 0, "it rebased");
        assert!(misfits > 0);
        assert_eq!(
            std::iter::from_fn(|| near.pop()).collect::<Vec<_>>(),
            Vec::from_iter(taken)
        );
    }

    #[test]
    fn fifo_lanes_merge_in_order_and_take_a_decreasing_time_in_the_heaps() {
        let mut q = EventQueue::default();
        q.push(7, "heap 7");
        q.push_delayed(0, 5, "lane0 5");
        q.push_delayed(4, 1, "lane1 5");
        q.push_delayed(4, 5, "lane0 9");
        q.push_delayed(0, 5, "lane0 5 again, earlier than 9: to the heaps");
        q.push(5, "heap 5");
        q.push_delayed(299_999, 1, "lane1 300000");
        for d in 10..20 {
            // Past MAX_LANES: to the heaps.
            q.push_delayed(1_000_000, d, "late");
        }
        assert_eq!(q.len(), 17);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                (5, "lane0 5"),
                (5, "lane1 5"),
                (5, "lane0 5 again, earlier than 9: to the heaps"),
                (5, "heap 5"),
                (7, "heap 7"),
                (9, "lane0 9"),
                (300_000, "lane1 300000"),
            ]
            .into_iter()
            .chain((1_000_010..1_000_020).map(|t| (t, "late")))
            .collect::<Vec<_>>()
        );
        assert!(q.is_empty());
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

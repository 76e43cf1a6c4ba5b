//! A set of CPU ids with the kernel's list syntax (`0-3,8,10-11`).
//!
//! Exists because every layer speaks in CPU sets: the policy's active set, the cgroup
//! `cpuset.cpus` files, sched_setaffinity masks and the simulator's guests. One type with a
//! strict parser means malformed kernel or user input becomes an error, never a panic.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Largest CPU id we accept; the kernel's NR_CPUS limit is 8192.
pub const MAX_CPU: usize = 8191;

/// A set of CPU ids, stored as a bitmask.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Cpuset {
    words: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpusetParseError {
    #[error("bad CPU list {input:?}: {reason} (expected e.g. \"0-3,8\")")]
    Malformed { input: String, reason: &'static str },
    #[error("CPU id {id} in {input:?} is larger than {MAX_CPU}")]
    TooLarge { input: String, id: usize },
}

impl Cpuset {
    pub fn new() -> Self {
        Self::default()
    }

    /// CPUs `0..n`.
    pub fn first_n(n: usize) -> Self {
        (0..n).collect()
    }

    pub fn insert(&mut self, cpu: usize) -> bool {
        let (w, b) = (cpu / 64, cpu % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        !was
    }

    pub fn remove(&mut self, cpu: usize) -> bool {
        let (w, b) = (cpu / 64, cpu % 64);
        if w >= self.words.len() {
            return false;
        }
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] &= !(1 << b);
        self.trim();
        was
    }

    pub fn contains(&self, cpu: usize) -> bool {
        let (w, b) = (cpu / 64, cpu % 64);
        w < self.words.len() && self.words[w] & (1 << b) != 0
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w & (1u64 << b) != 0)
                .map(move |b| i * 64 + b)
        })
    }

    pub fn first(&self) -> Option<usize> {
        self.iter().next()
    }

    pub fn last(&self) -> Option<usize> {
        self.iter().last()
    }

    pub fn is_subset(&self, other: &Cpuset) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, &w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    pub fn intersection(&self, other: &Cpuset) -> Cpuset {
        let mut c = Cpuset {
            words: self
                .words
                .iter()
                .zip(&other.words)
                .map(|(a, b)| a & b)
                .collect(),
        };
        c.trim();
        c
    }

    pub fn union(&self, other: &Cpuset) -> Cpuset {
        let n = self.words.len().max(other.words.len());
        let words = (0..n)
            .map(|i| {
                self.words.get(i).copied().unwrap_or(0) | other.words.get(i).copied().unwrap_or(0)
            })
            .collect();
        Cpuset { words }
    }

    pub fn difference(&self, other: &Cpuset) -> Cpuset {
        let mut c = Cpuset {
            words: self
                .words
                .iter()
                .enumerate()
                .map(|(i, &w)| w & !other.words.get(i).copied().unwrap_or(0))
                .collect(),
        };
        c.trim();
        c
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

impl FromIterator<usize> for Cpuset {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut c = Cpuset::new();
        for cpu in iter {
            c.insert(cpu);
        }
        c
    }
}

impl FromStr for Cpuset {
    type Err = CpusetParseError;

    /// Parses the kernel list format. Whitespace around the list (the trailing newline of a
    /// sysfs file) is ignored; an empty list is the empty set, as in an unset `cpuset.cpus`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        let mut set = Cpuset::new();
        if s.is_empty() {
            return Ok(set);
        }
        let bad = |reason| CpusetParseError::Malformed {
            input: input.to_string(),
            reason,
        };
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("empty element"));
            }
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (parse_id(a, input)?, parse_id(b, input)?),
                None => {
                    let id = parse_id(part, input)?;
                    (id, id)
                }
            };
            if lo > hi {
                return Err(bad("range start is after its end"));
            }
            for cpu in lo..=hi {
                set.insert(cpu);
            }
        }
        Ok(set)
    }
}

fn parse_id(s: &str, input: &str) -> Result<usize, CpusetParseError> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpusetParseError::Malformed {
            input: input.to_string(),
            reason: "not a CPU number",
        });
    }
    let id: usize = s.parse().map_err(|_| CpusetParseError::TooLarge {
        input: input.to_string(),
        id: usize::MAX,
    })?;
    if id > MAX_CPU {
        return Err(CpusetParseError::TooLarge {
            input: input.to_string(),
            id,
        });
    }
    Ok(id)
}

impl fmt::Display for Cpuset {
    /// Writes the kernel list format with ranges, e.g. `0-3,8`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi = it.next().unwrap_or(hi);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Cpuset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cpuset({self})")
    }
}

impl Serialize for Cpuset {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cpuset {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_kernel_lists() {
        let c: Cpuset = "0-3,8,10-11\n".parse().unwrap();
        assert_eq!(c.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(c.to_string(), "0-3,8,10-11");
        assert!("".parse::<Cpuset>().unwrap().is_empty());
    }

    #[test]
    fn rejects_malformed_lists() {
        for bad in ["a", "1-", "-1", "3-1", "1,,2", "1 2", "99999", "0x1"] {
            assert!(bad.parse::<Cpuset>().is_err(), "{bad}");
        }
    }

    #[test]
    fn set_operations() {
        let a: Cpuset = "0-3".parse().unwrap();
        let b: Cpuset = "2-5".parse().unwrap();
        assert_eq!(a.intersection(&b).to_string(), "2-3");
        assert_eq!(a.union(&b).to_string(), "0-5");
        assert_eq!(a.difference(&b).to_string(), "0-1");
        assert!("1-2".parse::<Cpuset>().unwrap().is_subset(&a));
        assert_eq!(a.last(), Some(3));
    }

    proptest! {
        #[test]
        fn display_round_trips(ids in proptest::collection::btree_set(0usize..300, 0..40)) {
            let c: Cpuset = ids.iter().copied().collect();
            let back: Cpuset = c.to_string().parse().unwrap();
            prop_assert_eq!(back, c);
        }

        #[test]
        fn never_panics_on_any_text(s in ".{0,40}") {
            let _ = s.parse::<Cpuset>();
        }
    }
}

//! The deterministic integer "work" every workload burns CPU with.
//!
//! Workloads need an amount of computation that is (a) proportional to an
//! iteration count, so `--work 500` vs `--work 5000` means fine vs coarse
//! grained, (b) impossible for the compiler to fold away, and (c) produces a
//! value we can fold into a checksum, so a run's result is reproducible and a
//! test can prove that every item/op was really processed exactly once.

/// Added after each mixing round so a zero seed does not stay at zero.
const ROUND_CONSTANT: u64 = 0x9E37_79B9_7F4A_7C15;

/// One round of the splitmix64/murmur3 finalizer: a cheap bijective mix.
#[inline]
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    x = x.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    x ^= x >> 33;
    x
}

/// Runs `iterations` dependent mixing rounds starting from `seed`.
///
/// Each round depends on the previous one, so the loop cannot be vectorised
/// or shortened and its cost grows linearly with `iterations`
/// (a few nanoseconds per round). Zero iterations return `seed` unchanged.
#[inline]
pub fn hash_work(seed: u64, iterations: u64) -> u64 {
    let mut x = seed;
    for _ in 0..iterations {
        x = mix(x).wrapping_add(ROUND_CONSTANT);
    }
    x
}

/// Folds `value` into an order-dependent running checksum.
#[inline]
pub fn fold_ordered(checksum: u64, value: u64) -> u64 {
    mix(checksum.rotate_left(5) ^ value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_iterations_is_identity() {
        assert_eq!(hash_work(42, 0), 42);
    }

    #[test]
    fn iterations_compose() {
        // hash_work is a plain iteration, so splitting the count must not change the result.
        assert_eq!(hash_work(7, 300), hash_work(hash_work(7, 100), 200));
    }

    #[test]
    fn different_inputs_give_different_outputs() {
        assert_ne!(hash_work(1, 10), hash_work(2, 10));
        assert_ne!(hash_work(1, 10), hash_work(1, 11));
        assert_ne!(hash_work(0, 1), 0);
    }

    #[test]
    fn ordered_fold_depends_on_order() {
        let ab = fold_ordered(fold_ordered(0, 1), 2);
        let ba = fold_ordered(fold_ordered(0, 2), 1);
        assert_ne!(ab, ba);
    }
}

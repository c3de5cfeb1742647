//! The one seeded generator of the workspace (SplitMix64): test inputs, benchmark
//! data and the timing harness's shuffles all draw from it, so the crate needs no
//! dependency and any failure can be replayed from its printed seed.
//!
//! ```
//! use compute_core::rng::Rng;
//! let mut a = Rng::new(7);
//! let mut b = Rng::new(7);
//! let x = a.vec(4, -1.0, 1.0);
//! assert_eq!(x, b.vec(4, -1.0, 1.0)); // same seed, same stream
//! assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// SplitMix64: fast (a few ns a value), statistically fine for test data,
/// trivially seedable; any seed, 0 included, gives a full-period stream.
/// Not for cryptography.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f32 {
        (lo + (hi - lo) * self.unit()) as f32
    }

    /// Uniform integer in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }

    /// `len` values uniform in `[lo, hi)`; never all zeros.
    pub fn vec(&mut self, len: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..len).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Shuffles `v` in place (Fisher–Yates): every order equally likely. O(len).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// `len` values uniform in `[lo, hi)` from the stream of `seed`: the same
/// values for the same seed on every run and machine. Never all zeros.
pub fn random_vec(len: usize, lo: f64, hi: f64, seed: u64) -> Vec<f32> {
    Rng::new(seed).vec(len, lo, hi)
}

/// A fresh seed for this run: `COMPUTE_TEST_SEED` if set (to replay a failure),
/// otherwise from the clock and a counter, so every run draws new inputs.
pub fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    if let Some(seed) = std::env::var("COMPUTE_TEST_SEED").ok().and_then(|s| s.parse().ok()) {
        return seed;
    }
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let mut r = Rng::new(nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32));
    r.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_replay_and_stay_in_range() {
        let x = random_vec(1000, -2.0, 3.0, 42);
        assert_eq!(x, random_vec(1000, -2.0, 3.0, 42));
        assert_ne!(x, random_vec(1000, -2.0, 3.0, 43));
        assert!(x.iter().all(|v| (-2.0..3.0).contains(v)));
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        assert!((mean - 0.5).abs() < 0.15, "mean {mean}");
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<usize> = (0..100).collect();
        Rng::new(1).shuffle(&mut v);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
        let mut r = Rng::new(9);
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}

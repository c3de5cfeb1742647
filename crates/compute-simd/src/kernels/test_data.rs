//! Deterministic test inputs shared by the kernel tests (never all zeros).

/// `len` values uniform in `[lo, hi)` from the stream of `seed` ([`compute_core::rng`]).
pub fn uniform(len: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    compute_core::rng::random_vec(len, lo as f64, hi as f64, seed)
}

/// A pool of `threads` threads, for running a kernel on a given thread count.
pub fn pool(threads: usize) -> rayon::ThreadPool {
    match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(p) => p,
        Err(e) => panic!("thread pool: {e}"),
    }
}

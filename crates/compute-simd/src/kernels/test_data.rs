//! Deterministic test inputs shared by the kernel tests (never all zeros).

/// `len` values uniform in `[lo, hi)` from a xorshift stream seeded by `seed`.
pub fn uniform(len: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// A pool of `threads` threads, for running a kernel on a given thread count.
pub fn pool(threads: usize) -> rayon::ThreadPool {
    match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(p) => p,
        Err(e) => panic!("thread pool: {e}"),
    }
}

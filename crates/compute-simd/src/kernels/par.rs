//! Splitting element-wise work and reductions across the current rayon pool.
//!
//! Work goes parallel only above a size threshold and when the pool in scope
//! has more than one thread; it is cut into pieces of [`PAR_CHUNK`] elements
//! that rayon's work stealing balances (element-wise work just above the
//! threshold gets smaller pieces, one per thread, so it splits at all).
//! Reductions of more than `min_len` elements are always cut into the same
//! `PAR_CHUNK` pieces, on one thread or many, so their result does not depend
//! on the thread count.

use std::cell::Cell;

use rayon::prelude::*;

use crate::simd::LANES;
use crate::tuning::PAR_CHUNK;

thread_local! {
    /// Set while [`sequential`] runs on this thread: every kernel then stays on it.
    static SEQUENTIAL: Cell<bool> = const { Cell::new(false) };
}

/// Threads the kernels may use from here: 1 inside [`sequential`], else the
/// size of the rayon pool in scope (the global one outside any pool).
#[inline]
pub fn threads() -> usize {
    if SEQUENTIAL.with(Cell::get) { 1 } else { rayon::current_num_threads().max(1) }
}

/// Runs `f` on the calling thread with every kernel single-threaded, however
/// large its input: a one-thread backend without a pool to hand work to
/// (which costs a thread wake-up, 10–40 µs measured on a VM, per call).
pub fn sequential<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SEQUENTIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SEQUENTIAL.with(|s| s.replace(true)));
    f()
}

/// Whether `len` elements are worth spreading over the current pool.
#[inline]
pub fn worth_splitting(len: usize, min_len: usize) -> bool {
    len >= min_len && threads() > 1
}

/// Piece length for splitting `len` elements of element-wise work over the
/// current pool: [`PAR_CHUNK`], or less so that every thread gets a piece (a
/// multiple of 16 elements, so pieces keep the base's 64-byte alignment).
pub fn piece_len(len: usize) -> usize {
    len.div_ceil(threads()).next_multiple_of(LANES).clamp(LANES, PAR_CHUNK)
}

/// Runs `f(x_piece, out_piece)` over matching pieces of `x` and `out`, in
/// parallel above `min_len` elements. Costs one rayon task per piece.
pub fn zip1(x: &[f32], out: &mut [f32], min_len: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) {
    if worth_splitting(out.len(), min_len) {
        let p = piece_len(out.len());
        out.par_chunks_mut(p).zip(x.par_chunks(p)).for_each(|(o, x)| f(x, o));
    } else {
        f(x, out);
    }
}

/// Runs `f(a_piece, b_piece, out_piece)` over matching pieces, in parallel
/// above `min_len` elements.
pub fn zip2(a: &[f32], b: &[f32], out: &mut [f32], min_len: usize, f: impl Fn(&[f32], &[f32], &mut [f32]) + Sync) {
    if worth_splitting(out.len(), min_len) {
        let p = piece_len(out.len());
        out.par_chunks_mut(p).zip(a.par_chunks(p)).zip(b.par_chunks(p)).for_each(|((o, a), b)| f(a, b, o));
    } else {
        f(a, b, out);
    }
}

/// Partial results of `f` over `PAR_CHUNK` pieces of `x` (one piece when
/// `x.len() < min_len`), in order; parallel when the pool has several threads.
pub fn partials<T: Send>(x: &[f32], min_len: usize, f: impl Fn(&[f32]) -> T + Sync + Send) -> Vec<T> {
    if x.len() < min_len {
        return vec![f(x)];
    }
    if threads() > 1 { x.par_chunks(PAR_CHUNK).map(f).collect() } else { x.chunks(PAR_CHUNK).map(f).collect() }
}

/// Like [`partials`] over matching pieces of `a` and `b`.
pub fn partials2<T: Send>(
    a: &[f32],
    b: &[f32],
    min_len: usize,
    f: impl Fn(&[f32], &[f32]) -> T + Sync + Send,
) -> Vec<T> {
    if a.len() < min_len {
        return vec![f(a, b)];
    }
    if threads() > 1 {
        a.par_chunks(PAR_CHUNK).zip(b.par_chunks(PAR_CHUNK)).map(|(a, b)| f(a, b)).collect()
    } else {
        a.chunks(PAR_CHUNK).zip(b.chunks(PAR_CHUNK)).map(|(a, b)| f(a, b)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_forces_one_thread_and_restores() {
        let pool = crate::kernels::test_data::pool(2);
        pool.install(|| {
            assert_eq!(threads(), 2);
            let inner = sequential(|| (threads(), worth_splitting(1 << 30, 1), sequential(threads)));
            assert_eq!(inner, (1, false, 1));
            assert_eq!(threads(), 2, "restored after the call");
            assert!(worth_splitting(1 << 30, 1));
        });
    }
}

//! Splitting element-wise work and reductions across threads ([`super::fork`]).
//!
//! Work goes parallel only above a size threshold and when the pool in scope
//! has more than one thread; it is cut into pieces of [`PAR_CHUNK`] elements
//! that the calling thread and the pool's threads claim as they get free
//! ([`super::fork`]; element-wise work just above the threshold gets smaller
//! pieces, one per thread, so it splits at all).
//! Reductions of more than `min_len` elements are always cut into the same
//! `PAR_CHUNK` pieces, on one thread or many, so their result does not depend
//! on the thread count.

use std::cell::Cell;

use super::fork;
use crate::simd::LANES;
use crate::tuning::PAR_CHUNK;

thread_local! {
    /// Set while [`sequential`] runs on this thread: every kernel then stays on it.
    static SEQUENTIAL: Cell<bool> = const { Cell::new(false) };
}

/// Threads the kernels may use from here, the caller included: 1 inside
/// [`sequential`], else [`fork::pool_threads`].
#[inline]
pub fn threads() -> usize {
    if SEQUENTIAL.with(Cell::get) { 1 } else { fork::pool_threads() }
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

/// The `i`-th piece of `p` elements of `x` (shorter at the end, empty past it).
pub fn piece(x: &[f32], i: usize, p: usize) -> &[f32] {
    let start = i.saturating_mul(p).min(x.len());
    let rest = x.get(start..).unwrap_or_default();
    rest.get(..p.min(rest.len())).unwrap_or_default()
}

/// Runs `f(x_piece, out_piece)` over matching pieces of `x` and `out`, in
/// parallel above `min_len` elements ([`fork::chunks_mut`]).
pub fn zip1(x: &[f32], out: &mut [f32], min_len: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) {
    if worth_splitting(out.len(), min_len) {
        let p = piece_len(out.len());
        fork::chunks_mut(out, p, |i, o| f(piece(x, i, p), o));
    } else {
        f(x, out);
    }
}

/// Runs `f(a_piece, b_piece, out_piece)` over matching pieces, in parallel
/// above `min_len` elements.
pub fn zip2(a: &[f32], b: &[f32], out: &mut [f32], min_len: usize, f: impl Fn(&[f32], &[f32], &mut [f32]) + Sync) {
    if worth_splitting(out.len(), min_len) {
        let p = piece_len(out.len());
        fork::chunks_mut(out, p, |i, o| f(piece(a, i, p), piece(b, i, p), o));
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
    fork::map(x.len().div_ceil(PAR_CHUNK), |i| f(piece(x, i, PAR_CHUNK)))
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
    fork::map(a.len().div_ceil(PAR_CHUNK), |i| f(piece(a, i, PAR_CHUNK), piece(b, i, PAR_CHUNK)))
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

//! A small SIMD abstraction the non-GEMM kernels are written against once.
//!
//! [`SimdF32`] is a vector of [`LANES`] (16) `f32` with the handful of
//! operations the kernels need. It is implemented for AVX-512F (one `__m512`),
//! AVX2+FMA (two `__m256`) and a portable path on `wide::f32x8` (two of them;
//! SSE2 on x86-64, NEON on aarch64). Every implementation handles 16 lanes, so
//! kernels step through data in blocks of `[f32; 16]` (one cache line) whatever
//! the ISA, and a tail is one zero-padded block run through the same code.
//!
//! A kernel is a [`WithSimd`] task; [`dispatch`] runs it on the path the
//! [`Isa`] names, inside a `#[target_feature]` function so that the generic
//! code is compiled for that instruction set (the crate itself is built for the
//! baseline target). A path this CPU lacks falls back to the next one down.
//!
//! `unsafe` lives only in the two x86 modules: intrinsics are called through a
//! zero-sized token that can only be made after the CPU feature was detected.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod blocks;
pub mod math;
mod portable;

#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub use avx512::Avx512;
pub use portable::Portable;

use crate::isa::Isa;

/// Number of `f32` lanes in one [`SimdF32::V`], on every ISA.
pub const LANES: usize = 16;

/// One block of [`LANES`] floats: the unit kernels load and store.
pub type Block = [f32; LANES];

/// Sixteen `f32` lanes and the operations the kernels use on them. All methods
/// are `#[inline(always)]` and cost one or two instructions unless noted.
///
/// Conventions: comparisons are ordered (false when either side is NaN);
/// [`SimdF32::min`] and [`SimdF32::max`] follow x86 `minps`/`maxps` on every
/// ISA: they return `b` when either operand is NaN or both are zero, so
/// `max(c, x)` propagates a NaN `x`.
pub trait SimdF32: Copy + Send + Sync {
    /// The vector of 16 `f32`.
    type V: Copy;
    /// A lane mask produced by comparisons.
    type M: Copy;

    /// All lanes `x`.
    fn splat(self, x: f32) -> Self::V;
    /// Loads 16 floats (no alignment needed).
    fn load(self, x: &Block) -> Self::V;
    /// Stores 16 floats (no alignment needed).
    fn store(self, out: &mut Block, v: Self::V);
    /// Stores 16 floats bypassing the caches (non-temporal) when `out` is
    /// 64-byte aligned and the ISA has streaming stores, a plain store
    /// otherwise. Call [`SimdF32::fence`] after the last one.
    fn stream(self, out: &mut Block, v: Self::V);
    /// Orders earlier streaming stores before later stores (`sfence`).
    fn fence(self);
    /// Hints that the cache line holding `x` will be read soon (`prefetcht0`;
    /// nothing on the portable path). Never faults.
    fn prefetch(self, x: &Block);
    /// Like [`SimdF32::prefetch`], for data read a while later: into L2 where
    /// that measured faster (`prefetcht1` with AVX-512; see
    /// [`crate::tuning::PREFETCH_L2_FROM`]), else the same as `prefetch`.
    #[inline(always)]
    fn prefetch_l2(self, x: &Block) {
        self.prefetch(x)
    }

    /// Hints that every cache line of `bytes` (any data, seen as bytes)
    /// will be read in a while: into L2 (`prefetcht1`, one per 64 bytes) on
    /// x86-64, nothing on the portable path. Never faults.
    #[inline(always)]
    fn prefetch_bytes(self, bytes: &[u8]) {
        let _ = bytes;
    }

    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`, correctly rounded (about 5–10 cycles of throughput per vector).
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c`, fused (one rounding) where the ISA has FMA; the portable
    /// path on x86-64 without FMA rounds twice.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `√a`, correctly rounded.
    fn sqrt(self, a: Self::V) -> Self::V;
    /// Lane-wise minimum; `b` if either is NaN (x86 semantics).
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum; `b` if either is NaN (x86 semantics).
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `|a|` (clears the sign bit; NaN stays NaN).
    fn abs(self, a: Self::V) -> Self::V;
    /// `x·2ⁿ` for lanes of `n` holding integers with `|n| ≤ 252`, rounded once:
    /// subnormal results and overflow to ±∞ behave as an IEEE multiplication.
    /// (`vscalefps` on AVX-512; two exact power-of-two multiplies elsewhere.)
    fn ldexp(self, x: Self::V, n: Self::V) -> Self::V;
    /// `a` with its low 12 mantissa bits cleared: a 12-bit `hi` part such that
    /// `hi·hi` is exact and `a − hi` is exact (Veltkamp-style split).
    fn split_hi(self, a: Self::V) -> Self::V;
    /// `|mag|` with the sign bit of `sign`.
    fn copysign(self, mag: Self::V, sign: Self::V) -> Self::V;

    /// `a < b` (ordered).
    fn lt(self, a: Self::V, b: Self::V) -> Self::M;
    /// `a > b` (ordered).
    fn gt(self, a: Self::V, b: Self::V) -> Self::M;
    /// `a` is NaN.
    fn is_nan(self, a: Self::V) -> Self::M;
    /// Lanes set in either mask.
    fn or(self, a: Self::M, b: Self::M) -> Self::M;
    /// `m ? t : f` per lane.
    fn select(self, m: Self::M, t: Self::V, f: Self::V) -> Self::V;
    /// Whether any lane of `m` is set.
    fn any(self, m: Self::M) -> bool;

    /// Whether [`SimdF32::lookup32`] is a single instruction (AVX-512
    /// `vpermt2ps`). Elsewhere it goes through memory lane by lane, and
    /// table-driven code should take another route.
    const FAST_LOOKUP: bool = false;
    /// Lane `i` is `table[bits(idx[i]) & 31]`: a lookup in a 32-entry table by
    /// the low five bits of each lane's bit pattern. One instruction on AVX-512
    /// (the table stays in two registers across a loop); a loop through memory
    /// elsewhere (see [`SimdF32::FAST_LOOKUP`]).
    #[inline(always)]
    fn lookup32(self, table: &[f32; 32], idx: Self::V) -> Self::V {
        let mut buf = [0.0f32; LANES];
        self.store(&mut buf, idx);
        for v in &mut buf {
            *v = table[(v.to_bits() & 31) as usize];
        }
        self.load(&buf)
    }

    /// How many vectors the register file holds (32 on AVX-512, 8 on
    /// AVX2, where a vector is two registers): kernels with many
    /// accumulators pick their tile from it.
    const VECTORS: usize = 8;

    /// Sum of the 16 lanes (a short tree; a few instructions).
    fn reduce_add(self, v: Self::V) -> f32;
    /// Sixteen sums at once: lane `i` of the result is the sum of the lanes
    /// of `v[i]`. A transposing tree on AVX-512 (30 shuffles and 15 adds)
    /// and AVX2 (58 instructions), against about 8 per vector for
    /// [`SimdF32::reduce_add`]; one [`SimdF32::reduce_add`] per vector on
    /// the portable path. Each lane's sum is a tree of the same shape on one
    /// ISA, but the order of its additions may differ from `reduce_add`'s.
    #[inline(always)]
    fn reduce_add16(self, v: [Self::V; LANES]) -> Self::V {
        let mut out = [0.0f32; LANES];
        for (o, x) in out.iter_mut().zip(v) {
            *o = self.reduce_add(x);
        }
        self.load(&out)
    }
    /// Largest lane, ignoring the NaN question (callers track NaN separately).
    fn reduce_max(self, v: Self::V) -> f32;
}

/// A lane-wise function of `N` vectors: the per-block work of the loops in
/// [`blocks`]. Implementations must mark [`LaneFn::apply`] `#[inline(always)]`:
/// the loops are compiled inside each ISA's `#[target_feature]` entry, and only
/// forced inlining guarantees the vector code lands there (a closure big enough
/// to be outlined is compiled without the features and pays a call per intrinsic).
pub trait LaneFn<S: SimdF32, const N: usize> {
    /// Applies the function to one vector of each input.
    fn apply(&self, s: S, v: [S::V; N]) -> S::V;
}

/// A kernel that can run on any [`SimdF32`] implementation. Implementations of
/// [`WithSimd::run`] must be `#[inline(always)]` so they are compiled inside the
/// `#[target_feature]` entry of each ISA.
pub trait WithSimd {
    /// What the kernel returns.
    type Output;
    /// Runs the kernel with the vector type `S`.
    fn run<S: SimdF32>(self, s: S) -> Self::Output;
}

/// Runs `task` on the path `isa` names; a path this CPU (or target) lacks falls
/// back to AVX2 and then to the portable path. Costs one cached feature check.
#[inline]
pub fn dispatch<T: WithSimd>(isa: Isa, task: T) -> T::Output {
    #[cfg(target_arch = "x86_64")]
    let task = match isa {
        Isa::Avx512 => match avx512::run(task) {
            Ok(out) => return out,
            Err(task) => match avx2::run(task) {
                Ok(out) => return out,
                Err(task) => task,
            },
        },
        Isa::Avx2 => match avx2::run(task) {
            Ok(out) => return out,
            Err(task) => task,
        },
        Isa::Neon | Isa::Portable => task,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    task.run(Portable)
}

/// `prefetcht1` on every 64-byte line `bytes` touches (the x86-64 paths'
/// [`SimdF32::prefetch_bytes`]). Never faults.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines_l2(bytes: &[u8]) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    for line in bytes.chunks(64) {
        // SAFETY: prefetching is part of SSE, which every x86-64 CPU has,
        // and never faults; the pointer comes from a reference anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) }
    }
    // A range that starts inside a line may end in one more.
    if let Some(last) = bytes.last()
        && !(bytes.as_ptr() as usize).is_multiple_of(64)
    {
        // SAFETY: as above.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(std::ptr::from_ref(last).cast()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`SimdF32::reduce_add16`] of `v`, and [`SimdF32::reduce_add`] of each vector.
    struct Sums<'a>(&'a [Block; LANES]);

    impl WithSimd for Sums<'_> {
        type Output = (Block, Block);
        #[inline(always)]
        fn run<S: SimdF32>(self, s: S) -> (Block, Block) {
            let mut v = [s.splat(0.0); LANES];
            for (x, b) in v.iter_mut().zip(self.0) {
                *x = s.load(b);
            }
            let mut all = [0.0; LANES];
            s.store(&mut all, s.reduce_add16(v));
            let mut one = [0.0; LANES];
            for (o, &x) in one.iter_mut().zip(&v) {
                *o = s.reduce_add(x);
            }
            (all, one)
        }
    }

    #[test]
    fn sixteen_sums_at_once_put_each_sum_in_its_lane() {
        // Small integers: every order of additions gives the exact sum.
        let mut v = [[0.0f32; LANES]; LANES];
        for (i, row) in v.iter_mut().enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = ((i * 37 + j * 11) % 23) as f32 - 11.0 + if j == i { 1000.0 * i as f32 } else { 0.0 };
            }
        }
        for isa in Isa::available() {
            let (all, one) = dispatch(isa, Sums(&v));
            for (i, row) in v.iter().enumerate() {
                let want: f32 = row.iter().sum();
                assert_eq!(all[i], want, "{isa} lane {i}");
                assert_eq!(one[i], want, "{isa} lane {i}");
            }
        }
    }
}

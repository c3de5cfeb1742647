//! Reductions: sum, max, dot. Each is one streaming read with four
//! independent 16-lane accumulators (64 partial sums, restarted every
//! [`crate::simd::blocks::FOLD_SPAN`] elements), so it runs at read bandwidth
//! and its rounding error grows like `√(len/64)` rather than `len`.
//!
//! Above [`PAR_REDUCE_MIN`] elements the input is cut into
//! [`crate::tuning::PAR_CHUNK`] pieces whose partial results are combined in
//! order (in `f64` for sums): the result is the same on one thread or many.

use super::par;
use crate::isa::Isa;
use crate::simd::{LaneFn, SimdF32, WithSimd, blocks, dispatch};
use crate::tuning::PAR_REDUCE_MIN;

/// Sum of `x` (0 for an empty slice). One pass at read bandwidth.
pub fn sum(isa: Isa, x: &[f32]) -> f32 {
    let parts = par::partials(x, PAR_REDUCE_MIN, |x| dispatch(isa, Sum { x }));
    parts.iter().map(|&p| p as f64).sum::<f64>() as f32
}

/// Largest element of `x`; NaN if any element is NaN; −∞ for an empty slice.
/// One pass at read bandwidth.
pub fn max(isa: Isa, x: &[f32]) -> f32 {
    let parts = par::partials(x, PAR_REDUCE_MIN, |x| dispatch(isa, Max { x }));
    parts.into_iter().fold(f32::NEG_INFINITY, |m, p| if m.is_nan() || p.is_nan() { f32::NAN } else { m.max(p) })
}

/// `Σ a[i]·b[i]` over the shorter length (the backend validates that they are
/// equal), with fused multiply-adds. One pass over both inputs.
pub fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (a.split_at(n).0, b.split_at(n).0);
    let parts = par::partials2(a, b, PAR_REDUCE_MIN, |a, b| dispatch(isa, Dot { a, b }));
    parts.iter().map(|&p| p as f64).sum::<f64>() as f32
}

struct Sum<'a> {
    x: &'a [f32],
}

impl WithSimd for Sum<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) -> f32 {
        s.reduce_add(blocks::fold1(s, self.x, 0.0, s.splat(0.0), &[], &blocks::Add, &blocks::Add))
    }
}

struct Max<'a> {
    x: &'a [f32],
}

impl WithSimd for Max<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) -> f32 {
        blocks::max_of(s, self.x)
    }
}

struct Dot<'a> {
    a: &'a [f32],
    b: &'a [f32],
}

/// `acc + a·b`, fused.
struct MulAdd;

impl<S: SimdF32> LaneFn<S, 3> for MulAdd {
    #[inline(always)]
    fn apply(&self, s: S, [acc, a, b]: [S::V; 3]) -> S::V {
        s.fma(a, b, acc)
    }
}

impl WithSimd for Dot<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) -> f32 {
        s.reduce_add(blocks::fold2(s, self.a, self.b, 0.0, s.splat(0.0), &MulAdd, &blocks::Add))
    }
}

#[cfg(test)]
mod tests;

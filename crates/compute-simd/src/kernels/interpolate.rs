//! Interpolation: lerp (element-wise) and slerp (row-wise), on `f32` and,
//! through [`slerp_typed`] and the staged element-wise path of
//! [`crate::halves`], on `f16`/`bf16` (computed in `f32`, rounded once).
//!
//! - lerp: one pass, 12 bytes per `f32` element, split across the pool above
//!   [`PAR_ELEMENTWISE_MIN`] elements and streamed from [`STREAM_MIN`] on, as
//!   the binary ops are. `t < 0.5` computes `fma(t, b − a, a)`, else
//!   `fma(t − 1, b − a, b)`: exact at both ends.
//! - slerp: per row, one pass folding `‖a‖²`, `‖b‖²` and `⟨a, b⟩` (four
//!   vector accumulators each, as the reductions), the row's case and
//!   coefficients decided in `f64` by [`reference::slerp_row`] (the op's
//!   documented rules, so the CPU takes the reference's branch on every row),
//!   then one pass writing `p·a + q·b` (or the lerp). Rows are spread over
//!   the pool above [`PAR_ROWS_MIN`] elements, about [`PAR_CHUNK`] elements
//!   of whole rows per task.

use compute_core::reference::{self, SlerpRow};
use compute_core::{Element, HostSlice};

use super::{fork, par};
use crate::halves::convert;
use crate::isa::Isa;
use crate::simd::{LaneFn, SimdF32, WithSimd, blocks, dispatch};
use crate::tuning::{PAR_CHUNK, PAR_ELEMENTWISE_MIN, PAR_ROWS_MIN, STREAM_MIN};

/// `out[i] = a[i] + t·(b[i] − a[i])` over the shortest length (the backend
/// validates that they are equal). Memory-bound: one pass.
pub fn lerp(isa: Isa, t: f32, a: &[f32], b: &[f32], out: &mut [f32]) {
    let n = a.len().min(b.len()).min(out.len());
    let (a, b, out) = (a.split_at(n).0, b.split_at(n).0, out.split_at_mut(n).0);
    let stream = n >= STREAM_MIN;
    par::zip2(a, b, out, PAR_ELEMENTWISE_MIN, |a, b, out| dispatch(isa, Lerp { t, a, b, out, stream }));
}

struct Lerp<'a> {
    t: f32,
    a: &'a [f32],
    b: &'a [f32],
    out: &'a mut [f32],
    stream: bool,
}

impl WithSimd for Lerp<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Lerp { t, a, b, out, stream } = self;
        lerp_lanes(s, t, a, b, out, stream);
        if stream {
            s.fence();
        }
    }
}

/// The lerp of one slice, without a fence.
#[inline(always)]
fn lerp_lanes<S: SimdF32>(s: S, t: f32, a: &[f32], b: &[f32], out: &mut [f32], stream: bool) {
    if t < 0.5 {
        blocks::map2(s, a, b, out, stream, &LerpFn::<false>(t));
    } else {
        // t − 1 is exact for t in [0.5, 2].
        blocks::map2(s, a, b, out, stream, &LerpFn::<true>(t - 1.0));
    }
}

/// `fma(c, b − a, a)`, or `fma(c, b − a, b)` with `FROM_B`.
#[derive(Clone, Copy, Debug)]
struct LerpFn<const FROM_B: bool>(f32);

impl<S: SimdF32, const FROM_B: bool> LaneFn<S, 2> for LerpFn<FROM_B> {
    #[inline(always)]
    fn apply(&self, s: S, [a, b]: [S::V; 2]) -> S::V {
        let d = s.sub(b, a);
        s.fma(s.splat(self.0), d, if FROM_B { b } else { a })
    }
}

/// `p·a + q·b`.
#[derive(Clone, Copy, Debug)]
struct Arc(f32, f32);

impl<S: SimdF32> LaneFn<S, 2> for Arc {
    #[inline(always)]
    fn apply(&self, s: S, [a, b]: [S::V; 2]) -> S::V {
        s.fma(s.splat(self.0), a, s.mul(s.splat(self.1), b))
    }
}

/// `acc + a·b`: the step of the row sums.
#[derive(Clone, Copy, Debug)]
struct MulAdd;

impl<S: SimdF32> LaneFn<S, 3> for MulAdd {
    #[inline(always)]
    fn apply(&self, s: S, [acc, a, b]: [S::V; 3]) -> S::V {
        s.fma(a, b, acc)
    }
}

/// Slerp of the rows of `a` and `b` (`rows × cols` each) into `out`, with
/// `t` in `[0, 1]` (validated by the backend, as the lengths are; short
/// slices leave the rows they miss unwritten instead of panicking).
pub fn slerp(isa: Isa, t: f32, rows: usize, cols: usize, a: &[f32], b: &[f32], out: &mut [f32]) {
    if cols == 0 {
        return;
    }
    let total = rows.saturating_mul(cols).min(a.len()).min(b.len()).min(out.len());
    let total = total - total % cols;
    let (a, b, out) = (a.split_at(total).0, b.split_at(total).0, out.split_at_mut(total).0);
    let stream = total >= STREAM_MIN;
    let task = |a: &[f32], b: &[f32], out: &mut [f32]| dispatch(isa, Slerp { t, cols, a, b, out, stream });
    let rows = total / cols;
    if rows > 1 && par::worth_splitting(total, PAR_ROWS_MIN) {
        let per_task = (PAR_CHUNK / cols).min(rows.div_ceil(par::threads())).max(1);
        let piece = per_task * cols;
        fork::chunks_mut(out, piece, |i, o| task(par::piece(a, i, piece), par::piece(b, i, piece), o));
    } else {
        task(a, b, out);
    }
}

struct Slerp<'a> {
    t: f32,
    cols: usize,
    a: &'a [f32],
    b: &'a [f32],
    out: &'a mut [f32],
    stream: bool,
}

impl WithSimd for Slerp<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Slerp { t, cols, a, b, out, stream } = self;
        // Plain loops, not closures: closures may be compiled outside the ISA entry.
        for ((a, b), out) in a.chunks_exact(cols).zip(b.chunks_exact(cols)).zip(out.chunks_exact_mut(cols)) {
            let (na2, nb2, dot) = (row_dot(s, a, a), row_dot(s, b, b), row_dot(s, a, b));
            match reference::slerp_row(f64::from(na2), f64::from(nb2), f64::from(dot), f64::from(t)) {
                SlerpRow::Lerp => lerp_lanes(s, t, a, b, out, stream),
                SlerpRow::Nan => out.fill(f32::NAN),
                SlerpRow::Arc { .. } if t == 0.0 => out.copy_from_slice(a),
                SlerpRow::Arc { .. } if t == 1.0 => out.copy_from_slice(b),
                SlerpRow::Arc { p, q, .. } => blocks::map2(s, a, b, out, stream, &Arc(p as f32, q as f32)),
            }
        }
        if stream {
            s.fence();
        }
    }
}

/// `Σ x·y` over a row, in `f32` (four vector accumulators).
#[inline(always)]
fn row_dot<S: SimdF32>(s: S, x: &[f32], y: &[f32]) -> f32 {
    s.reduce_add(blocks::fold2(s, x, y, 0.0, s.splat(0.0), &MulAdd, &blocks::Add))
}

/// Slerp of `f16`/`bf16` (or `f32`) rows into `out` of `T`: groups of whole
/// rows (about [`PAR_CHUNK`] values, in parallel when there are several)
/// widened into a per-thread scratch, run through [`slerp`] on that thread
/// and rounded once into `out`. No allocation beyond the scratch, which is
/// kept between calls.
pub fn slerp_typed<T: Element>(isa: Isa, t: f32, cols: usize, inputs: &[HostSlice<'_>], out: &mut [T]) {
    let (Some(&a), Some(&b)) = (inputs.first(), inputs.get(1)) else { return };
    if cols == 0 {
        return;
    }
    let group = (PAR_CHUNK / cols).max(1);
    let run_group = |g: usize, out: &mut [T]| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.take();
            let n = out.len();
            scratch.resize(3 * n, 0.0);
            let (xa, rest) = scratch.split_at_mut(n);
            let (xb, ys) = rest.split_at_mut(n);
            let at = g * group * cols;
            widen_range(isa, a, at, xa);
            widen_range(isa, b, at, xb);
            par::sequential(|| slerp(isa, t, n / cols, cols, xa, xb, ys));
            convert::narrow(isa, ys, out);
            cell.replace(scratch);
        })
    };
    fork::chunks_mut(out, group * cols, run_group);
}

/// `dst` = `src[at..at + dst.len()]` widened to `f32` (NaN where `src` is
/// too short or of another dtype: validation makes that unreachable).
fn widen_range(isa: Isa, src: HostSlice<'_>, at: usize, dst: &mut [f32]) {
    let r = at..at + dst.len();
    match src {
        HostSlice::F32(s) if s.len() >= r.end => dst.copy_from_slice(&s[r]),
        HostSlice::F16(s) if s.len() >= r.end => convert::widen(isa, &s[r], dst),
        HostSlice::BF16(s) if s.len() >= r.end => convert::widen(isa, &s[r], dst),
        _ => dst.fill(f32::NAN),
    }
}

thread_local! {
    /// Each thread's staging buffer for [`slerp_typed`] (three groups of
    /// rows: `a`, `b`, the `f32` result), kept between calls.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute_core::conformance::rng::Rng;

    /// Every ISA the machine has gives the reference within the op's
    /// tolerance, at the ends exactly, in parallel and not.
    #[test]
    fn lerp_and_slerp_match_the_reference_on_every_isa() {
        let mut rng = Rng::new(11);
        for isa in Isa::available() {
            for t in [0.0f32, 0.2, 0.5, 0.7, 1.0, 1.6, -0.4] {
                let n = 70_001;
                let (a, b) = (rng.vec(n, -3.0, 3.0), rng.vec(n, -3.0, 3.0));
                let mut out = vec![f32::NAN; n];
                lerp(isa, t, &a, &b, &mut out);
                let op = compute_core::Op::lerp(n, t);
                assert_eq!(compute_core::conformance::compare(&op, &[&a, &b], &out, 1.0), None, "{isa:?} {t}");
                if t == 0.0 {
                    assert_eq!(out, a);
                }
            }
            for (rows, cols, t) in [(3, 5, 0.3f32), (40, 1000, 0.6), (1, 33, 0.0), (5, 17, 1.0)] {
                let (a, b) = (rng.vec(rows * cols, -1.0, 1.0), rng.vec(rows * cols, -1.0, 1.0));
                let mut out = vec![f32::NAN; rows * cols];
                slerp(isa, t, rows, cols, &a, &b, &mut out);
                let op = compute_core::Op::slerp(rows, cols, t);
                assert_eq!(compute_core::conformance::compare(&op, &[&a, &b], &out, 1.0), None, "{isa:?}");
            }
        }
    }
}

//! Row-wise ops: softmax, log_softmax, layer_norm, rms_norm. Each row is
//! handled by one task in a few vectorised passes that stay in cache for rows
//! up to L2 size; rows are spread over the pool (several rows per task, about
//! [`PAR_CHUNK`] elements, at least one task per thread) above [`PAR_ROWS_MIN`]
//! elements in total. The pass
//! that writes the final output uses streaming stores from [`STREAM_MIN`]
//! elements on.
//!
//! - softmax: max (of the non-NaN elements: a NaN spreads through the sum),
//!   then `eˣ⁻ᵐᵃˣ` written out (or, when
//!   streaming, to a row scratch in cache) while summed, then a scale by `1/Σ`:
//!   reads `x` twice (the second time from cache).
//! - log_softmax: max, `Σ eˣ⁻ᵐᵃˣ`, then `(x − max) − ln Σ`.
//! - layer_norm: two-pass mean and variance (`Σ(x − mean)²`, accurate when
//!   `|mean| ≫ std`), then `(x − mean)·inv·γ + β`.
//! - rms_norm: `Σx²`, then `x·inv·γ`.

use compute_core::RowOp;

use super::par;
use crate::isa::Isa;
use crate::simd::{LaneFn, SimdF32, WithSimd, blocks, dispatch, math};
use crate::tuning::{PAR_CHUNK, PAR_ROWS_MIN, STREAM_MIN};

/// Runs a row op on `x` (`rows × cols`, `inputs[0]`) with its parameter
/// vectors (`gamma` = `inputs[1]`, `beta` = `inputs[2]`, each `cols` long)
/// into `out` (`rows × cols`). Shapes are validated by the backend; missing or
/// short inputs leave the rows they cover unwritten instead of panicking.
pub fn run(isa: Isa, op: RowOp, rows: usize, cols: usize, inputs: &[&[f32]], out: &mut [f32]) {
    let Some(&x) = inputs.first() else { return };
    if cols == 0 {
        return;
    }
    let gamma = inputs.get(1).copied().unwrap_or(&[]);
    let beta = inputs.get(2).copied().unwrap_or(&[]);
    let needed = match op {
        RowOp::Softmax | RowOp::LogSoftmax => 0,
        RowOp::RmsNorm { .. } => gamma.len(),
        RowOp::LayerNorm { .. } => gamma.len().min(beta.len()),
    };
    if matches!(op, RowOp::LayerNorm { .. } | RowOp::RmsNorm { .. }) && needed < cols {
        return;
    }
    let total = rows.saturating_mul(cols).min(x.len()).min(out.len());
    let (x, out) = (x.split_at(total).0, out.split_at_mut(total).0);
    let stream = total >= STREAM_MIN;
    let task = |x: &[f32], out: &mut [f32]| dispatch(isa, Rows { op, cols, x, gamma, beta, out, stream });
    if rows > 1 && par::worth_splitting(total, PAR_ROWS_MIN) {
        // About PAR_CHUNK elements of whole rows per task, fewer rows when that
        // would leave a thread without work.
        let per_task = (PAR_CHUNK / cols).min(rows.div_ceil(par::threads())).max(1);
        let piece = per_task * cols;
        super::fork::chunks_mut(out, piece, |i, o| task(par::piece(x, i, piece), o));
    } else {
        task(x, out);
    }
}

struct Rows<'a> {
    op: RowOp,
    cols: usize,
    x: &'a [f32],
    gamma: &'a [f32],
    beta: &'a [f32],
    out: &'a mut [f32],
    stream: bool,
}

impl WithSimd for Rows<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Rows { op, cols, x, gamma, beta, out, stream } = self;
        // With streaming stores, softmax stages e^(x − max) in a row-sized
        // scratch that stays in cache, instead of writing `out` twice (which
        // would cost a read-for-ownership of every output line from memory).
        let mut scratch = if stream && op == RowOp::Softmax { vec![0.0f32; cols] } else { Vec::new() };
        // Plain loops, not closures: closures may be compiled outside the ISA
        // entry. The compute-heavy pass of each row prefetches the next row.
        let mut rows = x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)).peekable();
        while let Some((x, out)) = rows.next() {
            let ahead = rows.peek().map_or(&[][..], |(next, _)| *next);
            match op {
                RowOp::Softmax => softmax(s, x, out, &mut scratch, ahead, stream),
                RowOp::LogSoftmax => log_softmax(s, x, out, ahead, stream),
                RowOp::LayerNorm { eps } => layer_norm(s, x, gamma, beta, eps, out, ahead, stream),
                RowOp::RmsNorm { eps } => rms_norm(s, x, gamma, eps, out, stream),
            }
        }
        // One fence for every row's streaming stores (see `blocks`).
        if stream {
            s.fence();
        }
    }
}

/// Sum of `step` over the row, in `f64` after the vector accumulators.
#[inline(always)]
fn row_sum<S: SimdF32>(s: S, x: &[f32], pad: f32, ahead: &[f32], step: &impl LaneFn<S, 2>) -> f64 {
    s.reduce_add(blocks::fold1(s, x, pad, s.splat(0.0), ahead, step, &blocks::Add)) as f64
}

/// Softmax of one row. `scratch` is either empty (then `out` holds the
/// exponentials between passes) or `cols` long (used with `stream`).
#[inline(always)]
fn softmax<S: SimdF32>(s: S, x: &[f32], out: &mut [f32], scratch: &mut [f32], ahead: &[f32], stream: bool) {
    let m = s.splat(max_ignoring_nan(s, x));
    if scratch.len() == x.len() {
        let sum = s.reduce_add(blocks::map1_sum(s, x, scratch, f32::NEG_INFINITY, ahead, &ExpMinus(m)));
        blocks::map1(s, scratch, out, stream, &Times(s.splat((1.0 / sum as f64) as f32)));
    } else {
        let sum = s.reduce_add(blocks::map1_sum(s, x, out, f32::NEG_INFINITY, ahead, &ExpMinus(m)));
        blocks::map_in_place(s, out, stream, &Times(s.splat((1.0 / sum as f64) as f32)));
    }
}

#[inline(always)]
fn log_softmax<S: SimdF32>(s: S, x: &[f32], out: &mut [f32], ahead: &[f32], stream: bool) {
    let m = s.splat(max_ignoring_nan(s, x));
    let sum = row_sum(s, x, f32::NEG_INFINITY, ahead, &AddExpMinus(m));
    blocks::map1(s, x, out, stream, &MinusMinus(m, s.splat(sum.ln() as f32)));
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn layer_norm<S: SimdF32>(
    s: S,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    out: &mut [f32],
    ahead: &[f32],
    stream: bool,
) {
    let n = x.len() as f64;
    let mean = (row_sum(s, x, 0.0, &[], &blocks::Add) / n) as f32;
    let mv = s.splat(mean);
    let var = row_sum(s, x, mean, ahead, &AddSquaredDeviation(mv)) / n;
    let inv = s.splat((1.0 / (var + eps as f64).sqrt()) as f32);
    blocks::map3(s, x, gamma, beta, out, stream, &Normalize(mv, inv));
}

#[inline(always)]
fn rms_norm<S: SimdF32>(s: S, x: &[f32], gamma: &[f32], eps: f32, out: &mut [f32], stream: bool) {
    let ms = row_sum(s, x, 0.0, &[], &AddSquare) / x.len() as f64;
    let inv = s.splat((1.0 / (ms + eps as f64).sqrt()) as f32);
    blocks::map2(s, x, gamma, out, stream, &ScaleBy(inv));
}

/// Largest element of `x` that is not NaN (−∞ if none): one `max` per block,
/// against [`blocks::max_of`]'s three. Enough for the shift of softmax and
/// log_softmax: a NaN in the row makes its `e^(x − max)` NaN, hence the sum
/// and every output, whatever the max.
#[inline(always)]
fn max_ignoring_nan<S: SimdF32>(s: S, x: &[f32]) -> f32 {
    let ninf = f32::NEG_INFINITY;
    s.reduce_max(blocks::fold1(s, x, ninf, s.splat(ninf), &[], &MaxIgnoringNan, &MaxIgnoringNan))
}

/// `max(acc, v)`, dropping a NaN `v` (`max(v, acc)` returns `acc` then).
struct MaxIgnoringNan;
impl<S: SimdF32> LaneFn<S, 2> for MaxIgnoringNan {
    #[inline(always)]
    fn apply(&self, s: S, [acc, v]: [S::V; 2]) -> S::V {
        s.max(v, acc)
    }
}

/// `e^(v − m)`.
struct ExpMinus<V>(V);
impl<S: SimdF32> LaneFn<S, 1> for ExpMinus<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [v]: [S::V; 1]) -> S::V {
        math::exp_nonpositive(s, s.sub(v, self.0))
    }
}

/// `acc + e^(v − m)`.
struct AddExpMinus<V>(V);
impl<S: SimdF32> LaneFn<S, 2> for AddExpMinus<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [acc, v]: [S::V; 2]) -> S::V {
        s.add(acc, math::exp_nonpositive(s, s.sub(v, self.0)))
    }
}

/// `v·k`.
struct Times<V>(V);
impl<S: SimdF32> LaneFn<S, 1> for Times<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [v]: [S::V; 1]) -> S::V {
        s.mul(v, self.0)
    }
}

/// `(v − m) − l`.
struct MinusMinus<V>(V, V);
impl<S: SimdF32> LaneFn<S, 1> for MinusMinus<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [v]: [S::V; 1]) -> S::V {
        s.sub(s.sub(v, self.0), self.1)
    }
}

/// `acc + (v − mean)²`.
struct AddSquaredDeviation<V>(V);
impl<S: SimdF32> LaneFn<S, 2> for AddSquaredDeviation<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [acc, v]: [S::V; 2]) -> S::V {
        let d = s.sub(v, self.0);
        s.fma(d, d, acc)
    }
}

/// `acc + v²`.
struct AddSquare;
impl<S: SimdF32> LaneFn<S, 2> for AddSquare {
    #[inline(always)]
    fn apply(&self, s: S, [acc, v]: [S::V; 2]) -> S::V {
        s.fma(v, v, acc)
    }
}

/// `(v − mean)·inv·γ + β`.
struct Normalize<V>(V, V);
impl<S: SimdF32> LaneFn<S, 3> for Normalize<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [v, g, b]: [S::V; 3]) -> S::V {
        s.fma(s.mul(s.sub(v, self.0), self.1), g, b)
    }
}

/// `v·inv·γ`.
struct ScaleBy<V>(V);
impl<S: SimdF32> LaneFn<S, 2> for ScaleBy<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [v, g]: [S::V; 2]) -> S::V {
        s.mul(s.mul(v, self.0), g)
    }
}

#[cfg(test)]
mod tests;

//! Row ops (softmax, log_softmax, layer_norm, rms_norm) on `f16` and `bf16`
//! rows, on AVX-512 (F, BW, VL, DQ): each row is read in place, 16 values per
//! step widened in registers, and each result is rounded once as it is
//! stored. No `f32` copy of the input. Passes: rms_norm two (sum of squares,
//! scale); layer_norm two (`Σ(x − p)` and `Σ(x − p)²` around a pivot `p`, the
//! mean of the row's first 16 values, then normalise), with a third pass
//! around the mean for a row whose mean lies more than two standard
//! deviations from `p`, where the one-pass variance would cancel; softmax
//! three (max; `e^(x − max)` summed and staged in an `f32` row scratch; scale)
//! and log_softmax three (max, sum, subtract). The passes after the first
//! read the row from cache. Sums use four vector accumulators, added in `f64`
//! at the end of the row.
//!
//! **Accuracy.** As the `f32` kernels' except the exponential of softmax and
//! log_softmax, which is the transcendentals' `2ᵗ` (relative error 2.9e-6,
//! within the conformance suite's `1e-5` for these ops; the row's `−max`
//! enters its FMA as one rounded constant, whose error scales every term
//! alike and cancels in softmax's division and is subtracted in
//! log_softmax's logarithm),
//! and layer_norm's one-pass variance, which loses at most a factor 9 of the
//! `f32` sums' relative accuracy: the result is rounded to 8 or 11
//! significant bits.
//!
//! **Cost.** One pass over the half row from memory, the others from L1 (a
//! row of 4096 halves is 8 KiB), plus the output; about 1 (rms_norm) to 10
//! (softmax) vector instructions per 16 values and pass. The last pass asks
//! the next row's lines into L1 as it writes, so the next row's first pass
//! reads from cache (layer_norm 13–19 % faster on a Zen 4 VM; see the
//! benchmarks page).

use compute_core::{Element, HostSlice, RowOp};

use crate::isa::Isa;

/// `op` over the whole rows of `x` (`cols` each) into `out`, with the
/// parameter vectors already widened (`params[0]` = γ, `params[1]` = β),
/// when this CPU has AVX-512F, BW, VL and DQ and `x` and `out` are both `f16` or
/// both `bf16`; `scratch` is softmax's row buffer (grown to `cols`). With
/// `stream`, outputs are written with non-temporal stores where 32-byte
/// aligned (ending with `sfence`). Returns false, having written nothing,
/// otherwise.
#[allow(clippy::too_many_arguments)]
pub fn fused<T: Element>(
    isa: Isa,
    op: RowOp,
    cols: usize,
    x: HostSlice<'_>,
    params: &[&[f32]],
    out: &mut [T],
    scratch: &mut Vec<f32>,
    stream: bool,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512
        && cols > 0
        && let Some(tok) = super::avx512::Tok::detect()
        && tok.bw_vl
        && tok.dq
    {
        let Some((x, out, f16)) = super::avx512::half_bits(x, out) else { return false };
        let needed = match op {
            RowOp::Softmax | RowOp::LogSoftmax => 0,
            RowOp::RmsNorm { .. } => 1,
            RowOp::LayerNorm { .. } => 2,
        };
        if params.len() < needed || params.iter().take(needed).any(|p| p.len() < cols) {
            return false;
        }
        if op == RowOp::Softmax && scratch.len() < cols {
            scratch.resize(cols, 0.0);
        }
        let narrow = super::avx512::Narrow::new(tok, f16);
        let rows = x.len().min(out.len()) / cols;
        let (x, out) = (&x[..rows * cols], &mut out[..rows * cols]);
        x86::run(x86::Job { op, cols, x, params, out, scratch, narrow, stream }, tok.z);
        return true;
    }
    let _ = (isa, op, cols, x, params, out, scratch, stream);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use compute_core::RowOp;

    use super::super::avx512::{
        EXP2_T_MIN, LOG2E, Narrow, Zmm, exp2_above_half, lanes, load, load_part, splat, store, store_part, zmm,
    };

    /// How far (in squared standard deviations) the pivot of layer_norm's
    /// one-pass sums may sit from the row's mean: up to it the variance
    /// `Σ(x − p)²/n − (mean − p)²` loses at most a factor 9 of the sums'
    /// relative accuracy (f32 sums of at most `cols/64` terms per lane).
    const WELL_CENTRED: f64 = 4.0;

    /// The sum of the four accumulators' lanes, in `f64`.
    #[inline(always)]
    fn total(z: Zmm, a: [__m512; 4]) -> f64 {
        let _ = z;
        f64::from(zmm!(_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])))))
    }

    /// What a reduction pass adds up.
    #[derive(Clone, Copy, PartialEq)]
    enum Moment {
        /// `Σ x²`.
        SumSq,
        /// `Σ (x − shift)²`.
        Squares(f32),
    }

    /// `acc` plus the moment's term of `v` (lanes outside `k` count 0; they
    /// hold 0).
    #[inline(always)]
    fn add_term(z: Zmm, m: Moment, acc: __m512, v: __m512, k: __mmask16) -> __m512 {
        match m {
            Moment::SumSq => zmm!(_mm512_fmadd_ps(v, v, acc)),
            Moment::Squares(shift) => zmm!({
                let d = _mm512_maskz_sub_ps(k, v, splat(z, shift));
                _mm512_fmadd_ps(d, d, acc)
            }),
        }
    }

    /// The moment over the row (four accumulators, then `f64`).
    #[inline(always)]
    fn moment(z: Zmm, x: &[u16], f16: bool, m: Moment) -> f64 {
        let mut a = [splat(z, 0.0); 4];
        let (blocks, tail) = x.as_chunks::<16>();
        let (quads, rest) = blocks.as_chunks::<4>();
        for q in quads {
            for (acc, b) in a.iter_mut().zip(q) {
                *acc = add_term(z, m, *acc, load(z, b, f16), 0xffff);
            }
        }
        for b in rest {
            a[0] = add_term(z, m, a[0], load(z, b, f16), 0xffff);
        }
        if !tail.is_empty() {
            a[1] = add_term(z, m, a[1], load_part(z, tail, f16), lanes(tail.len()));
        }
        total(z, a)
    }

    /// The mean of the row's first (up to) 16 values rounded to the row's
    /// dtype: the shift of [`shifted_sums`], near the row's mean for most
    /// rows. On the dtype's grid, `x − p` is exact for values near `p` and has
    /// no low bits of its own (a shift with more bits than the values would
    /// bias the rounding of every term the same way).
    #[inline(always)]
    fn pivot(z: Zmm, x: &[u16], f16: bool) -> f32 {
        let n = x.len().min(16);
        let v = match x.first_chunk::<16>() {
            Some(b) => load(z, b, f16),
            None => load_part(z, x, f16),
        };
        let p = zmm!(_mm512_reduce_add_ps(v)) / n as f32;
        if f16 { compute_core::f16::from_f32(p).to_f32() } else { compute_core::bf16::from_f32(p).to_f32() }
    }

    /// `Σ (x − p)` and `Σ (x − p)²` over the row in one pass (four pairs of
    /// accumulators, then `f64`).
    #[inline(always)]
    fn shifted_sums(z: Zmm, x: &[u16], f16: bool, p: f32) -> (f64, f64) {
        let ps = splat(z, p);
        let mut a = [splat(z, 0.0); 4];
        let mut b = [splat(z, 0.0); 4];
        let step = |a: &mut __m512, b: &mut __m512, v: __m512, k: __mmask16| {
            let d = zmm!(_mm512_maskz_sub_ps(k, v, ps));
            *a = zmm!(_mm512_add_ps(*a, d));
            *b = zmm!(_mm512_fmadd_ps(d, d, *b));
        };
        let (blocks, tail) = x.as_chunks::<16>();
        let (quads, rest) = blocks.as_chunks::<4>();
        for q in quads {
            for ((a, b), v) in a.iter_mut().zip(b.iter_mut()).zip(q) {
                step(a, b, load(z, v, f16), 0xffff);
            }
        }
        for v in rest {
            step(&mut a[0], &mut b[0], load(z, v, f16), 0xffff);
        }
        if !tail.is_empty() {
            step(&mut a[1], &mut b[1], load_part(z, tail, f16), lanes(tail.len()));
        }
        (total(z, a), total(z, b))
    }

    /// The largest value of the row that is not NaN (−∞ if none):
    /// `max(v, acc)` returns `acc` when `v` is NaN.
    #[inline(always)]
    fn max_ignoring_nan(z: Zmm, x: &[u16], f16: bool) -> f32 {
        let mut a = [splat(z, f32::NEG_INFINITY); 4];
        let (blocks, tail) = x.as_chunks::<16>();
        let (quads, rest) = blocks.as_chunks::<4>();
        for q in quads {
            for (acc, b) in a.iter_mut().zip(q) {
                *acc = zmm!(_mm512_max_ps(load(z, b, f16), *acc));
            }
        }
        for b in rest {
            a[0] = zmm!(_mm512_max_ps(load(z, b, f16), a[0]));
        }
        if !tail.is_empty() {
            a[1] = zmm!(_mm512_mask_max_ps(a[1], lanes(tail.len()), load_part(z, tail, f16), a[1]));
        }
        zmm!(_mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a[0], a[1]), _mm512_max_ps(a[2], a[3]))))
    }

    /// `e^(v − m)·2^δ` (0 for `v = −∞`, NaN stays NaN) as `2^(s − ½)`: with
    /// `FOLD`, `s = v·log₂ e + c` in one FMA, `c` = `½ − m·log₂ e` rounded to
    /// `f32` (`δ` its rounding error, the same for the whole row); else
    /// `s = (v − m)·log₂ e + ½` (`δ = 0`).
    #[inline(always)]
    fn exp_minus<const FOLD: bool>(z: Zmm, v: __m512, m: __m512, c: __m512) -> __m512 {
        let s = if FOLD {
            zmm!(_mm512_fmadd_ps(v, splat(z, LOG2E), c))
        } else {
            zmm!(_mm512_fmadd_ps(_mm512_sub_ps(v, m), splat(z, LOG2E), splat(z, 0.5)))
        };
        exp2_above_half(z, zmm!(_mm512_max_ps(splat(z, EXP2_T_MIN + 0.5), s)))
    }

    /// `Σ e^(x − m)·2^δ` over the row and `δ` (a factor the same for the
    /// whole row, which softmax's division cancels), each term also written
    /// to `keep` (an `f32` row of at least `x.len()` values) when it is not
    /// empty.
    #[inline(always)]
    fn exp_sum(z: Zmm, x: &[u16], f16: bool, m: f32, keep: &mut [f32]) -> (f64, f64) {
        let exact = 0.5 - f64::from(m) * f64::from(LOG2E);
        let c = exact as f32;
        if c.is_finite() {
            // `m·log₂ e` is exact in `f64`: `δ` is `c`'s rounding error.
            (exp_sum_with::<true>(z, x, f16, m, c, keep), f64::from(c) - exact)
        } else {
            // `m` beyond `f32::MAX / log₂ e`: `c` would overflow.
            (exp_sum_with::<false>(z, x, f16, m, 0.5, keep), 0.0)
        }
    }

    /// [`exp_sum`]'s loop, each term from [`exp_minus`].
    #[inline(always)]
    fn exp_sum_with<const FOLD: bool>(z: Zmm, x: &[u16], f16: bool, m: f32, c: f32, keep: &mut [f32]) -> f64 {
        let (m, c) = (splat(z, m), splat(z, c));
        let keep = if keep.len() >= x.len() { &mut keep[..x.len()] } else { &mut [][..] };
        let mut a = [splat(z, 0.0); 4];
        let (blocks, tail) = x.as_chunks::<16>();
        let (quads, rest) = blocks.as_chunks::<4>();
        let (kb, kt) = keep.as_chunks_mut::<16>();
        let mut kb = kb.iter_mut();
        for q in quads {
            for (acc, b) in a.iter_mut().zip(q) {
                let e = exp_minus::<FOLD>(z, load(z, b, f16), m, c);
                *acc = zmm!(_mm512_add_ps(*acc, e));
                if let Some(k) = kb.next() {
                    // SAFETY: `k` is 16 writable floats; the store takes any alignment.
                    unsafe { _mm512_storeu_ps(k.as_mut_ptr(), e) }
                }
            }
        }
        for b in rest {
            let e = exp_minus::<FOLD>(z, load(z, b, f16), m, c);
            a[0] = zmm!(_mm512_add_ps(a[0], e));
            if let Some(k) = kb.next() {
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(k.as_mut_ptr(), e) }
            }
        }
        if !tail.is_empty() {
            let mask = lanes(tail.len());
            let e = zmm!(_mm512_maskz_mov_ps(mask, exp_minus::<FOLD>(z, load_part(z, tail, f16), m, c)));
            a[1] = zmm!(_mm512_add_ps(a[1], e));
            if kt.len() == tail.len() {
                // SAFETY: the mask covers `kt.len()` floats, all writable;
                // masked-off lanes are not accessed.
                unsafe { _mm512_mask_storeu_ps(kt.as_mut_ptr(), mask, e) }
            }
        }
        total(z, a)
    }

    /// What the last pass computes from each value of the row.
    #[derive(Clone, Copy)]
    enum Last {
        /// `v·k` (softmax, from the `f32` scratch).
        Times(f32),
        /// `(v − a) − b` (log_softmax).
        MinusMinus(f32, f32),
        /// `(v − mean)·inv·γ + β` (layer_norm).
        Normalize(f32, f32),
        /// `v·inv·γ` (rms_norm).
        ScaleBy(f32),
    }

    /// `p[i..i + 16]` (lanes past `p`'s end and outside `k` are 0).
    #[inline(always)]
    fn param(z: Zmm, p: &[f32], i: usize, k: __mmask16) -> __m512 {
        match p.get(i..) {
            // SAFETY: the mask covers the values that exist from `i` on;
            // masked-off lanes are not read.
            Some(p) => unsafe { _mm512_maskz_loadu_ps(k & lanes(p.len()), p.as_ptr()) },
            None => splat(z, 0.0),
        }
    }

    /// The last pass's value for the 16 values `v` at `i` (`k`: the valid ones).
    #[inline(always)]
    fn last(z: Zmm, l: Last, v: __m512, gamma: &[f32], beta: &[f32], i: usize, k: __mmask16) -> __m512 {
        match l {
            Last::Times(c) => zmm!(_mm512_mul_ps(v, splat(z, c))),
            Last::MinusMinus(a, b) => zmm!(_mm512_sub_ps(_mm512_sub_ps(v, splat(z, a)), splat(z, b))),
            Last::Normalize(mean, inv) => zmm!(_mm512_fmadd_ps(
                _mm512_mul_ps(_mm512_sub_ps(v, splat(z, mean)), splat(z, inv)),
                param(z, gamma, i, k),
                param(z, beta, i, k)
            )),
            Last::ScaleBy(inv) => zmm!(_mm512_mul_ps(_mm512_mul_ps(v, splat(z, inv)), param(z, gamma, i, k))),
        }
    }

    /// The row's values at `i` for the last pass: the half row, or (softmax)
    /// the `f32` scratch when `wide` is not empty.
    #[inline(always)]
    fn source(z: Zmm, x: &[u16; 16], wide: &[f32], i: usize, f16: bool) -> __m512 {
        match wide.get(i..i + 16) {
            // SAFETY: 16 readable floats; the load takes any alignment.
            Some(w) => unsafe { _mm512_loadu_ps(w.as_ptr()) },
            None => load(z, x, f16),
        }
    }

    /// The last pass: `out = last(x)` rounded and stored, `x` the half row
    /// or (softmax) `wide`, the row's `f32` scratch, when it is not empty.
    /// Meanwhile the lines of `next` (the next row, or empty) are asked into
    /// L1, one per 32 values stored, so that its first pass reads from cache
    /// while this row is written, as a copy reads and writes at once.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn finish(
        z: Zmm,
        (x, next): (&[u16], &[u16]),
        wide: &[f32],
        f16: bool,
        l: Last,
        (gamma, beta): (&[f32], &[f32]),
        out: &mut [u16],
        narrow: Narrow,
        stream: bool,
    ) {
        let (xb, xt) = x.as_chunks::<16>();
        let (ob, ot) = out.as_chunks_mut::<16>();
        for (j, (o, b)) in ob.iter_mut().zip(xb).enumerate() {
            let i = 16 * j;
            if j % 2 == 0
                && let Some(p) = next.get(i..)
                && !p.is_empty()
            {
                // SAFETY: a prefetch reads nothing and cannot fault; `p` points into `next`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().cast()) }
            }
            store(z, o, last(z, l, source(z, b, wide, i, f16), gamma, beta, i, 0xffff), narrow, stream);
        }
        if !ot.is_empty() {
            let at = 16 * ob.len();
            let k = lanes(ot.len());
            let v = match wide.get(at..) {
                // SAFETY: the mask covers the floats that exist from `at`;
                // masked-off lanes are not read.
                Some(w) if !w.is_empty() => unsafe { _mm512_maskz_loadu_ps(k & lanes(w.len()), w.as_ptr()) },
                _ => load_part(z, xt, f16),
            };
            store_part(z, ot, last(z, l, v, gamma, beta, at, k), narrow);
        }
    }

    /// A row op's operands (see [`super::fused`]).
    pub(super) struct Job<'a> {
        pub(super) op: RowOp,
        pub(super) cols: usize,
        pub(super) x: &'a [u16],
        pub(super) params: &'a [&'a [f32]],
        pub(super) out: &'a mut [u16],
        pub(super) scratch: &'a mut [f32],
        pub(super) narrow: Narrow,
        pub(super) stream: bool,
    }

    #[inline(always)]
    fn rows(z: Zmm, job: Job<'_>) {
        let Job { op, cols, x, params, out, scratch, narrow, stream } = job;
        let f16 = narrow.f16();
        let n = cols as f64;
        let gamma = params.first().copied().unwrap_or(&[]);
        let beta = params.get(1).copied().unwrap_or(&[]);
        let gb = (gamma, beta);
        let mut rows = x.chunks_exact(cols).peekable();
        for out in out.chunks_exact_mut(cols) {
            let Some(x) = rows.next() else { break };
            let next = rows.peek().copied().unwrap_or(&[]);
            match op {
                RowOp::Softmax => {
                    let m = max_ignoring_nan(z, x, f16);
                    let (sum, _) = exp_sum(z, x, f16, m, scratch);
                    let wide = scratch.get(..cols).unwrap_or(&[]);
                    finish(z, (x, next), wide, f16, Last::Times((1.0 / sum) as f32), gb, out, narrow, stream);
                }
                RowOp::LogSoftmax => {
                    let m = max_ignoring_nan(z, x, f16);
                    let (sum, delta) = exp_sum(z, x, f16, m, &mut []);
                    let log_sum = sum.ln() - delta * std::f64::consts::LN_2;
                    finish(z, (x, next), &[], f16, Last::MinusMinus(m, log_sum as f32), gb, out, narrow, stream);
                }
                RowOp::LayerNorm { eps } => {
                    let p = pivot(z, x, f16);
                    let (s1, s2) = shifted_sums(z, x, f16, p);
                    let d = s1 / n;
                    let var = s2 / n - d * d;
                    let mean = (f64::from(p) + d) as f32;
                    // Far from the pivot (or NaN) the difference would
                    // cancel: a second pass around the mean instead.
                    let var =
                        if d * d <= WELL_CENTRED * var { var } else { moment(z, x, f16, Moment::Squares(mean)) / n };
                    let inv = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
                    finish(z, (x, next), &[], f16, Last::Normalize(mean, inv), gb, out, narrow, stream);
                }
                RowOp::RmsNorm { eps } => {
                    let ms = moment(z, x, f16, Moment::SumSq) / n;
                    let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
                    finish(z, (x, next), &[], f16, Last::ScaleBy(inv), gb, out, narrow, stream);
                }
            }
        }
        if stream {
            // SAFETY: sfence is part of SSE, which every x86-64 CPU has.
            unsafe { _mm_sfence() }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    fn entry(z: Zmm, job: Job<'_>) {
        rows(z, job)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    fn entry_bf16(z: Zmm, job: Job<'_>) {
        rows(z, Job { narrow: Narrow::Bf16Native, ..job })
    }

    /// See [`super::fused`]; the caller has checked AVX512BW and VL (and,
    /// through [`Narrow::new`], AVX512_BF16 for [`Narrow::Bf16Native`]).
    pub(super) fn run(job: Job<'_>, z: Zmm) {
        match job.narrow {
            // SAFETY: `z` proves AVX-512F, the caller checked BW and VL, and
            // `Bf16Native` is made only with AVX512_BF16.
            Narrow::Bf16Native => unsafe { entry_bf16(z, job) },
            // SAFETY: `z` proves AVX-512F, the caller checked BW and VL.
            _ => unsafe { entry(z, job) },
        }
    }
}

#[cfg(test)]
mod tests {
    use compute_core::conformance::{compare_typed, rng::Rng};
    use compute_core::{DType, HostVec, Op, RowOp};

    use super::*;

    /// Every row op on both half dtypes, at lengths around the 16- and
    /// 64-value steps, with infinities and NaNs in some rows, within the
    /// conformance tolerance.
    #[test]
    fn fused_rows_match_the_reference() {
        if !(Isa::Avx512.is_supported()
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq"))
        {
            eprintln!("SKIPPED: no AVX-512 BW/VL/DQ on this CPU");
            return;
        }
        let mut rng = Rng::new(0x5eed_0021);
        let ops = [RowOp::Softmax, RowOp::LogSoftmax, RowOp::LayerNorm { eps: 1e-5 }, RowOp::RmsNorm { eps: 1e-6 }];
        for dtype in [DType::F16, DType::BF16] {
            for cols in [1usize, 5, 16, 17, 63, 64, 65, 100, 1000, 4096] {
                let rows = 3;
                let mut xv = rng.vec(rows * cols, -8.0, 8.0);
                if cols > 20 {
                    xv[cols + 3] = f32::INFINITY;
                    xv[2 * cols + 7] = f32::NAN;
                    // A large row: softmax's folded `−max·log₂ e` rounds.
                    xv[..cols].iter_mut().for_each(|v| *v += 5000.0);
                }
                if dtype == DType::BF16 && cols == 5 {
                    // Beyond `f32::MAX / log₂ e`: the unfolded exponential.
                    xv[..5].copy_from_slice(&[3.0e38, 2.9e38, 3.0e38, -1.0e38, 2.0e38]);
                }
                let x = HostVec::from_f32(dtype, &xv);
                let gamma = HostVec::from_f32(dtype, &rng.vec(cols, -2.0, 2.0));
                let beta = HostVec::from_f32(dtype, &rng.vec(cols, -1.0, 1.0));
                let g32 = gamma.to_f32();
                let b32 = beta.to_f32();
                for op in ops {
                    let huge = dtype == DType::BF16 && cols == 5;
                    if huge && matches!(op, RowOp::LayerNorm { .. } | RowOp::RmsNorm { .. }) {
                        // Their squares overflow `f32` (and `f64` is not used).
                        continue;
                    }
                    let spec = Op::rows(op, rows, cols).with_dtype(dtype);
                    let mut out = HostVec::zeros(dtype, rows * cols);
                    let params: Vec<&[f32]> = vec![&g32, &b32];
                    let mut scratch = Vec::new();
                    let done = match &mut out {
                        HostVec::F16(o) => fused(Isa::Avx512, op, cols, x.as_slice(), &params, o, &mut scratch, false),
                        HostVec::BF16(o) => fused(Isa::Avx512, op, cols, x.as_slice(), &params, o, &mut scratch, false),
                        _ => false,
                    };
                    assert!(done, "{op:?} {dtype}: no fused loop");
                    let inputs = match op {
                        RowOp::LayerNorm { .. } => vec![x.as_slice(), gamma.as_slice(), beta.as_slice()],
                        RowOp::RmsNorm { .. } => vec![x.as_slice(), gamma.as_slice()],
                        _ => vec![x.as_slice()],
                    };
                    if let Some(msg) = compare_typed(&spec, &inputs, out.as_slice(), 1.0) {
                        panic!("{op:?} {dtype} cols {cols}: {msg}");
                    }
                }
            }
        }
    }

    /// layer_norm on rows that test its one-pass variance: an outlier first
    /// value (the pivot far from the mean: the second pass runs), values on a
    /// large offset with a small spread, and long rows (65537 values) whose
    /// mean lies away from the pivot, within the conformance tolerance.
    #[test]
    fn layer_norm_holds_far_from_the_pivot() {
        if !(Isa::Avx512.is_supported()
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq"))
        {
            eprintln!("SKIPPED: no AVX-512 BW/VL/DQ on this CPU");
            return;
        }
        let mut rng = Rng::new(0x5eed_0022);
        let op = RowOp::LayerNorm { eps: 1e-5 };
        for dtype in [DType::F16, DType::BF16] {
            for cols in [4096usize, 65_537] {
                let mut outlier = rng.vec(cols, -6.0, 6.0);
                outlier[0] = 3000.0;
                let offset: Vec<f32> = rng.vec(cols, -1.0, 1.0).iter().map(|v| 200.0 + v).collect();
                // The first 16 values well above the rest: the pivot sits
                // about 1.5 standard deviations from the mean.
                let mut shifted = rng.vec(cols, -6.0, 6.0);
                shifted[..16].fill(5.0);
                for xv in [outlier, offset, shifted] {
                    let x = HostVec::from_f32(dtype, &xv);
                    let gamma = HostVec::from_f32(dtype, &rng.vec(cols, 0.5, 1.5));
                    let beta = HostVec::from_f32(dtype, &rng.vec(cols, -1.0, 1.0));
                    let (g32, b32) = (gamma.to_f32(), beta.to_f32());
                    let spec = Op::rows(op, 1, cols).with_dtype(dtype);
                    let mut out = HostVec::zeros(dtype, cols);
                    let params: Vec<&[f32]> = vec![&g32, &b32];
                    let done = match &mut out {
                        HostVec::F16(o) => {
                            fused(Isa::Avx512, op, cols, x.as_slice(), &params, o, &mut Vec::new(), true)
                        }
                        HostVec::BF16(o) => {
                            fused(Isa::Avx512, op, cols, x.as_slice(), &params, o, &mut Vec::new(), true)
                        }
                        _ => false,
                    };
                    assert!(done, "{dtype}: no fused loop");
                    let inputs = [x.as_slice(), gamma.as_slice(), beta.as_slice()];
                    if let Some(msg) = compare_typed(&spec, &inputs, out.as_slice(), 1.0) {
                        panic!("{dtype} cols {cols} (first value {}): {msg}", xv[0]);
                    }
                }
            }
        }
    }
}

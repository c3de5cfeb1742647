//! Row ops (softmax, log_softmax, layer_norm, rms_norm) on `f16` and `bf16`
//! rows, on AVX-512 (F, BW, VL, DQ): each row is read in place, 16 values per
//! step widened in registers, and each result is rounded once as it is
//! stored. No `f32` copy of the input. Passes: rms_norm two (sum of squares,
//! scale); layer_norm two (`Σ(x − p)` and `Σ(x − p)²` around a pivot `p`, the
//! mean of the row's first 16 values, then normalise), with a third pass
//! around the mean for a row whose mean lies more than two standard
//! deviations from `p`, where the one-pass variance would cancel; softmax
//! three (max; `e^(x − max)` summed and staged in an `f32` row scratch; scale)
//! and log_softmax three (max, sum, subtract). The passes over consecutive
//! rows overlap: one loop writes a row while it takes the next row's first
//! pass (and, for softmax and log_softmax, the maximum of the row after), so
//! memory is read and written at once, as in a copy, and the passes after
//! the first read their row from cache. Sums use four vector accumulators,
//! added in `f64` at the end of the row.
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
//! (softmax) vector instructions per 16 values and pass. Each loop that
//! writes a row asks the lines of the next row it will read from memory
//! into L1 as it goes. With non-temporal stores, each row's stores start at
//! the output's first 32-byte boundary in that row (a masked head before
//! it). softmax and log_softmax stay bound by their exponentials, not by
//! memory: on a 2-core Zen 4 VM softmax takes 1.2–1.45 times layer_norm's
//! time for the same bytes (see the benchmarks page).

use compute_core::{Element, HostSlice, RowOp};

use crate::isa::Isa;

/// `op` over the whole rows of `x` (`cols` each) into `out`, with the
/// parameter vectors already widened (`params[0]` = γ, `params[1]` = β),
/// when this CPU has AVX-512F, BW, VL and DQ and `x` and `out` are both `f16` or
/// both `bf16`; `scratch` is softmax's buffer of two rows (grown to `2·cols`). With
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
        if op == RowOp::Softmax && scratch.len() < 2 * cols {
            scratch.resize(2 * cols, 0.0);
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
        match folded(m) {
            Some((c, delta)) => (exp_sum_with::<true>(z, x, f16, m, c, keep), delta),
            None => (exp_sum_with::<false>(z, x, f16, m, 0.5, keep), 0.0),
        }
    }

    /// [`exp_minus`]'s folded constant `c = ½ − m·log₂ e` rounded to `f32`
    /// and its rounding error `δ`, or `None` where `m` lies beyond
    /// `f32::MAX / log₂ e` (`c` would overflow).
    #[inline(always)]
    fn folded(m: f32) -> Option<(f32, f64)> {
        let exact = 0.5 - f64::from(m) * f64::from(LOG2E);
        let c = exact as f32;
        // `m·log₂ e` is exact in `f64`: `δ` is `c`'s rounding error.
        if c.is_finite() { Some((c, f64::from(c) - exact)) } else { None }
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
        // Whole blocks (`k` a constant in their loops) load without a mask.
        if k == 0xffff
            && let Some(b) = p.get(i..i + 16)
        {
            // SAFETY: 16 readable floats; the load takes any alignment.
            return unsafe { _mm512_loadu_ps(b.as_ptr()) };
        }
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

    /// The values before `out`'s first 32-byte boundary when `stream` (where
    /// the non-temporal stores can start), else 0.
    #[inline(always)]
    fn head(out: &[u16], stream: bool) -> usize {
        if stream { out.as_ptr().align_offset(32).min(out.len()) } else { 0 }
    }

    /// The last pass over fewer than 16 values: `out = last(x)` (or of
    /// `wide[at..]` when `wide` is not empty), `at` their place in the row,
    /// stored through a mask.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn finish_part(
        z: Zmm,
        x: &[u16],
        (wide, at): (&[f32], usize),
        f16: bool,
        l: Last,
        (gamma, beta): (&[f32], &[f32]),
        out: &mut [u16],
        narrow: Narrow,
    ) {
        if out.is_empty() {
            return;
        }
        let k = lanes(out.len());
        let v = match wide.get(at..) {
            // SAFETY: the mask covers the floats that exist from `at`;
            // masked-off lanes are not read.
            Some(w) if !w.is_empty() => unsafe { _mm512_maskz_loadu_ps(k & lanes(w.len()), w.as_ptr()) },
            _ => load_part(z, x, f16),
        };
        store_part(z, out, last(z, l, v, gamma, beta, at, k), narrow);
    }

    /// The last pass: `out = last(x)` rounded and stored, `x` the half row
    /// or (softmax) `wide`, the row's `f32` scratch, when it is not empty;
    /// with `stream`, non-temporal from `out`'s first 32-byte boundary on.
    /// For a group's last rows, whose successors are already in cache (the
    /// others go through [`finish_gathering`] or [`three_rows`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn finish(
        z: Zmm,
        x: &[u16],
        wide: &[f32],
        f16: bool,
        l: Last,
        gb: (&[f32], &[f32]),
        out: &mut [u16],
        narrow: Narrow,
        stream: bool,
    ) {
        let h = head(out, stream);
        let (oh, out) = out.split_at_mut(h);
        let (xh, x) = x.split_at(h.min(x.len()));
        finish_part(z, xh, (wide, 0), f16, l, gb, oh, narrow);
        let (xb, xt) = x.as_chunks::<16>();
        let (ob, ot) = out.as_chunks_mut::<16>();
        for (j, (o, b)) in ob.iter_mut().zip(xb).enumerate() {
            let i = h + 16 * j;
            store(z, o, last(z, l, source(z, b, wide, i, f16), gb.0, gb.1, i, 0xffff), narrow, stream);
        }
        finish_part(z, xt, (wide, h + 16 * ob.len()), f16, l, gb, ot, narrow);
    }

    /// What the first pass over the next row gathers while [`finish_gathering`]
    /// writes this one: [`Shifted`], [`SumSq`] or [`Max`], one type each so
    /// that the loop is compiled for each without a branch per step.
    trait Gather: Copy {
        /// The accumulators' starting lanes (zeros unless said otherwise).
        #[inline(always)]
        fn start(z: Zmm) -> (__m512, __m512) {
            (splat(z, 0.0), splat(z, 0.0))
        }
        /// `acc` with the 16 values `v` (`k`: the valid lanes; the others hold 0) added.
        fn step(self, z: Zmm, acc: (__m512, __m512), v: __m512, k: __mmask16) -> (__m512, __m512);
        /// The row's totals from the four pairs of accumulators.
        fn totals(z: Zmm, acc: [(__m512, __m512); 4]) -> (f64, f64);
    }

    /// `Σ (x − p)` and `Σ (x − p)²` around the pivot `p` (layer_norm).
    #[derive(Clone, Copy)]
    struct Shifted(__m512);

    /// `Σ x²` (rms_norm), and 0.
    #[derive(Clone, Copy)]
    struct SumSq;

    /// The largest value that is not NaN (softmax, log_softmax), and 0.
    #[derive(Clone, Copy)]
    struct Max;

    impl Gather for Shifted {
        #[inline(always)]
        fn step(self, z: Zmm, acc: (__m512, __m512), v: __m512, k: __mmask16) -> (__m512, __m512) {
            let _ = z;
            zmm!({
                let d = _mm512_maskz_sub_ps(k, v, self.0);
                (_mm512_add_ps(acc.0, d), _mm512_fmadd_ps(d, d, acc.1))
            })
        }
        #[inline(always)]
        fn totals(z: Zmm, acc: [(__m512, __m512); 4]) -> (f64, f64) {
            (total(z, [acc[0].0, acc[1].0, acc[2].0, acc[3].0]), total(z, [acc[0].1, acc[1].1, acc[2].1, acc[3].1]))
        }
    }

    impl Gather for SumSq {
        #[inline(always)]
        fn step(self, z: Zmm, acc: (__m512, __m512), v: __m512, _k: __mmask16) -> (__m512, __m512) {
            let _ = z;
            (zmm!(_mm512_fmadd_ps(v, v, acc.0)), acc.1)
        }
        #[inline(always)]
        fn totals(z: Zmm, acc: [(__m512, __m512); 4]) -> (f64, f64) {
            (total(z, [acc[0].0, acc[1].0, acc[2].0, acc[3].0]), 0.0)
        }
    }

    impl Gather for Max {
        #[inline(always)]
        fn start(z: Zmm) -> (__m512, __m512) {
            (splat(z, f32::NEG_INFINITY), splat(z, 0.0))
        }
        #[inline(always)]
        fn step(self, z: Zmm, acc: (__m512, __m512), v: __m512, k: __mmask16) -> (__m512, __m512) {
            let _ = z;
            (zmm!(_mm512_mask_max_ps(acc.0, k, v, acc.0)), acc.1)
        }
        #[inline(always)]
        fn totals(z: Zmm, acc: [(__m512, __m512); 4]) -> (f64, f64) {
            let _ = z;
            let m = zmm!(_mm512_max_ps(_mm512_max_ps(acc[0].0, acc[1].0), _mm512_max_ps(acc[2].0, acc[3].0)));
            (f64::from(zmm!(_mm512_reduce_max_ps(m))), 0.0)
        }
    }

    /// [`finish`] of this row (`x`, `wide`, `out`) in one loop with the first
    /// pass over the next row (`next`, as long as `x`): each step gathers 16
    /// values of `next` and writes 16 results of this row, and every other
    /// step asks a line of the row after (`after`, or empty) into L1, so
    /// memory is read and written at once, as in a copy, and the gathering
    /// reads from cache. Returns what `g` gathered over `next`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn finish_gathering<G: Gather>(
        z: Zmm,
        (x, next, after): (&[u16], &[u16], &[u16]),
        wide: &[f32],
        f16: bool,
        l: Last,
        gb: (&[f32], &[f32]),
        out: &mut [u16],
        narrow: Narrow,
        stream: bool,
        g: G,
    ) -> (f64, f64) {
        let (mut a0, mut a1, mut a2, mut a3) = (G::start(z), G::start(z), G::start(z), G::start(z));
        let h = head(out, stream).min(x.len()).min(next.len());
        let (oh, out) = out.split_at_mut(h);
        let (xh, x) = x.split_at(h);
        let (nh, next) = next.split_at(h);
        if h > 0 {
            a1 = g.step(z, a1, load_part(z, nh, f16), lanes(h));
        }
        finish_part(z, xh, (wide, 0), f16, l, gb, oh, narrow);
        let (xb, xt) = x.as_chunks::<16>();
        let (nb, nt) = next.as_chunks::<16>();
        let (ob, ot) = out.as_chunks_mut::<16>();
        let (xq, xr) = xb.as_chunks::<4>();
        let (nq, nr) = nb.as_chunks::<4>();
        let (oq, or) = ob.as_chunks_mut::<4>();
        for (q, ((xs, ns), os)) in xq.iter().zip(nq).zip(oq.iter_mut()).enumerate() {
            let i = h + 64 * q;
            for ahead in [i, i + 32] {
                if let Some(p) = after.get(ahead..)
                    && !p.is_empty()
                {
                    // SAFETY: a prefetch reads nothing and cannot fault; `p` points into `after`.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().cast()) }
                }
            }
            a0 = g.step(z, a0, load(z, &ns[0], f16), 0xffff);
            a1 = g.step(z, a1, load(z, &ns[1], f16), 0xffff);
            a2 = g.step(z, a2, load(z, &ns[2], f16), 0xffff);
            a3 = g.step(z, a3, load(z, &ns[3], f16), 0xffff);
            for (k, (xv, o)) in xs.iter().zip(os.iter_mut()).enumerate() {
                let i = i + 16 * k;
                store(z, o, last(z, l, source(z, xv, wide, i, f16), gb.0, gb.1, i, 0xffff), narrow, stream);
            }
        }
        for (k, ((xv, nv), o)) in xr.iter().zip(nr).zip(or.iter_mut()).enumerate() {
            let i = h + 64 * xq.len() + 16 * k;
            a0 = g.step(z, a0, load(z, nv, f16), 0xffff);
            store(z, o, last(z, l, source(z, xv, wide, i, f16), gb.0, gb.1, i, 0xffff), narrow, stream);
        }
        if !nt.is_empty() {
            a2 = g.step(z, a2, load_part(z, nt, f16), lanes(nt.len()));
        }
        finish_part(z, xt, (wide, h + 16 * ob.len()), f16, l, gb, ot, narrow);
        G::totals(z, [a0, a1, a2, a3])
    }

    /// What every step of [`three_rows`] shares.
    #[derive(Clone, Copy)]
    struct Soft<'a> {
        /// The row whose lines are asked into L1.
        after: &'a [u16],
        /// The values before the first whole block.
        h: usize,
        f16: bool,
        /// `mid`'s maximum and folded constant, in every lane.
        mc: (__m512, __m512),
        /// The written row's exponentials, or empty.
        wide: &'a [f32],
        l: Last,
        narrow: Narrow,
        stream: bool,
    }

    /// One step of [`three_rows`]: block `j` of each row (`x`, `mid`,
    /// `next`), `mid`'s exponentials into `keep` (if any), `s` and `a` the
    /// step's sum and maximum. A function, not a closure: a closure would be
    /// compiled without AVX-512.
    #[inline(always)]
    fn soft_step<const FOLD: bool>(
        z: Zmm,
        c: Soft<'_>,
        j: usize,
        (xv, mv, nv): (&[u16; 16], &[u16; 16], &[u16; 16]),
        o: &mut [u16; 16],
        keep: Option<&mut [f32; 16]>,
        (s, a): (&mut __m512, &mut (__m512, __m512)),
    ) {
        let i = c.h + 16 * j;
        if j.is_multiple_of(2)
            && let Some(p) = c.after.get(i..)
            && !p.is_empty()
        {
            // SAFETY: a prefetch reads nothing and cannot fault; `p` points into `after`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().cast()) }
        }
        *a = Max.step(z, *a, load(z, nv, c.f16), 0xffff);
        let e = exp_minus::<FOLD>(z, load(z, mv, c.f16), c.mc.0, c.mc.1);
        *s = zmm!(_mm512_add_ps(*s, e));
        if let Some(k) = keep {
            // SAFETY: `k` is 16 writable floats; the store takes any alignment.
            unsafe { _mm512_storeu_ps(k.as_mut_ptr(), e) }
        }
        let v = source(z, xv, c.wide, i, c.f16);
        store(z, o, last(z, c.l, v, &[], &[], i, 0xffff), c.narrow, c.stream);
    }

    /// The exponentials of fewer than 16 values `v` (0 in the other lanes),
    /// also stored to `k` through a mask when it is as long as `v`.
    #[inline(always)]
    fn exp_part<const FOLD: bool>(z: Zmm, v: &[u16], k: &mut [f32], f16: bool, (m, c): (__m512, __m512)) -> __m512 {
        let mask = lanes(v.len());
        let e = zmm!(_mm512_maskz_mov_ps(mask, exp_minus::<FOLD>(z, load_part(z, v, f16), m, c)));
        if k.len() == v.len() && !k.is_empty() {
            // SAFETY: the mask covers `k.len()` floats, all writable;
            // masked-off lanes are not accessed.
            unsafe { _mm512_mask_storeu_ps(k.as_mut_ptr(), mask, e) }
        }
        e
    }

    /// softmax's and log_softmax's three passes over three rows in one loop:
    /// each step writes 16 results of `x` (from `wide`, its exponentials,
    /// when not empty), adds 16 exponentials `e^(v − m)` of `mid` (kept in
    /// `keep` when it is not empty) and takes the maximum over 16 values of
    /// `next`, and every other step asks a line of `after` (or empty) into
    /// L1. The exponentials bind the loop; memory is read and written
    /// meanwhile. `c` is `m`'s [`folded`] constant with `FOLD`. Returns
    /// `mid`'s `Σ e^(v − m)·2^δ` and `next`'s maximum ignoring NaN.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn three_rows<const FOLD: bool>(
        z: Zmm,
        (x, mid, next, after): (&[u16], &[u16], &[u16], &[u16]),
        (wide, keep): (&[f32], &mut [f32]),
        (m, c): (f32, f32),
        f16: bool,
        l: Last,
        out: &mut [u16],
        narrow: Narrow,
        stream: bool,
    ) -> (f64, f64) {
        let gb: (&[f32], &[f32]) = (&[], &[]);
        let (mv, cv) = (splat(z, m), splat(z, c));
        let zero = splat(z, 0.0);
        let (mut s0, mut s1, mut s2, mut s3) = (zero, zero, zero, zero);
        let (mut a0, mut a1, mut a2, mut a3) = (Max::start(z), Max::start(z), Max::start(z), Max::start(z));
        let len = x.len().min(mid.len()).min(next.len()).min(out.len());
        let keep = if keep.len() >= len { &mut keep[..len] } else { &mut [][..] };
        let h = head(out, stream).min(len);
        let (xh, x) = x[..len].split_at(h);
        let (mh, mid) = mid[..len].split_at(h);
        let (nh, next) = next[..len].split_at(h);
        let (oh, out) = out[..len].split_at_mut(h);
        let (kh, keep) = keep.split_at_mut(h.min(keep.len()));
        if h > 0 {
            a1 = Max.step(z, a1, load_part(z, nh, f16), lanes(h));
            s1 = zmm!(_mm512_add_ps(s1, exp_part::<FOLD>(z, mh, kh, f16, (mv, cv))));
        }
        finish_part(z, xh, (wide, 0), f16, l, gb, oh, narrow);
        let (xb, xt) = x.as_chunks::<16>();
        let (mb, mt) = mid.as_chunks::<16>();
        let (nb, nt) = next.as_chunks::<16>();
        let (ob, ot) = out.as_chunks_mut::<16>();
        let (kb, kt) = keep.as_chunks_mut::<16>();
        let mut kb = kb.iter_mut();
        let c = Soft { after, h, f16, mc: (mv, cv), wide, l, narrow, stream };
        let blocks = xb.len().min(mb.len()).min(nb.len()).min(ob.len());
        let (ob, _) = ob.split_at_mut(blocks);
        let (oq, or) = ob.as_chunks_mut::<4>();
        for (q, os) in oq.iter_mut().enumerate() {
            let [o0, o1, o2, o3] = os;
            let j = 4 * q;
            soft_step::<FOLD>(z, c, j, (&xb[j], &mb[j], &nb[j]), o0, kb.next(), (&mut s0, &mut a0));
            soft_step::<FOLD>(z, c, j + 1, (&xb[j + 1], &mb[j + 1], &nb[j + 1]), o1, kb.next(), (&mut s1, &mut a1));
            soft_step::<FOLD>(z, c, j + 2, (&xb[j + 2], &mb[j + 2], &nb[j + 2]), o2, kb.next(), (&mut s2, &mut a2));
            soft_step::<FOLD>(z, c, j + 3, (&xb[j + 3], &mb[j + 3], &nb[j + 3]), o3, kb.next(), (&mut s3, &mut a3));
        }
        for (r, o) in or.iter_mut().enumerate() {
            let j = 4 * oq.len() + r;
            soft_step::<FOLD>(z, c, j, (&xb[j], &mb[j], &nb[j]), o, kb.next(), (&mut s0, &mut a0));
        }
        if !nt.is_empty() {
            a2 = Max.step(z, a2, load_part(z, nt, f16), lanes(nt.len()));
        }
        if !mt.is_empty() {
            s2 = zmm!(_mm512_add_ps(s2, exp_part::<FOLD>(z, mt, kt, f16, (mv, cv))));
        }
        finish_part(z, xt, (wide, h + 16 * blocks), f16, l, gb, ot, narrow);
        let sum = total(z, [s0, s1, s2, s3]);
        (sum, Max::totals(z, [a0, a1, a2, a3]).0)
    }

    /// Row `r` of `x` (rows of `cols`), or empty past the last.
    #[inline(always)]
    fn nth_row(x: &[u16], cols: usize, r: usize) -> &[u16] {
        x.get(r * cols..(r + 1) * cols).unwrap_or(&[])
    }

    /// softmax (`soft`) or log_softmax over the whole rows of `x` into
    /// `out`: the first row's maximum and exponentials and the second row's
    /// maximum in passes of their own, then each row written by
    /// [`three_rows`] while the next row's exponentials are summed and the
    /// maximum of the row after is taken (the last two rows in passes of
    /// their own). softmax keeps each row's exponentials in one half of
    /// `scratch` (`2·cols` values) until the row is written.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn exp_rows(
        z: Zmm,
        soft: bool,
        cols: usize,
        x: &[u16],
        out: &mut [u16],
        scratch: &mut [f32],
        narrow: Narrow,
        stream: bool,
    ) {
        let f16 = narrow.f16();
        let rows = (x.len() / cols).min(out.len() / cols);
        let no_params: (&[f32], &[f32]) = (&[], &[]);
        let (mut ka, mut kb): (&mut [f32], &mut [f32]) = match scratch.get_mut(..2 * cols) {
            Some(s) if soft => s.split_at_mut(cols),
            _ => (&mut [], &mut []),
        };
        let first = nth_row(x, cols, 0);
        // This row's maximum and (Σ e^(x − m)·2^δ, δ); the next row's maximum.
        let mut m = max_ignoring_nan(z, first, f16);
        let mut sum = exp_sum(z, first, f16, m, ka);
        let mut m_next = if rows > 1 { max_ignoring_nan(z, nth_row(x, cols, 1), f16) } else { 0.0 };
        for (r, o) in out.chunks_exact_mut(cols).take(rows).enumerate() {
            let row = nth_row(x, cols, r);
            let l = if soft {
                Last::Times((1.0 / sum.0) as f32)
            } else {
                Last::MinusMinus(m, (sum.0.ln() - sum.1 * std::f64::consts::LN_2) as f32)
            };
            if r + 2 < rows {
                let rows4 = (row, nth_row(x, cols, r + 1), nth_row(x, cols, r + 2), nth_row(x, cols, r + 3));
                let ((s, m2), delta) = match folded(m_next) {
                    Some((c, delta)) => {
                        let mc = (m_next, c);
                        (three_rows::<true>(z, rows4, (ka, kb), mc, f16, l, o, narrow, stream), delta)
                    }
                    None => {
                        let mc = (m_next, 0.5);
                        (three_rows::<false>(z, rows4, (ka, kb), mc, f16, l, o, narrow, stream), 0.0)
                    }
                };
                (m, sum, m_next) = (m_next, (s, delta), m2 as f32);
            } else if r + 1 < rows {
                let next_sum = exp_sum(z, nth_row(x, cols, r + 1), f16, m_next, kb);
                finish(z, row, ka, f16, l, no_params, o, narrow, stream);
                (m, sum) = (m_next, next_sum);
            } else {
                finish(z, row, ka, f16, l, no_params, o, narrow, stream);
            }
            std::mem::swap(&mut ka, &mut kb);
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
        if matches!(op, RowOp::Softmax | RowOp::LogSoftmax) {
            exp_rows(z, op == RowOp::Softmax, cols, x, out, scratch, narrow, stream);
        } else {
            norm_rows(z, op, cols, x, params, out, narrow, stream);
        }
        if stream {
            // SAFETY: sfence is part of SSE, which every x86-64 CPU has.
            unsafe { _mm_sfence() }
        }
    }

    /// layer_norm or rms_norm over the whole rows of `x` into `out`: the
    /// first row's sums in a pass of their own, then each row written by
    /// [`finish_gathering`] while the next row's sums are taken (the last row
    /// by [`finish`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn norm_rows(
        z: Zmm,
        op: RowOp,
        cols: usize,
        x: &[u16],
        params: &[&[f32]],
        out: &mut [u16],
        narrow: Narrow,
        stream: bool,
    ) {
        let f16 = narrow.f16();
        let n = cols as f64;
        let gamma = params.first().copied().unwrap_or(&[]);
        let beta = params.get(1).copied().unwrap_or(&[]);
        let gb = (gamma, beta);
        let mut rows = x.chunks_exact(cols).peekable();
        // What the last row's final pass gathered over this one, and the
        // pivot it gathered around (layer_norm; 0 for rms_norm).
        let mut gathered: Option<(f32, (f64, f64))> = None;
        for out in out.chunks_exact_mut(cols) {
            let Some(x) = rows.next() else { break };
            let next = rows.peek().copied().unwrap_or(&[]);
            let after = rows.clone().nth(1).unwrap_or(&[]);
            match op {
                // Not here: see `exp_rows`.
                RowOp::Softmax | RowOp::LogSoftmax => {}
                RowOp::LayerNorm { eps } => {
                    // (No closures here: they would be compiled without AVX-512.)
                    let (p, (s1, s2)) = match gathered.take() {
                        Some(pivot_sums) => pivot_sums,
                        None => {
                            let p = pivot(z, x, f16);
                            (p, shifted_sums(z, x, f16, p))
                        }
                    };
                    let d = s1 / n;
                    let var = s2 / n - d * d;
                    let mean = (f64::from(p) + d) as f32;
                    // Far from the pivot (or NaN) the difference would
                    // cancel: a second pass around the mean instead.
                    let var =
                        if d * d <= WELL_CENTRED * var { var } else { moment(z, x, f16, Moment::Squares(mean)) / n };
                    let inv = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
                    let l = Last::Normalize(mean, inv);
                    if next.is_empty() {
                        finish(z, x, &[], f16, l, gb, out, narrow, stream);
                    } else {
                        let pn = pivot(z, next, f16);
                        let g = Shifted(splat(z, pn));
                        let sums = finish_gathering(z, (x, next, after), &[], f16, l, gb, out, narrow, stream, g);
                        gathered = Some((pn, sums));
                    }
                }
                RowOp::RmsNorm { eps } => {
                    let ms = match gathered.take() {
                        Some((_, (sum_sq, _))) => sum_sq,
                        None => moment(z, x, f16, Moment::SumSq),
                    } / n;
                    let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
                    let l = Last::ScaleBy(inv);
                    if next.is_empty() {
                        finish(z, x, &[], f16, l, gb, out, narrow, stream);
                    } else {
                        let g = SumSq;
                        gathered =
                            Some((0.0, finish_gathering(z, (x, next, after), &[], f16, l, gb, out, narrow, stream, g)));
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    fn entry(z: Zmm, job: Job<'_>) {
        // One copy of the loops per rounding, each without the other's
        // branches and constants.
        match job.narrow {
            Narrow::F16 => rows(z, Job { narrow: Narrow::F16, ..job }),
            _ => rows(z, Job { narrow: Narrow::Bf16, ..job }),
        }
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
    /// conformance tolerance; with plain and with non-temporal stores, into
    /// outputs that start on and off a 32-byte boundary (the loops that write
    /// one row while they read the next start their aligned stores after a
    /// masked head).
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
            for (cols, stream, off) in [1usize, 5, 16, 17, 63, 64, 65, 100, 1000, 4096]
                .into_iter()
                .flat_map(|c| [(c, false, 0), (c, true, 0), (c, true, 5)])
            {
                let rows = 5;
                let mut xv = rng.vec(rows * cols, -8.0, 8.0);
                if cols > 20 {
                    xv[cols + 3] = f32::INFINITY;
                    xv[2 * cols + 7] = f32::NAN;
                    // Masked-out positions, and values whose exponential is 0 in `f32`.
                    xv[3 * cols + 1] = f32::NEG_INFINITY;
                    xv[3 * cols + 2] = -1.0e30;
                    xv[4 * cols + 5] = -300.0;
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
                    let mut out = HostVec::zeros(dtype, rows * cols + off);
                    let params: Vec<&[f32]> = vec![&g32, &b32];
                    let mut scratch = Vec::new();
                    let x = x.as_slice();
                    let (done, out) = match &mut out {
                        HostVec::F16(o) => (
                            fused(Isa::Avx512, op, cols, x, &params, &mut o[off..], &mut scratch, stream),
                            HostVec::F16(o[off..].to_vec()),
                        ),
                        HostVec::BF16(o) => (
                            fused(Isa::Avx512, op, cols, x, &params, &mut o[off..], &mut scratch, stream),
                            HostVec::BF16(o[off..].to_vec()),
                        ),
                        _ => (false, HostVec::zeros(dtype, 0)),
                    };
                    assert!(done, "{op:?} {dtype}: no fused loop");
                    let inputs = match op {
                        RowOp::LayerNorm { .. } => vec![x, gamma.as_slice(), beta.as_slice()],
                        RowOp::RmsNorm { .. } => vec![x, gamma.as_slice()],
                        _ => vec![x],
                    };
                    if let Some(msg) = compare_typed(&spec, &inputs, out.as_slice(), 1.0) {
                        panic!("{op:?} {dtype} cols {cols} stream {stream} offset {off}: {msg}");
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

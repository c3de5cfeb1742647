//! Vectorised transcendental functions, generic over [`SimdF32`].
//!
//! Every function takes and returns 16 lanes, costs a few dozen vector
//! instructions (one division where noted), has no branches, and follows IEEE
//! semantics: NaN in gives NaN out, ±∞ saturate to the limit, huge inputs never
//! produce NaN, and subnormal results are rounded correctly (not flushed).
//!
//! Error bounds are against the exact (float64) value of the function at the
//! `f32` input, in units in the last place of the `f32` result (`ulp(r) =
//! 2^(⌊log₂|r|⌋−23)`, at least `2⁻¹⁴⁹`), measured by the tests at the end of this
//! file on every ISA this CPU has (dense grid plus random points over the whole
//! `f32` range, incl. saturation and subnormal regions). They hold with or without
//! FMA (the portable path on x86-64 has none).
//!
//! Method: `exp` is Cody–Waite range reduction `x = n·ln2 + r`, `|r| ≤ ln2/2`,
//! with Cephes' degree-7 polynomial for `eʳ − 1`, scaled by `2ⁿ` with
//! [`SimdF32::ldexp`]; `expm1` reuses it as `2ⁿ·(eʳ − 1) + (2ⁿ − 1)`. The others
//! are built from those with formulas that avoid cancellation (see each).

use super::SimdF32;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n·LN2_HI` is exact for `|n| < 2¹⁵` (9 significant bits).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Inputs of `exp` are clamped to this range: below it the result rounds to 0
/// (even after multiplying by anything up to 120), above it to +∞, so clamping
/// changes nothing but keeps `n` in `ldexp`'s range.
const EXP_MIN: f32 = -120.0;
const EXP_MAX: f32 = 89.0;
/// `1.5·2²³`: `(y + EXP_SHIFT) − EXP_SHIFT` rounds `|y| < 2²²` to an integer.
const EXP_SHIFT: f32 = 12_582_912.0;
/// `eʳ ≈ E(r)` on `|r| ≤ ln2/2`: minimax of degree 6 (Chebyshev fit, relative
/// error 2.0e-8 with these rounded coefficients).
const EXP_C: [f32; 7] = [1.394_111_9e-3, 8.375_134e-3, 4.166_635e-2, 1.666_641_5e-1, 0.5, 1.0, 1.0];
/// Cephes `expf`: `eʳ − 1 ≈ r + r²·P(r)` on `|r| ≤ ln2/2`, relative error 3.4e-9
/// (used where `eʳ − 1` itself is needed).
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `erfc(|x|/√2)/2 ≈ e^(−x²/2)·t·K(t)` with `t = 4/(4 + |x|)` (exact
/// constants), for `0 ≤ |x| ≤ 15.05`: a Chebyshev fit in `t` on `[0.21, 1]`
/// (relative error 5.5e-9, 2.5e-8 with these rounded coefficients), halved.
const HALF_ERFC_K: [f32; 10] = [
    0.5 * 3.220_594_3e-2,
    0.5 * -1.208_052_9e-1,
    0.5 * 9.310_102e-2,
    0.5 * 6.895_816e-2,
    0.5 * 1.676_409_3e-2,
    0.5 * 1.771_411_6e-1,
    0.5 * 1.429_858_5e-1,
    0.5 * 1.911_763e-1,
    0.5 * 1.989_770_5e-1,
    0.5 * 1.994_957e-1,
];
/// `√(2/π)`, the gelu tanh-form constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_K: f32 = 0.044_715;
/// Factors `x` of `x·σ(z)` are clamped below at this value: beyond it the true
/// result rounds to −0, and `−∞·0` would be NaN.
const FACTOR_MIN: f32 = -120.0;
/// `|x|` beyond which `Φ(x)` is 0 or 1 in `f32`.
const PHI_MAX: f32 = 15.0;

/// Horner evaluation of `c[0]·xᵏ + … + c[k]` with fused multiply-adds.
#[inline(always)]
fn poly<S: SimdF32, const N: usize>(s: S, x: S::V, c: &[f32; N]) -> S::V {
    let Some((&first, rest)) = c.split_first() else { return s.splat(0.0) };
    let mut acc = s.splat(first);
    for &ci in rest {
        acc = s.fma(acc, x, s.splat(ci));
    }
    acc
}

/// `x` clamped to `[EXP_MIN, EXP_MAX]`, then split as `x = n·ln2 + r` with
/// integral `n` and `|r| ≤ ln2/2`. `x − n·LN2_HI` is exact (Cody–Waite), so `r`
/// carries only the rounding of the `LN2_LO` term. NaN stays NaN.
#[inline(always)]
fn reduce<S: SimdF32>(s: S, x: S::V) -> (S::V, S::V) {
    let x = s.min(s.splat(EXP_MAX), s.max(s.splat(EXP_MIN), x));
    let shift = s.splat(EXP_SHIFT);
    let n = s.sub(s.fma(x, s.splat(LOG2E), shift), shift);
    let r = s.fma(n, s.splat(-LN2_HI), x);
    (n, s.fma(n, s.splat(-LN2_LO), r))
}

/// `eʳ − 1` for `|r| ≤ ln2/2` (0.06 ulp before rounding).
#[inline(always)]
fn expm1_reduced<S: SimdF32>(s: S, r: S::V) -> S::V {
    s.fma(s.mul(r, r), poly(s, r, &EXP_P), r)
}

/// `eˣ = m·2ⁿ` with `m ∈ [0.7, 1.42]`, for `x` clamped as in [`reduce`].
#[inline(always)]
fn exp_parts<S: SimdF32>(s: S, x: S::V) -> (S::V, S::V) {
    let (n, r) = reduce(s, x);
    (poly(s, r, &EXP_C), n)
}

/// `eˣ`. Max error 2 ulp; `exp(−∞) = 0`, `exp(+∞) = +∞`, overflow above
/// 88.72 gives +∞, subnormal results are rounded once. About 12 instructions.
#[inline(always)]
pub fn exp<S: SimdF32>(s: S, x: S::V) -> S::V {
    let (m, n) = exp_parts(s, x);
    s.ldexp(m, n)
}

/// `eˣ − 1` for `x ≤ 88` (larger `x` give garbage; callers clamp).
#[inline(always)]
fn expm1_below_88<S: SimdF32>(s: S, x: S::V) -> S::V {
    let (n, r) = reduce(s, x);
    let scale = s.ldexp(s.splat(1.0), n);
    s.fma(scale, expm1_reduced(s, r), s.sub(scale, s.splat(1.0)))
}

/// `eˣ − 1`, accurate near 0: `2ⁿ·(eʳ − 1) + (2ⁿ − 1)`, and `eˣ` itself above
/// 20 where the −1 no longer shows. Max error 2 ulp; `expm1(−∞) = −1`,
/// `expm1(+∞) = +∞`.
#[inline(always)]
pub fn expm1<S: SimdF32>(s: S, x: S::V) -> S::V {
    s.select(s.gt(x, s.splat(20.0)), exp(s, x), expm1_below_88(s, s.min(s.splat(20.0), x)))
}

/// `f·σ(z)` for a factor `f` (`z` itself, `1`, or the gelu `x`) that has the
/// sign of `z` or is positive. With `E = e^(−|z|) = m·2ⁿ`, this is `f/(1 + E)`
/// for `z ≥ 0` and `(f·m)·2ⁿ/(1 + E)` for `z < 0`: nothing overflows, and the
/// tiny results of the negative tail are rounded once instead of flushed.
#[inline(always)]
fn times_sigmoid<S: SimdF32>(s: S, f: S::V, z: S::V) -> S::V {
    let (m, n) = exp_parts(s, s.sub(s.splat(0.0), s.abs(z)));
    let e = s.ldexp(m, n);
    let neg = s.ldexp(s.mul(s.max(s.splat(FACTOR_MIN), f), m), n);
    let num = s.select(s.lt(z, s.splat(0.0)), neg, f);
    s.div(num, s.add(s.splat(1.0), e))
}

/// `σ(x) = 1 / (1 + e⁻ˣ)`. Max error 3 ulp; `σ(−∞) = 0`, `σ(+∞) = 1`. One division.
#[inline(always)]
pub fn sigmoid<S: SimdF32>(s: S, x: S::V) -> S::V {
    times_sigmoid(s, s.splat(1.0), x)
}

/// `x·σ(x)` (SiLU). Max error 3 ulp; `swish(−∞) = −0`. One division.
#[inline(always)]
pub fn swish<S: SimdF32>(s: S, x: S::V) -> S::V {
    times_sigmoid(s, x, x)
}

/// `tanh x = sign(x)·m/(m + 2)` with `m = expm1(2|x|)`: no cancellation at 0,
/// and `|x| ≥ 9` gives ±1 (the rounded true value). Max error 3 ulp; one division.
#[inline(always)]
pub fn tanh<S: SimdF32>(s: S, x: S::V) -> S::V {
    let a = s.min(s.splat(9.0), s.abs(x));
    let m = expm1_below_88(s, s.add(a, a));
    s.copysign(s.div(m, s.add(m, s.splat(2.0))), x)
}

/// `x` if `x > 0`, else `alpha·expm1(x)`. Max error 3 ulp (2 for `expm1`, one
/// rounding of the product).
#[inline(always)]
pub fn elu<S: SimdF32>(s: S, x: S::V, alpha: f32) -> S::V {
    let neg = s.mul(s.splat(alpha), expm1_below_88(s, s.min(s.splat(0.0), x)));
    s.select(s.gt(x, s.splat(0.0)), x, neg)
}

/// GELU, tanh form: `0.5·x·(1 + tanh(u)) = x·σ(2u)`, `u = √(2/π)·(x + 0.044715·x³)`,
/// through [`times_sigmoid`] (no cancellation for negative `x`). The rounding of
/// `2u` (up to 2.5 ulp) is amplified by `|2u|` through the exponential, as the
/// function's own condition number is: max error `4 + 3·|2u|` ulp, which is
/// 4 ulp for `x ≥ 0`, 7 ulp at `x = −1`, and grows only where the result is
/// below 1e-3 (`x < −3.2`). One division.
#[inline(always)]
pub fn gelu_tanh<S: SimdF32>(s: S, x: S::V) -> S::V {
    let inner = s.fma(s.splat(GELU_K), s.mul(x, x), s.splat(1.0));
    let two_u = s.mul(s.mul(s.splat(2.0 * SQRT_2_OVER_PI), x), inner);
    times_sigmoid(s, x, two_u)
}

/// GELU, erf form: `x·Φ(x)`. One formula for all `x`: `q = erfc(|x|/√2)/2 =
/// e^(−x²/2)·t·K(t)` with `t = 4/(4 + |x|)`, then `Φ = q` for `x < 0` and
/// `Φ = 1 − q` for `x ≥ 0` (no cancellation either way, as `q ≤ 1/2`).
/// `x²/2` is formed exactly from a 12-bit split of `|x|`, so the exponential
/// keeps full relative accuracy deep into the negative tail, and its `2ⁿ` is
/// applied last so tiny results round once. Max error 7 ulp with FMA, 8
/// without (the largest errors, about 6 ulp, sit near 0, where the rounding of
/// `t` is amplified threefold through `K`); `gelu(−∞) = −0`, `gelu(+∞) = +∞`.
/// One division, about 45 instructions.
#[inline(always)]
pub fn gelu_erf<S: SimdF32>(s: S, x: S::V) -> S::V {
    let ax = s.min(s.splat(PHI_MAX), s.abs(x));
    let hi = s.split_hi(ax);
    let lo = s.sub(ax, hi);
    let a = s.mul(s.mul(hi, s.splat(-0.5)), hi);
    let b = s.mul(s.mul(lo, s.splat(-0.5)), s.add(ax, hi));
    // e^(a + b) = m·2ⁿ: a − n·ln2 is exact (a has at most 24 significant bits), b is tiny.
    let (n, r) = reduce(s, a);
    let m = poly(s, s.add(r, b), &EXP_C);
    let t = s.div(s.splat(4.0), s.add(s.splat(4.0), ax));
    let q = s.mul(m, s.mul(t, poly(s, t, &HALF_ERFC_K)));
    let neg = s.lt(x, s.splat(0.0));
    let tail = s.ldexp(s.mul(s.select(neg, s.max(s.splat(FACTOR_MIN), x), s.splat(1.0)), q), n);
    s.select(neg, tail, s.mul(x, s.sub(s.splat(1.0), tail)))
}

#[cfg(test)]
mod tests;

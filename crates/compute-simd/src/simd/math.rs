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
/// Inputs of `exp` are clamped to this range: below it the result rounds to 0,
/// above it to +∞, so clamping changes nothing but keeps `n` in `ldexp`'s range.
const EXP_MIN: f32 = -104.0;
const EXP_MAX: f32 = 89.0;
/// Cephes `expf`: `eʳ − 1 ≈ r + r²·P(r)` on `|r| ≤ ln2/2`, relative error 3.4e-9.
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];

/// `erf(w) ≈ w·E(w²)` on `|w| ≤ 1/2` (Chebyshev fit, relative error 6e-8 with
/// these rounded coefficients).
const ERF_E: [f32; 5] = [4.718_701_4e-3, -2.675_756_6e-2, 1.128_282_9e-1, -3.761_260_8e-1, 1.128_379_1];
/// `erfc(w) ≈ e^(−w²)·t·K(t)` with `t = 2/(2 + w)`, for `1/2 ≤ w ≤ 10`
/// (Chebyshev fit in `t`, relative error 7e-9 with these rounded coefficients).
const ERFC_K: [f32; 10] = [
    -2.313_515_9e-2,
    3.597_678_6e-2,
    1.200_235_8e-1,
    -3.315_301e-1,
    1.910_245_6e-1,
    2.235_285_7e-3,
    1.974_190_3e-1,
    2.434_922_8e-1,
    2.823_904_2e-1,
    2.820_836e-1,
];
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `√(2/π)`, the gelu tanh-form constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_K: f32 = 0.044_715;
/// Numerators of `x·σ(·)` forms are clamped below at this value: beyond it the
/// true result rounds to −0 or a subnormal, and `−∞·0` would be NaN.
const NUM_MIN: f32 = -120.0;

/// Horner evaluation of `c[0]·xᵏ + … + c[k]` with fused multiply-adds.
#[inline(always)]
fn poly<S: SimdF32, const N: usize>(s: S, x: S::V, c: &[f32; N]) -> S::V {
    let mut acc = s.splat(0.0);
    for &ci in c {
        acc = s.fma(acc, x, s.splat(ci));
    }
    acc
}

/// `x = n·ln2 + r` for `x` already in `[EXP_MIN, EXP_MAX]` (or NaN); `r` exact up
/// to the rounding of the `LN2_LO` term.
#[inline(always)]
fn reduce<S: SimdF32>(s: S, x: S::V) -> (S::V, S::V) {
    let n = s.round(s.mul(x, s.splat(LOG2E)));
    let r = s.fma(n, s.splat(-LN2_HI), x);
    (n, s.fma(n, s.splat(-LN2_LO), r))
}

/// `eʳ − 1` for `|r| ≤ ln2/2` (about 0.1 ulp before rounding).
#[inline(always)]
fn expm1_reduced<S: SimdF32>(s: S, r: S::V) -> S::V {
    s.fma(s.mul(r, r), poly(s, r, &EXP_P), r)
}

/// `x` clamped to `[EXP_MIN, EXP_MAX]`; NaN stays NaN.
#[inline(always)]
fn clamp_exp<S: SimdF32>(s: S, x: S::V) -> S::V {
    s.min(s.splat(EXP_MAX), s.max(s.splat(EXP_MIN), x))
}

/// `eˣ`. Max error 1 ulp (measured 0.6 ulp; subnormal results within 1 ulp of
/// `2⁻¹⁴⁹`); `exp(−∞) = 0`, `exp(+∞) = +∞`, overflow above 88.72 gives +∞.
/// About 12 instructions.
#[inline(always)]
pub fn exp<S: SimdF32>(s: S, x: S::V) -> S::V {
    let (n, r) = reduce(s, clamp_exp(s, x));
    s.ldexp(s.add(s.splat(1.0), expm1_reduced(s, r)), n)
}

/// `e^(a + b)` for `a ≤ 0` with `n·ln2` exactly subtractable from `a` (true
/// when `a` has at most 24 significant bits below 2⁻²⁵ granularity, as `−hi²/2`
/// of a 12-bit `hi` does) and a small correction `b`.
#[inline(always)]
fn exp_sum<S: SimdF32>(s: S, a: S::V, b: S::V) -> S::V {
    let (n, r) = reduce(s, s.max(s.splat(EXP_MIN), a));
    s.ldexp(s.add(s.splat(1.0), expm1_reduced(s, s.add(r, b))), n)
}

/// `eˣ − 1`, accurate near 0. Max error 2 ulp (measured 1.3 ulp with FMA,
/// 1.6 without); `expm1(−∞) = −1`, `expm1(+∞) = +∞`. About 14 instructions.
#[inline(always)]
pub fn expm1<S: SimdF32>(s: S, x: S::V) -> S::V {
    let (n, r) = reduce(s, clamp_exp(s, x));
    let scale = s.ldexp(s.splat(1.0), n);
    s.fma(scale, expm1_reduced(s, r), s.sub(scale, s.splat(1.0)))
}

/// `1 / (1 + e⁻ˣ)`. Max error 3 ulp (measured 2.1); one division.
#[inline(always)]
pub fn sigmoid<S: SimdF32>(s: S, x: S::V) -> S::V {
    let e = exp(s, s.sub(s.splat(0.0), x));
    s.div(s.splat(1.0), s.add(s.splat(1.0), e))
}

/// `x·σ(x) = x / (1 + e⁻ˣ)`. Max error 3 ulp (measured 2.1); `swish(−∞) = −0`.
/// One division.
#[inline(always)]
pub fn swish<S: SimdF32>(s: S, x: S::V) -> S::V {
    let e = exp(s, s.sub(s.splat(0.0), x));
    s.div(s.max(s.splat(NUM_MIN), x), s.add(s.splat(1.0), e))
}

/// `tanh x = sign(x)·m/(m + 2)` with `m = expm1(2|x|)`: no cancellation at 0,
/// `|x| ≥ 9` gives ±1 exactly (as the rounded true value). Max error 3 ulp
/// (measured 2.2); one division.
#[inline(always)]
pub fn tanh<S: SimdF32>(s: S, x: S::V) -> S::V {
    let a = s.min(s.splat(9.0), s.abs(x));
    let m = expm1(s, s.add(a, a));
    s.copysign(s.div(m, s.add(m, s.splat(2.0))), x)
}

/// `x` if `x > 0`, else `alpha·expm1(x)`. Max error 3 ulp (measured 2.1).
#[inline(always)]
pub fn elu<S: SimdF32>(s: S, x: S::V, alpha: f32) -> S::V {
    let neg = s.mul(s.splat(alpha), expm1(s, x));
    s.select(s.gt(x, s.splat(0.0)), x, neg)
}

/// GELU, tanh form: `0.5·x·(1 + tanh(u))`, `u = √(2/π)·(x + 0.044715·x³)`,
/// evaluated as `x / (1 + e^(−2u))` (no cancellation for negative `x`). The
/// rounding of `u` itself (about 2 ulp) is amplified by `|2u|` through the
/// exponential, so the bound grows in the negative tail, where the result is
/// tiny: max error `4 + 2·|2u|` ulp (measured: 3.2 ulp for `x ≥ −1`, 140 ulp
/// at `x ≈ −5.5` where the result is below 1e-36). One division.
#[inline(always)]
pub fn gelu_tanh<S: SimdF32>(s: S, x: S::V) -> S::V {
    let x2 = s.mul(x, x);
    let inner = s.fma(s.splat(GELU_K), x2, s.splat(1.0));
    let two_u = s.mul(s.mul(s.splat(2.0 * SQRT_2_OVER_PI), x), inner);
    let e = exp(s, s.sub(s.splat(0.0), two_u));
    s.div(s.max(s.splat(NUM_MIN), x), s.add(s.splat(1.0), e))
}

/// GELU, erf form: `x·Φ(x)` with `Φ(x) = erfc(w)/2`, `w = −x/√2`. For
/// `|w| < 1/2`, `Φ = 1/2 − w·E(w²)/2` (odd erf polynomial); beyond,
/// `erfc(|w|) = e^(−x²/2)·t·K(t)` with `t = 2/(2 + |w|)`, where `x²/2` is formed
/// exactly from a 12-bit split of `x` so the exponential keeps full relative
/// accuracy deep into the negative tail; positive `x` use `Φ = 1 − erfc(|w|)/2`.
/// Max error 4 ulp (measured 3.1 ulp); `gelu(−∞) = −0`. One division.
#[inline(always)]
pub fn gelu_erf<S: SimdF32>(s: S, x: S::V) -> S::V {
    let half = s.splat(0.5);
    let w = s.mul(x, s.splat(-FRAC_1_SQRT_2));
    let aw = s.abs(w);
    // Core: 0.5·erfc(w) = 0.5 − 0.5·erf(w).
    let core = s.fma(s.mul(s.splat(-0.5), w), poly(s, s.mul(w, w), &ERF_E), half);
    // Tails: erfc(|w|) with |x| ≤ 14 (beyond, Φ is 0 or 1 in f32).
    let ax = s.min(s.splat(14.0), s.abs(x));
    let hi = s.split_hi(ax);
    let lo = s.sub(ax, hi);
    let a = s.mul(s.mul(hi, hi), s.splat(-0.5));
    let b = s.mul(s.mul(lo, s.add(ax, hi)), s.splat(-0.5));
    let t = s.div(s.splat(2.0), s.add(s.splat(2.0), s.min(s.splat(10.0), aw)));
    let half_erfc = s.mul(s.mul(exp_sum(s, a, b), half), s.mul(t, poly(s, t, &ERFC_K)));
    let tail = s.select(s.gt(w, s.splat(0.0)), half_erfc, s.sub(s.splat(1.0), half_erfc));
    let phi = s.select(s.lt(aw, half), core, tail);
    s.mul(s.max(s.splat(NUM_MIN), x), phi)
}

#[cfg(test)]
mod tests;

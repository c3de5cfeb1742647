//! Accurate `f32` device math built from PTX's fast approximations.
//!
//! `ex2.approx.f32` is accurate to about 2 ulp, but `exp(x) = 2^(x·log₂e)` loses
//! `|x|·ε` to the rounding of the product; [`exp`] adds that rounding error back
//! (computed exactly with an `fma`), which keeps the result within a few ulp
//! over the whole range. `tanh`, `sigmoid`, both GELUs and `expm1` are built on
//! it so that every transcendental op meets the conformance tolerance
//! (`abs 1e-6 + rel 1e-5`; `tanh.approx.f32`'s 2⁻¹¹ would not). Divisions by
//! quantities ≥ 1 use `rcp.approx.f32` (1 ulp) instead of the long IEEE
//! `div.rn` sequence, which keeps these ops at memory speed.

use crate::builder::{Cmp, F32, KernelBuilder, Reg};

/// `log₂e` rounded to `f32`, and the rest of it.
const LOG2E_HI: f32 = std::f64::consts::LOG2_E as f32;
const LOG2E_LO: f32 = (std::f64::consts::LOG2_E - LOG2E_HI as f64) as f32;
const LN2: f32 = std::f64::consts::LN_2 as f32;

/// `eˣ` to a few ulp: `2^t · (1 + e·ln2)` with `t = fl(x·log₂e)` and `e` the exact
/// rounding error of that product plus `x·(log₂e − fl(log₂e))`. The correction
/// is dropped where `|t| ≥ 128` (the result has over/underflowed anyway).
pub(crate) fn exp(b: &mut KernelBuilder, x: Reg<F32>) -> Reg<F32> {
    let t = b.mul(x, LOG2E_HI);
    let nt = b.neg(t);
    let e = b.fma(x, LOG2E_HI, nt);
    let e = b.fma(x, LOG2E_LO, e);
    let y = b.ex2_approx(t);
    let k = b.mul(e, LN2);
    let r = b.fma(y, k, y);
    // Beyond ±128 (and for ±inf, NaN) the result is 0, inf or NaN already, and
    // the correction could only turn inf·0 into NaN.
    let at = b.abs(t);
    let ok = b.setp(Cmp::Lt, at, 128.0f32);
    b.selp(r, y, ok)
}

/// `eˣ − 1`, accurate near 0: a degree-8 Taylor polynomial for `|x| < 0.25`
/// (truncation below 1e-10 relative), `exp(x) − 1` elsewhere.
pub(crate) fn expm1(b: &mut KernelBuilder, x: Reg<F32>) -> Reg<F32> {
    let ax = b.abs(x);
    let small = b.setp(Cmp::Lt, ax, 0.25f32);
    // q(x) = 1/2 + x/6 + x²/24 + … + x⁶/8!, so expm1 = x + x²·q(x).
    let coeffs = [1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5];
    let mut q = b.mov(1.0f32 / 40320.0);
    for c in coeffs {
        q = b.fma(q, x, c as f32);
    }
    let x2 = b.mul(x, x);
    let poly = b.fma(x2, q, x);
    let e = exp(b, x);
    let big = b.sub(e, 1.0f32);
    b.selp(poly, big, small)
}

/// `tanh(x) = sign(x)·expm1(2|x|)/(expm1(2|x|) + 2)`, with `|x|` capped at 9
/// (where `tanh` rounds to ±1); NaN stays NaN, −0 stays −0.
pub(crate) fn tanh(b: &mut KernelBuilder, x: Reg<F32>) -> Reg<F32> {
    let a = b.abs(x);
    let a = b.min_nan(a, 9.0f32);
    let a2 = b.mul(a, 2.0f32);
    let e = expm1(b, a2);
    let d = b.add(e, 2.0f32);
    let r = b.rcp_approx(d);
    let t = b.mul(e, r);
    b.copysign(t, x)
}

/// `1 / (1 + e⁻ˣ)`.
pub(crate) fn sigmoid(b: &mut KernelBuilder, x: Reg<F32>) -> Reg<F32> {
    let nx = b.neg(x);
    let e = exp(b, nx);
    let d = b.add(e, 1.0f32);
    b.rcp_approx(d)
}

/// `x / d` for `d ≥ 1` (or +inf) as `x · rcp.approx(d)`: within 2 ulp, far
/// cheaper than the IEEE `div.rn` sequence, with exact limits (`x/inf = ±0`)
/// and `x/1 = x` exactly (so `x` near `FLT_MAX` cannot round up to inf).
pub(crate) fn div_by_ge1(b: &mut KernelBuilder, x: Reg<F32>, d: Reg<F32>) -> Reg<F32> {
    let r = b.rcp_approx(d);
    let q = b.mul(x, r);
    let one = b.setp(Cmp::Eq, d, 1.0f32);
    b.selp(x, q, one)
}

/// `erfc(z)` for `z ≥ 0` (and +∞), fractional error about 1.2e-7: the Chebyshev
/// fit `t·exp(−z² − 1.26551223 + t·P(t))`, `t = 1/(1 + z/2)` (Numerical Recipes'
/// `erfcc`), with `−z² + …` rounded once by an `fma`.
pub(crate) fn erfc_nonneg(b: &mut KernelBuilder, z: Reg<F32>) -> Reg<F32> {
    let d = b.fma(z, 0.5f32, 1.0f32);
    let t = b.rcp_approx(d);
    // Numerical Recipes' coefficients, in f64 as published, rounded to f32 here.
    let coeffs: [f64; 9] = [
        -0.822_152_23,
        1.488_515_87,
        -1.135_203_98,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_68,
        -1.265_512_23,
    ];
    let mut p = b.mov(0.170_872_77f64 as f32);
    for c in coeffs {
        p = b.fma(p, t, c as f32);
    }
    let nz = b.neg(z);
    let arg = b.fma(nz, z, p);
    let e = exp(b, arg);
    b.mul(t, e)
}

/// `ln(s)` for `s ≥ 1` (softmax sums): `log1p(s − 1)` by its series where
/// `s − 1 < 1/16` (exact subtraction, truncation below 1e-8 relative), else
/// `lg2.approx(s)·ln 2` (absolute error about 2⁻²²·ln 2 on a result ≥ 0.06).
/// The sum of a row of `−∞` is 0: `ln 0 = −∞` (through `lg2`), and NaN stays NaN.
pub(crate) fn ln_ge1(b: &mut KernelBuilder, s: Reg<F32>) -> Reg<F32> {
    let u = b.sub(s, 1.0f32);
    let au = b.abs(u);
    let small = b.setp(Cmp::Lt, au, 0.0625f32);
    // log1p(u) = u·(1 − u·(1/2 − u·(1/3 − … − u/8))).
    let mut q = b.mov(1.0f32 / 8.0);
    for c in [1.0f32 / 7.0, 1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 0.5, 1.0] {
        let nu = b.neg(u);
        q = b.fma(nu, q, c);
    }
    let series = b.mul(u, q);
    let l = b.lg2_approx(s);
    let big = b.mul(l, LN2);
    b.selp(series, big, small)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_split_log2e_exactly_enough() {
        let sum = LOG2E_HI as f64 + LOG2E_LO as f64;
        assert!((sum - std::f64::consts::LOG2_E).abs() < 1e-15);
        assert!(LOG2E_LO.abs() < 1e-7 && LOG2E_LO != 0.0);
    }
}

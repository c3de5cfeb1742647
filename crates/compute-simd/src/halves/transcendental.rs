//! The transcendental element-wise ops (sigmoid, tanh, swish, elu, gelu) on
//! `f16` and `bf16` data, on AVX-512: one pass, 16 values per step widened in
//! registers, computed, rounded and stored, with no `f32` staging buffer.
//!
//! **Accuracy.** The result is stored with 8 (`bf16`) or 11 (`f16`)
//! significant bits, so these kernels compute to about 2⁻¹⁸ relative instead
//! of the `f32` kernels' few ulps ([`crate::simd::math`]):
//! - `2ᵗ` is a degree-4 polynomial of `t − ⌊t⌋` (`vreduceps`) scaled by
//!   `2^⌊t⌋` (`vscalefps`), relative error 2.9e-6; sigmoid, swish and
//!   gelu's tanh form are then one correctly rounded division, `f / (1 +
//!   2ᵗ)` (`vdivps`).
//! - `tanh x` is one rational function `x·P(x²)/Q(x²)` of degrees 7/6 on
//!   `|x| ≤ 7` (1.3e-6, relative also near 0), `±1` beyond, its quotient one
//!   `vdivps`.
//! - elu's `eˣ − 1` is `2ⁿ·(2ᶠ − 1) + (2ⁿ − 1)` with `2ᶠ − 1 = f·Q(f)`,
//!   `Q` of degree 4 (5.8e-7, relative near 0).
//! - gelu's erf form is `max(x, 0) − |x|·Φ(−|x|)` with `Φ(−a)` a cubic in
//!   `6a − j` on 31 pieces `j = round(6a)` of `a ≤ 31/6`, its coefficients
//!   looked up with `vpermt2ps`: within 1e-6 relative for `|x| ≤ 2` and half
//!   the tolerance beyond; past `31/6`, where `|gelu x|` or `|x − gelu x|` is
//!   below 6.2e-7, the result is `max(x, 0)`.
//!
//! On AVX2 with FMA and F16C (and on AVX-512 CPUs without DQ) the same
//! arithmetic runs on 8 values a register in `convert`'s fused loop: `⌊t⌋`
//! by `vroundps` and `2^⌊t⌋` put into the exponent bits (the callers'
//! arguments stay within ±126), the divisions one `vdivps` each (on Zen 4,
//! with the AVX2 path forced, 2–23 % less time than `vrcpps` and a
//! correction), the same polynomials; gelu's erf form takes `Φ(−a) =
//! erfc(a/√2)/2` from the rational-exponential fit of *Numerical Recipes*
//! (relative error 1.2e-7; one division, ten FMAs and an exponential)
//! instead of the 31-piece table, which has no one-instruction lookup there.
//!
//! Each function's error before rounding is at most 4e-6 relative (gelu's
//! erf form: as said), below the conformance suite's `1e-5` for the
//! transcendentals, plus `1e-6` absolute where the result is tiny: results
//! below about 2⁻¹²⁰ (the far tails of sigmoid, swish and gelu's tanh form)
//! come out as tiny values or zeros instead of being rounded exactly. Every
//! one of the 65536 values of each half type is checked against the
//! tolerance. On a CPU with AVX512_BF16 the `bf16` results are rounded by
//! `vcvtneps2bf16`, which rounds to nearest even as every other path does but
//! flushes subnormal results to zero.
//!
//! **Cost.** About 11 (sigmoid) to 13 (gelu's tanh form) vector instructions
//! per 16 values, one of them a `vdivps`, plus the widening and rounding,
//! against 25–45 for the `f32` kernels plus their conversions through L1
//! buffers. On Zen 4 the divider works beside the FMA pipes, which bind these
//! loops: one `vdivps` in place of `vrcp14ps`, a Newton step and a product
//! took 13–20 % off sigmoid, swish and gelu's tanh form (tanh 8 %) on the
//! 2-core development VM. Needs AVX512DQ
//! (`vreduceps`, `vrangeps`) besides AVX-512F. NaN gives NaN, ±∞ give the
//! limits.

use compute_core::{Element, HostSlice, UnaryOp};

use crate::isa::Isa;

/// `out[i] = op(x[i])` in one pass when this CPU has AVX-512F and DQ (or
/// AVX2, FMA and F16C), `op` is a
/// transcendental and `x` and `out` are both `f16` or both `bf16`; with
/// `stream`, large outputs are written with non-temporal stores (the loop
/// ends with `sfence`). Returns false, having written nothing, otherwise.
pub fn fused<T: Element>(isa: Isa, op: UnaryOp, x: HostSlice<'_>, out: &mut [T], stream: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512
        && op.is_transcendental()
        && let Some(tok) = x86::Tok::detect()
        && tok.dq
    {
        let Some((x, out, f16)) = super::avx512::half_bits(x, out) else { return false };
        return x86::run(tok, op, x, out, f16, stream);
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && op.is_transcendental() {
        return x86_avx2::run(op, x, out, stream);
    }
    let _ = (isa, op, x, out, stream);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use compute_core::{GeluForm, UnaryOp};

    pub(super) use super::super::avx512::Tok;
    use super::super::avx512::{EXPM1_T_MIN, LOG2E, Narrow, Zmm, exp2_above_half, expm1_2, load, splat, store, zmm};

    /// `−2·√(2/π)·log₂ e` and `0.044715` times it: gelu's `−2u·log₂ e = x·(A + B·x²)`.
    pub(super) const GELU_A: f32 = -2.0 * 0.797_884_6 * LOG2E;
    pub(super) const GELU_B: f32 = GELU_A * 0.044_715;
    /// The sigmoid's `|z|` is clamped here: `|z|·log₂ e` stays below 125,
    /// where `1 + 2ᵗ` stays finite, and `σ(±86)` is 0 or 1 within 2⁻¹²⁴.
    pub(super) const Z_MAX: f32 = 86.0;
    /// gelu's (tanh form) `|x|` is clamped here: `|x·(A + B·x²)| ≤ 110`.
    pub(super) const GELU_X_MAX: f32 = 9.5;
    /// The factor of the sigmoid's tail: `x·σ` with `x = −∞` would be `−∞·0`.
    pub(super) const FACTOR_MIN: f32 = -200.0;
    /// `tanh x ≈ x·P(x²)/Q(x²)` on `|x| ≤ 7` (beyond, `tanh x` is `±1` within
    /// 1.7e-6): near-minimax of relative error (Lawson-reweighted linearised
    /// least squares), 1.3e-6 in `f32` arithmetic.
    pub(super) const TANH_P: [f32; 4] = [0.999_999, 0.123_220_47, 0.002_293_078_5, 3.995_817e-6];
    pub(super) const TANH_Q: [f32; 4] = [1.0, 0.456_546_1, 0.021_151_574, 0.000_143_983_23];
    /// Where [`TANH_P`]/[`TANH_Q`] stop.
    pub(super) const TANH_X_MAX: f32 = 7.0;
    /// Pieces per unit of `a` in [`GELU_PIECES`]: piece `j` covers
    /// `6a ∈ [j − ½, j + ½]`.
    const GELU_K: f32 = 6.0;
    /// Where [`GELU_PIECES`] stop (`31/6`): `|x|·Φ(−|x|)` is below 6.2e-7
    /// beyond, so gelu is taken as `max(x, 0)` there.
    pub(super) const GELU_A_MAX: f32 = 31.0 / GELU_K;
    /// `Φ(−a) = erfc(a/√2)/2 ≈ Σₖ GELU_PIECES[k][j]·uᵏ` with `u = 6a − j` on
    /// piece `j = round(6a)`: per-piece cubics, least-squares fits made
    /// near-minimax by Lawson reweighting against an error target of 2e-6
    /// relative to gelu's result for `|x| ≤ 2` and the conformance tolerance
    /// beyond; at most 0.47 of that target in `f32` arithmetic.
    const GELU_PIECES: [[f32; 32]; 4] = [
        [
            5.0e-1,
            4.3381622e-1,
            3.6944142e-1,
            3.0853766e-1,
            2.5249267e-1,
            2.0232852e-1,
            1.5865538e-1,
            1.216726e-1,
            9.121129e-2,
            6.680724e-2,
            4.779036e-2,
            3.3376496e-2,
            2.275014e-2,
            1.5130105e-2,
            9.8152915e-3,
            6.2096296e-3,
            3.8303493e-3,
            2.3032404e-3,
            1.349878e-3,
            7.7097e-4,
            4.2904986e-4,
            2.3262198e-4,
            1.2286178e-4,
            6.320634e-5,
            3.1669493e-5,
            1.5453277e-5,
            7.3428496e-6,
            3.3973608e-6,
            1.5304624e-6,
            6.712448e-7,
            2.8661006e-7,
            1.1915167e-7,
        ],
        [
            -6.649043e-2,
            -6.557322e-2,
            -6.289713e-2,
            -5.867747e-2,
            -5.324124e-2,
            -4.6985224e-2,
            -4.0328376e-2,
            -3.366639e-2,
            -2.7334977e-2,
            -2.1586254e-2,
            -1.6579533e-2,
            -1.2385222e-2,
            -8.998286e-3,
            -6.3587916e-3,
            -4.370331e-3,
            -2.9213938e-3,
            -1.8993366e-3,
            -1.2010188e-3,
            -7.386415e-4,
            -4.418284e-4,
            -2.5704523e-4,
            -1.4544591e-4,
            -8.004413e-5,
            -4.2844327e-5,
            -2.2304532e-5,
            -1.1293505e-5,
            -5.5616056e-6,
            -2.6638356e-6,
            -1.2409388e-6,
            -5.622494e-7,
            -2.477693e-7,
            -1.0628397e-7,
        ],
        [
            3.956127e-7,
            9.091784e-4,
            1.7442303e-3,
            2.4410156e-3,
            2.9534867e-3,
            3.258525e-3,
            3.3568232e-3,
            3.270029e-3,
            3.0350792e-3,
            2.6971132e-3,
            2.3024145e-3,
            1.8925726e-3,
            1.5003465e-3,
            1.149234e-3,
            8.509831e-4,
            6.0976454e-4,
            4.230767e-4,
            2.8439795e-4,
            1.8530138e-4,
            1.1706809e-4,
            7.173711e-5,
            4.2649328e-5,
            2.4606214e-5,
            1.3779367e-5,
            7.4910404e-6,
            3.9541255e-6,
            2.0268121e-6,
            1.0089826e-6,
            4.8787416e-7,
            2.2915415e-7,
            1.0456833e-7,
            4.4878217e-8,
        ],
        [
            3.0689832e-4,
            2.9458065e-4,
            2.5823116e-4,
            2.0314932e-4,
            1.3640676e-4,
            6.6036264e-5,
            -3.0149548e-7,
            -5.6445788e-5,
            -9.845449e-5,
            -1.2482733e-4,
            -1.3627126e-4,
            -1.3513469e-4,
            -1.2614531e-4,
            -1.08620545e-4,
            -8.983872e-5,
            -7.096838e-5,
            -5.3734253e-5,
            -3.9095892e-5,
            -2.7386392e-5,
            -1.8497065e-5,
            -1.2059842e-5,
            -7.597304e-6,
            -4.627974e-6,
            -2.7278058e-6,
            -1.5565397e-6,
            -8.6025807e-7,
            -4.6066813e-7,
            -2.3910263e-7,
            -1.2032173e-7,
            -5.8718953e-8,
            -2.7776835e-8,
            -1.535161e-8,
        ],
    ];

    pub(super) const SIGMOID: u8 = 0;
    pub(super) const SWISH: u8 = 1;
    pub(super) const GELU_TANH: u8 = 2;
    pub(super) const TANH: u8 = 3;
    pub(super) const ELU: u8 = 4;
    pub(super) const GELU_ERF: u8 = 5;

    #[inline(always)]
    fn horner<const N: usize>(z: Zmm, x: __m512, c: &[f32; N]) -> __m512 {
        let mut acc = splat(z, c[N - 1]);
        for &k in c[..N - 1].iter().rev() {
            acc = zmm!(_mm512_fmadd_ps(acc, x, splat(z, k)));
        }
        acc
    }

    /// `x` with its magnitude clamped to `m`, sign kept, in one `vrangeps`
    /// (absolute minimum, sign of `x`); a NaN does not stay NaN, so the
    /// callers carry `x` itself into the result as well. Needs AVX512DQ.
    #[inline(always)]
    fn clamp_abs(z: Zmm, x: __m512, m: f32) -> __m512 {
        // SAFETY: the caller checked AVX512DQ.
        unsafe { _mm512_range_ps::<0b0010>(x, splat(z, m)) }
    }

    /// `x` clamped to `[−m, m]`, NaN kept (`max`/`min` return their second
    /// operand when either is NaN).
    #[inline(always)]
    fn clamp(z: Zmm, x: __m512, m: f32) -> __m512 {
        zmm!(_mm512_min_ps(splat(z, m), _mm512_max_ps(splat(z, -m), x)))
    }

    /// `f·σ(z) = f / (1 + 2^(s − ½))` from `s = −z·log₂ e + ½`, with
    /// `|s − ½|` at most 125 (the callers clamp), in one `vdivps`: on Zen 4
    /// the divider runs beside the FMA pipes, where `vrcp14ps`, a Newton step
    /// and the product by `f` took four of their slots (see the module's
    /// cost).
    #[inline(always)]
    fn over(z: Zmm, f: __m512, s: __m512) -> __m512 {
        zmm!(_mm512_div_ps(f, _mm512_add_ps(splat(z, 1.0), exp2_above_half(z, s))))
    }

    /// `f` kept above [`FACTOR_MIN`] (so `−∞·σ` is not `−∞`); a NaN stays
    /// (`max` returns its second operand when either is NaN).
    #[inline(always)]
    fn factor(z: Zmm, f: __m512) -> __m512 {
        zmm!(_mm512_max_ps(splat(z, FACTOR_MIN), f))
    }

    /// `tanh x = x·P(x²)/Q(x²)` with `x` clamped to `±`[`TANH_X_MAX`], the
    /// quotient in one `vdivps`.
    #[inline(always)]
    fn tanh(z: Zmm, x: __m512) -> __m512 {
        let c = clamp(z, x, TANH_X_MAX);
        let s = zmm!(_mm512_mul_ps(c, c));
        let n = zmm!(_mm512_mul_ps(c, horner(z, s, &TANH_P)));
        zmm!(_mm512_div_ps(n, horner(z, s, &TANH_Q)))
    }

    /// `x` where `x > 0`, else `alpha·(eˣ − 1)` (a NaN compares false and
    /// stays; the exponential of positive `x` is computed and not used).
    #[inline(always)]
    fn elu(z: Zmm, x: __m512, alpha: f32) -> __m512 {
        let t = zmm!(_mm512_max_ps(splat(z, EXPM1_T_MIN), _mm512_mul_ps(x, splat(z, LOG2E))));
        let below = zmm!(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, splat(z, 0.0)));
        zmm!(_mm512_mask_mul_ps(x, below, splat(z, alpha), expm1_2(z, t)))
    }

    /// `gelu x = max(x, 0) − |x|·Φ(−|x|)` (no cancellation: `Φ(−a) ≤ ½`),
    /// `Φ(−a)` from the cubic of [`GELU_PIECES`] that `a` falls in: four
    /// `vpermt2ps` lookups and three FMAs; `max(x, 0)` beyond
    /// [`GELU_A_MAX`] (and for NaN, which stays NaN, and ±∞).
    #[inline(always)]
    fn gelu_erf(z: Zmm, x: __m512) -> __m512 {
        // `min(|x|, GELU_A_MAX)` in one `vrangeps` (sign cleared); a NaN `x`
        // comes back through `max(0, x)` below.
        // SAFETY: the caller checked AVX512DQ.
        let a = unsafe { _mm512_range_ps::<0b1010>(x, splat(z, GELU_A_MAX)) };
        let m = zmm!(_mm512_mul_ps(a, splat(z, GELU_K)));
        // SAFETY: the caller checked AVX512DQ.
        let u = unsafe { _mm512_reduce_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(m) };
        let j = zmm!(_mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(m));
        let coef = |c: &[f32; 32]| {
            let (lo, hi) = c.split_at(16);
            // SAFETY: `lo` and `hi` are 16 readable floats each; the loads
            // take any alignment.
            zmm!(_mm512_permutex2var_ps(_mm512_loadu_ps(lo.as_ptr()), j, _mm512_loadu_ps(hi.as_ptr())))
        };
        let mut q = coef(&GELU_PIECES[3]);
        for c in GELU_PIECES[..3].iter().rev() {
            q = zmm!(_mm512_fmadd_ps(q, u, coef(c)));
        }
        let inside = zmm!(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, splat(z, GELU_A_MAX)));
        zmm!(_mm512_mask3_fnmadd_ps(a, q, _mm512_max_ps(splat(z, 0.0), x), inside))
    }

    /// Op number `OP` on 16 values.
    #[inline(always)]
    fn lane<const OP: u8>(z: Zmm, x: __m512, alpha: f32) -> __m512 {
        let half = splat(z, 0.5);
        match OP {
            SIGMOID => over(z, splat(z, 1.0), zmm!(_mm512_fmadd_ps(clamp(z, x, Z_MAX), splat(z, -LOG2E), half))),
            // The factor `x` keeps a NaN.
            SWISH => over(z, factor(z, x), zmm!(_mm512_fmadd_ps(clamp_abs(z, x, Z_MAX), splat(z, -LOG2E), half))),
            GELU_TANH => {
                let c = clamp_abs(z, x, GELU_X_MAX);
                let inner = zmm!(_mm512_fmadd_ps(splat(z, GELU_B), _mm512_mul_ps(c, c), splat(z, GELU_A)));
                over(z, factor(z, x), zmm!(_mm512_fmadd_ps(c, inner, half)))
            }
            TANH => tanh(z, x),
            ELU => elu(z, x, alpha),
            _ => gelu_erf(z, x),
        }
    }

    /// `out = op(x)` through zero-padded blocks of 16 (a head or a tail).
    #[inline(always)]
    fn padded<const OP: u8>(z: Zmm, x: &[u16], out: &mut [u16], alpha: f32, narrow: Narrow) {
        for (xs, os) in x.chunks(16).zip(out.chunks_mut(16)) {
            let mut buf = [0u16; 16];
            buf[..xs.len()].copy_from_slice(xs);
            let mut res = [0u16; 16];
            store(z, &mut res, lane::<OP>(z, load(z, &buf, narrow.f16()), alpha), narrow, false);
            os.copy_from_slice(&res[..os.len()]);
        }
    }

    /// The loop of op number `OP`: a head up to the output's first 32-byte
    /// boundary and a tail through padded blocks, whole aligned blocks between.
    #[inline(always)]
    fn body<const OP: u8>(z: Zmm, x: &[u16], out: &mut [u16], alpha: f32, narrow: Narrow, stream: bool) {
        let n = x.len().min(out.len());
        let (x, out) = (&x[..n], &mut out[..n]);
        let head = out.as_ptr().align_offset(32).min(n);
        let (oh, ob) = out.split_at_mut(head);
        let (xh, xb) = x.split_at(head);
        padded::<OP>(z, xh, oh, alpha, narrow);
        let (ob, ot) = ob.as_chunks_mut::<16>();
        let (xb, xt) = xb.as_chunks::<16>();
        for (o, x) in ob.iter_mut().zip(xb) {
            store(z, o, lane::<OP>(z, load(z, x, narrow.f16()), alpha), narrow, stream);
        }
        if stream {
            // SAFETY: sfence is part of SSE, which every x86-64 CPU has.
            unsafe { _mm_sfence() }
        }
        padded::<OP>(z, xt, ot, alpha, narrow);
    }

    #[inline(always)]
    fn dispatch(z: Zmm, op: UnaryOp, x: &[u16], out: &mut [u16], narrow: Narrow, stream: bool) {
        match op {
            UnaryOp::Sigmoid => body::<SIGMOID>(z, x, out, 0.0, narrow, stream),
            UnaryOp::Swish => body::<SWISH>(z, x, out, 0.0, narrow, stream),
            UnaryOp::Gelu(GeluForm::Tanh) => body::<GELU_TANH>(z, x, out, 0.0, narrow, stream),
            UnaryOp::Tanh => body::<TANH>(z, x, out, 0.0, narrow, stream),
            UnaryOp::Elu { alpha } => body::<ELU>(z, x, out, alpha, narrow, stream),
            UnaryOp::Gelu(GeluForm::Erf) => body::<GELU_ERF>(z, x, out, 0.0, narrow, stream),
            // Not a transcendental: `fused` does not call this.
            _ => {}
        }
    }

    #[target_feature(enable = "avx512f,avx512dq")]
    fn entry(z: Zmm, op: UnaryOp, x: &[u16], out: &mut [u16], narrow: Narrow, stream: bool) {
        dispatch(z, op, x, out, narrow, stream)
    }

    #[target_feature(enable = "avx512f,avx512dq,avx512bf16")]
    fn entry_bf16(z: Zmm, op: UnaryOp, x: &[u16], out: &mut [u16], stream: bool) {
        dispatch(z, op, x, out, Narrow::Bf16Native, stream)
    }

    /// See [`super::fused`]: `x` and `out` hold `f16` bits when `f16`, else
    /// `bf16` bits. False (nothing written) without AVX512DQ.
    pub(super) fn run(tok: Tok, op: UnaryOp, x: &[u16], out: &mut [u16], f16: bool, stream: bool) -> bool {
        if !tok.dq {
            return false;
        }
        match Narrow::new(tok, f16) {
            // SAFETY: the token proves AVX-512F and DQ (checked above), and
            // `Bf16Native` AVX512_BF16.
            Narrow::Bf16Native => unsafe { entry_bf16(tok.z, op, x, out, stream) },
            // SAFETY: the token proves AVX-512F and DQ (checked above).
            narrow => unsafe { entry(tok.z, op, x, out, narrow, stream) },
        }
        true
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_avx2 {
    //! The AVX2 lane functions of [`super::fused`]: the AVX-512 loop's
    //! arithmetic on two `__m256` of 8 values, in `convert`'s fused loop.

    use std::arch::x86_64::*;

    use compute_core::{Element, GeluForm, HostSlice, UnaryOp};

    use super::super::avx512::{EXP2_HALF, EXPM1, EXPM1_T_MIN, LOG2E};
    use super::x86::{
        ELU, FACTOR_MIN, GELU_A, GELU_A_MAX, GELU_B, GELU_ERF, GELU_TANH, GELU_X_MAX, SIGMOID, SWISH, TANH, TANH_P,
        TANH_Q, TANH_X_MAX, Z_MAX,
    };
    use crate::simd::{Avx2, LaneFn};

    /// Calls AVX2/FMA intrinsics on registers only.
    macro_rules! ymm {
        ($e:expr) => {
            // SAFETY: these helpers run only inlined into `convert`'s fused
            // loop, compiled for avx2, fma and f16c, which `Tok::detect` (an
            // `Avx2` token and an F16C check) proved this CPU has; they touch
            // no memory.
            unsafe { $e }
        };
    }

    #[inline(always)]
    fn splat(x: f32) -> __m256 {
        ymm!(_mm256_set1_ps(x))
    }

    #[inline(always)]
    fn horner<const N: usize>(x: __m256, c: &[f32; N]) -> __m256 {
        let mut acc = splat(c[N - 1]);
        for &k in c[..N - 1].iter().rev() {
            acc = ymm!(_mm256_fmadd_ps(acc, x, splat(k)));
        }
        acc
    }

    /// `2ⁿ` for whole `n` in `[−126, 127]` (a NaN or other `n` gives a
    /// finite value the callers do not use or multiply into a NaN).
    #[inline(always)]
    fn pow2(n: __m256) -> __m256 {
        ymm!(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127)
        ))))
    }

    /// `2^(s − ½)` for `⌊s⌋` in `[−126, 127]`: the polynomial of `s − ⌊s⌋`
    /// times `2^⌊s⌋` (NaN stays NaN).
    #[inline(always)]
    fn exp2_above_half(s: __m256) -> __m256 {
        let fl = ymm!(_mm256_floor_ps(s));
        let g = ymm!(_mm256_sub_ps(s, fl));
        ymm!(_mm256_mul_ps(horner(g, &EXP2_HALF), pow2(fl)))
    }

    /// `2ᵗ − 1` for `t` in `[EXPM1_T_MIN, 0]`, as the AVX-512 `expm1_2`.
    #[inline(always)]
    fn expm1_2(t: __m256) -> __m256 {
        let n = ymm!(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t));
        let f = ymm!(_mm256_sub_ps(t, n));
        let q = ymm!(_mm256_mul_ps(f, horner(f, &EXPM1)));
        let p = pow2(n);
        ymm!(_mm256_fmadd_ps(p, q, _mm256_sub_ps(p, splat(1.0))))
    }

    /// `n/d` in one `vdivps` (correctly rounded), as the AVX-512 loops.
    #[inline(always)]
    fn divide(n: __m256, d: __m256) -> __m256 {
        ymm!(_mm256_div_ps(n, d))
    }

    /// `f·σ = f/(1 + 2^(s − ½))`, `|s − ½|` at most 125.
    #[inline(always)]
    fn over(f: __m256, s: __m256) -> __m256 {
        divide(f, ymm!(_mm256_add_ps(splat(1.0), exp2_above_half(s))))
    }

    /// `x` clamped to `[−m, m]`, NaN kept.
    #[inline(always)]
    fn clamp(x: __m256, m: f32) -> __m256 {
        ymm!(_mm256_min_ps(splat(m), _mm256_max_ps(splat(-m), x)))
    }

    /// `f` kept above [`FACTOR_MIN`] (NaN kept).
    #[inline(always)]
    fn factor(f: __m256) -> __m256 {
        ymm!(_mm256_max_ps(splat(FACTOR_MIN), f))
    }

    /// `erfc z ≈ t·e^(Q(t) − z²)` with `t = 1/(1 + z/2)`, `Q` of degree 9
    /// in `t` (the Chebyshev fit of Press et al., *Numerical Recipes*
    /// §6.2): relative error below 1.2e-7 for every `z ≥ 0`.
    const ERFC_Q: [f32; 10] = [
        -1.265_512_2,
        1.000_023_7,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_204,
        1.488_515_9,
        -0.822_152_2,
        0.170_872_77,
    ];

    /// `Σ c[k]·tᵏ` (degree 9) by Estrin's scheme: four multiply-adds deep
    /// instead of Horner's nine, so that the loop is not bound by their
    /// latency.
    #[inline(always)]
    fn estrin(t: __m256, c: &[f32; 10]) -> __m256 {
        let pair = |i: usize| ymm!(_mm256_fmadd_ps(splat(c[i + 1]), t, splat(c[i])));
        let t2 = ymm!(_mm256_mul_ps(t, t));
        let t4 = ymm!(_mm256_mul_ps(t2, t2));
        let t8 = ymm!(_mm256_mul_ps(t4, t4));
        let low = ymm!(_mm256_fmadd_ps(pair(2), t2, pair(0)));
        let high = ymm!(_mm256_fmadd_ps(pair(6), t2, pair(4)));
        ymm!(_mm256_fmadd_ps(pair(8), t8, _mm256_fmadd_ps(high, t4, low)))
    }

    /// gelu's erf form, `max(x, 0) − a·Φ(−a)` with `a = |x|` as on AVX-512,
    /// `Φ(−a) = erfc(a/√2)/2` from [`ERFC_Q`] (no table lookup): one
    /// division, a polynomial of degree 9 and an exponential; `max(x, 0)` from
    /// [`GELU_A_MAX`] on (and for NaN, which stays NaN, and ±∞).
    #[inline(always)]
    fn gelu_erf(x: __m256) -> __m256 {
        let abs = ymm!(_mm256_andnot_ps(splat(-0.0), x));
        // A NaN gives `GELU_A_MAX` here (`min` returns its second operand).
        let a = ymm!(_mm256_min_ps(abs, splat(GELU_A_MAX)));
        let z = ymm!(_mm256_mul_ps(a, splat(std::f32::consts::FRAC_1_SQRT_2)));
        let t = divide(splat(1.0), ymm!(_mm256_fmadd_ps(z, splat(0.5), splat(1.0))));
        let arg = ymm!(_mm256_fnmadd_ps(z, z, estrin(t, &ERFC_Q)));
        let e = exp2_above_half(ymm!(_mm256_fmadd_ps(arg, splat(LOG2E), splat(0.5))));
        let phi = ymm!(_mm256_mul_ps(_mm256_mul_ps(splat(0.5), t), e));
        let base = ymm!(_mm256_max_ps(splat(0.0), x));
        let inside = ymm!(_mm256_cmp_ps::<_CMP_LT_OQ>(a, splat(GELU_A_MAX)));
        ymm!(_mm256_blendv_ps(base, _mm256_fnmadd_ps(a, phi, base), inside))
    }

    /// Op number `OP` on 8 values.
    #[inline(always)]
    fn lane<const OP: u8>(x: __m256, alpha: f32) -> __m256 {
        let half = splat(0.5);
        match OP {
            SIGMOID => over(splat(1.0), ymm!(_mm256_fmadd_ps(clamp(x, Z_MAX), splat(-LOG2E), half))),
            SWISH => over(factor(x), ymm!(_mm256_fmadd_ps(clamp(x, Z_MAX), splat(-LOG2E), half))),
            GELU_TANH => {
                let c = clamp(x, GELU_X_MAX);
                let inner = ymm!(_mm256_fmadd_ps(splat(GELU_B), _mm256_mul_ps(c, c), splat(GELU_A)));
                over(factor(x), ymm!(_mm256_fmadd_ps(c, inner, half)))
            }
            TANH => {
                let c = clamp(x, TANH_X_MAX);
                let s = ymm!(_mm256_mul_ps(c, c));
                divide(ymm!(_mm256_mul_ps(c, horner(s, &TANH_P))), horner(s, &TANH_Q))
            }
            GELU_ERF => gelu_erf(x),
            _ => {
                // elu: `x` where `x > 0` (a NaN compares false and stays).
                let t = ymm!(_mm256_max_ps(splat(EXPM1_T_MIN), _mm256_mul_ps(x, splat(LOG2E))));
                let below = ymm!(_mm256_cmp_ps::<_CMP_LE_OQ>(x, splat(0.0)));
                ymm!(_mm256_blendv_ps(x, _mm256_mul_ps(splat(alpha), expm1_2(t)), below))
            }
        }
    }

    /// Op number `OP` as a lane function of 16 values.
    struct Op<const OP: u8> {
        alpha: f32,
    }

    impl<const OP: u8> LaneFn<Avx2, 1> for Op<OP> {
        #[inline(always)]
        fn apply(&self, _: Avx2, [v]: [[__m256; 2]; 1]) -> [__m256; 2] {
            [lane::<OP>(v[0], self.alpha), lane::<OP>(v[1], self.alpha)]
        }
    }

    /// See [`super::fused`]: false for other ops and dtypes, or a CPU
    /// without AVX2, FMA and F16C.
    pub(super) fn run<T: Element>(op: UnaryOp, x: HostSlice<'_>, out: &mut [T], stream: bool) -> bool {
        use super::super::convert::fused_with;
        match op {
            UnaryOp::Sigmoid => fused_with(x, out, stream, &Op::<SIGMOID> { alpha: 0.0 }),
            UnaryOp::Swish => fused_with(x, out, stream, &Op::<SWISH> { alpha: 0.0 }),
            UnaryOp::Gelu(GeluForm::Tanh) => fused_with(x, out, stream, &Op::<GELU_TANH> { alpha: 0.0 }),
            UnaryOp::Tanh => fused_with(x, out, stream, &Op::<TANH> { alpha: 0.0 }),
            UnaryOp::Elu { alpha } => fused_with(x, out, stream, &Op::<ELU> { alpha }),
            UnaryOp::Gelu(GeluForm::Erf) => fused_with(x, out, stream, &Op::<GELU_ERF> { alpha: 0.0 }),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use compute_core::conformance::compare_typed;
    use compute_core::{DType, GeluForm, HostSlice, HostVec, Op, UnaryOp, bf16, f16};

    use super::*;

    const OPS: [UnaryOp; 6] = [
        UnaryOp::Sigmoid,
        UnaryOp::Swish,
        UnaryOp::Gelu(GeluForm::Tanh),
        UnaryOp::Gelu(GeluForm::Erf),
        UnaryOp::Tanh,
        UnaryOp::Elu { alpha: 1.3 },
    ];

    /// Every one of the 65536 values of each half type, through each op,
    /// within the conformance suite's tolerance (against the float64
    /// reference), at every offset of the 16-value blocks. (The NaNs whose
    /// quiet form is the suite's poison pattern, which marks values never
    /// written, are left out.)
    #[test]
    fn every_half_value_is_within_the_tolerance() {
        let mut isas = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx512.is_supported() && std::arch::is_x86_feature_detected!("avx512dq") {
                isas.push(Isa::Avx512);
            } else {
                eprintln!("SKIPPED on AVX-512: no AVX-512 DQ on this CPU");
            }
            if Isa::Avx2.is_supported() && std::arch::is_x86_feature_detected!("f16c") {
                isas.push(Isa::Avx2);
            } else {
                eprintln!("SKIPPED on AVX2: no AVX2, FMA and F16C on this CPU");
            }
        }
        for isa in isas {
            every_half_value_on(isa);
        }
    }

    fn every_half_value_on(isa: Isa) {
        for dtype in [DType::F16, DType::BF16] {
            let (quiet, poison) = if dtype == DType::F16 { (0x0200, 0x7ead) } else { (0x0040, 0x7fed) };
            assert_eq!(u32::from(poison), compute_core::conformance::poison_bits(dtype));
            let bits: Vec<u16> = (0..=u16::MAX).chain(0..7).filter(|&b| (b | quiet) & 0x7fff != poison).collect();
            let x = match dtype {
                DType::F16 => HostVec::F16(bits.iter().map(|&b| f16::from_bits(b)).collect()),
                _ => HostVec::BF16(bits.iter().map(|&b| bf16::from_bits(b)).collect()),
            };
            for op in OPS {
                let spec = Op::unary(op, bits.len()).with_dtype(dtype);
                let mut out = HostVec::zeros(dtype, bits.len());
                for stream in [false, true] {
                    let done = match &mut out {
                        HostVec::F16(o) => fused(isa, op, x.as_slice(), o, stream),
                        HostVec::BF16(o) => fused(isa, op, x.as_slice(), o, stream),
                        _ => false,
                    };
                    assert!(done, "{op:?} {dtype} on {isa}: no fused loop");
                    if let Some(msg) = compare_typed(&spec, &[x.as_slice()], out.as_slice(), 1.0) {
                        panic!("{op:?} {dtype} on {isa} (stream {stream}): {msg}");
                    }
                }
            }
        }
    }

    #[test]
    fn other_ops_and_mixed_dtypes_are_declined() {
        let x = vec![f16::from_f32(1.0); 20];
        let mut out = vec![bf16::ZERO; 20];
        assert!(!fused(Isa::Avx512, UnaryOp::Sigmoid, HostSlice::F16(&x), &mut out, false));
        let mut out = vec![f16::ZERO; 20];
        assert!(!fused(Isa::Avx512, UnaryOp::Relu, HostSlice::F16(&x), &mut out, false));
        assert!(!fused(Isa::Portable, UnaryOp::Sigmoid, HostSlice::F16(&x), &mut out, false));
        assert!(out.iter().all(|v| *v == f16::ZERO), "nothing written");
    }
}

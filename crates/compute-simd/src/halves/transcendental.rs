//! The transcendental element-wise ops (sigmoid, tanh, swish, elu, gelu) on
//! `f16` and `bf16` data, on AVX-512: one pass, 16 values per step widened in
//! registers, computed, rounded and stored, with no `f32` staging buffer.
//!
//! **Accuracy.** The result is stored with 8 (`bf16`) or 11 (`f16`)
//! significant bits, so these kernels compute to about 2⁻¹⁸ relative instead
//! of the `f32` kernels' few ulps ([`crate::simd::math`]):
//! - `2ᵗ` is a degree-4 polynomial of `t − ⌊t⌋` (`vreduceps`) scaled by
//!   `2^⌊t⌋` (`vscalefps`), relative error 2.9e-6; the division is
//!   `vrcp14ps` with one Newton step (sigmoid, swish, gelu's tanh form).
//! - `tanh x` is one rational function `x·P(x²)/Q(x²)` of degrees 7/6 on
//!   `|x| ≤ 7` (1.3e-6, relative also near 0), `±1` beyond.
//! - elu's `eˣ − 1` is `2ⁿ·(2ᶠ − 1) + (2ⁿ − 1)` with `2ᶠ − 1 = f·Q(f)`,
//!   `Q` of degree 4 (5.8e-7, relative near 0).
//! - gelu's erf form is `max(x, 0) − |x|·Φ(−|x|)` with `Φ(−a) =
//!   2^(h(a) − a²·log₂(e)/2)`, `h` a degree-6 polynomial fitted on
//!   `a ≤ 5`: within 4e-6 relative for `|x| ≤ 3`, within a third of the
//!   tolerance beyond; results below 1e-6 (`x < −5`) keep an absolute 1e-7.
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
//! **Cost.** About 14 (sigmoid, tanh, elu) to 19 (gelu's erf form) vector
//! instructions per 16 values, plus the widening and rounding, against 25–45
//! for the `f32` kernels plus their conversions through L1 buffers. Needs
//! AVX512DQ (`vreduceps`) besides AVX-512F. NaN gives NaN, ±∞ give the
//! limits.

use compute_core::{Element, HostSlice, UnaryOp};

use crate::isa::Isa;

/// `out[i] = op(x[i])` in one pass when this CPU has AVX-512F and DQ, `op` is a
/// transcendental and `x` and `out` are both `f16` or both `bf16`; with
/// `stream`, large outputs are written with non-temporal stores (the loop
/// ends with `sfence`). Returns false, having written nothing, otherwise.
pub fn fused<T: Element>(isa: Isa, op: UnaryOp, x: HostSlice<'_>, out: &mut [T], stream: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512
        && op.is_transcendental()
        && let Some(tok) = x86::Tok::detect()
    {
        let Some((x, out, f16)) = super::avx512::half_bits(x, out) else { return false };
        return x86::run(tok, op, x, out, f16, stream);
    }
    let _ = (isa, op, x, out, stream);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use compute_core::{GeluForm, UnaryOp};

    pub(super) use super::super::avx512::Tok;
    use super::super::avx512::{
        EXP2_T_MIN, EXPM1_T_MIN, LOG2E, Narrow, Zmm, exp2_above_half, expm1_2, load, recip, splat, store, zmm,
    };

    /// `−2·√(2/π)·log₂ e` and `0.044715` times it: gelu's `−2u·log₂ e = x·(A + B·x²)`.
    const GELU_A: f32 = -2.0 * 0.797_884_6 * LOG2E;
    const GELU_B: f32 = GELU_A * 0.044_715;
    /// The top of the sigmoid's `2ᵗ`: above it `1 + 2ᵗ` would leave
    /// `vrcp14ps`'s normal range.
    const T_MAX: f32 = 125.0;
    /// The factor of the sigmoid's tail: `x·σ` with `x = −∞` would be `−∞·0`.
    const FACTOR_MIN: f32 = -200.0;
    /// `tanh x ≈ x·P(x²)/Q(x²)` on `|x| ≤ 7` (beyond, `tanh x` is `±1` within
    /// 1.7e-6): near-minimax of relative error (Lawson-reweighted linearised
    /// least squares), 1.3e-6 in `f32` arithmetic.
    const TANH_P: [f32; 4] = [0.999_998_99, 0.123_220_47, 0.002_293_078_5, 3.995_817_2e-6];
    const TANH_Q: [f32; 4] = [1.0, 0.456_546_1, 0.021_151_574, 0.000_143_983_23];
    /// Where [`TANH_P`]/[`TANH_Q`] stop.
    const TANH_X_MAX: f32 = 7.0;
    /// `log₂ Φ(−a) + a²·log₂(e)/2 + ½ ≈ Σ GELU_H[k]·aᵏ` on `0 ≤ a ≤ 5`
    /// ([`GELU_A_MAX`]), fitted so that gelu's result is within 1e-6 relative
    /// for `|x| ≤ 3` and within a third of the conformance tolerance beyond
    /// (the `+½` is [`exp2_above_half`]'s shift).
    const GELU_H: [f32; 7] = [
        -0.499_998_57,
        -1.151_159_8,
        0.262_486_58,
        -0.053_333_614,
        0.008_050_005,
        -0.000_764_062_9,
        3.280_605_6e-5,
    ];
    /// Where [`GELU_H`] stops: `Φ(−5)·5 = 1.4e-6`, and beyond it gelu's
    /// negative tail, below 1e-6, is only kept to an absolute 1e-7.
    const GELU_A_MAX: f32 = 5.0;
    /// `log₂(e)/2`: `Φ(−a) = 2^(−a²·log₂(e)/2)·…`.
    const HALF_LOG2E: f32 = 0.5 * LOG2E;

    const SIGMOID: u8 = 0;
    const SWISH: u8 = 1;
    const GELU_TANH: u8 = 2;
    const TANH: u8 = 3;
    const ELU: u8 = 4;
    const GELU_ERF: u8 = 5;

    #[inline(always)]
    fn horner<const N: usize>(z: Zmm, x: __m512, c: &[f32; N]) -> __m512 {
        let mut acc = splat(z, c[N - 1]);
        for &k in c[..N - 1].iter().rev() {
            acc = zmm!(_mm512_fmadd_ps(acc, x, splat(z, k)));
        }
        acc
    }

    /// `σ(z)` from `s = −z·log₂ e + ½`: `1/(1 + 2^(s − ½))`, `s` clamped first
    /// (NaN kept: `max`/`min` return their second operand when either is NaN).
    #[inline(always)]
    fn sigmoid_of(z: Zmm, s: __m512) -> __m512 {
        let s = zmm!(_mm512_min_ps(splat(z, T_MAX + 0.5), _mm512_max_ps(splat(z, EXP2_T_MIN + 0.5), s)));
        recip(z, zmm!(_mm512_add_ps(splat(z, 1.0), exp2_above_half(z, s))))
    }

    /// `f·σ`, with `f` kept above [`FACTOR_MIN`] (so `−∞·σ` is not `−∞`).
    #[inline(always)]
    fn times(z: Zmm, f: __m512, sigma: __m512) -> __m512 {
        zmm!(_mm512_mul_ps(_mm512_max_ps(splat(z, FACTOR_MIN), f), sigma))
    }

    /// `tanh x = x·P(x²)/Q(x²)` with `x` clamped to `±`[`TANH_X_MAX`]; the
    /// division is `vrcp14ps` and one correction of the quotient.
    #[inline(always)]
    fn tanh(z: Zmm, x: __m512) -> __m512 {
        let c = zmm!(_mm512_min_ps(splat(z, TANH_X_MAX), _mm512_max_ps(splat(z, -TANH_X_MAX), x)));
        let s = zmm!(_mm512_mul_ps(c, c));
        let n = zmm!(_mm512_mul_ps(c, horner(z, s, &TANH_P)));
        let d = horner(z, s, &TANH_Q);
        zmm!({
            let r = _mm512_rcp14_ps(d);
            let y = _mm512_mul_ps(n, r);
            _mm512_fmadd_ps(_mm512_fnmadd_ps(y, d, n), r, y)
        })
    }

    /// `x` where `x > 0`, else `alpha·(eˣ − 1)` (a NaN compares false and
    /// stays; the exponential of positive `x` is computed and not used).
    #[inline(always)]
    fn elu(z: Zmm, x: __m512, alpha: f32) -> __m512 {
        let t = zmm!(_mm512_max_ps(splat(z, EXPM1_T_MIN), _mm512_mul_ps(x, splat(z, LOG2E))));
        let below = zmm!(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, splat(z, 0.0)));
        zmm!(_mm512_mask_mul_ps(x, below, splat(z, alpha), expm1_2(z, t)))
    }

    /// `gelu x = max(x, 0) − |x|·Φ(−|x|)` with `Φ(−a) = 2^(h(a) − a²·log₂(e)/2)`
    /// and `h` the polynomial [`GELU_H`] of `a` clamped to [`GELU_A_MAX`].
    /// No cancellation: `Φ(−a) ≤ ½`.
    #[inline(always)]
    fn gelu_erf(z: Zmm, x: __m512) -> __m512 {
        let a = zmm!(_mm512_abs_ps(x));
        // `min` keeps a NaN `a`.
        let ac = zmm!(_mm512_min_ps(splat(z, GELU_A_MAX), a));
        let h = horner(z, ac, &GELU_H);
        // `a = ∞` makes `s = −∞`, clamped; a NaN stays.
        let s = zmm!(_mm512_max_ps(
            splat(z, EXP2_T_MIN + 0.5),
            _mm512_fmadd_ps(_mm512_mul_ps(a, splat(z, -HALF_LOG2E)), a, h)
        ));
        let q = exp2_above_half(z, s);
        // `ac`, not `a`, as the factor: `∞·0` would be NaN.
        zmm!(_mm512_fnmadd_ps(ac, q, _mm512_max_ps(splat(z, 0.0), x)))
    }

    /// Op number `OP` on 16 values.
    #[inline(always)]
    fn lane<const OP: u8>(z: Zmm, x: __m512, alpha: f32) -> __m512 {
        let half = splat(z, 0.5);
        match OP {
            SIGMOID => sigmoid_of(z, zmm!(_mm512_fmadd_ps(x, splat(z, -LOG2E), half))),
            SWISH => times(z, x, sigmoid_of(z, zmm!(_mm512_fmadd_ps(x, splat(z, -LOG2E), half)))),
            GELU_TANH => {
                let inner = zmm!(_mm512_fmadd_ps(splat(z, GELU_B), _mm512_mul_ps(x, x), splat(z, GELU_A)));
                times(z, x, sigmoid_of(z, zmm!(_mm512_fmadd_ps(x, inner, half))))
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
        if !(Isa::Avx512.is_supported() && std::arch::is_x86_feature_detected!("avx512dq")) {
            eprintln!("SKIPPED: no AVX-512 DQ on this CPU");
            return;
        }
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
                        HostVec::F16(o) => fused(Isa::Avx512, op, x.as_slice(), o, stream),
                        HostVec::BF16(o) => fused(Isa::Avx512, op, x.as_slice(), o, stream),
                        _ => false,
                    };
                    assert!(done, "{op:?} {dtype}: no fused loop");
                    if let Some(msg) = compare_typed(&spec, &[x.as_slice()], out.as_slice(), 1.0) {
                        panic!("{op:?} {dtype} (stream {stream}): {msg}");
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
        assert!(!fused(Isa::Avx2, UnaryOp::Sigmoid, HostSlice::F16(&x), &mut out, false));
        assert!(out.iter().all(|v| *v == f16::ZERO), "nothing written");
    }
}

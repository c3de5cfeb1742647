//! The transcendental element-wise ops (sigmoid, tanh, swish, elu, gelu) on
//! `f16` and `bf16` data, on AVX-512: one pass, 16 values per step widened in
//! registers, computed, rounded and stored, with no `f32` staging buffer.
//!
//! **Accuracy.** The result is stored with 8 (`bf16`) or 11 (`f16`)
//! significant bits, so these kernels compute to about 2⁻¹⁸ relative instead
//! of the `f32` kernels' few ulps ([`crate::simd::math`]): `2ᵗ` is a degree-4
//! polynomial on `[−½, ½]` scaled by `vscalefps` (relative error 2.7e-6),
//! `2ᵗ − 1` is `t·Q(t)` with `Q` of degree 4 (5.8e-7, so `tanh` and `elu` stay
//! relative near 0), and the division is `vrcp14ps` with one Newton step.
//! Each function's error before rounding is at most 4e-6 relative, below the
//! conformance suite's `1e-5` for the transcendentals, plus `1e-6` absolute
//! where the result is tiny: results below about 2⁻¹²⁰ (the far tails of
//! sigmoid, swish and gelu) come out as tiny values or zeros instead of being
//! rounded exactly. gelu's erf form keeps the `f32` kernel
//! ([`math::gelu_erf`]), only fused. On a CPU with AVX512_BF16 the `bf16`
//! results are rounded by `vcvtneps2bf16`, which rounds to nearest even as
//! every other path does but flushes subnormal results to zero.
//!
//! **Cost.** About 13 (sigmoid) to 20 (tanh) vector instructions per 16
//! values, against 25–35 for the `f32` kernels plus their conversions
//! through L1 buffers. NaN gives NaN, ±∞ give the limits.

use compute_core::{Element, HostSlice, UnaryOp};

use crate::isa::Isa;

/// `out[i] = op(x[i])` in one pass when this CPU has AVX-512F, `op` is a
/// transcendental and `x` and `out` are both `f16` or both `bf16`; with
/// `stream`, large outputs are written with non-temporal stores (the loop
/// ends with `sfence`). Returns false, having written nothing, otherwise.
pub fn fused<T: Element>(isa: Isa, op: UnaryOp, x: HostSlice<'_>, out: &mut [T], stream: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512
        && op.is_transcendental()
        && let Some(tok) = x86::Tok::detect()
    {
        let out_dtype = T::DTYPE;
        let out: &mut [u16] = match T::host_mut(out) {
            compute_core::HostSliceMut::F16(o) => bytemuck::cast_slice_mut(o),
            compute_core::HostSliceMut::BF16(o) => bytemuck::cast_slice_mut(o),
            _ => return false,
        };
        let (x, f16): (&[u16], bool) = match x {
            HostSlice::F16(s) if out_dtype == compute_core::DType::F16 => (bytemuck::cast_slice(s), true),
            HostSlice::BF16(s) if out_dtype == compute_core::DType::BF16 => (bytemuck::cast_slice(s), false),
            _ => return false,
        };
        x86::run(tok, op, x, out, f16, stream);
        return true;
    }
    let _ = (isa, op, x, out, stream);
    false
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use compute_core::{GeluForm, UnaryOp};

    use crate::simd::{Avx512, math};

    /// Proof that this CPU has AVX-512F, and whether it has AVX512_BF16.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct Tok {
        s: Avx512,
        bf16: bool,
    }

    impl Tok {
        /// The token if this CPU has AVX-512F (cached feature checks).
        pub(super) fn detect() -> Option<Tok> {
            Avx512::detect().map(|s| Tok { s, bf16: is_x86_feature_detected!("avx512bf16") })
        }
    }

    /// `log₂ e`.
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// `2ᶠ ≈ Σ EXP2[k]·fᵏ` on `|f| ≤ ½`: near-minimax of relative error
    /// (Lawson-reweighted least squares), 2.7e-6 in `f32` arithmetic.
    const EXP2: [f32; 5] = [0.999_999_3, 0.693_121_8, 0.240_247_44, 0.055_917_837, 0.009_570_08];
    /// `2ᶠ − 1 ≈ f·Σ EXPM1[k]·fᵏ` on `|f| ≤ ½`, relative error 5.8e-7 in `f32`.
    const EXPM1: [f32; 5] = [0.693_147_1, 0.240_223_51, 0.055_505_004, 0.009_666_243, 0.001_333_352_6];
    /// `−2·√(2/π)·log₂ e` and `0.044715` times it: gelu's `−2u·log₂ e = x·(A + B·x²)`.
    const GELU_A: f32 = -2.0 * 0.797_884_6 * LOG2E;
    const GELU_B: f32 = GELU_A * 0.044_715;
    /// The exponent range of the sigmoid's `2ᵗ`: above it `1 + 2ᵗ` would leave
    /// `vrcp14ps`'s normal range, below it `2ᵗ` is 0 in `f32` anyway.
    const T_MAX: f32 = 125.0;
    const T_MIN: f32 = -150.0;
    /// `2ᵗ − 1` is −1 in `f32` below this.
    const EXPM1_T_MIN: f32 = -40.0;
    /// The factor of the sigmoid's tail: `x·σ` with `x = −∞` would be `−∞·0`.
    const FACTOR_MIN: f32 = -200.0;

    const SIGMOID: u8 = 0;
    const SWISH: u8 = 1;
    const GELU_TANH: u8 = 2;
    const TANH: u8 = 3;
    const ELU: u8 = 4;
    const GELU_ERF: u8 = 5;

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn horner<const N: usize>(x: __m512, c: &[f32; N]) -> __m512 {
        let mut acc = splat(c[N - 1]);
        for &k in c[..N - 1].iter().rev() {
            acc = _mm512_fmadd_ps(acc, x, splat(k));
        }
        acc
    }

    /// `t` rounded to the nearest integer `n` and `t − n`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn split(t: __m512) -> (__m512, __m512) {
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        (n, _mm512_sub_ps(t, n))
    }

    /// `2ᵗ` for `t` in `[T_MIN, T_MAX]` (NaN stays NaN).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp2(t: __m512) -> __m512 {
        let (n, f) = split(t);
        _mm512_scalef_ps(horner(f, &EXP2), n)
    }

    /// `2ᵗ − 1` for `t` in `[EXPM1_T_MIN, 0]`, relative also near 0:
    /// `2ⁿ·(2ᶠ − 1) + (2ⁿ − 1)`, whose second term is 0 for `|t| ≤ ½`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn expm1_2(t: __m512) -> __m512 {
        let (n, f) = split(t);
        let q = _mm512_mul_ps(f, horner(f, &EXPM1));
        let whole = _mm512_sub_ps(_mm512_scalef_ps(splat(1.0), n), splat(1.0));
        _mm512_add_ps(_mm512_scalef_ps(q, n), whole)
    }

    /// `1/d` for `d` in `[1, 2¹²⁶]`: `vrcp14ps` (2⁻¹⁴) and one Newton step.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn recip(d: __m512) -> __m512 {
        let r = _mm512_rcp14_ps(d);
        _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, splat(1.0)), r)
    }

    /// `σ(z)` from `t = −z·log₂ e`: `1/(1 + 2ᵗ)`, `t` clamped first (NaN kept:
    /// `max`/`min` return their second operand when either is NaN).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sigmoid_of(t: __m512) -> __m512 {
        let t = _mm512_min_ps(splat(T_MAX), _mm512_max_ps(splat(T_MIN), t));
        recip(_mm512_add_ps(splat(1.0), exp2(t)))
    }

    /// `f·σ`, with `f` kept above [`FACTOR_MIN`] (so `−∞·σ` is not `−∞`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn times(f: __m512, sigma: __m512) -> __m512 {
        _mm512_mul_ps(_mm512_max_ps(splat(FACTOR_MIN), f), sigma)
    }

    /// `tanh x = sign(x)·(−m)/(2 + m)` with `m = e^(−2|x|) − 1`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn tanh(x: __m512) -> __m512 {
        let t = _mm512_max_ps(splat(EXPM1_T_MIN), _mm512_mul_ps(_mm512_abs_ps(x), splat(-2.0 * LOG2E)));
        let m = expm1_2(t);
        let y = _mm512_abs_ps(_mm512_mul_ps(m, recip(_mm512_add_ps(splat(2.0), m))));
        let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), sign))
    }

    /// `x` where `x > 0`, else `alpha·(eˣ − 1)`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn elu(x: __m512, alpha: f32) -> __m512 {
        let neg = _mm512_min_ps(splat(0.0), x);
        let t = _mm512_max_ps(splat(EXPM1_T_MIN), _mm512_mul_ps(neg, splat(LOG2E)));
        let below = _mm512_mul_ps(splat(alpha), expm1_2(t));
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, splat(0.0)), below, x)
    }

    /// Op number `OP` on 16 values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lane<const OP: u8>(s: Avx512, x: __m512, alpha: f32) -> __m512 {
        match OP {
            SIGMOID => sigmoid_of(_mm512_mul_ps(x, splat(-LOG2E))),
            SWISH => times(x, sigmoid_of(_mm512_mul_ps(x, splat(-LOG2E)))),
            GELU_TANH => {
                let inner = _mm512_fmadd_ps(splat(GELU_B), _mm512_mul_ps(x, x), splat(GELU_A));
                times(x, sigmoid_of(_mm512_mul_ps(x, inner)))
            }
            TANH => tanh(x),
            ELU => elu(x, alpha),
            _ => math::gelu_erf(s, x),
        }
    }

    /// 16 halves widened to `f32` (exact).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load(x: &[u16; 16], f16: bool) -> __m512 {
        // SAFETY: `x` is 32 readable bytes; the load takes any alignment.
        let h = unsafe { _mm256_loadu_si256(x.as_ptr().cast()) };
        if f16 { _mm512_cvtph_ps(h) } else { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))) }
    }

    /// 16 values rounded to `bf16` (nearest even; a NaN keeps its top bits, made quiet).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn to_bf16(v: __m512) -> __m256i {
        let b = _mm512_castps_si512(v);
        let top = _mm512_srli_epi32::<16>(b);
        let lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))));
        let quiet = _mm512_or_si512(top, _mm512_set1_epi32(0x40));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet))
    }

    /// 16 values rounded to `bf16` by `vcvtneps2bf16` (subnormal results flushed).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn to_bf16_native(v: __m512) -> __m256i {
        // SAFETY: both are plain 32-byte vectors; every bit pattern is a valid value of either.
        unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v)) }
    }

    /// How results are rounded and stored.
    #[derive(Clone, Copy, PartialEq)]
    enum Narrow {
        F16,
        Bf16,
        Bf16Native,
    }

    /// `v` rounded and stored to `out`, non-temporal when `stream` and `out`
    /// is 32-byte aligned. `Bf16Native` only where the CPU has AVX512_BF16.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store(out: &mut [u16; 16], v: __m512, narrow: Narrow, stream: bool) {
        let h = match narrow {
            Narrow::F16 => _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v),
            Narrow::Bf16 => to_bf16(v),
            // SAFETY: `Bf16Native` is chosen only where the CPU has AVX512_BF16 (see `run`).
            Narrow::Bf16Native => unsafe { to_bf16_native(v) },
        };
        let p = out.as_mut_ptr();
        if stream && (p as usize).is_multiple_of(32) {
            // SAFETY: `p` is 32 writable, 32-byte aligned bytes (checked).
            unsafe { _mm256_stream_si256(p.cast(), h) }
        } else {
            // SAFETY: `p` is 32 writable bytes; the store takes any alignment.
            unsafe { _mm256_storeu_si256(p.cast(), h) }
        }
    }

    /// `out = op(x)` through zero-padded blocks of 16 (a head or a tail).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn padded<const OP: u8>(s: Avx512, x: &[u16], out: &mut [u16], alpha: f32, f16: bool, narrow: Narrow) {
        for (xs, os) in x.chunks(16).zip(out.chunks_mut(16)) {
            let mut buf = [0u16; 16];
            buf[..xs.len()].copy_from_slice(xs);
            let mut res = [0u16; 16];
            store(&mut res, lane::<OP>(s, load(&buf, f16), alpha), narrow, false);
            os.copy_from_slice(&res[..os.len()]);
        }
    }

    /// The loop of op number `OP`: a head up to the output's first 32-byte
    /// boundary and a tail through padded blocks, whole aligned blocks between.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn body<const OP: u8>(s: Avx512, x: &[u16], out: &mut [u16], alpha: f32, f16: bool, narrow: Narrow, stream: bool) {
        let n = x.len().min(out.len());
        let (x, out) = (&x[..n], &mut out[..n]);
        let head = out.as_ptr().align_offset(32).min(n);
        let (oh, ob) = out.split_at_mut(head);
        let (xh, xb) = x.split_at(head);
        padded::<OP>(s, xh, oh, alpha, f16, narrow);
        let (ob, ot) = ob.as_chunks_mut::<16>();
        let (xb, xt) = xb.as_chunks::<16>();
        for (o, x) in ob.iter_mut().zip(xb) {
            store(o, lane::<OP>(s, load(x, f16), alpha), narrow, stream);
        }
        if stream {
            _mm_sfence();
        }
        padded::<OP>(s, xt, ot, alpha, f16, narrow);
    }

    #[target_feature(enable = "avx512f")]
    fn entry(tok: Tok, op: UnaryOp, x: &[u16], out: &mut [u16], narrow: Narrow, stream: bool) {
        let (s, f16) = (tok.s, narrow == Narrow::F16);
        match op {
            UnaryOp::Sigmoid => body::<SIGMOID>(s, x, out, 0.0, f16, narrow, stream),
            UnaryOp::Swish => body::<SWISH>(s, x, out, 0.0, f16, narrow, stream),
            UnaryOp::Gelu(GeluForm::Tanh) => body::<GELU_TANH>(s, x, out, 0.0, f16, narrow, stream),
            UnaryOp::Tanh => body::<TANH>(s, x, out, 0.0, f16, narrow, stream),
            UnaryOp::Elu { alpha } => body::<ELU>(s, x, out, alpha, f16, narrow, stream),
            UnaryOp::Gelu(GeluForm::Erf) => body::<GELU_ERF>(s, x, out, 0.0, f16, narrow, stream),
            // Not a transcendental: `fused` does not call this.
            _ => {}
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    fn entry_bf16(tok: Tok, op: UnaryOp, x: &[u16], out: &mut [u16], stream: bool) {
        entry(tok, op, x, out, Narrow::Bf16Native, stream)
    }

    /// See [`super::fused`]: `x` and `out` hold `f16` bits when `f16`, else `bf16` bits.
    pub(super) fn run(tok: Tok, op: UnaryOp, x: &[u16], out: &mut [u16], f16: bool, stream: bool) {
        let narrow = if f16 { Narrow::F16 } else { Narrow::Bf16 };
        if !f16 && tok.bf16 {
            // SAFETY: the token proves AVX-512F, and `tok.bf16` AVX512_BF16.
            unsafe { entry_bf16(tok, op, x, out, stream) }
        } else {
            // SAFETY: the token proves AVX-512F.
            unsafe { entry(tok, op, x, out, narrow, stream) }
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
        if !Isa::Avx512.is_supported() {
            eprintln!("SKIPPED: no AVX-512 on this CPU");
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

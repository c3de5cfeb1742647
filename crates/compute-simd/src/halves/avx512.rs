//! AVX-512 building blocks of the fused half-precision loops
//! ([`super::transcendental`], [`super::rows`]): 16 halves widened to a `zmm`
//! and rounded back, whole or masked, and the exponentials those loops need
//! at the accuracy a half result keeps.
//!
//! Every function is `#[inline(always)]` and takes a [`Zmm`], the proof that
//! the CPU has AVX-512F: the loops' entries, compiled for AVX-512, inline
//! them whole (a `#[target_feature]` helper would not be inlined into a loop
//! compiled for other features, and a call per vector costs more than the
//! work). Masked 16-bit loads and stores also need AVX512BW and VL, and
//! [`Narrow::Bf16Native`] AVX512_BF16: [`Tok`] says whether the CPU has them.

use std::arch::x86_64::*;

/// Proof that this CPU has AVX-512F: only [`Tok::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Zmm(());

/// Proof that this CPU has AVX-512F, and which of the extensions the loops
/// use it has.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tok {
    /// AVX-512F.
    pub(super) z: Zmm,
    /// AVX512_BF16 (`vcvtneps2bf16`).
    pub(super) bf16: bool,
    /// AVX512BW and AVX512VL (masked loads and stores of 16-bit values).
    pub(super) bw_vl: bool,
    /// AVX512DQ (`vreduceps`, for [`exp2_above_half`]).
    pub(super) dq: bool,
}

impl Tok {
    /// The token if this CPU has AVX-512F (cached feature checks).
    pub(super) fn detect() -> Option<Tok> {
        is_x86_feature_detected!("avx512f").then(|| Tok {
            z: Zmm(()),
            bf16: is_x86_feature_detected!("avx512bf16"),
            bw_vl: is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl"),
            dq: is_x86_feature_detected!("avx512dq"),
        })
    }
}

/// Calls AVX-512F intrinsics; the [`Zmm`] in scope proves the CPU has them.
macro_rules! zmm {
    ($e:expr) => {
        // SAFETY: a `Zmm` exists only on CPUs with avx512f (see `Tok::detect`),
        // and these helpers only run inlined into loops compiled for it.
        unsafe { $e }
    };
}
pub(super) use zmm;

/// How results are rounded to 16 bits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Narrow {
    /// `vcvtps2ph`, nearest even.
    F16,
    /// Integer rounding to nearest even; a NaN keeps its top bits, made quiet
    /// (bit for bit as [`super::convert`]).
    Bf16,
    /// `vcvtneps2bf16` (AVX512_BF16): nearest even, subnormal results flushed.
    Bf16Native,
}

impl Narrow {
    /// The rounding for `f16` or `bf16` output on a CPU with `tok`.
    pub(super) fn new(tok: Tok, f16: bool) -> Narrow {
        match (f16, tok.bf16) {
            (true, _) => Narrow::F16,
            (false, true) => Narrow::Bf16Native,
            (false, false) => Narrow::Bf16,
        }
    }

    /// Whether the inputs are `f16` (else `bf16`).
    pub(super) fn f16(self) -> bool {
        self == Narrow::F16
    }
}

/// The bits of `x` and `out` when both are `f16` or both `bf16`, and whether
/// they are `f16`; `None` for any other pair of dtypes.
pub(super) fn half_bits<'a, T: compute_core::Element>(
    x: compute_core::HostSlice<'a>,
    out: &'a mut [T],
) -> Option<(&'a [u16], &'a mut [u16], bool)> {
    use compute_core::{HostSlice, HostSliceMut};
    match (x, T::host_mut(out)) {
        (HostSlice::F16(x), HostSliceMut::F16(o)) => Some((bytemuck::cast_slice(x), bytemuck::cast_slice_mut(o), true)),
        (HostSlice::BF16(x), HostSliceMut::BF16(o)) => {
            Some((bytemuck::cast_slice(x), bytemuck::cast_slice_mut(o), false))
        }
        _ => None,
    }
}

/// `log₂ e`.
pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `2^(g − ½) ≈ Σ EXP2_HALF[k]·gᵏ` on `0 ≤ g < 1`, with `2⁰ = 1` exactly at
/// `g = ½` in `f32` Horner evaluation (so `e⁰` in softmax is 1):
/// near-minimax of relative error (Lawson-reweighted least squares), 2.9e-6
/// in `f32` arithmetic.
pub(super) const EXP2_HALF: [f32; 5] = [0.707_108_8, 0.490_021_6, 0.170_755_65, 0.036_740_735, 0.009_582_818_5];
/// `2ᶠ − 1 ≈ f·Σ EXPM1[k]·fᵏ` on `|f| ≤ ½`, relative error 5.8e-7 in `f32`
/// (the leading coefficient is `ln 2`, as it is in the series).
pub(super) const EXPM1: [f32; 5] =
    [std::f32::consts::LN_2, 0.240_223_51, 0.055_505_004, 0.009_666_243, 0.001_333_352_6];
/// The exponentials take `t` from here (below it `2ᵗ` is 0 in `f32`).
pub(super) const EXP2_T_MIN: f32 = -150.0;
/// [`expm1_2`] takes `t` from here (below it `2ᵗ − 1` is −1 in `f32`).
pub(super) const EXPM1_T_MIN: f32 = -40.0;

#[inline(always)]
pub(super) fn splat(z: Zmm, x: f32) -> __m512 {
    let _ = z;
    zmm!(_mm512_set1_ps(x))
}

#[inline(always)]
fn horner<const N: usize>(z: Zmm, x: __m512, c: &[f32; N]) -> __m512 {
    let mut acc = splat(z, c[N - 1]);
    for &k in c[..N - 1].iter().rev() {
        acc = zmm!(_mm512_fmadd_ps(acc, x, splat(z, k)));
    }
    acc
}

/// `t` rounded to the nearest integer `n`, and `t − n`.
#[inline(always)]
fn split(z: Zmm, t: __m512) -> (__m512, __m512) {
    let _ = z;
    let n = zmm!(_mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t));
    (n, zmm!(_mm512_sub_ps(t, n)))
}

/// `2^(s − ½)` for `s` from `EXP2_T_MIN + ½` up to 127 (NaN stays NaN),
/// relative error 2.9e-6, in six instructions: `vreduceps` gives `g = s −
/// ⌊s⌋` and `vscalefps` multiplies by `2^⌊s⌋` itself. Callers fold the `+½`
/// into the constant of the arithmetic that makes `s`. Needs AVX512DQ
/// ([`Tok::dq`]).
#[inline(always)]
pub(super) fn exp2_above_half(z: Zmm, s: __m512) -> __m512 {
    // SAFETY: the caller checked AVX512DQ.
    let g = unsafe { _mm512_reduce_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(s) };
    zmm!(_mm512_scalef_ps(horner(z, g, &EXP2_HALF), s))
}

/// `2ᵗ − 1` for `t` in `[EXPM1_T_MIN, 0]`, relative also near 0:
/// `2ⁿ·(2ᶠ − 1) + (2ⁿ − 1)` in one rounding, whose second term is 0 for
/// `|t| ≤ ½`.
#[inline(always)]
pub(super) fn expm1_2(z: Zmm, t: __m512) -> __m512 {
    let (n, f) = split(z, t);
    let one = splat(z, 1.0);
    zmm!({
        let q = _mm512_mul_ps(f, horner(z, f, &EXPM1));
        let p = _mm512_scalef_ps(one, n);
        _mm512_fmadd_ps(p, q, _mm512_sub_ps(p, one))
    })
}

/// 16 halves in a `__m256i` widened to `f32` (exact).
#[inline(always)]
fn widen(z: Zmm, h: __m256i, f16: bool) -> __m512 {
    let _ = z;
    if f16 {
        zmm!(_mm512_cvtph_ps(h))
    } else {
        zmm!(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))))
    }
}

/// 16 halves widened to `f32` (exact).
#[inline(always)]
pub(super) fn load(z: Zmm, x: &[u16; 16], f16: bool) -> __m512 {
    // SAFETY: `x` is 32 readable bytes; the load takes any alignment.
    widen(z, unsafe { _mm256_loadu_si256(x.as_ptr().cast()) }, f16)
}

/// The first `x.len()` (< 16) halves widened, zeros in the other lanes.
/// Only where the CPU has AVX512BW and VL ([`Tok::bw_vl`]).
#[inline(always)]
pub(super) fn load_part(z: Zmm, x: &[u16], f16: bool) -> __m512 {
    let k = lanes(x.len());
    // SAFETY: the caller checked AVX512BW and VL; the mask covers `x.len()`
    // values, all readable; masked-off lanes are not accessed.
    widen(z, unsafe { _mm256_maskz_loadu_epi16(k, x.as_ptr().cast()) }, f16)
}

/// The mask of the first `n` (≤ 16) lanes.
#[inline(always)]
pub(super) fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

/// 16 values rounded to `bf16` (nearest even; a NaN keeps its top bits, made quiet).
#[inline(always)]
fn to_bf16(z: Zmm, v: __m512) -> __m256i {
    let _ = z;
    zmm!({
        let b = _mm512_castps_si512(v);
        let top = _mm512_srli_epi32::<16>(b);
        let lsb = _mm512_and_si512(top, _mm512_set1_epi32(1));
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))));
        let quiet = _mm512_or_si512(top, _mm512_set1_epi32(0x40));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet))
    })
}

/// 16 values rounded as `narrow` says.
#[inline(always)]
fn narrowed(z: Zmm, v: __m512, narrow: Narrow) -> __m256i {
    match narrow {
        Narrow::F16 => zmm!(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)),
        Narrow::Bf16 => to_bf16(z, v),
        // SAFETY: `Narrow::Bf16Native` is only made where the CPU has
        // AVX512_BF16 (`Narrow::new` from a `Tok`); both vectors are plain
        // 32 bytes, every bit pattern valid in either.
        Narrow::Bf16Native => unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v)) },
    }
}

/// `v` rounded and stored to `out`, non-temporal when `stream` and `out` is
/// 32-byte aligned.
#[inline(always)]
pub(super) fn store(z: Zmm, out: &mut [u16; 16], v: __m512, narrow: Narrow, stream: bool) {
    let h = narrowed(z, v, narrow);
    let p = out.as_mut_ptr();
    if stream && (p as usize).is_multiple_of(32) {
        // SAFETY: `p` is 32 writable, 32-byte aligned bytes (checked).
        unsafe { _mm256_stream_si256(p.cast(), h) }
    } else {
        // SAFETY: `p` is 32 writable bytes; the store takes any alignment.
        unsafe { _mm256_storeu_si256(p.cast(), h) }
    }
}

/// The first `out.len()` (< 16) lanes of `v` rounded and stored. Only
/// where the CPU has AVX512BW and VL ([`Tok::bw_vl`]).
#[inline(always)]
pub(super) fn store_part(z: Zmm, out: &mut [u16], v: __m512, narrow: Narrow) {
    let k = lanes(out.len());
    let h = narrowed(z, v, narrow);
    // SAFETY: the caller checked AVX512BW and VL; the mask covers
    // `out.len()` values, all writable; masked-off lanes are not accessed.
    unsafe { _mm256_mask_storeu_epi16(out.as_mut_ptr().cast(), k, h) }
}

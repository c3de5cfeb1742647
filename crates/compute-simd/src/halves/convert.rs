//! Conversions between `f32` and the 2-byte float types, vectorised and
//! picked at run time: F16C (`vcvtph2ps` / `vcvtps2ph`, 8 values per
//! instruction) for `f16` on the AVX2 and AVX-512 paths, integer shifts and
//! adds compiled for AVX2 for `bf16`, and the `half` crate's converters (which
//! use F16C or the Arm `fp16` instructions where the CPU has them) elsewhere.
//!
//! Every conversion rounds to nearest, ties to even, keeps NaN a NaN and
//! sends values past the narrow type's range to ±∞, bit for bit as
//! `half::f16::from_f32` / `half::bf16::from_f32` (tested below).

use compute_core::{Element, bf16, f16};

use crate::isa::Isa;

/// `dst[i] = src[i]` as `f32` (exact) over the shorter length.
pub fn widen<T: Element>(isa: Isa, src: &[T], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    if let Some(s) = cast::<T, f32>(src) {
        dst.copy_from_slice(s);
    } else if let Some(s) = cast::<T, f16>(src) {
        widen_f16(isa, bytemuck::cast_slice(s), dst);
    } else if let Some(s) = cast::<T, bf16>(src) {
        widen_bf16(isa, bytemuck::cast_slice(s), dst);
    }
}

/// `dst[i] = src[i]` rounded to `T` over the shorter length.
pub fn narrow<T: Element>(isa: Isa, src: &[f32], dst: &mut [T]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    if let Some(d) = cast_mut::<T, f32>(dst) {
        d.copy_from_slice(src);
    } else if let Some(d) = cast_mut::<T, f16>(dst) {
        narrow_f16(isa, src, bytemuck::cast_slice_mut(d));
    } else if let Some(d) = cast_mut::<T, bf16>(dst) {
        narrow_bf16(isa, src, bytemuck::cast_slice_mut(d));
    }
}

/// `s` as a slice of `U` when `T` is `U` (free; the dtype decides).
fn cast<T: Element, U: Element>(s: &[T]) -> Option<&[U]> {
    (T::DTYPE == U::DTYPE).then(|| U::from_host(T::host(s))).flatten()
}

fn cast_mut<T: Element, U: Element>(s: &mut [T]) -> Option<&mut [U]> {
    (T::DTYPE == U::DTYPE).then(|| U::from_host_mut(T::host_mut(s))).flatten()
}

/// Whether this path converts `f16` with F16C.
#[cfg(target_arch = "x86_64")]
fn f16c(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512) && std::arch::is_x86_feature_detected!("f16c")
}

fn widen_f16(isa: Isa, src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if f16c(isa) {
        // SAFETY: the CPU has AVX2 (the path was chosen only if supported) and F16C (checked).
        return unsafe { x86::widen_f16(src, dst) };
    }
    let _ = isa;
    use half::slice::HalfFloatSliceExt;
    let src: &[f16] = bytemuck::cast_slice(src);
    src.convert_to_f32_slice(dst);
}

fn narrow_f16(isa: Isa, src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if f16c(isa) {
        // SAFETY: as in `widen_f16`.
        return unsafe { x86::narrow_f16(src, dst) };
    }
    let _ = isa;
    use half::slice::HalfFloatSliceExt;
    let dst: &mut [f16] = bytemuck::cast_slice_mut(dst);
    dst.convert_from_f32_slice(src);
}

fn widen_bf16(isa: Isa, src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: the AVX2 and AVX-512 paths are chosen only on CPUs with AVX2.
        return unsafe { x86::widen_bf16(src, dst) };
    }
    let _ = isa;
    widen_bf16_lanes(src, dst);
}

fn narrow_bf16(isa: Isa, src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: as in `widen_bf16`.
        return unsafe { x86::narrow_bf16(src, dst) };
    }
    let _ = isa;
    narrow_bf16_lanes(src, dst);
}

/// bf16 → f32: the 16 bits become the top half of the f32. Branch-free, so
/// the compiler vectorises it at whatever width the caller is compiled for.
#[inline(always)]
fn widen_bf16_lanes(src: &[u16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(s) << 16);
    }
}

/// f32 → bf16, round to nearest even: add `0x7fff` plus the lowest kept bit,
/// keep the top 16 bits; a NaN keeps its sign and top payload bits and is
/// made quiet. Branch-free (the NaN case is a select), so it vectorises.
#[inline(always)]
fn narrow_bf16_lanes(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
        let quiet = ((b >> 16) as u16) | 0x0040;
        *d = if x.is_nan() { quiet } else { rounded };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, so 8 values of `src` (16 bytes) and 8 of
            // `dst` (32 bytes) lie in bounds; both intrinsics accept any alignment.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for (d, &s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = half::f16::from_bits(s).to_f32();
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn narrow_f16(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: as in `widen_f16`, with the roles of the slices swapped.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
            }
            i += 8;
        }
        for (d, &s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = half::f16::from_f32(s).to_bits();
        }
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
        super::widen_bf16_lanes(src, dst);
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn narrow_bf16(src: &[f32], dst: &mut [u16]) {
        super::narrow_bf16_lanes(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute_core::rng::Rng;

    fn every_isa() -> Vec<Isa> {
        Isa::available()
    }

    /// Values that reach every rounding case: ties both ways, subnormals of
    /// both types, overflow to ∞, ±0, ±∞, NaNs with payloads, random bits.
    fn probe_values() -> Vec<f32> {
        let mut rng = Rng::new(compute_core::rng::fresh_seed());
        let mut v = vec![
            0.0,
            -0.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            65504.0,
            65519.99,
            65520.0,
            -1e9,
            2f32.powi(-24),
            2f32.powi(-25),
            3.0 * 2f32.powi(-26),
            1e-45,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc1_2345),
        ];
        v.extend((0..5000).map(|_| f32::from_bits(rng.next_u64() as u32)));
        v.extend((0..5000).map(|_| rng.uniform(-70_000.0, 70_000.0)));
        v
    }

    #[test]
    fn narrowing_matches_half_bit_for_bit_on_every_path() {
        let x = probe_values();
        for isa in every_isa() {
            // Odd offsets and lengths reach the scalar tails.
            for (start, end) in [(0, x.len()), (3, x.len() - 5), (1, 8), (0, 7)] {
                let src = &x[start..end];
                let mut h = vec![f16::ZERO; src.len()];
                narrow(isa, src, &mut h);
                let mut b = vec![bf16::ZERO; src.len()];
                narrow(isa, src, &mut b);
                for (i, &v) in src.iter().enumerate() {
                    let (want_h, want_b) = (f16::from_f32(v), bf16::from_f32(v));
                    if v.is_nan() {
                        assert!(h[i].is_nan() && b[i].is_nan(), "{isa} NaN {:#x}", v.to_bits());
                        assert_eq!(b[i].to_bits(), want_b.to_bits(), "{isa} bf16 NaN payload {:#x}", v.to_bits());
                    } else {
                        assert_eq!(h[i].to_bits(), want_h.to_bits(), "{isa} f16 of {v:e} ({:#x})", v.to_bits());
                        assert_eq!(b[i].to_bits(), want_b.to_bits(), "{isa} bf16 of {v:e} ({:#x})", v.to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn widening_is_exact_on_every_path() {
        let mut rng = Rng::new(compute_core::rng::fresh_seed());
        let bits: Vec<u16> = (0..70_000).map(|i| if i < 65_536 { i as u16 } else { rng.next_u64() as u16 }).collect();
        let h: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
        let b: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
        for isa in every_isa() {
            let mut out = vec![0.0f32; bits.len() - 3];
            widen(isa, &h[3..], &mut out);
            for (o, v) in out.iter().zip(&h[3..]) {
                assert!(o.to_bits() == v.to_f32().to_bits() || (o.is_nan() && v.is_nan()), "{isa} f16 {v:?}");
            }
            widen(isa, &b[3..], &mut out);
            // A bf16 NaN widens to an f32 NaN with the same top bits (a
            // shift: signalling NaNs are not quieted, unlike `half`'s to_f32).
            for (o, v) in out.iter().zip(&b[3..]) {
                assert_eq!(o.to_bits(), u32::from(v.to_bits()) << 16, "{isa} bf16 {v:?}");
            }
        }
    }
}

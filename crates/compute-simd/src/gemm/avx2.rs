//! AVX2+FMA micro-kernel: `MR` rows × `NV` ymm vectors (`NR = 8·NV` columns).
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::kernel::MicroKernel;

/// Rows of the AVX2 register tile.
pub(super) const MR: usize = 6;
/// ymm vectors per tile row.
const NV: usize = 2;

/// Token for the AVX2+FMA kernel; only exists when the CPU has both.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx2(());

impl Avx2 {
    /// `Some` when the running CPU supports AVX2 and FMA.
    pub(super) fn new() -> Option<Self> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(Avx2(()))
    }
}

// SAFETY: `Avx2` is only constructed by `new`, after checking AVX2 and FMA.
unsafe impl MicroKernel for Avx2 {
    const MR: usize = MR;
    const NR: usize = 8 * NV;

    #[inline]
    unsafe fn tile(&self, kc: usize, a: *const f32, b: *const f32, rsb: usize, c: *mut f32, ldc: usize, acc: bool) {
        // SAFETY: the caller upholds the pointer contract; `self` proves AVX2+FMA.
        unsafe { kernel::<MR, NV>(kc, a, b, rsb, c, ldc, acc) }
    }
}

/// # Safety
/// See [`MicroKernel::tile`]; the CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const M: usize, const V: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    rsb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: every access stays inside the ranges the caller guarantees:
    // `a[p·M + r]`, `b[p·rsb + 8·v ..+8]` (8·V = NR), `c[r·ldc + 8·v ..+8]`.
    // Prefetches never fault.
    unsafe {
        for r in 0..M {
            _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc + 8 * V - 1) as *const i8);
        }
        let mut acc = [[_mm256_setzero_ps(); V]; M];
        let mut a = a;
        let mut b = b;
        for _ in 0..kc {
            let mut bv = [_mm256_setzero_ps(); V];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(b.add(8 * v));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*a.add(r));
                for (x, bb) in row.iter_mut().zip(&bv) {
                    *x = _mm256_fmadd_ps(av, *bb, *x);
                }
            }
            a = a.add(M);
            b = b.add(rsb);
        }
        for (r, row) in acc.iter().enumerate() {
            let cr = c.add(r * ldc);
            for (v, x) in row.iter().enumerate() {
                let p = cr.add(8 * v);
                let out = if accumulate { _mm256_add_ps(_mm256_loadu_ps(p), *x) } else { *x };
                _mm256_storeu_ps(p, out);
            }
        }
    }
}

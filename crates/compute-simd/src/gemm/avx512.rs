//! AVX-512F micro-kernel: `MR` rows × `NV` zmm vectors (`NR = 16·NV` columns).
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::kernel::MicroKernel;

/// Rows of the AVX-512 register tile.
pub(super) const MR: usize = 14;
/// zmm vectors per tile row.
const NV: usize = 2;

/// Token for the AVX-512 kernel; only exists when the CPU has AVX-512F.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx512(());

impl Avx512 {
    /// `Some` when the running CPU supports AVX-512F.
    pub(super) fn new() -> Option<Self> {
        is_x86_feature_detected!("avx512f").then_some(Avx512(()))
    }
}

// SAFETY: `Avx512` is only constructed by `new`, after checking AVX-512F.
unsafe impl MicroKernel for Avx512 {
    const MR: usize = MR;
    const NR: usize = 16 * NV;

    #[inline]
    unsafe fn tile(&self, kc: usize, a: *const f32, b: *const f32, rsb: usize, c: *mut f32, ldc: usize, acc: bool) {
        // SAFETY: the caller upholds the pointer contract; `self` proves AVX-512F.
        unsafe { kernel::<MR, NV>(kc, a, b, rsb, c, ldc, acc) }
    }
}

/// # Safety
/// See [`MicroKernel::tile`]; the CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
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
    // `a[p·M + r]` for p < kc, r < M; `b[p·rsb + 16·v ..+16]` for v < V
    // (16·V = NR); `c[r·ldc + 16·v ..+16]`. Prefetches never fault.
    unsafe {
        for r in 0..M {
            _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc + 16 * V - 1) as *const i8);
        }
        let mut acc = [[_mm512_setzero_ps(); V]; M];
        let mut a = a;
        let mut b = b;
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_ps(); V];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(b.add(16 * v));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(r));
                for (x, bb) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, *bb, *x);
                }
            }
            a = a.add(M);
            b = b.add(rsb);
        }
        for (r, row) in acc.iter().enumerate() {
            let cr = c.add(r * ldc);
            for (v, x) in row.iter().enumerate() {
                let p = cr.add(16 * v);
                let out = if accumulate { _mm512_add_ps(_mm512_loadu_ps(p), *x) } else { *x };
                _mm512_storeu_ps(p, out);
            }
        }
    }
}

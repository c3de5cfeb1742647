//! Portable micro-kernel on `wide::f32x8` (NEON on aarch64, SSE2 on baseline
//! x86-64): `MR` rows × `NV` f32x8 vectors (`NR = 8·NV` columns).

use wide::f32x8;

use super::kernel::MicroKernel;

/// Rows of the portable register tile (aarch64 has 32 vector registers:
/// 6×2 f32x8 = 24 q-registers of accumulators; SSE2 has 16: 6×1 = 12).
#[cfg(target_arch = "aarch64")]
pub(super) const MR: usize = 6;
#[cfg(target_arch = "aarch64")]
const NV: usize = 2;
#[cfg(not(target_arch = "aarch64"))]
pub(super) const MR: usize = 6;
#[cfg(not(target_arch = "aarch64"))]
const NV: usize = 1;

/// Token for the portable kernel (runs on every CPU).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Portable;

// SAFETY: the portable kernel uses no instructions beyond the compile target's.
unsafe impl MicroKernel for Portable {
    const MR: usize = MR;
    const NR: usize = 8 * NV;

    #[inline]
    unsafe fn tile(&self, kc: usize, a: *const f32, b: *const f32, rsb: usize, c: *mut f32, ldc: usize, acc: bool) {
        // SAFETY: the caller upholds the pointer contract.
        unsafe { kernel::<MR, NV>(kc, a, b, rsb, c, ldc, acc) }
    }
}

/// # Safety
/// See [`MicroKernel::tile`].
#[inline]
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
    // `a[p·M + r]`, `b[p·rsb + 8·v ..+8]` (8·V = NR), `c[r·ldc + 8·v ..+8]`;
    // unaligned reads/writes of `[f32; 8]` need no alignment.
    unsafe {
        let mut acc = [[f32x8::ZERO; V]; M];
        let mut a = a;
        let mut b = b;
        for _ in 0..kc {
            let mut bv = [f32x8::ZERO; V];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = f32x8::from(b.add(8 * v).cast::<[f32; 8]>().read_unaligned());
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = f32x8::splat(*a.add(r));
                for (x, bb) in row.iter_mut().zip(&bv) {
                    *x = av.mul_add(*bb, *x);
                }
            }
            a = a.add(M);
            b = b.add(rsb);
        }
        for (r, row) in acc.iter().enumerate() {
            let cr = c.add(r * ldc);
            for (v, x) in row.iter().enumerate() {
                let p = cr.add(8 * v).cast::<[f32; 8]>();
                let out = if accumulate { f32x8::from(p.read_unaligned()) + *x } else { *x };
                p.write_unaligned(out.to_array());
            }
        }
    }
}

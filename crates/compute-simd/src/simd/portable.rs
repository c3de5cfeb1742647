//! [`SimdF32`] on `wide::f32x8` (two per vector): whatever the compile target
//! gives, SSE2 on baseline x86-64 and NEON on aarch64. Used for
//! [`crate::Isa::Portable`] and [`crate::Isa::Neon`]. No `unsafe` here.
//!
//! Operations `wide` leaves platform-dependent (NaN in min/max) are
//! built from comparisons and blends so every target gives the same results.

use wide::{bytemuck, f32x8, i32x8};

use super::{Block, SimdF32};

/// The portable path; always available.
#[derive(Clone, Copy, Debug, Default)]
pub struct Portable;

/// Sixteen lanes as two `wide::f32x8`.
pub type W2 = [f32x8; 2];

impl SimdF32 for Portable {
    type V = W2;
    type M = W2;

    #[inline(always)]
    fn splat(self, x: f32) -> W2 {
        [f32x8::splat(x); 2]
    }
    #[inline(always)]
    fn load(self, x: &Block) -> W2 {
        bytemuck::cast(*x)
    }
    #[inline(always)]
    fn store(self, out: &mut Block, v: W2) {
        *out = bytemuck::cast(v);
    }
    #[inline(always)]
    fn stream(self, out: &mut Block, v: W2) {
        self.store(out, v)
    }
    #[inline(always)]
    fn fence(self) {}
    #[inline(always)]
    fn prefetch(self, _x: &Block) {}

    #[inline(always)]
    fn add(self, a: W2, b: W2) -> W2 {
        [a[0] + b[0], a[1] + b[1]]
    }
    #[inline(always)]
    fn sub(self, a: W2, b: W2) -> W2 {
        [a[0] - b[0], a[1] - b[1]]
    }
    #[inline(always)]
    fn mul(self, a: W2, b: W2) -> W2 {
        [a[0] * b[0], a[1] * b[1]]
    }
    #[inline(always)]
    fn div(self, a: W2, b: W2) -> W2 {
        [a[0] / b[0], a[1] / b[1]]
    }
    #[inline(always)]
    fn fma(self, a: W2, b: W2, c: W2) -> W2 {
        [a[0].mul_add(b[0], c[0]), a[1].mul_add(b[1], c[1])]
    }
    #[inline(always)]
    fn sqrt(self, a: W2) -> W2 {
        [a[0].sqrt(), a[1].sqrt()]
    }
    #[inline(always)]
    fn min(self, a: W2, b: W2) -> W2 {
        // a < b ? a : b — `b` when either is NaN, as x86 minps.
        self.select(self.lt(a, b), a, b)
    }
    #[inline(always)]
    fn max(self, a: W2, b: W2) -> W2 {
        self.select(self.gt(a, b), a, b)
    }
    #[inline(always)]
    fn abs(self, a: W2) -> W2 {
        [a[0].abs(), a[1].abs()]
    }
    #[inline(always)]
    fn ldexp(self, x: W2, n: W2) -> W2 {
        // n = h + k with h = n >> 1; 2ʰ and 2ᵏ are normal, x·2ʰ is exact and
        // the second multiply rounds once.
        let e = |x: f32x8, n: f32x8| {
            let i: i32x8 = n.round_int();
            let h = i >> 1;
            let k = i - h;
            let bias = i32x8::splat(127);
            let eh: i32x8 = (h + bias) << 23;
            let ek: i32x8 = (k + bias) << 23;
            let (ph, pk) = (f32x8::from_bits(eh.cast_unsigned()), f32x8::from_bits(ek.cast_unsigned()));
            x * ph * pk
        };
        [e(x[0], n[0]), e(x[1], n[1])]
    }
    #[inline(always)]
    fn split_hi(self, a: W2) -> W2 {
        let h = |v: f32x8| f32x8::from_bits(v.to_bits() & wide::u32x8::splat(!0xfff));
        [h(a[0]), h(a[1])]
    }
    #[inline(always)]
    fn copysign(self, mag: W2, sign: W2) -> W2 {
        let s = f32x8::splat(-0.0);
        [(mag[0] & !s) | (sign[0] & s), (mag[1] & !s) | (sign[1] & s)]
    }

    #[inline(always)]
    fn lt(self, a: W2, b: W2) -> W2 {
        [a[0].simd_lt(b[0]), a[1].simd_lt(b[1])]
    }
    #[inline(always)]
    fn gt(self, a: W2, b: W2) -> W2 {
        [a[0].simd_gt(b[0]), a[1].simd_gt(b[1])]
    }
    #[inline(always)]
    fn is_nan(self, a: W2) -> W2 {
        [a[0].is_nan(), a[1].is_nan()]
    }
    #[inline(always)]
    fn or(self, a: W2, b: W2) -> W2 {
        [a[0] | b[0], a[1] | b[1]]
    }
    #[inline(always)]
    fn select(self, m: W2, t: W2, f: W2) -> W2 {
        [m[0].select(t[0], f[0]), m[1].select(t[1], f[1])]
    }
    #[inline(always)]
    fn any(self, m: W2) -> bool {
        (m[0] | m[1]).any()
    }

    // Two `f32x8` per vector: on x86-64 (SSE2) four of the sixteen
    // registers, on aarch64 four of the thirty-two.
    #[cfg(target_arch = "aarch64")]
    const VECTORS: usize = 8;
    #[cfg(not(target_arch = "aarch64"))]
    const VECTORS: usize = 4;

    #[inline(always)]
    fn reduce_add(self, v: W2) -> f32 {
        (v[0] + v[1]).reduce_add()
    }
    #[inline(always)]
    fn reduce_max(self, v: W2) -> f32 {
        let m = self.max(v, [v[1], v[0]]);
        m[0].to_array().into_iter().fold(f32::NEG_INFINITY, f32::max)
    }
}

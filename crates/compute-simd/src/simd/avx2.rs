//! [`SimdF32`] on AVX2+FMA: two `__m256` per 16-lane vector (which also gives
//! every kernel two independent dependency chains).

use std::arch::x86_64::*;

use super::{Block, SimdF32, WithSimd};

/// Proof that the running CPU has AVX2 and FMA: only [`Avx2::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub struct Avx2 {
    _private: (),
}

impl Avx2 {
    /// The token if this CPU has AVX2 and FMA (a cached feature check).
    #[inline]
    pub fn detect() -> Option<Self> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(Avx2 { _private: () })
    }
}

/// Runs `task` compiled for AVX2+FMA, or hands it back if the CPU lacks them.
#[inline]
pub(super) fn run<T: WithSimd>(task: T) -> Result<T::Output, T> {
    match Avx2::detect() {
        // SAFETY: the token exists, so the CPU supports avx2 and fma, the only
        // features `entry` enables.
        Some(s) => Ok(unsafe { entry(s, task) }),
        None => Err(task),
    }
}

#[target_feature(enable = "avx2,fma")]
fn entry<T: WithSimd>(s: Avx2, task: T) -> T::Output {
    task.run(s)
}

/// Sixteen lanes as two AVX registers.
pub type V2 = [__m256; 2];

/// Calls AVX2/FMA intrinsics; the token in scope proves the CPU has them.
macro_rules! avx {
    ($e:expr) => {
        // SAFETY: `self` is an `Avx2` token, which only exists on CPUs with avx2
        // and fma (see `Avx2::detect`); pointers come from references to whole
        // 16-float blocks, and offsets stay within them.
        unsafe { $e }
    };
}

/// Applies a two-operand intrinsic to both halves.
macro_rules! pair {
    ($f:ident, $a:expr, $b:expr) => {
        avx!([$f($a[0], $b[0]), $f($a[1], $b[1])])
    };
}

impl SimdF32 for Avx2 {
    type V = V2;
    type M = V2;

    #[inline(always)]
    fn splat(self, x: f32) -> V2 {
        let v = avx!(_mm256_set1_ps(x));
        [v, v]
    }
    #[inline(always)]
    fn load(self, x: &Block) -> V2 {
        let p = x.as_ptr();
        avx!([_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))])
    }
    #[inline(always)]
    fn store(self, out: &mut Block, v: V2) {
        let p = out.as_mut_ptr();
        avx!({
            _mm256_storeu_ps(p, v[0]);
            _mm256_storeu_ps(p.add(8), v[1]);
        })
    }
    #[inline(always)]
    fn stream(self, out: &mut Block, v: V2) {
        let p = out.as_mut_ptr();
        if (p as usize).is_multiple_of(32) {
            // SAFETY: avx per the token; `p` and `p + 8` are 32-byte aligned
            // (checked) and the block holds 16 writable floats.
            unsafe {
                _mm256_stream_ps(p, v[0]);
                _mm256_stream_ps(p.add(8), v[1]);
            }
        } else {
            self.store(out, v)
        }
    }
    #[inline(always)]
    fn fence(self) {
        // SAFETY: sfence is part of SSE, which every x86-64 CPU has.
        unsafe { _mm_sfence() }
    }

    #[inline(always)]
    fn prefetch(self, x: &Block) {
        // SAFETY: prefetching is part of SSE, which every x86-64 CPU has, and
        // never faults; the pointer comes from a reference anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(x.as_ptr().cast()) }
    }

    #[inline(always)]
    fn prefetch_bytes(self, bytes: &[u8]) {
        super::prefetch_lines_l2(bytes);
    }

    #[inline(always)]
    fn add(self, a: V2, b: V2) -> V2 {
        pair!(_mm256_add_ps, a, b)
    }
    #[inline(always)]
    fn sub(self, a: V2, b: V2) -> V2 {
        pair!(_mm256_sub_ps, a, b)
    }
    #[inline(always)]
    fn mul(self, a: V2, b: V2) -> V2 {
        pair!(_mm256_mul_ps, a, b)
    }
    #[inline(always)]
    fn div(self, a: V2, b: V2) -> V2 {
        pair!(_mm256_div_ps, a, b)
    }
    #[inline(always)]
    fn fma(self, a: V2, b: V2, c: V2) -> V2 {
        avx!([_mm256_fmadd_ps(a[0], b[0], c[0]), _mm256_fmadd_ps(a[1], b[1], c[1])])
    }
    #[inline(always)]
    fn sqrt(self, a: V2) -> V2 {
        avx!([_mm256_sqrt_ps(a[0]), _mm256_sqrt_ps(a[1])])
    }
    #[inline(always)]
    fn min(self, a: V2, b: V2) -> V2 {
        pair!(_mm256_min_ps, a, b)
    }
    #[inline(always)]
    fn max(self, a: V2, b: V2) -> V2 {
        pair!(_mm256_max_ps, a, b)
    }
    #[inline(always)]
    fn abs(self, a: V2) -> V2 {
        let m = avx!(_mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX)));
        pair!(_mm256_and_ps, a, [m, m])
    }
    #[inline(always)]
    fn ldexp(self, x: V2, n: V2) -> V2 {
        // n = h + k with h = n >> 1; 2ʰ and 2ᵏ are normal, x·2ʰ is exact and
        // the second multiply rounds once.
        avx!({
            let bias = _mm256_set1_epi32(127);
            let i = [_mm256_cvtps_epi32(n[0]), _mm256_cvtps_epi32(n[1])];
            let h = [_mm256_srai_epi32::<1>(i[0]), _mm256_srai_epi32::<1>(i[1])];
            let k = [_mm256_sub_epi32(i[0], h[0]), _mm256_sub_epi32(i[1], h[1])];
            let ph = [
                _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(h[0], bias))),
                _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(h[1], bias))),
            ];
            let pk = [
                _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k[0], bias))),
                _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k[1], bias))),
            ];
            [_mm256_mul_ps(_mm256_mul_ps(x[0], ph[0]), pk[0]), _mm256_mul_ps(_mm256_mul_ps(x[1], ph[1]), pk[1])]
        })
    }
    #[inline(always)]
    fn split_hi(self, a: V2) -> V2 {
        let m = avx!(_mm256_castsi256_ps(_mm256_set1_epi32(!0xfff)));
        pair!(_mm256_and_ps, a, [m, m])
    }
    #[inline(always)]
    fn copysign(self, mag: V2, sign: V2) -> V2 {
        let s = avx!(_mm256_set1_ps(-0.0));
        let mag = pair!(_mm256_andnot_ps, [s, s], mag);
        let sign = pair!(_mm256_and_ps, [s, s], sign);
        pair!(_mm256_or_ps, mag, sign)
    }

    #[inline(always)]
    fn lt(self, a: V2, b: V2) -> V2 {
        avx!([_mm256_cmp_ps::<_CMP_LT_OQ>(a[0], b[0]), _mm256_cmp_ps::<_CMP_LT_OQ>(a[1], b[1])])
    }
    #[inline(always)]
    fn gt(self, a: V2, b: V2) -> V2 {
        avx!([_mm256_cmp_ps::<_CMP_GT_OQ>(a[0], b[0]), _mm256_cmp_ps::<_CMP_GT_OQ>(a[1], b[1])])
    }
    #[inline(always)]
    fn is_nan(self, a: V2) -> V2 {
        avx!([_mm256_cmp_ps::<_CMP_UNORD_Q>(a[0], a[0]), _mm256_cmp_ps::<_CMP_UNORD_Q>(a[1], a[1])])
    }
    #[inline(always)]
    fn or(self, a: V2, b: V2) -> V2 {
        pair!(_mm256_or_ps, a, b)
    }
    #[inline(always)]
    fn select(self, m: V2, t: V2, f: V2) -> V2 {
        avx!([_mm256_blendv_ps(f[0], t[0], m[0]), _mm256_blendv_ps(f[1], t[1], m[1])])
    }
    #[inline(always)]
    fn any(self, m: V2) -> bool {
        avx!(_mm256_movemask_ps(_mm256_or_ps(m[0], m[1])) != 0)
    }

    #[inline(always)]
    fn reduce_add16(self, v: [V2; 16]) -> V2 {
        // The two halves of each vector added, then per group of eight
        // inputs: 128-bit halves (`vperm2f128`), pairs and single lanes
        // within 128 bits (`vshufps`). Lane `4c + t` of a group ends up with
        // slot `2t + c`, so slot `2t + c` is fed input `4c + t`. (Plain
        // loops, no closures: everything must inline into the
        // `#[target_feature]` caller.)
        avx!({
            let mut out = [_mm256_setzero_ps(); 2];
            for (g, o) in out.iter_mut().enumerate() {
                let mut u = [_mm256_setzero_ps(); 8];
                for (slot, x) in u.iter_mut().enumerate() {
                    let [a, b] = v[8 * g + 4 * (slot % 2) + slot / 2];
                    *x = _mm256_add_ps(a, b);
                }
                let mut x1 = [_mm256_setzero_ps(); 4];
                for (i, x) in x1.iter_mut().enumerate() {
                    let (a, b) = (u[2 * i], u[2 * i + 1]);
                    *x = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b));
                }
                let mut x2 = [_mm256_setzero_ps(); 2];
                for (i, x) in x2.iter_mut().enumerate() {
                    let (a, b) = (x1[2 * i], x1[2 * i + 1]);
                    *x = _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b));
                }
                let (a, b) = (x2[0], x2[1]);
                *o = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(a, b), _mm256_shuffle_ps::<0xDD>(a, b));
            }
            out
        })
    }
    #[inline(always)]
    fn reduce_add(self, v: V2) -> f32 {
        avx!({
            let s = _mm256_add_ps(v[0], v[1]);
            let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            let q = _mm_add_ss(q, _mm_shuffle_ps::<0b01>(q, q));
            _mm_cvtss_f32(q)
        })
    }
    #[inline(always)]
    fn reduce_max(self, v: V2) -> f32 {
        avx!({
            let s = _mm256_max_ps(v[0], v[1]);
            let q = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let q = _mm_max_ps(q, _mm_movehl_ps(q, q));
            let q = _mm_max_ss(q, _mm_shuffle_ps::<0b01>(q, q));
            _mm_cvtss_f32(q)
        })
    }
}

//! [`SimdF32`] on AVX-512F: one `__m512` per vector, `__mmask16` masks.

use std::arch::x86_64::*;

use super::{Block, SimdF32, WithSimd};

/// Proof that the running CPU has AVX-512F: only [`Avx512::detect`] makes one,
/// so every intrinsic call below is on a CPU that supports it.
#[derive(Clone, Copy, Debug)]
pub struct Avx512 {
    _private: (),
}

impl Avx512 {
    /// The token if this CPU has AVX-512F (a cached feature check).
    #[inline]
    pub fn detect() -> Option<Self> {
        is_x86_feature_detected!("avx512f").then_some(Avx512 { _private: () })
    }
}

/// Runs `task` compiled for AVX-512F, or hands it back if the CPU lacks it.
#[inline]
pub(super) fn run<T: WithSimd>(task: T) -> Result<T::Output, T> {
    match Avx512::detect() {
        // SAFETY: the token exists, so the CPU supports avx512f, the only
        // feature `entry` enables.
        Some(s) => Ok(unsafe { entry(s, task) }),
        None => Err(task),
    }
}

#[target_feature(enable = "avx512f")]
fn entry<T: WithSimd>(s: Avx512, task: T) -> T::Output {
    task.run(s)
}

/// Calls AVX-512F intrinsics; the token in scope proves the CPU has them.
macro_rules! avx512 {
    ($e:expr) => {
        // SAFETY: `self` is an `Avx512` token, which only exists on CPUs with
        // avx512f (see `Avx512::detect`); pointers come from references to
        // whole 16-float blocks.
        unsafe { $e }
    };
}

impl SimdF32 for Avx512 {
    type V = __m512;
    type M = __mmask16;

    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        avx512!(_mm512_set1_ps(x))
    }
    #[inline(always)]
    fn load(self, x: &Block) -> __m512 {
        avx512!(_mm512_loadu_ps(x.as_ptr()))
    }
    #[inline(always)]
    fn store(self, out: &mut Block, v: __m512) {
        avx512!(_mm512_storeu_ps(out.as_mut_ptr(), v))
    }
    #[inline(always)]
    fn stream(self, out: &mut Block, v: __m512) {
        let p = out.as_mut_ptr();
        if (p as usize).is_multiple_of(64) {
            // SAFETY: avx512f per the token; `p` is 64-byte aligned (checked)
            // and points to 16 writable floats.
            unsafe { _mm512_stream_ps(p, v) }
        } else {
            avx512!(_mm512_storeu_ps(p, v))
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
    fn prefetch_l2(self, x: &Block) {
        // SAFETY: as in `prefetch`.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(x.as_ptr().cast()) }
    }

    #[inline(always)]
    fn prefetch_bytes(self, bytes: &[u8]) {
        super::prefetch_lines_l2(bytes);
    }

    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        avx512!(_mm512_add_ps(a, b))
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        avx512!(_mm512_sub_ps(a, b))
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        avx512!(_mm512_mul_ps(a, b))
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        avx512!(_mm512_div_ps(a, b))
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        avx512!(_mm512_fmadd_ps(a, b, c))
    }
    #[inline(always)]
    fn sqrt(self, a: __m512) -> __m512 {
        avx512!(_mm512_sqrt_ps(a))
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        avx512!(_mm512_min_ps(a, b))
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        avx512!(_mm512_max_ps(a, b))
    }
    #[inline(always)]
    fn abs(self, a: __m512) -> __m512 {
        avx512!(_mm512_abs_ps(a))
    }
    #[inline(always)]
    fn ldexp(self, x: __m512, n: __m512) -> __m512 {
        avx512!(_mm512_scalef_ps(x, n))
    }
    #[inline(always)]
    fn split_hi(self, a: __m512) -> __m512 {
        avx512!(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(!0xfff))))
    }
    #[inline(always)]
    fn copysign(self, mag: __m512, sign: __m512) -> __m512 {
        // Bit select: sign bit from `sign`, the rest from `mag`.
        avx512!(_mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0xCA>(
            _mm512_set1_epi32(i32::MIN),
            _mm512_castps_si512(sign),
            _mm512_castps_si512(mag)
        )))
    }

    #[inline(always)]
    fn lt(self, a: __m512, b: __m512) -> __mmask16 {
        avx512!(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b))
    }
    #[inline(always)]
    fn gt(self, a: __m512, b: __m512) -> __mmask16 {
        avx512!(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b))
    }
    #[inline(always)]
    fn is_nan(self, a: __m512) -> __mmask16 {
        avx512!(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a))
    }
    #[inline(always)]
    fn or(self, a: __mmask16, b: __mmask16) -> __mmask16 {
        a | b
    }
    #[inline(always)]
    fn select(self, m: __mmask16, t: __m512, f: __m512) -> __m512 {
        avx512!(_mm512_mask_blend_ps(m, f, t))
    }
    #[inline(always)]
    fn any(self, m: __mmask16) -> bool {
        m != 0
    }

    const FAST_LOOKUP: bool = true;
    #[inline(always)]
    fn lookup32(self, table: &[f32; 32], idx: __m512) -> __m512 {
        let (lo, hi) = table.split_at(16);
        avx512!(_mm512_permutex2var_ps(
            _mm512_loadu_ps(lo.as_ptr()),
            _mm512_castps_si512(idx),
            _mm512_loadu_ps(hi.as_ptr())
        ))
    }

    const VECTORS: usize = 32;

    #[inline(always)]
    fn reduce_add(self, v: __m512) -> f32 {
        avx512!(_mm512_reduce_add_ps(v))
    }
    #[inline(always)]
    fn reduce_add16(self, v: [__m512; 16]) -> __m512 {
        // Each step halves the vectors, each then holding partial sums of
        // twice as many inputs: 256-bit halves, 128-bit quarters (both
        // `vshuff32x4`), then pairs and single lanes within 128 bits
        // (`vshufps`). Lane `4j + t` ends up with input slot `4t + j`, so
        // slot `4t + j` is fed input `4j + t`. (Plain loops, no closures:
        // everything must inline into the `#[target_feature]` caller.)
        let mut u = v;
        for (slot, x) in u.iter_mut().enumerate() {
            *x = v[4 * (slot % 4) + slot / 4];
        }
        avx512!({
            let mut x1 = [_mm512_setzero_ps(); 8];
            for (i, x) in x1.iter_mut().enumerate() {
                let (a, b) = (u[2 * i], u[2 * i + 1]);
                *x = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b));
            }
            let mut x2 = [_mm512_setzero_ps(); 4];
            for (i, x) in x2.iter_mut().enumerate() {
                let (a, b) = (x1[2 * i], x1[2 * i + 1]);
                *x = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b));
            }
            let mut x3 = [_mm512_setzero_ps(); 2];
            for (i, x) in x3.iter_mut().enumerate() {
                let (a, b) = (x2[2 * i], x2[2 * i + 1]);
                *x = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b));
            }
            let (a, b) = (x3[0], x3[1]);
            _mm512_add_ps(_mm512_shuffle_ps::<0x88>(a, b), _mm512_shuffle_ps::<0xDD>(a, b))
        })
    }
    #[inline(always)]
    fn reduce_max(self, v: __m512) -> f32 {
        avx512!(_mm512_reduce_max_ps(v))
    }
}

//! The `Q4_K` × `Q8` row dot products on AVX-512 VNNI. Per block of 256
//! weight values: `d` and `dmin` widened by F16C, the packed 6-bit scales
//! and mins unpacked with word shifts, and per 128 values one 64-byte load
//! of nibbles split into two vectors (low nibbles: sub-blocks `4c` and
//! `4c+2`; high: `4c+1` and `4c+3`), shared by up to [`ROWS`] activation
//! rows (stored in the matching order, [`super::sub_offset`]): for each,
//! two `vpdpbusd` (unsigned 4-bit × signed 8-bit, summed in fours into 16
//! `i32` lanes, exact) and a multiply by the sub-blocks' scales. Each
//! block's integer lanes are widened to `f32` and accumulated with
//! `dw·dx`, the minimum terms likewise with `dmin·dx`; the lanes are summed
//! once per row. The only `unsafe` of the quantized products.

use super::{Q4K_VALUES, Q8Row};

/// Activation rows one pass over a weight row serves.
pub(super) const ROWS: usize = 4;

/// Whether this CPU has the kernel's instructions (AVX-512 F, BW and VNNI,
/// F16C). Costs four atomic loads after the first call.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The dot products of one `Q4_K` weight row with each of `xs` (at most
/// [`ROWS`], all of the same number of blocks) into `out`, or false where
/// the CPU lacks the instructions or a length does not fit.
#[inline]
pub(super) fn dots(w: &[u8], xs: &[&Q8Row], out: &mut [f32]) -> bool {
    run(super::Weights::Q4K, w, xs, out)
}

/// [`dots`] for `Q6_K` weight rows (210 bytes per block).
#[inline]
pub(super) fn dots_q6k(w: &[u8], xs: &[&Q8Row], out: &mut [f32]) -> bool {
    run(super::Weights::Q6K, w, xs, out)
}

/// The safe door of both kernels: checks the CPU and every length, then
/// enters the kernel of `format` for `xs.len()` rows.
#[inline(always)]
fn run(format: super::Weights, w: &[u8], xs: &[&Q8Row], out: &mut [f32]) -> bool {
    let blocks = xs.first().map_or(0, |x| x.blocks());
    let ok = !xs.is_empty()
        && xs.len() <= ROWS
        && out.len() >= xs.len()
        && w.len() >= blocks.saturating_mul(format.block_bytes())
        && xs.iter().all(|x| x.blocks() == blocks && x.q.len() >= blocks * Q4K_VALUES && x.sums.len() >= blocks * 8)
        && available();
    if !ok {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::Weights::{Q4K, Q6K};
        let p = w.as_ptr();
        // SAFETY: AVX-512 F, BW and VNNI, and F16C, are present and every
        // length the kernels read was checked above.
        unsafe {
            match (format, xs.len()) {
                (Q4K, 1) => x86::dots::<1>(p, blocks, xs, out),
                (Q4K, 2) => x86::dots::<2>(p, blocks, xs, out),
                (Q4K, 3) => x86::dots::<3>(p, blocks, xs, out),
                (Q4K, _) => x86::dots::<4>(p, blocks, xs, out),
                (Q6K, 1) => x86::dots_q6k::<1>(p, blocks, xs, out),
                (Q6K, 2) => x86::dots_q6k::<2>(p, blocks, xs, out),
                (Q6K, 3) => x86::dots_q6k::<3>(p, blocks, xs, out),
                (Q6K, _) => x86::dots_q6k::<4>(p, blocks, xs, out),
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Scales (low word) and mins (high word) of a block's 12 packed bytes, 8
/// bytes each, as ggml packs them (see `compute_core::quant::unpack_scales_k4`):
/// bytes 0–3 hold scales 0–3 and bytes 4–7 mins 0–3 in their low 6 bits;
/// bytes 8–11 the low 4 bits of scales and mins 4–7; the top 2 bits of bytes
/// 0–7 their high bits.
#[cfg(any(target_arch = "x86_64", test))]
#[inline(always)]
pub(super) fn unpack_scales(packed: [u8; 12]) -> (u64, u64) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([packed[i], packed[i + 1], packed[i + 2], packed[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let scales_hi = (c & LOW4) | (((a >> 6) & LOW2) << 4);
    let mins_hi = ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4);
    let scales = u64::from(a & LOW6) | (u64::from(scales_hi) << 32);
    let mins = u64::from(b & LOW6) | (u64::from(mins_hi) << 32);
    (scales, mins)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::{Q4K_BYTES, Q4K_VALUES, Q6K_BYTES, Q8Row};
    use super::unpack_scales;

    /// # Safety
    /// The CPU supports AVX-512 F, BW and VNNI, and F16C; `w` is readable for
    /// `blocks·Q4K_BYTES` bytes; each of the `R` rows of `xs` holds `blocks`
    /// blocks; `out` holds `R` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
    pub(super) unsafe fn dots<const R: usize>(w: *const u8, blocks: usize, xs: &[&Q8Row], out: &mut [f32]) {
        let low = _mm512_set1_epi8(0x0f);
        // For 128 values c: the low nibbles' lanes 0–7 take scale 4c, lanes
        // 8–15 scale 4c+2; the high nibbles' take 4c+1 and 4c+3.
        let pick: [__m512i; 4] = std::array::from_fn(|i| {
            let (c, high) = ((i / 2) as i32, (i % 2) as i32);
            let (a, b) = (4 * c + high, 4 * c + 2 + high);
            _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
        });
        let mut acc = [_mm512_setzero_ps(); R];
        let mut macc = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            // SAFETY: block `b < blocks` lies inside `w` (contract).
            let block = unsafe { w.add(b * Q4K_BYTES) };
            // SAFETY: the block's first 16 bytes are readable (contract).
            let (head, packed) =
                unsafe { (block.cast::<i32>().read_unaligned(), block.add(4).cast::<[u8; 12]>().read()) };
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(head));
            let (d, dmin) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let (scales, mins) = unpack_scales(packed);
            let sc = _mm512_cvtepu8_epi32(_mm_set1_epi64x(scales as i64));
            let scale: [__m512i; 4] = std::array::from_fn(|i| _mm512_permutexvar_epi32(pick[i], sc));
            let mut nibbles = [_mm512_setzero_si512(); 4];
            for c in 0..2 {
                // SAFETY: quant bytes 64c..64c+64 of the block (from byte 16) are readable.
                let q = unsafe { _mm512_loadu_si512(block.add(16 + 64 * c).cast()) };
                nibbles[2 * c] = _mm512_and_si512(q, low);
                nibbles[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low);
            }
            let mins8 = _mm256_cvtepu8_epi32(_mm_set1_epi64x(mins as i64));
            for r in 0..R {
                let x = xs[r];
                let mut isum = _mm512_setzero_si512();
                for (i, (nib, sc)) in nibbles.iter().zip(&scale).enumerate() {
                    // SAFETY: values 64i..64i+64 of block `b` of row `r` are readable (contract).
                    let a = unsafe { _mm512_loadu_si512(x.q.as_ptr().add(b * Q4K_VALUES + 64 * i).cast()) };
                    let prod = _mm512_dpbusd_epi32(_mm512_setzero_si512(), *nib, a);
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(prod, *sc));
                }
                let dx = x.d[b];
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * dx), acc[r]);
                // SAFETY: the block's 8 sub-block sums of row `r` are readable (contract).
                let xsum = unsafe { _mm256_loadu_si256(x.sums.as_ptr().add(b * 8).cast()) };
                let mterm = _mm256_cvtepi32_ps(_mm256_mullo_epi32(mins8, xsum));
                macc[r] = _mm256_fmadd_ps(mterm, _mm256_set1_ps(dmin * dx), macc[r]);
            }
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(acc[r]) - hsum8(macc[r]);
        }
    }

    /// `Q6_K`: per 128 values (half `h` of a block), 64 bytes of low 4 bits
    /// (low nibbles: values 0–31 and 32–63; high: 64–95 and 96–127) and 32
    /// bytes of high 2-bit pairs make the unsigned 6-bit values `q + 32`,
    /// regrouped by 128-bit lanes into the activations' order; each
    /// `vpdpbusd` is corrected by one against the constant 32, and each 16
    /// values' signed scale multiplies its four lanes.
    ///
    /// # Safety
    /// As [`dots`], with `blocks·Q6K_BYTES` bytes readable at `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
    pub(super) unsafe fn dots_q6k<const R: usize>(w: *const u8, blocks: usize, xs: &[&Q8Row], out: &mut [f32]) {
        let low = _mm512_set1_epi8(0x0f);
        let two = _mm256_set1_epi8(0x03);
        let bias = _mm512_set1_epi8(32);
        // Vector 2h takes groups of 16 8h, 8h+1, 8h+4, 8h+5; vector 2h+1
        // takes 8h+2, 8h+3, 8h+6, 8h+7 (four lanes each).
        let pick: [__m512i; 4] = std::array::from_fn(|i| {
            let (h, odd) = ((i / 2) as i32, (i % 2) as i32);
            let g = |k: i32| 8 * h + 2 * odd + k;
            let (a, b, c, d) = (g(0), g(1), g(4), g(5));
            _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)
        });
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..blocks {
            // SAFETY: block `b < blocks` lies inside `w` (contract).
            let block = unsafe { w.add(b * Q6K_BYTES) };
            // SAFETY: bytes 192..210 of the block are readable (contract).
            let (scales, dbits) =
                unsafe { (_mm_loadu_si128(block.add(192).cast()), block.add(208).cast::<u16>().read_unaligned()) };
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(dbits))));
            let sc = _mm512_cvtepi8_epi32(scales);
            let scale: [__m512i; 4] = std::array::from_fn(|i| _mm512_permutexvar_epi32(pick[i], sc));
            let mut vals = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                // SAFETY: ql bytes 64h..64h+64 and qh bytes 128+32h..128+32h+32 are readable.
                let (ql, qh) = unsafe {
                    (_mm512_loadu_si512(block.add(64 * h).cast()), _mm256_loadu_si256(block.add(128 + 32 * h).cast()))
                };
                let bits = |shift: i32| -> __m256i {
                    match shift {
                        0 => _mm256_and_si256(qh, two),
                        2 => _mm256_and_si256(_mm256_srli_epi16::<2>(qh), two),
                        4 => _mm256_and_si256(_mm256_srli_epi16::<4>(qh), two),
                        _ => _mm256_and_si256(_mm256_srli_epi16::<6>(qh), two),
                    }
                };
                let high01 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bits(0)), bits(2));
                let high23 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bits(4)), bits(6));
                // Values 0–31 | 32–63, and 64–95 | 96–127, as unsigned q + 32.
                let v01 = _mm512_or_si512(_mm512_and_si512(ql, low), _mm512_slli_epi16::<4>(high01));
                let v23 =
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), low), _mm512_slli_epi16::<4>(high23));
                // The activations' order: values 0–31 | 64–95, then 32–63 | 96–127.
                vals[2 * h] = _mm512_shuffle_i64x2::<0x44>(v01, v23);
                vals[2 * h + 1] = _mm512_shuffle_i64x2::<0xee>(v01, v23);
            }
            for r in 0..R {
                let x = xs[r];
                let mut isum = _mm512_setzero_si512();
                for (i, (v, sc)) in vals.iter().zip(&scale).enumerate() {
                    // SAFETY: values 64i..64i+64 of block `b` of row `r` are readable (contract).
                    let a = unsafe { _mm512_loadu_si512(x.q.as_ptr().add(b * Q4K_VALUES + 64 * i).cast()) };
                    let prod = _mm512_dpbusd_epi32(_mm512_setzero_si512(), *v, a);
                    let offset = _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, a);
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_sub_epi32(prod, offset), *sc));
                }
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * x.d[b]), acc[r]);
            }
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(acc[r]);
        }
    }

    /// The sum of 8 `f32` lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum8(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

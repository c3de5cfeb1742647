//! The quantized products' kernels on AVX-512 VNNI. With [`super::avx2`] and
//! [`super::stream`] (the prefetch hints), the only `unsafe` of the quantized
//! products.
//!
//! One call takes up to [`super::WEIGHT_ROWS`] weight rows, in pairs `(j, k)`,
//! and every activation row of a [`Panel`], in steps of two blocks. The
//! activations are stored in chunks of 64 bytes ([`super::value_offset`]) so
//! that in each chunk the 4-byte lanes `2s` and `2s + 1` belong to sub-block
//! `s` (32 values). Each weight block is decoded once per call into four
//! vectors of the same order (nibbles and high bits unpacked, then 64-bit
//! pieces regrouped with `vpunpck*qdq`/`vshufi64x2` or `vpermt2q`), so a
//! chain of `vpdpbusd` over the chunks sums each sub-block (or each half of
//! one) into two `i32` lanes; every activation chunk loaded feeds the chains
//! of both weight rows of the pair. The chains are short enough that every
//! lane fits 16 bits (`Q4_K`: 16 values of 4 bits; `Q5_K` and `Q6_K`: 8
//! values); two such vectors are packed into one (`vpackssdw`) and their
//! lanes scaled by the sub-block scales and summed in pairs by one
//! `vpmaddwd`. The results of `j` and `k` are folded into one vector
//! (adjacent lanes added, even lanes from `j`, odd from `k`), converted to
//! `f32`, multiplied by the blocks' `d`, the minimum terms subtracted, then
//! multiplied by the activations' `dx` and added to the row's 16-lane
//! accumulator; at the end the even and the odd lanes are summed apart.
//!
//! The minimum terms of `Q4_K` and `Q5_K` (`dmin·m_s·Σx` per sub-block) are
//! one `vpmaddwd` per row and step: the row's sub-block sums (16-bit pairs,
//! prepared by the panel) against both weight rows' minimums, in the same
//! lane order as the main sums, then multiplied by `dmin`.
//!
//! `Q6_K` and `Q8_0` weights are signed, so there the activations enter as
//! unsigned `x + 128` and each chain starts from `−128·Σq` of its lanes
//! (computed once per block with `vpdpbusd` against the constant 128), which
//! leaves `Σ q·x` exactly. `Q8_0`'s 32-value blocks each have their own `f32`
//! scale: its chains run over all four chunks (no 16-bit packing) and the
//! scales multiply lane by lane.
//!
//! The weight bytes of later steps are prefetched: into L2 far enough ahead
//! to hide a DRAM access (what keeps a GEMV at the speed of a plain read),
//! into L1 one step ahead.

use super::{Panel, Weights};

/// Whether this CPU has the kernels' instructions (AVX-512 F, BW and VNNI,
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

/// The outputs of the `jn` weight rows `w` (consecutive, `panel.blocks`
/// blocks of `format` each) for every row of `panel`, into
/// `out[jj·rows + r]`, exactly as `scalar::run` computes them; `scratch`
/// holds the accumulators (`panel.scratch(jn)` values). Returns false,
/// having written nothing, where the CPU lacks the instructions or a length
/// does not fit. Costs `O(jn·rows·k)` multiply-adds at 64 per `vpdpbusd`,
/// and each block decoded once.
pub(super) fn run(
    format: Weights,
    w: &[u8],
    jn: usize,
    panel: &Panel<'_>,
    scratch: &mut [f32],
    out: &mut [f32],
) -> bool {
    let ok = panel.fits(format, w, jn, scratch, out) && available();
    if !ok {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (w, scratch, out) = (w.as_ptr(), scratch.as_mut_ptr(), out.as_mut_ptr());
        // SAFETY: AVX-512 F, BW and VNNI, and F16C, are present, and every
        // length the kernels read or write was checked above.
        unsafe {
            match format {
                Weights::Q4K => x86::q4k(w, jn, panel, scratch),
                Weights::Q5K => x86::q5k(w, jn, panel, scratch),
                Weights::Q6K => x86::q6k(w, jn, panel, scratch),
                Weights::Q8_0 => x86::q8_0(w, jn, panel, scratch),
            }
            x86::finish(jn, panel, scratch, out);
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::stream::{block, prefetch_next, scales_pair, second};
    use super::super::{Panel, Q4K_BYTES, Q4K_VALUES, Q5K_BYTES, Q6K_BYTES, Q8_0_BYTES};

    /// A decoded `Q4_K` or `Q5_K` block: the four chunk vectors.
    struct KBlock {
        w: [__m512i; 4],
    }

    /// A decoded `Q6_K` block (signed values) or `Q8_0` group of eight
    /// blocks: the chunk vectors and the chains' starts (`−128·Σq`).
    struct SBlock {
        w: [__m512i; 4],
        start: [__m512i; 2],
    }

    /// `d` and `dmin` of the blocks at `p[0..4]`: `[d of p[0..4]]`,
    /// `[dmin of p[0..4]]`, each repeated over the four 128-bit lanes.
    ///
    /// # Safety
    /// Each `p[i]` is readable for 4 bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    unsafe fn scales_d(p: [*const u8; 4]) -> (__m512, __m512) {
        // SAFETY: 4 bytes at each (contract).
        let h = unsafe { p.map(|p| p.cast::<i32>().read_unaligned()) };
        let v = _mm256_cvtph_ps(_mm_setr_epi32(h[0], h[1], h[2], h[3]));
        let v = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        (_mm512_broadcast_f32x4(_mm256_castps256_ps128(v)), _mm512_broadcast_f32x4(_mm256_extractf128_ps::<1>(v)))
    }

    /// 16-bit scale words for one `vpmaddwd` over `vpackssdw(a, b)` of two
    /// blocks' 16-lane sums (lanes `2s`, `2s+1`: sub-block `s`), from
    /// `[scales a | scales b]`: per 128-bit lane `k`, `sa[2k]` twice,
    /// `sa[2k+1]` twice, then the same of `sb`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn pair_scales(sc: __m128i) -> __m512i {
        let idx = _mm512_set_epi16(
            15, 15, 14, 14, 7, 7, 6, 6, 13, 13, 12, 12, 5, 5, 4, 4, 11, 11, 10, 10, 3, 3, 2, 2, 9, 9, 8, 8, 1, 1, 0, 0,
        );
        _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sc)))
    }

    /// `Q4_K`/`Q5_K` minimums of a pair of rows as 16-bit words for one
    /// `vpmaddwd` against the panel's sums: word pair `4k + 2i + e` holds
    /// minimums `2k`, `2k+1` of block `i` of row `e` (`mj`: row `j`'s
    /// `[mins block 0 | block 1]`, `mk` row `k`'s); with `only = Some(i)`
    /// the other block's words are 0.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn min_words(mj: __m128i, mk: __m128i, only: Option<usize>) -> __m512i {
        // Source word `16e + 8i + s`: minimum `s` of block `i` of row `e`.
        let idx = _mm512_set_epi16(
            31, 30, 15, 14, 23, 22, 7, 6, 29, 28, 13, 12, 21, 20, 5, 4, 27, 26, 11, 10, 19, 18, 3, 2, 25, 24, 9, 8, 17,
            16, 1, 0,
        );
        let words = _mm512_cvtepu8_epi16(_mm256_set_m128i(mk, mj));
        let keep: u32 = match only {
            None => !0,
            Some(0) => 0x0f0f_0f0f,
            Some(_) => 0xf0f0_f0f0,
        };
        _mm512_maskz_permutexvar_epi16(keep, idx, words)
    }

    /// `Q6_K`'s 16 signed scales as words for `vpackssdw(A01, A23)`: per
    /// 128-bit lane `k`, groups `4k, 4k+2, 4k+1, 4k+3`, each twice.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn q6k_scales(scales: __m128i) -> __m512i {
        let idx = _mm512_set_epi16(
            15, 15, 13, 13, 14, 14, 12, 12, 11, 11, 9, 9, 10, 10, 8, 8, 7, 7, 5, 5, 6, 6, 4, 4, 3, 3, 1, 1, 2, 2, 0, 0,
        );
        _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scales)))
    }

    /// Folds two vectors of `vpmaddwd` results into one: lane `2i` is
    /// `a[2i] + a[2i+1]`, lane `2i+1` is `b[2i] + b[2i+1]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn fold(a: __m512i, b: __m512i) -> __m512i {
        let a = _mm512_add_epi32(a, _mm512_srli_epi64::<32>(a));
        let b = _mm512_add_epi32(b, _mm512_slli_epi64::<32>(b));
        _mm512_mask_blend_epi32(0xaaaa, a, b)
    }

    /// The 128 bytes of 4-bit quants of a `Q4_K`/`Q5_K` block (32 bytes per
    /// two sub-blocks, low nibbles the first) as four chunk vectors: chunk
    /// `c` holds values `8c..8c+8` of sub-block `s` at bytes `8s..8s+8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn nibbles(q0: __m512i, q1: __m512i) -> [__m512i; 4] {
        let low = _mm512_set1_epi8(0x0f);
        let (l0, h0) = (_mm512_and_si512(q0, low), _mm512_and_si512(_mm512_srli_epi16::<4>(q0), low));
        let (l1, h1) = (_mm512_and_si512(q1, low), _mm512_and_si512(_mm512_srli_epi16::<4>(q1), low));
        // l0: sub-blocks 0 | 2, h0: 1 | 3, l1: 4 | 6, h1: 5 | 7 (8 bytes per chunk each).
        let (a, b) = (_mm512_unpacklo_epi64(l0, h0), _mm512_unpacklo_epi64(l1, h1));
        let (c, d) = (_mm512_unpackhi_epi64(l0, h0), _mm512_unpackhi_epi64(l1, h1));
        [
            _mm512_shuffle_i64x2::<0x88>(a, b),
            _mm512_shuffle_i64x2::<0x88>(c, d),
            _mm512_shuffle_i64x2::<0xdd>(a, b),
            _mm512_shuffle_i64x2::<0xdd>(c, d),
        ]
    }

    /// Four vectors of two sub-blocks each (`[s0 | s1]`, `[s2 | s3]`,
    /// `[s4 | s5]`, `[s6 | s7]`, 32 bytes per sub-block in value order)
    /// regrouped into the four chunk vectors (as [`nibbles`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn regroup(v: [__m512i; 4]) -> [__m512i; 4] {
        let lo = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13);
        let hi = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
        let (t01, u01) = (_mm512_permutex2var_epi64(v[0], lo, v[1]), _mm512_permutex2var_epi64(v[2], lo, v[3]));
        let (t23, u23) = (_mm512_permutex2var_epi64(v[0], hi, v[1]), _mm512_permutex2var_epi64(v[2], hi, v[3]));
        [
            _mm512_shuffle_i64x2::<0x44>(t01, u01),
            _mm512_shuffle_i64x2::<0xee>(t01, u01),
            _mm512_shuffle_i64x2::<0x44>(t23, u23),
            _mm512_shuffle_i64x2::<0xee>(t23, u23),
        ]
    }

    /// `−128·Σq` over the lanes of the chunks `w` (signed values): the start
    /// of a chain that takes the activations as `x + 128`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn offset(w: &[__m512i]) -> __m512i {
        let k128 = _mm512_set1_epi8(-128);
        let sum = w.iter().fold(_mm512_setzero_si512(), |s, &v| _mm512_dpbusd_epi32(s, k128, v));
        _mm512_sub_epi32(_mm512_setzero_si512(), sum)
    }

    /// Decodes the `Q4_K` (`fifth` false) or `Q5_K` block at `blk`.
    ///
    /// # Safety
    /// `blk` is readable for one block of its format.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    unsafe fn k_block(blk: *const u8, fifth: bool) -> KBlock {
        // SAFETY: the block's bytes are readable (contract); its quants
        // sit at 16 (`Q4_K`) or 48 (`Q5_K`, after 32 bytes of fifth bits).
        unsafe {
            let qs = blk.add(if fifth { 48 } else { 16 });
            let mut w = nibbles(_mm512_loadu_si512(qs.cast()), _mm512_loadu_si512(qs.add(64).cast()));
            if fifth {
                // The fifth bit of sub-block `s` is bit `s` of each byte
                // `l` (value `l` of the sub-block): qword lane `s` keeps
                // bit `s` and moves it to bit 4.
                let bits = _mm512_setr_epi64(
                    0x0101_0101_0101_0101,
                    0x0202_0202_0202_0202,
                    0x0404_0404_0404_0404,
                    0x0808_0808_0808_0808,
                    0x1010_1010_1010_1010,
                    0x2020_2020_2020_2020,
                    0x4040_4040_4040_4040,
                    0x8080_8080_8080_8080u64 as i64,
                );
                let shift = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
                for (c, v) in w.iter_mut().enumerate() {
                    let qh = _mm512_set1_epi64(blk.add(16 + 8 * c).cast::<i64>().read_unaligned());
                    let bit = _mm512_srlv_epi64(_mm512_and_si512(qh, bits), shift);
                    *v = _mm512_or_si512(*v, _mm512_slli_epi64::<4>(bit));
                }
            }
            KBlock { w }
        }
    }

    /// Decodes the `Q6_K` block at `blk` into signed chunk vectors.
    ///
    /// # Safety
    /// `blk` is readable for 210 bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    unsafe fn q6k_block(blk: *const u8) -> SBlock {
        let (low, three, bias) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3), _mm512_set1_epi8(32));
        let (shift_lo, shift_hi) =
            (_mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2), _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6));
        let mut v = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // SAFETY: 64 bytes of low bits at 64h and 32 of high bits at
            // 128 + 32h lie in the block (contract).
            let (ql, qh) = unsafe {
                (
                    _mm512_loadu_si512(blk.add(64 * h).cast()),
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(128 + 32 * h).cast())),
                )
            };
            let (lo, hi) = (_mm512_and_si512(ql, low), _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low));
            let top_lo = _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_lo), three));
            let top_hi = _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_hi), three));
            // Sub-blocks 4h | 4h+1 and 4h+2 | 4h+3, as signed q.
            v[2 * h] = _mm512_sub_epi8(_mm512_or_si512(lo, top_lo), bias);
            v[2 * h + 1] = _mm512_sub_epi8(_mm512_or_si512(hi, top_hi), bias);
        }
        let w = regroup(v);
        SBlock { w, start: [offset(&w[..2]), offset(&w[2..])] }
    }

    /// Decodes the eight `Q8_0` blocks at `blk` into chunk vectors.
    ///
    /// # Safety
    /// `blk` is readable for 272 bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    unsafe fn q8_0_block(blk: *const u8) -> SBlock {
        let mut v = [_mm512_setzero_si512(); 4];
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: block `p`'s 32 quants sit at 34p + 2 (contract).
            let (a, b) = unsafe {
                (
                    _mm256_loadu_si256(blk.add(Q8_0_BYTES * 2 * i + 2).cast()),
                    _mm256_loadu_si256(blk.add(Q8_0_BYTES * (2 * i + 1) + 2).cast()),
                )
            };
            *v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
        }
        let w = regroup(v);
        let whole = offset(&w);
        SBlock { w, start: [whole, whole] }
    }

    /// Adds `f·dx` to the 16 lanes at `acc`.
    ///
    /// # Safety
    /// `acc` is writable for 16 values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    unsafe fn accumulate(acc: *mut f32, f: __m512, dx: __m512) {
        // SAFETY: 16 values at `acc` (contract).
        unsafe { _mm512_storeu_ps(acc, _mm512_add_ps(_mm512_loadu_ps(acc), _mm512_mul_ps(f, dx))) }
    }

    /// `f32(c)·dv − f32(m)·dmin`, lane by lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn minus_mins(c: __m512i, dv: __m512, m: __m512i, dmin: __m512) -> __m512 {
        _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(c), dv), _mm512_mul_ps(_mm512_cvtepi32_ps(m), dmin))
    }

    /// `Q4_K`: steps of two blocks of a pair of weight rows, each decoded
    /// once and multiplied by every row of the panel; every activation
    /// chunk loaded serves both weight rows.
    ///
    /// # Safety
    /// The CPU has the features above; `w` holds `jn` rows of
    /// `panel.blocks` blocks; the panel's tables are complete; `scratch`
    /// is writable for `panel.scratch(jn)` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn q4k(w: *const u8, jn: usize, panel: &Panel<'_>, scratch: *mut f32) {
        let (rows, blocks) = (panel.rows.len(), panel.blocks);
        let (rb, pairs) = (blocks * Q4K_BYTES, jn.div_ceil(2));
        // SAFETY: forwarded contract.
        unsafe { clear(scratch, panel.scratch(jn)) };
        for s in 0..panel.steps {
            let xs = panel.x.as_ptr().wrapping_add(s * rows * 2 * Q4K_VALUES).cast::<i8>();
            for p in 0..pairs {
                let (rj, rk, kb) = second(w, p, jn, blocks, rb);
                prefetch_next(w, (2 * p, jn), (s, panel.steps, rows), rb, 2 * Q4K_BYTES);
                prefetch_next(w, (2 * p + 1, jn), (s, panel.steps, rows), rb, 2 * Q4K_BYTES);
                let pj = [block(rj, 2 * s, blocks, Q4K_BYTES), block(rj, 2 * s + 1, blocks, Q4K_BYTES)];
                let pk = [block(rk, 2 * s, kb, Q4K_BYTES), block(rk, 2 * s + 1, kb, Q4K_BYTES)];
                // SAFETY: the step's blocks lie in the rows or are ZERO.
                let (j0, j1, k0, k1, (scj, mnj), (sck, mnk), (dv, dmin)) = unsafe {
                    (
                        k_block(pj[0], false),
                        k_block(pj[1], false),
                        k_block(pk[0], false),
                        k_block(pk[1], false),
                        scales_pair(pj[0], pj[1]),
                        scales_pair(pk[0], pk[1]),
                        scales_d([pj[0], pk[0], pj[1], pk[1]]),
                    )
                };
                let (scj, sck, mw) = (pair_scales(scj), pair_scales(sck), min_words(mnj, mnk, None));
                let acc = scratch.wrapping_add(16 * p * rows);
                for r in 0..rows {
                    // SAFETY: the panel holds the step's 512 values of row
                    // `r` and its entries of `xv` and `sums`; `acc` holds row `r`.
                    unsafe {
                        let x = xs.add(r * 2 * Q4K_VALUES);
                        let (mut cj0, mut cj1, mut ck0, mut ck1) = (
                            _mm512_setzero_si512(),
                            _mm512_setzero_si512(),
                            _mm512_setzero_si512(),
                            _mm512_setzero_si512(),
                        );
                        for c in 0..4 {
                            let (x0, x1) = (
                                _mm512_loadu_si512(x.add(64 * c).cast()),
                                _mm512_loadu_si512(x.add(Q4K_VALUES + 64 * c).cast()),
                            );
                            cj0 = _mm512_dpbusd_epi32(cj0, j0.w[c], x0);
                            ck0 = _mm512_dpbusd_epi32(ck0, k0.w[c], x0);
                            cj1 = _mm512_dpbusd_epi32(cj1, j1.w[c], x1);
                            ck1 = _mm512_dpbusd_epi32(ck1, k1.w[c], x1);
                        }
                        let uj = _mm512_madd_epi16(_mm512_packs_epi32(cj0, cj1), scj);
                        let uk = _mm512_madd_epi16(_mm512_packs_epi32(ck0, ck1), sck);
                        let at = s * rows + r;
                        let m = _mm512_madd_epi16(_mm512_loadu_si512(panel.sums.as_ptr().add(16 * at).cast()), mw);
                        let dx = _mm512_broadcast_f32x4(_mm_loadu_ps(panel.xv.as_ptr().add(4 * at)));
                        accumulate(acc.add(16 * r), minus_mins(fold(uj, uk), dv, m, dmin), dx);
                    }
                }
            }
        }
    }

    /// `Q5_K`: steps of two blocks of a pair of weight rows, block by block.
    ///
    /// # Safety
    /// As [`q4k`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn q5k(w: *const u8, jn: usize, panel: &Panel<'_>, scratch: *mut f32) {
        let (rows, blocks) = (panel.rows.len(), panel.blocks);
        let (rb, pairs) = (blocks * Q5K_BYTES, jn.div_ceil(2));
        // SAFETY: forwarded contract.
        unsafe { clear(scratch, panel.scratch(jn)) };
        for s in 0..panel.steps {
            let xs = panel.x.as_ptr().wrapping_add(s * rows * 2 * Q4K_VALUES).cast::<i8>();
            for p in 0..pairs {
                let (rj, rk, kb) = second(w, p, jn, blocks, rb);
                prefetch_next(w, (2 * p, jn), (s, panel.steps, rows), rb, 2 * Q5K_BYTES);
                prefetch_next(w, (2 * p + 1, jn), (s, panel.steps, rows), rb, 2 * Q5K_BYTES);
                let pj = [block(rj, 2 * s, blocks, Q5K_BYTES), block(rj, 2 * s + 1, blocks, Q5K_BYTES)];
                let pk = [block(rk, 2 * s, kb, Q5K_BYTES), block(rk, 2 * s + 1, kb, Q5K_BYTES)];
                // SAFETY: the step's blocks lie in the rows or are ZERO.
                let ((scj, mnj), (sck, mnk), (d, dmin)) = unsafe {
                    (scales_pair(pj[0], pj[1]), scales_pair(pk[0], pk[1]), scales_d([pj[0], pk[0], pj[1], pk[1]]))
                };
                // Per block `i`: its scales for both rows; `d` and `dmin`
                // of rows j, k in positions 0, 1 and again in 2, 3.
                let scv = [
                    (pair_scales(_mm_unpacklo_epi64(scj, scj)), pair_scales(_mm_unpacklo_epi64(sck, sck))),
                    (pair_scales(_mm_unpackhi_epi64(scj, scj)), pair_scales(_mm_unpackhi_epi64(sck, sck))),
                ];
                let dv = [_mm512_permute_ps::<0b01_00_01_00>(d), _mm512_permute_ps::<0b11_10_11_10>(d)];
                let dm = [_mm512_permute_ps::<0b01_00_01_00>(dmin), _mm512_permute_ps::<0b11_10_11_10>(dmin)];
                let acc = scratch.wrapping_add(16 * p * rows);
                for i in 0..2 {
                    // SAFETY: block `2s + i` lies in each row or is ZERO.
                    let (bj, bk) = unsafe { (k_block(pj[i], true), k_block(pk[i], true)) };
                    let mw = min_words(mnj, mnk, Some(i));
                    for r in 0..rows {
                        // SAFETY: as in `q4k`.
                        unsafe {
                            let x = xs.add(r * 2 * Q4K_VALUES + i * Q4K_VALUES);
                            let (x0, x1, x2, x3) = (
                                _mm512_loadu_si512(x.cast()),
                                _mm512_loadu_si512(x.add(64).cast()),
                                _mm512_loadu_si512(x.add(128).cast()),
                                _mm512_loadu_si512(x.add(192).cast()),
                            );
                            let zero = _mm512_setzero_si512();
                            let a01j = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, bj.w[0], x0), bj.w[1], x1);
                            let a23j = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, bj.w[2], x2), bj.w[3], x3);
                            let a01k = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, bk.w[0], x0), bk.w[1], x1);
                            let a23k = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, bk.w[2], x2), bk.w[3], x3);
                            let uj = _mm512_madd_epi16(_mm512_packs_epi32(a01j, a23j), scv[i].0);
                            let uk = _mm512_madd_epi16(_mm512_packs_epi32(a01k, a23k), scv[i].1);
                            let at = s * rows + r;
                            let m = _mm512_madd_epi16(_mm512_loadu_si512(panel.sums.as_ptr().add(16 * at).cast()), mw);
                            let dx = _mm512_set1_ps(*panel.xv.as_ptr().add(4 * at + 2 * i));
                            accumulate(acc.add(16 * r), minus_mins(fold(uj, uk), dv[i], m, dm[i]), dx);
                        }
                    }
                }
            }
        }
    }

    /// `Q6_K`: steps of two blocks of a pair of weight rows, block by block,
    /// activations as `x + 128`.
    ///
    /// # Safety
    /// As [`q4k`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn q6k(w: *const u8, jn: usize, panel: &Panel<'_>, scratch: *mut f32) {
        let (rows, blocks) = (panel.rows.len(), panel.blocks);
        let (rb, pairs) = (blocks * Q6K_BYTES, jn.div_ceil(2));
        // SAFETY: forwarded contract.
        unsafe { clear(scratch, panel.scratch(jn)) };
        for s in 0..panel.steps {
            let xs = panel.x.as_ptr().wrapping_add(s * rows * 2 * Q4K_VALUES);
            for p in 0..pairs {
                let (rj, rk, kb) = second(w, p, jn, blocks, rb);
                prefetch_next(w, (2 * p, jn), (s, panel.steps, rows), rb, 2 * Q6K_BYTES);
                prefetch_next(w, (2 * p + 1, jn), (s, panel.steps, rows), rb, 2 * Q6K_BYTES);
                let acc = scratch.wrapping_add(16 * p * rows);
                for i in 0..2 {
                    let (pj, pk) = (block(rj, 2 * s + i, blocks, Q6K_BYTES), block(rk, 2 * s + i, kb, Q6K_BYTES));
                    // SAFETY: the blocks lie in the rows or are ZERO, with
                    // 16 scales at 192 and `d` at 208.
                    let (bj, bk, scj, sck, dv) = unsafe {
                        let d = _mm_cvtph_ps(_mm_setr_epi16(
                            pj.add(208).cast::<i16>().read_unaligned(),
                            pk.add(208).cast::<i16>().read_unaligned(),
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                        ));
                        (
                            q6k_block(pj),
                            q6k_block(pk),
                            q6k_scales(_mm_loadu_si128(pj.add(192).cast())),
                            q6k_scales(_mm_loadu_si128(pk.add(192).cast())),
                            _mm512_broadcast_f32x4(_mm_movelh_ps(d, d)),
                        )
                    };
                    for r in 0..rows {
                        // SAFETY: as in `q4k`, the row's `x + 128` values.
                        unsafe {
                            let x = xs.add(r * 2 * Q4K_VALUES + i * Q4K_VALUES);
                            let xc = |c: usize| _mm512_loadu_si512(x.add(64 * c).cast());
                            let (x0, x1, x2, x3) = (xc(0), xc(1), xc(2), xc(3));
                            let a01j = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bj.start[0], x0, bj.w[0]), x1, bj.w[1]);
                            let a23j = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bj.start[1], x2, bj.w[2]), x3, bj.w[3]);
                            let a01k = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bk.start[0], x0, bk.w[0]), x1, bk.w[1]);
                            let a23k = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bk.start[1], x2, bk.w[2]), x3, bk.w[3]);
                            let uj = _mm512_madd_epi16(_mm512_packs_epi32(a01j, a23j), scj);
                            let uk = _mm512_madd_epi16(_mm512_packs_epi32(a01k, a23k), sck);
                            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(fold(uj, uk)), dv);
                            accumulate(
                                acc.add(16 * r),
                                f,
                                _mm512_set1_ps(*panel.xv.as_ptr().add((s * rows + r) * 4 + 2 * i)),
                            );
                        }
                    }
                }
            }
        }
    }

    /// `Q8_0`: steps of two groups of eight blocks of a pair of weight
    /// rows, group by group, activations as `x + 128`.
    ///
    /// # Safety
    /// As [`q4k`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn q8_0(w: *const u8, jn: usize, panel: &Panel<'_>, scratch: *mut f32) {
        let (rows, blocks) = (panel.rows.len(), panel.blocks);
        let size = 8 * Q8_0_BYTES;
        let (rb, pairs) = (blocks * size, jn.div_ceil(2));
        // SAFETY: forwarded contract.
        unsafe { clear(scratch, panel.scratch(jn)) };
        for s in 0..panel.steps {
            let xs = panel.x.as_ptr().wrapping_add(s * rows * 2 * Q4K_VALUES);
            for p in 0..pairs {
                let (rj, rk, kb) = second(w, p, jn, blocks, rb);
                prefetch_next(w, (2 * p, jn), (s, panel.steps, rows), rb, 2 * size);
                prefetch_next(w, (2 * p + 1, jn), (s, panel.steps, rows), rb, 2 * size);
                let acc = scratch.wrapping_add(16 * p * rows);
                for i in 0..2 {
                    let (pj, pk) = (block(rj, 2 * s + i, blocks, size), block(rk, 2 * s + i, kb, size));
                    // The scales, lane `2p + e`: block `p` of row `j` (`e` = 0) or `k`.
                    let mut dh = [0u16; 16];
                    for (l, h) in dh.iter_mut().enumerate() {
                        let at = if l % 2 == 0 { pj } else { pk }.wrapping_add(Q8_0_BYTES * (l / 2));
                        // SAFETY: each block's `d` at 34p of a group in the row or ZERO.
                        *h = unsafe { at.cast::<u16>().read_unaligned() };
                    }
                    // SAFETY: the groups lie in the rows or are ZERO; `dh` is 32 bytes.
                    let (bj, bk, dv) = unsafe {
                        (q8_0_block(pj), q8_0_block(pk), _mm512_cvtph_ps(_mm256_loadu_si256(dh.as_ptr().cast())))
                    };
                    for r in 0..rows {
                        // SAFETY: as in `q6k`.
                        unsafe {
                            let x = xs.add(r * 2 * Q4K_VALUES + i * Q4K_VALUES);
                            let (mut aj, mut ak) = (bj.start[0], bk.start[0]);
                            for c in 0..4 {
                                let xc = _mm512_loadu_si512(x.add(64 * c).cast());
                                aj = _mm512_dpbusd_epi32(aj, xc, bj.w[c]);
                                ak = _mm512_dpbusd_epi32(ak, xc, bk.w[c]);
                            }
                            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(fold(aj, ak)), dv);
                            accumulate(
                                acc.add(16 * r),
                                f,
                                _mm512_set1_ps(*panel.xv.as_ptr().add((s * rows + r) * 4 + 2 * i)),
                            );
                        }
                    }
                }
            }
        }
    }

    /// Zeroes `len` values at `p` (`len` a multiple of 16).
    ///
    /// # Safety
    /// `p` is writable for `len` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    #[inline]
    unsafe fn clear(p: *mut f32, len: usize) {
        for i in (0..len / 16).map(|i| 16 * i) {
            // SAFETY: values `i..i + 16` lie inside `len` (contract).
            unsafe { _mm512_storeu_ps(p.add(i), _mm512_setzero_ps()) };
        }
    }

    /// The even and the odd lanes of `v` summed as `tree16` does (lanes
    /// `i` and `i + 8`, then `i + 4`, then `i + 2`): lanes 0 and 1.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn reduce(v: __m512) -> __m128 {
        let s = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0xee>(v, v));
        let s = _mm512_add_ps(s, _mm512_shuffle_f32x4::<0x55>(s, s));
        let s = _mm512_add_ps(s, _mm512_shuffle_ps::<0xee>(s, s));
        _mm512_castps512_ps128(s)
    }

    /// [`reduce`] for up to 16 rows at once (`v[r]`: row `r`): lane `r` of
    /// the first result is row `r`'s even lanes (weight row `j`), of the
    /// second its odd lanes (`k`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    fn reduce16(v: &[__m512; 16]) -> (__m512, __m512) {
        let mut t1 = [_mm512_setzero_ps(); 8];
        for (i, t) in t1.iter_mut().enumerate() {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            *t = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xee>(a, b));
        }
        let mut t2 = [_mm512_setzero_ps(); 4];
        for (i, t) in t2.iter_mut().enumerate() {
            let (a, b) = (t1[2 * i], t1[2 * i + 1]);
            *t = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xdd>(a, b));
        }
        let mut t3 = [_mm512_setzero_ps(); 2];
        for (i, t) in t3.iter_mut().enumerate() {
            let (a, b) = (t2[2 * i], t2[2 * i + 1]);
            *t = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xee>(a, b));
        }
        // t3[h] lane `4k + 2u + e`: row `8h + 4u + k`, weight row `e`.
        let j = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 16, 20, 24, 28, 18, 22, 26, 30);
        let k = _mm512_setr_epi32(1, 5, 9, 13, 3, 7, 11, 15, 17, 21, 25, 29, 19, 23, 27, 31);
        (_mm512_permutex2var_ps(t3[0], j, t3[1]), _mm512_permutex2var_ps(t3[0], k, t3[1]))
    }

    /// The outputs from the accumulators in `scratch` (as the kernels
    /// left them): each pair's even and odd lanes reduced, into
    /// `out[jj·rows + r]`.
    ///
    /// # Safety
    /// `scratch` is readable for `panel.scratch(jn)` values, `out`
    /// writable for `jn·rows`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn finish(jn: usize, panel: &Panel<'_>, scratch: *const f32, out: *mut f32) {
        let rows = panel.rows.len();
        for p in 0..jn.div_ceil(2) {
            let acc = scratch.wrapping_add(16 * p * rows);
            let both = 2 * p + 1 < jn;
            let (oj, ok) = (out.wrapping_add(2 * p * rows), out.wrapping_add((2 * p + 1) * rows));
            if rows <= 4 {
                for r in 0..rows {
                    // SAFETY: row `r`'s 16 lanes, outputs `r` of the pair (contract).
                    unsafe {
                        let y = reduce(_mm512_loadu_ps(acc.add(16 * r)));
                        oj.add(r).write(_mm_cvtss_f32(y));
                        if both {
                            ok.add(r).write(_mm_cvtss_f32(_mm_movehdup_ps(y)));
                        }
                    }
                }
            } else {
                for h in (0..rows).step_by(16) {
                    let n = (rows - h).min(16);
                    let mut v = [_mm512_setzero_ps(); 16];
                    for (r, v) in v.iter_mut().enumerate().take(n) {
                        // SAFETY: rows `h + r < rows` (contract).
                        *v = unsafe { _mm512_loadu_ps(acc.add(16 * (h + r))) };
                    }
                    let (yj, yk) = reduce16(&v);
                    let keep = ((1u32 << n) - 1) as u16;
                    // SAFETY: outputs `h..h + n` of each weight row (contract).
                    unsafe {
                        _mm512_mask_storeu_ps(oj.add(h), keep, yj);
                        if both {
                            _mm512_mask_storeu_ps(ok.add(h), keep, yk);
                        }
                    }
                }
            }
        }
    }
}

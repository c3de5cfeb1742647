//! The quantized products' kernels on AVX2 (with F16C), for CPUs without
//! AVX-512 VNNI: with [`super::stream`], the only `unsafe` of this path.
//! They compute the same integer lanes and then the same `f32` operations in
//! the same order as `scalar::run` (and the VNNI kernels), so all paths give
//! the same bits.
//!
//! The layout is the panel's ([`super::value_offset`]): in each 64-byte chunk
//! of a block's activations the 4-byte lanes `2s` and `2s + 1` belong to
//! sub-block `s`, so a 256-bit vector (half `h` of a chunk) holds 8 values
//! of each of the sub-blocks `4h..4h + 4`. Each weight block is decoded once
//! per call into eight vectors of the same order (chunk `c`, half `h`):
//! nibbles, fifth bits or high bit pairs unpacked into one 32-byte vector
//! per sub-block in value order, then 64-bit pieces regrouped by
//! `vpunpck*qdq` and `vperm2i128`.
//!
//! `vpmaddubsw` multiplies unsigned by signed bytes and adds adjacent
//! products into 16-bit lanes; the chunks of a block (or of half a block) are
//! added in 16 bits, which cannot overflow: `Q4_K` sums 8 products of
//! `15·127` a lane (four chunks), `Q5_K` 4 of `31·127` (two chunks: the
//! scalar lanes split a sub-block into halves), `Q6_K` 4 of `32·127`. One
//! `vpmaddwd` against the sub-block scales (each repeated over its four
//! 16-bit lanes) turns them into `i32` lanes, two per sub-block; two
//! levels of `vphaddd` over the four vectors of a pair of weight rows and
//! two blocks (or halves) give the 8 lanes of `scalar::run`'s 16 that
//! belong to sub-blocks `4h..4h + 4`, even lanes for one weight row, odd for
//! the other.
//!
//! `Q4_K` and `Q5_K` quants are unsigned, so the activations enter as signed
//! bytes. `Q6_K` quants are signed: there the panel's activations are
//! `x + 128` (unsigned) and each 16-bit chain starts from `−128·Σq` of its
//! lanes (computed once per block), which leaves `Σ q·x` exactly; the
//! intermediate sums may wrap in 16 bits, the final one fits. `Q8_0` quants
//! reach `−128`, too large for that: there the activations are flipped back
//! to signed and multiplied as `|q|` by `x·sign(q)` (`vpsignb`), each chunk
//! widened to 32 bits by `vpmaddwd` against ones.
//!
//! The minimum terms of `Q4_K` and `Q5_K` are one `vpmaddwd` per half: the
//! row's sub-block sums (16-bit pairs, prepared by the panel) against both
//! weight rows' minimums. The `f32` part, per activation row, pair and step
//! (or block): convert, multiply by `d`, subtract the minimum terms times
//! `dmin`, multiply by the activations' `dx` and add to the row's 16 lanes
//! (two vectors), with no fused multiply-add. At the end the even and the
//! odd lanes are summed apart, in `tree16`'s order.
//!
//! The decoded weights (eight vectors a block) do not fit the sixteen
//! registers with the activations; they stay in L1 and feed
//! `vpmaddubsw` from there. The weight bytes of later steps are prefetched
//! as in the VNNI kernels: into L2 far enough ahead to hide a DRAM access,
//! into L1 one step ahead.

use super::{Panel, Weights};

/// Whether this CPU has the kernels' instructions (AVX2 and F16C). Costs two
/// atomic loads after the first call.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
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
/// does not fit. Costs `O(jn·rows·k)` multiply-adds at 32 per `vpmaddubsw`,
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
        // SAFETY: AVX2 and F16C are present, and every length the kernels
        // read or write was checked above.
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

    /// A decoded block: vector `2c + h` holds half `h` of chunk `c` (values
    /// `8c..8c + 8` of sub-blocks `4h..4h + 4`, 8 bytes each).
    type Decoded = [__m256i; 8];

    /// The `f16` at `p`, as bits.
    ///
    /// # Safety
    /// `p` is readable for 2 bytes.
    #[inline(always)]
    unsafe fn half(p: *const u8) -> i16 {
        // SAFETY: 2 bytes at `p` (contract).
        unsafe { p.cast::<i16>().read_unaligned() }
    }

    /// The four `f16`s `h` as `f32`, repeated in both 128-bit lanes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn halves4(h: [i16; 4]) -> __m256 {
        let v = _mm_cvtph_ps(_mm_setr_epi16(h[0], h[1], h[2], h[3], 0, 0, 0, 0));
        _mm256_set_m128(v, v)
    }

    /// The byte-shuffle indices that repeat byte `base + s` of a 16-byte
    /// vector over bytes `4s..4s + 4` (`s` in 0..4), for a scale word per
    /// 16-bit lane of a `vpmaddubsw` result of sub-blocks `4h..4h + 4`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn repeat4(base: i8) -> __m128i {
        let (a, b, c, d) = (base, base + 1, base + 2, base + 3);
        _mm_setr_epi8(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)
    }

    /// The 16-bit scale words of block `i`, half `h`, from `[scales block 0 |
    /// block 1]` (unsigned): word `4s + u` is the scale of sub-block `4h + s`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn k_scales(sc: __m128i, i: usize, h: usize) -> __m256i {
        _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sc, repeat4((8 * i + 4 * h) as i8)))
    }

    /// Byte-shuffle indices for [`min_words`], per `only` (`None`,
    /// `Some(0)`, `Some(1)`), half `h` and row `e`: byte `2l + t` of the
    /// half (lane `l = 4k' + 2i + e`, `k = 2h + k'`) takes minimum `2k + t`
    /// of block `i` (byte `8i + 2k + t` of the row's minimums) from row `e`,
    /// or zero (index −1) where the lane belongs to the other row or block.
    const MIN_INDEX: [[[[i8; 16]; 2]; 2]; 3] = {
        let mut t = [[[[-1i8; 16]; 2]; 2]; 3];
        let mut only = 0;
        while only < 3 {
            let mut h = 0;
            while h < 2 {
                let mut l = 0;
                while l < 8 {
                    let (k, i, e) = (2 * h + l / 4, l % 4 / 2, l % 2);
                    if only == 0 || only - 1 == i {
                        t[only][h][e][2 * l] = (8 * i + 2 * k) as i8;
                        t[only][h][e][2 * l + 1] = (8 * i + 2 * k + 1) as i8;
                    }
                    l += 1;
                }
                h += 1;
            }
            only += 1;
        }
        t
    };

    /// The minimum words of a pair of rows for one `vpmaddwd` against the
    /// panel's sums, lanes `8h..8h + 8` of the 16: word pair `4k + 2i + e`
    /// holds minimums `2k`, `2k + 1` of block `i` of row `e` (`mj`: row `j`'s
    /// `[mins block 0 | block 1]`, `mk` row `k`'s); with `only = Some(i)`
    /// the other block's words are 0.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn min_words(mj: __m128i, mk: __m128i, h: usize, only: Option<usize>) -> __m256i {
        let table = &MIN_INDEX[only.map_or(0, |i| 1 + i.min(1))][h.min(1)];
        // SAFETY: each index row holds 16 bytes.
        let (ij, ik) =
            unsafe { (_mm_loadu_si128(table[0].as_ptr().cast()), _mm_loadu_si128(table[1].as_ptr().cast())) };
        _mm256_cvtepu8_epi16(_mm_or_si128(_mm_shuffle_epi8(mj, ij), _mm_shuffle_epi8(mk, ik)))
    }

    /// Four sub-blocks (32 bytes each, in value order) regrouped into the
    /// four chunk halves they fill: `[a.c, b.c, c.c, d.c]` (64-bit piece `c`
    /// of each) for `c` in 0..4.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn regroup(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> [__m256i; 4] {
        let (u0, u1) = (_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
        let (v0, v1) = (_mm256_unpacklo_epi64(c, d), _mm256_unpackhi_epi64(c, d));
        [
            _mm256_permute2x128_si256::<0x20>(u0, v0),
            _mm256_permute2x128_si256::<0x20>(u1, v1),
            _mm256_permute2x128_si256::<0x31>(u0, v0),
            _mm256_permute2x128_si256::<0x31>(u1, v1),
        ]
    }

    /// Eight sub-blocks in value order, regrouped into a [`Decoded`] block.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn arrange(sb: [__m256i; 8]) -> Decoded {
        let mut out = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let g = regroup(sb[4 * h], sb[4 * h + 1], sb[4 * h + 2], sb[4 * h + 3]);
            for (c, v) in g.into_iter().enumerate() {
                out[2 * c + h] = v;
            }
        }
        out
    }

    /// Decodes the `Q4_K` (`fifth` false) or `Q5_K` block at `blk`.
    ///
    /// # Safety
    /// `blk` is readable for one block of its format.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn k_block(blk: *const u8, fifth: bool) -> Decoded {
        let low = _mm256_set1_epi8(0x0f);
        let qs = blk.wrapping_add(if fifth { 48 } else { 16 });
        let mut sb = [_mm256_setzero_si256(); 8];
        for t in 0..4 {
            // SAFETY: the 128 bytes of quants sit at 16 (`Q4_K`) or 48
            // (`Q5_K`) of a readable block (contract).
            let q = unsafe { _mm256_loadu_si256(qs.add(32 * t).cast()) };
            sb[2 * t] = _mm256_and_si256(q, low);
            sb[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
        }
        let mut w = arrange(sb);
        if fifth {
            // The fifth bit of sub-block `4h + s` is bit `4h + s` of byte
            // `l` (value `l`); 64-bit lane `s` of a chunk half keeps it and
            // moves it to bit 4.
            let (keep0, keep1) = (
                _mm256_setr_epi64x(
                    0x0101_0101_0101_0101,
                    0x0202_0202_0202_0202,
                    0x0404_0404_0404_0404,
                    0x0808_0808_0808_0808,
                ),
                _mm256_setr_epi64x(
                    0x1010_1010_1010_1010,
                    0x2020_2020_2020_2020,
                    0x4040_4040_4040_4040,
                    0x8080_8080_8080_8080u64 as i64,
                ),
            );
            let (up, down) = (_mm256_setr_epi64x(4, 3, 2, 1), _mm256_setr_epi64x(0, 1, 2, 3));
            for c in 0..4 {
                // SAFETY: the 32 bytes of fifth bits sit at 16 (contract).
                let qh = _mm256_set1_epi64x(unsafe { blk.add(16 + 8 * c).cast::<i64>().read_unaligned() });
                let b0 = _mm256_sllv_epi64(_mm256_and_si256(qh, keep0), up);
                let b1 = _mm256_srlv_epi64(_mm256_and_si256(qh, keep1), down);
                w[2 * c] = _mm256_or_si256(w[2 * c], b0);
                w[2 * c + 1] = _mm256_or_si256(w[2 * c + 1], b1);
            }
        }
        w
    }

    /// Decodes the `Q6_K` block at `blk` into signed values.
    ///
    /// # Safety
    /// `blk` is readable for 210 bytes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn q6k_block(blk: *const u8) -> Decoded {
        let (low, two, bias) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30), _mm256_set1_epi8(32));
        let mut sb = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            // SAFETY: 64 bytes of low bits at 64h and 32 of high bits at
            // 128 + 32h lie in the block (contract).
            let (l0, l1, qh) = unsafe {
                (
                    _mm256_loadu_si256(blk.add(64 * h).cast()),
                    _mm256_loadu_si256(blk.add(64 * h + 32).cast()),
                    _mm256_loadu_si256(blk.add(128 + 32 * h).cast()),
                )
            };
            // Sub-block `4h + g`: low bits from `l0` (g = 0, 2) or `l1`, the
            // low (g < 2) or high nibble; high bits `2g, 2g + 1` of `qh`,
            // moved to bits 4 and 5.
            let nib = [
                _mm256_and_si256(l0, low),
                _mm256_and_si256(l1, low),
                _mm256_and_si256(_mm256_srli_epi16::<4>(l0), low),
                _mm256_and_si256(_mm256_srli_epi16::<4>(l1), low),
            ];
            let top = [
                _mm256_and_si256(_mm256_slli_epi16::<4>(qh), two),
                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), two),
                _mm256_and_si256(qh, two),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), two),
            ];
            for g in 0..4 {
                sb[4 * h + g] = _mm256_sub_epi8(_mm256_or_si256(nib[g], top[g]), bias);
            }
        }
        arrange(sb)
    }

    /// Decodes the eight `Q8_0` blocks at `blk` (sub-block `p` is block `p`).
    ///
    /// # Safety
    /// `blk` is readable for 272 bytes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn q8_0_block(blk: *const u8) -> Decoded {
        let mut sb = [_mm256_setzero_si256(); 8];
        for (p, v) in sb.iter_mut().enumerate() {
            // SAFETY: block `p`'s 32 quants sit at 34p + 2 (contract).
            *v = unsafe { _mm256_loadu_si256(blk.add(Q8_0_BYTES * p + 2).cast()) };
        }
        arrange(sb)
    }

    /// `−128·Σq` in 16-bit lanes over chunks `c0` and `c0 + 1` of half `h`
    /// of a signed block: the start of a chain that takes the activations
    /// as `x + 128`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn offset(w: &Decoded, c0: usize, h: usize) -> __m256i {
        let k128 = _mm256_set1_epi8(-128);
        let sum =
            _mm256_add_epi16(_mm256_maddubs_epi16(k128, w[2 * c0 + h]), _mm256_maddubs_epi16(k128, w[2 * c0 + 2 + h]));
        _mm256_sub_epi16(_mm256_setzero_si256(), sum)
    }

    /// Two levels of `vphaddd` over four vectors of `i32` lanes (two per
    /// sub-block `4h..4h + 4`): lane `4k' + t` is the sum of sub-blocks
    /// `4h + 2k'` and `4h + 2k' + 1` of vector `t`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn lanes(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m256i {
        _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d))
    }

    /// Adds `f·dx` to the 8 lanes at `acc`.
    ///
    /// # Safety
    /// `acc` is writable for 8 values.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn accumulate(acc: *mut f32, f: __m256, dx: __m256) {
        // SAFETY: 8 values at `acc` (contract).
        unsafe { _mm256_storeu_ps(acc, _mm256_add_ps(_mm256_loadu_ps(acc), _mm256_mul_ps(f, dx))) }
    }

    /// `f32(c)·dv − f32(m)·dmin`, lane by lane.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn minus_mins(c: __m256i, dv: __m256, m: __m256i, dmin: __m256) -> __m256 {
        _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), dv), _mm256_mul_ps(_mm256_cvtepi32_ps(m), dmin))
    }

    /// Zeroes `len` values at `p` (`len` a multiple of 8).
    ///
    /// # Safety
    /// `p` is writable for `len` values.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn clear(p: *mut f32, len: usize) {
        for i in (0..len / 8).map(|i| 8 * i) {
            // SAFETY: values `i..i + 8` lie inside `len` (contract).
            unsafe { _mm256_storeu_ps(p.add(i), _mm256_setzero_ps()) };
        }
    }

    /// `Q4_K`: steps of two blocks of a pair of weight rows, each decoded
    /// once and multiplied by every row of the panel; every activation
    /// vector loaded serves both weight rows.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `w` holds `jn` rows of `panel.blocks`
    /// blocks; the panel's tables are complete; `scratch` is writable for
    /// `panel.scratch(jn)` values.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q4k(w: *const u8, jn: usize, panel: &Panel<'_>, scratch: *mut f32) {
        let (rows, blocks) = (panel.rows.len(), panel.blocks);
        let (rb, pairs) = (blocks * Q4K_BYTES, jn.div_ceil(2));
        // SAFETY: forwarded contract.
        unsafe { clear(scratch, panel.scratch(jn)) };
        for s in 0..panel.steps {
            let xs = panel.x.as_ptr().wrapping_add(s * rows * 2 * Q4K_VALUES);
            for p in 0..pairs {
                let (rj, rk, kb) = second(w, p, jn, blocks, rb);
                prefetch_next(w, (2 * p, jn), (s, panel.steps, rows), rb, 2 * Q4K_BYTES);
                prefetch_next(w, (2 * p + 1, jn), (s, panel.steps, rows), rb, 2 * Q4K_BYTES);
                let pj = [block(rj, 2 * s, blocks, Q4K_BYTES), block(rj, 2 * s + 1, blocks, Q4K_BYTES)];
                let pk = [block(rk, 2 * s, kb, Q4K_BYTES), block(rk, 2 * s + 1, kb, Q4K_BYTES)];
                // SAFETY: the step's blocks lie in the rows or are ZERO.
                let (wb, (scj, mnj), (sck, mnk), dv, dmin) = unsafe {
                    (
                        [
                            [k_block(pj[0], false), k_block(pj[1], false)],
                            [k_block(pk[0], false), k_block(pk[1], false)],
                        ],
                        scales_pair(pj[0], pj[1]),
                        scales_pair(pk[0], pk[1]),
                        halves4([half(pj[0]), half(pk[0]), half(pj[1]), half(pk[1])]),
                        halves4([half(pj[0].add(2)), half(pk[0].add(2)), half(pj[1].add(2)), half(pk[1].add(2))]),
                    )
                };
                // Scale words per row `e`, block `i`, half `h`; minimum words per half.
                let sc = [scj, sck];
                let scv: [[[__m256i; 2]; 2]; 2] =
                    std::array::from_fn(|e| std::array::from_fn(|i| std::array::from_fn(|h| k_scales(sc[e], i, h))));
                let mw = [min_words(mnj, mnk, 0, None), min_words(mnj, mnk, 1, None)];
                let acc = scratch.wrapping_add(16 * p * rows);
                for r in 0..rows {
                    // SAFETY: the panel holds the step's 512 values of row
                    // `r` and its entries of `xv` and `sums`; `acc` holds row `r`.
                    unsafe {
                        let x = xs.add(r * 2 * Q4K_VALUES);
                        let at = s * rows + r;
                        let dx4 = _mm_loadu_ps(panel.xv.as_ptr().add(4 * at));
                        let dx = _mm256_set_m128(dx4, dx4);
                        for h in 0..2 {
                            // `u[e][i]`: sub-blocks `4h..4h + 4` of block `i` of row `e`.
                            let mut u = [[_mm256_setzero_si256(); 2]; 2];
                            for i in 0..2 {
                                let (mut pj, mut pk) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                                for c in 0..4 {
                                    let xc = _mm256_loadu_si256(x.add(Q4K_VALUES * i + 64 * c + 32 * h).cast());
                                    pj = _mm256_add_epi16(pj, _mm256_maddubs_epi16(wb[0][i][2 * c + h], xc));
                                    pk = _mm256_add_epi16(pk, _mm256_maddubs_epi16(wb[1][i][2 * c + h], xc));
                                }
                                u[0][i] = _mm256_madd_epi16(pj, scv[0][i][h]);
                                u[1][i] = _mm256_madd_epi16(pk, scv[1][i][h]);
                            }
                            let c = lanes(u[0][0], u[1][0], u[0][1], u[1][1]);
                            let sums = _mm256_loadu_si256(panel.sums.as_ptr().add(16 * at + 8 * h).cast());
                            let m = _mm256_madd_epi16(sums, mw[h]);
                            accumulate(acc.add(16 * r + 8 * h), minus_mins(c, dv, m, dmin), dx);
                        }
                    }
                }
            }
        }
    }

    /// `Q5_K`: steps of two blocks of a pair of weight rows, block by block
    /// (the scalar lanes split each sub-block into halves).
    ///
    /// # Safety
    /// As [`q4k`].
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q5k(w: *const u8, jn: usize, panel: &Panel<'_>, scratch: *mut f32) {
        let (rows, blocks) = (panel.rows.len(), panel.blocks);
        let (rb, pairs) = (blocks * Q5K_BYTES, jn.div_ceil(2));
        // SAFETY: forwarded contract.
        unsafe { clear(scratch, panel.scratch(jn)) };
        for s in 0..panel.steps {
            let xs = panel.x.as_ptr().wrapping_add(s * rows * 2 * Q4K_VALUES);
            for p in 0..pairs {
                let (rj, rk, kb) = second(w, p, jn, blocks, rb);
                prefetch_next(w, (2 * p, jn), (s, panel.steps, rows), rb, 2 * Q5K_BYTES);
                prefetch_next(w, (2 * p + 1, jn), (s, panel.steps, rows), rb, 2 * Q5K_BYTES);
                let pj = [block(rj, 2 * s, blocks, Q5K_BYTES), block(rj, 2 * s + 1, blocks, Q5K_BYTES)];
                let pk = [block(rk, 2 * s, kb, Q5K_BYTES), block(rk, 2 * s + 1, kb, Q5K_BYTES)];
                // SAFETY: the step's blocks lie in the rows or are ZERO.
                let ((scj, mnj), (sck, mnk), dv, dm) = unsafe {
                    (
                        scales_pair(pj[0], pj[1]),
                        scales_pair(pk[0], pk[1]),
                        [
                            halves4([half(pj[0]), half(pk[0]), half(pj[0]), half(pk[0])]),
                            halves4([half(pj[1]), half(pk[1]), half(pj[1]), half(pk[1])]),
                        ],
                        [
                            halves4([half(pj[0].add(2)), half(pk[0].add(2)), half(pj[0].add(2)), half(pk[0].add(2))]),
                            halves4([half(pj[1].add(2)), half(pk[1].add(2)), half(pj[1].add(2)), half(pk[1].add(2))]),
                        ],
                    )
                };
                let acc = scratch.wrapping_add(16 * p * rows);
                for i in 0..2 {
                    // SAFETY: block `2s + i` lies in each row or is ZERO.
                    let wb = unsafe { [k_block(pj[i], true), k_block(pk[i], true)] };
                    let sc = [scj, sck];
                    let scv: [[__m256i; 2]; 2] =
                        std::array::from_fn(|e| std::array::from_fn(|h| k_scales(sc[e], i, h)));
                    let mw = [min_words(mnj, mnk, 0, Some(i)), min_words(mnj, mnk, 1, Some(i))];
                    for r in 0..rows {
                        // SAFETY: as in `q4k`.
                        unsafe {
                            let x = xs.add(r * 2 * Q4K_VALUES + i * Q4K_VALUES);
                            let at = s * rows + r;
                            let dx = _mm256_set1_ps(*panel.xv.as_ptr().add(4 * at + 2 * i));
                            for h in 0..2 {
                                // `u[half][e]`: values `16·half..` of sub-blocks `4h..4h + 4` of row `e`.
                                let mut u = [[_mm256_setzero_si256(); 2]; 2];
                                for (half, u) in u.iter_mut().enumerate() {
                                    let c0 = 2 * half;
                                    let x0 = _mm256_loadu_si256(x.add(64 * c0 + 32 * h).cast());
                                    let x1 = _mm256_loadu_si256(x.add(64 * c0 + 64 + 32 * h).cast());
                                    for (e, u) in u.iter_mut().enumerate() {
                                        let t = _mm256_add_epi16(
                                            _mm256_maddubs_epi16(wb[e][2 * c0 + h], x0),
                                            _mm256_maddubs_epi16(wb[e][2 * c0 + 2 + h], x1),
                                        );
                                        *u = _mm256_madd_epi16(t, scv[e][h]);
                                    }
                                }
                                let c = lanes(u[0][0], u[0][1], u[1][0], u[1][1]);
                                let sums = _mm256_loadu_si256(panel.sums.as_ptr().add(16 * at + 8 * h).cast());
                                let m = _mm256_madd_epi16(sums, mw[h]);
                                accumulate(acc.add(16 * r + 8 * h), minus_mins(c, dv[i], m, dm[i]), dx);
                            }
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
    #[target_feature(enable = "avx2,f16c")]
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
                    let pb = [block(rj, 2 * s + i, blocks, Q6K_BYTES), block(rk, 2 * s + i, kb, Q6K_BYTES)];
                    // SAFETY: the blocks lie in the rows or are ZERO, with
                    // 16 scales at 192 and `d` at 208.
                    let (wb, scales, dv) = unsafe {
                        (
                            [q6k_block(pb[0]), q6k_block(pb[1])],
                            [_mm_loadu_si128(pb[0].add(192).cast()), _mm_loadu_si128(pb[1].add(192).cast())],
                            halves4([
                                half(pb[0].add(208)),
                                half(pb[1].add(208)),
                                half(pb[0].add(208)),
                                half(pb[1].add(208)),
                            ]),
                        )
                    };
                    // Per row `e`, half `h` and half-sub-block `t`: the chain
                    // starts and the signed scale words (group `2(4h + s) + t`
                    // for sub-block `4h + s`).
                    let start: [[[__m256i; 2]; 2]; 2] = std::array::from_fn(|e| {
                        std::array::from_fn(|h| std::array::from_fn(|t| offset(&wb[e], 2 * t, h)))
                    });
                    let scv: [[[__m256i; 2]; 2]; 2] = std::array::from_fn(|e| {
                        std::array::from_fn(|h| {
                            std::array::from_fn(|t| {
                                let b = (8 * h + t) as i8;
                                let idx = _mm_setr_epi8(
                                    b,
                                    b,
                                    b,
                                    b,
                                    b + 2,
                                    b + 2,
                                    b + 2,
                                    b + 2,
                                    b + 4,
                                    b + 4,
                                    b + 4,
                                    b + 4,
                                    b + 6,
                                    b + 6,
                                    b + 6,
                                    b + 6,
                                );
                                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales[e], idx))
                            })
                        })
                    });
                    for r in 0..rows {
                        // SAFETY: as in `q4k`, the row's `x + 128` values.
                        unsafe {
                            let x = xs.add(r * 2 * Q4K_VALUES + i * Q4K_VALUES);
                            let dx = _mm256_set1_ps(*panel.xv.as_ptr().add((s * rows + r) * 4 + 2 * i));
                            for h in 0..2 {
                                let mut u = [[_mm256_setzero_si256(); 2]; 2];
                                for (t, u) in u.iter_mut().enumerate() {
                                    let c0 = 2 * t;
                                    let x0 = _mm256_loadu_si256(x.add(64 * c0 + 32 * h).cast());
                                    let x1 = _mm256_loadu_si256(x.add(64 * c0 + 64 + 32 * h).cast());
                                    for (e, u) in u.iter_mut().enumerate() {
                                        let chain = _mm256_add_epi16(
                                            _mm256_add_epi16(
                                                start[e][h][t],
                                                _mm256_maddubs_epi16(x0, wb[e][2 * c0 + h]),
                                            ),
                                            _mm256_maddubs_epi16(x1, wb[e][2 * c0 + 2 + h]),
                                        );
                                        *u = _mm256_madd_epi16(chain, scv[e][h][t]);
                                    }
                                }
                                let c = lanes(u[0][0], u[0][1], u[1][0], u[1][1]);
                                let f = _mm256_mul_ps(_mm256_cvtepi32_ps(c), dv);
                                accumulate(acc.add(16 * r + 8 * h), f, dx);
                            }
                        }
                    }
                }
            }
        }
    }

    /// `Q8_0`: steps of two groups of eight blocks of a pair of weight
    /// rows, group by group; the activations flipped back to signed and
    /// multiplied as `x·sign(q)` by `|q|`.
    ///
    /// # Safety
    /// As [`q4k`].
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q8_0(w: *const u8, jn: usize, panel: &Panel<'_>, scratch: *mut f32) {
        let (rows, blocks) = (panel.rows.len(), panel.blocks);
        let size = 8 * Q8_0_BYTES;
        let (rb, pairs) = (blocks * size, jn.div_ceil(2));
        let (flip, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
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
                    let pb = [block(rj, 2 * s + i, blocks, size), block(rk, 2 * s + i, kb, size)];
                    // The scales, lane `2p + e`: block `p` of row `e`.
                    let mut dh = [0i16; 16];
                    for (l, h) in dh.iter_mut().enumerate() {
                        // SAFETY: each block's `d` at 34p of a group in the row or ZERO.
                        *h = unsafe { half(pb[l % 2].add(Q8_0_BYTES * (l / 2))) };
                    }
                    // SAFETY: the groups lie in the rows or are ZERO; `dh` is 32 bytes.
                    let (wb, dv) = unsafe {
                        (
                            [q8_0_block(pb[0]), q8_0_block(pb[1])],
                            [
                                _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr().cast())),
                                _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr().add(8).cast())),
                            ],
                        )
                    };
                    let abs: [Decoded; 2] = std::array::from_fn(|e| wb[e].map(|v| _mm256_abs_epi8(v)));
                    for r in 0..rows {
                        // SAFETY: as in `q4k`, the row's `x + 128` values.
                        unsafe {
                            let x = xs.add(r * 2 * Q4K_VALUES + i * Q4K_VALUES);
                            let dx = _mm256_set1_ps(*panel.xv.as_ptr().add((s * rows + r) * 4 + 2 * i));
                            for (h, &dv) in dv.iter().enumerate() {
                                let mut u = [_mm256_setzero_si256(); 2];
                                for c in 0..4 {
                                    let v = 2 * c + h;
                                    let xc = _mm256_xor_si256(_mm256_loadu_si256(x.add(64 * c + 32 * h).cast()), flip);
                                    for (e, u) in u.iter_mut().enumerate() {
                                        let prod = _mm256_maddubs_epi16(abs[e][v], _mm256_sign_epi8(xc, wb[e][v]));
                                        *u = _mm256_add_epi32(*u, _mm256_madd_epi16(prod, ones));
                                    }
                                }
                                // [j₀ j₁ k₀ k₁] per 128-bit lane, reordered to [j₀ k₀ j₁ k₁].
                                let c = _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(u[0], u[1]));
                                let f = _mm256_mul_ps(_mm256_cvtepi32_ps(c), dv);
                                accumulate(acc.add(16 * r + 8 * h), f, dx);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The outputs from the accumulators in `scratch` (as the kernels
    /// left them): each pair's even and odd lanes reduced in `tree16`'s
    /// order (lanes `i` and `i + 8`, then `i + 4`, then `i + 2`), into
    /// `out[jj·rows + r]`.
    ///
    /// # Safety
    /// `scratch` is readable for `panel.scratch(jn)` values, `out`
    /// writable for `jn·rows`.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn finish(jn: usize, panel: &Panel<'_>, scratch: *const f32, out: *mut f32) {
        let rows = panel.rows.len();
        for p in 0..jn.div_ceil(2) {
            let acc = scratch.wrapping_add(16 * p * rows);
            let both = 2 * p + 1 < jn;
            let (oj, ok) = (out.wrapping_add(2 * p * rows), out.wrapping_add((2 * p + 1) * rows));
            for r in 0..rows {
                // SAFETY: row `r`'s 16 lanes, outputs `r` of the pair (contract).
                unsafe {
                    let s = _mm256_add_ps(_mm256_loadu_ps(acc.add(16 * r)), _mm256_loadu_ps(acc.add(16 * r + 8)));
                    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    oj.add(r).write(_mm_cvtss_f32(s));
                    if both {
                        ok.add(r).write(_mm_cvtss_f32(_mm_movehdup_ps(s)));
                    }
                }
            }
        }
    }
}

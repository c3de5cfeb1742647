//! What both vector kernels of the quantized products ([`super::vnni`],
//! [`super::avx2`]) share: the zero blocks past a row's end, the pairs of
//! weight rows, the unpacking of `Q4_K`/`Q5_K` scales and the prefetching
//! of later weight bytes (x86-64 only).

use std::arch::x86_64::*;

use super::Q8_0_BYTES;

/// Zeros standing in for the blocks past the end of a row in the last
/// step (as long as the largest step block, eight `Q8_0` blocks).
pub(super) static ZERO: [u8; 8 * Q8_0_BYTES] = [0; 8 * Q8_0_BYTES];

/// Block `b` of the row at `row` (`size` bytes a block), or [`ZERO`] past
/// `blocks`. Only computes an address.
#[inline(always)]
pub(super) fn block(row: *const u8, b: usize, blocks: usize, size: usize) -> *const u8 {
    if b < blocks { row.wrapping_add(b * size) } else { ZERO.as_ptr() }
}

/// Asks for the `len` bytes at `p` to be brought into L2 (`far`) or L1:
/// weight bytes of a later step of the same row, or of the next call's
/// rows, which may lie past the caller's slice (a prefetch never faults
/// and reads nothing into the program).
#[inline(always)]
fn prefetch(p: *const u8, len: usize, far: bool) {
    for line in (0..len).step_by(64) {
        let at = p.wrapping_add(line).cast();
        // SAFETY: a prefetch only hints the cache; any address is allowed.
        unsafe { if far { _mm_prefetch::<_MM_HINT_T2>(at) } else { _mm_prefetch::<_MM_HINT_T0>(at) } }
    }
}

/// Activation rows times steps between a prefetch and its use.
const PREFETCH_WORK: usize = 16;

/// Prefetches the weight bytes of row `jj` for a later step: into L2 for
/// the step `PREFETCH_WORK / rows` (at least 1) after `s`, enough work in
/// between to hide a DRAM access, and into L1 for step `s + 1`; past the
/// row's last step, those of row `jj` of the next call (`jn` rows on).
#[inline(always)]
pub(super) fn prefetch_next(
    w: *const u8,
    (jj, jn): (usize, usize),
    (s, steps, rows): (usize, usize, usize),
    row_bytes: usize,
    step_bytes: usize,
) {
    let at = |t: usize| {
        if t < steps { jj * row_bytes + t * step_bytes } else { (jn + jj) * row_bytes + (t - steps) * step_bytes }
    };
    prefetch(w.wrapping_add(at(s + (PREFETCH_WORK / rows.max(1)).max(1))), step_bytes, true);
    prefetch(w.wrapping_add(at(s + 1)), step_bytes, false);
}

/// The first row of a pair at `w`, the second `row_bytes` on or [`ZERO`]
/// blocks where `jn` is odd (`blocks` 0). Only computes addresses.
#[inline(always)]
pub(super) fn second(
    w: *const u8,
    p: usize,
    jn: usize,
    blocks: usize,
    row_bytes: usize,
) -> (*const u8, *const u8, usize) {
    let first = w.wrapping_add(2 * p * row_bytes);
    if 2 * p + 1 < jn { (first, first.wrapping_add(row_bytes), blocks) } else { (first, ZERO.as_ptr(), 0) }
}

/// The 8-byte scales and minimums of two `Q4_K`/`Q5_K` blocks (their 12
/// packed bytes at `pa + 4` and `pb + 4` in ggml's packing, see
/// `compute_core::quant::unpack_scales_k4`): `[scales a | scales b]`,
/// `[mins a | mins b]`. AVX2 (both kernels' CPUs have it).
///
/// # Safety
/// The CPU has AVX2; `pa` and `pb` are readable for 20 bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scales_pair(pa: *const u8, pb: *const u8) -> (__m128i, __m128i) {
    // SAFETY: bytes 4..20 of each block (contract).
    let (la, lb) = unsafe { (_mm_loadu_si128(pa.add(4).cast()), _mm_loadu_si128(pb.add(4).cast())) };
    // Words a, b, c of each block: x = [a₀ b₀ a₁ b₁], c = [c₀ c₀ c₁ c₁].
    let x = _mm_unpacklo_epi64(la, lb);
    let c = _mm_castps_si128(_mm_shuffle_ps::<0b10_10_10_10>(_mm_castsi128_ps(la), _mm_castsi128_ps(lb)));
    let lo = _mm_and_si128(x, _mm_set1_epi32(0x3f3f_3f3f));
    let top = _mm_slli_epi32::<4>(_mm_and_si128(_mm_srli_epi32::<6>(x), _mm_set1_epi32(0x0303_0303)));
    let hi =
        _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(c, _mm_setr_epi32(0, 4, 0, 4)), _mm_set1_epi32(0x0f0f_0f0f)), top);
    // [sc lo₀, sc hi₀, mn lo₀, mn hi₀], then the same of block b.
    let (u0, u1) = (_mm_unpacklo_epi32(lo, hi), _mm_unpackhi_epi32(lo, hi));
    (_mm_unpacklo_epi64(u0, u1), _mm_unpackhi_epi64(u0, u1))
}

/// [`scales_pair`] of two blocks held in arrays, for the tests; `None`
/// where the CPU lacks AVX2.
#[cfg(test)]
pub(super) fn scales_pair_of(a: &[u8; 20], b: &[u8; 20]) -> Option<([u8; 16], [u8; 16])> {
    if !std::arch::is_x86_feature_detected!("avx2") {
        return None;
    }
    let (mut sc, mut mn) = ([0u8; 16], [0u8; 16]);
    // SAFETY: the CPU has AVX2; both blocks hold 20 readable bytes and both
    // outputs 16 writable ones.
    unsafe {
        let (s, m) = scales_pair(a.as_ptr(), b.as_ptr());
        _mm_storeu_si128(sc.as_mut_ptr().cast(), s);
        _mm_storeu_si128(mn.as_mut_ptr().cast(), m);
    }
    Some((sc, mn))
}

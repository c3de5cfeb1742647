//! What both vector kernels of the quantized products ([`super::vnni`],
//! [`super::avx2`]) share: the zero blocks past a row's end and the
//! prefetching of later weight bytes (x86-64 only).

use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T2, _mm_prefetch};

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

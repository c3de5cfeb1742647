//! conv2d (NCHW, cross-correlation) as SGEMMs over blocks of output pixels:
//! `out[n][:, block] (c_out × b) = W (c_out × c_in·kh·kw) · col (c_in·kh·kw × b)`.
//!
//! `col` is the im2col unfolding of a block of `b` output pixels of image `n`
//! (zeros where the kernel overhangs the padding). An image whose whole
//! unfolding has at most [`CONV_WHOLE_MAX`] values is one block, multiplied by
//! an SGEMM on every thread. Larger ones are cut into blocks of about
//! [`CONV_BLOCK`] values, each unfolded into cache and read back from it by its
//! SGEMM, into buffers each thread keeps between calls, the blocks spread over
//! the threads. (Unfolding a whole 256² image of 16 channels at once wrote and
//! re-read a fresh 38 MB buffer per call: 18–20 ms on two threads of the
//! 2-core VM, against 2.8–3.0 ms in blocks.)
//! A 1×1 kernel with stride 1 and no padding needs no unfolding: the image
//! itself is `col`.

use std::cell::RefCell;

use compute_core::{Conv2dSpec, MatmulSpec};

use super::{fork, par};
use crate::gemm::{self, epilogue::EpilogueArgs};
use crate::isa::Isa;
use crate::tuning::{CONV_BLOCK, CONV_WHOLE_MAX, PAR_ELEMENTWISE_MIN};

thread_local! {
    /// This thread's `col` block and the SGEMM result of one block, reused across calls.
    static BUFFERS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out = conv2d(x, w)` for the shapes in `spec` (validated by the backend;
/// inconsistent slices leave the output unwritten rather than panic). Costs
/// `2·n·c_out·c_in·kh·kw·oh·ow` FLOPs of SGEMM plus, unless the kernel is a
/// plain 1×1, unfolding each block of output pixels (`c_in·kh·kw` values per
/// pixel, written and read in cache). Blocks run in parallel; each thread
/// keeps one block's buffers (about [`CONV_BLOCK`] + `c_out·b` values).
pub fn conv2d(isa: Isa, spec: &Conv2dSpec, x: &[f32], w: &[f32], out: &mut [f32]) {
    let Some((oh, ow)) = spec.output_hw() else { return };
    let c = spec;
    let (Some(k), Some(ohw), Some(chw)) = (
        c.c_in.checked_mul(c.kh).and_then(|v| v.checked_mul(c.kw)),
        oh.checked_mul(ow),
        c.c_in.checked_mul(c.h).and_then(|v| v.checked_mul(c.w)),
    ) else {
        return;
    };
    let Some(per_image) = c.c_out.checked_mul(ohw) else { return };
    let fits = |len: usize, per: usize| c.n.checked_mul(per).is_some_and(|t| t <= len);
    if k == 0 || ohw == 0 || chw == 0 || !fits(x.len(), chw) || !fits(out.len(), per_image) {
        return;
    }
    if c.c_out.checked_mul(k).is_none_or(|wl| wl > w.len()) {
        return;
    }
    let direct = c.kh == 1 && c.kw == 1 && c.stride == (1, 1) && c.padding == (0, 0);
    let whole = k.saturating_mul(ohw);
    // Output pixels per block: about CONV_BLOCK values of `col`, a multiple of 16.
    let cols = (CONV_BLOCK / k).next_multiple_of(16).clamp(16, ohw.next_multiple_of(16));
    let blocks = ohw.div_ceil(cols);
    let mut col = if direct || whole > CONV_WHOLE_MAX { Vec::new() } else { vec![0.0f32; whole] };
    for (img, o) in x.chunks_exact(chw).zip(out.chunks_exact_mut(per_image)).take(c.n) {
        if direct {
            gemm::sgemm(isa, &MatmulSpec::new(c.c_out, k, ohw), w, img, &EpilogueArgs::none(), o);
        } else if whole <= CONV_WHOLE_MAX {
            // Small enough to stay in cache whole: one unfolding (in parallel
            // across input channels when large) and one SGEMM on every thread.
            im2col(c, oh, ow, img, &mut col);
            gemm::sgemm(isa, &MatmulSpec::new(c.c_out, k, ohw), w, &col, &EpilogueArgs::none(), o);
        } else {
            // Per block: its pixel range and its part of every output channel's row.
            let mut parts: Vec<Block<'_>> =
                (0..blocks).map(|b| ((b * cols, ((b + 1) * cols).min(ohw)), Vec::with_capacity(c.c_out))).collect();
            for row in o.chunks_exact_mut(ohw) {
                let mut rest = row;
                for (_, rows) in &mut parts {
                    let (head, tail) = rest.split_at_mut(cols.min(rest.len()));
                    rows.push(head);
                    rest = tail;
                }
            }
            fork::each(parts, |(range, rows)| par::sequential(|| block(isa, c, ow, k, img, w, range, rows)));
        }
    }
}

/// One block of output pixels: its range, and its part of every output channel's row.
type Block<'a> = ((usize, usize), Vec<&'a mut [f32]>);

/// Unfolds one whole image (`c_in × h × w`) into `col` (`c_in·kh·kw × oh·ow`),
/// laid out as in [`unfold`]; in parallel across input channels when large.
fn im2col(c: &Conv2dSpec, oh: usize, ow: usize, img: &[f32], col: &mut [f32]) {
    let per_channel = c.kh * c.kw * oh * ow;
    let one = Conv2dSpec { c_in: 1, ..*c };
    let plane = c.h * c.w;
    let channel = |ci: usize, dst: &mut [f32]| {
        let src = img.get(ci * plane..(ci + 1) * plane).unwrap_or_default();
        unfold(&one, ow, src, (0, oh * ow), dst);
    };
    if par::worth_splitting(col.len(), PAR_ELEMENTWISE_MIN) {
        fork::chunks_mut(col, per_channel, channel);
    } else {
        col.chunks_mut(per_channel).enumerate().for_each(|(ci, dst)| channel(ci, dst));
    }
}

/// Output pixels `p0..p1` of one image: unfolds them into this thread's `col`
/// buffer, multiplies, and writes each output channel's part into `rows`.
#[allow(clippy::too_many_arguments)]
fn block(
    isa: Isa,
    c: &Conv2dSpec,
    ow: usize,
    k: usize,
    img: &[f32],
    w: &[f32],
    (p0, p1): (usize, usize),
    mut rows: Vec<&mut [f32]>,
) {
    let width = p1 - p0;
    BUFFERS.with(|b| {
        let Ok(mut b) = b.try_borrow_mut() else { return };
        let (col, res) = &mut *b;
        col.resize(k * width, 0.0);
        res.resize(c.c_out * width, 0.0);
        unfold(c, ow, img, (p0, p1), col);
        gemm::sgemm(isa, &MatmulSpec::new(c.c_out, k, width), w, col, &EpilogueArgs::none(), res);
        for (dst, src) in rows.iter_mut().zip(res.chunks_exact(width)) {
            dst.copy_from_slice(src);
        }
    });
}

/// Columns `p0..p1` (output pixels, row-major over `oh × ow`) of the unfolding
/// of one image (`c_in × h × w`) into `col` (`c_in·kh·kw × (p1 − p0)`): row
/// `(ci·kh + ky)·kw + kx`, column `oy·ow + ox − p0` holds
/// `x[ci, oy·sh + ky − ph, ox·sw + kx − pw]`, or 0 in the padding.
fn unfold(c: &Conv2dSpec, ow: usize, img: &[f32], (p0, p1): (usize, usize), col: &mut [f32]) {
    let plane = c.h * c.w;
    let first = (p0 / ow.max(1), p0 % ow.max(1));
    let mut rows = col.chunks_exact_mut(p1 - p0);
    for ci in 0..c.c_in {
        let src = img.get(ci * plane..(ci + 1) * plane).unwrap_or_default();
        for ky in 0..c.kh {
            for kx in 0..c.kw {
                let Some(row) = rows.next() else { return };
                // One segment per output row the block touches (no division per segment).
                let (mut oy, mut ox0) = first;
                let mut rest = &mut *row;
                while !rest.is_empty() {
                    let (seg, tail) = rest.split_at_mut((ow - ox0).min(rest.len()));
                    fill_segment(c, src, oy, (ky, kx), ox0, seg);
                    (oy, ox0, rest) = (oy + 1, 0, tail);
                }
            }
        }
    }
}

/// The values of kernel tap `(ky, kx)` for output pixels `(oy, ox0..ox0 + seg.len())`
/// of one input channel `src` (`h × w`), into `seg`.
fn fill_segment(c: &Conv2dSpec, src: &[f32], oy: usize, (ky, kx): (usize, usize), ox0: usize, seg: &mut [f32]) {
    let ((sh, sw), (ph, pw)) = (c.stride, c.padding);
    let line = (oy * sh + ky).checked_sub(ph).filter(|&iy| iy < c.h).and_then(|iy| src.get(iy * c.w..(iy + 1) * c.w));
    let Some(line) = line else {
        seg.fill(0.0);
        return;
    };
    let ox1 = ox0 + seg.len();
    if sw == 1 {
        // ix = ox + kx − pw: valid for ox in [lo, hi).
        let lo = pw.saturating_sub(kx).clamp(ox0, ox1);
        let hi = (c.w + pw).saturating_sub(kx).clamp(lo, ox1);
        let (head, rest) = seg.split_at_mut(lo - ox0);
        let (mid, tail) = rest.split_at_mut(hi - lo);
        head.fill(0.0);
        tail.fill(0.0);
        match line.get((lo + kx).saturating_sub(pw)..(hi + kx).saturating_sub(pw)) {
            Some(s) => mid.copy_from_slice(s),
            None => mid.fill(0.0),
        }
    } else {
        for (ox, d) in (ox0..ox1).zip(seg.iter_mut()) {
            *d = (ox * sw + kx).checked_sub(pw).and_then(|ix| line.get(ix)).copied().unwrap_or(0.0);
        }
    }
}

#[cfg(test)]
mod tests;

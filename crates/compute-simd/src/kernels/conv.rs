//! conv2d (NCHW, cross-correlation) as one SGEMM per image:
//! `out[n] (c_out × oh·ow) = W (c_out × c_in·kh·kw) · col (c_in·kh·kw × oh·ow)`.
//!
//! `col` is the im2col unfolding of image `n` (zeros where the kernel overhangs
//! the padding), built into one buffer reused across the batch. A 1×1 kernel
//! with stride 1 and no padding needs no unfolding: the image itself is `col`.

use compute_core::{Conv2dSpec, MatmulSpec};

use super::par;
use crate::gemm;
use crate::isa::Isa;
use crate::tuning::PAR_ELEMENTWISE_MIN;

/// `out = conv2d(x, w)` for the shapes in `spec` (validated by the backend;
/// inconsistent slices leave the output unwritten rather than panic). Costs
/// one SGEMM of `c_out × c_in·kh·kw × oh·ow` per image plus, unless the
/// kernel is a plain 1×1, writing the `c_in·kh·kw × oh·ow` unfolding (in
/// parallel across input channels when large).
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
    let mm = MatmulSpec::new(c.c_out, k, ohw);
    let direct = c.kh == 1 && c.kw == 1 && c.stride == (1, 1) && c.padding == (0, 0);
    let mut col = if direct { Vec::new() } else { vec![0.0f32; k * ohw] };
    for (img, o) in x.chunks_exact(chw).zip(out.chunks_exact_mut(per_image)).take(c.n) {
        if direct {
            gemm::sgemm(isa, &mm, w, img, o);
        } else {
            im2col(c, oh, ow, img, &mut col);
            gemm::sgemm(isa, &mm, w, &col, o);
        }
    }
}

/// Unfolds one image (`c_in × h × w`) into `col` (`c_in·kh·kw × oh·ow`): row
/// `(ci·kh + ky)·kw + kx`, column `oy·ow + ox` holds
/// `x[ci, oy·sh + ky − ph, ox·sw + kx − pw]`, or 0 in the padding.
fn im2col(c: &Conv2dSpec, oh: usize, ow: usize, img: &[f32], col: &mut [f32]) {
    let plane = c.h * c.w;
    let per_channel = c.kh * c.kw * oh * ow;
    let channel = |ci: usize, dst: &mut [f32]| {
        if let Some(src) = img.get(ci * plane..(ci + 1) * plane) {
            unfold_channel(c, oh, ow, src, dst);
        }
    };
    if par::worth_splitting(col.len(), PAR_ELEMENTWISE_MIN) {
        super::fork::chunks_mut(col, per_channel, channel);
    } else {
        col.chunks_mut(per_channel).enumerate().for_each(|(ci, dst)| channel(ci, dst));
    }
}

/// The `kh·kw` rows of `col` that come from one input channel `src` (`h × w`).
fn unfold_channel(c: &Conv2dSpec, oh: usize, ow: usize, src: &[f32], dst: &mut [f32]) {
    let ((sh, sw), (ph, pw)) = (c.stride, c.padding);
    let mut rows = dst.chunks_exact_mut(oh * ow);
    for ky in 0..c.kh {
        for kx in 0..c.kw {
            let Some(row) = rows.next() else { return };
            for (oy, seg) in row.chunks_exact_mut(ow).enumerate() {
                let line = (oy * sh + ky)
                    .checked_sub(ph)
                    .filter(|&iy| iy < c.h)
                    .and_then(|iy| src.get(iy * c.w..(iy + 1) * c.w));
                let Some(line) = line else {
                    seg.fill(0.0);
                    continue;
                };
                if sw == 1 {
                    // ix = ox + kx − pw: valid for ox in [lo, hi).
                    let lo = pw.saturating_sub(kx).min(ow);
                    let hi = (c.w + pw).saturating_sub(kx).clamp(lo, ow);
                    let (head, rest) = seg.split_at_mut(lo);
                    let (mid, tail) = rest.split_at_mut(hi - lo);
                    head.fill(0.0);
                    tail.fill(0.0);
                    match line.get((lo + kx).saturating_sub(pw)..(hi + kx).saturating_sub(pw)) {
                        Some(s) => mid.copy_from_slice(s),
                        None => mid.fill(0.0),
                    }
                } else {
                    for (ox, d) in seg.iter_mut().enumerate() {
                        *d = (ox * sw + kx).checked_sub(pw).and_then(|ix| line.get(ix)).copied().unwrap_or(0.0);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! The per-group scale searches of ggml's k-quant reference quantizers.
//!
//! Both are written to perform ggml's float operations in ggml's order (sums
//! accumulated left to right, products associated as ggml writes them, no fused
//! multiply-add): that order is part of the format's definition, since any
//! change moves some ties and with them the chosen scale.

use half::f16;

use super::{nearest_int, pack_scales_k4, unpack_scales_k4};

/// The affine search of `Q4_K`/`Q5_K` (ggml's `make_qkx2_quants` with squared
/// error): finds `scale ≥ 0` and `offset ≥ 0` so that `x ≈ scale·l − offset`
/// for levels `l` in `0..=nmax`, minimising the `w`-weighted squared error.
///
/// Starts from the levels of the full range `[min(x, 0), max(x)]`, then tries
/// `nstep + 1` level spacings `(nmax + rmin + rdelta·k) / range`; for each it
/// rounds every value to a level, solves the weighted least-squares line
/// through the levels (with the offset clamped to `offset ≥ 0`), and keeps it
/// if its error is smaller. Writes the levels of the best candidate to
/// `levels` and returns `(scale, offset)`. A group whose range is empty gets
/// levels 0 and scale 0. O(32·nstep).
pub(super) fn affine_levels(
    x: &[f32; 32],
    w: &[f32; 32],
    nmax: u8,
    rmin: f32,
    rdelta: f32,
    nstep: u8,
    levels: &mut [u8; 32],
) -> (f32, f32) {
    let nmax_f = f32::from(nmax);
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for (&xi, &wi) in x.iter().zip(w).skip(1) {
        if xi < min {
            min = xi;
        }
        if xi > max {
            max = xi;
        }
        sum_w += wi;
        sum_x += wi * xi;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        *levels = [0; 32];
        return (0.0, -min);
    }

    let level = |iscale: f32, xi: f32, min: f32| nearest_int(iscale * (xi - min)).clamp(0, i32::from(nmax)) as u8;

    let iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((l, &xi), &wi) in levels.iter_mut().zip(x).zip(w) {
        *l = level(iscale, xi, min);
        let diff = scale * f32::from(*l) + min - xi;
        best_error += wi * (diff * diff);
    }

    let mut trial = [0u8; 32];
    for step in 0..=nstep {
        let iscale = (rmin + rdelta * f32::from(step) + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((t, &xi), &wi) in trial.iter_mut().zip(x).zip(w) {
            *t = level(iscale, xi, min);
            let l = f32::from(*t);
            sum_l += wi * l;
            sum_l2 += wi * l * l;
            sum_xl += wi * l * xi;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0.0f32;
            for ((&t, &xi), &wi) in trial.iter().zip(x).zip(w) {
                let diff = this_scale * f32::from(t) + this_min - xi;
                error += wi * (diff * diff);
            }
            if error < best_error {
                *levels = trial;
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The symmetric search of `Q6_K` (ggml's `make_qx_quants` with
/// `rmse_type = 1` and no importance weights): finds a signed `scale` so that
/// `x ≈ scale·(l − nmax)` for levels `l` in `0..2·nmax`, minimising the
/// `x²`-weighted squared error.
///
/// Starts from the spacing that sends the largest-magnitude value to `−nmax`,
/// takes the least-squares scale for its levels, then tries 18 spacings
/// `−(nmax + k/10) / max` (`k` in ±1..=±9) and keeps one when it explains more
/// of `x` (`(Σw·x·l)² / Σw·l²` larger). Writes the levels of the best candidate
/// (offset by `nmax`, so `0..2·nmax`) and returns the scale. An all-zero group
/// (max |x| below 1e-15) gets levels 0 and scale 0. O(16·19).
pub(super) fn symmetric_levels(x: &[f32; 16], nmax: i8, levels: &mut [u8; 16]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &xi in x {
        let ax = xi.abs();
        if ax > amax {
            amax = ax;
            max = xi;
        }
    }
    if amax < 1e-15 {
        *levels = [0; 16];
        return 0.0;
    }
    let n = i32::from(nmax);
    let nmax_f = f32::from(nmax);
    let signed_level = |iscale: f32, xi: f32| nearest_int(iscale * xi).clamp(-n, n - 1);
    // The sums ggml minimises with weights w = x².
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &xi in x {
            let l = signed_level(iscale, xi) as f32;
            let w = xi * xi;
            sumlx += w * xi * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let write_levels = |iscale: f32, levels: &mut [u8; 16]| {
        for (l, &xi) in levels.iter_mut().zip(x) {
            *l = (signed_level(iscale, xi) + n) as u8;
        }
    };

    let iscale = -nmax_f / max;
    write_levels(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for k in (-9i8..=9).filter(|&k| k != 0) {
        let iscale = -(nmax_f + 0.1 * f32::from(k)) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            write_levels(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The super-block step shared by `Q4_K` (`nmax` 15) and `Q5_K` (`nmax` 31),
/// as in ggml's `quantize_row_q4_K_ref`/`quantize_row_q5_K_ref`: per group of
/// 32, [`affine_levels`] with weights `rms(group) + |x|`; the eight scales and
/// eight offsets quantized to 6 bits against their maxima; `d` = max scale/63
/// and `dmin` = max offset/63 rounded to f16; then every value quantized again
/// against the rounded `d·sc` and `dmin·m` (a group whose `d·sc` is 0 keeps
/// its levels from the search). Returns the levels, `d`, `dmin` and the packed
/// scales. O(256·nstep).
pub(super) fn affine_k_block(
    x: &[f32; 256],
    nmax: u8,
    rmin: f32,
    rdelta: f32,
    nstep: u8,
) -> ([u8; 256], f16, f16, [u8; 12]) {
    let mut levels = [0u8; 256];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    let groups = x.as_chunks::<32>().0.iter().zip(levels.as_chunks_mut::<32>().0);
    for ((xg, lg), (scale, min)) in groups.zip(scales.iter_mut().zip(&mut mins)) {
        let mut sum_x2 = 0.0f32;
        for &v in xg {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xg[l].abs());
        (*scale, *min) = affine_levels(xg, &weights, nmax, rmin, rdelta, nstep, lg);
        if *scale > max_scale {
            max_scale = *scale;
        }
        if *min > max_min {
            max_min = *min;
        }
    }

    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores nearest_int's result in a u8 (wrapping), then caps it at 63.
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let packed = pack_scales_k4(&ls, &lm);
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);

    let (sc, m) = unpack_scales_k4(&packed);
    let groups = x.as_chunks::<32>().0.iter().zip(levels.as_chunks_mut::<32>().0);
    for ((xg, lg), (&sc, &m)) in groups.zip(sc.iter().zip(&m)) {
        let dj = d.to_f32() * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for (l, &v) in lg.iter_mut().zip(xg) {
            *l = nearest_int((v + dm) / dj).clamp(0, i32::from(nmax)) as u8;
        }
    }
    (levels, d, dmin, packed)
}

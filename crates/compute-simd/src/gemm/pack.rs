//! Packing: copies a block of `op(A)` or `op(B)` into the panel layout the
//! micro-kernels read (depth-major panels, zero-padded to whole tiles), so the
//! kernels never see a transpose or a ragged edge. Safe code only; each
//! routine is compiled for the panel width of every ISA (`const` widths turn
//! the per-step copies into a few vector moves).

use super::kernel::{self, Tile};
use crate::isa::Isa;

/// The operands of one product, row-major: `A` is `m×k` (`k×m` when
/// `trans_a`), `B` is `k×n` (`n×k` when `trans_b`).
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a> {
    /// Values of `A`.
    pub a: &'a [f32],
    /// Values of `B`.
    pub b: &'a [f32],
    /// Rows of `op(A)` and `C`.
    pub m: usize,
    /// Inner dimension.
    pub k: usize,
    /// Columns of `op(B)` and `C`.
    pub n: usize,
    /// `A` is stored `k×m`.
    pub trans_a: bool,
    /// `B` is stored `n×k`.
    pub trans_b: bool,
}

/// Depth steps transposed at a time: 16 steps of a 64-wide panel are 4 KiB, in L1.
const CHUNK: usize = 16;

/// Packs rows `i0..i0+mc` and depths `p0..p0+kc` of `op(A)` into `⌈mc/mr⌉`
/// panels of `kc` steps of `mr` values (rows past `mc` are zero). Costs one
/// read and one write per packed value.
pub(crate) fn pack_a(
    isa: Isa,
    op: &Operands<'_>,
    t: Tile,
    rows: (usize, usize),
    depth: (usize, usize),
    dst: &mut [f32],
) {
    match t.mr {
        4 => pack_a_w::<4>(isa, op, rows, depth, dst),
        6 => pack_a_w::<6>(isa, op, rows, depth, dst),
        8 => pack_a_w::<8>(isa, op, rows, depth, dst),
        _ => {}
    }
}

/// Packs depths `p0..p0+kc` and columns `j0..j0+nc` of `op(B)` into
/// `⌈nc/nr⌉` panels of `kc` steps of `nr` values (columns past `nc` are
/// zero). Costs one read and one write per packed value.
pub(crate) fn pack_b(
    isa: Isa,
    op: &Operands<'_>,
    t: Tile,
    depth: (usize, usize),
    cols: (usize, usize),
    dst: &mut [f32],
) {
    match t.nr {
        8 => pack_b_w::<8>(isa, op, depth, cols, dst),
        16 => pack_b_w::<16>(isa, op, depth, cols, dst),
        32 => pack_b_w::<32>(isa, op, depth, cols, dst),
        64 => pack_b_w::<64>(isa, op, depth, cols, dst),
        _ => {}
    }
}

/// [`pack_a`] for panels `W` rows high.
fn pack_a_w<const W: usize>(
    isa: Isa,
    op: &Operands<'_>,
    (i0, mc): (usize, usize),
    (p0, kc): (usize, usize),
    dst: &mut [f32],
) {
    if kc == 0 {
        return;
    }
    let panels = dst.chunks_exact_mut(W * kc).take(mc.div_ceil(W));
    for (pi, panel) in panels.enumerate() {
        let r0 = i0 + pi * W;
        let rows = (i0 + mc - r0).min(W);
        if op.trans_a {
            // A(i, p) = a[p·m + i]: each depth step is a contiguous run of rows.
            let src = op.a.get(p0 * op.m + r0..).unwrap_or_default();
            copy_steps::<W>(src, op.m, rows, panel);
        } else {
            // A(i, p) = a[i·k + p]: each row is a contiguous run of depths.
            let src = op.a.get(r0 * op.k + p0..).unwrap_or_default();
            transpose_into::<W>(isa, src, op.k, rows, kc, panel);
        }
    }
}

/// [`pack_b`] for panels `W` columns wide.
fn pack_b_w<const W: usize>(
    isa: Isa,
    op: &Operands<'_>,
    (p0, kc): (usize, usize),
    (j0, nc): (usize, usize),
    dst: &mut [f32],
) {
    if kc == 0 {
        return;
    }
    let panels = dst.chunks_exact_mut(W * kc).take(nc.div_ceil(W));
    for (pi, panel) in panels.enumerate() {
        let c0 = j0 + pi * W;
        let cols = (j0 + nc - c0).min(W);
        if op.trans_b {
            // B(p, j) = b[j·k + p]: each column is a contiguous run of depths.
            let src = op.b.get(c0 * op.k + p0..).unwrap_or_default();
            transpose_into::<W>(isa, src, op.k, cols, kc, panel);
        } else {
            // B(p, j) = b[p·n + j]: each depth step is a contiguous run of columns.
            let src = op.b.get(p0 * op.n + c0..).unwrap_or_default();
            copy_steps::<W>(src, op.n, cols, panel);
        }
    }
}

/// Fills each `W`-wide step `p` of `panel` with `src[p·ld..][..used]`, zero past `used`.
#[inline(always)]
fn copy_steps<const W: usize>(src: &[f32], ld: usize, used: usize, panel: &mut [f32]) {
    for (p, step) in panel.chunks_exact_mut(W).enumerate() {
        let s = p * ld;
        if used == W
            && let Some(run) = src.get(s..s + W)
            && let (Ok(d), Ok(r)) = (<&mut [f32; W]>::try_from(&mut *step), <&[f32; W]>::try_from(run))
        {
            *d = *r;
            continue;
        }
        let run = src.get(s..s + used).unwrap_or_default();
        let (head, tail) = step.split_at_mut(run.len().min(W));
        head.copy_from_slice(run.get(..head.len()).unwrap_or_default());
        tail.fill(0.0);
    }
}

/// Transposes `used` runs of `kc` values (`src[l·ld..][..kc]` for `l < used`)
/// into lane `l` of the `kc` steps of a `W`-wide panel; lanes past `used` are
/// zero. Works [`CHUNK`] steps at a time so the stores stay in L1, with SIMD
/// transposes of whole square blocks where the ISA has them.
#[inline(always)]
pub(super) fn transpose_into<const W: usize>(
    isa: Isa,
    src: &[f32],
    ld: usize,
    used: usize,
    kc: usize,
    panel: &mut [f32],
) {
    let s = kernel::transpose_size(isa);
    for (ci, chunk) in panel.chunks_mut(W * CHUNK).enumerate() {
        let p = ci * CHUNK;
        let steps = (kc - p).min(CHUNK);
        let mut l = 0;
        if s > 0 && steps.is_multiple_of(s) {
            // Whole s×s blocks: lanes l..l+s of steps q..q+s.
            while l + s <= used {
                for q in (0..steps).step_by(s) {
                    let from = src.get(l * ld + p + q..).unwrap_or_default();
                    let to = chunk.get_mut(q * W + l..).unwrap_or_default();
                    if !kernel::transpose(isa, from, ld, to, W) {
                        scalar_lanes::<W>(src, ld, (l, l + s), (p + q, s), chunk.get_mut(q * W..).unwrap_or_default());
                    }
                }
                l += s;
            }
        }
        scalar_lanes::<W>(src, ld, (l, used), (p, steps), chunk);
        if used < W {
            for step in chunk.chunks_exact_mut(W) {
                if let Some(t) = step.get_mut(used..) {
                    t.fill(0.0);
                }
            }
        }
    }
}

/// Lanes `l0..l1` of `steps` steps of a `W`-wide panel chunk from runs
/// `src[l·ld + p..][..steps]`, one value at a time.
#[inline(always)]
fn scalar_lanes<const W: usize>(
    src: &[f32],
    ld: usize,
    (l0, l1): (usize, usize),
    (p, steps): (usize, usize),
    chunk: &mut [f32],
) {
    for l in l0..l1 {
        let s = l * ld + p;
        let Some(run) = src.get(s..s + steps) else { continue };
        for (step, &v) in chunk.chunks_exact_mut(W).zip(run) {
            if let Some(x) = step.get_mut(l) {
                *x = v;
            }
        }
    }
}

//! Packing of `op(A)` and `op(B)` blocks into the layouts the micro-kernels
//! read (transposes are absorbed here, so every transpose combination runs
//! the same kernel on the same packed layout). Partial panels are zero-padded.

/// Shape and storage of one product `C[m×n] = op(A)[m×k] · op(B)[k×n]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub trans_a: bool,
    pub trans_b: bool,
}

/// Packs rows `[i0, i0+mc)` × depth `[p0, p0+kc)` of `op(A)` into panels of
/// `mr` rows: panel `q`, element `(r, p)` at `dst[q·mr·kc + p·mr + r]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_a(dst: &mut [f32], a: &[f32], s: &Shape, i0: usize, mc: usize, p0: usize, kc: usize, mr: usize) {
    let panels = mc.div_ceil(mr);
    for (q, panel) in dst.chunks_exact_mut(mr * kc).take(panels).enumerate() {
        let i = i0 + q * mr;
        let rows = mr.min(i0 + mc - i);
        if s.trans_a {
            // op(A)(i, p) = a[p·m + i]: each depth step is a contiguous run of rows.
            for (p, d) in panel.chunks_exact_mut(mr).enumerate() {
                let start = (p0 + p) * s.m + i;
                if let Some(src) = a.get(start..start + rows) {
                    d[..rows].copy_from_slice(src);
                }
                d[rows..].fill(0.0);
            }
        } else {
            // op(A)(i, p) = a[i·k + p]: each row is contiguous along the depth.
            for r in 0..rows {
                let start = (i + r) * s.k + p0;
                let Some(src) = a.get(start..start + kc) else { continue };
                for (d, &v) in panel.chunks_exact_mut(mr).zip(src) {
                    d[r] = v;
                }
            }
            if rows < mr {
                for d in panel.chunks_exact_mut(mr) {
                    d[rows..].fill(0.0);
                }
            }
        }
    }
}

/// Packs depth `[p0, p0+kc)` × columns `[j0, j0+nc)` of `op(B)` into panels of
/// `nr` columns: panel `q`, element `(p, c)` at `dst[q·nr·kc + p·nr + c]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_b(dst: &mut [f32], b: &[f32], s: &Shape, p0: usize, kc: usize, j0: usize, nc: usize, nr: usize) {
    let panels = nc.div_ceil(nr);
    for (q, panel) in dst.chunks_exact_mut(nr * kc).take(panels).enumerate() {
        let j = j0 + q * nr;
        let cols = nr.min(j0 + nc - j);
        if s.trans_b {
            // op(B)(p, j) = b[j·k + p]: each column is contiguous along the depth.
            for c in 0..cols {
                let start = (j + c) * s.k + p0;
                let Some(src) = b.get(start..start + kc) else { continue };
                for (d, &v) in panel.chunks_exact_mut(nr).zip(src) {
                    d[c] = v;
                }
            }
            if cols < nr {
                for d in panel.chunks_exact_mut(nr) {
                    d[cols..].fill(0.0);
                }
            }
        } else {
            // op(B)(p, j) = b[p·n + j]: each depth step is a contiguous run of columns.
            for (p, d) in panel.chunks_exact_mut(nr).enumerate() {
                let start = (p0 + p) * s.n + j;
                if let Some(src) = b.get(start..start + cols) {
                    d[..cols].copy_from_slice(src);
                }
                d[cols..].fill(0.0);
            }
        }
    }
}

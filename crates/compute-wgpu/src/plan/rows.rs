//! Plans for the row ops (softmax, log_softmax, layer_norm, rms_norm): one
//! workgroup per row, in pieces of whole rows.
//!
//! - Rows whose length is a multiple of 4 and at most 8192 take the register
//!   kernels of `shaders/rows_register.wgsl` ([`rows_register`]): the row is
//!   read once into registers (vec4 loads) and written once, with subgroup
//!   reductions where the device has them.
//! - Other rows take `shaders/rows.wgsl`: one pass over the row per statistic,
//!   later passes re-reading it from cache.

use compute_core::{Result, RowOp};

use super::{Dispatch, Step, View, bind, grid, params, rows_per_piece, to_u32};
use crate::buffers::whole_words;
use crate::context::Context;
use crate::kernels::{Kernel, rows_register};

/// The kernel for row op `r` on rows of `cols` values of `x`'s dtype: the
/// register kernel where [`rows_register::vpt_for`] allows it (reduced by
/// subgroup operations with `subgroup`), else the multi-pass one.
fn kernel(r: RowOp, cols: usize, x: &View, subgroup: bool) -> Kernel {
    let dtype = x.dtype;
    if let Some(vpt) = rows_register::vpt_for(cols) {
        let op = match r {
            RowOp::Softmax => 0,
            RowOp::LogSoftmax => 1,
            RowOp::LayerNorm { .. } => 2,
            RowOp::RmsNorm { .. } => 3,
        };
        return Kernel::RowsRegister { op, vpt, subgroup, dtype };
    }
    match r {
        RowOp::Softmax => Kernel::Softmax(0, dtype),
        RowOp::LogSoftmax => Kernel::Softmax(1, dtype),
        RowOp::LayerNorm { .. } => Kernel::LayerNorm(dtype),
        RowOp::RmsNorm { .. } => Kernel::RmsNorm(dtype),
    }
}

/// Row op `r` of `rows × cols` from `x` (and its `gamma`, `beta` where it
/// has them) of any dtype into the `f32` view `y`, in pieces of whole rows;
/// `subgroup`: the register kernels reduce with subgroup operations (the
/// device must have `wgpu::Features::SUBGROUP`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_op(
    ctx: &Context,
    name: &'static str,
    r: RowOp,
    rows: usize,
    cols: usize,
    [x, gamma, beta]: [&View; 3],
    y: &View,
    subgroup: bool,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let kernel = kernel(r, cols, x, subgroup);
    let eps = match r {
        RowOp::LayerNorm { eps } | RowOp::RmsNorm { eps } => eps,
        RowOp::Softmax | RowOp::LogSoftmax => 0.0,
    };
    let row_in = (cols as u64).saturating_mul(x.size());
    let row_out = (cols as u64).saturating_mul(y.size());
    let per = rows_per_piece(ctx, name, row_in, row_out)?;
    let cols32 = to_u32(name, "columns", cols as u64)?;
    let rows = rows as u64;
    let mut start = 0;
    while start < rows {
        let n = per.min(rows - start);
        let mut bindings = vec![
            bind(1, &x.buffer, start * row_in, whole_words(n * row_in)),
            bind(2, &y.buffer, start * row_out, n * row_out),
        ];
        if let RowOp::LayerNorm { .. } | RowOp::RmsNorm { .. } = r {
            bindings.push(bind(3, &gamma.buffer, 0, whole_words(row_in)));
        }
        if let RowOp::LayerNorm { .. } = r {
            bindings.push(bind(4, &beta.buffer, 0, whole_words(row_in)));
        }
        steps.push(Step::Dispatch(Dispatch {
            kernel,
            params: params(&[to_u32(name, "rows", n)?, cols32, eps.to_bits()]),
            bindings,
            groups: grid(ctx, name, n)?,
        }));
        start += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! Plans for GGML block-quantized weights (`shaders/quant.wgsl`): the product
//! `y = x · Wᵀ` and dequantization.
//!
//! `W` is `n` rows of `k` values stored as blocks (`Q4_K`, `Q5_K`, `Q6_K`,
//! `Q8_0`; each row `k / values_per_block` consecutive blocks, no padding),
//! bound as raw words; `x` is `m × k` of `f32`, `f16` or `bf16`; `y` is
//! `m × n`, written as `f32` (a half `y` through an `f32` temporary and a
//! cast, as every plan that writes one value per invocation does).
//!
//! **Product, `m ≤ 16` or `W` too large to widen** (decoding, and anything
//! else where the weight bytes dominate): the `gemv` kernel, a workgroup of
//! 128 invocations per [`GEMV_SHAPES`] `nr` weight rows, `mr` rows of `x` per
//! pass (more rows: more passes, each reading the weights again). Every
//! invocation takes 32-value chunks of the `nr` rows (`q4_K`/`q5_K`: one
//! 16-byte load of quants with the block's 16-byte header), keeps them packed,
//! and dequantizes four values at a time where it multiplies them with `x`
//! (read once for the `nr` rows); the `mr · nr` sums are named variables of
//! the generated entry point (`kernels/quant_gemv.rs`), then reduced over the
//! workgroup by subgroup operations where the device has
//! `wgpu::Features::SUBGROUP`, else by a tree in workgroup memory. The weight
//! buffer is bound twice over the same range: as `u32` words (`q6_K`, `q8_0`)
//! and as `vec4<u32>` (`q4_K`, `q5_K`). Weight rows are split into pieces of
//! at most one storage binding (whole rows, offsets aligned); `x` and `y` are
//! bound whole.
//!
//! **Product, one row of `x`, `q4_K`** (decoding): the `gemv_dot` kernel
//! ([`DOT_ROWS`] weight rows per workgroup), which rounds `x` to 8-bit
//! integers once per workgroup and multiplies with packed integer dot
//! products, within the product's tolerance for rounded activations
//! (`kernels/quant_gemv.rs`, `source_dot`); `COMPUTE_WGPU_QGEMV_DOT=0`
//! keeps it on `gemv`. Its weight words are bound once, as `vec4<u32>`.
//!
//! **Product, `m > 16`** (prefill): `W` is dequantized once into an `f32`
//! temporary (`n × k`) and the `f32` GEMM runs on it (`Bᵀ` layout), when that
//! temporary fits one storage binding; otherwise the `gemv` passes.
//!
//! **Dequantize**: one invocation per slice (8 or 16 values), written four at
//! a time in the output dtype (whole words for halves), in pieces of whole
//! blocks; bit-exact with `BlockFormat::dequantize` (see `quant.wgsl`).

use compute_core::quant::BlockFormat;
use compute_core::{ComputeError, DType, MatmulSpec, QuantMatmulSpec, Result};

use super::{
    Dispatch, Step, View, bind, f32_output, gemm, grid, narrow, params, rows_per_piece, temp_f32, to_u32, widen,
};
use crate::buffers::{padded_bytes, padded_bytes_of, whole_words};
use crate::context::Context;
use crate::errors;
use crate::kernels::{Kernel, quant_code};

/// The `(mr, nr)` pairs of the `gemv` kernel: rows of `x` per pass and weight
/// rows per workgroup (`mr · nr ≤ 64` sums per invocation). A pass of `m`
/// rows takes the first pair with `mr ≥ m`; more than 16 rows go in passes of 16.
pub(crate) const GEMV_SHAPES: [(u32, u32); 5] = [(1, 4), (2, 4), (4, 4), (8, 4), (16, 4)];

/// Weight rows per workgroup of the `gemv_dot` kernel (`q4_K`, one row of
/// `x`), by the weight's rows: [`dot_rows`] takes the most that still make
/// [`DOT_MIN_GROUPS`] workgroups (4 when none does). More rows share each
/// rounding of `x` but leave fewer workgroups: on the H200 (Vulkan,
/// 2026-11-28) 14336 rows ran fastest with 32 (448 workgroups), 4096 rows
/// with 8 (512; 16 rows took 1.17× as long from device memory).
pub(crate) const DOT_ROWS: [u32; 4] = [32, 16, 8, 4];

/// Workgroups [`dot_rows`] aims for at least.
const DOT_MIN_GROUPS: u64 = 448;

/// [`DOT_ROWS`]' choice for `n` weight rows.
fn dot_rows(n: u64) -> u32 {
    DOT_ROWS.into_iter().find(|&nr| n.div_ceil(u64::from(nr)) >= DOT_MIN_GROUPS).unwrap_or(4)
}

/// Whether one-row `q4_K` products take the `gemv_dot` kernel: yes unless
/// `COMPUTE_WGPU_QGEMV_DOT=0` (read once), which keeps them on `gemv`, for
/// comparing the two.
fn dot_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COMPUTE_WGPU_QGEMV_DOT").map_or(true, |v| v.trim() != "0"))
}

/// Most rows of `x` one `gemv` pass takes.
const GEMV_PASS_ROWS: u64 = GEMV_SHAPES[GEMV_SHAPES.len() - 1].0 as u64;

/// Rows of `x` above which the product dequantizes `W` into `f32` and runs
/// the GEMM (when that fits one binding).
pub(crate) const GEMV_MAX_ROWS: usize = 16;

/// Invocations of a `dequant` workgroup (`quant.wgsl`'s `DQ_WG`).
const DEQUANT_WG: u64 = 256;

/// Slices (invocations) per block in `quant.wgsl`.
fn slices(format: BlockFormat) -> u64 {
    match format {
        BlockFormat::Q6K => 16,
        BlockFormat::Q8_0 => 4,
        _ => 32,
    }
}

/// The format's blocks in values and bytes; `Unsupported` for a format the
/// shaders lack (`Q8_K`).
fn block(name: &'static str, format: BlockFormat) -> Result<(u64, u64)> {
    if quant_code(format).is_none() {
        return Err(ComputeError::Unsupported { op: name, backend: errors::KIND });
    }
    Ok((format.values_per_block() as u64, format.bytes_per_block() as u64))
}

/// Shape error unless `k` is a positive multiple of the block's values.
fn check_k(name: &'static str, format: BlockFormat, k: usize, shapes: impl Fn() -> String) -> Result<()> {
    let per = format.values_per_block();
    if k == 0 || !k.is_multiple_of(per) {
        return Err(ComputeError::shape(
            name,
            format!("{format} rows hold a multiple of {per} values; k = {k}"),
            shapes(),
        ));
    }
    Ok(())
}

/// The product `y = x · Wᵀ` (module docs): `x` an `m × k` view of `f32`,
/// `f16` or `bf16`, `w` the buffer holding `n` rows of `k` values of `format`
/// from offset 0, `y` an `m × n` view of any of the three float dtypes.
/// Appends its dispatches (and for half `y`, or the prefill path, takes
/// temporaries from the buffer cache); costs no device work. Errors: a
/// format without kernels, `k` not a multiple of the block, views shorter
/// than the shape, and `LimitExceeded` for a weight row, `x` or `y` larger
/// than one binding.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quant_matmul(
    ctx: &Context,
    name: &'static str,
    format: BlockFormat,
    (m, k, n): (usize, usize, usize),
    x: &View,
    w: &wgpu::Buffer,
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let shapes = || format!("x=[{m}, {k}] {}, w=[{n}, {k}] {format}, y=[{m}, {n}] {}", x.dtype, y.dtype);
    block(name, format)?;
    check_k(name, format, k, shapes)?;
    if m == 0 || n == 0 || x.len < m.saturating_mul(k) || y.len < m.saturating_mul(n) {
        return Err(ComputeError::shape(name, "x must hold m × k values and y m × n, m and n positive", shapes()));
    }
    let widened = (n as u64).saturating_mul(k as u64).saturating_mul(4);
    if m > GEMV_MAX_ROWS && widened <= ctx.max_binding() && widened <= ctx.limits.max_buffer_size {
        let wf = temp_f32(ctx, name, n * k, steps)?;
        dequantize(ctx, name, format, n * k, w, &wf, steps)?;
        let xf = widen(ctx, name, x, steps)?;
        let yf = f32_output(ctx, name, y, steps)?;
        let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) };
        gemm(ctx, name, spec, &xf, &wf, &yf, steps)?;
        return narrow(ctx, name, &yf, y, steps);
    }
    let yf = f32_output(ctx, name, y, steps)?;
    gemv(ctx, name, format, (m, k, n), x, w, &yf, ctx.subgroups(), steps)?;
    narrow(ctx, name, &yf, y, steps)
}

/// Checks product `s` against the device's limits, as [`quant_matmul`] would
/// find them: `x` and the `f32` `y` each within one storage binding, and at
/// least one aligned step of weight rows within one. Free.
pub(crate) fn check_limits(ctx: &Context, name: &'static str, s: &QuantMatmulSpec) -> Result<()> {
    let format = s.weight.block_format().ok_or(ComputeError::Unsupported { op: name, backend: errors::KIND })?;
    let (values, bytes) = block(name, format)?;
    let max = ctx.max_binding();
    // A fused norm's rows reach the product in f32.
    let x_dtype = if s.rms_norm.is_some() { DType::F32 } else { s.dtype };
    let x_bytes = padded_bytes_of(s.m.saturating_mul(s.k), x_dtype);
    if x_bytes > max {
        return Err(errors::limit(name, "storage buffer binding bytes (quantized product x)", x_bytes, max));
    }
    let y_bytes = padded_bytes(s.m.saturating_mul(s.n));
    if y_bytes > max {
        return Err(errors::limit(name, "storage buffer binding bytes (quantized product y)", y_bytes, max));
    }
    let row_bytes = (s.k as u64 / values).saturating_mul(bytes);
    rows_per_piece(ctx, name, row_bytes, row_bytes).map(drop)
}

/// The `gemv` passes of [`quant_matmul`] into the `f32` view `y`, with
/// subgroup reductions or without (`subgroup`, which the device must support).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv(
    ctx: &Context,
    name: &'static str,
    format: BlockFormat,
    (m, k, n): (usize, usize, usize),
    x: &View,
    w: &wgpu::Buffer,
    y: &View,
    subgroup: bool,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let (values, bytes) = block(name, format)?;
    let max = ctx.max_binding();
    let x_bytes = padded_bytes_of(m.saturating_mul(k), x.dtype);
    let y_bytes = padded_bytes(m.saturating_mul(n));
    if x_bytes > max {
        return Err(errors::limit(name, "storage buffer binding bytes (quantized product x)", x_bytes, max));
    }
    if y_bytes > max {
        return Err(errors::limit(name, "storage buffer binding bytes (quantized product y)", y_bytes, max));
    }
    let row_bytes = (k as u64 / values).saturating_mul(bytes);
    let per = rows_per_piece(ctx, name, row_bytes, row_bytes)?;
    let (k32, n32) = (to_u32(name, "inner dimension", k as u64)?, to_u32(name, "columns", n as u64)?);
    let (m, n) = (m as u64, n as u64);
    let mut m0 = 0;
    while m0 < m {
        let rows = (m - m0).min(GEMV_PASS_ROWS);
        let (mr, nr) = GEMV_SHAPES
            .into_iter()
            .find(|&(mr, _)| u64::from(mr) >= rows)
            .unwrap_or(GEMV_SHAPES[GEMV_SHAPES.len() - 1]);
        let dot = format == BlockFormat::Q4K && rows == 1 && dot_allowed();
        let (nr, subgroup) = if dot { (dot_rows(n), false) } else { (nr, subgroup) };
        let kernel = Kernel::QuantGemv { format, mr, nr, x: x.dtype, subgroup, dot };
        let mut j0 = 0;
        while j0 < n {
            let cnt = per.min(n - j0);
            let groups = cnt.div_ceil(u64::from(nr));
            steps.push(Step::Dispatch(Dispatch {
                kernel,
                params: params(&[
                    k32,
                    to_u32(name, "rows", cnt)?,
                    to_u32(name, "rows", rows)?,
                    to_u32(name, "rows", m0)?,
                    n32,
                    to_u32(name, "columns", j0)?,
                    to_u32(name, "workgroups", groups)?,
                ]),
                // `gemv_dot` reads the blocks as `vec4<u32>` only.
                bindings: [
                    Some(bind(1, &x.buffer, 0, x_bytes)),
                    Some(bind(3, &y.buffer, 0, y_bytes)),
                    (!dot).then(|| bind(4, w, j0 * row_bytes, whole_words(cnt * row_bytes))),
                    Some(bind(5, w, j0 * row_bytes, whole_words(cnt * row_bytes))),
                ]
                .into_iter()
                .flatten()
                .collect(),
                groups: grid(ctx, name, groups)?,
            }));
            j0 += cnt;
        }
        m0 += rows;
    }
    Ok(())
}

/// Dequantizes the `len` values of `format` blocks at the start of `w` into
/// `y` (`f32`, `f16` or `bf16`, `len` long): bit-exact with
/// `BlockFormat::dequantize` (then rounded once, to nearest even, for a half
/// `y`). One dispatch per piece of whole blocks within one binding; costs no
/// device work here. Errors: a format without kernels, `len` not a multiple
/// of the block, and `LimitExceeded` where one block does not fit a binding.
pub(crate) fn dequantize(
    ctx: &Context,
    name: &'static str,
    format: BlockFormat,
    len: usize,
    w: &wgpu::Buffer,
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let (values, bytes) = block(name, format)?;
    check_k(name, format, len, || format!("w=[{len}] {format}, y=[{}] {}", y.len, y.dtype))?;
    if y.len < len {
        return Err(ComputeError::shape(name, "the output is shorter than the blocks' values", format!("{len}")));
    }
    let out_block = values * y.dtype.size_in_bytes() as u64;
    let per = rows_per_piece(ctx, name, bytes, out_block)?;
    let blocks = len as u64 / values;
    let mut b0 = 0;
    while b0 < blocks {
        let cnt = per.min(blocks - b0);
        let units = cnt * slices(format);
        steps.push(Step::Dispatch(Dispatch {
            kernel: Kernel::Dequant { format, to: y.dtype },
            params: params(&[to_u32(name, "blocks", cnt)?]),
            bindings: vec![
                bind(2, &y.buffer, b0 * out_block, cnt * out_block),
                bind(4, w, b0 * bytes, whole_words(cnt * bytes)),
            ],
            groups: grid(ctx, name, units.div_ceil(DEQUANT_WG))?,
        }));
        b0 += cnt;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

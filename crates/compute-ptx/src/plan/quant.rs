//! Plans for GGML block-quantized weights: `y = x·Wᵀ` with `W` stored as
//! `Q4_K`, `Q5_K`, `Q6_K` or `Q8_0` blocks, and dequantization.
//!
//! - Up to [`quant_gemv::MAX_ROWS`] (16) activation rows: one pass over `W`
//!   on the `dp4a` kernels ([`quant_gemv`]) with the activations quantized
//!   to int8 per 32 values. Up to 4 rows whose quantized activations
//!   (`1.25·m·k` bytes) fit [`quant_gemv::X_MAX_SMEM`]: one launch
//!   ([`quant_gemv::qgemv_x`]) that quantizes them in shared memory; else
//!   they go to a temporary ([`quant::quantize_x`]) and [`quant_gemv::qgemv`]
//!   reads them. Error against the exact product with the dequantized
//!   weights: at most `(d_x/2)·Σ|W|` per 32 values (`d_x = max|x| / 127` of
//!   those values), plus `f32` rounding.
//! - More rows (prefill): `W` is dequantized into a `bf16` temporary
//!   (`2·n·k` bytes), `x` cast to `bf16` unless it is already, and the
//!   existing plan runs the product `x·Wᵀ` (`trans_b`) on tensor cores when
//!   its shape suits them. The weights are read once more than the GEMV
//!   would and written once as `bf16`; against the tensor-core GEMM's
//!   `m·n·k` work this is small once `m` is in the tens. Error: the `bf16`
//!   rounding of each weight (`2⁻⁸` relative, at most `(max|x| / 256)·Σ|W|`)
//!   and, for `f32`/`f16` activations, of each activation (`2⁻⁸·Σ|x·W|`).

use compute_core::quant::BlockFormat;
use compute_core::{BackendKind, ComputeError, DType, MatmulSpec, Op, Result};

use super::{Arg, Exec, Grid, Launcher, MAX_GRID_X, limit, u32_of};
use crate::kernels::gemm_epilogue::EpilogueKind;
use crate::kernels::quant_gemv::{self, XFusion};
use crate::kernels::{KernelId, elem, quant};

const MATMUL: &str = "quant_matmul";
const DEQUANT: &str = "dequantize";

fn check_format(op: &'static str, format: BlockFormat, shapes: &str) -> Result<()> {
    if quant::supported(format) {
        return Ok(());
    }
    let why = format!(
        "{format} is not a weight format (ggml uses it for activations); the CUDA kernels read q4_K, q5_K, q6_K and q8_0 blocks"
    );
    Err(ComputeError::shape(op, why, shapes))
}

fn check_dtype(op: &'static str, dtype: DType, shapes: &str) -> Result<()> {
    if elem::supported(dtype) {
        return Ok(());
    }
    Err(ComputeError::UnsupportedDType {
        op,
        backend: BackendKind::Cuda,
        dtype,
        reason: "the quantized-weight kernels read and write f32, f16 and bf16 values".into(),
        shapes: shapes.into(),
    })
}

/// The alignment the kernels need of the weight blocks: 16 bytes for the
/// `Q4_K`/`Q5_K` 16-byte loads, 2 for `Q6_K`/`Q8_0`.
fn weight_alignment(format: BlockFormat) -> u64 {
    if matches!(format, BlockFormat::Q4K | BlockFormat::Q5K) { 16 } else { 2 }
}

fn check_aligned(op: &'static str, what: &str, addr: u64, align: u64, shapes: &str) -> Result<()> {
    if addr.is_multiple_of(align) {
        return Ok(());
    }
    Err(ComputeError::shape(op, format!("{what} must be {align}-byte aligned; got address {addr:#x}"), shapes))
}

/// Queues `y = x·Wᵀ` on device addresses: `x` is `m × k` (row-major, of
/// `x_dtype`), `W` is `n` rows of `k` values stored as `format` blocks
/// (each row `k / values_per_block` consecutive blocks), `y` is `m × n` of
/// `out_dtype`; sums in `f32`. Up to 16 rows run the int8 `dp4a` GEMV, more
/// the dequantize-then-GEMM path (see the module docs for both errors).
/// Preconditions, checked with nothing queued on error: `format` one of
/// `Q4_K`, `Q5_K`, `Q6_K`, `Q8_0` (`Q8_K` is a `Shape` error), `x_dtype` and
/// `out_dtype` among `f32`/`f16`/`bf16` (`UnsupportedDType`), `k` a multiple
/// of the block's values (`Shape`), `m·k`, `m·n` and a weight row's bytes
/// under 2³² (`LimitExceeded`), `x` 16-byte aligned and `w` 16-byte
/// (`Q4_K`/`Q5_K`) or 2-byte aligned (`Shape`). Allocates nothing for up to
/// 4 rows whose quantized activations fit in shared memory (one launch),
/// else `1.25·m·k` bytes of temporaries (GEMV, two launches) or `2·n·k`
/// (+ `2·m·k`) bytes (prefill). Empty products queue nothing.
#[allow(clippy::too_many_arguments)]
pub fn run_quant_matmul(
    l: &dyn Launcher,
    format: BlockFormat,
    m: usize,
    k: usize,
    n: usize,
    x_dtype: DType,
    out_dtype: DType,
    (x, w, y): (u64, u64, u64),
) -> Result<()> {
    quant_matmul(l, format, (m, k, n), (x_dtype, out_dtype), (x, w, y), None)
}

/// Whether the product of `m` rows of `k` values runs the one-launch kernel
/// that quantizes its activations itself ([`quant_gemv::qgemv_x`]), the one
/// that applies an epilogue in its stores. Free.
pub fn fuses_epilogue(m: usize, k: usize) -> bool {
    fuses(m, k, false)
}

/// Whether the one-launch kernel takes `m` rows of `k` values, with the
/// sums of squares of a fused `norm` in its shared memory too. Free.
pub fn fuses(m: usize, k: usize, norm: bool) -> bool {
    m > 0
        && k > 0
        && m <= quant_gemv::MAX_ROWS
        && quant_gemv::X_ROWS.contains(&quant_gemv::rows_for(m))
        && quant_gemv::x_smem(m, k, norm) <= quant_gemv::X_MAX_SMEM
}

/// [`run_quant_matmul`] with the steps of `fusion` in the one-launch kernel
/// (`args`: with a norm `g`'s address and `eps`, then with an epilogue
/// `alpha`, `beta`, the bias and `C₀` addresses; with `glu` `y` has `n / 2`
/// columns), where [`fuses`] holds; the same preconditions and errors, and
/// a shape error where it does not hold or `glu` comes with an epilogue or
/// an odd `n`.
pub fn run_quant_matmul_fused(
    l: &dyn Launcher,
    format: BlockFormat,
    (m, k, n): (usize, usize, usize),
    (x_dtype, out_dtype): (DType, DType),
    (fusion, args): (XFusion, &[Arg]),
    (x, w, y): (u64, u64, u64),
) -> Result<()> {
    quant_matmul(l, format, (m, k, n), (x_dtype, out_dtype), (x, w, y), Some((fusion, args)))
}

fn quant_matmul(
    l: &dyn Launcher,
    format: BlockFormat,
    (m, k, n): (usize, usize, usize),
    (x_dtype, out_dtype): (DType, DType),
    (x, w, y): (u64, u64, u64),
    fused: Option<(XFusion, &[Arg])>,
) -> Result<()> {
    let shapes = format!("x=[{m}x{k}] {x_dtype}, w=[{n}x{k}] {format}, y=[{m}x{n}] {out_dtype}");
    let fusion = fused.map(|(f, _)| f).unwrap_or_default();
    if fused.is_some() && !fuses(m, k, fusion.norm) {
        let why = format!(
            "only products of up to 4 rows whose activations fit shared memory fuse a norm, gated halves or an epilogue; got m = {m}, k = {k}"
        );
        return Err(ComputeError::shape(MATMUL, why, shapes));
    }
    if fusion.glu && (fusion.epilogue.is_some() || !n.is_multiple_of(2)) {
        let why = format!("a gated product takes an even number of weight rows and no other epilogue; got n = {n}");
        return Err(ComputeError::shape(MATMUL, why, shapes));
    }
    check_format(MATMUL, format, &shapes)?;
    check_dtype(MATMUL, x_dtype, &shapes)?;
    check_dtype(MATMUL, out_dtype, &shapes)?;
    let vpb = format.values_per_block();
    if !k.is_multiple_of(vpb) {
        let why = format!("k must be a multiple of the {vpb} values of a {format} block; got {k}");
        return Err(ComputeError::shape(MATMUL, why, shapes));
    }
    let (m32, n32, k32) = (u32_of(MATMUL, "m", m)?, u32_of(MATMUL, "n", n)?, u32_of(MATMUL, "k", k)?);
    u32_of(MATMUL, "m * k", m.saturating_mul(k))?;
    u32_of(MATMUL, "m * n", m.saturating_mul(n))?;
    u32_of(MATMUL, "weight row bytes", k / vpb * format.bytes_per_block())?;
    limit(MATMUL, "weight row blocks", n.div_ceil(quant_gemv::ROWS_PER_BLOCK as usize), MAX_GRID_X)?;
    let grid = |rows: u32| Grid {
        blocks: (n.div_ceil(quant_gemv::weight_rows_per_block(format, rows) as usize) as u32, 1, 1),
        threads: (quant_gemv::THREADS, 1, 1),
        dynamic_smem: 0,
    };
    check_aligned(MATMUL, "x", x, 16, &shapes)?;
    check_aligned(MATMUL, "w", w, weight_alignment(format), &shapes)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        // Nothing to read: the GEMV kernel writes zeros, 16 rows at a time.
        let es = out_dtype.size_in_bytes() as u64;
        let mut i0 = 0;
        while i0 < m {
            let mc = (m - i0).min(quant_gemv::MAX_ROWS);
            let rows = quant_gemv::rows_for(mc);
            let yo = y + es * (i0 * n) as u64;
            let args =
                [Arg::Ptr(w), Arg::Ptr(x), Arg::Ptr(x), Arg::Ptr(yo), Arg::U32(mc as u32), Arg::U32(n32), Arg::U32(0)];
            l.launch(KernelId::QuantGemv(format, rows, out_dtype), grid(rows), &args)?;
            i0 += mc;
        }
        return Ok(());
    }
    if m > quant_gemv::MAX_ROWS {
        return prefill(l, format, (m, k, n), x_dtype, out_dtype, (x, w, y));
    }
    let epilogue_only = !fusion.norm && !fusion.glu;
    if epilogue_only && m == 1 && split_allowed() && quant_gemv::split::takes(format, k) {
        let extra = fused.map_or(&[][..], |(_, a)| a);
        return split(l, format, (k, n), (x_dtype, out_dtype), (x, w, y), (fusion.epilogue, extra));
    }
    let rows = quant_gemv::rows_for(m);
    let smem = quant_gemv::x_smem(m, k, fusion.norm);
    if fuses(m, k, fusion.norm) {
        // One launch: each block quantizes x into shared memory, then its
        // warps take rpc / 8 output columns each; rpc makes the grid about
        // as many blocks as stay resident, so x is quantized once per block,
        // and a warp takes fewer rows at a time where a short product would
        // leave multiprocessors without a block.
        let cols = if fusion.glu { n / 2 } else { n };
        let rw = if spread_allowed() {
            quant_gemv::x_weight_rows_for(format, rows, cols, fusion.glu, l.sm_count().max(1))
        } else {
            quant_gemv::x_weight_rows(format, rows)
        };
        let per_warp = rw / if fusion.glu { 2 } else { 1 };
        let step = (quant_gemv::X_WARPS * per_warp) as usize;
        let slots = step * quant_gemv::X_BLOCKS_PER_SM as usize * l.sm_count().max(1) as usize;
        let rpc = step * cols.div_ceil(slots);
        let grid = Grid {
            blocks: (cols.div_ceil(rpc) as u32, 1, 1),
            threads: (quant_gemv::X_THREADS, 1, 1),
            dynamic_smem: smem as u32,
        };
        let mut args = vec![
            Arg::Ptr(w),
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::U32(m32),
            Arg::U32(n32),
            Arg::U32(k32),
            Arg::U32(u32_of(MATMUL, "weight rows per block", rpc)?),
        ];
        if let Some((_, extra)) = fused {
            args.extend_from_slice(extra);
        }
        let long = quant_gemv::x_long(m, k);
        return l.launch(KernelId::QuantGemvX(format, (rows, rw, long), x_dtype, out_dtype, fusion), grid, &args);
    }
    // Quantized activations: m·k int8 (padded to 16 bytes), then m·k/32 (d, s) pairs.
    let q_bytes = (m * k).next_multiple_of(16);
    let (_guard, qx) = l.temp(q_bytes + m * k / 4, MATMUL)?;
    let ds = qx + q_bytes as u64;
    let quads = m * k / 4;
    let qgrid = Grid {
        blocks: (quads.div_ceil(quant::BLOCK as usize) as u32, 1, 1),
        threads: (quant::BLOCK, 1, 1),
        dynamic_smem: 0,
    };
    limit(MATMUL, "activation quantizer blocks", quads.div_ceil(quant::BLOCK as usize), MAX_GRID_X)?;
    l.launch(KernelId::QuantizeX(x_dtype), qgrid, &[Arg::Ptr(x), Arg::Ptr(qx), Arg::Ptr(ds), Arg::U32(quads as u32)])?;
    let args = [Arg::Ptr(w), Arg::Ptr(qx), Arg::Ptr(ds), Arg::Ptr(y), Arg::U32(m32), Arg::U32(n32), Arg::U32(k32)];
    l.launch(KernelId::QuantGemv(format, rows, out_dtype), grid(rows), &args)
}

/// Warps per multiprocessor the split GEMV's grid aims for (experiment
/// builds of it on an H100 at 4096 × 14336 ran fastest with 16 of 8, 12,
/// 16, 24 and 32).
const SPLIT_WARPS_PER_SM: usize = 16;

/// One activation row through the split GEMV ([`quant_gemv::split`]), with
/// `epilogue` (its arguments `extra`) in the stores: rows
/// per chunk so that the grid has about [`SPLIT_WARPS_PER_SM`] warps per
/// multiprocessor (a multiple of the kernel's batch, at most
/// [`quant_gemv::split::MAX_CHUNK_ROWS`]), and up to
/// [`quant_gemv::split::BLOCK_WARPS`] warps a block while that leaves a
/// block for every multiprocessor.
fn split(
    l: &dyn Launcher,
    format: BlockFormat,
    (k, n): (usize, usize),
    (x_dtype, out_dtype): (DType, DType),
    (x, w, y): (u64, u64, u64),
    (epilogue, extra): (Option<EpilogueKind>, &[Arg]),
) -> Result<()> {
    let slices = quant_gemv::split::slices(k);
    let sms = l.sm_count().max(1) as usize;
    let bt = quant_gemv::split::BATCH as usize;
    let chunks_wanted = (sms * SPLIT_WARPS_PER_SM / slices).max(1);
    let rpc = n.div_ceil(chunks_wanted).next_multiple_of(bt).min(quant_gemv::split::MAX_CHUNK_ROWS as usize);
    let chunks = n.div_ceil(rpc);
    let cpb = (quant_gemv::split::BLOCK_WARPS as usize / slices).clamp(1, (chunks / sms).max(1));
    let grid = Grid {
        blocks: (chunks.div_ceil(cpb) as u32, 1, 1),
        threads: ((32 * slices * cpb) as u32, 1, 1),
        dynamic_smem: (4 * rpc * slices * cpb) as u32,
    };
    let mut args =
        vec![Arg::Ptr(w), Arg::Ptr(x), Arg::Ptr(y), Arg::U32(n as u32), Arg::U32(k as u32), Arg::U32(rpc as u32)];
    args.extend_from_slice(extra);
    l.launch(KernelId::QuantGemvSplit(format, x_dtype, out_dtype, epilogue), grid, &args)
}

/// Whether one-row `Q4_K` products of long rows take the split GEMV
/// ([`quant_gemv::split::takes`]); `COMPUTE_PTX_QGEMV_SPLIT=0` in the
/// environment keeps them on the one-launch kernels (read once per process;
/// to compare the two in one build).
fn split_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COMPUTE_PTX_QGEMV_SPLIT").map_or(true, |v| v.trim() != "0"))
}

/// Whether short products may take fewer weight rows a warp at a time
/// ([`quant_gemv::x_weight_rows_for`]); `COMPUTE_PTX_QGEMV_SPREAD=0` in the
/// environment keeps the widest everywhere (read once per process; to
/// compare the two in one build).
fn spread_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COMPUTE_PTX_QGEMV_SPREAD").map_or(true, |v| v.trim() != "0"))
}

/// More than 16 rows: `W` to `bf16`, `x` to `bf16`, then the plan's matmul.
fn prefill(
    l: &dyn Launcher,
    format: BlockFormat,
    (m, k, n): (usize, usize, usize),
    x_dtype: DType,
    out_dtype: DType,
    (x, w, y): (u64, u64, u64),
) -> Result<()> {
    let wn = n.checked_mul(k).ok_or(ComputeError::LimitExceeded {
        op: MATMUL,
        what: "dequantized weight values",
        requested: n as u64,
        maximum: (usize::MAX / k.max(1)) as u64,
    })?;
    let (_wg, wb) = l.temp(wn.saturating_mul(2), MATMUL)?;
    run_dequantize(l, format, wn, DType::BF16, (w, wb))?;
    let exec = Exec { l };
    let mut _xg = None;
    let xb = if x_dtype == DType::BF16 {
        x
    } else {
        let (g, p) = l.temp((m * k).saturating_mul(2), MATMUL)?;
        exec.cast(x, x_dtype, p, DType::BF16, m * k)?;
        _xg = Some(g);
        p
    };
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) }.with_dtypes(DType::BF16, out_dtype);
    exec.run(&Op::Matmul(spec), &[xb, wb], y)
}

/// Queues the dequantization of the `len` values stored as `format` blocks
/// at `w` into `y` (`out_dtype`): exactly [`BlockFormat::dequantize`], then
/// one round to nearest even for `f16`/`bf16`. Preconditions, checked with
/// nothing queued on error: `format` one of `Q4_K`, `Q5_K`, `Q6_K`, `Q8_0`
/// (`Shape`), `out_dtype` among `f32`/`f16`/`bf16` (`UnsupportedDType`),
/// `len` a multiple of the block's values (`Shape`) and `len / 32` under 2³²
/// (`LimitExceeded`), `y` 16-byte aligned and `w` 16-byte (`Q4_K`/`Q5_K`) or
/// 2-byte aligned (`Shape`). One launch, one thread per 32 values: a read of
/// the blocks and a write of the values, nothing allocated.
pub fn run_dequantize(
    l: &dyn Launcher,
    format: BlockFormat,
    len: usize,
    out_dtype: DType,
    (w, y): (u64, u64),
) -> Result<()> {
    let shapes = format!("w=[{len}] {format}, y=[{len}] {out_dtype}");
    check_format(DEQUANT, format, &shapes)?;
    check_dtype(DEQUANT, out_dtype, &shapes)?;
    let vpb = format.values_per_block();
    if !len.is_multiple_of(vpb) {
        let why = format!("{format} blocks hold {vpb} values; {len} is not a multiple");
        return Err(ComputeError::shape(DEQUANT, why, shapes));
    }
    let chunks = u32_of(DEQUANT, "values / 32", len / 32)?;
    let blocks = (chunks as usize).div_ceil(quant::BLOCK as usize);
    limit(DEQUANT, "blocks", blocks, MAX_GRID_X)?;
    check_aligned(DEQUANT, "y", y, 16, &shapes)?;
    check_aligned(DEQUANT, "w", w, weight_alignment(format), &shapes)?;
    if len == 0 {
        return Ok(());
    }
    let grid = Grid { blocks: (blocks as u32, 1, 1), threads: (quant::BLOCK, 1, 1), dynamic_smem: 0 };
    l.launch(KernelId::Dequant(format, out_dtype), grid, &[Arg::Ptr(w), Arg::Ptr(y), Arg::U32(chunks)])
}

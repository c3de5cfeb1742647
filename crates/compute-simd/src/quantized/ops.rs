//! The CPU backend's ops on block-quantized data: [`Op::QuantMatmul`] and the
//! quantizing and dequantizing [`Op::Cast`]s.
//!
//! - A quantized matmul whose `k` is a multiple of 256 runs this module's
//!   integer kernels ([`matmul_with`]): the activations
//!   are quantized per 256 values (widened from `f16`/`bf16` first), the
//!   product is exact integer arithmetic scaled once per block; its error
//!   against the product with the dequantized weights is at most
//!   `dx/2·Σ|W|` per block (`dx = max|x|/127` over its 256 values), inside
//!   the op's stated bound. `Q8_0` rows of another length (a multiple of 32)
//!   are dequantized into an `f32` copy of the weight and go through the
//!   `f32` GEMM (`n·k·4` bytes of temporary memory).
//! - A dequantizing cast is ggml's `dequantize_row_*` (exact), rounded once
//!   into an `f16`/`bf16` output; a quantizing cast is ggml's reference
//!   quantizer (bit for bit), on half inputs widened to `f32` first. Both run
//!   on the calling thread, block by block: dequantizing costs a pass at
//!   about 1 GB/s, quantizing the reference searches (58–3500 MB/s by format).
//!
//! `f16`/`bf16` outputs are computed into an `f32` buffer and rounded once. A
//! quantized matmul's epilogue is applied to the `f32` product in one more
//! pass over it, as the GEMM's ([`EpilogueArgs`]). A fused norm is a pass
//! over `x` into an `f32` copy before the product; a gated product computes
//! all `n` columns into an `f32` buffer and combines its halves after.

use compute_core::{
    BackendKind, ComputeError, DType, HostSlice, HostSliceMut, MatmulSpec, Op, QuantMatmulSpec, Result, RowOp,
    quant::BlockFormat,
};

use super::{Weights, matmul_with};
use crate::gemm::{self, epilogue::EpilogueArgs};
use crate::halves::convert;
use crate::isa::Isa;

/// Whether the CPU runs `op` (every quantized matmul and every cast to or
/// from a weight block format). Free.
pub fn supported(op: &Op) -> bool {
    match *op {
        Op::QuantMatmul(s) => weights(s.weight).is_some(),
        Op::Cast { from, to, .. } => [from, to].into_iter().all(|d| !d.is_quantized() || weights(d).is_some()),
        _ => false,
    }
}

/// The kernels' name for a weight dtype.
fn weights(dtype: DType) -> Option<Weights> {
    match dtype {
        DType::Q4K => Some(Weights::Q4K),
        DType::Q5K => Some(Weights::Q5K),
        DType::Q6K => Some(Weights::Q6K),
        DType::Q8_0 => Some(Weights::Q8_0),
        _ => None,
    }
}

/// Runs a validated op that reads or writes quantized data (see the module
/// docs). Nothing is written to `out` on an error.
pub fn run(isa: Isa, op: &Op, inputs: &[HostSlice<'_>], out: HostSliceMut<'_>) -> Result<()> {
    let unsupported = |d: DType| ComputeError::unsupported_dtype(op, BackendKind::Simd, d, "no CPU kernel");
    match *op {
        Op::QuantMatmul(spec) => {
            let (Some(x), Some(w)) = (inputs.first(), inputs.get(1).and_then(HostSlice::blocks)) else {
                return Err(unsupported(spec.weight));
            };
            let mut x = widened(x);
            if let Some(eps) = spec.rms_norm {
                // The row kernel of Op::Rows, into an f32 copy.
                let g = inputs.get(2).map(HostSlice::to_f32).ok_or_else(|| unsupported(spec.dtype))?;
                let mut h = vec![0f32; spec.m * spec.k];
                let norm = RowOp::RmsNorm { eps: eps.0 };
                crate::kernels::rows::run(isa, norm, spec.m, spec.k, &[&x, &g], &mut h);
                x = std::borrow::Cow::Owned(h);
            }
            // The epilogue, as a matmul's: its bias and C₀ after W (and g).
            let as_matmul = MatmulSpec { trans_b: true, ..MatmulSpec::new(spec.m, spec.k, spec.n) }
                .with_dtypes(spec.dtype, spec.out_dtype)
                .with_epilogue(spec.epilogue);
            let epilogue = EpilogueArgs::new(isa, &as_matmul, inputs.get(spec.epilogue_at()..).unwrap_or_default())?;
            into_f32(isa, out, |y| {
                if spec.glu {
                    let mut p = vec![0f32; spec.m * spec.n];
                    quant_matmul(isa, op, &spec, &x, w.bytes(), &mut p)?;
                    gated(isa, spec.n / 2, &p, y);
                    return Ok(());
                }
                quant_matmul(isa, op, &spec, &x, w.bytes(), y)?;
                gemm::finish_product(isa, (spec.m, spec.n), &epilogue, y);
                Ok(())
            })
        }
        Op::Cast { from, .. } if from.is_quantized() => {
            let Some(w) = inputs.first().and_then(HostSlice::blocks) else { return Err(unsupported(from)) };
            let format = w.format();
            match out {
                HostSliceMut::F32(o) => format.dequantize(w.bytes(), o),
                HostSliceMut::F16(o) => format.dequantize_f16(w.bytes(), o),
                HostSliceMut::BF16(o) => format.dequantize_bf16(w.bytes(), o),
                other => Err(unsupported(other.dtype())),
            }
        }
        Op::Cast { to, .. } => {
            let Some(x) = inputs.first() else { return Err(unsupported(to)) };
            let HostSliceMut::Blocks(mut o) = out else { return Err(unsupported(to)) };
            let format = o.format();
            format.quantize(&widened(x), o.bytes_mut())
        }
        _ => Err(unsupported(op.dtype())),
    }
}

/// `y[i, j] = silu(p[i, j])·p[i, cols + j]` for the rows of `p` (`2·cols`
/// each): the swiglu kernel on each row's halves.
fn gated(isa: Isa, cols: usize, p: &[f32], y: &mut [f32]) {
    for (row, out) in p.chunks_exact(2 * cols).zip(y.chunks_exact_mut(cols)) {
        let (gate, up) = row.split_at(cols);
        crate::kernels::elementwise::binary(isa, compute_core::BinaryOp::SwiGlu, gate, up, out);
    }
}

/// `x` as `f32` values: borrowed when it is `f32`, else widened (exact).
fn widened<'a>(x: &HostSlice<'a>) -> std::borrow::Cow<'a, [f32]> {
    match x.get::<f32>() {
        Some(v) => std::borrow::Cow::Borrowed(v),
        None => std::borrow::Cow::Owned(x.to_f32()),
    }
}

/// Runs `f` into `out` when it is `f32`, else into an `f32` buffer that is
/// then rounded into `out` (only after `f` succeeded).
fn into_f32(isa: Isa, mut out: HostSliceMut<'_>, f: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
    if let Some(o) = out.get_mut::<f32>() {
        return f(o);
    }
    let mut tmp = vec![0f32; out.len()];
    f(&mut tmp)?;
    match out {
        HostSliceMut::F16(o) => convert::narrow(isa, &tmp, o),
        HostSliceMut::BF16(o) => convert::narrow(isa, &tmp, o),
        mut other => other.store_f32(&tmp),
    }
    Ok(())
}

/// `y = x·Wᵀ` on `f32` activations: the integer kernels when `k` is a
/// multiple of 256, else the dequantized weight through the `f32` GEMM.
fn quant_matmul(isa: Isa, op: &Op, s: &QuantMatmulSpec, x: &[f32], w: &[u8], y: &mut [f32]) -> Result<()> {
    let Some(format) = weights(s.weight) else {
        return Err(ComputeError::unsupported_dtype(op, BackendKind::Simd, s.weight, "no CPU kernel"));
    };
    if s.k.is_multiple_of(compute_core::quant::q4_k::VALUES) {
        return matmul_with(isa, format, x, w, (s.m, s.k, s.n), y);
    }
    let block = s.weight.block_format().unwrap_or(BlockFormat::Q8_0);
    let mut dense = vec![0f32; s.n * s.k];
    block.dequantize(w, &mut dense)?;
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(s.m, s.k, s.n) };
    gemm::sgemm(isa, &spec, x, &dense, &gemm::epilogue::EpilogueArgs::none(), y);
    Ok(())
}

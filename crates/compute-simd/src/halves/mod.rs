//! Every op on `f16` and `bf16` data (and casts between any dtypes): computed
//! in `f32` by the same kernels as `f32` data, rounding once when stored.
//!
//! - Element-wise ops and casts stream: each piece of the output (split over
//!   the pool as `f32` element-wise work is) goes through one pass. The cheap
//!   ops (all but the transcendentals) and casts take [`convert::fused`]'s
//!   loop where the CPU has one (AVX2 + F16C): 16 values at a time widened in
//!   registers, computed, narrowed and stored, streamed past the cache when
//!   the output is large. The transcendentals on half data in and out take
//!   [`transcendental::fused`]'s loop on AVX-512 (F, DQ), or on AVX2 with
//!   FMA and F16C, with kernels accurate to what
//!   the half result keeps rather than to `f32`. Otherwise the piece goes
//!   in blocks of [`BLOCK`] values, widened into `f32` buffers that stay in
//!   L1, computed by the `f32` kernels, and narrowed into the output. Memory
//!   traffic is the dtype's bytes, once.
//! - Reductions widen block by block as well and add the blocks' partial
//!   results in `f64`; they return `f32`.
//! - Row ops work in groups of whole rows (about 64 Ki values): read in
//!   place by [`rows::fused`] on AVX-512 (F, BW, VL, DQ), else widened into a per-thread
//!   scratch that stays in cache and is kept between calls.
//! - Matmul on bf16 operands, on a CPU with AVX512_BF16, runs
//!   [`gemm::bf16`]: packed straight from bf16, `vdpbf16ps`, `f32` output.
//! - Attention reads half `q`, `k` and `v` in place: its kernel widens each
//!   query, key and value block into `f32` scratch as it reaches it and
//!   rounds each output row once (the softmax weights stay `f32` for `P·V`),
//!   or, for bf16 decoding on a CPU with AVX512_BF16, runs both products on
//!   `vdpbf16ps` from the bf16 data (the weights rounded to bf16, as
//!   FlashAttention does). No memory proportional to the tensors.
//! - Matmul of a few rows (up to `GEMM_DOTS_MAX_M`, decoding) by a half
//!   weight, where the previous path does not apply, runs [`gemv`]: the
//!   weight read in place, widened in registers on AVX2 and a piece at a
//!   time into an L1 buffer elsewhere.
//! - Other matmuls and conv widen their inputs to `f32` arrays, run the
//!   `f32` kernel (matmul straight into an `f32` output), and narrow the
//!   result: `f32` speed, plus one pass over each operand and temporary
//!   memory of twice the half inputs' size (whose first touch costs a page
//!   fault per 4 KiB).
//! - A matmul's epilogue is applied by the GEMM to its `f32` values before
//!   they are narrowed, so the result is rounded once; a half bias is
//!   widened once, a half `C₀` piece by piece as the GEMM reaches it
//!   ([`gemm::epilogue`]).
//!
//! Conversions are [`convert`]'s vectorised ones.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod convert;
pub mod gemv;
pub mod rows;
pub mod transcendental;

use std::borrow::Cow;

use compute_core::{BackendKind, ComputeError, DType, Element, HostSlice, HostSliceMut, Op, ReduceOp, Result};

use crate::gemm::{self, epilogue::EpilogueArgs};
use crate::isa::Isa;
use crate::kernels::{self, fork, par};
use crate::tuning::{PAR_CHUNK, PAR_ELEMENTWISE_MIN, PAR_REDUCE_MIN, PAR_TRANSCENDENTAL_MIN, STREAM_MIN};
use convert::Lanes;

/// Values per staged block: three `f32` blocks (two inputs, one output) take
/// 12 KiB, well inside L1.
pub const BLOCK: usize = 1024;

/// Runs a validated op whose operands are not all `f32` (or a cast) on host
/// views. `OutOfMemory` if the staging arrays of a row op, matmul or conv
/// cannot be allocated; nothing is written then.
pub fn run(isa: Isa, op: &Op, inputs: &[HostSlice<'_>], out: HostSliceMut<'_>) -> Result<()> {
    match out {
        HostSliceMut::F32(o) => run_into(isa, op, inputs, o),
        HostSliceMut::F16(o) => run_into(isa, op, inputs, o),
        HostSliceMut::BF16(o) => run_into(isa, op, inputs, o),
        other => Err(ComputeError::unsupported_dtype(op, BackendKind::Simd, other.dtype(), "no CPU kernel")),
    }
}

fn run_into<T: Element>(isa: Isa, op: &Op, inputs: &[HostSlice<'_>], out: &mut [T]) -> Result<()> {
    match *op {
        Op::Unary { op: u, .. } => {
            let min = if u.is_transcendental() { PAR_TRANSCENDENTAL_MIN } else { PAR_ELEMENTWISE_MIN };
            staged(isa, inputs, out, min, Some(Lanes::Unary(u)), |ins, o| {
                kernels::elementwise::unary(isa, u, ins[0], o)
            });
        }
        Op::Binary { op: b, .. } => {
            staged(isa, inputs, out, PAR_ELEMENTWISE_MIN, Some(Lanes::Binary(b)), |ins, o| {
                kernels::elementwise::binary(isa, b, ins[0], ins[1], o)
            });
        }
        Op::Cast { .. } => {
            staged(isa, inputs, out, PAR_ELEMENTWISE_MIN, Some(Lanes::Same), |ins, o| o.copy_from_slice(ins[0]))
        }
        Op::Reduce { op: r, .. } => {
            let v = reduce(
                isa,
                inputs,
                |ins| match r {
                    ReduceOp::Sum => f64::from(kernels::reduce::sum(isa, ins[0])),
                    ReduceOp::Max => f64::from(kernels::reduce::max(isa, ins[0])),
                },
                r,
            );
            convert::narrow(isa, &[v as f32], out);
        }
        Op::Dot { .. } => {
            let v = reduce(isa, inputs, |ins| f64::from(kernels::reduce::dot(isa, ins[0], ins[1])), ReduceOp::Sum);
            convert::narrow(isa, &[v as f32], out);
        }
        Op::Rows { op: r, cols, .. } => rows_staged(isa, r, cols, inputs, out),
        Op::Lerp { t, .. } => staged(isa, inputs, out, PAR_ELEMENTWISE_MIN, None, |ins, o| {
            kernels::interpolate::lerp(isa, t, ins[0], ins[1], o)
        }),
        Op::Slerp { cols, t, .. } => kernels::interpolate::slerp_typed(isa, t, cols, inputs, out),
        Op::Matmul(spec) => {
            // The epilogue's bias and C₀ (of the output's dtype) are read as
            // given, widened as the GEMM reaches them.
            let epilogue = EpilogueArgs::new(isa, &spec, inputs.get(2..).unwrap_or_default())?;
            if let [HostSlice::BF16(a), HostSlice::BF16(b), ..] = *inputs
                && gemm::bf16::available(isa)
            {
                return into_output(isa, op, out, |o| {
                    gemm::bf16::gemm(isa, &spec, a, b, &epilogue, o);
                });
            }
            // A few rows by a half weight (decoding): the weight read in
            // place, not widened into an array first.
            if let [a, b] = *inputs
                && spec.epilogue.is_identity()
                && gemv::takes(&spec, a, b)
            {
                let x = widen_all(isa, op, &[a])?;
                return into_output(isa, op, out, |o| gemv::gemv(isa, &spec, &x[0], b, o));
            }
            let wide = widen_all(isa, op, inputs.get(..2).unwrap_or_default())?;
            into_output(isa, op, out, |o| gemm::sgemm(isa, &spec, &wide[0], &wide[1], &epilogue, o))?;
        }
        Op::Conv2d(spec) => {
            let wide = widen_all(isa, op, inputs)?;
            into_output(isa, op, out, |o| kernels::conv::conv2d(isa, &spec, &wide[0], &wide[1], o))?;
        }
        Op::QuantMatmul(s) => {
            return Err(ComputeError::unsupported_dtype(
                op,
                BackendKind::Simd,
                s.weight,
                "quantized ops run elsewhere",
            ));
        }
        Op::Rope(_) | Op::Copy(_) | Op::Gather { .. } | Op::ArgMax { .. } | Op::Glu { .. } => {
            return Err(ComputeError::unsupported_dtype(
                op,
                BackendKind::Simd,
                op.dtype(),
                "decoder ops run elsewhere",
            ));
        }
        Op::Attention(spec) => {
            // Read in place: the kernel widens each block of q, k and v as it
            // reaches it (or, bf16 decoding with AVX512_BF16, multiplies the
            // bf16 values themselves) and rounds each output row once.
            let &[q, k, v] = inputs else { return Ok(()) };
            let (Some(q), Some(k), Some(v)) = (T::from_host(q), T::from_host(k), T::from_host(v)) else {
                // Validation gives every operand the op's dtype: not reached.
                let other = [q, k, v].into_iter().map(|x| x.dtype()).find(|&d| d != T::DTYPE).unwrap_or(T::DTYPE);
                return Err(ComputeError::unsupported_dtype(op, BackendKind::Simd, other, "mixed attention dtypes"));
            };
            kernels::attention::attention(isa, &spec, q, k, v, out)?;
        }
    }
    Ok(())
}

/// Streams an element-wise op over pieces of `out` (in parallel above
/// `min_len` elements): each through [`convert::fused`] with `fuse` where
/// there is one (streaming outputs of at least [`STREAM_MIN`] `f32`s' worth
/// of bytes, as the `f32` kernels do), else in blocks of [`BLOCK`]: widen the
/// inputs' block, `f(inputs, out_block)` in `f32`, narrow into `out`. Both
/// give the same values.
fn staged<T: Element>(
    isa: Isa,
    inputs: &[HostSlice<'_>],
    out: &mut [T],
    min_len: usize,
    fuse: Option<Lanes>,
    f: impl Fn(&[&[f32]], &mut [f32]) + Sync,
) {
    let n_in = inputs.len().min(2);
    let stream = std::mem::size_of_val(out) >= STREAM_MIN * std::mem::size_of::<f32>();
    let piece = |start: usize, out: &mut [T]| {
        if let Some(lanes) = fuse {
            let mut ins = [HostSlice::F32(&[]); 2];
            for (d, x) in ins.iter_mut().zip(inputs) {
                *d = range(*x, start, out.len());
            }
            let done = match lanes {
                Lanes::Unary(u) if u.is_transcendental() => transcendental::fused(isa, u, ins[0], out, stream),
                _ => convert::fused(isa, lanes, &ins[..n_in], out, stream),
            };
            if done {
                return;
            }
        }
        let mut ibuf = [[0.0f32; BLOCK]; 2];
        let mut obuf = [0.0f32; BLOCK];
        for (b, o) in out.chunks_mut(BLOCK).enumerate() {
            let at = start + b * BLOCK;
            let n = o.len();
            for (buf, x) in ibuf.iter_mut().zip(inputs) {
                widen_range(isa, *x, at, &mut buf[..n]);
            }
            let views = [&ibuf[0][..n], &ibuf[1][..n]];
            f(&views[..n_in], &mut obuf[..n]);
            convert::narrow(isa, &obuf[..n], o);
        }
    };
    if par::worth_splitting(out.len(), min_len) {
        let p = par::piece_len(out.len());
        fork::chunks_mut(out, p, |i, o| piece(i * p, o));
    } else {
        piece(0, out);
    }
}

/// `x[at..at + len]` (empty if `x` is shorter).
pub(crate) fn range(x: HostSlice<'_>, at: usize, len: usize) -> HostSlice<'_> {
    let r = at..at.saturating_add(len);
    match x {
        HostSlice::F32(s) => HostSlice::F32(s.get(r).unwrap_or_default()),
        HostSlice::F16(s) => HostSlice::F16(s.get(r).unwrap_or_default()),
        HostSlice::BF16(s) => HostSlice::BF16(s.get(r).unwrap_or_default()),
        other => other,
    }
}

/// `dst` = `src[at..at + dst.len()]` widened to `f32`.
fn widen_range(isa: Isa, src: HostSlice<'_>, at: usize, dst: &mut [f32]) {
    let end = at + dst.len();
    match src {
        HostSlice::F32(s) => dst.copy_from_slice(&s[at..end]),
        HostSlice::F16(s) => convert::widen(isa, &s[at..end], dst),
        HostSlice::BF16(s) => convert::widen(isa, &s[at..end], dst),
        _ => dst.fill(f32::NAN),
    }
}

/// A row op in groups of whole rows (about [`PAR_CHUNK`] values each, in
/// parallel when there are several): on AVX-512 with half rows in and out,
/// each group runs [`rows::fused`]; otherwise its rows are widened into a
/// per-thread scratch, run through the `f32` row kernel on that thread, and
/// narrowed into `out`. The parameter vectors are widened once. No large
/// allocation: a fresh array of the whole input would cost a page fault per
/// 4 KiB, as much as the op itself on a VM.
fn rows_staged<T: Element>(isa: Isa, op: compute_core::RowOp, cols: usize, inputs: &[HostSlice<'_>], out: &mut [T]) {
    let params: Vec<Vec<f32>> = inputs
        .iter()
        .skip(1)
        .map(|p| {
            let mut v = vec![0.0f32; p.len()];
            widen_range(isa, *p, 0, &mut v);
            v
        })
        .collect();
    let Some(&x) = inputs.first() else { return };
    let group = (PAR_CHUNK / cols.max(1)).max(1);
    let stream = std::mem::size_of_val(out) >= STREAM_MIN * std::mem::size_of::<f32>();
    let param_views: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let run_group = |g: usize, out: &mut [T]| {
        SCRATCH.with(|cell| {
            let mut scratch = cell.take();
            let n = out.len();
            let xg = range(x, g * group * cols, n);
            if rows::fused(isa, op, cols, xg, &param_views, out, &mut scratch, stream) {
                cell.replace(scratch);
                return;
            }
            scratch.resize(2 * n, 0.0);
            let (xs, ys) = scratch.split_at_mut(n);
            widen_range(isa, x, g * group * cols, xs);
            let mut ins: Vec<&[f32]> = vec![xs];
            ins.extend(params.iter().map(Vec::as_slice));
            par::sequential(|| kernels::rows::run(isa, op, n / cols, cols, &ins, ys));
            convert::narrow(isa, ys, out);
            cell.replace(scratch);
        })
    };
    fork::chunks_mut(out, group * cols, run_group);
}

thread_local! {
    /// Each thread's staging buffer for [`rows_staged`] (about `2·PAR_CHUNK`
    /// values, or two rows when rows are longer), kept between calls.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A reduction over `inputs` (one or two of equal length): `f` of each
/// block's widened values, combined in `f64` (sum) or as a NaN-propagating
/// max. Pieces of [`PAR_CHUNK`] run in parallel above [`PAR_REDUCE_MIN`].
fn reduce(isa: Isa, inputs: &[HostSlice<'_>], f: impl Fn(&[&[f32]]) -> f64 + Sync, combine: ReduceOp) -> f64 {
    let len = inputs.first().map_or(0, HostSlice::len);
    let fold = |acc: f64, v: f64| match combine {
        ReduceOp::Sum => acc + v,
        ReduceOp::Max if acc.is_nan() || v.is_nan() => f64::NAN,
        ReduceOp::Max => acc.max(v),
    };
    let init = match combine {
        ReduceOp::Sum => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
    };
    let piece = |start: usize, n: usize| {
        let mut bufs = [[0.0f32; BLOCK]; 2];
        let mut acc = init;
        let mut at = start;
        while at < start + n {
            let m = BLOCK.min(start + n - at);
            for (buf, x) in bufs.iter_mut().zip(inputs) {
                widen_range(isa, *x, at, &mut buf[..m]);
            }
            let views = [&bufs[0][..m], &bufs[1][..m]];
            acc = fold(acc, f(&views[..inputs.len().min(2)]));
            at += m;
        }
        acc
    };
    if len < PAR_REDUCE_MIN {
        return piece(0, len);
    }
    let parts = fork::map(len.div_ceil(PAR_CHUNK), |i| {
        let start = i * PAR_CHUNK;
        piece(start, PAR_CHUNK.min(len - start))
    });
    parts.into_iter().fold(init, fold)
}

/// Every input as `f32`: borrowed when it already is, else widened into a
/// new array (in parallel pieces). `OutOfMemory` if the host cannot hold it.
fn widen_all<'a>(isa: Isa, op: &Op, inputs: &[HostSlice<'a>]) -> Result<Vec<Cow<'a, [f32]>>> {
    inputs
        .iter()
        .map(|x| match *x {
            HostSlice::F32(s) => Ok(Cow::Borrowed(s)),
            other => {
                let mut wide = zeros(op, other.len())?;
                fork::chunks_mut(&mut wide, PAR_CHUNK, |i, d| widen_range(isa, other, i * PAR_CHUNK, d));
                Ok(Cow::Owned(wide))
            }
        })
        .collect()
}

/// Runs `f` on an `f32` output: `out` itself when it is `f32`, else a staging
/// array narrowed into `out` afterwards.
fn into_output<T: Element>(isa: Isa, op: &Op, out: &mut [T], f: impl FnOnce(&mut [f32])) -> Result<()> {
    if let Some(o) = f32::from_host_mut(T::host_mut(out)) {
        f(o);
        return Ok(());
    }
    let mut wide = zeros(op, out.len())?;
    f(&mut wide);
    fork::chunks_mut(out, PAR_CHUNK, |i, o| convert::narrow(isa, &wide[i * PAR_CHUNK..i * PAR_CHUNK + o.len()], o));
    Ok(())
}

/// `len` zeros, or `OutOfMemory` naming `op`.
fn zeros(op: &Op, len: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| ComputeError::OutOfMemory {
        op: op.name(),
        backend: BackendKind::Simd,
        requested_bytes: DType::F32.bytes_for(len).unwrap_or(u64::MAX),
    })?;
    v.resize(len, 0.0);
    Ok(v)
}

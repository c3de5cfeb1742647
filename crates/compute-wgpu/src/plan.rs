//! Turning one validated [`Op`] on device buffers into kernel dispatches,
//! split to respect the adapter's limits.
//!
//! A storage binding may be smaller than a buffer (lavapipe: 128 MiB, H200:
//! 2 GiB − 4), and a grid dimension holds at most 65535 workgroups. Element-wise
//! ops, casts and reductions are split into pieces of at most one binding; row
//! ops into pieces of whole rows; matmul batches into grids of at most 65535
//! matrices; attention into pieces of whole key/value heads (each with the
//! query heads that read it; a head of a KV cache holds its capacity's rows);
//! rotary embeddings, gathers (the table) and argmax into pieces of whole rows.
//! What cannot be split (one row, one matrix, one convolution operand, one
//! key/value head, a copy's views or a gather's output larger than a binding) is a
//! [`ComputeError::LimitExceeded`] naming requested and maximum bytes. Nothing here touches the device except taking
//! scratch buffers from the cache (reductions, split-K matmul, the `f32`
//! temporaries of half ops), which the steps carry as [`Step::Scratch`] until
//! their submission.
//!
//! **Dtypes.** Every op runs on `f32`, `f16` and `bf16`; the kernels compute
//! in `f32` and half operands are packed two to a word (`kernels.rs`). No two
//! invocations may write the two halves of one word, so:
//!
//! - element-wise ops, casts and reductions read and write half data directly
//!   (each invocation handles four elements: whole words);
//! - row ops and convolutions read half inputs directly and write an `f32`
//!   temporary, which a cast then rounds into the half output;
//! - a matmul casts half A and B into `f32` temporaries, runs the `f32` GEMM
//!   (into an `f32` temporary for a half C) and casts C, except an `f16`
//!   matmul on cooperative matrices ([`coop_kernel`]), which reads the halves
//!   and writes C directly (whole words: n even); a matmul with an epilogue
//!   writes its product (either way) into an `f32` temporary, and the
//!   [`epilogue`] pass reads it with C₀ and the bias as stored and writes C
//!   in its dtype, four values to an invocation; attention likewise
//!   casts half q, k and v into `f32` temporaries and its `f32` result into
//!   the half output;
//! - the decoder ops (rotary embedding, strided copy, gather, argmax) read and
//!   write half data directly: whole words, or, where a view ends mid-word,
//!   one invocation rewriting its half of a word no other invocation of the
//!   dispatch touches ([`decoder`]);
//! - a cast between equal dtypes is a buffer copy.

use compute_core::{
    AttentionSpec, BinaryOp, ComputeError, DType, Epilogue, GeluForm, Mask, MatmulSpec, Op, ReduceOp, Result, RowOp,
    Strided, UnaryOp,
};

use crate::buffers::{Use, padded_bytes, padded_bytes_of, whole_words};
use crate::context::Context;
use crate::errors;
use crate::kernels::{Kernel, MatmulKernel, Vec4s, coop_matmul};
use crate::options::{CoopMatmul, CoopTiles, MatmulTiles, TiledMatmul};

pub(crate) mod decoder;
pub(crate) mod quant;
pub(crate) mod rows;

/// Whether the shaders read and write `dtype` (`f32`, `f16`, `bf16`). Free.
pub(crate) fn computes(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether the shaders can run `op`: every operand's dtype is one they read
/// and write ([`computes`]); every op of the vocabulary on `f32`, `f16` and
/// `bf16`, matmuls with any input and output dtypes. A matmul or attention in
/// TF32 precision runs the full-precision shaders, which meet the TF32 bound.
/// Block-quantized weights (`q4_K`, `q5_K`, `q6_K`, `q8_0`): quantized
/// matmuls of float activations and outputs, dequantizing casts and casts
/// between equal dtypes (copies); quantizing casts are declined (the CPU runs
/// them). Free.
pub(crate) fn supported(op: &Op) -> bool {
    let kernels = |d: DType| d.block_format().and_then(crate::kernels::quant_code).is_some();
    match *op {
        Op::QuantMatmul(s) => computes(s.dtype) && computes(s.out_dtype) && kernels(s.weight),
        Op::Cast { from, to, .. } if from == to => true,
        Op::Cast { from, to, .. } if from.is_quantized() => kernels(from) && computes(to),
        _ => op.dtypes().into_iter().all(computes),
    }
}

/// The [`ComputeError::UnsupportedDType`] for an op that [`supported`]
/// declines, naming its first dtype the shaders lack.
pub(crate) fn unsupported_dtype(op: &Op) -> ComputeError {
    if let Op::Cast { from, to, .. } = *op
        && computes(from)
        && to.is_quantized()
    {
        return ComputeError::unsupported_dtype(
            op,
            errors::KIND,
            to,
            "the wgpu shaders dequantize but do not quantize (the CPU does)",
        );
    }
    let dtype = op.dtypes().into_iter().find(|&d| !computes(d)).unwrap_or(op.dtype());
    ComputeError::unsupported_dtype(
        op,
        errors::KIND,
        dtype,
        "the wgpu shaders read and write f32, f16 and bf16, and read q4_K, q5_K, q6_K and q8_0 weights",
    )
}

/// Bytes of every kernel's uniform parameter block.
pub(crate) const PARAM_BYTES: u64 = 64;

/// One buffer range bound at `slot` of group 0.
#[derive(Clone, Debug)]
pub(crate) struct Binding {
    pub(crate) slot: u32,
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// One kernel launch: pipeline, parameters (slot 0), storage bindings, grid.
#[derive(Clone, Debug)]
pub(crate) struct Dispatch {
    pub(crate) kernel: Kernel,
    pub(crate) params: [u32; 16],
    pub(crate) bindings: Vec<Binding>,
    pub(crate) groups: [u32; 3],
}

/// One command of a submission.
#[derive(Clone, Debug)]
pub(crate) enum Step {
    Dispatch(Dispatch),
    /// Copies `bytes` from the start of `src` to the start of `dst`.
    Copy {
        src: wgpu::Buffer,
        dst: wgpu::Buffer,
        bytes: u64,
    },
    /// A scratch buffer from the backend's cache that later steps use. It goes
    /// back to the cache only once the submission holding these steps is queued:
    /// any later user is then a later submission, which the queue orders after
    /// this one. (Given back earlier, another thread's submission, or an upload
    /// made before this batch executes, could take it first and see these
    /// dispatches overwrite its data.)
    Scratch(wgpu::Buffer),
}

/// `len` elements of `dtype` at the start of `buffer` (which holds at least
/// `padded_bytes_of(len, dtype)`).
#[derive(Clone, Debug)]
pub(crate) struct View {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

impl View {
    /// Bytes of one element.
    fn size(&self) -> u64 {
        self.dtype.size_in_bytes() as u64
    }
}

/// Elements one element-wise workgroup covers (256 invocations × 4 × 4).
const ELEMENTWISE_GROUP: u64 = 4096;
/// Most partials one reduction piece writes.
const MAX_PARTIALS: u64 = 1024;
/// vec4s each reduction invocation reads at least (when the input is large).
const REDUCE_PER_INVOCATION: u64 = 8;

fn params(values: &[u32]) -> [u32; 16] {
    let mut p = [0u32; 16];
    for (d, s) in p.iter_mut().zip(values) {
        *d = *s;
    }
    p
}

fn to_u32(op: &'static str, what: &'static str, v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| errors::limit(op, what, v, u64::from(u32::MAX)))
}

fn bind(slot: u32, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Binding {
    Binding { slot, buffer: buffer.clone(), offset, size }
}

/// A grid of `groups` workgroups: 1-D if it fits, else 2-D (kernels flatten it
/// and skip the surplus groups).
fn grid(ctx: &Context, op: &'static str, groups: u64) -> Result<[u32; 3]> {
    let max = u64::from(ctx.max_groups());
    let groups = groups.max(1);
    if groups <= max {
        return Ok([to_u32(op, "workgroups", groups)?, 1, 1]);
    }
    let y = groups.div_ceil(max);
    if y > max {
        return Err(errors::limit(op, "workgroups", groups, max.saturating_mul(max)));
    }
    // The narrowest x that covers `groups` with y rows: at most y − 1 surplus groups.
    let x = groups.div_ceil(y);
    Ok([to_u32(op, "workgroups", x)?, to_u32(op, "workgroups", y)?, 1])
}

/// Splits `len` elements into pieces of at most one binding for operands of
/// each of `dtypes`: (first element, count). Each piece starts at a byte
/// offset that is a multiple of the binding offset alignment for every
/// operand, and all but the last hold a multiple of 4 elements. For `f32`
/// alone, pieces of exactly one binding.
fn pieces(ctx: &Context, name: &'static str, len: usize, dtypes: &[DType]) -> Result<Vec<(u64, u64)>> {
    let align = ctx.offset_align();
    let size = |d: &DType| d.size_in_bytes() as u64;
    let widest = dtypes.iter().map(size).max().unwrap_or(4);
    let unit = dtypes.iter().fold(4, |u, d| lcm(u, align / gcd(align, size(d))));
    let chunk = ctx.max_binding() / widest / unit * unit;
    if chunk == 0 {
        return Err(errors::limit(
            name,
            "storage buffer binding bytes (aligned piece)",
            unit * widest,
            ctx.max_binding(),
        ));
    }
    let len = len as u64;
    Ok((0..len.div_ceil(chunk)).map(|i| (i * chunk, chunk.min(len - i * chunk))).collect())
}

fn unary_code(op: UnaryOp) -> (u32, f32, f32) {
    match op {
        UnaryOp::Relu => (0, 0.0, 0.0),
        UnaryOp::LeakyRelu { alpha } => (1, alpha, 0.0),
        UnaryOp::Elu { alpha } => (2, alpha, 0.0),
        UnaryOp::Sigmoid => (3, 0.0, 0.0),
        UnaryOp::Tanh => (4, 0.0, 0.0),
        UnaryOp::Swish => (5, 0.0, 0.0),
        UnaryOp::Gelu(GeluForm::Tanh) => (6, 0.0, 0.0),
        UnaryOp::Gelu(GeluForm::Erf) => (7, 0.0, 0.0),
        UnaryOp::Clip { min, max } => (8, min, max),
        UnaryOp::Scale { s } => (9, s, 0.0),
    }
}

/// The `binary` op code of lerp in `elementwise.wgsl` (`t` in the first op parameter).
const LERP_CODE: u32 = 3;

fn binary_code(op: BinaryOp) -> u32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::SwiGlu => 4,
    }
}

/// Appends the dispatches of `op` (already validated against the views'
/// lengths and dtypes) reading `inputs` and writing `output`. Costs no device
/// work; half row ops, convolutions and matmuls take `f32` temporaries from
/// the buffer cache (see the [module](self) docs). An op that [`supported`]
/// declines is [`unsupported_dtype`].
pub(crate) fn plan(ctx: &Context, op: &Op, inputs: &[View], output: &View, steps: &mut Vec<Step>) -> Result<()> {
    let name = op.name();
    let input = |i: usize| {
        inputs.get(i).ok_or_else(|| {
            ComputeError::shape(name, format!("expected at least {} inputs, got {}", i + 1, inputs.len()), op.shapes())
        })
    };
    // A product's epilogue inputs from input `at` on: the bias, then C₀.
    let epilogue_inputs = |e: Epilogue, at: usize| -> Result<[Option<&View>; 2]> {
        let bias = if e.bias { Some(input(at)?) } else { None };
        let c0 = if e.reads_c() { Some(input(at + usize::from(e.bias))?) } else { None };
        Ok([bias, c0])
    };
    if !supported(op) {
        return Err(unsupported_dtype(op));
    }
    match *op {
        Op::QuantMatmul(s) => {
            let format = s.weight.block_format().ok_or_else(|| unsupported_dtype(op))?;
            let w = input(1)?;
            // A fused norm: x's rows normalized into an f32 temporary first.
            let x = match s.rms_norm {
                Some(eps) => {
                    let (x, h) = (input(0)?, temp_f32(ctx, name, s.m * s.k, steps)?);
                    let norm = RowOp::RmsNorm { eps: eps.0 };
                    rows::row_op(ctx, name, norm, s.m, s.k, [x, input(2)?, x], &h, ctx.subgroups(), steps)?;
                    h
                }
                None => input(0)?.clone(),
            };
            // With an epilogue or gated halves the product goes to an f32
            // temporary, which one more pass reads into the output.
            let e = s.epilogue;
            let direct = e.is_identity() && !s.glu;
            let product = if direct { output.clone() } else { temp_f32(ctx, name, s.m * s.n, steps)? };
            quant::quant_matmul(ctx, name, format, (s.m, s.k, s.n), &x, &w.buffer, &product, steps)?;
            if s.glu {
                let y = f32_output(ctx, name, output, steps)?;
                glu(ctx, name, (s.m, s.n / 2, DType::F32), &product, &y, steps)?;
                narrow(ctx, name, &y, output, steps)?;
            } else if !e.is_identity() {
                epilogue(ctx, name, (e, s.n), &product, epilogue_inputs(e, s.epilogue_at())?, output, steps)?;
            }
        }
        Op::Unary { op: u, len, dtype } => {
            let (code, a, b) = unary_code(u);
            let extra = [0, a.to_bits(), b.to_bits()];
            elementwise(ctx, name, Kernel::Unary(code, dtype), len, &[(1, input(0)?)], output, &extra, steps)?;
        }
        Op::Binary { op: b, len, dtype } => {
            let ins = [(1, input(0)?), (3, input(1)?)];
            elementwise(ctx, name, Kernel::Binary(binary_code(b), dtype), len, &ins, output, &[], steps)?;
        }
        Op::Lerp { len, t, dtype } => {
            let ins = [(1, input(0)?), (3, input(1)?)];
            let extra = [0, t.to_bits()];
            elementwise(ctx, name, Kernel::Binary(LERP_CODE, dtype), len, &ins, output, &extra, steps)?;
        }
        Op::Slerp { rows, cols, t, .. } => {
            let y = f32_output(ctx, name, output, steps)?;
            slerp(ctx, name, (rows, cols, t), [input(0)?, input(1)?], &y, steps)?;
            narrow(ctx, name, &y, output, steps)?;
        }
        Op::Reduce { op: r, len, .. } => {
            let code = match r {
                ReduceOp::Sum => 0,
                ReduceOp::Max => 1,
            };
            let x = input(0)?;
            reduce(ctx, name, code, x, x, len, output, steps)?;
        }
        Op::Dot { len, .. } => reduce(ctx, name, 2, input(0)?, input(1)?, len, output, steps)?,
        Op::Rows { op: r, rows, cols, .. } => {
            let y = f32_output(ctx, name, output, steps)?;
            let params = [input(0)?, input(1).unwrap_or(output), input(2).unwrap_or(output)];
            rows::row_op(ctx, name, r, rows, cols, params, &y, ctx.subgroups(), steps)?;
            narrow(ctx, name, &y, output, steps)?;
        }
        Op::Matmul(s) => {
            // A B shared by the whole batch, A's matrices one after the
            // other: one product of batch·m rows over the same buffers.
            let s = s.shared_b_as_rows().unwrap_or(s);
            // With an epilogue the product goes to an f32 temporary, which one
            // more element-wise pass reads into the output.
            let e = s.epilogue;
            let product = if e.is_identity() { output.clone() } else { temp_f32(ctx, name, output.len, steps)? };
            let ps = MatmulSpec { out_dtype: product.dtype, ..s };
            if let Some(kernel) = coop_kernel(ctx, &ps) {
                coop_gemm(ctx, name, ps, kernel, [input(0)?, input(1)?], &product, steps)?;
            } else {
                let a = widen(ctx, name, input(0)?, steps)?;
                let b = widen(ctx, name, input(1)?, steps)?;
                let c = f32_output(ctx, name, &product, steps)?;
                gemm(ctx, name, s, &a, &b, &c, steps)?;
                narrow(ctx, name, &c, &product, steps)?;
            }
            if !e.is_identity() {
                epilogue(ctx, name, (e, s.n), &product, epilogue_inputs(e, 2)?, output, steps)?;
            }
        }
        Op::Conv2d(c) => {
            let (x, w) = (input(0)?, input(1)?);
            let y = f32_output(ctx, name, output, steps)?;
            let max = ctx.max_binding();
            for (bytes, what) in [
                (padded_bytes_of(x.len, x.dtype), "storage buffer binding bytes (conv input)"),
                (padded_bytes_of(w.len, w.dtype), "storage buffer binding bytes (conv weights)"),
                (padded_bytes(y.len), "storage buffer binding bytes (conv output)"),
            ] {
                if bytes > max {
                    return Err(errors::limit(name, what, bytes, max));
                }
            }
            let (oh, ow) = c
                .output_hw()
                .ok_or_else(|| ComputeError::shape(name, "kernel larger than padded input", op.shapes()))?;
            let u = |v: usize| to_u32(name, "convolution size", v as u64);
            let total = y.len as u64;
            steps.push(Step::Dispatch(Dispatch {
                kernel: Kernel::Conv2d(x.dtype),
                params: params(&[
                    u(c.n)?,
                    u(c.c_in)?,
                    u(c.h)?,
                    u(c.w)?,
                    u(c.c_out)?,
                    u(c.kh)?,
                    u(c.kw)?,
                    u(c.stride.0)?,
                    u(c.stride.1)?,
                    u(c.padding.0)?,
                    u(c.padding.1)?,
                    u(oh)?,
                    u(ow)?,
                    to_u32(name, "elements", total)?,
                ]),
                bindings: vec![
                    bind(1, &x.buffer, 0, padded_bytes_of(x.len, x.dtype)),
                    bind(2, &w.buffer, 0, padded_bytes_of(w.len, w.dtype)),
                    bind(3, &y.buffer, 0, padded_bytes(y.len)),
                ],
                groups: grid(ctx, name, total.div_ceil(256))?,
            }));
            narrow(ctx, name, &y, output, steps)?;
        }
        Op::Cast { len, from, to } if from != to && from.is_quantized() => {
            let format = from.block_format().ok_or_else(|| unsupported_dtype(op))?;
            quant::dequantize(ctx, name, format, len, &input(0)?.buffer, output, steps)?;
        }
        Op::Cast { .. } => cast_into(ctx, name, input(0)?, output, steps)?,
        Op::Attention(a) => {
            let layout = attention_layout(ctx, name, &a)?;
            let q = widen(ctx, name, input(0)?, steps)?;
            let k = widen(ctx, name, input(1)?, steps)?;
            let v = widen(ctx, name, input(2)?, steps)?;
            let positions = if a.positions { Some(input(3)?) } else { None };
            let y = f32_output(ctx, name, output, steps)?;
            attention(ctx, name, &a, &layout, [&q, &k, &v], positions, &y, steps)?;
            narrow(ctx, name, &y, output, steps)?;
        }
        // Into a cache: the plain rope into a scratch of the tokens' rows, then
        // the append (`RopeSpec::cache_copy`), in the same submission.
        Op::Rope(r) if r.cache.is_some() => {
            let positions = if r.positions { Some(input(1)?) } else { None };
            let len = r.seq * r.heads * r.head_dim;
            let buffer = ctx.cache.take(ctx, Use::Storage, padded_bytes_of(len, r.dtype), name)?;
            steps.push(Step::Scratch(buffer.clone()));
            let rows = View { buffer, len, dtype: r.dtype };
            plan(ctx, &Op::Rope(r.plain()), inputs, &rows, steps)?;
            if let Some(append) = r.cache_copy() {
                decoder::copy(ctx, name, &append, &rows, positions, output, steps)?;
            }
        }
        Op::Rope(r) => {
            let positions = if r.positions { Some(input(1)?) } else { None };
            match r.source {
                // Heads out of wider rows: copied into a rows-of-`heads` scratch first.
                Some(h) => {
                    let spec = compute_core::RopeSpec { source: None, ..r };
                    let rows = Strided {
                        offset: h.first * r.head_dim,
                        strides: [0, h.row_heads * r.head_dim, 1],
                        len: r.seq * h.row_heads * r.head_dim,
                    };
                    let x = copied(ctx, name, input(0)?, rows, [1, r.seq, r.heads * r.head_dim], steps)?;
                    decoder::rope(ctx, name, &spec, &x, positions, output, steps)?
                }
                None => decoder::rope(ctx, name, &r, input(0)?, positions, output, steps)?,
            }
        }
        Op::Glu { rows, cols, dtype } => glu(ctx, name, (rows, cols, dtype), input(0)?, output, steps)?,
        Op::Copy(c) => {
            let positions = if c.positions.is_some() { Some(input(1)?) } else { None };
            decoder::copy(ctx, name, &c, input(0)?, positions, output, steps)?;
        }
        Op::Gather { ids, rows, cols, .. } => {
            decoder::gather(ctx, name, (ids, rows, cols), input(0)?, input(1)?, output, steps)?;
        }
        Op::ArgMax { rows, cols, .. } => decoder::argmax(ctx, name, (rows, cols), input(0)?, output, steps)?,
    }
    Ok(())
}

/// The dispatches of an element-wise `kernel` over `len` elements, one per
/// piece ([`pieces`]): `inputs` at their slots and `output` at slot 2, each
/// bound at its own dtype's offsets; the parameters are the piece's length,
/// then `extra`.
#[allow(clippy::too_many_arguments)]
fn elementwise(
    ctx: &Context,
    name: &'static str,
    kernel: Kernel,
    len: usize,
    inputs: &[(u32, &View)],
    output: &View,
    extra: &[u32],
    steps: &mut Vec<Step>,
) -> Result<()> {
    elementwise_with(ctx, name, kernel, len, (inputs, &[]), output, |_| Ok(extra.to_vec()), steps)
}

/// [`elementwise`] with bindings that every piece binds `whole`, and the
/// parameters after the length given by `extra` of the piece's first element.
#[allow(clippy::too_many_arguments)]
fn elementwise_with(
    ctx: &Context,
    name: &'static str,
    kernel: Kernel,
    len: usize,
    (inputs, whole): (&[(u32, &View)], &[Binding]),
    output: &View,
    extra: impl Fn(u64) -> Result<Vec<u32>>,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let mut dtypes = [output.dtype; 3];
    for (d, (_, v)) in dtypes.iter_mut().zip(inputs) {
        *d = v.dtype;
    }
    for (start, n) in pieces(ctx, name, len, &dtypes)? {
        let at = |slot: u32, v: &View| bind(slot, &v.buffer, start * v.size(), padded_bytes_of(n as usize, v.dtype));
        let mut bindings: Vec<Binding> = inputs.iter().map(|&(slot, v)| at(slot, v)).collect();
        bindings.push(at(2, output));
        bindings.extend_from_slice(whole);
        let mut p = [0u32; 16];
        p[0] = to_u32(name, "elements", n)?;
        for (d, s) in p[1..].iter_mut().zip(extra(start)?) {
            *d = s;
        }
        steps.push(Step::Dispatch(Dispatch {
            kernel,
            params: p,
            bindings,
            groups: grid(ctx, name, n.div_ceil(ELEMENTWISE_GROUP))?,
        }));
    }
    Ok(())
}

/// A matmul's epilogue `e` (on products of `cols` columns) from the `f32`
/// product `p` into `output`: `act(alpha·p + beta·c0 + bias)`, one
/// element-wise pass (`elementwise.wgsl` `epilogue`) in pieces of one
/// binding, reading the product, `C₀` and the bias (both of the output's
/// dtype), the bias bound whole; inputs the epilogue does not read are bound
/// to the product, never read. Costs one read of the product and `C₀` and
/// one write of the output.
fn epilogue(
    ctx: &Context,
    name: &'static str,
    (e, cols): (Epilogue, usize),
    p: &View,
    [bias, c0]: [Option<&View>; 2],
    output: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    if output.len == 0 {
        return Ok(());
    }
    let kernel = Kernel::Epilogue { act: e.activation.map(|a| unary_code(a.unary()).0), out: output.dtype };
    let bias = match bias {
        Some(b) => bind(5, &b.buffer, 0, padded_bytes_of(b.len, b.dtype)),
        None => bind(5, &p.buffer, 0, padded_bytes(1)),
    };
    let cols64 = cols as u64;
    let flags = u32::from(e.bias) | (u32::from(e.reads_c()) << 1);
    let extra = |start: u64| -> Result<Vec<u32>> {
        let cols = to_u32(name, "columns", cols64)?;
        let col0 = to_u32(name, "columns", start % cols64.max(1))?;
        Ok(vec![0, e.alpha.to_bits(), e.beta.to_bits(), cols, col0, flags])
    };
    let inputs = [(1, p), (4, c0.unwrap_or(p))];
    elementwise_with(ctx, name, kernel, output.len, (&inputs, &[bias]), output, extra, steps)
}

/// `x` converted into `out` (same length, another buffer): a buffer copy of
/// whole words when the dtypes agree (bits kept), else the `convert` kernel,
/// rounding to nearest even in integer arithmetic.
fn cast_into(ctx: &Context, name: &'static str, x: &View, out: &View, steps: &mut Vec<Step>) -> Result<()> {
    if x.dtype == out.dtype {
        let bytes = whole_words(x.dtype.bytes_for(x.len).unwrap_or(u64::MAX));
        steps.push(Step::Copy { src: x.buffer.clone(), dst: out.buffer.clone(), bytes });
        return Ok(());
    }
    let kernel = Kernel::Cast { from: x.dtype, to: out.dtype };
    elementwise(ctx, name, kernel, x.len, &[(1, x)], out, &[], steps)
}

/// The `shape` view `src` of `x` copied into a contiguous scratch buffer of
/// `x`'s dtype from the buffer cache, carried by the steps until their
/// submission.
fn copied(
    ctx: &Context,
    name: &'static str,
    x: &View,
    src: Strided,
    shape: [usize; 3],
    steps: &mut Vec<Step>,
) -> Result<View> {
    let len = shape.iter().product();
    let buffer = ctx.cache.take(ctx, Use::Storage, padded_bytes_of(len, x.dtype), name)?;
    steps.push(Step::Scratch(buffer.clone()));
    let view = View { buffer, len, dtype: x.dtype };
    let spec = compute_core::CopySpec::new(shape, src, Strided::contiguous(shape)).with_dtype(x.dtype);
    decoder::copy(ctx, name, &spec, x, None, &view, steps)?;
    Ok(view)
}

/// An `f32` scratch buffer for `len` elements from the buffer cache, carried
/// by the steps until their submission.
fn temp_f32(ctx: &Context, name: &'static str, len: usize, steps: &mut Vec<Step>) -> Result<View> {
    let buffer = ctx.cache.take(ctx, Use::Storage, padded_bytes(len), name)?;
    steps.push(Step::Scratch(buffer.clone()));
    Ok(View { buffer, len, dtype: DType::F32 })
}

/// `x` as `f32`: itself, or an `f32` temporary that a cast fills.
fn widen(ctx: &Context, name: &'static str, x: &View, steps: &mut Vec<Step>) -> Result<View> {
    if x.dtype == DType::F32 {
        return Ok(x.clone());
    }
    let wide = temp_f32(ctx, name, x.len, steps)?;
    cast_into(ctx, name, x, &wide, steps)?;
    Ok(wide)
}

/// Where a kernel that writes `f32` one element at a time puts `output`'s
/// values: `output` itself, or an `f32` temporary for a half output (which
/// [`cast_into`] then rounds into `output`).
fn f32_output(ctx: &Context, name: &'static str, output: &View, steps: &mut Vec<Step>) -> Result<View> {
    if output.dtype == DType::F32 { Ok(output.clone()) } else { temp_f32(ctx, name, output.len, steps) }
}

/// Rounds the `f32` values of `y`, from [`f32_output`], into `output` where
/// `y` is a temporary (a half output); nothing for an `f32` output.
fn narrow(ctx: &Context, name: &'static str, y: &View, output: &View, steps: &mut Vec<Step>) -> Result<()> {
    if output.dtype == DType::F32 { Ok(()) } else { cast_into(ctx, name, y, output, steps) }
}

/// How many whole rows (of `row_in` input bytes and `row_out` output bytes)
/// one dispatch of a row kernel binds: as many as the largest binding holds,
/// a multiple of what keeps every piece's offsets, in the inputs and in the
/// output, multiples of the binding offset alignment. `LimitExceeded` when
/// not even one such step of rows fits.
fn rows_per_piece(ctx: &Context, name: &'static str, row_in: u64, row_out: u64) -> Result<u64> {
    let widest = row_in.max(row_out);
    let max = ctx.max_binding();
    if widest > max {
        return Err(errors::limit(name, "storage buffer binding bytes (one row)", widest, max));
    }
    let align = ctx.offset_align();
    let step_rows = lcm(align / gcd(row_in, align), align / gcd(row_out, align));
    let per = (max / widest) / step_rows * step_rows;
    if per == 0 {
        return Err(errors::limit(name, "storage buffer binding bytes (aligned rows)", widest * step_rows, max));
    }
    Ok(per)
}

/// [`Op::Glu`] of the `rows × 2·cols` view `x` (of `dtype`, as `y`): the two
/// halves of each row copied apart, then the swiglu kernel.
fn glu(
    ctx: &Context,
    name: &'static str,
    (rows, cols, dtype): (usize, usize, DType),
    x: &View,
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let half = |offset| Strided { offset, strides: [0, 2 * cols, 1], len: 2 * rows * cols };
    let gate = copied(ctx, name, x, half(0), [1, rows, cols], steps)?;
    let up = copied(ctx, name, x, half(cols), [1, rows, cols], steps)?;
    let kernel = Kernel::Binary(binary_code(BinaryOp::SwiGlu), dtype);
    elementwise(ctx, name, kernel, rows * cols, &[(1, &gate), (3, &up)], y, &[], steps)
}

/// Slerp of `rows × cols` rows of `a` and `b` (any dtype, the same) with
/// weight `t` into the `f32` view `y`, in pieces of whole rows as [`rows::row_op`]
/// cuts them: one workgroup per row.
fn slerp(
    ctx: &Context,
    name: &'static str,
    (rows, cols, t): (usize, usize, f32),
    [a, b]: [&View; 2],
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let row_in = (cols as u64).saturating_mul(a.size());
    let row_out = (cols as u64).saturating_mul(y.size());
    let per = rows_per_piece(ctx, name, row_in, row_out)?;
    let cols32 = to_u32(name, "columns", cols as u64)?;
    let rows = rows as u64;
    let mut start = 0;
    while start < rows {
        let n = per.min(rows - start);
        steps.push(Step::Dispatch(Dispatch {
            kernel: Kernel::Slerp(a.dtype),
            params: params(&[to_u32(name, "rows", n)?, cols32, t.to_bits()]),
            bindings: vec![
                bind(1, &a.buffer, start * row_in, whole_words(n * row_in)),
                bind(2, &y.buffer, start * row_out, n * row_out),
                bind(3, &b.buffer, start * row_in, whole_words(n * row_in)),
            ],
            groups: grid(ctx, name, n)?,
        }));
        start += n;
    }
    Ok(())
}

/// The `f32` GEMM `c = op(a) · op(b)` of spec `s` (its dtypes aside: all three
/// views are `f32`), with the tiling the device's matmul choice gives the
/// shape, split-K partials in a scratch buffer, and batches split into grids
/// of at most 65535 matrices.
fn gemm(
    ctx: &Context,
    name: &'static str,
    s: MatmulSpec,
    a: &View,
    b: &View,
    c: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let max = ctx.max_binding();
    let sizes = [
        (a.len, "storage buffer binding bytes (matmul A)"),
        (b.len, "storage buffer binding bytes (matmul B)"),
        (c.len, "storage buffer binding bytes (matmul C)"),
    ];
    for (len, what) in sizes {
        if padded_bytes(len) > max {
            return Err(errors::limit(name, what, padded_bytes(len), max));
        }
    }
    // Operands whose layout allows it move as vec4s, the others element by
    // element; the tiling depends on the shape alone (`matmul.wgsl`).
    let mut vec = Vec4s::for_shape(s.m, s.k, s.n, s.trans_a, s.trans_b);
    // A vec4 load of matrix z starts at z·stride: strides in whole vec4s.
    vec.a &= s.stride_a().is_multiple_of(4);
    vec.b &= s.stride_b().is_multiple_of(4);
    let (m, k, n) = (s.m as u64, s.k as u64, s.n as u64);
    let batch = s.batch as u64;
    let choice = ctx.kernels.matmul();
    let mut tiles = match choice.tiles {
        MatmulTiles::Small => MatmulKernel::Small,
        MatmulTiles::Tiled(t) => MatmulKernel::Tiled(t),
        MatmulTiles::Auto => auto_tiles(m, n, batch),
        MatmulTiles::AutoSplitK => auto_split_k(m, k, n, batch),
    };
    let maxg = u64::from(ctx.max_groups());
    // Split-K: `sk` slices; matrices per dispatch such that the grid's z (matrices ·
    // sk) and the scratch of partials (matrices · sk · m · n floats, one binding)
    // fit. Where one matrix's partials do not fit (or k is near u32's range, which
    // the shader's slice bounds must stay inside), no split-K.
    let mut sk = 1;
    let mut per_dispatch = maxg;
    if let MatmulKernel::Tiled(t) = tiles
        && t.split_k() > 1
    {
        let slices = u64::from(t.split_k());
        let fit = (max / (slices * m * n * 4).max(1)).min(maxg / slices);
        // `matmul_reduce` sums vec4s of C: no split-K for n % 4 ≠ 0.
        if fit == 0 || k > u64::from(u32::MAX / 2) || !vec.c {
            tiles = MatmulKernel::Tiled(t.with_split_k(1).unwrap_or(t));
        } else {
            (sk, per_dispatch) = (slices, fit);
        }
    }
    let kernel = Kernel::Matmul { tiles, ta: s.trans_a, tb: s.trans_b, vec, checked: choice.checked };
    let (tile_m, tile_n) = tiles.tile();
    let gx = n.div_ceil(tile_n);
    let gy = m.div_ceil(tile_m);
    if gx > maxg || gy > maxg {
        return Err(errors::limit(name, "workgroups per dimension", gx.max(gy), maxg));
    }
    // Each operand as vec4s (slots 1–3) and as elements (4–6), over the same
    // range; but WebGPU forbids two writable bindings of one buffer, so the
    // view of C this kernel never writes (by `vec.c`) is a small spare buffer.
    let spare = ctx.cache.take(ctx, Use::Storage, 16, name)?;
    steps.push(Step::Scratch(spare.clone()));
    let (unused_c, unused_slot) = if vec.c { (5, 6) } else { (2, 3) };
    let mut bindings = vec![
        bind(1, &a.buffer, 0, padded_bytes(a.len)),
        bind(2, &b.buffer, 0, padded_bytes(b.len)),
        bind(3, &c.buffer, 0, padded_bytes(c.len)),
        bind(4, &a.buffer, 0, padded_bytes(a.len)),
        bind(5, &b.buffer, 0, padded_bytes(b.len)),
        bind(6, &c.buffer, 0, padded_bytes(c.len)),
    ];
    bindings[unused_c] = bind(unused_slot, &spare, 0, 16);
    let dims = [to_u32(name, "rows", m)?, to_u32(name, "columns", n)?, to_u32(name, "inner dimension", k)?];
    let strides = [
        to_u32(name, "elements", s.stride_a() as u64)?,
        to_u32(name, "elements", s.stride_b() as u64)?,
        to_u32(name, "elements", m * n)?,
    ];
    let scratch = if sk > 1 {
        let b = ctx.cache.take(ctx, Use::Storage, sk * per_dispatch.min(batch) * m * n * 4, name)?;
        steps.push(Step::Scratch(b.clone()));
        Some(b)
    } else {
        None
    };
    let mut z0 = 0;
    while z0 < batch {
        let gz = per_dispatch.min(batch - z0);
        // vec4s of C this dispatch writes (n % 4 == 0 wherever sk > 1).
        let len4 = to_u32(name, "elements", gz * m * n / 4)?;
        let p =
            params(&[dims[0], dims[1], dims[2], to_u32(name, "batch", z0)?, strides[0], strides[1], strides[2], len4]);
        let (gx, gy) = (to_u32(name, "workgroups", gx)?, to_u32(name, "workgroups", gy)?);
        match &scratch {
            None => steps.push(Step::Dispatch(Dispatch {
                kernel,
                params: p,
                bindings: bindings.clone(),
                groups: [gx, gy, to_u32(name, "workgroups", gz)?],
            })),
            Some(scratch) => {
                // Partial matrices z·sk + slice of this dispatch's gz matrices.
                let part_bytes = sk * gz * m * n * 4;
                let mut tiled = bindings.clone();
                tiled[2] = bind(3, scratch, 0, part_bytes);
                tiled[5] = bind(6, scratch, 0, part_bytes);
                tiled[unused_c] = bind(unused_slot, &spare, 0, 16);
                steps.push(Step::Dispatch(Dispatch {
                    kernel,
                    params: p,
                    bindings: tiled,
                    groups: [gx, gy, to_u32(name, "workgroups", gz * sk)?],
                }));
                steps.push(Step::Dispatch(Dispatch {
                    kernel: Kernel::MatmulReduce { sk: sk as u32, checked: choice.checked },
                    params: p,
                    bindings: vec![bind(1, scratch, 0, part_bytes), bind(3, &c.buffer, 0, padded_bytes(c.len))],
                    groups: grid(ctx, name, u64::from(len4).div_ceil(256))?,
                }));
            }
        }
        z0 += gz;
    }
    Ok(())
}

/// `CoopMatmul::Auto`'s configuration for a `batch × m × n` output:
/// [`CoopTiles::AUTO_LARGE`] from 256 tiles of 128 × 128, else
/// [`CoopTiles::AUTO_SMALL`] (more workgroups for shapes that would leave
/// most of the GPU idle).
fn auto_coop(m: u64, n: u64, batch: u64) -> CoopTiles {
    let tiles = m.div_ceil(128).saturating_mul(n.div_ceil(128)).saturating_mul(batch);
    if tiles >= 256 { CoopTiles::AUTO_LARGE } else { CoopTiles::AUTO_SMALL }
}

/// The cooperative-matrix configuration for matmul `s`, or `None` where the
/// `f32` kernels run it: `choice` is `Off`; the inputs are not `f16` (`bf16`
/// and `f32` inputs stay on the `f32` kernels: a `bf16` value is an `f16` one
/// only within `f16`'s range, which the data decide, not the op); the output
/// is not `f32`, `f16` or `bf16`; or the contiguous dimension of a stored
/// input (A: k, or m when transposed; B: n, or k when transposed) is not a
/// multiple of 4 (the kernel reads units of 4 halves). The configuration
/// must also fit `max_workgroup_bytes` of
/// workgroup memory and `max_invocations` per workgroup. Free.
pub(crate) fn coop_tiles(
    choice: CoopMatmul,
    s: &MatmulSpec,
    max_workgroup_bytes: u64,
    max_invocations: u32,
) -> Option<CoopTiles> {
    let inputs = s.dtype == DType::F16 && matches!(s.out_dtype, DType::F32 | DType::F16 | DType::BF16);
    let a = if s.trans_a { s.m } else { s.k };
    let b = if s.trans_b { s.k } else { s.n };
    // Batch strides in whole units of 4 too (a stride of 0 is one).
    let units = [a, b, s.stride_a(), s.stride_b()].iter().all(|x| x.is_multiple_of(4));
    if !inputs || !units {
        return None;
    }
    let tiles = match choice {
        CoopMatmul::Off => return None,
        CoopMatmul::Auto => auto_coop(s.m as u64, s.n as u64, s.batch as u64),
        CoopMatmul::Tiles(t) => t,
    };
    let fits = coop_matmul::workgroup_bytes(tiles, s.trans_a, s.trans_b) <= max_workgroup_bytes
        && tiles.threads() <= max_invocations;
    fits.then_some(tiles)
}

/// The cooperative-matrix kernel for matmul `s` on this device, or `None`:
/// a device without cooperative matrices, a shape or dtype [`coop_tiles`]
/// declines, or a pipeline the device refused to compile (then the `f32`
/// kernels run it, and every later call of that kernel too). The C it writes
/// is the output (`f32`, or a half output with n even, written two values to
/// a word), else an `f32` temporary. Compiles the pipeline on first use.
fn coop_kernel(ctx: &Context, s: &MatmulSpec) -> Option<Kernel> {
    if !ctx.coop() {
        return None;
    }
    let choice = ctx.kernels.matmul();
    let limits =
        (u64::from(ctx.limits.max_compute_workgroup_storage_size), ctx.limits.max_compute_invocations_per_workgroup);
    let tiles = coop_tiles(choice.coop, s, limits.0, limits.1)?;
    let out = if s.out_dtype == DType::F32 || s.n.is_multiple_of(2) { s.out_dtype } else { DType::F32 };
    let kernel = Kernel::CoopMatmul { tiles, ta: s.trans_a, tb: s.trans_b, out, checked: choice.checked };
    ctx.kernels.compiles(ctx, kernel).then_some(kernel)
}

/// The dispatches of matmul `s` on cooperative matrices (`kernel` from
/// [`coop_kernel`]): `f16` A and B as stored, C written by the kernel in its
/// output dtype (an `f32` temporary narrowed into a half output of odd n),
/// batches in grids of at most 65535 matrices. `LimitExceeded` where an
/// operand exceeds one storage binding or the grid its limit.
fn coop_gemm(
    ctx: &Context,
    name: &'static str,
    s: MatmulSpec,
    kernel: Kernel,
    [a, b]: [&View; 2],
    output: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let Kernel::CoopMatmul { tiles, out, .. } = kernel else {
        return Err(errors::driver(name, "not a cooperative-matrix kernel"));
    };
    let max = ctx.max_binding();
    let c_len = output.len;
    let sizes = [
        (padded_bytes_of(a.len, a.dtype), "storage buffer binding bytes (matmul A)"),
        (padded_bytes_of(b.len, b.dtype), "storage buffer binding bytes (matmul B)"),
        (padded_bytes_of(c_len, out), "storage buffer binding bytes (matmul C)"),
    ];
    for (bytes, what) in sizes {
        if bytes > max {
            return Err(errors::limit(name, what, bytes, max));
        }
    }
    let c = if out == output.dtype { output.clone() } else { temp_f32(ctx, name, c_len, steps)? };
    let (m, k, n) = (s.m as u64, s.k as u64, s.n as u64);
    let maxg = u64::from(ctx.max_groups());
    let (gx, gy) = (n.div_ceil(u64::from(tiles.tile_n())), m.div_ceil(u64::from(tiles.tile_m())));
    if gx > maxg || gy > maxg {
        return Err(errors::limit(name, "workgroups per dimension", gx.max(gy), maxg));
    }
    let c_slot = if out == DType::F32 { 3 } else { 4 };
    let bindings = vec![
        bind(1, &a.buffer, 0, padded_bytes_of(a.len, a.dtype)),
        bind(2, &b.buffer, 0, padded_bytes_of(b.len, b.dtype)),
        bind(c_slot, &c.buffer, 0, padded_bytes_of(c_len, out)),
    ];
    let u = |v: u64, what| to_u32(name, what, v);
    let direct = u32::from(out == DType::F32 && n.is_multiple_of(4));
    let batch = s.batch as u64;
    let mut z0 = 0;
    while z0 < batch {
        let gz = maxg.min(batch - z0);
        steps.push(Step::Dispatch(Dispatch {
            kernel,
            params: params(&[
                u(m, "rows")?,
                u(n, "columns")?,
                u(k, "inner dimension")?,
                u(z0, "batch")?,
                u(s.stride_a() as u64, "elements")?,
                u(s.stride_b() as u64, "elements")?,
                u(m * n, "elements")?,
                direct,
            ]),
            bindings: bindings.clone(),
            groups: [u(gx, "workgroups")?, u(gy, "workgroups")?, u(gz, "workgroups")?],
        }));
        z0 += gz;
    }
    if out == output.dtype { Ok(()) } else { cast_into(ctx, name, &c, output, steps) }
}

/// Query rows and keys per block of `attention.wgsl` (its `BQ` and `BK`).
const ATTENTION_BLOCK: u64 = 64;
/// Output columns one attention dispatch computes (`attention.wgsl`: 64·`DV`, `DV` ≤ 4).
const ATTENTION_SLICE: u64 = 256;
/// Longest sequence `attention.wgsl` takes: its causal arithmetic is in `i32`.
const ATTENTION_MAX_SEQ: u64 = 1 << 30;

/// Bytes of workgroup memory `attention.wgsl` declares for `dv`, `ck` and
/// `cv`: the stage (`max(128·(ck/4 + 1), 16·cv·dv)` vec4s), the weights (1088
/// vec4s) and the row reductions (256 vec4s); with `positions`
/// (`attention_at`), the key count's 4 bytes more.
pub(crate) fn attention_workgroup_bytes(dv: u64, ck: u64, cv: u64, positions: bool) -> u64 {
    16 * ((128 * (ck / 4 + 1)).max(16 * cv * dv) + 1088 + 256) + if positions { 4 } else { 0 }
}

/// The chunk lengths `(ck, cv)` `attention.wgsl` takes for `dv` column groups,
/// preferred first: head_dim chunks of `ck` = 32 or 16, key chunks of `cv` =
/// 32, 16 or 8 whose V stage (16·`cv`·`dv` vec4s) is at most 4 vec4s per
/// invocation.
pub(crate) fn attention_chunk_choices(dv: u32) -> impl Iterator<Item = (u32, u32)> {
    [32, 16]
        .into_iter()
        .flat_map(|ck| [32, 16, 8].into_iter().map(move |cv| (ck, cv)))
        .filter(move |&(_, cv)| 16 * cv * dv <= 1024)
}

/// The attention kernel for a slice of `dv` column groups (1..=4), reading
/// the key count from positions with `positions` (`attention_at`): the longest
/// chunks that fit the device's workgroup memory; an error where none fits.
/// Compiled without naga's bounds checks unless the device was opened with
/// them (`DeviceOptions::matmul_bounds_checks`).
fn attention_kernel(ctx: &Context, name: &'static str, dv: u64, positions: bool) -> Result<Kernel> {
    let max = u64::from(ctx.limits.max_compute_workgroup_storage_size);
    let dv = dv.clamp(1, 4) as u32;
    let bytes = |ck: u32, cv: u32| attention_workgroup_bytes(dv.into(), ck.into(), cv.into(), positions);
    let chosen = attention_chunk_choices(dv).find(|&(ck, cv)| bytes(ck, cv) <= max);
    let Some((ck, cv)) = chosen else {
        return Err(errors::limit(name, "workgroup storage bytes (attention)", bytes(16, 8), max));
    };
    Ok(Kernel::Attention { dv, ck, cv, checked: ctx.kernels.matmul().checked, positions })
}

/// How an attention call is cut into dispatches: pieces of `per` whole
/// key/value heads ("units": a key/value head of one sequence and the `group`
/// query heads that read it, contiguous in all four tensors), each bound at
/// its own offsets; within a piece one dispatch per slice of 256 output columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttentionLayout {
    /// Units in all: batch · heads_kv.
    units: u64,
    /// Units per piece (all but the last piece).
    per: u64,
    /// Query heads per unit.
    group: u64,
    /// Query blocks per head.
    q_blocks: u64,
    /// Bytes of one unit's queries (and outputs), in `f32`.
    unit_q: u64,
    /// Bytes of one unit's keys (and values), in `f32`: `kv_rows` rows, of
    /// which the first `seq_k` are read.
    unit_kv: u64,
}

/// The softmax scale times log2(e), in `f32` (the kernel computes in base 2);
/// a shape error where that overflows.
fn attention_scale2(name: &'static str, a: &AttentionSpec) -> Result<f32> {
    let scale2 = (f64::from(a.scale) * std::f64::consts::LOG2_E) as f32;
    if !scale2.is_finite() {
        return Err(ComputeError::shape(
            name,
            "the softmax scale times log2(e) overflows f32",
            Op::Attention(*a).shapes(),
        ));
    }
    Ok(scale2)
}

/// Checks `a` against the device's limits (what the shader's arithmetic takes,
/// one unit's `f32` queries and keys within one storage binding, offsets
/// aligned, the grid, workgroup memory) and cuts it into pieces
/// ([`AttentionLayout`]). Free: nothing touches the device.
pub(crate) fn attention_layout(ctx: &Context, name: &'static str, a: &AttentionSpec) -> Result<AttentionLayout> {
    attention_scale2(name, a)?;
    let (sq, sk, d) = (a.seq_q as u64, a.seq_k as u64, a.head_dim as u64);
    for (len, what) in [(sq, "attention seq_q"), (sk, "attention seq_k")] {
        if len > ATTENTION_MAX_SEQ {
            return Err(errors::limit(name, what, len, ATTENTION_MAX_SEQ));
        }
    }
    for dv in 1..=ATTENTION_SLICE.min(d).div_ceil(64) {
        attention_kernel(ctx, name, dv, a.positions)?;
    }
    let positions = padded_bytes(a.batch.saturating_mul(a.seq_q));
    if a.positions && positions > ctx.max_binding() {
        return Err(errors::limit(
            name,
            "storage buffer binding bytes (attention positions)",
            positions,
            ctx.max_binding(),
        ));
    }
    let group = a.group() as u64;
    let units = (a.batch as u64).saturating_mul(a.heads_kv as u64);
    let unit_q = group.saturating_mul(sq).saturating_mul(d).saturating_mul(4);
    // A key/value head holds kv_rows rows (a KV cache's capacity), of which the
    // first seq_k are read; pieces bind whole heads.
    let unit_kv = (a.kv_rows() as u64).saturating_mul(d).saturating_mul(4);
    let max = ctx.max_binding();
    if unit_q > max {
        return Err(errors::limit(
            name,
            "storage buffer binding bytes (attention: one kv head's queries)",
            unit_q,
            max,
        ));
    }
    if unit_kv > max {
        return Err(errors::limit(name, "storage buffer binding bytes (attention: one kv head's keys)", unit_kv, max));
    }
    // Piece offsets must be multiples of the binding offset alignment in q and in k.
    let align = ctx.offset_align();
    let step = lcm(align / gcd(unit_q, align), align / gcd(unit_kv, align));
    let q_blocks = sq.div_ceil(ATTENTION_BLOCK);
    let maxg = u64::from(ctx.max_groups());
    let grid_units = maxg.saturating_mul(maxg).min(u64::from(u32::MAX)) / group.saturating_mul(q_blocks).max(1);
    let per = (max / unit_q.max(1)).min(max / unit_kv.max(1)).min(grid_units) / step * step;
    if per == 0 {
        let bytes = unit_q.max(unit_kv).saturating_mul(step);
        return Err(errors::limit(name, "storage buffer binding bytes (attention: aligned kv heads)", bytes, max));
    }
    Ok(AttentionLayout { units, per, group, q_blocks, unit_q, unit_kv })
}

/// The dispatches of attention `a` on `f32` views (`layout` from
/// [`attention_layout`]): one per piece of whole key/value heads and slice of
/// 256 output columns; with `positions` (`a.positions`: the query positions,
/// bound whole) the `attention_at` kernel, which counts each sequence's keys
/// from them.
#[allow(clippy::too_many_arguments)]
fn attention(
    ctx: &Context,
    name: &'static str,
    a: &AttentionSpec,
    layout: &AttentionLayout,
    [q, k, v]: [&View; 3],
    positions: Option<&View>,
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let d = a.head_dim as u64;
    let scale2 = attention_scale2(name, a)?;
    // Query i sees keys j ≤ i + offset; |offset| < 2³⁰ (attention_layout).
    // With positions, a mask aligned to the end moves with the key count:
    // offset = keys − seq_q, the shader adding the keys (`end_aligned`).
    let (offset, causal, end_aligned) = match (a.causal_offset(), positions.is_some(), a.mask) {
        (None, ..) => (0, 0, 0),
        (Some(_), true, Mask::Causal) => (-(to_u32(name, "seq_q", a.seq_q as u64)? as i32), 1, 1),
        (Some(off), ..) => (off as i32, 1, 0),
    };
    let heads_kv = to_u32(name, "kv heads", a.heads_kv as u64)?;
    let AttentionLayout { units, per, group, q_blocks, unit_q, unit_kv } = *layout;
    let mut u0 = 0;
    while u0 < units {
        let n = per.min(units - u0);
        let groups = n * group * q_blocks;
        let (qo, qs, ko, ks) = (u0 * unit_q, n * unit_q, u0 * unit_kv, n * unit_kv);
        // Slots 5–7: q, k and v again as vec4s (whole vec4s: the ranges start at
        // multiples of 16 bytes, and the buffers are padded to 16).
        let (q4, k4) = (qs.div_ceil(16) * 16, ks.div_ceil(16) * 16);
        let mut bindings = vec![
            bind(1, &q.buffer, qo, qs),
            bind(2, &k.buffer, ko, ks),
            bind(3, &v.buffer, ko, ks),
            bind(4, &y.buffer, qo, qs),
            bind(5, &q.buffer, qo, q4),
            bind(6, &k.buffer, ko, k4),
            bind(7, &v.buffer, ko, k4),
        ];
        if let Some(pos) = positions {
            bindings.push(bind(8, &pos.buffer, 0, padded_bytes(pos.len)));
        }
        let mut c0 = 0;
        while c0 < d {
            let dv = ATTENTION_SLICE.min(d - c0).div_ceil(64);
            steps.push(Step::Dispatch(Dispatch {
                kernel: attention_kernel(ctx, name, dv, positions.is_some())?,
                params: params(&[
                    to_u32(name, "seq_q", a.seq_q as u64)?,
                    to_u32(name, "seq_k", a.seq_k as u64)?,
                    to_u32(name, "head_dim", d)?,
                    to_u32(name, "query heads per kv head", group)?,
                    to_u32(name, "query blocks", q_blocks)?,
                    to_u32(name, "workgroups", groups)?,
                    offset as u32,
                    causal,
                    scale2.to_bits(),
                    to_u32(name, "head_dim", c0)?,
                    u32::from(d.is_multiple_of(4)),
                    to_u32(name, "kv rows", a.kv_rows() as u64)?,
                    to_u32(name, "units", u0)?,
                    heads_kv,
                    end_aligned,
                ]),
                bindings: bindings.clone(),
                groups: grid(ctx, name, groups)?,
            }));
            c0 += ATTENTION_SLICE;
        }
        u0 += n;
    }
    Ok(())
}

/// `MatmulTiles::Auto` for an aligned `batch × m × n` output: the configuration
/// measured fastest on an H200 (132 SMs) for that many tiles (`docs/wgpu.md`,
/// sweeps of 2026-11-21 at 1024³, 2048³, 4096³ and 8192³); the small kernel's
/// 64 × 64 tiles below, where larger ones leave most of the GPU idle.
fn auto_tiles(m: u64, n: u64, batch: u64) -> MatmulKernel {
    let tiles = |tm: u64, tn: u64| m.div_ceil(tm).saturating_mul(n.div_ceil(tn)).saturating_mul(batch);
    if tiles(128, 128) >= 256 {
        MatmulKernel::Tiled(TiledMatmul::AUTO_LARGE)
    } else if tiles(128, 64) >= 128 {
        MatmulKernel::Tiled(TiledMatmul::AUTO_MEDIUM)
    } else {
        MatmulKernel::Small
    }
}

/// `MatmulTiles::AutoSplitK`: [`auto_tiles`], except that shapes of fewer than
/// 512 tiles of 128 × 128 which it gives `AUTO_LARGE` or `AUTO_MEDIUM` take
/// `AUTO_LARGE` with k cut into 2 slices (from 256 tiles) or 4 (below), each
/// slice at least 128 long (else 2, else no split). For the sweep: measured
/// slower than `Auto` at 1024³ and 2048³ on the H200 (`docs/wgpu.md`).
fn auto_split_k(m: u64, k: u64, n: u64, batch: u64) -> MatmulKernel {
    let base = auto_tiles(m, n, batch);
    let tiles = m.div_ceil(128).saturating_mul(n.div_ceil(128)).saturating_mul(batch);
    if base == MatmulKernel::Small || tiles >= 512 {
        return base;
    }
    let wanted = if tiles >= 256 { 2 } else { 4 };
    match [wanted, 2].into_iter().find(|&s| k / u64::from(s) >= 128) {
        Some(s) => TiledMatmul::AUTO_LARGE.with_split_k(s).map_or(base, MatmulKernel::Tiled),
        None => base,
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// Sum, max (code 0, 1: `b` is `x`) or dot (code 2) of `len` elements of
/// any dtype into the `f32` `out[0]`: partials per piece into a scratch
/// buffer, then one workgroup finishes.
#[allow(clippy::too_many_arguments)]
fn reduce(
    ctx: &Context,
    name: &'static str,
    code: u32,
    x: &View,
    b: &View,
    len: usize,
    out: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let parts: Vec<(u64, u64, u64)> = pieces(ctx, name, len, &[x.dtype])?
        .into_iter()
        .map(|(start, n)| (start, n, n.div_ceil(4).div_ceil(256 * REDUCE_PER_INVOCATION).clamp(1, MAX_PARTIALS)))
        .collect();
    let total: u64 = parts.iter().map(|p| p.2).sum();
    // Two floats per partial (`reduce.wgsl`: a sum's normal and scaled subnormal terms).
    let scratch_bytes = padded_bytes(2 * total as usize);
    let scratch = ctx.cache.take(ctx, Use::Storage, scratch_bytes, name)?;
    steps.push(Step::Scratch(scratch.clone()));
    let mut first = 0;
    for (start, n, groups) in parts {
        let (off, size) = (start * x.size(), padded_bytes_of(n as usize, x.dtype));
        steps.push(Step::Dispatch(Dispatch {
            kernel: Kernel::ReducePartials(code, x.dtype),
            params: params(&[to_u32(name, "elements", n)?, to_u32(name, "partials", first)?]),
            bindings: vec![
                bind(1, &x.buffer, off, size),
                bind(2, &b.buffer, off, size),
                bind(3, &scratch, 0, scratch_bytes),
            ],
            groups: [to_u32(name, "workgroups", groups)?, 1, 1],
        }));
        first += groups;
    }
    steps.push(Step::Dispatch(Dispatch {
        kernel: Kernel::ReduceFinish(code),
        params: params(&[to_u32(name, "partials", total)?]),
        bindings: vec![bind(4, &scratch, 0, scratch_bytes), bind(5, &out.buffer, 0, padded_bytes(out.len))],
        groups: [1, 1, 1],
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcd_of_row_bytes_and_alignment() {
        assert_eq!(gcd(4 * 17, 256), 4);
        assert_eq!(gcd(4096, 256), 256);
        assert_eq!(gcd(0, 0), 1);
        assert_eq!(lcm(256 / gcd(2 * 17, 256), 256 / gcd(4 * 17, 256)), 128);
        assert_eq!(lcm(4, 128), 128);
    }

    #[test]
    fn every_dtype_of_the_vocabulary_is_supported() {
        use compute_core::{MatmulSpec, Strided};
        for d in DType::ALL {
            assert!(supported(&Op::unary(UnaryOp::Relu, 3).with_dtype(d)), "{d}");
            assert!(supported(&Op::reduce(ReduceOp::Max, 3).with_dtype(d)), "{d}");
            let rope = compute_core::RopeSpec::new(1, 2, 4, 10_000.0);
            let copy =
                compute_core::CopySpec::new([1, 1, 3], Strided::contiguous([1, 1, 3]), Strided::contiguous([1, 1, 3]));
            for op in [
                Op::Rope(rope),
                Op::Copy(copy),
                Op::Gather { ids: 2, rows: 3, cols: 4, dtype: d },
                Op::ArgMax { rows: 2, cols: 3, dtype: d },
                Op::binary(BinaryOp::SwiGlu, 3),
            ] {
                assert!(supported(&op.with_dtype(d)), "{op:?} on {d}");
            }
            for to in DType::ALL {
                assert!(supported(&Op::cast(3, d, to)), "{d} → {to}");
                assert!(supported(&Op::Matmul(MatmulSpec::new(2, 3, 4).with_dtypes(d, to))), "{d} → {to}");
                for w in DType::QUANTIZED {
                    let spec = compute_core::QuantMatmulSpec::new(2, 256, 3, w).with_dtypes(d, to);
                    assert!(supported(&Op::QuantMatmul(spec)), "{w}: {d} → {to}");
                }
            }
            for w in DType::QUANTIZED {
                assert!(supported(&Op::cast(256, w, d)), "{w} → {d}");
                assert!(supported(&Op::cast(256, w, w)), "{w} → {w}");
                let quantize = Op::cast(256, d, w);
                assert!(!supported(&quantize), "{d} → {w}");
                assert!(matches!(unsupported_dtype(&quantize), ComputeError::UnsupportedDType { .. }));
            }
        }
    }

    #[test]
    fn auto_takes_the_measured_best_tiling_for_the_shape() {
        let tiled = |t| MatmulKernel::Tiled(t);
        assert_eq!(auto_tiles(8192, 8192, 1), tiled(TiledMatmul::AUTO_LARGE));
        assert_eq!(auto_tiles(4096, 4096, 1), tiled(TiledMatmul::AUTO_LARGE));
        assert_eq!(auto_tiles(2048, 2048, 4), tiled(TiledMatmul::AUTO_LARGE));
        assert_eq!(auto_tiles(2048, 2048, 1), tiled(TiledMatmul::AUTO_LARGE));
        assert_eq!(auto_tiles(4000, 1000, 1), tiled(TiledMatmul::AUTO_LARGE));
        assert_eq!(auto_tiles(1024, 1024, 1), tiled(TiledMatmul::AUTO_MEDIUM));
        assert_eq!(auto_tiles(512, 512, 1), MatmulKernel::Small);
        assert_eq!(auto_tiles(u64::MAX, u64::MAX, u64::MAX), tiled(TiledMatmul::AUTO_LARGE));
        let sk = |s| tiled(TiledMatmul::AUTO_LARGE.with_split_k(s).unwrap());
        assert_eq!(auto_split_k(4096, 4096, 4096, 1), tiled(TiledMatmul::AUTO_LARGE));
        assert_eq!(auto_split_k(2048, 2048, 2048, 1), sk(2));
        assert_eq!(auto_split_k(1024, 1024, 1024, 1), sk(4));
        assert_eq!(auto_split_k(1024, 300, 1024, 1), sk(2));
        assert_eq!(auto_split_k(1024, 200, 1024, 1), tiled(TiledMatmul::AUTO_MEDIUM));
        assert_eq!(auto_split_k(512, 4096, 512, 1), MatmulKernel::Small);
    }

    #[test]
    fn coop_takes_f16_inputs_of_whole_vec4_rows_and_declines_the_rest() {
        use compute_core::MatmulSpec;
        let (wg, inv) = (48 << 10, 1024);
        let f16 = |m, k, n| MatmulSpec::new(m, k, n).with_dtypes(DType::F16, DType::F16);
        let pick = |s: MatmulSpec| coop_tiles(CoopMatmul::Auto, &s, wg, inv);
        assert_eq!(pick(f16(4096, 4096, 4096)), Some(CoopTiles::AUTO_LARGE));
        assert_eq!(pick(f16(8192, 8192, 8192)), Some(CoopTiles::AUTO_LARGE));
        assert_eq!(pick(f16(1024, 1024, 1024)), Some(CoopTiles::AUTO_SMALL));
        assert_eq!(pick(f16(1, 8, 8)), Some(CoopTiles::AUTO_SMALL));
        // m of any size (n too with B transposed, `x·Wᵀ`); every output dtype of the kernel.
        assert!(pick(f16(4095, 4096, 4096)).is_some());
        assert!(pick(MatmulSpec { trans_b: true, ..f16(4095, 4096, 4093) }).is_some());
        for out in [DType::F32, DType::BF16] {
            assert!(pick(MatmulSpec::new(64, 64, 64).with_dtypes(DType::F16, out)).is_some(), "{out}");
        }
        // Inputs other than f16 stay on the f32 kernels (bf16: f16's range is the data's business).
        for d in [DType::F32, DType::BF16] {
            assert_eq!(pick(MatmulSpec::new(4096, 4096, 4096).with_dtypes(d, d)), None, "{d}");
            assert_eq!(pick(MatmulSpec::new(4096, 4096, 4096).with_dtypes(d, DType::F32)), None, "{d}");
        }
        // Rows of A (k) or B (n) that are not whole vec4<f16>s; transposed, m and k.
        assert_eq!(pick(f16(64, 63, 64)), None);
        assert_eq!(pick(f16(64, 64, 62)), None);
        assert!(pick(f16(64, 60, 68)).is_some());
        let t = |m, k, n, ta, tb| MatmulSpec { trans_a: ta, trans_b: tb, ..f16(m, k, n) };
        assert!(pick(t(64, 63, 62, true, false)).is_none());
        assert!(pick(t(64, 64, 63, true, true)).is_some());
        assert!(pick(t(64, 62, 63, true, true)).is_none());
        assert!(pick(t(62, 64, 63, true, true)).is_none());
        assert!(pick(t(63, 64, 61, false, true)).is_some());
        // Off, a device's workgroup memory or invocations too small for the configuration.
        assert_eq!(coop_tiles(CoopMatmul::Off, &f16(4096, 4096, 4096), wg, inv), None);
        assert_eq!(coop_tiles(CoopMatmul::Auto, &f16(4096, 4096, 4096), 16 << 10, inv), None);
        assert_eq!(coop_tiles(CoopMatmul::Auto, &f16(4096, 4096, 4096), wg, 64), None);
        let wide = CoopTiles::parse("coop-128x256-16-w2x4").unwrap();
        assert_eq!(coop_tiles(CoopMatmul::Tiles(wide), &f16(64, 64, 64), wg, inv), Some(wide));
        assert_eq!(coop_tiles(CoopMatmul::Tiles(wide), &f16(64, 64, 64), wg, 128), None);
        // Every configuration of the sweep fits 48 KiB with either operand transposed; a
        // byte less than one needs is refused.
        for c in CoopTiles::all() {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let need = coop_matmul::workgroup_bytes(c, ta, tb);
                assert!(need <= wg, "{c}: {need}");
                let s = t(64, 64, 64, ta, tb);
                assert_eq!(coop_tiles(CoopMatmul::Tiles(c), &s, need, inv), Some(c));
                assert_eq!(coop_tiles(CoopMatmul::Tiles(c), &s, need - 1, inv), None);
            }
        }
        // Two buffers of each tile (8 bytes a unit of 4 halves, rows padded by 8 halves)
        // and the subgroups' staging slices: 128 × 256 tiles, K step 16, 8 subgroups.
        let tiles = 2 * (128 * (16 + 8) / 4 + 16 * (256 + 8) / 4);
        assert_eq!(coop_matmul::workgroup_bytes(CoopTiles::AUTO_LARGE, false, false), 8 * tiles + 8 * 1024);
    }

    #[test]
    fn op_codes_match_the_shader_switches() {
        assert_eq!(unary_code(UnaryOp::Relu).0, 0);
        assert_eq!(unary_code(UnaryOp::Clip { min: -1.0, max: 2.0 }), (8, -1.0, 2.0));
        assert_eq!(unary_code(UnaryOp::Scale { s: 3.0 }), (9, 3.0, 0.0));
        assert_eq!(binary_code(BinaryOp::Mul), 2);
        assert_eq!(binary_code(BinaryOp::SwiGlu), 4);
        assert_ne!(binary_code(BinaryOp::SwiGlu), LERP_CODE);
        assert_eq!(params(&[1, 2, 3])[..4], [1, 2, 3, 0]);
    }
}

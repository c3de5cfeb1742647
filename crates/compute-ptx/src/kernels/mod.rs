//! The core kernel set, written with the [builder](crate::builder).
//!
//! [`catalog`] lists every kernel the CUDA backend launches (element-wise,
//! reduction and row kernels once per dtype, through [`elem`]); `cargo xtask ptx`
//! writes each one's PTX for every [`Target`] into the top-level `ptx/` folder,
//! and the golden test checks those files against what this code emits.
//!
//! [`GemmKernel`] is a single entry to the three GEMM tiers for callers who
//! want a kernel's PTX and launch shape without the CUDA backend
//! (`GemmKernel::tiled(m, n, k, 32).emit_ptx()`).

pub mod attention;
mod attention_pingpong;
pub mod attention_tma;
pub mod attention_wgmma;
pub mod conv;
pub mod decoder;
pub mod elem;
pub mod elementwise;
mod gemm_common;
pub mod gemm_epilogue;
mod gemm_kernel;
pub mod gemm_mma;
pub mod gemm_simple;
pub mod gemm_simt;
pub mod gemm_tma;
pub mod gemm_wgmma;
pub mod gemv;
pub mod interpolate;
pub(crate) mod math;
pub mod quant;
pub mod quant_gemv;
pub mod reduce;
pub mod rows;
mod unroll;

pub use gemm_kernel::GemmKernel;

use crate::builder::{BuildError, Kernel, Target};
use attention::FlashConfig;
use attention_wgmma::HopperConfig;
use compute_core::quant::BlockFormat;
use compute_core::{Activation, BinaryOp, DType, GeluForm, RopeLayout};
use elementwise::UnaryKind;
use gemm_epilogue::EpilogueKind;
use gemm_mma::MmaConfig;
use gemm_simt::SimtConfig;
use gemm_tma::TmaConfig;
use gemm_wgmma::WgmmaConfig;
use quant_gemv::XFusion;
use reduce::ReduceKind;
use rows::{RowKind, RowShape};

/// Identifies one kernel of the set: the op, the storage dtype it reads and
/// writes (`f32`, `f16`, `bf16`; see [`elem`]) and, for the SIMT GEMM, its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// A unary element-wise op on a dtype.
    Unary(UnaryKind, DType),
    /// add, sub or mul on a dtype.
    Binary(BinaryOp, DType),
    /// sum, max or the first stage of dot, over input of a dtype (`f32` result).
    Reduce(ReduceKind, DType),
    /// A row op with its thread-group shape, on a dtype.
    Rows(RowKind, RowShape, DType),
    /// A conversion between two dtypes.
    Cast(DType, DType),
    /// lerp on a dtype.
    Lerp(DType),
    /// slerp on a dtype (one warp per row).
    Slerp(DType),
    /// One thread per output GEMM.
    GemmNaive,
    /// Shared-memory tiled GEMM.
    GemmTiled,
    /// Register-blocked GEMM: shape and transposes.
    GemmSimt(SimtConfig, bool, bool),
    /// Tensor-core GEMM: shape, input dtype (`f16`/`bf16`), output dtype,
    /// transposes, epilogue (`None`: the plain product).
    GemmMma(MmaConfig, DType, DType, bool, bool, Option<EpilogueKind>),
    /// Hopper `wgmma` GEMM (`sm_90a`): shape, input dtype, output dtype,
    /// transposes, epilogue.
    GemmWgmma(WgmmaConfig, DType, DType, bool, bool, Option<EpilogueKind>),
    /// Hopper `wgmma` GEMM fed by TMA, warp-specialised and persistent
    /// (`sm_90a`): shape, input dtype, output dtype, transposes, epilogue.
    GemmTma(TmaConfig, DType, DType, bool, bool, Option<EpilogueKind>),
    /// A matmul epilogue as its own pass over an `f32` product: kind, output dtype.
    GemmEpilogue(EpilogueKind, DType),
    /// GEMV for few rows, `B` stored `n × k`, on CUDA cores: row count (1,
    /// 2, 4, 8, 16), input dtype, output dtype.
    GemvNt(u32, DType, DType, Option<EpilogueKind>),
    /// GEMV for up to 16 rows, `B` stored `n × k`, on tensor cores
    /// (`mma.sync`): 8-column tiles per warp group (1, 2, 4), input dtype
    /// (`f16`/`bf16`), output dtype, epilogue.
    GemvNtMma(u32, DType, DType, Option<EpilogueKind>),
    /// GEMV for few rows, `B` stored `k × n`, writing `f32` k-split partials:
    /// row count, input dtype.
    GemvNn(u32, DType),
    /// Sums the GEMV k-split partials in order into an output dtype.
    GemvCombine(DType),
    /// im2col for conv2d.
    Im2col,
    /// Fused attention on tensor cores (`f16`/`bf16`): shape and dtype.
    AttentionFlash(FlashConfig, DType),
    /// Fused attention on `f32`, for one head size.
    AttentionSimt(u32),
    /// The key-split form of [`KernelId::AttentionFlash`] (flash-decoding).
    AttentionFlashSplit(FlashConfig, DType),
    /// Merges the key splits into rows of a dtype: head size, dtype.
    AttentionCombine(u32, DType),
    /// Splits `f32` values into bf16 high and low parts (for attention on `f32`).
    SplitBf16,
    /// `f32` values rounded to nearest TF32 (before a TF32 GEMM that reads its operands as they are).
    RoundTf32,
    /// Hopper attention (`wgmma`, `sm_90a`): shape and dtype.
    AttentionWgmma(HopperConfig, DType),
    /// Block-quantized weights to values: format, output dtype.
    Dequant(BlockFormat, DType),
    /// Activations of a dtype to int8 per 32 values, for [`KernelId::QuantGemv`].
    QuantizeX(DType),
    /// Product of few activation rows with block-quantized weights (`dp4a`):
    /// format, row count (1, 2, 4, 8, 16), output dtype.
    QuantGemv(BlockFormat, u32, DType),
    /// [`KernelId::QuantGemv`] for 1, 2 or 4 rows quantizing the activations
    /// itself: format, row count, weight rows a warp takes at a time and
    /// whether the rows are long ([`quant_gemv::x_long`]), input dtype,
    /// output dtype, and what it fuses (a norm before, gated halves or an
    /// epilogue in its stores).
    QuantGemvX(BlockFormat, (u32, u32, bool), DType, DType, quant_gemv::XFusion),
    /// One-row product with `Q4_K` weights whose warps each keep a slice of
    /// the activations in registers, quantized there
    /// ([`quant_gemv::split`]): format, input dtype, output dtype, the
    /// epilogue in its stores.
    QuantGemvSplit(BlockFormat, DType, DType, Option<EpilogueKind>),
    /// Rotary position embedding: pair layout, dtype.
    Rope(RopeLayout, DType),
    /// 3-D strided copy of units of this many bytes (2, 4, 8 or 16).
    Copy(u32),
    /// Rows of a table picked by `f32` ids, elements of this many bytes (2 or 4).
    Gather(u32),
    /// Index of each row's largest value, over rows of a dtype.
    ArgMax(DType),
    /// Gated product of fused gate/up rows, on a dtype.
    Glu(DType),
}

impl KernelId {
    /// The kernel's entry-point name (also its file name in `ptx/<target>/`).
    pub fn name(&self) -> String {
        match self {
            KernelId::Unary(k, d) => elementwise::unary_name(*k, *d),
            KernelId::Binary(op, d) => elementwise::binary_name(*op, *d),
            KernelId::Reduce(k, d) => k.kernel_name(*d),
            KernelId::Rows(k, s, d) => k.kernel_name(*s, *d),
            KernelId::Cast(from, to) => elementwise::cast_name(*from, *to),
            KernelId::Lerp(d) => interpolate::lerp_name(*d),
            KernelId::Slerp(d) => interpolate::slerp_name(*d),
            KernelId::GemmNaive => "gemm_naive".into(),
            KernelId::GemmTiled => "gemm_tiled".into(),
            KernelId::GemmSimt(cfg, ta, tb) => cfg.kernel_name(*ta, *tb),
            KernelId::GemmMma(cfg, i, o, ta, tb, e) => cfg.kernel_name(*i, *o, *ta, *tb) + &EpilogueKind::suffix(*e),
            KernelId::GemmWgmma(cfg, i, o, ta, tb, e) => cfg.kernel_name(*i, *o, *ta, *tb) + &EpilogueKind::suffix(*e),
            KernelId::GemmTma(cfg, i, o, ta, tb, e) => cfg.kernel_name(*i, *o, *ta, *tb) + &EpilogueKind::suffix(*e),
            KernelId::GemmEpilogue(e, o) => gemm_epilogue::standalone_name(*e, *o),
            KernelId::GemvNt(r, i, o, e) => gemv::nt_name(*r, *i, *o) + &EpilogueKind::suffix(*e),
            KernelId::GemvNtMma(t, i, o, e) => gemv::mma_name(*t, *i, *o) + &EpilogueKind::suffix(*e),
            KernelId::GemvNn(r, i) => gemv::nn_name(*r, *i),
            KernelId::GemvCombine(o) => gemv::combine_name(*o),
            KernelId::Im2col => "im2col".into(),
            KernelId::AttentionFlash(cfg, d) => cfg.kernel_name(*d),
            KernelId::AttentionSimt(d) => format!("attention_simt_f32_d{d}"),
            KernelId::AttentionFlashSplit(cfg, d) => format!("{}_split", cfg.kernel_name(*d)),
            KernelId::AttentionCombine(hd, d) => format!("attention_combine{}_d{hd}", elem::suffix(*d)),
            KernelId::SplitBf16 => "split_f32_bf16x2".into(),
            KernelId::RoundTf32 => "round_tf32".into(),
            KernelId::AttentionWgmma(cfg, d) => cfg.kernel_name(*d),
            KernelId::Dequant(f, d) => quant::dequant_name(*f, *d),
            KernelId::QuantizeX(d) => quant::quantize_x_name(*d),
            KernelId::QuantGemv(f, r, d) => quant_gemv::name(*f, *r, *d),
            KernelId::QuantGemvX(f, r, i, o, x) => quant_gemv::x_name(*f, *r, *i, *o, *x),
            KernelId::QuantGemvSplit(f, i, o, e) => quant_gemv::split::name(*f, *i, *o, *e),
            KernelId::Rope(l, d) => decoder::rope_name(*l, *d),
            KernelId::Copy(bytes) => decoder::copy_name(*bytes),
            KernelId::Gather(bytes) => decoder::gather_name(*bytes),
            KernelId::ArgMax(d) => decoder::argmax_name(*d),
            KernelId::Glu(d) => elementwise::glu_name(*d),
        }
    }

    /// Emits the kernel's PTX for `target`. Pure Rust, no GPU; well under a
    /// millisecond for most kernels, a few for the SIMT GEMM.
    pub fn build(&self, target: Target) -> Result<Kernel, BuildError> {
        let unsupported: Vec<DType> = self.dtypes().into_iter().filter(|&d| !elem::supported(d)).collect();
        if !unsupported.is_empty() {
            return Err(BuildError {
                kernel: self.name(),
                problems: unsupported.iter().map(|d| format!("no kernels read or write {d}")).collect(),
            });
        }
        match *self {
            KernelId::Unary(k, d) => elementwise::unary(k, d, target),
            KernelId::Binary(op, d) => elementwise::binary(op, d, target),
            KernelId::Reduce(k, d) => reduce::reduce(k, d, target),
            KernelId::Rows(k, s, d) => rows::row_kernel(k, s, d, target),
            KernelId::Cast(from, to) => elementwise::cast(from, to, target),
            KernelId::Lerp(d) => interpolate::lerp(d, target),
            KernelId::Slerp(d) => interpolate::slerp(d, target),
            KernelId::GemmNaive => gemm_simple::naive(target),
            KernelId::GemmTiled => gemm_simple::tiled(target),
            KernelId::GemmSimt(cfg, ta, tb) => gemm_simt::simt(&cfg, ta, tb, target),
            KernelId::GemmMma(cfg, i, o, ta, tb, e) => gemm_mma::mma(&cfg, i, o, (ta, tb), e, target),
            KernelId::GemmWgmma(cfg, i, o, ta, tb, e) => gemm_wgmma::wgmma(&cfg, i, o, (ta, tb), e, target),
            KernelId::GemmTma(cfg, i, o, ta, tb, e) => gemm_tma::gemm_tma(&cfg, i, o, (ta, tb), e, target),
            KernelId::GemmEpilogue(e, o) => gemm_epilogue::standalone(e, o, target),
            KernelId::GemvNt(r, i, o, e) => gemv::nt(r, i, o, e, target),
            KernelId::GemvNtMma(t, i, o, e) => gemv::nt_mma(t, i, o, e, target),
            KernelId::GemvNn(r, i) => gemv::nn(r, i, target),
            KernelId::GemvCombine(o) => gemv::combine(o, target),
            KernelId::Im2col => conv::im2col(target),
            KernelId::AttentionFlash(cfg, d) => attention::flash(&cfg, d, target),
            KernelId::AttentionSimt(d) => attention::simt(d, target),
            KernelId::AttentionFlashSplit(cfg, d) => attention::flash_split(&cfg, d, target),
            KernelId::AttentionCombine(hd, d) => attention::combine(hd, d, target),
            KernelId::SplitBf16 => attention::split_bf16(target),
            KernelId::RoundTf32 => elementwise::round_tf32(target),
            KernelId::AttentionWgmma(cfg, d) => attention_wgmma::hopper(&cfg, d, target),
            KernelId::Dequant(f, d) => quant::dequant(f, d, target),
            KernelId::QuantizeX(d) => quant::quantize_x(d, target),
            KernelId::QuantGemv(f, r, d) => quant_gemv::qgemv(f, r, d, target),
            KernelId::QuantGemvX(f, r, i, o, e) => quant_gemv::qgemv_x(f, r, i, o, e, target),
            KernelId::QuantGemvSplit(f, i, o, e) => quant_gemv::split::qgemv_split(f, i, o, e, target),
            KernelId::Rope(l, d) => decoder::rope(l, d, target),
            KernelId::Copy(bytes) => decoder::copy(bytes, target),
            KernelId::Gather(bytes) => decoder::gather(bytes, target),
            KernelId::ArgMax(d) => decoder::argmax(d, target),
            KernelId::Glu(d) => elementwise::glu(d, target),
        }
    }
}

impl KernelId {
    /// The targets its checked-in PTX is emitted for: [`Target::ALL`], or
    /// `sm_90a` alone for a `wgmma` kernel.
    pub fn targets(&self) -> Vec<Target> {
        match self {
            KernelId::GemmWgmma(..) | KernelId::GemmTma(..) | KernelId::AttentionWgmma(..) => vec![Target::Sm90a],
            _ => Target::ALL.to_vec(),
        }
    }

    /// The target to build it for on a device whose base target is `base`:
    /// `sm_90a` for a `wgmma` kernel (the device must be compute capability
    /// 9.0), `base` otherwise.
    pub fn target_on(&self, base: Target) -> Target {
        match self {
            KernelId::GemmWgmma(..) | KernelId::GemmTma(..) | KernelId::AttentionWgmma(..) => Target::Sm90a,
            _ => base,
        }
    }

    /// The storage dtypes the kernel reads or writes.
    pub fn dtypes(&self) -> Vec<DType> {
        match *self {
            KernelId::Unary(_, d)
            | KernelId::Binary(_, d)
            | KernelId::Reduce(_, d)
            | KernelId::Rows(_, _, d)
            | KernelId::Lerp(d)
            | KernelId::Slerp(d)
            | KernelId::GemvNn(_, d)
            | KernelId::GemvCombine(d)
            | KernelId::AttentionFlash(_, d)
            | KernelId::AttentionFlashSplit(_, d)
            | KernelId::AttentionWgmma(_, d)
            | KernelId::AttentionCombine(_, d)
            | KernelId::Dequant(_, d)
            | KernelId::QuantizeX(d)
            | KernelId::QuantGemv(_, _, d)
            | KernelId::Rope(_, d)
            | KernelId::Glu(d)
            | KernelId::GemmEpilogue(_, d)
            | KernelId::ArgMax(d) => {
                vec![d]
            }
            KernelId::Cast(from, to)
            | KernelId::GemmMma(_, from, to, ..)
            | KernelId::GemmWgmma(_, from, to, ..)
            | KernelId::GemmTma(_, from, to, ..)
            | KernelId::GemvNt(_, from, to, _)
            | KernelId::GemvNtMma(_, from, to, _)
            | KernelId::QuantGemvX(_, _, from, to, _)
            | KernelId::QuantGemvSplit(_, from, to, _) => {
                vec![from, to]
            }
            _ => vec![DType::F32],
        }
    }
}

/// Every kernel of the checked-in set, in a fixed order: per dtype the
/// element-wise, reduction, row and interpolation kernels, then the casts, the `f32` GEMMs,
/// the tensor-core GEMMs (`bf16`/`f16` inputs, every output dtype and
/// transpose; `mma.sync`, and `wgmma` for `sm_90a` only, see
/// [`KernelId::targets`]; one of each with a matmul epilogue, and the
/// standalone epilogue pass per output dtype), the GEMV kernels for few rows (every row count,
/// input and output dtype, both layouts of `B` (`k × n` up to 8 rows), the
/// tensor-core GEMV of the plans' tiles for half inputs, and the k-split
/// combine),
/// im2col, the attention kernels, and the block-quantized weight kernels
/// (per format the dequantize kernels, the `dp4a` GEMV of every row count
/// and output dtype and the one that quantizes its activations for 1, 2 and
/// 4 rows and every input and output dtype; the activation quantizer per
/// input dtype), then the decoder kernels (per dtype the rotary embedding of
/// both layouts and argmax; the strided copy per unit size and the gather
/// per element size).
pub fn catalog() -> Vec<KernelId> {
    let mut v = Vec::new();
    for d in elem::DTYPES {
        v.extend(UnaryKind::ALL.iter().map(|&k| KernelId::Unary(k, d)));
        v.extend([BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::SwiGlu].map(|op| KernelId::Binary(op, d)));
        v.extend([ReduceKind::Sum, ReduceKind::Max, ReduceKind::Dot].map(|k| KernelId::Reduce(k, d)));
        for k in RowKind::ALL {
            v.push(KernelId::Rows(k, RowShape::Warp, d));
            v.push(KernelId::Rows(k, RowShape::Block, d));
        }
        v.push(KernelId::Lerp(d));
        v.push(KernelId::Slerp(d));
    }
    for from in elem::DTYPES {
        for to in elem::DTYPES {
            if from != to {
                v.push(KernelId::Cast(from, to));
            }
        }
    }
    v.push(KernelId::GemmNaive);
    v.push(KernelId::GemmTiled);
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        v.push(KernelId::GemmSimt(SimtConfig::default(), ta, tb));
    }
    for input in [DType::BF16, DType::F16] {
        for output in elem::DTYPES {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                v.push(KernelId::GemmMma(MmaConfig::default(), input, output, ta, tb, None));
            }
        }
    }
    for input in [DType::BF16, DType::F16] {
        for output in elem::DTYPES {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                v.push(KernelId::GemmWgmma(WgmmaConfig::default(), input, output, ta, tb, None));
            }
        }
    }
    v.push(KernelId::GemmWgmma(WgmmaConfig::tf32(), DType::F32, DType::F32, false, true, None));
    for input in [DType::BF16, DType::F16] {
        for output in elem::DTYPES {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                v.push(KernelId::GemmTma(TmaConfig::default(), input, output, ta, tb, None));
            }
        }
    }
    v.push(KernelId::GemmTma(TmaConfig::tf32().kernel(), DType::F32, DType::F32, false, true, None));
    // Epilogues: each tensor-core kernel with one (the others are built on
    // first use), and the standalone pass with all three parts on every dtype.
    let full = |activation| EpilogueKind { bias: true, c: true, activation: Some(activation) };
    let silu = full(Activation::Silu);
    v.push(KernelId::GemmMma(MmaConfig::default(), DType::F16, DType::F16, false, true, Some(silu)));
    v.push(KernelId::GemmWgmma(WgmmaConfig::default(), DType::BF16, DType::F32, false, false, Some(silu)));
    v.push(KernelId::GemmTma(TmaConfig::default(), DType::BF16, DType::BF16, false, true, Some(silu)));
    v.extend(elem::DTYPES.map(|d| KernelId::GemmEpilogue(full(Activation::Gelu(GeluForm::Erf)), d)));
    v.push(KernelId::GemvNt(
        1,
        DType::BF16,
        DType::BF16,
        Some(EpilogueKind { bias: false, c: true, activation: None }),
    ));
    v.push(KernelId::GemvNtMma(gemv::MMA_DEFAULT_TILES, DType::F16, DType::F32, Some(silu)));
    v.push(KernelId::RoundTf32);
    for input in elem::DTYPES {
        for rows in gemv::ROWS {
            v.extend(elem::DTYPES.map(|output| KernelId::GemvNt(rows, input, output, None)));
            if rows as usize <= gemv::NN_MAX_ROWS {
                v.push(KernelId::GemvNn(rows, input));
            }
        }
    }
    for input in [DType::BF16, DType::F16] {
        v.extend(elem::DTYPES.map(|output| KernelId::GemvNtMma(gemv::MMA_DEFAULT_TILES, input, output, None)));
    }
    v.extend(elem::DTYPES.map(KernelId::GemvCombine));
    v.push(KernelId::Im2col);
    for d in [64, 128] {
        for dtype in [DType::BF16, DType::F16] {
            v.push(KernelId::AttentionFlash(FlashConfig::for_head_dim(d), dtype));
            v.push(KernelId::AttentionFlashSplit(FlashConfig::for_decode(d), dtype));
            v.push(KernelId::AttentionCombine(d as u32, dtype));
        }
        v.push(KernelId::AttentionFlash(FlashConfig::for_f32(d), DType::F32));
        for dtype in [DType::BF16, DType::F16] {
            let h = HopperConfig::for_head_dim(d);
            v.push(KernelId::AttentionWgmma(h, dtype));
            if h.without_tma() != h {
                v.push(KernelId::AttentionWgmma(h.without_tma(), dtype));
            }
        }
        v.push(KernelId::AttentionSimt(d as u32));
    }
    v.push(KernelId::SplitBf16);
    for format in quant::FORMATS {
        v.extend(elem::DTYPES.map(|d| KernelId::Dequant(format, d)));
        for rows in quant_gemv::ROWS {
            v.extend(elem::DTYPES.map(|d| KernelId::QuantGemv(format, rows, d)));
        }
        // The one-launch products for each input dtype with the same output,
        // and f32 out of bf16: every load and store path, without the other
        // pairs (the same code); for long rows, one row in f32 and bf16 with
        // both of the plan's weight rows a warp.
        for rows in quant_gemv::X_ROWS {
            let shape = (rows, quant_gemv::x_weight_rows(format, rows), false);
            for (input, out) in elem::DTYPES.map(|d| (d, d)).into_iter().chain([(DType::BF16, DType::F32)]) {
                v.push(KernelId::QuantGemvX(format, shape, input, out, XFusion::default()));
            }
        }
        if quant_gemv::split::supported(format) {
            for (input, out) in elem::DTYPES.map(|d| (d, d)).into_iter().chain([(DType::BF16, DType::F32)]) {
                v.push(KernelId::QuantGemvSplit(format, input, out, None));
            }
        }
        let full = quant_gemv::x_weight_rows(format, 1);
        for (rw, d) in [full, full / 2].into_iter().flat_map(|rw| [(rw, DType::F32), (rw, DType::BF16)]) {
            v.push(KernelId::QuantGemvX(format, (1, rw, true), d, d, XFusion::default()));
        }
    }
    // The decoder's one-row products: a residual add in the stores, the
    // norm before the q/k/v and gate/up products, the gated halves.
    let residual = EpilogueKind { bias: false, c: true, activation: None };
    // With 2 weight rows a warp as well: the products of fewer rows than
    // multiprocessors times 32.
    let fused = [
        XFusion::default(),
        XFusion::epilogue(Some(residual)),
        XFusion { norm: true, ..XFusion::default() },
        XFusion { norm: true, glu: true, epilogue: None },
    ];
    for w in [4, 2] {
        for x in fused.into_iter().filter(|x| w == 2 || *x != XFusion::default()) {
            v.push(KernelId::QuantGemvX(BlockFormat::Q4K, (1, w, false), DType::BF16, DType::BF16, x));
        }
    }
    // The down projection's residual add on the split kernel (long rows).
    v.push(KernelId::QuantGemvSplit(BlockFormat::Q4K, DType::BF16, DType::BF16, Some(residual)));
    v.extend(elem::DTYPES.map(KernelId::QuantizeX));
    for d in elem::DTYPES {
        v.push(KernelId::Rope(RopeLayout::HalfSplit, d));
        v.push(KernelId::Rope(RopeLayout::Interleaved, d));
        v.push(KernelId::ArgMax(d));
        v.push(KernelId::Glu(d));
    }
    v.extend(decoder::COPY_UNITS.map(KernelId::Copy));
    v.extend(decoder::GATHER_SIZES.map(KernelId::Gather));
    v
}

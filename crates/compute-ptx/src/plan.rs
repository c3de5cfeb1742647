//! How each op becomes kernel launches on device addresses: kernel choice
//! (GEMM tier, row-kernel shape), grid sizes, arguments, temporaries and the
//! device's grid limits. Generic over a [`Launcher`]: the CUDA backend launches
//! through the driver; a PTX emulator can run the same plans on the CPU.
//!
//! Element-wise ops, reductions, row ops and casts run kernels of the op's
//! dtype (`f32`, `f16`, `bf16`, computing in `f32`). A matmul of at most
//! [`gemv::NN_MAX_ROWS`] rows with `A` stored `m × k`, or of at most
//! [`gemv::MAX_ROWS`] with `B` stored `n × k` too, runs the GEMV kernels of
//! its dtypes ([`gemv_fits`], [`GemmTier::Gemv`]; 9 to 16 aligned rows of
//! halves on the tensor-core GEMV): one pass over `B` at memory bandwidth,
//! where a tensor-core GEMM tile would be almost all padding.
//! Other matmuls of `f16`/`bf16`
//! operands runs on tensor cores when its shape suits their 16-byte copies
//! ([`mma_fits`]): on a compute capability 9.0 device the `wgmma` kernel fed
//! by TMA ([`GemmTier::Tma`], warp-specialised and persistent, its tile
//! shape chosen for the output's size by `TmaConfig::for_shape`) when the
//! operands are 16-byte aligned ([`tma_fits`]), else the `wgmma` kernel fed
//! by `cp.async` ([`GemmTier::Wgmma`]); the `mma.sync` kernel
//! ([`GemmTier::Mma`]) on other devices. On compute capability 9.0 the same
//! kernels take `f32` matmuls with TF32 opted in whose layout they read
//! ([`tf32_fits`]: `A·Bᵀ`), operands rounded to nearest
//! (`TmaConfig::tf32`, or [`WgmmaConfig::tf32`] unaligned); other TF32 matmuls run the
//! full-precision `f32` GEMM, which meets the TF32 bound. Other half matmuls, and
//! half conv2d, widen their operands into `f32` temporaries, run the `f32`
//! GEMM and round the result to the output dtype. [`supported`] says which
//! ops a plan can run. [`run_quant_matmul`] and [`run_dequantize`] run
//! products with, and dequantization of, GGML block-quantized weights.
//!
//! The decoder ops run one launch each: rotary embeddings one thread per
//! pair, strided copies one thread per unit (16 or 8 bytes when both views'
//! rows allow it, else one element), gathers one thread per output element,
//! argmax one block of 1024 threads per row, in 16-byte loads when the rows
//! are aligned (see [`crate::kernels::decoder`]). Attention
//! passes `kv_rows` (a KV cache's capacity, or `seq_k`) to every kernel as the
//! distance between key/value heads.

use compute_core::{
    AttentionSpec, BackendKind, ComputeError, Conv2dSpec, CopySpec, DType, Epilogue, HostSlice, HostSliceMut,
    MatmulSpec, Op, Precision, QuantMatmulSpec, ReduceOp, Result, RopeSpec, RowOp,
};

use crate::kernels::attention::{self, FlashConfig};
use crate::kernels::attention_tma;
use crate::kernels::attention_wgmma::HopperConfig;
use crate::kernels::decoder;
use crate::kernels::elem;
use crate::kernels::elementwise::{self, UnaryKind};
use crate::kernels::gemm_epilogue::EpilogueKind;
use crate::kernels::gemm_mma::MmaConfig;
use crate::kernels::gemm_simple::TILE;
use crate::kernels::gemm_simt::SimtConfig;
use crate::kernels::gemm_tma::{self, TmaConfig};
use crate::kernels::gemm_wgmma::{Tf32Rounding, WgmmaConfig};
use crate::kernels::gemv;
use crate::kernels::interpolate;
use crate::kernels::quant_gemv::XFusion;
use crate::kernels::reduce::{self, ReduceKind};
use crate::kernels::rows::{self, RowKind, RowShape};
use crate::kernels::{KernelId, conv};

mod quant;
pub use quant::{fuses, fuses_epilogue, run_dequantize, run_quant_matmul, run_quant_matmul_fused};

/// Which GEMM kernel runs a matrix product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmTier {
    /// One thread per output, operands from global memory.
    Naive,
    /// 16×16 shared-memory tiles, one output per thread.
    Tiled,
    /// Register-blocked, double-buffered tiles of the given shape.
    Simt(SimtConfig),
    /// Tensor cores (`mma.sync`) for `f16`/`bf16` inputs, of the given shape.
    Mma(MmaConfig),
    /// Hopper tensor cores (`wgmma`, compute capability 9.0) for `f16`/`bf16`
    /// inputs, of the given shape.
    Wgmma(WgmmaConfig),
    /// Hopper tensor cores fed by TMA, warp-specialised and persistent
    /// (compute capability 9.0), of the given shape: `f16`/`bf16` inputs, or
    /// `f32` with TF32 opted in (`A·Bᵀ`). The operands must be 16-byte
    /// aligned; anything else it does not take is a `Shape` error.
    Tma(TmaConfig),
    /// The GEMV kernels for products of few rows ([`gemv_fits`]), any of the
    /// three dtypes in and out.
    Gemv,
    /// [`GemmTier::Gemv`] with the CUDA-core kernel for `B` stored `n × k`
    /// and its k-split forced (one of [`gemv::NT_SPLITS`]; the plans pick it
    /// with [`gemv::nt_split`]): for tuning and tests. `B` stored `k × n`
    /// runs as under [`GemmTier::Gemv`].
    GemvSplit(u32),
    /// [`GemmTier::Gemv`] with the tensor-core kernel for `B` stored `n × k`
    /// forced ([`gemv::nt_mma`]: `f16`/`bf16` inputs, `k` a multiple of 8,
    /// 16-byte aligned rows): its 8-column tiles per warp group (one of
    /// [`gemv::MMA_TILES`]) and k-split (one of [`gemv::NT_SPLITS`]). For
    /// tuning and tests; anything else it does not take is a `Shape` error.
    GemvMma(u32, u32),
    /// [`GemmTier::Simt`] with `k` split into slices, each multiplied by
    /// its own blocks ([`SimtConfig::split_k`]) into an `f32` partial that
    /// one more launch adds in slice order ([`gemv::combine`]): for thin
    /// products whose column tiles alone leave most multiprocessors idle.
    /// Batches run one after another.
    SimtSplit(SimtConfig, Splits),
}

/// How many k-slices a [`GemmTier::SimtSplit`] product takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Splits {
    /// This many (rounded to whole k-tiles; 1 or 0: not split).
    Fixed(u32),
    /// As many as give about this many blocks per multiprocessor, at most
    /// [`MAX_AUTO_SPLITS`], each slice at least [`SimtConfig::SPLIT_MIN_K`]
    /// of `k`; where that is one, the product runs unsplit in the shape
    /// [`SimtConfig::thin_for`] gives
    /// ([`SimtConfig::split_shape`] gives the counts the plans use).
    Fill(u32),
}

/// Most k-slices [`Splits::Fill`] picks.
pub const MAX_AUTO_SPLITS: usize = 8;

/// A shape of the GEMV kernels forced through [`run_matmul`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GemvForce {
    /// The CUDA-core kernel with this k-split.
    Split(u32),
    /// The tensor-core kernel with these tiles and k-split.
    Mma(u32, u32),
}

impl GemmTier {
    /// The tier the backend picks: the GEMV kernels for products that
    /// [`gemv_fits`] (at most 8 rows, or 16 with `B` stored `n × k`; `A`
    /// stored `m × k`); tensor cores for
    /// half inputs whose shape [`mma_fits`] (`wgmma` when `wgmma` says the device has it; the plans
    /// then pick its tile shape per output with `WgmmaConfig::for_shape`); for
    /// `f32`, register-blocked in the [`SimtConfig::thin`] shape for 9 to
    /// [`SimtConfig::THIN_MAX_ROWS`] rows (with `n ≥ 64`, `k ≥ 32`; 33 to 64
    /// rows against [`SimtConfig::WIDE_COLUMNS`] columns or more in the
    /// [`SimtConfig::thin_wide`] shape; with `k` split over the grid in the
    /// shape of [`SimtConfig::split_shape`] when `k` is at least twice
    /// [`SimtConfig::SPLIT_MIN_K`]), whose
    /// default 128×128 tiles would leave most multiprocessors idle, in the
    /// default shape when both `m` and `n` fill at least half a block tile,
    /// tiled when they fill a 16×16 tile, naive for thin products (vectors,
    /// single rows or columns).
    pub fn choose(spec: &MatmulSpec, wgmma: bool) -> GemmTier {
        if gemv_chosen(spec, wgmma) {
            return GemmTier::Gemv;
        }
        if mma_fits(spec) {
            if wgmma {
                return GemmTier::Wgmma(WgmmaConfig::default());
            }
            return GemmTier::Mma(MmaConfig::default());
        }
        let cfg = SimtConfig::default();
        let simt_rows_fit = spec.m.div_ceil(cfg.bm as usize) <= MAX_GRID_YZ;
        // Rows past the GEMV (9 with `B` stored `k × n`, 17 stored `n × k`).
        if (gemv::NN_MAX_ROWS + 1..=SimtConfig::THIN_MAX_ROWS).contains(&spec.m) && spec.n >= 64 && spec.k >= 32 {
            if spec.k >= 2 * SimtConfig::SPLIT_MIN_K {
                let (cfg, fill) = SimtConfig::split_shape(spec.m);
                GemmTier::SimtSplit(cfg, Splits::Fill(fill))
            } else {
                GemmTier::Simt(SimtConfig::thin_for(spec.m, spec.n))
            }
        } else if spec.m >= 64 && spec.n >= 64 && simt_rows_fit {
            GemmTier::Simt(cfg)
        } else if spec.m >= 16 && spec.n >= 16 {
            GemmTier::Tiled
        } else {
            GemmTier::Naive
        }
    }
}

/// Whether the tensor-core kernel takes `spec`: `f16`/`bf16` inputs, an
/// output of `f32`, `f16` or `bf16`, each operand's contiguous dimension a
/// multiple of 8 and `n` even ([`MmaConfig::fits`]), and every matrix under
/// 2³² elements (the kernel indexes in 32 bits). Free.
pub fn mma_fits(spec: &MatmulSpec) -> bool {
    let small = |x: usize, y: usize| x.checked_mul(y).is_some_and(|p| p <= u32::MAX as usize);
    matches!(spec.dtype, DType::F16 | DType::BF16)
        && elem::supported(spec.out_dtype)
        && MmaConfig::fits(spec.m, spec.n, spec.k, spec.trans_a, spec.trans_b)
        && small(spec.m, spec.k)
        && small(spec.k, spec.n)
        && small(spec.m, spec.n)
}

/// The most columns a product of 9 to 16 rows of halves runs on the GEMV
/// kernels on a device with `wgmma` ([`gemv_chosen`]). Measured on an H100
/// (2026-11-26, `cuda_bench --gemv16`, `docs/ptx.md`) with 12 and 16 rows
/// (`k` = 2048 unless said): the tensor-core GEMV took 2048 and 3072
/// columns in about half the `wgmma` GEMM's time and 2048 columns of `k` =
/// 8192 in 0.40 of it, while 16384 and 32000 columns ran faster on the
/// `wgmma` GEMM (1–4% ahead of the nearest GEMV shape, 8–12% of the one the
/// plans build), whose 64×256 tiles then occupy half the device or more; the
/// line between is drawn at 8192, unmeasured.
pub const GEMV_WIDE_COLUMNS: usize = 8192;

/// Whether the plans run `spec` on the GEMV kernels: it [`gemv_fits`],
/// unless it has more than [`gemv::NN_MAX_ROWS`] rows of `f16`/`bf16` that
/// the tensor-core GEMM takes ([`mma_fits`]), more than
/// [`GEMV_WIDE_COLUMNS`] columns, and `wgmma` is there (compute capability
/// 9.0): that product runs faster on the `wgmma` GEMM. Free.
pub fn gemv_chosen(spec: &MatmulSpec, wgmma: bool) -> bool {
    let wide = spec.m > gemv::NN_MAX_ROWS && spec.n > GEMV_WIDE_COLUMNS && wgmma && mma_fits(spec);
    gemv_fits(spec) && !wide
}

/// Whether the GEMV kernels ([`GemmTier::Gemv`]) take `spec`: `1 ≤ m ≤`
/// [`gemv::NN_MAX_ROWS`] (8) with either layout of `B`, or up to
/// [`gemv::MAX_ROWS`] (16) with `B` stored `n × k` (`trans_b`, the
/// `nn.Linear` layout a decoder's weights have); `A` stored `m × k`
/// (`trans_a` false; a transposed `A` runs the other tiers), inputs and
/// output `f32`, `f16` or `bf16`, `m`, `n`, `k` and `m·n` under 2³². Any
/// batch. `f32` runs in full precision whatever `precision` asks (it meets
/// the TF32 bound). Free.
///
/// Why these limits: each output column costs one read of `B`'s column (at
/// memory bandwidth) plus `m` reads of `A`'s rows from cache. Up to 8 rows
/// the CUDA-core kernels keep up with memory. With `B` stored `n × k`, 9 to
/// 16 rows of half inputs fill one `mma` fragment, which the tensor-core
/// GEMV ([`gemv::nt_mma`]) takes in one pass over `B`, where the tiled
/// tensor-core GEMM's tiles of 64 or 128 rows would be mostly padding and
/// give too few blocks to read `B` at memory bandwidth; `f32` (and half
/// rows that are not 16-byte aligned) take the 16-row CUDA-core kernel.
/// With `B` stored `k × n` a thread would keep 128 sums at 16 rows, so
/// products of more than 8 rows run the other tiers.
pub fn gemv_fits(spec: &MatmulSpec) -> bool {
    let small = |x: usize, y: usize| x.checked_mul(y).is_some_and(|p| p <= u32::MAX as usize);
    let most = if spec.trans_b { gemv::MAX_ROWS } else { gemv::NN_MAX_ROWS };
    (1..=most).contains(&spec.m)
        && !spec.trans_a
        && elem::supported(spec.dtype)
        && elem::supported(spec.out_dtype)
        && small(spec.m, spec.n)
        && small(spec.k, 1)
        && small(spec.n, 1)
}

/// Whether [`GemmTier::Wgmma`] takes `spec` in TF32 ([`run_matmul`]):
/// `f32` in and out with [`Precision::Tf32`]
/// opted in, `A` stored `m × k` and `B` stored `n × k` (TF32 reads only
/// `k`-contiguous operands), `k` a multiple of 4 and `n` even, every matrix
/// under 2³² elements. Free.
pub fn tf32_fits(spec: &MatmulSpec) -> bool {
    let small = |x: usize, y: usize| x.checked_mul(y).is_some_and(|p| p <= u32::MAX as usize);
    spec.dtype == DType::F32
        && spec.out_dtype == DType::F32
        && spec.precision == compute_core::Precision::Tf32
        && !spec.trans_a
        && spec.trans_b
        && spec.k.is_multiple_of(4)
        && spec.n.is_multiple_of(2)
        && small(spec.m, spec.k)
        && small(spec.k, spec.n)
        && small(spec.m, spec.n)
}

const MAX_GRID_YZ: usize = 65_535;
const MAX_GRID_X: usize = (1 << 31) - 1;
/// Largest im2col buffer one chunk of images uses (floats).
const COL_CHUNK_FLOATS: usize = 64 << 20;

fn limit(op: &'static str, what: &'static str, requested: usize, maximum: usize) -> Result<()> {
    if requested > maximum {
        return Err(ComputeError::LimitExceeded { op, what, requested: requested as u64, maximum: maximum as u64 });
    }
    Ok(())
}

fn u32_of(op: &'static str, what: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| ComputeError::LimitExceeded {
        op,
        what,
        requested: v as u64,
        maximum: u64::from(u32::MAX),
    })
}

/// Why an op of another dtype is refused.
const NO_KERNELS: &str = "the CUDA kernels read and write f32, f16 and bf16 only";

/// Whether the plans can run `op`: every operand is `f32`, `f16` or `bf16`
/// (a TF32 matmul runs the full-precision kernels, which meet the TF32 bound),
/// except the weights of a quantized matmul and the source of a dequantizing
/// cast, which are `q4_K`, `q5_K`, `q6_K` or `q8_0` blocks (a cast between
/// one block dtype and itself is a copy). Quantizing casts (float to blocks)
/// are declined: they run on the CPU. Free.
pub fn supported(op: &Op) -> bool {
    let blocks = |d: DType| d.block_format().is_some_and(crate::kernels::quant::supported);
    if let Op::Attention(a) = op
        && a.positions
        && attention::positions_args(a.mask, a.seq_q).is_none()
    {
        return false;
    }
    match *op {
        Op::QuantMatmul(s) => blocks(s.weight) && elem::supported(s.dtype) && elem::supported(s.out_dtype),
        Op::Cast { from, to, .. } if from == to => elem::supported(from) || blocks(from),
        Op::Cast { from, to, .. } if from.is_quantized() => blocks(from) && elem::supported(to),
        _ => op.dtypes().into_iter().all(elem::supported),
    }
}

/// The bits of a quiet NaN of `dtype` (what a gather stores for an id
/// outside the table).
fn nan_bits(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 0x7e00,
        DType::BF16 => 0x7fc0,
        _ => 0x7fc0_0000,
    }
}

/// The [`ComputeError::UnsupportedDType`] for an op that [`supported`]
/// declines, naming its first dtype without kernels.
pub fn unsupported_dtype(op: &Op) -> ComputeError {
    if op.reads_positions() {
        // Only the start-aligned causal mask with positions lacks kernels.
        return ComputeError::Unsupported { op: op.name(), backend: BackendKind::Cuda };
    }
    let dtype = op.dtypes().into_iter().find(|&d| !elem::supported(d)).unwrap_or(op.dtype());
    if let Op::Cast { from, to, .. } = *op
        && to.is_quantized()
        && from != to
    {
        let why = "quantizing (float to blocks) has no CUDA kernel; it runs on the CPU";
        return ComputeError::unsupported_dtype(op, BackendKind::Cuda, to, why);
    }
    ComputeError::unsupported_dtype(op, BackendKind::Cuda, dtype, NO_KERNELS)
}

/// The `f32` slices of a host call whose views are all `f32`, `None` if any
/// is another dtype. Allocates one small vector of input slices.
pub fn f32_views<'a>(inputs: &[HostSlice<'a>], output: HostSliceMut<'a>) -> Option<(Vec<&'a [f32]>, &'a mut [f32])> {
    let views = inputs.iter().map(|x| x.get::<f32>()).collect::<Option<Vec<_>>>()?;
    Some((views, output.into_typed::<f32>()?))
}

/// One kernel argument, as the kernel's parameter list declares it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device address (`.u64`).
    Ptr(u64),
    /// `.u32`.
    U32(u32),
    /// `.u64`.
    U64(u64),
    /// `.f32`.
    F32(f32),
    /// A tensor map for TMA copies, encoded by the launcher
    /// (`.param .align 128 .b8 [128]`).
    TensorMap(TensorMapDesc),
}

impl Arg {
    /// The type of the parameter this argument fills.
    pub fn ty(self) -> crate::builder::ParamTy {
        use crate::builder::{ParamTy, Ty};
        match self {
            Arg::Ptr(_) | Arg::U64(_) => ParamTy::Scalar(Ty::U64),
            Arg::U32(_) => ParamTy::Scalar(Ty::U32),
            Arg::F32(_) => ParamTy::Scalar(Ty::F32),
            Arg::TensorMap(_) => ParamTy::TensorMap,
        }
    }
}

/// What a TMA tensor map describes, before the driver encodes it
/// (`cuTensorMapEncodeTiled`): a tensor of `rank` (1 to 3) dimensions of
/// `dtype` (`f16`, `bf16` or `f32`) at device address `addr` (16-byte
/// aligned), `dims` innermost first, `strides[i]` the bytes between
/// consecutive indices of dimension `i + 1` (multiples of 16), copied in boxes
/// of `boxes` elements (the innermost 128 bytes at most) into shared memory in
/// the 128-byte swizzle, with zeros where a box hangs over an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapDesc {
    /// Device address of element 0.
    pub addr: u64,
    /// Element type.
    pub dtype: DType,
    /// Dimensions used (1 to 3).
    pub rank: u32,
    /// Extent of each dimension, innermost first.
    pub dims: [u64; 3],
    /// Bytes between consecutive indices of dimensions 1 and 2.
    pub strides: [u64; 2],
    /// Box extent per dimension, in elements.
    pub boxes: [u32; 3],
}

impl TensorMapDesc {
    /// Why the driver would refuse this map, if it would: a rank outside
    /// 1..=3, an address not 16-byte aligned, a stride not a multiple of 16
    /// or of 2⁴⁰ bytes or more, an empty dimension, a box of 0 or above 256
    /// elements, an innermost box over 128 bytes or not a multiple of 16 bytes.
    pub fn check(&self) -> std::result::Result<(), String> {
        let r = self.rank as usize;
        let esz = self.dtype.size_in_bytes() as u64;
        if !(1..=3).contains(&r) {
            return Err(format!("tensor map of rank {r}: need 1 to 3"));
        }
        if !self.addr.is_multiple_of(16) {
            return Err(format!("tensor map at {:#x}: not 16-byte aligned", self.addr));
        }
        if let Some(s) = self.strides[..r - 1].iter().find(|s| !s.is_multiple_of(16) || **s >= 1 << 40) {
            return Err(format!("tensor map stride {s}: need a multiple of 16 below 2^40 bytes"));
        }
        if self.dims[..r].iter().any(|&d| d == 0 || d > 1 << 32) {
            return Err(format!("tensor map dimensions {:?}: need 1 to 2^32 each", &self.dims[..r]));
        }
        if self.boxes[..r].iter().any(|&b| b == 0 || b > 256) {
            return Err(format!("tensor map box {:?}: need 1 to 256 elements each", &self.boxes[..r]));
        }
        let inner = u64::from(self.boxes[0]) * esz;
        if inner > 128 || !inner.is_multiple_of(16) {
            return Err(format!("tensor map inner box of {inner} bytes: need a multiple of 16 up to 128"));
        }
        Ok(())
    }
}

/// Launch geometry: blocks, threads per block, dynamic shared memory bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Grid size in blocks (x, y, z).
    pub blocks: (u32, u32, u32),
    /// Block size in threads (x, y, z).
    pub threads: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub dynamic_smem: u32,
}

/// What keeps a temporary of [`Launcher::temp`] alive: dropping it frees
/// the buffer after the work queued on it.
type TempGuard = Box<dyn std::any::Any>;

/// What runs a plan: launches kernels in order and provides temporaries.
pub trait Launcher {
    /// Streaming multiprocessors (sizes the grids of streaming kernels).
    fn sm_count(&self) -> u32;
    /// Whether the device runs the `sm_90a` kernels (`wgmma`): compute
    /// capability 9.0. False unless a launcher says otherwise.
    fn has_wgmma(&self) -> bool {
        false
    }
    /// Whether the device runs the TMA-fed `wgmma` kernels (compute
    /// capability 9.0, and a launcher that encodes tensor maps). False unless
    /// a launcher says otherwise.
    fn has_tma(&self) -> bool {
        false
    }
    /// Queues kernel `id` with `grid` and `args`, after all earlier launches.
    fn launch(&self, id: KernelId, grid: Grid, args: &[Arg]) -> Result<()>;
    /// A device buffer of `bytes` bytes for this plan's intermediates; the
    /// returned guard frees it (after the queued work that uses it) when dropped.
    fn temp(&self, bytes: usize, op: &'static str) -> Result<(Box<dyn std::any::Any>, u64)>;
    /// Queues a copy of `bytes` bytes from device address `src` to `dst`, after
    /// all earlier launches (how a cast to the same dtype runs).
    fn copy(&self, dst: u64, src: u64, bytes: usize, op: &'static str) -> Result<()>;
}

/// Queues `op` reading device addresses `ins` and writing `out`. The caller
/// has validated the op ([`Op::check_operands`]) and sized every buffer from
/// its layout. An op that [`supported`] declines is [`unsupported_dtype`],
/// with nothing queued.
pub fn run_op(l: &dyn Launcher, op: &Op, ins: &[u64], out: u64) -> Result<()> {
    Exec { l }.run(op, ins, out)
}

/// How many key splits (flash-decoding) an attention launch of `blocks`
/// blocks over `key_tiles` key tiles gets on `sms` multiprocessors: enough
/// for three blocks per multiprocessor, each split at least four key tiles,
/// at most 64; 1 when the blocks already fill the device. Free.
pub fn key_splits(blocks: usize, key_tiles: usize, sms: u32) -> usize {
    let want = 3 * sms as usize;
    if blocks >= want {
        return 1;
    }
    want.div_ceil(blocks.max(1)).min(key_tiles / 4).clamp(1, 64)
}

/// The Hopper attention shape to launch and, for a TMA schedule, its key and
/// value tensor maps. A TMA schedule runs as [`HopperConfig::without_tma`]
/// (same tiles, `cp.async` copies) where the launcher encodes no tensor maps,
/// where the key count comes from positions on the device (the maps' key
/// extent is fixed at launch, and rows of a KV cache past the count must not
/// reach `P·v`), or where the driver would refuse the maps (a misaligned
/// tensor). Free.
fn hopper_tma_maps(
    l: &dyn Launcher,
    h: HopperConfig,
    a: &AttentionSpec,
    (k, v): (u64, u64),
) -> (HopperConfig, Option<(TensorMapDesc, TensorMapDesc)>) {
    if !h.schedule.uses_tma() {
        return (h, None);
    }
    let fallback = h.without_tma();
    if !l.has_tma() || a.positions {
        return (fallback, None);
    }
    let (mk, mv) = attention_tma::kv_tensor_maps(&h, a.dtype, (a.batch * a.heads_kv, a.seq_k, a.kv_rows()), (k, v));
    if mk.check().is_err() || mv.check().is_err() {
        return (fallback, None);
    }
    (h, Some((mk, mv)))
}

/// A chosen attention kernel and its shape (for tuning and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The `mma.sync` kernel (`f16`/`bf16`; `f32` with TF32 opted in).
    Flash(FlashConfig),
    /// The Hopper `wgmma` kernel (`f16`/`bf16`, compute capability 9.0).
    Hopper(HopperConfig),
}

/// Queues fused attention reading `q`, `k`, `v` and writing `o` (device
/// addresses, validated sizes), with the chosen tensor-core `kernel` when
/// given (for tuning and tests), else as [`run_op`] does. A shape the kernel
/// cannot be built with is a `Compile` error from the launcher.
pub fn run_attention(
    l: &dyn Launcher,
    spec: &AttentionSpec,
    kernel: Option<AttentionKernel>,
    (q, k, v, o): (u64, u64, u64, u64),
) -> Result<()> {
    let op = Op::Attention(*spec);
    op.layout()?;
    if !supported(&op) {
        return Err(unsupported_dtype(&op));
    }
    Exec { l }.attention(&op, spec, kernel, &[q, k, v], o)
}

/// Queues a matrix product with a chosen tier; `batch_strides` (elements
/// between consecutive matrices of A, B, C; 0 shares one) defaults to contiguous.
/// The `f32` tiers take `f32` operands only; [`GemmTier::Mma`] and
/// [`GemmTier::Wgmma`] (compute capability 9.0 only) half inputs whose shape
/// [`mma_fits`] and contiguous batches; [`GemmTier::Gemv`] any dtypes and
/// batch strides of a product that [`gemv_fits`]; anything else is
/// `UnsupportedDType` or `Shape` (half matmuls of other shapes go through [`run_op`]).
pub fn run_matmul(
    l: &dyn Launcher,
    tier: GemmTier,
    spec: &MatmulSpec,
    (a, b, c): (u64, u64, u64),
    batch_strides: Option<(usize, usize, usize)>,
) -> Result<()> {
    let op = Op::Matmul(*spec);
    if !spec.epilogue.is_identity() {
        let why = "a chosen tier runs the plain product; products with an epilogue go through run_op";
        return Err(ComputeError::shape("matmul", why, op.shapes()));
    }
    if let GemmTier::Gemv | GemmTier::GemvSplit(_) | GemmTier::GemvMma(..) = tier {
        if !elem::supported(spec.dtype) || !elem::supported(spec.out_dtype) {
            return Err(unsupported_dtype(&op));
        }
        let force = match tier {
            GemmTier::GemvSplit(s) => Some(GemvForce::Split(s)),
            GemmTier::GemvMma(t, s) => Some(GemvForce::Mma(t, s)),
            _ => None,
        };
        return Exec { l }.gemv(spec, (a, b, c), batch_strides, force, EpilogueInputs::NONE, "matmul");
    }
    let tc = match tier {
        GemmTier::Mma(cfg) => Some(GemmTc::Mma(cfg)),
        GemmTier::Wgmma(cfg) => Some(GemmTc::Wgmma(cfg)),
        GemmTier::Tma(cfg) => Some(GemmTc::Tma(cfg)),
        _ => None,
    };
    if let Some(tc) = tc {
        if matches!(tc, GemmTc::Wgmma(_)) && !l.has_wgmma() {
            let reason = "the wgmma tier needs a compute capability 9.0 device";
            return Err(ComputeError::unsupported_dtype(&op, BackendKind::Cuda, spec.dtype, reason));
        }
        if matches!(tc, GemmTc::Tma(_)) && !l.has_tma() {
            let reason = "the TMA tier needs a compute capability 9.0 device";
            return Err(ComputeError::unsupported_dtype(&op, BackendKind::Cuda, spec.dtype, reason));
        }
        if let GemmTc::Tma(cfg) = tc
            && !tma_fits(&cfg, spec, (a, b))
        {
            let why = "the TMA tier needs 16-byte aligned operands";
            return Err(ComputeError::shape("matmul", why, op.shapes()));
        }
        let tf32 = matches!(tc, GemmTc::Wgmma(_) | GemmTc::Tma(_)) && tf32_fits(spec);
        if !matches!(spec.dtype, DType::F16 | DType::BF16) && !tf32 {
            let reason = "the tensor-core tiers take f16 or bf16 inputs (and f32 in TF32, A·Bᵀ, on wgmma)";
            return Err(ComputeError::unsupported_dtype(&op, BackendKind::Cuda, spec.dtype, reason));
        }
        if !(mma_fits(spec) || tf32) || batch_strides.is_some() {
            let why = "the tensor-core tiers need contiguous batches, each operand's contiguous dimension a multiple of 8 and n even";
            return Err(ComputeError::shape("matmul", why, op.shapes()));
        }
        return Exec { l }.matmul_tc(tc, spec, (a, b, c), EpilogueInputs::NONE, "matmul");
    }
    if spec.dtype != DType::F32 || spec.out_dtype != DType::F32 {
        let dtype = if spec.dtype != DType::F32 { spec.dtype } else { spec.out_dtype };
        let reason = "the f32 GEMM tiers take f32 operands only; half matmuls run through run_op";
        return Err(ComputeError::unsupported_dtype(&op, BackendKind::Cuda, dtype, reason));
    }
    Exec { l }.matmul(tier, spec, a, b, c, batch_strides, "matmul")
}

/// Which tensor-core kernel a half matmul runs.
#[derive(Clone, Copy)]
enum GemmTc {
    Mma(MmaConfig),
    Wgmma(WgmmaConfig),
    Tma(TmaConfig),
}

/// The stored rows of `A` (`a`) or `B` of a product, and their length in
/// elements: `A` is `m` rows of `k` (`k` rows of `m` when transposed), `B`
/// `k` rows of `n` (`n` rows of `k`).
fn stored_rows(spec: &MatmulSpec, a: bool) -> (usize, usize) {
    match (a, spec.trans_a, spec.trans_b) {
        (true, false, _) => (spec.m, spec.k),
        (true, true, _) => (spec.k, spec.m),
        (false, _, false) => (spec.k, spec.n),
        (false, _, true) => (spec.n, spec.k),
    }
}

/// Whether the TMA kernel takes this product at these device addresses:
/// its tensor maps are valid (16-byte aligned operands and rows, which
/// [`mma_fits`] or [`tf32_fits`] already require of the rows) and the tile
/// count fits 32 bits.
pub fn tma_fits(cfg: &TmaConfig, spec: &MatmulSpec, (a, b): (u64, u64)) -> bool {
    let tiles = spec.batch.max(1) as u128
        * spec.m.div_ceil(cfg.bm() as usize) as u128
        * spec.n.div_ceil(cfg.bn as usize) as u128;
    let ((ra, lda), (rb, ldb)) = (stored_rows(spec, true), stored_rows(spec, false));
    let (ma, mb) = gemm_tma::tensor_maps_strided(
        cfg,
        spec.dtype,
        (spec.batch, spec.m, spec.n, spec.k),
        (spec.trans_a, spec.trans_b),
        (a, b),
        (lda, ldb),
        (Some(spec.stride_a()), Some(spec.stride_b())),
    );
    // Matrices at least a matrix apart (a shared or overlapping one is read
    // by the `cp.async` kernels instead).
    let apart = spec.batch <= 1 || (spec.stride_a() >= ra * lda && spec.stride_b() >= rb * ldb);
    (mma_fits(spec) || tf32_fits(spec))
        && apart
        && tiles <= u32::MAX as u128
        && ma.check().is_ok()
        && mb.check().is_ok()
}

/// The device addresses of a matmul's epilogue inputs (0 where it has none).
#[derive(Clone, Copy)]
struct EpilogueInputs {
    bias: u64,
    c0: u64,
}

/// The inputs of the epilogue `e` among a product's `ins` (after its two
/// operands: the bias, then `C₀`).
fn epilogue_inputs(e: &Epilogue, ins: &[u64]) -> EpilogueInputs {
    let bias = if e.bias { ins.get(2).copied().unwrap_or(0) } else { 0 };
    let c0 = if e.reads_c() { ins.get(2 + usize::from(e.bias)).copied().unwrap_or(0) } else { 0 };
    EpilogueInputs { bias, c0 }
}

impl EpilogueInputs {
    /// No epilogue inputs (the plain product).
    const NONE: EpilogueInputs = EpilogueInputs { bias: 0, c0: 0 };

    /// The kernel arguments of the epilogue `e` (none for the plain product):
    /// `alpha`, `beta`, the bias, and `C₀` moved on by `c0_bytes`.
    fn args(&self, e: &Epilogue, c0_bytes: u64) -> Vec<Arg> {
        if e.is_identity() {
            return Vec::new();
        }
        let c0 = if self.c0 == 0 { 0 } else { self.c0 + c0_bytes };
        vec![Arg::F32(e.alpha), Arg::F32(e.beta), Arg::Ptr(self.bias), Arg::Ptr(c0)]
    }
}

struct Exec<'a> {
    l: &'a dyn Launcher,
}

impl Exec<'_> {
    fn launch(&self, id: KernelId, grid: Grid, args: &[Arg]) -> Result<()> {
        self.l.launch(id, grid, args)
    }

    fn temp(&self, floats: usize, op: &'static str) -> Result<(Box<dyn std::any::Any>, u64)> {
        let bytes = floats.checked_mul(4).ok_or(ComputeError::LimitExceeded {
            op,
            what: "temporary buffer bytes",
            requested: floats as u64,
            maximum: (usize::MAX / 4) as u64,
        })?;
        self.l.temp(bytes, op)
    }

    fn run(&self, op: &Op, ins: &[u64], out: u64) -> Result<()> {
        let input =
            |i: usize| ins.get(i).copied().ok_or_else(|| ComputeError::shape(op.name(), "missing input", op.shapes()));
        if !supported(op) {
            return Err(unsupported_dtype(op));
        }
        let dt = op.dtype();
        match *op {
            Op::QuantMatmul(s) => self.quant_matmul(&s, ins, out, op),
            Op::Unary { op: u, len, .. } => {
                let (kind, p0, p1) = UnaryKind::of(u);
                let args = [Arg::Ptr(input(0)?), Arg::Ptr(out), Arg::U64(len as u64), Arg::F32(p0), Arg::F32(p1)];
                self.launch(KernelId::Unary(kind, dt), self.stream_grid(len, dt), &args)
            }
            Op::Binary { op: b, len, .. } => {
                let args = [Arg::Ptr(input(0)?), Arg::Ptr(input(1)?), Arg::Ptr(out), Arg::U64(len as u64)];
                self.launch(KernelId::Binary(b, dt), self.stream_grid(len, dt), &args)
            }
            Op::Reduce { op: r, len, .. } => {
                let kind = if r == ReduceOp::Sum { ReduceKind::Sum } else { ReduceKind::Max };
                self.reduce(kind, dt, &[input(0)?], len, out, op.name())
            }
            Op::Dot { len, .. } => self.reduce(ReduceKind::Dot, dt, &[input(0)?, input(1)?], len, out, op.name()),
            Op::Rows { op: r, rows, cols, .. } => {
                let (kind, eps) = RowKind::of(r);
                let params: Vec<u64> = match kind {
                    RowKind::Softmax | RowKind::LogSoftmax => vec![],
                    RowKind::LayerNorm => vec![input(1)?, input(2)?],
                    RowKind::RmsNorm => vec![input(1)?],
                };
                self.rows(kind, dt, eps, input(0)?, &params, out, rows, cols, op.name())
            }
            Op::Lerp { len, t, .. } => {
                let args = [Arg::Ptr(input(0)?), Arg::Ptr(input(1)?), Arg::Ptr(out), Arg::U64(len as u64), Arg::F32(t)];
                self.launch(KernelId::Lerp(dt), self.stream_grid(len, dt), &args)
            }
            Op::Slerp { rows, cols, t, .. } => {
                let name = op.name();
                let r = u32_of(name, "rows", rows)?;
                let c = u32_of(name, "columns", cols)?;
                let blocks = rows.div_ceil(interpolate::SLERP_ROWS as usize);
                limit(name, "row blocks", blocks, MAX_GRID_X)?;
                let grid =
                    Grid { blocks: (blocks as u32, 1, 1), threads: (interpolate::SLERP_BLOCK, 1, 1), dynamic_smem: 0 };
                let args =
                    [Arg::Ptr(input(0)?), Arg::Ptr(input(1)?), Arg::Ptr(out), Arg::U32(r), Arg::U32(c), Arg::F32(t)];
                self.launch(KernelId::Slerp(dt), grid, &args)
            }
            Op::Matmul(spec) if spec.has_batch_strides() => self.strided_matmul(&spec, ins, out, op.name()),
            // An epilogue the chosen kernel cannot apply in its stores: the
            // plain product into an f32 temporary, then the epilogue's own pass.
            Op::Matmul(spec) if !spec.epilogue.is_identity() && !self.fuses_epilogue(&spec) => {
                self.matmul_then_epilogue(&spec, ins, out, op.name())
            }
            // Few rows, any dtypes: one pass over B.
            Op::Matmul(spec) if gemv_chosen(&spec, self.l.has_wgmma()) => self.gemv(
                &spec,
                (input(0)?, input(1)?, out),
                None,
                None,
                epilogue_inputs(&spec.epilogue, ins),
                op.name(),
            ),
            // f32 with TF32 opted in, `A·Bᵀ`: a `wgmma` kernel reads it as TF32
            // (the TMA one where the operands are aligned for it).
            Op::Matmul(spec) if self.l.has_wgmma() && tf32_fits(&spec) => {
                let (a, b) = (input(0)?, input(1)?);
                let tma = TmaConfig::tf32();
                let tc = if self.l.has_tma() && tma_fits(&tma, &spec, (a, b)) {
                    GemmTc::Tma(tma)
                } else {
                    GemmTc::Wgmma(WgmmaConfig::tf32())
                };
                self.matmul_tc(tc, &spec, (a, b, out), epilogue_inputs(&spec.epilogue, ins), op.name())
            }
            Op::Matmul(spec) if spec.dtype == DType::F32 && spec.out_dtype == DType::F32 => {
                self.matmul(GemmTier::choose(&spec, false), &spec, input(0)?, input(1)?, out, None, op.name())
            }
            Op::Conv2d(c) if c.dtype == DType::F32 => self.conv2d(&c, input(0)?, input(1)?, out, op.name()),
            Op::Matmul(spec) if mma_fits(&spec) => {
                let (a, b) = (input(0)?, input(1)?);
                let tc = self.half_tc(&spec, (a, b));
                self.matmul_tc(tc, &spec, (a, b, out), epilogue_inputs(&spec.epilogue, ins), op.name())
            }
            Op::Matmul(spec) => {
                let wide = Op::Matmul(spec.with_dtypes(DType::F32, DType::F32));
                self.through_f32(op, &wide, ins, out)
            }
            Op::Conv2d(c) => self.through_f32(op, &Op::Conv2d(Conv2dSpec { dtype: DType::F32, ..c }), ins, out),
            Op::Attention(a) => self.attention(op, &a, None, ins, out),
            Op::Cast { len, from, to } if from == to => {
                let bytes =
                    from.bytes_for(len).and_then(|b| usize::try_from(b).ok()).ok_or(ComputeError::LimitExceeded {
                        op: op.name(),
                        what: "cast bytes",
                        requested: len as u64,
                        maximum: (usize::MAX / from.size_in_bytes().max(1)) as u64,
                    })?;
                self.l.copy(out, input(0)?, bytes, op.name())
            }
            Op::Cast { len, from, to } if from.is_quantized() => {
                let format = from.block_format().ok_or_else(|| unsupported_dtype(op))?;
                run_dequantize(self.l, format, len, to, (input(0)?, out))
            }
            Op::Cast { len, from, to } => self.cast(input(0)?, from, out, to, len),
            Op::Rope(r) => self.rope(&r, input(0)?, r.positions.then(|| input(1)).transpose()?, out, op.name()),
            Op::Copy(c) => {
                let positions = c.positions.map(|_| input(1)).transpose()?;
                self.strided_copy(&c, input(0)?, positions, out, op.name())
            }
            Op::Gather { ids, rows, cols, dtype } => {
                let name = op.name();
                let total = ids.saturating_mul(cols);
                if total == 0 {
                    return Ok(());
                }
                let n = u32_of(name, "gathered elements", total)?;
                let c = u32_of(name, "columns", cols)?;
                let r = u32_of(name, "rows", rows)?;
                let args = [
                    Arg::Ptr(input(0)?),
                    Arg::Ptr(input(1)?),
                    Arg::Ptr(out),
                    Arg::U32(n),
                    Arg::U32(c),
                    Arg::U32(r),
                    Arg::U32(nan_bits(dtype)),
                ];
                self.launch(KernelId::Gather(elem::size(dtype)), self.item_grid(total), &args)
            }
            Op::Glu { rows, cols, dtype } => {
                let total = rows.saturating_mul(cols);
                if total == 0 {
                    return Ok(());
                }
                let (x, bytes) = (input(0)?, (cols * dtype.size_in_bytes()) as u64);
                if rows == 1 && bytes.is_multiple_of(16) && x.is_multiple_of(16) {
                    // One row: the vectorised swiglu kernel on its two halves.
                    let args = [Arg::Ptr(x), Arg::Ptr(x + bytes), Arg::Ptr(out), Arg::U64(cols as u64)];
                    return self.launch(
                        KernelId::Binary(compute_core::BinaryOp::SwiGlu, dtype),
                        self.stream_grid(cols, dtype),
                        &args,
                    );
                }
                let name = op.name();
                let args = [
                    Arg::Ptr(x),
                    Arg::Ptr(out),
                    Arg::U32(u32_of(name, "elements", total)?),
                    Arg::U32(u32_of(name, "columns", cols)?),
                ];
                self.launch(KernelId::Glu(dtype), self.item_grid(total), &args)
            }
            Op::ArgMax { rows, cols, dtype } => {
                let name = op.name();
                if rows == 0 {
                    return Ok(());
                }
                limit(name, "rows", rows, MAX_GRID_X)?;
                let c = u32_of(name, "columns", cols)?;
                let x = input(0)?;
                let vec = x.is_multiple_of(16) && (cols * dtype.size_in_bytes()).is_multiple_of(16);
                let grid =
                    Grid { blocks: (rows as u32, 1, 1), threads: (decoder::ARGMAX_BLOCK, 1, 1), dynamic_smem: 0 };
                let args = [Arg::Ptr(x), Arg::Ptr(out), Arg::U32(c), Arg::U32(u32::from(vec))];
                self.launch(KernelId::ArgMax(dtype), grid, &args)
            }
        }
    }

    /// Grid of the one-thread-per-item decoder kernels: enough blocks of
    /// [`decoder::BLOCK`] threads for `n` items, at most 32 per
    /// multiprocessor (the loop strides over the rest).
    fn item_grid(&self, n: usize) -> Grid {
        let per_block = decoder::BLOCK as usize;
        let want = n.div_ceil(per_block).max(1);
        let cap = self.l.sm_count() as usize * 32;
        Grid { blocks: (want.min(cap) as u32, 1, 1), threads: (decoder::BLOCK, 1, 1), dynamic_smem: 0 }
    }

    /// Rotary embedding: one launch, one thread per pair (into a KV cache:
    /// each pair stored at its token's row of the cache).
    fn rope(&self, r: &RopeSpec, x: u64, positions: Option<u64>, y: u64, op: &'static str) -> Result<()> {
        let half = r.head_dim / 2;
        let pairs = r.seq.saturating_mul(r.heads).saturating_mul(half);
        if pairs == 0 {
            return Ok(());
        }
        let n = u32_of(op, "pairs", pairs)?;
        let heads = u32_of(op, "heads", r.heads)?;
        let h = u32_of(op, "head_dim", half)?;
        u32_of(op, "positions", r.position.saturating_add(r.seq))?;
        u32_of(op, "cache rows", r.heads.saturating_mul(r.cache.unwrap_or(0)))?;
        let (hi, lo) = decoder::rope_freq(r.theta, r.head_dim);
        let [sa, sb, sc] = compute_core::RopeScaling::coefficients(r.scaling);
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::U32(n),
            Arg::U32(heads),
            Arg::U32(h),
            Arg::U32(r.position as u32),
            Arg::F32(hi),
            Arg::F32(lo),
            Arg::Ptr(positions.unwrap_or(0)),
            Arg::U32(u32_of(op, "heads", r.input_heads().0)?),
            Arg::U32(u32_of(op, "heads", r.input_heads().1)?),
            Arg::F32(sa),
            Arg::F32(sb),
            Arg::F32(sc),
            Arg::U32(u32_of(op, "cache", r.cache.unwrap_or(0))?),
        ];
        self.launch(KernelId::Rope(r.layout, r.dtype), self.item_grid(pairs), &args)
    }

    /// Strided copy: one launch of the widest unit (16 or 8 bytes) that
    /// both views' rows, offsets, strides and base addresses allow when
    /// both inner strides are 1, else one element per thread.
    fn strided_copy(&self, c: &CopySpec, src: u64, positions: Option<u64>, dst: u64, op: &'static str) -> Result<()> {
        let count = c.count();
        if count == 0 {
            return Ok(());
        }
        let e = c.dtype.size_in_bytes() as u64;
        // A dimension of extent 1 has no stride that matters.
        let view = |v: &compute_core::Strided, extent: [usize; 3]| {
            let mut s = v.strides.map(|x| x as u64);
            for (k, &n) in extent.iter().enumerate() {
                if n == 1 {
                    s[k] = 0;
                }
            }
            (v.offset as u64, s)
        };
        let (mut so, mut ss) = view(&c.src, c.shape);
        let (mut dof, mut ds) = view(&c.dst, c.dst_extent());
        let mut n2 = c.shape[2] as u64;
        let mut unit = e;
        for u in [16u64, 8] {
            let f = u / e;
            let fits = |o: u64, s: [u64; 3], p: u64| {
                s[2] == 1
                    && o.is_multiple_of(f)
                    && s[0].is_multiple_of(f)
                    && s[1].is_multiple_of(f)
                    && p.is_multiple_of(u)
            };
            if u > e && n2.is_multiple_of(f) && fits(so, ss, src) && fits(dof, ds, dst) {
                unit = u;
                n2 /= f;
                (so, dof) = (so / f, dof / f);
                for k in 0..2 {
                    ss[k] /= f;
                    ds[k] /= f;
                }
                break;
            }
        }
        let units = c.shape[0] * c.shape[1] * n2 as usize;
        let n = u32_of(op, "copied elements", units)?;
        let n1 = u32_of(op, "copy extent", c.shape[1])?;
        let n2 = u32_of(op, "copy extent", n2 as usize)?;
        let mut args = vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::U32(n), Arg::U32(n1), Arg::U32(n2), Arg::U64(so)];
        args.extend(ss.map(Arg::U64));
        args.push(Arg::U64(dof));
        args.extend(ds.map(Arg::U64));
        let slots = u32_of(op, "copy slots", c.positions.unwrap_or(0))?;
        args.extend([Arg::Ptr(positions.unwrap_or(0)), Arg::U32(slots)]);
        self.launch(KernelId::Copy(unit as u32), self.item_grid(units), &args)
    }

    /// Fused attention: the tensor-core kernel for `f16`/`bf16` data whose
    /// head size it takes ([`FlashConfig::fits`]); for `f32` data with TF32
    /// opted in, the same kernel on bf16 high and low parts of q, k, v
    /// (three products per pair, about 2⁻¹⁶ relative: better than TF32);
    /// other `f32` data on the `f32` kernel, and other half data through
    /// `f32` temporaries. One launch over `(row tiles, heads_kv, batch)`,
    /// plus the key-split merge when the row tiles do not fill the device.
    fn attention(
        &self,
        op: &Op,
        a: &AttentionSpec,
        kernel: Option<AttentionKernel>,
        ins: &[u64],
        out: u64,
    ) -> Result<()> {
        let (flash, forced_hopper) = match kernel {
            Some(AttentionKernel::Flash(c)) => (Some(c), None),
            Some(AttentionKernel::Hopper(c)) => (None, Some(c)),
            None => (None, None),
        };
        let name = op.name();
        let input =
            |i: usize| ins.get(i).copied().ok_or_else(|| ComputeError::shape(name, "missing input", op.shapes()));
        let d = a.head_dim;
        let rows = a.group() * a.seq_q;
        // The kernels index rows times the head size in 32 bits.
        u32_of(name, "query rows per key/value head times head size", rows.saturating_mul(d))?;
        u32_of(name, "keys times head size", a.seq_k.saturating_mul(d))?;
        let kv_rows = u32_of(name, "key/value rows per head", a.kv_rows())?;
        limit(name, "key/value heads", a.heads_kv, MAX_GRID_YZ)?;
        limit(name, "batch", a.batch, MAX_GRID_YZ)?;
        let ((va, vb), positions) = if a.positions {
            let unsupported = || ComputeError::Unsupported { op: name, backend: BackendKind::Cuda };
            (attention::positions_args(a.mask, a.seq_q).ok_or_else(unsupported)?, input(3)?)
        } else {
            (attention::visible_params(a.causal_offset(), a.seq_k), 0)
        };
        let args = [
            Arg::Ptr(input(0)?),
            Arg::Ptr(input(1)?),
            Arg::Ptr(input(2)?),
            Arg::Ptr(out),
            Arg::U32(rows as u32),
            Arg::U32(a.seq_q as u32),
            Arg::U32(a.seq_k as u32),
            Arg::U32(kv_rows),
            Arg::F32(a.scale * std::f32::consts::LOG2_E),
            Arg::U32(u32_of(name, "causal offset", va as usize)?),
            Arg::U32(u32_of(name, "causal offset", vb as usize)?),
            Arg::Ptr(positions),
        ];
        let (hkv, batch) = (a.heads_kv as u32, a.batch as u32);
        let tf32 = a.dtype == DType::F32 && a.precision == compute_core::Precision::Tf32;
        match a.dtype {
            DType::F16 | DType::BF16 | DType::F32 if FlashConfig::fits(d) && (tf32 || a.dtype != DType::F32) => {
                // f32 (TF32 opted in): q, k, v split into bf16 high and low parts first.
                let mut guards = Vec::new();
                let mut args = args.to_vec();
                if tf32 {
                    let layout = op.layout()?;
                    for (i, operand) in layout.inputs().iter().take(3).enumerate() {
                        let (guard, t) = self.temp(operand.len, name)?;
                        self.split_bf16(input(i)?, t, operand.len)?;
                        guards.push(guard);
                        args[i] = Arg::Ptr(t);
                    }
                    let (nq, nkv) = (layout.inputs()[0].len as u64, layout.inputs()[1].len as u64);
                    args.extend([Arg::U64(2 * nq), Arg::U64(2 * nkv)]);
                }
                let default = if tf32 { FlashConfig::for_f32(d) } else { FlashConfig::for_shape(d, rows) };
                let cfg = flash.unwrap_or(default);
                let tiles = rows.div_ceil(cfg.rows() as usize);
                let splits =
                    key_splits(tiles * a.heads_kv * a.batch, a.seq_k.div_ceil(cfg.bn as usize), self.l.sm_count());
                let splits = splits.min(MAX_GRID_YZ / a.batch).max(1);
                // On compute capability 9.0, half data of a head size the wgmma kernel
                // takes, in row tiles that fill the device (no key split), runs it.
                let hopper = forced_hopper.or_else(|| {
                    let auto = flash.is_none() && !tf32 && splits == 1 && rows > 16;
                    (auto && self.l.has_wgmma() && HopperConfig::preferred(d)).then(|| HopperConfig::for_head_dim(d))
                });
                if let Some(h) = hopper {
                    if tf32 {
                        return Err(ComputeError::unsupported_dtype(
                            op,
                            BackendKind::Cuda,
                            a.dtype,
                            "the wgmma attention kernel reads f16 or bf16",
                        ));
                    }
                    let (h, maps) = hopper_tma_maps(self.l, h, a, (input(1)?, input(2)?));
                    let grid = Grid {
                        blocks: (rows.div_ceil(h.rows() as usize) as u32, hkv, batch),
                        threads: (h.threads(), 1, 1),
                        dynamic_smem: h.shared_bytes(),
                    };
                    let mut args = args.to_vec();
                    if let Some((mk, mv)) = maps {
                        args.extend([Arg::TensorMap(mk), Arg::TensorMap(mv)]);
                    }
                    return self.launch(KernelId::AttentionWgmma(h, a.dtype), grid, &args);
                }
                let grid = |z: usize| Grid {
                    blocks: (tiles as u32, hkv, z as u32),
                    threads: (cfg.threads(), 1, 1),
                    dynamic_smem: cfg.shared_bytes(a.dtype),
                };
                if splits == 1 {
                    return self.launch(KernelId::AttentionFlash(cfg, a.dtype), grid(a.batch), &args);
                }
                // Flash-decoding: key splits into f32 partials, then one merge.
                let total = a.batch * a.heads_kv * rows;
                let (_part_guard, part) = self.temp(splits.saturating_mul(total).saturating_mul(d), name)?;
                let (_lse_guard, lse) = self.temp(splits.saturating_mul(total), name)?;
                let tps = a.seq_k.div_ceil(cfg.bn as usize).div_ceil(splits);
                let mut split_args = args.to_vec();
                split_args[3] = Arg::Ptr(part);
                split_args.extend([Arg::Ptr(lse), Arg::U32(tps as u32), Arg::U32(splits as u32)]);
                self.launch(KernelId::AttentionFlashSplit(cfg, a.dtype), grid(a.batch * splits), &split_args)?;
                let rows_per = attention::COMBINE_ROWS as usize;
                limit(name, "attention rows", total.div_ceil(rows_per), MAX_GRID_X)?;
                let grid = Grid {
                    blocks: (total.div_ceil(rows_per) as u32, 1, 1),
                    threads: (32 * attention::COMBINE_ROWS, 1, 1),
                    dynamic_smem: 0,
                };
                let cargs = [
                    Arg::Ptr(part),
                    Arg::Ptr(lse),
                    Arg::Ptr(out),
                    Arg::U32(u32_of(name, "attention rows", total)?),
                    Arg::U32(splits as u32),
                ];
                self.launch(KernelId::AttentionCombine(d as u32, a.dtype), grid, &cargs)
            }
            DType::F32 => {
                limit(name, "head size", d, attention::SIMT_MAX_HEAD_DIM)?;
                let grid = Grid {
                    blocks: (rows.div_ceil(attention::SIMT_ROWS as usize) as u32, hkv, batch),
                    threads: (attention::SIMT_ROWS * 32, 1, 1),
                    dynamic_smem: 0,
                };
                self.launch(KernelId::AttentionSimt(d as u32), grid, &args)
            }
            _ => self.through_f32(op, &Op::Attention(a.with_dtype(DType::F32)), ins, out),
        }
    }

    /// Queues the split of `len` (even) `f32` values at `x` into bf16 high
    /// parts at `parts` and low parts right after them.
    fn split_bf16(&self, x: u64, parts: u64, len: usize) -> Result<()> {
        let pairs = len / 2;
        let blocks = pairs.div_ceil(256).clamp(1, self.l.sm_count() as usize * 16);
        let grid = Grid { blocks: (blocks as u32, 1, 1), threads: (256, 1, 1), dynamic_smem: 0 };
        let args = [Arg::Ptr(x), Arg::Ptr(parts), Arg::Ptr(parts + 2 * len as u64), Arg::U32(pairs as u32)];
        self.launch(KernelId::SplitBf16, grid, &args)
    }

    /// Queues the conversion of `len` values at `x` (`from`) into `y` (`to`).
    fn cast(&self, x: u64, from: DType, y: u64, to: DType, len: usize) -> Result<()> {
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::U64(len as u64)];
        self.launch(KernelId::Cast(from, to), self.stream_grid(len, to), &args)
    }

    /// Whether the kernel the plans pick for `s` applies the epilogue in its
    /// stores: the tensor-core tiers (`mma.sync`, `wgmma`, TMA; the arms of
    /// [`Exec::run`] that call [`Exec::matmul_tc`]) and the GEMV kernels of
    /// `B` stored `n × k`.
    fn fuses_epilogue(&self, s: &MatmulSpec) -> bool {
        let wgmma = self.l.has_wgmma();
        if gemv_chosen(s, wgmma) {
            return s.trans_b;
        }
        let all_f32 = s.dtype == DType::F32 && s.out_dtype == DType::F32;
        (wgmma && tf32_fits(s)) || (!all_f32 && mma_fits(s))
    }

    /// The tensor-core kernel for half product `s` (which [`mma_fits`]) at
    /// device addresses `a`, `b`: TMA-fed `wgmma` where the device has it and
    /// the operands fit its maps ([`tma_fits`]), the `cp.async` `wgmma`
    /// kernel on other compute capability 9.0 cases, `mma.sync` before.
    fn half_tc(&self, s: &MatmulSpec, (a, b): (u64, u64)) -> GemmTc {
        let sms = self.l.sm_count();
        let tma = TmaConfig::for_shape(s.batch, s.m, s.n, sms);
        match GemmTier::choose(s, self.l.has_wgmma()) {
            GemmTier::Wgmma(_) if self.l.has_tma() && tma_fits(&tma, s, (a, b)) => GemmTc::Tma(tma),
            GemmTier::Wgmma(_) => GemmTc::Wgmma(WgmmaConfig::for_shape(s.batch, s.m, s.n, sms)),
            _ => GemmTc::Mma(MmaConfig::default()),
        }
    }

    /// A batched product whose input matrices are spaced otherwise than one
    /// after the other: one product of `batch·m` rows where they share `B`
    /// ([`MatmulSpec::shared_b_as_rows`]); one launch of the `f32` kernels,
    /// which take batch strides, for a plain `f32` product; one launch of
    /// the tensor-core kernels for half data whose matrices all start 16-byte
    /// aligned; else each strided operand gathered into a contiguous
    /// temporary (one strided copy: a read and a write of its matrices) and
    /// the contiguous batched product run on it.
    fn strided_matmul(&self, s: &MatmulSpec, ins: &[u64], out: u64, op: &'static str) -> Result<()> {
        if let Some(rows) = s.shared_b_as_rows() {
            return self.run(&Op::Matmul(rows), ins, out);
        }
        let input = |i: usize| {
            ins.get(i).copied().ok_or_else(|| ComputeError::shape(op, "missing input", Op::Matmul(*s).shapes()))
        };
        let plain_f32 = s.dtype == DType::F32
            && s.out_dtype == DType::F32
            && s.epilogue.is_identity()
            && s.precision == Precision::Full;
        if plain_f32 {
            let strides = Some((s.stride_a(), s.stride_b(), s.m * s.n));
            return self.matmul(GemmTier::choose(s, false), s, input(0)?, input(1)?, out, strides, op);
        }
        // Half data whose every matrix starts 16-byte aligned: the
        // tensor-core kernels read each at its stride (TMA's maps where the
        // matrices are apart, the `cp.async` kernels otherwise).
        let e = s.dtype.size_in_bytes();
        let aligned = [s.stride_a(), s.stride_b()].iter().all(|x| (x * e).is_multiple_of(16));
        if matches!(s.dtype, DType::F16 | DType::BF16) && mma_fits(s) && aligned {
            let (a, b) = (input(0)?, input(1)?);
            return self.matmul_tc(self.half_tc(s, (a, b)), s, (a, b, out), epilogue_inputs(&s.epilogue, ins), op);
        }
        let layout = Op::Matmul(*s).layout()?;
        let mut args = ins.to_vec();
        let mut keep = Vec::new();
        for (i, (stride, size)) in [(s.stride_a(), s.m * s.k), (s.stride_b(), s.k * s.n)].into_iter().enumerate() {
            if stride == size {
                continue;
            }
            let len = layout.inputs().get(i).map_or(0, |o| o.len);
            let from = compute_core::Strided { offset: 0, strides: [stride, size, 1], len };
            let copy = CopySpec::new([s.batch, 1, size], from, compute_core::Strided::contiguous([s.batch, 1, size]));
            let bytes = s.batch * size * s.dtype.size_in_bytes();
            let (guard, to) = self.l.temp(bytes, op)?;
            self.strided_copy(&copy.with_dtype(s.dtype), input(i)?, None, to, op)?;
            keep.push(guard);
            if let Some(arg) = args.get_mut(i) {
                *arg = to;
            }
        }
        let contiguous = MatmulSpec { batch_strides: None, ..*s };
        self.run(&Op::Matmul(contiguous), &args, out)
    }

    /// A product with block-quantized weights: the plain product, or the
    /// one-row kernel with the norm, the gated halves and the epilogue fused
    /// where it runs ([`quant::fuses`]). Elsewhere they are passes of their
    /// own: the norm into an `x`-dtype temporary (`m·k` values) before the
    /// product, the gated halves from an `f32` product (`m·n` values), the
    /// epilogue from an `f32` product by the standalone epilogue kernel.
    fn quant_matmul(&self, s: &QuantMatmulSpec, ins: &[u64], out: u64, op: &Op) -> Result<()> {
        let format = s.weight.block_format().ok_or_else(|| unsupported_dtype(op))?;
        let input =
            |i: usize| ins.get(i).copied().ok_or_else(|| ComputeError::shape(op.name(), "missing input", op.shapes()));
        let (x, w) = (input(0)?, input(1)?);
        let kind = EpilogueKind::of(&s.epilogue);
        let fusion = XFusion { norm: s.rms_norm.is_some(), glu: s.glu, epilogue: kind };
        if fusion == XFusion::default() {
            return run_quant_matmul(self.l, format, s.m, s.k, s.n, s.dtype, s.out_dtype, (x, w, out));
        }
        // The epilogue's inputs follow x, W and the norm's g.
        let e = epilogue_inputs(&s.epilogue, &ins[s.epilogue_at() - 2..]);
        if quant::fuses(s.m, s.k, fusion.norm) {
            let mut args = match s.rms_norm {
                Some(eps) => vec![Arg::Ptr(input(2)?), Arg::F32(eps.0)],
                None => Vec::new(),
            };
            args.extend(e.args(&s.epilogue, 0));
            let dtypes = (s.dtype, s.out_dtype);
            return quant::run_quant_matmul_fused(
                self.l,
                format,
                (s.m, s.k, s.n),
                dtypes,
                (fusion, &args),
                (x, w, out),
            );
        }
        let mut _norm_guard = None;
        let x = match s.rms_norm {
            Some(eps) => {
                let len = s.m.saturating_mul(s.k);
                let (g, h) = self.l.temp(len.saturating_mul(s.dtype.size_in_bytes()).max(16), op.name())?;
                _norm_guard = Some(g);
                let norm = Op::rows(RowOp::RmsNorm { eps: eps.0 }, s.m, s.k).with_dtype(s.dtype);
                self.run(&norm, &[x, input(2)?], h)?;
                h
            }
            None => x,
        };
        let Some(kind) = kind.filter(|_| !s.glu) else {
            if !s.glu {
                return run_quant_matmul(self.l, format, s.m, s.k, s.n, s.dtype, s.out_dtype, (x, w, out));
            }
            let total = s.m.saturating_mul(s.n);
            let (_guard, p) = self.temp(total.max(1), op.name())?;
            run_quant_matmul(self.l, format, s.m, s.k, s.n, s.dtype, DType::F32, (x, w, p))?;
            let glu = Op::Glu { rows: s.m, cols: s.n / 2, dtype: DType::F32 };
            if s.out_dtype == DType::F32 {
                return self.run(&glu, &[p], out);
            }
            let (_g, q) = self.temp((total / 2).max(1), op.name())?;
            self.run(&glu, &[p], q)?;
            return self.cast(q, DType::F32, out, s.out_dtype, total / 2);
        };
        let total = s.m.saturating_mul(s.n);
        let (_guard, p) = self.temp(total.max(1), op.name())?;
        run_quant_matmul(self.l, format, s.m, s.k, s.n, s.dtype, DType::F32, (x, w, p))?;
        self.epilogue_pass(&s.epilogue, kind, e, (p, out, s.out_dtype), (total, s.n), op.name())
    }

    /// The standalone epilogue kernel: `out` (`out_dtype`) from the `total`
    /// values of the `f32` product `p` of `n` columns and the epilogue's
    /// inputs `e`. One pass over `C`; nothing for an empty product.
    fn epilogue_pass(
        &self,
        epilogue: &Epilogue,
        kind: EpilogueKind,
        e: EpilogueInputs,
        (p, out, out_dtype): (u64, u64, DType),
        (total, n): (usize, usize),
        op: &'static str,
    ) -> Result<()> {
        if total == 0 {
            return Ok(());
        }
        let elements = u32_of(op, "matmul epilogue elements", total)?;
        let n = u32_of(op, "n", n)?;
        let mut args = vec![Arg::Ptr(p), Arg::Ptr(out), Arg::U32(elements), Arg::U32(n)];
        args.extend(e.args(epilogue, 0));
        self.launch(KernelId::GemmEpilogue(kind, out_dtype), self.item_grid(total), &args)
    }

    /// `s` as the plain product into an `f32` temporary, then
    /// the standalone epilogue kernel from it into `out` (one more pass over
    /// `C`). Empty products launch nothing.
    fn matmul_then_epilogue(&self, s: &MatmulSpec, ins: &[u64], out: u64, op: &'static str) -> Result<()> {
        let Some(kind) = EpilogueKind::of(&s.epilogue) else {
            return self.run(&Op::Matmul(*s), ins, out);
        };
        let total = s.batch.saturating_mul(s.m).saturating_mul(s.n);
        if total == 0 {
            return Ok(());
        }
        let plain = MatmulSpec { epilogue: Epilogue::default(), out_dtype: DType::F32, ..*s };
        let (_guard, p) = self.temp(total, op)?;
        self.run(&Op::Matmul(plain), ins.get(..2).unwrap_or(ins), p)?;
        let e = epilogue_inputs(&s.epilogue, ins);
        self.epilogue_pass(&s.epilogue, kind, e, (p, out, s.out_dtype), (total, s.n), op)
    }

    /// Runs `op` (a matmul or conv2d with half operands) as `wide`, its `f32`
    /// twin: every input that is not `f32` is widened into an `f32`
    /// temporary, and the result, when its dtype is not `f32`, lands in one
    /// and is rounded into `out`. Extra traffic: one read and a 4-byte write
    /// per half input value, one write and read per output value.
    fn through_f32(&self, op: &Op, wide: &Op, ins: &[u64], out: u64) -> Result<()> {
        let layout = op.layout()?;
        let mut keep = Vec::new();
        let mut wide_ins = Vec::new();
        for (operand, &p) in layout.inputs().iter().zip(ins) {
            if operand.dtype == DType::F32 {
                wide_ins.push(p);
                continue;
            }
            let (guard, tp) = self.temp(operand.len, op.name())?;
            self.cast(p, operand.dtype, tp, DType::F32, operand.len)?;
            keep.push(guard);
            wide_ins.push(tp);
        }
        let result = layout.output();
        if result.dtype == DType::F32 {
            return self.run(wide, &wide_ins, out);
        }
        let (_guard, tp) = self.temp(result.len, op.name())?;
        self.run(wide, &wide_ins, tp)?;
        self.cast(tp, DType::F32, out, result.dtype, result.len)
    }

    /// Grid of the streaming kernels writing `out`: enough blocks to cover
    /// the units ([`elementwise::unit_width`]), at most 16 per multiprocessor
    /// (the loop strides over the rest).
    fn stream_grid(&self, len: usize, out: DType) -> Grid {
        let per_block = elementwise::BLOCK as usize;
        let unit = elementwise::unit_width(out);
        let want = len.div_ceil(unit).div_ceil(per_block).max(1);
        let cap = self.l.sm_count() as usize * 16;
        Grid { blocks: (want.min(cap) as u32, 1, 1), threads: (per_block as u32, 1, 1), dynamic_smem: 0 }
    }

    fn reduce(&self, kind: ReduceKind, dt: DType, xs: &[u64], len: usize, out: u64, op: &'static str) -> Result<()> {
        let threads = reduce::BLOCK;
        let blocks = len.div_ceil(threads as usize * 16).clamp(1, self.l.sm_count() as usize * 4);
        let grid = |b: usize| Grid { blocks: (b as u32, 1, 1), threads: (threads, 1, 1), dynamic_smem: 0 };
        let mut args: Vec<Arg> = xs.iter().map(|&p| Arg::Ptr(p)).collect();
        if blocks == 1 {
            args.extend([Arg::Ptr(out), Arg::U64(len as u64)]);
            return self.launch(KernelId::Reduce(kind, dt), grid(1), &args);
        }
        let (_partials, pp) = self.temp(blocks, op)?;
        args.extend([Arg::Ptr(pp), Arg::U64(len as u64)]);
        self.launch(KernelId::Reduce(kind, dt), grid(blocks), &args)?;
        // The partials are f32 whatever the input's dtype.
        let fin = if kind == ReduceKind::Max { ReduceKind::Max } else { ReduceKind::Sum };
        let args = [Arg::Ptr(pp), Arg::Ptr(out), Arg::U64(blocks as u64)];
        self.launch(KernelId::Reduce(fin, DType::F32), grid(1), &args)
    }

    #[allow(clippy::too_many_arguments)]
    fn rows(
        &self,
        kind: RowKind,
        dt: DType,
        eps: f32,
        x: u64,
        params: &[u64],
        out: u64,
        n_rows: usize,
        cols: usize,
        op: &'static str,
    ) -> Result<()> {
        let r = u32_of(op, "rows", n_rows)?;
        let c = u32_of(op, "columns", cols)?;
        let mut args = vec![Arg::Ptr(x)];
        args.extend(params.iter().map(|&p| Arg::Ptr(p)));
        args.extend([Arg::Ptr(out), Arg::U32(r), Arg::U32(c)]);
        if matches!(kind, RowKind::LayerNorm | RowKind::RmsNorm) {
            args.push(Arg::F32(eps));
        }
        let threads = (rows::BLOCK, 1, 1);
        if cols <= rows::WARP_MAX_COLS {
            let blocks = n_rows.div_ceil(rows::WARP_ROWS as usize);
            limit(op, "row blocks", blocks, MAX_GRID_X)?;
            let smem = rows::WARP_ROWS * c * 4;
            let grid = Grid { blocks: (blocks as u32, 1, 1), threads, dynamic_smem: smem };
            return self.launch(KernelId::Rows(kind, RowShape::Warp, dt), grid, &args);
        }
        limit(op, "row blocks", n_rows, MAX_GRID_X)?;
        let cached = cols <= rows::BLOCK_CACHE_MAX_COLS;
        args.push(Arg::U32(u32::from(cached)));
        let smem = if cached { c * 4 } else { 0 };
        let grid = Grid { blocks: (r, 1, 1), threads, dynamic_smem: smem };
        self.launch(KernelId::Rows(kind, RowShape::Block, dt), grid, &args)
    }

    /// `C = op(A)·op(B)` with `tier`. `batch_strides` overrides the contiguous
    /// batch layout (elements between matrices of A, B, C; 0 shares one).
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        tier: GemmTier,
        s: &MatmulSpec,
        a: u64,
        b: u64,
        c: u64,
        batch_strides: Option<(usize, usize, usize)>,
        op: &'static str,
    ) -> Result<()> {
        let (m, n, k) = (u32_of(op, "m", s.m)?, u32_of(op, "n", s.n)?, u32_of(op, "k", s.k)?);
        let (sa, sb, sc) = batch_strides.unwrap_or((s.m * s.k, s.k * s.n, s.m * s.n));
        // Batches beyond the grid's z limit run as several launches.
        let mut z0 = 0;
        while z0 < s.batch {
            let zc = (s.batch - z0).min(MAX_GRID_YZ);
            let (ao, bo, co) = (a + 4 * (z0 * sa) as u64, b + 4 * (z0 * sb) as u64, c + 4 * (z0 * sc) as u64);
            let strides = [Arg::U64(sa as u64), Arg::U64(sb as u64), Arg::U64(sc as u64)];
            match tier {
                GemmTier::Simt(cfg) => {
                    // (A split kernel takes one more parameter: `SimtSplit` launches it.)
                    let cfg = SimtConfig { split_k: false, ..cfg };
                    let gy = s.m.div_ceil(cfg.bm as usize);
                    limit(op, "GEMM row tiles", gy, MAX_GRID_YZ)?;
                    let gx = s.n.div_ceil(cfg.bn as usize);
                    limit(op, "GEMM column tiles", gx, MAX_GRID_X)?;
                    let grid = Grid {
                        blocks: (gx as u32, gy as u32, zc as u32),
                        threads: (cfg.threads(), 1, 1),
                        dynamic_smem: cfg.dynamic_shared_bytes(),
                    };
                    let mut args =
                        vec![Arg::Ptr(ao), Arg::Ptr(bo), Arg::Ptr(co), Arg::U32(m), Arg::U32(n), Arg::U32(k)];
                    args.extend(strides);
                    self.launch(KernelId::GemmSimt(cfg, s.trans_a, s.trans_b), grid, &args)?;
                }
                // The GEMV plan runs every batch itself.
                GemmTier::Gemv => return self.gemv(s, (a, b, c), batch_strides, None, EpilogueInputs::NONE, op),
                GemmTier::GemvSplit(split) => {
                    let force = Some(GemvForce::Split(split));
                    return self.gemv(s, (a, b, c), batch_strides, force, EpilogueInputs::NONE, op);
                }
                GemmTier::GemvMma(tiles, split) => {
                    let force = Some(GemvForce::Mma(tiles, split));
                    return self.gemv(s, (a, b, c), batch_strides, force, EpilogueInputs::NONE, op);
                }
                GemmTier::SimtSplit(cfg, splits) => {
                    for zi in 0..zc {
                        let z = (z0 + zi) as u64;
                        let abc = (a + 4 * z * sa as u64, b + 4 * z * sb as u64, c + 4 * z * sc as u64);
                        self.matmul_split(cfg, splits, s, abc, op)?;
                    }
                }
                GemmTier::Mma(_) | GemmTier::Wgmma(_) | GemmTier::Tma(_) => {
                    let why = "the tensor-core tiers take f16 or bf16 inputs";
                    return Err(ComputeError::unsupported_dtype(&Op::Matmul(*s), BackendKind::Cuda, s.dtype, why));
                }
                GemmTier::Naive | GemmTier::Tiled => {
                    let id = if tier == GemmTier::Naive { KernelId::GemmNaive } else { KernelId::GemmTiled };
                    let (a_rs, a_cs) = if s.trans_a { (1, m) } else { (k, 1) };
                    let (b_rs, b_cs) = if s.trans_b { (1, k) } else { (n, 1) };
                    let gx = s.n.div_ceil(TILE as usize);
                    limit(op, "GEMM column tiles", gx, MAX_GRID_X)?;
                    // Rows beyond the grid's y limit run as several launches.
                    let rows_per = MAX_GRID_YZ * TILE as usize;
                    let mut i0 = 0;
                    while i0 < s.m {
                        let mc = (s.m - i0).min(rows_per);
                        let a_i = ao + 4 * (i0 as u64) * u64::from(a_rs);
                        let c_i = co + 4 * (i0 as u64) * u64::from(n);
                        let grid = Grid {
                            blocks: (gx as u32, mc.div_ceil(TILE as usize) as u32, zc as u32),
                            threads: (TILE, TILE, 1),
                            dynamic_smem: 0,
                        };
                        let mut args = vec![
                            Arg::Ptr(a_i),
                            Arg::Ptr(bo),
                            Arg::Ptr(c_i),
                            Arg::U32(mc as u32),
                            Arg::U32(n),
                            Arg::U32(k),
                            Arg::U32(a_rs),
                            Arg::U32(a_cs),
                            Arg::U32(b_rs),
                            Arg::U32(b_cs),
                        ];
                        args.extend(strides);
                        self.launch(id, grid, &args)?;
                        i0 += mc;
                    }
                }
            }
            z0 += zc;
        }
        Ok(())
    }

    /// One `f32` matrix `C = op(A)·op(B)` on the register-blocked kernel in
    /// shape `cfg` with `k` split into `splits` slices (rounded to whole
    /// k-tiles; one slice runs [`GemmTier::Simt`] on `C` directly): the
    /// slices' partials into a temporary, then [`gemv::combine`] adds them in
    /// slice order into `C`, the same sum on every run.
    fn matmul_split(
        &self,
        cfg: SimtConfig,
        splits: Splits,
        s: &MatmulSpec,
        (a, b, c): (u64, u64, u64),
        op: &'static str,
    ) -> Result<()> {
        let one = MatmulSpec { batch: 1, ..*s };
        let splits = match splits {
            Splits::Fixed(n) => n,
            Splits::Fill(per_sm) => {
                let tiles = s.m.div_ceil(cfg.bm as usize) * s.n.div_ceil(cfg.bn as usize);
                let fill = (per_sm as usize * self.l.sm_count() as usize) / tiles.max(1);
                let auto = fill.min(MAX_AUTO_SPLITS).min(s.k / SimtConfig::SPLIT_MIN_K);
                if auto <= 1 {
                    let unsplit = GemmTier::Simt(SimtConfig::thin_for(s.m, s.n));
                    return self.matmul(unsplit, &one, a, b, c, None, op);
                }
                auto as u32
            }
        };
        let kc = s.k.div_ceil(splits.max(1) as usize).next_multiple_of(cfg.bk as usize).max(cfg.bk as usize);
        let slices = s.k.div_ceil(kc);
        let cfg = SimtConfig { split_k: slices > 1, ..cfg };
        if slices <= 1 || s.m == 0 || s.n == 0 {
            return self.matmul(GemmTier::Simt(cfg), &one, a, b, c, None, op);
        }
        let (m, n, k) = (u32_of(op, "m", s.m)?, u32_of(op, "n", s.n)?, u32_of(op, "k", s.k)?);
        let mn = u32_of(op, "m * n", s.m * s.n)?;
        let gy = s.m.div_ceil(cfg.bm as usize);
        limit(op, "GEMM row tiles", gy, MAX_GRID_YZ)?;
        let gx = s.n.div_ceil(cfg.bn as usize);
        limit(op, "GEMM column tiles", gx, MAX_GRID_X)?;
        limit(op, "GEMM k-slices", slices, MAX_GRID_YZ)?;
        let (_partials, part) = self.temp(slices * s.m * s.n, op)?;
        // Where slice z starts in each operand: along the stored rows when
        // k runs along them, else k rows further.
        let sa = if s.trans_a { kc * s.m } else { kc };
        let sb = if s.trans_b { kc } else { kc * s.n };
        let grid = Grid {
            blocks: (gx as u32, gy as u32, slices as u32),
            threads: (cfg.threads(), 1, 1),
            dynamic_smem: cfg.dynamic_shared_bytes(),
        };
        let args = [
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::Ptr(part),
            Arg::U32(m),
            Arg::U32(n),
            Arg::U32(k),
            Arg::U64(sa as u64),
            Arg::U64(sb as u64),
            Arg::U64(u64::from(mn)),
            Arg::U32(kc as u32),
        ];
        self.launch(KernelId::GemmSimt(cfg, s.trans_a, s.trans_b), grid, &args)?;
        let grid = Grid {
            blocks: ((mn as usize).div_ceil(gemv::COMBINE_BLOCK as usize) as u32, 1, 1),
            threads: (gemv::COMBINE_BLOCK, 1, 1),
            dynamic_smem: 0,
        };
        let args = [Arg::Ptr(part), Arg::Ptr(c), Arg::U32(mn), Arg::U32(slices as u32), Arg::U64(u64::from(mn))];
        self.launch(KernelId::GemvCombine(DType::F32), grid, &args)
    }

    /// `C = A·op(B)` on the GEMV kernels (any of the three dtypes in and out;
    /// `batch_strides` as for [`Exec::matmul`]). `B` stored `n × k`: one
    /// launch of `split` warps per group of output columns, the tensor-core
    /// kernel for 9 to 16 rows of 16-byte aligned half rows
    /// ([`gemv::nt_mma`], split from [`gemv::mma_split`]), the CUDA-core
    /// kernel otherwise (split from [`gemv::nt_split`]), unless `force`
    /// says which. `B` stored `k × n`: one launch over (column blocks,
    /// k-splits, batch) writing `f32` partials, then the combine kernel,
    /// unless a single split of an `f32` output writes `C` directly. A
    /// product that [`gemv_fits`] declines, a forced split not in
    /// [`gemv::NT_SPLITS`], or a forced tensor-core shape the product does
    /// not suit, is a `Shape` error. Empty products launch nothing.
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &self,
        s: &MatmulSpec,
        (a, b, c): (u64, u64, u64),
        batch_strides: Option<(usize, usize, usize)>,
        force: Option<GemvForce>,
        epi: EpilogueInputs,
        op: &'static str,
    ) -> Result<()> {
        if !gemv_fits(s) {
            let why = "the GEMV tier takes 1 to 8 rows of A stored m x k (16 with B stored n x k), and m*n, k and n under 2^32";
            return Err(ComputeError::shape(op, why, Op::Matmul(*s).shapes()));
        }
        let split = match force {
            Some(GemvForce::Split(sp) | GemvForce::Mma(_, sp)) => Some(sp),
            None => None,
        };
        if let Some(split) = split.filter(|sp| !gemv::NT_SPLITS.contains(sp)) {
            let why = format!("the GEMV k-split is 1, 2, 4 or 8 warps per column group, not {split}");
            return Err(ComputeError::shape(op, why, Op::Matmul(*s).shapes()));
        }
        if let Some(GemvForce::Mma(tiles, _)) = force
            && (!gemv::MMA_TILES.contains(&tiles) || !s.trans_b || elem::half(s.dtype).is_none())
        {
            let why = format!(
                "the tensor-core GEMV takes f16 or bf16 with B stored n x k in 1, 2 or 4 tiles of 8 columns, not {tiles}"
            );
            return Err(ComputeError::shape(op, why, Op::Matmul(*s).shapes()));
        }
        if s.batch == 0 || s.n == 0 {
            return Ok(());
        }
        let (m, n, k) = (u32_of(op, "m", s.m)?, u32_of(op, "n", s.n)?, u32_of(op, "k", s.k)?);
        let mn = u32_of(op, "m * n", s.m * s.n)?;
        // Only B stored n x k applies an epilogue in its stores (the caller checked).
        let kind = if s.trans_b { EpilogueKind::of(&s.epilogue) } else { None };
        let (sa, sb, sc) = batch_strides.unwrap_or((s.m * s.k, s.k * s.n, s.m * s.n));
        let (ea, ec) = (s.dtype.size_in_bytes() as u64, s.out_dtype.size_in_bytes() as u64);
        let rows = gemv::rows_for(s.m);
        let v = gemv::vector_width(s.dtype) as usize;
        let aligned = |p: u64| p.is_multiple_of(16);
        let chunk = s.batch.min(MAX_GRID_YZ);
        // k × n: the splits that fill the device (about 6 blocks of 128 threads
        // per multiprocessor), each at least 8 rows of k per slice, their
        // partials at most an eighth of the bytes of B.
        let splits = if s.trans_b {
            1
        } else {
            let col_blocks = s.n.div_ceil(gemv::nn_block_cols(s.dtype) as usize);
            let want = (6 * self.l.sm_count() as usize).div_ceil(col_blocks);
            let by_rows = s.k.div_ceil(8 * gemv::NN_SLICES as usize);
            let by_bytes = s.k * ea as usize / (32 * s.m);
            let splits = want.min(by_rows).min(by_bytes).clamp(1, MAX_GRID_YZ);
            let kc = s.k.div_ceil(splits).max(1);
            s.k.div_ceil(kc).max(1)
        };
        let kc = s.k.div_ceil(splits);
        let direct = s.trans_b || (splits == 1 && s.out_dtype == DType::F32);
        let per_batch = splits * s.m * s.n;
        let (_partials, part) = if direct {
            (None, 0)
        } else {
            let (g, p) = self.temp(per_batch * chunk, op)?;
            (Some(g), p)
        };
        let mut z0 = 0;
        while z0 < s.batch {
            let zc = (s.batch - z0).min(MAX_GRID_YZ);
            let z = z0 as u64;
            let (ao, bo, co) = (a + ea * z * sa as u64, b + ea * z * sb as u64, c + ec * z * sc as u64);
            if s.trans_b {
                let vec =
                    s.k.is_multiple_of(v) && sa.is_multiple_of(v) && sb.is_multiple_of(v) && aligned(ao) && aligned(bo);
                let tensor_cores = match force {
                    Some(GemvForce::Mma(..)) if !vec => {
                        let why = "the tensor-core GEMV needs k a multiple of 8 and 16-byte aligned rows of A and B";
                        return Err(ComputeError::shape(op, why, Op::Matmul(*s).shapes()));
                    }
                    Some(GemvForce::Mma(tiles, split)) => Some((tiles, split)),
                    Some(GemvForce::Split(_)) => None,
                    None if s.m > gemv::NN_MAX_ROWS && elem::half(s.dtype).is_some() && vec => {
                        let tiles = gemv::MMA_DEFAULT_TILES;
                        Some((tiles, gemv::mma_split(s.k, tiles)))
                    }
                    None => None,
                };
                if let Some((tiles, split)) = tensor_cores {
                    let gx = s.n.div_ceil(gemv::mma_block_cols(tiles, split) as usize);
                    limit(op, "GEMV column blocks", gx, MAX_GRID_X)?;
                    let grid =
                        Grid { blocks: (gx as u32, 1, zc as u32), threads: (gemv::NT_BLOCK, 1, 1), dynamic_smem: 0 };
                    let mut args = vec![
                        Arg::Ptr(ao),
                        Arg::Ptr(bo),
                        Arg::Ptr(co),
                        Arg::U32(m),
                        Arg::U32(n),
                        Arg::U32(k),
                        Arg::U32(split),
                        Arg::U64(sa as u64),
                        Arg::U64(sb as u64),
                        Arg::U64(sc as u64),
                    ];
                    args.extend(epi.args(&s.epilogue, ec * z * sc as u64));
                    self.launch(KernelId::GemvNtMma(tiles, s.dtype, s.out_dtype, kind), grid, &args)?;
                    z0 += zc;
                    continue;
                }
                let split = split.unwrap_or_else(|| gemv::nt_split(s.m, s.n, s.k, s.dtype, self.l.sm_count()));
                let gx = s.n.div_ceil(gemv::nt_block_cols(rows, split) as usize);
                limit(op, "GEMV column blocks", gx, MAX_GRID_X)?;
                let grid = Grid { blocks: (gx as u32, 1, zc as u32), threads: (gemv::NT_BLOCK, 1, 1), dynamic_smem: 0 };
                let mut args = vec![
                    Arg::Ptr(ao),
                    Arg::Ptr(bo),
                    Arg::Ptr(co),
                    Arg::U32(m),
                    Arg::U32(n),
                    Arg::U32(k),
                    Arg::U32(u32::from(vec)),
                    Arg::U32(split),
                    Arg::U64(sa as u64),
                    Arg::U64(sb as u64),
                    Arg::U64(sc as u64),
                ];
                args.extend(epi.args(&s.epilogue, ec * z * sc as u64));
                self.launch(KernelId::GemvNt(rows, s.dtype, s.out_dtype, kind), grid, &args)?;
            } else {
                let (dest, sp) = if direct { (co, sc) } else { (part, per_batch) };
                let vec = s.n.is_multiple_of(v)
                    && sb.is_multiple_of(v)
                    && sp.is_multiple_of(v)
                    && aligned(bo)
                    && aligned(dest);
                let gx = s.n.div_ceil(gemv::nn_block_cols(s.dtype) as usize);
                limit(op, "GEMV column blocks", gx, MAX_GRID_X)?;
                let grid = Grid {
                    blocks: (gx as u32, splits as u32, zc as u32),
                    threads: (gemv::NN_THREADS_X, gemv::NN_SLICES, 1),
                    dynamic_smem: 0,
                };
                let args = [
                    Arg::Ptr(ao),
                    Arg::Ptr(bo),
                    Arg::Ptr(dest),
                    Arg::U32(m),
                    Arg::U32(n),
                    Arg::U32(k),
                    Arg::U32(kc as u32),
                    Arg::U32(u32::from(vec)),
                    Arg::U64(sa as u64),
                    Arg::U64(sb as u64),
                    Arg::U64(sp as u64),
                ];
                self.launch(KernelId::GemvNn(rows, s.dtype), grid, &args)?;
                if !direct {
                    let gx = (mn as usize).div_ceil(gemv::COMBINE_BLOCK as usize);
                    let grid = Grid {
                        blocks: (gx as u32, 1, zc as u32),
                        threads: (gemv::COMBINE_BLOCK, 1, 1),
                        dynamic_smem: 0,
                    };
                    let args =
                        [Arg::Ptr(part), Arg::Ptr(co), Arg::U32(mn), Arg::U32(splits as u32), Arg::U64(sc as u64)];
                    self.launch(KernelId::GemvCombine(s.out_dtype), grid, &args)?;
                }
            }
            z0 += zc;
        }
        Ok(())
    }

    /// The operands of a TF32 product that `rounding` has a separate pass
    /// round before the kernel ([`Tf32Rounding::rounded_before`]), rounded to
    /// nearest into temporaries laid out as the operands are (from the first
    /// matrix to the end of the last, at the spec's batch strides): the
    /// addresses the kernel reads, and the temporaries' guards, to hold until
    /// it is queued. One launch per operand rounded.
    fn round_tf32_before(
        &self,
        rounding: Tf32Rounding,
        s: &MatmulSpec,
        (a, b): (u64, u64),
        op: &'static str,
    ) -> Result<(Vec<TempGuard>, u64, u64)> {
        let (round_a, round_b) = rounding.rounded_before();
        let mut guards = Vec::new();
        let mut round = |src: u64, len: usize| -> Result<u64> {
            let (guard, dst) = self.l.temp(4 * len, op)?;
            guards.push(guard);
            let grid = self.stream_grid(len, DType::F32);
            self.launch(KernelId::RoundTf32, grid, &[Arg::Ptr(src), Arg::Ptr(dst), Arg::U64(len as u64)])?;
            Ok(dst)
        };
        let span = |stride: usize, matrix: usize| s.batch.saturating_sub(1) * stride + matrix;
        let a = if round_a { round(a, span(s.stride_a(), s.m * s.k))? } else { a };
        let b = if round_b { round(b, span(s.stride_b(), s.k * s.n))? } else { b };
        Ok((guards, a, b))
    }

    /// `C = op(A)·op(B)` on the TMA-fed kernel: one launch of at most one
    /// block per multiprocessor over every batch's tiles; the caller checked
    /// [`tma_fits`].
    fn matmul_tma(
        &self,
        cfg: &TmaConfig,
        s: &MatmulSpec,
        (a, b, c): (u64, u64, u64),
        epi: EpilogueInputs,
        op: &'static str,
    ) -> Result<()> {
        // TF32 operands that the kernel reads rounded already, and the kernel that reads them.
        let (_rounded, a, b) = match s.dtype {
            DType::F32 => self.round_tf32_before(cfg.tf32, s, (a, b), op)?,
            _ => (Vec::new(), a, b),
        };
        let cfg = &cfg.kernel();
        let (m, n, k) = (u32_of(op, "m", s.m)?, u32_of(op, "n", s.n)?, u32_of(op, "k", s.k)?);
        let batch = u32_of(op, "batch", s.batch)?;
        let tiles = s.batch * s.m.div_ceil(cfg.bm() as usize) * s.n.div_ceil(cfg.bn as usize);
        let blocks = tiles.min(self.l.sm_count().max(1) as usize) as u32;
        // `B` with rows off the 128-byte lines is copied into rows that are
        // first, on large products (see `REALIGN_MIN_MN`); `A` never.
        let e = s.dtype.size_in_bytes();
        let mut guards = Vec::new();
        // Each operand's address, row length in memory and batch stride.
        let mut aligned = |addr: u64, is_a: bool| -> Result<(u64, usize, usize)> {
            let (rows, len) = stored_rows(s, is_a);
            let stride = if is_a { s.stride_a() } else { s.stride_b() };
            if is_a || (len * e).is_multiple_of(128) || s.m.min(s.n) < gemm_tma::REALIGN_MIN_MN {
                return Ok((addr, len, stride));
            }
            let ld = len.next_multiple_of(128 / e);
            let (guard, to) = self.l.temp(s.batch * rows * ld * e, op)?;
            guards.push(guard);
            let from_len = (s.batch - 1) * stride + rows * len;
            let copy = CopySpec {
                shape: [s.batch, rows, len],
                src: compute_core::Strided { offset: 0, strides: [stride, len, 1], len: from_len },
                dst: compute_core::Strided { offset: 0, strides: [rows * ld, ld, 1], len: s.batch * rows * ld },
                dtype: s.dtype,
                positions: None,
            };
            self.strided_copy(&copy, addr, None, to, op)?;
            Ok((to, ld, rows * ld))
        };
        let (a, lda, sa) = aligned(a, true)?;
        let (b, ldb, sb) = aligned(b, false)?;
        let (ma, mb) = gemm_tma::tensor_maps_strided(
            cfg,
            s.dtype,
            (s.batch, s.m, s.n, s.k),
            (s.trans_a, s.trans_b),
            (a, b),
            (lda, ldb),
            (Some(sa), Some(sb)),
        );
        let grid =
            Grid { blocks: (blocks, 1, 1), threads: (cfg.threads(), 1, 1), dynamic_smem: cfg.dynamic_shared_bytes() };
        let mut args = vec![
            Arg::TensorMap(ma),
            Arg::TensorMap(mb),
            Arg::Ptr(c),
            Arg::U32(m),
            Arg::U32(n),
            Arg::U32(k),
            Arg::U32(batch),
            Arg::U64((s.m * s.n) as u64),
        ];
        args.extend(epi.args(&s.epilogue, 0));
        let kind = EpilogueKind::of(&s.epilogue);
        self.launch(KernelId::GemmTma(*cfg, s.dtype, s.out_dtype, s.trans_a, s.trans_b, kind), grid, &args)
    }

    /// `C = op(A)·op(B)` on tensor cores (`f16`/`bf16` inputs; batches at
    /// the spec's strides, which the caller checked keep every matrix 16-byte
    /// aligned); the caller checked that `tc` takes `s`. Empty products launch nothing.
    fn matmul_tc(
        &self,
        tc: GemmTc,
        s: &MatmulSpec,
        (a, b, c): (u64, u64, u64),
        epi: EpilogueInputs,
        op: &'static str,
    ) -> Result<()> {
        if s.batch == 0 || s.m == 0 || s.n == 0 {
            return Ok(());
        }
        let (m, n, k) = (u32_of(op, "m", s.m)?, u32_of(op, "n", s.n)?, u32_of(op, "k", s.k)?);
        let (sa, sb, sc) = (s.stride_a(), s.stride_b(), s.m * s.n);
        let (ea, ec) = (s.dtype.size_in_bytes() as u64, s.out_dtype.size_in_bytes() as u64);
        if let GemmTc::Tma(cfg) = tc {
            return self.matmul_tma(&cfg, s, (a, b, c), epi, op);
        }
        // TF32 operands that the cp.async kernel reads rounded already.
        let (_rounded, a, b) = match tc {
            GemmTc::Wgmma(cfg) if s.dtype == DType::F32 => self.round_tf32_before(cfg.tf32, s, (a, b), op)?,
            _ => (Vec::new(), a, b),
        };
        let kind = EpilogueKind::of(&s.epilogue);
        let (bm, bn, threads, smem, id) = match tc {
            GemmTc::Mma(cfg) => (
                cfg.bm,
                cfg.bn,
                cfg.threads(),
                cfg.dynamic_shared_bytes(),
                KernelId::GemmMma(cfg, s.dtype, s.out_dtype, s.trans_a, s.trans_b, kind),
            ),
            GemmTc::Wgmma(cfg) => (
                cfg.bm(),
                cfg.bn,
                cfg.threads(),
                cfg.dynamic_shared_bytes(),
                KernelId::GemmWgmma(cfg, s.dtype, s.out_dtype, s.trans_a, s.trans_b, kind),
            ),
            GemmTc::Tma(_) => return Ok(()),
        };
        let gy = s.m.div_ceil(bm as usize);
        limit(op, "GEMM row tiles", gy, MAX_GRID_YZ)?;
        let gx = s.n.div_ceil(bn as usize);
        limit(op, "GEMM column tiles", gx, MAX_GRID_X)?;
        // Batches beyond the grid's z limit run as several launches.
        let mut z0 = 0;
        while z0 < s.batch {
            let zc = (s.batch - z0).min(MAX_GRID_YZ);
            let z = z0 as u64;
            let (ao, bo, co) = (a + ea * z * sa as u64, b + ea * z * sb as u64, c + ec * z * sc as u64);
            let grid = Grid { blocks: (gx as u32, gy as u32, zc as u32), threads: (threads, 1, 1), dynamic_smem: smem };
            let mut args = vec![
                Arg::Ptr(ao),
                Arg::Ptr(bo),
                Arg::Ptr(co),
                Arg::U32(m),
                Arg::U32(n),
                Arg::U32(k),
                Arg::U64(sa as u64),
                Arg::U64(sb as u64),
                Arg::U64(sc as u64),
            ];
            args.extend(epi.args(&s.epilogue, ec * z * sc as u64));
            self.launch(id, grid, &args)?;
            z0 += zc;
        }
        Ok(())
    }

    /// im2col into a temporary, then one batched GEMM per chunk of images.
    fn conv2d(&self, c: &Conv2dSpec, x: u64, w: u64, y: u64, op: &'static str) -> Result<()> {
        let (oh, ow) = c
            .output_hw()
            .ok_or_else(|| ComputeError::shape(op, "kernel larger than padded input", Op::Conv2d(*c).shapes()))?;
        let kk = c.c_in * c.kh * c.kw;
        let pix = oh * ow;
        let per_image = kk * pix;
        let total = u32_of(op, "im2col elements per image", per_image)?;
        let p: Vec<u32> = [c.c_in, c.h, c.w, c.kh, c.kw, c.stride.0, c.stride.1, c.padding.0, c.padding.1, oh, ow]
            .iter()
            .map(|&v| u32_of(op, "convolution size", v))
            .collect::<Result<_>>()?;
        let images_per_chunk = (COL_CHUNK_FLOATS / per_image).clamp(1, MAX_GRID_YZ);
        let (_col, col) = self.temp(per_image * images_per_chunk.min(c.n), op)?;
        let mut n0 = 0;
        while n0 < c.n {
            let nc = (c.n - n0).min(images_per_chunk);
            let xo = x + 4 * (n0 * c.c_in * c.h * c.w) as u64;
            let yo = y + 4 * (n0 * c.c_out * pix) as u64;
            let mut args = vec![Arg::Ptr(xo), Arg::Ptr(col)];
            args.extend(p.iter().map(|&v| Arg::U32(v)));
            let blocks = (total as usize).div_ceil(conv::BLOCK as usize);
            let grid = Grid { blocks: (blocks as u32, nc as u32, 1), threads: (conv::BLOCK, 1, 1), dynamic_smem: 0 };
            self.launch(KernelId::Im2col, grid, &args)?;
            let spec = MatmulSpec { batch: nc, ..MatmulSpec::new(c.c_out, kk, pix) };
            self.matmul(GemmTier::choose(&spec, false), &spec, w, col, yo, Some((0, per_image, c.c_out * pix)), op)?;
            n0 += nc;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute_core::{Precision, UnaryOp};

    #[test]
    fn every_dtype_of_the_vocabulary_is_supported() {
        let relu = Op::unary(UnaryOp::Relu, 8);
        for d in elem::DTYPES {
            assert!(supported(&relu.with_dtype(d)));
            for to in elem::DTYPES {
                assert!(supported(&Op::cast(8, d, to)));
            }
        }
        assert!(supported(&Op::Matmul(MatmulSpec::new(2, 3, 4).with_precision(Precision::Tf32))));
        assert!(supported(&Op::Matmul(MatmulSpec::new(2, 3, 4).with_dtypes(DType::BF16, DType::F32))));
    }

    #[test]
    fn quantized_matmuls_and_dequantizing_casts_are_supported_quantizing_is_not() {
        for w in DType::QUANTIZED {
            for d in elem::DTYPES {
                for to in elem::DTYPES {
                    let spec = compute_core::QuantMatmulSpec::new(2, 256, 3, w).with_dtypes(d, to);
                    assert!(supported(&Op::QuantMatmul(spec)), "{w}: {d} to {to}");
                }
                assert!(supported(&Op::cast(256, w, d)));
                let quantize = Op::cast(256, d, w);
                assert!(!supported(&quantize));
                assert!(
                    matches!(unsupported_dtype(&quantize), ComputeError::UnsupportedDType { dtype, .. } if dtype == w)
                );
            }
            assert!(supported(&Op::cast(256, w, w)));
        }
    }

    #[test]
    fn host_views_are_f32_only_when_every_view_is() {
        let x = [1.0f32, -2.0];
        let mut out = [7.0f32; 2];
        let (ins, o) = f32_views(&[HostSlice::from(&x[..])], (&mut out[..]).into()).unwrap();
        assert_eq!((ins, o.len()), (vec![&x[..]], 2));
        let h = [compute_core::f16::ONE; 2];
        assert!(f32_views(&[HostSlice::from(&h[..])], (&mut out[..]).into()).is_none());
        let mut ho = [compute_core::f16::ZERO; 2];
        assert!(f32_views(&[HostSlice::from(&x[..])], (&mut ho[..]).into()).is_none());
    }
}

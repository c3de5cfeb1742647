//! Bench rows for the tensor-core GEMM (`bf16`/`f16` inputs, `f32`
//! accumulation, output of the input's dtype, as PyTorch's `a @ b`), each
//! beside cuBLAS's `cublasGemmEx` on copies of the same inputs in the same
//! process (compute type `CUBLAS_COMPUTE_32F`, default algorithm), interleaved.
//!
//! Each row runs the kernel the backend picks (`wgmma` on compute capability
//! 9.0, `mma.sync` otherwise). Rows: bf16 2048³, 4096³ and 8192³
//! as `A·B` and as `A·Bᵀ` (`B` stored `n × k`, a weight matrix as in `x·Wᵀ`),
//! f16 4096³ and 8192³ as `A·Bᵀ`, and the LLM shapes `m×n×k`
//! 4096×4096×14336, 4096×14336×4096 and 512×4096×4096 in bf16 as `A·Bᵀ`, and
//! 4095×4094×4088, a ragged neighbour of 4096³ (goal ≥ 0.9× the aligned one;
//! with the sweep also 4096×4096×4088 and 4095×4094×4096).
//! On compute capability 9.0, `f32` with TF32 opted in (`A·Bᵀ`) on the `wgmma`
//! kernel at 4096³ and 8192³ against cuBLAS's TF32 GEMM
//! (`CUBLAS_COMPUTE_32F_FAST_TF32`).
//! `--quick`: 2048³ only. `COMPUTE_PTX_GEMM_SWEEP=1` adds every shape of
//! `gemm_mma::sweep_configs` and `gemm_wgmma::sweep_configs` at 4096³ and
//! 8192³ bf16 (`COMPUTE_PTX_GEMM_SWEEP=wgmma`: only the `wgmma` ones on a
//! device that has them), and those of `gemm_wgmma::tf32_sweep_configs` in
//! TF32, each compared element by element with the first TF32 shape's output.
//! Then, without the sweep, strided batches (8 products of 2048³, `B` shared
//! or `A` spaced, against `cublasGemmStridedBatchedEx`; not with `--quick`)
//! and the GEMV rows of [`crate::cuda_gemv`] (the kernels for few rows).
//! Each row's note gives the largest difference from cuBLAS relative to the
//! largest |C|.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use compute_core::{Backend, DType, HostVec, MatmulSpec, Precision, Tensor};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::GemmTier;
use compute_ptx::kernels::gemm_mma::{self, MmaConfig};
use compute_ptx::kernels::gemm_tma::{self, TmaConfig};
use compute_ptx::kernels::gemm_wgmma::{self, Tf32Rounding, WgmmaConfig};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::{CudaBlas, result};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::cuda::{err, random, record};
use crate::report::{Record, time_pair};

/// One product: `m × n × k`, `B` stored `n × k` when `trans_b`.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) trans_b: bool,
}

impl Shape {
    /// cuBLAS's operation on `B` and its leading dimension, for the
    /// row-major product computed as the column-major `Cᵀ = op(B)ᵀ·Aᵀ`.
    fn b_op(self) -> (cublasOperation_t, usize) {
        if self.trans_b { (cublasOperation_t::CUBLAS_OP_T, self.k) } else { (cublasOperation_t::CUBLAS_OP_N, self.n) }
    }
}

/// cuBLAS on its own stream of the same device.
pub(crate) struct Blas {
    pub(crate) stream: Arc<CudaStream>,
    blas: CudaBlas,
}

impl Blas {
    pub(crate) fn new() -> Result<Blas, String> {
        // SAFETY: only probes whether the cuBLAS library can be loaded.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("cuBLAS (libcublas) not found: add /usr/local/cuda/lib64 to LD_LIBRARY_PATH".into());
        }
        let ctx = CudaContext::new(0).map_err(err)?;
        let stream = ctx.new_stream().map_err(err)?;
        let blas = CudaBlas::new(stream.clone()).map_err(err)?;
        Ok(Blas { stream, blas })
    }

    /// Row-major `C = A·op(B)` in `dtype`, as the column-major `Cᵀ = op(B)ᵀ·Aᵀ`.
    fn gemm(
        &self,
        dtype: DType,
        s: Shape,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<u16>,
    ) -> Result<(), String> {
        let ty = if dtype == DType::BF16 { cudaDataType_t::CUDA_R_16BF } else { cudaDataType_t::CUDA_R_16F };
        let (pa, _ra) = a.device_ptr(&self.stream);
        let (pb, _rb) = b.device_ptr(&self.stream);
        let (pc, _rc) = c.device_ptr_mut(&self.stream);
        // SAFETY: a, b and c hold m·k, k·n and m·n values of `dtype` on this stream.
        unsafe { self.gemm_raw((ty, cublasComputeType_t::CUBLAS_COMPUTE_32F), s, (pa, pb, pc)) }
    }

    /// Row-major `C = A·op(B)` over a batch, matrix `z` of `A` at element
    /// `z·sa` and of `B` at `z·sb`, `C` contiguous (`cublasGemmStridedBatchedEx`).
    fn gemm_strided(
        &self,
        dtype: DType,
        s: Shape,
        (batch, sa, sb): (usize, usize, usize),
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<u16>,
    ) -> Result<(), String> {
        let ty = if dtype == DType::BF16 { cudaDataType_t::CUDA_R_16BF } else { cudaDataType_t::CUDA_R_16F };
        let (pa, _ra) = a.device_ptr(&self.stream);
        let (pb, _rb) = b.device_ptr(&self.stream);
        let (pc, _rc) = c.device_ptr_mut(&self.stream);
        let (opb, ldb) = s.b_op();
        let (alpha, beta) = (1.0f32, 0.0f32);
        let int = |v: usize| i32::try_from(v).map_err(err);
        let long = |v: usize| i64::try_from(v).map_err(err);
        // SAFETY: `a` holds (batch − 1)·sa + m·k values, `b` (batch − 1)·sb +
        // k·n and `c` batch·m·n, all of `dtype` on this stream; the leading
        // dimensions are the row-major ones; alpha and beta are f32.
        unsafe {
            result::gemm_strided_batched_ex(
                *self.blas.handle(),
                opb,
                cublasOperation_t::CUBLAS_OP_N,
                int(s.n)?,
                int(s.m)?,
                int(s.k)?,
                (&alpha) as *const f32 as *const c_void,
                pb as *const c_void,
                ty,
                int(ldb)?,
                long(sb)?,
                pa as *const c_void,
                ty,
                int(s.k)?,
                long(sa)?,
                (&beta) as *const f32 as *const c_void,
                pc as *mut c_void,
                ty,
                int(s.n)?,
                long(s.m * s.n)?,
                int(batch)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(err)
    }

    /// The same in `f32` with TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    fn gemm_tf32(
        &self,
        s: Shape,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> Result<(), String> {
        let (pa, _ra) = a.device_ptr(&self.stream);
        let (pb, _rb) = b.device_ptr(&self.stream);
        let (pc, _rc) = c.device_ptr_mut(&self.stream);
        let kind = (cudaDataType_t::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32);
        // SAFETY: a, b and c hold m·k, k·n and m·n f32 values on this stream.
        unsafe { self.gemm_raw(kind, s, (pa, pb, pc)) }
    }

    /// `cublasGemmEx` on raw device addresses, alpha 1 and beta 0 in `f32`.
    ///
    /// # Safety
    /// The three addresses must hold m·k, k·n and m·n values of the data
    /// type on this handle's stream's device, and stay alive until it runs.
    pub(crate) unsafe fn gemm_raw(
        &self,
        (ty, compute): (cudaDataType_t, cublasComputeType_t),
        s: Shape,
        (pa, pb, pc): (u64, u64, u64),
    ) -> Result<(), String> {
        let (opb, ldb) = s.b_op();
        let (alpha, beta) = (1.0f32, 0.0f32);
        let int = |v: usize| i32::try_from(v).map_err(err);
        // SAFETY: the caller vouches for the buffers; the sizes and leading
        // dimensions are those of the row-major product; alpha and beta are
        // f32, as both compute types require.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                opb,
                cublasOperation_t::CUBLAS_OP_N,
                int(s.n)?,
                int(s.m)?,
                int(s.k)?,
                (&alpha) as *const f32 as *const c_void,
                pb as *const c_void,
                ty,
                int(ldb)?,
                pa as *const c_void,
                ty,
                int(s.k)?,
                (&beta) as *const f32 as *const c_void,
                pc as *mut c_void,
                ty,
                int(s.n)?,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(err)
    }
}

/// The same random `dtype` values on our device and in a cuBLAS buffer.
fn operand(
    be: &CudaBackend,
    blas: &Blas,
    len: usize,
    dtype: DType,
    seed: u64,
) -> Result<(Tensor, CudaSlice<u16>), String> {
    let host = HostVec::from_f32(dtype, &random(len, seed));
    let ours = be.upload_typed(host.as_slice()).map_err(err)?;
    let bits: Vec<u16> = host.bits().into_iter().map(|b| b as u16).collect();
    let theirs = blas.stream.clone_htod(&bits).map_err(err)?;
    Ok((ours, theirs))
}

/// Times `ours` and cuBLAS's `theirs`, `reps` calls each followed by a
/// synchronisation of its stream, interleaved ([`time_pair`]); seconds per
/// call, or the first error either returned.
fn against_cublas(
    be: &CudaBackend,
    blas: &Blas,
    (reps, budget): (usize, Duration),
    mut ours: impl FnMut() -> Result<(), String>,
    mut theirs: impl FnMut() -> Result<(), String>,
) -> Result<(f64, f64), String> {
    let (mut e1, mut e2) = (None, None);
    let (a, b) = time_pair(
        || {
            for _ in 0..reps {
                if let Err(e) = ours() {
                    e1 = Some(e);
                }
            }
            if let Err(e) = be.synchronize() {
                e1 = Some(e.to_string());
            }
        },
        || {
            for _ in 0..reps {
                if let Err(e) = theirs() {
                    e2 = Some(e);
                }
            }
            if let Err(e) = blas.stream.synchronize() {
                e2 = Some(e.to_string());
            }
        },
        budget,
        3,
    );
    match e1.or(e2) {
        Some(e) => Err(e),
        None => Ok((a / reps as f64, b / reps as f64)),
    }
}

/// The largest `|x − y|` relative to the largest `|y|`; NaN anywhere (a
/// missed store would leave poison) makes it NaN.
pub(crate) fn relative_difference(x: &[f32], y: &[f32]) -> f32 {
    let scale = y.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    x.iter().zip(y).fold(0.0f32, |m, (p, q)| {
        let d = (p - q).abs();
        if d.is_nan() || m.is_nan() { f32::NAN } else { m.max(d) }
    }) / scale
}

/// The kernel a tier runs for `dtype` in and out.
fn kernel_name(tier: GemmTier, dtype: DType, s: Shape) -> String {
    match tier {
        GemmTier::Mma(cfg) => cfg.kernel_name(dtype, dtype, false, s.trans_b),
        GemmTier::Wgmma(cfg) => cfg.kernel_name(dtype, dtype, false, s.trans_b),
        GemmTier::Tma(cfg) => cfg.kernel_name(dtype, dtype, false, s.trans_b),
        other => format!("{other:?}"),
    }
}

/// The rows; `quick` keeps 2048³ only. With the sweep each row is timed for
/// at most 0.7 s.
pub fn rows(be: &CudaBackend, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    let blas = Blas::new()?;
    let (sweep, wgmma_only, budget) = sweep_setting(budget);
    let cc = be.info().map_err(err)?.compute_capability;
    let wgmma = compute_ptx::Target::has_wgmma(cc.0, cc.1);
    let shape = |m: usize, n: usize, k: usize, trans_b: bool| Shape { m, n, k, trans_b };
    let mut plan: Vec<(DType, Shape)> = Vec::new();
    let sizes: &[usize] = if quick { &[2048] } else { &[2048, 4096, 8192] };
    for &n in sizes {
        plan.push((DType::BF16, shape(n, n, n, false)));
        plan.push((DType::BF16, shape(n, n, n, true)));
    }
    for &n in sizes.iter().filter(|&&n| quick || n > 2048) {
        plan.push((DType::F16, shape(n, n, n, true)));
    }
    if !quick {
        // The LLM shapes, and a ragged neighbour of 4096³ (edges masked in the same loop).
        for (m, n, k) in [(4096, 4096, 14336), (4096, 14336, 4096), (512, 4096, 4096), (4095, 4094, 4088)] {
            plan.push((DType::BF16, shape(m, n, k, true)));
        }
    }
    if !quick && sweep {
        // What makes the ragged shape slow: its `k` (rows of `A` and `B` not
        // 128-byte aligned), or its `m` and `n` (partial tiles).
        for (m, n, k) in [(4096, 4096, 4088), (4095, 4094, 4096)] {
            plan.push((DType::BF16, shape(m, n, k, true)));
        }
    }
    let mut out = Vec::new();
    if wgmma && sweep {
        // The TF32 sweep first: it is the shorter one.
        out.extend(tf32_rows(be, &blas, device, (quick, sweep), budget)?);
    }
    out.extend(half_rows(be, &blas, device, &plan, (sweep, wgmma_only), budget)?);
    if !quick && !sweep {
        out.extend(strided_rows(be, &blas, device, budget)?);
    }
    if !sweep {
        out.extend(crate::cuda_gemv::rows(be, &blas, device, quick, budget)?);
    }
    if wgmma && !sweep {
        out.extend(tf32_rows(be, &blas, device, (quick, sweep), budget)?);
    }
    Ok(out)
}

/// The half-precision rows of `plan`, each beside cuBLAS: the tier the plans
/// pick and, on compute capability 9.0, the `cp.async` kernel; with `sweep`
/// (4096³ and larger, bf16) every shape of the sweeps (`wgmma_only`: only
/// the `wgmma` ones where the device has them).
fn half_rows(
    be: &CudaBackend,
    blas: &Blas,
    device: &str,
    plan: &[(DType, Shape)],
    (sweep, wgmma_only): (bool, bool),
    budget: Duration,
) -> Result<Vec<Record>, String> {
    let info = be.info().map_err(err)?;
    let (cc, sms) = (info.compute_capability, info.multiprocessors);
    let wgmma = compute_ptx::Target::has_wgmma(cc.0, cc.1);
    let mut out = Vec::new();
    for &(dtype, s) in plan {
        let (a, ca) = operand(be, blas, s.m * s.k, dtype, 81 + s.k as u64)?;
        let (b, cb) = operand(be, blas, s.k * s.n, dtype, 83 + s.n as u64)?;
        let c = be.alloc_typed(s.m * s.n, dtype).map_err(err)?;
        let mut cc = blas.stream.alloc_zeros::<u16>(s.m * s.n).map_err(err)?;
        let spec = MatmulSpec { trans_b: s.trans_b, ..MatmulSpec::new(s.m, s.k, s.n) }.with_dtypes(dtype, dtype);
        let flops = 2.0 * (s.m * s.n * s.k) as f64;
        let reps = ((1u64 << 36) as f64 / flops).clamp(1.0, 16.0) as usize;
        // The tier the backend picks first; with the sweep, the other shapes
        // of both kernels at 4096³ and 8192³ (bf16).
        // On compute capability 9.0 the plans pick the TMA kernel; the
        // `cp.async` one runs beside it in every row.
        let picked = match GemmTier::choose(&spec, wgmma) {
            GemmTier::Wgmma(_) => GemmTier::Tma(TmaConfig::for_shape(1, s.m, s.n, sms)),
            other => other,
        };
        let mut tiers = vec![picked];
        if wgmma {
            tiers.push(GemmTier::Wgmma(WgmmaConfig::for_shape(1, s.m, s.n, sms)));
        }
        if sweep && dtype == DType::BF16 && s.m == s.n && s.m >= 4096 {
            if !(wgmma && wgmma_only) {
                let mma = std::iter::once(MmaConfig::default()).chain(gemm_mma::sweep_configs());
                tiers.extend(mma.map(GemmTier::Mma));
            }
            if wgmma {
                let w = std::iter::once(WgmmaConfig::default()).chain(gemm_wgmma::sweep_configs());
                tiers.extend(w.map(GemmTier::Wgmma));
                tiers.extend(gemm_tma::sweep_configs().into_iter().map(GemmTier::Tma));
            }
            let mut seen = Vec::new();
            tiers.retain(|t| {
                let new = !seen.contains(t);
                seen.push(*t);
                new
            });
        }
        for tier in tiers {
            let shape = format!("{}x{}x{}{}", s.m, s.n, s.k, if s.trans_b { " B^T" } else { "" });
            let (ours, theirs) = against_cublas(
                be,
                blas,
                (reps, budget),
                || be.matmul_tier(tier, spec, &a, &b, &c).map_err(err),
                || blas.gemm(dtype, s, &ca, &cb, &mut cc),
            )
            .map_err(|e| format!("{dtype} GEMM {shape}: {e}"))?;
            let mut mine = HostVec::zeros(dtype, s.m * s.n);
            be.download_typed(&c, mine.as_mut()).map_err(err)?;
            let other: Vec<u16> = blas.stream.clone_dtoh(&cc).map_err(err)?;
            let diff = relative_difference(&mine.to_f32(), &widen(dtype, &other));
            let name = kernel_name(tier, dtype, s);
            let mut r = record(&format!("gemm {dtype}"), shape, device, "resident", ours).with_peer("cublas", theirs);
            r.gflops = Some(flops / ours / 1e9);
            r.note = Some(format!(
                "{name}; cuBLAS {:.1} TFLOP/s; max |ours-cublas|/max|C| = {diff:.1e}; goal >= 0.9x cuBLAS",
                flops / theirs / 1e12
            ));
            if sweep {
                eprintln!(
                    "sweep {dtype} {:>5}x{:>5}x{:>5} {name:<58} {:>7.1} TFLOP/s  cuBLAS {:>7.1}  ratio {:.3}",
                    s.m,
                    s.n,
                    s.k,
                    flops / ours / 1e12,
                    flops / theirs / 1e12,
                    theirs / ours
                );
            }
            out.push(r);
        }
    }
    Ok(out)
}

/// The ragged rows alone (bf16; `k` not a multiple of 64 with `B` stored
/// either way, ragged `m` and `n`, all three) beside their aligned
/// neighbour, 4096³ `A·Bᵀ`.
#[allow(dead_code)]
pub fn ragged_only(be: &CudaBackend, device: &str, budget: Duration) -> Result<Vec<Record>, String> {
    let shape = |m: usize, n: usize, k: usize, trans_b: bool| Shape { m, n, k, trans_b };
    let plan = [
        (4096, 4096, 4096, true),
        (4096, 4096, 4088, true),
        (4096, 4096, 4088, false),
        (4095, 4094, 4096, true),
        (4095, 4094, 4088, true),
    ]
    .map(|(m, n, k, t)| (DType::BF16, shape(m, n, k, t)));
    half_rows(be, &Blas::new()?, device, &plan, (false, false), budget)
}

/// The TF32 rows alone ([`tf32_rows`]), with the sweep's shapes when
/// `COMPUTE_PTX_GEMM_SWEEP` is set; none on a device without `wgmma`.
#[allow(dead_code)]
pub fn tf32_only(be: &CudaBackend, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    let info = be.info().map_err(err)?;
    if !compute_ptx::Target::has_wgmma(info.compute_capability.0, info.compute_capability.1) {
        return Ok(Vec::new());
    }
    let (sweep, _, budget) = sweep_setting(budget);
    tf32_rows(be, &Blas::new()?, device, (quick, sweep), budget)
}

/// `COMPUTE_PTX_GEMM_SWEEP`: whether to sweep (set, not `0`), whether only
/// the `wgmma` shapes (`wgmma`: on a device that has them), and the time per
/// row (at most 0.7 s when sweeping).
fn sweep_setting(budget: Duration) -> (bool, bool, Duration) {
    let var = std::env::var("COMPUTE_PTX_GEMM_SWEEP").unwrap_or_default();
    let sweep = !var.is_empty() && var != "0";
    let budget = if sweep { budget.min(Duration::from_millis(700)) } else { budget };
    (sweep, var == "wgmma", budget)
}

/// Strided batches, bf16 `A·Bᵀ`, 8 products of 2048³ against
/// `cublasGemmStridedBatchedEx` with the same strides: `B` shared by the
/// batch (stride 0: the plans run one product of 8·2048 rows), `A`'s
/// matrices spaced by 64 values more than their size (the plans gather them
/// into a contiguous temporary, then run the batch), and the contiguous batch
/// for reference.
fn strided_rows(be: &CudaBackend, blas: &Blas, device: &str, budget: Duration) -> Result<Vec<Record>, String> {
    let (batch, dtype) = (8usize, DType::BF16);
    let s = Shape { m: 2048, n: 2048, k: 2048, trans_b: true };
    let (mk, kn) = (s.m * s.k, s.k * s.n);
    let flops = 2.0 * (batch * s.m * s.n * s.k) as f64;
    let mut out = Vec::new();
    for (what, sa, sb) in [("contiguous", mk, kn), ("B shared", mk, 0), ("A spaced", mk + 64, kn)] {
        let len = |stride: usize, size: usize| (batch - 1) * stride + size;
        let (a, ca) = operand(be, blas, len(sa, mk), dtype, 91)?;
        let (b, cb) = operand(be, blas, len(sb, kn), dtype, 93)?;
        let c = be.alloc_typed(batch * s.m * s.n, dtype).map_err(err)?;
        let mut cc = blas.stream.alloc_zeros::<u16>(batch * s.m * s.n).map_err(err)?;
        let spec = MatmulSpec { batch, trans_b: true, ..MatmulSpec::new(s.m, s.k, s.n) }
            .with_dtypes(dtype, dtype)
            .with_batch_strides(sa, sb);
        let op = compute_core::Op::Matmul(spec);
        let (ours, theirs) = against_cublas(
            be,
            blas,
            (2, budget),
            || be.run_tensors(&op, &[&a, &b], &c).map_err(err),
            || blas.gemm_strided(dtype, s, (batch, sa, sb), &ca, &cb, &mut cc),
        )
        .map_err(|e| format!("strided {what}: {e}"))?;
        let mut mine = HostVec::zeros(dtype, batch * s.m * s.n);
        be.download_typed(&c, mine.as_mut()).map_err(err)?;
        let other: Vec<u16> = blas.stream.clone_dtoh(&cc).map_err(err)?;
        let diff = relative_difference(&mine.to_f32(), &widen(dtype, &other));
        let shape = format!("8x2048^3 B^T {what}");
        let mut r = record("gemm bf16 strided batch", shape, device, "resident", ours).with_peer("cublas", theirs);
        r.gflops = Some(flops / ours / 1e9);
        r.note = Some(format!(
            "strides a={sa} b={sb}; cuBLAS strided batched {:.1} TFLOP/s; max |ours-cublas|/max|C| = {diff:.1e}",
            flops / theirs / 1e12
        ));
        out.push(r);
    }
    Ok(out)
}

/// The TF32 rows (4096³ and 8192³, or with `quick` 2048³): the `cp.async`
/// kernel's shape, the TMA kernel's (`A` rounded in registers and `B` by a
/// pass before it, which the plans pick for aligned operands; both by the
/// pass; both in the kernel), and with `sweep` every shape of
/// `gemm_wgmma::tf32_sweep_configs` and the TMA kernel unrounded.
fn tf32_rows(
    be: &CudaBackend,
    blas: &Blas,
    device: &str,
    (quick, sweep): (bool, bool),
    budget: Duration,
) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    let sizes: &[usize] = if quick { &[2048] } else { &[4096, 8192] };
    for &n in sizes {
        let s = Shape { m: n, n, k: n, trans_b: true };
        let picked = GemmTier::Wgmma(WgmmaConfig::tf32());
        let (row, first) = tf32_row(be, blas, device, s, (picked, None), budget)?;
        let mut rows = vec![row];
        rows.push(tf32_row(be, blas, device, s, (GemmTier::Tma(TmaConfig::tf32()), Some(&first)), budget)?.0);
        let both_before = GemmTier::Tma(TmaConfig { tf32: Tf32Rounding::BeforeKernel, ..TmaConfig::tf32() });
        rows.push(tf32_row(be, blas, device, s, (both_before, Some(&first)), budget)?.0);
        let in_kernel = GemmTier::Tma(TmaConfig { tf32: Tf32Rounding::InShared, ..TmaConfig::tf32() });
        rows.push(tf32_row(be, blas, device, s, (in_kernel, Some(&first)), budget)?.0);
        if sweep {
            let cp_async = gemm_wgmma::tf32_sweep_configs().into_iter().map(GemmTier::Wgmma);
            let unrounded = GemmTier::Tma(TmaConfig { tf32: Tf32Rounding::None, ..TmaConfig::tf32() });
            for tier in cp_async.chain([unrounded]).filter(|t| *t != picked) {
                rows.push(tf32_row(be, blas, device, s, (tier, Some(&first)), budget)?.0);
            }
            for r in &rows {
                let (tf, ratio) = (r.gflops.unwrap_or(0.0) / 1e3, r.ratio.unwrap_or(0.0));
                eprintln!("sweep tf32 {n}^3 {tf:>7.1} TFLOP/s ratio {ratio:.3}  {}", r.note.as_deref().unwrap_or(""));
            }
        }
        out.extend(rows);
    }
    Ok(out)
}

/// `f32` with TF32 opted in (`A·Bᵀ`, the layout TF32 tensor cores read) on
/// the `wgmma` or TMA kernel `tier`, against cuBLAS's TF32 GEMM on the same inputs
/// (and, given `first`, against another shape's output: the count of
/// elements that differ); returns the row and our output.
fn tf32_row(
    be: &CudaBackend,
    blas: &Blas,
    device: &str,
    s: Shape,
    (tier, first): (GemmTier, Option<&[f32]>),
    budget: Duration,
) -> Result<(Record, Vec<f32>), String> {
    let (ha, hb) = (random(s.m * s.k, 91), random(s.k * s.n, 93));
    let (a, b) = (be.upload(&ha).map_err(err)?, be.upload(&hb).map_err(err)?);
    let c = be.alloc(s.m * s.n).map_err(err)?;
    let (ca, cb) = (blas.stream.clone_htod(&ha).map_err(err)?, blas.stream.clone_htod(&hb).map_err(err)?);
    let mut cc = blas.stream.alloc_zeros::<f32>(s.m * s.n).map_err(err)?;
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(s.m, s.k, s.n) }.with_precision(Precision::Tf32);
    let flops = 2.0 * (s.m * s.n * s.k) as f64;
    let reps = ((1u64 << 36) as f64 / flops).clamp(1.0, 16.0) as usize;
    let shape = format!("{}x{}x{} B^T", s.m, s.n, s.k);
    let (ours, theirs) = against_cublas(
        be,
        blas,
        (reps, budget),
        || be.matmul_tier(tier, spec, &a, &b, &c).map_err(err),
        || blas.gemm_tf32(s, &ca, &cb, &mut cc),
    )
    .map_err(|e| format!("tf32 GEMM {shape}: {e}"))?;
    let mut mine = vec![0.0f32; s.m * s.n];
    be.download(&c, &mut mine).map_err(err)?;
    let other: Vec<f32> = blas.stream.clone_dtoh(&cc).map_err(err)?;
    let diff = relative_difference(&mine, &other);
    let name = match tier {
        GemmTier::Tma(cfg) if cfg.tf32 == Tf32Rounding::BeforeKernel => {
            format!("round_tf32 x2 + {}", cfg.kernel_name(DType::F32, DType::F32, false, true))
        }
        GemmTier::Tma(cfg) if cfg.tf32 == Tf32Rounding::ARegistersBBefore => {
            format!("round_tf32 (B) + {}", cfg.kernel_name(DType::F32, DType::F32, false, true))
        }
        GemmTier::Wgmma(cfg) if cfg.tf32 == Tf32Rounding::ARegistersBBefore => {
            format!("round_tf32 (B) + {}", cfg.kernel_name(DType::F32, DType::F32, false, true))
        }
        GemmTier::Tma(cfg) => cfg.kernel_name(DType::F32, DType::F32, false, true),
        GemmTier::Wgmma(cfg) => cfg.kernel_name(DType::F32, DType::F32, false, true),
        other => format!("{other:?}"),
    };
    let mut r = record("gemm tf32", shape, device, "resident", ours).with_peer("cublas", theirs);
    r.gflops = Some(flops / ours / 1e9);
    let versus = first.map(|f| {
        let differ = mine.iter().zip(f).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        format!("; {differ} elements differ from the first shape's, max {:.1e}", relative_difference(&mine, f))
    });
    r.note = Some(format!(
        "{name}; cuBLAS TF32 {:.1} TFLOP/s; max |ours-cublas|/max|C| = {diff:.1e}{}; goal >= 0.9x cuBLAS TF32",
        flops / theirs / 1e12,
        versus.unwrap_or_default()
    ));
    Ok((r, mine))
}

/// `f16`/`bf16` bit patterns as `f32` values.
fn widen(dtype: DType, bits: &[u16]) -> Vec<f32> {
    match dtype {
        DType::BF16 => bits.iter().map(|&b| compute_core::bf16::from_bits(b).to_f32()).collect(),
        _ => bits.iter().map(|&b| compute_core::f16::from_bits(b).to_f32()).collect(),
    }
}

//! Bench rows for the GEMV kernels (products of few rows: what LLM decoding
//! runs) and for argmax over a vocabulary, timed on the device.
//!
//! GEMV rows, each beside cuBLAS's `cublasGemmEx` (compute type
//! `CUBLAS_COMPUTE_32F`) on the same values, with the GB/s of `W` each reads
//! and the largest difference from cuBLAS relative to the largest |C|:
//! - `x·Wᵀ` (`W` stored `n × k`, the `nn.Linear` layout) at the shapes of the
//!   1.1 B decoder (`docs/decoder.md`: hidden 2048, 8 key/value heads of 64,
//!   feed-forward 8192, vocabulary 32000) in bf16 with one row: the q and o
//!   projections (2048 × 2048), k and v (512 × 2048), gate and up (8192 ×
//!   2048), down (2048 × 8192) and the LM head (32000 × 2048); the q and down
//!   shapes again with 2, 4 and 8 rows, and the q shape in f16 and `f32`;
//! - without `--quick`, one row times `W` of `k` = 4096 and `n` = 4096 or
//!   14336, stored either way, in bf16 and `f32`.
//!
//! Then argmax over one row of 32000 values (bf16 and `f32`, what a decoder
//! runs on its logits), ours alone (no peer in the process).
//! `COMPUTE_PTX_GEMV_SWEEP=1` first prints, for tuning, every k-split of the
//! `B` stored `n × k` kernel at the decoder's shapes ([`sweep`]).
//! [`rows_many`] (`cuda_bench --gemv16`) times products of 8 to 16 rows,
//! several sequences decoded together, against the tensor-core GEMM.
//!
//! Timing: `calls` calls back to back between two device timestamps (CUDA
//! events), queued behind a 3072³ `f32` GEMM so that the host's launches run
//! ahead of the device; a sample is the elapsed time over `calls`, so it
//! includes the gap between consecutive kernels, as a decoder's step sees it.
//! Each row is the median of at least 5 samples, ours and cuBLAS's
//! interleaved. Successive calls read different copies of `W`, at least 256
//! MB of them together, so that `W` comes from memory and not from the L2
//! cache, as in a decoder, whose weights are read once per token.

use std::time::{Duration, Instant};

use compute_core::{Backend, DType, HostVec, MatmulSpec, Op, Tensor};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::GemmTier;
use compute_ptx::kernels::gemm_mma::MmaConfig;
use compute_ptx::kernels::gemm_wgmma::WgmmaConfig;
use compute_ptx::kernels::gemv;
use cudarc::cublas::sys::{cublasComputeType_t, cudaDataType_t};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::cuda::{err, random, record};
use crate::cuda_mma::{Blas, Shape, relative_difference};
use crate::report::{Record, median};

/// Bytes of the copies of `W` a row cycles through (at least).
const ROTATION_BYTES: usize = 256 << 20;
/// Calls per timed sample (at least).
const MIN_CALLS: usize = 32;
/// Size of the `f32` GEMM queued before each sample.
const HEAD: usize = 3072;

/// A GEMV row: `m × n × k` in `dtype`, `W` stored `n × k` when `trans_b`.
#[derive(Clone, Copy)]
struct Case {
    label: &'static str,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    trans_b: bool,
}

/// The long `f32` GEMM queued before each sample, on our stream and on cuBLAS's.
struct Head {
    ours: (Tensor, Tensor, Tensor),
    theirs: (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>),
}

impl Head {
    fn new(be: &CudaBackend, blas: &Blas) -> Result<Head, String> {
        let h = random(HEAD * HEAD, 7);
        let ours = (be.upload(&h).map_err(err)?, be.upload(&h).map_err(err)?, be.alloc(HEAD * HEAD).map_err(err)?);
        let theirs = (
            blas.stream.clone_htod(&h).map_err(err)?,
            blas.stream.clone_htod(&h).map_err(err)?,
            blas.stream.alloc_zeros::<f32>(HEAD * HEAD).map_err(err)?,
        );
        Ok(Head { ours, theirs })
    }

    fn ours(&self, be: &CudaBackend) -> Result<(), String> {
        let (a, b, c) = &self.ours;
        be.run_tensors(&Op::Matmul(MatmulSpec::new(HEAD, HEAD, HEAD)), &[a, b], c).map_err(err)
    }

    fn theirs(&mut self, blas: &Blas) -> Result<(), String> {
        let (a, b, c) = &mut self.theirs;
        let (pa, _ra) = a.device_ptr(&blas.stream);
        let (pb, _rb) = b.device_ptr(&blas.stream);
        let (pc, _rc) = c.device_ptr_mut(&blas.stream);
        let s = Shape { m: HEAD, n: HEAD, k: HEAD, trans_b: false };
        let kind = (cudaDataType_t::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F);
        // SAFETY: a, b and c hold HEAD² f32 values on this stream.
        unsafe { blas.gemm_raw(kind, s, (pa, pb, pc)) }
    }
}

type Call<'a> = &'a mut dyn FnMut(usize) -> Result<(), String>;

/// Device seconds per call of `ours` (call `i` of each sample gets `i`) and
/// of `theirs` on cuBLAS's stream: see the module docs.
fn on_device(
    be: &CudaBackend,
    blas: &Blas,
    head: &mut Head,
    (calls, budget): (usize, Duration),
    ours: Call<'_>,
    mut theirs: Option<Call<'_>>,
) -> Result<(f64, Option<f64>), String> {
    // Warm-up: loads the kernels and cuBLAS's choice of algorithm.
    ours(0)?;
    if let Some(t) = theirs.as_mut() {
        t(0)?;
    }
    be.synchronize().map_err(err)?;
    blas.stream.synchronize().map_err(err)?;
    let start = Instant::now();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    while a.len() < 5 || (start.elapsed() < budget && a.len() < 100) {
        head.ours(be)?;
        let t0 = be.record_timestamp().map_err(err)?;
        for i in 0..calls {
            ours(i)?;
        }
        let t1 = be.record_timestamp().map_err(err)?;
        a.push(t1.seconds_since(&t0).map_err(err)? / calls as f64);
        if let Some(t) = theirs.as_mut() {
            head.theirs(blas)?;
            let e0 = blas.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err)?;
            for i in 0..calls {
                t(i)?;
            }
            let e1 = blas.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err)?;
            b.push(f64::from(e0.elapsed_ms(&e1).map_err(err)?) / 1e3 / calls as f64);
        }
    }
    Ok((median(&mut a), if b.is_empty() { None } else { Some(median(&mut b)) }))
}

/// One GEMV row: `tier` forced ([`GemmTier::Gemv`], a forced shape of it, or
/// another tier), or with `None` whatever the plans choose.
fn gemv_row(
    be: &CudaBackend,
    blas: &Blas,
    head: &mut Head,
    (device, budget): (&str, Duration),
    case: Case,
    tier: Option<GemmTier>,
) -> Result<Record, String> {
    let Case { label, m, n, k, dtype, trans_b } = case;
    let s = Shape { m, n, k, trans_b };
    let spec = MatmulSpec { trans_b, ..MatmulSpec::new(m, k, n) }.with_dtypes(dtype, dtype);
    let size = dtype.size_in_bytes();
    let w_bytes = k * n * size;
    let copies = ROTATION_BYTES.div_ceil(w_bytes).clamp(1, 128);
    let calls = copies * MIN_CALLS.div_ceil(copies);
    let ha = HostVec::from_f32(dtype, &random(m * k, 97));
    let hb = HostVec::from_f32(dtype, &random(k * n, 99 + n as u64));
    let a = be.upload_typed(ha.as_slice()).map_err(err)?;
    let ws = (0..copies).map(|_| be.upload_typed(hb.as_slice()).map_err(err)).collect::<Result<Vec<_>, _>>()?;
    let c = be.alloc_typed(m * n, dtype).map_err(err)?;
    let ca = blas.stream.clone_htod(ha.as_slice().as_bytes()).map_err(err)?;
    let cws = (0..copies)
        .map(|_| blas.stream.clone_htod(hb.as_slice().as_bytes()).map_err(err))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cc = blas.stream.alloc_zeros::<u8>(m * n * size).map_err(err)?;
    let ty = match dtype {
        DType::BF16 => cudaDataType_t::CUDA_R_16BF,
        DType::F16 => cudaDataType_t::CUDA_R_16F,
        _ => cudaDataType_t::CUDA_R_32F,
    };
    let shape = format!("{m}x{n}x{k}{}", if trans_b { " B^T" } else { "" });
    let (ours, theirs) = on_device(
        be,
        blas,
        head,
        (calls, budget),
        &mut |i| match tier {
            Some(tier) => be.matmul_tier(tier, spec, &a, &ws[i % copies], &c).map_err(err),
            None => be.run_tensors(&Op::Matmul(spec), &[&a, &ws[i % copies]], &c).map_err(err),
        },
        Some(&mut |i| {
            let (pa, _ra) = ca.device_ptr(&blas.stream);
            let (pb, _rb) = cws[i % copies].device_ptr(&blas.stream);
            let (pc, _rc) = cc.device_ptr_mut(&blas.stream);
            // SAFETY: ca, cws[i] and cc hold m·k, k·n and m·n values of `dtype` on this stream.
            unsafe { blas.gemm_raw((ty, cublasComputeType_t::CUBLAS_COMPUTE_32F), s, (pa, pb, pc)) }
        }),
    )
    .map_err(|e| format!("{dtype} GEMV {shape}: {e}"))?;
    let theirs = theirs.ok_or("no cuBLAS timing")?;
    let mut mine = HostVec::zeros(dtype, m * n);
    be.download_typed(&c, mine.as_mut()).map_err(err)?;
    let mut other = HostVec::zeros(dtype, m * n);
    let bytes: Vec<u8> = blas.stream.clone_dtoh(&cc).map_err(err)?;
    other.as_mut().as_bytes_mut().copy_from_slice(&bytes);
    let diff = relative_difference(&mine.to_f32(), &other.to_f32());
    let tier = match tier {
        Some(t) => t,
        None => plans_tier(be, case)?,
    };
    let name = kernel_label(be, tier, case)?;
    let op = if matches!(tier, GemmTier::Gemv | GemmTier::GemvSplit(_) | GemmTier::GemvMma(..)) {
        format!("gemv {dtype}")
    } else {
        format!("gemm tc {dtype}")
    };
    let mut r = record(&op, shape, device, "resident", ours).with_peer("cublas", theirs);
    r.gbps = Some(w_bytes as f64 / ours / 1e9);
    r.note = Some(format!(
        "{label}{name}; W read at {:.0} GB/s, cuBLAS {:.0} GB/s; max |ours-cublas|/max|C| = {diff:.1e}; \
         device-timed, {calls} calls back to back over {copies} copies of W",
        w_bytes as f64 / ours / 1e9,
        w_bytes as f64 / theirs / 1e9
    ));
    Ok(r)
}

/// The tier the plans run `case` on (GEMV or the tensor-core GEMM,
/// [`compute_ptx::plan::gemv_chosen`]).
fn plans_tier(be: &CudaBackend, case: Case) -> Result<GemmTier, String> {
    let Case { m, n, k, dtype, trans_b, .. } = case;
    let spec = MatmulSpec { trans_b, ..MatmulSpec::new(m, k, n) }.with_dtypes(dtype, dtype);
    let (major, minor) = be.info().map_err(err)?.compute_capability;
    if compute_ptx::plan::gemv_chosen(&spec, compute_ptx::Target::has_wgmma(major, minor)) {
        Ok(GemmTier::Gemv)
    } else {
        tensor_core_tier(be, m, n)
    }
}

/// The kernel (and k-split) that `tier` runs `case` on, for the notes: the
/// plans' choice of GEMV kernel under [`GemmTier::Gemv`] (aligned
/// operands), the forced shape otherwise.
fn kernel_label(be: &CudaBackend, tier: GemmTier, case: Case) -> Result<String, String> {
    let Case { m, n, k, dtype, trans_b, .. } = case;
    let sms = be.info().map_err(err)?.multiprocessors;
    let mma = m > gemv::NN_MAX_ROWS && dtype != DType::F32 && k % 8 == 0;
    Ok(match tier {
        GemmTier::Gemv if !trans_b => gemv::nn_name(gemv::rows_for(m), dtype),
        GemmTier::Gemv if mma => {
            let t = gemv::MMA_DEFAULT_TILES;
            format!("{} split {}", gemv::mma_name(t, dtype, dtype), gemv::mma_split(k, t))
        }
        GemmTier::Gemv => {
            format!("{} split {}", gemv::nt_name(gemv::rows_for(m), dtype, dtype), gemv::nt_split(m, n, k, dtype, sms))
        }
        GemmTier::GemvSplit(s) => format!("{} split {s}", gemv::nt_name(gemv::rows_for(m), dtype, dtype)),
        GemmTier::GemvMma(t, s) => format!("{} split {s}", gemv::mma_name(t, dtype, dtype)),
        GemmTier::Wgmma(cfg) => cfg.kernel_name(dtype, dtype, false, trans_b),
        other => format!("{other:?}"),
    })
}

/// The tensor-core GEMM for a product of `m` rows and `n` columns, as the
/// plans run products of 9 to 16 rows that the GEMV kernels do not take
/// (wider than `GEMV_WIDE_COLUMNS`, or `B` stored `k × n`): the `wgmma`
/// kernel in the shape chosen for the output, or `mma.sync` on a device
/// without `wgmma`.
fn tensor_core_tier(be: &CudaBackend, m: usize, n: usize) -> Result<GemmTier, String> {
    let info = be.info().map_err(err)?;
    let (major, minor) = info.compute_capability;
    Ok(if compute_ptx::Target::has_wgmma(major, minor) {
        GemmTier::Wgmma(WgmmaConfig::for_shape(1, m, n, info.multiprocessors))
    } else {
        GemmTier::Mma(MmaConfig::default())
    })
}

/// The 1.1 B decoder's products as it runs them with the projections fused
/// (`label`, `n`, `k`): o, q/k/v as one (2048 + 2·512 columns), gate/up as
/// one (2·8192), down, the LM head. (Used by [`rows_many`] only.)
#[allow(dead_code)]
const FUSED: [(&str, usize, usize); 5] = [
    ("o proj: ", 2048, 2048),
    ("qkv proj: ", 3072, 2048),
    ("gate/up proj: ", 16384, 2048),
    ("down proj: ", 2048, 8192),
    ("lm head: ", 32000, 2048),
];

/// `--gemv16`: products of 8, 12 and 16 rows (several sequences of a
/// decoder) at the [`FUSED`] shapes in bf16, `W` stored `n × k`. Per shape,
/// to stderr, ours alone timed as the rows are: the tensor-core GEMM
/// ([`tensor_core_tier`]), the plans' choice, the GEMV kernels forced (the
/// CUDA-core kernel with 1 or 2 warps per column group, the tensor-core GEMV
/// with 1 tile and 4 or 8 warps and with 2 tiles and 8). Then the rows of
/// the plans' choice and of the tensor-core GEMM, each beside cuBLAS. (Run by
/// the `cuda_bench` example only, so unused in `compute-bench`, which shares
/// this file for [`rows`].)
#[allow(dead_code)]
pub fn rows_many(be: &CudaBackend, blas: &Blas, device: &str, budget: Duration) -> Result<Vec<Record>, String> {
    let mut head = Head::new(be, blas)?;
    let dtype = DType::BF16;
    for m in [8, 12, 16] {
        for (label, n, k) in FUSED {
            let case = Case { label, m, n, k, dtype, trans_b: true };
            let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) }.with_dtypes(dtype, dtype);
            let w_bytes = k * n * dtype.size_in_bytes();
            let copies = ROTATION_BYTES.div_ceil(w_bytes).clamp(1, 128);
            let calls = copies * MIN_CALLS.div_ceil(copies);
            let a = be.upload_typed(HostVec::from_f32(dtype, &random(m * k, 97)).as_slice()).map_err(err)?;
            let hb = HostVec::from_f32(dtype, &random(k * n, 99 + n as u64));
            let ws = (0..copies).map(|_| be.upload_typed(hb.as_slice()).map_err(err)).collect::<Result<Vec<_>, _>>()?;
            let c = be.alloc_typed(m * n, dtype).map_err(err)?;
            let tiers = [
                Some(tensor_core_tier(be, m, n)?),
                None,
                Some(GemmTier::GemvSplit(1)),
                Some(GemmTier::GemvSplit(2)),
                Some(GemmTier::GemvMma(1, 4)),
                Some(GemmTier::GemvMma(1, 8)),
                Some(GemmTier::GemvMma(2, 8)),
            ];
            let mut line = format!("many bf16 {m}x{n}x{k} B^T ({label}W {} MB):", w_bytes >> 20);
            for tier in tiers {
                let call = &mut |i: usize| match tier {
                    Some(tier) => be.matmul_tier(tier, spec, &a, &ws[i % copies], &c).map_err(err),
                    None => be.run_tensors(&Op::Matmul(spec), &[&a, &ws[i % copies]], &c).map_err(err),
                };
                let t = on_device(be, blas, &mut head, (calls, budget / 4), call, None)?.0;
                let what = match tier {
                    None => format!("plans ({})", kernel_label(be, plans_tier(be, case)?, case)?),
                    Some(tier) => kernel_label(be, tier, case)?,
                };
                line.push_str(&format!("\n  {what}: {:.2} us {:.0} GB/s", t * 1e6, w_bytes as f64 / t / 1e9));
            }
            eprintln!("{line}");
        }
    }
    let mut out = Vec::new();
    for m in [8, 12, 16] {
        for (label, n, k) in FUSED {
            let case = Case { label, m, n, k, dtype, trans_b: true };
            out.push(gemv_row(be, blas, &mut head, (device, budget), case, None)?);
            let tc = tensor_core_tier(be, m, n)?;
            if plans_tier(be, case)? != tc {
                out.push(gemv_row(be, blas, &mut head, (device, budget), case, Some(tc))?);
            }
        }
    }
    Ok(out)
}

/// Device seconds per call of the `B` stored `n × k` kernel with the k-split
/// forced to `split` (ours alone, timed as the rows are).
fn sweep_point(
    be: &CudaBackend,
    blas: &Blas,
    head: &mut Head,
    budget: Duration,
    case: Case,
    split: u32,
) -> Result<f64, String> {
    let Case { m, n, k, dtype, .. } = case;
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) }.with_dtypes(dtype, dtype);
    let w_bytes = k * n * dtype.size_in_bytes();
    let copies = ROTATION_BYTES.div_ceil(w_bytes).clamp(1, 128);
    let calls = copies * MIN_CALLS.div_ceil(copies);
    let a = be.upload_typed(HostVec::from_f32(dtype, &random(m * k, 97)).as_slice()).map_err(err)?;
    let hb = HostVec::from_f32(dtype, &random(k * n, 99 + n as u64));
    let ws = (0..copies).map(|_| be.upload_typed(hb.as_slice()).map_err(err)).collect::<Result<Vec<_>, _>>()?;
    let c = be.alloc_typed(m * n, dtype).map_err(err)?;
    let tier = GemmTier::GemvSplit(split);
    let call = &mut |i: usize| be.matmul_tier(tier, spec, &a, &ws[i % copies], &c).map_err(err);
    Ok(on_device(be, blas, head, (calls, budget), call, None)?.0)
}

/// `COMPUTE_PTX_GEMV_SWEEP=1`: every k-split of the `B` stored `n × k`
/// kernel at the decoder's shapes with 1 and 8 rows, and a 1 × 64 × 64
/// product (the floor: one launch with next to no work), printed to stderr.
fn sweep(be: &CudaBackend, blas: &Blas, head: &mut Head, budget: Duration) -> Result<(), String> {
    let sms = be.info().map_err(err)?.multiprocessors;
    let floor = Case { label: "floor", m: 1, n: 64, k: 64, dtype: DType::BF16, trans_b: true };
    let t = sweep_point(be, blas, head, budget, floor, 1)?;
    eprintln!("sweep gemv bf16 1x64x64 (launch floor): {:.2} us", t * 1e6);
    for m in [1, 8] {
        for (label, n, k) in DECODER {
            let case = Case { label, m, n, k, dtype: DType::BF16, trans_b: true };
            let picked = gemv::nt_split(m, n, k, DType::BF16, sms);
            let mut line = format!("sweep gemv bf16 {m}x{n}x{k} B^T ({label}plans pick {picked}):");
            for split in gemv::NT_SPLITS {
                let t = sweep_point(be, blas, head, budget, case, split)?;
                let gbps = (k * n * 2) as f64 / t / 1e9;
                line.push_str(&format!("  split {split} {:.2} us {gbps:.0} GB/s", t * 1e6));
            }
            eprintln!("{line}");
        }
    }
    Ok(())
}

/// argmax over one row of `cols` values of `dtype`, checked against the host.
fn argmax_row(
    be: &CudaBackend,
    blas: &Blas,
    head: &mut Head,
    (device, budget): (&str, Duration),
    dtype: DType,
    cols: usize,
) -> Result<Record, String> {
    let hx = HostVec::from_f32(dtype, &random(cols, 5 + cols as u64));
    let x = be.upload_typed(hx.as_slice()).map_err(err)?;
    let y = be.alloc(1).map_err(err)?;
    let op = Op::ArgMax { rows: 1, cols, dtype };
    let calls = 64;
    let (ours, _) =
        on_device(be, blas, head, (calls, budget), &mut |_| be.run_tensors(&op, &[&x], &y).map_err(err), None)?;
    let mut got = [0.0f32];
    be.download(&y, &mut got).map_err(err)?;
    let vals = hx.to_f32();
    let want = (0..cols).fold(0, |best, j| if vals[j] > vals[best] { j } else { best });
    if got[0] != want as f32 {
        return Err(format!("argmax {dtype} 1x{cols}: got index {}, the host says {want}", got[0]));
    }
    let mut r = record(&format!("argmax {dtype}"), format!("1x{cols}"), device, "resident", ours);
    r.gbps = Some((cols * dtype.size_in_bytes()) as f64 / ours / 1e9);
    r.note = Some(format!("device-timed, {calls} calls back to back; no peer in the process"));
    Ok(r)
}

/// The decoder's GEMV shapes (`label`, `n`, `k`).
const DECODER: [(&str, usize, usize); 5] = [
    ("q/o proj: ", 2048, 2048),
    ("k/v proj: ", 512, 2048),
    ("gate/up proj: ", 8192, 2048),
    ("down proj: ", 2048, 8192),
    ("lm head: ", 32000, 2048),
];

/// The rows (module docs); `quick` keeps the decoder's shapes and argmax.
pub fn rows(be: &CudaBackend, blas: &Blas, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    let mut head = Head::new(be, blas)?;
    if std::env::var("COMPUTE_PTX_GEMV_SWEEP").is_ok_and(|v| !v.is_empty() && v != "0") {
        sweep(be, blas, &mut head, budget / 4)?;
    }
    let mut cases = Vec::new();
    for (label, n, k) in DECODER {
        cases.push(Case { label, m: 1, n, k, dtype: DType::BF16, trans_b: true });
    }
    for m in [2, 4, 8] {
        for (label, n, k) in [DECODER[0], DECODER[3]] {
            cases.push(Case { label, m, n, k, dtype: DType::BF16, trans_b: true });
        }
    }
    for dtype in [DType::F16, DType::F32] {
        let (label, n, k) = DECODER[0];
        cases.push(Case { label, m: 1, n, k, dtype, trans_b: true });
    }
    if !quick {
        for n in [4096, 14336] {
            for dtype in [DType::BF16, DType::F32] {
                for trans_b in [true, false] {
                    cases.push(Case { label: "", m: 1, n, k: 4096, dtype, trans_b });
                }
            }
        }
    }
    let mut out = Vec::new();
    for case in cases {
        out.push(gemv_row(be, blas, &mut head, (device, budget), case, Some(GemmTier::Gemv))?);
    }
    for dtype in [DType::BF16, DType::F32] {
        out.push(argmax_row(be, blas, &mut head, (device, budget), dtype, 32000)?);
    }
    Ok(out)
}

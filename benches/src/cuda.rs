//! Bench rows for the CUDA backend (`compute-ptx`), each beside its peer in the
//! same process, interleaved: sgemm against cuBLAS sgemm (fp32, no tensor
//! cores), memory-bound ops against a device-to-device copy of the same bytes,
//! the warm host→GPU→host round trip of a 1k-element op, the `f16`/`bf16`
//! rows of [`crate::cuda_half`] and the tensor-core GEMM rows of
//! [`crate::cuda_mma`].
//!
//! Device work is timed on the host around `launch × reps + synchronize`
//! (`reps` launches per sample keep the synchronisation cost out of the
//! figure). Inputs are random, never zeros. Set `COMPUTE_PTX_GEMM_SWEEP=1` to
//! add rows for other register-blocked GEMM shapes (tuning) at 2048³, 4096³
//! and 8192³, also with `--quick`.

use std::sync::Arc;
use std::time::Duration;

use compute_core::{Backend, BinaryOp, MatmulSpec, Op, ReduceOp, RowOp, Tensor, UnaryOp};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::GemmTier;
use compute_ptx::kernels::gemm_simt::SimtConfig;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use crate::report::{Record, time, time_pair};

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Deterministic random values in [-1, 1) ([`compute_core::rng`]), never all zero.
pub(crate) fn random(n: usize, seed: u64) -> Vec<f32> {
    compute_core::rng::random_vec(n, -1.0, 1.0, seed)
}

/// Runs this part's rows; `quick` shrinks sizes and time budgets.
pub fn rows(quick: bool) -> Result<Vec<Record>, String> {
    let be = CudaBackend::new().map_err(err)?;
    let device = be.info().map_err(err)?.name;
    let budget = Duration::from_millis(if quick { 300 } else { 1500 });
    let mut out = Vec::new();
    out.extend(sgemm_rows(&be, &device, quick, budget)?);
    out.extend(stream_rows(&be, &device, quick, budget)?);
    out.extend(crate::cuda_half::rows(&be, &device, quick, budget)?);
    out.extend(crate::cuda_mma::rows(&be, &device, quick, budget)?);
    out.extend(crate::cuda_epilogue::rows(&be, &device, quick, budget)?);
    out.extend(crate::cuda_attention::rows(&be, &device, quick, budget)?);
    out.push(round_trip_row(&be, &device, budget)?);
    Ok(out)
}

pub(crate) fn record(op: &str, shape: String, device: &str, placement: &str, median_s: f64) -> Record {
    Record {
        op: op.into(),
        shape,
        backend: "cuda".into(),
        device: device.into(),
        threads: 1,
        placement: placement.into(),
        median_s,
        ..Default::default()
    }
}

/// cuBLAS on its own stream of the same device, with copies of our inputs.
struct Cublas {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
}

impl Cublas {
    fn new() -> Result<Cublas, String> {
        // SAFETY: only probes whether the cuBLAS library can be loaded.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("cuBLAS (libcublas) not found: add /usr/local/cuda/lib64 to LD_LIBRARY_PATH".into());
        }
        let ctx = CudaContext::new(0).map_err(err)?;
        let stream = ctx.new_stream().map_err(err)?;
        let blas = CudaBlas::new(stream.clone()).map_err(err)?;
        Ok(Cublas { stream, blas })
    }

    /// Row-major `C = A·B` (`n × n`): column-major `Cᵀ = Bᵀ·Aᵀ`.
    fn sgemm(&self, n: usize, a: &CudaSlice<f32>, b: &CudaSlice<f32>, c: &mut CudaSlice<f32>) -> Result<(), String> {
        let cfg = square_sgemm_config(n);
        // SAFETY: all three buffers hold n·n floats on this stream's device, as
        // the configuration states.
        unsafe { self.blas.gemm(cfg, b, a, c) }.map_err(err)
    }
}

fn sgemm_rows(be: &CudaBackend, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    let blas = Cublas::new()?;
    let sweep = std::env::var("COMPUTE_PTX_GEMM_SWEEP").is_ok_and(|v| !v.is_empty() && v != "0");
    let sizes: &[usize] = if quick && !sweep { &[2048] } else { &[2048, 4096, 8192] };
    let mut rows = Vec::new();
    for &n in sizes {
        let a_host = random(n * n, 11 + n as u64);
        let b_host = random(n * n, 13 + n as u64);
        let (a, b, c) =
            (be.upload(&a_host).map_err(err)?, be.upload(&b_host).map_err(err)?, be.alloc(n * n).map_err(err)?);
        let ca = blas.stream.clone_htod(&a_host).map_err(err)?;
        let cb = blas.stream.clone_htod(&b_host).map_err(err)?;
        let mut cc = blas.stream.alloc_zeros::<f32>(n * n).map_err(err)?;
        let flops = 2.0 * (n as f64).powi(3);
        let reps = (2048 * 2048 * 2048 * 4 / (n * n * n)).clamp(1, 8);
        let op = Op::matmul(n, n, n);
        let mut configs = vec![SimtConfig::default()];
        if sweep {
            configs.extend(sweep_configs());
        }
        for cfg in configs {
            let spec = MatmulSpec::new(n, n, n);
            let mut ours_err = None;
            let mut theirs_err = None;
            let (ours, theirs) = time_pair(
                || {
                    for _ in 0..reps {
                        let r = if cfg == SimtConfig::default() {
                            be.run_tensors(&op, &[&a, &b], &c)
                        } else {
                            be.matmul_tier(GemmTier::Simt(cfg), spec, &a, &b, &c)
                        };
                        if let Err(e) = r {
                            ours_err = Some(e.to_string());
                        }
                    }
                    if let Err(e) = be.synchronize() {
                        ours_err = Some(e.to_string());
                    }
                },
                || {
                    for _ in 0..reps {
                        if let Err(e) = blas.sgemm(n, &ca, &cb, &mut cc) {
                            theirs_err = Some(e);
                        }
                    }
                    if let Err(e) = blas.stream.synchronize() {
                        theirs_err = Some(e.to_string());
                    }
                },
                budget,
                3,
            );
            if let Some(e) = ours_err.or(theirs_err) {
                return Err(format!("sgemm {n}: {e}"));
            }
            let (ours, theirs) = (ours / reps as f64, theirs / reps as f64);
            // Agreement with cuBLAS on the same inputs, relative to the largest |C|.
            let mut mine = vec![0.0f32; n * n];
            be.download(&c, &mut mine).map_err(err)?;
            let other = blas.stream.clone_dtoh(&cc).map_err(err)?;
            let scale = other.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
            let diff = mine.iter().zip(&other).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
            let mut r = record("sgemm", format!("{n}x{n}x{n}"), device, "resident", ours).with_peer("cublas", theirs);
            r.gflops = Some(flops / ours / 1e9);
            r.note = Some(format!(
                "{}; cuBLAS {:.1} TFLOP/s; max |ours-cublas|/max|C| = {diff:.1e}; goal >= 0.9x cuBLAS",
                cfg.kernel_name(false, false),
                flops / theirs / 1e12
            ));
            if sweep {
                // Progress as it goes: a sweep is long, and a time limit may cut it short.
                eprintln!(
                    "sweep {n} {:<58} {:>6.2} TFLOP/s  cuBLAS {:>6.2}  ratio {:.3}  diff {diff:.1e}",
                    cfg.kernel_name(false, false),
                    flops / ours / 1e12,
                    flops / theirs / 1e12,
                    theirs / ours
                );
            }
            rows.push(r);
        }
    }
    Ok(rows)
}

/// Other register-blocked shapes timed by `COMPUTE_PTX_GEMM_SWEEP`
/// (`compute_ptx::kernels::gemm_simt::sweep_configs`).
pub fn sweep_configs() -> Vec<SimtConfig> {
    compute_ptx::kernels::gemm_simt::sweep_configs()
}

/// Times `f` (`reps` launches) against a device copy of `copy_floats` floats
/// (the same bytes read + written); returns (ours, copy) seconds per launch.
pub(crate) fn against_copy(
    be: &CudaBackend,
    copy_floats: usize,
    budget: Duration,
    mut f: impl FnMut() -> compute_core::Result<()>,
) -> Result<(f64, f64), String> {
    let src = be.upload(&random(copy_floats.min(1 << 20), 5)).map_err(err)?;
    let src = if src.len() == copy_floats { src } else { tile(be, &src, copy_floats)? };
    let dst = be.alloc(copy_floats).map_err(err)?;
    let reps = 4;
    let (mut ours_fail, mut copy_fail) = (None, None);
    let (ours, copy) = time_pair(
        || {
            for _ in 0..reps {
                if let Err(e) = f() {
                    ours_fail = Some(e.to_string());
                }
            }
            if let Err(e) = be.synchronize() {
                ours_fail = Some(e.to_string());
            }
        },
        || {
            for _ in 0..reps {
                if let Err(e) = be.copy(&src, &dst) {
                    copy_fail = Some(e.to_string());
                }
            }
            if let Err(e) = be.synchronize() {
                copy_fail = Some(e.to_string());
            }
        },
        budget,
        5,
    );
    match ours_fail.or(copy_fail) {
        Some(e) => Err(e),
        None => Ok((ours / reps as f64, copy / reps as f64)),
    }
}

/// A tensor of `n` floats made of copies of `part` (device-side, fast).
fn tile(be: &CudaBackend, part: &Tensor, n: usize) -> Result<Tensor, String> {
    let mut host = vec![0.0f32; part.len()];
    be.download(part, &mut host).map_err(err)?;
    let full: Vec<f32> = host.iter().copied().cycle().take(n).collect();
    be.upload(&full).map_err(err)
}

fn stream_rows(be: &CudaBackend, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    let n: usize = if quick { 64 << 20 } else { 256 << 20 };
    let label = format!("{}M", n >> 20);
    let x = be.upload(&random(n, 21)).map_err(err)?;
    let y = be.upload(&random(n, 23)).map_err(err)?;
    let z = be.alloc(n).map_err(err)?;
    let one = be.alloc(1).map_err(err)?;
    let gb = |bytes: f64, s: f64| bytes / s / 1e9;
    let mut rows = Vec::new();
    for (name, op) in [
        ("relu", UnaryOp::Relu),
        ("gelu_tanh", UnaryOp::Gelu(compute_core::GeluForm::Tanh)),
        ("gelu_erf", UnaryOp::Gelu(compute_core::GeluForm::Erf)),
    ] {
        let o = Op::unary(op, n);
        let (ours, copy) = against_copy(be, n, budget, || be.run_tensors(&o, &[&x], &z))?;
        let mut r = record(name, label.clone(), device, "resident", ours).with_peer("copy", copy);
        r.gbps = Some(gb(8.0 * n as f64, ours));
        r.note = Some(format!("copy {:.0} GB/s (r+w); goal >= 0.9x copy", gb(8.0 * n as f64, copy)));
        rows.push(r);
    }
    let add = Op::binary(BinaryOp::Add, n);
    let (ours, copy) = against_copy(be, n * 3 / 2, budget, || be.run_tensors(&add, &[&x, &y], &z))?;
    let mut r = record("add", label.clone(), device, "resident", ours).with_peer("copy", copy);
    r.gbps = Some(gb(12.0 * n as f64, ours));
    r.note = Some("peer copies the same 12 bytes/element".into());
    rows.push(r);
    for (name, op) in [("dot", Op::dot(n)), ("sum", Op::reduce(ReduceOp::Sum, n))] {
        let ins: Vec<&Tensor> = if name == "dot" { vec![&x, &y] } else { vec![&x] };
        let bytes = 4.0 * n as f64 * ins.len() as f64;
        let (ours, copy) = against_copy(be, (bytes / 8.0) as usize, budget, || be.run_tensors(&op, &ins, &one))?;
        let mut r = record(name, label.clone(), device, "resident", ours).with_peer("copy", copy);
        r.gbps = Some(gb(bytes, ours));
        r.note = Some(format!(
            "reads {bytes:.0} bytes; peer copies them (half read, half written); goal >= 0.9x read bandwidth"
        ));
        rows.push(r);
    }
    let (rr, cc) = if quick { (16384, 4096) } else { (65536, 4096) };
    let xs = be.upload(&random(rr * cc, 31)).map_err(err)?;
    let ys = be.alloc(rr * cc).map_err(err)?;
    let gamma = be.upload(&random(cc, 33)).map_err(err)?;
    let beta = be.upload(&random(cc, 35)).map_err(err)?;
    for (name, op) in [("softmax", RowOp::Softmax), ("layer_norm", RowOp::LayerNorm { eps: 1e-5 })] {
        let o = Op::rows(op, rr, cc);
        let ins: Vec<&Tensor> = if name == "softmax" { vec![&xs] } else { vec![&xs, &gamma, &beta] };
        let (ours, copy) = against_copy(be, rr * cc, budget, || be.run_tensors(&o, &ins, &ys))?;
        let mut r = record(name, format!("{rr}x{cc}"), device, "resident", ours).with_peer("copy", copy);
        r.gbps = Some(gb(8.0 * (rr * cc) as f64, ours));
        r.note = Some("effective GB/s (x read once + y written once); softmax goal >= 3.0 TB/s".into());
        rows.push(r);
    }
    Ok(rows)
}

fn round_trip_row(be: &CudaBackend, device: &str, budget: Duration) -> Result<Record, String> {
    let x = random(1024, 41);
    let mut y = vec![0.0f32; 1024];
    let op = Op::unary(UnaryOp::Relu, 1024);
    let mut failure = None;
    let t = time(
        || {
            if let Err(e) = be.run(&op, &[&x], &mut y) {
                failure = Some(e.to_string());
            }
        },
        budget,
        200,
    );
    if let Some(e) = failure {
        return Err(e);
    }
    let mut r = record("relu", "1k".into(), device, "host", t);
    r.note = Some("warm host->GPU->host round trip of one op; goal <= 30 us".into());
    Ok(r)
}

/// cuBLAS arguments of the row-major `n × n` product `C = A·B`, issued as the
/// column-major `Cᵀ = Bᵀ·Aᵀ` (pass `B` as cuBLAS's first operand, `A` second).
pub fn square_sgemm_config(n: usize) -> GemmConfig<f32> {
    let n = n as i32;
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n,
        n,
        k: n,
        alpha: 1.0f32,
        lda: n,
        ldb: n,
        beta: 0.0f32,
        ldc: n,
    }
}

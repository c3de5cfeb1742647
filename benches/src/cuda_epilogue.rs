//! Bench rows for matmul epilogues on CUDA: `bf16` `C = A·Bᵀ` with a bias
//! and a GELU (tanh form), and with a bias and a residual (`beta = 1`, `C₀`),
//! each beside cuBLASLt's own fused epilogues (`CUBLASLT_EPILOGUE_GELU_BIAS`,
//! `CUBLASLT_EPILOGUE_BIAS` with `beta = 1`) on copies of the same inputs in
//! the same process, interleaved; and the plain product beside cuBLASLt's
//! plain one, so each row's note gives what the epilogue costs either side.
//! Shapes `m×n×k`: 4096³, 8192³, 4096×14336×4096 and 512×4096×4096 (`--quick`: 4096³).

use std::time::Duration;

use compute_core::{Activation, Backend, DType, GeluForm, HostVec, MatmulSpec, Op, Tensor, bf16};
use compute_ptx::CudaBackend;
use cudarc::cublaslt::{self, CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use crate::cuda::{err, random, record};
use crate::report::{Record, time_pair};

/// The three products of a row: plain, bias + GELU, bias + residual.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Plain,
    BiasGelu,
    BiasResidual,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Plain, Variant::BiasGelu, Variant::BiasResidual];

    fn spec(self, m: usize, n: usize, k: usize) -> MatmulSpec {
        let s = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) }.with_dtypes(DType::BF16, DType::BF16);
        match self {
            Variant::Plain => s,
            Variant::BiasGelu => s.with_bias().with_activation(Activation::Gelu(GeluForm::Tanh)),
            Variant::BiasResidual => s.with_bias().with_scales(1.0, 1.0),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::BiasGelu => "bias+gelu",
            Variant::BiasResidual => "bias+residual",
        }
    }
}

/// `len` random bf16 values on our device and in a cuBLASLt buffer.
fn operand(
    be: &CudaBackend,
    stream: &std::sync::Arc<CudaStream>,
    len: usize,
    seed: u64,
) -> Result<(Tensor, CudaSlice<bf16>), String> {
    let host = HostVec::from_f32(DType::BF16, &random(len, seed));
    let ours = be.upload_typed(host.as_slice()).map_err(err)?;
    let vals: Vec<bf16> = host.to_f32().into_iter().map(bf16::from_f32).collect();
    let theirs = stream.clone_htod(&vals).map_err(err)?;
    Ok((ours, theirs))
}

/// The epilogue rows ([module docs](self)).
pub fn rows(be: &CudaBackend, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    // SAFETY: only probes whether the cuBLASLt library can be loaded.
    if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        return Err("cuBLASLt (libcublasLt) not found: add /usr/local/cuda/lib64 to LD_LIBRARY_PATH".into());
    }
    let ctx = CudaContext::new(0).map_err(err)?;
    let stream = ctx.new_stream().map_err(err)?;
    let lt = CudaBlasLT::new(stream.clone()).map_err(err)?;
    let shapes: &[(usize, usize, usize)] = if quick {
        &[(4096, 4096, 4096)]
    } else {
        &[(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096), (512, 4096, 4096)]
    };
    let mut out = Vec::new();
    for &(m, n, k) in shapes {
        let (a, ca) = operand(be, &stream, m * k, 91 + k as u64)?;
        let (b, cb) = operand(be, &stream, n * k, 93 + n as u64)?;
        let (bias, cbias) = operand(be, &stream, n, 95)?;
        let (c0, _) = operand(be, &stream, m * n, 97)?;
        let c = be.alloc_typed(m * n, DType::BF16).map_err(err)?;
        // cuBLASLt reads C₀ from its output buffer: a copy of C₀ per call is
        // not timed, so its residual product accumulates onto the last result
        // (same work, different values).
        let mut cc = operand(be, &stream, m * n, 97)?.1;
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((1u64 << 36) as f64 / flops).clamp(1.0, 16.0) as usize;
        let mut plain = (0.0, 0.0);
        for v in Variant::ALL {
            let spec = v.spec(m, n, k);
            let op = Op::Matmul(spec);
            let inputs: Vec<&Tensor> = match v {
                Variant::Plain => vec![&a, &b],
                Variant::BiasGelu => vec![&a, &b, &bias],
                Variant::BiasResidual => vec![&a, &b, &bias, &c0],
            };
            // Row-major C = A·Bᵀ is column-major Cᵀ = B·Aᵀ: cuBLASLt's `a` is
            // our B (k × n column-major, transposed), its `b` our A.
            let cfg = MatmulConfig {
                transa: true,
                transb: false,
                transc: false,
                m: n as u64,
                n: m as u64,
                k: k as u64,
                alpha: 1.0,
                lda: k as i64,
                ldb: k as i64,
                beta: if v == Variant::BiasResidual { 1.0 } else { 0.0 },
                ldc: n as i64,
                stride_a: None,
                stride_b: None,
                stride_c: None,
                stride_bias: None,
                batch_size: None,
            };
            let act = (v == Variant::BiasGelu).then_some(cublaslt::Activation::Gelu);
            let bias_arg = (v != Variant::Plain).then_some(&cbias);
            let (mut e1, mut e2) = (None, None);
            let (ours, theirs) = time_pair(
                || {
                    for _ in 0..reps {
                        if let Err(e) = be.run_tensors(&op, &inputs, &c) {
                            e1 = Some(e.to_string());
                        }
                    }
                    if let Err(e) = be.synchronize() {
                        e1 = Some(e.to_string());
                    }
                },
                || {
                    for _ in 0..reps {
                        // SAFETY: the buffers hold k·n, m·k, n and m·n bf16
                        // values on this stream's device, alive past the sync below.
                        if let Err(e) = unsafe { lt.matmul(cfg, &cb, &ca, &mut cc, bias_arg, act.as_ref()) } {
                            e2 = Some(e.to_string());
                        }
                    }
                    if let Err(e) = stream.synchronize() {
                        e2 = Some(e.to_string());
                    }
                },
                budget,
                3,
            );
            if let Some(e) = e1.or(e2) {
                return Err(format!("epilogue {} {m}x{n}x{k}: {e}", v.name()));
            }
            let (ours, theirs) = (ours / reps as f64, theirs / reps as f64);
            if v == Variant::Plain {
                plain = (ours, theirs);
            }
            let shape = format!("{m}x{n}x{k} B^T {}", v.name());
            let mut r = record("gemm bf16 epilogue", shape, device, "resident", ours).with_peer("cublaslt", theirs);
            r.gflops = Some(flops / ours / 1e9);
            r.note = Some(format!(
                "ours {:.3} ms ({:.2}x our plain product), cuBLASLt {:.3} ms ({:.2}x its plain product)",
                ours * 1e3,
                ours / plain.0,
                theirs * 1e3,
                theirs / plain.1
            ));
            out.push(r);
        }
    }
    Ok(out)
}

//! Attention two ways on an NVIDIA GPU, with a layer norm in front: per-head
//! query and key normalisation (QK-norm, as OLMo-2 and Gemma-3 do), then
//!
//! - composed: `S = q·kᵀ` (a batched matmul over heads), scaled, `softmax`
//!   over each row, `O = P·v` (another batched matmul): four launches and an
//!   `h × s × s` score matrix in memory;
//! - fused: the `attention` op, one launch, no score matrix.
//!
//! All on device tensors in bf16 (the composed form rounds `S` and `P` to
//! bf16 between its steps). Prints both times, the bytes the score matrix
//! takes, and the largest difference between the two outputs. Without a GPU
//! it says so and exits.
//!
//! `cargo run --release -p compute-ptx --features cuda --example simple_attention_cuda`

use std::time::Instant;

use compute_core::rng::Rng;
use compute_core::{AttentionSpec, Backend, ComputeError, DType, HostVec, MatmulSpec, Op, RowOp, Tensor, UnaryOp};
use compute_ptx::CudaBackend;

fn main() -> Result<(), ComputeError> {
    let gpu = match CudaBackend::new() {
        Ok(be) => be,
        Err(e) => {
            println!("no CUDA device: {e}");
            return Ok(());
        }
    };
    let (heads, s, d) = (16usize, 2048usize, 64usize);
    let dt = DType::BF16;
    println!("device: {}; {heads} heads, {s} tokens, head size {d}, {dt}", gpu.device_name());
    let mut rng = Rng::new(11);
    let mut upload =
        |n: usize, lo: f64, hi: f64| gpu.upload_typed(HostVec::from_f32(dt, &rng.vec(n, lo, hi)).as_slice());
    let n = heads * s * d;
    let (q, k, v) = (upload(n, -2.0, 2.0)?, upload(n, -2.0, 2.0)?, upload(n, -1.0, 1.0)?);
    let (gamma, beta) = (upload(d, 0.5, 1.5)?, upload(d, -0.1, 0.1)?);

    // QK-norm: layer norm over each head's vector of q and k.
    let norm = Op::rows(RowOp::LayerNorm { eps: 1e-5 }, heads * s, d).with_dtype(dt);
    let (qn, kn) = (gpu.alloc_typed(n, dt)?, gpu.alloc_typed(n, dt)?);
    gpu.run_tensors(&norm, &[&q, &gamma, &beta], &qn)?;
    gpu.run_tensors(&norm, &[&k, &gamma, &beta], &kn)?;

    // Composed: S = q·kᵀ, scale, softmax rows, O = P·v.
    let scores = Op::Matmul(MatmulSpec { batch: heads, trans_b: true, ..MatmulSpec::new(s, d, s) }.with_dtypes(dt, dt));
    let scale = Op::unary(UnaryOp::Scale { s: 1.0 / (d as f32).sqrt() }, heads * s * s).with_dtype(dt);
    let softmax = Op::rows(RowOp::Softmax, heads * s, s).with_dtype(dt);
    let pv = Op::Matmul(MatmulSpec { batch: heads, ..MatmulSpec::new(s, s, d) }.with_dtypes(dt, dt));
    let (sm, pm, composed) =
        (gpu.alloc_typed(heads * s * s, dt)?, gpu.alloc_typed(heads * s * s, dt)?, gpu.alloc_typed(n, dt)?);
    let run_composed = || -> Result<(), ComputeError> {
        gpu.run_tensors(&scores, &[&qn, &kn], &sm)?;
        gpu.run_tensors(&scale, &[&sm], &pm)?;
        gpu.run_tensors(&softmax, &[&pm], &sm)?;
        gpu.run_tensors(&pv, &[&sm, &v], &composed)
    };

    // Fused.
    let attention = Op::Attention(AttentionSpec::new(1, heads, s, s, d).with_dtype(dt));
    let fused = gpu.alloc_typed(n, dt)?;
    let run_fused = || gpu.run_tensors(&attention, &[&qn, &kn, &v], &fused);

    let time = |f: &dyn Fn() -> Result<(), ComputeError>| -> Result<f64, ComputeError> {
        f()?;
        gpu.synchronize()?;
        let start = Instant::now();
        for _ in 0..10 {
            f()?;
        }
        gpu.synchronize()?;
        Ok(start.elapsed().as_secs_f64() / 10.0)
    };
    let (tc, tf) = (time(&run_composed)?, time(&run_fused)?);
    let flops = attention.cost().flops as f64;
    println!(
        "composed: {:.3} ms ({:.0} TFLOP/s), score matrix {} MiB",
        tc * 1e3,
        flops / tc / 1e12,
        (heads * s * s * 2) >> 20
    );
    println!("fused:    {:.3} ms ({:.0} TFLOP/s), {:.1}x faster", tf * 1e3, flops / tf / 1e12, tc / tf);

    let read = |t: &Tensor| -> Result<Vec<f32>, ComputeError> {
        let mut h = HostVec::zeros(dt, n);
        gpu.download_typed(t, h.as_mut())?;
        Ok(h.to_f32())
    };
    let (a, b) = (read(&composed)?, read(&fused)?);
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    let peak = b.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
    println!("largest difference between the two: {diff:.2e} (largest |output| {peak:.2e})");
    Ok(())
}

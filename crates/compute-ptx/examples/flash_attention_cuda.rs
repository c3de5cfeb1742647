//! Fused attention on an NVIDIA GPU: bf16, causal, grouped-query heads
//! (32 query heads on 8 key/value heads), the shape of one layer of a
//! Llama-style model at a 4096-token prefill, then one decoding step against
//! the same cache. Checks a small case against the float64 reference first,
//! and prints each call's time and TFLOP/s (or GB/s of KV cache read).
//! Without a GPU it prints the start of the kernel's PTX instead: the kernel
//! is generated in Rust and needs no CUDA toolkit.
//!
//! `cargo run --release -p compute-ptx --features cuda --example flash_attention_cuda`

use std::time::Instant;

use compute_core::conformance::{compare_typed, typed_inputs_for};
use compute_core::rng::Rng;
use compute_core::{AttentionSpec, Backend, ComputeError, DType, HostVec, Op, Ops, bf16};
use compute_ptx::CudaBackend;
use compute_ptx::builder::Target;
use compute_ptx::kernels::KernelId;
use compute_ptx::kernels::attention::FlashConfig;

fn main() -> Result<(), ComputeError> {
    let gpu = match CudaBackend::new() {
        Ok(be) => be,
        Err(e) => {
            println!("no CUDA device ({e}); the kernel this example would run, as generated:");
            let id = KernelId::AttentionFlash(FlashConfig::for_head_dim(128), DType::BF16);
            let kernel = id.build(Target::Sm80).map_err(|e| ComputeError::Compile {
                backend: compute_core::BackendKind::Cuda,
                kernel: e.kernel.clone(),
                message: e.to_string(),
            })?;
            for line in kernel.ptx().lines().take(24) {
                println!("{line}");
            }
            return Ok(());
        }
    };
    println!("device: {}", gpu.device_name());

    // 1. Correctness on a small case: every output element within the stated tolerance.
    let small = AttentionSpec::new(1, 8, 100, 100, 128).with_kv_heads(2).causal().with_dtype(DType::BF16);
    let op = Op::Attention(small);
    let inputs = typed_inputs_for(&op, &mut Rng::new(7));
    let views: Vec<_> = inputs.iter().map(HostVec::as_slice).collect();
    let mut out = HostVec::zeros(DType::BF16, inputs[0].len());
    gpu.run_typed(&op, &views, out.as_mut())?;
    match compare_typed(&op, &views, out.as_slice(), 1.0) {
        None => println!("{}: matches the float64 reference", op.shapes()),
        Some(msg) => println!("{}: MISMATCH {msg}", op.shapes()),
    }

    // 2. A prefill of 4096 tokens and one decoding step, on device tensors.
    let prefill = AttentionSpec::new(1, 32, 4096, 4096, 128).with_kv_heads(8).causal().with_dtype(DType::BF16);
    let decode = AttentionSpec { seq_q: 1, ..prefill };
    let random = |n: usize, seed: u64| -> Vec<bf16> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0))).collect()
    };
    let kv_len = prefill.batch * prefill.heads_kv * prefill.seq_k * prefill.head_dim;
    let k = random(kv_len, 2);
    let v = random(kv_len, 3);
    for (name, spec) in [("prefill", prefill), ("decode", decode)] {
        let q = random(spec.batch * spec.heads_q * spec.seq_q * spec.head_dim, 1);
        let mut o = vec![bf16::ZERO; q.len()];
        gpu.attention(spec, &q, &k, &v, &mut o)?; // warm-up: loads the kernel
        let (tq, tk, tv) = (
            gpu.upload_typed(q.as_slice().into())?,
            gpu.upload_typed(k.as_slice().into())?,
            gpu.upload_typed(v.as_slice().into())?,
        );
        let to = gpu.alloc_typed(q.len(), DType::BF16)?;
        let op = Op::Attention(spec);
        let reps = 20;
        gpu.run_tensors(&op, &[&tq, &tk, &tv], &to)?;
        gpu.synchronize()?;
        let start = Instant::now();
        for _ in 0..reps {
            gpu.run_tensors(&op, &[&tq, &tk, &tv], &to)?;
        }
        gpu.synchronize()?;
        let secs = start.elapsed().as_secs_f64() / reps as f64;
        let rate = if spec.seq_q == 1 {
            format!("{:.0} GB/s of KV cache", 2.0 * kv_len as f64 * 2.0 / secs / 1e9)
        } else {
            format!("{:.0} TFLOP/s", op.cost().flops as f64 / secs / 1e12)
        };
        println!("{name:8} {}: {:.3} ms, {rate}", op.shapes(), secs * 1e3);
    }
    Ok(())
}

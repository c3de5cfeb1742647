//! Fused attention through the dispatcher: each call runs on the engine the
//! calibrated cost model predicts fastest for its size (the CPU for a short
//! prompt, a GPU for a long prefill or a batch of decoding steps, when one is
//! present). Prints each call's engine, the model's prediction for every
//! engine, the measured time, and whether the result matches the float64
//! reference (checked on the smaller calls).
//!
//! `cargo run --release -p dispatch --features cuda --example attention`
//! (`--features gpu` is the default: wgpu; without a GPU every call runs on the CPU.)

use std::time::Instant;

use compute_core::conformance::{compare_typed, typed_inputs_for};
use compute_core::rng::Rng;
use compute_core::{AttentionSpec, Backend, ComputeError, DType, HostVec, Op};
use dispatch::{Compute, Placement};

fn main() -> Result<(), ComputeError> {
    let compute = Compute::auto()?;
    println!("engines: {:?}", compute.engines());
    let shapes = [
        ("short prompt", AttentionSpec::new(1, 8, 16, 16, 64).causal()),
        ("decode step", AttentionSpec::new(1, 32, 1, 2048, 128).with_kv_heads(8).causal().with_dtype(DType::BF16)),
        ("decode batch", AttentionSpec::new(16, 32, 1, 4096, 128).with_kv_heads(8).causal().with_dtype(DType::BF16)),
        ("prefill", AttentionSpec::new(1, 32, 2048, 2048, 128).with_kv_heads(8).causal().with_dtype(DType::BF16)),
    ];
    let mut rng = Rng::new(3);
    for (name, spec) in shapes {
        let op = Op::Attention(spec);
        let inputs = typed_inputs_for(&op, &mut rng);
        let views: Vec<_> = inputs.iter().map(HostVec::as_slice).collect();
        let mut out = HostVec::zeros(spec.dtype, inputs[0].len());
        let predictions: Vec<String> = compute
            .engines()
            .into_iter()
            .filter_map(|e| {
                compute.model().predict(e, &op, Placement::Host).map(|t| format!("{e:?} {:.3} ms", t * 1e3))
            })
            .collect();
        compute.run_typed(&op, &views, out.as_mut())?; // warm-up (loads kernels)
        let start = Instant::now();
        compute.run_typed(&op, &views, out.as_mut())?;
        let secs = start.elapsed().as_secs_f64();
        let check = if op.cost().flops < 1 << 31 {
            match compare_typed(&op, &views, out.as_slice(), 1.0) {
                None => "matches the reference".to_string(),
                Some(msg) => format!("MISMATCH: {msg}"),
            }
        } else {
            "not checked (large)".to_string()
        };
        println!(
            "{name:13} {}: ran on {:?} in {:.3} ms (host data, copies included); predicted: {}; {check}",
            op.shapes(),
            compute.last_engine(),
            secs * 1e3,
            predictions.join(", ")
        );
    }
    Ok(())
}

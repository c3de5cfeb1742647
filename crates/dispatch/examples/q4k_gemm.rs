//! Quantizes a random weight to `Q4_K` (bit-exact with ggml's reference
//! quantizer), then multiplies it by one activation row (GEMV: decoding one
//! token) and by 16 and 64 rows (a batch, a prompt's prefill) on every engine
//! of this machine (the CPU, and wgpu and CUDA where present), with the weight
//! and activations resident on the engine. Prints, per engine and row count,
//! the time, the GB/s of weight blocks read, the ratio to a copy on the same
//! engine (bytes read plus written per second, measured in the same run), and
//! the error against the float64 product with the dequantized weight, as a
//! fraction of the op's stated bound.
//!
//! `cargo run --release -p dispatch --features cuda --example q4k_gemm [-- k n [format]]`
//! (default 4096 × 14336, `q4_K`; `format` one of `q4_K`, `q5_K`, `q6_K`, `q8_0`).

use std::time::Instant;

use compute_core::conformance::compare_typed;
use compute_core::{ComputeError, DType, HostSlice, HostVec, Op, QuantMatmulSpec, reference};
use dispatch::Compute;

/// Median seconds of `reps` calls of `f`, after one warm-up call.
fn median(reps: usize, mut f: impl FnMut() -> Result<(), ComputeError>) -> Result<f64, ComputeError> {
    f()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let k: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4096);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(14336);
    let weight = match args.next().as_deref() {
        None | Some("q4_K") => DType::Q4K,
        Some("q5_K") => DType::Q5K,
        Some("q6_K") => DType::Q6K,
        Some("q8_0") => DType::Q8_0,
        Some(other) => return Err(format!("unknown format {other}").into()),
    };
    let values = compute_core::rng::random_vec(n * k, -1.0, 1.0, 1);
    let start = Instant::now();
    let w = HostVec::from_f32(weight, &values);
    let w_bytes = w.as_slice().as_bytes().len();
    println!(
        "quantized {n}×{k} to {weight}: {:.1} MB → {:.1} MB in {:.2} s",
        (n * k * 4) as f64 / 1e6,
        w_bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    let compute = Compute::auto()?;
    for engine in compute.engines() {
        let Some(backend) = compute.backend(engine) else { continue };
        println!("{engine:?} [{}]", backend.device_name());
        let wt = backend.upload_typed(w.as_slice())?;
        // A copy of the weight's bytes on the same engine: the bandwidth yardstick.
        let words = w_bytes / 4;
        let (src, dst) = (backend.alloc(words)?, backend.alloc(words)?);
        let copy_op = Op::cast(words, DType::F32, DType::F32);
        let copy_s = median(20, || {
            backend.run_tensors(&copy_op, &[&src], &dst)?;
            backend.synchronize()
        })?;
        let copy_gbs = 2.0 * (words * 4) as f64 / copy_s / 1e9;
        for m in [1usize, 16, 64] {
            let op = Op::QuantMatmul(QuantMatmulSpec::new(m, k, n, weight));
            if !backend.supports(&op) {
                println!("  m={m:3}: not supported on this engine");
                continue;
            }
            let x = compute_core::rng::random_vec(m * k, -1.0, 1.0, 2);
            let xt = backend.upload(&x)?;
            let yt = backend.alloc(m * n)?;
            let secs = median(if m == 1 { 50 } else { 10 }, || {
                backend.run_tensors(&op, &[&xt, &wt], &yt)?;
                backend.synchronize()
            })?;
            let mut y = vec![0f32; m * n];
            backend.download(&yt, &mut y)?;
            // The error of the first rows against the f64 reference, as a
            // fraction of the stated bound (≤ 1 passes).
            let rows = m.min(2);
            let check = Op::QuantMatmul(QuantMatmulSpec::new(rows, k, n, weight));
            let views = [HostSlice::F32(&x[..rows * k]), w.as_slice()];
            let r = reference::run_typed(&check, &views)?;
            let worst = r.values.iter().zip(&r.scale).zip(&y).map(|((v, s), &g)| (f64::from(g) - v).abs() / s);
            let worst = worst.fold(0.0f64, f64::max);
            let verdict = match compare_typed(&check, &views, HostSlice::F32(&y[..rows * n]), 1.0) {
                None => "within the bound".to_string(),
                Some(e) => format!("OUTSIDE the bound: {e}"),
            };
            let gbs = w_bytes as f64 / secs / 1e9;
            println!(
                "  m={m:3}: {:9.1} µs  {gbs:7.1} GB/s of blocks  {:.2}× copy ({copy_gbs:.0} GB/s)  {:6.1} GFLOP/s  \
                 error {worst:.3} of the bound, {verdict}",
                secs * 1e6,
                gbs / copy_gbs,
                op.cost().flops as f64 / secs / 1e9
            );
        }
    }
    Ok(())
}

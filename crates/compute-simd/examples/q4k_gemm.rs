//! Quantizes a random weight to `Q4_K` (bit-exact with ggml's reference
//! quantizer), multiplies it by one activation row (GEMV, decoding one token)
//! and by 16 and 64 rows (batches, as in a prompt's prefill) on the CPU
//! backend, and prints the error against the f64 product of the dequantized
//! weight, the GB/s of weight read and, for the batches, the GFLOP/s (two
//! operations per multiply-add).
//!
//! `cargo run --release -p compute-simd --example q4k_gemm [-- k n]` (default
//! 4096 × 4096).

use std::time::Instant;

use compute_core::quant::BlockFormat;
use compute_simd::quantized::{Weights, has_vnni, matmul};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let k = args.next().transpose()?.unwrap_or(4096);
    let n = args.next().transpose()?.unwrap_or(4096);
    let weight = compute_core::rng::random_vec(n * k, -1.0, 1.0, 1);
    let format = BlockFormat::Q4K;
    let mut blocks = vec![0u8; n * format.row_bytes(k)?];
    let start = Instant::now();
    format.quantize(&weight, &mut blocks)?;
    println!(
        "quantized {n}×{k} to Q4_K: {:.1} MB → {:.1} MB in {:.2} s",
        (n * k * 4) as f64 / 1e6,
        blocks.len() as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    let mut dequantized = vec![0f32; n * k];
    format.dequantize(&blocks, &mut dequantized)?;
    println!("kernel: {}", if has_vnni() { "AVX-512 VNNI" } else { "scalar" });
    for m in [1usize, 16, 64] {
        let x = compute_core::rng::random_vec(m * k, -1.0, 1.0, 2);
        let mut y = vec![0f32; m * n];
        matmul(Weights::Q4K, &x, &blocks, (m, k, n), &mut y)?;
        let mut best = f64::INFINITY;
        for _ in 0..10 {
            let t = Instant::now();
            matmul(Weights::Q4K, &x, &blocks, (m, k, n), &mut y)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        // Largest error relative to Σ|w·x| of its output.
        let mut worst = 0f64;
        for (i, xi) in x.chunks_exact(k).enumerate() {
            for (j, wj) in dequantized.chunks_exact(k).enumerate() {
                let (exact, scale) = xi.iter().zip(wj).fold((0f64, 0f64), |(s, a), (&p, &q)| {
                    let t = f64::from(p) * f64::from(q);
                    (s + t, a + t.abs())
                });
                worst = worst.max((f64::from(y[i * n + j]) - exact).abs() / scale.max(f64::MIN_POSITIVE));
            }
        }
        println!(
            "{m:>2}×{k}×{n}: {:.3} ms, {:.1} GB/s of weight, {:.1} GFLOP/s, worst error {:.2e} of Σ|w·x|",
            best * 1e3,
            blocks.len() as f64 / best / 1e9,
            2.0 * (m * k * n) as f64 / best / 1e9,
            worst
        );
    }
    Ok(())
}

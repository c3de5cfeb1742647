//! The README's quickstart: a matmul and a softmax on the CPU backend.
//! `cargo run --release -p compute-simd --example quickstart`
use compute_core::{Backend, Ops};

fn main() -> Result<(), compute_core::ComputeError> {
    let cpu = compute_simd::SimdBackend::new(); // AVX-512 / AVX2 / NEON picked at run time
    let (m, k, n) = (64, 128, 32);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.25).collect();
    let mut c = vec![0.0; m * n];
    cpu.matmul(&a, &b, &mut c, m, k, n)?;
    let logits = c.clone();
    cpu.softmax(&logits, m, n, &mut c)?;
    let row_sum: f32 = c[..n].iter().sum();
    println!("softmax row 0 sums to {row_sum:.6} on {}", cpu.device_name());
    // Bad shapes are typed errors, not panics:
    if let Err(e) = cpu.matmul(&a, &b, &mut c, m, k + 1, n) {
        println!("as expected: {e}");
    }
    Ok(())
}

//! What a matmul epilogue costs on the CPU: an `f32` matmul plain, with a
//! bias and gelu (tanh form) applied in its epilogue, and plain followed by a
//! separate gelu op over `C` (what the epilogue saves), on 1 and 2 threads.
//!
//! ```text
//! cargo run --release -p compute-simd --example matmul_epilogue [-- SIZE|MxKxN... [--threads 1,2] [--rounds R]]
//! ```
//!
//! Each round runs the three variants once each, in turn, so that drift of
//! the machine touches them alike; the table gives the median time of each
//! (and its best) and the epilogue's cost as a fraction of the plain matmul.
//! Default: 1024×1024×1024, 1 and 2 threads, 30 rounds.
use std::time::Instant;

use compute_core::{Activation, Backend, GeluForm, MatmulSpec, Op, UnaryOp};
use compute_simd::SimdBackend;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut sizes = Vec::new();
    let mut threads = vec![1, 2];
    let mut rounds = 30;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--threads" => {
                threads = args.next().unwrap_or_default().split(',').filter_map(|s| s.parse().ok()).collect();
            }
            "--rounds" => rounds = args.next().unwrap_or_default().parse()?,
            s => {
                let d: Vec<usize> = s.split('x').map(str::parse).collect::<Result<_, _>>()?;
                sizes.push(match d[..] {
                    [s] => (s, s, s),
                    [m, k, n] => (m, k, n),
                    _ => return Err(format!("bad size {s}").into()),
                });
            }
        }
    }
    if sizes.is_empty() {
        sizes.push((1024, 1024, 1024));
    }
    println!("isa {}, {rounds} rounds, median (best) ms per call", compute_simd::Isa::detect());
    println!(
        "{:>15} {:>3} {:>16} {:>16} {:>9} {:>16} {:>9}",
        "size", "thr", "plain", "bias+gelu epi", "epi cost", "plain, then gelu", "op cost"
    );
    for &t in &threads {
        let cpu = SimdBackend::with_threads(t)?;
        for &(m, k, n) in &sizes {
            let [plain, fused, separate] = measure(&cpu, (m, k, n), rounds)?;
            let cell = |x: &[f64]| format!("{:.2} ({:.2})", 1e3 * median(x), 1e3 * best(x));
            let cost = |x: &[f64]| format!("{:+.1}%", 100.0 * (median(x) / median(&plain) - 1.0));
            println!(
                "{:>15} {t:>3} {:>16} {:>16} {:>9} {:>16} {:>9}",
                format!("{m}x{k}x{n}"),
                cell(&plain),
                cell(&fused),
                cost(&fused),
                cell(&separate),
                cost(&separate),
            );
        }
    }
    Ok(())
}

/// Seconds per call of the plain matmul, the one with the epilogue, and the
/// plain one followed by a gelu op, over `rounds` rounds.
fn measure(
    cpu: &SimdBackend,
    (m, k, n): (usize, usize, usize),
    rounds: usize,
) -> Result<[Vec<f64>; 3], Box<dyn std::error::Error>> {
    let mut rng = compute_core::rng::Rng::new((m * k * n) as u64);
    let a = rng.vec(m * k, -1.0, 1.0);
    let b = rng.vec(k * n, -1.0, 1.0);
    let bias = rng.vec(n, -1.0, 1.0);
    let mut c = vec![0.0f32; m * n];
    let mut g = vec![0.0f32; m * n];
    let spec = MatmulSpec::new(m, k, n);
    let plain = Op::Matmul(spec);
    let fused = Op::Matmul(spec.with_bias().with_activation(Activation::Gelu(GeluForm::Tanh)));
    let gelu = Op::unary(UnaryOp::Gelu(GeluForm::Tanh), m * n);
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..=rounds {
        let t = Instant::now();
        cpu.run(&plain, &[&a, &b], &mut c)?;
        let t_plain = t.elapsed().as_secs_f64();
        let t = Instant::now();
        cpu.run(&fused, &[&a, &b, &bias], &mut c)?;
        let t_fused = t.elapsed().as_secs_f64();
        let t = Instant::now();
        cpu.run(&plain, &[&a, &b], &mut c)?;
        cpu.run(&gelu, &[&c], &mut g)?;
        let t_separate = t.elapsed().as_secs_f64();
        // Round 0 warms the caches, pages and packing buffers.
        if round > 0 {
            for (v, x) in times.iter_mut().zip([t_plain, t_fused, t_separate]) {
                v.push(x);
            }
        }
    }
    Ok(times)
}

fn median(x: &[f64]) -> f64 {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn best(x: &[f64]) -> f64 {
    x.iter().copied().fold(f64::INFINITY, f64::min)
}

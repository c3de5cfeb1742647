//! SGEMM throughput of this crate next to faer 0.24, square sizes, 1 and 2 threads.
//!
//! ```text
//! cargo run --release -p compute-benches --example gemm_vs_faer [-- SIZE|MxKxN... [--threads 1,2] [--ta] [--tb]]
//! ```
//!
//! Each size runs ours and faer alternately (one call each per round) and
//! reports the median of each; inputs are random in [-1, 1). Ours goes through
//! the public `Backend::run` on `SimdBackend::with_threads(t)`; faer runs in a
//! rayon pool of `t` threads with `Par::Seq` (t = 1) or `Par::rayon(t)`, on
//! its native column-major matrices. The last lines give the geometric mean of
//! the ratios over sizes 1024–4096.
use std::time::Instant;

use compute_core::{Backend, MatmulSpec, Op};
use compute_simd::SimdBackend;
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut sizes = Vec::new();
    let mut threads = vec![1, 2];
    let (mut ta, mut tb) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--ta" => ta = true,
            "--tb" => tb = true,
            "--threads" => {
                threads = args.next().unwrap_or_default().split(',').filter_map(|s| s.parse().ok()).collect();
            }
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
        sizes = [256, 512, 1024, 1536, 2048, 3072, 4096].map(|s| (s, s, s)).to_vec();
    }
    println!("isa {} trans_a {ta} trans_b {tb}", compute_simd::Isa::detect());
    println!(
        "{:>6} {:>3} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>5} {:>9}",
        "size", "thr", "ours GF/s", "faer GF/s", "ratio", "ours best", "faer best", "ratio", "reps", "max|err|"
    );
    let mut logs = Vec::new();
    for &t in &threads {
        let ours = SimdBackend::with_threads(t)?;
        let pool = rayon::ThreadPoolBuilder::new().num_threads(t).build()?;
        let par = if t == 1 { Par::Seq } else { Par::rayon(t) };
        for &(mm, kk, nn) in &sizes {
            let m = measure(&ours, &pool, par, (mm, kk, nn), ta, tb)?;
            let (g_ours, g_faer) = (m.flops / median(&mut m.ours.clone()), m.flops / median(&mut m.faer.clone()));
            let (b_ours, b_faer) = (m.flops / best(&m.ours), m.flops / best(&m.faer));
            let ratio = g_ours / g_faer;
            let square = mm == kk && kk == nn;
            if square && (1024..=4096).contains(&mm) {
                logs.push(ratio.ln());
            }
            println!(
                "{:>6} {t:>3} {g_ours:>10.1} {g_faer:>10.1} {ratio:>7.3} {b_ours:>10.1} {b_faer:>10.1} {:>7.3} {:>5} {:>9.2e}",
                if square { mm.to_string() } else { format!("{mm}x{kk}x{nn}") },
                b_ours / b_faer,
                m.ours.len(),
                m.err
            );
        }
    }
    if !logs.is_empty() {
        let geo = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
        println!("geometric mean ours/faer over 1024..4096 x threads: {geo:.3} ({} rows)", logs.len());
    }
    Ok(())
}

/// Seconds per call of each side, the FLOPs of one call (in GFLOP), and the
/// largest difference between the two results.
struct Measured {
    ours: Vec<f64>,
    faer: Vec<f64>,
    flops: f64,
    err: f32,
}

fn measure(
    ours: &SimdBackend,
    pool: &rayon::ThreadPool,
    par: Par,
    (m, k, n): (usize, usize, usize),
    ta: bool,
    tb: bool,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let mut rng = compute_core::rng::Rng::new((m * k * n) as u64);
    let a = rng.vec(m * k, -1.0, 1.0);
    let b = rng.vec(k * n, -1.0, 1.0);
    let mut c = vec![0.0f32; m * n];
    let op = Op::Matmul(MatmulSpec { trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) });
    // faer gets the same mathematical operands, in its native column-major layout.
    let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] };
    let bt = |p: usize, j: usize| if tb { b[j * k + p] } else { b[p * n + j] };
    let fa = Mat::<f32>::from_fn(m, k, at);
    let fb = Mat::<f32>::from_fn(k, n, bt);
    let mut fc = Mat::<f32>::zeros(m, n);

    let flops = 2.0 * (m * k * n) as f64;
    let reps = ((100e9 / flops) as usize).clamp(5, 1000);
    ours.run(&op, &[&a, &b], &mut c)?;
    pool.install(|| matmul(fc.as_mut(), Accum::Replace, fa.as_ref(), fb.as_ref(), 1.0, par));
    let mut err = 0.0f32;
    for i in 0..m {
        for j in 0..n {
            err = err.max((c[i * n + j] - fc[(i, j)]).abs());
        }
    }
    let (mut t_ours, mut t_faer) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t0 = Instant::now();
        ours.run(&op, &[&a, &b], &mut c)?;
        t_ours.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        pool.install(|| matmul(fc.as_mut(), Accum::Replace, fa.as_ref(), fb.as_ref(), 1.0, par));
        t_faer.push(t0.elapsed().as_secs_f64());
    }
    Ok(Measured { ours: t_ours, faer: t_faer, flops: flops / 1e9, err })
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

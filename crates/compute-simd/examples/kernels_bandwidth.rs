//! Memory-bound kernels against the machine's own bandwidth, measured in the
//! same run: every op is timed interleaved with its peer (copy =
//! `out.copy_from_slice(x)` split over the threads, or a pure streaming read
//! for reductions). `ratio` is the ratio of achieved bandwidths (bytes read +
//! written, from `Op::cost`) from the two medians; `pairs` is the median of
//! the same ratio taken per adjacent pair, which is steadier on a busy machine.
//!
//! ```text
//! cargo run --release -p compute-simd --example kernels_bandwidth -- [len_in_units_of_2^20] [reps] [isa...]
//! cargo run --release -p compute-simd --example kernels_bandwidth -- thresholds
//! ```
//!
//! `thresholds` times each op class at sizes 2¹⁰…2²⁰ on one thread against the
//! same single-threaded kernel run on two halves in a 2-thread pool: the size
//! where the split starts winning is the parallel threshold in `tuning.rs`.
//!
//! `compute` runs each op on 64K elements (in L2) on one thread and reports
//! CPU nanoseconds per element of this thread (from `/proc/thread-self/schedstat`),
//! which other processes on a busy machine hardly disturb.

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use compute_core::{Backend, BinaryOp, GeluForm, Op, ReduceOp, RowOp, UnaryOp};
use compute_simd::{Isa, SimdBackend};
use rayon::prelude::*;

fn random(len: usize, seed: u64) -> Vec<f32> {
    compute_core::rng::random_vec(len, -2.0, 2.0, seed)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `a` and `b` alternately `reps` times (after one warm-up each) and
/// returns their median seconds and the median of the per-pair ratios
/// `time(b) / time(a)`, which load arriving mid-run disturbs least.
fn time_pair(mut a: impl FnMut(), mut b: impl FnMut(), reps: usize) -> (f64, f64, f64) {
    a();
    b();
    let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..reps {
        let one = |f: &mut dyn FnMut()| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        };
        let (x, y) = if i % 2 == 0 {
            let x = one(&mut a);
            (x, one(&mut b))
        } else {
            let y = one(&mut b);
            (one(&mut a), y)
        };
        ta.push(x);
        tb.push(y);
        ratios.push(y / x);
    }
    (median(ta), median(tb), median(ratios))
}

/// One-thread time against two-halves-on-two-threads time, per size.
fn thresholds() -> Result<(), Box<dyn Error>> {
    // No pool of its own: kernels run in whichever pool is installed around them.
    let backend = SimdBackend::new();
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let pool2 = rayon::ThreadPoolBuilder::new().num_threads(2).build()?;
    let max = 1 << 20;
    let x = random(max, 7);
    let mut out = vec![0.0f32; max];
    println!("{:<10} {:>9} {:>10} {:>10} {:>7}", "op", "len", "1 thread", "2 halves", "speedup");
    type MakeOp = fn(usize) -> Op;
    let classes: [(&str, MakeOp); 5] = [
        ("relu", |n| Op::unary(UnaryOp::Relu, n)),
        ("sigmoid", |n| Op::unary(UnaryOp::Sigmoid, n)),
        ("gelu_erf", |n| Op::unary(UnaryOp::Gelu(GeluForm::Erf), n)),
        ("sum", |n| Op::reduce(ReduceOp::Sum, n)),
        ("softmax", |n| Op::rows(RowOp::Softmax, n / 256, 256)),
    ];
    for (name, make) in classes {
        for shift in 10..=20 {
            let n = 1usize << shift;
            let (op, half_op) = (make(n), make(n / 2));
            let reduce = matches!(op, Op::Reduce { .. });
            // Batches of calls, so each timing is well above the clock resolution.
            let batch = (1usize << 22 >> shift).max(1);
            let ok = std::sync::atomic::AtomicBool::new(true);
            let check = |r: compute_core::Result<()>| {
                if r.is_err() {
                    ok.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            };
            let mut single = |out: &mut [f32]| {
                pool1.install(|| {
                    for _ in 0..batch {
                        let o = if reduce { &mut out[..1] } else { &mut out[..n] };
                        check(backend.run(&op, &[&x[..n]], o));
                    }
                })
            };
            let mut halves = |out: &mut [f32]| {
                pool2.install(|| {
                    for _ in 0..batch {
                        let (xa, xb) = x[..n].split_at(n / 2);
                        let (oa, ob) = out[..n].split_at_mut(n / 2);
                        let (oa, ob) = if reduce { (&mut oa[..1], &mut ob[..1]) } else { (oa, ob) };
                        rayon::join(
                            || check(backend.run(&half_op, &[xa], oa)),
                            || check(backend.run(&half_op, &[xb], ob)),
                        );
                    }
                })
            };
            let out_ptr = &mut out;
            let (mut t1, mut t2) = (Vec::new(), Vec::new());
            for i in 0..15 {
                let mut time = |f: &mut dyn FnMut(&mut [f32]), t: &mut Vec<f64>| {
                    let start = Instant::now();
                    f(out_ptr);
                    t.push(start.elapsed().as_secs_f64() / batch as f64);
                };
                if i % 2 == 0 {
                    time(&mut single, &mut t1);
                    time(&mut halves, &mut t2);
                } else {
                    time(&mut halves, &mut t2);
                    time(&mut single, &mut t1);
                }
            }
            if !ok.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(format!("{name} failed").into());
            }
            let (t1, t2) = (median(t1), median(t2));
            println!("{name:<10} {n:>9} {:>8.2}us {:>8.2}us {:>7.2}", t1 * 1e6, t2 * 1e6, t1 / t2);
        }
    }
    Ok(())
}

/// CPU time this thread has run, in nanoseconds (Linux).
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}

/// In-cache cost per element of every op on one thread, by thread CPU time.
fn compute(isas: &[Isa]) -> Result<(), Box<dyn Error>> {
    let n = 1 << 16;
    let cols = 1024;
    let (x, y) = (random(n, 8), random(n, 9));
    let (gamma, beta) = (random(cols, 10), random(cols, 11));
    let mut out = vec![0.0f32; n];
    let ops = [
        Op::unary(UnaryOp::Relu, n),
        Op::binary(BinaryOp::Add, n),
        Op::unary(UnaryOp::Sigmoid, n),
        Op::unary(UnaryOp::Tanh, n),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), n),
        Op::unary(UnaryOp::Gelu(GeluForm::Erf), n),
        Op::unary(UnaryOp::Swish, n),
        Op::unary(UnaryOp::Elu { alpha: 1.0 }, n),
        Op::rows(RowOp::Softmax, n / cols, cols),
        Op::rows(RowOp::LogSoftmax, n / cols, cols),
        Op::rows(RowOp::LayerNorm { eps: 1e-5 }, n / cols, cols),
        Op::rows(RowOp::RmsNorm { eps: 1e-5 }, n / cols, cols),
        Op::reduce(ReduceOp::Sum, n),
        Op::dot(n),
        Op::reduce(ReduceOp::Max, n),
    ];
    for &isa in isas {
        // No pool of its own: the calls run on the measuring 1-thread pool below.
        let backend = SimdBackend::new().with_isa(isa)?;
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
        println!(
            "\n{} on {n} elements in cache: CPU ns per element (median of 5 samples of 100 ms)",
            backend.device_name()
        );
        for op in &ops {
            let inputs: Vec<&[f32]> = match op {
                Op::Binary { .. } | Op::Dot { .. } => vec![&x, &y],
                Op::Rows { op: RowOp::LayerNorm { .. }, .. } => vec![&x, &gamma, &beta],
                Op::Rows { op: RowOp::RmsNorm { .. }, .. } => vec![&x, &gamma],
                _ => vec![&x],
            };
            let o = if matches!(op, Op::Reduce { .. } | Op::Dot { .. }) { &mut out[..1] } else { &mut out[..] };
            let mut samples = Vec::new();
            let mut failed = None;
            for _ in 0..5 {
                // Run until 100 ms of this thread's CPU time have passed (the
                // counter advances in scheduler ticks).
                let (t, calls) = pool.install(|| {
                    let start = thread_cpu_ns().unwrap_or(0);
                    let mut calls = 0u64;
                    loop {
                        for _ in 0..20 {
                            if let Err(e) = backend.run(op, &inputs, o) {
                                failed = Some(e);
                            }
                        }
                        calls += 20;
                        let t = thread_cpu_ns().unwrap_or(u64::MAX).saturating_sub(start);
                        if t >= 100_000_000 {
                            break (t, calls);
                        }
                    }
                });
                samples.push(t as f64 / (calls as f64 * n as f64));
            }
            if let Some(e) = failed {
                return Err(e.into());
            }
            println!("{:<12} {:>6.3} ns/element", op.name(), median(samples));
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("compute") {
        let mut isas: Vec<Isa> = args.iter().skip(1).filter_map(|s| Isa::parse(s)).collect();
        if isas.is_empty() {
            isas = Isa::available();
        }
        return compute(&isas);
    }
    if args.first().map(String::as_str) == Some("thresholds") {
        return thresholds();
    }
    let len = (args.first().and_then(|s| s.parse::<f64>().ok()).unwrap_or(16.0) * (1 << 20) as f64) as usize;
    let reps = args.get(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(15);
    let mut isas: Vec<Isa> = args.iter().skip(2).filter_map(|s| Isa::parse(s)).collect();
    if isas.is_empty() {
        isas.push(Isa::best());
    }
    let cols = 4096;
    let x = random(len, 3);
    let y = random(len, 4);
    let gamma = random(cols, 5);
    let beta = random(cols, 6);
    let mut out = vec![f32::NAN; len];
    let mut out2 = vec![f32::NAN; len];
    let ops: Vec<Op> = vec![
        Op::unary(UnaryOp::Relu, len),
        Op::binary(BinaryOp::Add, len),
        Op::unary(UnaryOp::Scale { s: 1.5 }, len),
        Op::unary(UnaryOp::Sigmoid, len),
        Op::unary(UnaryOp::Tanh, len),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), len),
        Op::unary(UnaryOp::Gelu(GeluForm::Erf), len),
        Op::unary(UnaryOp::Swish, len),
        Op::unary(UnaryOp::Elu { alpha: 1.0 }, len),
        Op::rows(RowOp::Softmax, len / cols, cols),
        Op::rows(RowOp::LogSoftmax, len / cols, cols),
        Op::rows(RowOp::LayerNorm { eps: 1e-5 }, len / cols, cols),
        Op::rows(RowOp::RmsNorm { eps: 1e-5 }, len / cols, cols),
        Op::reduce(ReduceOp::Sum, len),
        Op::dot(len),
        Op::reduce(ReduceOp::Max, len),
    ];
    println!("len = {len} f32, {reps} interleaved pairs per row, medians");
    for &isa in &isas {
        for threads in [1, 2] {
            let backend = SimdBackend::with_threads(threads)?.with_isa(isa)?;
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
            let chunk = len.div_ceil(threads);
            println!("\n{} ({threads} thread{})", backend.device_name(), if threads > 1 { "s" } else { "" });
            println!("{:<12} {:>9} {:>9} {:>9} {:>7} {:>7}", "op", "GB/s", "peer", "peer GB/s", "ratio", "pairs");
            for op in &ops {
                let inputs: Vec<&[f32]> = match op {
                    Op::Binary { .. } | Op::Dot { .. } => vec![&x, &y],
                    Op::Rows { op: RowOp::LayerNorm { .. }, .. } => vec![&x, &gamma, &beta],
                    Op::Rows { op: RowOp::RmsNorm { .. }, .. } => vec![&x, &gamma],
                    _ => vec![&x],
                };
                let bytes = op.cost().bytes() as f64;
                let reduction = matches!(op, Op::Reduce { .. } | Op::Dot { .. });
                let mut failed = None;
                let (t_op, t_peer, pair_ratio, peer, peer_bytes) = if reduction {
                    let mut o = [0.0f32];
                    let run = || {
                        if let Err(e) = backend.run(op, &inputs, &mut o) {
                            failed = Some(e);
                        }
                        black_box(o[0]);
                    };
                    let read = || {
                        let s = pool.install(|| {
                            x.par_chunks(chunk)
                                .map(|c| {
                                    let mut acc = [0.0f32; 32];
                                    for v in c.chunks_exact(32) {
                                        for (a, &b) in acc.iter_mut().zip(v) {
                                            *a += b;
                                        }
                                    }
                                    acc.iter().sum::<f32>()
                                })
                                .sum::<f32>()
                        });
                        black_box(s);
                    };
                    let (a, b, r) = time_pair(run, read, reps);
                    (a, b, r, "read", 4.0 * len as f64)
                } else {
                    let run = || {
                        if let Err(e) = backend.run(op, &inputs, &mut out) {
                            failed = Some(e);
                        }
                        black_box(&out);
                    };
                    let copy = || {
                        pool.install(|| {
                            out2.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(|(o, i)| o.copy_from_slice(i))
                        });
                        black_box(&out2);
                    };
                    let (a, b, r) = time_pair(run, copy, reps);
                    (a, b, r, "copy", 8.0 * len as f64)
                };
                if let Some(e) = failed {
                    return Err(e.into());
                }
                let (gbs, peer_gbs) = (bytes / t_op / 1e9, peer_bytes / t_peer / 1e9);
                let ratio = pair_ratio * bytes / peer_bytes;
                println!(
                    "{:<12} {:>9.1} {:>9} {:>9.1} {:>7.2} {:>7.2}",
                    op.name(),
                    gbs,
                    peer,
                    peer_gbs,
                    gbs / peer_gbs,
                    ratio
                );
            }
        }
    }
    Ok(())
}

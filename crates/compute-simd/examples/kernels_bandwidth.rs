//! Memory-bound kernels against the machine's own bandwidth, measured in the
//! same run: every op is timed interleaved with its peer (copy =
//! `out.copy_from_slice(x)` split over the threads, or a pure streaming read
//! for reductions) and the ratio of achieved bandwidths (bytes read + written,
//! from `Op::cost`) is printed with the medians.
//!
//! ```text
//! cargo run --release -p compute-simd --example kernels_bandwidth -- [len_millions] [reps] [isa...]
//! ```

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use compute_core::{Backend, BinaryOp, GeluForm, Op, ReduceOp, RowOp, UnaryOp};
use compute_simd::{Isa, SimdBackend};
use rayon::prelude::*;

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `a` and `b` alternately `reps` times (after one warm-up each) and
/// returns their median seconds.
fn time_pair(mut a: impl FnMut(), mut b: impl FnMut(), reps: usize) -> (f64, f64) {
    a();
    b();
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..reps {
        let one = |f: &mut dyn FnMut(), t: &mut Vec<f64>| {
            let start = Instant::now();
            f();
            t.push(start.elapsed().as_secs_f64());
        };
        if i % 2 == 0 {
            one(&mut a, &mut ta);
            one(&mut b, &mut tb);
        } else {
            one(&mut b, &mut tb);
            one(&mut a, &mut ta);
        }
    }
    (median(ta), median(tb))
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let len = args.first().and_then(|s| s.parse::<usize>().ok()).unwrap_or(16) << 20;
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
        Op::Reduce { op: ReduceOp::Sum, len },
        Op::Dot { len },
        Op::Reduce { op: ReduceOp::Max, len },
    ];
    println!("len = {len} f32, {reps} interleaved pairs per row, medians");
    for &isa in &isas {
        for threads in [1, 2] {
            let backend = SimdBackend::with_threads(threads)?.with_isa(isa)?;
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
            let chunk = len.div_ceil(threads);
            println!("\n{} ({threads} thread{})", backend.device_name(), if threads > 1 { "s" } else { "" });
            println!("{:<12} {:>9} {:>9} {:>9} {:>7}", "op", "GB/s", "peer", "peer GB/s", "ratio");
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
                let (t_op, t_peer, peer, peer_bytes) = if reduction {
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
                    let (a, b) = time_pair(run, read, reps);
                    (a, b, "read", 4.0 * len as f64)
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
                    let (a, b) = time_pair(run, copy, reps);
                    (a, b, "copy", 8.0 * len as f64)
                };
                if let Some(e) = failed {
                    return Err(e.into());
                }
                let (gbs, peer_gbs) = (bytes / t_op / 1e9, peer_bytes / t_peer / 1e9);
                println!("{:<12} {:>9.1} {:>9} {:>9.1} {:>7.2}", op.name(), gbs, peer, peer_gbs, gbs / peer_gbs);
            }
        }
    }
    Ok(())
}

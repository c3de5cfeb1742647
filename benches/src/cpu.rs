//! CPU rows: our SIMD backend against faer, `gemm` (x86-v4) and `matrixmultiply`
//! for sgemm, against the machine's own copy / read bandwidth for the
//! memory-bound ops, and (`cpu_attention`) attention against our own sgemm.
//! Every pair is timed interleaved in this process.

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::time::Duration;

use compute_core::{Backend, BinaryOp, GeluForm, Op, ReduceOp, RowOp, UnaryOp};
use compute_simd::SimdBackend;
use rayon::prelude::*;

use crate::report::{Record, random, time_pair};

/// Options of the CPU section.
pub struct CpuOpts {
    /// Thread counts to run (e.g. `[1, 2]`).
    pub threads: Vec<usize>,
    /// Smaller sizes and budgets.
    pub quick: bool,
    /// `--filter`: row groups none of whose ops can contain it are not run.
    pub filter: Option<String>,
}

/// Runs every CPU row.
pub fn rows(opts: &CpuOpts) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    let filter = opts.filter.as_deref();
    // Only the attention rows' op contains "attention": a filter with it skips the others.
    let others = filter.is_none_or(|f| !f.contains("attention"));
    let attention = filter.is_none_or(|f| "attention".contains(f));
    for &t in &opts.threads {
        let backend = SimdBackend::with_threads(t).map_err(|e| e.to_string())?;
        let pool = rayon::ThreadPoolBuilder::new().num_threads(t).build().map_err(|e| e.to_string())?;
        // A group runs when the filter can match one of its ops' names.
        let group = |names: &[&str]| filter.is_none_or(|f| names.iter().any(|n| n.contains(f)));
        if others {
            if group(&["sgemm"]) {
                out.extend(sgemm_rows(&backend, &pool, t, opts.quick)?);
            }
            out.extend(memory_rows(&backend, &pool, t, opts.quick, filter)?);
            out.extend(crate::cpu_half::rows(&backend, &pool, t, opts.quick, filter)?);
            if group(&["matmul q4_k", "matmul q5_k", "matmul q6_k", "matmul q8_0"]) {
                out.extend(crate::cpu_quant::rows(&backend, &pool, t, opts.quick)?);
            }
        }
        if attention {
            out.extend(crate::cpu_attention::rows(&backend, t, opts.quick)?);
        }
    }
    Ok(out)
}

fn base(op: &str, shape: String, backend: &SimdBackend, threads: usize, median_s: f64) -> Record {
    Record {
        op: op.into(),
        shape,
        backend: "simd".into(),
        device: backend.device_name(),
        threads,
        placement: "host".into(),
        median_s,
        ..Record::default()
    }
}

fn sgemm_rows(backend: &SimdBackend, pool: &rayon::ThreadPool, t: usize, quick: bool) -> Result<Vec<Record>, String> {
    let sizes: &[usize] = if quick { &[256, 512, 1024] } else { &[256, 512, 1024, 2048, 4096] };
    let mut rows = Vec::new();
    for &n in sizes {
        let a = random(n * n, 1);
        let b = random(n * n, 2);
        let mut c = vec![f32::NAN; n * n];
        let mut c2 = vec![f32::NAN; n * n];
        let op = Op::matmul(n, n, n);
        let flops = op.cost().flops as f64;
        let budget = Duration::from_millis(if quick {
            300
        } else if n >= 2048 {
            2500
        } else {
            1200
        });
        let reps = if n >= 4096 { 3 } else { 5 };
        let peers: &[Peer] =
            if t == 1 { &[Peer::Faer, Peer::Gemm, Peer::MatrixMultiply] } else { &[Peer::Faer, Peer::Gemm] };
        for &peer in peers {
            let (m_ours, m_peer) = time_pair(
                || backend.run(&op, &[&a, &b], &mut c).expect("sgemm"),
                || pool.install(|| run_peer(peer, &a, &b, &mut c2, n, t)),
                budget,
                reps,
            );
            let mut r = base("sgemm", format!("{n}x{n}x{n}"), backend, t, m_ours).with_peer(peer.name(), m_peer);
            r.gflops = Some(flops / m_ours / 1e9);
            r.note = Some(format!("{} {:.1} GFLOP/s", peer.name(), flops / m_peer / 1e9));
            rows.push(r);
        }
        // Sanity: our result agrees with the last peer's.
        let max_diff = c.iter().zip(&c2).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        if max_diff.is_nan() || max_diff >= 1e-2 * (n as f32).sqrt() {
            return Err(format!("sgemm {n}: result differs from peer by {max_diff}"));
        }
    }
    Ok(rows)
}

/// A CPU SGEMM peer.
#[derive(Clone, Copy)]
enum Peer {
    Faer,
    Gemm,
    MatrixMultiply,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Faer => "faer",
            Peer::Gemm => "gemm",
            Peer::MatrixMultiply => "matrixmultiply",
        }
    }
}

/// `c = a·b` (row-major n×n) with a peer library on `t` threads of the current pool.
/// matrixmultiply is built without its threading feature: it only runs single-threaded rows.
fn run_peer(peer: Peer, a: &[f32], b: &[f32], c: &mut [f32], n: usize, t: usize) {
    assert!(a.len() >= n * n && b.len() >= n * n && c.len() >= n * n);
    let s = n as isize;
    match peer {
        Peer::Faer => {
            let par = match NonZeroUsize::new(t) {
                Some(t) if t.get() > 1 => faer::Par::Rayon(t),
                _ => faer::Par::Seq,
            };
            let lhs = faer::MatRef::from_row_major_slice(a, n, n);
            let rhs = faer::MatRef::from_row_major_slice(b, n, n);
            let dst = faer::MatMut::from_row_major_slice_mut(c, n, n);
            faer::linalg::matmul::matmul(dst, faer::Accum::Replace, lhs, rhs, 1.0f32, par);
        }
        Peer::Gemm => gemm_crate(a, b, c, n, t, 0.0f32, 1.0f32),
        Peer::MatrixMultiply => {
            // SAFETY: as above.
            unsafe {
                matrixmultiply::sgemm(n, n, n, 1.0, a.as_ptr(), s, 1, b.as_ptr(), s, 1, 0.0, c.as_mut_ptr(), s, 1)
            }
        }
    }
}

/// `c = a·b` (row-major n×n) with the `gemm` crate on `t` threads, for any
/// element type it supports (`f32`, and `f16` for the half-precision rows).
pub(crate) fn gemm_crate<T: 'static + Copy>(a: &[T], b: &[T], c: &mut [T], n: usize, t: usize, zero: T, one: T) {
    assert!(a.len() >= n * n && b.len() >= n * n && c.len() >= n * n);
    let s = n as isize;
    let par = if t == 1 { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(t) };
    // SAFETY: the three buffers hold n·n values (asserted above); strides describe
    // row-major n×n. `zero` scales the (unread) destination, `one` the product.
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            c.as_mut_ptr(),
            1,
            s,
            false,
            a.as_ptr(),
            1,
            s,
            b.as_ptr(),
            1,
            s,
            zero,
            one,
            false,
            false,
            false,
            par,
        )
    }
}

/// Streaming ops against a parallel copy, then reductions against a parallel
/// read; with `filter`, only the ops whose names contain it.
fn memory_rows(
    backend: &SimdBackend,
    pool: &rayon::ThreadPool,
    t: usize,
    quick: bool,
    filter: Option<&str>,
) -> Result<Vec<Record>, String> {
    let wanted = |name: &str| filter.is_none_or(|f| name.contains(f));
    let len = if quick { 4 << 20 } else { 16 << 20 };
    let label = format!("{}M", len >> 20);
    let budget = Duration::from_millis(if quick { 200 } else { 700 });
    let x = random(len, 3);
    let y = random(len, 4);
    let mut out = vec![f32::NAN; len];
    let mut out2 = vec![f32::NAN; len];
    let chunk = len.div_ceil(t);
    let mut copy =
        || pool.install(|| out2.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(|(o, i)| o.copy_from_slice(i)));
    let mut rows = Vec::new();
    let bytes_copy = 8.0 * len as f64;
    let streaming: Vec<Op> = vec![
        Op::unary(UnaryOp::Relu, len),
        Op::binary(BinaryOp::Add, len),
        Op::unary(UnaryOp::Scale { s: 1.5 }, len),
        Op::unary(UnaryOp::Sigmoid, len),
        Op::unary(UnaryOp::Tanh, len),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), len),
        Op::unary(UnaryOp::Gelu(GeluForm::Erf), len),
        Op::unary(UnaryOp::Swish, len),
        Op::rows(RowOp::Softmax, len / 4096, 4096),
        Op::rows(RowOp::LayerNorm { eps: 1e-5 }, len / 4096, 4096),
    ];
    let gamma = random(4096, 5);
    let beta = random(4096, 6);
    for op in streaming.into_iter().filter(|op| wanted(op.name())) {
        let inputs: Vec<&[f32]> = match op {
            Op::Binary { .. } => vec![&x, &y],
            Op::Rows { op: RowOp::LayerNorm { .. }, .. } => vec![&x, &gamma, &beta],
            _ => vec![&x],
        };
        let (m, m_copy) = time_pair(|| backend.run(&op, &inputs, &mut out).expect("op"), &mut copy, budget, 5);
        let bytes = op.cost().bytes() as f64;
        let mut r = base(op.name(), label.clone(), backend, t, m);
        r.gbps = Some(bytes / m / 1e9);
        r.peer = Some("copy".into());
        r.peer_median_s = Some(m_copy);
        r.ratio = Some((bytes / m) / (bytes_copy / m_copy));
        r.note = Some(format!("copy {:.1} GB/s; ratio = our GB/s / copy GB/s", bytes_copy / m_copy / 1e9));
        rows.push(r);
    }
    // Reductions against a pure streaming read (8 independent accumulators).
    let mut read = || {
        let total = pool.install(|| {
            x.par_chunks(chunk)
                .map(|c| {
                    let mut acc = [0.0f32; 16];
                    for v in black_box(c).chunks_exact(16) {
                        for (a, &b) in acc.iter_mut().zip(v) {
                            *a += b;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
                .sum::<f32>()
        });
        black_box(total);
    };
    for op in [Op::reduce(ReduceOp::Sum, len), Op::dot(len), Op::reduce(ReduceOp::Max, len)]
        .into_iter()
        .filter(|op| wanted(op.name()))
    {
        let inputs: Vec<&[f32]> = if matches!(op, Op::Dot { .. }) { vec![&x, &y] } else { vec![&x] };
        let mut o = [0.0f32];
        let (m, m_read) = time_pair(|| backend.run(&op, &inputs, &mut o).expect("op"), &mut read, budget, 5);
        let bytes = op.cost().bytes() as f64;
        let read_bytes = 4.0 * len as f64;
        let mut r = base(op.name(), label.clone(), backend, t, m);
        r.gbps = Some(bytes / m / 1e9);
        r.peer = Some("read".into());
        r.peer_median_s = Some(m_read);
        r.ratio = Some((bytes / m) / (read_bytes / m_read));
        r.note = Some(format!("read {:.1} GB/s; ratio = our GB/s / read GB/s", read_bytes / m_read / 1e9));
        rows.push(r);
    }
    Ok(rows)
}

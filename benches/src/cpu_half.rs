//! CPU rows for `f16` and `bf16` data: element-wise ops, row ops and casts
//! against a copy of the same number of bytes, GEMM against our own `f32`
//! GEMM and the `gemm` crate's `f16` GEMM, and a bf16 GEMV (one row times a
//! weight stored `n × k`) against our `f32` GEMV. Every pair is timed
//! interleaved in this process.

use std::cell::RefCell;
use std::time::Duration;

use compute_core::{Backend, BinaryOp, DType, GeluForm, HostSlice, HostVec, MatmulSpec, Op, RowOp, UnaryOp};
use compute_simd::SimdBackend;
use rayon::prelude::*;

use crate::cpu::gemm_crate;
use crate::report::{Record, random, time_pair};

/// Every half-precision row on `t` threads.
pub fn rows(
    backend: &SimdBackend,
    pool: &rayon::ThreadPool,
    t: usize,
    quick: bool,
    filter: Option<&str>,
) -> Result<Vec<Record>, String> {
    let mut rows = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        rows.extend(memory_rows(backend, pool, t, quick, dtype, filter)?);
    }
    if filter.is_none_or(|f| "matmul".contains(f)) {
        rows.extend(gemm_rows(backend, pool, t, quick)?);
    }
    Ok(rows)
}

fn base(op: &Op, shape: String, backend: &SimdBackend, threads: usize, median_s: f64) -> Record {
    Record {
        op: op.name().into(),
        shape,
        backend: "simd".into(),
        device: backend.device_name(),
        threads,
        placement: "host".into(),
        median_s,
        ..Record::default()
    }
}

/// Streaming ops on `dtype` against a parallel copy of `len` values of it;
/// with `filter`, only the ops whose names contain it.
fn memory_rows(
    backend: &SimdBackend,
    pool: &rayon::ThreadPool,
    t: usize,
    quick: bool,
    dtype: DType,
    filter: Option<&str>,
) -> Result<Vec<Record>, String> {
    let wanted = |name: &str| filter.is_none_or(|f| name.contains(f));
    let len = if quick { 4 << 20 } else { 16 << 20 };
    let budget = Duration::from_millis(if quick { 200 } else { 700 });
    let xf = random(len, 3);
    let x = HostVec::from_f32(dtype, &xf);
    let y = HostVec::from_f32(dtype, &random(len, 4));
    let gamma = HostVec::from_f32(dtype, &random(4096, 5));
    let beta = HostVec::from_f32(dtype, &random(4096, 6));
    let out = RefCell::new(HostVec::zeros(dtype, len));
    let mut out_f32 = HostVec::zeros(DType::F32, len);
    // The peer: copy the `len` 2-byte values of `x` into `out`, on the same
    // threads: the op's own input and output, so that both run on the same
    // pages (separate buffers put the copy's ratio at the mercy of where
    // each one's pages landed: on the 2-core VM one run's relu ran at 0.70×
    // such a copy and the next at 1.07×).
    let src = x.as_slice().as_bytes();
    let chunk = (2 * len).div_ceil(t);
    let copy = || {
        let mut o = out.borrow_mut();
        let mut view = o.as_mut();
        let dst = view.as_bytes_mut();
        pool.install(|| dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(o, i)| o.copy_from_slice(i)))
    };
    let copy_bytes = 4.0 * len as f64;
    let ops = [
        Op::unary(UnaryOp::Relu, len),
        Op::binary(BinaryOp::Add, len),
        Op::unary(UnaryOp::Scale { s: 1.5 }, len),
        Op::unary(UnaryOp::Sigmoid, len),
        Op::unary(UnaryOp::Tanh, len),
        Op::unary(UnaryOp::Elu { alpha: 1.0 }, len),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), len),
        Op::unary(UnaryOp::Gelu(GeluForm::Erf), len),
        Op::unary(UnaryOp::Swish, len),
        Op::rows(RowOp::Softmax, len / 4096, 4096),
        Op::rows(RowOp::RmsNorm { eps: 1e-6 }, len / 4096, 4096),
        Op::rows(RowOp::LayerNorm { eps: 1e-5 }, len / 4096, 4096),
    ]
    .map(|op| op.with_dtype(dtype));
    let mut rows = Vec::new();
    let label = format!("{}M {dtype}", len >> 20);
    for op in ops.into_iter().filter(|op| wanted(op.name())) {
        let inputs: Vec<HostSlice<'_>> = match op {
            Op::Binary { .. } => vec![x.as_slice(), y.as_slice()],
            Op::Rows { op: RowOp::LayerNorm { .. }, .. } => vec![x.as_slice(), gamma.as_slice(), beta.as_slice()],
            Op::Rows { op: RowOp::RmsNorm { .. }, .. } => vec![x.as_slice(), gamma.as_slice()],
            _ => vec![x.as_slice()],
        };
        let (m, m_copy) =
            time_pair(|| backend.run_typed(&op, &inputs, out.borrow_mut().as_mut()).expect("op"), &copy, budget, 5);
        rows.push(bandwidth_row(&op, label.clone(), backend, t, m, m_copy, copy_bytes));
    }
    // Casts: f32 → dtype and back.
    if !wanted("cast") {
        return Ok(rows);
    }
    let wide = HostVec::F32(xf);
    let to = Op::cast(len, DType::F32, dtype);
    let (m, m_copy) = time_pair(
        || backend.run_typed(&to, &[wide.as_slice()], out.borrow_mut().as_mut()).expect("cast"),
        &copy,
        budget,
        5,
    );
    rows.push(bandwidth_row(&to, format!("{}M f32→{dtype}", len >> 20), backend, t, m, m_copy, copy_bytes));
    let from = Op::cast(len, dtype, DType::F32);
    let (m, m_copy) =
        time_pair(|| backend.run_typed(&from, &[x.as_slice()], out_f32.as_mut()).expect("cast"), &copy, budget, 5);
    rows.push(bandwidth_row(&from, format!("{}M {dtype}→f32", len >> 20), backend, t, m, m_copy, copy_bytes));
    Ok(rows)
}

fn bandwidth_row(
    op: &Op,
    shape: String,
    backend: &SimdBackend,
    t: usize,
    m: f64,
    m_copy: f64,
    copy_bytes: f64,
) -> Record {
    let bytes = op.cost().bytes() as f64;
    let mut r = base(op, shape, backend, t, m);
    r.gbps = Some(bytes / m / 1e9);
    r.peer = Some("copy".into());
    r.peer_median_s = Some(m_copy);
    r.ratio = Some((bytes / m) / (copy_bytes / m_copy));
    r.note = Some(format!("copy of 2-byte values {:.1} GB/s; ratio = our GB/s / copy GB/s", copy_bytes / m_copy / 1e9));
    r
}

/// bf16 and f16 GEMM (f32 accumulation, output in the same dtype) against our
/// f32 GEMM on the same values and the `gemm` crate's f16 GEMM.
fn gemm_rows(backend: &SimdBackend, pool: &rayon::ThreadPool, t: usize, quick: bool) -> Result<Vec<Record>, String> {
    let sizes: &[usize] = if quick { &[512, 1024] } else { &[1024, 2048] };
    let mut rows = Vec::new();
    for &n in sizes {
        let budget = Duration::from_millis(if quick { 300 } else { 2000 });
        let (af, bf) = (random(n * n, 1), random(n * n, 2));
        let f32_op = Op::matmul(n, n, n);
        let flops = f32_op.cost().flops as f64;
        let mut c32 = vec![0.0f32; n * n];
        let ga: Vec<gemm::f16> = af.iter().map(|&v| gemm::f16::from_f32(v)).collect();
        let gb: Vec<gemm::f16> = bf.iter().map(|&v| gemm::f16::from_f32(v)).collect();
        let mut gc = vec![gemm::f16::ZERO; n * n];
        for dtype in [DType::BF16, DType::F16] {
            let (a, b) = (HostVec::from_f32(dtype, &af), HostVec::from_f32(dtype, &bf));
            let mut c = HostVec::zeros(dtype, n * n);
            let op = Op::Matmul(MatmulSpec::new(n, n, n).with_dtypes(dtype, dtype));
            let mut ours = || backend.run_typed(&op, &[a.as_slice(), b.as_slice()], c.as_mut()).expect("matmul");
            let (m, m_f32) =
                time_pair(&mut ours, || backend.run(&f32_op, &[&af, &bf], &mut c32).expect("sgemm"), budget, 3);
            let mut r = base(&op, format!("{n}x{n}x{n} {dtype}"), backend, t, m).with_peer("simd f32", m_f32);
            r.gflops = Some(flops / m / 1e9);
            r.note = Some(format!("our f32 GEMM {:.1} GFLOP/s; ratio = f32 time / {dtype} time", flops / m_f32 / 1e9));
            rows.push(r);
            let (m, m_gemm) = time_pair(
                &mut ours,
                || pool.install(|| gemm_crate(&ga, &gb, &mut gc, n, t, gemm::f16::ZERO, gemm::f16::ONE)),
                budget,
                3,
            );
            let mut r = base(&op, format!("{n}x{n}x{n} {dtype}"), backend, t, m).with_peer("gemm f16", m_gemm);
            r.gflops = Some(flops / m / 1e9);
            r.note = Some(format!("gemm crate f16 {:.1} GFLOP/s", flops / m_gemm / 1e9));
            rows.push(r);
            // Sanity: our half result agrees with our f32 result to half precision.
            let got = c.to_f32();
            let worst = got.iter().zip(&c32).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            if worst.is_nan() || worst > 0.05 * (n as f32).sqrt() {
                return Err(format!("{dtype} matmul {n}: differs from the f32 result by {worst}"));
            }
        }
    }
    rows.push(gemv_row(backend, t, quick, true)?);
    rows.push(gemv_row(backend, t, quick, false)?);
    Ok(rows)
}

/// A decoding step's product: one row of bf16 activations times a bf16
/// weight stored `n × k` (`x·Wᵀ`, `trans_b`) or `k × n` (`x·W`), f32
/// output, against our f32 GEMM on the same shape. Memory-bound: the row
/// reports the weight's GB/s as well.
fn gemv_row(backend: &SimdBackend, t: usize, quick: bool, trans_b: bool) -> Result<Record, String> {
    let (k, n) = if quick { (1024, 4096) } else { (4096, 14336) };
    let budget = Duration::from_millis(if quick { 300 } else { 1500 });
    let (af, bf) = (random(k, 7), random(k * n, 8));
    let spec = MatmulSpec { trans_b, ..MatmulSpec::new(1, k, n) };
    let f32_op = Op::Matmul(spec);
    let op = Op::Matmul(spec.with_dtypes(DType::BF16, DType::F32));
    let (a, b) = (HostVec::from_f32(DType::BF16, &af), HostVec::from_f32(DType::BF16, &bf));
    let (mut c, mut c32) = (HostVec::zeros(DType::F32, n), vec![0.0f32; n]);
    let (m, m_f32) = time_pair(
        || backend.run_typed(&op, &[a.as_slice(), b.as_slice()], c.as_mut()).expect("gemv"),
        || backend.run(&f32_op, &[&af, &bf], &mut c32).expect("f32 gemv"),
        budget,
        5,
    );
    let got = c.to_f32();
    let worst = got.iter().zip(&c32).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    if worst.is_nan() || worst > 0.05 * (k as f32).sqrt() {
        return Err(format!("bf16 gemv 1x{k}x{n}: differs from the f32 result by {worst}"));
    }
    let layout = if trans_b { ", Bᵀ" } else { "" };
    let mut r = base(&op, format!("1x{k}x{n} bf16{layout}"), backend, t, m).with_peer("simd f32", m_f32);
    r.gflops = Some(f32_op.cost().flops as f64 / m / 1e9);
    r.gbps = Some(op.cost().bytes() as f64 / m / 1e9);
    r.note = Some(format!("our f32 GEMV {:.3} ms; ratio = f32 time / bf16 time", m_f32 * 1e3));
    Ok(r)
}

//! CPU rows for `Q4_K`, `Q5_K`, `Q6_K` and `Q8_0` weights: GEMV (one activation
//! row, decoding one token) and batches of 16 and 64 rows (prefill) against a
//! streaming read of the weight's bytes on the same threads, and the GEMV
//! against our bf16 GEMV of the same shape (weight stored `n × k` in both).
//! Every pair is timed interleaved in this process. The batches' rate column
//! counts `2·m·k·n` operations (one 8-bit multiply-add is two).
//! Calls cycle through [`COPIES`] copies of the weight, as decoding cycles
//! through a model's layers, so that neither side reads it from a cache
//! that holds one copy whole.
//!
//! The products run on the backend's ISA path, whose kernels
//! (`compute_simd::quantized::kernel_for`: VNNI, AVX2 or scalar) each row's
//! note names; `COMPUTE_SIMD_ISA=avx2` (or `portable`) runs the AVX2 kernels
//! (or the scalar loop) on a CPU that has VNNI.

use std::hint::black_box;
use std::time::Duration;

use compute_core::quant::BlockFormat;
use compute_core::{Backend, DType, HostVec, MatmulSpec, Op};
use compute_simd::SimdBackend;
use compute_simd::quantized::{Q4K_VALUES, Weights, kernel_for, matmul_with};
use rayon::prelude::*;

use crate::report::{Record, random, time_pair};

/// Copies of each weight that successive calls cycle through (about 130 MB
/// of `Q4_K` for the 4096×14336 shape, past a 32 MiB L3).
const COPIES: usize = 4;

/// GEMV, batch-16 and batch-64 rows of every format on `t` threads.
pub fn rows(backend: &SimdBackend, pool: &rayon::ThreadPool, t: usize, quick: bool) -> Result<Vec<Record>, String> {
    let mut rows = Vec::new();
    for format in [Weights::Q4K, Weights::Q5K, Weights::Q6K, Weights::Q8_0] {
        rows.extend(format_rows(format, backend, pool, t, quick)?);
    }
    Ok(rows)
}

fn format_rows(
    format: Weights,
    backend: &SimdBackend,
    pool: &rayon::ThreadPool,
    t: usize,
    quick: bool,
) -> Result<Vec<Record>, String> {
    let name = format.name();
    let isa = backend.isa();
    let kernel = kernel_for(isa).as_str();
    let matmul = |format, x: &[f32], w: &[u8], shape, y: &mut [f32]| matmul_with(isa, format, x, w, shape, y);
    let blocks = match format {
        Weights::Q4K => BlockFormat::Q4K,
        Weights::Q5K => BlockFormat::Q5K,
        Weights::Q6K => BlockFormat::Q6K,
        Weights::Q8_0 => BlockFormat::Q8_0,
    };
    let shapes: &[(usize, usize)] = if quick { &[(1024, 4096)] } else { &[(4096, 14336), (14336, 4096)] };
    let budget = Duration::from_millis(if quick { 300 } else { 1500 });
    let mut rows = Vec::new();
    for &(k, n) in shapes {
        let wf = random(n * k, 11);
        let mut w = vec![0u8; n * k / Q4K_VALUES * format.block_bytes()];
        blocks.quantize(&wf, &mut w).map_err(|e| e.to_string())?;
        let copies = if quick { 1 } else { COPIES };
        let ws: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
        let next = std::cell::Cell::new(0usize);
        let pick = || {
            let i = next.get();
            next.set((i + 1) % copies);
            &ws[i]
        };
        // The peer: a parallel read of the same bytes (8 independent u64 sums per thread).
        let chunk = w.len().div_ceil(t).next_multiple_of(64);
        let read_next = std::cell::Cell::new(0usize);
        let mut read = || {
            let i = read_next.get();
            read_next.set((i + 1) % copies);
            let w = &ws[i];
            let total: u64 = pool.install(|| {
                w.par_chunks(chunk)
                    .map(|c| {
                        let mut acc = [0u64; 8];
                        for v in black_box(c).chunks_exact(64) {
                            for (a, b) in acc.iter_mut().zip(v.chunks_exact(8)) {
                                *a = a.wrapping_add(u64::from_le_bytes(b.try_into().unwrap_or_default()));
                            }
                        }
                        acc.iter().fold(0u64, |s, &a| s.wrapping_add(a))
                    })
                    .reduce(|| 0, u64::wrapping_add)
            });
            black_box(total);
        };
        for m in [1usize, 16, 64] {
            let x = random(m * k, 12);
            let mut y = vec![0.0f32; m * n];
            let mut ours = || {
                let w = pick();
                if let Err(e) = pool.install(|| matmul(format, &x, w, (m, k, n), &mut y)) {
                    panic!("quantized matmul: {e}");
                }
            };
            let (t_ours, t_read) = time_pair(&mut ours, &mut read, budget, 5);
            let bytes = w.len() as f64;
            let mut r = record(name, (m, k, n), backend, t, t_ours, bytes);
            if m > 1 {
                r.gbps = None;
                r.gflops = Some(2.0 * (m * k * n) as f64 / t_ours / 1e9);
            }
            r.peer = Some("read".into());
            r.peer_median_s = Some(t_read);
            r.ratio = Some(t_read / t_ours);
            r.note = Some(format!(
                "{kernel} kernels; weight {:.1} MB, read {:.1} GB/s; ratio = weight GB/s / read GB/s",
                bytes / 1e6,
                bytes / t_read / 1e9
            ));
            rows.push(r);
        }
        // The same GEMV with the weight in bf16 (3.6x or 2.4x the bytes, one copy:
        // larger than the cache already).
        let x = random(k, 12);
        let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(1, k, n) }.with_dtypes(DType::BF16, DType::F32);
        let (xb, wb) = (HostVec::from_f32(DType::BF16, &x), HostVec::from_f32(DType::BF16, &wf));
        let mut yb = HostVec::zeros(DType::F32, n);
        let mut y = vec![0.0f32; n];
        let op = Op::Matmul(spec);
        let (t_ours, t_bf16) = time_pair(
            || {
                let w = pick();
                if let Err(e) = pool.install(|| matmul(format, &x, w, (1, k, n), &mut y)) {
                    panic!("quantized matmul: {e}");
                }
            },
            || {
                pool.install(|| backend.run_typed(&op, &[xb.as_slice(), wb.as_slice()], yb.as_mut()))
                    .expect("bf16 gemv")
            },
            budget,
            5,
        );
        let mut r = record(name, (1, k, n), backend, t, t_ours, w.len() as f64);
        r.peer = Some("simd bf16".into());
        r.peer_median_s = Some(t_bf16);
        r.ratio = Some(t_bf16 / t_ours);
        r.note = Some(format!("{kernel} kernels; ratio = our bf16 GEMV time / {name} GEMV time"));
        rows.push(r);
    }
    Ok(rows)
}

/// A row for the product of `m` activation rows with a `name` weight of
/// `bytes` bytes (`n × k`), which took `median_s`; its rate is the weight's GB/s.
fn record(
    name: &str,
    (m, k, n): (usize, usize, usize),
    backend: &SimdBackend,
    t: usize,
    median_s: f64,
    bytes: f64,
) -> Record {
    Record {
        op: format!("matmul {name}"),
        shape: format!("{m}x{k}x{n} {name}, Bᵀ"),
        backend: "simd".into(),
        device: backend.device_name(),
        threads: t,
        placement: "host".into(),
        median_s,
        gbps: Some(bytes / median_s / 1e9),
        ..Record::default()
    }
}

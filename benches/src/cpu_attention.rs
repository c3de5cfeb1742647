//! CPU attention rows: our fused attention against our own SGEMM, timed
//! interleaved in this process. The goal (issue "Fused attention on every
//! backend"): at `s ≥ 1024`, at least 0.7× the FLOP rate of our SGEMM, in
//! `O(s)` memory. The peer is our SGEMM of 1024×1024×1024 on the same
//! threads; the ratio is attention GFLOP/s over SGEMM GFLOP/s, with the
//! attention's FLOPs `op.cost().flops` (`4·d` per visible query–key pair, so
//! a causal row counts only the pairs under the diagonal).
//!
//! Decoding rows (`attention decode`: one query per head against a long KV
//! cache, grouped-query heads 32:8, head size 128, `f32` and `bf16`) are
//! memory-bound: their rate is the GB/s of keys and values read, beside a
//! plain read of as many bytes by our own `f32` `sum` reduction (of K and V
//! themselves for `f32`; for `bf16`, of two `f32` arrays of the same bytes,
//! since our bf16 sum converts slower than memory reads), same threads,
//! timed interleaved; the ratio is attention GB/s over read GB/s.

use std::time::Duration;

use compute_core::{AttentionSpec, Backend, DType, HostSlice, HostVec, Mask, Op, ReduceOp};
use compute_simd::SimdBackend;

use crate::report::{Record, random, time_pair};

/// Size of the square SGEMM whose FLOP rate the attention rows are compared with.
const SGEMM_N: usize = 1024;

/// Attention of batch 1, 8 heads, `s` queries and keys, head size 64 and
/// 128, no mask and causal, on `t` threads.
pub fn rows(backend: &SimdBackend, t: usize, quick: bool) -> Result<Vec<Record>, String> {
    let seqs: &[usize] = if quick { &[1024] } else { &[1024, 2048, 4096] };
    let n = SGEMM_N;
    let a = random(n * n, 1);
    let b = random(n * n, 2);
    let mut c = vec![f32::NAN; n * n];
    let gemm = Op::matmul(n, n, n);
    let gemm_flops = gemm.cost().flops as f64;
    let mut rows = Vec::new();
    for &s in seqs {
        for d in [64, 128] {
            let base = AttentionSpec::new(1, 8, s, s, d);
            let q = random(8 * s * d, 11);
            let k = random(8 * s * d, 12);
            let v = random(8 * s * d, 13);
            let mut out = vec![f32::NAN; q.len()];
            for mask in [Mask::None, Mask::Causal] {
                let op = Op::Attention(base.with_mask(mask));
                let flops = op.cost().flops as f64;
                let budget = Duration::from_millis(if quick { 300 } else { 1500 });
                let (m, m_gemm) = time_pair(
                    || backend.run(&op, &[&q, &k, &v], &mut out).expect("attention"),
                    || backend.run(&gemm, &[&a, &b], &mut c).expect("sgemm"),
                    budget,
                    3,
                );
                if out.iter().any(|x| !x.is_finite()) {
                    return Err(format!("attention {}: non-finite output", base.shapes()));
                }
                let (rate, gemm_rate) = (flops / m / 1e9, gemm_flops / m_gemm / 1e9);
                let mut r = Record {
                    op: "attention".into(),
                    shape: format!("1x8x{s}x{d}{}", if mask == Mask::None { "" } else { " causal" }),
                    backend: "simd".into(),
                    device: backend.device_name(),
                    threads: t,
                    placement: "host".into(),
                    median_s: m,
                    gflops: Some(rate),
                    peer: Some(format!("simd sgemm {n}³")),
                    peer_median_s: Some(m_gemm),
                    ratio: Some(rate / gemm_rate),
                    ..Record::default()
                };
                r.note = Some(format!(
                    "sgemm {n}x{n}x{n} {gemm_rate:.1} GFLOP/s; ratio = attention GFLOP/s / sgemm GFLOP/s (goal >= 0.7)"
                ));
                rows.push(r);
            }
        }
    }
    rows.extend(decode_rows(backend, t, quick)?);
    Ok(rows)
}

/// Decoding steps: `batch` sequences of one query for each of 32 query heads
/// on 8 key/value heads, against `seq_k` keys of head size 128 (end-aligned
/// causal: the query sees every key), on `f32` and `bf16` data. Each against
/// our `f32` `sum` over the bytes the step must read (K and V themselves
/// for `f32`, two arrays of as many bytes for `bf16`).
fn decode_rows(backend: &SimdBackend, t: usize, quick: bool) -> Result<Vec<Record>, String> {
    let (hq, hkv, d) = (32, 8, 128);
    let shapes: &[(usize, usize)] = if quick { &[(1, 4096)] } else { &[(1, 4096), (16, 4096)] };
    let mut rows = Vec::new();
    for &(batch, sk) in shapes {
        let spec = AttentionSpec::new(batch, hq, 1, sk, d).with_kv_heads(hkv).causal();
        let (q_len, kv_len) = (batch * hq * d, batch * hkv * sk * d);
        let (qf, kf, vf) = (random(q_len, 21), random(kv_len, 22), random(kv_len, 23));
        for dtype in [DType::BF16, DType::F32] {
            let (q, k, v) =
                (HostVec::from_f32(dtype, &qf), HostVec::from_f32(dtype, &kf), HostVec::from_f32(dtype, &vf));
            let mut out = HostVec::zeros(dtype, q_len);
            let op = Op::Attention(spec.with_dtype(dtype));
            let inputs: [HostSlice<'_>; 3] = [q.as_slice(), k.as_slice(), v.as_slice()];
            // The read peer: `f32` arrays of the bytes of K and of V (K and V
            // themselves when they are `f32`).
            let words = kv_len * dtype.size_in_bytes() / 4;
            let own = (dtype != DType::F32).then(|| (random(words, 24), random(words, 25)));
            let (kr, vr): (&[f32], &[f32]) = match (&own, &k, &v) {
                (Some((kr, vr)), _, _) => (kr, vr),
                (None, HostVec::F32(k), HostVec::F32(v)) => (k, v),
                _ => return Err(format!("attention decode {dtype}: no read peer")),
            };
            let sum = Op::reduce(ReduceOp::Sum, words);
            let mut total = [0.0f32];
            let mut read = || {
                backend.run(&sum, &[kr], &mut total).expect("sum of k");
                backend.run(&sum, &[vr], &mut total).expect("sum of v");
            };
            let budget = Duration::from_millis(if quick { 300 } else { 1500 });
            let (m, m_read) =
                time_pair(|| backend.run_typed(&op, &inputs, out.as_mut()).expect("attention"), &mut read, budget, 5);
            if out.to_f32().iter().any(|x| !x.is_finite()) {
                return Err(format!("attention {}: non-finite output", spec.shapes()));
            }
            let bytes = (2 * kv_len * dtype.size_in_bytes()) as f64;
            let (rate, read_rate) = (bytes / m / 1e9, bytes / m_read / 1e9);
            rows.push(Record {
                op: "attention decode".into(),
                shape: format!("{dtype} b{batch} h{hq}:{hkv} 1x{sk} d{d}"),
                backend: "simd".into(),
                device: backend.device_name(),
                threads: t,
                placement: "host".into(),
                median_s: m,
                gbps: Some(rate),
                peer: Some("read".into()),
                peer_median_s: Some(m_read),
                ratio: Some(rate / read_rate),
                note: Some(format!(
                    "K+V {:.1} MB; read = our f32 sum over as many bytes, {read_rate:.1} GB/s; ratio = attention GB/s / read GB/s",
                    bytes / 1e6
                )),
                ..Record::default()
            });
        }
    }
    Ok(rows)
}

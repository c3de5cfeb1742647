//! CPU attention rows: our fused attention against our own SGEMM, timed
//! interleaved in this process. The goal (issue "Fused attention on every
//! backend"): at `s ≥ 1024`, at least 0.7× the FLOP rate of our SGEMM, in
//! `O(s)` memory. The peer is our SGEMM of 1024×1024×1024 on the same
//! threads; the ratio is attention GFLOP/s over SGEMM GFLOP/s, with the
//! attention's FLOPs `op.cost().flops` (`4·d` per visible query–key pair, so
//! a causal row counts only the pairs under the diagonal).

use std::time::Duration;

use compute_core::{AttentionSpec, Backend, Mask, Op};
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
    Ok(rows)
}

//! Tails, heads and ISA agreement of the element-wise kernels.

use super::*;
use crate::kernels::test_data::{pool, uniform};
use compute_core::conformance::{POISON, compare};
use compute_core::{GeluForm, Op};

fn unary_ops() -> Vec<UnaryOp> {
    vec![
        UnaryOp::Relu,
        UnaryOp::LeakyRelu { alpha: 0.01 },
        UnaryOp::Elu { alpha: 1.3 },
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Swish,
        UnaryOp::Gelu(GeluForm::Tanh),
        UnaryOp::Gelu(GeluForm::Erf),
        UnaryOp::Clip { min: -0.75, max: 2.5 },
        UnaryOp::Scale { s: -1.7 },
    ]
}

const BINARY: [BinaryOp; 3] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul];

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Every length 0..=70 at every start offset 0..16 (so the streaming head,
/// the body and the tail all get hit): each element equals, bit for bit, the
/// same element computed inside a long run, and the result is within the
/// conformance tolerance of the float64 reference.
#[test]
fn unary_tails_and_heads_match_the_body_on_every_isa() {
    let x = uniform(86, -6.0, 6.0, 1);
    for isa in Isa::available() {
        for op in unary_ops() {
            let mut full = vec![POISON; x.len()];
            dispatch(isa, Unary { op, x: &x, out: &mut full, stream: false });
            for start in 0..16 {
                for len in 0..=70 {
                    let xs = &x[start..start + len];
                    for stream in [false, true] {
                        let mut out = vec![POISON; len];
                        dispatch(isa, Unary { op, x: xs, out: &mut out, stream });
                        assert_eq!(
                            bits(&out),
                            bits(&full[start..start + len]),
                            "{op:?} on {isa}, start {start}, len {len}, stream {stream}"
                        );
                    }
                }
            }
            for len in 1..=70 {
                let mut out = vec![POISON; len];
                unary(isa, op, &x[..len], &mut out);
                if let Some(msg) = compare(&Op::unary(op, len), &[&x[..len]], &out, 1.0) {
                    panic!("{op:?} on {isa}, len {len}: {msg}");
                }
            }
        }
    }
}

#[test]
fn binary_tails_and_heads_are_exact_on_every_isa() {
    let a = uniform(86, -4.0, 4.0, 2);
    let b = uniform(86, -4.0, 4.0, 3);
    for isa in Isa::available() {
        for op in BINARY {
            for start in 0..16 {
                for len in 0..=70 {
                    let (aa, bb) = (&a[start..start + len], &b[start..start + len]);
                    let want: Vec<f32> = aa
                        .iter()
                        .zip(bb)
                        .map(|(&x, &y)| match op {
                            BinaryOp::Add => x + y,
                            BinaryOp::Sub => x - y,
                            BinaryOp::Mul => x * y,
                            // Not exact: checked against its tolerance by the conformance suite.
                            BinaryOp::SwiGlu => unreachable!("BINARY holds the exact ops"),
                        })
                        .collect();
                    for stream in [false, true] {
                        let mut out = vec![POISON; len];
                        dispatch(isa, Binary { op, a: aa, b: bb, out: &mut out, stream });
                        assert_eq!(bits(&out), bits(&want), "{op:?} on {isa}, start {start}, len {len}");
                    }
                }
            }
        }
    }
}

#[test]
fn cheap_unary_ops_equal_scalar_f32_exactly() {
    let mut x = uniform(300, -5.0, 5.0, 4);
    x[3] = -0.0;
    x[7] = f32::INFINITY;
    x[8] = f32::NEG_INFINITY;
    for isa in Isa::available() {
        type Scalar = fn(f32) -> f32;
        let cases: [(UnaryOp, Scalar); 4] = [
            (UnaryOp::Relu, |v| if v > 0.0 { v } else { 0.0 }),
            (UnaryOp::LeakyRelu { alpha: 0.01 }, |v| if v > 0.0 { v } else { 0.01 * v }),
            (UnaryOp::Clip { min: -0.75, max: 2.5 }, |v| v.clamp(-0.75, 2.5)),
            (UnaryOp::Scale { s: -1.7 }, |v| -1.7 * v),
        ];
        for (op, f) in cases {
            let mut out = vec![POISON; x.len()];
            unary(isa, op, &x, &mut out);
            for (i, (&o, &v)) in out.iter().zip(&x).enumerate() {
                assert_eq!(o, f(v), "{op:?} on {isa} at x[{i}] = {v}");
            }
        }
    }
}

#[test]
fn nan_propagates_through_relu_clip_and_leaky_relu() {
    let x =
        [f32::NAN, 1.0, -1.0, f32::NAN, 3.0, -0.0, 2.0, f32::NAN, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, f32::NAN];
    for isa in Isa::available() {
        for op in [UnaryOp::Relu, UnaryOp::Clip { min: -0.5, max: 0.5 }, UnaryOp::LeakyRelu { alpha: 0.1 }] {
            let mut out = vec![POISON; x.len()];
            unary(isa, op, &x, &mut out);
            for (o, v) in out.iter().zip(&x) {
                assert_eq!(o.is_nan(), v.is_nan(), "{op:?} on {isa}: {v} -> {o}");
                assert_ne!(o.to_bits(), POISON.to_bits());
            }
        }
    }
}

/// AVX-512 and AVX2+FMA run the same algorithm with the same roundings, except
/// the two gelu forms, whose AVX-512 paths take `Φ(−|x|)` and `σ(−2u)` from
/// 32-entry tables (one `vpermt2ps` per lookup; AVX2 has no such instruction
/// and keeps the general formulas; both are checked against float64 in
/// `simd::math::tests`).
#[test]
fn avx512_and_avx2_agree_bit_for_bit() {
    if !(Isa::Avx512.is_supported() && Isa::Avx2.is_supported()) {
        eprintln!("SKIPPED: needs both AVX-512 and AVX2");
        return;
    }
    let mut x = uniform(4099, -30.0, 30.0, 5);
    x.extend(uniform(1000, -120.0, 120.0, 6));
    // Both gelu forms take a table route on AVX-512 only.
    let table_routes = [UnaryOp::Gelu(GeluForm::Erf), UnaryOp::Gelu(GeluForm::Tanh)];
    for op in unary_ops().into_iter().filter(|op| !table_routes.contains(op)) {
        let mut a = vec![POISON; x.len()];
        let mut b = vec![POISON; x.len()];
        unary(Isa::Avx512, op, &x, &mut a);
        unary(Isa::Avx2, op, &x, &mut b);
        assert_eq!(bits(&a), bits(&b), "{op:?}");
    }
}

/// Large outputs (streaming stores, several threads) equal the single-threaded
/// cached-store result.
#[test]
fn streaming_and_parallel_runs_equal_the_plain_run() {
    let n = crate::tuning::STREAM_MIN + 1000;
    let x = uniform(n + 1, -8.0, 8.0, 7);
    let y = uniform(n + 1, -8.0, 8.0, 8);
    // Misaligned by one element, so the streaming head is exercised.
    let (x, y) = (&x[1..], &y[1..]);
    for isa in Isa::available() {
        for op in [UnaryOp::Relu, UnaryOp::Gelu(GeluForm::Erf)] {
            let mut plain = vec![POISON; n];
            dispatch(isa, Unary { op, x, out: &mut plain, stream: false });
            for threads in [1, 2] {
                let mut out = vec![POISON; n];
                pool(threads).install(|| unary(isa, op, x, &mut out));
                assert_eq!(bits(&out), bits(&plain), "{op:?} on {isa}, {threads} threads");
            }
        }
        let mut plain = vec![POISON; n];
        dispatch(isa, Binary { op: BinaryOp::Mul, a: x, b: y, out: &mut plain, stream: false });
        let mut out = vec![POISON; n];
        pool(2).install(|| binary(isa, BinaryOp::Mul, x, y, &mut out));
        assert_eq!(bits(&out), bits(&plain), "mul on {isa}");
    }
}

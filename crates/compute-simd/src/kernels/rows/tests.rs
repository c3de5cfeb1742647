//! Row ops on every ISA: every short row length, hard inputs, threads.

use super::*;
use crate::kernels::test_data::{pool, uniform};
use compute_core::Op;
use compute_core::conformance::{POISON, compare};

const OPS: [RowOp; 4] =
    [RowOp::Softmax, RowOp::LogSoftmax, RowOp::LayerNorm { eps: 1e-5 }, RowOp::RmsNorm { eps: 1e-6 }];

fn check(isa: Isa, op: RowOp, rows: usize, cols: usize, x: &[f32], factor: f64) -> Vec<f32> {
    let gamma = uniform(cols, 0.5, 1.5, 21);
    let beta = uniform(cols, -1.0, 1.0, 22);
    let inputs: Vec<&[f32]> = match op {
        RowOp::Softmax | RowOp::LogSoftmax => vec![x],
        RowOp::LayerNorm { .. } => vec![x, &gamma, &beta],
        RowOp::RmsNorm { .. } => vec![x, &gamma],
    };
    let mut out = vec![POISON; rows * cols];
    run(isa, op, rows, cols, &inputs, &mut out);
    if let Some(msg) = compare(&Op::rows(op, rows, cols), &inputs, &out, factor) {
        panic!("{op:?} on {isa} {rows}x{cols}: {msg}");
    }
    out
}

#[test]
fn every_row_length_to_70_on_every_isa() {
    for isa in Isa::available() {
        for op in OPS {
            for cols in 1..=70 {
                let rows = 3;
                let x = uniform(rows * cols, -6.0, 6.0, cols as u64);
                check(isa, op, rows, cols, &x, 1.0);
            }
        }
    }
}

#[test]
fn softmax_rows_sum_to_one_even_for_huge_and_equal_values() {
    let cols = 67;
    let mut x = uniform(3 * cols, -3.0, 3.0, 23);
    x[..cols].fill(7.5);
    for v in &mut x[cols..2 * cols] {
        *v *= 1e4;
    }
    for v in &mut x[2 * cols..] {
        *v -= 1e4;
    }
    for isa in Isa::available() {
        let out = check(isa, RowOp::Softmax, 3, cols, &x, 1.0);
        for row in out.chunks(cols) {
            let s: f64 = row.iter().map(|&v| v as f64).sum();
            assert!((s - 1.0).abs() < 1e-5, "row sums to {s} on {isa}");
        }
        check(isa, RowOp::LogSoftmax, 3, cols, &x, 1.0);
    }
}

#[test]
fn layer_norm_is_accurate_when_the_mean_dwarfs_the_spread() {
    let (rows, cols) = (4, 1000);
    let x: Vec<f32> = uniform(rows * cols, -1.0, 1.0, 24).iter().map(|v| 3000.0 + v).collect();
    for isa in Isa::available() {
        let out = check(isa, RowOp::LayerNorm { eps: 1e-5 }, rows, cols, &x, 1.0);
        assert!(out.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn nan_poisons_only_its_own_row() {
    let (rows, cols) = (3, 40);
    let mut x = uniform(rows * cols, -2.0, 2.0, 25);
    x[cols + 7] = f32::NAN;
    for isa in Isa::available() {
        for op in [RowOp::Softmax, RowOp::LogSoftmax] {
            let mut out = vec![POISON; rows * cols];
            run(isa, op, rows, cols, &[&x], &mut out);
            assert!(out[cols..2 * cols].iter().all(|v| v.is_nan()), "{op:?} on {isa}");
            assert!(out[..cols].iter().chain(&out[2 * cols..]).all(|v| v.is_finite()), "{op:?} on {isa}");
        }
    }
}

#[test]
fn large_inputs_are_the_same_on_one_and_two_threads() {
    for (rows, cols) in [(300, 4097), (2, 65_537), (70_000, 17)] {
        let x = uniform(rows * cols, -6.0, 6.0, 26);
        for isa in Isa::available() {
            for op in OPS {
                let one = pool(1).install(|| check(isa, op, rows, cols, &x, 1.0));
                let two = pool(2).install(|| check(isa, op, rows, cols, &x, 1.0));
                assert!(one.iter().zip(&two).all(|(a, b)| a.to_bits() == b.to_bits()), "{op:?} on {isa}");
            }
        }
    }
}

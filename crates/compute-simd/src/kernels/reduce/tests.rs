//! Tails, NaN propagation and thread-count independence of the reductions.

use super::*;
use crate::kernels::test_data::{pool, uniform};
use compute_core::Op;
use compute_core::conformance::compare;

fn within_tolerance(op: Op, inputs: &[&[f32]], got: f32) {
    if let Some(msg) = compare(&op, inputs, &[got], 1.0) {
        panic!("{} {}: {msg}", op.name(), op.shapes());
    }
}

#[test]
fn every_length_to_70_and_odd_sizes_on_every_isa() {
    let a = uniform(70_000, -3.0, 5.0, 11);
    let b = uniform(70_000, -4.0, 4.0, 12);
    let lens: Vec<usize> = (0..=70).chain([127, 1000, 1023, 1024, 1025, 4097, 65_537, 70_000]).collect();
    for isa in Isa::available() {
        for &n in &lens {
            let (x, y) = (&a[..n], &b[..n]);
            let s = sum(isa, x);
            let d = dot(isa, x, y);
            let m = max(isa, x);
            let want_max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(m, want_max, "max on {isa}, len {n}");
            if n == 0 {
                assert_eq!((s, d), (0.0, 0.0), "empty sum/dot on {isa}");
                continue;
            }
            within_tolerance(Op::reduce(compute_core::ReduceOp::Sum, n), &[x], s);
            within_tolerance(Op::dot(n), &[x, y], d);
        }
    }
}

#[test]
fn nan_at_any_position_propagates() {
    let base = uniform(70, -3.0, 3.0, 13);
    for isa in Isa::available() {
        for len in 1..=70 {
            for pos in [0, len / 2, len - 1] {
                let mut x = base[..len].to_vec();
                x[pos] = f32::NAN;
                assert!(max(isa, &x).is_nan(), "max on {isa}, len {len}, NaN at {pos}");
                assert!(sum(isa, &x).is_nan(), "sum on {isa}, len {len}, NaN at {pos}");
                assert!(dot(isa, &x, &base[..len]).is_nan(), "dot on {isa}, len {len}, NaN at {pos}");
            }
        }
        // −0 and infinities.
        let mut x = uniform(100, -3.0, -1.0, 14);
        x[50] = -0.0;
        assert_eq!(max(isa, &x), 0.0);
        x[10] = f32::INFINITY;
        assert_eq!(max(isa, &x), f32::INFINITY);
        assert_eq!(sum(isa, &x), f32::INFINITY);
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let n = PAR_REDUCE_MIN * 3 + 12_345;
    let x = uniform(n, -3.0, 5.0, 15);
    let y = uniform(n, -4.0, 4.0, 16);
    for isa in Isa::available() {
        let one = pool(1).install(|| (sum(isa, &x), dot(isa, &x, &y), max(isa, &x)));
        let two = pool(2).install(|| (sum(isa, &x), dot(isa, &x, &y), max(isa, &x)));
        assert_eq!(one.0.to_bits(), two.0.to_bits(), "sum on {isa}");
        assert_eq!(one.1.to_bits(), two.1.to_bits(), "dot on {isa}");
        assert_eq!(one.2, two.2, "max on {isa}");
        within_tolerance(Op::reduce(compute_core::ReduceOp::Sum, n), &[&x], one.0);
        within_tolerance(Op::dot(n), &[&x, &y], one.1);
    }
}

//! conv2d against the float64 reference over strides, paddings and kernel
//! shapes, including the no-unfold 1×1 path and padding wider than the kernel.

use super::*;
use crate::kernels::test_data::{pool, uniform};
use compute_core::Op;
use compute_core::conformance::{POISON, compare};

#[allow(clippy::too_many_arguments)]
fn spec(
    n: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    kh: usize,
    kw: usize,
    stride: (usize, usize),
    padding: (usize, usize),
) -> Conv2dSpec {
    Conv2dSpec { n, c_in, h, w, c_out, kh, kw, stride, padding, dtype: compute_core::DType::F32 }
}

fn check(isa: Isa, c: Conv2dSpec) {
    let op = Op::Conv2d(c);
    let layout = match op.layout() {
        Ok(l) => l,
        Err(e) => panic!("{c:?}: {e}"),
    };
    let x = uniform(layout.inputs()[0].len, -1.0, 1.0, 31);
    let w = uniform(layout.inputs()[1].len, -1.0, 1.0, 32);
    let mut out = vec![POISON; layout.output_len()];
    conv2d(isa, &c, &x, &w, &mut out);
    if let Some(msg) = compare(&op, &[&x, &w], &out, 1.0) {
        panic!("{c:?} on {isa}: {msg}");
    }
}

#[test]
fn strides_paddings_and_kernel_shapes() {
    let cases = [
        spec(1, 1, 5, 5, 1, 3, 3, (1, 1), (0, 0)),
        spec(2, 3, 17, 13, 4, 3, 3, (1, 1), (1, 1)),
        spec(1, 8, 16, 16, 16, 1, 1, (1, 1), (0, 0)),
        spec(2, 5, 7, 9, 3, 1, 1, (1, 1), (0, 0)),
        spec(1, 3, 9, 9, 2, 1, 1, (2, 2), (0, 0)),
        spec(1, 2, 6, 6, 2, 1, 1, (1, 1), (1, 1)),
        spec(3, 4, 15, 20, 5, 5, 3, (2, 1), (2, 0)),
        spec(1, 2, 9, 9, 3, 4, 4, (3, 3), (1, 2)),
        spec(1, 2, 3, 4, 2, 2, 2, (1, 1), (3, 3)),
        spec(2, 3, 5, 6, 2, 3, 2, (2, 3), (2, 1)),
        spec(1, 1, 1, 1, 1, 1, 1, (1, 1), (0, 0)),
        spec(1, 1, 4, 4, 1, 4, 4, (1, 1), (0, 0)),
    ];
    for isa in Isa::available() {
        for c in cases {
            check(isa, c);
        }
    }
}

#[test]
fn many_blocks_in_parallel() {
    // 40² and 38×24 output pixels of 144 and 75 values each: several blocks
    // of CONV_BLOCK values, the last one partial, some spanning output rows.
    for c in [spec(2, 16, 40, 40, 8, 3, 3, (1, 1), (1, 1)), spec(1, 3, 75, 47, 5, 5, 5, (2, 2), (2, 2))] {
        for threads in [1, 2, 3] {
            pool(threads).install(|| check(crate::isa::Isa::detect(), c));
        }
    }
}

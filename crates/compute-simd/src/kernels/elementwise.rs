//! Element-wise unary and binary ops.
use crate::isa::Isa;
use compute_core::{BinaryOp, UnaryOp, reference};

/// `out[i] = op(x[i])`. Lengths are validated by the caller.
pub fn unary(_isa: Isa, op: UnaryOp, x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = reference::unary(op, v as f64) as f32;
    }
}

/// `out[i] = a[i] op b[i]`. Lengths are validated by the caller.
pub fn binary(_isa: Isa, op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
        };
    }
}

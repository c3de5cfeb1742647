//! Row-wise ops: softmax, log_softmax, layer_norm, rms_norm.
use crate::isa::Isa;
use compute_core::{Op, RowOp, reference};

/// Runs a row op on `x` (`rows × cols`) with its parameter vectors.
pub fn run(_isa: Isa, op: RowOp, rows: usize, cols: usize, inputs: &[&[f32]], out: &mut [f32]) {
    if let Ok(r) = reference::run(&Op::rows(op, rows, cols), inputs) {
        for (o, v) in out.iter_mut().zip(r.values) {
            *o = v as f32;
        }
    }
}

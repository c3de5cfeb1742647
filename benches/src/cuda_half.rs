//! Bench rows for `f16`/`bf16` on the CUDA backend, each against a
//! device-to-device copy of the same bytes in the same process: element-wise
//! ops, rms_norm and softmax over 256M values, and the casts between `f32` and
//! `bf16`. The half GEMM rows, against cuBLAS, are in [`crate::cuda_mma`].
//! PyTorch's figures for the same ops come from `benches/torch_half.py`, run
//! beside this binary by `.gpu/run.sh bench`.

use std::time::Duration;

use compute_core::{Backend, BinaryOp, DType, Op, RowOp, Tensor, UnaryOp};
use compute_ptx::CudaBackend;

use crate::cuda::{against_copy, err, random, record};
use crate::report::Record;

/// A device tensor of `n` random `dtype` values (drawn as `f32`, cast on the device).
fn random_typed(be: &CudaBackend, n: usize, dtype: DType, seed: u64) -> Result<Tensor, String> {
    let x = be.upload(&random(n, seed)).map_err(err)?;
    let y = be.alloc_typed(n, dtype).map_err(err)?;
    be.run_tensors(&Op::cast(n, DType::F32, dtype), &[&x], &y).map_err(err)?;
    Ok(y)
}

/// The half rows; `quick` shrinks the sizes (64M values, 16384 rows).
pub fn rows(be: &CudaBackend, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    let n: usize = if quick { 64 << 20 } else { 256 << 20 };
    let label = |d: DType| format!("{}M {d}", n >> 20);
    let gb = |bytes: f64, s: f64| bytes / s / 1e9;
    let mut out = Vec::new();
    // A copy of `bytes` bytes moves them once each way: `bytes / 8` f32 values.
    let copy_of = |bytes: f64| (bytes / 8.0) as usize;

    for dtype in [DType::BF16, DType::F16] {
        let x = random_typed(be, n, dtype, 51)?;
        let y = random_typed(be, n, dtype, 53)?;
        let z = be.alloc_typed(n, dtype).map_err(err)?;
        let h = dtype.size_in_bytes() as f64;
        let unary = [("relu", UnaryOp::Relu), ("gelu_tanh", UnaryOp::Gelu(compute_core::GeluForm::Tanh))];
        for (name, u) in unary {
            let op = Op::unary(u, n).with_dtype(dtype);
            let bytes = 2.0 * h * n as f64;
            let (ours, copy) = against_copy(be, copy_of(bytes), budget, || be.run_tensors(&op, &[&x], &z))?;
            let mut r = record(name, label(dtype), device, "resident", ours).with_peer("copy", copy);
            r.gbps = Some(gb(bytes, ours));
            r.note = Some("peer copies the same bytes (r+w); goal >= 0.9x copy".into());
            out.push(r);
        }
        let add = Op::binary(BinaryOp::Add, n).with_dtype(dtype);
        let bytes = 3.0 * h * n as f64;
        let (ours, copy) = against_copy(be, copy_of(bytes), budget, || be.run_tensors(&add, &[&x, &y], &z))?;
        let mut r = record("add", label(dtype), device, "resident", ours).with_peer("copy", copy);
        r.gbps = Some(gb(bytes, ours));
        r.note = Some("peer copies the same bytes (2 read, 1 written); goal >= 0.9x copy".into());
        out.push(r);

        let (rr, cc) = (n / 4096, 4096);
        let gamma = random_typed(be, cc, dtype, 57)?;
        for (name, row) in [("rms_norm", RowOp::RmsNorm { eps: 1e-5 }), ("softmax", RowOp::Softmax)] {
            let op = Op::rows(row, rr, cc).with_dtype(dtype);
            let ins: Vec<&Tensor> = if name == "softmax" { vec![&x] } else { vec![&x, &gamma] };
            let bytes = 2.0 * h * n as f64;
            let (ours, copy) = against_copy(be, copy_of(bytes), budget, || be.run_tensors(&op, &ins, &z))?;
            let mut r = record(name, format!("{rr}x{cc} {dtype}"), device, "resident", ours).with_peer("copy", copy);
            r.gbps = Some(gb(bytes, ours));
            r.note = Some("x read once + y written once; peer copies the same bytes".into());
            out.push(r);
        }
    }

    let x32 = be.upload(&random(n, 61)).map_err(err)?;
    let xb = be.alloc_typed(n, DType::BF16).map_err(err)?;
    let back = be.alloc(n).map_err(err)?;
    let bytes = 6.0 * n as f64;
    for (name, op, ins, outp) in [
        ("cast f32>bf16", Op::cast(n, DType::F32, DType::BF16), &x32, &xb),
        ("cast bf16>f32", Op::cast(n, DType::BF16, DType::F32), &xb, &back),
    ] {
        let (ours, copy) = against_copy(be, copy_of(bytes), budget, || be.run_tensors(&op, &[ins], outp))?;
        let mut r = record(name, format!("{}M", n >> 20), device, "resident", ours).with_peer("copy", copy);
        r.gbps = Some(gb(bytes, ours));
        r.note = Some("6 bytes per value; peer copies the same bytes; goal >= 0.9x copy".into());
        out.push(r);
    }

    Ok(out)
}

//! The register row kernels on the device the tests find (lavapipe in CI),
//! at every `vpt`, with both reductions (subgroup operations where the device
//! has them, and workgroup memory), against the conformance suite's
//! reference and tolerances. Without an adapter they print SKIPPED, unless
//! `COMPUTE_REQUIRE` lists `wgpu` or `CI` is set (then they fail).

use std::sync::Arc;

use compute_core::conformance::compare;
use compute_core::rng::Rng;
use compute_core::{DType, HostVec, Op, RowOp};

use super::row_op;
use crate::buffers::Use;
use crate::context::{Context, block_on};
use crate::encode::submit_and_read;
use crate::kernels::rows_register::{MAX_VPT, vpt_for};
use crate::options::DeviceOptions;
use crate::plan::View;

fn device() -> Option<Arc<Context>> {
    match block_on(Context::open(&DeviceOptions::default())) {
        Ok(ctx) => Some(Arc::new(ctx)),
        Err(e) => {
            crate::skip_without_adapter(&e);
            None
        }
    }
}

/// `values` rounded to `dtype` in a storage buffer (padded to 16 bytes), and
/// the rounded values.
fn upload(ctx: &Context, values: &[f32], dtype: DType) -> (View, Vec<f32>) {
    let typed = HostVec::from_f32(dtype, values);
    let mut bytes = typed.as_slice().as_bytes().to_vec();
    bytes.resize(bytes.len().div_ceil(16) * 16, 0);
    let buffer = ctx.cache.take(ctx, Use::Storage, bytes.len() as u64, "test").unwrap();
    ctx.queue.write_buffer(&buffer, 0, &bytes);
    (View { buffer, len: values.len(), dtype }, typed.as_slice().to_f32())
}

/// Rows of random values, with a NaN, a `+∞`, a row of `−∞` and a row of
/// subnormals among them when there are enough rows.
fn rows_of(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    let mut x = rng.vec(rows * cols, -6.0, 6.0);
    if rows >= 4 {
        x[rng.below(cols)] = f32::NAN;
        x[cols + rng.below(cols)] = f32::INFINITY;
        x[2 * cols..3 * cols].fill(f32::NEG_INFINITY);
        for v in &mut x[3 * cols..4 * cols] {
            *v *= 1e-39;
        }
    }
    x
}

/// Runs row op `r` on `rows × cols` values of `dtype` through the register
/// kernels (reduced by subgroup operations with `subgroup`) and compares with
/// the reference of the `f32` op on the same (rounded) values.
fn check(ctx: &Arc<Context>, r: RowOp, rows: usize, cols: usize, dtype: DType, subgroup: bool, rng: &mut Rng) {
    let what = format!("{r:?} {rows}x{cols} {dtype} subgroup {subgroup}");
    assert!(vpt_for(cols).is_some(), "{what}: not a register shape");
    let (x, xs) = upload(ctx, &rows_of(rng, rows, cols), dtype);
    let (gamma, gs) = upload(ctx, &rng.vec(cols, 0.5, 1.5), dtype);
    let (beta, bs) = upload(ctx, &rng.vec(cols, -1.0, 1.0), dtype);
    let out = ctx.cache.take(ctx, Use::Storage, (rows * cols * 4) as u64, "test").unwrap();
    let y = View { buffer: out.clone(), len: rows * cols, dtype: DType::F32 };
    let mut steps = Vec::new();
    row_op(ctx, "test", r, rows, cols, [&x, &gamma, &beta], &y, subgroup, &mut steps)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut bytes = vec![0u8; rows * cols * 4];
    submit_and_read(ctx, steps, &out, bytes.len() as u64, "test").unwrap().wait_into_bytes(&mut bytes).unwrap();
    let got: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let inputs: Vec<&[f32]> = match r {
        RowOp::LayerNorm { .. } => vec![&xs, &gs, &bs],
        RowOp::RmsNorm { .. } => vec![&xs, &gs],
        RowOp::Softmax | RowOp::LogSoftmax => vec![&xs],
    };
    if let Some(msg) = compare(&Op::rows(r, rows, cols), &inputs, &got, 1.0) {
        panic!("{what}: {msg}");
    }
}

const OPS: [RowOp; 4] =
    [RowOp::Softmax, RowOp::LogSoftmax, RowOp::LayerNorm { eps: 1e-5 }, RowOp::RmsNorm { eps: 1e-6 }];

#[test]
fn register_kernels_match_the_reference_at_every_width() {
    let Some(ctx) = device() else { return };
    eprintln!("adapter {}: subgroups {}", ctx.report, ctx.subgroups());
    let mut flavours = vec![false];
    if ctx.subgroups() {
        flavours.push(true);
    }
    let mut rng = Rng::new(5);
    // The shortest and longest rows of every vpt, and one between.
    let mut widths = vec![4, 1000];
    for vpt in 1..=MAX_VPT as usize {
        widths.extend([1024 * vpt - 1020, 1024 * vpt]);
    }
    widths.push(4 * 1337);
    for subgroup in flavours {
        for &cols in &widths {
            for r in OPS {
                check(&ctx, r, 6, cols, DType::F32, subgroup, &mut rng);
            }
        }
        for dtype in [DType::F16, DType::BF16] {
            for cols in [12, 4096, 8192] {
                for r in OPS {
                    check(&ctx, r, 5, cols, dtype, subgroup, &mut rng);
                }
            }
        }
    }
}

#[test]
fn register_shapes_are_whole_vec4_rows_up_to_8192() {
    assert_eq!(vpt_for(4), Some(1));
    assert_eq!(vpt_for(1024), Some(1));
    assert_eq!(vpt_for(1028), Some(2));
    assert_eq!(vpt_for(8192), Some(MAX_VPT));
    assert_eq!(vpt_for(8196), None);
    assert_eq!(vpt_for(4097), None);
    assert_eq!(vpt_for(0), None);
}

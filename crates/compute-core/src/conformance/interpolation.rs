//! The interpolation group: lerp and slerp at the sizes of [`super::cases`],
//! then what random data never reaches: the exact ends `t = 0` and `t = 1`,
//! the rows slerp treats apart (zero, parallel, anti-parallel, NaN or
//! infinite elements, huge and tiny magnitudes), IEEE specials in lerp, and
//! the typed errors of a `t` out of range.

use super::{Config, Group, cases, check_op_typed, declined, dtype_variants, poison_bits, poisoned};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::ComputeError;
use crate::host::{HostSlice, HostVec};
use crate::op::Op;
use crate::rng::Rng;

/// Runs the group: every case at every dtype, then the edges on every dtype,
/// then the errors. Returns the failures.
pub(super) fn run(backend: &dyn Backend, rng: &mut Rng, cfg: Config, skipped: &mut Vec<String>) -> Vec<String> {
    let mut fails = Vec::new();
    for op in cases(Group::Interpolation, cfg.scale).iter().flat_map(dtype_variants) {
        if let Some(result) = declined(backend, &op, cfg, rng, skipped) {
            fails.extend(result.err());
            continue;
        }
        let inputs = super::typed_inputs_for(&op, rng);
        fails.extend(check_op_typed(backend, &op, &inputs, cfg.tolerance_factor).err());
    }
    for dtype in DType::ALL {
        fails.extend(ends(backend, rng, cfg, dtype, skipped));
        fails.extend(lerp_specials(backend, rng, cfg, dtype, skipped));
        fails.extend(slerp_rows(backend, rng, cfg, dtype, skipped));
    }
    fails.extend(errors(backend, rng));
    fails
}

/// Values of `dtype` for `v` (values past its range become ±∞).
fn typed(dtype: DType, v: &[f32]) -> HostVec {
    HostVec::from_f32(dtype, v)
}

/// Runs `op` (of `dtype`) on `inputs` and checks it against the reference,
/// or that it is declined cleanly.
fn check(
    backend: &dyn Backend,
    rng: &mut Rng,
    cfg: Config,
    op: Op,
    inputs: &[Vec<f32>],
    skipped: &mut Vec<String>,
) -> Option<String> {
    if let Some(result) = declined(backend, &op, cfg, rng, skipped) {
        return result.err();
    }
    let inputs: Vec<HostVec> = inputs.iter().map(|v| typed(op.dtype(), v)).collect();
    check_op_typed(backend, &op, &inputs, cfg.tolerance_factor).err()
}

/// `t = 0` gives `a` and `t = 1` gives `b`, value for value, for lerp and
/// slerp, on finite normal data (zeros and large values included).
fn ends(backend: &dyn Backend, rng: &mut Rng, cfg: Config, dtype: DType, skipped: &mut Vec<String>) -> Vec<String> {
    let mut fails = Vec::new();
    let (rows, cols) = (9, 37);
    let n = rows * cols;
    let mut a = rng.vec(n, -4.0, 4.0);
    let mut b = rng.vec(n, -4.0, 4.0);
    for (i, s) in [0.0f32, -0.0, 3e4, -3e4, 1e-3].into_iter().enumerate() {
        a[i * 7] = s;
        b[i * 11 + 3] = s;
    }
    let (ta, tb) = (typed(dtype, &a), typed(dtype, &b));
    for t in [0.0f32, 1.0] {
        for op in [Op::lerp(n, t), Op::slerp(rows, cols, t)] {
            let op = op.with_dtype(dtype);
            if let Some(result) = declined(backend, &op, cfg, rng, skipped) {
                fails.extend(result.err());
                continue;
            }
            let mut out = poisoned(dtype, n);
            if let Err(e) = backend.run_typed(&op, &[ta.as_slice(), tb.as_slice()], out.as_mut()) {
                fails.push(format!("{} {}: returned error: {e}", op.name(), op.shapes()));
                continue;
            }
            let want = if t == 0.0 { &ta } else { &tb };
            let wrong = out.to_f64().iter().zip(want.to_f64()).filter(|(y, w)| **y != *w).count();
            if wrong > 0 {
                fails.push(format!("{} {}: {wrong} of {n} elements not exactly the end point", op.name(), op.shapes()));
            }
        }
    }
    fails
}

/// Lerp with IEEE specials (NaN, ±∞), signed zeros,
/// subnormals and values near the top of the range, at several `t`.
fn lerp_specials(
    backend: &dyn Backend,
    rng: &mut Rng,
    cfg: Config,
    dtype: DType,
    skipped: &mut Vec<String>,
) -> Vec<String> {
    let specials = [
        0.0f32,
        -0.0,
        1e38,
        -1e38,
        1e-38,
        -1e-38,
        1e-45,
        -1e-45,
        9.0,
        -9.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    let len = 1031;
    let mut fails = Vec::new();
    for t in [0.0f32, 0.3, 0.5, 1.0, -0.75, 1.5] {
        let mut a = rng.vec(len, -4.0, 4.0);
        let mut b = rng.vec(len, -4.0, 4.0);
        for (i, &s) in specials.iter().enumerate() {
            // Every special against itself, against an ordinary value (both
            // ways), and somewhere in the vector body.
            a[i] = s;
            b[i] = s;
            a[32 + i] = s;
            b[64 + i] = s;
            let j = 128 + rng.below(len - 128);
            if rng.below(2) == 0 {
                a[j] = s;
            } else {
                b[j] = s;
            }
        }
        // Subnormals that meet: their difference is normal, and so is the
        // result for |t| > 1 (lerp(−1e-38, 1e-38, 1.5) = 2e-38); with a small
        // normal value.
        for (k, (x, y)) in
            [(-1e-38f32, 1e-38f32), (1e-38, -1e-38), (1e-38, 1e-45), (-1e-38, 3e-38)].into_iter().enumerate()
        {
            a[96 + k] = x;
            b[96 + k] = y;
        }
        // Never opposite huge values: their difference would overflow f32.
        for (x, y) in a.iter_mut().zip(&mut b) {
            if x.abs() >= 1e38 && y.abs() >= 1e38 && x.signum() != y.signum() {
                *y = *x;
            }
        }
        fails.extend(check(backend, rng, cfg, Op::lerp(len, t).with_dtype(dtype), &[a, b], skipped));
    }
    fails
}

/// Slerp rows of every kind its documentation lists, at several `t`.
fn slerp_rows(
    backend: &dyn Backend,
    rng: &mut Rng,
    cfg: Config,
    dtype: DType,
    skipped: &mut Vec<String>,
) -> Vec<String> {
    let cols = 67;
    let mut fails = Vec::new();
    for t in [0.25f32, 0.5, 0.9] {
        let mut rows: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
        let random = |rng: &mut Rng| rng.vec(cols, -2.0, 2.0);
        let x = random(rng);
        rows.push((vec![0.0; cols], x.clone())); // zero a
        rows.push((x.clone(), vec![0.0; cols])); // zero b
        rows.push((vec![0.0; cols], vec![-0.0; cols])); // both zero
        rows.push((x.clone(), x.iter().map(|v| 2.5 * v).collect())); // parallel
        rows.push((x.clone(), x.iter().map(|v| -1.5 * v).collect())); // anti-parallel
        let noise = random(rng);
        rows.push((x.clone(), x.iter().zip(&noise).map(|(v, e)| v + 1e-3 * e).collect())); // near-parallel
        // Almost anti-parallel but outside the threshold: an angle of about 176°.
        let y = random(rng);
        let far: Vec<f32> = x.iter().zip(&y).map(|(v, w)| -v + 0.07 * w).collect();
        rows.push((x.clone(), far));
        rows.push((x.iter().map(|v| v * 1e15).collect(), random(rng))); // huge (f16: infinite)
        rows.push((x.iter().map(|v| v * 1e-15).collect(), random(rng))); // tiny (f16: zero)
        rows.push((x.iter().map(|v| v * 1e-30).collect(), random(rng))); // squares below 2⁻¹²⁶: zero
        let mut nan = random(rng);
        nan[rng.below(cols)] = f32::NAN;
        rows.push((nan, random(rng)));
        let mut inf = random(rng);
        inf[rng.below(cols)] = f32::NEG_INFINITY;
        rows.push((random(rng), inf));
        let y = random(rng);
        rows.push((random(rng), y));
        let n_rows = rows.len();
        let a: Vec<f32> = rows.iter().flat_map(|(a, _)| a.iter().copied()).collect();
        let b: Vec<f32> = rows.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let op = Op::slerp(n_rows, cols, t).with_dtype(dtype);
        fails.extend(check(backend, rng, cfg, op, &[a, b], skipped));
    }
    fails
}

/// A `t` out of range and mismatched lengths: `Shape` errors naming the op,
/// the output untouched.
fn errors(backend: &dyn Backend, rng: &mut Rng) -> Vec<String> {
    let mut fails = Vec::new();
    let x = HostVec::from_f32(DType::F32, &rng.vec(12, -1.0, 1.0));
    let short = HostVec::from_f32(DType::F32, &rng.vec(11, -1.0, 1.0));
    let cases: [(Op, &HostVec, &str); 5] = [
        (Op::lerp(12, f32::NAN), &x, "lerp with a NaN t"),
        (Op::lerp(12, f32::INFINITY), &x, "lerp with an infinite t"),
        (Op::slerp(3, 4, 1.5), &x, "slerp with t above 1"),
        (Op::slerp(3, 4, -0.1), &x, "slerp with t below 0"),
        (Op::slerp(3, 4, 0.5), &short, "slerp with a short b"),
    ];
    for (op, b, what) in cases {
        let mut out = poisoned(DType::F32, 12);
        let inputs: [HostSlice<'_>; 2] = [x.as_slice(), b.as_slice()];
        match backend.run_typed(&op, &inputs, out.as_mut()) {
            Err(ComputeError::Shape { op: name, .. }) if name == op.name() => {}
            other => fails.push(format!("{what}: expected a Shape error naming {}, got {other:?}", op.name())),
        }
        if out.bits().iter().any(|&b| b != poison_bits(DType::F32)) {
            fails.push(format!("{what}: output was modified despite the error"));
        }
    }
    fails
}

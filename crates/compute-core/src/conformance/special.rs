//! The special-values group: NaN, ±∞, ±0 and subnormal inputs in every
//! element-wise op, reduction, row op and matmul, on every dtype, against the
//! float64 reference. The rules it checks (NaN in, NaN out, as PyTorch; the
//! limit at ±∞ for element-wise ops; IEEE arithmetic elsewhere) are listed
//! under "Special values" in the [`conformance`](super) docs.
//!
//! Each special value is placed at the start and the end of a vector (the
//! scalar tails of vector kernels) and at random places in its body; binary
//! ops meet every pair of specials; reductions and rows run at lengths that
//! span several workgroups, threads and vector blocks.

use super::{Config, Scale, check_op_typed, declined, dtype_variants};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::host::HostVec;
use crate::op::{BinaryOp, MatmulSpec, Op, ReduceOp, RowOp};
use crate::rng::Rng;

/// Runs the group on every float dtype; returns the failures.
pub(super) fn run(backend: &dyn Backend, rng: &mut Rng, cfg: Config, skipped: &mut Vec<String>) -> Vec<String> {
    let mut fails = Vec::new();
    for dtype in DType::ALL {
        let mut ctx = Ctx { backend, cfg, skipped: &mut *skipped, fails: &mut fails };
        elementwise(&mut ctx, rng, dtype);
        reductions(&mut ctx, rng, dtype);
        rows(&mut ctx, rng, dtype);
    }
    let mut ctx = Ctx { backend, cfg, skipped, fails: &mut fails };
    matmuls(&mut ctx, rng);
    fails
}

/// What every check needs: the backend, the config, and where to record.
struct Ctx<'a> {
    backend: &'a dyn Backend,
    cfg: Config,
    skipped: &'a mut Vec<String>,
    fails: &'a mut Vec<String>,
}

impl Ctx<'_> {
    /// Runs `op` on `inputs` (rounded to each operand's dtype: every value
    /// here is exact in it) and records a failure, or checks that a declined
    /// op fails cleanly.
    fn check(&mut self, rng: &mut Rng, op: Op, inputs: &[Vec<f32>]) {
        if let Some(result) = declined(self.backend, &op, self.cfg, rng, self.skipped) {
            self.fails.extend(result.err());
            return;
        }
        let dtypes: Vec<DType> = match op.layout() {
            Ok(l) => l.inputs().iter().map(|o| o.dtype).collect(),
            Err(e) => {
                self.fails.push(format!("{} {}: {e}", op.name(), op.shapes()));
                return;
            }
        };
        let typed: Vec<HostVec> = inputs.iter().zip(dtypes).map(|(v, d)| HostVec::from_f32(d, v)).collect();
        self.fails.extend(check_op_typed(self.backend, &op, &typed, self.cfg.tolerance_factor).err());
    }
}

/// The smallest, the largest and a middle subnormal of `dtype`, each exact in it.
fn subnormals(dtype: DType) -> [f32; 3] {
    match dtype {
        DType::F16 => [2f32.powi(-24), 2f32.powi(-14) - 2f32.powi(-24), 2f32.powi(-20)],
        DType::BF16 => [f32::from_bits(0x0001_0000), f32::from_bits(0x007f_0000), f32::from_bits(0x0004_0000)],
        _ => [f32::from_bits(1), f32::from_bits(0x007f_ffff), f32::from_bits(0x0001_2345)],
    }
}

/// The special values of `dtype`: NaN of both signs, ±∞, ±0, subnormals of
/// both signs, and two ordinary values to pair them with.
fn specials(dtype: DType) -> Vec<f32> {
    let [lo, hi, mid] = subnormals(dtype);
    vec![f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, lo, -lo, hi, -mid, 1.5, -2.25]
}

/// Puts every special at the start and at the end of `v` and once at a
/// random place. `v` is at least as long as `2·specials.len()`.
fn sprinkle(rng: &mut Rng, v: &mut [f32], specials: &[f32]) {
    let n = v.len();
    for (i, &s) in specials.iter().enumerate() {
        v[i] = s;
        v[n - 1 - i] = s;
        let j = rng.below(n);
        v[j] = s;
    }
}

/// Writes each of `vals` at a random index of `v`.
fn put(rng: &mut Rng, v: &mut [f32], vals: &[f32]) {
    for &s in vals {
        let j = rng.below(v.len());
        v[j] = s;
    }
}

/// Every unary op on vectors holding every special; add, sub, mul and swiglu
/// on every pair of specials (each against each, both ways), then with the
/// specials scattered through both operands.
fn elementwise(ctx: &mut Ctx<'_>, rng: &mut Rng, dtype: DType) {
    let sp = specials(dtype);
    for len in [1031, 65_537] {
        for op in super::cases::unary_ops() {
            let mut x = rng.vec(len, -6.0, 6.0);
            sprinkle(rng, &mut x, &sp);
            ctx.check(rng, Op::unary(op, len).with_dtype(dtype), &[x]);
        }
    }
    let len = sp.len() * sp.len() + 1000;
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::SwiGlu] {
        let mut a = rng.vec(len, -4.0, 4.0);
        let mut b = rng.vec(len, -4.0, 4.0);
        // No subnormal meets an infinity in swiglu's product: swish of a
        // subnormal is subnormal or 0 in f32, and a GPU may flush a subnormal
        // factor, so either way round the product is ∞ or NaN (`0·∞`).
        let sub = |v: f32| v != 0.0 && v.abs() < 1e-30;
        let undefined =
            |s: f32, t: f32| op == BinaryOp::SwiGlu && ((sub(s) && t.is_infinite()) || (s.is_infinite() && sub(t)));
        for (i, &s) in sp.iter().enumerate() {
            for (j, &t) in sp.iter().enumerate() {
                if !undefined(s, t) {
                    a[i * sp.len() + j] = s;
                    b[i * sp.len() + j] = t;
                }
            }
        }
        for _ in 0..3 {
            let (j, k) = (rng.below(len), rng.below(len));
            let (s, t) = (sp[rng.below(sp.len())], sp[rng.below(sp.len())]);
            if !undefined(s, b[j]) {
                a[j] = s;
            }
            if !undefined(a[k], t) {
                b[k] = t;
            }
        }
        ctx.check(rng, Op::binary(op, len).with_dtype(dtype), &[a, b]);
    }
}

/// The vectors a reduction meets: ordinary values with one NaN (somewhere,
/// or last), one `+∞`, one `−∞`, both infinities, a NaN and an infinity; all
/// `−∞`; all `−0`; only zeros and subnormals.
fn reduction_inputs(rng: &mut Rng, dtype: DType, len: usize) -> Vec<Vec<f32>> {
    let inf = f32::INFINITY;
    let with = |rng: &mut Rng, vals: &[f32]| {
        let mut v = rng.vec(len, -3.0, 3.0);
        put(rng, &mut v, vals);
        v
    };
    let mut nan_last = rng.vec(len, -3.0, 3.0);
    nan_last[len - 1] = f32::NAN;
    let [lo, hi, mid] = subnormals(dtype);
    let tiny = [0.0, -0.0, lo, -lo, hi, -hi, mid, -mid];
    vec![
        with(rng, &[f32::NAN]),
        nan_last,
        with(rng, &[inf]),
        with(rng, &[-inf]),
        with(rng, &[inf, -inf]),
        with(rng, &[-inf, f32::NAN]),
        vec![-inf; len],
        vec![-0.0; len],
        (0..len).map(|_| tiny[rng.below(tiny.len())]).collect(),
    ]
}

/// Sum, max and dot on [`reduction_inputs`], at lengths from one element to
/// 65537, and past a million on `f32` (several workgroups, threads and
/// partial passes); dot also with `∞·0` terms and with products below the
/// normal range.
fn reductions(ctx: &mut Ctx<'_>, rng: &mut Rng, dtype: DType) {
    // Past a million elements on f32 only: the half dtypes reach the same
    // kernel paths at the shorter lengths.
    let mut lens = vec![1, 2, 7, 1031, 65_537];
    if dtype == DType::F32 {
        lens.push(1_048_583);
        if ctx.cfg.scale == Scale::Large {
            lens.push(16 * 1024 * 1024 + 3);
        }
    }
    for len in lens {
        for x in reduction_inputs(rng, dtype, len) {
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                ctx.check(rng, Op::reduce(op, len).with_dtype(dtype), std::slice::from_ref(&x));
            }
            let y = rng.vec(len, -2.0, 2.0);
            ctx.check(rng, Op::dot(len).with_dtype(dtype), &[x, y]);
        }
        // ∞·0 is NaN; ∞·(−2) is −∞.
        let (mut a, mut b) = (rng.vec(len, -2.0, 2.0), rng.vec(len, -2.0, 2.0));
        let j = rng.below(len);
        a[j] = f32::INFINITY;
        b[j] = if len % 2 == 0 { 0.0 } else { -2.0 };
        ctx.check(rng, Op::dot(len).with_dtype(dtype), &[a, b]);
        // Normal factors whose products are subnormal (zero in f16), summing
        // to a normal number over many terms.
        let (a, b) = (rng.vec(len, -2e-20, 2e-20), rng.vec(len, -2e-20, 2e-20));
        ctx.check(rng, Op::dot(len).with_dtype(dtype), &[a, b]);
    }
}

/// One row of each kind a row op meets, `cols` long: ordinary; one NaN
/// (somewhere; last; a negative NaN first); one `+∞`; two `+∞`; one `−∞`;
/// about half `−∞`; all `−∞`; `+∞` and `−∞`; only zeros; only zeros and
/// subnormals; ordinary values with zeros and subnormals among them.
fn special_rows(rng: &mut Rng, dtype: DType, cols: usize) -> Vec<f32> {
    let inf = f32::INFINITY;
    let [lo, hi, mid] = subnormals(dtype);
    let tiny = [0.0, -0.0, lo, -lo, hi, -hi, mid, -mid];
    let mut out = Vec::new();
    for kind in 0..13 {
        let mut row = rng.vec(cols, -6.0, 6.0);
        match kind {
            0 => {}
            1 => put(rng, &mut row, &[f32::NAN]),
            2 => row[cols - 1] = f32::NAN,
            3 => row[0] = -f32::NAN,
            4 => put(rng, &mut row, &[inf]),
            5 => put(rng, &mut row, &[inf, inf]),
            6 => put(rng, &mut row, &[-inf]),
            7 => {
                for v in row.iter_mut() {
                    if rng.below(2) == 0 {
                        *v = -inf;
                    }
                }
            }
            8 => row.fill(-inf),
            9 => put(rng, &mut row, &[inf, -inf]),
            10 => row.fill(0.0),
            11 => row.iter_mut().for_each(|v| *v = tiny[rng.below(tiny.len())]),
            _ => put(rng, &mut row, &tiny),
        }
        out.extend(row);
    }
    out
}

/// Softmax, log_softmax, layer_norm and rms_norm on [`special_rows`] at row
/// lengths from 1 to 4097, and past 65536 on `f32`; the norms also with NaN,
/// `±∞` and `0` in `γ` and `β` (only their columns change).
fn rows(ctx: &mut Ctx<'_>, rng: &mut Rng, dtype: DType) {
    let ops = [RowOp::Softmax, RowOp::LogSoftmax, RowOp::LayerNorm { eps: 1e-5 }, RowOp::RmsNorm { eps: 1e-6 }];
    let mut widths = vec![1, 7, 67, 1000, 4097];
    if dtype == DType::F32 {
        widths.push(65_537);
    }
    for cols in widths {
        let x = special_rows(rng, dtype, cols);
        let rows = x.len() / cols;
        for op in ops {
            let gamma = rng.vec(cols, 0.5, 1.5);
            let beta = rng.vec(cols, -1.0, 1.0);
            let inputs = match op {
                RowOp::LayerNorm { .. } => vec![x.clone(), gamma, beta],
                RowOp::RmsNorm { .. } => vec![x.clone(), gamma],
                _ => vec![x.clone()],
            };
            ctx.check(rng, Op::rows(op, rows, cols).with_dtype(dtype), &inputs);
        }
        if cols >= 7 {
            let x = rng.vec(5 * cols, -6.0, 6.0);
            let mut gamma = rng.vec(cols, 0.5, 1.5);
            let mut beta = rng.vec(cols, -1.0, 1.0);
            let [g0, g1, g2, b0, b1, ..] = [0, 1, 2, 3, 4, 5, 6].map(|i| i * (cols - 1) / 6);
            gamma[g0] = f32::NAN;
            gamma[g1] = f32::INFINITY;
            gamma[g2] = 0.0;
            beta[b0] = f32::NEG_INFINITY;
            beta[b1] = f32::NAN;
            let ln = Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 5, cols).with_dtype(dtype);
            ctx.check(rng, ln, &[x.clone(), gamma.clone(), beta]);
            let rms = Op::rows(RowOp::RmsNorm { eps: 1e-6 }, 5, cols).with_dtype(dtype);
            ctx.check(rng, rms, &[x, gamma]);
        }
    }
}

/// Matmuls (every transpose, batched, every dtype variant) whose operands
/// hold a NaN, `+∞` and `−∞` (in `a`), `+∞` and a NaN (in `b`), and zeros,
/// `−0` and subnormals in both: NaN rows and columns, infinite outputs, `∞·0`
/// and `∞ − ∞` NaNs, and ordinary outputs beside them. No subnormal meets an
/// infinity in a product: a backend that flushes subnormal operands (a GPU,
/// the CPU's bf16 dot-product instructions) makes that `0·∞`.
fn matmuls(ctx: &mut Ctx<'_>, rng: &mut Rng) {
    let shapes = [
        (1, 1, 1, 1),
        (1, 5, 7, 3),
        (1, 17, 33, 9),
        (1, 64, 64, 64),
        (1, 65, 31, 127),
        (1, 128, 256, 96),
        (1, 1, 513, 300),
        (1, 300, 513, 1),
        (3, 5, 7, 9),
        (4, 33, 65, 17),
    ];
    let transposes = [(false, false), (true, false), (false, true), (true, true)];
    let mut cases: Vec<_> = shapes.into_iter().flat_map(|s| transposes.map(|t| (s, t))).collect();
    if ctx.cfg.scale == Scale::Large {
        // The large tilings, on one transpose each (their f64 reference is the slow part).
        cases.extend([((1, 1024, 1024, 1024), (false, false)), ((1, 2048, 64, 2048), (true, true))]);
    }
    let inf = f32::INFINITY;
    for ((batch, m, k, n), (trans_a, trans_b)) in cases {
        let spec = MatmulSpec { batch, trans_a, trans_b, ..MatmulSpec::new(m, k, n) };
        // Element (b, i, p) of a and (b, p, j) of b, in storage order.
        let at_a = |bi: usize, i: usize, p: usize| bi * m * k + if trans_a { p * m + i } else { i * k + p };
        let at_b = |bi: usize, p: usize, j: usize| bi * k * n + if trans_b { j * k + p } else { p * n + j };
        for op in dtype_variants(&Op::Matmul(spec)) {
            let [lo, hi, _] = subnormals(op.dtype());
            let mut a = rng.vec(batch * m * k, -1.0, 1.0);
            let mut b = rng.vec(batch * k * n, -1.0, 1.0);
            let pick = |rng: &mut Rng| (rng.below(batch), rng.below(m), rng.below(k), rng.below(n));
            // Zeros in a's rows, so some ∞ of b meet a 0.
            for _ in 0..(a.len() / 16).max(1) {
                let (bi, i, p, _) = pick(rng);
                a[at_a(bi, i, p)] = 0.0;
            }
            let mut a_inf = Vec::new();
            for s in [inf, -inf] {
                let (bi, i, p, _) = pick(rng);
                a[at_a(bi, i, p)] = s;
                a_inf.push(p);
            }
            let (bi, _, p_inf, j) = pick(rng);
            b[at_b(bi, p_inf, j)] = inf;
            for s in [f32::NAN, 0.0, -0.0] {
                let (bi, i, p, j) = pick(rng);
                a[at_a(bi, i, p)] = s;
                let (bj, _, q, _) = pick(rng);
                b[at_b(bj, q, j)] = s;
            }
            // Subnormals only along k indices where the other operand has no ∞.
            for s in [lo, -hi] {
                let (bi, i, p, j) = pick(rng);
                if p != p_inf {
                    a[at_a(bi, i, p)] = s;
                }
                if !a_inf.contains(&p) {
                    b[at_b(bi, p, j)] = -s;
                }
            }
            ctx.check(rng, op, &[a, b]);
        }
    }
}

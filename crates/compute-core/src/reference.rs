//! Float64 reference implementations of every op: the ground truth of the
//! conformance suite. Written for clarity, not speed.

use crate::attention::AttentionSpec;
use crate::error::Result;
use crate::host::HostSlice;
use crate::op::{BinaryOp, GeluForm, Op, ReduceOp, RowOp, UnaryOp};
use crate::strided::CopySpec;

/// A reference result: the exact-ish value of each output element, and a
/// magnitude per element that rounding errors scale with (`Σ|aᵢₖ·bₖⱼ|` for a
/// matmul, `Σ|xᵢ|` for a sum, `|value|` for element-wise ops). An element
/// the op does not write (outside a strided copy's view) has the value NaN
/// and the scale [`UNTOUCHED`].
#[derive(Clone, Debug)]
pub struct Reference {
    /// Reference values.
    pub values: Vec<f64>,
    /// Error scale per element.
    pub scale: Vec<f64>,
}

/// The scale of an output element the op leaves as it was.
pub const UNTOUCHED: f64 = f64::NEG_INFINITY;

/// `erf(x)` in float64 (Taylor series near zero, continued fraction for erfc
/// beyond); absolute error below 1e-14.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 2.5 {
        // erf(x) = 2/√π Σ (−1)ⁿ x²ⁿ⁺¹ / (n! (2n+1))
        let x2 = a * a;
        let mut term = a;
        let mut sum = a;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a > 27.0 {
        1.0
    } else {
        // erfc(x) = e^{−x²}/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + …)))) (Lentz).
        let mut f = a;
        let tiny = 1e-300;
        let mut c = f;
        let mut d = 0.0;
        for i in 1..200 {
            let an = i as f64 / 2.0;
            d = a + an * d;
            d = if d == 0.0 { tiny } else { d };
            c = a + an / c;
            c = if c == 0.0 { tiny } else { c };
            d = 1.0 / d;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-a * a).exp() / (f * std::f64::consts::PI.sqrt())
    };
    if x < 0.0 { -r } else { r }
}

/// The reference value of a unary op at `x`.
pub fn unary(op: UnaryOp, x: f64) -> f64 {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    match op {
        UnaryOp::Relu => {
            if x.is_nan() {
                x
            } else {
                x.max(0.0)
            }
        }
        UnaryOp::LeakyRelu { alpha } => {
            if x > 0.0 {
                x
            } else {
                alpha as f64 * x
            }
        }
        UnaryOp::Elu { alpha } => {
            if x > 0.0 {
                x
            } else {
                alpha as f64 * x.exp_m1()
            }
        }
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Swish => {
            if x == f64::NEG_INFINITY {
                -0.0
            } else {
                x * sigmoid(x)
            }
        }
        UnaryOp::Gelu(GeluForm::Tanh) => {
            if x.is_infinite() {
                return if x > 0.0 { x } else { -0.0 };
            }
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Gelu(GeluForm::Erf) => {
            if x.is_infinite() {
                return if x > 0.0 { x } else { -0.0 };
            }
            0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
        }
        UnaryOp::Clip { min, max } => {
            if x.is_nan() {
                x
            } else {
                x.max(min as f64).min(max as f64)
            }
        }
        UnaryOp::Scale { s } => s as f64 * x,
    }
}

/// The reference value of a binary op.
pub fn binary(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::SwiGlu => unary(UnaryOp::Swish, a) * b,
    }
}

/// The reference value of `lerp(a, b, t)`: the formula of [`Op::Lerp`],
/// `t < 0.5 ? a + t·(b − a) : b − (1 − t)·(b − a)`, in float64 (exact to
/// 2⁻⁵³ relative for `f32` operands; IEEE specials as the formula gives them).
pub fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let d = b - a;
    if t < 0.5 { a + t * d } else { b - (1.0 - t) * d }
}

/// The error scale of a lerp: `|r| + min(|t|, |1 − t|)·|b − a|` (the rounding
/// of `b − a` and of the product scale with the second term).
fn lerp_scale(a: f64, b: f64, t: f64, r: f64) -> f64 {
    r.abs() + t.abs().min((1.0 - t).abs()) * (b - a).abs()
}

/// How [`Op::Slerp`] treats one row, decided from its sums as the op's
/// documentation lists: `Lerp` for zero and near-(anti)parallel rows, `Nan`
/// for rows with NaN or infinite elements, else the two coefficients of `a`
/// and `b` with their derivatives with respect to the cosine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SlerpRow {
    /// Element-wise lerp.
    Lerp,
    /// Every element NaN.
    Nan,
    /// `y = p·a + q·b`; `dp`, `dq`: `∂p/∂c`, `∂q/∂c` (for the error scale).
    Arc {
        /// Coefficient of `a`: `sin((1 − t)Ω)/sin Ω`.
        p: f64,
        /// Coefficient of `b`: `sin(tΩ)/sin Ω`.
        q: f64,
        /// `∂p/∂c` with `c = cos Ω`.
        dp: f64,
        /// `∂q/∂c`.
        dq: f64,
    },
}

/// Cosines beyond this magnitude make [`Op::Slerp`] fall back to lerp.
pub const SLERP_PARALLEL: f32 = 0.9995;

/// The [`SlerpRow`] of a row with squared norms `na2`, `nb2` and dot product
/// `dot`, for weight `t`. Thresholds as the kernels apply them in `f32`.
pub fn slerp_row(na2: f64, nb2: f64, dot: f64, t: f64) -> SlerpRow {
    let tiny = f64::from(f32::MIN_POSITIVE);
    if na2 < tiny || nb2 < tiny {
        return SlerpRow::Lerp;
    }
    let max = f64::from(f32::MAX);
    if !(na2 <= max && nb2 <= max) || dot.is_nan() {
        return SlerpRow::Nan;
    }
    let c = (dot / (na2.sqrt() * nb2.sqrt())).clamp(-1.0, 1.0);
    if c.abs() > f64::from(SLERP_PARALLEL) {
        return SlerpRow::Lerp;
    }
    let w = c.acos();
    let s = w.sin();
    let (u, v) = ((1.0 - t) * w, t * w);
    let (p, q) = (u.sin() / s, v.sin() / s);
    // d/dΩ of sin(kΩ)/sin Ω, then dΩ/dc = −1/sin Ω.
    let d = |k: f64| -> f64 { -(k * (k * w).cos() * s - (k * w).sin() * w.cos()) / (s * s) / s };
    SlerpRow::Arc { p, q, dp: d(1.0 - t), dq: d(t) }
}

fn widen(x: &[f64]) -> impl Iterator<Item = f64> + '_ {
    x.iter().copied()
}

/// `c` applied to `src` (values and their scales): the destination's
/// elements, each from its source element, NaN with the scale [`UNTOUCHED`]
/// outside the view; with positions, row `j` goes to the slot `positions[j]`
/// names, and nowhere where it names none ([`CopySpec::slot`]).
fn place(c: &CopySpec, positions: Option<&[f64]>, src: (&[f64], &[f64])) -> (Vec<f64>, Vec<f64>) {
    let mut values = vec![f64::NAN; c.dst.len];
    let mut scale = vec![UNTOUCHED; c.dst.len];
    let [n0, n1, n2] = c.shape;
    for j in 0..n1 {
        let to = match c.positions {
            None => Some(j),
            Some(slots) => positions.and_then(|p| CopySpec::slot(p[j] as f32, slots)),
        };
        let Some(to) = to else { continue };
        for i in 0..n0 {
            for l in 0..n2 {
                let (from, at) = (c.src.index(i, j, l), c.dst.index(i, to, l));
                values[at] = src.0[from];
                scale[at] = src.1[from];
            }
        }
    }
    (values, scale)
}

/// Computes `op` on `f32` inputs in float64. Validates lengths with [`Op::check`]
/// (not dtypes: `f32` values stand for values of any dtype here).
pub fn run(op: &Op, inputs: &[&[f32]]) -> Result<Reference> {
    let wide: Vec<Vec<f64>> = inputs.iter().map(|x| x.iter().map(|&v| f64::from(v)).collect()).collect();
    run_f64(op, &wide.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

/// Computes `op` on typed inputs in float64. Validates lengths and dtypes
/// with [`Op::check_operands`].
pub fn run_typed(op: &Op, inputs: &[HostSlice<'_>]) -> Result<Reference> {
    let operands: Vec<_> = inputs.iter().map(|x| x.operand()).collect();
    let out = op.layout()?.output();
    op.check_operands(&operands, out)?;
    let wide: Vec<Vec<f64>> = inputs.iter().map(|x| x.to_f64()).collect();
    run_f64(op, &wide.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

/// Computes `op` on inputs given as `f64` values (each exactly a value of its
/// operand's dtype). Validates lengths with [`Op::check`]. The values are
/// exact: rounding to the output dtype is the comparison's business.
pub fn run_f64(op: &Op, inputs: &[&[f64]]) -> Result<Reference> {
    let lens: Vec<usize> = inputs.iter().map(|x| x.len()).collect();
    let layout = op.layout()?;
    op.check(&lens, layout.output_len())?;
    let mut values = Vec::with_capacity(layout.output_len());
    let mut scale = Vec::with_capacity(layout.output_len());
    match *op {
        Op::Cast { .. } => {
            values.extend(widen(inputs[0]));
            scale.extend(widen(inputs[0]).map(f64::abs));
        }
        Op::Unary { op, .. } => {
            for x in widen(inputs[0]) {
                let v = unary(op, x);
                values.push(v);
                scale.push(v.abs().max(x.abs() * 1e-30));
            }
        }
        Op::Binary { op, .. } => {
            for (a, b) in widen(inputs[0]).zip(widen(inputs[1])) {
                let v = binary(op, a, b);
                values.push(v);
                scale.push(a.abs().max(b.abs()));
            }
        }
        Op::Lerp { t, .. } => {
            let t = f64::from(t);
            for (a, b) in widen(inputs[0]).zip(widen(inputs[1])) {
                let v = lerp(a, b, t);
                values.push(v);
                scale.push(lerp_scale(a, b, t, v));
            }
        }
        Op::Slerp { rows, cols, t, .. } => {
            let t = f64::from(t);
            for r in 0..rows {
                let a = &inputs[0][r * cols..(r + 1) * cols];
                let b = &inputs[1][r * cols..(r + 1) * cols];
                slerp(a, b, t, &mut values, &mut scale);
            }
        }
        Op::Reduce { op: ReduceOp::Sum, .. } => {
            values.push(widen(inputs[0]).sum());
            scale.push(widen(inputs[0]).map(f64::abs).sum());
        }
        Op::Reduce { op: ReduceOp::Max, .. } => {
            let mut m = f64::NEG_INFINITY;
            for x in widen(inputs[0]) {
                if x.is_nan() {
                    m = f64::NAN;
                    break;
                }
                m = m.max(x);
            }
            values.push(m);
            scale.push(m.abs());
        }
        Op::Dot { .. } => {
            values.push(widen(inputs[0]).zip(widen(inputs[1])).map(|(a, b)| a * b).sum());
            scale.push(widen(inputs[0]).zip(widen(inputs[1])).map(|(a, b)| (a * b).abs()).sum());
        }
        Op::Rows { op, rows, cols, .. } => {
            for r in 0..rows {
                let row: Vec<f64> = widen(&inputs[0][r * cols..(r + 1) * cols]).collect();
                rowwise(op, &row, inputs, &mut values, &mut scale);
            }
        }
        Op::Matmul(s) => {
            let (a, b) = (inputs[0], inputs[1]);
            let e = s.epilogue;
            let bias = e.bias.then(|| inputs[2]);
            let c0 = e.reads_c().then(|| inputs[2 + usize::from(e.bias)]);
            for bi in 0..s.batch {
                let (a0, b0) = (bi * s.stride_a(), bi * s.stride_b());
                let a = &a[a0..a0 + s.m * s.k];
                let b = &b[b0..b0 + s.k * s.n];
                for i in 0..s.m {
                    for j in 0..s.n {
                        let (mut acc, mut mag) = (0.0f64, 0.0f64);
                        for p in 0..s.k {
                            let av = if s.trans_a { a[p * s.m + i] } else { a[i * s.k + p] };
                            let bv = if s.trans_b { b[j * s.k + p] } else { b[p * s.n + j] };
                            acc += av * bv;
                            mag += (av * bv).abs();
                        }
                        if e.is_identity() {
                            values.push(acc);
                            scale.push(mag);
                            continue;
                        }
                        // The epilogue's terms join the scale; an activation
                        // carries it through its slope (at most 1.13 for gelu).
                        let bv = bias.map_or(0.0, |x| x[j]);
                        let cv = c0.map_or(0.0, |x| x[(bi * s.m + i) * s.n + j]);
                        let pre_scale = f64::from(e.alpha).abs() * mag
                            + bv.abs()
                            + if e.reads_c() { (f64::from(e.beta) * cv).abs() } else { 0.0 };
                        let slope = if e.activation.is_some() { 1.13 } else { 1.0 };
                        values.push(e.apply(acc, cv, bv));
                        scale.push(slope * pre_scale);
                    }
                }
            }
        }
        // Into a cache: the plain rope's rows, placed as its append would place them.
        Op::Rope(r) if r.cache.is_some() => {
            let plain = run_f64(&Op::Rope(r.plain()), inputs)?;
            if let Some(c) = r.cache_copy() {
                (values, scale) = place(&c, inputs.get(1).copied(), (&plain.values, &plain.scale));
            }
        }
        Op::Rope(r) => {
            let x = inputs[0];
            let d = r.head_dim;
            let (row_heads, first) = r.input_heads();
            let n = r.seq * r.heads * d;
            values.resize(n, 0.0);
            scale.resize(n, 0.0);
            for t in 0..r.seq {
                for h in 0..r.heads {
                    let base = (t * r.heads + h) * d;
                    let from = (t * row_heads + first + h) * d;
                    for i in 0..d / 2 {
                        let (p, q) = r.pair(i);
                        let a = match inputs.get(1) {
                            Some(positions) if r.positions => r.angle_at(f64::from(positions[t] as f32), i),
                            _ => r.angle(t, i),
                        };
                        let (x1, x2) = (x[from + p], x[from + q]);
                        let (sin, cos) = a.sin_cos();
                        values[base + p] = x1 * cos - x2 * sin;
                        values[base + q] = x2 * cos + x1 * sin;
                        // The angle's f32 rounding moves both outputs by up to
                        // |Δa|·(|x₁| + |x₂|); Δa grows with |a|.
                        let mag = (x1.abs() + x2.abs()) * (1.0 + a.abs());
                        scale[base + p] = mag;
                        scale[base + q] = mag;
                    }
                }
            }
        }
        Op::Copy(c) => {
            let abs: Vec<f64> = inputs[0].iter().map(|v| v.abs()).collect();
            (values, scale) = place(&c, inputs.get(1).copied(), (inputs[0], &abs));
        }
        Op::Gather { rows, cols, .. } => {
            let (table, ids) = (inputs[0], inputs[1]);
            for &id in ids {
                let row = (id >= 0.0 && id.fract() == 0.0 && id < rows as f64).then_some(id as usize);
                match row {
                    Some(r) => {
                        values.extend(&table[r * cols..(r + 1) * cols]);
                        scale.extend(table[r * cols..(r + 1) * cols].iter().map(|v| v.abs()));
                    }
                    None => {
                        values.extend(std::iter::repeat_n(f64::NAN, cols));
                        scale.extend(std::iter::repeat_n(0.0, cols));
                    }
                }
            }
        }
        Op::Glu { cols, .. } => {
            for row in inputs[0].chunks_exact(2 * cols) {
                let (gate, up) = row.split_at(cols);
                for (&g, &u) in gate.iter().zip(up) {
                    values.push(binary(BinaryOp::SwiGlu, g, u));
                    scale.push(g.abs().max(u.abs()));
                }
            }
        }
        Op::ArgMax { rows, cols, .. } => {
            for r in 0..rows {
                let row = &inputs[0][r * cols..(r + 1) * cols];
                let mut best = 0usize;
                for (j, &v) in row.iter().enumerate() {
                    let b = row[best];
                    if !b.is_nan() && (v.is_nan() || v > b) {
                        best = j;
                    }
                }
                values.push(best as f64);
                scale.push(0.0);
            }
        }
        Op::QuantMatmul(s) => {
            let (x, w) = (inputs[0], inputs[1]);
            let e = s.epilogue;
            let at = s.epilogue_at();
            let bias = e.bias.then(|| inputs[at]);
            let c0 = e.reads_c().then(|| inputs[at + usize::from(e.bias)]);
            // A fused norm's result may be rounded to x's dtype before the
            // product: half an ulp of each term more.
            let h_round = if s.rms_norm.is_some() { s.dtype.unit_roundoff() } else { 0.0 };
            let mut row = vec![0.0f64; s.k];
            // The gated product's halves, (value, bound) per column.
            let mut prod = vec![(0.0f64, 0.0f64); if s.glu { s.n } else { 0 }];
            for i in 0..s.m {
                row.copy_from_slice(&x[i * s.k..(i + 1) * s.k]);
                if let Some(eps) = s.rms_norm {
                    let ms = row.iter().map(|v| v * v).sum::<f64>() / s.k as f64;
                    let inv = 1.0 / (ms + f64::from(eps.0)).sqrt();
                    for (h, &g) in row.iter_mut().zip(inputs[2]) {
                        *h *= inv * g;
                    }
                }
                let xi = &row[..];
                let xmax = xi.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                for j in 0..s.n {
                    let wj = &w[j * s.k..(j + 1) * s.k];
                    let (mut acc, mut mag, mut wsum) = (0.0f64, 0.0f64, 0.0f64);
                    for (&a, &b) in xi.iter().zip(wj) {
                        acc += a * b;
                        mag += (a * b).abs();
                        wsum += b.abs();
                    }
                    // The bound itself: activations rounded to 8-bit integers
                    // (half a step of max|x|/127 each), then f32 sums.
                    let bound = xmax / 254.0 * wsum + mag * (2f64.powi(-18) + h_round);
                    if s.glu {
                        prod[j] = (acc, bound);
                        continue;
                    }
                    if e.is_identity() {
                        values.push(acc);
                        scale.push(bound);
                        continue;
                    }
                    // Through the epilogue: the bound scaled by alpha, plus
                    // the f32 rounding of its terms (a few ulps of each),
                    // carried by an activation's largest slope (1.13, gelu).
                    let bv = bias.map_or(0.0, |b| b[j]);
                    let cv = c0.map_or(0.0, |c| c[i * s.n + j]);
                    let terms = f64::from(e.alpha).abs() * acc.abs()
                        + bv.abs()
                        + if e.reads_c() { (f64::from(e.beta) * cv).abs() } else { 0.0 };
                    let slope = if e.activation.is_some() { 1.13 } else { 1.0 };
                    values.push(e.apply(acc, cv, bv));
                    scale.push(slope * (f64::from(e.alpha).abs() * bound + terms * 2f64.powi(-21)));
                }
                // silu(a)·b: a's error carried by silu's slope (at most 1.1)
                // times |b|, b's by |silu(a)|, and the f32 rounding of both.
                let (gate, up) = prod.split_at(prod.len() / 2);
                for (&(a, ea), &(b, eb)) in gate.iter().zip(up) {
                    let v = binary(BinaryOp::SwiGlu, a, b);
                    values.push(v);
                    let silu = binary(BinaryOp::SwiGlu, a, 1.0);
                    scale.push(1.1 * ea * b.abs() + silu.abs() * eb + (1.1 * a.abs() * b.abs()) * 2f64.powi(-20));
                }
            }
        }
        Op::Conv2d(c) => {
            let (oh, ow) = c.output_hw().unwrap_or((0, 0));
            let (x, w) = (inputs[0], inputs[1]);
            for ni in 0..c.n {
                for co in 0..c.c_out {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let (mut acc, mut mag) = (0.0f64, 0.0f64);
                            for ci in 0..c.c_in {
                                for ky in 0..c.kh {
                                    let iy = (oy * c.stride.0 + ky) as isize - c.padding.0 as isize;
                                    if iy < 0 || iy >= c.h as isize {
                                        continue;
                                    }
                                    for kx in 0..c.kw {
                                        let ix = (ox * c.stride.1 + kx) as isize - c.padding.1 as isize;
                                        if ix < 0 || ix >= c.w as isize {
                                            continue;
                                        }
                                        let xv = x[((ni * c.c_in + ci) * c.h + iy as usize) * c.w + ix as usize];
                                        let wv = w[((co * c.c_in + ci) * c.kh + ky) * c.kw + kx];
                                        acc += xv * wv;
                                        mag += (xv * wv).abs();
                                    }
                                }
                            }
                            values.push(acc);
                            scale.push(mag);
                        }
                    }
                }
            }
        }
        Op::Attention(a) => attention(&a, inputs, &mut values, &mut scale),
    }
    Ok(Reference { values, scale })
}

/// Attention in float64, one query row at a time. The error scale of output
/// element `c` of query `i` is `Σⱼ pⱼ·(|vⱼc| + |oᵢc|) · (1 + σᵢ)`, with `σᵢ`
/// the largest `|scale|·Σ|qᵢ·kⱼ|` over the keys it sees: an absolute error
/// `δ` in a score is a relative error `δ` in its weight `pⱼ`, which moves the
/// output by `pⱼ·|vⱼc − oᵢc|`. A query that sees no key gets zeros.
fn attention(a: &AttentionSpec, inputs: &[&[f64]], values: &mut Vec<f64>, scale: &mut Vec<f64>) {
    if let (true, Some(positions)) = (a.positions, inputs.get(3)) {
        // Each batch element on its own, with the keys its last query's position gives.
        let (q_len, kv_len) = (a.heads_q * a.seq_q * a.head_dim, a.heads_kv * a.kv_rows() * a.head_dim);
        for b in 0..a.batch {
            let one = a.with_keys(a.keys_at(positions[b * a.seq_q + a.seq_q - 1] as f32));
            let kv = |x: &[f64]| x[b * kv_len..(b + 1) * kv_len].to_vec();
            let (k, v) = (kv(inputs[1]), kv(inputs[2]));
            attention(&one, &[&inputs[0][b * q_len..(b + 1) * q_len], &k, &v], values, scale);
        }
        return;
    }
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let d = a.head_dim;
    let group = a.group();
    let sc = f64::from(a.scale);
    let mut p = vec![0.0f64; a.seq_k];
    for b in 0..a.batch {
        for h in 0..a.heads_q {
            let kv_head = (b * a.heads_kv + h / group) * a.kv_rows() * d;
            for i in 0..a.seq_q {
                let qi = &q[((b * a.heads_q + h) * a.seq_q + i) * d..][..d];
                let seen = a.visible(i);
                let (mut max, mut sigma) = (f64::NEG_INFINITY, 0.0f64);
                for (j, pj) in p.iter_mut().enumerate().take(seen) {
                    let kj = &k[kv_head + j * d..][..d];
                    let (dot, mag) =
                        qi.iter().zip(kj).fold((0.0, 0.0), |(s, m), (x, y)| (s + x * y, m + (x * y).abs()));
                    *pj = sc * dot;
                    max = max.max(*pj);
                    sigma = sigma.max(sc.abs() * mag);
                }
                let sum: f64 = p[..seen]
                    .iter_mut()
                    .map(|pj| {
                        *pj = (*pj - max).exp();
                        *pj
                    })
                    .sum();
                for c in 0..d {
                    let col = |j: usize| v[kv_head + j * d + c];
                    let o = if seen == 0 { 0.0 } else { (0..seen).map(|j| p[j] * col(j)).sum::<f64>() / sum };
                    let mag = if seen == 0 {
                        0.0
                    } else {
                        (0..seen).map(|j| p[j] * (col(j).abs() + o.abs())).sum::<f64>() / sum
                    };
                    values.push(o);
                    scale.push(mag * (1.0 + sigma));
                }
            }
        }
    }
}

/// One row of [`Op::Slerp`]. The error scale of element `j` is
/// `|p·aⱼ| + |q·bⱼ| + 2·(|∂p/∂c|·|aⱼ| + |∂q/∂c|·|bⱼ|)`: the rounding of the
/// two products and the sum, and of the cosine (whose error, a few `ε·√cols`,
/// moves the coefficients by their derivatives; large near the fallback
/// thresholds, where the angle is ill-conditioned).
fn slerp(a: &[f64], b: &[f64], t: f64, values: &mut Vec<f64>, scale: &mut Vec<f64>) {
    let na2: f64 = a.iter().map(|x| x * x).sum();
    let nb2: f64 = b.iter().map(|x| x * x).sum();
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    match slerp_row(na2, nb2, dot, t) {
        SlerpRow::Lerp => {
            for (&x, &y) in a.iter().zip(b) {
                let v = lerp(x, y, t);
                values.push(v);
                scale.push(lerp_scale(x, y, t, v));
            }
        }
        SlerpRow::Nan => {
            values.extend(a.iter().map(|_| f64::NAN));
            scale.extend(a.iter().map(|_| 0.0));
        }
        SlerpRow::Arc { p, q, dp, dq } => {
            for (&x, &y) in a.iter().zip(b) {
                values.push(p * x + q * y);
                scale.push((p * x).abs() + (q * y).abs() + 2.0 * (dp.abs() * x.abs() + dq.abs() * y.abs()));
            }
        }
    }
}

fn rowwise(op: RowOp, row: &[f64], inputs: &[&[f64]], values: &mut Vec<f64>, scale: &mut Vec<f64>) {
    let n = row.len() as f64;
    match op {
        RowOp::Softmax | RowOp::LogSoftmax => {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
            for &x in row {
                if op == RowOp::Softmax {
                    let v = (x - max).exp() / sum;
                    values.push(v);
                    scale.push(v.abs());
                } else {
                    let v = x - max - sum.ln();
                    values.push(v);
                    // Rounding of x − max is relative to the row's magnitude.
                    scale.push(v.abs().max(x.abs()).max(max.abs()));
                }
            }
        }
        RowOp::LayerNorm { eps } => {
            let mean = row.iter().sum::<f64>() / n;
            let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
            let inv = 1.0 / (var + eps as f64).sqrt();
            let (gamma, beta) = (inputs[1], inputs[2]);
            for (j, &x) in row.iter().enumerate() {
                let g = gamma[j];
                let v = (x - mean) * inv * g + beta[j];
                values.push(v);
                // Normalised values are O(1); the error scales with |γ|·(|x|+|mean|)·inv.
                scale.push(v.abs() + g.abs() * (x.abs() + mean.abs()) * inv + beta[j].abs());
            }
        }
        RowOp::RmsNorm { eps } => {
            let ms = row.iter().map(|x| x * x).sum::<f64>() / n;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            let gamma = inputs[1];
            for (j, &x) in row.iter().enumerate() {
                let v = x * inv * gamma[j];
                values.push(v);
                scale.push(v.abs());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun table 7.1 / high-precision tables.
        let cases = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (-1.5, -0.966_105_146_475_310_7),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {} want {want}", erf(x));
        }
        assert_eq!(erf(40.0), 1.0);
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn matmul_reference_handles_transposes() {
        // A = [[1,2],[3,4]], B = [[5,6],[7,8]] → AB = [[19,22],[43,50]].
        let a = [1.0, 2.0, 3.0, 4.0];
        let at = [1.0, 3.0, 2.0, 4.0];
        let b = [5.0, 6.0, 7.0, 8.0];
        let bt = [5.0, 7.0, 6.0, 8.0];
        let want = [19.0, 22.0, 43.0, 50.0];
        let spec = crate::MatmulSpec::new(2, 2, 2);
        for (ta, tb, a, b) in
            [(false, false, &a, &b), (true, false, &at, &b), (false, true, &a, &bt), (true, true, &at, &bt)]
        {
            let op = Op::Matmul(crate::MatmulSpec { trans_a: ta, trans_b: tb, ..spec });
            assert_eq!(run(&op, &[a, b]).unwrap().values, want);
        }
    }

    #[test]
    fn matmul_reference_applies_the_epilogue() {
        // AB = [[19,22],[43,50]]; relu(0.5·AB − 2·C₀ + bias) with bias [−30, 1], C₀ = [[1,0],[0,10]].
        let (a, b) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let (bias, c0) = ([-30.0, 1.0], [1.0, 0.0, 0.0, 10.0]);
        let spec = crate::MatmulSpec::new(2, 2, 2).with_scales(0.5, -2.0).with_bias();
        let op = Op::Matmul(spec.with_activation(crate::Activation::Relu));
        assert_eq!(op.layout().unwrap().inputs().len(), 4);
        let r = run(&op, &[&a, &b, &bias, &c0]).unwrap();
        assert_eq!(r.values, [0.0, 12.0, 0.0, 6.0]);
        // Without the activation the first value is 9.5 − 2 − 30.
        let r = run(&Op::Matmul(spec), &[&a, &b, &bias, &c0]).unwrap();
        assert_eq!(r.values, [-22.5, 12.0, -8.5, 6.0]);
        assert_eq!(r.scale[0], 0.5 * 19.0 + 30.0 + 2.0);
    }
}

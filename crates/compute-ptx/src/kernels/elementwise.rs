//! Element-wise kernels: every unary op of the vocabulary, add/sub/mul and
//! the gated product of a SwiGLU block (`swish(a)·b`, the swish as the
//! unary kernel computes it, then one multiply).
//!
//! Memory-bound, so the shape is what matters: each thread walks a grid-stride
//! loop over units (a `float4`, or 8 halves in one 16-byte load when an operand
//! is `f16`/`bf16`), four independent units in flight per iteration
//! (`ld.global.nc.v4`), then a one-at-a-time loop for the last units and a
//! scalar tail. Parameters: `x` (or `a`, `b`), `y`, `n` (elements, u64) and,
//! for unary ops, two `f32` op parameters (`alpha`, the clip bounds or the
//! scale; unused ones are ignored). Every kernel exists per dtype
//! ([`elem`]); casts are the identity between two dtypes.

use super::{elem, math};
use crate::builder::{BuildError, Cmp, F32, Kernel, KernelBuilder, Reg, Target, U32, U64};
use compute_core::{BinaryOp, DType, GeluForm, UnaryOp};

/// Threads per block of every element-wise kernel.
pub const BLOCK: u32 = 256;
/// `float4`s each thread loads per main-loop iteration.
const UNROLL: u64 = 4;

/// Which element-wise kernel: the op with its parameters dropped (they are
/// kernel arguments, so one kernel serves every `alpha`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryKind {
    /// relu
    Relu,
    /// leaky_relu (`p0 = alpha`)
    LeakyRelu,
    /// elu (`p0 = alpha`)
    Elu,
    /// sigmoid
    Sigmoid,
    /// tanh
    Tanh,
    /// swish
    Swish,
    /// gelu, tanh form
    GeluTanh,
    /// gelu, erf form
    GeluErf,
    /// clip (`p0 = min`, `p1 = max`)
    Clip,
    /// scale (`p0 = s`)
    Scale,
}

impl UnaryKind {
    /// Every unary kernel.
    pub const ALL: [UnaryKind; 10] = [
        UnaryKind::Relu,
        UnaryKind::LeakyRelu,
        UnaryKind::Elu,
        UnaryKind::Sigmoid,
        UnaryKind::Tanh,
        UnaryKind::Swish,
        UnaryKind::GeluTanh,
        UnaryKind::GeluErf,
        UnaryKind::Clip,
        UnaryKind::Scale,
    ];

    /// The kernel for `op`, and its two `f32` parameters.
    pub fn of(op: UnaryOp) -> (UnaryKind, f32, f32) {
        match op {
            UnaryOp::Relu => (UnaryKind::Relu, 0.0, 0.0),
            UnaryOp::LeakyRelu { alpha } => (UnaryKind::LeakyRelu, alpha, 0.0),
            UnaryOp::Elu { alpha } => (UnaryKind::Elu, alpha, 0.0),
            UnaryOp::Sigmoid => (UnaryKind::Sigmoid, 0.0, 0.0),
            UnaryOp::Tanh => (UnaryKind::Tanh, 0.0, 0.0),
            UnaryOp::Swish => (UnaryKind::Swish, 0.0, 0.0),
            UnaryOp::Gelu(GeluForm::Tanh) => (UnaryKind::GeluTanh, 0.0, 0.0),
            UnaryOp::Gelu(GeluForm::Erf) => (UnaryKind::GeluErf, 0.0, 0.0),
            UnaryOp::Clip { min, max } => (UnaryKind::Clip, min, max),
            UnaryOp::Scale { s } => (UnaryKind::Scale, s, 0.0),
        }
    }

    /// Kernel name (`unary_gelu_tanh`).
    pub fn kernel_name(self) -> &'static str {
        match self {
            UnaryKind::Relu => "unary_relu",
            UnaryKind::LeakyRelu => "unary_leaky_relu",
            UnaryKind::Elu => "unary_elu",
            UnaryKind::Sigmoid => "unary_sigmoid",
            UnaryKind::Tanh => "unary_tanh",
            UnaryKind::Swish => "unary_swish",
            UnaryKind::GeluTanh => "unary_gelu_tanh",
            UnaryKind::GeluErf => "unary_gelu_erf",
            UnaryKind::Clip => "unary_clip",
            UnaryKind::Scale => "unary_scale",
        }
    }

    fn formula(self) -> &'static str {
        match self {
            UnaryKind::Relu => "y = max(x, 0), NaN kept (max.NaN)",
            UnaryKind::LeakyRelu => "y = x > 0 ? x : alpha*x",
            UnaryKind::Elu => "y = x > 0 ? x : alpha*expm1(x)",
            UnaryKind::Sigmoid => "y = 1/(1 + exp(-x))",
            UnaryKind::Tanh => "y = sign(x)*expm1(2|x|)/(expm1(2|x|) + 2)",
            UnaryKind::Swish => "y = x/(1 + exp(-x))",
            UnaryKind::GeluTanh => "y = x/(1 + exp(-2u)), u = sqrt(2/pi)*(x + 0.044715x^3)  (= 0.5x(1 + tanh u))",
            UnaryKind::GeluErf => {
                "y = x >= 0 ? x - x*erfc(x/sqrt2)/2 : x*erfc(|x|/sqrt2)/2  (= 0.5x(1 + erf(x/sqrt2)))"
            }
            UnaryKind::Clip => "y = min(max(x, lo), hi), NaN kept",
            UnaryKind::Scale => "y = s*x",
        }
    }
}

/// Emits `f(x)` of a kind without parameters (relu, sigmoid, tanh, swish,
/// the gelus) for one element: what fused epilogues reuse.
pub(crate) fn apply_unary(b: &mut KernelBuilder, kind: UnaryKind, x: Reg<F32>) -> Reg<F32> {
    apply(b, kind, x, x, x)
}

/// Emits `f(x)` for one element.
fn apply(b: &mut KernelBuilder, kind: UnaryKind, x: Reg<F32>, p0: Reg<F32>, p1: Reg<F32>) -> Reg<F32> {
    let minus_zero = -0.0f32;
    match kind {
        UnaryKind::Relu => b.max_nan(x, 0.0f32),
        UnaryKind::LeakyRelu => {
            let pos = b.setp(Cmp::Gt, x, 0.0f32);
            let neg = b.mul(x, p0);
            b.selp(x, neg, pos)
        }
        UnaryKind::Elu => {
            let pos = b.setp(Cmp::Gt, x, 0.0f32);
            let e = math::expm1(b, x);
            let neg = b.mul(e, p0);
            b.selp(x, neg, pos)
        }
        UnaryKind::Sigmoid => math::sigmoid(b, x),
        UnaryKind::Tanh => math::tanh(b, x),
        UnaryKind::Swish => {
            let nx = b.neg(x);
            let e = math::exp(b, nx);
            let d = b.add(e, 1.0f32);
            let y = math::div_by_ge1(b, x, d);
            let ninf = b.setp(Cmp::Eq, x, f32::NEG_INFINITY);
            b.selp(minus_zero, y, ninf)
        }
        UnaryKind::GeluTanh => {
            let c2 = (2.0 * (2.0 / std::f64::consts::PI).sqrt()) as f32;
            let x2 = b.mul(x, x);
            let k = b.fma(x2, 0.044_715f32, 1.0f32);
            let u = b.mul(x, c2);
            let u2 = b.mul(u, k);
            let nu = b.neg(u2);
            let e = math::exp(b, nu);
            let d = b.add(e, 1.0f32);
            let y = math::div_by_ge1(b, x, d);
            let ninf = b.setp(Cmp::Eq, x, f32::NEG_INFINITY);
            b.selp(minus_zero, y, ninf)
        }
        UnaryKind::GeluErf => {
            let ax = b.abs(x);
            let z = b.mul(ax, std::f32::consts::FRAC_1_SQRT_2);
            let e = math::erfc_nonneg(b, z);
            let h = b.mul(e, 0.5f32);
            let nx = b.neg(x);
            let yp = b.fma(nx, h, x);
            let yn = b.mul(x, h);
            let pos = b.setp(Cmp::Ge, x, 0.0f32);
            let y = b.selp(yp, yn, pos);
            // ±inf: erfc(inf) = 0 makes inf·0; the limits are +inf and −0.
            let inf_val = b.selp(x, minus_zero, pos);
            let isinf = b.setp(Cmp::Eq, ax, f32::INFINITY);
            b.selp(inf_val, y, isinf)
        }
        UnaryKind::Clip => {
            let lo = b.max_nan(x, p0);
            b.min_nan(lo, p1)
        }
        UnaryKind::Scale => b.mul(x, p0),
    }
}

/// The skeleton shared by unary, binary, cast and lerp kernels: the inputs
/// and the output, each with its storage dtype.
pub(super) struct Stream {
    pub(super) inputs: Vec<(Reg<U64>, DType)>,
    pub(super) y: (Reg<U64>, DType),
    pub(super) n: Reg<U64>,
}

impl Stream {
    /// Elements per vector unit ([`unit_width`]).
    fn width(&self) -> u64 {
        unit_width(self.y.1) as u64
    }
}

/// Elements per vector unit of a streaming kernel writing `output`: 4 when
/// it is `f32` (one 16-byte `float4` store per unit, so a warp's stores cover
/// 512 contiguous bytes; half inputs then load 8 bytes each), else 8 (one
/// 16-byte store of halves; an `f32` input loads two `float4`s). The launch
/// grid is sized with the same width.
pub fn unit_width(output: DType) -> usize {
    if output == DType::F32 { 4 } else { 8 }
}

/// Emits the value of one output element from the input elements.
pub(super) type ElementFn<'a> = dyn FnMut(&mut KernelBuilder, &[Reg<F32>]) -> Reg<F32> + 'a;

/// Applies `body` to each of `w` elements of every input.
fn map_unit(b: &mut KernelBuilder, ins: &[Vec<Reg<F32>>], w: usize, body: &mut ElementFn<'_>) -> Vec<Reg<F32>> {
    (0..w)
        .map(|c| {
            let xs: Vec<Reg<F32>> = ins.iter().map(|v| v[c]).collect();
            body(b, &xs)
        })
        .collect()
}

pub(super) fn stream_loop(b: &mut KernelBuilder, s: &Stream, body: &mut ElementFn<'_>) {
    let w = s.width();
    let wshift = w.trailing_zeros();
    let tid = b.global_index_x();
    let ntid = b.ntid(crate::builder::Dim::X);
    let nct = b.nctaid(crate::builder::Dim::X);
    let threads = b.mul(ntid, nct);
    let stride = b.cvt::<U64, U32>(threads);
    let i = b.cvt::<U64, U32>(tid);
    let units = b.shr(s.n, wshift);
    // Bytes per unit and per grid stride, for each operand's dtype.
    let unit_shift = |d: DType| wshift + elem::shift(d);
    let operands: Vec<(Reg<U64>, DType)> = s.inputs.iter().copied().chain([s.y]).collect();
    let mut steps = Vec::new();
    for &(_, d) in &operands {
        let st = b.shl(stride, unit_shift(d));
        steps.push(st);
    }

    let main = b.label("main");
    let one = b.label("one_at_a_time");
    let tail = b.label("scalar_tail");
    let done = b.label("done");

    // Main loop: UNROLL units per thread, all loads before any store.
    b.comment(&format!("main loop: {UNROLL} units of {w} elements per thread per iteration, grid-stride"));
    b.place(main);
    let last = b.mad(stride, UNROLL - 1, i);
    let past = b.setp(Cmp::Ge, last, units);
    b.bra_if(past, one);
    let mut addrs = Vec::new();
    for &(p, d) in &operands {
        let off = b.shl(i, unit_shift(d));
        addrs.push(b.add(p, off));
    }
    let mut vals: Vec<Vec<Vec<Reg<F32>>>> = Vec::new();
    for (k, &(_, d)) in s.inputs.iter().enumerate() {
        let mut per = Vec::new();
        let mut addr = addrs[k];
        for u in 0..UNROLL {
            if u > 0 {
                addr = b.add(addr, steps[k]);
            }
            per.push(elem::load(b, d, addr, 0, w as usize));
        }
        vals.push(per);
    }
    let mut outs = Vec::new();
    for u in 0..UNROLL as usize {
        let ins: Vec<Vec<Reg<F32>>> = vals.iter().map(|per| per[u].clone()).collect();
        outs.push(map_unit(b, &ins, w as usize, body));
    }
    let k = s.inputs.len();
    let mut yaddr = addrs[k];
    for (u, o) in outs.iter().enumerate() {
        if u > 0 {
            yaddr = b.add(yaddr, steps[k]);
        }
        elem::store(b, s.y.1, yaddr, 0, o);
    }
    let next = b.mad(stride, UNROLL, i);
    b.assign(i, next);
    b.bra(main);

    b.comment("remaining units, one per thread per iteration");
    b.place(one);
    let past = b.setp(Cmp::Ge, i, units);
    b.bra_if(past, tail);
    let mut addrs = Vec::new();
    for &(p, d) in &operands {
        let off = b.shl(i, unit_shift(d));
        addrs.push(b.add(p, off));
    }
    let ins: Vec<Vec<Reg<F32>>> =
        s.inputs.iter().enumerate().map(|(k, &(_, d))| elem::load(b, d, addrs[k], 0, w as usize)).collect();
    let o = map_unit(b, &ins, w as usize, body);
    elem::store(b, s.y.1, addrs[k], 0, &o);
    let next = b.add(i, stride);
    b.assign(i, next);
    b.bra(one);

    b.comment(&format!("the last n mod {w} elements, one per thread of the first threads"));
    b.place(tail);
    let tid64 = b.cvt::<U64, U32>(tid);
    let base = b.shl(units, wshift);
    let j = b.add(base, tid64);
    let out = b.setp(Cmp::Ge, j, s.n);
    b.bra_if(out, done);
    let mut addrs = Vec::new();
    for &(p, d) in &operands {
        let off = b.shl(j, elem::shift(d));
        addrs.push(b.add(p, off));
    }
    let xs: Vec<Reg<F32>> =
        s.inputs.iter().enumerate().map(|(k, &(_, d))| elem::load(b, d, addrs[k], 0, 1)[0]).collect();
    let y = body(b, &xs);
    elem::store(b, s.y.1, addrs[k], 0, &[y]);
    b.place(done);
    b.ret();
}

/// Name of the unary kernel for `dtype` (`unary_relu`, `unary_relu_bf16`).
pub fn unary_name(kind: UnaryKind, dtype: DType) -> String {
    format!("{}{}", kind.kernel_name(), elem::suffix(dtype))
}

/// Builds the kernel of one unary op on `dtype` (computed in `f32`).
pub fn unary(kind: UnaryKind, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = unary_name(kind, dtype);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: {}", kind.formula()));
    b.doc(&format!("params: x, y ({dtype} pointers), n (elements), p0, p1 (f32 op parameters)"));
    if dtype != DType::F32 {
        b.doc(&format!("{dtype} widened to f32 on load, rounded to nearest even on store"));
    }
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let n = b.param::<U64>("n");
    let p0 = b.param::<F32>("p0");
    let p1 = b.param::<F32>("p1");
    let s = Stream { inputs: vec![(x, dtype)], y: (y, dtype), n };
    stream_loop(&mut b, &s, &mut |b, xs| apply(b, kind, xs[0], p0, p1));
    b.finish()
}

/// Kernel name of a binary op on `dtype` (`binary_add`, `binary_add_f16`).
pub fn binary_name(op: BinaryOp, dtype: DType) -> String {
    let stem = match op {
        BinaryOp::Add => "binary_add",
        BinaryOp::Sub => "binary_sub",
        BinaryOp::Mul => "binary_mul",
        BinaryOp::SwiGlu => "binary_swiglu",
    };
    format!("{stem}{}", elem::suffix(dtype))
}

/// Builds the kernel of one binary op on `dtype` (computed in `f32`).
pub fn binary(op: BinaryOp, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = binary_name(op, dtype);
    let mut b = KernelBuilder::new(&name, target);
    let in_f32 = if dtype == DType::F32 { "" } else { " in f32, then to the dtype" };
    let formula = match op {
        BinaryOp::Add => format!("y = a + b, element-wise, correctly rounded{in_f32}"),
        BinaryOp::Sub => format!("y = a - b, element-wise, correctly rounded{in_f32}"),
        BinaryOp::Mul => format!("y = a * b, element-wise, correctly rounded{in_f32}"),
        BinaryOp::SwiGlu => format!("y = a/(1 + exp(-a)) * b (swish(a)*b), element-wise, within a few ulp{in_f32}"),
    };
    b.doc(&format!("{name}: {formula}"));
    b.doc(&format!("params: a, b, y ({dtype} pointers), n (elements)"));
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let a = b.param_ptr("a");
    let bb = b.param_ptr("b");
    let y = b.param_ptr("y");
    let n = b.param::<U64>("n");
    let s = Stream { inputs: vec![(a, dtype), (bb, dtype)], y: (y, dtype), n };
    stream_loop(&mut b, &s, &mut |b, xs| match op {
        BinaryOp::Add => b.add(xs[0], xs[1]),
        BinaryOp::Sub => b.sub(xs[0], xs[1]),
        BinaryOp::Mul => b.mul(xs[0], xs[1]),
        BinaryOp::SwiGlu => {
            // The unary swish (its exp and ±inf handling), then the product.
            let unused = xs[0];
            let s = apply(b, UnaryKind::Swish, xs[0], unused, unused);
            b.mul(s, xs[1])
        }
    });
    b.finish()
}

/// Kernel name of the gated product of fused gate/up rows (`glu_bf16`).
pub fn glu_name(dtype: DType) -> String {
    format!("glu{}", elem::suffix(dtype))
}

/// Builds the gated product of rows of `2·cols` values (gate, then up) on
/// `dtype`: `y[r, j] = swish(x[r, j])·x[r, cols + j]`, computed in `f32` as
/// the swiglu kernel computes it. Params: `x`, `y`, `n` (`rows·cols`),
/// `cols`. Launch: [`super::decoder::BLOCK`] threads, any grid.
pub fn glu(dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = glu_name(dtype);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: y[r, j] = swish(x[r, j]) * x[r, cols + j] over rows of 2*cols {dtype} values"));
    b.doc("params: x, y, n (rows*cols), cols");
    b.doc(&format!("launch: {} threads per block, any grid (grid-stride)", super::decoder::BLOCK));
    b.max_threads(super::decoder::BLOCK);
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let n = b.param::<U32>("n");
    let cols = b.param::<U32>("cols");
    let shift = elem::shift(dtype);
    super::decoder::grid_stride(&mut b, n, |b, g| {
        let r = b.div(g, cols);
        let j = b.rem(g, cols);
        let two = b.shl(cols, 1u32);
        let gi = b.mad(r, two, j);
        let gi = b.cvt::<U64, U32>(gi);
        let goff = b.shl(gi, shift);
        let ga = b.add(x, goff);
        let c64 = b.cvt::<U64, U32>(cols);
        let coff = b.shl(c64, shift);
        let ua = b.add(ga, coff);
        let gate = elem::load(b, dtype, ga, 0, 1)[0];
        let up = elem::load(b, dtype, ua, 0, 1)[0];
        let sw = apply(b, UnaryKind::Swish, gate, gate, gate);
        let v = b.mul(sw, up);
        let g64 = b.cvt::<U64, U32>(g);
        let yoff = b.shl(g64, shift);
        let ya = b.add(y, yoff);
        elem::store(b, dtype, ya, 0, &[v]);
    });
    b.finish()
}

/// Builds `round_tf32`: `f32` values rounded to nearest TF32 (10 mantissa
/// bits, ties away from zero, `cvt.rna.tf32.f32`), kept as `f32` whose low
/// 13 bits are zero; NaN and ±∞ stay. What a TF32 GEMM that reads its
/// operands as they are (`wgmma` truncates) runs first. Params: `x`, `y`,
/// `n` (elements). Launch: [`BLOCK`] threads per block, any grid (grid-stride).
pub fn round_tf32(target: Target) -> Result<Kernel, BuildError> {
    let name = "round_tf32";
    let mut b = KernelBuilder::new(name, target);
    b.doc(&format!("{name}: y = x rounded to nearest TF32 (cvt.rna.tf32.f32), as f32"));
    b.doc("params: x, y (f32 pointers), n (elements)");
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let n = b.param::<U64>("n");
    let s = Stream { inputs: vec![(x, DType::F32)], y: (y, DType::F32), n };
    stream_loop(&mut b, &s, &mut |b, xs| {
        let bits = b.bitcast::<crate::builder::B32, F32>(xs[0]);
        let r = b.round_to_tf32(bits);
        b.bitcast::<F32, crate::builder::B32>(r)
    });
    b.finish()
}

/// Kernel name of a cast (`cast_f32_bf16`).
pub fn cast_name(from: DType, to: DType) -> String {
    format!("cast_{}_{}", from.as_str(), to.as_str())
}

/// Builds the cast from `from` to `to`: widened exactly to `f32`, then rounded
/// to nearest even (so `f16` to `bf16` rounds once, as a direct conversion
/// would); NaN stays NaN.
pub fn cast(from: DType, to: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = cast_name(from, to);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: y = ({to}) x, round to nearest even, NaN stays NaN"));
    b.doc(&format!("params: x ({from} pointer), y ({to} pointer), n (elements)"));
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let n = b.param::<U64>("n");
    let s = Stream { inputs: vec![(x, from)], y: (y, to), n };
    stream_loop(&mut b, &s, &mut |_, xs| xs[0]);
    b.finish()
}

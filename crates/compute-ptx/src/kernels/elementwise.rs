//! Element-wise kernels: every unary op of the vocabulary and add/sub/mul.
//!
//! Memory-bound, so the shape is what matters: each thread walks a grid-stride
//! loop over `float4`s, four independent 16-byte loads in flight per iteration
//! (`ld.global.nc.v4`), then a one-at-a-time loop for the last `float4`s and a
//! scalar tail of `n mod 4` elements. Parameters: `x` (or `a`, `b`), `y`, `n`
//! (elements, u64) and, for unary ops, two `f32` op parameters (`alpha`, the
//! clip bounds or the scale; unused ones are ignored).

use super::math;
use crate::builder::{BuildError, Cmp, F32, Kernel, KernelBuilder, Reg, Src, Target, U32, U64};
use compute_core::{BinaryOp, GeluForm, UnaryOp};

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

/// The skeleton shared by unary and binary kernels: `loads` reads the inputs at
/// a byte offset (vector or scalar), `body` maps them to outputs.
struct Stream {
    inputs: Vec<Reg<U64>>,
    y: Reg<U64>,
    n: Reg<U64>,
}

/// Emits the value of one output element from the input elements.
type ElementFn<'a> = dyn FnMut(&mut KernelBuilder, &[Reg<F32>]) -> Reg<F32> + 'a;

fn stream_loop(b: &mut KernelBuilder, s: &Stream, body: &mut ElementFn<'_>) {
    let tid = b.global_index_x();
    let ntid = b.ntid(crate::builder::Dim::X);
    let nct = b.nctaid(crate::builder::Dim::X);
    let threads = b.mul(ntid, nct);
    let stride = b.cvt::<U64, U32>(threads);
    let i = b.cvt::<U64, U32>(tid);
    let n4 = b.shr(s.n, 2u32);
    let step_bytes = b.shl(stride, 4u32);

    let main = b.label("main");
    let one = b.label("one_at_a_time");
    let tail = b.label("scalar_tail");
    let done = b.label("done");

    // Main loop: UNROLL float4s per thread, all loads before any store.
    b.comment(&format!("main loop: {UNROLL} float4 per thread per iteration, grid-stride"));
    b.place(main);
    let last = b.mad(stride, UNROLL - 1, i);
    let past = b.setp(Cmp::Ge, last, n4);
    b.bra_if(past, one);
    let off = b.shl(i, 4u32);
    let mut outs = Vec::new();
    let mut vals: Vec<Vec<[Reg<F32>; 4]>> = Vec::new();
    for &p in &s.inputs {
        let base = b.add(p, off);
        let mut per = Vec::new();
        let mut addr = base;
        for u in 0..UNROLL {
            if u > 0 {
                addr = b.add(addr, step_bytes);
            }
            per.push(b.ld_global_nc_v::<F32, 4>(addr, 0));
        }
        vals.push(per);
    }
    for u in 0..UNROLL as usize {
        let mut lanes = Vec::new();
        for c in 0..4 {
            let ins: Vec<Reg<F32>> = vals.iter().map(|per| per[u][c]).collect();
            lanes.push(Src::from(body(b, &ins)));
        }
        outs.push([lanes[0], lanes[1], lanes[2], lanes[3]]);
    }
    let mut yaddr = b.add(s.y, off);
    for (u, o) in outs.into_iter().enumerate() {
        if u > 0 {
            yaddr = b.add(yaddr, step_bytes);
        }
        b.st_global_v::<F32, 4>(yaddr, 0, o);
    }
    let next = b.mad(stride, UNROLL, i);
    b.assign(i, next);
    b.bra(main);

    b.comment("remaining float4s, one per thread per iteration");
    b.place(one);
    let past = b.setp(Cmp::Ge, i, n4);
    b.bra_if(past, tail);
    let off = b.shl(i, 4u32);
    let ins: Vec<[Reg<F32>; 4]> = s
        .inputs
        .iter()
        .map(|&p| {
            let a = b.add(p, off);
            b.ld_global_nc_v::<F32, 4>(a, 0)
        })
        .collect();
    let mut lanes = Vec::new();
    for c in 0..4 {
        let xs: Vec<Reg<F32>> = ins.iter().map(|v| v[c]).collect();
        lanes.push(Src::from(body(b, &xs)));
    }
    let ya = b.add(s.y, off);
    b.st_global_v::<F32, 4>(ya, 0, [lanes[0], lanes[1], lanes[2], lanes[3]]);
    let next = b.add(i, stride);
    b.assign(i, next);
    b.bra(one);

    b.comment("the last n mod 4 elements, one per thread of the first threads");
    b.place(tail);
    let tid64 = b.cvt::<U64, U32>(tid);
    let base = b.shl(n4, 2u32);
    let j = b.add(base, tid64);
    let out = b.setp(Cmp::Ge, j, s.n);
    b.bra_if(out, done);
    let off = b.shl(j, 2u32);
    let xs: Vec<Reg<F32>> = s
        .inputs
        .iter()
        .map(|&p| {
            let a = b.add(p, off);
            b.ld_global_nc::<F32>(a, 0)
        })
        .collect();
    let y = body(b, &xs);
    let ya = b.add(s.y, off);
    b.st_global(ya, 0, y);
    b.place(done);
    b.ret();
}

/// Builds the kernel of one unary op.
pub fn unary(kind: UnaryKind, target: Target) -> Result<Kernel, BuildError> {
    let mut b = KernelBuilder::new(kind.kernel_name(), target);
    b.doc(&format!("{}: {}", kind.kernel_name(), kind.formula()));
    b.doc("params: x, y (f32 pointers), n (elements), p0, p1 (op parameters)");
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let n = b.param::<U64>("n");
    let p0 = b.param::<F32>("p0");
    let p1 = b.param::<F32>("p1");
    let s = Stream { inputs: vec![x], y, n };
    stream_loop(&mut b, &s, &mut |b, xs| apply(b, kind, xs[0], p0, p1));
    b.finish()
}

/// Kernel name of a binary op (`binary_add`).
pub fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "binary_add",
        BinaryOp::Sub => "binary_sub",
        BinaryOp::Mul => "binary_mul",
    }
}

/// Builds the kernel of one binary op.
pub fn binary(op: BinaryOp, target: Target) -> Result<Kernel, BuildError> {
    let mut b = KernelBuilder::new(binary_name(op), target);
    b.doc(&format!(
        "{}: y = a {} b, element-wise, correctly rounded",
        binary_name(op),
        match op {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
        }
    ));
    b.doc("params: a, b, y (f32 pointers), n (elements)");
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let a = b.param_ptr("a");
    let bb = b.param_ptr("b");
    let y = b.param_ptr("y");
    let n = b.param::<U64>("n");
    let s = Stream { inputs: vec![a, bb], y, n };
    stream_loop(&mut b, &s, &mut |b, xs| match op {
        BinaryOp::Add => b.add(xs[0], xs[1]),
        BinaryOp::Sub => b.sub(xs[0], xs[1]),
        BinaryOp::Mul => b.mul(xs[0], xs[1]),
    });
    b.finish()
}

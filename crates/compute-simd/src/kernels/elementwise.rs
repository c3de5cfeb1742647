//! Element-wise unary and binary ops: one pass over the data in 16-lane
//! blocks on the chosen ISA, split across the pool above
//! [`PAR_ELEMENTWISE_MIN`] / [`PAR_TRANSCENDENTAL_MIN`] elements, with
//! streaming stores for outputs of [`STREAM_MIN`] elements or more.
//! Accuracy of the transcendentals: see [`crate::simd::math`].

use compute_core::{Activation, BinaryOp, GeluForm, UnaryOp};

use super::par;
use crate::isa::Isa;
use crate::simd::{LaneFn, SimdF32, WithSimd, blocks, dispatch, math};
use crate::tuning::{PAR_ELEMENTWISE_MIN, PAR_TRANSCENDENTAL_MIN, STREAM_MIN};

/// `out[i] = op(x[i])` over `min(x.len(), out.len())` elements (the backend
/// validates that they are equal). Memory-bound except for the
/// transcendentals, which cost a few dozen vector instructions per 16 elements.
pub fn unary(isa: Isa, op: UnaryOp, x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let (x, out) = (x.split_at(n).0, out.split_at_mut(n).0);
    let min_len = if op.is_transcendental() { PAR_TRANSCENDENTAL_MIN } else { PAR_ELEMENTWISE_MIN };
    let stream = n >= STREAM_MIN;
    par::zip1(x, out, min_len, |x, out| dispatch(isa, Unary { op, x, out, stream }));
}

/// `out[i] = a[i] op b[i]` over the shortest length (the backend validates
/// that they are equal). Memory-bound: one pass, 12 bytes per element.
pub fn binary(isa: Isa, op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    let n = a.len().min(b.len()).min(out.len());
    let (a, b, out) = (a.split_at(n).0, b.split_at(n).0, out.split_at_mut(n).0);
    let stream = n >= STREAM_MIN;
    par::zip2(a, b, out, PAR_ELEMENTWISE_MIN, |a, b, out| dispatch(isa, Binary { op, a, b, out, stream }));
}

struct Unary<'a> {
    op: UnaryOp,
    x: &'a [f32],
    out: &'a mut [f32],
    stream: bool,
}

impl WithSimd for Unary<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Unary { op, x, out, stream } = self;
        with_unary(s, op, Map1 { x, out, stream });
        if stream {
            s.fence();
        }
    }
}

/// A loop that applies one [`LaneFn`] of `N` vectors: lets loops outside this
/// module (the fused half-precision loops of [`crate::halves`]) run the same
/// lane functions as the `f32` kernels, so their results match bit for bit.
pub(crate) trait LaneLoop<S: SimdF32, const N: usize> {
    /// What the loop returns.
    type Output;
    /// Runs the loop with `f`. Implementations must be `#[inline(always)]`
    /// (see [`LaneFn`]).
    fn run(self, s: S, f: &impl LaneFn<S, N>) -> Self::Output;
}

/// Runs `l` with the lane function of `op`: one loop per op, the `match`
/// outside it.
#[inline(always)]
pub(crate) fn with_unary<S: SimdF32, L: LaneLoop<S, 1>>(s: S, op: UnaryOp, l: L) -> L::Output {
    match op {
        UnaryOp::Relu => l.run(s, &UnaryFn::<RELU>(0.0, 0.0)),
        UnaryOp::LeakyRelu { alpha } => l.run(s, &UnaryFn::<LEAKY_RELU>(alpha, 0.0)),
        UnaryOp::Elu { alpha } => l.run(s, &UnaryFn::<ELU>(alpha, 0.0)),
        UnaryOp::Sigmoid => l.run(s, &UnaryFn::<SIGMOID>(0.0, 0.0)),
        UnaryOp::Tanh => l.run(s, &UnaryFn::<TANH>(0.0, 0.0)),
        UnaryOp::Swish => l.run(s, &UnaryFn::<SWISH>(0.0, 0.0)),
        UnaryOp::Gelu(GeluForm::Tanh) => l.run(s, &UnaryFn::<GELU_TANH>(0.0, 0.0)),
        UnaryOp::Gelu(GeluForm::Erf) => l.run(s, &UnaryFn::<GELU_ERF>(0.0, 0.0)),
        UnaryOp::Clip { min, max } => l.run(s, &UnaryFn::<CLIP>(min, max)),
        UnaryOp::Scale { s: k } => l.run(s, &UnaryFn::<SCALE>(k, 0.0)),
    }
}

/// [`with_unary`] for the activations of a matmul epilogue (relu, gelu in
/// both forms, silu as swish): the same lane functions, compiled for these
/// four only ([`crate::gemm::epilogue`]).
#[inline(always)]
pub(crate) fn with_activation<S: SimdF32, L: LaneLoop<S, 1>>(s: S, a: Activation, l: L) -> L::Output {
    match a {
        Activation::Relu => l.run(s, &UnaryFn::<RELU>(0.0, 0.0)),
        Activation::Gelu(GeluForm::Tanh) => l.run(s, &UnaryFn::<GELU_TANH>(0.0, 0.0)),
        Activation::Gelu(GeluForm::Erf) => l.run(s, &UnaryFn::<GELU_ERF>(0.0, 0.0)),
        Activation::Silu => l.run(s, &UnaryFn::<SWISH>(0.0, 0.0)),
    }
}

/// [`with_unary`] for the cheap ops (all but the transcendentals); hands `l`
/// back for the others, so that a loop that only wants the cheap ones is not
/// compiled for every transcendental as well. Only the x86-64 fused loops use it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn with_cheap_unary<S: SimdF32, L: LaneLoop<S, 1>>(s: S, op: UnaryOp, l: L) -> Result<L::Output, L> {
    match op {
        UnaryOp::Relu => Ok(l.run(s, &UnaryFn::<RELU>(0.0, 0.0))),
        UnaryOp::LeakyRelu { alpha } => Ok(l.run(s, &UnaryFn::<LEAKY_RELU>(alpha, 0.0))),
        UnaryOp::Clip { min, max } => Ok(l.run(s, &UnaryFn::<CLIP>(min, max))),
        UnaryOp::Scale { s: k } => Ok(l.run(s, &UnaryFn::<SCALE>(k, 0.0))),
        _ => Err(l),
    }
}

/// Runs `l` with the lane function of `op`.
#[inline(always)]
pub(crate) fn with_binary<S: SimdF32, L: LaneLoop<S, 2>>(s: S, op: BinaryOp, l: L) -> L::Output {
    match op {
        BinaryOp::Add => l.run(s, &BinaryFn::<ADD>),
        BinaryOp::Sub => l.run(s, &BinaryFn::<SUB>),
        BinaryOp::Mul => l.run(s, &BinaryFn::<MUL>),
        BinaryOp::SwiGlu => l.run(s, &BinaryFn::<SWIGLU>),
    }
}

/// [`blocks::map1`] as a [`LaneLoop`].
struct Map1<'a> {
    x: &'a [f32],
    out: &'a mut [f32],
    stream: bool,
}

impl<S: SimdF32> LaneLoop<S, 1> for Map1<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self, s: S, f: &impl LaneFn<S, 1>) {
        blocks::map1(s, self.x, self.out, self.stream, f)
    }
}

/// [`blocks::map2`] as a [`LaneLoop`].
struct Map2<'a> {
    a: &'a [f32],
    b: &'a [f32],
    out: &'a mut [f32],
    stream: bool,
}

impl<S: SimdF32> LaneLoop<S, 2> for Map2<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self, s: S, f: &impl LaneFn<S, 2>) {
        blocks::map2(s, self.a, self.b, self.out, self.stream, f)
    }
}

const RELU: u8 = 0;
const LEAKY_RELU: u8 = 1;
const ELU: u8 = 2;
const SIGMOID: u8 = 3;
const TANH: u8 = 4;
const SWISH: u8 = 5;
const GELU_TANH: u8 = 6;
const GELU_ERF: u8 = 7;
const CLIP: u8 = 8;
const SCALE: u8 = 9;

/// Unary op number `OP` with its up to two parameters; the `match` on the
/// constant disappears at compile time, leaving one loop per op.
#[derive(Clone, Copy, Debug)]
struct UnaryFn<const OP: u8>(f32, f32);

impl<S: SimdF32, const OP: u8> LaneFn<S, 1> for UnaryFn<OP> {
    #[inline(always)]
    fn apply(&self, s: S, [v]: [S::V; 1]) -> S::V {
        let zero = s.splat(0.0);
        match OP {
            // max(0, x) returns x when x is NaN.
            RELU => s.max(zero, v),
            LEAKY_RELU => s.select(s.gt(v, zero), v, s.mul(s.splat(self.0), v)),
            ELU => math::elu(s, v, self.0),
            SIGMOID => math::sigmoid(s, v),
            TANH => math::tanh(s, v),
            SWISH => math::swish(s, v),
            GELU_TANH => math::gelu_tanh(s, v),
            GELU_ERF => math::gelu_erf(s, v),
            // Both return their second operand for NaN, so NaN propagates.
            CLIP => s.min(s.splat(self.1), s.max(s.splat(self.0), v)),
            _ => s.mul(s.splat(self.0), v),
        }
    }
}

struct Binary<'a> {
    op: BinaryOp,
    a: &'a [f32],
    b: &'a [f32],
    out: &'a mut [f32],
    stream: bool,
}

impl WithSimd for Binary<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Binary { op, a, b, out, stream } = self;
        with_binary(s, op, Map2 { a, b, out, stream });
        if stream {
            s.fence();
        }
    }
}

const ADD: u8 = 0;
const SUB: u8 = 1;
const MUL: u8 = 2;
const SWIGLU: u8 = 3;

/// Binary op number `OP`.
#[derive(Clone, Copy, Debug)]
struct BinaryFn<const OP: u8>;

impl<S: SimdF32, const OP: u8> LaneFn<S, 2> for BinaryFn<OP> {
    #[inline(always)]
    fn apply(&self, s: S, [a, b]: [S::V; 2]) -> S::V {
        match OP {
            ADD => s.add(a, b),
            SUB => s.sub(a, b),
            SWIGLU => s.mul(math::swish(s, a), b),
            _ => s.mul(a, b),
        }
    }
}

#[cfg(test)]
mod tests;

//! A matmul's [`Epilogue`] on the CPU: `C = act(alpha·P + beta·C₀ + bias)`
//! applied to the `f32` product `P` as the GEMM finishes each block of `C`.
//!
//! The GEMMs apply it on the thread that computed each part of `C`, right
//! after its last depth block: [`super::sgemm`] to strips of
//! [`GEMM_EPILOGUE_ROWS`] rows of a block of packed `B` panels (at most
//! [`GEMM_NC`] columns: 96 KiB, in L2), and to whole blocks where `B` is
//! read in place (at most [`GEMM_INPLACE_B_MAX_M`] rows);
//! [`super::bf16::gemm`] to whole blocks of at most [`GEMM_MC`] ×
//! [`super::bf16::NC`] values; both to the few rows of a product of dot
//! products. So the epilogue adds no fork–join and no pass over `C` in
//! memory: it reads and writes values just written, reads `C₀` where
//! `beta ≠ 0`, and computes in 16-lane vectors on the ISA's path. A half `C₀` is widened row piece by row piece into a
//! stack buffer; a half bias is widened once per call (`n` values).
//!
//! The values are computed in the order [`Epilogue::apply_f32`] documents:
//! `alpha·p`, then `beta·c₀` added by a fused multiply-add, then the bias,
//! then the activation through the same lane functions as the element-wise
//! kernels (relu, gelu in both forms, silu as swish).
//!
//! [`GEMM_MC`]: crate::tuning::GEMM_MC
//! [`GEMM_NC`]: crate::tuning::GEMM_NC
//! [`GEMM_EPILOGUE_ROWS`]: crate::tuning::GEMM_EPILOGUE_ROWS
//! [`GEMM_INPLACE_B_MAX_M`]: crate::tuning::GEMM_INPLACE_B_MAX_M

use std::borrow::Cow;

use compute_core::{BackendKind, ComputeError, Epilogue, HostSlice, MatmulSpec, Op, Result};

use super::kernel::MatMut;
use crate::halves::{convert, range};
use crate::isa::Isa;
use crate::kernels::elementwise::{LaneLoop, with_activation};
use crate::simd::{Block, LANES, LaneFn, SimdF32, WithSimd, dispatch};

/// Values of `C₀` widened at a time (a 4 KiB stack buffer).
const PIECE: usize = 1024;

/// A matmul's epilogue with its inputs, as [`super::sgemm`] and
/// [`super::bf16::gemm`] apply it: the bias widened to `f32` and `C₀` as
/// given (`f32` or half, of the whole batch). Cheap to build: widening a
/// half bias costs one pass over its `n` values and an allocation.
#[derive(Clone, Debug)]
pub struct EpilogueArgs<'a> {
    epilogue: Epilogue,
    bias: Option<Cow<'a, [f32]>>,
    c0: Option<HostSlice<'a>>,
}

impl<'a> EpilogueArgs<'a> {
    /// The plain product: nothing is applied. Free.
    pub fn none() -> Self {
        EpilogueArgs { epilogue: Epilogue::default(), bias: None, c0: None }
    }

    /// The epilogue of `spec` with its inputs: `extra` holds the op's inputs
    /// after `A` and `B` (the bias when [`Epilogue::bias`], then `C₀` when
    /// [`Epilogue::reads_c`]), each `f32`, `f16` or `bf16`. A typed error
    /// naming the op when one is missing (`Shape`), or shorter than the op
    /// needs (`n` values of bias, `batch·m·n` of `C₀`) or of another dtype
    /// (`UnsupportedDType`).
    pub fn new(isa: Isa, spec: &MatmulSpec, extra: &[HostSlice<'a>]) -> Result<Self> {
        let e = spec.epilogue;
        let op = Op::Matmul(*spec);
        let mut next = extra.iter().copied();
        let mut take = |what: &str, len: usize| -> Result<HostSlice<'a>> {
            match next.next() {
                Some(x)
                    if x.len() >= len && matches!(x, HostSlice::F32(_) | HostSlice::F16(_) | HostSlice::BF16(_)) =>
                {
                    Ok(range(x, 0, len))
                }
                Some(x) => Err(ComputeError::unsupported_dtype(
                    &op,
                    BackendKind::Simd,
                    x.dtype(),
                    format!("the epilogue's {what} must hold {len} f32, f16 or bf16 values; got {}", x.len()),
                )),
                None => Err(ComputeError::shape(op.name(), format!("the epilogue reads a {what}"), op.shapes())),
            }
        };
        let bias = if e.bias {
            Some(match take("bias", spec.n)? {
                HostSlice::F32(b) => Cow::Borrowed(b),
                half => {
                    let mut wide = vec![0.0; spec.n];
                    widen(isa, half, &mut wide);
                    Cow::Owned(wide)
                }
            })
        } else {
            None
        };
        let c0 = if e.reads_c() {
            Some(take("C₀", spec.batch.saturating_mul(spec.m).saturating_mul(spec.n))?)
        } else {
            None
        };
        Ok(EpilogueArgs { epilogue: e, bias, c0 })
    }

    /// Whether nothing is applied ([`Epilogue::is_identity`]).
    pub fn is_identity(&self) -> bool {
        self.epilogue.is_identity()
    }

    /// The epilogue of product `i` of a batch of `m × n` products (`None`
    /// for the identity): its `C₀` cut out of the batch's. Free.
    pub(crate) fn product(&self, i: usize, m: usize, n: usize) -> Option<Finish<'_>> {
        if self.is_identity() {
            return None;
        }
        let len = m.saturating_mul(n);
        Some(Finish {
            epilogue: self.epilogue,
            bias: self.bias.as_deref().map(Cow::Borrowed),
            c0: self.c0.map(|c| range(c, i.saturating_mul(len), len)),
            ld: n,
        })
    }
}

/// The epilogue of one product: bias values by column (of the product as
/// the GEMM computes it, see [`Finish::transposed`]) and `C₀` row-major
/// with row stride `ld`.
#[derive(Clone, Debug)]
pub(crate) struct Finish<'a> {
    epilogue: Epilogue,
    bias: Option<Cow<'a, [f32]>>,
    c0: Option<HostSlice<'a>>,
    ld: usize,
}

impl Finish<'_> {
    /// The same epilogue for a one-column `m × 1` product computed as the
    /// one-row `1 × m` product of the transposes: `C₀` has the same memory,
    /// and every element takes the one bias value. Allocates `m` values when
    /// there is a bias.
    pub(crate) fn transposed(&self, m: usize) -> Self {
        let bias = self.bias.as_ref().map(|b| Cow::Owned(vec![b.first().copied().unwrap_or(0.0); m]));
        Finish { epilogue: self.epilogue, bias, c0: self.c0, ld: m }
    }

    /// Applies the epilogue to the block `c` of the product whose first
    /// element is at `(i0, j0)`, on the calling thread. Costs one read and
    /// write of the block and one read of its `C₀` (widened when half), plus
    /// the activation's arithmetic (a few dozen vector instructions per 16
    /// values for gelu and silu).
    pub(crate) fn apply(&self, isa: Isa, (i0, j0): (usize, usize), c: &mut MatMut<'_>) {
        let bias = self.bias.as_deref().map(|b| b.get(j0..).unwrap_or_default());
        let c0 = self.c0.map(|x| from(x, i0 * self.ld + j0));
        dispatch(isa, Rows { isa, epilogue: self.epilogue, c, c0, ld: self.ld, bias });
    }
}

/// The rows of one block of `C` with their `C₀` (from the block's first
/// element, row stride `ld`) and bias (from its first column).
struct Rows<'a, 'v> {
    isa: Isa,
    epilogue: Epilogue,
    c: &'a mut MatMut<'v>,
    c0: Option<HostSlice<'a>>,
    ld: usize,
    bias: Option<&'a [f32]>,
}

impl WithSimd for Rows<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        match self.epilogue.activation {
            Some(a) => with_activation(s, a, self),
            None => LaneLoop::<S, 1>::run(self, s, &Identity),
        }
    }
}

impl<S: SimdF32> LaneLoop<S, 1> for Rows<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn run(self, s: S, act: &impl LaneFn<S, 1>) {
        let Rows { isa, epilogue, c, c0, ld, bias } = self;
        let mut buf = [0.0f32; PIECE];
        for r in 0..c.rows() {
            let row = c.row_mut(r);
            for (p, piece) in row.chunks_mut(PIECE).enumerate() {
                let at = p * PIECE;
                let len = piece.len();
                let c0 = c0.map(|x| widened(isa, range(x, r * ld + at, len), &mut buf));
                let bias = bias.map(|b| b.get(at..).unwrap_or_default());
                lanes(s, &epilogue, piece, c0, bias, act);
            }
        }
    }
}

/// `x[i] = act(alpha·x[i] + beta·c0[i] + bias[i])` over `x`, 16 lanes at a
/// time and a zero-padded block for the tail (a missing or short `c0` or
/// `bias` reads as zeros).
#[inline(always)]
fn lanes<S: SimdF32>(
    s: S,
    e: &Epilogue,
    x: &mut [f32],
    c0: Option<&[f32]>,
    bias: Option<&[f32]>,
    act: &impl LaneFn<S, 1>,
) {
    let (alpha, beta) = (s.splat(e.alpha), s.splat(e.beta));
    let (body, tail) = x.as_chunks_mut::<LANES>();
    let whole = body.len();
    for (i, xi) in body.iter_mut().enumerate() {
        s.store(xi, one(s, (alpha, beta), s.load(xi), block(c0, i), block(bias, i), act));
    }
    if !tail.is_empty() {
        let (c, b) = (padded(c0, whole), padded(bias, whole));
        let mut v = [0.0f32; LANES];
        v[..tail.len()].copy_from_slice(tail);
        let y = one(s, (alpha, beta), s.load(&v), c.as_ref(), b.as_ref(), act);
        s.store(&mut v, y);
        tail.copy_from_slice(&v[..tail.len()]);
    }
}

/// `act(alpha·v + beta·c + b)` on one vector (`c`, `b` left out when `None`).
/// A function rather than a closure: forced inlining keeps it inside the
/// ISA's `#[target_feature]` entry ([`LaneFn`]).
#[inline(always)]
fn one<S: SimdF32>(
    s: S,
    (alpha, beta): (S::V, S::V),
    v: S::V,
    c: Option<&Block>,
    b: Option<&Block>,
    act: &impl LaneFn<S, 1>,
) -> S::V {
    let mut v = s.mul(alpha, v);
    if let Some(c) = c {
        v = s.fma(beta, s.load(c), v);
    }
    if let Some(b) = b {
        v = s.add(v, s.load(b));
    }
    act.apply(s, [v])
}

/// The values of `y` from block `whole` on, in a zero-padded block.
#[inline(always)]
fn padded(y: Option<&[f32]>, whole: usize) -> Option<Block> {
    y.map(|y| {
        let mut b = [0.0f32; LANES];
        for (d, &v) in b.iter_mut().zip(y.get(whole * LANES..).unwrap_or_default()) {
            *d = v;
        }
        b
    })
}

/// Block `i` of `y`, if `y` holds it whole.
#[inline(always)]
fn block(y: Option<&[f32]>, i: usize) -> Option<&Block> {
    <&Block>::try_from(y?.get(i * LANES..(i + 1) * LANES)?).ok()
}

/// The activation of an epilogue without one.
struct Identity;

impl<S: SimdF32> LaneFn<S, 1> for Identity {
    #[inline(always)]
    fn apply(&self, _: S, [v]: [S::V; 1]) -> S::V {
        v
    }
}

/// `x` from element `at` on (empty past its end).
fn from(x: HostSlice<'_>, at: usize) -> HostSlice<'_> {
    range(x, at, x.len().saturating_sub(at))
}

/// `x` as `f32` values: itself, or widened into `buf` (at most its length).
fn widened<'b>(isa: Isa, x: HostSlice<'b>, buf: &'b mut [f32]) -> &'b [f32] {
    match x {
        HostSlice::F32(s) => s,
        half => widen(isa, half, buf),
    }
}

/// The values of a half `x` widened into `dst` (as many as both hold); the
/// filled part of `dst`.
fn widen<'b>(isa: Isa, x: HostSlice<'_>, dst: &'b mut [f32]) -> &'b [f32] {
    let n = x.len().min(dst.len());
    let dst = &mut dst[..n];
    match x {
        HostSlice::F16(s) => convert::widen(isa, s, dst),
        HostSlice::BF16(s) => convert::widen(isa, s, dst),
        HostSlice::F32(s) => dst.copy_from_slice(s.get(..n).unwrap_or_default()),
        _ => dst.fill(f32::NAN),
    }
    dst
}

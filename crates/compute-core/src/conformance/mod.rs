//! The conformance suite: written once, run by every backend.
//!
//! Each backend crate adds one line to its tests:
//!
//! ```text
//! compute_core::conformance_tests!(|| compute_simd::SimdBackend::new(), compute_core::conformance::Config::from_env());
//! ```
//!
//! which expands to one `#[test]` per [`Group`]. Every group draws fresh random
//! inputs from a new seed on each run (printed, and replayable with
//! `COMPUTE_TEST_SEED`), never zeros; poisons the output before each call so an
//! unwritten element fails; and compares every element with the float64
//! reference of [`crate::reference`] under the per-op [`tolerance`].
//!
//! Every op runs at every dtype ([`dtype_variants`]): on `f32`, `f16` and
//! `bf16` data drawn in that dtype (so every input is exactly representable),
//! and matmuls also with half inputs into an `f32` output and in TF32
//! precision. A backend must support the dtypes its [`Config::dtypes`] lists;
//! for the others, an op it declines ([`Backend::supports`]) must fail with a
//! typed error and an untouched output, and is counted as skipped.
//!
//! Set `COMPUTE_CONFORMANCE=large` for the large sizes (GPU machine runs).
//! A backend listed in `COMPUTE_REQUIRE` (comma-separated `simd,wgpu,cuda`) must
//! be available: if it is not, the tests fail instead of skipping.
//!
//! # Special values
//!
//! Every backend treats NaN, ±∞, ±0 and subnormals as the float64 reference
//! does ([`Group::SpecialValues`] checks it for every element-wise op,
//! reduction, row op and matmul, on every dtype), and the reference follows
//! PyTorch:
//!
//! - NaN in, NaN out: an element-wise op of a NaN is NaN (relu and clip
//!   included), a sum, max or dot with a NaN term is NaN, a row op of a row
//!   holding a NaN is NaN on the whole row (a NaN in a norm's `γ` or `β`
//!   only in its column), a matmul output is NaN where its row of `a` or
//!   column of `b` holds one.
//! - ±∞ in element-wise ops gives the mathematical limit: `relu(−∞) = 0`,
//!   `sigmoid(−∞) = 0`, `tanh(±∞) = ±1`, `elu(−∞) = −α`,
//!   `gelu(−∞) = swish(−∞) = −0` (PyTorch's formulas give NaN for the last
//!   two: `−∞·0`).
//! - Elsewhere ±∞ follows IEEE arithmetic: `∞ − ∞` and `0·∞` are NaN. So a
//!   sum with both infinities is NaN, `max` of a vector holding `+∞` is `+∞`,
//!   a softmax or log_softmax row holding `+∞`, or only `−∞`, is NaN
//!   (`x − max`), a `−∞` element of an otherwise finite row gives 0 (softmax)
//!   or `−∞` (log_softmax), a layer norm row holding `±∞` is NaN, an RMS norm
//!   row holding `±∞` is 0 where finite and NaN at the infinity.
//! - ±0 and subnormals are ordinary values. A GPU may flush subnormal
//!   operands or results to zero; the tolerances' absolute slack (the
//!   smallest normal `f32`) covers that wherever the exact result is itself
//!   that small; add, sub, mul, scale, sums, dot products, `max` and
//!   rms_norm stay exact on every backend. A subnormal times ∞ is where a
//!   flush shows (`0·∞` is NaN): the group never multiplies the two.

mod cases;
mod interpolation;
mod replay;
mod special;
/// The seeded generator the suite draws its inputs from (see [`crate::rng`]).
pub use crate::rng;

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{BackendKind, ComputeError};
use crate::host::{HostSlice, HostVec};
use crate::op::{BinaryOp, Op, Precision, ReduceOp, RowOp, UnaryOp};
use crate::reference;
pub use cases::{cases, dtype_variants};
pub use replay::{GroupReport, run_group_async};
use rng::Rng;

/// Which sizes the suite runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Odd and medium sizes that run in seconds on a CPU or lavapipe.
    Small,
    /// Adds sizes that fill a real GPU (matmul 1024+, 16M-element vectors).
    Large,
}

/// How the suite runs for one backend.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Sizes to run.
    pub scale: Scale,
    /// Multiplies every tolerance (1.0 for full-precision f32 backends).
    pub tolerance_factor: f64,
    /// Dtypes the backend must support on every op: an op of one of them
    /// that [`Backend::supports`] declines is a failure. Ops of other dtypes
    /// that it declines are skipped (and must fail with a typed error).
    pub dtypes: &'static [DType],
}

impl Config {
    /// Small sizes unless `COMPUTE_CONFORMANCE=large`; `f32` required.
    pub fn from_env() -> Self {
        let scale = match std::env::var("COMPUTE_CONFORMANCE").as_deref() {
            Ok("large") => Scale::Large,
            _ => Scale::Small,
        };
        Config { scale, tolerance_factor: 1.0, dtypes: &[DType::F32] }
    }

    /// Same, requiring every op on each of `dtypes` (see [`Config::dtypes`]).
    pub fn with_dtypes(self, dtypes: &'static [DType]) -> Self {
        Config { dtypes, ..self }
    }
}

/// Whether `kind` is listed in `COMPUTE_REQUIRE`, so its absence is a failure.
pub fn required(kind: BackendKind) -> bool {
    std::env::var("COMPUTE_REQUIRE")
        .map(|v| v.split(',').any(|s| s.trim() == kind.as_str() || s.trim() == "all"))
        .unwrap_or(false)
}

/// The test groups, one `#[test]` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Every unary element-wise op.
    Unary,
    /// add, sub, mul.
    Binary,
    /// sum, max, dot.
    Reductions,
    /// softmax, log_softmax, layer_norm, rms_norm.
    Rows,
    /// matmul with every transpose combination.
    Matmul,
    /// Batched matmul.
    BatchedMatmul,
    /// Matmuls with epilogues: bias, `alpha`/`beta` with `C₀`, relu, gelu
    /// and silu, alone and together, on every transpose and batches.
    MatmulEpilogue,
    /// conv2d with strides and padding.
    Conv2d,
    /// Fused attention: causal masks both ways, grouped-query heads, decode
    /// shapes, odd lengths and head sizes, queries that see no key, scores
    /// of large magnitude.
    Attention,
    /// Casts between every pair of dtypes: bit-exact rounding.
    Casts,
    /// lerp and slerp: odd lengths and row shapes, exact ends (`t` = 0, 1),
    /// zero, parallel, anti-parallel and non-finite rows, IEEE specials,
    /// out-of-range `t`.
    Interpolation,
    /// Block-quantized weights: quantized matmuls of every weight format
    /// with activations and outputs of every float dtype (one row, a few,
    /// past the GEMV paths; weight row counts that are not a multiple of any
    /// tile), quantizing casts (bit for bit against ggml's reference
    /// quantizers) and dequantizing casts (exact).
    Quantized,
    /// The ops a transformer decoder adds: rotary embeddings, strided copies
    /// (KV-cache appends, transposes), embedding lookups, argmax.
    Decoder,
    /// Extreme finite inputs (−0, huge, tiny and subnormal values, the
    /// thresholds where exponentials overflow), and casts of every special
    /// value (NaN and ±∞ included) between every pair of dtypes.
    EdgeValues,
    /// NaN, ±∞, ±0 and subnormal inputs in every element-wise op, reduction,
    /// row op and matmul, on every dtype: NaN in gives NaN out (as PyTorch),
    /// ±∞ gives the mathematical limit or, through arithmetic, what IEEE
    /// arithmetic gives (see [the rules](crate::conformance#special-values)).
    SpecialValues,
    /// Bad shapes give a typed error and leave the output untouched.
    Errors,
    /// Device-resident tensors: upload, a chain of ops, download.
    Tensors,
}

impl Group {
    /// Every group, in the order the test macro lists them.
    pub const ALL: [Group; 16] = [
        Group::Unary,
        Group::Binary,
        Group::Reductions,
        Group::Rows,
        Group::Matmul,
        Group::BatchedMatmul,
        Group::MatmulEpilogue,
        Group::Conv2d,
        Group::Attention,
        Group::Casts,
        Group::Interpolation,
        Group::Quantized,
        Group::Decoder,
        Group::EdgeValues,
        Group::Errors,
        Group::Tensors,
    ];
}

/// Error bound of one op: an output `y` passes against reference `r` with error
/// scale `s` when `|y − r| ≤ abs + rel·|r| + cond·s`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute slack (covers flushed subnormals).
    pub abs: f64,
    /// Relative to the reference value.
    pub rel: f64,
    /// Relative to the error scale (`Σ|terms|` for sums and products).
    pub cond: f64,
}

const EPS: f64 = f32::EPSILON as f64;
const TINY: f64 = f32::MIN_POSITIVE as f64;

/// The stated tolerance of every op, which every backend must meet:
///
/// | op | bound |
/// |---|---|
/// | relu, leaky_relu, clip, scale, add, sub, mul | `rel = 2⁻²³` (≈ 1 ulp), plus the half ulp every op gets for rounding the reference to f32 |
/// | sigmoid, tanh, swish, elu, gelu | `abs = 1e-6`, `rel = 1e-5` |
/// | sum, dot | `cond = ε·(8 + 2√n)` of `Σ|terms|` |
/// | max | exact |
/// | softmax, log_softmax | `abs = 1e-7`, `rel = 1e-5 + 2ε√cols`, `cond = 2ε√cols` |
/// | layer_norm, rms_norm | `rel = 1e-5`, `cond = ε·(16 + 2√cols)` |
/// | matmul, conv2d | `cond = ε·(8 + 2√k)` of `Σₖ|aᵢₖ·bₖⱼ|` |
/// | matmul in TF32 | adds `cond = 2⁻¹⁰` (both operands rounded to 10 mantissa bits) |
/// | matmul with an epilogue | the same of `|alpha|·Σₖ|aᵢₖ·bₖⱼ| + |beta·c₀| + |bias|` (times 1.13 under an activation, its largest slope); a gelu or silu adds `abs = 1e-6`, `rel = 1e-5` |
/// | cast | exact: the reference rounded to the target dtype, bit for bit |
/// | lerp | `rel = 2⁻²³`, `cond = 2⁻²²` of `min(|t|, |1−t|)·|b − a|`; exact at `t = 0` and `t = 1` |
/// | slerp | `cond = ε·(16 + 2√cols)` of `|p·aⱼ| + |q·bⱼ| + 2(|∂p/∂c|·|aⱼ| + |∂q/∂c|·|bⱼ|)` (`p`, `q` the coefficients, `c` the cosine; see [`reference`](mod@crate::reference)); rows that fall back to lerp: the same of the lerp's scale; exact at `t = 0` and `t = 1` |
/// | attention | `cond = ε·(8 + 2√head_dim + 2√seq_k)` of the reference's scale (see [`reference`](mod@crate::reference)); on `f16`/`bf16` adds `2u` of the input dtype (the softmax weights are rounded to it); in TF32 adds `2⁻⁹` |
/// | quant_matmul | `(max_l |xᵢₗ| / 254)·Σₗ|Wⱼₗ| + 2⁻¹⁸·Σₗ|xᵢₗ·Wⱼₗ|` against the product with the dequantized weights: the activations may be rounded to 8-bit integers per block (the reference's scale is this bound, `cond = 1`); with an epilogue, `|alpha|` times it plus `2⁻²¹` of `|alpha·p| + |beta·c₀| + |bias|` (times 1.13 under an activation; a gelu or silu adds `abs = 1e-6`, `rel = 1e-5`) |
/// | cast to a quantized dtype | exact: the bytes ggml's reference quantizer writes |
/// | swiglu | as the transcendental unary ops |
/// | rope | `cond = 2⁻²⁰` of `(1 + |a|)·(|x₁| + |x₂|)`, `a` the pair's angle (its `f32` rounding) |
/// | copy, gather, argmax | exact (a copy leaves every element outside its view untouched) |
///
/// Ops on `f16` and `bf16` compute in `f32`, so the bound above holds for
/// them too, plus the rounding of the stored result: `u·|r|` with `u` the
/// output dtype's unit roundoff (2⁻²⁴ for `f32`, 2⁻¹¹ for `f16`, 2⁻⁸ for
/// `bf16`) and half of its smallest subnormal in absolute terms.
pub fn tolerance(op: &Op) -> Tolerance {
    let sqrt = |n: usize| (n as f64).sqrt();
    match *op {
        Op::Unary { op, .. } if op.is_transcendental() => Tolerance { abs: 1e-6, rel: 1e-5, cond: 0.0 },
        Op::Binary { op, .. } if op.is_transcendental() => Tolerance { abs: 1e-6, rel: 1e-5, cond: 0.0 },
        Op::Glu { .. } => Tolerance { abs: 1e-6, rel: 1e-5, cond: 0.0 },
        Op::Unary { .. } | Op::Binary { .. } => Tolerance { abs: TINY, rel: EPS, cond: 0.0 },
        Op::Rope(_) => Tolerance { abs: TINY, rel: 0.0, cond: 2f64.powi(-20) },
        Op::Copy(_) | Op::Gather { .. } | Op::ArgMax { .. } => Tolerance { abs: 0.0, rel: 0.0, cond: 0.0 },
        Op::Reduce { op: ReduceOp::Max, .. } => Tolerance { abs: 0.0, rel: 0.0, cond: 0.0 },
        Op::Reduce { len, .. } | Op::Dot { len, .. } => {
            Tolerance { abs: TINY, rel: 0.0, cond: EPS * (8.0 + 2.0 * sqrt(len)) }
        }
        Op::Rows { op: RowOp::Softmax | RowOp::LogSoftmax, cols, .. } => {
            Tolerance { abs: 1e-7, rel: 1e-5 + 2.0 * EPS * sqrt(cols), cond: 2.0 * EPS * sqrt(cols) }
        }
        Op::Rows { cols, .. } => Tolerance { abs: TINY, rel: 1e-5, cond: EPS * (16.0 + 2.0 * sqrt(cols)) },
        Op::Matmul(s) => {
            let tf32 = if s.precision == Precision::Tf32 && s.dtype == DType::F32 { 2f64.powi(-10) } else { 0.0 };
            let cond = EPS * (8.0 + 2.0 * sqrt(s.k)) + tf32;
            match s.epilogue.activation {
                Some(a) if a.unary().is_transcendental() => Tolerance { abs: 1e-6, rel: 1e-5, cond },
                _ => Tolerance { abs: TINY, rel: 0.0, cond },
            }
        }
        Op::QuantMatmul(s) => match s.epilogue.activation {
            Some(a) if a.unary().is_transcendental() => Tolerance { abs: 1e-6, rel: 1e-5, cond: 1.0 },
            _ if s.glu => Tolerance { abs: 1e-6, rel: 1e-5, cond: 1.0 },
            _ => Tolerance { abs: TINY, rel: 0.0, cond: 1.0 },
        },
        Op::Cast { .. } => Tolerance { abs: 0.0, rel: 0.0, cond: 0.0 },
        Op::Lerp { .. } => Tolerance { abs: TINY, rel: EPS, cond: 2.0 * EPS },
        Op::Slerp { cols, .. } => Tolerance { abs: TINY, rel: 0.0, cond: EPS * (16.0 + 2.0 * sqrt(cols)) },
        Op::Conv2d(c) => Tolerance { abs: TINY, rel: 0.0, cond: EPS * (8.0 + 2.0 * sqrt(c.c_in * c.kh * c.kw)) },
        Op::Attention(a) => {
            let weights = match a.dtype {
                DType::F32 if a.precision == Precision::Tf32 => 2f64.powi(-9),
                DType::F32 => 0.0,
                d => 2.0 * d.unit_roundoff(),
            };
            let cond = EPS * (8.0 + 2.0 * sqrt(a.head_dim) + 2.0 * sqrt(a.seq_k)) + weights;
            Tolerance { abs: TINY, rel: 0.0, cond }
        }
    }
}

/// The poison written to outputs before each call: a NaN with a payload no
/// arithmetic produces, so an element the backend never wrote is caught.
pub const POISON: f32 = f32::from_bits(0x7fc0_dead);

/// The poison of each dtype, as bits: quiet NaNs with payloads no arithmetic
/// or conversion produces (for quantized blocks, a byte).
pub fn poison_bits(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 0x7ead,
        DType::BF16 => 0x7fed,
        // Quantized blocks: every byte 0xad (compared byte by byte).
        d if d.is_quantized() => 0xad,
        _ => POISON.to_bits(),
    }
}

/// A poisoned output buffer of `len` elements of `dtype`.
pub fn poisoned(dtype: DType, len: usize) -> HostVec {
    HostVec::filled_bits(dtype, len, poison_bits(dtype))
}

/// Compares an `f32` output with the reference of `op` on `f32` inputs;
/// returns a description of the first few mismatches, or `None` when every
/// element passes.
pub fn compare(op: &Op, inputs: &[&[f32]], out: &[f32], factor: f64) -> Option<String> {
    let views: Vec<HostSlice<'_>> = inputs.iter().map(|x| HostSlice::F32(x)).collect();
    compare_typed(op, &views, HostSlice::F32(out), factor)
}

/// Compares `out` with the reference of `op` on `inputs`, all of any dtype,
/// under [`tolerance`] plus the rounding of `out`'s dtype.
pub fn compare_typed(op: &Op, inputs: &[HostSlice<'_>], out: HostSlice<'_>, factor: f64) -> Option<String> {
    if let Some(blocks) = out.blocks() {
        return compare_blocks(op, inputs, blocks);
    }
    let r = match reference::run_typed(op, inputs) {
        Ok(r) => r,
        Err(e) => return Some(format!("reference rejected the op: {e}")),
    };
    let tol = tolerance(op);
    let dtype = out.dtype();
    let poison = poison_bits(dtype);
    let bits = out.bits();
    let exact = matches!(op, Op::Cast { .. } | Op::Copy(_) | Op::Gather { .. } | Op::ArgMax { .. });
    let mut bad = Vec::new();
    let mut count = 0usize;
    for (i, ((y, b), (&want, &scale))) in
        out.to_f64().into_iter().zip(bits).zip(r.values.iter().zip(&r.scale)).enumerate()
    {
        let why = if scale == reference::UNTOUCHED {
            (b != poison).then_some("written outside the op's view")
        } else if b == poison {
            Some("never written")
        } else {
            mismatch(y, want, scale, tol, factor, dtype, exact)
        };
        if let Some(why) = why {
            count += 1;
            if bad.len() < 5 {
                bad.push(format!("[{i}] got {y:e} want {want:e} ({why})"));
            }
        }
    }
    (count > 0).then(|| format!("{count} of {} elements wrong: {}", out.len(), bad.join("; ")))
}

/// A quantizing cast's output against the bytes ggml's reference quantizer
/// writes for the same (widened) values: exact.
fn compare_blocks(op: &Op, inputs: &[HostSlice<'_>], out: crate::host::Blocks<'_>) -> Option<String> {
    let Some(x) = inputs.first() else {
        return Some("a quantizing cast without an input".into());
    };
    let mut want = vec![0u8; out.bytes().len()];
    if let Err(e) = out.format().quantize(&x.to_f32(), &mut want) {
        return Some(format!("reference rejected the op: {e}"));
    }
    let per = out.dtype().size_in_bytes().max(1);
    let bad: Vec<usize> = want
        .chunks(per)
        .zip(out.bytes().chunks(per))
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i)
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "{} of {} {} blocks differ from ggml's reference quantizer (first: {:?}) in {}",
            bad.len(),
            want.len() / per,
            out.dtype(),
            &bad[..bad.len().min(5)],
            op.shapes()
        )
    })
}

fn mismatch(
    y: f64,
    want: f64,
    scale: f64,
    tol: Tolerance,
    factor: f64,
    dtype: DType,
    exact: bool,
) -> Option<&'static str> {
    if want.is_nan() {
        return (!y.is_nan()).then_some("expected NaN");
    }
    if y.is_nan() {
        return Some("unexpected NaN");
    }
    // The value the output dtype stores for the reference; a finite reference
    // beyond the dtype's range rounds to ±Inf.
    let stored = dtype.round(want);
    if exact {
        return (y.to_bits() != stored.to_bits()).then_some("not the correctly rounded value");
    }
    if want.is_infinite() {
        return (y != want).then_some("expected the same infinity");
    }
    let u = dtype.unit_roundoff();
    // Half the smallest subnormal of the output dtype: the absolute rounding floor.
    let floor = match dtype {
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        _ => 0.0,
    };
    let bound = factor * (tol.abs + tol.rel * want.abs() + tol.cond * scale) + u * want.abs() + floor;
    if y.is_infinite() {
        // Within the tolerance of the dtype's overflow threshold a result may
        // round either way: an infinity passes when the reference moved by the
        // bound toward it rounds to that same infinity.
        let edge = dtype.round(want + bound.copysign(y));
        let why = if stored.is_infinite() { "expected the same infinity" } else { "unexpected infinity" };
        return (edge != y).then_some(why);
    }
    // A finite result for a reference that overflows the dtype passes when
    // within the bound (the same slack, from the other side).
    ((y - want).abs() > bound).then_some(if stored.is_infinite() {
        "expected the same infinity"
    } else {
        "outside tolerance"
    })
}

/// Random inputs for `op`: values spread over the range where the op is
/// interesting, never all zeros.
pub fn inputs_for(op: &Op, rng: &mut Rng) -> Vec<Vec<f32>> {
    let layout = match op.layout() {
        Ok(l) => l,
        Err(_) => return Vec::new(),
    };
    let lens: Vec<usize> = layout.input_lens().collect();
    match op {
        Op::Unary { op, len, .. } => {
            let wide = op.is_transcendental();
            vec![
                (0..*len)
                    .map(|_| match rng.below(10) {
                        0 if wide => rng.uniform(-100.0, 100.0),
                        1 | 2 if wide => rng.uniform(-20.0, 20.0),
                        _ => rng.uniform(-5.0, 5.0),
                    })
                    .collect(),
            ]
        }
        Op::Binary { .. } | Op::Dot { .. } | Op::Lerp { .. } => {
            vec![rng.vec(lens[0], -4.0, 4.0), rng.vec(lens[1], -4.0, 4.0)]
        }
        Op::Slerp { .. } => vec![rng.vec(lens[0], -2.0, 2.0), rng.vec(lens[1], -2.0, 2.0)],
        Op::Reduce { .. } => vec![rng.vec(lens[0], -3.0, 5.0)],
        Op::Rows { op, .. } => {
            let x = rng.vec(lens[0], -6.0, 6.0);
            match op {
                RowOp::Softmax | RowOp::LogSoftmax => vec![x],
                RowOp::LayerNorm { .. } => vec![x, rng.vec(lens[1], 0.5, 1.5), rng.vec(lens[2], -1.0, 1.0)],
                RowOp::RmsNorm { .. } => vec![x, rng.vec(lens[1], 0.5, 1.5)],
            }
        }
        Op::Attention(a) if a.positions => {
            let mut v: Vec<Vec<f32>> = lens[..3].iter().map(|&n| rng.vec(n, -1.0, 1.0)).collect();
            v.push(attention_positions(a, rng));
            v
        }
        Op::Matmul(_) | Op::Conv2d(_) | Op::Attention(_) => lens.iter().map(|&n| rng.vec(n, -1.0, 1.0)).collect(),
        Op::QuantMatmul(s) => {
            let mut v = vec![rng.vec(lens[0], -1.0, 1.0), weight_rows(s.n, s.k, rng)];
            if s.rms_norm.is_some() {
                v.push(rng.vec(lens[2], 0.5, 1.5));
            }
            v.extend(lens[v.len()..].iter().map(|&n| rng.vec(n, -1.0, 1.0)));
            v
        }
        // Into a cache, the rows the positions pick (some not a row: nothing written).
        Op::Rope(r) if r.positions => match r.cache {
            Some(capacity) => vec![rng.vec(lens[0], -4.0, 4.0), copy_positions(r.seq, capacity, rng)],
            None => vec![rng.vec(lens[0], -4.0, 4.0), (0..r.seq).map(|_| rng.below(20_000) as f32).collect()],
        },
        Op::Copy(c) => match c.positions {
            Some(slots) => vec![rng.vec(lens[0], -4.0, 4.0), copy_positions(c.shape[1], slots, rng)],
            None => vec![rng.vec(lens[0], -4.0, 4.0)],
        },
        Op::Rope(_) => vec![rng.vec(lens[0], -4.0, 4.0)],
        Op::ArgMax { .. } | Op::Glu { .. } => vec![rng.vec(lens[0], -4.0, 4.0)],
        Op::Gather { ids, rows, .. } => {
            let mut picks: Vec<f32> = (0..*ids).map(|_| rng.below(*rows) as f32).collect();
            // One id outside the table, when there are a few: its row is NaN.
            if *ids >= 3 {
                picks[ids / 2] = [-1.0, *rows as f32, 0.5][rng.below(3)];
            }
            vec![rng.vec(lens[0], -4.0, 4.0), picks]
        }
        Op::Cast { len, .. } => vec![(0..*len).map(|_| cast_input(rng)).collect()],
    }
}

/// Positions of `n` tokens in a destination of `slots`: distinct slots in
/// random order, and, when there are a few, one that is skipped (−1, past
/// the end, or not whole).
fn copy_positions(n: usize, slots: usize, rng: &mut Rng) -> Vec<f32> {
    let mut free: Vec<usize> = (0..slots).collect();
    let mut picks: Vec<f32> = (0..n.min(slots))
        .map(|_| {
            let i = rng.below(free.len());
            free.swap_remove(i) as f32
        })
        .collect();
    picks.resize(n, -1.0);
    if n >= 3 {
        picks[n / 2] = [-1.0, slots as f32, 0.5][rng.below(3)];
    }
    picks
}

/// Query positions of a [`AttentionSpec::with_positions`](crate::AttentionSpec::with_positions)
/// op: per batch element consecutive positions whose last lies anywhere
/// from −1 (no key) to `seq_k` (clamped to `seq_k − 1`).
fn attention_positions(a: &crate::AttentionSpec, rng: &mut Rng) -> Vec<f32> {
    let mut v = Vec::with_capacity(a.batch * a.seq_q);
    for _ in 0..a.batch {
        let last = rng.below(a.seq_k + 2) as i64 - 1;
        v.extend((0..a.seq_q).map(|i| (last - (a.seq_q - 1 - i) as i64) as f32));
    }
    v
}

/// A value that exercises a cast: ordinary values, values past `f16`'s range
/// and inside its subnormals, and exact ties of `f16` and `bf16` rounding.
fn cast_input(rng: &mut Rng) -> f32 {
    let x = rng.uniform(-8.0, 8.0);
    match rng.below(6) {
        0 => rng.uniform(-70_000.0, 70_000.0),
        1 => x * 2f32.powi(-20),                               // f16 subnormals
        2 => f32::from_bits((x.to_bits() & !0x1fff) | 0x1000), // halfway between two f16 values
        3 => f32::from_bits((x.to_bits() & !0xffff) | 0x8000), // halfway between two bf16 values
        _ => x,
    }
}

/// Weight rows for a quantized matmul: each row at its own scale (1e-3 to
/// 1e3), some all positive, an outlier in some, an all-zero row when there
/// are more than two.
fn weight_rows(n: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    let mut w = Vec::with_capacity(n * k);
    for j in 0..n {
        let scale = 10f64.powi(rng.below(7) as i32 - 3);
        let (lo, hi) = if rng.below(4) == 0 { (0.0, scale) } else { (-scale, scale) };
        let start = w.len();
        w.extend((0..k).map(|_| if n > 2 && j == n / 2 { 0.0 } else { rng.uniform(lo, hi) }));
        if rng.below(3) == 0 {
            let at = start + rng.below(k);
            w[at] *= 20.0;
        }
    }
    w
}

/// Random inputs for `op`, each in its operand's dtype: the values of
/// [`inputs_for`], rounded (or quantized) to it, so each is exactly
/// representable there.
pub fn typed_inputs_for(op: &Op, rng: &mut Rng) -> Vec<HostVec> {
    let dtypes: Vec<DType> = match op.layout() {
        Ok(l) => l.inputs().iter().map(|o| o.dtype).collect(),
        Err(_) => return Vec::new(),
    };
    inputs_for(op, rng).into_iter().zip(dtypes).map(|(v, d)| HostVec::from_f32(d, &v)).collect()
}

/// Runs `op` on `backend` with typed inputs and a poisoned output of the op's
/// output dtype, and compares; `Err` describes the failure.
pub fn check_op_typed(backend: &dyn Backend, op: &Op, inputs: &[HostVec], factor: f64) -> Result<(), String> {
    let layout = op.layout().map_err(|e| e.to_string())?;
    let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
    let mut out = poisoned(op.out_dtype(), layout.output_len());
    backend
        .run_typed(op, &views, out.as_mut())
        .map_err(|e| format!("{} {}: returned error: {e}", op.name(), op.shapes()))?;
    match compare_typed(op, &views, out.as_slice(), factor) {
        None => Ok(()),
        Some(msg) => Err(format!("{} {} {:?}: {msg}", op.name(), op.shapes(), op)),
    }
}

/// Checks an op `backend` declines: it must fail with a typed error
/// (`Unsupported` or `UnsupportedDType`) and leave the output untouched.
fn check_declined(backend: &dyn Backend, op: &Op, rng: &mut Rng) -> Result<(), String> {
    let inputs = typed_inputs_for(op, rng);
    let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
    let len = op.layout().map_err(|e| e.to_string())?.output_len();
    let mut out = poisoned(op.out_dtype(), len);
    let result = backend.run_typed(op, &views, out.as_mut());
    let untouched = out.bits().iter().all(|&b| b == poison_bits(op.out_dtype()));
    match result {
        Err(ComputeError::Unsupported { .. } | ComputeError::UnsupportedDType { .. }) if untouched => Ok(()),
        other => Err(format!(
            "{} {}: declined by supports() but run_typed gave {other:?} (output untouched: {untouched})",
            op.name(),
            op.shapes()
        )),
    }
}

/// Runs `op` on `backend` with poisoned output and compares; `Err` describes the failure.
pub fn check_op(backend: &dyn Backend, op: &Op, inputs: &[Vec<f32>], factor: f64) -> Result<(), String> {
    let layout = op.layout().map_err(|e| e.to_string())?;
    let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![POISON; layout.output_len()];
    backend.run(op, &refs, &mut out).map_err(|e| format!("{} {}: returned error: {e}", op.name(), op.shapes()))?;
    match compare(op, &refs, &out, factor) {
        None => Ok(()),
        Some(msg) => Err(format!("{} {} {:?}: {msg}", op.name(), op.shapes(), op)),
    }
}

/// Checks the async names of every op family ([`crate::AsyncOps`]) against the
/// blocking ones on `backend`: a unary, binary, dot, sum, max, softmax, layer
/// and RMS norm and matmul call through each must give bit-identical outputs,
/// and a call with a wrong output length must fail with `Shape` and leave the
/// output untouched. The futures are driven by [`crate::async_ops::block_on`]
/// (native only). `Err` lists every difference.
#[cfg(not(target_arch = "wasm32"))]
pub fn check_async_ops<B: crate::AsyncOps>(backend: &B, rng: &mut Rng) -> Result<(), String> {
    use crate::Ops;
    use crate::async_ops::block_on;
    let mut failures = Vec::new();
    let mut same = |name: &str, sync: crate::Result<Vec<f32>>, fut: crate::Result<Vec<f32>>| match (sync, fut) {
        (Ok(a), Ok(b)) if a.iter().map(|v| v.to_bits()).eq(b.iter().map(|v| v.to_bits())) => {}
        (a, b) => failures.push(format!("{name}: blocking {a:?} vs async {b:?}")),
    };
    let (rows, cols) = (7, 129);
    let n = rows * cols;
    let x = rng.vec(n, -3.0, 3.0);
    let y = rng.vec(n, -3.0, 3.0);
    let gamma = rng.vec(cols, 0.5, 1.5);
    let beta = rng.vec(cols, -0.5, 0.5);
    // The output of `f` on a poisoned buffer of `len` elements.
    let run_len = |len: usize, f: &dyn Fn(&mut [f32]) -> crate::Result<()>| {
        let mut out = vec![POISON; len];
        f(&mut out).map(|()| out)
    };
    let run = |f: &dyn Fn(&mut [f32]) -> crate::Result<()>| run_len(n, f);
    same("gelu", run(&|o| backend.gelu(&x, o)), run(&|o| block_on(backend.gelu_async(&x, o))));
    same("relu", run(&|o| backend.relu(&x, o)), run(&|o| block_on(backend.relu_async(&x, o))));
    same("sub", run(&|o| backend.sub(&x, &y, o)), run(&|o| block_on(backend.sub_async(&x, &y, o))));
    same(
        "softmax",
        run(&|o| backend.softmax(&x, rows, cols, o)),
        run(&|o| block_on(backend.softmax_async(&x, rows, cols, o))),
    );
    same(
        "layer_norm",
        run(&|o| backend.layer_norm(&x, &gamma, &beta, rows, cols, 1e-5, o)),
        run(&|o| block_on(backend.layer_norm_async(&x, &gamma, &beta, rows, cols, 1e-5, o))),
    );
    same(
        "rms_norm",
        run(&|o| backend.rms_norm(&x, &gamma, rows, cols, 1e-5, o)),
        run(&|o| block_on(backend.rms_norm_async(&x, &gamma, rows, cols, 1e-5, o))),
    );
    let scalar = |v: crate::Result<f32>| v.map(|s| vec![s]);
    same("dot", scalar(backend.dot(&x, &y)), scalar(block_on(backend.dot_async(&x, &y))));
    same("sum", scalar(backend.sum(&x)), scalar(block_on(backend.sum_async(&x))));
    same("max", scalar(backend.max(&x)), scalar(block_on(backend.max_async(&x))));
    let (m, k, nn) = (rows, cols, 33);
    let b = rng.vec(k * nn, -1.0, 1.0);
    same(
        "matmul",
        run_len(m * nn, &|o| backend.matmul(&x, &b, o, m, k, nn)),
        run_len(m * nn, &|o| block_on(backend.matmul_async(&x, &b, o, m, k, nn))),
    );
    let mut short = vec![POISON; n - 1];
    match block_on(backend.add_async(&x, &y, &mut short)) {
        Err(ComputeError::Shape { .. }) if short.iter().all(|v| v.to_bits() == POISON.to_bits()) => {}
        other => failures.push(format!("add_async into a short output: {other:?}, output written: {}", {
            short.iter().any(|v| v.to_bits() != POISON.to_bits())
        })),
    }
    if failures.is_empty() { Ok(()) } else { Err(failures.join("\n")) }
}

/// Runs one group against a backend; panics with every failure and the seed.
/// `make` returns the backend, or an error when it is not available here: then
/// the group is skipped loudly, unless [`required`] says it must run. An
/// `Unsupported` error means the backend exists but this variant of it cannot
/// run on this machine (an instruction-set path the CPU lacks): skipped loudly
/// even when the backend is required.
pub fn run_group<B: Backend>(make: impl FnOnce() -> crate::Result<B>, kind: BackendKind, group: Group, cfg: Config) {
    let backend = match make() {
        Ok(b) => b,
        Err(e @ ComputeError::Unsupported { .. }) => {
            eprintln!("SKIPPED: {kind} conformance group {group:?}: not on this machine: {e}");
            return;
        }
        Err(e) => {
            if required(kind) {
                panic!("{kind} backend is required here (COMPUTE_REQUIRE) but unavailable: {e}");
            }
            eprintln!("SKIPPED: {kind} conformance group {group:?}: backend unavailable: {e}");
            return;
        }
    };
    let seed = rng::fresh_seed();
    eprintln!(
        "conformance {group:?} on {kind} [{}], seed {seed} (replay: COMPUTE_TEST_SEED={seed})",
        backend.device_name()
    );
    let mut rng = Rng::new(seed);
    let mut skipped = Vec::new();
    let failures = group_failures(&backend, group, cfg, &mut rng, &mut skipped);
    report_skipped(kind, group, &skipped);
    if !failures.is_empty() {
        panic!(
            "{} conformance failure(s) in {group:?} on {kind} [{}] (seed {seed}):\n  {}",
            failures.len(),
            backend.device_name(),
            failures.join("\n  ")
        );
    }
}

/// Runs every check of `group` on `backend`, drawing inputs from `rng`;
/// returns the failures and records declined ops in `skipped`. The one body
/// of the suite: [`run_group`] calls it, and [`run_group_async`] calls it on a
/// recording and a replaying backend.
fn group_failures(
    backend: &dyn Backend,
    group: Group,
    cfg: Config,
    rng: &mut Rng,
    skipped: &mut Vec<String>,
) -> Vec<String> {
    match group {
        Group::EdgeValues => edge_values(backend, rng, cfg, skipped),
        Group::SpecialValues => special::run(backend, rng, cfg, skipped),
        Group::Errors => errors(backend, rng),
        Group::Tensors => tensors(backend, rng, cfg, skipped),
        Group::Interpolation => interpolation::run(backend, rng, cfg, skipped),
        _ => {
            let mut fails = Vec::new();
            for op in cases(group, cfg.scale).iter().flat_map(dtype_variants) {
                if let Some(result) = declined(backend, &op, cfg, rng, skipped) {
                    fails.extend(result.err());
                    continue;
                }
                let inputs = typed_inputs_for(&op, rng);
                fails.extend(check_op_typed(backend, &op, &inputs, cfg.tolerance_factor).err());
            }
            fails
        }
    }
}

/// For an op the backend declines: `None` if it supports it; otherwise the
/// result of checking that it fails cleanly, or a failure when `cfg` requires
/// the op's dtypes. Records the op in `skipped`.
fn declined(
    backend: &dyn Backend,
    op: &Op,
    cfg: Config,
    rng: &mut Rng,
    skipped: &mut Vec<String>,
) -> Option<Result<(), String>> {
    if backend.supports(op) {
        return None;
    }
    if op.dtypes().iter().all(|d| cfg.dtypes.contains(d)) {
        return Some(Err(format!("{} {}: a required dtype, but supports() declines it", op.name(), op.shapes())));
    }
    skipped.push(op.dtypes().iter().map(|d| d.as_str()).collect::<Vec<_>>().join("→"));
    Some(check_declined(backend, op, rng))
}

/// Prints how many ops of which dtypes the backend declined.
fn report_skipped(kind: BackendKind, group: Group, skipped: &[String]) {
    if skipped.is_empty() {
        return;
    }
    let mut counts = std::collections::BTreeMap::new();
    for s in skipped {
        *counts.entry(s.as_str()).or_insert(0usize) += 1;
    }
    let list: Vec<String> = counts.iter().map(|(d, n)| format!("{n} on {d}")).collect();
    eprintln!("SKIPPED in {group:?} on {kind}: ops the backend declines ({}); each failed cleanly", list.join(", "));
}

/// Extreme finite magnitudes mixed into random data, on every dtype, and
/// casts of every special value.
fn edge_values(backend: &dyn Backend, rng: &mut Rng, cfg: Config, skipped: &mut Vec<String>) -> Vec<String> {
    let mut fails = Vec::new();
    for dtype in DType::ALL {
        fails.extend(edge_values_of(backend, rng, cfg, dtype, skipped));
    }
    fails.extend(edge_casts(backend, rng, cfg, skipped));
    fails
}

/// Casts of every special value between every pair of dtypes: ±0, ±∞, NaN
/// of both signs, the largest finite values, subnormals, ties.
fn edge_casts(backend: &dyn Backend, rng: &mut Rng, cfg: Config, skipped: &mut Vec<String>) -> Vec<String> {
    let mut fails = Vec::new();
    let mut values = vec![
        0.0f32,
        -0.0,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        1e38,
        -1e38,
        3.4e38,
        1e-45,
        -1e-45,
        1e-38,
        5.96e-8,
        2.98e-8,
        2.99e-8,
        6.1e-5,
        1.0009765,
        1.0048828,
        -1.0048828,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
    ];
    values.extend((0..1000).map(|_| cast_input(rng)));
    for from in DType::ALL {
        let x = HostVec::from_f32(from, &values);
        for to in DType::ALL {
            let op = Op::cast(values.len(), from, to);
            if let Some(result) = declined(backend, &op, cfg, rng, skipped) {
                fails.extend(result.err());
                continue;
            }
            fails.extend(check_op_typed(backend, &op, std::slice::from_ref(&x), cfg.tolerance_factor).err());
        }
    }
    fails
}

/// [`edge_values`] on one dtype: the values rounded to it (1e38 is ∞ in f16).
fn edge_values_of(
    backend: &dyn Backend,
    rng: &mut Rng,
    cfg: Config,
    dtype: DType,
    skipped: &mut Vec<String>,
) -> Vec<String> {
    let specials = [0.0f32, -0.0, 1e38, -1e38, 1e-38, -1e-38, 1e-45, -1e-45, 88.0, -88.0, 89.0, -104.0, 9.0, -9.0];
    let mut fails = Vec::new();
    let len = 1031;
    let sprinkle = |rng: &mut Rng, mut v: Vec<f32>| {
        for (i, &s) in specials.iter().enumerate() {
            v[i] = s; // every special appears, at the start (scalar tails) ...
            let j = rng.below(v.len());
            v[j] = s; // ... and somewhere in the vector body
        }
        v
    };
    let mut check = |op: Op, inputs: Vec<Vec<f32>>, rng: &mut Rng, fails: &mut Vec<String>| {
        let op = op.with_dtype(dtype);
        if let Some(result) = declined(backend, &op, cfg, rng, skipped) {
            fails.extend(result.err());
            return;
        }
        let inputs: Vec<HostVec> = inputs.iter().map(|v| HostVec::from_f32(dtype, v)).collect();
        fails.extend(check_op_typed(backend, &op, &inputs, cfg.tolerance_factor).err());
    };
    for op in cases::unary_ops() {
        let op = Op::unary(op, len);
        let x = inputs_for(&op, rng).remove(0);
        let x = sprinkle(rng, x);
        check(op, vec![x], rng, &mut fails);
    }
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul] {
        let op = Op::binary(op, len);
        let a = rng.vec(len, -4.0, 4.0);
        let a = sprinkle(rng, a);
        let b = rng.vec(len, -4.0, 4.0);
        let b = sprinkle(rng, b);
        check(op, vec![a, b], rng, &mut fails);
    }
    // Reductions: −0 and tiny values must not disturb max.
    let mut tiny = rng.vec(len, -3.0, 3.0);
    tiny[len / 2] = -0.0;
    tiny[len - 1] = 1e-45;
    for x in [rng.vec(len, -3.0, 3.0), tiny] {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            check(Op::reduce(op, len), vec![x.clone()], rng, &mut fails);
        }
    }
    // Softmax rows of equal, huge and very negative values stay finite and sum to 1.
    let cols = 67;
    let mut x = rng.vec(4 * cols, -3.0, 3.0);
    x[..cols].fill(7.5);
    for v in &mut x[cols..2 * cols] {
        *v *= 1e4;
    }
    for v in &mut x[2 * cols..3 * cols] {
        *v -= 1e4;
    }
    for op in [RowOp::Softmax, RowOp::LogSoftmax] {
        check(Op::rows(op, 4, cols), vec![x.clone()], rng, &mut fails);
    }
    fails
}

/// Bad shapes: a typed `Shape` error that names the op, and an untouched
/// output; operands of the wrong dtype: a typed `DType` error, likewise.
fn errors(backend: &dyn Backend, rng: &mut Rng) -> Vec<String> {
    let mut fails = shape_errors(backend, rng);
    fails.extend(dtype_errors(backend, rng));
    fails
}

/// Operands whose dtype differs from the op's: `DType` errors naming the op,
/// with the output (host or tensor) untouched.
fn dtype_errors(backend: &dyn Backend, rng: &mut Rng) -> Vec<String> {
    let mut fails = Vec::new();
    let x = rng.vec(10, -1.0, 1.0);
    let mut check = |op: Op, inputs: &[HostVec], out: DType, what: &str| {
        let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
        let len = op.layout().map(|l| l.output_len()).unwrap_or(0);
        let mut o = poisoned(out, len);
        match backend.run_typed(&op, &views, o.as_mut()) {
            Err(ComputeError::DType { op: name, .. }) if name == op.name() => {}
            other => fails.push(format!("{what}: expected a DType error naming {}, got {other:?}", op.name())),
        }
        if o.bits().iter().any(|&b| b != poison_bits(out)) {
            fails.push(format!("{what}: output was modified despite the error"));
        }
    };
    let f32x = HostVec::from_f32(DType::F32, &x);
    let bf16x = HostVec::from_f32(DType::BF16, &x);
    let f16x = HostVec::from_f32(DType::F16, &x);
    let relu = Op::unary(UnaryOp::Relu, 10);
    check(relu, std::slice::from_ref(&bf16x), DType::F32, "f32 relu on a bf16 input");
    check(relu, std::slice::from_ref(&f32x), DType::BF16, "f32 relu into a bf16 output");
    let add = Op::binary(BinaryOp::Add, 10).with_dtype(DType::F16);
    check(add, &[f16x.clone(), bf16x.clone()], DType::F16, "f16 add with a bf16 operand");
    let mm = Op::Matmul(crate::MatmulSpec::new(2, 5, 2).with_dtypes(DType::BF16, DType::F32));
    check(mm, &[bf16x.clone(), bf16x.clone()], DType::BF16, "bf16→f32 matmul into a bf16 output");
    check(Op::cast(10, DType::F32, DType::F16), std::slice::from_ref(&f32x), DType::BF16, "cast to f16 into bf16");
    check(Op::reduce(ReduceOp::Sum, 10), std::slice::from_ref(&f16x), DType::F32, "f32 sum of f16 values");
    // Tensors: an f32 op on a bf16 tensor, and a download into the wrong type.
    let bf16_tensor = backend.upload_typed(bf16x.as_slice());
    let f32_out = backend.upload(&x);
    if let (Ok(a), Ok(out)) = (bf16_tensor, f32_out) {
        if a.dtype() != DType::BF16 || a.len() != 10 {
            fails.push(format!("upload_typed of 10 bf16 values gave a tensor of {} {}", a.len(), a.dtype()));
        }
        match backend.run_tensors(&relu, &[&a], &out) {
            Err(ComputeError::DType { .. }) => {}
            other => fails.push(format!("f32 relu on a bf16 tensor: expected DType error, got {other:?}")),
        }
        let mut back = vec![0.0f32; 10];
        match backend.download(&out, &mut back) {
            Ok(()) if back == x => {}
            other => fails.push(format!("output tensor changed after a failed dtype check: {other:?}")),
        }
        let mut wrong = HostVec::zeros(DType::F16, 10);
        match backend.download_typed(&a, wrong.as_mut()) {
            Err(ComputeError::DType { .. }) => {}
            other => fails.push(format!("download of a bf16 tensor into f16: expected DType error, got {other:?}")),
        }
    }
    fails
}

/// Bad shapes: a typed `Shape` error that names the op, and an untouched output.
fn shape_errors(backend: &dyn Backend, rng: &mut Rng) -> Vec<String> {
    let mut fails = Vec::new();
    let sentinel = rng.vec(64, 1.0, 2.0);
    let mut check = |op: Op, inputs: Vec<Vec<f32>>, out_len: usize, what: &str| {
        let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut out: Vec<f32> = sentinel.iter().cycle().take(out_len).copied().collect();
        let before = out.clone();
        match backend.run(&op, &refs, &mut out) {
            Err(ComputeError::Shape { op: name, .. }) if name == op.name() => {}
            other => fails.push(format!("{what}: expected a Shape error naming {}, got {other:?}", op.name())),
        }
        if out.iter().zip(&before).any(|(a, b)| a.to_bits() != b.to_bits()) {
            fails.push(format!("{what}: output was modified despite the error"));
        }
    };
    let x = rng.vec(10, -1.0, 1.0);
    check(Op::unary(UnaryOp::Relu, 10), vec![x.clone()], 9, "relu with short output");
    check(Op::unary(UnaryOp::Sigmoid, 11), vec![x.clone()], 11, "sigmoid with short input");
    check(Op::unary(UnaryOp::Tanh, 0), vec![vec![]], 0, "tanh of zero length");
    check(Op::binary(BinaryOp::Add, 10), vec![x.clone(), rng.vec(9, -1.0, 1.0)], 10, "add with mismatched b");
    check(Op::binary(BinaryOp::Mul, 10), vec![x.clone()], 10, "mul with one input");
    check(Op::dot(10), vec![x.clone(), rng.vec(11, -1.0, 1.0)], 1, "dot with mismatched b");
    check(Op::reduce(ReduceOp::Sum, 10), vec![x.clone()], 2, "sum with 2-element output");
    check(Op::rows(RowOp::Softmax, 3, 4), vec![x.clone()], 12, "softmax with short input");
    check(
        Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 2, 5),
        vec![x.clone(), rng.vec(5, 0.5, 1.5)],
        10,
        "layer_norm without beta",
    );
    check(Op::matmul(2, 5, 3), vec![x.clone(), rng.vec(14, -1.0, 1.0)], 6, "matmul with short b");
    check(Op::matmul(2, 5, 3), vec![x.clone(), rng.vec(15, -1.0, 1.0)], 7, "matmul with long output");
    check(Op::matmul(usize::MAX / 4, 8, 8), vec![x.clone(), rng.vec(64, -1.0, 1.0)], 8, "matmul overflowing usize");
    let conv = crate::Conv2dSpec { h: 2, w: 5, padding: (0, 0), ..crate::Conv2dSpec::same(1, 5, 1, 3) };
    check(Op::Conv2d(conv), vec![x.clone(), rng.vec(9, -1.0, 1.0)], 3, "conv2d with kernel taller than input");
    let gqa = crate::AttentionSpec::new(1, 3, 2, 4, 2).with_kv_heads(2);
    let (q, kv) = (rng.vec(12, -1.0, 1.0), rng.vec(16, -1.0, 1.0));
    check(
        Op::Attention(gqa),
        vec![q.clone(), kv.clone(), kv.clone()],
        12,
        "attention with 3 query heads on 2 kv heads",
    );
    let one = crate::AttentionSpec::new(1, 3, 2, 4, 2);
    check(Op::Attention(one), vec![q.clone(), kv.clone(), kv.clone()], 12, "attention with short k and v");
    let nan = crate::AttentionSpec::new(1, 1, 2, 2, 2).with_scale(f32::NAN);
    check(Op::Attention(nan), vec![x[..4].to_vec(), x[..4].to_vec(), x[..4].to_vec()], 4, "attention with a NaN scale");
    // Tensor calls validate too, and leave the output tensor untouched.
    if let (Ok(a), Ok(out)) = (backend.upload(&x), backend.upload(&sentinel[..9])) {
        match backend.run_tensors(&Op::unary(UnaryOp::Relu, 10), &[&a], &out) {
            Err(ComputeError::Shape { .. }) => {}
            other => fails.push(format!("tensor relu with short output: expected Shape error, got {other:?}")),
        }
        match backend.run_tensors(&Op::unary(UnaryOp::Relu, 10), &[&a], &a) {
            Err(ComputeError::Shape { .. }) => {}
            other => fails.push(format!("tensor relu aliasing its input: expected Shape error, got {other:?}")),
        }
        let mut back = vec![0.0; 9];
        match backend.download(&out, &mut back) {
            Ok(()) if back == sentinel[..9] => {}
            other => fails.push(format!("output tensor changed after a failed call: {other:?} {back:?}")),
        }
        let mut wrong = vec![0.0; 8];
        if backend.download(&out, &mut wrong).is_ok() {
            fails.push("download into a buffer of the wrong length succeeded".into());
        }
    } else {
        fails.push("upload failed".into());
    }
    fails
}

/// Upload once, chain ops on the device, download once; must equal the host
/// path. Then the same on half data, with casts on the device.
fn tensors(backend: &dyn Backend, rng: &mut Rng, cfg: Config, skipped: &mut Vec<String>) -> Vec<String> {
    let mut fails = f32_chain(backend, rng, cfg);
    for dtype in [DType::F16, DType::BF16] {
        fails.extend(half_chain(backend, rng, cfg, dtype, skipped));
    }
    fails
}

/// `f32` → cast to `dtype` → rms_norm → matmul (half → f32 output) →
/// softmax, all on device tensors; each step's tensor checked against the
/// reference of that step on the previous step's downloaded result.
fn half_chain(
    backend: &dyn Backend,
    rng: &mut Rng,
    cfg: Config,
    dtype: DType,
    skipped: &mut Vec<String>,
) -> Vec<String> {
    let (m, k, n) = (19, 72, 23);
    let steps = [
        Op::cast(m * k, DType::F32, dtype),
        Op::rows(RowOp::RmsNorm { eps: 1e-5 }, m, k).with_dtype(dtype),
        Op::Matmul(crate::MatmulSpec::new(m, k, n).with_dtypes(dtype, DType::F32)),
        Op::rows(RowOp::Softmax, m, n),
    ];
    for op in &steps {
        if let Some(result) = declined(backend, op, cfg, rng, skipped) {
            return result.err().into_iter().collect();
        }
    }
    let mut fails = Vec::new();
    let mut run = || -> crate::Result<()> {
        let x = HostVec::from_f32(DType::F32, &rng.vec(m * k, -3.0, 3.0));
        let gamma = HostVec::from_f32(dtype, &rng.vec(k, 0.5, 1.5));
        let w = HostVec::from_f32(dtype, &rng.vec(k * n, -1.0, 1.0));
        let tx = backend.upload_typed(x.as_slice())?;
        let tg = backend.upload_typed(gamma.as_slice())?;
        let tw = backend.upload_typed(w.as_slice())?;
        let th = backend.alloc_typed(m * k, dtype)?;
        let tn = backend.alloc_typed(m * k, dtype)?;
        let tc = backend.alloc_typed(m * n, DType::F32)?;
        let ts = backend.alloc_typed(m * n, DType::F32)?;
        backend.run_tensors(&steps[0], &[&tx], &th)?;
        backend.run_tensors(&steps[1], &[&th, &tg], &tn)?;
        backend.run_tensors(&steps[2], &[&tn, &tw], &tc)?;
        backend.run_tensors(&steps[3], &[&tc], &ts)?;
        let download = |t: &crate::Tensor| -> crate::Result<HostVec> {
            let mut out = poisoned(t.dtype(), t.len());
            backend.download_typed(t, out.as_mut())?;
            Ok(out)
        };
        let (h, nrm, c, sm) = (download(&th)?, download(&tn)?, download(&tc)?, download(&ts)?);
        let checks: [(&Op, Vec<HostSlice<'_>>, &HostVec); 4] = [
            (&steps[0], vec![x.as_slice()], &h),
            (&steps[1], vec![h.as_slice(), gamma.as_slice()], &nrm),
            (&steps[2], vec![nrm.as_slice(), w.as_slice()], &c),
            (&steps[3], vec![c.as_slice()], &sm),
        ];
        for (op, ins, out) in checks {
            if let Some(msg) = compare_typed(op, &ins, out.as_slice(), cfg.tolerance_factor) {
                fails.push(format!("{dtype} device chain, step {} {}: {msg}", op.name(), op.shapes()));
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        fails.push(format!("{dtype} tensor chain returned an error: {e}"));
    }
    fails
}

fn f32_chain(backend: &dyn Backend, rng: &mut Rng, cfg: Config) -> Vec<String> {
    let mut fails = Vec::new();
    let mut run = || -> crate::Result<()> {
        let (m, k, n) = (37, 29, 41);
        let a = rng.vec(m * k, -1.0, 1.0);
        let b = rng.vec(k * n, -1.0, 1.0);
        let ta = backend.upload(&a)?;
        let tb = backend.upload(&b)?;
        let tc = backend.alloc(m * n)?;
        let t1 = backend.alloc(m * n)?;
        let t2 = backend.alloc(m * n)?;
        let t3 = backend.alloc(m * n)?;
        backend.run_tensors(&Op::matmul(m, k, n), &[&ta, &tb], &tc)?;
        backend.run_tensors(&Op::unary(UnaryOp::Gelu(crate::GeluForm::Tanh), m * n), &[&tc], &t1)?;
        backend.run_tensors(&Op::binary(BinaryOp::Add, m * n), &[&t1, &tc], &t2)?;
        backend.run_tensors(&Op::rows(RowOp::Softmax, m, n), &[&t2], &t3)?;
        let mut dot = [POISON];
        let tdot = backend.alloc(1)?;
        backend.run_tensors(&Op::dot(m * n), &[&t3, &tc], &tdot)?;
        backend.download(&tdot, &mut dot)?;
        // Host chain, step by step through the same backend's host path.
        let step = |op: Op, ins: &[&[f32]], fails: &mut Vec<String>| -> crate::Result<Vec<f32>> {
            let mut out = vec![POISON; op.layout()?.output_len()];
            backend.run(&op, ins, &mut out)?;
            if let Some(msg) = compare(&op, ins, &out, cfg.tolerance_factor) {
                fails.push(format!("host {}: {msg}", op.name()));
            }
            Ok(out)
        };
        let mut local = Vec::new();
        let c = step(Op::matmul(m, k, n), &[&a, &b], &mut local)?;
        let g = step(Op::unary(UnaryOp::Gelu(crate::GeluForm::Tanh), m * n), &[&c], &mut local)?;
        let s = step(Op::binary(BinaryOp::Add, m * n), &[&g, &c], &mut local)?;
        let sm = step(Op::rows(RowOp::Softmax, m, n), &[&s], &mut local)?;
        let mut got = vec![POISON; m * n];
        backend.download(&t3, &mut got)?;
        // The device chain must agree with the host chain within the softmax tolerance.
        if let Some(msg) = compare(&Op::rows(RowOp::Softmax, m, n), &[&s], &got, 4.0 * cfg.tolerance_factor) {
            local.push(format!("device chain softmax(gelu(ab) + ab) differs from host: {msg}"));
        }
        if let Some(msg) = compare(&Op::dot(m * n), &[&sm, &c], &dot, 4.0 * cfg.tolerance_factor) {
            local.push(format!("device chain dot differs from host: {msg}"));
        }
        fails.extend(local);
        Ok(())
    };
    if let Err(e) = run() {
        fails.push(format!("tensor chain returned an error: {e}"));
    }
    fails
}

/// Expands to one `#[test]` per conformance [`Group`] for a backend.
///
/// `$make` is an expression callable as `FnOnce() -> compute_core::Result<B>`;
/// `$kind` the [`BackendKind`]; `$cfg` a [`Config`].
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr, $kind:expr, $cfg:expr) => {
        $crate::conformance_tests!(@tests $make, $kind, $cfg;
            unary_ops => Unary, binary_ops => Binary, reductions => Reductions, row_ops => Rows,
            matmul => Matmul, batched_matmul => BatchedMatmul, matmul_epilogue => MatmulEpilogue,
            conv2d => Conv2d, attention => Attention,
            casts => Casts, interpolation => Interpolation, quantized => Quantized, decoder_ops => Decoder,
            edge_values => EdgeValues, special_values => SpecialValues, bad_shapes_are_typed_errors => Errors,
            device_tensors => Tensors);
    };
    (@tests $make:expr, $kind:expr, $cfg:expr; $($name:ident => $group:ident),*) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::run_group($make, $kind, $crate::conformance::Group::$group, $cfg);
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    //! The suite must catch broken backends, not just pass correct ones.
    use super::*;

    #[test]
    fn infinities_pass_only_within_the_tolerance_of_the_overflow_threshold() {
        let tol = Tolerance { abs: 0.0, rel: 1e-3, cond: 0.0 };
        let check = |y: f64, want: f64| mismatch(y, want, 0.0, tol, 1.0, DType::F16, false);
        // 65514.8 rounds to 65504 in f16, but 0.1% of it reaches past 65520 (which rounds to Inf).
        assert_eq!(check(f64::NEG_INFINITY, -65514.8), None);
        assert_eq!(check(-65504.0, -65514.8), None);
        assert_eq!(check(f64::INFINITY, -65514.8), Some("unexpected infinity"));
        assert_eq!(check(f64::INFINITY, 1000.0), Some("unexpected infinity"));
        assert_eq!(check(f64::INFINITY, 60000.0), Some("unexpected infinity"));
        // A reference past the range: Inf, or a finite value within the bound.
        assert_eq!(check(f64::INFINITY, 65530.0), None);
        assert_eq!(check(65504.0, 65530.0), None);
        assert_eq!(check(60000.0, 70000.0), Some("expected the same infinity"));
        assert_eq!(check(f64::NEG_INFINITY, 70000.0), Some("expected the same infinity"));
        assert_eq!(check(65504.0, f64::INFINITY), Some("expected the same infinity"));
        assert_eq!(check(f64::INFINITY, f64::INFINITY), None);
    }
    use crate::backend::{Tensor, check_host_call};
    use crate::host::HostSliceMut;

    /// Computes through the reference, rounds into the output dtype (or
    /// truncates, with `truncate`), then applies a fault to the stored values.
    struct Faulty {
        fault: fn(&mut [f32]),
        truncate: bool,
    }

    fn faulty(fault: fn(&mut [f32])) -> Faulty {
        Faulty { fault, truncate: false }
    }

    impl Backend for Faulty {
        fn kind(&self) -> BackendKind {
            BackendKind::Simd
        }
        fn device_name(&self) -> String {
            "faulty".into()
        }
        fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], mut output: HostSliceMut<'_>) -> crate::Result<()> {
            check_host_call(op, inputs, &output)?;
            let r = reference::run_typed(op, inputs)?;
            let mut vals: Vec<f32> = r.values.iter().map(|&v| v as f32).collect();
            (self.fault)(&mut vals);
            match (&mut output, self.truncate) {
                // Round toward zero instead of to nearest: drop the low bits.
                (HostSliceMut::BF16(o), true) => {
                    for (o, v) in o.iter_mut().zip(&vals) {
                        *o = crate::bf16::from_bits((v.to_bits() >> 16) as u16);
                    }
                }
                _ if r.scale.contains(&reference::UNTOUCHED) => {
                    // Write only the op's view, element by element.
                    let stored = HostVec::from_f32(output.dtype(), &vals);
                    let size = output.dtype().size_in_bytes();
                    let dst = output.as_bytes_mut();
                    for (i, _) in r.scale.iter().enumerate().filter(|(_, s)| **s != reference::UNTOUCHED) {
                        dst[i * size..(i + 1) * size]
                            .copy_from_slice(&stored.as_slice().as_bytes()[i * size..][..size]);
                    }
                }
                _ => output.store_f32(&vals),
            }
            Ok(())
        }
        fn upload_typed(&self, _: HostSlice<'_>) -> crate::Result<Tensor> {
            Err(ComputeError::Unsupported { op: "upload", backend: BackendKind::Simd })
        }
        fn alloc_typed(&self, _: usize, _: DType) -> crate::Result<Tensor> {
            Err(ComputeError::Unsupported { op: "alloc", backend: BackendKind::Simd })
        }
        fn download_typed(&self, _: &Tensor, _: HostSliceMut<'_>) -> crate::Result<()> {
            Err(ComputeError::Unsupported { op: "download", backend: BackendKind::Simd })
        }
        fn run_tensors(&self, op: &Op, _: &[&Tensor], _: &Tensor) -> crate::Result<()> {
            Err(ComputeError::Unsupported { op: op.name(), backend: BackendKind::Simd })
        }
    }

    impl crate::AsyncOps for Faulty {}

    #[test]
    fn the_async_driver_judges_as_the_blocking_one() {
        use crate::async_ops::block_on;
        let cfg = Config::from_env();
        // Rows: the same verdicts from the replayed answers as from direct calls.
        let good = block_on(run_group_async(&faulty(|_| {}), Group::Rows, cfg, 11));
        assert!(good.passed(), "{:?}", good.failures);
        assert!(good.calls > 0);
        let mut rng = Rng::new(11);
        let direct = group_failures(&faulty(|_| {}), Group::Rows, cfg, &mut rng, &mut Vec::new());
        assert!(direct.is_empty());
        let nudged = |o: &mut [f32]| o[0] *= 1.0 + 1e-3;
        let bad = block_on(run_group_async(&faulty(nudged), Group::Rows, cfg, 11));
        let direct = group_failures(&faulty(nudged), Group::Rows, cfg, &mut Rng::new(11), &mut Vec::new());
        assert!(!bad.passed());
        assert_eq!(bad.failures, direct);
        // Errors: typed errors, untouched outputs; a backend without tensors fails the tensor checks both ways.
        let errors = block_on(run_group_async(&faulty(|_| {}), Group::Errors, cfg, 5));
        let direct = group_failures(&faulty(|_| {}), Group::Errors, cfg, &mut Rng::new(5), &mut Vec::new());
        assert_eq!(errors.failures, direct);
    }

    fn catches_with(backend: &Faulty, op: Op) -> bool {
        let mut rng = Rng::new(7);
        let inputs = typed_inputs_for(&op, &mut rng);
        check_op_typed(backend, &op, &inputs, 1.0).is_err()
    }

    fn catches(fault: fn(&mut [f32]), op: Op) -> bool {
        catches_with(&faulty(fault), op)
    }

    #[test]
    fn a_correct_backend_passes() {
        assert!(!catches(|_| {}, Op::matmul(17, 33, 9)));
        assert!(!catches(|_| {}, Op::unary(UnaryOp::Sigmoid, 1000)));
        let attn = crate::AttentionSpec::new(2, 4, 17, 33, 64).with_kv_heads(2).causal();
        assert!(!catches(|_| {}, Op::Attention(attn)));
        for dtype in [DType::F16, DType::BF16] {
            assert!(!catches(|_| {}, Op::Attention(attn.with_dtype(dtype))));
            assert!(!catches(|_| {}, Op::unary(UnaryOp::Gelu(crate::GeluForm::Erf), 1000).with_dtype(dtype)));
            assert!(!catches(|_| {}, Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 7, 300).with_dtype(dtype)));
            let mm = crate::MatmulSpec::new(17, 33, 9);
            assert!(!catches(|_| {}, Op::Matmul(mm.with_dtypes(dtype, dtype))));
            assert!(!catches(|_| {}, Op::Matmul(mm.with_dtypes(dtype, DType::F32))));
            assert!(!catches(|_| {}, Op::cast(1000, DType::F32, dtype)));
            assert!(!catches(|_| {}, Op::cast(1000, dtype, DType::F32)));
        }
    }

    #[test]
    fn quantized_ops_are_checked_both_ways() {
        for weight in DType::QUANTIZED {
            for op in [
                Op::quant_matmul(3, 512, 7, weight),
                Op::QuantMatmul(crate::QuantMatmulSpec::new(17, 256, 5, weight).with_dtypes(DType::BF16, DType::BF16)),
                Op::cast(512, DType::F32, weight),
                Op::cast(512, weight, DType::F16),
            ] {
                assert!(!catches(|_| {}, op), "{op:?}");
            }
            // One value a unit off in a dequantized output, one byte off in a
            // quantized one: exact comparisons catch both.
            assert!(catches(|o| o[3] = o[3].next_up(), Op::cast(512, weight, DType::F32)));
            let op = Op::cast(512, DType::F32, weight);
            let inputs = typed_inputs_for(&op, &mut Rng::new(7));
            let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
            let mut out = HostVec::zeros(weight, 512);
            out.as_mut().store_f32(&views[0].to_f32());
            assert!(compare_typed(&op, &views, out.as_slice(), 1.0).is_none());
            if let HostVec::Blocks(_, bytes) = &mut out {
                bytes[5] ^= 1;
            }
            assert!(compare_typed(&op, &views, out.as_slice(), 1.0).is_some(), "{weight}");
            // A kernel that reads each group of 32 weights in reverse order.
            let op = Op::quant_matmul(4, 512, 9, weight);
            let inputs = typed_inputs_for(&op, &mut Rng::new(7));
            let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
            let mut x = views[0].to_f32();
            x.chunks_mut(32).for_each(<[f32]>::reverse);
            let wrong = reference::run_typed(&op, &[HostSlice::F32(&x), views[1]]).unwrap();
            let out: Vec<f32> = wrong.values.iter().map(|&v| v as f32).collect();
            assert!(compare_typed(&op, &views, HostSlice::F32(&out), 1.0).is_some(), "{weight}");
        }
    }

    #[test]
    fn decoder_ops_are_checked_both_ways() {
        for dtype in DType::ALL {
            for op in cases(Group::Decoder, Scale::Small) {
                let op = op.with_dtype(dtype);
                assert!(!catches(|_| {}, op), "{op:?}");
            }
        }
        // A rotation by a slightly wrong angle (θ 1 % off) is caught.
        let op = Op::Rope(crate::RopeSpec::new(3, 2, 64, 10_000.0).at_position(7));
        let inputs = inputs_for(&op, &mut Rng::new(7));
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let off = crate::RopeSpec::new(3, 2, 64, 10_100.0).at_position(7);
        let wrong: Vec<f32> = reference::run(&Op::Rope(off), &refs).unwrap().values.iter().map(|&v| v as f32).collect();
        assert!(compare(&op, &refs, &wrong, 1.0).is_some());
        // Every scaled case: ignoring Llama 3's scaling is caught.
        for op in cases(Group::Decoder, Scale::Small) {
            let Op::Rope(r) = op else { continue };
            if r.scaling.is_none() {
                continue;
            }
            let inputs = inputs_for(&op, &mut Rng::new(9));
            let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            let plain = Op::Rope(crate::RopeSpec { scaling: None, ..r });
            let wrong: Vec<f32> = reference::run(&plain, &refs).unwrap().values.iter().map(|&v| v as f32).collect();
            assert!(compare(&op, &refs, &wrong, 1.0).is_some(), "{op:?}");
        }
        // A copy that writes one element outside its view, or misses one, is caught.
        let op = cases(Group::Decoder, Scale::Small).into_iter().find(|o| matches!(o, Op::Copy(_))).unwrap();
        let Op::Copy(spec) = op else { unreachable!() };
        let outside = (0..spec.dst.len).find(|&i| i != spec.dst.offset).unwrap_or(0);
        let inputs = inputs_for(&op, &mut Rng::new(7));
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out: Vec<f32> = reference::run(&op, &refs).unwrap().values.iter().map(|&v| v as f32).collect();
        for v in out.iter_mut().filter(|v| v.is_nan()) {
            *v = POISON;
        }
        assert!(compare(&op, &refs, &out, 1.0).is_none());
        let mut stray = out.clone();
        if stray[outside].to_bits() == POISON.to_bits() {
            stray[outside] = 0.0;
            assert!(compare(&op, &refs, &stray, 1.0).is_some());
        }
        out[spec.dst.offset] = POISON;
        assert!(compare(&op, &refs, &out, 1.0).is_some());
        // An argmax that takes the last of equal maxima is caught.
        let op = Op::ArgMax { rows: 1, cols: 4, dtype: DType::F32 };
        assert!(check_op(&faulty(|_| {}), &op, &[vec![1.0, 3.0, 3.0, 2.0]], 1.0).is_ok());
        assert!(check_op(&faulty(|o| o[0] = 2.0), &op, &[vec![1.0, 3.0, 3.0, 2.0]], 1.0).is_err());
    }

    #[test]
    fn interpolation_is_checked_both_ways() {
        for dtype in DType::ALL {
            for op in [Op::lerp(1000, 0.3), Op::lerp(1000, 1.7), Op::slerp(9, 70, 0.4), Op::slerp(3, 2, 0.9)] {
                let op = op.with_dtype(dtype);
                assert!(!catches(|_| {}, op), "{op:?}");
            }
        }
        let nudge = |o: &mut [f32]| o[3] *= 1.0 + 1e-4;
        assert!(catches(nudge, Op::lerp(100, 0.3)));
        assert!(catches(nudge, Op::slerp(4, 50, 0.3)));
        // A slerp computed as a lerp (the coefficients of the chord) is caught.
        let op = Op::slerp(6, 40, 0.5);
        let inputs = inputs_for(&op, &mut Rng::new(7));
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let chord = reference::run(&Op::lerp(240, 0.5), &refs).unwrap();
        let out: Vec<f32> = chord.values.iter().map(|&v| v as f32).collect();
        assert!(compare(&op, &refs, &out, 1.0).is_some());
    }

    #[test]
    fn an_unwritten_element_is_caught() {
        // The poison survives: simulate a kernel that skips the last element.
        assert!(catches(|o| *o.last_mut().unwrap() = POISON, Op::unary(UnaryOp::Relu, 1000)));
        // In half outputs too: the f32 poison becomes the dtype's NaN, which is
        // not that dtype's poison, and fails as an unexpected NaN.
        for dtype in [DType::F16, DType::BF16] {
            assert!(catches(|o| *o.last_mut().unwrap() = POISON, Op::unary(UnaryOp::Relu, 1000).with_dtype(dtype)));
        }
    }

    #[test]
    fn small_errors_are_caught() {
        let nudge = |o: &mut [f32]| o[3] *= 1.0 + 1e-4;
        assert!(catches(nudge, Op::unary(UnaryOp::Tanh, 100)));
        assert!(catches(nudge, Op::matmul(8, 64, 8)));
        assert!(catches(nudge, Op::rows(RowOp::Softmax, 4, 50)));
        // Attention: 0.01 off in one output, and the top-left mask where the
        // end-aligned one was asked for.
        let attn = crate::AttentionSpec::new(1, 2, 9, 40, 64).causal();
        assert!(catches(|o| o[3] += 0.01, Op::Attention(attn)));
        let inputs = inputs_for(&Op::Attention(attn), &mut Rng::new(7));
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let top_left = reference::run(&Op::Attention(attn.with_mask(crate::Mask::CausalTopLeft)), &refs).unwrap();
        let out: Vec<f32> = top_left.values.iter().map(|&v| v as f32).collect();
        assert!(compare(&Op::Attention(attn), &refs, &out, 1.0).is_some());
        // Four ulps off on an exact op (the bound is about 1.5 ulp).
        let op = Op::unary(UnaryOp::Relu, 2);
        let r = faulty(|o| o[0] = o[0].next_up().next_up().next_up().next_up());
        assert!(check_op(&r, &op, &[vec![1.5, -2.0]], 1.0).is_err());
    }

    #[test]
    fn one_half_ulp_errors_are_caught() {
        // 2⁻⁷ relative is one bf16 ulp at worst and 8 f16 ulps: outside the
        // half-ulp rounding allowance plus the f32 tolerance of every op.
        let ulp = |o: &mut [f32]| o[5] *= 1.0 + 1.0 / 128.0;
        for dtype in [DType::F16, DType::BF16] {
            assert!(catches(ulp, Op::unary(UnaryOp::Relu, 100).with_dtype(dtype)), "{dtype}");
            assert!(catches(ulp, Op::unary(UnaryOp::Sigmoid, 100).with_dtype(dtype)), "{dtype}");
            assert!(catches(ulp, Op::rows(RowOp::RmsNorm { eps: 1e-6 }, 3, 40).with_dtype(dtype)), "{dtype}");
            assert!(catches(ulp, Op::Matmul(crate::MatmulSpec::new(8, 16, 8).with_dtypes(dtype, dtype))), "{dtype}");
            assert!(catches(ulp, Op::cast(100, DType::F32, dtype)), "{dtype}");
        }
        // A bf16 result computed through f16 (3 more mantissa bits lost... or
        // fewer): an f32-output matmul whose inputs were rounded to bf16 again.
        let coarse = |o: &mut [f32]| o.iter_mut().for_each(|v| *v = crate::bf16::from_f32(*v).to_f32());
        assert!(catches(coarse, Op::Matmul(crate::MatmulSpec::new(8, 64, 8).with_dtypes(DType::F16, DType::F32))));
    }

    #[test]
    fn a_cast_that_truncates_is_caught() {
        let trunc = Faulty { fault: |_| {}, truncate: true };
        assert!(catches_with(&trunc, Op::cast(1000, DType::F32, DType::BF16)));
        // Rounding to nearest passes, bit for bit.
        assert!(!catches(|_| {}, Op::cast(1000, DType::F32, DType::BF16)));
    }

    #[test]
    fn lost_nan_is_caught() {
        let op = Op::unary(UnaryOp::Relu, 3);
        let r = faulty(|o| o[1] = 0.0);
        assert!(check_op(&r, &op, &[vec![1.0, f32::NAN, -1.0]], 1.0).is_err());
    }

    #[test]
    fn the_reference_passes_the_special_values_group() {
        let cfg = Config::from_env().with_dtypes(&DType::ALL);
        let fails = special::run(&faulty(|_| {}), &mut Rng::new(7), cfg, &mut Vec::new());
        assert!(fails.is_empty(), "{fails:#?}");
    }

    #[test]
    fn special_values_lost_by_wgsl_are_caught() {
        let inf = f32::INFINITY;
        // max(x, 0) dropping NaN, tanh clamping it to 0, gelu giving NaN at −∞.
        let nan_to_zero = |o: &mut [f32]| o.iter_mut().filter(|v| v.is_nan()).for_each(|v| *v = 0.0);
        let x = vec![1.0, f32::NAN, -inf, inf];
        for op in [UnaryOp::Relu, UnaryOp::Tanh, UnaryOp::Clip { min: -1.0, max: 1.0 }] {
            assert!(check_op(&faulty(|_| {}), &Op::unary(op, 4), std::slice::from_ref(&x), 1.0).is_ok());
            assert!(check_op(&faulty(nan_to_zero), &Op::unary(op, 4), std::slice::from_ref(&x), 1.0).is_err());
        }
        let gelu = Op::unary(UnaryOp::Gelu(crate::GeluForm::Erf), 4);
        assert!(check_op(&faulty(|o| o[2] = f32::NAN), &gelu, std::slice::from_ref(&x), 1.0).is_err());
        // A max that skips the NaN, or starts from the lowest finite value.
        let max = Op::reduce(ReduceOp::Max, 4);
        assert!(check_op(&faulty(|o| o[0] = f32::INFINITY), &max, std::slice::from_ref(&x), 1.0).is_err());
        assert!(check_op(&faulty(|o| o[0] = f32::MIN), &max, &[vec![-inf; 4]], 1.0).is_err());
        // Softmax of a row holding +∞ is NaN everywhere, not one-hot.
        let sm = Op::rows(RowOp::Softmax, 1, 3);
        assert!(check_op(&faulty(|o| o.copy_from_slice(&[0.0, 1.0, 0.0])), &sm, &[vec![1.0, inf, 2.0]], 1.0).is_err());
    }

    #[test]
    fn tolerances_are_tight_for_exact_ops() {
        let t = tolerance(&Op::binary(BinaryOp::Add, 10));
        assert_eq!(t.rel, f32::EPSILON as f64);
        assert_eq!(tolerance(&Op::reduce(ReduceOp::Max, 10)).rel, 0.0);
        let tf32 = Op::Matmul(crate::MatmulSpec::new(4, 64, 4).with_precision(Precision::Tf32));
        assert!(tolerance(&tf32).cond > tolerance(&Op::matmul(4, 64, 4)).cond);
    }

    #[test]
    fn every_case_runs_at_every_dtype() {
        let v = dtype_variants(&Op::unary(UnaryOp::Relu, 7));
        assert_eq!(v.iter().map(|o| o.dtype()).collect::<Vec<_>>(), DType::ALL);
        let mm = dtype_variants(&Op::matmul(8, 8, 8));
        assert_eq!(mm.len(), 6);
        assert!(mm.iter().any(|o| o.dtype() == DType::BF16 && o.out_dtype() == DType::F32));
        // The largest matmuls stay f32 (and TF32) only.
        assert_eq!(dtype_variants(&Op::matmul(1024, 1024, 1024)).len(), 2);
    }
}
